//! MIGRATE, black box, as Redis 7.2 defines it:
//!
//!     MIGRATE host port key|"" destination-db timeout [COPY] [REPLACE]
//!             [AUTH password | AUTH2 username password] [KEYS key [key ...]]
//!
//! from the server under test to a real redis-server and from a real redis-server to
//! the server under test (and the server under test to itself): every type and encoding
//! of the common dataset (`persist_support::fill_dataset`, databases 0, 3 and 15) with
//! expiry times kept, many keys in one `KEYS` call (spread over the shards at
//! `--threads 4`), COPY, REPLACE (which also drops the target's expiry), BUSYKEY without
//! REPLACE (keys restored before the busy one leave the source, the busy one stays),
//! NOKEY, argument errors, a target that refuses, cannot be resolved or never answers,
//! targets with a password (AUTH) and ACL users (AUTH2, wrong passwords, a user without
//! access to the key), the destination database, MIGRATE inside MULTI and inside a
//! script, the DEL that
//! reaches a replica of the source, the `del` keyspace events on the source, and
//! MIGRATE refused on a read-only replica.
//!
//! Written from the MIGRATE page of redis.io and checked against redis-server 7.0 (whose
//! MIGRATE is the same as 7.2's), not from Kite's code. What Redis does beyond what the
//! page spells out, kept here as the spec:
//! - With KEYS, the target answers each RESTORE on its own: the keys it accepted are
//!   deleted from the source (and propagated as DEL), the first error is returned as
//!   `ERR Target instance replied with error: <target's error>`, and the keys it refused
//!   stay on the source.
//! - `NOKEY` (a simple string) when no key named exists; with KEYS, the keys that do
//!   not exist are skipped silently.
//! - A host that does not resolve: `IOERR error or timeout connecting to the client`.
//!   A refused port is reported when the first write fails (Redis says `IOERR error or
//!   timeout writing to target instance`; only the `IOERR` prefix is asserted), and a
//!   target that accepts but never answers gives `IOERR error or timeout reading to
//!   target instance` after the timeout. The key stays on the source in every case.
//! - Errors of the target's AUTH (`NOAUTH`, `WRONGPASS`, `NOPERM` for the RESTORE of a
//!   key the user may not write) come back wrapped the same way, and nothing moves.
//!
//! Redis keeps the connection to a target open for 10 s and reuses it; the tests are
//! ordered so that a cached, already authenticated connection cannot change a result
//! (a failed AUTH never follows a successful one on the same target).
//!
//! Tests that involve the server under test run at `--threads 1` and `--threads 4`.
//!
//!     KITE_BIN=$(which redis-server) cargo test --test migrate

#[macro_use]
mod common;
#[allow(unused_imports)]
mod persist_support;

use common::*;
use persist_support::{
    assert_same_dataset, dataset, fill_dataset, fill_reference_redis, now_ms, scan_all, Dataset,
    REFERENCE_REDIS_ARGS,
};
use std::collections::BTreeSet;
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

/// MIGRATE's timeout (ms) where nothing is meant to time out.
const TIMEOUT_MS: &str = "10000";
/// Deadline of every poll.
const WAIT: Duration = Duration::from_secs(10);

const BUSYKEY: &str =
    "ERR Target instance replied with error: BUSYKEY Target key name already exists.";
const NOAUTH: &str = "ERR Target instance replied with error: NOAUTH Authentication required.";
const WRONGPASS: &str = "ERR Target instance replied with error: WRONGPASS invalid username-password pair or user is disabled.";
const KEYS_NEEDS_EMPTY_KEY: &str =
    "ERR When using MIGRATE KEYS option, the key argument must be set to the empty string";

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// `MIGRATE 127.0.0.1 <port> <key> <db> <TIMEOUT_MS> <opts...>`.
fn migrate<K: AsRef<[u8]>>(c: &mut Client, port: u16, key: K, db: usize, opts: &[&str]) -> Resp {
    let mut args: Vec<Vec<u8>> = vec![
        b"MIGRATE".to_vec(),
        b"127.0.0.1".to_vec(),
        port.to_string().into_bytes(),
        key.as_ref().to_vec(),
        db.to_string().into_bytes(),
        TIMEOUT_MS.as_bytes().to_vec(),
    ];
    args.extend(opts.iter().map(|o| o.as_bytes().to_vec()));
    c.cmd(&args)
}

/// `MIGRATE 127.0.0.1 <port> "" <db> <TIMEOUT_MS> <opts...> KEYS <keys...>`.
fn migrate_keys<K: AsRef<[u8]>>(
    c: &mut Client,
    port: u16,
    db: usize,
    opts: &[&str],
    keys: &[K],
) -> Resp {
    let mut args: Vec<Vec<u8>> = vec![
        b"MIGRATE".to_vec(),
        b"127.0.0.1".to_vec(),
        port.to_string().into_bytes(),
        Vec::new(),
        db.to_string().into_bytes(),
        TIMEOUT_MS.as_bytes().to_vec(),
    ];
    args.extend(opts.iter().map(|o| o.as_bytes().to_vec()));
    args.push(b"KEYS".to_vec());
    args.extend(keys.iter().map(|k| k.as_ref().to_vec()));
    c.cmd(&args)
}

#[track_caller]
fn assert_ok(r: Resp, what: &str) {
    assert_eq!(r, Resp::ok(), "{what}");
}

#[track_caller]
fn assert_err(r: &Resp, text: &str, what: &str) {
    assert_eq!(r, &Resp::Error(text.into()), "{what}");
}

fn get(c: &mut Client, key: &str) -> Resp {
    c.cmd(&["GET", key])
}

fn exists(c: &mut Client, key: &str) -> i64 {
    c.cmd(&["EXISTS", key])
        .as_int()
        .expect("EXISTS answers an integer")
}

fn pttl(c: &mut Client, key: &str) -> i64 {
    c.cmd(&["PTTL", key])
        .as_int()
        .expect("PTTL answers an integer")
}

fn select(c: &mut Client, db: usize) {
    assert_ok(c.cmd(&["SELECT", &db.to_string()]), "SELECT");
}

