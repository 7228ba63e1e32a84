//! Replication: Redis's protocol as a master (`master`: PSYNC/SYNC, the feeds, WAIT) and
//! as a replica (`replica`: the link to a master and the stream it applies), with the
//! backlog and offset kept by the AOF writer thread (`stream`). See docs/replication.md.
//!
//! Owns the replication ids, offsets, the backlog and the links to other servers. It
//! never touches a shard's data: a full sync reads the dataset through the snapshot
//! machinery, and a replica applies its master's stream through the ordinary command
//! path.

pub mod backlog;
pub mod failover;
pub mod master;
pub mod replica;
pub mod stream;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::shard::{unix_ms, Shared};

/// A replica attached to this server, as INFO, ROLE and WAIT see it.
pub struct ReplicaEntry {
    pub client_id: u64,
    pub ip: String,
    /// The port it announced with `REPLCONF listening-port`.
    pub port: AtomicU64,
    pub state: AtomicU8,
    /// Its last `REPLCONF ACK`, and the AOF offset of its `FACK`.
    pub ack_offset: AtomicU64,
    pub fack_offset: AtomicU64,
    pub last_ack_ms: AtomicU64,
}

pub const REPLICA_WAIT_BGSAVE: u8 = 0;
pub const REPLICA_SEND_BULK: u8 = 1;
pub const REPLICA_ONLINE: u8 = 2;

impl ReplicaEntry {
    pub fn state_name(&self) -> &'static str {
        match self.state.load(Ordering::Relaxed) {
            REPLICA_WAIT_BGSAVE => "wait_bgsave",
            REPLICA_SEND_BULK => "send_bulk",
            _ => "online",
        }
    }
}

/// The replica side's link state (`master_link_status` and friends).
pub const LINK_NONE: u8 = 0;
pub const LINK_CONNECT: u8 = 1;
pub const LINK_CONNECTING: u8 = 2;
pub const LINK_HANDSHAKE: u8 = 3;
pub const LINK_SYNC: u8 = 4;
pub const LINK_CONNECTED: u8 = 5;

/// The master this server follows, when it is a replica.
#[derive(Clone)]
pub struct MasterAddr {
    pub host: String,
    pub port: u16,
}

/// Ids and offsets: which history this server's dataset belongs to.
#[derive(Clone)]
pub struct Ids {
    pub replid: String,
    pub replid2: String,
    /// The first offset `replid2` no longer covers (-1: none).
    pub second_offset: i64,
}

/// Replication state every thread may read. The command path reads `replica` and
/// `gate_*` alone (relaxed loads); the mutexes are taken by INFO, ROLE, REPLICAOF and
/// when a replica attaches or leaves, never per command.
pub struct ReplState {
    /// This server follows a master.
    pub replica: AtomicBool,
    pub master: Mutex<Option<MasterAddr>>,
    pub ids: Mutex<Ids>,
    /// `master_repl_offset`: the stream's offset (written by the writer thread on a
    /// master, by the link as it applies on a replica).
    pub offset: AtomicU64,
    /// Bytes of the stream read from the master (`slave_read_repl_offset`).
    pub read_offset: AtomicU64,
    pub backlog_active: AtomicBool,
    pub backlog_first: AtomicU64,
    pub backlog_histlen: AtomicU64,
    pub replicas: Mutex<Vec<Arc<ReplicaEntry>>>,
    pub link: AtomicU8,
    pub link_down_since_ms: AtomicU64,
    pub last_io_ms: AtomicU64,
    /// Bumped by every REPLICAOF: a link task whose generation is stale stops.
    pub generation: AtomicU64,
    pub sync_full: AtomicU64,
    pub sync_partial_ok: AtomicU64,
    pub sync_partial_err: AtomicU64,
    /// Replicas whose last ACK is within `min-replicas-max-lag` (refreshed each second).
    pub good_replicas: AtomicI64,
    /// The master link's client id on this server (CLIENT KILL TYPE master).
    pub master_client_id: AtomicU64,
    /// Held by a replica's link while it applies a run of commands and passes their
    /// bytes on, and by a full sync of a replica of this replica around its cut: so a
    /// cut never falls between a command applied and its bytes passed on (which would put
    /// the command in both the snapshot and the stream after it). A sequencing token
    /// between two tasks, not a lock on data: uncontended except during such a sync.
    pub apply_gate: tokio::sync::Mutex<()>,
    /// FAILOVER's state (`failover::NONE`...), an ABORT request, whether the link's PSYNC
    /// says FAILOVER, and its outcome (0 pending, 1 accepted, 2 refused).
    pub failover_state: AtomicU8,
    pub failover_abort: AtomicBool,
    pub failover_psync: AtomicBool,
    pub failover_result: AtomicU8,
    /// Woken at each replica ACK, for WAIT and WAITAOF.
    pub acked: tokio::sync::Notify,
    /// The last FACK a replica sent its master: the offset its AOF holds durably.
    pub fack_sent: AtomicU64,
    /// The database the master's stream was in when the link ended (a partial resync
    /// goes on in it).
    pub last_db: AtomicU64,
    // Settings mirrored from the configuration (`refresh_settings`).
    pub read_only: AtomicBool,
    pub serve_stale: AtomicBool,
    pub min_replicas: AtomicI64,
    pub min_lag: AtomicI64,
    pub backlog_size: AtomicU64,
    pub ping_period_s: AtomicU64,
    pub obuf_hard: AtomicU64,
    pub obuf_soft: AtomicU64,
    pub obuf_soft_secs: AtomicU64,
}

