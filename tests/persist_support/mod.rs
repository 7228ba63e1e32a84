//! Helpers shared by the persistence suites (`persistence.rs`, `persistence_commands.rs`):
//!
//! - [`dataset`]: reads a server's whole dataset through ordinary commands into a
//!   comparable [`Dataset`], and [`assert_same_dataset`] compares two of them with a
//!   readable diff. `scripts/rdb_fixtures.py` reads the fixture servers by the same rules
//!   and writes the result in the text format that [`parse_dataset_text`] reads.
//! - [`fill_dataset`]: one deterministic dataset with every type in every encoding that
//!   Redis 7.0 has (checked on the reference with [`check_reference_encodings`]).
//! - RDB bytes: Redis's CRC-64 ([`crc64`]), encoders for the old value formats (ziplist,
//!   zipmap, intset) used to assemble files by hand, and a tiny reader that finds a key
//!   in a file (to check which encoding a file really holds).
//! - Process helpers: a per-test temporary directory, starting a server on a directory,
//!   starting one that must fail, bounded polling, INFO fields.
#![allow(dead_code)]

use crate::common::*;
mod rdb_bytes;
pub use rdb_bytes::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------------------
// Temporary directories, time, polling
// ---------------------------------------------------------------------------

static DIR_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory under the system temp dir, removed (with its contents) on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let seq = DIR_SEQ.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "kite-persist-{tag}-{}-{seq}-{nanos}",
            std::process::id()
        ));
        fs::create_dir_all(&p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The directory as a command-line argument.
    pub fn arg(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Milliseconds since the Unix epoch on this machine's clock.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub fn now_secs() -> i64 {
    now_ms() / 1000
}

/// Polls `f` every 20 ms until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// One field of `INFO section`, or None when the section has no such field.
pub fn info_field(c: &mut Client, section: &str, field: &str) -> Option<String> {
    let text = c
        .cmd(&["INFO", section])
        .as_string()
        .unwrap_or_else(|| panic!("INFO {section} did not return text"));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// Like [`info_field`], panicking (with the whole section) when the field is missing.
pub fn info_req(c: &mut Client, section: &str, field: &str) -> String {
    info_field(c, section, field).unwrap_or_else(|| {
        let text = c.cmd(&["INFO", section]).as_string().unwrap_or_default();
        panic!("INFO {section} has no field {field}:\n{text}")
    })
}

/// Waits (bounded) until `INFO persistence` says no BGSAVE is running, then asserts the
/// last one succeeded.
pub fn wait_bgsave_done(c: &mut Client) {
    let done = wait_until(Duration::from_secs(30), || {
        info_req(c, "persistence", "rdb_bgsave_in_progress") == "0"
    });
    assert!(done, "rdb_bgsave_in_progress stayed 1 for 30 s");
    assert_eq!(
        info_req(c, "persistence", "rdb_last_bgsave_status"),
        "ok",
        "rdb_last_bgsave_status after BGSAVE"
    );
}

/// Waits (bounded) until the process has exited.
pub fn wait_exit(s: &mut ServerProcess, what: &str) {
    let exited = wait_until(Duration::from_secs(20), || !s.is_running());
    assert!(exited, "{what}: {} still running after 20 s", s.name);
}

// ---------------------------------------------------------------------------
// Starting servers on a directory
// ---------------------------------------------------------------------------

/// Starts the server under test on `dir`/`dbfilename` with no save points (plus `extra`,
/// which may override `--save`).
pub fn kite_on(dir: &TempDir, dbfilename: &str, threads: usize, extra: &[&str]) -> KiteServer {
    let d = dir.arg();
    let mut args: Vec<&str> = vec!["--dir", &d, "--dbfilename", dbfilename, "--save", ""];
    args.extend_from_slice(extra);
    KiteServer::start(&args, threads)
}

/// Starts the reference redis-server on `dir`/`dbfilename` (no save points).
pub fn redis_on(dir: &TempDir, dbfilename: &str, extra: &[&str]) -> RedisServer {
    let d = dir.arg();
    let mut args: Vec<&str> = vec!["--dir", &d, "--dbfilename", dbfilename];
    args.extend_from_slice(extra);
    RedisServer::start_with(&args)
}

/// A server process started by [`start_expect_exit`] that exited by itself.
pub struct Exited {
    pub status: ExitStatus,
    /// stdout and stderr together.
    pub output: String,
}

/// Starts the server under test (`KITE_BIN`) on `dir`/`dbfilename` and expects it to
/// exit by itself within 20 s (a corrupt file must stop start-up). Panics, with its
/// output, if it is still running then (it is killed first).
pub fn start_expect_exit(dir: &TempDir, dbfilename: &str, extra: &[&str]) -> Exited {
    start_bin_expect_exit(&kite_bin(), kite_is_redis(), dir, dbfilename, extra)
}

/// Like [`start_expect_exit`] for the reference redis-server.
pub fn start_redis_expect_exit(dir: &TempDir, dbfilename: &str, extra: &[&str]) -> Exited {
    start_bin_expect_exit(&redis_server_bin(), true, dir, dbfilename, extra)
}

fn start_bin_expect_exit(
    bin: &Path,
    redis_style: bool,
    dir: &TempDir,
    dbfilename: &str,
    extra: &[&str],
) -> Exited {
    let port = free_port().to_string();
    let log_path = std::env::temp_dir().join(format!(
        "kite-persist-exit-{}-{port}.log",
        std::process::id()
    ));
    let log = fs::File::create(&log_path).expect("create log");
    let mut args: Vec<String> = vec![
        "--port".into(),
        port.clone(),
        "--bind".into(),
        "127.0.0.1".into(),
    ];
    if redis_style {
        args.extend(["--appendonly".into(), "no".into()]);
    } else {
        args.extend(["--threads".into(), "1".into()]);
    }
    args.extend([
        "--dir".into(),
        dir.arg(),
        "--dbfilename".into(),
        dbfilename.into(),
        "--save".into(),
        "".into(),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut child = Command::new(bin)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break Some(st);
        }
        if Instant::now() > deadline {
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let output = |p: &Path| String::from_utf8_lossy(&fs::read(p).unwrap_or_default()).into_owned();
    match status {
        Some(status) => {
            let out = output(&log_path);
            let _ = fs::remove_file(&log_path);
            Exited {
                status,
                output: out,
            }
        }
        None => {
            let _ = child.kill();
            let _ = child.wait();
            let out = output(&log_path);
            let _ = fs::remove_file(&log_path);
            panic!(
                "{} {} was still running 20 s after start (it should have refused the file); \
                 output:\n{out}",
                bin.display(),
                args.join(" ")
            );
        }
    }
}

/// Runs `redis-check-rdb` (redis-tools) on a file and panics with its output unless it
/// exits 0.
pub fn assert_redis_check_rdb_ok(file: &Path) {
    let bin = which("redis-check-rdb").unwrap_or_else(|| {
        panic!("redis-check-rdb not found on PATH (apt-get install redis-tools)")
    });
    let out = Command::new(&bin)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "redis-check-rdb {} exited with {}:\n{}{}",
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn which(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Copies `from` to `dir`/`name`.
pub fn copy_into(from: &Path, dir: &TempDir, name: &str) {
    fs::copy(from, dir.file(name))
        .unwrap_or_else(|e| panic!("copy {} into {}: {e}", from.display(), dir.arg()));
}

// ---------------------------------------------------------------------------
// The dataset model
// ---------------------------------------------------------------------------

/// Everything a server holds: (db, key) -> value and expiry.
pub type Dataset = BTreeMap<(usize, Vec<u8>), Item>;

/// How far apart two absolute times read from two servers may be (expiry, delivery
/// times of pending entries, consumers' last-seen times). They are derived from
/// PTTL / idle times and this machine's clock at the moment of reading.
pub const TIME_TOLERANCE_MS: i64 = 3000;

#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub value: Value,
    /// Absolute expiry (ms since the epoch), from PTTL plus this machine's clock.
    pub expire_at: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    String(Vec<u8>),
    List(Vec<Vec<u8>>),
    /// Members sorted bytewise.
    Set(Vec<Vec<u8>>),
    /// Pairs sorted by field.
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// ZRANGE 0 -1 WITHSCORES order; scores parsed (7.0 and 7.2 print doubles
    /// differently: "0.10000000000000001" and "0.1" are the same score).
    ZSet(Vec<(Vec<u8>, f64)>),
    Stream(Stream),
}

/// A stream entry: its id and its field/value pairs in order.
pub type StreamEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

#[derive(Clone, Debug, PartialEq)]
pub struct Stream {
    /// XRANGE - +.
    pub entries: Vec<StreamEntry>,
    /// Fields of XINFO STREAM that the file stores (see [`STREAM_META`]), as text
    /// ("nil" for a null). A field the server does not report is absent.
    pub meta: BTreeMap<String, String>,
    /// Groups sorted by name.
    pub groups: Vec<Group>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub name: Vec<u8>,
    /// Fields of XINFO GROUPS (see [`GROUP_META`]).
    pub meta: BTreeMap<String, String>,
    /// XPENDING key group - + N: (id, consumer, delivery count, delivered at (ms,
    /// now minus idle)).
    pub pending: Vec<(String, Vec<u8>, i64, i64)>,
    /// Consumers sorted by name.
    pub consumers: Vec<Consumer>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Consumer {
    pub name: Vec<u8>,
    /// Fields of XINFO CONSUMERS (see [`CONSUMER_META`]).
    pub meta: BTreeMap<String, String>,
    /// Last seen (ms; now minus XINFO CONSUMERS idle).
    pub seen_at: i64,
    /// XPENDING key group - + N consumer: (id, delivery count).
    pub pending: Vec<(String, i64)>,
}

/// XINFO STREAM fields that reflect what the RDB file stores. Radix-tree sizes are
/// left out (they depend on the implementation), so are first/last entry (XRANGE has
/// them).
pub const STREAM_META: &[&str] = &[
    "length",
    "last-generated-id",
    "max-deleted-entry-id",
    "entries-added",
    "recorded-first-entry-id",
];
/// XINFO GROUPS fields stored by the file. "lag" is left out: it is derived, not
/// stored, and its computation is not a persistence matter.
pub const GROUP_META: &[&str] = &["consumers", "pending", "last-delivered-id", "entries-read"];
/// XINFO CONSUMERS fields (idle / inactive are times: see `seen_at`).
pub const CONSUMER_META: &[&str] = &["pending"];

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::String(_) => "string",
            Value::List(_) => "list",
            Value::Set(_) => "set",
            Value::Hash(_) => "hash",
            Value::ZSet(_) => "zset",
            Value::Stream(_) => "stream",
        }
    }

    /// A one-line summary ("list of 5000 elements: "a", "b", ...").
    pub fn summary(&self) -> String {
        fn first<T>(v: &[T], f: impl Fn(&T) -> String) -> String {
            let mut s: Vec<String> = v.iter().take(3).map(f).collect();
            if v.len() > 3 {
                s.push("...".into());
            }
            s.join(", ")
        }
        match self {
            Value::String(b) => format!("string of {} bytes: {}", b.len(), short(b)),
            Value::List(v) => format!("list of {}: {}", v.len(), first(v, |x| short(x))),
            Value::Set(v) => format!("set of {}: {}", v.len(), first(v, |x| short(x))),
            Value::Hash(v) => format!(
                "hash of {}: {}",
                v.len(),
                first(v, |(f, x)| format!("{}={}", short(f), short(x)))
            ),
            Value::ZSet(v) => format!(
                "zset of {}: {}",
                v.len(),
                first(v, |(m, s)| format!("{}:{s}", short(m)))
            ),
            Value::Stream(s) => format!(
                "stream of {} entries, {} groups",
                s.entries.len(),
                s.groups.len()
            ),
        }
    }
}

/// Escaped, cut to 40 bytes.
pub fn short(b: &[u8]) -> String {
    if b.len() <= 40 {
        escape_bytes(b)
    } else {
        format!("{}...({} bytes)", escape_bytes(&b[..40]), b.len())
    }
}

fn key_name(k: &(usize, Vec<u8>)) -> String {
    format!("db {} key {}", k.0, short(&k.1))
}

// ---------------------------------------------------------------------------
// Reading a dataset through ordinary commands
// ---------------------------------------------------------------------------

/// Databases read by [`dataset`] (Redis's default `databases 16`).
pub const DBS: usize = 16;

fn expect_array<'a>(r: &'a Resp, what: &str) -> &'a [Resp] {
    r.as_array()
        .unwrap_or_else(|| panic!("{what}: expected an array, got {r}"))
}

fn expect_bytes(r: &Resp, what: &str) -> Vec<u8> {
    r.as_bytes()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {r}"))
        .to_vec()
}

fn text(r: &Resp) -> String {
    match r {
        Resp::Integer(i) => i.to_string(),
        r if r.is_null() => "nil".into(),
        r => match r.as_bytes() {
            Some(b) => String::from_utf8_lossy(b).into_owned(),
            None => format!("{r}"),
        },
    }
}

/// A flat [k1, v1, k2, v2, ...] reply (XINFO in RESP2) as pairs; also accepts maps.
fn flat_pairs(r: &Resp, what: &str) -> Vec<(String, Resp)> {
    if let Resp::Map(m) = r {
        return m.iter().map(|(k, v)| (text(k), v.clone())).collect();
    }
    let a = expect_array(r, what);
    assert!(
        a.len().is_multiple_of(2),
        "{what}: odd-length field list {r}"
    );
    a.chunks(2).map(|p| (text(&p[0]), p[1].clone())).collect()
}

fn pick_meta(pairs: &[(String, Resp)], names: &[&str]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .filter(|(k, _)| names.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), text(v)))
        .collect()
}

