//! Running a script: the `redis` API it calls, and where its commands execute.
//!
//! A script runs synchronously on one thread. On the fast path that thread owns every key
//! the script declared, so each `redis.call` runs inline on the shard and nothing else
//! can interleave: the script is atomic for every key of that shard. A call that reaches
//! a key of another shard leaves the fast path (see docs/scripting.md):
//! - before the script wrote anything, it is abandoned and rerun on the global path, and
//!   its SHA is remembered so later runs go there at once;
//! - after a write, it escalates: the call runs synchronously on the other shard.
//!
//! On the global path the script holds every shard's lock; calls on other shards are
//! synchronous hops. A thread waiting for such a hop keeps serving the synchronous calls
//! other scripts send it, so two waiting threads can never deadlock.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use mlua::{Lua, MultiValue, Table, Value};

use super::convert::lua_to_reply;
use super::{Script, ScriptFlags};
use crate::commands::{flags, table, Command};
use crate::protocol::reply::{format_double, Reply};
use crate::shard::{exec_here, KeyEvent, Msg, Shared, Worker};

/// The script running on this thread.
pub struct Running {
    pub worker: Rc<Worker>,
    pub db: usize,
    pub no_touch: bool,
    /// `redis.setresp(3)` was called: commands reply in RESP3 and booleans convert so.
    pub resp3: bool,
    /// Holds every shard's lock (the global path).
    pub global: bool,
    pub wrote: bool,
    /// Reached another shard before writing: the caller reruns it on the global path.
    pub restart: bool,
    pub read_only: bool,
    /// Redis's OOM rule for scripts without a shebang: checked until the first write.
    pub check_oom: bool,
    /// Shards other than this one that the script changed, to serve their blocked
    /// clients once it ends.
    pub touched_remote: Vec<usize>,
    /// Events of the script once it has called another shard, in call order.
    pub remote_events: Vec<KeyEvent>,
    pub escalated: bool,
    pub started: Instant,
    pub killed: bool,
    pub user: Option<Arc<crate::acl::User>>,
    pub client_id: u64,
    /// Cluster mode: the slot the script's keys are in so far (its declared keys' at
    /// first), and whether its keys may span slots (no shebang, or allow-cross-slot-keys).
    pub slot: Option<usize>,
    pub cross_slot_ok: bool,
}

thread_local! {
    static RUN: RefCell<Option<Running>> = const { RefCell::new(None) };
}

/// Whether a script is running on this thread (its `redis.call` holds `RUN` borrowed).
pub fn in_script() -> bool {
    RUN.with(|r| r.try_borrow().map_or(true, |g| g.is_some()))
}

/// What the connection's thread gets back from a script run.
pub struct Outcome {
    pub reply: Reply,
    pub events: Vec<KeyEvent>,
    pub restart: bool,
    /// A declared key is locked by a transaction: run on the global path instead.
    pub locked: bool,
    /// The script's effects, when the job collects them (inside EXEC).
    pub effects: Option<crate::persist::aof::Piece>,
    /// How long the job ran on the thread that ran it, in microseconds.
    pub run_us: u64,
}

/// What to run: an EVAL script or an FCALL function.
#[derive(Clone)]
pub enum Body {
    Script(Arc<Script>),
    Function(String),
}

#[derive(Clone)]
pub struct Job {
    pub body: Body,
    /// The call's keys (`args[keys_start..keys_end]`) and the script's arguments (what
    /// follows). A script run on the connection's thread keeps the whole call
    /// (`EVALSHA sha numkeys key... arg...`, `keys_start` 3) rather than copies; one
    /// sent to another thread takes only its keys and arguments (`for_remote`).
    pub args: Vec<Bytes>,
    pub keys_start: usize,
    pub keys_end: usize,
    pub db: usize,
    pub resp3: bool,
    pub no_touch: bool,
    pub flags: ScriptFlags,
    pub read_only: bool,
    pub global: bool,
    /// Sent by a connection of another thread: events go back with the reply.
    pub remote: bool,
    /// Run inside EXEC: its effects go back for the transaction's block instead of to
    /// the AOF.
    pub collect_effects: bool,
    /// The caller's ACL user when it is restricted: each `redis.call` is checked.
    pub user: Option<Arc<crate::acl::User>>,
    pub client_id: u64,
}

impl Job {
    pub fn keys(&self) -> &[Bytes] {
        &self.args[self.keys_start..self.keys_end]
    }

    /// A copy to run on another thread, without the command name, digest and key count:
    /// each argument sent shares the connection's read buffer, whose reference count
    /// the other thread then has to take.
    pub fn for_remote(&self) -> Job {
        Job {
            body: self.body.clone(),
            args: self.args[self.keys_start..].to_vec(),
            keys_start: 0,
            keys_end: self.keys_end - self.keys_start,
            user: self.user.clone(),
            ..*self
        }
    }

    pub fn argv(&self) -> &[Bytes] {
        &self.args[self.keys_end..]
    }
}

