//! The event loop seen from outside (docs/event-loop.md, "Tests the loop adds"):
//!
//! - replies come back in order when a pipeline reaches the server in many small reads
//!   cut in the middle of commands (`--threads 4`, keys on every thread);
//! - a client that does not read its large replies does not stall another client on
//!   the same thread, and still gets every reply in the end (normal clients have no
//!   output buffer limit by default, as in Redis);
//! - a connection that is moved to the thread owning its keys in the middle of its
//!   pipelines keeps its order (`INFO transactions` `migrations` shows that it moved),
//!   and is still reachable on its new thread by what must find its socket;
//! - a sleeping thread is always woken for work sent to it: more threads than cores, at
//!   `park-yields` 0, 1 and 4, cross-thread commands, MSET/MGET, MULTI/EXEC and blocking
//!   pops served by pushes from other clients, every reply checked;
//! - the `park-yields` setting (flag and CONFIG GET/SET, range 0..=64);
//! - hops that wait together for a busy thread go home as one push (`mailbox_pushes`);
//! - replies sent in batches through io_uring ("Replies of one pass in one system
//!   call"): the `event-loop` setting and its INFO fields and counters, order across a
//!   reader that stalls (short sends), small and large groups, pushes, blocking
//!   commands, QUIT, a busy script's -BUSY, many connections at once, and CLIENT KILL of
//!   a connection with megabytes unsent. Every one passes with `KITE_EVENT_LOOP=epoll`;
//! - a request read ahead in the same pass as an endless script is still answered by the
//!   busy hook ("Reads of a pass in one system call").
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

/// Moves `conn` (of a two-thread server started with `--migrate-connections yes`) so
/// that it ends on the thread of the second of the two tags returned: whichever thread
/// it starts on, `per_tag` SETs for each thread's tag in turn move it at least once.
fn move_to_second_thread(
    admin: &mut Client,
    conn: &mut Client,
    prefix: &str,
    per_tag: usize,
) -> [String; 2] {
    let tags = [tag_on_shard(prefix, 0, 2), tag_on_shard(prefix, 1, 2)];
    let before = info_int(admin, "transactions", "migrations");
    for tag in &tags {
        for i in 0..per_tag {
            assert_eq!(
                conn.cmd(&["SET", &format!("{{{tag}}}:k{i}"), "v"]),
                Resp::ok()
            );
        }
    }
    let after = info_int(admin, "transactions", "migrations");
    assert!(
        after > before,
        "the connection never moved ({before} -> {after})"
    );
    tags
}

/// A connection that moved to another thread is found there by what must reach its
/// socket (a connection's state holds no socket: net lists it by client id): a blocked
/// pop after the move still sees the client leave, and DEBUG (`enable-debug-command
/// local`) still sees a loopback peer.
#[test]
fn a_moved_connection_is_reachable_on_its_new_thread() {
    let s = KiteServer::start(&["--migrate-connections", "yes"], 2);
    let mut admin = client(&s);
    let mut conn = client(&s);
    let tags = move_to_second_thread(&mut admin, &mut conn, "mvb", 12);
    assert_eq!(conn.cmd(&["DEBUG", "SLEEP", "0"]), Resp::ok());
    let blocked_before = info_int(&mut admin, "clients", "blocked_clients");
    conn.send_raw(&encode_command(&cmd(&[
        "BLPOP",
        &format!("{{{}}}:q", tags[1]),
        "0",
    ])));
    wait_blocked(&mut admin, blocked_before + 1);
    drop(conn);
    wait_blocked(&mut admin, blocked_before);
    // Nothing was popped by the client that left.
    let q = format!("{{{}}}:q", tags[1]);
    assert_eq!(admin.cmd(&["RPUSH", &q, "job"]), Resp::Integer(1));
    assert_eq!(admin.cmd(&["LLEN", &q]), Resp::Integer(1));
}

/// A connection's first line is checked for an HTTP request line once, on the thread
/// that accepted it: after a move, an inline request that happens to end in ` HTTP/1.1`
/// is still a RESP request, answered as Redis answers it.
#[test]
fn a_moved_connection_is_not_taken_for_http() {
    let s = KiteServer::start(&["--migrate-connections", "yes"], 2);
    let mut admin = client(&s);
    let mut conn = client(&s);
    // Eight commands for a thread's keys move the connection there after the eighth,
    // so the line below is the first the connection sends on its new thread.
    move_to_second_thread(&mut admin, &mut conn, "mvh", 8);
    conn.send_raw(b"GET /x HTTP/1.1\r\n");
    assert_eq!(
        conn.read(),
        Resp::Error("ERR wrong number of arguments for 'get' command".into())
    );
    assert_eq!(conn.cmd(&["PING"]), Resp::Simple("PONG".into()));
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

/// Hops that reach a thread while it is busy wait in its mailbox together; when it runs
/// them, their results go home as one push per thread (docs/event-loop.md, "Hops of a
/// pass travel together"), so INFO's `mailbox_pushes` falls below `mailbox_messages`,
/// and every client still gets its own replies in order.
#[test]
fn results_of_hops_run_together_go_home_as_one_push() {
    let s = KiteServer::start(&[], 2);
    let mut admin = client(&s);
    let keys = keys_on_each_shard("outbox:", 2);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(admin.cmd(&["SET", k, &i.to_string()]), Resp::ok());
    }
    let pipeline: Vec<u8> = [
        encode_command(&cmd(&["GET", &keys[0]])),
        encode_command(&cmd(&["GET", &keys[1]])),
    ]
    .concat();
    // A thread asleep in DEBUG SLEEP cannot take its mail: the clients on the other
    // thread each send it a hop (whichever thread sleeps, one of the two GETs is for its
    // shard), and they all wait there until it wakes. A second try covers a sleep that
    // began only after the clients' hops had been served.
    for attempt in 0..3 {
        let messages = info_int(&mut admin, "transactions", "mailbox_messages");
        let pushes = info_int(&mut admin, "transactions", "mailbox_pushes");
        let mut sleeper = client(&s);
        sleeper.send_raw(&encode_command(&cmd(&["DEBUG", "SLEEP", "1"])));
        thread::sleep(Duration::from_millis(100));
        let mut clients: Vec<Client> = (0..8).map(|_| client(&s)).collect();
        for c in &mut clients {
            c.send_raw(&pipeline);
        }
        for (i, c) in clients.iter_mut().enumerate() {
            assert_eq!(c.read(), bulk("0"), "client {i}, GET of the key on shard 0");
            assert_eq!(c.read(), bulk("1"), "client {i}, GET of the key on shard 1");
        }
        assert_eq!(sleeper.read(), Resp::ok());
        let messages = info_int(&mut admin, "transactions", "mailbox_messages") - messages;
        let pushes = info_int(&mut admin, "transactions", "mailbox_pushes") - pushes;
        assert!(
            pushes <= messages,
            "{pushes} pushes for {messages} messages"
        );
        if pushes < messages {
            return;
        }
        eprintln!("try {attempt}: {messages} messages in as many pushes; again");
    }
    panic!("hops that waited together for a sleeping thread never went home together");
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
        let status = start_expecting_failure(
            &format!("badflag-{bad}"),
            &["--threads", "2", "--park-yields", bad],
        );
        match status {
            Some(st) => assert!(!st.success(), "--park-yields {bad} exited with success"),
            None => panic!("--park-yields {bad} was accepted: the server kept running"),
        }
    }
}

// ---------------------------------------------------------------------------
// 6. Replies of one pass in one system call (docs/event-loop.md, "Replies of one
//    pass in one system call")
// ---------------------------------------------------------------------------
//
// Every test below passes with `--event-loop epoll` too (KITE_EVENT_LOOP=epoll); only
// the checks of the io_uring counters depend on the mode, and they look at
// `kite_reply_sends` first.

/// The value of `--event-loop` this test process passes to every server it starts.
fn env_event_loop() -> Option<String> {
    std::env::var("KITE_EVENT_LOOP")
        .ok()
        .filter(|v| !v.is_empty())
}

/// True when `c`'s server sends replies through io_uring. A server that writes them one
/// by one must either have been told to (`event-loop epoll`) or say why the ring could
/// not be set up, so a silent fallback never passes.
fn sends_through_io_uring(c: &mut Client) -> bool {
    let sends = info_field(c, "server", "kite_reply_sends");
    let error = info_field(c, "server", "kite_io_uring_error");
    let mode = c.cmd(&["CONFIG", "GET", "event-loop"]);
    let mode = match mode.as_array() {
        Some([_, v]) => v.as_string().unwrap_or_default(),
        _ => panic!("CONFIG GET event-loop answered {mode}"),
    };
    match (mode.as_str(), sends.as_str()) {
        (_, "io_uring") => {
            assert_eq!(mode, "auto", "io_uring sends with event-loop {mode}");
            assert!(
                error.is_empty(),
                "kite_reply_sends:io_uring, yet kite_io_uring_error:{error}"
            );
            true
        }
        ("epoll", "write") => false,
        ("auto", "write") => {
            assert!(
                !error.is_empty(),
                "event-loop auto fell back to write with no kite_io_uring_error"
            );
            eprintln!("io_uring could not be set up here: {error}");
            false
        }
        _ => panic!("event-loop {mode}: kite_reply_sends:{sends} kite_io_uring_error:{error}"),
    }
}

fn event_loop_is(v: &str) -> Resp {
    Resp::Array(vec![bulk("event-loop"), bulk(v)])
}

