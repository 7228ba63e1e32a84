//! Blocking commands against the real binary, at `--threads 1` and `--threads 4`:
//! exactly-once delivery under contention, first-blocked first-served, timeouts, wake-ups
//! after MULTI, CLIENT UNBLOCK, disconnects, cross-shard moves, replies compared with
//! redis-server where no waiting is involved, and input sent behind a blocked pop (kept
//! for after it, and a client leaving after sending it still noticed).

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{Client, KiteServer, RedisServer, Resp};

fn info_int(c: &mut Client, field: &str) -> i64 {
    let text = c.cmd(&["INFO", "clients"]).as_string().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits (bounded) until `n` clients are blocked.
fn wait_blocked(c: &mut Client, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while info_int(c, "blocked_clients") != n {
        assert!(Instant::now() < deadline, "expected {n} blocked clients");
        thread::sleep(Duration::from_millis(5));
    }
}

fn exactly_once(threads: usize) {
    const QUEUES: usize = 10;
    const JOBS: usize = 100_000;
    const CONSUMERS: usize = 50;
    let s = KiteServer::start(&[], threads);
    let queues: Vec<String> = (0..QUEUES).map(|i| format!("queue:{i}")).collect();
    let done_producing = Arc::new(AtomicBool::new(false));
    let popped = Arc::new(Mutex::new(Vec::with_capacity(JOBS)));
    let total = Arc::new(AtomicUsize::new(0));
    thread::scope(|scope| {
        for _ in 0..CONSUMERS {
            let (queues, popped, total, done) = (
                queues.clone(),
                popped.clone(),
                total.clone(),
                done_producing.clone(),
            );
            let mut c = s.client();
            c.set_timeout(Some(Duration::from_secs(30)));
            scope.spawn(move || {
                let mut mine = Vec::new();
                let mut idle = 0;
                // Each consumer blocks over every queue, so waiters span all shards.
                let mut cmd: Vec<String> = vec!["BRPOP".into()];
                cmd.extend(queues.iter().cloned());
                cmd.push("0.2".into());
                while idle < 3 {
                    let r = c.cmd(&cmd);
                    match r.as_array() {
                        Some(pair) => {
                            mine.push(pair[1].as_string().unwrap());
                            total.fetch_add(1, Ordering::Relaxed);
                            idle = 0;
                        }
                        None => {
                            assert!(r.is_null(), "BRPOP returned {r}");
                            if done.load(Ordering::Relaxed) {
                                idle += 1;
                            }
                        }
                    }
                }
                popped.lock().unwrap().extend(mine);
            });
        }
        let queues = queues.clone();
        let mut p = s.client();
        let done = done_producing.clone();
        scope.spawn(move || {
            let mut next = 0;
            while next < JOBS {
                let batch: Vec<Vec<String>> = (0..100)
                    .map(|i| {
                        let id = next + i;
                        vec![
                            "LPUSH".to_string(),
                            queues[id % QUEUES].clone(),
                            format!("job-{id}"),
                        ]
                    })
                    .collect();
                for r in p.pipeline(&batch) {
                    assert!(r.as_int().is_some(), "LPUSH returned {r}");
                }
                next += 100;
            }
            done.store(true, Ordering::Relaxed);
        });
    });
    let popped = popped.lock().unwrap();
    assert_eq!(popped.len(), JOBS, "every job popped once, none twice");
    let unique: HashSet<&String> = popped.iter().collect();
    assert_eq!(unique.len(), JOBS, "no job popped twice");
    let mut c = s.client();
    for q in &queues {
        assert_eq!(c.cmd(&["LLEN", q]), Resp::Integer(0));
    }
    assert_eq!(info_int(&mut c, "blocked_clients"), 0);
}

#[test]
fn exactly_once_delivery_threads1() {
    exactly_once(1);
}

#[test]
fn exactly_once_delivery_threads4() {
    exactly_once(4);
}

fn first_blocked_first_served(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let mut waiters: Vec<Client> = Vec::new();
    for i in 0..3 {
        let mut c = s.client();
        c.send(&["BLPOP", "fifo", "0"]);
        wait_blocked(&mut admin, i + 1);
        waiters.push(c);
    }
    // One push of three elements serves three waiters in the order they blocked.
    assert_eq!(
        admin.cmd(&["RPUSH", "fifo", "a", "b", "c"]),
        Resp::Integer(3)
    );
    for (c, want) in waiters.iter_mut().zip(["a", "b", "c"]) {
        c.set_timeout(Some(Duration::from_secs(10)));
        assert_eq!(
            c.read(),
            Resp::Array(vec![Resp::bulk("fifo"), Resp::bulk(want)])
        );
    }
    assert_eq!(admin.cmd(&["EXISTS", "fifo"]), Resp::Integer(0));
    // Waiters on several keys: the first push to any of them serves the oldest waiter.
    let mut w1 = s.client();
    w1.send(&["BRPOP", "k1", "k2", "k3", "0"]);
    wait_blocked(&mut admin, 1);
    let mut w2 = s.client();
    w2.send(&["BRPOP", "k3", "0"]);
    wait_blocked(&mut admin, 2);
    admin.cmd(&["LPUSH", "k3", "x"]);
    w1.set_timeout(Some(Duration::from_secs(10)));
    assert_eq!(
        w1.read(),
        Resp::Array(vec![Resp::bulk("k3"), Resp::bulk("x")])
    );
    admin.cmd(&["LPUSH", "k3", "y"]);
    w2.set_timeout(Some(Duration::from_secs(10)));
    assert_eq!(
        w2.read(),
        Resp::Array(vec![Resp::bulk("k3"), Resp::bulk("y")])
    );
    assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
}

#[test]
fn first_blocked_first_served_threads1() {
    first_blocked_first_served(1);
}

#[test]
fn first_blocked_first_served_threads4() {
    first_blocked_first_served(4);
}

fn timeouts_and_errors(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut c = s.client();
    c.set_timeout(Some(Duration::from_secs(10)));
    assert!(c.cmd(&["BLPOP", "none", "0.05"]).is_null());
    // A sub-millisecond timeout is one millisecond, never "for ever".
    assert!(c.cmd(&["BRPOP", "none", "0.0005"]).is_null());
    assert!(c
        .cmd(&["BLMOVE", "none", "dst", "LEFT", "RIGHT", "0.01"])
        .is_null());
    assert!(c.cmd(&["BLMPOP", "0.01", "2", "a", "b", "LEFT"]).is_null());
    for (t, err) in [
        ("-1", "ERR timeout is negative"),
        ("abc", "ERR timeout is not a float or out of range"),
        ("nan", "ERR timeout is not a float or out of range"),
        ("inf", "ERR timeout is out of range"),
    ] {
        assert_eq!(
            c.cmd(&["BLPOP", "k", t]),
            Resp::Error(err.into()),
            "timeout {t}"
        );
    }
    c.cmd(&["SET", "str", "v"]);
    assert_eq!(
        c.cmd(&["BLPOP", "str", "0"]),
        Resp::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(info_int(&mut c, "blocked_clients"), 0);
}

#[test]
fn timeouts_and_errors_threads1() {
    timeouts_and_errors(1);
}

#[test]
fn timeouts_and_errors_threads4() {
    timeouts_and_errors(4);
}

fn wakeups(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();

    // A push inside MULTI wakes the waiter once EXEC is done, with the final state.
    let mut w = s.client();
    w.send(&["BLPOP", "m", "0"]);
    wait_blocked(&mut admin, 1);
    admin.cmd(&["MULTI"]);
    admin.cmd(&["RPUSH", "m", "x"]);
    admin.cmd(&["LPUSH", "m", "y"]);
    admin.cmd(&["EXEC"]);
    w.set_timeout(Some(Duration::from_secs(10)));
    assert_eq!(
        w.read(),
        Resp::Array(vec![Resp::bulk("m"), Resp::bulk("y")])
    );
    assert_eq!(
        admin.cmd(&["LRANGE", "m", "0", "-1"]),
        Resp::Array(vec![Resp::bulk("x")])
    );

    // Replies to earlier pipelined commands arrive before the connection parks.
    let mut p = s.client();
    p.set_timeout(Some(Duration::from_secs(10)));
    p.send_raw(b"SET before 1\r\nBLPOP parked 0\r\n");
    assert_eq!(p.read(), Resp::ok());
    wait_blocked(&mut admin, 1);
    admin.cmd(&["RPUSH", "parked", "v"]);
    assert_eq!(
        p.read(),
        Resp::Array(vec![Resp::bulk("parked"), Resp::bulk("v")])
    );

    // Inside MULTI a blocking command does not block.
    p.cmd(&["MULTI"]);
    p.cmd(&["BLPOP", "empty", "0"]);
    assert_eq!(p.cmd(&["EXEC"]), Resp::Array(vec![Resp::NullArray]));

    // CLIENT UNBLOCK, as a timeout and as an error.
    let mut u = s.client();
    let id = u.cmd(&["CLIENT", "ID"]).as_int().unwrap().to_string();
    u.set_timeout(Some(Duration::from_secs(10)));
    u.send(&["BRPOP", "never", "0"]);
    wait_blocked(&mut admin, 1);
    assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", &id]), Resp::Integer(1));
    assert!(u.read().is_null());
    u.send(&["BRPOP", "never", "0"]);
    wait_blocked(&mut admin, 1);
    assert_eq!(
        admin.cmd(&["CLIENT", "UNBLOCK", &id, "ERROR"]),
        Resp::Integer(1)
    );
    assert_eq!(
        u.read(),
        Resp::Error("UNBLOCKED client unblocked via CLIENT UNBLOCK".into())
    );
    assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", &id]), Resp::Integer(0));

    // A client that leaves stops waiting at once; nothing pushed later is lost.
    let mut gone = s.client();
    gone.send(&["BLPOP", "left", "0"]);
    wait_blocked(&mut admin, 1);
    drop(gone);
    wait_blocked(&mut admin, 0);
    admin.cmd(&["RPUSH", "left", "kept"]);
    assert_eq!(admin.cmd(&["LLEN", "left"]), Resp::Integer(1));

    // CLIENT KILL of a blocked client.
    let mut k = s.client();
    let kid = k.cmd(&["CLIENT", "ID"]).as_int().unwrap().to_string();
    k.send(&["BLPOP", "killed", "0"]);
    wait_blocked(&mut admin, 1);
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "ID", &kid]), Resp::Integer(1));
    wait_blocked(&mut admin, 0);

    // BRPOPLPUSH / BLMOVE into a list on another shard, and into one on the same shard.
    for (src, dst) in [("src:a", "dst:b"), ("{t}src", "{t}dst")] {
        let mut m = s.client();
        m.set_timeout(Some(Duration::from_secs(10)));
        m.send(&["BLMOVE", src, dst, "RIGHT", "LEFT", "0"]);
        wait_blocked(&mut admin, 1);
        admin.cmd(&["LPUSH", src, "job"]);
        assert_eq!(m.read(), Resp::bulk("job"));
        assert_eq!(
            admin.cmd(&["LRANGE", dst, "0", "-1"]),
            Resp::Array(vec![Resp::bulk("job")])
        );
        assert_eq!(admin.cmd(&["EXISTS", src]), Resp::Integer(0));
    }

    // BLMPOP takes up to COUNT elements from the first list that has some.
    let mut b = s.client();
    b.set_timeout(Some(Duration::from_secs(10)));
    b.send(&["BLMPOP", "0", "2", "mp1", "mp2", "LEFT", "COUNT", "2"]);
    wait_blocked(&mut admin, 1);
    admin.cmd(&["RPUSH", "mp2", "1", "2", "3"]);
    assert_eq!(
        b.read(),
        Resp::Array(vec![
            Resp::bulk("mp2"),
            Resp::Array(vec![Resp::bulk("1"), Resp::bulk("2")])
        ])
    );
    assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
}

