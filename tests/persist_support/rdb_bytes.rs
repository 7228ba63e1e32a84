//! RDB bytes: Redis's CRC-64, the RDB length and string encodings, a tiny reader that
//! finds a key in a file, and encoders for the old value formats (ziplist, zipmap,
//! intset) used to assemble files and DUMP payloads by hand.
#![allow(dead_code)]

/// Redis's CRC-64 (Jones polynomial, reflected, initial value 0): the footer of RDB
/// files (version >= 5) and of DUMP payloads.
pub fn crc64(data: &[u8]) -> u64 {
    static TABLE: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        const POLY: u64 = 0x95ac_9329_ac4b_c9b5; // 0xad93d23594c935a9 bit-reversed
        let mut t = [0u64; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut crc = i as u64;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ POLY
                } else {
                    crc >> 1
                };
            }
            *slot = crc;
        }
        t
    });
    let mut crc = 0u64;
    for &b in data {
        crc = table[((crc ^ b as u64) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// Replaces the CRC at the end of a DUMP payload (or an RDB file) with the right one.
pub fn fix_crc(mut data: Vec<u8>) -> Vec<u8> {
    let n = data.len();
    let crc = crc64(&data[..n - 8]);
    data[n - 8..].copy_from_slice(&crc.to_le_bytes());
    data
}

/// RDB length encoding: 6-bit, 14-bit, 32-bit or 64-bit (big-endian after the tag).
pub fn rdb_len(n: u64) -> Vec<u8> {
    if n < 64 {
        vec![n as u8]
    } else if n < 16384 {
        vec![0x40 | (n >> 8) as u8, n as u8]
    } else if n <= u32::MAX as u64 {
        let mut v = vec![0x80];
        v.extend_from_slice(&(n as u32).to_be_bytes());
        v
    } else {
        let mut v = vec![0x81];
        v.extend_from_slice(&n.to_be_bytes());
        v
    }
}

/// A length-prefixed RDB string.
pub fn rdb_str(s: &[u8]) -> Vec<u8> {
    let mut v = rdb_len(s.len() as u64);
    v.extend_from_slice(s);
    v
}

/// Reads an RDB length at `*pos`: (value, true when it is a special encoding 0xC?).
pub fn read_rdb_len(buf: &[u8], pos: &mut usize) -> (u64, bool) {
    let b = buf[*pos];
    *pos += 1;
    match b >> 6 {
        0 => ((b & 0x3f) as u64, false),
        1 => {
            let v = (((b & 0x3f) as u64) << 8) | buf[*pos] as u64;
            *pos += 1;
            (v, false)
        }
        2 if b == 0x80 => {
            let v = u32::from_be_bytes(buf[*pos..*pos + 4].try_into().unwrap()) as u64;
            *pos += 4;
            (v, false)
        }
        2 => {
            let v = u64::from_be_bytes(buf[*pos..*pos + 8].try_into().unwrap());
            *pos += 8;
            (v, false)
        }
        _ => ((b & 0x3f) as u64, true),
    }
}

/// Skips one RDB string at `*pos`; returns its encoding: "raw", "int", or "lzf".
pub fn skip_rdb_string(buf: &[u8], pos: &mut usize) -> &'static str {
    let (n, special) = read_rdb_len(buf, pos);
    if !special {
        *pos += n as usize;
        return "raw";
    }
    match n {
        0 => {
            *pos += 1;
            "int"
        }
        1 => {
            *pos += 2;
            "int"
        }
        2 => {
            *pos += 4;
            "int"
        }
        3 => {
            let (clen, _) = read_rdb_len(buf, pos);
            let _ulen = read_rdb_len(buf, pos);
            *pos += clen as usize;
            "lzf"
        }
        other => panic!("unknown RDB string encoding {other}"),
    }
}

/// Finds a top-level key stored as a plain RDB string of fewer than 64 bytes: returns
/// (type byte, offset of the value). None when the name is not found in that form.
pub fn find_key(file: &[u8], key: &[u8]) -> Option<(u8, usize)> {
    assert!(!key.is_empty() && key.len() < 64);
    let mut needle = vec![key.len() as u8];
    needle.extend_from_slice(key);
    let mut from = 1;
    while from + needle.len() <= file.len() {
        let at = file[from..]
            .windows(needle.len())
            .position(|w| w == needle)?
            + from;
        let ty = file[at - 1];
        if ty <= 21 && ty != 8 {
            return Some((ty, at + needle.len()));
        }
        from = at + 1;
    }
    None
}

// ---- old value encodings, for files assembled by hand ----

/// One ziplist entry.
pub enum Zl<'a> {
    S(&'a [u8]),
    I(i64),
}

/// A ziplist (Redis 2.6 - 6.2): zlbytes u32 LE, zltail u32 LE (offset of the last
/// entry), zllen u16 LE, entries (prevlen, encoding, data), 0xFF.
pub fn ziplist(entries: &[Zl]) -> Vec<u8> {
    let mut body = Vec::new();
    let mut prev_len = 0usize;
    let mut last_offset = 10usize;
    for e in entries {
        let start = body.len();
        last_offset = 10 + start;
        // prevlen: one byte below 254, else 0xFE and a u32 LE.
        if prev_len < 254 {
            body.push(prev_len as u8);
        } else {
            body.push(0xFE);
            body.extend_from_slice(&(prev_len as u32).to_le_bytes());
        }
        match e {
            Zl::S(s) => {
                let n = s.len();
                if n <= 63 {
                    body.push(n as u8); // 00pppppp
                } else if n <= 16383 {
                    body.push(0x40 | (n >> 8) as u8); // 01pppppp qqqqqqqq (big-endian)
                    body.push(n as u8);
                } else {
                    body.push(0x80); // 10000000 + u32 big-endian
                    body.extend_from_slice(&(n as u32).to_be_bytes());
                }
                body.extend_from_slice(s);
            }
            Zl::I(v) => {
                let v = *v;
                if (0..=12).contains(&v) {
                    body.push(0xF1 + v as u8); // 1111xxxx: immediate 0..12
                } else if i8::try_from(v).is_ok() {
                    body.push(0xFE); // int8
                    body.push(v as i8 as u8);
                } else if i16::try_from(v).is_ok() {
                    body.push(0xC0); // int16 LE
                    body.extend_from_slice(&(v as i16).to_le_bytes());
                } else if (-(1 << 23)..(1 << 23)).contains(&v) {
                    body.push(0xF0); // int24 LE
                    body.extend_from_slice(&(v as i32).to_le_bytes()[..3]);
                } else if i32::try_from(v).is_ok() {
                    body.push(0xD0); // int32 LE
                    body.extend_from_slice(&(v as i32).to_le_bytes());
                } else {
                    body.push(0xE0); // int64 LE
                    body.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        prev_len = body.len() - start;
    }
    let total = 10 + body.len() + 1;
    let mut zl = Vec::with_capacity(total);
    zl.extend_from_slice(&(total as u32).to_le_bytes());
    zl.extend_from_slice(&(last_offset as u32).to_le_bytes());
    zl.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    zl.extend_from_slice(&body);
    zl.push(0xFF);
    zl
}

/// A zipmap (Redis < 2.6 small hashes): zmlen (1 byte), then per pair <len>key
/// <len><free>value, lengths as 1 byte (< 254) or 0xFE + u32 LE; 0xFF at the end.
pub fn zipmap(pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
    fn zlen(out: &mut Vec<u8>, n: usize) {
        if n < 254 {
            out.push(n as u8);
        } else {
            out.push(254);
            out.extend_from_slice(&(n as u32).to_le_bytes());
        }
    }
    let mut zm = vec![pairs.len() as u8];
    for (k, v) in pairs {
        zlen(&mut zm, k.len());
        zm.extend_from_slice(k);
        zlen(&mut zm, v.len());
        zm.push(0); // free bytes after the value
        zm.extend_from_slice(v);
    }
    zm.push(0xFF);
    zm
}

/// An intset: encoding (bytes per integer: 2, 4 or 8) u32 LE, length u32 LE, the
/// integers sorted ascending, little-endian.
pub fn intset(width: usize, values: &[i64]) -> Vec<u8> {
    let mut v: Vec<i64> = values.to_vec();
    v.sort();
    let mut out = Vec::new();
    out.extend_from_slice(&(width as u32).to_le_bytes());
    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    for x in v {
        out.extend_from_slice(&x.to_le_bytes()[..width]);
    }
    out
}
