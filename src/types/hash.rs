//! The hash value: field → value maps.
//!
//! Two representations, as in Redis. A small hash is one packed byte buffer of
//! `[field length][field][value length][value]` records in insertion order (what Redis
//! calls a listpack): two bytes of overhead per pair, lookups by linear scan, which is
//! cheap at this size. A hash that outgrows it (more than `PACK_MAX_ENTRIES` pairs, or a
//! field or value longer than `PACK_MAX_VALUE` bytes) becomes a hash table and never goes
//! back, as in Redis, so OBJECT ENCODING answers what Redis would.
//!
//! The table stores each pair as one allocation (`[varint field length][field][value]`)
//! and spreads pairs over 2^k small hashbrown tables ("segments") by bits of the field's
//! hash. The segment index plays the part of Redis's bucket index, which gives HSCAN a
//! reverse-binary cursor with Redis's guarantee: a pair present for the whole scan is
//! returned at least once, however the table grows or shrinks between calls.

use std::hash::BuildHasher;
use std::sync::OnceLock;

use hashbrown::hash_table::HashTable;
use hashbrown::DefaultHashBuilder;

use super::table::next_reverse_cursor;

/// Redis's defaults for `hash-max-listpack-entries` and `hash-max-listpack-value`.
pub const PACK_MAX_ENTRIES: usize = 512;
pub const PACK_MAX_VALUE: usize = 64;

/// Average pairs per segment above which the table doubles its segments.
const GROW_AT: usize = 16;
/// Average pairs per segment under which it halves them.
const SHRINK_AT: usize = 2;
/// Segment index bits come from the high half of the hash, independent of the bits
/// hashbrown uses inside each segment.
const SEG_SHIFT: u32 = 32;
/// Random picks sample a slot in 0..PICK_SLOTS of a random segment and retry when it
/// is empty, which makes every pair equally likely while segments stay under this size.
const PICK_SLOTS: usize = 64;

/// One hasher for every hash table of the process: a field's hash must not change while
/// an HSCAN walks the table, and a shared state costs no memory per hash.
fn hash_field(field: &[u8]) -> u64 {
    static STATE: OnceLock<DefaultHashBuilder> = OnceLock::new();
    STATE
        .get_or_init(DefaultHashBuilder::default)
        .hash_one(field)
}

#[derive(Clone, Debug)]
pub struct Hash {
    repr: Repr,
}

impl Default for Hash {
    fn default() -> Self {
        Hash::new()
    }
}

#[derive(Clone, Debug)]
enum Repr {
    Pack(Pack),
    Table(Table),
}

