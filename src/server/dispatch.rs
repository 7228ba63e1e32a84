//! Running a connection's parsed commands: a group in order, pipelined runs bound for one
//! other shard squashed into one hop, a command on this thread's shard run inline (a
//! BLPOP/BRPOP too, waiting only when it found nothing), the rest through
//! `commands::execute`; and the write barrier of `appendfsync always`
//! between a group's commands and their replies. Makes no socket call: replies go into
//! the session's output buffer, which `net::conn` sends (mid-pipeline too, through
//! `net::conn::drain_output`, once it passes 64 KiB).

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::commands::{self, flags, route, table, Command, Handler, Route};
use crate::net::conn::{drain_output, FLUSH_AT};
use crate::server::session::{ReplyMode, Session};
use crate::shard::locks::UnitKeys;
use crate::shard::{run_batch_on, Worker};

/// Whether a command may change the dataset, so that its reply waits for the AOF.
fn may_write(cmd: &Command) -> bool {
    cmd.has(flags::WRITE) || matches!(cmd.name, "exec" | "eval" | "evalsha" | "fcall" | "function")
}

/// Counts a command of the group toward the replies and writes its group's write barrier
/// and WAIT must cover.
fn count_reply(sess: &mut Session, cmd: Option<&Command>) {
    sess.unflushed_replies += 1;
    if cmd.is_some_and(may_write) {
        sess.unflushed_write = true;
        sess.wrote_since_wait = true;
    }
}

/// The write barrier of `appendfsync always`: replies to a group of commands that may have
/// written wait until the AOF's fsync covers every effect logged before this call, theirs
/// among them. If the AOF cannot make them durable, the group's replies become errors:
/// nothing is acknowledged that was not stored. Replies to reads alone do not wait (Redis
/// holds them too, since it answers everything after the pass's fsync): a read may see a
/// write whose fsync is under way, as a client of Redis with `everysec` may.
pub async fn await_durable(sess: &mut Session) {
    let replies = std::mem::take(&mut sess.unflushed_replies);
    let wrote = std::mem::take(&mut sess.unflushed_write);
    let aof = &sess.worker.shared.persist.aof;
    if !wrote || !aof.file_on() || !aof.always() {
        return;
    }
    if crate::persist::aof::barrier(aof).await {
        return;
    }
    let msg = aof.error_reply();
    sess.out.buf.clear();
    for _ in 0..replies.max(1) {
        sess.out.error(&msg);
    }
}

/// The one shard a plain keyed command runs on, when none of `execute`'s checks could
/// refuse it or change what it does. Such a command skips `execute` (and its chain of
/// futures): bound for another shard it is batched with its neighbours, and on this
/// thread's shard it runs inline (`commands::run_here_if_free`).
fn plain_target(
    sess: &Session,
    cmd: Option<&'static Command>,
    args: &[Bytes],
    memo: &mut Option<Route>,
    passes: &mut SessionPasses,
) -> Option<usize> {
    let cmd = cmd?;
    if cmd.has(flags::BLOCKING)
        || cmd.block.is_some()
        || !execute_would_pass(sess, cmd, args, passes)
    {
        return None;
    }
    match *memo.get_or_insert_with(|| route(sess, cmd, args)) {
        Route::Shard(s) => Some(s),
        _ => None,
    }
}

/// Whether `execute`'s checks of the session and of the server as a whole would pass
/// every command, looked at once for a run of a group's commands rather than once per
/// command. `run_group` forgets it before every `execute` (whose commands are what can
/// change the session: CLIENT REPLY, MULTI, SUBSCRIBE, AUTH, ACL, MONITOR...) and before
/// every await, the only place where another connection of this thread runs; a command
/// run inline changes none of it. Another thread's change lands as it would between two
/// of Redis's reads of a client's input, which also runs a read's commands together.
type SessionPasses = Option<bool>;

fn session_would_pass(sess: &Session) -> bool {
    let shared = &sess.worker.shared;
    !(sess.multi.is_some()
        || sess.tracking
        || sess.reply_mode != ReplyMode::On
        || !sess.authenticated
        // A RESP2 subscriber may run only (un)subscribe, PING, QUIT and RESET.
        || (!sess.out.resp3 && sess.subscriptions() > 0)
        // A restricted user's commands go through `execute`, which checks them.
        || !sess.user.unrestricted
        || sess.acl_version != shared.acl.version()
        // A busy script's shard answers BUSY, which `execute` decides.
        || shared.busy_count.load(Ordering::Relaxed) > 0
        || shared.monitors.load(Ordering::Relaxed) > 0)
}

