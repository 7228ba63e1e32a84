//! The master's side: a connection that sends PSYNC or SYNC becomes a replica's feed.
//! It gets a partial resync from the backlog when its offset allows, else a snapshot
//! (from disk or diskless) followed by the stream from the snapshot's cut. Also WAIT,
//! which counts the replicas whose ACKs reached the caller's offset.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use super::stream::{Attached, Feed, ReplMsg};
use super::{ReplicaEntry, REPLICA_ONLINE, REPLICA_SEND_BULK, REPLICA_WAIT_BGSAVE};
use crate::net::stream_io;
use crate::persist::aof::writer::ToWriter;
use crate::persist::snapshot::{self, Target};
use crate::protocol::parse::{ParseLimits, RequestParser};
use crate::server::session::Session;
use crate::shard::{unix_ms, Worker};

/// What a replica said with REPLCONF before PSYNC.
#[derive(Default, Clone)]
pub struct ReplConf {
    pub listening_port: u16,
    pub ip: Option<String>,
    pub capa_eof: bool,
    pub capa_psync2: bool,
}

fn send(worker: &Worker, m: ReplMsg) {
    worker.shared.persist.aof.send(ToWriter::Repl(m));
}

/// A message a client waits on (WAIT's offset and GETACK).
fn send_urgent(worker: &Worker, m: ReplMsg) {
    worker.shared.persist.aof.send_urgent(ToWriter::Repl(m));
}

