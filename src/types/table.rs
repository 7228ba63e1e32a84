//! The key table of one database on one shard.
//!
//! Keys are spread over 2^k segments by bits of their hash; each segment is a small
//! open-addressing table. The segment index plays the role of Redis's bucket index, so
//! SCAN can use the same reverse-binary cursor and keep its guarantee: a key present for
//! the whole scan is returned at least once, however the table grows or shrinks between
//! calls. Segments also count their keys with a TTL so active expiry can skip the rest.

use std::hash::BuildHasher;

use hashbrown::hash_table::HashTable;

use super::key::{Key, KeyProbe};
use super::list::List;
use super::value::Value;

pub struct Entry {
    /// Inline when short (`types::key`), so that comparing it costs no miss of its own.
    pub key: Key,
    pub value: Value,
    /// Absolute expiry in unix milliseconds, 0 for none. Changed only through the table,
    /// which keeps the per-segment counts of volatile keys.
    expire_at: u64,
    /// Unix seconds of the last access (OBJECT IDLETIME).
    pub lru: u32,
}

// An entry fills at most two cache lines, as its bucket's prefetch assumes.
const _: () = assert!(std::mem::size_of::<Entry>() == 64);

impl Entry {
    pub fn expire_at(&self) -> u64 {
        self.expire_at
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expire_at != 0 && self.expire_at <= now_ms
    }
}

/// Keeps a segment's and the table's counts of keys with a TTL right when a key's expiry
/// goes from `was` to `now` (0: none).
fn recount_volatile(segment: &mut u32, table: &mut usize, was: u64, now: u64) {
    match (was != 0, now != 0) {
        (false, true) => {
            *segment += 1;
            *table += 1;
        }
        (true, false) => {
            *segment -= 1;
            *table -= 1;
        }
        _ => {}
    }
}

/// What one step of active expiry did.
#[derive(Default)]
pub struct ExpireStep {
    /// Where the next step starts; 0 when the walk is complete.
    pub next: u64,
    /// Keys with a TTL looked at.
    pub checked: usize,
    /// Remaining milliseconds summed over the keys with a TTL it saw alive, and how many:
    /// the samples INFO's `avg_ttl` estimate is made of.
    pub live_ttl_sum: u64,
    pub live_sampled: u64,
}

/// What `Table::insert` replaced.
pub struct Replaced {
    pub value: Value,
    pub expire_at: u64,
    pub lru: u32,
}

/// A key looked up for writing.
pub enum Probe<'a> {
    Live(&'a mut Entry),
    /// There, but past its expiry: the caller decides whether it goes.
    Expired,
    Missing,
}

struct Segment {
    entries: HashTable<Entry>,
    volatile: u32,
}

impl Segment {
    fn new() -> Segment {
        Segment {
            entries: HashTable::new(),
            volatile: 0,
        }
    }
}

/// Average keys per segment before the table doubles its segment count.
const GROW_AT: usize = 16;
/// Average keys per segment under which it halves.
const SHRINK_AT: usize = 2;
/// Segment index bits are taken from the high half so they do not correlate with the
/// bits each segment's own table uses.
const SEG_SHIFT: u32 = 32;

pub struct Table {
    segments: Vec<Segment>,
    len: usize,
    volatile: usize,
    hasher: hashbrown::DefaultHashBuilder,
    /// A snapshot being written: segments it has not written yet are written before
    /// anything in them changes, so it holds the table as it was when it began.
    snapshot: Option<Box<Snapshot>>,
}

/// Receives a snapshot's segments, each as it was when the snapshot began.
pub trait SegmentSink {
    fn save(&mut self, entries: &mut dyn Iterator<Item = &Entry>);
}

struct Snapshot {
    sink: Box<dyn SegmentSink>,
    /// Segments still to write; the segment count does not change while a snapshot runs.
    pending: Vec<bool>,
    remaining: usize,
    /// Where the background walk goes next.
    next: usize,
}

impl Default for Table {
    fn default() -> Self {
        Table::new()
    }
}

impl Table {
    pub fn new() -> Table {
        Table {
            segments: vec![Segment::new()],
            len: 0,
            volatile: 0,
            hasher: hashbrown::DefaultHashBuilder::default(),
            snapshot: None,
        }
    }

