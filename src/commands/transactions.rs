//! MULTI, EXEC, DISCARD, WATCH, UNWATCH.
//!
//! EXEC whose keys (and watched keys) all live on one shard runs there as one atomic
//! batch: inline when that shard is this thread's. Without WATCH, when transactions
//! hold or wait for keys on that shard, it travels there with its commands instead
//! (`Tx::run_parts`), as does a multi-shard EXEC whose commands each live on one shard,
//! so that it can go on with the others in a convoy. Any other EXEC becomes a
//! multi-shard transaction that locks exactly its keys (or whole shards for
//! FLUSHALL-like commands), checks the watched keys, and runs its commands one hop at a
//! time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::{flags, route, Command, Handler, Route};
use crate::async_handler;
use crate::protocol::reply::Reply;
use crate::server::session::Session;
use crate::shard::locks::LockKeys;
use crate::shard::tx::{keys_by_shard, Part, Step, Tx};
use crate::shard::{exec_here, hop, run_batch_on, unix_ms, BatchSpec, WatchCheck};

pub struct MultiState {
    pub queued: Vec<(&'static Command, Vec<Bytes>)>,
    /// An error while queueing: EXEC will refuse to run.
    pub aborted: bool,
}

pub struct WatchState {
    pub keys: Vec<(usize, Bytes)>,
    pub dirty: Arc<AtomicBool>,
}

/// Queues a command inside MULTI.
pub fn queue(sess: &mut Session, cmd: &'static Command, args: Vec<Bytes>) {
    if cmd.has(flags::NO_MULTI) {
        sess.reject("ERR Command not allowed inside a transaction");
        return;
    }
    let m = sess.multi.as_mut().expect("in MULTI");
    m.queued.push((cmd, args));
    let n = m.queued.len() as i64;
    sess.handle.info.borrow_mut().multi = n;
    sess.out.simple("QUEUED");
}

pub fn multi(sess: &mut Session, _args: &[Bytes]) {
    if sess.multi.is_some() {
        return sess.error("ERR MULTI calls can not be nested");
    }
    sess.multi = Some(MultiState {
        queued: Vec::new(),
        aborted: false,
    });
    sess.handle.info.borrow_mut().multi = 0;
    sess.out.ok();
}

pub fn discard(sess: &mut Session, _args: &[Bytes]) {
    if sess.multi.take().is_none() {
        return sess.error("ERR DISCARD without MULTI");
    }
    sess.handle.info.borrow_mut().multi = -1;
    unwatch_all(sess);
    sess.out.ok();
}

/// Forgets every watched key of the session, telling the shards holding them.
pub fn unwatch_all(sess: &mut Session) {
    let Some(w) = sess.watching.take() else {
        return;
    };
    sess.handle.info.borrow_mut().watch = 0;
    let id = sess.id;
    let mut by_shard: Vec<(usize, Vec<(usize, Bytes)>)> = Vec::new();
    for (db, key) in w.keys {
        let s = sess.worker.shard_of(&key);
        match by_shard.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push((db, key)),
            None => by_shard.push((s, vec![(db, key)])),
        }
    }
    for (shard, keys) in by_shard {
        let forget = move |w: &std::rc::Rc<crate::shard::Worker>| {
            let mut sh = w.shard.borrow_mut();
            for (db, key) in &keys {
                sh.watches.remove(*db, key, id);
            }
        };
        if shard == sess.worker.id {
            forget(&sess.worker);
        } else {
            sess.worker.shared.send(shard, Box::new(forget));
        }
    }
}

pub fn unwatch(sess: &mut Session, _args: &[Bytes]) {
    unwatch_all(sess);
    sess.out.ok();
}

async_handler!(watch, |sess, args| {
    if sess.multi.is_some() {
        return sess.error("ERR WATCH inside MULTI is not allowed");
    }
    let dirty = match &sess.watching {
        Some(w) => w.dirty.clone(),
        None => Arc::new(AtomicBool::new(false)),
    };
    let db = sess.db;
    let id = sess.id;
    for (shard, keys) in keys_by_shard(&sess.worker, &args[1..]) {
        let d = dirty.clone();
        let keys_here = keys.clone();
        hop(&sess.worker, shard, move |w| {
            let mut sh = w.shard.borrow_mut();
            let now = unix_ms();
            for k in &keys_here {
                let expired = sh.dbs[db].table.get(k).is_some_and(|e| e.is_expired(now));
                sh.watches.add(db, k, id, d.clone(), expired);
            }
        })
        .await;
        let w = sess.watching.get_or_insert_with(|| WatchState {
            keys: Vec::new(),
            dirty: dirty.clone(),
        });
        for k in keys {
            if !w.keys.iter().any(|(d, key)| *d == db && *key == k) {
                w.keys.push((db, k));
            }
        }
    }
    let n = sess.watching.as_ref().map_or(0, |w| w.keys.len());
    sess.handle.info.borrow_mut().watch = n;
    sess.out.ok();
});

