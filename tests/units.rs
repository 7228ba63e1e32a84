//! Pipelines run as "units" on a two-thread Kite: a connection's pipeline of plain keyed
//! commands whose keys alternate between the two shards runs its own shard's commands and
//! the other shard's in one round trip, under key locks (INFO transactions
//! `pipeline_units`, `pipeline_units_refused`). These tests check that Redis's guarantees
//! hold with that: replies as redis-server gives them and in order (random and scripted
//! pipelines compared reply by reply), no reader ever seeing a connection's later write
//! without its earlier ones, a client blocked on keys of both shards served exactly as
//! Redis serves it, and units, MULTI/EXEC and scripts on the same keys neither deadlock
//! nor lose an increment. Each test that must exercise units asserts `pipeline_units > 0`.
//!
//! Keys are placed on chosen shards with `common::shard_of` (the Redis Cluster slot
//! modulo the thread count, as Kite places a key without hashtag). Every loop is bounded
//! by a count; nothing measures time (waits for a blocked client poll a bounded number of
//! times).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use common::{
    fmt_cmd, info_field, kite_is_redis, shard_of, Args, Client, KiteServer, RedisServer, Resp, Rng,
    ServerProcess,
};

/// The thread count of the Kite under test where units matter: two shards.
const THREADS: usize = 2;

/// Read timeout of the clients of the concurrent tests: a deadlock fails the test.
const PATIENCE: Duration = Duration::from_secs(20);

fn args_of<S: AsRef<str>>(parts: &[S]) -> Args {
    parts
        .iter()
        .map(|p| p.as_ref().as_bytes().to_vec())
        .collect()
}

/// A random-looking key `<prefix>-<hex>` (no hashtag) on shard `shard` of a two-thread
/// Kite. Distinct prefixes give distinct keys.
fn key_on(rng: &mut Rng, prefix: &str, shard: usize) -> String {
    for _ in 0..1000 {
        let key = format!("{prefix}-{:06x}", rng.next_u64() & 0xff_ffff);
        if shard_of(&key, THREADS) == shard {
            return key;
        }
    }
    panic!("no key with prefix {prefix} on shard {shard} in 1000 tries");
}

fn patient_client(server: &ServerProcess) -> Client {
    let mut c = server.client();
    c.set_timeout(Some(PATIENCE));
    c
}

/// A reply with every error cut to its first word (`WRONGTYPE`, `ERR`), in arrays too.
fn norm(r: &Resp) -> Resp {
    match r {
        Resp::Error(e) => Resp::Error(e.split_whitespace().next().unwrap_or("").to_string()),
        Resp::Array(v) => Resp::Array(v.iter().map(norm).collect()),
        other => other.clone(),
    }
}

/// Compares two lists of replies to `cmds` (errors by their first word); on the first
/// difference, panics with the whole pipeline and both sides' replies.
#[track_caller]
fn compare_replies(
    what: &str,
    cmds: &[Args],
    left_name: &str,
    left: &[Resp],
    right_name: &str,
    right: &[Resp],
) {
    assert_eq!(left.len(), cmds.len(), "{what}: {left_name} replies");
    assert_eq!(right.len(), cmds.len(), "{what}: {right_name} replies");
    if let Some(i) = (0..cmds.len()).find(|&i| norm(&left[i]) != norm(&right[i])) {
        let listing: Vec<String> = cmds
            .iter()
            .enumerate()
            .map(|(j, c)| {
                format!(
                    "{} {j:>2}: {:<36} {left_name}: {}   {right_name}: {}",
                    if j == i { ">>" } else { "  " },
                    fmt_cmd(c),
                    left[j],
                    right[j]
                )
            })
            .collect();
        panic!(
            "{what}: command #{i} `{}`: {left_name} answered {}, {right_name} {}\n\
             the whole pipeline (sent in one write):\n{}\n",
            fmt_cmd(&cmds[i]),
            left[i],
            right[i],
            listing.join("\n")
        );
    }
}

