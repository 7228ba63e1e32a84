//! Listpacks: the compact list encoding Redis 7 uses for small lists, hashes, sets,
//! sorted sets and stream nodes inside RDB files.
//!
//! Layout: a 6-byte header (total bytes as u32 LE, element count as u16 LE, with 65535
//! meaning "count it yourself"), the entries, and a single 0xFF terminator. Each entry
//! is its encoding (type, length and payload) followed by a "backlen": the size of that
//! encoding written so it can be read from right to left, 7 bits per byte, the most
//! significant group first and every byte but the first carrying the 0x80 flag.
//!
//! Encodings, by the first byte:
//!
//! | first byte | meaning                                          | size      |
//! |------------|--------------------------------------------------|-----------|
//! | `0xxxxxxx` | unsigned integer 0..=127 in the low 7 bits       | 1         |
//! | `10xxxxxx` | string of 0..=63 bytes, length in the low 6 bits | 1 + len   |
//! | `110xxxxx` | 13-bit two's complement integer (+1 byte)        | 2         |
//! | `1110xxxx` | string, 12-bit length (high 4 bits here, +1 byte)| 2 + len   |
//! | `0xF0`     | string, 32-bit little-endian length              | 5 + len   |
//! | `0xF1`     | 16-bit little-endian signed integer              | 3         |
//! | `0xF2`     | 24-bit little-endian signed integer              | 4         |
//! | `0xF3`     | 32-bit little-endian signed integer              | 5         |
//! | `0xF4`     | 64-bit little-endian signed integer              | 9         |
//! | `0xFF`     | end of the listpack                              | 1         |

/// Bytes in a listpack header: total size (u32) and element count (u16).
const HEADER_LEN: usize = 6;
/// The terminating byte; no entry starts with it.
const END: u8 = 0xFF;
/// The header's element count when the real count does not fit in 16 bits.
const COUNT_UNKNOWN: u16 = u16::MAX;

/// One element of a ziplist or listpack: bytes borrowed from the input, or an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem<'a> {
    Bytes(&'a [u8]),
    Int(i64),
}

impl<'a> Elem<'a> {
    /// The element as Redis would print it (integers in decimal).
    #[allow(clippy::wrong_self_convention)] // `&self` mirrors slice::to_vec
    pub fn to_vec(&self) -> Vec<u8> {
        match *self {
            Elem::Bytes(b) => b.to_vec(),
            Elem::Int(v) => v.to_string().into_bytes(),
        }
    }

    /// The element as an integer, when it is one or its bytes are a canonical decimal
    /// i64 (no '+', no leading zeros, no spaces; "-0" is not canonical).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Elem::Int(v) => Some(v),
            Elem::Bytes(b) => canonical_i64(b),
        }
    }
}

