//! Geo commands (GEOADD, GEODIST, GEOHASH, GEOPOS, GEOSEARCH, GEOSEARCHSTORE, GEORADIUS,
//! GEORADIUSBYMEMBER and their _RO forms) against a real redis-server.
//!
//! Replies are compared exactly, in RESP2 and RESP3: the coordinates GEOPOS and WITHCOORD
//! print (Redis 7.0 and 7.2 print the same digits), the `%.4f` distances, the 52-bit
//! scores, and the order of unsorted results (the order Redis visits the nine geohash
//! areas). One difference between Redis 7.0 (the reference here) and 7.2 is tolerated:
//! scores stored by STOREDIST are read back with ZRANGE/ZSCORE, and 7.0 prints doubles
//! with `%.17g` where 7.2 prints the shortest text that reads back the same, so those
//! replies are compared as the doubles they denote.
//!
//! With `--threads 4` the source and destination keys of the STORE forms are on
//! different shards.
//!
//! Reproduce one seed: `KITE_GEO_SEEDS=7 cargo test --test geo random`; longer runs:
//! `KITE_GEO_OPS=5000`; replies per command: `KITE_GEO_STATS=1 ... -- --nocapture`.

#[macro_use]
mod common;

use common::*;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

// ---------------------------------------------------------------------------------------
// Comparing replies
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Check {
    Exact,
    /// Numbers in strings and RESP3 doubles compared as doubles (STOREDIST scores).
    Scores,
}

fn as_score(b: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(b).ok()?;
    if s.is_empty() || s.starts_with(' ') {
        return None;
    }
    s.parse::<f64>().ok()
}

fn same_modulo_score_text(k: &Resp, r: &Resp) -> bool {
    let num = |a: &[u8], b: &[u8]| match (as_score(a), as_score(b)) {
        (Some(x), Some(y)) => x.to_bits() == y.to_bits(),
        _ => false,
    };
    match (k, r) {
        (Resp::Bulk(a), Resp::Bulk(b)) => a == b || num(a, b),
        (Resp::Double(a), Resp::Double(b)) => a == b || num(a.as_bytes(), b.as_bytes()),
        (Resp::Array(x), Resp::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_modulo_score_text(a, b))
        }
        _ => k == r,
    }
}

struct Pair {
    kite: Client,
    redis: Client,
    label: String,
    count: usize,
    history: VecDeque<String>,
    /// Per command name: (ok replies, error replies) from Redis; searches also counted
    /// by whether they found anything.
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
            "\nGEO MISMATCH ({})\n  command #{}: {}\n  kite:  {}\n  redis: {}\n\
             last commands (oldest first):\n    {}\n",
            self.label,
            self.count,
            cmd_text(args),
            short(kite),
            short(redis),
            hist.join("\n    ")
        );
    }

    fn run(&mut self, args: Vec<Vec<u8>>, check: Check) -> Resp {
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
        let mut name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        if let Some(v) = r.as_array() {
            name.push_str(if v.is_empty() { " (empty)" } else { " (found)" });
        }
        let e = self.stats.entry(name).or_default();
        if r.is_error() {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
        let ok = match check {
            Check::Exact => k == r,
            Check::Scores => same_modulo_score_text(&k, &r),
        };
        if !ok {
            self.fail(&args, &k, &r);
        }
        r
    }

    fn same(&mut self, args: Vec<Vec<u8>>) -> Resp {
        self.run(args, Check::Exact)
    }

    fn scores(&mut self, args: Vec<Vec<u8>>) -> Resp {
        self.run(args, Check::Scores)
    }
}

fn err(text: &str) -> Resp {
    Resp::Error(text.to_string())
}

// ---------------------------------------------------------------------------------------
// Scripted cases
// ---------------------------------------------------------------------------------------

const PALERMO: [&str; 3] = ["13.361389", "38.115556", "Palermo"];
const CATANIA: [&str; 3] = ["15.087269", "37.502669", "Catania"];

