//! The stream value.
//!
//! Entries live in nodes keyed by the id of the first entry added to them, the way Redis
//! keeps a radix tree of listpacks: a node takes entries until it holds
//! `NODE_MAX_ENTRIES` (counting deleted ones) or its Redis listpack would reach
//! `NODE_MAX_BYTES`, so nodes start and end where Redis's do and `MAXLEN ~` / `MINID ~`
//! trim the same whole nodes. Inside a node the entries are packed one after the other:
//! id deltas and lengths as varints, and the field names left out when they equal those of
//! the node's first entry (BullMQ's event entries all share their names). A deleted entry
//! is cut out of its node at once; only its count is kept, because Redis still counts it
//! against the node's capacity.
//!
//! Consumer groups keep their pending entries list (PEL) in a sorted map, and each
//! consumer the ids it owns; a pending entry names its consumer by a slot number.

use std::collections::{btree_map, BTreeMap, BTreeSet};
use std::fmt;

use crate::types::value::parse_canonical_i64;

/// Redis's default `stream-node-max-entries`.
pub const NODE_MAX_ENTRIES: usize = 100;
/// Redis's default `stream-node-max-bytes`.
pub const NODE_MAX_BYTES: usize = 4096;
/// The most field and value bytes one entry may carry (Redis's listpack limit).
pub const ENTRY_MAX_BYTES: usize = 1 << 30;
/// `entries_read` of a group whose position in the stream's history is unknown.
pub const UNKNOWN_READ: i64 = -1;

/// An entry id: milliseconds and a sequence number, ordered as a pair.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    pub const MIN: StreamId = StreamId { ms: 0, seq: 0 };
    pub const MAX: StreamId = StreamId {
        ms: u64::MAX,
        seq: u64::MAX,
    };

    pub const fn new(ms: u64, seq: u64) -> StreamId {
        StreamId { ms, seq }
    }

    pub fn is_zero(&self) -> bool {
        self.ms == 0 && self.seq == 0
    }

    /// The id right after this one; None after the last possible id.
    pub fn next(self) -> Option<StreamId> {
        if self.seq < u64::MAX {
            Some(StreamId::new(self.ms, self.seq + 1))
        } else if self.ms < u64::MAX {
            Some(StreamId::new(self.ms + 1, 0))
        } else {
            None
        }
    }

    /// The id right before this one; None before 0-0.
    pub fn prev(self) -> Option<StreamId> {
        if self.seq > 0 {
            Some(StreamId::new(self.ms, self.seq - 1))
        } else if self.ms > 0 {
            Some(StreamId::new(self.ms - 1, u64::MAX))
        } else {
            None
        }
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

// ---------------------------------------------------------------------------
// Packing helpers
// ---------------------------------------------------------------------------

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn get_varint(buf: &[u8], pos: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = buf[*pos];
        *pos += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            return v;
        }
        shift += 7;
    }
}

fn get_slice<'a>(buf: &'a [u8], pos: &mut usize) -> &'a [u8] {
    let len = get_varint(buf, pos) as usize;
    let s = &buf[*pos..*pos + len];
    *pos += len;
    s
}

/// Bytes Redis's listpack spends on an integer element.
fn lp_int_size(v: i64) -> usize {
    let enc = if (0..=127).contains(&v) {
        1
    } else if (-4096..=4095).contains(&v) {
        2
    } else if (i16::MIN as i64..=i16::MAX as i64).contains(&v) {
        3
    } else if (-(1 << 23)..(1 << 23)).contains(&v) {
        4
    } else if (i32::MIN as i64..=i32::MAX as i64).contains(&v) {
        5
    } else {
        9
    };
    enc + 1
}

/// Bytes Redis's listpack spends on a string element (integers are stored as integers).
fn lp_str_size(s: &[u8]) -> usize {
    if let Some(v) = parse_canonical_i64(s) {
        return lp_int_size(v);
    }
    let len = s.len();
    let entry = len
        + if len < 64 {
            1
        } else if len < 4096 {
            2
        } else {
            5
        };
    let back = if entry < 128 {
        1
    } else if entry < 16384 {
        2
    } else if entry < 2_097_152 {
        3
    } else if entry < 268_435_456 {
        4
    } else {
        5
    };
    entry + back
}

// ---------------------------------------------------------------------------
// Nodes and entries
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Node {
    /// Field names of the node's first entry: a count, then length-prefixed names.
    fields: Box<[u8]>,
    /// Entries: ms delta, seq, `pairs << 1 | same_fields`, then the length-prefixed
    /// values (same fields) or field/value pairs.
    data: Vec<u8>,
    live: u16,
    /// Entries deleted from the node; they still count against its capacity.
    deleted: u16,
    /// The size Redis's listpack for this node would have, which decides where nodes end.
    lp_bytes: u32,
    /// The last id ever appended to the node, deleted or not.
    last: StreamId,
}

