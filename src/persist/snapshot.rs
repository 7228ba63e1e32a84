//! Snapshots without fork: SAVE, BGSAVE, save points, SHUTDOWN's save.
//!
//! The cut: a transaction takes every shard's lock (so no multi-shard transaction or
//! script is half done anywhere), and each shard starts a snapshot of its tables while
//! holding it. The locks go at once. From then on each shard writes its tables on its own
//! thread, a little per pass of its event loop (`serialize`), and a segment about to
//! change is written before the change (`types::table`). One writer thread owns the file
//! (`rdbfile`). No shard ever waits for the disk.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::rdb::write::Options;
use super::rdbfile::{header_with, write_file, write_to};
use super::serialize::{begin_on_shard, Msg};
use crate::shard::tx::Tx;
use crate::shard::{broadcast, unix_ms, Worker};

/// Messages in flight to the writer thread: with 32 KiB messages, about 1 MiB. A shard
/// that finds the queue full sleeps a millisecond, so the queue must hold more than the
/// writer drains in that time: at 4 messages a full sync of 1M jobs took 5x Redis's
/// time; at 32, 1.4x, for 1 MiB (scripts/bench-replication.py, BENCHMARKS.md).
const WRITER_QUEUE: usize = 32;

/// Where `dir` and `dbfilename` put the snapshot.
pub fn rdb_path(worker: &Worker) -> PathBuf {
    let c = worker.shared.config.lock().expect("config lock");
    Path::new(c.get("dir")).join(c.get("dbfilename"))
}

pub fn write_options(worker: &Worker) -> (Options, bool) {
    let c = worker.shared.config.lock().expect("config lock");
    (
        Options {
            version: c.get_i64("rdb-version") as u16,
            compress: c.get_bool("rdbcompression"),
        },
        c.get_bool("rdbchecksum"),
    )
}

/// Claims the right to take a snapshot: only one runs at a time.
pub(crate) fn claim(worker: &Worker) -> Result<(), String> {
    worker
        .shared
        .persist
        .bgsave_in_progress
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .map(|_| ())
        .map_err(|_| "ERR Background save already in progress".to_string())
}

/// Takes a snapshot of the whole server and writes it to `dir/dbfilename`; returns once
/// the file is on disk.
pub async fn save(worker: &Rc<Worker>) -> Result<(), String> {
    claim(worker)?;
    let (done, result) = oneshot::channel();
    let w = worker.clone();
    // The snapshot runs as a task of its own: should the caller's future be dropped (its
    // client gone), the snapshot still ends and releases its claim.
    crate::net::event_loop::spawn_local(async move {
        let path = rdb_path(&w);
        let r = match cut(&w, Target::File(path), None).await {
            Ok(c) => finish(&w, c).await,
            Err(e) => Err(e),
        };
        let _ = done.send(r);
    });
    result
        .await
        .unwrap_or_else(|_| Err("ERR the snapshot stopped".into()))
}

/// Takes a snapshot whose file is written in the background. Returns once the cut is
/// made, so a write the caller sends after the reply is not in the file (as after
/// Redis's fork); fails at once if a snapshot is running.
pub async fn bgsave(worker: &Rc<Worker>) -> Result<(), String> {
    claim(worker)?;
    let (made, result) = oneshot::channel();
    let w = worker.clone();
    crate::net::event_loop::spawn_local(async move {
        let path = rdb_path(&w);
        match cut(&w, Target::File(path), None).await {
            Ok(c) => {
                let _ = made.send(Ok(()));
                let _ = finish(&w, c).await;
            }
            Err(e) => {
                let _ = made.send(Err(e));
            }
        }
    });
    result
        .await
        .unwrap_or_else(|_| Err("ERR the snapshot stopped".into()))
}

/// A snapshot whose cut is made and whose file is being written.
pub(crate) struct Cut {
    pub started: Instant,
    pub path: PathBuf,
    /// Each shard's write counter at the cut.
    pub dirty: Vec<u64>,
    pub written: oneshot::Receiver<std::io::Result<u64>>,
}

/// What runs at the cut, while every shard is still locked (an AOF rewrite switches to a
/// new incremental file there, a replica is attached to the stream there). It returns
/// AUX fields for the file's header.
pub(crate) type AtCut = Box<dyn FnOnce(&Rc<Worker>) -> Vec<(String, Vec<u8>)>>;

/// Where a snapshot goes.
pub(crate) enum Target {
    File(PathBuf),
    /// A diskless replication sync: the RDB goes to a replica's link in chunks as it is
    /// made.
    Channel(tokio::sync::mpsc::Sender<bytes::Bytes>),
}

