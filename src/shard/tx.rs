//! Multi-shard transactions.
//!
//! A transaction gets a global id, locks exactly the keys it touches on each shard it
//! touches (ascending shard order, so it cannot deadlock with another), runs its steps on
//! those shards, and releases everything when dropped. Commands on other keys are never
//! held up by it.
//!
//! A transaction whose every command lives on one shard (`Tx::run_parts`) travels from
//! shard to shard with its commands: each shard runs its share as soon as the keys are
//! held and sends the rest on, and the last shard's grant, which completes the set of
//! locks, also writes the transaction's block to the AOF and lets every key go. One
//! message per other shard; transactions queued behind one another on a shard go along
//! together (a convoy), so a key all of them name is held for one round trip per convoy.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
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

type KeyEvent = (usize, &'static str, Bytes);

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
    /// Shards where the steps left blocked clients ready, served when the locks go.
    readied: RefCell<Vec<usize>>,
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
    pub async fn begin(worker: &Rc<Worker>, mut wants: Vec<(usize, LockKeys)>) -> Tx {
        wants.sort_by_key(|w| w.0);
        let mut tx = Tx {
            worker: worker.clone(),
            id: worker.shared.next_tx_id.fetch_add(1, Ordering::Relaxed),
            held: Vec::with_capacity(wants.len()),
            events: RefCell::new(Vec::new()),
            effects: RefCell::new(Vec::new()),
            dirty: Cell::new(0),
            rewrite: RefCell::new(None),
            away_us: Cell::new(0),
            readied: RefCell::new(Vec::new()),
        };
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

    /// Runs a transaction whose commands each live on one shard. It travels along its
    /// shards in ascending order (`arrive`): on each, its share goes with the lock
    /// request and runs as soon as its keys are held, and the shard sends the rest of it
    /// on to the next. The last shard's grant holds the last of the locks, so it writes
    /// the whole block to the AOF there, publishes the keyspace events and lets every key
    /// of the transaction go (in a convoy, the convoy's last shard does, for every
    /// member). Returns the replies in queue order, and how long its shares
    /// ran on other threads (µs).
    ///
    /// Running a share before the later shards are locked is safe: its keys stay held,
    /// so nothing sees its effects before the rest have run, and a transaction's commands
    /// never fail in a way that undoes them.
    ///
    /// Transactions queued on a shard behind one that is granted, blocked only by its
    /// keys, join it as a convoy (`LockTable::wake`): they run after it there and travel
    /// with it, in that order, to every later shard any of them has a share on, so a key
    /// every transaction names (Sidekiq's `queues`) is held for one round trip per
    /// convoy, not per transaction.
    pub async fn run_parts(
        worker: &Rc<Worker>,
        client_id: u64,
        mut parts: Vec<Part>,
    ) -> (Vec<BytesMut>, u64) {
        parts.sort_by_key(|p| p.shard);
        let remote = parts.iter().filter(|p| p.shard != worker.id).count() as u64;
        worker.shard.borrow_mut().stats.hops += remote;
        let (done, answer) = oneshot::channel();
        let first = parts[0].shard;
        let convoy = Convoy {
            shared: worker.shared.clone(),
            members: vec![Chained {
                home: worker.id,
                done: Some(done),
                shares: parts.into(),
                effects: Vec::new(),
                replies: Vec::new(),
                events: Vec::new(),
                slow: Vec::new(),
                away_us: 0,
                readied: Vec::new(),
                settle: Vec::new(),
                failed: false,
            }],
            granted: Vec::new(),
            held: Vec::new(),
        };
        if first == worker.id {
            arrive(worker, convoy);
        } else {
            worker
                .shared
                .send(first, Box::new(move |w| arrive(w, convoy)));
        }
        let mut out: Chained = answer.await.expect("shard thread stopped");
        if !out.settle.is_empty() {
            super::settle(std::mem::take(&mut out.settle)).await;
        }
        if !out.slow.is_empty() {
            super::log_slow_from_away(worker, client_id, std::mem::take(&mut out.slow));
        }
        out.replies.sort_by_key(|r| r.0);
        (
            out.replies.into_iter().map(|(_, r)| r).collect(),
            out.away_us,
        )
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
        let (result, events, piece, dirty, ran_us, readied) = hop(&self.worker, shard, move |w| {
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
            let readied = sh.blocking.has_ready();
            (result, events, piece, dirty, start.elapsed_us(), readied)
        })
        .await;
        if readied && !self.readied.borrow().contains(&shard) {
            self.readied.borrow_mut().push(shard);
        }
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

/// A transaction of `Tx::run_parts` on its way along its shards; what comes home.
pub struct Chained {
    home: usize,
    done: Option<oneshot::Sender<Chained>>,
    /// Its shares still to run, in ascending shard order.
    shares: VecDeque<Part>,
    /// Each command's effects, reply and keyspace events, by its place in the queue.
    effects: Vec<(usize, Piece)>,
    replies: Vec<(usize, BytesMut)>,
    events: Vec<(usize, Vec<KeyEvent>)>,
    /// Slow-log entries of its commands, for its connection's thread to name the client.
    slow: Vec<super::logs::SlowEntry>,
    /// How long its shares ran on threads other than its connection's.
    away_us: u64,
    /// Shards where its shares left blocked clients ready, to be served when its keys
    /// there go.
    readied: Vec<usize>,
    /// Moves those clients set off (a BLMOVE to another shard), to land before its
    /// connection answers, as a batch's do (`BatchResult::settle`).
    settle: Vec<oneshot::Receiver<()>>,
    /// One of its commands panicked: the rest of it did not run.
    failed: bool,
}

/// Transactions travelling together from shard to shard in ascending order, in the
/// order they run on each, with the keys they hold on the shards behind them.
pub struct Convoy {
    shared: std::sync::Arc<super::Shared>,
    members: Vec<Chained>,
    /// Lock requests granted to it on the shard it is at (one per member that joined
    /// there), moved into `held` when it runs.
    pub granted: Vec<LockKeys>,
    held: Vec<(usize, LockKeys)>,
}

impl Convoy {
    /// Takes in a convoy that was granted `keys` behind this one here.
    pub fn absorb(&mut self, mut other: Convoy, keys: LockKeys) {
        self.members.append(&mut other.members);
        self.held.append(&mut other.held);
        self.granted.push(keys);
    }

    /// Its transactions.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The next shard any member has a share on: shards are taken in ascending order.
    fn next_shard(&self) -> Option<usize> {
        self.members
            .iter()
            .filter_map(|m| m.shares.front().map(|p| p.shard))
            .min()
    }
}

impl Drop for Convoy {
    /// A convoy dropped on its way (a thread stopped; a member whose command panics only
    /// leaves it, `run_convoy`) lets go of what it holds, so that the other work on those
    /// keys is not held up for ever. Its members' connections get no answer, and what
    /// ran of them is not logged.
    fn drop(&mut self) {
        // Granted here and not yet run: this thread's shard is the one it is at.
        if let Some(here) = super::current_thread() {
            for keys in std::mem::take(&mut self.granted) {
                self.held.push((here, keys));
            }
        }
        for (shard, keys) in std::mem::take(&mut self.held) {
            self.shared
                .send(shard, Box::new(move |w| release_locks(w, &keys)));
        }
    }
}

/// A convoy reaches the next shard its members have shares on: it asks for their keys,
/// and runs once they are held.
fn arrive(w: &Rc<Worker>, mut convoy: Convoy) {
    // A share's keys are needed only to lock them.
    let shard = w.id;
    let keys: Vec<Bytes> = convoy
        .members
        .iter_mut()
        .filter_map(|m| m.shares.front_mut().filter(|p| p.shard == shard))
        .flat_map(|p| std::mem::take(&mut p.keys))
        .collect();
    let here = w.clone();
    let start: Box<dyn FnOnce(Convoy)> = Box::new(move |convoy| run_convoy(&here, convoy));
    let now = w
        .shard
        .borrow_mut()
        .locks
        .acquire_convoy(LockKeys::Keys(keys), convoy, start);
    if let Some((convoy, start)) = now {
        start(convoy);
    }
}

/// Runs each member's share here, under keys the convoy holds, then sends the convoy
/// on; on the last shard, writes each member's block, lets every key go and answers
/// each member's connection. A member with no share here (its transaction does not
/// touch this shard) goes on holding its keys elsewhere, as a transaction locking
/// nothing here would.
fn run_convoy(w: &Rc<Worker>, mut convoy: Convoy) {
    let shard = w.id;
    let granted = std::mem::take(&mut convoy.granted);
    convoy.held.extend(granted.into_iter().map(|k| (shard, k)));
    for m in &mut convoy.members {
        if m.shares.front().is_none_or(|p| p.shard != shard) {
            continue;
        }
        let share = m.shares.pop_front().expect("a share for this shard");
        // What this shard logged before the grant precedes the transaction's block.
        let (open, mark) = {
            let mut sh = w.shard.borrow_mut();
            sh.aof_flush();
            (sh.open(), sh.aof.mark())
        };
        // A member whose command panics (a bug) stops there; the others go on.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_share(w, share.steps, m)
        }));
        match ran {
            Ok(ran_us) if shard != m.home => m.away_us += ran_us,
            Ok(_) => {}
            Err(_) => {
                tracing::error!(
                    "A transaction's command panicked: it stops there and its connection is closed; the ones travelling with it go on"
                );
                let mut sh = w.shard.borrow_mut();
                sh.recover_inside(open);
                // What the command logged before it panicked is in memory: it ends the
                // member's block, which is written in its place among the others'.
                let piece = sh.aof.take_since(mark);
                if !piece.bytes.is_empty() {
                    let after = m.effects.iter().map(|p| p.0 + 1).max().unwrap_or(0);
                    m.effects.push((after, piece));
                }
                let events = std::mem::take(&mut sh.events);
                if !events.is_empty() {
                    m.events.push((usize::MAX, events));
                }
                m.shares.clear();
                m.failed = true;
            }
        }
    }
    if let Some(next) = convoy.next_shard() {
        w.shared.send(next, Box::new(move |w| arrive(w, convoy)));
        return;
    }
    // Every lock of every member is held here: each block follows what ran before on
    // its keys and precedes what runs after. Its commands go in queue order, as a
    // replica or a replay must apply them.
    for m in &mut convoy.members {
        let mut pieces = std::mem::take(&mut m.effects);
        pieces.sort_by_key(|p| p.0);
        let block = crate::persist::aof::effects::wrap(pieces.into_iter().map(|p| p.1).collect());
        w.shared.persist.aof.send_piece(block);
    }
    // Its keyspace events, in queue order, before anything the releases start can
    // publish its own.
    for m in &mut convoy.members {
        let mut events = std::mem::take(&mut m.events);
        events.sort_by_key(|e| e.0);
        for (db, event, key) in events.into_iter().flat_map(|(_, e)| e) {
            crate::pubsub::publish_event(w, db, event, &key);
        }
    }
    let held = std::mem::take(&mut convoy.held);
    let landings = await_landings(
        convoy
            .members
            .iter_mut()
            .map(|m| (&m.readied[..], &mut m.settle)),
    );
    if landings.is_empty() {
        for (at, keys) in held {
            if at == shard {
                release_locks(w, &keys);
            } else {
                w.shared
                    .send(at, Box::new(move |w| release_locks(w, &keys)));
            }
        }
    } else {
        release_then_signal(w, held, landings);
    }
    for mut m in std::mem::take(&mut convoy.members) {
        let done = m.done.take().expect("answered once");
        // A member that failed gets no answer: its connection is closed.
        if !m.failed {
            w.shared.answer(m.home, done, m);
        }
    }
}