/// Polls `f` every 20 ms until it holds; panics with `what()` after [`WAIT`].
#[track_caller]
fn wait_for(mut f: impl FnMut() -> bool, what: impl FnOnce() -> String) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        if Instant::now() > deadline {
            panic!("timed out after {WAIT:?} waiting until {}", what());
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// `n` keys `<prefix>:<i>` with values `v:<i>`.
fn numbered(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

fn mset(c: &mut Client, keys: &[String]) {
    let mut args = vec!["MSET".to_string()];
    for (i, k) in keys.iter().enumerate() {
        args.push(k.clone());
        args.push(format!("v:{i}"));
    }
    assert_ok(c.cmd(&args), "MSET");
}

#[track_caller]
fn assert_values(c: &mut Client, keys: &[String], what: &str) {
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            get(c, k),
            Resp::bulk(format!("v:{i}")),
            "{what}: value of {k} on port {}",
            c.port
        );
    }
}

#[track_caller]
fn assert_absent(c: &mut Client, keys: &[String], what: &str) {
    for k in keys {
        assert_eq!(exists(c, k), 0, "{what}: {k} still on port {}", c.port);
    }
}

fn skip_threads4() -> bool {
    if kite_is_redis() {
        eprintln!("redis-server has no --threads: the threads4 variant is the same as threads1");
        true
    } else {
        false
    }
}

/// Every key of the databases the common dataset fills, moved with one MIGRATE per
/// database (KEYS) to the same database of the target.
fn migrate_whole_dataset(src: &mut Client, target_port: u16) {
    for db in [0usize, 3, 15] {
        select(src, db);
        let keys: Vec<Vec<u8>> = scan_all(src).into_iter().collect();
        assert!(!keys.is_empty(), "database {db} of the dataset is empty");
        let r = migrate_keys(src, target_port, db, &[], &keys);
        assert_eq!(
            r,
            Resp::ok(),
            "MIGRATE KEYS of database {db} ({} keys)",
            keys.len()
        );
        assert_eq!(
            src.cmd(&["DBSIZE"]),
            Resp::Integer(0),
            "database {db} of the source after MIGRATE without COPY"
        );
    }
    select(src, 0);
}

/// Asserts the target holds exactly `before` (expiry times and consumers' seen times
/// within the dataset's tolerance).
fn assert_moved(before: &Dataset, target: &mut Client, what: &str) {
    let after = dataset(target);
    assert_same_dataset(before, &after, what);
}

// ---------------------------------------------------------------------------
// Every type, both directions
// ---------------------------------------------------------------------------

fn every_type_to_redis(threads: usize) {
    let src = KiteServer::start(&[], threads);
    let dst = RedisServer::start();
    let mut sc = src.client();
    fill_dataset(&mut sc);
    let before = dataset(&mut sc);
    migrate_whole_dataset(&mut sc, dst.port);
    assert_moved(
        &before,
        &mut dst.client(),
        "redis-server after MIGRATE of every key from the server under test",
    );
    assert!(
        dataset(&mut sc).is_empty(),
        "the source still holds keys after MIGRATE without COPY"
    );
}

#[test]
fn every_type_to_redis_threads1() {
    every_type_to_redis(1);
}

#[test]
fn every_type_to_redis_threads4() {
    if skip_threads4() {
        return;
    }
    every_type_to_redis(4);
}

fn every_type_from_redis(threads: usize) {
    let src = RedisServer::start_with(REFERENCE_REDIS_ARGS);
    let dst = KiteServer::start(&[], threads);
    let mut sc = src.client();
    fill_reference_redis(&mut sc);
    let before = dataset(&mut sc);
    migrate_whole_dataset(&mut sc, dst.port);
    assert_moved(
        &before,
        &mut dst.client(),
        "the server under test after MIGRATE of every key from redis-server",
    );
}

#[test]
fn every_type_from_redis_threads1() {
    every_type_from_redis(1);
}

#[test]
fn every_type_from_redis_threads4() {
    if skip_threads4() {
        return;
    }
    every_type_from_redis(4);
}

/// The server under test migrating to another instance of itself (the COPY of the
/// dataset, so the source keeps everything).
fn every_type_to_itself(threads: usize) {
    let src = KiteServer::start(&[], threads);
    let dst = KiteServer::start(&[], threads);
    let mut sc = src.client();
    fill_dataset(&mut sc);
    let before = dataset(&mut sc);
    for db in [0usize, 3, 15] {
        select(&mut sc, db);
        let keys: Vec<Vec<u8>> = scan_all(&mut sc).into_iter().collect();
        let r = migrate_keys(&mut sc, dst.port, db, &["COPY"], &keys);
        assert_eq!(r, Resp::ok(), "MIGRATE COPY KEYS of database {db}");
    }
    select(&mut sc, 0);
    assert_moved(&before, &mut dst.client(), "the target after MIGRATE COPY");
    assert_same_dataset(&before, &dataset(&mut sc), "the source after MIGRATE COPY");
}

#[test]
fn every_type_to_itself_threads1() {
    every_type_to_itself(1);
}

#[test]
fn every_type_to_itself_threads4() {
    if skip_threads4() {
        return;
    }
    every_type_to_itself(4);
}

// ---------------------------------------------------------------------------
// Many keys, TTLs, COPY, REPLACE
// ---------------------------------------------------------------------------

/// 200 keys (on every shard) in one MIGRATE KEYS call, in both directions, some with a
/// TTL, and two names that do not exist.
fn many_keys(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut kc = kite.client();
    let mut rc = redis.client();

    for (from, to, label) in [
        (&mut kc, redis.port, "server under test -> redis-server"),
        (&mut rc, kite.port, "redis-server -> server under test"),
    ] {
        let keys = numbered(&format!("many:{}", to), 200);
        mset(from, &keys);
        for k in keys.iter().step_by(10) {
            assert_eq!(from.cmd(&["PEXPIRE", k, "500000"]), Resp::Integer(1));
        }
        let mut named: Vec<String> = keys.clone();
        named.push("many:missing:1".into());
        named.insert(50, "many:missing:2".into());
        let r = migrate_keys(from, to, 0, &[], &named);
        assert_eq!(r, Resp::ok(), "{label}: MIGRATE KEYS of 200 keys");
        assert_absent(from, &keys, label);
        let mut tc = Client::connect(to);
        assert_values(&mut tc, &keys, label);
        for (i, k) in keys.iter().enumerate() {
            let t = pttl(&mut tc, k);
            if i % 10 == 0 {
                assert!(
                    (490_000..=500_000).contains(&t),
                    "{label}: PTTL of {k} on the target is {t}, expected about 500000"
                );
            } else {
                assert_eq!(t, -1, "{label}: {k} had no TTL on the source");
            }
        }
        assert_eq!(exists(&mut tc, "many:missing:1"), 0);
    }
}

#[test]
fn many_keys_threads1() {
    many_keys(1);
}

