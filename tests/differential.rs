//! Differential tests: the same seeded random command sequences go to Kite and to a
//! real redis-server, and every reply must match.
//!
//! Reproduce one seed: `KITE_DIFF_SEEDS=7 cargo test --release --test differential`.
//! Longer runs: `KITE_DIFF_OPS=20000`.

#[macro_use]
mod common;

use common::*;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

/// How two replies are compared.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Check {
    /// Byte-for-byte equal.
    Exact,
    /// Arrays compared after sorting (KEYS).
    Sorted,
    /// Integers within this distance when both are >= 0 (TTL and friends).
    Tolerance(i64),
    /// OBJECT ENCODING: list encodings differ between Redis 7.0 and 7.2.
    Encoding,
}

struct Step {
    conn: usize,
    args: Args,
    check: Check,
}

impl Step {
    fn new(conn: usize, args: Args, check: Check) -> Step {
        Step { conn, args, check }
    }
}

/// The shared key space: small so commands collide; some keys share a hashtag, some
/// are binary; the rest spread over shards.
const KEYS: &[&[u8]] = &[
    b"a",
    b"b",
    b"c",
    b"counter",
    b"{user1}:name",
    b"{user1}:age",
    b"{user1}:bits",
    b"{job}:1",
    b"{job}:2",
    b"{job}:3",
    b"list1",
    b"list2",
    b"key:with:colons",
    b"bin\x00key\xff",
    b"new\r\nline",
    b"k1",
    b"k2",
    b"k3",
    b"bits",
    b"x",
];

/// Keys that only ever hold numbers whose sums are exact in binary floating point, so
/// INCRBYFLOAT results do not depend on `long double` precision (tested separately).
const FLOAT_KEYS: &[&[u8]] = &[b"fl:1", b"{user1}:fl"];

const KEY_PATTERNS: &[&str] = &[
    "*",
    "*",
    "k*",
    "{user1}*",
    "?",
    "[ab]",
    "*:*",
    "[^a]*",
    "{job}:[12]",
    "list?",
    "*1*",
    "nomatch*",
    "bin*",
    "*\\:*",
    "[a-c]",
];

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_secs() as i64
}