/// For each shard where a member's share readied blocked clients, the signals that the
/// moves serving them set off have landed; each member keeps the other end
/// (`Chained::settle`). Empty on the common path, where no push of the convoy had a
/// client waiting.
fn await_landings<'a>(
    waiting: impl IntoIterator<Item = (&'a [usize], &'a mut Vec<oneshot::Receiver<()>>)>,
) -> Vec<(usize, Vec<oneshot::Sender<()>>)> {
    let mut landings: Vec<(usize, Vec<oneshot::Sender<()>>)> = Vec::new();
    for (readied, settle) in waiting {
        for &at in readied {
            let (landed, settled) = oneshot::channel();
            settle.push(settled);
            match landings.iter_mut().find(|l| l.0 == at) {
                Some(l) => l.1.push(landed),
                None => landings.push((at, vec![landed])),
            }
        }
    }
    landings
}

/// Lets the convoy's keys go, one message per shard, and where its members readied
/// blocked clients, signals once the moves that serving them set off have landed. Those
/// releases go through the mailbox even on this thread: inside a release (a convoy
/// started by one), a release asked for here only queues, and would serve its waiters
/// after this returns.
fn release_then_signal(
    w: &Rc<Worker>,
    held: Vec<(usize, LockKeys)>,
    mut landings: Vec<(usize, Vec<oneshot::Sender<()>>)>,
) {
    let mut by_shard: Vec<(usize, Vec<LockKeys>)> = Vec::new();
    for (at, keys) in held {
        match by_shard.iter_mut().find(|b| b.0 == at) {
            Some(b) => b.1.push(keys),
            None => by_shard.push((at, vec![keys])),
        }
    }
    for (at, keys) in by_shard {
        let signals = landings
            .iter_mut()
            .find(|l| l.0 == at)
            .map(|l| std::mem::take(&mut l.1))
            .unwrap_or_default();
        if signals.is_empty() && at == w.id {
            for k in &keys {
                release_locks(w, k);
            }
            continue;
        }
        w.shared.send(
            at,
            Box::new(move |w| {
                for k in &keys {
                    release_locks(w, k);
                }
                let moves = std::mem::take(&mut w.shard.borrow_mut().settling);
                signal_when_landed(moves, signals);
            }),
        );
    }
}

