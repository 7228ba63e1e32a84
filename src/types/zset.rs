//! The sorted set value.
//!
//! Two representations, as in Redis, reported by OBJECT ENCODING:
//!
//! - `listpack`: while a set holds at most 128 members of at most 64 bytes each, its
//!   entries live packed in one byte buffer in (score, member) order — 9 bytes of header
//!   per entry, about what a Redis listpack costs. Every operation is a linear pass over
//!   at most 128 entries.
//! - `skiplist`: past those limits, members live in an arena of nodes. A chained hash
//!   table (member → node) answers ZSCORE in O(1) and gives ZSCAN Redis's reverse-binary
//!   cursor, which never misses a member present for the whole scan even across resizes.
//!   The order is a list of small sorted blocks of (score, node) with a Fenwick tree over
//!   the block sizes, so a rank lookup is O(log n) and an insertion or deletion is
//!   O(log n + B) with B = 128 entries per block at most. Popping the head, what queues do
//!   all the time, is O(B) without any search.
//!
//! Scores are never NaN (the commands refuse it); -0 and 0 compare equal, as in Redis.

use std::cell::{Cell, RefCell};
use std::cmp::Ordering;
use std::collections::VecDeque;
use std::hash::BuildHasher;

/// Redis's `zset-max-listpack-entries` and `zset-max-listpack-value` defaults.
pub const MAX_LISTPACK_ENTRIES: usize = 128;
pub const MAX_LISTPACK_VALUE: usize = 64;

/// Orders (score, member) pairs the way Redis's skiplist does: by score, then by bytes.
#[inline]
pub fn cmp_entry(s1: f64, m1: &[u8], s2: f64, m2: &[u8]) -> Ordering {
    if s1 < s2 {
        Ordering::Less
    } else if s1 > s2 {
        Ordering::Greater
    } else {
        m1.cmp(m2)
    }
}

#[derive(Clone, Debug)]
pub enum ZSet {
    Small(Packed),
    Big(Box<Big>),
}

impl Default for ZSet {
    fn default() -> Self {
        ZSet::Small(Packed::default())
    }
}

impl ZSet {
    pub fn new() -> ZSet {
        ZSet::default()
    }

    /// An empty set in the representation Redis 7.2 picks for `size_hint` members whose
    /// length is about `len_hint` (its `zsetTypeCreate`).
    pub fn with_hint(size_hint: usize, len_hint: usize) -> ZSet {
        if size_hint <= MAX_LISTPACK_ENTRIES && len_hint <= MAX_LISTPACK_VALUE {
            ZSet::new()
        } else {
            ZSet::Big(Box::new(Big::new(size_hint)))
        }
    }

    /// Builds a set from entries sorted by (score, member) with distinct members, in the
    /// smallest representation that fits them (what Redis's store commands end with).
    pub fn from_sorted(entries: Vec<(f64, Box<[u8]>)>) -> ZSet {
        let fits = entries.len() <= MAX_LISTPACK_ENTRIES
            && entries.iter().all(|(_, m)| m.len() <= MAX_LISTPACK_VALUE);
        if fits {
            ZSet::Small(Packed::from_sorted(&entries))
        } else {
            ZSet::Big(Box::new(Big::from_sorted(entries)))
        }
    }

    /// ZADD with more pairs than a listpack may hold turns the set into a skiplist first,
    /// whatever the pairs turn out to be (Redis's `zsetTypeMaybeConvert`).
    pub fn reserve_for(&mut self, size_hint: usize) {
        if size_hint > MAX_LISTPACK_ENTRIES {
            self.make_big(size_hint);
        }
    }

