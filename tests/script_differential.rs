//! Random scripts, compared with redis-server reply by reply: each script runs a random
//! sequence of commands through `redis.pcall` over declared keys, undeclared keys of the
//! same queue tag, and undeclared keys that live on other shards, so the fast path,
//! restarts, escalations and the global path all run; plain commands come in between.
//! At the end every key's contents are compared.
//!
//! Reproduce one seed: `KITE_SCRIPT_SEEDS=5 cargo test --release --test script_differential`.

#[macro_use]
mod common;

use common::*;

/// Keys: a BullMQ-style queue whose keys share a shard, a hashtag group, and loose keys
/// spread over the shards.
const KEYS: &[&str] = &[
    "bull:qa:wait",
    "bull:qa:meta",
    "bull:qa:1",
    "bull:qb:wait",
    "bull:qb:1",
    "{t}:a",
    "{t}:b",
    "s1",
    "s2",
    "s3",
    "s4",
];

fn lua_str(s: &str) -> String {
    format!("'{s}'")
}

/// One random command as Lua arguments of `redis.pcall`, on key expression `k` (a
/// KEYS[i] reference or a literal). Multi-key commands only pair keys of one tag, or are
/// the per-key kinds Kite splits across shards.
fn command(rng: &mut Rng, k: &str, other: &str, same_tag: Option<&str>) -> String {
    let n = rng.below(1000);
    match rng.below(18) {
        0 => format!("'SET', {k}, 'v{n}'"),
        1 => format!("'GET', {k}"),
        2 => format!("'INCR', {k}"),
        3 => format!("'APPEND', {k}, 'x{n}'"),
        4 => format!("'DEL', {k}"),
        5 => format!("'LPUSH', {k}, 'e{n}', 'f{n}'"),
        6 => format!("'RPOP', {k}"),
        7 => format!("'LRANGE', {k}, 0, -1"),
        8 => format!("'HSET', {k}, 'f{}', 'v{n}'", n % 4),
        9 => format!("'HINCRBY', {k}, 'c', {}", n % 7),
        10 => format!("'HGETALL', {k}"),
        11 => format!("'SADD', {k}, 'm{}'", n % 5),
        12 => format!("'SCARD', {k}"),
        13 => format!("'ZADD', {k}, {}, 'z{}'", n % 50, n % 6),
        14 => format!("'ZRANGE', {k}, 0, -1, 'WITHSCORES'"),
        15 => format!("'EXISTS', {k}, {other}"),
        16 => format!("'MGET', {k}, {other}"),
        _ => match same_tag {
            Some(t) => format!("'RPOPLPUSH', {k}, {t}"),
            None => format!("'TYPE', {k}"),
        },
    }
}

/// A random script over declared keys (KEYS[1..]) and literal undeclared ones.
fn script(rng: &mut Rng) -> (String, Vec<String>) {
    let declared: Vec<String> = (0..1 + rng.below(2))
        .map(|_| KEYS[rng.below(KEYS.len() as u64) as usize].to_string())
        .collect();
    let mut body = String::from("local r = {}\n");
    for _ in 0..1 + rng.below(6) {
        let (k, raw) = if rng.below(2) == 0 {
            let i = rng.below(declared.len() as u64) as usize;
            (format!("KEYS[{}]", i + 1), declared[i].clone())
        } else {
            let raw = KEYS[rng.below(KEYS.len() as u64) as usize].to_string();
            (lua_str(&raw), raw)
        };
        let other = lua_str(KEYS[rng.below(KEYS.len() as u64) as usize]);
        let same_tag = if raw.starts_with("{t}") {
            Some(lua_str(if raw == "{t}:a" { "{t}:b" } else { "{t}:a" }))
        } else if raw.starts_with("bull:qa:") {
            Some(lua_str("bull:qa:wait"))
        } else {
            None
        };
        let cmd = command(rng, &k, &other, same_tag.as_deref());
        body.push_str(&format!(
            "do local v = redis.pcall({cmd}) if v == nil then v = 'nil' end r[#r+1] = v end\n"
        ));
    }
    body.push_str("return r\n");
    (body, declared)
}