/// True when none of `execute`'s checks could refuse `cmd` or change what it does: the
/// session's and the server's part as `passes` remembers it (looked at now if it does
/// not), the command's own part now.
fn execute_would_pass(
    sess: &Session,
    cmd: &'static Command,
    args: &[Bytes],
    passes: &mut SessionPasses,
) -> bool {
    let shared = &sess.worker.shared;
    *passes.get_or_insert_with(|| session_would_pass(sess))
        // `execute` evicts first, or refuses what may grow memory: checked per command,
        // as a group's own writes may cross the limit.
        && !shared.over_maxmemory()
        && cmd.arity_ok(args.len())
        && cmd.subcommands.is_empty()
        && matches!(cmd.handler, Handler::Shard(_) | Handler::Multi(..))
        && squash_allowed_by_gate(sess, cmd)
        // In cluster mode only what the slot check serves at once skips `execute`.
        && shared.cluster.as_deref().is_none_or(|c| {
            matches!(
                crate::cluster::redirect::check(c, sess, cmd, args),
                crate::cluster::redirect::Check::Serve
            )
        })
}

/// A BLPOP or BRPOP that `execute` would pass, with every key on this thread's shard: it
/// is tried inline as a plain command is, and waits only when it found nothing (a worker
/// draining a queue finds a job on nearly every call). Each step in `execute`, `run` and
/// `run_handler` is a future made and dropped per call: about 1 000 instructions of a
/// drained job's 8 700.
fn blocking_pop_here(
    sess: &Session,
    cmd: Option<&'static Command>,
    args: &[Bytes],
    memo: &mut Option<Route>,
    passes: &mut SessionPasses,
) -> Option<&'static Command> {
    let cmd = cmd?;
    if !matches!(cmd.name, "blpop" | "brpop")
        // Inside EXEC and while replaying the AOF, a blocking command never waits.
        || sess.in_exec
        || sess.replaying
        || !execute_would_pass(sess, cmd, args, passes)
    {
        return None;
    }
    let here = matches!(
        *memo.get_or_insert_with(|| route(sess, cmd, args)),
        Route::Shard(s) if s == sess.worker.id
    );
    here.then_some(cmd)
}

/// A squashed batch skips `execute`'s checks, so it is only formed when none could refuse
/// the command: no gate at all, or only replication's (a replica, min-replicas-to-write)
/// for a read while stale data may be served.
fn squash_allowed_by_gate(sess: &Session, cmd: &Command) -> bool {
    let gate = sess.worker.shared.persist.gate();
    if gate == 0 {
        return true;
    }
    gate == crate::persist::GATE_REPL
        && !cmd.has(flags::WRITE)
        && !crate::repl::stale_refused(&sess.worker.shared)
}

pub fn note_affinity(sess: &mut Session, shard: usize, n: u32) {
    if sess.affinity.0 == shard {
        sess.affinity.1 = sess.affinity.1.saturating_add(n);
    } else {
        sess.affinity = (shard, n);
    }
}

/// Starts loading the table buckets of a pipelined group's keys before the group runs, so
/// that their cache misses overlap instead of coming one after another, command by command
/// (at depth 16 they were a fifth of the server's CPU: BENCHMARKS.md, "Prefetching a
/// pipelined group's keys"). `parse::first_key` stands for the key without looking the
/// command up (the argument after the name, or a script call's first declared key): for
/// most keyed commands it is the key, and where it is not, the prefetch is only wasted.
/// It stops at the first such key that maps to another thread's shard (or whose
/// round-robin tag has no shard yet: looking places nothing, `Placement::shard_if_placed`):
/// the group waits there for that shard's replies, and while it waits other connections
/// run and evict what was loaded (measured: with that run ahead too, SET at depth 16 on
/// two threads cost 11% more instead of less).
pub(crate) fn prefetch_keys(sess: &Session, cmds: &[Vec<Bytes>]) {
    let Ok(shard) = sess.worker.shard.try_borrow() else {
        return;
    };
    let Some(db) = shard.dbs.get(sess.db) else {
        return;
    };
    let placement = &sess.worker.shared.placement;
    let here = Some(sess.worker.id);
    db.table.prefetch_many(
        cmds.iter()
            .filter_map(|c| {
                crate::protocol::parse::first_key(c)
                    .filter(|k| k.len() <= crate::types::table::PREFETCH_KEY_MAX)
            })
            .take_while(|key| placement.shard_if_placed(key) == here)
            .map(|key| &key[..]),
    );
}

