//! The event loop seen from outside (docs/event-loop.md, "Tests the loop adds"):
//!
//! - replies come back in order when a pipeline reaches the server in many small reads
//!   cut in the middle of commands (`--threads 4`, keys on every thread);
//! - a client that does not read its large replies does not stall another client on
//!   the same thread, and still gets every reply in the end (normal clients have no
//!   output buffer limit by default, as in Redis);
//! - a connection that is moved to the thread owning its keys in the middle of its
//!   pipelines keeps its order (`INFO transactions` `migrations` shows that it moved);
//! - a sleeping thread is always woken for work sent to it: more threads than cores, at
//!   `park-yields` 0, 1 and 4, cross-thread commands, MSET/MGET, MULTI/EXEC and blocking
//!   pops served by pushes from other clients, every reply checked;
//! - the `park-yields` setting (flag and CONFIG GET/SET, range 0..=64).
//!
//! No timing assertions: every socket has a generous read timeout, so a lost wake-up or
//! a stall shows as a failed read, and every load loop is bounded by a count.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    assert_err_prefix, encode_command, fmt_cmd, free_port, info_field, kite_bin, shard_of,
    spread_keys, Client, KiteServer, Resp, Rng,
};

/// Read timeout of every connection here: long enough that only a real stall (a lost
/// wake-up, a connection never served again) reaches it.
const REPLY_WAIT: Duration = Duration::from_secs(20);

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";

type Cmd = Vec<Vec<u8>>;

fn cmd(parts: &[&str]) -> Cmd {
    parts.iter().map(|p| p.as_bytes().to_vec()).collect()
}

fn bulk(s: impl AsRef<[u8]>) -> Resp {
    Resp::bulk(s)
}

fn client(s: &KiteServer) -> Client {
    let mut c = s.client();
    c.set_timeout(Some(REPLY_WAIT));
    c
}

/// A reply for a failure message, cut short (some replies here are megabytes long).
fn short(r: &Resp) -> String {
    let text = match r {
        Resp::Bulk(b) if b.len() > 120 => format!("<bulk of {} bytes>", b.len()),
        other => other.to_string(),
    };
    if text.len() > 300 {
        let mut end = 300;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}... ({} chars)", &text[..end], text.len())
    } else {
        text
    }
}

fn short_cmd(c: &[Vec<u8>]) -> String {
    let shown: Vec<Vec<u8>> = c
        .iter()
        .map(|a| {
            if a.len() > 60 {
                format!("<{} bytes>", a.len()).into_bytes()
            } else {
                a.clone()
            }
        })
        .collect();
    fmt_cmd(&shown)
}

/// Sends `c`, reads its reply and checks it is exactly `expected`.
#[track_caller]
fn check(conn: &mut Client, c: &[Vec<u8>], expected: &Resp, ctx: &str) {
    conn.send(c);
    let got = conn
        .try_read()
        .unwrap_or_else(|e| panic!("{ctx}: no reply to `{}`: {e}", short_cmd(c)));
    assert!(
        &got == expected,
        "{ctx}: `{}` answered {}, expected {}",
        short_cmd(c),
        short(&got),
        short(expected)
    );
}

fn info_int(c: &mut Client, section: &str, field: &str) -> i64 {
    let v = info_field(c, section, field);
    v.parse()
        .unwrap_or_else(|_| panic!("{field} in INFO {section} is not an integer: {v}"))
}

/// `threads` keys `<prefix><n>`, the j-th on shard j of a `--threads threads` server.
fn keys_on_each_shard(prefix: &str, threads: usize) -> Vec<String> {
    let mut out: Vec<Option<String>> = vec![None; threads];
    let mut n = 0;
    while out.iter().any(|k| k.is_none()) {
        let key = format!("{prefix}{n}");
        let shard = shard_of(&key, threads);
        if out[shard].is_none() {
            out[shard] = Some(key);
        }
        n += 1;
    }
    out.into_iter().map(|k| k.unwrap()).collect()
}

/// A hashtag `<prefix><n>` whose keys (`{tag}...`) live on `shard` of `threads`.
fn tag_on_shard(prefix: &str, shard: usize, threads: usize) -> String {
    (0..)
        .map(|n| format!("{prefix}{n}"))
        .find(|t| shard_of(t, threads) == shard)
        .unwrap()
}

