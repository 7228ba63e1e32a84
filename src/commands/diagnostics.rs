//! The server's self-diagnosis: LATENCY (events, DOCTOR, GRAPH, HISTOGRAM), MEMORY
//! (STATS, USAGE, DOCTOR, MALLOC-STATS, PURGE) and LOLWUT.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::server::{command_totals, help, rss_bytes, thread_report};
use super::util::{eq_ci, parse_i64, SYNTAX_ERR};
use crate::async_handler;
use crate::server::session::Session;
use crate::shard::logs::LatencyEvent;
use crate::shard::{broadcast, hop, unix_ms, CmdStat};

// ---- LATENCY ----

pub const LATENCY_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("doctor", 2, "admin noscript loading stale"),
    ("graph", 3, "admin noscript loading stale"),
    ("help", 2, "loading stale"),
    ("histogram", -2, "admin noscript loading stale"),
    ("history", 3, "admin noscript loading stale"),
    ("latest", 2, "admin noscript loading stale"),
    ("reset", -2, "admin noscript loading stale"),
];

const LATENCY_HELP: &[&str] = &[
    "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "LATEST",
    "    The latest and worst latency of each event.",
    "HISTORY <event>",
    "    The recorded samples of <event> as (unix time, milliseconds) pairs.",
    "RESET [<event> ...]",
    "    Forgets the samples of the given events, or of all.",
    "GRAPH <event>",
    "    An ASCII chart of the samples of <event>.",
    "DOCTOR",
    "    A report on the latency events seen, for people.",
    "HISTOGRAM [<command> ...]",
    "    For each command (or the given ones): calls, and cumulative counts of calls by",
    "    duration in microseconds (powers of two).",
    "HELP",
    "    Print this help.",
];

/// Latency events merged over all threads.
async fn merged_latency(sess: &Session) -> Vec<(&'static str, LatencyEvent)> {
    let per_thread = broadcast(&sess.worker, |w| {
        w.shard
            .borrow()
            .logs
            .latency
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect::<Vec<_>>()
    })
    .await;
    let mut merged: Vec<(&'static str, LatencyEvent)> = Vec::new();
    for (name, ev) in per_thread.into_iter().flatten() {
        match merged.iter_mut().find(|m| m.0 == name) {
            Some(m) => {
                m.1.max_ms = m.1.max_ms.max(ev.max_ms);
                m.1.history.extend(ev.history);
                m.1.history.make_contiguous().sort();
            }
            None => merged.push((name, ev)),
        }
    }
    merged.sort_by_key(|m| m.0);
    merged
}

async_handler!(latency, |sess, args| {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "latest" => {
            let merged = merged_latency(sess).await;
            sess.out.array(merged.len());
            for (name, ev) in merged {
                let (t, ms) = ev.history.back().copied().unwrap_or((0, 0));
                sess.out.array(4);
                sess.out.bulk(name.as_bytes());
                sess.out.int(t as i64);
                sess.out.int(ms as i64);
                sess.out.int(ev.max_ms as i64);
            }
        }
        "history" => {
            let want = String::from_utf8_lossy(&args[2]).to_ascii_lowercase();
            let merged = merged_latency(sess).await;
            match merged.into_iter().find(|m| m.0 == want) {
                None => sess.out.array(0),
                Some((_, ev)) => {
                    sess.out.array(ev.history.len());
                    for (t, ms) in ev.history {
                        sess.out.array(2);
                        sess.out.int(t as i64);
                        sess.out.int(ms as i64);
                    }
                }
            }
        }
        "reset" => {
            let events: Vec<String> = args[2..]
                .iter()
                .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
                .collect();
            let counts = broadcast(&sess.worker, move |w| {
                let mut sh = w.shard.borrow_mut();
                let logs = &mut sh.logs;
                if events.is_empty() {
                    let names: Vec<&'static str> = logs.latency.keys().copied().collect();
                    logs.latency.clear();
                    names
                } else {
                    let names: Vec<&'static str> = logs
                        .latency
                        .keys()
                        .copied()
                        .filter(|k| events.iter().any(|e| e == k))
                        .collect();
                    for n in &names {
                        logs.latency.remove(n);
                    }
                    names
                }
            })
            .await;
            let mut names: Vec<&str> = counts.into_iter().flatten().collect();
            names.sort();
            names.dedup();
            sess.out.int(names.len() as i64);
        }
        "doctor" => {
            let text = latency_doctor(sess).await;
            sess.out.verbatim(text.as_bytes());
        }
        "graph" => {
            let want = String::from_utf8_lossy(&args[2]).to_ascii_lowercase();
            let merged = merged_latency(sess).await;
            match merged.into_iter().find(|m| m.0 == want) {
                Some((name, ev)) if !ev.history.is_empty() => {
                    let g = latency_graph(name, &ev);
                    sess.out.verbatim(g.as_bytes());
                }
                _ => sess.error(&format!(
                    "ERR No samples available for event '{}'",
                    String::from_utf8_lossy(&args[2])
                )),
            }
        }
        "histogram" => latency_histogram(sess, &args[2..]).await,
        "help" => help(sess, LATENCY_HELP),
        _ => unreachable!("subcommands are checked before dispatch"),
    }
});

