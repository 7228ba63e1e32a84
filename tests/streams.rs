//! Streams: differential tests against a real redis-server, and Kite-only tests of the
//! pending lists, claiming, cross-shard reads and Redis 7.2 details.
//!
//! Reproduce one seed: `KITE_STREAMS_SEEDS=7 cargo test --release --test streams`.
//! Longer runs: `KITE_STREAMS_OPS=20000`.
//!
//! The reference redis-server is 7.0; Kite follows 7.2. The comparison leaves out what
//! differs between them (each place says why): consumer idle and activity times, the
//! `inactive` and `active-time` fields, the lag and read counter of groups whose stream
//! lost entries or had its counters set by hand, the text of XREAD's unbalanced-list error,
//! and consumers that 7.2's XCLAIM/XAUTOCLAIM create even when they claim nothing.

mod common;

use common::*;
use std::collections::{HashMap, VecDeque};

// ---------------------------------------------------------------------------
// Normalising the replies that may differ
// ---------------------------------------------------------------------------

/// Keys that start the map-shaped replies of XINFO (in RESP2 they are flat arrays).
const MAP_FIRST_KEYS: &[&str] = &["name", "length"];

fn as_pairs(r: &Resp) -> Option<Vec<(String, Resp)>> {
    match r {
        Resp::Map(m) => Some(
            m.iter()
                .map(|(k, v)| (k.as_string().unwrap_or_default(), v.clone()))
                .collect(),
        ),
        Resp::Array(v)
            if v.len() % 2 == 0
                && !v.is_empty()
                && matches!(&v[0], Resp::Bulk(b) if MAP_FIRST_KEYS.contains(&String::from_utf8_lossy(b).as_ref())) =>
        {
            Some(
                v.chunks(2)
                    .map(|c| (c[0].as_string().unwrap_or_default(), c[1].clone()))
                    .collect(),
            )
        }
        _ => None,
    }
}

