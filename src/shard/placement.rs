//! Which shard owns a key: the Redis Cluster slot of the key (or of its `{hashtag}`), then
//! the slot's owner. Hashtags that start with the round-robin prefix are instead given
//! shards in round-robin order of first use, so N queues on N threads land on N shards.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use hashbrown::HashMap;

pub const SLOTS: usize = 16384;

/// The part of a key that is hashed: the text between the first `{` and the next `}`
/// when that is non-empty, else the whole key (Redis Cluster's rule).
pub fn hashtag(key: &[u8]) -> &[u8] {
    if let Some(open) = find_open_brace(key) {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The first `{` in `key`: every keyed command on more than one thread looks for one,
/// and most keys have none.
#[inline]
fn find_open_brace(key: &[u8]) -> Option<usize> {
    crate::types::key::find_byte(key, b'{')
}

/// The Redis Cluster slot of a key.
pub fn slot(key: &[u8]) -> usize {
    slot_of_tag(hashtag(key))
}

/// CRC-16/XMODEM, the checksum Redis Cluster hashes keys with. The `crc` crate's table
/// is built at compile time and read sixteen bytes at a step; the `crc16` crate used
/// before went byte by byte and recomputed its initial value
/// with a 16-step loop on every call, on every keyed command.
const CRC16: crc::Crc<u16, crc::Table<16>> =
    crc::Crc::<u16, crc::Table<16>>::new(&crc::CRC_16_XMODEM);

/// Most keys are shorter than the crate's sixteen-byte step, and for them its general
/// loop cost about 150 instructions for an 11-byte key (callgrind). They are read four
/// bytes at a step instead, through four 256-entry tables: the four reads of a step are
/// independent, where a byte at a time each waited on the one before (on two threads,
/// every keyed command hashes its key at least once to find its shard, and that chain was
/// 3% of the server's samples at depth 16).
const SHORT_KEY: usize = 32;

/// `CRC16_TABLES[k][v]`: the checksum's remainder of byte `v` followed by `k` zero bytes,
/// that is `v · x^(16 + 8k) mod P`. Row 0 is the classic byte-at-a-time table; each
/// further row is the one before pushed through one more zero byte.
const CRC16_TABLES: [[u16; 256]; 4] = {
    let mut tables = [[0u16; 256]; 4];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 0x8000 != 0 {
                (c << 1) ^ 0x1021
            } else {
                c << 1
            };
            bit += 1;
        }
        tables[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 4 {
        let mut i = 0;
        while i < 256 {
            let prev = tables[k - 1][i];
            tables[k][i] = (prev << 8) ^ tables[0][(prev >> 8) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
};

fn crc16(data: &[u8]) -> u16 {
    if data.len() >= SHORT_KEY {
        return CRC16.checksum(data);
    }
    let t = &CRC16_TABLES;
    let mut crc = 0u16;
    let mut steps = data.chunks_exact(4);
    for b in steps.by_ref() {
        // The running checksum folds into the step's first two bytes; the four
        // remainders then add up (XOR) to the checksum after the four bytes.
        let hi = (crc >> 8) as u8 ^ b[0];
        let lo = crc as u8 ^ b[1];
        crc = t[3][hi as usize] ^ t[2][lo as usize] ^ t[1][b[2] as usize] ^ t[0][b[3] as usize];
    }
    for &b in steps.remainder() {
        crc = (crc << 8) ^ t[0][((crc >> 8) as u8 ^ b) as usize];
    }
    crc
}

fn slot_of_tag(tag: &[u8]) -> usize {
    crc16(tag) as usize % SLOTS
}

pub struct Placement {
    nshards: usize,
    /// `slot % nshards` by a multiply instead of a division (Lemire's "fastmod"): the
    /// table of 16 384 owners it replaces was read at a random line per key, and on two
    /// threads that load was a third of the placement's samples.
    slot_mod: u64,
    rr_prefix: Option<Vec<u8>>,
    /// Assignments of round-robin hashtags. It is consulted only on a thread's first
    /// sight of such a tag (each thread caches what it learned), so it is not on the
    /// data path; a mutex keeps the first-use order global.
    rr_assigned: Mutex<HashMap<Vec<u8>, usize>>,
    rr_next: AtomicUsize,
    /// Prefixes of `<prefix>:<queue>:...` keys: the placement tag is `<prefix>:<queue>`.
    queue_prefixes: Vec<Vec<u8>>,
}

thread_local! {
    static RR_CACHE: RefCell<HashMap<Vec<u8>, usize>> = RefCell::new(HashMap::new());
}

impl Placement {
    pub fn new(nshards: usize, rr_prefix: Option<Vec<u8>>) -> Placement {
        Placement {
            nshards,
            slot_mod: (u64::MAX / nshards as u64).wrapping_add(1),
            rr_prefix: rr_prefix.filter(|p| !p.is_empty()),
            rr_assigned: Mutex::new(HashMap::new()),
            rr_next: AtomicUsize::new(0),
            queue_prefixes: Vec::new(),
        }
    }

    /// The shard that owns `slot`: `slot % nshards`, exact for every slot and shard count
    /// below 2^32.
    #[inline]
    fn owner(&self, slot: usize) -> usize {
        let low = self.slot_mod.wrapping_mul(slot as u64);
        ((low as u128 * self.nshards as u128) >> 64) as usize
    }

    pub fn with_queue_prefixes(mut self, prefixes: Vec<Vec<u8>>) -> Placement {
        self.queue_prefixes = prefixes;
        self
    }

    /// What decides a key's shard, and its lock tag for scripts: the hashtag when there
    /// is one, `<prefix>:<queue>` for a queue key (`bull:emails:42` -> `bull:emails`),
    /// else the whole key.
    #[inline]
    pub fn tag<'a>(&self, key: &'a [u8]) -> &'a [u8] {
        let tag = hashtag(key);
        if tag.len() < key.len() {
            return tag;
        }
        for p in &self.queue_prefixes {
            // The first byte rules out most keys without a call to memcmp.
            if key.len() > p.len() + 1
                && p.first() == key.first()
                && key.starts_with(p)
                && key[p.len()] == b':'
            {
                let rest = &key[p.len() + 1..];
                if let Some(i) = rest.iter().position(|&b| b == b':') {
                    return &key[..p.len() + 1 + i];
                }
            }
        }
        key
    }

    pub fn nshards(&self) -> usize {
        self.nshards
    }

    /// The `queue-key-prefixes` (`bull`, `bq`...).
    pub fn queue_prefixes(&self) -> &[Vec<u8>] {
        &self.queue_prefixes
    }

    /// The shard `key` belongs to. One thread's answer costs a compare, not a call.
    #[inline(always)]
    pub fn shard_of(&self, key: &[u8]) -> usize {
        if self.nshards == 1 {
            return 0;
        }
        self.shard_of_placed(key)
    }

    fn shard_of_placed(&self, key: &[u8]) -> usize {
        let tag = self.tag(key);
        if let Some(prefix) = &self.rr_prefix {
            if tag.len() < key.len() && tag.starts_with(prefix) {
                return self.round_robin(tag);
            }
        }
        self.owner(slot_of_tag(tag))
    }

    /// `shard_of` for a hint (the prefetch of a pipelined group): the same answer where
    /// the key's shard is already settled, and `None` for a round-robin tag this thread
    /// has not placed yet. Looking must not place it: `shard_of` hands such tags shards in
    /// first-use order, so an argument merely looked at (a channel, a name) would shift
    /// every queue placed after it, and would take the assignment lock.
    #[inline]
    pub fn shard_if_placed(&self, key: &[u8]) -> Option<usize> {
        if self.nshards == 1 {
            return Some(0);
        }
        let tag = self.tag(key);
        if let Some(prefix) = &self.rr_prefix {
            if tag.len() < key.len() && tag.starts_with(prefix) {
                return RR_CACHE.with(|c| c.borrow().get(tag).copied());
            }
        }
        Some(self.owner(slot_of_tag(tag)))
    }

    fn round_robin(&self, tag: &[u8]) -> usize {
        if let Some(s) = RR_CACHE.with(|c| c.borrow().get(tag).copied()) {
            return s;
        }
        let shard = {
            let mut assigned = self.rr_assigned.lock().unwrap_or_else(|p| p.into_inner());
            *assigned
                .entry(tag.to_vec())
                .or_insert_with(|| self.rr_next.fetch_add(1, Ordering::Relaxed) % self.nshards)
        };
        RR_CACHE.with(|c| c.borrow_mut().insert(tag.to_vec(), shard));
        shard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashtags_follow_cluster_rules() {
        assert_eq!(hashtag(b"{user1000}.following"), b"user1000");
        assert_eq!(hashtag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hashtag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hashtag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot(b"{a}x"), slot(b"{a}y"));
    }

    #[test]
    fn the_first_brace_is_found_wherever_it_is() {
        for len in 0..40 {
            for at in 0..=len {
                let mut key = vec![b'a'; len];
                // Bytes that differ from `{` by one bit, or lie next to it, around it.
                for (i, b) in key.iter_mut().enumerate() {
                    *b = [b'z', b'{' ^ 1, b'|', b'{' ^ 0x80, 0][i % 5];
                }
                if at < len {
                    key[at] = b'{';
                    if at + 3 < len {
                        key[at + 3] = b'{';
                    }
                }
                let want = key.iter().position(|&b| b == b'{');
                assert_eq!(find_open_brace(&key), want, "length {len}, brace at {at}");
            }
        }
    }

    #[test]
    fn a_slot_belongs_to_its_remainder() {
        for n in 1..=70 {
            let p = Placement::new(n, None);
            for slot in 0..SLOTS {
                assert_eq!(p.owner(slot), slot % n, "slot {slot} of {n} shards");
            }
        }
    }

    #[test]
    fn short_and_long_keys_hash_alike() {
        let mut x = 0x2545f4914f6cdd1du64;
        for len in 0..80 {
            let key: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert_eq!(crc16(&key), CRC16.checksum(&key), "length {len}");
        }
    }

    #[test]
    fn queue_keys_share_their_queue_tag() {
        let p = Placement::new(4, None).with_queue_prefixes(vec![b"bull".to_vec()]);
        assert_eq!(p.tag(b"bull:emails:42"), b"bull:emails");
        assert_eq!(p.tag(b"bull:emails:"), b"bull:emails");
        assert_eq!(p.tag(b"bull:emails"), b"bull:emails");
        assert_eq!(p.tag(b"{bull}:emails:wait"), b"bull");
        assert_eq!(p.tag(b"other:emails:wait"), b"other:emails:wait");
        let shard = p.shard_of(b"bull:emails:wait");
        for k in [
            "bull:emails:42",
            "bull:emails:active",
            "bull:emails:",
            "bull:emails:42:logs",
        ] {
            assert_eq!(p.shard_of(k.as_bytes()), shard, "{k}");
        }
    }

    #[test]
    fn round_robin_prefix_spreads_queues_in_first_use_order() {
        let p = Placement::new(4, Some(b"q".to_vec()));
        let shards: Vec<usize> = (0..8)
            .map(|i| p.shard_of(format!("queue:{{q{i}}}").as_bytes()))
            .collect();
        assert_eq!(shards, vec![0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(p.shard_of(b"other:{q2}"), 2);
    }

    /// Looking a key up for a hint places nothing: the queues placed afterwards get the
    /// shards they would have had.
    #[test]
    fn a_hint_lookup_places_no_round_robin_tag() {
        let p = Placement::new(4, Some(b"q".to_vec()));
        assert_eq!(p.shard_if_placed(b"queue:{qa}"), None);
        assert_eq!(p.shard_if_placed(b"chan:{qb}"), None);
        assert_eq!(p.shard_of(b"queue:{qc}"), 0);
        assert_eq!(p.shard_of(b"queue:{qd}"), 1);
        assert_eq!(p.shard_if_placed(b"other:{qc}"), Some(0));
        assert_eq!(p.shard_if_placed(b"plain"), Some(p.shard_of(b"plain")));
    }
}
