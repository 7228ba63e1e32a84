//! The server family: INFO, CONFIG, COMMAND, TIME, LASTSAVE, DEBUG, SHUTDOWN, SLOWLOG,
//! LATENCY.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use hashbrown::HashMap;

use super::connection::SERVER_VERSION;
use super::util::{eq_ci, glob_match, parse_f64, parse_i64, printable, SYNTAX_ERR};
use super::{flags, table, Command};
use crate::async_handler;
use crate::server::session::Session;
use crate::shard::{broadcast, hop, unix_ms, unix_us, CmdStat};

// ---- INFO ----

/// What INFO needs from one thread.
#[derive(Default)]
pub(crate) struct ThreadReport {
    /// The statistics of the commands this thread has seen, by command id: the table has
    /// about 240 entries of 288 bytes, and a report travels for every INFO.
    pub(crate) commands: Vec<(usize, CmdStat)>,
    pub(crate) errors: HashMap<String, u64>,
    pub(crate) counters: [u64; 24],
    /// Each database's keys, keys with a TTL, and the estimate of their average TTL.
    pub(crate) keyspace: Vec<(u64, u64, u64)>,
    pub(crate) ops_per_sec: u64,
    pub(crate) clients: u64,
    pub(crate) blocked: u64,
    pub(crate) blocking_keys: u64,
    pub(crate) tracking_keys: u64,
    pub(crate) tracking_items: u64,
    pub(crate) channels: Vec<Bytes>,
    pub(crate) patterns: Vec<Bytes>,
    pub(crate) lock_waits: u64,
    pub(crate) convoy_joins: u64,
    pub(crate) dirty: u64,
    pub(crate) dirty_saved: u64,
    pub(crate) event_loop: crate::net::LoopCounters,
}

/// Every thread's command statistics added up, by command id.
pub(crate) fn command_totals(reports: &[ThreadReport]) -> Vec<CmdStat> {
    let mut totals = vec![CmdStat::default(); super::table().commands.len()];
    for (id, c) in reports.iter().flat_map(|r| r.commands.iter()) {
        let Some(t) = totals.get_mut(*id) else {
            continue;
        };
        t.calls += c.calls;
        t.usec += c.usec;
        t.rejected += c.rejected;
        t.failed += c.failed;
        for (h, v) in t.hist.iter_mut().zip(c.hist.iter()) {
            *h += v;
        }
    }
    totals
}

pub(crate) fn thread_report(w: &crate::shard::Worker) -> ThreadReport {
    let sh = w.shard.borrow();
    let st = &sh.stats;
    ThreadReport {
        commands: st
            .commands
            .iter()
            .enumerate()
            .filter(|(_, c)| c.calls + c.rejected + c.failed > 0)
            .map(|(id, c)| (id, *c))
            .collect(),
        errors: st.errors.clone(),
        counters: [
            st.total_commands,
            st.total_error_replies,
            st.inline,
            st.one_hop,
            st.multi_shard,
            st.hops,
            st.squashed_batches,
            st.squashed_commands,
            st.migrations,
            st.expired_keys,
            st.keyspace_hits,
            st.keyspace_misses,
            st.connections_received,
            st.rejected_connections,
            st.net_input_bytes,
            st.net_output_bytes,
            st.evicted_keys,
            sh.blocking.registrations,
            st.scripts_fast,
            st.scripts_global,
            st.scripts_restarted,
            st.scripts_escalated,
            st.units,
            st.units_refused,
        ],
        keyspace: sh
            .dbs
            .iter()
            .map(|db| {
                (
                    db.table.len() as u64,
                    db.table.volatile_len() as u64,
                    db.avg_ttl,
                )
            })
            .collect(),
        ops_per_sec: sh.ops_per_sec(),
        clients: w.clients.borrow().map.len() as u64,
        blocked: w.clients.borrow().blocked as u64,
        channels: w
            .clients
            .borrow()
            .pubsub
            .channel_names(false)
            .cloned()
            .collect(),
        patterns: w.clients.borrow().pubsub.pattern_names().cloned().collect(),
        blocking_keys: sh.blocking.keys_count() as u64,
        tracking_keys: sh.tracking.keys() as u64,
        tracking_items: sh.tracking.items() as u64,
        lock_waits: sh.locks.waited_total,
        convoy_joins: sh.locks.convoy_joins,
        dirty: sh.dirty,
        dirty_saved: sh.dirty_saved,
        event_loop: crate::net::loop_counters(),
    }
}

const DEFAULT_SECTIONS: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "modules",
    "errorstats",
    "cluster",
    "keyspace",
    "transactions",
];

fn distinct<'a>(names: impl Iterator<Item = &'a Bytes>) -> usize {
    let mut v: Vec<&Bytes> = names.collect();
    v.sort();
    v.dedup();
    v.len()
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b < 1024.0 {
        format!("{}B", bytes)
    } else if b < 1024.0 * 1024.0 {
        format!("{:.2}K", b / 1024.0)
    } else if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2}M", b / (1024.0 * 1024.0))
    } else {
        format!("{:.2}G", b / (1024.0 * 1024.0 * 1024.0))
    }
}

fn rusage() -> (f64, f64) {
    // SAFETY: getrusage fills the zeroed struct we pass; no other memory is touched.
    unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut r);
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        (t(r.ru_stime), t(r.ru_utime))
    }
}

pub(crate) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

async_handler!(info, |sess, args| {
    let s = info_text(&sess.worker, &args[1..]).await;
    sess.out.verbatim(s.as_bytes());
});

