//! Intent locks of one shard.
//!
//! A multi-shard transaction locks exactly the keys it touches on each shard it touches
//! (or the whole shard, for FLUSHALL-like commands inside a transaction). Other work on
//! those keys waits in arrival order; work on other keys never waits. Transactions take
//! their shards in ascending shard order, and within a shard a waiter only waits for
//! holders and for earlier waiters sharing a key, so no cycle of waits can form.
//!
//! A pipelined group that runs on two shards as one unit (`server::dispatch::run_unit`)
//! holds its keys on its own shard for one round trip, shared for the keys it only reads.
//! It never waits for a lock (it runs the other way if a key is taken), so it adds no
//! wait to any cycle.
//!
//! Every hold and wait is kept by a 64-bit hash of the key rather than a copy of it:
//! taken and let go on every transaction and unit, a copy would be an allocation or a
//! count shared with the connection's read buffer (another thread's cache line). Two
//! keys of one hash only make one of them wait for the other.

use std::collections::VecDeque;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use hashbrown::HashMap;
use tokio::sync::oneshot;

use super::tx::Convoy;

/// What a lock request covers.
#[derive(Clone, Debug)]
pub enum LockKeys {
    Keys(Vec<Bytes>),
    All,
}

/// Work that waits for keys to become free.
pub enum Waiting {
    /// A transaction's lock request: the keys become held by it when granted.
    Grant(oneshot::Sender<()>),
    /// A command (or the rest of a pipelined batch) that runs once its keys are free,
    /// holding nothing while it waits.
    Run(Box<dyn FnOnce()>),
    /// Transactions travelling together from shard to shard (`tx::Convoy`), with their
    /// shares for this shard: the keys become held by them, then `start` runs them here.
    /// When it is granted, convoys queued behind it whose keys only it holds join it
    /// (`wake`).
    Convoy {
        convoy: Convoy,
        start: Box<dyn FnOnce(Convoy)>,
    },
}

struct Waiter {
    keys: LockKeys,
    /// Its keys' hashes (none for `LockKeys::All`).
    hashes: Vec<u64>,
    what: Waiting,
}

/// A map keyed by keys' hashes (`LockTable::hash`).
type ByHash<V> = HashMap<u64, V, BuildHasherDefault<HashIsKey>>;

#[derive(Default)]
pub struct LockTable {
    held: ByHash<u32>,
    all_held: u32,
    queue: VecDeque<Waiter>,
    /// Keys named by queued waiters, so a newcomer sharing one queues behind them.
    queued: ByHash<u32>,
    queued_all: u32,
    /// Keys held by units.
    unit_held: ByHash<UnitHold>,
    hash: hashbrown::DefaultHashBuilder,
    pub granted_total: u64,
    pub waited_total: u64,
    /// Transactions that joined a convoy granted ahead of them (`wake`).
    pub convoy_joins: u64,
    /// A `wake` kept a transaction queued behind work it restarted, which holds
    /// nothing: once that work has run, the queue is to be walked again (`take_rewake`).
    rewake: bool,
    /// `!tx_idle()`, published for other threads (`Shared::transacting`), and the value
    /// last stored there.
    hint: Arc<Hint>,
    hinted: bool,
}

/// One shard's flag in `Shared::transacting`, alone on its cache lines: its shard may
/// write it on every transaction, and a neighbour written by another thread would make
/// both threads' writes miss.
#[repr(align(128))]
#[derive(Default)]
pub struct Hint(pub AtomicBool);

#[derive(Default)]
struct UnitHold {
    readers: u32,
    writers: u32,
}

/// The keys of the maps are hashes already.
#[derive(Default)]
struct HashIsKey(u64);

impl Hasher for HashIsKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The keys a unit holds: each key's hash, and whether the unit writes it.
pub type UnitKeys = Vec<(u64, bool)>;

impl LockTable {
    /// A lock table that keeps `hint` set while transactions hold or wait for keys.
    pub fn new(hint: Arc<Hint>) -> LockTable {
        LockTable {
            hint,
            ..LockTable::default()
        }
    }

    /// Publishes whether transactions hold or wait for keys here, when that changed.
    fn publish(&mut self) {
        let busy = !self.tx_idle();
        if busy != self.hinted {
            self.hinted = busy;
            self.hint.0.store(busy, Ordering::Relaxed);
        }
    }