fn scripted(threads: usize, resp3: bool) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let label = format!(
        "scripted, {}, {}",
        kite.name,
        if resp3 { "RESP3" } else { "RESP2" }
    );
    let mut p = Pair::new(&kite, &redis, resp3, label);
    let keys = spread_keys("sicily", 4);
    let g = keys[0].as_str();
    let (d1, d2, d3) = (keys[1].as_str(), keys[2].as_str(), keys[3].as_str());

    // GEOADD and its flags.
    let mut a = args!["GEOADD", g];
    a.extend(
        PALERMO
            .iter()
            .chain(CATANIA.iter())
            .map(|s| s.as_bytes().to_vec()),
    );
    assert_eq!(p.same(a), Resp::Integer(2));
    p.same(args!["GEOADD", g, "2.349014", "48.864716", "Paris"]);
    p.same(args!["GEOADD", g, "12.496366", "41.902782", "Rome"]);
    assert_eq!(
        p.same(args![
            "GEOADD",
            g,
            "NX",
            "13.361389",
            "38.115556",
            "Palermo",
            "1",
            "1",
            "new"
        ]),
        Resp::Integer(1)
    );
    assert_eq!(
        p.same(args![
            "GEOADD",
            g,
            "XX",
            "CH",
            "13.361389",
            "38.115556",
            "Palermo",
            "1",
            "1",
            "new2"
        ]),
        Resp::Integer(0)
    );
    assert_eq!(p.same(args!["EXISTS", "nokey"]), Resp::Integer(0));
    assert_eq!(
        p.same(args![
            "GEOADD",
            g,
            "XX",
            "CH",
            "13.0",
            "38.115556",
            "Palermo"
        ]),
        Resp::Integer(1)
    );
    assert_eq!(
        p.same(args![
            "GEOADD",
            g,
            "xx",
            "ch",
            "13.361389",
            "38.115556",
            "Palermo"
        ]),
        Resp::Integer(1)
    );
    assert_eq!(
        p.same(args!["GEOADD", g, "CH", "CH", "1", "1", "new"]),
        Resp::Integer(0)
    );
    assert_eq!(
        p.same(args!["GEOADD", g, "CH", "2", "2", "new", "2", "2", "new"]),
        Resp::Integer(1)
    );
    assert_eq!(
        p.same(args!["GEOADD", "geonew", "XX", "1", "1", "a"]),
        Resp::Integer(0)
    );
    assert_eq!(p.same(args!["EXISTS", "geonew"]), Resp::Integer(0));
    // Numbers as Redis reads them: exponents, hex, signs; no spaces.
    p.same(args!["GEOADD", g, "1e1", "1.5E0", "exp"]);
    p.same(args!["GEOADD", g, "0x10", "-0", "hex"]);
    p.same(args!["GEOADD", g, "+5", "-0.0", "signs"]);
    p.same(args!["GEOPOS", g, "exp", "hex", "signs"]);
    // Limits: longitude ±180, latitude ±85.05112878.
    p.same(args!["GEOADD", g, "-180", "-85.05112878", "sw"]);
    p.same(args!["GEOADD", g, "180", "85.05112878", "ne"]);
    p.same(args!["GEOPOS", g, "sw", "ne", "nomember"]);
    p.same(args!["GEOHASH", g, "sw", "ne", "Palermo", "nomember"]);
    for (lon, lat, text) in [
        (
            "181",
            "1",
            "ERR invalid longitude,latitude pair 181.000000,1.000000",
        ),
        (
            "1",
            "86",
            "ERR invalid longitude,latitude pair 1.000000,86.000000",
        ),
        (
            "180",
            "85.05112879",
            "ERR invalid longitude,latitude pair 180.000000,85.051129",
        ),
        (
            "-180.0000001",
            "0",
            "ERR invalid longitude,latitude pair -180.000000,0.000000",
        ),
        (
            "inf",
            "1",
            "ERR invalid longitude,latitude pair inf,1.000000",
        ),
        (
            "1",
            "-inf",
            "ERR invalid longitude,latitude pair 1.000000,-inf",
        ),
        ("abc", "1", "ERR value is not a valid float"),
        ("1", "nan", "ERR value is not a valid float"),
        (" 1", "1", "ERR value is not a valid float"),
        ("1 ", "1", "ERR value is not a valid float"),
        ("", "1", "ERR value is not a valid float"),
    ] {
        assert_eq!(
            p.same(args!["GEOADD", g, lon, lat, "bad"]),
            err(text),
            "{lon},{lat}"
        );
    }
    // A bad pair anywhere fails the whole command.
    assert_eq!(
        p.same(args!["GEOADD", g, "CH", "3", "3", "new", "200", "1", "b"]),
        err("ERR invalid longitude,latitude pair 200.000000,1.000000")
    );
    p.same(args!["GEOPOS", g, "new"]);
    for a in [
        args!["GEOADD", g, "NX", "XX", "1", "1", "x"],
        args!["GEOADD", g, "GT", "1", "1", "x"],
        args!["GEOADD", g, "CH", "1", "1"],
        args!["GEOADD", g, "1", "1", "x", "2"],
        args!["GEOADD", g, "1", "1"],
        args!["GEOADD", g],
        args!["GEOADD"],
    ] {
        let r = p.same(a);
        assert!(r.is_error(), "{r}");
    }

    // GEODIST in every unit, missing members and keys.
    for unit in ["m", "km", "mi", "ft", "M", "KM", "Mi", "fT"] {
        p.same(args!["GEODIST", g, "Palermo", "Catania", unit]);
    }
    p.same(args!["GEODIST", g, "Palermo", "Catania"]);
    p.same(args!["GEODIST", g, "Palermo", "Palermo"]);
    p.same(args!["GEODIST", g, "sw", "ne", "km"]);
    assert!(p.same(args!["GEODIST", g, "Palermo", "nomember"]).is_null());
    assert!(p.same(args!["GEODIST", "nokey", "a", "b"]).is_null());
    for (a, text) in [
        (
            args!["GEODIST", g, "Palermo", "Catania", "yd"],
            "ERR unsupported unit provided. please use M, KM, FT, MI",
        ),
        (
            args!["GEODIST", g, "Palermo", "Catania", ""],
            "ERR unsupported unit provided. please use M, KM, FT, MI",
        ),
        (
            args!["GEODIST", g, "Palermo", "Catania", "km", "x"],
            "ERR syntax error",
        ),
        (
            args!["GEODIST", g, "Palermo"],
            "ERR wrong number of arguments for 'geodist' command",
        ),
    ] {
        assert_eq!(p.same(a), err(text));
    }

    // GEOHASH / GEOPOS edge cases.
    p.same(args!["GEOHASH", g]);
    p.same(args!["GEOPOS", g]);
    p.same(args!["GEOHASH", "nokey", "a", "b"]);
    p.same(args!["GEOPOS", "nokey", "a", "b"]);
    // Scores not written by GEOADD still decode (the low 52 bits, as an integer).
    p.same(args![
        "ZADD",
        g,
        "0.5",
        "half",
        "4503599627370495",
        "max52",
        "1000000000000000",
        "plain"
    ]);
    p.same(args!["ZADD", g, "4503599627370496", "over52"]);
    p.same(args!["GEOPOS", g, "half", "max52", "plain", "over52"]);
    p.same(args!["GEOHASH", g, "half", "max52", "plain", "over52"]);
    p.same(args!["GEODIST", g, "half", "plain"]);
    p.same(args!["ZREM", g, "half", "max52", "plain", "over52"]);
    // The score GEOADD writes.
    for m in [
        "Palermo", "Catania", "Paris", "Rome", "sw", "ne", "exp", "hex",
    ] {
        p.same(args!["ZSCORE", g, m]);
    }
    p.same(args!["ZRANGE", g, "0", "-1", "WITHSCORES"]);

    // GEOSEARCH shapes, orders and the WITH options.
    let searches: Vec<Vec<&str>> = vec![
        vec!["FROMMEMBER", "Palermo", "BYRADIUS", "500", "km"],
        vec!["FROMMEMBER", "Palermo", "BYRADIUS", "500", "km", "ASC"],
        vec!["FROMMEMBER", "Palermo", "BYRADIUS", "500", "km", "DESC"],
        vec![
            "FROMMEMBER",
            "Palermo",
            "BYRADIUS",
            "500",
            "km",
            "COUNT",
            "2",
        ],
        vec![
            "FROMMEMBER",
            "Palermo",
            "BYRADIUS",
            "500",
            "km",
            "COUNT",
            "2",
            "DESC",
        ],
        vec![
            "FROMMEMBER",
            "Palermo",
            "BYRADIUS",
            "5000",
            "km",
            "COUNT",
            "2",
            "ANY",
        ],
        vec![
            "FROMMEMBER",
            "Palermo",
            "BYRADIUS",
            "5000",
            "km",
            "COUNT",
            "20",
            "ANY",
            "ASC",
        ],
        vec![
            "FROMLONLAT",
            "15",
            "37",
            "BYBOX",
            "400",
            "400",
            "km",
            "ASC",
            "WITHDIST",
        ],
        vec!["FROMLONLAT", "15", "37", "BYBOX", "400", "100", "km"],
        vec![
            "FROMLONLAT",
            "15",
            "37",
            "BYBOX",
            "4000",
            "4000",
            "km",
            "WITHCOORD",
            "WITHDIST",
            "WITHHASH",
        ],
        vec![
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "2000",
            "mi",
            "WITHHASH",
            "WITHCOORD",
            "ASC",
        ],
        vec![
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "600000",
            "ft",
            "WITHDIST",
            "DESC",
        ],
        vec![
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "200000",
            "m",
            "withdist",
            "withdist",
        ],
        vec!["FROMLONLAT", "15", "37", "BYRADIUS", "inf", "km"],
        vec!["FROMLONLAT", "15", "37", "BYRADIUS", "0", "km"],
        vec!["FROMLONLAT", "0", "0", "BYRADIUS", "20000", "km", "ASC"],
        vec![
            "FROMLONLAT",
            "179.9",
            "84",
            "BYBOX",
            "1000",
            "3000",
            "km",
            "ASC",
        ],
        vec!["FROMLONLAT", "-179.9", "-84", "BYRADIUS", "800", "km"],
        vec!["FROMMEMBER", "ne", "BYRADIUS", "10", "km", "WITHCOORD"],
        vec![
            "FROMMEMBER",
            "Palermo",
            "BYRADIUS",
            "500",
            "km",
            "ASC",
            "DESC",
        ],
        vec![
            "FROMMEMBER",
            "Palermo",
            "BYRADIUS",
            "500",
            "km",
            "COUNT",
            "1",
            "COUNT",
            "3",
        ],
        vec![
            "frommember",
            "Palermo",
            "byradius",
            "500",
            "KM",
            "asc",
            "withdist",
        ],
        vec!["FROMMEMBER", "Palermo", "BYBOX", "500", "500", "FT"],
    ];
    for s in &searches {
        let mut a = args!["GEOSEARCH", g];
        a.extend(s.iter().map(|x| x.as_bytes().to_vec()));
        p.same(a);
    }
    // Errors.
    let errors: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["FROMMEMBER", "nomember", "BYRADIUS", "500", "km"],
            "ERR could not decode requested zset member",
        ),
        (
            vec![
                "FROMMEMBER",
                "Palermo",
                "BYRADIUS",
                "500",
                "km",
                "COUNT",
                "0",
            ],
            "ERR COUNT must be > 0",
        ),
        (
            vec![
                "FROMMEMBER",
                "Palermo",
                "BYRADIUS",
                "500",
                "km",
                "COUNT",
                "-1",
            ],
            "ERR COUNT must be > 0",
        ),
        (
            vec![
                "FROMMEMBER",
                "Palermo",
                "BYRADIUS",
                "500",
                "km",
                "COUNT",
                "x",
            ],
            "ERR value is not an integer or out of range",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYRADIUS", "500", "km", "ANY"],
            "ERR the ANY argument requires COUNT argument",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYRADIUS", "500", "yd"],
            "ERR unsupported unit provided. please use M, KM, FT, MI",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYRADIUS", "-1", "km"],
            "ERR radius cannot be negative",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYRADIUS", "x", "km"],
            "ERR need numeric radius",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYRADIUS", "nan", "km"],
            "ERR need numeric radius",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYBOX", "-1", "1", "km"],
            "ERR height or width cannot be negative",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYBOX", "x", "1", "km"],
            "ERR need numeric width",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYBOX", "1", "x", "km"],
            "ERR need numeric height",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYBOX", "1", "km"],
            "ERR syntax error",
        ),
        (
            vec![
                "FROMMEMBER",
                "Palermo",
                "FROMLONLAT",
                "1",
                "1",
                "BYRADIUS",
                "1",
                "km",
            ],
            "ERR syntax error",
        ),
        (
            vec![
                "FROMMEMBER",
                "Palermo",
                "BYRADIUS",
                "1",
                "km",
                "BYBOX",
                "1",
                "1",
                "km",
            ],
            "ERR syntax error",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYRADIUS", "1", "km", "STORE", "x"],
            "ERR syntax error",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYRADIUS", "1", "km", "STOREDIST"],
            "ERR syntax error",
        ),
        (
            vec!["FROMMEMBER", "Palermo", "BYRADIUS", "1", "km", "foo"],
            "ERR syntax error",
        ),
        (
            vec!["FROMLONLAT", "200", "1", "BYRADIUS", "1", "km"],
            "ERR invalid longitude,latitude pair 200.000000,1.000000",
        ),
        (
            vec!["FROMLONLAT", "15", "90", "BYRADIUS", "1", "km"],
            "ERR invalid longitude,latitude pair 15.000000,90.000000",
        ),
        (
            vec!["FROMLONLAT", "x", "1", "BYRADIUS", "1", "km"],
            "ERR value is not a valid float",
        ),
        (
            vec!["FROMLONLAT", "1", "nan", "BYRADIUS", "1", "km"],
            "ERR value is not a valid float",
        ),
    ];
    for (s, text) in &errors {
        let mut a = args!["GEOSEARCH", g];
        a.extend(s.iter().map(|x| x.as_bytes().to_vec()));
        assert_eq!(p.same(a), err(text), "GEOSEARCH {s:?}");
    }
    for a in [
        args!["GEOSEARCH", g, "FROMMEMBER", "Palermo"],
        args!["GEOSEARCH", g, "BYRADIUS", "1", "km"],
        args!["GEOSEARCH", g, "FROMMEMBER", "Palermo", "BYRADIUS", "500"],
        args!["GEOSEARCHSTORE", d1],
        args!["GEORADIUS", g, "15", "37", "200"],
        args!["GEORADIUSBYMEMBER", g],
    ] {
        let r = p.same(a);
        assert!(r.is_error(), "{r}");
    }
    // Missing keys: empty results, even for a member that cannot exist.
    p.same(args![
        "GEOSEARCH",
        "nokey",
        "FROMMEMBER",
        "x",
        "BYRADIUS",
        "1",
        "km"
    ]);
    p.same(args![
        "GEOSEARCH",
        "nokey",
        "FROMLONLAT",
        "0",
        "0",
        "BYBOX",
        "1",
        "1",
        "km"
    ]);
    p.same(args!["GEORADIUS", "nokey", "0", "0", "1", "km"]);
    p.same(args!["GEORADIUSBYMEMBER", "nokey", "x", "1", "km"]);
    p.same(args!["GEORADIUS_RO", "nokey", "0", "0", "1", "km"]);

    // GEOSEARCHSTORE: geohash scores or distances, overwriting any type, deleting the
    // destination when nothing matches; source and destination on different shards.
    assert_eq!(
        p.same(args![
            "GEOSEARCHSTORE",
            d1,
            g,
            "FROMMEMBER",
            "Palermo",
            "BYRADIUS",
            "500",
            "km"
        ]),
        Resp::Integer(3)
    );
    p.same(args!["ZRANGE", d1, "0", "-1", "WITHSCORES"]);
    p.scores(args![
        "GEOSEARCHSTORE",
        d2,
        g,
        "FROMMEMBER",
        "Palermo",
        "BYRADIUS",
        "500",
        "km",
        "STOREDIST"
    ]);
    p.scores(args!["ZRANGE", d2, "0", "-1", "WITHSCORES"]);
    p.scores(args!["ZSCORE", d2, "Catania"]);
    p.same(args![
        "GEOSEARCHSTORE",
        d2,
        g,
        "FROMMEMBER",
        "Palermo",
        "BYRADIUS",
        "500",
        "km",
        "STOREDIST",
        "DESC",
        "COUNT",
        "1"
    ]);
    p.scores(args!["ZRANGE", d2, "0", "-1", "WITHSCORES"]);
    p.same(args![
        "GEOSEARCHSTORE",
        d2,
        g,
        "FROMLONLAT",
        "15",
        "37",
        "BYBOX",
        "5000",
        "5000",
        "km",
        "STOREDIST",
        "COUNT",
        "3",
        "ANY"
    ]);
    p.scores(args!["ZRANGE", d2, "0", "-1", "WITHSCORES"]);
    p.same(args!["SET", d3, "string"]);
    p.same(args![
        "GEOSEARCHSTORE",
        d3,
        g,
        "FROMLONLAT",
        "15",
        "37",
        "BYRADIUS",
        "300",
        "km",
        "ASC"
    ]);
    p.same(args!["TYPE", d3]);
    p.same(args!["ZRANGE", d3, "0", "-1", "WITHSCORES"]);
    assert_eq!(
        p.same(args![
            "GEOSEARCHSTORE",
            d3,
            g,
            "FROMLONLAT",
            "0",
            "0",
            "BYRADIUS",
            "1",
            "km"
        ]),
        Resp::Integer(0)
    );
    assert_eq!(p.same(args!["EXISTS", d3]), Resp::Integer(0));
    p.same(args!["SET", d3, "string"]);
    assert_eq!(
        p.same(args![
            "GEOSEARCHSTORE",
            d3,
            "nokey",
            "FROMLONLAT",
            "0",
            "0",
            "BYRADIUS",
            "1",
            "km"
        ]),
        Resp::Integer(0)
    );
    assert_eq!(p.same(args!["EXISTS", d3]), Resp::Integer(0));
    // An error leaves the destination alone.
    p.same(args!["SET", d3, "string"]);
    assert_eq!(
        p.same(args![
            "GEOSEARCHSTORE",
            d3,
            g,
            "FROMMEMBER",
            "nomember",
            "BYRADIUS",
            "1",
            "km"
        ]),
        err("ERR could not decode requested zset member")
    );
    for w in ["WITHDIST", "WITHCOORD", "WITHHASH"] {
        assert_eq!(
            p.same(args!["GEOSEARCHSTORE", d1, g, "FROMMEMBER", "Palermo", "BYRADIUS", "500", "km", w]),
            err("ERR GEOSEARCHSTORE is not compatible with WITHDIST, WITHHASH and WITHCOORD options")
        );
    }
    assert_eq!(
        p.same(args![
            "GEOSEARCHSTORE",
            d1,
            g,
            "FROMMEMBER",
            "Palermo",
            "BYRADIUS",
            "500",
            "km",
            "STORE",
            "x"
        ]),
        err("ERR syntax error")
    );
    assert_eq!(p.same(args!["TYPE", d3]), Resp::simple("string"));
    // The source itself as the destination.
    p.same(args!["COPY", g, "{same}g"]);
    p.same(args![
        "GEOSEARCHSTORE",
        "{same}g",
        "{same}g",
        "FROMMEMBER",
        "Palermo",
        "BYRADIUS",
        "300",
        "km"
    ]);
    p.same(args!["ZRANGE", "{same}g", "0", "-1", "WITHSCORES"]);

    // GEORADIUS / GEORADIUSBYMEMBER with STORE and STOREDIST (the last one named wins).
    p.same(args![
        "GEORADIUS",
        g,
        "15",
        "37",
        "200",
        "km",
        "WITHDIST",
        "ASC"
    ]);
    p.same(args![
        "GEORADIUS",
        g,
        "15",
        "37",
        "200",
        "km",
        "WITHDIST",
        "WITHCOORD",
        "WITHHASH",
        "COUNT",
        "1"
    ]);
    p.same(args![
        "GEORADIUS",
        g,
        "15",
        "37",
        "2000",
        "km",
        "COUNT",
        "2",
        "ANY",
        "DESC"
    ]);
    p.same(args![
        "GEORADIUSBYMEMBER",
        g,
        "Palermo",
        "200",
        "km",
        "WITHCOORD"
    ]);
    p.same(args![
        "GEORADIUSBYMEMBER",
        g,
        "Palermo",
        "2000",
        "mi",
        "DESC",
        "WITHDIST"
    ]);
    p.same(args![
        "GEORADIUS_RO",
        g,
        "15",
        "37",
        "200",
        "km",
        "WITHDIST",
        "WITHHASH",
        "WITHCOORD",
        "COUNT",
        "1"
    ]);
    p.same(args![
        "GEORADIUSBYMEMBER_RO",
        g,
        "Catania",
        "300",
        "km",
        "ASC"
    ]);
    assert_eq!(
        p.same(args!["GEORADIUS", g, "15", "37", "200", "km", "STORE", d1]),
        Resp::Integer(2)
    );
    p.same(args!["ZRANGE", d1, "0", "-1", "WITHSCORES"]);
    p.same(args!["DEL", d1, d2]);
    assert_eq!(
        p.same(args![
            "GEORADIUS",
            g,
            "15",
            "37",
            "200",
            "km",
            "STORE",
            d1,
            "STOREDIST",
            d2
        ]),
        Resp::Integer(2)
    );
    assert_eq!(p.same(args!["EXISTS", d1]), Resp::Integer(0));
    p.scores(args!["ZRANGE", d2, "0", "-1", "WITHSCORES"]);
    p.same(args!["DEL", d1, d2]);
    p.same(args![
        "GEORADIUSBYMEMBER",
        g,
        "Palermo",
        "200",
        "km",
        "STOREDIST",
        d1,
        "STORE",
        d2
    ]);
    assert_eq!(p.same(args!["EXISTS", d1]), Resp::Integer(0));
    p.same(args!["ZRANGE", d2, "0", "-1", "WITHSCORES"]);
    p.same(args![
        "GEORADIUSBYMEMBER",
        g,
        "Palermo",
        "5000",
        "km",
        "STOREDIST",
        d1,
        "COUNT",
        "3",
        "DESC"
    ]);
    p.scores(args!["ZRANGE", d1, "0", "-1", "WITHSCORES"]);
    p.same(args!["GEORADIUS", g, "0", "0", "1", "km", "STORE", d1]);
    assert_eq!(p.same(args!["EXISTS", d1]), Resp::Integer(0));
    p.same(args![
        "GEORADIUS",
        "nokey",
        "0",
        "0",
        "1",
        "km",
        "STORE",
        d2
    ]);
    assert_eq!(p.same(args!["EXISTS", d2]), Resp::Integer(0));
    let radius_errors: Vec<(Vec<Vec<u8>>, &str)> = vec![
        (args!["GEORADIUS", g, "15", "37", "200", "km", "STORE", d1, "WITHDIST"], "ERR STORE option in GEORADIUS is not compatible with WITHDIST, WITHHASH and WITHCOORD options"),
        (args!["GEORADIUSBYMEMBER", g, "Palermo", "200", "km", "WITHCOORD", "STOREDIST", d1], "ERR STORE option in GEORADIUS is not compatible with WITHDIST, WITHHASH and WITHCOORD options"),
        (args!["GEORADIUS_RO", g, "15", "37", "200", "km", "STORE", d1], "ERR syntax error"),
        (args!["GEORADIUS_RO", g, "15", "37", "200", "km", "STOREDIST", d1], "ERR syntax error"),
        (args!["GEORADIUSBYMEMBER_RO", g, "Palermo", "200", "km", "STORE", d1], "ERR syntax error"),
        (args!["GEORADIUS", g, "15", "37", "200", "km", "STORE"], "ERR syntax error"),
        (args!["GEORADIUS", g, "15", "37", "200", "km", "COUNT"], "ERR syntax error"),
        (args!["GEORADIUS", g, "15", "37", "200", "km", "FROMMEMBER", "x"], "ERR syntax error"),
        (args!["GEORADIUS", g, "15", "37", "200", "km", "BYBOX", "1", "1", "km"], "ERR syntax error"),
        (args!["GEORADIUS", g, "15", "37", "200", "km", "ANY"], "ERR the ANY argument requires COUNT argument"),
        (args!["GEORADIUS", g, "15", "37", "200", "km", "COUNT", "0"], "ERR COUNT must be > 0"),
        (args!["GEORADIUS", g, "15", "37", "-1", "km"], "ERR radius cannot be negative"),
        (args!["GEORADIUS", g, "15", "37", "x", "km"], "ERR need numeric radius"),
        (args!["GEORADIUS", g, "x", "37", "1", "km"], "ERR value is not a valid float"),
        (args!["GEORADIUS", g, "15", "95", "1", "km"], "ERR invalid longitude,latitude pair 15.000000,95.000000"),
        (args!["GEORADIUS", g, "15", "37", "1", "parsec"], "ERR unsupported unit provided. please use M, KM, FT, MI"),
        (args!["GEORADIUSBYMEMBER", g, "nomember", "1", "km"], "ERR could not decode requested zset member"),
        (args!["GEORADIUSBYMEMBER_RO", g, "nomember", "1", "km"], "ERR could not decode requested zset member"),
    ];
    for (a, text) in radius_errors {
        assert_eq!(p.same(a.clone()), err(text), "{}", fmt_cmd(&a));
    }

    // Wrong types.
    p.same(args!["SET", "str", "x"]);
    p.same(args!["HSET", "hash", "f", "v"]);
    for a in [
        args!["GEOADD", "str", "1", "1", "x"],
        args!["GEOPOS", "str", "x"],
        args!["GEOHASH", "str", "x"],
        args!["GEODIST", "str", "a", "b"],
        args![
            "GEOSEARCH",
            "hash",
            "FROMLONLAT",
            "0",
            "0",
            "BYRADIUS",
            "1",
            "km"
        ],
        args!["GEOSEARCH", "str", "FROMMEMBER", "x", "BYRADIUS", "1", "km"],
        args![
            "GEOSEARCHSTORE",
            d1,
            "str",
            "FROMLONLAT",
            "0",
            "0",
            "BYRADIUS",
            "1",
            "km"
        ],
        args!["GEORADIUS", "str", "0", "0", "1", "km"],
        args!["GEORADIUS", "str", "0", "0", "1", "km", "STORE", d1],
        args!["GEORADIUSBYMEMBER_RO", "hash", "x", "1", "km"],
    ] {
        assert_eq!(
            p.same(a),
            err("WRONGTYPE Operation against a key holding the wrong kind of value")
        );
    }
    // A member with a binary name, and an empty one.
    p.same(args![
        "GEOADD",
        g,
        "14",
        "38",
        b"bin\x00\xff\r\n".to_vec(),
        "14.1",
        "38.1",
        ""
    ]);
    p.same(args!["GEOPOS", g, b"bin\x00\xff\r\n".to_vec(), ""]);
    p.same(args![
        "GEOSEARCH",
        g,
        "FROMMEMBER",
        "",
        "BYRADIUS",
        "50",
        "km",
        "ASC",
        "WITHDIST"
    ]);
    // Inside MULTI.
    p.same(args!["MULTI"]);
    p.same(args!["GEOADD", "{t}g", "1", "1", "a", "2", "2", "b"]);
    p.same(args![
        "GEOSEARCHSTORE",
        "{t}d",
        "{t}g",
        "FROMLONLAT",
        "1",
        "1",
        "BYRADIUS",
        "500",
        "km",
        "STOREDIST"
    ]);
    p.same(args!["GEOPOS", "{t}g", "a"]);
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