impl Default for ReplState {
    fn default() -> Self {
        ReplState {
            replica: AtomicBool::new(false),
            master: Mutex::new(None),
            ids: Mutex::new(Ids {
                replid: random_id(),
                replid2: "0".repeat(40),
                second_offset: -1,
            }),
            offset: AtomicU64::new(0),
            read_offset: AtomicU64::new(0),
            backlog_active: AtomicBool::new(false),
            backlog_first: AtomicU64::new(0),
            backlog_histlen: AtomicU64::new(0),
            replicas: Mutex::new(Vec::new()),
            link: AtomicU8::new(LINK_NONE),
            link_down_since_ms: AtomicU64::new(0),
            last_io_ms: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            sync_full: AtomicU64::new(0),
            sync_partial_ok: AtomicU64::new(0),
            sync_partial_err: AtomicU64::new(0),
            good_replicas: AtomicI64::new(0),
            master_client_id: AtomicU64::new(0),
            last_db: AtomicU64::new(0),
            apply_gate: tokio::sync::Mutex::new(()),
            fack_sent: AtomicU64::new(0),
            acked: tokio::sync::Notify::new(),
            failover_state: AtomicU8::new(0),
            failover_abort: AtomicBool::new(false),
            failover_psync: AtomicBool::new(false),
            failover_result: AtomicU8::new(0),
            read_only: AtomicBool::new(true),
            serve_stale: AtomicBool::new(true),
            min_replicas: AtomicI64::new(0),
            min_lag: AtomicI64::new(10),
            backlog_size: AtomicU64::new(1 << 20),
            ping_period_s: AtomicU64::new(10),
            obuf_hard: AtomicU64::new(256 << 20),
            obuf_soft: AtomicU64::new(64 << 20),
            obuf_soft_secs: AtomicU64::new(60),
        }
    }
}

impl ReplState {
    #[inline]
    pub fn is_replica(&self) -> bool {
        self.replica.load(Ordering::Relaxed)
    }

    pub fn ids(&self) -> Ids {
        self.ids.lock().expect("repl ids lock").clone()
    }

    pub fn replicas(&self) -> Vec<Arc<ReplicaEntry>> {
        self.replicas.lock().expect("replicas lock").clone()
    }

    pub fn link_up(&self) -> bool {
        self.link.load(Ordering::Relaxed) == LINK_CONNECTED
    }
}

