//! Sorted sets: differential tests against a real redis-server, and Kite-only tests at
//! `--threads 1` and `--threads 4`.
//!
//! The reference is Redis 7.0 while Kite follows 7.2. Where they differ the comparison
//! is tolerant of exactly that difference, no more:
//! - scores: 7.0 prints `%.17g` (`0.10000000000000001`), 7.2 the shortest text that
//!   reads back the same (`0.1`); scores are compared as the doubles they denote;
//! - ZRANK/ZREVRANK WITHSCORE is new in 7.2: tested on Kite alone;
//! - a ZADD of more than 128 pairs makes a skiplist at once in 7.2 even when the pairs
//!   repeat members, where 7.0 fills a listpack first (which keeps -0 as 0) and converts
//!   it at the 129th member: the generator's big ZADDs only add distinct new members, and
//!   never with score -0.
//!
//! Reproduce one seed: `KITE_ZSET_SEEDS=7 cargo test --release --test zsets`; longer runs:
//! `KITE_ZSET_OPS=20000`.

#[macro_use]
mod common;

use common::*;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

// ---------------------------------------------------------------------------
// Comparing replies
// ---------------------------------------------------------------------------

/// The double a score text denotes (`inf`, `-inf`, `1e+20`...).
fn as_score(b: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(b).ok()?;
    if s.is_empty() || s.starts_with(' ') {
        return None;
    }
    s.parse::<f64>().ok()
}

/// Equal, or equal once every text that reads as a number is read as its double (the
/// bits must match, so `-0` and `0` still differ).
fn same_modulo_score_text(k: &Resp, r: &Resp) -> bool {
    let num = |a: &[u8], b: &[u8]| match (as_score(a), as_score(b)) {
        (Some(x), Some(y)) => x.to_bits() == y.to_bits(),
        _ => false,
    };
    match (k, r) {
        (Resp::Bulk(a), Resp::Bulk(b)) => a == b || num(a, b),
        (Resp::Double(a), Resp::Double(b)) => a == b || num(a.as_bytes(), b.as_bytes()),
        (Resp::Array(x), Resp::Array(y))
        | (Resp::Set(x), Resp::Set(y))
        | (Resp::Push(x), Resp::Push(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_modulo_score_text(a, b))
        }
        (Resp::Map(x), Resp::Map(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|((a, b), (c, d))| {
                    same_modulo_score_text(a, c) && same_modulo_score_text(b, d)
                })
        }
        _ => k == r,
    }
}

/// Connections to Kite and to redis-server, with the recent history for failures.
struct Pair {
    kite: Client,
    redis: Client,
    history: VecDeque<String>,
    label: String,
    count: usize,
    stats: BTreeMap<String, (usize, usize)>,
    resp3: bool,
}

impl Pair {
    fn new(kite: &KiteServer, redis: &RedisServer, resp3: bool, label: String) -> Pair {
        let mut p = Pair {
            kite: kite.client(),
            redis: redis.client(),
            history: VecDeque::new(),
            label,
            count: 0,
            stats: BTreeMap::new(),
            resp3,
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

    fn fail(&self, args: &Args, kite: &str, redis: &str) -> ! {
        let hist: Vec<String> = self.history.iter().cloned().collect();
        panic!(
            "\nZSET DIFFERENTIAL MISMATCH ({})\n  command #{}: {}\n  kite:  {}\n  redis: {}\n\
             last commands (oldest first):\n    {}\n",
            self.label,
            self.count,
            fmt_cmd(args),
            kite,
            redis,
            hist.join("\n    ")
        );
    }

    fn note(&mut self, args: &Args, reply: &Resp) {
        let mut line = format!("#{} {} -> {}", self.count, fmt_cmd(args), reply);
        if line.len() > 400 {
            let mut cut = 400;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str("...");
        }
        self.history.push_back(line);
        if self.history.len() > usize_from_env("KITE_ZSET_HISTORY", 30) {
            self.history.pop_front();
        }
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let e = self.stats.entry(name).or_default();
        if reply.is_error() {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
        self.count += 1;
    }

    /// Runs a command on both; returns (kite, redis) replies without comparing.
    fn both(&mut self, args: &Args) -> (Resp, Resp) {
        self.kite.send(args);
        let k = self.kite.try_read();
        self.redis.send(args);
        let r = self.redis.try_read();
        match (k, r) {
            (Ok(k), Ok(r)) => (k, r),
            (k, r) => {
                let k = k.map_or_else(|e| format!("<no reply: {e}>"), |x| x.to_string());
                let r = r.map_or_else(|e| format!("<no reply: {e}>"), |x| x.to_string());
                self.fail(args, &k, &r)
            }
        }
    }

    /// Runs a command on both and compares the replies (scores as doubles).
    fn run(&mut self, args: Args) -> Resp {
        let (k, r) = self.both(&args);
        if !same_modulo_score_text(&k, &r) {
            self.fail(&args, &k.to_string(), &r.to_string());
        }
        self.note(&args, &r);
        r
    }

    /// Runs a line of space-separated words.
    fn line(&mut self, line: &str) -> Resp {
        self.run(line.split(' ').map(|s| s.as_bytes().to_vec()).collect())
    }

    /// ZRANDMEMBER: the same shape on both; Kite's members must be in the set with the
    /// scores it reports, and distinct for a positive count.
    fn randmember(&mut self, args: Args) {
        let (k, r) = self.both(&args);
        let shape_ok = match (&k, &r) {
            (Resp::Array(a), Resp::Array(b)) => a.len() == b.len(),
            (Resp::Bulk(_), Resp::Bulk(_)) => true,
            _ => k == r,
        };
        if !shape_ok {
            self.fail(&args, &k.to_string(), &r.to_string());
        }
        let withscores = args.len() == 4;
        let count: Option<i64> = args
            .get(2)
            .and_then(|a| std::str::from_utf8(a).ok()?.parse().ok());
        let mut picked: Vec<(Vec<u8>, Option<Resp>)> = Vec::new();
        match &k {
            Resp::Bulk(m) => picked.push((m.clone(), None)),
            Resp::Array(items) if withscores => {
                if self.resp3 {
                    for it in items {
                        let pair = it.as_array().expect("pair");
                        picked.push((pair[0].as_bytes().unwrap().to_vec(), Some(pair[1].clone())));
                    }
                } else {
                    for ch in items.chunks(2) {
                        picked.push((ch[0].as_bytes().unwrap().to_vec(), Some(ch[1].clone())));
                    }
                }
            }
            Resp::Array(items) => {
                for it in items {
                    picked.push((it.as_bytes().expect("member").to_vec(), None));
                }
            }
            _ => {}
        }
        for (m, score) in &picked {
            let s = self
                .kite
                .cmd(&[b"ZSCORE".to_vec(), args[1].clone(), m.clone()]);
            assert!(
                !s.is_null(),
                "{}: ZRANDMEMBER returned {} which is not in the set ({})",
                self.label,
                String::from_utf8_lossy(m),
                fmt_cmd(&args)
            );
            if let Some(sc) = score {
                assert!(
                    same_modulo_score_text(sc, &s),
                    "{}: score {sc} vs ZSCORE {s}",
                    self.label
                );
            }
        }
        if count.is_some_and(|c| c > 0) {
            let distinct: HashSet<&Vec<u8>> = picked.iter().map(|(m, _)| m).collect();
            assert_eq!(
                distinct.len(),
                picked.len(),
                "{}: repeated members in {}",
                self.label,
                fmt_cmd(&args)
            );
        }
        self.note(&args, &r);
    }

    /// A full ZSCAN on both sides: the same (member, score) set.
    fn full_scan(&mut self, key: &[u8], count: usize) {
        let mut sides = Vec::new();
        for c in [&mut self.kite, &mut self.redis] {
            let mut cursor = b"0".to_vec();
            let mut seen: HashSet<(Vec<u8>, u64)> = HashSet::new();
            let mut err = None;
            for _ in 0..100_000 {
                let r = c.cmd(&[
                    b"ZSCAN".to_vec(),
                    key.to_vec(),
                    cursor.clone(),
                    b"COUNT".to_vec(),
                    count.to_string().into_bytes(),
                ]);
                let Some(parts) = r.as_array() else {
                    err = Some(r.clone());
                    break;
                };
                cursor = parts[0].as_bytes().unwrap().to_vec();
                let items = parts[1].as_array().unwrap();
                for ch in items.chunks(2) {
                    let s = as_score(ch[1].as_bytes().unwrap()).expect("score text");
                    seen.insert((ch[0].as_bytes().unwrap().to_vec(), s.to_bits()));
                }
                if cursor == b"0" {
                    break;
                }
            }
            sides.push((seen, err));
        }
        let args = args!["ZSCAN", key, "<full>"];
        if sides[0] != sides[1] {
            self.fail(
                &args,
                &format!("{:?}", sides[0].1),
                &format!("{:?} (sets differ)", sides[1].1),
            );
        }
        self.note(&args, &Resp::Integer(sides[1].0.len() as i64));
    }
}

// ---------------------------------------------------------------------------
// The random generator
// ---------------------------------------------------------------------------

/// Keys that stay small listpacks (few short members): every command, lex ranges with
/// any scores included (Redis walks a listpack in order, so the answer is defined).
const SMALL: &[&str] = &["z1", "z2", "{q}z1", "{q}z2"];
/// Keys whose members all score 0: lex ranges stay defined when they grow big.
const LEX: &[&str] = &["lex", "{q}lex"];
/// Keys that become skiplists (bulk adds, long members): no lex ranges.
const BIG: &[&str] = &["big", "{q}big"];
/// Destinations of the STORE commands.
const DST: &[&str] = &["dst", "{q}dst", "{x}dst"];
/// Keys of other types.
const WRONG: &[&str] = &["str", "{q}str", "lst"];
const MISSING: &[&str] = &["missing", "{q}missing"];

const MEMBERS: &[&str] = &[
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m", "n", "p", "10", "-5", "007", "x y",
    "", "\u{e9}", "A", "zz",
];
const SCORES: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "-2",
    "5",
    "10",
    "2.5",
    "-0.5",
    "0.25",
    "100",
    "+inf",
    "-inf",
    "1e3",
    "9007199254740991",
    "-0",
    "0.1",
    "1.5e-7",
    "1e20",
    "-3.75",
];
const BAD_SCORES: &[&str] = &["abc", "", " 1", "nan", "1e400", "(1", "1e-400", "--1"];
const BOUNDS: &[&str] = &[
    "-inf", "+inf", "(1", "1", "0", "(0", "2.5", "5", "(5", "10", "-1", "(", "(-inf", "+inf",
    "1e20", "(2.5",
];
const BAD_BOUNDS: &[&str] = &["abc", "1x", "nan", "((1"];
const LEX_BOUNDS: &[&str] = &[
    "-", "+", "[a", "(a", "[c", "(e", "[m", "[p", "(z", "[", "(", "[0", "(10", "[x y", "[b",
];
const BAD_LEX: &[&str] = &["a", "+x", "--", ""];

struct Gen {
    rng: Rng,
    fresh: u64,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
            fresh: 0,
        }
    }

