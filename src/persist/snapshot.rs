//! Snapshots without fork: SAVE, BGSAVE, save points, SHUTDOWN's save.
//!
//! The cut: a transaction takes every shard's lock (so no multi-shard transaction or
//! script is half done anywhere), and each shard starts a snapshot of its tables while
//! holding it. The locks go at once. From then on each shard writes its tables on its own
//! thread, a few segments per pass of its event loop, and a segment about to change is
//! written before the change (`types::table`). Shards hand their bytes, in chunks that
//! each open with SELECTDB, to one writer thread that owns the file: header, the chunks
//! in arrival order, EOF and the CRC64, fsync, rename. No shard ever waits for the disk.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::rdb::write::{
    put_key_value, put_len, put_maybe_compressed, put_raw_string, put_string, Options, Sink,
};
use super::rdb::{op, CRC64};
use crate::shard::tx::Tx;
use crate::shard::{broadcast, unix_ms, Worker};
use crate::types::table::{Entry, SegmentSink};

/// Bytes a shard gathers before handing a chunk to the writer.
const CHUNK_BYTES: usize = 256 * 1024;
/// Time a shard spends writing its snapshot per pass before serving clients again.
const STEP_BUDGET: Duration = Duration::from_micros(500);

/// Serialized bytes on their way to the writer. Blobs (listpacks, intsets) are
/// compressed by the writer thread, not by the shard that serialized them.
enum Piece {
    Raw(Vec<u8>),
    Blob(Vec<u8>),
}

/// One database of one shard being written.
struct DbSink {
    db: usize,
    raw: Vec<u8>,
    pieces: Vec<Piece>,
    /// Bytes in `pieces` and `raw`.
    held: usize,
    to_writer: mpsc::Sender<Vec<Piece>>,
    opts: Options,
}

impl DbSink {
    fn flush(&mut self) {
        self.seal_raw();
        if !self.pieces.is_empty() {
            // The writer only goes away after every sink did; a send error is moot.
            let _ = self.to_writer.send(std::mem::take(&mut self.pieces));
            self.held = 0;
        }
    }

    fn seal_raw(&mut self) {
        if !self.raw.is_empty() {
            self.pieces.push(Piece::Raw(std::mem::take(&mut self.raw)));
        }
    }
}

impl Sink for DbSink {
    fn put(&mut self, bytes: &[u8]) {
        self.held += bytes.len();
        self.raw.extend_from_slice(bytes);
    }

    fn put_blob(&mut self, blob: Vec<u8>, opts: &Options) {
        if !opts.compress || blob.len() <= 20 {
            put_raw_string(self, &blob);
            return;
        }
        self.seal_raw();
        self.held += blob.len();
        self.pieces.push(Piece::Blob(blob));
    }
}

impl SegmentSink for DbSink {
    fn save(&mut self, entries: &mut dyn Iterator<Item = &Entry>) {
        for e in entries {
            if self.held == 0 {
                // Every chunk opens with the database it belongs to: chunks of several
                // shards interleave in the file.
                self.raw.reserve(64 * 1024);
                self.raw.push(op::SELECTDB);
                put_len(&mut self.raw, self.db as u64);
                self.held = self.raw.len();
            }
            let opts = self.opts;
            put_key_value(self, &e.key, &e.value, e.expire_at(), &opts);
            // Chunks end only between records.
            if self.held >= CHUNK_BYTES {
                self.flush();
            }
        }
    }
}

impl Drop for DbSink {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The file's opening: magic, version, AUX fields and the FUNCTION libraries.
fn header(opts: &Options) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(format!("REDIS{:04}", opts.version).as_bytes());
    let mut aux = |k: &str, v: &[u8]| {
        out.push(op::AUX);
        put_raw_string(&mut out, k.as_bytes());
        put_string(&mut out, v, opts);
    };
    aux(
        "redis-ver",
        crate::commands::connection::SERVER_VERSION.as_bytes(),
    );
    aux("redis-bits", b"64");
    aux("ctime", (unix_ms() / 1000).to_string().as_bytes());
    aux("used-mem", b"0");
    aux("aof-base", b"0");
    for lib in crate::scripting::registry().snapshot() {
        out.push(op::FUNCTION2);
        put_string(&mut out, &lib.code, opts);
    }
    out
}