    /// Starts a snapshot of the table as it is now; `sink` gets every entry, segment by
    /// segment, from `snapshot_step` or before a write would change a segment.
    pub fn begin_snapshot(&mut self, sink: Box<dyn SegmentSink>) {
        let n = self.segments.len();
        self.snapshot = Some(Box::new(Snapshot {
            sink,
            pending: vec![true; n],
            remaining: n,
            next: 0,
        }));
    }

    pub fn snapshot_running(&self) -> bool {
        self.snapshot.is_some()
    }

    /// Writes up to `max_segments` pending segments. When none is left, the snapshot ends
    /// and its sink is handed back.
    pub fn snapshot_step(&mut self, max_segments: usize) -> Option<Box<dyn SegmentSink>> {
        let snap = self.snapshot.as_mut()?;
        let mut budget = max_segments;
        while snap.remaining > 0 && budget > 0 {
            let i = snap.next;
            snap.next += 1;
            if snap.pending[i] {
                snap.pending[i] = false;
                snap.remaining -= 1;
                snap.sink.save(&mut self.segments[i].entries.iter());
                budget -= 1;
            }
        }
        if snap.remaining > 0 {
            return None;
        }
        let done = self.snapshot.take().expect("running snapshot");
        // Resizes were held back while the snapshot ran.
        self.maybe_resize();
        Some(done.sink)
    }

    /// Writes segment `i` to the running snapshot, if it has not been yet, before it changes.
    #[inline]
    fn before_write(&mut self, i: usize) {
        if let Some(snap) = &mut self.snapshot {
            if snap.pending[i] {
                snap.pending[i] = false;
                snap.remaining -= 1;
                snap.sink.save(&mut self.segments[i].entries.iter());
            }
        }
    }

