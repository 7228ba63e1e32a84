//! HyperLogLog (PFADD, PFCOUNT, PFMERGE, PFDEBUG, PFSELFTEST) against a real redis-server.
//!
//! An HLL is a string whose bytes are the data structure, so Kite must produce the very
//! bytes Redis produces: the sparse opcodes, the promotion to the dense encoding (at
//! `hll-sparse-max-bytes`, or when a register exceeds 32), the 6-bit dense registers, and
//! the cardinality cached in the header (bytes 8..16, little endian, top bit of byte 15
//! set when stale) which PFCOUNT of one key writes back. Every test compares `GET key`
//! byte for byte with redis-server, not only the counts.
//!
//! Keys are picked by CRC16 slot so that, with `--threads 4`, the keys of one PFCOUNT or
//! PFMERGE sit on different shards.
//!
//! Reproduce one seed: `KITE_HLL_SEEDS=7 cargo test --test hll random_sets`.

#[macro_use]
mod common;

use common::*;
use std::collections::VecDeque;

// ---------------------------------------------------------------------------------------
// Kite and redis-server side by side
// ---------------------------------------------------------------------------------------

struct Pair {
    kite: Client,
    redis: Client,
    label: String,
    count: usize,
    history: VecDeque<String>,
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
    let mut s = r.to_string();
    if s.len() > 400 {
        let mut cut = 400;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str(&format!("... ({} bytes encoded)", r.encode().len()));
    }
    s
}

impl Pair {
    fn new(kite: &ServerProcess, redis: &ServerProcess, label: String) -> Pair {
        let mut p = Pair {
            kite: kite.client(),
            redis: redis.client(),
            label,
            count: 0,
            history: VecDeque::new(),
        };
        assert_eq!(p.kite.cmd(&["FLUSHALL"]), Resp::ok());
        assert_eq!(p.redis.cmd(&["FLUSHALL"]), Resp::ok());
        p
    }

    fn fail(&self, args: &[Vec<u8>], kite: &Resp, redis: &Resp) -> ! {
        let hist: Vec<String> = self.history.iter().cloned().collect();
        let first_diff = match (kite.as_bytes(), redis.as_bytes()) {
            (Some(a), Some(b)) => {
                let at = a.iter().zip(b).position(|(x, y)| x != y);
                format!(
                    "\n  byte strings of {} (kite) and {} (redis) bytes; first difference at {:?}",
                    a.len(),
                    b.len(),
                    at
                )
            }
            _ => String::new(),
        };
        panic!(
            "\nHLL MISMATCH ({})\n  command #{}: {}\n  kite:  {}\n  redis: {}{}\n\
             last commands (oldest first):\n    {}\n",
            self.label,
            self.count,
            cmd_text(args),
            short(kite),
            short(redis),
            first_diff,
            hist.join("\n    ")
        );
    }

    fn both(&mut self, args: &[Vec<u8>]) -> (Resp, Resp) {
        self.kite.send(args);
        self.redis.send(args);
        let k = self.kite.try_read();
        let r = self.redis.try_read();
        let (k, r) = match (k, r) {
            (Ok(k), Ok(r)) => (k, r),
            (k, r) => {
                let show = |x: std::io::Result<Resp>| match x {
                    Ok(v) => v,
                    Err(e) => Resp::Error(format!("<no reply: {e}>")),
                };
                self.fail(args, &show(k), &show(r))
            }
        };
        let line = clip(
            format!(
                "#{} {} -> {}",
                self.count,
                clip(fmt_cmd(args), 160),
                short(&r)
            ),
            400,
        );
        self.history.push_back(line);
        if self.history.len() > 25 {
            self.history.pop_front();
        }
        self.count += 1;
        (k, r)
    }

    /// Runs on both; the replies must be identical. Returns Redis's.
    fn same(&mut self, args: Vec<Vec<u8>>) -> Resp {
        let (k, r) = self.both(&args);
        if k != r {
            self.fail(&args, &k, &r);
        }
        r
    }

    /// SETs the same bytes on both.
    fn set(&mut self, key: &str, value: &[u8]) {
        let r = self.same(args!["SET", key, value]);
        assert_eq!(r, Resp::ok());
    }
}

fn err(text: &str) -> Resp {
    Resp::Error(text.to_string())
}

const NOT_HLL: &str = "WRONGTYPE Key is not a valid HyperLogLog string value.";
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const CORRUPT: &str = "INVALIDOBJ Corrupted HLL object detected";

// ---------------------------------------------------------------------------------------
// Building HLL strings by hand
// ---------------------------------------------------------------------------------------

const REGISTERS: usize = 16384;
const DENSE_SIZE: usize = 16 + REGISTERS * 6 / 8;

/// The 16-byte header: "HYLL", encoding (0 dense, 1 sparse), three unused bytes and the
/// cached cardinality (`None`: stale, top bit of the last byte set).
fn header(encoding: u8, cached: Option<u64>) -> Vec<u8> {
    let mut h = b"HYLL".to_vec();
    h.push(encoding);
    h.extend_from_slice(&[0, 0, 0]);
    match cached {
        Some(c) => h.extend_from_slice(&c.to_le_bytes()),
        None => h.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0x80]),
    }
    h
}

/// A dense HLL with the given 6-bit registers, packed least significant bit first.
fn dense(regs: &[u8], cached: Option<u64>) -> Vec<u8> {
    assert_eq!(regs.len(), REGISTERS);
    let mut out = header(0, cached);
    let mut bits = vec![0u8; REGISTERS * 6 / 8];
    for (i, &v) in regs.iter().enumerate() {
        assert!(v < 64);
        for b in 0..6 {
            if v & (1 << b) != 0 {
                let pos = i * 6 + b;
                bits[pos / 8] |= 1 << (pos % 8);
            }
        }
    }
    out.extend_from_slice(&bits);
    assert_eq!(out.len(), DENSE_SIZE);
    out
}