#[test]
fn wakeups_threads1() {
    wakeups(1);
}

#[test]
fn wakeups_threads4() {
    wakeups(4);
}

/// Where nothing waits, blocking commands answer exactly as redis-server does.
#[test]
fn immediate_replies_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut k = kite.client();
    let mut r = redis.client();
    let script: &[&[&str]] = &[
        &["RPUSH", "l1", "a", "b", "c"],
        &["RPUSH", "l2", "x"],
        &["BLPOP", "missing", "l1", "l2", "0"],
        &["BRPOP", "l2", "l1", "1"],
        &["BRPOP", "l2", "l1", "1"],
        &[
            "BLMPOP", "1", "3", "missing", "l1", "l2", "RIGHT", "COUNT", "5",
        ],
        &["BLMPOP", "1", "0", "l1", "LEFT"],
        &["BLMPOP", "1", "1", "l1", "UP"],
        &["BLMPOP", "1", "1", "l1", "LEFT", "COUNT", "0"],
        &["RPUSH", "s", "1", "2"],
        &["BRPOPLPUSH", "s", "d", "1"],
        &["BLMOVE", "s", "d", "LEFT", "LEFT", "1"],
        &["BLMOVE", "s", "d", "UP", "LEFT", "1"],
        &["LRANGE", "d", "0", "-1"],
        &["SET", "str", "v"],
        &["BLMOVE", "d", "str", "LEFT", "LEFT", "1"],
        &["BRPOP", "l1", "str", "1"],
        &["MULTI"],
        &["BLPOP", "none", "0"],
        &["BRPOPLPUSH", "none", "d", "0"],
        &["BLMPOP", "0", "1", "none", "LEFT"],
        &["EXEC"],
        &["LMPOP", "2", "none", "d", "LEFT", "COUNT", "1"],
        &["LMPOP", "0", "d", "LEFT"],
        &["RPUSH", "e", "a", "b", "a", "c", "a"],
        &["LPOS", "e", "a"],
        &["LPOS", "e", "a", "RANK", "-1", "COUNT", "0"],
        &["LPOS", "e", "a", "RANK", "0"],
        &["LPOS", "e", "a", "COUNT", "2", "MAXLEN", "3"],
        &["LINSERT", "e", "BEFORE", "c", "z"],
        &["LINSERT", "e", "AFTER", "nope", "z"],
        &["LINSERT", "nokey", "AFTER", "a", "z"],
        &["LSET", "e", "-1", "last"],
        &["LSET", "e", "99", "x"],
        &["LSET", "nokey", "0", "x"],
        &["LREM", "e", "-1", "a"],
        &["LREM", "e", "0", "a"],
        &["LRANGE", "e", "0", "-1"],
        &["LTRIM", "e", "1", "-2"],
        &["LRANGE", "e", "0", "-1"],
        &["LTRIM", "e", "5", "1"],
        &["EXISTS", "e"],
        &["ZADD", "z1", "1", "a", "2", "b", "3", "c"],
        &["BZPOPMIN", "none", "z1", "1"],
        &["BZPOPMAX", "z1", "1"],
        &["BZPOPMIN", "none", "0.01"],
        &["BZMPOP", "1", "2", "none", "z1", "MIN", "COUNT", "5"],
        &["BZMPOP", "0.01", "1", "z1", "MAX"],
        &["BZMPOP", "1", "0", "z1", "MAX"],
        &["BZPOPMIN", "str", "1"],
        &["BZPOPMIN", "z1", "-1"],
        &["MULTI"],
        &["BZPOPMIN", "none", "0"],
        &["BZMPOP", "0", "1", "none", "MIN"],
        &["EXEC"],
    ];
    for cmd in script {
        let (a, b) = (k.cmd(cmd), r.cmd(cmd));
        assert_eq!(a, b, "{cmd:?}: kite {a} vs redis {b}");
    }
}