    /// Nothing is locked or waiting: the common case, checked before anything else.
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.tx_idle() && self.unit_held.is_empty()
    }

    /// No transaction holds anything here and no work waits (units may hold keys).
    #[inline]
    pub fn tx_idle(&self) -> bool {
        self.all_held == 0 && self.held.is_empty() && self.queue.is_empty()
    }

    /// Whether a transaction holds the whole shard.
    pub fn whole_held(&self) -> bool {
        self.all_held > 0
    }

    /// Whether a transaction holds `key` here (or the whole shard).
    pub fn is_held(&self, key: &[u8]) -> bool {
        self.all_held > 0 || (!self.held.is_empty() && self.held.contains_key(&self.hash_of(key)))
    }

    /// Whether work on `keys` may run now without overtaking anyone.
    pub fn is_free<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) -> bool {
        self.is_free_to(keys, true)
    }

    /// `is_free` for work that writes the keys (`write`) or only reads them: reading, it
    /// may share them with units that only read them.
    pub fn is_free_to<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>, write: bool) -> bool {
        if self.is_idle() {
            return true;
        }
        if self.all_held > 0 || self.queued_all > 0 {
            return false;
        }
        keys.into_iter()
            .all(|k| self.free_to(self.hash_of(k), write))
    }

    fn hash_of(&self, key: &[u8]) -> u64 {
        self.hash.hash_one(key)
    }

    fn hashes(&self, keys: &LockKeys) -> Vec<u64> {
        match keys {
            LockKeys::All => Vec::new(),
            LockKeys::Keys(ks) => ks.iter().map(|k| self.hash_of(k)).collect(),
        }
    }

    /// Neither held nor waited for, and free of units for this use.
    fn free_to(&self, h: u64, write: bool) -> bool {
        !self.held.contains_key(&h) && !self.queued.contains_key(&h) && self.unit_allows(h, write)
    }

    fn unit_allows(&self, h: u64, write: bool) -> bool {
        if self.unit_held.is_empty() {
            return true;
        }
        match self.unit_held.get(&h) {
            None => true,
            Some(hold) => !write && hold.writers == 0,
        }
    }

    /// Takes a unit's keys, each `(key, writes)`, if every one is free for it now; never
    /// queues.
    pub fn try_hold_unit<'a>(
        &mut self,
        keys: impl IntoIterator<Item = (&'a [u8], bool)>,
    ) -> Option<UnitKeys> {
        if self.all_held > 0 || self.queued_all > 0 {
            return None;
        }
        let mut hashed = UnitKeys::new();
        for (k, write) in keys {
            let h = self.hash_of(k);
            if !self.free_to(h, write) {
                return None;
            }
            hashed.push((h, write));
        }
        for &(h, write) in &hashed {
            let hold = self.unit_held.entry(h).or_default();
            if write {
                hold.writers += 1;
            } else {
                hold.readers += 1;
            }
        }
        Some(hashed)
    }

    /// Lets go of a unit's keys and returns the work that may run now, in order, as
    /// `release` does.
    pub fn release_unit(&mut self, keys: &UnitKeys) -> Vec<Box<dyn FnOnce()>> {
        for &(h, write) in keys {
            if let Some(hold) = self.unit_held.get_mut(&h) {
                if write {
                    hold.writers -= 1;
                } else {
                    hold.readers -= 1;
                }
                if hold.readers == 0 && hold.writers == 0 {
                    self.unit_held.remove(&h);
                }
            }
        }
        if self.queue.is_empty() {
            return Vec::new();
        }
        self.wake()
    }

    /// `is_free_to` for work the queue has just restarted (`Waiting::Run`), checked before
    /// it runs the command it waited with: whoever still waits on its keys queued after
    /// it, so only holders count. Without this it would queue again at the back.
    pub fn may_resume<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>, write: bool) -> bool {
        self.all_held == 0
            && keys.into_iter().all(|k| {
                let h = self.hash_of(k);
                !self.held.contains_key(&h) && self.unit_allows(h, write)
            })
    }

    /// Whether a `wake` kept transactions queued behind restarted work, which has run
    /// by now: the caller walks the queue again (`rewake`).
    pub fn take_rewake(&mut self) -> bool {
        std::mem::take(&mut self.rewake)
    }

    /// Starts what waited behind restarted work (`take_rewake`).
    pub fn rewake(&mut self) -> Vec<Box<dyn FnOnce()>> {
        self.wake()
    }

    fn is_free_for(&self, keys: &LockKeys, hashes: &[u64]) -> bool {
        match keys {
            LockKeys::All => self.is_idle(),
            LockKeys::Keys(_) => {
                self.is_idle()
                    || (self.all_held == 0
                        && self.queued_all == 0
                        && hashes.iter().all(|&h| self.free_to(h, true)))
            }
        }
    }

    fn hold(&mut self, keys: &LockKeys, hashes: &[u64]) {
        match keys {
            LockKeys::All => self.all_held += 1,
            LockKeys::Keys(_) => {
                for &h in hashes {
                    *self.held.entry(h).or_insert(0) += 1;
                }
            }
        }
        self.granted_total += 1;
    }

    /// Takes the locks now if they are free, else queues the request; `grant` fires when
    /// the keys are held.
    pub fn acquire(&mut self, keys: LockKeys, grant: oneshot::Sender<()>) {
        let hashes = self.hashes(&keys);
        if self.is_free_for(&keys, &hashes) {
            self.hold(&keys, &hashes);
            self.publish();
            let _ = grant.send(());
        } else {
            self.enqueue_hashed(keys, hashes, Waiting::Grant(grant));
        }
    }

    /// Takes the locks for a convoy and hands it back to be started now if they are
    /// free, else queues it to be started once they are held. Either way its keys stay
    /// held, until `release` of each entry in `Convoy::granted`.
    #[allow(clippy::type_complexity)]
    pub fn acquire_convoy(
        &mut self,
        keys: LockKeys,
        mut convoy: Convoy,
        start: Box<dyn FnOnce(Convoy)>,
    ) -> Option<(Convoy, Box<dyn FnOnce(Convoy)>)> {
        let hashes = self.hashes(&keys);
        if self.is_free_for(&keys, &hashes) {
            self.hold(&keys, &hashes);
            self.publish();
            convoy.granted.push(keys);
            Some((convoy, start))
        } else {
            self.enqueue_hashed(keys, hashes, Waiting::Convoy { convoy, start });
            None
        }
    }

    /// Queues work behind the current holders of (or earlier waiters for) `keys`.
    pub fn enqueue(&mut self, keys: LockKeys, what: Waiting) {
        let hashes = self.hashes(&keys);
        self.enqueue_hashed(keys, hashes, what);
    }

    fn enqueue_hashed(&mut self, keys: LockKeys, hashes: Vec<u64>, what: Waiting) {
        self.waited_total += 1;
        match &keys {
            LockKeys::All => self.queued_all += 1,
            LockKeys::Keys(_) => {
                for &h in &hashes {
                    *self.queued.entry(h).or_insert(0) += 1;
                }
            }
        }
        self.queue.push_back(Waiter { keys, hashes, what });
        self.publish();
    }

    /// Releases a granted request and returns the work that may run now, in order. The
    /// caller runs the returned closures after it stops borrowing the shard.
    pub fn release(&mut self, keys: &LockKeys) -> Vec<Box<dyn FnOnce()>> {
        match keys {
            LockKeys::All => self.all_held -= 1,
            LockKeys::Keys(ks) => {
                for k in ks {
                    let h = self.hash_of(k);
                    if let Some(c) = self.held.get_mut(&h) {
                        *c -= 1;
                        if *c == 0 {
                            self.held.remove(&h);
                        }
                    }
                }
            }
        }
        self.wake()
    }

    fn unqueue(&mut self, w: &Waiter) {
        match w.keys {
            LockKeys::All => self.queued_all -= 1,
            LockKeys::Keys(_) => {
                for h in &w.hashes {
                    if let Some(c) = self.queued.get_mut(h) {
                        *c -= 1;
                        if *c == 0 {
                            self.queued.remove(h);
                        }
                    }
                }
            }
        }
    }

    /// Walks the queue in order and starts every waiter whose keys are free of holders and
    /// of earlier waiters still queued.
    ///
    /// Work restarted here (`Waiting::Run`) holds nothing until it runs, after this
    /// returns: a transaction behind it on one of its keys stays queued (else it would
    /// take the key first, and the work, finding it taken, would queue again at the back,
    /// for ever under a steady stream of transactions), and the caller walks the queue
    /// again once the work has run (`take_rewake`). Restarted work behind restarted work
    /// starts too: neither holds anything, and they run in queue order.
    fn wake(&mut self) -> Vec<Box<dyn FnOnce()>> {
        self.rewake = false;
        let mut runnable: Vec<Started> = Vec::new();
        // Convoys granted in this pass, still taking in the ones queued behind them.
        let mut forming: Vec<Forming> = Vec::new();
        let mut remaining = VecDeque::with_capacity(self.queue.len());
        // Keys of waiters that stay queued in this pass; later waiters sharing them stay too.
        let mut blocked: ByHash<()> = ByHash::default();
        let mut blocked_all = false;
        // Keys of the work restarted in this pass (`Waiting::Run`).
        let mut restarted: ByHash<()> = ByHash::default();
        let queue = std::mem::take(&mut self.queue);
        for w in queue {
            let all = matches!(w.keys, LockKeys::All);
            let mut overtakes = blocked_all
                || if all {
                    !blocked.is_empty()
                } else {
                    w.hashes.iter().any(|h| blocked.contains_key(h))
                };
            if !overtakes && !restarted.is_empty() && !matches!(w.what, Waiting::Run(_)) {
                let behind = all || w.hashes.iter().any(|h| restarted.contains_key(h));
                if behind {
                    overtakes = true;
                    self.rewake = true;
                }
            }
            // A convoy whose keys are held only by a convoy granted in this pass joins it:
            // it runs right after it here, goes on with it, in the same order, to every
            // later shard either of them has a share on, and its keys go with it.
            if let (false, false, Waiting::Convoy { convoy, .. }) =
                (overtakes || self.all_held > 0, all, &w.what)
            {
                let joins = forming.iter().position(|f| {
                    f.convoy
                        .as_ref()
                        .is_some_and(|c| c.len() + convoy.len() <= CONVOY_MOST)
                        && w.hashes.iter().all(|h| {
                            self.held.get(h).copied().unwrap_or(0)
                                == f.holds.get(h).copied().unwrap_or(0)
                                && self.unit_allows(*h, true)
                        })
                });
                if let Some(i) = joins {
                    self.unqueue(&w);
                    self.hold(&w.keys, &w.hashes);
                    let Waiting::Convoy { convoy, .. } = w.what else {
                        unreachable!("matched above")
                    };
                    let f = &mut forming[i];
                    for &h in &w.hashes {
                        *f.holds.entry(h).or_insert(0) += 1;
                    }
                    f.convoy.as_mut().expect("forming").absorb(convoy, w.keys);
                    self.convoy_joins += 1;
                    continue;
                }
            }
            let free = !overtakes
                && self.all_held == 0
                && if all {
                    self.held.is_empty() && self.unit_held.is_empty()
                } else {
                    w.hashes
                        .iter()
                        .all(|&h| !self.held.contains_key(&h) && self.unit_allows(h, true))
                };
            if free {
                self.unqueue(&w);
                match w.what {
                    Waiting::Grant(tx) => {
                        self.hold(&w.keys, &w.hashes);
                        runnable.push(Started::Now(Box::new(move || {
                            let _ = tx.send(());
                        })));
                    }
                    Waiting::Convoy { mut convoy, start } => {
                        self.hold(&w.keys, &w.hashes);
                        let mut holds = ByHash::default();
                        for &h in &w.hashes {
                            *holds.entry(h).or_insert(0) += 1;
                        }
                        convoy.granted.push(w.keys);
                        runnable.push(Started::Convoy(forming.len()));
                        forming.push(Forming {
                            holds,
                            convoy: Some(convoy),
                            start: Some(start),
                        });
                    }
                    Waiting::Run(f) => {
                        restarted.extend(w.hashes.iter().map(|&h| (h, ())));
                        runnable.push(Started::Now(f));
                    }
                }
            } else {
                if all {
                    blocked_all = true;
                } else {
                    blocked.extend(w.hashes.iter().map(|&h| (h, ())));
                }
                remaining.push_back(w);
            }
        }
        self.queue = remaining;
        self.publish();
        runnable
            .into_iter()
            .map(|r| match r {
                Started::Now(f) => f,
                Started::Convoy(i) => {
                    let f = &mut forming[i];
                    let (convoy, start) = (f.convoy.take(), f.start.take());
                    let (convoy, start) = (convoy.expect("once"), start.expect("once"));
                    Box::new(move || start(convoy)) as Box<dyn FnOnce()>
                }
            })
            .collect()
    }
}