#[test]
fn many_keys_threads4() {
    if skip_threads4() {
        return;
    }
    many_keys(4);
}

/// A key named twice after KEYS is sent twice: Redis restores it once and the second
/// RESTORE meets the key just restored (BUSYKEY without REPLACE). The key has moved
/// all the same, and so have the others.
fn key_named_twice(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut kc = kite.client();
    let mut rc = redis.client();
    for (from, to, label) in [
        (&mut kc, redis.port, "server under test -> redis-server"),
        (&mut rc, kite.port, "redis-server -> server under test"),
    ] {
        let mut tc = Client::connect(to);
        let keys = numbered(&format!("twice:{to}"), 4);
        mset(from, &keys);
        let named = [&keys[0], &keys[1], &keys[0], &keys[2], &keys[3]];
        let r = migrate_keys(from, to, 0, &[], &named);
        assert_err(&r, BUSYKEY, &format!("{label}: KEYS naming a key twice"));
        assert_absent(from, &keys, label);
        assert_values(&mut tc, &keys, label);
        // With REPLACE the second RESTORE overwrites the first: OK.
        mset(from, &keys);
        let r = migrate_keys(from, to, 0, &["REPLACE"], &named);
        assert_eq!(r, Resp::ok(), "{label}: KEYS REPLACE naming a key twice");
        assert_absent(from, &keys, label);
        assert_values(&mut tc, &keys, label);
    }
}

#[test]
fn key_named_twice_threads1() {
    key_named_twice(1);
}

#[test]
fn key_named_twice_threads4() {
    if skip_threads4() {
        return;
    }
    key_named_twice(4);
}

fn copy_and_replace(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut kc = kite.client();
    let mut rc = redis.client();

    for (from, to, label) in [
        (&mut kc, redis.port, "server under test -> redis-server"),
        (&mut rc, kite.port, "redis-server -> server under test"),
    ] {
        let mut tc = Client::connect(to);
        let c1 = format!("c1@{to}");
        let c1 = c1.as_str();
        let c2 = format!("c2@{to}");
        let c2 = c2.as_str();
        // COPY: the source keeps the key, the target gets it with its TTL.
        assert_ok(from.cmd(&["SET", c1, "one", "PX", "300000"]), "SET");
        assert_ok(
            migrate(from, to, c1, 0, &["COPY"]),
            &format!("{label}: COPY"),
        );
        assert_eq!(
            get(from, c1),
            Resp::bulk("one"),
            "{label}: COPY keeps the source"
        );
        assert_eq!(get(&mut tc, c1), Resp::bulk("one"), "{label}: COPY target");
        let t = pttl(&mut tc, c1);
        assert!(
            (290_000..=300_000).contains(&t),
            "{label}: PTTL after COPY is {t}"
        );
        let t = pttl(from, c1);
        assert!(
            (290_000..=300_000).contains(&t),
            "{label}: source PTTL after COPY is {t}"
        );

        // Again without REPLACE: BUSYKEY, nothing changes.
        assert_ok(from.cmd(&["SET", c1, "two"]), "SET");
        let r = migrate(from, to, c1, 0, &["COPY"]);
        assert_err(&r, BUSYKEY, &format!("{label}: COPY onto an existing key"));
        let r = migrate(from, to, c1, 0, &[]);
        assert_err(
            &r,
            BUSYKEY,
            &format!("{label}: MIGRATE onto an existing key"),
        );
        assert_eq!(
            get(from, c1),
            Resp::bulk("two"),
            "{label}: BUSYKEY keeps the source"
        );
        assert_eq!(
            get(&mut tc, c1),
            Resp::bulk("one"),
            "{label}: BUSYKEY target"
        );

        // COPY REPLACE: overwritten, and the target's TTL goes with the old value.
        assert_ok(
            migrate(from, to, c1, 0, &["COPY", "REPLACE"]),
            &format!("{label}: COPY REPLACE"),
        );
        assert_eq!(
            get(&mut tc, c1),
            Resp::bulk("two"),
            "{label}: REPLACE target"
        );
        assert_eq!(
            pttl(&mut tc, c1),
            -1,
            "{label}: REPLACE drops the target's TTL"
        );
        assert_eq!(
            get(from, c1),
            Resp::bulk("two"),
            "{label}: COPY REPLACE source"
        );

        // REPLACE of another type, without COPY: the source loses it.
        assert_eq!(from.cmd(&["RPUSH", c2, "a", "b"]), Resp::Integer(2));
        assert_eq!(from.cmd(&["PEXPIRE", c2, "200000"]), Resp::Integer(1));
        assert_ok(tc.cmd(&["SET", c2, "string on the target"]), "SET");
        assert_ok(
            migrate(from, to, c2, 0, &["REPLACE"]),
            &format!("{label}: REPLACE"),
        );
        assert_eq!(exists(from, c2), 0, "{label}: REPLACE without COPY");
        assert_eq!(
            tc.cmd(&["LRANGE", c2, "0", "-1"]),
            Resp::Array(vec![Resp::bulk("a"), Resp::bulk("b")]),
            "{label}: the list replaced the string"
        );
        let t = pttl(&mut tc, c2);
        assert!(
            (190_000..=200_000).contains(&t),
            "{label}: PTTL after REPLACE is {t}"
        );

        // COPY and REPLACE with KEYS, options in any order.
        let keys = numbered(&format!("c:k{to}"), 12);
        mset(from, &keys);
        assert_ok(tc.cmd(&["SET", &keys[5], "old"]), "SET");
        assert_ok(
            migrate_keys(from, to, 0, &["REPLACE", "COPY"], &keys),
            &format!("{label}: KEYS with REPLACE COPY"),
        );
        assert_values(&mut tc, &keys, label);
        assert_values(from, &keys, label);
    }
}

#[test]
fn copy_and_replace_threads1() {
    copy_and_replace(1);
}

#[test]
fn copy_and_replace_threads4() {
    if skip_threads4() {
        return;
    }
    copy_and_replace(4);
}

// ---------------------------------------------------------------------------
// BUSYKEY with KEYS, NOKEY
// ---------------------------------------------------------------------------

