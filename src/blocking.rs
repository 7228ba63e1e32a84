//! Blocking commands: waiters, claim tokens, wake-ups.
//!
//! A blocked call registers one waiter on every shard holding one of its keys, all sharing
//! one claim token. A shard serves a waiter only after winning the token, and takes the
//! element in the same step, so a waiter is served exactly once; the other registrations
//! are dropped when found claimed and cleaned up by the blocked connection. The blocked
//! connection itself wins the token to time out, to be unblocked, or when its client
//! leaves; if it loses, a delivery is on its way (and is undone when the client is gone).
//!
//! A key with waiters that gains elements is marked ready; ready keys are served when the
//! command, transaction or script that changed them ends, oldest waiter first, while the
//! key still holds something.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hashbrown::HashMap;
use tokio::sync::mpsc;

use crate::commands::streams::{self, ReadFrom};
use crate::commands::{lists, zsets};
use crate::net::stream_io;
use crate::protocol::reply::Reply;
use crate::server::session::Session;
use crate::shard::{hop, hop_send, Shard, Worker};
use crate::types::value::WRONGTYPE;

/// What a key holds for a waiter.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Data {
    Ready,
    Empty,
    /// Another type: the call fails with WRONGTYPE when it starts.
    WrongType,
}

/// A blocking command as the machinery needs it: its keys in argument order, what it
/// takes, and how long it waits (None: for ever).
pub struct BlockCall {
    pub keys: Vec<Bytes>,
    /// Set when the keys are these arguments, in order, and `keys` is left empty: a
    /// BRPOP over hundreds of keys does not copy each one.
    pub keys_at: Option<std::ops::Range<usize>>,
    pub op: BlockOp,
    pub timeout: Option<Duration>,
}

/// What a blocked call does with a key once it holds something.
#[derive(Clone, Debug)]
pub enum BlockOp {
    /// BLPOP / BRPOP: one element, replied as `[key, element]`.
    ListPop { left: bool },
    /// BLMPOP: up to `count` elements, replied as `[key, [elements]]`.
    ListMultiPop { left: bool, count: usize },
    /// BLMOVE / BRPOPLPUSH with the destination on another shard: the source's shard
    /// pops, the destination's shard pushes and answers the client, and the command that
    /// filled the source waits for that (and whatever it sets off) before it answers.
    ListMoveAcross {
        from_left: bool,
        to_left: bool,
        dst: Bytes,
    },
    /// BLMOVE / BRPOPLPUSH with the destination on the same shard.
    ListMove {
        from_left: bool,
        to_left: bool,
        dst: Bytes,
    },
    /// BZPOPMIN/BZPOPMAX (`[key, member, score]`) and BZMPOP (`[key, [[member, score]...]]`).
    ZPop {
        max: bool,
        count: usize,
        multi: bool,
    },
    /// XREAD / XREADGROUP BLOCK: where each stream's read starts (`$` already resolved).
    XRead {
        reads: Vec<(Bytes, ReadFrom)>,
        group: Option<(Bytes, Bytes)>,
        count: usize,
        noack: bool,
    },
}

/// An element taken for a client that turned out to be gone: put it back.
#[derive(Debug)]
pub enum Undo {
    ListPush {
        db: usize,
        key: Bytes,
        left: bool,
        values: Vec<Box<[u8]>>,
    },
    ZAdd {
        db: usize,
        key: Bytes,
        items: zsets::Popped,
    },
}

pub struct Delivery {
    pub reply: BytesMut,
    pub undo: Option<Undo>,
}

/// Where a blocked call's result goes: its connection's channel, completed on the
/// connection's own thread (through that thread's mailbox when served from another), so
/// serving a client does not wake its thread when that thread is busy anyway.
#[derive(Clone)]
pub struct Deliver {
    tx: mpsc::UnboundedSender<Delivery>,
    home: usize,
}

impl Deliver {
    /// Hands `d` over. On the connection's own thread, a delivery its client can no
    /// longer take comes back to the caller; sent from another thread, its element is put
    /// back on its key's shard.
    fn send(&self, shared: &crate::shard::Shared, d: Delivery) -> Option<Delivery> {
        if crate::shard::current_thread() == Some(self.home) {
            return self.tx.send(d).err().map(|e| e.0);
        }
        let tx = self.tx.clone();
        shared.send(
            self.home,
            Box::new(move |w| {
                if let Err(mpsc::error::SendError(d)) = tx.send(d) {
                    if let Some(undo) = d.undo {
                        undo_on_its_shard(w, undo);
                    }
                }
            }),
        );
        None
    }
}

/// Puts back an element taken for a client that left, on the shard of its key, and
/// serves whoever waits there now.
fn undo_on_its_shard(w: &Rc<Worker>, undo: Undo) {
    let target = match &undo {
        Undo::ListPush { key, .. } | Undo::ZAdd { key, .. } => w.shard_of(key),
    };
    let put_back = move |w: &Rc<Worker>| {
        apply_undo(&mut w.shard.borrow_mut(), undo);
        serve_ready(w);
    };
    if target == w.id {
        put_back(w);
    } else {
        w.shared.send(target, Box::new(put_back));
    }
}

/// One blocked call as one shard sees it.
pub struct Waiter {
    pub claim: Arc<AtomicBool>,
    pub db: usize,
    pub op: Arc<BlockOp>,
    pub resp3: bool,
    pub deliver: Deliver,
}

/// A (database, key) a client waits on. Looked up by `(usize, &[u8])` without copying
/// the key: pushes check for waiters on every write.
#[derive(Clone, PartialEq, Eq, Hash)]
struct WaitKey {
    db: usize,
    key: Bytes,
}

impl hashbrown::Equivalent<WaitKey> for (usize, &[u8]) {
    fn equivalent(&self, k: &WaitKey) -> bool {
        self.0 == k.db && self.1 == &k.key[..]
    }
}

/// An unordered set of keys, as a wait group knows it: two sums of seeded hashes of its
/// keys (so the order they are named in does not matter) and their count. Two sets with
/// equal fingerprints are taken to be the same set, without comparing keys: two hashes
/// under secret seeds drawn at start-up (`key_hashes`), so sets not chosen against those
/// seeds collide with probability about 2^-128 (docs/event-loop.md).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct SetPrint {
    a: u64,
    b: u64,
    n: u32,
}

impl SetPrint {
    pub fn add(&mut self, key: &[u8]) {
        let (a, b) = key_hashes(key);
        self.a = self.a.wrapping_add(a);
        self.b = self.b.wrapping_add(b);
        self.n += 1;
    }
}

/// Two independent seeded 64-bit hashes of `key`, in one pass over its bytes: foldhash's
/// step (a 64x64->128-bit multiply whose halves are folded together by xor) run in two
/// lanes with their own secret seeds. Every BRPOP over a known key set hashes each of its
/// keys for the fingerprint; two calls of foldhash per key cost about 110 instructions,
/// twice this, because each call also builds its hasher, hashes the length as a word of
/// its own and finishes alone.
fn key_hashes(key: &[u8]) -> (u64, u64) {
    static SEEDS: std::sync::OnceLock<[u64; 6]> = std::sync::OnceLock::new();
    let s = SEEDS.get_or_init(|| {
        use std::hash::BuildHasher;
        // std's RandomState is keyed from the operating system's randomness.
        let random = std::collections::hash_map::RandomState::new();
        std::array::from_fn(|i| random.hash_one(i as u64))
    });
    #[inline(always)]
    fn fold(x: u64, y: u64) -> u64 {
        let p = u128::from(x) * u128::from(y);
        (p as u64) ^ ((p >> 64) as u64)
    }
    #[inline(always)]
    fn word(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
    }
    #[inline(always)]
    fn half(b: &[u8], at: usize) -> u64 {
        u64::from(u32::from_le_bytes(
            b[at..at + 4].try_into().expect("four bytes"),
        ))
    }
    let len = key.len();
    let (mut a, mut b) = (s[0] ^ len as u64, s[1] ^ len as u64);
    let mut mix = |lo: u64, hi: u64| {
        a = fold(lo ^ s[2], hi ^ a);
        b = fold(lo ^ s[3], hi ^ b);
    };
    // With the length in the lanes' start, the words below determine the key: short keys
    // are read as two overlapping words that cover every byte, longer ones by 16 bytes
    // and a last 16 that may overlap the one before.
    match len {
        0 => mix(0, 0),
        1..=3 => mix(
            u64::from(key[0]) << 16 | u64::from(key[len / 2]) << 8 | u64::from(key[len - 1]),
            0,
        ),
        4..=7 => mix(half(key, 0), half(key, len - 4)),
        8..=16 => mix(word(key, 0), word(key, len - 8)),
        _ => {
            let mut at = 0;
            while at + 16 < len {
                mix(word(key, at), word(key, at + 8));
                at += 16;
            }
            mix(word(key, len - 16), word(key, len - 8));
        }
    }
    (fold(a, s[4]), fold(b, s[5]))
}

type SlotId = u32;

/// An entry of a key's order: a group naming the key, with a stamp no later than the
/// group's first registration (`BlockTable::fronts`), and the group's generation, which
/// moves on each time the group empties (and when its number is reused): an entry of an
/// older generation is dead.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Front {
    stamp: u64,
    group: u32,
    gen: u32,
}

/// A waited key: the groups with registrations that name it, and what is known of it.
struct KeySlot {
    db: usize,
    key: Bytes,
    /// Groups naming this key; the slot lives while one does.
    groups: u32,
    /// Every group naming this key that holds registrations, in stamp order. Stamps are
    /// lower bounds, brought up to date when they reach the front (the entry moves back
    /// to its place), and entries of a generation the group left (it emptied) are
    /// dropped there: a group's queue changing touches none of its keys' orders, except
    /// to enter all of them, at the back, when it stops being empty.
    order: VecDeque<Front>,
    /// The key may hold something: raised by every write that can give it elements
    /// (`mark_ready`), lowered when a blocking call finds it does not exist.
    hint: bool,
}

/// What a shard remembers of one unordered key set blocked on before: the slots of its
/// keys, and the calls blocked on it now, so that a call blocking on the same set again
/// registers once, whatever the number of keys.
struct Group {
    db: usize,
    print: SetPrint,
    /// The slots of the set's keys, each once.
    slots: Rc<[SlotId]>,
    /// Registrations in blocking order, each with its stamp (`BlockTable::next_stamp`).
    queue: VecDeque<(u64, Rc<Waiter>)>,
    /// Used since the eviction hand last passed (a clock, approximating LRU).
    used: bool,
    /// When queue metrics last heard of these keys being blocked on.
    observed_ms: u64,
}

