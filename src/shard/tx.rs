//! Multi-shard transactions.
//!
//! A transaction gets a global id, locks exactly the keys it touches on each shard it
//! touches (ascending shard order, so it cannot deadlock with another), runs its steps on
//! those shards, and releases everything when dropped. Commands on other keys are never
//! held up by it.
//!
//! A transaction whose every command lives on one shard (`Tx::run_parts`) sends each
//! shard its share of the commands with the lock request: the share runs there as soon as
//! the keys are held, and the last shard's grant, which completes the set of locks, also
//! writes the transaction's block to the AOF and lets its own keys go at once. One round
//! trip per other shard, and the last shard's keys are held only while its share runs.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use super::locks::LockKeys;
use super::{hop, release_locks, Shard, Worker};
use crate::persist::aof::Piece;

/// One queued command of a transaction, run on its shard under the transaction's locks;
/// it returns its reply.
pub type Step = Box<dyn FnOnce(&mut Shard) -> BytesMut + Send>;

/// One shard's share of a transaction whose commands each live on one shard: the keys
/// it locks there and its commands, each with its place in the queue.
pub struct Part {
    pub shard: usize,
    pub keys: Vec<Bytes>,
    pub steps: Vec<(usize, Step)>,
}

/// What a share sends home: each command's reply, keyspace events and effects by its
/// place in the queue (no effects from the last share, which wrote the whole block), its
/// writes and how long it ran.
type KeyEvent = (usize, &'static str, Bytes);
struct PartDone {
    replies: Vec<(usize, BytesMut)>,
    events: Vec<(usize, Vec<KeyEvent>)>,
    effects: Vec<(usize, Piece)>,
    dirty: u64,
    ran_us: u64,
}

pub struct Tx {
    worker: Rc<Worker>,
    pub id: u64,
    held: Vec<(usize, LockKeys)>,
    /// Keyspace events of the steps, published in step order once the locks go (shards
    /// publishing on their own could reorder them).
    events: RefCell<Vec<(usize, &'static str, Bytes)>>,
    /// Effects of the steps, in step order, sent to the AOF as one block before the locks
    /// go (`Drop`).
    effects: RefCell<Vec<crate::persist::aof::Piece>>,
    /// Writes the steps made (the sum of the shards' `dirty` moves).
    dirty: Cell<u64>,
    /// What the running multi-shard command logs instead of its own words.
    rewrite: RefCell<Option<Vec<Vec<Bytes>>>>,
    /// How long the steps ran on other threads, in microseconds (the command's run time
    /// there; the wait for their answers is not).
    away_us: Cell<u64>,
}

/// Groups keys by owning shard, in ascending shard order, keeping repeats (EXISTS a a
/// counts twice).
pub fn keys_by_shard<'a>(
    worker: &Worker,
    keys: impl IntoIterator<Item = &'a Bytes>,
) -> Vec<(usize, Vec<Bytes>)> {
    let mut groups: Vec<(usize, Vec<Bytes>)> = Vec::new();
    for k in keys {
        let s = worker.shard_of(k);
        match groups.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push(k.clone()),
            None => groups.push((s, vec![k.clone()])),
        }
    }
    groups.sort_by_key(|g| g.0);
    groups
}

impl Tx {
    /// Locks `wants` shard by shard in ascending order and returns once all are held.
    fn new(worker: &Rc<Worker>, shards: usize) -> Tx {
        Tx {
            worker: worker.clone(),
            id: worker.shared.next_tx_id.fetch_add(1, Ordering::Relaxed),
            held: Vec::with_capacity(shards),
            events: RefCell::new(Vec::new()),
            effects: RefCell::new(Vec::new()),
            dirty: Cell::new(0),
            rewrite: RefCell::new(None),
            away_us: Cell::new(0),
        }
    }

    pub async fn begin(worker: &Rc<Worker>, mut wants: Vec<(usize, LockKeys)>) -> Tx {
        wants.sort_by_key(|w| w.0);
        let mut tx = Tx::new(worker, wants.len());
        for (shard, keys) in wants {
            let (grant, granted) = oneshot::channel();
            let request = keys.clone();
            // What the shard logged before the grant precedes this transaction's block.
            if shard == worker.id {
                let mut sh = worker.shard.borrow_mut();
                sh.aof_flush();
                sh.locks.acquire(request, grant);
            } else {
                worker.shard.borrow_mut().stats.hops += 1;
                worker.shared.send(
                    shard,
                    Box::new(move |w| {
                        let mut sh = w.shard.borrow_mut();
                        sh.aof_flush();
                        sh.locks.acquire(request, grant)
                    }),
                );
            }
            granted.await.expect("shard thread stopped");
            tx.held.push((shard, keys));
        }
        tracing::trace!(
            tx = tx.id,
            shards = tx.held.len(),
            "transaction holds its locks"
        );
        tx
    }