/// Parses `b` when it is exactly the decimal form Rust (and Redis) would print for some
/// i64: an optional '-', then either a lone "0" or a nonzero digit followed by digits,
/// with no overflow. "-0", "+1", "01", " 1" and "" are all refused.
pub(super) fn canonical_i64(b: &[u8]) -> Option<i64> {
    // The longest canonical i64 is "-9223372036854775808", 20 bytes.
    if b.is_empty() || b.len() > 20 {
        return None;
    }
    if b == b"0" {
        return Some(0);
    }
    let (negative, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    match digits.first() {
        Some(d) if (b'1'..=b'9').contains(d) => {}
        _ => return None,
    }
    // Accumulate as a negative number so i64::MIN needs no special case.
    let mut acc: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        acc = acc.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
    }
    if negative {
        Some(acc)
    } else {
        acc.checked_neg()
    }
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// How many bytes the backlen of an entry of `size` bytes takes, with Redis's exact
/// thresholds (note the upper bounds are exclusive from two bytes on: a 16383-byte entry
/// gets a three-byte backlen although two would hold it).
fn backlen_size(size: u64) -> usize {
    if size <= 127 {
        1
    } else if size < 16_383 {
        2
    } else if size < 2_097_151 {
        3
    } else if size < 268_435_455 {
        4
    } else {
        5
    }
}

/// Appends the backlen for an entry of `size` bytes: the most significant 7-bit group
/// first (flag clear), then the lower groups each with 0x80 set, so a reader walking
/// backwards meets the least significant group first and stops at the unflagged byte.
fn push_backlen(out: &mut Vec<u8>, size: u64) {
    let n = backlen_size(size);
    for i in (0..n).rev() {
        let group = ((size >> (7 * i)) & 0x7F) as u8;
        out.push(if i == n - 1 { group } else { group | 0x80 });
    }
}

/// Reads a backlen that ends just before `end` (exclusive), not reading before `start`.
/// Returns the value; errors when the field would run past `start` or past 5 bytes.
fn read_backlen(lp: &[u8], start: usize, end: usize) -> Result<u64, String> {
    let mut value: u64 = 0;
    let mut pos = end;
    for shift in (0..35).step_by(7) {
        if pos <= start {
            return Err("listpack entry backlen runs past its entry".into());
        }
        pos -= 1;
        let b = lp[pos];
        value |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("listpack entry backlen longer than 5 bytes".into())
}

/// Decodes the entry encoding at `pos`, which must end (backlen included) at or before
/// `limit`. Returns the element and the size of its encoding (without the backlen).
fn decode_entry(lp: &[u8], pos: usize, limit: usize) -> Result<(Elem<'_>, usize), String> {
    let avail = limit - pos;
    let need = |n: usize| -> Result<(), String> {
        if n > avail {
            Err("listpack entry runs past the end".into())
        } else {
            Ok(())
        }
    };
    let b0 = lp[pos];
    let p = &lp[pos..limit];
    let string = |hdr: usize, len: usize| -> Result<(Elem<'_>, usize), String> {
        let size = hdr
            .checked_add(len)
            .ok_or_else(|| "listpack string length overflows".to_string())?;
        need(size)?;
        Ok((Elem::Bytes(&p[hdr..size]), size))
    };
    match b0 {
        0x00..=0x7F => Ok((Elem::Int(i64::from(b0)), 1)),
        0x80..=0xBF => string(1, usize::from(b0 & 0x3F)),
        0xC0..=0xDF => {
            need(2)?;
            let raw = (i64::from(b0 & 0x1F) << 8) | i64::from(p[1]);
            // 13-bit two's complement.
            let v = if raw >= 1 << 12 { raw - (1 << 13) } else { raw };
            Ok((Elem::Int(v), 2))
        }
        0xE0..=0xEF => {
            need(2)?;
            string(2, (usize::from(b0 & 0x0F) << 8) | usize::from(p[1]))
        }
        0xF0 => {
            need(5)?;
            let len = usize::try_from(le_u32(&p[1..5]))
                .map_err(|_| "listpack string too long for this machine".to_string())?;
            string(5, len)
        }
        0xF1 => {
            need(3)?;
            Ok((Elem::Int(i64::from(i16::from_le_bytes([p[1], p[2]]))), 3))
        }
        0xF2 => {
            need(4)?;
            // Place the 24 bits at the top of an i32 and shift back to sign-extend.
            let v = i32::from_le_bytes([0, p[1], p[2], p[3]]) >> 8;
            Ok((Elem::Int(i64::from(v)), 4))
        }
        0xF3 => {
            need(5)?;
            Ok((
                Elem::Int(i64::from(i32::from_le_bytes([p[1], p[2], p[3], p[4]]))),
                5,
            ))
        }
        0xF4 => {
            need(9)?;
            let mut w = [0u8; 8];
            w.copy_from_slice(&p[1..9]);
            Ok((Elem::Int(i64::from_le_bytes(w)), 9))
        }
        0xFF => Err("listpack terminator in the middle of an entry list".into()),
        _ => Err(format!("listpack entry has unknown encoding 0x{b0:02X}")),
    }
}

/// Every element of a listpack, in order; checks the header's total bytes, the
/// terminator 0xFF, each entry's backlen, and (when not 65535) the element count.
pub fn entries(lp: &[u8]) -> Result<Vec<Elem<'_>>, String> {
    if lp.len() < HEADER_LEN + 1 {
        return Err("listpack shorter than its header".into());
    }
    if u64::from(le_u32(&lp[0..4])) != lp.len() as u64 {
        return Err("listpack total bytes do not match its length".into());
    }
    let count = u16::from_le_bytes([lp[4], lp[5]]);
    let last = lp.len() - 1;
    if lp[last] != END {
        return Err("listpack does not end with 0xFF".into());
    }
    // Every entry takes at least 2 bytes (encoding + backlen), so this bounds the
    // reservation by the input, whatever the header claims.
    let room = (last - HEADER_LEN) / 2;
    let mut out = Vec::with_capacity(if count == COUNT_UNKNOWN {
        room
    } else {
        usize::from(count).min(room)
    });
    let mut pos = HEADER_LEN;
    while pos < last {
        let (elem, size) = decode_entry(lp, pos, last)?;
        let blen = backlen_size(size as u64);
        let end = pos + size;
        if blen > last - end {
            return Err("listpack entry backlen runs past the end".into());
        }
        let next = end + blen;
        if read_backlen(lp, end, next)? != size as u64 {
            return Err("listpack entry backlen does not match its size".into());
        }
        out.push(elem);
        pos = next;
    }
    if count != COUNT_UNKNOWN && usize::from(count) != out.len() {
        return Err(format!(
            "listpack header counts {count} elements, found {}",
            out.len()
        ));
    }
    Ok(out)
}

/// Builds a listpack as Redis 7 writes one (integers that fit are stored with the
/// integer encodings Redis uses for strings that are canonical integers; everything else
/// as strings with the smallest string encoding).
#[derive(Debug, Clone, Default)]
pub struct Writer {
    /// The encoded entries, backlens included (no header, no terminator).
    body: Vec<u8>,
    count: usize,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    /// Appends bytes; if they are a canonical decimal integer (as Redis's
    /// lpStringToInt64 accepts, at most 20 chars) they are stored as an integer, exactly
    /// as Redis does.
    ///
    /// # Panics
    /// If `b` is 4 GiB or longer (no listpack can hold it).
    pub fn push_bytes(&mut self, b: &[u8]) {
        if let Some(v) = canonical_i64(b) {
            self.push_int(v);
            return;
        }
        let len = u32::try_from(b.len()).expect("listpack string of 4 GiB or more");
        let start = self.body.len();
        if len < 64 {
            self.body.push(0x80 | len as u8);
        } else if len < 4096 {
            self.body.push(0xE0 | (len >> 8) as u8);
            self.body.push(len as u8);
        } else {
            self.body.push(0xF0);
            self.body.extend_from_slice(&len.to_le_bytes());
        }
        self.body.extend_from_slice(b);
        self.end_entry(start);
    }

    /// Appends an integer in the smallest integer encoding that holds it.
    pub fn push_int(&mut self, v: i64) {
        let start = self.body.len();
        if (0..=127).contains(&v) {
            self.body.push(v as u8);
        } else if (-4096..=4095).contains(&v) {
            let u = (v as u16) & 0x1FFF; // 13-bit two's complement
            self.body.push(0xC0 | (u >> 8) as u8);
            self.body.push(u as u8);
        } else if (-32_768..=32_767).contains(&v) {
            self.body.push(0xF1);
            self.body.extend_from_slice(&(v as i16).to_le_bytes());
        } else if (-8_388_608..=8_388_607).contains(&v) {
            self.body.push(0xF2);
            self.body.extend_from_slice(&(v as i32).to_le_bytes()[..3]);
        } else if (-2_147_483_648..=2_147_483_647).contains(&v) {
            self.body.push(0xF3);
            self.body.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            self.body.push(0xF4);
            self.body.extend_from_slice(&v.to_le_bytes());
        }
        self.end_entry(start);
    }

    /// Writes the backlen of the entry that began at `start` and counts it.
    fn end_entry(&mut self, start: usize) {
        let size = (self.body.len() - start) as u64;
        push_backlen(&mut self.body, size);
        self.count += 1;
    }

    /// Elements so far.
    #[allow(dead_code)] // part of the writer's API even where no caller needs it yet
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no element has been pushed.
    #[allow(dead_code)] // part of the writer's API even where no caller needs it yet
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes so far, including header and terminator.
    pub fn bytes_len(&self) -> usize {
        HEADER_LEN + self.body.len() + 1
    }

    /// The finished listpack: header (total bytes u32 LE, count u16 LE, 65535 if the
    /// count doesn't fit) + entries + 0xFF.
    ///
    /// # Panics
    /// If the listpack would be 4 GiB or larger; callers keep `bytes_len()` below that
    /// (Redis switches to another encoding long before).
    pub fn finish(self) -> Vec<u8> {
        let total = u32::try_from(self.bytes_len()).expect("listpack of 4 GiB or more");
        let count = u16::try_from(self.count)
            .ok()
            .filter(|&c| c != COUNT_UNKNOWN)
            .unwrap_or(COUNT_UNKNOWN);
        let mut out = Vec::with_capacity(total as usize);
        out.extend_from_slice(&total.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&self.body);
        out.push(END);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wraps hand-encoded entries (backlens included) in a header and terminator.
    fn wrap(count: u16, body: &[u8]) -> Vec<u8> {
        let total = (HEADER_LEN + body.len() + 1) as u32;
        let mut v = total.to_le_bytes().to_vec();
        v.extend_from_slice(&count.to_le_bytes());
        v.extend_from_slice(body);
        v.push(0xFF);
        v
    }

    fn all_prefixes_fail(lp: &[u8]) {
        for n in 0..lp.len() {
            assert!(entries(&lp[..n]).is_err(), "prefix of {n} bytes accepted");
        }
    }

    #[test]
    fn known_answer_redis_listpack() {
        // "a": 6-bit string 0x81 'a', size 2, backlen 02.
        // "1024": 13-bit int, 1024 = 0x0400 -> C4 00, backlen 02.
        // "-1": 13-bit int, 8192-1 = 0x1FFF -> DF FF, backlen 02.
        // "hello world": 6-bit string of 11 -> 8B + 11 bytes, size 12, backlen 0C.
        // Total = 6 + 3 + 3 + 3 + 13 + 1 = 29 = 0x1D.
        let expected: &[u8] = &[
            0x1D, 0x00, 0x00, 0x00, 0x04, 0x00, // header
            0x81, b'a', 0x02, // "a"
            0xC4, 0x00, 0x02, // 1024
            0xDF, 0xFF, 0x02, // -1
            0x8B, b'h', b'e', b'l', b'l', b'o', b' ', b'w', b'o', b'r', b'l', b'd', 0x0C, 0xFF,
        ];
        let mut w = Writer::new();
        for e in ["a", "1024", "-1", "hello world"] {
            w.push_bytes(e.as_bytes());
        }
        assert_eq!(w.len(), 4);
        assert_eq!(w.bytes_len(), expected.len());
        assert_eq!(w.finish(), expected);
        assert_eq!(
            entries(expected).unwrap(),
            vec![
                Elem::Bytes(b"a"),
                Elem::Int(1024),
                Elem::Int(-1),
                Elem::Bytes(b"hello world"),
            ]
        );
        all_prefixes_fail(expected);
    }

    #[test]
    fn empty_listpack() {
        let lp = [7, 0, 0, 0, 0, 0, 0xFF];
        assert_eq!(entries(&lp).unwrap(), vec![]);
        assert_eq!(Writer::new().finish(), lp);
        assert!(Writer::new().is_empty());
        all_prefixes_fail(&lp);
    }

    #[test]
    fn every_integer_encoding() {
        let cases: &[(&[u8], i64)] = &[
            (&[0x00, 0x01], 0),
            (&[0x7F, 0x01], 127),
            (&[0xC0, 0x80, 0x02], 128),
            (&[0xCF, 0xFF, 0x02], 4095),
            (&[0xD0, 0x00, 0x02], -4096),
            (&[0xF1, 0x00, 0x10, 0x03], 4096),
            (&[0xF1, 0xFF, 0xEF, 0x03], -4097),
            (&[0xF1, 0xFF, 0x7F, 0x03], 32767),
            (&[0xF1, 0x00, 0x80, 0x03], -32768),
            (&[0xF2, 0x00, 0x80, 0x00, 0x04], 32768),
            (&[0xF2, 0xFF, 0x7F, 0xFF, 0x04], -32769),
            (&[0xF2, 0xFF, 0xFF, 0x7F, 0x04], 8_388_607),
            (&[0xF2, 0x00, 0x00, 0x80, 0x04], -8_388_608),
            (&[0xF3, 0x00, 0x00, 0x80, 0x00, 0x05], 8_388_608),
            (&[0xF3, 0xFF, 0xFF, 0xFF, 0x7F, 0x05], i32::MAX as i64),
            (&[0xF3, 0x00, 0x00, 0x00, 0x80, 0x05], i32::MIN as i64),
            (
                &[0xF4, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x09],
                1 << 31,
            ),
            (
                &[0xF4, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0x09],
                -(1 << 31) - 1,
            ),
            (
                &[0xF4, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F, 0x09],
                i64::MAX,
            ),
            (
                &[0xF4, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x09],
                i64::MIN,
            ),
        ];
        for &(entry, v) in cases {
            let lp = wrap(1, entry);
            assert_eq!(entries(&lp).unwrap(), vec![Elem::Int(v)], "{v}");
            // The writer picks the same (smallest) encoding, from an int or a string.
            let mut w = Writer::new();
            w.push_int(v);
            assert_eq!(w.finish(), lp, "push_int({v})");
            let mut w = Writer::new();
            w.push_bytes(v.to_string().as_bytes());
            assert_eq!(w.finish(), lp, "push_bytes({v})");
            all_prefixes_fail(&lp);
        }
    }

    #[test]
    fn every_string_encoding_and_backlen_width() {
        // 6-bit length, empty and 63 bytes.
        let lp = wrap(1, &[0x80, 0x01]);
        assert_eq!(entries(&lp).unwrap(), vec![Elem::Bytes(b"")]);
        let s63 = vec![b'x'; 63];
        let mut body = vec![0xBF];
        body.extend_from_slice(&s63);
        body.push(64);
        assert_eq!(entries(&wrap(1, &body)).unwrap(), vec![Elem::Bytes(&s63)]);

        // 12-bit length: 100 bytes (size 102, backlen one byte 0x66), then 200 bytes
        // (size 202 = 1*128 + 74, backlen 01 CA), then 4095 bytes (size 4097 = 32*128 +
        // 1, backlen 20 81).
        let s100 = vec![b'y'; 100];
        let mut body = vec![0xE0, 100];
        body.extend_from_slice(&s100);
        body.push(0x66);
        let lp100 = wrap(1, &body);
        assert_eq!(entries(&lp100).unwrap(), vec![Elem::Bytes(&s100)]);
        all_prefixes_fail(&lp100);

        let s200 = vec![b'z'; 200];
        let mut body = vec![0xE0, 200];
        body.extend_from_slice(&s200);
        body.extend_from_slice(&[0x01, 0xCA]);
        assert_eq!(entries(&wrap(1, &body)).unwrap(), vec![Elem::Bytes(&s200)]);

        let s4095 = vec![b'w'; 4095];
        let mut body = vec![0xEF, 0xFF];
        body.extend_from_slice(&s4095);
        body.extend_from_slice(&[0x20, 0x81]);
        assert_eq!(entries(&wrap(1, &body)).unwrap(), vec![Elem::Bytes(&s4095)]);

        // 32-bit length: 5000 bytes (size 5005 = 39*128 + 13, backlen 27 8D).
        let s5000 = vec![b'v'; 5000];
        let mut body = vec![0xF0, 0x88, 0x13, 0x00, 0x00];
        body.extend_from_slice(&s5000);
        body.extend_from_slice(&[0x27, 0x8D]);
        let lp5000 = wrap(1, &body);
        assert_eq!(entries(&lp5000).unwrap(), vec![Elem::Bytes(&s5000)]);
        all_prefixes_fail(&lp5000);

        // 20000 bytes: size 20005 = 1*16384 + 28*128 + 37, backlen 01 9C A5.
        let s20000 = vec![b'u'; 20000];
        let mut body = vec![0xF0, 0x20, 0x4E, 0x00, 0x00];
        body.extend_from_slice(&s20000);
        body.extend_from_slice(&[0x01, 0x9C, 0xA5]);
        assert_eq!(
            entries(&wrap(1, &body)).unwrap(),
            vec![Elem::Bytes(&s20000)]
        );

        // Redis's quirk: an entry of exactly 16383 bytes gets a 3-byte backlen 00 FF FF.
        let s = vec![b't'; 16383 - 5];
        let mut body = vec![0xF0];
        body.extend_from_slice(&(s.len() as u32).to_le_bytes());
        body.extend_from_slice(&s);
        body.extend_from_slice(&[0x00, 0xFF, 0xFF]);
        assert_eq!(entries(&wrap(1, &body)).unwrap(), vec![Elem::Bytes(&s)]);

        // The writer produces exactly these bytes.
        for (s, lp) in [
            (&s63[..], wrap(1, &[&[0xBF][..], &s63, &[64]].concat())),
            (&s100[..], lp100.clone()),
            (&s5000[..], lp5000.clone()),
            (&s[..], wrap(1, &body)),
        ] {
            let mut w = Writer::new();
            w.push_bytes(s);
            assert_eq!(w.finish(), lp);
        }
    }

    #[test]
    fn writer_round_trip() {
        let mut w = Writer::new();
        let long = vec![b'q'; 70_000];
        let strs: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"0".to_vec(),
            b"-0".to_vec(),
            b"007".to_vec(),
            b"+5".to_vec(),
            b" 5".to_vec(),
            b"9223372036854775807".to_vec(),
            b"9223372036854775808".to_vec(),
            b"-9223372036854775808".to_vec(),
            b"-9223372036854775809".to_vec(),
            b"12345678901234567890123".to_vec(),
            vec![b'k'; 64],
            vec![b'k'; 4096],
            long.clone(),
        ];
        for s in &strs {
            w.push_bytes(s);
        }
        let ints = [
            0,
            1,
            -1,
            127,
            128,
            -4096,
            -4097,
            40_000,
            -9_000_000,
            1 << 40,
        ];
        for &v in &ints {
            w.push_int(v);
        }
        let n = w.len();
        let len = w.bytes_len();
        let lp = w.finish();
        assert_eq!(lp.len(), len);
        let got = entries(&lp).unwrap();
        assert_eq!(got.len(), n);
        for (s, e) in strs.iter().zip(&got) {
            assert_eq!(&e.to_vec(), s);
            match canonical_i64(s) {
                Some(v) => assert_eq!(*e, Elem::Int(v)),
                None => assert_eq!(*e, Elem::Bytes(s)),
            }
        }
        for (&v, e) in ints.iter().zip(&got[strs.len()..]) {
            assert_eq!(*e, Elem::Int(v));
        }
    }

    #[test]
    fn count_over_16_bits_is_unknown() {
        let mut w = Writer::new();
        for i in 0..70_000 {
            w.push_int(i % 100);
        }
        let lp = w.finish();
        assert_eq!(&lp[4..6], &[0xFF, 0xFF]);
        assert_eq!(entries(&lp).unwrap().len(), 70_000);

        let mut w = Writer::new();
        for _ in 0..65_534 {
            w.push_int(1);
        }
        let lp = w.finish();
        assert_eq!(u16::from_le_bytes([lp[4], lp[5]]), 65_534);
        assert_eq!(entries(&lp).unwrap().len(), 65_534);
    }

    #[test]
    fn rejects_malformed() {
        let good = wrap(2, &[0x81, b'a', 0x02, 0x05, 0x01]);
        assert_eq!(
            entries(&good).unwrap(),
            vec![Elem::Bytes(b"a"), Elem::Int(5)]
        );
        // Wrong count.
        assert!(entries(&wrap(3, &[0x81, b'a', 0x02, 0x05, 0x01])).is_err());
        // Unknown count is fine.
        assert!(entries(&wrap(0xFFFF, &[0x81, b'a', 0x02, 0x05, 0x01])).is_ok());
        // Bad backlen value.
        assert!(entries(&wrap(2, &[0x81, b'a', 0x03, 0x05, 0x01])).is_err());
        // Backlen with its flag set where it must be the last byte.
        assert!(entries(&wrap(1, &[0x05, 0x81])).is_err());
        // Unknown encodings.
        for b in 0xF5..=0xFE {
            assert!(entries(&wrap(1, &[b, 0x01])).is_err());
        }
        // Terminator in the middle.
        assert!(entries(&wrap(1, &[0x05, 0x01, 0xFF])).is_err());
        // Total bytes not matching.
        let mut bad = good.clone();
        bad[0] += 1;
        assert!(entries(&bad).is_err());
        // No terminator.
        let mut bad = good.clone();
        *bad.last_mut().unwrap() = 0;
        assert!(entries(&bad).is_err());
        // A 32-bit string length far beyond the input.
        assert!(entries(&wrap(1, &[0xF0, 0xFF, 0xFF, 0xFF, 0xFF, 0x05])).is_err());
        all_prefixes_fail(&good);
    }

    #[test]
    fn canonical_integers() {
        let yes: &[(&str, i64)] = &[
            ("0", 0),
            ("7", 7),
            ("-7", -7),
            ("10", 10),
            ("9223372036854775807", i64::MAX),
            ("-9223372036854775808", i64::MIN),
        ];
        for &(s, v) in yes {
            assert_eq!(Elem::Bytes(s.as_bytes()).as_i64(), Some(v), "{s}");
            assert_eq!(Elem::Int(v).to_vec(), s.as_bytes());
        }
        for s in [
            "",
            "-",
            "-0",
            "00",
            "01",
            "+1",
            " 1",
            "1 ",
            "1a",
            "9223372036854775808",
            "-9223372036854775809",
            "99999999999999999999",
            "1.0",
        ] {
            assert_eq!(Elem::Bytes(s.as_bytes()).as_i64(), None, "{s:?}");
        }
        assert_eq!(Elem::Int(-5).as_i64(), Some(-5));
    }

    /// Flips bytes of valid listpacks at pseudo-random: the decoder must never panic.
    #[test]
    fn mutations_never_panic() {
        let mut w = Writer::new();
        for s in ["a", "1024", "-1", "hello world", "-70000", "3000000000"] {
            w.push_bytes(s.as_bytes());
        }
        w.push_bytes(&[b'p'; 300]);
        let lp = w.finish();
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut m = lp.clone();
            let i = 6 + (seed as usize % (m.len() - 7));
            m[i] = (seed >> 32) as u8;
            let _ = entries(&m);
        }
    }
}
