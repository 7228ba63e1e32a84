//! The replica's side: the link to a master (Kite or Redis 7), from the handshake through
//! a full or partial resync to applying the stream.
//!
//! One task on thread 0 owns the link. It applies the master's commands through the
//! ordinary command path with one session that stands for the master (it may write on a
//! read-only replica, never blocks, and its replies go nowhere), and hands the bytes it
//! applied to the writer thread for this server's own backlog and replicas.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::stream::ReplMsg;
use super::{
    MasterAddr, LINK_CONNECT, LINK_CONNECTED, LINK_CONNECTING, LINK_HANDSHAKE, LINK_NONE, LINK_SYNC,
};
use crate::persist::aof::effects::encode;
use crate::persist::aof::writer::ToWriter;
use crate::protocol::parse::{ParseLimits, RequestParser};
use crate::server::session::Session;
use crate::shard::{broadcast, unix_ms, Shared, Worker};

/// Why a link ended.
enum Ended {
    /// Try again in a second, with a partial resync if the dataset allows.
    Retry(String),
    /// The stream held something this server cannot apply: the next try is a full sync.
    Diverged(String),
    /// REPLICAOF changed: this task stops.
    Stop,
}

fn send(shared: &Shared, m: ReplMsg) {
    shared.persist.aof.send(ToWriter::Repl(m));
}

/// REPLICAOF host port: follow that master from now on. The link runs on thread 0.
pub async fn follow(shared: &Arc<Shared>, host: String, port: u16) {
    let shared = shared.clone();
    let r = &shared.repl;
    let gen = r.generation.fetch_add(1, Ordering::AcqRel) + 1;
    // A link to the previous master finishes the commands it is applying, then stops.
    let gate = r.apply_gate.lock().await;
    *r.master.lock().expect("master lock") = Some(MasterAddr {
        host: host.clone(),
        port,
    });
    // CONFIG GET and CONFIG REWRITE show the master in force.
    let _ = shared
        .config
        .lock()
        .expect("config lock")
        .set_initial("replicaof", &format!("{host} {port}"));
    // Writes captured from here on; the replica gate goes up before the reply.
    shared.persist.aof.repl.store(true, Ordering::Release);
    r.replica.store(true, Ordering::Release);
    r.link.store(LINK_CONNECT, Ordering::Relaxed);
    r.link_down_since_ms.store(unix_ms(), Ordering::Relaxed);
    shared.persist.refresh_gate(&shared);
    drop(gate);
    tracing::info!("Connecting to MASTER {host}:{port}");
    shared.send(
        0,
        Box::new(move |w| {
            crate::net::event_loop::spawn_local(run_link(w.clone(), gen));
        }),
    );
}

/// REPLICAOF NO ONE: stop following; the dataset and offset stay, under a new history.
/// Returns once the new ids are in force.
pub async fn promote(shared: &Arc<Shared>) {
    let r = &shared.repl;
    if !r.is_replica() {
        return;
    }
    r.generation.fetch_add(1, Ordering::AcqRel);
    // The link applies nothing more once it has given the gate back.
    let gate = r.apply_gate.lock().await;
    if !r.is_replica() {
        // Another REPLICAOF NO ONE got here first.
        return;
    }
    *r.master.lock().expect("master lock") = None;
    let _ = shared
        .config
        .lock()
        .expect("config lock")
        .set_initial("replicaof", "");
    shared.persist.aof.repl.store(true, Ordering::Release);
    let (done, promoted) = tokio::sync::oneshot::channel();
    send(shared, ReplMsg::Promote { done });
    let _ = promoted.await;
    r.replica.store(false, Ordering::Release);
    r.link.store(LINK_NONE, Ordering::Relaxed);
    shared.persist.refresh_gate(shared);
    drop(gate);
    tracing::info!("MASTER MODE enabled (user request)");
}

/// The AUX fields of a replica's own snapshot: its master's replication id, the offset
/// applied and the stream's database (taken while the link applies nothing).
pub fn save_info(shared: &Shared) -> Vec<(String, Vec<u8>)> {
    let r = &shared.repl;
    if !r.backlog_active.load(Ordering::Relaxed) {
        return Vec::new();
    }
    vec![
        (
            "repl-stream-db".to_string(),
            r.last_db.load(Ordering::Relaxed).to_string().into_bytes(),
        ),
        ("repl-id".to_string(), r.ids().replid.into_bytes()),
        (
            "repl-offset".to_string(),
            r.offset.load(Ordering::Relaxed).to_string().into_bytes(),
        ),
    ]
}

