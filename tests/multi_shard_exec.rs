//! MULTI/EXEC transactions whose keys live on several shards ("multi-shard
//! transactions"), checked against what Redis 7.2 does for every transaction, not
//! against how Kite runs them:
//!
//! - replies come back in queue order, commands for the shards interleaved, a run-time
//!   error (not an integer, WRONGTYPE) sits at its index and every other command, on
//!   every shard, still runs; a queue-time error discards the whole transaction;
//! - the effects survive a restart from the append-only file (several transactions over
//!   the same keys in different orders, plain commands from another connection between
//!   them, then concurrent writers), and the incr files hold whole MULTI ... EXEC blocks;
//! - a replica ends with the master's data;
//! - keyspace notifications arrive in the order of the queued commands;
//! - a client blocked in BRPOP gets a job pushed inside a transaction exactly once, after
//!   EXEC, and LLEN inside the transaction still sees it;
//! - a Sidekiq-shaped load (MULTI; SADD queues q; LPUSH queue:q job; EXEC from 16
//!   clients) with readers inside transactions, and with a BRPOP consumer pool;
//! - reads inside a transaction see both increments of another transaction or neither;
//! - WATCH over keys on several shards;
//! - transactions on one shard, with keyless commands (PING, ECHO, DBSIZE), and empty.
//!
//! Keys are picked with `common::shard_of` so that each transaction really spans shards
//! (`--threads 2` and `--threads 4`), with the commands for the shards interleaved in
//! the queue. Every loop is bounded by a count or a deadline; nothing asserts on elapsed
//! time. Written from redis.io/docs/latest/develop/interactions/transactions and Redis
//! 7.2's behaviour, so it can run against the reference too:
//!
//!     KITE_BIN=$(which redis-server) cargo test --release --test multi_shard_exec

mod common;

use common::blocked::{read_reply, wait_blocked};
use common::*;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fs;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The `--threads` each test runs at.
const THREADS: [usize; 2] = [2, 4];

/// The longest any wait for a replica lasts.
const SYNC_WAIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Helpers: keys on chosen shards, commands, transactions
// ---------------------------------------------------------------------------

/// The first key `<prefix><i>` that lives on `shard` of a `threads`-thread Kite.
fn key_on(prefix: &str, shard: usize, threads: usize) -> String {
    keys_on(prefix, shard, threads, 1).remove(0)
}

/// The first `n` keys `<prefix><i>` that live on `shard`.
fn keys_on(prefix: &str, shard: usize, threads: usize, n: usize) -> Vec<String> {
    assert!(shard < threads, "shard {shard} of {threads}");
    let out: Vec<String> = (0..100_000)
        .map(|i| format!("{prefix}{i}"))
        .filter(|k| shard_of(k, threads) == shard)
        .take(n)
        .collect();
    assert_eq!(out.len(), n, "no {n} keys {prefix}* on shard {shard}");
    out
}