    fn make_big(&mut self, cap: usize) {
        if let ZSet::Small(p) = self {
            let entries: Vec<(f64, Box<[u8]>)> = p.iter().map(|(_, s, m)| (s, m.into())).collect();
            let mut big = Big::from_sorted(entries);
            big.reserve(cap);
            *self = ZSet::Big(Box::new(big));
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ZSet::Small(p) => p.len as usize,
            ZSet::Big(b) => b.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn encoding(&self) -> &'static str {
        match self {
            ZSet::Small(_) => "listpack",
            ZSet::Big(_) => "skiplist",
        }
    }

    pub fn heap_size(&self) -> usize {
        match self {
            ZSet::Small(p) => p.buf.len(),
            ZSet::Big(b) => std::mem::size_of::<Big>() + b.heap_size(),
        }
    }

    pub fn score(&self, member: &[u8]) -> Option<f64> {
        match self {
            ZSet::Small(p) => p.find(member).map(|(_, _, s)| s),
            ZSet::Big(b) => b.find(member).map(|id| b.nodes[id as usize].score),
        }
    }

    /// Adds a member that is not in the set, turning a listpack into a skiplist when it
    /// would outgrow the listpack limits (as Redis's `zsetAdd` does).
    pub fn insert(&mut self, member: &[u8], score: f64) {
        if let ZSet::Small(p) = self {
            let n = p.len as usize + 1;
            if n > MAX_LISTPACK_ENTRIES || member.len() > MAX_LISTPACK_VALUE {
                self.make_big(n);
            }
        }
        match self {
            ZSet::Small(p) => p.insert(score, member),
            ZSet::Big(b) => b.insert(member, score),
        }
    }

    /// Changes the score of a member known to be in the set with score `old`.
    pub fn set_score(&mut self, member: &[u8], old: f64, new: f64) {
        match self {
            ZSet::Small(p) => {
                let (_, off, _) = p.find(member).expect("member present");
                p.remove_at(off);
                p.insert(new, member);
            }
            ZSet::Big(b) => b.set_score(member, old, new),
        }
    }

    /// Removes a member; returns its score if it was there.
    pub fn remove(&mut self, member: &[u8]) -> Option<f64> {
        match self {
            ZSet::Small(p) => {
                let (_, off, s) = p.find(member)?;
                p.remove_at(off);
                Some(s)
            }
            ZSet::Big(b) => b.remove(member),
        }
    }

    /// The 0-based rank (lowest score first) and score of a member.
    pub fn rank(&self, member: &[u8]) -> Option<(usize, f64)> {
        match self {
            ZSet::Small(p) => p.find(member).map(|(i, _, s)| (i, s)),
            ZSet::Big(b) => b.rank(member),
        }
    }

    /// The entry at a rank.
    pub fn get(&self, rank: usize) -> Option<(&[u8], f64)> {
        if rank >= self.len() {
            return None;
        }
        match self {
            ZSet::Small(p) => p.iter().nth(rank).map(|(_, s, m)| (m, s)),
            ZSet::Big(b) => {
                // The ends are found without the Fenwick tree.
                let (s, id) = if rank == 0 {
                    b.blocks[0][0]
                } else if rank == b.len - 1 {
                    b.blocks[b.blocks.len() - 1].last
                } else {
                    let (bi, pos) = b.seek(rank);
                    b.blocks[bi][pos]
                };
                Some((b.member(id), s))
            }
        }
    }

    /// Rank of the first entry for which `pred` holds. A listpack is searched entry by
    /// entry from the head, as Redis walks it; a skiplist by bisection, which gives the
    /// same answer whenever `pred` is false then true along the order (always so for
    /// score ranges, and for lex ranges over equal scores, their documented use).
    pub fn first_where(&self, pred: impl Fn(f64, &[u8]) -> bool) -> Option<usize> {
        match self {
            ZSet::Small(p) => p.iter().position(|(_, s, m)| pred(s, m)),
            ZSet::Big(b) => {
                let r = b.partition_point(|s, id| !pred(s, b.member(id)));
                (r < b.len).then_some(r)
            }
        }
    }

    /// `first_where` for a predicate on scores alone (cheaper on a skiplist).
    pub fn first_where_score(&self, pred: impl Fn(f64) -> bool) -> Option<usize> {
        match self {
            ZSet::Small(p) => p.iter().position(|(_, s, _)| pred(s)),
            ZSet::Big(b) => {
                let r = b.partition_point(|s, _| !pred(s));
                (r < b.len).then_some(r)
            }
        }
    }

    /// Rank of the last entry for which `pred` holds, searching from the tail; see
    /// `first_where` (here `pred` is expected true then false along the order).
    pub fn last_where(&self, pred: impl Fn(f64, &[u8]) -> bool) -> Option<usize> {
        match self {
            ZSet::Small(p) => {
                let all: Vec<(f64, &[u8])> = p.iter().map(|(_, s, m)| (s, m)).collect();
                all.iter().rposition(|(s, m)| pred(*s, m))
            }
            ZSet::Big(b) => b
                .partition_point(|s, id| pred(s, b.member(id)))
                .checked_sub(1),
        }
    }

    /// `last_where` for a predicate on scores alone.
    pub fn last_where_score(&self, pred: impl Fn(f64) -> bool) -> Option<usize> {
        match self {
            ZSet::Small(p) => {
                let all: Vec<f64> = p.iter().map(|(_, s, _)| s).collect();
                all.iter().rposition(|s| pred(*s))
            }
            ZSet::Big(b) => b.partition_point(|s, _| pred(s)).checked_sub(1),
        }
    }

    /// Calls `f` on the entries from rank `start`, towards the tail (or the head with
    /// `rev`), while it returns true.
    pub fn visit<'a>(&'a self, start: usize, rev: bool, mut f: impl FnMut(&'a [u8], f64) -> bool) {
        if start >= self.len() {
            return;
        }
        match self {
            ZSet::Small(p) => {
                if rev {
                    let all: Vec<(f64, &[u8])> = p.iter().map(|(_, s, m)| (s, m)).collect();
                    for (s, m) in all[..=start].iter().rev() {
                        if !f(m, *s) {
                            return;
                        }
                    }
                } else {
                    for (_, s, m) in p.iter().skip(start) {
                        if !f(m, s) {
                            return;
                        }
                    }
                }
            }
            ZSet::Big(b) => b.visit(start, rev, f),
        }
    }

    /// All entries in order.
    #[cfg(test)]
    pub fn entries(&self) -> Vec<(f64, Box<[u8]>)> {
        let mut v = Vec::with_capacity(self.len());
        self.visit(0, false, |m, s| {
            v.push((s, m.into()));
            true
        });
        v
    }

    /// Removes the entries of ranks `start..end`.
    pub fn remove_range(&mut self, start: usize, end: usize) {
        let end = end.min(self.len());
        if start >= end {
            return;
        }
        match self {
            ZSet::Small(p) => p.remove_range(start, end),
            ZSet::Big(b) => b.remove_range(start, end),
        }
    }

    /// Removes and returns the lowest (or with `max` the highest) entry.
    pub fn pop(&mut self, max: bool) -> Option<(Box<[u8]>, f64)> {
        if self.is_empty() {
            return None;
        }
        match self {
            ZSet::Small(p) => {
                let off = if max {
                    p.iter().last().expect("non-empty").0
                } else {
                    0
                };
                let (s, m, _) = p.entry_at(off);
                let m: Box<[u8]> = m.into();
                p.remove_at(off);
                Some((m, s))
            }
            ZSet::Big(b) => b.pop(max),
        }
    }

    /// One step of ZSCAN: calls `f` on some entries and returns the next cursor (0 when
    /// done). A listpack is returned whole at once, as Redis does; a skiplist is walked
    /// bucket by bucket of its hash table with Redis's reverse-binary cursor, until
    /// `count` entries or `10 * count` buckets.
    pub fn scan<'a>(&'a self, cursor: u64, count: usize, mut f: impl FnMut(&'a [u8], f64)) -> u64 {
        match self {
            ZSet::Small(p) => {
                for (_, s, m) in p.iter() {
                    f(m, s);
                }
                0
            }
            ZSet::Big(b) => b.scan(cursor, count, f),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The packed form
// ---------------------------------------------------------------------------------------

/// Entries back to back in order, each an 8-byte little-endian score, a length byte and
/// the member (at most 64 bytes while packed). The buffer is sized exactly, like a
/// listpack, since small sets are what there are millions of.
#[derive(Clone, Debug, Default)]
pub struct Packed {
    buf: Box<[u8]>,
    len: u8,
}

const HDR: usize = 9;

impl Packed {
    #[inline]
    fn entry_at(&self, off: usize) -> (f64, &[u8], usize) {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.buf[off..off + 8]);
        let ml = self.buf[off + 8] as usize;
        let start = off + HDR;
        (
            f64::from_le_bytes(b),
            &self.buf[start..start + ml],
            start + ml,
        )
    }

    /// (offset, score, member) of each entry in order.
    fn iter(&self) -> impl Iterator<Item = (usize, f64, &[u8])> + '_ {
        let mut off = 0;
        std::iter::from_fn(move || {
            if off >= self.buf.len() {
                return None;
            }
            let at = off;
            let (s, m, next) = self.entry_at(off);
            off = next;
            Some((at, s, m))
        })
    }

    /// (index, offset, score) of a member.
    fn find(&self, member: &[u8]) -> Option<(usize, usize, f64)> {
        self.iter()
            .enumerate()
            .find(|(_, (_, _, m))| *m == member)
            .map(|(i, (off, s, _))| (i, off, s))
    }

    fn encode(score: f64, member: &[u8]) -> impl Iterator<Item = u8> + '_ {
        debug_assert!(member.len() <= u8::MAX as usize);
        // A listpack keeps integral scores as integers, so -0 comes back as 0.
        let score = if score == 0.0 { 0.0 } else { score };
        score
            .to_le_bytes()
            .into_iter()
            .chain(std::iter::once(member.len() as u8))
            .chain(member.iter().copied())
    }

    /// Builds a packed set from entries already in order.
    fn from_sorted(entries: &[(f64, Box<[u8]>)]) -> Packed {
        let mut buf = Vec::with_capacity(entries.iter().map(|(_, m)| HDR + m.len()).sum());
        for (s, m) in entries {
            buf.extend(Self::encode(*s, m));
        }
        Packed {
            buf: buf.into_boxed_slice(),
            len: entries.len() as u8,
        }
    }

    fn edit(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        let mut v = std::mem::take(&mut self.buf).into_vec();
        f(&mut v);
        self.buf = v.into_boxed_slice();
    }

    fn insert(&mut self, score: f64, member: &[u8]) {
        let at = self
            .iter()
            .find(|(_, s, m)| cmp_entry(*s, m, score, member) == Ordering::Greater)
            .map_or(self.buf.len(), |(off, _, _)| off);
        self.edit(|v| {
            v.splice(at..at, Self::encode(score, member));
        });
        self.len += 1;
    }

    fn remove_at(&mut self, off: usize) {
        let (_, _, next) = self.entry_at(off);
        self.edit(|v| {
            v.drain(off..next);
        });
        self.len -= 1;
    }

    fn remove_range(&mut self, start: usize, end: usize) {
        let offs: Vec<usize> = self.iter().map(|(off, _, _)| off).collect();
        let from = offs[start];
        let to = offs.get(end).copied().unwrap_or(self.buf.len());
        self.edit(|v| {
            v.drain(from..to);
        });
        self.len -= (end - start) as u8;
    }
}

// ---------------------------------------------------------------------------------------
// The big form
// ---------------------------------------------------------------------------------------

const NIL: u32 = u32::MAX;
/// Most entries a block holds; a block that outgrows it splits in two.
const BLOCK_MAX: usize = 128;
/// A block this small merges with a neighbour when the two fit in `MERGE_MAX`.
const BLOCK_MIN: usize = 32;
const MERGE_MAX: usize = 96;

#[derive(Clone, Debug)]
struct Node {
    member: Box<[u8]>,
    score: f64,
    /// Next node in the hash chain, or in the free list for a free node.
    next: u32,
    /// Low 32 bits of the member's hash: picks the bucket (tables stay below 2^32
    /// buckets) and skips most byte comparisons along a chain.
    hash: u32,
}

/// A sorted run of (score, node) entries, never empty, with a copy of its last entry so
/// that a search over blocks reads one contiguous array.
#[derive(Clone, Debug)]
struct Block {
    last: (f64, u32),
    items: Vec<(f64, u32)>,
}

impl Block {
    fn new(items: Vec<(f64, u32)>) -> Block {
        Block {
            last: *items.last().expect("blocks are never empty"),
            items,
        }
    }

