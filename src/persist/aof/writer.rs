//! The AOF writer thread: the only code that writes AOF files.
//!
//! Pieces arrive from the shards in the order the server ran them (a transaction's block
//! is sent while it still holds its locks, a shard's own effects before any lock it grants).
//! The writer appends them to the incremental file with SELECT where the database changes,
//! and makes them durable as `appendfsync` says: under `always` one write and one fsync
//! for everything that arrived meanwhile (group commit), then the barriers that waited for
//! it are released.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::effects::{select_bytes, Piece};
use super::manifest::{self, FileEntry, Manifest, Names};
use super::{AofState, FAULT_FAIL, FAULT_PAUSE, FSYNC_ALWAYS, FSYNC_EVERYSEC};
use crate::shard::Shared;

pub type Done = tokio::sync::oneshot::Sender<Result<(), String>>;

pub enum ToWriter {
    Piece(Piece),
    /// Answered once everything received before it is durable (true) or cannot be (false).
    Barrier(tokio::sync::oneshot::Sender<bool>),
    /// Start logging into this layout (start-up, or `appendonly yes` at its first cut).
    Open {
        names: Names,
        manifest: Manifest,
        /// False while `appendonly yes` waits for its first base: until the base is
        /// complete the manifest on disk (if any) stays as it was.
        persist: bool,
        done: Done,
    },
    /// A rewrite's cut: everything before it belongs to the new base; later effects go to
    /// a new incremental file, listed in the manifest at once.
    Rotate {
        done: Done,
    },
    /// The rewrite's base is complete in `temp`: it becomes the base and the older files go.
    RewriteDone {
        temp: PathBuf,
        rdb: bool,
        done: Done,
    },
    /// `appendonly no`, or SHUTDOWN: write and fsync what is buffered, close the file.
    Close {
        done: Done,
    },
    /// Write and fsync what is buffered (SHUTDOWN with the AOF on).
    Sync {
        done: Done,
    },
    /// Replication: attach or continue a replica, offsets, the master's bytes on a replica.
    Repl(crate::repl::stream::ReplMsg),
}

struct Open {
    names: Names,
    manifest: Manifest,
    file: File,
    len: u64,
    /// The database the file is in; None at the start of a file (Redis writes SELECT first).
    db: Option<usize>,
}

struct Writer {
    shared: Arc<Shared>,
    open: Option<Open>,
    /// Bytes not yet written (kept across a failed write, retried).
    pending: Vec<u8>,
    pending_pieces: u64,
    /// Pieces written to the file but not yet fsynced.
    written_pieces: u64,
    unsynced: bool,
    barriers: Vec<tokio::sync::oneshot::Sender<bool>>,
    last_fsync: Instant,
    last_retry: Instant,
    /// The replication stream and backlog (src/repl/stream.rs).
    stream: crate::repl::stream::Stream,
    last_tick: Instant,
}

pub fn start(shared: Arc<Shared>) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel::<ToWriter>();
    shared.persist.aof.install_sender(tx);
    let state = shared.clone();
    let handle = std::thread::Builder::new()
        .name("kite-aof-writer".into())
        .spawn(move || {
            let mut w = Writer {
                stream: crate::repl::stream::Stream::new(shared.clone()),
                last_tick: Instant::now(),
                shared,
                open: None,
                pending: Vec::with_capacity(1 << 16),
                pending_pieces: 0,
                written_pieces: 0,
                unsynced: false,
                barriers: Vec::new(),
                last_fsync: Instant::now(),
                last_retry: Instant::now(),
            };
            w.run(rx);
        })?;
    state
        .persist
        .aof
        .install_writer_thread(handle.thread().clone());
    Ok(())
}

impl Writer {
    fn state(&self) -> &AofState {
        &self.shared.persist.aof
    }