/// The RDB writer's end of a diskless sync: chunks for the replica's link; blocks the
/// snapshot writer thread (never a shard) while the replica is slow.
struct ChannelSink {
    tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
    buf: Vec<u8>,
}

const CHUNK: usize = 64 * 1024;

impl std::io::Write for ChannelSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = bytes::Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(chunk).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the replica went away")
        })
    }
}

/// Starts the writer thread and makes the cut (see the module comment). The caller holds
/// the claim.
pub(crate) async fn cut(
    worker: &Rc<Worker>,
    target: Target,
    at_cut: Option<AtCut>,
) -> Result<Cut, String> {
    let state = &worker.shared.persist;
    let started = Instant::now();
    state
        .bgsave_started_unix
        .store(unix_ms() / 1000, Ordering::Relaxed);
    let (opts, checksum) = write_options(worker);
    let (to_writer, chunks) = mpsc::sync_channel::<Msg>(WRITER_QUEUE);
    let (done_tx, done_rx) = oneshot::channel();
    // The header holds the FUNCTION libraries: taken at the cut, not before it.
    let (head_tx, head_rx) = mpsc::sync_channel::<Vec<u8>>(1);
    let path = match &target {
        Target::File(p) => p.clone(),
        Target::Channel(_) => PathBuf::from("(a replica's link)"),
    };
    let dir = {
        let c = worker.shared.config.lock().expect("config lock");
        PathBuf::from(c.get("dir"))
    };
    let spawned = std::thread::Builder::new()
        .name("kite-rdb-writer".into())
        .spawn(move || {
            // Background work: the shards serving clients come first on a busy machine.
            // SAFETY: setpriority on this thread's own id only changes its nice value.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
            }
            let written = match (head_rx.recv(), target) {
                (Ok(head), Target::File(path)) => write_file(&path, head, chunks, checksum, opts),
                (Ok(head), Target::Channel(tx)) => {
                    let sink = ChannelSink {
                        tx,
                        buf: Vec::with_capacity(CHUNK),
                    };
                    let stamp = format!("{}-{}", std::process::id(), unix_ms());
                    write_to(sink, &dir, &stamp, head, chunks, checksum, opts).map(|(_, n)| n)
                }
                (Err(_), _) => Err(std::io::Error::other("the snapshot was abandoned")),
            };
            let _ = done_tx.send(written);
        });
    if let Err(e) = spawned {
        state.bgsave_in_progress.store(false, Ordering::Release);
        return Err(format!("ERR cannot start the snapshot writer: {e}"));
    }
    // A replica's own snapshot records where in its master's stream it stands, so that it
    // can continue with a partial resync after a restart; no applied command may fall
    // between that offset and the cut.
    let replica_gate = if at_cut.is_none() && worker.shared.repl.is_replica() {
        Some(worker.shared.repl.apply_gate.lock().await)
    } else {
        None
    };
    let tx = Tx::lock_keys(worker, &[], true).await;
    let dirty = broadcast(worker, move |w| begin_on_shard(w, &to_writer, opts)).await;
    // An AOF rewrite switches files before the FUNCTION libraries are read: a library
    // loaded meanwhile is then in the base or logged after the switch (or both, which
    // replays harmlessly), never in neither.
    let aux = match (at_cut, &replica_gate) {
        (Some(f), _) => f(worker),
        (None, Some(_)) => crate::repl::replica::save_info(&worker.shared),
        (None, None) => Vec::new(),
    };
    let _ = head_tx.send(header_with(&opts, &aux));
    drop(tx);
    drop(replica_gate);
    Ok(Cut {
        started,
        path,
        dirty,
        written: done_rx,
    })
}

/// Waits for the file and records the outcome.
async fn finish(worker: &Rc<Worker>, cut: Cut) -> Result<(), String> {
    let state = &worker.shared.persist;
    let Cut {
        started,
        path,
        dirty,
        written,
    } = cut;
    let result = written
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("the snapshot writer stopped")));
    state
        .last_bgsave_secs
        .store(started.elapsed().as_secs() as i64, Ordering::Relaxed);
    let outcome = match result {
        Ok(bytes) => {
            tracing::info!(
                "DB saved on disk: {} ({} bytes, {} ms)",
                path.display(),
                bytes,
                started.elapsed().as_millis()
            );
            broadcast(worker, move |w| {
                w.shard.borrow_mut().dirty_saved = dirty[w.id];
            })
            .await;
            worker
                .shared
                .lastsave_unix
                .store(unix_ms() / 1000, Ordering::Relaxed);
            state.last_bgsave_ok.store(true, Ordering::Relaxed);
            state.saves.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => {
            tracing::warn!("Failed saving the DB to {}: {e}", path.display());
            state.last_bgsave_ok.store(false, Ordering::Relaxed);
            state
                .last_failed_unix
                .store(unix_ms() / 1000, Ordering::Relaxed);
            Err(format!("ERR {e}"))
        }
    };
    state.refresh_gate(&worker.shared);
    state.bgsave_in_progress.store(false, Ordering::Release);
    outcome
}