// ---------------------------------------------------------------------------------------
// The random differential
// ---------------------------------------------------------------------------------------

const MAX_LAT: f64 = 85.05112878;

struct Gen {
    rng: Rng,
    sources: Vec<String>,
    dests: Vec<String>,
}

impl Gen {
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.rng.below(1 << 53) as f64 / (1u64 << 53) as f64)
    }

    /// A coordinate as text: mostly 6 decimals, sometimes more, fewer or an exponent.
    fn fmt(&mut self, v: f64) -> String {
        match self.rng.below(10) {
            0 => format!("{v:.0}"),
            1 => format!("{v:.2}"),
            2 => format!("{v:.12}"),
            3 => format!("{v:e}"),
            _ => format!("{v:.6}"),
        }
    }

    /// A point: around a few places (the antimeridian and near the poles included), or
    /// anywhere.
    fn point(&mut self) -> (String, String) {
        let (lon, lat) = if self.rng.chance(60) {
            let centers = [
                (13.4, 38.1),
                (0.0, 0.0),
                (-73.9, 40.7),
                (179.95, -16.0),
                (-179.95, 65.0),
                (100.0, 84.9),
                (-40.0, -84.9),
            ];
            let (clon, clat) = *self.rng.pick(&centers);
            let spread = [0.001, 0.05, 0.5, 3.0][self.rng.index(4)];
            let lon = (clon + self.uniform(-spread, spread)).clamp(-180.0, 180.0);
            let lat = (clat + self.uniform(-spread, spread)).clamp(-MAX_LAT, MAX_LAT);
            (lon, lat)
        } else {
            (self.uniform(-180.0, 180.0), self.uniform(-MAX_LAT, MAX_LAT))
        };
        let (lon, lat) = (self.fmt(lon), self.fmt(lat));
        // The text must still be inside the limits once rounded.
        let ok = |s: &str, lim: f64| s.parse::<f64>().map(|v| v.abs() <= lim).unwrap_or(false);
        if ok(&lon, 180.0) && ok(&lat, MAX_LAT) {
            (lon, lat)
        } else {
            ("1.5".into(), "2.5".into())
        }
    }

    fn member(&mut self) -> String {
        format!("m{}", self.rng.below(260))
    }

    fn source(&mut self) -> String {
        if self.rng.chance(3) {
            "missing".into()
        } else {
            self.rng.pick(&self.sources).clone()
        }
    }

    fn unit(&mut self) -> (&'static str, f64) {
        *self.rng.pick(&[
            ("m", 1.0),
            ("km", 1000.0),
            ("mi", 1609.34),
            ("ft", 0.3048),
            ("KM", 1000.0),
        ])
    }

    /// A length in `unit`, between a metre and the size of the Earth (log-uniform).
    fn length(&mut self, scale: f64) -> String {
        let metres = 10f64.powf(self.uniform(0.0, 7.3));
        format!("{:.3}", metres / scale)
    }

    /// FROM... BY... [ASC|DESC] [COUNT n [ANY]] for GEOSEARCH / GEOSEARCHSTORE.
    fn search_args(&mut self) -> Args {
        let mut a = Args::new();
        if self.rng.chance(50) {
            a.extend(args!["FROMMEMBER", self.member()]);
        } else {
            let (lon, lat) = self.point();
            a.extend(args!["FROMLONLAT", lon, lat]);
        }
        let (unit, scale) = self.unit();
        if self.rng.chance(50) {
            a.extend(args!["BYRADIUS", self.length(scale), unit]);
        } else {
            a.extend(args!["BYBOX", self.length(scale), self.length(scale), unit]);
        }
        self.order_and_count(&mut a);
        a
    }

    fn order_and_count(&mut self, a: &mut Args) {
        match self.rng.below(10) {
            0..=2 => a.push(b"ASC".to_vec()),
            3..=4 => a.push(b"DESC".to_vec()),
            _ => {}
        }
        if self.rng.chance(40) {
            a.extend(args!["COUNT", self.rng.range(1, 25)]);
            if self.rng.chance(30) {
                a.push(b"ANY".to_vec());
            }
        }
    }

    fn with_options(&mut self, a: &mut Args) {
        for w in ["WITHCOORD", "WITHDIST", "WITHHASH"] {
            if self.rng.chance(35) {
                a.push(w.as_bytes().to_vec());
            }
        }
    }

    /// One command and how to compare its replies.
    fn next(&mut self) -> (Args, Check) {
        let r = self.rng.below(100);
        match r {
            0..=14 => {
                let mut a = args!["GEOADD", self.rng.pick(&self.sources).clone()];
                match self.rng.below(10) {
                    0 => a.push(b"NX".to_vec()),
                    1 => a.push(b"XX".to_vec()),
                    2 => a.push(b"CH".to_vec()),
                    3 => a.extend(args!["XX", "CH"]),
                    4 => a.extend(args!["NX", "CH"]),
                    _ => {}
                }
                for _ in 0..self.rng.range(1, 6) {
                    let (lon, lat) = if self.rng.chance(2) {
                        ("180.5".to_string(), "10".to_string())
                    } else {
                        self.point()
                    };
                    a.extend(args![lon, lat, self.member()]);
                }
                (a, Check::Exact)
            }
            15..=16 => {
                let k = self.rng.pick(&self.sources).clone();
                (args!["ZREM", k, self.member(), self.member()], Check::Exact)
            }
            17..=22 => {
                let mut a = args!["GEOPOS", self.source()];
                for _ in 0..self.rng.range(1, 5) {
                    a.push(self.member().into_bytes());
                }
                (a, Check::Exact)
            }
            23..=26 => {
                let mut a = args!["GEOHASH", self.source()];
                for _ in 0..self.rng.range(1, 5) {
                    a.push(self.member().into_bytes());
                }
                (a, Check::Exact)
            }
            27..=32 => {
                let mut a = args!["GEODIST", self.source(), self.member(), self.member()];
                if self.rng.chance(70) {
                    a.push(self.unit().0.as_bytes().to_vec());
                }
                (a, Check::Exact)
            }
            33..=34 => (args!["ZSCORE", self.source(), self.member()], Check::Exact),
            35..=59 => {
                let mut a = args!["GEOSEARCH", self.source()];
                a.extend(self.search_args());
                self.with_options(&mut a);
                (a, Check::Exact)
            }
            60..=69 => {
                let dest = self.rng.pick(&self.dests).clone();
                let mut a = args!["GEOSEARCHSTORE", dest, self.source()];
                a.extend(self.search_args());
                if self.rng.chance(40) {
                    a.push(b"STOREDIST".to_vec());
                }
                (a, Check::Exact)
            }
            70..=75 => {
                let dest = self.rng.pick(&self.dests).clone();
                (
                    args!["ZRANGE", dest, "0", "-1", "WITHSCORES"],
                    Check::Scores,
                )
            }
            76..=93 => {
                let by_member = self.rng.chance(50);
                let ro = self.rng.chance(30);
                let name = match (by_member, ro) {
                    (false, false) => "GEORADIUS",
                    (false, true) => "GEORADIUS_RO",
                    (true, false) => "GEORADIUSBYMEMBER",
                    (true, true) => "GEORADIUSBYMEMBER_RO",
                };
                let mut a = args![name, self.source()];
                if by_member {
                    a.push(self.member().into_bytes());
                } else {
                    let (lon, lat) = self.point();
                    a.extend(args![lon, lat]);
                }
                let (unit, scale) = self.unit();
                a.extend(args![self.length(scale), unit]);
                self.order_and_count(&mut a);
                if !ro && self.rng.chance(40) {
                    let dest = self.rng.pick(&self.dests).clone();
                    let kind = if self.rng.chance(50) {
                        "STORE"
                    } else {
                        "STOREDIST"
                    };
                    a.extend(args![kind, dest]);
                } else {
                    self.with_options(&mut a);
                }
                (a, Check::Exact)
            }
            94..=95 => {
                let dest = self.rng.pick(&self.dests).clone();
                (args!["ZSCORE", dest, self.member()], Check::Scores)
            }
            _ => {
                // Errors mixed in.
                let g = self.source();
                let a = match self.rng.below(6) {
                    0 => args![
                        "GEOSEARCH",
                        g,
                        "FROMMEMBER",
                        self.member(),
                        "BYRADIUS",
                        "-5",
                        "km"
                    ],
                    1 => args![
                        "GEOSEARCH",
                        g,
                        "FROMLONLAT",
                        "0",
                        "0",
                        "BYBOX",
                        "1",
                        "1",
                        "yd"
                    ],
                    2 => args![
                        "GEOSEARCH",
                        g,
                        "FROMLONLAT",
                        "0",
                        "0",
                        "BYRADIUS",
                        "1",
                        "km",
                        "ANY"
                    ],
                    3 => args!["GEORADIUS", g, "0", "0", "1", "km", "COUNT", "0"],
                    4 => args![
                        "GEOSEARCHSTORE",
                        "dst",
                        g,
                        "FROMLONLAT",
                        "0",
                        "0",
                        "BYRADIUS",
                        "1",
                        "km",
                        "WITHDIST"
                    ],
                    _ => args!["GEODIST", g, self.member(), self.member(), "furlong"],
                };
                (a, Check::Exact)
            }
        }
    }
}

