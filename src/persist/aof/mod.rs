//! The append-only file: one ordered stream of effects for the whole server, in Redis 7's
//! multi-part layout (`appenddirname/`, its manifest, a base file and incremental files).
//!
//! Owns the AOF files and the stream's byte offset. Shards only append effects to their
//! own buffer (`effects`) and hand finished pieces to the writer thread (`writer`), which
//! alone touches the files; the connection's write barrier (`appendfsync always`) waits on
//! the writer's durable count. It never touches a shard's data: the base file of a
//! rewrite comes from the snapshot machinery, and replay at start-up runs commands through
//! the ordinary command path (`replay`). See docs/persistence.md.

pub mod effects;
pub mod manifest;
pub mod propagate;
pub mod replay;
pub mod resp_base;
pub mod rewrite;
pub mod writer;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};

pub use effects::{Effects, Piece};
use writer::ToWriter;

pub const FSYNC_ALWAYS: u8 = 0;
pub const FSYNC_EVERYSEC: u8 = 1;
pub const FSYNC_NO: u8 = 2;

pub fn policy_code(name: &str) -> u8 {
    match name {
        "always" => FSYNC_ALWAYS,
        "no" => FSYNC_NO,
        _ => FSYNC_EVERYSEC,
    }
}

/// The fsync fault hook of `DEBUG AOF-FSYNC-FAULT` (tests only, behind
/// enable-debug-command).
pub const FAULT_OFF: u8 = 0;
pub const FAULT_PAUSE: u8 = 1;
pub const FAULT_FAIL: u8 = 2;

/// What every thread may read about the AOF. The command path reads `on` (one relaxed
/// load per write) and, under `always`, `started`/`durable`.
pub struct AofState {
    /// The AOF files are written: `appendonly yes` and the start-up load is over.
    pub on: AtomicBool,
    /// A replication backlog exists: effects feed it even with the AOF off.
    pub repl: AtomicBool,
    pub policy: AtomicU8,
    /// Pieces handed to the writer, counted before each is sent.
    pub started: AtomicU64,
    /// Pieces the writer has made durable under the current policy (fsynced under
    /// `always`, written otherwise), or given up on.
    pub durable: AtomicU64,
    /// False after a failed write or fsync, until one succeeds again.
    pub write_ok: AtomicBool,
    pub last_error: Mutex<String>,
    pub fault: AtomicU8,
    pub rewrite_in_progress: AtomicBool,
    pub rewrite_scheduled: AtomicBool,
    pub rewrite_started_unix: AtomicU64,
    pub last_rewrite_secs: AtomicI64,
    pub last_rewrite_ok: AtomicBool,
    pub rewrites: AtomicU64,
    /// Bytes in the base file and in the whole AOF (base and increments).
    pub base_size: AtomicU64,
    pub current_size: AtomicU64,
    /// The stream's byte offset: every effect byte ever written.
    pub offset: AtomicU64,
    /// `current_size` after the last rewrite or load: the reference of
    /// auto-aof-rewrite-percentage.
    pub rewrite_base_size: AtomicU64,
    sender: OnceLock<Mutex<mpsc::Sender<ToWriter>>>,
    /// The writer thread, to wake it from its between-polls nap for a message someone
    /// waits on (WAIT's offset, a GETACK).
    writer_thread: OnceLock<std::thread::Thread>,
}

impl Default for AofState {
    fn default() -> Self {
        AofState {
            on: AtomicBool::new(false),
            repl: AtomicBool::new(false),
            policy: AtomicU8::new(FSYNC_EVERYSEC),
            started: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            write_ok: AtomicBool::new(true),
            last_error: Mutex::new(String::new()),
            fault: AtomicU8::new(FAULT_OFF),
            rewrite_in_progress: AtomicBool::new(false),
            rewrite_scheduled: AtomicBool::new(false),
            rewrite_started_unix: AtomicU64::new(0),
            last_rewrite_secs: AtomicI64::new(-1),
            last_rewrite_ok: AtomicBool::new(true),
            rewrites: AtomicU64::new(0),
            base_size: AtomicU64::new(0),
            current_size: AtomicU64::new(0),
            offset: AtomicU64::new(0),
            rewrite_base_size: AtomicU64::new(0),
            sender: OnceLock::new(),
            writer_thread: OnceLock::new(),
        }
    }
}

thread_local! {
    /// Each thread's own handle on the writer's channel, cloned once.
    static SENDER: std::cell::OnceCell<mpsc::Sender<ToWriter>> = const { std::cell::OnceCell::new() };
}

impl AofState {
    /// Whether writes must capture their effects: for the files, the replication stream,
    /// or both.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed) || self.repl.load(Ordering::Relaxed)
    }

    /// Whether the AOF files themselves are written (`appendonly yes`).
    pub fn file_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub fn install_sender(&self, tx: mpsc::Sender<ToWriter>) {
        let _ = self.sender.set(Mutex::new(tx));
    }

    pub fn send(&self, msg: ToWriter) {
        SENDER.with(|s| {
            let tx = s.get_or_init(|| {
                self.sender
                    .get()
                    .expect("the AOF writer starts before any thread sends to it")
                    .lock()
                    .expect("sender lock")
                    .clone()
            });
            // The writer only stops with the process.
            let _ = tx.send(msg);
        });
    }

    pub fn install_writer_thread(&self, t: std::thread::Thread) {
        let _ = self.writer_thread.set(t);
    }

    /// Sends a message someone is waiting on: the writer handles it now rather than at
    /// its next poll.
    pub fn send_urgent(&self, msg: ToWriter) {
        self.send(msg);
        if let Some(t) = self.writer_thread.get() {
            t.unpark();
        }
    }

    /// Hands a piece of effects to the writer.
    pub fn send_piece(&self, piece: Piece) {
        if piece.bytes.is_empty() {
            return;
        }
        self.started.fetch_add(1, Ordering::SeqCst);
        self.send(ToWriter::Piece(piece));
    }

    /// Whether every piece handed over so far is durable: then a reply needs no wait.
    pub fn all_durable(&self) -> bool {
        self.durable.load(Ordering::SeqCst) == self.started.load(Ordering::SeqCst)
    }

    pub fn always(&self) -> bool {
        self.policy.load(Ordering::Relaxed) == FSYNC_ALWAYS
    }

    pub fn error_reply(&self) -> String {
        let e = self.last_error.lock().expect("aof error lock").clone();
        format!("MISCONF Errors writing to the AOF file: {e}")
    }
}

/// Mirrors `appendfsync` into the state the writer and the connections read.
pub fn refresh_settings(shared: &crate::shard::Shared) {
    let policy = policy_code(
        shared
            .config
            .lock()
            .expect("config lock")
            .get("appendfsync"),
    );
    shared.persist.aof.policy.store(policy, Ordering::Relaxed);
}

/// Waits until everything handed to the writer before this call is durable (the write
/// barrier of `appendfsync always`). False when the writer could not make it so.
pub async fn barrier(state: &AofState) -> bool {
    if state.all_durable() {
        return true;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    state.send(ToWriter::Barrier(tx));
    rx.await.unwrap_or(false)
}