fn dump(c: &mut Client) -> Vec<(String, Resp)> {
    let mut out = Vec::new();
    for k in KEYS {
        let ty = c.cmd(&["TYPE", k]).as_string().unwrap_or_default();
        let v = match ty.as_str() {
            "string" => c.cmd(&["GET", k]),
            "list" => c.cmd(&["LRANGE", k, "0", "-1"]),
            "hash" => {
                let mut f = c.cmd(&["HGETALL", k]).as_array().unwrap().to_vec();
                let mut pairs: Vec<(Resp, Resp)> = Vec::new();
                while f.len() >= 2 {
                    let v = f.pop().unwrap();
                    let k = f.pop().unwrap();
                    pairs.push((k, v));
                }
                pairs.sort_by_key(|(k, _)| k.to_string());
                Resp::Array(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect())
            }
            "set" => {
                let mut m = c.cmd(&["SMEMBERS", k]).as_array().unwrap().to_vec();
                m.sort_by_key(|r| r.to_string());
                Resp::Array(m)
            }
            "zset" => c.cmd(&["ZRANGE", k, "0", "-1", "WITHSCORES"]),
            _ => Resp::Null,
        };
        out.push((format!("{k} ({ty})"), v));
    }
    out
}

/// Sorts the members of HGETALL/SMEMBERS-like arrays inside a script's result, whose
/// order differs between encodings; other replies stay as they are.
fn normalize(script: &str, r: &Resp) -> Resp {
    if !(script.contains("HGETALL")) {
        return r.clone();
    }
    match r {
        Resp::Array(items) => Resp::Array(
            items
                .iter()
                .map(|i| match i {
                    Resp::Array(inner) if inner.len() % 2 == 0 && !inner.is_empty() => {
                        let mut v = inner.clone();
                        v.sort_by_key(|x| x.to_string());
                        Resp::Array(v)
                    }
                    other => other.clone(),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn run(threads: usize, seed: u64) {
    let kite = KiteServer::start(&[], threads);
    let redis = RedisServer::start();
    let mut k = kite.client();
    let mut r = redis.client();
    let mut rng = Rng::new(seed);
    let steps = usize_from_env("KITE_SCRIPT_STEPS", 400);
    let mut mismatches = Vec::new();
    for step in 0..steps {
        let (args, label): (Vec<String>, String) = if rng.below(4) == 0 {
            // A plain command between scripts.
            let key = KEYS[rng.below(KEYS.len() as u64) as usize];
            let n = rng.below(100);
            let a = match rng.below(3) {
                0 => vec!["SET".into(), key.into(), format!("p{n}")],
                1 => vec!["DEL".into(), key.into()],
                _ => vec!["LPUSH".into(), key.into(), format!("p{n}")],
            };
            let label = a.join(" ");
            (a, label)
        } else {
            let (body, declared) = script(&mut rng);
            let mut a = vec!["EVAL".to_string(), body.clone(), declared.len().to_string()];
            a.extend(declared);
            (a, body)
        };
        let got = k.cmd(&args);
        let want = r.cmd(&args);
        let (got_n, want_n) = (normalize(&label, &got), normalize(&label, &want));
        if got_n != want_n {
            mismatches.push(format!(
                "seed {seed} step {step}: {}\n  kite:  {got}\n  redis: {want}",
                fmt_cmd(&args)
            ));
            if mismatches.len() > 5 {
                break;
            }
        }
    }
    let (dk, dr) = (dump(&mut k), dump(&mut r));
    for ((name, a), (_, b)) in dk.iter().zip(dr.iter()) {
        if a != b {
            mismatches.push(format!(
                "seed {seed} final {name}\n  kite:  {a}\n  redis: {b}"
            ));
        }
    }
    let info = k.cmd(&["INFO", "transactions"]).as_string().unwrap();
    let paths: Vec<&str> = info.lines().filter(|l| l.starts_with("scripts_")).collect();
    println!("threads {threads} seed {seed}: {}", paths.join(" "));
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn random_scripts_match_redis_at_one_thread() {
    for seed in seeds_from_env("KITE_SCRIPT_SEEDS", &[1, 2]) {
        run(1, seed);
    }
}

#[test]
fn random_scripts_match_redis_at_four_threads() {
    for seed in seeds_from_env("KITE_SCRIPT_SEEDS", &[3, 4, 5]) {
        run(4, seed);
    }
}