    fn run(&mut self, rx: mpsc::Receiver<ToWriter>) {
        let mut idle_polls = 0u32;
        loop {
            let always = self.state().policy.load(Ordering::Relaxed) == FSYNC_ALWAYS;
            // Under `always` a reply waits on us: block, so a barrier wakes us at once.
            // Otherwise poll every millisecond while busy, so senders never pay for a
            // wake-up, and block once idle.
            let first = if always || idle_polls > 100 {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            } else {
                // A nap, not a sleep: `send_urgent` cuts it short.
                std::thread::park_timeout(Duration::from_millis(1));
                match rx.try_recv() {
                    Ok(m) => Some(m),
                    Err(mpsc::TryRecvError::Empty) => None,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            };
            match first {
                Some(m) => {
                    idle_polls = 0;
                    self.handle(m);
                    while let Ok(m) = rx.try_recv() {
                        self.handle(m);
                        if self.pending.len() > 4 << 20 {
                            self.write_out();
                        }
                    }
                }
                None => idle_polls = idle_polls.saturating_add(1),
            }
            self.write_out();
            self.make_durable(false);
            self.stream.flush();
            if self.last_tick.elapsed() >= Duration::from_millis(100) {
                self.last_tick = Instant::now();
                self.stream.tick();
            }
        }
    }

    fn handle(&mut self, m: ToWriter) {
        match m {
            ToWriter::Piece(p) => self.append(p),
            ToWriter::Barrier(b) => self.barriers.push(b),
            ToWriter::Open {
                names,
                manifest,
                persist,
                done,
            } => {
                let r = self.open_layout(names, manifest, persist);
                let _ = done.send(r);
            }
            ToWriter::Rotate { done } => {
                let r = self.rotate();
                let _ = done.send(r);
            }
            ToWriter::RewriteDone { temp, rdb, done } => {
                let r = self.install_base(temp, rdb);
                let _ = done.send(r);
            }
            ToWriter::Close { done } => {
                let r = self.sync_now();
                self.open = None;
                let _ = done.send(r);
            }
            ToWriter::Sync { done } => {
                let r = self.sync_now();
                let _ = done.send(r);
            }
            ToWriter::Repl(m) => self.stream.handle(m),
        }
    }

    /// Writes and fsyncs what is buffered, whatever the policy.
    fn sync_now(&mut self) -> Result<(), String> {
        self.write_out();
        self.make_durable(true);
        if self.state().write_ok.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(self.state().error_reply())
        }
    }

    fn append(&mut self, p: Piece) {
        self.pending_pieces += 1;
        self.stream.piece(&p);
        let Some(open) = &mut self.open else {
            // Captured while no file is open (the AOF was just switched off): dropped, as
            // Redis drops its buffer.
            return;
        };
        if open.db != Some(p.start_db) {
            self.pending.extend_from_slice(&select_bytes(p.start_db));
        }
        open.db = Some(p.end_db);
        self.pending.extend_from_slice(&p.bytes);
    }

    /// Writes the pending bytes; on failure cuts the file back to its length before, keeps
    /// the bytes for a retry, and refuses writes until one succeeds.
    fn write_out(&mut self) {
        if self.pending.is_empty() {
            if self.pending_pieces > 0 {
                // Pieces that needed no bytes (no file open).
                self.written_pieces += self.pending_pieces;
                self.pending_pieces = 0;
            }
            return;
        }
        let Some(open) = &mut self.open else {
            self.pending.clear();
            self.written_pieces += self.pending_pieces;
            self.pending_pieces = 0;
            return;
        };
        if !self.shared.persist.aof.write_ok.load(Ordering::Relaxed)
            && self.last_retry.elapsed() < Duration::from_secs(1)
        {
            return;
        }
        match open.file.write_all(&self.pending) {
            Ok(()) => {
                let n = self.pending.len() as u64;
                open.len += n;
                let st = &self.shared.persist.aof;
                st.offset.fetch_add(n, Ordering::Relaxed);
                st.current_size.fetch_add(n, Ordering::Relaxed);
                self.pending.clear();
                self.written_pieces += self.pending_pieces;
                self.pending_pieces = 0;
                self.unsynced = true;
            }
            Err(e) => {
                let _ = open.file.set_len(open.len);
                self.last_retry = Instant::now();
                self.fail(format!("{e}"));
            }
        }
    }

    fn fsync(&mut self) -> std::io::Result<()> {
        let Some(open) = &self.open else {
            return Ok(());
        };
        loop {
            match self.shared.persist.aof.fault.load(Ordering::Relaxed) {
                FAULT_PAUSE => std::thread::sleep(Duration::from_millis(1)),
                FAULT_FAIL => return Err(std::io::Error::from_raw_os_error(libc::EIO)),
                _ => break,
            }
        }
        open.file.sync_data()
    }

    /// Makes written pieces durable as the policy says and answers the barriers.
    fn make_durable(&mut self, force: bool) {
        let policy = self.state().policy.load(Ordering::Relaxed);
        let ok_before = self.state().write_ok.load(Ordering::Relaxed);
        let want_fsync = self.unsynced
            && (force
                || policy == FSYNC_ALWAYS
                || (policy == FSYNC_EVERYSEC
                    && self.last_fsync.elapsed() >= Duration::from_secs(1))
                || (!ok_before && self.last_retry.elapsed() >= Duration::from_secs(1)));
        if want_fsync {
            match self.fsync() {
                Ok(()) => {
                    self.unsynced = false;
                    self.last_fsync = Instant::now();
                    if !ok_before && self.pending.is_empty() {
                        self.recovered();
                    }
                }
                Err(e) => {
                    self.last_retry = Instant::now();
                    self.fail(format!("{e}"));
                }
            }
        } else if !ok_before
            && !self.unsynced
            && self.pending.is_empty()
            && self.last_retry.elapsed() >= Duration::from_secs(1)
        {
            // A failed write that has since gone through and needed no fsync.
            self.recovered();
        }
        let ok = self.state().write_ok.load(Ordering::Relaxed);
        let covered = if policy == FSYNC_ALWAYS {
            !self.unsynced && self.pending.is_empty()
        } else {
            self.pending.is_empty()
        };
        if ok && covered {
            self.state()
                .durable
                .store(self.written_pieces, Ordering::SeqCst);
            for b in self.barriers.drain(..) {
                let _ = b.send(true);
            }
        } else if !ok {
            for b in self.barriers.drain(..) {
                let _ = b.send(false);
            }
        }
    }

