//! Reading the queues: every thread answers for its own shard, the answers are merged into
//! one row per queue, then the framework states are read from their keys' shards.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::rc::Rc;

use bytes::Bytes;

use super::classify::{state_keys, Framework, Role, GLOBAL_STATES};
use super::{Hist, Sample};
use crate::protocol::reply::Reply;
use crate::shard::{broadcast, hop, unix_ms, Shard, Worker};
use crate::types::value::Value;

/// One tracked key as its thread sees it.
struct EntryReport {
    db: usize,
    key: Vec<u8>,
    row: Vec<u8>,
    framework: Framework,
    role: Role,
    kind: &'static str,
    depth: u64,
    pushed: u64,
    popped: u64,
    pushed_front: u64,
    consumers: u64,
    oldest_ms: Option<u64>,
    hist: Hist,
    history: Vec<Sample>,
}

/// One queue, merged over its keys and threads.
#[derive(Clone, Debug)]
pub struct Row {
    pub db: usize,
    pub name: Vec<u8>,
    pub framework: Framework,
    pub kind: &'static str,
    /// The key its jobs wait in (the first of them when there are several).
    pub key: Vec<u8>,
    pub depth: u64,
    pub pushed: u64,
    pub popped: u64,
    pub pushed_front: u64,
    pub consumers: u64,
    pub oldest_ms: Option<u64>,
    pub hist: Hist,
    pub history: Vec<Sample>,
    pub jobs: Vec<(&'static str, u64)>,
}

impl Row {
    pub fn oldest_age_ms(&self, now_ms: u64) -> Option<u64> {
        if self.depth == 0 {
            return None;
        }
        self.oldest_ms.map(|t| now_ms.saturating_sub(t))
    }

