//! Scripting commands: EVAL, EVALSHA, EVAL_RO, EVALSHA_RO, SCRIPT, FCALL, FCALL_RO and
//! FUNCTION. Where a script runs is decided here; how it runs is in `crate::scripting`.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::async_handler;
use crate::protocol::reply::Reply;
use crate::scripting::functions::{self, Library};
use crate::scripting::run::{self, Body, Job, BUSY_KILL, BUSY_RUNNING};
use crate::scripting::{self as scripting_mod, vm};
use crate::server::session::Session;
use crate::shard::tx::Tx;
use crate::shard::{broadcast, hop};

/// EVAL script numkeys key... arg...: the keys of a call.
pub fn eval_keys(args: &[Bytes]) -> Vec<usize> {
    let n = args
        .get(2)
        .and_then(|a| super::util::parse_i64(a).ok())
        .map_or(0, |n| n.max(0) as usize);
    (3..(3 + n).min(args.len())).collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Eval,
    EvalSha,
    Fcall,
}

async_handler!(eval, |sess, args| {
    call(sess, args, Kind::Eval, false).await
});
async_handler!(evalsha, |sess, args| {
    call(sess, args, Kind::EvalSha, false).await
});
async_handler!(eval_ro, |sess, args| {
    call(sess, args, Kind::Eval, true).await
});
async_handler!(evalsha_ro, |sess, args| {
    call(sess, args, Kind::EvalSha, true).await
});
async_handler!(fcall, |sess, args| {
    call(sess, args, Kind::Fcall, false).await
});
async_handler!(fcall_ro, |sess, args| {
    call(sess, args, Kind::Fcall, true).await
});

async fn call(sess: &mut Session, args: Vec<Bytes>, kind: Kind, read_only: bool) {
    // FCALL names a missing function before it looks at numkeys, as Redis does.
    let function = if kind == Kind::Fcall {
        let name = String::from_utf8_lossy(&args[1]).into_owned();
        match scripting_mod::registry().function_flags(&name) {
            Some(flags) => Some((name, flags)),
            None => return sess.out.error("ERR Function not found"),
        }
    } else {
        None
    };
    let numkeys = match super::util::parse_i64(&args[2]).ok() {
        Some(n) if n < 0 => return sess.out.error("ERR Number of keys can't be negative"),
        Some(n) if n as usize > args.len() - 3 => {
            return sess
                .out
                .error("ERR Number of keys can't be greater than number of args")
        }
        Some(n) => n as usize,
        None if kind == Kind::Fcall => return sess.out.error("ERR Bad number of keys provided"),
        None => {
            return sess
                .out
                .error("ERR value is not an integer or out of range")
        }
    };
    let (body, flags) = match kind {
        Kind::Eval => match scripting_mod::cache().add(&args[1]) {
            Ok(s) => {
                let f = s.flags;
                (Body::Script(s), f)
            }
            Err(e) => return sess.out.error(&e),
        },
        Kind::EvalSha => match scripting_mod::cache().get(&args[1]) {
            Some(s) => {
                let f = s.flags;
                (Body::Script(s), f)
            }
            None => {
                return sess
                    .out
                    .error("NOSCRIPT No matching script. Please use EVAL.")
            }
        },
        Kind::Fcall => {
            let (name, flags) = function.expect("looked up above");
            (Body::Function(name), flags)
        }
    };
    if read_only && flags.shebang && !flags.no_writes {
        return sess
            .out
            .error("ERR Can not execute a script with write flag using *_ro command.");
    }
    if flags.no_cluster && sess.worker.shared.cluster.is_some() {
        return sess
            .out
            .error("ERR Can not run script on cluster, 'no-cluster' flag is set.");
    }
    if flags.shebang && !flags.no_writes && !flags.allow_oom && sess.over_maxmemory() {
        return sess
            .out
            .error("OOM command not allowed when used memory > 'maxmemory'.");
    }
    let worker = sess.worker.clone();
    let mut shards = args[3..3 + numkeys].iter().map(|k| worker.shard_of(k));
    let target = shards.next().unwrap_or(worker.id);
    let spread = shards.any(|s| s != target);
    let wide = match &body {
        Body::Script(s) => s.is_wide(),
        Body::Function(name) => scripting_mod::function_is_wide(name),
    };
    let mut job = Job {
        body,
        args,
        keys_start: 3,
        keys_end: 3 + numkeys,
        db: sess.db,
        resp3: sess.out.resp3,
        no_touch: sess.no_touch,
        flags,
        read_only,
        global: false,
        remote: target != worker.id,
        collect_effects: sess.in_exec,
        user: (!sess.user.unrestricted).then(|| sess.user.clone()),
        client_id: sess.id,
    };
    // Run time of the job on another thread, for INFO commandstats and the slow log.
    let mut away_us = 0;
    let outcome = if sess.in_exec {
        // EXEC already holds every shard.
        job.global = true;
        job.remote = false;
        Some(run::run_job(&worker, &job))
    } else if spread || wide {
        None
    } else {
        crate::server::dispatch::note_affinity(sess, target, 1);
        let outcome = if target == worker.id {
            run::run_job(&worker, &job)
        } else {
            let j = job.for_remote();
            let o = hop(&worker, target, move |w| run::run_job(w, &j)).await;
            away_us += o.run_us;
            o
        };
        if outcome.restart {
            match &job.body {
                Body::Script(s) => s.wide.store(true, Ordering::Relaxed),
                Body::Function(name) => scripting_mod::mark_function_wide(name),
            }
            worker.shard.borrow_mut().stats.scripts_restarted += 1;
            None
        } else if outcome.locked {
            None
        } else {
            Some(outcome)
        }
    };
    let outcome = match outcome {
        Some(o) => o,
        None => {
            // Every shard locked, the script runs where its first key lives, so most of
            // its calls stay inline; the others are synchronous hops.
            let tx = Tx::lock_keys(&worker, &[], true).await;
            job.global = true;
            job.remote = target != worker.id;
            let o = hop(&worker, target, move |w| run::run_job(w, &job)).await;
            drop(tx);
            if target != worker.id {
                away_us += o.run_us;
            }
            o
        }
    };
    sess.away_us = Some(away_us);
    if let Some(effects) = outcome.effects {
        sess.aof_pending.push(effects);
    }
    sess.out.buf.extend_from_slice(&outcome.reply.buf);
    for (db, event, key) in &outcome.events {
        crate::pubsub::publish_event(&worker, *db, event, key);
    }
}