    /// Call after changing the items of a block that is not empty.
    fn refresh(&mut self) {
        if let Some(l) = self.items.last() {
            self.last = *l;
        }
    }
}

impl std::ops::Deref for Block {
    type Target = Vec<(f64, u32)>;
    fn deref(&self) -> &Vec<(f64, u32)> {
        &self.items
    }
}

impl std::ops::DerefMut for Block {
    fn deref_mut(&mut self) -> &mut Vec<(f64, u32)> {
        &mut self.items
    }
}

#[derive(Clone, Debug)]
pub struct Big {
    nodes: Vec<Node>,
    free: u32,
    /// Heads of the hash chains; a power of two long.
    buckets: Vec<u32>,
    hasher: hashbrown::DefaultHashBuilder,
    /// The order, in blocks.
    blocks: VecDeque<Block>,
    /// Fenwick tree over the block lengths (1-based), rebuilt on first use after the
    /// block list changes shape; kept up to date by point updates otherwise.
    fen: RefCell<Vec<u32>>,
    fen_ok: Cell<bool>,
    len: usize,
    /// Bytes of all live members, for `heap_size`.
    member_bytes: usize,
}

impl Big {
    fn new(cap: usize) -> Big {
        Big {
            nodes: Vec::with_capacity(cap.min(1 << 20)),
            free: NIL,
            buckets: vec![NIL; cap.clamp(4, 1 << 20).next_power_of_two()],
            hasher: hashbrown::DefaultHashBuilder::default(),
            blocks: VecDeque::new(),
            fen: RefCell::new(Vec::new()),
            fen_ok: Cell::new(false),
            len: 0,
            member_bytes: 0,
        }
    }