fn get_field<'a>(pairs: &'a [(String, Resp)], name: &str, what: &str) -> &'a Resp {
    &pairs
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("{what}: no field {name}"))
        .1
}

/// All keys of the selected database (SCAN to the end; a key may be reported twice).
pub fn scan_all(c: &mut Client) -> BTreeSet<Vec<u8>> {
    let mut keys = BTreeSet::new();
    let mut cursor = b"0".to_vec();
    for _ in 0..100_000 {
        let r = c.cmd(&[b"SCAN".as_slice(), &cursor, b"COUNT", b"1000"]);
        let a = expect_array(&r, "SCAN");
        cursor = expect_bytes(&a[0], "SCAN cursor");
        for k in expect_array(&a[1], "SCAN keys") {
            keys.insert(expect_bytes(k, "SCAN key"));
        }
        if cursor == b"0" {
            return keys;
        }
    }
    panic!("SCAN did not finish in 100000 calls");
}

/// Reads every key of databases 0..16 with SCAN, TYPE and the type's read command.
/// Leaves database 0 selected.
pub fn dataset(c: &mut Client) -> Dataset {
    let mut out = BTreeMap::new();
    for db in 0..DBS {
        let r = c.cmd(&["SELECT", &db.to_string()]);
        assert_eq!(r, Resp::ok(), "SELECT {db}");
        for key in scan_all(c) {
            if let Some(item) = read_item(c, &key) {
                out.insert((db, key), item);
            }
        }
    }
    assert_eq!(c.cmd(&["SELECT", "0"]), Resp::ok());
    out
}