/// The `save` setting: pairs of (seconds, changes).
pub fn save_points(worker: &Worker) -> Vec<(u64, u64)> {
    let c = worker.shared.config.lock().expect("config lock");
    parse_save_points(c.get("save")).unwrap_or_default()
}

pub fn parse_save_points(s: &str) -> Option<Vec<(u64, u64)>> {
    let words: Vec<&str> = s.split_whitespace().collect();
    if !words.len().is_multiple_of(2) {
        return None;
    }
    words
        .chunks(2)
        .map(|p| Some((p[0].parse().ok()?, p[1].parse().ok()?)))
        .collect()
}

/// Writes since the last successful save, over every shard.
pub async fn changes_since_save(worker: &Rc<Worker>) -> u64 {
    broadcast(worker, |w| {
        let sh = w.shard.borrow();
        sh.dirty.saturating_sub(sh.dirty_saved)
    })
    .await
    .iter()
    .sum()
}

/// Run once a second on thread 0: starts a BGSAVE when a save point is reached, as
/// Redis's serverCron does. After a failure it waits 5 s to retry.
pub async fn cron(worker: &Rc<Worker>) {
    let state = &worker.shared.persist;
    super::aof::rewrite::cron(worker);
    if state.bgsave_in_progress.load(Ordering::Acquire) {
        return;
    }
    if state.bgsave_scheduled.swap(false, Ordering::AcqRel) {
        let _ = bgsave(worker).await;
        return;
    }
    let points = save_points(worker);
    if points.is_empty() {
        return;
    }
    let now = unix_ms() / 1000;
    let last = worker.shared.lastsave_unix.load(Ordering::Relaxed);
    if !state.last_bgsave_ok.load(Ordering::Relaxed)
        && now.saturating_sub(state.last_failed_unix.load(Ordering::Relaxed)) < 5
    {
        return;
    }
    let changes = changes_since_save(worker).await;
    if points
        .iter()
        .any(|&(secs, n)| changes >= n && now.saturating_sub(last) >= secs)
    {
        tracing::info!("{changes} changes in the last save period: saving...");
        let _ = bgsave(worker).await;
    }
}

/// Stops the server, saving first when `save` says so (None: when save points are set).
/// Returns only when the save failed and `force` is false.
pub async fn shutdown(worker: &Rc<Worker>, save: Option<bool>, force: bool) -> Result<(), String> {
    worker.shared.shutting_down.store(true, Ordering::SeqCst);
    let save = save.unwrap_or_else(|| !save_points(worker).is_empty());
    if save {
        // A background save in progress is finished, then a fresh one taken.
        while worker
            .shared
            .persist
            .bgsave_in_progress
            .load(Ordering::Acquire)
        {
            crate::net::event_loop::time::sleep(Duration::from_millis(5)).await;
        }
        tracing::info!("Saving the final RDB snapshot before exiting.");
        if let Err(e) = save_now(worker).await {
            tracing::warn!("Error trying to save the DB, can't exit: {e}");
            if !force {
                worker.shared.shutting_down.store(false, Ordering::SeqCst);
                return Err("ERR Errors trying to SHUTDOWN. Check logs.".into());
            }
        }
    }
    if worker.shared.persist.aof.file_on() {
        // Everything logged reaches the disk before the process goes.
        let (done, wait) = oneshot::channel();
        worker
            .shared
            .persist
            .aof
            .send(super::aof::writer::ToWriter::Sync { done });
        if let Ok(Err(e)) = wait.await {
            tracing::warn!("Error trying to flush the AOF before exiting: {e}");
        }
    }
    tracing::warn!("Kite is now ready to exit, bye bye...");
    // Replies this thread made in its last pass still go.
    crate::net::uring::flush();
    std::process::exit(0);
}

/// `save`, waiting for one already running to finish first instead of failing.
async fn save_now(worker: &Rc<Worker>) -> Result<(), String> {
    loop {
        match save(worker).await {
            Err(e) if e.contains("already in progress") => {
                crate::net::event_loop::time::sleep(Duration::from_millis(5)).await;
            }
            other => return other,
        }
    }
}