/// The script has ended: each other shard it ran commands on serves its blocked clients
/// and sends its events now.
fn release_guests(worker: &Rc<Worker>, touched: &[usize]) {
    for &s in touched {
        worker.shared.send(
            s,
            Box::new(|w| {
                w.shard.borrow_mut().script_guests -= 1;
                crate::shard::after_command(w);
            }),
        );
    }
}

/// Runs a job on this thread. On the fast path (`job.global` false) the caller made sure
/// this thread owns the declared keys.
pub fn run_job(worker: &Rc<Worker>, job: &Job) -> Outcome {
    let start = crate::clock::Stopwatch::start();
    let mut outcome = run_job_timed(worker, job);
    outcome.run_us = start.elapsed_us();
    outcome
}

fn run_job_timed(worker: &Rc<Worker>, job: &Job) -> Outcome {
    let mut out = Reply::new(job.resp3);
    if !job.global {
        let shard = worker.shard.borrow();
        if !shard.locks.is_idle() && !shard.locks.is_free(job.keys().iter().map(|k| &k[..])) {
            return Outcome {
                reply: out,
                events: Vec::new(),
                restart: false,
                locked: true,
                effects: None,
                run_us: 0,
            };
        }
    }
    let prev = RUN.with(|r| {
        r.borrow_mut().replace(Running {
            worker: worker.clone(),
            db: job.db,
            no_touch: job.no_touch,
            resp3: false,
            global: job.global,
            wrote: false,
            restart: false,
            read_only: job.read_only || job.flags.no_writes,
            check_oom: !job.flags.shebang,
            touched_remote: Vec::new(),
            remote_events: Vec::new(),
            escalated: false,
            started: Instant::now(),
            killed: false,
            user: job.user.clone(),
            client_id: job.client_id,
            slot: job.keys().first().map(|k| crate::shard::placement::slot(k)),
            cross_slot_ok: !job.flags.shebang || job.flags.allow_cross_slot,
        })
    });
    debug_assert!(prev.is_none(), "scripts do not nest");
    // The script's effects are one block in the AOF (Redis's effects replication).
    let (aof_mark, holds) = {
        let mut shard = worker.shard.borrow_mut();
        shard.aof_hold();
        (shard.aof.mark(), shard.aof.holds())
    };
    let kind = if matches!(job.body, Body::Function(_)) {
        KIND_FUNCTION
    } else {
        0
    } | if job.global { KIND_GLOBAL } else { 0 };
    worker.shared.busy_kind[worker.id].store(kind, Ordering::Release);
    mark_busy(worker, true);
    // A panic inside the interpreter (mlua runs out of reference slots on absurd
    // inputs) must not take the thread down: the script fails, the interpreter is
    // rebuilt.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        super::vm::with_vm(|vm| -> Result<Result<Value, Value>, String> {
            match &job.body {
                Body::Script(s) => {
                    let f = vm.compile(&s.sha, &s.code)?;
                    vm.run_script_with(&f, job.keys(), job.argv())
                        .map_err(|e| e.to_string())
                }
                Body::Function(name) => {
                    let f = super::functions::load_into(vm, name)?;
                    vm.run_function(&f, job.keys(), job.argv())
                        .map_err(|e| e.to_string())
                }
            }
        })
    }))
    .unwrap_or_else(|_| {
        super::vm::reset();
        // A command that panicked inside the script (or inside another thread's script
        // call this one served while it waited) left its own hold here: only the
        // script's stays, for the release below.
        worker.shard.borrow_mut().aof.set_holds(holds);
        Err("ERR Kite: the script engine failed on this script".to_string())
    });
    super::vm::collect_if_large();
    mark_busy(worker, false);
    let run = RUN.with(|r| r.borrow_mut().take()).expect("set above");
    // A restarted script wrote nothing; what it logged (lazy expiry) stays as it is.
    let effects = {
        let mut shard = worker.shard.borrow_mut();
        let effects = if run.restart {
            None
        } else if job.collect_effects {
            Some(shard.aof.take_since(aof_mark))
        } else {
            shard.aof.wrap_since(aof_mark);
            None
        };
        shard.aof_release();
        effects
    };
    if run.restart {
        release_guests(worker, &run.touched_remote);
        return Outcome {
            reply: out,
            events: Vec::new(),
            restart: true,
            locked: false,
            effects: None,
            run_us: 0,
        };
    }
    match result {
        // Stopped by SCRIPT KILL: whatever the script did with the error (it may have
        // caught it, or been stopped inside the error handler), it ends with this.
        _ if run.killed => out.error("ERR Script killed by user with SCRIPT KILL..."),
        Err(msg) => out.error(&msg),
        Ok(Ok(v)) => {
            super::vm::with_vm(|vm| lua_to_reply(&v, &mut out, run.resp3, 0, &vm.reply_keys))
        }
        Ok(Err(e)) => {
            let label = match &job.body {
                Body::Script(s) => &s.sha,
                Body::Function(name) => name,
            };
            error_reply(&e, label, &mut out)
        }
    }
    {
        let mut shard = worker.shard.borrow_mut();
        if run.global {
            shard.stats.scripts_global += 1;
        } else {
            shard.stats.scripts_fast += 1;
        }
        if run.escalated {
            shard.stats.scripts_escalated += 1;
            // Next time it takes every shard's lock before it starts.
            match &job.body {
                Body::Script(s) => s.wide.store(true, Ordering::Relaxed),
                Body::Function(name) => super::mark_function_wide(name),
            }
        }
    }
    release_guests(worker, &run.touched_remote);
    let mut events = run.remote_events;
    if job.remote || !events.is_empty() {
        // Keep one order: this shard's events after the remote ones would be wrong, so
        // every event of the script goes back to the connection.
        let mut local = Vec::new();
        crate::shard::after_command_into(worker, Some(&mut local));
        events.extend(local);
    } else {
        crate::shard::after_command(worker);
    }
    Outcome {
        reply: out,
        events,
        restart: false,
        locked: false,
        effects,
        run_us: 0,
    }
}