/// The most transactions one convoy takes: all of them run in one go on each shard.
const CONVOY_MOST: usize = 64;

/// What `wake` starts, in queue order: a convoy's place is known before the convoys
/// queued behind it have joined.
enum Started {
    Now(Box<dyn FnOnce()>),
    Convoy(usize),
}

/// A convoy granted in the current `wake`, with the count of its holds on each key.
struct Forming {
    holds: ByHash<u32>,
    convoy: Option<Convoy>,
    start: Option<Box<dyn FnOnce(Convoy)>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    fn keys(ks: &[&str]) -> LockKeys {
        LockKeys::Keys(ks.iter().map(|k| Bytes::from(k.to_string())).collect())
    }

    #[test]
    fn waiters_run_in_order_after_release() {
        let mut t = LockTable::default();
        let (g, mut r) = oneshot::channel();
        t.acquire(keys(&["a", "b"]), g);
        assert!(r.try_recv().is_ok());
        assert!(!t.is_free([&b"a"[..]]));
        assert!(t.is_free([&b"c"[..]]));
        let log = Rc::new(RefCell::new(Vec::new()));
        let l1 = log.clone();
        t.enqueue(
            keys(&["a"]),
            Waiting::Run(Box::new(move || l1.borrow_mut().push(1))),
        );
        // A later request for a free key that an earlier waiter also wants must queue.
        assert!(!t.is_free([&b"a"[..]]));
        let (g2, mut r2) = oneshot::channel();
        t.acquire(keys(&["a", "c"]), g2);
        assert!(r2.try_recv().is_err());
        let runnable = t.release(&keys(&["a", "b"]));
        assert_eq!(runnable.len(), 1);
        for f in runnable {
            f();
        }
        assert_eq!(*log.borrow(), vec![1]);
        // The request queued behind the restarted command is granted once it has run.
        assert!(r2.try_recv().is_err());
        assert!(t.take_rewake());
        for f in t.rewake() {
            f();
        }
        assert!(r2.try_recv().is_ok());
        assert!(!t.is_free([&b"c"[..]]));
        assert!(t.release(&keys(&["a", "c"])).is_empty());
        assert!(t.is_idle());
    }

