//! A client connection's bytes, from accept to close: refusals at the door (protected
//! mode, `maxclients`), reading, parsing into commands (`protocol::parse`), handing each
//! group to `server::dispatch`, sending the replies it left in the session's buffer
//! (with the thread's send batch, or at once), pushed messages (Pub/Sub, MONITOR), output
//! and query buffer limits, an HTTP first line (`net::http`), and the move of a
//! connection to the thread its keys live on. Never runs a command or touches shard data
//! itself.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};

use crate::net::stream_io;
use crate::net::Stream;
use crate::protocol::parse::{ParseLimits, RequestParser};
use crate::server::dispatch::{await_durable, prefetch_keys, run_group};
use crate::server::session::{Carried, Session};
use crate::shard::clients::{ClientHandle, ClientInfo};
use crate::shard::{unix_ms, Worker};

/// Commands parsed from the input before they are run as a group.
const MAX_GROUP: usize = 1024;
/// Output is written out once it grows past this, even mid-pipeline.
pub(crate) const FLUSH_AT: usize = 64 * 1024;
/// Consecutive commands bound for one other shard before the connection moves there.
const MIGRATE_AFTER: u32 = 8;

/// A connection on its way to another thread.
pub struct Moving {
    stream: std::net::TcpStream,
    rbuf: BytesMut,
    parser: RequestParser,
    info: ClientInfo,
    session: Carried,
    /// Replies already owed before anything else is sent (`scripting::busy`).
    preface: Vec<u8>,
    /// The TLS session of a connection accepted on `tls-port`, not yet started.
    tls: Option<rustls::ServerConnection>,
    /// Its first line was RESP, not an HTTP request line: checked once, where it was
    /// accepted, not again after a move.
    resp_confirmed: bool,
}

enum Exit {
    Closed,
    Migrate(usize),
    /// The connection's first line was an HTTP request line: answer it as HTTP
    /// (`net::http`) with what was read.
    Http(BytesMut),
}

/// Redis's explanation to a remote client while no password protects the default user.
const PROTECTED_MODE_DENIED: &str = "-DENIED Redis is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers to Redis you may adopt one of the following solutions: 1) Just disable protected mode sending the command 'CONFIG SET protected-mode no' from the loopback interface by connecting to Redis from the same host the server is running, however MAKE SURE Redis is not publicly accessible from internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively you can just disable the protected mode by editing the Redis configuration file, and setting the protected mode option to 'no', and then restarting the server. 3) If you started the server manually just for testing, restart it with the '--protected-mode no' option. 4) Set up an authentication password for the default user. NOTE: You only need to do one of the above things in order for the server to start accepting connections from the outside.\r\n";

