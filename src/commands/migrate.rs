//! MIGRATE: moves keys to another server (Kite or Redis) as DUMP payloads sent with
//! RESTORE, then deletes them here unless COPY is given.
//!
//! The keys are held by a transaction for the whole exchange, so nothing changes them
//! between the DUMP and the DEL, as Redis's blocking MIGRATE guarantees. Every network
//! step is bounded by the command's timeout. A fresh connection is made for each call
//! (Redis keeps one cached for ten seconds; that saves a handshake, not a behaviour).

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::util::{eq_ci, parse_i64, SYNTAX_ERR};
use crate::async_handler;
use crate::server::session::Session;
use crate::shard::tx::{keys_by_shard, Tx};
use crate::shard::Shard;

/// Who holds the keys while MIGRATE works: its own transaction, or the EXEC it runs in
/// (which holds every shard already; taking locks again would wait on itself).
enum Held {
    Own(Tx),
    Exec,
}

impl Held {
    async fn run<R, F>(&self, sess: &Session, shard: usize, f: F) -> R
    where
        R: Send + 'static,
        F: FnOnce(&mut Shard) -> R + Send + 'static,
    {
        match self {
            Held::Own(tx) => tx.run(shard, f).await,
            Held::Exec => {
                crate::shard::hop(&sess.worker, shard, move |w| f(&mut w.shard.borrow_mut())).await
            }
        }
    }
}

pub struct Request {
    host: String,
    port: u16,
    db: i64,
    timeout: Duration,
    copy: bool,
    replace: bool,
    auth: Option<(Option<Bytes>, Bytes)>,
    pub keys: Vec<Bytes>,
    /// In cluster mode the keys go as RESTORE-ASKING, which the target serves while it
    /// imports their slot.
    pub asking: bool,
}

pub fn parse(args: &[Bytes]) -> Result<Request, &'static str> {
    let (mut copy, mut replace, mut auth) = (false, false, None);
    let mut keys = vec![args[3].clone()];
    let mut j = 6;
    while j < args.len() {
        let more = args.len() - 1 - j;
        let a = &args[j];
        if eq_ci(a, "copy") {
            copy = true;
        } else if eq_ci(a, "replace") {
            replace = true;
        } else if eq_ci(a, "auth") {
            if more < 1 {
                return Err(SYNTAX_ERR);
            }
            auth = Some((None, args[j + 1].clone()));
            j += 1;
        } else if eq_ci(a, "auth2") {
            if more < 2 {
                return Err(SYNTAX_ERR);
            }
            auth = Some((Some(args[j + 1].clone()), args[j + 2].clone()));
            j += 2;
        } else if eq_ci(a, "keys") {
            if !args[3].is_empty() {
                return Err(
                    "ERR When using MIGRATE KEYS option, the key argument must be set to the empty string",
                );
            }
            keys = args[j + 1..].to_vec();
            break;
        } else {
            return Err(SYNTAX_ERR);
        }
        j += 1;
    }
    let timeout = parse_i64(&args[5])?;
    let db = parse_i64(&args[4])?;
    let timeout = if timeout <= 0 { 1000 } else { timeout as u64 };
    // The port is read as atoi reads it, as Redis does when it connects.
    let port_text = String::from_utf8_lossy(&args[2]);
    let digits: String = port_text
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let port = digits.parse::<u16>().unwrap_or(0);
    Ok(Request {
        host: String::from_utf8_lossy(&args[1]).into_owned(),
        port,
        db,
        timeout: Duration::from_millis(timeout),
        copy,
        replace,
        auth,
        keys,
        asking: false,
    })
}

/// One RESP command, as the AOF writes them.
fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    crate::persist::aof::effects::encode(out, args);
}

pub enum Failure {
    Connect,
    Write,
    Read,
}

impl Failure {
    pub fn text(&self) -> &'static str {
        match self {
            Failure::Connect => "IOERR error or timeout connecting to the client",
            Failure::Write => "IOERR error or timeout writing to target instance",
            Failure::Read => "IOERR error or timeout reading to target instance",
        }
    }
}

