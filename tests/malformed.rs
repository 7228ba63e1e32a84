//! Raw-protocol tests: malformed frames, binary data, abrupt disconnects, deep
//! pipelines and huge declared lengths. Where Redis answers, Kite's bytes must equal
//! redis-server's bytes exactly.

mod common;

use common::*;
use std::io::Write;
use std::thread;
use std::time::Duration;

const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What a server did with some raw input: the bytes it sent and whether it closed.
#[derive(Debug, PartialEq)]
struct Outcome {
    bytes: Vec<u8>,
    closed: bool,
}

/// How to finish an exchange.
#[derive(Clone, Copy, Debug)]
enum Finish {
    /// Keep writing open; read until the server closes or this long passes quietly.
    Quiet(Duration),
    /// Half-close after the input (the server sees EOF), then read until it closes.
    HalfClose,
}

/// Sends `input` on a fresh connection and collects everything the server sends.
fn exchange(port: u16, input: &[u8], finish: Finish) -> Outcome {
    let mut c = Client::connect(port);
    // The server may close before reading everything; a failed write is fine.
    let _ = c.try_send_raw(input);
    let quiet = match finish {
        Finish::Quiet(d) => d,
        Finish::HalfClose => {
            c.shutdown_write();
            CLOSE_WAIT
        }
    };
    let (bytes, closed) = c.read_raw_until_close(quiet);
    Outcome { bytes, closed }
}

/// Sends `input` to both servers and asserts the same bytes come back and that both
/// closed (or both kept) the connection. Returns Redis's outcome.
fn same_as_redis(kite: &KiteServer, redis: &RedisServer, input: &[u8], finish: Finish) -> Outcome {
    let k = exchange(kite.port, input, finish);
    let r = exchange(redis.port, input, finish);
    assert_eq!(
        (escape_bytes(&k.bytes), k.closed),
        (escape_bytes(&r.bytes), r.closed),
        "reply to raw input {} differs (left: kite, right: redis-server; bool = connection closed)",
        escape_bytes(&input[..input.len().min(200)])
    );
    r
}

fn protocol_error_case(
    kite: &mut KiteServer,
    redis: &mut RedisServer,
    input: &[u8],
    expected: &str,
) {
    let r = same_as_redis(kite, redis, input, Finish::Quiet(CLOSE_WAIT));
    assert_eq!(
        escape_bytes(&r.bytes),
        escape_bytes(expected.as_bytes()),
        "redis-server itself answered differently than this test expects"
    );
    assert!(r.closed, "a protocol error must close the connection");
    kite.assert_alive();
    redis.assert_alive();
}