/// INFO's text for the sections `args` names (none: the default ones); also what the
/// dashboard reads.
pub async fn info_text(worker: &std::rc::Rc<crate::shard::Worker>, args: &[Bytes]) -> String {
    let wanted: Vec<String> = args
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let everything = wanted.iter().any(|w| w == "all" || w == "everything");
    let default = wanted.is_empty() || wanted.iter().any(|w| w == "default");
    let show = |name: &str| {
        everything
            || (default && DEFAULT_SECTIONS.contains(&name))
            || wanted.iter().any(|w| w == name)
    };
    let reports = broadcast(worker, |w| thread_report(w)).await;
    let shared = worker.shared.clone();
    let (config_file, maxmemory, policy, hz, port) = {
        let c = shared.config.lock().unwrap_or_else(|p| p.into_inner());
        (
            c.file
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            c.get_i64("maxmemory") as u64,
            c.get("maxmemory-policy").to_string(),
            c.get_i64("hz"),
            c.get_i64("port"),
        )
    };
    let sum = |i: usize| reports.iter().map(|r| r.counters[i]).sum::<u64>();
    let loop_sum = |f: fn(&crate::net::LoopCounters) -> u64| {
        reports.iter().map(|r| f(&r.event_loop)).sum::<u64>()
    };
    let mut s = String::new();
    let uptime = shared.uptime_ms() / 1000;
    if show("server") {
        let (multiplexing, sends, uring_error) = crate::net::uring::describe();
        let _ = write!(
            s,
            "# Server\r\nredis_version:{v}\r\nredis_git_sha1:00000000\r\nredis_git_dirty:0\r\nredis_build_id:0\r\nredis_mode:standalone\r\nos:{os}\r\narch_bits:64\r\nmonotonic_clock:POSIX clock_gettime\r\nmultiplexing_api:{multiplexing}\r\natomicvar_api:c11-builtin\r\ngcc_version:0.0.0\r\nprocess_id:{pid}\r\nprocess_supervised:no\r\nrun_id:{run}\r\ntcp_port:{port}\r\nserver_time_usec:{now}\r\nuptime_in_seconds:{up}\r\nuptime_in_days:{days}\r\nhz:{hz}\r\nconfigured_hz:{hz}\r\nlru_clock:{lru}\r\nexecutable:{exe}\r\nconfig_file:{cf}\r\nio_threads_active:0\r\nkite_version:{kv}\r\nkite_threads:{threads}\r\nkite_reply_sends:{sends}\r\nkite_io_uring_error:{uring_error}\r\nkite_receives:{receives}\r\n\r\n",
            v = SERVER_VERSION,
            os = std::env::consts::OS,
            pid = std::process::id(),
            run = shared.run_id,
            port = port,
            now = unix_us(),
            up = uptime,
            days = uptime / 86400,
            hz = hz,
            lru = (unix_ms() / 1000) & ((1 << 24) - 1),
            exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
            cf = config_file,
            kv = env!("CARGO_PKG_VERSION"),
            threads = worker.nshards(),
            sends = sends,
            uring_error = uring_error,
            receives = crate::net::uring::receives(),
        );
    }
    if show("clients") {
        let _ = write!(
            s,
            "# Clients\r\nconnected_clients:{}\r\ncluster_connections:0\r\nmaxclients:{}\r\nclient_recent_max_input_buffer:0\r\nclient_recent_max_output_buffer:0\r\nblocked_clients:{}\r\ntracking_clients:{}\r\nclients_in_timeout_table:{}\r\ntotal_blocking_keys:{}\r\ntotal_blocking_keys_on_nokey:0\r\n\r\n",
            reports.iter().map(|r| r.clients).sum::<u64>(),
            shared.tunables.maxclients.load(Ordering::Relaxed),
            reports.iter().map(|r| r.blocked).sum::<u64>(),
            shared.tracking.clients.load(Ordering::Relaxed),
            reports.iter().map(|r| r.blocked).sum::<u64>(),
            reports.iter().map(|r| r.blocking_keys).sum::<u64>(),
        );
    }
    if show("memory") {
        let used = shared.used_memory.load(Ordering::Relaxed) as u64;
        let peak = shared.peak_memory.load(Ordering::Relaxed) as u64;
        let rss = rss_bytes();
        let _ = write!(
            s,
            "# Memory\r\nused_memory:{used}\r\nused_memory_human:{uh}\r\nused_memory_rss:{rss}\r\nused_memory_rss_human:{rh}\r\nused_memory_peak:{peak}\r\nused_memory_peak_human:{ph}\r\nused_memory_lua:0\r\nused_memory_scripts_eval:{scripts_bytes}\r\nnumber_of_cached_scripts:{scripts}\r\nnumber_of_functions:{functions}\r\nmaxmemory:{max}\r\nmaxmemory_human:{mh}\r\nmaxmemory_policy:{policy}\r\nmem_fragmentation_ratio:{frag:.2}\r\nmem_allocator:jemalloc-5.3.0\r\n\r\n",
            used = used,
            uh = human(used),
            rss = rss,
            rh = human(rss),
            peak = peak,
            ph = human(peak),
            max = maxmemory,
            mh = human(maxmemory),
            policy = policy,
            frag = if used > 0 { rss as f64 / used as f64 } else { 0.0 },
            scripts_bytes = crate::scripting::cache().body_bytes(),
            scripts = crate::scripting::cache().len(),
            functions = crate::scripting::registry()
                .snapshot()
                .iter()
                .map(|l| l.functions.len())
                .sum::<usize>(),
        );
    }
    if show("persistence") {
        let ps = &shared.persist;
        let loading = ps.loading.load(Ordering::Acquire);
        // The snapshot claim also covers AOF rewrites, which INFO reports apart.
        let bg = ps.bgsave_in_progress.load(Ordering::Acquire)
            && !ps.aof.rewrite_in_progress.load(Ordering::Acquire);
        let _ = write!(
            s,
            "# Persistence\r\nloading:{loading}\r\nasync_loading:0\r\ncurrent_cow_peak:0\r\ncurrent_cow_size:0\r\ncurrent_cow_size_age:0\r\ncurrent_fork_perc:0.00\r\ncurrent_save_keys_processed:0\r\ncurrent_save_keys_total:0\r\n{loading_fields}rdb_changes_since_last_save:{changes}\r\nrdb_bgsave_in_progress:{bg}\r\nrdb_last_save_time:{lastsave}\r\nrdb_last_bgsave_status:{status}\r\nrdb_last_bgsave_time_sec:{last_secs}\r\nrdb_current_bgsave_time_sec:{cur_secs}\r\nrdb_saves:{saves}\r\nrdb_last_cow_size:0\r\nrdb_last_load_keys_expired:{expired}\r\nrdb_last_load_keys_loaded:{loaded}\r\n{aof}module_fork_in_progress:0\r\nmodule_fork_last_cow_size:0\r\n\r\n",
            loading = loading as u8,
            loading_fields = if loading {
                format!(
                    "loading_start_time:{}\r\nloading_total_bytes:0\r\nloading_rdb_used_mem:0\r\nloading_loaded_bytes:0\r\nloading_loaded_perc:0.00\r\nloading_eta_seconds:1\r\n",
                    ps.loading_started_unix.load(Ordering::Relaxed)
                )
            } else {
                String::new()
            },
            changes = reports.iter().map(|r| r.dirty.saturating_sub(r.dirty_saved)).sum::<u64>(),
            bg = bg as u8,
            lastsave = shared.lastsave_unix.load(Ordering::Relaxed),
            status = if ps.last_bgsave_ok.load(Ordering::Relaxed) { "ok" } else { "err" },
            last_secs = ps.last_bgsave_secs.load(Ordering::Relaxed),
            cur_secs = if bg {
                (crate::shard::unix_ms() / 1000).saturating_sub(ps.bgsave_started_unix.load(Ordering::Relaxed)) as i64
            } else {
                -1
            },
            saves = ps.saves.load(Ordering::Relaxed),
            expired = ps.loaded_expired.load(Ordering::Relaxed),
            loaded = ps.loaded_keys.load(Ordering::Relaxed),
            aof = aof_info(&shared),
        );
    }
    if show("stats") {
        let _ = write!(
            s,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:{}\r\ntotal_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\nrejected_connections:{}\r\nsync_full:{}\r\nsync_partial_ok:{}\r\nsync_partial_err:{}\r\nexpired_keys:{}\r\nevicted_keys:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\npubsub_channels:{}\r\npubsub_patterns:{}\r\ntotal_error_replies:{}\r\nacl_access_denied_auth:{}\r\nacl_access_denied_cmd:{}\r\nacl_access_denied_key:{}\r\nacl_access_denied_channel:{}\r\nclient_output_buffer_limit_disconnections:{}\r\nclient_query_buffer_limit_disconnections:{}\r\nevicted_clients:{}\r\ntotal_eviction_exceeded_time:0\r\ncurrent_eviction_exceeded_time:0\r\ntracking_total_keys:{}\r\ntracking_total_items:{}\r\ntracking_total_prefixes:{}\r\n\r\n",
            sum(12),
            sum(0),
            reports.iter().map(|r| r.ops_per_sec).sum::<u64>(),
            sum(14),
            sum(15),
            sum(13),
            shared.repl.sync_full.load(Ordering::Relaxed),
            shared.repl.sync_partial_ok.load(Ordering::Relaxed),
            shared.repl.sync_partial_err.load(Ordering::Relaxed),
            sum(9),
            sum(16),
            sum(10),
            sum(11),
            distinct(reports.iter().flat_map(|r| r.channels.iter())),
            distinct(reports.iter().flat_map(|r| r.patterns.iter())),
            sum(1),
            shared.acl.denied[0].load(Ordering::Relaxed),
            shared.acl.denied[1].load(Ordering::Relaxed),
            shared.acl.denied[2].load(Ordering::Relaxed),
            shared.acl.denied[3].load(Ordering::Relaxed),
            crate::net::conn::OBUF_DISCONNECTIONS.load(Ordering::Relaxed),
            crate::net::conn::QBUF_DISCONNECTIONS.load(Ordering::Relaxed),
            shared.evicted_clients.load(Ordering::Relaxed),
            reports.iter().map(|r| r.tracking_keys).sum::<u64>(),
            reports.iter().map(|r| r.tracking_items).sum::<u64>(),
            shared.tracking.prefixes(),
        );
    }
    if show("replication") {
        s.push_str(&crate::repl::info_section(&shared));
    }
    if show("cpu") {
        let (sys, user) = rusage();
        let _ = write!(
            s,
            "# CPU\r\nused_cpu_sys:{:.6}\r\nused_cpu_user:{:.6}\r\nused_cpu_sys_children:0.000000\r\nused_cpu_user_children:0.000000\r\n\r\n",
            sys, user
        );
    }
    if show("modules") {
        s.push_str("# Modules\r\n\r\n");
    }
    if show("commandstats") {
        s.push_str("# Commandstats\r\n");
        let totals = command_totals(&reports);
        for cmd in &table().commands {
            let total = totals[cmd.id];
            if total.calls + total.rejected + total.failed == 0 {
                continue;
            }
            let per = if total.calls > 0 {
                total.usec as f64 / total.calls as f64
            } else {
                0.0
            };
            let _ = write!(
                s,
                "cmdstat_{}:calls={},usec={},usec_per_call={:.2},rejected_calls={},failed_calls={}\r\n",
                cmd.name, total.calls, total.usec, per, total.rejected, total.failed
            );
        }
        s.push_str("\r\n");
    }
    if show("errorstats") {
        s.push_str("# Errorstats\r\n");
        let mut errors: Vec<(String, u64)> = Vec::new();
        for r in &reports {
            for (k, v) in &r.errors {
                match errors.iter_mut().find(|e| &e.0 == k) {
                    Some(e) => e.1 += v,
                    None => errors.push((k.clone(), *v)),
                }
            }
        }
        errors.sort();
        for (k, v) in errors {
            let _ = write!(s, "errorstat_{}:count={}\r\n", k, v);
        }
        s.push_str("\r\n");
    }
    if show("cluster") {
        s.push_str(if shared.cluster.is_some() {
            "# Cluster\r\ncluster_enabled:1\r\n\r\n"
        } else {
            "# Cluster\r\ncluster_enabled:0\r\n\r\n"
        });
    }
    if show("keyspace") {
        s.push_str("# Keyspace\r\n");
        let dbs = reports.first().map_or(0, |r| r.keyspace.len());
        for db in 0..dbs {
            let keys: u64 = reports.iter().map(|r| r.keyspace[db].0).sum();
            let expires: u64 = reports.iter().map(|r| r.keyspace[db].1).sum();
            if keys > 0 {
                let avg = merged_avg_ttl(reports.iter().map(|r| {
                    let (_, e, avg_ttl) = r.keyspace[db];
                    (e, avg_ttl)
                }));
                let _ = write!(
                    s,
                    "db{}:keys={},expires={},avg_ttl={}\r\n",
                    db, keys, expires, avg
                );
            }
        }
        s.push_str("\r\n");
    }
    if show("queues") {
        s.push_str(&crate::observe::report::info_section(worker).await);
    }
    if show("transactions") {
        let _ = write!(
            s,
            "# Transactions\r\ninline_commands:{}\r\none_hop_commands:{}\r\nmulti_shard_transactions:{}\r\nhops:{}\r\nsquashed_batches:{}\r\nsquashed_commands:{}\r\npipeline_units:{}\r\npipeline_units_refused:{}\r\nmigrations:{}\r\nlock_waits:{}\r\nconvoy_joins:{}\r\nscripts_fast_path:{}\r\nscripts_global_path:{}\r\nscripts_restarted:{}\r\nscripts_escalated:{}\r\nmailbox_messages:{}\r\nmailbox_pushes:{}\r\nmailbox_wakeups:{}\r\nevent_loop_passes:{}\r\nconnections_visited:{}\r\nsend_batches:{}\r\nbatched_sends:{}\r\nshort_sends:{}\r\nread_ahead_batches:{}\r\nreads_ahead:{}\r\nblocking_registrations:{}\r\n\r\n",
            sum(2),
            sum(3),
            sum(4),
            sum(5),
            sum(6),
            sum(7),
            sum(22),
            sum(23),
            sum(8),
            reports.iter().map(|r| r.lock_waits).sum::<u64>(),
            reports.iter().map(|r| r.convoy_joins).sum::<u64>(),
            sum(18),
            sum(19),
            sum(20),
            sum(21),
            mailbox_sum(&worker.shared, |m| &m.messages),
            mailbox_sum(&worker.shared, |m| &m.pushes),
            mailbox_sum(&worker.shared, |m| &m.wakeups),
            loop_sum(|c| c.passes),
            loop_sum(|c| c.visits),
            loop_sum(|c| c.send_batches),
            loop_sum(|c| c.batched_sends),
            loop_sum(|c| c.short_sends),
            loop_sum(|c| c.read_ahead_batches),
            loop_sum(|c| c.reads_ahead),
            sum(17),
        );
    }
    // Sections end with a blank line; the reply ends after the last field.
    while s.ends_with("\r\n\r\n") {
        s.truncate(s.len() - 2);
    }
    s
}