/// Masks element `at` of each array inside `r` (times in pending lists).
fn mask_each(r: &Resp, at: usize) -> Resp {
    match r {
        Resp::Array(items) => Resp::Array(
            items
                .iter()
                .map(|it| match it {
                    Resp::Array(v) if v.len() > at => {
                        let mut v = v.clone();
                        v[at] = Resp::Integer(0);
                        Resp::Array(v)
                    }
                    other => other.clone(),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Removes what may differ between Redis 7.0 and Kite (7.2) from an XINFO reply.
/// `counters_exact`: the stream never lost entries nor had counters set by hand, so
/// both versions compute lag and entries-read the same way.
fn scrub(r: &Resp, counters_exact: bool) -> Resp {
    if let Some(pairs) = as_pairs(r) {
        let mut out = Vec::new();
        for (k, v) in pairs {
            let v = match k.as_str() {
                // 7.2 added these.
                "inactive" | "active-time" => continue,
                // Times, and the radix tree's inner shape.
                "idle" | "seen-time" | "radix-tree-nodes" => Resp::Integer(0),
                // 7.2.x fixed lag after deletions and trims.
                "lag" | "entries-read" if !counters_exact => Resp::Null,
                "pending" => match &v {
                    Resp::Array(items) => match items.first() {
                        Some(Resp::Array(x)) if x.len() == 4 => mask_each(&v, 2),
                        Some(Resp::Array(x)) if x.len() == 3 => mask_each(&v, 1),
                        _ => v.clone(),
                    },
                    _ => v.clone(),
                },
                _ => scrub(&v, counters_exact),
            };
            out.push((Resp::Bulk(k.into_bytes()), v));
        }
        return Resp::Map(out);
    }
    match r {
        Resp::Array(v) => Resp::Array(v.iter().map(|x| scrub(x, counters_exact)).collect()),
        other => other.clone(),
    }
}

/// How a reply is compared.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Check {
    Exact,
    /// XPENDING's extended form: idle times masked.
    Pending,
    /// XINFO: see `scrub`.
    Info {
        counters_exact: bool,
    },
}

fn normalize(check: Check, r: &Resp) -> Resp {
    if let Resp::Error(e) = r {
        // 7.2 names the command and the right special id in this error.
        if e.starts_with("ERR Unbalanced") {
            return Resp::Error("ERR Unbalanced ...".into());
        }
    }
    match check {
        Check::Exact => r.clone(),
        Check::Pending => mask_each(r, 2),
        Check::Info { counters_exact } => scrub(r, counters_exact),
    }
}

// ---------------------------------------------------------------------------
// Random command generator
// ---------------------------------------------------------------------------

const KEYS: &[&str] = &["s1", "s2", "{q}:events", "{q}:jobs", "other:stream"];
const GROUPS: &[&str] = &["g1", "g2", "workers"];
const CONSUMERS: &[&str] = &["alice", "bob", "carol", "dave"];
const FIELDS: &[&str] = &["f", "event", "jobId", "a", "prev"];

struct KeyState {
    /// The millisecond part new ids are built around.
    top: u64,
    seq: u64,
    /// False once the stream lost entries or had counters set (see `scrub`).
    counters_exact: bool,
}

struct Gen {
    rng: Rng,
    keys: HashMap<&'static str, KeyState>,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
            keys: KEYS
                .iter()
                .chain(&["nokey"])
                .map(|k| {
                    (
                        *k,
                        KeyState {
                            top: 1,
                            seq: 0,
                            counters_exact: true,
                        },
                    )
                })
                .collect(),
        }
    }

    fn key(&mut self) -> &'static str {
        if self.rng.chance(4) {
            return "str";
        }
        if self.rng.chance(2) {
            return "nokey";
        }
        KEYS[self.rng.index(KEYS.len())]
    }

    fn taint(&mut self, key: &str) {
        if let Some(k) = self.keys.get_mut(key) {
            k.counters_exact = false;
        }
    }

    fn exact(&self, key: &str) -> bool {
        self.keys.get(key).is_none_or(|k| k.counters_exact)
    }

    fn top(&self, key: &str) -> u64 {
        self.keys.get(key).map_or(1, |k| k.top)
    }

    fn group(&mut self) -> String {
        if self.rng.chance(5) {
            "nogroup".into()
        } else {
            self.rng.pick(GROUPS).to_string()
        }
    }

    fn consumer(&mut self) -> String {
        self.rng.pick(CONSUMERS).to_string()
    }

    fn new_id(&mut self, key: &str) -> String {
        // Mostly ids above the last one: a new millisecond, or a higher sequence.
        let bump = self.rng.chance(40);
        let step = self.rng.range(1, 2) as u64;
        let fresh = self.rng.range(0, 2) as u64;
        let (top, seq) = match self.keys.get_mut(key) {
            Some(k) => {
                if bump {
                    k.top += 1;
                    k.seq = fresh;
                } else {
                    k.seq += step;
                }
                (k.top, k.seq)
            }
            None => (1, 0),
        };
        match self.rng.below(20) {
            0..=12 => format!("{top}-{seq}"),
            13..=14 => format!("{}-{}", top, self.rng.range(0, 3)),
            15..=16 => format!("{top}-*"),
            17 => format!("{top}"),
            _ => self
                .rng
                .pick(&["0-0", "0", "1-1", "abc", "5-x", "-1", "0-*", "+"])
                .to_string(),
        }
    }

    /// An id somewhere in or around the key's ids.
    fn some_id(&mut self, key: &str) -> String {
        let top = self.top(key);
        let ms = self.rng.range(0, top as i64 + 1);
        match self.rng.below(10) {
            0..=5 => format!("{}-{}", ms, self.rng.range(0, 3)),
            6..=7 => format!("{ms}"),
            8 => "0".into(),
            _ => self
                .rng
                .pick(&["0-0", "bad", "18446744073709551615-18446744073709551615"])
                .to_string(),
        }
    }

    fn range_bound(&mut self, key: &str, low: bool) -> String {
        match self.rng.below(10) {
            0..=1 => if low { "-" } else { "+" }.into(),
            2..=3 => format!("({}", self.some_id(key)),
            _ => self.some_id(key),
        }
    }

    fn pairs(&mut self) -> Vec<String> {
        let n = self.rng.range(1, 3);
        let mut v = Vec::new();
        let same = self.rng.chance(60);
        for i in 0..n {
            let f = if same {
                FIELDS[i as usize].to_string()
            } else {
                self.rng.pick(FIELDS).to_string()
            };
            v.push(f);
            v.push(match self.rng.below(4) {
                0 => self.rng.range(0, 100000).to_string(),
                1 => "x".repeat(self.rng.range(0, 70) as usize),
                2 => "".into(),
                _ => "added".into(),
            });
        }
        v
    }

    fn trim_spec(&mut self, key: &str, allow_approx: bool) -> Vec<String> {
        let mut v = Vec::new();
        if self.rng.chance(50) {
            v.push("MAXLEN".into());
            if allow_approx && self.rng.chance(30) {
                v.push("~".into());
            } else if self.rng.chance(50) {
                v.push("=".into());
            }
            v.push(self.rng.range(-1, 12).to_string());
        } else {
            v.push("MINID".into());
            if allow_approx && self.rng.chance(30) {
                v.push("~".into());
            } else if self.rng.chance(50) {
                v.push("=".into());
            }
            v.push(self.some_id(key));
        }
        if v.contains(&"~".to_string()) && self.rng.chance(30) {
            v.push("LIMIT".into());
            v.push(self.rng.range(0, 150).to_string());
        }
        v
    }

    /// The next commands, each with how its reply is compared.
    fn next(&mut self) -> Vec<(Vec<String>, Check)> {
        let key = self.key();
        let s = |x: &str| x.to_string();
        let mut pre: Vec<(Vec<String>, Check)> = Vec::new();
        let (cmd, check) = match self.rng.below(100) {
            0..=27 => {
                let mut c = vec![s("XADD"), s(key)];
                if self.rng.chance(5) {
                    c.push(s("NOMKSTREAM"));
                }
                if self.rng.chance(15) {
                    self.taint(key);
                    c.extend(self.trim_spec(key, true));
                }
                c.push(self.new_id(key));
                c.extend(self.pairs());
                if self.rng.chance(2) {
                    c.pop();
                }
                (c, Check::Exact)
            }
            28..=33 => {
                let rev = self.rng.chance(40);
                let (a, b) = (self.range_bound(key, !rev), self.range_bound(key, rev));
                let mut c = vec![s(if rev { "XREVRANGE" } else { "XRANGE" }), s(key), a, b];
                if self.rng.chance(40) {
                    c.push(s("COUNT"));
                    c.push(self.rng.range(-1, 5).to_string());
                }
                (c, Check::Exact)
            }
            34..=35 => (vec![s("XLEN"), s(key)], Check::Exact),
            36..=39 => {
                self.taint(key);
                let mut c = vec![s("XDEL"), s(key)];
                for _ in 0..self.rng.range(1, 3) {
                    c.push(self.some_id(key));
                }
                (c, Check::Exact)
            }
            40..=42 => {
                self.taint(key);
                let mut c = vec![s("XTRIM"), s(key)];
                c.extend(self.trim_spec(key, true));
                (c, Check::Exact)
            }
            43..=46 => {
                let n = self.rng.range(1, 3);
                let keys: Vec<&str> = (0..n).map(|_| self.key()).collect();
                let mut c = vec![s("XREAD")];
                if self.rng.chance(50) {
                    c.push(s("COUNT"));
                    c.push(self.rng.range(0, 3).to_string());
                }
                c.push(s("STREAMS"));
                c.extend(keys.iter().map(|k| s(k)));
                for k in &keys {
                    let id = match self.rng.below(4) {
                        0 => s("$"),
                        1 => s("0"),
                        _ => self.some_id(k),
                    };
                    c.push(id);
                }
                if self.rng.chance(3) {
                    c.pop();
                }
                (c, Check::Exact)
            }
            47..=51 => {
                let g = self.group();
                let mut c = vec![s("XGROUP"), s("CREATE"), s(key), g];
                c.push(match self.rng.below(3) {
                    0 => s("$"),
                    1 => s("0"),
                    _ => self.some_id(key),
                });
                if self.rng.chance(40) {
                    c.push(s("MKSTREAM"));
                }
                if self.rng.chance(10) {
                    self.taint(key);
                    c.push(s("ENTRIESREAD"));
                    c.push(self.rng.range(-2, 5).to_string());
                }
                (c, Check::Exact)
            }
            52..=53 => {
                let g = self.group();
                let id = if self.rng.chance(30) {
                    s("$")
                } else {
                    self.some_id(key)
                };
                let mut c = vec![s("XGROUP"), s("SETID"), s(key), g, id];
                if self.rng.chance(10) {
                    self.taint(key);
                    c.push(s("ENTRIESREAD"));
                    c.push(self.rng.range(-1, 5).to_string());
                }
                (c, Check::Exact)
            }
            54 => (
                vec![s("XGROUP"), s("DESTROY"), s(key), self.group()],
                Check::Exact,
            ),
            55..=56 => {
                let sub = if self.rng.chance(50) {
                    "CREATECONSUMER"
                } else {
                    "DELCONSUMER"
                };
                (
                    vec![s("XGROUP"), s(sub), s(key), self.group(), self.consumer()],
                    Check::Exact,
                )
            }
            57..=67 => {
                let mut c = vec![s("XREADGROUP"), s("GROUP"), self.group(), self.consumer()];
                if self.rng.chance(50) {
                    c.push(s("COUNT"));
                    c.push(self.rng.range(0, 3).to_string());
                }
                if self.rng.chance(10) {
                    c.push(s("NOACK"));
                }
                let n = if self.rng.chance(85) { 1 } else { 2 };
                let keys: Vec<&str> = (0..n).map(|_| self.key()).collect();
                // 7.2 creates the consumer even when nothing can be read; 7.0 only when
                // it serves something.
                for k in &keys {
                    pre.push((
                        vec![
                            s("XGROUP"),
                            s("CREATECONSUMER"),
                            s(k),
                            c[2].clone(),
                            c[3].clone(),
                        ],
                        Check::Exact,
                    ));
                }
                c.push(s("STREAMS"));
                c.extend(keys.iter().map(|k| s(k)));
                for k in &keys {
                    let id = match self.rng.below(10) {
                        0..=6 => s(">"),
                        7 => s("0"),
                        _ => self.some_id(k),
                    };
                    c.push(id);
                }
                (c, Check::Exact)
            }
            68..=72 => {
                let mut c = vec![s("XACK"), s(key), self.group()];
                for _ in 0..self.rng.range(1, 3) {
                    c.push(self.some_id(key));
                }
                (c, Check::Exact)
            }
            73..=77 => {
                let mut c = vec![s("XPENDING"), s(key), self.group()];
                if self.rng.chance(60) {
                    if self.rng.chance(20) {
                        c.push(s("IDLE"));
                        c.push(s("0"));
                    }
                    c.push(self.range_bound(key, true));
                    c.push(self.range_bound(key, false));
                    c.push(self.rng.range(-1, 5).to_string());
                    if self.rng.chance(40) {
                        c.push(self.consumer());
                    }
                    (c, Check::Pending)
                } else {
                    (c, Check::Exact)
                }
            }
            78..=81 => {
                let (g, who) = (self.group(), self.consumer());
                // 7.2 creates the consumer even when it claims nothing; 7.0 does not.
                pre.push((
                    vec![
                        s("XGROUP"),
                        s("CREATECONSUMER"),
                        s(key),
                        g.clone(),
                        who.clone(),
                    ],
                    Check::Exact,
                ));
                let mut c = vec![s("XCLAIM"), s(key), g, who, s("0")];
                for _ in 0..self.rng.range(1, 3) {
                    c.push(self.some_id(key));
                }
                if self.rng.chance(60) {
                    c.push(s("JUSTID"));
                }
                if self.rng.chance(15) {
                    c.push(s("FORCE"));
                }
                if self.rng.chance(15) {
                    c.push(s("RETRYCOUNT"));
                    c.push(self.rng.range(0, 5).to_string());
                }
                (c, Check::Exact)
            }
            82..=84 => {
                let (g, who) = (self.group(), self.consumer());
                pre.push((
                    vec![
                        s("XGROUP"),
                        s("CREATECONSUMER"),
                        s(key),
                        g.clone(),
                        who.clone(),
                    ],
                    Check::Exact,
                ));
                let start = self.range_bound(key, true);
                let mut c = vec![s("XAUTOCLAIM"), s(key), g, who, s("0"), start];
                if self.rng.chance(60) {
                    c.push(s("COUNT"));
                    c.push(self.rng.range(0, 4).to_string());
                }
                if self.rng.chance(70) {
                    c.push(s("JUSTID"));
                }
                (c, Check::Exact)
            }
            85 => {
                self.taint(key);
                let top = self.top(key);
                // 7.2 refuses an id below the greatest deleted one, 7.0 does not: stay above.
                let mut c = vec![s("XSETID"), s(key), format!("{}-999999", top + 1)];
                if self.rng.chance(30) {
                    c.push(s("ENTRIESADDED"));
                    c.push(self.rng.range(0, 30).to_string());
                }
                if self.rng.chance(20) {
                    c.push(s("MAXDELETEDID"));
                    c.push(self.some_id(key));
                }
                (c, Check::Exact)
            }
            86..=89 => {
                let counters_exact = self.exact(key);
                let c = match self.rng.below(4) {
                    0 => vec![s("XINFO"), s("STREAM"), s(key)],
                    1 => vec![s("XINFO"), s("GROUPS"), s(key)],
                    2 => vec![s("XINFO"), s("CONSUMERS"), s(key), self.group()],
                    _ => vec![
                        s("XINFO"),
                        s("STREAM"),
                        s(key),
                        s("FULL"),
                        s("COUNT"),
                        s("3"),
                    ],
                };
                (c, Check::Info { counters_exact })
            }
            90 => {
                // "str" stays a string so that type errors keep coming.
                let key = if key == "str" { "nokey" } else { key };
                if let Some(k) = self.keys.get_mut(key) {
                    k.counters_exact = true;
                }
                (vec![s("DEL"), s(key)], Check::Exact)
            }
            91..=93 => {
                let c = self
                    .rng
                    .pick(&[
                        "XADD s1",
                        "XADD s1 MAXLEN 5 LIMIT 10 1-1 f v",
                        "XTRIM s1 MAXLEN ~ 1 LIMIT -1",
                        "XRANGE s1 - + COUNT",
                        "XREAD COUNT 1 STREAMS s1",
                        "XREADGROUP GROUP g1 alice STREAMS s1 $",
                        "XREAD STREAMS s1 >",
                        "XGROUP CREATE s1 g1 0 BADOPT",
                        "XGROUP SETID s1 g1",
                        "XPENDING s1 g1 - +",
                        "XCLAIM s1 g1 alice x 1-0",
                        "XAUTOCLAIM s1 g1 alice 0 0 COUNT 0",
                        "XSETID s1 0-1 ENTRIESADDED -5",
                        "XINFO STREAM s1 FULL COUNT",
                        "XGROUP NOPE s1",
                        "XINFO NOPE",
                    ])
                    .split(' ')
                    .map(s)
                    .collect();
                (c, Check::Exact)
            }
            _ => {
                let k2 = self.key();
                let c = vec![s("TYPE"), s(k2)];
                (c, Check::Exact)
            }
        };
        pre.push((cmd, check));
        pre
    }
}

// ---------------------------------------------------------------------------
// Running both servers side by side
// ---------------------------------------------------------------------------

struct Pair {
    kite: Client,
    redis: Client,
    history: VecDeque<String>,
    label: String,
    count: usize,
    /// Per command: (non-error replies, error replies) from redis-server.
    stats: std::collections::BTreeMap<String, (usize, usize)>,
}

impl Pair {
    fn new(kite: &KiteServer, redis: &RedisServer, resp3: bool, label: String) -> Pair {
        let mut p = Pair {
            kite: kite.client(),
            redis: redis.client(),
            history: VecDeque::new(),
            label,
            count: 0,
            stats: Default::default(),
        };
        for c in [&mut p.kite, &mut p.redis] {
            assert_eq!(c.cmd(&["FLUSHALL"]), Resp::ok());
            if resp3 {
                assert!(matches!(c.cmd(&["HELLO", "3"]), Resp::Map(_)));
            }
            c.cmd(&["SET", "str", "hello"]);
        }
        p
    }

    fn run(&mut self, cmd: &[String], check: Check) -> Resp {
        let k = self.kite.cmd(cmd);
        let r = self.redis.cmd(cmd);
        let line = format!("#{} {} -> {}", self.count, fmt_cmd(cmd), r);
        let (nk, nr) = (normalize(check, &k), normalize(check, &r));
        if nk != nr {
            let hist: Vec<String> = self.history.iter().cloned().collect();
            panic!(
                "\nSTREAMS DIFFERENTIAL MISMATCH ({})\n  command #{}: {}\n  kite:  {}\n  redis: {}\n  (compared as {:?})\nlast commands (oldest first):\n    {}\n",
                self.label,
                self.count,
                fmt_cmd(cmd),
                k,
                r,
                check,
                hist.join("\n    ")
            );
        }
        let mut line = line;
        if line.len() > 400 {
            let mut cut = 400;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str("...");
        }
        self.history.push_back(line);
        if self.history.len() > usize_from_env("KITE_STREAMS_HISTORY", 30) {
            self.history.pop_front();
        }
        let mut name = cmd[0].to_ascii_uppercase();
        if name == "XGROUP" || name == "XINFO" {
            name = format!(
                "{name} {}",
                cmd.get(1).map_or("", |s| s.as_str()).to_ascii_uppercase()
            );
        }
        let e = self.stats.entry(name).or_default();
        if r.is_error() {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
        self.count += 1;
        r
    }

    fn run_str(&mut self, line: &str, check: Check) -> Resp {
        let a: Vec<String> = line.split(' ').map(str::to_string).collect();
        self.run(&a, check)
    }

    /// Compares every stream's entries, metadata, groups and pending lists.
    fn compare_state(&mut self, gen: &Gen) {
        for key in KEYS {
            let ty = self.run_str(&format!("TYPE {key}"), Check::Exact);
            if ty.as_bytes() != Some(b"stream") {
                continue;
            }
            let counters_exact = gen.exact(key);
            self.run_str(&format!("XRANGE {key} - +"), Check::Exact);
            self.run_str(
                &format!("XINFO STREAM {key}"),
                Check::Info { counters_exact },
            );
            self.run_str(
                &format!("XINFO STREAM {key} FULL COUNT 0"),
                Check::Info { counters_exact },
            );
            for g in GROUPS {
                self.run_str(&format!("XPENDING {key} {g}"), Check::Exact);
                self.run_str(&format!("XPENDING {key} {g} - + 1000"), Check::Pending);
                self.run_str(
                    &format!("XINFO CONSUMERS {key} {g}"),
                    Check::Info { counters_exact },
                );
            }
        }
    }
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
        "seed {seed}, {}, {} vs redis-server; reproduce: KITE_STREAMS_SEEDS={seed} cargo test --release --test streams {test}",
        if resp3 { "RESP3" } else { "RESP2" },
        kite.name
    );
    let mut pair = Pair::new(kite, redis, resp3, label);
    let mut gen = Gen::new(seed);
    while pair.count < ops {
        for (cmd, check) in gen.next() {
            pair.run(&cmd, check);
        }
    }
    pair.compare_state(&gen);
    print_reply_stats("KITE_STREAMS_STATS", seed, &pair.stats);
}

fn run_differential(threads: usize, seeds: &[u64], resp3: bool, test: &str) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let ops = usize_from_env("KITE_STREAMS_OPS", 3000);
    for seed in seeds_from_env("KITE_STREAMS_SEEDS", seeds) {
        run_seed(&kite, &redis, seed, ops, resp3, test);
    }
}