/// At start-up, a replica that loaded its own snapshot takes the replication id and
/// offset recorded in it, so its first PSYNC can continue instead of copying everything.
pub fn restore_from_rdb(shared: &Shared, aux: &[(Vec<u8>, Vec<u8>)]) {
    let replicaof = shared
        .config
        .lock()
        .expect("config lock")
        .get("replicaof")
        .to_string();
    if replicaof.trim().is_empty() {
        return;
    }
    let field = |name: &str| {
        aux.iter()
            .find(|(k, _)| k == name.as_bytes())
            .and_then(|(_, v)| std::str::from_utf8(v).ok().map(str::to_string))
    };
    let (Some(replid), Some(offset)) = (
        field("repl-id").filter(|id| id.len() == 40),
        field("repl-offset").and_then(|o| o.parse::<u64>().ok()),
    ) else {
        return;
    };
    let db = field("repl-stream-db")
        .and_then(|d| d.parse::<usize>().ok())
        .filter(|&d| d < shared.tunables.databases)
        .unwrap_or(0);
    let r = &shared.repl;
    r.ids.lock().expect("repl ids lock").replid = replid.clone();
    r.offset.store(offset, Ordering::Relaxed);
    r.last_db.store(db as u64, Ordering::Relaxed);
    r.backlog_active.store(true, Ordering::Relaxed);
    send(shared, ReplMsg::Follow { replid, offset, db });
    tracing::info!("Restored the master's replication ID and offset ({offset}) from the RDB: a partial resync is possible");
}

fn current(shared: &Shared, gen: u64) -> bool {
    shared.repl.generation.load(Ordering::Acquire) == gen
}

/// The link's life: connect, sync, apply; again a second after any failure, until
/// REPLICAOF changes.
async fn run_link(worker: Rc<Worker>, gen: u64) {
    let shared = worker.shared.clone();
    let mut full_needed = false;
    // The dataset on disk is loaded before the master's replaces it.
    while shared.persist.loading.load(Ordering::Acquire) {
        crate::net::event_loop::time::sleep(Duration::from_millis(50)).await;
    }
    loop {
        if !current(&shared, gen) {
            return;
        }
        let Some(addr) = shared.repl.master.lock().expect("master lock").clone() else {
            return;
        };
        shared.repl.link.store(LINK_CONNECTING, Ordering::Relaxed);
        match link_once(&worker, gen, &addr, full_needed).await {
            Ended::Stop => return,
            Ended::Retry(e) => {
                tracing::warn!(
                    "Replication link with MASTER {}:{}: {e}",
                    addr.host,
                    addr.port
                );
            }
            Ended::Diverged(e) => {
                tracing::error!(
                    "Replication with MASTER {}:{} stopped: {e}. This replica will not go on diverged: its next sync is a full one.",
                    addr.host,
                    addr.port
                );
                full_needed = true;
            }
        }
        if !current(&shared, gen) {
            return;
        }
        if shared.repl.link.swap(LINK_CONNECT, Ordering::Relaxed) == LINK_CONNECTED {
            shared
                .repl
                .link_down_since_ms
                .store(unix_ms(), Ordering::Relaxed);
        }
        shared.persist.refresh_gate(&shared);
        crate::net::event_loop::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A connection to the master, read line by line during the handshake: plain TCP, or
/// TLS with `tls-replication yes`.
struct Link {
    stream: Box<dyn crate::net::tls::AsyncIo>,
    buf: BytesMut,
}

impl Link {
    async fn command(&mut self, args: &[&[u8]]) -> Result<String, String> {
        let mut out = Vec::new();
        encode(&mut out, args);
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| e.to_string())?;
        self.line().await
    }

    /// The next non-empty line (a master sends bare newlines to keep a link alive while
    /// it prepares a snapshot).
    async fn line(&mut self) -> Result<String, String> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line = self.buf.split_to(pos + 1);
                let text = String::from_utf8_lossy(&line).trim_end().to_string();
                if text.is_empty() {
                    continue;
                }
                return Ok(text);
            }
            if self.buf.len() > 64 * 1024 {
                return Err("the master sent a line too long".into());
            }
            self.fill().await?;
        }
    }

    /// `fill`, given up after `repl-timeout` without a byte (a master that stopped
    /// mid-transfer must not hold the link for ever).
    async fn fill_within(&mut self, limit: Duration) -> Result<usize, String> {
        match crate::net::event_loop::time::timeout(limit, self.fill()).await {
            Ok(r) => r,
            Err(_) => Err("Timeout receiving bulk data from MASTER...".into()),
        }
    }

    async fn fill(&mut self) -> Result<usize, String> {
        self.buf.reserve(16 * 1024);
        let n = self
            .stream
            .read_buf(&mut self.buf)
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the master closed the connection".into());
        }
        Ok(n)
    }
}

