//! `/metrics`: the queues and the server in Prometheus's text format (0.0.4).
//!
//! Server-wide figures are read from INFO's own text, so `/metrics` and INFO cannot
//! disagree.

use std::fmt::Write;
use std::rc::Rc;

use super::hist::BOUNDS_MS;
use super::report::{gather, Snapshot};
use crate::shard::{broadcast, Worker};

/// A label value: backslash, quote and newline escaped, other bytes as UTF-8 (lossy).
pub fn label(v: &[u8]) -> String {
    let mut s = String::with_capacity(v.len());
    for c in String::from_utf8_lossy(v).chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn head(s: &mut String, name: &str, kind: &str, help: &str) {
    let _ = write!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
}

/// Per-thread figures: (thread, cpu seconds, ops/s, keys).
pub fn thread_cpu_seconds(tid: i32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name in parentheses (which may hold spaces).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks / hz
}

pub struct ThreadLoad {
    pub id: usize,
    pub cpu_seconds: f64,
    pub ops_per_sec: u64,
    pub keys: u64,
    pub clients: u64,
    pub queues: usize,
}

pub async fn thread_loads(worker: &Rc<Worker>) -> Vec<ThreadLoad> {
    broadcast(worker, |w| {
        let sh = w.shard.borrow();
        ThreadLoad {
            id: w.id,
            cpu_seconds: thread_cpu_seconds(sh.tid),
            ops_per_sec: sh.ops_per_sec(),
            keys: sh.dbs.iter().map(|d| d.table.len() as u64).sum(),
            clients: w.clients.borrow().map.len() as u64,
            queues: sh.queues.len(),
        }
    })
    .await
}

/// INFO's `field:value` lines as pairs.
pub fn info_fields(info: &str) -> Vec<(&str, &str)> {
    info.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .collect()
}

fn queue_metrics(s: &mut String, snap: &Snapshot, allowed: &dyn Fn(&[u8]) -> bool) {
    let rows: Vec<_> = snap.rows.iter().filter(|r| allowed(&r.key)).collect();
    // A queue's name is unique within its database: other databases than 0 add a label.
    let labels = |r: &super::report::Row| {
        let db = if r.db == 0 {
            String::new()
        } else {
            format!(",db=\"{}\"", r.db)
        };
        format!(
            "queue=\"{}\",framework=\"{}\"{db}",
            label(&r.name),
            r.framework.name()
        )
    };
    type Gauge = fn(&super::report::Row, u64) -> f64;
    let simple: [(&str, &str, &str, Gauge); 5] = [
        (
            "kite_queue_depth",
            "gauge",
            "Elements waiting in the queue.",
            |r, _| r.depth as f64,
        ),
        (
            "kite_queue_pushed_total",
            "counter",
            "Elements pushed since the queue was first seen.",
            |r, _| r.pushed as f64,
        ),
        (
            "kite_queue_popped_total",
            "counter",
            "Elements taken since the queue was first seen.",
            |r, _| r.popped as f64,
        ),
        (
            "kite_queue_consumers",
            "gauge",
            "Clients blocked on the queue now.",
            |r, _| r.consumers as f64,
        ),
        (
            "kite_queue_oldest_age_seconds",
            "gauge",
            "Age of the oldest waiting element (0 when empty).",
            |r, now| r.oldest_age_ms(now).unwrap_or(0) as f64 / 1000.0,
        ),
    ];
    for (name, kind, help, get) in simple {
        head(s, name, kind, help);
        for r in &rows {
            let _ = writeln!(s, "{name}{{{}}} {}", labels(r), get(r, snap.now_ms));
        }
    }
    head(
        s,
        "kite_queue_wait_seconds",
        "histogram",
        "Time from push to pop of the elements taken.",
    );
    for r in &rows {
        let l = labels(r);
        let mut cumulative = 0;
        for (i, c) in r.hist.counts.iter().enumerate() {
            cumulative += c;
            let le = match BOUNDS_MS.get(i) {
                Some(&b) => format!("{}", b as f64 / 1000.0),
                None => "+Inf".into(),
            };
            let _ = writeln!(
                s,
                "kite_queue_wait_seconds_bucket{{{l},le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            s,
            "kite_queue_wait_seconds_sum{{{l}}} {}",
            r.hist.sum_ms as f64 / 1000.0
        );
        let _ = writeln!(s, "kite_queue_wait_seconds_count{{{l}}} {}", r.hist.count);
    }
    head(
        s,
        "kite_queue_jobs",
        "gauge",
        "Jobs by state for a framework's layout (queue=\"\" for framework-wide states).",
    );
    for r in &rows {
        for (state, n) in &r.jobs {
            let _ = writeln!(s, "kite_queue_jobs{{{},state=\"{state}\"}} {n}", labels(r));
        }
    }
    for (f, db, states) in &snap.globals {
        let db = if *db == 0 {
            String::new()
        } else {
            format!(",db=\"{db}\"")
        };
        for (state, n) in states {
            if allowed(super::classify::global_key(*f, state)) {
                let _ = writeln!(
                    s,
                    "kite_queue_jobs{{queue=\"\",framework=\"{}\"{db},state=\"{state}\"}} {n}",
                    f.name()
                );
            }
        }
    }
}

/// The whole `/metrics` page; `allowed` says which queue keys the reader may see.
pub async fn render(worker: &Rc<Worker>, allowed: &dyn Fn(&[u8]) -> bool) -> String {
    let snap = gather(worker, false).await;
    let info = crate::commands::server::info_text(
        worker,
        // Not "everything": its queues section would gather the queues a second time.
        &[
            bytes::Bytes::from_static(b"default"),
            bytes::Bytes::from_static(b"commandstats"),
        ],
    )
    .await;
    let loads = thread_loads(worker).await;
    let mut s = String::with_capacity(16 * 1024);
    queue_metrics(&mut s, &snap, allowed);
    let fields = info_fields(&info);
    let get = |name: &str| -> f64 {
        fields
            .iter()
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    head(
        &mut s,
        "kite_queues_tracked",
        "gauge",
        "Queues tracked now.",
    );
    let _ = writeln!(s, "kite_queues_tracked {}", snap.tracked);
    head(
        &mut s,
        "kite_queues_overflow",
        "gauge",
        "Times a queue was not tracked because the table was full.",
    );
    let _ = writeln!(s, "kite_queues_overflow {}", snap.overflow);
    head(&mut s, "kite_up", "gauge", "1 while the server answers.");
    s.push_str("kite_up 1\n");
    let plain: &[(&str, &str, &str, &str)] = &[
        (
            "kite_uptime_seconds",
            "gauge",
            "uptime_in_seconds",
            "Seconds since the server started.",
        ),
        (
            "kite_connected_clients",
            "gauge",
            "connected_clients",
            "Client connections.",
        ),
        (
            "kite_blocked_clients",
            "gauge",
            "blocked_clients",
            "Clients blocked on a key.",
        ),
        (
            "kite_memory_used_bytes",
            "gauge",
            "used_memory",
            "Bytes allocated.",
        ),
        (
            "kite_memory_rss_bytes",
            "gauge",
            "used_memory_rss",
            "Resident set size.",
        ),
        (
            "kite_maxmemory_bytes",
            "gauge",
            "maxmemory",
            "The maxmemory setting (0: none).",
        ),
        (
            "kite_expired_keys_total",
            "counter",
            "expired_keys",
            "Keys removed on expiry.",
        ),
        (
            "kite_evicted_keys_total",
            "counter",
            "evicted_keys",
            "Keys evicted under maxmemory.",
        ),
        (
            "kite_rdb_changes_since_last_save",
            "gauge",
            "rdb_changes_since_last_save",
            "Writes since the last snapshot.",
        ),
        (
            "kite_rdb_last_save_timestamp_seconds",
            "gauge",
            "rdb_last_save_time",
            "Unix time of the last snapshot.",
        ),
        (
            "kite_rdb_bgsave_in_progress",
            "gauge",
            "rdb_bgsave_in_progress",
            "1 while a snapshot is written.",
        ),
        (
            "kite_aof_enabled",
            "gauge",
            "aof_enabled",
            "1 when the append-only file is on.",
        ),
        (
            "kite_connected_replicas",
            "gauge",
            "connected_slaves",
            "Replicas connected.",
        ),
        (
            "kite_replication_offset",
            "gauge",
            "master_repl_offset",
            "The replication offset.",
        ),
    ];
    for (name, kind, field, help) in plain {
        head(&mut s, name, kind, help);
        let _ = writeln!(s, "{name} {}", get(field));
    }
    head(
        &mut s,
        "kite_replication_master",
        "gauge",
        "1 on a master, 0 on a replica.",
    );
    let master = fields
        .iter()
        .any(|(k, v)| *k == "role" && v.trim() == "master");
    let _ = writeln!(s, "kite_replication_master {}", master as u8);
    head(&mut s, "kite_keys", "gauge", "Keys per database.");
    for (k, v) in &fields {
        if let Some(db) = k.strip_prefix("db") {
            if db.parse::<u32>().is_ok() {
                let keys = v
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("keys="))
                    .unwrap_or("0");
                let _ = writeln!(s, "kite_keys{{db=\"{db}\"}} {keys}");
            }
        }
    }
    head(
        &mut s,
        "kite_commands_total",
        "counter",
        "Calls by command.",
    );
    for (k, v) in &fields {
        if let Some(cmd) = k.strip_prefix("cmdstat_") {
            let calls = v
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .unwrap_or("0");
            let _ = writeln!(
                s,
                "kite_commands_total{{cmd=\"{}\"}} {calls}",
                label(cmd.as_bytes())
            );
        }
    }
    head(
        &mut s,
        "kite_command_paths_total",
        "counter",
        "Commands by execution path (docs/architecture.md).",
    );
    for (path, field) in [
        ("inline", "inline_commands"),
        ("one_hop", "one_hop_commands"),
        ("multi_shard", "multi_shard_transactions"),
    ] {
        let _ = writeln!(
            s,
            "kite_command_paths_total{{path=\"{path}\"}} {}",
            get(field)
        );
    }
    head(
        &mut s,
        "kite_errors_total",
        "counter",
        "Error replies by error code.",
    );
    for (k, v) in &fields {
        if let Some(code) = k.strip_prefix("errorstat_") {
            let n = v.strip_prefix("count=").unwrap_or("0");
            let _ = writeln!(
                s,
                "kite_errors_total{{error=\"{}\"}} {n}",
                label(code.as_bytes())
            );
        }
    }
    type PerThread = fn(&ThreadLoad) -> f64;
    let per_thread: [(&str, &str, &str, PerThread); 3] = [
        (
            "kite_thread_cpu_seconds_total",
            "counter",
            "CPU time of each shard's thread.",
            |t| t.cpu_seconds,
        ),
        (
            "kite_thread_ops_per_second",
            "gauge",
            "Commands per second on each thread.",
            |t| t.ops_per_sec as f64,
        ),
        (
            "kite_thread_keys",
            "gauge",
            "Keys held by each thread's shard.",
            |t| t.keys as f64,
        ),
    ];
    for (name, kind, help, get) in per_thread {
        head(&mut s, name, kind, help);
        for t in &loads {
            let _ = writeln!(s, "{name}{{thread=\"{}\"}} {}", t.id, get(t));
        }
    }
    s
}
