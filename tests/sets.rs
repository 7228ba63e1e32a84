//! The sets family: a differential test against a real redis-server, plus Kite-only tests
//! of what the reference (Debian's redis-server 7.0) cannot show: Redis 7.2's `listpack`
//! encoding for sets, reply orders that follow it, SPOP's rebuilds, and cross-shard
//! atomicity.
//!
//! Reproduce one seed: `KITE_SETS_SEEDS=7 cargo test --release --test sets`.
//! Longer runs: `KITE_SETS_OPS=20000`.

#[macro_use]
mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::thread;
use std::time::{Duration, Instant};

/// Keys that hold sets. With `--threads 4`, a, b, c and d sit on four different shards
/// (CRC16 slot mod 4); the `{g}` keys share one shard.
const SET_KEYS: &[&str] = &["a", "b", "c", "d", "{g}1", "{g}2", "{g}3"];
/// Keys that hold other types, for WRONGTYPE paths.
const OTHER_KEYS: &[&str] = &["str", "lst", "{g}str"];

// ---------------------------------------------------------------------------------------
// Comparing replies
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Check {
    Exact,
    /// Members in unspecified order: same reply kind, same elements once sorted.
    Sorted,
    /// OBJECT ENCODING: Redis 7.0 has no `listpack` for sets and says `hashtable` where
    /// 7.2 (what Kite follows) says `listpack`; everything else must agree.
    Encoding,
    /// TTL: only whether there is none, no key, or some positive time left.
    TtlClass,
}

fn sorted(r: &Resp) -> Resp {
    match r {
        Resp::Array(v) => {
            let mut v = v.clone();
            v.sort_by_key(|x| x.encode());
            Resp::Array(v)
        }
        Resp::Set(v) => {
            let mut v = v.clone();
            v.sort_by_key(|x| x.encode());
            Resp::Set(v)
        }
        other => other.clone(),
    }
}

fn ttl_class(r: &Resp) -> Resp {
    match r {
        Resp::Integer(n) if *n > 0 => Resp::Integer(1),
        other => other.clone(),
    }
}

fn matches(check: Check, kite: &Resp, redis: &Resp) -> bool {
    match check {
        Check::Exact => kite == redis,
        Check::Sorted => sorted(kite) == sorted(redis),
        Check::Encoding => {
            kite == redis
                || (kite.as_bytes() == Some(b"listpack") && redis.as_bytes() == Some(b"hashtable"))
        }
        Check::TtlClass => ttl_class(kite) == ttl_class(redis),
    }
}