/// Sends the requests and reads one reply line per request.
async fn exchange(req: &Request, payload: &[u8], replies: usize) -> Result<Vec<String>, Failure> {
    let t = req.timeout;
    let conn =
        crate::net::event_loop::time::timeout(t, TcpStream::connect((req.host.as_str(), req.port)))
            .await
            .map_err(|_| Failure::Connect)?
            .map_err(|_| Failure::Connect)?;
    let _ = conn.set_nodelay(true);
    let (rd, mut wr) = conn.into_split();
    crate::net::event_loop::time::timeout(t, wr.write_all(payload))
        .await
        .map_err(|_| Failure::Write)?
        .map_err(|_| Failure::Write)?;
    let mut rd = BufReader::new(rd);
    let mut lines = Vec::with_capacity(replies);
    for _ in 0..replies {
        let mut line = String::new();
        let n = crate::net::event_loop::time::timeout(t, rd.read_line(&mut line))
            .await
            .map_err(|_| Failure::Read)?
            .map_err(|_| Failure::Read)?;
        if n == 0 {
            return Err(Failure::Read);
        }
        lines.push(line.trim_end_matches(['\r', '\n']).to_string());
    }
    Ok(lines)
}

async_handler!(migrate, |sess, args| {
    let mut req = match parse(&args) {
        Ok(r) => r,
        Err(e) => return sess.error(e),
    };
    req.asking = sess.worker.shared.cluster.is_some();
    run(sess, req).await;
});

async fn run(sess: &mut Session, req: Request) {
    let db = sess.db;
    let tx = if sess.in_exec {
        Held::Exec
    } else {
        Held::Own(Tx::lock_keys(&sess.worker, &req.keys, false).await)
    };
    // DUMP each key that exists, with its remaining time to live.
    let opts = super::keys::dump_options(&sess.worker.shared);
    let mut found: Vec<Found> = Vec::new();
    for k in &req.keys {
        let key = k.clone();
        let o = opts;
        let dumped = tx
            .run(sess, sess.worker.shard_of(k), move |sh| {
                sh.with_ctx(db, |ctx| {
                    let now = ctx.now_ms;
                    ctx.get_read(&key).map(|e| {
                        let ttl = match e.expire_at() {
                            0 => 0,
                            at => (at as i64 - now as i64).max(1),
                        };
                        (crate::persist::rdb::write::dump_payload(&e.value, &o), ttl)
                    })
                })
            })
            .await;
        if let Some((payload, ttl)) = dumped {
            found.push((k.clone(), payload, ttl));
        }
    }
    if found.is_empty() {
        return sess.out.simple("NOKEY");
    }
    let (wire, head, replies) = request_bytes(&req, &found);
    let lines = match exchange(&req, &wire, replies).await {
        Ok(l) => l,
        Err(f) => return sess.error(f.text()),
    };
    let (error, moved) = outcome(&req, &found, &lines, head);
    if !moved.is_empty() {
        for (shard, keys) in keys_by_shard(&sess.worker, moved.iter()) {
            tx.run(sess, shard, move |sh| {
                sh.with_ctx(db, |ctx| {
                    for k in &keys {
                        if ctx.delete(k) {
                            ctx.notify(b'g', "del", k);
                        }
                    }
                })
            })
            .await;
        }
        // The replicas and the AOF see the keys go as one DEL, as Redis propagates it.
        let mut del = vec![Bytes::from_static(b"DEL")];
        del.extend(moved);
        match &tx {
            Held::Own(tx) => tx.log(db, &del),
            Held::Exec => super::log_global_effect(sess, &del),
        }
    }
    drop(tx);
    match error {
        Some(e) => sess.error(&target_error(&e)),
        None => sess.out.ok(),
    }
}

/// A key to send: its name, DUMP payload and remaining milliseconds (0: none).
pub type Found = (Bytes, Vec<u8>, i64);

/// The requests (AUTH, SELECT, one RESTORE per key), the number of replies before the
/// RESTOREs, and the number of replies in all.
pub fn request_bytes(req: &Request, found: &[Found]) -> (Vec<u8>, usize, usize) {
    let mut wire = Vec::new();
    let mut replies = 0;
    if let Some((user, pass)) = &req.auth {
        match user {
            Some(u) => encode(&mut wire, &[b"AUTH", u, pass]),
            None => encode(&mut wire, &[b"AUTH", pass]),
        }
        replies += 1;
    }
    encode(&mut wire, &[b"SELECT", req.db.to_string().as_bytes()]);
    replies += 1;
    let head = replies;
    let restore: &[u8] = if req.asking {
        b"RESTORE-ASKING"
    } else {
        b"RESTORE"
    };
    for (key, payload, ttl) in found {
        let ttl = ttl.to_string();
        if req.replace {
            encode(
                &mut wire,
                &[restore, key, ttl.as_bytes(), payload, b"REPLACE"],
            );
        } else {
            encode(&mut wire, &[restore, key, ttl.as_bytes(), payload]);
        }
        replies += 1;
    }
    (wire, head, replies)
}

