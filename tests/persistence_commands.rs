//! Persistence commands and behaviour: DUMP/RESTORE between Kite and Redis 7.0 (both
//! ways, every type and encoding) and RESTORE's options and errors compared with Redis;
//! SAVE / BGSAVE / LASTSAVE / INFO persistence; DEBUG RELOAD; SHUTDOWN [NOSAVE|SAVE] and
//! SIGTERM; save points; CONFIG SET dir / dbfilename / save; corrupt files at start-up;
//! point-in-time snapshots under concurrent transactions and scripts.
//!
//! Every wait polls with a deadline; nothing asserts on elapsed time.
//! `KITE_BIN=$(which redis-server) cargo test --release --test persistence_commands`
//! runs it all against Redis 7.0 (the replies expected below were taken from it).

#[macro_use]
mod common;
mod persist_support;

use common::*;
use persist_support::*;
use std::collections::BTreeMap;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

fn err(s: &str) -> Resp {
    Resp::Error(s.into())
}

// ---------------------------------------------------------------------------
// 5. DUMP / RESTORE
// ---------------------------------------------------------------------------

/// DUMPs every key of `from` and RESTOREs it (same database, same absolute expiry) on
/// `to`, then compares the two datasets.
fn dump_restore_everything(from: &mut Client, to: &mut Client, what: &str) {
    let expected = dataset(from);
    for (db, key) in expected.keys() {
        let db = db.to_string();
        assert_eq!(from.cmd(&["SELECT", &db]), Resp::ok());
        assert_eq!(to.cmd(&["SELECT", &db]), Resp::ok());
        let payload = from
            .cmd(&[b"DUMP".as_slice(), key])
            .as_bytes()
            .unwrap_or_else(|| panic!("{what}: DUMP {} gave no payload", short(key)))
            .to_vec();
        // Footer: RDB version (u16 LE), CRC-64 of everything before it (u64 LE).
        let n = payload.len();
        assert!(n > 10, "{what}: DUMP {} is too short", short(key));
        let version = u16::from_le_bytes([payload[n - 10], payload[n - 9]]);
        let crc = u64::from_le_bytes(payload[n - 8..].try_into().unwrap());
        assert_eq!(
            crc,
            crc64(&payload[..n - 8]),
            "{what}: DUMP {} CRC-64",
            short(key)
        );
        let at = from
            .cmd(&[b"PEXPIRETIME".as_slice(), key])
            .as_int()
            .expect("PEXPIRETIME");
        let r = if at > 0 {
            to.cmd(&[
                b"RESTORE".as_slice(),
                key,
                at.to_string().as_bytes(),
                &payload,
                b"ABSTTL",
            ])
        } else {
            to.cmd(&[b"RESTORE".as_slice(), key, b"0", &payload])
        };
        assert_eq!(
            r,
            Resp::ok(),
            "{what}: RESTORE {} refused the DUMP payload (RDB type {}, RDB version {version}, \
             {n} bytes). Redis 7.0 accepts versions up to 10 and the types it knows (no 20 / 21)",
            short(key),
            payload[0]
        );
    }
    assert_eq!(from.cmd(&["SELECT", "0"]), Resp::ok());
    assert_eq!(to.cmd(&["SELECT", "0"]), Resp::ok());
    let actual = dataset(to);
    assert_same_dataset(&expected, &actual, what);
}

/// Redis 7.0 DUMPs every type in every encoding (plain and compressed quicklist nodes
/// included); Kite RESTOREs them.
#[test]
fn dump_on_redis_restore_on_kite() {
    let redis = RedisServer::start_with(REFERENCE_REDIS_ARGS);
    let mut rc = redis.client();
    fill_reference_redis(&mut rc);
    for threads in [1, 4] {
        let dir = TempDir::new("dump-r2k");
        let kite = kite_on(&dir, "dump.rdb", threads, &[]);
        dump_restore_everything(
            &mut rc,
            &mut kite.client(),
            &format!("Redis DUMP -> kite --threads {threads} RESTORE"),
        );
    }
}

/// Kite DUMPs the same dataset; Redis 7.0 RESTOREs it.
#[test]
fn dump_on_kite_restore_on_redis() {
    for threads in [1, 4] {
        let dir = TempDir::new("dump-k2r");
        let kite = kite_on(&dir, "dump.rdb", threads, &[]);
        let mut kc = kite.client();
        fill_dataset(&mut kc);
        let redis = RedisServer::start();
        dump_restore_everything(
            &mut kc,
            &mut redis.client(),
            &format!("kite --threads {threads} DUMP -> Redis RESTORE"),
        );
    }
}

/// Kite RESTOREs its own DUMPs (a round trip with no other server involved).
#[test]
fn dump_restore_round_trip_on_kite() {
    let dir = TempDir::new("dump-self");
    let kite = kite_on(&dir, "dump.rdb", 4, &[]);
    let mut kc = kite.client();
    fill_dataset(&mut kc);
    let dir2 = TempDir::new("dump-self2");
    let other = kite_on(&dir2, "dump.rdb", 2, &[]);
    dump_restore_everything(&mut kc, &mut other.client(), "kite DUMP -> kite RESTORE");
}

/// What a step of the RESTORE scenario expects.
enum Expect {
    /// This exact reply (taken from Redis 7.0), on both servers.
    Reply(Resp),
    /// An integer in this range on both servers (times).
    Range(i64, i64),
    /// The same reply on both servers, whatever it is.
    Same,
}

/// A DUMP payload: `body` (type byte + value) + RDB version + CRC-64.
fn payload(body: &[u8], version: u16) -> Vec<u8> {
    let mut p = body.to_vec();
    p.extend_from_slice(&version.to_le_bytes());
    p.extend_from_slice(&[0; 8]);
    fix_crc(p)
}

