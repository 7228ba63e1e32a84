//! No lost wake-ups: for every way a list, sorted set or stream can gain elements, a
//! client blocked on that key (BLPOP / BRPOP / BLMOVE / BLMPOP / BZPOPMIN / BZPOPMAX /
//! BZMPOP / XREAD BLOCK / XREADGROUP BLOCK) is woken with the right value. Each scenario
//! runs at `--threads 1` and `--threads 4`; the blocked client and the writer are
//! separate connections (at `--threads 4` several pairs, opened with a shifting number
//! of idle connections in between, so they land on different threads), and the waited
//! key and the source keys have different names (so, usually, different shards).
//!
//! The blocking timeout is 10 s and the only timing assertion is that the reply arrives
//! before it (a lost wake-up shows as a null reply, or a read timeout).
//!
//! Also: the Redis test suite's chains of blocked BLMOVE / BRPOPLPUSH clients (circular,
//! linked, self-referential), whose final state is checked right after the reply to the
//! command that started the chain, and a client blocked in XREAD BLOCK on a replica,
//! woken by what the master writes.
//!
//! And a stress test of the server's own thread wake-ups: 16 clients against
//! `--threads 8`, requests spanning threads with short idle gaps, every reply checked.
//!
//! Facts checked against redis-server 7.0, Redis 7.2 and valkey-server 8.1.

mod common;

use std::collections::{HashMap, VecDeque};
use std::thread;
use std::time::{Duration, Instant};

use common::{info_field, Client, KiteServer, Resp, Rng};

/// The blocking timeout given to every blocking command (seconds).
const BLOCK_SECS: &str = "10";
/// The same for XREAD/XREADGROUP BLOCK (milliseconds).
const BLOCK_MS: &str = "10000";
/// How long the blocked client's socket waits for its reply: longer than the blocking
/// timeout, so a lost wake-up shows as the timeout's null reply.
const REPLY_WAIT: Duration = Duration::from_secs(15);

fn bulk(s: &str) -> Resp {
    Resp::bulk(s)
}

fn arr(items: Vec<Resp>) -> Resp {
    Resp::Array(items)
}

fn bulks(items: &[&str]) -> Resp {
    arr(items.iter().map(|s| bulk(s)).collect())
}

fn blocked_clients(c: &mut Client) -> i64 {
    info_field(c, "clients", "blocked_clients").parse().unwrap()
}

/// Waits (bounded) until `n` clients are blocked.
fn wait_blocked(c: &mut Client, n: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = blocked_clients(c);
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: expected {n} blocked clients, INFO says {now}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Sends a blocking command on `blocker` and waits until the server counts it blocked.
fn block(blocker: &mut Client, observer: &mut Client, cmd: &[&str]) {
    blocker.send(cmd);
    wait_blocked(observer, 1, &cmd.join(" "));
}

/// Reads the blocked client's reply and compares it.
#[track_caller]
fn expect_wake(blocker: &mut Client, what: &str, expected: Resp) {
    blocker.set_timeout(Some(REPLY_WAIT));
    let r = blocker.try_read().unwrap_or_else(|e| {
        panic!("{what}: the blocked client got no reply within {REPLY_WAIT:?}: {e}")
    });
    assert!(
        !r.is_null(),
        "{what}: lost wake-up: the blocked client timed out ({r}) instead of being served \
         {expected}"
    );
    assert_eq!(r, expected, "{what}: the blocked client's reply");
}

#[track_caller]
fn assert_cmd(c: &mut Client, cmd: &[&str], expected: Resp) {
    let r = c.cmd(cmd);
    assert_eq!(r, expected, "reply to `{}`", cmd.join(" "));
}

#[track_caller]
fn ok(c: &mut Client, cmd: &[&str]) {
    assert_cmd(c, cmd, Resp::ok());
}

#[track_caller]
fn int(c: &mut Client, cmd: &[&str], n: i64) {
    assert_cmd(c, cmd, Resp::Integer(n));
}

/// Runs `scenario(blocker, writer)` on a fresh server at `threads`: once at
/// `--threads 1`, three times at `--threads 4` with a new blocker/writer pair each time
/// and 0, 1, 2 idle connections opened between them.
fn run(threads: usize, scenario: fn(&mut Client, &mut Client)) {
    let s = KiteServer::start(&[], threads);
    let rounds = if threads == 1 { 1 } else { 3 };
    let mut idle = Vec::new();
    for round in 0..rounds {
        let mut blocker = s.client();
        for _ in 0..round {
            idle.push(s.client());
        }
        let mut writer = s.client();
        ok(&mut writer, &["FLUSHALL"]);
        scenario(&mut blocker, &mut writer);
        // Whatever the scenario selected, the next round starts in db 0 with nobody
        // blocked.
        assert_eq!(
            blocked_clients(&mut writer),
            0,
            "round {round}: a client is still blocked after the scenario"
        );
    }
    drop(idle);
}

macro_rules! both_thread_counts {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn threads1() {
                    super::run(1, super::scenarios::$name);
                }
                #[test]
                fn threads4() {
                    super::run(4, super::scenarios::$name);
                }
            }
        )*
    };
}