#[test]
fn random_stream_commands_threads1() {
    run_differential(1, &[1, 2, 3], false, "random_stream_commands_threads1");
}

#[test]
fn random_stream_commands_threads4() {
    run_differential(4, &[11, 12, 13], false, "random_stream_commands_threads4");
}

#[test]
fn random_stream_commands_threads1_resp3() {
    run_differential(1, &[21], true, "random_stream_commands_threads1_resp3");
}

#[test]
fn random_stream_commands_threads4_resp3() {
    run_differential(4, &[31, 32], true, "random_stream_commands_threads4_resp3");
}

// ---------------------------------------------------------------------------
// Scripted differential scenarios
// ---------------------------------------------------------------------------

fn scripted(pair: &mut Pair, script: &str) {
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let check = if line.starts_with("XPENDING") && line.split(' ').count() > 3 {
            Check::Pending
        } else if line.starts_with("XINFO") {
            Check::Info {
                counters_exact: true,
            }
        } else {
            Check::Exact
        };
        pair.run_str(line, check);
    }
}

const ERRORS_SCRIPT: &str = "
XADD s 0-0 a 1
XADD s 0 a 1
XADD s 0-1 a 1
XADD s 0-1 a 1
XADD s 1 a
XADD s 1-x a 1
XADD s -1 a 1
XADD s 0-* b 2
XADD s 5-* c 3
XADD s 5-* c 3 d 4
XADD s 18446744073709551615-18446744073709551614 a 1
XADD s 18446744073709551615-* a 1
XADD s 18446744073709551615-* a 1
XADD s 5 a 1
XADD s2 NOMKSTREAM 1-1 a 1
XADD s2 MAXLEN -1 1-1 a 1
XADD s2 MAXLEN x 1-1 a 1
XADD s2 LIMIT 5 1-1 a 1
XADD s2 LIMIT 0 1-1 a 1
XADD s2 MAXLEN 1 LIMIT 5 1-1 a 1
XADD s2 MAXLEN ~ 1 LIMIT -1 1-1 a 1
XADD s2 MAXLEN 1 MINID 5 1-1 a 1
XADD s2 MINID x 1-1 a 1
XADD s2 5-- a 1
XADD s2 NOMKSTREAM MAXLEN 5
XADD str 1-1 a 1
XADD str 0 a 1
XLEN str
XRANGE str - +
XRANGE s (18446744073709551615-18446744073709551615 +
XRANGE s - (0-0
XRANGE s - + COUNT x
XRANGE s - + FOO 1
XRANGE s - + COUNT 0
XREVRANGE s (0-0 +
XDEL str 1
XDEL nokey x
XDEL s -
XTRIM s
XTRIM s FOO 1
XTRIM s LIMIT 5
XTRIM s MAXLEN 1 X
XTRIM s MAXLEN -1
XTRIM s MINID 1 MAXLEN 1
XTRIM s MAXLEN = 1 LIMIT 10
XTRIM str MAXLEN 1
XTRIM nokey MINID x
XREAD STREAMS s
XREAD COUNT x STREAMS s 0
XREAD BLOCK x STREAMS s 0
XREAD BLOCK -1 STREAMS s 0
XREAD FOO STREAMS s 0
XREAD STREAMS s >
XREAD NOACK STREAMS s 0
XREAD GROUP g c STREAMS s 0
XREAD STREAMS str 0
XREAD STREAMS s str 0 x
XREAD STREAMS s str x 0
XREADGROUP STREAMS s 0
XREADGROUP COUNT 1 STREAMS s > >
XREADGROUP GROUP g c STREAMS s >
XGROUP CREATE s g $
XREADGROUP GROUP g c STREAMS s $
XREADGROUP GROUP g c STREAMS s x
XREADGROUP GROUP nog c STREAMS s >
XREADGROUP GROUP g c STREAMS s nokey > >
XREADGROUP GROUP g c STREAMS str >
XGROUP CREATE s g $
XGROUP CREATE nokey g 0
XGROUP CREATE nokey g x MKSTREAM
XGROUP CREATE s g2 0 ENTRIESREAD -2
XGROUP CREATE s g2 0 ENTRIESREAD x
XGROUP CREATE s g2 0 FOO
XGROUP create s g2 0 MKSTREAM ENTRIESREAD 1 ENTRIESREAD 2
XGROUP CREATE str g 0
XGROUP SETID s nog 0
XGROUP SETID nokey g 0
XGROUP SETID s g x
XGROUP SETID s g 0 MKSTREAM
XGROUP DESTROY nokey g
XGROUP DESTROY s
XGROUP CREATECONSUMER s nog c
XGROUP DELCONSUMER nokey g c
XGROUP FOO s
XGROUP
XGROUP HELP x
XACK str g 1
XACK s g x
XACK s nog x
XPENDING s g -
XPENDING s g - + x
XPENDING s g IDLE x - + 1
XPENDING s g IDLE 0
XPENDING s nog
XPENDING nokey g - + 10
XPENDING str g
XPENDING s g (18446744073709551615-18446744073709551615 + 10
XCLAIM s g c x 1
XCLAIM s g c 0 x
XCLAIM s g c 0 1 IDLE x
XCLAIM s g c 0 1 TIME x
XCLAIM s g c 0 1 RETRYCOUNT x
XCLAIM s g c 0 1 LASTID x
XCLAIM s g c 0 1 IDLE
XCLAIM s nog c 0 1
XCLAIM str g c 0 1
XAUTOCLAIM s g c x 0
XAUTOCLAIM s g c 0 x
XAUTOCLAIM s g c 0 (+
XAUTOCLAIM s g c 0 0 COUNT 0
XAUTOCLAIM s g c 0 0 COUNT x
XAUTOCLAIM s g c 0 0 COUNT 576460752303423488
XAUTOCLAIM s g c 0 0 FOO
XAUTOCLAIM nokey g c 0 0
XAUTOCLAIM str g c 0 0
XSETID s 1
XSETID s x
XSETID s -
XSETID nokey 1
XSETID str 1
XSETID s 99 ENTRIESADDED 1
XSETID s 99 ENTRIESADDED -1
XSETID s 99 MAXDELETEDID 100
XSETID s 99 FOO
XINFO STREAM nokey
XINFO GROUPS str
XINFO CONSUMERS s nog
XINFO STREAM s FULL COUNT x
XINFO STREAM s FOO
XINFO STREAM s FULL COUNT 1 X
XINFO GROUPS s x
XINFO NOPE
";

#[test]
fn errors_match_redis() {
    for threads in [1, 4] {
        let kite = KiteServer::start(&[], threads);
        let redis = RedisServer::start();
        for resp3 in [false, true] {
            let mut pair = Pair::new(
                &kite,
                &redis,
                resp3,
                format!("errors, threads {threads}, resp3 {resp3}"),
            );
            scripted(&mut pair, ERRORS_SCRIPT);
        }
    }
}

/// Which stream commands invalidate WATCH: only those that change entries.
#[test]
fn watch_matches_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let ops = [
        "XREADGROUP GROUP g c STREAMS s >",
        "XACK s g 1-0",
        "XGROUP CREATECONSUMER s g d",
        "XGROUP SETID s g 0",
        "XCLAIM s g e 0 1-0",
        "XGROUP DELCONSUMER s g d",
        "XGROUP CREATE s g2 0",
        "XGROUP DESTROY s g2",
        "XSETID s 5-0",
        "XAUTOCLAIM s g z 0 0",
        "XDEL s 9-0",
        "XTRIM s MAXLEN 5",
        "XDEL s 1-0",
        "XADD s 9-0 a 1",
        "XTRIM s MAXLEN 0",
    ];
    let servers: [&ServerProcess; 2] = [&kite, &redis];
    for server in servers {
        let mut a = server.client();
        let mut b = server.client();
        a.cmd_str("FLUSHALL");
        a.cmd_str("XADD s 1-0 a 1");
        a.cmd_str("XGROUP CREATE s g 0");
        let mut results = Vec::new();
        for op in ops {
            a.cmd_str("WATCH s");
            b.cmd_str(op);
            a.cmd_str("MULTI");
            a.cmd_str("PING");
            results.push((op, a.cmd_str("EXEC").is_null()));
        }
        let expected: Vec<(&str, bool)> = ops
            .iter()
            .map(|op| {
                let changes = matches!(*op, "XDEL s 1-0" | "XADD s 9-0 a 1" | "XTRIM s MAXLEN 0");
                (*op, changes)
            })
            .collect();
        assert_eq!(results, expected, "{}", server.name);
    }
}

/// Approximate trimming removes whole nodes; node boundaries follow Redis's (100 entries
/// or 4096 listpack bytes), so `~` gives the same results as Redis.
#[test]
fn approximate_trimming_matches_redis() {
    let kite = KiteServer::start(&[], 1);
    let redis = RedisServer::start();
    let mut pair = Pair::new(&kite, &redis, false, "approximate trimming".into());
    let mut rng = Rng::new(99);
    for i in 1..=1500u64 {
        let len = if rng.chance(10) {
            rng.range(100, 900) as usize
        } else {
            rng.range(0, 12) as usize
        };
        let v = "v".repeat(len);
        let field = if rng.chance(80) { "event" } else { "other" };
        let trim = if i % 7 == 0 {
            format!("MAXLEN ~ {} ", rng.range(50, 400))
        } else if i % 11 == 0 {
            format!("MINID ~ {} ", i.saturating_sub(rng.range(50, 300) as u64))
        } else {
            String::new()
        };
        pair.run_str(
            &format!("XADD q {trim}{i}-1 {field} {v} n {i}"),
            Check::Exact,
        );
        if i % 50 == 0 {
            pair.run_str(
                "XINFO STREAM q",
                Check::Info {
                    counters_exact: true,
                },
            );
            pair.run_str("XTRIM q MAXLEN ~ 250 LIMIT 100", Check::Exact);
        }
        if i % 97 == 0 {
            pair.run_str(&format!("XDEL q {}-1 {}-1", i - 3, i - 40), Check::Exact);
        }
    }
    pair.run_str(
        "XINFO STREAM q",
        Check::Info {
            counters_exact: false,
        },
    );
    pair.run_str("XRANGE q - +", Check::Exact);
}

// ---------------------------------------------------------------------------
// Kite-only tests
// ---------------------------------------------------------------------------

fn ids_of(r: &Resp) -> Vec<String> {
    r.as_array()
        .unwrap_or_else(|| panic!("expected an array, got {r}"))
        .iter()
        .map(|e| match e {
            Resp::Array(v) => v[0].as_string().unwrap(),
            other => other.as_string().unwrap(),
        })
        .collect()
}

fn field<'a>(r: &'a Resp, name: &str) -> &'a Resp {
    let v = r
        .as_array()
        .unwrap_or_else(|| panic!("expected a map, got {r}"));
    for c in v.chunks(2) {
        if c[0].as_bytes() == Some(name.as_bytes()) {
            return &c[1];
        }
    }
    panic!("no field {name} in {r}")
}

/// (consumer, id, delivery count) of every pending entry, in id order.
fn pending(c: &mut Client, key: &str, group: &str) -> Vec<(String, String, i64)> {
    let r = c.cmd(&["XPENDING", key, group, "-", "+", "1000"]);
    r.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let v = e.as_array().unwrap();
            (
                v[1].as_string().unwrap(),
                v[0].as_string().unwrap(),
                v[3].as_int().unwrap(),
            )
        })
        .collect()
}