    fn from_sorted(entries: Vec<(f64, Box<[u8]>)>) -> Big {
        let mut b = Big::new(entries.len());
        let mut block = Vec::with_capacity(MERGE_MAX);
        for (score, member) in entries {
            let hash = b.hash(&member);
            let id = b.alloc(member, score, hash);
            b.link(id);
            block.push((score, id));
            if block.len() == MERGE_MAX {
                let full = std::mem::replace(&mut block, Vec::with_capacity(MERGE_MAX));
                b.blocks.push_back(Block::new(full));
            }
        }
        if !block.is_empty() {
            b.blocks.push_back(Block::new(block));
        }
        b.len = b.nodes.len();
        b.grow_if_needed();
        b
    }

    fn reserve(&mut self, cap: usize) {
        let want = cap.clamp(4, 1 << 30).next_power_of_two();
        if want > self.buckets.len() {
            self.rehash(want);
        }
    }

    fn heap_size(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.member_bytes
            + self.buckets.capacity() * 4
            + self.blocks.capacity() * std::mem::size_of::<Block>()
            + self.blocks.iter().map(|b| b.capacity() * 16).sum::<usize>()
            + self.fen.borrow().capacity() * 4
    }

    // ----- hash table -----

    #[inline]
    fn hash(&self, member: &[u8]) -> u32 {
        self.hasher.hash_one(member) as u32
    }

    #[inline]
    fn bucket_of(&self, hash: u32) -> usize {
        hash as usize & (self.buckets.len() - 1)
    }

    fn find(&self, member: &[u8]) -> Option<u32> {
        let h = self.hash(member);
        let mut id = self.buckets[self.bucket_of(h)];
        while id != NIL {
            let n = &self.nodes[id as usize];
            if n.hash == h && *n.member == *member {
                return Some(id);
            }
            id = n.next;
        }
        None
    }

    fn link(&mut self, id: u32) {
        let b = self.bucket_of(self.nodes[id as usize].hash);
        self.nodes[id as usize].next = self.buckets[b];
        self.buckets[b] = id;
    }

    fn unlink(&mut self, id: u32) {
        let b = self.bucket_of(self.nodes[id as usize].hash);
        let next = self.nodes[id as usize].next;
        if self.buckets[b] == id {
            self.buckets[b] = next;
            return;
        }
        let mut cur = self.buckets[b];
        while cur != NIL {
            let n = self.nodes[cur as usize].next;
            if n == id {
                self.nodes[cur as usize].next = next;
                return;
            }
            cur = n;
        }
        unreachable!("node missing from its hash chain");
    }

    fn alloc(&mut self, member: Box<[u8]>, score: f64, hash: u32) -> u32 {
        self.member_bytes += member.len();
        let node = Node {
            member,
            score,
            next: NIL,
            hash,
        };
        if self.free != NIL {
            let id = self.free;
            self.free = self.nodes[id as usize].next;
            self.nodes[id as usize] = node;
            id
        } else {
            assert!(self.nodes.len() < NIL as usize, "sorted set too large");
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        }
    }

    /// Unlinks a node from its chain and puts it on the free list; returns its member.
    fn release(&mut self, id: u32) -> Box<[u8]> {
        self.unlink(id);
        let n = &mut self.nodes[id as usize];
        let member = std::mem::take(&mut n.member);
        self.member_bytes -= member.len();
        n.next = self.free;
        self.free = id;
        member
    }

