//! Queue metrics (docs/observe.md): which keys are queues, their counters, wait-time
//! histograms and history. Each thread keeps the queues of its own shard in
//! `Shard.queues`; readers merge the threads' answers (`report`).
//!
//! This module owns the per-thread queue tables and everything that renders them (INFO,
//! KITE QUEUES, Prometheus, the dashboard's JSON and page). It never changes a key,
//! never parses a job, and never touches a socket: the HTTP side is `crate::net::http`.

pub mod api;
pub mod classify;
pub mod hist;
pub mod prometheus;
pub mod report;

use std::collections::VecDeque;

use hashbrown::HashMap;

use classify::{classify, waiting_suffix, Class, Framework, Role};
pub use hist::Hist;

/// The dashboard: one page, no build step, no external assets.
pub const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// Seconds of history kept per queue.
pub const HISTORY_SECS: usize = 300;
/// A queue whose key has been gone this long (with nobody blocked on it) is forgotten;
/// sooner once the table is nine tenths full, so keys popped once do not crowd out the
/// queues that are used.
const FORGET_AFTER_MS: u64 = 10 * 60 * 1000;
const FORGET_WHEN_FULL_MS: u64 = 60 * 1000;

/// Applies `queue-tracking` and this thread's share of `queue-tracking-max-queues` to
/// the thread's table.
pub fn configure(worker: &crate::shard::Worker) {
    use std::sync::atomic::Ordering;
    let t = &worker.shared.tunables;
    let enabled = t.queue_tracking.load(Ordering::Relaxed);
    let max = t.queue_tracking_max.load(Ordering::Relaxed);
    let cap = thread_share(max, worker.id, worker.nshards());
    worker.shard.borrow_mut().queues.configure(enabled, cap);
}

/// Thread `id`'s part of a cap of `max` queues over `threads` threads: the parts add up
/// to `max` exactly, so the server never tracks more than its cap, even where a thread's
/// part is no queue at all.
fn thread_share(max: usize, id: usize, threads: usize) -> usize {
    max / threads + usize::from(id < max % threads)
}

/// One second of a queue's life: its depth then, and its pushes and pops during it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub unix_s: u32,
    pub depth: u32,
    pub pushed: u32,
    pub popped: u32,
}

/// A tracked key.
pub struct Entry {
    pub framework: Framework,
    pub role: Role,
    pub row_len: usize,
    pub pushed: u64,
    pub popped: u64,
    /// Pushes at the head (LPUSH): tells which end the newest elements are at.
    pub pushed_front: u64,
    pub hist: Hist,
    pub history: VecDeque<Sample>,
    sampled: (u64, u64),
    last_active_ms: u64,
}

impl Entry {
    fn new(class: Class, now_ms: u64) -> Entry {
        Entry {
            framework: class.framework,
            role: class.role,
            row_len: class.row_len,
            pushed: 0,
            popped: 0,
            pushed_front: 0,
            hist: Hist::default(),
            history: VecDeque::new(),
            sampled: (0, 0),
            last_active_ms: now_ms,
        }
    }
}

/// The push times of popped elements, gathered while popping (one pop of a single
/// element, the common case, needs no allocation).
#[derive(Default)]
pub struct Waits {
    first: Option<u64>,
    rest: Vec<u64>,
    count: u64,
}

impl Waits {
    #[inline]
    pub fn popped(&mut self, pushed_ms: Option<u64>) {
        self.count += 1;
        if let Some(t) = pushed_ms {
            if self.first.is_none() {
                self.first = Some(t);
            } else {
                self.rest.push(t);
            }
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    fn times(&self) -> impl Iterator<Item = u64> + '_ {
        self.first.into_iter().chain(self.rest.iter().copied())
    }
}

/// What a lookup found: the key's entry, a layout key whose queue should be tracked, or
/// nothing to count.
enum Lookup<'a> {
    Found(&'a mut Entry),
    Discover(Class),
    Nothing,
}

/// The queues of one shard.
///
/// Entries live in a slab, found by (database, key) through a per-database index; the
/// last entry found is remembered, so a queue pushed to and popped from over and over
/// (what a busy queue sees) is found with a key comparison instead of a hash.
#[derive(Default)]
pub struct QueueTable {
    pub enabled: bool,
    cap: usize,
    prefixes: Vec<Vec<u8>>,
    slab: Vec<Slot>,
    index: Vec<HashMap<Box<[u8]>, u32>>,
    last: Option<u32>,
    scratch: Vec<u8>,
    /// Times a key would have become a queue but the table was full.
    pub overflow: u64,
}

struct Slot {
    db: usize,
    key: Box<[u8]>,
    entry: Entry,
}

impl QueueTable {
    pub fn new(prefixes: Vec<Vec<u8>>) -> QueueTable {
        QueueTable {
            enabled: true,
            cap: 1024,
            prefixes,
            ..Default::default()
        }
    }

