//! LZF, the small LZ77 variant Redis uses for compressed strings in RDB files.
//!
//! A compressed stream is a sequence of items, each starting with a control byte:
//!
//! * `000LLLLL`: a literal run of `L + 1` (1..=32) bytes, which follow.
//! * `LLLOOOOO OOOOOOOO` with `LLL` in 1..=6: copy `LLL + 2` bytes starting `O + 1` bytes
//!   back in the output (`O` is 13 bits: the low 5 bits of the control byte, then the
//!   next byte).
//! * `111OOOOO EEEEEEEE OOOOOOOO`: the same with length `7 + E + 2` (9..=264).
//!
//! A copy may overlap the bytes it produces (a distance shorter than the length repeats
//! a pattern). The stream carries no length of its own: RDB stores the compressed and
//! the uncompressed lengths beside it.

/// Longest literal run one control byte can announce.
const MAX_LIT: usize = 32;
/// Farthest a back reference can reach (distance = 13-bit field + 1).
const MAX_DIST: usize = 1 << 13;
/// Shortest back reference worth emitting (and the shortest the format allows).
const MIN_MATCH: usize = 3;
/// Longest back reference: 7 + 255 in the length fields, plus 2.
const MAX_MATCH: usize = 7 + 255 + 2;
/// The most output one input byte can produce: a 3-byte long reference gives 264 bytes.
const MAX_EXPANSION: usize = MAX_MATCH / 3;

/// Makes room for `n` more bytes in `out` without ever growing its capacity past
/// `ceiling` (the length the caller expects), while keeping growth amortized.
fn reserve(out: &mut Vec<u8>, n: usize, ceiling: usize) {
    let need = out.len() + n;
    if need > out.capacity() {
        let target = need.max(out.capacity().saturating_mul(2)).min(ceiling);
        out.reserve_exact(target.max(need) - out.len());
    }
}

/// Decompresses `input`, which must expand to exactly `expected_len` bytes.
pub fn decompress(input: &[u8], expected_len: usize) -> Result<Vec<u8>, String> {
    if expected_len > input.len().saturating_mul(MAX_EXPANSION) {
        return Err(format!(
            "lzf: {} compressed bytes cannot expand to {expected_len}",
            input.len()
        ));
    }
    let too_long = || "lzf: data expands past its stated length".to_string();
    let truncated = || "lzf: compressed data truncated".to_string();
    // The check above bounds expected_len by what the input can expand to, so the whole
    // output can be reserved at once: growing it by doubling cost a copy per step.
    let mut out = Vec::with_capacity(expected_len);
    let mut ip = 0;
    while ip < input.len() {
        let ctrl = usize::from(input[ip]);
        ip += 1;
        if ctrl < MAX_LIT {
            let n = ctrl + 1;
            let lit = input.get(ip..ip + n).ok_or_else(truncated)?;
            if n > expected_len - out.len() {
                return Err(too_long());
            }
            reserve(&mut out, n, expected_len);
            out.extend_from_slice(lit);
            ip += n;
        } else {
            let mut len = ctrl >> 5;
            if len == 7 {
                len += usize::from(*input.get(ip).ok_or_else(truncated)?);
                ip += 1;
            }
            len += 2;
            let low = usize::from(*input.get(ip).ok_or_else(truncated)?);
            ip += 1;
            let dist = ((ctrl & 0x1F) << 8) + low + 1;
            if len > expected_len - out.len() {
                return Err(too_long());
            }
            if dist > out.len() {
                return Err("lzf: back reference before the start of the data".into());
            }
            reserve(&mut out, len, expected_len);
            let from = out.len() - dist;
            if dist >= len {
                out.extend_from_within(from..from + len);
            } else {
                // Overlapping: each byte may be one this copy just wrote.
                for k in from..from + len {
                    let b = out[k];
                    out.push(b);
                }
            }
        }
    }
    if out.len() != expected_len {
        return Err(format!(
            "lzf: data expands to {} bytes, expected {expected_len}",
            out.len()
        ));
    }
    Ok(out)
}

/// Compresses `input`; None when the result would not be smaller than
/// `input.len() - 4` (callers then store the string plain).
pub fn compress(input: &[u8]) -> Option<Vec<u8>> {
    // Positions are kept in 32 bits; larger strings are stored as they are.
    if input.len() >= u32::MAX as usize {
        return None;
    }
    let limit = input.len().checked_sub(4)?;
    encode(input, limit).filter(|c| c.len() < limit)
}