/// Without REPLACE, a key that exists on the target is refused: the error comes back,
/// that key stays on the source, the keys the target accepted are moved.
fn busykey_with_keys(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut kc = kite.client();
    let mut rc = redis.client();

    for (from, to, label) in [
        (&mut kc, redis.port, "server under test -> redis-server"),
        (&mut rc, kite.port, "redis-server -> server under test"),
    ] {
        let mut tc = Client::connect(to);
        let keys = numbered(&format!("b:{to}"), 20);
        mset(from, &keys);
        let busy = [3usize, 11, 17];
        for &i in &busy {
            assert_ok(tc.cmd(&["SET", &keys[i], "target's"]), "SET on the target");
        }
        let r = migrate_keys(from, to, 0, &[], &keys);
        assert_err(&r, BUSYKEY, &format!("{label}: KEYS with three busy keys"));
        for (i, k) in keys.iter().enumerate() {
            if busy.contains(&i) {
                assert_eq!(
                    get(from, k),
                    Resp::bulk(format!("v:{i}")),
                    "{label}: the refused key {k} stays on the source"
                );
                assert_eq!(get(&mut tc, k), Resp::bulk("target's"), "{label}: {k}");
            } else {
                assert_eq!(
                    exists(from, k),
                    0,
                    "{label}: accepted key {k} left the source"
                );
                assert_eq!(
                    get(&mut tc, k),
                    Resp::bulk(format!("v:{i}")),
                    "{label}: {k}"
                );
            }
        }
        // With REPLACE the rest goes too.
        assert_ok(
            migrate_keys(from, to, 0, &["REPLACE"], &keys),
            &format!("{label}: KEYS REPLACE after BUSYKEY"),
        );
        assert_absent(from, &keys, label);
        assert_values(&mut tc, &keys, label);
    }
}

#[test]
fn busykey_with_keys_threads1() {
    busykey_with_keys(1);
}

#[test]
fn busykey_with_keys_threads4() {
    if skip_threads4() {
        return;
    }
    busykey_with_keys(4);
}

fn nokey(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut kc = kite.client();
    let r = migrate(&mut kc, redis.port, "nokey:absent", 0, &[]);
    assert_eq!(r, Resp::simple("NOKEY"), "MIGRATE of a missing key");
    let r = migrate(&mut kc, redis.port, "nokey:absent", 0, &["COPY", "REPLACE"]);
    assert_eq!(
        r,
        Resp::simple("NOKEY"),
        "MIGRATE COPY REPLACE of a missing key"
    );
    let missing = numbered("nokey:m", 10);
    let r = migrate_keys(&mut kc, redis.port, 0, &[], &missing);
    assert_eq!(r, Resp::simple("NOKEY"), "MIGRATE KEYS of ten missing keys");
    // An expired key does not exist either.
    assert_ok(
        kc.cmd(&["SET", "nokey:expired", "x", "PX", "1"]),
        "SET PX 1",
    );
    thread::sleep(Duration::from_millis(20));
    let r = migrate(&mut kc, redis.port, "nokey:expired", 0, &[]);
    assert_eq!(r, Resp::simple("NOKEY"), "MIGRATE of an expired key");
    // NOKEY needs no connection to the target: even an unreachable one.
    let dead = dead_port();
    let r = migrate(&mut kc, dead, "nokey:absent", 0, &[]);
    assert_eq!(
        r,
        Resp::simple("NOKEY"),
        "MIGRATE of a missing key to a closed port"
    );
    // One existing key among missing ones: OK, and it moved.
    let mut named = missing.clone();
    named.insert(4, "nokey:present".into());
    assert_ok(kc.cmd(&["SET", "nokey:present", "p"]), "SET");
    assert_ok(
        migrate_keys(&mut kc, redis.port, 0, &[], &named),
        "KEYS with one existing key",
    );
    assert_eq!(exists(&mut kc, "nokey:present"), 0);
    assert_eq!(get(&mut redis.client(), "nokey:present"), Resp::bulk("p"));
    assert_eq!(redis.client().cmd(&["DBSIZE"]), Resp::Integer(1));
}

#[test]
fn nokey_threads1() {
    nokey(1);
}

#[test]
fn nokey_threads4() {
    if skip_threads4() {
        return;
    }
    nokey(4);
}

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

#[test]
fn argument_errors() {
    let kite = KiteServer::start(&[], 1);
    let redis = RedisServer::start();
    let mut c = kite.client();
    assert_ok(c.cmd(&["SET", "arg:k", "v"]), "SET");
    let p = redis.port.to_string();
    let h = "127.0.0.1";
    let cases: &[(&[&str], &str)] = &[
        (
            &["MIGRATE", h, &p, "arg:k", "0"],
            "ERR wrong number of arguments for 'migrate' command",
        ),
        (
            &["MIGRATE"],
            "ERR wrong number of arguments for 'migrate' command",
        ),
        (
            &["MIGRATE", h, &p, "arg:k", "0", "1000", "KEYS", "arg:k"],
            KEYS_NEEDS_EMPTY_KEY,
        ),
        (
            &["MIGRATE", h, &p, "arg:k", "0", "1000", "KEYS"],
            KEYS_NEEDS_EMPTY_KEY,
        ),
        (
            &["MIGRATE", h, &p, "arg:k", "0", "1000", "AUTH"],
            "ERR syntax error",
        ),
        (
            &["MIGRATE", h, &p, "arg:k", "0", "1000", "AUTH2", "user"],
            "ERR syntax error",
        ),
        (
            &["MIGRATE", h, &p, "arg:k", "0", "1000", "AUTH2"],
            "ERR syntax error",
        ),
        (
            &["MIGRATE", h, &p, "arg:k", "0", "1000", "NOSUCHOPTION"],
            "ERR syntax error",
        ),
        (
            &["MIGRATE", h, &p, "arg:k", "0", "1000", "COPY", "EXTRA"],
            "ERR syntax error",
        ),
        (
            &["MIGRATE", h, &p, "arg:k", "db", "1000"],
            "ERR value is not an integer or out of range",
        ),
        (
            &["MIGRATE", h, &p, "arg:k", "0", "1s"],
            "ERR value is not an integer or out of range",
        ),
    ];
    for (args, expected) in cases {
        let r = c.cmd(args);
        assert_err(&r, expected, &fmt_cmd(args));
        assert_eq!(
            get(&mut c, "arg:k"),
            Resp::bulk("v"),
            "after `{}`",
            fmt_cmd(args)
        );
    }
    assert_eq!(
        redis.client().cmd(&["DBSIZE"]),
        Resp::Integer(0),
        "nothing reached the target"
    );
    // Options are case-insensitive and may repeat; KEYS takes every argument after it.
    assert_ok(
        c.cmd(&[
            "migrate", h, &p, "", "0", "1000", "copy", "Copy", "replace", "keys", "arg:k",
        ]),
        "lower-case options",
    );
    assert_eq!(get(&mut redis.client(), "arg:k"), Resp::bulk("v"));
    // An empty key name without KEYS is just a key called "".
    assert_eq!(
        migrate(&mut c, redis.port, "", 0, &[]),
        Resp::simple("NOKEY")
    );
    assert_ok(c.cmd(&["SET", "", "empty name"]), "SET \"\"");
    assert_ok(
        migrate(&mut c, redis.port, "", 0, &[]),
        "MIGRATE of the key \"\"",
    );
    assert_eq!(get(&mut redis.client(), ""), Resp::bulk("empty name"));
}