// ---- MEMORY ----

pub const MEMORY_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("doctor", 2, ""),
    ("help", 2, "loading stale"),
    ("malloc-stats", 2, ""),
    ("purge", 2, ""),
    ("stats", 2, ""),
    ("usage", -3, "readonly"),
];

const MEMORY_HELP: &[&str] = &[
    "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "STATS",
    "    Figures on memory use.",
    "USAGE <key> [SAMPLES <count>]",
    "    Bytes a key and its value take, estimated.",
    "DOCTOR",
    "    A report on how memory is used, for people.",
    "MALLOC-STATS",
    "    The allocator's own figures.",
    "PURGE",
    "    Returns unused memory the allocator holds to the system.",
    "HELP",
    "    Print this help.",
];

/// What one entry of the key table costs, a short key and a short string included
/// (`types::key`, `StrValue::Small`): what they hold on the heap comes on top.
const ENTRY_OVERHEAD: usize = 64;

async_handler!(memory, |sess, args| {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "usage" => {
            if args.len() != 3 && !(args.len() == 5 && eq_ci(&args[3], "samples")) {
                return sess.error(SYNTAX_ERR);
            }
            if args.len() == 5 && parse_i64(&args[4]).is_err() {
                return sess.error(super::util::NOT_INT);
            }
            let db = sess.db;
            let key = args[2].clone();
            let shard = sess.worker.shard_of(&key);
            let size = hop(&sess.worker, shard, move |w| {
                let mut sh = w.shard.borrow_mut();
                sh.lookup(db, &key, unix_ms())
                    .map(|e| ENTRY_OVERHEAD + e.key.heap_size() + e.value.heap_size())
            })
            .await;
            match size {
                Some(n) => sess.out.int(n as i64),
                None => sess.out.null(),
            }
        }
        "stats" => {
            let reports = broadcast(&sess.worker, |w| thread_report(w)).await;
            let keys: u64 = reports
                .iter()
                .flat_map(|r| r.keyspace.iter().map(|k| k.0))
                .sum();
            let shared = &sess.worker.shared;
            let used = shared.used_memory.load(Ordering::Relaxed) as u64;
            let peak = shared.peak_memory.load(Ordering::Relaxed) as u64;
            let rss = rss_bytes();
            let startup = shared.startup_memory.load(Ordering::Relaxed) as u64;
            let _ = tikv_jemalloc_ctl::epoch::advance();
            let active = tikv_jemalloc_ctl::stats::active::read().unwrap_or(0) as u64;
            let resident = tikv_jemalloc_ctl::stats::resident::read().unwrap_or(0) as u64;
            let overhead = startup;
            let dataset = used.saturating_sub(overhead);
            let ratio = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
            // Redis 7.2's fields, in its order (the per-database and per-client parts
            // Kite does not keep apart are folded into the totals).
            let ints: [(&str, u64); 11] = [
                ("peak.allocated", peak),
                ("total.allocated", used),
                ("startup.allocated", startup),
                ("replication.backlog", 0),
                ("clients.slaves", 0),
                ("clients.normal", 0),
                ("cluster.links", 0),
                ("aof.buffer", 0),
                ("lua.caches", 0),
                ("functions.caches", 0),
                ("overhead.total", overhead),
            ];
            let out = &mut sess.out;
            out.map(ints.len() + 16);
            for (k, v) in ints {
                out.bulk(k.as_bytes());
                out.int(v as i64);
            }
            out.bulk(b"keys.count");
            out.int(keys as i64);
            out.bulk(b"keys.bytes-per-key");
            out.int(dataset.checked_div(keys).unwrap_or(0) as i64);
            out.bulk(b"dataset.bytes");
            out.int(dataset as i64);
            out.bulk(b"dataset.percentage");
            out.double(ratio(dataset * 100, used));
            out.bulk(b"peak.percentage");
            out.double(ratio(used * 100, peak));
            out.bulk(b"allocator.allocated");
            out.int(used as i64);
            out.bulk(b"allocator.active");
            out.int(active as i64);
            out.bulk(b"allocator.resident");
            out.int(resident as i64);
            out.bulk(b"allocator-fragmentation.ratio");
            out.double(ratio(active, used));
            out.bulk(b"allocator-fragmentation.bytes");
            out.int(active as i64 - used as i64);
            out.bulk(b"allocator.rss-ratio");
            out.double(ratio(resident, active));
            out.bulk(b"allocator.rss-bytes");
            out.int(resident as i64 - active as i64);
            out.bulk(b"rss-overhead.ratio");
            out.double(ratio(rss, resident));
            out.bulk(b"rss-overhead.bytes");
            out.int(rss as i64 - resident as i64);
            out.bulk(b"fragmentation");
            out.double(ratio(rss, used));
            out.bulk(b"fragmentation.bytes");
            out.int(rss as i64 - used as i64);
        }
        "doctor" => {
            let text = memory_doctor(sess);
            sess.out.verbatim(text.as_bytes());
        }
        "malloc-stats" => {
            let text = malloc_stats();
            sess.out.bulk(text.as_bytes());
        }
        "purge" => {
            crate::memory::purge();
            crate::memory::refresh(&sess.worker.shared);
            sess.out.ok();
        }
        "help" => help(sess, MEMORY_HELP),
        _ => unreachable!("subcommands are checked before dispatch"),
    }
});