// ---------------------------------------------------------------------------
// A model of the few commands used here, to predict every reply exactly
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Val {
    Str(Vec<u8>),
    /// Head first.
    List(Vec<Vec<u8>>),
}

#[derive(Default)]
struct Model {
    keys: HashMap<Vec<u8>, Val>,
}

fn num(b: &[u8]) -> i64 {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("model: bad number {}", common::escape_bytes(b)))
}

impl Model {
    /// Applies `c` and returns the reply a Redis server gives. Only canonical integers
    /// and values starting with a letter are ever stored, so Rust's integer parsing
    /// agrees with Redis's here.
    fn apply(&mut self, c: &[Vec<u8>]) -> Resp {
        let name = String::from_utf8_lossy(&c[0]).to_ascii_uppercase();
        let a = &c[1..];
        let wrong = || Resp::Error(WRONGTYPE.into());
        match name.as_str() {
            "PING" if a.is_empty() => Resp::simple("PONG"),
            "PING" | "ECHO" => Resp::Bulk(a[0].clone()),
            "SET" => {
                self.keys.insert(a[0].clone(), Val::Str(a[1].clone()));
                Resp::ok()
            }
            "MSET" => {
                for pair in a.chunks(2) {
                    self.keys.insert(pair[0].clone(), Val::Str(pair[1].clone()));
                }
                Resp::ok()
            }
            "GET" => match self.keys.get(&a[0]) {
                None => Resp::NullBulk,
                Some(Val::Str(v)) => Resp::Bulk(v.clone()),
                Some(Val::List(_)) => wrong(),
            },
            "MGET" => Resp::Array(
                a.iter()
                    .map(|k| match self.keys.get(k) {
                        Some(Val::Str(v)) => Resp::Bulk(v.clone()),
                        _ => Resp::NullBulk,
                    })
                    .collect(),
            ),
            "INCR" => {
                let next = match self.keys.get(&a[0]) {
                    None => 1,
                    Some(Val::List(_)) => return wrong(),
                    Some(Val::Str(v)) => {
                        match std::str::from_utf8(v)
                            .ok()
                            .and_then(|s| s.parse::<i64>().ok())
                        {
                            Some(n) => n + 1,
                            None => return Resp::Error(NOT_INTEGER.into()),
                        }
                    }
                };
                self.keys
                    .insert(a[0].clone(), Val::Str(next.to_string().into_bytes()));
                Resp::Integer(next)
            }
            "LPUSH" | "RPUSH" => {
                let entry = self
                    .keys
                    .entry(a[0].clone())
                    .or_insert_with(|| Val::List(Vec::new()));
                let Val::List(l) = entry else {
                    return wrong();
                };
                for v in &a[1..] {
                    if name == "LPUSH" {
                        l.insert(0, v.clone());
                    } else {
                        l.push(v.clone());
                    }
                }
                Resp::Integer(l.len() as i64)
            }
            "LLEN" => match self.keys.get(&a[0]) {
                None => Resp::Integer(0),
                Some(Val::List(l)) => Resp::Integer(l.len() as i64),
                Some(Val::Str(_)) => wrong(),
            },
            "LPOP" => {
                let (out, now_empty) = match self.keys.get_mut(&a[0]) {
                    None => return Resp::NullBulk,
                    Some(Val::Str(_)) => return wrong(),
                    Some(Val::List(l)) => (l.remove(0), l.is_empty()),
                };
                if now_empty {
                    self.keys.remove(&a[0]);
                }
                Resp::Bulk(out)
            }
            "LINDEX" => match self.keys.get(&a[0]) {
                None => Resp::NullBulk,
                Some(Val::Str(_)) => wrong(),
                Some(Val::List(l)) => {
                    let mut i = num(&a[1]);
                    if i < 0 {
                        i += l.len() as i64;
                    }
                    if i < 0 || i >= l.len() as i64 {
                        Resp::NullBulk
                    } else {
                        Resp::Bulk(l[i as usize].clone())
                    }
                }
            },
            "LRANGE" => match self.keys.get(&a[0]) {
                None => Resp::Array(vec![]),
                Some(Val::Str(_)) => wrong(),
                Some(Val::List(l)) => {
                    let len = l.len() as i64;
                    let (mut start, mut stop) = (num(&a[1]), num(&a[2]));
                    if start < 0 {
                        start = (start + len).max(0);
                    }
                    if stop < 0 {
                        stop += len;
                    }
                    stop = stop.min(len - 1);
                    if start > stop || start >= len {
                        Resp::Array(vec![])
                    } else {
                        Resp::Array(
                            l[start as usize..=stop as usize]
                                .iter()
                                .map(|v| Resp::Bulk(v.clone()))
                                .collect(),
                        )
                    }
                }
            },
            "DEL" => {
                Resp::Integer(a.iter().filter(|k| self.keys.remove(*k).is_some()).count() as i64)
            }
            other => panic!("model: no command {other}"),
        }
    }
}