// ---------------------------------------------------------------------------
// Unreachable and silent targets
// ---------------------------------------------------------------------------

/// A loopback port nothing listens on.
fn dead_port() -> u16 {
    free_port()
}

fn unreachable_targets(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    assert_ok(c.cmd(&["SET", "u:k", "v"]), "SET");
    assert_ok(c.cmd(&["SET", "u:k2", "v2"]), "SET");

    // A host name that does not resolve.
    let r = c.cmd(&["MIGRATE", "256.1.1.1", "6379", "u:k", "0", "1000"]);
    assert_err(
        &r,
        "IOERR error or timeout connecting to the client",
        "MIGRATE to a host that does not resolve",
    );
    assert_eq!(
        get(&mut c, "u:k"),
        Resp::bulk("v"),
        "the key stays after IOERR"
    );

    // A port nobody listens on.
    let dead = dead_port();
    for r in [
        migrate(&mut c, dead, "u:k", 0, &[]),
        migrate_keys(&mut c, dead, 0, &["REPLACE"], &["u:k", "u:k2"]),
    ] {
        match r.error_text() {
            Some(e) if e.starts_with("IOERR error or timeout ") => {}
            _ => panic!("MIGRATE to a closed port: expected an IOERR error, got {r}"),
        }
    }
    assert_eq!(
        get(&mut c, "u:k"),
        Resp::bulk("v"),
        "the key stays after IOERR"
    );
    assert_eq!(
        get(&mut c, "u:k2"),
        Resp::bulk("v2"),
        "the key stays after IOERR"
    );

    // A target that accepts the connection (the kernel does) and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let sport = silent.local_addr().unwrap().port().to_string();
    let started = Instant::now();
    let r = c.cmd(&["MIGRATE", "127.0.0.1", &sport, "u:k", "0", "300"]);
    let took = started.elapsed();
    assert_err(
        &r,
        "IOERR error or timeout reading to target instance",
        "MIGRATE to a target that never answers",
    );
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "the 300 ms timeout took {took:?}"
    );
    let r = c.cmd(&[
        "MIGRATE",
        "127.0.0.1",
        &sport,
        "",
        "0",
        "300",
        "KEYS",
        "u:k",
        "u:k2",
    ]);
    assert_err(
        &r,
        "IOERR error or timeout reading to target instance",
        "MIGRATE KEYS to a target that never answers",
    );
    assert_eq!(
        get(&mut c, "u:k"),
        Resp::bulk("v"),
        "the key stays after a time-out"
    );
    assert_eq!(
        get(&mut c, "u:k2"),
        Resp::bulk("v2"),
        "the key stays after a time-out"
    );
    drop(silent);

    // The server is fine, and MIGRATE works again to a real target.
    let redis = RedisServer::start();
    assert_ok(
        migrate_keys(&mut c, redis.port, 0, &[], &["u:k", "u:k2"]),
        "MIGRATE after IOERRs",
    );
    assert_eq!(get(&mut redis.client(), "u:k2"), Resp::bulk("v2"));
}

#[test]
fn unreachable_targets_threads1() {
    unreachable_targets(1);
}

#[test]
fn unreachable_targets_threads4() {
    if skip_threads4() {
        return;
    }
    unreachable_targets(4);
}

// ---------------------------------------------------------------------------
// Targets with a password, ACL users
// ---------------------------------------------------------------------------

/// A target (`--requirepass tpw`) with an ACL user `mig` (password `mpw`, all keys) and
/// `narrow` (password `npw`, only keys `allowed:*`). Runs MIGRATE from `src` through
/// every failure first and the successes last (Redis caches the authenticated
/// connection).
fn auth_cases(src: &mut Client, target: &ServerProcess, label: &str) {
    let mut tc = target.client();
    assert_ok(
        tc.cmd(&["ACL", "SETUSER", "mig", "on", ">mpw", "~*", "+@all"]),
        "ACL SETUSER mig",
    );
    assert_ok(
        tc.cmd(&[
            "ACL",
            "SETUSER",
            "narrow",
            "on",
            ">npw",
            "~allowed:*",
            "+@all",
        ]),
        "ACL SETUSER narrow",
    );
    let port = target.port;
    for k in ["a:1", "a:2", "a:3", "allowed:1"] {
        assert_ok(src.cmd(&["SET", k, k]), "SET");
    }
    let failures: &[(&[&str], &str)] = &[
        (&[], NOAUTH),
        (&["AUTH", "wrong"], WRONGPASS),
        (&["AUTH2", "mig", "wrong"], WRONGPASS),
        (&["AUTH2", "nosuchuser", "mpw"], WRONGPASS),
        (&["AUTH2", "default", "mpw"], WRONGPASS),
    ];
    for (opts, expected) in failures {
        let r = migrate(src, port, "a:1", 0, opts);
        assert_err(&r, expected, &format!("{label}: MIGRATE a:1 with {opts:?}"));
        let r = migrate_keys(src, port, 0, opts, &["a:2", "a:3"]);
        assert_err(
            &r,
            expected,
            &format!("{label}: MIGRATE KEYS with {opts:?}"),
        );
        for k in ["a:1", "a:2", "a:3"] {
            assert_eq!(
                get(src, k),
                Resp::bulk(k),
                "{label}: {k} stays after {opts:?}"
            );
        }
    }
    // A user who may not write the key: the RESTORE is refused.
    let r = migrate(src, port, "a:1", 0, &["AUTH2", "narrow", "npw"]);
    match r.error_text() {
        Some(e) if e.starts_with("ERR Target instance replied with error: NOPERM") => {}
        _ => panic!("{label}: MIGRATE of a key outside the user's patterns gave {r}"),
    }
    assert_eq!(
        get(src, "a:1"),
        Resp::bulk("a:1"),
        "{label}: a:1 stays after NOPERM"
    );
    assert_ok(
        migrate(src, port, "allowed:1", 0, &["AUTH2", "narrow", "npw"]),
        &format!("{label}: AUTH2 narrow for an allowed key"),
    );
    assert_ok(
        migrate(src, port, "a:1", 0, &["AUTH2", "mig", "mpw"]),
        &format!("{label}: AUTH2 mig"),
    );
    assert_ok(
        migrate_keys(src, port, 0, &["AUTH", "tpw"], &["a:2", "a:3"]),
        &format!("{label}: AUTH with the default user's password"),
    );
    for k in ["a:1", "a:2", "a:3", "allowed:1"] {
        assert_eq!(exists(src, k), 0, "{label}: {k} left the source");
        assert_eq!(get(&mut tc, k), Resp::bulk(k), "{label}: {k} on the target");
    }
}