/// INFO transactions `pipeline_units` and `pipeline_units_refused` of a Kite; None when
/// the server under test is a real redis-server (`KITE_BIN`), which has no such fields.
fn unit_counts(server: &KiteServer) -> Option<(u64, u64)> {
    if kite_is_redis() {
        return None;
    }
    let mut c = server.client();
    let units = info_field(&mut c, "transactions", "pipeline_units");
    let refused = info_field(&mut c, "transactions", "pipeline_units_refused");
    Some((
        units
            .parse()
            .unwrap_or_else(|_| panic!("pipeline_units:{units}")),
        refused
            .parse()
            .unwrap_or_else(|_| panic!("pipeline_units_refused:{refused}")),
    ))
}

/// Asserts that at least one pipeline ran as a unit, so the test exercised the feature.
#[track_caller]
fn assert_units_ran(server: &KiteServer, what: &str) {
    if let Some((units, refused)) = unit_counts(server) {
        eprintln!("{what}: pipeline_units:{units} pipeline_units_refused:{refused}");
        assert!(
            units > 0,
            "{what}: no pipeline ran as a unit (pipeline_units:0, \
             pipeline_units_refused:{refused})"
        );
    }
}

/// An integer read with GET: missing = 0.
fn value_of(r: &Resp) -> i64 {
    if r.is_null() {
        return 0;
    }
    r.parse_int()
        .unwrap_or_else(|| panic!("expected an integer string or nil, got {r}"))
}

// ---------------------------------------------------------------------------
// 1. Random mixed pipelines compared with redis-server
// ---------------------------------------------------------------------------

const MIX_KEYS: usize = 40;

/// Key `i` of the mixed workload; `i % 4` is the type most commands give it (0 string,
/// 1 list, 2 set, 3 hash).
fn mix_key(i: usize) -> String {
    format!("mix:{i}")
}

/// A key of `group` (most of the time) or any key.
fn mix_key_of(rng: &mut Rng, group: usize) -> String {
    if rng.chance(85) {
        mix_key(rng.index(MIX_KEYS / 4) * 4 + group)
    } else {
        mix_key(rng.index(MIX_KEYS))
    }
}

fn small_value(rng: &mut Rng) -> String {
    if rng.chance(80) {
        rng.range(0, 99).to_string()
    } else {
        rng.pick(&["a", "bc", "x1"]).to_string()
    }
}

fn mixed_command(rng: &mut Rng) -> Args {
    let roll = rng.below(100);
    let parts: Vec<String> = match roll {
        0..=9 => vec!["SET".into(), mix_key_of(rng, 0), small_value(rng)],
        10..=17 => vec!["GET".into(), mix_key_of(rng, 0)],
        18..=25 => vec!["INCR".into(), mix_key_of(rng, 0)],
        26..=30 => vec![
            "APPEND".into(),
            mix_key_of(rng, 0),
            rng.range(0, 9).to_string(),
        ],
        31..=37 => {
            let mut v = vec!["LPUSH".into(), mix_key_of(rng, 1), small_value(rng)];
            if rng.chance(30) {
                v.push(small_value(rng));
            }
            v
        }
        38..=43 => vec!["RPUSH".into(), mix_key_of(rng, 1), small_value(rng)],
        44..=48 => vec!["LPOP".into(), mix_key_of(rng, 1)],
        49..=52 => vec!["RPOP".into(), mix_key_of(rng, 1)],
        53..=57 => vec!["LLEN".into(), mix_key_of(rng, 1)],
        58..=64 => {
            let mut v = vec!["SADD".into(), mix_key_of(rng, 2), small_value(rng)];
            if rng.chance(30) {
                v.push(small_value(rng));
            }
            v
        }
        65..=69 => vec!["SCARD".into(), mix_key_of(rng, 2)],
        70..=76 => {
            let mut v = vec![
                "HSET".into(),
                mix_key_of(rng, 3),
                format!("f{}", rng.index(4)),
                small_value(rng),
            ];
            if rng.chance(30) {
                v.push(format!("f{}", rng.index(4)));
                v.push(small_value(rng));
            }
            v
        }
        77..=82 => vec![
            "HGET".into(),
            mix_key_of(rng, 3),
            format!("f{}", rng.index(4)),
        ],
        83..=86 => {
            let mut v = vec!["DEL".into(), mix_key(rng.index(MIX_KEYS))];
            if rng.chance(25) {
                v.push(mix_key(rng.index(MIX_KEYS)));
            }
            v
        }
        87..=90 => {
            let mut v = vec!["EXISTS".into(), mix_key(rng.index(MIX_KEYS))];
            if rng.chance(25) {
                v.push(mix_key(rng.index(MIX_KEYS)));
            }
            v
        }
        91..=95 => {
            // A type error on purpose (when the key holds its group's type).
            let list = mix_key(rng.index(MIX_KEYS / 4) * 4 + 1);
            let string = mix_key(rng.index(MIX_KEYS / 4) * 4);
            let set = mix_key(rng.index(MIX_KEYS / 4) * 4 + 2);
            let hash = mix_key(rng.index(MIX_KEYS / 4) * 4 + 3);
            match rng.below(7) {
                0 => vec!["INCR".into(), list],
                1 => vec!["LPUSH".into(), string, "v".into()],
                2 => vec!["SADD".into(), hash, "m".into()],
                3 => vec!["HGET".into(), list, "f0".into()],
                4 => vec!["LLEN".into(), set],
                5 => vec!["SCARD".into(), string],
                _ => vec!["GET".into(), list],
            }
        }
        _ => {
            // Wrong arity.
            let k = mix_key(rng.index(MIX_KEYS));
            match rng.below(8) {
                0 => vec!["GET".into()],
                1 => vec!["SET".into(), k],
                2 => vec!["INCR".into(), k, "1".into()],
                3 => vec!["LPUSH".into(), k],
                4 => vec!["HSET".into(), k, "f".into()],
                5 => vec!["HGET".into(), k],
                6 => vec!["SCARD".into()],
                _ => vec!["LLEN".into(), k.clone(), k],
            }
        }
    };
    args_of(&parts)
}

