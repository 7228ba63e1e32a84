//! A key's bytes as the key table stores them: short keys inside the table's entry itself,
//! longer ones on the heap.
//!
//! Why: finding a key compares its bytes, and with the bytes in an allocation of their
//! own that comparison was one more cache miss after the entry's, on every lookup (perf put
//! `memcmp` at 1.9–3.0% of SET's samples at depth 16, on one thread and on two). Queue keys are short (`queue:default`,
//! `bull:emails:42`), so up to `INLINE` bytes live in the entry's own line and cost neither
//! a miss nor an allocation. The type is 20 bytes so that an `Entry` stays 64 (checked in
//! `table.rs`): one or two cache lines, as before.

use std::fmt;
use std::ops::Deref;

/// The longest key kept inline; one more byte holds its length.
pub const INLINE: usize = 19;
/// The last byte of an out-of-line key: the first eight bytes are then the heap pointer
/// and the next eight the length.
const ON_HEAP: u8 = u8::MAX;

// The long form keeps a pointer and a length in eight bytes each.
const _: () = assert!(usize::BITS == 64);

/// The first place of `byte` in `key`, eight bytes a step: key names are searched on hot
/// paths (a hashtag's `{` on every keyed command over several threads, Kombu's separator
/// on every push). A zero byte of `word ^ pattern` marks a match; a borrow can flag a
/// byte only above a true zero, so the lowest flagged byte (the first, little-endian)
/// is always one.
#[inline]
pub fn find_byte(key: &[u8], byte: u8) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let pattern = ONES * byte as u64;
    let mut chunks = key.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes")) ^ pattern;
        let flagged = word.wrapping_sub(ONES) & !word & HIGHS;
        if flagged != 0 {
            return Some(at + flagged.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == byte)
        .map(|i| at + i)
}

/// Owned key bytes (see the module comment). Byte 19 is the length of an inline key, or
/// `ON_HEAP`.
pub struct Key([u8; INLINE + 1]);

// SAFETY: a `Key` owns its heap bytes exclusively, as a `Box<[u8]>` would; nothing is
// shared between two keys.
unsafe impl Send for Key {}
unsafe impl Sync for Key {}

impl Key {
    fn heap_parts(&self) -> (*mut u8, usize) {
        let addr = usize::from_ne_bytes(self.0[..8].try_into().expect("8 bytes"));
        let len = u64::from_ne_bytes(self.0[8..16].try_into().expect("8 bytes")) as usize;
        (std::ptr::with_exposed_provenance_mut(addr), len)
    }

    fn from_box(bytes: Box<[u8]>) -> Key {
        let len = bytes.len();
        let addr = Box::into_raw(bytes).cast::<u8>().expose_provenance();
        let mut raw = [0u8; INLINE + 1];
        raw[..8].copy_from_slice(&addr.to_ne_bytes());
        raw[8..16].copy_from_slice(&(len as u64).to_ne_bytes());
        raw[INLINE] = ON_HEAP;
        Key(raw)
    }

    /// Zero past the bytes: `matches` compares all 20.
    fn inline(bytes: &[u8]) -> Key {
        debug_assert!(bytes.len() <= INLINE);
        let mut raw = [0u8; INLINE + 1];
        raw[..bytes.len()].copy_from_slice(bytes);
        raw[INLINE] = bytes.len() as u8;
        Key(raw)
    }

    /// Whether the bytes live in the entry (for tests and memory accounting).
    pub fn is_inline(&self) -> bool {
        self.0[INLINE] != ON_HEAP
    }

    /// Heap bytes the key holds beyond its entry.
    pub fn heap_size(&self) -> usize {
        if self.is_inline() {
            0
        } else {
            self.len()
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        let tag = self.0[INLINE];
        if tag != ON_HEAP {
            &self.0[..tag as usize]
        } else {
            let (ptr, len) = self.heap_parts();
            // SAFETY: `ptr` and `len` came from a `Box<[u8]>` this key owns (`from_box`),
            // freed only by `drop`.
            unsafe { std::slice::from_raw_parts(ptr, len) }
        }
    }

    /// The bytes as a box of their own, reusing the allocation of a long key.
    pub fn into_boxed(self) -> Box<[u8]> {
        if self.is_inline() {
            return self.as_bytes().into();
        }
        let (ptr, len) = self.heap_parts();
        std::mem::forget(self);
        // SAFETY: as in `as_bytes`; `forget` hands the allocation over to the box.
        unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) }
    }
}

