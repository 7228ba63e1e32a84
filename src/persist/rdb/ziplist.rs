//! Ziplists: the compact list encoding of Redis 3.2 to 6.2 (and, inside RDB files, of
//! the older list, hash and sorted-set encodings and of quicklist nodes).
//!
//! Layout: `zlbytes` (u32 LE, the whole size), `zltail` (u32 LE, offset of the last
//! entry), `zllen` (u16 LE, element count, 65535 meaning "count it yourself"), the
//! entries, and a 0xFF terminator.
//!
//! Each entry is `prevlen`, `encoding`, `payload`. `prevlen` is the total size of the
//! previous entry (0 for the first): one byte when below 254, otherwise 0xFE followed by
//! a u32 LE (Redis may keep the 5-byte form for small values too). The encoding, by its
//! first byte:
//!
//! | first byte  | meaning                                                   |
//! |-------------|-----------------------------------------------------------|
//! | `00xxxxxx`  | string, 6-bit length                                      |
//! | `01xxxxxx`  | string, 14-bit big-endian length (low 6 bits + next byte) |
//! | `10______`  | string, 32-bit big-endian length in the next 4 bytes      |
//! | `0xC0`      | i16 LE                                                    |
//! | `0xD0`      | i32 LE                                                    |
//! | `0xE0`      | i64 LE                                                    |
//! | `0xF0`      | 24-bit signed LE                                          |
//! | `0xFE`      | i8                                                        |
//! | `0xF1–0xFD` | immediate 0..=12 (low 4 bits minus one)                   |
//!
//! Every other byte starting with `11` is invalid.

pub use super::listpack::Elem;