// ---------------------------------------------------------------------------
// 1. Replies in order across many reads
// ---------------------------------------------------------------------------

/// A value that is never an integer (starts with 'v'), binary, sometimes a few KB.
fn random_value(rng: &mut Rng) -> Vec<u8> {
    let len = if rng.chance(3) {
        rng.range(1000, 6000) as usize
    } else {
        rng.range(0, 40) as usize
    };
    let mut v = vec![b'v'];
    v.extend(rng.bytes(len));
    v
}

#[test]
fn replies_in_order_across_many_reads() {
    const COMMANDS: usize = 3000;
    let s = KiteServer::start(&[], 4);
    let mut rng = Rng::new(0xE7E7_1001);
    // Keys cycling over the four shards, in three pools that usually hold strings,
    // counters and lists; DEL and the odd cross-type command mix them up.
    let strs = spread_keys("el:s:", 12);
    let ctrs = spread_keys("el:c:", 8);
    let lists = spread_keys("el:l:", 8);
    let all: Vec<&String> = strs.iter().chain(&ctrs).chain(&lists).collect();

    let mut model = Model::default();
    let mut wire: Vec<u8> = Vec::new();
    // (what was sent, expected reply) per command, in order.
    let mut expected: Vec<(String, Resp)> = Vec::with_capacity(COMMANDS);
    for _ in 0..COMMANDS {
        let pick = |rng: &mut Rng, pool: &[String]| pool[rng.index(pool.len())].clone();
        let c: Cmd = match rng.below(100) {
            0..=13 => {
                let k = pick(&mut rng, &strs);
                vec![b"SET".to_vec(), k.into_bytes(), random_value(&mut rng)]
            }
            14..=25 => cmd(&["GET", &pick(&mut rng, &strs)]),
            26..=37 => cmd(&["INCR", &pick(&mut rng, &ctrs)]),
            38..=42 => cmd(&["GET", &pick(&mut rng, &ctrs)]),
            43..=45 => {
                let n = rng.range(-1000, 1000).to_string();
                cmd(&["SET", &pick(&mut rng, &ctrs), &n])
            }
            46..=55 => {
                let mut c = cmd(&[if rng.chance(50) { "LPUSH" } else { "RPUSH" }]);
                c.push(pick(&mut rng, &lists).into_bytes());
                for _ in 0..rng.range(1, 4) {
                    c.push(random_value(&mut rng));
                }
                c
            }
            56..=61 => cmd(&["LLEN", &pick(&mut rng, &lists)]),
            62..=64 => cmd(&["LPOP", &pick(&mut rng, &lists)]),
            65..=66 => cmd(&["LINDEX", &pick(&mut rng, &lists), "-1"]),
            67..=68 => cmd(&["LRANGE", &pick(&mut rng, &lists), "0", "2"]),
            69..=73 => {
                // DEL of 1-3 distinct keys, usually on different shards.
                let mut c = cmd(&["DEL"]);
                let n = rng.range(1, 3) as usize;
                let mut chosen: Vec<&String> = Vec::new();
                while chosen.len() < n {
                    let k = all[rng.index(all.len())];
                    if !chosen.contains(&k) {
                        chosen.push(k);
                    }
                }
                c.extend(chosen.iter().map(|k| k.as_bytes().to_vec()));
                c
            }
            74..=76 => {
                // A command against the wrong type (or a missing key).
                match rng.below(3) {
                    0 => cmd(&["GET", &pick(&mut rng, &lists)]),
                    1 => cmd(&["INCR", &pick(&mut rng, &strs)]),
                    _ => cmd(&["LLEN", &pick(&mut rng, &strs)]),
                }
            }
            77..=80 => {
                let keys: Vec<String> = (0..rng.range(2, 5))
                    .map(|_| pick(&mut rng, &strs))
                    .collect();
                let mut c = cmd(&["MGET"]);
                c.extend(keys.into_iter().map(String::into_bytes));
                c
            }
            81..=86 => cmd(&["PING"]),
            87..=90 => vec![b"PING".to_vec(), random_value(&mut rng)],
            91..=95 => vec![b"ECHO".to_vec(), random_value(&mut rng)],
            _ => {
                // Inline commands, cut across reads like the rest.
                if rng.chance(50) {
                    wire.extend_from_slice(b"PING\r\n");
                    expected.push(("PING (inline)".into(), Resp::simple("PONG")));
                } else {
                    let word = format!("w{}", rng.below(1_000_000));
                    wire.extend_from_slice(format!("ECHO {word}\r\n").as_bytes());
                    expected.push((format!("ECHO {word} (inline)"), bulk(&word)));
                }
                continue;
            }
        };
        let reply = model.apply(&c);
        wire.extend_from_slice(&encode_command(&c));
        expected.push((short_cmd(&c), reply));
    }
    let total = expected.len();

    let mut conn = client(&s);
    let mut writer: TcpStream = conn.try_clone_stream();
    // A write that cannot go on (the reader gave up, so the server stopped reading us)
    // fails instead of blocking for ever.
    writer.set_write_timeout(Some(REPLY_WAIT)).unwrap();
    // Replies are read while the requests are still being written, as a client would.
    let reader = thread::spawn(move || -> Result<Client, String> {
        for (i, (sent, want)) in expected.iter().enumerate() {
            let got = conn
                .try_read()
                .map_err(|e| format!("reply {i} of {total} (to `{sent}`): {e}"))?;
            if &got != want {
                return Err(format!(
                    "reply {i} of {total} (to `{sent}`) is {}, expected {}",
                    short(&got),
                    short(want)
                ));
            }
        }
        Ok(conn)
    });

    let mut pos = 0;
    let mut writes = 0usize;
    let mut write_error = None;
    while pos < wire.len() {
        let n = (rng.range(1, 700) as usize).min(wire.len() - pos);
        if let Err(e) = writer.write_all(&wire[pos..pos + n]) {
            write_error = Some(format!("write at byte {pos} of {}: {e}", wire.len()));
            break;
        }
        pos += n;
        writes += 1;
        if rng.chance(15) {
            thread::sleep(Duration::from_micros(rng.range(50, 1500) as u64));
        }
    }
    let outcome = reader.join().expect("reader thread panicked");
    let mut conn = match outcome {
        Ok(conn) => conn,
        Err(e) => panic!("{e} (written: {pos} bytes in {writes} writes; {write_error:?})"),
    };
    assert!(write_error.is_none(), "{write_error:?}");
    assert!(writes > 100, "the requests went in {writes} writes only");
    eprintln!(
        "replies_in_order_across_many_reads: {total} replies, {} bytes in {writes} writes",
        wire.len()
    );
    // The connection is still in step afterwards.
    assert_eq!(conn.cmd(&["ECHO", "after"]), bulk("after"));
    // And the data is what the model says, read back on a fresh connection.
    let mut other = client(&s);
    for k in &all {
        let key = k.as_bytes().to_vec();
        let probe = match model.keys.get(&key) {
            Some(Val::List(_)) => vec![b"LRANGE".to_vec(), key, b"0".to_vec(), b"-1".to_vec()],
            _ => vec![b"GET".to_vec(), key],
        };
        let want = model.apply(&probe);
        check(&mut other, &probe, &want, "final state");
    }
}