fn auth_to_redis(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start_with(&["--requirepass", "tpw"]);
    auth_cases(
        &mut kite.client(),
        &redis,
        "server under test -> redis-server",
    );
}

#[test]
fn auth_to_redis_threads1() {
    auth_to_redis(1);
}

#[test]
fn auth_to_redis_threads4() {
    if skip_threads4() {
        return;
    }
    auth_to_redis(4);
}

fn auth_from_redis(threads: usize) {
    let redis = RedisServer::start();
    let kite = KiteServer::start(&["--requirepass", "tpw"], threads);
    auth_cases(
        &mut redis.client(),
        &kite,
        "redis-server -> server under test",
    );
}

#[test]
fn auth_from_redis_threads1() {
    auth_from_redis(1);
}

#[test]
fn auth_from_redis_threads4() {
    if skip_threads4() {
        return;
    }
    auth_from_redis(4);
}

/// AUTH to a target that has no password: its error is passed on.
#[test]
fn auth_to_a_target_without_password() {
    let kite = KiteServer::start(&[], 1);
    let redis = RedisServer::start();
    let mut c = kite.client();
    assert_ok(c.cmd(&["SET", "np:k", "v"]), "SET");
    let r = migrate(&mut c, redis.port, "np:k", 0, &["AUTH", "pw"]);
    match r.error_text() {
        Some(e) if e.starts_with("ERR Target instance replied with error: ERR AUTH") => {}
        _ => panic!("MIGRATE AUTH to a target without a password gave {r}"),
    }
    assert_eq!(get(&mut c, "np:k"), Resp::bulk("v"));
}

// ---------------------------------------------------------------------------
// Databases
// ---------------------------------------------------------------------------

fn target_db(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut kc = kite.client();
    let mut rc = redis.client();

    for (from, to, label) in [
        (&mut kc, redis.port, "server under test -> redis-server"),
        (&mut rc, kite.port, "redis-server -> server under test"),
    ] {
        let mut tc = Client::connect(to);
        // The source's database is the client's; the target's is the argument, and
        // changes between calls over the same (cached) connection.
        select(from, 2);
        let keys = numbered(&format!("db:{to}"), 6);
        mset(from, &keys);
        assert_ok(
            migrate(from, to, &keys[0], 5, &[]),
            &format!("{label}: to db 5"),
        );
        assert_ok(
            migrate(from, to, &keys[1], 0, &[]),
            &format!("{label}: to db 0"),
        );
        assert_ok(
            migrate(from, to, &keys[2], 5, &[]),
            &format!("{label}: to db 5 again"),
        );
        assert_ok(
            migrate_keys(from, to, 9, &[], &keys[3..]),
            &format!("{label}: KEYS to db 9"),
        );
        assert_eq!(
            from.cmd(&["DBSIZE"]),
            Resp::Integer(0),
            "{label}: source db 2"
        );
        select(from, 0);
        for (db, expect) in [
            (0usize, vec![1usize]),
            (2, vec![]),
            (5, vec![0, 2]),
            (9, vec![3, 4, 5]),
        ] {
            select(&mut tc, db);
            let found: BTreeSet<Vec<u8>> = scan_all(&mut tc)
                .into_iter()
                .filter(|k| k.starts_with(format!("db:{to}:").as_bytes()))
                .collect();
            let want: BTreeSet<Vec<u8>> = expect
                .iter()
                .map(|&i| keys[i].as_bytes().to_vec())
                .collect();
            assert_eq!(found, want, "{label}: keys in target database {db}");
            for &i in &expect {
                assert_eq!(get(&mut tc, &keys[i]), Resp::bulk(format!("v:{i}")));
            }
        }
        // A database the target does not have.
        let bad = format!("db:bad@{to}");
        assert_ok(from.cmd(&["SET", &bad, "x"]), "SET");
        let r = migrate(from, to, &bad, 99, &[]);
        match r.error_text() {
            Some(e) if e.starts_with("ERR Target instance replied with error: ERR DB index") => {}
            _ => panic!("{label}: MIGRATE to database 99 gave {r}"),
        }
        assert_eq!(get(from, &bad), Resp::bulk("x"), "{label}: db:bad stays");
        // And the cached connection still works afterwards.
        assert_ok(migrate(from, to, &bad, 1, &[]), &format!("{label}: db 1"));
        select(&mut tc, 1);
        assert_eq!(
            get(&mut tc, &bad),
            Resp::bulk("x"),
            "{label}: db:bad in db 1"
        );
    }
}

#[test]
fn target_db_threads1() {
    target_db(1);
}

#[test]
fn target_db_threads4() {
    if skip_threads4() {
        return;
    }
    target_db(4);
}

// ---------------------------------------------------------------------------
// Transactions
// ---------------------------------------------------------------------------