async fn link_once(worker: &Rc<Worker>, gen: u64, addr: &MasterAddr, full_needed: bool) -> Ended {
    let shared = worker.shared.clone();
    let timeout = super::timeout(&shared);
    let connect = TcpStream::connect((addr.host.as_str(), addr.port));
    let stream = match crate::net::event_loop::time::timeout(timeout, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Ended::Retry(format!("Error condition on socket for SYNC: {e}")),
        Err(_) => return Ended::Retry("Timeout connecting to the MASTER...".into()),
    };
    let _ = stream.set_nodelay(true);
    let tls_link = shared
        .config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_bool("tls-replication");
    let stream: Box<dyn crate::net::tls::AsyncIo> = if tls_link {
        let config = shared
            .config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let connect = crate::net::tls::connect(&config, &addr.host, stream);
        match crate::net::event_loop::time::timeout(timeout, connect).await {
            Ok(Ok(s)) => Box::new(s),
            Ok(Err(e)) => {
                return Ended::Retry(format!("TLS handshake with the MASTER failed: {e}"))
            }
            Err(_) => {
                return Ended::Retry("Timeout during the TLS handshake with the MASTER".into())
            }
        }
    } else {
        Box::new(stream)
    };
    tracing::info!("MASTER <-> REPLICA sync started");
    shared.repl.link.store(LINK_HANDSHAKE, Ordering::Relaxed);
    let mut link = Link {
        stream,
        buf: BytesMut::with_capacity(16 * 1024),
    };
    let handshake =
        crate::net::event_loop::time::timeout(timeout, handshake(&shared, &mut link, full_needed))
            .await;
    let (reply, asked) = match handshake {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Ended::Retry(e),
        Err(_) => return Ended::Retry("Timeout during the handshake with the MASTER".into()),
    };
    if !current(&shared, gen) {
        return Ended::Stop;
    }
    let mut words = reply.split_whitespace();
    let db = match words.next() {
        Some("+FULLRESYNC") => {
            let (Some(replid), Some(offset)) = (
                words.next().map(str::to_string),
                words.next().and_then(|o| o.parse::<u64>().ok()),
            ) else {
                return Ended::Retry(format!("Bad reply to PSYNC: {reply}"));
            };
            tracing::info!("Full resync from master: {replid}:{offset}");
            shared.repl.link.store(LINK_SYNC, Ordering::Relaxed);
            match full_sync(worker, gen, &mut link, &replid, offset).await {
                Ok(db) => db,
                Err(e) => return e,
            }
        }
        Some("+CONTINUE") => {
            let ids = shared.repl.ids();
            let replid = words.next().map_or(ids.replid.clone(), str::to_string);
            if replid != ids.replid {
                tracing::info!("Master replication ID changed to {replid}");
            }
            let gate = shared.repl.apply_gate.lock().await;
            if !current(&shared, gen) {
                return Ended::Stop;
            }
            send(&shared, ReplMsg::Resumed { replid });
            drop(gate);
            tracing::info!(
                "Successful partial resynchronization with master (from offset {}).",
                asked
            );
            shared.repl.last_db.load(Ordering::Relaxed) as usize
        }
        _ => return Ended::Retry(format!("Unexpected reply to PSYNC from master: {reply}")),
    };
    shared.repl.link.store(LINK_CONNECTED, Ordering::Relaxed);
    shared.repl.link_down_since_ms.store(0, Ordering::Relaxed);
    shared.repl.last_io_ms.store(unix_ms(), Ordering::Relaxed);
    shared.persist.refresh_gate(&shared);
    tracing::info!("MASTER <-> REPLICA sync: Master accepted a Partial Resynchronization or the load is finished; streaming.");
    apply(worker, gen, link, addr, db, timeout).await
}