/// The error reply for a script that raised: its message, then where it was raised.
fn error_reply(e: &Value, label: &str, out: &mut Reply) {
    let t = match e {
        Value::Table(t) => t,
        // Errors the handler never saw: out of memory.
        Value::String(s) => {
            let mut text = b"ERR ".to_vec();
            text.extend_from_slice(&s.as_bytes());
            out.error_bytes(&text);
            return;
        }
        _ => {
            out.error("ERR unknown error");
            return;
        }
    };
    let msg: Option<mlua::String> = t.raw_get("err").ok();
    let Some(msg) = msg else {
        out.error("ERR unknown error");
        return;
    };
    let mut text = msg.as_bytes().to_vec();
    let source: Option<mlua::String> = t.raw_get("source").ok();
    let line: Option<f64> = t.raw_get("line").ok();
    if let (Some(source), Some(line)) = (source, line) {
        text.extend_from_slice(format!(" script: {}, on ", label).as_bytes());
        text.extend_from_slice(&source.as_bytes());
        text.extend_from_slice(format!(":{}.", line as i64).as_bytes());
    }
    out.error_bytes(&text);
}

fn normalize_error(msg: &[u8]) -> Vec<u8> {
    let msg = msg.strip_prefix(b"-").unwrap_or(msg);
    if msg.contains(&b' ') {
        msg.to_vec()
    } else {
        let mut v = b"ERR ".to_vec();
        v.extend_from_slice(msg);
        v
    }
}