/// RESTORE's options and errors, sent to Redis 7.0 and to Kite: replies must be the
/// ones Redis gives (listed here), byte for byte.
#[test]
fn restore_options_and_errors_match_redis() {
    let redis = RedisServer::start();
    let dir = TempDir::new("restore-diff");
    let kite = kite_on(&dir, "dump.rdb", 4, &[]);
    let mut rc = redis.client();
    let mut kc = kite.client();

    // The payload used throughout: Redis 7.0's DUMP of the string "v" (RDB version 10).
    rc.cmd(&["SET", "tmp", "v"]);
    let p = rc.cmd(&["DUMP", "tmp"]).as_bytes().unwrap().to_vec();
    rc.cmd(&["DEL", "tmp"]);
    assert_eq!(p, payload(b"\x00\x01v", 10), "Redis's DUMP layout");
    let mut flipped = p.clone();
    flipped[2] ^= 0x20; // the value byte: the CRC no longer matches
    let v99 = payload(b"\x00\x01v", 99); // a newer RDB version, valid CRC
    let unknown_type = payload(b"\x3f\x01v", 10);
    // A string of 40 bytes holding 2: the read runs past the end. (Redis reads the
    // value from the whole payload, footer included, so a shorter overrun would just
    // take footer bytes as data.)
    let truncated = payload(b"\x00\x28ab", 10);
    let v6 = payload(b"\x00\x01v", 6); // an older version is fine
                                       // RDB_TYPE_HASH_ZIPLIST (13) in an RDB 9 payload, as Redis 6.2 would DUMP it.
    let zl = ziplist(&[Zl::S(b"f1"), Zl::S(b"v1"), Zl::S(b"n"), Zl::I(-7)]);
    let mut body = vec![13];
    body.extend_from_slice(&rdb_str(&zl));
    let ziplist_hash = payload(&body, 9);
    // RDB_TYPE_HASH_ZIPMAP (9) in an RDB 6 payload.
    let mut body = vec![9];
    body.extend_from_slice(&rdb_str(&zipmap(&[(b"a", b"1")])));
    let zipmap_hash = payload(&body, 6);
    let future = (now_ms() + 100_000).to_string();

    let busy = || Expect::Reply(err("BUSYKEY Target key name already exists."));
    let ok = || Expect::Reply(Resp::ok());
    let wrong = || Expect::Reply(err("ERR DUMP payload version or checksum are wrong"));
    let bad = || Expect::Reply(err("ERR Bad data format"));
    let syntax = || Expect::Reply(err("ERR syntax error"));
    let notint = || Expect::Reply(err("ERR value is not an integer or out of range"));
    let int = |i: i64| Expect::Reply(Resp::Integer(i));
    let freq_err = || Expect::Reply(err("ERR Invalid FREQ value, must be >= 0 and <= 255"));
    let s = |x: &str| x.as_bytes().to_vec();
    let mut steps: Vec<(Vec<Vec<u8>>, Expect)> = vec![
        (vec![s("SET"), s("k"), s("v")], ok()),
        (vec![s("DUMP"), s("nokey")], Expect::Reply(Resp::NullBulk)),
        // The existing key is checked before the TTL and the payload.
        (vec![s("RESTORE"), s("k"), s("0"), p.clone()], busy()),
        (vec![s("RESTORE"), s("k"), s("-1"), p.clone()], busy()),
        (vec![s("RESTORE"), s("k"), s("0"), s("garbage")], busy()),
        (vec![s("RESTORE"), s("new"), s("0"), p.clone()], ok()),
        (vec![s("GET"), s("new")], Expect::Reply(Resp::bulk("v"))),
        (vec![s("PTTL"), s("new")], int(-1)),
        (vec![s("RESTORE"), s("k"), s("0"), p.clone(), s("REPLACE")], ok()),
        (vec![s("RESTORE"), s("k2"), s("-1"), p.clone()], Expect::Reply(err("ERR Invalid TTL value, must be >= 0"))),
        (vec![s("RESTORE"), s("k2"), s("abc"), p.clone()], notint()),
        (vec![s("RESTORE"), s("k2"), s("0"), flipped.clone()], wrong()),
        (vec![s("RESTORE"), s("k2"), s("0"), v99.clone()], wrong()),
        (vec![s("RESTORE"), s("k2"), s("0"), s("x")], wrong()),
        (vec![s("RESTORE"), s("k2"), s("0"), s("")], wrong()),
        (vec![s("RESTORE"), s("k2"), s("0"), unknown_type.clone()], bad()),
        (vec![s("RESTORE"), s("k2"), s("0"), truncated.clone()], bad()),
        (vec![s("EXISTS"), s("k2")], int(0)),
        // Options: parsed before anything else.
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("IDLETIME"), s("-1")], Expect::Reply(err("ERR Invalid IDLETIME value, must be >= 0"))),
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("FREQ"), s("256")], freq_err()),
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("FREQ"), s("-1")], freq_err()),
        (vec![s("RESTORE"), s("k"), s("0"), p.clone(), s("FREQ"), s("300")], freq_err()),
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("IDLETIME"), s("5"), s("FREQ"), s("3")], syntax()),
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("FREQ"), s("3"), s("IDLETIME"), s("5")], syntax()),
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("FOO")], syntax()),
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("IDLETIME")], syntax()),
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("IDLETIME"), s("abc")], notint()),
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("FREQ"), s("x")], notint()),
        (vec![s("EXISTS"), s("k2")], int(0)),
        // FREQ without an LFU policy: accepted, not tracked.
        (vec![s("RESTORE"), s("k2"), s("0"), p.clone(), s("FREQ"), s("5")], ok()),
        (vec![s("OBJECT"), s("FREQ"), s("k2")], Expect::Reply(err("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust."))),
        (vec![s("RESTORE"), s("k3"), s("0"), p.clone(), s("IDLETIME"), s("1000")], ok()),
        (vec![s("OBJECT"), s("IDLETIME"), s("k3")], Expect::Range(1000, 1010)),
        // ABSTTL in the past: OK, nothing stored; with REPLACE the old key goes.
        (vec![s("RESTORE"), s("k4"), s("1"), p.clone(), s("ABSTTL")], ok()),
        (vec![s("EXISTS"), s("k4")], int(0)),
        (vec![s("RESTORE"), s("k"), s("1"), p.clone(), s("ABSTTL"), s("REPLACE")], ok()),
        (vec![s("EXISTS"), s("k")], int(0)),
        (vec![s("RESTORE"), s("k5"), s("100000"), p.clone()], ok()),
        (vec![s("PTTL"), s("k5")], Expect::Range(90_000, 100_000)),
        (vec![s("RESTORE"), s("k6"), s(&future), p.clone(), s("ABSTTL")], ok()),
        (vec![s("PTTL"), s("k6")], Expect::Range(50_000, 100_000)),
        (vec![s("PEXPIRETIME"), s("k6")], Expect::Same),
        (vec![s("RESTORE"), s("k7"), s("0"), p.clone(), s("REPLACE"), s("ABSTTL"), s("IDLETIME"), s("10"), s("REPLACE")], ok()),
        (vec![s("RESTORE")], Expect::Reply(err("ERR wrong number of arguments for 'restore' command"))),
        (vec![s("RESTORE"), s("k"), s("0")], Expect::Reply(err("ERR wrong number of arguments for 'restore' command"))),
        (vec![s("DUMP")], Expect::Reply(err("ERR wrong number of arguments for 'dump' command"))),
        (vec![s("DUMP"), s("a"), s("b")], Expect::Reply(err("ERR wrong number of arguments for 'dump' command"))),
        // REPLACE over another type.
        (vec![s("HSET"), s("h"), s("f"), s("v")], int(1)),
        (vec![s("RESTORE"), s("h"), s("0"), p.clone(), s("REPLACE")], ok()),
        (vec![s("TYPE"), s("h")], Expect::Reply(Resp::simple("string"))),
        // Payloads of older versions and encodings.
        (vec![s("RESTORE"), s("old6"), s("0"), v6.clone()], ok()),
        (vec![s("GET"), s("old6")], Expect::Reply(Resp::bulk("v"))),
        (vec![s("RESTORE"), s("zlhash"), s("0"), ziplist_hash.clone()], ok()),
        (vec![s("HGETALL"), s("zlhash")], Expect::Reply(Resp::Array(vec![Resp::bulk("f1"), Resp::bulk("v1"), Resp::bulk("n"), Resp::bulk("-7")]))),
        (vec![s("RESTORE"), s("zmap"), s("0"), zipmap_hash.clone()], ok()),
        (vec![s("HGETALL"), s("zmap")], Expect::Reply(Resp::Array(vec![Resp::bulk("a"), Resp::bulk("1")]))),
    ];
    // LFU counters (OBJECT FREQ under an LFU policy) are issue 13's: Kite keeps none yet,
    // so these steps run against Redis alone, to keep the expectations checked.
    if kite_is_redis() {
        let lfu_steps = vec![
            // With an LFU policy FREQ is kept and IDLETIME is ignored.
            (vec![s("CONFIG"), s("SET"), s("maxmemory-policy"), s("allkeys-lfu")], ok()),
            (vec![s("RESTORE"), s("k8"), s("0"), p.clone(), s("FREQ"), s("100")], ok()),
            (vec![s("OBJECT"), s("FREQ"), s("k8")], int(100)),
            (vec![s("OBJECT"), s("IDLETIME"), s("k8")], Expect::Reply(err("ERR An LFU maxmemory policy is selected, idle time not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust."))),
            (vec![s("RESTORE"), s("k9"), s("0"), p.clone()], ok()),
            (vec![s("OBJECT"), s("FREQ"), s("k9")], int(5)),
            (vec![s("RESTORE"), s("k10"), s("0"), p.clone(), s("IDLETIME"), s("50")], ok()),
            (vec![s("OBJECT"), s("FREQ"), s("k10")], int(5)),
            (vec![s("CONFIG"), s("SET"), s("maxmemory-policy"), s("noeviction")], ok()),
        ];
        steps.extend(lfu_steps);
    }
    // Every step runs; Kite's mismatches are listed together at the end.
    let mut mismatches = Vec::new();
    for (i, (cmd, expect)) in steps.iter().enumerate() {
        let r_redis = rc.cmd(cmd);
        let r_kite = kc.cmd(cmd);
        let ctx = format!(
            "step {i}: `{}`\n    redis: {r_redis}\n    kite:  {r_kite}",
            fmt_cmd(cmd)
        );
        let in_range =
            |r: &Resp, lo: i64, hi: i64| r.as_int().is_some_and(|v| (lo..=hi).contains(&v));
        let kite_ok = match expect {
            Expect::Reply(want) => {
                assert_eq!(
                    &r_redis, want,
                    "the reference disagrees with the test, {ctx}"
                );
                &r_kite == want
            }
            Expect::Range(lo, hi) => {
                assert!(
                    in_range(&r_redis, *lo, *hi),
                    "the reference is not in {lo}..={hi}, {ctx}"
                );
                in_range(&r_kite, *lo, *hi)
            }
            Expect::Same => r_redis == r_kite,
        };
        if !kite_ok {
            mismatches.push(ctx);
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} RESTORE step(s) differ from Redis:\n  {}",
        mismatches.len(),
        mismatches.join("\n  ")
    );
}

