//! The connection family: PING, ECHO, QUIT, RESET, AUTH, SELECT, HELLO, CLIENT.

use std::time::Duration;

use bytes::Bytes;

use super::util::{eq_ci, parse_i64, printable, NOT_INT, SYNTAX_ERR};
use super::{flags, table};
use crate::async_handler;
use crate::server::session::{ReplyMode, Session};
use crate::shard::clients::Pause;
use crate::shard::{broadcast, unix_ms};

pub const SERVER_VERSION: &str = "7.2.4";

pub fn ping(sess: &mut Session, args: &[Bytes]) {
    if sess.subscriptions() > 0 && !sess.out.resp3 {
        // A subscribed RESP2 connection gets pings in the shape of its messages.
        if args.len() > 2 {
            return sess.error(&super::arity_error("ping"));
        }
        sess.out.array(2);
        sess.out.bulk(b"pong");
        sess.out.bulk(args.get(1).map_or(&b""[..], |a| a));
        return;
    }
    match args.len() {
        1 => sess.out.simple("PONG"),
        2 => sess.out.bulk(&args[1]),
        _ => sess.error(&super::arity_error("ping")),
    }
}

pub fn echo(sess: &mut Session, args: &[Bytes]) {
    sess.out.bulk(&args[1]);
}

pub fn quit(sess: &mut Session, _args: &[Bytes]) {
    sess.out.ok();
    sess.close_after_reply = true;
}

/// Ends MONITOR mode (RESET, a closing connection).
pub fn stop_monitor(sess: &mut Session) {
    if !sess.monitoring {
        return;
    }
    let id = sess.id;
    sess.worker
        .clients
        .borrow_mut()
        .monitors
        .retain(|m| m.0 != id);
    sess.worker
        .shared
        .monitors
        .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    sess.monitoring = false;
    sess.handle.info.borrow_mut().monitor = false;
}

pub fn reset(sess: &mut Session, _args: &[Bytes]) {
    disable_tracking(sess);
    stop_monitor(sess);
    sess.multi = None;
    super::transactions::unwatch_all(sess);
    super::pubsub::unsubscribe_all(sess);
    sess.set_db(0);
    sess.out.resp3 = false;
    sess.no_touch = false;
    sess.reply_mode = ReplyMode::On;
    super::acl::reset_user(sess);
    {
        let mut info = sess.handle.info.borrow_mut();
        info.name.clear();
        info.resp = 2;
        info.multi = -1;
        info.no_evict = false;
        info.no_touch = false;
    }
    sess.out.simple("RESET");
}

pub fn auth(sess: &mut Session, args: &[Bytes]) {
    let (user, pass): (&[u8], &[u8]) = match args.len() {
        2 => (b"default", &args[1]),
        3 => (&args[1], &args[2]),
        _ => return sess.error(SYNTAX_ERR),
    };
    if args.len() == 2 && sess.worker.shared.acl.default_user().nopass {
        return sess.error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?");
    }
    if super::acl::authenticate(sess, user, pass, &args[0]) {
        sess.out.ok();
    } else {
        sess.error(super::acl::WRONGPASS);
    }
}

pub fn select(sess: &mut Session, args: &[Bytes]) {
    match parse_i64(&args[1]) {
        Err(_) => sess.error(NOT_INT),
        Ok(n) if n != 0 && sess.worker.shared.cluster.is_some() => {
            sess.error("ERR SELECT is not allowed in cluster mode")
        }
        Ok(n) if n < 0 || n as usize >= sess.worker.shared.tunables.databases => {
            sess.error("ERR DB index is out of range")
        }
        Ok(n) => {
            sess.set_db(n as usize);
            sess.out.ok();
        }
    }
}