/// Random command generator for one seed.
struct Gen {
    rng: Rng,
    now: i64,
    used_rel: HashSet<i64>,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
            now: now_secs(),
            used_rel: HashSet::new(),
        }
    }

    fn key(&mut self) -> Vec<u8> {
        self.rng.pick(KEYS).to_vec()
    }

    fn float_key(&mut self) -> Vec<u8> {
        self.rng.pick(FLOAT_KEYS).to_vec()
    }

    /// A key for commands that cannot break the float-key invariant (reads, deletes).
    fn any_key(&mut self) -> Vec<u8> {
        if self.rng.chance(10) {
            self.float_key()
        } else {
            self.key()
        }
    }

    fn keys(&mut self, lo: i64, hi: i64) -> Args {
        let n = self.rng.range(lo, hi);
        (0..n).map(|_| self.key()).collect()
    }

    fn any_keys(&mut self, lo: i64, hi: i64) -> Args {
        let n = self.rng.range(lo, hi);
        (0..n).map(|_| self.any_key()).collect()
    }

    fn abc_string(&mut self, max: i64) -> Vec<u8> {
        let n = self.rng.range(1, max);
        (0..n).map(|_| b"abc"[self.rng.index(3)]).collect()
    }

    fn value(&mut self) -> Vec<u8> {
        match self.rng.below(16) {
            0..=3 => self.abc_string(8),
            4..=6 => self.rng.range(-1000, 1000).to_string().into_bytes(),
            7 => self
                .rng
                .pick(&[
                    "9223372036854775807",
                    "-9223372036854775808",
                    "9223372036854775806",
                    "-9223372036854775807",
                    "4611686018427387904",
                ])
                .as_bytes()
                .to_vec(),
            8 => self
                .rng
                .pick(&[
                    "010",
                    "+1",
                    " 1",
                    "1 ",
                    "0x10",
                    "-0",
                    "1e3",
                    "3.5",
                    "",
                    "12345678901234567890",
                    "-",
                    "9999",
                    "10000",
                ])
                .as_bytes()
                .to_vec(),
            9 => {
                let n = self.rng.range(1, 6) as usize;
                (0..n)
                    .map(|_| {
                        *self
                            .rng
                            .pick(&[0u8, 0xff, b'\r', b'\n', b' ', b'"', 0x80, b'a'])
                    })
                    .collect()
            }
            10 => {
                let len = *self.rng.pick(&[43usize, 44, 45, 46]);
                vec![b'v'; len]
            }
            11 => {
                let n = self.rng.range(60, 130) as usize;
                (0..n).map(|_| b'a' + self.rng.below(26) as u8).collect()
            }
            12 => self
                .rng
                .pick(&["hello", "world", "foobar", "Redis", "kite", "\u{e9}t\u{e9}"])
                .as_bytes()
                .to_vec(),
            _ => self.rng.range(0, 20).to_string().into_bytes(),
        }
    }

    fn float_value(&mut self) -> Vec<u8> {
        self.rng
            .pick(&[
                "3.5", "1e3", "-2.25", "0", "10", "abc", " 1", "0.5", "-100", "7",
            ])
            .as_bytes()
            .to_vec()
    }

    /// An integer argument for INCRBY and friends.
    fn int_arg(&mut self) -> String {
        match self.rng.below(20) {
            0 => self
                .rng
                .pick(&[
                    "9223372036854775807",
                    "-9223372036854775808",
                    "9223372036854775806",
                    "-9223372036854775807",
                ])
                .to_string(),
            1 => self
                .rng
                .pick(&["1.5", "abc", "", " 1", "1e3", "0x1", "99999999999999999999"])
                .to_string(),
            _ => self.rng.range(-100, 100).to_string(),
        }
    }

    /// Relative expiry in seconds, unique per seed and on a 1000 s grid, so that two
    /// relative expiries never tie (a tie would depend on milliseconds elapsed).
    fn rel_secs(&mut self) -> i64 {
        loop {
            let v = self.rng.range(1, 100_000) * 1000;
            if self.used_rel.insert(v) {
                return v;
            }
        }
    }

    /// Absolute unix time in the future, 500 s off the relative grid.
    fn abs_secs(&mut self) -> i64 {
        self.now + self.rng.range(1, 100_000) * 1000 + 500
    }

    /// Absolute unix time in the past.
    fn past_secs(&mut self) -> i64 {
        self.now - self.rng.range(1, 10_000_000)
    }

    fn small_db(&mut self) -> String {
        if self.rng.chance(4) {
            self.rng.pick(&["16", "-1", "abc", "99"]).to_string()
        } else {
            self.rng.range(0, 3).to_string()
        }
    }

    // ----- string commands -----

    fn set_cmd(&mut self) -> Args {
        let mut a = args!["SET", self.key(), self.value()];
        let mut groups: Vec<Args> = Vec::new();
        if self.rng.chance(40) {
            let g = match self.rng.below(6) {
                0 => args!["EX", self.rel_secs()],
                1 => args!["PX", self.rel_secs() * 1000],
                2 => args!["EXAT", self.abs_secs()],
                3 => args!["PXAT", self.abs_secs() * 1000],
                4 => args!["KEEPTTL"],
                _ => {
                    let (opt, v) = *self.rng.pick(&[
                        ("EX", "0"),
                        ("EX", "-5"),
                        ("PX", "abc"),
                        ("EX", "9223372036854775807"),
                        ("PX", "0"),
                        ("EXAT", "0"),
                        ("EX", "1.5"),
                    ]);
                    args![opt, v]
                }
            };
            groups.push(g);
        }
        if self.rng.chance(25) {
            groups.push(args![*self.rng.pick(&["NX", "XX"])]);
        }
        if self.rng.chance(15) {
            groups.push(args!["GET"]);
        }
        if self.rng.chance(3) {
            // Conflicting or unknown options.
            groups.push(match self.rng.below(4) {
                0 => args!["NX", "XX"],
                1 => args!["EX", "100", "PX", "100"],
                2 => args!["KEEPTTL", "EX", "100"],
                _ => args!["BOGUS"],
            });
        }
        self.rng.shuffle(&mut groups);
        for g in groups {
            a.extend(g);
        }
        a
    }

    fn getex_cmd(&mut self) -> Args {
        let mut a = args!["GETEX", self.key()];
        match self.rng.below(10) {
            0 => a.extend(args!["EX", self.rel_secs()]),
            1 => a.extend(args!["PX", self.rel_secs() * 1000]),
            2 => a.extend(args!["EXAT", self.abs_secs()]),
            3 => a.extend(args!["PXAT", self.abs_secs() * 1000]),
            4 => a.extend(args!["PERSIST"]),
            5 => a.extend(args!["EXAT", self.past_secs()]),
            6 => a.extend(
                self.rng
                    .pick(&[
                        args!["EX", "0"],
                        args!["EX", "abc"],
                        args!["PERSIST", "EX", "100"],
                        args!["FOO"],
                        args!["EX"],
                    ])
                    .clone(),
            ),
            _ => {}
        }
        a
    }

    fn bitfield_cmd(&mut self, ro: bool) -> Args {
        let mut a = args![if ro { "BITFIELD_RO" } else { "BITFIELD" }, self.key()];
        let n = self.rng.range(0, 3);
        for _ in 0..n {
            let ty = if self.rng.chance(4) {
                self.rng
                    .pick(&["u64", "i65", "x8", "i0", "u0", ""])
                    .to_string()
            } else {
                self.rng
                    .pick(&[
                        "u1", "u4", "u8", "i8", "i5", "u16", "i16", "i32", "u31", "i63", "i64",
                        "u63",
                    ])
                    .to_string()
            };
            let off = match self.rng.below(20) {
                0 => self.rng.pick(&["-1", "abc", "#-1", "#"]).to_string(),
                1..=4 => format!("#{}", self.rng.range(0, 5)),
                _ => self.rng.range(0, 100).to_string(),
            };
            let val = if self.rng.chance(10) {
                self.rng
                    .pick(&["9223372036854775807", "-9223372036854775808", "abc"])
                    .to_string()
            } else {
                self.rng.range(-300, 300).to_string()
            };
            let sub = if ro && !self.rng.chance(10) {
                0
            } else {
                self.rng.below(5)
            };
            match sub {
                0 | 4 => a.extend(args!["GET", ty, off]),
                1 => a.extend(args!["SET", ty, off, val]),
                2 => a.extend(args!["INCRBY", ty, off, val]),
                _ => a.extend(args![
                    "OVERFLOW",
                    *self.rng.pick(&["WRAP", "SAT", "FAIL", "BOGUS", "sat"])
                ]),
            }
        }
        a
    }

    fn range_pair(&mut self) -> (String, String) {
        if self.rng.chance(5) {
            let big = *self.rng.pick(&[
                "9223372036854775807",
                "-9223372036854775808",
                "4611686018427387904",
            ]);
            (self.rng.range(-5, 5).to_string(), big.to_string())
        } else {
            (
                self.rng.range(-12, 12).to_string(),
                self.rng.range(-12, 12).to_string(),
            )
        }
    }

    fn string_cmd(&mut self) -> Args {
        match self.rng.below(40) {
            0..=4 => self.set_cmd(),
            5..=7 => args!["GET", self.any_key()],
            8 => self.getex_cmd(),
            9 => args!["GETDEL", self.key()],
            10 => args!["GETSET", self.key(), self.value()],
            11 => {
                let mut a = args!["MGET"];
                a.extend(self.any_keys(1, 5));
                a
            }
            12 | 13 => {
                let cmd = if self.rng.chance(70) {
                    "MSET"
                } else {
                    "MSETNX"
                };
                let mut a = args![cmd];
                for _ in 0..self.rng.range(1, 4) {
                    a.push(self.key());
                    a.push(self.value());
                }
                if self.rng.chance(4) {
                    a.pop();
                }
                a
            }
            14 => args!["SETNX", self.key(), self.value()],
            15 => {
                let secs = if self.rng.chance(10) {
                    self.rng.pick(&["0", "-1", "abc"]).to_string()
                } else {
                    self.rel_secs().to_string()
                };
                args!["SETEX", self.key(), secs, self.value()]
            }
            16 => {
                let ms = if self.rng.chance(10) {
                    self.rng.pick(&["0", "-1", "abc"]).to_string()
                } else {
                    (self.rel_secs() * 1000).to_string()
                };
                args!["PSETEX", self.key(), ms, self.value()]
            }
            17 | 18 => args![*self.rng.pick(&["INCR", "DECR"]), self.key()],
            19 | 20 => args![
                *self.rng.pick(&["INCRBY", "DECRBY"]),
                self.key(),
                self.int_arg()
            ],
            21 | 22 => {
                if self.rng.chance(80) {
                    let incr = *self.rng.pick(&[
                        "0.5", "1.25", "-2.75", "3", "100", "1e3", "2.5e-1", "-0.25", "5.0e3", "0",
                        "abc", "inf",
                    ]);
                    args!["INCRBYFLOAT", self.float_key(), incr]
                } else {
                    // On general keys only increments whose result does not depend on
                    // precision: type errors, parse errors, infinities.
                    let incr = *self.rng.pick(&["abc", "inf", "-inf", "nan", "1e", ""]);
                    args!["INCRBYFLOAT", self.key(), incr]
                }
            }
            23 => {
                if self.rng.chance(50) {
                    args!["SET", self.float_key(), self.float_value()]
                } else {
                    args!["APPEND", self.key(), self.value()]
                }
            }
            24 => args!["APPEND", self.key(), self.value()],
            25 => args!["STRLEN", self.any_key()],
            26 => {
                let (s, e) = self.range_pair();
                args!["GETRANGE", self.key(), s, e]
            }
            27 => {
                let off = if self.rng.chance(8) {
                    self.rng
                        .pick(&["-1", "abc", "1000000000000", "536870912"])
                        .to_string()
                } else {
                    self.rng.range(0, 40).to_string()
                };
                let v = if self.rng.chance(10) {
                    Vec::new()
                } else {
                    self.value()
                };
                args!["SETRANGE", self.key(), off, v]
            }
            28 | 29 => {
                let mut a = args!["LCS", self.key(), self.key()];
                match self.rng.below(6) {
                    0 => a.extend(args!["LEN"]),
                    1 => a.extend(args!["IDX"]),
                    2 => a.extend(args!["IDX", "WITHMATCHLEN"]),
                    3 => a.extend(args![
                        "IDX",
                        "MINMATCHLEN",
                        self.rng.range(0, 4),
                        "WITHMATCHLEN"
                    ]),
                    4 => a.extend(
                        self.rng
                            .pick(&[
                                args!["LEN", "IDX"],
                                args!["MINMATCHLEN", "abc"],
                                args!["FOO"],
                                args!["IDX", "MINMATCHLEN"],
                            ])
                            .clone(),
                    ),
                    _ => {}
                }
                a
            }
            30 | 31 => {
                let off = if self.rng.chance(6) {
                    self.rng.pick(&["-1", "abc", "4294967296"]).to_string()
                } else {
                    self.rng.range(0, 400).to_string()
                };
                let bit = if self.rng.chance(6) {
                    self.rng.pick(&["2", "-1", "x"]).to_string()
                } else {
                    self.rng.range(0, 1).to_string()
                };
                args!["SETBIT", self.key(), off, bit]
            }
            32 => {
                let off = if self.rng.chance(6) {
                    self.rng
                        .pick(&["-1", "abc", "4294967296", "4294967295"])
                        .to_string()
                } else {
                    self.rng.range(0, 500).to_string()
                };
                args!["GETBIT", self.key(), off]
            }
            33 => {
                // Only well-formed ranges: for a missing key with bad arguments Redis 7.0
                // answers 0 while 7.2 answers an error.
                let mut a = args!["BITCOUNT", self.key()];
                if self.rng.chance(60) {
                    a.extend(args![self.rng.range(-10, 10), self.rng.range(-10, 10)]);
                    if self.rng.chance(40) {
                        a.extend(args![*self.rng.pick(&["BYTE", "BIT"])]);
                    }
                }
                a
            }
            34 => {
                let mut a = args!["BITPOS", self.key(), self.rng.range(0, 1)];
                if self.rng.chance(60) {
                    a.extend(args![self.rng.range(-10, 10)]);
                    if self.rng.chance(60) {
                        a.extend(args![self.rng.range(-10, 10)]);
                        if self.rng.chance(40) {
                            a.extend(args![*self.rng.pick(&["BYTE", "BIT"])]);
                        }
                    }
                }
                a
            }
            35 | 36 => {
                let op = *self.rng.pick(&["AND", "OR", "XOR", "NOT", "and", "FOO"]);
                let mut a = args!["BITOP", op, self.key()];
                let n = if op == "NOT" && self.rng.chance(80) {
                    1
                } else {
                    self.rng.range(1, 3)
                };
                a.extend(self.keys(n, n));
                a
            }
            37 => self.bitfield_cmd(false),
            38 => self.bitfield_cmd(true),
            _ => args!["SET", self.key(), self.value()],
        }
    }

    // ----- keyspace commands -----

    fn key_cmd(&mut self) -> (Args, Check) {
        let exact = Check::Exact;
        match self.rng.below(32) {
            0..=2 => {
                let mut a = args![*self.rng.pick(&["DEL", "UNLINK"])];
                a.extend(self.any_keys(1, 4));
                (a, exact)
            }
            3 | 4 => {
                let mut a = args!["EXISTS"];
                a.extend(self.any_keys(1, 4));
                (a, exact)
            }
            5 => {
                let mut a = args!["TOUCH"];
                a.extend(self.any_keys(1, 3));
                (a, exact)
            }
            6 | 7 => (args!["TYPE", self.any_key()], exact),
            8 | 9 => (
                args![
                    *self.rng.pick(&["RENAME", "RENAMENX"]),
                    self.key(),
                    self.key()
                ],
                exact,
            ),
            10 | 11 => {
                let mut a = args!["COPY", self.key(), self.key()];
                if self.rng.chance(30) {
                    a.extend(args!["DB", self.small_db()]);
                }
                if self.rng.chance(40) {
                    a.extend(args!["REPLACE"]);
                }
                if self.rng.chance(3) {
                    a.extend(args!["BOGUS"]);
                }
                (a, exact)
            }
            12 => (args!["MOVE", self.key(), self.small_db()], exact),
            13 | 14 => (args!["SELECT", self.small_db()], exact),
            15 => (args!["SWAPDB", self.small_db(), self.small_db()], exact),
            16 | 17 => (args!["DBSIZE"], exact),
            18 => {
                if self.rng.chance(25) {
                    let mut a = args!["FLUSHDB"];
                    if self.rng.chance(50) {
                        a.extend(args![*self.rng.pick(&["ASYNC", "SYNC"])]);
                    }
                    (a, exact)
                } else {
                    (args!["DBSIZE"], exact)
                }
            }
            19 | 20 => (args!["KEYS", *self.rng.pick(KEY_PATTERNS)], Check::Sorted),
            21 | 22 => {
                if self.rng.chance(5) {
                    (args!["OBJECT", "FOO", self.key()], exact)
                } else {
                    (args!["OBJECT", "ENCODING", self.any_key()], Check::Encoding)
                }
            }
            23 | 24 => {
                let mut a = args![*self.rng.pick(&["RPUSH", "LPUSH"]), self.key()];
                for _ in 0..self.rng.range(1, 3) {
                    a.push(self.value());
                }
                (a, exact)
            }
            25 => (args!["LRANGE", self.any_key(), 0, -1], exact),
            26 => (args!["LLEN", self.any_key()], exact),
            27 => (args!["LPOP", self.key()], exact),
            28 => (args!["ECHO", self.value()], exact),
            _ => (args!["EXISTS", self.any_key()], exact),
        }
    }

    // ----- expiry commands -----

    fn expire_cmd(&mut self) -> Args {
        let k = self.any_key();
        let special = self.rng.chance(10);
        let (name, val) = match self.rng.below(4) {
            0 => ("EXPIRE", self.rel_secs().to_string()),
            1 => ("PEXPIRE", (self.rel_secs() * 1000).to_string()),
            2 => (
                "EXPIREAT",
                if self.rng.chance(15) {
                    self.past_secs()
                } else {
                    self.abs_secs()
                }
                .to_string(),
            ),
            _ => (
                "PEXPIREAT",
                if self.rng.chance(15) {
                    self.past_secs() * 1000
                } else {
                    self.abs_secs() * 1000
                }
                .to_string(),
            ),
        };
        let val = if special {
            self.rng
                .pick(&[
                    "0",
                    "-1",
                    "abc",
                    "9223372036854775807",
                    "-9223372036854775808",
                    "1.5",
                    "",
                    "-5",
                ])
                .to_string()
        } else {
            val
        };
        let mut a = args![name, k, val];
        match self.rng.below(20) {
            0..=2 => a.extend(args!["NX"]),
            3..=5 => a.extend(args!["XX"]),
            6..=8 => a.extend(args!["GT"]),
            9..=11 => a.extend(args!["LT"]),
            12 => {
                let pair = *self.rng.pick(&[
                    ("NX", "XX"),
                    ("GT", "LT"),
                    ("NX", "GT"),
                    ("XX", "GT"),
                    ("xx", "lt"),
                    ("LT", "NX"),
                ]);
                a.extend(args![pair.0, pair.1]);
            }
            13 => a.extend(args!["BOGUS"]),
            _ => {}
        }
        a
    }

    fn ttl_cmd(&mut self) -> (Args, Check) {
        let k = self.any_key();
        match self.rng.below(6) {
            0 => (args!["TTL", k], Check::Tolerance(2)),
            1 => (args!["PTTL", k], Check::Tolerance(2000)),
            2 => (args!["EXPIRETIME", k], Check::Tolerance(2)),
            3 => (args!["PEXPIRETIME", k], Check::Tolerance(2000)),
            _ => (args!["PERSIST", k], Check::Exact),
        }
    }

    fn error_cmd(&mut self) -> Args {
        match self.rng.below(6) {
            0 => args!["NOSUCHCMD", self.key(), "x"],
            1 => args!["NOSUCHCMD"],
            2 => self
                .rng
                .pick(&[
                    args!["GET"],
                    args!["SET", "a"],
                    args!["INCRBY", "a"],
                    args!["EXPIRE", "a"],
                    args!["MGET"],
                    args!["DEL"],
                    args!["GETRANGE", "a", "0"],
                    args!["LCS", "a"],
                    args!["TTL"],
                    args!["SELECT"],
                    args!["SWAPDB", "0"],
                    args!["OBJECT"],
                    args!["BITOP", "AND"],
                    args!["MSETNX", "a"],
                    args!["GETEX"],
                    args!["SETEX", "a", "10"],
                ])
                .clone(),
            3 => args!["EXEC"],
            4 => args!["DISCARD"],
            _ => args!["UNWATCH"],
        }
    }

    /// One plain command (not MULTI/EXEC framing) and how to compare its reply.
    fn command(&mut self, in_tx: bool) -> (Args, Check) {
        loop {
            let (mut a, check) = match self.rng.below(100) {
                0..=44 => (self.string_cmd(), Check::Exact),
                45..=71 => self.key_cmd(),
                72..=83 => (self.expire_cmd(), Check::Exact),
                84..=93 => self.ttl_cmd(),
                _ => (self.error_cmd(), Check::Exact),
            };
            if in_tx && (check != Check::Exact || is_tx_control(&a)) {
                continue;
            }
            self.mutate(&mut a);
            return (a, check);
        }
    }

    /// Occasionally drops or adds arguments and changes the command name's case.
    fn mutate(&mut self, a: &mut Args) {
        if a.len() > 1 && self.rng.chance(2) {
            let keep = self.rng.range(1, a.len() as i64 - 1) as usize;
            a.truncate(keep);
        } else if self.rng.chance(1) {
            a.push(b"junk".to_vec());
        }
        match self.rng.below(100) {
            0..=14 => a[0].make_ascii_lowercase(),
            15..=17 => {
                for (i, c) in a[0].iter_mut().enumerate() {
                    if i % 2 == 1 {
                        c.make_ascii_lowercase();
                    }
                }
            }
            _ => {}
        }
    }

    /// A command for the second connection (always in DB 0, never in a transaction).
    fn other_conn_cmd(&mut self, key: Option<Vec<u8>>) -> Args {
        let k = key.unwrap_or_else(|| self.key());
        match self.rng.below(9) {
            0 | 1 => args!["SET", k, self.value()],
            2 => args!["DEL", k],
            3 => args!["INCR", k],
            4 => args!["GET", k],
            5 => args!["EXPIRE", k, self.rel_secs()],
            6 => args!["APPEND", k, self.value()],
            7 => args!["RPUSH", k, self.value()],
            _ => args!["PERSIST", k],
        }
    }

    /// A MULTI ... EXEC/DISCARD block, possibly with WATCH and a concurrent write.
    fn transaction(&mut self) -> Vec<Step> {
        let mut steps = Vec::new();
        let watched = if self.rng.chance(50) {
            self.keys(1, 2)
        } else {
            Vec::new()
        };
        if !watched.is_empty() {
            let mut a = args!["WATCH"];
            a.extend(watched.iter().cloned());
            steps.push(Step::new(0, a, Check::Exact));
        }
        let touch_at = if self.rng.chance(40) {
            let key = if !watched.is_empty() && self.rng.chance(70) {
                Some(watched[self.rng.index(watched.len())].clone())
            } else {
                None
            };
            Some((self.rng.below(2), self.other_conn_cmd(key)))
        } else {
            None
        };
        if self.rng.chance(5) {
            steps.push(Step::new(0, args!["UNWATCH"], Check::Exact));
        }
        if let Some((0, a)) = &touch_at {
            steps.push(Step::new(1, a.clone(), Check::Exact));
        }
        steps.push(Step::new(0, args!["MULTI"], Check::Exact));
        let n = self.rng.range(1, 5);
        for i in 0..n {
            let (a, _) = self.command(true);
            steps.push(Step::new(0, a, Check::Exact));
            if i == 0 {
                if let Some((1, a)) = &touch_at {
                    steps.push(Step::new(1, a.clone(), Check::Exact));
                }
            }
        }
        match self.rng.below(100) {
            0..=3 => steps.push(Step::new(0, args!["MULTI"], Check::Exact)),
            4..=7 => steps.push(Step::new(0, args!["WATCH", self.key()], Check::Exact)),
            8..=10 => steps.push(Step::new(0, args!["NOSUCHCMD", "a"], Check::Exact)),
            11..=13 => steps.push(Step::new(0, args!["GET"], Check::Exact)),
            _ => {}
        }
        let end = if self.rng.chance(85) {
            "EXEC"
        } else {
            "DISCARD"
        };
        steps.push(Step::new(0, args![end], Check::Exact));
        steps
    }

    /// The next step(s) of the sequence.
    fn next_steps(&mut self) -> Vec<Step> {
        match self.rng.below(100) {
            0..=5 => self.transaction(),
            6..=9 => vec![Step::new(1, self.other_conn_cmd(None), Check::Exact)],
            10 => {
                let mut a = args!["WATCH"];
                a.extend(self.keys(1, 2));
                vec![Step::new(0, a, Check::Exact)]
            }
            _ => {
                let (a, check) = self.command(false);
                vec![Step::new(0, a, check)]
            }
        }
    }
}