/// Appends literal runs for `lit`, at most `MAX_LIT` bytes per control byte.
fn push_literals(out: &mut Vec<u8>, lit: &[u8]) {
    for run in lit.chunks(MAX_LIT) {
        out.push((run.len() - 1) as u8);
        out.extend_from_slice(run);
    }
}

/// Bytes `push_literals` would write for `n` literal bytes.
fn literal_cost(n: usize) -> usize {
    n + n.div_ceil(MAX_LIT)
}

/// Appends a back reference copying `len` (3..=264) bytes from `dist` (1..=8192) back.
fn push_ref(out: &mut Vec<u8>, dist: usize, len: usize) {
    let off = dist - 1;
    let l = len - 2;
    let high = (off >> 8) as u8;
    if l < 7 {
        out.push(((l as u8) << 5) | high);
    } else {
        out.push((7 << 5) | high);
        out.push((l - 7) as u8);
    }
    out.push(off as u8);
}

/// Greedy LZF encoding: at each position, look up the last position whose next three
/// bytes hashed alike; if they really match and are within reach, emit the longest
/// match there, otherwise carry the byte as a literal. Gives up (None) as soon as the
/// output reaches `limit` bytes.
fn encode(input: &[u8], limit: usize) -> Option<Vec<u8>> {
    let n = input.len();
    // A table about the size of the input, between 2^8 and 2^16 slots.
    let bits = (usize::BITS - n.saturating_sub(1).leading_zeros()).clamp(8, 14);
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        t.clear();
        t.resize(1 << bits, 0);
        encode_with(input, limit, bits, &mut t)
    })
}