thread_local! {
    /// The reply (or error text) of the last `redis.call`, read by the C side of
    /// `redis.call` straight into Lua values. A command run here writes its reply into
    /// this buffer (`call_reply`), so a call allocates and copies nothing for it.
    static CALL_OUT: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// The bytes `call_into_buffer` left, for the C side to read. Valid until the next call.
pub fn call_output() -> (*const u8, usize) {
    CALL_OUT.with(|b| {
        let b = b.borrow();
        (b.as_ptr(), b.len())
    })
}

/// An empty reply over the call buffer's memory, for a command run on this thread.
fn call_reply(resp3: bool) -> Reply {
    let mut buf = CALL_OUT.with(|b| std::mem::take(&mut *b.borrow_mut()));
    buf.clear();
    Reply::with_buf(buf, resp3)
}

/// `redis.call` and `redis.pcall` without Lua: runs one command and leaves its RESP
/// reply in the call buffer. Returns true when the buffer holds an error text instead
/// (normalized as Redis does: a code first), which `redis.call` raises.
pub fn call_into_buffer(argv: &[Bytes], bad_argument: bool) -> bool {
    let result = call_checked(argv, bad_argument);
    CALL_OUT.with(|b| {
        let mut b = b.borrow_mut();
        match result {
            Ok(reply) if reply.buf.first() == Some(&b'-') => {
                let end = reply.buf.len().saturating_sub(2);
                let text = normalize_error(&reply.buf[1..end]);
                *b = reply.buf;
                b.clear();
                b.extend_from_slice(&text);
                true
            }
            Ok(reply) => {
                *b = reply.buf;
                false
            }
            Err(msg) => {
                b.clear();
                b.extend_from_slice(&normalize_error(&msg));
                true
            }
        }
    })
}

fn call_checked(argv: &[Bytes], bad_argument: bool) -> Result<Reply, Vec<u8>> {
    if bad_argument {
        return Err(b"ERR Lua redis lib command arguments must be strings or integers".to_vec());
    }
    // A library's top-level code only registers functions, even when a reload before
    // FCALL runs it inside a script.
    if super::functions::loading() {
        return Err(b"ERR redis.call is only available while a script runs".to_vec());
    }
    if argv.is_empty() {
        return Err(b"ERR Please specify at least one argument for this redis lib call".to_vec());
    }
    let Some(cmd) = table().lookup(&argv[0]) else {
        return Err(b"ERR Unknown Redis command called from script".to_vec());
    };
    if !cmd.arity_ok(argv.len()) {
        return Err(b"ERR Wrong number of args calling Redis command from script".to_vec());
    }
    if cmd.has(flags::NOSCRIPT) || crate::commands::subcommand_has(cmd, argv, "noscript") {
        return Err(b"ERR This Redis command is not allowed from script".to_vec());
    }
    if !cmd.subcommands.is_empty() {
        crate::commands::check_subcommand(cmd, argv).map_err(String::into_bytes)?;
    }
    RUN.with(|r| -> Result<Reply, Vec<u8>> {
        let mut guard = r.borrow_mut();
        let run = guard
            .as_mut()
            .ok_or_else(|| b"ERR redis.call is only available while a script runs".to_vec())?;
        if run.restart {
            return Err(b"ERR Kite: the script is being moved to the global path".to_vec());
        }
        if let Some(user) = &run.user {
            if let Some(msg) = crate::commands::acl::script_denial(
                user,
                run.client_id,
                cmd,
                argv,
                &run.worker.shared,
            ) {
                return Err(msg.into_bytes());
            }
        }
        // PUBLISH and the like replicate, so read-only scripts may not call them either.
        if run.read_only && (cmd.has(flags::WRITE) || cmd.has(flags::MAY_REPLICATE)) {
            return Err(b"ERR Write commands are not allowed from read-only scripts.".to_vec());
        }
        if let Some(c) = run.worker.shared.cluster.as_deref() {
            let writes = cmd.has(flags::WRITE);
            let keys = cmd.key_positions(argv);
            crate::cluster::redirect::script_access(
                c,
                keys.iter().map(|&p| &argv[p][..]),
                writes,
                &mut run.slot,
                run.cross_slot_ok,
            )
            .map_err(|e| e.as_bytes().to_vec())?;
        }
        if run.check_oom
            && !run.wrote
            && cmd.has(flags::DENYOOM)
            && run.worker.shared.over_maxmemory()
        {
            return Err(b"OOM command not allowed when used memory > 'maxmemory'.".to_vec());
        }
        if run.worker.shared.monitors.load(Ordering::Relaxed) > 0
            && !cmd.has(flags::SKIP_MONITOR)
            && !cmd.has(flags::ADMIN)
        {
            crate::commands::server::feed_monitor_line(&run.worker, run.db, "lua", cmd, argv, None);
        }
        dispatch(run, cmd, argv)
    })
}

/// Runs one command of a script where its keys live.
fn dispatch(run: &mut Running, cmd: &'static Command, argv: &[Bytes]) -> Result<Reply, Vec<u8>> {
    let worker = run.worker.clone();
    let Some(f) = cmd.exec_fn() else {
        return keyless(run, cmd, argv);
    };
    let positions = cmd.key_positions(argv);
    let mut target = None;
    for &p in &positions {
        let s = worker.shard_of(&argv[p]);
        match target {
            None => target = Some(s),
            Some(t) if t != s => return spread(run, cmd, argv, &positions),
            _ => {}
        }
    }
    let target = target.unwrap_or(worker.id);
    let here = target == worker.id;
    if !run.global {
        let free = here && {
            let shard = worker.shard.borrow();
            shard.locks.is_idle() || shard.locks.is_free(positions.iter().map(|&p| &argv[p][..]))
        };
        if !free {
            if !run.wrote {
                run.restart = true;
                return Err(b"ERR Kite: the script is being moved to the global path".to_vec());
            }
            run.escalated = true;
        }
    }
    if cmd.has(flags::WRITE) && !run.wrote {
        run.wrote = true;
        worker.shared.busy_wrote[worker.id].store(true, Ordering::Release);
    }
    let (db, no_touch, resp3) = (run.db, run.no_touch, run.resp3);
    if here {
        let mut reply = call_reply(resp3);
        let mut shard = worker.shard.borrow_mut();
        exec_here(&mut shard, cmd, f, argv, db, &mut reply, no_touch);
        return Ok(reply);
    }
    // Events keep call order: what this shard recorded so far goes first.
    let local = std::mem::take(&mut worker.shard.borrow_mut().events);
    run.remote_events.extend(local);
    let args = argv.to_vec();
    let first_visit = !run.touched_remote.contains(&target);
    let (reply, events, effects) = sync_call(&worker, target, move |w| {
        let mut reply = Reply::new(resp3);
        let mut shard = w.shard.borrow_mut();
        shard.aof_hold();
        let mark = shard.aof.mark();
        exec_here(&mut shard, cmd, f, &args, db, &mut reply, no_touch);
        // Released, and the waiters served, when the script ends (`release_guests`);
        // counted once the command has run, so one that panics leaves no guest behind.
        if first_visit {
            shard.script_guests += 1;
        }
        let effects = shard.aof.take_since(mark);
        shard.aof_release();
        let events = std::mem::take(&mut shard.events);
        (reply, events, effects)
    });
    // Effects elsewhere join the script's block, in call order.
    worker.shard.borrow_mut().aof.push_piece(effects);
    run.remote_events.extend(events);
    if first_visit {
        run.touched_remote.push(target);
    }
    Ok(reply)
}

/// A command whose keys live on several shards. The ones made of independent per-key
/// parts (MGET, MSET, DEL, UNLINK, EXISTS, TOUCH) run as one part per shard, once the
/// script holds every shard or has escalated; others need the keys on one shard.
fn spread(
    run: &mut Running,
    cmd: &'static Command,
    argv: &[Bytes],
    positions: &[usize],
) -> Result<Reply, Vec<u8>> {
    let splittable = matches!(
        cmd.name,
        "mget" | "mset" | "del" | "unlink" | "exists" | "touch"
    );
    if !splittable {
        return Err(format!(
            "ERR Kite cannot run '{}' with keys on different shards inside a script; give its keys one {{hashtag}}",
            cmd.name
        )
        .into_bytes());
    }
    if !run.global {
        if !run.wrote {
            run.restart = true;
            return Err(b"ERR Kite: the script is being moved to the global path".to_vec());
        }
        run.escalated = true;
    }
    let worker = run.worker.clone();
    let per_key = if cmd.name == "mset" { 2 } else { 1 };
    // Parts in shard order, each remembering which keys (by index) it holds.
    let mut parts: Vec<(usize, Vec<Bytes>, Vec<usize>)> = Vec::new();
    for (i, &p) in positions.iter().enumerate() {
        let s = worker.shard_of(&argv[p]);
        let part = match parts.iter_mut().position(|x| x.0 == s) {
            Some(n) => &mut parts[n],
            None => {
                parts.push((s, vec![argv[0].clone()], Vec::new()));
                parts.last_mut().expect("just pushed")
            }
        };
        // MSET with a key and no value: the command's own arity error, as on one shard.
        let Some(words) = argv.get(p..p + per_key) else {
            return Err(crate::commands::arity_error(cmd.name).into_bytes());
        };
        part.1.extend_from_slice(words);
        part.2.push(i);
    }
    let mut values: Vec<Option<Vec<u8>>> = vec![None; positions.len()];
    let mut total = 0i64;
    for (shard, args, idx) in parts {
        let reply = dispatch(run, cmd, &args)?;
        let parsed = &reply.buf[..];
        if parsed.first() == Some(&b'-') {
            return Ok(reply);
        }
        match cmd.name {
            "mget" => {
                // An array of bulk strings or nils, one per key of this part.
                let mut pos = parsed.iter().position(|&b| b == b'\n').map_or(0, |n| n + 1);
                for &i in &idx {
                    let end = pos + parsed[pos..].iter().position(|&b| b == b'\n').unwrap_or(0) + 1;
                    let header = &parsed[pos..end];
                    if header.starts_with(b"$-1") || header.starts_with(b"_") {
                        pos = end;
                    } else {
                        let len: usize = std::str::from_utf8(&header[1..header.len() - 2])
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0);
                        values[i] = Some(parsed[end..end + len].to_vec());
                        pos = end + len + 2;
                    }
                }
            }
            "mset" => {}
            _ => {
                total += std::str::from_utf8(&parsed[1..parsed.len() - 2])
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                    .unwrap_or(0);
            }
        }
        let _ = shard;
    }
    let mut out = Reply::new(run.resp3);
    match cmd.name {
        "mget" => {
            out.array(values.len());
            for v in &values {
                out.opt_bulk(v.as_deref());
            }
        }
        "mset" => out.ok(),
        _ => out.int(total),
    }
    Ok(out)
}