/// One entry read from a node.
#[derive(Clone, Copy)]
pub struct EntryRef<'a> {
    pub id: StreamId,
    pairs: usize,
    same: bool,
    /// The node's field names, past their count.
    master: &'a [u8],
    /// This entry's values or pairs.
    body: &'a [u8],
}

impl<'a> EntryRef<'a> {
    /// The number of field/value pairs.
    pub fn pair_count(&self) -> usize {
        self.pairs
    }

    /// The field/value pairs in the order they were added.
    pub fn pairs(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let (master, body, same) = (self.master, self.body, self.same);
        let (mut mpos, mut bpos) = (0, 0);
        (0..self.pairs).map(move |_| {
            let field = if same {
                get_slice(master, &mut mpos)
            } else {
                get_slice(body, &mut bpos)
            };
            let value = get_slice(body, &mut bpos);
            (field, value)
        })
    }
}

impl Node {
    fn master_fields(&self) -> &[u8] {
        let mut pos = 0;
        get_varint(&self.fields, &mut pos);
        &self.fields[pos..]
    }

    /// Decodes the entry at `pos`; returns it and the position after it.
    fn entry_at<'a>(&'a self, master_id: StreamId, pos: usize) -> (EntryRef<'a>, usize) {
        let data = &self.data;
        let mut p = pos;
        let ms = master_id.ms + get_varint(data, &mut p);
        let seq = get_varint(data, &mut p);
        let header = get_varint(data, &mut p);
        let pairs = (header >> 1) as usize;
        let same = header & 1 == 1;
        let body_start = p;
        for _ in 0..(if same { pairs } else { pairs * 2 }) {
            let len = get_varint(data, &mut p) as usize;
            p += len;
        }
        let e = EntryRef {
            id: StreamId::new(ms, seq),
            pairs,
            same,
            master: self.master_fields(),
            body: &data[body_start..p],
        };
        (e, p)
    }

    /// Start offsets of the live entries, in order.
    fn offsets(&self, master_id: StreamId) -> Vec<usize> {
        let mut v = Vec::with_capacity(self.live as usize);
        let mut pos = 0;
        while pos < self.data.len() {
            v.push(pos);
            pos = self.entry_at(master_id, pos).1;
        }
        v
    }

    fn same_fields<A: AsRef<[u8]>>(&self, pairs: &[A]) -> bool {
        let mut pos = 0;
        let n = get_varint(&self.fields, &mut pos) as usize;
        if n * 2 != pairs.len() {
            return false;
        }
        pairs
            .iter()
            .step_by(2)
            .all(|f| get_slice(&self.fields, &mut pos) == f.as_ref())
    }

    fn new<A: AsRef<[u8]>>(pairs: &[A]) -> Node {
        let mut fields = Vec::new();
        put_varint(&mut fields, (pairs.len() / 2) as u64);
        // Header and terminator, then the master entry: live and deleted counts, the
        // number of fields, the names and a zero terminator.
        let mut lp = 7 + 2 + 2 + lp_int_size((pairs.len() / 2) as i64) + 2;
        for f in pairs.iter().step_by(2) {
            put_varint(&mut fields, f.as_ref().len() as u64);
            fields.extend_from_slice(f.as_ref());
            lp += lp_str_size(f.as_ref());
        }
        Node {
            fields: fields.into_boxed_slice(),
            data: Vec::new(),
            live: 0,
            deleted: 0,
            lp_bytes: lp as u32,
            last: StreamId::MIN,
        }
    }

    fn push<A: AsRef<[u8]>>(&mut self, master_id: StreamId, id: StreamId, pairs: &[A]) {
        let same = self.same_fields(pairs);
        let n = pairs.len() / 2;
        put_varint(&mut self.data, id.ms - master_id.ms);
        put_varint(&mut self.data, id.seq);
        put_varint(&mut self.data, ((n as u64) << 1) | same as u64);
        let mut lp = 2
            + lp_int_size(id.ms.wrapping_sub(master_id.ms) as i64)
            + lp_int_size(id.seq.wrapping_sub(master_id.seq) as i64);
        let mut lp_count = n + 3;
        if !same {
            lp += lp_int_size(n as i64);
            lp_count += n + 1;
        }
        for (i, a) in pairs.iter().enumerate() {
            let a = a.as_ref();
            if same && i % 2 == 0 {
                continue;
            }
            put_varint(&mut self.data, a.len() as u64);
            self.data.extend_from_slice(a);
            lp += lp_str_size(a);
        }
        lp += lp_int_size(lp_count as i64);
        self.lp_bytes = self.lp_bytes.saturating_add(lp as u32);
        self.live += 1;
        self.last = id;
    }

    fn heap_size(&self) -> usize {
        self.fields.len() + self.data.capacity() + std::mem::size_of::<Node>() + 16
    }
}