    fn maybe_resize(&mut self) {
        let mut n = self.segments.len();
        while self.len > n * GROW_AT {
            n *= 2;
        }
        while n > 1 && self.len < n * SHRINK_AT {
            n /= 2;
        }
        if n != self.segments.len() {
            self.resize(n);
        }
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn volatile_len(&self) -> usize {
        self.volatile
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn seg_index(&self, hash: u64) -> usize {
        ((hash >> SEG_SHIFT) as usize) & (self.segments.len() - 1)
    }

    /// Starts bringing the buckets of `keys`, then their keys' and values' bytes, into the
    /// cache, without waiting for them: for a pipelined group, whose keys' misses then overlap
    /// instead of coming one after another as each command runs. Sixteen keys at a time,
    /// in steps, so that no key's misses wait on another's: the first hashes each key and
    /// prefetches its segment's header; the second reads each key's probe group (misses
    /// that overlap, the loads being independent) and prefetches its first candidate
    /// bucket without reading it; the third, when those have had time to arrive, reads
    /// each bucket's key and value pointers and prefetches what they point to; lists take
    /// three more steps down to the bytes at their ends.
    pub fn prefetch_many<'k>(&self, mut keys: impl Iterator<Item = &'k [u8]>) {
        let mut found: [Option<&Entry>; PREFETCH_ROUND] = [None; PREFETCH_ROUND];
        let mut hashes = [0u64; PREFETCH_ROUND];
        loop {
            let mut n = 0;
            let mut seen = 0;
            // The segments' headers first: reading a probe group waits on its header.
            for key in keys.by_ref().take(PREFETCH_ROUND) {
                let h = self.hash(key);
                hashes[seen] = h;
                seen += 1;
                prefetch_read((&self.segments[self.seg_index(h)] as *const Segment).cast());
            }
            for &h in &hashes[..seen] {
                if let Some(e) = self.segments[self.seg_index(h)].entries.iter_hash(h).next() {
                    let at = (e as *const Entry).cast::<u8>();
                    // A bucket is 64 bytes at a 16-byte alignment: it may span two lines.
                    prefetch_read(at);
                    prefetch_read(at.wrapping_add(std::mem::size_of::<Entry>() - 1));
                    found[n] = Some(e);
                    n += 1;
                }
            }
            // A long key's bytes (a short one is in the entry) and what the command reads
            // first in its value. A list's ends are three pointers further (slots,
            // chunks, bytes), each a step of its own over all the lists, so that their
            // misses overlap too: pushes and pops are what queues do. An entry may be
            // another key's with the same tag: what it points to is loaded for nothing,
            // never misread.
            let mut lists: [Option<&List>; PREFETCH_ROUND] = [None; PREFETCH_ROUND];
            let mut n_lists = 0;
            for entry in found[..n].iter().flatten() {
                if !entry.key.is_inline() {
                    prefetch_read(entry.key.as_ptr());
                }
                if let Some(p) = entry.value.payload_ptr() {
                    prefetch_read(p);
                }
                if let Value::List(list) = &entry.value {
                    lists[n_lists] = Some(&**list);
                    n_lists += 1;
                }
            }
            let lists = &lists[..n_lists];
            for list in lists.iter().flatten() {
                list.end_slots().into_iter().for_each(prefetch_read);
            }
            for list in lists.iter().flatten() {
                list.end_chunks().into_iter().for_each(prefetch_read);
            }
            for list in lists.iter().flatten() {
                list.end_bytes().into_iter().for_each(prefetch_read);
            }
            if seen < PREFETCH_ROUND {
                return;
            }
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&Entry> {
        let h = self.hash(key);
        let probe = KeyProbe::new(key);
        self.segments[self.seg_index(h)]
            .entries
            .find(h, |e| e.key.matches(&probe))
    }

    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let h = self.hash(key);
        let probe = KeyProbe::new(key);
        let i = self.seg_index(h);
        self.before_write(i);
        self.segments[i]
            .entries
            .find_mut(h, |e| e.key.matches(&probe))
    }

    /// The entry of `key` for writing, told apart from an expired one, in one probe:
    /// every keyed command starts here, so a live key is found and handed back without
    /// hashing it a second time.
    pub fn get_live_mut(&mut self, key: &[u8], now_ms: u64) -> Probe<'_> {
        let h = self.hash(key);
        let probe = KeyProbe::new(key);
        let i = self.seg_index(h);
        self.before_write(i);
        match self.segments[i]
            .entries
            .find_mut(h, |e| e.key.matches(&probe))
        {
            None => Probe::Missing,
            Some(e) if e.is_expired(now_ms) => Probe::Expired,
            Some(e) => Probe::Live(e),
        }
    }

    /// Sets `key` to `value` with its expiry (0: none), in one probe. A key already there
    /// keeps its allocation and gets the new value in place; what it held comes back.
    pub fn insert(
        &mut self,
        key: &[u8],
        value: Value,
        expire_at: u64,
        lru: u32,
    ) -> Option<Replaced> {
        let h = self.hash(key);
        let probe = KeyProbe::new(key);
        let i = self.seg_index(h);
        self.before_write(i);
        let seg = &mut self.segments[i];
        let Some(e) = seg.entries.find_mut(h, |e| e.key.matches(&probe)) else {
            self.insert_hashed(h, i, key.into(), value, expire_at, lru);
            return None;
        };
        recount_volatile(
            &mut seg.volatile,
            &mut self.volatile,
            e.expire_at,
            expire_at,
        );
        let replaced = Replaced {
            value: std::mem::replace(&mut e.value, value),
            expire_at: std::mem::replace(&mut e.expire_at, expire_at),
            lru: std::mem::replace(&mut e.lru, lru),
        };
        Some(replaced)
    }

    /// Inserts a key known to be absent.
    pub fn insert_new(&mut self, key: Box<[u8]>, value: Value, expire_at: u64, lru: u32) {
        let h = self.hash(&key);
        let i = self.seg_index(h);
        self.before_write(i);
        self.insert_hashed(h, i, key.into(), value, expire_at, lru);
    }

    /// `insert_new` once the key's hash and segment are known and the segment is saved.
    fn insert_hashed(
        &mut self,
        h: u64,
        i: usize,
        key: Key,
        value: Value,
        expire_at: u64,
        lru: u32,
    ) {
        let hasher = &self.hasher;
        let seg = &mut self.segments[i];
        recount_volatile(&mut seg.volatile, &mut self.volatile, 0, expire_at);
        seg.entries.insert_unique(
            h,
            Entry {
                key,
                value,
                expire_at,
                lru,
            },
            |e| hasher.hash_one(&*e.key),
        );
        self.len += 1;
        if self.len > self.segments.len() * GROW_AT && self.snapshot.is_none() {
            self.resize(self.segments.len() * 2);
        }
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let h = self.hash(key);
        let probe = KeyProbe::new(key);
        let i = self.seg_index(h);
        self.before_write(i);
        let seg = &mut self.segments[i];
        let entry = match seg.entries.find_entry(h, |e| e.key.matches(&probe)) {
            Ok(occupied) => occupied.remove().0,
            Err(_) => return None,
        };
        recount_volatile(&mut seg.volatile, &mut self.volatile, entry.expire_at, 0);
        self.len -= 1;
        if self.segments.len() > 1
            && self.len < self.segments.len() * SHRINK_AT
            && self.snapshot.is_none()
        {
            self.resize(self.segments.len() / 2);
        }
        Some(entry)
    }

    /// Sets or clears (0) the expiry of an existing key; false when the key is absent.
    pub fn set_expire(&mut self, key: &[u8], expire_at: u64) -> bool {
        let h = self.hash(key);
        let probe = KeyProbe::new(key);
        let i = self.seg_index(h);
        self.before_write(i);
        let seg = &mut self.segments[i];
        let Some(e) = seg.entries.find_mut(h, |e| e.key.matches(&probe)) else {
            return false;
        };
        recount_volatile(
            &mut seg.volatile,
            &mut self.volatile,
            e.expire_at,
            expire_at,
        );
        e.expire_at = expire_at;
        true
    }

    pub fn clear(&mut self) {
        // A running snapshot first writes what it has not, then goes on over nothing.
        let snapshot = self.snapshot.take().map(|mut snap| {
            for i in 0..snap.pending.len() {
                if snap.pending[i] {
                    snap.sink.save(&mut self.segments[i].entries.iter());
                }
            }
            snap.pending = vec![false];
            snap.remaining = 0;
            snap
        });
        *self = Table {
            hasher: self.hasher,
            snapshot,
            ..Table::new()
        };
    }

    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.segments.iter().flat_map(|s| s.entries.iter())
    }