pub fn hello(sess: &mut Session, args: &[Bytes]) {
    let mut proto = if sess.out.resp3 { 3 } else { 2 };
    let mut i = 1;
    if args.len() > 1 {
        match parse_i64(&args[1]) {
            Ok(v) => {
                if v != 2 && v != 3 {
                    return sess.error("NOPROTO unsupported protocol version");
                }
                proto = v;
            }
            Err(_) => return sess.error("ERR Protocol version is not an integer or out of range"),
        }
        i = 2;
    }
    let mut auth: Option<(Bytes, Bytes)> = None;
    let mut name: Option<Bytes> = None;
    while i < args.len() {
        let more = args.len() - i - 1;
        if eq_ci(&args[i], "auth") && more >= 2 {
            auth = Some((args[i + 1].clone(), args[i + 2].clone()));
            i += 3;
        } else if eq_ci(&args[i], "setname") && more >= 1 {
            name = Some(args[i + 1].clone());
            i += 2;
        } else {
            return sess.error(&format!(
                "ERR Syntax error in HELLO option '{}'",
                printable(&args[i], 128)
            ));
        }
    }
    if let Some((user, pass)) = &auth {
        if !super::acl::authenticate(sess, user, pass, &args[0]) {
            return sess.error(super::acl::WRONGPASS);
        }
    }
    if !sess.authenticated {
        return sess.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    if let Some(n) = name {
        if let Err(e) = valid_name(&n, "Client names") {
            return sess.error(&e);
        }
        sess.handle.info.borrow_mut().name = n.to_vec();
    }
    sess.out.resp3 = proto == 3;
    if let Some(t) = sess.worker.clients.borrow_mut().trackers.get_mut(&sess.id) {
        t.resp3 = proto == 3;
    }
    sess.handle.info.borrow_mut().resp = proto as u8;
    sess.out.map(7);
    sess.out.bulk(b"server");
    sess.out.bulk(b"redis");
    sess.out.bulk(b"version");
    sess.out.bulk(SERVER_VERSION.as_bytes());
    sess.out.bulk(b"proto");
    sess.out.int(proto);
    sess.out.bulk(b"id");
    sess.out.int(sess.id as i64);
    sess.out.bulk(b"mode");
    sess.out.bulk(b"standalone");
    sess.out.bulk(b"role");
    sess.out.bulk(b"master");
    sess.out.bulk(b"modules");
    sess.out.array(0);
}

/// Client names and library names: printable ASCII without spaces, as Redis requires.
fn valid_name(name: &[u8], what: &str) -> Result<(), String> {
    if name.iter().all(|&c| (b'!'..=b'~').contains(&c)) {
        Ok(())
    } else {
        Err(format!(
            "ERR {} cannot contain spaces, newlines or special characters.",
            what
        ))
    }
}

pub const CLIENT_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("caching", 3, "noscript loading stale"),
    ("getname", 2, "noscript loading stale"),
    ("getredir", 2, "noscript loading stale"),
    ("help", 2, "loading stale"),
    ("id", 2, "noscript loading stale"),
    ("info", 2, "noscript loading stale"),
    ("kill", -3, "admin noscript loading stale"),
    ("list", -2, "admin noscript loading stale"),
    ("no-evict", 3, "admin noscript loading stale"),
    ("no-touch", 3, "noscript loading stale"),
    ("pause", -3, "admin noscript loading stale"),
    ("reply", 3, "noscript loading stale"),
    ("setinfo", 4, "noscript loading stale"),
    ("setname", 3, "noscript loading stale"),
    ("tracking", -3, "noscript loading stale"),
    ("trackinginfo", 2, "noscript loading stale"),
    ("unblock", -3, "admin noscript loading stale"),
    ("unpause", 2, "admin noscript loading stale"),
];

const CLIENT_HELP: &[&str] = &[
    "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CACHING (YES|NO)",
    "    With OPTIN or OPTOUT tracking: whether the next command's keys are tracked.",
    "GETNAME",
    "    The name of this connection.",
    "GETREDIR",
    "    The client ID invalidations are redirected to (-1 when not tracking).",
    "ID",
    "    The id of this connection.",
    "INFO",
    "    Details of this connection, as one CLIENT LIST line.",
    "KILL <ip:port> | <filter> <value> ...",
    "    Closes connections by address, or by ID, ADDR, LADDR, USER, TYPE, MAXAGE, SKIPME.",
    "LIST [TYPE <type>] [ID <id> ...]",
    "    One line per connection.",
    "NO-EVICT (ON|OFF)",
    "    Marks this connection as exempt from client eviction.",
    "NO-TOUCH (ON|OFF)",
    "    Whether this connection's reads update keys' access times.",
    "PAUSE <timeout> [WRITE|ALL]",
    "    Holds back client commands (or only writes) for <timeout> milliseconds.",
    "REPLY (ON|OFF|SKIP)",
    "    Turns replies to this connection on or off, or skips the next one.",
    "SETINFO <LIB-NAME|LIB-VER> <value>",
    "    Records the client library's name or version.",
    "SETNAME <name>",
    "    Names this connection.",
    "TRACKING (ON|OFF) [REDIRECT <id>] [BCAST] [PREFIX <prefix> [...]] [OPTIN] [OPTOUT] [NOLOOP]",
    "    Client-side caching: be told when keys this connection read change.",
    "TRACKINGINFO",
    "    This connection's tracking state.",
    "UNBLOCK <id> [TIMEOUT|ERROR]",
    "    Releases a client blocked in a blocking command.",
    "UNPAUSE",
    "    Ends a pause.",
    "HELP",
    "    Print this help.",
];

