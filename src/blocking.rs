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
use crate::protocol::reply::Reply;
use crate::server::io;
use crate::server::session::Session;
use crate::shard::{hop, Shard, Worker};
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

/// One blocked call as one shard sees it.
pub struct Waiter {
    pub claim: Arc<AtomicBool>,
    pub db: usize,
    pub op: Arc<BlockOp>,
    pub resp3: bool,
    pub deliver: mpsc::UnboundedSender<Delivery>,
    /// This call's keys on this shard, to drop its other registrations once served.
    pub keys_here: Vec<Bytes>,
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

/// Registrations are removed lazily: a served, timed-out or departed call leaves its
/// entries behind, they are skipped (and dropped) when met at the front of a queue, and
/// a periodic compaction bounds the dead ones. So serving a call costs the same however
/// many keys it waited on, and a call that blocks on k keys pays k insertions only.
pub struct BlockTable {
    waiting: HashMap<WaitKey, VecDeque<Rc<Waiter>>>,
    /// Keys with waiters that gained elements, served when the current command ends.
    ready: Vec<(usize, Bytes)>,
    /// Registrations held in the queues, live or dead, and the count that triggers the
    /// next compaction.
    entries: usize,
    compact_at: usize,
}

const MIN_COMPACT_AT: usize = 4096;

impl Default for BlockTable {
    fn default() -> Self {
        BlockTable {
            waiting: HashMap::new(),
            ready: Vec::new(),
            entries: 0,
            compact_at: MIN_COMPACT_AT,
        }
    }
}

impl BlockTable {
    #[inline]
    pub fn is_waited(&self, db: usize, key: &[u8]) -> bool {
        !self.waiting.is_empty() && self.waiting.contains_key(&(db, key))
    }

    pub fn mark_ready(&mut self, db: usize, key: &[u8]) {
        if self.is_waited(db, key) && !self.ready.iter().any(|(d, k)| *d == db && k == key) {
            self.ready.push((db, Bytes::copy_from_slice(key)));
        }
    }