    /// Relinks every node into `nbuckets` chains. Buckets are picked by hash bits alone,
    /// so ZSCAN cursors stay meaningful across resizes, as Redis's do.
    fn rehash(&mut self, nbuckets: usize) {
        self.buckets = vec![NIL; nbuckets];
        let ids: Vec<u32> = self
            .blocks
            .iter()
            .flat_map(|b| b.iter())
            .map(|(_, id)| *id)
            .collect();
        for id in ids {
            self.link(id);
        }
    }

    fn grow_if_needed(&mut self) {
        if self.len > self.buckets.len() {
            self.rehash((self.len).next_power_of_two().max(self.buckets.len() * 2));
        }
    }

    /// After removals: shrinks the table below 1/8 use (Redis shrinks below 1/10) and
    /// compacts the arena once most of it is free.
    fn shrink_if_needed(&mut self) {
        if self.buckets.len() > 4 && self.len * 8 < self.buckets.len() {
            self.rehash(self.len.next_power_of_two().max(4));
        }
        if self.nodes.len() >= 64 && self.len * 2 < self.nodes.len() {
            self.compact();
        }
    }

    /// Moves the live nodes to the front of the arena, in order; the chains are rebuilt
    /// with the same bucket count, so scans in progress are unaffected.
    fn compact(&mut self) {
        let mut nodes = Vec::with_capacity(self.len);
        for block in self.blocks.iter_mut() {
            for e in block.iter_mut() {
                let n = &mut self.nodes[e.1 as usize];
                nodes.push(Node {
                    member: std::mem::take(&mut n.member),
                    score: n.score,
                    next: NIL,
                    hash: n.hash,
                });
                e.1 = (nodes.len() - 1) as u32;
            }
            block.refresh();
        }
        self.nodes = nodes;
        self.free = NIL;
        let n = self.buckets.len();
        self.rehash(n);
    }

    // ----- order -----

    #[inline]
    fn less(&self, e: (f64, u32), score: f64, member: &[u8]) -> bool {
        if e.0 != score {
            return e.0 < score;
        }
        self.member(e.1) < member
    }

    fn fen_build(&self) {
        if self.fen_ok.get() {
            return;
        }
        let n = self.blocks.len();
        let mut f = vec![0u32; n + 1];
        for i in 1..=n {
            f[i] += self.blocks[i - 1].len() as u32;
            let j = i + (i & i.wrapping_neg());
            if j <= n {
                f[j] += f[i];
            }
        }
        *self.fen.borrow_mut() = f;
        self.fen_ok.set(true);
    }

    fn fen_add(&self, bi: usize, delta: i32) {
        if !self.fen_ok.get() {
            return;
        }
        let mut f = self.fen.borrow_mut();
        let mut i = bi + 1;
        while i < f.len() {
            f[i] = (f[i] as i64 + delta as i64) as u32;
            i += i & i.wrapping_neg();
        }
    }

    fn shape_changed(&self) {
        self.fen_ok.set(false);
    }

    /// Entries in the blocks before block `bi`.
    fn prefix(&self, bi: usize) -> usize {
        self.fen_build();
        let f = self.fen.borrow();
        let mut i = bi;
        let mut sum = 0usize;
        while i > 0 {
            sum += f[i] as usize;
            i -= i & i.wrapping_neg();
        }
        sum
    }

    /// (block, position) of a rank below `len`.
    fn seek(&self, rank: usize) -> (usize, usize) {
        self.fen_build();
        let f = self.fen.borrow();
        let n = self.blocks.len();
        let mut pos = 0usize;
        let mut rem = rank;
        let mut step = if n == 0 {
            0
        } else {
            1 << (usize::BITS - 1 - n.leading_zeros())
        };
        while step > 0 {
            if pos + step <= n && (f[pos + step] as usize) <= rem {
                pos += step;
                rem -= f[pos] as usize;
            }
            step >>= 1;
        }
        (pos, rem)
    }

    #[inline]
    fn member(&self, id: u32) -> &[u8] {
        &self.nodes[id as usize].member
    }

    /// Number of leading entries for which `pred(score, node)` holds (it must hold on a
    /// prefix). Predicates on scores alone never touch the nodes.
    fn partition_point(&self, pred: impl Fn(f64, u32) -> bool) -> usize {
        let bi = self.blocks.partition_point(|b| pred(b.last.0, b.last.1));
        if bi == self.blocks.len() {
            return self.len;
        }
        let pos = self.blocks[bi].partition_point(|&(s, id)| pred(s, id));
        self.prefix(bi) + pos
    }

    /// Where (score, member) is or would go.
    fn locate(&self, score: f64, member: &[u8]) -> (usize, usize) {
        if self.blocks.is_empty() {
            return (0, 0);
        }
        let last = self.blocks.len() - 1;
        let bi = self
            .blocks
            .partition_point(|b| self.less(b.last, score, member));
        if bi > last {
            return (last, self.blocks[last].len());
        }
        let pos = self.blocks[bi].partition_point(|e| self.less(*e, score, member));
        (bi, pos)
    }