// ---------------------------------------------------------------------------
// The entry log
// ---------------------------------------------------------------------------

/// How XADD and XTRIM trim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trim {
    MaxLen(u64),
    MinId(StreamId),
}

/// A stream's entries and the counters Redis keeps with them.
#[derive(Clone, Debug, Default)]
pub struct Log {
    nodes: BTreeMap<StreamId, Node>,
    length: u64,
    /// The last id handed out (XADD) or set (XSETID); entries never go below it.
    pub last_id: StreamId,
    /// The first live entry's id when the last change was made (0-0 when empty).
    pub first_id: StreamId,
    /// The greatest id ever deleted with XDEL (or set by XSETID).
    pub max_deleted: StreamId,
    /// Entries ever added (or as set by XSETID).
    pub entries_added: u64,
}

impl Log {
    pub fn len(&self) -> u64 {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The number of nodes (XINFO's radix-tree-keys).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The nodes a radix tree over the node keys would have (XINFO's radix-tree-nodes):
    /// Redis's compressed radix tree, counted on its canonical shape.
    pub fn radix_nodes(&self) -> usize {
        let keys: Vec<[u8; 16]> = self
            .nodes
            .keys()
            .map(|id| {
                let mut k = [0u8; 16];
                k[..8].copy_from_slice(&id.ms.to_be_bytes());
                k[8..].copy_from_slice(&id.seq.to_be_bytes());
                k
            })
            .collect();
        if keys.is_empty() {
            return 1;
        }
        fn count(keys: &[[u8; 16]], depth: usize) -> usize {
            if keys.len() == 1 {
                return if depth == 16 { 1 } else { 2 };
            }
            let (first, last) = (&keys[0], &keys[keys.len() - 1]);
            let mut common = depth;
            while common < 16 && first[common] == last[common] {
                common += 1;
            }
            let prefix = usize::from(common > depth);
            let mut total = prefix + 1;
            let mut i = 0;
            while i < keys.len() {
                let b = keys[i][common];
                let mut j = i;
                while j < keys.len() && keys[j][common] == b {
                    j += 1;
                }
                total += count(&keys[i..j], common + 1);
                i = j;
            }
            total
        }
        count(&keys, 0)
    }

    /// Checks the size limit of one entry before it is added.
    pub fn entry_fits<A: AsRef<[u8]>>(pairs: &[A]) -> bool {
        pairs.iter().map(|a| a.as_ref().len()).sum::<usize>() <= ENTRY_MAX_BYTES
    }

    /// Appends an entry; `id` must be greater than `last_id` and `pairs` a flat list of
    /// fields and values.
    pub fn append<A: AsRef<[u8]>>(&mut self, id: StreamId, pairs: &[A]) {
        debug_assert!(id > self.last_id || self.nodes.is_empty());
        let total: usize = pairs.iter().map(|a| a.as_ref().len()).sum();
        let fits = match self.nodes.iter_mut().next_back() {
            None => false,
            Some((_, node)) => {
                let fits = node.lp_bytes as usize + total < NODE_MAX_BYTES
                    && ((node.live + node.deleted) as usize) < NODE_MAX_ENTRIES;
                if !fits {
                    // The node is full: give back what growth reserved, as Redis does.
                    node.data.shrink_to_fit();
                }
                fits
            }
        };
        if fits {
            let (&master, node) = self.nodes.iter_mut().next_back().expect("last node");
            node.push(master, id, pairs);
        } else {
            let mut node = Node::new(pairs);
            node.push(id, id, pairs);
            self.nodes.insert(id, node);
        }
        self.length += 1;
        self.entries_added += 1;
        self.last_id = id;
        if self.length == 1 {
            self.first_id = id;
        }
    }

    /// The node holding `id`, if any could: the last node starting at or before it.
    fn node_for(&self, id: StreamId) -> Option<(StreamId, &Node)> {
        self.nodes.range(..=id).next_back().map(|(k, n)| (*k, n))
    }

    /// The entry with id `id`.
    pub fn get(&self, id: StreamId) -> Option<EntryRef<'_>> {
        let (master, node) = self.node_for(id)?;
        let mut pos = 0;
        while pos < node.data.len() {
            let (e, next) = node.entry_at(master, pos);
            if e.id == id {
                return Some(e);
            }
            if e.id > id {
                return None;
            }
            pos = next;
        }
        None
    }