fn is_tx_control(a: &Args) -> bool {
    let name = String::from_utf8_lossy(&a[0]).to_ascii_uppercase();
    matches!(
        name.as_str(),
        "MULTI" | "EXEC" | "DISCARD" | "WATCH" | "UNWATCH"
    )
}

fn normalize_encoding(r: &Resp) -> Resp {
    match r.as_bytes() {
        Some(b"quicklist") | Some(b"listpack") | Some(b"ziplist") => Resp::bulk("<list encoding>"),
        _ => r.clone(),
    }
}

fn sorted(r: &Resp) -> Resp {
    match r {
        Resp::Array(v) | Resp::Set(v) => {
            let mut v = v.clone();
            v.sort_by_key(|x| x.encode());
            Resp::Array(v)
        }
        other => other.clone(),
    }
}

fn replies_match(check: Check, kite: &Resp, redis: &Resp) -> bool {
    match check {
        Check::Exact => kite == redis,
        Check::Sorted => sorted(kite) == sorted(redis),
        Check::Tolerance(t) => match (kite, redis) {
            (Resp::Integer(a), Resp::Integer(b)) if *a >= 0 && *b >= 0 => (a - b).abs() <= t,
            _ => kite == redis,
        },
        Check::Encoding => normalize_encoding(kite) == normalize_encoding(redis),
    }
}

