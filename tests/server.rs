//! Integration tests of Kite's server and connection commands and of its execution paths,
//! against the real binary. These check Kite-specific behaviour (INFO's transaction
//! counters, migration, configuration) that a differential test against Redis cannot.

mod common;

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use common::{info_field, Client, KiteServer, RedisServer, Resp};

fn info_int(c: &mut Client, section: &str, field: &str) -> i64 {
    info_field(c, section, field)
        .parse()
        .expect("integer field")
}

/// Waits (bounded) until `f` holds; returns whether it did.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn info_has_redis_fields_clients_rely_on() {
    let s = KiteServer::start(&[], 2);
    let mut c = s.client();
    let text = c.cmd(&["INFO"]).as_string().unwrap();
    for needle in [
        "# Server",
        "redis_version:7.2.",
        "# Persistence",
        "loading:0",
        "role:master",
        "maxmemory_policy:noeviction",
        "# Transactions",
        "# Keyspace",
    ] {
        assert!(text.contains(needle), "INFO lacks {needle}:\n{text}");
    }
    // Sidekiq compares the version as a string and refuses anything below "4".
    assert!(info_field(&mut c, "server", "redis_version").as_str() >= "4");
    c.cmd(&["SET", "a", "1"]);
    c.cmd(&["GET", "a"]);
    let stats = c.cmd(&["INFO", "commandstats"]).as_string().unwrap();
    assert!(stats.contains("cmdstat_set:calls=1,"), "{stats}");
    assert!(stats.contains("cmdstat_get:calls=1,"), "{stats}");
    c.cmd(&["NOSUCH"]);
    let errors = c.cmd(&["INFO", "errorstats"]).as_string().unwrap();
    assert!(errors.contains("errorstat_ERR:count=1"), "{errors}");
    let keyspace = c.cmd(&["INFO", "keyspace"]).as_string().unwrap();
    assert!(
        keyspace.contains("db0:keys=1,expires=0,avg_ttl=0"),
        "{keyspace}"
    );
}

/// INFO's avg_ttl is an estimate the active expiry keeps as it samples keys (as in
/// Redis), at any number of keys with a TTL. It used to be an exact sum from walking every
/// key of every database on each INFO, which held each thread for milliseconds per million
/// keys on every call, and was skipped (reported as 0) past 10 000 keys with a TTL.
#[test]
fn avg_ttl_is_estimated_at_any_number_of_volatile_keys() {
    // One thread: all 12 000 keys on one shard.
    avg_ttl_estimate(1);
}

/// The same over four shards: each thread's estimate, merged weighted by its keys.
#[test]
fn avg_ttl_is_estimated_over_threads() {
    avg_ttl_estimate(4);
}

fn avg_ttl_estimate(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut c = s.client();
    let cmds: Vec<Vec<String>> = (0..12_000)
        .map(|i| {
            vec![
                "SET".into(),
                format!("ttl:{i}"),
                "v".into(),
                "EX".into(),
                "1000".into(),
            ]
        })
        .collect();
    for chunk in cmds.chunks(2_000) {
        c.pipeline(chunk);
    }
    c.cmd(&["SET", "plain", "v"]);
    let avg_ttl = |c: &mut Client| -> i64 {
        let text = c.cmd(&["INFO", "keyspace"]).as_string().unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("db0:"))
            .unwrap_or_else(|| panic!("no db0 in {text}"))
            .to_string();
        assert!(
            line.starts_with("db0:keys=12001,expires=12000,avg_ttl="),
            "{line}"
        );
        line.rsplit('=').next().unwrap().parse().unwrap()
    };
    // The active expiry runs ten times a second; its first samples set the estimate.
    let mut last = 0;
    assert!(
        eventually(|| {
            last = avg_ttl(&mut c);
            last > 0
        }),
        "avg_ttl stayed 0 with 12 000 keys expiring in 1000 s"
    );
    assert!((900_000..=1_000_000).contains(&last), "avg_ttl={last}");
    // No keys with a TTL: 0 again, once the expiry has looked.
    for chunk in cmds.chunks(2_000) {
        let persist: Vec<Vec<String>> = chunk
            .iter()
            .map(|c| vec!["PERSIST".into(), c[1].clone()])
            .collect();
        c.pipeline(&persist);
    }
    assert!(
        eventually(|| {
            let text = c.cmd(&["INFO", "keyspace"]).as_string().unwrap();
            text.contains("db0:keys=12001,expires=0,avg_ttl=0")
        }),
        "avg_ttl not reset with no keys expiring"
    );
}