    /// Removes one entry; its node goes when it holds no live entry any more.
    fn remove_entry(&mut self, id: StreamId) -> bool {
        let Some((&master, _)) = self.nodes.range(..=id).next_back() else {
            return false;
        };
        let node = self.nodes.get_mut(&master).expect("node");
        let mut pos = 0;
        let mut found = None;
        while pos < node.data.len() {
            let (e, next) = node.entry_at(master, pos);
            if e.id == id {
                found = Some((pos, next));
                break;
            }
            if e.id > id {
                break;
            }
            pos = next;
        }
        let Some((a, b)) = found else {
            return false;
        };
        node.data.drain(a..b);
        node.live -= 1;
        node.deleted += 1;
        if node.live == 0 {
            self.nodes.remove(&master);
        }
        self.length -= 1;
        true
    }

    /// XDEL: removes the entries that exist, records the greatest deleted id and moves the
    /// first id on. Returns how many were removed.
    pub fn delete(&mut self, ids: &[StreamId]) -> u64 {
        let mut deleted = 0;
        let mut first_gone = false;
        for &id in ids {
            if self.remove_entry(id) {
                if id == self.first_id {
                    first_gone = true;
                }
                if id > self.max_deleted {
                    self.max_deleted = id;
                }
                deleted += 1;
            }
        }
        if deleted > 0 {
            if self.length == 0 {
                self.first_id = StreamId::MIN;
            } else if first_gone {
                self.first_id = self.first_entry_id().unwrap_or(StreamId::MIN);
            }
        }
        deleted
    }

    /// Trims from the oldest end. Whole nodes go first; `approx` stops at the first node
    /// that cannot go whole, otherwise that node loses the entries it must. `limit`
    /// (0: none) caps the entries removed, counted in whole nodes.
    pub fn trim(&mut self, how: Trim, approx: bool, limit: u64) -> u64 {
        let mut deleted = 0u64;
        while let Some((&master, node)) = self.nodes.iter_mut().next() {
            if let Trim::MaxLen(max) = how {
                if self.length <= max {
                    break;
                }
            }
            let entries = node.live as u64;
            if limit > 0 && deleted + entries > limit {
                break;
            }
            let whole = match how {
                Trim::MaxLen(max) => self.length - entries >= max,
                Trim::MinId(min) => node.last < min,
            };
            if whole {
                self.nodes.remove(&master);
                self.length -= entries;
                deleted += entries;
                continue;
            }
            if approx {
                break;
            }
            let mut pos = 0;
            let mut removed = 0u64;
            while pos < node.data.len() {
                let stop = match how {
                    Trim::MaxLen(max) => self.length - removed <= max,
                    Trim::MinId(min) => node.entry_at(master, pos).0.id >= min,
                };
                if stop {
                    break;
                }
                pos = node.entry_at(master, pos).1;
                removed += 1;
            }
            // Like Redis, a node emptied here stays (it can only happen with MINID when
            // the node's last id was deleted before).
            node.data.drain(..pos);
            node.live -= removed as u16;
            node.deleted += removed as u16;
            self.length -= removed;
            deleted += removed;
            break;
        }
        self.first_id = if self.length == 0 {
            StreamId::MIN
        } else {
            self.first_entry_id().unwrap_or(StreamId::MIN)
        };
        deleted
    }

    /// The id of the first live entry.
    pub fn first_entry_id(&self) -> Option<StreamId> {
        self.range(StreamId::MIN, StreamId::MAX)
            .next()
            .map(|e| e.id)
    }

    /// The id of the last live entry (not `last_id`, which may have been deleted).
    pub fn last_entry_id(&self) -> Option<StreamId> {
        self.range_rev(StreamId::MIN, StreamId::MAX)
            .next()
            .map(|e| e.id)
    }