// ---- CONFIG ----

pub const CONFIG_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("get", -3, "admin noscript loading stale"),
    ("help", 2, "loading stale"),
    ("resetstat", 2, "admin noscript loading stale"),
    ("rewrite", 2, "admin noscript loading stale"),
    ("set", -4, "admin noscript loading stale"),
];

const CONFIG_HELP: &[&str] = &[
    "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET <pattern> [<pattern> ...]",
    "    Parameters matching the glob patterns, with their values.",
    "REWRITE",
    "    Rewrites the configuration file with the configuration in force.",
    "SET <parameter> <value> [<parameter> <value> ...]",
    "    Changes parameters at run time, all or none.",
    "RESETSTAT",
    "    Zeroes the statistics INFO reports.",
    "HELP",
    "    Print this help.",
];

pub fn config(sess: &mut Session, args: &[Bytes]) {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    let shared = sess.worker.shared.clone();
    match sub.as_str() {
        "get" => {
            let patterns: Vec<Vec<u8>> = args[2..].iter().map(|a| a.to_vec()).collect();
            let pairs = shared
                .config
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .matching(&patterns);
            sess.out.map(pairs.len());
            for (k, v) in pairs {
                sess.out.bulk(k.as_bytes());
                sess.out.bulk(v.as_bytes());
            }
        }
        "set" => {
            if !args.len().is_multiple_of(2) {
                return sess.error(&super::arity_error("config|set"));
            }
            let pairs: Vec<(String, String)> = args[2..]
                .chunks(2)
                .map(|c| {
                    (
                        String::from_utf8_lossy(&c[0]).into_owned(),
                        String::from_utf8_lossy(&c[1]).into_owned(),
                    )
                })
                .collect();
            let local = crate::net::link(sess.id)
                .is_none_or(|s| s.peer_addr().is_ok_and(|a| a.ip().is_loopback()));
            let mut config = shared.config.lock().unwrap_or_else(|p| p.into_inner());
            // TLS settings take effect together, or not at all (new connections only).
            let tls_before: Vec<(String, String)> = pairs
                .iter()
                .filter(|(k, _)| crate::net::tls::is_tls_setting(&k.to_ascii_lowercase()))
                .filter_map(|(k, _)| {
                    crate::config::find_param(k)
                        .map(|_| (k.clone(), config.get(&k.to_ascii_lowercase()).to_string()))
                })
                .collect();
            let mut result = config.set_many(&pairs, local);
            if result.is_ok() && !tls_before.is_empty() {
                if let Err(e) = crate::net::tls::reload(&config) {
                    tracing::warn!("Failed applying new configuration. Possibly related to new tls-* setting: {e}");
                    for (k, v) in &tls_before {
                        let _ = config.set_initial(k, v);
                    }
                    result = Err(format!("ERR CONFIG SET failed (possibly related to argument '{}') - Unable to update TLS configuration. Check server logs.", tls_before[0].0));
                }
            }
            match result {
                Ok(()) => {
                    shared.tunables.refresh(&config);
                    if pairs
                        .iter()
                        .any(|(k, _)| k.eq_ignore_ascii_case("requirepass"))
                    {
                        shared.acl.set_requirepass(config.get("requirepass"));
                    }
                    shared.acl.log_max_len.store(
                        config.get_i64("acllog-max-len") as u64,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    drop(config);
                    crate::persist::aof::rewrite::on_config_change(&sess.worker);
                    crate::repl::refresh_settings(&shared);
                    // This thread applies queue tracking's settings now and the others
                    // before any later message from here: this client's next command
                    // already counts (or does not), wherever its keys are.
                    if pairs
                        .iter()
                        .any(|(k, _)| k.to_ascii_lowercase().starts_with("queue-tracking"))
                    {
                        crate::observe::configure(&sess.worker);
                        for t in (0..sess.worker.nshards()).filter(|&t| t != sess.worker.id) {
                            shared.send(t, Box::new(|w| crate::observe::configure(w)));
                        }
                    }
                    sess.out.ok();
                }
                Err(e) => {
                    drop(config);
                    sess.error(&e);
                }
            }
        }
        "rewrite" => {
            let result = shared
                .config
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .rewrite();
            match result {
                Ok(()) => {
                    tracing::info!("CONFIG REWRITE executed with success.");
                    sess.out.ok();
                }
                Err(e) => {
                    tracing::warn!("CONFIG REWRITE failed: {e}");
                    sess.error(&e);
                }
            }
        }
        "resetstat" => {
            for target in 0..sess.worker.nshards() {
                let reset = |w: &std::rc::Rc<crate::shard::Worker>| {
                    let mut sh = w.shard.borrow_mut();
                    sh.reset_stats();
                    sh.logs.slow.clear();
                };
                if target == sess.worker.id {
                    reset(&sess.worker);
                } else {
                    shared.send(target, Box::new(reset));
                }
            }
            sess.out.ok();
        }
        "help" => help(sess, CONFIG_HELP),
        _ => unreachable!("subcommands are checked before dispatch"),
    }
}

pub(crate) fn help(sess: &mut Session, lines: &[&str]) {
    sess.out.array(lines.len());
    for l in lines {
        sess.out.simple(l);
    }
}

// ---- COMMAND ----

pub const COMMAND_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("count", 2, "loading stale"),
    ("docs", -2, "loading stale"),
    ("getkeys", -3, "loading stale"),
    ("getkeysandflags", -3, "loading stale"),
    ("help", 2, "loading stale"),
    ("info", -2, "loading stale"),
    ("list", -2, "loading stale"),
];