/// Serves a replica on this connection until it goes. `psync`: the id and offset it
/// asked for (None for the old SYNC).
pub async fn serve_replica(sess: &mut Session, psync: Option<(String, u64)>) {
    let worker = sess.worker.clone();
    let shared = worker.shared.clone();
    if shared.repl.is_replica() && !shared.repl.link_up() {
        return sess.error("NOMASTERLINK Can't SYNC while not connected with my master");
    }
    // Replies written so far (pipelined before PSYNC) go out first.
    if !sess.out.buf.is_empty() {
        let out = std::mem::take(&mut sess.out.buf);
        if stream_io::write_all(crate::net::link(sess.id).as_deref(), &out)
            .await
            .is_err()
        {
            sess.close_after_reply = true;
            return;
        }
    }
    sess.close_after_reply = true;
    let conf = sess.replconf.as_deref().cloned().unwrap_or_default();
    let addr = sess.handle.info.borrow().addr.clone();
    let ip = conf.ip.clone().unwrap_or_else(|| {
        addr.rsplit_once(':').map_or(addr.clone(), |(h, _)| {
            h.trim_matches(['[', ']']).to_string()
        })
    });
    let entry = Arc::new(ReplicaEntry {
        client_id: sess.id,
        ip,
        port: (conf.listening_port as u64).into(),
        state: REPLICA_WAIT_BGSAVE.into(),
        ack_offset: 0.into(),
        fack_offset: 0.into(),
        last_ack_ms: unix_ms().into(),
    });
    sess.handle.info.borrow_mut().kind = crate::shard::clients::KIND_REPLICA;
    // INFO's connected_clients leaves replicas out, as Redis's does.
    shared.connected_clients.fetch_sub(1, Ordering::AcqRel);
    shared
        .repl
        .replicas
        .lock()
        .expect("replicas lock")
        .push(entry.clone());
    let (feed, end) = Feed::new(entry.clone());
    let fed = match attach(sess, &worker, &conf, psync, feed).await {
        Ok(wait_ack) => {
            entry.state.store(REPLICA_ONLINE, Ordering::Relaxed);
            entry.last_ack_ms.store(unix_ms(), Ordering::Relaxed);
            tracing::info!(
                "Synchronization with replica {}:{} succeeded",
                entry.ip,
                entry.port.load(Ordering::Relaxed)
            );
            feed_loop(sess, &entry, end, wait_ack).await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = fed {
        tracing::info!(
            "Connection with replica {}:{} lost: {e}",
            entry.ip,
            entry.port.load(Ordering::Relaxed)
        );
    }
    shared.connected_clients.fetch_add(1, Ordering::AcqRel);
    send(&worker, ReplMsg::Detach(sess.id));
    shared
        .repl
        .replicas
        .lock()
        .expect("replicas lock")
        .retain(|r| r.client_id != sess.id);
}

/// Continues from the backlog, or sends a snapshot; the stream after it is queued in
/// the feed. True when the stream must wait for the replica's first ACK: after a
/// diskless payload, so the replica can tell the end mark from what follows, as Redis's
/// masters do.
async fn attach(
    sess: &mut Session,
    worker: &Rc<Worker>,
    conf: &ReplConf,
    psync: Option<(String, u64)>,
    feed: Feed,
) -> Result<bool, String> {
    let shared = worker.shared.clone();
    let stream = crate::net::link(sess.id);
    let stream = stream.as_deref();
    let mut feed = Some(feed);
    if let Some((replid, from)) = &psync {
        if replid != "?" {
            let (reply, answer) = oneshot::channel();
            send(
                worker,
                ReplMsg::Continue {
                    replid: replid.clone(),
                    from: *from,
                    feed: feed.take().expect("feed"),
                    reply,
                },
            );
            match answer.await.map_err(|_| "the writer stopped")? {
                Ok(id) => {
                    shared.repl.sync_partial_ok.fetch_add(1, Ordering::Relaxed);
                    let line = if conf.capa_psync2 {
                        format!("+CONTINUE {id}\r\n")
                    } else {
                        "+CONTINUE\r\n".to_string()
                    };
                    write_timed(stream, line.as_bytes(), Duration::from_secs(60)).await?;
                    tracing::info!("Partial resynchronization request from replica accepted, continuing from offset {from}");
                    return Ok(false);
                }
                Err(back) => {
                    shared.repl.sync_partial_err.fetch_add(1, Ordering::Relaxed);
                    feed = Some(back);
                }
            }
        }
    }
    let feed = feed.expect("feed");
    full_sync(sess, worker, conf, psync.is_some(), feed).await
}

/// A full resync: a snapshot at a cut where the replica joins the stream.
async fn full_sync(
    sess: &mut Session,
    worker: &Rc<Worker>,
    conf: &ReplConf,
    psync: bool,
    feed: Feed,
) -> Result<bool, String> {
    let shared = worker.shared.clone();
    shared.repl.sync_full.fetch_add(1, Ordering::Relaxed);
    let (diskless, delay) = {
        let c = shared.config.lock().expect("config lock");
        (
            c.get_bool("repl-diskless-sync") && conf.capa_eof,
            c.get_i64("repl-diskless-sync-delay").max(0) as u64,
        )
    };
    let stream = crate::net::link(sess.id);
    let stream = stream.as_deref();
    let limit = super::timeout(&shared);
    if diskless && delay > 0 {
        crate::net::event_loop::time::sleep(Duration::from_secs(delay)).await;
    }
    // One snapshot at a time: wait for a running BGSAVE or rewrite to end.
    while snapshot::claim(worker).is_err() {
        crate::net::event_loop::time::sleep(Duration::from_millis(10)).await;
        if sess.handle.killed.get() {
            return Err("killed while waiting to sync".into());
        }
    }
    // From here on every write is captured for the stream.
    shared.persist.aof.repl.store(true, Ordering::Release);
    let entry = feed.entry.clone();
    let attached: Rc<std::cell::RefCell<Option<Attached>>> = Default::default();
    let at_cut: snapshot::AtCut = {
        let attached = attached.clone();
        Box::new(move |w: &Rc<Worker>| {
            let (reply, answer) = std::sync::mpsc::channel();
            send(w, ReplMsg::Attach { feed, reply });
            // The writer answers within a pass of its loop; the shards stay locked
            // meanwhile so the cut and the offset name the same point.
            let Ok(a) = answer.recv_timeout(Duration::from_secs(10)) else {
                return Vec::new();
            };
            let aux = vec![
                (
                    "repl-stream-db".to_string(),
                    a.stream_db.to_string().into_bytes(),
                ),
                ("repl-id".to_string(), a.replid.clone().into_bytes()),
                ("repl-offset".to_string(), a.offset.to_string().into_bytes()),
            ];
            *attached.borrow_mut() = Some(a);
            aux
        })
    };
    let (target, chunks, path) = if diskless {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
        (Target::Channel(tx), Some(rx), None)
    } else {
        let dir = shared
            .config
            .lock()
            .expect("config lock")
            .get("dir")
            .to_string();
        let path = std::path::Path::new(&dir).join(format!(
            "temp-repl-{}-{}.rdb",
            std::process::id(),
            sess.id
        ));
        (Target::File(path.clone()), None, Some(path))
    };
    let gate = if shared.repl.is_replica() {
        Some(shared.repl.apply_gate.lock().await)
    } else {
        None
    };
    let cut = snapshot::cut(worker, target, Some(at_cut)).await;
    drop(gate);
    let cut = cut?;
    let mut claim = Claim {
        worker: worker.clone(),
        written: Some(cut.written),
        temp: path.clone(),
    };
    let Some(a) = attached.borrow_mut().take() else {
        return Err("the stream did not attach the replica".into());
    };
    entry.state.store(REPLICA_SEND_BULK, Ordering::Relaxed);
    tracing::info!(
        "Starting BGSAVE for SYNC with target: {}",
        if diskless { "replicas sockets" } else { "disk" }
    );
    if psync {
        let line = format!("+FULLRESYNC {} {}\r\n", a.replid, a.offset);
        write_timed(stream, line.as_bytes(), limit).await?;
    }
    if let Some(mut rx) = chunks {
        let mut mark = [0u8; 20];
        super::fill_random(&mut mark);
        let mark: String = mark.iter().map(|b| format!("{b:02x}")).collect();
        write_timed(stream, format!("$EOF:{mark}\r\n").as_bytes(), limit).await?;
        while let Some(chunk) = rx.recv().await {
            write_timed(stream, &chunk, limit).await?;
        }
        claim.written().await?;
        write_timed(stream, mark.as_bytes(), limit).await?;
    } else {
        let len = claim.written().await?;
        let path = path.expect("disk sync has a path");
        send_file(stream, &path, len, limit).await?;
    }
    Ok(diskless)
}

/// A full sync's hold on the snapshot: the one-snapshot-at-a-time claim and the file.
/// However the sync ends, the claim is given back only once the snapshot itself has
/// finished (its shards stop serializing), so no other snapshot starts over it.
struct Claim {
    worker: Rc<Worker>,
    written: Option<oneshot::Receiver<std::io::Result<u64>>>,
    temp: Option<std::path::PathBuf>,
}

impl Claim {
    /// Waits for the snapshot to be complete: its size.
    async fn written(&mut self) -> Result<u64, String> {
        let w = self.written.take().expect("waited for once");
        w.await
            .map_err(|_| "the snapshot writer stopped".to_string())?
            .map_err(|e| format!("the snapshot failed: {e}"))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let worker = self.worker.clone();
        let temp = self.temp.take();
        let release = move || {
            if let Some(t) = temp {
                let _ = std::fs::remove_file(t);
            }
            worker
                .shared
                .persist
                .bgsave_in_progress
                .store(false, Ordering::Release);
        };
        match self.written.take() {
            None => release(),
            Some(w) => {
                crate::net::event_loop::spawn_local(async move {
                    let _ = w.await;
                    release();
                });
            }
        }
    }
}

/// Writes to a replica during its full sync: a replica that takes no bytes for
/// `repl-timeout` (60 s by default) is given up, so a stuck one cannot hold the snapshot
/// (and the one-snapshot-at-a-time claim) for ever.
async fn write_timed(
    stream: Option<&crate::net::Stream>,
    data: &[u8],
    limit: Duration,
) -> Result<(), String> {
    match crate::net::event_loop::time::timeout(limit, stream_io::write_all(stream, data)).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("timeout writing the RDB to the replica (repl-timeout)".into()),
    }
}

/// Sends the snapshot file (`len` bytes) framed as `$<len>`.
async fn send_file(
    stream: Option<&crate::net::Stream>,
    path: &std::path::Path,
    len: u64,
    limit: Duration,
) -> Result<(), String> {
    use std::io::Read;
    write_timed(stream, format!("${len}\r\n").as_bytes(), limit).await?;
    // Reads of a file just written come from the page cache: plain reads, in chunks.
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        let n = f.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        write_timed(stream, &buf[..n], limit).await?;
    }
    Ok(())
}