// ---- LATENCY DOCTOR, GRAPH, HISTOGRAM ----

async fn latency_doctor(sess: &Session) -> String {
    let threshold = sess
        .worker
        .shared
        .tunables
        .latency_threshold_ms
        .load(Ordering::Relaxed);
    let merged = merged_latency(sess).await;
    // The opening sentences are what tools and tests look for, as Redis words them.
    if merged.is_empty() && threshold == 0 {
        return "I'm sorry, Dave, I can't do that. Latency monitoring is disabled in this Redis instance. You may use \"CONFIG SET latency-monitor-threshold <milliseconds>.\" in order to enable it. If we weren't in a deep space mission I'd suggest to take a look at https://redis.io/topics/latency-monitor.\n".into();
    }
    if merged.is_empty() {
        return "Dave, no latency spike was observed during the lifetime of this Redis instance, not in the slightest bit. I honestly think you ought to sit down calmly, take a stress pill, and think things over.\n".into();
    }
    let mut r = String::from(
        "Dave, I have observed latency spikes in this Redis instance. You don't mind talking about it, do you Dave?\n\n",
    );
    for (i, (name, ev)) in merged.iter().enumerate() {
        let n = ev.history.len().max(1) as u64;
        let sum: u64 = ev.history.iter().map(|h| h.1).sum();
        let avg = sum / n;
        let _ = writeln!(
            r,
            "{}. {name}: {} latency spikes (average {avg}ms). Worst all time event {}ms.",
            i + 1,
            ev.history.len(),
            ev.max_ms
        );
    }
    r.push_str("\nKite's advice:\n");
    for (name, _) in &merged {
        let advice = match *name {
            "command" => "- Slow commands: check SLOWLOG GET for commands over many elements (KEYS, SMEMBERS, LRANGE 0 -1, SORT) and break them up, or use SCAN.",
            "fast-command" => "- Even O(1) commands were slow: the machine may be overloaded or swapping; check the CPU and memory of the host.",
            _ => "- Look at what the server was doing at the times LATENCY HISTORY reports.",
        };
        let _ = writeln!(r, "{advice}");
    }
    r
}

/// An ASCII chart of an event's samples, oldest on the left, newest on the right.
fn latency_graph(name: &str, ev: &LatencyEvent) -> String {
    let samples: Vec<(u64, u64)> = ev.history.iter().copied().collect();
    let max = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let min = samples.iter().map(|s| s.1).min().unwrap_or(0);
    let mut g = format!(
        "{name} - high {max} ms, low {min} ms (all time high {} ms)\n",
        ev.max_ms
    );
    g.push_str(&"-".repeat(80));
    g.push('\n');
    let cols: Vec<&(u64, u64)> = samples.iter().rev().take(80).rev().collect();
    const ROWS: u64 = 4;
    for row in (1..=ROWS).rev() {
        for (_, ms) in &cols {
            let level = if max == 0 {
                0
            } else {
                (ms * ROWS).div_ceil(max)
            };
            g.push(if level >= row { '#' } else { ' ' });
        }
        g.push('\n');
    }
    // How long ago each sample was: one label per column, read downwards.
    let now = unix_ms() / 1000;
    let labels: Vec<String> = cols
        .iter()
        .map(|(t, _)| {
            let ago = now.saturating_sub(*t);
            match ago {
                0..=59 => format!("{ago}s"),
                60..=3599 => format!("{}m", ago / 60),
                3600..=86_399 => format!("{}h", ago / 3600),
                _ => format!("{}d", ago / 86_400),
            }
        })
        .collect();
    let height = labels.iter().map(|l| l.len()).max().unwrap_or(0);
    for i in 0..height {
        for l in &labels {
            g.push(l.as_bytes().get(i).map_or(' ', |&c| c as char));
        }
        g.push('\n');
    }
    g
}