#[test]
fn single_key_connection_runs_inline_after_migration() {
    let s = KiteServer::start(&[], 4);
    let mut c = s.client();
    // Warm up: the connection moves to the thread owning `job:counter`.
    for _ in 0..20 {
        c.cmd(&["INCR", "job:counter"]);
    }
    let inline_before = info_int(&mut c, "transactions", "inline_commands");
    let hop_before = info_int(&mut c, "transactions", "one_hop_commands");
    for _ in 0..100 {
        c.cmd(&["INCR", "job:counter"]);
    }
    let inline_after = info_int(&mut c, "transactions", "inline_commands");
    let hop_after = info_int(&mut c, "transactions", "one_hop_commands");
    assert_eq!(inline_after - inline_before, 100, "all commands inline");
    assert_eq!(hop_after, hop_before, "no hops after migration");
    assert_eq!(c.cmd(&["GET", "job:counter"]), Resp::bulk("120"));
}

#[test]
fn cross_shard_mset_is_a_multi_shard_transaction() {
    let s = KiteServer::start(&[], 4);
    let mut c = s.client();
    let before = info_int(&mut c, "transactions", "multi_shard_transactions");
    // Forty keys without a hashtag are spread over the four shards.
    let mut args = vec!["MSET".to_string()];
    for i in 0..40 {
        args.push(format!("acct:{i}"));
        args.push(i.to_string());
    }
    assert_eq!(c.cmd(&args), Resp::ok());
    let after = info_int(&mut c, "transactions", "multi_shard_transactions");
    assert_eq!(after - before, 1);
    // Keys sharing a hashtag live on one shard: no multi-shard transaction.
    assert_eq!(
        c.cmd(&["MSET", "{q}:a", "1", "{q}:b", "2", "{q}:c", "3"]),
        Resp::ok()
    );
    assert_eq!(
        info_int(&mut c, "transactions", "multi_shard_transactions"),
        after
    );
}

#[test]
fn pipelines_to_another_shard_are_squashed() {
    let s = KiteServer::start(&["--migrate-connections", "no"], 4);
    let mut c = s.client();
    let cmds: Vec<Vec<String>> = (0..200)
        .map(|i| vec!["SET".to_string(), "{one}key".to_string(), i.to_string()])
        .collect();
    let replies = c.pipeline(&cmds);
    assert!(replies.iter().all(|r| *r == Resp::ok()));
    let migrations = info_int(&mut c, "transactions", "migrations");
    assert_eq!(migrations, 0, "--migrate-connections no keeps connections");
    let inline = info_int(&mut c, "transactions", "inline_commands");
    let squashed = info_int(&mut c, "transactions", "squashed_commands");
    // Either the key lives on this connection's thread (all inline) or the pipeline
    // went over in batches.
    assert!(
        inline == 200 || squashed > 0,
        "inline {inline} squashed {squashed}"
    );
}

