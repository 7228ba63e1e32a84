//! Pub/Sub and keyspace notifications against the real binary, compared with
//! redis-server where both can run the same script.

mod common;

use std::time::Duration;

use common::{Client, KiteServer, RedisServer, Resp};

fn read(c: &mut Client) -> Resp {
    c.set_timeout(Some(Duration::from_secs(10)));
    c.read()
}

/// The same conversation between a subscriber and a publisher, against both servers.
fn conversation(port_sub: &mut Client, publisher: &mut Client) -> Vec<Resp> {
    let mut out = Vec::new();
    let s = port_sub;
    s.send(&["SUBSCRIBE", "news", "sport"]);
    out.push(read(s));
    out.push(read(s));
    s.send(&["PSUBSCRIBE", "n*", "x?z"]);
    out.push(read(s));
    out.push(read(s));
    out.push(s.cmd(&["GET", "k"]));
    out.push(s.cmd(&["PING"]));
    out.push(s.cmd(&["PING", "hi"]));
    out.push(publisher.cmd(&["PUBLISH", "news", "hello"]));
    out.push(read(s));
    out.push(read(s));
    out.push(publisher.cmd(&["PUBLISH", "xyz", "pattern only"]));
    out.push(read(s));
    out.push(publisher.cmd(&["PUBLISH", "nobody", "x"]));
    out.push(read(s));
    out.push(publisher.cmd(&["PUBSUB", "NUMSUB", "news", "sport", "none"]));
    out.push(publisher.cmd(&["PUBSUB", "NUMPAT"]));
    out.push(publisher.cmd(&["PUBSUB", "CHANNELS", "s*"]));
    s.send(&["UNSUBSCRIBE", "news"]);
    out.push(read(s));
    s.send(&["UNSUBSCRIBE"]);
    out.push(read(s));
    s.send(&["PUNSUBSCRIBE"]);
    out.push(read(s));
    out.push(read(s));
    s.send(&["UNSUBSCRIBE"]);
    out.push(read(s));
    out.push(s.cmd(&["PING"]));
    out
}

#[test]
fn pubsub_replies_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let k = conversation(&mut kite.client(), &mut kite.client());
    let r = conversation(&mut redis.client(), &mut redis.client());
    for (i, (a, b)) in k.iter().zip(&r).enumerate() {
        assert_eq!(a, b, "step {i}: kite {a} vs redis {b}");
    }
}