// ---------------------------------------------------------------------------
// 6. SAVE, BGSAVE, LASTSAVE, INFO, DEBUG RELOAD, SHUTDOWN, SIGTERM, save points, CONFIG
// ---------------------------------------------------------------------------

fn lastsave(c: &mut Client) -> i64 {
    c.cmd(&["LASTSAVE"])
        .as_int()
        .expect("LASTSAVE is an integer")
}

/// SAVE writes the file, resets the change counter and moves LASTSAVE forward (the test
/// first waits for the clock's second to pass the current LASTSAVE).
#[test]
fn save_updates_lastsave_and_info() {
    let dir = TempDir::new("save");
    let kite = kite_on(&dir, "dump.rdb", 4, &[]);
    let mut c = kite.client();
    assert_eq!(info_req(&mut c, "persistence", "loading"), "0");
    assert_eq!(
        info_req(&mut c, "persistence", "rdb_changes_since_last_save"),
        "0"
    );
    let before = lastsave(&mut c);
    // 100 ms into the next second: time(2) reads a coarse clock that may lag a tick.
    assert!(
        wait_until(Duration::from_secs(3), || now_ms()
            > (before + 1) * 1000 + 100),
        "clock stuck"
    );
    assert_eq!(c.cmd(&["SET", "a", "1"]), Resp::ok());
    assert_eq!(
        info_req(&mut c, "persistence", "rdb_changes_since_last_save"),
        "1"
    );
    for k in ["b", "c", "d"] {
        assert_eq!(c.cmd(&["SET", k, "1"]), Resp::ok());
    }
    assert_eq!(
        info_req(&mut c, "persistence", "rdb_changes_since_last_save"),
        "4"
    );
    assert_eq!(c.cmd(&["SAVE"]), Resp::ok());
    let after = lastsave(&mut c);
    assert!(
        after > before,
        "LASTSAVE {after} did not move past {before}"
    );
    assert!(after <= now_secs() + 1, "LASTSAVE {after} is in the future");
    assert_eq!(
        info_req(&mut c, "persistence", "rdb_last_save_time"),
        after.to_string()
    );
    assert_eq!(
        info_req(&mut c, "persistence", "rdb_changes_since_last_save"),
        "0"
    );
    assert!(dir.file("dump.rdb").is_file(), "SAVE wrote no dump.rdb");
    assert_eq!(
        c.cmd(&["SAVE", "x"]),
        err("ERR wrong number of arguments for 'save' command")
    );
    assert_eq!(
        c.cmd(&["LASTSAVE", "x"]),
        err("ERR wrong number of arguments for 'lastsave' command")
    );
    assert_eq!(c.cmd(&["BGSAVE", "x"]), err("ERR syntax error"));
    assert_eq!(c.cmd(&["BGSAVE", "SCHEDULE", "x"]), err("ERR syntax error"));
    assert_eq!(c.cmd(&["SHUTDOWN", "x"]), err("ERR syntax error"));
    assert_eq!(
        c.cmd(&["SHUTDOWN", "NOSAVE", "SAVE"]),
        err("ERR syntax error")
    );
}