/// Starts kite with `args` (port, bind, data directory and save are added) and returns
/// how it exited, or None if it was still running (and killed) after ten seconds.
fn start_expecting_failure(name: &str, args: &[&str]) -> Option<std::process::ExitStatus> {
    let dir = std::env::temp_dir().join(format!("kite-event-loop-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_arg = dir.to_string_lossy().into_owned();
    let port = free_port().to_string();
    let mut child = Command::new(kite_bin())
        .args(["--port", port.as_str(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--dir", dir_arg.as_str()])
        .args(args)
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
    status
}

/// A few pipelines on `n` connections, every reply checked (keys `<prefix>...`).
fn traffic_on_connections(s: &KiteServer, prefix: &str, n: usize) {
    let mut conns: Vec<Client> = (0..n).map(|_| client(s)).collect();
    for round in 0..5 {
        for (i, c) in conns.iter_mut().enumerate() {
            let key = format!("{prefix}:{i}");
            let cmds = vec![
                cmd(&["INCR", &key]),
                cmd(&["ECHO", &format!("e{i}-{round}")]),
                cmd(&["PING"]),
            ];
            let got = c.pipeline(&cmds);
            assert_eq!(
                got,
                vec![
                    Resp::Integer(round + 1),
                    bulk(format!("e{i}-{round}")),
                    Resp::simple("PONG")
                ],
                "connection {i} round {round}"
            );
        }
    }
}

#[test]
fn event_loop_setting_and_send_counters() {
    // Default settings (unless the whole run is forced to one mode).
    if env_event_loop().is_none() {
        let s = KiteServer::start(&[], 2);
        let mut c = client(&s);
        assert_eq!(
            c.cmd(&["CONFIG", "GET", "event-loop"]),
            event_loop_is("auto")
        );
        sends_through_io_uring(&mut c);
    }

    // auto: io_uring (or a fallback that says why), and replies go through batches.
    let s = KiteServer::start(&["--event-loop", "auto"], 2);
    let mut c = client(&s);
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "event-loop"]),
        event_loop_is("auto")
    );
    let uring = sends_through_io_uring(&mut c);
    let batches_before = info_int(&mut c, "transactions", "send_batches");
    let sends_before = info_int(&mut c, "transactions", "batched_sends");
    let short_before = info_int(&mut c, "transactions", "short_sends");
    traffic_on_connections(&s, "set:auto", 6);
    let batches = info_int(&mut c, "transactions", "send_batches");
    let sends = info_int(&mut c, "transactions", "batched_sends");
    let short_sends = info_int(&mut c, "transactions", "short_sends");
    eprintln!(
        "event-loop auto (io_uring {uring}): send_batches {batches_before} -> {batches}, \
         batched_sends {sends_before} -> {sends}, short_sends {short_before} -> {short_sends}"
    );
    if uring {
        assert!(
            sends >= sends_before + 30,
            "30 pipelines on 6 connections, yet batched_sends went {sends_before} -> {sends}"
        );
        assert!(batches > batches_before, "send_batches stayed at {batches}");
        assert!(
            batches <= sends,
            "more batches ({batches}) than replies sent through them ({sends})"
        );
    } else {
        assert_eq!(
            (batches, sends, short_sends),
            (0, 0, 0),
            "no ring, no batches"
        );
    }
    // Not changeable at run time; the value stays.
    for v in ["epoll", "auto"] {
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "event-loop", v]),
            Resp::Error(
                "ERR CONFIG SET failed (possibly related to argument 'event-loop') - \
                 can't set immutable config"
                    .into()
            ),
            "CONFIG SET event-loop {v}"
        );
    }
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "event-loop"]),
        event_loop_is("auto")
    );
    assert_eq!(sends_through_io_uring(&mut c), uring);
    drop(c);
    drop(s);

    // epoll: replies written one by one, no batch ever.
    let s = KiteServer::start(&["--event-loop", "epoll"], 2);
    let mut c = client(&s);
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "event-loop"]),
        event_loop_is("epoll")
    );
    assert_eq!(info_field(&mut c, "server", "kite_reply_sends"), "write");
    assert!(!sends_through_io_uring(&mut c));
    traffic_on_connections(&s, "set:epoll", 6);
    for field in ["send_batches", "batched_sends", "short_sends"] {
        assert_eq!(
            info_int(&mut c, "transactions", field),
            0,
            "{field} with epoll"
        );
    }
    assert_err_prefix(
        &c.cmd(&["CONFIG", "SET", "event-loop", "auto"]),
        "ERR CONFIG SET failed",
    );
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "event-loop"]),
        event_loop_is("epoll")
    );
    drop(c);
    drop(s);

    // An unknown value stops the server at start-up.
    for bad in ["bogus", "1", "EPOLLX"] {
        match start_expecting_failure("badmode", &["--threads", "1", "--event-loop", bad]) {
            Some(st) => assert!(!st.success(), "--event-loop {bad} exited with success"),
            None => panic!("--event-loop {bad} was accepted: the server kept running"),
        }
    }
}

// ---------------------------------------------------------------------------

/// A value of `len` random bytes that starts with 'v'.
fn value_of(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = vec![b'v'];
    v.extend(rng.bytes(len - 1));
    v
}

/// Reads `expected` replies in order from `conn`, checking each exactly.
fn read_expected(conn: &mut Client, expected: &[(String, Resp)], ctx: &str) {
    let total = expected.len();
    for (i, (sent, want)) in expected.iter().enumerate() {
        let got = conn
            .try_read()
            .unwrap_or_else(|e| panic!("{ctx}: reply {i} of {total} (to `{sent}`): {e}"));
        assert!(
            &got == want,
            "{ctx}: reply {i} of {total} (to `{sent}`) is {}, expected {}",
            short(&got),
            short(want)
        );
    }
}

/// A client that keeps working while another connection is stalled: SET/INCR/GET on
/// its own keys (one on each of `threads` threads) and PING, `rounds` times.
fn keep_working(c: &mut Client, who: &str, threads: usize, rounds: usize, start: usize) {
    let keys = keys_on_each_shard(&format!("{who}:n"), threads);
    for i in 0..rounds {
        let ctx = format!("{who} round {}", start + i);
        check(c, &cmd(&["PING"]), &Resp::simple("PONG"), &ctx);
        let k = &keys[(start + i) % threads];
        let want = ((start + i) / threads + 1) as i64;
        check(c, &cmd(&["INCR", k]), &Resp::Integer(want), &ctx);
    }
}

#[test]
fn replies_keep_order_across_a_stalled_reader() {
    const GETS: usize = 500;
    const VALUE: usize = 48_000; // each reply well under 64 KiB; 24 MB in all
    let s = KiteServer::start(&[], 2);
    let mut admin = client(&s);
    let uring = sends_through_io_uring(&mut admin);
    let short_before = info_int(&mut admin, "transactions", "short_sends");
    let mut rng = Rng::new(0x057A_11ED);
    let bigs = keys_on_each_shard("stall:big", 2);
    let values: Vec<Vec<u8>> = bigs.iter().map(|_| value_of(&mut rng, VALUE)).collect();
    for (k, v) in bigs.iter().zip(&values) {
        assert_eq!(
            admin.cmd(&[b"SET".as_slice(), k.as_bytes(), v.as_slice()]),
            Resp::ok()
        );
    }

    // One write per GET (with its markers): each group of replies is under 64 KiB, so
    // with io_uring it goes through the batch until the socket is full. Each chunk ends
    // with `INCR stall:step`, so the writer can wait until the server has run one chunk
    // before it writes the next: the groups before the stall are one chunk each.
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut expected: Vec<(String, Resp)> = Vec::new();
    let mut counter = 0;
    for i in 0..GETS {
        let mut chunk = Vec::new();
        let which = rng.index(2);
        chunk.extend_from_slice(&encode_command(&["GET", &bigs[which]]));
        expected.push((
            format!("GET {} #{i}", bigs[which]),
            Resp::Bulk(values[which].clone()),
        ));
        chunk.extend_from_slice(&encode_command(&["INCR", "stall:step"]));
        expected.push((format!("INCR step #{i}"), Resp::Integer(i as i64 + 1)));
        if i % 3 == 0 {
            chunk.extend_from_slice(&encode_command(&["INCR", "stall:counter"]));
            counter += 1;
            expected.push((format!("INCR #{i}"), Resp::Integer(counter)));
        }
        if i % 5 == 0 {
            let m = format!("m{i}");
            chunk.extend_from_slice(&encode_command(&["ECHO", &m]));
            expected.push((format!("ECHO {m}"), bulk(&m)));
        }
        chunks.push(chunk);
    }

    let mut slow = client(&s);
    let mut writer = slow.try_clone_stream();
    writer.set_write_timeout(Some(REPLY_WAIT)).unwrap();
    let mut watch = client(&s);
    let write_all = thread::spawn(move || -> Result<usize, String> {
        // Paced until the server stops running the slow reader's commands (its output
        // is stalled) or 300 ms pass with no progress; then the rest in one go.
        let mut paced = 0;
        for (i, chunk) in chunks.iter().enumerate() {
            writer
                .write_all(chunk)
                .map_err(|e| format!("writing request chunk {i}: {e}"))?;
            if paced < i {
                continue;
            }
            let deadline = Instant::now() + Duration::from_millis(300);
            loop {
                let step = watch.cmd(&["GET", "stall:step"]).parse_int().unwrap_or(0);
                if step > i as i64 {
                    paced = i + 1;
                    break;
                }
                if Instant::now() > deadline {
                    break;
                }
                thread::sleep(Duration::from_micros(50));
            }
        }
        Ok(paced)
    });

    // Others are served all along, on both threads.
    let mut others: Vec<Client> = (0..3).map(|_| client(&s)).collect();
    for (j, o) in others.iter_mut().enumerate() {
        keep_working(o, &format!("stall:other{j}"), 2, 100, 0);
    }
    let paced = write_all
        .join()
        .expect("writer thread panicked")
        .unwrap_or_else(|e| panic!("{e}"));
    // The slow reader has still read nothing; the others go on.
    for (j, o) in others.iter_mut().enumerate() {
        keep_working(o, &format!("stall:other{j}"), 2, 100, 100);
        check(
            o,
            &cmd(&["GET", &bigs[j % 2]]),
            &Resp::Bulk(values[j % 2].clone()),
            "other",
        );
    }

    read_expected(&mut slow, &expected, "stalled reader");
    assert_eq!(slow.cmd(&["ECHO", "after"]), bulk("after"));
    assert_eq!(
        slow.cmd(&["GET", "stall:counter"]),
        bulk(counter.to_string())
    );
    let short_after = info_int(&mut admin, "transactions", "short_sends");
    eprintln!(
        "replies_keep_order_across_a_stalled_reader: io_uring {uring}, {paced} of {GETS} \
         chunks run before the stall, short_sends {short_before} -> {short_after}, \
         batched_sends {}",
        info_int(&mut admin, "transactions", "batched_sends")
    );
    // Whether the send that found the socket full was a batched one (`short_sends`) is
    // not asserted here: at two threads the writer's pacing can let two groups meet in
    // one turn, and a group over 64 KiB is written directly (seen in CI). The test
    // below checks that counter where the pacing is exact.
    let _ = (uring, short_before, short_after);
}