/// A key being looked up, made once per lookup so that comparing it with each candidate
/// entry reads only that entry's 20 key bytes. `memcmp` on two short slices reads 32 bytes
/// from each, which for a key inside an entry runs into the next entry's line: a miss of
/// its own (perf put `memcmp` at 7% of SET's samples at depth 16 that way).
pub struct KeyProbe<'a> {
    raw: [u8; INLINE + 1],
    bytes: &'a [u8],
}

impl<'a> KeyProbe<'a> {
    pub fn new(bytes: &'a [u8]) -> KeyProbe<'a> {
        let raw = if bytes.len() <= INLINE {
            Key::inline(bytes).0
        } else {
            [0; INLINE + 1]
        };
        KeyProbe { raw, bytes }
    }
}

impl Key {
    /// Whether this key is the probe's. Short keys are always inline and long ones never
    /// are, so a short probe equals only an inline key with the same 20 bytes (length and
    /// zero padding included).
    #[inline]
    pub fn matches(&self, probe: &KeyProbe<'_>) -> bool {
        if probe.bytes.len() <= INLINE {
            self.0 == probe.raw
        } else {
            !self.is_inline() && self.as_bytes() == probe.bytes
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.is_inline() {
            let (ptr, len) = self.heap_parts();
            // SAFETY: as in `as_bytes`; the key is going away, so nothing reads it after.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
        }
    }
}

impl Deref for Key {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl From<&[u8]> for Key {
    fn from(bytes: &[u8]) -> Key {
        if bytes.len() <= INLINE {
            Key::inline(bytes)
        } else {
            Key::from_box(bytes.into())
        }
    }
}

impl From<Box<[u8]>> for Key {
    fn from(bytes: Box<[u8]>) -> Key {
        if bytes.len() <= INLINE {
            Key::inline(&bytes)
        } else {
            Key::from_box(bytes)
        }
    }
}

impl Clone for Key {
    fn clone(&self) -> Key {
        Key::from(self.as_bytes())
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_bytes(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_byte_finds_the_first() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let len = (rng % 40) as usize;
            let hay: Vec<u8> = (0..len)
                .map(|i| [0x06, 0x05, 0x07, 0x86, 0x00, b'a'][((rng >> (i % 60)) % 6) as usize])
                .collect();
            for b in [0x06, 0x00, 0x86, b'a'] {
                assert_eq!(
                    find_byte(&hay, b),
                    hay.iter().position(|&x| x == b),
                    "{hay:?} {b}"
                );
            }
        }
    }

    #[test]
    fn every_length_round_trips_inline_or_not() {
        for len in 0..64usize {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let k = Key::from(&bytes[..]);
            assert_eq!(&*k, &bytes[..], "len {len}");
            assert_eq!(k.is_inline(), len <= INLINE, "len {len}");
            assert_eq!(k.heap_size(), if len <= INLINE { 0 } else { len });
            let c = k.clone();
            assert_eq!(c, k);
            assert_eq!(&*Key::from(Box::<[u8]>::from(&bytes[..])), &bytes[..]);
            assert_eq!(&*k.into_boxed(), &bytes[..]);
            assert_eq!(&*c, &bytes[..]);
        }
    }

    #[test]
    fn a_probe_matches_only_its_own_key() {
        let keys: Vec<Vec<u8>> = (0..45usize)
            .flat_map(|len| {
                let base: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                let mut other = base.clone();
                if let Some(last) = other.last_mut() {
                    *last ^= 1;
                }
                let mut zero = base.clone();
                zero.push(0);
                [base, other, zero]
            })
            .collect();
        for a in &keys {
            let k = Key::from(&a[..]);
            for b in &keys {
                assert_eq!(k.matches(&KeyProbe::new(b)), a == b, "{a:?} against {b:?}");
            }
        }
    }

    #[test]
    fn a_long_box_is_kept_not_copied() {
        let b: Box<[u8]> = vec![9u8; 100].into();
        let at = b.as_ptr();
        let k = Key::from(b);
        assert_eq!(k.as_ptr(), at);
        let back = k.into_boxed();
        assert_eq!(back.as_ptr(), at);
    }

    #[test]
    fn a_key_is_twenty_bytes() {
        assert_eq!(std::mem::size_of::<Key>(), 20);
    }
}