const COMMAND_HELP: &[&str] = &[
    "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "(no subcommand)",
    "    Details of every command.",
    "COUNT",
    "    How many commands there are.",
    "DOCS [<command-name> ...]",
    "    Documentation of the given commands, or of all.",
    "GETKEYS <full-command>",
    "    The key arguments of a full command line.",
    "GETKEYSANDFLAGS <full-command>",
    "    The key arguments of a full command line, with their access flags.",
    "INFO [<command-name> ...]",
    "    Details of the given commands, or of all.",
    "LIST [FILTERBY (MODULE <module-name>|ACLCAT <category>|PATTERN <pattern>)]",
    "    The names of all commands, optionally filtered.",
    "HELP",
    "    Print this help.",
];

/// The ACL categories COMMAND INFO reports, from the ACL tables (Redis's own lists).
fn acl_categories(cmd: &Command) -> Vec<String> {
    crate::acl::commands::acl_commands().category_names(cmd, None)
}

fn flag_names(f: u32) -> Vec<&'static str> {
    flags::NAMES
        .iter()
        .filter(|(bit, _)| f & bit != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// COMMAND's flags for a command: its own, plus `movablekeys` when key positions depend
/// on the arguments.
fn command_flags(cmd: &Command) -> Vec<&'static str> {
    // Redis does not list may_replicate in COMMAND INFO.
    let mut names: Vec<&str> = flag_names(cmd.flags)
        .into_iter()
        .filter(|n| *n != "may_replicate")
        .collect();
    if matches!(cmd.keys, super::Keys::Custom(..)) {
        names.push("movablekeys");
    }
    names
}