// ---------------------------------------------------------------------------
// 2. A slow reader does not stall others
// ---------------------------------------------------------------------------

#[test]
fn slow_reader_does_not_stall_others() {
    const BIG: usize = 8 << 20;
    const GETS: usize = 12;
    const ROUNDS: usize = 300;
    let s = KiteServer::start(&[], 1);
    let mut a = client(&s);
    let mut b = client(&s);
    let mut rng = Rng::new(0x510E);
    let big = rng.bytes(BIG);
    assert_eq!(
        a.cmd(&[b"SET".as_slice(), b"big".as_slice(), big.as_slice()]),
        Resp::ok()
    );
    let a_id = a.cmd(&["CLIENT", "ID"]).as_int().expect("CLIENT ID");

    // A asks for 96 MB and reads nothing: far more than the socket buffers hold, so the
    // server is left with output it cannot write to A.
    let mut gets = Vec::new();
    for _ in 0..GETS {
        gets.extend_from_slice(&encode_command(&["GET", "big"]));
    }
    a.send_raw(&gets);
    // Bounded wait until the server has started on A's GETs (CLIENT LIST shows the last
    // command each connection ran).
    let deadline = Instant::now() + REPLY_WAIT;
    loop {
        let list = b.cmd(&["CLIENT", "LIST", "ID", &a_id.to_string()]);
        let text = list.as_string().unwrap_or_default();
        if text.contains("cmd=get") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server never ran A's GETs: {text}"
        );
        thread::sleep(Duration::from_millis(10));
    }

    // B, on the same (only) thread, is served all along.
    let mut model = Model::default();
    for i in 0..ROUNDS {
        let key = format!("b:{}", i % 37);
        let set = vec![
            b"SET".to_vec(),
            key.clone().into_bytes(),
            random_value(&mut rng),
        ];
        let want = model.apply(&set);
        check(&mut b, &set, &want, &format!("B round {i}"));
        let get = cmd(&["GET", &key]);
        let want = model.apply(&get);
        check(&mut b, &get, &want, &format!("B round {i}"));
        check(
            &mut b,
            &cmd(&["PING"]),
            &Resp::simple("PONG"),
            &format!("B round {i}"),
        );
        if i % 50 == 0 {
            check(
                &mut b,
                &cmd(&["STRLEN", "big"]),
                &Resp::Integer(BIG as i64),
                &format!("B round {i}"),
            );
        }
    }
    // A was neither dropped nor cut short: every reply, whole and in order.
    assert_eq!(
        info_int(&mut b, "stats", "client_output_buffer_limit_disconnections"),
        0
    );
    for i in 0..GETS {
        let r = a
            .try_read()
            .unwrap_or_else(|e| panic!("A's reply {i} of {GETS}: {e}"));
        match &r {
            Resp::Bulk(v) if v.len() == BIG => {
                assert!(v == &big, "A's reply {i}: the value came back changed")
            }
            other => panic!("A's reply {i}: {}", short(other)),
        }
    }
    assert_eq!(a.cmd(&["PING"]), Resp::simple("PONG"));
}