async_handler!(script, |sess, args| {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "load" => match scripting_mod::cache().add(&args[2]) {
            Ok(s) => {
                let compiled = vm::with_vm(|vm| vm.compile(&s.sha, &s.code).map(|_| ()));
                match compiled {
                    Ok(()) => sess.out.bulk(s.sha.as_bytes()),
                    Err(e) => {
                        scripting_mod::cache().remove(&s.sha);
                        sess.out.error(&e)
                    }
                }
            }
            Err(e) => sess.out.error(&e),
        },
        "exists" => {
            sess.out.array(args.len() - 2);
            for sha in &args[2..] {
                let found = scripting_mod::cache().get(sha).is_some();
                sess.out.int(found as i64);
            }
        }
        "flush" => {
            if let Some(mode) = args.get(2) {
                let m = String::from_utf8_lossy(mode).to_ascii_lowercase();
                if args.len() > 3 || (m != "async" && m != "sync") {
                    return sess
                        .out
                        .error("ERR SCRIPT FLUSH only support SYNC|ASYNC option");
                }
            }
            scripting_mod::cache().flush();
            broadcast(&sess.worker, |_| vm::reset()).await;
            sess.out.ok();
        }
        "kill" => kill(sess, false),
        "debug" => sess.out.error("ERR SCRIPT DEBUG is not supported by Kite"),
        "help" => {
            let lines = [
                "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "EXISTS <sha1> [<sha1> ...]",
                "    Return information about the existence of the scripts in the script cache.",
                "FLUSH [ASYNC|SYNC]",
                "    Flush the Lua scripts cache. Very dangerous on replicas.",
                "KILL",
                "    Kill the currently executing Lua script.",
                "LOAD <script>",
                "    Load a script into the scripts cache without executing it.",
                "HELP",
                "    Print this help.",
            ];
            help_reply(&mut sess.out, &lines);
        }
        _ => unreachable!("subcommands are checked before"),
    }
});

/// SCRIPT KILL and FUNCTION KILL: stops a script past the busy threshold that has not
/// written yet.
fn kill(sess: &mut Session, function: bool) {
    match kill_busy(&sess.worker.shared, !function) {
        Ok(()) => sess.out.ok(),
        Err(e) => sess.out.error(&e),
    }
}

const BUSY_EVAL: &str =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";
const BUSY_FUNCTION: &str =
    "BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE.";