/// Sends the queued stream and reads the replica's ACKs until the link ends.
async fn feed_loop(
    sess: &mut Session,
    entry: &ReplicaEntry,
    end: super::stream::FeedEnd,
    mut wait_ack: bool,
) -> Result<(), String> {
    let super::stream::FeedEnd {
        mut rx,
        queued,
        dropped,
    } = end;
    let stream = crate::net::link(sess.id);
    let stream = stream.as_deref();
    let handle = sess.handle.clone();
    let mut rbuf = BytesMut::with_capacity(4096);
    let mut parser = RequestParser::default();
    let limits = ParseLimits {
        max_bulk_len: 1 << 20,
    };
    let timeout_ms = super::timeout(&sess.worker.shared).as_millis() as u64;
    let mut tick = crate::net::event_loop::time::interval(Duration::from_secs(1));
    loop {
        crate::net::event_loop::cooperate().await;
        tokio::select! {
            _ = handle.wake.notified() => {
                if handle.killed.get() {
                    return Err("killed".into());
                }
            }
            _ = tick.tick() => {
                // A replica that stopped acknowledging is gone, as Redis judges it.
                if unix_ms().saturating_sub(entry.last_ack_ms.load(Ordering::Relaxed)) > timeout_ms {
                    return Err("timeout: no ACK within repl-timeout".into());
                }
            }
            chunk = rx.recv(), if !wait_ack => {
                let Some(chunk) = chunk else {
                    return Err("dropped by the stream (output buffer limit, or a new history)".into());
                };
                // Take what else is queued, for one write.
                let mut out = chunk.to_vec();
                while let Ok(more) = rx.try_recv() {
                    out.extend_from_slice(&more);
                }
                // A replica that stops reading must not hold this task for ever: the
                // stream's verdict (output buffer limit) and CLIENT KILL end the write.
                let write = stream_io::write_all(stream, &out);
                tokio::pin!(write);
                let mut check = crate::net::event_loop::time::interval(Duration::from_millis(100));
                loop {
                    tokio::select! {
                        r = &mut write => {
                            r.map_err(|e| e.to_string())?;
                            break;
                        }
                        _ = check.tick() => {
                            if dropped.load(Ordering::Acquire) {
                                return Err("dropped: past client-output-buffer-limit replica".into());
                            }
                            if handle.killed.get() {
                                return Err("killed".into());
                            }
                        }
                    }
                }
                queued.fetch_sub(out.len() as u64, Ordering::Relaxed);
            }
            r = stream_io::read_some(stream, &mut rbuf) => {
                match r {
                    Ok(0) => return Err("the replica closed the connection".into()),
                    Err(e) => return Err(e.to_string()),
                    // Any bytes (a loading replica's newlines among them) show it alive.
                    Ok(_) => entry.last_ack_ms.store(unix_ms(), Ordering::Relaxed),
                }
                while let Ok(Some(args)) = parser.next_command(&mut rbuf, &limits) {
                    if on_replica_command(entry, &args) {
                        wait_ack = false;
                        sess.worker.shared.repl.acked.notify_waiters();
                    }
                }
            }
        }
    }
}

