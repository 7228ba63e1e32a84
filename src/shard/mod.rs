//! Shards and every interaction between threads.
//!
//! Each worker thread owns one `Worker`: its shard of the keyspace, its lock table, its
//! clients and its counters, all reached through `Rc`/`RefCell` from that thread only.
//! Other threads reach them solely by sending a closure to the thread's mailbox (`hop`).

pub mod clients;
pub mod evict;
pub mod hops;
pub mod locks;
pub mod logs;
pub mod mailbox;
pub mod placement;
pub mod tx;
pub mod watch;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use hashbrown::HashMap;
use tokio::sync::oneshot;

use crate::commands::{Command, ExecFn};
use crate::config::{Config, Tunables};
use crate::protocol::reply::Reply;
use crate::shard::clients::Clients;
use crate::shard::logs::{Logs, SlowEntry};
use crate::types::table::{Entry, Probe, Table};
use crate::types::value::Value;
use locks::{LockKeys, LockTable, Waiting};
use placement::Placement;
use watch::WatchTable;

thread_local! {
    static THREAD_SHARD: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The shard this thread runs, if it is a shard thread.
pub fn current_thread() -> Option<usize> {
    THREAD_SHARD.with(|t| t.get())
}

/// Marks this thread as shard `id`'s (once, at its start).
pub fn set_current_thread(id: usize) {
    THREAD_SHARD.with(|t| t.set(Some(id)));
}

/// Work sent to another thread: runs there with that thread's worker.
pub type Msg = Box<dyn FnOnce(&Rc<Worker>) + Send>;

/// What a thread's mailbox carries: work to run there, a batch of pipelined keyed
/// commands, or a batch's result coming back. Batches are told apart so that a thread
/// busy in a script can answer them with BUSY from its Lua hook instead of leaving their
/// client waiting (`scripting::busy`); other work waits for the script's end. A result
/// travels as itself rather than as a boxed closure: one allocation less per hop.
pub enum Mail {
    Run(Msg),
    Batch(Batch),
    /// A batch's result for the slot it was sent from (`hops`); `None` when the batch
    /// was lost.
    Done(u32, Option<BatchResult>),
}

/// State shared by all threads. Nothing here is keyspace data.
pub struct Shared {
    pub placement: Placement,
    /// CLIENT TRACKING's server-wide state (counts, BCAST prefixes).
    pub tracking: crate::tracking::Global,
    pub mailboxes: OnceLock<Vec<Arc<mailbox::Mailbox>>>,
    /// The full configuration, read and written only by CONFIG and INFO.
    pub config: Mutex<Config>,
    /// Settings read on hot paths, mirrored from `config` as atomics.
    pub tunables: Tunables,
    pub next_client_id: AtomicU64,
    pub next_tx_id: AtomicU64,
    pub connected_clients: AtomicUsize,
    pub monitors: AtomicUsize,
    pub started: Instant,
    pub shutting_down: AtomicBool,
    /// Bytes allocated, refreshed from the allocator a few times a second.
    pub used_memory: AtomicUsize,
    pub peak_memory: AtomicUsize,
    /// Memory in use at the first reading, before any client (MEMORY STATS).
    pub startup_memory: AtomicUsize,
    pub lastsave_unix: AtomicU64,
    pub active_expire: AtomicBool,
    /// 40 hex characters naming this run of the server (INFO's run_id).
    pub run_id: String,
    pub next_slowlog_id: AtomicU64,
    /// Pub/Sub subscriptions held by each thread's connections, so publishers skip
    /// threads with none.
    pub subscriptions: Vec<AtomicUsize>,
    /// Each thread's script state (`scripting::run::BUSY_*`), for BUSY and SCRIPT KILL.
    pub busy: Vec<std::sync::atomic::AtomicU8>,
    /// Whether the script running on each thread has written (SCRIPT KILL refuses then).
    pub busy_wrote: Vec<AtomicBool>,
    /// What the script running on each thread is (`scripting::run::KIND_*`): an FCALL
    /// function (the BUSY text and which KILL stops it depend on it), and whether it
    /// holds other shards (then every keyed command waits on it, so gets BUSY).
    pub busy_kind: Vec<std::sync::atomic::AtomicU8>,
    /// How many threads run a script past the busy threshold: 0 on the hot path.
    pub busy_count: AtomicUsize,
    /// Whether each shard has keys held by transactions or waited for right now
    /// (`!LockTable::tx_idle`, kept by the lock table itself): a hint, read without
    /// ordering, for an EXEC choosing how to reach that shard.
    pub transacting: Vec<Arc<locks::Hint>>,
    /// Synchronous calls from scripts waiting for each thread (see scripting::run). The
    /// mutex guards a queue handed between threads only on scripting's slow paths.
    pub sync_calls: Vec<Mutex<VecDeque<Msg>>>,
    /// Snapshots and loading (`persist::State`).
    pub persist: crate::persist::State,
    /// Replication ids, offsets and links (`repl::ReplState`).
    pub repl: crate::repl::ReplState,
    /// ACL users (`acl::Acl`).
    pub acl: crate::acl::Acl,
    /// New connections for each thread, from the accepting thread. A lock rather than a
    /// message because a thread busy in a script takes them from its Lua hook
    /// (`scripting::busy`), where it cannot run its mailbox; taken once per connection.
    pub inbox: Vec<Mutex<Vec<(std::net::TcpStream, bool)>>>,
    /// Memory held by each thread's client connections (buffers): the sum, and the
    /// largest evictable one, refreshed by its housekeeping, for `maxmemory-clients`.
    pub client_memory: Vec<[AtomicUsize; 2]>,
    /// Clients closed by `maxmemory-clients` (INFO's evicted_clients).
    pub evicted_clients: AtomicU64,
    /// Cluster mode (`cluster-enabled yes`): the slot map and the bus's state.
    pub cluster: Option<Box<crate::cluster::Cluster>>,
}

impl Shared {
    pub fn nshards(&self) -> usize {
        self.placement.nshards()
    }

    /// Sends `msg` to thread `target` at once, after whatever this thread's pass held
    /// back (`mailbox::post`), so its sends arrive in the order they were made.
    pub fn send(&self, target: usize, msg: Msg) {
        mailbox::flush_outbox();
        self.mailbox(target).push(Mail::Run(msg));
    }

    /// Hands a batch's result to the connection on thread `to` that waits for it
    /// (`hops::Ticket::answer`).
    pub fn answer_batch(&self, to: usize, ticket: hops::Ticket, result: BatchResult) {
        ticket.answer(result, crate::shard::current_thread() == Some(to));
    }

    pub fn mailbox(&self, target: usize) -> &Arc<mailbox::Mailbox> {
        &self.mailboxes.get().expect("mailboxes set at start-up")[target]
    }

    /// Completes `tx` with `value` on thread `to`, where its receiver waits: through that
    /// thread's mailbox, so a busy thread is not woken for it (a cross-thread send on the
    /// channel itself would write to its eventfd every time).
    pub fn answer<T: Send + 'static>(&self, to: usize, tx: oneshot::Sender<T>, value: T) {
        if crate::shard::current_thread() == Some(to) {
            let _ = tx.send(value);
            return;
        }
        self.send(
            to,
            Box::new(move |_| {
                let _ = tx.send(value);
            }),
        );
    }

    /// A standalone `Shared` for unit tests.
    #[cfg(test)]
    pub fn for_tests(nshards: usize) -> Arc<Shared> {
        let config = Config::default();
        Arc::new(Shared {
            tracking: Default::default(),
            placement: Placement::new(nshards, None),
            mailboxes: OnceLock::new(),
            tunables: Tunables::new(&config),
            config: Mutex::new(config),
            next_client_id: AtomicU64::new(1),
            next_tx_id: AtomicU64::new(1),
            connected_clients: AtomicUsize::new(0),
            monitors: AtomicUsize::new(0),
            started: Instant::now(),
            shutting_down: AtomicBool::new(false),
            used_memory: AtomicUsize::new(0),
            startup_memory: AtomicUsize::new(0),
            peak_memory: AtomicUsize::new(0),
            lastsave_unix: AtomicU64::new(0),
            active_expire: AtomicBool::new(true),
            run_id: "0".repeat(40),
            next_slowlog_id: AtomicU64::new(0),
            subscriptions: (0..nshards).map(|_| AtomicUsize::new(0)).collect(),
            busy: (0..nshards).map(|_| Default::default()).collect(),
            busy_wrote: (0..nshards).map(|_| AtomicBool::new(false)).collect(),
            busy_kind: (0..nshards).map(|_| Default::default()).collect(),
            busy_count: AtomicUsize::new(0),
            transacting: (0..nshards).map(|_| Default::default()).collect(),
            sync_calls: crate::scripting::run::sync_queues(nshards),
            persist: crate::persist::State::new(),
            repl: crate::repl::ReplState::default(),
            acl: crate::acl::Acl::new(),
            inbox: (0..nshards).map(|_| Mutex::new(Vec::new())).collect(),
            client_memory: (0..nshards).map(|_| Default::default()).collect(),
            evicted_clients: AtomicU64::new(0),
            cluster: None,
        })
    }

    /// Memory use is past `maxmemory` (0: no limit): commands that grow memory are refused.
    pub fn over_maxmemory(&self) -> bool {
        let max = self.tunables.maxmemory.load(Ordering::Relaxed);
        max > 0 && self.used_memory.load(Ordering::Relaxed) as u64 > max
    }

    pub fn uptime_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

pub use crate::clock::{unix_ms, unix_us};

/// Everything one thread owns.
pub struct Worker {
    pub id: usize,
    pub shared: Arc<Shared>,
    pub shard: RefCell<Shard>,
    pub clients: RefCell<Clients>,
    /// This thread's mailbox (other threads push, this one takes).
    pub mailbox: Arc<mailbox::Mailbox>,
    /// Mail taken out of the mailbox and not yet run, in arrival order: the rest of the
    /// loop's last take, and what a busy script's hook set aside for after the script. It
    /// runs before anything newer.
    pub deferred: RefCell<VecDeque<Mail>>,
}

impl Worker {
    pub fn nshards(&self) -> usize {
        self.shared.nshards()
    }

    #[inline]
    pub fn shard_of(&self, key: &[u8]) -> usize {
        self.shared.placement.shard_of(key)
    }
}

/// Runs `f` on shard `target`'s thread and returns its result: a direct call when the
/// target is this thread, else one message there and one reply back.
pub async fn hop<R, F>(worker: &Rc<Worker>, target: usize, f: F) -> R
where
    R: Send + 'static,
    F: FnOnce(&Rc<Worker>) -> R + Send + 'static,
{
    if target == worker.id {
        return f(worker);
    }
    hop_send(worker, target, f)
        .await
        .expect("shard thread stopped")
}

/// Sends `f` to run on `target` and returns the receiver of its result at once, so that
/// several threads can be asked together (on this thread, it runs now).
pub fn hop_send<R, F>(worker: &Rc<Worker>, target: usize, f: F) -> oneshot::Receiver<R>
where
    R: Send + 'static,
    F: FnOnce(&Rc<Worker>) -> R + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    if target == worker.id {
        let _ = tx.send(f(worker));
        return rx;
    }
    worker.shard.borrow_mut().stats.hops += 1;
    let from = worker.id;
    worker.shared.send(
        target,
        Box::new(move |w| {
            let r = f(w);
            w.shared.answer(from, tx, r);
        }),
    );
    rx
}