/// Asks the busy script to stop (SCRIPT KILL for EVAL, FUNCTION KILL for FCALL); the
/// error when there is none, it has written, or the other command is needed. Also called
/// from the busy thread's own hook (`scripting::busy`).
pub fn kill_busy(shared: &crate::shard::Shared, is_eval: bool) -> Result<(), String> {
    for (id, slot) in shared.busy.iter().enumerate() {
        if slot.load(Ordering::Acquire) == BUSY_RUNNING {
            if shared.busy_wrote[id].load(Ordering::Acquire) {
                return Err("UNKILLABLE Sorry the script already executed write commands against the dataset. You can either wait the script termination or kill the server in a hard way using the SHUTDOWN NOSAVE command.".into());
            }
            let function = shared.busy_kind[id].load(Ordering::Acquire) & run::KIND_FUNCTION != 0;
            if is_eval && function {
                return Err(BUSY_FUNCTION.into());
            }
            if !is_eval && !function {
                return Err(BUSY_EVAL.into());
            }
            slot.store(BUSY_KILL, Ordering::Release);
            return Ok(());
        }
    }
    Err("NOTBUSY No scripts in execution right now.".into())
}

/// The BUSY text while a script is busy: which KILL command it names depends on whether
/// an FCALL function or an EVAL script runs.
pub fn busy_text(shared: &crate::shard::Shared) -> &'static str {
    let function = shared.busy.iter().enumerate().any(|(id, slot)| {
        slot.load(Ordering::Acquire) >= BUSY_RUNNING
            && shared.busy_kind[id].load(Ordering::Acquire) & run::KIND_FUNCTION != 0
    });
    if function {
        BUSY_FUNCTION
    } else {
        BUSY_EVAL
    }
}

async_handler!(function, |sess, args| {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    let registry = scripting_mod::registry();
    match sub.as_str() {
        "load" => {
            let (replace, code) = match args.len() {
                3 => (false, &args[2]),
                4 if args[2].eq_ignore_ascii_case(b"replace") => (true, &args[3]),
                4 => {
                    return sess.out.error(&format!(
                        "ERR Unknown option given: {}",
                        String::from_utf8_lossy(&args[2])
                    ))
                }
                _ => {
                    return sess
                        .out
                        .error("ERR wrong number of arguments for 'function|load' command")
                }
            };
            let lib = vm::with_vm(|vm| functions::compile_library(vm, code));
            match lib {
                Ok(lib) => {
                    let name = lib.name.clone();
                    match registry.install(vec![lib], replace, true) {
                        Ok(()) => {
                            crate::commands::log_global_effect(sess, &args);
                            sess.out.bulk(name.as_bytes())
                        }
                        Err(e) => sess.out.error(&e),
                    }
                }
                Err(e) => sess.out.error(&e),
            }
        }
        "delete" => {
            if registry.delete(&String::from_utf8_lossy(&args[2])) {
                crate::commands::log_global_effect(sess, &args);
                sess.out.ok()
            } else {
                sess.out.error("ERR Library not found")
            }
        }
        "flush" => {
            if !flush_mode_ok(&args) {
                return sess
                    .out
                    .error("ERR FUNCTION FLUSH only supports SYNC|ASYNC option");
            }
            registry.flush();
            crate::commands::log_global_effect(sess, &args);
            sess.out.ok();
        }
        "list" => list(sess, &args, registry.snapshot()),
        "dump" => {
            let payload = functions::dump(&registry.snapshot());
            sess.out.bulk(&payload);
        }
        "restore" => restore(sess, &args),
        "stats" => {
            let libs = registry.snapshot();
            let nfuncs: usize = libs.iter().map(|l| l.functions.len()).sum();
            let out = &mut sess.out;
            out.map(2);
            out.bulk(b"running_script");
            out.null();
            out.bulk(b"engines");
            out.map(1);
            out.bulk(b"LUA");
            out.map(2);
            out.bulk(b"libraries_count");
            out.int(libs.len() as i64);
            out.bulk(b"functions_count");
            out.int(nfuncs as i64);
        }
        "kill" => kill(sess, true),
        "help" => {
            let lines = [
                "FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "LOAD [REPLACE] <FUNCTION CODE>",
                "    Creates a library from the given code, replacing one of the same name with REPLACE.",
                "DELETE <LIBRARY NAME>",
                "    Deletes a library and its functions.",
                "LIST [LIBRARYNAME PATTERN] [WITHCODE]",
                "    Lists the libraries, optionally only those matching a pattern, with their code.",
                "FLUSH [ASYNC|SYNC]",
                "    Deletes every library.",
                "DUMP",
                "    A serialized payload of every library.",
                "RESTORE <PAYLOAD> [FLUSH|APPEND|REPLACE]",
                "    Loads libraries from a DUMP payload.",
                "STATS",
                "    The running function, if any, and the engines' counts.",
                "KILL",
                "    Stops a running function that has not written.",
                "HELP",
                "    Print this help.",
            ];
            help_reply(&mut sess.out, &lines);
        }
        _ => unreachable!("subcommands are checked before"),
    }
});