thread_local! {
    /// The match table, reused: snapshots compress thousands of 8 KiB blobs in a row.
    static TABLE: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn encode_with(input: &[u8], limit: usize, bits: u32, table: &mut [u32]) -> Option<Vec<u8>> {
    let n = input.len();
    let slot = |i: usize| -> usize {
        let v =
            (u32::from(input[i]) << 16) | (u32::from(input[i + 1]) << 8) | u32::from(input[i + 2]);
        (v.wrapping_mul(0x9E37_79B1) >> (32 - bits)) as usize
    };
    let mut out = Vec::with_capacity(limit.min(n + n / MAX_LIT + 1));
    let mut lit_start = 0;
    let mut i = 0;
    while i + MIN_MATCH <= n {
        let h = slot(i);
        let cand = table[h] as usize;
        table[h] = (i + 1) as u32;
        if cand != 0 {
            let r = cand - 1;
            let dist = i - r;
            if dist <= MAX_DIST && input[r..r + MIN_MATCH] == input[i..i + MIN_MATCH] {
                let max = (n - i).min(MAX_MATCH);
                let mut len = MIN_MATCH;
                // Eight bytes at a time: queued jobs differ in a few bytes each, so
                // matches run long and this loop is most of the compressor's time.
                while len + 8 <= max {
                    let word = |at: usize| {
                        u64::from_le_bytes(input[at..at + 8].try_into().expect("8 bytes"))
                    };
                    let diff = word(r + len) ^ word(i + len);
                    if diff != 0 {
                        len += (diff.trailing_zeros() / 8) as usize;
                        break;
                    }
                    len += 8;
                }
                while len < max && input[r + len] == input[i + len] {
                    len += 1;
                }
                push_literals(&mut out, &input[lit_start..i]);
                push_ref(&mut out, dist, len);
                if out.len() >= limit {
                    return None;
                }
                // Remember only the match's last two positions (LZF's fast mode): hashing
                // every position inside long matches made compression several times slower.
                let end = i + len;
                for j in end.saturating_sub(2).max(i + 1)..end.min(n + 1 - MIN_MATCH) {
                    table[slot(j)] = (j + 1) as u32;
                }
                i = end;
                lit_start = i;
                continue;
            }
        }
        i += 1;
        if out.len() + literal_cost(i - lit_start) >= limit {
            return None;
        }
    }
    push_literals(&mut out, &input[lit_start..]);
    if out.len() >= limit {
        return None;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Always encodes (no size limit), so incompressible inputs round-trip too.
    fn encode_all(input: &[u8]) -> Vec<u8> {
        encode(input, usize::MAX).unwrap()
    }

    fn random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect()
    }

    fn repetitive(n: usize) -> Vec<u8> {
        let phrase = b"the quick brown fox jumps over the lazy dog; ";
        (0..n).map(|i| phrase[i % phrase.len()]).collect()
    }

    #[test]
    fn hand_built_streams() {
        // Literal "abc", then copy 6 bytes from 3 back: len field 4 -> 0x80, offset 2.
        let s = [0x02, b'a', b'b', b'c', 0x80, 0x02];
        assert_eq!(decompress(&s, 9).unwrap(), b"abcabcabc");
        // Long form: literal "xy", copy 20 from 2 back: 111 00000, 20-2-7 = 11, offset 1.
        let s = [0x01, b'x', b'y', 0xE0, 11, 0x01];
        let want: Vec<u8> = b"xy".iter().cycle().take(22).copied().collect();
        assert_eq!(decompress(&s, 22).unwrap(), want);
        // The longest copy: 264 bytes of one repeated byte.
        let s = [0x00, b'z', 0xE0, 0xFF, 0x00];
        assert_eq!(decompress(&s, 265).unwrap(), vec![b'z'; 265]);
        // A far reference (distance 8192) with a 13-bit offset 0x1FFF.
        let mut data = random_bytes(8192, 7);
        let mut s = Vec::new();
        push_literals(&mut s, &data);
        s.extend_from_slice(&[0x3F, 0xFF]); // len 1+2 = 3, offset 0x1FFF
        data.extend_from_within(0..3);
        assert_eq!(decompress(&s, data.len()).unwrap(), data);
        // Empty.
        assert_eq!(decompress(&[], 0).unwrap(), b"");
    }

    #[test]
    fn rejects_malformed() {
        // Wrong expected length, either way.
        let s = [0x02, b'a', b'b', b'c', 0x80, 0x02];
        assert!(decompress(&s, 8).is_err());
        assert!(decompress(&s, 10).is_err());
        // Reference before the start.
        assert!(decompress(&[0x00, b'a', 0x20, 0x01], 4).is_err());
        assert!(decompress(&[0x20, 0x00], 3).is_err());
        // Truncated items.
        assert!(decompress(&[0x05, b'a'], 6).is_err());
        assert!(decompress(&[0x00, b'a', 0xE0], 12).is_err());
        assert!(decompress(&[0x00, b'a', 0xE0, 0x01], 12).is_err());
        // Impossible expansion claims are refused before allocating.
        assert!(decompress(&[0x00, b'a'], usize::MAX).is_err());
        assert!(decompress(&[], 1).is_err());
        // Every prefix of a valid stream fails.
        let data = repetitive(1000);
        let c = compress(&data).unwrap();
        for n in 0..c.len() {
            assert!(decompress(&c[..n], data.len()).is_err(), "prefix {n}");
        }
    }

    #[test]
    fn round_trips() {
        for &n in &[0usize, 1, 2, 3, 4, 5, 31, 32, 33, 100, 1000, 8193, 70_000] {
            for data in [random_bytes(n, n as u64 + 1), repetitive(n), vec![0u8; n]] {
                let c = encode_all(&data);
                assert_eq!(decompress(&c, data.len()).unwrap(), data, "size {n}");
                match compress(&data) {
                    Some(c) => {
                        assert!(c.len() < data.len() - 4);
                        assert_eq!(decompress(&c, data.len()).unwrap(), data);
                    }
                    None => assert!(n < 5 || c.len() >= n - 4),
                }
            }
        }
    }

    #[test]
    fn compresses_well_enough() {
        assert!(compress(&random_bytes(70_000, 3)).is_none());
        assert!(compress(b"abcd").is_none());
        assert!(compress(b"").is_none());
        let c = compress(&repetitive(70_000)).unwrap();
        assert!(c.len() < 70_000 / 50, "{} bytes", c.len());
        let c = compress(&vec![b'a'; 70_000]).unwrap();
        assert!(c.len() < 70_000 / 80, "{} bytes", c.len());
        // Typical RDB-ish content: repeated field names with varying numbers.
        let text: Vec<u8> = (0..2000)
            .flat_map(|i| format!("user:{i}:name=alice{};", i % 7).into_bytes())
            .collect();
        let c = compress(&text).unwrap();
        assert!(c.len() < text.len() / 2, "{} of {}", c.len(), text.len());
        assert_eq!(decompress(&c, text.len()).unwrap(), text);
    }

    #[test]
    fn mutations_never_panic() {
        let data = repetitive(3000);
        let c = compress(&data).unwrap();
        let mut seed: u64 = 0x1234_5678_9ABC_DEF1;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut m = c.clone();
            let i = seed as usize % m.len();
            m[i] = (seed >> 32) as u8;
            let want = if seed & 1 == 0 {
                data.len()
            } else {
                (seed >> 40) as usize % 10_000
            };
            let _ = decompress(&m, want);
        }
    }
}