    fn pick(&mut self, set: &[&str]) -> Vec<u8> {
        self.rng.pick(set).as_bytes().to_vec()
    }

    /// Any key, for reads and for commands that cannot break the key classes.
    fn any_key(&mut self) -> Vec<u8> {
        match self.rng.below(20) {
            0..=5 => self.pick(SMALL),
            6..=8 => self.pick(LEX),
            9..=12 => self.pick(BIG),
            13..=15 => self.pick(DST),
            16..=17 => self.pick(WRONG),
            _ => self.pick(MISSING),
        }
    }

    /// A key lex ranges may be used on.
    fn lex_key(&mut self) -> Vec<u8> {
        match self.rng.below(10) {
            0..=4 => self.pick(SMALL),
            5..=7 => self.pick(LEX),
            8 => self.pick(WRONG),
            _ => self.pick(MISSING),
        }
    }

    fn member(&mut self) -> Vec<u8> {
        self.pick(MEMBERS)
    }

    fn long_member(&mut self) -> Vec<u8> {
        let mut m = vec![b'L'; 64];
        m.extend_from_slice(self.rng.range(0, 5).to_string().as_bytes());
        m
    }

    fn score(&mut self) -> Vec<u8> {
        if self.rng.chance(3) {
            self.pick(BAD_SCORES)
        } else {
            self.pick(SCORES)
        }
    }

    fn bound(&mut self) -> Vec<u8> {
        if self.rng.chance(3) {
            self.pick(BAD_BOUNDS)
        } else {
            self.pick(BOUNDS)
        }
    }

    fn lex_bound(&mut self) -> Vec<u8> {
        if self.rng.chance(3) {
            self.pick(BAD_LEX)
        } else {
            self.pick(LEX_BOUNDS)
        }
    }

    fn rank(&mut self) -> Vec<u8> {
        match self.rng.below(12) {
            0 => self.pick(&["a", "1.5", "", "99999999999999999999"]),
            1 => self.pick(&["100", "-100", "9223372036854775807", "-9223372036854775808"]),
            _ => self.rng.range(-6, 6).to_string().into_bytes(),
        }
    }

    fn zadd(&mut self) -> Args {
        let class = self.rng.below(10);
        let (key, lex) = match class {
            0..=4 => (self.pick(SMALL), false),
            5..=6 => (self.pick(LEX), true),
            7..=8 => (self.pick(BIG), false),
            _ => (self.pick(WRONG), false),
        };
        let mut a = args!["ZADD", key.clone()];
        let flags: &[&str] = &["NX", "XX", "GT", "LT", "CH", "INCR"];
        if self.rng.chance(40) {
            for _ in 0..self.rng.range(1, 3) {
                let f = self.pick(flags);
                let f = if self.rng.chance(30) {
                    f.to_ascii_lowercase()
                } else {
                    f
                };
                a.push(f);
            }
        }
        let bulk = !lex && BIG.contains(&std::str::from_utf8(&key).unwrap()) && self.rng.chance(15);
        let lex_bulk = lex && self.rng.chance(5);
        if bulk || lex_bulk {
            // Distinct new members, all added (see the header on 7.0 and 7.2).
            a.truncate(2);
            if self.rng.chance(30) {
                a.push(self.pick(&["NX", "CH", "GT"]));
            }
            let n = self.rng.range(129, 150);
            for _ in 0..n {
                self.fresh += 1;
                // Not -0: 7.0 builds the set as a listpack first and stores it as 0.
                let s = if lex_bulk {
                    b"0".to_vec()
                } else {
                    let mut s = self.pick(SCORES);
                    if s == b"-0" {
                        s = b"0".to_vec();
                    }
                    s
                };
                a.push(s);
                a.push(format!("b{:05}", self.fresh).into_bytes());
            }
            return a;
        }
        let pairs = if self.rng.chance(80) {
            1
        } else {
            self.rng.range(2, 4)
        };
        for _ in 0..pairs {
            let s = if lex { b"0".to_vec() } else { self.score() };
            a.push(s);
            let m =
                if !lex && BIG.contains(&std::str::from_utf8(&key).unwrap()) && self.rng.chance(20)
                {
                    self.long_member()
                } else {
                    self.member()
                };
            a.push(m);
        }
        if self.rng.chance(3) {
            a.pop();
        }
        a
    }

    fn range_opts(&mut self, a: &mut Args, store: bool, lex: bool) {
        if self.rng.chance(30) {
            a.push(b"LIMIT".to_vec());
            a.push(self.rng.range(-1, 3).to_string().into_bytes());
            a.push(self.rng.range(-1, 4).to_string().into_bytes());
        }
        if !store && !lex && self.rng.chance(40) {
            a.push(b"WITHSCORES".to_vec());
        }
        if self.rng.chance(3) {
            a.push(self.pick(&["LIMIT", "WITHSCORES", "REV", "BYSCORE", "FOO", "BYLEX"]));
        }
    }

