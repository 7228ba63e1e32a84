//! CLIENT TRACKING (client-side caching invalidation), black-box: the default mode in
//! RESP3, REDIRECT to a RESP2 client subscribed to `__redis__:invalidate` (and to a RESP3
//! client), BCAST with PREFIX, OPTIN / OPTOUT with CLIENT CACHING, NOLOOP, CLIENT
//! GETREDIR, CLIENT TRACKINGINFO, the error texts, FLUSHALL / FLUSHDB's null
//! invalidation, keys that expire or are evicted, a redirect target that disconnects, and
//! invalidations that cross threads at `--threads 4`.
//!
//! Every expected message and reply below was read from redis-server 7.0, Redis 7.2 and
//! valkey-server 8.1, which agree on all of them.

mod common;

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use common::{Client, KiteServer, Resp};

/// How long a client waits for a push it expects.
const PUSH_WAIT: Duration = Duration::from_secs(10);

fn bulk(s: &str) -> Resp {
    Resp::bulk(s)
}

fn bulks(items: &[&str]) -> Resp {
    Resp::Array(items.iter().map(|s| bulk(s)).collect())
}

/// `>2 invalidate [keys...]`
fn inval(keys: &[&str]) -> Resp {
    Resp::Push(vec![bulk("invalidate"), bulks(keys)])
}

/// `>2 invalidate _` (a flush)
fn inval_all() -> Resp {
    Resp::Push(vec![bulk("invalidate"), Resp::Null])
}

/// The RESP2 Pub/Sub form sent to a redirect target subscribed to the channel.
fn inval_message(keys: Option<&[&str]>) -> Resp {
    Resp::Array(vec![
        bulk("message"),
        bulk("__redis__:invalidate"),
        match keys {
            Some(k) => bulks(k),
            None => Resp::NullBulk,
        },
    ])
}

fn ok(c: &mut Client, cmd: &[&str]) {
    let r = c.cmd(cmd);
    assert_eq!(r, Resp::ok(), "reply to `{}`", cmd.join(" "));
}

/// A RESP3 connection.
fn resp3(port: u16) -> Client {
    let mut c = Client::connect(port);
    let r = c.cmd(&["HELLO", "3"]);
    assert!(matches!(r, Resp::Map(_)), "HELLO 3 answered {r}");
    c
}

/// Reads the next value, which must arrive within [`PUSH_WAIT`].
#[track_caller]
fn next(c: &mut Client, what: &str) -> Resp {
    c.set_timeout(Some(PUSH_WAIT));
    c.try_read()
        .unwrap_or_else(|e| panic!("{what}: nothing arrived within {PUSH_WAIT:?}: {e}"))
}

#[track_caller]
fn expect_push(c: &mut Client, what: &str, expected: Resp) {
    let r = next(c, what);
    assert_eq!(r, expected, "{what}");
}

/// Nothing was queued for `c`: its PING is answered by the PONG itself.
#[track_caller]
fn assert_quiet(c: &mut Client, what: &str) {
    let r = c.cmd(&["PING"]);
    assert_eq!(
        r,
        Resp::simple("PONG"),
        "{what}: expected no pending message before the PONG"
    );
}

/// Reads `n` pushes and returns them sorted by their text (for several keys changed by
/// one command, whose pushes may come in any order).
fn read_pushes_sorted(c: &mut Client, n: usize, what: &str) -> Vec<String> {
    let mut v: Vec<String> = (0..n).map(|_| next(c, what).to_string()).collect();
    v.sort();
    v
}

fn sorted_strings(items: Vec<Resp>) -> Vec<String> {
    let mut v: Vec<String> = items.iter().map(|r| r.to_string()).collect();
    v.sort();
    v
}

fn client_id(c: &mut Client) -> String {
    c.cmd(&["CLIENT", "ID"]).as_int().unwrap().to_string()
}

// ---------------------------------------------------------------------------
// Default mode, RESP3
// ---------------------------------------------------------------------------