// ---------------------------------------------------------------------------
// 3. A migrating connection keeps its order
// ---------------------------------------------------------------------------

#[test]
fn migrating_connection_keeps_order() {
    const PHASES: usize = 6;
    const ROUNDS: usize = 4;
    const PIPELINE: usize = 40;
    let s = KiteServer::start(&["--migrate-connections", "yes"], 2);
    let mut admin = client(&s);
    // One hashtag per thread. Whichever thread the connection starts on, a phase on the
    // other thread's tag makes it move there (eight keyed commands in a row for one
    // other thread, docs/architecture.md); the phases alternate, so it moves again and
    // again, each time in the middle of a pipeline.
    let tags = [tag_on_shard("mv", 0, 2), tag_on_shard("mv", 1, 2)];
    let before = info_int(&mut admin, "transactions", "migrations");

    let mut conn = client(&s);
    let mut rng = Rng::new(0x316);
    let mut model = Model::default();
    let mut checked = 0usize;
    for phase in 0..PHASES {
        let tag = &tags[phase % 2];
        let k = |name: &str| format!("{{{tag}}}:{name}");
        for round in 0..ROUNDS {
            // Two pipelines in flight at once, then their replies.
            let mut batch: Vec<(Cmd, Resp)> = Vec::new();
            let mut wire = Vec::new();
            for _ in 0..2 {
                for _ in 0..PIPELINE {
                    let c: Cmd = match rng.below(10) {
                        0..=2 => {
                            let mut c = cmd(&["SET", &k(&format!("s{}", rng.below(5)))]);
                            c.push(random_value(&mut rng));
                            c
                        }
                        3..=4 => cmd(&["GET", &k(&format!("s{}", rng.below(5)))]),
                        5 => cmd(&["INCR", &k("n")]),
                        6 => cmd(&["RPUSH", &k("l"), &format!("i{}", rng.below(1000))]),
                        7 => cmd(&["LINDEX", &k("l"), "-1"]),
                        8 => cmd(&["MGET", &k("s0"), &k("s1"), &k("s2"), &k("n")]),
                        _ => cmd(&["LLEN", &k("l")]),
                    };
                    let want = model.apply(&c);
                    wire.extend_from_slice(&encode_command(&c));
                    batch.push((c, want));
                }
            }
            conn.send_raw(&wire);
            for (i, (c, want)) in batch.iter().enumerate() {
                let got = conn.try_read().unwrap_or_else(|e| {
                    panic!(
                        "phase {phase} round {round} reply {i} (`{}`): {e}",
                        short_cmd(c)
                    )
                });
                assert!(
                    &got == want,
                    "phase {phase} round {round} reply {i}: `{}` answered {}, expected {}",
                    short_cmd(c),
                    short(&got),
                    short(want)
                );
                checked += 1;
            }
            // Reads of what was just written, one at a time.
            for c in [
                cmd(&["GET", &k(&format!("s{}", rng.below(5)))]),
                cmd(&["LRANGE", &k("l"), "-3", "-1"]),
                cmd(&["GET", &k("n")]),
            ] {
                let want = model.apply(&c);
                check(
                    &mut conn,
                    &c,
                    &want,
                    &format!("phase {phase} round {round}"),
                );
                checked += 1;
            }
        }
    }
    let after = info_int(&mut admin, "transactions", "migrations");
    assert!(
        after > before,
        "the connection was never migrated (migrations {before} -> {after}), so this \
         test did not cover a move"
    );
    assert!(checked > PHASES * ROUNDS * PIPELINE * 2);
    eprintln!(
        "migrating_connection_keeps_order: {checked} replies, migrations {before} -> {after}"
    );
    // A connection opened now sees the same data.
    let mut other = client(&s);
    for tag in &tags {
        for name in ["s0", "s1", "s2", "s3", "s4", "n"] {
            let c = cmd(&["GET", &format!("{{{tag}}}:{name}")]);
            let want = model.apply(&c);
            check(&mut other, &c, &want, "final state");
        }
        let c = cmd(&["LRANGE", &format!("{{{tag}}}:l"), "0", "-1"]);
        let want = model.apply(&c);
        check(&mut other, &c, &want, "final state");
    }
}