/// Runs `f` on every shard concurrently and returns the results in shard order.
pub async fn broadcast<R, F>(worker: &Rc<Worker>, f: F) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(&Rc<Worker>) -> R + Send + Sync + 'static,
{
    let f = Arc::new(f);
    let mut pending = Vec::with_capacity(worker.nshards());
    for target in 0..worker.nshards() {
        if target == worker.id {
            pending.push(None);
            continue;
        }
        let (tx, rx) = oneshot::channel();
        let f = f.clone();
        let from = worker.id;
        worker.shared.send(
            target,
            Box::new(move |w| {
                let r = f(w);
                w.shared.answer(from, tx, r);
            }),
        );
        pending.push(Some(rx));
    }
    let mut out = Vec::with_capacity(pending.len());
    for (target, rx) in pending.into_iter().enumerate() {
        match rx {
            None => out.push(f(worker)),
            Some(rx) => {
                let _ = target;
                out.push(rx.await.expect("shard thread stopped"));
            }
        }
    }
    out
}

/// Per-command counters (INFO commandstats).
#[derive(Default, Clone, Copy)]
pub struct CmdStat {
    pub calls: u64,
    pub usec: u64,
    pub rejected: u64,
    pub failed: u64,
    /// Calls by duration: bucket `k` counts calls of at most 2^k microseconds
    /// (LATENCY HISTOGRAM).
    pub hist: [u64; 32],
}

impl CmdStat {
    #[inline]
    pub fn record(&mut self, usec: u64) {
        self.calls += 1;
        self.usec += usec;
        let bucket = (64 - usec.max(1).saturating_sub(1).leading_zeros()).min(31);
        self.hist[bucket as usize] += 1;
    }
}

/// Counters of one thread; INFO sums them over all threads.
#[derive(Default)]
pub struct Stats {
    pub commands: Vec<CmdStat>,
    pub errors: HashMap<String, u64>,
    pub total_commands: u64,
    pub total_error_replies: u64,
    pub inline: u64,
    pub one_hop: u64,
    pub multi_shard: u64,
    pub hops: u64,
    pub squashed_batches: u64,
    pub squashed_commands: u64,
    /// Pipelined groups run as one two-shard unit in one round trip, and those whose
    /// other part was refused (`server::dispatch::run_unit`).
    pub units: u64,
    pub units_refused: u64,
    pub migrations: u64,
    /// Scripts run on their shard's thread alone.
    pub scripts_fast: u64,
    /// Scripts run holding every shard.
    pub scripts_global: u64,
    /// Scripts abandoned before any write because they reached another shard, then rerun.
    pub scripts_restarted: u64,
    /// Scripts that reached another shard after writing and finished there synchronously.
    pub scripts_escalated: u64,
    pub expired_keys: u64,
    pub evicted_keys: u64,
    pub keyspace_hits: u64,
    pub keyspace_misses: u64,
    pub connections_received: u64,
    pub rejected_connections: u64,
    pub net_input_bytes: u64,
    pub net_output_bytes: u64,
}

impl Stats {
    pub fn record_error(&mut self, reply: &[u8]) {
        self.total_error_replies += 1;
        let code_end = reply
            .iter()
            .position(|&b| b == b' ' || b == b'\r')
            .unwrap_or(reply.len());
        let code = String::from_utf8_lossy(&reply[1..code_end.max(1)]).into_owned();
        *self.errors.entry(code).or_insert(0) += 1;
    }
}

pub struct Db {
    pub table: Table,
    expire_cursor: u64,
    /// INFO's `avg_ttl`: a moving average of the remaining TTLs the active expiry samples,
    /// kept as Redis keeps it, so INFO never walks the keys. 0 with no key to expire.
    pub avg_ttl: u64,
}

/// The AOF holds and deferral open on a shard (`Shard::open`).
#[derive(Clone, Copy, Default)]
pub struct Open {
    holds: u32,
    defers: u32,
}

