//! Hash commands: differential tests against a real redis-server (seeded random command
//! sequences and scripted edge cases) and Kite-only checks of what cannot be compared
//! reply by reply (random picks, HSCAN cursors over big hashes).
//!
//! Reproduce one seed: `KITE_HASH_SEEDS=7 cargo test --release --test hashes`.
//! Longer runs: `KITE_HASH_OPS=20000`.
//!
//! Field order: while a hash is a listpack, Redis keeps insertion order and so does Kite,
//! so HKEYS/HVALS/HGETALL/HSCAN replies on listpack hashes are compared byte for byte;
//! hashtable order is Redis's dict order, so those replies are compared as multisets
//! (HGETALL as multisets of pairs).
//!
//! The reference is redis-server 7.0, Kite follows 7.2. The one difference these
//! sequences could reach: 7.2 makes a hash a hashtable as soon as one HSET carries more
//! pairs than hash-max-listpack-entries, duplicates included, where 7.0 counts distinct
//! fields. The generator's wide HSETs use distinct fields (where both agree) and the 7.2
//! rule is checked on Kite alone.

#[macro_use]
mod common;

use common::*;
use std::collections::{BTreeMap, HashSet, VecDeque};

// ---------------------------------------------------------------------------
// The random generator
// ---------------------------------------------------------------------------

/// Keys that hold hashes (or nothing); several share a hashtag so RENAME/COPY stay on
/// one shard, the rest spread over shards.
const HASH_KEYS: &[&[u8]] = &[
    b"h1",
    b"h2",
    b"{h}:1",
    b"{h}:2",
    b"{h}:3",
    b"big",
    b"bin\x00h\xff",
];
/// Keys that hold strings, for WRONGTYPE replies.
const STRING_KEYS: &[&[u8]] = &[b"s1", b"{h}:s"];

/// HINCRBYFLOAT only touches these fields, and only with values and increments exact in
/// binary, so no result depends on rounding (long double precision is tested apart).
const FLOAT_FIELDS: &[&str] = &["fl1", "fl2"];
const FLOAT_VALUES: &[&str] = &["0", "1.5", "-0.25", "3", "1e3", "-2.5e2", "0.125", "7"];
const FLOAT_INCRS: &[&str] = &["0.5", "-1.25", "3", "2.5e3", "-0.125", "1", "0", "-7.75"];

const MATCH_PATTERNS: &[&str] = &["*", "a*", "?", "n*", "*1", "[ab]", "x*", "f*", "*:*"];

fn long(prefix: &str, len: usize) -> Vec<u8> {
    let mut v = prefix.as_bytes().to_vec();
    v.resize(len, b'z');
    v
}