/// Groups a shard keeps, and the keys they name in all (a group keeps a slot for each of
/// its keys, waited on or not); past either, the least recently used idle ones give way.
const MAX_GROUPS: usize = 4096;
const MAX_GROUP_KEYS: usize = 1 << 18;
/// How often a known group's keys are reported to queue metrics as blocked on.
const OBSERVE_EVERY_MS: u64 = 1000;
/// `BlockTable::fronts` of a group with no registration.
const NO_FRONT: u64 = u64::MAX;

/// A blocked call is registered once per shard, in the wait group of its part's key set
/// (found by the set's fingerprint), whatever the number of keys. A key that gains
/// elements serves, among the groups naming it, the registration with the least stamp:
/// stamps come from one counter, so that is the call blocked first. Each key keeps a
/// sorted list of its groups' first stamps, updated lazily (`KeySlot::order`). Registrations
/// are removed lazily too: a served, timed-out or departed call leaves its entry behind,
/// dropped when met at its group's front, and a periodic compaction bounds the dead ones.
pub struct BlockTable {
    index: HashMap<WaitKey, SlotId>,
    slots: Vec<Option<KeySlot>>,
    free_slots: Vec<SlotId>,
    groups: HashMap<(usize, SetPrint), usize>,
    group_slab: Vec<Option<Group>>,
    free_groups: Vec<usize>,
    /// The stamp at the front of each group's queue (`NO_FRONT` when empty), and each
    /// group number's generation, by group number.
    fronts: Vec<u64>,
    gens: Vec<u32>,
    next_stamp: u64,
    /// The clock hand of group eviction.
    hand: usize,
    /// Keys named by the groups, counted once per group.
    group_keys: usize,
    /// Groups holding registrations, live or dead.
    busy_groups: usize,
    /// Keys with waiters that gained elements, served when the current command ends.
    ready: Vec<(usize, Bytes)>,
    /// Registrations held in the queues, and entries held in the keys' orders, live or
    /// dead, and the counts that trigger the next compaction.
    entries: usize,
    compact_at: usize,
    order_entries: usize,
    order_compact_at: usize,
    /// Registrations made since start (INFO `blocking_registrations`): what a blocked
    /// call costs this table, however many keys it names.
    pub registrations: u64,
}

const MIN_COMPACT_AT: usize = 4096;

impl Default for BlockTable {
    fn default() -> Self {
        BlockTable {
            index: HashMap::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            groups: HashMap::new(),
            group_slab: Vec::new(),
            free_groups: Vec::new(),
            fronts: Vec::new(),
            gens: Vec::new(),
            next_stamp: 1,
            hand: 0,
            group_keys: 0,
            busy_groups: 0,
            ready: Vec::new(),
            entries: 0,
            compact_at: MIN_COMPACT_AT,
            order_entries: 0,
            order_compact_at: MIN_COMPACT_AT,
            registrations: 0,
        }
    }
}

fn claimed(w: &Waiter) -> bool {
    w.claim.load(Ordering::Acquire)
}

/// Live registrations per waited key at one moment (`BlockTable::live_counts`).
pub struct LiveCounts<'a> {
    table: &'a BlockTable,
    per_slot: Vec<u32>,
}

impl LiveCounts<'_> {
    /// Clients blocked on `key`, as `BlockTable::live_waiters` counts them.
    pub fn on_key(&self, db: usize, key: &[u8]) -> usize {
        self.table
            .index
            .get(&(db, key))
            .map_or(0, |&id| self.per_slot[id as usize] as usize)
    }
}

/// What the front of a key's order says.
enum Top {
    /// Nothing: no group with registrations names the key.
    Empty,
    /// The entry's group is gone, or has no registration any more.
    Stale,
    /// The entry's stamp is older than its group's front now: the front to put there.
    Behind(u64),
    /// The least stamp of all.
    Current(Front),
}

impl BlockTable {
    /// Whether any client waits on any key here.
    #[inline]
    pub fn waits_any(&self) -> bool {
        !self.index.is_empty()
    }

    #[inline]
    pub fn is_waited(&self, db: usize, key: &[u8]) -> bool {
        !self.index.is_empty() && self.index.contains_key(&(db, key))
    }

    fn slot(&self, id: SlotId) -> &KeySlot {
        self.slots[id as usize].as_ref().expect("live slot")
    }

    fn slot_mut(&mut self, id: SlotId) -> &mut KeySlot {
        self.slots[id as usize].as_mut().expect("live slot")
    }

    fn group(&self, g: usize) -> &Group {
        self.group_slab[g].as_ref().expect("live group")
    }

    fn group_mut(&mut self, g: usize) -> &mut Group {
        self.group_slab[g].as_mut().expect("live group")
    }

    /// The group an entry names, if it is still the group the entry was made for.
    fn group_of(&self, f: &Front) -> Option<&Group> {
        let g = f.group as usize;
        if self.gens[g] != f.gen {
            return None;
        }
        self.group_slab[g].as_ref()
    }

    pub fn mark_ready(&mut self, db: usize, key: &[u8]) {
        if self.index.is_empty() {
            return;
        }
        let Some(&id) = self.index.get(&(db, key)) else {
            return;
        };
        let slot = self.slots[id as usize].as_mut().expect("live slot");
        slot.hint = true;
        if !slot.order.is_empty() && !self.ready.iter().any(|(d, k)| *d == db && k == key) {
            self.ready.push((db, slot.key.clone()));
        }
    }

    /// Marks every waited key of `db` ready (FLUSHDB, SWAPDB: readers of a stream that
    /// went away must hear about it).
    pub fn mark_db_ready(&mut self, db: usize) {
        let keys: Vec<Bytes> = self
            .slots
            .iter()
            .flatten()
            .filter(|s| s.db == db)
            .map(|s| s.key.clone())
            .collect();
        for k in keys {
            self.mark_ready(db, &k);
        }
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The groups with registrations naming a key: those its order holds, still theirs.
    fn groups_on<'a>(&'a self, slot: &'a KeySlot) -> impl Iterator<Item = &'a Group> + 'a {
        slot.order.iter().filter_map(|f| self.group_of(f))
    }

    /// Clients blocked on `key` now (queue metrics' consumers). Each group naming the
    /// key is looked through; for many keys at once, `live_counts` looks through each
    /// group once instead.
    pub fn live_waiters(&self, db: usize, key: &[u8]) -> usize {
        self.index.get(&(db, key)).map_or(0, |&id| {
            self.groups_on(self.slot(id))
                .map(|g| g.queue.iter().filter(|(_, w)| !claimed(w)).count())
                .sum()
        })
    }

    /// Whether some client is blocked on `key` now: stops at the first one.
    pub fn has_live_waiter(&self, db: usize, key: &[u8]) -> bool {
        self.index.get(&(db, key)).is_some_and(|&id| {
            self.groups_on(self.slot(id))
                .any(|g| g.queue.iter().any(|(_, w)| !claimed(w)))
        })
    }