fn on_off(arg: &[u8]) -> Option<bool> {
    if eq_ci(arg, "on") {
        Some(true)
    } else if eq_ci(arg, "off") {
        Some(false)
    } else {
        None
    }
}

/// Whether a CLIENT PAUSE is set (maybe already over): checked before each command, so
/// that the wait's future is only made while one is.
#[inline]
pub fn pause_set(sess: &Session) -> bool {
    sess.worker.clients.borrow().pause.until_unix_ms != 0
}

/// Holds a command back while CLIENT PAUSE is in force for it.
pub async fn wait_if_paused(sess: &mut Session, args: &[Bytes]) {
    loop {
        let (pause, notify) = {
            let clients = sess.worker.clients.borrow();
            if clients.pause.until_unix_ms == 0 {
                return;
            }
            (clients.pause, clients.pause_notify.clone())
        };
        let now = unix_ms();
        if pause.until_unix_ms <= now {
            return;
        }
        if pause.writes_only {
            let writes = table()
                .lookup(&args[0])
                .is_some_and(|c| c.has(flags::WRITE) || c.has(flags::MAY_REPLICATE));
            if !writes {
                return;
            }
        }
        let wait = Duration::from_millis(pause.until_unix_ms - now);
        // Earlier replies reach the client before the pause holds this one.
        let _ = crate::net::stream_io::settle(crate::net::link(sess.id).as_deref()).await;
        let _ = crate::net::event_loop::time::timeout(wait, notify.notified()).await;
    }
}

/// Whether a client is of a CLIENT LIST / CLIENT KILL `TYPE`.
fn client_type_is(info: &crate::shard::clients::ClientInfo, kind: &str) -> bool {
    use crate::shard::clients::{KIND_MASTER, KIND_NORMAL, KIND_REPLICA};
    let pubsub = info.sub + info.psub + info.ssub > 0;
    match kind {
        "normal" => info.kind == KIND_NORMAL && !pubsub,
        "pubsub" => info.kind == KIND_NORMAL && pubsub,
        "replica" | "slave" => info.kind == KIND_REPLICA,
        "master" => info.kind == KIND_MASTER,
        _ => false,
    }
}

/// A CLIENT KILL filter.
#[derive(Clone, Default)]
struct KillFilter {
    id: Option<u64>,
    addr: Option<String>,
    laddr: Option<String>,
    user: Option<String>,
    maxage: Option<u64>,
    /// TYPE filter: normal, pubsub, master, replica or slave.
    kind: Option<String>,
    skip_me: Option<u64>,
}

fn parse_kill(sess: &Session, args: &[Bytes]) -> Result<(KillFilter, bool), String> {
    let mut f = KillFilter {
        skip_me: Some(sess.id),
        ..KillFilter::default()
    };
    if args.len() == 3 {
        // The old form: CLIENT KILL ip:port, which also kills the caller.
        f.addr = Some(String::from_utf8_lossy(&args[2]).into_owned());
        f.skip_me = None;
        return Ok((f, true));
    }
    let mut i = 2;
    while i < args.len() {
        if i + 1 >= args.len() {
            return Err(SYNTAX_ERR.into());
        }
        let v = &args[i + 1];
        let text = String::from_utf8_lossy(v).into_owned();
        match String::from_utf8_lossy(&args[i])
            .to_ascii_lowercase()
            .as_str()
        {
            "id" => {
                f.id = Some(
                    parse_i64(v)
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or("ERR client-id should be greater than 0")?
                        as u64,
                )
            }
            "addr" => f.addr = Some(text),
            "laddr" => f.laddr = Some(text),
            "user" => {
                if sess.worker.shared.acl.user(&text).is_none() {
                    return Err(format!("ERR No such user '{text}'"));
                }
                f.user = Some(text)
            }
            "maxage" => f.maxage = Some(parse_i64(v).map_err(|e| e.to_string())?.max(0) as u64),
            "type" => match text.to_ascii_lowercase().as_str() {
                t @ ("normal" | "master" | "replica" | "slave" | "pubsub") => {
                    f.kind = Some(t.to_string())
                }
                _ => return Err(format!("ERR Unknown client type '{}'", text)),
            },
            "skipme" => match text.to_ascii_lowercase().as_str() {
                "yes" => f.skip_me = Some(sess.id),
                "no" => f.skip_me = None,
                _ => return Err(SYNTAX_ERR.into()),
            },
            _ => return Err(SYNTAX_ERR.into()),
        }
        i += 2;
    }
    Ok((f, false))
}