/// Where the commands of an EXEC run.
enum Plan {
    /// Every key on one shard and only keyed commands: one atomic batch there (or, where
    /// transactions hold or wait for keys there, its share travels as `Tx::run_parts`).
    OneShard(usize),
    /// Locks on several shards (or whole shards), then one step per command.
    Spread { all_shards: bool, keys: Vec<Bytes> },
}

fn plan(
    sess: &Session,
    queued: &[(&'static Command, Vec<Bytes>)],
    watched: &[(usize, Bytes)],
) -> Plan {
    let mut keys: Vec<Bytes> = Vec::new();
    let mut all_shards = false;
    let mut only_keyed = true;
    for (cmd, args) in queued {
        match cmd.handler {
            Handler::Shard(_) | Handler::Multi(..) => {
                keys.extend(cmd.key_positions(args).into_iter().map(|i| args[i].clone()));
                // SORT ... BY / GET: keys its patterns name may be anywhere.
                if cmd.spreads.is_some_and(|f| f(args)) && sess.worker.nshards() > 1 {
                    only_keyed = false;
                    all_shards = true;
                }
            }
            Handler::Conn(_) => only_keyed = false,
            // Commands that read or write the whole keyspace see it whole.
            Handler::Async(_) => {
                only_keyed = false;
                all_shards = true;
            }
        }
    }
    keys.extend(watched.iter().map(|(_, k)| k.clone()));
    if only_keyed {
        let mut shards = keys.iter().map(|k| sess.worker.shard_of(k));
        let first = shards.next().unwrap_or(sess.worker.id);
        if shards.all(|s| s == first) {
            return Plan::OneShard(first);
        }
    }
    Plan::Spread { all_shards, keys }
}

async_handler!(exec, |sess, _args| {
    let Some(m) = sess.multi.take() else {
        return sess.error("ERR EXEC without MULTI");
    };
    sess.handle.info.borrow_mut().multi = -1;
    if m.aborted {
        unwatch_all(sess);
        return sess.error("EXECABORT Transaction discarded because of previous errors.");
    }
    let watch = sess.watching.as_ref().map(|w| WatchCheck {
        dirty: Some(w.dirty.clone()),
        keys: w.keys.clone(),
    });
    let watched = watch.as_ref().map(|w| w.keys.clone()).unwrap_or_default();
    let n = m.queued.len();
    // Rules may have changed since the commands were queued: a command no longer
    // allowed gets an error in its place, and the rest run one by one.
    let mut refused: Vec<Option<String>> = Vec::new();
    let unchecked = sess.replaying
        || (sess.user.unrestricted && sess.acl_version == sess.worker.shared.acl.version());
    if !unchecked {
        refused = m
            .queued
            .iter()
            .map(|(cmd, args)| super::acl::exec_denial(sess, cmd, args))
            .collect();
    }
    let any_refused = refused.iter().any(Option::is_some);
    let allowed: Vec<(&'static Command, Vec<Bytes>)> = if any_refused {
        m.queued
            .iter()
            .zip(&refused)
            .filter(|(_, r)| r.is_none())
            .map(|(q, _)| q.clone())
            .collect()
    } else {
        Vec::new()
    };
    let planned = if any_refused {
        match plan(sess, &allowed, &watched) {
            Plan::Spread { all_shards, keys } => Plan::Spread { all_shards, keys },
            Plan::OneShard(_) => {
                let mut keys: Vec<Bytes> = Vec::new();
                for (cmd, args) in &allowed {
                    keys.extend(cmd.key_positions(args).into_iter().map(|i| args[i].clone()));
                }
                keys.extend(watched.iter().map(|(_, k)| k.clone()));
                Plan::Spread {
                    all_shards: false,
                    keys,
                }
            }
        }
    } else {
        plan(sess, &m.queued, &watched)
    };
    if let Plan::Spread {
        all_shards: false, ..
    } = planned
    {
        // Without WATCH or refusals, a transaction whose commands each live on one shard
        // sends each shard its share with the lock request.
        if watch.is_none() && !any_refused {
            if let Some(targets) = each_on_one_shard(sess, &m.queued) {
                sess.worker.shard.borrow_mut().stats.multi_shard += 1;
                return run_as_parts(sess, m.queued, &targets).await;
            }
        }
    }
    // A one-shard EXEC bound for a shard where transactions hold or wait for keys
    // (Sidekiq's pushes to the queues whose list shares a shard with `queues`, among
    // pushes to the others) takes the same way: queued there, it goes on in a convoy
    // with the multi-shard ones instead of ending it. Elsewhere it stays one batch, which
    // takes no lock.
    if let Plan::OneShard(target) = planned {
        if watch.is_none() && !any_refused && n > 0 && shard_transacting(sess, target) {
            if let Some(targets) = each_on_one_shard(sess, &m.queued) {
                count_one_shard(sess, target);
                return run_as_parts(sess, m.queued, &targets).await;
            }
        }
    }
    match planned {
        Plan::OneShard(target) => {
            let spec = BatchSpec {
                db: sess.db,
                resp3: sess.out.resp3,
                client_id: sess.id,
                no_touch: sess.no_touch,
                atomic: Some(watch.unwrap_or(WatchCheck {
                    dirty: None,
                    keys: Vec::new(),
                })),
                reader: sess.reader(),
                whole: false,
            };
            let worker = sess.worker.clone();
            count_one_shard(sess, target);
            let cmds: VecDeque<_> = m.queued.into_iter().collect();
            let mut result = run_batch_on(&worker, target, cmds, spec).await;
            // Its time is the batch's run time there, not the wait for its answer (on
            // this thread the batch ran inline, inside EXEC's own time).
            sess.away_us = Some(if target == worker.id {
                0
            } else {
                result.ran_us
            });
            crate::shard::settle(std::mem::take(&mut result.settle)).await;
            if result.aborted {
                sess.out.null_array();
            } else {
                sess.out.array(n);
                sess.out.buf.extend_from_slice(&result.out.buf);
            }
        }
        Plan::Spread { all_shards, keys } => {
            let wants: Vec<(usize, LockKeys)> = if all_shards {
                (0..sess.worker.nshards())
                    .map(|s| (s, LockKeys::All))
                    .collect()
            } else {
                keys_by_shard(&sess.worker, &keys)
                    .into_iter()
                    .map(|(s, k)| (s, LockKeys::Keys(k)))
                    .collect()
            };
            let tx = Tx::begin(&sess.worker, wants).await;
            sess.worker.shard.borrow_mut().stats.multi_shard += 1;
            if let Some(check) = watch {
                if watch_broken(sess, &tx, check).await {
                    drop(tx);
                    unwatch_all(sess);
                    return sess.out.null_array();
                }
            }
            sess.out.array(n);
            sess.in_exec = true;
            for (i, (cmd, args)) in m.queued.into_iter().enumerate() {
                match refused.get(i) {
                    Some(Some(msg)) => sess.error(msg),
                    _ => run_in_tx(sess, &tx, cmd, args).await,
                }
            }
            sess.in_exec = false;
            sess.away_us = Some(tx.away_us());
            tx.end().await;
        }
    }
    unwatch_all(sess);
});

/// Runs an EXEC's commands as shares travelling along their shards (`Tx::run_parts`;
/// `targets` from `each_on_one_shard`) and writes its reply.
async fn run_as_parts(
    sess: &mut Session,
    queued: Vec<(&'static Command, Vec<Bytes>)>,
    targets: &[usize],
) {
    let n = queued.len();
    let parts = shares(sess, queued, targets);
    let (replies, away_us) = Tx::run_parts(&sess.worker, sess.id, parts).await;
    sess.out.array(n);
    for reply in replies {
        sess.out.buf.extend_from_slice(&reply);
    }
    sess.away_us = Some(away_us);
    unwatch_all(sess);
}

/// Counts a one-shard EXEC as an inline or a one-hop command (`INFO transactions`).
fn count_one_shard(sess: &Session, target: usize) {
    let mut sh = sess.worker.shard.borrow_mut();
    if target == sess.worker.id {
        sh.stats.inline += 1;
    } else {
        sh.stats.one_hop += 1;
    }
}

/// Whether transactions hold or wait for keys on `shard` (a hint: it may have changed).
fn shard_transacting(sess: &Session, shard: usize) -> bool {
    if shard == sess.worker.id {
        return !sess.worker.shard.borrow().locks.tx_idle();
    }
    sess.worker.shared.transacting[shard]
        .0
        .load(Ordering::Relaxed)
}

/// The shard of each queued command when every one has keys and they all live on one
/// shard (each command its own), else `None`.
fn each_on_one_shard(
    sess: &Session,
    queued: &[(&'static Command, Vec<Bytes>)],
) -> Option<Vec<usize>> {
    queued
        .iter()
        .map(|(cmd, args)| match (cmd.handler, route(sess, cmd, args)) {
            (Handler::Shard(_) | Handler::Multi(..), Route::Shard(s)) => Some(s),
            _ => None,
        })
        .collect()
}

/// Groups the queued commands into one share per shard (`targets` from
/// `each_on_one_shard`), each command run there as `run_in_tx` runs it.
fn shares(
    sess: &Session,
    queued: Vec<(&'static Command, Vec<Bytes>)>,
    targets: &[usize],
) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    let (db, resp3, no_touch) = (sess.db, sess.out.resp3, sess.no_touch);
    for (at, ((cmd, args), &shard)) in queued.into_iter().zip(targets).enumerate() {
        let (Handler::Shard(f) | Handler::Multi(f, _)) = cmd.handler else {
            unreachable!("each_on_one_shard takes keyed commands only")
        };
        let part = match parts.iter().position(|p| p.shard == shard) {
            Some(i) => &mut parts[i],
            None => {
                parts.push(Part {
                    shard,
                    keys: Vec::new(),
                    steps: Vec::new(),
                });
                parts.last_mut().expect("just pushed")
            }
        };
        part.keys.extend(
            cmd.key_positions(&args)
                .into_iter()
                .map(|i| args[i].clone()),
        );
        let reader = sess.reader();
        let step: Step = Box::new(move |sh| {
            let mut out = Reply::new(resp3);
            sh.current = reader;
            exec_here(sh, cmd, f, &args, db, &mut out, no_touch);
            sh.current = None;
            out.buf
        });
        part.steps.push((at, step));
    }
    parts
}

/// Checks the watched keys of a multi-shard EXEC on each shard holding one.
async fn watch_broken(sess: &Session, tx: &Tx, check: WatchCheck) -> bool {
    if check
        .dirty
        .as_ref()
        .is_some_and(|d| d.load(Ordering::Acquire))
    {
        return true;
    }
    let id = sess.id;
    let mut by_shard: Vec<(usize, Vec<(usize, Bytes)>)> = Vec::new();
    for (db, key) in check.keys {
        let s = sess.worker.shard_of(&key);
        match by_shard.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push((db, key)),
            None => by_shard.push((s, vec![(db, key)])),
        }
    }
    for (shard, keys) in by_shard {
        let c = WatchCheck { dirty: None, keys };
        if tx.run(shard, move |sh| c.broken(sh, id, unix_ms())).await {
            return true;
        }
    }
    false
}

/// Runs one queued command inside a multi-shard EXEC, whose transaction holds its locks.
async fn run_in_tx(sess: &mut Session, tx: &Tx, cmd: &'static Command, args: Vec<Bytes>) {
    let start = crate::clock::Stopwatch::start();
    let mark = sess.out.buf.len();
    match cmd.handler {
        Handler::Shard(f) | Handler::Multi(f, _) => {
            let target = match route(sess, cmd, &args) {
                Route::Here => sess.worker.id,
                Route::Shard(s) => s,
                Route::Spread => {
                    let Handler::Multi(_, cross) = cmd.handler else {
                        unreachable!("single-shard command with keys on several shards")
                    };
                    let kept = args.clone();
                    let db = sess.db;
                    tx.logged(db, &kept, cross(sess, args, tx)).await;
                    super::remember_spread_keys(sess, cmd, &kept, tx).await;
                    sess.record_here(cmd, &kept, start, mark);
                    return;
                }
            };
            let (db, resp3, no_touch) = (sess.db, sess.out.resp3, sess.no_touch);
            let reader = sess.reader();
            let reply = tx
                .run(target, move |sh| {
                    let mut out = Reply::new(resp3);
                    sh.current = reader;
                    exec_here(sh, cmd, f, &args, db, &mut out, no_touch);
                    sh.current = None;
                    out.buf
                })
                .await;
            sess.out.buf.extend_from_slice(&reply);
        }
        Handler::Conn(f) => {
            f(sess, &args);
            sess.record_here(cmd, &args, start, mark);
        }
        Handler::Async(f) => {
            let kept = args.clone();
            f(sess, args).await;
            // FLUSHALL, SWAPDB, scripts...: their effects join the transaction's block.
            for piece in std::mem::take(&mut sess.aof_pending) {
                tx.push_piece(piece);
            }
            sess.record_here(cmd, &kept, start, mark);
        }
    }
}