    /// ZRANGE or ZRANGESTORE with every option combination.
    fn zrange(&mut self, store: bool) -> Args {
        let kind = self.rng.below(3);
        let mut a = if store {
            let src = if kind == 2 {
                self.lex_key()
            } else {
                self.any_key()
            };
            args!["ZRANGESTORE", self.pick(DST), src]
        } else {
            let src = if kind == 2 {
                self.lex_key()
            } else {
                self.any_key()
            };
            args!["ZRANGE", src]
        };
        match kind {
            0 => {
                a.push(self.rank());
                a.push(self.rank());
            }
            1 => {
                a.push(self.bound());
                a.push(self.bound());
                a.push(b"BYSCORE".to_vec());
            }
            _ => {
                a.push(self.lex_bound());
                a.push(self.lex_bound());
                a.push(b"BYLEX".to_vec());
            }
        }
        if self.rng.chance(40) {
            a.push(b"REV".to_vec());
        }
        let lex_opts = kind == 2 && self.rng.chance(90);
        self.range_opts(&mut a, store, lex_opts);
        // Options in any order.
        if a.len() > 5 && self.rng.chance(30) {
            let n = a.len() - 4;
            let (i, j) = (4 + self.rng.index(n), 4 + self.rng.index(n));
            a.swap(i, j);
        }
        a
    }

    fn setop(&mut self) -> Args {
        let (name, store) = *self.rng.pick(&[
            ("ZUNION", false),
            ("ZINTER", false),
            ("ZDIFF", false),
            ("ZINTERCARD", false),
            ("ZUNIONSTORE", true),
            ("ZINTERSTORE", true),
            ("ZDIFFSTORE", true),
        ]);
        let mut a = args![name];
        if store {
            a.push(self.pick(DST));
        }
        let n = self.rng.range(1, 4) as usize;
        let numkeys = match self.rng.below(25) {
            0 => "0".to_string(),
            1 => (n + 2).to_string(),
            2 => "x".to_string(),
            _ => n.to_string(),
        };
        a.push(numkeys.into_bytes());
        for _ in 0..n {
            let k = if self.rng.chance(10) {
                self.pick(WRONG)
            } else {
                self.any_key()
            };
            a.push(k);
        }
        if name != "ZDIFF" && name != "ZDIFFSTORE" && name != "ZINTERCARD" {
            if self.rng.chance(40) {
                a.push(b"WEIGHTS".to_vec());
                for _ in 0..n {
                    a.push(self.pick(&["1", "2", "-1", "0", "0.5", "3", "inf"]));
                }
                if self.rng.chance(5) {
                    let last = a.len() - 1;
                    a[last] = b"x".to_vec();
                }
            }
            if self.rng.chance(40) {
                a.push(b"AGGREGATE".to_vec());
                a.push(self.pick(&["SUM", "MIN", "MAX", "min", "FOO"]));
            }
        }
        if name == "ZINTERCARD" && self.rng.chance(50) {
            a.push(b"LIMIT".to_vec());
            a.push(self.pick(&["0", "1", "2", "-1", "x"]));
        }
        if !store && name != "ZINTERCARD" && self.rng.chance(50) {
            a.push(b"WITHSCORES".to_vec());
        }
        if self.rng.chance(3) {
            a.push(self.pick(&["WEIGHTS", "FOO", "WITHSCORES", "AGGREGATE"]));
        }
        a
    }

    /// The next command: (args, is ZRANDMEMBER).
    fn next(&mut self) -> (Args, Step) {
        let key = self.any_key();
        let a = match self.rng.below(100) {
            0..=17 => self.zadd(),
            18..=21 => {
                let k = if self.rng.chance(80) {
                    self.pick(SMALL)
                } else {
                    self.pick(BIG)
                };
                args!["ZINCRBY", k, self.score(), self.member()]
            }
            22..=25 => {
                let mut a = args!["ZREM", key];
                for _ in 0..self.rng.range(1, 3) {
                    a.push(self.member());
                }
                a
            }
            26..=28 => args!["ZSCORE", key, self.member()],
            29..=30 => {
                let mut a = args!["ZMSCORE", key];
                for _ in 0..self.rng.range(1, 3) {
                    a.push(self.member());
                }
                a
            }
            31..=33 => {
                let cmd = self.pick(&["ZRANK", "ZREVRANK"]);
                args![cmd, key, self.member()]
            }
            34 => args!["ZCARD", key],
            35..=44 => self.zrange(false),
            45..=47 => self.zrange(true),
            48..=51 => {
                let cmd = self.pick(&["ZRANGEBYSCORE", "ZREVRANGEBYSCORE"]);
                let mut a = args![cmd, key, self.bound(), self.bound()];
                self.range_opts(&mut a, false, false);
                a
            }
            52..=54 => {
                let cmd = self.pick(&["ZRANGEBYLEX", "ZREVRANGEBYLEX"]);
                let mut a = args![cmd, self.lex_key(), self.lex_bound(), self.lex_bound()];
                self.range_opts(&mut a, false, true);
                a
            }
            55..=56 => {
                let mut a = args!["ZREVRANGE", key, self.rank(), self.rank()];
                if self.rng.chance(40) {
                    a.push(self.pick(&["WITHSCORES", "withscores", "LIMIT"]));
                }
                a
            }
            57..=59 => args!["ZCOUNT", key, self.bound(), self.bound()],
            60..=61 => args![
                "ZLEXCOUNT",
                self.lex_key(),
                self.lex_bound(),
                self.lex_bound()
            ],
            62..=63 => args!["ZREMRANGEBYSCORE", key, self.bound(), self.bound()],
            64..=65 => args!["ZREMRANGEBYRANK", key, self.rank(), self.rank()],
            66..=67 => args![
                "ZREMRANGEBYLEX",
                self.lex_key(),
                self.lex_bound(),
                self.lex_bound()
            ],
            68..=72 => {
                let cmd = self.pick(&["ZPOPMIN", "ZPOPMAX"]);
                let mut a = args![cmd, key];
                if self.rng.chance(50) {
                    a.push(self.pick(&["0", "1", "2", "5", "200", "-1", "x"]));
                }
                a
            }
            73..=76 => {
                let n = self.rng.range(1, 3) as usize;
                let mut a = args!["ZMPOP", n];
                for _ in 0..n {
                    a.push(self.any_key());
                }
                a.push(self.pick(&["MIN", "MAX", "min", "FOO"]));
                if self.rng.chance(50) {
                    a.push(b"COUNT".to_vec());
                    a.push(self.pick(&["1", "3", "0", "-1", "300"]));
                }
                if self.rng.chance(5) {
                    a[1] = self.pick(&["0", "5", "x", "-1"]);
                }
                a
            }
            77..=86 => self.setop(),
            87..=88 => {
                // Lists report other encodings in 7.0.
                let k = if WRONG.iter().any(|w| w.as_bytes() == key.as_slice()) {
                    self.pick(BIG)
                } else {
                    key
                };
                args!["OBJECT", "ENCODING", k]
            }
            89 => args!["TYPE", key],
            90 => args!["DEL", self.any_key()],
            91..=92 => {
                // ZSCAN of a listpack is one deterministic reply.
                let mut a = args![
                    "ZSCAN",
                    self.pick(SMALL),
                    self.pick(&["0", "0", "-1", "x", ""])
                ];
                if self.rng.chance(40) {
                    a.push(b"MATCH".to_vec());
                    a.push(self.pick(&["*", "a*", "[a-e]", "*0*", "?"]));
                }
                if self.rng.chance(20) {
                    a.push(b"COUNT".to_vec());
                    a.push(self.pick(&["1", "0", "x", "100"]));
                }
                a
            }
            93..=95 => {
                let mut a = args!["ZRANDMEMBER", key];
                if self.rng.chance(80) {
                    a.push(self.pick(&["1", "3", "-3", "0", "50", "-200", "200", "x"]));
                    if self.rng.chance(50) {
                        a.push(self.pick(&["WITHSCORES", "withscores", "FOO"]));
                    }
                }
                return (a, Step::RandMember);
            }
            96 => return (args![key], Step::FullScan),
            _ => args!["EXISTS", key],
        };
        (a, Step::Compare)
    }
}