fn pending_and_claiming(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    for i in 1..=10 {
        c.cmd_str(&format!("XADD jobs {i}-0 job {i}"));
    }
    assert_eq!(c.cmd_str("XGROUP CREATE jobs w 0"), Resp::ok());
    // Two consumers share the stream: each entry goes to exactly one of them.
    let a = c.cmd_str("XREADGROUP GROUP w alice COUNT 4 STREAMS jobs >");
    let b = c.cmd_str("XREADGROUP GROUP w bob STREAMS jobs >");
    let a_ids = ids_of(&a.as_array().unwrap()[0].as_array().unwrap()[1]);
    let b_ids = ids_of(&b.as_array().unwrap()[0].as_array().unwrap()[1]);
    assert_eq!(a_ids, vec!["1-0", "2-0", "3-0", "4-0"]);
    assert_eq!(b_ids.len(), 6);
    assert!(c
        .cmd_str("XREADGROUP GROUP w carol STREAMS jobs >")
        .is_null());
    let summary = c.cmd_str("XPENDING jobs w");
    assert_eq!(summary.as_array().unwrap()[0], Resp::Integer(10));
    assert_eq!(
        summary.as_array().unwrap()[3],
        Resp::Array(vec![
            Resp::Array(vec![Resp::bulk("alice"), Resp::bulk("4")]),
            Resp::Array(vec![Resp::bulk("bob"), Resp::bulk("6")]),
        ])
    );
    // Re-reading the history counts as another delivery.
    let h = c.cmd_str("XREADGROUP GROUP w alice STREAMS jobs 0");
    assert_eq!(
        ids_of(&h.as_array().unwrap()[0].as_array().unwrap()[1]).len(),
        4
    );
    assert_eq!(
        pending(&mut c, "jobs", "w")[0],
        ("alice".into(), "1-0".into(), 2)
    );
    // Acknowledged entries leave both lists.
    assert_eq!(c.cmd_str("XACK jobs w 1-0 2-0 2-0 99-0"), Resp::Integer(2));
    assert_eq!(
        c.cmd_str("XPENDING jobs w - + 10 alice")
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // XCLAIM moves entries and counts a delivery; JUSTID does not; RETRYCOUNT sets it.
    assert_eq!(ids_of(&c.cmd_str("XCLAIM jobs w bob 0 3-0")), vec!["3-0"]);
    assert_eq!(
        ids_of(&c.cmd_str("XCLAIM jobs w carol 0 4-0 JUSTID")),
        vec!["4-0"]
    );
    assert_eq!(
        ids_of(&c.cmd_str("XCLAIM jobs w carol 0 5-0 RETRYCOUNT 7 JUSTID")),
        vec!["5-0"]
    );
    let p = pending(&mut c, "jobs", "w");
    assert_eq!(p[0], ("bob".into(), "3-0".into(), 3));
    assert_eq!(p[1], ("carol".into(), "4-0".into(), 2));
    assert_eq!(p[2], ("carol".into(), "5-0".into(), 7));
    // Min idle time: only entries idle long enough move. IDLE backdates a delivery.
    c.cmd_str("XCLAIM jobs w bob 0 6-0 IDLE 60000 JUSTID");
    assert_eq!(
        ids_of(&c.cmd_str("XCLAIM jobs w dave 30000 6-0 7-0 JUSTID")),
        vec!["6-0"]
    );
    let auto = c.cmd_str("XAUTOCLAIM jobs w erin 30000 0 COUNT 10 JUSTID");
    assert_eq!(ids_of(&auto.as_array().unwrap()[1]), Vec::<String>::new());
    // FORCE creates pending entries for existing entries only.
    c.cmd_str("XACK jobs w 8-0");
    assert_eq!(
        ids_of(&c.cmd_str("XCLAIM jobs w erin 0 8-0 42-0 FORCE JUSTID")),
        vec!["8-0"]
    );
    // Deleted entries are dropped from the PEL by the claims, and XAUTOCLAIM lists them.
    c.cmd_str("XDEL jobs 9-0 10-0");
    assert!(c
        .cmd_str("XCLAIM jobs w erin 0 9-0")
        .as_array()
        .unwrap()
        .is_empty());
    let auto = c.cmd_str("XAUTOCLAIM jobs w erin 0 0 COUNT 100 JUSTID");
    let parts = auto.as_array().unwrap();
    assert_eq!(parts[0], Resp::bulk("0-0"));
    assert_eq!(ids_of(&parts[2]), vec!["10-0"]);
    assert_eq!(
        ids_of(&parts[1]),
        vec!["3-0", "4-0", "5-0", "6-0", "7-0", "8-0"]
    );
    assert!(pending(&mut c, "jobs", "w").iter().all(|p| p.0 == "erin"));
    // History reads of deleted entries give the id with a null.
    c.cmd_str("XDEL jobs 8-0");
    let h = c.cmd_str("XREADGROUP GROUP w erin STREAMS jobs 7-0");
    let entries = h.as_array().unwrap()[0].as_array().unwrap()[1]
        .as_array()
        .unwrap()
        .to_vec();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0],
        Resp::Array(vec![Resp::bulk("8-0"), Resp::NullArray])
    );
    // A cursor walks the PEL in COUNT-sized steps.
    let step = c.cmd_str("XAUTOCLAIM jobs w frank 0 0 COUNT 2 JUSTID");
    assert_eq!(step.as_array().unwrap()[0], Resp::bulk("5-0"));
    // Deleting a consumer drops its pending entries.
    assert_eq!(
        c.cmd_str("XGROUP DELCONSUMER jobs w erin"),
        Resp::Integer(4)
    );
    assert_eq!(
        c.cmd_str("XPENDING jobs w").as_array().unwrap()[0],
        Resp::Integer(2)
    );
    // 7.2's consumer fields: a consumer that never got anything is inactive -1.
    c.cmd_str("XGROUP CREATECONSUMER jobs w idle-one");
    let consumers = c.cmd_str("XINFO CONSUMERS jobs w");
    let idle_one = consumers
        .as_array()
        .unwrap()
        .iter()
        .find(|x| field(x, "name") == &Resp::bulk("idle-one"))
        .unwrap()
        .clone();
    assert_eq!(field(&idle_one, "inactive"), &Resp::Integer(-1));
    assert_eq!(field(&idle_one, "pending"), &Resp::Integer(0));
    let full = c.cmd_str("XINFO STREAM jobs FULL");
    let g = &field(&full, "groups").as_array().unwrap()[0];
    let first = &field(g, "consumers").as_array().unwrap()[0];
    let keys: Vec<String> = first
        .as_array()
        .unwrap()
        .chunks(2)
        .map(|c| c[0].as_string().unwrap())
        .collect();
    assert_eq!(
        keys,
        vec!["name", "seen-time", "active-time", "pel-count", "pending"]
    );
}