/// Connections to both servers (index 0: main connection, 1: the "other" client).
struct Pair {
    kite: Vec<Client>,
    redis: Vec<Client>,
    history: VecDeque<String>,
    label: String,
    count: usize,
    /// Per command name: (non-error replies, error replies), from redis-server.
    stats: BTreeMap<String, (usize, usize)>,
}

impl Pair {
    fn new(kite: &KiteServer, redis: &RedisServer, resp3: bool, label: String) -> Pair {
        let mut p = Pair {
            kite: vec![kite.client(), kite.client()],
            redis: vec![redis.client(), redis.client()],
            history: VecDeque::new(),
            label,
            count: 0,
            stats: BTreeMap::new(),
        };
        for side in [&mut p.kite, &mut p.redis] {
            assert_eq!(side[0].cmd(&["FLUSHALL"]), Resp::ok());
            if resp3 {
                for c in side.iter_mut() {
                    let r = c.cmd(&["HELLO", "3"]);
                    assert!(matches!(r, Resp::Map(_)), "HELLO 3 returned {r}");
                }
            }
        }
        p
    }

    fn fail(&self, step: &Step, kite: &str, redis: &str) -> ! {
        let hist: Vec<String> = self.history.iter().cloned().collect();
        panic!(
            "\nDIFFERENTIAL MISMATCH ({})\n  command #{} on connection {}: {}\n  kite:  {}\n  redis: {}\n\
             last commands (oldest first):\n    {}\n",
            self.label,
            self.count,
            step.conn,
            fmt_cmd(&step.args),
            kite,
            redis,
            hist.join("\n    ")
        );
    }

    fn run(&mut self, step: &Step) -> Resp {
        let kr = {
            let c = &mut self.kite[step.conn];
            c.send(&step.args);
            c.try_read()
        };
        let rr = {
            let c = &mut self.redis[step.conn];
            c.send(&step.args);
            c.try_read()
        };
        let (kr, rr) = match (kr, rr) {
            (Ok(k), Ok(r)) => (k, r),
            (k, r) => {
                let k = k
                    .map(|x| x.to_string())
                    .unwrap_or_else(|e| format!("<no reply: {e}>"));
                let r = r
                    .map(|x| x.to_string())
                    .unwrap_or_else(|e| format!("<no reply: {e}>"));
                self.fail(step, &k, &r);
            }
        };
        if !replies_match(step.check, &kr, &rr) {
            self.fail(step, &kr.to_string(), &rr.to_string());
        }
        let mut line = format!(
            "#{} c{} {} -> {}",
            self.count,
            step.conn,
            fmt_cmd(&step.args),
            rr
        );
        if line.len() > 300 {
            let mut cut = 300;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str("...");
        }
        self.history.push_back(line);
        let name = String::from_utf8_lossy(&step.args[0]).to_ascii_uppercase();
        let entry = self.stats.entry(name).or_default();
        if rr.is_error() {
            entry.1 += 1;
        } else {
            entry.0 += 1;
        }
        if self.history.len() > 25 {
            self.history.pop_front();
        }
        self.count += 1;
        rr
    }

    fn run_args(&mut self, conn: usize, args: Args, check: Check) -> Resp {
        self.run(&Step::new(conn, args, check))
    }