enum Step {
    Compare,
    RandMember,
    FullScan,
}

fn init_keys(p: &mut Pair) {
    p.line("SET str hello");
    p.line("SET {q}str world");
    p.line("RPUSH lst a b");
}

fn run_seed(
    kite: &KiteServer,
    redis: &RedisServer,
    seed: u64,
    ops: usize,
    resp3: bool,
    test: &str,
) {
    let label = format!(
        "seed {seed}, {}, {} vs redis-server; reproduce: KITE_ZSET_SEEDS={seed} cargo test --release --test zsets {test}",
        if resp3 { "RESP3" } else { "RESP2" },
        kite.name
    );
    let mut p = Pair::new(kite, redis, resp3, label);
    init_keys(&mut p);
    let mut g = Gen::new(seed);
    while p.count < ops {
        match g.next() {
            (a, Step::Compare) => {
                p.run(a);
            }
            (a, Step::RandMember) => p.randmember(a),
            (a, Step::FullScan) => {
                let count = *g.rng.pick(&[1usize, 3, 10, 50]);
                p.full_scan(&a[0], count);
            }
        }
    }
    // The final state, key by key.
    for k in SMALL.iter().chain(LEX).chain(BIG).chain(DST) {
        p.run(args!["ZRANGE", *k, "0", "-1", "WITHSCORES"]);
        p.run(args!["OBJECT", "ENCODING", *k]);
        p.full_scan(k.as_bytes(), 7);
    }
    print_reply_stats("KITE_ZSET_STATS", seed, &p.stats);
}

fn differential(threads: usize, seeds: &[u64], resp3: bool, test: &str) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let ops = usize_from_env("KITE_ZSET_OPS", 4000);
    for seed in seeds_from_env("KITE_ZSET_SEEDS", seeds) {
        run_seed(&kite, &redis, seed, ops, resp3, test);
    }
}

#[test]
fn random_zset_commands_threads1() {
    differential(1, &[1, 2, 3], false, "random_zset_commands_threads1");
}

#[test]
fn random_zset_commands_threads4() {
    differential(4, &[11, 12, 13, 14], false, "random_zset_commands_threads4");
}

#[test]
fn random_zset_commands_threads1_resp3() {
    differential(1, &[21, 22], true, "random_zset_commands_threads1_resp3");
}

#[test]
fn random_zset_commands_threads4_resp3() {
    differential(
        4,
        &[31, 32, 33],
        true,
        "random_zset_commands_threads4_resp3",
    );
}

// ---------------------------------------------------------------------------
// Scripted differential scenarios
// ---------------------------------------------------------------------------

fn scripted(p: &mut Pair, lines: &[&str]) {
    for l in lines {
        p.line(l);
    }
}

#[test]
fn zset_errors_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    for resp3 in [false, true] {
        let mut p = Pair::new(&kite, &redis, resp3, format!("errors, resp3={resp3}"));
        scripted(
            &mut p,
            &[
                "SET s x",
                "ZADD z 1 a 2 b 3 c",
                // ZADD's option conflicts, in Redis's order of checks.
                "ZADD z NX XX 1 a",
                "ZADD z GT LT 1 a",
                "ZADD z GT NX 1 a",
                "ZADD z LT NX 1 a",
                "ZADD z NX XX GT 1 a",
                "ZADD z INCR 1 a 2 b",
                "ZADD z NX XX INCR 1 a 2 b",
                "ZADD z abc a",
                "ZADD z 1 a abc b",
                "ZADD z nan a",
                "ZADD z 1",
                "ZADD z nx",
                "ZADD z 1 a 2",
                "ZADD z nx 1",
                "ZADD s 1 a",
                "ZADD s XX 1 a",
                "ZADD z INCR inf a",
                "ZADD z INCR -inf a",
                "ZSCORE z a",
                "ZINCRBY z inf b",
                "ZINCRBY z -inf b",
                "ZINCRBY z nx a",
                "ZINCRBY z abc a",
                "ZINCRBY s 1 a",
                "ZADD z XX INCR 1 nosuch",
                "ZADD z GT INCR -1 a",
                "ZADD z XX 5 nosuch",
                // Reads on the wrong type.
                "ZSCORE s a",
                "ZMSCORE s a",
                "ZCARD s",
                "ZRANK s a",
                "ZCOUNT s 0 1",
                "ZLEXCOUNT s - +",
                "ZRANGE s 0 1",
                "ZRANGEBYSCORE s 0 1",
                "ZRANGEBYLEX s - +",
                "ZREVRANGE s 0 1",
                "ZREM s a",
                "ZPOPMIN s",
                "ZPOPMAX s 0",
                "ZRANDMEMBER s",
                "ZRANDMEMBER s 0",
                "ZSCAN s 0",
                "ZREMRANGEBYRANK s 0 1",
                "ZREMRANGEBYSCORE s 0 1",
                "ZREMRANGEBYLEX s - +",
                // Range syntax.
                "ZRANGE z 0 -1 LIMIT 0 1",
                "ZRANGE z - + BYLEX WITHSCORES",
                "ZRANGEBYLEX z - + WITHSCORES",
                "ZRANGE z 0 1 foo",
                "ZRANGE z a b",
                "ZRANGE z 0 1 BYSCORE BYLEX",
                "ZRANGE z 0 1 REV REV",
                "ZRANGE z 0 1 BYSCORE LIMIT 0",
                "ZRANGE z 0 1 BYSCORE LIMIT a 1",
                "ZRANGE z 0 1 BYSCORE LIMIT 0 b",
                "ZRANGE z 0 1 foo LIMIT 0 1",
                "ZRANGE z x y BYSCORE",
                "ZRANGE z x y BYLEX",
                "ZREVRANGE z 0 1 REV",
                "ZREVRANGE z 0 1 LIMIT 0 1",
                "ZRANGEBYSCORE z 0 1 BYSCORE",
                "ZRANGEBYSCORE z a 1",
                "ZRANGEBYSCORE z (a 1",
                "ZCOUNT z a 1",
                "ZCOUNT z 1 nan",
                "ZLEXCOUNT z a b",
                "ZLEXCOUNT z [a +b",
                "ZREMRANGEBYRANK z a 1",
                "ZREMRANGEBYSCORE z 1 x",
                "ZREMRANGEBYLEX z x -",
                "ZRANGESTORE d z 0 1 WITHSCORES",
                "ZRANGESTORE d s 0 1",
                "ZRANGESTORE d z 0 -1 LIMIT 0 1",
                "ZRANGESTORE d z - + BYLEX REV",
                // Pops.
                "ZPOPMIN z -1",
                "ZPOPMIN z abc",
                "ZPOPMIN z 1 2",
                "ZPOPMIN nokey 0",
                "ZPOPMIN nokey",
                "ZMPOP 0 z MIN",
                "ZMPOP -1 z MIN",
                "ZMPOP x z MIN",
                "ZMPOP 1 z FOO",
                "ZMPOP 2 z MIN",
                "ZMPOP 3 z nokey MIN",
                "ZMPOP 1 z MIN COUNT 0",
                "ZMPOP 1 z MIN COUNT -1",
                "ZMPOP 1 z MIN COUNT x",
                "ZMPOP 1 z MIN COUNT 1 COUNT 2",
                "ZMPOP 1 z MIN COUNT",
                "ZMPOP 1 z MIN FOO",
                "ZMPOP 2 nokey s MIN",
                "ZMPOP 2 s z MIN",
                "ZMPOP 2 z s MIN",
                // Set operations.
                "ZUNION 0 z",
                "ZUNION -1 z",
                "ZUNION x z",
                "ZUNION 3 z z",
                "ZUNION 2 z s",
                "ZUNION 2 s z WEIGHTS x",
                "ZUNION 2 z z WEIGHTS 1",
                "ZUNION 2 z z WEIGHTS 1 x",
                "ZUNION 2 z z WEIGHTS 1 2 3",
                "ZUNION 2 z z AGGREGATE",
                "ZUNION 2 z z AGGREGATE FOO",
                "ZUNION 2 z z FOO",
                "ZUNIONSTORE d 2 z z WITHSCORES",
                "ZUNIONSTORE d 0 z",
                "ZINTERSTORE d 0 z",
                "ZDIFFSTORE d 0 z",
                "ZDIFF 1 z WEIGHTS 1",
                "ZDIFF 1 z AGGREGATE SUM",
                "ZDIFFSTORE d 1 z WITHSCORES",
                "ZINTERCARD 0 z",
                "ZINTERCARD 1 z WITHSCORES",
                "ZINTERCARD 1 z LIMIT -1",
                "ZINTERCARD 1 z LIMIT x",
                "ZINTERCARD 1 z LIMIT",
                "ZINTERCARD 1 z WEIGHTS 1",
                "ZINTERCARD 2 z s",
                "ZINTER 2 z s",
                "ZDIFF 2 s z",
                // ZRANDMEMBER and ZSCAN arguments.
                "ZRANDMEMBER z x",
                "ZRANDMEMBER z 1 foo",
                "ZRANDMEMBER z 1 WITHSCORES x",
                "ZRANDMEMBER z -9223372036854775808",
                "ZRANDMEMBER z -9223372036854775807 WITHSCORES",
                "ZRANDMEMBER z 9223372036854775807 WITHSCORES",
                "ZRANDMEMBER z 4611686018427387904 WITHSCORES",
                "ZRANDMEMBER nokey 5",
                "ZRANDMEMBER nokey",
                "ZSCAN z x",
                "ZSCAN z 0 COUNT 0",
                "ZSCAN z 0 COUNT x",
                "ZSCAN z 0 MATCH",
                "ZSCAN z 0 FOO bar",
                "ZSCAN z 0 TYPE zset",
                "ZSCAN nokey 0 FOO",
                "ZSCAN z 18446744073709551616",
                "ZSCAN z 18446744073709551615",
                "ZSCAN z -1",
                "ZSCAN z +0",
                // Arity.
                "ZADD z",
                "ZINCRBY z 1",
                "ZRANGE z 0",
                "ZRANGESTORE d z 0",
                "ZUNIONSTORE d",
                "ZMPOP 1",
                "ZCARD",
                "ZSCORE z",
                "ZREM z",
                "ZRANDMEMBER",
                "ZSCAN z",
            ],
        );
    }
}