/// The first error the target gave (AUTH or SELECT failing fails every key), and the
/// keys it took, to delete here unless COPY.
pub fn outcome(
    req: &Request,
    found: &[Found],
    lines: &[String],
    head: usize,
) -> (Option<String>, Vec<Bytes>) {
    let setup_error = lines[..head].iter().find(|l| l.starts_with('-')).cloned();
    let mut error = setup_error.clone();
    let mut moved = Vec::new();
    for ((key, _, _), line) in found.iter().zip(&lines[head..]) {
        if setup_error.is_some() || line.starts_with('-') {
            if error.is_none() {
                error = Some(line.clone());
            }
        } else if !req.copy {
            moved.push(key.clone());
        }
    }
    (error, moved)
}

pub fn target_error(line: &str) -> String {
    format!(
        "ERR Target instance replied with error: {}",
        line.trim_start_matches('-')
    )
}

/// The exchange for MIGRATE inside a script, which holds its thread as Redis holds the
/// whole server: blocking socket calls, each bounded by the timeout.
pub fn exchange_blocking(
    req: &Request,
    payload: &[u8],
    replies: usize,
) -> Result<Vec<String>, Failure> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let addr = (req.host.as_str(), req.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or(Failure::Connect)?;
    let conn =
        std::net::TcpStream::connect_timeout(&addr, req.timeout).map_err(|_| Failure::Connect)?;
    let _ = conn.set_nodelay(true);
    // Each step has `timeout` in all, however the target drips its bytes: the thread (a
    // script's) is held at most (1 + replies) × timeout.
    let left = |deadline: std::time::Instant| {
        deadline
            .checked_duration_since(std::time::Instant::now())
            .filter(|d| !d.is_zero())
    };
    let deadline = std::time::Instant::now() + req.timeout;
    let mut sent = 0;
    while sent < payload.len() {
        let t = left(deadline).ok_or(Failure::Write)?;
        conn.set_write_timeout(Some(t))
            .map_err(|_| Failure::Write)?;
        match (&conn).write(&payload[sent..]) {
            Ok(0) | Err(_) => return Err(Failure::Write),
            Ok(n) => sent += n,
        }
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut lines = Vec::with_capacity(replies);
    for _ in 0..replies {
        let deadline = std::time::Instant::now() + req.timeout;
        loop {
            if let Some(i) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                let text = String::from_utf8_lossy(&line);
                lines.push(text.trim_end_matches(['\r', '\n']).to_string());
                break;
            }
            // A reply line is a status or an error: a target sending more is not one.
            if pending.len() > MAX_REPLY_LINE {
                return Err(Failure::Read);
            }
            let t = left(deadline).ok_or(Failure::Read)?;
            conn.set_read_timeout(Some(t)).map_err(|_| Failure::Read)?;
            let mut chunk = [0u8; 4096];
            match (&conn).read(&mut chunk) {
                Ok(0) | Err(_) => return Err(Failure::Read),
                Ok(n) => pending.extend_from_slice(&chunk[..n]),
            }
        }
    }
    Ok(lines)
}

/// The longest reply line MIGRATE reads from its target.
const MAX_REPLY_LINE: usize = 64 * 1024;

/// Key positions: the key argument, or what follows KEYS.
pub fn migrate_keys(args: &[Bytes]) -> Vec<usize> {
    let mut j = 6;
    while j < args.len() {
        if eq_ci(&args[j], "keys") {
            return (j + 1..args.len()).collect();
        }
        if eq_ci(&args[j], "auth") {
            j += 1;
        } else if eq_ci(&args[j], "auth2") {
            j += 2;
        }
        j += 1;
    }
    if args.len() > 3 && !args[3].is_empty() {
        vec![3]
    } else {
        Vec::new()
    }
}