/// Starts loading the keys of requests that came to different connections in one pass,
/// before any of them runs (`reactor::hint_fresh`): without a pipeline each connection
/// brings one request, so the misses `prefetch_keys` overlaps within a group would
/// otherwise come one reader after another. Each request's first key as
/// `parse::peek_first_key` guesses it stands for its key, in database 0 (where the
/// connection selected another, the prefetch is only wasted).
pub(crate) fn prefetch_first_keys(worker: &Worker, requests: &[&[u8]]) {
    let Ok(shard) = worker.shard.try_borrow() else {
        return;
    };
    let Some(db) = shard.dbs.first() else {
        return;
    };
    let placement = &worker.shared.placement;
    let here = Some(worker.id);
    db.table.prefetch_many(
        requests
            .iter()
            .filter_map(|r| crate::protocol::parse::peek_first_key(r))
            .filter(|k| {
                k.len() <= crate::types::table::PREFETCH_KEY_MAX
                    && placement.shard_if_placed(k) == here
            }),
    );
}

/// A command of a group looked up, and maybe routed, ahead of its turn.
type Looked = (Vec<Bytes>, Option<&'static Command>, Option<Route>);

fn look_up(args: Option<Vec<Bytes>>) -> Option<Looked> {
    args.map(|args| {
        let cmd = table().lookup(&args[0]);
        (args, cmd, None)
    })
}

/// Most commands one unit holds (`run_unit`): its replies are all built before any is
/// written, and its keys here stay locked for its round trip.
const UNIT_MAX: usize = 64;

/// Looks at the commands after one bound for shard `target`. Returns how many of them
/// follow it bound for `target` too (the batch that goes with it), and how many of them
/// make a unit with it (0: none): a stretch of plain commands for `target` and for this
/// thread's shard alone, ending with one for `target`, with at least one for this shard
/// in between. Such a group would otherwise cost a round trip per run for `target`.
fn look_ahead(
    sess: &Session,
    first: &Command,
    target: usize,
    units: bool,
    iter: &mut impl Iterator<Item = Vec<Bytes>>,
    ahead: &mut VecDeque<Looked>,
    passes: &mut SessionPasses,
) -> (usize, usize) {
    let here = sess.worker.id;
    let shared = &sess.worker.shared;
    // Keyspace events carry no position, nor do other clients' invalidations: a unit's
    // would reach subscribers and caches out of order (the other part's a round trip
    // before those of this shard's earlier commands).
    let mut units = units
        && may_join_unit(first)
        && shared.tunables.notify_flags.load(Ordering::Relaxed) == 0
        && !crate::tracking::any(shared);
    // The other part's effects reach the AOF and the replication stream a round trip
    // before this shard's: with writes on both sides, a replica or a truncated AOF could
    // show a later write without an earlier one. Writes on one side only keep the order.
    let one_side_writes = shared.persist.aof.is_on();
    let (mut wrote_here, mut wrote_there) = (false, may_write(first));
    let (mut run, mut unit) = (0, 0);
    let mut in_run = true;
    let mut i = 0;
    loop {
        // The unit is the first command and `ahead[..=i]`.
        if !in_run && i + 2 > UNIT_MAX {
            break;
        }
        if i == ahead.len() {
            match look_up(iter.next()) {
                Some(looked) => ahead.push_back(looked),
                None => break,
            }
        }
        let (args, cmd, memo) = &mut ahead[i];
        let t = plain_target(sess, *cmd, args, memo, passes);
        let writes = cmd.is_some_and(may_write);
        if t == Some(target) {
            if in_run {
                run += 1;
                units &= cmd.is_some_and(may_join_unit);
            } else if (one_side_writes && writes && wrote_here) || !cmd.is_some_and(may_join_unit) {
                break;
            } else {
                unit = i + 1;
            }
            wrote_there |= writes;
        } else if t == Some(here)
            && units
            && i + 2 < UNIT_MAX
            && cmd.is_some_and(may_join_unit)
            && !(one_side_writes && writes && wrote_there)
        {
            in_run = false;
            wrote_here |= writes;
        } else {
            break;
        }
        i += 1;
    }
    (run, unit)
}

/// MOVE and COPY ... DB fill a key of another database, where a client blocked on keys of
/// both shards is not looked for (`hold_unit_keys`, `shard::may_run_whole`): they end a
/// unit.
fn may_join_unit(cmd: &Command) -> bool {
    !matches!(cmd.name, "move" | "copy")
}

/// Keys of this thread's shard that a unit holds for its round trip, let go when
/// dropped: when the unit is done, and also if the connection's task is dropped while
/// the unit waits.
struct UnitLocks {
    worker: Rc<Worker>,
    keys: UnitKeys,
}

impl Drop for UnitLocks {
    fn drop(&mut self) {
        crate::shard::release_unit(&self.worker, std::mem::take(&mut self.keys));
    }
}

/// Holds the keys that the unit's commands for this shard name (of `ahead[..unit]`),
/// shared where they only read, if no one else holds them against that, queues for them
/// or is blocked waiting on them (serving a waiter from one of them must happen after the
/// command that filled it, not once the hold goes). Nothing awaits between the check and
/// the hold.
fn hold_unit_keys(sess: &Session, ahead: &VecDeque<Looked>, unit: usize) -> Option<UnitLocks> {
    let here = Some(Route::Shard(sess.worker.id));
    let mut keys: Vec<(&[u8], bool)> = Vec::with_capacity(unit);
    for (args, cmd, memo) in ahead.iter().take(unit) {
        if *memo == here {
            let cmd = cmd.expect("squashable commands are known");
            let write = cmd.has(flags::WRITE);
            cmd.keys_all(args, |k| {
                keys.push((k, write));
                true
            });
        }
    }
    let mut shard = sess.worker.shard.borrow_mut();
    if shard.blocking.waits_any()
        && keys
            .iter()
            .any(|(k, _)| shard.blocking.is_waited(sess.db, k))
    {
        return None;
    }
    let keys = shard.locks.try_hold_unit(keys)?;
    Some(UnitLocks {
        worker: sess.worker.clone(),
        keys,
    })
}

/// Runs a unit (`look_ahead`): `first` and `ahead[..unit]`, plain commands for shard
/// `target` and for this thread's, in one round trip instead of one per run for
/// `target`, with the effect of the whole group running at one moment. This shard's keys
/// of the unit are held (`held`) from before the other part runs until after this
/// shard's part has run; the other part runs all at once or not at all (`Batch::whole`),
/// never waiting for a lock, so no two units (or a unit and a transaction) can wait for
/// each other. Then this shard's commands run, and the replies are written in the
/// group's order. If the other shard refused (a key of it held, queued for or waited on,
/// or a script running there), nothing ran: the commands go back to the front of
/// `ahead`, `first` first, and the result is false.
async fn run_unit(
    sess: &mut Session,
    target: usize,
    first: (&'static Command, Vec<Bytes>),
    ahead: &mut VecDeque<Looked>,
    unit: usize,
    held: UnitLocks,
) -> bool {
    let here = sess.worker.id;
    let mut remote = crate::shard::hops::cmds();
    let mut local = Vec::with_capacity(unit);
    // Where each command of the unit runs, in the group's order: true for this shard.
    let mut order = Vec::with_capacity(unit + 1);
    remote.push_back(first);
    order.push(false);
    for (args, cmd, memo) in ahead.drain(..unit) {
        let cmd = cmd.expect("squashable commands are known");
        let is_local = memo == Some(Route::Shard(here));
        if is_local {
            local.push((cmd, args));
        } else {
            remote.push_back((cmd, args));
        }
        order.push(is_local);
    }
    let worker = sess.worker.clone();
    let mut spec = sess.batch_spec(None);
    spec.whole = true;
    let mut result = run_batch_on(&worker, target, remote, spec).await;
    if result.refused {
        drop(held);
        worker.shard.borrow_mut().stats.units_refused += 1;
        let mut remote = std::mem::take(&mut result.spent);
        for is_local in order.into_iter().rev() {
            let ((cmd, args), at) = if is_local {
                (local.pop().expect("counted"), here)
            } else {
                (remote.pop_back().expect("counted"), target)
            };
            ahead.push_front((args, Some(cmd), Some(Route::Shard(at))));
        }
        crate::shard::hops::recycle(result.out.buf, remote);
        return false;
    }
    debug_assert!(result.rest.is_empty(), "a whole batch runs to its end");
    let mut moves = std::mem::take(&mut result.settle);
    let mut local = local.into_iter();
    let mut remote = result.spent.iter();
    let mut ends = result.ends.iter();
    let mut start = 0;
    for (i, is_local) in order.into_iter().enumerate() {
        if is_local {
            let (cmd, args) = local.next().expect("counted");
            count_reply(sess, Some(cmd));
            let f = cmd.exec_fn().expect("inline commands run on a shard");
            moves.extend(commands::run_here(sess, cmd, f, &args));
            sess.note_command(cmd, &args);
            note_affinity(sess, here, 1);
            sess.spare_args.give(args);
        } else {
            let (cmd, args) = remote.next().expect("counted");
            // The first was counted when the group's loop took it.
            if i > 0 {
                count_reply(sess, Some(cmd));
            }
            let end = *ends.next().expect("one end per command");
            sess.out.buf.extend_from_slice(&result.out.buf[start..end]);
            start = end;
            sess.note_command(cmd, args);
            note_affinity(sess, target, 1);
        }
        sess.asking = false;
    }
    drop(held);
    let n = result.spent.len() as u64;
    {
        let mut shard = worker.shard.borrow_mut();
        shard.stats.units += 1;
        shard.stats.one_hop += n;
        shard.stats.squashed_batches += 1;
        shard.stats.squashed_commands += n;
    }
    crate::shard::hops::recycle(result.out.buf, result.spent);
    crate::shard::settle(moves).await;
    true
}

/// Runs a group of parsed commands in order.
pub(crate) async fn run_group(sess: &mut Session, cmds: impl Iterator<Item = Vec<Bytes>>) {
    let mut iter = cmds;
    // Commands looked at (and maybe routed) ahead of their turn while a batch or a unit
    // was being formed, so they are not looked up and their keys not hashed again.
    let mut ahead: VecDeque<Looked> = VecDeque::new();
    // Forgotten at every await below.
    let mut passes: SessionPasses = None;
    // Cleared once a unit's other part was refused: the rest of the group then goes run
    // by run, as it would have before units.
    let mut units = true;
    while let Some((args, cmd, mut memo)) = ahead.pop_front().or_else(|| look_up(iter.next())) {
        if sess.handle.killed.get() {
            return;
        }
        if crate::commands::connection::pause_set(sess) {
            passes = None;
            crate::commands::connection::wait_if_paused(sess, &args).await;
        }
        count_reply(sess, cmd);
        let plain = plain_target(sess, cmd, &args, &mut memo, &mut passes);
        // A plain command for this thread's shard, or a blocking pop that may be served
        // at once, runs inline.
        let inline = match plain {
            Some(t) if t == sess.worker.id => cmd,
            None => blocking_pop_here(sess, cmd, &args, &mut memo, &mut passes),
            Some(_) => None,
        };
        if let Some(c) = inline {
            let f = c.exec_fn().expect("inline commands run on a shard");
            let mark = sess.out.buf.len();
            if let Some(moves) = commands::run_here_if_free(sess, c, f, &args) {
                sess.note_command(c, &args);
                note_affinity(sess, sess.worker.id, 1);
                sess.asking = false;
                if !moves.is_empty() {
                    passes = None;
                    crate::shard::settle(moves).await;
                }
                if c.block.is_some() && commands::found_nothing(&sess.out.buf[mark..]) {
                    // The try was counted (`exec_here`); the wait is not a second call.
                    sess.out.buf.truncate(mark);
                    passes = None;
                    commands::wait_after_try(sess, c, &args).await;
                }
                sess.spare_args.give(args);
                if sess.out.buf.len() >= FLUSH_AT {
                    passes = None;
                    if !drain_output(sess).await {
                        sess.handle.kill();
                        return;
                    }
                }
                continue;
            }
        }
        if let Some(target) = plain.filter(|&t| t != sess.worker.id) {
            let cmd = cmd.expect("squashable commands are known");
            let (run, unit) =
                look_ahead(sess, cmd, target, units, &mut iter, &mut ahead, &mut passes);
            if unit > 0 {
                if let Some(held) = hold_unit_keys(sess, &ahead, unit) {
                    passes = None;
                    if !run_unit(sess, target, (cmd, args), &mut ahead, unit, held).await {
                        // Counted once already, at the top of this loop; its turn comes
                        // again.
                        sess.unflushed_replies -= 1;
                        units = false;
                    }
                    if sess.out.buf.len() >= FLUSH_AT && !drain_output(sess).await {
                        sess.handle.kill();
                        return;
                    }
                    continue;
                }
            }
            let mut batch = crate::shard::hops::cmds();
            sess.note_command(cmd, &args);
            sess.asking = false;
            batch.push_back((cmd, args));
            for _ in 0..run {
                let (args, c, _) = ahead.pop_front().expect("looked ahead");
                let c = c.expect("squashable commands are known");
                count_reply(sess, Some(c));
                sess.note_command(c, &args);
                batch.push_back((c, args));
            }
            let n = batch.len();
            {
                let mut shard = sess.worker.shard.borrow_mut();
                shard.stats.one_hop += n as u64;
                if n > 1 {
                    shard.stats.squashed_batches += 1;
                    shard.stats.squashed_commands += n as u64;
                }
            }
            note_affinity(sess, target, n as u32);
            let worker = sess.worker.clone();
            let mut batch = batch;
            passes = None;
            loop {
                let spec = sess.batch_spec(None);
                let mut result = run_batch_on(&worker, target, batch, spec).await;
                crate::shard::settle(std::mem::take(&mut result.settle)).await;
                sess.out.buf.extend_from_slice(&result.out.buf);
                if sess.out.buf.len() >= FLUSH_AT && !drain_output(sess).await {
                    sess.handle.kill();
                    return;
                }
                crate::shard::hops::recycle(result.out.buf, result.spent);
                if result.rest.is_empty() {
                    break;
                }
                batch = result.rest;
            }
            continue;
        }
        if let Some(c) = cmd {
            if c.exec_fn().is_some() && c.arity_ok(args.len()) && sess.multi.is_none() {
                let r = *memo.get_or_insert_with(|| route(sess, c, &args));
                if let Route::Shard(s) = r {
                    note_affinity(sess, s, 1);
                }
                sess.route_hint = Some((c, r));
            }
        }
        let mode = sess.reply_mode;
        sess.flushed_mid_command = 0;
        passes = None;
        let mark = sess.out.buf.len();
        commands::execute(sess, cmd, args).await;
        sess.route_hint = None;
        // ASKING covers the next command, or the whole next transaction.
        if sess.asking && sess.multi.is_none() && cmd.is_none_or(|c| c.name != "asking") {
            sess.asking = false;
        }
        // CLIENT CACHING covers the next command, or the whole next transaction.
        if sess.caching && sess.multi.is_none() && cmd.is_none_or(|c| c.name != "client") {
            sess.caching = false;
        }
        let mark = mark.saturating_sub(sess.flushed_mid_command);
        match mode {
            // CLIENT REPLY ON answers even though replies were off when it arrived.
            ReplyMode::Off if sess.reply_mode != ReplyMode::On => sess.out.buf.truncate(mark),
            ReplyMode::Skipping => {
                sess.out.buf.truncate(mark);
                if sess.reply_mode == ReplyMode::Skipping {
                    sess.reply_mode = ReplyMode::On;
                }
            }
            _ => {}
        }
        if !sess.forced.is_empty() {
            let forced = std::mem::take(&mut sess.forced);
            sess.out.buf.extend_from_slice(&forced);
        }
        if sess.reply_mode == ReplyMode::SkipNext {
            sess.reply_mode = ReplyMode::Skipping;
        }
        // A long pipeline of large replies does not pile up in memory.
        if sess.out.buf.len() >= FLUSH_AT && sess.multi.is_none() && !drain_output(sess).await {
            sess.handle.kill();
            return;
        }
    }
}