fn default_mode(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = resp3(s.port);
    let mut b = s.client();
    ok(&mut a, &["CLIENT", "TRACKING", "ON"]);
    assert_eq!(a.cmd(&["CLIENT", "GETREDIR"]), Resp::Integer(0));

    // A read of a missing key tracks it too.
    assert_eq!(a.cmd(&["GET", "k"]), Resp::Null);
    ok(&mut b, &["SET", "k", "v"]);
    expect_push(&mut a, "SET by another client", inval(&["k"]));
    // Once invalidated, the key is no longer tracked until read again.
    ok(&mut b, &["SET", "k", "v2"]);
    assert_quiet(&mut a, "a second SET of a key not read again");

    // DEL, and the client's own write (no NOLOOP): the reply comes first, then the push.
    assert_eq!(a.cmd(&["GET", "k"]), bulk("v2"));
    assert_eq!(b.cmd(&["DEL", "k"]), Resp::Integer(1));
    expect_push(&mut a, "DEL by another client", inval(&["k"]));
    assert_eq!(a.cmd(&["GET", "k"]), Resp::Null);
    a.send(&["SET", "k", "mine"]);
    assert_eq!(
        next(&mut a, "own SET"),
        Resp::ok(),
        "own SET: the reply first"
    );
    expect_push(&mut a, "own SET: then the push", inval(&["k"]));
    assert_quiet(&mut a, "after the own write");

    // Other read commands and types: HGETALL, LRANGE, ZSCORE, MGET.
    assert_eq!(a.cmd(&["HGETALL", "h"]), Resp::Map(vec![]));
    assert_eq!(b.cmd(&["HSET", "h", "f", "1"]), Resp::Integer(1));
    expect_push(&mut a, "HSET of a hash read with HGETALL", inval(&["h"]));
    assert_eq!(a.cmd(&["LRANGE", "l", "0", "-1"]), Resp::Array(vec![]));
    assert_eq!(b.cmd(&["RPUSH", "l", "x"]), Resp::Integer(1));
    expect_push(&mut a, "RPUSH of a list read with LRANGE", inval(&["l"]));
    assert_eq!(a.cmd(&["ZSCORE", "z", "m"]), Resp::Null);
    assert_eq!(b.cmd(&["ZADD", "z", "1", "m"]), Resp::Integer(1));
    expect_push(&mut a, "ZADD of a zset read with ZSCORE", inval(&["z"]));

    // Several keys changed by one command: one push per key.
    assert_eq!(
        a.cmd(&["MGET", "m1", "m2", "m3"]),
        Resp::Array(vec![Resp::Null, Resp::Null, Resp::Null])
    );
    ok(&mut b, &["MSET", "m2", "x", "m1", "y"]);
    assert_eq!(
        read_pushes_sorted(&mut a, 2, "MSET of two tracked keys"),
        sorted_strings(vec![inval(&["m1"]), inval(&["m2"])])
    );
    assert_eq!(
        a.cmd(&["MGET", "m1", "m2", "m3"]),
        Resp::Array(vec![bulk("y"), bulk("x"), Resp::Null])
    );
    assert_eq!(b.cmd(&["DEL", "m1", "m2", "m3"]), Resp::Integer(2));
    // m3 was never written but was read: DEL of a missing key changes nothing.
    assert_eq!(
        read_pushes_sorted(&mut a, 2, "DEL of two tracked keys"),
        sorted_strings(vec![inval(&["m1"]), inval(&["m2"])])
    );
    assert_quiet(&mut a, "after DEL m1 m2 m3");

    // A transaction and a script of another client.
    assert_eq!(a.cmd(&["GET", "t"]), Resp::Null);
    ok(&mut b, &["MULTI"]);
    b.cmd(&["SET", "t", "1"]);
    b.cmd(&["SET", "untracked", "1"]);
    assert_eq!(b.cmd(&["EXEC"]), Resp::Array(vec![Resp::ok(), Resp::ok()]));
    expect_push(&mut a, "MULTI/EXEC SET", inval(&["t"]));
    assert_eq!(a.cmd(&["GET", "t"]), bulk("1"));
    assert_eq!(
        b.cmd(&[
            "EVAL",
            "redis.call('set', KEYS[1], 'z') redis.call('set', 'other', '1')",
            "1",
            "t"
        ]),
        Resp::NullBulk
    );
    expect_push(&mut a, "EVAL set", inval(&["t"]));
    assert_quiet(&mut a, "after the script");

    // TRACKING OFF: no more messages.
    assert_eq!(a.cmd(&["GET", "t"]), bulk("z"));
    ok(&mut a, &["CLIENT", "TRACKING", "OFF"]);
    assert_eq!(a.cmd(&["CLIENT", "GETREDIR"]), Resp::Integer(-1));
    ok(&mut b, &["SET", "t", "after-off"]);
    assert_quiet(&mut a, "a write after TRACKING OFF");
}

#[test]
fn default_mode_resp3_threads1() {
    default_mode(1);
}

#[test]
fn default_mode_resp3_threads4() {
    default_mode(4);
}

// ---------------------------------------------------------------------------
// REDIRECT
// ---------------------------------------------------------------------------