/// One shard of the keyspace: its databases, locks, watched keys and counters.
pub struct Shard {
    pub dbs: Vec<Db>,
    pub locks: LockTable,
    pub watches: WatchTable,
    /// Clients blocked on keys of this shard.
    pub blocking: crate::blocking::BlockTable,
    /// Scripts running on other threads that have run commands here and not ended
    /// (`scripting::run`): until they end, blocked clients are not served here, since a
    /// script is atomic and Redis serves its waiters only after it.
    pub script_guests: u32,
    /// Keyspace events of the running command, published when it ends.
    pub events: Vec<(usize, &'static str, Bytes)>,
    /// Keys tracked for client-side caching, and invalidations on their way out.
    pub tracking: crate::tracking::Table,
    /// The queues whose keys live here (docs/observe.md).
    pub queues: crate::observe::QueueTable,
    /// The kernel's id of this shard's thread (its CPU time, for `/metrics`).
    pub tid: i32,
    /// Blocked moves this shard's last command set off on other shards: the command
    /// answers once they have landed (`blocking::serve_across`).
    pub settling: Vec<tokio::sync::oneshot::Receiver<()>>,
    /// The tracking connection the running command belongs to, if any.
    pub current: Option<crate::tracking::Reader>,
    pub stats: Stats,
    /// Write operations since start (`rdb_changes_since_last_save`).
    pub dirty: u64,
    /// `dirty` when the last successful snapshot cut this shard.
    pub dirty_saved: u64,
    /// The running command is a write: on a replica it still sees keys whose time has
    /// passed (only the master's DEL removes them).
    pub writing: bool,
    /// Kite's test hook (DEBUG PANIC-ON-KEY): the next command here that names this key
    /// panics, as a bug in a command would, so that tests can show the thread recovers.
    pub panic_on: Option<Bytes>,
    rng: Cell<u64>,
    /// Where random eviction policies take their next key from (databases in turn).
    evict_next_db: usize,
    pub shared: Arc<Shared>,
    /// Slow commands and latency events of this thread.
    pub logs: Logs,
    /// While a batch runs: its slow-log entries, which go home with its answer to be
    /// named after their client there (`run_batch_on`): a batch from another thread's
    /// connection runs where that client is not known. An answer that nobody waits for
    /// any more (its connection was closed during the hop) is dropped with its entries.
    slow_for_home: Option<Vec<SlowEntry>>,
    /// Effects of the writes run here, on their way to the AOF writer.
    pub aof: crate::persist::aof::Effects,
    aof_defers: u32,
    /// (unix ms, total commands) sampled every tick, for instantaneous_ops_per_sec.
    ops_samples: VecDeque<(u64, u64)>,
    /// (unix second, commands in that second, used memory then), the last 300 s: the
    /// dashboard's throughput and memory charts.
    pub second_history: VecDeque<(u32, u32, u64)>,
    second_mark: u64,
}

impl Shard {
    pub fn new(id: usize, databases: usize, ncommands: usize, shared: Arc<Shared>) -> Shard {
        let queues = crate::observe::QueueTable::new(shared.placement.queue_prefixes().to_vec());
        let locks = LockTable::new(shared.transacting[id].clone());
        Shard {
            shared,
            logs: Logs::default(),
            slow_for_home: None,
            dbs: (0..databases)
                .map(|_| Db {
                    table: Table::new(),
                    expire_cursor: 0,
                    avg_ttl: 0,
                })
                .collect(),
            locks,
            blocking: Default::default(),
            events: Vec::new(),
            tracking: Default::default(),
            queues,
            // SAFETY: gettid has no preconditions.
            tid: unsafe { libc::gettid() },
            settling: Vec::new(),
            script_guests: 0,
            current: None,
            watches: WatchTable::new(databases),
            stats: Stats {
                commands: vec![CmdStat::default(); ncommands],
                ..Stats::default()
            },
            dirty: 0,
            dirty_saved: 0,
            aof: Default::default(),
            aof_defers: 0,
            writing: true,
            panic_on: None,
            ops_samples: VecDeque::new(),
            second_history: VecDeque::new(),
            second_mark: 0,
            evict_next_db: 0,
            rng: Cell::new(
                0x9E37_79B9_7F4A_7C15 ^ (id as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
            ),
        }
    }

    /// A shard with one database and no commands, for unit tests.
    #[cfg(test)]
    pub fn for_tests(databases: usize) -> Shard {
        Shard::new(
            0,
            databases,
            crate::commands::table().len(),
            Shared::for_tests(1),
        )
    }

    pub fn random(&self) -> u64 {
        // xorshift64*: enough for RANDOMKEY and sampling.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Adds a command to the slow log and the latency events when it took long enough.
    pub fn log_if_slow(
        &mut self,
        cmd: &Command,
        args: &[Bytes],
        usec: u64,
        client: impl FnOnce() -> (String, Vec<u8>),
    ) {
        let t = &self.shared.tunables;
        let slower_than = t.slowlog_slower_than.load(Ordering::Relaxed);
        if slower_than >= 0
            && usec >= slower_than as u64
            && !cmd.has(crate::commands::flags::SKIP_SLOWLOG)
        {
            let id = self.shared.next_slowlog_id.fetch_add(1, Ordering::Relaxed);
            let max = t.slowlog_max_len.load(Ordering::Relaxed);
            match &mut self.slow_for_home {
                Some(home) => home.push(SlowEntry::new(
                    id,
                    unix_ms() / 1000,
                    usec,
                    args,
                    String::new(),
                    Vec::new(),
                )),
                None => {
                    let (addr, name) = client();
                    let entry = SlowEntry::new(id, unix_ms() / 1000, usec, args, addr, name);
                    self.logs.add_slow(entry, max);
                }
            }
        }
        let threshold_ms = t.latency_threshold_ms.load(Ordering::Relaxed);
        if threshold_ms > 0 && usec / 1000 >= threshold_ms {
            let event = if cmd.has(crate::commands::flags::FAST) {
                "fast-command"
            } else {
                "command"
            };
            self.logs.add_latency(event, unix_ms() / 1000, usec / 1000);
        }
    }

    /// Records the command count for the ops/sec estimate; called every tick.
    pub fn sample_ops(&mut self, now_ms: u64) {
        self.ops_samples
            .push_back((now_ms, self.stats.total_commands));
        while self.ops_samples.len() > 16 {
            self.ops_samples.pop_front();
        }
    }

    /// Once a second: this thread's commands in the last second, for the dashboard.
    pub fn sample_second(&mut self, now_ms: u64) {
        let total = self.stats.total_commands;
        let done = total.saturating_sub(self.second_mark).min(u32::MAX as u64) as u32;
        self.second_mark = total;
        if self.second_history.len() >= crate::observe::HISTORY_SECS {
            self.second_history.pop_front();
        }
        let memory = self.shared.used_memory.load(Ordering::Relaxed) as u64;
        self.second_history
            .push_back(((now_ms / 1000) as u32, done, memory));
    }

    pub fn ops_per_sec(&self) -> u64 {
        match (self.ops_samples.front(), self.ops_samples.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) * 1000 / (b.0 - a.0),
            _ => 0,
        }
    }

    /// CONFIG RESETSTAT: zeroes the counters INFO reports.
    pub fn reset_stats(&mut self) {
        let n = self.stats.commands.len();
        self.stats = Stats {
            commands: vec![CmdStat::default(); n],
            ..Stats::default()
        };
        self.ops_samples.clear();
    }

    /// How an access marks a key now: the LRU clock, or an LFU counter step.
    #[inline]
    pub fn stamp(&self, now_ms: u64) -> Stamp {
        let t = &self.shared.tunables;
        if t.lfu.load(Ordering::Relaxed) {
            Stamp::Lfu {
                now_ms,
                log_factor: t.lfu_log_factor.load(Ordering::Relaxed),
                decay: t.lfu_decay_time.load(Ordering::Relaxed),
                r: (self.random() >> 11) as f64 / (1u64 << 53) as f64,
            }
        } else {
            Stamp::Lru(self.lru_at(now_ms))
        }
    }

    /// Unix seconds, the clock of OBJECT IDLETIME.
    pub fn lru_clock(&self) -> u32 {
        self.lru_at(unix_ms())
    }

    /// The OBJECT IDLETIME clock at `now_ms`, without reading the clock again.
    #[inline]
    pub fn lru_at(&self, now_ms: u64) -> u32 {
        // Unix seconds: an idle time from a file or RESTORE ... IDLETIME may reach back
        // before the server started (u32 holds them until 2106).
        (now_ms / 1000) as u32
    }

    /// Looks a key up, deleting it first if it has expired (lazy expiry).
    pub fn lookup(&mut self, db: usize, key: &[u8], now_ms: u64) -> Option<&mut Entry> {
        match self.dbs[db].table.get_live_mut(key, now_ms) {
            Probe::Missing => None,
            Probe::Live(entry) => {
                let entry: *mut Entry = entry;
                // SAFETY: `entry` is a unique borrow of this shard's table, made through
                // `&mut self` and handed straight back with that same lifetime; nothing
                // touches the table in between. Only the conversion is needed: the
                // borrow checker keeps a conditionally returned borrow alive in the other
                // arms too (NLL's "problem case #3"), and re-borrowing would cost a second
                // hash and probe on every keyed command.
                Some(unsafe { &mut *entry })
            }
            Probe::Expired => {
                if self.shared.repl.is_replica() {
                    // A replica's keys go only when its master says so. Until then a write
                    // (the master's) still sees the key, a read does not.
                    return if self.writing {
                        self.dbs[db].table.get_mut(key)
                    } else {
                        None
                    };
                }
                self.expire_key(db, key);
                None
            }
        }
    }

    /// Whether writes here must log their effects (the AOF is on).
    #[inline]
    pub fn aof_on(&self) -> bool {
        self.shared.persist.aof.is_on()
    }

    /// Logs one effect: handed to the writer at once unless a batch defers it or a group
    /// (transaction, script) holds it.
    pub fn log_effect<A: AsRef<[u8]>>(&mut self, db: usize, argv: &[A]) {
        if !self.aof_on() {
            return;
        }
        self.aof.push(db, argv);
        if !self.aof.held() && self.aof_defers == 0 {
            self.aof_flush();
        }
    }

    /// Logs the effects of one command; several stay whole, inside MULTI/EXEC as Redis
    /// wraps them, unless a transaction or script already keeps them in its block.
    pub fn log_effects(&mut self, db: usize, list: &[Vec<Bytes>]) {
        if list.len() == 1 || self.aof.held() {
            for argv in list {
                self.log_effect(db, argv);
            }
            return;
        }
        self.aof_hold();
        let mark = self.aof.mark();
        for argv in list {
            self.log_effect(db, argv);
        }
        self.aof.wrap_since(mark);
        self.aof_release();
    }

    /// Hands what the buffer holds to the writer, unless a group holds it. Called before
    /// anything that lets a client see the effects' results (a reply, a delivery to a
    /// blocked client, a lock grant).
    pub fn aof_flush(&mut self) {
        if self.aof.is_empty() || self.aof.held() {
            return;
        }
        let piece = self.aof.take_all();
        self.shared.persist.aof.send_piece(piece);
    }

    /// Puts back what a command that panicked midway left set, so the thread goes on as
    /// before: the AOF hold and deferral (left set, every later write here would be
    /// acknowledged and never handed to the writer), a batch's slow-log redirect, the
    /// tracking reader, the write flag, moves to wait for and unpublished events. What
    /// the command changed stays changed, and its logged effects go to the AOF now, so
    /// the file keeps following memory. Called at a task's or a mail's boundary, where no
    /// other work on this thread is inside a hold (holds never span an await).
    pub fn recover_from_panic(&mut self) {
        self.recover_inside(Open::default());
        self.aof_flush();
        self.settling.clear();
        self.events.clear();
    }

    /// What is open around a piece of work that may panic, to `recover_inside` to.
    pub fn open(&self) -> Open {
        Open {
            holds: self.aof.holds(),
            defers: self.aof_defers,
        }
    }

    /// `recover_from_panic` for a command that panicked inside work that goes on (a
    /// release's other grants, a convoy's other members): the AOF holds and deferral go
    /// back to what was open before it.
    pub fn recover_inside(&mut self, open: Open) {
        self.aof.set_holds(open.holds);
        self.aof_defers = open.defers;
        self.slow_for_home = None;
        self.current = None;
        self.writing = true;
    }

    /// Keeps effects together (a transaction step, a script): nothing is handed over
    /// until the matching `aof_release`.
    pub fn aof_hold(&mut self) {
        self.aof.hold();
    }

    pub fn aof_release(&mut self) {
        if self.aof.release() && self.aof_defers == 0 {
            self.aof_flush();
        }
    }

    /// Batches effects (a pipelined batch, an expiry cycle) into one hand-over; flushes
    /// in between stay allowed.
    pub fn aof_defer(&mut self) {
        self.aof_defers += 1;
    }

    pub fn aof_undefer(&mut self) {
        self.aof_defers -= 1;
        if self.aof_defers == 0 {
            self.aof_flush();
        }
    }

    /// Removes a key whose time has come, as Redis does when it finds one.
    pub fn expire_key(&mut self, db: usize, key: &[u8]) {
        if self.shared.repl.is_replica() {
            return;
        }
        if self.dbs[db].table.remove(key).is_some() {
            self.expired(db, key);
        }
    }

    /// What follows the expiry of `key`, already gone from the table: the DEL is logged,
    /// watchers and trackers are told, it is counted and announced.
    fn expired(&mut self, db: usize, key: &[u8]) {
        self.log_effect(db, &[b"DEL".as_slice(), key]);
        self.track_modified(key);
        self.stats.expired_keys += 1;
        self.watches.touch_expired(db, key);
        self.blocking.mark_ready(db, key);
        self.event(db, b'x', "expired", key);
    }

    /// Records a keyspace event if anyone listens to its class.
    #[inline]
    pub fn event(&mut self, db: usize, class: u8, event: &'static str, key: &[u8]) {
        if crate::pubsub::wanted(&self.shared, class) {
            self.events.push((db, event, Bytes::copy_from_slice(key)));
        }
    }

    /// Tells watchers of `key` that it changed (Redis's signalModifiedKey).
    #[inline]
    pub fn modified(&mut self, db: usize, key: &[u8]) {
        self.dirty += 1;
        if !self.watches.is_empty() {
            self.watches.touch(db, key);
        }
        self.track_modified(key);
    }

    /// Tells clients caching `key` (CLIENT TRACKING) that it changed.
    #[inline]
    pub fn track_modified(&mut self, key: &[u8]) {
        self.tracking
            .modified(&self.shared.tracking, key, self.current.as_ref());
    }

    pub fn keys_in(&self, db: usize) -> usize {
        self.dbs[db].table.len()
    }

    /// One pass of active expiry over every database: walks segments holding keys with a
    /// TTL, a bounded amount per call, so expired keys never pile up unseen. Returns
    /// whether it stopped on its budget with more to do.
    pub fn active_expire(&mut self, now_ms: u64, budget_segments: usize) -> bool {
        // A transaction holding a key here may have read it; its block in the AOF must
        // not follow a DEL of it, so that key waits for the lock to go. Other keys expire:
        // a transaction only queued for a key has not read it, and finds it gone when it
        // runs, as a pipeline's unit does. Under a steady stream of pushes, each holding
        // `queues`, a shard would otherwise never expire anything actively.
        if self.locks.whole_held() {
            return false;
        }
        let mut more = false;
        for db in 0..self.dbs.len() {
            if self.dbs[db].table.volatile_len() == 0 {
                self.dbs[db].avg_ttl = 0;
                continue;
            }
            let cursor = self.dbs[db].expire_cursor;
            let mut expired = Vec::new();
            let step = self.dbs[db].table.expire_step(
                cursor,
                budget_segments,
                now_ms,
                |key: &[u8]| self.locks.is_held(key),
                |e: Entry| expired.push(e.key),
            );
            let d = &mut self.dbs[db];
            d.expire_cursor = step.next;
            if step.next != 0 {
                more = true;
            }
            if let Some(sampled) = step.live_ttl_sum.checked_div(step.live_sampled) {
                // Redis's weighting: each round of samples moves the estimate by 1/50.
                d.avg_ttl = if d.avg_ttl == 0 {
                    sampled
                } else {
                    d.avg_ttl / 50 * 49 + sampled / 50
                };
            }
            for key in expired {
                self.log_effect(db, &[b"DEL".as_slice(), &key]);
                self.track_modified(&key);
                self.stats.expired_keys += 1;
                self.watches.touch_expired(db, &key);
                self.event(db, b'x', "expired", &key);
            }
        }
        more
    }

    /// Removes every key of `db`, telling watchers of keys that existed.
    pub fn flush_db(&mut self, db: usize) {
        if !self.watches.is_empty() {
            let keys: Vec<Box<[u8]>> = self.dbs[db]
                .table
                .iter()
                .map(|e| e.key.as_bytes().into())
                .collect();
            for k in keys {
                self.watches.touch(db, &k);
            }
        }
        self.dirty += self.dbs[db].table.len() as u64;
        self.dbs[db].table.clear();
        self.blocking.mark_db_ready(db);
    }

    /// Swaps two databases; watchers of keys whose contents change are told.
    pub fn swap_dbs(&mut self, a: usize, b: usize) {
        if !self.watches.is_empty() {
            for (db, other) in [(a, b), (b, a)] {
                for key in self.watches.keys(db) {
                    if self.dbs[db].table.get(&key).is_some()
                        || self.dbs[other].table.get(&key).is_some()
                    {
                        self.watches.touch(db, &key);
                    }
                }
            }
        }
        self.dbs.swap(a, b);
        self.dirty += 1;
        self.blocking.mark_db_ready(a);
        self.blocking.mark_db_ready(b);
    }

    /// Runs `f` with an execution context on this shard (steps of cross-shard commands,
    /// serving blocked clients), its reply discarded.
    pub fn with_ctx<R>(&mut self, db: usize, f: impl FnOnce(&mut ExecCtx) -> R) -> R {
        let mut out = Reply::new(false);
        let mut ctx = self.ctx(db, &mut out);
        let r = f(&mut ctx);
        let (hits, misses) = (ctx.hits, ctx.misses);
        self.stats.keyspace_hits += hits;
        self.stats.keyspace_misses += misses;
        r
    }

    /// Makes an execution context for running commands on this shard.
    pub fn ctx<'a>(&'a mut self, db: usize, out: &'a mut Reply) -> ExecCtx<'a> {
        self.ctx_at(db, out, unix_ms())
    }

    /// `ctx` with the time already read.
    pub fn ctx_at<'a>(&'a mut self, db: usize, out: &'a mut Reply, now_ms: u64) -> ExecCtx<'a> {
        ExecCtx {
            shard: self,
            db,
            out,
            now_ms,
            no_touch: false,
            hits: 0,
            misses: 0,
            effect: None,
        }
    }
}

/// What an access writes into a key's access field (see `Shard::stamp`).
#[derive(Clone, Copy)]
pub enum Stamp {
    Lru(u32),
    Lfu {
        now_ms: u64,
        log_factor: u64,
        decay: u64,
        r: f64,
    },
}

impl Stamp {
    #[inline]
    pub fn apply(self, old: u32) -> u32 {
        match self {
            Stamp::Lru(v) => v,
            Stamp::Lfu {
                now_ms,
                log_factor,
                decay,
                r,
            } => evict::lfu_touch(old, now_ms, log_factor, decay, r),
        }
    }