/// BGSAVE answers at once, INFO shows it finishing, and the file holds the data of the
/// moment it started.
#[test]
fn bgsave_completes_and_file_loads() {
    for threads in [1, 4] {
        let dir = TempDir::new("bgsave");
        let kite = kite_on(&dir, "dump.rdb", threads, &[]);
        let mut c = kite.client();
        fill_dataset(&mut c);
        let expected = dataset(&mut c);
        assert_eq!(
            c.cmd(&["BGSAVE"]),
            Resp::simple("Background saving started")
        );
        wait_bgsave_done(&mut c);
        assert_eq!(
            info_req(&mut c, "persistence", "rdb_changes_since_last_save"),
            "0"
        );
        assert_eq!(
            info_req(&mut c, "persistence", "rdb_last_save_time"),
            lastsave(&mut c).to_string()
        );
        // BGSAVE SCHEDULE with nothing running starts one at once.
        assert_eq!(
            c.cmd(&["BGSAVE", "SCHEDULE"]),
            Resp::simple("Background saving started")
        );
        wait_bgsave_done(&mut c);
        let dir2 = TempDir::new("bgsave-load");
        copy_into(&dir.file("dump.rdb"), &dir2, "dump.rdb");
        let again = kite_on(&dir2, "dump.rdb", threads, &[]);
        assert_same_dataset(
            &expected,
            &dataset(&mut again.client()),
            &format!("BGSAVE file, --threads {threads}"),
        );
    }
}

/// A second BGSAVE (or a SAVE, or BGSAVE SCHEDULE) while one runs is refused with
/// Redis's text, and INFO shows the one in progress. The commands go in one pipeline
/// right behind the first BGSAVE, so they reach the server while it writes 20000 keys.
#[test]
fn bgsave_while_one_runs_is_refused() {
    let dir = TempDir::new("bgsave-busy");
    let kite = kite_on(&dir, "dump.rdb", 2, &[]);
    let mut c = kite.client();
    for chunk in 0..20 {
        let mut mset = vec!["MSET".to_string()];
        for i in chunk * 1000..(chunk + 1) * 1000 {
            mset.push(format!("key:{i}"));
            mset.push(format!("value-{i}-{}", i * 7919 % 10007));
        }
        assert_eq!(c.cmd(&mset), Resp::ok());
    }
    let replies = c.pipeline(&[
        vec!["BGSAVE"],
        vec!["BGSAVE"],
        vec!["SAVE"],
        vec!["BGSAVE", "SCHEDULE"],
        vec!["INFO", "persistence"],
        vec!["SET", "during", "1"],
    ]);
    assert_eq!(replies[0], Resp::simple("Background saving started"));
    let busy = err("ERR Background save already in progress");
    assert_eq!(replies[1], busy, "BGSAVE during BGSAVE");
    assert_eq!(replies[2], busy, "SAVE during BGSAVE");
    assert_eq!(replies[3], busy, "BGSAVE SCHEDULE during BGSAVE");
    let info = replies[4].as_string().unwrap_or_default();
    assert!(
        info.contains("rdb_bgsave_in_progress:1"),
        "INFO during BGSAVE:\n{info}"
    );
    assert_eq!(replies[5], Resp::ok(), "writes are served during BGSAVE");
    wait_bgsave_done(&mut c);
    // The write made during the save is not in the file, so it still counts.
    assert_eq!(
        info_req(&mut c, "persistence", "rdb_changes_since_last_save"),
        "1"
    );
    drop(kite);
    let dir2 = TempDir::new("bgsave-busy-load");
    copy_into(&dir.file("dump.rdb"), &dir2, "dump.rdb");
    let again = kite_on(&dir2, "dump.rdb", 2, &[]);
    let mut c = again.client();
    assert_eq!(c.cmd(&["DBSIZE"]), Resp::Integer(20_000));
    assert_eq!(c.cmd(&["EXISTS", "during"]), Resp::Integer(0));
    assert_eq!(
        c.cmd(&["GET", "key:19999"]),
        Resp::bulk(format!("value-19999-{}", 19999 * 7919 % 10007))
    );
}

/// DEBUG RELOAD saves and loads back: the dataset is unchanged.
#[test]
fn debug_reload_keeps_data() {
    for threads in [1, 4] {
        let dir = TempDir::new("reload");
        let kite = kite_on(
            &dir,
            "dump.rdb",
            threads,
            &["--enable-debug-command", "yes"],
        );
        let mut c = kite.client();
        fill_dataset(&mut c);
        let expected = dataset(&mut c);
        assert_eq!(c.cmd(&["DEBUG", "RELOAD"]), Resp::ok());
        assert_same_dataset(
            &expected,
            &dataset(&mut c),
            &format!("after DEBUG RELOAD, --threads {threads}"),
        );
        assert!(
            dir.file("dump.rdb").is_file(),
            "DEBUG RELOAD saves the file"
        );
        assert_eq!(
            c.cmd(&["DEBUG", "RELOAD", "x"]),
            err("ERR DEBUG RELOAD only supports the MERGE, NOFLUSH and NOSAVE options.")
        );
    }
}

/// Sends SHUTDOWN [arg] and expects the connection to close without a reply and the
/// process to exit.
fn shutdown(s: &mut ServerProcess, arg: Option<&str>) {
    let mut c = s.client();
    match arg {
        Some(a) => c.send(&["SHUTDOWN", a]),
        None => c.send(&["SHUTDOWN"]),
    }
    match c.try_read() {
        Err(_) => {}
        Ok(r) => panic!("SHUTDOWN {arg:?} replied {r} instead of closing"),
    }
    wait_exit(s, "after SHUTDOWN");
}

/// SHUTDOWN NOSAVE keeps the file of the last SAVE as it was; SHUTDOWN SAVE saves even
/// without save points; plain SHUTDOWN without save points does not save.
#[test]
fn shutdown_nosave_save_and_plain() {
    let dir = TempDir::new("shutdown");
    let mut kite = kite_on(&dir, "dump.rdb", 4, &[]);
    let mut c = kite.client();
    assert_eq!(c.cmd(&["SET", "saved", "1"]), Resp::ok());
    assert_eq!(c.cmd(&["SAVE"]), Resp::ok());
    assert_eq!(c.cmd(&["SET", "unsaved", "1"]), Resp::ok());
    shutdown(&mut kite, Some("NOSAVE"));

    let mut kite = kite_on(&dir, "dump.rdb", 4, &[]);
    let mut c = kite.client();
    assert_eq!(c.cmd(&["GET", "saved"]), Resp::bulk("1"));
    assert_eq!(
        c.cmd(&["EXISTS", "unsaved"]),
        Resp::Integer(0),
        "SHUTDOWN NOSAVE saved"
    );
    assert_eq!(c.cmd(&["SET", "via-shutdown-save", "1"]), Resp::ok());
    shutdown(&mut kite, Some("SAVE"));

    let mut kite = kite_on(&dir, "dump.rdb", 1, &[]);
    let mut c = kite.client();
    assert_eq!(
        c.cmd(&["GET", "via-shutdown-save"]),
        Resp::bulk("1"),
        "SHUTDOWN SAVE did not save"
    );
    assert_eq!(c.cmd(&["GET", "saved"]), Resp::bulk("1"));
    assert_eq!(c.cmd(&["SET", "after", "1"]), Resp::ok());
    shutdown(&mut kite, None);

    let kite = kite_on(&dir, "dump.rdb", 1, &[]);
    let mut c = kite.client();
    assert_eq!(
        c.cmd(&["EXISTS", "after"]),
        Resp::Integer(0),
        "SHUTDOWN without save points saved"
    );
    assert_eq!(c.cmd(&["DBSIZE"]), Resp::Integer(2));
}