/// Takes in the connections the accepting thread left for this one.
pub fn take_inbox(worker: &Rc<Worker>) {
    let arrived = std::mem::take(
        &mut *worker.shared.inbox[worker.id]
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    for (stream, tls) in arrived {
        accept_with(worker, stream, tls, BytesMut::new(), Vec::new());
    }
}

/// Accepts a connection that a busy script's hook already read from (`input`) and
/// answered (`output`, not yet sent).
pub fn accept_with(
    worker: &Rc<Worker>,
    stream: std::net::TcpStream,
    tls: bool,
    input: BytesMut,
    output: Vec<u8>,
) {
    let shared = &worker.shared;
    // A TLS connection starts its session with the settings in force now.
    let tls = if tls {
        let Some(config) = crate::net::tls::current() else {
            return;
        };
        match rustls::ServerConnection::new(config) {
            Ok(session) => Some(session),
            Err(e) => {
                tracing::warn!("TLS session setup failed: {e}");
                return;
            }
        }
    } else {
        None
    };
    if shared.tunables.protected_mode.load(Ordering::Relaxed)
        && shared.acl.default_user().nopass
        && !stream.peer_addr().is_ok_and(|a| a.ip().is_loopback())
    {
        worker.shard.borrow_mut().stats.rejected_connections += 1;
        stream_io::refuse(stream, PROTECTED_MODE_DENIED.as_bytes());
        return;
    }
    let max = shared.tunables.maxclients.load(Ordering::Relaxed);
    let n = shared.connected_clients.fetch_add(1, Ordering::AcqRel) + 1;
    if n > max {
        shared.connected_clients.fetch_sub(1, Ordering::AcqRel);
        worker.shard.borrow_mut().stats.rejected_connections += 1;
        stream_io::refuse(stream, b"-ERR max number of clients reached\r\n");
        return;
    }
    worker.shard.borrow_mut().stats.connections_received += 1;
    let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
    let addr = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let laddr = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let moving = Moving {
        stream,
        rbuf: {
            let mut b = BytesMut::with_capacity(16 * 1024 + input.len());
            b.extend_from_slice(&input);
            b
        },
        parser: RequestParser::default(),
        info: ClientInfo::new(id, addr, laddr, fd),
        session: Carried::fresh(shared),
        preface: output,
        tls,
        resp_confirmed: false,
    };
    crate::net::event_loop::spawn_local(serve(worker.clone(), moving));
}

/// Takes in a connection that moved here from another thread.
pub fn arrive(worker: &Rc<Worker>, moving: Moving) {
    worker.shard.borrow_mut().stats.migrations += 1;
    crate::net::event_loop::spawn_local(serve(worker.clone(), moving));
}

async fn serve(worker: Rc<Worker>, m: Moving) {
    let Moving {
        stream,
        mut rbuf,
        mut parser,
        mut info,
        session,
        preface,
        tls,
        resp_confirmed,
    } = m;
    let _ = stream.set_nonblocking(true);
    let _ = stream.set_nodelay(true);
    let Ok(stream) = crate::net::event_loop::Socket::from_std(stream) else {
        worker
            .shared
            .connected_clients
            .fetch_sub(1, Ordering::AcqRel);
        return;
    };
    let stream = match tls {
        Some(session) => Stream::tls(stream, session),
        None => Stream::plain(stream),
    };
    info.db = session.db;
    let id = info.id;
    info.user = session.user.name.as_str().into();
    let handle = ClientHandle::new(info);
    handle.resp_confirmed.set(resp_confirmed);
    if !preface.is_empty() {
        *handle.hook_out.borrow_mut() = preface;
        handle.hook_touched.set(true);
    }
    worker.clients.borrow_mut().add(handle.clone());
    // The socket is listed with net, not held by the session (`net::link`).
    let stream = Rc::new(stream);
    let listed = crate::net::Listed::attach(id, stream.clone());
    let mut sess = Session::open(&worker, id, handle.clone(), session);
    let exit = conn_loop(&mut sess, &stream, &mut rbuf, &mut parser).await;
    settle_output(&sess, &stream, &exit).await;
    worker.clients.borrow_mut().remove(id);
    drop(listed);
    if let Exit::Http(request) = exit {
        crate::net::http::serve(&worker, &stream, request).await;
        sess.close();
        return;
    }
    match exit {
        Exit::Migrate(target) if !handle.killed.get() && !stream.owes_output() => {
            let info = handle.info.borrow().clone();
            let session = sess.carried();
            drop(sess);
            let std_stream = Rc::try_unwrap(stream).ok().and_then(Stream::into_std);
            match std_stream {
                Some((std_stream, ahead)) => {
                    // Bytes the loop read ahead follow the ones already in the buffer.
                    let mut rbuf = rbuf;
                    rbuf.extend_from_slice(&ahead);
                    let moving = Moving {
                        stream: std_stream,
                        rbuf,
                        parser,
                        info,
                        session,
                        preface: Vec::new(),
                        tls: None,
                        resp_confirmed: handle.resp_confirmed.get(),
                    };
                    worker
                        .shared
                        .send(target, Box::new(move |w| arrive(w, moving)));
                }
                None => {
                    worker
                        .shared
                        .connected_clients
                        .fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        _ => sess.close(),
    }
}

/// Replies still in the thread's send batch leave before the connection moves to another
/// thread (its socket goes with it) or closes, as its own writes would have: now, with
/// the rest of the batch, and what the socket did not take is then sent here. A killed
/// connection gets only what the socket takes at once.
async fn settle_output(sess: &Session, stream: &Stream, exit: &Exit) {
    let moving = matches!(exit, Exit::Migrate(_));
    if !stream.owes_output() && !moving {
        return;
    }
    // A moving connection's socket must also leave the batch's list.
    crate::net::uring::flush();
    if stream.owes_output() && !sess.handle.killed.get() {
        let _ = stream.write_all(&[]).await;
    }
}

/// Sends the replies made so far: handed to the thread's send batch when it has one (they
/// leave with every other connection's when the thread is about to sleep), else written
/// at once.
async fn flush(sess: &mut Session, stream: &Rc<Stream>) -> bool {
    let owed = stream.owes_output();
    if sess.out.buf.is_empty() && !owed {
        sess.unflushed_replies = 0;
        sess.unflushed_write = false;
        return true;
    }
    await_durable(sess).await;
    let n = sess.out.buf.len() as u64;
    if stream.queue_for_pass(&mut sess.out.buf) {
        sess.worker.shard.borrow_mut().stats.net_output_bytes += n;
        return true;
    }
    // Shown by CLIENT LIST while the socket is full.
    sess.handle
        .out_pending
        .set(sess.out.buf.len() + stream.unsent_len());
    let ok = stream.write_all(&sess.out.buf).await.is_ok();
    sess.out.buf.clear();
    sess.worker.shard.borrow_mut().stats.net_output_bytes += n;
    ok
}

async fn conn_loop(
    sess: &mut Session,
    stream: &Rc<Stream>,
    rbuf: &mut BytesMut,
    parser: &mut RequestParser,
) -> Exit {
    let limits = ParseLimits {
        max_bulk_len: sess
            .worker
            .shared
            .tunables
            .proto_max_bulk_len
            .load(Ordering::Relaxed),
    };
    // Until a connection's first line is known not to be an HTTP request line, nothing
    // is parsed as RESP (only connections starting with "G" or "H" wait for it). A
    // connection that moved here was checked where it was accepted.
    let mut first_line_checked = sess.handle.resp_confirmed.get();
    let mut sniffed = 0;
    // One vector for every group this connection parses, not one allocated per read.
    let mut cmds: Vec<Vec<Bytes>> = Vec::new();
    loop {
        // A flood of pushes (or input) must not keep the thread from its other work.
        crate::net::event_loop::cooperate().await;
        if sess.handle.hook_touched.get() && !absorb_hook_io(sess, stream, rbuf).await {
            return Exit::Closed;
        }
        if !first_line_checked {
            match crate::net::http::sniff(rbuf, sniffed) {
                crate::net::http::Sniff::Http => return Exit::Http(std::mem::take(rbuf)),
                crate::net::http::Sniff::Resp => {
                    first_line_checked = true;
                    sess.handle.resp_confirmed.set(true);
                }
                crate::net::http::Sniff::NeedMore => sniffed = rbuf.len(),
            }
        }
        // A tracking client chose this connection as its redirect target.
        if sess.push_rx.is_none() && sess.handle.adopt_rx.borrow().is_some() {
            sess.push_sender();
        }
        cmds.clear();
        let mut protocol_error = None;
        while first_line_checked && cmds.len() < MAX_GROUP {
            // Until a client authenticates, Redis parses with tight limits and runs one
            // command at a time, so AUTH takes effect for the next one.
            parser.set_auth_required(!sess.authenticated);
            if !sess.authenticated && !cmds.is_empty() {
                break;
            }
            // Whole requests leave the buffer together; the parser reads what follows.
            let room = MAX_GROUP - cmds.len();
            parser.whole_commands(rbuf, &limits, &mut cmds, room, &mut sess.spare_args);
            if cmds.len() == MAX_GROUP {
                break;
            }
            match parser.next_command(rbuf, &limits) {
                Ok(Some(args)) => cmds.push(args),
                Ok(None) => break,
                Err(e) => {
                    protocol_error = Some(e);
                    break;
                }
            }
        }
        let full = cmds.len() == MAX_GROUP || (!sess.authenticated && !cmds.is_empty());
        // Redis's defence against cross-protocol scripting: a browser tricked into posting
        // to this port sends "POST" and "Host:" lines, which end the connection at once.
        let attack = cmds.iter().position(|c| {
            c.first().is_some_and(|n| {
                n.eq_ignore_ascii_case(b"post") || n.eq_ignore_ascii_case(b"host:")
            })
        });
        if let Some(at) = attack {
            cmds.truncate(at);
            protocol_error = None;
        }
        if !cmds.is_empty() {
            let now = unix_ms();
            sess.handle.last_active.set(now);
            sess.handle.info.borrow_mut().last_interaction_unix_ms = now;
            if cmds.len() > 1 {
                prefetch_keys(sess, &cmds);
            }
            run_group(sess, cmds.drain(..)).await;
            // A deep pipeline's vector is not kept for the connection's life.
            if cmds.capacity() > 64 {
                cmds = Vec::new();
            }
        }
        if attack.is_some() {
            tracing::warn!(
                "Possible SECURITY ATTACK: a client sent a POST or Host: line, as a web page \
                 posting to this port through a browser would (cross-protocol scripting). \
                 Connection closed."
            );
            flush(sess, stream).await;
            return Exit::Closed;
        }
        if let Some(e) = protocol_error {
            sess.out.error(&e.0);
            flush(sess, stream).await;
            return Exit::Closed;
        }
        if sess.close_after_reply || sess.handle.killed.get() {
            flush(sess, stream).await;
            return Exit::Closed;
        }
        if sess.out.buf.len() >= FLUSH_AT && !drain_output(sess).await {
            return Exit::Closed;
        }
        if full {
            continue;
        }
        if !flush(sess, stream).await {
            return Exit::Closed;
        }
        if let Some(target) = migration_target(sess, stream) {
            return Exit::Migrate(target);
        }
        if rbuf.capacity() - rbuf.len() < 4096 {
            rbuf.reserve(16 * 1024);
        }
        sess.handle.memory.set(
            rbuf.capacity()
                + sess.out.buf.capacity()
                + stream.unsent_capacity()
                + stream.input_capacity()
                + sess.push_queued.get()
                + parser.held_bytes()
                + sess.spare_args.bytes(),
        );
        // (Replies just handed to the send batch leave at the end of this turn: not counted.)
        sess.handle.out_pending.set(sess.out.buf.len());
        // Nothing half-read and nothing owed: a busy script's hook may answer for us.
        sess.handle.idle_read.set(
            rbuf.is_empty() && !parser.in_progress() && !stream.is_tls() && !stream.holds_input(),
        );
        tokio::select! {
            biased;
            _ = sess.handle.wake.notified() => {
                if sess.handle.killed.get() {
                    return Exit::Closed;
                }
            }
            line = next_push(&mut sess.push_rx) => {
                if let Some(line) = line {
                    if !write_unless_killed(sess, stream, &line).await {
                        return Exit::Closed;
                    }
                    let q = sess.push_queued.get();
                    sess.push_queued.set(q.saturating_sub(line.len()));
                }
            }
            // The send batch could not send all our replies: the flush above, next
            // time round, sends the rest.
            _ = stream.stalled.notified() => {}
            r = stream.read_some(rbuf) => match r {
                Ok(0) | Err(_) => return Exit::Closed,
                Ok(n) => {
                    sess.worker.shard.borrow_mut().stats.net_input_bytes += n as u64;
                    let limit = sess.query_buffer_limit();
                    if rbuf.len() > limit {
                        closing_for_query_buffer(sess, &rbuf[..rbuf.len().min(64)]);
                        return Exit::Closed;
                    }
                }
            }
        }
        sess.handle.idle_read.set(false);
        crate::net::count_visit();
    }
}

/// Connections closed for passing `client-output-buffer-limit` (INFO's
/// client_output_buffer_limit_disconnections).
pub static OBUF_DISCONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts and logs a client about to be closed for passing `client-query-buffer-limit`,
/// wherever that is noticed (its own reads, or while a command of its waits), as Redis
/// counts and logs every such close.
pub fn closing_for_query_buffer(sess: &Session, first_bytes: &[u8]) {
    QBUF_DISCONNECTIONS.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        "Closing client that reached max query buffer length: {} (qbuf initial bytes: {:?})",
        sess.handle.line(unix_ms()),
        String::from_utf8_lossy(first_bytes)
    );
}

/// Connections closed for passing `client-query-buffer-limit`.
pub static QBUF_DISCONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Closes a connection whose unsent output passed its class's limit, as Redis does.
pub fn close_for_output_limit(handle: &ClientHandle, class: &str) {
    if handle.killed.get() {
        return;
    }
    OBUF_DISCONNECTIONS.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        "Client {} scheduled to be closed ASAP for overcoming of output buffer limits ({class}).",
        handle.line(unix_ms())
    );
    handle.kill();
}

/// Writes pushed output, giving up when the connection is killed meanwhile (a subscriber
/// past its output limit that does not read).
async fn write_unless_killed(sess: &Session, stream: &Stream, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        match stream.try_write(data) {
            Ok(0) => return false,
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::select! {
                    biased;
                    _ = sess.handle.wake.notified() => {
                        // Any other wake-up leaves its mark elsewhere (`hook_touched`).
                        if sess.handle.killed.get() {
                            return false;
                        }
                    }
                    r = stream.writable() => {
                        if r.is_err() {
                            return false;
                        }
                    }
                }
            }
            Err(_) => return false,
        }
    }
    true
}