/// Sparse opcodes: ZERO (00xxxxxx, 1..=64 registers), XZERO (01xxxxxx yyyyyyyy,
/// 1..=16384), VAL (1vvvvvxx, value 1..=32, 1..=4 registers).
#[derive(Clone, Copy, Debug)]
enum Op {
    Zero(usize),
    XZero(usize),
    Val(u8, usize),
}

fn sparse(ops: &[Op], cached: Option<u64>) -> Vec<u8> {
    let mut out = header(1, cached);
    for op in ops {
        match *op {
            Op::Zero(n) => {
                assert!((1..=64).contains(&n));
                out.push((n - 1) as u8);
            }
            Op::XZero(n) => {
                assert!((1..=16384).contains(&n));
                let l = n - 1;
                out.push(0x40 | (l >> 8) as u8);
                out.push((l & 0xff) as u8);
            }
            Op::Val(v, n) => {
                assert!((1..=32).contains(&v) && (1..=4).contains(&n));
                out.push(0x80 | ((v - 1) << 2) | (n - 1) as u8);
            }
        }
    }
    out
}

/// Registers covered by a list of opcodes.
fn covered(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| match *op {
            Op::Zero(n) | Op::XZero(n) | Op::Val(_, n) => n,
        })
        .sum()
}

/// A valid but not canonical sparse encoding: random runs, zeros split or written long
/// where a short form would do, covering exactly 16384 registers.
fn random_sparse_ops(rng: &mut Rng) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut left = REGISTERS;
    while left > 0 {
        let op = match rng.below(10) {
            0..=3 => Op::Zero(rng.range(1, 64.min(left as i64)) as usize),
            4..=5 => Op::XZero(rng.range(1, 3000.min(left as i64)) as usize),
            _ => Op::Val(
                rng.range(1, 32) as u8,
                rng.range(1, 4.min(left as i64)) as usize,
            ),
        };
        left -= covered(&[op]);
        ops.push(op);
    }
    assert_eq!(covered(&ops), REGISTERS);
    ops
}

/// An element for PFADD: random bytes (binary, empty included).
fn element(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(10) {
        0 => 0,
        1..=6 => rng.range(1, 12) as usize,
        _ => rng.range(13, 64) as usize,
    };
    rng.bytes(len)
}

// ---------------------------------------------------------------------------------------
// Scripted cases
// ---------------------------------------------------------------------------------------