    /// Live registrations per waited key, counted by going through each group once, for
    /// `LiveCounts::on_key`. A report over every queue asked `live_waiters` per key,
    /// which looked through a group's queue once for each key it names: with a thousand
    /// consumers on the same 234 keys, 234 000 claim flags read, each a likely miss, for
    /// one INFO. A group holding registrations has an entry in each of its keys' orders,
    /// so adding its count to each of its keys counts what `live_waiters` counts.
    pub fn live_counts(&self) -> LiveCounts<'_> {
        let mut per_slot = vec![0u32; self.slots.len()];
        for g in self.group_slab.iter().flatten() {
            let live = g.queue.iter().filter(|(_, w)| !claimed(w)).count() as u32;
            if live > 0 {
                for &id in g.slots.iter() {
                    per_slot[id as usize] += live;
                }
            }
        }
        LiveCounts {
            table: self,
            per_slot,
        }
    }

    /// Keys some client is blocked on (INFO's total_blocking_keys). Each group's queue is
    /// looked through once, not once per key it names.
    pub fn keys_count(&self) -> usize {
        let live: Vec<bool> = self
            .group_slab
            .iter()
            .map(|g| {
                g.as_ref()
                    .is_some_and(|g| g.queue.iter().any(|(_, w)| !claimed(w)))
            })
            .collect();
        self.slots
            .iter()
            .flatten()
            .filter(|s| {
                s.order
                    .iter()
                    .any(|f| self.group_of(f).is_some() && live[f.group as usize])
            })
            .count()
    }

    /// The slot of `(db, key)`, made if the key was not waited on. A new slot's hint is
    /// raised: nothing is known of the key yet.
    fn slot_for(&mut self, db: usize, key: &[u8]) -> SlotId {
        if let Some(&id) = self.index.get(&(db, key)) {
            return id;
        }
        let key = Bytes::copy_from_slice(key);
        let slot = KeySlot {
            db,
            key: key.clone(),
            groups: 0,
            order: VecDeque::new(),
            hint: true,
        };
        let id = match self.free_slots.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(slot);
                id
            }
            None => {
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as SlotId
            }
        };
        self.index.insert(WaitKey { db, key }, id);
        id
    }

    /// Drops a slot no group names any more (with whatever its order still held).
    fn release_slot_if_unused(&mut self, id: SlotId) {
        if self.slot(id).groups > 0 {
            return;
        }
        let slot = self.slots[id as usize].take().expect("live slot");
        self.order_entries -= slot.order.len();
        self.index.remove(&(slot.db, &slot.key[..]));
        self.free_slots.push(id);
    }

    /// The wait group known by `print`, if this shard still has it.
    fn known_group(&mut self, db: usize, print: SetPrint) -> Option<usize> {
        let g = *self.groups.get(&(db, print))?;
        self.group_mut(g).used = true;
        Some(g)
    }

    /// The wait group of `keys` (this shard's part of a call, any order) and whether it
    /// was just made; makes it if new, giving way to the least recently used idle ones
    /// when full.
    fn group_for(&mut self, db: usize, print: SetPrint, keys: &KeyList) -> (usize, bool) {
        if let Some(g) = self.known_group(db, print) {
            return (g, false);
        }
        // The caps bound groups holding no registration: those holding some are bounded
        // by the clients blocked, and are never dropped, so past the caps with none idle
        // the table grows.
        while self.groups.len() > self.busy_groups
            && (self.groups.len() >= MAX_GROUPS || self.group_keys + keys.len() > MAX_GROUP_KEYS)
        {
            if !self.evict_group() {
                break;
            }
        }
        let mut slots: Vec<SlotId> = keys.iter().map(|k| self.slot_for(db, k)).collect();
        // A key named twice is one slot, listed once.
        slots.sort_unstable();
        slots.dedup();
        for &id in &slots {
            self.slot_mut(id).groups += 1;
        }
        self.group_keys += slots.len();
        let group = Group {
            db,
            print,
            slots: slots.into(),
            queue: VecDeque::new(),
            used: true,
            observed_ms: 0,
        };
        let g = match self.free_groups.pop() {
            Some(g) => {
                self.group_slab[g] = Some(group);
                g
            }
            None => {
                self.group_slab.push(Some(group));
                self.fronts.push(NO_FRONT);
                self.gens.push(0);
                self.group_slab.len() - 1
            }
        };
        self.fronts[g] = NO_FRONT;
        self.groups.insert((db, print), g);
        (g, true)
    }

    /// Drops one group not used since the hand last passed it and holding no live
    /// registration; false when a whole turn of the clock found none. Its entries in its
    /// keys' orders are left to be dropped when met: its generation moves on.
    fn evict_group(&mut self) -> bool {
        for _ in 0..2 * self.group_slab.len() + 1 {
            if self.hand >= self.group_slab.len() {
                self.hand = 0;
            }
            let g = self.hand;
            self.hand += 1;
            let Some(group) = self.group_slab[g].as_mut() else {
                continue;
            };
            if group.used {
                group.used = false;
                continue;
            }
            // Dead registrations at the front go (each once): a group holding only those
            // is idle.
            if !group.queue.is_empty() {
                let before = group.queue.len();
                while group.queue.front().is_some_and(|(_, w)| claimed(w)) {
                    group.queue.pop_front();
                }
                let dropped = before - group.queue.len();
                if dropped > 0 {
                    self.entries -= dropped;
                    self.set_front(g);
                }
                if !self.group(g).queue.is_empty() {
                    continue;
                }
            }
            let group = self.group_slab[g].take().expect("live group");
            self.groups.remove(&(group.db, group.print));
            self.free_groups.push(g);
            self.fronts[g] = NO_FRONT;
            self.gens[g] = self.gens[g].wrapping_add(1);
            self.group_keys -= group.slots.len();
            for &id in group.slots.iter() {
                self.slot_mut(id).groups -= 1;
                self.release_slot_if_unused(id);
            }
            return true;
        }
        false
    }

    /// Puts `g`'s front stamp in `fronts`, after its queue changed.
    fn set_front(&mut self, g: usize) {
        let front = self.group(g).queue.front().map_or(NO_FRONT, |e| e.0);
        let was = std::mem::replace(&mut self.fronts[g], front);
        match (was == NO_FRONT, front == NO_FRONT) {
            (true, false) => {
                self.busy_groups += 1;
                self.enter_orders(g);
            }
            (false, true) => {
                self.busy_groups -= 1;
                // Its entries in its keys' orders are dropped when met, in constant time,
                // rather than each moved back there: a consumer alone in its set empties
                // its group on every call, and blocking again it enters at the back.
                self.gens[g] = self.gens[g].wrapping_add(1);
            }
            _ => {}
        }
    }

    /// Puts group `g`, whose queue just stopped being empty, at the back of each of its
    /// keys' orders: its first stamp is the latest there, and its generation is new, so
    /// none lists it yet.
    fn enter_orders(&mut self, g: usize) {
        let entry = Front {
            stamp: self.fronts[g],
            group: g as u32,
            gen: self.gens[g],
        };
        let group = self.group_slab[g].as_ref().expect("live group");
        for &id in group.slots.iter() {
            let slot = self.slots[id as usize].as_mut().expect("live slot");
            slot.order.push_back(entry);
        }
        self.order_entries += group.slots.len();
    }

    /// Drops every dead registration of group `g`.
    fn drop_dead(&mut self, g: usize) {
        let group = self.group_mut(g);
        let before = group.queue.len();
        group.queue.retain(|(_, w)| !claimed(w));
        let dropped = before - group.queue.len();
        if dropped > 0 {
            self.entries -= dropped;
            self.set_front(g);
        }
    }

    /// Registers `w` in group `g`, behind the calls already there. Dead registrations at
    /// the group's front go first: a consumer served on another thread meets its own here
    /// when it blocks again. A group that held nothing enters the orders of its keys it had
    /// left.
    fn add(&mut self, w: &Rc<Waiter>, g: usize) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let group = self.group_mut(g);
        let mut dropped = 0;
        while group.queue.front().is_some_and(|(_, w)| claimed(w)) {
            group.queue.pop_front();
            dropped += 1;
        }
        self.entries -= dropped;
        if dropped > 0 {
            self.set_front(g);
        }
        self.group_mut(g).queue.push_back((stamp, w.clone()));
        self.entries += 1;
        self.registrations += 1;
        self.set_front(g);
        if self.entries > self.compact_at || self.order_entries > self.order_compact_at {
            self.compact();
        }
    }

    /// Drops every dead registration, and every order entry of a group gone or empty;
    /// amortised over the registrations (and order entries) that grew the table to twice
    /// its live size.
    fn compact(&mut self) {
        for g in 0..self.group_slab.len() {
            if self.group_slab[g].is_some() {
                self.drop_dead(g);
            }
        }
        let mut listed = 0;
        for id in 0..self.slots.len() {
            let Some(mut slot) = self.slots[id].take() else {
                continue;
            };
            let (gens, slab) = (&self.gens, &self.group_slab);
            slot.order
                .retain(|f| gens[f.group as usize] == f.gen && slab[f.group as usize].is_some());
            listed += slot.order.len();
            self.slots[id] = Some(slot);
        }
        self.order_entries = listed;
        self.compact_at = (2 * self.entries).max(MIN_COMPACT_AT);
        self.order_compact_at = (2 * listed).max(MIN_COMPACT_AT);
    }

    fn top(&self, id: SlotId) -> Top {
        let Some(f) = self.slot(id).order.front() else {
            return Top::Empty;
        };
        if self.group_of(f).is_none() {
            return Top::Stale;
        }
        match self.fronts[f.group as usize] {
            NO_FRONT => Top::Stale,
            front if front != f.stamp => Top::Behind(front),
            _ => Top::Current(*f),
        }
    }

    /// The oldest live registration on a key with a stamp of at least `from`, with its
    /// stamp. From 0, the key's order gives it, and stale entries and dead registrations
    /// met on the way are dropped; past that, the walk goes through the queues of the
    /// groups the order holds (a caller passing over waiters it cannot serve).
    fn live_from(&mut self, db: usize, key: &[u8], from: u64) -> Option<(u64, Rc<Waiter>)> {
        let id = *self.index.get(&(db, key))?;
        if from > 0 {
            return self
                .groups_on(self.slot(id))
                .filter_map(|group| {
                    // Queues are in stamp order: each is looked at from `from` on, so a
                    // caller passing over many waiters of one group pays once for each.
                    let start = group.queue.partition_point(|(stamp, _)| *stamp < from);
                    group.queue.range(start..).find(|(_, w)| !claimed(w))
                })
                .min_by_key(|(stamp, _)| *stamp)
                .map(|(stamp, w)| (*stamp, w.clone()));
        }
        loop {
            match self.top(id) {
                Top::Empty => return None,
                Top::Stale => {
                    self.slot_mut(id).order.pop_front();
                    self.order_entries -= 1;
                }
                Top::Behind(front) => {
                    // Back to where its group's first registration puts it now: a
                    // consumer that blocked again lands near the back.
                    let order = &mut self.slot_mut(id).order;
                    let mut f = order.pop_front().expect("a front");
                    f.stamp = front;
                    let at = order.partition_point(|e| e.stamp < front);
                    order.insert(at, f);
                }
                Top::Current(f) => {
                    let g = f.group as usize;
                    let group = self.group_mut(g);
                    let (_, w) = group.queue.front().expect("a front");
                    if !claimed(w) {
                        return Some((f.stamp, w.clone()));
                    }
                    group.queue.pop_front();
                    self.entries -= 1;
                    self.set_front(g);
                }
            }
        }
    }

    /// The oldest live registration on a key, dropping dead ones on the way.
    #[cfg(test)]
    fn first_live(&mut self, db: usize, key: &[u8]) -> Option<Rc<Waiter>> {
        self.live_from(db, key, 0).map(|(_, w)| w)
    }
}

/// What `key` holds for `op` now.
fn has_data(sh: &mut Shard, db: usize, key: &[u8], op: &BlockOp) -> Data {
    match op {
        BlockOp::ListPop { .. }
        | BlockOp::ListMultiPop { .. }
        | BlockOp::ListMove { .. }
        | BlockOp::ListMoveAcross { .. } => lists::list_data(sh, db, key),
        BlockOp::ZPop { .. } => zsets::zset_data(sh, db, key),
        BlockOp::XRead { reads, group, .. } => {
            let Some((_, from)) = reads.iter().find(|(k, _)| &k[..] == key) else {
                return Data::Empty;
            };
            let g = group.as_ref().map(|g| &g.0[..]);
            if sh.with_ctx(db, |ctx| streams::blocked_read_ready(ctx, key, *from, g)) {
                Data::Ready
            } else {
                Data::Empty
            }
        }
    }
}

/// Whether serving `op` from `key` needs keys that a transaction holds right now.
fn blocked_by_locks(sh: &Shard, key: &[u8], op: &BlockOp) -> bool {
    if sh.locks.is_idle() {
        return false;
    }
    match op {
        BlockOp::ListMove { dst, .. } => !sh.locks.is_free([key, &dst[..]]),
        _ => !sh.locks.is_free([key]),
    }
}