fn write_command_info(sess: &mut Session, cmd: &Command) {
    let (first, last, step) = cmd.key_spec();
    sess.out.array(10);
    sess.out.bulk(cmd.name.as_bytes());
    sess.out.int(cmd.arity as i64);
    let names = command_flags(cmd);
    sess.out.set(names.len());
    for n in names {
        sess.out.simple(n);
    }
    sess.out.int(first as i64);
    sess.out.int(last as i64);
    sess.out.int(step as i64);
    let cats = acl_categories(cmd);
    sess.out.set(cats.len());
    for c in cats {
        sess.out.simple(&c);
    }
    sess.out.set(0);
    sess.out.array(0);
    sess.out.array(cmd.subcommands.len());
    for (name, _, _) in cmd.subcommands {
        write_subcommand_info(sess, cmd, name);
    }
}

/// COMMAND INFO's entry for one subcommand (`container|sub`).
fn write_subcommand_info(sess: &mut Session, cmd: &Command, sub: &str) {
    let Some((name, arity, f)) = cmd.subcommands.iter().find(|(n, _, _)| *n == sub) else {
        return sess.out.null_array();
    };
    sess.out.array(10);
    sess.out.bulk(format!("{}|{}", cmd.name, name).as_bytes());
    sess.out.int(*arity as i64);
    let names = flag_names(flags::parse(f));
    sess.out.set(names.len());
    for n in names {
        sess.out.simple(n);
    }
    // Subcommands of key-taking containers name their key right after themselves.
    let keyed = matches!(cmd.name, "object" | "xgroup" | "xinfo")
        || (cmd.name, *name) == ("memory", "usage");
    let (first, last, step) = if keyed && *name != "help" {
        (2, 2, 1)
    } else {
        (0, 0, 0)
    };
    sess.out.int(first);
    sess.out.int(last);
    sess.out.int(step);
    let cats = crate::acl::commands::acl_commands().category_names(cmd, Some(name));
    sess.out.set(cats.len());
    for c in cats {
        sess.out.simple(&c);
    }
    sess.out.set(0);
    sess.out.array(0);
    sess.out.array(0);
}

/// A command or `container|sub` name: the command, and the subcommand if one is named.
fn lookup_full(name: &[u8]) -> Option<(&'static Command, Option<&'static str>)> {
    let t = table();
    match name.iter().position(|&c| c == b'|') {
        None => t.lookup(name).map(|c| (c, None)),
        Some(i) => {
            let cmd = t.lookup(&name[..i])?;
            let sub = String::from_utf8_lossy(&name[i + 1..]).to_ascii_lowercase();
            let (s, _, _) = cmd.subcommands.iter().find(|(n, _, _)| *n == sub)?;
            Some((cmd, Some(*s)))
        }
    }
}

fn full_name(cmd: &Command, sub: Option<&str>) -> String {
    match sub {
        None => cmd.name.to_string(),
        Some(s) => format!("{}|{}", cmd.name, s),
    }
}

/// Redis's key-spec flags for `cmd` (or the subcommand `full` names).
fn key_spec_flags(cmd: &Command, full: &[Bytes]) -> Option<&'static [&'static [&'static str]]> {
    let name = match full.get(1).filter(|_| !cmd.subcommands.is_empty()) {
        Some(sub) => format!(
            "{}|{}",
            cmd.name,
            String::from_utf8_lossy(sub).to_ascii_lowercase()
        ),
        None => cmd.name.to_string(),
    };
    super::keyspecs::KEY_SPEC_FLAGS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
}