fn members(r: &Resp) -> BTreeSet<Vec<u8>> {
    r.as_array()
        .map(|v| {
            v.iter()
                .filter_map(|x| x.as_bytes().map(|b| b.to_vec()))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The pair of servers
// ---------------------------------------------------------------------------------------

struct Pair {
    kite: Client,
    redis: Client,
    history: VecDeque<String>,
    label: String,
    count: usize,
    /// Per command name (and per encoding seen): (ok replies, error replies) from Redis.
    stats: BTreeMap<String, (usize, usize)>,
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

    fn fail(&self, args: &Args, why: &str, kite: &Resp, redis: &Resp) -> ! {
        let hist: Vec<String> = self.history.iter().cloned().collect();
        panic!(
            "\nSETS DIFFERENTIAL MISMATCH ({})\n  command #{}: {}\n  {}\n  kite:  {}\n  redis: {}\n\
             last commands (oldest first):\n    {}\n",
            self.label,
            self.count,
            fmt_cmd(args),
            why,
            kite,
            redis,
            hist.join("\n    ")
        );
    }

    fn note(&mut self, args: &Args, reply: &Resp) {
        let mut name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        if name == "OBJECT" {
            name = format!("OBJECT ENCODING -> {reply}");
        }
        let e = self.stats.entry(name).or_default();
        if reply.is_error() {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
        let mut line = format!("#{} {} -> {}", self.count, fmt_cmd(args), reply);
        if line.len() > 300 {
            let mut cut = 300;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str("...");
        }
        self.history.push_back(line);
        if self.history.len() > 30 {
            self.history.pop_front();
        }
        self.count += 1;
    }

    /// Sends to both and returns (kite, redis) without comparing.
    fn both(&mut self, args: &Args) -> (Resp, Resp) {
        self.kite.send(args);
        self.redis.send(args);
        let k = self.kite.try_read();
        let r = self.redis.try_read();
        match (k, r) {
            (Ok(k), Ok(r)) => {
                self.note(args, &r);
                (k, r)
            }
            (k, r) => {
                let show = |x: std::io::Result<Resp>| match x {
                    Ok(v) => v,
                    Err(e) => Resp::Error(format!("<no reply: {e}>")),
                };
                self.fail(args, "no reply", &show(k), &show(r))
            }
        }
    }

    fn run(&mut self, args: Args, check: Check) -> Resp {
        let (k, r) = self.both(&args);
        if !matches(check, &k, &r) {
            self.fail(&args, &format!("{check:?} comparison"), &k, &r);
        }
        r
    }

    /// The members of `key` (both sides agree, compared sorted); empty for a missing key
    /// or another type.
    fn members_of(&mut self, key: &[u8]) -> BTreeSet<Vec<u8>> {
        let r = self.run(args!["SMEMBERS", key], Check::Sorted);
        if r.is_error() {
            BTreeSet::new()
        } else {
            members(&r)
        }
    }

    /// SPOP: the popped members differ between the servers, so the replies are checked
    /// for shape, and the other side's picks are then removed on both servers, which
    /// leaves both holding the same members (and both SREMs remove equally many).
    fn spop(&mut self, args: Args) {
        let key = args[1].clone();
        let before = self.members_of(&key);
        let (k, r) = self.both(&args);
        let mut popped = BTreeSet::new();
        match (&k, &r) {
            (Resp::Bulk(a), Resp::Bulk(b)) if args.len() == 2 => {
                for m in [a, b] {
                    if !before.contains(m) {
                        self.fail(&args, "popped a non-member", &k, &r);
                    }
                    popped.insert(m.clone());
                }
            }
            (Resp::Array(a), Resp::Array(b)) | (Resp::Set(a), Resp::Set(b))
                if args.len() == 3 && a.len() == b.len() =>
            {
                for v in [a, b] {
                    let got: BTreeSet<Vec<u8>> = members(&Resp::Array(v.clone()));
                    if got.len() != v.len() || !got.is_subset(&before) {
                        self.fail(&args, "popped repeats or non-members", &k, &r);
                    }
                    popped.extend(got);
                }
                if a.len() == before.len() && sorted(&k) != sorted(&r) {
                    self.fail(&args, "popping everything must return everything", &k, &r);
                }
            }
            _ => {
                if k != r {
                    self.fail(&args, "different reply shapes", &k, &r);
                }
            }
        }
        // Each side popped the same number of members; when that was all of them both
        // sides are already equal (the key is gone).
        let per_side = match (&r, args.len()) {
            (Resp::Bulk(_), 2) => 1,
            (other, _) => other.as_array().map_or(0, |v| v.len()),
        };
        if per_side > 0 && per_side < before.len() {
            let mut srem = args!["SREM", &key];
            srem.extend(popped);
            self.run(srem, Check::Exact);
        }
    }

    /// SRANDMEMBER: shape and membership only.
    fn srandmember(&mut self, args: Args) {
        let key = args[1].clone();
        let before = self.members_of(&key);
        let count: Option<i64> = args
            .get(2)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse().ok());
        let (k, r) = self.both(&args);
        match (&k, &r, count) {
            (Resp::Bulk(a), Resp::Bulk(b), None) => {
                if !before.contains(a) || !before.contains(b) {
                    self.fail(&args, "returned a non-member", &k, &r);
                }
            }
            (Resp::Array(a), Resp::Array(b), Some(n)) if args.len() == 3 => {
                let want = if n >= 0 {
                    (n as usize).min(before.len())
                } else if before.is_empty() {
                    0
                } else {
                    n.unsigned_abs() as usize
                };
                for v in [a, b] {
                    let got = members(&Resp::Array(v.clone()));
                    if v.len() != want || !got.is_subset(&before) || (n > 0 && got.len() != v.len())
                    {
                        self.fail(&args, "wrong count, repeats or non-members", &k, &r);
                    }
                }
            }
            _ => {
                if k != r {
                    self.fail(&args, "different reply shapes", &k, &r);
                }
            }
        }
    }

    /// Walks SSCAN to the end on each server; the members seen must be the same.
    fn sscan_all(&mut self, key: &[u8], pattern: Option<&[u8]>, count: Option<usize>) {
        let mut seen: Vec<BTreeSet<Vec<u8>>> = Vec::new();
        let mut first: Vec<Resp> = Vec::new();
        for side in 0..2 {
            let mut cursor = b"0".to_vec();
            let mut all = BTreeSet::new();
            for round in 0.. {
                let mut a = args!["SSCAN", key, &cursor];
                if let Some(p) = pattern {
                    a.extend(args!["MATCH", p.to_vec()]);
                }
                if let Some(c) = count {
                    a.extend(args!["COUNT", c]);
                }
                let c = if side == 0 {
                    &mut self.kite
                } else {
                    &mut self.redis
                };
                let r = c.cmd(&a);
                if round == 0 {
                    first.push(r.clone());
                }
                let (next, page) = match r.as_array() {
                    Some(v) if v.len() == 2 => (v[0].clone(), v[1].clone()),
                    _ => break,
                };
                all.extend(members(&page));
                cursor = next.as_bytes().unwrap_or(b"0").to_vec();
                if cursor == b"0" || round > 100_000 {
                    break;
                }
            }
            seen.push(all);
        }
        let a = args!["SSCAN", key, "0", "<to the end>"];
        if first[0].is_error() || first[1].is_error() {
            if first[0] != first[1] {
                self.fail(&a, "first SSCAN", &first[0], &first[1]);
            }
        } else if seen[0] != seen[1] {
            let show = |s: &BTreeSet<Vec<u8>>| {
                Resp::Array(s.iter().map(|m| Resp::Bulk(m.clone())).collect())
            };
            self.fail(
                &a,
                "members seen by a full SSCAN",
                &show(&seen[0]),
                &show(&seen[1]),
            );
        }
        self.note(&a, &Resp::Integer(seen[1].len() as i64));
    }

    /// MULTI, the commands, EXEC; EXEC's replies are compared one by one with each
    /// command's check.
    fn transaction(&mut self, cmds: Vec<(Args, Check)>) {
        self.run(args!["MULTI"], Check::Exact);
        for (a, _) in &cmds {
            self.run(a.clone(), Check::Exact);
        }
        let exec = args!["EXEC"];
        let (k, r) = self.both(&exec);
        match (k.as_array(), r.as_array()) {
            (Some(kv), Some(rv)) if kv.len() == rv.len() && kv.len() == cmds.len() => {
                for ((kr, rr), (_, check)) in kv.iter().zip(rv).zip(&cmds) {
                    if !matches(*check, kr, rr) {
                        self.fail(&exec, "a reply inside EXEC", &k, &r);
                    }
                }
            }
            _ => {
                if k != r {
                    self.fail(&exec, "EXEC", &k, &r);
                }
            }
        }
    }

    fn compare_state(&mut self) {
        let keys = SET_KEYS.iter().chain(OTHER_KEYS);
        for k in keys {
            let k = k.as_bytes();
            let t = self.run(args!["TYPE", k.to_vec()], Check::Exact);
            if t.as_bytes() == Some(b"set") {
                self.run(args!["SMEMBERS", k.to_vec()], Check::Sorted);
                self.run(args!["SCARD", k.to_vec()], Check::Exact);
                self.run(args!["OBJECT", "ENCODING", k.to_vec()], Check::Encoding);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The random generator
// ---------------------------------------------------------------------------------------

struct Gen {
    rng: Rng,
}

enum Step {
    Plain(Args, Check),
    Spop(Args),
    Srandmember(Args),
    Scan(Vec<u8>, Option<Vec<u8>>, Option<usize>),
    Multi(Vec<(Args, Check)>),
}

impl Gen {
    fn set_key(&mut self) -> Vec<u8> {
        self.rng.pick(SET_KEYS).as_bytes().to_vec()
    }

    fn key(&mut self) -> Vec<u8> {
        if self.rng.chance(12) {
            self.rng.pick(OTHER_KEYS).as_bytes().to_vec()
        } else {
            self.set_key()
        }
    }

    fn keys(&mut self, lo: i64, hi: i64) -> Args {
        let n = self.rng.range(lo, hi);
        (0..n).map(|_| self.key()).collect()
    }

    fn member(&mut self) -> Vec<u8> {
        match self.rng.below(100) {
            0..=34 => self.rng.range(0, 40).to_string().into_bytes(),
            35..=44 => self.rng.range(-5000, 5000).to_string().into_bytes(),
            45..=49 => self
                .rng
                .pick(&[
                    "9223372036854775807",
                    "-9223372036854775808",
                    "0",
                    "-1",
                    "32767",
                    "32768",
                    "-2147483649",
                ])
                .as_bytes()
                .to_vec(),
            50..=54 => self
                .rng
                .pick(&[
                    "010",
                    "+1",
                    "-0",
                    " 1",
                    "1 ",
                    "0x1",
                    "1.0",
                    "",
                    "9223372036854775808",
                ])
                .as_bytes()
                .to_vec(),
            55..=79 => {
                let c = b'a' + self.rng.below(20) as u8;
                vec![c]
            }
            80..=84 => {
                let len = *self.rng.pick(&[63usize, 64, 65]);
                vec![b'x'; len]
            }
            85..=87 => self
                .rng
                .pick(&[&b"\x00"[..], b"\xff\r\n", b"bin\x00ary", b"\"q\""])
                .to_vec(),
            _ => format!("m{}", self.rng.range(0, 300)).into_bytes(),
        }
    }

    /// Keys `d` and `{g}2` get integers nearly always, so intsets live long and grow
    /// past 512 members.
    fn int_key(key: &[u8]) -> bool {
        key == b"d" || key == b"{g}2"
    }

    fn member_for(&mut self, key: &[u8]) -> Vec<u8> {
        if Self::int_key(key) && self.rng.chance(97) {
            self.rng.range(-2000, 2000).to_string().into_bytes()
        } else {
            self.member()
        }
    }

    fn members(&mut self, key: &[u8], lo: i64, hi: i64) -> Args {
        let n = self.rng.range(lo, hi);
        (0..n).map(|_| self.member_for(key)).collect()
    }

    /// Many members of one kind, so sets grow past the encoding thresholds (128, 512).
    fn bulk(&mut self, key: &[u8]) -> Args {
        let n = self.rng.range(20, 128);
        let ints = Self::int_key(key) || self.rng.chance(50);
        let base = self.rng.range(0, 1500);
        (0..n)
            .map(|i| {
                if ints {
                    (base + i * self.rng.range(1, 3)).to_string().into_bytes()
                } else {
                    format!("m{}", (base / 3 + i) % 700).into_bytes()
                }
            })
            .collect()
    }

    /// A command whose reply can be compared (used alone and inside MULTI).
    fn deterministic(&mut self) -> (Args, Check) {
        let exact = Check::Exact;
        match self.rng.below(100) {
            0..=19 => {
                let k = self.key();
                let mut a = args!["SADD", &k];
                a.extend(self.members(&k, 1, 4));
                (a, exact)
            }
            20..=23 => {
                let k = self.set_key();
                let mut a = args!["SADD", &k];
                a.extend(self.bulk(&k));
                (a, exact)
            }
            24..=33 => {
                let k = self.key();
                let mut a = args!["SREM", &k];
                a.extend(self.members(&k, 1, 4));
                (a, exact)
            }
            34..=35 => {
                let k = self.set_key();
                let mut a = args!["SREM", &k];
                a.extend(self.bulk(&k));
                (a, exact)
            }
            36..=40 => {
                let k = self.key();
                let m = self.member_for(&k);
                (args!["SISMEMBER", k, m], exact)
            }
            41..=44 => {
                let k = self.key();
                let mut a = args!["SMISMEMBER", &k];
                a.extend(self.members(&k, 1, 4));
                (a, exact)
            }
            45..=49 => (args!["SCARD", self.key()], exact),
            50..=54 => (args!["SMEMBERS", self.key()], Check::Sorted),
            55..=63 => {
                let op = *self.rng.pick(&["SINTER", "SUNION", "SDIFF"]);
                let mut a = args![op];
                a.extend(self.keys(1, 4));
                (a, Check::Sorted)
            }
            64..=73 => {
                let op = *self.rng.pick(&["SINTERSTORE", "SUNIONSTORE", "SDIFFSTORE"]);
                let mut a = args![op, self.key()];
                a.extend(self.keys(1, 3));
                (a, exact)
            }
            74..=78 => (self.sintercard(), exact),
            79..=86 => {
                let member = if self.rng.chance(30) {
                    self.rng.range(0, 40).to_string().into_bytes()
                } else {
                    self.member()
                };
                (args!["SMOVE", self.key(), self.key(), member], exact)
            }
            87..=91 => (args!["OBJECT", "ENCODING", self.set_key()], Check::Encoding),
            92..=94 => (
                args![*self.rng.pick(&["TYPE", "EXISTS", "DEL"]), self.key()],
                exact,
            ),
            _ => (args!["SCARD", self.set_key()], exact),
        }
    }

    fn sintercard(&mut self) -> Args {
        let n = self.rng.range(1, 3);
        let mut a = args!["SINTERCARD", n];
        a.extend(self.keys(n, n));
        match self.rng.below(10) {
            0..=3 => a.extend(args!["LIMIT", self.rng.range(0, 5)]),
            4 => {
                let choices = [
                    args!["LIMIT", "-1"],
                    args!["LIMIT", "abc"],
                    args!["LIMIT"],
                    args!["FOO", "1"],
                    args!["limit", "1", "LIMIT", "2"],
                ];
                a.extend(self.rng.pick(&choices).clone());
            }
            5 => {
                a[1] = self
                    .rng
                    .pick(&["0", "-1", "abc", "5", "99999999999999999999"])
                    .as_bytes()
                    .to_vec();
            }
            _ => {}
        }
        a
    }

    fn count_arg(&mut self, spop: bool) -> Vec<u8> {
        // SPOP counts stay at most 4 or above any set's size, which never takes Redis's
        // "rebuild what stays" path: there Redis 7.0 rebuilds a hashtable as an intset
        // where 7.2 builds a listpack (covered by the Kite-only tests).
        let s = if spop {
            *self
                .rng
                .pick(&["0", "1", "2", "3", "4", "100000", "-1", "abc", "1.5"])
        } else {
            *self.rng.pick(&[
                "0",
                "1",
                "2",
                "5",
                "-1",
                "-5",
                "30",
                "200",
                "-200",
                "abc",
                "-9223372036854775808",
                "9223372036854775807",
            ])
        };
        s.as_bytes().to_vec()
    }

    fn error_cmd(&mut self) -> Args {
        self.rng
            .pick(&[
                args!["SADD", "a"],
                args!["SREM", "a"],
                args!["SMEMBERS"],
                args!["SISMEMBER", "a"],
                args!["SMISMEMBER", "a"],
                args!["SCARD"],
                args!["SPOP"],
                args!["SPOP", "a", "1", "2"],
                args!["SRANDMEMBER", "a", "1", "2"],
                args!["SMOVE", "a", "b"],
                args!["SINTER"],
                args!["SINTERCARD", "1"],
                args!["SINTERSTORE", "a"],
                args!["SUNIONSTORE", "a"],
                args!["SDIFFSTORE", "a"],
                args!["SSCAN", "a"],
                args!["SSCAN", "a", "abc"],
                args!["SSCAN", "a", " 1"],
                args!["SSCAN", "a", "0", "COUNT", "0"],
                args!["SSCAN", "a", "0", "COUNT", "abc"],
                args!["SSCAN", "a", "0", "MATCH"],
                args!["SSCAN", "a", "0", "TYPE", "set"],
                args!["SSCAN", "plainstr", "0"],
                args!["SADD", "plainstr", "x"],
                args!["SINTERCARD", "2", "a", "plainstr"],
                args!["SSCAN", "nokey", "0", "COUNT", "0"],
            ])
            .clone()
    }

    fn next(&mut self) -> Step {
        match self.rng.below(100) {
            0..=69 => {
                let (a, c) = self.deterministic();
                Step::Plain(a, c)
            }
            70..=74 => {
                let mut a = args!["SPOP", self.key()];
                if self.rng.chance(60) {
                    a.push(self.count_arg(true));
                }
                Step::Spop(a)
            }
            75..=79 => {
                let mut a = args!["SRANDMEMBER", self.key()];
                if self.rng.chance(70) {
                    a.push(self.count_arg(false));
                }
                Step::Srandmember(a)
            }
            80..=82 => {
                let pattern = if self.rng.chance(40) {
                    Some(
                        self.rng
                            .pick(&["*", "m1*", "?", "[a-f]", "*5", "-*", "x*"])
                            .as_bytes()
                            .to_vec(),
                    )
                } else {
                    None
                };
                let count = if self.rng.chance(50) {
                    Some(*self.rng.pick(&[1usize, 5, 10, 50, 1000]))
                } else {
                    None
                };
                Step::Scan(self.key(), pattern, count)
            }
            83..=86 => {
                let n = self.rng.range(1, 4);
                Step::Multi((0..n).map(|_| self.deterministic()).collect())
            }
            87..=88 => {
                let k = self.rng.pick(OTHER_KEYS).as_bytes().to_vec();
                if k == b"lst" {
                    Step::Plain(args!["RPUSH", k, self.member()], Check::Exact)
                } else {
                    Step::Plain(args!["SET", k, self.member()], Check::Exact)
                }
            }
            89 => Step::Plain(args!["SET", self.set_key(), "v"], Check::Exact),
            90..=91 => Step::Plain(args!["EXPIRE", self.key(), 100000i64], Check::Exact),
            92..=93 => Step::Plain(args!["TTL", self.key()], Check::TtlClass),
            _ => Step::Plain(self.error_cmd(), Check::Exact),
        }
    }
}

fn run_seed(kite: &KiteServer, redis: &RedisServer, seed: u64, ops: usize, resp3: bool) {
    let label = format!(
        "seed {seed}, {}, {} vs redis-server; reproduce: KITE_SETS_SEEDS={seed} cargo test --release --test sets",
        if resp3 { "RESP3" } else { "RESP2" },
        kite.name
    );
    let mut pair = Pair::new(kite, redis, resp3, label);
    let mut gen = Gen {
        rng: Rng::new(seed),
    };
    // A key no generated command writes, for fixed WRONGTYPE cases.
    pair.run(args!["SET", "plainstr", "x"], Check::Exact);
    while pair.count < ops {
        match gen.next() {
            Step::Plain(a, c) => {
                pair.run(a, c);
            }
            Step::Spop(a) => pair.spop(a),
            Step::Srandmember(a) => pair.srandmember(a),
            Step::Scan(k, p, c) => pair.sscan_all(&k, p.as_deref(), c),
            Step::Multi(cmds) => pair.transaction(cmds),
        }
    }
    pair.compare_state();
    print_reply_stats("KITE_SETS_STATS", seed, &pair.stats);
}

fn differential(threads: usize, seeds: &[u64]) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let ops = usize_from_env("KITE_SETS_OPS", 4000);
    for seed in seeds_from_env("KITE_SETS_SEEDS", seeds) {
        for resp3 in [false, true] {
            run_seed(&kite, &redis, seed, ops, resp3);
        }
    }
}

#[test]
fn differential_threads1() {
    differential(1, &[1, 2]);
}

#[test]
fn differential_threads4() {
    differential(4, &[41, 42, 43]);
}

/// Scripted cases with exact replies, including keyspace edge cases of the STORE forms.
#[test]
fn scripted_cases_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    for resp3 in [false, true] {
        let mut p = Pair::new(&kite, &redis, resp3, format!("scripted, resp3={resp3}"));
        let script: &[&str] = &[
            "SADD a 3 1 2",
            "SMEMBERS a",
            "SADD b 2 3 4",
            "SINTER a b",
            "SUNION a b",
            "SDIFF a b",
            "SDIFF a a b",
            "SDIFF b a a",
            "SINTERSTORE c a b",
            "SMEMBERS c",
            "OBJECT ENCODING c",
            "SUNIONSTORE d a b",
            "SMEMBERS d",
            "SDIFFSTORE c a b",
            "SMEMBERS c",
            "SET str x",
            "EXPIRE d 1000",
            "SINTERSTORE d a nokey",
            "EXISTS d",
            "SUNIONSTORE str a",
            "TYPE str",
            "TTL str",
            "SET str x",
            "SINTER a str",
            "SINTER nokey str",
            "SINTERCARD 2 nokey str",
            "SDIFF nokey str",
            "SINTERCARD 2 a b",
            "SINTERCARD 2 a b LIMIT 1",
            "SINTERCARD 1 a LIMIT 0",
            "SMOVE a b 1",
            "SMOVE a b 1",
            "SMOVE nokey str 1",
            "SMOVE a str 2",
            "SMOVE str a 2",
            "SMOVE a a 2",
            "SMOVE a a 9",
            "SMOVE a newdst 2",
            "SMEMBERS a",
            "SMOVE a newdst 3",
            "EXISTS a",
            "SMEMBERS newdst",
            "OBJECT ENCODING newdst",
            "SPOP nokey",
            "SPOP nokey 3",
            "SPOP newdst 0",
            "SPOP str 0",
            "SPOP str",
            "SPOP newdst -1",
            "SPOP newdst 100",
            "EXISTS newdst",
            "SRANDMEMBER nokey",
            "SRANDMEMBER nokey 3",
            "SRANDMEMBER b 0",
            "SRANDMEMBER str 1",
            "SMISMEMBER nokey a b",
            "SMISMEMBER str a",
            "SISMEMBER b 010",
            "SISMEMBER b 2",
            "SSCAN nokey 0",
            "SSCAN b 0",
            "SSCAN b +0 MATCH 2 COUNT 100",
            "SSCAN b -1",
            "SSCAN b 18446744073709551616",
            "SREM b 2 3 4 5",
            "EXISTS b",
        ];
        for line in script {
            let a: Args = line.split(' ').map(|s| s.as_bytes().to_vec()).collect();
            let check = if line.starts_with("SUNION ") || line.starts_with("SDIFF ") {
                Check::Sorted
            } else if line.starts_with("OBJECT") {
                Check::Encoding
            } else {
                Check::Exact
            };
            p.run(a, check);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Kite-only tests (Redis 7.2 behaviour the 7.0 reference cannot show)
// ---------------------------------------------------------------------------------------

fn strs(r: &Resp) -> Vec<String> {
    r.as_array()
        .unwrap_or_else(|| panic!("expected an array, got {r}"))
        .iter()
        .map(|x| {
            x.as_string()
                .unwrap_or_else(|| panic!("expected a string, got {x}"))
        })
        .collect()
}

fn enc(c: &mut Client, key: &str) -> String {
    c.cmd(&["OBJECT", "ENCODING", key])
        .as_string()
        .unwrap_or_default()
}

fn sadd_range(c: &mut Client, key: &str, items: impl Iterator<Item = String>) {
    let mut a: Vec<String> = vec!["SADD".into(), key.into()];
    a.extend(items);
    let r = c.cmd(&a);
    assert!(r.as_int().is_some(), "SADD failed: {r}");
}

fn encodings_and_orders(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    // Intsets come back ascending, listpacks in insertion order.
    c.cmd(&["SADD", "i", "3", "-1", "2"]);
    assert_eq!(enc(&mut c, "i"), "intset");
    assert_eq!(strs(&c.cmd(&["SMEMBERS", "i"])), ["-1", "2", "3"]);
    c.cmd(&["SADD", "i", "x", "0"]);
    assert_eq!(enc(&mut c, "i"), "listpack");
    assert_eq!(strs(&c.cmd(&["SMEMBERS", "i"])), ["-1", "2", "3", "x", "0"]);
    c.cmd(&["SADD", "l", "c", "a", "b"]);
    assert_eq!(enc(&mut c, "l"), "listpack");
    c.cmd(&["SREM", "l", "a"]);
    c.cmd(&["SADD", "l", "a"]);
    assert_eq!(strs(&c.cmd(&["SMEMBERS", "l"])), ["c", "b", "a"]);
    // An intset takes a string as a listpack only below 128 members.
    sadd_range(&mut c, "i127", (0..127).map(|i| i.to_string()));
    c.cmd(&["SADD", "i127", "s"]);
    assert_eq!(enc(&mut c, "i127"), "listpack");
    sadd_range(&mut c, "i128", (0..128).map(|i| i.to_string()));
    c.cmd(&["SADD", "i128", "s"]);
    assert_eq!(enc(&mut c, "i128"), "hashtable");
    // 512 integers fit an intset; the 513th does not.
    sadd_range(&mut c, "i512", (0..100).map(|i| i.to_string()));
    for chunk in 1..6 {
        sadd_range(
            &mut c,
            "i512",
            (chunk * 100..(chunk * 100 + 100).min(512)).map(|i| i.to_string()),
        );
    }
    assert_eq!(c.cmd(&["SCARD", "i512"]), Resp::Integer(512));
    assert_eq!(enc(&mut c, "i512"), "intset");
    c.cmd(&["SADD", "i512", "100000"]);
    assert_eq!(enc(&mut c, "i512"), "hashtable");
    // Listpacks: 128 members, 64 bytes each.
    sadd_range(&mut c, "p", (0..128).map(|i| format!("m{i}")));
    assert_eq!(enc(&mut c, "p"), "listpack");
    c.cmd(&["SADD", "p", "m0"]);
    assert_eq!(enc(&mut c, "p"), "listpack");
    c.cmd(&["SADD", "p", "m128"]);
    assert_eq!(enc(&mut c, "p"), "hashtable");
    c.cmd(&["SREM", "p", "m128", "m1", "m2"]);
    assert_eq!(enc(&mut c, "p"), "hashtable", "conversions go one way");
    let x64 = "x".repeat(64);
    let x65 = "x".repeat(65);
    c.cmd(&["SADD", "v", x64.as_str()]);
    assert_eq!(enc(&mut c, "v"), "listpack");
    c.cmd(&["SADD", "v", x65.as_str()]);
    assert_eq!(enc(&mut c, "v"), "hashtable");
    c.cmd(&["SADD", "vi", "1", x65.as_str()]);
    assert_eq!(enc(&mut c, "vi"), "hashtable");
    // The argument count of SADD is a size hint, even when members repeat.
    sadd_range(&mut c, "hint", (0..129).map(|_| "dup".to_string()));
    assert_eq!(c.cmd(&["SCARD", "hint"]), Resp::Integer(1));
    assert_eq!(enc(&mut c, "hint"), "hashtable");
    sadd_range(&mut c, "hint2", (0..513).map(|_| "7".to_string()));
    assert_eq!(enc(&mut c, "hint2"), "hashtable");
    sadd_range(&mut c, "hint3", (0..512).map(|_| "7".to_string()));
    assert_eq!(enc(&mut c, "hint3"), "intset");
    c.cmd(&["SADD", "hint4", "a"]);
    sadd_range(&mut c, "hint4", (0..129).map(|_| "a".to_string()));
    assert_eq!(enc(&mut c, "hint4"), "hashtable");
    // SMOVE creates its destination like SADD of one member.
    c.cmd(&["SADD", "{m}src", "5", "w"]);
    c.cmd(&["SMOVE", "{m}src", "{m}d1", "5"]);
    assert_eq!(enc(&mut c, "{m}d1"), "intset");
    c.cmd(&["SMOVE", "{m}src", "{m}d2", "w"]);
    assert_eq!(enc(&mut c, "{m}d2"), "listpack");
    assert_eq!(c.cmd(&["EXISTS", "{m}src"]), Resp::Integer(0));
    // SINTERSTORE makes an intset of an all-integer result, even from hash tables.
    sadd_range(
        &mut c,
        "{s}h1",
        (0..300).map(|i| i.to_string()).chain(["a".into()]),
    );
    sadd_range(
        &mut c,
        "{s}h2",
        (0..300).map(|i| i.to_string()).chain(["b".into()]),
    );
    assert_eq!(enc(&mut c, "{s}h1"), "hashtable");
    assert_eq!(
        c.cmd(&["SINTERSTORE", "{s}r", "{s}h1", "{s}h2"]),
        Resp::Integer(300)
    );
    assert_eq!(enc(&mut c, "{s}r"), "intset");
    c.cmd(&["SADD", "{s}l1", "b", "c", "a", "z"]);
    c.cmd(&["SADD", "{s}l2", "c", "a", "b", "y", "q"]);
    assert_eq!(strs(&c.cmd(&["SINTER", "{s}l2", "{s}l1"])), ["b", "c", "a"]);
    assert_eq!(
        c.cmd(&["SINTERSTORE", "{s}r", "{s}l1", "{s}l2"]),
        Resp::Integer(3)
    );
    assert_eq!(enc(&mut c, "{s}r"), "listpack");
    // SUNIONSTORE/SDIFFSTORE add to a set that starts as an intset.
    c.cmd(&["SADD", "{s}i1", "5", "1"]);
    c.cmd(&["SADD", "{s}i2", "3", "1"]);
    assert_eq!(strs(&c.cmd(&["SUNION", "{s}i1", "{s}i2"])), ["1", "3", "5"]);
    c.cmd(&["SUNIONSTORE", "{s}u", "{s}i1", "{s}i2"]);
    assert_eq!(enc(&mut c, "{s}u"), "intset");
    assert_eq!(
        strs(&c.cmd(&["SUNION", "{s}i1", "{s}l1", "{s}i2"])),
        ["1", "5", "b", "c", "a", "z", "3"]
    );
    c.cmd(&["SUNIONSTORE", "{s}u", "{s}i1", "{s}l1"]);
    assert_eq!(enc(&mut c, "{s}u"), "listpack");
    assert_eq!(strs(&c.cmd(&["SDIFF", "{s}l2", "{s}l1"])), ["y", "q"]);
    // A large first set with small others is copied whole then thinned: the copy's
    // representation (a hash table) stays.
    sadd_range(&mut c, "{s}big", (0..200).map(|i| format!("e{i}")));
    sadd_range(&mut c, "{s}r1", (0..40).map(|i| format!("e{i}")));
    sadd_range(&mut c, "{s}r2", (40..80).map(|i| format!("e{i}")));
    assert_eq!(
        c.cmd(&["SDIFFSTORE", "{s}dd", "{s}big", "{s}r1", "{s}r2"]),
        Resp::Integer(120)
    );
    assert_eq!(enc(&mut c, "{s}dd"), "hashtable");
    sadd_range(&mut c, "{s}r12", (0..80).map(|i| format!("e{i}")));
    assert_eq!(
        c.cmd(&["SDIFFSTORE", "{s}dd", "{s}big", "{s}r12"]),
        Resp::Integer(120)
    );
    assert_eq!(enc(&mut c, "{s}dd"), "listpack");
    // SPOP taking most of a set rebuilds what stays: a hash table becomes a listpack,
    // an intset stays one, a listpack keeps its order.
    sadd_range(&mut c, "sp", (0..200).map(|i| format!("p{i}")));
    let r = c.cmd(&["SPOP", "sp", "195"]);
    assert_eq!(r.as_array().map(|v| v.len()), Some(195));
    assert_eq!(c.cmd(&["SCARD", "sp"]), Resp::Integer(5));
    assert_eq!(enc(&mut c, "sp"), "listpack");
    sadd_range(&mut c, "spi", (0..200).map(|i| i.to_string()));
    c.cmd(&["SPOP", "spi", "190"]);
    assert_eq!(enc(&mut c, "spi"), "intset");
    sadd_range(&mut c, "spl", (0..20).map(|i| format!("q{i:02}")));
    c.cmd(&["SPOP", "spl", "18"]);
    let left = strs(&c.cmd(&["SMEMBERS", "spl"]));
    assert_eq!(left.len(), 2);
    assert!(left[0] < left[1], "a listpack keeps its order: {left:?}");
    // SPOP taking everything answers like SUNION of the key: the integers before the
    // first string come back ascending.
    c.cmd(&["SADD", "all", "5", "1", "b"]);
    assert_eq!(strs(&c.cmd(&["SPOP", "all", "10"])), ["1", "5", "b"]);
    assert_eq!(c.cmd(&["EXISTS", "all"]), Resp::Integer(0));
    // COPY and RENAME keep the representation.
    c.cmd(&["COPY", "l", "lcopy"]);
    assert_eq!(enc(&mut c, "lcopy"), "listpack");
    assert_eq!(strs(&c.cmd(&["SMEMBERS", "lcopy"])), ["c", "b", "a"]);
    c.cmd(&["RENAME", "i512", "renamed"]);
    assert_eq!(enc(&mut c, "renamed"), "hashtable");
    assert_eq!(c.cmd(&["SCARD", "renamed"]), Resp::Integer(513));
}

#[test]
fn encodings_and_orders_threads1() {
    encodings_and_orders(1);
}

#[test]
fn encodings_and_orders_threads4() {
    encodings_and_orders(4);
}

fn resp3_types(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    c.cmd(&["HELLO", "3"]);
    c.cmd(&["SADD", "a", "1", "2", "3"]);
    c.cmd(&["SADD", "b", "2", "3", "x"]);
    assert!(matches!(c.cmd(&["SMEMBERS", "a"]), Resp::Set(v) if v.len() == 3));
    assert!(matches!(c.cmd(&["SMEMBERS", "nokey"]), Resp::Set(v) if v.is_empty()));
    assert!(matches!(c.cmd(&["SINTER", "a", "b"]), Resp::Set(v) if v.len() == 2));
    assert!(matches!(c.cmd(&["SUNION", "a", "b"]), Resp::Set(v) if v.len() == 4));
    assert!(matches!(c.cmd(&["SDIFF", "a", "b"]), Resp::Set(v) if v.len() == 1));
    assert!(matches!(c.cmd(&["SRANDMEMBER", "a", "2"]), Resp::Array(v) if v.len() == 2));
    assert!(matches!(c.cmd(&["SRANDMEMBER", "a", "-5"]), Resp::Array(v) if v.len() == 5));
    assert!(matches!(c.cmd(&["SPOP", "a", "2"]), Resp::Set(v) if v.len() == 2));
    assert!(matches!(c.cmd(&["SPOP", "a", "5"]), Resp::Set(v) if v.len() == 1));
    assert_eq!(c.cmd(&["SPOP", "a"]), Resp::Null);
    assert!(
        matches!(c.cmd(&["SMISMEMBER", "b", "x", "y"]), Resp::Array(v) if v == vec![Resp::Integer(1), Resp::Integer(0)])
    );
}

#[test]
fn resp3_types_threads1() {
    resp3_types(1);
}

#[test]
fn resp3_types_threads4() {
    resp3_types(4);
}

/// A full SSCAN over a big set that changes between calls returns every member present
/// for the whole scan.
fn sscan_guarantee(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    for chunk in 0..20 {
        sadd_range(
            &mut c,
            "big",
            (chunk * 100..chunk * 100 + 100).map(|i| format!("stable{i}")),
        );
    }
    assert_eq!(enc(&mut c, "big"), "hashtable");
    let mut seen = HashSet::new();
    let mut cursor = "0".to_string();
    let mut round = 0;
    loop {
        let r = c.cmd(&["SSCAN", "big", cursor.as_str(), "COUNT", "25"]);
        let v = r.as_array().expect("SSCAN reply");
        cursor = v[0].as_string().unwrap();
        seen.extend(strs(&v[1]));
        round += 1;
        // Grow and shrink between calls so the table resizes under the cursor.
        if round % 4 == 0 {
            sadd_range(&mut c, "big", (0..1500).map(|i| format!("tmp{round}-{i}")));
        } else if round % 4 == 2 {
            let tmp: Vec<String> = strs(&c.cmd(&["SMEMBERS", "big"]))
                .into_iter()
                .filter(|m| m.starts_with("tmp"))
                .collect();
            if !tmp.is_empty() {
                let mut a = vec!["SREM".to_string(), "big".to_string()];
                a.extend(tmp);
                c.cmd(&a);
            }
        }
        if cursor == "0" {
            break;
        }
        assert!(round < 100_000, "SSCAN does not end");
    }
    for i in 0..2000 {
        assert!(
            seen.contains(&format!("stable{i}")),
            "SSCAN missed stable{i}"
        );
    }
    // MATCH filters, COUNT is a hint; small sets come back whole with cursor 0.
    c.cmd(&["SADD", "small", "a1", "a2", "b1"]);
    let r = c.cmd(&["SSCAN", "small", "0", "MATCH", "a*", "COUNT", "1"]);
    assert_eq!(r.as_array().unwrap()[0], Resp::bulk("0"));
    assert_eq!(strs(&r.as_array().unwrap()[1]), ["a1", "a2"]);
}

#[test]
fn sscan_guarantee_threads1() {
    sscan_guarantee(1);
}

#[test]
fn sscan_guarantee_threads4() {
    sscan_guarantee(4);
}

/// Cross-shard SMOVE is atomic: a member moved back and forth between sets on different
/// shards is always in exactly one of them for readers of both.
fn cross_shard_atomicity(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    // a, b, c and d are on four different shards with 4 threads.
    c.cmd(&["SADD", "a", "token", "1", "2"]);
    c.cmd(&["SADD", "b", "3", "4"]);
    let port = kite.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mover = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut c = Client::connect(port);
            let mut moves = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (from, to) = if moves % 2 == 0 {
                    ("a", "b")
                } else {
                    ("b", "a")
                };
                assert_eq!(c.cmd(&["SMOVE", from, to, "token"]), Resp::Integer(1));
                moves += 1;
            }
            moves
        })
    };
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut checks = 0;
    while Instant::now() < deadline {
        let u = strs(&c.cmd(&["SUNION", "a", "b"]));
        assert_eq!(
            u.iter().filter(|m| *m == "token").count(),
            1,
            "SUNION saw {u:?}"
        );
        assert_eq!(c.cmd(&["SINTERCARD", "2", "a", "b"]), Resp::Integer(0));
        let n = c.cmd(&["SUNIONSTORE", "d", "a", "b"]);
        assert_eq!(n, Resp::Integer(5));
        assert_eq!(c.cmd(&["SISMEMBER", "d", "token"]), Resp::Integer(1));
        let r = c.cmd(&["SDIFFSTORE", "c", "a", "b"]);
        assert!(
            matches!(r, Resp::Integer(2) | Resp::Integer(3)),
            "SDIFFSTORE gave {r}"
        );
        checks += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let moves = mover.join().expect("mover thread");
    assert!(moves > 0 && checks > 0);
    // Cross-shard forms inside MULTI/EXEC.
    c.cmd(&["MULTI"]);
    c.cmd(&["SUNIONSTORE", "c", "a", "b"]);
    c.cmd(&["SMOVE", "c", "d", "1"]);
    c.cmd(&["SINTERCARD", "2", "c", "d"]);
    let r = c.cmd(&["EXEC"]);
    assert_eq!(
        r,
        Resp::Array(vec![Resp::Integer(5), Resp::Integer(1), Resp::Integer(4)])
    );
}

#[test]
fn cross_shard_atomicity_threads1() {
    cross_shard_atomicity(1);
}

#[test]
fn cross_shard_atomicity_threads4() {
    cross_shard_atomicity(4);
}
