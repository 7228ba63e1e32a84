//! Connection state and introspection, black-box, with Redis 7.2's behaviour as the
//! reference: CLIENT REPLY OFF / SKIP / ON (Pub/Sub traffic still delivered while OFF),
//! RESET (MONITOR, subscriptions, tracking, AUTH, db, name, protocol, MULTI, WATCH, reply
//! mode, no-evict / no-touch), CLIENT LIST / CLIENT INFO field names and order, CLIENT
//! SETINFO, the HELP subcommands, MEMORY DOCTOR / MALLOC-STATS / PURGE / USAGE / STATS,
//! LATENCY DOCTOR / GRAPH / LATEST / HISTORY / RESET / HISTOGRAM, LOLWUT, OBJECT FREQ, and
//! maxmemory with each eviction policy (evicted_keys, `evicted` keyspace events, OOM
//! errors under noeviction, evictions reaching a replica as DELs).
//!
//! Expected values were read from Redis 7.2.4 and redis-server 7.0.15 (valkey-server 8.1
//! agrees except where it adds fields or names itself).
//! Where 7.0 lacks a 7.2 feature (CLIENT SETINFO, the lib-name / lib-ver fields, CLIENT
//! NO-TOUCH, RESET clearing no-evict), the check is skipped only when the server under
//! test is a real redis-server 7.0 (`KITE_BIN`).

mod common;

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use common::{info_field, kite_is_redis, Client, KiteServer, Resp};

fn bulk(s: &str) -> Resp {
    Resp::bulk(s)
}

fn bulks(items: &[&str]) -> Resp {
    Resp::Array(items.iter().map(|s| bulk(s)).collect())
}

#[track_caller]
fn ok(c: &mut Client, cmd: &[&str]) {
    let r = c.cmd(cmd);
    assert_eq!(r, Resp::ok(), "reply to `{}`", cmd.join(" "));
}

#[track_caller]
fn expect(c: &mut Client, cmd: &[&str], expected: Resp) {
    let r = c.cmd(cmd);
    assert_eq!(r, expected, "reply to `{}`", cmd.join(" "));
}

fn resp3(port: u16) -> Client {
    let mut c = Client::connect(port);
    let r = c.cmd(&["HELLO", "3"]);
    assert!(matches!(r, Resp::Map(_)), "HELLO 3 answered {r}");
    c
}

/// Reads the next value within 10 s.
#[track_caller]
fn next(c: &mut Client, what: &str) -> Resp {
    c.set_timeout(Some(Duration::from_secs(10)));
    c.try_read()
        .unwrap_or_else(|e| panic!("{what}: nothing arrived: {e}"))
}

fn info_int(c: &mut Client, section: &str, field: &str) -> i64 {
    info_field(c, section, field).parse().unwrap()
}

/// True when the server under test is a real redis-server 7.0 (KITE_BIN), which lacks a
/// few of 7.2's features.
fn is_real_redis70(c: &mut Client) -> bool {
    kite_is_redis() && info_field(c, "server", "redis_version").starts_with("7.0.")
}