fn redirect(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut r = s.client();
    let rid = client_id(&mut r);
    assert_eq!(
        r.cmd(&["SUBSCRIBE", "__redis__:invalidate"]),
        Resp::Array(vec![
            bulk("subscribe"),
            bulk("__redis__:invalidate"),
            Resp::Integer(1)
        ])
    );
    let mut a = s.client();
    let mut b = s.client();
    ok(&mut a, &["CLIENT", "TRACKING", "ON", "REDIRECT", &rid]);
    assert_eq!(
        a.cmd(&["CLIENT", "GETREDIR"]),
        Resp::Integer(rid.parse().unwrap())
    );
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKINGINFO"]),
        Resp::Array(vec![
            bulk("flags"),
            bulks(&["on"]),
            bulk("redirect"),
            Resp::Integer(rid.parse().unwrap()),
            bulk("prefixes"),
            bulks(&[]),
        ])
    );

    assert_eq!(a.cmd(&["GET", "k"]), Resp::NullBulk);
    ok(&mut b, &["SET", "k", "1"]);
    expect_push(
        &mut r,
        "redirected invalidation",
        inval_message(Some(&["k"])),
    );
    // The tracking client itself gets nothing.
    assert_quiet(&mut a, "the redirecting client");

    assert_eq!(a.cmd(&["GET", "k"]), bulk("1"));
    ok(&mut b, &["FLUSHALL"]);
    expect_push(&mut r, "redirected FLUSHALL", inval_message(None));

    // The client's own write is redirected too.
    assert_eq!(a.cmd(&["GET", "own"]), Resp::NullBulk);
    ok(&mut a, &["SET", "own", "1"]);
    expect_push(
        &mut r,
        "redirected own write",
        inval_message(Some(&["own"])),
    );
    ok(&mut a, &["CLIENT", "TRACKING", "OFF"]);

    // A RESP3 target gets the invalidate push itself, subscribed or not.
    let mut r3 = resp3(s.port);
    let r3id = client_id(&mut r3);
    ok(&mut a, &["CLIENT", "TRACKING", "ON", "REDIRECT", &r3id]);
    assert_eq!(a.cmd(&["GET", "k3"]), Resp::NullBulk);
    ok(&mut b, &["SET", "k3", "1"]);
    expect_push(&mut r3, "RESP3 redirect target", inval(&["k3"]));
    assert_quiet(&mut r3, "RESP3 redirect target");

    // A RESP2 client may redirect to itself and subscribe.
    let mut selfc = s.client();
    let sid = client_id(&mut selfc);
    ok(&mut selfc, &["CLIENT", "TRACKING", "ON", "REDIRECT", &sid]);
    assert_eq!(selfc.cmd(&["GET", "selfk"]), Resp::NullBulk);
    selfc.cmd(&["SUBSCRIBE", "__redis__:invalidate"]);
    ok(&mut b, &["SET", "selfk", "1"]);
    expect_push(
        &mut selfc,
        "redirect to itself",
        inval_message(Some(&["selfk"])),
    );
}

#[test]
fn redirect_resp2_threads1() {
    redirect(1);
}

#[test]
fn redirect_resp2_threads4() {
    redirect(4);
}

/// RESP2 without REDIRECT is accepted, and its invalidations go nowhere.
#[test]
fn resp2_without_redirect_gets_nothing() {
    let s = KiteServer::start(&[], 1);
    let mut a = s.client();
    let mut b = s.client();
    ok(&mut a, &["CLIENT", "TRACKING", "ON"]);
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKINGINFO"]),
        Resp::Array(vec![
            bulk("flags"),
            bulks(&["on"]),
            bulk("redirect"),
            Resp::Integer(0),
            bulk("prefixes"),
            bulks(&[]),
        ])
    );
    assert_eq!(a.cmd(&["GET", "w"]), Resp::NullBulk);
    ok(&mut b, &["SET", "w", "1"]);
    assert_quiet(&mut a, "RESP2 tracking without redirect");
}

/// The redirect target disconnects: the next invalidation becomes a
/// `tracking-redir-broken` push (once) and TRACKINGINFO says `broken_redirect`.
#[test]
fn broken_redirect() {
    let s = KiteServer::start(&[], 1);
    let mut x = s.client();
    let xid = client_id(&mut x);
    let mut d = resp3(s.port);
    let mut b = s.client();
    ok(&mut d, &["CLIENT", "TRACKING", "ON", "REDIRECT", &xid]);
    assert_eq!(d.cmd(&["GET", "br"]), Resp::Null);
    drop(x);
    // Wait until the server has seen the disconnect.
    let deadline = Instant::now() + Duration::from_secs(10);
    while b
        .cmd(&["CLIENT", "LIST", "ID", &xid])
        .as_bytes()
        .is_some_and(|l| !l.is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "the closed client is still listed"
        );
        thread::sleep(Duration::from_millis(10));
    }
    ok(&mut b, &["SET", "br", "1"]);
    let xid_n: i64 = xid.parse().unwrap();
    expect_push(
        &mut d,
        "invalidation with the redirect target gone",
        Resp::Push(vec![bulk("tracking-redir-broken"), Resp::Integer(xid_n)]),
    );
    assert_quiet(&mut d, "after tracking-redir-broken");
    let info = d.cmd(&["CLIENT", "TRACKINGINFO"]);
    assert_eq!(
        info,
        Resp::Map(vec![
            (
                bulk("flags"),
                Resp::Set(vec![bulk("on"), bulk("broken_redirect")])
            ),
            (bulk("redirect"), Resp::Integer(xid_n)),
            (bulk("prefixes"), bulks(&[])),
        ])
    );
}