    /// Compares the whole visible state of DBs 0..=3 (keys, types, values, TTLs).
    fn compare_state(&mut self) {
        for c in [&mut self.kite[0], &mut self.redis[0]] {
            // Leave any open transaction so the dump runs normally.
            let _ = c.cmd(&["DISCARD"]);
        }
        for db in 0..4 {
            self.run_args(0, args!["SELECT", db as i64], Check::Exact);
            let keys = self.run_args(0, args!["KEYS", "*"], Check::Sorted);
            let mut keys: Vec<Vec<u8>> = bytes_set(&keys).into_iter().collect();
            keys.sort();
            for k in keys {
                let ty = self.run_args(0, args!["TYPE", &k], Check::Exact);
                match ty.as_bytes() {
                    Some(b"string") => {
                        self.run_args(0, args!["GET", &k], Check::Exact);
                    }
                    Some(b"list") => {
                        self.run_args(0, args!["LRANGE", &k, 0, -1], Check::Exact);
                    }
                    _ => {}
                }
                self.run_args(0, args!["PTTL", &k], Check::Tolerance(2000));
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
        "seed {seed}, {}, {} vs redis-server; reproduce: KITE_DIFF_SEEDS={seed} cargo test --release --test differential {test}",
        if resp3 { "RESP3" } else { "RESP2" },
        kite.name
    );
    let mut pair = Pair::new(kite, redis, resp3, label);
    let mut gen = Gen::new(seed);
    while pair.count < ops {
        for step in gen.next_steps() {
            pair.run(&step);
        }
    }
    pair.compare_state();
    print_reply_stats("KITE_DIFF_STATS", seed, &pair.stats);
}

fn run_differential(threads: usize, default_seeds: &[u64], resp3: bool, test: &str) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let ops = usize_from_env("KITE_DIFF_OPS", 5000);
    for seed in seeds_from_env("KITE_DIFF_SEEDS", default_seeds) {
        run_seed(&kite, &redis, seed, ops, resp3, test);
    }
}

#[test]
fn random_commands_threads1() {
    run_differential(1, &[1, 2, 3], false, "random_commands_threads1");
}

#[test]
fn random_commands_threads4() {
    run_differential(4, &[101, 102, 103, 104], false, "random_commands_threads4");
}

#[test]
fn random_commands_threads4_resp3() {
    run_differential(4, &[201, 202], true, "random_commands_threads4_resp3");
}

// ---------------------------------------------------------------------------
// Scripted scenarios (clear failure messages for the important cases)
// ---------------------------------------------------------------------------

fn scripted(pair: &mut Pair, script: &[(usize, &str)]) -> Vec<Resp> {
    script
        .iter()
        .map(|(conn, line)| {
            let a: Args = line.split(' ').map(|s| s.as_bytes().to_vec()).collect();
            pair.run_args(*conn, a, Check::Exact)
        })
        .collect()
}

#[test]
fn transactions_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    for resp3 in [false, true] {
        let mut p = Pair::new(&kite, &redis, resp3, format!("transactions, resp3={resp3}"));
        // A write by another connection to a watched key makes EXEC return null.
        let r = scripted(
            &mut p,
            &[
                (0, "SET w 1"),
                (0, "WATCH w"),
                (1, "SET w 2"),
                (0, "MULTI"),
                (0, "INCR w"),
                (0, "EXEC"),
                (0, "GET w"),
            ],
        );
        assert!(
            r[5].is_null(),
            "EXEC after a touched WATCH must be null, got {}",
            r[5]
        );
        // A read by another connection does not; keys on several shards.
        let r = scripted(
            &mut p,
            &[
                (0, "WATCH w a b c {job}:1"),
                (1, "GET w"),
                (1, "SET unrelated 1"),
                (0, "MULTI"),
                (0, "INCR w"),
                (0, "SET a 1"),
                (0, "SET {job}:1 x"),
                (0, "MGET w a {job}:1 c"),
                (0, "EXEC"),
            ],
        );
        assert!(
            matches!(r[8], Resp::Array(_)),
            "EXEC must run, got {}",
            r[8]
        );
        // Deleting a watched key that did not exist, then recreating, still counts.
        scripted(
            &mut p,
            &[
                (0, "WATCH ghost"),
                (1, "SET ghost 1"),
                (1, "DEL ghost"),
                (0, "MULTI"),
                (0, "SET ghost 2"),
                (0, "EXEC"),
                (0, "EXISTS ghost"),
            ],
        );
        // UNWATCH forgets; an empty transaction returns an empty array.
        scripted(
            &mut p,
            &[
                (0, "WATCH w"),
                (0, "UNWATCH"),
                (1, "SET w 5"),
                (0, "MULTI"),
                (0, "EXEC"),
            ],
        );
        // A watched key in another DB is a different key.
        scripted(
            &mut p,
            &[
                (0, "SELECT 1"),
                (0, "WATCH w"),
                (1, "SET w 6"),
                (0, "MULTI"),
                (0, "SET w 7"),
                (0, "EXEC"),
                (0, "SELECT 0"),
            ],
        );
        // FLUSHDB / expire / rename by others invalidate watches.
        scripted(
            &mut p,
            &[
                (0, "SET w 1"),
                (0, "WATCH w"),
                (1, "FLUSHDB"),
                (0, "MULTI"),
                (0, "SET w 2"),
                (0, "EXEC"),
                (0, "SET w 1"),
                (0, "WATCH w"),
                (1, "EXPIRE w 1000"),
                (0, "MULTI"),
                (0, "SET w 2"),
                (0, "EXEC"),
                (0, "SET v 1"),
                (0, "WATCH w"),
                (1, "RENAME v w"),
                (0, "MULTI"),
                (0, "GET w"),
                (0, "EXEC"),
                (0, "WATCH w"),
                (1, "SWAPDB 0 1"),
                (0, "MULTI"),
                (0, "GET w"),
                (0, "EXEC"),
                (1, "SWAPDB 0 1"),
            ],
        );
        // Queue-time errors abort with EXECABORT; run-time errors do not.
        let r = scripted(
            &mut p,
            &[
                (0, "MULTI"),
                (0, "SET a 1"),
                (0, "NOSUCHCMD x"),
                (0, "SET b 2"),
                (0, "EXEC"),
                (0, "MULTI"),
                (0, "SET a 1"),
                (0, "GET"),
                (0, "EXEC"),
                (0, "RPUSH lst x"),
                (0, "MULTI"),
                (0, "SET a 3"),
                (0, "INCR lst"),
                (0, "GET lst"),
                (0, "INCRBY a notanumber"),
                (0, "SET b 4"),
                (0, "EXEC"),
                (0, "MGET a b"),
            ],
        );
        assert_err_prefix(&r[4], "EXECABORT");
        assert_err_prefix(&r[8], "EXECABORT");
        // Control commands in odd places.
        scripted(
            &mut p,
            &[
                (0, "EXEC"),
                (0, "DISCARD"),
                (0, "MULTI"),
                (0, "MULTI"),
                (0, "WATCH a"),
                (0, "SET a 9"),
                (0, "EXEC"),
                (0, "MULTI"),
                (0, "SET a 10"),
                (0, "DISCARD"),
                (0, "GET a"),
                (0, "MULTI"),
                (0, "SELECT 2"),
                (0, "SET indb2 x"),
                (0, "EXEC"),
                (0, "GET indb2"),
                (0, "SELECT 0"),
                (0, "GET indb2"),
                (0, "MULTI"),
                (0, "SWAPDB 0 2"),
                (0, "FLUSHDB"),
                (0, "EXEC"),
                (0, "DBSIZE"),
                (0, "SWAPDB 0 2"),
                (0, "DBSIZE"),
            ],
        );
        p.compare_state();
    }
}