/// Takes what `op` takes from `key` (known to hold something) and builds the reply.
fn perform(sh: &mut Shard, db: usize, key: &Bytes, op: &BlockOp, resp3: bool) -> Delivery {
    let mut out = Reply::new(resp3);
    let undo = match op {
        BlockOp::ListMoveAcross { .. } => {
            unreachable!("moves across shards are served by serve_across")
        }
        BlockOp::ListMove { dst, .. } if !lists::move_target_ok(sh, db, dst) => {
            out.error(WRONGTYPE);
            None
        }
        BlockOp::ListPop { left } => {
            let values = lists::pop_for_waiter(sh, db, key, *left, 1);
            let name: &[u8] = if *left { b"LPOP" } else { b"RPOP" };
            sh.log_effect(db, &[name, key]);
            out.array(2);
            out.bulk(key);
            out.bulk(&values[0]);
            Some(Undo::ListPush {
                db,
                key: key.clone(),
                left: *left,
                values,
            })
        }
        BlockOp::ListMultiPop { left, count } => {
            let values = lists::pop_for_waiter(sh, db, key, *left, *count);
            let name: &[u8] = if *left { b"LPOP" } else { b"RPOP" };
            sh.log_effect(db, &[name, key, values.len().to_string().as_bytes()]);
            out.array(2);
            out.bulk(key);
            out.array(values.len());
            for v in &values {
                out.bulk(v);
            }
            Some(Undo::ListPush {
                db,
                key: key.clone(),
                left: *left,
                values,
            })
        }
        BlockOp::ZPop { max, count, multi } => {
            let items = zsets::pop_for_waiter(sh, db, key, *max, *count, *multi, &mut out);
            let name: &[u8] = if *max { b"ZPOPMAX" } else { b"ZPOPMIN" };
            if *multi {
                sh.log_effect(db, &[name, key, items.len().to_string().as_bytes()]);
            } else {
                sh.log_effect(db, &[name, key]);
            }
            Some(Undo::ZAdd {
                db,
                key: key.clone(),
                items,
            })
        }
        BlockOp::XRead {
            reads,
            group,
            count,
            noack,
        } => {
            let from = reads
                .iter()
                .find(|(k, _)| k == key)
                .map(|r| r.1)
                .expect("served keys are the call's keys");
            let (reply, effects) = sh.with_ctx(db, |ctx| {
                let r = streams::serve_blocked_read(
                    ctx,
                    key,
                    from,
                    group.as_ref(),
                    *count,
                    *noack,
                    resp3,
                );
                (r, ctx.effect.take())
            });
            if let Some(list) = effects {
                sh.log_effects(db, &list);
            }
            out.raw(&reply.buf);
            // Entries read stay read; a group's delivery stays in its pending list, where
            // it can be claimed, as in Redis.
            None
        }
        BlockOp::ListMove {
            from_left,
            to_left,
            dst,
        } => {
            let value = lists::move_for_waiter(sh, db, key, *from_left, dst, *to_left);
            let side = |l: bool| if l { b"LEFT".as_slice() } else { b"RIGHT" };
            sh.log_effect(
                db,
                &[
                    b"LMOVE".as_slice(),
                    key,
                    dst,
                    side(*from_left),
                    side(*to_left),
                ],
            );
            out.bulk(&value);
            // The element now sits in the destination, where a client that vanished
            // would have put it too: nothing to undo.
            None
        }
    };
    Delivery {
        reply: out.buf,
        undo,
    }
}

fn pop_name(left: bool) -> &'static [u8] {
    if left {
        b"LPOP"
    } else {
        b"RPOP"
    }
}

fn push_name(left: bool) -> &'static [u8] {
    if left {
        b"LPUSH"
    } else {
        b"RPUSH"
    }
}

/// Serves a BLMOVE whose destination lives on another shard: pops here, and sends the
/// element to the destination's shard, which pushes it and answers the client. The
/// command being served waits on `settling` until that shard (and any chain of moves it
/// set off) is done. Each shard logs its own half (a pop here, a push there), so every
/// key's history stays in order in the AOF and on replicas.
fn serve_across(
    sh: &mut Shard,
    db: usize,
    src: &Bytes,
    (from_left, to_left): (bool, bool),
    dst: Bytes,
    deliver: Deliver,
    resp3: bool,
) {
    let mut values = lists::pop_for_waiter(sh, db, src, from_left, 1);
    let Some(value) = values.pop() else {
        return;
    };
    sh.log_effect(db, &[pop_name(from_left), src]);
    let (done, settled) = tokio::sync::oneshot::channel();
    sh.settling.push(settled);
    let landing = Landing {
        db,
        src: src.clone(),
        src_shard: sh.shared.placement.shard_of(src),
        from_left,
        dst: dst.clone(),
        to_left,
        value,
        deliver,
        resp3,
        done,
    };
    let target = sh.shared.placement.shard_of(&dst);
    sh.shared
        .send(target, Box::new(move |w: &Rc<Worker>| land(w, landing)));
}

/// An element of a BLMOVE on its way to its destination's shard.
struct Landing {
    db: usize,
    src: Bytes,
    src_shard: usize,
    from_left: bool,
    dst: Bytes,
    to_left: bool,
    value: Box<[u8]>,
    deliver: Deliver,
    resp3: bool,
    done: tokio::sync::oneshot::Sender<()>,
}

/// On the destination's shard: pushes the moved element (or, when the destination is
/// not a list, puts it back where it came from and fails the call), answers the client,
/// serves whoever waits on the destination, and reports back once all that settled.
fn land(w: &Rc<Worker>, l: Landing) {
    land_from(w, l, false)
}

/// `land`, restarted by the lock queue (`resumed`): whoever waits on the destination
/// still queued after it.
fn land_from(w: &Rc<Worker>, l: Landing, resumed: bool) {
    let mut sh = w.shard.borrow_mut();
    let free = sh.locks.is_idle()
        || if resumed {
            sh.locks.may_resume([&l.dst[..]], true)
        } else {
            sh.locks.is_free([&l.dst[..]])
        };
    if !free {
        let w2 = w.clone();
        let keys = crate::shard::locks::LockKeys::Keys(vec![l.dst.clone()]);
        sh.locks.enqueue(
            keys,
            crate::shard::locks::Waiting::Run(Box::new(move || land_from(&w2, l, true))),
        );
        return;
    }
    let db = l.db;
    let mut out = Reply::new(l.resp3);
    if !lists::move_target_ok(&mut sh, db, &l.dst) {
        drop(sh);
        out.error(WRONGTYPE);
        let (src, from_left, value) = (l.src.clone(), l.from_left, l.value);
        let back = move |w: &Rc<Worker>| {
            let mut sh = w.shard.borrow_mut();
            sh.log_effect(db, &[push_name(from_left), &src[..], &value[..]]);
            lists::push_back_for_waiter(&mut sh, db, &src, from_left, vec![value]);
            drop(sh);
            crate::shard::after_command(w);
        };
        if l.src_shard == w.id {
            back(w);
        } else {
            w.shared.send(l.src_shard, Box::new(back));
        }
        l.deliver.send(
            &w.shared,
            Delivery {
                reply: out.buf,
                undo: None,
            },
        );
        let _ = l.done.send(());
        return;
    }
    lists::push_for_waiter(&mut sh, db, &l.dst, l.to_left, &l.value);
    sh.log_effect(db, &[push_name(l.to_left), &l.dst[..], &l.value[..]]);
    out.bulk(&l.value);
    // A client gone by now leaves the element in the destination, as a finished
    // BLMOVE would have.
    l.deliver.send(
        &sh.shared,
        Delivery {
            reply: out.buf,
            undo: None,
        },
    );
    let earlier = std::mem::take(&mut sh.settling);
    drop(sh);
    crate::shard::after_command(w);
    let mut sh = w.shard.borrow_mut();
    let nested = std::mem::replace(&mut sh.settling, earlier);
    drop(sh);
    if nested.is_empty() {
        let _ = l.done.send(());
    } else {
        let done = l.done;
        crate::net::event_loop::spawn_local(async move {
            for n in nested {
                let _ = n.await;
            }
            let _ = done.send(());
        });
    }
}

/// Serves waiters of every key marked ready on this thread's shard.
pub fn serve_ready(worker: &Rc<Worker>) {
    let mut sh = worker.shard.borrow_mut();
    // A script of another thread that wrote here is still running: its end serves them.
    if !sh.blocking.has_ready() || sh.script_guests > 0 {
        return;
    }
    let mut postponed = Vec::new();
    // Serving a waiter may fill another waited key (BLMOVE into a list someone waits
    // on): keep going until the chain settles, before the command that started it
    // answers, as Redis does.
    loop {
        let ready = std::mem::take(&mut sh.blocking.ready);
        if ready.is_empty() {
            break;
        }
        for (db, key) in ready {
            // Waiters passed over: they take another type than the key holds (or, reading
            // a stream, want entries newer than it has), and those behind them may still
            // take what is there, as Redis serves them. Until one is, the next waiter is
            // the first live one (a served one is dead); after, the first with a later
            // stamp.
            let mut from = 0;
            while let Some((stamp, w)) = sh.blocking.live_from(db, &key, from) {
                match has_data(&mut sh, db, &key, &w.op) {
                    Data::Ready => {}
                    Data::WrongType => {
                        from = stamp + 1;
                        continue;
                    }
                    Data::Empty if matches!(*w.op, BlockOp::XRead { .. }) => {
                        from = stamp + 1;
                        continue;
                    }
                    Data::Empty => break,
                }
                if blocked_by_locks(&sh, &key, &w.op) {
                    // Served when the transaction holding the key lets go of it.
                    postponed.push((db, key.clone()));
                    break;
                }
                if w.claim
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                if let BlockOp::ListMoveAcross {
                    from_left,
                    to_left,
                    dst,
                } = &*w.op
                {
                    serve_across(
                        &mut sh,
                        db,
                        &key,
                        (*from_left, *to_left),
                        dst.clone(),
                        w.deliver.clone(),
                        w.resp3,
                    );
                    continue;
                }
                let delivery = perform(&mut sh, db, &key, &w.op, w.resp3);
                // The pop is on its way to the AOF before its client can see it.
                sh.aof_flush();
                let back = w.deliver.send(&sh.shared, delivery);
                if let Some(Delivery {
                    undo: Some(undo), ..
                }) = back
                {
                    apply_undo(&mut sh, undo);
                }
            }
        }
    }
    sh.blocking.ready.extend(postponed);
}

fn apply_undo(sh: &mut Shard, undo: Undo) {
    match undo {
        Undo::ListPush {
            db,
            key,
            left,
            values,
        } => {
            if sh.aof_on() {
                let name: &[u8] = if left { b"LPUSH" } else { b"RPUSH" };
                let mut argv: Vec<&[u8]> = vec![name, &key];
                argv.extend(values.iter().rev().map(|v| &v[..]));
                sh.log_effect(db, &argv);
            }
            lists::push_back_for_waiter(sh, db, &key, left, values)
        }
        Undo::ZAdd { db, key, items } => zsets::push_back_for_waiter(sh, db, &key, items),
    }
}