// ---------------------------------------------------------------------------
// 4. Sleeping threads are always woken
// ---------------------------------------------------------------------------

const WAKE_THREADS: usize = 8;
const WAKE_CLIENTS: usize = 12; // even: clients 2p and 2p+1 are a blocking pair
const WAKE_ITERATIONS: usize = 400;

/// One client's bounded loop. Keys `c<who>:...` are this client's alone, so their
/// replies are predicted exactly; `shared:n<m>` are INCRed by everyone; `q:<pair>:<j>:*`
/// are the blocking pair's queues, each used once.
fn wake_client(mut c: Client, who: usize, seed: u64) {
    let mut rng = Rng::new(seed ^ (who as u64 * 0x9E37));
    let mine = keys_on_each_shard(&format!("c{who}:k"), WAKE_THREADS);
    let counters = keys_on_each_shard(&format!("c{who}:n"), WAKE_THREADS);
    let shared = keys_on_each_shard("shared:n", WAKE_THREADS);
    let pair = who / 2;
    let popper = who.is_multiple_of(2);
    let mut model = Model::default();
    let ctx = |j: usize| format!("client {who} iteration {j}");
    // Three distinct shards.
    let three = |rng: &mut Rng| {
        let mut s = vec![];
        while s.len() < 3 {
            let x = rng.index(WAKE_THREADS);
            if !s.contains(&x) {
                s.push(x);
            }
        }
        s
    };
    for j in 0..WAKE_ITERATIONS {
        // SET and GET on varied keys.
        let key = &mine[rng.index(WAKE_THREADS)];
        let set = cmd(&["SET", key, &format!("v{who}-{j}-{}", rng.below(1000))]);
        let want = model.apply(&set);
        check(&mut c, &set, &want, &ctx(j));
        let get = cmd(&["GET", &mine[rng.index(WAKE_THREADS)]]);
        let want = model.apply(&get);
        check(&mut c, &get, &want, &ctx(j));
        // INCR: own counters exactly, shared ones in range.
        let incr = cmd(&["INCR", &counters[rng.index(WAKE_THREADS)]]);
        let want = model.apply(&incr);
        check(&mut c, &incr, &want, &ctx(j));
        let sk = &shared[j % WAKE_THREADS];
        let r = c.cmd(&["INCR", sk]);
        match r.as_int() {
            Some(n) if n >= 1 && n <= (WAKE_CLIENTS * WAKE_ITERATIONS) as i64 => {}
            _ => panic!("{}: INCR {sk} answered {}", ctx(j), short(&r)),
        }
        // MSET / MGET over three threads.
        if j % 4 == 1 {
            let s3 = three(&mut rng);
            let mut mset = cmd(&["MSET"]);
            for &x in &s3 {
                mset.push(mine[x].clone().into_bytes());
                mset.push(format!("m{who}-{j}-{x}").into_bytes());
            }
            let want = model.apply(&mset);
            check(&mut c, &mset, &want, &ctx(j));
            let mut mget = cmd(&["MGET"]);
            for &x in s3.iter().rev() {
                mget.push(mine[x].clone().into_bytes());
            }
            mget.push(counters[rng.index(WAKE_THREADS)].clone().into_bytes());
            let want = model.apply(&mget);
            check(&mut c, &mget, &want, &ctx(j));
        }
        // MULTI/EXEC over three threads.
        if j % 5 == 2 {
            let s3 = three(&mut rng);
            let queued = [
                cmd(&["SET", &mine[s3[0]], &format!("x{who}-{j}")]),
                cmd(&["INCR", &counters[s3[1]]]),
                cmd(&["GET", &mine[s3[2]]]),
                cmd(&["GET", &mine[s3[0]]]),
            ];
            check(&mut c, &cmd(&["MULTI"]), &Resp::ok(), &ctx(j));
            for q in &queued {
                check(&mut c, q, &Resp::simple("QUEUED"), &ctx(j));
            }
            let want = Resp::Array(queued.iter().map(|q| model.apply(q)).collect());
            check(&mut c, &cmd(&["EXEC"]), &want, &ctx(j));
        }
        // A blocking pop served by the partner's push (whichever comes first).
        if j % 8 == 5 {
            let qa = format!("q:{pair}:{j}:a");
            let qb = format!("q:{pair}:{j}:b");
            let target = if (j / 8) % 3 == 0 { &qa } else { &qb };
            let value = format!("job-{pair}-{j}");
            if popper {
                let pop = if (j / 8) % 2 == 0 { "BLPOP" } else { "BRPOP" };
                let want = Resp::Array(vec![bulk(target), bulk(&value)]);
                check(&mut c, &cmd(&[pop, &qa, &qb, "0"]), &want, &ctx(j));
            } else {
                // Every other time the push comes a little late, so the popper has
                // usually blocked (and its thread gone to sleep) by then.
                if (j / 8) % 2 == 1 {
                    thread::sleep(Duration::from_millis(2));
                }
                check(
                    &mut c,
                    &cmd(&["LPUSH", target, &value]),
                    &Resp::Integer(1),
                    &ctx(j),
                );
            }
        }
        // Now and then an idle gap, so the server's threads run out of work and sleep.
        if j % 40 == 39 {
            thread::sleep(Duration::from_millis(1 + rng.below(3)));
        }
    }
    // Everything this client wrote is there.
    for k in mine.iter().chain(&counters) {
        let get = cmd(&["GET", k]);
        let want = model.apply(&get);
        check(&mut c, &get, &want, &format!("client {who} at the end"));
    }
}