#[test]
fn error_replies_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, false, "error replies".into());
    scripted(
        &mut p,
        &[
            (0, "RPUSH lst a b"),
            (0, "SET s hello"),
            (0, "SET n 10"),
            // WRONGTYPE from every string command on a list.
            (0, "GET lst"),
            (0, "GETEX lst"),
            (0, "GETDEL lst"),
            (0, "GETSET lst x"),
            (0, "SET lst x GET"),
            (0, "INCR lst"),
            (0, "INCRBYFLOAT lst 1"),
            (0, "APPEND lst x"),
            (0, "STRLEN lst"),
            (0, "GETRANGE lst 0 1"),
            (0, "SETRANGE lst 0 x"),
            (0, "LCS lst s"),
            (0, "SETBIT lst 1 1"),
            (0, "GETBIT lst 1"),
            (0, "BITCOUNT lst"),
            (0, "BITPOS lst 1"),
            (0, "BITOP AND dst lst s"),
            (0, "BITFIELD lst GET u8 0"),
            (0, "BITFIELD_RO lst GET u8 0"),
            (0, "RPUSH s x"),
            (0, "MGET lst s n"),
            // Integer / float parsing.
            (0, "INCRBY n abc"),
            (0, "INCRBY n 1.5"),
            (0, "INCRBY n 99999999999999999999"),
            (0, "INCRBY s 1"),
            (0, "SET big 9223372036854775807"),
            (0, "INCR big"),
            (0, "DECRBY n -9223372036854775808"),
            (0, "SET small -9223372036854775808"),
            (0, "DECR small"),
            (0, "INCRBYFLOAT n abc"),
            (0, "INCRBYFLOAT s 1"),
            (0, "INCRBYFLOAT n inf"),
            (0, "INCRBYFLOAT n nan"),
            (0, "SET f 1e3"),
            (0, "INCRBYFLOAT f 0.5"),
            (0, "OBJECT ENCODING f"),
            (0, "SETBIT s -1 1"),
            (0, "SETBIT s 4294967296 1"),
            (0, "SETBIT s 1 2"),
            (0, "GETBIT s abc"),
            (0, "SETRANGE s -1 x"),
            (0, "SETRANGE s 1000000000000 x"),
            (0, "SETRANGE missing 1000000000000 "),
            (0, "GETRANGE s a b"),
            (0, "BITCOUNT s 0"),
            (0, "BITCOUNT s 0 1 FOO"),
            (0, "BITCOUNT s a b"),
            (0, "BITPOS s 2"),
            (0, "BITPOS s 1 a"),
            (0, "BITOP NOT dst s n"),
            (0, "BITOP FOO dst s"),
            (0, "BITFIELD s GET u64 0"),
            (0, "BITFIELD s GET i65 0"),
            (0, "BITFIELD s GET u8 -1"),
            (0, "BITFIELD s OVERFLOW FOO"),
            (0, "BITFIELD s INCRBY u8"),
            (0, "BITFIELD_RO s SET u8 0 1"),
            (0, "BITFIELD s OVERFLOW FAIL INCRBY u2 0 7 GET u2 0"),
            (
                0,
                "BITFIELD s OVERFLOW SAT INCRBY i8 0 -1000 OVERFLOW WRAP INCRBY i8 0 -1000",
            ),
            // Expiry options.
            (0, "EXPIRE n 100 NX XX"),
            (0, "EXPIRE n 100 GT LT"),
            (0, "EXPIRE n 100 NX GT"),
            (0, "EXPIRE n 100 FOO"),
            (0, "EXPIRE n abc"),
            (0, "EXPIRE n 9223372036854775807"),
            (0, "PEXPIRE n 9223372036854775807"),
            (0, "EXPIREAT n 9223372036854775807"),
            (0, "SET n 1 EX 0"),
            (0, "SET n 1 EX -1"),
            (0, "SET n 1 PX abc"),
            (0, "SET n 1 EX 9223372036854775807"),
            (0, "SET n 1 EX 10 PX 10"),
            (0, "SET n 1 NX XX"),
            (0, "SET n 1 KEEPTTL EX 10"),
            (0, "SET n 1 FOO"),
            (0, "SETEX n 0 v"),
            (0, "SETEX n abc v"),
            (0, "PSETEX n -5 v"),
            (0, "GETEX n EX 0"),
            (0, "GETEX n PERSIST EX 10"),
            (0, "GETEX n FOO"),
            // Keyspace.
            (0, "RENAME nosuch x"),
            (0, "RENAMENX nosuch x"),
            (0, "RENAME s s"),
            (0, "RENAMENX s s"),
            (0, "COPY s s"),
            (0, "COPY s t DB 99"),
            (0, "COPY s t DB abc"),
            (0, "COPY s t FOO"),
            (0, "MOVE s 0"),
            (0, "MOVE s 99"),
            (0, "MOVE s abc"),
            (0, "SELECT 16"),
            (0, "SELECT -1"),
            (0, "SELECT abc"),
            (0, "SWAPDB 0 99"),
            (0, "SWAPDB abc 0"),
            (0, "SWAPDB 99 abc"),
            (0, "OBJECT FOO s"),
            (0, "OBJECT ENCODING nosuch"),
            (0, "FLUSHDB FOO"),
            (0, "LCS s n LEN IDX"),
            (0, "LCS s n MINMATCHLEN abc"),
            (0, "LCS s n FOO"),
            (0, "MSET a"),
            (0, "MSET a 1 b"),
            (0, "MSETNX a 1 b"),
            // Unknown commands and arity (name case is echoed for unknown commands).
            (0, "FOOBAR"),
            (0, "FooBar a b c"),
            (0, "get"),
            (0, "GET a b"),
            (0, "Set a"),
            (0, "object"),
            (0, "object encoding"),
            (0, "KEYS"),
            (0, "DBSIZE x"),
            (0, "EXPIRETIME"),
            (0, "PING a b"),
            (0, "ECHO"),
        ],
    );
    // Long argument lists in unknown-command errors are truncated by Redis.
    let long: Vec<String> = std::iter::once("NOPE".to_string())
        .chain((0..20).map(|i| format!("arg{i}-{}", "x".repeat(150))))
        .collect();
    p.run_args(
        0,
        long.iter().map(|s| s.as_bytes().to_vec()).collect(),
        Check::Exact,
    );
    p.compare_state();
}

/// DEBUG OBJECT's `serializedlength` is the value's length in an RDB file (Redis's
/// `rdbSavedObjectLen`); the rest of its line (address, LRU clock) differs by nature.
#[test]
fn debug_object_serialized_length_matches_redis() {
    let kite = KiteServer::start(&[], 1);
    let redis = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let mut k = kite.client();
    let mut r = redis.client();
    let field = |reply: Resp| -> String {
        let text = reply.to_string();
        text.split_whitespace()
            .find_map(|w| w.strip_prefix("serializedlength:").map(str::to_string))
            .unwrap_or_else(|| panic!("no serializedlength in {text}"))
    };
    // No byte repeats, so nothing compresses: Kite's LZF finds other matches than Redis's
    // in a repetitive string, and both files are valid, but their lengths differ.
    let varied: String = (0..90u32)
        .map(|i| char::from(b'!' + (i * 7 % 90) as u8))
        .collect();
    for value in [
        "foo",
        "",
        "12345",
        "-7",
        "4294967296",
        "3.5",
        &varied[..20],
        &varied[..30],
        &varied[..31],
        &varied[..45],
        varied.as_str(),
    ] {
        assert_eq!(k.cmd(&["SET", "s", value]), Resp::ok());
        assert_eq!(r.cmd(&["SET", "s", value]), Resp::ok());
        assert_eq!(
            field(k.cmd(&["DEBUG", "OBJECT", "s"])),
            field(r.cmd(&["DEBUG", "OBJECT", "s"])),
            "SET s {value:?}"
        );
    }
}