fn sorted(r: Resp) -> Resp {
    let mut v = r
        .as_array()
        .unwrap_or_else(|| panic!("expected an array, got {r}"))
        .to_vec();
    v.sort_by_key(|x| x.encode());
    Resp::Array(v)
}

/// HGETALL's flat array with its field/value pairs sorted by field.
fn sorted_pairs(r: Resp) -> Resp {
    let items = r
        .as_array()
        .unwrap_or_else(|| panic!("expected an array, got {r}"))
        .to_vec();
    let mut pairs: Vec<(Resp, Resp)> = items
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    pairs.sort_by_key(|(k, _)| k.encode());
    Resp::Array(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect())
}

/// A key's type and contents, in an order that does not depend on the encoding.
fn dump_key(c: &mut Client, key: &str) -> (Resp, Resp) {
    let t = c.cmd(&["TYPE", key]);
    let content = match t.as_string().as_deref() {
        Some("string") => c.cmd(&["GET", key]),
        Some("list") => c.cmd(&["LRANGE", key, "0", "-1"]),
        Some("set") => sorted(c.cmd(&["SMEMBERS", key])),
        Some("hash") => sorted_pairs(c.cmd(&["HGETALL", key])),
        _ => Resp::Null,
    };
    (t, content)
}

#[test]
fn mixed_pipelines_reply_like_redis_on_two_threads() {
    const PIPELINES: usize = 200;
    const CONNS: usize = 3;
    for shard in 0..THREADS {
        assert!(
            (0..MIX_KEYS).any(|i| shard_of(&mix_key(i), THREADS) == shard),
            "the mixed keys leave shard {shard} empty"
        );
    }
    let mut rng = Rng::new(0x5eed_0001);
    let mut pipelines: Vec<Vec<Args>> = Vec::with_capacity(PIPELINES);
    for _ in 0..PIPELINES {
        let n = rng.range(8, 32) as usize;
        let mut cmds = Vec::with_capacity(n);
        for _ in 0..n {
            cmds.push(mixed_command(&mut rng));
        }
        pipelines.push(cmds);
    }

    let redis = RedisServer::start();
    let kite2 = KiteServer::start(&[], THREADS);
    let kite1 = KiteServer::start(&[], 1);
    let mut redis_conns: Vec<Client> = (0..CONNS).map(|_| redis.client()).collect();
    // Several connections, used in turn (each pipeline answered before the next is
    // sent), so that pipelines start on both of Kite's threads.
    let mut kites: Vec<(&str, Vec<Client>)> = vec![
        (
            "kite --threads 2",
            (0..CONNS).map(|_| kite2.client()).collect(),
        ),
        (
            "kite --threads 1",
            (0..CONNS).map(|_| kite1.client()).collect(),
        ),
    ];
    for (p, cmds) in pipelines.iter().enumerate() {
        let conn = p % CONNS;
        let want = redis_conns[conn].pipeline(cmds);
        for (name, conns) in kites.iter_mut() {
            let name: &str = name;
            let got = conns[conn].pipeline(cmds);
            compare_replies(
                &format!("{name}: pipeline #{p} on connection {conn}"),
                cmds,
                name,
                &got,
                "redis-server",
                &want,
            );
        }
    }
    for i in 0..MIX_KEYS {
        let key = mix_key(i);
        let want = dump_key(&mut redis_conns[0], &key);
        for (name, conns) in kites.iter_mut() {
            let name: &str = name;
            assert_eq!(
                dump_key(&mut conns[0], &key),
                want,
                "{name}: type and contents of {key} after all pipelines (right: redis-server)"
            );
        }
    }
    assert_units_ran(&kite2, "mixed pipelines at --threads 2");
    if let Some((units, refused)) = unit_counts(&kite1) {
        eprintln!("--threads 1: pipeline_units:{units} pipeline_units_refused:{refused}");
    }
}