fn basics(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, format!("basics, {}", kite.name));
    let k = spread_keys("pf", 8);
    let (a, b, c, d) = (&k[0], &k[1], &k[2], &k[3]);
    // PFADD creates the key even with no elements, and answers 1 only when a register
    // changed (or the key was made).
    assert_eq!(p.same(args!["PFADD", a.as_str()]), Resp::Integer(1));
    assert_eq!(p.same(args!["PFADD", a.as_str()]), Resp::Integer(0));
    assert_eq!(p.same(args!["TYPE", a.as_str()]), Resp::simple("string"));
    p.same(args!["GET", a.as_str()]);
    p.same(args!["STRLEN", a.as_str()]);
    assert_eq!(p.same(args!["PFCOUNT", a.as_str()]), Resp::Integer(0));
    assert_eq!(
        p.same(args!["PFADD", a.as_str(), "x", "y", "z"]),
        Resp::Integer(1)
    );
    assert_eq!(
        p.same(args!["PFADD", a.as_str(), "x", "y"]),
        Resp::Integer(0)
    );
    assert_eq!(p.same(args!["PFADD", a.as_str(), ""]), Resp::Integer(1));
    p.same(args!["GET", a.as_str()]);
    assert_eq!(p.same(args!["PFCOUNT", a.as_str()]), Resp::Integer(4));
    p.same(args!["GET", a.as_str()]);
    assert_eq!(
        p.same(args!["PFADD", b.as_str(), "a", "b", "c"]),
        Resp::Integer(1)
    );
    p.same(args!["GET", b.as_str()]);
    // Several keys (on different shards at --threads 4): the union, missing keys empty.
    assert_eq!(
        p.same(args!["PFCOUNT", a.as_str(), b.as_str(), "nokey"]),
        Resp::Integer(7)
    );
    assert_eq!(
        p.same(args!["PFCOUNT", "nokey", "nokey2"]),
        Resp::Integer(0)
    );
    assert_eq!(
        p.same(args!["PFCOUNT", a.as_str(), a.as_str()]),
        Resp::Integer(4)
    );
    // PFCOUNT of several keys writes no cache.
    p.same(args!["PFADD", b.as_str(), "d"]);
    p.same(args!["PFCOUNT", a.as_str(), b.as_str()]);
    p.same(args!["GET", b.as_str()]);
    // PFMERGE: new destination, existing destination (part of the union), missing
    // sources, no sources at all.
    assert_eq!(
        p.same(args![
            "PFMERGE",
            c.as_str(),
            a.as_str(),
            b.as_str(),
            "nokey"
        ]),
        Resp::ok()
    );
    p.same(args!["GET", c.as_str()]);
    assert_eq!(p.same(args!["PFCOUNT", c.as_str()]), Resp::Integer(8));
    p.same(args!["GET", c.as_str()]);
    p.same(args!["PFADD", d.as_str(), "q"]);
    assert_eq!(p.same(args!["PFMERGE", d.as_str(), a.as_str()]), Resp::ok());
    p.same(args!["GET", d.as_str()]);
    assert_eq!(p.same(args!["PFCOUNT", d.as_str()]), Resp::Integer(5));
    assert_eq!(p.same(args!["PFMERGE", "{new}1", "nokey"]), Resp::ok());
    assert_eq!(p.same(args!["EXISTS", "{new}1"]), Resp::Integer(1));
    p.same(args!["GET", "{new}1"]);
    assert_eq!(p.same(args!["PFMERGE", "{new}2"]), Resp::ok());
    p.same(args!["GET", "{new}2"]);
    // A PFMERGE into itself only invalidates the cache.
    p.same(args!["PFCOUNT", d.as_str()]);
    p.same(args!["PFMERGE", d.as_str()]);
    p.same(args!["GET", d.as_str()]);
    p.same(args!["PFMERGE", d.as_str(), "nokey"]);
    p.same(args!["GET", d.as_str()]);

    // Wrong types: strings that are not HLLs, and other types.
    p.same(args!["SET", "str", "hello"]);
    p.same(args!["SET", "int", "12345"]);
    p.same(args!["RPUSH", "list", "a"]);
    p.same(args!["SET", "short", "HYLL"]);
    p.set(
        "magic",
        b"XYLL\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x7f\xff",
    );
    p.set(
        "enc2",
        b"HYLL\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x7f\xff",
    );
    p.set(
        "enc255",
        b"HYLL\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x7f\xff",
    );
    // A dense header with the wrong length.
    p.set("shortdense", &header(0, None));
    let mut long_dense = dense(&[0; REGISTERS], None);
    long_dense.push(0);
    p.set("longdense", &long_dense);
    for key in [
        "str",
        "int",
        "short",
        "magic",
        "enc2",
        "enc255",
        "shortdense",
        "longdense",
    ] {
        assert_eq!(p.same(args!["PFADD", key, "x"]), err(NOT_HLL), "{key}");
        assert_eq!(p.same(args!["PFADD", key]), err(NOT_HLL), "{key}");
        assert_eq!(p.same(args!["PFCOUNT", key]), err(NOT_HLL), "{key}");
        assert_eq!(p.same(args!["PFCOUNT", a.as_str(), key]), err(NOT_HLL));
        assert_eq!(p.same(args!["PFMERGE", "dst", key]), err(NOT_HLL));
        assert_eq!(p.same(args!["PFMERGE", key, a.as_str()]), err(NOT_HLL));
        assert_eq!(p.same(args!["PFDEBUG", "ENCODING", key]), err(NOT_HLL));
        p.same(args!["GET", key]);
        // A refused PFADD leaves the string as it was: "embstr" stays "embstr".
        p.same(args!["OBJECT", "ENCODING", key]);
    }
    assert_eq!(p.same(args!["EXISTS", "dst"]), Resp::Integer(0));
    assert_eq!(p.same(args!["PFADD", "list", "x"]), err(WRONGTYPE));
    assert_eq!(p.same(args!["PFCOUNT", "list"]), err(WRONGTYPE));
    assert_eq!(p.same(args!["PFCOUNT", a.as_str(), "list"]), err(WRONGTYPE));
    assert_eq!(
        p.same(args!["PFMERGE", "dst", a.as_str(), "list"]),
        err(WRONGTYPE)
    );
    assert_eq!(p.same(args!["PFMERGE", "list", a.as_str()]), err(WRONGTYPE));
    assert_eq!(p.same(args!["EXISTS", "dst"]), Resp::Integer(0));

    // Corrupted sparse HLLs: header fine, opcodes not covering 16384 registers, or no
    // opcodes at all.
    let good = p
        .same(args!["GET", b.as_str()])
        .as_bytes()
        .unwrap()
        .to_vec();
    p.set("trunc", &good[..good.len() - 2]);
    p.set("noops", &header(1, None));
    for key in ["trunc", "noops"] {
        assert_eq!(p.same(args!["PFCOUNT", key]), err(CORRUPT), "{key}");
        assert_eq!(p.same(args!["PFCOUNT", key, a.as_str()]), err(CORRUPT));
        assert_eq!(p.same(args!["PFCOUNT", a.as_str(), key]), err(CORRUPT));
        assert_eq!(p.same(args!["PFMERGE", "dst", key]), err(CORRUPT));
        assert_eq!(p.same(args!["PFDEBUG", "GETREG", key]), err(CORRUPT));
        p.same(args!["GET", key]);
    }
    assert_eq!(p.same(args!["PFADD", "noops", "a"]), err(CORRUPT));
    assert_eq!(p.same(args!["EXISTS", "dst"]), Resp::Integer(0));
    // A cached cardinality is trusted as it is, even when it is wrong.
    p.set("noops_cached", &header(1, Some(77)));
    assert_eq!(p.same(args!["PFCOUNT", "noops_cached"]), Resp::Integer(77));

    // Arity.
    for cmd in [
        args!["PFADD"],
        args!["PFCOUNT"],
        args!["PFMERGE"],
        args!["PFDEBUG"],
        args!["PFDEBUG", "GETREG"],
        args!["PFSELFTEST", "x"],
    ] {
        let r = p.same(cmd);
        assert!(r.is_error(), "{r}");
    }
    // Inside MULTI.
    p.same(args!["MULTI"]);
    p.same(args!["PFADD", "{t}h", "a", "b"]);
    p.same(args!["PFCOUNT", "{t}h"]);
    p.same(args!["GET", "{t}h"]);
    p.same(args!["PFMERGE", "{t}m", "{t}h"]);
    p.same(args!["GET", "{t}m"]);
    p.same(args!["EXEC"]);
}

#[test]
fn basics_match_redis_threads1() {
    basics(1);
}

#[test]
fn basics_match_redis_threads4() {
    basics(4);
}