pub fn command(sess: &mut Session, args: &[Bytes]) {
    let t = table();
    if args.len() == 1 {
        sess.out.array(t.len());
        for cmd in &t.commands {
            write_command_info(sess, cmd);
        }
        return;
    }
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "count" => sess.out.int(t.len() as i64),
        "info" => {
            if args.len() == 2 {
                sess.out.array(t.len());
                for cmd in &t.commands {
                    write_command_info(sess, cmd);
                }
                return;
            }
            sess.out.array(args.len() - 2);
            for name in &args[2..] {
                match lookup_full(name) {
                    Some((cmd, None)) => write_command_info(sess, cmd),
                    Some((cmd, Some(sub))) => write_subcommand_info(sess, cmd, sub),
                    None => sess.out.null_array(),
                }
            }
        }
        "docs" => {
            // (name as asked, command, subcommand)
            let cmds: Vec<(String, &Command, Option<&str>)> = if args.len() == 2 {
                t.commands
                    .iter()
                    .map(|c| (c.name.to_string(), c, None))
                    .collect()
            } else {
                args[2..]
                    .iter()
                    .filter_map(|n| lookup_full(n).map(|(c, s)| (full_name(c, s), c, s)))
                    .collect()
            };
            sess.out.map(cmds.len());
            for (name, cmd, sub) in cmds {
                sess.out.bulk(name.as_bytes());
                let summary = match sub {
                    None => cmd.summary.to_string(),
                    Some(s) => format!(
                        "The {} subcommand of {} (see {} HELP).",
                        s.to_ascii_uppercase(),
                        cmd.name.to_ascii_uppercase(),
                        cmd.name.to_ascii_uppercase()
                    ),
                };
                sess.out.map(3);
                sess.out.bulk(b"summary");
                sess.out.bulk(summary.as_bytes());
                sess.out.bulk(b"since");
                sess.out.bulk(cmd.since.as_bytes());
                sess.out.bulk(b"group");
                sess.out.bulk(cmd.group.as_bytes());
            }
        }
        "getkeys" | "getkeysandflags" => {
            let with_flags = sub == "getkeysandflags";
            let Some(cmd) = t.lookup(&args[2]) else {
                return sess.error("ERR Invalid command specified");
            };
            let full = &args[2..];
            let specs = key_spec_flags(cmd, full);
            // MEMORY USAGE names a key though MEMORY itself runs keyless here.
            let memory_usage = cmd.name == "memory" && full.len() > 1 && eq_ci(&full[1], "usage");
            let has_keys = specs.is_some() || !matches!(cmd.keys, super::Keys::None);
            if !has_keys {
                return sess.error("ERR The command has no key arguments");
            }
            if !cmd.arity_ok(full.len()) {
                return sess.error("ERR Invalid number of arguments specified for command");
            }
            let positions = if memory_usage {
                vec![2]
            } else {
                cmd.key_positions(full)
            };
            if positions.is_empty() {
                // Scripts and functions may name no key at all.
                let optional = cmd.has(flags::NO_MANDATORY_KEYS);
                return if optional {
                    sess.out.array(0)
                } else {
                    sess.error("ERR Invalid arguments specified for command")
                };
            }
            sess.out.array(positions.len());
            for (i, p) in positions.into_iter().enumerate() {
                if with_flags {
                    sess.out.array(2);
                    sess.out.bulk(&full[p]);
                    // The i-th key comes from the i-th spec (the last one repeats), save
                    // SORT, whose STORE key is its third spec.
                    let spec = if cmd.name == "sort" && i == 1 { 2 } else { i };
                    let names: Vec<&str> = match specs {
                        Some(s) if !s.is_empty() => s[spec.min(s.len() - 1)].to_vec(),
                        _ if cmd.has(flags::WRITE) => vec!["RW"],
                        _ => vec!["RO"],
                    };
                    sess.out.set(names.len());
                    for n in names {
                        sess.out.simple(n);
                    }
                } else {
                    sess.out.bulk(&full[p]);
                }
            }
        }
        "list" => {
            let mut filter: Option<(String, Bytes)> = None;
            if args.len() > 2 {
                if args.len() != 5 || !eq_ci(&args[2], "filterby") {
                    return sess.error(SYNTAX_ERR);
                }
                filter = Some((
                    String::from_utf8_lossy(&args[3]).to_ascii_lowercase(),
                    args[4].clone(),
                ));
            }
            // Every command, each followed by its subcommands as `container|sub`.
            let all = t.commands.iter().flat_map(|c| {
                std::iter::once((c, c.name.to_string())).chain(
                    c.subcommands
                        .iter()
                        .map(move |(sub, _, _)| (c, format!("{}|{}", c.name, sub))),
                )
            });
            let names: Vec<String> = all
                .filter(|(c, name)| match &filter {
                    None => true,
                    Some((kind, v)) => match kind.as_str() {
                        "pattern" => glob_match(v, name.as_bytes(), true),
                        "aclcat" => {
                            let want =
                                format!("@{}", String::from_utf8_lossy(v).to_ascii_lowercase());
                            acl_categories(c).contains(&want)
                        }
                        _ => false,
                    },
                })
                .map(|(_, name)| name)
                .collect();
            if let Some((kind, _)) = &filter {
                if !["pattern", "aclcat", "module"].contains(&kind.as_str()) {
                    return sess.error(SYNTAX_ERR);
                }
            }
            sess.out.array(names.len());
            for n in names {
                sess.out.bulk(n.as_bytes());
            }
        }
        "help" => help(sess, COMMAND_HELP),
        _ => unreachable!("subcommands are checked before dispatch"),
    }
}

// ---- MODULE ----

pub const MODULE_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("help", 2, "loading stale"),
    ("list", 2, "admin noscript"),
    ("load", -3, "admin noscript no_async_loading"),
    ("loadex", -3, "admin noscript no_async_loading"),
    ("unload", 3, "admin noscript no_async_loading"),
];

const MODULE_HELP: &[&str] = &[
    "MODULE <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "LIST",
    "    The loaded modules (Kite loads none).",
    "LOAD <path> [<arg> ...]",
    "    Kite cannot load Redis modules: answers an error.",
    "LOADEX <path> [[CONFIG NAME VALUE] [CONFIG NAME VALUE]] [ARGS ...]",
    "    Kite cannot load Redis modules: answers an error.",
    "UNLOAD <name>",
    "    Answers that no such module is loaded.",
    "HELP",
    "    Print this help.",
];

/// MODULE: Kite runs no Redis modules (they are C code built against Redis's internals),
/// so the list is empty and loading fails the way a failed load does in Redis.
pub fn module(sess: &mut Session, args: &[Bytes]) {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "list" => sess.out.array(0),
        "load" | "loadex" => {
            tracing::warn!(
                "MODULE {}: Kite cannot load Redis modules ({})",
                sub.to_ascii_uppercase(),
                String::from_utf8_lossy(&args[2])
            );
            sess.error("ERR Error loading the extension. Please check the server logs.")
        }
        "unload" => sess.error("ERR Error unloading module: no such module with that name"),
        "help" => help(sess, MODULE_HELP),
        _ => unreachable!("subcommands are checked before dispatch"),
    }
}

// ---- TIME, LASTSAVE, SHUTDOWN, DEBUG ----

pub fn time(sess: &mut Session, _args: &[Bytes]) {
    write_time(&mut sess.out);
}

/// TIME's reply: unix seconds and microseconds, as bulk strings.
pub fn write_time(out: &mut crate::protocol::reply::Reply) {
    let us = unix_us();
    out.array(2);
    out.bulk((us / 1_000_000).to_string().as_bytes());
    out.bulk((us % 1_000_000).to_string().as_bytes());
}

pub fn lastsave(sess: &mut Session, _args: &[Bytes]) {
    sess.out
        .int(sess.worker.shared.lastsave_unix.load(Ordering::Relaxed) as i64);
}