/// 40 random hex characters: a replication id or a run id.
pub fn random_id() -> String {
    let mut bytes = [0u8; 20];
    fill_random(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn fill_random(buf: &mut [u8]) {
    use std::io::Read;
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .is_ok();
    if !ok {
        // No /dev/urandom: the clock and the pid still make ids that differ per run.
        let mut x = unix_ms() ^ ((std::process::id() as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15;
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
}

/// Whether writes from clients are refused now, and with which error; None when they
/// are allowed. Checked only when the persistence gate says replication may refuse.
pub fn write_refusal(shared: &Shared) -> Option<&'static str> {
    let r = &shared.repl;
    if r.is_replica() && r.read_only.load(Ordering::Relaxed) {
        return Some("READONLY You can't write against a read only replica.");
    }
    let min = r.min_replicas.load(Ordering::Relaxed);
    if !r.is_replica()
        && min > 0
        && r.min_lag.load(Ordering::Relaxed) > 0
        && r.good_replicas.load(Ordering::Relaxed) < min
    {
        return Some("NOREPLICAS Not enough good replicas to write.");
    }
    None
}

/// `repl-timeout`: how long a link may stay silent (or a write to it stuck) before it is
/// given up.
pub fn timeout(shared: &Shared) -> std::time::Duration {
    let secs = shared
        .config
        .lock()
        .expect("config lock")
        .get_i64("repl-timeout");
    std::time::Duration::from_secs(secs.max(1) as u64)
}

pub const MASTERDOWN_ERR: &str =
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.";

/// Whether data commands are refused because the link is down and stale data must not
/// be served.
pub fn stale_refused(shared: &Shared) -> bool {
    let r = &shared.repl;
    r.is_replica() && !r.link_up() && !r.serve_stale.load(Ordering::Relaxed)
}

/// Whether the command path must consult replication before a command: this server is a
/// replica, or `min-replicas-to-write` is set.
pub fn gate_wanted(shared: &Shared) -> bool {
    let r = &shared.repl;
    r.is_replica()
        || (r.min_replicas.load(Ordering::Relaxed) > 0 && r.min_lag.load(Ordering::Relaxed) > 0)
}

/// Mirrors the replication settings the command path reads into atomics.
pub fn refresh_settings(shared: &Shared) {
    {
        let c = shared.config.lock().expect("config lock");
        let r = &shared.repl;
        r.read_only
            .store(c.get_bool("replica-read-only"), Ordering::Relaxed);
        r.serve_stale
            .store(c.get_bool("replica-serve-stale-data"), Ordering::Relaxed);
        r.min_replicas
            .store(c.get_i64("min-replicas-to-write"), Ordering::Relaxed);
        r.min_lag
            .store(c.get_i64("min-replicas-max-lag"), Ordering::Relaxed);
        r.backlog_size.store(
            c.get_i64("repl-backlog-size").max(16 * 1024) as u64,
            Ordering::Relaxed,
        );
        r.ping_period_s.store(
            c.get_i64("repl-ping-replica-period").max(1) as u64,
            Ordering::Relaxed,
        );
        let (hard, soft, secs) = replica_buffer_limit(c.get("client-output-buffer-limit"));
        r.obuf_hard.store(hard, Ordering::Relaxed);
        r.obuf_soft.store(soft, Ordering::Relaxed);
        r.obuf_soft_secs.store(secs, Ordering::Relaxed);
    }
    shared.persist.refresh_gate(shared);
}

/// The `replica` (or `slave`) class of `client-output-buffer-limit`: hard, soft, seconds.
fn replica_buffer_limit(setting: &str) -> (u64, u64, u64) {
    crate::config::output_buffer_class(setting, "replica").unwrap_or((256 << 20, 64 << 20, 60))
}

/// Once a second on thread 0: counts the replicas that acknowledged recently enough for
/// `min-replicas-to-write`.
pub fn cron(shared: &Arc<Shared>) {
    let lag = shared.repl.min_lag.load(Ordering::Relaxed).max(0) as u64;
    let now = unix_ms();
    let good = shared
        .repl
        .replicas()
        .iter()
        .filter(|r| {
            r.state.load(Ordering::Relaxed) == REPLICA_ONLINE
                && now.saturating_sub(r.last_ack_ms.load(Ordering::Relaxed)) / 1000 <= lag
        })
        .count();
    shared
        .repl
        .good_replicas
        .store(good as i64, Ordering::Relaxed);
    shared.persist.refresh_gate(shared);
}

/// INFO's replication section, with Redis's field names and order.
pub fn info_section(shared: &Shared) -> String {
    use std::fmt::Write;
    let r = &shared.repl;
    let ids = r.ids();
    let now = unix_ms();
    let mut s = String::from("# Replication\r\n");
    let offset = r.offset.load(Ordering::Relaxed);
    if r.is_replica() {
        let m = r.master.lock().expect("master lock").clone();
        let (host, port) = m.map_or((String::new(), 0), |m| (m.host, m.port));
        let link = r.link.load(Ordering::Relaxed);
        let up = link == LINK_CONNECTED;
        let last_io = r.last_io_ms.load(Ordering::Relaxed);
        let (ro, prio, announced) = {
            let c = shared.config.lock().expect("config lock");
            (
                c.get_bool("replica-read-only") as u8,
                c.get_i64("replica-priority"),
                c.get_bool("replica-announced") as u8,
            )
        };
        let _ = write!(
            s,
            "role:slave\r\nmaster_host:{host}\r\nmaster_port:{port}\r\nmaster_link_status:{}\r\nmaster_last_io_seconds_ago:{}\r\nmaster_sync_in_progress:{}\r\nslave_read_repl_offset:{}\r\nslave_repl_offset:{offset}\r\n",
            if up { "up" } else { "down" },
            if up { (now.saturating_sub(last_io) / 1000) as i64 } else { -1 },
            (link == LINK_SYNC) as u8,
            r.read_offset.load(Ordering::Relaxed).max(offset),
        );
        if !up {
            let since = r.link_down_since_ms.load(Ordering::Relaxed);
            let secs = if since == 0 {
                -1
            } else {
                (now.saturating_sub(since) / 1000) as i64
            };
            let _ = write!(s, "master_link_down_since_seconds:{secs}\r\n");
        }
        let _ = write!(
            s,
            "slave_priority:{prio}\r\nslave_read_only:{ro}\r\nreplica_announced:{announced}\r\n"
        );
    } else {
        s.push_str("role:master\r\n");
    }
    let replicas: Vec<_> = r.replicas().into_iter().collect();
    let _ = write!(s, "connected_slaves:{}\r\n", replicas.len());
    for (i, e) in replicas.iter().enumerate() {
        let lag = now.saturating_sub(e.last_ack_ms.load(Ordering::Relaxed)) / 1000;
        let _ = write!(
            s,
            "slave{i}:ip={},port={},state={},offset={},lag={lag}\r\n",
            e.ip,
            e.port.load(Ordering::Relaxed),
            e.state_name(),
            e.ack_offset.load(Ordering::Relaxed),
        );
    }
    let min = r.min_replicas.load(Ordering::Relaxed);
    if min > 0 && r.min_lag.load(Ordering::Relaxed) > 0 {
        let _ = write!(
            s,
            "min_slaves_good_slaves:{}\r\n",
            r.good_replicas.load(Ordering::Relaxed)
        );
    }
    let active = r.backlog_active.load(Ordering::Relaxed);
    let _ = write!(
        s,
        "master_failover_state:{}\r\nmaster_replid:{}\r\nmaster_replid2:{}\r\nmaster_repl_offset:{offset}\r\nsecond_repl_offset:{}\r\nrepl_backlog_active:{}\r\nrepl_backlog_size:{}\r\nrepl_backlog_first_byte_offset:{}\r\nrepl_backlog_histlen:{}\r\n\r\n",
        failover::state_name(r.failover_state.load(Ordering::Relaxed)),
        ids.replid,
        ids.replid2,
        ids.second_offset,
        active as u8,
        r.backlog_size.load(Ordering::Relaxed),
        if active { r.backlog_first.load(Ordering::Relaxed) } else { 0 },
        if active { r.backlog_histlen.load(Ordering::Relaxed) } else { 0 },
    );
    s
}