    fn order_insert(&mut self, score: f64, id: u32) {
        let (bi, pos) = {
            let member = &self.nodes[id as usize].member;
            self.locate(score, member)
        };
        if self.blocks.is_empty() {
            self.blocks.push_back(Block::new(vec![(score, id)]));
            self.shape_changed();
            return;
        }
        self.blocks[bi].insert(pos, (score, id));
        self.blocks[bi].refresh();
        self.fen_add(bi, 1);
        if self.blocks[bi].len() > BLOCK_MAX {
            let half = self.blocks[bi].len() / 2;
            let tail = self.blocks[bi].split_off(half);
            self.blocks[bi].refresh();
            self.blocks.insert(bi + 1, Block::new(tail));
            self.shape_changed();
        }
    }

    /// Removes the order entry at (bi, pos) and rebalances its block.
    fn order_remove_at(&mut self, bi: usize, pos: usize) -> (f64, u32) {
        let e = self.blocks[bi].remove(pos);
        self.blocks[bi].refresh();
        self.fen_add(bi, -1);
        self.fix_block(bi);
        e
    }

    fn fix_block(&mut self, bi: usize) {
        let len = self.blocks[bi].len();
        if len == 0 {
            self.blocks.remove(bi);
            self.shape_changed();
            return;
        }
        if len >= BLOCK_MIN {
            return;
        }
        if bi + 1 < self.blocks.len() && len + self.blocks[bi + 1].len() <= MERGE_MAX {
            let next = self.blocks.remove(bi + 1).expect("next block");
            self.blocks[bi].extend(next.items);
            self.blocks[bi].refresh();
            self.shape_changed();
        } else if bi > 0 && len + self.blocks[bi - 1].len() <= MERGE_MAX {
            let cur = self.blocks.remove(bi).expect("block");
            self.blocks[bi - 1].extend(cur.items);
            self.blocks[bi - 1].refresh();
            self.shape_changed();
        } else if self.blocks[bi].capacity() > 4 * len {
            self.blocks[bi].shrink_to(2 * len);
        }
    }

    fn insert(&mut self, member: &[u8], score: f64) {
        let hash = self.hash(member);
        let id = self.alloc(member.into(), score, hash);
        self.link(id);
        self.order_insert(score, id);
        self.len += 1;
        self.grow_if_needed();
    }

    fn set_score(&mut self, member: &[u8], old: f64, new: f64) {
        let id = self.find(member).expect("member present");
        let (bi, pos) = self.locate(old, member);
        self.order_remove_at(bi, pos);
        self.nodes[id as usize].score = new;
        self.order_insert(new, id);
    }

    fn remove(&mut self, member: &[u8]) -> Option<f64> {
        let id = self.find(member)?;
        let score = self.nodes[id as usize].score;
        let (bi, pos) = self.locate(score, member);
        self.order_remove_at(bi, pos);
        self.release(id);
        self.len -= 1;
        self.shrink_if_needed();
        Some(score)
    }

    fn rank(&self, member: &[u8]) -> Option<(usize, f64)> {
        let id = self.find(member)?;
        let score = self.nodes[id as usize].score;
        let (bi, pos) = self.locate(score, member);
        Some((self.prefix(bi) + pos, score))
    }

    fn visit<'a>(&'a self, start: usize, rev: bool, mut f: impl FnMut(&'a [u8], f64) -> bool) {
        let (mut bi, pos) = self.seek(start);
        if rev {
            for &(s, id) in self.blocks[bi][..=pos].iter().rev() {
                if !f(&self.nodes[id as usize].member, s) {
                    return;
                }
            }
            while bi > 0 {
                bi -= 1;
                for &(s, id) in self.blocks[bi].iter().rev() {
                    if !f(&self.nodes[id as usize].member, s) {
                        return;
                    }
                }
            }
        } else {
            let mut from = pos;
            while bi < self.blocks.len() {
                for &(s, id) in &self.blocks[bi][from..] {
                    if !f(&self.nodes[id as usize].member, s) {
                        return;
                    }
                }
                from = 0;
                bi += 1;
            }
        }
    }

    fn remove_range(&mut self, start: usize, end: usize) {
        let (mut bi, mut pos) = self.seek(start);
        let mut left = end - start;
        while left > 0 {
            let take = left.min(self.blocks[bi].len() - pos);
            let gone: Vec<(f64, u32)> = self.blocks[bi].drain(pos..pos + take).collect();
            self.blocks[bi].refresh();
            for (_, id) in gone {
                self.release(id);
            }
            left -= take;
            if self.blocks[bi].is_empty() {
                self.blocks.remove(bi);
            } else {
                bi += 1;
            }
            pos = 0;
        }
        self.shape_changed();
        self.len -= end - start;
        // The blocks on either side of the cut may be small now.
        if !self.blocks.is_empty() {
            let at = bi.min(self.blocks.len() - 1);
            self.fix_block(at);
            if at > 0 && at - 1 < self.blocks.len() {
                self.fix_block(at - 1);
            }
        }
        self.shrink_if_needed();
    }

    fn pop(&mut self, max: bool) -> Option<(Box<[u8]>, f64)> {
        if self.len == 0 {
            return None;
        }
        let bi = if max { self.blocks.len() - 1 } else { 0 };
        let pos = if max { self.blocks[bi].len() - 1 } else { 0 };
        let (score, id) = self.order_remove_at(bi, pos);
        let member = self.release(id);
        self.len -= 1;
        self.shrink_if_needed();
        Some((member, score))
    }