#[test]
fn pfdebug_and_pfselftest_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, format!("pfdebug, {}", kite.name));
    assert_eq!(p.same(args!["PFSELFTEST"]), Resp::ok());
    p.same(args!["PFADD", "e"]);
    assert_eq!(
        p.same(args!["PFDEBUG", "ENCODING", "e"]),
        Resp::simple("sparse")
    );
    assert_eq!(
        p.same(args!["PFDEBUG", "DECODE", "e"]),
        Resp::bulk("Z:16384")
    );
    p.same(args!["PFADD", "h", "a", "b", "c"]);
    assert_eq!(
        p.same(args!["PFDEBUG", "DECODE", "h"]),
        Resp::bulk("Z:8436 v:1,1 Z:4274 v:2,1 Z:3068 v:1,1 Z:603")
    );
    assert_eq!(
        p.same(args!["pfdebug", "encoding", "h"]),
        Resp::simple("sparse")
    );
    // GETREG answers the 16384 registers and leaves the key dense.
    let regs = p.same(args!["PFDEBUG", "GETREG", "h"]);
    assert_eq!(regs.as_array().map(|v| v.len()), Some(REGISTERS));
    assert_eq!(
        p.same(args!["PFDEBUG", "ENCODING", "h"]),
        Resp::simple("dense")
    );
    p.same(args!["GET", "h"]);
    assert_eq!(p.same(args!["PFDEBUG", "TODENSE", "h"]), Resp::Integer(0));
    assert_eq!(
        p.same(args!["PFDEBUG", "DECODE", "h"]),
        err("ERR HLL encoding is not sparse")
    );
    // TODENSE converts a sparse HLL and says so.
    p.same(args!["PFADD", "h2", "a", "b", "c", "d"]);
    assert_eq!(p.same(args!["PFDEBUG", "TODENSE", "h2"]), Resp::Integer(1));
    assert_eq!(
        p.same(args!["PFDEBUG", "ENCODING", "h2"]),
        Resp::simple("dense")
    );
    assert_eq!(
        p.same(args!["STRLEN", "h2"]),
        Resp::Integer(DENSE_SIZE as i64)
    );
    p.same(args!["GET", "h2"]);
    p.same(args!["PFDEBUG", "GETREG", "h2"]);
    assert_eq!(p.same(args!["PFCOUNT", "h2"]), Resp::Integer(4));
    p.same(args!["GET", "h2"]);
    // A bigger sparse HLL decodes the same.
    let elems: Vec<String> = (0..300).map(|i| format!("e{i}")).collect();
    let mut a = args!["PFADD", "h3"];
    a.extend(elems.iter().map(|e| e.as_bytes().to_vec()));
    p.same(a);
    p.same(args!["PFDEBUG", "DECODE", "h3"]);
    p.same(args!["PFDEBUG", "GETREG", "h3"]);
    // Errors.
    assert_eq!(
        p.same(args!["PFDEBUG", "GETREG", "nokey"]),
        err("ERR The specified key does not exist")
    );
    assert_eq!(
        p.same(args!["PFDEBUG", "FOO", "h"]),
        err("ERR Unknown PFDEBUG subcommand 'FOO'")
    );
    assert_eq!(
        p.same(args!["PFDEBUG", "GETREG", "h", "x"]),
        err("ERR wrong number of arguments for 'pfdebug' command")
    );
    p.same(args!["SET", "s", "x"]);
    assert_eq!(p.same(args!["PFDEBUG", "ENCODING", "s"]), err(NOT_HLL));
    p.same(args!["LPUSH", "l", "x"]);
    assert_eq!(p.same(args!["PFDEBUG", "ENCODING", "l"]), err(WRONGTYPE));
    assert_eq!(
        p.same(args!["PFSELFTEST", "x"]),
        err("ERR wrong number of arguments for 'pfselftest' command")
    );
    assert_eq!(p.same(args!["PFSELFTEST"]), Resp::ok());
}

// ---------------------------------------------------------------------------------------
// The random differential
// ---------------------------------------------------------------------------------------