#[test]
fn string_edge_cases_match_redis() {
    let kite = KiteServer::start(&[], 2);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, false, "string edge cases".into());
    scripted(
        &mut p,
        &[
            // Encodings: int, embstr (<= 44 bytes), raw.
            (0, "SET i 12345"),
            (0, "OBJECT ENCODING i"),
            (0, "SET i 010"),
            (0, "OBJECT ENCODING i"),
            (0, "SET i -0"),
            (0, "OBJECT ENCODING i"),
            (0, "SET i 9223372036854775807"),
            (0, "OBJECT ENCODING i"),
            (0, "SET i 9223372036854775808"),
            (0, "OBJECT ENCODING i"),
            (0, "SET e 12345678901234567890123456789012345678901234"),
            (0, "OBJECT ENCODING e"),
            (0, "SET e 123456789012345678901234567890123456789012345"),
            (0, "OBJECT ENCODING e"),
            (0, "SET e abc"),
            (0, "APPEND e d"),
            (0, "OBJECT ENCODING e"),
            (0, "APPEND fresh 123"),
            (0, "OBJECT ENCODING fresh"),
            (0, "INCR fresh"),
            (0, "OBJECT ENCODING fresh"),
            (0, "SETRANGE sr 3 x"),
            (0, "GET sr"),
            (0, "OBJECT ENCODING sr"),
            (0, "INCRBYFLOAT fl 10"),
            (0, "OBJECT ENCODING fl"),
            // Ranges.
            (0, "SET s Hello"),
            (0, "GETRANGE s 0 -1"),
            (0, "GETRANGE s -3 -1"),
            (0, "GETRANGE s 3 1"),
            (0, "GETRANGE s -100 100"),
            (0, "GETRANGE s 0 -100"),
            (0, "GETRANGE s 9223372036854775807 -9223372036854775808"),
            (0, "GETRANGE nosuch 0 -1"),
            (0, "SETRANGE s 10 !"),
            (0, "GET s"),
            (0, "SETRANGE nosuch 0 "),
            (0, "EXISTS nosuch"),
            (0, "SETRANGE s 0 "),
            // LCS.
            (0, "SET l1 ohmytext"),
            (0, "SET l2 mynewtext"),
            (0, "LCS l1 l2"),
            (0, "LCS l1 l2 LEN"),
            (0, "LCS l1 l2 IDX"),
            (0, "LCS l1 l2 IDX MINMATCHLEN 4 WITHMATCHLEN"),
            (0, "LCS l1 nosuch"),
            (0, "LCS nosuch1 nosuch2 IDX"),
            // Bits.
            (0, "SETBIT b 7 1"),
            (0, "SETBIT b 100 1"),
            (0, "GET b"),
            (0, "BITCOUNT b"),
            (0, "BITCOUNT b 0 0"),
            (0, "BITCOUNT b 0 10 BIT"),
            (0, "BITCOUNT b -1 -1 BYTE"),
            (0, "BITPOS b 1"),
            (0, "BITPOS b 0"),
            (0, "BITPOS b 1 1"),
            (0, "BITPOS b 1 1 -1 BIT"),
            (0, "SET ones \u{ff}\u{ff}"),
            (0, "BITPOS ones 0"),
            (0, "BITPOS ones 0 0 -1"),
            (0, "BITPOS nosuch 0"),
            (0, "BITPOS nosuch 1"),
            (0, "BITOP OR dest b ones"),
            (0, "GET dest"),
            (0, "BITOP AND dest b nosuch"),
            (0, "GET dest"),
            (0, "BITOP XOR dest nosuch1 nosuch2"),
            (0, "EXISTS dest"),
            (0, "BITOP NOT dest b"),
            (0, "GET dest"),
            (
                0,
                "BITFIELD bf SET i8 0 -100 GET u4 0 GET i8 0 INCRBY u2 #3 5",
            ),
            (
                0,
                "BITFIELD bf OVERFLOW SAT INCRBY u8 0 1000 INCRBY i16 #1 -70000",
            ),
            (0, "BITFIELD bf OVERFLOW FAIL SET i4 0 100 INCRBY u1 7 2"),
            (0, "BITFIELD bf GET i64 0 GET u63 1"),
            (0, "BITFIELD_RO bf GET u8 0 GET i16 #1"),
            (0, "BITFIELD bf"),
            (0, "BITFIELD nosuch GET u8 0"),
            (0, "EXISTS nosuch"),
            // SET variants.
            (0, "SET k v NX GET"),
            (0, "SET k v2 NX GET"),
            (0, "SET k v3 XX GET"),
            (0, "SET nokey v XX GET"),
            (0, "SET k v4 GET KEEPTTL"),
            (0, "SETNX k v5"),
            (0, "MSETNX k v a b"),
            (0, "MSETNX a b c d"),
            (0, "MSET a 1 a 2"),
            (0, "GET a"),
            (0, "GETDEL a"),
            (0, "GETDEL a"),
            (0, "MGET a k nosuch c"),
        ],
    );
    p.compare_state();
}

#[test]
fn expiry_edge_cases_match_redis() {
    let kite = KiteServer::start(&[], 2);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, false, "expiry edge cases".into());
    let tol = |p: &mut Pair, line: &str, t: i64| {
        let a: Args = line.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        p.run_args(0, a, Check::Tolerance(t));
    };
    let future = now_secs() + 100_000;
    let past = now_secs() - 100;
    scripted(
        &mut p,
        &[
            (0, "SET k v"),
            (0, "TTL k"),
            (0, "PTTL k"),
            (0, "EXPIRETIME k"),
            (0, "PEXPIRETIME k"),
            (0, "TTL nosuch"),
            (0, "EXPIRETIME nosuch"),
            (0, "PERSIST k"),
            (0, "EXPIRE k 1000 XX"),
            (0, "EXPIRE k 1000 GT"),
            (0, "EXPIRE k 1000 LT"),
            (0, "EXPIRE k 1000 NX"),
            (0, "EXPIRE k 2000 NX"),
            (0, "EXPIRE k 5000 GT"),
            (0, "EXPIRE k 500 GT"),
            (0, "EXPIRE k 300 LT"),
            (0, "EXPIRE k 9000 LT"),
            (0, "PERSIST k"),
            (0, "PERSIST k"),
            (0, "EXPIRE nosuch 100"),
            (0, "EXPIRE k 0"),
            (0, "EXISTS k"),
            (0, "SET k v"),
            (0, "PEXPIRE k -1"),
            (0, "EXISTS k"),
            (0, "SET k v"),
            (0, "GETEX k PERSIST"),
            (0, "SET k v EX 100"),
            (0, "SET k v2 KEEPTTL"),
            (0, "SET k v3"),
            (0, "TTL k"),
            (0, "SET k v EX 100"),
            (0, "GETSET k v2"),
            (0, "TTL k"),
            (0, "SETEX k 100 v"),
            (0, "APPEND k x"),
            (0, "INCR k"),
            (0, "SET c 1 EX 100"),
            (0, "INCR c"),
            (0, "RENAME c c2"),
            (0, "COPY c2 c3"),
            (0, "MOVE c3 1"),
            (0, "SELECT 1"),
            (0, "SELECT 0"),
            (0, "PEXPIREAT k 9223372036854775807"),
            (0, "EXPIRETIME k"),
            (0, "PEXPIRETIME k"),
        ],
    );
    for line in ["TTL k", "TTL c2", "TTL c3"] {
        tol(&mut p, line, 2);
    }
    tol(&mut p, "PTTL c2", 2000);
    let lines = [
        format!("EXPIREAT k {future}"),
        format!("EXPIREAT k {future} GT"),
        format!("EXPIREAT k {future} LT"),
        "EXPIRETIME k".to_string(),
        format!("PEXPIREAT k {}000", future + 1),
        "PEXPIRETIME k".to_string(),
        format!("SET k v EXAT {future}"),
        "EXPIRETIME k".to_string(),
        format!("SET k v PXAT {}123", future),
        "PEXPIRETIME k".to_string(),
        format!("GETEX k EXAT {past}"),
        "EXISTS k".to_string(),
        "SET k v".to_string(),
        format!("EXPIREAT k {past}"),
        "EXISTS k".to_string(),
        "SET k v".to_string(),
        format!("EXPIREAT k {past} NX"),
        "EXISTS k".to_string(),
        "SET k v".to_string(),
        format!("EXPIREAT k {past} XX"),
        "EXISTS k".to_string(),
        "SET k v".to_string(),
        format!("EXPIREAT k {past} GT"),
        "EXISTS k".to_string(),
    ];
    for l in &lines {
        p.run_args(
            0,
            l.split(' ').map(|s| s.as_bytes().to_vec()).collect(),
            Check::Exact,
        );
    }
    p.compare_state();
}