    pub fn first_entry(&self) -> Option<EntryRef<'_>> {
        self.range(StreamId::MIN, StreamId::MAX).next()
    }

    pub fn last_entry(&self) -> Option<EntryRef<'_>> {
        self.range_rev(StreamId::MIN, StreamId::MAX).next()
    }

    /// Entries with `start <= id <= end`, oldest first.
    pub fn range(&self, start: StreamId, end: StreamId) -> Range<'_> {
        let from = self.node_for(start).map_or(start, |(k, _)| k);
        Range {
            nodes: if start <= end {
                Some(self.nodes.range(from..))
            } else {
                None
            },
            start,
            end,
            cur: None,
        }
    }

    /// Entries with `start <= id <= end`, newest first.
    pub fn range_rev(&self, start: StreamId, end: StreamId) -> RangeRev<'_> {
        RangeRev {
            nodes: if start <= end {
                Some(self.nodes.range(..=end))
            } else {
                None
            },
            start,
            end,
            cur: None,
        }
    }

    /// Whether an XDEL tombstone may lie at or after `start`.
    pub fn has_tombstones_from(&self, start: StreamId) -> bool {
        if self.length == 0 || self.max_deleted.is_zero() {
            return false;
        }
        start <= self.max_deleted
    }

    /// How many entries came before and at `id` since the stream began (a group's
    /// `entries_read` at that id), or `UNKNOWN_READ` when deletions make it unknowable.
    pub fn entries_read_at(&self, id: StreamId) -> i64 {
        if self.entries_added == 0 {
            return 0;
        }
        if self.length == 0 && id <= self.last_id {
            return self.entries_added as i64;
        }
        if !id.is_zero() && id < self.max_deleted {
            return UNKNOWN_READ;
        }
        if id == self.last_id {
            return self.entries_added as i64;
        }
        if id > self.last_id {
            return UNKNOWN_READ;
        }
        if self.max_deleted.is_zero() || self.max_deleted < self.first_id {
            if id < self.first_id {
                return (self.entries_added - self.length) as i64;
            }
            if id == self.first_id {
                return (self.entries_added - self.length + 1) as i64;
            }
        }
        UNKNOWN_READ
    }

    /// The lag of a group: entries not yet delivered to it, when it can be known.
    pub fn lag(&self, group: &Group) -> Option<i64> {
        if self.entries_added == 0 || self.length == 0 {
            return Some(0);
        }
        if group.last_id < self.first_id && self.max_deleted < self.first_id {
            return Some(self.length as i64);
        }
        if group.entries_read != UNKNOWN_READ && !self.has_tombstones_from(group.last_id) {
            return Some(self.entries_added as i64 - group.entries_read);
        }
        match self.entries_read_at(group.last_id) {
            UNKNOWN_READ => None,
            read => Some(self.entries_added as i64 - read),
        }
    }

    fn heap_size(&self) -> usize {
        self.nodes.values().map(Node::heap_size).sum()
    }
}

/// Entries in ascending id order.
pub struct Range<'a> {
    nodes: Option<btree_map::Range<'a, StreamId, Node>>,
    start: StreamId,
    end: StreamId,
    cur: Option<(StreamId, &'a Node, usize)>,
}

impl<'a> Iterator for Range<'a> {
    type Item = EntryRef<'a>;

    fn next(&mut self) -> Option<EntryRef<'a>> {
        loop {
            if let Some((master, node, pos)) = self.cur.as_mut() {
                if *pos < node.data.len() {
                    let (e, next) = node.entry_at(*master, *pos);
                    *pos = next;
                    if e.id > self.end {
                        self.nodes = None;
                        self.cur = None;
                        return None;
                    }
                    if e.id >= self.start {
                        return Some(e);
                    }
                    continue;
                }
            }
            let (k, n) = self.nodes.as_mut()?.next()?;
            if *k > self.end {
                self.nodes = None;
                return None;
            }
            self.cur = Some((*k, n, 0));
        }
    }
}

/// Entries in descending id order.
pub struct RangeRev<'a> {
    nodes: Option<btree_map::Range<'a, StreamId, Node>>,
    start: StreamId,
    end: StreamId,
    cur: Option<(StreamId, &'a Node, Vec<usize>)>,
}

impl<'a> Iterator for RangeRev<'a> {
    type Item = EntryRef<'a>;

    fn next(&mut self) -> Option<EntryRef<'a>> {
        loop {
            if let Some((master, node, offsets)) = self.cur.as_mut() {
                if let Some(pos) = offsets.pop() {
                    let (e, _) = node.entry_at(*master, pos);
                    if e.id < self.start {
                        self.nodes = None;
                        self.cur = None;
                        return None;
                    }
                    if e.id <= self.end {
                        return Some(e);
                    }
                    continue;
                }
            }
            let (k, n) = self.nodes.as_mut()?.next_back()?;
            if n.last < self.start {
                self.nodes = None;
                return None;
            }
            self.cur = Some((*k, n, n.offsets(*k)));
        }
    }
}

// ---------------------------------------------------------------------------
// Consumer groups
// ---------------------------------------------------------------------------

/// A delivered entry not yet acknowledged.
#[derive(Clone, Copy, Debug)]
pub struct Nack {
    /// Unix time in ms of the last delivery.
    pub delivery_time: i64,
    pub delivery_count: u64,
    /// The owning consumer's slot in its group.
    pub consumer: u32,
}