/// Parses a blocking timeout as Redis does: float seconds, 0 for ever, a positive value
/// under a millisecond rounds up to one.
pub fn parse_timeout(arg: &[u8]) -> Result<Option<Duration>, &'static str> {
    const NOT_FLOAT: &str = "ERR timeout is not a float or out of range";
    // Whole seconds, as job libraries send them, need no float parsing (which cost
    // several hundred instructions a call); nine digits cannot overflow.
    if (1..=9).contains(&arg.len()) && arg.iter().all(u8::is_ascii_digit) {
        let secs = arg.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        return Ok((secs > 0).then(|| Duration::from_secs(secs)));
    }
    let text = std::str::from_utf8(arg).map_err(|_| NOT_FLOAT)?;
    if text.is_empty()
        || text.starts_with(char::is_whitespace)
        || text.ends_with(char::is_whitespace)
    {
        return Err(NOT_FLOAT);
    }
    let secs: f64 = text.parse().map_err(|_| NOT_FLOAT)?;
    if secs.is_nan() {
        return Err(NOT_FLOAT);
    }
    if secs < 0.0 {
        return Err("ERR timeout is negative");
    }
    let mut ms = secs * 1000.0;
    if ms > i64::MAX as f64 {
        return Err("ERR timeout is out of range");
    }
    if ms == 0.0 {
        return Ok(None);
    }
    if ms < 1.0 {
        ms = 1.0;
    }
    Ok(Some(Duration::from_millis(ms.ceil() as u64)))
}

/// Keys copied end to end into one buffer: a call's part travels to its shard, and is
/// dropped there, without touching a reference count per key (the argument `Bytes` share
/// the connection's read buffer, whose count another core would then have to take).
#[derive(Default, Clone)]
struct KeyList {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl KeyList {
    fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len() as u32);
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        Some(&self.bytes[start..end])
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.get(i).expect("in range"))
    }

    fn of<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> KeyList {
        let mut list = KeyList::default();
        for k in keys {
            list.push(k);
        }
        list
    }
}

/// The part of a blocked call that lives on one shard.
struct ShardPart {
    shard: usize,
    keys: KeyList,
    /// Each key's position among the call's arguments.
    positions: Vec<u32>,
    print: SetPrint,
}

/// What trying a blocked call on one shard gave.
enum Tried {
    Served(Delivery),
    /// A key of the wrong type came first: the call fails at once.
    WrongType,
    /// Probing: the first of this shard's keys (an index into its part) that holds
    /// something, or is of the wrong type. Nothing was registered here.
    Found {
        index: usize,
        wrong: bool,
    },
    /// Registered (or, when not registering, nothing to take).
    Waiting,
    /// Asked by fingerprint alone, this shard does not know the set: ask again with the
    /// keys. Nothing was registered here.
    NeedKeys,
    /// Asked by fingerprint alone, these of the shard's keys hold something (`true`: of
    /// the wrong type). Which comes first depends on the call's order of its keys, which
    /// only the connection has. Nothing was registered here.
    FoundKeys(Vec<(Bytes, bool)>),
}

/// What a connection remembers of the key set of its last blocked call: the set's
/// fingerprint and, per shard, its part's. Placement never changes while Kite runs, so a
/// call on the same set needs neither each key's shard nor the keys themselves, as long
/// as each shard still knows its part.
pub struct LastBlock {
    db: usize,
    print: SetPrint,
    parts: Vec<(usize, SetPrint)>,
}

/// How a shard treats its part of a blocked call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// All the call's keys are here: serve from the first that holds something, else
    /// register. Asked by fingerprint alone, with several keys holding something, it can
    /// only name them (`Tried::FoundKeys`): which is first is the call's order.
    ServeOrRegister,
    /// Other shards hold keys too: report the first key holding something without
    /// taking it (the call's earliest such key, on whichever shard, is the one to serve),
    /// else register.
    ProbeOrRegister,
    /// Serve from the part's only key if it holds something; never register.
    ServeOnly,
}

/// Everything a shard needs to try or register its part of a blocked call.
struct PartCall {
    db: usize,
    keys: KeyList,
    print: SetPrint,
    op: Arc<BlockOp>,
    resp3: bool,
    claim: Arc<AtomicBool>,
    deliver: Deliver,
    mode: Mode,
}

/// The first of `keys` (a call's keys in argument order) that is among `holding`, with
/// its wrong-type flag.
fn earliest_of(keys: &[Bytes], holding: &[(Bytes, bool)]) -> Option<(usize, bool)> {
    if holding.len() <= 8 {
        return keys.iter().enumerate().find_map(|(i, k)| {
            holding
                .iter()
                .find(|(h, _)| h == k)
                .map(|&(_, wrong)| (i, wrong))
        });
    }
    let at: hashbrown::HashMap<&[u8], bool> = holding.iter().map(|(k, w)| (&k[..], *w)).collect();
    keys.iter()
        .enumerate()
        .find_map(|(i, k)| at.get(&k[..]).map(|&wrong| (i, wrong)))
}

/// Positions of the keys in `found` (slot keys) among `keys`, first occurrence each.
fn positions_of(keys: &KeyList, found: &[Bytes]) -> Vec<usize> {
    if found.len() <= 8 {
        return found
            .iter()
            .map(|f| keys.iter().position(|k| k == &f[..]).unwrap_or(usize::MAX))
            .collect();
    }
    let mut at: hashbrown::HashMap<&[u8], usize> = hashbrown::HashMap::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        at.entry(k).or_insert(i);
    }
    found
        .iter()
        .map(|f| at.get(&f[..]).copied().unwrap_or(usize::MAX))
        .collect()
}

/// Tries a call's part on this shard, as `call.mode` says: serves it at once from the
/// first key in argument order that holds something, or registers a waiter on every key.
/// Asked by fingerprint alone, a shard whose keys hold something names them instead
/// (`Tried::FoundKeys`), unless it can tell which comes first without the call's order.
fn try_or_register(w: &Rc<Worker>, call: PartCall) -> Tried {
    let PartCall {
        db,
        keys,
        print,
        op,
        resp3,
        claim,
        deliver,
        mode,
    } = call;
    let mut sh = w.shard.borrow_mut();
    if mode == Mode::ServeOnly {
        let key = &Bytes::copy_from_slice(keys.get(0).expect("one key"));
        if has_data(&mut sh, db, key, &op) != Data::Ready
            || blocked_by_locks(&sh, key, &op)
            || matches!(*op, BlockOp::ListMoveAcross { .. })
            || claim
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return Tried::Waiting;
        }
        return Tried::Served(perform(&mut sh, db, key, &op, resp3));
    }
    let (g, fresh) = if keys.len() == 0 {
        match sh.blocking.known_group(db, print) {
            Some(g) => (g, false),
            None => return Tried::NeedKeys,
        }
    } else {
        sh.blocking.group_for(db, print, &keys)
    };
    let slots = sh.blocking.group_slab[g]
        .as_ref()
        .expect("live group")
        .slots
        .clone();
    // Only keys written since they were last found missing can hold anything.
    let hinted: Vec<SlotId> = slots
        .iter()
        .copied()
        .filter(|&id| sh.blocking.slot(id).hint)
        .collect();
    let mut found: Vec<(Bytes, Data)> = Vec::new();
    for id in hinted {
        let key = sh.blocking.slot(id).key.clone();
        match has_data(&mut sh, db, &key, &op) {
            // Lists and sorted sets that hold nothing do not exist; a stream can exist
            // with nothing new for this reader, so its hint stays.
            Data::Empty => {
                if !matches!(*op, BlockOp::XRead { .. }) {
                    sh.blocking.slot_mut(id).hint = false;
                }
            }
            d => found.push((key, d)),
        }
    }
    let mut waits_for_lock = false;
    if !found.is_empty() && keys.len() == 0 {
        if mode == Mode::ServeOrRegister && found.len() == 1 {
            // Every key of the call is here and only one holds anything: it comes first
            // in any order, so it is served now, without a second round trip.
            let (key, data) = &found[0];
            if *data == Data::WrongType {
                return Tried::WrongType;
            }
            if !blocked_by_locks(&sh, key, &op) && !matches!(*op, BlockOp::ListMoveAcross { .. }) {
                if claim
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    return Tried::Waiting;
                }
                return Tried::Served(perform(&mut sh, db, key, &op, resp3));
            }
        }
        return Tried::FoundKeys(
            found
                .into_iter()
                .map(|(k, d)| (k, d == Data::WrongType))
                .collect(),
        );
    }
    if !found.is_empty() {
        let names: Vec<Bytes> = found.iter().map(|(k, _)| k.clone()).collect();
        let mut order: Vec<(usize, Data)> = positions_of(&keys, &names)
            .into_iter()
            .zip(found.iter().map(|(_, d)| *d))
            .collect();
        order.sort_unstable_by_key(|(pos, _)| *pos);
        for (index, data) in order {
            let Some(key) = keys.get(index) else { continue };
            let key = &Bytes::copy_from_slice(key);
            if data == Data::WrongType {
                if mode == Mode::ProbeOrRegister {
                    return Tried::Found { index, wrong: true };
                }
                return Tried::WrongType;
            }
            // A move across shards is never served here: the serving shard's
            // after-command pass does it, so the push lands and settles like any other.
            if blocked_by_locks(&sh, key, &op) || matches!(*op, BlockOp::ListMoveAcross { .. }) {
                waits_for_lock = true;
                continue;
            }
            if mode == Mode::ProbeOrRegister {
                return Tried::Found {
                    index,
                    wrong: false,
                };
            }
            if claim
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return Tried::Waiting;
            }
            return Tried::Served(perform(&mut sh, db, key, &op, resp3));
        }
    }
    if claim.load(Ordering::Acquire) {
        return Tried::Waiting;
    }
    let waiter = Rc::new(Waiter {
        claim,
        db,
        op,
        resp3,
        deliver,
    });
    sh.blocking.add(&waiter, g);
    let now = crate::clock::unix_ms();
    let group = sh.blocking.group_slab[g].as_mut().expect("live group");
    if fresh || now.saturating_sub(group.observed_ms) >= OBSERVE_EVERY_MS {
        group.observed_ms = now;
        for &id in slots.iter() {
            let key = sh.blocking.slot(id).key.clone();
            sh.queues.blocked(db, &key, now);
        }
    }
    if waits_for_lock {
        // A key already holds something; serve it when its lock goes.
        for key in keys.iter() {
            sh.blocking.mark_ready(db, key);
        }
    }
    Tried::Waiting
}

/// Why a blocked call stopped waiting without being served.
pub enum Ended {
    Timeout,
    UnblockedWithError,
    ClientGone,
}