/// INCRBYFLOAT computes in `long double` and prints with 17 significant digits,
/// trimming trailing zeros: 0.1 + 0.2 is "0.3", not "0.30000000000000004".
#[test]
fn incrbyfloat_precision_matches_redis() {
    let kite = KiteServer::start(&[], 1);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, false, "INCRBYFLOAT precision".into());
    let mut lines: Vec<String> = vec!["SET f 0".into()];
    for _ in 0..10 {
        lines.push("INCRBYFLOAT f 0.1".into());
    }
    lines.extend(
        [
            "SET g 0.1",
            "INCRBYFLOAT g 0.2",
            "INCRBYFLOAT g -0.3",
            "SET g 10.50",
            "INCRBYFLOAT g 1.5",
            "INCRBYFLOAT g 3.0e3",
            "INCRBYFLOAT g -3012",
            "INCRBYFLOAT g 1e20",
            "INCRBYFLOAT g 1.23456789012345678",
            "SET g 9223372036854775807",
            "INCRBYFLOAT g 0",
            "INCRBYFLOAT g -2.75",
            "SET g 5",
            "INCRBYFLOAT g 0.0000001",
            "INCRBYFLOAT g -5",
            "INCRBYFLOAT g 1e-20",
            "SET g 3.14159",
            "INCRBYFLOAT g 0",
            "INCRBYFLOAT g 2.71828",
            "SET g 1e308",
            "INCRBYFLOAT g 1e308",
            "STRLEN g",
            "SET g .5",
            "INCRBYFLOAT g .25",
            "SET g 5.",
            "INCRBYFLOAT g 1",
            "INCRBYFLOAT nosuch 0.1",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    for l in &lines {
        p.run_args(
            0,
            l.split(' ').map(|s| s.as_bytes().to_vec()).collect(),
            Check::Exact,
        );
    }
    let mut c = kite.client();
    assert_eq!(c.cmd(&["GET", "f"]), Resp::bulk("1"), "0.1 added ten times");
}

#[test]
fn binary_and_hashtag_keys_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, true, "binary keys".into());
    let keys: Vec<Vec<u8>> = vec![
        b"\x00".to_vec(),
        b"\xff\xfe".to_vec(),
        b"a\r\nb".to_vec(),
        b"{}".to_vec(),
        b"{}x".to_vec(),
        b"{x}{y}".to_vec(),
        b"a{b".to_vec(),
        b"a}b{".to_vec(),
        b"{{x}}".to_vec(),
        b"".to_vec(),
        b" ".to_vec(),
        (0u8..=255).collect(),
    ];
    for (i, k) in keys.iter().enumerate() {
        p.run_args(
            0,
            args!["SET", k, format!("v{i}").into_bytes()],
            Check::Exact,
        );
    }
    let mut mget = args!["MGET"];
    mget.extend(keys.iter().cloned());
    p.run_args(0, mget, Check::Exact);
    p.run_args(0, args!["KEYS", "*"], Check::Sorted);
    p.run_args(0, args!["KEYS", "{*"], Check::Sorted);
    p.run_args(0, args!["DBSIZE"], Check::Exact);
    for w in keys.windows(2) {
        p.run_args(0, args!["RENAME", &w[0], &w[1]], Check::Exact);
    }
    p.compare_state();
}

// ---------------------------------------------------------------------------
// SCAN
// ---------------------------------------------------------------------------

fn scan_all(c: &mut Client, extra: &[&str]) -> HashSet<Vec<u8>> {
    let mut cursor = b"0".to_vec();
    let mut out = HashSet::new();
    for _ in 0..100_000 {
        let mut a: Args = args!["SCAN", &cursor];
        a.extend(extra.iter().map(|s| s.as_bytes().to_vec()));
        let r = c.cmd(&a);
        let parts = r
            .as_array()
            .unwrap_or_else(|| panic!("SCAN {} returned {r}", extra.join(" ")));
        assert_eq!(parts.len(), 2, "SCAN reply must be [cursor, keys], got {r}");
        cursor = parts[0]
            .as_bytes()
            .unwrap_or_else(|| panic!("SCAN cursor must be a bulk string, got {}", parts[0]))
            .to_vec();
        out.extend(bytes_set(&parts[1]));
        if cursor == b"0" {
            return out;
        }
    }
    panic!("SCAN {} did not finish in 100000 calls", extra.join(" "));
}

const KITE_HAS_ZSETS: bool = true;

#[test]
fn scan_returns_same_keys_as_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut k = kite.client();
    let mut r = redis.client();
    let mut setup: Vec<Args> = Vec::new();
    for i in 0..300 {
        setup.push(args!["SET", format!("user:{i}"), "v"]);
    }
    for i in 0..80 {
        setup.push(args!["RPUSH", format!("job:{i}"), "a", "b"]);
    }
    // Sorted sets come with the zset family; until then the zset TYPE filter compares
    // empty results.
    for i in 0..40 {
        setup.push(args!["HSET", format!("hash:{i}"), "f", "v"]);
        setup.push(args!["SADD", format!("set:{i}"), "m"]);
    }
    let typed_keys = if KITE_HAS_ZSETS { 40 } else { 0 };
    for i in 0..typed_keys {
        setup.push(args!["ZADD", format!("zset:{i}"), "1", "m"]);
    }
    for i in 0..30 {
        setup.push(args!["SET", format!("{{tag}}:{i}"), "v"]);
        setup.push(args!["SET", format!("bin\x00{i}\u{ff}"), "v"]);
    }
    setup.push(args!["SELECT", "1"]);
    for i in 0..50 {
        setup.push(args!["SET", format!("db1:{i}"), "v"]);
    }
    setup.push(args!["SELECT", "0"]);
    for c in [&mut k, &mut r] {
        assert_eq!(c.cmd(&["FLUSHALL"]), Resp::ok());
        for reply in c.pipeline(&setup) {
            assert!(!reply.is_error(), "setup failed: {reply}");
        }
    }
    let variants: &[&[&str]] = &[
        &[],
        &["COUNT", "1"],
        &["COUNT", "7"],
        &["COUNT", "1000"],
        &["MATCH", "user:*"],
        &["MATCH", "user:1*", "COUNT", "3"],
        &["MATCH", "*:?"],
        &["MATCH", "{tag}*"],
        &["MATCH", "bin*"],
        &["MATCH", "nomatch*"],
        &["TYPE", "string"],
        &["TYPE", "list", "COUNT", "5"],
        &["TYPE", "hash"],
        &["TYPE", "set"],
        &["TYPE", "zset"],
        &["TYPE", "stream"],
        &["TYPE", "nosuchtype"],
        &["MATCH", "job:*", "TYPE", "list", "COUNT", "20"],
        &["MATCH", "user:*", "TYPE", "list"],
    ];
    for v in variants {
        let ks = scan_all(&mut k, v);
        let rs = scan_all(&mut r, v);
        if ks != rs {
            let missing: Vec<String> = rs
                .difference(&ks)
                .take(10)
                .map(|b| escape_bytes(b))
                .collect();
            let extra: Vec<String> = ks
                .difference(&rs)
                .take(10)
                .map(|b| escape_bytes(b))
                .collect();
            panic!(
                "SCAN {:?}: kite returned {} keys, redis {}; missing in kite: {:?}; extra in kite: {:?}",
                v,
                ks.len(),
                rs.len(),
                missing,
                extra
            );
        }
    }
    // DB 1 is scanned separately.
    for c in [&mut k, &mut r] {
        assert_eq!(c.cmd(&["SELECT", "1"]), Resp::ok());
    }
    assert_eq!(
        scan_all(&mut k, &["COUNT", "3"]),
        scan_all(&mut r, &["COUNT", "3"])
    );
    // Errors.
    for bad in [
        args!["SCAN", "abc"],
        args!["SCAN", "0", "COUNT", "0"],
        args!["SCAN", "0", "COUNT", "abc"],
        args!["SCAN", "0", "MATCH"],
        args!["SCAN", "0", "FOO", "bar"],
        args!["SCAN"],
    ] {
        let kr = k.cmd(&bad);
        let rr = r.cmd(&bad);
        assert_eq!(kr, rr, "reply to {} differs (kite vs redis)", fmt_cmd(&bad));
    }
}
