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
//! wait to any cycle. Taken and let go on every such group, these holds are kept by a
//! hash of the key rather than a copy of it; two keys of one hash only make one of them
//! wait for the other's unit.

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
    what: Waiting,
}

#[derive(Default)]
pub struct LockTable {
    held: HashMap<Bytes, u32>,
    all_held: u32,
    queue: VecDeque<Waiter>,
    /// Keys named by queued waiters, so a newcomer sharing one queues behind them.
    queued: HashMap<Bytes, u32>,
    queued_all: u32,
    /// Keys held by units, by `hash`.
    unit_held: HashMap<u64, UnitHold, BuildHasherDefault<HashIsKey>>,
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

/// The keys of `unit_held` are hashes already.
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

    /// Whether a transaction holds `key` here (or the whole shard).
    pub fn is_held(&self, key: &[u8]) -> bool {
        self.all_held > 0 || (!self.held.is_empty() && self.held.contains_key(key))
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
        keys.into_iter().all(|k| {
            !self.held.contains_key(k) && !self.queued.contains_key(k) && self.unit_allows(k, write)
        })
    }

    fn unit_allows(&self, key: &[u8], write: bool) -> bool {
        if self.unit_held.is_empty() {
            return true;
        }
        match self.unit_held.get(&self.hash.hash_one(key)) {
            None => true,
            Some(h) => !write && h.writers == 0,
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
            let free = !self.held.contains_key(k)
                && !self.queued.contains_key(k)
                && self.unit_allows(k, write);
            if !free {
                return None;
            }
            hashed.push((self.hash.hash_one(k), write));
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
            && keys
                .into_iter()
                .all(|k| !self.held.contains_key(k) && self.unit_allows(k, write))
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

    fn is_free_for(&self, keys: &LockKeys) -> bool {
        match keys {
            LockKeys::All => self.is_idle(),
            LockKeys::Keys(ks) => self.is_free(ks.iter().map(|k| &k[..])),
        }
    }

    fn hold(&mut self, keys: &LockKeys) {
        match keys {
            LockKeys::All => self.all_held += 1,
            LockKeys::Keys(ks) => {
                for k in ks {
                    *self.held.entry(k.clone()).or_insert(0) += 1;
                }
            }
        }
        self.granted_total += 1;
    }

    /// Takes the locks now if they are free, else queues the request; `grant` fires when
    /// the keys are held.
    pub fn acquire(&mut self, keys: LockKeys, grant: oneshot::Sender<()>) {
        if self.is_free_for(&keys) {
            self.hold(&keys);
            self.publish();
            let _ = grant.send(());
        } else {
            self.enqueue(keys, Waiting::Grant(grant));
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
        if self.is_free_for(&keys) {
            self.hold(&keys);
            self.publish();
            convoy.granted.push(keys);
            Some((convoy, start))
        } else {
            self.enqueue(keys, Waiting::Convoy { convoy, start });
            None
        }
    }

    /// Queues work behind the current holders of (or earlier waiters for) `keys`.
    pub fn enqueue(&mut self, keys: LockKeys, what: Waiting) {
        self.waited_total += 1;
        match &keys {
            LockKeys::All => self.queued_all += 1,
            LockKeys::Keys(ks) => {
                for k in ks {
                    *self.queued.entry(k.clone()).or_insert(0) += 1;
                }
            }
        }
        self.queue.push_back(Waiter { keys, what });
        self.publish();
    }

    /// Releases a granted request and returns the work that may run now, in order. The
    /// caller runs the returned closures after it stops borrowing the shard.
    pub fn release(&mut self, keys: &LockKeys) -> Vec<Box<dyn FnOnce()>> {
        match keys {
            LockKeys::All => self.all_held -= 1,
            LockKeys::Keys(ks) => {
                for k in ks {
                    if let Some(c) = self.held.get_mut(k) {
                        *c -= 1;
                        if *c == 0 {
                            self.held.remove(k);
                        }
                    }
                }
            }
        }
        self.wake()
    }

    fn unqueue(&mut self, keys: &LockKeys) {
        match keys {
            LockKeys::All => self.queued_all -= 1,
            LockKeys::Keys(ks) => {
                for k in ks {
                    if let Some(c) = self.queued.get_mut(k) {
                        *c -= 1;
                        if *c == 0 {
                            self.queued.remove(k);
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
        let mut blocked: HashMap<Bytes, ()> = HashMap::new();
        let mut blocked_all = false;
        // Keys of the work restarted in this pass (`Waiting::Run`).
        let mut restarted: HashMap<Bytes, ()> = HashMap::new();
        let queue = std::mem::take(&mut self.queue);
        for w in queue {
            let mut overtakes = match &w.keys {
                LockKeys::All => blocked_all || !blocked.is_empty(),
                LockKeys::Keys(ks) => blocked_all || ks.iter().any(|k| blocked.contains_key(k)),
            };
            if !overtakes && !restarted.is_empty() && !matches!(w.what, Waiting::Run(_)) {
                let behind = match &w.keys {
                    LockKeys::All => true,
                    LockKeys::Keys(ks) => ks.iter().any(|k| restarted.contains_key(k)),
                };
                if behind {
                    overtakes = true;
                    self.rewake = true;
                }
            }
            // A convoy whose keys are held only by a convoy granted in this pass joins it:
            // it runs right after it here, goes on with it, in the same order, to every
            // later shard either of them has a share on, and its keys go with it.
            if let (false, LockKeys::Keys(ks), Waiting::Convoy { convoy, .. }) =
                (overtakes || self.all_held > 0, &w.keys, &w.what)
            {
                let joins = forming.iter().position(|f| {
                    f.convoy
                        .as_ref()
                        .is_some_and(|c| c.len() + convoy.len() <= CONVOY_MOST)
                        && ks.iter().all(|k| {
                            self.held.get(k).copied().unwrap_or(0)
                                == f.holds.get(k).copied().unwrap_or(0)
                                && self.unit_allows(k, true)
                        })
                });
                if let Some(i) = joins {
                    self.unqueue(&w.keys);
                    self.hold(&w.keys);
                    let Waiting::Convoy { convoy, .. } = w.what else {
                        unreachable!("matched above")
                    };
                    let f = &mut forming[i];
                    for k in ks {
                        *f.holds.entry(k.clone()).or_insert(0) += 1;
                    }
                    f.convoy.as_mut().expect("forming").absorb(convoy, w.keys);
                    self.convoy_joins += 1;
                    continue;
                }
            }
            let free = !overtakes
                && self.all_held == 0
                && match &w.keys {
                    LockKeys::All => self.held.is_empty() && self.unit_held.is_empty(),
                    LockKeys::Keys(ks) => ks
                        .iter()
                        .all(|k| !self.held.contains_key(k) && self.unit_allows(k, true)),
                };
            if free {
                self.unqueue(&w.keys);
                match w.what {
                    Waiting::Grant(tx) => {
                        self.hold(&w.keys);
                        runnable.push(Started::Now(Box::new(move || {
                            let _ = tx.send(());
                        })));
                    }
                    Waiting::Convoy { mut convoy, start } => {
                        self.hold(&w.keys);
                        let mut holds = HashMap::new();
                        if let LockKeys::Keys(ks) = &w.keys {
                            for k in ks {
                                *holds.entry(k.clone()).or_insert(0) += 1;
                            }
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
                        if let LockKeys::Keys(ks) = w.keys {
                            restarted.extend(ks.into_iter().map(|k| (k, ())));
                        }
                        runnable.push(Started::Now(f));
                    }
                }
            } else {
                match &w.keys {
                    LockKeys::All => blocked_all = true,
                    LockKeys::Keys(ks) => {
                        for k in ks {
                            blocked.insert(k.clone(), ());
                        }
                    }
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
    holds: HashMap<Bytes, u32>,
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