both_thread_counts!(
    lpush,
    rpush,
    lpushx_rpushx_in_multi,
    lmove_into,
    rpoplpush_into,
    blmpop_rpush,
    rename_list,
    renamenx_list,
    copy_list,
    copy_replace_zset,
    copy_db_option,
    move_from_other_db,
    swapdb,
    restore_list,
    restore_replace_zset,
    sort_store,
    zadd,
    zincrby,
    zunionstore,
    zinterstore,
    zdiffstore,
    zrangestore,
    bzmpop_zadd,
    xadd_xread,
    xadd_xreadgroup,
    rename_stream,
    copy_stream,
    eval_rpush,
    eval_copy_zset,
    fcall_rpush,
    multi_exec_push,
    multi_push_then_delete,
);

mod scenarios {
    use super::*;

    pub fn lpush(b: &mut Client, w: &mut Client) {
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        int(w, &["LPUSH", "waited", "a", "b"], 2);
        // LPUSH a b leaves [b, a]: BLPOP takes b.
        expect_wake(b, "LPUSH", bulks(&["waited", "b"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["a"]));
    }

    pub fn rpush(b: &mut Client, w: &mut Client) {
        block(b, w, &["BRPOP", "waited", BLOCK_SECS]);
        int(w, &["RPUSH", "waited", "a", "b"], 2);
        expect_wake(b, "RPUSH", bulks(&["waited", "b"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["a"]));
    }

    /// LPUSHX/RPUSHX only push onto an existing list, so the list is made in the same
    /// transaction; the blocked client sees the list as EXEC left it.
    pub fn lpushx_rpushx_in_multi(b: &mut Client, w: &mut Client) {
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        // Outside a transaction LPUSHX on the missing key does nothing and wakes no one.
        int(w, &["LPUSHX", "waited", "nothing"], 0);
        assert_eq!(
            blocked_clients(w),
            1,
            "LPUSHX on a missing key woke the client"
        );
        ok(w, &["MULTI"]);
        assert_cmd(w, &["RPUSH", "waited", "a"], Resp::simple("QUEUED"));
        assert_cmd(w, &["LPUSHX", "waited", "b"], Resp::simple("QUEUED"));
        assert_cmd(w, &["RPUSHX", "waited", "c"], Resp::simple("QUEUED"));
        assert_cmd(
            w,
            &["EXEC"],
            arr(vec![Resp::Integer(1), Resp::Integer(2), Resp::Integer(3)]),
        );
        expect_wake(b, "MULTI RPUSH/LPUSHX/RPUSHX", bulks(&["waited", "b"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["a", "c"]));
    }

    pub fn lmove_into(b: &mut Client, w: &mut Client) {
        int(w, &["RPUSH", "src:list", "x", "y", "z"], 3);
        block(
            b,
            w,
            &["BLMOVE", "waited", "dst:list", "LEFT", "RIGHT", BLOCK_SECS],
        );
        assert_cmd(
            w,
            &["LMOVE", "src:list", "waited", "RIGHT", "LEFT"],
            bulk("z"),
        );
        expect_wake(b, "LMOVE into the waited key", bulk("z"));
        assert_cmd(w, &["EXISTS", "waited"], Resp::Integer(0));
        assert_cmd(w, &["LRANGE", "dst:list", "0", "-1"], bulks(&["z"]));
        assert_cmd(w, &["LRANGE", "src:list", "0", "-1"], bulks(&["x", "y"]));
    }

    pub fn rpoplpush_into(b: &mut Client, w: &mut Client) {
        int(w, &["RPUSH", "src:list", "x", "y"], 2);
        block(b, w, &["BRPOPLPUSH", "waited", "dst:list", BLOCK_SECS]);
        assert_cmd(w, &["RPOPLPUSH", "src:list", "waited"], bulk("y"));
        expect_wake(b, "RPOPLPUSH into the waited key", bulk("y"));
        assert_cmd(w, &["LRANGE", "dst:list", "0", "-1"], bulks(&["y"]));
        assert_cmd(w, &["EXISTS", "waited"], Resp::Integer(0));
    }

    pub fn blmpop_rpush(b: &mut Client, w: &mut Client) {
        block(
            b,
            w,
            &[
                "BLMPOP", BLOCK_SECS, "2", "other", "waited", "LEFT", "COUNT", "2",
            ],
        );
        int(w, &["RPUSH", "waited", "a", "b", "c"], 3);
        expect_wake(
            b,
            "BLMPOP woken by RPUSH",
            arr(vec![bulk("waited"), bulks(&["a", "b"])]),
        );
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["c"]));
    }

    pub fn rename_list(b: &mut Client, w: &mut Client) {
        int(w, &["RPUSH", "src:list", "x", "y"], 2);
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        ok(w, &["RENAME", "src:list", "waited"]);
        expect_wake(b, "RENAME onto the waited key", bulks(&["waited", "x"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["y"]));
        assert_cmd(w, &["EXISTS", "src:list"], Resp::Integer(0));
    }

    pub fn renamenx_list(b: &mut Client, w: &mut Client) {
        int(w, &["RPUSH", "src:list", "x", "y"], 2);
        block(b, w, &["BRPOP", "waited", BLOCK_SECS]);
        int(w, &["RENAMENX", "src:list", "waited"], 1);
        expect_wake(b, "RENAMENX onto the waited key", bulks(&["waited", "y"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["x"]));
    }

    pub fn copy_list(b: &mut Client, w: &mut Client) {
        int(w, &["RPUSH", "src:list", "x", "y"], 2);
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        int(w, &["COPY", "src:list", "waited"], 1);
        expect_wake(b, "COPY onto the waited key", bulks(&["waited", "x"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["y"]));
        assert_cmd(w, &["LRANGE", "src:list", "0", "-1"], bulks(&["x", "y"]));
    }

    pub fn copy_replace_zset(b: &mut Client, w: &mut Client) {
        int(w, &["ZADD", "src:zset", "1", "a", "2", "b"], 2);
        block(b, w, &["BZPOPMIN", "waited", BLOCK_SECS]);
        int(w, &["COPY", "src:zset", "waited", "REPLACE"], 1);
        expect_wake(
            b,
            "COPY ... REPLACE onto the waited key",
            bulks(&["waited", "a", "1"]),
        );
        assert_cmd(
            w,
            &["ZRANGE", "waited", "0", "-1", "WITHSCORES"],
            bulks(&["b", "2"]),
        );
    }

    /// COPY ... DB 0 issued from db 1 wakes a client blocked in db 0.
    pub fn copy_db_option(b: &mut Client, w: &mut Client) {
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        ok(w, &["SELECT", "1"]);
        int(w, &["RPUSH", "src:list", "x", "y"], 2);
        int(w, &["COPY", "src:list", "waited", "DB", "0"], 1);
        expect_wake(b, "COPY ... DB 0 from db 1", bulks(&["waited", "x"]));
        ok(w, &["SELECT", "0"]);
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["y"]));
    }

    pub fn move_from_other_db(b: &mut Client, w: &mut Client) {
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        ok(w, &["SELECT", "1"]);
        int(w, &["RPUSH", "waited", "x", "y"], 2);
        // The same key name in another db wakes nobody.
        assert_eq!(
            blocked_clients(w),
            1,
            "RPUSH in db 1 served a client blocked in db 0"
        );
        int(w, &["MOVE", "waited", "0"], 1);
        expect_wake(b, "MOVE from db 1", bulks(&["waited", "x"]));
        assert_cmd(w, &["EXISTS", "waited"], Resp::Integer(0));
        ok(w, &["SELECT", "0"]);
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["y"]));
    }