const HEADER_LEN: usize = 10;
const END: u8 = 0xFF;
/// The one-byte prevlen marker announcing a 4-byte prevlen.
const BIG_PREVLEN: u8 = 0xFE;
const COUNT_UNKNOWN: u16 = u16::MAX;

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Decodes the entry starting at `pos`, which must end at or before `limit` (the offset
/// of the terminator). Returns the stated prevlen, the element and the entry's size.
fn decode_entry(zl: &[u8], pos: usize, limit: usize) -> Result<(u64, Elem<'_>, usize), String> {
    let p = &zl[pos..limit];
    let short = || "ziplist entry runs past the end".to_string();
    let (prevlen, hdr) = if p[0] < BIG_PREVLEN {
        (u64::from(p[0]), 1)
    } else {
        // p[0] is 0xFE here: the caller stops at 0xFF.
        let b = p.get(1..5).ok_or_else(short)?;
        (u64::from(le_u32(b)), 5)
    };
    let enc = *p.get(hdr).ok_or_else(short)?;
    let at = |from: usize, n: usize| -> Result<&[u8], String> {
        from.checked_add(n)
            .and_then(|to| p.get(from..to))
            .ok_or_else(short)
    };
    let int = |n: usize| -> Result<&[u8], String> { at(hdr + 1, n) };
    let (elem, size) = match enc {
        0x00..=0x3F => {
            let len = usize::from(enc & 0x3F);
            (Elem::Bytes(at(hdr + 1, len)?), hdr + 1 + len)
        }
        0x40..=0x7F => {
            let b1 = at(hdr + 1, 1)?[0];
            let len = (usize::from(enc & 0x3F) << 8) | usize::from(b1);
            (Elem::Bytes(at(hdr + 2, len)?), hdr + 2 + len)
        }
        0x80..=0xBF => {
            let b = at(hdr + 1, 4)?;
            let len = usize::try_from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .map_err(|_| "ziplist string too long for this machine".to_string())?;
            (Elem::Bytes(at(hdr + 5, len)?), hdr + 5 + len)
        }
        0xC0 => {
            let b = int(2)?;
            (
                Elem::Int(i64::from(i16::from_le_bytes([b[0], b[1]]))),
                hdr + 3,
            )
        }
        0xD0 => {
            let b = int(4)?;
            let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            (Elem::Int(i64::from(v)), hdr + 5)
        }
        0xE0 => {
            let b = int(8)?;
            let mut w = [0u8; 8];
            w.copy_from_slice(b);
            (Elem::Int(i64::from_le_bytes(w)), hdr + 9)
        }
        0xF0 => {
            let b = int(3)?;
            // The 24 bits go to the top of an i32; shifting back sign-extends.
            let v = i32::from_le_bytes([0, b[0], b[1], b[2]]) >> 8;
            (Elem::Int(i64::from(v)), hdr + 4)
        }
        0xFE => {
            let b = int(1)?;
            (Elem::Int(i64::from(b[0] as i8)), hdr + 2)
        }
        0xF1..=0xFD => (Elem::Int(i64::from(enc & 0x0F) - 1), hdr + 1),
        _ => return Err(format!("ziplist entry has unknown encoding 0x{enc:02X}")),
    };
    Ok((prevlen, elem, size))
}

/// Every element of a ziplist, in order. Checks zlbytes against the input length, that
/// zltail points at the last entry, the 0xFF terminator, that each entry's prevlen is
/// the size of the entry before it, and the count unless zllen is 65535.
pub fn entries(zl: &[u8]) -> Result<Vec<Elem<'_>>, String> {
    if zl.len() < HEADER_LEN + 1 {
        return Err("ziplist shorter than its header".into());
    }
    if u64::from(le_u32(&zl[0..4])) != zl.len() as u64 {
        return Err("ziplist zlbytes does not match its length".into());
    }
    let tail = u64::from(le_u32(&zl[4..8]));
    let count = u16::from_le_bytes([zl[8], zl[9]]);
    let last = zl.len() - 1;
    if zl[last] != END {
        return Err("ziplist does not end with 0xFF".into());
    }
    if tail > last as u64 {
        return Err("ziplist zltail points past the end".into());
    }
    // Every entry takes at least 2 bytes, which bounds the reservation by the input.
    let room = (last - HEADER_LEN) / 2;
    let mut out = Vec::with_capacity(if count == COUNT_UNKNOWN {
        room
    } else {
        usize::from(count).min(room)
    });
    let mut pos = HEADER_LEN;
    let mut prev: Option<(usize, usize)> = None; // (offset, size) of the previous entry
    while zl[pos] != END {
        let (prevlen, elem, size) = decode_entry(zl, pos, last)?;
        let expected = prev.map_or(0, |(_, s)| s as u64);
        if prevlen != expected {
            return Err(format!(
                "ziplist entry prevlen {prevlen} does not match previous entry size {expected}"
            ));
        }
        out.push(elem);
        prev = Some((pos, size));
        pos += size;
    }
    if pos != last {
        return Err("ziplist terminator before its end".into());
    }
    if let Some((off, _)) = prev {
        if off as u64 != tail {
            return Err("ziplist zltail does not point at the last entry".into());
        }
    }
    if count != COUNT_UNKNOWN && usize::from(count) != out.len() {
        return Err(format!(
            "ziplist header counts {count} entries, found {}",
            out.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a ziplist from raw entry encodings (encoding header + payload, no prevlen),
    /// writing each prevlen as Redis does (1 byte below 254, else 0xFE + u32 LE).
    fn build(count: u16, encs: &[Vec<u8>]) -> Vec<u8> {
        let mut body = Vec::new();
        let mut prev_size = 0usize;
        let mut tail = HEADER_LEN;
        for e in encs {
            tail = HEADER_LEN + body.len();
            let start = body.len();
            if prev_size < 254 {
                body.push(prev_size as u8);
            } else {
                body.push(0xFE);
                body.extend_from_slice(&(prev_size as u32).to_le_bytes());
            }
            body.extend_from_slice(e);
            prev_size = body.len() - start;
        }
        let total = (HEADER_LEN + body.len() + 1) as u32;
        let mut zl = total.to_le_bytes().to_vec();
        zl.extend_from_slice(&(tail as u32).to_le_bytes());
        zl.extend_from_slice(&count.to_le_bytes());
        zl.extend_from_slice(&body);
        zl.push(0xFF);
        zl
    }

    fn all_prefixes_fail(zl: &[u8]) {
        for n in 0..zl.len() {
            assert!(entries(&zl[..n]).is_err(), "prefix of {n} bytes accepted");
        }
    }

    #[test]
    fn example_from_the_format_description() {
        // "2" and "5" as immediates: 15 bytes, tail at 12.
        let zl = [
            0x0F, 0, 0, 0, 0x0C, 0, 0, 0, 0x02, 0, 0x00, 0xF3, 0x02, 0xF6, 0xFF,
        ];
        assert_eq!(entries(&zl).unwrap(), vec![Elem::Int(2), Elem::Int(5)]);
        assert_eq!(build(2, &[vec![0xF3], vec![0xF6]]), zl);
        all_prefixes_fail(&zl);
    }

    #[test]
    fn empty_ziplist() {
        let zl = [11, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0xFF];
        assert_eq!(entries(&zl).unwrap(), vec![]);
        all_prefixes_fail(&zl);
    }

    #[test]
    fn every_integer_encoding() {
        let cases: Vec<(Vec<u8>, i64)> = vec![
            (vec![0xF1], 0),
            (vec![0xFD], 12),
            (vec![0xFE, 0x0D], 13),
            (vec![0xFE, 0x80], -128),
            (vec![0xFE, 0x7F], 127),
            (vec![0xC0, 0x80, 0x00], 128),
            (vec![0xC0, 0x00, 0x80], -32768),
            (vec![0xF0, 0x00, 0x80, 0x00], 32768),
            (vec![0xF0, 0xFF, 0xFF, 0x7F], 8_388_607),
            (vec![0xF0, 0x00, 0x00, 0x80], -8_388_608),
            (vec![0xF0, 0xFF, 0xFF, 0xFF], -1),
            (vec![0xD0, 0x00, 0x00, 0x80, 0x00], 8_388_608),
            (vec![0xD0, 0x00, 0x00, 0x00, 0x80], i32::MIN as i64),
            (vec![0xE0, 0, 0, 0, 0x80, 0, 0, 0, 0], 1 << 31),
            (vec![0xE0, 0, 0, 0, 0, 0, 0, 0, 0x80], i64::MIN),
            (
                vec![0xE0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F],
                i64::MAX,
            ),
        ];
        for (enc, v) in &cases {
            let zl = build(1, std::slice::from_ref(enc));
            assert_eq!(entries(&zl).unwrap(), vec![Elem::Int(*v)], "{v}");
            all_prefixes_fail(&zl);
        }
        // All of them in one ziplist.
        let encs: Vec<Vec<u8>> = cases.iter().map(|(e, _)| e.clone()).collect();
        let want: Vec<Elem> = cases.iter().map(|&(_, v)| Elem::Int(v)).collect();
        assert_eq!(entries(&build(encs.len() as u16, &encs)).unwrap(), want);
    }

    #[test]
    fn every_string_encoding_and_prevlen_width() {
        let s0: Vec<u8> = vec![];
        let s63 = vec![b'a'; 63];
        let s64 = vec![b'b'; 64];
        let s300 = vec![b'c'; 300];
        let s16383 = vec![b'd'; 16383];
        let s16384 = vec![b'e'; 16384];
        let s70000 = vec![b'f'; 70_000];
        let enc06 = |s: &[u8]| [&[s.len() as u8][..], s].concat();
        let enc14 = |s: &[u8]| [&[0x40 | (s.len() >> 8) as u8, s.len() as u8][..], s].concat();
        let enc32 = |s: &[u8]| [&[0x80][..], &(s.len() as u32).to_be_bytes(), s].concat();
        let encs = vec![
            enc06(&s0),
            enc06(&s63),
            enc14(&s64),
            enc14(&s300),    // entry of 303 bytes: the next prevlen takes 5 bytes
            enc06(b"hello"), // carries a 5-byte prevlen
            enc14(&s16383),
            enc32(&s16384),
            enc32(&s70000),
            vec![0xF1],  // small entry after a large one
            enc32(b"x"), // the 32-bit form is legal for short strings too
        ];
        let zl = build(0xFFFF, &encs);
        let want = vec![
            Elem::Bytes(&s0),
            Elem::Bytes(&s63),
            Elem::Bytes(&s64),
            Elem::Bytes(&s300),
            Elem::Bytes(b"hello"),
            Elem::Bytes(&s16383),
            Elem::Bytes(&s16384),
            Elem::Bytes(&s70000),
            Elem::Int(0),
            Elem::Bytes(b"x"),
        ];
        assert_eq!(entries(&zl).unwrap(), want);
        // The same with an exact count; a wrong count fails.
        let mut counted = zl.clone();
        counted[8..10].copy_from_slice(&(want.len() as u16).to_le_bytes());
        assert_eq!(entries(&counted).unwrap(), want);
        counted[8] += 1;
        assert!(entries(&counted).is_err());

        // Hand-checked bytes of the 5-byte prevlen: after the 300-byte string (entry of
        // 1 + 2 + 300 = 303 bytes = 0x12F), "hello" has FE 2F 01 00 00.
        let small = build(2, &[enc14(&s300), enc06(b"hello")]);
        assert_eq!(&small[10..13], &[0x00, 0x41, 0x2C]);
        assert_eq!(
            &small[313..],
            &[0xFE, 0x2F, 0x01, 0x00, 0x00, 0x05, b'h', b'e', b'l', b'l', b'o', 0xFF]
        );
        assert_eq!(entries(&small).unwrap().len(), 2);
        all_prefixes_fail(&small);
        all_prefixes_fail(&build(1, &[enc32(&s16384)]));
    }

    #[test]
    fn five_byte_prevlen_for_small_value_is_accepted() {
        // Redis may leave a 5-byte prevlen in place when the previous entry shrank.
        let mut zl = vec![];
        let body = [0x00, 0xF2, 0xFE, 0x02, 0x00, 0x00, 0x00, 0xF3];
        zl.extend_from_slice(&((10 + body.len() + 1) as u32).to_le_bytes());
        zl.extend_from_slice(&12u32.to_le_bytes());
        zl.extend_from_slice(&2u16.to_le_bytes());
        zl.extend_from_slice(&body);
        zl.push(0xFF);
        assert_eq!(entries(&zl).unwrap(), vec![Elem::Int(1), Elem::Int(2)]);
    }

    #[test]
    fn rejects_malformed() {
        let good = build(2, &[vec![0x01, b'a'], vec![0xF5]]);
        assert_eq!(
            entries(&good).unwrap(),
            vec![Elem::Bytes(b"a"), Elem::Int(4)]
        );
        // Wrong prevlen.
        let mut bad = good.clone();
        assert_eq!(bad[13], 3);
        bad[13] = 2;
        assert!(entries(&bad).is_err());
        // First entry with a nonzero prevlen.
        let mut bad = good.clone();
        bad[10] = 1;
        assert!(entries(&bad).is_err());
        // Wrong tail.
        let mut bad = good.clone();
        bad[4] = 10;
        assert!(entries(&bad).is_err());
        let mut bad = good.clone();
        bad[4] = 200;
        assert!(entries(&bad).is_err());
        // Wrong count.
        let mut bad = good.clone();
        bad[8] = 3;
        assert!(entries(&bad).is_err());
        // Wrong zlbytes.
        let mut bad = good.clone();
        bad[0] += 1;
        assert!(entries(&bad).is_err());
        // Invalid integer encodings.
        for e in [0xC1u8, 0xCF, 0xD5, 0xE7, 0xEF, 0xFF] {
            let bad = build(1, &[vec![e, 0, 0, 0, 0, 0, 0, 0, 0]]);
            assert!(entries(&bad).is_err(), "0x{e:02X}");
        }
        // A 32-bit string length far beyond the input.
        assert!(entries(&build(1, &[vec![0x80, 0xFF, 0xFF, 0xFF, 0xFF]])).is_err());
        // Terminator before the end.
        let mut bad = build(1, &[vec![0x01, b'a']]);
        bad.insert(bad.len() - 1, 0x00);
        let n = bad.len() as u32;
        bad[..4].copy_from_slice(&n.to_le_bytes());
        let l = bad.len();
        bad[l - 2] = 0xFF;
        assert!(entries(&bad).is_err());
        all_prefixes_fail(&good);
    }

    #[test]
    fn mutations_never_panic() {
        let zl = build(
            4,
            &[
                vec![0x01, b'a'],
                vec![0xC0, 0x34, 0x12],
                [&[0x41, 0x2C][..], &[b'z'; 300]].concat(),
                vec![0xE0, 1, 2, 3, 4, 5, 6, 7, 8],
            ],
        );
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut m = zl.clone();
            let i = seed as usize % m.len();
            m[i] = (seed >> 32) as u8;
            let _ = entries(&m);
        }
    }
}