/// Reads what a replica sends on its link; true for an ACK.
fn on_replica_command(entry: &ReplicaEntry, args: &[Bytes]) -> bool {
    if args.len() >= 3
        && args[0].eq_ignore_ascii_case(b"replconf")
        && args[1].eq_ignore_ascii_case(b"ack")
    {
        let num = |b: &Bytes| std::str::from_utf8(b).ok()?.parse::<u64>().ok();
        if let Some(off) = num(&args[2]) {
            entry.ack_offset.fetch_max(off, Ordering::Relaxed);
            entry.last_ack_ms.store(unix_ms(), Ordering::Relaxed);
        }
        if args.len() >= 5 && args[3].eq_ignore_ascii_case(b"fack") {
            if let Some(off) = num(&args[4]) {
                entry.fack_offset.fetch_max(off, Ordering::Relaxed);
            }
        }
        return true;
    }
    false
}

/// PUBLISH on a master: the message goes to the replicas in the stream, not to the AOF.
pub fn propagate_publish(worker: &Worker, args: &[Bytes]) {
    let shared = &worker.shared;
    if !shared.persist.aof.repl.load(Ordering::Relaxed) || shared.repl.is_replica() {
        return;
    }
    let mut bytes = Vec::new();
    crate::persist::aof::effects::encode(&mut bytes, args);
    send(worker, ReplMsg::Publish(bytes));
}