/// Writes replies out mid-pipeline. Under a `client-output-buffer-limit normal`, a
/// client that does not read is not waited for: what the socket takes goes, the rest
/// stays, more commands run, and the connection is closed once its unsent replies pass
/// the limit (as in Redis). Without a limit, the connection waits for the socket, which
/// holds its memory to one pipeline's worth.
pub(crate) async fn drain_output(sess: &mut Session) -> bool {
    // Called from inside the connection loop, whose socket is always listed.
    let Some(stream) = crate::net::link(sess.id) else {
        sess.out.buf.clear();
        return true;
    };
    let t = &sess.worker.shared.tunables.obuf_normal;
    let limit = crate::pubsub::OutputLimit {
        hard: t[0].load(Ordering::Relaxed),
        soft: t[1].load(Ordering::Relaxed),
        soft_secs: t[2].load(Ordering::Relaxed),
    };
    if (limit.hard == 0 && limit.soft == 0)
        || sess.handle.info.borrow().kind != crate::shard::clients::KIND_NORMAL
    {
        return flush(sess, &stream).await;
    }
    await_durable(sess).await;
    let mut written = 0;
    while written < sess.out.buf.len() {
        match stream.try_write(&sess.out.buf[written..]) {
            Ok(0) => return false,
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(_) => return false,
        }
    }
    let _ = sess.out.buf.split_to(written);
    sess.worker.shard.borrow_mut().stats.net_output_bytes += written as u64;
    if limit.exceeded(sess.out.buf.len() as u64, &sess.obuf_soft_since, unix_ms()) {
        sess.out.buf.clear();
        close_for_output_limit(&sess.handle, "normal");
        return false;
    }
    true
}