// ---------------------------------------------------------------------------
// BCAST
// ---------------------------------------------------------------------------

fn bcast(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = resp3(s.port);
    let mut b = s.client();
    ok(
        &mut a,
        &[
            "CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "user:", "PREFIX", "obj:",
        ],
    );
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKINGINFO"]),
        Resp::Map(vec![
            (bulk("flags"), Resp::Set(vec![bulk("on"), bulk("bcast")])),
            (bulk("redirect"), Resp::Integer(0)),
            (bulk("prefixes"), bulks(&["obj:", "user:"])),
        ])
    );
    // No read needed: every key under a prefix is reported.
    ok(&mut b, &["SET", "user:1", "x"]);
    expect_push(&mut a, "SET user:1", inval(&["user:1"]));
    ok(&mut b, &["SET", "other", "y"]);
    assert_quiet(&mut a, "a key outside the prefixes");
    // Each prefix's keys come in a push of their own.
    ok(&mut b, &["MSET", "obj:2", "a", "user:0", "b", "zzz", "c"]);
    assert_eq!(
        read_pushes_sorted(&mut a, 2, "MSET over two prefixes"),
        sorted_strings(vec![inval(&["obj:2"]), inval(&["user:0"])])
    );
    assert_quiet(&mut a, "after the MSET");
    // Own writes are reported after the reply (no NOLOOP).
    a.send(&["SET", "user:5", "1"]);
    assert_eq!(next(&mut a, "own SET"), Resp::ok());
    expect_push(&mut a, "own SET under a prefix", inval(&["user:5"]));

    // Adding a prefix while on; switching mode is refused.
    ok(
        &mut a,
        &["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "new:"],
    );
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKINGINFO"]),
        Resp::Map(vec![
            (bulk("flags"), Resp::Set(vec![bulk("on"), bulk("bcast")])),
            (bulk("redirect"), Resp::Integer(0)),
            (bulk("prefixes"), bulks(&["new:", "obj:", "user:"])),
        ])
    );
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "obj:x"]),
        Resp::Error(
            "ERR Prefix 'obj:x' overlaps with an existing prefix 'obj:'. Prefixes for a \
             single client must not overlap."
                .into()
        )
    );
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKING", "ON"]),
        Resp::Error(
            "ERR You can't switch BCAST mode on/off before disabling tracking for this \
             client, and then re-enabling it with a different mode."
                .into()
        )
    );
    ok(&mut b, &["SET", "new:1", "1"]);
    expect_push(&mut a, "a prefix added later", inval(&["new:1"]));
    ok(&mut a, &["CLIENT", "TRACKING", "OFF"]);

    // BCAST without PREFIX: every key, under the empty prefix.
    ok(&mut a, &["CLIENT", "TRACKING", "ON", "BCAST"]);
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKINGINFO"]),
        Resp::Map(vec![
            (bulk("flags"), Resp::Set(vec![bulk("on"), bulk("bcast")])),
            (bulk("redirect"), Resp::Integer(0)),
            (bulk("prefixes"), bulks(&[""])),
        ])
    );
    ok(&mut b, &["SET", "anything", "1"]);
    expect_push(&mut a, "BCAST with no prefix", inval(&["anything"]));
    assert_quiet(&mut a, "after BCAST with no prefix");
}

#[test]
fn bcast_prefix_threads1() {
    bcast(1);
}

#[test]
fn bcast_prefix_threads4() {
    bcast(4);
}

