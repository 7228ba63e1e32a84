//! Scripting compared with a real redis-server, reply by reply: EVAL and its variants,
//! SCRIPT, FUNCTION and FCALL, the conversions between Lua values and replies, error
//! texts, keyspace events and blocked clients woken by scripts, and the bundled Lua
//! libraries. Each scenario runs on Kite with `--threads 1` and `--threads 4`, with a
//! RESP2 client and with a RESP3 (HELLO 3) client, and on redis-server with a client of
//! the same protocol; the two recordings must be equal.
//!
//! The reference is Debian's redis-server 7.0.15 while Kite follows Redis 7.2. The one
//! difference between them that this suite tolerates is how doubles are written as text
//! (7.0 prints 17 significant digits, 7.2 the shortest text that reads back the same):
//! the steps that show it are compared with `Check::SameDouble`, which accepts two texts
//! that parse to the same double, and nothing else.
//!
//! Run: `cargo test --release --test scripting`.

#[macro_use]
mod common;

use common::*;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Recording and comparing
// ---------------------------------------------------------------------------

/// How one step's replies are compared.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Check {
    /// Equal replies.
    Exact,
    /// Equal once arrays, maps and sets are sorted at every depth (Lua table order and
    /// Redis dictionary order are not part of the contract).
    Unordered,
    /// Equal, except that strings and RESP3 doubles that parse to the same double are
    /// equal: Redis 7.0 writes 0.1 as 0.10000000000000001, 7.2 (and Kite) as 0.1.
    SameDouble,
}

/// One recorded step: what was sent, what came back, how to compare it.
struct Entry {
    what: String,
    reply: Resp,
    check: Check,
}

/// A client that records every reply of a scenario.
struct Rec {
    port: u16,
    resp3: bool,
    c: Client,
    log: Vec<Entry>,
}

impl Rec {
    fn new(port: u16, resp3: bool) -> Rec {
        let c = connect(port, resp3);
        Rec {
            port,
            resp3,
            c,
            log: Vec::new(),
        }
    }

    /// A new connection speaking the same protocol.
    fn open(&self) -> Client {
        connect(self.port, self.resp3)
    }

    /// Runs a command and records its reply, compared exactly.
    fn run(&mut self, args: Args) -> Resp {
        self.check(args, Check::Exact)
    }

    fn check(&mut self, args: Args, check: Check) -> Resp {
        let reply = self.c.cmd(&args);
        self.log.push(Entry {
            what: fmt_cmd(&args),
            reply: reply.clone(),
            check,
        });
        reply
    }

    /// Runs a command and records its reply under `what` instead of the command text
    /// (for commands whose arguments differ between the servers, like DUMP payloads).
    fn run_as(&mut self, what: &str, args: Args) -> Resp {
        let reply = self.c.cmd(&args);
        self.note(what, reply.clone());
        reply
    }

    /// Runs a command without recording it (set-up whose reply may differ, e.g. CONFIG).
    fn quiet(&mut self, args: Args) -> Resp {
        self.c.cmd(&args)
    }

    /// Records a reply obtained some other way (another connection, a pushed message).
    fn note(&mut self, what: &str, reply: Resp) {
        self.log.push(Entry {
            what: what.to_string(),
            reply,
            check: Check::Exact,
        });
    }

    /// EVAL body numkeys keys... argv..., recorded exactly.
    fn eval(&mut self, body: &str, keys: &[&str], argv: &[&str]) -> Resp {
        self.eval_as(Check::Exact, body, keys, argv)
    }

    fn eval_as(&mut self, check: Check, body: &str, keys: &[&str], argv: &[&str]) -> Resp {
        let mut a = args!["EVAL", body, keys.len()];
        a.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
        a.extend(argv.iter().map(|v| v.as_bytes().to_vec()));
        self.check(a, check)
    }

    /// Empties the keyspace, the script cache and the function libraries.
    fn reset(&mut self) {
        for cmd in [
            args!["FLUSHALL"],
            args!["SCRIPT", "FLUSH"],
            args!["FUNCTION", "FLUSH"],
            args!["CONFIG", "SET", "notify-keyspace-events", ""],
        ] {
            let r = self.c.cmd(&cmd);
            assert_eq!(r, Resp::ok(), "{} on port {}", fmt_cmd(&cmd), self.port);
        }
    }
}

fn connect(port: u16, resp3: bool) -> Client {
    let mut c = Client::connect(port);
    if resp3 {
        let r = c.cmd(&["HELLO", "3"]);
        assert!(!r.is_error(), "HELLO 3 failed on port {port}: {r}");
    }
    c
}

type Scenario = fn(&mut Rec);

/// Runs a scenario on a fresh connection of a server and returns its recording.
fn record(port: u16, resp3: bool, scenario: Scenario) -> Vec<Entry> {
    let mut r = Rec::new(port, resp3);
    r.reset();
    scenario(&mut r);
    r.log
}

/// Every array, map and set sorted at every depth.
fn normalize(r: &Resp) -> Resp {
    fn sorted(mut v: Vec<Resp>) -> Vec<Resp> {
        v.sort_by_key(|x| x.encode());
        v
    }
    match r {
        Resp::Array(v) => Resp::Array(sorted(v.iter().map(normalize).collect())),
        Resp::Set(v) => Resp::Set(sorted(v.iter().map(normalize).collect())),
        Resp::Push(v) => Resp::Push(sorted(v.iter().map(normalize).collect())),
        Resp::Map(m) => {
            let mut m: Vec<(Resp, Resp)> = m
                .iter()
                .map(|(k, v)| (normalize(k), normalize(v)))
                .collect();
            m.sort_by_key(|(k, _)| k.encode());
            Resp::Map(m)
        }
        other => other.clone(),
    }
}

fn parse_f64(b: &[u8]) -> Option<f64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

fn same_double(a: &Resp, b: &Resp) -> bool {
    let same_text = |x: &[u8], y: &[u8]| {
        x == y || matches!((parse_f64(x), parse_f64(y)), (Some(p), Some(q)) if p == q)
    };
    match (a, b) {
        (Resp::Bulk(x), Resp::Bulk(y)) => same_text(x, y),
        (Resp::Double(x), Resp::Double(y)) => same_text(x.as_bytes(), y.as_bytes()),
        (Resp::Array(x), Resp::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_double(p, q))
        }
        _ => a == b,
    }
}

fn matches(check: Check, kite: &Resp, redis: &Resp) -> bool {
    match check {
        Check::Exact => kite == redis,
        Check::Unordered => normalize(kite) == normalize(redis),
        Check::SameDouble => same_double(kite, redis),
    }
}

/// Compares two recordings of one scenario; differences are appended to `diffs`.
fn compare(label: &str, kite: &[Entry], redis: &[Entry], diffs: &mut Vec<String>) {
    for (i, (k, r)) in kite.iter().zip(redis).enumerate() {
        if k.what != r.what {
            diffs.push(format!(
                "[{label}] step {i}: the scenarios diverged: kite ran `{}`, redis `{}`",
                k.what, r.what
            ));
            return;
        }
        if !matches(r.check, &k.reply, &r.reply) {
            diffs.push(format!(
                "[{label}] {}\n      kite:  {}\n      redis: {}",
                k.what, k.reply, r.reply
            ));
        }
    }
    if kite.len() != redis.len() {
        diffs.push(format!(
            "[{label}] kite recorded {} steps, redis {}",
            kite.len(),
            redis.len()
        ));
    }
}

/// Runs every scenario on Kite (`--threads threads`) and on redis-server, with RESP2 and
/// RESP3 clients; returns the differing replies and the number of steps compared.
fn diff_against_redis(threads: usize, scenarios: &[(&str, Scenario)]) -> (Vec<String>, usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut diffs = Vec::new();
    let mut steps = 0;
    for resp3 in [false, true] {
        for (name, scenario) in scenarios {
            let label = format!(
                "{name}, --threads {threads}, {}",
                if resp3 { "RESP3" } else { "RESP2" }
            );
            let want = record(redis.port, resp3, *scenario);
            let got = record(kite.port, resp3, *scenario);
            steps += want.len();
            compare(&label, &got, &want, &mut diffs);
        }
    }
    (diffs, steps)
}