    fn resize(&mut self, new_count: usize) {
        let old = std::mem::take(&mut self.segments);
        self.segments = (0..new_count).map(|_| Segment::new()).collect();
        for seg in old {
            for entry in seg.entries {
                let h = self.hash(&entry.key);
                let i = self.seg_index(h);
                let hasher = &self.hasher;
                let target = &mut self.segments[i];
                if entry.expire_at != 0 {
                    target.volatile += 1;
                }
                target
                    .entries
                    .insert_unique(h, entry, |e| hasher.hash_one(&*e.key));
            }
        }
    }

    /// Visits whole segments from `cursor` until at least `count` entries were offered to
    /// `visit` (or the table ends) and returns the next cursor, 0 when the scan is complete.
    pub fn scan(&self, cursor: u64, count: usize, mut visit: impl FnMut(&Entry)) -> u64 {
        let mask = (self.segments.len() - 1) as u64;
        let mut v = cursor;
        let mut seen = 0usize;
        // Like Redis, bound the empty segments walked per call.
        let mut budget = count.saturating_mul(10).max(10);
        loop {
            let seg = &self.segments[(v & mask) as usize];
            for e in seg.entries.iter() {
                visit(e);
                seen += 1;
            }
            v = next_reverse_cursor(v, mask);
            budget = budget.saturating_sub(1);
            if v == 0 || seen >= count || budget == 0 {
                return v;
            }
        }
    }

    /// A uniformly chosen segment's random entry; `rand` supplies random numbers.
    pub fn random_entry(&self, mut rand: impl FnMut() -> u64) -> Option<&Entry> {
        if self.len == 0 {
            return None;
        }
        let n = self.segments.len();
        let start = (rand() as usize) & (n - 1);
        for step in 0..n {
            let seg = &self.segments[(start + step) & (n - 1)];
            let len = seg.entries.len();
            if len > 0 {
                let pick = (rand() as usize) % len;
                return seg.entries.iter().nth(pick);
            }
        }
        None
    }

    /// A random entry with a TTL: a random segment holding some, then a random one of
    /// them there (what volatile eviction policies sample).
    pub fn random_volatile_entry(&self, mut rand: impl FnMut() -> u64) -> Option<&Entry> {
        if self.volatile == 0 {
            return None;
        }
        let n = self.segments.len();
        let start = (rand() as usize) & (n - 1);
        for step in 0..n {
            let seg = &self.segments[(start + step) & (n - 1)];
            if seg.volatile > 0 {
                let pick = (rand() as usize) % seg.volatile as usize;
                return seg.entries.iter().filter(|e| e.expire_at != 0).nth(pick);
            }
        }
        None
    }