/// Reads one key of the selected database (None when it is gone).
pub fn read_item(c: &mut Client, key: &[u8]) -> Option<Item> {
    let k = key;
    let what = |cmd: &str| format!("{cmd} {}", short(k));
    let ty = text(&c.cmd(&[b"TYPE".as_slice(), k]));
    let value = match ty.as_str() {
        "none" => return None,
        "string" => {
            let r = c.cmd(&[b"GET".as_slice(), k]);
            if r.is_null() {
                return None;
            }
            Value::String(expect_bytes(&r, &what("GET")))
        }
        "list" => {
            let r = c.cmd(&[b"LRANGE".as_slice(), k, b"0", b"-1"]);
            Value::List(
                expect_array(&r, &what("LRANGE"))
                    .iter()
                    .map(|x| expect_bytes(x, "LRANGE element"))
                    .collect(),
            )
        }
        "set" => {
            let r = c.cmd(&[b"SMEMBERS".as_slice(), k]);
            let mut v: Vec<Vec<u8>> = expect_array(&r, &what("SMEMBERS"))
                .iter()
                .map(|x| expect_bytes(x, "SMEMBERS member"))
                .collect();
            v.sort();
            Value::Set(v)
        }
        "hash" => {
            let r = c.cmd(&[b"HGETALL".as_slice(), k]);
            let a = expect_array(&r, &what("HGETALL"));
            let mut v: Vec<(Vec<u8>, Vec<u8>)> = a
                .chunks(2)
                .map(|p| (expect_bytes(&p[0], "field"), expect_bytes(&p[1], "value")))
                .collect();
            v.sort();
            Value::Hash(v)
        }
        "zset" => {
            let r = c.cmd(&[b"ZRANGE".as_slice(), k, b"0", b"-1", b"WITHSCORES"]);
            let a = expect_array(&r, &what("ZRANGE"));
            Value::ZSet(
                a.chunks(2)
                    .map(|p| {
                        let s = text(&p[1]);
                        (expect_bytes(&p[0], "member"), parse_score(&s))
                    })
                    .collect(),
            )
        }
        "stream" => Value::Stream(read_stream(c, k)),
        other => panic!("TYPE {} gave an unknown type {other:?}", short(k)),
    };
    let before = now_ms();
    let pttl = c
        .cmd(&[b"PTTL".as_slice(), k])
        .as_int()
        .unwrap_or_else(|| panic!("PTTL {} is not an integer", short(k)));
    let expire_at = match pttl {
        -2 => return None,
        -1 => None,
        n if n >= 0 => Some(before + n),
        n => panic!("PTTL {} = {n}", short(k)),
    };
    Some(Item { value, expire_at })
}

/// Parses a score as Redis prints it (inf, -inf, 17 digits or shortest form).
pub fn parse_score(s: &str) -> f64 {
    match s {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        _ => s
            .parse()
            .unwrap_or_else(|_| panic!("score {s:?} is not a number")),
    }
}

fn read_stream(c: &mut Client, k: &[u8]) -> Stream {
    let r = c.cmd(&[b"XRANGE".as_slice(), k, b"-", b"+"]);
    let entries = expect_array(&r, "XRANGE")
        .iter()
        .map(|e| {
            let e = expect_array(e, "XRANGE entry");
            let id = text(&e[0]);
            let fv = expect_array(&e[1], "XRANGE fields");
            let pairs = fv
                .chunks(2)
                .map(|p| (expect_bytes(&p[0], "field"), expect_bytes(&p[1], "value")))
                .collect();
            (id, pairs)
        })
        .collect();
    let info = c.cmd(&[b"XINFO".as_slice(), b"STREAM", k]);
    let meta = pick_meta(&flat_pairs(&info, "XINFO STREAM"), STREAM_META);
    let r = c.cmd(&[b"XINFO".as_slice(), b"GROUPS", k]);
    let mut groups = Vec::new();
    for g in expect_array(&r, "XINFO GROUPS") {
        let pairs = flat_pairs(g, "XINFO GROUPS entry");
        let name = expect_bytes(get_field(&pairs, "name", "XINFO GROUPS"), "group name");
        let meta = pick_meta(&pairs, GROUP_META);
        let now = now_ms();
        let r = c.cmd(&[b"XPENDING".as_slice(), k, &name, b"-", b"+", b"1000000"]);
        let pending = expect_array(&r, "XPENDING")
            .iter()
            .map(|p| {
                let p = expect_array(p, "XPENDING entry");
                let idle = p[2].as_int().expect("XPENDING idle");
                (
                    text(&p[0]),
                    expect_bytes(&p[1], "XPENDING consumer"),
                    p[3].as_int().expect("XPENDING count"),
                    now - idle,
                )
            })
            .collect();
        let now = now_ms();
        let r = c.cmd(&[b"XINFO".as_slice(), b"CONSUMERS", k, &name]);
        let mut consumers = Vec::new();
        for cr in expect_array(&r, "XINFO CONSUMERS") {
            let pairs = flat_pairs(cr, "XINFO CONSUMERS entry");
            let cname = expect_bytes(get_field(&pairs, "name", "XINFO CONSUMERS"), "name");
            let idle = get_field(&pairs, "idle", "XINFO CONSUMERS")
                .as_int()
                .expect("consumer idle");
            consumers.push(Consumer {
                name: cname,
                meta: pick_meta(&pairs, CONSUMER_META),
                seen_at: now - idle,
                pending: Vec::new(),
            });
        }
        for cons in consumers.iter_mut() {
            let r = c.cmd(&[
                b"XPENDING".as_slice(),
                k,
                &name,
                b"-",
                b"+",
                b"1000000",
                &cons.name,
            ]);
            cons.pending = expect_array(&r, "XPENDING consumer")
                .iter()
                .map(|p| {
                    let p = expect_array(p, "XPENDING entry");
                    (text(&p[0]), p[3].as_int().expect("count"))
                })
                .collect();
        }
        consumers.sort_by(|a, b| a.name.cmp(&b.name));
        groups.push(Group {
            name,
            meta,
            pending,
            consumers,
        });
    }
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    Stream {
        entries,
        meta,
        groups,
    }
}

