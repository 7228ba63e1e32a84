//! Intsets: the sorted-integer encoding Redis uses for small sets of integers.
//!
//! Layout: `encoding` (u32 LE: the width of every member in bytes, 2, 4 or 8), `length`
//! (u32 LE: the number of members), then the members as little-endian signed integers of
//! that width, in strictly ascending order.

const HEADER_LEN: usize = 8;

/// The members of an intset, in the order stored (ascending). Rejects an encoding other
/// than 2, 4 or 8, a length that does not match the bytes present, members that are not
/// strictly ascending, and (as Redis does when loading) an empty intset.
pub fn members(is: &[u8]) -> Result<Vec<i64>, String> {
    if is.len() < HEADER_LEN {
        return Err("intset shorter than its header".into());
    }
    let width = u32::from_le_bytes([is[0], is[1], is[2], is[3]]);
    let count = u32::from_le_bytes([is[4], is[5], is[6], is[7]]);
    let width = match width {
        2 | 4 | 8 => width as usize,
        _ => return Err(format!("intset has invalid encoding {width}")),
    };
    let body = &is[HEADER_LEN..];
    if body.len() as u64 != u64::from(count) * width as u64 {
        return Err(format!(
            "intset length {count} does not match its {} bytes of members",
            body.len()
        ));
    }
    if count == 0 {
        return Err("intset is empty".into());
    }
    let mut out: Vec<i64> = Vec::with_capacity(body.len() / width);
    for chunk in body.chunks_exact(width) {
        let v = match *chunk {
            [a, b] => i64::from(i16::from_le_bytes([a, b])),
            [a, b, c, d] => i64::from(i32::from_le_bytes([a, b, c, d])),
            [a, b, c, d, e, f, g, h] => i64::from_le_bytes([a, b, c, d, e, f, g, h]),
            _ => return Err("intset member of unexpected width".into()),
        };
        if let Some(&prev) = out.last() {
            if v <= prev {
                return Err("intset members not in strictly ascending order".into());
            }
        }
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(width: u32, vals: &[i64]) -> Vec<u8> {
        let mut v = width.to_le_bytes().to_vec();
        v.extend_from_slice(&(vals.len() as u32).to_le_bytes());
        for &x in vals {
            v.extend_from_slice(&x.to_le_bytes()[..width as usize]);
        }
        v
    }

    fn all_prefixes_fail(is: &[u8]) {
        for n in 0..is.len() {
            assert!(members(&is[..n]).is_err(), "prefix of {n} bytes accepted");
        }
    }

    #[test]
    fn each_width() {
        // 16-bit: [-2, 1, 300] by hand.
        let is16 = [2, 0, 0, 0, 3, 0, 0, 0, 0xFE, 0xFF, 0x01, 0x00, 0x2C, 0x01];
        assert_eq!(members(&is16).unwrap(), vec![-2, 1, 300]);
        assert_eq!(build(2, &[-2, 1, 300]), is16);
        all_prefixes_fail(&is16);

        let v32 = [i32::MIN as i64, -70_000, 0, 70_000, i32::MAX as i64];
        let is32 = build(4, &v32);
        assert_eq!(members(&is32).unwrap(), v32);
        all_prefixes_fail(&is32);

        let v64 = [i64::MIN, -(1 << 40), 5, 1 << 40, i64::MAX];
        let is64 = build(8, &v64);
        assert_eq!(members(&is64).unwrap(), v64);
        all_prefixes_fail(&is64);

        // A wider encoding than needed is still valid.
        assert_eq!(members(&build(8, &[1, 2])).unwrap(), vec![1, 2]);
    }

    #[test]
    fn rejects_malformed() {
        // Bad encodings.
        for w in [0u32, 1, 3, 5, 16, u32::MAX] {
            let mut v = w.to_le_bytes().to_vec();
            v.extend_from_slice(&1u32.to_le_bytes());
            v.extend_from_slice(&[0; 16]);
            assert!(members(&v).is_err(), "width {w}");
        }
        // Length mismatches, both ways, and a huge length.
        let mut v = build(2, &[1, 2, 3]);
        v[4] = 4;
        assert!(members(&v).is_err());
        v[4] = 2;
        assert!(members(&v).is_err());
        v[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(members(&v).is_err());
        // Trailing odd byte.
        let mut v = build(4, &[1, 2]);
        v.push(0);
        assert!(members(&v).is_err());
        // Order: duplicates and descending.
        assert!(members(&build(2, &[1, 1])).is_err());
        assert!(members(&build(4, &[2, 1])).is_err());
        assert!(members(&build(8, &[1, 3, 2])).is_err());
        // Empty.
        assert!(members(&build(2, &[])).is_err());
    }
}