    /// Walks at most `max_segments` segments holding volatile keys from `cursor`, removing
    /// keys expired at `now_ms` (but those `spare` names) and handing each to
    /// `on_expired`. Returns the next cursor, how many volatile keys were checked, and the
    /// remaining TTLs of those still alive.
    pub fn expire_step(
        &mut self,
        cursor: u64,
        max_segments: usize,
        now_ms: u64,
        spare: impl Fn(&[u8]) -> bool,
        mut on_expired: impl FnMut(Entry),
    ) -> ExpireStep {
        let mask = (self.segments.len() - 1) as u64;
        let mut v = cursor & mask;
        let mut step = ExpireStep::default();
        let mut visited = 0;
        let mut walked = 0;
        loop {
            let i = (v & mask) as usize;
            if self.segments[i].volatile > 0 {
                visited += 1;
                let seg = &mut self.segments[i];
                step.checked += seg.volatile as usize;
                let mut expired = Vec::new();
                for e in seg.entries.iter() {
                    if e.is_expired(now_ms) {
                        if !spare(&e.key) {
                            expired.push(e.key.clone());
                        }
                    } else if e.expire_at != 0 {
                        step.live_ttl_sum = step.live_ttl_sum.saturating_add(e.expire_at - now_ms);
                        step.live_sampled += 1;
                    }
                }
                for key in expired {
                    if let Some(e) = self.remove_in_segment(i, &key) {
                        on_expired(e);
                    }
                }
            }
            walked += 1;
            v = next_reverse_cursor(v, mask);
            step.next = v;
            // A resize inside remove changes the mask: restart from the new cursor space.
            if (self.segments.len() - 1) as u64 != mask {
                return step;
            }
            if v == 0 || visited >= max_segments || walked >= max_segments * 16 {
                return step;
            }
        }
    }

    fn remove_in_segment(&mut self, _seg: usize, key: &[u8]) -> Option<Entry> {
        self.remove(key)
    }
}

/// Redis's reverse-binary cursor increment: increments the reversed bits of `v` within
/// `mask`, so a cursor stays valid when the table doubles or halves.
pub fn next_reverse_cursor(v: u64, mask: u64) -> u64 {
    let mut v = v | !mask;
    v = v.reverse_bits();
    v = v.wrapping_add(1);
    v.reverse_bits()
}

/// Keys `prefetch_many` takes per round: a usual pipeline's depth.
const PREFETCH_ROUND: usize = 16;

/// Longest argument a caller of `prefetch_many` takes for a key: hashing a long argument
/// that is not a key (a script's body, a value) would cost more than the miss it might
/// save.
pub const PREFETCH_KEY_MAX: usize = 128;