/// Commands without keys that scripts commonly call.
fn keyless(run: &mut Running, cmd: &'static Command, argv: &[Bytes]) -> Result<Reply, Vec<u8>> {
    let mut out = Reply::new(run.resp3);
    match cmd.name {
        "ping" => {
            if argv.len() > 1 {
                out.bulk(&argv[1]);
            } else {
                out.simple("PONG");
            }
        }
        "echo" => out.bulk(&argv[1]),
        "time" => crate::commands::server::write_time(&mut out),
        "select" => match crate::commands::util::parse_i64(&argv[1]) {
            Ok(db) if (0..run.worker.shared.tunables.databases as i64).contains(&db) => {
                run.db = db as usize;
                out.ok();
            }
            Ok(_) => out.error("ERR DB index is out of range"),
            Err(e) => out.error(e),
        },
        "migrate" => return migrate_in_script(run, argv),
        "publish" => {
            let n = crate::pubsub::publish(&run.worker, argv[1].clone(), argv[2].clone());
            out.int(n as i64);
        }
        _ => {
            return Err(
                format!("ERR Kite does not support '{}' inside scripts", cmd.name).into_bytes(),
            )
        }
    }
    Ok(out)
}

/// Runs `f` on `target`'s thread and waits for it, synchronously. While waiting, this
/// thread serves the synchronous calls sent to it, so waits can never form a cycle.
pub fn sync_call<R, F>(worker: &Rc<Worker>, target: usize, f: F) -> R
where
    R: Send + 'static,
    F: FnOnce(&Rc<Worker>) -> R + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    push_sync(
        &worker.shared,
        target,
        Box::new(move |w| {
            let _ = tx.send(f(w));
        }),
    );
    worker.shard.borrow_mut().stats.hops += 1;
    loop {
        match rx.recv_timeout(Duration::from_micros(200)) {
            Ok(r) => return r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => serve_sync(worker),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                panic!("shard thread stopped")
            }
        }
    }
}