    /// Applies `queue-tracking` and this thread's share of `queue-tracking-max-queues`.
    pub fn configure(&mut self, enabled: bool, cap: usize) {
        if !enabled && !self.slab.is_empty() {
            self.slab.clear();
            self.index.clear();
            self.last = None;
        }
        self.enabled = enabled;
        self.cap = cap;
    }

    pub fn len(&self) -> usize {
        self.slab.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    pub fn entries(&self) -> impl Iterator<Item = (usize, &[u8], &Entry)> {
        self.slab.iter().map(|s| (s.db, &s.key[..], &s.entry))
    }

    fn find(&self, db: usize, key: &[u8]) -> Option<u32> {
        self.index.get(db)?.get(key).copied()
    }

    /// Starts tracking `key` unless the table is full.
    fn insert(&mut self, db: usize, key: &[u8], class: Class, now_ms: u64) -> Option<&mut Entry> {
        if let Some(i) = self.find(db, key) {
            return Some(&mut self.slab[i as usize].entry);
        }
        self.insert_new(db, key, class, now_ms)
    }

    /// `insert` for a key `find` has just missed. Past the cap, every pop of an untracked
    /// list comes here: a second lookup was a tenth of RPOP's instructions over 10 000
    /// lists.
    fn insert_new(
        &mut self,
        db: usize,
        key: &[u8],
        class: Class,
        now_ms: u64,
    ) -> Option<&mut Entry> {
        if self.slab.len() >= self.cap {
            self.overflow += 1;
            return None;
        }
        if self.index.len() <= db {
            self.index.resize_with(db + 1, HashMap::new);
        }
        let i = self.slab.len() as u32;
        self.index[db].insert(key.into(), i);
        self.slab.push(Slot {
            db,
            key: key.into(),
            entry: Entry::new(class, now_ms),
        });
        self.last = Some(i);
        Some(&mut self.slab[i as usize].entry)
    }

    /// The entry counting `key`'s pushes and pops, created when `key` is a queue (`take`:
    /// something takes from it). A key of a `<prefix>:<queue>` layout that is not its
    /// waiting list makes sure the waiting list is tracked (it is on this shard too).
    #[inline]
    fn entry_for(&mut self, db: usize, key: &[u8], take: bool, now_ms: u64) -> Lookup<'_> {
        if let Some(i) = self.last {
            let s = &self.slab[i as usize];
            if s.db == db && *s.key == *key {
                return Lookup::Found(&mut self.slab[i as usize].entry);
            }
        }
        if let Some(i) = self.find(db, key) {
            self.last = Some(i);
            return Lookup::Found(&mut self.slab[i as usize].entry);
        }
        let class = match classify(key, &self.prefixes) {
            Some(c) if c.role == Role::Waiting => c,
            Some(c) if c.stem_len > 0 => return Lookup::Discover(c),
            Some(_) => return Lookup::Nothing,
            None if take => Class {
                framework: Framework::None,
                role: Role::Waiting,
                row_len: key.len(),
                stem_len: 0,
            },
            None => return Lookup::Nothing,
        };
        match self.insert_new(db, key, class, now_ms) {
            Some(e) => Lookup::Found(e),
            None => Lookup::Nothing,
        }
    }

    /// Tracks the waiting list of the `<prefix>:<queue>` that `key` belongs to, noting
    /// what `key` says about the framework (BullMQ's own keys).
    fn discover(&mut self, db: usize, key: &[u8], c: Class, now_ms: u64) {
        let stem = &key[..c.stem_len];
        let framework = if c.framework == Framework::BeeQueue {
            Framework::BeeQueue
        } else {
            Framework::Bull
        };
        // Every BullMQ add and completion writes such a key: no allocation per call.
        let mut wait = std::mem::take(&mut self.scratch);
        wait.clear();
        wait.extend_from_slice(stem);
        wait.extend_from_slice(waiting_suffix(framework));
        let class = Class {
            framework,
            role: Role::Waiting,
            row_len: c.stem_len,
            stem_len: c.stem_len,
        };
        if let Some(e) = self.insert(db, &wait, class, now_ms) {
            if c.framework == Framework::Bullmq {
                e.framework = Framework::Bullmq;
            }
        }
        self.scratch = wait;
    }