#[inline(always)]
fn prefetch_read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::value::StrValue;
    use std::collections::HashSet;

    fn val() -> Value {
        Value::Str(StrValue::Int(1))
    }

    #[test]
    fn insert_get_remove_and_resize() {
        let mut t = Table::new();
        for i in 0..10_000 {
            t.insert(format!("k{i}").as_bytes(), val(), 0, 0);
        }
        assert_eq!(t.len(), 10_000);
        assert!(t.segments.len() > 1);
        for i in 0..10_000 {
            assert!(t.get(format!("k{i}").as_bytes()).is_some());
        }
        for i in 0..9_990 {
            assert!(t.remove(format!("k{i}").as_bytes()).is_some());
        }
        assert_eq!(t.len(), 10);
        assert!(t.segments.len() <= 8);
        assert!(t.get(b"k9995").is_some());
    }

    /// A prefetch is a hint: on an empty table, for missing keys, for keys whose probe
    /// meets another key first, it changes nothing and never faults.
    #[test]
    fn prefetch_changes_nothing() {
        let mut t = Table::new();
        t.prefetch_many([&b"nothing-here"[..]].into_iter());
        for i in 0..5_000 {
            t.insert(format!("k{i}").as_bytes(), val(), 0, 0);
        }
        let keys: Vec<String> = (0..10_000).map(|i| format!("k{i}")).collect();
        for group in keys.chunks(20) {
            t.prefetch_many(group.iter().map(|k| k.as_bytes()));
        }
        t.prefetch_many([&b""[..]].into_iter());
        assert_eq!(t.len(), 5_000);
        for i in 0..5_000 {
            assert!(t.get(format!("k{i}").as_bytes()).is_some());
        }
        assert!(t.get(b"k5000").is_none());
    }

    /// The value steps read through a string's or a list's pointers: every shape must be
    /// read without harm (an empty list, one chunk, many, a deque that wrapped round its
    /// buffer, chunks shared with a copy) and left as it was.
    #[test]
    fn prefetch_reads_values_of_every_shape() {
        let mut t = Table::new();
        let mut lists: Vec<(String, List)> = Vec::new();
        lists.push(("empty".into(), List::new()));
        let mut one = List::new();
        one.push_back(b"only");
        lists.push(("one".into(), one));
        let mut many = List::new();
        for i in 0..5_000 {
            many.push_back(format!("element-{i}").as_bytes());
        }
        lists.push(("many".into(), many.clone()));
        // Pushed at the front and popped at the back until the deque's ring has wrapped.
        let mut wrapped = List::new();
        for round in 0..40 {
            for i in 0..300 {
                wrapped.push_front(format!("w{round}-{i}").as_bytes());
            }
            for _ in 0..250 {
                wrapped.pop_back();
            }
        }
        lists.push(("wrapped".into(), wrapped));
        // A copy sharing the original's chunks stays alive beside it.
        let shared_copy = many.clone();
        lists.push(("shared".into(), many));
        for (k, l) in &lists {
            t.insert(k.as_bytes(), Value::List(Box::new(l.clone())), 0, 0);
        }
        t.insert(b"int", val(), 0, 0);
        t.insert(
            b"plain",
            Value::Str(StrValue::Plain(b"bytes".to_vec())),
            0,
            0,
        );
        t.insert(b"blank", Value::Str(StrValue::Plain(Vec::new())), 0, 0);
        t.insert(b"small", Value::Str(StrValue::from_bytes(b"short")), 0, 0);
        t.insert(
            b"mutated",
            Value::Str(StrValue::Mutated(vec![7; 100])),
            0,
            0,
        );
        let names = [
            "empty", "one", "many", "wrapped", "shared", "int", "plain", "blank",
        ];
        for _ in 0..3 {
            t.prefetch_many(
                names
                    .iter()
                    .chain(["mutated", "small", "absent"].iter())
                    .map(|k| k.as_bytes()),
            );
        }
        for (k, l) in &lists {
            let Some(Value::List(got)) = t.get(k.as_bytes()).map(|e| &e.value) else {
                panic!("{k} is no longer a list");
            };
            assert!(got.iter().eq(l.iter()), "{k} changed");
        }
        assert!(shared_copy.iter().eq(lists[4].1.iter()));
        assert_eq!(t.len(), 10);
    }

    #[test]
    fn scan_returns_every_stable_key_across_resizes() {
        let mut t = Table::new();
        for i in 0..500 {
            t.insert(format!("stable{i}").as_bytes(), val(), 0, 0);
        }
        let mut seen = HashSet::new();
        let mut cursor = 0;
        let mut round = 0;
        loop {
            cursor = t.scan(cursor, 10, |e| {
                seen.insert(e.key.to_vec());
            });
            // Grow and shrink the table between calls.
            round += 1;
            if round % 3 == 0 {
                for j in 0..400 {
                    t.insert(format!("tmp{round}-{j}").as_bytes(), val(), 0, 0);
                }
            } else if round % 3 == 1 {
                let keys: Vec<Vec<u8>> = t
                    .iter()
                    .filter(|e| e.key.starts_with(b"tmp"))
                    .map(|e| e.key.to_vec())
                    .collect();
                for k in keys {
                    t.remove(&k);
                }
            }
            if cursor == 0 {
                break;
            }
        }
        for i in 0..500 {
            assert!(seen.contains(format!("stable{i}").as_bytes()), "missed {i}");
        }
    }

    #[test]
    fn volatile_counts_and_expiry() {
        let mut t = Table::new();
        for i in 0..100 {
            t.insert(
                format!("k{i}").as_bytes(),
                val(),
                if i % 2 == 0 { 10 } else { 0 },
                0,
            );
        }
        assert_eq!(t.volatile_len(), 50);
        assert!(t.set_expire(b"k1", 20));
        assert!(t.set_expire(b"k0", 0));
        assert_eq!(t.volatile_len(), 50);
        let mut expired = 0;
        let mut cursor = 0;
        loop {
            cursor = t
                .expire_step(cursor, 4, 15, |_| false, |_| expired += 1)
                .next;
            if cursor == 0 {
                break;
            }
        }
        assert_eq!(expired, 49);
        assert_eq!(t.volatile_len(), 1);
        assert_eq!(t.len(), 51);
    }

    type Saved = std::rc::Rc<std::cell::RefCell<Vec<(Vec<u8>, i64)>>>;

    struct Collect(Saved);

    impl SegmentSink for Collect {
        fn save(&mut self, entries: &mut dyn Iterator<Item = &Entry>) {
            for e in entries {
                let v = match &e.value {
                    Value::Str(s) => s.as_i64().unwrap(),
                    _ => unreachable!(),
                };
                self.0.borrow_mut().push((e.key.to_vec(), v));
            }
        }
    }

    /// A table of keys `k0..k{n}` holding their numbers, with a snapshot begun.
    fn numbered_table_in_snapshot(n: i64, lru: u32) -> (Table, Saved) {
        let mut t = Table::new();
        for i in 0..n {
            t.insert(
                format!("k{i}").as_bytes(),
                Value::Str(StrValue::Int(i)),
                0,
                lru,
            );
        }
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        t.begin_snapshot(Box::new(Collect(seen.clone())));
        (t, seen)
    }

    /// The snapshot saved exactly `k0..k{n}` with their numbers.
    fn assert_saved_numbered(seen: &Saved, n: i64) {
        let mut got = seen.borrow().clone();
        got.sort();
        let mut want: Vec<(Vec<u8>, i64)> =
            (0..n).map(|i| (format!("k{i}").into_bytes(), i)).collect();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn snapshot_holds_the_table_as_it_began() {
        let (mut t, seen) = numbered_table_in_snapshot(2_000, 0);
        let mut finished = false;
        for round in 0..10_000i64 {
            // Change, add and remove keys between steps; grow well past the resize point.
            let k = format!("k{}", round % 2_000);
            if let Some(e) = t.get_mut(k.as_bytes()) {
                e.value = Value::Str(StrValue::Int(-1));
            }
            t.insert(format!("new{round}").as_bytes(), val(), 0, 0);
            t.remove(format!("k{}", (round * 7) % 2_000).as_bytes());
            if round == 60 {
                t.clear();
            }
            if t.snapshot_step(1).is_some() {
                finished = true;
                break;
            }
        }
        assert!(finished);
        assert!(!t.snapshot_running());
        assert_saved_numbered(&seen, 2_000);
    }

    #[test]
    fn replacing_in_place_keeps_counts_and_the_snapshot() {
        let (mut t, seen) = numbered_table_in_snapshot(300, 7);
        // Overwrites while the snapshot runs: none of them may reach it.
        for i in 0..300i64 {
            let at = if i % 3 == 0 { 50 } else { 0 };
            let old = t
                .insert(
                    format!("k{i}").as_bytes(),
                    Value::Str(StrValue::Int(-i)),
                    at,
                    9,
                )
                .expect("replaced");
            assert!(matches!(old.value, Value::Str(StrValue::Int(v)) if v == i));
            assert_eq!((old.expire_at, old.lru), (0, 7));
        }
        assert_eq!(t.len(), 300);
        assert_eq!(t.volatile_len(), 100);
        // Clearing a TTL by overwriting, and setting one on a key that had none.
        t.insert(b"k0", val(), 0, 0);
        t.insert(b"k1", val(), 60, 0);
        assert_eq!(t.volatile_len(), 100);
        while t.snapshot_step(4).is_none() {}
        assert_saved_numbered(&seen, 300);
        // One probe tells a live key from an expired or missing one.
        assert!(matches!(t.get_live_mut(b"k3", 10), Probe::Live(_)));
        assert!(matches!(t.get_live_mut(b"k3", 50), Probe::Expired));
        assert!(matches!(t.get_live_mut(b"k2", 1 << 40), Probe::Live(_)));
        assert!(matches!(t.get_live_mut(b"nope", 10), Probe::Missing));
        if let Probe::Live(e) = t.get_live_mut(b"k5", 10) {
            assert_eq!(e.lru, 9);
        }
    }
}