#[test]
fn zset_replies_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    for resp3 in [false, true] {
        let mut p = Pair::new(&kite, &redis, resp3, format!("replies, resp3={resp3}"));
        scripted(
            &mut p,
            &[
                "ZADD z 1 a 2 b 3 c 4 d 5 e",
                "ZADD z CH GT 10 a 0 b 5 newm",
                "ZADD z CH LT 10 a 0 b",
                "ZADD z XX CH 7 c 7 nosuch",
                "ZADD z NX 9 c 9 fresh",
                "ZADD z INCR 2.5 a",
                "ZADD z INCR -0.5 brand",
                "ZINCRBY z 0.1 brand",
                "ZINCRBY z -0 new0",
                "ZSCORE z new0",
                "ZRANGE z 0 -1 WITHSCORES",
                "ZRANGE z 0 -1 REV WITHSCORES",
                "ZRANGE z -3 -1",
                "ZRANGE z 5 1",
                "ZRANGE z 100 200",
                "ZRANGE z (1 +inf BYSCORE WITHSCORES LIMIT 1 3",
                "ZRANGE z +inf -inf BYSCORE REV LIMIT 0 2 WITHSCORES",
                "ZRANGE z 5 1 BYSCORE REV",
                "ZRANGE z -inf +inf BYSCORE LIMIT -1 3",
                "ZRANGE z -inf +inf BYSCORE LIMIT 2 -1",
                "ZRANGE z -inf +inf BYSCORE LIMIT 2 0",
                "ZRANGEBYSCORE z -inf +inf WITHSCORES",
                "ZREVRANGEBYSCORE z (5 (1 WITHSCORES",
                "ZREVRANGE z 0 2 WITHSCORES",
                "ZCOUNT z (1 (5",
                "ZCOUNT z 5 1",
                "ZCOUNT z ( (",
                "ZRANK z c",
                "ZREVRANK z c",
                "ZRANK z nosuch",
                "ZRANK nokey a",
                "ZMSCORE z a nosuch c",
                "ZMSCORE nokey a",
                "ZADD lx 0 alpha 0 bar 0 baz 0 foo 0 zap 0 zip",
                "ZRANGEBYLEX lx - +",
                "ZRANGEBYLEX lx [b (f",
                "ZRANGEBYLEX lx (bar [zap LIMIT 1 2",
                "ZREVRANGEBYLEX lx + - LIMIT 0 3",
                "ZREVRANGEBYLEX lx (zip [bar",
                "ZRANGE lx [z - BYLEX REV",
                "ZLEXCOUNT lx [b [f",
                "ZLEXCOUNT lx + -",
                "ZRANGEBYLEX lx [zz +",
                "ZREMRANGEBYLEX lx [baz [foo",
                "ZRANGE lx 0 -1",
                "ZREMRANGEBYRANK z 0 1",
                "ZREMRANGEBYRANK z -1 -1",
                "ZREMRANGEBYSCORE z (2 5",
                "ZRANGE z 0 -1 WITHSCORES",
                "ZPOPMIN z",
                "ZPOPMAX z",
                "ZPOPMIN z 2",
                "ZPOPMAX z 1",
                "ZPOPMIN z 0",
                "ZPOPMIN z 100",
                "EXISTS z",
                "ZPOPMIN z",
                "ZADD {t}a 1 x 2 y",
                "ZADD {t}b 3 y 4 z",
                "ZADD c 5 z 6 w",
                "ZMPOP 3 nokey {t}a c MIN COUNT 1",
                "ZMPOP 2 c {t}a MAX COUNT 10",
                "ZMPOP 2 nokey {t}nokey MIN",
                "ZADD {t}a 1 x 2 y",
                "ZADD c 5 z 6 w",
                "ZUNION 3 {t}a {t}b c WITHSCORES",
                "ZUNION 3 {t}a {t}b c WEIGHTS 1 2 3 AGGREGATE MAX WITHSCORES",
                "ZINTER 2 {t}a {t}b WITHSCORES",
                "ZINTER 2 {t}b c AGGREGATE MIN WITHSCORES",
                "ZDIFF 3 {t}b {t}a c WITHSCORES",
                "ZINTERCARD 2 {t}b c",
                "ZUNIONSTORE {t}d 2 {t}a {t}b",
                "ZRANGE {t}d 0 -1 WITHSCORES",
                "ZUNIONSTORE dd 2 {t}a c",
                "ZRANGE dd 0 -1 WITHSCORES",
                "ZINTERSTORE dd 2 {t}a c",
                "EXISTS dd",
                "ZDIFFSTORE dd 2 c {t}a",
                "ZRANGE dd 0 -1 WITHSCORES",
                "ZRANGESTORE dd {t}a 0 -1",
                "ZRANGE dd 0 -1 WITHSCORES",
                "ZRANGESTORE {t}d c 0 0",
                "ZRANGE {t}d 0 -1 WITHSCORES",
                "ZRANGESTORE {t}d nokey 0 -1",
                "EXISTS {t}d",
                "RPUSH lst a",
                "ZUNIONSTORE lst 1 c",
                "TYPE lst",
                "ZRANGESTORE lst c 0 -1",
                "TYPE lst",
                "SET str v",
                "ZADD str 1 a",
                "ZINTERSTORE str 2 c nokey",
                "EXISTS str",
            ],
        );
    }
}