/// Small groups (batched) and groups over 64 KiB (written at once) alternate on one
/// connection, read while being written: nothing overtakes.
#[test]
fn small_and_large_reply_groups_keep_order() {
    const ROUNDS: usize = 150;
    let s = KiteServer::start(&[], 2);
    let mut admin = client(&s);
    let mut rng = Rng::new(0x6401);
    let keys = keys_on_each_shard("mix:huge", 2);
    let huge: Vec<Vec<u8>> = keys.iter().map(|_| value_of(&mut rng, 100_000)).collect();
    for (k, v) in keys.iter().zip(&huge) {
        assert_eq!(
            admin.cmd(&[b"SET".as_slice(), k.as_bytes(), v.as_slice()]),
            Resp::ok()
        );
    }
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut expected: Vec<(String, Resp)> = Vec::new();
    let mut n = 0;
    for i in 0..ROUNDS {
        let mut chunk = Vec::new();
        for j in 0..rng.range(1, 6) {
            let m = format!("s{i}-{j}");
            chunk.extend_from_slice(&encode_command(&["ECHO", &m]));
            expected.push((format!("ECHO {m}"), bulk(&m)));
        }
        n += 1;
        chunk.extend_from_slice(&encode_command(&["INCR", "mix:n"]));
        expected.push((format!("INCR #{n}"), Resp::Integer(n)));
        chunks.push(chunk);
        if rng.chance(50) {
            let which = rng.index(2);
            chunks.push(encode_command(&["GET", &keys[which]]));
            expected.push((
                format!("GET {}", keys[which]),
                Resp::Bulk(huge[which].clone()),
            ));
        }
    }
    let mut conn = client(&s);
    let mut writer = conn.try_clone_stream();
    writer.set_write_timeout(Some(REPLY_WAIT)).unwrap();
    let reader = thread::spawn(move || {
        read_expected(&mut conn, &expected, "mixed groups");
        conn
    });
    for (i, chunk) in chunks.iter().enumerate() {
        writer
            .write_all(chunk)
            .unwrap_or_else(|e| panic!("writing chunk {i}: {e}"));
        if rng.chance(20) {
            thread::sleep(Duration::from_micros(rng.range(20, 500) as u64));
        }
    }
    let mut conn = reader.join().expect("reader failed");
    assert_eq!(conn.cmd(&["PING"]), Resp::simple("PONG"));
}

// ---------------------------------------------------------------------------

fn pubsub_msg(kind: &str, ch: &str, payload: Resp) -> Resp {
    Resp::Array(vec![bulk(kind), bulk(ch), payload])
}

#[test]
fn replies_before_subscribe_confirmation_and_messages() {
    let s = KiteServer::start(&[], 2);
    let mut publisher = client(&s);

    // Replies made before SUBSCRIBE in the same pipeline, then its confirmation, then
    // the message published once the subscription is seen.
    let mut sub = client(&s);
    let mut wire = Vec::new();
    for c in [
        cmd(&["SET", "ps:a", "1"]),
        cmd(&["GET", "ps:a"]),
        cmd(&["SUBSCRIBE", "ps:ch"]),
    ] {
        wire.extend_from_slice(&encode_command(&c));
    }
    sub.send_raw(&wire);
    assert_eq!(sub.read(), Resp::ok(), "SET before SUBSCRIBE");
    assert_eq!(sub.read(), bulk("1"), "GET before SUBSCRIBE");
    assert_eq!(
        sub.read(),
        pubsub_msg("subscribe", "ps:ch", Resp::Integer(1)),
        "SUBSCRIBE confirmation"
    );
    assert_eq!(
        publisher.cmd(&["PUBLISH", "ps:ch", "hello"]),
        Resp::Integer(1)
    );
    assert_eq!(sub.read(), pubsub_msg("message", "ps:ch", bulk("hello")));

    // Another connection pipelines commands and PUBLISHes among them: its own replies in
    // order, the messages in order.
    const N: usize = 150;
    let mut wire = Vec::new();
    let mut expected = Vec::new();
    for i in 0..N {
        wire.extend_from_slice(&encode_command(&["INCR", "ps:n"]));
        expected.push((format!("INCR #{i}"), Resp::Integer(i as i64 + 1)));
        wire.extend_from_slice(&encode_command(&["PUBLISH", "ps:ch", &format!("x{i}")]));
        expected.push((format!("PUBLISH x{i}"), Resp::Integer(1)));
        wire.extend_from_slice(&encode_command(&["ECHO", &format!("e{i}")]));
        expected.push((format!("ECHO e{i}"), bulk(format!("e{i}"))));
    }
    publisher.send_raw(&wire);
    read_expected(&mut publisher, &expected, "pipelined PUBLISH");
    for i in 0..N {
        let got = sub
            .try_read()
            .unwrap_or_else(|e| panic!("message x{i}: {e}"));
        assert_eq!(got, pubsub_msg("message", "ps:ch", bulk(format!("x{i}"))));
    }

    // The subscriber pipelines PINGs and more SUBSCRIBEs while messages keep coming from
    // another thread: its own replies in order, the messages in order.
    const PINGS: usize = 300;
    let port = s.port;
    let pub_thread = thread::spawn(move || {
        let mut p = Client::connect(port);
        p.set_timeout(Some(REPLY_WAIT));
        for i in 0..PINGS {
            let r = p.cmd(&["PUBLISH", "ps:ch", &format!("y{i}")]);
            assert_eq!(r, Resp::Integer(1), "PUBLISH y{i}");
            if i % 16 == 0 {
                thread::sleep(Duration::from_micros(200));
            }
        }
    });
    let mut own: Vec<Resp> = Vec::new();
    let mut wire = Vec::new();
    let mut subscribed = 1;
    for i in 0..PINGS {
        wire.extend_from_slice(&encode_command(&["PING", &format!("p{i}")]));
        own.push(Resp::Array(vec![bulk("pong"), bulk(format!("p{i}"))]));
        if i % 60 == 59 {
            subscribed += 1;
            let ch = format!("ps:extra{i}");
            wire.extend_from_slice(&encode_command(&["SUBSCRIBE", &ch]));
            own.push(pubsub_msg("subscribe", &ch, Resp::Integer(subscribed)));
        }
    }
    for piece in wire.chunks(500) {
        sub.send_raw(piece);
    }
    let (mut next_own, mut next_msg) = (0, 0);
    while next_own < own.len() || next_msg < PINGS {
        let got = sub.try_read().unwrap_or_else(|e| {
            panic!("subscriber: {next_own} own replies and {next_msg} messages read: {e}")
        });
        let is_message = got
            .as_array()
            .and_then(|a| a.first())
            .is_some_and(|k| k == &bulk("message"));
        if is_message {
            assert_eq!(
                got,
                pubsub_msg("message", "ps:ch", bulk(format!("y{next_msg}"))),
                "message {next_msg}"
            );
            next_msg += 1;
        } else {
            assert!(next_own < own.len(), "an extra reply {}", short(&got));
            assert_eq!(got, own[next_own], "own reply {next_own}");
            next_own += 1;
        }
    }
    pub_thread.join().expect("publisher failed");
    assert_eq!(
        sub.cmd(&["UNSUBSCRIBE", "ps:ch"]),
        pubsub_msg("unsubscribe", "ps:ch", Resp::Integer(subscribed - 1))
    );
}

#[test]
fn replies_before_resp3_push() {
    let s = KiteServer::start(&[], 2);
    let mut c = client(&s);
    let hello = c.cmd(&["HELLO", "3"]);
    assert!(matches!(hello, Resp::Map(_)), "HELLO 3 answered {hello}");
    let mut wire = Vec::new();
    for c in [
        cmd(&["SET", "p3:a", "1"]),
        cmd(&["GET", "p3:a"]),
        cmd(&["SUBSCRIBE", "p3:ch"]),
        cmd(&["INCR", "p3:a"]),
    ] {
        wire.extend_from_slice(&encode_command(&c));
    }
    c.send_raw(&wire);
    assert_eq!(c.read(), Resp::ok());
    assert_eq!(c.read(), bulk("1"));
    assert_eq!(
        c.read(),
        Resp::Push(vec![bulk("subscribe"), bulk("p3:ch"), Resp::Integer(1)])
    );
    assert_eq!(c.read(), Resp::Integer(2));
    let mut p = client(&s);
    assert_eq!(p.cmd(&["PUBLISH", "p3:ch", "hi"]), Resp::Integer(1));
    assert_eq!(
        c.read(),
        Resp::Push(vec![bulk("message"), bulk("p3:ch"), bulk("hi")])
    );
    // Replies to a pipeline and messages published meanwhile from another thread: each
    // kind in its own order.
    const N: usize = 200;
    let port = s.port;
    let publisher = thread::spawn(move || {
        let mut p = Client::connect(port);
        p.set_timeout(Some(REPLY_WAIT));
        for i in 0..N {
            assert_eq!(
                p.cmd(&["PUBLISH", "p3:ch", &format!("z{i}")]),
                Resp::Integer(1)
            );
        }
    });
    let wire: Vec<u8> = (0..N)
        .flat_map(|_| encode_command(&["INCR", "p3:a"]))
        .collect();
    for piece in wire.chunks(300) {
        c.send_raw(piece);
    }
    let (mut replies, mut messages) = (0, 0);
    while replies < N || messages < N {
        let got = c
            .try_read()
            .unwrap_or_else(|e| panic!("{replies} replies and {messages} messages read: {e}"));
        if let Resp::Push(_) = got {
            assert_eq!(
                got,
                Resp::Push(vec![
                    bulk("message"),
                    bulk("p3:ch"),
                    bulk(format!("z{messages}"))
                ]),
                "message {messages}"
            );
            messages += 1;
        } else {
            assert_eq!(got, Resp::Integer(3 + replies as i64), "INCR {replies}");
            replies += 1;
        }
    }
    publisher.join().expect("publisher failed");
    assert_eq!(c.cmd(&["GET", "p3:a"]), bulk((N + 2).to_string()));
}