async_handler!(client, |sess, args| {
    // CLIENT LIST and INFO show the asking client's request as its query buffer.
    let size: usize = args.iter().map(|a| a.len() + 16).sum::<usize>() + 8;
    sess.handle.info.borrow_mut().qbuf = size;
    client_sub(sess, &args).await;
    sess.handle.info.borrow_mut().qbuf = 0;
});

async fn client_sub(sess: &mut Session, args: &[Bytes]) {
    let args = args.to_vec();
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "id" => sess.out.int(sess.id as i64),
        "getname" => {
            let name = sess.handle.info.borrow().name.clone();
            if name.is_empty() {
                sess.out.null();
            } else {
                sess.out.bulk(&name);
            }
        }
        "setname" => {
            if let Err(e) = valid_name(&args[2], "Client names") {
                return sess.error(&e);
            }
            sess.handle.info.borrow_mut().name = args[2].to_vec();
            sess.out.ok();
        }
        "setinfo" => {
            let attr = String::from_utf8_lossy(&args[2]).to_ascii_lowercase();
            let what = match attr.as_str() {
                "lib-name" => "lib-name",
                "lib-ver" => "lib-ver",
                _ => {
                    return sess.error(&format!(
                        "ERR Unrecognized option '{}'",
                        printable(&args[2], 128)
                    ))
                }
            };
            if let Err(e) = valid_name(&args[3], &String::from_utf8_lossy(&args[2])) {
                return sess.error(&e);
            }
            let mut info = sess.handle.info.borrow_mut();
            if what == "lib-name" {
                info.lib_name = args[3].to_vec();
            } else {
                info.lib_ver = args[3].to_vec();
            }
            drop(info);
            sess.out.ok();
        }
        "info" => {
            let line = sess.handle.line(unix_ms());
            sess.out.verbatim(format!("{}\n", line).as_bytes());
        }
        "list" => {
            let mut ids: Option<Vec<u64>> = None;
            let mut kind: Option<String> = None;
            let mut i = 2;
            while i < args.len() {
                if eq_ci(&args[i], "type") && i + 1 < args.len() {
                    let t = String::from_utf8_lossy(&args[i + 1]).to_ascii_lowercase();
                    if !["normal", "master", "replica", "slave", "pubsub"].contains(&t.as_str()) {
                        return sess.error(&format!(
                            "ERR Unknown client type '{}'",
                            printable(&args[i + 1], 128)
                        ));
                    }
                    kind = Some(t);
                    i += 2;
                } else if eq_ci(&args[i], "id") && i + 1 < args.len() {
                    let mut list = Vec::new();
                    for a in &args[i + 1..] {
                        match parse_i64(a) {
                            Ok(n) if n > 0 => list.push(n as u64),
                            _ => return sess.error("ERR Invalid client ID"),
                        }
                    }
                    ids = Some(list);
                    i = args.len();
                } else {
                    return sess.error(SYNTAX_ERR);
                }
            }
            let lines = broadcast(&sess.worker, move |w| {
                let now = unix_ms();
                let clients = w.clients.borrow();
                let mut v: Vec<(u64, String)> = clients
                    .map
                    .values()
                    .filter_map(|h| {
                        let info = h.info.borrow();
                        let keep = kind.as_deref().is_none_or(|k| client_type_is(&info, k));
                        keep.then(|| (info.id, h.line(now)))
                    })
                    .collect();
                v.sort();
                v
            })
            .await;
            let mut all: Vec<(u64, String)> = lines.into_iter().flatten().collect();
            all.sort();
            let mut text = String::new();
            for (id, line) in all {
                if ids.as_ref().is_none_or(|l| l.contains(&id)) {
                    text.push_str(&line);
                    text.push('\n');
                }
            }
            sess.out.verbatim(text.as_bytes());
        }
        "kill" => {
            let (filter, old_form) = match parse_kill(sess, &args) {
                Ok(f) => f,
                Err(e) => return sess.error(&e),
            };
            let f = filter.clone();
            let killed = broadcast(&sess.worker, move |w| {
                let now = unix_ms();
                let clients = w.clients.borrow();
                let mut n = 0;
                for h in clients.map.values() {
                    let info = h.info.borrow();
                    let matches = f.id.is_none_or(|id| id == info.id)
                        && f.addr.as_ref().is_none_or(|a| *a == info.addr)
                        && f.laddr.as_ref().is_none_or(|a| *a == info.laddr)
                        && f.user.as_ref().is_none_or(|u| **u == *info.user)
                        && f.maxage.is_none_or(|age| {
                            now.saturating_sub(info.created_unix_ms) / 1000 >= age
                        })
                        && f.kind.as_deref().is_none_or(|k| client_type_is(&info, k))
                        && f.skip_me != Some(info.id);
                    if matches {
                        drop(info);
                        h.kill();
                        n += 1;
                    }
                }
                n
            })
            .await;
            let total: i64 = killed.iter().sum();
            if old_form {
                if total == 0 {
                    sess.error("ERR No such client");
                } else {
                    sess.out.ok();
                }
            } else {
                sess.out.int(total);
            }
        }
        "reply" => {
            let mode = &args[2];
            if eq_ci(mode, "on") {
                sess.reply_mode = ReplyMode::On;
                sess.out.ok();
            } else if eq_ci(mode, "off") {
                sess.reply_mode = ReplyMode::Off;
            } else if eq_ci(mode, "skip") {
                if sess.reply_mode != ReplyMode::Off {
                    sess.reply_mode = ReplyMode::SkipNext;
                }
            } else {
                sess.error(SYNTAX_ERR);
            }
        }
        "no-evict" => match on_off(&args[2]) {
            Some(v) => {
                sess.handle.info.borrow_mut().no_evict = v;
                sess.out.ok();
            }
            None => sess.error(SYNTAX_ERR),
        },
        "no-touch" => match on_off(&args[2]) {
            Some(v) => {
                sess.no_touch = v;
                sess.handle.info.borrow_mut().no_touch = v;
                sess.out.ok();
            }
            None => sess.error(SYNTAX_ERR),
        },
        "pause" => {
            let ms = match parse_i64(&args[2]) {
                Ok(v) if v < 0 => return sess.error("ERR timeout is negative"),
                Ok(v) => v as u64,
                Err(_) => return sess.error("ERR timeout is not an integer or out of range"),
            };
            let writes_only = match args.get(3) {
                None => false,
                Some(a) if eq_ci(a, "write") && args.len() == 4 => true,
                Some(a) if eq_ci(a, "all") && args.len() == 4 => false,
                Some(_) => return sess.error(SYNTAX_ERR),
            };
            let until = unix_ms().saturating_add(ms);
            broadcast(&sess.worker, move |w| {
                let mut clients = w.clients.borrow_mut();
                let old = clients.pause;
                // A longer pause wins; an ALL pause is not weakened by a WRITE one.
                if until > old.until_unix_ms || (!writes_only && old.writes_only) {
                    clients.pause = Pause {
                        until_unix_ms: until.max(old.until_unix_ms),
                        writes_only: writes_only
                            && (old.writes_only || old.until_unix_ms <= unix_ms()),
                    };
                }
            })
            .await;
            sess.out.ok();
        }
        "unpause" => {
            broadcast(&sess.worker, |w| {
                let mut clients = w.clients.borrow_mut();
                clients.pause = Pause::default();
                clients.pause_notify.notify_waiters();
            })
            .await;
            sess.out.ok();
        }
        "unblock" => {
            if parse_i64(&args[2]).is_err() {
                return sess.error(NOT_INT);
            }
            if args.len() == 4 && !(eq_ci(&args[3], "timeout") || eq_ci(&args[3], "error")) {
                return sess.error("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR");
            }
            if args.len() > 4 {
                return sess.error(SYNTAX_ERR);
            }
            let id = parse_i64(&args[2]).unwrap_or(0) as u64;
            let with_error = args.len() == 4 && eq_ci(&args[3], "error");
            let found = broadcast(&sess.worker, move |w| {
                let clients = w.clients.borrow();
                match clients.map.get(&id) {
                    Some(h) if h.blocked.get() => {
                        h.unblock.set(Some(with_error));
                        h.wake.notify_one();
                        1
                    }
                    _ => 0,
                }
            })
            .await;
            sess.out.int(found.iter().sum::<i64>());
        }
        "tracking" => tracking(sess, &args).await,
        "caching" => caching(sess, &args[2]),
        "getredir" => {
            let r = sess.handle.info.borrow().redir;
            sess.out.int(r);
        }
        "trackinginfo" => tracking_info(sess),
        "help" => {
            sess.out.array(CLIENT_HELP.len());
            for line in CLIENT_HELP {
                sess.out.simple(line);
            }
        }
        _ => unreachable!("subcommands are checked before dispatch"),
    }
}