fn random_seed(kite: &KiteServer, redis: &RedisServer, seed: u64) {
    let label = format!(
        "seed {seed}, {} vs redis-server; reproduce: KITE_HLL_SEEDS={seed} cargo test --test hll random_sets",
        kite.name
    );
    let mut p = Pair::new(kite, redis, label);
    let mut rng = Rng::new(seed);
    let keys = spread_keys(&format!("hll{seed}:"), 8);
    let merge_keys = spread_keys(&format!("merged{seed}:"), 4);
    let mut sizes = vec![
        0usize, 1, 5, 40, 300, 900, 1500, 2200, 3000, 6000, 12000, 20000,
    ];
    rng.shuffle(&mut sizes);
    let targets: Vec<usize> = sizes[..keys.len()].to_vec();
    let mut added = vec![0usize; keys.len()];
    let mut recent: Vec<Vec<Vec<u8>>> = vec![Vec::new(); keys.len()];
    for (i, key) in keys.iter().enumerate() {
        if targets[i] == 0 {
            assert_eq!(p.same(args!["PFADD", key.as_str()]), Resp::Integer(1));
        }
    }
    let all_keys = |rng: &mut Rng, keys: &[String], merge_keys: &[String]| -> String {
        match rng.below(10) {
            0 => "absent".to_string(),
            1..=2 => rng.pick(merge_keys).clone(),
            _ => rng.pick(keys).clone(),
        }
    };
    loop {
        let open: Vec<usize> = (0..keys.len()).filter(|&i| added[i] < targets[i]).collect();
        if open.is_empty() {
            break;
        }
        let i = *rng.pick(&open);
        let key = keys[i].as_str();
        let left = targets[i] - added[i];
        let batch = match rng.below(4) {
            0 => 1,
            1 => rng.range(1, 20) as usize,
            _ => rng.range(1, 1500) as usize,
        }
        .min(left);
        let mut a = args!["PFADD", key];
        for _ in 0..batch {
            let e = if !recent[i].is_empty() && rng.chance(5) {
                rng.pick(&recent[i]).clone()
            } else {
                element(&mut rng)
            };
            if recent[i].len() < 64 {
                recent[i].push(e.clone());
            } else {
                let j = rng.index(64);
                recent[i][j] = e.clone();
            }
            a.push(e);
        }
        added[i] += batch;
        p.same(a);
        if rng.chance(40) {
            p.same(args!["GET", key]);
        }
        if rng.chance(25) {
            p.same(args!["PFCOUNT", key]);
            p.same(args!["GET", key]);
        }
        if rng.chance(10) {
            p.same(args!["PFDEBUG", "ENCODING", key]);
        }
        if rng.chance(12) {
            let n = rng.range(2, 5);
            let mut a = args!["PFCOUNT"];
            for _ in 0..n {
                a.push(all_keys(&mut rng, &keys, &merge_keys).into_bytes());
            }
            p.same(a);
        }
        if rng.chance(10) {
            let dest = all_keys(&mut rng, &keys, &merge_keys);
            let n = rng.range(0, 4);
            let mut a = args!["PFMERGE", dest.as_str()];
            for _ in 0..n {
                a.push(all_keys(&mut rng, &keys, &merge_keys).into_bytes());
            }
            p.same(a);
            p.same(args!["GET", dest.as_str()]);
            if rng.chance(50) {
                p.same(args!["PFCOUNT", dest.as_str()]);
                p.same(args!["GET", dest.as_str()]);
            }
        }
        if rng.chance(2) {
            // GETREG turns a sparse HLL dense on both sides.
            p.same(args!["PFDEBUG", "GETREG", key]);
        }
    }
    // Everything once more, key by key.
    for key in keys.iter().chain(merge_keys.iter()) {
        let key = key.as_str();
        p.same(args!["GET", key]);
        p.same(args!["PFCOUNT", key]);
        p.same(args!["GET", key]);
        p.same(args!["PFDEBUG", "ENCODING", key]);
        p.same(args!["STRLEN", key]);
    }
    // The union of all, into a fresh key and into the smallest sparse one (its
    // promotion to dense happens in the middle of the merge).
    let mut a = args!["PFMERGE", format!("union{seed}")];
    a.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
    p.same(a);
    p.same(args!["GET", format!("union{seed}")]);
    p.same(args!["PFCOUNT", format!("union{seed}")]);
    let mut a = args!["PFCOUNT"];
    a.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
    p.same(a);
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| targets[i]);
    let small = keys[order[1]].clone();
    for &i in &order[2..] {
        if targets[i] > 3000 {
            break;
        }
        p.same(args!["PFMERGE", small.as_str(), keys[i].as_str()]);
        p.same(args!["PFDEBUG", "ENCODING", small.as_str()]);
        p.same(args!["GET", small.as_str()]);
    }
}

fn random_sets(threads: usize, seeds: &[u64]) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    for seed in seeds_from_env("KITE_HLL_SEEDS", seeds) {
        random_seed(&kite, &redis, seed);
    }
}

#[test]
fn random_sets_byte_exact_threads1() {
    random_sets(1, &[1, 2]);
}

#[test]
fn random_sets_byte_exact_threads4() {
    random_sets(4, &[41, 42]);
}

/// PFCOUNT and PFMERGE over dozens of keys spread over every shard (and some missing).
#[test]
fn many_keys_across_shards_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, format!("many keys, {}", kite.name));
    let mut rng = Rng::new(17);
    let keys = spread_keys("many:", 48);
    for key in &keys {
        let mut a = args!["PFADD", key.as_str()];
        for _ in 0..rng.range(0, 120) {
            a.push(element(&mut rng));
        }
        p.same(a);
    }
    let mut all = args!["PFCOUNT"];
    all.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
    all.push(b"many:missing".to_vec());
    p.same(all);
    for _ in 0..20 {
        let mut a = args!["PFCOUNT"];
        for _ in 0..rng.range(2, 12) {
            a.push(rng.pick(&keys).as_bytes().to_vec());
        }
        p.same(a);
    }
    for round in 0..6 {
        let dest = if round % 2 == 0 {
            format!("many:dest{round}")
        } else {
            rng.pick(&keys).clone()
        };
        let mut a = args!["PFMERGE", dest.as_str()];
        for _ in 0..rng.range(1, 30) {
            a.push(rng.pick(&keys).as_bytes().to_vec());
        }
        p.same(a);
        p.same(args!["GET", dest.as_str()]);
        p.same(args!["PFCOUNT", dest.as_str()]);
        p.same(args!["GET", dest.as_str()]);
    }
    let mut a = args!["PFMERGE", "many:everything"];
    a.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
    p.same(a);
    p.same(args!["GET", "many:everything"]);
    p.same(args!["PFCOUNT", "many:everything"]);
}

/// Many small HLLs merged into one sparse destination: each register written one by
/// one, the destination promoted to dense the moment it passes hll-sparse-max-bytes.
#[test]
fn sparse_merges_promote_like_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, format!("sparse merges, {}", kite.name));
    let mut rng = Rng::new(5);
    let keys = spread_keys("small", 12);
    for key in &keys {
        let mut a = args!["PFADD", key.as_str()];
        for _ in 0..rng.range(100, 400) {
            a.push(element(&mut rng));
        }
        p.same(a);
        assert_eq!(
            p.same(args!["PFDEBUG", "ENCODING", key.as_str()]),
            Resp::simple("sparse")
        );
    }
    let mut promoted = false;
    for key in &keys[1..] {
        p.same(args!["PFMERGE", keys[0].as_str(), key.as_str()]);
        p.same(args!["GET", keys[0].as_str()]);
        let enc = p.same(args!["PFDEBUG", "ENCODING", keys[0].as_str()]);
        promoted |= enc == Resp::simple("dense");
    }
    assert!(
        promoted,
        "the merges should have passed hll-sparse-max-bytes"
    );
    p.same(args!["PFCOUNT", keys[0].as_str()]);
    p.same(args!["GET", keys[0].as_str()]);
    // Several at once into a new key on yet another shard.
    let mut a = args!["PFMERGE", "dest"];
    a.extend(keys[1..6].iter().map(|k| k.as_bytes().to_vec()));
    p.same(a);
    p.same(args!["GET", "dest"]);
    p.same(args!["PFDEBUG", "ENCODING", "dest"]);
}