// ---------------------------------------------------------------------------

/// Waits (bounded) until INFO clients shows `n` blocked clients.
fn wait_blocked(admin: &mut Client, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let b = info_int(admin, "clients", "blocked_clients");
        if b == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "blocked_clients stayed {b}, expected {n}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn replies_before_a_blocking_result() {
    let s = KiteServer::start(&[], 2);
    let mut admin = client(&s);
    // The string key and the list on different threads.
    let k = tag_on_shard("bk:k", 0, 2);
    let q = tag_on_shard("bk:q", 1, 2);
    let mut c = client(&s);
    let mut wire = Vec::new();
    for x in [
        cmd(&["SET", &k, "v"]),
        cmd(&["GET", &k]),
        cmd(&["BLPOP", &q, "10"]),
        cmd(&["ECHO", "after"]),
    ] {
        wire.extend_from_slice(&encode_command(&x));
    }
    c.send_raw(&wire);
    // The replies made before BLPOP arrive while it is still blocked.
    assert_eq!(c.read(), Resp::ok(), "SET before BLPOP");
    assert_eq!(c.read(), bulk("v"), "GET before BLPOP");
    wait_blocked(&mut admin, 1);
    let mut pusher = client(&s);
    assert_eq!(pusher.cmd(&["RPUSH", &q, "x"]), Resp::Integer(1));
    assert_eq!(c.read(), Resp::Array(vec![bulk(&q), bulk("x")]), "BLPOP");
    assert_eq!(c.read(), bulk("after"), "ECHO after BLPOP");

    // And with a timeout instead of a push.
    let q2 = tag_on_shard("bk:q2", 0, 2);
    let mut wire = Vec::new();
    for x in [
        cmd(&["SET", &k, "w"]),
        cmd(&["GET", &k]),
        cmd(&["BLPOP", &q2, "0.3"]),
        cmd(&["GET", &k]),
    ] {
        wire.extend_from_slice(&encode_command(&x));
    }
    c.send_raw(&wire);
    assert_eq!(c.read(), Resp::ok());
    assert_eq!(c.read(), bulk("w"));
    assert_eq!(c.read(), Resp::NullArray, "BLPOP timed out");
    assert_eq!(c.read(), bulk("w"));
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    wait_blocked(&mut admin, 0);
}

// ---------------------------------------------------------------------------

#[test]
fn quit_after_a_pipeline_sends_every_reply_first() {
    let s = KiteServer::start(&[], 2);
    let keys = keys_on_each_shard("quit:k", 2);
    let mut rng = Rng::new(0x0017);

    // 100 small commands, then QUIT, in one write.
    let mut c = client(&s);
    let mut wire = Vec::new();
    let mut expected = Vec::new();
    for i in 0..100 {
        let x = match i % 4 {
            0 => cmd(&["INCR", &keys[0]]),
            1 => cmd(&["INCR", &keys[1]]),
            2 => cmd(&["ECHO", &format!("q{i}")]),
            _ => cmd(&["GET", &keys[i % 8 / 4]]),
        };
        let want = match i % 4 {
            0 | 1 => Resp::Integer(i as i64 / 4 + 1),
            2 => bulk(format!("q{i}")),
            _ => bulk(((i / 4) + 1).to_string()),
        };
        wire.extend_from_slice(&encode_command(&x));
        expected.push((short_cmd(&x), want));
    }
    wire.extend_from_slice(&encode_command(&["QUIT"]));
    c.send_raw(&wire);
    read_expected(&mut c, &expected, "before QUIT");
    assert_eq!(c.read(), Resp::ok(), "QUIT");
    let (rest, closed) = c.read_raw_until_close(REPLY_WAIT);
    assert!(closed, "the server did not close after QUIT");
    assert!(rest.is_empty(), "{} bytes after QUIT's +OK", rest.len());

    // Large replies still waiting to be sent when QUIT is read: all of them arrive.
    let big: Vec<Vec<u8>> = keys.iter().map(|_| value_of(&mut rng, 40_000)).collect();
    let mut admin = client(&s);
    for (k, v) in keys.iter().zip(&big) {
        assert_eq!(
            admin.cmd(&[b"SET".as_slice(), k.as_bytes(), v.as_slice()]),
            Resp::ok()
        );
    }
    for round in 0..3 {
        let mut c = client(&s);
        let mut wire = Vec::new();
        let mut expected = Vec::new();
        for i in 0..100 {
            let which = (i + round) % 2;
            wire.extend_from_slice(&encode_command(&["GET", &keys[which]]));
            expected.push((format!("GET #{i}"), Resp::Bulk(big[which].clone())));
            wire.extend_from_slice(&encode_command(&["ECHO", &format!("r{round}-{i}")]));
            expected.push((format!("ECHO #{i}"), bulk(format!("r{round}-{i}"))));
        }
        wire.extend_from_slice(&encode_command(&["QUIT"]));
        c.send_raw(&wire);
        if round == 1 {
            // Let the server get far ahead of the reader first.
            thread::sleep(Duration::from_millis(200));
        }
        read_expected(
            &mut c,
            &expected,
            &format!("large replies before QUIT, round {round}"),
        );
        assert_eq!(c.read(), Resp::ok(), "QUIT");
        let (rest, closed) = c.read_raw_until_close(REPLY_WAIT);
        assert!(closed, "the server did not close after QUIT");
        assert!(rest.is_empty(), "{} bytes after QUIT's +OK", rest.len());
    }
    assert_eq!(admin.cmd(&["PING"]), Resp::simple("PONG"));
}

// ---------------------------------------------------------------------------

/// A script that runs about `ms` milliseconds by TIME, calling TIME at most
/// `max_calls` times (so it ends even if TIME stood still), and returns the calls made.
fn busy_script(ms: u64, max_calls: i64) -> String {
    format!(
        "local function now() local t = redis.call('TIME') \
         return tonumber(t[1]) * 1000000 + tonumber(t[2]) end \
         local start = now() local calls = 0 \
         while calls < {max_calls} do calls = calls + 1 \
         if now() - start > {us} then break end end \
         return calls",
        us = ms * 1000
    )
}

#[test]
fn busy_script_replies_keep_order() {
    const RACE_ROUNDS: usize = 4;
    // Only a bound in case TIME stood still: about 1.7 million calls a second here.
    const BUSY_MAX_CALLS: i64 = 20_000_000;
    let s = KiteServer::start(&[], 1);
    let mut admin = client(&s);
    let mut set_ok = admin.cmd(&["CONFIG", "SET", "busy-reply-threshold", "100"]);
    if set_ok.is_error() {
        set_ok = admin.cmd(&["CONFIG", "SET", "lua-time-limit", "100"]);
    }
    assert_eq!(set_ok, Resp::ok(), "CONFIG SET busy-reply-threshold 100");
    let mut a = client(&s);
    let mut b = client(&s);
    assert_eq!(a.cmd(&["SET", "busy:x", "1"]), Resp::ok());

    // Round 0: A is answered -BUSY while B's script runs (1.5 s), and works again after.
    // Rounds 1..: A's pipeline and B's script are sent at (nearly) the same moment, so
    // they may fall in the same pass. A's replies made before the script must not wait
    // for it to end: the busy hook sends them, so A's next PING still meets the script.
    // Each of A's two replies is either its own or -BUSY (if it came after the script
    // started), and once -BUSY, -BUSY from then on.
    let mut held_for_hook = 0;
    for round in 0..=RACE_ROUNDS {
        let script = busy_script(if round == 0 { 1500 } else { 800 }, BUSY_MAX_CALLS);
        let key = format!("busy:y{round}");
        let sent = Instant::now();
        if round > 0 {
            let mut wire = encode_command(&["SET", &key, "1"]);
            wire.extend_from_slice(&encode_command(&["GET", &key]));
            a.send_raw(&wire);
        }
        b.send(&["EVAL", script.as_str(), "0"]);
        if round > 0 {
            let mut busy_seen = false;
            for (what, want) in [("SET", Resp::ok()), ("GET", bulk("1"))] {
                let got = a
                    .try_read()
                    .unwrap_or_else(|e| panic!("round {round}: A's {what}: {e}"));
                if got.error_text().is_some_and(|e| e.starts_with("BUSY")) {
                    busy_seen = true;
                } else {
                    assert!(
                        !busy_seen,
                        "round {round}: A's {what} answered {got} after a BUSY"
                    );
                    assert_eq!(got, want, "round {round}: A's {what}");
                }
            }
            let waited = sent.elapsed();
            if !busy_seen && waited >= Duration::from_millis(80) {
                held_for_hook += 1;
            }
            eprintln!(
                "busy script round {round}: A's replies after {waited:?}, -BUSY among them: \
                 {busy_seen}"
            );
        } else {
            // Until the script has run past the threshold (a fixed sleep could end before
            // a loaded machine had started it).
            let deadline = Instant::now() + Duration::from_secs(10);
            while !a
                .cmd(&["PING"])
                .error_text()
                .is_some_and(|e| e.starts_with("BUSY"))
            {
                assert!(Instant::now() < deadline, "round 0: A never met the script");
                thread::sleep(Duration::from_millis(20));
            }
        }
        // The script is still running: A is answered -BUSY.
        let r = a.cmd(&["PING"]);
        assert!(
            r.error_text().is_some_and(|e| e.starts_with("BUSY")),
            "round {round}: A's PING during the script answered {r} (if A's earlier replies \
             only came when the script ended, the busy hook did not send them)"
        );
        // A pipeline during the script: -BUSY for each, in order.
        let got = a.pipeline(&[cmd(&["PING"]), cmd(&["GET", "busy:x"]), cmd(&["ECHO", "e"])]);
        for r in &got {
            assert_err_prefix(r, "BUSY");
        }
        // The script ends; B gets its result, A works again.
        let r = b
            .try_read()
            .unwrap_or_else(|e| panic!("round {round}: no EVAL result: {e}"));
        let calls = r.as_int().unwrap_or_else(|| panic!("EVAL answered {r}"));
        assert!(
            calls > 0 && calls < BUSY_MAX_CALLS,
            "EVAL returned {calls} (TIME stood still?)"
        );
        eprintln!("busy script round {round}: {calls} calls to TIME");
        assert_eq!(a.cmd(&["PING"]), Resp::simple("PONG"), "round {round}");
        assert_eq!(a.cmd(&["GET", "busy:x"]), bulk("1"));
        assert_eq!(b.cmd(&["PING"]), Resp::simple("PONG"));
    }
    eprintln!(
        "busy script: in {held_for_hook} of {RACE_ROUNDS} rounds A's replies waited for the \
         busy hook"
    );
}