/// Number of keys per database in a dataset.
pub fn key_counts(d: &Dataset) -> BTreeMap<usize, usize> {
    let mut m = BTreeMap::new();
    for (db, _) in d.keys() {
        *m.entry(*db).or_insert(0) += 1;
    }
    m
}

/// Asserts DBSIZE of every database equals the number of keys `expected` has there
/// (catches keys that were loaded although already expired: SCAN hides them, DBSIZE
/// counts them).
pub fn assert_dbsizes(c: &mut Client, expected: &Dataset, what: &str) {
    let counts = key_counts(expected);
    let mut problems = Vec::new();
    for db in 0..DBS {
        assert_eq!(c.cmd(&["SELECT", &db.to_string()]), Resp::ok());
        let n = c.cmd(&["DBSIZE"]).as_int().expect("DBSIZE");
        let want = *counts.get(&db).unwrap_or(&0) as i64;
        if n != want {
            problems.push(format!("db {db}: DBSIZE {n}, expected {want}"));
        }
    }
    assert_eq!(c.cmd(&["SELECT", "0"]), Resp::ok());
    assert!(problems.is_empty(), "{what}: {}", problems.join("; "));
}

// ---------------------------------------------------------------------------
// Comparing datasets
// ---------------------------------------------------------------------------

fn near(a: i64, b: i64) -> bool {
    (a - b).abs() <= TIME_TOLERANCE_MS
}