    fn fail(&mut self, e: String) {
        let st = &self.shared.persist.aof;
        if st.write_ok.swap(false, Ordering::AcqRel) {
            tracing::warn!("Error writing to the AOF file: {e}");
        }
        *st.last_error.lock().expect("aof error lock") = e;
        self.shared.persist.refresh_gate(&self.shared);
    }

    fn recovered(&mut self) {
        let st = &self.shared.persist.aof;
        st.write_ok.store(true, Ordering::Release);
        tracing::warn!("AOF write error looks solved, Kite can write again.");
        self.shared.persist.refresh_gate(&self.shared);
    }

    /// Opens an incremental file for appending; `fresh` empties a stale one of that name.
    fn open_incr(names: &Names, seq: u64, fresh: bool) -> std::io::Result<(File, u64)> {
        let path = names.dir.join(names.incr(seq));
        if fresh {
            File::create(&path)?;
        }
        let f = OpenOptions::new().create(true).append(true).open(&path)?;
        let len = f.metadata()?.len();
        Ok((f, len))
    }

    fn open_layout(
        &mut self,
        names: Names,
        mut manifest: Manifest,
        persist: bool,
    ) -> Result<(), String> {
        self.write_out();
        self.make_durable(true);
        let fresh = manifest.incrs.is_empty();
        let seq = if fresh {
            let seq = manifest.last_incr_seq() + 1;
            manifest.incrs.push(FileEntry {
                name: names.incr(seq),
                seq,
            });
            seq
        } else {
            manifest.incrs.last().map_or(1, |e| e.seq)
        };
        let (file, len) = Self::open_incr(&names, seq, fresh).map_err(|e| {
            format!(
                "can't open the append only file {}: {e}",
                names.dir.join(names.incr(seq)).display()
            )
        })?;
        if persist {
            manifest::persist(&names, &manifest)
                .map_err(|e| format!("can't write the AOF manifest: {e}"))?;
        }
        self.refresh_sizes(&names, &manifest);
        self.open = Some(Open {
            names,
            manifest,
            file,
            len,
            db: None,
        });
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), String> {
        self.write_out();
        self.make_durable(true);
        let Some(open) = &mut self.open else {
            return Err("the AOF is not open".into());
        };
        let seq = open.manifest.last_incr_seq() + 1;
        let (file, len) = Self::open_incr(&open.names, seq, true).map_err(|e| format!("{e}"))?;
        open.manifest.incrs.push(FileEntry {
            name: open.names.incr(seq),
            seq,
        });
        manifest::persist(&open.names, &open.manifest).map_err(|e| format!("{e}"))?;
        open.file = file;
        open.len = len;
        open.db = None;
        Ok(())
    }

    fn install_base(&mut self, temp: PathBuf, rdb: bool) -> Result<(), String> {
        let Some(open) = &mut self.open else {
            let _ = std::fs::remove_file(&temp);
            return Err("the AOF is not open".into());
        };
        let seq = open.manifest.base_seq() + 1;
        let name = open.names.base(seq, rdb);
        std::fs::rename(&temp, open.names.dir.join(&name)).map_err(|e| format!("{e}"))?;
        let mut next = open.manifest.clone();
        let mut old = Vec::new();
        if let Some(b) = next.base.take() {
            old.push(b);
        }
        // Every increment but the one opened at the cut is now in the base.
        let keep = next.incrs.pop();
        old.append(&mut next.incrs);
        old.append(&mut next.history);
        next.incrs.extend(keep);
        next.base = Some(FileEntry { name, seq });
        manifest::persist(&open.names, &next).map_err(|e| format!("{e}"))?;
        for f in &old {
            let _ = std::fs::remove_file(open.names.dir.join(&f.name));
        }
        open.manifest = next;
        let (names, manifest) = (
            Names {
                dir: open.names.dir.clone(),
                stem: open.names.stem.clone(),
            },
            open.manifest.clone(),
        );
        self.refresh_sizes(&names, &manifest);
        Ok(())
    }

    fn refresh_sizes(&self, names: &Names, m: &Manifest) {
        let size = |e: &FileEntry| {
            std::fs::metadata(names.dir.join(&e.name))
                .map(|md| md.len())
                .unwrap_or(0)
        };
        let base = m.base.as_ref().map_or(0, size);
        let total = base + m.incrs.iter().map(size).sum::<u64>();
        let st = &self.shared.persist.aof;
        st.base_size.store(base, Ordering::Relaxed);
        st.current_size.store(total, Ordering::Relaxed);
    }
}