/// The loop reads every socket a wait found readable before any task runs ("Reads of a
/// pass in one system call"), so a request can sit read, not yet parsed, while another
/// connection's script of the same pass holds the thread. The busy hook must answer that
/// request too: here B's SCRIPT KILL, sent right behind A's endless script, so that both
/// usually come out of one wait. Were the hook to read only B's socket, B would wait for
/// ever and A's script would never end (the reads time out after `REPLY_WAIT`).
#[test]
fn script_kill_read_in_the_scripts_own_pass_is_answered() {
    const ROUNDS: usize = 20;
    let s = KiteServer::start(&[], 1);
    let mut admin = client(&s);
    assert_eq!(
        admin.cmd(&["CONFIG", "SET", "busy-reply-threshold", "10"]),
        Resp::ok()
    );
    let mut a = client(&s);
    let mut b = client(&s);
    // Both connections' tasks have run once (a connection whose task has not yet run
    // when the script starts is not seen by the hook: a gap of its own, not this one).
    assert_eq!(a.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(b.cmd(&["PING"]), Resp::simple("PONG"));
    for round in 0..ROUNDS {
        let script = a_script_without_end();
        a.send(&["EVAL", script.as_str(), "0"]);
        b.send(&["SCRIPT", "KILL"]);
        let mut kills = 0;
        loop {
            let r = b
                .try_read()
                .unwrap_or_else(|e| panic!("round {round}: B's SCRIPT KILL unanswered: {e}"));
            kills += 1;
            if r == Resp::ok() {
                break;
            }
            // B came first: no script yet. Ask again until the script is there.
            assert!(
                r.error_text().is_some_and(|e| e.starts_with("NOTBUSY")),
                "round {round}: SCRIPT KILL answered {r}"
            );
            assert!(kills < 10_000, "round {round}: the script never started");
            thread::sleep(Duration::from_millis(2));
            b.send(&["SCRIPT", "KILL"]);
        }
        let r = a
            .try_read()
            .unwrap_or_else(|e| panic!("round {round}: no EVAL result: {e}"));
        assert!(
            r.error_text().is_some_and(|e| e.contains("killed")),
            "round {round}: the killed script answered {r}"
        );
        assert_eq!(a.cmd(&["PING"]), Resp::simple("PONG"), "round {round}");
    }
    // On a ring the loop did read ahead (so the case above was reachable).
    if sends_through_io_uring(&mut admin) {
        assert!(info_int(&mut admin, "transactions", "reads_ahead") > 0);
    }
}

fn a_script_without_end() -> String {
    "local n = 0 while true do n = n + 1 end".to_string()
}

// ---------------------------------------------------------------------------

fn many_connections_at_once(threads: usize) {
    // More than the 256 connections a batch holds before it is sent.
    const CONNS: usize = 300;
    const PIPE: usize = 20;
    const ROUNDS: usize = 2;
    let s = KiteServer::start(&[], threads);
    let mut admin = client(&s);
    let uring = sends_through_io_uring(&mut admin);
    let before = info_int(&mut admin, "transactions", "batched_sends");
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(CONNS));
    let port = s.port;
    let handles: Vec<_> = (0..CONNS)
        .map(|i| {
            let barrier = barrier.clone();
            thread::Builder::new()
                .name(format!("conn-{i}"))
                .stack_size(256 * 1024)
                .spawn(move || -> Result<(), String> {
                    let mut c = Client::try_connect(port).map_err(|e| format!("connect: {e}"))?;
                    c.set_timeout(Some(REPLY_WAIT));
                    let key = format!("many:{i}");
                    let wire: Vec<u8> = (0..PIPE)
                        .flat_map(|_| encode_command(&["INCR", &key]))
                        .collect();
                    for round in 0..ROUNDS {
                        barrier.wait();
                        c.try_send_raw(&wire)
                            .map_err(|e| format!("round {round}: write: {e}"))?;
                        for j in 0..PIPE {
                            let want = (round * PIPE + j + 1) as i64;
                            let got = c.try_read().map_err(|e| {
                                format!("round {round}: reply {j} (want {want}): {e}")
                            })?;
                            if got != Resp::Integer(want) {
                                return Err(format!(
                                    "round {round}: reply {j} is {got}, expected {want}"
                                ));
                            }
                        }
                    }
                    Ok(())
                })
                .unwrap()
        })
        .collect();
    let failures: Vec<String> = handles
        .into_iter()
        .enumerate()
        .filter_map(|(i, h)| match h.join() {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("connection {i}: {e}")),
            Err(_) => Some(format!("connection {i}: thread panicked")),
        })
        .collect();
    assert!(
        failures.is_empty(),
        "--threads {threads}: {} of {CONNS} connections failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    for i in [0, 57, 256, CONNS - 1] {
        assert_eq!(
            admin.cmd(&["GET", &format!("many:{i}")]),
            bulk((ROUNDS * PIPE).to_string())
        );
    }
    let after = info_int(&mut admin, "transactions", "batched_sends");
    eprintln!("many connections, --threads {threads}: batched_sends {before} -> {after}");
    if uring {
        assert!(after > before, "batched_sends stayed at {after}");
    }
}

#[test]
fn many_connections_at_once_one_thread() {
    many_connections_at_once(1);
}

#[test]
fn many_connections_at_once_four_threads() {
    many_connections_at_once(4);
}

// ---------------------------------------------------------------------------

/// Opens a connection that asks for `gets` GETs of `key` and reads nothing, and waits
/// (bounded) until the server has run them. Returns it and its CLIENT ID.
fn stalled_reader(s: &KiteServer, admin: &mut Client, key: &str, gets: usize) -> (Client, i64) {
    let mut c = client(s);
    let id = c.cmd(&["CLIENT", "ID"]).as_int().expect("CLIENT ID");
    let wire: Vec<u8> = (0..gets)
        .flat_map(|_| encode_command(&["GET", key]))
        .collect();
    c.send_raw(&wire);
    let deadline = Instant::now() + REPLY_WAIT;
    loop {
        let list = admin.cmd(&["CLIENT", "LIST", "ID", &id.to_string()]);
        let text = list.as_string().unwrap_or_default();
        if text.contains("cmd=get") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server never ran the GETs: {text}"
        );
        thread::sleep(Duration::from_millis(10));
    }
    (c, id)
}

/// Reads `c` to its end: it must reach EOF (or an error) within the read timeout.
fn assert_closed(c: &mut Client, what: &str) {
    let (bytes, closed) = c.read_raw_until_close(REPLY_WAIT);
    assert!(
        closed,
        "{what}: the killed connection was still open ({} bytes read, then nothing for {:?})",
        bytes.len(),
        REPLY_WAIT
    );
}

fn wait_gone(admin: &mut Client, id: i64) {
    let deadline = Instant::now() + REPLY_WAIT;
    loop {
        let list = admin.cmd(&["CLIENT", "LIST", "ID", &id.to_string()]);
        let text = list.as_string().unwrap_or_default();
        if !text.contains(&format!("id={id} ")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "client {id} is still listed: {text}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn client_kill_of_a_stalled_reader() {
    const BIG: usize = 2 << 20;
    let s = KiteServer::start(&[], 2);
    let mut admin = client(&s);
    let mut rng = Rng::new(0x4B11);
    let big = value_of(&mut rng, BIG);
    assert_eq!(
        admin.cmd(&[b"SET".as_slice(), b"kill:big".as_slice(), big.as_slice()]),
        Resp::ok()
    );

    // By ID: 16 MB asked for, none read.
    let (mut victim, id) = stalled_reader(&s, &mut admin, "kill:big", 8);
    assert_eq!(
        admin.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]),
        Resp::Integer(1),
        "CLIENT KILL ID {id}"
    );
    assert_eq!(admin.cmd(&["PING"]), Resp::simple("PONG"));
    assert_closed(&mut victim, "CLIENT KILL ID");
    wait_gone(&mut admin, id);

    // By address (the old form answers +OK), from a connection opened just for it.
    let (mut victim, id) = stalled_reader(&s, &mut admin, "kill:big", 8);
    let addr = victim.try_clone_stream().local_addr().unwrap().to_string();
    let mut killer = client(&s);
    assert_eq!(
        killer.cmd(&["CLIENT", "KILL", &addr]),
        Resp::ok(),
        "CLIENT KILL {addr}"
    );
    assert_closed(&mut victim, "CLIENT KILL addr");
    wait_gone(&mut admin, id);

    // The server is fine: new connections, the big value intact, nobody left over.
    let mut fresh = client(&s);
    assert_eq!(
        fresh.cmd(&["STRLEN", "kill:big"]),
        Resp::Integer(BIG as i64)
    );
    assert_eq!(fresh.cmd(&["GET", "kill:big"]), Resp::Bulk(big));
    keep_working(&mut fresh, "kill:after", 2, 20, 0);
    assert_eq!(info_int(&mut admin, "clients", "connected_clients"), 3);
}

/// The field `name=` of a CLIENT LIST line, as a number.
fn list_field(line: &str, name: &str) -> u64 {
    line.split(' ')
        .find_map(|f| f.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line}"))
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{name}= is not a number in {line}"))
}

/// CLIENT LIST shows replies a client has not taken (obl, oll, omem) and the memory its
/// connection holds (tot-mem), as Redis does, so a slow consumer can be found by them.
#[test]
fn client_list_shows_a_stalled_readers_output() {
    stalled_output_listed(1);
}