/// Fires `signals` once every move in `moves` has landed (at once when there is none).
fn signal_when_landed(moves: Vec<oneshot::Receiver<()>>, signals: Vec<oneshot::Sender<()>>) {
    if signals.is_empty() {
        return;
    }
    let fire = move || {
        for s in signals {
            let _ = s.send(());
        }
    };
    if moves.is_empty() {
        fire();
    } else {
        crate::net::event_loop::spawn_local(async move {
            super::settle(moves).await;
            fire();
        });
    }
}

/// Runs one member's share on this thread's shard, whose keys the convoy holds (and whose
/// AOF buffer `run_convoy` has just flushed), and keeps its replies, events and effects
/// in it; returns how long it ran.
fn run_share(w: &Rc<Worker>, steps: Vec<(usize, Step)>, m: &mut Chained) -> u64 {
    let start = crate::clock::Stopwatch::start();
    let mut sh = w.shard.borrow_mut();
    sh.aof_hold();
    sh.slow_for_home = Some(std::mem::take(&mut m.slow));
    for (at, step) in steps {
        let mark = sh.aof.mark();
        m.replies.push((at, step(&mut sh)));
        let piece = sh.aof.take_since(mark);
        if !piece.bytes.is_empty() {
            m.effects.push((at, piece));
        }
        if !sh.events.is_empty() {
            m.events.push((at, std::mem::take(&mut sh.events)));
        }
    }
    sh.aof_release();
    // Served when the convoy lets the keys go (`release_then_signal`).
    if sh.blocking.has_ready() && !m.readied.contains(&w.id) {
        m.readied.push(w.id);
    }
    m.slow = sh.slow_for_home.take().unwrap_or_default();
    drop(sh);
    start.elapsed_us()
}
impl Tx {
    /// Ends the transaction as dropping it does, and returns once the moves that serving
    /// the blocked clients its steps readied set off have landed (a BLMOVE to another
    /// shard): its connection answers after that, as a batch's does, so that the client
    /// finds the element in the destination if it reads it next.
    pub async fn end(mut self) {
        let readied = std::mem::take(self.readied.get_mut());
        let mut settled = Vec::new();
        let landings = await_landings([(&readied[..], &mut settled)]);
        if landings.is_empty() {
            return;
        }
        self.write_block();
        self.publish_events();
        let held = std::mem::take(&mut self.held);
        release_then_signal(&self.worker, held, landings);
        drop(self);
        super::settle(settled).await;
    }

    /// The block goes to the AOF while every lock is still held: it follows what ran
    /// before on these keys and precedes what runs after.
    fn write_block(&mut self) {
        let effects = std::mem::take(self.effects.get_mut());
        if !effects.is_empty() {
            let block = crate::persist::aof::effects::wrap(effects);
            self.worker.shared.persist.aof.send_piece(block);
        }
    }

    /// Its keyspace events, in step order, before anything its releases start can
    /// publish its own (a waiter it readied, served there).
    fn publish_events(&mut self) {
        for (db, event, key) in self.events.take() {
            crate::pubsub::publish_event(&self.worker, db, event, &key);
        }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        self.write_block();
        self.publish_events();
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
    }
}