    /// Pushes and pops per second over the last 10 s of history.
    pub fn rates(&self, now_ms: u64) -> (f64, f64) {
        let since = (now_ms / 1000).saturating_sub(10) as u32;
        let (mut pushed, mut popped) = (0u64, 0u64);
        for s in self.history.iter().filter(|s| s.unix_s > since) {
            pushed += s.pushed as u64;
            popped += s.popped as u64;
        }
        (pushed as f64 / 10.0, popped as f64 / 10.0)
    }
}

/// A framework's framework-wide states in one database: (framework, db, [(state, count)]).
pub type GlobalStates = (Framework, usize, Vec<(&'static str, u64)>);

/// Everything the readers show.
pub struct Snapshot {
    pub enabled: bool,
    pub tracked: usize,
    pub overflow: u64,
    pub now_ms: u64,
    pub rows: Vec<Row>,
    /// Framework-wide states.
    pub globals: Vec<GlobalStates>,
}

/// The length of whatever `key` holds in a shard's databases, and its type (TYPE's
/// name); None when missing.
pub fn key_len(
    dbs: &[crate::shard::Db],
    db: usize,
    key: &[u8],
    now_ms: u64,
) -> Option<(u64, &'static str)> {
    let e = dbs.get(db)?.table.get(key)?;
    if e.is_expired(now_ms) {
        return None;
    }
    let n = match &e.value {
        Value::List(l) => l.len() as u64,
        Value::ZSet(z) => z.len() as u64,
        Value::Set(s) => s.len() as u64,
        Value::Hash(h) => h.len() as u64,
        Value::Stream(s) => s.log.len(),
        Value::Str(_) => 1,
    };
    Some((n, e.value.type_name()))
}

fn oldest_push_ms(sh: &Shard, db: usize, key: &[u8]) -> Option<u64> {
    match &sh.dbs.get(db)?.table.get(key)?.value {
        Value::List(l) => l.oldest_push_ms(),
        Value::Stream(s) => s.log.first_entry_id().map(|id| id.ms),
        _ => None,
    }
}

fn shard_entries(w: &Rc<Worker>, with_history: bool) -> (Vec<EntryReport>, usize, u64, bool) {
    let sh = w.shard.borrow();
    let now = unix_ms();
    let q = &sh.queues;
    let live = sh.blocking.live_counts();
    let entries = q
        .entries()
        .map(|(db, key, e)| {
            let (depth, kind) = key_len(&sh.dbs, db, key, now).unwrap_or((0, "list"));
            EntryReport {
                db,
                key: key.to_vec(),
                row: key[..e.row_len.min(key.len())].to_vec(),
                framework: e.framework,
                role: e.role,
                kind,
                depth,
                pushed: e.pushed,
                popped: e.popped,
                pushed_front: e.pushed_front,
                consumers: live.on_key(db, key) as u64,
                oldest_ms: oldest_push_ms(&sh, db, key),
                hist: e.hist.clone(),
                history: if with_history {
                    e.history.iter().copied().collect()
                } else {
                    // The last 10 s give the rates.
                    e.history.iter().rev().take(11).rev().copied().collect()
                },
            }
        })
        .collect();
    (entries, q.len(), q.overflow, q.enabled)
}

fn merge_history(into: &mut Vec<Sample>, from: &[Sample]) {
    if into.is_empty() {
        into.extend_from_slice(from);
        return;
    }
    let mut by_second: BTreeMap<u32, Sample> = into.iter().map(|s| (s.unix_s, *s)).collect();
    for s in from {
        let e = by_second.entry(s.unix_s).or_insert(Sample {
            unix_s: s.unix_s,
            ..Default::default()
        });
        e.depth = e.depth.saturating_add(s.depth);
        e.pushed = e.pushed.saturating_add(s.pushed);
        e.popped = e.popped.saturating_add(s.popped);
    }
    *into = by_second.into_values().collect();
}

/// Gathers and merges every thread's queues, then reads the framework states.
pub async fn gather(worker: &Rc<Worker>, with_history: bool) -> Snapshot {
    let answers = broadcast(worker, move |w| shard_entries(w, with_history)).await;
    let now_ms = unix_ms();
    let mut enabled = true;
    let (mut tracked, mut overflow) = (0, 0);
    let mut rows: BTreeMap<(Vec<u8>, usize), Row> = BTreeMap::new();
    for (entries, n, o, on) in answers {
        tracked += n;
        overflow += o;
        enabled &= on;
        for e in entries {
            let row = rows.entry((e.row.clone(), e.db)).or_insert_with(|| Row {
                db: e.db,
                name: e.row.clone(),
                framework: Framework::None,
                kind: e.kind,
                key: Vec::new(),
                depth: 0,
                pushed: 0,
                popped: 0,
                pushed_front: 0,
                consumers: 0,
                oldest_ms: None,
                hist: Hist::default(),
                history: Vec::new(),
                jobs: Vec::new(),
            });
            // The most telling framework wins (a Celery priority list names its queue's
            // framework; BullMQ's own keys tell it from Bull).
            row.framework = row.framework.max(e.framework);
            row.consumers += e.consumers;
            if e.role != Role::Waiting {
                continue;
            }
            if row.key.is_empty() || e.key < row.key {
                row.key = e.key.clone();
                row.kind = e.kind;
            }
            row.depth += e.depth;
            row.pushed += e.pushed;
            row.popped += e.popped;
            row.pushed_front += e.pushed_front;
            if e.depth > 0 {
                row.oldest_ms = match (row.oldest_ms, e.oldest_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            row.hist.merge(&e.hist);
            merge_history(&mut row.history, &e.history);
        }
    }
    let mut rows: Vec<Row> = rows.into_values().filter(|r| !r.key.is_empty()).collect();
    rows.sort_by(|a, b| (&a.name, a.db).cmp(&(&b.name, b.db)));
    // Framework states: the lengths of their keys, wherever those live.
    let mut wanted: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut per_row: Vec<Vec<(&'static str, Vec<u8>)>> = Vec::with_capacity(rows.len());
    for r in &rows {
        let keys = match r.framework {
            // The waiting state is the depth already read.
            Framework::Sidekiq | Framework::Celery => Vec::new(),
            f => state_keys(f, &r.name),
        };
        wanted.extend(keys.iter().map(|(_, k)| (r.db, k.clone())));
        per_row.push(keys);
    }
    let mut global_dbs: Vec<(Framework, usize)> = rows
        .iter()
        .filter(|r| matches!(r.framework, Framework::Sidekiq | Framework::Celery))
        .map(|r| (r.framework, r.db))
        .collect();
    global_dbs.sort();
    global_dbs.dedup();
    for &(f, db) in &global_dbs {
        for (gf, _, key) in GLOBAL_STATES {
            if *gf == f {
                wanted.push((db, key.to_vec()));
            }
        }
    }
    let lens = key_lengths(worker, wanted).await;
    for (r, keys) in rows.iter_mut().zip(per_row) {
        r.jobs = match r.framework {
            Framework::None => Vec::new(),
            Framework::Sidekiq | Framework::Celery => vec![("waiting", r.depth)],
            _ => keys
                .into_iter()
                .map(|(state, k)| (state, lens.get(&(r.db, k)).copied().unwrap_or(0)))
                .collect(),
        };
    }
    let globals = global_dbs
        .into_iter()
        .map(|(f, db)| {
            let states = GLOBAL_STATES
                .iter()
                .filter(|(gf, _, _)| *gf == f)
                .map(|(_, state, key)| {
                    (*state, lens.get(&(db, key.to_vec())).copied().unwrap_or(0))
                })
                .collect();
            (f, db, states)
        })
        .collect();
    Snapshot {
        enabled,
        // Queues, not keys: a queue may span several tracked keys (Celery's priority
        // lists, BullMQ's marker).
        tracked: rows.len().min(tracked),
        overflow,
        now_ms,
        rows,
        globals,
    }
}

/// The lengths of `keys`, each read on its own shard (only the owner holds it, so the
/// other shards answer nothing for it).
async fn key_lengths(
    worker: &Rc<Worker>,
    keys: Vec<(usize, Vec<u8>)>,
) -> std::collections::HashMap<(usize, Vec<u8>), u64> {
    let mut out = std::collections::HashMap::new();
    if keys.is_empty() {
        return out;
    }
    let keys = std::sync::Arc::new(keys);
    let shared_keys = keys.clone();
    let answers = broadcast(worker, move |w| {
        let sh = w.shard.borrow();
        let now = unix_ms();
        shared_keys
            .iter()
            .map(|(db, k)| key_len(&sh.dbs, *db, k, now).map_or(0, |(n, _)| n))
            .collect::<Vec<u64>>()
    })
    .await;
    for a in answers {
        for (i, n) in a.into_iter().enumerate() {
            *out.entry(keys[i].clone()).or_insert(0) += n;
        }
    }
    out
}

/// Up to `n` elements at the end of `key` where the newest are, each cut to `cut`
/// bytes: what the dashboard's page for a queue shows.
pub async fn newest(
    worker: &Rc<Worker>,
    db: usize,
    key: Vec<u8>,
    n: usize,
    cut: usize,
) -> Vec<Vec<u8>> {
    let target = worker.shared.placement.shard_of(&key);
    hop(worker, target, move |w| {
        let sh = w.shard.borrow();
        let Some(e) = sh.dbs.get(db).and_then(|d| d.table.get(&key)) else {
            return Vec::new();
        };
        let trim = |v: &[u8]| v[..v.len().min(cut)].to_vec();
        match &e.value {
            Value::List(l) if l.newest_at_front() => l.iter().take(n).map(trim).collect(),
            Value::List(l) => l.iter().rev().take(n).map(trim).collect(),
            Value::Stream(s) => s
                .log
                .range_rev(
                    crate::types::stream::StreamId::MIN,
                    crate::types::stream::StreamId::MAX,
                )
                .take(n)
                .map(|e| {
                    let mut line = format!("{}-{}", e.id.ms, e.id.seq).into_bytes();
                    for (f, v) in e.pairs() {
                        line.push(b' ');
                        line.extend_from_slice(f);
                        line.push(b'=');
                        line.extend_from_slice(v);
                    }
                    trim(&line)
                })
                .collect(),
            Value::ZSet(z) => {
                let mut out = Vec::new();
                z.visit(0, true, |m, score| {
                    let mut v = trim(m);
                    v.extend_from_slice(format!(" ({score})").as_bytes());
                    out.push(v);
                    out.len() < n
                });
                out
            }
            _ => Vec::new(),
        }
    })
    .await
}

/// Writes a name for INFO: bytes outside printable ASCII and `,` `=` `%` as `%XX`.
pub fn info_name(name: &[u8]) -> String {
    let mut s = String::with_capacity(name.len());
    for &b in name {
        if (0x21..0x7f).contains(&b) && !matches!(b, b',' | b'=' | b'%') {
            s.push(b as char);
        } else {
            let _ = write!(s, "%{b:02X}");
        }
    }
    s
}

fn fmt_opt_ms(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{v:.1}"),
        None => "-1".into(),
    }
}

/// `INFO queues`.
pub async fn info_section(worker: &Rc<Worker>) -> String {
    let snap = gather(worker, false).await;
    let mut s = format!(
        "# Queues\r\nqueue_tracking:{}\r\nqueues_tracked:{}\r\nqueues_overflow:{}\r\n",
        snap.enabled as u8, snap.tracked, snap.overflow
    );
    for (i, r) in snap.rows.iter().enumerate() {
        let _ = write!(
            s,
            "queue{i}:name={},framework={},type={},db={},depth={},pushed={},popped={},consumers={},oldest_age_ms={},wait_p50_ms={},wait_p99_ms={}",
            info_name(&r.name),
            r.framework.name(),
            r.kind,
            r.db,
            r.depth,
            r.pushed,
            r.popped,
            r.consumers,
            r.oldest_age_ms(snap.now_ms).map_or(-1, |v| v as i64),
            fmt_opt_ms(r.hist.quantile_ms(0.5)),
            fmt_opt_ms(r.hist.quantile_ms(0.99)),
        );
        for (state, n) in &r.jobs {
            let _ = write!(s, ",jobs_{}={n}", state.replace('-', "_"));
        }
        s.push_str("\r\n");
    }
    for (f, db, states) in &snap.globals {
        let _ = write!(s, "framework_{}:db={db}", f.name().replace('-', "_"));
        for (state, n) in states {
            let _ = write!(s, ",{state}={n}");
        }
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s
}

/// One queue as KITE QUEUES shows it.
pub fn write_row(out: &mut Reply, r: &Row, now_ms: u64, detail: Option<&[Vec<u8>]>) {
    let fields = 14 + if detail.is_some() { 2 } else { 0 };
    out.map(fields);
    out.bulk(b"name");
    out.bulk(&r.name);
    out.bulk(b"framework");
    out.bulk(r.framework.name().as_bytes());
    out.bulk(b"type");
    out.bulk(r.kind.as_bytes());
    out.bulk(b"db");
    out.int(r.db as i64);
    for (name, v) in [
        ("depth", r.depth),
        ("pushed", r.pushed),
        ("popped", r.popped),
        ("consumers", r.consumers),
    ] {
        out.bulk(name.as_bytes());
        out.int(v as i64);
    }
    let (push_rate, pop_rate) = r.rates(now_ms);
    out.bulk(b"push_rate");
    out.double(push_rate);
    out.bulk(b"pop_rate");
    out.double(pop_rate);
    out.bulk(b"oldest_age_ms");
    match r.oldest_age_ms(now_ms) {
        Some(v) => out.int(v as i64),
        None => out.null(),
    }
    for (name, q) in [("wait_p50_ms", 0.5), ("wait_p99_ms", 0.99)] {
        out.bulk(name.as_bytes());
        match r.hist.quantile_ms(q) {
            Some(v) => out.double(v),
            None => out.null(),
        }
    }
    out.bulk(b"jobs");
    out.map(r.jobs.len());
    for (state, n) in &r.jobs {
        out.bulk(state.as_bytes());
        out.int(*n as i64);
    }
    if let Some(newest) = detail {
        out.bulk(b"history");
        out.array(r.history.len());
        for s in &r.history {
            out.array(4);
            out.int(s.unix_s as i64);
            out.int(s.depth as i64);
            out.int(s.pushed as i64);
            out.int(s.popped as i64);
        }
        out.bulk(b"newest");
        out.array(newest.len());
        for v in newest {
            out.bulk(v);
        }
    }
}

pub const KITE_HELP: &[&str] = &[
    "KITE <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "QUEUES [<pattern>]",
    "    One map per queue (docs/observe.md): depth, pushes, pops, rates, consumers,",
    "    oldest age, wait-time quantiles, and jobs by state for a framework's layout.",
    "QUEUE <name>",
    "    One queue with its history (the last 300 s) and its newest elements.",
    "HELP",
    "    Prints this help.",
];

pub const KITE_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("help", 2, "loading stale"),
    ("queue", 3, "admin loading stale"),
    ("queues", -2, "admin loading stale"),
];

/// The row named `name` (any database) from a snapshot.
pub fn find_row<'a>(snap: &'a Snapshot, name: &[u8]) -> Option<&'a Row> {
    snap.rows.iter().find(|r| r.name == name)
}

/// Args of KITE QUEUES: the optional pattern.
pub fn matches_pattern(pattern: Option<&Bytes>, name: &[u8]) -> bool {
    pattern.is_none_or(|p| crate::commands::util::glob_match(p, name, false))
}