/// How a blocked call ended.
pub enum Outcome {
    Served(BytesMut),
    Ended(Ended),
    Error(&'static str),
}

/// XREAD/XREADGROUP with BLOCK: resolves `$` to each stream's last id, runs the read as
/// usual (it answers at once when any stream has something, or with its error), and
/// blocks only when it found nothing.
pub async fn run_stream_read(
    sess: &mut Session,
    cmd: &'static crate::commands::Command,
    mut args: Vec<Bytes>,
    call: BlockCall,
) {
    let BlockOp::XRead {
        group,
        count,
        noack,
        ..
    } = call.op
    else {
        unreachable!("stream reads only")
    };
    let first_id = args.len() - call.keys.len();
    let db = sess.db;
    for (i, key) in call.keys.iter().enumerate() {
        if group.is_none() && &args[first_id + i][..] == b"$" {
            let k = key.clone();
            let last = hop(&sess.worker, sess.worker.shard_of(key), move |w| {
                w.shard
                    .borrow_mut()
                    .with_ctx(db, |ctx| streams::last_id(ctx, &k))
            })
            .await;
            args[first_id + i] = Bytes::from(last.to_string());
        }
    }
    let mark = sess.out.buf.len();
    crate::commands::run_handler(sess, cmd, args.clone()).await;
    let written = &sess.out.buf[mark..];
    if written != b"*-1\r\n" && written != b"_\r\n" {
        return;
    }
    sess.out.buf.truncate(mark);
    let reads: Option<Vec<(Bytes, ReadFrom)>> = call
        .keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            streams::blocked_read_from(&args[first_id + i], group.is_some()).map(|f| (k.clone(), f))
        })
        .collect();
    let Some(reads) = reads else {
        return sess.out.null_array();
    };
    let op = BlockOp::XRead {
        reads,
        group,
        count,
        noack,
    };
    let outcome = block(sess, &call.keys, op, call.timeout).await;
    write_outcome(sess, outcome);
}

/// Runs a blocking command for a session outside MULTI and writes its reply: served at
/// once if a key holds something, else after blocking until served, timed out, unblocked
/// or disconnected.
pub async fn run_blocking(sess: &mut Session, call: BlockCall, args: &[Bytes]) {
    let keys: &[Bytes] = match &call.keys_at {
        Some(at) => &args[at.clone()],
        None => &call.keys,
    };
    let outcome = match &call.op {
        BlockOp::ListMove {
            from_left,
            to_left,
            dst,
        } if sess.worker.shard_of(dst) != sess.worker.shard_of(&keys[0]) => {
            let (from_left, to_left, dst) = (*from_left, *to_left, dst.clone());
            return move_across_shards(
                sess,
                keys[0].clone(),
                dst,
                from_left,
                to_left,
                call.timeout,
            )
            .await;
        }
        _ => block(sess, keys, call.op, call.timeout).await,
    };
    write_outcome(sess, outcome);
}

fn write_outcome(sess: &mut Session, outcome: Outcome) {
    match outcome {
        Outcome::Served(reply) => sess.out.raw(&reply),
        Outcome::Ended(Ended::Timeout) => sess.out.null_array(),
        Outcome::Ended(Ended::UnblockedWithError) => {
            match sess.handle.unblock_error.borrow_mut().take() {
                Some(e) => sess.out.error(&e),
                None => sess
                    .out
                    .error("UNBLOCKED client unblocked via CLIENT UNBLOCK"),
            }
        }
        Outcome::Ended(Ended::ClientGone) => {}
        Outcome::Error(e) => sess.out.error(e),
    }
}

/// BLMOVE from a list on one shard to a list on another: moves at once with a cross-shard
/// transaction when the source holds something, else waits for `serve_across`.
async fn move_across_shards(
    sess: &mut Session,
    src: Bytes,
    dst: Bytes,
    from_left: bool,
    to_left: bool,
    timeout: Option<Duration>,
) {
    let tx =
        crate::shard::tx::Tx::lock_keys(&sess.worker, &[src.clone(), dst.clone()], false).await;
    let mark = sess.out.buf.len();
    let db = sess.db;
    // `move_across` names its effect (LMOVE); a move that found nothing logs nothing.
    let effect = lists::move_effect(&src, &dst, from_left, to_left);
    let moved = lists::move_across(sess, src.clone(), dst.clone(), from_left, to_left, &tx);
    tx.logged(db, &effect, moved).await;
    tx.end().await;
    let written = &sess.out.buf[mark..];
    if written != b"$-1\r\n" && written != b"_\r\n" {
        return;
    }
    sess.out.buf.truncate(mark);
    // Wait as a move across shards: the source's shard pops and the destination's
    // pushes when an element comes, before the command that brought it answers.
    let op = BlockOp::ListMoveAcross {
        from_left,
        to_left,
        dst,
    };
    let outcome = block(sess, std::slice::from_ref(&src), op, timeout).await;
    write_outcome(sess, outcome);
}

/// Blocks on `keys` for `op`: the heart of every blocking command.
pub async fn block(
    sess: &mut Session,
    keys: &[Bytes],
    op: BlockOp,
    timeout: Option<Duration>,
) -> Outcome {
    let worker = sess.worker.clone();
    let db = sess.db;
    let resp3 = sess.out.resp3;
    if worker.shared.cluster.is_some() {
        if let Some(k) = keys.first() {
            let read = matches!(&op, BlockOp::XRead { group: None, .. });
            let slot = crate::shard::placement::slot(k) as u16;
            sess.handle
                .blocked_slot
                .set(Some((slot, read && sess.readonly)));
        }
    }
    let op = Arc::new(op);
    let claim = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::unbounded_channel::<Delivery>();

    let call = |keys: KeyList, print: SetPrint, mode: Mode| PartCall {
        db,
        keys,
        print,
        op: op.clone(),
        resp3,
        claim: claim.clone(),
        deliver: Deliver {
            tx: tx.clone(),
            home: worker.id,
        },
        mode,
    };
    // An ask to serve the call from one key alone.
    let only = |key: &Bytes| {
        call(
            KeyList::of([&key[..]]),
            SetPrint::default(),
            Mode::ServeOnly,
        )
    };
    let mut whole = SetPrint::default();
    for k in keys {
        whole.add(k);
    }
    let known = sess
        .last_block
        .as_ref()
        .filter(|l| l.db == db && l.print == whole)
        .map(|l| l.parts.clone());

    // The same set as last time: ask each shard by its part's fingerprint alone.
    let mut again: Option<Vec<usize>> = None;
    if let Some(plan) = &known {
        let mode = if plan.len() == 1 {
            Mode::ServeOrRegister
        } else {
            Mode::ProbeOrRegister
        };
        let asks = plan
            .iter()
            .map(|&(shard, print)| (shard, call(KeyList::default(), print, mode)))
            .collect();
        let mut need = Vec::new();
        let mut holding: Vec<(Bytes, bool)> = Vec::new();
        let mut unknown = false;
        for ((shard, _), tried) in plan.iter().zip(ask_all(&worker, asks).await) {
            match tried {
                Tried::Waiting => {}
                // Only an ask of the whole call serves or fails (`try_or_register`).
                Tried::Served(d) => return Outcome::Served(d.reply),
                Tried::WrongType => {
                    claim.store(true, Ordering::Release);
                    return Outcome::Error(WRONGTYPE);
                }
                // The connection decides which key comes first, or asks again with the
                // keys.
                Tried::FoundKeys(list) => {
                    holding.extend(list);
                    need.push(*shard);
                }
                _ => {
                    unknown = true;
                    need.push(*shard);
                }
            }
        }
        if need.is_empty() || claim.load(Ordering::Acquire) {
            drop(tx);
            return finish_waiting(sess, &mut rx, &claim, timeout).await;
        }
        // Every shard that did not register said which of its keys hold something: serve
        // from the earliest in this call's order, as Redis does, without sending the keys
        // (a queue that is seldom empty meets this on most calls). Anything else (a shard
        // that lost the set, the element gone meanwhile, a key held by a transaction)
        // goes the long way below.
        // A move across shards is never served by a ServeOnly ask: it takes the long way.
        let movable = !matches!(*op, BlockOp::ListMoveAcross { .. });
        if !unknown && movable {
            if let Some((pos, wrong)) = earliest_of(keys, &holding) {
                if wrong {
                    if claim
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return Outcome::Error(WRONGTYPE);
                    }
                    drop(tx);
                    return finish_waiting(sess, &mut rx, &claim, timeout).await;
                }
                let key = &keys[pos];
                if let Some(reply) = take_one(&worker, key, only(key)).await {
                    return Outcome::Served(reply);
                }
            }
        }
        if claim.load(Ordering::Acquire) {
            // A thread that registered served the call meanwhile.
            drop(tx);
            return finish_waiting(sess, &mut rx, &claim, timeout).await;
        }
        again = Some(need);
    }

    // The keys by shard, in argument order, each part with its set's fingerprint. A key
    // named twice is registered twice, which the claim token makes harmless.
    let mut parts = split_by_shard(&worker, keys);
    if known.is_none() {
        sess.last_block = Some(Box::new(LastBlock {
            db,
            print: whole,
            parts: parts.iter().map(|p| (p.shard, p.print)).collect(),
        }));
    }
    let mode = if parts.len() == 1 {
        Mode::ServeOrRegister
    } else {
        Mode::ProbeOrRegister
    };
    // Every shard not yet registered is asked at once.
    let asked: Vec<usize> = (0..parts.len())
        .filter(|&i| again.as_ref().is_none_or(|a| a.contains(&parts[i].shard)))
        .collect();
    let asks = asked
        .iter()
        .map(|&i| {
            let keys = std::mem::take(&mut parts[i].keys);
            (parts[i].shard, call(keys, parts[i].print, mode))
        })
        .collect();
    let mut found: Vec<(u32, usize, bool)> = Vec::new();
    for (&i, tried) in asked.iter().zip(ask_all(&worker, asks).await) {
        match tried {
            Tried::Served(d) => return Outcome::Served(d.reply),
            Tried::WrongType => {
                claim.store(true, Ordering::Release);
                return Outcome::Error(WRONGTYPE);
            }
            Tried::Found { index, wrong } => found.push((parts[i].positions[index], i, wrong)),
            Tried::Waiting | Tried::NeedKeys | Tried::FoundKeys(_) => {}
        }
    }

    // Some keys hold something: serve from the earliest in argument order, as Redis
    // does. Shards that reported one did not register, so if it is gone by now they
    // register (or serve what they hold) after all.
    if let Some(&(pos, _, wrong)) = found.iter().min_by_key(|f| f.0) {
        if wrong {
            if claim
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Outcome::Error(WRONGTYPE);
            }
        } else {
            let key = &keys[pos as usize];
            if let Some(reply) = take_one(&worker, key, only(key)).await {
                return Outcome::Served(reply);
            }
        }
        for &(_, i, _) in &found {
            if claim.load(Ordering::Acquire) {
                break;
            }
            // The part's keys went with the first ask: gather them again.
            let part_keys = KeyList::of(parts[i].positions.iter().map(|&p| &keys[p as usize][..]));
            let c = call(part_keys, parts[i].print, Mode::ServeOrRegister);
            match hop(&worker, parts[i].shard, move |w| try_part(w, c)).await {
                Tried::Served(d) => return Outcome::Served(d.reply),
                Tried::WrongType => {
                    if claim
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return Outcome::Error(WRONGTYPE);
                    }
                }
                Tried::Found { .. } | Tried::Waiting | Tried::NeedKeys | Tried::FoundKeys(_) => {}
            }
        }
    }
    drop(tx);
    finish_waiting(sess, &mut rx, &claim, timeout).await
}