    /// The field of a key created now.
    pub fn fresh(self) -> u32 {
        match self {
            Stamp::Lru(v) => v,
            Stamp::Lfu { now_ms, .. } => evict::lfu_new(now_ms),
        }
    }

    pub fn is_lfu(self) -> bool {
        matches!(self, Stamp::Lfu { .. })
    }
}

/// What a command handler sees when it runs on the shard that owns its keys.
pub struct ExecCtx<'a> {
    pub shard: &'a mut Shard,
    pub db: usize,
    pub out: &'a mut Reply,
    /// The clock of this command: every expiry check within it agrees.
    pub now_ms: u64,
    /// CLIENT NO-TOUCH: reads leave the access time alone.
    pub no_touch: bool,
    pub hits: u64,
    pub misses: u64,
    /// What the AOF logs for this command instead of its own words (Redis's rewritten
    /// argv): set by handlers whose effect depends on the moment or on chance.
    pub effect: Option<Vec<Vec<Bytes>>>,
}

impl ExecCtx<'_> {
    /// Whether an expiry time at `at_ms` means the key goes at once. Not on a replica:
    /// there the key keeps the time and waits for its master's DEL, as Redis's replicas
    /// do (a command applied late must not delete what the master still holds).
    pub fn already_expired(&self, at_ms: i64) -> bool {
        at_ms <= self.now_ms as i64 && !self.shard.shared.repl.is_replica()
    }