/// Picks up what a busy script's hook left on this connection: replies it could not
/// send go out first, then the unfinished request it read joins the input.
async fn absorb_hook_io(sess: &mut Session, stream: &Stream, rbuf: &mut BytesMut) -> bool {
    sess.handle.hook_touched.set(false);
    let out = std::mem::take(&mut *sess.handle.hook_out.borrow_mut());
    if !out.is_empty() && stream.write_all(&out).await.is_err() {
        return false;
    }
    let input = std::mem::take(&mut *sess.handle.hook_in.borrow_mut());
    rbuf.extend_from_slice(&input);
    true
}

async fn next_push(rx: &mut Option<tokio::sync::mpsc::UnboundedReceiver<Bytes>>) -> Option<Bytes> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn migration_target(sess: &Session, stream: &Stream) -> Option<usize> {
    let (shard, count) = sess.affinity;
    // A TLS session stays on the thread that holds it.
    if stream.is_tls() {
        return None;
    }
    if shard == sess.worker.id
        || count < MIGRATE_AFTER
        || sess.multi.is_some()
        || sess.watching.is_some()
        || sess.push_rx.is_some()
        || !sess
            .worker
            .shared
            .tunables
            .migrate_connections
            .load(Ordering::Relaxed)
    {
        return None;
    }
    Some(shard)
}