/// A command from string slices.
fn cmd(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// An array of bulk strings.
fn bulks(items: &[&str]) -> Resp {
    Resp::Array(items.iter().map(Resp::bulk).collect())
}

/// A transaction's commands, one per line, for messages.
fn show_tx(cmds: &[Vec<String>]) -> String {
    cmds.iter()
        .map(|c| format!("  {}", fmt_cmd(c)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs MULTI, `cmds`, EXEC: in one write when `pipelined`, else one command at a time
/// (each reply read before the next is sent). Asserts MULTI's +OK and every +QUEUED;
/// returns EXEC's reply.
#[track_caller]
fn transaction(c: &mut Client, cmds: &[Vec<String>], pipelined: bool) -> Resp {
    let mut all = vec![cmd(&["MULTI"])];
    all.extend(cmds.iter().cloned());
    all.push(cmd(&["EXEC"]));
    let replies: Vec<Resp> = if pipelined {
        c.pipeline(&all)
    } else {
        all.iter().map(|a| c.cmd(a)).collect()
    };
    assert_eq!(replies[0], Resp::ok(), "MULTI");
    for (r, a) in replies[1..=cmds.len()].iter().zip(cmds) {
        assert_eq!(
            *r,
            Resp::simple("QUEUED"),
            "queueing `{}` in\n{}",
            fmt_cmd(a),
            show_tx(cmds)
        );
    }
    replies[cmds.len() + 1].clone()
}

/// The items of an EXEC reply that must be an array.
#[track_caller]
fn exec_items(r: &Resp, what: &str) -> Vec<Resp> {
    match r {
        Resp::Array(v) => v.clone(),
        other => panic!("{what}: EXEC answered {other}, not an array"),
    }
}

/// A string reply as a counter: a missing key (nil) counts 0.
#[track_caller]
fn counter(r: &Resp, what: &str) -> i64 {
    if r.is_null() {
        return 0;
    }
    r.parse_int()
        .unwrap_or_else(|| panic!("{what}: expected an integer string or nil, got {r}"))
}

/// The strings of an array reply.
#[track_caller]
fn strings(r: &Resp) -> Vec<String> {
    r.as_array()
        .unwrap_or_else(|| panic!("expected an array, got {r}"))
        .iter()
        .map(|x| {
            x.as_string()
                .unwrap_or_else(|| panic!("expected strings in the array, got {x} in {r}"))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Helpers: whole datasets, a model of the data, a random workload
// ---------------------------------------------------------------------------

fn describe_string(v: &str) -> String {
    format!("string {v:?}")
}

fn describe_list(items: &[String]) -> String {
    format!("list {items:?}")
}

fn describe_set(mut members: Vec<String>) -> String {
    members.sort();
    format!("set {members:?}")
}

fn with_ttl(desc: String, has_ttl: bool) -> String {
    if has_ttl {
        desc + " (with a ttl)"
    } else {
        desc
    }
}

/// Every key of database 0 with its type, contents (lists in order, sets sorted) and
/// whether it has a time to live. Only for a server nobody writes to meanwhile.
fn dump(c: &mut Client) -> BTreeMap<String, String> {
    let keys = strings(&c.cmd(&["KEYS", "*"]));
    let mut out = BTreeMap::new();
    for k in keys {
        let ty = c.cmd(&["TYPE", &k]);
        let ty = ty
            .as_string()
            .unwrap_or_else(|| panic!("TYPE {k} answered {ty}"));
        let desc = match ty.as_str() {
            "string" => {
                let v = c.cmd(&["GET", &k]);
                describe_string(
                    &v.as_string()
                        .unwrap_or_else(|| panic!("GET {k} answered {v}")),
                )
            }
            "list" => describe_list(&strings(&c.cmd(&["LRANGE", &k, "0", "-1"]))),
            "set" => describe_set(strings(&c.cmd(&["SMEMBERS", &k]))),
            "hash" => {
                let flat = strings(&c.cmd(&["HGETALL", &k]));
                let mut pairs: Vec<String> = flat
                    .chunks(2)
                    .map(|p| format!("{}={}", p[0], p[1]))
                    .collect();
                pairs.sort();
                format!("hash {pairs:?}")
            }
            "zset" => format!(
                "zset {:?}",
                strings(&c.cmd(&["ZRANGE", &k, "0", "-1", "WITHSCORES"]))
            ),
            other => format!("{other} (contents not compared)"),
        };
        let ttl = c.cmd(&["TTL", &k]);
        let ttl = ttl
            .as_int()
            .unwrap_or_else(|| panic!("TTL {k} answered {ttl}"));
        out.insert(k, with_ttl(desc, ttl > 0));
    }
    out
}

/// Panics with the keys that differ when two dumps are not the same.
#[track_caller]
fn assert_same_data(
    expected: &BTreeMap<String, String>,
    actual: &BTreeMap<String, String>,
    what: &str,
) {
    if expected == actual {
        return;
    }
    let short = |s: &str| -> String {
        if s.len() > 400 {
            format!("{}... ({} bytes)", &s[..400], s.len())
        } else {
            s.to_string()
        }
    };
    let mut diff = Vec::new();
    for (k, v) in expected {
        match actual.get(k) {
            None => diff.push(format!("{k}: missing; expected {}", short(v))),
            Some(a) if a != v => diff.push(format!("{k}: {}\n    expected {}", short(a), short(v))),
            _ => {}
        }
    }
    for (k, a) in actual {
        if !expected.contains_key(k) {
            diff.push(format!("{k}: {}; expected no such key", short(a)));
        }
    }
    panic!(
        "{what}: {} of {} expected keys differ ({} keys there):\n{}",
        diff.len(),
        expected.len(),
        actual.len(),
        diff.join("\n")
    );
}

#[derive(Clone, Debug, PartialEq)]
enum Val {
    Str(String),
    List(VecDeque<String>),
    Set(BTreeSet<String>),
}

/// What Redis holds after a sequence of commands (the few the workload sends), and the
/// reply each one gets.
#[derive(Default)]
struct Model {
    data: BTreeMap<String, Val>,
    ttl: BTreeSet<String>,
}

impl Model {
    fn remove(&mut self, k: &str) -> bool {
        self.ttl.remove(k);
        self.data.remove(k).is_some()
    }

    /// Applies one command; returns Redis's RESP2 reply to it.
    fn apply(&mut self, c: &[String]) -> Resp {
        let k = c[1].clone();
        match c[0].as_str() {
            "SET" => {
                // A plain SET drops the old time to live.
                self.ttl.remove(&k);
                self.data.insert(k, Val::Str(c[2].clone()));
                Resp::ok()
            }
            "INCR" | "INCRBY" => {
                let by: i64 = if c[0] == "INCR" {
                    1
                } else {
                    c[2].parse().unwrap()
                };
                let cur = match self.data.get(&k) {
                    Some(Val::Str(s)) => s.parse::<i64>().expect("model: an integer string"),
                    None => 0,
                    Some(v) => panic!("model: INCR on {k} holding {v:?}"),
                };
                // INCR keeps the time to live.
                self.data.insert(k, Val::Str((cur + by).to_string()));
                Resp::Integer(cur + by)
            }
            "GET" => match self.data.get(&k) {
                Some(Val::Str(s)) => Resp::bulk(s),
                None => Resp::NullBulk,
                Some(v) => panic!("model: GET on {k} holding {v:?}"),
            },
            "DEL" => {
                let mut n = 0;
                for key in &c[1..] {
                    if self.remove(key.as_str()) {
                        n += 1;
                    }
                }
                Resp::Integer(n)
            }
            "EXPIRE" => {
                if self.data.contains_key(&k) {
                    self.ttl.insert(k);
                    Resp::Integer(1)
                } else {
                    Resp::Integer(0)
                }
            }
            "LPUSH" | "RPUSH" => {
                let front = c[0] == "LPUSH";
                let entry = self
                    .data
                    .entry(k.clone())
                    .or_insert_with(|| Val::List(VecDeque::new()));
                match entry {
                    Val::List(l) => {
                        for v in &c[2..] {
                            if front {
                                l.push_front(v.clone());
                            } else {
                                l.push_back(v.clone());
                            }
                        }
                        Resp::Integer(l.len() as i64)
                    }
                    other => panic!("model: push on {k} holding {other:?}"),
                }
            }
            "RPOP" => {
                let (popped, emptied) = match self.data.get_mut(&k) {
                    Some(Val::List(l)) => {
                        let p = l.pop_back();
                        (p, l.is_empty())
                    }
                    None => (None, false),
                    Some(v) => panic!("model: RPOP on {k} holding {v:?}"),
                };
                if emptied {
                    self.remove(&k);
                }
                match popped {
                    Some(v) => Resp::bulk(v),
                    None => Resp::NullBulk,
                }
            }
            "LLEN" => match self.data.get(&k) {
                Some(Val::List(l)) => Resp::Integer(l.len() as i64),
                None => Resp::Integer(0),
                Some(v) => panic!("model: LLEN on {k} holding {v:?}"),
            },
            "LRANGE" => match self.data.get(&k) {
                Some(Val::List(l)) => Resp::Array(l.iter().map(Resp::bulk).collect()),
                None => Resp::Array(vec![]),
                Some(v) => panic!("model: LRANGE on {k} holding {v:?}"),
            },
            "SADD" => {
                let entry = self
                    .data
                    .entry(k.clone())
                    .or_insert_with(|| Val::Set(BTreeSet::new()));
                match entry {
                    Val::Set(s) => {
                        let added = c[2..].iter().filter(|m| s.insert(m.to_string())).count();
                        Resp::Integer(added as i64)
                    }
                    other => panic!("model: SADD on {k} holding {other:?}"),
                }
            }
            "SREM" => {
                let (removed, emptied) = match self.data.get_mut(&k) {
                    Some(Val::Set(s)) => {
                        let n = c[2..].iter().filter(|m| s.remove(m.as_str())).count();
                        (n, s.is_empty())
                    }
                    None => (0, false),
                    Some(v) => panic!("model: SREM on {k} holding {v:?}"),
                };
                if emptied {
                    self.remove(&k);
                }
                Resp::Integer(removed as i64)
            }
            "SCARD" => match self.data.get(&k) {
                Some(Val::Set(s)) => Resp::Integer(s.len() as i64),
                None => Resp::Integer(0),
                Some(v) => panic!("model: SCARD on {k} holding {v:?}"),
            },
            "SISMEMBER" => match self.data.get(&k) {
                Some(Val::Set(s)) => Resp::Integer(s.contains(&c[2]) as i64),
                None => Resp::Integer(0),
                Some(v) => panic!("model: SISMEMBER on {k} holding {v:?}"),
            },
            other => panic!("model: no rule for {other}"),
        }
    }

    /// The data as [`dump`] shows it.
    fn dump(&self) -> BTreeMap<String, String> {
        self.data
            .iter()
            .map(|(k, v)| {
                let desc = match v {
                    Val::Str(s) => describe_string(s),
                    Val::List(l) => describe_list(&l.iter().cloned().collect::<Vec<_>>()),
                    Val::Set(s) => describe_set(s.iter().cloned().collect()),
                };
                (k.clone(), with_ttl(desc, self.ttl.contains(k)))
            })
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    List,
    Set,
}

#[derive(Clone, Debug)]
struct PoolKey {
    name: String,
    kind: Kind,
    shard: usize,
}

/// Random transactions over a small pool of keys: a string (always an integer), a list
/// and a set on every shard. Each key keeps its type, so nothing answers WRONGTYPE and
/// [`Model`] knows every reply. A transaction's commands go to the shards in turn
/// (shard s, s+1, s+2, ...), so it always spans at least two.
struct Workload {
    pool: Vec<PoolKey>,
    threads: usize,
    rng: Rng,
    serial: u64,
}

impl Workload {
    fn new(prefix: &str, threads: usize, seed: u64) -> Workload {
        let mut pool = Vec::new();
        for shard in 0..threads {
            for (kind, tag) in [(Kind::Str, "str"), (Kind::List, "list"), (Kind::Set, "set")] {
                pool.push(PoolKey {
                    name: key_on(&format!("{prefix}:{tag}:"), shard, threads),
                    kind,
                    shard,
                });
            }
        }
        Workload {
            pool,
            threads,
            rng: Rng::new(seed),
            serial: 0,
        }
    }

    /// The same keys, another random sequence (list values numbered from `serial`).
    fn fork(&self, seed: u64, serial: u64) -> Workload {
        Workload {
            pool: self.pool.clone(),
            threads: self.threads,
            rng: Rng::new(seed),
            serial,
        }
    }

    fn key_on_shard(&mut self, shard: usize) -> PoolKey {
        let on: Vec<&PoolKey> = self.pool.iter().filter(|k| k.shard == shard).collect();
        on[self.rng.index(on.len())].clone()
    }

    fn random_cmd(&mut self, k: &PoolKey) -> Vec<String> {
        self.serial += 1;
        let v = format!("v{}", self.serial);
        let n = k.name.clone();
        let roll = self.rng.below(100);
        if roll < 6 {
            return vec!["DEL".into(), n];
        }
        if roll < 11 {
            // Long enough never to expire during a test.
            return vec!["EXPIRE".into(), n, "100000".into()];
        }
        if roll < 15 {
            // One command over two shards inside the transaction.
            let shard = (k.shard + 1 + self.rng.index(self.threads - 1)) % self.threads;
            let other = self.key_on_shard(shard);
            return vec!["DEL".into(), n, other.name];
        }
        match k.kind {
            Kind::Str => match self.rng.below(5) {
                0 | 1 => vec!["SET".into(), n, self.rng.range(-50, 50).to_string()],
                2 => vec!["INCR".into(), n],
                3 => vec!["INCRBY".into(), n, self.rng.range(-5, 5).to_string()],
                _ => vec!["GET".into(), n],
            },
            Kind::List => match self.rng.below(6) {
                0 | 1 => vec!["LPUSH".into(), n, v],
                2 => vec!["RPUSH".into(), n, format!("{v}a"), format!("{v}b")],
                3 => vec!["RPOP".into(), n],
                4 => vec!["LLEN".into(), n],
                _ => vec!["LRANGE".into(), n, "0".into(), "-1".into()],
            },
            Kind::Set => match self.rng.below(5) {
                0 | 1 => vec!["SADD".into(), n, format!("m{}", self.rng.below(6))],
                2 => vec!["SREM".into(), n, format!("m{}", self.rng.below(6))],
                3 => vec!["SCARD".into(), n],
                _ => vec!["SISMEMBER".into(), n, format!("m{}", self.rng.below(6))],
            },
        }
    }

    /// 2 to 7 commands, going round the shards from a random one.
    fn random_tx(&mut self) -> Vec<Vec<String>> {
        let len = self.rng.range(2, 7) as usize;
        let start = self.rng.index(self.threads);
        let mut out = Vec::with_capacity(len);
        for i in 0..len {
            let k = self.key_on_shard((start + i) % self.threads);
            out.push(self.random_cmd(&k));
        }
        out
    }

    /// One command on any key of the pool.
    fn random_plain(&mut self) -> Vec<String> {
        let i = self.rng.index(self.pool.len());
        let k = self.pool[i].clone();
        self.random_cmd(&k)
    }

    /// `count` transactions on `tx` (every other one pipelined), each followed by up to
    /// two plain commands on `plain`, one at a time; every reply checked with `model`.
    fn run_sequential(
        &mut self,
        tx: &mut Client,
        plain: &mut Client,
        model: &mut Model,
        count: usize,
        what: &str,
    ) {
        for n in 0..count {
            let cmds = self.random_tx();
            let expected: Vec<Resp> = cmds.iter().map(|c| model.apply(c)).collect();
            let got = transaction(tx, &cmds, n % 2 == 0);
            assert_eq!(
                got,
                Resp::Array(expected),
                "{what}: transaction #{n}:\n{}",
                show_tx(&cmds)
            );
            for _ in 0..self.rng.below(3) {
                let c = self.random_plain();
                let expected = model.apply(&c);
                let got = plain.cmd(&c);
                assert_eq!(
                    got,
                    expected,
                    "{what}: plain `{}` after transaction #{n}",
                    fmt_cmd(&c)
                );
            }
        }
    }
}

/// `writers` connections each run `txs` random transactions over `w`'s keys at once;
/// every EXEC must answer one non-error reply per queued command.
fn concurrent_random_txs(
    server: &ServerProcess,
    w: &Workload,
    writers: usize,
    txs: usize,
    seed: u64,
    what: &str,
) {
    thread::scope(|s| {
        for t in 0..writers {
            let mut w = w.fork(seed + t as u64, (t as u64 + 1) * 10_000_000);
            s.spawn(move || {
                let mut c = server.client();
                for n in 0..txs {
                    let cmds = w.random_tx();
                    let r = transaction(&mut c, &cmds, n % 2 == 0);
                    let items = exec_items(&r, what);
                    assert_eq!(
                        items.len(),
                        cmds.len(),
                        "{what}: writer {t}, EXEC answered {r} to\n{}",
                        show_tx(&cmds)
                    );
                    for (reply, sent) in items.iter().zip(&cmds) {
                        assert!(
                            !reply.is_error(),
                            "{what}: writer {t}: `{}` in a transaction answered {reply}",
                            fmt_cmd(sent)
                        );
                    }
                }
            });
        }
    });
}

// ---------------------------------------------------------------------------
// Helpers: data directories and the append-only file
// ---------------------------------------------------------------------------

static DIR_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory under the system temp dir, removed with its contents on drop.
struct DataDir(PathBuf);

impl DataDir {
    fn new(tag: &str) -> DataDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "kite-mse-{tag}-{}-{}-{nanos}",
            std::process::id(),
            DIR_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        DataDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn arg(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|c| c.is_file())
}

/// Reads one RESP incr file to its very end: only whole commands (arrays of bulk
/// strings, `#` annotation lines skipped), every MULTI closed by an EXEC before the
/// next MULTI, none left open at the end. Returns the number of MULTI ... EXEC blocks.
fn check_incr_file(bytes: &[u8], what: &str) -> usize {
    let mut cur = Cursor::new(bytes);
    let mut in_multi = false;
    let mut blocks = 0;
    while (cur.position() as usize) < bytes.len() {
        let at = cur.position() as usize;
        if bytes[at] == b'#' {
            let end = bytes[at..]
                .iter()
                .position(|&b| b == b'\n')
                .unwrap_or_else(|| panic!("{what}: unterminated annotation at byte {at}"));
            cur.set_position((at + end + 1) as u64);
            continue;
        }
        let r = read_resp(&mut cur).unwrap_or_else(|e| {
            panic!(
                "{what}: no whole command at byte {at} of {}: {e}",
                bytes.len()
            )
        });
        let name = match &r {
            Resp::Array(items)
                if !items.is_empty() && items.iter().all(|i| matches!(i, Resp::Bulk(_))) =>
            {
                items[0].as_string().unwrap().to_uppercase()
            }
            other => panic!("{what}: at byte {at} {other} instead of a command"),
        };
        match name.as_str() {
            "MULTI" => {
                assert!(!in_multi, "{what}: MULTI at byte {at} inside a MULTI block");
                in_multi = true;
            }
            "EXEC" => {
                assert!(in_multi, "{what}: EXEC at byte {at} without a MULTI");
                in_multi = false;
                blocks += 1;
            }
            _ => {}
        }
    }
    assert!(!in_multi, "{what}: the file ends inside a MULTI block");
    blocks
}

/// Checks the incr files that `<dir>/appendonlydir/appendonly.aof.manifest` lists with
/// [`check_incr_file`] (at least one MULTI ... EXEC block in all), and runs
/// `redis-check-aof` on the manifest when it is on PATH.
fn check_aof_files(dir: &Path, what: &str) {
    let aofdir = dir.join("appendonlydir");
    let manifest = aofdir.join("appendonly.aof.manifest");
    let text = fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("{what}: read {}: {e}", manifest.display()));
    let mut blocks = 0;
    let mut incr_files = 0;
    for line in text.lines() {
        let w: Vec<&str> = line.split(' ').collect();
        if w.len() == 6 && w[0] == "file" && w[4] == "type" && w[5] == "i" {
            incr_files += 1;
            let p = aofdir.join(w[1]);
            let bytes =
                fs::read(&p).unwrap_or_else(|e| panic!("{what}: read {}: {e}", p.display()));
            blocks += check_incr_file(&bytes, &format!("{what}, {}", w[1]));
        }
    }
    assert!(
        incr_files > 0,
        "{what}: the manifest lists no incr file:\n{text}"
    );
    assert!(
        blocks > 0,
        "{what}: no MULTI ... EXEC block in the incr files, though transactions with \
         several writes ran"
    );
    match which("redis-check-aof") {
        Some(bin) => {
            let out = Command::new(&bin)
                .arg(&manifest)
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
            let report = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.status.success() && report.contains("All AOF files and manifest are valid"),
                "{what}: redis-check-aof {} ({}):\n{report}",
                manifest.display(),
                out.status
            );
        }
        None => eprintln!("{what}: redis-check-aof is not on PATH; only the RESP check ran"),
    }
}

// ---------------------------------------------------------------------------
// Helpers: replication
// ---------------------------------------------------------------------------

fn info_map(c: &mut Client, section: &str) -> HashMap<String, String> {
    let r = c.cmd(&["INFO", section]);
    let text = r
        .as_string()
        .unwrap_or_else(|| panic!("INFO {section} answered {r}"));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Waits (bounded) until the replica's link is up, no sync runs and its
/// slave_repl_offset equals the master's master_repl_offset.
fn wait_in_sync(master: &ServerProcess, replica: &ServerProcess, what: &str) {
    let mut mc = master.client();
    let mut rc = replica.client();
    let deadline = Instant::now() + SYNC_WAIT;
    loop {
        let r = info_map(&mut rc, "replication");
        let m = info_map(&mut mc, "replication");
        let get = |i: &HashMap<String, String>, f: &str| i.get(f).cloned().unwrap_or_default();
        let (link, syncing, roff, moff) = (
            get(&r, "master_link_status"),
            get(&r, "master_sync_in_progress"),
            get(&r, "slave_repl_offset"),
            get(&m, "master_repl_offset"),
        );
        if link == "up" && syncing == "0" && !moff.is_empty() && roff == moff {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the replica did not catch up in {SYNC_WAIT:?}: master_link_status:{link} \
             master_sync_in_progress:{syncing} slave_repl_offset:{roff}, the master's \
             master_repl_offset:{moff}\n--- replica log ---\n{}\n--- master log ---\n{}",
            replica.log_tail(20),
            master.log_tail(20)
        );
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// 1. Replies in queue order, run-time errors in place
// ---------------------------------------------------------------------------

/// Commands for two shards interleaved in the queue get their replies in queue order; a
/// command that fails at run time (INCR on a string that is not a number, LPUSH on a
/// string) answers its error at its own index, and every other command, on both shards,
/// before and after it, still runs (Redis does not roll back). A multi-key MGET over the
/// shards inside the transaction sees the transaction's own earlier writes.
#[test]
fn replies_come_back_in_queue_order_with_run_time_errors_in_place() {
    const NOT_INT: &str = "ERR value is not an integer or out of range";
    const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
    for threads in THREADS {
        let kite = KiteServer::start(&[], threads);
        let mut c = kite.client();
        let a = key_on("ord:a:", 0, threads);
        let b = key_on("ord:b:", 1, threads);
        let la = key_on("ord:la:", threads - 1, threads);
        let sb = key_on("ord:sb:", 2 % threads, threads);
        for pipelined in [true, false] {
            let what = format!("--threads {threads}, pipelined {pipelined}");
            assert_eq!(c.cmd(&["FLUSHALL"]), Resp::ok());
            let cmds = vec![
                cmd(&["SET", &a, "1"]),
                cmd(&["SET", &b, "x"]),
                cmd(&["INCR", &a]),
                cmd(&["GET", &b]),
                cmd(&["LPUSH", &la, "v"]),
                cmd(&["INCR", &a]),
                cmd(&["GET", &a]),
                cmd(&["INCR", &b]),
                cmd(&["LPUSH", &a, "w"]),
                cmd(&["SADD", &sb, "m"]),
                cmd(&["APPEND", &b, "y"]),
                cmd(&["LPUSH", &la, "w"]),
                cmd(&["INCR", &a]),
                cmd(&["MGET", &a, &b, &la]),
                cmd(&["LRANGE", &la, "0", "-1"]),
            ];
            let got = transaction(&mut c, &cmds, pipelined);
            let expected = Resp::Array(vec![
                Resp::ok(),
                Resp::ok(),
                Resp::Integer(2),
                Resp::bulk("x"),
                Resp::Integer(1),
                Resp::Integer(3),
                Resp::bulk("3"),
                Resp::Error(NOT_INT.into()),
                Resp::Error(WRONGTYPE.into()),
                Resp::Integer(1),
                Resp::Integer(2),
                Resp::Integer(2),
                Resp::Integer(4),
                Resp::Array(vec![Resp::bulk("4"), Resp::bulk("xy"), Resp::NullBulk]),
                bulks(&["w", "v"]),
            ]);
            assert_eq!(got, expected, "{what}: EXEC of\n{}", show_tx(&cmds));
            assert_eq!(c.cmd(&["GET", &a]), Resp::bulk("4"), "{what}");
            assert_eq!(c.cmd(&["GET", &b]), Resp::bulk("xy"), "{what}");
            assert_eq!(c.cmd(&["TYPE", &a]), Resp::simple("string"), "{what}");
            assert_eq!(
                c.cmd(&["LRANGE", &la, "0", "-1"]),
                bulks(&["w", "v"]),
                "{what}"
            );
            assert_eq!(c.cmd(&["SMEMBERS", &sb]), bulks(&["m"]), "{what}");

            // Only the first command fails, and only the last; both shards still write.
            let cmds = vec![
                cmd(&["INCR", &b]),
                cmd(&["SET", &a, "10"]),
                cmd(&["RPUSH", &la, "z"]),
                cmd(&["SADD", &a, "m"]),
            ];
            let got = transaction(&mut c, &cmds, pipelined);
            assert_eq!(
                got,
                Resp::Array(vec![
                    Resp::Error(NOT_INT.into()),
                    Resp::ok(),
                    Resp::Integer(3),
                    Resp::Error(WRONGTYPE.into()),
                ]),
                "{what}: EXEC of\n{}",
                show_tx(&cmds)
            );
            assert_eq!(c.cmd(&["MGET", &a, &b]), bulks(&["10", "xy"]), "{what}");
            assert_eq!(
                c.cmd(&["LRANGE", &la, "0", "-1"]),
                bulks(&["w", "v", "z"]),
                "{what}"
            );
        }
    }
}

/// An error while queueing (unknown command, wrong number of arguments) makes EXEC answer
/// EXECABORT and run nothing, on any shard; DISCARD drops the queue; EXEC without MULTI
/// is an error.
#[test]
fn queue_time_error_discards_the_whole_multi_shard_transaction() {
    for threads in THREADS {
        let what = format!("--threads {threads}");
        let mut kite = KiteServer::start(&[], threads);
        let mut c = kite.client();
        let a = key_on("qe:a:", 0, threads);
        let b = key_on("qe:b:", threads - 1, threads);
        assert_eq!(c.cmd(&["MSET", &a, "old-a", &b, "old-b"]), Resp::ok());

        for bad in [vec!["NOSUCHCOMMAND", b.as_str()], vec!["SET", b.as_str()]] {
            assert_eq!(c.cmd(&["MULTI"]), Resp::ok(), "{what}");
            assert_eq!(c.cmd(&["SET", &a, "new"]), Resp::simple("QUEUED"), "{what}");
            let r = c.cmd(&bad);
            assert_err_prefix(&r, "ERR");
            assert_eq!(c.cmd(&["SET", &b, "new"]), Resp::simple("QUEUED"), "{what}");
            assert_eq!(c.cmd(&["LPUSH", &a, "x"]), Resp::simple("QUEUED"), "{what}");
            let r = c.cmd(&["EXEC"]);
            assert_err_prefix(&r, "EXECABORT");
            assert_eq!(
                c.cmd(&["MGET", &a, &b]),
                bulks(&["old-a", "old-b"]),
                "{what}: after `{}`",
                bad.join(" ")
            );
        }

        assert_eq!(c.cmd(&["MULTI"]), Resp::ok());
        assert_eq!(c.cmd(&["SET", &a, "new"]), Resp::simple("QUEUED"));
        assert_eq!(c.cmd(&["SET", &b, "new"]), Resp::simple("QUEUED"));
        assert_eq!(c.cmd(&["DISCARD"]), Resp::ok());
        assert_eq!(
            c.cmd(&["MGET", &a, &b]),
            bulks(&["old-a", "old-b"]),
            "{what}: after DISCARD"
        );
        assert_err_prefix(&c.cmd(&["EXEC"]), "ERR EXEC without MULTI");
        kite.assert_alive();
    }
}

// ---------------------------------------------------------------------------
// 2. Persistence through the append-only file
// ---------------------------------------------------------------------------

/// With `appendonly yes` (`appendfsync always`, so every acknowledged write is on disk
/// before the process is killed): transactions over the same keys in different orders
/// (SET/INCR/INCRBY/LPUSH/RPUSH/RPOP/SADD/SREM/DEL, DEL over two shards, EXPIRE with a
/// long time to live), with plain commands from another connection between them, every
/// reply checked against a model; then SIGKILL and a restart on the same directory: the
/// data is the model's (values, lists in order, set members, which keys have a time to
/// live). More transactions on the reloaded data, and a restart again. Then four
/// connections run transactions over the same keys at once: after SIGKILL and a
/// restart, the data is what the server showed before the kill. The incr files hold
/// whole commands and whole MULTI ... EXEC blocks (and `redis-check-aof` accepts them
/// when it is installed).
#[test]
fn multi_shard_transactions_survive_an_aof_restart() {
    for threads in THREADS {
        let what = format!("--threads {threads}");
        let dir = DataDir::new("aof");
        let d = dir.arg();
        let args = [
            "--dir",
            d.as_str(),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ];
        let mut w = Workload::new("aof", threads, 0xA0F0 + threads as u64);
        let mut model = Model::default();

        let kite = KiteServer::start(&args, threads);
        {
            let mut tx = kite.client();
            let mut plain = kite.client();
            w.run_sequential(&mut tx, &mut plain, &mut model, 120, &what);
            assert_same_data(
                &model.dump(),
                &dump(&mut plain),
                &format!("{what}, before the restart"),
            );
        }
        drop(kite);
        check_aof_files(dir.path(), &format!("{what}, first kill"));

        let kite = KiteServer::start(&args, threads);
        {
            let mut tx = kite.client();
            let mut plain = kite.client();
            assert_same_data(
                &model.dump(),
                &dump(&mut plain),
                &format!("{what}, after the first restart"),
            );
            w.run_sequential(&mut tx, &mut plain, &mut model, 60, &what);
        }
        drop(kite);
        check_aof_files(dir.path(), &format!("{what}, second kill"));

        let kite = KiteServer::start(&args, threads);
        assert_same_data(
            &model.dump(),
            &dump(&mut kite.client()),
            &format!("{what}, after the second restart"),
        );
        concurrent_random_txs(&kite, &w, 4, 60, 0xC0C0 + threads as u64, &what);
        let before = dump(&mut kite.client());
        drop(kite);
        check_aof_files(dir.path(), &format!("{what}, third kill"));

        let kite = KiteServer::start(&args, threads);
        assert_same_data(
            &before,
            &dump(&mut kite.client()),
            &format!("{what}, after concurrent transactions and a restart"),
        );
        drop(kite);
    }
}

// ---------------------------------------------------------------------------
// 3. Replication
// ---------------------------------------------------------------------------

/// A replica of a `--threads 2` master gets the effects of multi-shard transactions:
/// those run before it attached (through the full sync), sequential ones checked
/// against a model, one with run-time errors (only what ran travels), and four
/// connections' concurrent ones over the same keys. Once it has caught up its data is
/// the master's, lists in the same order. The replica runs at 2 and at 4 threads.
#[test]
fn replica_receives_multi_shard_transactions() {
    for replica_threads in [2, 4] {
        let master_threads = 2;
        let what =
            format!("master --threads {master_threads}, replica --threads {replica_threads}");
        let master = KiteServer::start(&[], master_threads);
        let replica = KiteServer::start(&[], replica_threads);
        let mut w = Workload::new("repl", master_threads, 0x5E9 + replica_threads as u64);
        let mut model = Model::default();
        let mut tx = master.client();
        let mut plain = master.client();

        w.run_sequential(&mut tx, &mut plain, &mut model, 20, &what);
        let port = master.port.to_string();
        assert_eq!(
            replica.client().cmd(&["REPLICAOF", "127.0.0.1", &port]),
            Resp::ok(),
            "{what}: REPLICAOF"
        );
        wait_in_sync(&master, &replica, &format!("{what}, after REPLICAOF"));

        w.run_sequential(&mut tx, &mut plain, &mut model, 100, &what);

        // Run-time errors: only the commands that ran reach the replica.
        let s = key_on("repl:err:s:", 0, master_threads);
        let l = key_on("repl:err:l:", 1, master_threads);
        let cmds = vec![
            cmd(&["SET", &s, "text"]),
            cmd(&["LPUSH", &l, "a"]),
            cmd(&["INCR", &s]),
            cmd(&["LPUSH", &s, "x"]),
            cmd(&["RPUSH", &l, "b"]),
            cmd(&["APPEND", &s, "!"]),
        ];
        let got = transaction(&mut tx, &cmds, true);
        let items = exec_items(&got, &what);
        assert_eq!(items.len(), 6, "{what}: {got}");
        assert_eq!(items[0], Resp::ok(), "{what}: {got}");
        assert_eq!(items[1], Resp::Integer(1), "{what}: {got}");
        assert_err_prefix(&items[2], "ERR");
        assert_err_prefix(&items[3], "WRONGTYPE");
        assert_eq!(items[4], Resp::Integer(2), "{what}: {got}");
        assert_eq!(items[5], Resp::Integer(5), "{what}: {got}");
        model.apply(&cmd(&["SET", &s, "text!"]));
        model.apply(&cmd(&["RPUSH", &l, "a", "b"]));
        assert_same_data(
            &model.dump(),
            &dump(&mut plain),
            &format!("{what}, the master"),
        );

        concurrent_random_txs(&master, &w, 4, 60, 0xBEE + replica_threads as u64, &what);

        wait_in_sync(
            &master,
            &replica,
            &format!("{what}, after the transactions"),
        );
        let expected = dump(&mut master.client());
        let mut rc = replica.client();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = dump(&mut rc);
        while got != expected && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
            got = dump(&mut rc);
        }
        assert_same_data(
            &expected,
            &got,
            &format!("{what}: the replica against the master"),
        );
    }
}

// ---------------------------------------------------------------------------
// 4. Keyspace notifications
// ---------------------------------------------------------------------------

/// Reads `pmessage`s until one on `end_channel`; returns "<channel> <payload>" of those
/// before it.
fn collect_events(sub: &mut Client, end_channel: &str, what: &str) -> Vec<String> {
    sub.set_timeout(Some(Duration::from_secs(10)));
    let mut out = Vec::new();
    for _ in 0..200 {
        let m = sub
            .try_read()
            .unwrap_or_else(|e| panic!("{what}: no message within 10 s; so far {out:?}: {e}"));
        let a = m
            .as_array()
            .unwrap_or_else(|| panic!("{what}: {m} is not a pmessage"));
        assert!(
            a.len() == 4 && a[0] == Resp::bulk("pmessage"),
            "{what}: {m} is not a pmessage"
        );
        let channel = a[2].as_string().unwrap();
        let payload = a[3].as_string().unwrap();
        if channel == end_channel {
            return out;
        }
        out.push(format!("{channel} {payload}"));
    }
    panic!("{what}: no message on {end_channel} among 200: {out:?}");
}

/// `notify-keyspace-events KEA`: a multi-shard EXEC (SET, LPUSH, SADD, INCR, a GET, an
/// INCR that fails, EXPIRE, an LPOP that empties its list, an SADD that adds nothing,
/// DEL, RPUSH; keys on both shards, interleaved) publishes its events in the order of
/// the queued commands, as Redis does running them one after the other: both the
/// keyevent and the keyspace channels, nothing for the read, the failed command or the
/// no-op, `lpop` then `del` for the emptied list.
#[test]
fn keyspace_events_of_a_multi_shard_exec_come_in_queue_order() {
    for threads in THREADS {
        let kite = KiteServer::start(&[], threads);
        let mut admin = kite.client();
        assert_eq!(
            admin.cmd(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]),
            Resp::ok()
        );
        let mut by_event = kite.client();
        by_event.send(&["PSUBSCRIBE", "__keyevent@0__:*"]);
        assert_eq!(
            by_event.read(),
            Resp::Array(vec![
                Resp::bulk("psubscribe"),
                Resp::bulk("__keyevent@0__:*"),
                Resp::Integer(1)
            ])
        );
        let mut by_key = kite.client();
        by_key.send(&["PSUBSCRIBE", "__keyspace@0__:*"]);
        assert_eq!(
            by_key.read(),
            Resp::Array(vec![
                Resp::bulk("psubscribe"),
                Resp::bulk("__keyspace@0__:*"),
                Resp::Integer(1)
            ])
        );
        for (round, pipelined) in [true, false].into_iter().enumerate() {
            let what = format!("--threads {threads}, pipelined {pipelined}");
            let a = key_on(&format!("ev{round}:a:"), 0, threads);
            let l = key_on(&format!("ev{round}:l:"), 1, threads);
            let s = key_on(&format!("ev{round}:s:"), 2 % threads, threads);
            let b = key_on(&format!("ev{round}:b:"), 3 % threads, threads);
            let cmds = vec![
                cmd(&["SET", &a, "1"]),
                cmd(&["LPUSH", &l, "x"]),
                cmd(&["SADD", &s, "m"]),
                cmd(&["INCR", &a]),
                cmd(&["GET", &b]),
                cmd(&["SET", &b, "text"]),
                cmd(&["INCR", &b]),
                cmd(&["EXPIRE", &a, "100000"]),
                cmd(&["LPOP", &l]),
                cmd(&["SADD", &s, "m"]),
                cmd(&["DEL", &s]),
                cmd(&["RPUSH", &l, "y"]),
            ];
            let got = transaction(&mut admin, &cmds, pipelined);
            let items = exec_items(&got, &what);
            assert_eq!(items.len(), cmds.len(), "{what}: {got}");
            assert_err_prefix(&items[6], "ERR");
            admin.cmd(&["PUBLISH", "__keyevent@0__:end-of-round", "end"]);
            admin.cmd(&["PUBLISH", "__keyspace@0__:end-of-round", "end"]);
            let events = [
                ("set", &a),
                ("lpush", &l),
                ("sadd", &s),
                ("incrby", &a),
                ("set", &b),
                ("expire", &a),
                ("lpop", &l),
                ("del", &l),
                ("del", &s),
                ("rpush", &l),
            ];
            let expected: Vec<String> = events
                .iter()
                .map(|(e, k)| format!("__keyevent@0__:{e} {k}"))
                .collect();
            assert_eq!(
                collect_events(&mut by_event, "__keyevent@0__:end-of-round", &what),
                expected,
                "{what}: keyevent messages for\n{}",
                show_tx(&cmds)
            );
            let expected: Vec<String> = events
                .iter()
                .map(|(e, k)| format!("__keyspace@0__:{k} {e}"))
                .collect();
            assert_eq!(
                collect_events(&mut by_key, "__keyspace@0__:end-of-round", &what),
                expected,
                "{what}: keyspace messages for\n{}",
                show_tx(&cmds)
            );
        }
    }
}

// ---------------------------------------------------------------------------
// 5. Blocking pops served by a transaction
// ---------------------------------------------------------------------------

/// A client blocked on a list that a multi-shard EXEC pushes to is served once the
/// EXEC's keys go, so its pop's event comes after the EXEC's push, as on Redis, where
/// the blocked client is served after the EXEC has run (the pop must not be published
/// first because the EXEC's own events wait for its connection's thread).
#[test]
fn a_pop_served_by_a_multi_shard_exec_is_published_after_its_push() {
    for threads in THREADS {
        for list_shard in [0, 1] {
            let what = format!("--threads {threads}, the list on shard {list_shard}");
            let kite = KiteServer::start(&[], threads);
            let mut admin = kite.client();
            assert_eq!(
                admin.cmd(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]),
                Resp::ok()
            );
            let a = key_on("pe:a:", 1 - list_shard, threads);
            let list = key_on("pe:list:", list_shard, threads);
            let mut sub = kite.client();
            sub.send(&["PSUBSCRIBE", "__keyevent@0__:*"]);
            assert!(sub.read().as_array().is_some(), "{what}: psubscribe");
            let mut waiter = kite.client();
            waiter.send(&["BRPOP", &list, "10"]);
            common::blocked::wait_blocked(&mut admin, 1, &what);
            // Connections are dealt to threads in turn: the EXEC runs from each thread.
            for _ in 0..threads {
                let _ = kite.client();
            }
            let got = transaction(
                &mut admin,
                &[cmd(&["SET", &a, "1"]), cmd(&["LPUSH", &list, "job"])],
                true,
            );
            assert_eq!(exec_items(&got, &what).len(), 2, "{what}: {got}");
            assert_eq!(waiter.read(), bulks(&[&list, "job"]), "{what}: BRPOP");
            admin.cmd(&["PUBLISH", "__keyevent@0__:end-of-round", "end"]);
            let events = collect_events(&mut sub, "__keyevent@0__:end-of-round", &what);
            let expected: Vec<String> = [
                ("set", &a),
                ("lpush", &list),
                ("rpop", &list),
                ("del", &list),
            ]
            .iter()
            .map(|(e, k)| format!("__keyevent@0__:{e} {k}"))
            .collect();
            assert_eq!(events, expected, "{what}");
        }
    }
}

/// A client blocked in BLMOVE whose source a multi-shard transaction pushes to has its
/// element in the destination before EXEC answers: the same connection, reading the
/// destination next in its pipeline, finds it there. Redis serves blocked clients as
/// soon as the command that readied their key ends, before it reads anything else.
/// The source is on the first shard (let go, and the move served, after the
/// transaction's last shard has run) or on the last one, the destination on another
/// shard again; every other round WATCHes a key first, which takes the transaction
/// another way; and each pusher's connection lives on a thread of its own.
#[test]
fn a_blmove_served_by_a_multi_shard_exec_has_landed_before_exec_answers() {
    for threads in THREADS {
        let what = format!("--threads {threads}");
        let kite = KiteServer::start(&[], threads);
        let mut admin = kite.client();
        let mut mover = kite.client();
        // Connections are dealt to threads in turn: the pushers run from each thread.
        let mut pushers: Vec<Client> = (0..threads).map(|_| kite.client()).collect();
        for round in 0..8 * threads {
            // The source on the first shard (let go after the last shard) or on the last
            // (let go there); the other key on the other end.
            let (src_shard, other_shard) = if round % 4 < 2 {
                (0, threads - 1)
            } else {
                (threads - 1, 0)
            };
            let src = key_on("lm:src:", src_shard, threads);
            let dst = key_on("lm:dst:", 1 - src_shard.min(1), threads);
            let last = key_on("lm:other:", other_shard, threads);
            mover.send(&["BLMOVE", &src, &dst, "LEFT", "RIGHT", "10"]);
            wait_blocked(&mut admin, 1, &what);
            let pusher = &mut pushers[(round / 4) % threads];
            let mut pipeline = if round % 2 == 1 {
                vec![cmd(&["WATCH", &last])]
            } else {
                Vec::new()
            };
            pipeline.extend([
                cmd(&["MULTI"]),
                cmd(&["LPUSH", &src, "job"]),
                cmd(&["SET", &last, "x"]),
                cmd(&["EXEC"]),
                cmd(&["LRANGE", &dst, "0", "-1"]),
            ]);
            let replies = pusher.pipeline(&pipeline);
            assert_eq!(
                replies.last().unwrap(),
                &bulks(&["job"]),
                "{what}, round {round}: the destination right after EXEC"
            );
            assert_eq!(
                read_reply(&mut mover, &what),
                Resp::bulk("job"),
                "{what}: BLMOVE"
            );
            assert_eq!(admin.cmd(&["DEL", &dst]), Resp::Integer(1), "{what}");
        }
    }
}

/// A client blocked in BRPOP on a list of one shard; another client runs MULTI; SET
/// (other shard); LPUSH list job; LLEN list; SET (another key); EXEC. Inside the
/// transaction LLEN still sees the job (blocked clients are served after EXEC, as in
/// Redis); the waiter gets it exactly once, the list is gone afterwards and a second
/// BRPOP times out. With two waiters and two pushes in one transaction, the first
/// blocked gets the first job pushed (BRPOP takes the tail) and the second the other.
#[test]
fn brpop_waiter_gets_a_job_pushed_by_a_multi_shard_transaction_exactly_once() {
    for threads in THREADS {
        let what = format!("--threads {threads}");
        let kite = KiteServer::start(&[], threads);
        let mut admin = kite.client();
        let list = key_on("bq:list:", 0, threads);
        let other = key_on("bq:other:", 1, threads);
        let other2 = key_on("bq:other2:", threads - 1, threads);

        let mut waiter = kite.client();
        waiter.send(&["BRPOP", list.as_str(), "0"]);
        wait_blocked(&mut admin, 1, &what);
        let mut p = kite.client();
        let cmds = vec![
            cmd(&["SET", &other, "1"]),
            cmd(&["LPUSH", &list, "job-1"]),
            cmd(&["LLEN", &list]),
            cmd(&["SET", &other2, "2"]),
        ];
        assert_eq!(
            transaction(&mut p, &cmds, true),
            Resp::Array(vec![
                Resp::ok(),
                Resp::Integer(1),
                Resp::Integer(1),
                Resp::ok()
            ]),
            "{what}"
        );
        assert_eq!(
            read_reply(&mut waiter, &what),
            bulks(&[list.as_str(), "job-1"]),
            "{what}"
        );
        wait_blocked(&mut admin, 0, &what);
        assert_eq!(admin.cmd(&["LLEN", &list]), Resp::Integer(0), "{what}");
        assert_eq!(admin.cmd(&["EXISTS", &list]), Resp::Integer(0), "{what}");
        assert_eq!(
            waiter.cmd(&["BRPOP", list.as_str(), "1"]),
            Resp::NullArray,
            "{what}: the job came twice"
        );

        let mut w1 = kite.client();
        let mut w2 = kite.client();
        w1.send(&["BRPOP", list.as_str(), "0"]);
        wait_blocked(&mut admin, 1, &what);
        w2.send(&["BRPOP", list.as_str(), "0"]);
        wait_blocked(&mut admin, 2, &what);
        let cmds = vec![
            cmd(&["LPUSH", &list, "j1"]),
            cmd(&["SET", &other, "x"]),
            cmd(&["LPUSH", &list, "j2"]),
            cmd(&["LLEN", &list]),
            cmd(&["INCR", &other2]),
        ];
        assert_eq!(
            transaction(&mut p, &cmds, false),
            Resp::Array(vec![
                Resp::Integer(1),
                Resp::ok(),
                Resp::Integer(2),
                Resp::Integer(2),
                Resp::Integer(3)
            ]),
            "{what}"
        );
        assert_eq!(
            read_reply(&mut w1, &what),
            bulks(&[list.as_str(), "j1"]),
            "{what}"
        );
        assert_eq!(
            read_reply(&mut w2, &what),
            bulks(&[list.as_str(), "j2"]),
            "{what}"
        );
        wait_blocked(&mut admin, 0, &what);
        assert_eq!(admin.cmd(&["EXISTS", &list]), Resp::Integer(0), "{what}");
    }
}

// ---------------------------------------------------------------------------
// 6 and 7. Sidekiq-shaped load
// ---------------------------------------------------------------------------

const PUSHERS: usize = 16;
const JOBS_PER_PUSHER: usize = 300;
const QUEUE_COUNT: usize = 8;

/// Eight queue names: the list `queue:<name>` of the first is on the shard of `queues`
/// (a one-shard transaction), the others' on other shards (transactions over two).
fn sidekiq_queues(threads: usize) -> Vec<String> {
    let home = shard_of("queues", threads);
    let mut same = None;
    let mut others = Vec::new();
    let mut i = 0;
    while same.is_none() || others.len() < QUEUE_COUNT - 1 {
        assert!(i < 100_000, "no queue names found");
        let name = format!("q{i}");
        i += 1;
        if shard_of(&format!("queue:{name}"), threads) == home {
            if same.is_none() {
                same = Some(name);
            }
        } else if others.len() < QUEUE_COUNT - 1 {
            others.push(name);
        }
    }
    let mut out = vec![same.unwrap()];
    out.extend(others);
    out
}

fn job_name(pusher: usize, seq: usize, queue: usize) -> String {
    format!("job:{pusher}:{seq}:{queue}")
}

/// (pusher, seq, queue index) of a job name.
fn parse_job(job: &str) -> (usize, usize, usize) {
    let p: Vec<&str> = job.split(':').collect();
    assert!(p.len() == 4 && p[0] == "job", "not a job: {job:?}");
    (
        p[1].parse().unwrap(),
        p[2].parse().unwrap(),
        p[3].parse().unwrap(),
    )
}

/// One pusher: JOBS_PER_PUSHER times MULTI; SADD queues <q>; LPUSH queue:<q> <job>; EXEC
/// in one write, on random queues. Every EXEC answers [0 or 1, n >= 1]. Returns how
/// many SADDs answered 1.
fn push_jobs(server: &ServerProcess, queues: &[String], pusher: usize, what: &str) -> usize {
    let mut c = server.client();
    let mut rng = Rng::new(0x51DE + pusher as u64);
    let mut added = 0;
    for seq in 0..JOBS_PER_PUSHER {
        let q = rng.index(queues.len());
        let cmds = vec![
            cmd(&["MULTI"]),
            cmd(&["SADD", "queues", &queues[q]]),
            vec![
                "LPUSH".to_string(),
                format!("queue:{}", queues[q]),
                job_name(pusher, seq, q),
            ],
            cmd(&["EXEC"]),
        ];
        let r = c.pipeline(&cmds);
        assert_eq!(r[0], Resp::ok(), "{what}: pusher {pusher}, MULTI");
        assert_eq!(
            r[1],
            Resp::simple("QUEUED"),
            "{what}: pusher {pusher}, SADD"
        );
        assert_eq!(
            r[2],
            Resp::simple("QUEUED"),
            "{what}: pusher {pusher}, LPUSH"
        );
        let shaped = match &r[3] {
            Resp::Array(v) => {
                matches!(v.as_slice(), [Resp::Integer(0 | 1), Resp::Integer(n)] if *n >= 1)
            }
            _ => false,
        };
        assert!(
            shaped,
            "{what}: pusher {pusher}, job {seq}: EXEC answered {}, not [0|1, n>=1]",
            r[3]
        );
        added += r[3].as_array().unwrap()[0].as_int().unwrap() as usize;
    }
    added
}

/// Asserts `SMEMBERS queues` is exactly the queue names.
fn assert_queue_set(c: &mut Client, queues: &[String], what: &str) {
    let got: HashSet<Vec<u8>> = bytes_set(&c.cmd(&["SMEMBERS", "queues"]));
    let want: HashSet<Vec<u8>> = queues.iter().map(|q| q.as_bytes().to_vec()).collect();
    assert_eq!(got, want, "{what}: SMEMBERS queues");
}

/// 16 clients push 300 jobs each with MULTI; SADD queues <q>; LPUSH queue:<q> <job>;
/// EXEC (one write per push) over 8 queues, so every transaction contends on `queues`
/// and most span two shards. Meanwhile 4 readers run MULTI; LLEN of every queue; SCARD
/// queues; EXEC, and plain LLENs: a queue's length never goes down between a reader's
/// reads, and in a transaction's snapshot SCARD queues is exactly the number of
/// non-empty queues (a queue joins the set in the transaction of its first job). At the
/// end every job is in its queue exactly once, each pusher's jobs in a queue in the
/// order pushed, SMEMBERS queues is the 8 names and exactly 8 SADDs answered 1.
#[test]
fn sidekiq_pushes_with_transactional_readers() {
    const READERS: usize = 4;
    const MAX_READS: usize = 3000;
    for threads in THREADS {
        let what = format!("--threads {threads}");
        let kite = KiteServer::start(&[], threads);
        let queues = sidekiq_queues(threads);
        let done = AtomicBool::new(false);
        let added = thread::scope(|s| {
            let server: &ServerProcess = &kite;
            let (queues, done, what) = (&queues, &done, &what);
            for reader in 0..READERS {
                s.spawn(move || {
                    let mut c = server.client();
                    let mut rng = Rng::new(0xEAD + reader as u64);
                    let mut last = [0i64; QUEUE_COUNT];
                    let mut tx = vec![cmd(&["MULTI"])];
                    for q in queues {
                        tx.push(vec!["LLEN".to_string(), format!("queue:{q}")]);
                    }
                    tx.push(cmd(&["SCARD", "queues"]));
                    tx.push(cmd(&["EXEC"]));
                    for i in 0..MAX_READS {
                        let finished = done.load(Ordering::SeqCst);
                        let r = c.pipeline(&tx);
                        assert_eq!(r[0], Resp::ok(), "{what}: reader {reader}, MULTI");
                        for x in &r[1..=QUEUE_COUNT + 1] {
                            assert_eq!(*x, Resp::simple("QUEUED"), "{what}: reader {reader}");
                        }
                        let items = exec_items(&r[QUEUE_COUNT + 2], what);
                        assert_eq!(items.len(), QUEUE_COUNT + 1, "{what}: reader {reader}");
                        let lens: Vec<i64> = items
                            .iter()
                            .map(|x| {
                                x.as_int().unwrap_or_else(|| {
                                    panic!("{what}: reader {reader}: {x} in {}", r[QUEUE_COUNT + 2])
                                })
                            })
                            .collect();
                        let scard = lens[QUEUE_COUNT];
                        let nonempty = lens[..QUEUE_COUNT].iter().filter(|&&n| n > 0).count() as i64;
                        assert!(
                            scard <= QUEUE_COUNT as i64 && scard == nonempty,
                            "{what}: reader {reader}, read {i}: SCARD queues {scard} with \
                             {nonempty} non-empty queues in one EXEC: {}",
                            r[QUEUE_COUNT + 2]
                        );
                        for q in 0..QUEUE_COUNT {
                            assert!(
                                lens[q] >= last[q],
                                "{what}: reader {reader}, read {i}: queue:{} went from {} to {}",
                                queues[q],
                                last[q],
                                lens[q]
                            );
                            last[q] = lens[q];
                        }
                        let q = rng.index(QUEUE_COUNT);
                        let n = c.cmd(&["LLEN", &format!("queue:{}", queues[q])]);
                        let n = n.as_int().unwrap_or_else(|| panic!("{what}: LLEN answered {n}"));
                        assert!(
                            n >= last[q],
                            "{what}: reader {reader}, read {i}: plain LLEN queue:{} went from {} to {n}",
                            queues[q],
                            last[q]
                        );
                        last[q] = n;
                        if finished {
                            break;
                        }
                    }
                });
            }
            let pushers: Vec<_> = (0..PUSHERS)
                .map(|p| s.spawn(move || push_jobs(server, queues, p, what)))
                .collect();
            let results: Vec<_> = pushers.into_iter().map(|h| h.join()).collect();
            done.store(true, Ordering::SeqCst);
            results
                .into_iter()
                .map(|r| r.unwrap_or_else(|_| panic!("{what}: a pusher failed")))
                .sum::<usize>()
        });
        let mut c = kite.client();
        assert_queue_set(&mut c, &queues, &what);
        assert_eq!(added, QUEUE_COUNT, "{what}: SADDs that answered 1");
        let mut seen = HashSet::new();
        for (qi, q) in queues.iter().enumerate() {
            let jobs = strings(&c.cmd(&["LRANGE", &format!("queue:{q}"), "0", "-1"]));
            let mut newest = [usize::MAX; PUSHERS];
            for job in &jobs {
                let (pusher, seq, jq) = parse_job(job);
                assert_eq!(jq, qi, "{what}: {job} in queue:{q}");
                assert!(seen.insert(job.clone()), "{what}: {job} twice");
                // LPUSH puts the newest at the head: one pusher's jobs go down.
                assert!(
                    seq < newest[pusher],
                    "{what}: queue:{q} holds pusher {pusher}'s job {seq} after a job >= {seq}",
                );
                newest[pusher] = seq;
            }
        }
        assert_eq!(
            seen.len(),
            PUSHERS * JOBS_PER_PUSHER,
            "{what}: jobs in the queues"
        );
    }
}

/// The pushes of [`sidekiq_pushes_with_transactional_readers`] with 4 consumers doing
/// BRPOP over the 8 queues (in a new random order each call, as Sidekiq does, timeout
/// 1 s) until every job is consumed or 30 s pass: every job is consumed exactly once,
/// from its own queue; the queues are empty at the end and SMEMBERS queues is the 8
/// names.
#[test]
fn sidekiq_pushes_with_brpop_consumers() {
    const CONSUMERS: usize = 4;
    const TOTAL: usize = PUSHERS * JOBS_PER_PUSHER;
    for threads in THREADS {
        let what = format!("--threads {threads}");
        let kite = KiteServer::start(&[], threads);
        let queues = sidekiq_queues(threads);
        let consumed_count = AtomicUsize::new(0);
        let deadline = Instant::now() + Duration::from_secs(30);
        let consumed: Vec<(String, String)> = thread::scope(|s| {
            let server: &ServerProcess = &kite;
            let (queues, count, what) = (&queues, &consumed_count, &what);
            let consumers: Vec<_> = (0..CONSUMERS)
                .map(|n| {
                    s.spawn(move || {
                        let mut c = server.client();
                        let mut rng = Rng::new(0xC0 + n as u64);
                        let mut got = Vec::new();
                        while count.load(Ordering::SeqCst) < TOTAL && Instant::now() < deadline {
                            let mut keys: Vec<String> =
                                queues.iter().map(|q| format!("queue:{q}")).collect();
                            rng.shuffle(&mut keys);
                            let mut brpop = vec!["BRPOP".to_string()];
                            brpop.extend(keys);
                            brpop.push("1".to_string());
                            let r = c.cmd(&brpop);
                            if r == Resp::NullArray {
                                continue;
                            }
                            let kv = strings(&r);
                            assert_eq!(kv.len(), 2, "{what}: consumer {n}: BRPOP answered {r}");
                            got.push((kv[0].clone(), kv[1].clone()));
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        got
                    })
                })
                .collect();
            let pushers: Vec<_> = (0..PUSHERS)
                .map(|p| s.spawn(move || push_jobs(server, queues, p, what)))
                .collect();
            let mut all = Vec::new();
            for h in pushers {
                h.join()
                    .unwrap_or_else(|_| panic!("{what}: a pusher failed"));
            }
            for h in consumers {
                all.extend(
                    h.join()
                        .unwrap_or_else(|_| panic!("{what}: a consumer failed")),
                );
            }
            all
        });
        let mut seen = HashSet::new();
        for (key, job) in &consumed {
            let (_, _, qi) = parse_job(job);
            assert_eq!(
                *key,
                format!("queue:{}", queues[qi]),
                "{what}: {job} popped from {key}"
            );
            assert!(seen.insert(job.clone()), "{what}: {job} consumed twice");
        }
        let mut c = kite.client();
        let mut left = Vec::new();
        for q in &queues {
            let n = c.cmd(&["LLEN", &format!("queue:{q}")]);
            if n != Resp::Integer(0) {
                left.push(format!("queue:{q} {n}"));
            }
        }
        assert_eq!(
            seen.len(),
            TOTAL,
            "{what}: jobs consumed in 30 s ({} pops); left in the queues: {left:?}",
            consumed.len()
        );
        assert!(left.is_empty(), "{what}: left in the queues: {left:?}");
        assert_queue_set(&mut c, &queues, &what);
    }
}

// ---------------------------------------------------------------------------
// 8. Consistent reads
// ---------------------------------------------------------------------------

/// One writer runs MULTI; INCR x; INCR y; EXEC 2000 times (x and y on different shards;
/// EXEC answers [i, i]). Readers meanwhile run MULTI; GET x; GET y; EXEC (and the
/// reverse order): always x == y; a plain MGET x y: x == y; and plain GET y then GET x
/// on one connection: the y read first is never above the x read after it. Each
/// reader's values never go down.
#[test]
fn reads_in_a_multi_shard_exec_see_both_increments_or_neither() {
    const ROUNDS: i64 = 2000;
    const READERS: usize = 2;
    const MAX_READS: usize = 4000;
    for threads in THREADS {
        let what = format!("--threads {threads}");
        let kite = KiteServer::start(&[], threads);
        let x = key_on("cons:x:", 0, threads);
        let y = key_on("cons:y:", threads - 1, threads);
        let done = AtomicBool::new(false);
        thread::scope(|s| {
            let server: &ServerProcess = &kite;
            let (x, y, done, what) = (&x, &y, &done, &what);
            s.spawn(move || {
                let mut c = server.client();
                let cmds = vec![cmd(&["INCR", x]), cmd(&["INCR", y])];
                for i in 1..=ROUNDS {
                    let r = transaction(&mut c, &cmds, i % 2 == 0);
                    if r != Resp::Array(vec![Resp::Integer(i), Resp::Integer(i)]) {
                        done.store(true, Ordering::SeqCst);
                        panic!("{what}: EXEC #{i} of INCR x; INCR y answered {r}");
                    }
                }
                done.store(true, Ordering::SeqCst);
            });
            for reader in 0..READERS {
                s.spawn(move || {
                    let mut c = server.client();
                    let both = vec![cmd(&["GET", x]), cmd(&["GET", y])];
                    let reversed = vec![cmd(&["GET", y]), cmd(&["GET", x])];
                    let mut last = 0;
                    for i in 0..MAX_READS {
                        let finished = done.load(Ordering::SeqCst);
                        let items = exec_items(&transaction(&mut c, &both, true), what);
                        let (vx, vy) = (counter(&items[0], what), counter(&items[1], what));
                        assert_eq!(
                            vx, vy,
                            "{what}: reader {reader}, read {i}: MULTI GET x GET y"
                        );
                        assert!(
                            vx >= last,
                            "{what}: reader {reader}: x went from {last} to {vx}"
                        );
                        last = vx;

                        let items = exec_items(&transaction(&mut c, &reversed, false), what);
                        let (vy, vx) = (counter(&items[0], what), counter(&items[1], what));
                        assert_eq!(
                            vx, vy,
                            "{what}: reader {reader}, read {i}: MULTI GET y GET x"
                        );
                        assert!(
                            vx >= last,
                            "{what}: reader {reader}: x went from {last} to {vx}"
                        );
                        last = vx;

                        let m = c.cmd(&["MGET", x, y]);
                        let m = m
                            .as_array()
                            .unwrap_or_else(|| panic!("{what}: MGET answered {m}"))
                            .to_vec();
                        let (vx, vy) = (counter(&m[0], what), counter(&m[1], what));
                        assert_eq!(vx, vy, "{what}: reader {reader}, read {i}: MGET x y");
                        assert!(
                            vx >= last,
                            "{what}: reader {reader}: x went from {last} to {vx}"
                        );
                        last = vx;

                        let y_first = counter(&c.cmd(&["GET", y]), what);
                        let x_second = counter(&c.cmd(&["GET", x]), what);
                        assert!(
                            y_first >= last && y_first <= x_second,
                            "{what}: reader {reader}, read {i}: GET y gave {y_first}, then GET x \
                             {x_second} (last seen {last})"
                        );
                        last = x_second;
                        if finished {
                            break;
                        }
                    }
                });
            }
        });
        let mut c = kite.client();
        let n = ROUNDS.to_string();
        assert_eq!(
            c.cmd(&["MGET", &x, &y]),
            bulks(&[n.as_str(), n.as_str()]),
            "{what}"
        );
    }
}

// ---------------------------------------------------------------------------
// 9. WATCH across shards
// ---------------------------------------------------------------------------

/// WATCH a b (different shards): a write to b (or to a, or a DEL) by another client,
/// also from inside that client's own multi-shard transaction, makes EXEC answer a null
/// array and run nothing; a read or a write to another key does not; EXEC (run or
/// aborted) forgets the watched keys; the watching client's own write to a watched key
/// aborts too, as in Redis.
#[test]
fn watch_across_shards_aborts_on_a_touched_key_and_runs_otherwise() {
    for threads in THREADS {
        let what = format!("--threads {threads}");
        let kite = KiteServer::start(&[], threads);
        let a = key_on("w:a:", 0, threads);
        let b = key_on("w:b:", threads - 1, threads);
        let unrelated = key_on("w:u:", 1, threads);
        let mut c1 = kite.client();
        let mut c2 = kite.client();
        let set_ab = |va: &str, vb: &str| vec![cmd(&["SET", &a, va]), cmd(&["SET", &b, vb])];
        assert_eq!(c2.cmd(&["MSET", &a, "a0", &b, "b0"]), Resp::ok());

        // Another client writes b.
        assert_eq!(c1.cmd(&["WATCH", &a, &b]), Resp::ok());
        assert_eq!(c2.cmd(&["SET", &b, "changed"]), Resp::ok());
        assert_eq!(
            transaction(&mut c1, &set_ab("1", "2"), false),
            Resp::NullArray,
            "{what}: b touched"
        );
        assert_eq!(
            c1.cmd(&["MGET", &a, &b]),
            bulks(&["a0", "changed"]),
            "{what}"
        );

        // Nothing watched changes: reads and another key's write do not count.
        assert_eq!(c1.cmd(&["WATCH", &a, &b]), Resp::ok());
        assert_eq!(c2.cmd(&["GET", &a]), Resp::bulk("a0"));
        assert_eq!(c2.cmd(&["SET", &unrelated, "x"]), Resp::ok());
        assert_eq!(
            transaction(&mut c1, &set_ab("1", "2"), true),
            Resp::Array(vec![Resp::ok(), Resp::ok()]),
            "{what}: nothing touched"
        );
        assert_eq!(c1.cmd(&["MGET", &a, &b]), bulks(&["1", "2"]), "{what}");

        // a touched by another client's multi-shard transaction.
        assert_eq!(c1.cmd(&["WATCH", &a, &b]), Resp::ok());
        assert_eq!(
            transaction(
                &mut c2,
                &[cmd(&["SET", &unrelated, "y"]), cmd(&["INCR", &a])],
                true
            ),
            Resp::Array(vec![Resp::ok(), Resp::Integer(2)])
        );
        assert_eq!(
            transaction(&mut c1, &set_ab("10", "20"), true),
            Resp::NullArray,
            "{what}: a touched by a transaction"
        );
        assert_eq!(c1.cmd(&["MGET", &a, &b]), bulks(&["2", "2"]), "{what}");

        // EXEC forgot the watch: later writes do not abort an unwatched transaction.
        assert_eq!(c2.cmd(&["SET", &b, "3"]), Resp::ok());
        assert_eq!(
            transaction(&mut c1, &set_ab("11", "21"), false),
            Resp::Array(vec![Resp::ok(), Resp::ok()]),
            "{what}: no WATCH left"
        );

        // The watching client's own write.
        assert_eq!(c1.cmd(&["WATCH", &a, &b]), Resp::ok());
        assert_eq!(c1.cmd(&["SET", &b, "own"]), Resp::ok());
        assert_eq!(
            transaction(&mut c1, &[cmd(&["SET", &a, "12"])], false),
            Resp::NullArray,
            "{what}: own write"
        );
        assert_eq!(c1.cmd(&["MGET", &a, &b]), bulks(&["11", "own"]), "{what}");

        // A DEL by another client.
        assert_eq!(c1.cmd(&["WATCH", &a, &b]), Resp::ok());
        assert_eq!(c2.cmd(&["DEL", &a]), Resp::Integer(1));
        assert_eq!(
            transaction(&mut c1, &set_ab("13", "23"), true),
            Resp::NullArray,
            "{what}: a deleted"
        );
        assert_eq!(
            c1.cmd(&["MGET", &a, &b]),
            Resp::Array(vec![Resp::NullBulk, Resp::bulk("own")]),
            "{what}"
        );
    }
}

// ---------------------------------------------------------------------------
// 10. One shard, keyless commands, empty
// ---------------------------------------------------------------------------

/// A transaction whose keys are all on one shard; one mixing keyless commands (PING,
/// ECHO, DBSIZE, which counts the transaction's own writes so far) with keys on two
/// shards and EXISTS over both; one with keyless commands only; an empty one. Each
/// answers the right replies, pipelined or one command at a time.
#[test]
fn single_shard_and_keyless_commands_in_transactions() {
    for threads in THREADS {
        let kite = KiteServer::start(&[], threads);
        let mut c = kite.client();
        let same = keys_on("one:", 0, threads, 3);
        let a = key_on("kl:a:", 0, threads);
        let b = key_on("kl:b:", threads - 1, threads);
        for pipelined in [true, false] {
            let what = format!("--threads {threads}, pipelined {pipelined}");
            assert_eq!(c.cmd(&["FLUSHALL"]), Resp::ok());
            let cmds = vec![
                cmd(&["SET", &same[0], "1"]),
                cmd(&["INCR", &same[0]]),
                cmd(&["LPUSH", &same[1], "x"]),
                cmd(&["RPUSH", &same[1], "y"]),
                cmd(&["LRANGE", &same[1], "0", "-1"]),
                cmd(&["SADD", &same[2], "m"]),
                cmd(&["MGET", &same[0], &same[2]]),
                cmd(&["DEL", &same[0], &same[1]]),
            ];
            assert_eq!(
                transaction(&mut c, &cmds, pipelined),
                Resp::Array(vec![
                    Resp::ok(),
                    Resp::Integer(2),
                    Resp::Integer(1),
                    Resp::Integer(2),
                    bulks(&["x", "y"]),
                    Resp::Integer(1),
                    Resp::Array(vec![Resp::bulk("2"), Resp::NullBulk]),
                    Resp::Integer(2),
                ]),
                "{what}: one shard:\n{}",
                show_tx(&cmds)
            );
            assert_eq!(c.cmd(&["DBSIZE"]), Resp::Integer(1), "{what}");

            assert_eq!(c.cmd(&["FLUSHALL"]), Resp::ok());
            let cmds = vec![
                cmd(&["PING"]),
                cmd(&["SET", &a, "1"]),
                cmd(&["ECHO", "hi"]),
                cmd(&["SET", &b, "2"]),
                cmd(&["PING", "hello"]),
                cmd(&["DBSIZE"]),
                cmd(&["GET", &a]),
                cmd(&["DEL", &a]),
                cmd(&["DBSIZE"]),
                cmd(&["GET", &b]),
                cmd(&["EXISTS", &a, &b]),
            ];
            assert_eq!(
                transaction(&mut c, &cmds, pipelined),
                Resp::Array(vec![
                    Resp::simple("PONG"),
                    Resp::ok(),
                    Resp::bulk("hi"),
                    Resp::ok(),
                    Resp::bulk("hello"),
                    Resp::Integer(2),
                    Resp::bulk("1"),
                    Resp::Integer(1),
                    Resp::Integer(1),
                    Resp::bulk("2"),
                    Resp::Integer(1),
                ]),
                "{what}: keyless commands among two shards' keys:\n{}",
                show_tx(&cmds)
            );
            assert_eq!(
                c.cmd(&["MGET", &a, &b]),
                Resp::Array(vec![Resp::NullBulk, Resp::bulk("2")]),
                "{what}"
            );

            let cmds = vec![cmd(&["PING"]), cmd(&["ECHO", "e"])];
            assert_eq!(
                transaction(&mut c, &cmds, pipelined),
                Resp::Array(vec![Resp::simple("PONG"), Resp::bulk("e")]),
                "{what}: keyless only"
            );
            assert_eq!(
                transaction(&mut c, &[], pipelined),
                Resp::Array(vec![]),
                "{what}: empty"
            );
        }
    }
}

/// The slow log names the client whose transaction ran a command, whichever shard ran
/// it: Redis logs each command inside EXEC (not EXEC itself) with the client's address
/// and name.
#[test]
fn slow_log_names_the_client_of_each_command_in_a_transaction() {
    for threads in THREADS {
        let server = KiteServer::start(&[], threads);
        let mut c = server.client();
        let (set, list) = (
            key_on("slow:set:", 0, threads),
            key_on("slow:list:", 1, threads),
        );
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
            Resp::ok()
        );
        assert_eq!(c.cmd(&["CLIENT", "SETNAME", "pusher"]), Resp::ok());
        assert_eq!(c.cmd(&["SLOWLOG", "RESET"]), Resp::ok());
        let r = transaction(
            &mut c,
            &[cmd(&["SADD", &set, "a"]), cmd(&["LPUSH", &list, "job"])],
            true,
        );
        assert_eq!(
            exec_items(&r, "EXEC"),
            vec![Resp::Integer(1), Resp::Integer(1)]
        );
        let log = c.cmd(&["SLOWLOG", "GET", "100"]);
        let entries = log.as_array().expect("SLOWLOG GET array");
        for name in ["SADD", "LPUSH"] {
            let entry = entries
                .iter()
                .filter_map(|e| e.as_array())
                .find(|e| {
                    e.get(3)
                        .and_then(|a| a.as_array())
                        .and_then(|a| a.first())
                        .and_then(|c| c.as_string())
                        .is_some_and(|c| c.eq_ignore_ascii_case(name))
                })
                .unwrap_or_else(|| panic!("threads {threads}: no {name} in {log}"));
            assert_eq!(
                entry.get(5).and_then(|n| n.as_string()).as_deref(),
                Some("pusher"),
                "threads {threads}: {name} entry {entry:?}"
            );
            let addr = entry.get(4).and_then(|a| a.as_string()).unwrap_or_default();
            assert!(
                addr.starts_with("127.0.0.1:"),
                "threads {threads}: {name} entry {entry:?}"
            );
        }
    }
}