/// The same with the asking client and the stalled one likely on different threads.
#[test]
fn client_list_shows_a_stalled_readers_output_threads4() {
    stalled_output_listed(4);
}

fn stalled_output_listed(threads: usize) {
    const BIG: usize = 2 << 20;
    let s = KiteServer::start(&[], threads);
    let mut admin = client(&s);
    let mut rng = Rng::new(0x0B1);
    let big = value_of(&mut rng, BIG);
    assert_eq!(
        admin.cmd(&[b"SET".as_slice(), b"obuf:big".as_slice(), big.as_slice()]),
        Resp::ok()
    );
    // An idle client owes nothing.
    let own = admin.cmd(&["CLIENT", "INFO"]).as_string().unwrap();
    assert_eq!(list_field(&own, "obl"), 0, "{own}");
    assert_eq!(list_field(&own, "oll"), 0, "{own}");
    assert_eq!(list_field(&own, "omem"), 0, "{own}");
    assert!(list_field(&own, "tot-mem") > 0, "{own}");

    // 16 MB asked for and none read: most of it cannot be in the socket.
    let (victim, id) = stalled_reader(&s, &mut admin, "obuf:big", 8);
    let deadline = Instant::now() + REPLY_WAIT;
    let line = loop {
        let text = admin
            .cmd(&["CLIENT", "LIST", "ID", &id.to_string()])
            .as_string()
            .unwrap();
        // Kite waits for the socket one reply at a time here (Redis would hold all eight):
        // at least most of one 2 MB reply is owed.
        if list_field(&text, "omem") >= BIG as u64 / 2 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "omem never showed the unsent replies: {text}"
        );
        thread::sleep(Duration::from_millis(10));
    };
    assert!(list_field(&line, "obl") > 0, "{line}");
    assert!(list_field(&line, "oll") > 0, "{line}");
    assert!(
        list_field(&line, "tot-mem") >= list_field(&line, "omem"),
        "{line}"
    );
    drop(victim);
    wait_gone(&mut admin, id);
}

// ---------------------------------------------------------------------------

/// A connection moved between threads again and again while its replies are still
/// being sent: requests are written without waiting for replies, which another thread
/// reads and checks, so a move often comes while the thread's batch holds some.
#[test]
fn migrating_connection_with_replies_in_flight() {
    const PHASES: usize = 16;
    const PER_PHASE: usize = 60;
    let s = KiteServer::start(&["--migrate-connections", "yes"], 2);
    let mut admin = client(&s);
    let tags = [tag_on_shard("mf", 0, 2), tag_on_shard("mf", 1, 2)];
    let before = info_int(&mut admin, "transactions", "migrations");
    let mut rng = Rng::new(0x316F);
    let mut model = Model::default();
    let mut cmds: Vec<Cmd> = Vec::new();
    let mut expected: Vec<(String, Resp)> = Vec::new();
    for phase in 0..PHASES {
        let tag = &tags[phase % 2];
        let k = |name: &str| format!("{{{tag}}}:{name}");
        for _ in 0..PER_PHASE {
            let c: Cmd = match rng.below(8) {
                0..=1 => {
                    let mut c = cmd(&["SET", &k(&format!("s{}", rng.below(4)))]);
                    c.push(random_value(&mut rng));
                    c
                }
                2..=3 => cmd(&["GET", &k(&format!("s{}", rng.below(4)))]),
                4 => cmd(&["INCR", &k("n")]),
                5 => cmd(&["RPUSH", &k("l"), &format!("i{}", rng.below(1000))]),
                6 => cmd(&["LLEN", &k("l")]),
                _ => cmd(&["MGET", &k("s0"), &k("s3"), &k("n")]),
            };
            let want = model.apply(&c);
            expected.push((short_cmd(&c), want));
            cmds.push(c);
        }
    }
    let mut conn = client(&s);
    let mut writer = conn.try_clone_stream();
    writer.set_write_timeout(Some(REPLY_WAIT)).unwrap();
    let reader = thread::spawn(move || {
        read_expected(&mut conn, &expected, "migrating connection");
        conn
    });
    let mut i = 0;
    while i < cmds.len() {
        let n = (rng.range(1, 12) as usize).min(cmds.len() - i);
        let wire: Vec<u8> = cmds[i..i + n]
            .iter()
            .flat_map(|c| encode_command(c))
            .collect();
        writer
            .write_all(&wire)
            .unwrap_or_else(|e| panic!("writing command {i}: {e}"));
        i += n;
        if rng.chance(10) {
            thread::sleep(Duration::from_micros(rng.range(20, 400) as u64));
        }
    }
    let mut conn = reader.join().expect("reader failed");
    assert_eq!(conn.cmd(&["ECHO", "after"]), bulk("after"));
    let after = info_int(&mut admin, "transactions", "migrations");
    eprintln!("migrating_connection_with_replies_in_flight: migrations {before} -> {after}");
    assert!(
        after > before,
        "the connection was never migrated (migrations {before} -> {after})"
    );
}

/// A snapshot is written in steps between which the thread runs its other work without
/// ever sleeping; replies made meanwhile must not wait for the snapshot to end. Found in
/// review: the send batch went out only when the thread slept, so at one thread the
/// reply to BGSAVE itself came after the whole save. Judged by order of magnitude, not
/// by a fixed time: the reply must come back in under a quarter of the time the save
/// takes (about 1 ms against 300 ms here; before the fix, the whole save).
#[test]
fn replies_are_not_held_while_a_snapshot_runs() {
    let s = KiteServer::start(&[], 1);
    let mut c = client(&s);
    let value = vec![b'x'; 100];
    let mut batch = Vec::with_capacity(2 * 1024 * 1024);
    for chunk in 0..100 {
        batch.clear();
        for i in 0..10_000 {
            let key = format!("snap:{}", chunk * 10_000 + i);
            batch.extend_from_slice(
                format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$100\r\n", key.len()).as_bytes(),
            );
            batch.extend_from_slice(&value);
            batch.extend_from_slice(b"\r\n");
        }
        c.send_raw(&batch);
        for _ in 0..10_000 {
            assert_eq!(c.read(), Resp::ok());
        }
    }
    // A client descheduled for a while on a loaded machine can miss the mark once; held
    // replies miss it every time. Three tries, one must pass.
    let mut tries = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let reply = c.cmd(&["BGSAVE"]);
        let replied = started.elapsed();
        assert_eq!(
            reply.as_string().as_deref(),
            Some("Background saving started"),
            "{reply:?}"
        );
        let deadline = started + Duration::from_secs(60);
        while info_int(&mut c, "persistence", "rdb_bgsave_in_progress") == 1 {
            assert!(Instant::now() < deadline, "the save never ended");
            std::thread::sleep(Duration::from_millis(2));
        }
        let saved = started.elapsed();
        if replied * 4 < saved {
            return;
        }
        tries.push((replied, saved));
    }
    panic!("BGSAVE's reply against the whole save (three tries): {tries:?}: held until it ended");
}

/// Idle connections cost nothing per pass: the connections a thread's passes visit grow
/// with the requests of the active one, not with the idle ones times the passes.
#[test]
fn idle_connections_are_not_visited() {
    let s = KiteServer::start(&[], 1);
    let idle: Vec<Client> = (0..500).map(|_| client(&s)).collect();
    let mut active = client(&s);
    // Every idle connection has been seen once (accepted and served its first turn).
    for c in &idle {
        drop(c.try_clone_stream());
    }
    assert_eq!(active.cmd(&["PING"]), Resp::simple("PONG"));
    let visits_before = info_int(&mut active, "transactions", "connections_visited");
    let passes_before = info_int(&mut active, "transactions", "event_loop_passes");
    for i in 0..1000 {
        assert_eq!(
            active.cmd(&["ECHO", &i.to_string()]),
            bulk(i.to_string()),
            "request {i}"
        );
    }
    let visits = info_int(&mut active, "transactions", "connections_visited") - visits_before;
    let passes = info_int(&mut active, "transactions", "event_loop_passes") - passes_before;
    assert!(passes >= 100, "{passes} passes for 1000 round trips");
    // One visit per request (and the INFO), give or take a spurious wake-up; 500 idle
    // connections visited on each pass would be hundreds of thousands.
    assert!(
        visits <= 2 * 1000 + 10,
        "{visits} connection visits over {passes} passes for 1000 requests"
    );
    drop(idle);
}

/// A batched send that finds the client's socket full is cut short, counted, and the
/// rest follows once the client reads. At one thread the writer's pacing is exact: the
/// watcher's GET is answered in the same turn's batch as the slow reader's replies or a
/// later one, so each GET is its own group of replies.
#[test]
fn a_full_socket_cuts_a_batched_send_short() {
    let s = KiteServer::start(&[], 1);
    let mut admin = client(&s);
    if !sends_through_io_uring(&mut admin) {
        return;
    }
    let value = vec![b'v'; 48_000];
    assert_eq!(
        admin.cmd(&[b"SET".as_slice(), b"cut:big", &value]),
        Resp::ok()
    );
    let short_before = info_int(&mut admin, "transactions", "short_sends");
    let mut slow = client(&s);
    let mut writer = slow.try_clone_stream();
    writer.set_write_timeout(Some(REPLY_WAIT)).unwrap();
    // Up to 2000 GETs (96 MB): the socket is full long before. Each is written once the
    // server ran the one before; once 1 MB is out, one not run within a second means
    // the server stopped for the full socket.
    let mut sent = 0;
    'pacing: for i in 0..2000 {
        writer
            .write_all(&encode_command(&["GET", "cut:big"]))
            .unwrap();
        writer
            .write_all(&encode_command(&["INCR", "cut:step"]))
            .unwrap();
        sent += 1;
        let since = Instant::now();
        loop {
            if admin.cmd(&["GET", "cut:step"]).parse_int().unwrap_or(0) > i {
                break;
            }
            let waited = since.elapsed();
            if waited > Duration::from_secs(1) && sent * value.len() > 1 << 20 {
                break 'pacing;
            }
            assert!(waited < REPLY_WAIT, "GET #{i} not run");
            thread::sleep(Duration::from_micros(100));
        }
    }
    assert!(
        sent < 2000,
        "the server never stopped for a reader that reads nothing"
    );
    let short_after = info_int(&mut admin, "transactions", "short_sends");
    assert!(
        short_after > short_before,
        "no batched send was cut short (short_sends {short_before} -> {short_after})"
    );
    for i in 0..sent {
        assert_eq!(slow.read(), Resp::Bulk(value.clone()), "GET #{i}");
        assert_eq!(slow.read(), Resp::Integer(i as i64 + 1), "INCR #{i}");
    }
}