#[derive(Clone, Debug)]
pub struct Consumer {
    pub name: Box<[u8]>,
    /// Last attempted interaction (read or claim), unix ms.
    pub seen_time: i64,
    /// Last successful interaction, unix ms; -1 before the first.
    pub active_time: i64,
    pub pel: BTreeSet<StreamId>,
}

#[derive(Clone, Debug)]
pub struct Group {
    pub last_id: StreamId,
    /// Entries the group has read since the stream began, or `UNKNOWN_READ`.
    pub entries_read: i64,
    pub pel: BTreeMap<StreamId, Nack>,
    slots: Vec<Option<Consumer>>,
    free: Vec<u32>,
    names: BTreeMap<Box<[u8]>, u32>,
}

impl Group {
    pub fn new(last_id: StreamId, entries_read: i64) -> Group {
        Group {
            last_id,
            entries_read,
            pel: BTreeMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            names: BTreeMap::new(),
        }
    }

    pub fn consumer_count(&self) -> usize {
        self.names.len()
    }

    pub fn find(&self, name: &[u8]) -> Option<u32> {
        self.names.get(name).copied()
    }

    pub fn consumer(&self, slot: u32) -> &Consumer {
        self.slots[slot as usize].as_ref().expect("live consumer")
    }

    pub fn consumer_mut(&mut self, slot: u32) -> &mut Consumer {
        self.slots[slot as usize].as_mut().expect("live consumer")
    }

    /// The consumer named `name`, created if missing (then the bool is true).
    pub fn get_or_create(&mut self, name: &[u8], now: i64) -> (u32, bool) {
        if let Some(slot) = self.find(name) {
            return (slot, false);
        }
        let c = Consumer {
            name: name.into(),
            seen_time: now,
            active_time: -1,
            pel: BTreeSet::new(),
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(c);
                s
            }
            None => {
                self.slots.push(Some(c));
                (self.slots.len() - 1) as u32
            }
        };
        self.names.insert(name.into(), slot);
        (slot, true)
    }

    /// Deletes a consumer and its pending entries; returns how many it had, or None.
    pub fn delete_consumer(&mut self, name: &[u8]) -> Option<usize> {
        let slot = self.names.remove(name)?;
        let c = self.slots[slot as usize].take().expect("live consumer");
        for id in &c.pel {
            self.pel.remove(id);
        }
        self.free.push(slot);
        Some(c.pel.len())
    }

    /// Consumers in name order.
    pub fn consumers(&self) -> impl Iterator<Item = &Consumer> {
        self.names.values().map(|&s| self.consumer(s))
    }

    pub fn consumer_name(&self, slot: u32) -> &[u8] {
        &self.consumer(slot).name
    }

    /// Removes a pending entry from the group and its consumer.
    pub fn ack(&mut self, id: StreamId) -> bool {
        match self.pel.remove(&id) {
            None => false,
            Some(n) => {
                self.consumer_mut(n.consumer).pel.remove(&id);
                true
            }
        }
    }

    /// Gives pending entry `id` (created if missing) to consumer `slot`, with the
    /// delivery time and count `update` computes from the old values.
    pub fn assign(
        &mut self,
        id: StreamId,
        slot: u32,
        update: impl FnOnce(Option<&Nack>) -> (i64, u64),
    ) {
        let old = self.pel.get(&id).copied();
        let (time, count) = update(old.as_ref());
        if let Some(o) = old {
            if o.consumer != slot {
                self.consumer_mut(o.consumer).pel.remove(&id);
            }
        }
        self.pel.insert(
            id,
            Nack {
                delivery_time: time,
                delivery_count: count,
                consumer: slot,
            },
        );
        self.consumer_mut(slot).pel.insert(id);
    }

    fn heap_size(&self) -> usize {
        let names: usize = self.names.keys().map(|k| 2 * k.len() + 96).sum();
        self.pel.len() * 48
            + self.consumers().map(|c| c.pel.len() * 24).sum::<usize>()
            + names
            + self.slots.capacity() * std::mem::size_of::<Option<Consumer>>()
    }
}

// ---------------------------------------------------------------------------
// The stream
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
pub struct Stream {
    pub log: Log,
    /// Consumer groups by name, in byte order (the order XINFO lists them in).
    pub groups: BTreeMap<Box<[u8]>, Group>,
}

impl Stream {
    pub fn new() -> Stream {
        Stream::default()
    }