#[test]
fn config_file_flags_and_config_commands() {
    let dir = std::env::temp_dir().join(format!("kite-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kite.conf");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "# a redis.conf-style file").unwrap();
    writeln!(f, "maxclients 77").unwrap();
    writeln!(f, "save \"\"").unwrap();
    writeln!(f, "appendonly no").unwrap();
    writeln!(f, "hash-max-ziplist-entries 64").unwrap();
    writeln!(f, "timeout 0").unwrap();
    drop(f);
    let s = KiteServer::start(&[path.to_str().unwrap(), "--timeout", "30"], 2);
    let mut c = s.client();
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "maxclients"]),
        Resp::Array(vec![Resp::bulk("maxclients"), Resp::bulk("77")])
    );
    // Flags win over the file.
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "timeout"]),
        Resp::Array(vec![Resp::bulk("timeout"), Resp::bulk("30")])
    );
    let pairs = c.cmd(&["CONFIG", "GET", "hash-max-*-entries"]);
    let items = pairs.as_array().unwrap();
    assert!(items.contains(&Resp::bulk("hash-max-ziplist-entries")));
    assert!(items.contains(&Resp::bulk("64")));
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "maxclients", "99", "timeout", "0"]),
        Resp::ok()
    );
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "maxclients"]).as_array().unwrap()[1],
        Resp::bulk("99")
    );
    // Unknown names, bad values and immutable settings are refused, all or nothing.
    assert!(c.cmd(&["CONFIG", "SET", "nosuch", "1"]).is_error());
    assert!(c
        .cmd(&["CONFIG", "SET", "maxclients", "5", "timeout", "x"])
        .is_error());
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "maxclients"]).as_array().unwrap()[1],
        Resp::bulk("99")
    );
    assert!(c.cmd(&["CONFIG", "SET", "databases", "4"]).is_error());
    // The alias of --threads.
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "proactor_threads"])
            .as_array()
            .unwrap()[1],
        Resp::bulk("2")
    );
    c.cmd(&["SET", "x", "1"]);
    assert_eq!(c.cmd(&["CONFIG", "RESETSTAT"]), Resp::ok());
    let stats = c.cmd(&["INFO", "commandstats"]).as_string().unwrap();
    assert!(!stats.contains("cmdstat_set"), "{stats}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn requirepass_auth_and_hello() {
    let s = KiteServer::start(&["--requirepass", "s3cret"], 2);
    let mut c = s.raw_client();
    assert_eq!(
        c.cmd(&["PING"]),
        Resp::Error("NOAUTH Authentication required.".into())
    );
    assert!(c
        .cmd(&["HELLO", "3"])
        .error_text()
        .unwrap()
        .starts_with("NOAUTH HELLO must be called"));
    assert!(c
        .cmd(&["AUTH", "wrong"])
        .error_text()
        .unwrap()
        .starts_with("WRONGPASS"));
    let hello = c.cmd(&[
        "HELLO", "3", "AUTH", "default", "s3cret", "SETNAME", "worker-1",
    ]);
    let Resp::Map(pairs) = hello else {
        panic!("HELLO 3 must answer a map, got {hello}");
    };
    assert!(pairs.contains(&(Resp::bulk("proto"), Resp::Integer(3))));
    assert!(pairs.contains(&(Resp::bulk("version"), Resp::bulk("7.2.4"))));
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]), Resp::bulk("worker-1"));
    // RESP3 nulls.
    assert_eq!(c.cmd(&["GET", "missing"]), Resp::Null);
    assert_eq!(c.cmd(&["HELLO", "2"]).as_array().map(|a| a.len()), Some(14));
    assert_eq!(c.cmd(&["GET", "missing"]), Resp::NullBulk);
    assert_eq!(
        c.cmd(&["HELLO", "4"]),
        Resp::Error("NOPROTO unsupported protocol version".into())
    );
    assert_eq!(c.cmd(&["RESET"]), Resp::simple("RESET"));
    assert_eq!(
        c.cmd(&["GET", "x"]),
        Resp::Error("NOAUTH Authentication required.".into())
    );
}