// ---------------------------------------------------------------------------------------
// CLIENT TRACKING (docs/tracking.md)
// ---------------------------------------------------------------------------------------

async fn tracking(sess: &mut Session, args: &[Bytes]) {
    let (mut redirect, mut bcast, mut optin, mut optout, mut noloop) =
        (0u64, false, false, false, false);
    let mut prefixes: Vec<Bytes> = Vec::new();
    let mut j = 3;
    while j < args.len() {
        let more = j + 1 < args.len();
        let a = &args[j];
        if eq_ci(a, "redirect") && more {
            j += 1;
            if redirect != 0 {
                return sess.error("ERR A client can only redirect to a single other client");
            }
            let id = match parse_i64(&args[j]) {
                Ok(v) => v,
                Err(e) => return sess.error(e),
            };
            redirect = id.max(0) as u64;
            if id <= 0
                || crate::tracking::thread_of(&sess.worker, redirect)
                    .await
                    .is_none()
            {
                return sess.error("ERR The client ID you want redirect to does not exist");
            }
        } else if eq_ci(a, "bcast") {
            bcast = true;
        } else if eq_ci(a, "optin") {
            optin = true;
        } else if eq_ci(a, "optout") {
            optout = true;
        } else if eq_ci(a, "noloop") {
            noloop = true;
        } else if eq_ci(a, "prefix") && more {
            j += 1;
            prefixes.push(args[j].clone());
        } else {
            return sess.error(SYNTAX_ERR);
        }
        j += 1;
    }
    if eq_ci(&args[2], "off") {
        disable_tracking(sess);
        return sess.out.ok();
    }
    if !eq_ci(&args[2], "on") {
        return sess.error(SYNTAX_ERR);
    }
    if !bcast && !prefixes.is_empty() {
        return sess.error("ERR PREFIX option requires BCAST mode to be enabled");
    }
    let old = {
        let clients = sess.worker.clients.borrow();
        clients
            .trackers
            .get(&sess.id)
            .map(|t| (t.bcast, t.optin, t.optout, t.prefixes.clone()))
    };
    if let Some((old_bcast, _, _, _)) = &old {
        if *old_bcast != bcast {
            return sess.error("ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.");
        }
    }
    if bcast && (optin || optout) {
        return sess.error("ERR OPTIN and OPTOUT are not compatible with BCAST");
    }
    if optin && optout {
        return sess.error("ERR You can't specify both OPTIN mode and OPTOUT mode");
    }
    if let Some((_, old_in, old_out, _)) = &old {
        if (optin && *old_out) || (optout && *old_in) {
            return sess.error("ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode.");
        }
    }
    let mut all_prefixes = old.map(|o| o.3).unwrap_or_default();
    if bcast {
        if let Err(e) = check_prefixes(&all_prefixes, &prefixes) {
            return sess.error(&e);
        }
        if prefixes.is_empty() && all_prefixes.is_empty() {
            prefixes.push(Bytes::new());
        }
        for p in prefixes {
            if !all_prefixes.contains(&p) {
                all_prefixes.push(p);
            }
        }
    }
    let redirect_thread = if redirect != 0 {
        crate::tracking::thread_of(&sess.worker, redirect)
            .await
            .unwrap_or(sess.worker.id)
    } else {
        0
    };
    let push = sess.push_sender();
    let newly = !sess.tracking;
    sess.tracking = true;
    let id = sess.id;
    {
        let mut clients = sess.worker.clients.borrow_mut();
        clients.trackers.insert(
            id,
            crate::tracking::Tracker {
                push,
                queued: sess.push_queued.clone(),
                resp3: sess.out.resp3,
                bcast,
                optin,
                optout,
                noloop,
                redirect,
                redirect_thread,
                broken: false,
                prefixes: all_prefixes.clone(),
            },
        );
    }
    if newly {
        sess.worker
            .shared
            .tracking
            .clients
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
    if bcast {
        let entries = all_prefixes
            .iter()
            .map(|p| crate::tracking::Bcast {
                prefix: p.clone(),
                id,
                thread: sess.worker.id,
                noloop,
            })
            .collect();
        sess.worker.shared.tracking.set_bcast(id, entries);
    }
    {
        let mut info = sess.handle.info.borrow_mut();
        info.tracking = true;
        info.tracking_bcast = bcast;
        info.tracking_broken = false;
        info.redir = redirect as i64;
    }
    sess.out.ok();
}

/// Redis refuses prefixes that overlap each other or the client's current ones.
fn check_prefixes(current: &[Bytes], new: &[Bytes]) -> Result<(), String> {
    let overlap = |a: &[u8], b: &[u8]| a.starts_with(b) || b.starts_with(a);
    for (i, p) in new.iter().enumerate() {
        if let Some(c) = current.iter().find(|c| overlap(c, p)) {
            return Err(format!(
                "ERR Prefix '{}' overlaps with an existing prefix '{}'. Prefixes for a single client must not overlap.",
                String::from_utf8_lossy(p),
                String::from_utf8_lossy(c)
            ));
        }
        if let Some(q) = new[i + 1..].iter().find(|q| overlap(p, q)) {
            return Err(format!(
                "ERR Prefix '{}' overlaps with another provided prefix '{}'. Prefixes for a single client must not overlap.",
                String::from_utf8_lossy(p),
                String::from_utf8_lossy(q)
            ));
        }
    }
    Ok(())
}

/// Turns tracking off (CLIENT TRACKING OFF, RESET, a closing connection).
pub fn disable_tracking(sess: &mut Session) {
    if !sess.tracking {
        return;
    }
    sess.tracking = false;
    sess.caching = false;
    let t = sess.worker.clients.borrow_mut().trackers.remove(&sess.id);
    if t.is_some_and(|t| t.bcast) {
        sess.worker.shared.tracking.set_bcast(sess.id, Vec::new());
    }
    sess.worker
        .shared
        .tracking
        .clients
        .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    let mut info = sess.handle.info.borrow_mut();
    info.tracking = false;
    info.tracking_bcast = false;
    info.tracking_broken = false;
    info.redir = -1;
}

fn caching(sess: &mut Session, arg: &[u8]) {
    let modes = {
        let clients = sess.worker.clients.borrow();
        clients.trackers.get(&sess.id).map(|t| (t.optin, t.optout))
    };
    let Some((optin, optout)) = modes else {
        return sess.error("ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled");
    };
    if eq_ci(arg, "yes") {
        if !optin {
            return sess.error(
                "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.",
            );
        }
    } else if eq_ci(arg, "no") {
        if !optout {
            return sess.error(
                "ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.",
            );
        }
    } else {
        return sess.error(SYNTAX_ERR);
    }
    sess.caching = true;
    sess.out.ok();
}

fn tracking_info(sess: &mut Session) {
    let clients = sess.worker.clients.borrow();
    let t = clients.trackers.get(&sess.id);
    let mut flags: Vec<&str> = vec![if t.is_some() { "on" } else { "off" }];
    if let Some(t) = t {
        if t.bcast {
            flags.push("bcast");
        }
        if t.optin {
            flags.push("optin");
            if sess.caching {
                flags.push("caching-yes");
            }
        }
        if t.optout {
            flags.push("optout");
            if sess.caching {
                flags.push("caching-no");
            }
        }
        if t.noloop {
            flags.push("noloop");
        }
        if t.broken {
            flags.push("broken_redirect");
        }
    }
    let redirect = t.map_or(-1, |t| t.redirect as i64);
    let mut prefixes: Vec<Bytes> = t.map(|t| t.prefixes.clone()).unwrap_or_default();
    prefixes.sort();
    drop(clients);
    let out = &mut sess.out;
    out.map(3);
    out.bulk(b"flags");
    out.set(flags.len());
    for f in flags {
        out.bulk(f.as_bytes());
    }
    out.bulk(b"redirect");
    out.int(redirect);
    out.bulk(b"prefixes");
    out.array(prefixes.len());
    for p in prefixes {
        out.bulk(&p);
    }
}