    pub fn encoding(&self) -> &'static str {
        "stream"
    }

    pub fn heap_size(&self) -> usize {
        self.log.heap_size()
            + self
                .groups
                .iter()
                .map(|(k, g)| k.len() + 64 + g.heap_size())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ms: u64, seq: u64) -> StreamId {
        StreamId::new(ms, seq)
    }

    fn ids(log: &Log) -> Vec<StreamId> {
        log.range(StreamId::MIN, StreamId::MAX)
            .map(|e| e.id)
            .collect()
    }

    fn add(log: &mut Log, ms: u64, seq: u64, pairs: &[&str]) {
        log.append(id(ms, seq), pairs);
    }

    #[test]
    fn ids_step_and_print() {
        assert_eq!(id(1, 5).next(), Some(id(1, 6)));
        assert_eq!(id(1, u64::MAX).next(), Some(id(2, 0)));
        assert_eq!(StreamId::MAX.next(), None);
        assert_eq!(id(2, 0).prev(), Some(id(1, u64::MAX)));
        assert_eq!(StreamId::MIN.prev(), None);
        assert_eq!(id(12, 3).to_string(), "12-3");
    }

    #[test]
    fn entries_keep_their_fields_in_order() {
        let mut log = Log::default();
        add(&mut log, 1, 0, &["a", "1", "b", "2"]);
        add(&mut log, 2, 0, &["a", "3", "b", "4"]);
        add(&mut log, 3, 7, &["x", "", "y", "long value", "z", "9"]);
        type Pairs = Vec<(Vec<u8>, Vec<u8>)>;
        let all: Vec<(StreamId, Pairs)> = log
            .range(StreamId::MIN, StreamId::MAX)
            .map(|e| {
                (
                    e.id,
                    e.pairs().map(|(f, v)| (f.to_vec(), v.to_vec())).collect(),
                )
            })
            .collect();
        assert_eq!(all.len(), 3);
        assert_eq!(all[1].1[1], (b"b".to_vec(), b"4".to_vec()));
        assert_eq!(all[2].0, id(3, 7));
        assert_eq!(all[2].1[1], (b"y".to_vec(), b"long value".to_vec()));
        assert_eq!(log.get(id(2, 0)).unwrap().pair_count(), 2);
        assert!(log.get(id(2, 1)).is_none());
        let rev: Vec<StreamId> = log.range_rev(id(1, 5), id(3, 0)).map(|e| e.id).collect();
        assert_eq!(rev, vec![id(2, 0)]);
    }

    #[test]
    fn nodes_split_like_redis() {
        let mut log = Log::default();
        for i in 1..=250 {
            add(&mut log, i, 0, &["f", "v"]);
        }
        assert_eq!(log.node_count(), 3);
        assert_eq!(log.len(), 250);
        // Big entries fill a node by bytes long before its entry count.
        let mut big = Log::default();
        let v = "x".repeat(1000);
        for i in 1..=8 {
            big.append(id(i, 0), &["f", v.as_str()]);
        }
        assert_eq!(big.node_count(), 2);
        assert_eq!(big.radix_nodes(), 6);
        assert_eq!(ids(&big).len(), 8);
        assert_eq!(log.radix_nodes(), 8);
        // Mixed names and sizes: the node and radix counts Redis 7 reports for the same
        // commands.
        let mut mix = Log::default();
        for i in 1..200u64 {
            let f = format!("field{}", i % 3);
            let v = "y".repeat(60 + (i % 12) as usize);
            let n = (i * 1000).to_string();
            mix.append(id(i, 0), &[f.as_str(), v.as_str(), "n", n.as_str()]);
        }
        assert_eq!(mix.node_count(), 5);
        assert_eq!(mix.radix_nodes(), 12);
    }

    #[test]
    fn ranges_cross_nodes_both_ways() {
        let mut log = Log::default();
        for i in 1..=350 {
            add(&mut log, i, 0, &["f", "v"]);
        }
        let fwd: Vec<u64> = log.range(id(95, 0), id(205, 0)).map(|e| e.id.ms).collect();
        assert_eq!(fwd, (95..=205).collect::<Vec<_>>());
        let rev: Vec<u64> = log
            .range_rev(id(95, 0), id(205, 0))
            .map(|e| e.id.ms)
            .collect();
        assert_eq!(rev, (95..=205).rev().collect::<Vec<_>>());
        assert_eq!(log.range(id(9, 0), id(8, 0)).count(), 0);
        assert_eq!(log.range_rev(id(400, 0), StreamId::MAX).count(), 0);
    }

    #[test]
    fn delete_tracks_first_and_max_deleted() {
        let mut log = Log::default();
        for i in 1..=5 {
            add(&mut log, i, 0, &["f", "v"]);
        }
        assert_eq!(log.delete(&[id(1, 0), id(3, 0), id(9, 0)]), 2);
        assert_eq!(log.first_id, id(2, 0));
        assert_eq!(log.max_deleted, id(3, 0));
        assert_eq!(ids(&log), vec![id(2, 0), id(4, 0), id(5, 0)]);
        assert_eq!(log.delete(&[id(2, 0), id(4, 0), id(5, 0)]), 3);
        assert_eq!(log.first_id, StreamId::MIN);
        assert_eq!(log.node_count(), 0);
        assert_eq!(log.entries_added, 5);
    }

    #[test]
    fn exact_and_approximate_trimming() {
        let mut log = Log::default();
        for i in 1..=250 {
            add(&mut log, i, 0, &["f", "v"]);
        }
        // ~ only drops whole nodes and never goes below the threshold.
        assert_eq!(log.trim(Trim::MaxLen(200), true, 0), 0);
        assert_eq!(log.trim(Trim::MaxLen(150), true, 0), 100);
        assert_eq!(log.len(), 150);
        assert_eq!(log.first_id, id(101, 0));
        assert_eq!(log.trim(Trim::MaxLen(120), false, 0), 30);
        assert_eq!(log.first_id, id(131, 0));
        assert_eq!(log.trim(Trim::MinId(id(140, 0)), false, 0), 9);
        assert_eq!(log.first_id, id(140, 0));
        // The partly trimmed node still counts its removed entries.
        assert_eq!(log.node_count(), 2);
        assert_eq!(log.trim(Trim::MinId(id(210, 0)), true, 0), 61);
        assert_eq!(log.trim(Trim::MaxLen(0), true, 10), 0);
        assert_eq!(log.trim(Trim::MaxLen(0), false, 0), 50);
        assert!(log.is_empty());
        assert_eq!(log.first_id, StreamId::MIN);
    }

    #[test]
    fn read_counters_follow_redis_rules() {
        let mut log = Log::default();
        let g = Group::new(StreamId::MIN, UNKNOWN_READ);
        assert_eq!(log.lag(&g), Some(0));
        for i in 1..=4 {
            add(&mut log, i, 0, &["f", "v"]);
        }
        assert_eq!(log.entries_read_at(id(4, 0)), 4);
        assert_eq!(log.entries_read_at(id(1, 0)), 1);
        assert_eq!(log.entries_read_at(id(0, 5)), 0);
        assert_eq!(log.entries_read_at(id(2, 0)), UNKNOWN_READ);
        assert_eq!(log.lag(&g), Some(4));
        let mut g2 = Group::new(id(2, 0), 2);
        assert_eq!(log.lag(&g2), Some(2));
        log.delete(&[id(3, 0)]);
        assert!(log.has_tombstones_from(id(2, 0)));
        assert_eq!(log.lag(&g2), None);
        g2.last_id = id(4, 0);
        g2.entries_read = 4;
        assert_eq!(log.lag(&g2), Some(0));
    }

    #[test]
    fn groups_move_pending_entries_between_consumers() {
        let mut g = Group::new(StreamId::MIN, 0);
        let (a, created) = g.get_or_create(b"alice", 10);
        assert!(created);
        let (b, _) = g.get_or_create(b"bob", 10);
        assert_eq!(g.get_or_create(b"alice", 11), (a, false));
        g.assign(id(1, 0), a, |_| (10, 1));
        g.assign(id(2, 0), a, |_| (10, 1));
        g.assign(id(1, 0), b, |old| (20, old.unwrap().delivery_count + 1));
        assert_eq!(g.consumer(a).pel.len(), 1);
        assert_eq!(g.consumer(b).pel.len(), 1);
        assert_eq!(g.pel[&id(1, 0)].delivery_count, 2);
        assert!(g.ack(id(2, 0)));
        assert!(!g.ack(id(2, 0)));
        assert_eq!(g.delete_consumer(b"bob"), Some(1));
        assert!(g.pel.is_empty());
        let (c, _) = g.get_or_create(b"carol", 30);
        assert_eq!(c, b);
        let names: Vec<&[u8]> = g.consumers().map(|c| &c.name[..]).collect();
        assert_eq!(names, vec![&b"alice"[..], &b"carol"[..]]);
    }

    #[test]
    fn listpack_sizes() {
        assert_eq!(lp_int_size(5), 2);
        assert_eq!(lp_int_size(-1), 3);
        assert_eq!(lp_int_size(1 << 40), 10);
        assert_eq!(lp_str_size(b"hello"), 7);
        assert_eq!(lp_str_size(b"123"), 2);
        assert_eq!(lp_str_size(b"1234"), 3);
        assert_eq!(lp_str_size(&[b'a'; 100]), 103);
    }

    #[test]
    fn radix_node_counts() {
        let mut log = Log::default();
        assert_eq!(log.radix_nodes(), 1);
        add(&mut log, 5, 0, &["a", "1"]);
        assert_eq!(log.radix_nodes(), 2);
    }
}