// ---------------------------------------------------------------------------
// 2. A later write of a connection is never seen without its earlier ones
// ---------------------------------------------------------------------------

/// Sets its flag when dropped: a writer that ends, or panics, stops its readers.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_later_write_is_never_seen_without_an_earlier_one() {
    const ROUNDS: i64 = 3000;
    const READERS: usize = 2;
    const MAX_READS: usize = 20_000;
    // Shards of k1..k8 in each key set: alternating (the writer's and the reverse-order
    // reader's pipelines both alternate), and irregular (runs of one shard in between).
    const LAYOUTS: [[usize; 8]; 2] = [[0, 1, 0, 1, 0, 1, 0, 1], [1, 1, 0, 1, 0, 0, 1, 0]];
    let kite = KiteServer::start(&[], THREADS);
    let mut rng = Rng::new(0x5eed_0002);
    let mut sets: Vec<Vec<String>> = Vec::new();
    for (s, layout) in LAYOUTS.iter().enumerate() {
        let mut keys = Vec::new();
        for (i, &shard) in layout.iter().enumerate() {
            keys.push(key_on(&mut rng, &format!("ord{s}k{}", i + 1), shard));
        }
        sets.push(keys);
    }
    let done: Vec<AtomicBool> = sets.iter().map(|_| AtomicBool::new(false)).collect();
    thread::scope(|s| {
        for (set_no, keys) in sets.iter().enumerate() {
            let kite = &kite;
            let done = &done[set_no];
            // The writer: SET k1 i; SET k2 i; ...; SET k8 i in one write, for i = 1..=ROUNDS.
            // At every moment k1 >= k2 >= ... >= k8.
            s.spawn(move || {
                let _stop_readers = SetOnDrop(done);
                let mut c = patient_client(kite);
                for i in 1..=ROUNDS {
                    let v = i.to_string();
                    let cmds: Vec<Args> = keys
                        .iter()
                        .map(|k| args_of(&["SET", k.as_str(), v.as_str()]))
                        .collect();
                    let replies = c.pipeline(&cmds);
                    for (k, r) in keys.iter().zip(&replies) {
                        assert_eq!(*r, Resp::ok(), "set {set_no}: SET {k} {i}");
                    }
                }
            });
            // Readers: GET k8; GET k7; ...; GET k1 in one write. Read in that order, the
            // values can only grow along the pipeline; and each key's value never goes
            // back from one pipeline of a reader to its next.
            for reader in 0..READERS {
                s.spawn(move || {
                    let mut c = patient_client(kite);
                    let order: Vec<&String> = keys.iter().rev().collect();
                    let reads: Vec<Args> = order
                        .iter()
                        .map(|k| args_of(&["GET", k.as_str()]))
                        .collect();
                    let mut last = vec![0i64; order.len()];
                    let mut count = 0;
                    for n in 0..MAX_READS {
                        if done.load(Ordering::SeqCst) {
                            break;
                        }
                        let replies = c.pipeline(&reads);
                        let vals: Vec<i64> = replies.iter().map(value_of).collect();
                        let shown = || {
                            order
                                .iter()
                                .zip(&vals)
                                .map(|(k, v)| format!("{k}={v}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        };
                        for j in 1..vals.len() {
                            assert!(
                                vals[j - 1] <= vals[j],
                                "set {set_no}, reader {reader}, read #{n}: {} was read after \
                                 {} yet is older: the reader saw a later write of the writer \
                                 without an earlier one (read in this order: {})",
                                order[j],
                                order[j - 1],
                                shown()
                            );
                        }
                        for j in 0..vals.len() {
                            assert!(
                                vals[j] >= last[j],
                                "set {set_no}, reader {reader}, read #{n}: {} went back from \
                                 {} to {} (this read: {})",
                                order[j],
                                last[j],
                                vals[j],
                                shown()
                            );
                        }
                        last = vals;
                        count += 1;
                    }
                    eprintln!("set {set_no}, reader {reader}: {count} pipelines read");
                });
            }
        }
    });
    let mut c = kite.client();
    for keys in &sets {
        for k in keys {
            assert_eq!(
                value_of(&c.cmd(&["GET", k.as_str()])),
                ROUNDS,
                "final value of {k}"
            );
        }
    }
    assert_units_ran(&kite, "ordered writes and reads");
}

// ---------------------------------------------------------------------------
// 3. Writes and reads of the same keys across shards, in one pipeline
// ---------------------------------------------------------------------------

#[test]
fn a_pipeline_with_writes_and_reads_of_the_same_keys_across_shards_keeps_its_order() {
    const RUNS: usize = 6;
    let ok = Resp::ok;
    let nil = || Resp::NullBulk;
    let int = Resp::Integer;
    let bulk = |s: &str| Resp::bulk(s);
    let wrongtype = || Resp::Error("WRONGTYPE".into());
    // `A` and `B` stand for two keys on different shards; the replies are Redis's.
    let script: Vec<(&str, Resp)> = vec![
        ("SET A 1", ok()),
        ("GET B", nil()),
        ("SET B 2", ok()),
        ("GET A", bulk("1")),
        ("INCR A", int(2)),
        ("GET B", bulk("2")),
        ("INCR B", int(3)),
        ("GET A", bulk("2")),
        ("DEL B", int(1)),
        ("GET B", nil()),
        ("LPUSH B x", int(1)),
        ("INCR B", wrongtype()),
        ("GET A", bulk("2")),
        ("LPUSH B y", int(2)),
        ("APPEND A 0", int(2)),
        ("LLEN B", int(2)),
        ("INCR A", int(21)),
        ("RPOP B", bulk("x")),
        ("GET A", bulk("21")),
        ("LPOP B", bulk("y")),
        ("EXISTS B", int(0)),
        ("DEL A", int(1)),
        ("GET A", nil()),
        ("INCR A", int(1)),
        ("SET B 10", ok()),
        ("INCR B", int(11)),
        ("LPUSH A z", wrongtype()),
        ("GET B", bulk("11")),
        ("GET A", bulk("1")),
        ("DEL A B", int(2)),
        ("EXISTS A B", int(0)),
        ("SET A last", ok()),
        ("GET B", nil()),
        ("GET A", bulk("last")),
    ];
    let want: Vec<Resp> = script.iter().map(|(_, r)| r.clone()).collect();
    let redis = RedisServer::start();
    let kite = KiteServer::start(&[], THREADS);
    let mut rng = Rng::new(0x5eed_0003);
    for run in 0..RUNS {
        // Which of A and B is on shard 0 alternates; each run has a new connection, so
        // the connection's own shard varies too.
        let a = key_on(&mut rng, &format!("seq{run}a"), run % 2);
        let b = key_on(&mut rng, &format!("seq{run}b"), 1 - run % 2);
        let cmds: Vec<Args> = script
            .iter()
            .map(|(line, _)| {
                let parts: Vec<&str> = line
                    .split_whitespace()
                    .map(|t| match t {
                        "A" => a.as_str(),
                        "B" => b.as_str(),
                        other => other,
                    })
                    .collect();
                args_of(&parts)
            })
            .collect();
        let from_redis = redis.client().pipeline(&cmds);
        let from_kite = kite.client().pipeline(&cmds);
        let what = format!("run {run} (A = {a}, B = {b})");
        compare_replies(
            &what,
            &cmds,
            "kite --threads 2",
            &from_kite,
            "redis-server",
            &from_redis,
        );
        compare_replies(
            &format!("{what}, the replies this test expects"),
            &cmds,
            "redis-server",
            &from_redis,
            "expected",
            &want,
        );
    }
    assert_units_ran(&kite, "scripted pipelines");
}

// ---------------------------------------------------------------------------
// 4. A client blocked on keys of both shards
// ---------------------------------------------------------------------------

fn blocked_clients(c: &mut Client) -> i64 {
    let v = info_field(c, "clients", "blocked_clients");
    v.parse().unwrap_or_else(|_| panic!("blocked_clients:{v}"))
}

/// Polls INFO clients (at most 2000 times, 5 ms apart) until `ready` holds for
/// blocked_clients.
#[track_caller]
fn wait_blocked(c: &mut Client, ready: impl Fn(i64) -> bool, what: &str) {
    for _ in 0..2000 {
        if ready(blocked_clients(c)) {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
    panic!("{what}: blocked_clients stayed at {}", blocked_clients(c));
}

struct BlockCase {
    /// What W sends (and blocks in).
    wait: Args,
    /// P's pipeline, sent in one write while W is blocked.
    push: Vec<Args>,
    /// Read afterwards on another connection.
    after: Vec<Args>,
}

/// Runs a case on one server. Returns the commands and replies in one order: P's
/// pipeline, W's command, then `after`.
fn run_blocked(server: &ServerProcess, case: &BlockCase, what: &str) -> (Vec<Args>, Vec<Resp>) {
    let mut obs = server.client();
    wait_blocked(&mut obs, |n| n == 0, &format!("{what}: before W blocks"));
    let mut w = server.client();
    w.send(&case.wait);
    wait_blocked(&mut obs, |n| n >= 1, &format!("{what}: W to block"));
    let mut p = server.client();
    let mut replies = p.pipeline(&case.push);
    replies.push(
        w.try_read()
            .unwrap_or_else(|e| panic!("{what}: no reply to W's `{}`: {e}", fmt_cmd(&case.wait))),
    );
    for c in &case.after {
        replies.push(obs.cmd(c));
    }
    let mut cmds = case.push.clone();
    cmds.push(case.wait.clone());
    cmds.extend(case.after.iter().cloned());
    (cmds, replies)
}

#[test]
fn a_client_blocked_on_keys_of_both_shards_is_served_as_by_redis() {
    const PAIRS: usize = 10;
    const VARIANTS: usize = 4;
    let redis = RedisServer::start();
    let kite = KiteServer::start(&[], THREADS);
    let mut rng = Rng::new(0x5eed_0004);
    for pair in 0..PAIRS {
        // Shards of a and b: (0,0), (1,0), (0,1), (1,1), ... so some pairs span both.
        let (sa, sb) = (pair % 2, (pair / 2) % 2);
        for variant in 0..VARIANTS {
            let p = format!("bl{pair}v{variant}");
            let a = key_on(&mut rng, &format!("{p}a"), sa);
            let b = key_on(&mut rng, &format!("{p}b"), sb);
            // Padding keys, each on the other shard than the key pushed next to it, so the
            // pipeline alternates shards and can form units.
            let pad_a: Vec<String> = (0..3)
                .map(|j| key_on(&mut rng, &format!("{p}ca{j}"), 1 - sa))
                .collect();
            let pad_b: Vec<String> = (0..2)
                .map(|j| key_on(&mut rng, &format!("{p}cb{j}"), 1 - sb))
                .collect();
            let (a, b) = (a.as_str(), b.as_str());
            let set = |k: &str| args_of(&["SET", k, "1"]);
            let (wait, push): (Args, Vec<Args>) = match variant {
                // Redis serves W from a right after `LPUSH a x`: W gets x, then b gets y
                // and a gets z (LPUSH a z answers 1).
                0 => (
                    args_of(&["BRPOP", a, b, "5"]),
                    vec![
                        set(pad_a[0].as_str()),
                        args_of(&["LPUSH", a, "x"]),
                        set(pad_b[0].as_str()),
                        args_of(&["LPUSH", b, "y"]),
                        set(pad_a[1].as_str()),
                        args_of(&["LPUSH", a, "z"]),
                        set(pad_b[1].as_str()),
                    ],
                ),
                // The waiter is served before the next command: LLEN answers 0.
                1 => (
                    args_of(&["BLPOP", a, b, "5"]),
                    vec![args_of(&["LPUSH", a, "x"]), args_of(&["LLEN", a])],
                ),
                // The same inside a longer pipeline over both shards.
                2 => (
                    args_of(&["BRPOP", a, b, "5"]),
                    vec![
                        set(pad_a[0].as_str()),
                        args_of(&["LPUSH", a, "x"]),
                        args_of(&["GET", pad_a[1].as_str()]),
                        args_of(&["LLEN", a]),
                        set(pad_b[0].as_str()),
                        args_of(&["LLEN", b]),
                        args_of(&["GET", pad_a[2].as_str()]),
                    ],
                ),
                // b filled first: W is served from b, though a comes first in BRPOP.
                _ => (
                    args_of(&["BRPOP", a, b, "5"]),
                    vec![
                        set(pad_b[0].as_str()),
                        args_of(&["LPUSH", b, "y"]),
                        set(pad_a[0].as_str()),
                        args_of(&["LPUSH", a, "x"]),
                        set(pad_b[1].as_str()),
                        args_of(&["LLEN", b]),
                        args_of(&["LLEN", a]),
                    ],
                ),
            };
            let case = BlockCase {
                wait,
                push,
                after: vec![
                    args_of(&["LRANGE", a, "0", "-1"]),
                    args_of(&["LRANGE", b, "0", "-1"]),
                ],
            };
            let what = format!(
                "pair {pair} (a = {a} on shard {sa}, b = {b} on shard {sb}), variant {variant}"
            );
            let (cmds, want) = run_blocked(&redis, &case, &format!("redis-server: {what}"));
            let (_, got) = run_blocked(&kite, &case, &format!("kite: {what}"));
            compare_replies(
                &format!("{what} (P's pipeline, then W's blocking pop, then the lists)"),
                &cmds,
                "kite --threads 2",
                &got,
                "redis-server",
                &want,
            );
        }
    }
    if let Some((units, refused)) = unit_counts(&kite) {
        eprintln!("blocked clients: pipeline_units:{units} pipeline_units_refused:{refused}");
    }
}

// ---------------------------------------------------------------------------
// 5. Units, transactions and scripts on the same keys
// ---------------------------------------------------------------------------

#[test]
fn units_and_transactions_contend_without_deadlock() {
    const KEYS: usize = 6;
    const PIPELINERS: usize = 3;
    const PIPELINES: usize = 300;
    const DEPTH: usize = 16;
    const TRANSACTORS: usize = 2;
    const TRANSACTIONS: usize = 300;
    const EVALS: usize = 300;
    const SCRIPT: &str = "return redis.call('INCR', KEYS[1])";
    let kite = KiteServer::start(&[], THREADS);
    let mut rng = Rng::new(0x5eed_0005);
    let keys: Vec<String> = (0..KEYS)
        .map(|i| key_on(&mut rng, &format!("ctr{i}"), i % 2))
        .collect();
    // INCRs issued per key, summed over all threads.
    let totals = Mutex::new(vec![0i64; KEYS]);
    let add = |mine: &[i64]| {
        let mut t = totals.lock().unwrap_or_else(|e| e.into_inner());
        for (acc, v) in t.iter_mut().zip(mine) {
            *acc += v;
        }
    };
    thread::scope(|s| {
        for t in 0..PIPELINERS {
            let (kite, keys, add) = (&kite, &keys, &add);
            s.spawn(move || {
                let mut c = patient_client(kite);
                let mut rng = Rng::new(100 + t as u64);
                let mut mine = [0i64; KEYS];
                for n in 0..PIPELINES {
                    let mut cmds: Vec<Args> = Vec::with_capacity(DEPTH);
                    for _ in 0..DEPTH {
                        let k = rng.index(KEYS);
                        mine[k] += 1;
                        cmds.push(args_of(&["INCR", keys[k].as_str()]));
                    }
                    let replies = c.pipeline(&cmds);
                    for (cmd, r) in cmds.iter().zip(&replies) {
                        assert!(
                            r.as_int().is_some(),
                            "pipeliner {t}, pipeline #{n}: `{}` answered {r}",
                            fmt_cmd(cmd)
                        );
                    }
                }
                add(&mine[..]);
            });
        }
        for t in 0..TRANSACTORS {
            let (kite, keys, add) = (&kite, &keys, &add);
            s.spawn(move || {
                let mut c = patient_client(kite);
                let mut rng = Rng::new(200 + t as u64);
                let mut mine = [0i64; KEYS];
                for n in 0..TRANSACTIONS {
                    let mut cmds = vec![args_of(&["MULTI"])];
                    for _ in 0..3 {
                        let k = rng.index(KEYS);
                        mine[k] += 1;
                        cmds.push(args_of(&["INCR", keys[k].as_str()]));
                    }
                    cmds.push(args_of(&["EXEC"]));
                    let replies = c.pipeline(&cmds);
                    assert_eq!(replies[0], Resp::ok(), "transactor {t}, #{n}: MULTI");
                    for r in &replies[1..4] {
                        assert_eq!(*r, Resp::simple("QUEUED"), "transactor {t}, #{n}: INCR");
                    }
                    let exec = replies[4].as_array().unwrap_or_else(|| {
                        panic!("transactor {t}, #{n}: EXEC answered {}", replies[4])
                    });
                    assert!(
                        exec.len() == 3 && exec.iter().all(|r| r.as_int().is_some()),
                        "transactor {t}, #{n}: EXEC answered {}",
                        replies[4]
                    );
                }
                add(&mine[..]);
            });
        }
        {
            let (kite, keys, add) = (&kite, &keys, &add);
            s.spawn(move || {
                let mut c = patient_client(kite);
                let mut rng = Rng::new(300);
                let mut mine = [0i64; KEYS];
                for n in 0..EVALS {
                    let k = rng.index(KEYS);
                    mine[k] += 1;
                    let r = c.cmd(&["EVAL", SCRIPT, "1", keys[k].as_str()]);
                    assert!(
                        r.as_int().is_some(),
                        "EVAL #{n} on {} answered {r}",
                        keys[k]
                    );
                }
                add(&mine[..]);
            });
        }
    });
    let totals = totals.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut c = kite.client();
    for (k, want) in keys.iter().zip(&totals) {
        let got = value_of(&c.cmd(&["GET", k.as_str()]));
        assert_eq!(got, *want, "{k}: its value against the INCRs issued on it");
    }
    assert_units_ran(&kite, "units against transactions and scripts");
}

/// While any client tracks keys (CLIENT TRACKING), no pipeline runs as a unit: other
/// clients' invalidations would go out in the order the unit's two parts ran (the other
/// shard's a round trip first), not in the group's. Once tracking stops, units run again.
#[test]
fn no_unit_while_a_client_tracks_keys() {
    if kite_is_redis() {
        return;
    }
    let kite = KiteServer::start(&[], THREADS);
    let mut rng = Rng::new(0x5eed_0006);
    let keys: Vec<String> = (0..16)
        .map(|i| key_on(&mut rng, &format!("trk{i}"), i % 2))
        .collect();
    let gets: Vec<Args> = keys.iter().map(|k| args_of(&["GET", k.as_str()])).collect();
    let mut sink = kite.client();
    let sink_id = sink.cmd(&["CLIENT", "ID"]).as_int().expect("CLIENT ID");
    let mut tracker = kite.client();
    let redirect = sink_id.to_string();
    assert_eq!(
        tracker.cmd(&["CLIENT", "TRACKING", "ON", "REDIRECT", redirect.as_str()]),
        Resp::ok()
    );
    let mut c = kite.client();
    for _ in 0..50 {
        c.pipeline(&gets);
    }
    let (units, refused) = unit_counts(&kite).expect("a Kite");
    assert_eq!(
        (units, refused),
        (0, 0),
        "pipeline_units / _refused while a client tracks keys"
    );
    assert_eq!(tracker.cmd(&["CLIENT", "TRACKING", "OFF"]), Resp::ok());
    for _ in 0..50 {
        c.pipeline(&gets);
    }
    assert_units_ran(&kite, "after CLIENT TRACKING OFF");
}