// ---------------------------------------------------------------------------------------
// Hand-made encodings
// ---------------------------------------------------------------------------------------

/// Random dense register sets (every value up to 63): PFCOUNT's estimate, the cache it
/// writes, GETREG, merges and PFADD on top, all as Redis computes them.
#[test]
fn crafted_dense_registers_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, format!("crafted dense, {}", kite.name));
    let mut rng = Rng::new(11);
    let keys = spread_keys("dense", 12);
    for (n, key) in keys.iter().enumerate() {
        let regs: Vec<u8> = (0..REGISTERS)
            .map(|_| match n {
                0 => 0,
                1 => rng.range(0, 62) as u8,
                2 => (rng.chance(1) as u8) * rng.range(1, 40) as u8,
                3 => 1,
                4 => 20,
                5 => 40,
                _ => {
                    // Roughly what 2^n distinct elements leave: a geometric tail on top
                    // of a base that grows with n.
                    let base = (n as i64 - 6) * 3;
                    let mut v = base;
                    while v < 62 && rng.chance(50) {
                        v += 1;
                    }
                    if rng.chance(10) {
                        v = (v - rng.range(0, base.max(0))).max(0);
                    }
                    v as u8
                }
            })
            .collect();
        let payload = dense(&regs, None);
        p.set(key, &payload);
        p.same(args!["PFCOUNT", key.as_str()]);
        p.same(args!["GET", key.as_str()]);
        let got = p.same(args!["PFDEBUG", "GETREG", key.as_str()]);
        let want: Vec<Resp> = regs.iter().map(|&v| Resp::Integer(v as i64)).collect();
        assert_eq!(got, Resp::Array(want), "GETREG of {key}");
        p.same(args!["PFCOUNT", key.as_str(), keys[0].as_str()]);
    }
    for w in keys.windows(3) {
        p.same(args![
            "PFCOUNT",
            w[0].as_str(),
            w[1].as_str(),
            w[2].as_str()
        ]);
        p.same(args![
            "PFMERGE",
            "m",
            w[0].as_str(),
            w[1].as_str(),
            w[2].as_str()
        ]);
        p.same(args!["GET", "m"]);
        p.same(args!["PFCOUNT", "m"]);
    }
    // PFADD on dense registers with high values.
    for key in &keys {
        let mut a = args!["PFADD", key.as_str()];
        for _ in 0..200 {
            a.push(element(&mut rng));
        }
        p.same(a);
        p.same(args!["GET", key.as_str()]);
        p.same(args!["PFCOUNT", key.as_str()]);
    }
}

/// Every register at 63 makes the estimator's sum underflow to an infinite estimate,
/// which Redis (x86-64) turns into i64::MIN; the cache then holds a value with its top bit
/// set, so it reads as stale and is computed again each time.
#[test]
fn saturated_registers_count_like_redis() {
    let kite = KiteServer::start(&[], 1);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, format!("saturated, {}", kite.name));
    p.set("full", &dense(&[63; REGISTERS], None));
    assert_eq!(p.same(args!["PFCOUNT", "full"]), Resp::Integer(i64::MIN));
    p.same(args!["GET", "full"]);
    assert_eq!(p.same(args!["PFCOUNT", "full"]), Resp::Integer(i64::MIN));
    p.same(args!["PFADD", "e"]);
    assert_eq!(
        p.same(args!["PFCOUNT", "full", "e"]),
        Resp::Integer(i64::MIN)
    );
    assert_eq!(p.same(args!["PFADD", "full", "x"]), Resp::Integer(0));
    p.same(args!["PFMERGE", "e", "full"]);
    p.same(args!["GET", "e"]);
    assert_eq!(
        p.same(args!["PFDEBUG", "ENCODING", "e"]),
        Resp::simple("dense")
    );
}

/// Sparse strings Redis would not write itself (runs split, XZERO for short runs) are
/// valid: Redis reads them, and PFADD edits them in place the way hllSparseSet does.
#[test]
fn noncanonical_sparse_match_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, format!("noncanonical sparse, {}", kite.name));
    let mut rng = Rng::new(23);
    let mut cases: Vec<Vec<Op>> = vec![
        vec![Op::XZero(REGISTERS)],
        vec![Op::Zero(64); REGISTERS / 64],
        {
            let mut v = vec![Op::XZero(100), Op::Val(3, 4), Op::Val(3, 4)];
            v.push(Op::XZero(REGISTERS - 108));
            v
        },
        {
            let mut v = Vec::new();
            for _ in 0..REGISTERS / 4 {
                v.push(Op::Val(1, 4));
            }
            v
        },
    ];
    for _ in 0..8 {
        cases.push(random_sparse_ops(&mut rng));
    }
    let keys = spread_keys("ncs", cases.len());
    for (ops, key) in cases.iter().zip(&keys) {
        let key = key.as_str();
        p.set(key, &sparse(ops, None));
        p.same(args!["PFDEBUG", "DECODE", key]);
        p.same(args!["PFCOUNT", key]);
        p.same(args!["GET", key]);
        for round in 0..6 {
            let mut a = args!["PFADD", key];
            for _ in 0..(1 << round) {
                a.push(element(&mut rng));
            }
            p.same(a);
            p.same(args!["GET", key]);
            p.same(args!["PFDEBUG", "ENCODING", key]);
        }
        p.same(args!["PFCOUNT", key]);
        p.same(args!["PFMERGE", "{x}dst", key]);
        p.same(args!["GET", "{x}dst"]);
        p.same(args!["DEL", "{x}dst"]);
    }
}