#[test]
fn client_list_setinfo_kill_and_reply_modes() {
    let s = KiteServer::start(&[], 4);
    let mut a = s.client();
    let mut b = s.client();
    assert_eq!(a.cmd(&["CLIENT", "SETNAME", "alpha"]), Resp::ok());
    assert_eq!(
        a.cmd(&["CLIENT", "SETINFO", "LIB-NAME", "mylib"]),
        Resp::ok()
    );
    assert!(a.cmd(&["CLIENT", "SETNAME", "has space"]).is_error());
    let a_id = a.cmd(&["CLIENT", "ID"]).as_int().unwrap();
    let list = b.cmd(&["CLIENT", "LIST"]).as_string().unwrap();
    let line = list
        .lines()
        .find(|l| l.starts_with(&format!("id={a_id} ")))
        .unwrap_or_else(|| panic!("no line for {a_id} in {list}"));
    assert!(line.contains(" name=alpha "), "{line}");
    assert!(line.contains(" lib-name=mylib "), "{line}");
    assert!(line.contains(" cmd=client|id "), "{line}");
    let info = a.cmd(&["CLIENT", "INFO"]).as_string().unwrap();
    assert!(info.starts_with(&format!("id={a_id} ")), "{info}");
    // Replies off, then on again.
    a.send(&["CLIENT", "REPLY", "OFF"]);
    a.send(&["SET", "k", "v"]);
    assert_eq!(a.cmd(&["CLIENT", "REPLY", "ON"]), Resp::ok());
    assert_eq!(a.cmd(&["GET", "k"]), Resp::bulk("v"));
    a.send(&["CLIENT", "REPLY", "SKIP"]);
    a.send(&["SET", "k", "w"]);
    assert_eq!(a.cmd(&["GET", "k"]), Resp::bulk("w"));
    // Kill by id: the victim's connection is closed.
    assert_eq!(
        b.cmd(&["CLIENT", "KILL", "ID", &a_id.to_string()]),
        Resp::Integer(1)
    );
    a.set_timeout(Some(Duration::from_secs(5)));
    assert!(a.try_read().is_err(), "killed client must be disconnected");
    assert_eq!(b.cmd(&["CLIENT", "KILL", "ID", "999999"]), Resp::Integer(0));
    assert!(b
        .cmd(&["CLIENT", "NOSUCH"])
        .error_text()
        .unwrap()
        .starts_with("ERR unknown subcommand 'NOSUCH'"));
}

#[test]
fn monitor_streams_commands_of_every_thread() {
    let s = KiteServer::start(&[], 4);
    let mut m = s.client();
    assert_eq!(m.cmd(&["MONITOR"]), Resp::ok());
    let mut others: Vec<Client> = (0..4).map(|_| s.client()).collect();
    for (i, c) in others.iter_mut().enumerate() {
        assert_eq!(c.cmd(&["SET", &format!("mon{i}"), "v"]), Resp::ok());
    }
    m.set_timeout(Some(Duration::from_secs(5)));
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let line = m.read().as_string().unwrap();
        if line.contains("\"SET\"") {
            seen.push(line);
        }
    }
    for i in 0..4 {
        assert!(
            seen.iter()
                .any(|l| l.contains(&format!("\"mon{i}\" \"v\""))),
            "{seen:?}"
        );
    }
}

/// On several threads too, a slow-log entry names its client: for keys on all four
/// shards of `--threads 4`, so that most SETs run in a batch on another thread than the
/// connection's, which does not know the client.
#[test]
fn slowlog_names_the_client_on_every_thread() {
    let kite = KiteServer::start(&["--migrate-connections", "no"], 4);
    let mut c = kite.client();
    assert_eq!(c.cmd(&["CLIENT", "SETNAME", "far-away"]), Resp::ok());
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        Resp::ok()
    );
    assert_eq!(c.cmd(&["SLOWLOG", "RESET"]), Resp::ok());
    let keys = common::spread_keys("slow", 8);
    for k in &keys {
        assert_eq!(c.cmd(&["SET", k.as_str(), "v"]), Resp::ok());
    }
    let info = c.cmd(&["CLIENT", "INFO"]).as_string().unwrap();
    let addr = info
        .split(' ')
        .find_map(|kv| kv.strip_prefix("addr="))
        .expect("addr in CLIENT INFO")
        .to_string();
    let entries = c.cmd(&["SLOWLOG", "GET", "-1"]);
    let sets: Vec<Vec<Resp>> = entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_array().unwrap().to_vec())
        .filter(|e| e[3].as_array().unwrap()[0] == Resp::bulk("SET"))
        .collect();
    assert_eq!(sets.len(), keys.len(), "{entries}");
    for e in &sets {
        assert_eq!(e[4], Resp::bulk(&addr), "{entries}");
        assert_eq!(e[5], Resp::bulk("far-away"), "{entries}");
    }
}