#[test]
fn zset_encodings_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, false, "encodings".into());
    let long = "x".repeat(65);
    let edge = "y".repeat(64);
    let mut many = String::from("ZADD many");
    for i in 0..128 {
        many.push_str(&format!(" {i} m{i}"));
    }
    scripted(
        &mut p,
        &[
            &many,
            "OBJECT ENCODING many",
            "ZADD many 1 m1",
            "OBJECT ENCODING many",
            "ZADD many 200 m200",
            "OBJECT ENCODING many",
            "ZREM many m200 m1 m2",
            "OBJECT ENCODING many",
            "ZRANGESTORE few many 0 9",
            "OBJECT ENCODING few",
            "ZRANGESTORE all many 0 -1",
            "OBJECT ENCODING all",
            "ZUNIONSTORE u 1 many",
            "OBJECT ENCODING u",
            "ZADD u 1 extra1 2 extra2",
            "OBJECT ENCODING u",
            "ZINTERSTORE i 1 u",
            "OBJECT ENCODING i",
            &format!("ZADD e 1 {edge}"),
            "OBJECT ENCODING e",
            &format!("ZADD e 1 {long}"),
            "OBJECT ENCODING e",
            &format!("ZREM e {long}"),
            "OBJECT ENCODING e",
            "ZDIFFSTORE e2 1 e",
            "OBJECT ENCODING e2",
            &format!("ZADD l 1 {long}"),
            "OBJECT ENCODING l",
            &format!("ZINCRBY l2 1 {long}"),
            "OBJECT ENCODING l2",
            &format!("ZADD l3 1 a 2 {long}"),
            "OBJECT ENCODING l3",
            "ZADD n -0 a",
            "ZSCORE n a",
            &format!("ZADD n2 -0 {long}"),
            &format!("ZSCORE n2 {long}"),
            "ZSCAN n2 0",
            "ZUNIONSTORE n3 1 n2",
            "OBJECT ENCODING n3",
            "ZRANGE n3 0 -1 WITHSCORES",
        ],
    );
    // Skiplist-encoded sets read like listpack ones.
    for cmd in [
        "ZRANGE many 0 9 WITHSCORES",
        "ZRANGE many -5 -1 REV",
        "ZRANGE many 50 60 BYSCORE WITHSCORES",
        "ZRANGE many (100 (20 BYSCORE REV LIMIT 3 4 WITHSCORES",
        "ZRANGEBYSCORE many -inf 10 LIMIT 2 3",
        "ZCOUNT many 10 (90",
        "ZRANK many m77",
        "ZREVRANK many m77",
        "ZREMRANGEBYRANK many 10 19",
        "ZREMRANGEBYSCORE many (30 40",
        "ZRANGE many 0 -1 WITHSCORES",
        "ZPOPMIN many 3",
        "ZPOPMAX many 3",
        "ZCARD many",
        "ZMSCORE many m5 m50 m500",
    ] {
        p.line(cmd);
    }
    p.full_scan(b"many", 10);
    p.full_scan(b"all", 1);
}

// ---------------------------------------------------------------------------
// Kite alone, at one and at four threads
// ---------------------------------------------------------------------------

fn kite(threads: usize) -> KiteServer {
    KiteServer::start(&[], threads)
}

fn bulk(s: &str) -> Resp {
    Resp::bulk(s)
}

fn zrank_withscore(threads: usize) {
    let k = kite(threads);
    let mut c = k.client();
    c.cmd_str("ZADD z 1 a 2.5 b 3 c");
    assert_eq!(
        c.cmd_str("ZRANK z b WITHSCORE"),
        Resp::Array(vec![Resp::Integer(1), bulk("2.5")])
    );
    assert_eq!(
        c.cmd_str("ZREVRANK z b withscore"),
        Resp::Array(vec![Resp::Integer(1), bulk("2.5")])
    );
    assert_eq!(c.cmd_str("ZRANK z nosuch WITHSCORE"), Resp::NullArray);
    assert_eq!(c.cmd_str("ZRANK nokey a WITHSCORE"), Resp::NullArray);
    assert_eq!(
        c.cmd_str("ZRANK z a foo"),
        Resp::Error("ERR syntax error".into())
    );
    assert_eq!(
        c.cmd_str("ZRANK z a WITHSCORE x"),
        Resp::Error("ERR wrong number of arguments for 'zrank' command".into())
    );
    c.cmd_str("HELLO 3");
    assert_eq!(
        c.cmd_str("ZRANK z c WITHSCORE"),
        Resp::Array(vec![Resp::Integer(2), Resp::Double("3".into())])
    );
    assert_eq!(c.cmd_str("ZRANK z nosuch WITHSCORE"), Resp::Null);
}

#[test]
fn zrank_withscore_threads1() {
    zrank_withscore(1);
}

#[test]
fn zrank_withscore_threads4() {
    zrank_withscore(4);
}

/// Scores print as the shortest text that reads back as the same double (7.2), and a
/// client that sends that text back finds the member.
fn score_texts_round_trip(threads: usize) {
    let k = kite(threads);
    let mut c = k.client();
    // BullMQ: integral scores up to 2^53, timestamps shifted left by 12 bits.
    for s in [
        "9007199254740991",
        "9007199254740992",
        "-9007199254740991",
        "7083916474957824",
        "1700000000000",
        "6963200000000004096",
    ] {
        assert_eq!(c.cmd(&["ZADD", "bull", s, s]), Resp::Integer(1));
        let got = c.cmd(&["ZSCORE", "bull", s]);
        let want: f64 = s.parse().unwrap();
        assert_eq!(
            as_score(got.as_bytes().unwrap()),
            Some(want),
            "{s} came back as {got}"
        );
        if want.abs() < 1e17 {
            assert_eq!(got, bulk(s), "integral scores print in full");
        }
    }
    assert_eq!(
        c.cmd_str("ZSCORE bull 9007199254740991"),
        bulk("9007199254740991")
    );
    assert_eq!(
        c.cmd_str("ZRANGEBYSCORE bull 9007199254740991 9007199254740991"),
        Resp::Array(vec![bulk("9007199254740991")])
    );
    // Shortest round-trip text.
    for (given, shown) in [
        ("0.1", "0.1"),
        ("1e20", "1e+20"),
        ("1.5e-7", "1.5e-07"),
        ("100", "100"),
        ("-2.5", "-2.5"),
        ("inf", "inf"),
        ("-inf", "-inf"),
        ("0.30000000000000004", "0.30000000000000004"),
        ("1700000000.1234567", "1700000000.1234567"),
    ] {
        c.cmd(&["ZADD", "txt", given, given]);
        assert_eq!(
            c.cmd(&["ZSCORE", "txt", given]),
            bulk(shown),
            "score {given}"
        );
    }
    // Sidekiq reads a score, then deletes by that exact text.
    for s in [
        "1700000000.1234567",
        "1712345678.987654",
        "0.30000000000000004",
        "1e+20",
    ] {
        c.cmd(&["ZADD", "retry", s, &format!("job-{s}")]);
    }
    let r = c.cmd_str("ZRANGE retry 0 -1 WITHSCORES");
    let items = r.as_array().unwrap().to_vec();
    for ch in items.chunks(2) {
        let (m, s) = (
            ch[0].as_bytes().unwrap().to_vec(),
            ch[1].as_bytes().unwrap().to_vec(),
        );
        let found = c.cmd(&[
            b"ZRANGEBYSCORE".to_vec(),
            b"retry".to_vec(),
            s.clone(),
            s.clone(),
        ]);
        assert_eq!(found, Resp::Array(vec![Resp::Bulk(m.clone())]));
        let removed = c.cmd(&[
            b"ZREMRANGEBYSCORE".to_vec(),
            b"retry".to_vec(),
            s.clone(),
            s,
        ]);
        assert_eq!(removed, Resp::Integer(1));
    }
    assert_eq!(c.cmd_str("EXISTS retry"), Resp::Integer(0));
    // ZINCRBY and ZADD INCR reply with the new score in the same format.
    assert_eq!(c.cmd_str("ZINCRBY inc 0.1 m"), bulk("0.1"));
    assert_eq!(c.cmd_str("ZINCRBY inc 0.2 m"), bulk("0.30000000000000004"));
    c.cmd_str("HELLO 3");
    assert_eq!(
        c.cmd_str("ZSCORE inc m"),
        Resp::Double("0.30000000000000004".into())
    );
    assert_eq!(c.cmd_str("ZSCORE txt 1e20"), Resp::Double("1e+20".into()));
    assert_eq!(c.cmd_str("ZSCORE txt inf"), Resp::Double("inf".into()));
}

