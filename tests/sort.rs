//! SORT and SORT_RO against a real redis-server: numeric and ALPHA order, DESC, LIMIT,
//! BY patterns (string keys, `hash->field`, `nosort`, constant patterns), GET patterns
//! (`#`, keys, hash fields), STORE, on lists, sets and sorted sets.
//!
//! Things the comparison takes care of:
//! - Redis compares ALPHA values with strcoll(); the servers started here get
//!   `LC_ALL=C` so that is byte order, whatever the machine's locale.
//! - Elements that compare equal under ALPHA with a BY pattern (same weight, or no weight
//!   key) come back in whatever order Redis's sort leaves them (libc qsort, or pqsort with
//!   LIMIT): the generator gives every element a weight of its own for ALPHA BY. Numeric
//!   ties are broken by comparing the elements, so those are exact.
//! - A set sorted BY nosort comes back in the set's own order, where Redis 7.0 (the
//!   reference here) keeps small sets of strings in a hash table and 7.2 in a listpack:
//!   the differential only does that with STORE or from a script (then Redis sorts the
//!   elements anyway), and `set_nosort_order_matches_valkey` compares that order with
//!   Valkey 8.1, which keeps 7.2's listpack.
//! - Redis parses numbers with strtod() and checks errno without clearing it first, so
//!   after a number out of range (ERANGE) every SORT on that thread fails until a syscall
//!   resets errno (accepting a connection does). The parsing cases each use a connection
//!   of their own.
//!
//! With `--threads 4` the sorted key, the BY and GET keys and the STORE destination sit
//! on different shards.
//!
//! Reproduce one seed: `KITE_SORT_SEEDS=7 cargo test --test sort random`; longer runs:
//! `KITE_SORT_OPS=5000`.

#[macro_use]
mod common;

use common::*;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Once;
use std::time::Duration;

/// Child processes (the servers) collate in byte order.
fn c_locale() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var("LC_ALL", "C"));
}

// ---------------------------------------------------------------------------------------
// Kite and the reference side by side
// ---------------------------------------------------------------------------------------

struct Pair {
    kite: Client,
    redis: Client,
    label: String,
    count: usize,
    history: VecDeque<String>,
    stats: BTreeMap<String, (usize, usize)>,
}

/// Cuts `s` to at most `max` bytes (on a character boundary), marking the cut.
fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// A command for messages, long ones cut short.
fn cmd_text(args: &[Vec<u8>]) -> String {
    let text = fmt_cmd(args);
    if text.len() > 1500 {
        format!("{} ({} arguments)", clip(text, 1500), args.len())
    } else {
        text
    }
}

fn short(r: &Resp) -> String {
    clip(r.to_string(), 600)
}

impl Pair {
    fn new(kite: &ServerProcess, redis: &ServerProcess, resp3: bool, label: String) -> Pair {
        let mut p = Pair {
            kite: kite.client(),
            redis: redis.client(),
            label,
            count: 0,
            history: VecDeque::new(),
            stats: BTreeMap::new(),
        };
        for c in [&mut p.kite, &mut p.redis] {
            assert_eq!(c.cmd(&["FLUSHALL"]), Resp::ok());
            if resp3 {
                let r = c.cmd(&["HELLO", "3"]);
                assert!(matches!(r, Resp::Map(_)), "HELLO 3 returned {r}");
            }
        }
        p
    }

    fn fail(&self, args: &[Vec<u8>], kite: &Resp, redis: &Resp) -> ! {
        let hist: Vec<String> = self.history.iter().cloned().collect();
        panic!(
            "\nSORT MISMATCH ({})\n  command #{}: {}\n  kite:  {}\n  redis: {}\n\
             last commands (oldest first):\n    {}\n",
            self.label,
            self.count,
            cmd_text(args),
            short(kite),
            short(redis),
            hist.join("\n    ")
        );
    }