fn inside_multi(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut c = kite.client();
    let p = redis.port.to_string();
    let keys = numbered("multi", 8);
    let mut cmds: Vec<Vec<String>> = vec![vec!["MULTI".into()]];
    let mut set = vec!["MSET".to_string()];
    for (i, k) in keys.iter().enumerate() {
        set.push(k.clone());
        set.push(format!("v:{i}"));
    }
    cmds.push(set);
    let mut mig: Vec<String> = ["MIGRATE", "127.0.0.1", &p, "", "0", TIMEOUT_MS, "KEYS"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    mig.extend(keys.iter().cloned());
    cmds.push(mig);
    cmds.push(vec!["EXISTS".into(), keys[0].clone(), keys[7].clone()]);
    cmds.push(vec!["SET".into(), keys[0].clone(), "again".into()]);
    cmds.push(vec!["EXEC".into()]);
    let (exec, queued) = cmds.split_last().unwrap();
    let mut replies: Vec<Resp> = queued.iter().map(|cmd| c.cmd(cmd)).collect();
    c.set_timeout(Some(Duration::from_secs(5)));
    c.send(exec);
    replies.push(c.try_read().unwrap_or_else(|e| {
        panic!("no reply to the EXEC of MSET, MIGRATE KEYS, EXISTS, SET within 5 s ({e})")
    }));
    c.set_timeout(Some(READ_TIMEOUT));
    assert_eq!(replies[0], Resp::ok());
    for r in &replies[1..5] {
        assert_eq!(r, &Resp::simple("QUEUED"));
    }
    assert_eq!(
        replies[5],
        Resp::Array(vec![Resp::ok(), Resp::ok(), Resp::Integer(0), Resp::ok()]),
        "EXEC of MSET, MIGRATE KEYS, EXISTS, SET"
    );
    let mut rc = redis.client();
    assert_values(&mut rc, &keys, "target after MIGRATE in MULTI");
    assert_eq!(get(&mut c, &keys[0]), Resp::bulk("again"));
    assert_eq!(c.cmd(&["DBSIZE"]), Resp::Integer(1));
}

#[test]
fn inside_multi_threads1() {
    inside_multi(1);
}

#[test]
fn inside_multi_threads4() {
    if skip_threads4() {
        return;
    }
    inside_multi(4);
}

/// MIGRATE has no `noscript` flag: a script may call it (the key declared).
fn inside_script(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut c = kite.client();
    let p = redis.port.to_string();
    assert_ok(c.cmd(&["SET", "script:k", "v"]), "SET");
    let r = c.cmd(&[
        "EVAL",
        "return redis.call('MIGRATE', '127.0.0.1', ARGV[1], KEYS[1], 0, 10000)",
        "1",
        "script:k",
        &p,
    ]);
    assert_eq!(r, Resp::ok(), "EVAL calling MIGRATE");
    assert_eq!(exists(&mut c, "script:k"), 0, "the key left the source");
    assert_eq!(get(&mut redis.client(), "script:k"), Resp::bulk("v"));
    let r = c.cmd(&[
        "EVAL",
        "return redis.call('MIGRATE', '127.0.0.1', ARGV[1], KEYS[1], 0, 10000)",
        "1",
        "script:k",
        &p,
    ]);
    assert_eq!(
        r,
        Resp::simple("NOKEY"),
        "EVAL calling MIGRATE of a missing key"
    );
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
}

#[test]
fn inside_script_threads1() {
    inside_script(1);
}

#[test]
fn inside_script_threads4() {
    if skip_threads4() {
        return;
    }
    inside_script(4);
}

// ---------------------------------------------------------------------------
// Replicas and keyspace events of the source
// ---------------------------------------------------------------------------

/// A replica of the server under test (another instance of it) and a redis-server
/// replica both lose the keys MIGRATE moved without COPY, and keep the COPY's.
fn replica_loses_migrated_keys(threads: usize) {
    let master = KiteServer::start(&[], threads);
    let replica = KiteServer::start(&[], threads);
    let redis_replica = RedisServer::start();
    let target = RedisServer::start();
    let mut mc = master.client();
    let mut replicas = [
        ("replica (server under test)", replica.client()),
        ("redis-server replica", redis_replica.client()),
    ];
    for (_, rc) in replicas.iter_mut() {
        assert_ok(
            rc.cmd(&["REPLICAOF", "127.0.0.1", &master.port.to_string()]),
            "REPLICAOF",
        );
    }
    let keys = numbered("rep", 16);
    mset(&mut mc, &keys);
    assert_eq!(mc.cmd(&["RPUSH", "rep:list", "a", "b"]), Resp::Integer(2));
    assert_ok(mc.cmd(&["SET", "rep:copy", "c"]), "SET");
    assert_ok(mc.cmd(&["SET", "rep:single", "s"]), "SET");
    for (name, rc) in replicas.iter_mut() {
        wait_for(
            || rc.cmd(&["DBSIZE"]) == Resp::Integer(19),
            || format!("the {name} holds the master's 19 keys"),
        );
        assert_values(rc, &keys, name);
        // MIGRATE is a write: refused on a read-only replica.
        let r = migrate(rc, target.port, "rep:single", 0, &["COPY"]);
        assert_err_prefix(&r, "READONLY");
    }

    assert_ok(
        migrate(&mut mc, target.port, "rep:copy", 0, &["COPY"]),
        "COPY",
    );
    assert_ok(
        migrate(&mut mc, target.port, "rep:single", 0, &[]),
        "single key",
    );
    let mut named = keys.clone();
    named.push("rep:list".into());
    assert_ok(migrate_keys(&mut mc, target.port, 0, &[], &named), "KEYS");
    // The master's last write after the MIGRATEs: once it is on a replica, every DEL
    // before it is too.
    assert_ok(mc.cmd(&["SET", "rep:marker", "m"]), "SET marker");
    for (name, rc) in replicas.iter_mut() {
        wait_for(
            || get(rc, "rep:marker") == Resp::bulk("m"),
            || format!("the {name} got the write made after the MIGRATEs"),
        );
        assert_absent(rc, &keys, name);
        assert_eq!(exists(rc, "rep:list"), 0, "rep:list on the {name}");
        assert_eq!(exists(rc, "rep:single"), 0, "rep:single on the {name}");
        assert_eq!(
            get(rc, "rep:copy"),
            Resp::bulk("c"),
            "MIGRATE COPY keeps the key on the {name}"
        );
        assert_eq!(
            rc.cmd(&["DBSIZE"]),
            Resp::Integer(2),
            "keys of the {name}: rep:copy, rep:marker"
        );
    }
    let mut tc = target.client();
    assert_values(&mut tc, &keys, "target");
    assert_eq!(tc.cmd(&["DBSIZE"]), Resp::Integer(19));
}

#[test]
fn replica_loses_migrated_keys_threads1() {
    replica_loses_migrated_keys(1);
}

#[test]
fn replica_loses_migrated_keys_threads4() {
    if skip_threads4() {
        return;
    }
    replica_loses_migrated_keys(4);
}

/// Reads keyspace notifications from `sub` until the `marker` channel's message comes
/// and every expected event has been seen (or the deadline passes); returns the
/// (channel, message) pairs of the keyspace events, sorted.
fn collect_events(sub: &mut Client, expected: &[(String, String)]) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got: Vec<(String, String)> = Vec::new();
    let mut marker_seen = false;
    sub.set_timeout(Some(Duration::from_millis(200)));
    loop {
        let done = marker_seen && expected.iter().all(|e| got.contains(e));
        if done || Instant::now() > deadline {
            break;
        }
        let Ok(msg) = sub.try_read() else { continue };
        let items = msg
            .as_array()
            .unwrap_or_else(|| panic!("pub/sub message {msg}"));
        let kind = items[0].as_string().unwrap_or_default();
        match kind.as_str() {
            "pmessage" => got.push((items[2].as_string().unwrap(), items[3].as_string().unwrap())),
            "message" => marker_seen = true,
            other => panic!("unexpected pub/sub message {other}: {msg}"),
        }
    }
    // Anything late would show up now.
    while let Ok(msg) = sub.try_read() {
        let items = msg.as_array().unwrap().to_vec();
        if items[0].as_string().as_deref() == Some("pmessage") {
            got.push((items[2].as_string().unwrap(), items[3].as_string().unwrap()));
        }
    }
    sub.set_timeout(Some(READ_TIMEOUT));
    got.sort();
    got
}