#[test]
fn pending_and_claiming_threads1() {
    pending_and_claiming(1);
}

#[test]
fn pending_and_claiming_threads4() {
    pending_and_claiming(4);
}

fn cross_shard_reads(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    let keys = ["alpha", "beta", "gamma", "delta", "epsilon"];
    for (i, k) in keys.iter().enumerate() {
        c.cmd(&["XADD", k, &format!("{}-1", i + 1), "k", k]);
    }
    let mut cmd = vec!["XREAD", "COUNT", "5", "STREAMS"];
    cmd.extend(keys);
    cmd.extend(["0", "0", "$", "0", "0"]);
    let r = c.cmd(&cmd);
    let got: Vec<String> = r
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_array().unwrap()[0].as_string().unwrap())
        .collect();
    assert_eq!(got, vec!["alpha", "beta", "delta", "epsilon"]);
    // A wrong type on a later key fails the whole read.
    c.cmd_str("SET plain x");
    let r = c.cmd_str("XREAD STREAMS alpha plain 0 0");
    assert_err_prefix(&r, "WRONGTYPE");
    // A missing group on any key fails before anything is read or created.
    for k in ["alpha", "beta", "gamma"] {
        c.cmd(&["XGROUP", "CREATE", k, "g", "0"]);
    }
    let r = c.cmd_str("XREADGROUP GROUP g c1 STREAMS alpha beta delta > > >");
    assert_err_prefix(&r, "NOGROUP No such key 'delta' or consumer group 'g'");
    assert_eq!(c.cmd_str("XINFO CONSUMERS alpha g"), Resp::Array(vec![]));
    let r = c.cmd_str("XREADGROUP GROUP g c1 COUNT 10 STREAMS alpha beta gamma > > >");
    assert_eq!(r.as_array().unwrap().len(), 3);
    assert!(c
        .cmd_str("XREADGROUP GROUP g c1 STREAMS alpha beta gamma > > >")
        .is_null());
    // Inside MULTI, across shards, too.
    c.cmd_str("MULTI");
    c.cmd_str("XADD beta 9-1 k v");
    c.cmd_str("XREAD STREAMS alpha beta 0 0");
    let r = c.cmd_str("EXEC");
    let replies = r.as_array().unwrap();
    assert_eq!(replies[0], Resp::bulk("9-1"));
    assert_eq!(replies[1].as_array().unwrap().len(), 2);
}