/// Writes the chunks to a temporary file, then moves it to `path` once it is complete
/// and on disk.
fn write_file(
    path: &Path,
    head: Vec<u8>,
    chunks: mpsc::Receiver<Vec<Piece>>,
    checksum: bool,
    opts: Options,
) -> std::io::Result<u64> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!("temp-{}-{}.rdb", std::process::id(), unix_ms()));
    let result = (|| {
        let mut file = std::io::BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        let mut crc = CRC64.digest();
        let mut written = 0u64;
        let mut put = |file: &mut std::io::BufWriter<File>, b: &[u8]| -> std::io::Result<()> {
            crc.update(b);
            written += b.len() as u64;
            file.write_all(b)
        };
        put(&mut file, &head)?;
        // Every chunk is drained even after a failed write, so no shard blocks on us.
        let mut failure = None;
        let mut packed = Vec::new();
        for chunk in chunks {
            for piece in chunk {
                if failure.is_some() {
                    continue;
                }
                let bytes = match &piece {
                    Piece::Raw(b) => b,
                    Piece::Blob(b) => {
                        packed.clear();
                        put_maybe_compressed(&mut packed, b, &opts);
                        &packed
                    }
                };
                if let Err(e) = put(&mut file, bytes) {
                    failure = Some(e);
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        put(&mut file, &[op::EOF])?;
        let sum = if checksum { crc.finalize() } else { 0 };
        file.write_all(&sum.to_le_bytes())?;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(written + 8)
    })();
    match result {
        Ok(n) => {
            std::fs::rename(&tmp, path)?;
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(n)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

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

/// Starts a snapshot on this shard: every table gets a sink, and a task writes the tables
/// a little per pass until they are done. Returns the shard's write counter at the cut.
fn begin_on_shard(w: &Rc<Worker>, to_writer: &mpsc::Sender<Vec<Piece>>, opts: Options) -> u64 {
    let mut sh = w.shard.borrow_mut();
    for (db, d) in sh.dbs.iter_mut().enumerate() {
        d.table.begin_snapshot(Box::new(DbSink {
            db,
            raw: Vec::new(),
            pieces: Vec::new(),
            held: 0,
            to_writer: to_writer.clone(),
            opts,
        }));
    }
    let w = w.clone();
    tokio::task::spawn_local(async move {
        loop {
            let started = Instant::now();
            let mut running = false;
            {
                let mut sh = w.shard.borrow_mut();
                for d in sh.dbs.iter_mut() {
                    while d.table.snapshot_running() && started.elapsed() < STEP_BUDGET {
                        // The sink handed back at the end is dropped: its last chunk goes out.
                        d.table.snapshot_step(8);
                    }
                    running |= d.table.snapshot_running();
                }
            }
            if !running {
                break;
            }
            tokio::task::yield_now().await;
        }
    });
    sh.dirty
}

/// Claims the right to take a snapshot: only one runs at a time.
fn claim(worker: &Worker) -> Result<(), String> {
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
    let cut = cut(worker).await?;
    finish(worker, cut).await
}

/// Takes a snapshot whose file is written in the background. Returns once the cut is
/// made, so a write the caller sends after the reply is not in the file (as after
/// Redis's fork); fails at once if a snapshot is running.
pub async fn bgsave(worker: &Rc<Worker>) -> Result<(), String> {
    claim(worker)?;
    let cut = cut(worker).await?;
    let w = worker.clone();
    tokio::task::spawn_local(async move {
        let _ = finish(&w, cut).await;
    });
    Ok(())
}

/// A snapshot whose cut is made and whose file is being written.
struct Cut {
    started: Instant,
    path: PathBuf,
    /// Each shard's write counter at the cut.
    dirty: Vec<u64>,
    written: oneshot::Receiver<std::io::Result<u64>>,
}

/// Starts the writer thread and makes the cut (see the module comment).
async fn cut(worker: &Rc<Worker>) -> Result<Cut, String> {
    let state = &worker.shared.persist;
    let started = Instant::now();
    state
        .bgsave_started_unix
        .store(unix_ms() / 1000, Ordering::Relaxed);
    let path = rdb_path(worker);
    let (opts, checksum) = write_options(worker);
    let (to_writer, chunks) = mpsc::channel::<Vec<Piece>>();
    let (done_tx, done_rx) = oneshot::channel();
    let head = header(&opts);
    let writer_path = path.clone();
    let spawned = std::thread::Builder::new()
        .name("kite-rdb-writer".into())
        .spawn(move || {
            let _ = done_tx.send(write_file(&writer_path, head, chunks, checksum, opts));
        });
    if let Err(e) = spawned {
        state.bgsave_in_progress.store(false, Ordering::Release);
        return Err(format!("ERR cannot start the snapshot writer: {e}"));
    }
    let tx = Tx::lock_keys(worker, &[], true).await;
    let dirty = broadcast(worker, move |w| begin_on_shard(w, &to_writer, opts)).await;
    drop(tx);
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
    if words.len() % 2 != 0 {
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
    if state.bgsave_in_progress.load(Ordering::Acquire) {
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
            tokio::time::sleep(Duration::from_millis(5)).await;
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
    tracing::warn!("Kite is now ready to exit, bye bye...");
    std::process::exit(0);
}

/// `save`, waiting for one already running to finish first instead of failing.
async fn save_now(worker: &Rc<Worker>) -> Result<(), String> {
    loop {
        match save(worker).await {
            Err(e) if e.contains("already in progress") => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => return other,
        }
    }
}