fn del_events(keys: &[&str]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Vec::new();
    for k in keys {
        v.push((format!("__keyspace@0__:{k}"), "del".into()));
        v.push(("__keyevent@0__:del".into(), k.to_string()));
    }
    v.sort();
    v
}

fn keyspace_del_events(threads: usize) {
    let kite = KiteServer::start(&["--notify-keyspace-events", "KEA"], threads);
    let target = RedisServer::start();
    let mut c = kite.client();
    let mut sub = kite.client();
    sub.send(&["PSUBSCRIBE", "__keyspace@0__:ev:*", "__keyevent@0__:*"]);
    sub.read();
    sub.read();
    sub.send(&["SUBSCRIBE", "marker"]);
    sub.read();
    let keys: Vec<String> = numbered("ev", 6);
    let k: Vec<&str> = keys.iter().map(String::as_str).collect();
    mset(&mut c, &keys);
    // The MSET's own events.
    let mut set_events: Vec<(String, String)> = Vec::new();
    for key in &k {
        set_events.push((format!("__keyspace@0__:{key}"), "set".into()));
        set_events.push(("__keyevent@0__:set".into(), key.to_string()));
    }
    set_events.sort();
    assert_eq!(c.cmd(&["PUBLISH", "marker", "1"]), Resp::Integer(1));
    assert_eq!(
        collect_events(&mut sub, &set_events),
        set_events,
        "MSET's events"
    );

    // COPY: no event on the source.
    assert_ok(
        migrate_keys(&mut c, target.port, 0, &["COPY"], &k[..2]),
        "COPY",
    );
    assert_eq!(c.cmd(&["PUBLISH", "marker", "2"]), Resp::Integer(1));
    assert_eq!(
        collect_events(&mut sub, &[]),
        vec![],
        "events of MIGRATE COPY"
    );

    // Single key, then KEYS with one key refused (BUSYKEY: no event for it) and one
    // missing.
    assert_ok(
        migrate(&mut c, target.port, k[2], 0, &["REPLACE"]),
        "single key",
    );
    assert_ok(
        target.client().cmd(&["SET", k[4], "busy"]),
        "SET on the target",
    );
    let r = migrate_keys(
        &mut c,
        target.port,
        0,
        &[],
        &[k[3], k[4], "ev:missing", k[5]],
    );
    assert_err(&r, BUSYKEY, "KEYS with a busy key");
    assert_eq!(c.cmd(&["PUBLISH", "marker", "3"]), Resp::Integer(1));
    let expected = del_events(&[k[2], k[3], k[5]]);
    assert_eq!(
        collect_events(&mut sub, &expected),
        expected,
        "`del` events of the keys MIGRATE moved"
    );
}

#[test]
fn keyspace_del_events_threads1() {
    keyspace_del_events(1);
}

#[test]
fn keyspace_del_events_threads4() {
    if skip_threads4() {
        return;
    }
    keyspace_del_events(4);
}

// ---------------------------------------------------------------------------
// TTLs in detail
// ---------------------------------------------------------------------------

/// PTTL is carried as the time left (so a key migrated late keeps its deadline), for
/// every type, both directions; a key without TTL stays persistent.
fn ttls_kept(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut kc = kite.client();
    let mut rc = redis.client();
    for (from, to, label) in [
        (&mut kc, redis.port, "server under test -> redis-server"),
        (&mut rc, kite.port, "redis-server -> server under test"),
    ] {
        let n = |s: &str| format!("{s}@{to}");
        let setup: Vec<Vec<String>> = vec![
            vec!["SET".into(), n("t:str"), "v".into()],
            vec!["RPUSH".into(), n("t:list"), "a".into()],
            vec!["HSET".into(), n("t:hash"), "f".into(), "v".into()],
            vec!["SADD".into(), n("t:set"), "m".into()],
            vec!["ZADD".into(), n("t:zset"), "1".into(), "m".into()],
            vec![
                "XADD".into(),
                n("t:stream"),
                "1-1".into(),
                "f".into(),
                "v".into(),
            ],
            vec!["SET".into(), n("t:persist"), "p".into()],
        ];
        for cmd in &setup {
            assert!(!from.cmd(cmd).is_error(), "{}", fmt_cmd(cmd));
        }
        let with_ttl: Vec<String> = ["t:str", "t:list", "t:hash", "t:set", "t:zset", "t:stream"]
            .iter()
            .map(|k| n(k))
            .collect();
        for (i, k) in with_ttl.iter().enumerate() {
            let ms = (1_000_000 + i as i64 * 100_000).to_string();
            assert_eq!(from.cmd(&["PEXPIRE", k, &ms]), Resp::Integer(1));
        }
        let deadline_at = now_ms();
        thread::sleep(Duration::from_millis(300));
        let mut all: Vec<String> = with_ttl.clone();
        all.push(n("t:persist"));
        assert_ok(
            migrate_keys(from, to, 0, &[], &all),
            &format!("{label}: KEYS"),
        );
        let mut tc = Client::connect(to);
        for (i, k) in with_ttl.iter().enumerate() {
            let want = 1_000_000 + i as i64 * 100_000;
            let left = pttl(&mut tc, k);
            let elapsed = now_ms() - deadline_at;
            assert!(
                left <= want - 250 && left >= want - elapsed - 2000,
                "{label}: PTTL of {k} on the target is {left}; set to {want} ms {elapsed} ms ago"
            );
        }
        assert_eq!(
            pttl(&mut tc, &n("t:persist")),
            -1,
            "{label}: t:persist has no TTL"
        );
    }
}

#[test]
fn ttls_kept_threads1() {
    ttls_kept(1);
}

#[test]
fn ttls_kept_threads4() {
    if skip_threads4() {
        return;
    }
    ttls_kept(4);
}