#[test]
fn score_texts_round_trip_threads1() {
    score_texts_round_trip(1);
}

#[test]
fn score_texts_round_trip_threads4() {
    score_texts_round_trip(4);
}

/// A big set checked against a model: ranks, ranges, pops, and ZSCAN completeness while
/// other members come and go.
fn big_set_matches_model(threads: usize) {
    let k = kite(threads);
    let mut c = k.client();
    let mut rng = Rng::new(99 + threads as u64);
    let mut model: HashMap<String, i64> = HashMap::new();
    let n = 5000;
    let mut batch: Vec<String> = vec!["ZADD".into(), "big".into()];
    for i in 0..n {
        let s = rng.range(0, 1000);
        let m = format!("m{i:05}");
        batch.push(s.to_string());
        batch.push(m.clone());
        model.insert(m, s);
    }
    assert_eq!(c.cmd(&batch), Resp::Integer(n));
    assert_eq!(c.cmd_str("OBJECT ENCODING big"), bulk("skiplist"));
    let sorted = |model: &HashMap<String, i64>| {
        let mut v: Vec<(i64, String)> = model.iter().map(|(m, s)| (*s, m.clone())).collect();
        v.sort();
        v
    };
    for round in 0..300 {
        let v = sorted(&model);
        match round % 6 {
            0 => {
                let (s, m) = &v[rng.index(v.len())];
                let rank = v.iter().position(|x| &x.1 == m).unwrap();
                assert_eq!(c.cmd(&["ZRANK", "big", m]), Resp::Integer(rank as i64));
                assert_eq!(
                    c.cmd(&["ZREVRANK", "big", m]),
                    Resp::Integer((v.len() - 1 - rank) as i64)
                );
                assert_eq!(c.cmd(&["ZSCORE", "big", m]), bulk(&s.to_string()));
            }
            1 => {
                let a = rng.index(v.len());
                let r = c.cmd(&["ZRANGE", "big", &a.to_string(), &(a + 9).to_string()]);
                let want: Vec<Resp> = v[a..(a + 10).min(v.len())]
                    .iter()
                    .map(|x| bulk(&x.1))
                    .collect();
                assert_eq!(r, Resp::Array(want));
            }
            2 => {
                let lo = rng.range(0, 1000);
                let hi = lo + rng.range(0, 50);
                let r = c.cmd(&["ZCOUNT", "big", &lo.to_string(), &format!("({hi}")]);
                let want = v.iter().filter(|x| x.0 >= lo && x.0 < hi).count();
                assert_eq!(r, Resp::Integer(want as i64));
                let r = c.cmd(&[
                    "ZRANGEBYSCORE",
                    "big",
                    &format!("({lo}"),
                    &hi.to_string(),
                    "LIMIT",
                    "1",
                    "5",
                ]);
                let want: Vec<Resp> = v
                    .iter()
                    .filter(|x| x.0 > lo && x.0 <= hi)
                    .skip(1)
                    .take(5)
                    .map(|x| bulk(&x.1))
                    .collect();
                assert_eq!(r, Resp::Array(want));
            }
            3 => {
                let r = c.cmd_str("ZPOPMIN big 3");
                let want: Vec<Resp> = v[..3]
                    .iter()
                    .flat_map(|x| [bulk(&x.1), bulk(&x.0.to_string())])
                    .collect();
                assert_eq!(r, Resp::Array(want));
                for x in &v[..3] {
                    model.remove(&x.1);
                }
            }
            4 => {
                for _ in 0..20 {
                    let m = format!("n{}", rng.below(100_000));
                    let s = rng.range(0, 1000);
                    c.cmd(&["ZADD", "big", &s.to_string(), &m]);
                    model.insert(m, s);
                }
                let (_, m) = &v[rng.index(v.len())];
                assert_eq!(c.cmd(&["ZREM", "big", m]), Resp::Integer(1));
                model.remove(m);
            }
            _ => {
                let a = rng.index(v.len() - 5);
                assert_eq!(
                    c.cmd(&[
                        "ZREMRANGEBYRANK",
                        "big",
                        &a.to_string(),
                        &(a + 2).to_string()
                    ]),
                    Resp::Integer(3)
                );
                for x in &v[a..a + 3] {
                    model.remove(&x.1);
                }
            }
        }
    }
    let v = sorted(&model);
    let r = c.cmd_str("ZRANGE big 0 -1 WITHSCORES");
    let want: Vec<Resp> = v
        .iter()
        .flat_map(|x| [bulk(&x.1), bulk(&x.0.to_string())])
        .collect();
    assert_eq!(r, Resp::Array(want));
    // ZSCAN returns every member present for the whole scan, even as the set grows and
    // shrinks (its hash table resizes) between calls.
    let stable: HashSet<String> = model.keys().cloned().collect();
    let mut seen = HashSet::new();
    let mut cursor = "0".to_string();
    let mut step = 0;
    loop {
        let r = c.cmd(&["ZSCAN", "big", &cursor, "COUNT", "20"]);
        let parts = r.as_array().unwrap();
        cursor = parts[0].as_string().unwrap();
        for ch in parts[1].as_array().unwrap().chunks(2) {
            seen.insert(ch[0].as_string().unwrap());
        }
        step += 1;
        if step % 10 == 0 {
            let mut add = vec!["ZADD".to_string(), "big".into()];
            for j in 0..2000 {
                add.push("1".into());
                add.push(format!("tmp{step}-{j}"));
            }
            c.cmd(&add);
        } else if step % 10 == 5 {
            c.cmd_str("ZREMRANGEBYSCORE big 1 1");
            let extra: Vec<String> = model
                .iter()
                .filter(|(_, s)| **s == 1)
                .map(|(m, _)| m.clone())
                .collect();
            for m in extra {
                model.remove(&m);
            }
        }
        if cursor == "0" {
            break;
        }
    }
    let still: HashSet<String> = stable
        .into_iter()
        .filter(|m| model.contains_key(m))
        .collect();
    let missed: Vec<&String> = still.difference(&seen).collect();
    assert!(
        missed.is_empty(),
        "ZSCAN missed {} members, e.g. {:?}",
        missed.len(),
        missed.first()
    );
    // Popping everything from the head returns it in order.
    c.cmd_str("DEL q");
    let mut add = vec!["ZADD".to_string(), "q".into()];
    for i in 0..1000 {
        add.push(i.to_string());
        add.push(format!("job{i:04}"));
    }
    c.cmd(&add);
    for i in 0..1000 {
        assert_eq!(
            c.cmd_str("ZPOPMIN q"),
            Resp::Array(vec![bulk(&format!("job{i:04}")), bulk(&i.to_string())])
        );
    }
    assert_eq!(c.cmd_str("EXISTS q"), Resp::Integer(0));
}

#[test]
fn big_set_matches_model_threads1() {
    big_set_matches_model(1);
}

#[test]
fn big_set_matches_model_threads4() {
    big_set_matches_model(4);
}

/// Keys named so that they land on different shards at --threads 4.
const SPREAD: &[&str] = &["za", "zb", "zc", "zd", "ze", "zf", "zg", "zh"];