    fn same(&mut self, args: Vec<Vec<u8>>) -> Resp {
        self.kite.send(&args);
        self.redis.send(&args);
        let k = self.kite.try_read();
        let r = self.redis.try_read();
        let (k, r) = match (k, r) {
            (Ok(k), Ok(r)) => (k, r),
            (k, r) => {
                let show = |x: std::io::Result<Resp>| match x {
                    Ok(v) => v,
                    Err(e) => Resp::Error(format!("<no reply: {e}>")),
                };
                self.fail(&args, &show(k), &show(r))
            }
        };
        let line = clip(
            format!(
                "#{} {} -> {}",
                self.count,
                clip(fmt_cmd(&args), 200),
                short(&r)
            ),
            300,
        );
        self.history.push_back(line);
        if self.history.len() > 25 {
            self.history.pop_front();
        }
        self.count += 1;
        let e = self
            .stats
            .entry(String::from_utf8_lossy(&args[0]).to_ascii_uppercase())
            .or_default();
        if r.is_error() {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
        if k != r {
            self.fail(&args, &k, &r);
        }
        r
    }
}

fn err(text: &str) -> Resp {
    Resp::Error(text.to_string())
}

fn bulks(items: &[&str]) -> Resp {
    Resp::Array(items.iter().map(Resp::bulk).collect())
}

const NOT_DOUBLE: &str = "ERR One or more scores can't be converted into double";
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

// ---------------------------------------------------------------------------------------
// Scripted cases
// ---------------------------------------------------------------------------------------

fn scripted(threads: usize, resp3: bool) {
    c_locale();
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let label = format!(
        "scripted, {}, {}",
        kite.name,
        if resp3 { "RESP3" } else { "RESP2" }
    );
    let mut p = Pair::new(&kite, &redis, resp3, label);
    let k = spread_keys("sorted", 8);
    let (l, z, s, dst) = (k[0].as_str(), k[1].as_str(), k[2].as_str(), k[3].as_str());

    // Lists: numbers by default, ALPHA, DESC, LIMIT.
    p.same(args!["RPUSH", l, "3", "1", "2", "10", "-1.5"]);
    assert_eq!(
        p.same(args!["SORT", l]),
        bulks(&["-1.5", "1", "2", "3", "10"])
    );
    assert_eq!(
        p.same(args!["SORT", l, "DESC"]),
        bulks(&["10", "3", "2", "1", "-1.5"])
    );
    assert_eq!(
        p.same(args!["SORT", l, "ALPHA"]),
        bulks(&["-1.5", "1", "10", "2", "3"])
    );
    p.same(args!["SORT", l, "ALPHA", "DESC"]);
    p.same(args!["sort", l, "desc", "alpha"]);
    p.same(args!["SORT", l, "ASC", "DESC"]);
    p.same(args!["SORT", l, "DESC", "ASC"]);
    p.same(args!["SORT", l, "ALPHA", "ALPHA"]);
    for (off, cnt) in [
        ("1", "2"),
        ("-1", "2"),
        ("1", "-1"),
        ("10", "2"),
        ("0", "0"),
        ("4", "10"),
        ("-9223372036854775808", "9223372036854775807"),
        ("9223372036854775807", "1"),
    ] {
        p.same(args!["SORT", l, "LIMIT", off, cnt]);
        p.same(args!["SORT", l, "LIMIT", off, cnt, "DESC", "ALPHA"]);
        p.same(args!["SORT", l, "BY", "nosort", "LIMIT", off, cnt]);
        p.same(args!["SORT", l, "BY", "nosort", "DESC", "LIMIT", off, cnt]);
    }
    // BY nosort keeps a list's order (DESC reverses it); so does a pattern with no `*`.
    p.same(args!["SORT", l, "BY", "nosort"]);
    p.same(args!["SORT", l, "BY", "nosort", "DESC"]);
    p.same(args!["SORT", l, "BY", "NOSORT", "ALPHA"]);
    p.same(args!["SORT", l, "BY", "constant"]);
    p.same(args!["SORT", l, "BY", "constant", "DESC"]);
    p.same(args!["SORT", l, "BY", "const->field"]);
    p.same(args!["SORT_RO", l, "BY", "nosort"]);

    // BY weights in string keys (on other shards at --threads 4), missing ones as 0.
    p.same(args![
        "MSET", "w_3", "5", "w_1", "-2", "w_2", "5", "w_10", "0.5"
    ]);
    p.same(args!["SORT", l, "BY", "w_*"]);
    p.same(args!["SORT", l, "BY", "w_*", "DESC"]);
    p.same(args!["SORT", l, "BY", "w_*", "LIMIT", "1", "3"]);
    p.same(args!["SORT", l, "BY", "nokey_*"]);
    p.same(args!["SORT", l, "BY", "nokey_*", "DESC"]);
    // Weights that are not numbers.
    p.same(args!["SET", "w_2", "abc"]);
    assert_eq!(p.same(args!["SORT", l, "BY", "w_*"]), err(NOT_DOUBLE));
    p.same(args!["SET", "w_2", "7"]);
    // ALPHA BY with a weight of its own for every element.
    p.same(args![
        "MSET", "a_3", "pear", "a_1", "apple", "a_2", "fig", "a_10", "Zed", "a_-1.5", "kiwi"
    ]);
    p.same(args!["SORT", l, "BY", "a_*", "ALPHA"]);
    p.same(args![
        "SORT", l, "BY", "a_*", "ALPHA", "DESC", "LIMIT", "0", "3"
    ]);
    assert_eq!(p.same(args!["SORT", l, "BY", "a_*"]), err(NOT_DOUBLE));
    // A weight key of another type counts as missing.
    p.same(args!["RPUSH", "w_1", "x"]);
    p.same(args!["DEL", "w_1"]);
    p.same(args!["RPUSH", "w_1", "x"]);
    p.same(args!["SORT", l, "BY", "w_*"]);
    // Only the first `*` is replaced.
    p.same(args!["SET", "x3y*", "first"]);
    p.same(args!["SORT", l, "BY", "nosort", "GET", "x*y*"]);

    // BY and GET on hash fields.
    p.same(args!["HSET", "h_3", "n", "30", "a", "c", "f->g", "nested"]);
    p.same(args!["HSET", "h_1", "n", "10", "a", "b"]);
    p.same(args!["HSET", "h_2", "n", "-20", "a", "d"]);
    p.same(args!["HSET", "h_10", "n", "0", "a", "a"]);
    p.same(args!["HSET", "h_-1.5", "n", "7", "a", "e"]);
    p.same(args!["SORT", l, "BY", "h_*->n"]);
    p.same(args![
        "SORT", l, "BY", "h_*->n", "DESC", "GET", "#", "GET", "h_*->a"
    ]);
    p.same(args![
        "SORT", l, "BY", "h_*->a", "ALPHA", "GET", "h_*->n", "GET", "#"
    ]);
    p.same(args![
        "SORT",
        l,
        "BY",
        "h_*->missing",
        "GET",
        "h_*->missing"
    ]);
    p.same(args!["SORT", l, "GET", "h_*->f->g"]);
    p.same(args!["SORT", l, "GET", "h_*->f"]);
    // A hash pattern on a string key, a string pattern on a hash key: nil.
    p.same(args!["SORT", l, "GET", "w_*->n"]);
    p.same(args!["SORT", l, "GET", "h_*"]);
    p.same(args!["SORT", l, "BY", "h_*", "GET", "#"]);
    // `->` with nothing after it is part of the key name.
    p.same(args!["SET", "1->", "arrow"]);
    p.same(args!["SORT", l, "GET", "*->"]);
    // GET without `*` is nil; `#` is the element; several GETs interleave.
    p.same(args!["SORT", l, "GET", "constant"]);
    p.same(args![
        "SORT", l, "GET", "#", "GET", "w_*", "GET", "nokey_*", "GET", "#"
    ]);
    p.same(args![
        "SORT", l, "BY", "w_*", "GET", "w_*", "LIMIT", "1", "2"
    ]);
    p.same(args!["SORT", l, "GET", "*"]);
    p.same(args!["SET", "1", "one"]);
    p.same(args!["SORT", l, "GET", "*"]);

    // STORE: a list, the count, the destination overwritten whatever its type, deleted
    // for an empty result; GET values stored as they are (nil as an empty string).
    assert_eq!(p.same(args!["SORT", l, "STORE", dst]), Resp::Integer(5));
    p.same(args!["TYPE", dst]);
    p.same(args!["LRANGE", dst, "0", "-1"]);
    p.same(args![
        "SORT", l, "BY", "nosort", "GET", "#", "GET", "nokey_*", "STORE", dst
    ]);
    p.same(args!["LRANGE", dst, "0", "-1"]);
    p.same(args!["SET", dst, "string"]);
    p.same(args!["SORT", l, "DESC", "LIMIT", "0", "2", "STORE", dst]);
    p.same(args!["TYPE", dst]);
    p.same(args!["LRANGE", dst, "0", "-1"]);
    assert_eq!(
        p.same(args!["SORT", l, "LIMIT", "0", "0", "STORE", dst]),
        Resp::Integer(0)
    );
    assert_eq!(p.same(args!["EXISTS", dst]), Resp::Integer(0));
    p.same(args!["SADD", dst, "x"]);
    assert_eq!(
        p.same(args!["SORT", "nokey", "STORE", dst]),
        Resp::Integer(0)
    );
    assert_eq!(p.same(args!["EXISTS", dst]), Resp::Integer(0));
    // The last STORE named wins; the source may be its own destination.
    p.same(args!["SORT", l, "STORE", "{d}1", "STORE", "{d}2"]);
    p.same(args!["EXISTS", "{d}1"]);
    p.same(args!["LRANGE", "{d}2", "0", "-1"]);
    p.same(args!["COPY", l, "{c}l"]);
    p.same(args!["SORT", "{c}l", "DESC", "STORE", "{c}l"]);
    p.same(args!["LRANGE", "{c}l", "0", "-1"]);

    // Sorted sets: BY nosort keeps the score order, with LIMIT served from either end.
    p.same(args![
        "ZADD", z, "1", "a", "2", "b", "3", "c", "4", "d", "5", "e"
    ]);
    p.same(args!["SORT", z, "ALPHA"]);
    p.same(args!["SORT", z, "BY", "nosort"]);
    p.same(args!["SORT", z, "BY", "nosort", "DESC"]);
    for (off, cnt) in [
        ("1", "2"),
        ("-5", "2"),
        ("3", "100"),
        ("10", "2"),
        ("0", "-1"),
        ("4", "1"),
        ("4", "0"),
        ("5", "-1"),
    ] {
        p.same(args!["SORT", z, "BY", "nosort", "LIMIT", off, cnt]);
        p.same(args!["SORT", z, "BY", "nosort", "DESC", "LIMIT", off, cnt]);
        p.same(args![
            "SORT", z, "BY", "nosort", "DESC", "LIMIT", off, cnt, "GET", "#", "GET", "w_*"
        ]);
    }
    let mut a = args!["ZADD", "{big}z"];
    for i in 0..200 {
        a.extend(args![(i * 7 % 200).to_string(), format!("m{i}")]);
    }
    p.same(a);
    for (off, cnt) in [
        ("3", "4"),
        ("198", "4"),
        ("-3", "4"),
        ("0", "-1"),
        ("150", "-1"),
    ] {
        p.same(args!["SORT", "{big}z", "BY", "nosort", "LIMIT", off, cnt]);
        p.same(args![
            "SORT", "{big}z", "BY", "nosort", "DESC", "LIMIT", off, cnt
        ]);
    }
    p.same(args!["SORT", "{big}z", "ALPHA", "LIMIT", "10", "5"]);
    p.same(args!["SORT", z, "BY", "nosort", "STORE", dst]);
    p.same(args!["LRANGE", dst, "0", "-1"]);
    assert_eq!(p.same(args!["SORT", z]), err(NOT_DOUBLE));

    // Sets: sorted results, and BY nosort with STORE or from a script, where Redis sorts
    // the elements (ALPHA) so replicas and the AOF agree.
    p.same(args!["SADD", s, "c", "a", "b", "10", "9"]);
    p.same(args!["SORT", s, "ALPHA"]);
    p.same(args!["SORT", s, "ALPHA", "DESC", "LIMIT", "1", "2"]);
    assert_eq!(p.same(args!["SORT", s]), err(NOT_DOUBLE));
    p.same(args!["SORT", s, "BY", "nosort", "STORE", dst]);
    assert_eq!(
        p.same(args!["LRANGE", dst, "0", "-1"]),
        bulks(&["10", "9", "a", "b", "c"])
    );
    p.same(args![
        "SORT", s, "BY", "nosort", "DESC", "LIMIT", "1", "2", "STORE", dst
    ]);
    p.same(args!["LRANGE", dst, "0", "-1"]);
    p.same(args!["SORT", s, "BY", "constant", "STORE", dst]);
    p.same(args!["LRANGE", dst, "0", "-1"]);
    p.same(args![
        "EVAL",
        "return redis.call('sort', KEYS[1], 'by', 'nosort')",
        "1",
        s
    ]);
    p.same(args![
        "EVAL",
        "return redis.call('sort', KEYS[1], 'by', 'nosort', 'desc', 'limit', '0', '3')",
        "1",
        s
    ]);
    p.same(args![
        "EVAL",
        "return redis.call('sort_ro', KEYS[1], 'by', 'constant', 'get', '#')",
        "1",
        s
    ]);
    p.same(args!["SADD", "{i}s", "5", "-3", "100", "0"]);
    p.same(args!["SORT", "{i}s"]);
    p.same(args!["SORT", "{i}s", "BY", "nosort"]);
    p.same(args![
        "SORT", "{i}s", "BY", "w_*", "GET", "#", "GET", "h_*->n"
    ]);

    // Numeric strings strtod() reads: spaces before, hex, inf, exponents, signs, "".
    p.same(args![
        "RPUSH", "{n}l", "", "  5", "0x1A", "inf", "-inf", "+3", "1e3", ".5", "5.", "-0", "1.0",
        "01"
    ]);
    p.same(args!["SORT", "{n}l"]);
    p.same(args!["SORT", "{n}l", "DESC"]);
    p.same(args!["SORT", "{n}l", "STORE", "{n}d"]);
    p.same(args!["LRANGE", "{n}d", "0", "-1"]);

    // SORT_RO.
    p.same(args!["SORT_RO", l, "DESC", "LIMIT", "0", "2"]);
    p.same(args![
        "SORT_RO", l, "BY", "w_*", "GET", "#", "GET", "h_*->a"
    ]);
    p.same(args!["SORT_RO", "nokey"]);
    assert_eq!(
        p.same(args!["SORT_RO", l, "STORE", dst]),
        err("ERR syntax error")
    );

    // Errors.
    p.same(args!["SET", "str", "x"]);
    p.same(args!["HSET", "hash", "f", "v"]);
    let errors: Vec<(Vec<Vec<u8>>, &str)> = vec![
        (args!["SORT", "str"], WRONGTYPE),
        (args!["SORT", "hash"], WRONGTYPE),
        (args!["SORT_RO", "str"], WRONGTYPE),
        (args!["SORT", l, "STORE"], "ERR syntax error"),
        (args!["SORT", l, "BY"], "ERR syntax error"),
        (args!["SORT", l, "GET"], "ERR syntax error"),
        (args!["SORT", l, "GET", "#", "GET"], "ERR syntax error"),
        (args!["SORT", l, "LIMIT", "1"], "ERR syntax error"),
        (args!["SORT", l, "LIMIT", "0", "1", "2"], "ERR syntax error"),
        (args!["SORT", l, "foo"], "ERR syntax error"),
        (
            args!["SORT", l, "LIMIT", "a", "1"],
            "ERR value is not an integer or out of range",
        ),
        (
            args!["SORT", l, "LIMIT", "0", "1.5"],
            "ERR value is not an integer or out of range",
        ),
        (
            args!["SORT", l, "LIMIT", "9223372036854775808", "1"],
            "ERR value is not an integer or out of range",
        ),
        (args!["SORT_RO", l, "STORE", dst], "ERR syntax error"),
        (
            args!["SORT"],
            "ERR wrong number of arguments for 'sort' command",
        ),
        (
            args!["SORT_RO"],
            "ERR wrong number of arguments for 'sort_ro' command",
        ),
    ];
    for (a, text) in errors {
        assert_eq!(p.same(a.clone()), err(text), "{}", fmt_cmd(&a));
    }
    // A wrong-type source fails before STORE touches the destination.
    p.same(args!["SET", dst, "kept"]);
    p.same(args!["SORT", "str", "STORE", dst]);
    assert_eq!(p.same(args!["GET", dst]), Resp::bulk("kept"));
    p.same(args!["RPUSH", "{n}bad", "1", "x"]);
    assert_eq!(
        p.same(args!["SORT", "{n}bad", "STORE", dst]),
        err(NOT_DOUBLE)
    );
    assert_eq!(p.same(args!["GET", dst]), Resp::bulk("kept"));
    // Inside MULTI.
    p.same(args!["MULTI"]);
    p.same(args!["RPUSH", "{t}l", "b", "a"]);
    p.same(args!["SORT", "{t}l", "ALPHA", "STORE", "{t}d"]);
    p.same(args!["SORT", "{t}l"]);
    p.same(args!["LRANGE", "{t}d", "0", "-1"]);
    p.same(args!["EXEC"]);
}

#[test]
fn scripted_resp2_threads1() {
    scripted(1, false);
}

#[test]
fn scripted_resp3_threads1() {
    scripted(1, true);
}

#[test]
fn scripted_resp2_threads4() {
    scripted(4, false);
}

#[test]
fn scripted_resp3_threads4() {
    scripted(4, true);
}

/// What counts as a number: every case on fresh connections to fresh-errno servers
/// (see the module comment about Redis's errno).
#[test]
fn numeric_parsing_matches_redis() {
    c_locale();
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let cases: &[&str] = &[
        // Accepted.
        "",
        " 5",
        "  5",
        "\t7",
        "\n5",
        "0x1A",
        "0X1a",
        "0x1p3",
        "0x1.8",
        "inf",
        "-inf",
        "INF",
        "Infinity",
        "-Infinity",
        "+3",
        "1e3",
        "1E-3",
        ".5",
        "5.",
        "-0",
        "1e308",
        "2.2250738585072014e-308",
        "00012",
        "9007199254740993",
        // Refused.
        "nan",
        "NaN",
        "-nan",
        "5 ",
        "abc",
        "1,5",
        "0x",
        "--1",
        "1e",
        "1_0",
        "1e400",
        "-1e400",
        "1e-400",
        "2.5e-310",
        "4.9e-324",
        "0x1p-1075",
    ];
    for (n, case) in cases.iter().enumerate() {
        let mut p = Pair::new(&kite, &redis, false, format!("numeric parsing {case:?}"));
        let key = format!("num{n}");
        p.same(args!["RPUSH", key.as_str(), *case, "1", "-2"]);
        p.same(args!["SORT", key.as_str()]);
        drop(p);
        // As a weight.
        let mut p = Pair::new(&kite, &redis, false, format!("numeric weight {case:?}"));
        p.same(args!["RPUSH", key.as_str(), "a", "b", "c"]);
        p.same(args!["MSET", "nw_a", *case, "nw_b", "0", "nw_c", "1"]);
        p.same(args!["SORT", key.as_str(), "BY", "nw_*", "DESC"]);
        drop(p);
    }
}

// ---------------------------------------------------------------------------------------
// The random differential
// ---------------------------------------------------------------------------------------

struct Gen {
    rng: Rng,
    lists: Vec<String>,
    sets: Vec<String>,
    zsets: Vec<String>,
    /// Keys holding elements that are not all numbers.
    mixed: Vec<String>,
    dests: Vec<String>,
    numbers: Vec<String>,
    words: Vec<String>,
    unique: u64,
}

/// Numbers as strtod() reads them, in several spellings (no ERANGE: see the module
/// comment), and words.
fn universe(rng: &mut Rng) -> (Vec<String>, Vec<String>) {
    let mut numbers: Vec<String> = (-20..=40).map(|i| i.to_string()).collect();
    for s in [
        "1.5", "-0.25", "+3", "1e2", ".5", "5.", "-0", "0x1F", " 7", "inf", "-inf", "01", "1.0",
        "2.50", "1e-3", "",
    ] {
        numbers.push(s.to_string());
    }
    for _ in 0..30 {
        let v = rng.range(-100_000, 100_000) as f64 / 1000.0;
        numbers.push(format!("{v}"));
    }
    let mut words: Vec<String> = [
        "apple", "Apple", "b", "ba", "bb", "zz", "x y", "a-b", "a_b", "~", "10a", "-", "A1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for _ in 0..20 {
        let len = rng.range(1, 8) as usize;
        let w: String = (0..len)
            .map(|_| (b' ' + rng.below(95) as u8) as char)
            .collect();
        words.push(w);
    }
    numbers.sort();
    numbers.dedup();
    words.sort();
    words.dedup();
    (numbers, words)
}

impl Gen {
    fn number(&mut self) -> String {
        self.rng.pick(&self.numbers).clone()
    }