fn sleeping_threads_are_always_woken(park_yields: &str) {
    let s = KiteServer::start(&["--park-yields", park_yields], WAKE_THREADS);
    let mut admin = client(&s);
    assert_eq!(
        admin.cmd(&["CONFIG", "GET", "park-yields"]),
        Resp::Array(vec![bulk("park-yields"), bulk(park_yields)])
    );
    let seed = 0x3A4E_0000 + park_yields.parse::<u64>().unwrap();
    let handles: Vec<_> = (0..WAKE_CLIENTS)
        .map(|who| {
            let c = client(&s);
            thread::Builder::new()
                .name(format!("wake-client-{who}"))
                .spawn(move || wake_client(c, who, seed))
                .unwrap()
        })
        .collect();
    let mut failures = Vec::new();
    for (who, h) in handles.into_iter().enumerate() {
        if let Err(e) = h.join() {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("client {who}: {msg}"));
        }
    }
    assert!(
        failures.is_empty(),
        "park-yields {park_yields}, --threads {WAKE_THREADS}:\n{}",
        failures.join("\n")
    );
    // Totals: each client INCRed shared key m once for every iteration j with
    // j % threads == m.
    let shared = keys_on_each_shard("shared:n", WAKE_THREADS);
    for (m, k) in shared.iter().enumerate() {
        let per_client = (0..WAKE_ITERATIONS)
            .filter(|j| j % WAKE_THREADS == m)
            .count();
        let want = (per_client * WAKE_CLIENTS).to_string();
        assert_eq!(admin.cmd(&["GET", k]), bulk(&want), "shared counter {k}");
    }
    // Every pushed job was popped exactly once, and nobody is left blocked.
    assert_eq!(admin.cmd(&["KEYS", "q:*"]), Resp::Array(vec![]));
    assert_eq!(info_int(&mut admin, "clients", "blocked_clients"), 0);
    eprintln!(
        "park-yields {park_yields}: mailbox_messages {} mailbox_wakeups {} migrations {}",
        info_int(&mut admin, "transactions", "mailbox_messages"),
        info_int(&mut admin, "transactions", "mailbox_wakeups"),
        info_int(&mut admin, "transactions", "migrations"),
    );
}