fn stream_wakeups(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();

    // XREAD BLOCK with `$` over two streams: served by the first XADD after it blocked.
    let mut r = s.client();
    r.set_timeout(Some(Duration::from_secs(10)));
    admin.cmd(&["XADD", "s1", "1-1", "old", "entry"]);
    r.send(&["XREAD", "BLOCK", "0", "STREAMS", "s0", "s1", "$", "$"]);
    wait_blocked(&mut admin, 1);
    admin.cmd(&["XADD", "s1", "2-1", "f", "v"]);
    let reply = r.read();
    let streams = reply.as_array().unwrap();
    assert_eq!(streams.len(), 1, "{reply}");
    let one = streams[0].as_array().unwrap();
    assert_eq!(one[0], Resp::bulk("s1"));
    assert_eq!(
        one[1].as_array().unwrap().len(),
        1,
        "only the new entry: {reply}"
    );

    // A timeout answers a null array.
    assert!(r
        .cmd(&["XREAD", "BLOCK", "20", "STREAMS", "s1", "$"])
        .is_null());

    // COUNT is honoured when a transaction adds many entries at once.
    admin.cmd(&["XGROUP", "CREATE", "jobs", "workers", "$", "MKSTREAM"]);
    r.send(&[
        "XREADGROUP",
        "GROUP",
        "workers",
        "c1",
        "COUNT",
        "1",
        "BLOCK",
        "0",
        "STREAMS",
        "jobs",
        ">",
    ]);
    wait_blocked(&mut admin, 1);
    admin.cmd(&["MULTI"]);
    for i in 0..50 {
        admin.cmd(&["XADD", "jobs", "*", "n", &i.to_string()]);
    }
    admin.cmd(&["EXEC"]);
    let reply = r.read();
    let entries = reply.as_array().unwrap()[0].as_array().unwrap()[1]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(entries, 1, "COUNT 1 on wake-up: {reply}");
    let pending = admin.cmd(&["XPENDING", "jobs", "workers"]);
    assert_eq!(pending.as_array().unwrap()[0], Resp::Integer(1));

    // A blocked XREADGROUP learns that its stream was deleted.
    r.send(&[
        "XREADGROUP",
        "GROUP",
        "workers",
        "c1",
        "BLOCK",
        "0",
        "STREAMS",
        "jobs",
        ">",
    ]);
    let reply = r.read();
    assert_eq!(
        reply.as_array().unwrap()[0].as_array().unwrap()[1]
            .as_array()
            .unwrap()
            .len(),
        49
    );
    r.send(&[
        "XREADGROUP",
        "GROUP",
        "workers",
        "c1",
        "BLOCK",
        "0",
        "STREAMS",
        "jobs",
        ">",
    ]);
    wait_blocked(&mut admin, 1);
    admin.cmd(&["DEL", "jobs"]);
    assert_eq!(
        r.read(),
        Resp::Error(
            "NOGROUP No such key 'jobs' or consumer group 'workers' in XREADGROUP with GROUP option"
                .into()
        )
    );

    // Inside MULTI a read that would wait answers a null array.
    r.cmd(&["MULTI"]);
    r.cmd(&["XREAD", "BLOCK", "0", "STREAMS", "s1", "$"]);
    assert_eq!(r.cmd(&["EXEC"]), Resp::Array(vec![Resp::NullArray]));
    assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
}