    /// Whether the AOF wants this command's effect: handlers check before building one.
    #[inline]
    pub fn logging(&self) -> bool {
        self.shard.aof_on()
    }

    /// Logs `argv` in place of the command (several calls log several commands).
    pub fn log_as(&mut self, argv: Vec<Bytes>) {
        self.effect.get_or_insert_with(Vec::new).push(argv);
    }

    /// The live entry for `key`, or None; updates the access time.
    pub fn get(&mut self, key: &[u8]) -> Option<&mut Entry> {
        self.get_and_out(key).0
    }

    /// `get` that also hands back the reply buffer, so a reply can be written from the
    /// entry while it is borrowed (a popped element, straight from its list).
    pub fn get_and_out(&mut self, key: &[u8]) -> (Option<&mut Entry>, &mut Reply) {
        let stamp = (!self.no_touch).then(|| self.shard.stamp(self.now_ms));
        let ExecCtx {
            shard,
            db,
            out,
            now_ms,
            ..
        } = self;
        let mut e = shard.lookup(*db, key, *now_ms);
        if let (Some(e), Some(s)) = (e.as_deref_mut(), stamp) {
            e.lru = s.apply(e.lru);
        }
        (e, &mut **out)
    }

    /// Like `get` but counts a keyspace hit or miss, as Redis's read lookups do.
    pub fn get_read(&mut self, key: &[u8]) -> Option<&mut Entry> {
        self.get_read_and_out(key).0
    }

    /// `get_read` that also hands back the reply buffer, so a reply can be written
    /// straight from the stored value, without a copy or a second lookup.
    pub fn get_read_and_out(&mut self, key: &[u8]) -> (Option<&mut Entry>, &mut Reply) {
        if crate::pubsub::wanted(&self.shard.shared, b'm') && !self.exists(key) {
            self.misses += 1;
            self.shard.event(self.db, b'm', "keymiss", key);
            return (None, &mut *self.out);
        }
        let stamp = self.shard.stamp(self.now_ms);
        let ExecCtx {
            shard,
            db,
            out,
            now_ms,
            no_touch,
            hits,
            misses,
            ..
        } = self;
        match shard.lookup(*db, key, *now_ms) {
            Some(e) => {
                *hits += 1;
                if !*no_touch {
                    e.lru = stamp.apply(e.lru);
                }
                (Some(e), &mut **out)
            }
            None => {
                *misses += 1;
                (None, &mut **out)
            }
        }
    }

    pub fn exists(&mut self, key: &[u8]) -> bool {
        self.shard.lookup(self.db, key, self.now_ms).is_some()
    }

    /// Stores `value` at `key` with expiry `expire_at` (0: none) and signals the change.
    pub fn set(&mut self, key: &[u8], value: Value, expire_at: u64) {
        self.store(key, value, expire_at, false);
    }

    /// `set` for a command that did not look the key up first (a plain SET): the old
    /// key's access is counted here, as the lookup would have counted it (under LFU the
    /// overwritten key's counter is raised before the new value keeps it, as Redis's
    /// lookup before the write does).
    pub fn set_unlooked(&mut self, key: &[u8], value: Value, expire_at: u64) {
        self.store(key, value, expire_at, !self.no_touch);
    }

    fn store(&mut self, key: &[u8], value: Value, expire_at: u64, touch_old: bool) {
        let stamp = self.shard.stamp(self.now_ms);
        let lru = stamp.fresh();
        let mut old = self.shard.dbs[self.db]
            .table
            .insert(key, value, expire_at, lru);
        // A command that writes without looking first (`set_unlooked`) may have replaced a
        // key whose time was up. A lookup would have expired it before the write, as
        // Redis's does: so it is expired now, and the new key is a new one. (A replica's
        // keys go only when its master says so.)
        if old
            .as_ref()
            .is_some_and(|o| o.expire_at != 0 && o.expire_at <= self.now_ms)
            && !self.shard.shared.repl.is_replica()
        {
            old = None;
            self.shard.expired(self.db, key);
        }
        match &old {
            None => self.shard.event(self.db, b'n', "new", key),
            // Under LFU an overwritten key keeps its frequency, as in Redis.
            Some(o) if stamp.is_lfu() => {
                let kept = if touch_old { stamp.apply(o.lru) } else { o.lru };
                if let Some(e) = self.shard.dbs[self.db].table.get_mut(key) {
                    e.lru = kept;
                }
            }
            Some(_) => {}
        }
        // The one place keys are created or replaced: whatever made it (a push, RENAME,
        // COPY, MOVE, RESTORE, a STORE, a script, the master's stream), clients blocked
        // on it re-check it when the command ends.
        self.shard.blocking.mark_ready(self.db, key);
        self.shard.modified(self.db, key);
    }

    /// Deletes `key` if it is live; signals the change.
    pub fn delete(&mut self, key: &[u8]) -> bool {
        if self.shard.lookup(self.db, key, self.now_ms).is_none() {
            return false;
        }
        self.shard.dbs[self.db].table.remove(key);
        self.shard.modified(self.db, key);
        self.shard.blocking.mark_ready(self.db, key);
        true
    }

    /// Sets the expiry of an existing key (0 clears it); signals the change.
    pub fn set_expire(&mut self, key: &[u8], expire_at: u64) -> bool {
        let ok = self.shard.dbs[self.db].table.set_expire(key, expire_at);
        if ok {
            self.shard.modified(self.db, key);
        }
        ok
    }

    pub fn modified(&mut self, key: &[u8]) {
        self.shard.modified(self.db, key);
    }

    /// Records a keyspace event (`class` is its letter in notify-keyspace-events: b'g',
    /// b'$', b'l', b's', b'h', b'z', b'x', b't', b'e'...), published when the command ends.
    pub fn notify(&mut self, class: u8, event: &'static str, key: &[u8]) {
        self.shard.event(self.db, class, event, key);
    }

    /// Tells blocked clients that `key` gained elements; they are served when the command
    /// (or the whole transaction or script) ends.
    pub fn key_ready(&mut self, key: &[u8]) {
        self.shard.blocking.mark_ready(self.db, key);
    }
}