/// Panics with the list of differing replies, if any.
fn assert_no_diffs(diffs: &[String], steps: usize) {
    assert!(steps > 0);
    assert!(
        diffs.is_empty(),
        "{} of {steps} replies differ between Kite and redis-server:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

fn run_against_redis(threads: usize, scenarios: &[(&str, Scenario)]) {
    let (diffs, steps) = diff_against_redis(threads, scenarios);
    assert_no_diffs(&diffs, steps);
}

// ---------------------------------------------------------------------------
// Keys on chosen shards
// ---------------------------------------------------------------------------

/// Four keys named `<prefix><n>` that live on shards 0, 1, 2 and 3 of a 4-thread Kite.
fn spread_keys(prefix: &str) -> [String; 4] {
    let mut found: [Option<String>; 4] = [None, None, None, None];
    let mut n = 0;
    while found.iter().any(Option::is_none) {
        let key = format!("{prefix}{n}");
        let s = shard_of(&key, 4);
        if found[s].is_none() {
            found[s] = Some(key);
        }
        n += 1;
    }
    found.map(|k| k.expect("found"))
}

/// Whether a 2-thread Kite answers BUSY to `c` for a key of either shard: the shard whose
/// thread runs a busy script refuses, the other goes on serving (a script is atomic for
/// its own shard only).
fn busy_for(c: &mut Client) -> bool {
    ["busyprobe0", "busyprobe1", "busyprobe2", "busyprobe3"]
        .iter()
        .any(|k| {
            c.cmd(&["GET", k])
                .error_text()
                .is_some_and(|e| e.starts_with("BUSY "))
        })
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn info_field(c: &mut Client, section: &str, field: &str) -> i64 {
    let r = c.cmd(&["INFO", section]);
    let text = r.as_string().unwrap_or_else(|| panic!("INFO reply: {r}"));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no {field}: {text}"))
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

/// Lua values returned by a script, written as replies.
fn lua_to_reply(r: &mut Rec) {
    for body in [
        "return 1",
        "return -7",
        "return 3.99",
        "return -3.7",
        "return 0.5",
        "return 2^53",
        "return 1e30",
        "return 'hello'",
        "return ''",
        "return true",
        "return false",
        "return nil",
        "return {1, 2, 3.7, 'x', true, false, 'after false'}",
        "return {1, nil, 3}",
        "return {}",
        "return {1, {2, {3, {'deep'}}}, 'end'}",
        "return {ok='FINE'}",
        "return {ok='a\\r\\nb'}",
        "return {err='MYCODE something bad'}",
        "return {err='nocode'}",
        "return redis.status_reply('DONE')",
        "return redis.error_reply('MY oops')",
        "return redis.error_reply('-MY2 with a dash')",
        "return redis.error_reply('nocode')",
        "return {1, redis.status_reply('S'), redis.error_reply('E inner'), 'last'}",
        // Booleans follow the script's protocol (redis.setresp) and the client's.
        "redis.setresp(3); return true",
        "redis.setresp(3); return false",
        "redis.setresp(3); return {true, false, 1}",
        "redis.setresp(3); redis.setresp(2); return false",
        "return {true, 1}",
        // RESP3 types built from tables.
        "return {map={a=1}}",
        "return {map={a=1, b='two', c={1, 2}}}",
        "return {map={}}",
        "return {set={x=true}}",
        "return {set={x=true, y=true, z=true}}",
        "return {set={}}",
        "return {double=3.5}",
        "return {double=-0.25}",
        "return {double=3}",
        "return {double=1/0}",
        "return {big_number='123456789012345678901234567890'}",
        "return {verbatim_string={format='txt', string='hello'}}",
        "redis.setresp(3); return {map={k={double=1.5}}, set={}}",
        "return {1, {map={x='y'}}, {set={s=true}}}",
    ] {
        let check = if body.contains("b='two'") || body.contains("y=true") {
            Check::Unordered
        } else {
            Check::Exact
        };
        r.eval_as(check, body, &[], &[]);
    }
}

/// Replies of commands called from Lua, read as Lua values.
fn reply_to_lua(r: &mut Rec) {
    r.run(args!["SET", "s", "str"]);
    r.run(args!["SET", "n", "41"]);
    r.run(args!["RPUSH", "l", "a", "b", "c"]);
    r.run(args!["HSET", "h", "f1", "v1", "f2", "v2"]);
    r.run(args!["ZADD", "z", "1.5", "m", "2", "m2"]);
    r.run(args!["SADD", "st", "x"]);
    let cases: &[(&str, &[&str])] = &[
        ("return redis.call('get', KEYS[1])", &["s"]),
        ("return redis.call('get', 'nokey') == false", &[]),
        ("return type(redis.call('get', 'nokey'))", &[]),
        ("return redis.call('incr', KEYS[1])", &["n"]),
        ("return type(redis.call('incr', KEYS[1]))", &["n"]),
        (
            "local r = redis.call('set', KEYS[1], 'v'); return {type(r), r.ok}",
            &["t"],
        ),
        ("return redis.call('set', KEYS[1], 'v')", &["t"]),
        ("return redis.call('ping')", &[]),
        ("return redis.call('type', KEYS[1])", &["l"]),
        ("return redis.call('lrange', KEYS[1], 0, -1)", &["l"]),
        ("return redis.call('hgetall', KEYS[1])", &["h"]),
        ("return redis.call('hget', KEYS[1], 'nofield')", &["h"]),
        ("return redis.call('zrange', KEYS[1], 0, -1, 'withscores')", &["z"]),
        ("return redis.call('zscore', KEYS[1], 'm')", &["z"]),
        ("return redis.call('echo', 'hi')", &[]),
        ("redis.setresp(3); return redis.call('hgetall', KEYS[1])", &["h"]),
        (
            "redis.setresp(3); local r = redis.call('hgetall', KEYS[1]); return {type(r.map), r.map.f1, r.map.f2}",
            &["h"],
        ),
        (
            "redis.setresp(3); local r = redis.call('zscore', KEYS[1], 'm'); return {type(r), r.double * 2}",
            &["z"],
        ),
        ("redis.setresp(3); return redis.call('zscore', KEYS[1], 'm')", &["z"]),
        ("redis.setresp(3); return redis.call('zscore', KEYS[1], 'm2')", &["z"]),
        (
            "redis.setresp(3); return redis.call('zscore', KEYS[1], 'nomember')",
            &["z"],
        ),
        (
            "redis.setresp(3); return redis.call('zrange', KEYS[1], 0, -1, 'withscores')",
            &["z"],
        ),
        ("redis.setresp(3); return type(redis.call('get', 'nokey'))", &[]),
        ("redis.setresp(3); return redis.call('smembers', KEYS[1])", &["st"]),
        (
            "redis.setresp(3); local r = redis.call('smembers', KEYS[1]); return {type(r.set), r.set.x}",
            &["st"],
        ),
        ("redis.setresp(3); return redis.call('set', KEYS[1], 'v')", &["t"]),
        ("local r = redis.pcall('incr', KEYS[1]); return {type(r), r.err}", &["s"]),
        ("return redis.pcall('incr', KEYS[1])", &["s"]),
        ("return redis.pcall('nosuchcommand')", &[]),
        (
            "local ok, e = pcall(redis.call, 'incr', KEYS[1]); return {tostring(ok), type(e), e.err}",
            &["s"],
        ),
        (
            "local ok, e = pcall(function() return redis.call('incr', KEYS[1]) end); return {tostring(ok), type(e), e.err}",
            &["s"],
        ),
        ("local ok, e = pcall(redis.call, 'incr', KEYS[1]); return e", &["s"]),
    ];
    for (body, keys) in cases {
        let check = if body.starts_with("redis.setresp(3); return redis.call('hgetall'") {
            Check::Unordered
        } else {
            Check::Exact
        };
        r.eval_as(check, body, keys, &[]);
    }
}

/// Lua numbers passed as command arguments. Only these steps tolerate the 7.0/7.2
/// difference in how doubles become text (see the top of the file).
/// `redis.call` with many arguments, numbers among strings, and empty strings, as
/// against Redis (each argument is a slice of one reused buffer).
fn many_call_arguments(r: &mut Rec) {
    let argv: Vec<String> = (0..40)
        .map(|i| {
            if i % 7 == 0 {
                String::new()
            } else {
                format!("v{i}")
            }
        })
        .collect();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    r.eval(
        "redis.call('del', KEYS[1]); \
         redis.call('rpush', KEYS[1], unpack(ARGV)); \
         redis.call('rpush', KEYS[1], 1, 2.5, 'x', '', -3, 1e3, 'y', 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17); \
         return redis.call('lrange', KEYS[1], 0, -1)",
        &["many:list"],
        &argv,
    );
    r.eval(
        "return redis.call('mset', 'many:{a}1', 1, 'many:{a}2', '', 'many:{a}3', 3.5)",
        &["many:{a}1"],
        &[],
    );
    r.run(args!["MGET", "many:{a}1", "many:{a}2", "many:{a}3"]);
}

fn numbers_as_arguments(r: &mut Rec) {
    let d = Check::SameDouble;
    r.eval_as(
        d,
        "redis.call('set', KEYS[1], 0.1); return redis.call('get', KEYS[1])",
        &["f"],
        &[],
    );
    r.eval(
        "redis.call('set', KEYS[1], 5); return redis.call('get', KEYS[1])",
        &["f"],
        &[],
    );
    r.eval(
        "redis.call('set', KEYS[1], 3.0); return redis.call('get', KEYS[1])",
        &["f"],
        &[],
    );
    r.eval(
        "redis.call('set', KEYS[1], -2.5); return redis.call('get', KEYS[1])",
        &["f"],
        &[],
    );
    r.eval_as(
        d,
        "redis.call('set', KEYS[1], 1e20); return redis.call('get', KEYS[1])",
        &["f"],
        &[],
    );
    r.eval(
        "redis.call('set', KEYS[1], 0.1); return tonumber(redis.call('get', KEYS[1])) == 0.1",
        &["f"],
        &[],
    );
    r.eval_as(
        d,
        "redis.call('zadd', KEYS[1], 2^53, 'm'); return redis.call('zscore', KEYS[1], 'm')",
        &["zz"],
        &[],
    );
    r.eval_as(
        d,
        "redis.setresp(3); redis.call('zadd', KEYS[1], 2^53, 'm'); return redis.call('zscore', KEYS[1], 'm')",
        &["zz"],
        &[],
    );
    r.eval(
        "redis.call('zadd', KEYS[1], 2^53, 'm'); return tonumber(redis.call('zscore', KEYS[1], 'm')) == 2^53",
        &["zz"],
        &[],
    );
    r.eval(
        "redis.setresp(3); redis.call('zadd', KEYS[1], 2^53, 'm'); return redis.call('zscore', KEYS[1], 'm').double == 2^53",
        &["zz"],
        &[],
    );
    r.check(args!["ZSCORE", "zz", "m"], d);
    r.eval(
        "redis.call('incrby', KEYS[1], 2^40); return redis.call('get', KEYS[1])",
        &["i"],
        &[],
    );
    r.eval_as(
        d,
        "return redis.call('incrbyfloat', KEYS[1], 0.5)",
        &["fl"],
        &[],
    );
    r.eval_as(
        d,
        "return redis.call('incrbyfloat', KEYS[1], 0.1)",
        &["fl"],
        &[],
    );
}

/// KEYS and ARGV, and strings with NUL and other bytes.
fn keys_argv_binary(r: &mut Rec) {
    r.eval(
        "return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], #KEYS, #ARGV}",
        &["ka", "kb"],
        &["x", "y"],
    );
    r.eval("return {#KEYS, #ARGV}", &[], &[]);
    r.eval("return KEYS", &["a", "b", "c"], &[]);
    r.eval("return ARGV", &[], &["1", "2", "3"]);
    r.eval("return {KEYS[1], ARGV[1]}", &[], &[]);
    let bin: &[u8] = b"a\x00b\xff\r\nz";
    r.run(args!["EVAL", "return ARGV[1]", 0, bin]);
    r.run(args!["EVAL", "return string.len(ARGV[1])", 0, bin]);
    r.run(args![
        "EVAL",
        "return {string.byte(ARGV[1], 1, -1)}",
        0,
        bin
    ]);
    r.run(args![
        "EVAL",
        "redis.call('set', KEYS[1], ARGV[1]); return redis.call('get', KEYS[1])",
        1,
        b"bin\x00key".as_slice(),
        bin
    ]);
    r.run(args!["EXISTS", b"bin\x00key".as_slice()]);
    r.run(args!["GET", b"bin\x00key".as_slice()]);
    r.eval("return 'x\\0y'", &[], &[]);
    r.run(args!["EVAL", b"return '\x00z\xfe'".as_slice(), 0]);
    r.run(args!["EVAL", "return redis.sha1hex(ARGV[1])", 0, bin]);
    r.eval("return redis.sha1hex('')", &[], &[]);
    r.eval("return redis.sha1hex(1.5)", &[], &[]);
    r.run(args![
        "EVAL",
        "return KEYS[1] .. ARGV[1]",
        1,
        b"\x00".as_slice(),
        b"\x01".as_slice()
    ]);
}

/// Errors, with Redis's exact text and the `script: <sha>, on @user_script:<line>.` suffix.
fn error_texts(r: &mut Rec) {
    r.run(args!["SET", "s", "str"]);
    // numkeys is parsed strictly; FCALL says so in its own words; SELECT and the reply
    // helpers check their arguments as Redis does.
    r.run(args!["EVAL", "return 1", "+1", "a"]);
    r.run(args!["EVAL", "return 1", "01", "a"]);
    r.run(args!["FCALL", "nosuchfunction", "x"]);
    for body in [
        "return redis.call('select', '-1')",
        "return redis.call('select', '+1')",
        "return redis.error_reply(1)",
        "return redis.status_reply()",
        "return {redis.status_reply('fine'), redis.error_reply(2)}",
    ] {
        r.eval(body, &[], &[]);
    }
    for body in [
        "return (",
        "local x = = 1",
        "return 1 +",
        "error('boom')",
        "local a = 1\nlocal b = 2\nerror('on line three')",
        "return nosuchglobal",
        "x = 5",
        "local a = nil\nreturn a.b",
        "return redis.call('incr', KEYS[1])",
        "\n\nreturn redis.call('incr', KEYS[1])",
        "return redis.call('set', KEYS[1], {})",
        "return redis.call('set', KEYS[1], nil)",
        "return redis.call('set', KEYS[1], true)",
        "return redis.call()",
        "return redis.call('nosuchcommand', 'a')",
        "return redis.call('get')",
        "return redis.call('get', 'a', 'b')",
        "return redis.call('set', KEYS[1])",
        "return redis.call('subscribe', 'ch')",
        "return redis.call('eval', 'return 1', 0)",
        "return redis.call('multi')",
        "return redis.call('script', 'flush')",
        "return redis.pcall('get')",
        "redis.setresp(4)",
        "error({err='CUSTOM raised table'})",
        "error({err='nospace'})",
        "error()",
        "error(42)",
        "return redis.call('select', 99)",
        "print('x')",
        "redis.call = nil",
        "string.foo = 1",
        "return _G.undefined_thing",
        "local ok, e = pcall(error, 'caught'); return {tostring(ok), e}",
        "return type(os)",
        "return type(loadstring)",
        "return type(print)",
        "return type(dofile)",
        "return type(require)",
        "return type(setfenv)",
        "return type(debug)",
    ] {
        r.eval(body, &["s"], &[]);
    }
    // numkeys.
    r.run(args!["EVAL", "return 1", -1]);
    r.run(args!["EVAL", "return 1", 5, "a"]);
    r.run(args!["EVAL", "return 1", "abc"]);
    r.run(args!["EVAL", "return 1", "1.5", "a"]);
    r.run(args!["EVAL", "return 1"]);
    r.run(args!["EVAL"]);
    r.run(args![
        "EVALSHA",
        "ffffffffffffffffffffffffffffffffffffffff",
        -1
    ]);
    r.run(args!["FCALL", "nosuchfunction", -1]);
}

/// Shebang flags, EVAL_RO and read-only scripts.
fn shebang_and_read_only(r: &mut Rec) {
    r.eval("#!lua\nreturn redis.call('set', KEYS[1], 'v')", &["k"], &[]);
    r.eval(
        "#!lua flags=no-writes\nreturn redis.call('set', KEYS[1], 'v')",
        &["k"],
        &[],
    );
    r.eval(
        "#!lua flags=no-writes\nreturn redis.call('get', KEYS[1])",
        &["k"],
        &[],
    );
    r.eval("#!lua flags=no-writes,allow-oom\nreturn 1", &[], &[]);
    r.eval("#!lua flags=\nreturn 1", &[], &[]);
    r.eval("#!lua flags=bogus\nreturn 1", &[], &[]);
    r.eval("#!lua flags=no-writes,bogus\nreturn 1", &[], &[]);
    r.eval("#!python\nreturn 1", &[], &[]);
    r.eval("#!lua", &[], &[]);
    r.eval("#!lua flags=no-writes", &[], &[]);
    r.eval("#!lua foo=bar\nreturn 1", &[], &[]);
    r.eval("#!lua\nreturn x", &[], &[]);
    r.eval("#!lua\n\nerror('third line')", &[], &[]);
    r.eval("#!lua\nreturn redis.call('get', 'undeclared')", &[], &[]);
    let ro = |body: &str, keys: &[&str]| {
        let mut a = args!["EVAL_RO", body, keys.len()];
        a.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
        a
    };
    r.run(ro("return redis.call('set', KEYS[1], 'x')", &["k"]));
    r.run(ro("return redis.call('get', KEYS[1])", &["k"]));
    r.run(ro("return redis.pcall('del', KEYS[1])", &["k"]));
    r.run(ro("return redis.call('publish', 'ch', 'm')", &[]));
    r.eval(
        "#!lua flags=no-writes\nreturn redis.call('publish', 'ch', 'm')",
        &[],
        &[],
    );
    r.run(ro("#!lua\nreturn 1", &[]));
    r.run(ro("#!lua flags=no-writes\nreturn 1", &[]));
    r.run(args!["GET", "k"]);
    let sha = r.run(args![
        "SCRIPT",
        "LOAD",
        "return redis.call('set', KEYS[1], 'y')"
    ]);
    if let Some(sha) = sha.as_bytes().map(|b| b.to_vec()) {
        r.run(args!["EVALSHA_RO", &sha, 1, "k"]);
        r.run(args!["EVALSHA", &sha, 1, "k"]);
    }
    let sha = r.run(args!["SCRIPT", "LOAD", "#!lua\nreturn 'flagged'"]);
    if let Some(sha) = sha.as_bytes().map(|b| b.to_vec()) {
        r.run(args!["EVALSHA_RO", &sha, 0]);
    }
}

/// EVALSHA and the SCRIPT subcommands; scripts inside MULTI.
fn evalsha_and_script(r: &mut Rec) {
    let sha = r.run(args!["SCRIPT", "LOAD", "return 'loaded'"]);
    let sha = sha.as_string().unwrap_or_default();
    r.run(args!["EVALSHA", sha.as_str(), 0]);
    r.run(args!["EVALSHA", sha.to_uppercase(), 0]);
    r.run(args![
        "EVALSHA",
        "ffffffffffffffffffffffffffffffffffffffff",
        0
    ]);
    r.run(args!["EVALSHA", "short", 0]);
    r.run(args![
        "SCRIPT",
        "EXISTS",
        sha.as_str(),
        "ffffffffffffffffffffffffffffffffffffffff",
        sha.to_uppercase()
    ]);
    // EVAL caches its script too.
    r.eval("return 'via eval'", &[], &[]);
    let sha2 = r.eval("return redis.sha1hex(ARGV[1])", &[], &["return 'via eval'"]);
    let sha2 = sha2.as_string().unwrap_or_default();
    r.run(args!["SCRIPT", "EXISTS", sha2.as_str()]);
    r.run(args!["EVALSHA", sha2.as_str(), 0]);
    // A script that does not compile is not cached.
    r.run(args!["SCRIPT", "LOAD", "return ("]);
    let bad = r.eval("return redis.sha1hex(ARGV[1])", &[], &["return ("]);
    r.run(args!["SCRIPT", "EXISTS", bad.as_bytes().unwrap_or(b"x")]);
    r.run(args!["SCRIPT", "LOAD", "#!lua flags=bogus\nreturn 1"]);
    r.run(args!["SCRIPT", "FLUSH"]);
    r.run(args!["SCRIPT", "EXISTS", sha.as_str(), sha2.as_str()]);
    r.run(args!["EVALSHA", sha.as_str(), 0]);
    r.run(args!["SCRIPT", "FLUSH", "ASYNC"]);
    r.run(args!["SCRIPT", "FLUSH", "sync"]);
    r.run(args!["SCRIPT", "FLUSH", "bogus"]);
    r.run(args!["SCRIPT", "FLUSH", "SYNC", "ASYNC"]);
    r.run(args!["SCRIPT"]);
    r.run(args!["SCRIPT", "BOGUS"]);
    r.run(args!["SCRIPT", "LOAD"]);
    r.run(args!["SCRIPT", "EXISTS"]);
    r.run(args!["SCRIPT", "KILL"]);
    r.run(args!["FUNCTION", "KILL"]);
    // Inside MULTI.
    r.run(args!["MULTI"]);
    r.run(args!["EVAL", "return redis.call('incr', KEYS[1])", 1, "c"]);
    r.run(args!["EVAL", "return redis.call('incr', KEYS[1])", 1, "c"]);
    r.run(args!["EVAL", "return redis.call('nosuch')", 0]);
    r.run(args!["EXEC"]);
    r.run(args!["GET", "c"]);
}

const LIB1: &str = "#!lua name=lib1
redis.register_function('f_echo', function(keys, args) return {keys[1], args[1], #keys, #args} end)
redis.register_function{
  function_name='f_get',
  callback=function(keys) return redis.call('get', keys[1]) end,
  flags={'no-writes'},
  description='reads a key'}
redis.register_function('f_set', function(keys, args) return redis.call('set', keys[1], args[1]) end)
";

const LIB2: &str = "#!lua name=lib2
redis.register_function('f2', function() return 'two' end)";

const LIB3: &str = "#!lua name=lib3
redis.register_function{function_name='f_badwrite', callback=function(keys)
  return redis.call('set', keys[1], 'x')
end, flags={'no-writes'}}";

const LIB4: &str = "#!lua name=lib4
local function helper(x)
  error('helper failed: ' .. x)
end
redis.register_function('f_err', function(keys, args) return helper(args[1]) end)";

/// FUNCTION LOAD/LIST/DELETE/FLUSH/STATS and FCALL/FCALL_RO.
fn functions(r: &mut Rec) {
    let load = |code: &str| args!["FUNCTION", "LOAD", code];
    r.run(load("return 1"));
    r.run(load("#!python name=x\nreturn 1"));
    r.run(load(
        "#!lua\nredis.register_function('f', function() return 1 end)",
    ));
    r.run(load(
        "#!lua name=bad-name\nredis.register_function('f', function() return 1 end)",
    ));
    r.run(load(
        "#!lua name=x foo=bar\nredis.register_function('f', function() return 1 end)",
    ));
    r.run(load("#!lua name=empty\nlocal a = 1"));
    r.run(load("#!lua name=forever\nwhile true do end"));
    r.run(load("#!lua name=broken\nthis is not lua"));
    // A bad function name ('a-b') is left out: 7.0 reports it with the library-name text,
    // 7.2 (which Kite follows) with "Function names can only contain...".
    r.run(load(
        "#!lua name=rt\nredis.register_function{function_name='f', callback=function() end, flags={'bogus'}}",
    ));
    r.run(load(
        "#!lua name=rt\nredis.register_function('f', function() end)\nredis.register_function('f', function() end)",
    ));
    r.run(load("#!lua name=rt\nredis.register_function('f')"));
    r.run(load("#!lua name=rt\nreturn nosuchglobal"));
    r.run(load(LIB1));
    r.run(load(LIB1));
    r.run(args!["FUNCTION", "LOAD", "REPLACE", LIB1]);
    r.run(args!["FUNCTION", "LOAD", "BOGUS", LIB1]);
    r.run(load(
        "#!lua name=clash\nredis.register_function('f_echo', function() return 1 end)",
    ));
    r.run(load(LIB2));
    r.run(load(LIB3));
    r.run(load(LIB4));
    r.run(args!["FUNCTION", "LIST", "LIBRARYNAME", "lib2"]);
    r.run(args!["FUNCTION", "LIST", "LIBRARYNAME", "lib2", "WITHCODE"]);
    r.run(args!["FUNCTION", "LIST", "WITHCODE", "LIBRARYNAME", "lib3"]);
    r.run(args!["FUNCTION", "LIST", "LIBRARYNAME", "nomatch*"]);
    r.check(args!["FUNCTION", "LIST"], Check::Unordered);
    r.check(args!["FUNCTION", "LIST", "WITHCODE"], Check::Unordered);
    r.check(
        args!["FUNCTION", "LIST", "LIBRARYNAME", "lib*"],
        Check::Unordered,
    );
    r.run(args!["FUNCTION", "LIST", "BOGUS"]);
    r.run(args!["FUNCTION", "LIST", "LIBRARYNAME"]);
    r.run(args!["FCALL", "f_echo", 1, "k", "a"]);
    r.run(args!["FCALL", "f_echo", 0]);
    r.run(args!["FCALL", "f_set", 1, "k", "v"]);
    r.run(args!["FCALL", "f_get", 1, "k"]);
    r.run(args!["FCALL_RO", "f_get", 1, "k"]);
    r.run(args!["FCALL_RO", "f_set", 1, "k", "v2"]);
    r.run(args!["FCALL", "f_badwrite", 1, "k"]);
    r.run(args!["FCALL_RO", "f_badwrite", 1, "k"]);
    r.run(args!["FCALL", "f_err", 0, "why"]);
    r.run(args!["FCALL", "f2", 0]);
    r.run(args!["FCALL", "nosuch", 0]);
    r.run(args!["FCALL", "f_echo", -1]);
    r.run(args!["FCALL", "f_echo", 3, "a"]);
    r.run(args!["FCALL", "f_echo"]);
    r.run(args!["GET", "k"]);
    r.run(args!["FUNCTION", "STATS"]);
    r.eval(
        "return redis.register_function('x', function() end)",
        &[],
        &[],
    );
    r.run(args!["FUNCTION", "DELETE", "lib2"]);
    r.run(args!["FUNCTION", "DELETE", "lib2"]);
    r.run(args!["FCALL", "f2", 0]);
    r.run(args!["FUNCTION", "FLUSH", "bogus"]);
    r.run(args!["FUNCTION", "FLUSH"]);
    r.run(args!["FUNCTION", "LIST"]);
    r.run(args!["FCALL", "f_echo", 0]);
    r.run(args!["FUNCTION", "FLUSH", "ASYNC"]);
    r.run(args!["FUNCTION", "STATS"]);
}

/// FUNCTION DUMP, FLUSH, RESTORE: behaviour compared, not the payload bytes.
fn function_dump_restore(r: &mut Rec) {
    let lib_a = "#!lua name=liba\nredis.register_function('fa', function() return 'a1' end)";
    let lib_a2 = "#!lua name=liba\nredis.register_function('fa', function() return 'a2' end)";
    let lib_b = "#!lua name=libb\nredis.register_function('fb', function(k, a) return a[1] end)";
    r.run(args!["FUNCTION", "LOAD", lib_a]);
    r.run(args!["FUNCTION", "LOAD", lib_b]);
    let payload = r.quiet(args!["FUNCTION", "DUMP"]);
    let payload = payload.as_bytes().map(|b| b.to_vec());
    r.note(
        "FUNCTION DUMP gives a payload",
        Resp::Integer(payload.is_some() as i64),
    );
    let payload = payload.unwrap_or_default();
    let restore = |r: &mut Rec, payload: &[u8], what: &str, extra: &[&str]| {
        let mut a = args!["FUNCTION", "RESTORE", payload];
        a.extend(extra.iter().map(|x| x.as_bytes().to_vec()));
        r.run_as(&format!("FUNCTION RESTORE <{what}> {}", extra.join(" ")), a)
    };
    r.run(args!["FUNCTION", "FLUSH"]);
    r.run(args!["FCALL", "fa", 0]);
    restore(r, &payload, "payload", &[]);
    r.run(args!["FCALL", "fa", 0]);
    r.run(args!["FCALL", "fb", 0, "arg"]);
    r.run(args!["FUNCTION", "LIST", "LIBRARYNAME", "libb", "WITHCODE"]);
    restore(r, &payload, "payload", &["REPLACE"]);
    // Conflicts, with a payload of one library (with two, which one the error names
    // depends on Redis's dictionary order).
    r.run(args!["FUNCTION", "DELETE", "libb"]);
    let payload_a = r.quiet(args!["FUNCTION", "DUMP"]);
    let payload_a = payload_a.as_bytes().map(|b| b.to_vec()).unwrap_or_default();
    restore(r, &payload_a, "payload of liba", &[]);
    restore(r, &payload_a, "payload of liba", &["APPEND"]);
    restore(r, &payload_a, "payload of liba", &["REPLACE"]);
    r.run(args!["FCALL", "fb", 0, "arg"]);
    restore(r, &payload, "payload", &[]);
    r.run(args!["FUNCTION", "LIST", "LIBRARYNAME", "libb"]);
    r.run(args!["FUNCTION", "LOAD", "REPLACE", lib_a2]);
    r.run(args!["FCALL", "fa", 0]);
    restore(r, &payload, "payload", &["REPLACE"]);
    r.run(args!["FCALL", "fa", 0]);
    r.run(args!["FUNCTION", "LOAD", "REPLACE", lib_a2]);
    r.run(args![
        "FUNCTION",
        "LOAD",
        "#!lua name=libc\nredis.register_function('fc', function() return 'c' end)"
    ]);
    restore(r, &payload, "payload", &["FLUSH"]);
    r.run(args!["FCALL", "fa", 0]);
    r.run(args!["FCALL", "fc", 0]);
    restore(r, &payload, "payload", &["BOGUS"]);
    r.run(args!["FUNCTION", "RESTORE", "garbage"]);
    let mut corrupt = payload.clone();
    if let Some(b) = corrupt.get_mut(5) {
        *b ^= 0x20;
    }
    restore(r, &corrupt, "corrupted payload", &[]);
    r.run(args!["FUNCTION", "FLUSH"]);
    let empty = r.quiet(args!["FUNCTION", "DUMP"]);
    let empty = empty.as_bytes().map(|b| b.to_vec()).unwrap_or_default();
    restore(r, &empty, "empty payload", &[]);
    r.run(args!["FUNCTION", "LIST"]);
    restore(r, &payload, "payload", &[]);
    r.check(args!["FUNCTION", "LIST"], Check::Unordered);
}

/// Scripts whose keys live on several shards of a 4-thread Kite (on one thread, and on
/// Redis, the same steps are ordinary scripts).
fn keys_on_several_shards(r: &mut Rec) {
    let k = spread_keys("multi");
    let [k0, k1, k2, k3] = [k[0].as_str(), k[1].as_str(), k[2].as_str(), k[3].as_str()];
    // Declared keys on four shards.
    r.eval(
        "for i, k in ipairs(KEYS) do redis.call('set', k, ARGV[1] .. i) end
         local out = {}
         for i, k in ipairs(KEYS) do out[i] = redis.call('get', k) end
         return out",
        &[k0, k1, k2, k3],
        &["v"],
    );
    // An undeclared key on another shard, read before any write (twice: the second run
    // starts where the first ended up).
    for _ in 0..2 {
        r.eval(
            "local a = redis.call('get', KEYS[1])
             local b = redis.call('get', ARGV[1])
             redis.call('append', KEYS[1], '+')
             return {a, b, redis.call('get', KEYS[1])}",
            &[k0],
            &[k1],
        );
    }
    // An undeclared key on another shard, written after a write to the declared key.
    for _ in 0..2 {
        r.eval(
            "redis.call('incr', KEYS[1] .. ':n')
             redis.call('incr', ARGV[1] .. ':n')
             return {redis.call('get', KEYS[1] .. ':n'), redis.call('get', ARGV[1] .. ':n')}",
            &[k0],
            &[k2],
        );
    }
    r.run(args!["MGET", format!("{k0}:n"), format!("{k2}:n")]);
    // No declared keys at all.
    r.eval(
        "redis.call('set', ARGV[1], 1)
         redis.call('set', ARGV[2], 2)
         return redis.call('get', ARGV[1]) + redis.call('get', ARGV[2])",
        &[],
        &[k1, k3],
    );
    // A failing script keeps the writes it made before failing, on every shard.
    r.eval(
        "redis.call('set', KEYS[1], 'first')
         redis.call('set', ARGV[1], 'second')
         error('late failure')",
        &[k3],
        &[k2],
    );
    r.run(args!["GET", k3]);
    r.run(args!["GET", k2]);
    // Lists on two shards.
    r.eval(
        "redis.call('rpush', KEYS[1], 'a', 'b')
         redis.call('rpush', KEYS[2], redis.call('lpop', KEYS[1]))
         return {redis.call('lrange', KEYS[1], 0, -1), redis.call('lrange', KEYS[2], 0, -1)}",
        &["{list}x", "{other}y"],
        &[],
    );
    // SELECT inside a script, with keys on several shards.
    r.eval(
        "redis.call('select', 2)
         redis.call('set', KEYS[1], 'db2')
         redis.call('set', KEYS[2], 'db2')
         return {redis.call('get', KEYS[1]), redis.call('get', KEYS[2])}",
        &[k0, k1],
        &[],
    );
    r.run(args!["GET", k0]);
    r.run(args!["SELECT", 2]);
    r.run(args!["MGET", k0, k1]);
    r.run(args!["SELECT", 0]);
    r.run(args!["DBSIZE"]);
}

/// Keyspace events caused by a script, in the order its commands ran.
fn keyspace_events(r: &mut Rec) {
    let k = spread_keys("ev");
    let [k0, k1, k2] = [k[0].as_str(), k[1].as_str(), k[2].as_str()];
    r.quiet(args!["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
    let mut sub = Client::connect(r.port);
    sub.send(&["PSUBSCRIBE", "__key*__:*"]);
    r.note("psubscribe", sub.read());
    sub.send(&["SUBSCRIBE", "fence"]);
    r.note("subscribe", sub.read());
    let scripts: &[(&str, &[&str], &[&str])] = &[
        (
            "redis.call('set', KEYS[1], 'v')
             redis.call('lpush', KEYS[2], 'a')
             redis.call('del', KEYS[1])
             redis.call('expire', KEYS[2], 100)
             return 1",
            &[k0, k1],
            &[],
        ),
        (
            "redis.call('incr', KEYS[1])
             redis.call('incr', ARGV[1])
             redis.call('incr', KEYS[1])
             return 2",
            &[k0],
            &[k2],
        ),
        (
            "redis.call('hset', ARGV[1], 'f', 'v')
             redis.call('sadd', KEYS[1], 'm')
             return 3",
            &[k1],
            &[k2],
        ),
        (
            "redis.call('set', KEYS[1], 'x'); error('after the write')",
            &[k0],
            &[],
        ),
    ];
    for (body, keys, argv) in scripts {
        let mut a = args!["EVAL", *body, keys.len()];
        a.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
        a.extend(argv.iter().map(|v| v.as_bytes().to_vec()));
        r.run(a);
        r.quiet(args!["PUBLISH", "fence", "x"]);
        loop {
            let m = sub.read();
            let fence = m.as_array().and_then(|v| v.get(1)) == Some(&Resp::bulk("fence"));
            r.note("event", m);
            if fence {
                break;
            }
        }
    }
    r.quiet(args!["CONFIG", "SET", "notify-keyspace-events", ""]);
}

/// Blocked clients woken by a script's writes, served once the script has ended.
fn blocked_clients(r: &mut Rec) {
    let k = spread_keys("bl");
    let [k0, k1, k2, k3] = [k[0].as_str(), k[1].as_str(), k[2].as_str(), k[3].as_str()];
    let block = |r: &mut Rec, cmd: &[&str]| -> Client {
        let mut b = r.open();
        let before = info_field(&mut r.c, "clients", "blocked_clients");
        b.send(cmd);
        let port = r.port;
        let mut admin = Client::connect(port);
        wait_until("a blocked client", || {
            info_field(&mut admin, "clients", "blocked_clients") > before
        });
        b
    };
    // The script's pushes are all done before the waiting client takes one.
    let mut b = block(r, &["BLPOP", k0, "0"]);
    r.eval(
        "redis.call('lpush', KEYS[1], 'a')
         redis.call('lpush', KEYS[1], 'b')
         return redis.call('llen', KEYS[1])",
        &[k0],
        &[],
    );
    r.note("BLPOP after the script", b.read());
    r.run(args!["LRANGE", k0, 0, -1]);
    // The list a script pushes to is on another shard than its declared key, and the
    // push comes after a write.
    let mut b = block(r, &["BLPOP", k1, "0"]);
    r.eval(
        "redis.call('set', KEYS[1], 'x')
         redis.call('rpush', ARGV[1], 'e1', 'e2')
         return redis.call('llen', ARGV[1])",
        &[k2],
        &[k1],
    );
    r.note("BLPOP after the script", b.read());
    r.run(args!["LRANGE", k1, 0, -1]);
    // A script that pushes then pops leaves nothing: the client keeps waiting and gets
    // the next push.
    let mut b = block(r, &["BLPOP", k3, "0"]);
    r.eval(
        "redis.call('rpush', KEYS[1], 'gone')
         return redis.call('lpop', KEYS[1])",
        &[k3],
        &[],
    );
    r.run(args!["RPUSH", k3, "later"]);
    r.note("BLPOP after the script", b.read());
    // Declared keys on two shards (the global path).
    let mut b = block(r, &["BLPOP", k3, "0"]);
    r.eval(
        "redis.call('rpush', KEYS[1], 'g1')
         redis.call('rpush', KEYS[2], 'g2', 'g3')
         return {redis.call('llen', KEYS[1]), redis.call('llen', KEYS[2])}",
        &[k0, k3],
        &[],
    );
    r.note("BLPOP after the script", b.read());
    r.run(args!["LRANGE", k3, 0, -1]);
    // BLMOVE woken by a script, element moved to a list on another shard.
    r.run(args!["DEL", k2]);
    let mut b = block(r, &["BLMOVE", k2, k1, "LEFT", "RIGHT", "0"]);
    r.eval(
        "return redis.call('rpush', KEYS[1], 'm1', 'm2')",
        &[k2],
        &[],
    );
    r.note("BLMOVE after the script", b.read());
    r.run(args!["LRANGE", k1, 0, -1]);
    r.run(args!["LRANGE", k2, 0, -1]);
}

/// The bundled libraries: cjson, cmsgpack, bit, struct.
fn lua_libraries(r: &mut Rec) {
    let cases: &[(&str, &[&[u8]])] = &[
        ("return cjson.encode({1, 2, 3})", &[]),
        ("return cjson.encode({a=1})", &[]),
        ("return cjson.encode('x\"y\\n')", &[]),
        ("return cjson.encode(1.5)", &[]),
        ("return cjson.encode(0.1)", &[]),
        ("return cjson.encode({})", &[]),
        ("return cjson.encode({1, nil, 3})", &[]),
        ("return cjson.encode({true, false, cjson.null})", &[]),
        ("return cjson.encode({a={b={c={1}}}})", &[]),
        ("return cjson.encode(cjson.decode(ARGV[1]))", &[b"[1,\"a\",true,null]"]),
        (
            "local t = cjson.decode(ARGV[1]); return {t.a, t.b[2], tostring(t.c), type(t.d)}",
            &[b"{\"a\":\"x\",\"b\":[1,2],\"c\":false,\"d\":null}"],
        ),
        ("return cjson.decode(ARGV[1])", &[b"12345678901234"]),
        ("return cjson.decode(ARGV[1])", &[b"\"\\u00e9\\n\""]),
        ("return cjson.decode('{')", &[]),
        ("return cjson.decode('[1,2')", &[]),
        ("return cjson.encode(function() end)", &[]),
        ("return type(cjson.null)", &[]),
        ("return cmsgpack.pack(1, 'a', {1, 2}, {x=1})", &[]),
        ("return cmsgpack.pack(2^40, -1, -200, 3.5, true, false, 'abc')", &[]),
        ("return cmsgpack.pack(string.rep('x', 40))", &[]),
        ("return {cmsgpack.unpack(cmsgpack.pack(1, 'two', {3, 4}))}", &[]),
        ("return cmsgpack.unpack(ARGV[1])", &[b"\x93\x01\x02\x03"]),
        ("local t = cmsgpack.unpack(cmsgpack.pack({a='b'})); return t.a", &[]),
        (
            "local a, b = cmsgpack.unpack(ARGV[1]); return {a, b}",
            &[b"\xcd\x01\x00\xa2hi"],
        ),
        ("return cmsgpack.unpack(cmsgpack.pack(-2^40)) == -2^40", &[]),
        ("return cmsgpack.unpack(cmsgpack.pack(0.25)) == 0.25", &[]),
        (
            "return {bit.band(0xff, 0x0f), bit.bor(1, 2), bit.bxor(5, 3), bit.lshift(1, 10), bit.rshift(256, 4), bit.arshift(-256, 4), bit.bnot(0), bit.tobit(2^32 + 5), bit.rol(1, 33), bit.ror(1, 1), bit.bswap(1)}",
            &[],
        ),
        ("return {bit.tohex(255), bit.tohex(-1, 4), bit.tohex(255, -2)}", &[]),
        ("return bit.band('x')", &[]),
        ("return struct.pack('>I2', 258)", &[]),
        ("return {struct.unpack('<i4', ARGV[1])}", &[b"\x01\x00\x00\x00"]),
        ("return struct.pack('BBc3', 1, 2, 'abc')", &[]),
        ("return struct.size('>iH')", &[]),
        ("return {struct.unpack('>d', struct.pack('>d', 1.5))}", &[]),
        ("return {struct.unpack('>i8', struct.pack('>i8', -2^40))}", &[]),
        ("return struct.pack('<q', 1)", &[]),
        ("return struct.pack('z', 'zero')", &[]),
        ("return struct.unpack('>I4', 'ab')", &[]),
        ("return struct.pack('y', 1)", &[]),
    ];
    for (body, argv) in cases {
        let mut a = args!["EVAL", *body, 0];
        a.extend(argv.iter().map(|v| v.to_vec()));
        r.run(a);
    }
}

const CORE: &[(&str, Scenario)] = &[
    ("lua_to_reply", lua_to_reply),
    ("reply_to_lua", reply_to_lua),
    ("numbers_as_arguments", numbers_as_arguments),
    ("many_call_arguments", many_call_arguments),
    ("keys_argv_binary", keys_argv_binary),
    ("error_texts", error_texts),
    ("shebang_and_read_only", shebang_and_read_only),
    ("evalsha_and_script", evalsha_and_script),
    ("functions", functions),
    ("function_dump_restore", function_dump_restore),
    ("keys_on_several_shards", keys_on_several_shards),
    ("keyspace_events", keyspace_events),
    ("blocked_clients", blocked_clients),
];

/// Past maxmemory: a script without a shebang may read and delete but its first
/// denyoom command fails; a shebang script that may write is refused before it starts
/// unless it says allow-oom; no-writes scripts run.
fn out_of_memory(r: &mut Rec) {
    r.run(args!["SET", "oom:k", "v"]);
    r.run(args!["CONFIG", "SET", "maxmemory", "1"]);
    r.eval("return redis.call('set', KEYS[1], 'x')", &["oom:k"], &[]);
    r.eval("return redis.call('get', KEYS[1])", &["oom:k"], &[]);
    r.eval("#!lua\nreturn redis.call('get', KEYS[1])", &["oom:k"], &[]);
    r.eval(
        "#!lua flags=no-writes\nreturn redis.call('get', KEYS[1])",
        &["oom:k"],
        &[],
    );
    r.eval(
        "#!lua flags=allow-oom\nreturn redis.call('set', KEYS[1], 'y')",
        &["oom:k"],
        &[],
    );
    r.eval("return redis.call('del', KEYS[1])", &["oom:k"], &[]);
    r.run(args!["CONFIG", "SET", "maxmemory", "0"]);
}

#[test]
fn scripts_past_maxmemory_match_redis() {
    run_against_redis(1, &[("out_of_memory", out_of_memory)]);
    run_against_redis(4, &[("out_of_memory", out_of_memory)]);
}

#[test]
fn scripting_matches_redis_threads_1() {
    run_against_redis(1, CORE);
}

#[test]
fn scripting_matches_redis_threads_4() {
    run_against_redis(4, CORE);
}

/// The libraries are judged on their own (they are built on another branch).
#[test]
fn lua_libraries_match_redis() {
    let (mut diffs, mut steps) = diff_against_redis(1, &[("lua_libraries", lua_libraries)]);
    let (more, n) = diff_against_redis(4, &[("lua_libraries", lua_libraries)]);
    diffs.extend(more);
    steps += n;
    assert_no_diffs(&diffs, steps);
}

/// A command whose own keys live on two shards, called from a script (Celery's chord
/// cleanup and RQ's `Queue.empty` do this with DEL): Kite runs it in one part per shard.
#[test]
fn multi_key_command_across_shards_inside_a_script() {
    fn scenario(r: &mut Rec) {
        let k = spread_keys("mk");
        r.eval(
            "redis.call('mset', KEYS[1], 'a', KEYS[2], 'b')
             return redis.call('mget', KEYS[1], KEYS[2])",
            &[k[0].as_str(), k[1].as_str()],
            &[],
        );
    }
    run_against_redis(4, &[("multi_key_command", scenario)]);
}

// ---------------------------------------------------------------------------
// Execution paths at --threads 4 (Kite's own counters)
// ---------------------------------------------------------------------------

#[derive(Debug, PartialEq, Clone, Copy, Default)]
struct Paths {
    fast: i64,
    global: i64,
    restarted: i64,
    escalated: i64,
}

fn paths(c: &mut Client) -> Paths {
    Paths {
        fast: info_field(c, "transactions", "scripts_fast_path"),
        global: info_field(c, "transactions", "scripts_global_path"),
        restarted: info_field(c, "transactions", "scripts_restarted"),
        escalated: info_field(c, "transactions", "scripts_escalated"),
    }
}

/// Scripts whose keys are on several shards: the replies equal Redis's, and each takes
/// the path its keys call for:
/// - declared keys on one shard: the fast path;
/// - declared keys on several shards: the global path at once;
/// - an undeclared key of another shard read before any write: the run is abandoned
///   (restarted) and rerun on the global path; later runs of that script go there first;
/// - an undeclared key of another shard reached after a write: the fast-path run
///   escalates and finishes there.
#[test]
fn cross_shard_scripts_take_the_expected_paths() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let k = spread_keys("path");
    let [k0, k1, k2, k3] = [k[0].as_str(), k[1].as_str(), k[2].as_str(), k[3].as_str()];
    let mut kc = Client::connect(kite.port);
    let mut rc = Client::connect(redis.port);
    let mut admin = Client::connect(kite.port);
    for c in [&mut kc, &mut rc] {
        assert_eq!(
            c.cmd(&["MSET", k0, "v0", k1, "v1", k2, "v2", k3, "v3"]),
            Resp::ok()
        );
    }
    let read_undeclared = "return {redis.call('get', KEYS[1]), redis.call('get', ARGV[1])}";
    let write_then_undeclared = "redis.call('append', KEYS[1], '!')
        redis.call('append', ARGV[1], '?')
        return {redis.call('get', KEYS[1]), redis.call('get', ARGV[1])}";
    let fn_lib = "#!lua name=paths
        redis.register_function('peek', function(keys, args)
          return {redis.call('get', keys[1]), redis.call('get', args[1])}
        end)";
    let steps: Vec<(Args, Paths)> = vec![
        (
            args!["EVAL", "return redis.call('get', KEYS[1])", 1, k0],
            Paths {
                fast: 1,
                ..Default::default()
            },
        ),
        (
            args![
                "EVAL",
                "return {redis.call('get', KEYS[1]), redis.call('get', KEYS[2])}",
                2,
                k0,
                k1
            ],
            Paths {
                global: 1,
                ..Default::default()
            },
        ),
        (
            args!["EVAL", read_undeclared, 1, k0, k1],
            Paths {
                global: 1,
                restarted: 1,
                ..Default::default()
            },
        ),
        (
            args!["EVAL", read_undeclared, 1, k0, k1],
            Paths {
                global: 1,
                ..Default::default()
            },
        ),
        (
            args!["EVAL", read_undeclared, 1, k2, k3],
            Paths {
                global: 1,
                ..Default::default()
            },
        ),
        (
            args!["EVAL", write_then_undeclared, 1, k2, k3],
            Paths {
                fast: 1,
                escalated: 1,
                ..Default::default()
            },
        ),
        (
            // Escalated once: from now on it takes every shard's lock before it starts.
            args!["EVAL", write_then_undeclared, 1, k0, k1],
            Paths {
                global: 1,
                ..Default::default()
            },
        ),
        (args!["FUNCTION", "LOAD", fn_lib], Paths::default()),
        (
            args!["FCALL", "peek", 1, k3, k0],
            Paths {
                global: 1,
                restarted: 1,
                ..Default::default()
            },
        ),
        (
            args!["FCALL", "peek", 1, k3, k0],
            Paths {
                global: 1,
                ..Default::default()
            },
        ),
        (args!["MGET", k0, k1, k2, k3], Paths::default()),
    ];
    let mut failures = Vec::new();
    for (cmd, want) in steps {
        let before = paths(&mut admin);
        let got = kc.cmd(&cmd);
        let after = paths(&mut admin);
        let expected = rc.cmd(&cmd);
        if got != expected {
            failures.push(format!(
                "{}\n      kite:  {got}\n      redis: {expected}",
                fmt_cmd(&cmd)
            ));
        }
        let moved = Paths {
            fast: after.fast - before.fast,
            global: after.global - before.global,
            restarted: after.restarted - before.restarted,
            escalated: after.escalated - before.escalated,
        };
        if moved != want {
            failures.push(format!(
                "{}: counters moved {moved:?}, expected {want:?}",
                fmt_cmd(&cmd)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Redis 7.2 runs blocking commands called by a script as their non-blocking forms
/// (7.0.15, the reference elsewhere, refuses them as not allowed from scripts).
#[test]
fn blocking_commands_inside_scripts_do_not_block() {
    for threads in [1, 4] {
        let kite = KiteServer::start(&[], threads);
        let mut c = kite.client();
        let blpop = "return redis.call('blpop', KEYS[1], 0)";
        assert_eq!(c.cmd(&["EVAL", blpop, "1", "empty"]), Resp::NullBulk);
        assert_eq!(c.cmd(&["RPUSH", "full", "x"]), Resp::Integer(1));
        assert_eq!(
            c.cmd(&["EVAL", blpop, "1", "full"]),
            Resp::Array(vec![Resp::bulk("full"), Resp::bulk("x")])
        );
    }
}

/// A payload from redis-server 7.0's FUNCTION DUMP restores into Kite. Redis writes a
/// library's code as an RDB string, LZF-compressed when that saves space (as here).
#[test]
fn function_restore_reads_a_redis_payload() {
    let redis = RedisServer::start();
    let kite = KiteServer::start(&[], 4);
    let mut rc = redis.client();
    let mut kc = kite.client();
    let lib = "#!lua name=fromredis\nredis.register_function('fr', function(k, a) return 'r:' .. a[1] end)";
    assert_eq!(rc.cmd(&["FUNCTION", "LOAD", lib]), Resp::bulk("fromredis"));
    let payload = rc.cmd(&["FUNCTION", "DUMP"]);
    let payload = payload.as_bytes().expect("a DUMP payload").to_vec();
    let restore: Vec<&[u8]> = vec![b"FUNCTION", b"RESTORE", &payload];
    assert_eq!(kc.cmd(&restore), Resp::ok());
    assert_eq!(kc.cmd(&["FCALL", "fr", "0", "x"]), Resp::bulk("r:x"));
}

/// Hostile scripts get an error and the server keeps serving: unbounded recursion, an
/// allocation past the interpreter's memory limit, garbage and NUL bytes as code, a
/// result nested deeper than the reply converter follows, a client that leaves while its
/// script runs.
#[test]
fn hostile_scripts_get_errors_not_crashes() {
    if kite_is_redis() {
        return;
    }
    let kite = KiteServer::start(&[], 2);
    let mut c = kite.client();
    // Filling the 1 GiB script memory limit takes about 10 s on a loaded 2-core machine
    // (page faults, then full collections near the limit): the reply is what is checked,
    // not how soon it comes.
    c.set_timeout(Some(std::time::Duration::from_secs(120)));
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"local function f() return f() + 1 end return f()".to_vec(),
            "stack overflow",
        ),
        (
            b"return string.rep('x', 2^30 + 2^29)".to_vec(),
            "not enough memory",
        ),
        (
            b"local t = {} for i = 1, 1e9 do t[i] = string.rep('y', 1048576) .. i end".to_vec(),
            "not enough memory",
        ),
        (
            b"\x00\x01\x02 garbage \xff".to_vec(),
            "Error compiling script",
        ),
        (vec![b'('; 100_000], "Error compiling script"),
    ];
    for (body, want) in cases {
        let r = c.cmd(&[b"EVAL".as_slice(), &body, b"0"]);
        let text = r
            .error_text()
            .unwrap_or_else(|| panic!("expected an error, got {r}"));
        assert!(text.contains(want), "{text:.200} should mention {want}");
        assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    }
    // Nesting past the converter's depth ends in an error element, never a broken reply.
    let r = c.cmd(&[
        "EVAL",
        "local t = {} local cur = t for i = 1, 2000 do local n = {} cur[1] = n cur = n end return t",
        "0",
    ]);
    let mut depth = 0;
    let mut inner = &r;
    while let Some([only]) = inner.as_array() {
        depth += 1;
        inner = only;
    }
    assert_eq!(depth, 1001, "arrays down to the converter's limit");
    assert_eq!(inner.error_text(), Some("ERR reached lua stack limit"));
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    // A client that disconnects while its script runs: the script's write still happens
    // once, and the server carries on.
    let mut gone = kite.client();
    gone.send(&[
        "EVAL",
        "local x = 0 for i = 1, 3e7 do x = x + i end redis.call('incr', KEYS[1]) return x",
        "1",
        "left:counter",
    ]);
    drop(gone);
    wait_until("the abandoned script's write", || {
        c.cmd(&["GET", "left:counter"]).parse_int() == Some(1)
    });
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
}

/// Past busy-reply-threshold, clients on other threads get BUSY; SCRIPT KILL stops a
/// script that has not written, and refuses (UNKILLABLE) one that has.
#[test]
fn busy_scripts_answer_busy_and_die_by_script_kill() {
    if kite_is_redis() {
        return;
    }
    let kite = KiteServer::start(&[], 2);
    // Connections are dealt to threads in turn: `runner` and `other` land on different
    // threads, so `other` can talk while the runner's thread is busy.
    let mut runner = kite.client();
    let mut other = kite.client();
    assert_eq!(
        other.cmd(&["CONFIG", "SET", "busy-reply-threshold", "50"]),
        Resp::ok()
    );
    runner.send(&["EVAL", "local i = 0 while true do i = i + 1 end", "0"]);
    wait_until("BUSY for other clients", || busy_for(&mut other));
    assert_eq!(other.cmd(&["SCRIPT", "KILL"]), Resp::ok());
    let r = runner.read();
    assert!(
        r.error_text()
            .is_some_and(|e| e.contains("Script killed by user")),
        "{r}"
    );
    assert_eq!(other.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(
        other.cmd(&["SCRIPT", "KILL"]).error_text(),
        Some("NOTBUSY No scripts in execution right now.")
    );
    // A script that wrote cannot be killed; it ends on its own here (bounded loop).
    runner.send(&[
        "EVAL",
        "redis.call('set', 'busy:w', '1') local x = 0 for i = 1, 4e8 do x = x + 1 end return x",
        "0",
    ]);
    wait_until("BUSY for the writing script", || busy_for(&mut other));
    let kill = other.cmd(&["SCRIPT", "KILL"]);
    assert!(
        kill.error_text()
            .is_some_and(|e| e.starts_with("UNKILLABLE ")),
        "{kill}"
    );
    runner.set_timeout(Some(std::time::Duration::from_secs(120)));
    assert_eq!(runner.read().as_int(), Some(400_000_000));
}

/// MSET with a key and no value, its keys on two shards, called from a script: Redis's
/// arity error, not a failure of the script engine.
#[test]
fn mset_missing_value_across_shards_inside_a_script() {
    fn scenario(r: &mut Rec) {
        let k = spread_keys("mo");
        r.eval(
            "return redis.call('mset', KEYS[1], 'a', KEYS[2])",
            &[k[0].as_str(), k[1].as_str()],
            &[],
        );
        r.eval(
            "local ok, e = pcall(redis.call, 'mset', KEYS[1], 'a', KEYS[2]) return e",
            &[k[0].as_str(), k[1].as_str()],
            &[],
        );
        r.run(args!["MGET", k[0].as_str(), k[1].as_str()]);
    }
    run_against_redis(4, &[("mset_missing_value", scenario)]);
}

/// A client blocked on a list that an escalating script (one that reached another
/// shard after writing) pushes to is served after the script ends, however long the
/// script runs after the push: the other shard's periodic work must not serve it
/// mid-script. The script waits 300 ms on TIME so that work surely comes around.
#[test]
fn blocked_client_waits_for_an_escalated_script_to_end() {
    fn scenario(r: &mut Rec) {
        let k = spread_keys("esc");
        let before = info_field(&mut r.c, "clients", "blocked_clients");
        let mut b = r.open();
        b.send(&["BLPOP", k[1].as_str(), "0"]);
        let mut admin = Client::connect(r.port);
        wait_until("a blocked client", || {
            info_field(&mut admin, "clients", "blocked_clients") > before
        });
        r.eval(
            "redis.call('set', KEYS[1], 'x')
             redis.call('rpush', ARGV[1], 'e1', 'e2')
             local function now()
               local t = redis.call('time')
               return tonumber(t[1]) * 1000000 + tonumber(t[2])
             end
             local start = now()
             repeat until now() - start > 300000
             return redis.call('llen', ARGV[1])",
            &[k[0].as_str()],
            &[k[1].as_str()],
        );
        r.note("BLPOP after the script", b.read());
        r.run(args!["LRANGE", k[1].as_str(), 0, -1]);
    }
    run_against_redis(4, &[("escalated_script_blocked_client", scenario)]);
}

/// A library whose top-level code never ends fails FUNCTION LOAD with Redis's timeout
/// error instead of holding its thread forever; a library's top-level `redis.call`
/// never runs, neither at FUNCTION LOAD nor when a thread reloads it before FCALL.
#[test]
fn function_load_times_out_and_library_code_cannot_call_commands() {
    if kite_is_redis() {
        return;
    }
    let kite = KiteServer::start(&[], 4);
    let mut c = kite.client();
    let r = c.cmd(&[
        "FUNCTION",
        "LOAD",
        "#!lua name=endless\nlocal x = 0 while true do x = x + 1 end",
    ]);
    assert_eq!(
        r.error_text(),
        Some("ERR Error registering functions: ERR FUNCTION LOAD timeout")
    );
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(
        c.cmd(&[
            "FUNCTION",
            "LOAD",
            "#!lua name=sneaky\nlocal ok = pcall(redis.call, 'set', 'load:key', '1')\nredis.register_function('sneaky', function() return tostring(ok) end)",
        ]),
        Resp::bulk("sneaky")
    );
    // New connections are dealt to every thread in turn, so each thread reloads.
    for _ in 0..8 {
        let mut d = kite.client();
        assert_eq!(d.cmd(&["FCALL", "sneaky", "0"]), Resp::bulk("false"));
    }
    assert_eq!(c.cmd(&["EXISTS", "load:key"]).as_int(), Some(0));
}

/// `redis.sha1hex` of a whole number hashes its text, as Redis does.
#[test]
fn sha1hex_of_a_number_matches_redis() {
    fn scenario(r: &mut Rec) {
        r.eval("return redis.sha1hex(123)", &[], &[]);
        r.eval("return redis.sha1hex(-7)", &[], &[]);
    }
    run_against_redis(1, &[("sha1hex_number", scenario)]);
}

/// SCRIPT KILL stops scripts that loop inside a coroutine or catch the kill with pcall,
/// as Redis does, and the thread serves scripts normally afterwards.
#[test]
fn script_kill_reaches_coroutines_and_pcall_loops() {
    if kite_is_redis() {
        return;
    }
    let kite = KiteServer::start(&[], 2);
    let mut runner = kite.client();
    let mut other = kite.client();
    assert_eq!(
        other.cmd(&["CONFIG", "SET", "busy-reply-threshold", "50"]),
        Resp::ok()
    );
    for body in [
        "coroutine.wrap(function() while true do end end)()",
        "while true do pcall(function() while true do end end) end",
    ] {
        runner.send(&["EVAL", body, "0"]);
        wait_until("BUSY", || busy_for(&mut other));
        assert_eq!(other.cmd(&["SCRIPT", "KILL"]), Resp::ok());
        let r = runner.read();
        assert_eq!(
            r.error_text(),
            Some("ERR Script killed by user with SCRIPT KILL..."),
            "{body}"
        );
        assert_eq!(runner.cmd(&["EVAL", "return 7", "0"]), Resp::Integer(7));
    }
}