fn sigterm(s: &mut ServerProcess) {
    let st = std::process::Command::new("kill")
        .args(["-TERM", &s.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -TERM failed");
    wait_exit(s, "after SIGTERM");
}

/// SIGTERM saves when save points are set (like Redis) and does not when there are none.
#[test]
fn sigterm_saves_only_with_save_points() {
    let dir = TempDir::new("sigterm");
    let mut kite = kite_on(&dir, "dump.rdb", 4, &["--save", "3600 1"]);
    let mut c = kite.client();
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "save"]),
        Resp::Array(vec![Resp::bulk("save"), Resp::bulk("3600 1")])
    );
    fill_dataset(&mut c);
    let expected = dataset(&mut c);
    sigterm(&mut kite);
    let kite = kite_on(&dir, "dump.rdb", 4, &[]);
    assert_same_dataset(
        &expected,
        &dataset(&mut kite.client()),
        "after SIGTERM with save points",
    );

    let dir = TempDir::new("sigterm-nosave");
    let mut kite = kite_on(&dir, "dump.rdb", 4, &[]);
    assert_eq!(kite.client().cmd(&["SET", "x", "1"]), Resp::ok());
    sigterm(&mut kite);
    assert!(
        !dir.file("dump.rdb").exists(),
        "SIGTERM without save points wrote a file"
    );
}

/// `--save "1 1"`: one change makes a background save within a bounded wait.
#[test]
fn save_point_triggers_background_save() {
    let dir = TempDir::new("savepoint");
    let kite = kite_on(&dir, "dump.rdb", 4, &["--save", "1 1"]);
    let mut c = kite.client();
    assert_eq!(c.cmd(&["SET", "k", "v"]), Resp::ok());
    let saved = wait_until(Duration::from_secs(15), || {
        dir.file("dump.rdb").is_file()
            && info_req(&mut c, "persistence", "rdb_changes_since_last_save") == "0"
            && info_req(&mut c, "persistence", "rdb_bgsave_in_progress") == "0"
    });
    assert!(
        saved,
        "no save within 15 s of a change with save point \"1 1\""
    );
    assert_eq!(
        info_req(&mut c, "persistence", "rdb_last_bgsave_status"),
        "ok"
    );
    let dir2 = TempDir::new("savepoint-load");
    copy_into(&dir.file("dump.rdb"), &dir2, "dump.rdb");
    let again = kite_on(&dir2, "dump.rdb", 1, &[]);
    assert_eq!(again.client().cmd(&["GET", "k"]), Resp::bulk("v"));
}

/// CONFIG SET / GET of dir, dbfilename and save, compared with Redis 7.0: dir and
/// dbfilename are protected configs (refused unless enable-protected-configs), then
/// errors for a missing directory, a file, a path as dbfilename, bad save parameters.
#[test]
fn config_dir_dbfilename_save_match_redis() {
    let cases: Vec<(Vec<String>, Resp)> = {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
        let cfg = |arg: &str, why: &str| {
            err(&format!(
                "ERR CONFIG SET failed (possibly related to argument '{arg}') - {why}"
            ))
        };
        vec![
            (
                s(&["CONFIG", "SET", "dir", "/nonexistent/kite-dir"]),
                cfg("dir", "can't set protected config"),
            ),
            (
                s(&["CONFIG", "SET", "dbfilename", "x.rdb"]),
                cfg("dbfilename", "can't set protected config"),
            ),
            (
                s(&["CONFIG", "SET", "rdbchecksum", "no"]),
                cfg("rdbchecksum", "can't set immutable config"),
            ),
            (
                s(&["CONFIG", "SET", "rdbcompression", "maybe"]),
                cfg("rdbcompression", "argument must be 'yes' or 'no'"),
            ),
            (
                s(&["CONFIG", "SET", "save", "60"]),
                cfg("save", "Invalid save parameters"),
            ),
            (
                s(&["CONFIG", "SET", "save", "abc 1"]),
                cfg("save", "Invalid save parameters"),
            ),
            (s(&["CONFIG", "SET", "save", "60 1 30 2"]), Resp::ok()),
            (
                s(&["CONFIG", "GET", "save"]),
                Resp::Array(vec![Resp::bulk("save"), Resp::bulk("60 1 30 2")]),
            ),
            (s(&["CONFIG", "SET", "save", ""]), Resp::ok()),
            (
                s(&["CONFIG", "GET", "save"]),
                Resp::Array(vec![Resp::bulk("save"), Resp::bulk("")]),
            ),
            (s(&["CONFIG", "SET", "rdbcompression", "no"]), Resp::ok()),
            (
                s(&["CONFIG", "GET", "rdbchecksum"]),
                Resp::Array(vec![Resp::bulk("rdbchecksum"), Resp::bulk("yes")]),
            ),
        ]
    };
    let rdir = TempDir::new("cfg-redis");
    let kdir = TempDir::new("cfg-kite");
    let redis = redis_on(&rdir, "dump.rdb", &[]);
    let kite = kite_on(&kdir, "dump.rdb", 2, &[]);
    let (mut rc, mut kc) = (redis.client(), kite.client());
    let mut mismatches = Vec::new();
    for (cmd, want) in &cases {
        let r = rc.cmd(cmd);
        assert_eq!(
            &r,
            want,
            "the reference disagrees with the test: `{}`",
            fmt_cmd(cmd)
        );
        let k = kc.cmd(cmd);
        if &k != want {
            mismatches.push(format!(
                "`{}`\n    redis: {r}\n    kite:  {k}",
                fmt_cmd(cmd)
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} CONFIG step(s) differ from Redis:\n  {}",
        mismatches.len(),
        mismatches.join("\n  ")
    );

    // With enable-protected-configs yes.
    let rdir = TempDir::new("cfg-redis-p");
    let kdir = TempDir::new("cfg-kite-p");
    let redis = redis_on(&rdir, "dump.rdb", &["--enable-protected-configs", "yes"]);
    let kite = kite_on(&kdir, "dump.rdb", 2, &["--enable-protected-configs", "yes"]);
    for (name, mut c, dir) in [
        ("redis", redis.client(), &rdir),
        ("kite", kite.client(), &kdir),
    ] {
        let cfg = |arg: &str, why: &str| {
            err(&format!(
                "ERR CONFIG SET failed (possibly related to argument '{arg}') - {why}"
            ))
        };
        assert_eq!(
            c.cmd(&["CONFIG", "GET", "dir"]),
            Resp::Array(vec![Resp::bulk("dir"), Resp::bulk(dir.arg())]),
            "{name}"
        );
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "dir", "/nonexistent/kite-dir"]),
            cfg("dir", "No such file or directory"),
            "{name}"
        );
        let file = dir.file("a-file");
        fs::write(&file, b"x").unwrap();
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "dir", &file.to_string_lossy()]),
            cfg("dir", "Not a directory"),
            "{name}"
        );
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "dbfilename", "a/b.rdb"]),
            cfg("dbfilename", "dbfilename can't be a path, just a filename"),
            "{name}"
        );
        // A valid new directory and file name: SAVE writes there.
        let sub = dir.file("sub");
        fs::create_dir(&sub).unwrap();
        let sub_s = sub.to_string_lossy().into_owned();
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "dir", &sub_s]),
            Resp::ok(),
            "{name}"
        );
        assert_eq!(
            c.cmd(&["CONFIG", "GET", "dir"]),
            Resp::Array(vec![Resp::bulk("dir"), Resp::bulk(&sub_s)]),
            "{name}"
        );
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "dbfilename", "other.rdb"]),
            Resp::ok(),
            "{name}"
        );
        assert_eq!(
            c.cmd(&["CONFIG", "GET", "dbfilename"]),
            Resp::Array(vec![Resp::bulk("dbfilename"), Resp::bulk("other.rdb")]),
            "{name}"
        );
        assert_eq!(c.cmd(&["SET", "k", "v"]), Resp::ok());
        assert_eq!(c.cmd(&["SAVE"]), Resp::ok(), "{name}");
        assert!(
            sub.join("other.rdb").is_file(),
            "{name}: SAVE did not write {sub_s}/other.rdb"
        );
        assert!(
            !dir.file("dump.rdb").exists(),
            "{name}: SAVE wrote to the old place"
        );
    }
}