    /// Runs a transaction whose commands each live on one shard: shard by shard in
    /// ascending order, each share is sent with its lock request and runs where it is
    /// granted; the last share's grant holds the last of the locks, so it writes the
    /// whole block to the AOF there and lets every key of the transaction go. Returns the
    /// replies in queue order, and the `Tx` whose drop publishes the keyspace events.
    ///
    /// Running a share before the later shards are locked is safe: its keys stay held,
    /// so nothing sees its effects before the rest have run, and a transaction's commands
    /// never fail in a way that undoes them.
    pub async fn run_parts(worker: &Rc<Worker>, mut parts: Vec<Part>) -> (Tx, Vec<BytesMut>) {
        parts.sort_by_key(|p| p.shard);
        let mut tx = Tx::new(worker, parts.len());
        let mut replies: Vec<(usize, BytesMut)> = Vec::new();
        let mut events: Vec<(usize, Vec<KeyEvent>)> = Vec::new();
        // The earlier shares' effects, for the last share to write in queue order.
        let mut effects: Vec<(usize, Piece)> = Vec::new();
        let count = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            let shard = part.shard;
            let keys = LockKeys::Keys(part.keys);
            let last = i + 1 == count;
            // The last share lets every key go: the earlier shares' held at once after the
            // block, from there, not after its answer has come home.
            let finish = last.then(|| Finish {
                pieces: std::mem::take(&mut effects),
                earlier: std::mem::take(&mut tx.held),
            });
            let (done, answer) = oneshot::channel();
            let home = worker.id;
            let steps = part.steps;
            let lock = keys.clone();
            let ask = move |w: &Rc<Worker>| {
                let here = w.clone();
                let held = lock.clone();
                let then: Box<dyn FnOnce()> = Box::new(move || {
                    let out = run_part(&here, steps, finish, &held);
                    here.shared.answer(home, done, out);
                });
                let now = w.shard.borrow_mut().locks.acquire_then(lock, then);
                if let Some(then) = now {
                    then();
                }
            };
            if shard == worker.id {
                ask(worker);
            } else {
                worker.shard.borrow_mut().stats.hops += 1;
                worker.shared.send(shard, Box::new(ask));
            }
            let out: PartDone = answer.await.expect("shard thread stopped");
            if !last {
                tx.held.push((shard, keys));
            }
            if shard != worker.id {
                tx.away_us.set(tx.away_us.get() + out.ran_us);
            }
            effects.extend(out.effects);
            tx.dirty.set(tx.dirty.get() + out.dirty);
            replies.extend(out.replies);
            events.extend(out.events);
        }
        // Replies and keyspace events in the order the commands were queued.
        replies.sort_by_key(|r| r.0);
        events.sort_by_key(|e| e.0);
        tx.events
            .get_mut()
            .extend(events.into_iter().flat_map(|(_, e)| e));
        (tx, replies.into_iter().map(|(_, r)| r).collect())
    }

    /// Locks the given keys (grouped by shard) plus, with `all_shards`, every shard whole.
    pub async fn lock_keys(worker: &Rc<Worker>, keys: &[Bytes], all_shards: bool) -> Tx {
        let wants = if all_shards {
            (0..worker.nshards()).map(|s| (s, LockKeys::All)).collect()
        } else {
            keys_by_shard(worker, keys)
                .into_iter()
                .map(|(s, ks)| (s, LockKeys::Keys(ks)))
                .collect()
        };
        Tx::begin(worker, wants).await
    }

    /// Runs `f` on `shard` under this transaction's locks.
    pub async fn run<R, F>(&self, shard: usize, f: F) -> R
    where
        R: Send + 'static,
        F: FnOnce(&mut Shard) -> R + Send + 'static,
    {
        let away = shard != self.worker.id;
        let (result, events, piece, dirty, ran_us) = hop(&self.worker, shard, move |w| {
            let start = crate::clock::Stopwatch::start();
            let mut sh = w.shard.borrow_mut();
            sh.aof_hold();
            let mark = sh.aof.mark();
            let dirty_before = sh.dirty;
            let result = f(&mut sh);
            let piece = sh.aof.take_since(mark);
            sh.aof_release();
            let dirty = sh.dirty - dirty_before;
            let events = std::mem::take(&mut sh.events);
            (result, events, piece, dirty, start.elapsed_us())
        })
        .await;
        // A step on this thread ran inline, inside its caller's own run time.
        if away {
            self.away_us.set(self.away_us.get() + ran_us);
        }
        self.events.borrow_mut().extend(events);
        self.push_piece(piece);
        self.dirty.set(self.dirty.get() + dirty);
        result
    }

    /// How long the steps ran on other threads so far, in microseconds.
    pub fn away_us(&self) -> u64 {
        self.away_us.get()
    }

    /// Writes made by the steps so far.
    pub fn dirty(&self) -> u64 {
        self.dirty.get()
    }

    pub fn push_piece(&self, piece: crate::persist::aof::Piece) {
        if !piece.bytes.is_empty() {
            self.effects.borrow_mut().push(piece);
        }
    }

    /// Logs one command as part of this transaction's block.
    pub fn log(&self, db: usize, argv: &[Bytes]) {
        if !self.worker.shared.persist.aof.is_on() {
            return;
        }
        let mut e = crate::persist::aof::Effects::default();
        e.push(db, argv);
        self.push_piece(e.take_all());
    }

    /// Makes the running multi-shard command log `argv` instead of its own words.
    pub fn log_as(&self, argv: Vec<Bytes>) {
        self.rewrite
            .borrow_mut()
            .get_or_insert_with(Vec::new)
            .push(argv);
    }

    /// Runs a multi-shard command's handler and logs its effect: the rewrite it chose,
    /// else its own words when it changed something.
    pub async fn logged<'a>(
        &'a self,
        db: usize,
        args: &'a [Bytes],
        run: impl std::future::Future<Output = ()> + 'a,
    ) {
        let before = self.dirty();
        *self.rewrite.borrow_mut() = None;
        run.await;
        let rewrite = self.rewrite.borrow_mut().take();
        match rewrite {
            Some(list) => {
                for argv in &list {
                    self.log(db, argv);
                }
            }
            None if self.dirty() != before => self.log(db, args),
            None => {}
        }
    }
}