/// The keys of one command under one prefix come as one push, in key order.
#[test]
fn bcast_groups_the_keys_of_one_command() {
    let s = KiteServer::start(&[], 1);
    let mut a = resp3(s.port);
    let mut b = s.client();
    ok(
        &mut a,
        &["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "user:"],
    );
    ok(
        &mut b,
        &["MSET", "user:2", "a", "user:1", "b", "user:3", "c"],
    );
    expect_push(
        &mut a,
        "MSET of three keys under one prefix",
        inval(&["user:1", "user:2", "user:3"]),
    );
    assert_quiet(&mut a, "after the grouped push");
}

fn bcast_noloop(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = resp3(s.port);
    let mut b = s.client();
    ok(
        &mut a,
        &[
            "CLIENT", "TRACKING", "ON", "BCAST", "NOLOOP", "PREFIX", "x", "PREFIX", "y",
        ],
    );
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKINGINFO"]),
        Resp::Map(vec![
            (
                bulk("flags"),
                Resp::Set(vec![bulk("on"), bulk("bcast"), bulk("noloop")])
            ),
            (bulk("redirect"), Resp::Integer(0)),
            (bulk("prefixes"), bulks(&["x", "y"])),
        ])
    );
    ok(&mut a, &["SET", "x1", "mine"]);
    ok(&mut b, &["SET", "y1", "theirs"]);
    expect_push(
        &mut a,
        "BCAST NOLOOP: another client's write",
        inval(&["y1"]),
    );
    assert_quiet(&mut a, "BCAST NOLOOP: the own write is not reported");
}

#[test]
fn bcast_noloop_threads1() {
    bcast_noloop(1);
}

#[test]
fn bcast_noloop_threads4() {
    bcast_noloop(4);
}

// ---------------------------------------------------------------------------
// OPTIN / OPTOUT / NOLOOP
// ---------------------------------------------------------------------------

fn optin_optout_noloop(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = resp3(s.port);
    let mut b = s.client();
    let flags = |c: &mut Client| -> Resp {
        match c.cmd(&["CLIENT", "TRACKINGINFO"]) {
            Resp::Map(m) => m[0].1.clone(),
            other => panic!("CLIENT TRACKINGINFO answered {other}"),
        }
    };
    let set = |items: &[&str]| Resp::Set(items.iter().map(|s| bulk(s)).collect());

    // OPTIN: only the command right after CLIENT CACHING yes is tracked.
    ok(&mut a, &["CLIENT", "TRACKING", "ON", "OPTIN"]);
    assert_eq!(flags(&mut a), set(&["on", "optin"]));
    assert_eq!(
        a.cmd(&["CLIENT", "CACHING", "no"]),
        Resp::Error(
            "ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.".into()
        )
    );
    assert_eq!(
        a.cmd(&["CLIENT", "CACHING", "maybe"]),
        Resp::Error("ERR syntax error".into())
    );
    assert_eq!(a.cmd(&["GET", "t1"]), Resp::Null);
    ok(&mut a, &["CLIENT", "CACHING", "yes"]);
    assert_eq!(flags(&mut a), set(&["on", "optin", "caching-yes"]));
    // CLIENT commands leave the flag for the next command; the GET uses it up.
    assert_eq!(flags(&mut a), set(&["on", "optin", "caching-yes"]));
    assert_eq!(a.cmd(&["GET", "t2"]), Resp::Null);
    assert_eq!(flags(&mut a), set(&["on", "optin"]));
    assert_eq!(a.cmd(&["GET", "t3"]), Resp::Null);
    // Any other command uses it up too.
    ok(&mut a, &["CLIENT", "CACHING", "yes"]);
    assert_eq!(a.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(a.cmd(&["GET", "t4"]), Resp::Null);
    ok(
        &mut b,
        &["MSET", "t1", "1", "t2", "1", "t3", "1", "t4", "1"],
    );
    expect_push(
        &mut a,
        "OPTIN: the key read after CACHING yes",
        inval(&["t2"]),
    );
    assert_quiet(&mut a, "OPTIN: keys read without CACHING yes");
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKING", "ON", "OPTOUT"]),
        Resp::Error(
            "ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this \
             client, and then re-enabling it with a different mode."
                .into()
        )
    );
    ok(&mut a, &["CLIENT", "TRACKING", "OFF"]);

    // OPTOUT: everything is tracked but the command right after CLIENT CACHING no.
    ok(&mut a, &["CLIENT", "TRACKING", "ON", "OPTOUT"]);
    assert_eq!(
        a.cmd(&["CLIENT", "CACHING", "yes"]),
        Resp::Error(
            "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.".into()
        )
    );
    ok(&mut a, &["CLIENT", "CACHING", "no"]);
    assert_eq!(flags(&mut a), set(&["on", "optout", "caching-no"]));
    ok(&mut a, &["CLIENT", "CACHING", "no"]);
    assert_eq!(a.cmd(&["GET", "u1"]), Resp::Null);
    assert_eq!(a.cmd(&["GET", "u2"]), Resp::Null);
    ok(&mut b, &["MSET", "u1", "1", "u2", "1"]);
    expect_push(&mut a, "OPTOUT: the key read normally", inval(&["u2"]));
    assert_quiet(&mut a, "OPTOUT: the key read after CACHING no");
    ok(&mut a, &["CLIENT", "TRACKING", "OFF"]);

    // NOLOOP: the client's own writes are not reported to it, but still untrack the key.
    ok(&mut a, &["CLIENT", "TRACKING", "ON", "NOLOOP"]);
    assert_eq!(flags(&mut a), set(&["on", "noloop"]));
    assert_eq!(a.cmd(&["GET", "n1"]), Resp::Null);
    assert_eq!(a.cmd(&["GET", "n2"]), Resp::Null);
    ok(&mut a, &["SET", "n1", "mine"]);
    ok(&mut b, &["SET", "n2", "theirs"]);
    expect_push(&mut a, "NOLOOP: another client's write", inval(&["n2"]));
    ok(&mut b, &["SET", "n1", "theirs"]);
    assert_quiet(&mut a, "NOLOOP: own write, then another client's");
}