// ---------------------------------------------------------------------------
// 7. Reads and the wait through io_uring (docs/event-loop.md, "Reads and the wait
//    through io_uring")
// ---------------------------------------------------------------------------

/// `multiplexing_api` (Redis's field) names what the threads wait on: io_uring exactly
/// when the ring is in use, epoll when told so or when the ring could not be set up
/// (and then `kite_io_uring_error` says why).
#[test]
fn multiplexing_api_names_what_the_loop_waits_on() {
    let s = KiteServer::start(&[], 2);
    let mut c = client(&s);
    let api = info_field(&mut c, "server", "multiplexing_api");
    if sends_through_io_uring(&mut c) {
        assert_eq!(
            api, "io_uring",
            "the ring sends replies, yet multiplexing_api:{api}"
        );
    } else {
        assert_eq!(api, "epoll");
    }
    let s = KiteServer::start(&["--event-loop", "epoll"], 2);
    let mut c = client(&s);
    assert_eq!(info_field(&mut c, "server", "multiplexing_api"), "epoll");
}

/// A connection that sends nothing has a receive waiting in the kernel on a ring loop.
/// When the server closes it (CLIENT KILL, the idle `timeout`), the client must see the
/// end at once, not when the receive next completes (which, with nothing sent, is
/// never).
fn idle_connections_the_server_closes_see_the_end(threads: usize) {
    const IDLE: usize = 20;
    let s = KiteServer::start(&[], threads);
    let mut admin = client(&s);
    let mut idle: Vec<(Client, i64)> = (0..IDLE)
        .map(|_| {
            let mut c = client(&s);
            let id = match c.cmd(&["CLIENT", "ID"]) {
                Resp::Integer(id) => id,
                other => panic!("CLIENT ID answered {other}"),
            };
            (c, id)
        })
        .collect();
    // Let every one of them go back to waiting for its next request.
    thread::sleep(Duration::from_millis(50));
    for (_, id) in &idle {
        assert_eq!(
            admin.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]),
            Resp::Integer(1),
            "CLIENT KILL ID {id}"
        );
    }
    for (c, id) in idle.iter_mut() {
        assert_closed(c, &format!("idle client {id} killed"));
    }
    for (_, id) in &idle {
        wait_gone(&mut admin, *id);
    }
    // The idle timeout closes a silent client the same way.
    assert_eq!(
        admin.cmd(&["CONFIG", "SET", "timeout", "1"]),
        Resp::ok(),
        "CONFIG SET timeout"
    );
    let mut quiet = client(&s);
    assert_eq!(quiet.cmd(&["PING"]), Resp::simple("PONG"));
    let (bytes, closed) = quiet.read_raw_until_close(Duration::from_secs(10));
    assert!(
        closed && bytes.is_empty(),
        "the idle timeout did not close a silent client ({} bytes read)",
        bytes.len()
    );
    // The admin connection was idle as long, and went the same way.
    let mut admin = client(&s);
    assert_eq!(admin.cmd(&["CONFIG", "SET", "timeout", "0"]), Resp::ok());
    // The thread is fine: new connections are read and answered.
    let mut fresh = client(&s);
    keep_working(&mut fresh, "idle:after", threads, 20, 0);
}

#[test]
fn idle_connections_the_server_closes_see_the_end_threads1() {
    idle_connections_the_server_closes_see_the_end(1);
}

#[test]
fn idle_connections_the_server_closes_see_the_end_threads4() {
    idle_connections_the_server_closes_see_the_end(4);
}

/// A connection that moves to another thread just after a blocking pop was served had a
/// receive armed on its socket while it waited (to see the client leave). The move must
/// take that receive back, with anything it read, before another thread's loop reads
/// the socket: the connection moves, and every byte keeps its place.
#[test]
fn a_connection_moves_after_a_blocking_pop_with_its_input() {
    const CONNS: usize = 4;
    const POPS: usize = 12;
    let s = KiteServer::start(&["--migrate-connections", "yes"], 2);
    let mut admin = client(&s);
    let mut pusher = client(&s);
    let before = info_int(&mut admin, "transactions", "migrations");
    for shard in 0..2 {
        let tag = tag_on_shard("blmv", shard, 2);
        let list = format!("{{{tag}}}:q");
        for n in 0..CONNS {
            // Its pops alone make the connection's affinity: whichever thread it starts
            // on, it moves to the list's once enough of them were served there.
            let mut c = client(&s);
            for pop in 0..POPS {
                let ctx = format!("shard {shard} connection {n} pop {pop}");
                c.send(&["BLPOP", &list, "10"]);
                thread::sleep(Duration::from_millis(5));
                if pop % 2 == 1 {
                    // Sent while blocked: kept for after the pop.
                    c.send(&["ECHO", &ctx]);
                    thread::sleep(Duration::from_millis(5));
                }
                assert_eq!(
                    pusher.cmd(&["RPUSH", &list, &ctx]),
                    Resp::Integer(1),
                    "{ctx}"
                );
                assert_eq!(
                    c.try_read()
                        .unwrap_or_else(|e| panic!("{ctx}: no pop: {e}")),
                    Resp::Array(vec![bulk(&list), bulk(&ctx)]),
                    "{ctx}"
                );
                if pop % 2 == 1 {
                    assert_eq!(
                        c.try_read()
                            .unwrap_or_else(|e| panic!("{ctx}: no echo: {e}")),
                        bulk(&ctx),
                        "{ctx}"
                    );
                }
                check(&mut c, &cmd(&["PING"]), &Resp::simple("PONG"), &ctx);
            }
        }
    }
    let moved = info_int(&mut admin, "transactions", "migrations") - before;
    assert!(moved > 0, "no connection moved");
}

// ---------------------------------------------------------------------------
// Multishot receives (docs/event-loop.md, "Multishot receives")
// ---------------------------------------------------------------------------

/// How the server reads plain sockets: `multishot` (one receive armed per connection,
/// completing for every request), `single` (one receive per wait), `recv` (the loop
/// reads sockets itself, on epoll). Checked against what the loop waits on.
fn receives_of(c: &mut Client) -> String {
    let receives = info_field(c, "server", "kite_receives");
    let api = info_field(c, "server", "multiplexing_api");
    match (api.as_str(), receives.as_str()) {
        ("io_uring", "multishot" | "single") | ("epoll", "recv") => receives,
        _ => panic!("multiplexing_api:{api} with kite_receives:{receives}"),
    }
}

/// On a ring with provided buffers a connection's receive is armed once and stays armed
/// across its requests: `read_ahead_batches` (passes that armed receives) must not grow
/// with unpipelined requests, while `reads_ahead` (completions that brought bytes) does.
#[test]
fn a_receive_stays_armed_across_requests() {
    const REQUESTS: i64 = 300;
    let s = KiteServer::start(&[], 1);
    let mut admin = client(&s);
    let mut c = client(&s);
    c.cmd(&["PING"]);
    let receives = receives_of(&mut admin);
    if receives != "multishot" {
        eprintln!("kite_receives:{receives}: nothing to check here");
        return;
    }
    let armed_before = info_int(&mut admin, "transactions", "read_ahead_batches");
    let read_before = info_int(&mut admin, "transactions", "reads_ahead");
    for i in 0..REQUESTS {
        let msg = format!("m{i}");
        assert_eq!(c.cmd(&["ECHO", &msg]), bulk(&msg));
    }
    let armed = info_int(&mut admin, "transactions", "read_ahead_batches") - armed_before;
    let read = info_int(&mut admin, "transactions", "reads_ahead") - read_before;
    assert!(
        read >= REQUESTS,
        "{REQUESTS} requests, {read} receives that brought bytes"
    );
    // The admin connection's own INFO requests arm nothing new either; a few re-arms
    // (a receive ended by the kernel) are allowed, one per request is not.
    assert!(
        armed < REQUESTS / 10,
        "{armed} passes armed receives for {REQUESTS} unpipelined requests"
    );
}

/// Requests larger than a provided buffer, sent whole and in pieces, pipelined with small
/// ones: a receive that fills a buffer hands the rest of the socket to the reader, and
/// the bytes must stay whole and in order on both paths.
#[test]
fn requests_larger_than_a_receive_buffer_stay_whole() {
    let s = KiteServer::start(&[], 1);
    let mut c = client(&s);
    let mut rng = Rng::new(0x5EC0_0001);
    for (round, len) in [20_000usize, 70_000, 1_000_000, 16 * 1024, 16 * 1024 + 1]
        .into_iter()
        .enumerate()
    {
        let value = value_of(&mut rng, len);
        let key = format!("big:{round}");
        let mut wire = encode_command(&["SET".as_bytes(), key.as_bytes(), &value]);
        wire.extend(encode_command(&["ECHO", "after"]));
        wire.extend(encode_command(&["STRLEN", &key]));
        if round % 2 == 0 {
            c.send_raw(&wire);
        } else {
            for piece in wire.chunks(7_001) {
                c.send_raw(piece);
                thread::sleep(Duration::from_millis(1));
            }
        }
        assert_eq!(c.read(), Resp::Simple("OK".into()), "SET of {len} bytes");
        assert_eq!(c.read(), bulk("after"), "ECHO after {len} bytes");
        assert_eq!(c.read(), Resp::Integer(len as i64), "STRLEN of {len} bytes");
        assert_eq!(c.cmd(&["GET".as_bytes(), key.as_bytes()]), bulk(&value));
    }
}