// ---------------------------------------------------------------------------
// 7. Corrupt files at start-up
// ---------------------------------------------------------------------------

/// A file written by the server under test: a marker string and enough other data
/// that the middle of the file is inside some value.
fn written_file(extra: &[&str]) -> Vec<u8> {
    let dir = TempDir::new("corrupt-src");
    let kite = kite_on(&dir, "dump.rdb", 1, extra);
    let mut c = kite.client();
    assert_eq!(
        c.cmd(&["SET", "corrupt:marker", "marker-value"]),
        Resp::ok()
    );
    let mut push = vec!["RPUSH".to_string(), "corrupt:list".into()];
    push.extend((0..300).map(|i| format!("element-{i}-{}", i * 7919 % 1000)));
    c.cmd(&push);
    let mut hset = vec!["HSET".to_string(), "corrupt:hash".into()];
    for i in 0..100 {
        hset.push(format!("f{i}"));
        hset.push(format!("{}", i * 104729 % 99991));
    }
    c.cmd(&hset);
    assert_eq!(c.cmd(&["SAVE"]), Resp::ok());
    fs::read(dir.file("dump.rdb")).expect("SAVE wrote dump.rdb")
}

/// Starts the server under test on `bytes` (as `name`) and expects it to refuse:
/// non-zero exit, by itself (no signal), output naming the file; `offset` also asks for
/// the word "offset".
fn expect_refused(bytes: &[u8], name: &str, extra: &[&str], offset: bool) -> Exited {
    let dir = TempDir::new("corrupt");
    fs::write(dir.file(name), bytes).unwrap();
    let ex = start_expect_exit(&dir, name, extra);
    assert!(
        !ex.status.success(),
        "{name}: exited with success; output:\n{}",
        ex.output
    );
    assert!(
        ex.status.code().is_some(),
        "{name}: killed by a signal ({}); output:\n{}",
        ex.status,
        ex.output
    );
    if offset {
        assert!(
            ex.output.contains(name),
            "{name}: the output does not name the file:\n{}",
            ex.output
        );
        assert!(
            ex.output.to_lowercase().contains("offset"),
            "{name}: the output gives no offset:\n{}",
            ex.output
        );
    }
    if !kite_is_redis() {
        assert!(
            !ex.output.contains("panicked"),
            "{name}: a panic, not a clean refusal:\n{}",
            ex.output
        );
    }
    ex
}

/// Loads `bytes` and returns the marker's value.
fn load_marker(bytes: &[u8], extra: &[&str]) -> Resp {
    let dir = TempDir::new("corrupt-ok");
    fs::write(dir.file("dump.rdb"), bytes).unwrap();
    let kite = kite_on(&dir, "dump.rdb", 1, extra);

    kite.client().cmd(&["GET", "corrupt:marker"])
}

#[test]
fn corrupt_files_stop_startup() {
    let file = written_file(&[]);
    let n = file.len();
    assert!(n > 1000, "file of {n} bytes");

    // (a) one byte flipped in the middle: a bad length, a bad encoding, or (inside a
    // value's bytes) a CRC mismatch.
    let mut flipped = file.clone();
    flipped[n / 2] ^= 0xFF;
    expect_refused(&flipped, "flipped.rdb", &[], true);

    // (b) cut in half.
    expect_refused(&file[..n / 2], "half.rdb", &[], true);

    // (c) an unknown type byte before a key (in a file without CRC, so the type is
    // what fails).
    let nocrc = written_file(&["--rdbchecksum", "no"]);
    let (ty, _) = find_key(&nocrc, b"corrupt:marker").expect("marker key in the file");
    assert_eq!(ty, 0, "marker is a string");
    let at = nocrc
        .windows(15)
        .position(|w| w == b"\x0ecorrupt:marker")
        .unwrap()
        - 1;
    let mut badtype = nocrc.clone();
    badtype[at] = 0x3F;
    expect_refused(&badtype, "badtype.rdb", &[], true);

    // Empty file, wrong magic, a version from the future.
    expect_refused(b"", "empty.rdb", &[], false);
    let mut magic = file.clone();
    magic[..5].copy_from_slice(b"REDIX");
    expect_refused(&magic, "magic.rdb", &[], false);
    let mut future = file.clone();
    future[5..9].copy_from_slice(b"0099");
    expect_refused(&future, "future.rdb", &[], false);
}

/// Checksums as Redis treats them: a file whose CRC is 0 (saved with rdbchecksum no)
/// loads whatever the setting; a wrong nonzero CRC stops start-up with rdbchecksum yes
/// and is not checked with rdbchecksum no.
#[test]
fn checksum_rules_match_redis() {
    let nocrc = written_file(&["--rdbchecksum", "no"]);
    assert_eq!(&nocrc[nocrc.len() - 8..], &[0u8; 8]);
    assert_eq!(load_marker(&nocrc, &[]), Resp::bulk("marker-value"));
    assert_eq!(
        load_marker(&nocrc, &["--rdbchecksum", "no"]),
        Resp::bulk("marker-value")
    );

    let file = written_file(&[]);
    let mut badcrc = file.clone();
    let n = badcrc.len();
    badcrc[n - 1] ^= 0x01;
    expect_refused(&badcrc, "badcrc.rdb", &[], true);
    assert_eq!(
        load_marker(&badcrc, &["--rdbchecksum", "no"]),
        Resp::bulk("marker-value")
    );

    // The reference behaves the same way on these very files.
    let dir = TempDir::new("crc-redis");
    fs::write(dir.file("badcrc.rdb"), &badcrc).unwrap();
    let ex = start_redis_expect_exit(&dir, "badcrc.rdb", &[]);
    assert!(!ex.status.success());
    let dir = TempDir::new("crc-redis-ok");
    fs::write(dir.file("dump.rdb"), &badcrc).unwrap();
    let redis = redis_on(&dir, "dump.rdb", &["--rdbchecksum", "no"]);
    assert_eq!(
        redis.client().cmd(&["GET", "corrupt:marker"]),
        Resp::bulk("marker-value")
    );
}