/// A slow-log entry names the client that sent the command (its address and name), as
/// redis-server's does, also for a command run inline on the connection's own thread.
#[test]
fn slowlog_names_the_client() {
    let redis = RedisServer::start();
    let kite = KiteServer::start(&[], 1);
    for (who, server) in [("redis-server", &*redis), ("kite", &*kite)] {
        let mut c = server.client();
        assert_eq!(c.cmd(&["CLIENT", "SETNAME", "slowpoke"]), Resp::ok());
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
            Resp::ok()
        );
        assert_eq!(c.cmd(&["SLOWLOG", "RESET"]), Resp::ok());
        assert_eq!(c.cmd(&["SET", "slow-key", "v"]), Resp::ok());
        let info = c.cmd(&["CLIENT", "INFO"]);
        let info = info.as_string().unwrap();
        let addr = info
            .split(' ')
            .find_map(|kv| kv.strip_prefix("addr="))
            .expect("addr in CLIENT INFO");
        let entries = c.cmd(&["SLOWLOG", "GET", "-1"]);
        let set = entries
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_array().unwrap().to_vec())
            .find(|e| e[3].as_array().unwrap()[0] == Resp::bulk("SET"))
            .unwrap_or_else(|| panic!("{who}: no SET in {entries}"));
        assert_eq!(set[4], Resp::bulk(addr), "{who}: {entries}");
        assert_eq!(set[5], Resp::bulk("slowpoke"), "{who}: {entries}");
    }
}

#[test]
fn slowlog_and_latency() {
    let s = KiteServer::start(&[], 2);
    let mut c = s.client();
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        Resp::ok()
    );
    c.cmd(&["SET", "slow-key", "v"]);
    let entries = c.cmd(&["SLOWLOG", "GET", "-1"]);
    let list = entries.as_array().unwrap();
    assert!(list.iter().any(|e| {
        let e = e.as_array().unwrap();
        e[3].as_array().unwrap() == [Resp::bulk("SET"), Resp::bulk("slow-key"), Resp::bulk("v")]
    }));
    assert!(c.cmd(&["SLOWLOG", "LEN"]).as_int().unwrap() >= 1);
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "-1"]),
        Resp::ok()
    );
    assert_eq!(c.cmd(&["SLOWLOG", "RESET"]), Resp::ok());
    assert_eq!(c.cmd(&["SLOWLOG", "LEN"]), Resp::Integer(0));
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "latency-monitor-threshold", "1"]),
        Resp::ok()
    );
    assert_eq!(c.cmd(&["DEBUG", "SLEEP", "0.02"]), Resp::ok());
    let latest = c.cmd(&["LATENCY", "LATEST"]);
    let events = latest.as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.as_array().unwrap()[0] == Resp::bulk("command")),
        "{latest}"
    );
    assert!(!c
        .cmd(&["LATENCY", "HISTORY", "command"])
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(c.cmd(&["LATENCY", "RESET"]), Resp::Integer(1));
}

#[test]
fn maxclients_refuses_extra_connections() {
    let s = KiteServer::start(&["--maxclients", "2"], 2);
    // The harness's start-up probe has closed, but its thread may not have counted it
    // out yet: connect until admitted (bounded).
    let admitted = || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut c = s.client();
            if c.cmd(&["PING"]) == Resp::simple("PONG") {
                return c;
            }
            assert!(std::time::Instant::now() < deadline, "never admitted");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let a = admitted();
    let _b = admitted();
    let mut c = s.raw_client();
    c.set_timeout(Some(Duration::from_secs(5)));
    assert_eq!(
        c.read(),
        Resp::Error("ERR max number of clients reached".into())
    );
    drop(a);
    // A freed slot is usable again.
    assert!(eventually(|| {
        let mut d = s.raw_client();
        d.set_timeout(Some(Duration::from_secs(2)));
        d.send(&["PING"]);
        d.try_read().ok() == Some(Resp::simple("PONG"))
    }));
}