    fn element(&mut self, mixed: bool) -> String {
        if mixed && self.rng.chance(40) {
            self.rng.pick(&self.words).clone()
        } else {
            self.number()
        }
    }

    fn any_key(&mut self) -> (String, &'static str) {
        match self.rng.below(20) {
            0..=7 => (self.rng.pick(&self.lists).clone(), "list"),
            8..=12 => (self.rng.pick(&self.sets).clone(), "set"),
            13..=18 => (self.rng.pick(&self.zsets).clone(), "zset"),
            _ => (self.rng.pick(&["missing", "str"]).to_string(), "other"),
        }
    }

    fn is_mixed(&self, key: &str) -> bool {
        self.mixed.iter().any(|k| k == key)
    }

    /// A SORT / SORT_RO command.
    fn sort(&mut self) -> Args {
        let (key, kind) = self.any_key();
        let ro = self.rng.chance(20);
        let store = !ro && self.rng.chance(25);
        let mut a = args![if ro { "SORT_RO" } else { "SORT" }, key.as_str()];
        let mut alpha = self.rng.chance(35);
        if self.is_mixed(&key) && self.rng.chance(70) {
            alpha = true;
        }
        // BY: ALPHA only with weights unique to each element (no ties).
        let by: Option<&str> = match (self.rng.below(20), alpha) {
            (0..=8, _) => None,
            (9..=10, _) => Some("nosort"),
            (11, _) => Some("constant"),
            (12..=13, false) => Some("nw_*"),
            (14, false) => Some("nokey_*"),
            (15..=16, false) => Some("h_*->n"),
            // Numeric order of weights that are words: an error.
            (17, false) => Some("aw_*"),
            (12..=15, true) => Some("aw_*"),
            (16..=17, true) => Some("h_*->a"),
            _ => None,
        };
        // A set's own order only with STORE (Redis then sorts anyway): see above.
        let by = match by {
            Some("nosort") | Some("constant") if kind == "set" && !store => None,
            other => other,
        };
        let mut opts: Vec<Args> = Vec::new();
        if let Some(b) = by {
            opts.push(args!["BY", b]);
        }
        if alpha {
            opts.push(args!["ALPHA"]);
        }
        match self.rng.below(10) {
            0..=3 => opts.push(args!["DESC"]),
            4 => opts.push(args!["ASC"]),
            _ => {}
        }
        if self.rng.chance(40) {
            opts.push(args![
                "LIMIT",
                self.rng.range(-3, 30).to_string(),
                self.rng.range(-2, 30).to_string()
            ]);
        }
        for _ in 0..self.rng.below(4) {
            let pat = *self.rng.pick(&[
                "#", "nw_*", "aw_*", "h_*->n", "h_*->a", "h_*->x", "nokey_*", "constant",
            ]);
            opts.push(args!["GET", pat]);
        }
        if store {
            let dest = self.rng.pick(&self.dests).clone();
            opts.push(args!["STORE", dest]);
        }
        self.rng.shuffle(&mut opts);
        for o in opts {
            a.extend(o);
        }
        a
    }