/// Queues a synchronous call for `target` and pokes its event loop, whichever of the two
/// (its loop, or its own wait) gets there first runs it.
fn push_sync(shared: &Arc<Shared>, target: usize, msg: Msg) {
    shared.sync_calls[target]
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push_back(msg);
    shared.send(target, Box::new(serve_sync));
}

/// Runs the synchronous calls waiting for this thread.
pub fn serve_sync(worker: &Rc<Worker>) {
    loop {
        let next = worker.shared.sync_calls[worker.id]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        match next {
            Some(msg) => msg(worker),
            None => {
                // What the calls sent to other threads' connections leaves now: this may
                // run inside another synchronous wait, which no pass ends.
                crate::shard::mailbox::flush_outbox();
                return;
            }
        }
    }
}

/// The per-thread queues of synchronous calls.
pub fn sync_queues(n: usize) -> Vec<Mutex<VecDeque<Msg>>> {
    (0..n).map(|_| Mutex::new(VecDeque::new())).collect()
}

/// The one string argument of `redis.error_reply` and `redis.status_reply`; with
/// anything else they return (not raise) Redis's error table.
fn single_string(lua: &Lua, args: MultiValue) -> mlua::Result<Result<mlua::String, Table>> {
    match args.into_iter().collect::<Vec<_>>().as_slice() {
        [Value::String(s)] => Ok(Ok(s.clone())),
        _ => {
            let t = lua.create_table()?;
            t.raw_set("err", "ERR wrong number or type of arguments")?;
            Ok(Err(t))
        }
    }
}