#[test]
fn idle_clients_are_closed_after_timeout() {
    let s = KiteServer::start(&["--timeout", "1"], 2);
    let mut c = s.client();
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    c.set_timeout(Some(Duration::from_secs(10)));
    // The server closes the idle connection on its own: the read ends without a reply.
    assert!(c.try_read().is_err());
}

#[test]
fn active_expiry_removes_keys_nobody_reads() {
    let s = KiteServer::start(&[], 4);
    let mut c = s.client();
    let cmds: Vec<Vec<String>> = (0..5000)
        .map(|i| {
            vec![
                "SET".to_string(),
                format!("tmp:{i}"),
                "x".to_string(),
                "PX".to_string(),
                "50".to_string(),
            ]
        })
        .collect();
    c.pipeline(&cmds);
    c.cmd(&["SET", "keep", "1"]);
    // DBSIZE counts keys still stored, expired or not: it falls only through active expiry.
    assert!(
        eventually(|| c.cmd(&["DBSIZE"]) == Resp::Integer(1)),
        "expired keys were not reclaimed"
    );
    assert!(info_int(&mut c, "stats", "expired_keys") >= 5000);
}

#[test]
fn command_table_answers_command() {
    let s = KiteServer::start(&[], 2);
    let mut c = s.client();
    let count = c.cmd(&["COMMAND", "COUNT"]).as_int().unwrap();
    assert!(count > 80);
    let info = c.cmd(&["COMMAND", "INFO", "get", "nosuch"]);
    let items = info.as_array().unwrap();
    let get = items[0].as_array().unwrap();
    assert_eq!(get[0], Resp::bulk("get"));
    assert_eq!(get[1], Resp::Integer(2));
    assert_eq!(get[3], Resp::Integer(1));
    assert!(items[1].is_null());
    assert_eq!(
        c.cmd(&["COMMAND", "GETKEYS", "MSET", "a", "1", "b", "2"]),
        Resp::Array(vec![Resp::bulk("a"), Resp::bulk("b")])
    );
    assert_eq!(
        c.cmd(&["COMMAND", "GETKEYS", "PING"]),
        Resp::Error("ERR The command has no key arguments".into())
    );
    let list = c.cmd(&["COMMAND", "LIST", "FILTERBY", "PATTERN", "bit*"]);
    assert!(list.as_array().unwrap().contains(&Resp::bulk("bitfield")));
    let docs = c.cmd(&["COMMAND", "DOCS", "set"]);
    assert!(format!("{docs}").contains("summary"));
    assert_eq!(c.cmd(&["TIME"]).as_array().unwrap().len(), 2);
    assert!(c.cmd(&["LASTSAVE"]).as_int().unwrap() > 0);
}

#[test]
fn scan_walks_every_shard_once() {
    let s = KiteServer::start(&[], 4);
    let mut c = s.client();
    let cmds: Vec<Vec<String>> = (0..3000)
        .map(|i| vec!["SET".to_string(), format!("k{i}"), "v".to_string()])
        .collect();
    c.pipeline(&cmds);
    let mut seen = std::collections::HashSet::new();
    let mut cursor = "0".to_string();
    let mut calls = 0;
    loop {
        let r = c.cmd(&["SCAN", &cursor, "COUNT", "100"]);
        let parts = r.as_array().unwrap();
        cursor = parts[0].as_string().unwrap();
        for k in parts[1].as_array().unwrap() {
            seen.insert(k.as_string().unwrap());
        }
        calls += 1;
        assert!(calls < 10_000, "SCAN does not terminate");
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), 3000);
    assert_eq!(c.cmd(&["DBSIZE"]), Resp::Integer(3000));
    assert_eq!(c.cmd(&["KEYS", "k29*"]).as_array().unwrap().len(), 111);
    assert!(c.cmd(&["RANDOMKEY"]).as_string().unwrap().starts_with('k'));
    assert_eq!(c.cmd(&["FLUSHALL", "ASYNC"]), Resp::ok());
    assert_eq!(c.cmd(&["DBSIZE"]), Resp::Integer(0));
    assert!(c.cmd(&["RANDOMKEY"]).is_null());
}