fn list(sess: &mut Session, args: &[Bytes], libs: Vec<Library>) {
    let mut with_code = false;
    let mut pattern: Option<Bytes> = None;
    let mut i = 2;
    while i < args.len() {
        let a = String::from_utf8_lossy(&args[i]).to_ascii_lowercase();
        match a.as_str() {
            "withcode" if !with_code => with_code = true,
            "libraryname" if pattern.is_none() && i + 1 < args.len() => {
                pattern = Some(args[i + 1].clone());
                i += 1;
            }
            "libraryname" if pattern.is_none() => {
                return sess.out.error("ERR library name argument was not given")
            }
            _ => {
                return sess.out.error(&format!(
                    "ERR Unknown argument {}",
                    String::from_utf8_lossy(&args[i])
                ))
            }
        }
        i += 1;
    }
    let libs: Vec<&Library> = libs
        .iter()
        .filter(|l| {
            pattern
                .as_ref()
                .is_none_or(|p| super::util::glob_match(p, l.name.as_bytes(), false))
        })
        .collect();
    let out = &mut sess.out;
    out.array(libs.len());
    for lib in libs {
        out.map(if with_code { 4 } else { 3 });
        out.bulk(b"library_name");
        out.bulk(lib.name.as_bytes());
        out.bulk(b"engine");
        out.bulk(b"LUA");
        out.bulk(b"functions");
        out.array(lib.functions.len());
        for f in &lib.functions {
            out.map(3);
            out.bulk(b"name");
            out.bulk(f.name.as_bytes());
            out.bulk(b"description");
            match &f.description {
                Some(d) => out.bulk(d.as_bytes()),
                None => out.null(),
            }
            out.bulk(b"flags");
            out.set(f.flag_names.len());
            for name in &f.flag_names {
                out.simple(name);
            }
        }
        if with_code {
            out.bulk(b"library_code");
            out.bulk(&lib.code);
        }
    }
}

fn restore(sess: &mut Session, args: &[Bytes]) {
    let policy = match args.get(3) {
        None => "append".to_string(),
        Some(p) => String::from_utf8_lossy(p).to_ascii_lowercase(),
    };
    if !["append", "replace", "flush"].contains(&policy.as_str()) || args.len() > 4 {
        return sess.out.error(
            "ERR Wrong restore policy given, value should be either FLUSH, APPEND or REPLACE.",
        );
    }
    let Some(codes) = functions::undump(&args[2]) else {
        return sess
            .out
            .error("ERR DUMP payload version or checksum are wrong");
    };
    let libs: Result<Vec<Library>, String> = vm::with_vm(|vm| {
        codes
            .iter()
            .map(|c| functions::compile_library(vm, c))
            .collect()
    });
    let libs = match libs {
        Ok(l) => l,
        Err(e) => return sess.out.error(&e),
    };
    let registry = scripting_mod::registry();
    let result = match policy.as_str() {
        "flush" => {
            registry.replace_all(libs);
            Ok(())
        }
        "replace" => registry.install(libs, true, false),
        _ => registry.install(libs, false, false),
    };
    match result {
        Ok(()) => {
            crate::commands::log_global_effect(sess, args);
            sess.out.ok()
        }
        Err(e) => sess.out.error(&e),
    }
}

/// SCRIPT FLUSH and FUNCTION FLUSH take an optional ASYNC or SYNC (both flush at once).
fn flush_mode_ok(args: &[Bytes]) -> bool {
    match args.get(2) {
        None => true,
        Some(mode) => {
            args.len() == 3
                && (mode.eq_ignore_ascii_case(b"async") || mode.eq_ignore_ascii_case(b"sync"))
        }
    }
}

/// A HELP reply: one status line each.
fn help_reply(out: &mut Reply, lines: &[&str]) {
    out.array(lines.len());
    for l in lines {
        out.simple(l);
    }
}

/// The reply a command gets while a script is past the busy threshold.
pub fn busy_error(shared: &crate::shard::Shared, out: &mut Reply) {
    out.error(busy_text(shared));
}