#[test]
fn optin_optout_noloop_threads1() {
    optin_optout_noloop(1);
}

#[test]
fn optin_optout_noloop_threads4() {
    optin_optout_noloop(4);
}

// ---------------------------------------------------------------------------
// GETREDIR / TRACKINGINFO / errors
// ---------------------------------------------------------------------------

#[test]
fn trackinginfo_getredir_and_errors() {
    let s = KiteServer::start(&[], 1);
    let mut a = s.client();
    let off2 = Resp::Array(vec![
        bulk("flags"),
        bulks(&["off"]),
        bulk("redirect"),
        Resp::Integer(-1),
        bulk("prefixes"),
        bulks(&[]),
    ]);
    assert_eq!(a.cmd(&["CLIENT", "TRACKINGINFO"]), off2);
    assert_eq!(a.cmd(&["CLIENT", "GETREDIR"]), Resp::Integer(-1));
    let mut a3 = resp3(s.port);
    assert_eq!(
        a3.cmd(&["CLIENT", "TRACKINGINFO"]),
        Resp::Map(vec![
            (bulk("flags"), Resp::Set(vec![bulk("off")])),
            (bulk("redirect"), Resp::Integer(-1)),
            (bulk("prefixes"), bulks(&[])),
        ])
    );

    let err = |t: &str| Resp::Error(t.to_string());
    let cases: Vec<(Vec<&str>, Resp)> = vec![
        (
            vec!["ON", "BCAST", "PREFIX", "a", "PREFIX", "ab"],
            err("ERR Prefix 'a' overlaps with another provided prefix 'ab'. Prefixes for a single client must not overlap."),
        ),
        (
            vec!["ON", "BCAST", "PREFIX", "ab", "PREFIX", "a"],
            err("ERR Prefix 'ab' overlaps with another provided prefix 'a'. Prefixes for a single client must not overlap."),
        ),
        (
            vec!["ON", "REDIRECT", "999999"],
            err("ERR The client ID you want redirect to does not exist"),
        ),
        (
            vec!["ON", "PREFIX", "a"],
            err("ERR PREFIX option requires BCAST mode to be enabled"),
        ),
        (
            vec!["ON", "OPTIN", "OPTOUT"],
            err("ERR You can't specify both OPTIN mode and OPTOUT mode"),
        ),
        (
            vec!["ON", "BCAST", "OPTIN"],
            err("ERR OPTIN and OPTOUT are not compatible with BCAST"),
        ),
        (
            vec!["ON", "BCAST", "NOLOOP", "OPTOUT"],
            err("ERR OPTIN and OPTOUT are not compatible with BCAST"),
        ),
        (
            vec!["ON", "REDIRECT", "notanumber"],
            err("ERR value is not an integer or out of range"),
        ),
        (vec!["MAYBE"], err("ERR syntax error")),
        (vec!["ON", "FOO"], err("ERR syntax error")),
        (
            vec![],
            err("ERR wrong number of arguments for 'client|tracking' command"),
        ),
    ];
    for (args, expected) in cases {
        let mut cmd = vec!["CLIENT", "TRACKING"];
        cmd.extend(args.iter());
        assert_eq!(a.cmd(&cmd), expected, "`{}`", cmd.join(" "));
        // A refused command leaves tracking off.
        assert_eq!(
            a.cmd(&["CLIENT", "TRACKINGINFO"]),
            off2,
            "after `{}`",
            cmd.join(" ")
        );
    }
    assert_eq!(
        a.cmd(&["CLIENT", "CACHING", "yes"]),
        err("ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled")
    );
    assert_eq!(
        a.cmd(&["CLIENT", "CACHING"]),
        err("ERR wrong number of arguments for 'client|caching' command")
    );
    assert_eq!(
        a.cmd(&["CLIENT", "GETREDIR", "x"]),
        err("ERR wrong number of arguments for 'client|getredir' command")
    );
    ok(&mut a, &["CLIENT", "TRACKING", "ON"]);
    assert_eq!(
        a.cmd(&["CLIENT", "CACHING", "yes"]),
        err("ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.")
    );
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKING", "ON", "BCAST"]),
        err("ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.")
    );
    // ON again with NOLOOP adds the flag.
    ok(&mut a, &["CLIENT", "TRACKING", "ON", "NOLOOP"]);
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKINGINFO"]),
        Resp::Array(vec![
            bulk("flags"),
            bulks(&["on", "noloop"]),
            bulk("redirect"),
            Resp::Integer(0),
            bulk("prefixes"),
            bulks(&[]),
        ])
    );
    ok(&mut a, &["CLIENT", "TRACKING", "OFF"]);
    ok(&mut a, &["CLIENT", "TRACKING", "OFF"]);
    ok(
        &mut a,
        &["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "x"],
    );
    assert_eq!(
        a.cmd(&["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "xa"]),
        err("ERR Prefix 'xa' overlaps with an existing prefix 'x'. Prefixes for a single client must not overlap.")
    );
}

// ---------------------------------------------------------------------------
// Flushes, expiry, eviction
// ---------------------------------------------------------------------------

fn flushes(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = resp3(s.port);
    let mut bc = resp3(s.port);
    let mut b = s.client();
    ok(&mut a, &["CLIENT", "TRACKING", "ON"]);
    ok(
        &mut bc,
        &["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "p:"],
    );
    assert_eq!(a.cmd(&["GET", "k"]), Resp::Null);
    ok(&mut b, &["SET", "k", "1"]);
    expect_push(&mut a, "SET k", inval(&["k"]));
    assert_eq!(a.cmd(&["GET", "k"]), bulk("1"));
    ok(&mut b, &["FLUSHALL"]);
    expect_push(&mut a, "FLUSHALL (default mode)", inval_all());
    expect_push(&mut bc, "FLUSHALL (BCAST)", inval_all());
    assert_quiet(&mut a, "one null invalidation per FLUSHALL");
    assert_quiet(&mut bc, "one null invalidation per FLUSHALL");
    // With nothing tracked, and for FLUSHDB, and for FLUSHALL ASYNC: still sent.
    ok(&mut b, &["FLUSHDB"]);
    expect_push(&mut a, "FLUSHDB", inval_all());
    expect_push(&mut bc, "FLUSHDB (BCAST)", inval_all());
    ok(&mut b, &["FLUSHALL", "ASYNC"]);
    expect_push(&mut a, "FLUSHALL ASYNC", inval_all());
    expect_push(&mut bc, "FLUSHALL ASYNC (BCAST)", inval_all());
    // The flush untracked everything.
    ok(&mut b, &["SET", "k", "2"]);
    assert_quiet(&mut a, "a key written after the flush");
}

#[test]
fn flushall_null_invalidation_threads1() {
    flushes(1);
}

#[test]
fn flushall_null_invalidation_threads4() {
    flushes(4);
}

fn expiry(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut a = resp3(s.port);
    let mut bc = resp3(s.port);
    let mut b = s.client();
    ok(&mut a, &["CLIENT", "TRACKING", "ON"]);
    ok(
        &mut bc,
        &["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "ex"],
    );
    // Long enough that `a` reads it before it expires even on a loaded machine.
    ok(&mut b, &["SET", "ex", "v", "PX", "1000"]);
    expect_push(&mut bc, "BCAST: the SET", inval(&["ex"]));
    assert_eq!(a.cmd(&["GET", "ex"]), bulk("v"));
    // Whether the active cycle or this access removes it, the tracker hears of it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.cmd(&["GET", "ex"]) != Resp::NullBulk {
        assert!(Instant::now() < deadline, "ex never expired");
        thread::sleep(Duration::from_millis(50));
    }
    expect_push(&mut a, "a tracked key that expired", inval(&["ex"]));
    expect_push(&mut bc, "BCAST: a key that expired", inval(&["ex"]));
    assert_quiet(&mut a, "after the expiry");
    assert_quiet(&mut bc, "after the expiry");
}

#[test]
fn expired_key_invalidated_threads1() {
    expiry(1);
}

#[test]
fn expired_key_invalidated_threads4() {
    expiry(4);
}

fn info_field(c: &mut Client, section: &str, field: &str) -> i64 {
    let text = c.cmd(&["INFO", section]).as_string().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
        .trim()
        .parse()
        .unwrap()
}

fn eviction(threads: usize) {
    const KEYS: usize = 200;
    let s = KiteServer::start(&[], threads);
    let mut a = resp3(s.port);
    let mut b = s.client();
    let mut c = s.client();
    ok(&mut a, &["CLIENT", "TRACKING", "ON"]);
    let val = "x".repeat(5000);
    for i in 0..KEYS {
        let k = format!("t:{i}");
        ok(&mut b, &["SET", &k, &val]);
        assert_eq!(a.cmd(&["GET", &k]), bulk(&val));
    }
    let used = info_field(&mut b, "memory", "used_memory");
    ok(
        &mut b,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-random"],
    );
    // About 300 KB less than what is in use: roughly sixty of the tracked keys must go.
    let limit = (used - 300_000).max(1);
    ok(&mut b, &["CONFIG", "SET", "maxmemory", &limit.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    while info_field(&mut b, "stats", "evicted_keys") == 0 {
        assert!(
            Instant::now() < deadline,
            "no key evicted with maxmemory {limit} (used_memory was {used})"
        );
        ok(&mut b, &["SET", &format!("f:{n}"), "small"]);
        n += 1;
    }
    ok(&mut b, &["CONFIG", "SET", "maxmemory", "0"]);
    let mut missing = BTreeSet::new();
    for i in 0..KEYS {
        let k = format!("t:{i}");
        if c.cmd(&["EXISTS", &k]) == Resp::Integer(0) {
            missing.insert(k);
        }
    }
    assert!(
        !missing.is_empty(),
        "evicted_keys > 0 but every t:* key is there"
    );
    let mut reported = BTreeSet::new();
    while reported.len() < missing.len() {
        let r = next(&mut a, "invalidation of an evicted key");
        let key = match &r {
            Resp::Push(v) if v.len() == 2 && v[0] == bulk("invalidate") => match &v[1] {
                Resp::Array(keys) if keys.len() == 1 => keys[0].as_string().unwrap(),
                _ => panic!("unexpected invalidation {r}"),
            },
            _ => panic!("expected an invalidate push, got {r}"),
        };
        assert!(
            missing.contains(&key),
            "invalidation of {key}, which was not evicted"
        );
        assert!(reported.insert(key.clone()), "{key} invalidated twice");
    }
    assert_quiet(&mut a, "after the evicted keys' invalidations");
}

#[test]
fn evicted_key_invalidated_threads1() {
    eviction(1);
}

#[test]
fn evicted_key_invalidated_threads4() {
    eviction(4);
}

// ---------------------------------------------------------------------------
// Across threads
// ---------------------------------------------------------------------------

/// Eight tracking readers and eight writers on separate connections (at `--threads 4`
/// they are spread over every thread): each writer writes the key another reader read.
fn across_connections(threads: usize) {
    const N: usize = 8;
    let s = KiteServer::start(&[], threads);
    let mut readers: Vec<Client> = (0..N).map(|_| resp3(s.port)).collect();
    let mut writers: Vec<Client> = (0..N).map(|_| s.client()).collect();
    let mut bcast: Vec<Client> = (0..N).map(|_| resp3(s.port)).collect();
    for (i, r) in readers.iter_mut().enumerate() {
        ok(r, &["CLIENT", "TRACKING", "ON"]);
        assert_eq!(r.cmd(&["GET", &format!("key:{i}")]), Resp::Null);
    }
    for (i, r) in bcast.iter_mut().enumerate() {
        ok(
            r,
            &[
                "CLIENT",
                "TRACKING",
                "ON",
                "BCAST",
                "PREFIX",
                &format!("key:{i}"),
            ],
        );
    }
    for round in 0..3 {
        for (i, w) in writers.iter_mut().enumerate() {
            let target = (i + 3 + round) % N;
            ok(w, &["SET", &format!("key:{target}"), &format!("r{round}")]);
        }
        for (i, r) in readers.iter_mut().enumerate() {
            let key = format!("key:{i}");
            expect_push(r, &format!("round {round}: reader {i}"), inval(&[&key]));
            assert_quiet(r, &format!("round {round}: reader {i}"));
            // Read again to track it for the next round.
            assert_eq!(r.cmd(&["GET", &key]), bulk(&format!("r{round}")));
        }
        for (i, r) in bcast.iter_mut().enumerate() {
            let key = format!("key:{i}");
            expect_push(
                r,
                &format!("round {round}: BCAST reader {i}"),
                inval(&[&key]),
            );
            assert_quiet(r, &format!("round {round}: BCAST reader {i}"));
        }
    }
}

#[test]
fn invalidation_across_connections_threads1() {
    across_connections(1);
}

#[test]
fn invalidation_across_connections_threads4() {
    across_connections(4);
}