#[test]
fn sleeping_threads_are_always_woken_park_yields_0() {
    sleeping_threads_are_always_woken("0");
}

#[test]
fn sleeping_threads_are_always_woken_park_yields_1() {
    sleeping_threads_are_always_woken("1");
}

#[test]
fn sleeping_threads_are_always_woken_park_yields_4() {
    sleeping_threads_are_always_woken("4");
}

// ---------------------------------------------------------------------------
// 5. The park-yields setting
// ---------------------------------------------------------------------------

fn park_yields(c: &mut Client) -> Resp {
    c.cmd(&["CONFIG", "GET", "park-yields"])
}

fn park_yields_is(v: &str) -> Resp {
    Resp::Array(vec![bulk("park-yields"), bulk(v)])
}

/// A few commands whose keys are on both threads of a `--threads 2` server.
fn cross_thread_round_trips(c: &mut Client, tag: &str) {
    let keys = keys_on_each_shard(&format!("py:{tag}:"), 2);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(c.cmd(&["SET", k, &i.to_string()]), Resp::ok());
    }
    assert_eq!(
        c.cmd(&["MGET", &keys[0], &keys[1]]),
        Resp::Array(vec![bulk("0"), bulk("1")])
    );
    assert_eq!(c.cmd(&["INCR", &keys[1]]), Resp::Integer(2));
}

#[test]
fn park_yields_setting() {
    let s = KiteServer::start(&[], 2);
    let mut c = client(&s);
    assert_eq!(park_yields(&mut c), park_yields_is("1"), "default");
    for v in ["0", "4", "64", "1"] {
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "park-yields", v]),
            Resp::ok(),
            "CONFIG SET park-yields {v}"
        );
        assert_eq!(park_yields(&mut c), park_yields_is(v));
        cross_thread_round_trips(&mut c, v);
    }
    assert_eq!(c.cmd(&["CONFIG", "SET", "park-yields", "4"]), Resp::ok());
    for bad in ["65", "-1", "1000", "abc", "1.5", "", "99999999999999999999"] {
        let r = c.cmd(&["CONFIG", "SET", "park-yields", bad]);
        assert_err_prefix(&r, "ERR");
        assert_eq!(
            park_yields(&mut c),
            park_yields_is("4"),
            "a refused CONFIG SET park-yields {bad:?} left the value alone"
        );
    }
    cross_thread_round_trips(&mut c, "after");
    drop(c);
    drop(s);

    let s = KiteServer::start(&["--park-yields", "0"], 2);
    let mut c = client(&s);
    assert_eq!(park_yields(&mut c), park_yields_is("0"), "--park-yields 0");
    cross_thread_round_trips(&mut c, "flag");
    drop(c);
    drop(s);

    // An out-of-range or non-numeric flag stops the server at start-up.
    for bad in ["65", "x"] {
        let dir = std::env::temp_dir().join(format!(
            "kite-event-loop-badflag-{}-{bad}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let dir_arg = dir.to_string_lossy().into_owned();
        let port = free_port().to_string();
        let mut child = Command::new(kite_bin())
            .args([
                "--port",
                port.as_str(),
                "--bind",
                "127.0.0.1",
                "--threads",
                "2",
            ])
            .args(["--save", "", "--dir", dir_arg.as_str()])
            .args(["--park-yields", bad])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kite");
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(20));
        };
        let _ = std::fs::remove_dir_all(&dir);
        match status {
            Some(st) => assert!(!st.success(), "--park-yields {bad} exited with success"),
            None => panic!("--park-yields {bad} was accepted: the server kept running"),
        }
    }
}