/// LATENCY HISTOGRAM [command ...]: calls and cumulative calls by duration (powers of
/// two microseconds) for each command that ran, merged over every thread.
async fn latency_histogram(sess: &mut Session, names: &[Bytes]) {
    let reports = broadcast(&sess.worker, |w| thread_report(w)).await;
    let table = super::table();
    let totals = command_totals(&reports);
    let mut rows: Vec<(&'static str, u64, [u64; 32])> = Vec::new();
    for cmd in &table.commands {
        if !names.is_empty() && !names.iter().any(|n| eq_ci(n, cmd.name)) {
            continue;
        }
        let Some(&CmdStat { calls, hist, .. }) = totals.get(cmd.id) else {
            continue;
        };
        if calls > 0 {
            rows.push((cmd.name, calls, hist));
        }
    }
    let out = &mut sess.out;
    out.map(rows.len());
    for (name, calls, hist) in rows {
        out.bulk(name.as_bytes());
        out.map(2);
        out.bulk(b"calls");
        out.int(calls as i64);
        out.bulk(b"histogram_usec");
        let mut cumulative = 0;
        let mut points = Vec::new();
        for (k, n) in hist.iter().enumerate() {
            if *n > 0 {
                cumulative += n;
                points.push((1u64 << k, cumulative));
            }
        }
        out.map(points.len());
        for (bucket, count) in points {
            out.int(bucket as i64);
            out.int(count as i64);
        }
    }
}

// ---- MEMORY DOCTOR, MALLOC-STATS ----

fn memory_doctor(sess: &Session) -> String {
    let shared = &sess.worker.shared;
    let used = shared.used_memory.load(Ordering::Relaxed) as u64;
    let peak = shared.peak_memory.load(Ordering::Relaxed) as u64;
    let rss = rss_bytes();
    let max = shared.tunables.maxmemory.load(Ordering::Relaxed);
    if used < 5 << 20 {
        return "Hi Sam, this instance is empty or is using very little memory, so there is nothing to diagnose yet. Fill it with some data and ask again.\n".into();
    }
    let mut issues = Vec::new();
    if peak > used * 3 / 2 {
        issues.push(format!(
            "* Peak memory: at its peak the server used {} bytes, {:.0}% more than the {} bytes used now. Memory freed since may still be held by the allocator (MEMORY PURGE returns it).",
            peak,
            (peak as f64 / used as f64 - 1.0) * 100.0,
            used
        ));
    }
    if rss > used * 3 / 2 {
        issues.push(format!(
            "* High fragmentation: the process holds {rss} bytes of memory for {used} bytes in use (ratio {:.2}).",
            rss as f64 / used as f64
        ));
    }
    if max > 0 && used > max * 9 / 10 {
        issues.push(format!(
            "* Near maxmemory: {used} of {max} bytes are in use; writes will evict keys or be refused soon."
        ));
    }
    if issues.is_empty() {
        return "Hi Sam, I can't find any memory issue in your instance. I can only account for what occurs on this base.\n".into();
    }
    let mut r =
        String::from("Sam, I detected a few issues in this Kite instance memory implants:\n\n");
    for i in issues {
        r.push_str(&i);
        r.push_str("\n\n");
    }
    r
}

fn malloc_stats() -> String {
    use tikv_jemalloc_ctl::stats;
    let _ = tikv_jemalloc_ctl::epoch::advance();
    let mut s = String::from("___ Begin jemalloc statistics (Kite summary) ___\n");
    let figures: [(&str, Option<usize>); 6] = [
        ("Allocated", stats::allocated::read().ok()),
        ("Active", stats::active::read().ok()),
        ("Metadata", stats::metadata::read().ok()),
        ("Resident", stats::resident::read().ok()),
        ("Mapped", stats::mapped::read().ok()),
        ("Retained", stats::retained::read().ok()),
    ];
    for (name, v) in figures {
        let _ = writeln!(s, "{name}: {}", v.unwrap_or(0));
    }
    s.push_str("--- End jemalloc statistics ---\n");
    s
}