    /// Marks every waited key of `db` ready (FLUSHDB, SWAPDB: readers of a stream that
    /// went away must hear about it).
    pub fn mark_db_ready(&mut self, db: usize) {
        let keys: Vec<Bytes> = self
            .waiting
            .keys()
            .filter(|k| k.db == db)
            .map(|k| k.key.clone())
            .collect();
        for k in keys {
            self.mark_ready(db, &k);
        }
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Clients blocked on `key` now (queue metrics' consumers).
    pub fn live_waiters(&self, db: usize, key: &[u8]) -> usize {
        self.waiting.get(&(db, key)).map_or(0, |q| {
            q.iter()
                .filter(|w| !w.claim.load(Ordering::Acquire))
                .count()
        })
    }

    /// Keys some client is blocked on (INFO's total_blocking_keys).
    pub fn keys_count(&self) -> usize {
        self.waiting
            .values()
            .filter(|q| q.iter().any(|w| !w.claim.load(Ordering::Acquire)))
            .count()
    }

    fn add(&mut self, w: Rc<Waiter>) {
        for k in &w.keys_here {
            self.waiting
                .entry(WaitKey {
                    db: w.db,
                    key: k.clone(),
                })
                .or_default()
                .push_back(w.clone());
        }
        self.entries += w.keys_here.len();
        if self.entries > self.compact_at {
            self.compact();
        }
    }

    /// Drops every dead registration; amortised over the registrations that grew the
    /// table to twice its live size.
    fn compact(&mut self) {
        let mut live = 0;
        self.waiting.retain(|_, q| {
            q.retain(|w| !w.claim.load(Ordering::Acquire));
            live += q.len();
            !q.is_empty()
        });
        self.entries = live;
        self.compact_at = (2 * live).max(MIN_COMPACT_AT);
    }

    /// The oldest live waiter on a key, dropping claimed ones on the way.
    fn first_live(&mut self, db: usize, key: &Bytes) -> Option<Rc<Waiter>> {
        let q = self.waiting.get_mut(&(db, &key[..]))?;
        while let Some(w) = q.front() {
            if w.claim.load(Ordering::Acquire) {
                q.pop_front();
                self.entries -= 1;
            } else {
                return Some(w.clone());
            }
        }
        self.waiting.remove(&(db, &key[..]));
        None
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
    deliver: mpsc::UnboundedSender<Delivery>,
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
    deliver: mpsc::UnboundedSender<Delivery>,
    resp3: bool,
    done: tokio::sync::oneshot::Sender<()>,
}

/// On the destination's shard: pushes the moved element (or, when the destination is
/// not a list, puts it back where it came from and fails the call), answers the client,
/// serves whoever waits on the destination, and reports back once all that settled.
fn land(w: &Rc<Worker>, l: Landing) {
    let mut sh = w.shard.borrow_mut();
    if !sh.locks.is_idle() && !sh.locks.is_free([&l.dst[..]]) {
        let w2 = w.clone();
        let keys = crate::shard::locks::LockKeys::Keys(vec![l.dst.clone()]);
        sh.locks.enqueue(
            keys,
            crate::shard::locks::Waiting::Run(Box::new(move || land(&w2, l))),
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
        let _ = l.deliver.send(Delivery {
            reply: out.buf,
            undo: None,
        });
        let _ = l.done.send(());
        return;
    }
    lists::push_for_waiter(&mut sh, db, &l.dst, l.to_left, &l.value);
    sh.log_effect(db, &[push_name(l.to_left), &l.dst[..], &l.value[..]]);
    out.bulk(&l.value);
    // A client gone by now leaves the element in the destination, as a finished
    // BLMOVE would have.
    let _ = l.deliver.send(Delivery {
        reply: out.buf,
        undo: None,
    });
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
        tokio::task::spawn_local(async move {
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
    if !sh.blocking.has_ready() {
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
            while let Some(w) = sh.blocking.first_live(db, &key) {
                if has_data(&mut sh, db, &key, &w.op) != Data::Ready {
                    break;
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
                if let Err(mpsc::error::SendError(d)) = w.deliver.send(delivery) {
                    if let Some(undo) = d.undo {
                        apply_undo(&mut sh, undo);
                    }
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

/// The part of a blocked call that lives on one shard.
struct ShardPart {
    shard: usize,
    keys: Vec<Bytes>,
}

/// What trying a blocked call on one shard gave.
enum Tried {
    Served(Delivery),
    /// A key of the wrong type came first: the call fails at once.
    WrongType,
    /// Registered (or, when not registering, nothing to take).
    Waiting,
}

/// Tries `keys` on this shard in order; serves the call at once from the first key that
/// holds something, else registers a waiter.
#[allow(clippy::too_many_arguments)]
fn try_or_register(
    w: &Rc<Worker>,
    db: usize,
    keys: Vec<Bytes>,
    op: Arc<BlockOp>,
    resp3: bool,
    claim: Arc<AtomicBool>,
    deliver: mpsc::UnboundedSender<Delivery>,
    register: bool,
) -> Tried {
    let mut sh = w.shard.borrow_mut();
    let mut waits_for_lock = false;
    for key in &keys {
        match has_data(&mut sh, db, key, &op) {
            Data::Empty => continue,
            Data::WrongType => return Tried::WrongType,
            Data::Ready => {}
        }
        // A move across shards is never served here: the serving shard's after-command
        // pass does it, so the push lands and settles like any other.
        if blocked_by_locks(&sh, key, &op) || matches!(*op, BlockOp::ListMoveAcross { .. }) {
            waits_for_lock = true;
            continue;
        }
        if claim
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Tried::Waiting;
        }
        return Tried::Served(perform(&mut sh, db, key, &op, resp3));
    }
    if register && !claim.load(Ordering::Acquire) {
        let waiter = Rc::new(Waiter {
            claim,
            db,
            op,
            resp3,
            deliver,
            keys_here: keys.clone(),
        });
        sh.blocking.add(waiter);
        let now = crate::clock::unix_ms();
        for key in &keys {
            sh.queues.blocked(db, key, now);
        }
        if waits_for_lock {
            // A key already holds something; serve it when its lock goes.
            for key in &keys {
                sh.blocking.mark_ready(db, key);
            }
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
pub async fn run_blocking(sess: &mut Session, call: BlockCall) {
    let outcome = match &call.op {
        BlockOp::ListMove {
            from_left,
            to_left,
            dst,
        } if sess.worker.shard_of(dst) != sess.worker.shard_of(&call.keys[0]) => {
            let (from_left, to_left, dst) = (*from_left, *to_left, dst.clone());
            return move_across_shards(
                sess,
                call.keys[0].clone(),
                dst,
                from_left,
                to_left,
                call.timeout,
            )
            .await;
        }
        _ => block(sess, &call.keys, call.op, call.timeout).await,
    };
    write_outcome(sess, outcome);
}

fn write_outcome(sess: &mut Session, outcome: Outcome) {
    match outcome {
        Outcome::Served(reply) => sess.out.raw(&reply),
        Outcome::Ended(Ended::Timeout) => sess.out.null_array(),
        Outcome::Ended(Ended::UnblockedWithError) => sess
            .out
            .error("UNBLOCKED client unblocked via CLIENT UNBLOCK"),
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
    drop(tx);
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
    let op = Arc::new(op);
    let claim = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::unbounded_channel::<Delivery>();

    // Group the keys by shard in argument order, dropping repeats (a hash set keeps this
    // linear for calls over hundreds of keys).
    let mut parts: Vec<ShardPart> = Vec::new();
    let mut seen: hashbrown::HashSet<&[u8]> = hashbrown::HashSet::with_capacity(keys.len());
    for k in keys {
        if !seen.insert(&k[..]) {
            continue;
        }
        let s = worker.shard_of(k);
        match parts.iter_mut().find(|p| p.shard == s) {
            Some(p) => p.keys.push(k.clone()),
            None => parts.push(ShardPart {
                shard: s,
                keys: vec![k.clone()],
            }),
        }
    }

    // Keys on several shards: serve from the first key (in argument order) that holds
    // something, as Redis does, before registering anywhere.
    if parts.len() > 1 {
        match serve_first_in_order(&worker, db, keys, &op, resp3, &claim, &tx).await {
            Tried::Served(d) => return Outcome::Served(d.reply),
            Tried::WrongType => return Outcome::Error(WRONGTYPE),
            Tried::Waiting => {}
        }
    }

    let mut registered = Vec::new();
    for part in &parts {
        let (keys_here, op2, claim2, tx2) =
            (part.keys.clone(), op.clone(), claim.clone(), tx.clone());
        let tried = hop(&worker, part.shard, move |w| {
            let t = try_or_register(w, db, keys_here, op2, resp3, claim2, tx2, true);
            // A key that already holds something is served by the after-command pass.
            if w.shard.borrow().blocking.has_ready() {
                crate::shard::after_command(w);
                w.shard.borrow_mut().settling.clear();
            }
            t
        })
        .await;
        registered.push(part.shard);
        match tried {
            Tried::Served(d) => {
                return Outcome::Served(d.reply);
            }
            Tried::WrongType => {
                claim.store(true, Ordering::Release);
                return Outcome::Error(WRONGTYPE);
            }
            Tried::Waiting => {}
        }
        if claim.load(Ordering::Acquire) {
            break;
        }
    }
    drop(tx);

    let waited = crate::clock::Stopwatch::start();
    let outcome = wait(sess, &mut rx, &claim, timeout).await;
    sess.blocked_us += waited.elapsed_us();
    match outcome {
        Ok(d) => Outcome::Served(d.reply),
        Err(e) => Outcome::Ended(e),
    }
}

/// Looks for the first key, in argument order, that holds something, and serves the call
/// from it; a few tries in case another client takes the element first.
async fn serve_first_in_order(
    worker: &Rc<Worker>,
    db: usize,
    keys: &[Bytes],
    op: &Arc<BlockOp>,
    resp3: bool,
    claim: &Arc<AtomicBool>,
    tx: &mpsc::UnboundedSender<Delivery>,
) -> Tried {
    for _ in 0..3 {
        let mut first: Option<Bytes> = None;
        for k in keys {
            let (key, op2) = (k.clone(), op.clone());
            let data = hop(worker, worker.shard_of(k), move |w| {
                has_data(&mut w.shard.borrow_mut(), db, &key, &op2)
            })
            .await;
            match data {
                Data::Ready => {
                    first = Some(k.clone());
                    break;
                }
                Data::WrongType => return Tried::WrongType,
                Data::Empty => {}
            }
        }
        let Some(key) = first else {
            return Tried::Waiting;
        };
        let (op2, claim2, tx2) = (op.clone(), claim.clone(), tx.clone());
        let k = key.clone();
        let tried = hop(worker, worker.shard_of(&key), move |w| {
            try_or_register(w, db, vec![k], op2, resp3, claim2, tx2, false)
        })
        .await;
        if !matches!(tried, Tried::Waiting) {
            return tried;
        }
    }
    Tried::Waiting
}

/// Waits for a delivery, the timeout, CLIENT UNBLOCK/KILL or the client leaving.
async fn wait(
    sess: &mut Session,
    rx: &mut mpsc::UnboundedReceiver<Delivery>,
    claim: &Arc<AtomicBool>,
    timeout: Option<Duration>,
) -> Result<Delivery, Ended> {
    // Replies to the commands pipelined before this one go out before it parks.
    if !sess.out.buf.is_empty() {
        crate::server::conn::await_durable(sess).await;
        // The blocked command's own reply, still to come, waits for the AOF in turn.
        sess.unflushed_replies = 1;
        sess.unflushed_write = true;
        let n = sess.out.buf.len();
        if io::write_all(sess.stream.as_deref(), &sess.out.buf)
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
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let stream = sess.stream.clone();
    let result = loop {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
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
            r = io::read_some(stream.as_deref(), &mut sess.stash) => match r {
                Ok(0) | Err(_) => Some(Ended::ClientGone),
                Ok(_) => None,
            },
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

    fn waiter(keys: &[&str]) -> Rc<Waiter> {
        let (tx, _rx) = mpsc::unbounded_channel();
        Rc::new(Waiter {
            claim: Arc::new(AtomicBool::new(false)),
            db: 0,
            op: Arc::new(BlockOp::ListPop { left: true }),
            resp3: false,
            deliver: tx,
            keys_here: keys
                .iter()
                .map(|k| Bytes::copy_from_slice(k.as_bytes()))
                .collect(),
        })
    }

    #[test]
    fn dead_registrations_stay_bounded() {
        let mut t = BlockTable::default();
        let keys: Vec<String> = (0..50).map(|i| format!("q{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        for _ in 0..10_000 {
            let w = waiter(&refs);
            t.add(w.clone());
            // Served or timed out: the call's token is taken, its entries are dead.
            w.claim.store(true, Ordering::Release);
        }
        assert!(
            t.entries <= 2 * MIN_COMPACT_AT + refs.len(),
            "{} entries",
            t.entries
        );
        let live = waiter(&["q7"]);
        t.add(live.clone());
        let first = t.first_live(0, &Bytes::from_static(b"q7")).unwrap();
        assert!(Rc::ptr_eq(&first, &live));
        assert!(t.is_waited(0, b"q7"));
        assert_eq!(t.keys_count(), 1);
    }
}