/// PING, AUTH, REPLCONF, PSYNC. Returns the reply to PSYNC and the offset asked for.
async fn handshake(
    shared: &Shared,
    link: &mut Link,
    full_needed: bool,
) -> Result<(String, u64), String> {
    let pong = link.command(&[b"PING"]).await?;
    // A master that wants AUTH answers NOAUTH to PING: AUTH comes next anyway.
    if pong.starts_with('-') && !pong.starts_with("-NOAUTH") && !pong.starts_with("-NOPERM") {
        return Err(format!("Error reply to PING from master: '{pong}'"));
    }
    let (user, pass, announce_ip, port) = {
        let c = shared.config.lock().expect("config lock");
        let announce_port = c.get_i64("replica-announce-port");
        let port = if announce_port > 0 {
            announce_port
        } else {
            c.get_i64("port")
        };
        (
            c.get("masteruser").to_string(),
            c.get("masterauth").to_string(),
            c.get("replica-announce-ip").to_string(),
            port,
        )
    };
    if !pass.is_empty() {
        let r = if user.is_empty() {
            link.command(&[b"AUTH", pass.as_bytes()]).await?
        } else {
            link.command(&[b"AUTH", user.as_bytes(), pass.as_bytes()])
                .await?
        };
        if r.starts_with('-') {
            return Err(format!("Unable to AUTH to MASTER: {r}"));
        }
    }
    let r = link
        .command(&[b"REPLCONF", b"listening-port", port.to_string().as_bytes()])
        .await?;
    if r.starts_with('-') {
        tracing::info!("(Non critical) Master does not understand REPLCONF listening-port: {r}");
    }
    if !announce_ip.is_empty() {
        let r = link
            .command(&[b"REPLCONF", b"ip-address", announce_ip.as_bytes()])
            .await?;
        if r.starts_with('-') {
            tracing::info!("(Non critical) Master does not understand REPLCONF ip-address: {r}");
        }
    }
    let r = link
        .command(&[b"REPLCONF", b"capa", b"eof", b"capa", b"psync2"])
        .await?;
    if r.starts_with('-') {
        tracing::info!("(Non critical) Master does not understand REPLCONF capa: {r}");
    }
    let ids = shared.repl.ids();
    let have_history = shared.repl.backlog_active.load(Ordering::Relaxed) && !full_needed;
    let offset = shared.repl.offset.load(Ordering::Relaxed) + 1;
    let reply = if have_history {
        tracing::info!(
            "Trying a partial resynchronization (request {}:{offset}).",
            ids.replid
        );
        if shared.repl.failover_psync.load(Ordering::Acquire) {
            // FAILOVER: the target promotes itself and continues this server's history.
            let r = link
                .command(&[
                    b"PSYNC",
                    ids.replid.as_bytes(),
                    offset.to_string().as_bytes(),
                    b"FAILOVER",
                ])
                .await?;
            let accepted = !r.starts_with('-');
            shared
                .repl
                .failover_result
                .store(if accepted { 1 } else { 2 }, Ordering::Release);
            r
        } else {
            link.command(&[
                b"PSYNC",
                ids.replid.as_bytes(),
                offset.to_string().as_bytes(),
            ])
            .await?
        }
    } else {
        tracing::info!("Partial resynchronization not possible (no cached master)");
        link.command(&[b"PSYNC", b"?", b"-1"]).await?
    };
    if reply.starts_with("-NOMASTERLINK") || reply.starts_with("-LOADING") {
        return Err(format!(
            "Master is currently unable to PSYNC but should be in the future: {reply}"
        ));
    }
    if reply.starts_with('-') {
        return Err(format!("Unexpected reply to PSYNC from master: {reply}"));
    }
    Ok((reply, offset))
}