// ---------------------------------------------------------------------------------------
// The cached cardinality
// ---------------------------------------------------------------------------------------

#[test]
fn cached_cardinality_matches_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(&kite, &redis, format!("cache, {}", kite.name));
    p.same(args!["PFADD", "h", "a", "b", "c"]);
    let before = p.same(args!["GET", "h"]).as_bytes().unwrap().to_vec();
    assert_eq!(before[15] & 0x80, 0x80, "a fresh HLL's cache is stale");
    assert_eq!(p.same(args!["PFCOUNT", "h"]), Resp::Integer(3));
    let after = p.same(args!["GET", "h"]).as_bytes().unwrap().to_vec();
    assert_eq!(&after[8..16], &3u64.to_le_bytes(), "PFCOUNT caches 3");
    // No register changes: the cache stays valid.
    assert_eq!(p.same(args!["PFADD", "h", "a"]), Resp::Integer(0));
    assert_eq!(
        p.same(args!["GET", "h"]).as_bytes().unwrap()[8..16],
        3u64.to_le_bytes()
    );
    // A change marks it stale (the old count stays in the low bytes).
    p.same(args!["PFADD", "h", "zz"]);
    assert_eq!(p.same(args!["GET", "h"]).as_bytes().unwrap()[15], 0x80);
    // A valid-looking cache is answered as it is, whatever the registers say.
    let mut bogus = after.clone();
    bogus[8..16].copy_from_slice(&12345u64.to_le_bytes());
    p.set("bogus", &bogus);
    assert_eq!(p.same(args!["PFCOUNT", "bogus"]), Resp::Integer(12345));
    // ...but not by PFCOUNT of several keys, which reads the registers.
    assert_eq!(p.same(args!["PFCOUNT", "bogus", "nokey"]), Resp::Integer(3));
    assert_eq!(p.same(args!["PFADD", "bogus", "a"]), Resp::Integer(0));
    assert_eq!(p.same(args!["PFCOUNT", "bogus"]), Resp::Integer(12345));
    assert_eq!(p.same(args!["PFADD", "bogus", "zzz"]), Resp::Integer(1));
    p.same(args!["GET", "bogus"]);
    assert_eq!(p.same(args!["PFCOUNT", "bogus"]), Resp::Integer(4));
    p.same(args!["GET", "bogus"]);
    // Stale bit set with a value: recomputed and rewritten.
    let mut stale = after.clone();
    stale[8..16].copy_from_slice(&[0x39, 0x30, 0, 0, 0, 0, 0, 0x80]);
    p.set("stale", &stale);
    assert_eq!(p.same(args!["PFCOUNT", "stale"]), Resp::Integer(3));
    p.same(args!["GET", "stale"]);
    // Dense keys cache the same way, and PFMERGE leaves its destination stale.
    let mut a = args!["PFADD", "big"];
    for i in 0..6000 {
        a.push(format!("m{i}").into_bytes());
    }
    p.same(a);
    assert_eq!(
        p.same(args!["PFDEBUG", "ENCODING", "big"]),
        Resp::simple("dense")
    );
    p.same(args!["GETRANGE", "big", "0", "15"]);
    p.same(args!["PFCOUNT", "big"]);
    p.same(args!["GETRANGE", "big", "0", "15"]);
    p.same(args!["GET", "big"]);
    p.same(args!["PFMERGE", "big", "h"]);
    p.same(args!["GETRANGE", "big", "0", "15"]);
    p.same(args!["PFCOUNT", "big"]);
    p.same(args!["GET", "big"]);
    // The cache travels with the value.
    p.same(args!["COPY", "big", "{c}copy"]);
    p.same(args!["GET", "{c}copy"]);
    p.same(args!["PFCOUNT", "{c}copy"]);
}

// ---------------------------------------------------------------------------------------
// Values moving between the servers
// ---------------------------------------------------------------------------------------