/// Asks `key`'s thread to serve a call from that key alone (`Mode::ServeOnly`): the reply,
/// or None if it holds nothing now, is locked, or the call was served elsewhere.
async fn take_one(worker: &Rc<Worker>, key: &[u8], c: PartCall) -> Option<BytesMut> {
    match hop(worker, worker.shard_of(key), move |w| try_part(w, c)).await {
        Tried::Served(d) => Some(d.reply),
        _ => None,
    }
}

/// Waits for a registered call to be served or to end.
async fn finish_waiting(
    sess: &mut Session,
    rx: &mut mpsc::UnboundedReceiver<Delivery>,
    claim: &Arc<AtomicBool>,
    timeout: Option<Duration>,
) -> Outcome {
    let waited = crate::clock::Stopwatch::start();
    let outcome = wait(sess, rx, claim, timeout).await;
    sess.blocked_us += waited.elapsed_us();
    match outcome {
        Ok(d) => Outcome::Served(d.reply),
        Err(e) => Outcome::Ended(e),
    }
}

/// A call's keys by shard, in argument order, each part with its set's fingerprint.
fn split_by_shard(worker: &Rc<Worker>, keys: &[Bytes]) -> Vec<ShardPart> {
    let mut parts: Vec<ShardPart> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let s = worker.shard_of(k);
        let p = match parts.iter().position(|p| p.shard == s) {
            Some(p) => p,
            None => {
                parts.push(ShardPart {
                    shard: s,
                    keys: KeyList::default(),
                    positions: Vec::new(),
                    print: SetPrint::default(),
                });
                parts.len() - 1
            }
        };
        let part = &mut parts[p];
        part.keys.push(k);
        part.positions.push(i as u32);
        part.print.add(k);
    }
    parts
}

/// Asks each shard about its part at once (remote ones first, this thread's inline) and
/// returns their answers in the order asked.
async fn ask_all(worker: &Rc<Worker>, asks: Vec<(usize, PartCall)>) -> Vec<Tried> {
    let mut pending = Vec::with_capacity(asks.len());
    let mut local = None;
    for (i, (shard, c)) in asks.into_iter().enumerate() {
        if shard == worker.id {
            local = Some((i, c));
            pending.push(None);
        } else {
            pending.push(Some(hop_send(worker, shard, move |w| try_part(w, c))));
        }
    }
    let mut here = local.map(|(i, c)| (i, try_part(worker, c)));
    let mut out = Vec::with_capacity(pending.len());
    for (i, p) in pending.into_iter().enumerate() {
        match p {
            Some(rx) => out.push(rx.await.expect("shard thread stopped")),
            None => out.push(here.take().filter(|h| h.0 == i).expect("asked here").1),
        }
    }
    out
}

/// Runs a part of a blocked call on this shard; a key that already held something is
/// served by the after-command pass.
fn try_part(w: &Rc<Worker>, call: PartCall) -> Tried {
    let t = try_or_register(w, call);
    if w.shard.borrow().blocking.has_ready() {
        crate::shard::after_command(w);
        w.shard.borrow_mut().settling.clear();
    }
    t
}