/// The stream's offset once everything this thread handed over is in it.
pub async fn current_offset(worker: &Worker) -> u64 {
    let (reply, answer) = oneshot::channel();
    send_urgent(worker, ReplMsg::Offset(reply));
    answer.await.unwrap_or(0)
}

/// WAITAOF: whether this server's AOF holds the caller's writes on disk (when `local`),
/// and how many replicas said (FACK) theirs do.
pub async fn waitaof(sess: &mut Session, local: bool, want: i64, timeout_ms: u64) -> (bool, i64) {
    let shared = sess.worker.shared.clone();
    let mut local_ok = false;
    if local {
        let (done, wait) = oneshot::channel();
        shared.persist.aof.send(ToWriter::Sync { done });
        local_ok = matches!(wait.await, Ok(Ok(())));
    }
    if want <= 0 {
        return (local_ok, 0);
    }
    let n = wait_for_acks(sess, want, timeout_ms, |r| {
        r.fack_offset.load(Ordering::Relaxed)
    })
    .await;
    (local_ok, n)
}

/// WAIT numreplicas timeout: how many replicas acknowledged the stream up to the
/// caller's writes. `timeout_ms` 0 waits for ever (while the client stays).
pub async fn wait(sess: &mut Session, want: i64, timeout_ms: u64) -> i64 {
    wait_for_acks(sess, want, timeout_ms, |r| {
        r.ack_offset.load(Ordering::Relaxed)
    })
    .await
}

/// Counts the online replicas whose acknowledged offset (`acked`: ACK or FACK) covers
/// this connection's writes, waiting until `want` do or the time is up.
async fn wait_for_acks(
    sess: &mut Session,
    want: i64,
    timeout_ms: u64,
    acked: fn(&ReplicaEntry) -> u64,
) -> i64 {
    let worker = sess.worker.clone();
    let shared = &worker.shared;
    if !shared.persist.aof.repl.load(Ordering::Acquire) {
        return 0;
    }
    // The offset that covers this connection's writes: taken now if it wrote since the
    // last WAIT (everything it wrote is handed over before its replies), else kept.
    if sess.wrote_since_wait {
        sess.wrote_since_wait = false;
        sess.write_offset = current_offset(&worker).await;
    }
    let target = sess.write_offset;
    let count = || {
        shared
            .repl
            .replicas()
            .iter()
            .filter(|r| r.state.load(Ordering::Relaxed) == REPLICA_ONLINE && acked(r) >= target)
            .count() as i64
    };
    let n = count();
    if n >= want {
        return n;
    }
    send_urgent(&worker, ReplMsg::GetAck);
    // Earlier replies reach the client before WAIT holds this one.
    let _ = stream_io::settle(crate::net::link(sess.id).as_deref()).await;
    let deadline =
        (timeout_ms > 0).then(|| std::time::Instant::now() + Duration::from_millis(timeout_ms));
    let (stream, handle) = (crate::net::link(sess.id), sess.handle.clone());
    let max_held = sess.query_buffer_limit();
    loop {
        // Registered before counting, so an ACK between the count and the wait wakes it.
        let acked = shared.repl.acked.notified();
        tokio::pin!(acked);
        acked.as_mut().enable();
        let n = count();
        if n >= want || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return n;
        }
        let nap = deadline.map_or(Duration::from_millis(100), |d| {
            d.saturating_duration_since(std::time::Instant::now())
                .min(Duration::from_millis(100))
        });
        tokio::select! {
            _ = &mut acked => {}
            _ = crate::net::event_loop::time::sleep(nap) => {}
            _ = handle.wake.notified() => if handle.killed.get() { return n },
            _ = stream_io::gone(stream.as_deref(), max_held) => return n,
        }
    }
}