/// Receives the RDB into a file, then replaces the dataset with it. Returns the database
/// the stream is in.
async fn full_sync(
    worker: &Rc<Worker>,
    gen: u64,
    link: &mut Link,
    replid: &str,
    offset: u64,
) -> Result<usize, Ended> {
    let shared = worker.shared.clone();
    // The master may take a while to start its snapshot (a BGSAVE to wait for, the
    // diskless delay) and sends newlines meanwhile; silence past repl-timeout ends it.
    let header = crate::net::event_loop::time::timeout(super::timeout(&shared), link.line())
        .await
        .map_err(|_| Ended::Retry("Timeout waiting for the RDB from MASTER".into()))?
        .map_err(Ended::Retry)?;
    let Some(size) = header.strip_prefix('$') else {
        return Err(Ended::Retry(format!(
            "Bad protocol from MASTER, the first byte is not '$' (we received '{header}'), are you sure the host and port are right?"
        )));
    };
    let (dir, dbfilename) = {
        let c = shared.config.lock().expect("config lock");
        (PathBuf::from(c.get("dir")), c.get("dbfilename").to_string())
    };
    let tmp = dir.join(format!("temp-{}.{}.rdb", unix_ms(), std::process::id()));
    let received = receive_rdb(link, size, &tmp, super::timeout(&shared)).await;
    if let Err(e) = received {
        let _ = std::fs::remove_file(&tmp);
        return Err(Ended::Retry(e));
    }
    // From here to Follow the gate is held: REPLICAOF NO ONE (or another REPLICAOF)
    // waits for the load and then finds the new history in place, never the reverse.
    let gate = shared.repl.apply_gate.lock().await;
    if !current(&shared, gen) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Ended::Stop);
    }
    tracing::info!("MASTER <-> REPLICA sync: Flushing old data");
    let st = &shared.persist;
    st.loading.store(true, Ordering::Release);
    st.loading_started_unix
        .store(unix_ms() / 1000, Ordering::Relaxed);
    st.refresh_gate(&shared);
    let ndb = shared.tunables.databases;
    broadcast(worker, move |w| {
        let mut sh = w.shard.borrow_mut();
        for db in 0..ndb {
            sh.flush_db(db);
        }
    })
    .await;
    crate::scripting::registry().flush();
    tracing::info!("MASTER <-> REPLICA sync: Loading DB in memory");
    let (done, result) = tokio::sync::oneshot::channel();
    let (s2, path) = (shared.clone(), tmp.clone());
    let spawned = std::thread::Builder::new()
        .name("kite-repl-loader".into())
        .spawn(move || {
            let _ = done.send(crate::persist::load::load_file(&s2, &path));
        });
    let loaded = match spawned {
        Ok(_) => {
            // A newline a second tells the master this replica is alive while it loads,
            // as Redis's replicas do (masters count it as a sign of life).
            let mut result = result;
            let mut beat = crate::net::event_loop::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    r = &mut result => break r.unwrap_or_else(|_| Err("the loader stopped".into())),
                    _ = beat.tick() => {
                        let _ = link.stream.write_all(b"\n").await;
                    }
                }
            }
        }
        Err(e) => Err(e.to_string()),
    };
    st.loading.store(false, Ordering::Release);
    st.refresh_gate(&shared);
    let loaded = match loaded {
        Ok(Some(l)) => l,
        Ok(None) => {
            return Err(Ended::Diverged("the received RDB vanished".into()));
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(Ended::Diverged(format!(
                "Failed trying to load the MASTER synchronization DB from disk: {e}"
            )));
        }
    };
    let stream_db = loaded
        .aux
        .iter()
        .find(|(k, _)| k == b"repl-stream-db")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<usize>().ok())
        .filter(|&db| db < ndb)
        .unwrap_or(0);
    if let Err(e) = std::fs::rename(&tmp, dir.join(&dbfilename)) {
        tracing::warn!("Failed trying to rename the synchronization file to {dbfilename}: {e}");
        let _ = std::fs::remove_file(&tmp);
    }
    shared.repl.offset.store(offset, Ordering::Relaxed);
    shared.repl.read_offset.store(offset, Ordering::Relaxed);
    send(
        &shared,
        ReplMsg::Follow {
            replid: replid.to_string(),
            offset,
            db: stream_db,
        },
    );
    shared
        .repl
        .last_db
        .store(stream_db as u64, Ordering::Relaxed);
    drop(gate);
    tracing::info!(
        "MASTER <-> REPLICA sync: Finished with success ({} keys loaded)",
        loaded.keys
    );
    if st.aof.file_on() {
        // The AOF must hold the new dataset: a rewrite starts from it, as Redis restarts
        // its AOF after a sync; a snapshot running now is waited for.
        let w = worker.clone();
        crate::net::event_loop::spawn_local(async move {
            for _ in 0..6000 {
                match crate::persist::aof::rewrite::start(&w) {
                    Ok(()) => return,
                    Err(_) => crate::net::event_loop::time::sleep(Duration::from_millis(100)).await,
                }
            }
            tracing::warn!(
                "Could not rewrite the AOF after the sync: a snapshot kept running for 10 minutes"
            );
        });
    }
    Ok(stream_db)
}