#[test]
fn cross_shard_reads_threads1() {
    cross_shard_reads(1);
}

#[test]
fn cross_shard_reads_threads4() {
    cross_shard_reads(4);
}

#[test]
fn block_serves_data_at_once_or_times_out() {
    let kite = KiteServer::start(&[], 4);
    let mut c = kite.client();
    c.cmd_str("XADD s 1-1 a 1");
    let r = c.cmd_str("XREAD BLOCK 0 STREAMS s 0");
    assert_eq!(r.as_array().unwrap().len(), 1);
    // Waiting is tested in tests/blocking.rs; here a short BLOCK times out.
    assert!(c.cmd_str("XREAD BLOCK 100 STREAMS s $").is_null());
    c.cmd_str("XGROUP CREATE s g $");
    assert!(c
        .cmd_str("XREADGROUP GROUP g c BLOCK 10 STREAMS s >")
        .is_null());
    // Without BLOCK, nothing is a null reply.
    assert!(c.cmd_str("XREAD STREAMS s $").is_null());
}

/// Lag and entries-read as Redis 7.2 computes them, including its fixes for streams that
/// lost entries (the cases of redis#13337 and redis#13473).
#[test]
fn group_lag_follows_redis_7_2() {
    let kite = KiteServer::start(&[], 1);
    let mut c = kite.client();
    let lag = |c: &mut Client, key: &str| {
        let g = c.cmd(&["XINFO", "GROUPS", key]);
        let g = &g.as_array().unwrap()[0];
        (field(g, "entries-read").clone(), field(g, "lag").clone())
    };
    c.cmd_str("XGROUP CREATE planets p $ MKSTREAM");
    assert_eq!(lag(&mut c, "planets"), (Resp::NullBulk, Resp::Integer(0)));
    for (i, n) in ["Mercury", "Venus", "Earth", "Jupiter"].iter().enumerate() {
        if i == 2 {
            c.cmd_str("XREADGROUP GROUP p alice STREAMS planets >");
        }
        c.cmd(&["XADD", "planets", &format!("0-{}", i + 1), "name", n]);
    }
    assert_eq!(lag(&mut c, "planets"), (Resp::Integer(2), Resp::Integer(2)));
    // Deleting entries the group already read leaves the lag known.
    c.cmd_str("XDEL planets 0-1 0-2");
    assert_eq!(lag(&mut c, "planets"), (Resp::Integer(2), Resp::Integer(2)));
    // Once the group's position and every tombstone are behind the first entry, what is
    // left is all lag...
    c.cmd_str("XDEL planets 0-3");
    assert_eq!(lag(&mut c, "planets"), (Resp::Integer(2), Resp::Integer(1)));
    // ...and an empty stream has no lag at all.
    c.cmd_str("XTRIM planets MAXLEN 0");
    assert_eq!(lag(&mut c, "planets").1, Resp::Integer(0));

    for i in 1..=4 {
        c.cmd(&["XADD", "t", &format!("{i}-0"), "a", "1"]);
    }
    c.cmd_str("XGROUP CREATE t g 0 ENTRIESREAD 0");
    c.cmd_str("XREADGROUP GROUP g c COUNT 2 STREAMS t >");
    assert_eq!(lag(&mut c, "t"), (Resp::Integer(2), Resp::Integer(2)));
    c.cmd_str("XADD t 5-0 a 1");
    c.cmd_str("XTRIM t MAXLEN 1");
    // Trimmed past the group's position: what is left is all lag.
    assert_eq!(lag(&mut c, "t"), (Resp::Integer(2), Resp::Integer(1)));
    c.cmd_str("XREADGROUP GROUP g c STREAMS t >");
    assert_eq!(lag(&mut c, "t"), (Resp::Integer(5), Resp::Integer(0)));
}