#[test]
fn messages_cross_threads_and_protocols() {
    let s = KiteServer::start(&[], 4);
    let mut subs: Vec<Client> = (0..4).map(|_| s.client()).collect();
    for (i, c) in subs.iter_mut().enumerate() {
        if i % 2 == 1 {
            let hello = c.cmd(&["HELLO", "3"]);
            assert!(matches!(hello, Resp::Map(_)));
        }
        c.send(&["SUBSCRIBE", "jobs"]);
        let r = read(c);
        assert_eq!(r.as_array().unwrap()[0], Resp::bulk("subscribe"));
    }
    let mut p = s.client();
    assert_eq!(p.cmd(&["PUBLISH", "jobs", "j1"]), Resp::Integer(4));
    for (i, c) in subs.iter_mut().enumerate() {
        let m = read(c);
        let want = vec![Resp::bulk("message"), Resp::bulk("jobs"), Resp::bulk("j1")];
        if i % 2 == 1 {
            assert_eq!(m, Resp::Push(want), "RESP3 subscribers get push messages");
        } else {
            assert_eq!(m, Resp::Array(want));
        }
    }
    // A RESP3 subscriber may still run ordinary commands.
    assert_eq!(subs[1].cmd(&["SET", "x", "1"]), Resp::ok());
    let list = p
        .cmd(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .as_string()
        .unwrap();
    assert_eq!(list.lines().count(), 4, "{list}");
    drop(subs);
    // Subscribers that left are no longer counted.
    let mut n = 4;
    for _ in 0..200 {
        n = p.cmd(&["PUBLISH", "jobs", "j2"]).as_int().unwrap();
        if n == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(n, 0);
}

#[test]
fn keyspace_notifications() {
    let s = KiteServer::start(&[], 4);
    let mut admin = s.client();
    assert_eq!(
        admin.cmd(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]),
        Resp::ok()
    );
    assert_eq!(
        admin.cmd(&["CONFIG", "GET", "notify-keyspace-events"]),
        Resp::Array(vec![
            Resp::bulk("notify-keyspace-events"),
            Resp::bulk("AKE")
        ])
    );
    assert!(admin
        .cmd(&["CONFIG", "SET", "notify-keyspace-events", "KQ"])
        .error_text()
        .unwrap()
        .contains("Invalid event class character"));
    let mut sub = s.client();
    sub.send(&["PSUBSCRIBE", "__keyevent@0__:*"]);
    read(&mut sub);
    let expect = |c: &mut Client, event: &str, key: &str| {
        let m = read(c);
        let a = m.as_array().unwrap();
        assert_eq!(a[2], Resp::bulk(format!("__keyevent@0__:{event}")), "{m}");
        assert_eq!(a[3], Resp::bulk(key), "{m}");
    };
    admin.cmd(&["RPUSH", "q", "a", "b"]);
    expect(&mut sub, "rpush", "q");
    admin.cmd(&["LPOP", "q"]);
    expect(&mut sub, "lpop", "q");
    admin.cmd(&["EXPIRE", "q", "100"]);
    expect(&mut sub, "expire", "q");
    admin.cmd(&["RENAME", "q", "q2"]);
    expect(&mut sub, "rename_from", "q");
    expect(&mut sub, "rename_to", "q2");
    admin.cmd(&["DEL", "q2"]);
    expect(&mut sub, "del", "q2");
    // Writes inside MULTI notify too, and expiry does.
    admin.cmd(&["MULTI"]);
    admin.cmd(&["LPUSH", "m", "1"]);
    admin.cmd(&["PEXPIRE", "m", "20"]);
    admin.cmd(&["EXEC"]);
    expect(&mut sub, "lpush", "m");
    expect(&mut sub, "expire", "m");
    expect(&mut sub, "expired", "m");
    // Blocked pops served by a push emit the pop.
    let mut waiter = s.client();
    waiter.send(&["BLPOP", "w", "0"]);
    std::thread::sleep(Duration::from_millis(100));
    admin.cmd(&["RPUSH", "w", "x"]);
    expect(&mut sub, "rpush", "w");
    expect(&mut sub, "lpop", "w");
    expect(&mut sub, "del", "w");
    assert_eq!(
        read(&mut waiter),
        Resp::Array(vec![Resp::bulk("w"), Resp::bulk("x")])
    );
}

/// String and generic events name the same commands Redis names.
#[test]
fn string_events_match_redis() {
    let kite = KiteServer::start(&[], 2);
    let redis = RedisServer::start();
    let mut got = Vec::new();
    let servers: [&common::ServerProcess; 2] = [&kite, &redis];
    for server in servers {
        let mut admin = server.client();
        admin.cmd(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
        let mut sub = server.client();
        sub.send(&["PSUBSCRIBE", "__keyspace@0__:*"]);
        read(&mut sub);
        let script: &[&[&str]] = &[
            &["SET", "s", "1", "EX", "100"],
            &["INCR", "s"],
            &["INCRBYFLOAT", "s", "1.5"],
            &["APPEND", "s", "x"],
            &["SETRANGE", "s", "0", "ab"],
            &["GETEX", "s", "PERSIST"],
            &["SETBIT", "b", "3", "1"],
            &["BITFIELD", "b", "SET", "u8", "0", "7"],
            &["MSET", "m1", "1", "m2", "2"],
            &["GETSET", "m1", "3"],
            &["GETDEL", "m2"],
            &["BITOP", "OR", "d", "b", "b"],
            &["PERSIST", "d"],
            &["EXPIRE", "d", "0"],
        ];
        for cmd in script {
            admin.cmd(cmd);
        }
        admin.cmd(&["PUBLISH", "__keyspace@0__:end", "end"]);
        let mut events = Vec::new();
        loop {
            let m = read(&mut sub);
            let a = m.as_array().unwrap().to_vec();
            let channel = a[2].as_string().unwrap();
            let event = a[3].as_string().unwrap();
            if event == "end" {
                break;
            }
            events.push(format!("{channel} {event}"));
        }
        got.push(events);
    }
    assert_eq!(got[0], got[1]);
}

/// SET over a key whose time is up but which active expiry has not reached: the old key
/// expires first (its event, the expired_keys count, and under LFU a fresh counter),
/// then the new one is made, as Redis's lookup before the write does.
#[test]
fn set_over_an_expired_key_expires_it_first_as_redis_does() {
    let kite = KiteServer::start(&[], 2);
    let redis = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let mut got = Vec::new();
    let servers: [&common::ServerProcess; 2] = [&kite, &redis];
    for server in servers {
        let mut admin = server.client();
        assert_eq!(admin.cmd(&["DEBUG", "SET-ACTIVE-EXPIRE", "0"]), Resp::ok());
        admin.cmd(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
        admin.cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"]);
        // Counters decay once per wall-clock minute (Redis's clock and Kite's alike): a
        // minute boundary inside this test would lower `live`'s counter on either server.
        admin.cmd(&["CONFIG", "SET", "lfu-decay-time", "0"]);
        let mut sub = server.client();
        sub.send(&["PSUBSCRIBE", "__keyevent@0__:*"]);
        read(&mut sub);
        // Values that are not integers: Redis would share an integer's object, and its
        // LFU counter with it.
        admin.cmd(&["SET", "k", "v1"]);
        admin.cmd(&["SET", "live", "v1"]);
        for _ in 0..200 {
            admin.cmd(&["GET", "k"]);
            admin.cmd(&["GET", "live"]);
        }
        let before = admin.cmd(&["OBJECT", "FREQ", "live"]);
        admin.cmd(&["PEXPIRE", "k", "100"]);
        // Nothing touches `k` until SET: active expiry is off.
        std::thread::sleep(Duration::from_millis(250));
        let expired_before = info_field(&mut admin, "expired_keys");
        admin.cmd(&["SET", "k", "v2"]);
        admin.cmd(&["SET", "live", "v2"]);
        let expired = info_field(&mut admin, "expired_keys") - expired_before;
        let mut outcome = vec![
            format!("expired {expired}"),
            format!("k {}", admin.cmd(&["GET", "k"])),
            format!("ttl {}", admin.cmd(&["PTTL", "k"])),
            format!("fresh freq {}", admin.cmd(&["OBJECT", "FREQ", "k"])),
            // An overwritten live key keeps its counter, raised by SET's own access
            // (probabilistic past the first steps, so compared loosely here).
            format!(
                "kept freq {}",
                admin.cmd(&["OBJECT", "FREQ", "live"]).as_int().unwrap()
                    >= before.as_int().unwrap()
            ),
        ];
        // A new key's counter starts at 5 and its first access raises it for sure: a
        // second SET counts as that access, as Redis's lookup before a write does.
        admin.cmd(&["SET", "f", "a"]);
        admin.cmd(&["SET", "f", "b"]);
        outcome.push(format!(
            "overwritten freq {}",
            admin.cmd(&["OBJECT", "FREQ", "f"])
        ));
        admin.cmd(&["PUBLISH", "__keyevent@0__:end", "end"]);
        loop {
            let m = read(&mut sub);
            let a = m.as_array().unwrap().to_vec();
            let channel = a[2].as_string().unwrap();
            if channel.ends_with(":end") {
                break;
            }
            outcome.push(format!("{channel} {}", a[3].as_string().unwrap()));
        }
        admin.cmd(&["DEBUG", "SET-ACTIVE-EXPIRE", "1"]);
        got.push(outcome);
    }
    assert_eq!(got[0], got[1]);
    assert!(got[0].contains(&"expired 1".to_string()), "{:?}", got[0]);
}

fn info_field(c: &mut Client, name: &str) -> i64 {
    let info = c.cmd(&["INFO", "stats"]).as_string().unwrap().to_string();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO"))
}

/// Sharded Pub/Sub (Redis 7): SSUBSCRIBE / SPUBLISH / SUNSUBSCRIBE and PUBSUB
/// SHARDCHANNELS / SHARDNUMSUB, with shard subscriptions counted apart from channels and
/// patterns, the same conversation against both servers, in RESP2 and RESP3.
fn shard_conversation(s: &mut Client, publisher: &mut Client, resp3: bool) -> Vec<Resp> {
    let mut out = Vec::new();
    if resp3 {
        out.push(
            s.cmd(&["HELLO", "3"])
                .as_array()
                .map_or(Resp::Null, |_| Resp::ok()),
        );
    }
    s.send(&["SSUBSCRIBE", "orders", "payments"]);
    out.push(read(s));
    out.push(read(s));
    s.send(&["SUBSCRIBE", "orders"]);
    out.push(read(s));
    if !resp3 {
        // Subscribed mode: only the subscription commands and PING.
        out.push(s.cmd(&["GET", "k"]));
    }
    out.push(publisher.cmd(&["SPUBLISH", "orders", "o1"]));
    out.push(read(s));
    out.push(publisher.cmd(&["PUBLISH", "orders", "plain"]));
    out.push(read(s));
    out.push(publisher.cmd(&["SPUBLISH", "nobody", "x"]));
    out.push(publisher.cmd(&["PUBSUB", "SHARDNUMSUB", "orders", "payments", "none"]));
    // Redis lists channels in its dictionary's order: compare them as sets.
    out.push(sorted(publisher.cmd(&["PUBSUB", "SHARDCHANNELS"])));
    out.push(publisher.cmd(&["PUBSUB", "SHARDCHANNELS", "pay*"]));
    out.push(publisher.cmd(&["PUBSUB", "NUMSUB", "orders"]));
    out.push(publisher.cmd(&["PUBSUB", "CHANNELS"]));
    s.send(&["SUNSUBSCRIBE", "orders"]);
    out.push(read(s));
    out.push(publisher.cmd(&["SPUBLISH", "orders", "o2"]));
    s.send(&["SUNSUBSCRIBE"]);
    out.push(read(s));
    s.send(&["SUNSUBSCRIBE"]);
    out.push(read(s));
    s.send(&["UNSUBSCRIBE"]);
    out.push(read(s));
    out.push(s.cmd(&["PING"]));
    out
}

fn sorted(r: Resp) -> Resp {
    match r {
        Resp::Array(mut v) => {
            v.sort_by_key(|x| format!("{x:?}"));
            Resp::Array(v)
        }
        other => other,
    }
}

#[test]
fn sharded_pubsub_matches_redis() {
    for resp3 in [false, true] {
        let kite = KiteServer::start(&[], 4);
        let redis = RedisServer::start();
        let k = shard_conversation(&mut kite.client(), &mut kite.client(), resp3);
        let r = shard_conversation(&mut redis.client(), &mut redis.client(), resp3);
        assert_eq!(k.len(), r.len());
        for (i, (a, b)) in k.iter().zip(&r).enumerate() {
            assert_eq!(a, b, "resp3={resp3} step {i}: kite {a} vs redis {b}");
        }
    }
}

/// A RESP2 subscriber may only (un)subscribe, PING, QUIT and RESET, whichever thread its
/// commands' keys live on. Pipelined keyed commands bound for another thread used to run
/// there (they were batched past the check), replying +OK between the refusals.
#[test]
fn resp2_subscriber_is_refused_keyed_commands_on_every_thread() {
    let s = KiteServer::start(&[], 4);
    let mut sub = s.client();
    sub.send(&["SUBSCRIBE", "ch"]);
    assert_eq!(
        read(&mut sub).as_array().unwrap()[0],
        Resp::bulk("subscribe")
    );
    let keys = common::spread_keys("sub-refused:", 8);
    let cmds: Vec<Vec<&str>> = keys.iter().map(|k| vec!["SET", k.as_str(), "v"]).collect();
    for r in sub.pipeline(&cmds) {
        common::assert_err_prefix(&r, "ERR Can't execute 'set'");
    }
    let mut admin = s.client();
    for k in &keys {
        assert_eq!(
            admin.cmd(&["EXISTS", k]),
            Resp::Integer(0),
            "{k} was written"
        );
    }
}
