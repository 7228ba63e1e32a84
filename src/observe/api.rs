//! The dashboard's JSON: `/api/state` (everything on the main page) and
//! `/api/queue?name=` (one queue's page). Written by hand: a few dozen lines of escaping
//! do not call for a serialisation crate.

use std::fmt::Write;
use std::rc::Rc;

use bytes::Bytes;

use super::prometheus::{info_fields, thread_loads};
use super::report::{gather, newest, Row};
use crate::shard::{broadcast, hop, unix_ms, Worker};
use crate::types::value::Value;

/// A JSON string from bytes (lossy UTF-8).
pub fn string(out: &mut String, v: &[u8]) {
    out.push('"');
    for c in String::from_utf8_lossy(v).chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn opt_f64(out: &mut String, v: Option<f64>) {
    match v {
        Some(v) if v.is_finite() => {
            let _ = write!(out, "{v:.3}");
        }
        _ => out.push_str("null"),
    }
}

fn row_json(out: &mut String, r: &Row, now_ms: u64, history_secs: usize) {
    out.push_str("{\"name\":");
    string(out, &r.name);
    let (push_rate, pop_rate) = r.rates(now_ms);
    let _ = write!(
        out,
        ",\"framework\":\"{}\",\"type\":\"{}\",\"db\":{},\"depth\":{},\"pushed\":{},\"popped\":{},\"consumers\":{},\"push_rate\":{push_rate:.2},\"pop_rate\":{pop_rate:.2},\"oldest_age_ms\":",
        r.framework.name(),
        r.kind,
        r.db,
        r.depth,
        r.pushed,
        r.popped,
        r.consumers
    );
    match r.oldest_age_ms(now_ms) {
        Some(v) => {
            let _ = write!(out, "{v}");
        }
        None => out.push_str("null"),
    }
    out.push_str(",\"wait_p50_ms\":");
    opt_f64(out, r.hist.quantile_ms(0.5));
    out.push_str(",\"wait_p99_ms\":");
    opt_f64(out, r.hist.quantile_ms(0.99));
    out.push_str(",\"jobs\":{");
    for (i, (state, n)) in r.jobs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "\"{state}\":{n}");
    }
    out.push_str("},\"history\":[");
    let skip = r.history.len().saturating_sub(history_secs);
    for (i, s) in r.history.iter().skip(skip).enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "[{},{},{},{}]", s.unix_s, s.depth, s.pushed, s.popped);
    }
    out.push_str("]}");
}

/// Sidekiq's processes: each member of `processes` with its hash's busy, beat and info.
async fn sidekiq_processes(worker: &Rc<Worker>) -> Vec<(Vec<u8>, Vec<(String, Vec<u8>)>)> {
    let key = b"processes".to_vec();
    let target = worker.shared.placement.shard_of(&key);
    let members: Vec<Vec<u8>> = hop(worker, target, move |w| {
        let sh = w.shard.borrow();
        let Some(e) = sh.dbs.first().and_then(|d| d.table.get(&key)) else {
            return Vec::new();
        };
        let mut scratch = [0u8; 20];
        match &e.value {
            Value::Set(s) => s
                .iter()
                .take(64)
                .map(|m| m.bytes(&mut scratch).to_vec())
                .collect(),
            _ => Vec::new(),
        }
    })
    .await;
    let mut out = Vec::new();
    for identity in members {
        let key = identity.clone();
        let target = worker.shared.placement.shard_of(&key);
        let fields = hop(worker, target, move |w| {
            let sh = w.shard.borrow();
            let Some(e) = sh.dbs.first().and_then(|d| d.table.get(&key)) else {
                return Vec::new();
            };
            match &e.value {
                Value::Hash(h) => ["busy", "beat", "quiet", "info"]
                    .iter()
                    .filter_map(|f| h.get(f.as_bytes()).map(|v| (f.to_string(), v.to_vec())))
                    .collect(),
                _ => Vec::new(),
            }
        })
        .await;
        out.push((identity, fields));
    }
    out
}

struct SlowLine {
    id: u64,
    unix_secs: u64,
    usec: u64,
    args: Vec<Vec<u8>>,
    addr: String,
}