/// Reads the RDB payload (`$<len>` or `$EOF:<mark>`) into `path`.
async fn receive_rdb(
    link: &mut Link,
    size: &str,
    path: &Path,
    limit: Duration,
) -> Result<(), String> {
    use std::io::Write;
    // Local file writes of a chunk at a time: the page cache takes them at once.
    let mut file = std::fs::File::create(path).map_err(|e| {
        format!("Opening the temp file needed for MASTER <-> REPLICA synchronization: {e}")
    })?;
    if let Some(mark) = size.strip_prefix("EOF:") {
        let mark = mark.as_bytes().to_vec();
        if mark.len() != 40 {
            return Err(format!("Bad EOF mark from MASTER: {size}"));
        }
        // Everything up to the mark is the file; the last 40 bytes are kept back until
        // more arrives, since they may be the mark.
        loop {
            // A Redis master sends nothing after the mark until the replica's first ACK;
            // bytes after it, if a master sends them, stay for the stream.
            if let Some(at) = link.buf.windows(40).position(|w| w == mark.as_slice()) {
                let body = link.buf.split_to(at);
                let _ = link.buf.split_to(40);
                file.write_all(&body).map_err(|e| e.to_string())?;
                break;
            }
            if link.buf.len() > 64 * 1024 {
                let keep = link.buf.len() - 40;
                let body = link.buf.split_to(keep);
                file.write_all(&body).map_err(|e| e.to_string())?;
            }
            link.fill_within(limit).await?;
        }
    } else {
        let mut left: u64 = size
            .parse()
            .map_err(|_| format!("Bad RDB length from MASTER: {size}"))?;
        loop {
            let take = (link.buf.len() as u64).min(left) as usize;
            if take > 0 {
                let body = link.buf.split_to(take);
                file.write_all(&body).map_err(|e| e.to_string())?;
                left -= take as u64;
            }
            if left == 0 {
                break;
            }
            link.fill_within(limit).await?;
        }
    }
    file.sync_all().map_err(|e| e.to_string())?;
    Ok(())
}

/// Applies the master's stream until the link ends.
async fn apply(
    worker: &Rc<Worker>,
    gen: u64,
    mut link: Link,
    addr: &MasterAddr,
    db: usize,
    timeout: Duration,
) -> Ended {
    let shared = worker.shared.clone();
    let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
    let mut sess = Session::detached(worker, id);
    // The master's commands never block, never wait and may run while loading.
    sess.replaying = true;
    sess.set_db(db);
    {
        let mut info = sess.handle.info.borrow_mut();
        info.addr = format!("{}:{}", addr.host, addr.port);
        info.kind = crate::shard::clients::KIND_MASTER;
    }
    worker.clients.borrow_mut().add(sess.handle.clone());
    shared.repl.master_client_id.store(id, Ordering::Relaxed);
    let ended = apply_loop(&shared, gen, &mut link, &mut sess, timeout).await;
    worker.clients.borrow_mut().remove(id);
    // A transaction cut off by the link's end is dropped: the offset stops before MULTI.
    sess.multi = None;
    shared.repl.last_db.store(sess.db as u64, Ordering::Relaxed);
    ended
}