#[test]
fn stream_wakeups_threads1() {
    stream_wakeups(1);
}

#[test]
fn stream_wakeups_threads4() {
    stream_wakeups(4);
}

fn zset_wakeups(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    // BullMQ's workers wait on a marker sorted set; a ZADD wakes them in order.
    let mut w1 = s.client();
    w1.set_timeout(Some(Duration::from_secs(10)));
    w1.send(&["BZPOPMIN", "bull:q:marker", "0"]);
    wait_blocked(&mut admin, 1);
    let mut w2 = s.client();
    w2.set_timeout(Some(Duration::from_secs(10)));
    w2.send(&["BZPOPMIN", "other", "bull:q:marker", "0"]);
    wait_blocked(&mut admin, 2);
    admin.cmd(&["ZADD", "bull:q:marker", "0", "0", "1", "1"]);
    assert_eq!(
        w1.read(),
        Resp::Array(vec![
            Resp::bulk("bull:q:marker"),
            Resp::bulk("0"),
            Resp::bulk("0")
        ])
    );
    assert_eq!(
        w2.read(),
        Resp::Array(vec![
            Resp::bulk("bull:q:marker"),
            Resp::bulk("1"),
            Resp::bulk("1")
        ])
    );
    // A millisecond timeout (BullMQ's) returns, and BZMPOP takes COUNT members.
    assert!(w1.cmd(&["BZPOPMIN", "bull:q:marker", "0.001"]).is_null());
    w1.send(&["BZMPOP", "0", "1", "zz", "MAX", "COUNT", "2"]);
    wait_blocked(&mut admin, 1);
    admin.cmd(&["ZADD", "zz", "1", "a", "2", "b", "3", "c"]);
    assert_eq!(
        w1.read(),
        Resp::Array(vec![
            Resp::bulk("zz"),
            Resp::Array(vec![
                Resp::Array(vec![Resp::bulk("c"), Resp::bulk("3")]),
                Resp::Array(vec![Resp::bulk("b"), Resp::bulk("2")]),
            ])
        ])
    );
    assert_eq!(admin.cmd(&["ZCARD", "zz"]), Resp::Integer(1));
    assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
}