/// INFO persistence's AOF fields, as Redis 7 names them.
fn aof_info(shared: &crate::shard::Shared) -> String {
    let a = &shared.persist.aof;
    let on = a.file_on();
    let rewriting = a.rewrite_in_progress.load(Ordering::Acquire);
    let cur_secs = if rewriting {
        (unix_ms() / 1000).saturating_sub(a.rewrite_started_unix.load(Ordering::Relaxed)) as i64
    } else {
        -1
    };
    let ok = |b: bool| if b { "ok" } else { "err" };
    let mut s = format!(
        "aof_enabled:{}\r\naof_rewrite_in_progress:{}\r\naof_rewrite_scheduled:{}\r\naof_last_rewrite_time_sec:{}\r\naof_current_rewrite_time_sec:{cur_secs}\r\naof_last_bgrewrite_status:{}\r\naof_rewrites:{}\r\naof_rewrites_consecutive_failures:0\r\naof_last_write_status:{}\r\naof_last_cow_size:0\r\n",
        on as u8,
        rewriting as u8,
        a.rewrite_scheduled.load(Ordering::Acquire) as u8,
        a.last_rewrite_secs.load(Ordering::Relaxed),
        ok(a.last_rewrite_ok.load(Ordering::Relaxed)),
        a.rewrites.load(Ordering::Relaxed),
        ok(a.write_ok.load(Ordering::Relaxed)),
    );
    if on {
        let started = a.started.load(Ordering::Relaxed);
        let durable = a.durable.load(Ordering::Relaxed);
        s.push_str(&format!(
            "aof_current_size:{}\r\naof_base_size:{}\r\naof_pending_rewrite:{}\r\naof_buffer_length:0\r\naof_pending_bio_fsync:{}\r\naof_delayed_fsync:0\r\n",
            a.current_size.load(Ordering::Relaxed),
            a.base_size.load(Ordering::Relaxed),
            a.rewrite_scheduled.load(Ordering::Acquire) as u8,
            started.saturating_sub(durable),
        ));
    }
    s
}

const DEBUG_HELP: &[&str] = &[
    "DEBUG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "OBJECT <key>",
    "    Internal details of the value stored at <key>.",
    "RELOAD [MERGE] [NOFLUSH] [NOSAVE]",
    "    Save the RDB on disk and reload it back to memory.",
    "ERROR <string>",
    "    Replies with <string> as an error (code included).",
    "SET-ACTIVE-EXPIRE <0|1>",
    "    Turns active expiry off or on.",
    "AOF-FSYNC-FAULT <PAUSE|FAIL|OFF>",
    "    Makes the AOF's fsyncs wait, fail with EIO, or run normally (Kite's test hook).",
    "SLEEP <seconds>",
    "    Stops this thread for <seconds> (decimals allowed).",
    "PANIC-ON-KEY <key>",
    "    The next command that names <key> panics on the key's thread (Kite's test hook).",
    "HELP",
    "    Print this help.",
];

// WAIT numreplicas timeout: Kite has no replicas, so the answer is always 0 replicas,
// given at once when none is asked for and after the timeout otherwise (0: never), as
// Redis does without replicas.
/// Whether `enable-debug-command` lets this connection run DEBUG.
fn debug_allowed(sess: &Session) -> bool {
    let setting = sess
        .worker
        .shared
        .config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get("enable-debug-command")
        .to_string();
    match setting.as_str() {
        "yes" => true,
        "local" => crate::net::link(sess.id)
            .is_none_or(|s| s.peer_addr().is_ok_and(|a| a.ip().is_loopback())),
        _ => crate::net::link(sess.id).is_none(),
    }
}

async_handler!(debug, |sess, args| {
    if !debug_allowed(sess) {
        return sess.error("ERR DEBUG command not allowed. If the enable-debug-command option is set to \"local\", you can run it from a local connection, otherwise you need to set this option in the configuration file, and then restart the server.");
    }
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match (sub.as_str(), args.len()) {
        ("help", 2) => help(sess, DEBUG_HELP),
        ("error", 3) => {
            // Replies with the given error, code and all (clients test their error
            // handling with it), newlines made spaces.
            let text: Vec<u8> = args[2]
                .iter()
                .map(|&c| if c == b'\r' || c == b'\n' { b' ' } else { c })
                .collect();
            sess.out.raw(b"-");
            sess.out.raw(&text);
            sess.out.raw(b"\r\n");
        }
        ("reload", _) => super::persistence::debug_reload(sess, &args[2..]).await,
        ("sleep", 3) => {
            let secs = parse_f64(&args[2]).unwrap_or(0.0).max(0.0);
            // Like Redis, this blocks the server thread (here: this connection's thread).
            std::thread::sleep(std::time::Duration::from_secs_f64(secs));
            sess.out.ok();
        }
        ("aof-fsync-fault", 3) => {
            // Kite's fault hook for tests of the write barrier: the AOF's fsyncs wait
            // (PAUSE), fail with EIO (FAIL), or run normally (OFF).
            let mode = String::from_utf8_lossy(&args[2]).to_ascii_lowercase();
            let code = match mode.as_str() {
                "pause" => crate::persist::aof::FAULT_PAUSE,
                "fail" => crate::persist::aof::FAULT_FAIL,
                "off" => crate::persist::aof::FAULT_OFF,
                _ => {
                    return sess
                        .out
                        .error("ERR AOF-FSYNC-FAULT takes PAUSE, FAIL or OFF")
                }
            };
            sess.worker
                .shared
                .persist
                .aof
                .fault
                .store(code, Ordering::Relaxed);
            sess.out.ok();
        }
        ("panic-on-key", 3) => {
            // Kite's test hook: a bug in a command, on demand. The thread must go on
            // serving its other clients and its shard's hops, and keep logging writes.
            let key = args[2].clone();
            let shard = sess.worker.shard_of(&key);
            hop(&sess.worker, shard, move |w| {
                w.shard.borrow_mut().panic_on = Some(key);
            })
            .await;
            sess.out.ok();
        }
        ("set-active-expire", 3) => match parse_i64(&args[2]) {
            Ok(v) => {
                sess.worker
                    .shared
                    .active_expire
                    .store(v != 0, Ordering::Relaxed);
                sess.out.ok();
            }
            Err(e) => sess.error(e),
        },
        ("object", 3) => {
            let db = sess.db;
            let key = args[2].clone();
            let shard = sess.worker.shard_of(&key);
            let found = hop(&sess.worker, shard, move |w| {
                let opts = super::keys::dump_options(&w.shared);
                let mut sh = w.shard.borrow_mut();
                let lru = sh.lru_clock();
                sh.lookup(db, &key, unix_ms()).map(|e| {
                    // The value's length in an RDB file, as Redis's rdbSavedObjectLen.
                    let mut body = crate::persist::rdb::write::Counted::default();
                    crate::persist::rdb::write::put_value(&mut body, &e.value, &opts);
                    format!(
                        "Value at:0x0 refcount:1 encoding:{} serializedlength:{} lru:{} lru_seconds_idle:{}",
                        e.value.encoding(),
                        body.0,
                        e.lru,
                        lru.saturating_sub(e.lru)
                    )
                })
            })
            .await;
            match found {
                Some(text) => sess.out.simple(&text),
                None => sess.error("ERR no such key"),
            }
        }
        _ => sess.error(&format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try DEBUG HELP.",
            printable(&args[1], 128)
        )),
    }
});

// ---- SLOWLOG ----

pub const SLOWLOG_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("get", -2, "admin loading stale"),
    ("help", 2, "loading stale"),
    ("len", 2, "admin loading stale"),
    ("reset", 2, "admin loading stale"),
];