async fn apply_loop(
    shared: &Arc<Shared>,
    gen: u64,
    link: &mut Link,
    sess: &mut Session,
    timeout: Duration,
) -> Ended {
    let mut parser = RequestParser::default();
    let limits = ParseLimits {
        max_bulk_len: u64::MAX as usize >> 1,
    };
    let r = &shared.repl;
    // `offset` counts applied bytes; `raw` holds bytes read but not yet passed on, from
    // offset `committed + 1`.
    let mut offset = r.offset.load(Ordering::Relaxed);
    let mut committed = offset;
    let mut read_total = offset + link.buf.len() as u64;
    let mut raw: Vec<u8> = link.buf.to_vec();
    let mut rbuf = std::mem::take(&mut link.buf);
    let mut last_ack = Instant::now() - Duration::from_secs(2);
    let mut last_io = Instant::now();
    let mut tick = crate::net::event_loop::time::interval(Duration::from_millis(100));
    let mut batches = Batches::new(shared.nshards());
    loop {
        // The master's stream may never run dry: let the thread's other work in.
        crate::net::event_loop::cooperate().await;
        // Apply every whole command buffered.
        let gate = r.apply_gate.lock().await;
        if !current(shared, gen) {
            return Ended::Stop;
        }
        loop {
            let parsed = match parser.next_command(&mut rbuf, &limits) {
                Ok(Some(args)) => args,
                Ok(None) => break,
                Err(e) => return Ended::Diverged(format!("protocol error in the stream: {}", e.0)),
            };
            let end = read_total - rbuf.len() as u64;
            let name = parsed[0].to_ascii_lowercase();
            if name == b"replconf" {
                if parsed.len() >= 2 && parsed[1].eq_ignore_ascii_case(b"getack") {
                    // The answer covers everything before the GETACK: apply it first.
                    batches.flush(sess).await;
                    if sess.multi.is_none() && offset > committed {
                        commit(shared, &mut raw, &mut committed, offset, sess.db);
                    }
                    if let Err(e) = send_ack(link, shared, offset).await {
                        return Ended::Retry(e);
                    }
                    last_ack = Instant::now();
                }
            } else if name != b"ping" {
                let Some(cmd) = crate::commands::table().lookup(&parsed[0]) else {
                    return Ended::Diverged(format!(
                        "the master sent '{}', which this server does not know",
                        String::from_utf8_lossy(&parsed[0])
                    ));
                };
                if let Err(parsed) = batches.add(sess, cmd, parsed) {
                    // What the batches held is applied: count it before this command,
                    // which may open a transaction that holds the offset back.
                    batches.flush(sess).await;
                    if sess.multi.is_none() && offset > committed {
                        commit(shared, &mut raw, &mut committed, offset, sess.db);
                    }
                    crate::commands::execute(sess, Some(cmd), parsed).await;
                    log_error(&sess.out.buf);
                    sess.out.buf.clear();
                }
            }
            offset = end;
            if batches.is_empty() && sess.multi.is_none() {
                commit(shared, &mut raw, &mut committed, end, sess.db);
            }
        }
        // Everything buffered is applied before the offset says so.
        batches.flush(sess).await;
        if sess.multi.is_none() && offset > committed {
            commit(shared, &mut raw, &mut committed, offset, sess.db);
        }
        drop(gate);
        if last_ack.elapsed() >= Duration::from_secs(1) {
            if let Err(e) = send_ack(link, shared, committed).await {
                return Ended::Retry(e);
            }
            last_ack = Instant::now();
        }
        if rbuf.capacity() - rbuf.len() < 4096 {
            rbuf.reserve(64 * 1024);
        }
        tokio::select! {
            n = link.stream.read_buf(&mut rbuf) => match n {
                Ok(0) => return Ended::Retry("Connection with master lost.".into()),
                Err(e) => return Ended::Retry(format!("Connection with master lost: {e}")),
                Ok(n) => {
                    let start = rbuf.len() - n;
                    raw.extend_from_slice(&rbuf[start..]);
                    read_total += n as u64;
                    r.read_offset.store(read_total, Ordering::Relaxed);
                    r.last_io_ms.store(unix_ms(), Ordering::Relaxed);
                    last_io = Instant::now();
                }
            },
            _ = tick.tick() => {
                if !current(shared, gen) {
                    return Ended::Stop;
                }
                if sess.handle.killed.get() {
                    return Ended::Retry("the master link was killed (CLIENT KILL)".into());
                }
                if last_io.elapsed() > timeout {
                    return Ended::Retry("MASTER timeout: no data nor PING received...".into());
                }
            }
        }
    }
}

/// Counts the stream up to `end` as applied (only whole transactions count, as Redis's
/// reploff rule says) and passes its bytes on to this server's own backlog and replicas.
fn commit(shared: &Shared, raw: &mut Vec<u8>, committed: &mut u64, end: u64, db: usize) {
    let n = (end - *committed) as usize;
    let bytes = Bytes::copy_from_slice(&raw[..n]);
    raw.drain(..n);
    *committed = end;
    shared.repl.offset.store(end, Ordering::Relaxed);
    shared.repl.last_db.store(db as u64, Ordering::Relaxed);
    send(shared, ReplMsg::Upstream { bytes, db });
}