fn random_seed(kite: &KiteServer, redis: &RedisServer, seed: u64, ops: usize, resp3: bool) {
    let label = format!(
        "seed {seed}, {}, {} vs redis-server; reproduce: KITE_GEO_SEEDS={seed} cargo test --test geo random",
        if resp3 { "RESP3" } else { "RESP2" },
        kite.name
    );
    let mut p = Pair::new(kite, redis, resp3, label);
    let keys = spread_keys(&format!("geo{seed}:"), 8);
    let mut gen = Gen {
        rng: Rng::new(seed),
        // Sources on shards 0, 1, 2 and destinations on 3, 0, 1, 2... (neighbours in
        // `keys` are on different shards).
        sources: keys[..3].to_vec(),
        dests: keys[3..].to_vec(),
    };
    // Fill the sources first, in batches.
    for src in gen.sources.clone() {
        for _ in 0..25 {
            let mut a = args!["GEOADD", src.as_str()];
            for _ in 0..gen.rng.range(5, 25) {
                let (lon, lat) = gen.point();
                a.extend(args![lon, lat, gen.member()]);
            }
            p.same(a);
        }
    }
    for _ in 0..ops {
        let (a, check) = gen.next();
        p.run(a, check);
    }
    for k in keys {
        p.scores(args!["ZRANGE", k, "0", "-1", "WITHSCORES"]);
    }
    print_reply_stats("KITE_GEO_STATS", seed, &p.stats);
}