/// HLLs made by redis-server (GET bytes and DUMP payloads) read the same in the server
/// under test, and PFADD goes on identically; then the other way round.
fn moved_between(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut kc = kite.client();
    let mut rc = redis.client();
    let mut rng = Rng::new(31 + threads as u64);
    let sizes = [0usize, 3, 200, 1500, 5000, 15000];
    for (n, &size) in sizes.iter().enumerate() {
        let key = format!("src{n}");
        // Built on one side, then the same PFADDs continued on both.
        for from_redis in [true, false] {
            let (src, dst): (&mut Client, &mut Client) = if from_redis {
                (&mut rc, &mut kc)
            } else {
                (&mut kc, &mut rc)
            };
            let dir = if from_redis {
                "redis -> kite"
            } else {
                "kite -> redis"
            };
            let mut a = args!["PFADD", key.as_str()];
            for _ in 0..size {
                a.push(element(&mut rng));
            }
            src.cmd(&[b"DEL".as_slice(), key.as_bytes()]);
            dst.cmd(&[b"DEL".as_slice(), key.as_bytes()]);
            assert_eq!(src.cmd(&a), Resp::Integer(1));
            if rng.chance(50) {
                src.cmd(&["PFCOUNT", key.as_str()]);
            }
            let bytes = src.cmd(&["GET", key.as_str()]);
            let dump = src.cmd(&["DUMP", key.as_str()]);
            let dump = dump.as_bytes().unwrap().to_vec();
            // By value.
            let copy = format!("{key}:set");
            assert_eq!(
                dst.cmd(&[
                    b"SET".as_slice(),
                    copy.as_bytes(),
                    bytes.as_bytes().unwrap()
                ]),
                Resp::ok()
            );
            // By DUMP / RESTORE.
            let restored = format!("{key}:restored");
            dst.cmd(&["DEL", restored.as_str()]);
            assert_eq!(
                dst.cmd(&[
                    b"RESTORE".as_slice(),
                    restored.as_bytes(),
                    b"0",
                    dump.as_slice()
                ]),
                Resp::ok(),
                "{dir}: RESTORE of size {size}"
            );
            let want_count = src.cmd(&["PFCOUNT", key.as_str()]);
            for k in [&copy, &restored] {
                assert_eq!(
                    dst.cmd(&["GET", k.as_str()]),
                    bytes,
                    "{dir}: bytes of {k} (size {size})"
                );
                assert_eq!(
                    dst.cmd(&["PFCOUNT", k.as_str()]),
                    want_count,
                    "{dir}: PFCOUNT of {k} (size {size})"
                );
                assert_eq!(
                    dst.cmd(&["PFDEBUG", "ENCODING", k.as_str()]),
                    src.cmd(&["PFDEBUG", "ENCODING", key.as_str()]),
                    "{dir}: encoding of {k}"
                );
            }
            // Both sides go on with the same elements from the same state.
            let mut more = Vec::new();
            for _ in 0..(size / 2 + 50) {
                more.push(element(&mut rng));
            }
            let src_after = {
                let mut a = args!["PFADD", key.as_str()];
                a.extend(more.iter().cloned());
                let r = src.cmd(&a);
                (r, src.cmd(&["GET", key.as_str()]))
            };
            for k in [&copy, &restored] {
                let mut a = args!["PFADD", k.as_str()];
                a.extend(more.iter().cloned());
                let r = dst.cmd(&a);
                assert_eq!(r, src_after.0, "{dir}: PFADD reply on {k} (size {size})");
                assert_eq!(
                    dst.cmd(&["GET", k.as_str()]),
                    src_after.1,
                    "{dir}: bytes after PFADD on {k} (size {size})"
                );
                assert_eq!(
                    dst.cmd(&["PFCOUNT", k.as_str()]),
                    src.cmd(&["PFCOUNT", key.as_str()]),
                    "{dir}: PFCOUNT after PFADD on {k}"
                );
            }
        }
    }
}

#[test]
fn values_move_between_servers_threads1() {
    moved_between(1);
}

#[test]
fn values_move_between_servers_threads4() {
    moved_between(4);
}

// ---------------------------------------------------------------------------------------
// hll-sparse-max-bytes
// ---------------------------------------------------------------------------------------

#[test]
fn sparse_max_bytes_config_matches_redis() {
    let kite = KiteServer::start(&[], 4);
    let redis = RedisServer::start();
    let mut p = Pair::new(
        &kite,
        &redis,
        format!("hll-sparse-max-bytes, {}", kite.name),
    );
    let mut rng = Rng::new(77);
    assert_eq!(
        p.same(args!["CONFIG", "GET", "hll-sparse-max-bytes"]),
        Resp::Array(vec![Resp::bulk("hll-sparse-max-bytes"), Resp::bulk("3000")])
    );
    for bad in ["-1", "abc", "1x", "-1kb"] {
        let r = p.same(args!["CONFIG", "SET", "hll-sparse-max-bytes", bad]);
        assert!(r.is_error(), "{bad}: {r}");
    }
    // An empty memory value reads as 0.
    assert_eq!(
        p.same(args!["CONFIG", "SET", "hll-sparse-max-bytes", ""]),
        Resp::ok()
    );
    assert_eq!(
        p.same(args!["CONFIG", "GET", "hll-sparse-max-bytes"]),
        Resp::Array(vec![Resp::bulk("hll-sparse-max-bytes"), Resp::bulk("0")])
    );
    assert_eq!(
        p.same(args!["CONFIG", "SET", "hll-sparse-max-bytes", "abc"]),
        err("ERR CONFIG SET failed (possibly related to argument 'hll-sparse-max-bytes') - argument must be a memory value")
    );
    assert_eq!(
        p.same(args!["CONFIG", "SET", "hll-sparse-max-bytes", "2kb"]),
        Resp::ok()
    );
    assert_eq!(
        p.same(args!["CONFIG", "GET", "hll-sparse-max-bytes"]),
        Resp::Array(vec![Resp::bulk("hll-sparse-max-bytes"), Resp::bulk("2048")])
    );
    for (limit, elems) in [
        ("100", 60),
        ("0", 1),
        ("0", 0),
        ("500", 300),
        ("2kb", 1200),
        ("20000", 9000),
        ("3000", 2500),
    ] {
        assert_eq!(
            p.same(args!["CONFIG", "SET", "hll-sparse-max-bytes", limit]),
            Resp::ok()
        );
        let key = format!("h{limit}:{elems}");
        p.same(args!["PFADD", key.as_str()]);
        let mut added = 0;
        while added < elems {
            let batch = rng.range(1, 40).min((elems - added) as i64) as usize;
            let mut a = args!["PFADD", key.as_str()];
            for _ in 0..batch {
                a.push(element(&mut rng));
            }
            added += batch;
            p.same(a);
            p.same(args!["PFDEBUG", "ENCODING", key.as_str()]);
            p.same(args!["STRLEN", key.as_str()]);
        }
        p.same(args!["GET", key.as_str()]);
        p.same(args!["PFCOUNT", key.as_str()]);
        // A merge into a sparse key follows the limit too.
        p.same(args!["PFADD", "{m}small", "x"]);
        p.same(args!["PFMERGE", "{m}small", key.as_str()]);
        p.same(args!["PFDEBUG", "ENCODING", "{m}small"]);
        p.same(args!["GET", "{m}small"]);
        p.same(args!["DEL", "{m}small"]);
    }
}