/// Redis's replicas log a master command's error and go on (propagation-error-behavior
/// ignore): the master ran it the same way.
fn log_error(reply: &[u8]) {
    if reply.first() == Some(&b'-') {
        tracing::warn!(
            "== CRITICAL == This replica is sending an error to its master: '{}'",
            String::from_utf8_lossy(reply).trim_end()
        );
    }
}

/// The master's single-shard commands, gathered per shard and sent as one batch each, all
/// shards at once. Applied one by one, each a hop and a wait, a replica with several
/// threads fell seconds behind a busy master. Commands of one shard keep their order;
/// everything else (transactions, scripts, multi-shard and keyless commands) waits for
/// the batches before it and runs alone, so those stay whole and in order. Within one
/// read from the master, a reader on another thread may see a later write on one shard
/// before an earlier one on another (docs/replication.md).
struct Batches {
    per_shard: Vec<std::collections::VecDeque<(&'static crate::commands::Command, Vec<Bytes>)>>,
    count: usize,
}

impl Batches {
    fn new(nshards: usize) -> Batches {
        Batches {
            per_shard: (0..nshards).map(|_| Default::default()).collect(),
            count: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Takes a command that can join a batch, or gives it back to run alone.
    fn add(
        &mut self,
        sess: &Session,
        cmd: &'static crate::commands::Command,
        args: Vec<Bytes>,
    ) -> Result<(), Vec<Bytes>> {
        use crate::commands::{flags, route, Route};
        if sess.multi.is_some()
            || cmd.exec_fn().is_none()
            || !cmd.arity_ok(args.len())
            || !cmd.subcommands.is_empty()
            || cmd.has(flags::BLOCKING)
            || sess.worker.shared.monitors.load(Ordering::Relaxed) > 0
        {
            return Err(args);
        }
        let Route::Shard(s) = route(sess, cmd, &args) else {
            return Err(args);
        };
        self.per_shard[s].push_back((cmd, args));
        self.count += 1;
        Ok(())
    }

    /// Applies every batch, all shards at once, and waits for them.
    async fn flush(&mut self, sess: &Session) {
        if self.count == 0 {
            return;
        }
        self.count = 0;
        let mut running = Vec::new();
        for (shard, cmds) in self.per_shard.iter_mut().enumerate() {
            if cmds.is_empty() {
                continue;
            }
            let mut cmds = std::mem::take(cmds);
            let worker = sess.worker.clone();
            let (db, client_id) = (sess.db, sess.id);
            running.push(crate::net::event_loop::spawn_local(async move {
                // A batch stops once its replies pass `BATCH_REPLY_LIMIT` (a large LPOP
                // with a count) and hands back the commands it did not run: they go again,
                // or every write after the large reply would be skipped.
                loop {
                    let spec = crate::shard::BatchSpec {
                        db,
                        resp3: false,
                        client_id,
                        no_touch: false,
                        atomic: None,
                        reader: None,
                        whole: false,
                    };
                    let result = crate::shard::run_batch_on(&worker, shard, cmds, spec).await;
                    log_error(&result.out.buf);
                    if result.rest.is_empty() {
                        break;
                    }
                    cmds = result.rest;
                }
            }));
        }
        for r in running {
            let _ = r.await;
        }
    }
}

async fn send_ack(link: &mut Link, shared: &Shared, offset: u64) -> Result<(), String> {
    // FACK: the offset this server's AOF holds on disk. Everything applied up to
    // `offset` was handed to the writer before this ACK; once the writer has made all it
    // was handed durable, the offset is covered.
    let aof = &shared.persist.aof;
    let r = &shared.repl;
    if aof.file_on() && aof.all_durable() && aof.write_ok.load(Ordering::Relaxed) {
        r.fack_sent.store(offset, Ordering::Relaxed);
    }
    let fack = r.fack_sent.load(Ordering::Relaxed);
    let mut out = Vec::new();
    encode(
        &mut out,
        &[
            b"REPLCONF".as_slice(),
            b"ACK",
            offset.to_string().as_bytes(),
            b"FACK",
            fack.to_string().as_bytes(),
        ],
    );
    link.stream
        .write_all(&out)
        .await
        .map_err(|e| format!("Connection with master lost while sending ACK: {e}"))
}