#[test]
fn zset_wakeups_threads1() {
    zset_wakeups(1);
}

#[test]
fn zset_wakeups_threads4() {
    zset_wakeups(4);
}

/// Commands a client sends while its BLPOP waits run once the pop is served, in order,
/// and not before: Redis leaves a blocked client's input alone until it is unblocked.
/// The bytes behind it here span several reads (a 40 KiB value), so they arrive while
/// the connection waits and are kept for it by the loop.
fn input_behind_a_blocked_pop(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let mut a = s.client();
    a.set_timeout(Some(Duration::from_secs(20)));
    let big = "v".repeat(40 * 1024);
    a.send(&["BLPOP", "behind:list", "0"]);
    wait_blocked(&mut admin, 1);
    let mut behind = common::encode_command(&["SET", "behind:x", "1"]);
    behind.extend_from_slice(&common::encode_command(&["SET", "behind:big", &big]));
    behind.extend_from_slice(&common::encode_command(&["GET", "behind:x"]));
    a.send_raw(&behind);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        admin.cmd(&["GET", "behind:x"]),
        Resp::NullBulk,
        "ran before the pop"
    );
    assert_eq!(info_int(&mut admin, "blocked_clients"), 1);
    assert_eq!(
        admin.cmd(&["LPUSH", "behind:list", "job"]),
        Resp::Integer(1)
    );
    assert_eq!(
        a.read(),
        Resp::Array(vec![Resp::bulk("behind:list"), Resp::bulk("job")])
    );
    assert_eq!(a.read(), Resp::ok());
    assert_eq!(a.read(), Resp::ok());
    assert_eq!(a.read(), Resp::bulk("1"));
    assert_eq!(
        a.cmd(&["STRLEN", "behind:big"]),
        Resp::Integer(big.len() as i64)
    );
    // And once more, with the connection still in use.
    a.send(&["BLPOP", "behind:list", "0"]);
    wait_blocked(&mut admin, 1);
    a.send(&["PING"]);
    assert_eq!(
        admin.cmd(&["RPUSH", "behind:list", "job2"]),
        Resp::Integer(1)
    );
    assert_eq!(
        a.read(),
        Resp::Array(vec![Resp::bulk("behind:list"), Resp::bulk("job2")])
    );
    assert_eq!(a.read(), Resp::simple("PONG"));
}