#[test]
fn protocol_errors_match_redis_and_close() {
    let mut kite = KiteServer::start(&[], 2);
    let mut redis = RedisServer::start();
    let big = |prefix: &[u8], n: usize, fill: u8| {
        let mut v = prefix.to_vec();
        v.extend(std::iter::repeat_n(fill, n));
        v
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"*abc\r\n".to_vec(),
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1x\r\n".to_vec(),
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*+1\r\n".to_vec(),
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*2147483648\r\n".to_vec(),
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*99999999999999999999\r\n".to_vec(),
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1\r\n$abc\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n$-1\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n$-5\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        // Over proto-max-bulk-len (512 MiB).
        (
            b"*1\r\n$536870913\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n$2147483647\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\nxyz\r\n".to_vec(),
            "-ERR Protocol error: expected '$', got 'x'\r\n",
        ),
        (
            b"*2\r\n$3\r\nGET\r\n:1\r\n".to_vec(),
            "-ERR Protocol error: expected '$', got ':'\r\n",
        ),
        (
            b"SET k \"abc\r\n".to_vec(),
            "-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
        (
            b"SET k 'abc\r\n".to_vec(),
            "-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
        (
            b"SET k 'it''s'\r\n".to_vec(),
            "-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
        (
            b"SET k \"abc\"def\r\n".to_vec(),
            "-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
        (
            big(b"", 70 * 1024, b'a'),
            "-ERR Protocol error: too big inline request\r\n",
        ),
        (
            big(b"*", 70 * 1024, b'1'),
            "-ERR Protocol error: too big mbulk count string\r\n",
        ),
        (
            big(b"*1\r\n$", 70 * 1024, b'1'),
            "-ERR Protocol error: too big bulk count string\r\n",
        ),
    ];
    for (input, expected) in &cases {
        protocol_error_case(&mut kite, &mut redis, input, expected);
    }
    // Commands before the bad frame in the same write are executed and answered first.
    let mut input = encode_command(&["SET", "before", "1"]);
    input.extend_from_slice(b"PING\r\n*x\r\n");
    input.extend_from_slice(&encode_command(&["SET", "after", "1"]));
    protocol_error_case(
        &mut kite,
        &mut redis,
        &input,
        "+OK\r\n+PONG\r\n-ERR Protocol error: invalid multibulk length\r\n",
    );
    let mut c = kite.client();
    assert_eq!(c.cmd(&["GET", "before"]), Resp::bulk("1"));
    assert_eq!(c.cmd(&["EXISTS", "after"]), Resp::Integer(0));
}

#[test]
fn unauthenticated_limits_match_redis() {
    let mut kite = KiteServer::start(&["--requirepass", "sekret"], 2);
    let mut redis = RedisServer::start_with(&["--requirepass", "sekret"]);
    // Before AUTH, Redis refuses big multibulk counts and big bulk lengths.
    protocol_error_case(
        &mut kite,
        &mut redis,
        b"*11\r\n",
        "-ERR Protocol error: unauthenticated multibulk length\r\n",
    );
    protocol_error_case(
        &mut kite,
        &mut redis,
        b"*1\r\n$16385\r\n",
        "-ERR Protocol error: unauthenticated bulk length\r\n",
    );
    // Small frames get NOAUTH and the connection stays open.
    let r = same_as_redis(
        &kite,
        &redis,
        b"*10\r\n$3\r\nGET\r\n",
        Finish::Quiet(Duration::from_millis(200)),
    );
    assert!(!r.closed && r.bytes.is_empty());
    let r = same_as_redis(
        &kite,
        &redis,
        b"GET k\r\nAUTH wrong\r\nAUTH sekret\r\nPING\r\n",
        Finish::HalfClose,
    );
    assert_eq!(
        String::from_utf8_lossy(&r.bytes),
        "-NOAUTH Authentication required.\r\n\
         -WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n+PONG\r\n"
    );
    // After AUTH the limits are gone.
    let mut c = kite.client();
    let big = "x".repeat(20_000);
    assert_eq!(c.cmd(&["SET", "k", big.as_str()]), Resp::ok());
    assert_eq!(c.cmd(&["STRLEN", "k"]), Resp::Integer(20_000));
}

#[test]
fn odd_but_valid_frames_match_redis() {
    let kite = KiteServer::start(&[], 2);
    let redis = RedisServer::start();
    let cases: &[&[u8]] = &[
        // Empty and non-positive multibulk counts are skipped silently.
        b"*0\r\n*-1\r\n*-5\r\nPING\r\n",
        // Blank inline lines are ignored; bare LF ends an inline command.
        b"\r\n\r\n   \r\nPING\n",
        // Inline commands: quoting and escapes.
        b"SET k \"a\\x41\\n\\t\\\\\" \r\nGET k\r\n",
        b"SET k 'it\\'s'\r\nGET k\r\n",
        b"ECHO \"\"\r\nECHO ''\r\n",
        b"  ECHO   spaced    out  \r\n",
        // An empty command name.
        b"*1\r\n$0\r\n\r\n",
        // The two bytes after a bulk payload are skipped, not checked.
        b"*2\r\n$4\r\nECHO\r\n$3\r\nabcXY*1\r\n$4\r\nPING\r\n",
        // Frames split at every point still parse (sent in one piece here, but the
        // reader must not assume alignment).
        b"*3\r\n$3\r\nSET\r\n$1\r\nz\r\n$0\r\n\r\n*2\r\n$3\r\nGET\r\n$1\r\nz\r\n",
        // Unknown command errors quote the arguments.
        b"*3\r\n$6\r\nNOPE!!\r\n$2\r\n\x00\xff\r\n$1\r\n'\r\n",
        b"nope a b\r\n",
        // Mixed inline and multibulk in one write.
        b"PING\r\n*1\r\n$4\r\nPING\r\nPING x\r\n",
    ];
    for input in cases {
        // Half-close: the server answers everything, then closes on EOF.
        let r = same_as_redis(&kite, &redis, input, Finish::HalfClose);
        assert!(
            !String::from_utf8_lossy(&r.bytes).contains("Protocol error"),
            "redis rejected {}",
            escape_bytes(input)
        );
    }
}

#[test]
fn partial_frames_are_completed_byte_by_byte() {
    let kite = KiteServer::start(&[], 2);
    let mut c = kite.client();
    let mut input = encode_command(&["SET", "slow", "v\r\nalue"]);
    input.extend_from_slice(&encode_command(&["GET", "slow"]));
    input.extend_from_slice(b"ECHO inline\r\n");
    for b in &input {
        c.send_raw(std::slice::from_ref(b));
        thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(c.read(), Resp::ok());
    assert_eq!(c.read(), Resp::bulk("v\r\nalue"));
    assert_eq!(c.read(), Resp::bulk("inline"));
}

#[test]
fn binary_keys_and_values_round_trip() {
    let kite = KiteServer::start(&[], 4);
    let mut c = kite.client();
    let all: Vec<u8> = (0u8..=255).collect();
    let samples: Vec<Vec<u8>> = vec![
        b"\x00".to_vec(),
        b"\r\n".to_vec(),
        b"\r".to_vec(),
        b"\n".to_vec(),
        b"\xff\x00\xff".to_vec(),
        b"*1\r\n$4\r\nPING\r\n".to_vec(),
        b"-ERR not an error\r\n".to_vec(),
        all.clone(),
        all.iter().rev().cloned().collect(),
        vec![0u8; 100_000],
    ];
    for (i, v) in samples.iter().enumerate() {
        let mut key = v.clone();
        key.truncate(300);
        key.extend_from_slice(format!("#{i}").as_bytes());
        assert_eq!(c.cmd(&[b"SET".as_slice(), &key, v]), Resp::ok());
        assert_eq!(
            c.cmd(&[b"GET".as_slice(), &key]),
            Resp::Bulk(v.clone()),
            "sample {i}"
        );
        assert_eq!(
            c.cmd(&[b"STRLEN".as_slice(), &key]),
            Resp::Integer(v.len() as i64)
        );
        assert_eq!(
            c.cmd(&[b"APPEND".as_slice(), &key, b"\x00\r\n"]),
            Resp::Integer(v.len() as i64 + 3)
        );
        let mut expected = v.clone();
        expected.extend_from_slice(b"\x00\r\n");
        assert_eq!(c.cmd(&[b"GET".as_slice(), &key]), Resp::Bulk(expected));
        let keys = c.cmd(&["KEYS", "*"]);
        assert!(
            bytes_set(&keys).contains(&key),
            "KEYS * lacks {}",
            escape_bytes(&key)
        );
    }
    // Through MSET/MGET across shards and through RESP3.
    let mut mset: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
    let mut mget: Vec<Vec<u8>> = vec![b"MGET".to_vec()];
    for b in 0u8..=255 {
        mset.push(vec![b'k', b]);
        mset.push(vec![b, b'\r', b'\n', b]);
        mget.push(vec![b'k', b]);
    }
    assert_eq!(c.cmd(&mset), Resp::ok());
    let r = c.cmd(&mget);
    let vals = r.as_array().expect("MGET array");
    for (b, v) in (0u8..=255).zip(vals) {
        assert_eq!(v, &Resp::Bulk(vec![b, b'\r', b'\n', b]));
    }
    let mut c3 = kite.client();
    assert!(matches!(c3.cmd(&["HELLO", "3"]), Resp::Map(_)));
    assert_eq!(
        c3.cmd(&[b"GET".as_slice(), b"k\x00"]),
        Resp::Bulk(b"\x00\r\n\x00".to_vec())
    );
}

#[test]
fn disconnect_mid_frame_leaves_server_healthy() {
    let mut kite = KiteServer::start(&[], 4);
    let partials: &[&[u8]] = &[
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nab",
        b"*3\r\n$3\r\nSET\r\n$1\r\nk",
        b"*3\r\n$3\r\nSET\r\n",
        b"*3\r\n$3\r\nSE",
        b"*3\r",
        b"SET k v",
        b"SET k \"unterminated",
        b"*1\r\n$536870912\r\nsome of a huge argument",
    ];
    for p in partials {
        let mut c = kite.raw_client();
        c.send_raw(p);
        drop(c);
    }
    // And with shutdown of the write side only (the server sees EOF mid-frame).
    for p in partials {
        let mut c = kite.raw_client();
        c.send_raw(p);
        c.shutdown_write();
        let (bytes, _) = c.read_raw_until_close(CLOSE_WAIT);
        assert!(
            bytes.is_empty(),
            "no reply expected for a partial frame, got {}",
            escape_bytes(&bytes)
        );
    }
    kite.assert_alive();
    let mut c = kite.client();
    assert_eq!(c.cmd(&["EXISTS", "k"]), Resp::Integer(0));
    assert_eq!(c.cmd(&["SET", "k", "ok"]), Resp::ok());
    assert_eq!(c.cmd(&["GET", "k"]), Resp::bulk("ok"));
}

fn pipeline_of_sets(n: usize, prefix: &str) -> Vec<u8> {
    let mut buf = Vec::new();
    for i in 0..n {
        buf.extend_from_slice(&encode_command(&[
            "SET".to_string(),
            format!("{prefix}:{i}"),
            format!("value-{i}"),
        ]));
    }
    buf
}

#[test]
fn disconnect_mid_pipeline_keeps_data_consistent() {
    let mut kite = KiteServer::start(&[], 4);
    // Close without reading any reply: some prefix of the SETs may be applied; each
    // applied key must hold its own value.
    for round in 0..5 {
        let prefix = format!("p{round}");
        let mut c = kite.raw_client();
        c.send_raw(&pipeline_of_sets(1000, &prefix));
        drop(c);
    }
    kite.assert_alive();
    let mut c = kite.client();
    for round in 0..5 {
        let keys: Vec<String> = (0..1000).map(|i| format!("p{round}:{i}")).collect();
        let mut cmd = vec!["MGET".to_string()];
        cmd.extend(keys.iter().cloned());
        let r = c.cmd(&cmd);
        for (i, v) in r.as_array().expect("MGET array").iter().enumerate() {
            if !v.is_null() {
                assert_eq!(v, &Resp::bulk(format!("value-{i}")), "key p{round}:{i}");
            }
        }
    }
    // Half-close (no more input, replies still readable): every command already sent
    // is executed and answered before the server closes.
    let mut h = kite.raw_client();
    h.send_raw(&pipeline_of_sets(1000, "half"));
    h.shutdown_write();
    for _ in 0..1000 {
        assert_eq!(h.read(), Resp::ok());
    }
    let (rest, closed) = h.read_raw_until_close(CLOSE_WAIT);
    assert!(rest.is_empty() && closed, "server must close after EOF");
    assert_eq!(c.cmd(&["GET", "half:999"]), Resp::bulk("value-999"));
    assert_eq!(c.cmd(&["DBSIZE"]).as_int().map(|n| n >= 1000), Some(true));
}

#[test]
fn deep_pipeline_replies_in_order() {
    let kite = KiteServer::start(&[], 4);
    let mut c = kite.client();
    const N: usize = 100_000;
    let mut buf = Vec::with_capacity(N * 40);
    for i in 0..N {
        match i % 4 {
            0 => buf.extend_from_slice(&encode_command(&[
                "SET".to_string(),
                format!("k:{}", i % 64),
                i.to_string(),
            ])),
            1 => buf.extend_from_slice(&encode_command(&[
                "GET".to_string(),
                format!("k:{}", (i - 1) % 64),
            ])),
            2 => buf.extend_from_slice(&encode_command(&["INCR", "ctr"])),
            _ => buf.extend_from_slice(&encode_command(&["ECHO".to_string(), i.to_string()])),
        }
    }
    // Write from another thread: a server may stop reading while replies pile up.
    let mut writer = c.try_clone_stream();
    let w = thread::spawn(move || writer.write_all(&buf));
    let mut incr = 0;
    for i in 0..N {
        let r = c.read();
        let expected = match i % 4 {
            0 => Resp::ok(),
            1 => Resp::bulk((i - 1).to_string()),
            2 => {
                incr += 1;
                Resp::Integer(incr)
            }
            _ => Resp::bulk(i.to_string()),
        };
        assert_eq!(r, expected, "reply #{i} of the pipeline");
    }
    w.join().expect("writer thread").expect("pipeline write");
    assert_eq!(c.cmd(&["GET", "ctr"]), Resp::bulk(incr.to_string()));
}

#[test]
fn huge_declared_lengths_do_not_crash() {
    let mut kite = KiteServer::start(&[], 2);
    let inputs: Vec<Vec<u8>> = vec![
        b"*2147483647\r\n".to_vec(),
        b"*2147483647\r\n$4\r\nPING\r\n$4\r\nPING\r\n".to_vec(),
        b"*1048576\r\n$3\r\nSET\r\n".to_vec(),
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\n".to_vec(),
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\nabcdef".to_vec(),
        b"*1\r\n$2147483647\r\n".to_vec(),
        b"*1\r\n$9223372036854775807\r\n".to_vec(),
        b"*9223372036854775807\r\n".to_vec(),
        b"*-2147483648\r\n".to_vec(),
        b"$2147483647\r\n".to_vec(),
    ];
    for input in &inputs {
        // Leave it hanging, then close.
        let mut c = kite.raw_client();
        c.send_raw(input);
        let (bytes, _) = c.read_raw_until_close(Duration::from_millis(150));
        drop(c);
        kite.assert_alive();
        // No reply may be a success for an incomplete command.
        assert!(
            !bytes.starts_with(b"+OK"),
            "incomplete command {} got {}",
            escape_bytes(input),
            escape_bytes(&bytes)
        );
    }
    // Many such connections at once.
    let conns: Vec<Client> = (0..20)
        .map(|i| {
            let mut c = kite.raw_client();
            c.send_raw(&inputs[i % inputs.len()]);
            c
        })
        .collect();
    kite.assert_alive();
    drop(conns);
    kite.assert_alive();
    let mut c = kite.client();
    assert_eq!(c.cmd(&["EXISTS", "k"]), Resp::Integer(0));
}

#[test]
fn random_garbage_never_crashes() {
    let mut kite = KiteServer::start(&[], 2);
    let mut rng = Rng::new(0xBAD_F00D);
    let valid = {
        let mut v = encode_command(&["SET", "g", "v"]);
        v.extend_from_slice(&encode_command(&["MGET", "a", "b", "c"]));
        v.extend_from_slice(b"PING\r\n");
        v
    };
    for i in 0..300 {
        let input = match i % 3 {
            0 => {
                let n = rng.range(1, 300) as usize;
                rng.bytes(n)
            }
            1 => {
                // Valid frames with a few bytes flipped, truncated or duplicated.
                let mut v = valid.clone();
                for _ in 0..rng.range(1, 4) {
                    let pos = rng.index(v.len());
                    match rng.below(3) {
                        0 => v[pos] = rng.next_u64() as u8,
                        1 => v.truncate(pos.max(1)),
                        _ => {
                            let b = v[pos];
                            v.insert(pos, b);
                        }
                    }
                }
                v
            }
            _ => {
                // Protocol-looking tokens glued at random.
                let tokens: &[&[u8]] = &[
                    b"*",
                    b"$",
                    b"\r\n",
                    b"-1",
                    b"0",
                    b"3",
                    b"99999999999",
                    b"SET",
                    b"PING",
                    b"\"",
                    b"'",
                    b" ",
                    b"\n",
                    b"\x00",
                    b"+",
                    b":",
                    b"%",
                    b"~",
                    b"|",
                    b"_",
                ];
                let mut v = Vec::new();
                for _ in 0..rng.range(1, 30) {
                    let t: &&[u8] = rng.pick(tokens);
                    v.extend_from_slice(t);
                }
                v
            }
        };
        let mut c = kite.raw_client();
        let _ = c.try_send_raw(&input);
        c.shutdown_write();
        let (bytes, _) = c.read_raw_until_close(Duration::from_secs(2));
        // Whatever came back must be well-formed RESP.
        let mut rest: &[u8] = &bytes;
        while !rest.is_empty() {
            let mut cur = std::io::Cursor::new(rest);
            match read_resp(&mut cur) {
                Ok(_) => rest = &rest[cur.position() as usize..],
                Err(e) => panic!(
                    "malformed reply {} to input {}: {e}",
                    escape_bytes(&bytes),
                    escape_bytes(&input)
                ),
            }
        }
        if i % 50 == 49 {
            kite.assert_alive();
        }
    }
    kite.assert_alive();
}