/// Waits for a delivery, the timeout, CLIENT UNBLOCK/KILL or the client leaving.
async fn wait(
    sess: &mut Session,
    rx: &mut mpsc::UnboundedReceiver<Delivery>,
    claim: &Arc<AtomicBool>,
    timeout: Option<Duration>,
) -> Result<Delivery, Ended> {
    // Replies to the commands pipelined before this one go out before it parks, after
    // any the send batch still holds.
    // The client's socket, from net's list (a session without one, the AOF replay, has
    // nothing to send and never leaves).
    let stream = crate::net::link(sess.id);
    let owed = stream.as_ref().is_some_and(|s| s.owes_output());
    if !sess.out.buf.is_empty() || owed {
        crate::server::dispatch::await_durable(sess).await;
        // The blocked command's own reply, still to come, waits for the AOF in turn.
        sess.unflushed_replies = 1;
        sess.unflushed_write = true;
        let n = sess.out.buf.len();
        if stream_io::write_all(stream.as_deref(), &sess.out.buf)
            .await
            .is_ok()
        {
            sess.worker.shard.borrow_mut().stats.net_output_bytes += n as u64;
        }
        sess.out.buf.clear();
        sess.flushed_mid_command += n;
    }
    let handle = sess.handle.clone();
    handle.blocked.set(true);
    handle.info.borrow_mut().blocked = true;
    sess.worker.clients.borrow_mut().blocked += 1;
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    let max_held = sess.query_buffer_limit();
    let result = loop {
        let sleep = async {
            match deadline {
                Some(d) => crate::net::event_loop::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let ended = tokio::select! {
            biased;
            d = rx.recv() => match d {
                Some(d) => break Ok(d),
                None => unreachable!("the waiter keeps a sender until served"),
            },
            _ = handle.wake.notified() => {
                if handle.killed.get() {
                    Some(Ended::ClientGone)
                } else {
                    match handle.unblock.take() {
                        Some(true) => Some(Ended::UnblockedWithError),
                        Some(false) => Some(Ended::Timeout),
                        None => None,
                    }
                }
            }
            _ = sleep => Some(Ended::Timeout),
            over = stream_io::gone(stream.as_deref(), max_held) => {
                // Closed below (`close_after_reply`) rather than by its own read, which
                // counts and logs such a close: done here instead.
                // Once per client: blocking commands pipelined behind this one meet the
                // same held bytes before the connection closes.
                if let (Some(first_bytes), false) = (over, sess.close_after_reply) {
                    crate::net::conn::closing_for_query_buffer(sess, &first_bytes);
                }
                Some(Ended::ClientGone)
            }
        };
        let Some(ended) = ended else {
            continue;
        };
        if claim
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            break Err(ended);
        }
        // A shard won the token: its delivery is on the way.
        let d = rx.recv().await.expect("a served waiter gets its delivery");
        if matches!(ended, Ended::ClientGone) {
            if let Some(undo) = d.undo {
                let worker = sess.worker.clone();
                let target = match &undo {
                    Undo::ListPush { key, .. } | Undo::ZAdd { key, .. } => worker.shard_of(key),
                };
                hop(&worker, target, move |w| {
                    let mut sh = w.shard.borrow_mut();
                    apply_undo(&mut sh, undo);
                })
                .await;
                serve_ready_on(&worker, target);
            }
            break Err(Ended::ClientGone);
        }
        break Ok(d);
    };
    handle.blocked.set(false);
    handle.blocked_slot.set(None);
    handle.info.borrow_mut().blocked = false;
    sess.worker.clients.borrow_mut().blocked -= 1;
    if matches!(result, Err(Ended::ClientGone)) {
        sess.close_after_reply = true;
    }
    result
}

/// Serves ready keys on another shard (after an undo made a key non-empty again).
fn serve_ready_on(worker: &Rc<Worker>, target: usize) {
    if target == worker.id {
        serve_ready(worker);
    } else {
        worker.shared.send(target, Box::new(serve_ready));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whole seconds take a shortcut past float parsing; they must read as the general
    /// path reads them (leading zeros, zero, the longest shortcut and one digit past it).
    #[test]
    fn whole_second_timeouts_read_as_floats_do() {
        for text in [
            "0",
            "00",
            "1",
            "2",
            "007",
            "10",
            "86400",
            "999999999",
            "1000000000",
            "12345678901",
        ] {
            let general = text.parse::<f64>().unwrap();
            let want =
                (general > 0.0).then(|| Duration::from_millis((general * 1000.0).ceil() as u64));
            assert_eq!(parse_timeout(text.as_bytes()), Ok(want), "{text}");
        }
        assert_eq!(parse_timeout(b"1.5"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(parse_timeout(b"-1"), Err("ERR timeout is negative"));
        assert!(parse_timeout(b" 1").is_err() && parse_timeout(b"").is_err());
    }

    fn waiter() -> Rc<Waiter> {
        let (tx, _rx) = mpsc::unbounded_channel();
        Rc::new(Waiter {
            claim: Arc::new(AtomicBool::new(false)),
            db: 0,
            op: Arc::new(BlockOp::ListPop { left: true }),
            resp3: false,
            deliver: Deliver { tx, home: 0 },
        })
    }

    #[test]
    fn key_hashes_see_every_byte_and_prints_ignore_order() {
        // A change to any one byte of a key, at any length around the reads' edges,
        // changes both hashes.
        for len in 0..=40usize {
            let base: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let (a0, b0) = key_hashes(&base);
            for at in 0..len {
                let mut k = base.clone();
                k[at] ^= 0x01;
                let (a, b) = key_hashes(&k);
                assert!(a != a0 && b != b0, "len {len}, byte {at}");
            }
            // A key one byte longer (with a zero byte) is another key.
            let mut longer = base.clone();
            longer.push(0);
            assert_ne!(key_hashes(&longer), (a0, b0), "len {len} and a zero byte");
        }
        let keys: Vec<String> = (0..234).map(|i| format!("queue:{i}")).collect();
        let print = |order: &mut dyn Iterator<Item = &String>| {
            let mut p = SetPrint::default();
            for k in order {
                p.add(k.as_bytes());
            }
            p
        };
        let forward = print(&mut keys.iter());
        assert_eq!(forward, print(&mut keys.iter().rev()));
        assert_ne!(forward, print(&mut keys.iter().skip(1)));
        let mut other = keys.clone();
        other[117] = "queue:x".into();
        assert_ne!(forward, print(&mut other.iter()));
    }

    fn group(t: &mut BlockTable, keys: &[&str]) -> usize {
        let keys = KeyList::of(keys.iter().map(|k| k.as_bytes()));
        let mut print = SetPrint::default();
        for k in keys.iter() {
            print.add(k);
        }
        t.group_for(0, print, &keys).0
    }

    /// The table's cross references agree: a group with registrations has one entry of
    /// its generation in each of its keys' orders, with a stamp no later than its front,
    /// and an empty one has none; orders are in stamp order; each front is its queue's
    /// first stamp.
    fn check(t: &BlockTable) {
        for (g, group) in t.group_slab.iter().enumerate() {
            let Some(group) = group else { continue };
            let front = group.queue.front().map_or(NO_FRONT, |e| e.0);
            assert_eq!(t.fronts[g], front);
            for &id in group.slots.iter() {
                let entries: Vec<&Front> = t
                    .slot(id)
                    .order
                    .iter()
                    .filter(|f| f.group as usize == g && f.gen == t.gens[g])
                    .collect();
                assert_eq!(entries.len(), usize::from(front != NO_FRONT));
                assert!(entries.iter().all(|f| f.stamp <= front));
            }
        }
        let busy = t
            .group_slab
            .iter()
            .flatten()
            .filter(|g| !g.queue.is_empty())
            .count();
        assert_eq!(busy, t.busy_groups);
        let listed: usize = t.slots.iter().flatten().map(|s| s.order.len()).sum();
        for slot in t.slots.iter().flatten() {
            assert!(slot
                .order
                .iter()
                .zip(slot.order.iter().skip(1))
                .all(|(a, b)| a.stamp <= b.stamp));
        }
        assert_eq!(listed, t.order_entries);
        for slot in t.slots.iter().flatten() {
            assert!(slot.groups > 0);
        }
        // Queue metrics count through the groups what `live_waiters` counts through the
        // key's order.
        let live = t.live_counts();
        for slot in t.slots.iter().flatten() {
            assert_eq!(
                live.on_key(slot.db, &slot.key),
                t.live_waiters(slot.db, &slot.key)
            );
        }
    }

    #[test]
    fn a_call_is_one_registration_and_dead_ones_stay_bounded() {
        let mut t = BlockTable::default();
        let keys: Vec<String> = (0..50).map(|i| format!("q{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let many = group(&mut t, &refs);
        // A call blocked for long holds the front; those behind it come and go.
        let live = waiter();
        t.add(&live, many);
        for _ in 0..10_000 {
            let w = waiter();
            t.add(&w, many);
            // Served or timed out: the call's token is taken, its entry is dead.
            w.claim.store(true, Ordering::Release);
        }
        assert_eq!(t.registrations, 10_001);
        assert!(t.entries <= 2 * MIN_COMPACT_AT, "{} entries", t.entries);
        check(&t);
        assert!(Rc::ptr_eq(&t.first_live(0, b"q7").unwrap(), &live));
        assert_eq!(t.live_waiters(0, b"q7"), 1);
        assert_eq!(t.keys_count(), 50);
        // A call blocking again meets its own dead entry at the front, and drops it.
        live.claim.store(true, Ordering::Release);
        let again = waiter();
        t.add(&again, many);
        assert_eq!(t.group(many).queue.len(), 1);
        check(&t);
    }

    #[test]
    fn first_blocked_first_served_across_groups_sharing_a_key() {
        let mut t = BlockTable::default();
        let xy = group(&mut t, &["x", "y"]);
        let yz = group(&mut t, &["z", "y"]);
        let (a, b, c) = (waiter(), waiter(), waiter());
        t.add(&a, xy);
        t.add(&b, yz);
        t.add(&c, xy);
        check(&t);
        assert_eq!(t.live_waiters(0, b"y"), 3);
        assert_eq!(t.live_waiters(0, b"x"), 2);
        assert_eq!(t.keys_count(), 3);
        assert!(Rc::ptr_eq(&t.first_live(0, b"y").unwrap(), &a));
        a.claim.store(true, Ordering::Release);
        assert!(Rc::ptr_eq(&t.first_live(0, b"y").unwrap(), &b));
        // Past b (a waiter that cannot take what y holds), c comes next.
        let (stamp, _) = t.live_from(0, b"y", 0).unwrap();
        let (_, next) = t.live_from(0, b"y", stamp + 1).unwrap();
        assert!(Rc::ptr_eq(&next, &c));
        b.claim.store(true, Ordering::Release);
        assert!(Rc::ptr_eq(&t.first_live(0, b"y").unwrap(), &c));
        assert!(t.first_live(0, b"z").is_none());
        c.claim.store(true, Ordering::Release);
        assert!(t.first_live(0, b"x").is_none());
        check(&t);
        assert_eq!(t.keys_count(), 0);
        // Nobody waits: once the key's order has been looked at, writes do not mark it
        // ready.
        assert!(t.first_live(0, b"y").is_none());
        t.mark_ready(0, b"y");
        assert!(!t.has_ready());
        check(&t);
    }

    #[test]
    fn a_set_is_one_group_in_any_order() {
        let mut t = BlockTable::default();
        let a = group(&mut t, &["x", "y", "z"]);
        let b = group(&mut t, &["z", "x", "y"]);
        assert_eq!(a, b);
        let c = group(&mut t, &["x", "y"]);
        assert_ne!(a, c);
        assert_eq!(t.groups.len(), 2);
        // Both groups share the slots of x and y.
        assert_eq!(t.index.len(), 3);
        // A key named twice is one slot of its group.
        let d = group(&mut t, &["x", "x", "w"]);
        assert_eq!(t.group(d).slots.len(), 2);
        check(&t);
    }

    #[test]
    fn the_keys_groups_name_are_bounded_too() {
        let mut t = BlockTable::default();
        for i in 0..20 {
            let names: Vec<String> = (0..MAX_GROUP_KEYS / 8)
                .map(|j| format!("{i}:{j}"))
                .collect();
            let refs: Vec<&str> = names.iter().map(|k| k.as_str()).collect();
            group(&mut t, &refs);
            assert!(t.group_keys <= MAX_GROUP_KEYS);
            assert_eq!(t.index.len(), t.group_keys);
        }
        assert_eq!(t.groups.len(), 8);
    }

    #[test]
    fn idle_groups_are_bounded_and_their_slots_go_with_them() {
        let mut t = BlockTable::default();
        for i in 0..(MAX_GROUPS + 500) {
            let k = format!("k{i}");
            group(&mut t, &[&k, "shared"]);
        }
        assert_eq!(t.groups.len(), MAX_GROUPS);
        // Slots of evicted groups are gone.
        assert_eq!(t.index.len(), MAX_GROUPS + 1);
        check(&t);
        // A group with a live registration is never evicted.
        let w = waiter();
        let kept = group(&mut t, &["kept", "shared"]);
        t.add(&w, kept);
        for i in 0..(2 * MAX_GROUPS) {
            let k = format!("m{i}");
            group(&mut t, &[&k, "shared"]);
        }
        check(&t);
        assert!(t.is_waited(0, b"kept"));
        assert!(Rc::ptr_eq(&t.first_live(0, b"shared").unwrap(), &w));
        // Dead, it goes like any other.
        w.claim.store(true, Ordering::Release);
        for i in 0..(2 * MAX_GROUPS) {
            let k = format!("n{i}");
            group(&mut t, &[&k]);
        }
        assert!(!t.is_waited(0, b"kept"));
        check(&t);
    }

    #[test]
    fn live_groups_past_the_cap_are_kept() {
        let mut t = BlockTable::default();
        let waiters: Vec<Rc<Waiter>> = (0..MAX_GROUPS + 10)
            .map(|i| {
                let w = waiter();
                let k = format!("k{i}");
                let g = group(&mut t, &[&k]);
                t.add(&w, g);
                w
            })
            .collect();
        assert_eq!(t.groups.len(), MAX_GROUPS + 10);
        assert!(Rc::ptr_eq(&t.first_live(0, b"k3").unwrap(), &waiters[3]));
        check(&t);
    }

    /// Random registrations, deaths and serves over overlapping sets of a few keys, each
    /// serve checked against the plain rule: the oldest live call naming the key.
    #[test]
    fn serving_matches_the_oldest_live_call_on_the_key() {
        let mut t = BlockTable::default();
        let keys = ["a", "b", "c", "d", "e", "f"];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        // Calls in blocking order: the waiter and the keys of its set.
        let mut calls: Vec<(Rc<Waiter>, Vec<&str>)> = Vec::new();
        for step in 0..20_000 {
            match next(4) {
                0 | 1 => {
                    let mut set: Vec<&str> =
                        keys.iter().copied().filter(|_| next(3) == 0).collect();
                    if set.is_empty() {
                        set.push(keys[next(6) as usize]);
                    }
                    let g = group(&mut t, &set);
                    let w = waiter();
                    t.add(&w, g);
                    calls.push((w, set));
                }
                2 => {
                    if !calls.is_empty() {
                        let i = next(calls.len() as u64) as usize;
                        calls[i].0.claim.store(true, Ordering::Release);
                    }
                }
                _ => {
                    let key = keys[next(6) as usize];
                    let want = calls
                        .iter()
                        .find(|(w, set)| !claimed(w) && set.contains(&key))
                        .map(|(w, _)| w.clone());
                    let got = t.first_live(0, key.as_bytes());
                    match (&want, &got) {
                        (None, None) => {}
                        (Some(a), Some(b)) => assert!(Rc::ptr_eq(a, b), "step {step}, key {key}"),
                        _ => panic!(
                            "step {step}, key {key}: want {} got {}",
                            want.is_some(),
                            got.is_some()
                        ),
                    }
                    // Served: it dies.
                    if let Some(w) = got {
                        w.claim.store(true, Ordering::Release);
                    }
                }
            }
            calls.retain(|(w, _)| !claimed(w));
            if step % 97 == 0 {
                // Queue metrics' consumers: per key, one way or the other, as the model.
                let live = t.live_counts();
                let waited = keys
                    .iter()
                    .filter(|key| calls.iter().any(|(_, set)| set.contains(key)))
                    .count();
                assert_eq!(t.keys_count(), waited, "step {step}");
                for key in keys {
                    let want = calls.iter().filter(|(_, set)| set.contains(&key)).count();
                    let k = key.as_bytes();
                    assert_eq!(live.on_key(0, k), want, "step {step}, key {key}");
                    assert_eq!(t.live_waiters(0, k), want, "step {step}, key {key}");
                    assert_eq!(t.has_live_waiter(0, k), want > 0, "step {step}, key {key}");
                }
            }
            if step % 1000 == 0 {
                check(&t);
            }
        }
        check(&t);
    }
}