/// Commands bound for one shard, run there in order (a pipelined run of commands, or a
/// single command that had to wait for a lock). Replies accumulate in `out`.
pub struct Batch {
    /// How long the batch has run so far on the thread that runs it, in microseconds (it
    /// may stop at a locked key and resume later).
    pub ran_us: u64,
    pub db: usize,
    pub client_id: u64,
    pub no_touch: bool,
    pub reader: Option<crate::tracking::Reader>,
    pub cmds: hops::Cmds,
    /// How many of `cmds`, from the front, have run. They stay in the queue rather than
    /// being dropped where they ran: see `BatchResult::spent`.
    pub ran: usize,
    pub out: Reply,
    /// EXEC on one shard: wait until every key of every command is free, then run them all
    /// at once, unless a watched key changed.
    pub atomic: Option<WatchCheck>,
    /// Sent by a connection of another thread: events go back with the replies.
    pub remote: bool,
    pub events: Vec<KeyEvent>,
    /// The thread whose connection waits on `done`: the result goes into its table
    /// directly when the batch ran there, through its mailbox otherwise (`hops`).
    pub from: usize,
    pub done: hops::Ticket,
    /// Slow-log entries of the batch's commands, for its connection's thread to log.
    pub slow: Vec<SlowEntry>,
    /// One part of a pipelined group that runs on two shards as one unit
    /// (`server::dispatch::run_unit`): run every command at once, or none (`refused`).
    pub whole: bool,
    /// Where each command's reply ends in `out`, for a `whole` batch, whose replies the
    /// connection interleaves with its own shard's.
    pub ends: Vec<usize>,
    /// Moves its commands set off, kept while it waits for a lock midway.
    pub settle: Vec<oneshot::Receiver<()>>,
}

/// What EXEC checks before it runs: the connection's dirty flag and its watched keys.
pub struct WatchCheck {
    pub dirty: Option<Arc<AtomicBool>>,
    pub keys: Vec<(usize, Bytes)>,
}

pub struct BatchResult {
    pub out: Reply,
    /// Keyspace events of a remote batch, for its connection to publish.
    pub events: Vec<KeyEvent>,
    /// A watched key changed: nothing ran.
    pub aborted: bool,
    /// Commands of a pipelined batch left for a later batch once its replies grew past
    /// `BATCH_REPLY_LIMIT`, so a pipeline of large replies is written out in parts.
    pub rest: hops::Cmds,
    /// The batch's queue with the commands that ran (or, aborted or answered BUSY, that
    /// did not), for the sending thread to drop and reuse (`hops::recycle`). An argument
    /// is a slice of the sending connection's read buffer, sharing its reference count:
    /// dropped on the thread that ran it, each decrement pulled that count's cache line
    /// across cores, and the sender's next parse pulled it back (at depth 16 on two
    /// threads, `shared_v_clone` cost five times its one-thread figure).
    pub spent: hops::Cmds,
    /// Blocked moves the batch set off on other shards, to wait for before answering.
    pub settle: Vec<oneshot::Receiver<()>>,
    /// Slow-log entries of the batch, without their client's address and name.
    pub slow: Vec<SlowEntry>,
    /// A `whole` batch that could not run at once: nothing ran, and its commands are in
    /// `spent`, in order.
    pub refused: bool,
    /// Where each command's reply ends in `out` (`whole` batches only).
    pub ends: Vec<usize>,
    /// How long the batch ran where it ran, in microseconds (a connection's EXEC counts
    /// it, not its wait for the answer).
    pub ran_us: u64,
}

impl BatchResult {
    /// Replies `out` of the commands `spent`, with nothing else to report; a caller with
    /// more to say sets it over this.
    pub fn new(out: Reply, spent: hops::Cmds, slow: Vec<SlowEntry>) -> BatchResult {
        BatchResult {
            out,
            events: Vec::new(),
            aborted: false,
            rest: VecDeque::new(),
            spent,
            settle: Vec::new(),
            slow,
            refused: false,
            ends: Vec::new(),
            ran_us: 0,
        }
    }
}

/// Waits until the blocked moves a command set off have landed.
pub async fn settle(pending: Vec<oneshot::Receiver<()>>) {
    for p in pending {
        let _ = p.await;
    }
}

/// Reply bytes after which a pipelined (non-atomic) batch hands back its remaining
/// commands.
pub const BATCH_REPLY_LIMIT: usize = 1 << 20;

impl WatchCheck {
    /// True when EXEC must abort: a watched key was changed, or has expired since WATCH.
    pub fn broken(&self, shard: &Shard, client_id: u64, now_ms: u64) -> bool {
        if let Some(d) = &self.dirty {
            if d.load(Ordering::Acquire) {
                return true;
            }
        }
        self.keys.iter().any(|(db, key)| {
            shard.dbs[*db]
                .table
                .get(key)
                .is_some_and(|e| e.is_expired(now_ms))
                && !shard.watches.was_expired_at_watch(*db, key, client_id)
        })
    }
}

/// Runs one command on this shard without any lock check and records its counters.
pub fn exec_here(
    shard: &mut Shard,
    cmd: &'static Command,
    f: ExecFn,
    args: &[Bytes],
    db: usize,
    out: &mut Reply,
    no_touch: bool,
) {
    exec_here_for(shard, cmd, f, args, db, out, no_touch, &|| {
        (String::new(), Vec::new())
    });
}

/// DEBUG PANIC-ON-KEY's panic, once, for the first command here that names the key.
#[cold]
#[inline(never)]
fn panic_if_named(shard: &mut Shard, args: &[Bytes]) {
    if let Some(key) = shard.panic_on.take_if(|k| args[1..].contains(k)) {
        panic!(
            "DEBUG PANIC-ON-KEY: a command on {} panics here",
            String::from_utf8_lossy(&key)
        );
    }
}

/// `exec_here` for a command whose client is known here: `client` gives its address and
/// name for a slow-log entry (asked only when the command was slow).
#[allow(clippy::too_many_arguments)]
pub fn exec_here_for(
    shard: &mut Shard,
    cmd: &'static Command,
    f: ExecFn,
    args: &[Bytes],
    db: usize,
    out: &mut Reply,
    no_touch: bool,
    client: &dyn Fn() -> (String, Vec<u8>),
) {
    let start_len = out.buf.len();
    let started = crate::clock::Stopwatch::start();
    let dirty_before = shard.dirty;
    shard.writing = cmd.has(crate::commands::flags::WRITE);
    if shard.panic_on.is_some() {
        panic_if_named(shard, args);
    }
    let (effect, now_ms) = {
        let mut ctx = shard.ctx_at(db, out, started.unix_ms());
        ctx.no_touch = no_touch;
        f(&mut ctx, args);
        if let Some(r) = ctx.shard.current {
            if r.remember && cmd.has(crate::commands::flags::READONLY) {
                let max = ctx
                    .shard
                    .shared
                    .tunables
                    .tracking_table_max_keys
                    .load(Ordering::Relaxed);
                let n = ctx.shard.shared.nshards();
                for p in cmd.key_positions(args) {
                    ctx.shard.tracking.remember(max, n, &args[p], &r);
                }
            }
        }
        // Outside a read command the live view is the safe one on a replica: a
        // cross-shard write of the master's must find what the master still holds.
        ctx.shard.writing = true;
        let (hits, misses) = (ctx.hits, ctx.misses);
        let taken = (ctx.effect.take(), ctx.now_ms);
        shard.stats.keyspace_hits += hits;
        shard.stats.keyspace_misses += misses;
        taken
    };
    if shard.dirty != dirty_before && shard.aof_on() {
        log_command_effect(shard, cmd, args, db, effect, now_ms, &out.buf[start_len..]);
    }
    let usec = started.elapsed_us();
    shard.log_if_slow(cmd, args, usec, client);
    let st = &mut shard.stats;
    st.total_commands += 1;
    let c = &mut st.commands[cmd.id];
    c.record(usec);
    if out.buf.get(start_len) == Some(&b'-') {
        c.failed += 1;
        st.record_error(&out.buf[start_len..]);
    }
}

/// Logs what a command that changed something did, as Redis would propagate it.
fn log_command_effect(
    shard: &mut Shard,
    cmd: &'static Command,
    args: &[Bytes],
    db: usize,
    effect: Option<Vec<Vec<Bytes>>>,
    now_ms: u64,
    reply: &[u8],
) {
    let list = match effect {
        Some(list) => list,
        None => match crate::persist::aof::propagate::rewrite(cmd.name, args, now_ms, reply) {
            Some(list) => list,
            None => {
                shard.log_effect(db, args);
                return;
            }
        },
    };
    shard.log_effects(db, &list);
}