const SLOWLOG_HELP: &[&str] = &[
    "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET [<count>]",
    "    The newest <count> entries (10 by default, -1 for all).",
    "LEN",
    "    How many entries the slow log holds.",
    "RESET",
    "    Empties the slow log.",
    "HELP",
    "    Print this help.",
];

async_handler!(slowlog, |sess, args| {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "get" => {
            let count = match args.get(2) {
                None => 10,
                Some(a) => match parse_i64(a) {
                    Ok(-1) => usize::MAX,
                    Ok(n) if n >= 0 => n as usize,
                    _ => return sess.error("ERR count should be greater than or equal to -1"),
                },
            };
            if args.len() > 3 {
                return sess.error(&super::arity_error("slowlog|get"));
            }
            let logs = broadcast(&sess.worker, |w| {
                w.shard
                    .borrow()
                    .logs
                    .slow
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .await;
            let mut all: Vec<_> = logs.into_iter().flatten().collect();
            all.sort_by_key(|e| std::cmp::Reverse(e.id));
            all.truncate(count);
            sess.out.array(all.len());
            for e in all {
                sess.out.array(6);
                sess.out.int(e.id as i64);
                sess.out.int(e.unix_secs as i64);
                sess.out.int(e.usec as i64);
                sess.out.array(e.args.len());
                for a in &e.args {
                    sess.out.bulk(a);
                }
                sess.out.bulk(e.addr.as_bytes());
                sess.out.bulk(&e.name);
            }
        }
        "len" => {
            let lens = broadcast(&sess.worker, |w| w.shard.borrow().logs.slow.len()).await;
            sess.out.int(lens.iter().sum::<usize>() as i64);
        }
        "reset" => {
            broadcast(&sess.worker, |w| w.shard.borrow_mut().logs.slow.clear()).await;
            sess.out.ok();
        }
        "help" => help(sess, SLOWLOG_HELP),
        _ => unreachable!("subcommands are checked before dispatch"),
    }
});

// ---- MONITOR ----

async_handler!(monitor, |sess, _args| {
    if sess.monitoring {
        return sess.out.ok();
    }
    let tx = sess.push_sender();
    sess.worker
        .clients
        .borrow_mut()
        .monitors
        .push((sess.id, tx));
    sess.worker.shared.monitors.fetch_add(1, Ordering::AcqRel);
    sess.monitoring = true;
    sess.handle.info.borrow_mut().monitor = true;
    sess.out.ok();
});

/// Quotes an argument as MONITOR prints it.
fn monitor_repr(out: &mut Vec<u8>, arg: &[u8]) {
    out.push(b'"');
    for &c in arg {
        match c {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            7 => out.extend_from_slice(b"\\a"),
            8 => out.extend_from_slice(b"\\b"),
            0x20..=0x7e => out.push(c),
            _ => out.extend_from_slice(format!("\\x{:02x}", c).as_bytes()),
        }
    }
    out.push(b'"');
}

/// Sends the line for a command about to run to every MONITOR connection.
pub fn feed_monitors(sess: &Session, cmd: &Command, args: &[Bytes]) {
    let addr = sess.handle.info.borrow().addr.clone();
    // A monitoring connection's own RESET ends its monitoring before the line would
    // reach it (Redis feeds monitors once the command has run).
    let skip = (cmd.name == "reset").then_some(sess.id);
    feed_monitor_line(&sess.worker, sess.db, &addr, cmd, args, skip);
}

/// Sends one MONITOR line: `origin` is the client's address, or `lua` for a command a
/// script runs.
pub fn feed_monitor_line(
    worker: &std::rc::Rc<crate::shard::Worker>,
    db: usize,
    origin: &str,
    cmd: &Command,
    args: &[Bytes],
    skip: Option<u64>,
) {
    let us = unix_us();
    let mut line = format!(
        "+{}.{:06} [{} {}]",
        us / 1_000_000,
        us % 1_000_000,
        db,
        origin
    )
    .into_bytes();
    let redact = cmd.name == "auth" || cmd.name == "hello";
    for (i, a) in args.iter().enumerate() {
        line.push(b' ');
        if redact && i > 0 {
            monitor_repr(&mut line, b"(redacted)");
        } else {
            monitor_repr(&mut line, a);
        }
    }
    line.extend_from_slice(b"\r\n");
    let line = Bytes::from(line);
    for target in 0..worker.nshards() {
        let l = line.clone();
        let deliver = move |w: &std::rc::Rc<crate::shard::Worker>| {
            for (id, tx) in &w.clients.borrow().monitors {
                if Some(*id) != skip {
                    let _ = tx.send(l.clone());
                }
            }
        };
        if target == worker.id {
            deliver(worker);
        } else {
            worker.shared.send(target, Box::new(deliver));
        }
    }
}

/// A mailbox counter summed over the threads.
fn mailbox_sum(
    shared: &crate::shard::Shared,
    counter: impl Fn(&crate::shard::mailbox::Mailbox) -> &std::sync::atomic::AtomicU64,
) -> u64 {
    shared.mailboxes.get().map_or(0, |boxes| {
        boxes
            .iter()
            .map(|m| counter(m).load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    })
}

/// One database's `avg_ttl` over the shards, from each shard's (keys with a TTL, its
/// estimate): each estimate counts as many times as its shard has keys to expire. A
/// shard whose expiry cycle has not sampled yet says 0, "no estimate", as Redis's does:
/// counting its keys would pull the average down until it looks (the threads' cycles
/// run on clocks of their own).
fn merged_avg_ttl(shards: impl Iterator<Item = (u64, u64)>) -> u64 {
    let (mut expires, mut weighted) = (0u128, 0u128);
    for (e, avg_ttl) in shards.filter(|&(_, avg_ttl)| avg_ttl > 0) {
        expires += e as u128;
        weighted += avg_ttl as u128 * e as u128;
    }
    weighted.checked_div(expires).unwrap_or(0) as u64
}

#[cfg(test)]
mod tests {
    use super::merged_avg_ttl;

    #[test]
    fn avg_ttl_ignores_shards_not_yet_sampled() {
        // Each thread's expiry cycle samples on its own clock: a shard that has not yet
        // looked reports 0, which says "no estimate", not "expiring now".
        let shards = [(3000, 1_000_000), (3000, 0), (3000, 998_000), (0, 0)];
        assert_eq!(merged_avg_ttl(shards.into_iter()), 999_000);
        assert_eq!(merged_avg_ttl([(5, 0), (0, 0)].into_iter()), 0);
        assert_eq!(merged_avg_ttl(std::iter::empty()), 0);
        assert_eq!(merged_avg_ttl([(1, 10), (3, 30)].into_iter()), 25);
    }
}