/// BullMQ's event stream: `XADD ... MAXLEN ~ 10000 *` on every event keeps the stream
/// between the threshold and one node above it; `=` trims exactly.
#[test]
fn event_stream_stays_near_its_cap() {
    let kite = KiteServer::start(&[], 2);
    let mut c = kite.client();
    let batch: Vec<Vec<String>> = (0..25000)
        .map(|i| {
            [
                "XADD",
                "bull:q:events",
                "MAXLEN",
                "~",
                "10000",
                "*",
                "event",
                "added",
                "jobId",
                &i.to_string(),
                "name",
                "job",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        })
        .collect();
    for chunk in batch.chunks(1000) {
        for r in c.pipeline(chunk) {
            assert!(r.as_bytes().is_some(), "XADD failed: {r}");
        }
    }
    let len = c.cmd_str("XLEN bull:q:events").as_int().unwrap();
    assert!((10000..10100).contains(&len), "length {len}");
    let info = c.cmd_str("XINFO STREAM bull:q:events");
    assert_eq!(field(&info, "entries-added"), &Resp::Integer(25000));
    let nodes = field(&info, "radix-tree-keys").as_int().unwrap();
    assert!((100..=102).contains(&nodes), "nodes {nodes}");
    assert_eq!(
        c.cmd_str("XTRIM bull:q:events MAXLEN = 9999"),
        Resp::Integer(len - 9999)
    );
    assert_eq!(c.cmd_str("XLEN bull:q:events"), Resp::Integer(9999));
    // Auto ids keep increasing.
    let last = c.cmd_str("XREVRANGE bull:q:events + - COUNT 2");
    let ids: Vec<(u64, u64)> = ids_of(&last)
        .iter()
        .map(|id| {
            let (ms, seq) = id.split_once('-').unwrap();
            (ms.parse().unwrap(), seq.parse().unwrap())
        })
        .collect();
    assert!(ids[0] > ids[1]);
    let enc = c.cmd_str("OBJECT ENCODING bull:q:events");
    assert_eq!(enc, Resp::bulk("stream"));
    assert_eq!(c.cmd_str("TYPE bull:q:events"), Resp::simple("stream"));
}

#[test]
fn xsetid_stays_above_deleted_ids() {
    let kite = KiteServer::start(&[], 1);
    let mut c = kite.client();
    for i in 1..=3 {
        c.cmd(&["XADD", "s", &format!("{i}-0"), "a", "1"]);
    }
    c.cmd_str("XDEL s 2-0 3-0");
    assert_err_prefix(
        &c.cmd_str("XSETID s 2-5"),
        "ERR The ID specified in XSETID is smaller than current max_deleted_entry_id",
    );
    assert_eq!(c.cmd_str("XSETID s 3-0"), Resp::ok());
    assert_err_prefix(
        &c.cmd_str("XSETID s 4-0 MAXDELETEDID 5-0"),
        "ERR The ID specified in XSETID is smaller than the provided max_deleted_entry_id",
    );
    assert_eq!(
        c.cmd_str("XSETID s 9-0 ENTRIESADDED 9 MAXDELETEDID 8-0"),
        Resp::ok()
    );
    let info = c.cmd_str("XINFO STREAM s");
    assert_eq!(field(&info, "max-deleted-entry-id"), &Resp::bulk("8-0"));
    assert_eq!(field(&info, "entries-added"), &Resp::Integer(9));
    assert_eq!(field(&info, "last-generated-id"), &Resp::bulk("9-0"));
}

#[test]
fn empty_streams_stay_and_ids_keep_rising() {
    let kite = KiteServer::start(&[], 1);
    let mut c = kite.client();
    c.cmd_str("XADD s 5-0 a 1");
    c.cmd_str("XDEL s 5-0");
    assert_eq!(c.cmd_str("EXISTS s"), Resp::Integer(1));
    assert_eq!(c.cmd_str("XLEN s"), Resp::Integer(0));
    assert_err_prefix(
        &c.cmd_str("XADD s 5-0 a 1"),
        "ERR The ID specified in XADD is equal or smaller",
    );
    assert_eq!(c.cmd_str("XADD s 5-* a 1"), Resp::bulk("5-1"));
    let id = c.cmd_str("XADD s * a 1").as_string().unwrap();
    let ms: u64 = id.split('-').next().unwrap().parse().unwrap();
    assert!(ms > 5);
    // A sequence at its limit moves to the next millisecond for `*`, and fails for `ms-*`.
    c.cmd_str("DEL s");
    c.cmd_str("XADD s 7-18446744073709551615 a 1");
    assert_err_prefix(
        &c.cmd_str("XADD s 7-* a 1"),
        "ERR The ID specified in XADD is equal or smaller",
    );
    assert_eq!(c.cmd_str("XADD s 8-* a 1"), Resp::bulk("8-0"));
}