// ---------------------------------------------------------------------------
// 8. Point in time under load
// ---------------------------------------------------------------------------

const ACCOUNTS: usize = 100;
const START_BALANCE: i64 = 1000;
const QUEUES: usize = 4;
const JOBS: usize = 200;

fn account(i: usize) -> String {
    // One hashtag each: the accounts spread over every shard.
    format!("acct:{{{i}}}")
}

fn job_list(q: usize, which: &str) -> String {
    format!("bull:{{q{q}}}:{which}")
}

fn all_lists() -> Vec<String> {
    (0..QUEUES)
        .flat_map(|q| [job_list(q, "wait"), job_list(q, "active")])
        .collect()
}

/// Moves a job from KEYS[1] to KEYS[2] (two lists of one queue: one hashtag, as BullMQ
/// does) and records where it is in the job's own hash, a key the script builds that
/// lives on whatever shard its hashtag picks.
const MOVE_SCRIPT: &str = "
local id = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
if id then
  redis.call('HSET', 'job:{' .. id .. '}', 'list', KEYS[2], 'moves', '1')
end
return id";

/// Checks a dataset (a saved file, loaded) for the invariants: the balances add up,
/// every job is in exactly one list and its hash names that list.
fn check_invariants(c: &mut Client, what: &str) {
    let mut mget = vec!["MGET".to_string()];
    mget.extend((0..ACCOUNTS).map(account));
    let r = c.cmd(&mget);
    let vals = r.as_array().unwrap_or_else(|| panic!("{what}: MGET {r}"));
    let mut total = 0i64;
    for (i, v) in vals.iter().enumerate() {
        let n = v
            .parse_int()
            .unwrap_or_else(|| panic!("{what}: {} is {v}, not an integer", account(i)));
        total += n;
    }
    assert_eq!(
        total,
        START_BALANCE * ACCOUNTS as i64,
        "{what}: balances do not add up"
    );

    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for list in all_lists() {
        let r = c.cmd(&["LRANGE", &list, "0", "-1"]);
        for id in r
            .as_array()
            .unwrap_or_else(|| panic!("{what}: LRANGE {list}: {r}"))
        {
            let id = id.as_string().unwrap();
            if let Some(other) = seen.insert(id.clone(), list.clone()) {
                panic!("{what}: job {id} is in {other} and in {list}");
            }
        }
    }
    assert_eq!(
        seen.len(),
        JOBS,
        "{what}: {} jobs in the lists, expected {JOBS}",
        seen.len()
    );
    for (id, list) in &seen {
        let r = c.cmd(&["HGET", &format!("job:{{{id}}}"), "list"]);
        assert_eq!(
            r,
            Resp::bulk(list),
            "{what}: job {id} is in {list} but its hash says {r}"
        );
    }
}

/// Kite --threads 4: four clients run MULTI/DECRBY/INCRBY/EXEC transfers between 100
/// accounts on every shard, two run a BullMQ-like script that moves jobs between lists
/// of four queues; meanwhile BGSAVE runs several times. Every file, loaded into a fresh
/// server, must be one moment in time: balances add up to exactly 100000, every job is
/// in exactly one list, and its hash agrees.
#[test]
fn bgsave_is_point_in_time_under_load() {
    const SAVES: usize = 4;
    const MAX_OPS: usize = 20_000;
    let dir = TempDir::new("pit");
    let kite = kite_on(&dir, "dump.rdb", 4, &[]);
    let mut c = kite.client();
    let mut mset = vec!["MSET".to_string()];
    for i in 0..ACCOUNTS {
        mset.push(account(i));
        mset.push(START_BALANCE.to_string());
    }
    assert_eq!(c.cmd(&mset), Resp::ok());
    for j in 0..JOBS {
        let list = job_list(j % QUEUES, "wait");
        let id = format!("{j}");
        c.cmd(&["LPUSH", &list, &id]);
        c.cmd(&["HSET", &format!("job:{{{id}}}"), "list", &list]);
    }
    check_invariants(&mut c, "before the load");
    let sha = c
        .cmd(&["SCRIPT", "LOAD", MOVE_SCRIPT])
        .as_string()
        .expect("sha");

    let stop = AtomicBool::new(false);
    let aside = TempDir::new("pit-files");
    let mut files = Vec::new();
    thread::scope(|s| {
        for t in 0..4u64 {
            let (kite, stop) = (&kite, &stop);
            s.spawn(move || {
                let mut c = kite.client();
                let mut rng = Rng::new(500 + t);
                for _ in 0..MAX_OPS {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let from = rng.index(ACCOUNTS);
                    let to = (from + 1 + rng.index(ACCOUNTS - 1)) % ACCOUNTS;
                    let amount = rng.range(1, 100).to_string();
                    let r = c.pipeline(&[
                        vec!["MULTI".to_string()],
                        vec!["DECRBY".into(), account(from), amount.clone()],
                        vec!["INCRBY".into(), account(to), amount],
                        vec!["EXEC".into()],
                    ]);
                    assert!(
                        matches!(&r[3], Resp::Array(a) if a.len() == 2),
                        "EXEC: {}",
                        r[3]
                    );
                }
            });
        }
        for t in 0..2u64 {
            let (kite, stop, sha) = (&kite, &stop, &sha);
            s.spawn(move || {
                let mut c = kite.client();
                let mut rng = Rng::new(900 + t);
                for _ in 0..MAX_OPS {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let q = rng.index(QUEUES);
                    let (a, b) = if rng.chance(50) {
                        ("wait", "active")
                    } else {
                        ("active", "wait")
                    };
                    let r = c.cmd(&["EVALSHA", sha, "2", &job_list(q, a), &job_list(q, b)]);
                    assert!(!r.is_error(), "EVALSHA: {r}");
                }
            });
        }
        // Saves while the clients run.
        let mut c = kite.client();
        for i in 0..SAVES {
            // Let some work happen first (bounded: a count of commands, not a time).
            for _ in 0..50 {
                c.cmd(&["PING"]);
            }
            let _ = fs::remove_file(dir.file("dump.rdb"));
            assert_eq!(
                c.cmd(&["BGSAVE"]),
                Resp::simple("Background saving started"),
                "save {i}"
            );
            let done = wait_until(Duration::from_secs(30), || {
                info_req(&mut c, "persistence", "rdb_bgsave_in_progress") == "0"
                    && dir.file("dump.rdb").is_file()
            });
            assert!(done, "save {i} did not finish within 30 s");
            assert_eq!(
                info_req(&mut c, "persistence", "rdb_last_bgsave_status"),
                "ok"
            );
            let name = format!("save-{i}.rdb");
            fs::copy(dir.file("dump.rdb"), aside.file(&name)).expect("copy the file aside");
            files.push(name);
        }
        stop.store(true, Ordering::Relaxed);
    });
    check_invariants(&mut c, "live, after the load");
    for name in &files {
        let d = TempDir::new("pit-load");
        copy_into(&aside.file(name), &d, "dump.rdb");
        let k = kite_on(&d, "dump.rdb", 4, &[]);
        check_invariants(&mut k.client(), name);
    }
}