fn batch_keys(batch: &Batch, all: bool) -> Vec<Bytes> {
    let cmds: Box<dyn Iterator<Item = &(&'static Command, Vec<Bytes>)>> = if all {
        Box::new(batch.cmds.iter().skip(batch.ran))
    } else {
        Box::new(batch.cmds.iter().skip(batch.ran).take(1))
    };
    let mut keys = Vec::new();
    for (cmd, args) in cmds {
        keys.extend(cmd.key_positions(args).into_iter().map(|i| args[i].clone()));
    }
    if all {
        if let Some(w) = &batch.atomic {
            keys.extend(w.keys.iter().map(|(_, k)| k.clone()));
        }
    }
    keys
}

/// Starts loading the keys of the batches just taken from the mailbox, all together,
/// before the first of them runs. A batch hopped here carries a connection's run of
/// commands for this shard, two at depth 16 on two threads, so prefetching batch by batch
/// would overlap little; a turn takes the batches of many connections at once. Each
/// command's first key, where its key range says, in the database of the first batch.
/// The caller passes no more mail than it runs before yielding, so what is loaded is used
/// before other work can evict it.
pub fn prefetch_batches<'m>(worker: &Worker, mail: impl Iterator<Item = &'m Mail>) {
    let mut batches = mail
        .filter_map(|m| match m {
            Mail::Batch(b) => Some(b),
            _ => None,
        })
        .peekable();
    let Some(db) = batches.peek().map(|b| b.db) else {
        return;
    };
    let Ok(shard) = worker.shard.try_borrow() else {
        return;
    };
    let Some(table) = shard.dbs.get(db).map(|d| &d.table) else {
        return;
    };
    table.prefetch_many(
        batches
            .filter(|b| b.db == db)
            .flat_map(|b| b.cmds.iter())
            .filter_map(|(cmd, args)| match cmd.keys {
                // The batch knows its commands: the first key is where the table says.
                crate::commands::Keys::Range(first, _, _) if first > 0 => args.get(first as usize),
                _ => None,
            })
            .filter(|k| k.len() <= crate::types::table::PREFETCH_KEY_MAX)
            .map(|k| &k[..]),
    );
}

/// Runs a batch on this thread's shard, stopping at the first command whose keys are
/// locked; the rest waits in the lock queue and resumes when the keys are free. A
/// `whole` batch instead runs all at once, or not at all if any of its keys is taken
/// (`may_run_whole`).
pub fn run_batch(worker: &Rc<Worker>, batch: Batch) {
    run_batch_from(worker, batch, false);
}

/// `run_batch` for a batch the lock queue restarted (`resumed`): its next command waited
/// in the queue for its keys, and whoever waits on them still queued after it.
fn run_batch_from(worker: &Rc<Worker>, mut batch: Batch, mut resumed: bool) {
    let started = crate::clock::Stopwatch::start();
    let atomic = batch.atomic.is_some();
    let mut shard = worker.shard.borrow_mut();
    if batch.whole && !may_run_whole(&shard, &batch) {
        drop(shard);
        refuse(worker, batch);
        return;
    }
    if atomic && !shard.locks.is_idle() {
        let keys = batch_keys(&batch, true);
        let free = if resumed {
            shard.locks.may_resume(keys.iter().map(|k| &k[..]), true)
        } else {
            shard.locks.is_free(keys.iter().map(|k| &k[..]))
        };
        if !free {
            let w = worker.clone();
            shard.locks.enqueue(
                LockKeys::Keys(keys),
                Waiting::Run(Box::new(move || run_batch_from(&w, batch, true))),
            );
            return;
        }
    }
    if let Some(check) = batch.atomic.take() {
        if check.broken(&shard, batch.client_id, unix_ms()) {
            drop(shard);
            let result = BatchResult {
                aborted: true,
                ..BatchResult::new(batch.out, batch.cmds, Vec::new())
            };
            worker.shared.answer_batch(batch.from, batch.done, result);
            return;
        }
    }
    // Moves set off before the batch ran are not its own: a release that started it
    // takes those for the transaction whose push readied them (`tx::release_then_signal`).
    let settling_from = shard.settling.len();
    // A single-shard EXEC is one block in the AOF; a pipelined batch is handed over once.
    let mark = if atomic {
        shard.aof_hold();
        Some(shard.aof.mark())
    } else {
        shard.aof_defer();
        None
    };
    while let Some((cmd, args)) = batch.cmds.get(batch.ran) {
        let cmd: &'static Command = cmd;
        if !atomic && !batch.whole && batch.out.buf.len() >= BATCH_REPLY_LIMIT {
            break;
        }
        if !atomic
            && (shard.blocking.has_ready()
                || !shard.events.is_empty()
                || shard.tracking.has_pending())
        {
            // Events go out and blocked clients are served after each command, before
            // the next one runs.
            drop(shard);
            let sink = batch.remote.then_some(&mut batch.events);
            after_command_into(worker, sink);
            shard = worker.shard.borrow_mut();
        }
        // A whole batch found every key free before its first command, and nothing here
        // yields: it must not stop halfway (its connection would run the first part again).
        if !atomic && !batch.whole && !shard.locks.is_idle() {
            let keys = cmd.key_positions(args);
            let write = cmd.has(crate::commands::flags::WRITE);
            let keys_of = || keys.iter().map(|&i| &args[i][..]);
            let free = if resumed {
                shard.locks.may_resume(keys_of(), write)
            } else {
                shard.locks.is_free_to(keys_of(), write)
            };
            if !free {
                let lock_keys = LockKeys::Keys(keys.iter().map(|&i| args[i].clone()).collect());
                shard.aof_undefer();
                batch.ran_us += started.elapsed_us();
                let from = settling_from.min(shard.settling.len());
                batch.settle.extend(shard.settling.drain(from..));
                let w = worker.clone();
                shard.locks.enqueue(
                    lock_keys,
                    Waiting::Run(Box::new(move || run_batch_from(&w, batch, true))),
                );
                return;
            }
        }
        resumed = false;
        let f = cmd.exec_fn().expect("batched commands run on a shard");
        shard.current = batch.reader;
        shard.slow_for_home = Some(std::mem::take(&mut batch.slow));
        exec_here(
            &mut shard,
            cmd,
            f,
            args,
            batch.db,
            &mut batch.out,
            batch.no_touch,
        );
        if let Some(slow) = shard.slow_for_home.take() {
            batch.slow = slow;
        }
        shard.current = None;
        if batch.whole {
            batch.ends.push(batch.out.buf.len());
        }
        batch.ran += 1;
    }
    match mark {
        Some(m) => {
            shard.aof.wrap_since(m);
            shard.aof_release();
        }
        None => shard.aof_undefer(),
    }
    drop(shard);
    let sink = batch.remote.then_some(&mut batch.events);
    after_command_into(worker, sink);
    let mut settle = std::mem::take(&mut batch.settle);
    {
        let mut shard = worker.shard.borrow_mut();
        let from = settling_from.min(shard.settling.len());
        settle.extend(shard.settling.drain(from..));
    }
    worker.shared.answer_batch(
        batch.from,
        batch.done,
        BatchResult {
            out: batch.out,
            events: batch.events,
            aborted: false,
            // Only when the replies outgrew their limit: the rest then needs a queue of
            // its own.
            rest: if batch.ran < batch.cmds.len() {
                batch.cmds.split_off(batch.ran)
            } else {
                VecDeque::new()
            },
            spent: batch.cmds,
            settle,
            slow: batch.slow,
            refused: false,
            ends: batch.ends,
            ran_us: batch.ran_us + started.elapsed_us(),
        },
    );
}

/// Whether a `whole` batch can run here at once, start to end: none of its keys held or
/// queued for in the lock table, and none waited on by a blocked client. Serving a waiter
/// from this part could hand it another key than Redis would, had the sender's earlier
/// commands on its own shard (which run after this part) come first.
fn may_run_whole(shard: &Shard, batch: &Batch) -> bool {
    let locks_idle = shard.locks.is_idle();
    let waits = shard.blocking.waits_any();
    if locks_idle && !waits {
        return true;
    }
    batch.cmds.iter().all(|(cmd, args)| {
        let write = cmd.has(crate::commands::flags::WRITE);
        cmd.keys_all(args, |k| {
            (locks_idle || shard.locks.is_free_to([k], write))
                && !shard.blocking.is_waited(batch.db, k)
        })
    })
}

/// Answers a `whole` batch that did not run: its commands go back, untouched.
pub fn refuse(worker: &Worker, batch: Batch) {
    debug_assert_eq!(batch.ran, 0, "a refused batch ran nothing");
    let result = BatchResult {
        refused: true,
        ..BatchResult::new(batch.out, batch.cmds, batch.slow)
    };
    worker.shared.answer_batch(batch.from, batch.done, result);
}