/// `/api/state`. `shown` says which keys the reader may see, and whether it may see the
/// clients and the slow log.
pub async fn state(worker: &Rc<Worker>, shown: &crate::net::http::Shown<'_>) -> String {
    let allowed = shown.key;
    let snap = gather(worker, false).await;
    // The default sections: no queue lines (those are filtered below), no commandstats.
    let info = crate::commands::server::info_text(worker, &[Bytes::from_static(b"default")]).await;
    let loads = thread_loads(worker).await;
    let now = unix_ms();
    let per_thread = broadcast(worker, move |w| {
        let clients: Vec<String> = w
            .clients
            .borrow()
            .map
            .values()
            .map(|h| h.line(now))
            .collect();
        let slow: Vec<SlowLine> = w
            .shard
            .borrow()
            .logs
            .slow
            .iter()
            .take(10)
            .map(|e| SlowLine {
                id: e.id,
                unix_secs: e.unix_secs,
                usec: e.usec,
                args: e.args.clone(),
                addr: e.addr.clone(),
            })
            .collect();
        let seconds: Vec<(u32, u32, u64)> =
            w.shard.borrow().second_history.iter().copied().collect();
        (clients, slow, seconds)
    })
    .await;
    let processes = if allowed(b"processes") {
        sidekiq_processes(worker).await
    } else {
        Vec::new()
    };
    let mut out = String::with_capacity(32 * 1024);
    let _ = write!(
        out,
        "{{\"now_ms\":{},\"tracking\":{},\"tracked\":{},\"overflow\":{},\"info\":{{",
        snap.now_ms, snap.enabled, snap.tracked, snap.overflow
    );
    for (i, (k, v)) in info_fields(&info)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("cmdstat_"))
        .enumerate()
    {
        if i > 0 {
            out.push(',');
        }
        string(&mut out, k.as_bytes());
        out.push(':');
        string(&mut out, v.trim().as_bytes());
    }
    out.push_str("},\"queues\":[");
    for (i, r) in snap.rows.iter().filter(|r| allowed(&r.key)).enumerate() {
        if i > 0 {
            out.push(',');
        }
        row_json(&mut out, r, snap.now_ms, 60);
    }
    out.push_str("],\"frameworks\":[");
    for (i, (f, db, states)) in snap.globals.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"framework\":\"{}\",\"db\":{db},\"states\":{{",
            f.name()
        );
        for (j, (state, n)) in states.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let _ = write!(out, "\"{state}\":{n}");
        }
        out.push_str("}}");
    }
    out.push_str("],\"threads\":[");
    for (i, t) in loads.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"id\":{},\"cpu_seconds\":{:.3},\"ops_per_sec\":{},\"keys\":{},\"clients\":{},\"queues\":{}}}",
            t.id, t.cpu_seconds, t.ops_per_sec, t.keys, t.clients, t.queues
        );
    }
    out.push_str("],\"clients\":[");
    let mut first = true;
    let mut slow: Vec<SlowLine> = Vec::new();
    // Commands per second summed over the threads; memory is the process's.
    let mut seconds: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
    for (clients, s, hist) in per_thread {
        for (t, n, mem) in hist {
            let e = seconds.entry(t).or_default();
            e.0 += n as u64;
            e.1 = e.1.max(mem);
        }
        if !shown.clients {
            continue;
        }
        for c in clients {
            if !first {
                out.push(',');
            }
            first = false;
            string(&mut out, c.as_bytes());
        }
        if shown.slowlog {
            slow.extend(s);
        }
    }
    out.push_str("],\"seconds\":[");
    for (i, (t, (n, mem))) in seconds.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "[{t},{n},{mem}]");
    }
    out.push_str("],\"sidekiq_processes\":[");
    for (i, (identity, fields)) in processes
        .iter()
        .filter(|(identity, _)| allowed(identity))
        .enumerate()
    {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"identity\":");
        string(&mut out, identity);
        for (f, v) in fields {
            let _ = write!(out, ",\"{f}\":");
            string(&mut out, v);
        }
        out.push('}');
    }
    out.push_str("],\"slowlog\":[");
    slow.sort_by_key(|e| std::cmp::Reverse((e.unix_secs, e.id)));
    for (i, e) in slow.iter().take(10).enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"id\":{},\"time\":{},\"usec\":{},\"addr\":",
            e.id, e.unix_secs, e.usec
        );
        string(&mut out, e.addr.as_bytes());
        out.push_str(",\"args\":[");
        for (j, a) in e.args.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            string(&mut out, a);
        }
        out.push_str("]}");
    }
    out.push_str("]}");
    out
}

/// `/api/queue?name=`: None when there is no such queue (or the reader may not see it).
pub async fn queue(
    worker: &Rc<Worker>,
    name: &[u8],
    allowed: &dyn Fn(&[u8]) -> bool,
) -> Option<String> {
    let snap = gather(worker, true).await;
    let row = snap
        .rows
        .iter()
        .find(|r| r.name == name && allowed(&r.key))?
        .clone();
    let items = newest(worker, row.db, row.key.clone(), 10, 256).await;
    let mut out = String::with_capacity(16 * 1024);
    out.push_str("{\"queue\":");
    row_json(&mut out, &row, snap.now_ms, super::HISTORY_SECS);
    out.push_str(",\"newest\":[");
    for (i, v) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        string(&mut out, v);
    }
    out.push_str("]}");
    Some(out)
}