#[test]
fn input_behind_a_blocked_pop_threads1() {
    input_behind_a_blocked_pop(1);
}

#[test]
fn input_behind_a_blocked_pop_threads4() {
    input_behind_a_blocked_pop(4);
}

/// A client that sends more behind its blocked BLPOP and then leaves is noticed as gone:
/// it stops being blocked, and a push after that stays in the list.
fn gone_after_sending_behind_a_blocked_pop(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    for round in 0..3 {
        let mut a = s.client();
        a.send(&["BLPOP", "gone:list", "0"]);
        wait_blocked(&mut admin, 1);
        a.send(&["PING"]);
        if round == 2 {
            a.send_raw(&common::encode_command(&[
                "SET",
                "gone:big",
                &"w".repeat(40 * 1024),
            ]));
        }
        thread::sleep(Duration::from_millis(20));
        drop(a);
        wait_blocked(&mut admin, 0);
        assert_eq!(admin.cmd(&["LPUSH", "gone:list", "job"]), Resp::Integer(1));
        assert_eq!(
            admin.cmd(&["LLEN", "gone:list"]),
            Resp::Integer(1),
            "round {round}"
        );
        assert_eq!(admin.cmd(&["DEL", "gone:list"]), Resp::Integer(1));
    }
}

#[test]
fn gone_after_sending_behind_a_blocked_pop_threads1() {
    gone_after_sending_behind_a_blocked_pop(1);
}

#[test]
fn gone_after_sending_behind_a_blocked_pop_threads4() {
    gone_after_sending_behind_a_blocked_pop(4);
}