fn random(threads: usize, seeds: &[u64]) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let ops = usize_from_env("KITE_GEO_OPS", 1500);
    for seed in seeds_from_env("KITE_GEO_SEEDS", seeds) {
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
// Scores and values across servers
// ---------------------------------------------------------------------------------------

/// A geo set DUMPed by redis-server (listpack and skiplist encodings) RESTOREs into the
/// server under test with the same positions, hashes and search results; and back.
fn dump_restore(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut kc = kite.client();
    let mut rc = redis.client();
    let mut gen = Gen {
        rng: Rng::new(99),
        sources: vec![],
        dests: vec![],
    };
    for (key, n) in [("small", 20usize), ("large", 250)] {
        let mut a = args!["GEOADD", key];
        for i in 0..n {
            let (lon, lat) = gen.point();
            a.extend(args![lon, lat, format!("m{i}")]);
        }
        assert_eq!(rc.cmd(&a), Resp::Integer(n as i64));
        let members: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
        let mut queries: Vec<Args> = Vec::new();
        let mut pos = args!["GEOPOS", "K"];
        pos.extend(members.iter().map(|m| m.as_bytes().to_vec()));
        queries.push(pos);
        let mut hash = args!["GEOHASH", "K"];
        hash.extend(members.iter().map(|m| m.as_bytes().to_vec()));
        queries.push(hash);
        queries.push(args!["ZRANGE", "K", "0", "-1", "WITHSCORES"]);
        for _ in 0..20 {
            let mut a = args!["GEOSEARCH", "K"];
            a.extend(gen.search_args());
            gen.with_options(&mut a);
            queries.push(a);
        }
        let on = |q: &Args, k: &str| -> Args {
            let mut q = q.clone();
            q[1] = k.as_bytes().to_vec();
            q
        };
        let want: Vec<Resp> = queries.iter().map(|q| rc.cmd(&on(q, key))).collect();
        // Redis -> server under test.
        let dump = rc.cmd(&["DUMP", key]);
        let restored = format!("{key}:from-redis");
        assert_eq!(
            kc.cmd(&[
                b"RESTORE".as_slice(),
                restored.as_bytes(),
                b"0",
                dump.as_bytes().unwrap()
            ]),
            Resp::ok()
        );
        for (q, w) in queries.iter().zip(&want) {
            let got = kc.cmd(&on(q, &restored));
            assert_eq!(&got, w, "{} on {restored}", fmt_cmd(q));
        }
        // Server under test (the restored copy, then re-DUMPed) -> Redis.
        let dump = kc.cmd(&["DUMP", restored.as_str()]);
        let back = format!("{key}:back");
        assert_eq!(
            rc.cmd(&[
                b"RESTORE".as_slice(),
                back.as_bytes(),
                b"0",
                dump.as_bytes().unwrap()
            ]),
            Resp::ok()
        );
        for (q, w) in queries.iter().zip(&want) {
            let got = rc.cmd(&on(q, &back));
            assert_eq!(&got, w, "{} on {back}", fmt_cmd(q));
        }
        // GEOADD on both sides from the same state agrees too.
        let mut a = args!["GEOADD", "K", "CH"];
        for i in 0..30 {
            let (lon, lat) = gen.point();
            a.extend(args![lon, lat, format!("m{}", i * 7)]);
        }
        assert_eq!(kc.cmd(&on(&a, &restored)), rc.cmd(&on(&a, key)));
        for q in &queries {
            assert_eq!(
                kc.cmd(&on(q, &restored)),
                rc.cmd(&on(q, key)),
                "{} after GEOADD",
                fmt_cmd(q)
            );
        }
    }
}

#[test]
fn dump_restore_both_ways_threads1() {
    dump_restore(1);
}

#[test]
fn dump_restore_both_ways_threads4() {
    dump_restore(4);
}

/// A client blocked in BZPOPMIN on the destination is served by GEOSEARCHSTORE and by
/// GEORADIUS ... STORE (source on another shard at --threads 4).
#[test]
fn store_wakes_blocked_client() {
    let kite = KiteServer::start(&[], 4);
    let keys = spread_keys("wake", 2);
    let (src, dst) = (keys[0].as_str(), keys[1].as_str());
    let mut c = kite.client();
    c.cmd(&["GEOADD", src, "1", "1", "a", "2", "2", "b"]);
    let mut blocked = kite.client();
    blocked.send(&["BZPOPMIN", dst, "10"]);
    // Wait until the server counts it as blocked.
    for _ in 0..500 {
        let info = c.cmd(&["INFO", "clients"]).as_string().unwrap_or_default();
        if info.lines().any(|l| l.trim_end() == "blocked_clients:1") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        c.cmd(&[
            "GEOSEARCHSTORE",
            dst,
            src,
            "FROMLONLAT",
            "1",
            "1",
            "BYRADIUS",
            "500",
            "km",
            "STOREDIST"
        ]),
        Resp::Integer(2)
    );
    let r = blocked.read();
    let v = r.as_array().unwrap_or_else(|| panic!("BZPOPMIN got {r}"));
    assert_eq!(v[0], Resp::bulk(dst));
    assert_eq!(v[1], Resp::bulk("a"));
    assert_eq!(c.cmd(&["ZCARD", dst]), Resp::Integer(1));
    c.cmd(&["DEL", dst]);
    blocked.send(&["BZPOPMIN", dst, "10"]);
    for _ in 0..500 {
        let info = c.cmd(&["INFO", "clients"]).as_string().unwrap_or_default();
        if info.lines().any(|l| l.trim_end() == "blocked_clients:1") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // An empty result stores nothing and wakes no one; a later STORE does.
    assert_eq!(
        c.cmd(&["GEORADIUS", src, "100", "50", "1", "km", "STORE", dst]),
        Resp::Integer(0)
    );
    assert_eq!(
        c.cmd(&["GEORADIUS", src, "1", "1", "500", "km", "STORE", dst]),
        Resp::Integer(2)
    );
    let r = blocked.read();
    let v = r.as_array().unwrap_or_else(|| panic!("BZPOPMIN got {r}"));
    assert_eq!(v[0], Resp::bulk(dst));
    assert_eq!(v[1], Resp::bulk("a"));
}