    /// `n` elements were pushed to `key` (at the head when `front`).
    #[inline]
    pub fn pushed(&mut self, db: usize, key: &[u8], n: u64, front: bool, now_ms: u64) {
        if !self.enabled {
            return;
        }
        match self.entry_for(db, key, false, now_ms) {
            Lookup::Found(e) => {
                if e.role == Role::Waiting {
                    e.pushed += n;
                    if front {
                        e.pushed_front += n;
                    }
                }
                e.last_active_ms = now_ms;
            }
            Lookup::Discover(c) => self.discover(db, key, c, now_ms),
            Lookup::Nothing => {}
        }
    }

    /// Elements were taken from `key`; `waits` holds their push times where known.
    #[inline]
    pub fn popped(&mut self, db: usize, key: &[u8], waits: &Waits, now_ms: u64) {
        if !self.enabled || waits.count == 0 {
            return;
        }
        match self.entry_for(db, key, true, now_ms) {
            Lookup::Found(e) => {
                if e.role == Role::Waiting {
                    e.popped += waits.count;
                    for t in waits.times() {
                        e.hist.record_ms(now_ms.saturating_sub(t));
                    }
                }
                e.last_active_ms = now_ms;
            }
            Lookup::Discover(c) => self.discover(db, key, c, now_ms),
            Lookup::Nothing => {}
        }
    }

    /// A client blocked on `key`: a queue from now on. A marker key (BullMQ) is tracked
    /// for its consumers.
    pub fn blocked(&mut self, db: usize, key: &[u8], now_ms: u64) {
        if !self.enabled {
            return;
        }
        if let Some(c) = classify(key, &self.prefixes).filter(|c| c.role == Role::Consumer) {
            self.insert(db, key, c, now_ms);
            self.discover(db, key, c, now_ms);
            return;
        }
        match self.entry_for(db, key, true, now_ms) {
            Lookup::Found(e) => e.last_active_ms = now_ms,
            Lookup::Discover(c) => self.discover(db, key, c, now_ms),
            Lookup::Nothing => {}
        }
    }

    /// Once a second: records each queue's second, and forgets queues long gone.
    /// `depth` gives a key's length, None when it does not exist and nobody waits on it.
    pub fn sample(&mut self, now_ms: u64, mut depth: impl FnMut(usize, &[u8]) -> Option<u64>) {
        let unix_s = (now_ms / 1000) as u32;
        let before = self.slab.len();
        let forget_after = if self.slab.len() * 10 >= self.cap * 9 {
            FORGET_WHEN_FULL_MS
        } else {
            FORGET_AFTER_MS
        };
        self.slab.retain_mut(|slot| {
            let e = &mut slot.entry;
            let d = depth(slot.db, &slot.key);
            if d.is_some() {
                e.last_active_ms = e.last_active_ms.max(now_ms);
            } else if now_ms.saturating_sub(e.last_active_ms) > forget_after {
                return false;
            }
            if e.history.len() >= HISTORY_SECS {
                e.history.pop_front();
            }
            let s = Sample {
                unix_s,
                depth: d.unwrap_or(0).min(u32::MAX as u64) as u32,
                pushed: (e.pushed - e.sampled.0).min(u32::MAX as u64) as u32,
                popped: (e.popped - e.sampled.1).min(u32::MAX as u64) as u32,
            };
            e.sampled = (e.pushed, e.popped);
            e.history.push_back(s);
            true
        });
        if self.slab.len() != before {
            // Positions moved: index the slab again.
            self.last = None;
            for m in &mut self.index {
                m.clear();
            }
            for (i, slot) in self.slab.iter().enumerate() {
                self.index[slot.db].insert(slot.key.clone(), i as u32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::thread_share;

    #[test]
    fn thread_shares_add_up_to_the_cap() {
        for threads in 1..=16 {
            for max in [0, 1, 2, 3, 7, 1024, 1025] {
                let parts: Vec<usize> = (0..threads)
                    .map(|id| thread_share(max, id, threads))
                    .collect();
                assert_eq!(parts.iter().sum::<usize>(), max, "{max} over {threads}");
                let (lo, hi) = (parts.iter().min().unwrap(), parts.iter().max().unwrap());
                assert!(hi - lo <= 1, "{max} over {threads}: {parts:?}");
            }
        }
    }
}