/// The `redis` table, less `call` and `pcall` (which the sandbox wraps in Lua).
pub fn redis_api(lua: &Lua) -> mlua::Result<Table> {
    let redis = lua.create_table()?;
    redis.raw_set(
        "sha1hex",
        lua.create_function(|lua, args: MultiValue| {
            if args.len() != 1 {
                return Err(mlua::Error::RuntimeError(
                    "wrong number of arguments".into(),
                ));
            }
            let s = match args.into_iter().next() {
                Some(Value::String(s)) => s.as_bytes().to_vec(),
                Some(Value::Number(n)) => format_double(n).into_bytes(),
                // mlua hands whole numbers over as integers.
                Some(Value::Integer(n)) => n.to_string().into_bytes(),
                _ => Vec::new(),
            };
            lua.create_string(super::sha1_hex(&s))
        })?,
    )?;
    redis.raw_set(
        "error_reply",
        lua.create_function(|lua, args: MultiValue| {
            let msg = match single_string(lua, args)? {
                Ok(m) => m,
                Err(t) => return Ok(t),
            };
            let t = lua.create_table()?;
            t.raw_set("err", lua.create_string(normalize_error(&msg.as_bytes()))?)?;
            Ok(t)
        })?,
    )?;
    redis.raw_set(
        "status_reply",
        lua.create_function(|lua, args: MultiValue| {
            let msg = match single_string(lua, args)? {
                Ok(m) => m,
                Err(t) => return Ok(t),
            };
            let t = lua.create_table()?;
            t.raw_set("ok", msg)?;
            Ok(t)
        })?,
    )?;
    redis.raw_set(
        "log",
        lua.create_function(|_, args: MultiValue| {
            if args.len() < 2 {
                return Err(mlua::Error::RuntimeError(
                    "redis.log() requires two arguments or more.".into(),
                ));
            }
            let mut it = args.into_iter();
            let level = match it.next() {
                Some(Value::Number(n)) => n as i64,
                Some(Value::Integer(n)) => n,
                _ => {
                    return Err(mlua::Error::RuntimeError(
                        "First argument must be a number (log level).".into(),
                    ))
                }
            };
            let text: Vec<String> = it
                .map(|v| match v {
                    Value::String(s) => String::from_utf8_lossy(&s.as_bytes()).into_owned(),
                    Value::Number(n) => format_double(n),
                    Value::Integer(n) => n.to_string(),
                    _ => String::new(),
                })
                .collect();
            let text = text.join(" ");
            match level {
                0 => tracing::debug!(target: "script", "{text}"),
                1 | 2 => tracing::info!(target: "script", "{text}"),
                3 => tracing::warn!(target: "script", "{text}"),
                _ => return Err(mlua::Error::RuntimeError("Invalid debug level.".into())),
            }
            Ok(())
        })?,
    )?;
    redis.raw_set(
        "setresp",
        lua.create_function(|_, v: Value| {
            let n = match v {
                Value::Number(n) => n as i64,
                Value::Integer(n) => n,
                _ => 0,
            };
            if n != 2 && n != 3 {
                return Err(mlua::Error::RuntimeError(
                    "RESP version must be 2 or 3.".into(),
                ));
            }
            RUN.with(|r| {
                if let Some(run) = r.borrow_mut().as_mut() {
                    run.resp3 = n == 3;
                }
            });
            Ok(())
        })?,
    )?;
    // Replication does not exist yet; these keep scripts written for it working.
    redis.raw_set("set_repl", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.raw_set(
        "replicate_commands",
        lua.create_function(|_, _: MultiValue| Ok(true))?,
    )?;
    redis.raw_set(
        "breakpoint",
        lua.create_function(|_, _: MultiValue| Ok(false))?,
    )?;
    redis.raw_set("debug", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.raw_set(
        "acl_check_cmd",
        lua.create_function(|_, args: MultiValue| {
            let name = match args.into_iter().next() {
                Some(Value::String(s)) => s.as_bytes().to_vec(),
                _ => {
                    return Err(mlua::Error::RuntimeError(
                        "Please specify at least one argument for this redis lib call".into(),
                    ))
                }
            };
            if table().lookup(&name).is_none() {
                return Err(mlua::Error::RuntimeError(
                    "Invalid command passed to redis.acl_check_cmd()".into(),
                ));
            }
            Ok(true)
        })?,
    )?;
    redis.raw_set(
        "register_function",
        lua.create_function(|lua, args: MultiValue| {
            super::functions::register_function(lua, args)
        })?,
    )?;
    for (name, v) in [
        ("LOG_DEBUG", 0),
        ("LOG_VERBOSE", 1),
        ("LOG_NOTICE", 2),
        ("LOG_WARNING", 3),
        ("REPL_NONE", 0),
        ("REPL_AOF", 1),
        ("REPL_SLAVE", 2),
        ("REPL_REPLICA", 2),
        ("REPL_ALL", 3),
    ] {
        redis.raw_set(name, v)?;
    }
    redis.raw_set("REDIS_VERSION", crate::commands::connection::SERVER_VERSION)?;
    redis.raw_set("REDIS_VERSION_NUM", 0x0007_0204)?;
    Ok(redis)
}

/// Instructions between two looks at the clock while a script runs.
const HOOK_EVERY: i32 = 10_000;

/// The interpreter's hook, installed through the C API rather than mlua so that it also
/// runs inside coroutines (Lua 5.1 copies a thread's hook into the coroutines it
/// creates). Every `HOOK_EVERY` instructions it notices a script past the busy threshold
/// (so other threads answer BUSY) and stops one that SCRIPT KILL named, or library code
/// past its load time. Once it stops something it fires on every line, so a script that
/// catches the error with pcall is stopped again at once, as Redis does (the run then
/// ends with the kill error whatever became of it).
///
/// # Safety
/// Called by Lua with a live state; raises a Lua error only after every Rust value it
/// made is gone.
pub unsafe extern "C-unwind" fn hook(
    state: *mut mlua::ffi::lua_State,
    _ar: *mut mlua::ffi::lua_Debug,
) {
    use mlua::ffi;
    let Some((msg, kill)) = hook_verdict() else {
        return;
    };
    if kill {
        ffi::lua_sethook(state, Some(hook), ffi::LUA_MASKLINE | ffi::LUA_MASKCOUNT, 1);
        TIGHT_HOOK.with(|t| t.set(true));
    }
    ffi::lua_pushstring(state, msg.as_ptr());
    ffi::lua_error(state);
}

thread_local! {
    /// The hook was switched to every line by a stop; the next script puts it back.
    static TIGHT_HOOK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Installs (or restores, after a stop) the counting hook on the interpreter's state.
pub fn install_hook(lua: &Lua) {
    // SAFETY: lua_sethook only stores the hook in the state mlua hands us.
    let _ = unsafe {
        lua.exec_raw::<()>((), |state| {
            mlua::ffi::lua_sethook(state, Some(hook), mlua::ffi::LUA_MASKCOUNT, HOOK_EVERY);
        })
    };
    TIGHT_HOOK.with(|t| t.set(false));
}

/// Puts the counting hook back if a stop tightened it.
pub fn relax_hook(lua: &Lua) {
    if TIGHT_HOOK.with(|t| t.get()) {
        install_hook(lua);
    }
}

/// What the hook must raise, if anything, and whether it is SCRIPT KILL (which then
/// fires on every line): the load timeout or the kill.
fn hook_verdict() -> Option<(&'static std::ffi::CStr, bool)> {
    if super::functions::load_timed_out() {
        return Some((c"FUNCTION LOAD timeout", false));
    }
    let mut serve_clients: Option<Rc<Worker>> = None;
    let verdict = RUN.with(|r| {
        let mut guard = r.try_borrow_mut().ok()?;
        let run = guard.as_mut()?;
        let shared = &run.worker.shared;
        let threshold = shared
            .tunables
            .busy_reply_threshold_ms
            .load(Ordering::Relaxed);
        let id = run.worker.id;
        if threshold > 0
            && run.started.elapsed().as_millis() as u64 >= threshold
            && shared.busy[id]
                .compare_exchange(
                    BUSY_STARTED,
                    BUSY_RUNNING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            shared.busy_count.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(
                "a script has run for {threshold} ms: other clients get BUSY until it ends"
            );
        }
        if shared.busy[id].load(Ordering::Acquire) == BUSY_KILL {
            run.killed = true;
            return Some((c"Script killed by user with SCRIPT KILL...", true));
        }
        if shared.busy[id].load(Ordering::Acquire) == BUSY_RUNNING {
            serve_clients = Some(run.worker.clone());
        }
        None
    });
    if verdict.is_none() {
        if let Some(worker) = serve_clients {
            super::busy::serve(&worker);
            // A SCRIPT KILL served just now stops the script at once.
            if worker.shared.busy[worker.id].load(Ordering::Acquire) == BUSY_KILL {
                RUN.with(|r| {
                    if let Ok(mut g) = r.try_borrow_mut() {
                        if let Some(run) = g.as_mut() {
                            run.killed = true;
                        }
                    }
                });
                return Some((c"Script killed by user with SCRIPT KILL...", true));
            }
        }
    }
    verdict
}

/// Per-thread script state others can see: idle, running under the threshold, running
/// past it (BUSY), or asked to stop.
pub const BUSY_IDLE: u8 = 0;
pub const BUSY_STARTED: u8 = 1;
pub const BUSY_RUNNING: u8 = 2;
pub const BUSY_KILL: u8 = 3;

/// `Shared::busy_kind` bits: the script is an FCALL function; it holds other shards.
pub const KIND_FUNCTION: u8 = 1;
pub const KIND_GLOBAL: u8 = 2;

fn mark_busy(worker: &Rc<Worker>, running: bool) {
    let slot = &worker.shared.busy[worker.id];
    let before = slot.swap(
        if running { BUSY_STARTED } else { BUSY_IDLE },
        Ordering::AcqRel,
    );
    if before == BUSY_RUNNING || before == BUSY_KILL {
        worker.shared.busy_count.fetch_sub(1, Ordering::AcqRel);
        if !running {
            super::busy::release(worker);
        }
    }
    worker.shared.busy_wrote[worker.id].store(false, Ordering::Release);
}

/// The payload of a bulk reply (`$n\r\n...`), None for anything else.
fn reply_bulk(buf: &[u8]) -> Option<Vec<u8>> {
    let rest = buf.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&c| c == b'\r')?;
    let len: usize = std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()?;
    rest.get(nl + 2..nl + 2 + len).map(<[u8]>::to_vec)
}

/// The value of an integer reply (`:n\r\n`).
fn reply_int(buf: &[u8]) -> Option<i64> {
    let rest = buf.strip_prefix(b":")?;
    let nl = rest.iter().position(|&c| c == b'\r')?;
    std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()
}

/// MIGRATE from a script: the keys are read with DUMP and PTTL and removed with DEL,
/// each run where its key lives as any `redis.call` is, and the target is spoken to with
/// blocking calls bounded by the timeout, as Redis does (it holds the whole server).
fn migrate_in_script(run: &mut Running, argv: &[Bytes]) -> Result<Reply, Vec<u8>> {
    use crate::commands::migrate;
    let mut out = Reply::new(run.resp3);
    let req = match migrate::parse(argv) {
        Ok(r) => r,
        Err(e) => {
            out.error(e);
            return Ok(out);
        }
    };
    let t = table();
    let lookup = |name: &[u8]| t.lookup(name).expect("a known command");
    let mut found: Vec<migrate::Found> = Vec::new();
    for k in &req.keys {
        let dump = dispatch(
            run,
            lookup(b"dump"),
            &[Bytes::from_static(b"DUMP"), k.clone()],
        )?;
        let Some(payload) = reply_bulk(&dump.buf) else {
            continue;
        };
        let pttl = dispatch(
            run,
            lookup(b"pttl"),
            &[Bytes::from_static(b"PTTL"), k.clone()],
        )?;
        let ttl = reply_int(&pttl.buf).filter(|&n| n > 0).unwrap_or(0);
        found.push((k.clone(), payload, ttl));
    }
    if found.is_empty() {
        out.simple("NOKEY");
        return Ok(out);
    }
    let (wire, head, replies) = migrate::request_bytes(&req, &found);
    let lines = match migrate::exchange_blocking(&req, &wire, replies) {
        Ok(l) => l,
        Err(f) => {
            out.error(f.text());
            return Ok(out);
        }
    };
    let (error, moved) = migrate::outcome(&req, &found, &lines, head);
    if !moved.is_empty() {
        let mut del = vec![Bytes::from_static(b"DEL")];
        del.extend(moved);
        dispatch(run, lookup(b"del"), &del)?;
    }
    match error {
        Some(e) => out.error(&migrate::target_error(&e)),
        None => out.ok(),
    }
    Ok(out)
}