    #[test]
    fn a_transaction_queued_behind_restarted_work_waits_for_it_to_run() {
        let mut t = LockTable::default();
        let (g, _r) = oneshot::channel();
        t.acquire(keys(&["a"]), g);
        t.enqueue(keys(&["a"]), Waiting::Run(Box::new(|| {})));
        let (g2, mut r2) = oneshot::channel();
        t.acquire(keys(&["a", "b"]), g2);
        let runnable = t.release(&keys(&["a"]));
        assert_eq!(runnable.len(), 1, "only the restarted work starts");
        assert!(r2.try_recv().is_err());
        // The restarted work runs: only holders count for it, not the queue behind it.
        assert!(!t.is_free([&b"a"[..]]));
        assert!(t.may_resume([&b"a"[..]], true));
        assert!(t.take_rewake());
        let runnable = t.rewake();
        assert_eq!(runnable.len(), 1);
        for f in runnable {
            f();
        }
        assert!(r2.try_recv().is_ok());
        assert!(!t.take_rewake());
    }

    #[test]
    fn whole_shard_lock_waits_for_holders_and_blocks_everyone() {
        let mut t = LockTable::default();
        let (g, _r) = oneshot::channel();
        t.acquire(keys(&["a"]), g);
        let (ga, mut ra) = oneshot::channel();
        t.acquire(LockKeys::All, ga);
        assert!(ra.try_recv().is_err());
        assert!(!t.is_free([&b"z"[..]]));
        for f in t.release(&keys(&["a"])) {
            f();
        }
        assert!(ra.try_recv().is_ok());
        assert!(!t.is_free([&b"z"[..]]));
        assert!(t.release(&LockKeys::All).is_empty());
        assert!(t.is_idle());
    }
}