impl Hash {
    pub fn new() -> Hash {
        Hash {
            repr: Repr::Pack(Pack::default()),
        }
    }

    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Pack(p) => p.len as usize,
            Repr::Table(t) => t.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, field: &[u8]) -> Option<&[u8]> {
        match &self.repr {
            Repr::Pack(p) => p.find(field).map(|at| p.value_at(at)),
            Repr::Table(t) => t.get(field),
        }
    }

    pub fn contains(&self, field: &[u8]) -> bool {
        self.get(field).is_some()
    }

    /// Called before a write of `pairs` pairs whose longest field or value is `longest`
    /// bytes: converts to a table when they cannot all stay packed, as Redis 7.2 decides
    /// before it adds anything (more pairs than the limit counts, duplicates included).
    pub fn prepare(&mut self, pairs: usize, longest: usize) {
        if let Repr::Pack(p) = &self.repr {
            if pairs > PACK_MAX_ENTRIES || longest > PACK_MAX_VALUE {
                let hint = p.len as usize + pairs;
                self.convert(hint);
            }
        }
    }

    /// Sets `field` to `value`; true when the field is new.
    pub fn insert(&mut self, field: &[u8], value: &[u8]) -> bool {
        if let Repr::Pack(p) = &mut self.repr {
            if field.len() <= PACK_MAX_VALUE && value.len() <= PACK_MAX_VALUE {
                let added = p.insert(field, value);
                if p.len as usize > PACK_MAX_ENTRIES {
                    self.convert(0);
                }
                return added;
            }
            let hint = p.len as usize + 1;
            self.convert(hint);
        }
        match &mut self.repr {
            Repr::Table(t) => t.insert(field, value),
            Repr::Pack(_) => unreachable!("converted above"),
        }
    }

    /// Removes `field`; true when it was there.
    pub fn remove(&mut self, field: &[u8]) -> bool {
        match &mut self.repr {
            Repr::Pack(p) => p.remove(field),
            Repr::Table(t) => t.remove(field),
        }
    }

    /// The pairs: in insertion order while packed, in table order after.
    pub fn iter(&self) -> Iter<'_> {
        match &self.repr {
            Repr::Pack(p) => Iter::Pack(PackIter { buf: &p.buf }),
            Repr::Table(t) => Iter::Table(t.segs.iter().flatten()),
        }
    }

    /// One pair chosen uniformly at random; `rand` supplies random numbers. The hash must
    /// not be empty.
    pub fn random_pair(&self, rand: &mut dyn FnMut() -> u64) -> (&[u8], &[u8]) {
        match &self.repr {
            Repr::Pack(p) => {
                let i = (rand() % p.len as u64) as usize;
                p.iter().nth(i).expect("index within length")
            }
            Repr::Table(t) => t.random_pair(rand),
        }
    }

    /// `count` pairs chosen at random, repeats allowed, handed to `visit` one by one.
    pub fn random_pairs(
        &self,
        count: usize,
        rand: &mut dyn FnMut() -> u64,
        mut visit: impl FnMut(&[u8], &[u8]),
    ) {
        match &self.repr {
            Repr::Pack(p) => {
                // One walk to index the records, then each pick is O(1).
                let pairs: Vec<(&[u8], &[u8])> = p.iter().collect();
                for _ in 0..count {
                    let (f, v) = pairs[(rand() % pairs.len() as u64) as usize];
                    visit(f, v);
                }
            }
            Repr::Table(t) => {
                for _ in 0..count {
                    let (f, v) = t.random_pair(rand);
                    visit(f, v);
                }
            }
        }
    }

    /// `count` distinct pairs chosen at random (`count` below the length). Packed hashes
    /// give them in their stored order, as Redis does for listpacks.
    pub fn sample_distinct(
        &self,
        count: usize,
        rand: &mut dyn FnMut() -> u64,
    ) -> Vec<(&[u8], &[u8])> {
        let len = self.len();
        debug_assert!(count < len);
        match &self.repr {
            Repr::Pack(p) => {
                let mut idx: Vec<usize> = (0..len).collect();
                partial_shuffle(&mut idx, count, rand);
                let mut keep = vec![false; len];
                for &i in &idx[..count] {
                    keep[i] = true;
                }
                p.iter()
                    .zip(keep)
                    .filter_map(|(pair, k)| k.then_some(pair))
                    .collect()
            }
            Repr::Table(t) => {
                if count * 4 >= len {
                    // A large share: shuffle them all rather than retry repeats.
                    let mut all: Vec<(&[u8], &[u8])> = self.iter().collect();
                    partial_shuffle(&mut all, count, rand);
                    all.truncate(count);
                    all
                } else {
                    let mut seen = hashbrown::HashSet::with_capacity(count);
                    let mut out = Vec::with_capacity(count);
                    while out.len() < count {
                        let (f, v) = t.random_pair(rand);
                        if seen.insert(f.as_ptr()) {
                            out.push((f, v));
                        }
                    }
                    out
                }
            }
        }
    }

    /// HSCAN's step: packed hashes hand over every pair and return cursor 0, as Redis
    /// does for listpacks; tables walk segments from `cursor` until about `count` pairs
    /// were offered, and return the next cursor (0 at the end).
    pub fn scan<'a>(
        &'a self,
        cursor: u64,
        count: usize,
        mut visit: impl FnMut(&'a [u8], &'a [u8]),
    ) -> u64 {
        match &self.repr {
            Repr::Pack(p) => {
                for (f, v) in p.iter() {
                    visit(f, v);
                }
                0
            }
            Repr::Table(t) => t.scan(cursor, count, visit),
        }
    }

    pub fn encoding(&self) -> &'static str {
        match &self.repr {
            Repr::Pack(_) => "listpack",
            Repr::Table(_) => "hashtable",
        }
    }

    pub fn heap_size(&self) -> usize {
        match &self.repr {
            Repr::Pack(p) => p.buf.capacity(),
            Repr::Table(t) => t.heap_size(),
        }
    }

    fn convert(&mut self, hint: usize) {
        if let Repr::Pack(p) = &self.repr {
            let mut t = Table::with_capacity(hint.max(p.len as usize));
            for (f, v) in p.iter() {
                t.insert(f, v);
            }
            self.repr = Repr::Table(t);
        }
    }
}

