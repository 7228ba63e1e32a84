//! Persistence: the RDB codec, snapshots and the append-only file.
//!
//! Owns every data file Kite reads or writes (`dump.rdb`, DUMP payloads, the AOF). It reads the
//! keyspace only through a shard's own thread (a snapshot serializes each shard on that
//! shard's thread); it never touches sockets, the protocol, or another thread's shard.

pub mod aof;
pub mod load;
pub mod rdb;
pub mod rdbfile;
pub mod serialize;
pub mod snapshot;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};

use crate::shard::Shared;

/// Persistence state every thread may read. Only SAVE/BGSAVE, the loader and INFO write
/// it; the command path reads `gate` alone, one relaxed load.
#[derive(Default)]
pub struct State {
    /// A snapshot (BGSAVE, SAVE or an AOF rewrite) is running: one at a time.
    pub bgsave_in_progress: AtomicBool,
    /// BGSAVE SCHEDULE arrived during an AOF rewrite.
    pub bgsave_scheduled: AtomicBool,
    pub bgsave_started_unix: AtomicU64,
    pub last_bgsave_secs: AtomicI64,
    /// False after a failed snapshot, until one succeeds.
    pub last_bgsave_ok: AtomicBool,
    pub last_failed_unix: AtomicU64,
    pub loading: AtomicBool,
    pub loading_started_unix: AtomicU64,
    pub loaded_keys: AtomicU64,
    pub loaded_expired: AtomicU64,
    /// Successful snapshots since start (rdb_saves).
    pub saves: AtomicU64,
    /// Non-zero when commands must be checked against `loading` or MISCONF before running
    /// (`GATE_*`), so the fast paths need one load to know they need not.
    pub gate: AtomicU8,
    pub aof: aof::AofState,
}

pub const GATE_LOADING: u8 = 1;
pub const GATE_MISCONF: u8 = 2;
/// The AOF could not write or fsync: writes are refused until it can.
pub const GATE_AOF: u8 = 4;
/// Replication may refuse a command: a (read-only) replica, a replica whose link is down
/// with `replica-serve-stale-data no`, or `min-replicas-to-write`.
pub const GATE_REPL: u8 = 8;

impl State {
    pub fn new() -> State {
        State {
            last_bgsave_ok: AtomicBool::new(true),
            ..State::default()
        }
    }

    /// Recomputes `gate` from `loading`, the last snapshot's outcome and the settings.
    pub fn refresh_gate(&self, shared: &Shared) {
        let mut gate = 0;
        if self.loading.load(Ordering::Acquire) {
            gate |= GATE_LOADING;
        }
        if !self.last_bgsave_ok.load(Ordering::Relaxed) {
            let c = shared.config.lock().expect("config lock");
            if c.get_bool("stop-writes-on-bgsave-error") && !c.get("save").trim().is_empty() {
                gate |= GATE_MISCONF;
            }
        }
        if self.aof.file_on() && !self.aof.write_ok.load(Ordering::Acquire) {
            gate |= GATE_AOF;
        }
        if crate::repl::gate_wanted(shared) {
            gate |= GATE_REPL;
        }
        self.gate.store(gate, Ordering::Release);
    }

    pub fn gate(&self) -> u8 {
        self.gate.load(Ordering::Relaxed)
    }
}

pub const MISCONF_ERR: &str = "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk. Commands that may modify the data set are disabled, because this instance is configured to report errors during writes if RDB snapshotting fails (stop-writes-on-bgsave-error option). Please check the Redis logs for details about the RDB error.";
pub const LOADING_ERR: &str = "LOADING Redis is loading the dataset in memory";