/// How a batch runs on its shard.
pub struct BatchSpec {
    pub db: usize,
    pub resp3: bool,
    pub client_id: u64,
    pub no_touch: bool,
    pub atomic: Option<WatchCheck>,
    /// The connection's CLIENT TRACKING state, when it tracks.
    pub reader: Option<crate::tracking::Reader>,
    /// All at once or not at all (`Batch::whole`).
    pub whole: bool,
}

/// Runs a batch on shard `target` and waits for its replies.
pub async fn run_batch_on(
    worker: &Rc<Worker>,
    target: usize,
    cmds: hops::Cmds,
    spec: BatchSpec,
) -> BatchResult {
    let (ticket, answer) = hops::open(&worker.mailbox, worker.id);
    let client_id = spec.client_id;
    let batch = Batch {
        ran_us: 0,
        db: spec.db,
        client_id: spec.client_id,
        no_touch: spec.no_touch,
        reader: spec.reader,
        cmds,
        ran: 0,
        out: Reply::with_buf(hops::reply_buffer(), spec.resp3),
        atomic: spec.atomic,
        remote: target != worker.id,
        events: Vec::new(),
        from: worker.id,
        done: ticket,
        slow: Vec::new(),
        whole: spec.whole,
        ends: Vec::new(),
        settle: Vec::new(),
    };
    if target == worker.id {
        run_batch(worker, batch);
    } else {
        worker.shard.borrow_mut().stats.hops += 1;
        // Leaves with the pass's other hops for that thread.
        mailbox::post(target, worker.shared.mailbox(target), Mail::Batch(batch));
    }
    let mut result = answer.await.expect("shard thread stopped");
    for (db, event, key) in &result.events {
        crate::pubsub::publish_event(worker, *db, event, key);
    }
    if !result.slow.is_empty() {
        log_slow_from_away(worker, client_id, std::mem::take(&mut result.slow));
    }
    result
}

/// Logs the slow-log entries a batch brought home, named after the client that sent it,
/// as the thread that ran them could not.
fn log_slow_from_away(worker: &Rc<Worker>, client_id: u64, entries: Vec<SlowEntry>) {
    let (addr, name) = worker
        .clients
        .borrow()
        .map
        .get(&client_id)
        .map(|h| {
            let info = h.info.borrow();
            (info.addr.clone(), info.name.clone())
        })
        .unwrap_or_default();
    let max = worker
        .shared
        .tunables
        .slowlog_max_len
        .load(Ordering::Relaxed);
    let mut shard = worker.shard.borrow_mut();
    for mut entry in entries {
        entry.addr = addr.clone();
        entry.name = name.clone();
        shard.logs.add_slow(entry, max);
    }
}

/// A keyspace event: database, event name, key.
pub type KeyEvent = (usize, &'static str, Bytes);

/// What follows every command (or transaction) on a shard: its keyspace events are
/// published, then clients blocked on keys it filled are served.
pub fn after_command(worker: &Rc<Worker>) {
    after_command_into(worker, None);
}

/// `after_command`, handing the events to `sink` instead of publishing them: a batch
/// from another thread's connection carries them back so that connection publishes
/// everything it caused in its own order.
pub fn after_command_into(worker: &Rc<Worker>, mut sink: Option<&mut Vec<KeyEvent>>) {
    loop {
        send_invalidations(worker);
        let events = std::mem::take(&mut worker.shard.borrow_mut().events);
        match sink.as_deref_mut() {
            Some(s) => s.extend(events),
            None => {
                for (db, event, key) in events {
                    crate::pubsub::publish_event(worker, db, event, &key);
                }
            }
        }
        crate::blocking::serve_ready(worker);
        if worker.shard.borrow().events.is_empty() {
            break;
        }
    }
    send_invalidations(worker);
}

/// Sends the invalidations (CLIENT TRACKING) of what just ran here.
pub fn send_invalidations(worker: &Rc<Worker>) {
    let mut shard = worker.shard.borrow_mut();
    if shard.tracking.has_pending() {
        shard.tracking.send_pending(worker);
    }
}

/// Releases the keys a two-shard unit of a pipeline held here for one round trip
/// (`server::dispatch::run_unit`), starts what waited for them and serves clients blocked
/// on them; most often none did, and nothing else is to be done.
pub fn release_unit(worker: &Rc<Worker>, keys: locks::UnitKeys) {
    release(worker, Release::Unit(keys));
}

/// Releases locks held on this thread's shard, starts whatever was waiting for them, and
/// serves clients blocked on keys the transaction filled.
pub fn release_locks(worker: &Rc<Worker>, keys: &LockKeys) {
    release(worker, Release::Locks(keys.clone()));
}

/// What a release lets go of on this thread's shard.
enum Release {
    Locks(LockKeys),
    Unit(locks::UnitKeys),
    /// Nothing: the work a release restarted has run, and what it kept queued behind
    /// it may start now (`LockTable::take_rewake`).
    Rewake,
}

thread_local! {
    /// Releases asked for while this thread is inside `release`, in order.
    static RELEASING: RefCell<Option<VecDeque<Release>>> = const { RefCell::new(None) };
}

fn release(worker: &Rc<Worker>, first: Release) {
    // A transaction's last share, started by a release here, lets its keys go at once
    // (`tx::run_convoy`), which may start the next one, and so on down a queue of
    // pushes behind one hot key: those releases are looped over here, not nested, and
    // whatever a release started runs before what a later one starts.
    let mut first = Some(first);
    let nested = RELEASING.with(|r| {
        let mut r = r.borrow_mut();
        match r.as_mut() {
            Some(later) => {
                later.extend(first.take());
                true
            }
            None => {
                *r = Some(VecDeque::new());
                false
            }
        }
    });
    if nested {
        return;
    }
    struct Done<'a>(&'a Rc<Worker>);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            let left = RELEASING
                .with(|r| r.borrow_mut().take())
                .unwrap_or_default();
            // Unwinding from a command that panicked: the releases still owed run
            // later on this thread, rather than leaving their keys held for ever.
            for owed in left {
                let msg: Msg = match owed {
                    Release::Locks(keys) => Box::new(move |w| release_locks(w, &keys)),
                    Release::Unit(keys) => Box::new(move |w| release_unit(w, keys)),
                    Release::Rewake => Box::new(|w| release(w, Release::Rewake)),
                };
                self.0.shared.send(self.0.id, msg);
            }
            // Waiters kept behind restarted work that never ran would wait for an
            // unrelated release.
            if std::thread::panicking() {
                self.0
                    .shared
                    .send(self.0.id, Box::new(|w| release(w, Release::Rewake)));
            }
        }
    }
    let done = Done(worker);
    let mut next = first;
    let mut started = false;
    while let Some(release) = next {
        let runnable = {
            let mut shard = worker.shard.borrow_mut();
            let runnable = match &release {
                Release::Locks(keys) => shard.locks.release(keys),
                Release::Unit(keys) => shard.locks.release_unit(keys),
                Release::Rewake => shard.locks.rewake(),
            };
            // After a unit, most often nothing waited and nothing is to be done.
            let anything = !matches!(release, Release::Unit(_))
                || !runnable.is_empty()
                || shard.blocking.has_ready();
            if anything {
                // Effects logged here so far precede any transaction granted a lock now.
                shard.aof_flush();
                started = true;
            }
            runnable
        };
        // Blocked clients the releasing work readied are served before the work its
        // keys go to, as Redis serves them as soon as the command that readied them
        // ends; and the moves they set off stay for the releaser (`settling`).
        if !runnable.is_empty() && worker.shard.borrow().blocking.has_ready() {
            after_command(worker);
        }
        for f in runnable {
            // One that panics (a bug) does not take the rest with it: dropped unrun, a
            // grant or a convoy would leave keys the lock table counts as held.
            let open = worker.shard.borrow().open();
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                tracing::error!("Work a release started panicked and was dropped");
                worker.shard.borrow_mut().recover_inside(open);
            }
        }
        next = RELEASING.with(|r| r.borrow_mut().as_mut().and_then(|l| l.pop_front()));
        if next.is_none() && worker.shard.borrow_mut().locks.take_rewake() {
            next = Some(Release::Rewake);
        }
    }
    drop(done);
    if started {
        after_command(worker);
        // Batches from other threads that waited for these locks ran just now, wherever
        // this release came from (a connection's task, a sync call): their results go
        // home now, not after whatever the rest of this pass runs.
        mailbox::flush_outbox();
    }
}