    /// A write that changes what the sorts see.
    fn write(&mut self) -> Args {
        match self.rng.below(12) {
            0..=2 => {
                let key = self.rng.pick(&self.lists).clone();
                let mixed = self.is_mixed(&key);
                let mut a = args![
                    if self.rng.chance(50) {
                        "RPUSH"
                    } else {
                        "LPUSH"
                    },
                    key
                ];
                for _ in 0..self.rng.range(1, 4) {
                    a.push(self.element(mixed).into_bytes());
                }
                a
            }
            3 => {
                let key = self.rng.pick(&self.lists).clone();
                args!["LPOP", key]
            }
            4..=5 => {
                let key = self.rng.pick(&self.sets).clone();
                let mixed = self.is_mixed(&key);
                if self.rng.chance(70) {
                    args!["SADD", key, self.element(mixed)]
                } else {
                    args!["SREM", key, self.element(mixed)]
                }
            }
            6..=7 => {
                let key = self.rng.pick(&self.zsets).clone();
                let mixed = self.is_mixed(&key);
                if self.rng.chance(70) {
                    args!["ZADD", key, self.rng.range(-50, 50), self.element(mixed)]
                } else {
                    args!["ZREM", key, self.element(mixed)]
                }
            }
            8..=9 => {
                let e = self.element(true);
                if self.rng.chance(20) {
                    args!["DEL", format!("nw_{e}")]
                } else {
                    args!["SET", format!("nw_{e}"), self.rng.range(-30, 30)]
                }
            }
            10 => {
                // A fresh unique ALPHA weight.
                self.unique += 1;
                let e = self.element(true);
                args!["SET", format!("aw_{e}"), format!("u{:06}", self.unique)]
            }
            _ => {
                let e = self.element(true);
                args!["HSET", format!("h_{e}"), "n", self.rng.range(-30, 30)]
            }
        }
    }
}

fn random_seed(kite: &KiteServer, redis: &RedisServer, seed: u64, ops: usize, resp3: bool) {
    let label = format!(
        "seed {seed}, {}, {} vs redis-server; reproduce: KITE_SORT_SEEDS={seed} cargo test --test sort random",
        if resp3 { "RESP3" } else { "RESP2" },
        kite.name
    );
    let mut p = Pair::new(kite, redis, resp3, label);
    let mut rng = Rng::new(seed);
    let (numbers, words) = universe(&mut rng);
    let keys = spread_keys(&format!("sort{seed}:"), 12);
    let mut gen = Gen {
        rng,
        lists: keys[0..3].to_vec(),
        sets: keys[3..6].to_vec(),
        zsets: keys[6..9].to_vec(),
        mixed: vec![keys[2].clone(), keys[5].clone(), keys[8].clone()],
        dests: keys[9..12].to_vec(),
        numbers,
        words,
        unique: 0,
    };
    // Weights for every element: numeric ones (some missing, many equal), ALPHA ones
    // (all present, all different), and hashes with both.
    let all: Vec<String> = gen
        .numbers
        .iter()
        .chain(gen.words.iter())
        .cloned()
        .collect();
    let mut mset_n = args!["MSET"];
    let mut mset_a = args!["MSET"];
    let mut order: Vec<usize> = (0..all.len()).collect();
    gen.rng.shuffle(&mut order);
    for (i, e) in all.iter().enumerate() {
        if gen.rng.chance(85) {
            mset_n.extend(args![format!("nw_{e}"), gen.rng.range(-30, 30)]);
        }
        mset_a.extend(args![format!("aw_{e}"), format!("w{:04}", order[i])]);
        let mut h = args![
            "HSET",
            format!("h_{e}"),
            "n",
            gen.rng.range(-30, 30),
            "a",
            format!("h{:04}", order[(i + 7) % all.len()])
        ];
        if gen.rng.chance(50) {
            h.extend(args!["x", gen.rng.range(0, 1000)]);
        }
        p.same(h);
    }
    p.same(mset_n);
    p.same(mset_a);
    p.same(args!["SET", "str", "not a list"]);
    // The containers: small and large (listpack / quicklist, intset / listpack /
    // hashtable, listpack / skiplist).
    for (i, key) in keys[..9].to_vec().iter().enumerate() {
        let mixed = gen.is_mixed(key);
        let n = if i % 3 == 1 {
            300
        } else {
            gen.rng.range(0, 40) as usize
        };
        let mut a = match i / 3 {
            0 => args!["RPUSH", key.as_str()],
            1 => args!["SADD", key.as_str()],
            _ => args!["ZADD", key.as_str()],
        };
        for j in 0..n.max(1) {
            if i / 3 == 2 {
                a.push(gen.rng.range(-50, 50).to_string().into_bytes());
            }
            // Large containers also take numbers no weight key knows (weight 0 / nil).
            let e = if n > 100 && j % 2 == 0 && !mixed {
                format!("{}", 1000 + j)
            } else {
                gen.element(mixed)
            };
            a.push(e.into_bytes());
        }
        p.same(a);
    }
    // ALPHA BY weights for the large containers' extra elements too.
    let mut mset = args!["MSET"];
    let mut hs = Vec::new();
    for j in (0..300).step_by(2) {
        let e = 1000 + j;
        mset.extend(args![format!("aw_{e}"), format!("x{e}")]);
        hs.push(args!["HSET", format!("h_{e}"), "a", format!("x{e}")]);
    }
    p.same(mset);
    for h in hs {
        p.same(h);
    }
    for _ in 0..ops {
        if gen.rng.chance(30) {
            let a = gen.write();
            p.same(a);
        } else {
            let a = gen.sort();
            let store = a
                .iter()
                .position(|x| x.eq_ignore_ascii_case(b"STORE"))
                .map(|i| a[i + 1].clone());
            p.same(a);
            if let Some(dest) = store {
                p.same(args!["LRANGE", dest.clone(), "0", "-1"]);
                p.same(args!["TYPE", dest]);
            }
        }
    }
    print_reply_stats("KITE_SORT_STATS", seed, &p.stats);
}

fn random(threads: usize, seeds: &[u64]) {
    c_locale();
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let ops = usize_from_env("KITE_SORT_OPS", 1500);
    for seed in seeds_from_env("KITE_SORT_SEEDS", seeds) {
        for resp3 in [false, true] {
            random_seed(&kite, &redis, seed, ops, resp3);
        }
    }
}

#[test]
fn random_threads1() {
    random(1, &[1, 2]);
}

#[test]
fn random_threads4() {
    random(4, &[41, 42]);
}

// ---------------------------------------------------------------------------------------
// Sets BY nosort: Redis 7.2's order, as Valkey 8.1 keeps it
// ---------------------------------------------------------------------------------------

/// Intsets come back ascending and listpacks in insertion order (7.2; 7.0 kept such sets
/// in a hash table). Hash-table sets come back in an order of the implementation's
/// own: only the elements are compared.
///
/// When the server under test is a Redis 7.0 (`KITE_BIN=redis-server`, the self-check
/// of this suite) the small sets are compared like the hash tables, elements only.
#[test]
fn set_nosort_order_matches_valkey() {
    c_locale();
    let kite = KiteServer::start(&[], 4);
    let valkey = ValkeyServer::start();
    let mut p = Pair::new(
        &kite,
        &valkey,
        false,
        format!("set order, {} vs valkey", kite.name),
    );
    let info = p
        .kite
        .cmd(&["INFO", "server"])
        .as_string()
        .unwrap_or_default();
    let exact = !info.contains("redis_version:7.0.");
    let as_sorted = |r: &Resp| {
        let mut v: Vec<Vec<u8>> = r
            .as_array()
            .unwrap_or_else(|| panic!("expected an array, got {r}"))
            .iter()
            .map(|x| x.as_bytes().unwrap_or(b"<nil>").to_vec())
            .collect();
        v.sort();
        v
    };
    // Exact, or (7.0 under test) the same elements.
    let order = |p: &mut Pair, a: Args| {
        if exact {
            p.same(a);
        } else {
            let k = p.kite.cmd(&a);
            let v = p.redis.cmd(&a);
            assert_eq!(as_sorted(&k), as_sorted(&v), "{}: {k} vs {v}", fmt_cmd(&a));
        }
    };
    p.same(args!["SADD", "ints", "5", "-3", "100", "0", "7"]);
    p.same(args!["SADD", "pack", "c", "a", "b", "10", "9"]);
    p.same(args!["SREM", "pack", "a"]);
    p.same(args!["SADD", "pack", "a", "z"]);
    p.same(args!["SADD", "mixed", "5", "1"]);
    p.same(args!["SADD", "mixed", "x", "0"]);
    for key in ["ints", "pack", "mixed"] {
        if exact {
            p.same(args!["OBJECT", "ENCODING", key]);
        }
        order(&mut p, args!["SORT", key, "BY", "nosort"]);
        order(&mut p, args!["SORT", key, "BY", "nosort", "DESC"]);
        order(&mut p, args!["SORT", key, "BY", "nosort", "ALPHA"]);
        order(
            &mut p,
            args!["SORT_RO", key, "BY", "constant", "GET", "#", "GET", "w_*"],
        );
        if exact {
            p.same(args!["SORT", key, "BY", "nosort", "LIMIT", "1", "2"]);
            p.same(args![
                "SORT", key, "BY", "nosort", "DESC", "LIMIT", "1", "2"
            ]);
        }
        // With STORE the elements are sorted.
        p.same(args!["SORT", key, "BY", "nosort", "STORE", "{d}"]);
        p.same(args!["LRANGE", "{d}", "0", "-1"]);
    }
    // A hash table: same elements, any order.
    let mut a = args!["SADD", "big"];
    for i in 0..300 {
        a.push(format!("e{i}").into_bytes());
    }
    p.same(a);
    let k = p.kite.cmd(&["SORT", "big", "BY", "nosort"]);
    let v = p.redis.cmd(&["SORT", "big", "BY", "nosort"]);
    assert_eq!(as_sorted(&k), as_sorted(&v));
    let k = p
        .kite
        .cmd(&["SORT", "big", "BY", "nosort", "LIMIT", "10", "20"]);
    assert_eq!(k.as_array().map(|v| v.len()), Some(20), "{k}");
    // With STORE: sorted, identical.
    p.same(args![
        "SORT", "big", "BY", "nosort", "LIMIT", "10", "20", "STORE", "{d}"
    ]);
    p.same(args!["LRANGE", "{d}", "0", "-1"]);
}

// ---------------------------------------------------------------------------------------
// STORE wakes blocked clients
// ---------------------------------------------------------------------------------------

fn wait_blocked(c: &mut Client, n: usize) {
    let want = format!("blocked_clients:{n}");
    for _ in 0..1000 {
        let info = c.cmd(&["INFO", "clients"]).as_string().unwrap_or_default();
        if info.lines().any(|l| l.trim_end() == want) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("never saw {want}");
}

/// A client blocked in BLPOP on the STORE destination is served by SORT ... STORE (the
/// source, the BY keys and the destination on different shards at --threads 4). An empty
/// result deletes the destination and wakes no one.
fn store_wakes(threads: usize) {
    c_locale();
    let kite = KiteServer::start(&[], threads);
    let keys = spread_keys("blk", 4);
    let (src, dst, other) = (keys[0].as_str(), keys[1].as_str(), keys[2].as_str());
    let mut c = kite.client();
    c.cmd(&["RPUSH", src, "3", "1", "2"]);
    c.cmd(&["MSET", "w_1", "3", "w_2", "2", "w_3", "1"]);
    let mut blocked = kite.client();
    blocked.send(&["BLPOP", dst, "10"]);
    wait_blocked(&mut c, 1);
    // Nothing to store: no list appears, the client stays blocked.
    assert_eq!(c.cmd(&["SORT", "nokey", "STORE", dst]), Resp::Integer(0));
    assert_eq!(
        c.cmd(&["SORT", src, "LIMIT", "0", "0", "STORE", dst]),
        Resp::Integer(0)
    );
    assert_eq!(c.cmd(&["EXISTS", dst]), Resp::Integer(0));
    assert_eq!(
        c.cmd(&["SORT", src, "BY", "w_*", "STORE", dst]),
        Resp::Integer(3)
    );
    assert_eq!(blocked.read(), bulks(&[dst, "3"]));
    assert_eq!(c.cmd(&["LRANGE", dst, "0", "-1"]), bulks(&["2", "1"]));
    // BLMOVE waiting on a missing source, served by a STORE into it.
    c.cmd(&["DEL", dst]);
    blocked.send(&["BLMOVE", dst, other, "RIGHT", "LEFT", "10"]);
    wait_blocked(&mut c, 1);
    assert_eq!(
        c.cmd(&["SORT", src, "DESC", "GET", "#", "STORE", dst]),
        Resp::Integer(3)
    );
    assert_eq!(blocked.read(), Resp::bulk("1"));
    assert_eq!(c.cmd(&["LRANGE", dst, "0", "-1"]), bulks(&["3", "2"]));
    assert_eq!(c.cmd(&["LRANGE", other, "0", "-1"]), bulks(&["1"]));
    // Inside MULTI: served at EXEC.
    c.cmd(&["DEL", dst]);
    blocked.send(&["BRPOP", dst, "10"]);
    wait_blocked(&mut c, 1);
    c.cmd(&["MULTI"]);
    c.cmd(&["SORT", src, "STORE", dst]);
    c.cmd(&["RPUSH", dst, "last"]);
    assert_eq!(
        c.cmd(&["EXEC"]),
        Resp::Array(vec![Resp::Integer(3), Resp::Integer(4)])
    );
    assert_eq!(blocked.read(), bulks(&[dst, "last"]));
    assert_eq!(c.cmd(&["LRANGE", dst, "0", "-1"]), bulks(&["1", "2", "3"]));
}

#[test]
fn store_wakes_blocked_client_threads1() {
    store_wakes(1);
}

#[test]
fn store_wakes_blocked_client_threads4() {
    store_wakes(4);
}