    pub fn swapdb(b: &mut Client, w: &mut Client) {
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        ok(w, &["SELECT", "1"]);
        int(w, &["RPUSH", "waited", "x", "y"], 2);
        assert_eq!(
            blocked_clients(w),
            1,
            "RPUSH in db 1 served a client blocked in db 0"
        );
        ok(w, &["SWAPDB", "0", "1"]);
        expect_wake(b, "SWAPDB 0 1", bulks(&["waited", "x"]));
        // db 1 now holds what db 0 held (nothing); db 0 the rest of the list.
        assert_cmd(w, &["EXISTS", "waited"], Resp::Integer(0));
        ok(w, &["SELECT", "0"]);
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["y"]));
    }

    pub fn restore_list(b: &mut Client, w: &mut Client) {
        int(w, &["RPUSH", "src:list", "x", "y"], 2);
        let payload = w.cmd(&["DUMP", "src:list"]);
        let payload = payload
            .as_bytes()
            .unwrap_or_else(|| panic!("DUMP answered {payload}"))
            .to_vec();
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        let r = w.cmd(&[b"RESTORE".as_slice(), b"waited", b"0", &payload]);
        assert_eq!(r, Resp::ok(), "RESTORE waited");
        expect_wake(b, "RESTORE into the waited key", bulks(&["waited", "x"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["y"]));
    }

    pub fn restore_replace_zset(b: &mut Client, w: &mut Client) {
        int(w, &["ZADD", "src:zset", "3", "c", "4", "d"], 2);
        let payload = w.cmd(&["DUMP", "src:zset"]);
        let payload = payload
            .as_bytes()
            .unwrap_or_else(|| panic!("DUMP answered {payload}"))
            .to_vec();
        block(b, w, &["BZPOPMAX", "waited", BLOCK_SECS]);
        let r = w.cmd(&[b"RESTORE".as_slice(), b"waited", b"0", &payload, b"REPLACE"]);
        assert_eq!(r, Resp::ok(), "RESTORE waited ... REPLACE");
        expect_wake(
            b,
            "RESTORE ... REPLACE into the waited key",
            bulks(&["waited", "d", "4"]),
        );
    }

    pub fn sort_store(b: &mut Client, w: &mut Client) {
        int(w, &["RPUSH", "src:list", "3", "1", "2"], 3);
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        int(w, &["SORT", "src:list", "STORE", "waited"], 3);
        expect_wake(b, "SORT ... STORE", bulks(&["waited", "1"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["2", "3"]));
    }

    pub fn zadd(b: &mut Client, w: &mut Client) {
        block(b, w, &["BZPOPMIN", "waited", BLOCK_SECS]);
        int(w, &["ZADD", "waited", "7", "m", "3", "n"], 2);
        expect_wake(b, "ZADD", bulks(&["waited", "n", "3"]));
        assert_cmd(
            w,
            &["ZRANGE", "waited", "0", "-1", "WITHSCORES"],
            bulks(&["m", "7"]),
        );
    }

    pub fn zincrby(b: &mut Client, w: &mut Client) {
        block(b, w, &["BZPOPMAX", "waited", BLOCK_SECS]);
        assert_cmd(w, &["ZINCRBY", "waited", "2.5", "m"], bulk("2.5"));
        expect_wake(b, "ZINCRBY", bulks(&["waited", "m", "2.5"]));
        assert_cmd(w, &["EXISTS", "waited"], Resp::Integer(0));
    }

    fn two_zsets(w: &mut Client) {
        int(w, &["ZADD", "src:z1", "1", "a", "2", "b"], 2);
        int(w, &["ZADD", "src:z2", "3", "b", "4", "c"], 2);
    }

    pub fn zunionstore(b: &mut Client, w: &mut Client) {
        two_zsets(w);
        block(b, w, &["BZPOPMAX", "waited", BLOCK_SECS]);
        int(w, &["ZUNIONSTORE", "waited", "2", "src:z1", "src:z2"], 3);
        // a:1 b:5 c:4
        expect_wake(b, "ZUNIONSTORE", bulks(&["waited", "b", "5"]));
        assert_cmd(
            w,
            &["ZRANGE", "waited", "0", "-1", "WITHSCORES"],
            bulks(&["a", "1", "c", "4"]),
        );
    }

    pub fn zinterstore(b: &mut Client, w: &mut Client) {
        two_zsets(w);
        block(b, w, &["BZPOPMIN", "waited", BLOCK_SECS]);
        int(w, &["ZINTERSTORE", "waited", "2", "src:z1", "src:z2"], 1);
        expect_wake(b, "ZINTERSTORE", bulks(&["waited", "b", "5"]));
        assert_cmd(w, &["EXISTS", "waited"], Resp::Integer(0));
    }

    pub fn zdiffstore(b: &mut Client, w: &mut Client) {
        two_zsets(w);
        block(b, w, &["BZPOPMIN", "waited", BLOCK_SECS]);
        int(w, &["ZDIFFSTORE", "waited", "2", "src:z1", "src:z2"], 1);
        expect_wake(b, "ZDIFFSTORE", bulks(&["waited", "a", "1"]));
    }

    pub fn zrangestore(b: &mut Client, w: &mut Client) {
        two_zsets(w);
        block(b, w, &["BZPOPMIN", "waited", BLOCK_SECS]);
        int(w, &["ZRANGESTORE", "waited", "src:z2", "0", "-1"], 2);
        expect_wake(b, "ZRANGESTORE", bulks(&["waited", "b", "3"]));
        assert_cmd(
            w,
            &["ZRANGE", "waited", "0", "-1", "WITHSCORES"],
            bulks(&["c", "4"]),
        );
    }

    pub fn bzmpop_zadd(b: &mut Client, w: &mut Client) {
        block(
            b,
            w,
            &[
                "BZMPOP", BLOCK_SECS, "2", "other", "waited", "MAX", "COUNT", "2",
            ],
        );
        int(w, &["ZADD", "waited", "1", "a", "2", "b", "3", "c"], 3);
        expect_wake(
            b,
            "BZMPOP woken by ZADD",
            arr(vec![
                bulk("waited"),
                arr(vec![bulks(&["c", "3"]), bulks(&["b", "2"])]),
            ]),
        );
        assert_cmd(w, &["ZCARD", "waited"], Resp::Integer(1));
    }

    pub fn xadd_xread(b: &mut Client, w: &mut Client) {
        block(
            b,
            w,
            &[
                "XREAD", "BLOCK", BLOCK_MS, "STREAMS", "other", "waited", "$", "$",
            ],
        );
        assert_cmd(w, &["XADD", "waited", "5-1", "f", "v"], bulk("5-1"));
        expect_wake(
            b,
            "XADD / XREAD BLOCK",
            one_entry("waited", "5-1", "f", "v"),
        );
    }

    pub fn xadd_xreadgroup(b: &mut Client, w: &mut Client) {
        ok(w, &["XGROUP", "CREATE", "waited", "g", "$", "MKSTREAM"]);
        block(
            b,
            w,
            &[
                "XREADGROUP",
                "GROUP",
                "g",
                "c1",
                "BLOCK",
                BLOCK_MS,
                "STREAMS",
                "waited",
                ">",
            ],
        );
        assert_cmd(w, &["XADD", "waited", "5-1", "f", "v"], bulk("5-1"));
        expect_wake(
            b,
            "XADD / XREADGROUP BLOCK",
            one_entry("waited", "5-1", "f", "v"),
        );
        // The entry is now pending for c1.
        let pending = w.cmd(&["XPENDING", "waited", "g"]);
        assert_eq!(
            pending.as_array().map(|a| a[0].clone()),
            Some(Resp::Integer(1)),
            "XPENDING after the wake: {pending}"
        );
    }

    pub fn rename_stream(b: &mut Client, w: &mut Client) {
        assert_cmd(w, &["XADD", "src:stream", "5-1", "f", "v"], bulk("5-1"));
        block(
            b,
            w,
            &["XREAD", "BLOCK", BLOCK_MS, "STREAMS", "waited", "$"],
        );
        ok(w, &["RENAME", "src:stream", "waited"]);
        expect_wake(
            b,
            "RENAME of a stream onto the waited key",
            one_entry("waited", "5-1", "f", "v"),
        );
    }

    pub fn copy_stream(b: &mut Client, w: &mut Client) {
        assert_cmd(w, &["XADD", "src:stream", "5-1", "f", "v"], bulk("5-1"));
        block(
            b,
            w,
            &["XREAD", "BLOCK", BLOCK_MS, "STREAMS", "waited", "$"],
        );
        int(w, &["COPY", "src:stream", "waited"], 1);
        expect_wake(
            b,
            "COPY of a stream onto the waited key",
            one_entry("waited", "5-1", "f", "v"),
        );
    }

    pub fn eval_rpush(b: &mut Client, w: &mut Client) {
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        assert_cmd(
            w,
            &[
                "EVAL",
                "return redis.call('rpush', KEYS[1], ARGV[1], ARGV[2])",
                "1",
                "waited",
                "x",
                "y",
            ],
            Resp::Integer(2),
        );
        expect_wake(b, "EVAL rpush", bulks(&["waited", "x"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["y"]));
    }

    /// A script that reads a source key and copies it into the waited key, one
    /// single-key call at a time (the keys need not share a shard).
    pub fn eval_copy_zset(b: &mut Client, w: &mut Client) {
        int(w, &["ZADD", "src:zset", "1", "a", "2", "b"], 2);
        block(b, w, &["BZPOPMIN", "other:zset", "waited:zset", BLOCK_SECS]);
        let script = "local m = redis.call('zrange', KEYS[1], 0, -1, 'WITHSCORES') \
                      for i = 1, #m, 2 do redis.call('zadd', KEYS[2], m[i + 1], m[i]) end \
                      return redis.call('zcard', KEYS[2])";
        assert_cmd(
            w,
            &["EVAL", script, "2", "src:zset", "waited:zset"],
            Resp::Integer(2),
        );
        expect_wake(b, "EVAL zrange + zadd", bulks(&["waited:zset", "a", "1"]));
        assert_cmd(w, &["ZCARD", "waited:zset"], Resp::Integer(1));
    }

    pub fn fcall_rpush(b: &mut Client, w: &mut Client) {
        let lib = "#!lua name=wakelib\n\
                   redis.register_function('pushit', function(keys, args) \
                   return redis.call('rpush', keys[1], args[1]) end)";
        assert_cmd(w, &["FUNCTION", "LOAD", "REPLACE", lib], bulk("wakelib"));
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        int(w, &["FCALL", "pushit", "1", "waited", "fv"], 1);
        expect_wake(b, "FCALL rpush", bulks(&["waited", "fv"]));
        ok(w, &["FUNCTION", "FLUSH"]);
    }

    pub fn multi_exec_push(b: &mut Client, w: &mut Client) {
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        ok(w, &["MULTI"]);
        assert_cmd(w, &["RPUSH", "src:list", "s"], Resp::simple("QUEUED"));
        assert_cmd(w, &["RPUSH", "waited", "a", "b"], Resp::simple("QUEUED"));
        assert_cmd(
            w,
            &["LMOVE", "src:list", "waited", "LEFT", "LEFT"],
            Resp::simple("QUEUED"),
        );
        assert_cmd(
            w,
            &["EXEC"],
            arr(vec![Resp::Integer(1), Resp::Integer(2), bulk("s")]),
        );
        // The client sees the list as EXEC left it: [s, a, b].
        expect_wake(b, "MULTI/EXEC push", bulks(&["waited", "s"]));
        assert_cmd(w, &["LRANGE", "waited", "0", "-1"], bulks(&["a", "b"]));
    }

    /// A push undone in the same transaction wakes nobody; the next push does.
    pub fn multi_push_then_delete(b: &mut Client, w: &mut Client) {
        block(b, w, &["BLPOP", "waited", BLOCK_SECS]);
        ok(w, &["MULTI"]);
        assert_cmd(w, &["LPUSH", "waited", "early"], Resp::simple("QUEUED"));
        assert_cmd(w, &["DEL", "waited"], Resp::simple("QUEUED"));
        assert_cmd(w, &["EXEC"], arr(vec![Resp::Integer(1), Resp::Integer(1)]));
        int(w, &["RPUSH", "waited", "later"], 1);
        expect_wake(
            b,
            "MULTI LPUSH+DEL, then RPUSH",
            bulks(&["waited", "later"]),
        );
    }
}

// ---------------------------------------------------------------------------
// Chains of blocked moves (Redis's list.tcl: "Linked LMOVEs", "Circular BRPOPLPUSH",
// "Self-referential BRPOPLPUSH"): the whole chain has run by the time the command
// that started it has answered.
// ---------------------------------------------------------------------------

fn lrange(c: &mut Client, key: &str) -> Resp {
    c.cmd(&["LRANGE", key, "0", "-1"])
}

fn circular(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let rounds = if threads == 1 { 1 } else { 3 };
    for round in 0..rounds {
        let mut a = s.client();
        let mut b = s.client();
        let mut w = s.client();
        w.cmd(&["DEL", "chain:list1", "chain:list2"]);
        a.send(&["BLMOVE", "chain:list1", "chain:list2", "LEFT", "RIGHT", "0"]);
        wait_blocked(&mut w, 1, "A: BLMOVE list1 list2");
        b.send(&["BLMOVE", "chain:list2", "chain:list1", "LEFT", "RIGHT", "0"]);
        wait_blocked(&mut w, 2, "B: BLMOVE list2 list1");
        int(&mut w, &["RPUSH", "chain:list1", "foo"], 1);
        // Right after the RPUSH reply: A moved foo to list2, B moved it back to list1.
        assert_eq!(
            (lrange(&mut w, "chain:list1"), lrange(&mut w, "chain:list2")),
            (bulks(&["foo"]), bulks(&[])),
            "round {round}: list1 and list2 right after the RPUSH that started the \
             circular chain"
        );
        expect_wake(&mut a, "A (list1 -> list2)", bulk("foo"));
        expect_wake(&mut b, "B (list2 -> list1)", bulk("foo"));
        assert_eq!(blocked_clients(&mut w), 0);
    }
}

#[test]
fn circular_blmove_threads1() {
    circular(1);
}

#[test]
fn circular_blmove_threads4() {
    circular(4);
}

fn circular_brpoplpush(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = s.client();
    let mut b = s.client();
    let mut w = s.client();
    a.send(&["BRPOPLPUSH", "c:list1", "c:list2", "0"]);
    wait_blocked(&mut w, 1, "BRPOPLPUSH list1 list2");
    b.send(&["BRPOPLPUSH", "c:list2", "c:list1", "0"]);
    wait_blocked(&mut w, 2, "BRPOPLPUSH list2 list1");
    int(&mut w, &["RPUSH", "c:list1", "foo"], 1);
    assert_eq!(
        (lrange(&mut w, "c:list1"), lrange(&mut w, "c:list2")),
        (bulks(&["foo"]), bulks(&[])),
        "list1 and list2 right after the RPUSH (circular BRPOPLPUSH)"
    );
    expect_wake(&mut a, "A", bulk("foo"));
    expect_wake(&mut b, "B", bulk("foo"));
}

#[test]
fn circular_brpoplpush_threads1() {
    circular_brpoplpush(1);
}

#[test]
fn circular_brpoplpush_threads4() {
    circular_brpoplpush(4);
}

fn linked(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = s.client();
    let mut b = s.client();
    let mut w = s.client();
    a.send(&["BLMOVE", "l:list1", "l:list2", "RIGHT", "LEFT", "0"]);
    wait_blocked(&mut w, 1, "BLMOVE list1 list2");
    b.send(&["BLMOVE", "l:list2", "l:list3", "LEFT", "RIGHT", "0"]);
    wait_blocked(&mut w, 2, "BLMOVE list2 list3");
    int(&mut w, &["RPUSH", "l:list1", "foo"], 1);
    assert_eq!(
        (
            lrange(&mut w, "l:list1"),
            lrange(&mut w, "l:list2"),
            lrange(&mut w, "l:list3")
        ),
        (bulks(&[]), bulks(&[]), bulks(&["foo"])),
        "list1, list2, list3 right after the RPUSH (linked BLMOVEs)"
    );
    expect_wake(&mut a, "A", bulk("foo"));
    expect_wake(&mut b, "B", bulk("foo"));
}

#[test]
fn linked_blmove_threads1() {
    linked(1);
}

#[test]
fn linked_blmove_threads4() {
    linked(4);
}

/// A longer chain across many keys, served in blocking order, with a tail client that
/// pops for good: every hop has happened when the RPUSH answers.
fn long_chain(threads: usize) {
    const HOPS: usize = 8;
    let s = KiteServer::start(&[], threads);
    let mut w = s.client();
    let mut hops = Vec::new();
    for i in 0..HOPS {
        let mut c = s.client();
        let from = format!("hop:{i}");
        let to = format!("hop:{}", i + 1);
        c.send(&["BLMOVE", &from, &to, "LEFT", "RIGHT", BLOCK_SECS]);
        wait_blocked(&mut w, i as i64 + 1, "chain hop");
        hops.push(c);
    }
    let mut tail = s.client();
    let last = format!("hop:{HOPS}");
    tail.send(&["BLPOP", &last, BLOCK_SECS]);
    wait_blocked(&mut w, HOPS as i64 + 1, "chain tail");
    int(&mut w, &["RPUSH", "hop:0", "token"], 1);
    for i in 0..=HOPS {
        let key = format!("hop:{i}");
        assert_cmd(&mut w, &["EXISTS", &key], Resp::Integer(0));
    }
    for (i, c) in hops.iter_mut().enumerate() {
        expect_wake(c, &format!("hop {i}"), bulk("token"));
    }
    expect_wake(&mut tail, "tail", bulks(&[&last, "token"]));
}

#[test]
fn long_chain_threads1() {
    long_chain(1);
}

#[test]
fn long_chain_threads4() {
    long_chain(4);
}

fn self_referential(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = s.client();
    let mut w = s.client();
    a.send(&["BRPOPLPUSH", "self:list", "self:list", "0"]);
    wait_blocked(&mut w, 1, "BRPOPLPUSH list list");
    int(&mut w, &["RPUSH", "self:list", "foo"], 1);
    assert_eq!(lrange(&mut w, "self:list"), bulks(&["foo"]));
    expect_wake(&mut a, "self-referential BRPOPLPUSH", bulk("foo"));
}

#[test]
fn self_referential_brpoplpush_threads1() {
    self_referential(1);
}

#[test]
fn self_referential_brpoplpush_threads4() {
    self_referential(4);
}

// ---------------------------------------------------------------------------
// A client blocked on a replica
// ---------------------------------------------------------------------------

/// Waits until the replica's link is up and it has a key the master wrote.
fn wait_replicating(master: &mut Client, replica: &mut Client) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let link = info_field(replica, "replication", "master_link_status");
        if link == "up" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica's link never came up (master_link_status:{link})"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // One write through the command stream, to be sure it flows.
    ok(master, &["SET", "warm-up", "1"]);
    loop {
        if replica.cmd(&["GET", "warm-up"]) == bulk("1") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never saw the master's SET"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn replica_xread(threads: usize) {
    let master = KiteServer::start(&[], threads);
    let replica = KiteServer::start(&[], threads);
    let mut mc = master.client();
    let mut rc = replica.client();
    ok(
        &mut rc,
        &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
    );
    wait_replicating(&mut mc, &mut rc);

    // Blocking pops and XREADGROUP write: a read-only replica refuses them outright.
    let readonly = Resp::Error("READONLY You can't write against a read only replica.".into());
    for cmd in [
        vec!["BLPOP", "q", "1"],
        vec!["BZPOPMIN", "q", "1"],
        vec!["BLMOVE", "q", "q2", "LEFT", "LEFT", "1"],
        vec![
            "XREADGROUP",
            "GROUP",
            "g",
            "c",
            "BLOCK",
            "100",
            "STREAMS",
            "s",
            ">",
        ],
    ] {
        assert_eq!(rc.cmd(&cmd), readonly, "`{}` on a replica", cmd.join(" "));
    }

    let rounds = if threads == 1 { 1 } else { 3 };
    for round in 0..rounds {
        let mut blocker = replica.client();
        let stream = format!("rs:{round}");
        // XADD on the master.
        blocker.send(&["XREAD", "BLOCK", BLOCK_MS, "STREAMS", &stream, "$"]);
        wait_blocked(&mut rc, 1, "XREAD BLOCK on the replica");
        assert_cmd(&mut mc, &["XADD", &stream, "5-1", "f", "v"], bulk("5-1"));
        expect_wake(
            &mut blocker,
            "XREAD BLOCK on a replica, master XADD",
            one_entry(&stream, "5-1", "f", "v"),
        );
        // A script on the master (replicated as its effects).
        blocker.send(&["XREAD", "BLOCK", BLOCK_MS, "STREAMS", &stream, "$"]);
        wait_blocked(&mut rc, 1, "XREAD BLOCK on the replica");
        assert_cmd(
            &mut mc,
            &[
                "EVAL",
                "return redis.call('xadd', KEYS[1], '6-1', 'g', 'w')",
                "1",
                &stream,
            ],
            bulk("6-1"),
        );
        expect_wake(
            &mut blocker,
            "XREAD BLOCK on a replica, master EVAL xadd",
            one_entry(&stream, "6-1", "g", "w"),
        );
        // A transaction on the master.
        blocker.send(&["XREAD", "BLOCK", BLOCK_MS, "STREAMS", &stream, "$"]);
        wait_blocked(&mut rc, 1, "XREAD BLOCK on the replica");
        ok(&mut mc, &["MULTI"]);
        mc.cmd(&["XADD", &stream, "7-1", "h", "x"]);
        assert_cmd(&mut mc, &["EXEC"], arr(vec![bulk("7-1")]));
        expect_wake(
            &mut blocker,
            "XREAD BLOCK on a replica, master MULTI/EXEC",
            one_entry(&stream, "7-1", "h", "x"),
        );
        // RENAME of another stream onto the waited key on the master.
        let other = format!("rs-src:{round}");
        let waited = format!("rs-renamed:{round}");
        assert_cmd(&mut mc, &["XADD", &other, "8-1", "i", "y"], bulk("8-1"));
        blocker.send(&["XREAD", "BLOCK", BLOCK_MS, "STREAMS", &waited, "$"]);
        wait_blocked(&mut rc, 1, "XREAD BLOCK on the replica");
        ok(&mut mc, &["RENAME", &other, &waited]);
        expect_wake(
            &mut blocker,
            "XREAD BLOCK on a replica, master RENAME",
            one_entry(&waited, "8-1", "i", "y"),
        );
    }
}

fn one_entry(key: &str, id: &str, f: &str, v: &str) -> Resp {
    arr(vec![arr(vec![
        bulk(key),
        arr(vec![arr(vec![bulk(id), bulks(&[f, v])])]),
    ])])
}

#[test]
fn replica_xread_block_threads1() {
    replica_xread(1);
}

#[test]
fn replica_xread_block_threads4() {
    replica_xread(4);
}

// ---------------------------------------------------------------------------
// Cross-thread requests with idle gaps
// ---------------------------------------------------------------------------

/// Sends one request and reads its reply (10 s read timeout): a reply that never comes
/// (a server thread that was not woken) fails with the client, request and command.
/// MGET of `keys`, checked against what the client wrote.
fn checked_mget(c: &mut Client, who: usize, sent: &mut usize, keys: &[String], expected: Resp) {
    let mut cmd = strings(&["MGET"]);
    cmd.extend(keys.iter().cloned());
    let r = gap_request(c, who, sent, &cmd);
    assert_eq!(r, expected, "client {who}: `{}`", cmd.join(" "));
}

fn gap_request(c: &mut Client, who: usize, sent: &mut usize, cmd: &[String]) -> Resp {
    c.send(cmd);
    *sent += 1;
    c.try_read().unwrap_or_else(|e| {
        panic!(
            "client {who}, request {sent}: no reply to `{}`: {e}",
            cmd.join(" ")
        )
    })
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// One client of `cross_thread_requests_with_idle_gaps`: `requests` requests on keys
/// of its own (spread over the server's threads by their names), checked against its
/// own model, with a pause of 0 to 2 ms every 1 to 6 requests.
fn gap_client(c: &mut Client, who: usize, requests: usize) {
    c.set_timeout(Some(Duration::from_secs(10)));
    let mut rng = Rng::new(0x6a9_0000 + who as u64);
    let keys: Vec<String> = (0..32).map(|i| format!("gap:{who}:{i}")).collect();
    let lists: Vec<String> = (0..3).map(|i| format!("gap:{who}:list{i}")).collect();
    let mut model: HashMap<String, String> = HashMap::new();
    let mut queues: HashMap<String, VecDeque<String>> = HashMap::new();
    let mut sent = 0usize;
    let mut seq = 0usize;
    let mut next_pause = rng.range(1, 6) as usize;
    let expect_mget = |model: &HashMap<String, String>, ks: &[String]| -> Resp {
        arr(ks
            .iter()
            .map(|k| model.get(k).map_or(Resp::NullBulk, |v| bulk(v)))
            .collect())
    };
    while sent < requests {
        let mut four: Vec<String> = (0..keys.len()).map(|i| keys[i].clone()).collect();
        rng.shuffle(&mut four);
        four.truncate(4);
        match rng.below(4) {
            0 => {
                // MSET four keys (usually on four threads), then MGET them in another
                // order.
                let mut cmd = strings(&["MSET"]);
                for k in &four {
                    let v = format!("{who}-{seq}");
                    seq += 1;
                    cmd.push(k.clone());
                    cmd.push(v.clone());
                    model.insert(k.clone(), v);
                }
                let r = gap_request(c, who, &mut sent, &cmd);
                assert_eq!(r, Resp::ok(), "client {who}: `{}`", cmd.join(" "));
                rng.shuffle(&mut four);
                checked_mget(c, who, &mut sent, &four, expect_mget(&model, &four));
            }
            1 => {
                checked_mget(c, who, &mut sent, &four, expect_mget(&model, &four));
            }
            2 => {
                let k = four[0].clone();
                let v = format!("{who}-{seq}");
                seq += 1;
                let cmd = vec!["SET".to_string(), k.clone(), v.clone()];
                assert_eq!(gap_request(c, who, &mut sent, &cmd), Resp::ok());
                model.insert(k.clone(), v.clone());
                let cmd = vec!["GET".to_string(), k.clone()];
                assert_eq!(
                    gap_request(c, who, &mut sent, &cmd),
                    bulk(&v),
                    "client {who}: GET {k} right after SET"
                );
            }
            _ => {
                // RPUSH one or two elements, LPOP one: the lists grow slowly.
                let l = lists[rng.index(lists.len())].clone();
                let q = queues.entry(l.clone()).or_default();
                let mut cmd = vec!["RPUSH".to_string(), l.clone()];
                for _ in 0..rng.range(1, 2) {
                    let v = format!("{who}-{seq}");
                    seq += 1;
                    q.push_back(v.clone());
                    cmd.push(v);
                }
                let len = q.len() as i64;
                assert_eq!(
                    gap_request(c, who, &mut sent, &cmd),
                    Resp::Integer(len),
                    "client {who}: `{}`",
                    cmd.join(" ")
                );
                let head = q.pop_front().unwrap();
                let cmd = vec!["LPOP".to_string(), l.clone()];
                assert_eq!(
                    gap_request(c, who, &mut sent, &cmd),
                    bulk(&head),
                    "client {who}: LPOP {l}"
                );
            }
        }
        if sent >= next_pause {
            thread::sleep(Duration::from_millis(rng.below(3)));
            next_pause = sent + rng.range(1, 6) as usize;
        }
    }
    // The final state, read back.
    let mut cmd = strings(&["MGET"]);
    cmd.extend(keys.iter().cloned());
    assert_eq!(
        gap_request(c, who, &mut sent, &cmd),
        expect_mget(&model, &keys),
        "client {who}: all its keys at the end"
    );
    for l in &lists {
        let want: Vec<&str> = queues
            .get(l)
            .map(|q| q.iter().map(|s| s.as_str()).collect())
            .unwrap_or_default();
        let cmd = strings(&["LRANGE", l, "0", "-1"]);
        assert_eq!(
            gap_request(c, who, &mut sent, &cmd),
            bulks(&want),
            "client {who}: {l} at the end"
        );
    }
}

/// 16 client threads against `--threads 8` (more server threads than this machine's
/// cores), each sending 3000 requests whose keys span the server's threads (MSET/MGET
/// of four keys, SET then GET, RPUSH then LPOP), one at a time, with a pause of 0 to
/// 2 ms every few requests so that server threads keep going to sleep and must be woken
/// by the next cross-thread request. Every reply must arrive (10 s read timeout) and be
/// right. (With `KITE_BIN=redis-server`, `--threads` is not passed.)
#[test]
fn cross_thread_requests_with_idle_gaps_threads8() {
    const CLIENTS: usize = 16;
    const REQUESTS: usize = 3000;
    let mut s = KiteServer::start(&[], 8);
    thread::scope(|scope| {
        for who in 0..CLIENTS {
            let mut c = s.client();
            scope.spawn(move || gap_client(&mut c, who, REQUESTS));
        }
    });
    s.assert_alive();
}