    fn scan<'a>(&'a self, cursor: u64, count: usize, mut f: impl FnMut(&'a [u8], f64)) -> u64 {
        let mask = (self.buckets.len() - 1) as u64;
        let mut v = cursor;
        let mut seen = 0usize;
        let mut budget = count.saturating_mul(10).max(1);
        loop {
            let mut id = self.buckets[(v & mask) as usize];
            while id != NIL {
                let n = &self.nodes[id as usize];
                f(&n.member, n.score);
                seen += 1;
                id = n.next;
            }
            // Increment the reversed cursor over the bits of the mask.
            v |= !mask;
            v = v.reverse_bits().wrapping_add(1).reverse_bits();
            budget -= 1;
            if v == 0 || budget == 0 || seen >= count {
                return v;
            }
        }
    }

    #[cfg(test)]
    fn check(&self) {
        assert_eq!(self.blocks.iter().map(|b| b.len()).sum::<usize>(), self.len);
        let bytes: usize = self
            .blocks
            .iter()
            .flat_map(|b| b.iter())
            .map(|(_, id)| self.nodes[*id as usize].member.len())
            .sum();
        assert_eq!(bytes, self.member_bytes);
        assert!(self
            .blocks
            .iter()
            .all(|b| !b.is_empty() && b.len() <= BLOCK_MAX));
        assert!(self
            .blocks
            .iter()
            .all(|b| b.last == *b.items.last().unwrap()));
        let all: Vec<(f64, u32)> = self.blocks.iter().flat_map(|b| b.iter()).copied().collect();
        for w in all.windows(2) {
            let (a, b) = (w[0], w[1]);
            assert!(self.less(a, b.0, &self.nodes[b.1 as usize].member));
        }
        for (s, id) in &all {
            let m = &self.nodes[*id as usize].member;
            assert_eq!(self.find(m), Some(*id));
            assert_eq!(self.nodes[*id as usize].score, *s);
        }
        for bi in 0..self.blocks.len() {
            let direct: usize = self.blocks.iter().take(bi).map(|b| b.len()).sum();
            assert_eq!(self.prefix(bi), direct);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap, HashSet};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// The model: member → score, and the sorted list derived from it.
    fn sorted(model: &HashMap<Vec<u8>, f64>) -> Vec<(f64, Vec<u8>)> {
        let mut v: Vec<(f64, Vec<u8>)> = model.iter().map(|(m, s)| (*s, m.clone())).collect();
        v.sort_by(|a, b| cmp_entry(a.0, &a.1, b.0, &b.1));
        v
    }

    fn check_against(z: &ZSet, model: &HashMap<Vec<u8>, f64>) {
        let want = sorted(model);
        assert_eq!(z.len(), want.len());
        let got: Vec<(f64, Vec<u8>)> = z
            .entries()
            .into_iter()
            .map(|(s, m)| (s, m.into_vec()))
            .collect();
        assert_eq!(got, want);
        if let ZSet::Big(b) = z {
            b.check();
        }
    }

    fn run_random(seed: u64, ops: usize, members: u64, long_every: u64) {
        let mut rng = Rng(seed);
        let mut z = ZSet::new();
        let mut model: HashMap<Vec<u8>, f64> = HashMap::new();
        for step in 0..ops {
            let m = if long_every > 0 && rng.below(long_every) == 0 {
                vec![b'L'; 70]
            } else {
                format!("m{}", rng.below(members)).into_bytes()
            };
            let score = (rng.below(50) as f64) - 25.0;
            match rng.below(10) {
                0..=4 => match z.score(&m) {
                    Some(old) => {
                        if old != score {
                            z.set_score(&m, old, score);
                        }
                        model.insert(m, if old != score { score } else { old });
                    }
                    None => {
                        z.insert(&m, score);
                        model.insert(m, score);
                    }
                },
                5 | 6 => {
                    assert_eq!(z.remove(&m), model.remove(&m));
                }
                7 => {
                    let want = model.is_empty().then_some(()).map_or_else(
                        || {
                            let s = sorted(&model);
                            let max = rng.below(2) == 0;
                            let e = if max { s.last() } else { s.first() }.cloned().unwrap();
                            Some((max, e))
                        },
                        |_| None,
                    );
                    if let Some((max, (s, mm))) = want {
                        let (pm, ps) = z.pop(max).unwrap();
                        assert_eq!((&*pm, ps), (&mm[..], s));
                        model.remove(&mm);
                    } else {
                        assert!(z.pop(false).is_none());
                    }
                }
                8 => {
                    let len = model.len();
                    if len > 0 {
                        let a = rng.below(len as u64) as usize;
                        let b = (a + rng.below(20) as usize).min(len);
                        let s = sorted(&model);
                        z.remove_range(a, b);
                        for (_, mm) in &s[a..b] {
                            model.remove(mm);
                        }
                    }
                }
                _ => {
                    let s = sorted(&model);
                    match model.get(&m) {
                        Some(sc) => {
                            let r = s.iter().position(|(_, x)| *x == m).unwrap();
                            assert_eq!(z.rank(&m), Some((r, *sc)));
                            assert_eq!(
                                z.get(r).map(|(a, b)| (a.to_vec(), b)),
                                Some((m.clone(), *sc))
                            );
                        }
                        None => assert_eq!(z.rank(&m), None),
                    }
                    let lo = score;
                    let first = s.iter().position(|(sc, _)| *sc >= lo);
                    assert_eq!(z.first_where(|sc, _| sc >= lo), first);
                    assert_eq!(z.first_where_score(|sc| sc >= lo), first);
                    let last = s.iter().rposition(|(sc, _)| *sc <= lo);
                    assert_eq!(z.last_where(|sc, _| sc <= lo), last);
                    assert_eq!(z.last_where_score(|sc| sc <= lo), last);
                    if let Some((mm, sc)) = z.get(0) {
                        assert_eq!((mm.to_vec(), sc), (s[0].1.clone(), s[0].0));
                    }
                    if let Some((mm, sc)) = z.get(s.len().saturating_sub(1)) {
                        let l = s.last().unwrap();
                        assert_eq!((mm.to_vec(), sc), (l.1.clone(), l.0));
                    }
                }
            }
            if step % 97 == 0 {
                check_against(&z, &model);
            }
        }
        check_against(&z, &model);
    }

    #[test]
    fn small_sets_match_a_model() {
        run_random(1, 3000, 40, 0);
    }

    #[test]
    fn big_sets_match_a_model() {
        run_random(2, 20000, 2000, 0);
        run_random(3, 20000, 300, 0);
    }

    #[test]
    fn long_members_force_a_skiplist() {
        run_random(4, 3000, 30, 50);
    }

    #[test]
    fn encodings_follow_redis_limits() {
        let mut z = ZSet::new();
        for i in 0..128 {
            z.insert(format!("{i}").as_bytes(), i as f64);
        }
        assert_eq!(z.encoding(), "listpack");
        z.insert(b"x", 0.0);
        assert_eq!(z.encoding(), "skiplist");
        let mut z = ZSet::new();
        z.insert(&[b'a'; 64], 1.0);
        assert_eq!(z.encoding(), "listpack");
        z.insert(&[b'a'; 65], 1.0);
        assert_eq!(z.encoding(), "skiplist");
        assert_eq!(ZSet::with_hint(129, 1).encoding(), "skiplist");
        assert_eq!(ZSet::with_hint(128, 65).encoding(), "skiplist");
        assert_eq!(ZSet::with_hint(128, 64).encoding(), "listpack");
        let e: Vec<(f64, Box<[u8]>)> = (0..10)
            .map(|i| (i as f64, format!("{i}").into_bytes().into()))
            .collect();
        assert_eq!(ZSet::from_sorted(e).encoding(), "listpack");
    }

    #[test]
    fn a_small_set_is_two_words_and_its_bytes() {
        assert!(std::mem::size_of::<ZSet>() <= 24);
        let mut z = ZSet::new();
        z.insert(b"job:1", 1.0);
        z.insert(b"job:2", 2.0);
        assert_eq!(z.heap_size(), 2 * (9 + 5));
    }

    #[test]
    fn zero_and_negative_zero_tie_on_member() {
        let mut z = ZSet::new();
        z.insert(b"b", -0.0);
        z.insert(b"a", 0.0);
        assert_eq!(z.rank(b"a"), Some((0, 0.0)));
        assert_eq!(z.rank(b"b").map(|r| r.0), Some(1));
    }

    #[test]
    fn scan_returns_every_stable_member_across_resizes() {
        let mut z = ZSet::new();
        for i in 0..1000 {
            z.insert(format!("s{i}").as_bytes(), i as f64);
        }
        let stable: HashSet<Vec<u8>> = (0..1000).map(|i| format!("s{i}").into_bytes()).collect();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut cursor = 0;
        let mut round = 0;
        loop {
            cursor = z.scan(cursor, 10, |m, _| {
                seen.insert(m.to_vec());
            });
            // Grow and shrink the table while the scan runs.
            round += 1;
            if round % 3 == 0 {
                for j in 0..500 {
                    z.insert(format!("t{round}-{j}").as_bytes(), 1.0);
                }
            } else if round % 3 == 1 {
                let extra: Vec<Vec<u8>> = z
                    .entries()
                    .into_iter()
                    .filter(|(_, m)| m.starts_with(b"t"))
                    .map(|(_, m)| m.into_vec())
                    .collect();
                for m in extra {
                    z.remove(&m);
                }
            }
            if cursor == 0 {
                break;
            }
        }
        assert!(stable.is_subset(&seen));
    }

    #[test]
    fn popping_the_head_of_a_big_queue_stays_ordered() {
        let mut z = ZSet::new();
        let mut model: BTreeMap<u64, ()> = BTreeMap::new();
        let mut next = 0u64;
        for round in 0..200 {
            for _ in 0..50 {
                z.insert(format!("job{next:08}").as_bytes(), next as f64);
                model.insert(next, ());
                next += 1;
            }
            for _ in 0..(if round % 2 == 0 { 30 } else { 60 }) {
                let want = model.keys().next().copied();
                match want {
                    Some(k) => {
                        let (m, s) = z.pop(false).unwrap();
                        assert_eq!(s, k as f64);
                        assert_eq!(&*m, format!("job{k:08}").as_bytes());
                        model.remove(&k);
                    }
                    None => assert!(z.pop(false).is_none()),
                }
            }
        }
        if let ZSet::Big(b) = &z {
            b.check();
        }
        assert_eq!(z.len(), model.len());
    }
}