#[test]
fn client_pause_holds_writes_until_unpaused() {
    let s = KiteServer::start(&[], 2);
    let mut admin = s.client();
    let mut worker = s.client();
    assert_eq!(
        admin.cmd(&["CLIENT", "PAUSE", "100000", "WRITE"]),
        Resp::ok()
    );
    // Reads go through during a WRITE pause.
    assert!(worker.cmd(&["GET", "p"]).is_null());
    worker.send(&["SET", "p", "1"]);
    worker.set_timeout(Some(Duration::from_millis(300)));
    assert!(
        worker.try_read().is_err(),
        "a write must wait during the pause"
    );
    assert_eq!(admin.cmd(&["CLIENT", "UNPAUSE"]), Resp::ok());
    worker.set_timeout(Some(Duration::from_secs(10)));
    assert_eq!(worker.read(), Resp::ok());
    assert_eq!(admin.cmd(&["GET", "p"]), Resp::bulk("1"));
}

#[test]
fn shutdown_stops_the_server() {
    let mut s = KiteServer::start(&[], 2);
    let mut c = s.client();
    c.send(&["SHUTDOWN", "NOSAVE"]);
    assert!(eventually(|| !s.is_running()), "server still running");
}

#[test]
fn maxmemory_refuses_writes_but_serves_reads_and_deletes() {
    let s = KiteServer::start(&[], 2);
    let mut c = s.client();
    assert_eq!(c.cmd(&["SET", "k", "v"]), Resp::ok());
    assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory", "1"]), Resp::ok());
    assert_eq!(
        c.cmd(&["SET", "k2", "v"]),
        Resp::Error("OOM command not allowed when used memory > 'maxmemory'.".into())
    );
    // Inside MULTI the refusal aborts the transaction, as in Redis.
    assert_eq!(c.cmd(&["MULTI"]), Resp::ok());
    assert!(c.cmd(&["APPEND", "k", "x"]).is_error());
    assert!(c
        .cmd(&["EXEC"])
        .error_text()
        .unwrap()
        .starts_with("EXECABORT"));
    assert_eq!(c.cmd(&["GET", "k"]), Resp::bulk("v"));
    assert_eq!(c.cmd(&["DEL", "k"]), Resp::Integer(1));
    assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory", "0"]), Resp::ok());
    assert_eq!(c.cmd(&["SET", "k2", "v"]), Resp::ok());
}

/// WAIT without replicas: 0 at once when none is asked for, 0 after the timeout
/// otherwise, and Redis's errors.
#[test]
fn wait_answers_zero_replicas() {
    let kite = KiteServer::start(&[], 2);
    let mut c = kite.client();
    assert_eq!(c.cmd(&["WAIT", "0", "0"]), Resp::Integer(0));
    assert_eq!(c.cmd(&["WAIT", "1", "20"]), Resp::Integer(0));
    assert_eq!(
        c.cmd(&["WAIT", "1", "-1"]),
        Resp::Error("ERR timeout is negative".into())
    );
    assert_eq!(
        c.cmd(&["WAIT", "x", "1"]),
        Resp::Error("ERR value is not an integer or out of range".into())
    );
}

/// A command sent while an earlier one is blocked (BLPOP, WAIT) is answered as soon as
/// the blocked one returns, without waiting for more input.
#[test]
fn input_read_while_blocked_is_served_after() {
    let kite = KiteServer::start(&[], 2);
    for first in [vec!["BLPOP", "nolist", "0.2"], vec!["WAIT", "1", "200"]] {
        let mut c = kite.client();
        c.set_timeout(Some(std::time::Duration::from_secs(10)));
        c.send(&first);
        std::thread::sleep(std::time::Duration::from_millis(50));
        c.send(&["PING"]);
        let r = c.read();
        assert!(r.is_null() || r.as_int() == Some(0), "{r}");
        assert_eq!(c.read(), Resp::simple("PONG"), "after {}", first[0]);
    }
}