/// What the last share of `Tx::run_parts` finishes the transaction with: the earlier
/// shares' effects, and the keys they hold.
struct Finish {
    pieces: Vec<(usize, Piece)>,
    earlier: Vec<(usize, LockKeys)>,
}

/// Runs a share of `Tx::run_parts` on its shard, whose keys it holds; the last share also
/// writes the transaction's block and lets every key of the transaction go.
fn run_part(
    w: &Rc<Worker>,
    steps: Vec<(usize, Step)>,
    finish: Option<Finish>,
    keys: &LockKeys,
) -> PartDone {
    let start = crate::clock::Stopwatch::start();
    let mut sh = w.shard.borrow_mut();
    // What this shard logged before the grant precedes the transaction's block.
    sh.aof_flush();
    sh.aof_hold();
    let dirty_before = sh.dirty;
    let mut replies = Vec::with_capacity(steps.len());
    let mut events = Vec::new();
    let mut effects = Vec::new();
    for (at, step) in steps {
        let mark = sh.aof.mark();
        replies.push((at, step(&mut sh)));
        let piece = sh.aof.take_since(mark);
        if !piece.bytes.is_empty() {
            effects.push((at, piece));
        }
        if !sh.events.is_empty() {
            events.push((at, std::mem::take(&mut sh.events)));
        }
    }
    sh.aof_release();
    let dirty = sh.dirty - dirty_before;
    drop(sh);
    let ran_us = start.elapsed_us();
    if let Some(Finish {
        mut pieces,
        earlier,
    }) = finish
    {
        // Every lock of the transaction is held here: the block follows what ran before
        // on its keys and precedes what runs after. Its commands go in queue order, as a
        // replica or a replay must apply them.
        pieces.append(&mut effects);
        pieces.sort_by_key(|p| p.0);
        let block = crate::persist::aof::effects::wrap(pieces.into_iter().map(|p| p.1).collect());
        w.shared.persist.aof.send_piece(block);
        release_locks(w, keys);
        // Each earlier share is on another shard, so another thread.
        for (shard, keys) in earlier {
            w.shared
                .send(shard, Box::new(move |w| release_locks(w, &keys)));
        }
    }
    PartDone {
        replies,
        events,
        effects,
        dirty,
        ran_us,
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        // The block goes to the AOF while every lock is still held: it follows what ran
        // before on these keys and precedes what runs after.
        let effects = std::mem::take(self.effects.get_mut());
        if !effects.is_empty() {
            let block = crate::persist::aof::effects::wrap(effects);
            self.worker.shared.persist.aof.send_piece(block);
        }
        tracing::trace!(tx = self.id, "transaction releases its locks");
        for (shard, keys) in self.held.drain(..) {
            if shard == self.worker.id {
                release_locks(&self.worker, &keys);
            } else {
                self.worker
                    .shared
                    .send(shard, Box::new(move |w| release_locks(w, &keys)));
            }
        }
        for (db, event, key) in self.events.take() {
            crate::pubsub::publish_event(&self.worker, db, event, &key);
        }
    }
}