/// A client that keeps sending while its connection waits to write (it reads none of its
/// large replies) must be held back by the kernel's flow control: the server stops
/// taking its bytes after a bounded amount instead of reading them all into memory.
/// Then every reply still arrives, in order.
#[test]
fn a_client_that_does_not_read_cannot_make_the_server_buffer_its_input() {
    const BIG: usize = 4 << 20;
    const GETS: usize = 16;
    // Past this the server took far more than any socket buffer holds.
    const CEILING: usize = 96 << 20;
    let s = KiteServer::start(&[], 1);
    let mut c = client(&s);
    let big = "x".repeat(BIG);
    assert_eq!(c.cmd(&["SET", "big", &big]), Resp::Simple("OK".into()));
    let wire: Vec<u8> = (0..GETS)
        .flat_map(|_| encode_command(&["GET", "big"]))
        .collect();
    c.send_raw(&wire);
    let filler_msg = "p".repeat(1000);
    let filler = encode_command(&["ECHO", &filler_msg]);
    let mut stream = c.try_clone_stream();
    stream.set_nonblocking(true).unwrap();
    let mut sent = 0usize;
    let mut pos = 0usize;
    let mut idle_since = Instant::now();
    // Sends echo requests until the server has taken nothing for a second, or past the
    // ceiling.
    while sent < CEILING {
        match stream.write(&filler[pos..]) {
            Ok(n) => {
                sent += n;
                pos = (pos + n) % filler.len();
                idle_since = Instant::now();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if idle_since.elapsed() > Duration::from_secs(1) {
                    break;
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("send failed after {sent} bytes: {e}"),
        }
    }
    stream.set_nonblocking(false).unwrap();
    assert!(
        sent < CEILING,
        "the server took {sent} bytes from a client that reads none of its replies"
    );
    // The last request is finished once the replies are being read.
    let rest = (filler.len() - pos) % filler.len();
    let echoes = (sent + rest) / filler.len();
    let mut finisher = stream.try_clone().unwrap();
    let last = filler[pos..].to_vec();
    let finishing = thread::spawn(move || {
        if !last.is_empty() && last.len() < filler.len() {
            finisher.write_all(&last).unwrap();
        }
    });
    for i in 0..GETS {
        let r = c.read();
        assert!(
            matches!(&r, Resp::Bulk(v) if v.len() == BIG),
            "GET {i}: {}",
            short(&r)
        );
    }
    for i in 0..echoes {
        assert_eq!(c.read(), bulk(&filler_msg), "echo {i} of {echoes}");
    }
    finishing.join().unwrap();
    assert_eq!(c.cmd(&["PING"]), Resp::Simple("PONG".into()));
}

/// While a script is busy the hook holds what each client sends, up to 1 MiB: a client
/// that streams a request larger than that (a bulk string arriving in small pieces, as
/// a multishot receive brings them) is given up on, not buffered for as long as the
/// script runs: once the script is killed its connection closes and its request never
/// runs. Written for one thread, like the other busy-script tests here: with more, the
/// streaming client may sit on a thread the script does not hold, whose loop serves it
/// as usual.
#[test]
fn a_client_streaming_into_a_busy_server_is_closed_past_the_hooks_limit() {
    const PIECE: usize = 4096;
    const PIECES: usize = 384; // 1.5 MiB
    let s = KiteServer::start(&[], 1);
    let mut admin = client(&s);
    assert_eq!(
        admin.cmd(&["CONFIG", "SET", "busy-reply-threshold", "10"]),
        Resp::ok()
    );
    let mut runner = client(&s);
    let mut streamer = client(&s);
    assert_eq!(streamer.cmd(&["PING"]), Resp::simple("PONG"));
    let script = a_script_without_end();
    runner.send(&["EVAL", script.as_str(), "0"]);
    // Busy once another client is answered -BUSY.
    let mut tries = 0;
    loop {
        let r = admin.cmd(&["PING"]);
        if r.error_text().is_some_and(|e| e.starts_with("BUSY")) {
            break;
        }
        tries += 1;
        assert!(tries < 10_000, "the script never made the server busy: {r}");
        thread::sleep(Duration::from_millis(2));
    }
    let header = format!("*3\r\n$3\r\nSET\r\n$6\r\nstream\r\n${}\r\n", PIECE * PIECES);
    let mut sent = 0;
    if streamer.try_send_raw(header.as_bytes()).is_ok() {
        let piece = vec![b'x'; PIECE];
        for _ in 0..PIECES {
            if streamer.try_send_raw(&piece).is_err() {
                break;
            }
            sent += PIECE;
            // Pieces apart, mostly one per look of the hook (every 5 ms), so that no
            // receive fills a whole buffer (which would hand the socket back to the
            // hook's own reads).
            thread::sleep(Duration::from_millis(6));
        }
    }
    // The connection closes when its task runs again, once the script is over; its
    // request, which the hook gave up on, never runs.
    assert_eq!(admin.cmd(&["SCRIPT", "KILL"]), Resp::ok());
    let r = runner.read();
    assert!(
        r.error_text().is_some_and(|e| e.contains("killed")),
        "the killed script answered {r}"
    );
    assert_closed(
        &mut streamer,
        &format!("a client that sent {sent} bytes of one request to a busy server"),
    );
    assert_eq!(admin.cmd(&["EXISTS", "stream"]), Resp::Integer(0));
    assert_eq!(admin.cmd(&["PING"]), Resp::simple("PONG"));
}

/// Before a pass's readers run, the loop shows the bytes that came to each empty
/// read-ahead buffer to the worker, which prefetches what looks like each request's key
/// in database 0 (`reactor::hint_fresh`). That is only a hint: bytes that continue a
/// request, a connection on another database, a first argument that is no key, must all
/// mean exactly what they say. Eight connections, half of them on database 1, write
/// requests cut at a random byte, the pieces sent in separate passes, each pair of
/// connections naming the same keys in the two databases, and every reply and value must
/// come back as written.
#[test]
fn requests_cut_anywhere_across_connections_keep_their_meaning() {
    for threads in [1, 2] {
        let mut server = KiteServer::start(&[], threads);
        let mut conns: Vec<Client> = (0..8).map(|_| client(&server)).collect();
        for (i, c) in conns.iter_mut().enumerate() {
            if i % 2 == 1 {
                check(c, &cmd(&["SELECT", "1"]), &Resp::ok(), "select");
            }
        }
        let mut rng = Rng::new(0x5eed_0fc0_ffee + threads as u64);
        for round in 0..60 {
            let mut wants: Vec<Vec<Resp>> = Vec::new();
            let mut seconds: Vec<Vec<u8>> = Vec::new();
            for (i, c) in conns.iter_mut().enumerate() {
                // Connections 2n and 2n + 1 name the same keys, in databases 0 and 1.
                let key = format!("key:{}:{}", i / 2, round % 7);
                let value = format!("v{i}-{round}");
                // A request whose first argument is not a key, then the write, then a
                // read of the same key: cut once, anywhere in the three.
                let mut bytes = encode_command(&["ECHO", key.as_str()]);
                bytes.extend(encode_command(&["SET", key.as_str(), value.as_str()]));
                bytes.extend(encode_command(&["GET", key.as_str()]));
                let cut = rng.range(1, bytes.len() as i64 - 1) as usize;
                c.send_raw(&bytes[..cut]);
                seconds.push(bytes[cut..].to_vec());
                wants.push(vec![bulk(&key), Resp::ok(), bulk(&value)]);
            }
            // The second pieces come in a later pass than the first ones.
            thread::sleep(Duration::from_millis(2));
            for (c, rest) in conns.iter_mut().zip(&seconds) {
                c.send_raw(rest);
            }
            for (i, (c, want)) in conns.iter_mut().zip(&wants).enumerate() {
                for w in want {
                    let got = c.read();
                    assert_eq!(&got, w, "threads {threads}, round {round}, connection {i}");
                }
            }
        }
        // Each database holds what its own connection wrote last, never the other's.
        for (i, c) in conns.iter_mut().enumerate() {
            let key = format!("key:{}:{}", i / 2, 59 % 7);
            check(
                c,
                &cmd(&["GET", key.as_str()]),
                &bulk(format!("v{i}-59")),
                "last",
            );
        }
        server.assert_alive();
    }
}

/// A pipeline of large replies on both shards of two threads: whichever run hops, its
/// replies pass a batch's reply limit (1 MiB), so the shard sends the first part back and
/// the rest goes out again as a batch of its own. Every reply arrives, whole and in order,
/// and the commands after the large ones still see the state before them.
#[test]
fn hopped_replies_past_a_batchs_limit_come_back_whole_and_in_order() {
    let mut s = KiteServer::start(&[], 2);
    let mut c = client(&s);
    let keys = [
        keys_on_each_shard("big:a:", 2),
        keys_on_each_shard("big:b:", 2),
        keys_on_each_shard("big:c:", 2),
        keys_on_each_shard("big:d:", 2),
    ];
    let counters = keys_on_each_shard("big:n:", 2);
    let value = |k: &str| -> Vec<u8> {
        let seed = k
            .bytes()
            .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
        (0..400_000u32)
            .map(|i| b'a' + ((i as u8).wrapping_add(seed) % 26))
            .collect()
    };
    for group in &keys {
        for k in group {
            check(
                &mut c,
                &[b"SET".to_vec(), k.as_bytes().to_vec(), value(k)],
                &Resp::ok(),
                "set",
            );
        }
    }
    for round in 0..3 {
        // Four large values on shard 0, then a counter, and the same on shard 1.
        let mut cmds: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut want: Vec<Resp> = Vec::new();
        for shard in 0..2 {
            for group in &keys {
                let k = &group[shard];
                cmds.push(vec![b"GET".to_vec(), k.as_bytes().to_vec()]);
                want.push(bulk(value(k)));
            }
            let ctr = counters[shard].clone();
            cmds.push(vec![b"INCR".to_vec(), ctr.into_bytes()]);
            want.push(Resp::Integer(round + 1));
        }
        let got = c.pipeline(&cmds);
        assert_eq!(got.len(), want.len(), "round {round}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w, "round {round}, reply {i}: {}", short(g));
        }
    }
    s.assert_alive();
}