/// A queue long enough to be written a few nodes at a time, from a clone that shares its
/// chunks, keeps in the file exactly what it held at BGSAVE, though producers and
/// consumers push and pop at both ends while the file is written. The pushes and pops go
/// in the same pipeline as the BGSAVE, right behind it.
#[test]
fn bgsave_holds_a_long_queue_as_it_was() {
    for threads in [1, 4] {
        let dir = TempDir::new("long-queue");
        let kite = kite_on(&dir, "dump.rdb", threads, &[]);
        let mut c = kite.client();
        let job = |i: usize| format!("job-{i}-{}", "p".repeat(120));
        for start in (0..100_000).step_by(5_000) {
            let mut push = vec!["RPUSH".to_string(), "queue:default".to_string()];
            push.extend((start..start + 5_000).map(job));
            c.cmd(&push);
        }
        let mut cmds = vec![vec!["BGSAVE".to_string()]];
        for i in 0..5_000 {
            cmds.push(vec![
                "LPUSH".into(),
                "queue:default".into(),
                format!("late-{i}"),
            ]);
            cmds.push(vec!["RPOP".into(), "queue:default".into()]);
            cmds.push(vec![
                "LSET".into(),
                "queue:default".into(),
                "50000".into(),
                "changed".into(),
            ]);
        }
        let replies = c.pipeline(&cmds);
        assert_eq!(replies[0], Resp::simple("Background saving started"));
        wait_bgsave_done(&mut c);
        drop(kite);
        let again = kite_on(&dir, "dump.rdb", threads, &[]);
        let mut c = again.client();
        assert_eq!(c.cmd(&["LLEN", "queue:default"]), Resp::Integer(100_000));
        for (i, want) in [(0, job(0)), (50_000, job(50_000)), (99_999, job(99_999))] {
            assert_eq!(
                c.cmd(&["LINDEX", "queue:default", &i.to_string()]),
                Resp::bulk(want),
                "element {i}, --threads {threads}"
            );
        }
        let all = c.cmd(&["LRANGE", "queue:default", "0", "-1"]);
        let items = all.as_array().expect("array");
        assert!(items
            .iter()
            .enumerate()
            .all(|(i, v)| v == &Resp::bulk(job(i))));
    }
}

/// Consumer-group writes are changes too: after a SAVE, each of XGROUP CREATE, XREADGROUP,
/// XACK, XCLAIM, XAUTOCLAIM, XGROUP SETID/CREATECONSUMER/DELCONSUMER/DESTROY and XSETID
/// raises rdb_changes_since_last_save, as in Redis, so save points see queues that only
/// move through groups.
#[test]
fn consumer_group_writes_count_as_changes() {
    let dir = TempDir::new("group-changes");
    let kite = kite_on(&dir, "dump.rdb", 2, &[]);
    let mut c = kite.client();
    c.cmd(&["XADD", "events", "1-1", "a", "1"]);
    c.cmd(&["XADD", "events", "2-1", "b", "2"]);
    assert_eq!(c.cmd(&["SAVE"]), Resp::ok());
    let steps: &[&[&str]] = &[
        &["XGROUP", "CREATE", "events", "g", "0"],
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "alice",
            "COUNT",
            "1",
            "STREAMS",
            "events",
            ">",
        ],
        &["XACK", "events", "g", "1-1"],
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "alice",
            "STREAMS",
            "events",
            ">",
        ],
        &["XCLAIM", "events", "g", "bob", "0", "2-1"],
        &["XAUTOCLAIM", "events", "g", "carol", "0", "0"],
        &["XGROUP", "CREATECONSUMER", "events", "g", "dave"],
        &["XGROUP", "DELCONSUMER", "events", "g", "dave"],
        &["XGROUP", "SETID", "events", "g", "0"],
        &["XSETID", "events", "5-0"],
        &["XGROUP", "DESTROY", "events", "g"],
    ];
    let mut last = 0;
    for step in steps {
        let r = c.cmd(step);
        assert!(!r.is_error(), "{step:?}: {r}");
        let now: i64 = info_req(&mut c, "persistence", "rdb_changes_since_last_save")
            .parse()
            .expect("a number");
        assert!(
            now > last,
            "{step:?} left rdb_changes_since_last_save at {now}"
        );
        last = now;
    }
}

/// FUNCTION DUMP payloads move both ways with Redis 7.0, which refuses RDB versions above
/// 10: Kite's carry version 10, like its key DUMPs.
#[test]
fn function_dump_moves_both_ways_with_redis70() {
    if kite_is_redis() {
        return;
    }
    let redis = RedisServer::start();
    let kite = KiteServer::start(&[], 2);
    let (mut r, mut k) = (redis.client(), kite.client());
    let lib = |name: &str, f: &str| {
        format!(
            "#!lua name={name}\n-- {}\nredis.register_function('{f}', function() return 7 end)",
            "long comment ".repeat(40)
        )
    };
    assert!(!r
        .cmd(&["FUNCTION", "LOAD", &lib("fromredis", "rf")])
        .is_error());
    assert!(!k
        .cmd(&["FUNCTION", "LOAD", &lib("fromkite", "kf")])
        .is_error());
    let from_redis = r.cmd(&["FUNCTION", "DUMP"]);
    let from_kite = k.cmd(&["FUNCTION", "DUMP"]);
    let (Some(pr), Some(pk)) = (from_redis.as_bytes(), from_kite.as_bytes()) else {
        panic!("FUNCTION DUMP: {from_redis} / {from_kite}");
    };
    assert_eq!(k.cmd(&[&b"FUNCTION"[..], b"RESTORE", pr]), Resp::ok());
    assert_eq!(r.cmd(&[&b"FUNCTION"[..], b"RESTORE", pk]), Resp::ok());
    assert_eq!(k.cmd(&["FCALL", "rf", "0"]), Resp::Integer(7));
    assert_eq!(r.cmd(&["FCALL", "kf", "0"]), Resp::Integer(7));
}