/// Moves `count` uniformly chosen items to the front of `items` (Fisher–Yates, cut short).
fn partial_shuffle<T>(items: &mut [T], count: usize, rand: &mut dyn FnMut() -> u64) {
    let n = items.len();
    for i in 0..count.min(n) {
        let j = i + (rand() % (n - i) as u64) as usize;
        items.swap(i, j);
    }
}

pub enum Iter<'a> {
    Pack(PackIter<'a>),
    Table(std::iter::Flatten<std::slice::Iter<'a, HashTable<Box<[u8]>>>>),
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Pack(p) => p.next(),
            Iter::Table(t) => t.next().map(|b| split(b)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The packed form
// ---------------------------------------------------------------------------------------

/// Records of `[u8 field length][field][u8 value length][value]`; both lengths fit a byte
/// because longer fields or values never stay packed.
#[derive(Clone, Debug, Default)]
struct Pack {
    buf: Vec<u8>,
    len: u16,
}

/// Where a record is: the offset of its field length byte and of its value length byte.
#[derive(Clone, Copy)]
struct At {
    start: usize,
    value: usize,
}

impl Pack {
    fn iter(&self) -> PackIter<'_> {
        PackIter { buf: &self.buf }
    }

    fn find(&self, field: &[u8]) -> Option<At> {
        let buf = &self.buf;
        let mut pos = 0;
        while pos < buf.len() {
            let flen = buf[pos] as usize;
            let vpos = pos + 1 + flen;
            if &buf[pos + 1..vpos] == field {
                return Some(At {
                    start: pos,
                    value: vpos,
                });
            }
            pos = vpos + 1 + buf[vpos] as usize;
        }
        None
    }

    fn value_at(&self, at: At) -> &[u8] {
        let vlen = self.buf[at.value] as usize;
        &self.buf[at.value + 1..at.value + 1 + vlen]
    }

    /// Grows by at least an eighth of the size, so a hash built pair by pair costs
    /// amortized O(1) copies per pair and wastes little capacity.
    fn reserve(&mut self, extra: usize) {
        if self.buf.capacity() - self.buf.len() < extra {
            self.buf.reserve_exact(extra.max(self.buf.len() / 8));
        }
    }

    fn insert(&mut self, field: &[u8], value: &[u8]) -> bool {
        if let Some(at) = self.find(field) {
            let old = self.buf[at.value] as usize;
            if old == value.len() {
                self.buf[at.value + 1..at.value + 1 + old].copy_from_slice(value);
            } else {
                self.reserve(value.len().saturating_sub(old));
                let end = at.value + 1 + old;
                self.buf.splice(
                    at.value..end,
                    std::iter::once(value.len() as u8).chain(value.iter().copied()),
                );
            }
            return false;
        }
        self.reserve(2 + field.len() + value.len());
        self.buf.push(field.len() as u8);
        self.buf.extend_from_slice(field);
        self.buf.push(value.len() as u8);
        self.buf.extend_from_slice(value);
        self.len += 1;
        true
    }

    fn remove(&mut self, field: &[u8]) -> bool {
        let Some(at) = self.find(field) else {
            return false;
        };
        let end = at.value + 1 + self.buf[at.value] as usize;
        self.buf.drain(at.start..end);
        self.len -= 1;
        if self.buf.capacity() > 2 * self.buf.len() + 64 {
            self.buf.shrink_to_fit();
        }
        true
    }
}

pub struct PackIter<'a> {
    buf: &'a [u8],
}

impl<'a> Iterator for PackIter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let buf = self.buf;
        if buf.is_empty() {
            return None;
        }
        let flen = buf[0] as usize;
        let vpos = 1 + flen;
        let vlen = buf[vpos] as usize;
        let end = vpos + 1 + vlen;
        self.buf = &buf[end..];
        Some((&buf[1..vpos], &buf[vpos + 1..end]))
    }
}