/// `CLIENT INFO` / one line of `CLIENT LIST` as (name, value) pairs, in order.
fn parse_client_line(line: &str) -> Vec<(String, String)> {
    line.split(' ')
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (k, v) = t
                .split_once('=')
                .unwrap_or_else(|| panic!("no '=' in field {t:?} of {line:?}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn client_info(c: &mut Client) -> Vec<(String, String)> {
    let r = c.cmd(&["CLIENT", "INFO"]);
    let text = r
        .as_string()
        .unwrap_or_else(|| panic!("CLIENT INFO answered {r}"));
    assert!(
        text.ends_with('\n'),
        "CLIENT INFO does not end in \\n: {text:?}"
    );
    assert_eq!(
        text.matches('\n').count(),
        1,
        "CLIENT INFO is one line: {text:?}"
    );
    parse_client_line(text.trim_end_matches('\n'))
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
}

// ---------------------------------------------------------------------------
// CLIENT REPLY
// ---------------------------------------------------------------------------

fn client_reply(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = s.client();
    let mut b = s.client();

    // OFF: no replies, but Pub/Sub confirmations and messages are still delivered.
    a.send(&["CLIENT", "REPLY", "OFF"]);
    a.send(&["SET", "x", "1"]);
    a.send(&["NOSUCHCOMMAND"]);
    a.send(&["SUBSCRIBE", "ch"]);
    assert_eq!(
        next(&mut a, "SUBSCRIBE while REPLY OFF"),
        bulks_int(&["subscribe", "ch"], 1),
        "the first thing read after CLIENT REPLY OFF, SET, a bad command and SUBSCRIBE"
    );
    expect(&mut b, &["PUBLISH", "ch", "hello"], Resp::Integer(1));
    assert_eq!(
        next(&mut a, "message while REPLY OFF"),
        bulks(&["message", "ch", "hello"])
    );
    a.send(&["UNSUBSCRIBE"]);
    assert_eq!(
        next(&mut a, "UNSUBSCRIBE while REPLY OFF"),
        bulks_int(&["unsubscribe", "ch"], 0)
    );
    a.send(&["CLIENT", "REPLY", "ON"]);
    assert_eq!(next(&mut a, "CLIENT REPLY ON"), Resp::ok());
    // The SET ran while replies were off.
    expect(&mut a, &["GET", "x"], bulk("1"));

    // SKIP: only the next command's reply is dropped.
    a.send(&["CLIENT", "REPLY", "SKIP"]);
    a.send(&["SET", "y", "2"]);
    expect(&mut a, &["GET", "y"], bulk("2"));
    expect(&mut a, &["PING"], Resp::simple("PONG"));

    expect(
        &mut a,
        &["CLIENT", "REPLY", "MAYBE"],
        Resp::Error("ERR syntax error".into()),
    );
    expect(&mut a, &["CLIENT", "REPLY", "ON"], Resp::ok());

    // RESP3: pushes still arrive while OFF; ON answers +OK even while subscribed.
    let mut c = resp3(s.port);
    c.send(&["CLIENT", "REPLY", "OFF"]);
    c.send(&["SUBSCRIBE", "ch2"]);
    assert_eq!(
        next(&mut c, "RESP3 SUBSCRIBE while REPLY OFF"),
        Resp::Push(vec![bulk("subscribe"), bulk("ch2"), Resp::Integer(1)])
    );
    expect(&mut b, &["PUBLISH", "ch2", "m"], Resp::Integer(1));
    assert_eq!(
        next(&mut c, "RESP3 message while REPLY OFF"),
        Resp::Push(vec![bulk("message"), bulk("ch2"), bulk("m")])
    );
    c.send(&["GET", "x"]);
    c.send(&["CLIENT", "REPLY", "ON"]);
    assert_eq!(next(&mut c, "RESP3 CLIENT REPLY ON"), Resp::ok());
    expect(&mut c, &["PING"], Resp::simple("PONG"));
}

fn bulks_int(items: &[&str], n: i64) -> Resp {
    let mut v: Vec<Resp> = items.iter().map(|s| bulk(s)).collect();
    v.push(Resp::Integer(n));
    Resp::Array(v)
}

#[test]
fn client_reply_off_skip_on_threads1() {
    client_reply(1);
}

#[test]
fn client_reply_off_skip_on_threads4() {
    client_reply(4);
}

// ---------------------------------------------------------------------------
// RESET
// ---------------------------------------------------------------------------

fn reset_basic(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let redis70 = is_real_redis70(&mut admin);
    ok(
        &mut admin,
        &["ACL", "SETUSER", "u1", "on", ">pw", "~*", "&*", "+@all"],
    );
    let mut a = s.client();
    ok(&mut a, &["AUTH", "u1", "pw"]);
    ok(&mut a, &["SELECT", "3"]);
    ok(&mut a, &["CLIENT", "SETNAME", "nm"]);
    ok(&mut a, &["CLIENT", "NO-EVICT", "on"]);
    let r = a.cmd(&["HELLO", "3"]);
    assert!(matches!(r, Resp::Map(_)), "HELLO 3 answered {r}");
    let before = client_info(&mut a);
    assert_eq!(field(&before, "user"), "u1");
    assert_eq!(field(&before, "db"), "3");
    assert_eq!(field(&before, "name"), "nm");
    assert_eq!(field(&before, "resp"), "3");
    ok(&mut a, &["WATCH", "w"]);
    ok(&mut a, &["MULTI"]);
    expect(&mut a, &["SET", "queued", "1"], Resp::simple("QUEUED"));

    // RESET is not queued inside MULTI.
    expect(&mut a, &["RESET"], Resp::simple("RESET"));
    let after = client_info(&mut a);
    for (name, value) in [
        ("user", "default"),
        ("db", "0"),
        ("name", ""),
        ("resp", "2"),
        ("multi", "-1"),
        ("sub", "0"),
        ("psub", "0"),
        ("redir", "-1"),
    ] {
        assert_eq!(field(&after, name), value, "CLIENT INFO {name} after RESET");
    }
    if !redis70 {
        // 7.2 clears no-evict too (7.0 keeps it).
        assert_eq!(field(&after, "flags"), "N", "CLIENT INFO flags after RESET");
    }
    expect(
        &mut a,
        &["EXEC"],
        Resp::Error("ERR EXEC without MULTI".into()),
    );
    // The queued SET never ran; the protocol is RESP2 again.
    expect(&mut a, &["EXISTS", "queued"], Resp::Integer(0));
    expect(&mut a, &["HGETALL", "nokey"], Resp::Array(vec![]));
    // The WATCH is gone: a change to w no longer aborts a transaction.
    ok(&mut admin, &["SET", "w", "changed"]);
    ok(&mut a, &["MULTI"]);
    expect(&mut a, &["SET", "z", "1"], Resp::simple("QUEUED"));
    expect(&mut a, &["EXEC"], Resp::Array(vec![Resp::ok()]));

    // CLIENT REPLY OFF: RESET still answers, and replies are on again.
    a.send(&["CLIENT", "REPLY", "OFF"]);
    a.send(&["RESET"]);
    assert_eq!(
        next(&mut a, "RESET after CLIENT REPLY OFF"),
        Resp::simple("RESET")
    );
    expect(&mut a, &["PING"], Resp::simple("PONG"));

    if !redis70 {
        ok(&mut a, &["CLIENT", "NO-TOUCH", "on"]);
        ok(&mut a, &["CLIENT", "NO-EVICT", "on"]);
        let f = client_info(&mut a);
        assert_eq!(field(&f, "flags"), "eT", "flags with no-evict and no-touch");
        expect(&mut a, &["RESET"], Resp::simple("RESET"));
        let f = client_info(&mut a);
        assert_eq!(field(&f, "flags"), "N", "flags after RESET");
    }
}

#[test]
fn reset_connection_state_threads1() {
    reset_basic(1);
}

#[test]
fn reset_connection_state_threads4() {
    reset_basic(4);
}

fn reset_monitor_and_pubsub(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut b = s.client();

    let mut m = s.client();
    ok(&mut m, &["MONITOR"]);
    ok(&mut b, &["SET", "q", "1"]);
    let line = next(&mut m, "MONITOR line").as_string().unwrap_or_default();
    assert!(
        line.ends_with("\"SET\" \"q\" \"1\""),
        "MONITOR line for SET q 1: {line:?}"
    );
    expect(&mut m, &["RESET"], Resp::simple("RESET"));
    ok(&mut b, &["SET", "q", "2"]);
    expect(&mut m, &["PING"], Resp::simple("PONG"));
    assert_eq!(field(&client_info(&mut m), "flags"), "N");

    let mut p = s.client();
    assert_eq!(
        p.cmd(&["SUBSCRIBE", "c1"]),
        bulks_int(&["subscribe", "c1"], 1)
    );
    assert_eq!(
        p.cmd(&["PSUBSCRIBE", "p*"]),
        bulks_int(&["psubscribe", "p*"], 2)
    );
    expect(&mut b, &["PUBLISH", "c1", "x"], Resp::Integer(1));
    assert_eq!(
        next(&mut p, "message before RESET"),
        bulks(&["message", "c1", "x"])
    );
    // RESET is allowed in the subscribed state.
    expect(&mut p, &["RESET"], Resp::simple("RESET"));
    expect(&mut b, &["PUBLISH", "c1", "x"], Resp::Integer(0));
    expect(&mut b, &["PUBLISH", "pz", "x"], Resp::Integer(0));
    // A plain PONG, not the subscribed-state ["pong", ""].
    expect(&mut p, &["PING"], Resp::simple("PONG"));
    let f = client_info(&mut p);
    assert_eq!((field(&f, "sub"), field(&f, "psub")), ("0", "0"));
    assert_eq!(field(&f, "flags"), "N");
}

#[test]
fn reset_monitor_and_subscriptions_threads1() {
    reset_monitor_and_pubsub(1);
}

#[test]
fn reset_monitor_and_subscriptions_threads4() {
    reset_monitor_and_pubsub(4);
}

#[test]
fn reset_tracking() {
    let s = KiteServer::start(&[], 1);
    let mut a = resp3(s.port);
    let mut b = s.client();
    ok(&mut a, &["CLIENT", "TRACKING", "ON"]);
    expect(&mut a, &["GET", "k"], Resp::Null);
    expect(&mut a, &["RESET"], Resp::simple("RESET"));
    ok(&mut b, &["SET", "k", "1"]);
    expect(&mut a, &["PING"], Resp::simple("PONG"));
    expect(
        &mut a,
        &["CLIENT", "TRACKINGINFO"],
        Resp::Array(vec![
            bulk("flags"),
            bulks(&["off"]),
            bulk("redirect"),
            Resp::Integer(-1),
            bulk("prefixes"),
            bulks(&[]),
        ]),
    );
}

// ---------------------------------------------------------------------------
// CLIENT LIST / CLIENT INFO / CLIENT SETINFO
// ---------------------------------------------------------------------------

/// Redis 7.2's fields, in order (7.2 added lib-name and lib-ver; 7.4 adds watch, and
/// valkey 8.1 also capa, tot-net-in, tot-net-out, tot-cmds, which 7.2 does not have).
const FIELDS_72: &[&str] = &[
    "id",
    "addr",
    "laddr",
    "fd",
    "name",
    "age",
    "idle",
    "flags",
    "db",
    "sub",
    "psub",
    "ssub",
    "multi",
    "qbuf",
    "qbuf-free",
    "argv-mem",
    "multi-mem",
    "rbs",
    "rbp",
    "obl",
    "oll",
    "omem",
    "tot-mem",
    "events",
    "cmd",
    "user",
    "redir",
    "resp",
    "lib-name",
    "lib-ver",
];

fn expected_fields(c: &mut Client) -> Vec<&'static str> {
    if is_real_redis70(c) {
        FIELDS_72[..FIELDS_72.len() - 2].to_vec()
    } else {
        FIELDS_72.to_vec()
    }
}

fn names(fields: &[(String, String)]) -> Vec<&str> {
    fields.iter().map(|(k, _)| k.as_str()).collect()
}

fn local_port(c: &Client) -> u16 {
    c.try_clone_stream().local_addr().unwrap().port()
}

fn client_list_fields(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = s.client();
    let expected = expected_fields(&mut a);

    let info = client_info(&mut a);
    assert_eq!(names(&info), expected, "CLIENT INFO field names and order");
    let id = a.cmd(&["CLIENT", "ID"]).as_int().unwrap();
    assert_eq!(field(&info, "id"), id.to_string());
    assert_eq!(
        field(&info, "addr"),
        format!("127.0.0.1:{}", local_port(&a))
    );
    assert_eq!(field(&info, "laddr"), format!("127.0.0.1:{}", s.port));
    assert!(field(&info, "fd").parse::<i64>().is_ok());
    for (name, value) in [
        ("name", ""),
        ("flags", "N"),
        ("db", "0"),
        ("sub", "0"),
        ("psub", "0"),
        ("ssub", "0"),
        ("multi", "-1"),
        ("cmd", "client|info"),
        ("user", "default"),
        ("redir", "-1"),
        ("resp", "2"),
    ] {
        assert_eq!(field(&info, name), value, "CLIENT INFO {name}");
    }

    // A variety of connections.
    let mut named = s.client();
    ok(&mut named, &["CLIENT", "SETNAME", "worker-1"]);
    ok(&mut named, &["SELECT", "5"]);
    let mut sub = s.client();
    sub.cmd(&["SUBSCRIBE", "news"]);
    let mut multi = s.client();
    ok(&mut multi, &["MULTI"]);
    expect(&mut multi, &["INCR", "n"], Resp::simple("QUEUED"));
    let r3 = resp3(s.port);
    let mut blocked = s.client();
    blocked.send(&["BLPOP", "never", "0"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while info_int(&mut a, "clients", "blocked_clients") != 1 {
        assert!(Instant::now() < deadline, "BLPOP never blocked");
        thread::sleep(Duration::from_millis(5));
    }

    let r = a.cmd(&["CLIENT", "LIST"]);
    let text = r
        .as_string()
        .unwrap_or_else(|| panic!("CLIENT LIST answered {r}"));
    assert!(text.ends_with('\n'), "CLIENT LIST ends in \\n");
    let lines: Vec<Vec<(String, String)>> = text.lines().map(parse_client_line).collect();
    assert_eq!(lines.len(), 6, "one line per connection:\n{text}");
    for l in &lines {
        assert_eq!(names(l), expected, "CLIENT LIST field names and order");
    }
    let by_port = |port: u16| -> &Vec<(String, String)> {
        let addr = format!("127.0.0.1:{port}");
        lines
            .iter()
            .find(|l| field(l, "addr") == addr)
            .unwrap_or_else(|| panic!("no CLIENT LIST line for {addr}:\n{text}"))
    };
    let l = by_port(local_port(&a));
    assert_eq!(field(l, "cmd"), "client|list");
    let l = by_port(local_port(&named));
    assert_eq!(
        (field(l, "name"), field(l, "db"), field(l, "cmd")),
        ("worker-1", "5", "select")
    );
    let l = by_port(local_port(&sub));
    assert_eq!(
        (field(l, "flags"), field(l, "sub"), field(l, "cmd")),
        ("P", "1", "subscribe")
    );
    let l = by_port(local_port(&multi));
    assert_eq!((field(l, "flags"), field(l, "multi")), ("x", "1"));
    let l = by_port(local_port(&r3));
    assert_eq!((field(l, "resp"), field(l, "cmd")), ("3", "hello"));
    let l = by_port(local_port(&blocked));
    assert_eq!((field(l, "flags"), field(l, "cmd")), ("b", "blpop"));

    // Filters.
    let sub_id = sub_id_of(&lines, local_port(&sub));
    let r = a.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    let t = r.as_string().unwrap();
    assert_eq!(t.lines().count(), 1, "CLIENT LIST TYPE pubsub:\n{t}");
    assert_eq!(field(&parse_client_line(t.trim_end()), "id"), sub_id);
    let r = a.cmd(&["CLIENT", "LIST", "TYPE", "normal"]);
    assert_eq!(r.as_string().unwrap().lines().count(), 5);
    let named_id = named.cmd(&["CLIENT", "ID"]).as_int().unwrap().to_string();
    let r = a.cmd(&["CLIENT", "LIST", "ID", &named_id, &sub_id, "999999"]);
    let t = r.as_string().unwrap();
    let ids: BTreeSet<String> = t
        .lines()
        .map(|l| field(&parse_client_line(l), "id").to_string())
        .collect();
    assert_eq!(ids, BTreeSet::from([named_id.clone(), sub_id.clone()]));
    expect(
        &mut a,
        &["CLIENT", "LIST", "TYPE", "nosuchtype"],
        Resp::Error("ERR Unknown client type 'nosuchtype'".into()),
    );
    expect(
        &mut a,
        &["CLIENT", "LIST", "ID", "notanumber"],
        Resp::Error("ERR Invalid client ID".into()),
    );
    drop(blocked);
}

fn sub_id_of(lines: &[Vec<(String, String)>], port: u16) -> String {
    let addr = format!("127.0.0.1:{port}");
    let l = lines.iter().find(|l| field(l, "addr") == addr).unwrap();
    field(l, "id").to_string()
}

#[test]
fn client_list_and_info_fields_threads1() {
    client_list_fields(1);
}

#[test]
fn client_list_and_info_fields_threads4() {
    client_list_fields(4);
}

#[test]
fn client_setinfo() {
    let s = KiteServer::start(&[], 1);
    let mut a = s.client();
    if is_real_redis70(&mut a) {
        eprintln!("CLIENT SETINFO is new in 7.2: skipped against redis-server 7.0");
        return;
    }
    ok(&mut a, &["CLIENT", "SETINFO", "LIB-NAME", "mylib"]);
    ok(&mut a, &["CLIENT", "SETINFO", "lib-ver", "1.2.3"]);
    let f = client_info(&mut a);
    assert_eq!(
        (field(&f, "lib-name"), field(&f, "lib-ver")),
        ("mylib", "1.2.3")
    );
    let mut b = s.client();
    let r = b.cmd(&["CLIENT", "LIST", "ID", field(&f, "id")]);
    let l = parse_client_line(r.as_string().unwrap().trim_end());
    assert_eq!(
        (field(&l, "lib-name"), field(&l, "lib-ver")),
        ("mylib", "1.2.3")
    );
    let err = |t: &str| Resp::Error(t.to_string());
    expect(
        &mut a,
        &["CLIENT", "SETINFO", "LIB-NAME", "bad name"],
        err("ERR LIB-NAME cannot contain spaces, newlines or special characters."),
    );
    expect(
        &mut a,
        &["CLIENT", "SETINFO", "LIB-VER", "bad\nver"],
        err("ERR LIB-VER cannot contain spaces, newlines or special characters."),
    );
    expect(
        &mut a,
        &["CLIENT", "SETINFO", "FOO", "x"],
        err("ERR Unrecognized option 'FOO'"),
    );
    expect(
        &mut a,
        &["CLIENT", "SETINFO", "LIB-NAME"],
        err("ERR wrong number of arguments for 'client|setinfo' command"),
    );
    // The refused values left the old ones.
    let f = client_info(&mut a);
    assert_eq!(
        (field(&f, "lib-name"), field(&f, "lib-ver")),
        ("mylib", "1.2.3")
    );
    // RESET keeps them; an empty value clears one.
    expect(&mut a, &["RESET"], Resp::simple("RESET"));
    let f = client_info(&mut a);
    assert_eq!(
        (field(&f, "lib-name"), field(&f, "lib-ver")),
        ("mylib", "1.2.3")
    );
    ok(&mut a, &["CLIENT", "SETINFO", "LIB-NAME", ""]);
    let f = client_info(&mut a);
    assert_eq!((field(&f, "lib-name"), field(&f, "lib-ver")), ("", "1.2.3"));
}

// ---------------------------------------------------------------------------
// HELP subcommands
// ---------------------------------------------------------------------------

#[test]
fn help_subcommands() {
    let s = KiteServer::start(&[], 1);
    let mut a = s.client();
    let redis70 = is_real_redis70(&mut a);
    let mut a3 = resp3(s.port);
    // Every discrepancy is collected, so one run shows them all.
    let mut problems: Vec<String> = Vec::new();
    let last = if redis70 {
        "    Prints this help."
    } else {
        "    Print this help."
    };
    for cmd in [
        "CLIENT", "CONFIG", "OBJECT", "MEMORY", "LATENCY", "XINFO", "COMMAND", "ACL", "PUBSUB",
        "SCRIPT", "FUNCTION", "SLOWLOG", "XGROUP",
    ] {
        for (proto, c) in [(2, &mut a), (3, &mut a3)] {
            let r = c.cmd(&[cmd, "HELP"]);
            let lines = match &r {
                Resp::Array(v) => v.clone(),
                other => {
                    problems.push(format!("{cmd} HELP (RESP{proto}) answered {other}"));
                    continue;
                }
            };
            if let Some(bad) = lines.iter().find(|l| !matches!(l, Resp::Simple(_))) {
                problems.push(format!("{cmd} HELP: a line is not a simple string: {bad}"));
                continue;
            }
            let text: Vec<String> = lines.iter().map(|l| l.as_string().unwrap()).collect();
            let first = format!("{cmd} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:");
            if text.first() != Some(&first) {
                problems.push(format!(
                    "{cmd} HELP (RESP{proto}) first line {:?}, expected {first:?}",
                    text.first()
                ));
            }
            if !text.iter().any(|l| l == "HELP") {
                problems.push(format!("{cmd} HELP has no \"HELP\" line"));
            }
            if text.last().map(String::as_str) != Some(last) {
                problems.push(format!(
                    "{cmd} HELP (RESP{proto}) last line {:?}, expected {last:?}",
                    text.last()
                ));
            }
            if text.len() <= 3 {
                problems.push(format!("{cmd} HELP lists no subcommands: {text:?}"));
            }
        }
        // Lower case works too.
        let lower = cmd.to_lowercase();
        let r = a.cmd(&[lower.as_str(), "help"]);
        if !matches!(r, Resp::Array(_)) {
            problems.push(format!("{lower} help answered {r}"));
        }
    }
    problems.dedup();
    assert!(
        problems.is_empty(),
        "HELP replies differ from Redis 7.2:\n{}",
        problems.join("\n")
    );
    expect(
        &mut a,
        &["CLIENT", "HELP", "extra"],
        Resp::Error("ERR wrong number of arguments for 'client|help' command".into()),
    );
    expect(
        &mut a,
        &["CLIENT", "NOSUCH"],
        Resp::Error("ERR unknown subcommand 'NOSUCH'. Try CLIENT HELP.".into()),
    );
    expect(
        &mut a,
        &["OBJECT", "nosuch"],
        Resp::Error("ERR unknown subcommand 'nosuch'. Try OBJECT HELP.".into()),
    );
}

// ---------------------------------------------------------------------------
// MEMORY / LATENCY / LOLWUT / OBJECT FREQ
// ---------------------------------------------------------------------------

/// A non-empty string reply: bulk in RESP2, bulk or verbatim `txt` in RESP3.
#[track_caller]
fn text_reply(r: &Resp, proto: u8, what: &str, verbatim_in_resp3: bool) -> String {
    match r {
        Resp::Bulk(b) => {
            assert!(
                proto == 2 || !verbatim_in_resp3,
                "{what}: RESP3 should be a verbatim string, got a bulk string"
            );
            assert!(!b.is_empty(), "{what}: empty");
            String::from_utf8_lossy(b).into_owned()
        }
        Resp::Verbatim { format, text } => {
            assert_eq!(proto, 3, "{what}: a verbatim string in RESP2");
            assert_eq!(format, "txt", "{what}: verbatim format");
            assert!(!text.is_empty(), "{what}: empty");
            String::from_utf8_lossy(text).into_owned()
        }
        other => panic!("{what}: expected a string, got {other}"),
    }
}

#[test]
fn memory_commands() {
    let s = KiteServer::start(&[], 1);
    let mut a2 = s.client();
    let mut a3 = resp3(s.port);
    ok(&mut a2, &["SET", "k", "some value"]);
    for (proto, a) in [(2u8, &mut a2), (3u8, &mut a3)] {
        let r = a.cmd(&["MEMORY", "DOCTOR"]);
        text_reply(&r, proto, "MEMORY DOCTOR", true);
        let r = a.cmd(&["MEMORY", "MALLOC-STATS"]);
        // Verbatim with jemalloc's report, a plain bulk string for other allocators.
        text_reply(&r, proto, "MEMORY MALLOC-STATS", false);
        expect(a, &["MEMORY", "PURGE"], Resp::ok());
        let usage = a.cmd(&["MEMORY", "USAGE", "k"]);
        assert!(
            usage.as_int().is_some_and(|n| n > 0),
            "MEMORY USAGE k: {usage}"
        );
        let r = a.cmd(&["MEMORY", "USAGE", "nokey"]);
        assert!(r.is_null(), "MEMORY USAGE of a missing key: {r}");
        let stats = a.cmd(&["MEMORY", "STATS"]);
        let keys: Vec<String> = match (&stats, proto) {
            (Resp::Array(v), 2) => {
                assert_eq!(v.len() % 2, 0, "MEMORY STATS: name/value pairs");
                v.iter()
                    .step_by(2)
                    .map(|k| k.as_string().unwrap())
                    .collect()
            }
            (Resp::Map(m), 3) => m.iter().map(|(k, _)| k.as_string().unwrap()).collect(),
            (other, _) => panic!("MEMORY STATS (RESP{proto}): {other}"),
        };
        assert_eq!(keys[0], "peak.allocated", "MEMORY STATS first field");
        for k in [
            "total.allocated",
            "startup.allocated",
            "keys.count",
            "dataset.bytes",
        ] {
            assert!(
                keys.iter().any(|x| x == k),
                "MEMORY STATS lacks {k}: {keys:?}"
            );
        }
    }
    expect(
        &mut a2,
        &["MEMORY", "USAGE"],
        Resp::Error("ERR wrong number of arguments for 'memory|usage' command".into()),
    );
}

#[test]
fn latency_commands() {
    let s = KiteServer::start(&["--enable-debug-command", "local"], 1);
    let mut a2 = s.client();
    let mut a3 = resp3(s.port);
    for (proto, a) in [(2u8, &mut a2), (3u8, &mut a3)] {
        let r = a.cmd(&["LATENCY", "DOCTOR"]);
        let t = text_reply(&r, proto, "LATENCY DOCTOR", true);
        assert!(
            t.starts_with(
                "I'm sorry, Dave, I can't do that. Latency monitoring is disabled in this"
            ),
            "LATENCY DOCTOR with monitoring off: {t:?}"
        );
        expect(
            a,
            &["LATENCY", "GRAPH", "command"],
            Resp::Error("ERR No samples available for event 'command'".into()),
        );
        expect(a, &["LATENCY", "LATEST"], Resp::Array(vec![]));
        expect(a, &["LATENCY", "HISTORY", "command"], Resp::Array(vec![]));
        expect(a, &["LATENCY", "RESET"], Resp::Integer(0));
    }

    // A 50 ms command with a 10 ms threshold is one `command` event.
    ok(
        &mut a2,
        &["CONFIG", "SET", "latency-monitor-threshold", "10"],
    );
    ok(&mut a2, &["DEBUG", "SLEEP", "0.05"]);
    let latest = a2.cmd(&["LATENCY", "LATEST"]);
    let ev = match &latest {
        Resp::Array(v) if v.len() == 1 => v[0].as_array().unwrap().to_vec(),
        other => panic!("LATENCY LATEST after a slow command: {other}"),
    };
    assert_eq!(ev.len(), 4, "LATENCY LATEST entry: {latest}");
    assert_eq!(ev[0], bulk("command"));
    let ms = ev[2].as_int().unwrap();
    assert!(ms >= 50, "latency {ms} ms for DEBUG SLEEP 0.05");
    assert_eq!(ev[3].as_int(), Some(ms), "max = latest for one event");
    let hist = a2.cmd(&["LATENCY", "HISTORY", "command"]);
    match &hist {
        Resp::Array(v) if v.len() == 1 => {
            let e = v[0].as_array().unwrap();
            assert_eq!(e.len(), 2);
            assert_eq!(e[0], ev[1], "HISTORY's timestamp is LATEST's");
            assert_eq!(e[1].as_int(), Some(ms));
        }
        other => panic!("LATENCY HISTORY command: {other}"),
    }
    let g = a2.cmd(&["LATENCY", "GRAPH", "command"]);
    let g = text_reply(&g, 2, "LATENCY GRAPH", true);
    assert!(
        g.starts_with(&format!(
            "command - high {ms} ms, low {ms} ms (all time high {ms} ms)\n"
        )),
        "LATENCY GRAPH: {g:?}"
    );
    let d = a3.cmd(&["LATENCY", "DOCTOR"]);
    let d = text_reply(&d, 3, "LATENCY DOCTOR", true);
    assert!(
        d.starts_with("Dave, I have observed latency spikes in this"),
        "LATENCY DOCTOR after a spike: {d:?}"
    );
    expect(&mut a2, &["LATENCY", "RESET"], Resp::Integer(1));
    expect(&mut a2, &["LATENCY", "LATEST"], Resp::Array(vec![]));
    ok(
        &mut a2,
        &["CONFIG", "SET", "latency-monitor-threshold", "0"],
    );

    // LATENCY HISTOGRAM: per command, calls and cumulative power-of-two buckets.
    ok(&mut a2, &["CONFIG", "RESETSTAT"]);
    for _ in 0..3 {
        ok(&mut a2, &["SET", "k", "v"]);
    }
    for _ in 0..2 {
        expect(&mut a2, &["GET", "k"], bulk("v"));
    }
    let check_buckets = |pairs: Vec<(i64, i64)>, calls: i64, what: &str| {
        assert!(!pairs.is_empty(), "{what}: no buckets");
        let mut prev = (0, 0);
        for (b, n) in &pairs {
            assert!(
                *b > 0 && (*b as u64).is_power_of_two() && *b > prev.0,
                "{what}: bucket {b} after {}",
                prev.0
            );
            assert!(
                *n > prev.1,
                "{what}: counts are cumulative and grow: {pairs:?}"
            );
            prev = (*b, *n);
        }
        assert_eq!(prev.1, calls, "{what}: the last bucket counts every call");
    };
    let r = a2.cmd(&[
        "LATENCY",
        "HISTOGRAM",
        "set",
        "get",
        "nosuchcommand",
        "lpush",
    ]);
    let v = r
        .as_array()
        .unwrap_or_else(|| panic!("LATENCY HISTOGRAM: {r}"));
    assert_eq!(
        v.len(),
        4,
        "two commands with calls (RESP2: name, details): {r}"
    );
    let mut names = Vec::new();
    for pair in v.chunks(2) {
        let name = pair[0].as_string().unwrap();
        let d = pair[1].as_array().unwrap();
        assert_eq!(d.len(), 4, "{name}: calls, n, histogram_usec, [...]: {r}");
        assert_eq!(d[0], bulk("calls"));
        assert_eq!(d[2], bulk("histogram_usec"));
        let calls = d[1].as_int().unwrap();
        let flat = d[3].as_array().unwrap();
        let pairs: Vec<(i64, i64)> = flat
            .chunks(2)
            .map(|c| (c[0].as_int().unwrap(), c[1].as_int().unwrap()))
            .collect();
        check_buckets(pairs, calls, &name);
        names.push((name, calls));
    }
    names.sort();
    assert_eq!(names, vec![("get".to_string(), 2), ("set".to_string(), 3)]);
    // RESP3: a map of maps.
    let r = a3.cmd(&["LATENCY", "HISTOGRAM", "set"]);
    match &r {
        Resp::Map(m) if m.len() == 1 => {
            assert_eq!(m[0].0, bulk("set"));
            match &m[0].1 {
                Resp::Map(d) if d.len() == 2 => {
                    assert_eq!(d[0].0, bulk("calls"));
                    assert_eq!(d[0].1, Resp::Integer(3));
                    assert_eq!(d[1].0, bulk("histogram_usec"));
                    match &d[1].1 {
                        Resp::Map(b) => check_buckets(
                            b.iter()
                                .map(|(k, v)| (k.as_int().unwrap(), v.as_int().unwrap()))
                                .collect(),
                            3,
                            "RESP3 set",
                        ),
                        other => panic!("RESP3 histogram_usec: {other}"),
                    }
                }
                other => panic!("RESP3 LATENCY HISTOGRAM set details: {other}"),
            }
        }
        other => panic!("RESP3 LATENCY HISTOGRAM set: {other}"),
    }
    expect(
        &mut a3,
        &["LATENCY", "HISTOGRAM", "nosuchcommand"],
        Resp::Map(vec![]),
    );
    expect(
        &mut a2,
        &["LATENCY", "HISTOGRAM", "nosuchcommand"],
        Resp::Array(vec![]),
    );
}

#[test]
fn lolwut() {
    let s = KiteServer::start(&[], 1);
    let mut a2 = s.client();
    let version = info_field(&mut a2, "server", "redis_version");
    let mut a3 = resp3(s.port);
    for (proto, a) in [(2u8, &mut a2), (3u8, &mut a3)] {
        let r = a.cmd(&["LOLWUT"]);
        let t = text_reply(&r, proto, "LOLWUT", true);
        assert!(
            t.ends_with(&format!("Redis ver. {version}\n")),
            "LOLWUT: {t:?}"
        );
        let r = a.cmd(&["LOLWUT", "VERSION", "5", "1", "1", "1"]);
        let t = text_reply(&r, proto, "LOLWUT VERSION 5", true);
        assert!(
            t.ends_with(&format!(
                "\n\nGeorg Nees - schotter, plotter on paper, 1968. Redis ver. {version}\n"
            )),
            "LOLWUT VERSION 5: {t:?}"
        );
        let r = a.cmd(&["LOLWUT", "VERSION", "6"]);
        let t = text_reply(&r, proto, "LOLWUT VERSION 6", true);
        assert!(
            t.ends_with(&format!(
                "Original 8 bit image from Plaguemon by hikikomori. Redis ver. {version}\n"
            )),
            "LOLWUT VERSION 6: {:?}",
            &t[t.len().saturating_sub(200)..]
        );
    }
}

#[test]
fn object_freq() {
    let s = KiteServer::start(&[], 1);
    let mut a = s.client();
    ok(&mut a, &["SET", "k", "value"]);
    let lfu_off = "ERR An LFU maxmemory policy is not selected, access frequency not tracked. \
                   Please note that when switching between policies at runtime LRU and LFU \
                   data will take some time to adjust.";
    expect(
        &mut a,
        &["OBJECT", "FREQ", "k"],
        Resp::Error(lfu_off.into()),
    );
    assert!(a.cmd(&["OBJECT", "IDLETIME", "k"]).as_int().is_some());
    ok(
        &mut a,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"],
    );
    // No decay: a wall-clock minute boundary between two reads would lower the counter.
    ok(&mut a, &["CONFIG", "SET", "lfu-decay-time", "0"]);
    ok(&mut a, &["SET", "cold", "cold-value"]);
    ok(&mut a, &["SET", "hot", "hot-value"]);
    for _ in 0..100 {
        expect(&mut a, &["GET", "hot"], bulk("hot-value"));
    }
    let cold = a.cmd(&["OBJECT", "FREQ", "cold"]).as_int();
    let hot = a.cmd(&["OBJECT", "FREQ", "hot"]).as_int();
    let (cold, hot) = (
        cold.expect("OBJECT FREQ cold"),
        hot.expect("OBJECT FREQ hot"),
    );
    assert!(
        hot > cold && cold >= 0,
        "OBJECT FREQ: hot {hot} should exceed cold {cold}"
    );
    // OBJECT FREQ does not count as an access.
    expect(&mut a, &["OBJECT", "FREQ", "cold"], Resp::Integer(cold));
    assert!(a.cmd(&["OBJECT", "FREQ", "nokey"]).is_null());
    expect(
        &mut a,
        &["OBJECT", "IDLETIME", "hot"],
        Resp::Error(
            "ERR An LFU maxmemory policy is selected, idle time not tracked. Please note \
             that when switching between policies at runtime LRU and LFU data will take \
             some time to adjust."
                .into(),
        ),
    );
    ok(
        &mut a,
        &["CONFIG", "SET", "maxmemory-policy", "volatile-lfu"],
    );
    assert!(a.cmd(&["OBJECT", "FREQ", "hot"]).as_int().is_some());
    ok(
        &mut a,
        &["CONFIG", "SET", "maxmemory-policy", "volatile-lru"],
    );
    expect(
        &mut a,
        &["OBJECT", "FREQ", "hot"],
        Resp::Error(lfu_off.into()),
    );
    expect(
        &mut a,
        &["CONFIG", "SET", "maxmemory-policy", "bogus"],
        Resp::Error(
            "ERR CONFIG SET failed (possibly related to argument 'maxmemory-policy') - \
             argument(s) must be one of the following: volatile-lru, volatile-lfu, \
             volatile-random, volatile-ttl, allkeys-lru, allkeys-lfu, allkeys-random, \
             noeviction"
                .into(),
        ),
    );
}

// ---------------------------------------------------------------------------
// maxmemory and eviction
// ---------------------------------------------------------------------------

const VALUE_LEN: usize = 5000;

/// Writes `n` keys `<prefix>0..` of VALUE_LEN bytes (with EX 1000 when `volatile`).
fn fill(c: &mut Client, prefix: &str, n: usize, volatile: bool) -> Vec<String> {
    let val = "x".repeat(VALUE_LEN);
    (0..n)
        .map(|i| {
            let k = format!("{prefix}{i}");
            if volatile {
                ok(c, &["SET", &k, &val, "EX", "1000"]);
            } else {
                ok(c, &["SET", &k, &val]);
            }
            k
        })
        .collect()
}

/// Lowers maxmemory to `used_memory - below` and writes small keys until something is
/// evicted (bounded); then lifts the limit. Returns the names of the small keys.
fn squeeze(c: &mut Client, below: i64) -> Vec<String> {
    let used = info_int(c, "memory", "used_memory");
    let limit = (used - below).max(1);
    ok(c, &["CONFIG", "SET", "maxmemory", &limit.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut small = Vec::new();
    while info_int(c, "stats", "evicted_keys") == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing evicted with maxmemory {limit} (used_memory was {used})"
        );
        let k = format!("small:{}", small.len());
        let r = c.cmd(&["SET", &k, "v"]);
        assert_eq!(r, Resp::ok(), "SET {k} under maxmemory");
        small.push(k);
    }
    ok(c, &["CONFIG", "SET", "maxmemory", "0"]);
    small
}

fn missing_keys(c: &mut Client, keys: &[String]) -> BTreeSet<String> {
    keys.iter()
        .filter(|k| c.cmd(&["EXISTS", k.as_str()]) == Resp::Integer(0))
        .cloned()
        .collect()
}

/// Reads `evicted` keyevent messages until every key in `missing` was reported; each
/// message must name a missing key, once.
fn expect_evicted_events(sub: &mut Client, missing: &BTreeSet<String>) {
    let mut seen = BTreeSet::new();
    while seen.len() < missing.len() {
        let r = next(sub, "an `evicted` keyspace event");
        let v = r
            .as_array()
            .unwrap_or_else(|| panic!("expected a message, got {r}"));
        assert_eq!(v.len(), 3, "{r}");
        assert_eq!(v[0], bulk("message"));
        assert_eq!(v[1], bulk("__keyevent@0__:evicted"));
        let key = v[2].as_string().unwrap();
        assert!(
            missing.contains(&key),
            "`evicted` event for {key}, which exists"
        );
        assert!(seen.insert(key.clone()), "two `evicted` events for {key}");
    }
    expect(sub, &["PING"], bulks(&["pong", ""]));
}

fn eviction(policy: &str, threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = s.client();
    // LFU counters decay at wall-clock minutes: nothing here may depend on where one falls.
    ok(&mut a, &["CONFIG", "SET", "lfu-decay-time", "0"]);
    ok(&mut a, &["CONFIG", "SET", "notify-keyspace-events", "Ee"]);
    let mut sub = s.client();
    assert_eq!(
        sub.cmd(&["SUBSCRIBE", "__keyevent@0__:evicted"]),
        bulks_int(&["subscribe", "__keyevent@0__:evicted"], 1)
    );
    let volatile_only = policy.starts_with("volatile-");
    let persistent = fill(&mut a, "p:", 100, false);
    let volatile = fill(&mut a, "v:", 100, true);
    ok(&mut a, &["CONFIG", "SET", "maxmemory-policy", policy]);
    assert_eq!(info_field(&mut a, "memory", "maxmemory_policy"), policy);
    // 200 KB below what is in use: some 40 of the 5 KB keys must go.
    let small = squeeze(&mut a, 200_000);
    let evicted = info_int(&mut a, "stats", "evicted_keys");
    let mut all: Vec<String> = persistent.clone();
    all.extend(volatile.iter().cloned());
    all.extend(small.iter().cloned());
    let missing = missing_keys(&mut a, &all);
    assert_eq!(
        missing.len() as i64,
        evicted,
        "{policy}: keys gone vs INFO evicted_keys"
    );
    assert!(
        missing.len() >= 20,
        "{policy}: only {} keys evicted for 200 KB",
        missing.len()
    );
    if volatile_only {
        let gone: Vec<&String> = missing.iter().filter(|k| !k.starts_with("v:")).collect();
        assert!(
            gone.is_empty(),
            "{policy} evicted keys without a TTL: {gone:?}"
        );
    }
    expect_evicted_events(&mut sub, &missing);
}

#[test]
fn eviction_allkeys_lru() {
    eviction("allkeys-lru", 1);
}

#[test]
fn eviction_allkeys_lfu() {
    eviction("allkeys-lfu", 1);
}

#[test]
fn eviction_allkeys_random() {
    eviction("allkeys-random", 1);
}

#[test]
fn eviction_allkeys_random_threads4() {
    eviction("allkeys-random", 4);
}

#[test]
fn eviction_volatile_lru() {
    eviction("volatile-lru", 1);
}

#[test]
fn eviction_volatile_lfu() {
    eviction("volatile-lfu", 1);
}

#[test]
fn eviction_volatile_random() {
    eviction("volatile-random", 1);
}

#[test]
fn eviction_volatile_ttl() {
    eviction("volatile-ttl", 1);
}

#[test]
fn eviction_volatile_ttl_threads4() {
    eviction("volatile-ttl", 4);
}

const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

/// Writes refused with OOM; reads and deletions still served.
fn assert_oom(a: &mut Client, what: &str) {
    let oom = Resp::Error(OOM.into());
    assert_eq!(a.cmd(&["SET", "new", "1"]), oom, "{what}: SET");
    assert_eq!(a.cmd(&["LPUSH", "newlist", "1"]), oom, "{what}: LPUSH");
    assert_eq!(a.cmd(&["INCR", "p:1"]), oom, "{what}: INCR");
    // redis.call raises the error with the script's location appended...
    let r = a.cmd(&["EVAL", "return redis.call('set', 'x', '1')", "0"]);
    assert!(
        r.error_text()
            .is_some_and(|e| e.starts_with(OOM) && e.ends_with("on @user_script:1.")),
        "{what}: EVAL with redis.call: {r}"
    );
    // ...redis.pcall returns it as it is.
    assert_eq!(
        a.cmd(&["EVAL", "return redis.pcall('set', 'x', '1')", "0"]),
        oom,
        "{what}: EVAL with redis.pcall"
    );
    ok(a, &["MULTI"]);
    assert_eq!(a.cmd(&["SET", "x", "1"]), oom, "{what}: SET inside MULTI");
    assert_eq!(
        a.cmd(&["EXEC"]),
        Resp::Error("EXECABORT Transaction discarded because of previous errors.".into()),
        "{what}: EXEC"
    );
    let r = a.cmd(&["GET", "p:1"]);
    assert_eq!(
        r.as_bytes().map(|b| b.len()),
        Some(VALUE_LEN),
        "{what}: GET still works"
    );
    expect(a, &["DEL", "p:2"], Resp::Integer(1));
    expect(a, &["EXISTS", "new", "newlist", "x"], Resp::Integer(0));
}

#[test]
fn noeviction_oom() {
    let s = KiteServer::start(&[], 1);
    let mut a = s.client();
    fill(&mut a, "p:", 100, false);
    ok(&mut a, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let used = info_int(&mut a, "memory", "used_memory");
    ok(
        &mut a,
        &[
            "CONFIG",
            "SET",
            "maxmemory",
            &(used - 100_000).max(1).to_string(),
        ],
    );
    assert_oom(&mut a, "noeviction");
    expect(&mut a, &["DBSIZE"], Resp::Integer(99));
    assert_eq!(info_int(&mut a, "stats", "evicted_keys"), 0);

    // A volatile policy with no key to evict answers the same.
    ok(
        &mut a,
        &["CONFIG", "SET", "maxmemory-policy", "volatile-lru"],
    );
    expect(&mut a, &["SET", "new", "1"], Resp::Error(OOM.into()));
    assert_eq!(info_int(&mut a, "stats", "evicted_keys"), 0);
    ok(&mut a, &["CONFIG", "SET", "maxmemory", "0"]);
    ok(&mut a, &["SET", "new", "1"]);
}

fn replica_sees_eviction(threads: usize) {
    let master = KiteServer::start(&[], threads);
    let replica = KiteServer::start(&[], threads);
    let mut mc = master.client();
    let mut rc = replica.client();
    ok(
        &mut rc,
        &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while info_field(&mut rc, "replication", "master_link_status") != "up" {
        assert!(
            Instant::now() < deadline,
            "the replica's link never came up"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let keys = fill(&mut mc, "t:", 200, false);
    expect(&mut mc, &["WAIT", "1", "10000"], Resp::Integer(1));
    expect(&mut rc, &["DBSIZE"], Resp::Integer(200));
    let mut monitor = replica.client();
    ok(&mut monitor, &["MONITOR"]);

    ok(
        &mut mc,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-random"],
    );
    let small = squeeze(&mut mc, 300_000);
    // WAIT covers this connection's writes, and evictions are the server's: when the
    // squeeze's first INFO already found keys evicted (its own command made room), the
    // connection wrote nothing since the last WAIT. A write now puts the evictions'
    // DELs, which the stream holds before it, under the WAIT.
    ok(&mut mc, &["SET", "after-squeeze", "1"]);
    expect(&mut mc, &["WAIT", "1", "10000"], Resp::Integer(1));
    let mut all = keys.clone();
    all.extend(small);
    let gone_master = missing_keys(&mut mc, &all);
    assert!(!gone_master.is_empty());
    let gone_replica = missing_keys(&mut rc, &all);
    assert_eq!(
        gone_master, gone_replica,
        "the keys gone from the master and from the replica"
    );
    expect(&mut rc, &["DBSIZE"], mc.cmd(&["DBSIZE"]));
    // The replica applied each eviction as a DEL from its master.
    let mut deleted = BTreeSet::new();
    while deleted.len() < gone_master.len() {
        let line = next(&mut monitor, "the replica's MONITOR")
            .as_string()
            .unwrap_or_default();
        if let Some(pos) = line.find("\"DEL\" \"") {
            let key = line[pos + 7..].trim_end_matches('"').to_string();
            assert!(
                gone_master.contains(&key),
                "DEL of {key}, not evicted: {line}"
            );
            deleted.insert(key);
        }
    }
}

#[test]
fn eviction_reaches_replica_as_del_threads1() {
    replica_sees_eviction(1);
}

#[test]
fn eviction_reaches_replica_as_del_threads4() {
    replica_sees_eviction(4);
}

/// A command's `usec` in INFO commandstats, with its whole line for messages.
fn command_usec(c: &mut Client, name: &str) -> (i64, String) {
    let stats = info_field(c, "commandstats", &format!("cmdstat_{name}"));
    let usec = stats
        .split(',')
        .find_map(|kv| kv.strip_prefix("usec="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("usec in cmdstat_{name}: {stats}"));
    (usec, stats)
}

/// A blocking pop's wait is taken off its own time, not the next command's: after a
/// BLPOP that waited 0.4 s and timed out on the connection's own shard, a DEBUG SLEEP of
/// 0.3 s still counts its 0.3 s in INFO commandstats, as on redis-server.
#[test]
fn a_wait_is_not_taken_off_the_next_command() {
    for threads in [1, 2] {
        let server = KiteServer::start(&[], threads);
        let mut c = server.client();
        assert!(c.cmd(&["BLPOP", "nothing-here", "0.4"]).is_null());
        ok(&mut c, &["DEBUG", "SLEEP", "0.3"]);
        let (usec, stats) = command_usec(&mut c, "debug");
        assert!(
            usec >= 290_000,
            "--threads {threads}: DEBUG SLEEP 0.3 counted {usec} µs: {stats}"
        );
    }
}

/// A blocking XREAD is one call in INFO commandstats, as on redis-server (which counted 2
/// calls for these two reads), whether its streams share a shard or not, and whether it
/// answered at once or timed out.
#[test]
fn a_blocking_xread_is_counted_once() {
    for threads in [1, 2] {
        let server = KiteServer::start(&[], threads);
        let mut c = server.client();
        let on_shard = |shard: usize| {
            (0..)
                .map(|i| format!("s{i}"))
                .find(|k| common::shard_of(k, 2) == shard)
                .expect("a key")
        };
        let (a, b) = (on_shard(0), on_shard(1));
        for s in [&a, &b] {
            assert!(matches!(c.cmd(&["XADD", s, "*", "f", "v"]), Resp::Bulk(_)));
        }
        assert!(c
            .cmd(&["XREAD", "BLOCK", "100", "STREAMS", &a, &b, "$", "$"])
            .is_null());
        assert!(matches!(
            c.cmd(&["XREAD", "BLOCK", "100", "STREAMS", &a, &b, "0", "0"]),
            Resp::Array(_)
        ));
        let stats = info_field(&mut c, "commandstats", "cmdstat_xread");
        assert!(
            stats.starts_with("calls=2,"),
            "--threads {threads}: two XREADs counted as {stats}"
        );
    }
}

/// A blocking command's time spent waiting is not execution time: it neither lands in the
/// slow log nor in INFO commandstats' usec (Redis 7 counts only the time it ran).
#[test]
fn blocked_time_is_not_execution_time() {
    let server = KiteServer::start(&[], 2);
    let mut c = server.client();
    // The waits are 0.4 s; 0.3 s leaves room for a loaded machine's stalls in what
    // is run time (a hop to another shard) and still catches a wait that is counted.
    ok(
        &mut c,
        &["CONFIG", "SET", "slowlog-log-slower-than", "300000"],
    );
    ok(&mut c, &["SLOWLOG", "RESET"]);
    assert!(c.cmd(&["BLPOP", "nothing-here", "0.4"]).is_null());
    // Keys on several shards (Sidekiq's fetch names every queue of a process).
    let keys = common::spread_keys("q", 2);
    assert!(c
        .cmd(&["BRPOP", keys[0].as_str(), keys[1].as_str(), "0.4"])
        .is_null());
    let mut pusher = server.client();
    let waiter = thread::spawn(move || c.cmd(&["BRPOP", "later", "5"]));
    thread::sleep(Duration::from_millis(400));
    assert_eq!(pusher.cmd(&["RPUSH", "later", "x"]).as_int(), Some(1));
    assert_eq!(waiter.join().unwrap(), bulks(&["later", "x"]));
    assert_eq!(
        pusher.cmd(&["SLOWLOG", "LEN"]).as_int(),
        Some(0),
        "slow log: {:?}",
        pusher.cmd(&["SLOWLOG", "GET"])
    );
    let (usec, stats) = command_usec(&mut pusher, "blpop");
    assert!(
        usec < 300_000,
        "BLPOP's 0.4 s wait counted as run time: {stats}"
    );
}

/// Time a command spends waiting for another thread is not its run time either: a
/// multi-shard MGET, a script whose key lives on another thread, or a MULTI/EXEC over
/// both threads' keys, that waits there behind a DEBUG SLEEP of 0.5 s counts what it
/// ran, not the wait (Redis, on one thread, has no such wait to count). Eight calls of
/// each, from connections dealt to both threads, so some wait on the sleeping one; 0.2 s
/// in all leaves room for a loaded machine and still catches one wait counted.
#[test]
fn waiting_for_another_thread_is_not_run_time() {
    let server = KiteServer::start(&[], 2);
    let on_shard = |shard: usize| {
        (0..)
            .map(|i| format!("w{i}"))
            .find(|k| common::shard_of(k, 2) == shard)
            .expect("a key")
    };
    let keys = [on_shard(0), on_shard(1)];
    let mut admin = server.client();
    for k in &keys {
        ok(&mut admin, &["SET", k, "v"]);
    }
    // Dealt to the threads in turn: half of them share the sleeper's thread.
    let mut sleeper = server.client();
    let workers: Vec<Client> = (0..24).map(|_| server.client()).collect();
    let sleeping = thread::spawn(move || {
        ok(&mut sleeper, &["DEBUG", "SLEEP", "0.5"]);
    });
    thread::sleep(Duration::from_millis(100));
    let calls: Vec<_> = workers
        .into_iter()
        .enumerate()
        .map(|(i, mut w)| {
            let keys = keys.clone();
            thread::spawn(move || {
                // Workers alternate threads: each kind, and each script key, on both.
                match i % 6 {
                    0 | 1 => {
                        let r = w.cmd(&["MGET", &keys[0], &keys[1]]);
                        assert_eq!(r, bulks(&["v", "v"]));
                    }
                    2 | 3 => {
                        let key = &keys[(i / 6) % 2];
                        let r = w.cmd(&["EVAL", "return redis.call('GET', KEYS[1])", "1", key]);
                        assert_eq!(r, Resp::Bulk(b"v".to_vec()));
                    }
                    _ => {
                        ok(&mut w, &["MULTI"]);
                        for k in &keys {
                            assert_eq!(w.cmd(&["SET", k, "v"]), Resp::Simple("QUEUED".into()));
                        }
                        let r = w.cmd(&["EXEC"]);
                        assert_eq!(r, Resp::Array(vec![Resp::ok(), Resp::ok()]));
                    }
                }
            })
        })
        .collect();
    for c in calls {
        c.join().unwrap();
    }
    sleeping.join().unwrap();
    let counted: Vec<(i64, String)> = ["mget", "eval", "exec"]
        .iter()
        .map(|name| command_usec(&mut admin, name))
        .collect();
    assert!(
        counted.iter().all(|(usec, _)| *usec < 200_000),
        "the wait behind another thread counted as run time: {counted:?}"
    );
}

/// Commands in one pipeline that change what the next may do (CLIENT REPLY, MULTI,
/// SUBSCRIBE, an ACL change) take effect at the very next command, as in Redis, though
/// Kite looks at the connection's state once for a run of plain commands. The whole
/// pipeline is one write, so it is parsed and run as one group. Errors are compared by
/// their code: 7.0's texts differ from 7.2's.
#[test]
fn state_changes_inside_one_pipeline_match_redis() {
    let script: &[&[&str]] = &[
        &["SET", "k1", "a"],
        &["CLIENT", "REPLY", "OFF"],
        &["SET", "k2", "b"],
        &["GET", "k1"],
        &["CLIENT", "REPLY", "ON"],
        &["GET", "k2"],
        &["MULTI"],
        &["SET", "k3", "c"],
        &["GET", "k3"],
        &["EXEC"],
        &["GET", "k3"],
        &["CLIENT", "REPLY", "SKIP"],
        &["GET", "k1"],
        &["GET", "k2"],
        &["SUBSCRIBE", "ch"],
        &["GET", "k1"],
        &["SET", "k4", "d"],
        &["UNSUBSCRIBE"],
        &["GET", "k1"],
        &["ACL", "SETUSER", "default", "-get"],
        &["GET", "k1"],
        &["SET", "k5", "e"],
        &["ACL", "SETUSER", "default", "+get"],
        &["GET", "k5"],
        &["GET", "k4"],
        &["ECHO", "end"],
    ];
    let mut raw = Vec::new();
    for cmd in script {
        raw.extend_from_slice(&common::encode_command(cmd));
    }
    let run = |port: u16| -> Vec<Resp> {
        let mut c = Client::connect(port);
        c.set_timeout(Some(Duration::from_secs(10)));
        c.send_raw(&raw);
        let mut replies = Vec::new();
        loop {
            let r = c.try_read().expect("a reply within 10 s");
            let end = r == bulk("end");
            // An error's code only: 7.0 words several differently from 7.2.
            replies.push(match r.error_text() {
                Some(e) => Resp::Error(e.split(' ').next().unwrap_or("").to_string()),
                None => r,
            });
            if end {
                return replies;
            }
        }
    };
    let redis = common::RedisServer::start();
    let expected = run(redis.port);
    assert_eq!(expected.len(), 21, "redis-server answered {expected:?}");
    for threads in [1, 2] {
        let kite = KiteServer::start(&[], threads);
        assert_eq!(run(kite.port), expected, "--threads {threads}");
    }
}
