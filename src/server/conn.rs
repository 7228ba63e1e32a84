//! One client connection: read, parse, run (squashing pipelined runs bound for one other
//! shard into one message), write; and migration to the thread its keys live on.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};

use crate::commands::{self, flags, route, table, Command, Handler, Route};
use crate::net::stream_io;
use crate::net::Stream;
use crate::protocol::parse::{ParseLimits, RequestParser};
use crate::protocol::reply::Reply;
use crate::server::session::{ReplyMode, Session};
use crate::shard::clients::{ClientHandle, ClientInfo};
use crate::shard::{run_batch_on, unix_ms, BatchSpec, Worker};

/// Commands parsed from the input before they are run as a group.
const MAX_GROUP: usize = 1024;
/// Output is written out once it grows past this, even mid-pipeline.
const FLUSH_AT: usize = 64 * 1024;
/// Consecutive commands bound for one other shard before the connection moves there.
const MIGRATE_AFTER: u32 = 8;

/// A connection on its way to another thread.
pub struct Moving {
    stream: std::net::TcpStream,
    rbuf: BytesMut,
    parser: RequestParser,
    info: ClientInfo,
    db: usize,
    resp3: bool,
    authenticated: bool,
    user: std::sync::Arc<crate::acl::User>,
    acl_version: u64,
    no_touch: bool,
    reply_mode: ReplyMode,
    /// Cluster mode's READONLY and ASKING travel with the connection.
    readonly: bool,
    asking: bool,
    /// Replies already owed before anything else is sent (`scripting::busy`).
    preface: Vec<u8>,
    /// The TLS session of a connection accepted on `tls-port`, not yet started.
    tls: Option<rustls::ServerConnection>,
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
        db: 0,
        resp3: false,
        acl_version: shared.acl.version(),
        authenticated: shared.acl.default_open(),
        user: shared.acl.default_user(),
        no_touch: false,
        reply_mode: ReplyMode::On,
        readonly: false,
        asking: false,
        preface: output,
        tls,
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
        db,
        resp3,
        authenticated,
        user,
        acl_version,
        no_touch,
        reply_mode,
        readonly,
        asking,
        preface,
        tls,
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
    info.db = db;
    let id = info.id;
    info.user = user.name.as_str().into();
    let handle = ClientHandle::new(info);
    if !preface.is_empty() {
        *handle.hook_out.borrow_mut() = preface;
        handle.hook_touched.set(true);
    }
    worker.clients.borrow_mut().add(handle.clone());
    // The socket is listed with net, not held by the session (`net::link`).
    let stream = Rc::new(stream);
    let listed = crate::net::Listed::attach(id, stream.clone());
    let mut sess = Session {
        worker: worker.clone(),
        id,
        db,
        out: Reply::with_buf(BytesMut::with_capacity(16 * 1024), resp3),
        authenticated,
        user,
        acl_version,
        no_touch,
        multi: None,
        watching: None,
        in_exec: false,
        reply_mode,
        close_after_reply: false,
        handle: handle.clone(),
        affinity: (worker.id, 0),
        route_hint: None,
        push_rx: None,
        push_tx: None,
        push_queued: Default::default(),
        obuf_soft_since: Default::default(),
        monitoring: false,
        channels: Default::default(),
        shard_channels: Default::default(),
        patterns: Default::default(),
        flushed_mid_command: 0,
        aof_pending: Vec::new(),
        unflushed_replies: 0,
        unflushed_write: false,
        replaying: false,
        replconf: None,
        wrote_since_wait: false,
        write_offset: 0,
        tracking: false,
        caching: false,
        forced: Vec::new(),
        blocked_us: 0,
        last_block: None,
        asking,
        readonly,
    };
    let exit = conn_loop(&mut sess, &stream, &mut rbuf, &mut parser).await;
    settle_output(&sess, &stream, &exit).await;
    worker.clients.borrow_mut().remove(id);
    drop(listed);
    if let Exit::Http(request) = exit {
        crate::net::http::serve(&worker, &stream, request).await;
        close(&mut sess);
        return;
    }
    match exit {
        Exit::Migrate(target) if !handle.killed.get() && !stream.owes_output() => {
            let info = handle.info.borrow().clone();
            let (db, resp3, authenticated, no_touch, reply_mode) = (
                sess.db,
                sess.out.resp3,
                sess.authenticated,
                sess.no_touch,
                sess.reply_mode,
            );
            let (user, acl_version) = (sess.user.clone(), sess.acl_version);
            let (readonly, asking) = (sess.readonly, sess.asking);
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
                        db,
                        resp3,
                        authenticated,
                        user,
                        acl_version,
                        no_touch,
                        reply_mode,
                        readonly,
                        asking,
                        preface: Vec::new(),
                        tls: None,
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
        _ => close(&mut sess),
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

fn close(sess: &mut Session) {
    commands::transactions::unwatch_all(sess);
    commands::connection::disable_tracking(sess);
    commands::connection::stop_monitor(sess);
    commands::pubsub::unsubscribe_all(sess);
    sess.worker
        .shared
        .connected_clients
        .fetch_sub(1, Ordering::AcqRel);
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

/// Whether a command may change the dataset, so that its reply waits for the AOF.
fn may_write(cmd: &Command) -> bool {
    cmd.has(flags::WRITE) || matches!(cmd.name, "exec" | "eval" | "evalsha" | "fcall" | "function")
}

/// The write barrier of `appendfsync always`: replies to a group of commands that may have
/// written wait until the AOF's fsync covers every effect logged before this call, theirs
/// among them. If the AOF cannot make them durable, the group's replies become errors:
/// nothing is acknowledged that was not stored. Replies to reads alone do not wait (Redis
/// holds them too, since it answers everything after the pass's fsync): a read may see a
/// write whose fsync is under way, as a client of Redis with `everysec` may.
pub async fn await_durable(sess: &mut Session) {
    let replies = std::mem::take(&mut sess.unflushed_replies);
    let wrote = std::mem::take(&mut sess.unflushed_write);
    let aof = &sess.worker.shared.persist.aof;
    if !wrote || !aof.file_on() || !aof.always() {
        return;
    }
    if crate::persist::aof::barrier(aof).await {
        return;
    }
    let msg = aof.error_reply();
    sess.out.buf.clear();
    for _ in 0..replies.max(1) {
        sess.out.error(&msg);
    }
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
    // is parsed as RESP (only connections starting with "G" or "H" wait for it).
    let mut first_line_checked = false;
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
                + parser.held_bytes(),
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
async fn drain_output(sess: &mut Session) -> bool {
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

/// The one shard a plain keyed command runs on, when none of `execute`'s checks could
/// refuse it or change what it does. Such a command skips `execute` (and its chain of
/// futures): bound for another shard it is batched with its neighbours, and on this
/// thread's shard it runs inline (`commands::run_here_if_free`).
fn plain_target(
    sess: &Session,
    cmd: Option<&'static Command>,
    args: &[Bytes],
    memo: &mut Option<Route>,
) -> Option<usize> {
    let cmd = cmd?;
    let shared = &sess.worker.shared;
    if sess.multi.is_some()
        || sess.tracking
        || sess.reply_mode != ReplyMode::On
        || !sess.authenticated
        // A RESP2 subscriber may run only (un)subscribe, PING, QUIT and RESET.
        || (!sess.out.resp3 && sess.subscriptions() > 0)
        // A restricted user's commands go through `execute`, which checks them.
        || !sess.user.unrestricted
        || sess.acl_version != shared.acl.version()
        // A busy script's shard answers BUSY, which `execute` decides.
        || shared.busy_count.load(Ordering::Relaxed) > 0
        || shared.monitors.load(Ordering::Relaxed) > 0
        // `execute` evicts first, or refuses what may grow memory.
        || shared.over_maxmemory()
        || !cmd.arity_ok(args.len())
        || cmd.has(flags::BLOCKING)
        || cmd.block.is_some()
        || !cmd.subcommands.is_empty()
        || !matches!(cmd.handler, Handler::Shard(_) | Handler::Multi(..))
        || !squash_allowed_by_gate(sess, cmd)
        // In cluster mode only what the slot check serves at once skips `execute`.
        || shared.cluster.as_deref().is_some_and(|c| {
            !matches!(
                crate::cluster::redirect::check(c, sess, cmd, args),
                crate::cluster::redirect::Check::Serve
            )
        })
    {
        return None;
    }
    match *memo.get_or_insert_with(|| route(sess, cmd, args)) {
        Route::Shard(s) => Some(s),
        _ => None,
    }
}

/// A squashed batch skips `execute`'s checks, so it is only formed when none could refuse
/// the command: no gate at all, or only replication's (a replica, min-replicas-to-write)
/// for a read while stale data may be served.
fn squash_allowed_by_gate(sess: &Session, cmd: &Command) -> bool {
    let gate = sess.worker.shared.persist.gate();
    if gate == 0 {
        return true;
    }
    gate == crate::persist::GATE_REPL
        && !cmd.has(flags::WRITE)
        && !crate::repl::stale_refused(&sess.worker.shared)
}

pub fn note_affinity(sess: &mut Session, shard: usize, n: u32) {
    if sess.affinity.0 == shard {
        sess.affinity.1 = sess.affinity.1.saturating_add(n);
    } else {
        sess.affinity = (shard, n);
    }
}

/// Longest argument taken for a key by `prefetch_keys`: hashing a long argument that is
/// not a key (a script's body, a value) would cost more than the miss it might save.
const PREFETCH_KEY_MAX: usize = 128;

/// Starts loading the table buckets of a pipelined group's keys before the group runs, so
/// that their cache misses overlap instead of coming one after another, command by command
/// (at depth 16 they were a fifth of the server's CPU: BENCHMARKS.md, "Prefetching a
/// pipelined group's keys"). The first argument after the name stands for the key without
/// looking the command up: for most keyed commands it is the key, and where it is not, the
/// prefetch is only wasted. It stops at the first such argument that maps to another
/// thread's shard (or whose round-robin tag has no shard yet: looking places nothing,
/// `Placement::shard_if_placed`): the group waits there for that shard's replies, and while
/// it waits other connections run and evict what was loaded (measured: with that run ahead
/// too, SET at depth 16 on two threads cost 11% more instead of less).
fn prefetch_keys(sess: &Session, cmds: &[Vec<Bytes>]) {
    let Ok(shard) = sess.worker.shard.try_borrow() else {
        return;
    };
    let Some(db) = shard.dbs.get(sess.db) else {
        return;
    };
    let placement = &sess.worker.shared.placement;
    for c in cmds {
        if let Some(key) = c.get(1).filter(|k| k.len() <= PREFETCH_KEY_MAX) {
            if placement.shard_if_placed(key) != Some(sess.worker.id) {
                return;
            }
            db.table.prefetch(key);
        }
    }
}

/// Runs a group of parsed commands in order.
async fn run_group(sess: &mut Session, cmds: impl Iterator<Item = Vec<Bytes>>) {
    let mut iter = cmds.peekable();
    // A command looked at (and maybe routed) while a batch was being formed, so it is
    // not looked up and its keys not hashed a second time.
    let mut carried: Option<(Option<&'static Command>, Option<Route>)> = None;
    while let Some(args) = iter.next() {
        if sess.handle.killed.get() {
            return;
        }
        crate::commands::connection::wait_if_paused(sess, &args).await;
        let (cmd, mut memo) = carried
            .take()
            .unwrap_or_else(|| (table().lookup(&args[0]), None));
        sess.unflushed_replies += 1;
        if cmd.is_some_and(may_write) {
            sess.unflushed_write = true;
            sess.wrote_since_wait = true;
        }
        let plain = plain_target(sess, cmd, &args, &mut memo);
        if plain == Some(sess.worker.id) {
            let c = cmd.expect("plain commands are known");
            let f = c.exec_fn().expect("plain commands run on a shard");
            if let Some(moves) = commands::run_here_if_free(sess, c, f, &args) {
                sess.note_command(c, &args);
                note_affinity(sess, sess.worker.id, 1);
                sess.asking = false;
                if !moves.is_empty() {
                    crate::shard::settle(moves).await;
                }
                if sess.out.buf.len() >= FLUSH_AT && !drain_output(sess).await {
                    sess.handle.kill();
                    return;
                }
                continue;
            }
        }
        if let Some(target) = plain.filter(|&t| t != sess.worker.id) {
            let cmd = cmd.expect("squashable commands are known");
            let mut batch = crate::shard::hops::cmds();
            sess.note_command(cmd, &args);
            sess.asking = false;
            batch.push_back((cmd, args));
            while let Some(next) = iter.peek() {
                let next_cmd = table().lookup(&next[0]);
                let mut next_memo = None;
                if plain_target(sess, next_cmd, next, &mut next_memo) != Some(target) {
                    carried = Some((next_cmd, next_memo));
                    break;
                }
                let args = iter.next().expect("peeked");
                let c = next_cmd.expect("squashable commands are known");
                sess.unflushed_replies += 1;
                if may_write(c) {
                    sess.unflushed_write = true;
                    sess.wrote_since_wait = true;
                }
                sess.note_command(c, &args);
                batch.push_back((c, args));
            }
            let n = batch.len();
            {
                let mut shard = sess.worker.shard.borrow_mut();
                shard.stats.one_hop += n as u64;
                if n > 1 {
                    shard.stats.squashed_batches += 1;
                    shard.stats.squashed_commands += n as u64;
                }
            }
            note_affinity(sess, target, n as u32);
            let worker = sess.worker.clone();
            let spec = BatchSpec {
                db: sess.db,
                resp3: sess.out.resp3,
                client_id: sess.id,
                no_touch: sess.no_touch,
                atomic: None,
                reader: None,
            };
            let mut batch = batch;
            loop {
                let spec = BatchSpec {
                    db: spec.db,
                    resp3: spec.resp3,
                    client_id: spec.client_id,
                    no_touch: spec.no_touch,
                    atomic: None,
                    reader: None,
                };
                let mut result = run_batch_on(&worker, target, batch, spec).await;
                crate::shard::settle(std::mem::take(&mut result.settle)).await;
                sess.out.buf.extend_from_slice(&result.out.buf);
                if sess.out.buf.len() >= FLUSH_AT && !drain_output(sess).await {
                    sess.handle.kill();
                    return;
                }
                if result.rest.is_empty() {
                    crate::shard::hops::recycle(result.out.buf, result.rest);
                    break;
                }
                batch = result.rest;
            }
            continue;
        }
        if let Some(c) = cmd {
            if c.exec_fn().is_some() && c.arity_ok(args.len()) && sess.multi.is_none() {
                let r = *memo.get_or_insert_with(|| route(sess, c, &args));
                if let Route::Shard(s) = r {
                    note_affinity(sess, s, 1);
                }
                sess.route_hint = Some((c, r));
            }
        }
        let mode = sess.reply_mode;
        sess.flushed_mid_command = 0;
        let mark = sess.out.buf.len();
        commands::execute(sess, cmd, args).await;
        sess.route_hint = None;
        // ASKING covers the next command, or the whole next transaction.
        if sess.asking && sess.multi.is_none() && cmd.is_none_or(|c| c.name != "asking") {
            sess.asking = false;
        }
        // CLIENT CACHING covers the next command, or the whole next transaction.
        if sess.caching && sess.multi.is_none() && cmd.is_none_or(|c| c.name != "client") {
            sess.caching = false;
        }
        let mark = mark.saturating_sub(sess.flushed_mid_command);
        match mode {
            // CLIENT REPLY ON answers even though replies were off when it arrived.
            ReplyMode::Off if sess.reply_mode != ReplyMode::On => sess.out.buf.truncate(mark),
            ReplyMode::Skipping => {
                sess.out.buf.truncate(mark);
                if sess.reply_mode == ReplyMode::Skipping {
                    sess.reply_mode = ReplyMode::On;
                }
            }
            _ => {}
        }
        if !sess.forced.is_empty() {
            let forced = std::mem::take(&mut sess.forced);
            sess.out.buf.extend_from_slice(&forced);
        }
        if sess.reply_mode == ReplyMode::SkipNext {
            sess.reply_mode = ReplyMode::Skipping;
        }
        // A long pipeline of large replies does not pile up in memory.
        if sess.out.buf.len() >= FLUSH_AT && sess.multi.is_none() && !drain_output(sess).await {
            sess.handle.kill();
            return;
        }
    }
}
