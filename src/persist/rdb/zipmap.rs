//! Zipmaps: the compact hash encoding of Redis 2.x, still found in old RDB files.
//!
//! Layout: `zmlen` (one byte: the number of pairs, or 254 when there may be more and
//! they must be counted), then per pair: key length, key, value length, a `free` byte,
//! the value and `free` unused bytes; then a 0xFF terminator in place of a key length.
//! A length is one byte when below 254, otherwise 0xFE followed by a u32 LE.

const END: u8 = 0xFF;
/// The length-byte marker announcing a 4-byte length (and, as `zmlen`, "count them").
const BIG: u8 = 0xFE;

/// Reads a length at `*pos`, advancing past it. `what` names it in errors.
fn read_len(zm: &[u8], pos: &mut usize, what: &str) -> Result<usize, String> {
    let first = *zm
        .get(*pos)
        .ok_or_else(|| format!("zipmap {what} length runs past the end"))?;
    match first {
        0..=0xFD => {
            *pos += 1;
            Ok(usize::from(first))
        }
        BIG => {
            let b = zm
                .get(*pos + 1..*pos + 5)
                .ok_or_else(|| format!("zipmap {what} length runs past the end"))?;
            *pos += 5;
            usize::try_from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .map_err(|_| format!("zipmap {what} too long for this machine"))
        }
        END => Err(format!("zipmap {what} length is the terminator byte")),
    }
}

/// Takes `len` bytes at `*pos`, advancing past them.
fn take<'a>(zm: &'a [u8], pos: &mut usize, len: usize, what: &str) -> Result<&'a [u8], String> {
    let s = pos
        .checked_add(len)
        .and_then(|end| zm.get(*pos..end))
        .ok_or_else(|| format!("zipmap {what} runs past the end"))?;
    *pos += len;
    Ok(s)
}

/// The (field, value) pairs of a zipmap, in order. Checks that every length stays inside
/// the input, that the terminator is the last byte, that the pair count matches `zmlen`
/// (unless it is 254), and (as Redis does when loading) that the zipmap is not empty.
#[allow(clippy::type_complexity)] // the plain tuple is the clearest shape for callers
pub fn pairs(zm: &[u8]) -> Result<Vec<(&[u8], &[u8])>, String> {
    if zm.len() < 2 {
        return Err("zipmap shorter than its header".into());
    }
    let zmlen = zm[0];
    let mut out = Vec::new();
    let mut pos = 1;
    loop {
        match zm.get(pos) {
            None => return Err("zipmap has no terminator".into()),
            Some(&END) => break,
            Some(_) => {}
        }
        let klen = read_len(zm, &mut pos, "key")?;
        let key = take(zm, &mut pos, klen, "key")?;
        let vlen = read_len(zm, &mut pos, "value")?;
        let free = usize::from(take(zm, &mut pos, 1, "free byte")?[0]);
        let value = take(zm, &mut pos, vlen, "value")?;
        take(zm, &mut pos, free, "free space")?;
        out.push((key, value));
    }
    if pos != zm.len() - 1 {
        return Err("zipmap terminator before its end".into());
    }
    if out.is_empty() {
        return Err("zipmap is empty".into());
    }
    if zmlen != BIG && usize::from(zmlen) != out.len() {
        return Err(format!(
            "zipmap header counts {zmlen} pairs, found {}",
            out.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_prefixes_fail(zm: &[u8]) {
        for n in 0..zm.len() {
            assert!(pairs(&zm[..n]).is_err(), "prefix of {n} bytes accepted");
        }
    }

    #[test]
    fn example_from_the_format_description() {
        let zm = b"\x02\x03foo\x03\x00bar\x05hello\x05\x00world\xff";
        assert_eq!(
            pairs(zm).unwrap(),
            vec![(&b"foo"[..], &b"bar"[..]), (&b"hello"[..], &b"world"[..])]
        );
        all_prefixes_fail(zm);
    }

    #[test]
    fn free_bytes_and_long_lengths() {
        // "k" => "hi" with 2 free bytes, then a 300-byte key with a 5-byte length and a
        // 253-byte value (the largest one-byte length), then an empty key and value.
        let long_key = vec![b'K'; 300];
        let val253 = vec![b'V'; 253];
        let mut zm = vec![0x03];
        zm.extend_from_slice(&[0x01, b'k', 0x02, 0x02, b'h', b'i', b'?', b'?']);
        zm.extend_from_slice(&[0xFE, 0x2C, 0x01, 0x00, 0x00]);
        zm.extend_from_slice(&long_key);
        zm.extend_from_slice(&[0xFD, 0x00]);
        zm.extend_from_slice(&val253);
        zm.extend_from_slice(&[0x00, 0x00, 0x00]);
        zm.push(0xFF);
        let want = vec![
            (&b"k"[..], &b"hi"[..]),
            (&long_key[..], &val253[..]),
            (&b""[..], &b""[..]),
        ];
        assert_eq!(pairs(&zm).unwrap(), want);
        all_prefixes_fail(&zm);
        // 254 = count unknown.
        zm[0] = 0xFE;
        assert_eq!(pairs(&zm).unwrap(), want);
        // Wrong count.
        zm[0] = 2;
        assert!(pairs(&zm).is_err());
    }

    #[test]
    fn rejects_malformed() {
        // Empty.
        assert!(pairs(b"\x00\xff").is_err());
        // Terminator in place of a value length.
        assert!(pairs(b"\x01\x01a\xff").is_err());
        // Bytes after the terminator.
        assert!(pairs(b"\x01\x01a\x01\x00b\xff\x00").is_err());
        // Free space past the end.
        assert!(pairs(b"\x01\x01a\x01\x09b\xff").is_err());
        // Huge lengths.
        assert!(pairs(b"\x01\xfe\xff\xff\xff\xffa\xff").is_err());
        assert!(pairs(b"\x01\x01a\xfe\xff\xff\xff\xff\x00b\xff").is_err());
        // No terminator.
        assert!(pairs(b"\x01\x01a\x01\x00b").is_err());
    }

    #[test]
    fn mutations_never_panic() {
        let zm = b"\x02\x03foo\x03\x01bar!\x05hello\xfe\x05\x00\x00\x00\x00world\xff";
        assert_eq!(pairs(zm).unwrap().len(), 2);
        let mut seed: u64 = 0xD1B5_4A32_D192_ED03;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut m = zm.to_vec();
            let i = seed as usize % m.len();
            m[i] = (seed >> 32) as u8;
            let _ = pairs(&m);
        }
    }
}