/// Cross-shard reads and stores see transactions whole: the scores of `m` in two keys on
/// different shards always sum to zero.
fn cross_shard_stores_are_atomic(threads: usize) {
    let k = kite(threads);
    let mut c = k.client();
    c.cmd_str("ZADD za 0 m");
    c.cmd_str("ZADD zb 0 m");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let mut w = k.client();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = w.pipeline(&[
                    vec!["MULTI"],
                    vec!["ZINCRBY", "za", "1", "m"],
                    vec!["ZINCRBY", "zb", "-1", "m"],
                    vec!["EXEC"],
                ]);
                assert!(matches!(r[3], Resp::Array(_)), "EXEC gave {}", r[3]);
                i += 1;
            }
            i
        })
    };
    for _ in 0..300 {
        let r = c.cmd_str("ZUNION 2 za zb WITHSCORES");
        assert_eq!(r, Resp::Array(vec![bulk("m"), bulk("0")]), "torn ZUNION");
        assert_eq!(c.cmd_str("ZUNIONSTORE zc 2 za zb"), Resp::Integer(1));
        assert_eq!(c.cmd_str("ZSCORE zc m"), bulk("0"), "torn ZUNIONSTORE");
        let r = c.cmd_str("ZINTER 2 za zb WITHSCORES AGGREGATE SUM");
        assert_eq!(r, Resp::Array(vec![bulk("m"), bulk("0")]), "torn ZINTER");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(writer.join().unwrap() > 0);
}

#[test]
fn cross_shard_stores_are_atomic_threads1() {
    cross_shard_stores_are_atomic(1);
}

#[test]
fn cross_shard_stores_are_atomic_threads4() {
    cross_shard_stores_are_atomic(4);
}

/// Competing ZMPOP/ZPOPMIN clients over keys on every shard take each member once.
fn pops_take_each_member_once(threads: usize) {
    let k = kite(threads);
    let mut c = k.client();
    let per_key = 300;
    for key in SPREAD {
        let mut add = vec!["ZADD".to_string(), key.to_string()];
        for i in 0..per_key {
            add.push(i.to_string());
            add.push(format!("{key}:{i}"));
        }
        c.cmd(&add);
    }
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let mut cl = k.client();
            thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    let mut cmd = vec!["ZMPOP".to_string(), SPREAD.len().to_string()];
                    cmd.extend(SPREAD.iter().map(|s| s.to_string()));
                    cmd.push(if w % 2 == 0 {
                        "MIN".into()
                    } else {
                        "MAX".into()
                    });
                    cmd.push("COUNT".into());
                    cmd.push("7".into());
                    let r = cl.cmd(&cmd);
                    if r.is_null() {
                        break;
                    }
                    let parts = r.as_array().unwrap();
                    for pair in parts[1].as_array().unwrap() {
                        got.push(pair.as_array().unwrap()[0].as_string().unwrap());
                    }
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.join().unwrap());
    }
    let distinct: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), SPREAD.len() * per_key, "popped count");
    assert_eq!(distinct.len(), all.len(), "a member was popped twice");
    for key in SPREAD {
        assert_eq!(c.cmd(&["EXISTS", key]), Resp::Integer(0));
    }
}

#[test]
fn pops_take_each_member_once_threads1() {
    pops_take_each_member_once(1);
}

#[test]
fn pops_take_each_member_once_threads4() {
    pops_take_each_member_once(4);
}

/// Reply shapes in RESP2 and RESP3 (WITHSCORES pairs, pops, ZMPOP, ZSCAN).
fn mixed_shapes(threads: usize) {
    let k = kite(threads);
    let mut c = k.client();
    c.cmd_str("ZADD za 1 a 2 b");
    c.cmd_str("ZADD zb 3 b 4 c");
    assert_eq!(
        c.cmd_str("ZUNION 2 za zb WITHSCORES"),
        Resp::Array(vec![
            bulk("a"),
            bulk("1"),
            bulk("c"),
            bulk("4"),
            bulk("b"),
            bulk("5")
        ])
    );
    c.cmd_str("HELLO 3");
    let pair = |m: &str, s: &str| Resp::Array(vec![bulk(m), Resp::Double(s.into())]);
    assert_eq!(
        c.cmd_str("ZUNION 2 za zb WITHSCORES"),
        Resp::Array(vec![pair("a", "1"), pair("c", "4"), pair("b", "5")])
    );
    assert_eq!(
        c.cmd_str("ZPOPMIN za"),
        Resp::Array(vec![bulk("a"), Resp::Double("1".into())])
    );
    assert_eq!(c.cmd_str("ZPOPMIN zb 1"), Resp::Array(vec![pair("b", "3")]));
    assert_eq!(
        c.cmd_str("ZMPOP 2 za zb MAX"),
        Resp::Array(vec![bulk("za"), Resp::Array(vec![pair("b", "2")])])
    );
    assert_eq!(c.cmd_str("ZMPOP 2 za missing MAX"), Resp::Null);
    assert_eq!(
        c.cmd_str("ZRANDMEMBER zb 1 WITHSCORES"),
        Resp::Array(vec![pair("c", "4")])
    );
    assert_eq!(
        c.cmd_str("ZRANDMEMBER zb -2 WITHSCORES"),
        Resp::Array(vec![pair("c", "4"), pair("c", "4")])
    );
    assert_eq!(
        c.cmd_str("ZRANGE zb 0 -1 WITHSCORES"),
        Resp::Array(vec![pair("c", "4")])
    );
    assert_eq!(
        c.cmd_str("ZSCAN zb 0"),
        Resp::Array(vec![bulk("0"), Resp::Array(vec![bulk("c"), bulk("4")])])
    );
}

#[test]
fn resp3_shapes_threads1() {
    mixed_shapes(1);
}

#[test]
fn resp3_shapes_threads4() {
    mixed_shapes(4);
}

#[test]
fn zset_transactions_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    for resp3 in [false, true] {
        let mut p = Pair::new(&kite, &redis, resp3, format!("transactions, resp3={resp3}"));
        let mut other = Pair::new(
            &kite,
            &redis,
            resp3,
            format!("transactions (other), resp3={resp3}"),
        );
        scripted(
            &mut p,
            &[
                "ZADD za 1 a 2 b",
                "ZADD zb 3 b 4 c",
                "MULTI",
                "ZADD za 5 e",
                "ZUNIONSTORE zc 2 za zb WEIGHTS 1 10",
                "ZRANGE zc 0 -1 WITHSCORES",
                "ZINTER 2 za zb WITHSCORES",
                "ZRANGESTORE zd zc 1 2",
                "ZMPOP 3 nokey zb za MAX COUNT 2",
                "ZDIFFSTORE ze 2 za zb",
                "ZINTERCARD 2 za zc",
                "ZADD za x y",
                "ZPOPMIN zd 5",
                "EXEC",
                "ZRANGE za 0 -1 WITHSCORES",
                "ZRANGE zb 0 -1 WITHSCORES",
                "ZRANGE ze 0 -1 WITHSCORES",
                "EXISTS zd",
                "MULTI",
                "ZADD za 1",
                "EXEC",
                "WATCH za",
            ],
        );
        other.line("ZADD za 9 z");
        scripted(&mut p, &["MULTI", "ZCARD za", "EXEC", "WATCH zb"]);
        other.line("ZADD zb XX 1 nosuch");
        scripted(&mut p, &["MULTI", "ZCARD zb", "EXEC", "WATCH ze"]);
        other.line("ZPOPMIN ze");
        scripted(&mut p, &["MULTI", "ZCARD ze", "EXEC", "WATCH zf"]);
        other.line("ZUNIONSTORE zf 1 za");
        scripted(&mut p, &["MULTI", "ZCARD zf", "EXEC", "WATCH zf"]);
        other.line("ZINTERSTORE zf 2 za nokey");
        scripted(&mut p, &["MULTI", "ZCARD zf", "EXEC"]);
    }
}