/// A blocked client that keeps sending is held to `client-query-buffer-limit` as any
/// other: past it, the connection is closed (as Redis does), not buffered without end.
#[test]
fn input_behind_a_blocked_pop_is_bounded_by_the_query_buffer_limit() {
    let s = KiteServer::start(&[], 1);
    let mut admin = s.client();
    assert_eq!(
        admin.cmd(&["CONFIG", "SET", "client-query-buffer-limit", "1mb"]),
        Resp::ok()
    );
    let mut a = s.client();
    a.set_timeout(Some(Duration::from_secs(20)));
    // Two pops in one write: the second meets the same held bytes when the first ends,
    // and the close must still be counted once.
    let mut pops = common::encode_command(&["BLPOP", "bounded:list", "0"]);
    pops.extend(common::encode_command(&["BLPOP", "bounded:other", "0"]));
    a.try_send_raw(&pops).unwrap();
    wait_blocked(&mut admin, 1);
    // 4 MiB behind the blocked pop, in pieces; the server may close while this writes.
    let chunk = common::encode_command(&["SET", "bounded:x", &"z".repeat(64 * 1024)]);
    for _ in 0..64 {
        if a.try_send_raw(&chunk).is_err() {
            break;
        }
    }
    // Closed: no longer blocked, and the socket reaches its end.
    wait_blocked(&mut admin, 0);
    assert!(
        a.try_read().is_err(),
        "the connection should have been closed"
    );
    assert_eq!(
        admin.cmd(&["LPUSH", "bounded:list", "job"]),
        Resp::Integer(1)
    );
    assert_eq!(admin.cmd(&["LLEN", "bounded:list"]), Resp::Integer(1));
    // Counted as any client closed for its query buffer (Redis counts wherever it closes one).
    let stats = admin.cmd(&["INFO", "stats"]).as_string().unwrap();
    assert!(
        stats.contains("client_query_buffer_limit_disconnections:1\r\n"),
        "INFO stats after one blocked client passed the limit: {stats}"
    );
}

fn bulks(items: &[&str]) -> Resp {
    Resp::Array(items.iter().map(|s| Resp::bulk(*s)).collect())
}

/// INFO commandstats' calls, failed_calls and rejected_calls for BLPOP and BRPOP, after
/// a pop served at once, one that times out, one that blocks and is served, a bad
/// timeout and a key of the wrong type, on keys of one shard and of two.
fn blocking_pop_stats(s: &common::ServerProcess) -> Vec<String> {
    let mut c = s.client();
    let mut pusher = s.client();
    let two = common::spread_keys("st", 2);
    assert_eq!(c.cmd(&["RPUSH", "st-now", "a", "b"]).as_int(), Some(2));
    assert_eq!(c.cmd(&["BRPOP", "st-now", "1"]), bulks(&["st-now", "b"]));
    assert_eq!(
        c.cmd(&["BLPOP", "st-none", "st-now", "1"]),
        bulks(&["st-now", "a"])
    );
    assert!(c.cmd(&["BRPOP", "st-none", "0.05"]).is_null());
    assert!(c
        .cmd(&["BLPOP", two[0].as_str(), two[1].as_str(), "0.05"])
        .is_null());
    assert_eq!(c.cmd(&["RPUSH", two[1].as_str(), "x"]).as_int(), Some(1));
    assert_eq!(
        c.cmd(&["BRPOP", two[0].as_str(), two[1].as_str(), "1"]),
        bulks(&[two[1].as_str(), "x"])
    );
    assert!(c.cmd(&["BRPOP", "st-now", "abc"]).is_error());
    assert!(c.cmd(&["BLPOP", "st-now", "-1"]).is_error());
    assert_eq!(c.cmd(&["SET", "st-str", "v"]), Resp::ok());
    assert!(c.cmd(&["BRPOP", "st-str", "1"]).is_error());
    let waiter = thread::spawn(move || c.cmd(&["BLPOP", "st-later", "5"]));
    wait_blocked(&mut pusher, 1);
    assert_eq!(pusher.cmd(&["RPUSH", "st-later", "y"]).as_int(), Some(1));
    assert_eq!(waiter.join().unwrap(), bulks(&["st-later", "y"]));
    ["cmdstat_blpop", "cmdstat_brpop"]
        .iter()
        .map(|name| {
            let line = common::info_field(&mut pusher, "commandstats", name);
            // usec and usec_per_call depend on timing; the counts must match.
            let counts: Vec<&str> = line
                .split(',')
                .filter(|kv| kv.contains("calls=") && !kv.starts_with("usec"))
                .collect();
            format!("{name}: {}", counts.join(","))
        })
        .collect()
}

/// Each BLPOP and BRPOP counts once, whether it was served at once, waited, timed out or
/// failed, as redis-server counts them (a pop tried on its own thread before it waits is
/// not a second call).
#[test]
fn blocking_pops_count_once_in_commandstats() {
    let redis = RedisServer::start();
    let want = blocking_pop_stats(&redis);
    for threads in [1, 2] {
        let kite = KiteServer::start(&[], threads);
        assert_eq!(blocking_pop_stats(&kite), want, "--threads {threads}");
    }
}