// ---------------------------------------------------------------------------------------
// The table form
// ---------------------------------------------------------------------------------------

type Segment = HashTable<Box<[u8]>>;

#[derive(Clone, Debug)]
struct Table {
    segs: Vec<Segment>,
    len: usize,
}

/// Builds a pair's allocation: the field length as a LEB128 varint, the field, the value.
fn pack_pair(field: &[u8], value: &[u8]) -> Box<[u8]> {
    let mut v = Vec::with_capacity(5 + field.len() + value.len());
    let mut n = field.len();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            v.push(byte);
            break;
        }
        v.push(byte | 0x80);
    }
    v.extend_from_slice(field);
    v.extend_from_slice(value);
    v.into_boxed_slice()
}

/// A pair's field and value.
fn split(b: &[u8]) -> (&[u8], &[u8]) {
    let mut n = 0usize;
    let mut shift = 0;
    let mut i = 0;
    loop {
        let byte = b[i];
        n |= ((byte & 0x7f) as usize) << shift;
        i += 1;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    b[i..].split_at(n)
}

fn field_of(b: &[u8]) -> &[u8] {
    split(b).0
}

fn rehash(b: &[u8]) -> u64 {
    hash_field(field_of(b))
}

impl Table {
    fn with_capacity(n: usize) -> Table {
        let segs = n.div_ceil(GROW_AT).max(1).next_power_of_two();
        Table {
            segs: (0..segs).map(|_| HashTable::new()).collect(),
            len: 0,
        }
    }

    fn seg_index(&self, h: u64) -> usize {
        ((h >> SEG_SHIFT) as usize) & (self.segs.len() - 1)
    }

    fn get(&self, field: &[u8]) -> Option<&[u8]> {
        let h = hash_field(field);
        self.segs[self.seg_index(h)]
            .find(h, |b| field_of(b) == field)
            .map(|b| split(b).1)
    }

    fn insert(&mut self, field: &[u8], value: &[u8]) -> bool {
        let h = hash_field(field);
        let i = self.seg_index(h);
        let seg = &mut self.segs[i];
        if let Some(b) = seg.find_mut(h, |b| field_of(b) == field) {
            let (_, old) = split(b);
            if old.len() == value.len() {
                let start = b.len() - old.len();
                b[start..].copy_from_slice(value);
            } else {
                *b = pack_pair(field, value);
            }
            return false;
        }
        seg.insert_unique(h, pack_pair(field, value), |b| rehash(b));
        self.len += 1;
        if self.len > self.segs.len() * GROW_AT {
            self.resize(self.segs.len() * 2);
        }
        true
    }

    fn remove(&mut self, field: &[u8]) -> bool {
        let h = hash_field(field);
        let i = self.seg_index(h);
        match self.segs[i].find_entry(h, |b| field_of(b) == field) {
            Ok(e) => {
                e.remove();
            }
            Err(_) => return false,
        }
        self.len -= 1;
        if self.segs.len() > 1 && self.len < self.segs.len() * SHRINK_AT {
            self.resize(self.segs.len() / 2);
        }
        true
    }

    fn resize(&mut self, count: usize) {
        let old = std::mem::take(&mut self.segs);
        self.segs = (0..count).map(|_| HashTable::new()).collect();
        for seg in old {
            for b in seg {
                let h = rehash(&b);
                let i = self.seg_index(h);
                self.segs[i].insert_unique(h, b, |b| rehash(b));
            }
        }
    }

    fn random_pair(&self, rand: &mut dyn FnMut() -> u64) -> (&[u8], &[u8]) {
        debug_assert!(self.len > 0);
        let mask = self.segs.len() - 1;
        loop {
            let r = rand();
            let seg = &self.segs[(r as usize) & mask];
            if seg.len() > PICK_SLOTS {
                // A crowded segment (unlikely with a good hash): pick exactly instead.
                break;
            }
            let slot = ((r >> SEG_SHIFT) % PICK_SLOTS as u64) as usize;
            if slot < seg.len() {
                return split(seg.iter().nth(slot).expect("slot within length"));
            }
        }
        let mut i = (rand() % self.len as u64) as usize;
        for seg in &self.segs {
            if i < seg.len() {
                return split(seg.iter().nth(i).expect("index within length"));
            }
            i -= seg.len();
        }
        unreachable!("index within length")
    }

    fn scan<'a>(
        &'a self,
        cursor: u64,
        count: usize,
        mut visit: impl FnMut(&'a [u8], &'a [u8]),
    ) -> u64 {
        let mask = (self.segs.len() - 1) as u64;
        let mut v = cursor;
        let mut seen = 0usize;
        // Bound the empty segments one call walks, as Redis bounds its bucket visits.
        let mut budget = count.saturating_mul(10);
        loop {
            let seg = &self.segs[(v & mask) as usize];
            for b in seg {
                let (f, val) = split(b);
                visit(f, val);
            }
            seen += seg.len();
            v = next_reverse_cursor(v, mask);
            budget = budget.saturating_sub(1);
            if v == 0 || seen >= count || budget == 0 {
                return v;
            }
        }
    }

    fn heap_size(&self) -> usize {
        let slot = std::mem::size_of::<Box<[u8]>>() + 1;
        self.segs.capacity() * std::mem::size_of::<Segment>()
            + self
                .segs
                .iter()
                .map(|s| s.capacity() * slot + s.iter().map(|b| b.len()).sum::<usize>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashSet};

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    fn contents(h: &Hash) -> BTreeMap<Vec<u8>, Vec<u8>> {
        h.iter().map(|(f, v)| (f.to_vec(), v.to_vec())).collect()
    }

    #[test]
    fn packed_keeps_insertion_order_and_updates_in_place() {
        let mut h = Hash::new();
        assert!(h.insert(b"b", b"1"));
        assert!(h.insert(b"a", b"2"));
        assert!(h.insert(b"c", b""));
        assert!(!h.insert(b"a", b"longer value"));
        assert!(!h.insert(b"b", b"9"));
        let order: Vec<&[u8]> = h.iter().map(|(f, _)| f).collect();
        assert_eq!(order, vec![&b"b"[..], b"a", b"c"]);
        assert_eq!(h.get(b"a"), Some(&b"longer value"[..]));
        assert_eq!(h.get(b"c"), Some(&b""[..]));
        assert_eq!(h.get(b"x"), None);
        assert!(h.remove(b"a"));
        assert!(!h.remove(b"a"));
        assert_eq!(h.len(), 2);
        assert_eq!(h.encoding(), "listpack");
        // The empty field is a field like any other.
        assert!(h.insert(b"", b"e"));
        assert_eq!(h.get(b""), Some(&b"e"[..]));
    }

    #[test]
    fn converts_on_size_and_length_and_never_back() {
        let mut h = Hash::new();
        for i in 0..PACK_MAX_ENTRIES {
            h.insert(format!("f{i}").as_bytes(), b"v");
        }
        assert_eq!(h.encoding(), "listpack");
        h.insert(b"one more", b"v");
        assert_eq!(h.encoding(), "hashtable");
        assert_eq!(h.len(), PACK_MAX_ENTRIES + 1);
        for i in 0..PACK_MAX_ENTRIES {
            assert!(h.remove(format!("f{i}").as_bytes()));
        }
        assert_eq!(h.encoding(), "hashtable");
        assert_eq!(h.len(), 1);

        let mut h = Hash::new();
        h.insert(&[b'x'; PACK_MAX_VALUE], &[b'y'; PACK_MAX_VALUE]);
        assert_eq!(h.encoding(), "listpack");
        h.insert(b"f", &[b'y'; PACK_MAX_VALUE + 1]);
        assert_eq!(h.encoding(), "hashtable");
        assert_eq!(h.get(&[b'x'; PACK_MAX_VALUE]), Some(&[b'y'; 64][..]));

        let mut h = Hash::new();
        h.prepare(PACK_MAX_ENTRIES + 1, 1);
        assert_eq!(h.encoding(), "hashtable");
        let mut h = Hash::new();
        h.prepare(3, PACK_MAX_VALUE);
        assert_eq!(h.encoding(), "listpack");
    }

    #[test]
    fn table_matches_a_model_through_growth_and_shrinking() {
        let mut h = Hash::new();
        let mut model = BTreeMap::new();
        let mut r = rng(7);
        for step in 0..60_000u64 {
            let f = format!("field:{}", r() % 5000).into_bytes();
            if step < 30_000 || r().is_multiple_of(3) {
                let v = vec![b'v'; (r() % 200) as usize];
                assert_eq!(h.insert(&f, &v), model.insert(f, v).is_none());
            } else {
                assert_eq!(h.remove(&f), model.remove(&f).is_some());
            }
            assert_eq!(h.len(), model.len());
        }
        assert_eq!(contents(&h), model);
        for (f, v) in &model {
            assert_eq!(h.get(f), Some(&v[..]));
        }
        let mut h2 = h.clone();
        for f in model.keys() {
            assert!(h2.remove(f));
        }
        assert!(h2.is_empty());
        assert_eq!(contents(&h), model);
    }

    #[test]
    fn long_fields_round_trip_through_the_varint() {
        let mut h = Hash::new();
        let long = vec![b'f'; 70_000];
        h.insert(&long, b"v");
        h.insert(b"short", &long);
        assert_eq!(h.get(&long), Some(&b"v"[..]));
        assert_eq!(h.get(b"short").map(|v| v.len()), Some(70_000));
    }

    #[test]
    fn scan_returns_every_pair_present_throughout_despite_resizes() {
        let mut h = Hash::new();
        for i in 0..3000 {
            h.insert(format!("keep{i}").as_bytes(), b"v");
        }
        let mut seen = HashSet::new();
        let mut cursor = 0;
        let mut calls = 0;
        loop {
            cursor = h.scan(cursor, 10, |f, _| {
                seen.insert(f.to_vec());
            });
            calls += 1;
            // Grow, then shrink, the table while the scan is under way.
            if calls == 20 {
                for i in 0..20_000 {
                    h.insert(format!("tmp{i}").as_bytes(), b"v");
                }
            }
            if calls == 60 {
                for i in 0..20_000 {
                    h.remove(format!("tmp{i}").as_bytes());
                }
            }
            if cursor == 0 {
                break;
            }
        }
        for i in 0..3000 {
            assert!(
                seen.contains(format!("keep{i}").as_bytes()),
                "keep{i} missed"
            );
        }
    }

    #[test]
    fn random_picks_cover_everything_and_distinct_samples_are_distinct() {
        for n in [5usize, 600] {
            let mut h = Hash::new();
            for i in 0..n {
                h.insert(format!("f{i}").as_bytes(), format!("v{i}").as_bytes());
            }
            let mut r = rng(3);
            let mut hit = HashSet::new();
            h.random_pairs(n * 40, &mut r, |f, v| {
                assert_eq!(&f[1..], &v[1..]);
                hit.insert(f.to_vec());
            });
            assert_eq!(hit.len(), n);
            for count in [1, n / 5, n / 2, n - 1] {
                let s = h.sample_distinct(count, &mut r);
                assert_eq!(s.len(), count);
                let uniq: HashSet<&[u8]> = s.iter().map(|(f, _)| *f).collect();
                assert_eq!(uniq.len(), count);
                assert!(s.iter().all(|(f, v)| h.get(f) == Some(*v)));
            }
        }
        // Packed samples keep the stored order.
        let mut h = Hash::new();
        for i in 0..10 {
            h.insert(&[b'a' + i], b"v");
        }
        let s = h.sample_distinct(5, &mut rng(9));
        assert!(s.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