struct Gen {
    rng: Rng,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
        }
    }

    fn hash_key(&mut self) -> Vec<u8> {
        self.rng.pick(HASH_KEYS).to_vec()
    }

    /// Mostly hash keys, sometimes a string key.
    fn key(&mut self) -> Vec<u8> {
        if self.rng.chance(12) {
            self.rng.pick(STRING_KEYS).to_vec()
        } else {
            self.hash_key()
        }
    }

    fn field(&mut self) -> Vec<u8> {
        match self.rng.below(100) {
            0 => long("long65:", 65),
            1 => long("long64:", 64),
            2 => b"bin\x00\xff".to_vec(),
            3 => Vec::new(),
            4..=9 => self.rng.pick(FLOAT_FIELDS).as_bytes().to_vec(),
            10..=24 => self.rng.pick(&["n1", "n2"]).as_bytes().to_vec(),
            25..=34 => format!("f:{}", self.rng.below(40)).into_bytes(),
            _ => self
                .rng
                .pick(&["a", "b", "c", "d", "x1", "x2", "ab"])
                .as_bytes()
                .to_vec(),
        }
    }

    /// A field other than the float fields (their values stay exact in binary).
    fn plain_field(&mut self) -> Vec<u8> {
        loop {
            let f = self.field();
            if !FLOAT_FIELDS.iter().any(|x| x.as_bytes() == f) {
                return f;
            }
        }
    }

    fn value(&mut self) -> Vec<u8> {
        match self.rng.below(100) {
            0 => long("v65:", 65),
            1 => long("v64:", 64),
            2 => Vec::new(),
            3..=5 => self
                .rng
                .pick(&[
                    "9223372036854775807",
                    "-9223372036854775808",
                    "9223372036854775806",
                    "010",
                    "+1",
                    " 1",
                    "1.5",
                ])
                .as_bytes()
                .to_vec(),
            6..=40 => self.rng.range(-1000, 1000).to_string().into_bytes(),
            _ => {
                let n = self.rng.range(1, 8) as usize;
                (0..n).map(|_| b"abc"[self.rng.index(3)]).collect()
            }
        }
    }

    /// A field and a value that keeps the float fields exact.
    fn pair(&mut self) -> (Vec<u8>, Vec<u8>) {
        let f = self.field();
        let v = if FLOAT_FIELDS.iter().any(|x| x.as_bytes() == f) {
            self.rng.pick(FLOAT_VALUES).as_bytes().to_vec()
        } else {
            self.value()
        };
        (f, v)
    }

    fn next_step(&mut self) -> Step {
        let r = self.rng.below(1000);
        match r {
            0..=149 => {
                let key = self.key();
                let mut a = args!["HSET", key];
                for _ in 0..self.rng.range(1, 3) {
                    let (f, v) = self.pair();
                    a.push(f);
                    a.push(v);
                }
                Step::exact(a)
            }
            150..=159 => {
                let (key, f) = (self.key(), self.field());
                Step::exact(args!["HSET", key, f, "v", "odd"])
            }
            160..=189 => {
                let key = self.key();
                let mut a = args!["HMSET", key];
                for _ in 0..self.rng.range(1, 3) {
                    let (f, v) = self.pair();
                    a.push(f);
                    a.push(v);
                }
                if self.rng.chance(10) {
                    a.pop();
                }
                Step::exact(a)
            }
            190..=229 => {
                let key = self.key();
                let (f, v) = self.pair();
                Step::exact(args!["HSETNX", key, f, v])
            }
            230..=329 => {
                let (key, f) = (self.key(), self.field());
                Step::exact(args!["HGET", key, f])
            }
            330..=379 => {
                let key = self.key();
                let mut a = args!["HMGET", key];
                for _ in 0..self.rng.range(1, 4) {
                    a.push(self.field());
                }
                Step::exact(a)
            }
            380..=459 => {
                let key = self.key();
                let mut a = args!["HDEL", key];
                for _ in 0..self.rng.range(1, 4) {
                    a.push(self.field());
                }
                Step::exact(a)
            }
            460..=489 => Step::exact(args!["HLEN", self.key()]),
            490..=519 => {
                let (key, f) = (self.key(), self.field());
                Step::exact(args!["HSTRLEN", key, f])
            }
            520..=549 => {
                let (key, f) = (self.key(), self.field());
                Step::exact(args!["HEXISTS", key, f])
            }
            550..=609 => {
                let key = self.key();
                let f = if self.rng.chance(80) {
                    self.rng.pick(&["n1", "n2"]).as_bytes().to_vec()
                } else {
                    self.plain_field()
                };
                let incr: Vec<u8> = match self.rng.below(10) {
                    0 => self
                        .rng
                        .pick(&[
                            "9223372036854775807",
                            "-9223372036854775808",
                            "abc",
                            "1.5",
                            "",
                            "010",
                        ])
                        .as_bytes()
                        .to_vec(),
                    _ => self.rng.range(-100, 100).to_string().into_bytes(),
                };
                Step::exact(args!["HINCRBY", key, f, incr])
            }
            610..=649 => {
                let key = self.key();
                let f = self.rng.pick(FLOAT_FIELDS).as_bytes().to_vec();
                let incr = match self.rng.below(12) {
                    0 => self.rng.pick(&["abc", "inf", "-inf", "nan", "", " 1"]),
                    _ => self.rng.pick(FLOAT_INCRS),
                };
                Step::exact(args!["HINCRBYFLOAT", key, f, *incr])
            }
            650..=669 => {
                let key = self.key();
                Step::new(args!["HKEYS", &key], Check::Whole { key, pairs: false })
            }
            670..=689 => {
                let key = self.key();
                Step::new(args!["HVALS", &key], Check::Whole { key, pairs: false })
            }
            690..=719 => {
                let key = self.key();
                Step::new(args!["HGETALL", &key], Check::Whole { key, pairs: true })
            }
            720..=769 => self.randfield(),
            770..=799 => {
                let key = self.key();
                let mut opts = Args::new();
                if self.rng.chance(50) {
                    opts.extend(args!["MATCH", *self.rng.pick(MATCH_PATTERNS)]);
                }
                if self.rng.chance(50) {
                    opts.extend(args!["COUNT", *self.rng.pick(&["1", "3", "10", "100"])]);
                }
                Step::new(Args::new(), Check::Scan { key, opts })
            }
            800..=809 => {
                let key = self.key();
                let bad: Args = match self.rng.below(6) {
                    0 => args!["HSCAN", key, "abc"],
                    1 => args!["HSCAN", key, "0", "COUNT", "0"],
                    2 => args!["HSCAN", key, "0", "COUNT", "x"],
                    3 => args!["HSCAN", key, "0", "NOVALUES"],
                    4 => args!["HSCAN", key, "0", "MATCH"],
                    _ => args!["HSCAN", key, " 1"],
                };
                Step::exact(bad)
            }
            810..=849 => Step::exact(args!["OBJECT", "ENCODING", self.key()]),
            850..=869 => Step::exact(args!["DEL", self.hash_key()]),
            870..=879 => {
                let k = self.rng.pick(STRING_KEYS).to_vec();
                Step::exact(args!["SET", k, "str"])
            }
            880..=889 => {
                let key = self.hash_key();
                if self.rng.chance(50) {
                    Step::exact(args!["EXPIRE", key, "1000"])
                } else {
                    Step::new(args!["TTL", key], Check::Tolerance(1))
                }
            }
            890..=899 => {
                let (a, b) = (
                    format!("{{h}}:{}", self.rng.range(1, 3)),
                    format!("{{h}}:{}", self.rng.range(1, 3)),
                );
                if self.rng.chance(50) {
                    Step::exact(args!["RENAME", a, b])
                } else {
                    Step::exact(args!["COPY", a, b, "REPLACE"])
                }
            }
            900..=919 => Step::exact(args![*self.rng.pick(&["TYPE", "EXISTS"]), self.key()]),
            920..=929 => {
                // A wide HSET of distinct fields: past 512 pairs the hash converts.
                let key = if self.rng.chance(60) {
                    b"big".to_vec()
                } else {
                    self.hash_key()
                };
                let n = self.rng.range(400, 600);
                let base = self.rng.below(300);
                let mut a = args!["HSET", key];
                for i in 0..n {
                    a.push(format!("w:{}", base + i as u64).into_bytes());
                    a.push(format!("{}", i).into_bytes());
                }
                Step::exact(a)
            }
            930..=949 => {
                // Take the wide fields away again, a few at a time.
                let key = self.hash_key();
                let mut a = args!["HDEL", key];
                let start = self.rng.below(900);
                for i in 0..self.rng.range(1, 60) {
                    a.push(format!("w:{}", start + i as u64).into_bytes());
                }
                Step::exact(a)
            }
            950..=969 => {
                let key = self.hash_key();
                Step::exact(args!["HLEN", key])
            }
            970..=979 => {
                let wrong: Args = match self.rng.below(5) {
                    0 => args!["HGET", self.key()],
                    1 => args!["HSET", self.key(), "f"],
                    2 => args!["HINCRBY", self.key(), "f"],
                    3 => args!["HRANDFIELD"],
                    _ => args!["HSCAN", self.key()],
                };
                Step::exact(wrong)
            }
            _ => {
                let key = self.hash_key();
                Step::exact(args!["OBJECT", "ENCODING", key])
            }
        }
    }

    fn randfield(&mut self) -> Step {
        let key = self.key();
        match self.rng.below(10) {
            0 => Step::new(
                args!["HRANDFIELD", &key],
                Check::Rand {
                    key,
                    count: None,
                    with_values: false,
                },
            ),
            1 => {
                let bad = self.rng.pick(&[
                    "-9223372036854775808",
                    "9223372036854775807",
                    "abc",
                    "4611686018427387904",
                ]);
                // Every one of these is an error: bad counts, counts too large to double
                // with WITHVALUES, or a stray argument.
                let mut a = args!["HRANDFIELD", key, *bad, "WITHVALUES"];
                if self.rng.chance(20) {
                    a.push(b"extra".to_vec());
                }
                Step::exact(a)
            }
            _ => {
                let count = match self.rng.below(4) {
                    0 => self.rng.range(-5, 5),
                    1 => self.rng.range(-700, -1),
                    _ => self.rng.range(0, 700),
                };
                let with_values = self.rng.chance(50);
                let mut a = args!["HRANDFIELD", &key, count];
                if with_values {
                    a.push(
                        self.rng
                            .pick(&["WITHVALUES", "withvalues"])
                            .as_bytes()
                            .to_vec(),
                    );
                }
                Step::new(
                    a,
                    Check::Rand {
                        key,
                        count: Some(count),
                        with_values,
                    },
                )
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Running steps on both servers
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Check {
    Exact,
    /// Integers within this distance when both are >= 0 (TTL).
    Tolerance(i64),
    /// HKEYS/HVALS/HGETALL of `key`: exact while Redis holds it as a listpack, else as
    /// multisets (of pairs when `pairs`).
    Whole {
        key: Vec<u8>,
        pairs: bool,
    },
    /// HRANDFIELD: compared by shape, length, membership and (for positive counts)
    /// distinctness against the hash's contents in Redis.
    Rand {
        key: Vec<u8>,
        count: Option<i64>,
        with_values: bool,
    },
    /// A whole HSCAN iteration with `opts`: the same set of pairs on both servers, and
    /// the same reply to the first call while Redis holds a listpack.
    Scan {
        key: Vec<u8>,
        opts: Args,
    },
}

struct Step {
    args: Args,
    check: Check,
}

impl Step {
    fn new(args: Args, check: Check) -> Step {
        Step { args, check }
    }

    fn exact(args: Args) -> Step {
        Step::new(args, Check::Exact)
    }
}

struct Pair {
    kite: Client,
    redis: Client,
    /// Side connection to Redis (RESP2, same database) for looking at contents and
    /// encodings without touching the history.
    redis_side: Client,
    resp3: bool,
    history: VecDeque<String>,
    label: String,
    count: usize,
    /// How many listpack replies were compared in order, and how many hashtable ones as
    /// multisets (printed with KITE_HASH_STATS).
    ordered: usize,
    unordered: usize,
    /// Per command name: (non-error replies, error replies) from redis-server.
    stats: BTreeMap<String, (usize, usize)>,
}

impl Pair {
    fn new(kite: &KiteServer, redis: &RedisServer, resp3: bool, label: String) -> Pair {
        let mut p = Pair {
            kite: kite.client(),
            redis: redis.client(),
            redis_side: redis.client(),
            resp3,
            history: VecDeque::new(),
            label,
            count: 0,
            ordered: 0,
            unordered: 0,
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

    fn fail(&self, what: &str, kite: &str, redis: &str) -> ! {
        let hist: Vec<String> = self.history.iter().cloned().collect();
        panic!(
            "\nHASH DIFFERENTIAL MISMATCH ({})\n  command #{}: {}\n  kite:  {}\n  redis: {}\n\
             last commands (oldest first):\n    {}\n",
            self.label,
            self.count,
            what,
            kite,
            redis,
            hist.join("\n    ")
        );
    }

    fn note(&mut self, what: &str, reply: &Resp) {
        let name = what.split(' ').next().unwrap_or("").to_ascii_uppercase();
        let entry = self.stats.entry(name).or_default();
        if reply.is_error() {
            entry.1 += 1;
        } else {
            entry.0 += 1;
        }
        let mut line = format!("#{} {} -> {}", self.count, what, reply);
        if line.len() > 300 {
            let mut cut = 300;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str("...");
        }
        self.history.push_back(line);
        if self.history.len() > 25 {
            self.history.pop_front();
        }
        self.count += 1;
    }

    fn both(&mut self, args: &Args) -> (Resp, Resp) {
        self.kite.send(args);
        let kr = self.kite.try_read();
        self.redis.send(args);
        let rr = self.redis.try_read();
        match (kr, rr) {
            (Ok(k), Ok(r)) => (k, r),
            (k, r) => {
                let k = k
                    .map(|x| x.to_string())
                    .unwrap_or_else(|e| format!("<no reply: {e}>"));
                let r = r
                    .map(|x| x.to_string())
                    .unwrap_or_else(|e| format!("<no reply: {e}>"));
                self.fail(&fmt_cmd(args), &k, &r);
            }
        }
    }

    fn redis_encoding(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let r = self.redis_side.cmd(&[&b"OBJECT"[..], b"ENCODING", key]);
        r.as_bytes().map(|b| b.to_vec())
    }

    /// The hash at `key` in Redis, or None when it is not a hash.
    fn redis_contents(&mut self, key: &[u8]) -> Option<BTreeMap<Vec<u8>, Vec<u8>>> {
        if self.redis_side.cmd(&[&b"TYPE"[..], key]).as_bytes() != Some(b"hash") {
            return None;
        }
        let r = self.redis_side.cmd(&[&b"HGETALL"[..], key]);
        let items = r.as_array().expect("HGETALL array");
        Some(
            items
                .chunks(2)
                .map(|p| {
                    (
                        p[0].as_bytes().unwrap().to_vec(),
                        p[1].as_bytes().unwrap().to_vec(),
                    )
                })
                .collect(),
        )
    }

    fn run(&mut self, step: &Step) {
        if let Check::Scan { key, opts } = &step.check {
            return self.run_scan(key, opts);
        }
        let what = fmt_cmd(&step.args);
        let (kr, rr) = self.both(&step.args);
        let ok = match &step.check {
            Check::Exact => kr == rr,
            Check::Tolerance(t) => match (&kr, &rr) {
                (Resp::Integer(a), Resp::Integer(b)) if *a >= 0 && *b >= 0 => (a - b).abs() <= *t,
                _ => kr == rr,
            },
            Check::Whole { key, pairs } => {
                if kr == rr {
                    true
                } else if self.redis_encoding(key).as_deref() == Some(b"listpack") {
                    self.fail(
                        &format!("{what} (listpack: order must match)"),
                        &kr.to_string(),
                        &rr.to_string(),
                    );
                } else {
                    self.unordered += 1;
                    as_multiset(&kr, *pairs) == as_multiset(&rr, *pairs)
                }
            }
            Check::Rand {
                key,
                count,
                with_values,
            } => {
                if let Err(e) = self.check_rand(key, *count, *with_values, &kr, &rr) {
                    self.fail(&format!("{what}: {e}"), &kr.to_string(), &rr.to_string());
                }
                true
            }
            Check::Scan { .. } => unreachable!(),
        };
        if matches!(step.check, Check::Whole { .. }) && kr == rr && !kr.is_error() {
            self.ordered += 1;
        }
        if !ok {
            self.fail(&what, &kr.to_string(), &rr.to_string());
        }
        self.note(&what, &rr);
    }

    fn check_rand(
        &mut self,
        key: &[u8],
        count: Option<i64>,
        with_values: bool,
        kr: &Resp,
        rr: &Resp,
    ) -> Result<(), String> {
        if kr.is_error() || rr.is_error() || kr.is_null() || rr.is_null() {
            return if kr == rr {
                Ok(())
            } else {
                Err("different error or null".into())
            };
        }
        let contents = self.redis_contents(key).unwrap_or_default();
        let Some(count) = count else {
            let (Some(k), Some(r)) = (kr.as_bytes(), rr.as_bytes()) else {
                return Err("expected bulk strings".into());
            };
            for f in [k, r] {
                if !contents.contains_key(f) {
                    return Err(format!("{} is not a field", escape_bytes(f)));
                }
            }
            return Ok(());
        };
        let expected = if contents.is_empty() {
            0
        } else if count >= 0 {
            (count as usize).min(contents.len())
        } else {
            count.unsigned_abs() as usize
        };
        let resp3 = self.resp3;
        for (side, reply) in [("kite", kr), ("redis", rr)] {
            let picks = rand_picks(reply, with_values, resp3)
                .ok_or_else(|| format!("{side}: malformed reply"))?;
            if picks.len() != expected {
                return Err(format!(
                    "{side}: {} picks, expected {expected}",
                    picks.len()
                ));
            }
            for (f, v) in &picks {
                match contents.get(f) {
                    None => return Err(format!("{side}: {} is not a field", escape_bytes(f))),
                    Some(val) if with_values && v.as_ref() != Some(val) => {
                        return Err(format!("{side}: wrong value for {}", escape_bytes(f)))
                    }
                    _ => {}
                }
            }
            if count > 0 {
                let distinct: HashSet<&Vec<u8>> = picks.iter().map(|(f, _)| f).collect();
                if distinct.len() != picks.len() {
                    return Err(format!("{side}: repeated fields for a positive count"));
                }
            }
        }
        Ok(())
    }

    fn run_scan(&mut self, key: &[u8], opts: &Args) {
        let mut first: Option<(Resp, Resp)> = None;
        let mut sets = Vec::new();
        for side in 0..2 {
            let mut cursor = b"0".to_vec();
            let mut set = HashSet::new();
            for calls in 0.. {
                assert!(calls < 100_000, "HSCAN did not finish");
                let mut a = args!["HSCAN", key, &cursor];
                a.extend(opts.iter().cloned());
                let c = if side == 0 {
                    &mut self.kite
                } else {
                    &mut self.redis
                };
                let r = c.cmd(&a);
                if calls == 0 {
                    let f = first.get_or_insert((Resp::Null, Resp::Null));
                    if side == 0 {
                        f.0 = r.clone();
                    } else {
                        f.1 = r.clone();
                    }
                }
                let Some(parts) = r.as_array().filter(|p| p.len() == 2) else {
                    break;
                };
                cursor = parts[0].as_bytes().expect("cursor").to_vec();
                let items = parts[1].as_array().expect("HSCAN items");
                for p in items.chunks(2) {
                    set.insert((
                        p[0].as_bytes().unwrap().to_vec(),
                        p[1].as_bytes().unwrap().to_vec(),
                    ));
                }
                if cursor == b"0" {
                    break;
                }
            }
            sets.push(set);
        }
        let mut what = fmt_cmd(&[&b"HSCAN"[..], key, b"<full iteration>"]);
        for o in opts {
            what.push(' ');
            what.push_str(&fmt_cmd(&[o]));
        }
        let (kf, rf) = first.expect("first replies");
        // Errors must match, and so must a listpack's one-call reply (insertion order);
        // a hashtable's cursors and order are Kite's own.
        if kf != rf
            && (kf.is_error()
                || rf.is_error()
                || self.redis_encoding(key).as_deref() == Some(b"listpack"))
        {
            self.fail(&what, &kf.to_string(), &rf.to_string());
        }
        if sets[0] != sets[1] {
            self.fail(
                &what,
                &format!("{} pairs", sets[0].len()),
                &format!("{} pairs", sets[1].len()),
            );
        }
        self.note(&what, &Resp::Integer(sets[1].len() as i64));
    }

    /// Compares every key of the database: types, contents, encodings, TTLs.
    fn compare_state(&mut self) {
        let keys = self.redis_side.cmd(&["KEYS", "*"]);
        let mut keys: Vec<Vec<u8>> = bytes_set(&keys).into_iter().collect();
        keys.sort();
        let (kk, rk) = self.both(&args!["DBSIZE"]);
        if kk != rk {
            self.fail("DBSIZE", &kk.to_string(), &rk.to_string());
        }
        for k in keys {
            self.run(&Step::exact(args!["TYPE", &k]));
            self.run(&Step::new(
                args!["HGETALL", &k],
                Check::Whole {
                    key: k.clone(),
                    pairs: true,
                },
            ));
            self.run(&Step::exact(args!["OBJECT", "ENCODING", &k]));
            self.run(&Step::new(args!["TTL", &k], Check::Tolerance(1)));
        }
    }
}

/// An HKEYS/HVALS/HGETALL reply as a sorted list of items (pairs for HGETALL).
fn as_multiset(r: &Resp, pairs: bool) -> Option<Vec<Vec<u8>>> {
    let mut items: Vec<Vec<u8>> = match r {
        Resp::Map(m) => m
            .iter()
            .map(|(k, v)| [k.encode(), v.encode()].concat())
            .collect(),
        Resp::Array(v) if pairs => v
            .chunks(2)
            .map(|p| Some([p[0].encode(), p.get(1)?.encode()].concat()))
            .collect::<Option<Vec<Vec<u8>>>>()?,
        Resp::Array(v) => v.iter().map(|x| x.encode()).collect(),
        _ => return None,
    };
    items.sort();
    Some(items)
}

/// The (field, value) picks of an HRANDFIELD count reply.
/// A field and, with WITHVALUES, its value.
type Pick = (Vec<u8>, Option<Vec<u8>>);

fn rand_picks(r: &Resp, with_values: bool, resp3: bool) -> Option<Vec<Pick>> {
    let items = r.as_array()?;
    let bytes = |x: &Resp| x.as_bytes().map(|b| b.to_vec());
    if !with_values {
        return items.iter().map(|x| Some((bytes(x)?, None))).collect();
    }
    if resp3 {
        items
            .iter()
            .map(|x| match x.as_array()? {
                [f, v] => Some((bytes(f)?, Some(bytes(v)?))),
                _ => None,
            })
            .collect()
    } else {
        if items.len() % 2 != 0 {
            return None;
        }
        items
            .chunks(2)
            .map(|p| Some((bytes(&p[0])?, Some(bytes(&p[1])?))))
            .collect()
    }
}

fn run_random(threads: usize, resp3: bool, default_seeds: &[u64], test: &str) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let ops = usize_from_env("KITE_HASH_OPS", 4000);
    for seed in seeds_from_env("KITE_HASH_SEEDS", default_seeds) {
        let label = format!(
            "seed {seed}, {}, {} vs redis-server; reproduce: KITE_HASH_SEEDS={seed} cargo test --release --test hashes {test}",
            if resp3 { "RESP3" } else { "RESP2" },
            kite.name
        );
        let mut pair = Pair::new(&kite, &redis, resp3, label);
        let mut gen = Gen::new(seed);
        while pair.count < ops {
            let step = gen.next_step();
            pair.run(&step);
        }
        pair.compare_state();
        if std::env::var_os("KITE_HASH_STATS").is_some() {
            eprintln!(
                "seed {seed}: {} whole-hash replies equal in order, {} compared as multisets",
                pair.ordered, pair.unordered
            );
            for (name, (ok, err)) in &pair.stats {
                eprintln!("  {name:<14} {ok:>6} ok {err:>6} errors");
            }
        }
    }
}

#[test]
fn random_hash_commands_threads1() {
    run_random(1, false, &[1, 2], "random_hash_commands_threads1");
}

#[test]
fn random_hash_commands_threads1_resp3() {
    run_random(1, true, &[11, 12], "random_hash_commands_threads1_resp3");
}

#[test]
fn random_hash_commands_threads4() {
    run_random(4, false, &[21, 22], "random_hash_commands_threads4");
}

#[test]
fn random_hash_commands_threads4_resp3() {
    run_random(4, true, &[31, 32], "random_hash_commands_threads4_resp3");
}

// ---------------------------------------------------------------------------
// Scripted differential scenarios
// ---------------------------------------------------------------------------

fn script(p: &mut Pair, lines: &[&str]) {
    for l in lines {
        let a: Args = l.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        p.run(&Step::exact(a));
    }
}

#[test]
fn hash_errors_and_edge_cases_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    for resp3 in [false, true] {
        let mut p = Pair::new(
            &kite,
            &redis,
            resp3,
            format!("hash edge cases, resp3={resp3}"),
        );
        script(
            &mut p,
            &[
                "SET s x",
                "HSET h",
                "HSET h f",
                "HSET h f v g",
                "HSET s f v g",
                "HSET s f v",
                "HMSET h f",
                "HMSET s f v g",
                "HSETNX h f",
                "HGET h",
                "HGET nokey f",
                "HMGET nokey f g",
                "HMGET s f",
                "HDEL nokey f",
                "HDEL s f",
                "HLEN nokey",
                "HSTRLEN nokey f",
                "HEXISTS nokey f",
                "HKEYS nokey",
                "HVALS nokey",
                "HGETALL nokey",
                "HGETALL s",
                "HSET h a 1 b 2 c 3 a 4",
                "HMSET h d 5 e 6",
                "HGETALL h",
                "HKEYS h",
                "HVALS h",
                "HDEL h a a zz",
                "HGETALL h",
                "HSETNX h b 9",
                "HSETNX h z 9",
                "HSTRLEN h z",
                "HINCRBY h b",
                "HINCRBY h b x",
                "HINCRBY s b x",
                "HINCRBY s b 1",
                "HINCRBY h b 9223372036854775805",
                "HINCRBY h b 1",
                "HINCRBY h b -9223372036854775808",
                "HSET h m -9223372036854775808",
                "HINCRBY h m -1",
                "HINCRBY h m 9223372036854775807",
                "HINCRBY h d 1.5",
                "HSET h q 010 r 1.0 t abc",
                "HINCRBY h q 1",
                "HINCRBY h r 1",
                "HINCRBYFLOAT h r 1",
                "HINCRBYFLOAT h t 1",
                "HINCRBYFLOAT h new 1e3",
                "HINCRBYFLOAT h new inf",
                "HINCRBYFLOAT h new -inf",
                "HINCRBYFLOAT h new nan",
                "HINCRBYFLOAT h new abc",
                "HINCRBYFLOAT s new 1",
                "HINCRBYFLOAT s new inf",
                "HSET h bigf 1e4932",
                "HINCRBYFLOAT h bigf 1e4932",
                "HRANDFIELD nokey",
                "HRANDFIELD nokey 3",
                "HRANDFIELD nokey 3 WITHVALUES",
                "HRANDFIELD nokey 0",
                "HRANDFIELD nokey -9223372036854775808",
                "HRANDFIELD nokey 9223372036854775807 WITHVALUES",
                "HRANDFIELD nokey -4611686018427387904 WITHVALUES",
                "HRANDFIELD nokey 4611686018427387904 WITHVALUES",
                "HRANDFIELD nokey 1 WITHVALUE",
                "HRANDFIELD nokey 1 WITHVALUES x",
                "HRANDFIELD nokey x",
                "HRANDFIELD s",
                "HRANDFIELD s 0",
                "HRANDFIELD h 0",
                "HRANDFIELD h 0 WITHVALUES",
                "HSCAN nokey 0",
                "HSCAN nokey x",
                "HSCAN nokey 0 NOVALUES",
                "HSCAN s 0",
                "HSCAN s x",
                "HSCAN h 0 NOVALUES",
                "HSCAN h 0 COUNT 0",
                "HSCAN h 0 COUNT -1",
                "HSCAN h 0 COUNT x",
                "HSCAN h 0 MATCH",
                "HSCAN h 0 COUNT 1 MATCH",
                "HSCAN h 0 MATCH * COUNT 1",
                "HSCAN h 0 MATCH [bd]",
                "HSCAN h 0 match b* count 100",
                "HSCAN h 7",
                "HSCAN h +7",
                "HSCAN h -7",
                "HSCAN h 18446744073709551615",
                "HSCAN h 18446744073709551616",
                "HSCAN h 1x",
                "HSCAN h 0x",
                "HDEL h b c d e z q r t m new bigf",
                "EXISTS h",
                "HSET h2 f v",
                "EXPIRE h2 100",
                "HSET h2 g w",
                "HDEL h2 f",
                "HINCRBY h2 n 1",
            ],
        );
        p.run(&Step::new(args!["TTL", "h2"], Check::Tolerance(1)));
        // Binary safety: fields and values with NUL, CR, LF and high bytes.
        for a in [
            args!["HSET", "b\x00in", "f\x00\r\n", &b"v\x00\xff"[..], "", ""],
            args!["HGET", "b\x00in", "f\x00\r\n"],
            args!["HGET", "b\x00in", ""],
            args!["HGETALL", "b\x00in"],
            args!["HSTRLEN", "b\x00in", "f\x00\r\n"],
            args!["HSCAN", "b\x00in", "0", "MATCH", "f*"],
            args!["HSCAN", "b\x00in", "5\x00junk"],
            args!["HRANDFIELD", "b\x00in", "5", "withvalues\x00junk"],
        ] {
            p.run(&Step::exact(a));
        }
        p.compare_state();
    }
}

/// Encodings across the listpack limits (512 fields, 64 bytes), in both directions of
/// every command that can cross them.
#[test]
fn encoding_transitions_match_redis() {
    let kite = KiteServer::start(&[], 1);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, false, "hash encodings".into());
    let f64b = "f".repeat(64);
    let f65b = "f".repeat(65);
    let enc = |p: &mut Pair, k: &str| p.run(&Step::exact(args!["OBJECT", "ENCODING", k]));
    // Value and field lengths, through each writing command.
    for (cmd, k) in [
        (vec!["HSET", "a", "f", &f64b], "a"),
        (vec!["HSET", "a", &f64b, "v"], "a"),
        (vec!["HSET", "b", "f", &f65b], "b"),
        (vec!["HSET", "c", &f65b, "v"], "c"),
        (vec!["HMSET", "d", "x", "y", "f", &f65b], "d"),
        (vec!["HSETNX", "e", "f", &f64b], "e"),
        (vec!["HSETNX", "e", "g", &f65b], "e"),
        (vec!["HSETNX", "e2", "f", "v"], "e2"),
        (vec!["HSETNX", "e2", "f", &f65b], "e2"),
        (vec!["HINCRBY", "g", &f65b, "1"], "g"),
        (vec!["HINCRBYFLOAT", "i", &f65b, "1"], "i"),
        (vec!["HSET", "j", "x", "1e60"], "j"),
        (vec!["HINCRBYFLOAT", "j", "x", "1e60"], "j"),
        (vec!["HSET", "j2", "x", "1e308"], "j2"),
        (vec!["HINCRBYFLOAT", "j2", "x", "1e308"], "j2"),
        (vec!["HSET", "j2", "x", "1"], "j2"),
    ] {
        p.run(&Step::exact(
            cmd.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ));
        enc(&mut p, k);
    }
    p.run(&Step::exact(args!["HSTRLEN", "j2", "x"]));
    // Field counts: 512 stay packed, the 513th converts, deletions do not convert back.
    let mut wide = args!["HSET", "w"];
    for i in 0..512 {
        wide.extend(args![format!("f{i}"), format!("{i}")]);
    }
    p.run(&Step::exact(wide.clone()));
    enc(&mut p, "w");
    p.run(&Step::exact(args!["HSET", "w", "f0", "again"]));
    enc(&mut p, "w");
    p.run(&Step::exact(args!["HSETNX", "w", "f512", "x"]));
    enc(&mut p, "w");
    p.run(&Step::exact(args!["HDEL", "w", "f512", "f1", "f2"]));
    enc(&mut p, "w");
    p.run(&Step::new(
        args!["HGETALL", "w"],
        Check::Whole {
            key: b"w".to_vec(),
            pairs: true,
        },
    ));
    // One wide HSET of 513 distinct fields converts at once; COPY keeps the encoding.
    let mut wider = wide.clone();
    wider[1] = b"w2".to_vec();
    wider.extend(args!["extra", "1"]);
    p.run(&Step::exact(wider));
    enc(&mut p, "w2");
    p.run(&Step::exact(args!["COPY", "w2", "w3"]));
    enc(&mut p, "w3");
    p.run(&Step::exact(args!["COPY", "a", "a2"]));
    enc(&mut p, "a2");
    p.run(&Step::exact(args!["HGETALL", "a2"]));
    // Incremental growth to the limit through HINCRBY.
    for i in 0..513 {
        let r = p.both(&args!["HINCRBY", "n", format!("c{i}"), i]);
        assert_eq!(r.0, r.1);
        if i == 511 || i == 512 {
            enc(&mut p, "n");
        }
    }
    p.run(&Step::new(
        args!["HSCAN", "n", "0", "COUNT", "10000"],
        Check::Scan {
            key: b"n".to_vec(),
            opts: args!["COUNT", "10000"],
        },
    ));
    p.compare_state();
}

/// HINCRBYFLOAT computes in long double and prints with %.17Lf, like INCRBYFLOAT.
#[test]
fn hincrbyfloat_precision_matches_redis() {
    let kite = KiteServer::start(&[], 1);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, false, "HINCRBYFLOAT precision".into());
    let mut lines: Vec<String> = vec!["HSET h f 0".into()];
    for _ in 0..10 {
        lines.push("HINCRBYFLOAT h f 0.1".into());
    }
    for l in [
        "HSET h g 0.1",
        "HINCRBYFLOAT h g 0.2",
        "HINCRBYFLOAT h g -0.3",
        "HSET h g 10.50",
        "HINCRBYFLOAT h g 1.5",
        "HINCRBYFLOAT h g 3.0e3",
        "HINCRBYFLOAT h g -3012",
        "HINCRBYFLOAT h g 1e20",
        "HINCRBYFLOAT h g 1.23456789012345678",
        "HSET h g 9223372036854775807",
        "HINCRBYFLOAT h g 0",
        "HINCRBYFLOAT h g -2.75",
        "HSET h g 5",
        "HINCRBYFLOAT h g 0.0000001",
        "HINCRBYFLOAT h g -5",
        "HINCRBYFLOAT h g 1e-20",
        "HSET h g 3.14159",
        "HINCRBYFLOAT h g 0",
        "HINCRBYFLOAT h g 2.71828",
        "HSET h g .5",
        "HINCRBYFLOAT h g .25",
        "HSET h g 5.",
        "HINCRBYFLOAT h g 1",
        "HINCRBYFLOAT h g 0x10",
        "HINCRBYFLOAT h g +1",
        "HINCRBYFLOAT h g 1e-99999",
        "HINCRBYFLOAT h g 1e99999",
        "HINCRBYFLOAT h new 0.1",
        "HGETALL h",
    ] {
        lines.push(l.into());
    }
    for l in &lines {
        p.run(&Step::exact(
            l.split(' ').map(|s| s.as_bytes().to_vec()).collect(),
        ));
    }
    let mut c = kite.client();
    assert_eq!(
        c.cmd(&["HGET", "h", "f"]),
        Resp::bulk("1"),
        "0.1 added ten times"
    );
}

#[test]
fn command_info_matches_redis() {
    let kite = KiteServer::start(&[], 1);
    let redis = RedisServer::start();
    let mut k = kite.client();
    let mut r = redis.client();
    for name in [
        "hset",
        "hsetnx",
        "hmset",
        "hget",
        "hmget",
        "hdel",
        "hexists",
        "hlen",
        "hstrlen",
        "hkeys",
        "hvals",
        "hgetall",
        "hincrby",
        "hincrbyfloat",
        "hrandfield",
        "hscan",
    ] {
        let kr = k.cmd(&["COMMAND", "INFO", name]);
        let rr = r.cmd(&["COMMAND", "INFO", name]);
        // Name, arity, flags and key positions: the fields clients route by.
        let head = |x: &Resp| -> Vec<Resp> {
            let entry = &x.as_array().expect("COMMAND INFO array")[0];
            entry.as_array().expect("command entry")[..6].to_vec()
        };
        assert_eq!(head(&kr), head(&rr), "COMMAND INFO {name}");
    }
}

// ---------------------------------------------------------------------------
// Kite-only checks
// ---------------------------------------------------------------------------

fn fill(c: &mut Client, key: &str, n: usize) {
    let mut a = args!["HSET", key];
    for i in 0..n {
        a.extend(args![format!("f{i}"), format!("v{i}")]);
    }
    assert_eq!(c.cmd(&a), Resp::Integer(n as i64));
}

fn hrandfield_is_random_and_complete(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    for (key, n) in [("small", 10usize), ("{x}big", 2000)] {
        fill(&mut c, key, n);
        let enc = if n > 512 { "hashtable" } else { "listpack" };
        assert_eq!(c.cmd(&["OBJECT", "ENCODING", key]), Resp::bulk(enc));
        // Single picks, negative counts (repeats allowed) and WITHVALUES pairs.
        let mut seen = HashSet::new();
        for _ in 0..50 {
            seen.insert(c.cmd(&["HRANDFIELD", key]).as_bytes().unwrap().to_vec());
        }
        assert!(seen.len() > 1, "{key}: single picks never vary");
        let many = (n * 20).to_string();
        let r = c.cmd(&["HRANDFIELD", key, &format!("-{many}"), "WITHVALUES"]);
        let items = r.as_array().unwrap();
        assert_eq!(items.len(), n * 40);
        let mut fields = HashSet::new();
        for p in items.chunks(2) {
            let f = p[0].as_bytes().unwrap();
            let v = p[1].as_bytes().unwrap();
            assert_eq!(&f[1..], &v[1..], "value belongs to its field");
            fields.insert(f.to_vec());
        }
        assert_eq!(fields.len(), n, "{key}: every field is picked eventually");
        // Positive counts: distinct fields, the whole hash when count >= size.
        for count in [1, 2, n / 10, n / 3, n / 2, n - 1, n, n + 5] {
            let r = c.cmd(&["HRANDFIELD", key, &count.to_string()]);
            let picks = bytes_set(&r);
            assert_eq!(r.as_array().unwrap().len(), count.min(n));
            assert_eq!(picks.len(), count.min(n), "{key} {count}: distinct fields");
        }
        // Samples differ between calls.
        let a = c.cmd(&["HRANDFIELD", key, "3"]);
        let differs = (0..20).any(|_| c.cmd(&["HRANDFIELD", key, "3"]) != a);
        assert!(differs, "{key}: samples never vary");
    }
    // RESP3: WITHVALUES pairs are two-element arrays.
    assert!(matches!(c.cmd(&["HELLO", "3"]), Resp::Map(_)));
    let r = c.cmd(&["HRANDFIELD", "small", "-3", "WITHVALUES"]);
    for p in r.as_array().unwrap() {
        assert_eq!(p.as_array().unwrap().len(), 2, "{r}");
    }
    let r = c.cmd(&["HRANDFIELD", "small", "3", "WITHVALUES"]);
    assert_eq!(r.as_array().unwrap().len(), 3, "{r}");
}

#[test]
fn hrandfield_is_random_and_complete_threads1() {
    hrandfield_is_random_and_complete(1);
}

#[test]
fn hrandfield_is_random_and_complete_threads4() {
    hrandfield_is_random_and_complete(4);
}

/// HSCAN over a hashtable returns every field present for the whole scan, while another
/// client grows and shrinks the hash between calls.
fn hscan_keeps_its_guarantee_under_writes(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    let mut w = kite.client();
    fill(&mut c, "h", 3000);
    let mut cursor = "0".to_string();
    let mut seen = HashSet::new();
    let mut calls = 0;
    loop {
        let r = c.cmd(&["HSCAN", "h", &cursor, "COUNT", "20"]);
        let parts = r.as_array().unwrap();
        cursor = parts[0].as_string().unwrap();
        for p in parts[1].as_array().unwrap().chunks(2) {
            seen.insert(p[0].as_bytes().unwrap().to_vec());
        }
        calls += 1;
        match calls {
            5 => {
                let mut a = args!["HSET", "h"];
                for i in 0..20_000 {
                    a.extend(args![format!("tmp{i}"), "x"]);
                }
                w.cmd(&a);
            }
            40 => {
                let mut a = args!["HDEL", "h"];
                for i in 0..20_000 {
                    a.push(format!("tmp{i}").into_bytes());
                }
                w.cmd(&a);
            }
            _ => {}
        }
        if cursor == "0" {
            break;
        }
        assert!(calls < 100_000);
    }
    for i in 0..3000 {
        assert!(
            seen.contains(format!("f{i}").as_bytes()),
            "f{i} was never returned"
        );
    }
    // Once the hash is small again the reply still comes in cursor steps: a hashtable
    // never turns back into a listpack.
    assert_eq!(c.cmd(&["OBJECT", "ENCODING", "h"]), Resp::bulk("hashtable"));
}

#[test]
fn hscan_keeps_its_guarantee_under_writes_threads1() {
    hscan_keeps_its_guarantee_under_writes(1);
}

#[test]
fn hscan_keeps_its_guarantee_under_writes_threads4() {
    hscan_keeps_its_guarantee_under_writes(4);
}

/// Redis 7.2 converts a hash when one HSET carries more pairs than the listpack limit,
/// even when duplicates leave fewer fields (7.0, the reference, counts fields).
#[test]
fn wide_hset_with_duplicates_converts_as_in_redis_7_2() {
    if kite_is_redis() {
        return;
    }
    let kite = KiteServer::start(&[], 1);
    let mut c = kite.client();
    let mut a = args!["HSET", "d"];
    for _ in 0..513 {
        a.extend(args!["same", "v"]);
    }
    assert_eq!(c.cmd(&a), Resp::Integer(1));
    assert_eq!(c.cmd(&["OBJECT", "ENCODING", "d"]), Resp::bulk("hashtable"));
    let mut a = args!["HSET", "e"];
    for _ in 0..512 {
        a.extend(args!["same", "v"]);
    }
    c.cmd(&a);
    assert_eq!(c.cmd(&["OBJECT", "ENCODING", "e"]), Resp::bulk("listpack"));
}

/// Hashes in MULTI/EXEC and across shards: TYPE, DEL and RENAME see them like any value.
#[test]
fn hashes_inside_transactions_threads4() {
    let kite = KiteServer::start(&[], 4);
    let mut c = kite.client();
    let replies = c.pipeline(&[
        args!["MULTI"],
        args!["HSET", "{a}h", "f", "1"],
        args!["HINCRBY", "{a}h", "f", "2"],
        args!["HINCRBYFLOAT", "{a}h", "f", "0.5"],
        args!["HGETALL", "{a}h"],
        args!["EXEC"],
    ]);
    assert_eq!(
        replies[5],
        Resp::Array(vec![
            Resp::Integer(1),
            Resp::Integer(3),
            Resp::bulk("3.5"),
            Resp::Array(vec![Resp::bulk("f"), Resp::bulk("3.5")]),
        ])
    );
    // Keys on different shards.
    for i in 0..20 {
        c.cmd(&["HSET", &format!("k{i}"), "f", &i.to_string()]);
    }
    let mut del = args!["DEL"];
    for i in 0..20 {
        del.push(format!("k{i}").into_bytes());
    }
    assert_eq!(c.cmd(&["RENAME", "k1", "k19"]), Resp::ok());
    assert_eq!(c.cmd(&["HGET", "k19", "f"]), Resp::bulk("1"));
    assert_eq!(c.cmd(&["TYPE", "k19"]), Resp::simple("hash"));
    assert_eq!(c.cmd(&del), Resp::Integer(19));
}