fn same_score(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// The differences between two values (empty when equal up to time tolerances).
pub fn value_diff(exp: &Value, act: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match (exp, act) {
        (Value::String(a), Value::String(b)) => {
            if a != b {
                let i = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
                out.push(format!(
                    "string differs at byte {i} (lengths {} and {}): expected {} got {}",
                    a.len(),
                    b.len(),
                    short(&a[i.min(a.len())..]),
                    short(&b[i.min(b.len())..])
                ));
            }
        }
        (Value::List(a), Value::List(b)) => {
            if a != b {
                let i = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
                out.push(format!(
                    "list differs at index {i} (lengths {} and {}): expected {} got {}",
                    a.len(),
                    b.len(),
                    a.get(i).map(|x| short(x)).unwrap_or("(end)".into()),
                    b.get(i).map(|x| short(x)).unwrap_or("(end)".into())
                ));
            }
        }
        (Value::Set(a), Value::Set(b)) => {
            let (sa, sb): (BTreeSet<_>, BTreeSet<_>) = (a.iter().collect(), b.iter().collect());
            let missing: Vec<String> = sa.difference(&sb).take(5).map(|x| short(x)).collect();
            let extra: Vec<String> = sb.difference(&sa).take(5).map(|x| short(x)).collect();
            if !missing.is_empty() || !extra.is_empty() || a.len() != b.len() {
                out.push(format!(
                    "set (sizes {} and {}): missing [{}] unexpected [{}]",
                    a.len(),
                    b.len(),
                    missing.join(", "),
                    extra.join(", ")
                ));
            }
        }
        (Value::Hash(a), Value::Hash(b)) => {
            if a != b {
                let ma: BTreeMap<_, _> = a.iter().cloned().collect();
                let mb: BTreeMap<_, _> = b.iter().cloned().collect();
                let mut lines = Vec::new();
                for (f, v) in &ma {
                    match mb.get(f) {
                        None => lines.push(format!("field {} missing", short(f))),
                        Some(w) if w != v => lines.push(format!(
                            "field {}: expected {} got {}",
                            short(f),
                            short(v),
                            short(w)
                        )),
                        _ => {}
                    }
                }
                for f in mb.keys().filter(|f| !ma.contains_key(*f)) {
                    lines.push(format!("unexpected field {}", short(f)));
                }
                lines.truncate(5);
                out.push(format!(
                    "hash (sizes {} and {}): {}",
                    a.len(),
                    b.len(),
                    lines.join("; ")
                ));
            }
        }
        (Value::ZSet(a), Value::ZSet(b)) => {
            let i = a
                .iter()
                .zip(b.iter())
                .take_while(|((m1, s1), (m2, s2))| m1 == m2 && same_score(*s1, *s2))
                .count();
            if i != a.len() || a.len() != b.len() {
                let show = |v: &[(Vec<u8>, f64)]| {
                    v.get(i)
                        .map(|(m, s)| format!("{} score {s:?}", short(m)))
                        .unwrap_or("(end)".into())
                };
                out.push(format!(
                    "zset differs at rank {i} (sizes {} and {}): expected {} got {}",
                    a.len(),
                    b.len(),
                    show(a),
                    show(b)
                ));
            }
        }
        (Value::Stream(a), Value::Stream(b)) => stream_diff(a, b, &mut out),
        _ => out.push(format!(
            "type differs: expected {} got {}",
            exp.summary(),
            act.summary()
        )),
    }
    out
}

fn meta_diff(
    what: &str,
    a: &BTreeMap<String, String>,
    b: &BTreeMap<String, String>,
    out: &mut Vec<String>,
) {
    if a != b {
        out.push(format!("{what}: expected {a:?} got {b:?}"));
    }
}

fn stream_diff(a: &Stream, b: &Stream, out: &mut Vec<String>) {
    if a.entries != b.entries {
        let i = a
            .entries
            .iter()
            .zip(b.entries.iter())
            .take_while(|(x, y)| x == y)
            .count();
        let show = |v: &[StreamEntry]| {
            v.get(i)
                .map(|(id, f)| {
                    let fs: Vec<String> = f
                        .iter()
                        .map(|(k, v)| format!("{}={}", short(k), short(v)))
                        .collect();
                    format!("{id} {}", fs.join(" "))
                })
                .unwrap_or("(end)".into())
        };
        out.push(format!(
            "stream entries differ at {i} ({} and {} entries): expected {} got {}",
            a.entries.len(),
            b.entries.len(),
            show(&a.entries),
            show(&b.entries)
        ));
    }
    meta_diff("XINFO STREAM", &a.meta, &b.meta, out);
    let names = |s: &Stream| -> Vec<String> { s.groups.iter().map(|g| short(&g.name)).collect() };
    if names(a) != names(b) {
        out.push(format!(
            "groups: expected [{}] got [{}]",
            names(a).join(", "),
            names(b).join(", ")
        ));
        return;
    }
    for (ga, gb) in a.groups.iter().zip(b.groups.iter()) {
        let gname = short(&ga.name);
        meta_diff(&format!("group {gname}"), &ga.meta, &gb.meta, out);
        let strip = |p: &[(String, Vec<u8>, i64, i64)]| -> Vec<(String, Vec<u8>, i64)> {
            p.iter()
                .map(|(i, c, n, _)| (i.clone(), c.clone(), *n))
                .collect()
        };
        if strip(&ga.pending) != strip(&gb.pending) {
            let show = |p: &[(String, Vec<u8>, i64, i64)]| -> String {
                p.iter()
                    .take(8)
                    .map(|(i, c, n, _)| format!("{i}@{}x{n}", short(c)))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            out.push(format!(
                "group {gname} XPENDING: expected [{}] got [{}]",
                show(&ga.pending),
                show(&gb.pending)
            ));
        } else {
            for (pa, pb) in ga.pending.iter().zip(gb.pending.iter()) {
                if !near(pa.3, pb.3) {
                    out.push(format!(
                        "group {gname} entry {}: delivered {} ms ago expected, {} ms ago got",
                        pa.0,
                        now_ms() - pa.3,
                        now_ms() - pb.3
                    ));
                }
            }
        }
        let cnames =
            |g: &Group| -> Vec<String> { g.consumers.iter().map(|c| short(&c.name)).collect() };
        if cnames(ga) != cnames(gb) {
            out.push(format!(
                "group {gname} consumers: expected [{}] got [{}]",
                cnames(ga).join(", "),
                cnames(gb).join(", ")
            ));
            continue;
        }
        for (ca, cb) in ga.consumers.iter().zip(gb.consumers.iter()) {
            let cn = format!("group {gname} consumer {}", short(&ca.name));
            meta_diff(&cn, &ca.meta, &cb.meta, out);
            if ca.pending != cb.pending {
                out.push(format!(
                    "{cn} XPENDING: expected {:?} got {:?}",
                    ca.pending, cb.pending
                ));
            }
            if !near(ca.seen_at, cb.seen_at) {
                out.push(format!(
                    "{cn}: seen {} ms ago expected, {} ms ago got",
                    now_ms() - ca.seen_at,
                    now_ms() - cb.seen_at
                ));
            }
        }
    }
}

/// All differences between two datasets, one line each.
pub fn dataset_diff(expected: &Dataset, actual: &Dataset) -> Vec<String> {
    let mut out = Vec::new();
    for (k, e) in expected {
        match actual.get(k) {
            None => out.push(format!("{}: missing ({})", key_name(k), e.value.summary())),
            Some(a) => {
                for d in value_diff(&e.value, &a.value) {
                    out.push(format!("{}: {d}", key_name(k)));
                }
                match (e.expire_at, a.expire_at) {
                    (None, None) => {}
                    (Some(x), Some(y)) if near(x, y) => {}
                    (x, y) => {
                        let show = |t: Option<i64>| match t {
                            None => "no expiry".to_string(),
                            Some(t) => format!("expiry at {t} (in {} ms)", t - now_ms()),
                        };
                        out.push(format!(
                            "{}: expected {}, got {}",
                            key_name(k),
                            show(x),
                            show(y)
                        ))
                    }
                }
            }
        }
    }
    for (k, a) in actual {
        if !expected.contains_key(k) {
            out.push(format!(
                "{}: unexpected ({})",
                key_name(k),
                a.value.summary()
            ));
        }
    }
    out
}

/// Panics with a readable diff when `actual` differs from `expected`; both datasets are
/// also written (text format) to the temp dir for a closer look.
#[track_caller]
pub fn assert_same_dataset(expected: &Dataset, actual: &Dataset, what: &str) {
    assert!(
        !expected.is_empty(),
        "{what}: the expected dataset is empty"
    );
    let diff = dataset_diff(expected, actual);
    if diff.is_empty() {
        return;
    }
    let base = std::env::temp_dir().join(format!(
        "kite-persist-diff-{}-{}",
        std::process::id(),
        DIR_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::write(
        base.with_extension("expected.txt"),
        dataset_text(expected, "expected"),
    );
    let _ = fs::write(
        base.with_extension("actual.txt"),
        dataset_text(actual, "actual"),
    );
    let shown: Vec<&String> = diff.iter().take(40).collect();
    panic!(
        "{what}: {} difference(s) ({} keys expected, {} found):\n  {}\n{}(both datasets written to {}.{{expected,actual}}.txt)",
        diff.len(),
        expected.len(),
        actual.len(),
        shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  "),
        if diff.len() > 40 { "  ...\n" } else { "" },
        base.display()
    );
}

/// Drops from `actual`'s stream, group and consumer fields those that `expected` lacks
/// (a fixture read from Redis 6.2 has no entries-added, entries-read, ...).
pub fn restrict_meta_to(expected: &Dataset, actual: &mut Dataset) {
    fn keep(e: &BTreeMap<String, String>, a: &mut BTreeMap<String, String>) {
        a.retain(|k, _| e.contains_key(k));
    }
    for (k, item) in actual.iter_mut() {
        let (
            Some(Item {
                value: Value::Stream(es),
                ..
            }),
            Value::Stream(s),
        ) = (expected.get(k), &mut item.value)
        else {
            continue;
        };
        keep(&es.meta, &mut s.meta);
        for g in s.groups.iter_mut() {
            if let Some(eg) = es.groups.iter().find(|x| x.name == g.name) {
                keep(&eg.meta, &mut g.meta);
                for c in g.consumers.iter_mut() {
                    if let Some(ec) = eg.consumers.iter().find(|x| x.name == c.name) {
                        keep(&ec.meta, &mut c.meta);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The text format of a dataset (fixtures: tests/fixtures/rdb/*.dataset)
// ---------------------------------------------------------------------------
//
// One record a line, fields separated by one space; byte strings in lower-case hex,
// "-" for the empty string; times in ms since the epoch, "-" for none.
//
//   K <db> <key> <type> <expire_at>       starts a key
//   S <value>                             string value
//   L <element>                           list element (in order)
//   M <member>                            set member
//   H <field> <value>                     hash pair
//   Z <member> <score as Redis printed it>
//   E <id> <field> <value> <field> <value> ...   stream entry (XRANGE order)
//   I <name> <text>                       XINFO STREAM field ("nil" for a null)
//   G <group>                             starts a group of the last stream
//   g <name> <text>                       XINFO GROUPS field ("nil" for a null)
//   P <id> <consumer> <count> <delivered_at>   XPENDING entry of the group
//   C <consumer> <seen_at>                starts a consumer of the group
//   c <name> <text>                       XINFO CONSUMERS field ("nil" for a null)
//   p <id> <count>                        XPENDING entry of the consumer
//   # ...                                 comment

pub fn hex(b: &[u8]) -> String {
    if b.is_empty() {
        return "-".into();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    if s == "-" {
        return Vec::new();
    }
    assert!(s.len().is_multiple_of(2), "odd hex string {s:?}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|_| panic!("bad hex {s:?}")))
        .collect()
}

/// Writes a dataset in the text format (scores with Rust's formatting).
pub fn dataset_text(d: &Dataset, title: &str) -> String {
    let mut s = format!("# {title}\n");
    let t = |x: Option<i64>| x.map(|v| v.to_string()).unwrap_or("-".into());
    for ((db, key), item) in d {
        let _ = writeln!(
            s,
            "K {db} {} {} {}",
            hex(key),
            item.value.type_name(),
            t(item.expire_at)
        );
        match &item.value {
            Value::String(v) => {
                let _ = writeln!(s, "S {}", hex(v));
            }
            Value::List(v) => v.iter().for_each(|x| {
                let _ = writeln!(s, "L {}", hex(x));
            }),
            Value::Set(v) => v.iter().for_each(|x| {
                let _ = writeln!(s, "M {}", hex(x));
            }),
            Value::Hash(v) => v.iter().for_each(|(f, x)| {
                let _ = writeln!(s, "H {} {}", hex(f), hex(x));
            }),
            Value::ZSet(v) => v.iter().for_each(|(m, sc)| {
                let _ = writeln!(s, "Z {} {sc}", hex(m));
            }),
            Value::Stream(st) => {
                for (id, fv) in &st.entries {
                    let _ = write!(s, "E {id}");
                    for (f, v) in fv {
                        let _ = write!(s, " {} {}", hex(f), hex(v));
                    }
                    s.push('\n');
                }
                for (k, v) in &st.meta {
                    let _ = writeln!(s, "I {k} {v}");
                }
                for g in &st.groups {
                    let _ = writeln!(s, "G {}", hex(&g.name));
                    for (k, v) in &g.meta {
                        let _ = writeln!(s, "g {k} {v}");
                    }
                    for (id, c, n, at) in &g.pending {
                        let _ = writeln!(s, "P {id} {} {n} {at}", hex(c));
                    }
                    for c in &g.consumers {
                        let _ = writeln!(s, "C {} {}", hex(&c.name), c.seen_at);
                        for (k, v) in &c.meta {
                            let _ = writeln!(s, "c {k} {v}");
                        }
                        for (id, n) in &c.pending {
                            let _ = writeln!(s, "p {id} {n}");
                        }
                    }
                }
            }
        }
    }
    s
}

/// Parses the text format (see above).
pub fn parse_dataset_text(text: &str) -> Dataset {
    let mut d: Dataset = BTreeMap::new();
    let mut cur: Option<(usize, Vec<u8>)> = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(' ').collect();
        let ctx = || format!("line {}: {line}", n + 1);
        let num = |s: &str| -> i64 {
            s.parse()
                .unwrap_or_else(|_| panic!("bad number, {}", ctx()))
        };
        if f[0] == "K" {
            let key = (f[1].parse::<usize>().expect("db"), unhex(f[2]));
            let value = match f[3] {
                "string" => Value::String(Vec::new()),
                "list" => Value::List(Vec::new()),
                "set" => Value::Set(Vec::new()),
                "hash" => Value::Hash(Vec::new()),
                "zset" => Value::ZSet(Vec::new()),
                "stream" => Value::Stream(Stream {
                    entries: Vec::new(),
                    meta: BTreeMap::new(),
                    groups: Vec::new(),
                }),
                other => panic!("unknown type {other}, {}", ctx()),
            };
            let expire_at = if f[4] == "-" { None } else { Some(num(f[4])) };
            d.insert(key.clone(), Item { value, expire_at });
            cur = Some(key);
            continue;
        }
        let item = d
            .get_mut(
                cur.as_ref()
                    .unwrap_or_else(|| panic!("record before K, {}", ctx())),
            )
            .unwrap();
        match (&mut item.value, f[0]) {
            (Value::String(v), "S") => *v = unhex(f[1]),
            (Value::List(v), "L") => v.push(unhex(f[1])),
            (Value::Set(v), "M") => v.push(unhex(f[1])),
            (Value::Hash(v), "H") => v.push((unhex(f[1]), unhex(f[2]))),
            (Value::ZSet(v), "Z") => v.push((unhex(f[1]), parse_score(f[2]))),
            (Value::Stream(s), "E") => {
                let pairs = f[2..]
                    .chunks(2)
                    .map(|p| (unhex(p[0]), unhex(p[1])))
                    .collect();
                s.entries.push((f[1].to_string(), pairs));
            }
            (Value::Stream(s), "I") => {
                s.meta.insert(f[1].into(), f[2].to_string());
            }
            (Value::Stream(s), "G") => s.groups.push(Group {
                name: unhex(f[1]),
                meta: BTreeMap::new(),
                pending: Vec::new(),
                consumers: Vec::new(),
            }),
            (Value::Stream(s), "g") => {
                let g = s
                    .groups
                    .last_mut()
                    .unwrap_or_else(|| panic!("g before G, {}", ctx()));
                g.meta.insert(f[1].into(), f[2].to_string());
            }
            (Value::Stream(s), "P") => {
                let g = s
                    .groups
                    .last_mut()
                    .unwrap_or_else(|| panic!("P before G, {}", ctx()));
                g.pending
                    .push((f[1].into(), unhex(f[2]), num(f[3]), num(f[4])));
            }
            (Value::Stream(s), "C") => {
                let g = s
                    .groups
                    .last_mut()
                    .unwrap_or_else(|| panic!("C before G, {}", ctx()));
                g.consumers.push(Consumer {
                    name: unhex(f[1]),
                    meta: BTreeMap::new(),
                    seen_at: num(f[2]),
                    pending: Vec::new(),
                });
            }
            (Value::Stream(s), "c" | "p") => {
                let c = s
                    .groups
                    .last_mut()
                    .and_then(|g| g.consumers.last_mut())
                    .unwrap_or_else(|| panic!("{} before C, {}", f[0], ctx()));
                if f[0] == "c" {
                    c.meta.insert(f[1].into(), f[2].to_string());
                } else {
                    c.pending.push((f[1].into(), num(f[2])));
                }
            }
            _ => panic!("record does not fit the current key, {}", ctx()),
        }
    }
    // The same normal forms as `dataset` gives.
    for item in d.values_mut() {
        match &mut item.value {
            Value::Set(v) => v.sort(),
            Value::Hash(v) => v.sort(),
            Value::Stream(s) => {
                s.groups.sort_by(|a, b| a.name.cmp(&b.name));
                for g in s.groups.iter_mut() {
                    g.consumers.sort_by(|a, b| a.name.cmp(&b.name));
                }
            }
            _ => {}
        }
    }
    d
}

// ---------------------------------------------------------------------------
// The common dataset: every type in every encoding Redis 7.0 has
// ---------------------------------------------------------------------------

/// Expiry used for the keys with a TTL: far enough to outlive any test, close enough
/// that a wrong unit (seconds for ms) shows.
pub const TTL_MS: i64 = 100_000_000;

/// The 100 KB compressible string (LZF in the file when rdbcompression is on).
pub fn big_compressible() -> Vec<u8> {
    let mut v = Vec::with_capacity(100 * 1024);
    let mut i = 0u32;
    while v.len() < 100 * 1024 {
        v.extend_from_slice(format!("compressible-{:04}|", i % 50).as_bytes());
        i += 1;
    }
    v.truncate(100 * 1024);
    v
}

/// The element larger than the quicklist's packed threshold (a plain node on the
/// reference once `DEBUG QUICKLIST-PACKED-THRESHOLD 8192` is set).
pub fn huge_element() -> Vec<u8> {
    (0..20_000u32)
        .map(|i| b"0123456789abcdef"[(i * 7 % 16) as usize])
        .collect()
}

/// All byte values once.
pub fn all_bytes() -> Vec<u8> {
    (0..=255u8).collect()
}

fn run_all(c: &mut Client, cmds: &[Args]) {
    for r in c.pipeline(cmds).iter().zip(cmds.iter()) {
        if let (Resp::Error(e), cmd) = r {
            panic!("fill: `{}` failed: {e}", fmt_cmd(cmd));
        }
    }
}

/// Long-ish key name made of one repeated letter (LZF-compressed in the file).
pub fn long_key() -> Vec<u8> {
    let mut k = b"long-key:".to_vec();
    k.resize(200, b'k');
    k
}

/// Fills databases 0, 3 and 15 with the common dataset. Deterministic; every write
/// must succeed. Leaves database 0 selected.
#[rustfmt::skip]
#[allow(clippy::vec_init_then_push)] // one push per line reads as the list of writes it is
pub fn fill_dataset(c: &mut Client) {
    let mut cmds: Vec<Args> = Vec::new();
    cmds.push(args!["SELECT", "0"]);
    // Strings: int, embstr, raw, LZF-compressible, binary, empty key and value.
    cmds.push(args!["SET", "str:int", "12345"]);
    cmds.push(args!["SET", "str:neg", "-42"]);
    cmds.push(args!["SET", "str:int64", "9223372036854775807"]);
    cmds.push(args!["SET", "str:int64min", "-9223372036854775808"]);
    cmds.push(args!["SET", "str:notint", "007"]);
    cmds.push(args!["SET", "str:embstr", "hello world"]);
    cmds.push(args!["SET", "str:raw", long("raw:", 60)]);
    cmds.push(args!["SET", "str:lzf", big_compressible()]);
    cmds.push(args!["SET", "str:bin", all_bytes()]);
    cmds.push(args!["SET", "str:empty", ""]);
    cmds.push(args!["SET", "", ""]);
    cmds.push(args!["SET", b"bin\x00key\xff".to_vec(), b"\x00\x01\x02".to_vec()]);
    cmds.push(args!["SET", long_key(), "long key"]);
    cmds.push(args!["SET", "str:float", "3.14159"]);
    cmds.push(args!["SET", "str:ttl", "expires later", "PX", TTL_MS]);
    cmds.push(args!["SET", "str:ttl-int", "77"]);
    cmds.push(args!["PEXPIRE", "str:ttl-int", TTL_MS + 12345]);
    // Lists: small, integers of every listpack width, big (many nodes), a huge
    // element between small ones.
    cmds.push(args!["RPUSH", "list:small", "a", "b", "c", "", all_bytes(), "1", "-1"]);
    let mut ints = args!["RPUSH", "list:ints"];
    for v in [
        "0", "12", "13", "-1", "127", "128", "-128", "-129", "4095", "4096", "-4096", "32767",
        "32768", "-32768", "8388607", "8388608", "-8388608", "2147483647", "2147483648",
        "-2147483648", "9223372036854775807", "-9223372036854775808", "18446744073709551615",
        "1.5", "00", "+1",
    ] {
        ints.push(v.as_bytes().to_vec());
    }
    cmds.push(ints);
    let mut big = args!["RPUSH", "list:big"];
    for i in 0..5000 {
        big.push(format!("item:{i:05}").into_bytes());
    }
    cmds.push(big);
    cmds.push(args!["RPUSH", "list:plain", "before", huge_element(), "after"]);
    cmds.push(args!["LPUSH", "list:plain", "first"]);
    cmds.push(args!["RPUSH", "list:ttl", "x", "y"]);
    cmds.push(args!["PEXPIRE", "list:ttl", TTL_MS]);
    // Sets: intset (16- and 64-bit), small strings, big strings, many integers.
    cmds.push(args!["SADD", "set:int16", "1", "2", "3", "-5", "1000"]);
    cmds.push(args!["SADD", "set:int64", "1", "9223372036854775807", "-9223372036854775808"]);
    cmds.push(args!["SADD", "set:small", "a", "b", "c", "", b"\xff\x00".to_vec()]);
    let mut sbig = args!["SADD", "set:big"];
    for i in 0..1000 {
        sbig.push(format!("member-{i}").into_bytes());
    }
    cmds.push(sbig);
    let mut sints = args!["SADD", "set:manyints"];
    for i in 0..600 {
        sints.push((i * 7 - 2000).to_string().into_bytes());
    }
    cmds.push(sints);
    // Hashes: listpack (with int values, empty field and value), hashtable by count
    // (hash-max-listpack-entries is 512 by default), hashtable by value length.
    cmds.push(args![
        "HSET", "hash:small", "f1", "v1", "n", "123", "neg", "-7", "", "empty-field", "empty",
        "", "bin", b"\x00\xff".to_vec()
    ]);
    let mut hbig = args!["HSET", "hash:big"];
    for i in 0..600 {
        hbig.push(format!("field:{i}").into_bytes());
        hbig.push(format!("value:{}", i * 3).into_bytes());
    }
    cmds.push(hbig);
    cmds.push(args!["HSET", "hash:longval", "short", "s", "long", long("v:", 100)]);
    cmds.push(args!["HSET", "hash:ttl", "a", "1"]);
    cmds.push(args!["PEXPIRE", "hash:ttl", TTL_MS]);
    // Sorted sets: listpack with awkward scores, skiplist by count, by member length.
    cmds.push(args![
        "ZADD", "zset:small", "0.1", "tenth", "-inf", "minus-inf", "inf", "plus-inf",
        "9007199254740992", "two53", "1e-300", "tiny", "1.5", "", "-2", "neg", "0", "zero",
        "3", "int"
    ]);
    let mut zbig = args!["ZADD", "zset:big"];
    for i in 0..300 {
        zbig.push(format!("{}", i as f64 * 0.5 - 10.0).into_bytes());
        zbig.push(format!("m{i}").into_bytes());
    }
    for (score, member) in [("-inf", "low"), ("inf", "high"), ("1e-300", "tiny"), ("0.1", "tenth")] {
        zbig.push(score.as_bytes().to_vec());
        zbig.push(member.as_bytes().to_vec());
    }
    cmds.push(zbig);
    cmds.push(args!["ZADD", "zset:longmember", "1", long("member:", 100), "2", "short"]);
    run_all(c, &cmds);
    fill_streams(c);
    // Other databases.
    let cmds: Vec<Args> = vec![
        args!["SELECT", "3"],
        args!["SET", "str:int", "3"],
        args!["HSET", "db3:hash", "k", "v"],
        args!["RPUSH", "db3:list", "1", "2", "3"],
        args!["PEXPIRE", "db3:list", TTL_MS],
        args!["SADD", "db3:set", "x"],
        args!["SELECT", "15"],
        args!["SET", "", "empty key in db 15"],
        args!["ZADD", "db15:zset", "1", "a"],
        args!["XADD", "db15:stream", "5-5", "f", "v"],
        args!["SELECT", "0"],
    ];
    run_all(c, &cmds);
}

/// Streams of database 0: several field sets, deletions, trimming, groups with pending
/// entries and several consumers, claimed entries, a group created with ENTRIESREAD,
/// an empty stream with a group, a stream whose entries were all deleted.
#[rustfmt::skip]
fn fill_streams(c: &mut Client) {
    let mut cmds: Vec<Args> = vec![
        args!["XADD", "stream:a", "1-1", "a", "1", "b", "2"],
        args!["XADD", "stream:a", "1-2", "a", "3", "b", "4"],
        args!["XADD", "stream:a", "1-3", "a", "5", "b", "6"],
        args!["XADD", "stream:a", "2-0", "c", "7"],
        args!["XADD", "stream:a", "3-0", "", "empty-field", "bin", b"\x00\xff".to_vec()],
        args!["XADD", "stream:a", "3-1", "x", long("v:", 100), "y", "-12", "z", "9223372036854775807"],
        args!["XADD", "stream:a", "4-0", "a", "8", "b", "9"],
        args!["XADD", "stream:a", "5-0", "only", "one"],
        args!["XDEL", "stream:a", "1-2"],
        args!["XGROUP", "CREATE", "stream:a", "g1", "0"],
        args!["XGROUP", "CREATE", "stream:a", "g2", "$"],
        args!["XGROUP", "CREATE", "stream:a", "g3", "2-0", "ENTRIESREAD", "3"],
        args!["XREADGROUP", "GROUP", "g1", "alice", "COUNT", "3", "STREAMS", "stream:a", ">"],
        args!["XREADGROUP", "GROUP", "g1", "bob", "COUNT", "2", "STREAMS", "stream:a", ">"],
        args!["XREADGROUP", "GROUP", "g1", "carol", "COUNT", "1", "NOACK", "STREAMS", "stream:a", ">"],
        args!["XACK", "stream:a", "g1", "1-3"],
        // bob takes 1-1 from alice; 2-0 is claimed with an hour-old delivery time and
        // an explicit delivery count.
        args!["XCLAIM", "stream:a", "g1", "bob", "0", "1-1"],
        args!["XCLAIM", "stream:a", "g1", "alice", "0", "2-0", "IDLE", "3600000", "RETRYCOUNT", "7"],
        args!["XGROUP", "CREATECONSUMER", "stream:a", "g2", "idle-consumer"],
        args!["XREADGROUP", "GROUP", "g3", "dave", "STREAMS", "stream:a", ">"],
        args!["XGROUP", "CREATE", "stream:empty", "g", "$", "MKSTREAM"],
        args!["XADD", "stream:alldeleted", "7-1", "f", "v"],
        args!["XADD", "stream:alldeleted", "7-2", "f", "v"],
        args!["XDEL", "stream:alldeleted", "7-1", "7-2"],
    ];
    // A long stream (many listpack nodes), trimmed from the front.
    for i in 1..=1000i64 {
        let id = format!("{}-{}", 1000 + i / 10, i % 10);
        if i % 3 == 0 {
            cmds.push(args!["XADD", "stream:big", id, "n", i, "kind", "third"]);
        } else {
            cmds.push(args!["XADD", "stream:big", id, "n", i]);
        }
    }
    cmds.push(args!["XTRIM", "stream:big", "MAXLEN", "=", "700"]);
    cmds.push(args!["XGROUP", "CREATE", "stream:big", "workers", "0"]);
    cmds.push(args!["XREADGROUP", "GROUP", "workers", "w1", "COUNT", "50", "STREAMS", "stream:big", ">"]);
    cmds.push(args!["XREADGROUP", "GROUP", "workers", "w2", "COUNT", "50", "STREAMS", "stream:big", ">"]);
    cmds.push(args!["PEXPIRE", "stream:big", TTL_MS]);
    run_all(c, &cmds);
}

pub fn long(prefix: &str, len: usize) -> Vec<u8> {
    let mut v = prefix.as_bytes().to_vec();
    while v.len() < len {
        v.push(b'a' + (v.len() % 26) as u8);
    }
    v
}

/// (database 0 key, the OBJECT ENCODING values a Redis 7.x may report for it).
pub const ENCODINGS: &[(&str, &[&str])] = &[
    ("str:int", &["int"]),
    ("str:int64", &["int"]),
    ("str:embstr", &["embstr"]),
    ("str:raw", &["raw"]),
    ("str:lzf", &["raw"]),
    ("str:bin", &["raw"]),
    ("list:small", &["quicklist", "listpack"]),
    ("list:big", &["quicklist"]),
    ("list:plain", &["quicklist"]),
    ("set:int16", &["intset"]),
    ("set:int64", &["intset"]),
    // 7.0 has no listpack sets; 7.2 does (the Valkey fixture covers those).
    ("set:small", &["hashtable", "listpack"]),
    ("set:big", &["hashtable"]),
    ("set:manyints", &["hashtable"]),
    ("hash:small", &["listpack"]),
    ("hash:big", &["hashtable"]),
    ("hash:longval", &["hashtable"]),
    ("zset:small", &["listpack"]),
    ("zset:big", &["skiplist"]),
    ("zset:longmember", &["skiplist"]),
    ("stream:a", &["stream"]),
];

/// Asserts OBJECT ENCODING on a real Redis holding [`fill_dataset`], so each encoding
/// the tests claim to cover is really there.
pub fn check_reference_encodings(c: &mut Client) {
    assert_eq!(c.cmd(&["SELECT", "0"]), Resp::ok());
    for (key, allowed) in ENCODINGS {
        let r = c.cmd(&["OBJECT", "ENCODING", key]);
        let enc = r
            .as_string()
            .unwrap_or_else(|| panic!("OBJECT ENCODING {key}: {r}"));
        assert!(
            allowed.contains(&enc.as_str()),
            "OBJECT ENCODING {key} is {enc}, expected one of {allowed:?}"
        );
    }
    // list:big spans many quicklist nodes.
    let dbg = c
        .cmd(&["DEBUG", "OBJECT", "list:big"])
        .as_string()
        .unwrap_or_default();
    let nodes: usize = dbg
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ql_nodes:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("DEBUG OBJECT list:big: {dbg}"));
    assert!(nodes > 4, "list:big has only {nodes} quicklist nodes");
}

/// redis-server arguments for the reference dataset: DEBUG for the plain-node threshold,
/// and list-compress-depth 1 so the inner quicklist nodes of list:big are stored
/// LZF-compressed.
pub const REFERENCE_REDIS_ARGS: &[&str] = &[
    "--enable-debug-command",
    "yes",
    "--list-compress-depth",
    "1",
];

/// Fills a redis-server started with `REFERENCE_REDIS_ARGS` with the common dataset, in
/// every encoding it has (elements of 8 KB and more in plain quicklist nodes; the
/// default threshold is 1 GB), and checks the encodings are really there.
pub fn fill_reference_redis(rc: &mut Client) {
    assert_eq!(
        rc.cmd(&["DEBUG", "QUICKLIST-PACKED-THRESHOLD", "8192"]),
        Resp::ok()
    );
    fill_dataset(rc);
    check_reference_encodings(rc);
}
