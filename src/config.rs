//! Configuration: every parameter Kite knows, from the command line, a redis.conf-style
//! file, or CONFIG SET; and the few read on hot paths, mirrored into atomics.
//!
//! Redis parameters Kite does not act on (yet) are accepted and reported so existing
//! configuration files and test suites keep working; `used: false` marks them.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[derive(Clone, Copy)]
pub enum Kind {
    Int(i64, i64),
    /// A byte count that accepts units (`100mb`, `1gb`).
    Memory,
    Bool,
    Enum(&'static [&'static str]),
    Text,
}

pub struct Param {
    pub name: &'static str,
    pub alias: Option<&'static str>,
    pub kind: Kind,
    pub default: &'static str,
    pub mutable: bool,
    /// False when Kite only stores the value (Redis settings without effect here).
    pub used: bool,
}

const fn p(
    name: &'static str,
    kind: Kind,
    default: &'static str,
    mutable: bool,
    used: bool,
) -> Param {
    Param {
        name,
        alias: None,
        kind,
        default,
        mutable,
        used,
    }
}

const I64MAX: i64 = i64::MAX;
const YESNO: Kind = Kind::Bool;
const POLICIES: &[&str] = &[
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "noeviction",
];

pub static PARAMS: &[Param] = &[
    // What Kite acts on.
    p("port", Kind::Int(0, 65535), "6379", false, true),
    p("bind", Kind::Text, "127.0.0.1", false, true),
    Param {
        alias: Some("proactor_threads"),
        ..p("threads", Kind::Int(0, 1024), "0", false, true)
    },
    p("requirepass", Kind::Text, "", true, true),
    p("aclfile", Kind::Text, "", false, true),
    // TLS (net::tls). The port is fixed at start-up; certificates reload by CONFIG SET.
    p("tls-port", Kind::Int(0, 65535), "0", false, true),
    p("tls-cert-file", Kind::Text, "", true, true),
    p("tls-key-file", Kind::Text, "", true, true),
    p("tls-ca-cert-file", Kind::Text, "", true, true),
    p("tls-ca-cert-dir", Kind::Text, "", true, true),
    p(
        "tls-auth-clients",
        Kind::Enum(&["yes", "no", "optional"]),
        "yes",
        true,
        true,
    ),
    p("tls-protocols", Kind::Text, "", true, true),
    p("tls-ciphers", Kind::Text, "", true, true),
    p("tls-ciphersuites", Kind::Text, "", true, true),
    p("tls-prefer-server-ciphers", YESNO, "no", true, true),
    p("tls-replication", YESNO, "no", true, true),
    p("tls-cluster", YESNO, "no", true, false),
    p("tls-session-caching", YESNO, "yes", true, false),
    p("tls-key-file-pass", Kind::Text, "", true, false),
    p("tls-client-cert-file", Kind::Text, "", true, false),
    p("tls-client-key-file", Kind::Text, "", true, false),
    p("acllog-max-len", Kind::Int(0, I64MAX), "128", true, true),
    p(
        "acl-pubsub-default",
        Kind::Enum(&["allchannels", "resetchannels"]),
        "resetchannels",
        true,
        true,
    ),
    p("databases", Kind::Int(1, 1 << 20), "16", false, true),
    p("maxclients", Kind::Int(1, I64MAX), "10000", true, true),
    p("timeout", Kind::Int(0, I64MAX), "0", true, true),
    p("shard-round-robin-prefix", Kind::Text, "", false, true),
    p("queue-key-prefixes", Kind::Text, "bull,bq", false, true),
    // Queue metrics and the HTTP side (docs/observe.md).
    p("queue-tracking", YESNO, "yes", true, true),
    p(
        "queue-tracking-max-queues",
        Kind::Int(1, 1 << 20),
        "1024",
        true,
        true,
    ),
    p("http-port", Kind::Int(0, 65535), "0", false, true),
    p("http-open-metrics", YESNO, "no", true, true),
    p("lock-on-hashtags", YESNO, "yes", false, true),
    p("migrate-connections", YESNO, "yes", true, true),
    // Kite's own: how many times a thread about to sleep yields its core first
    // (docs/event-loop.md, "What --threads 2 costs on two cores").
    p("park-yields", Kind::Int(0, 64), "1", true, true),
    // Kite's own: "auto" sends each pass's replies through io_uring where the kernel
    // allows it; "epoll" writes them one by one (docs/event-loop.md).
    p(
        "event-loop",
        Kind::Enum(&["auto", "epoll"]),
        "auto",
        false,
        true,
    ),
    p(
        "loglevel",
        Kind::Enum(&["debug", "verbose", "notice", "warning", "nothing"]),
        "notice",
        true,
        true,
    ),
    p("logfile", Kind::Text, "", false, true),
    p("proto-max-bulk-len", Kind::Memory, "536870912", true, true),
    p("maxmemory", Kind::Memory, "0", true, true),
    p(
        "maxmemory-policy",
        Kind::Enum(POLICIES),
        "noeviction",
        true,
        true,
    ),
    p(
        "slowlog-log-slower-than",
        Kind::Int(-1, I64MAX),
        "10000",
        true,
        true,
    ),
    p("slowlog-max-len", Kind::Int(0, I64MAX), "128", true, true),
    p(
        "latency-monitor-threshold",
        Kind::Int(0, I64MAX),
        "0",
        true,
        true,
    ),
    p("hz", Kind::Int(1, 500), "10", true, true),
    p("notify-keyspace-events", Kind::Text, "", true, true),
    // Accepted and reported; no effect in Kite (yet).
    p("save", Kind::Text, "3600 1 300 100 60 10000", true, true),
    p("appendonly", YESNO, "no", true, true),
    p(
        "appendfsync",
        Kind::Enum(&["always", "everysec", "no"]),
        "everysec",
        true,
        true,
    ),
    p("appendfilename", Kind::Text, "appendonly.aof", false, true),
    p("appenddirname", Kind::Text, "appendonlydir", false, true),
    p("aof-load-truncated", YESNO, "yes", true, true),
    p("dir", Kind::Text, ".", true, true),
    p("dbfilename", Kind::Text, "dump.rdb", true, true),
    p("daemonize", YESNO, "no", false, false),
    p("protected-mode", YESNO, "yes", true, true),
    p("tcp-backlog", Kind::Int(0, I64MAX), "511", false, false),
    p("tcp-keepalive", Kind::Int(0, I64MAX), "300", true, false),
    p("unixsocket", Kind::Text, "", false, false),
    p("unixsocketperm", Kind::Int(0, 0o777), "0", false, false),
    p(
        "supervised",
        Kind::Enum(&["upstart", "systemd", "auto", "no"]),
        "no",
        false,
        false,
    ),
    p("pidfile", Kind::Text, "", false, false),
    p("always-show-logo", YESNO, "no", false, false),
    p("set-proc-title", YESNO, "yes", false, false),
    p("stop-writes-on-bgsave-error", YESNO, "yes", true, true),
    p("rdbcompression", YESNO, "yes", true, true),
    // Kite's own: the RDB version written (10: Redis 7.0 and later load it; 11: 7.2).
    p("rdb-version", Kind::Int(10, 11), "10", true, true),
    p("rdbchecksum", YESNO, "yes", false, true),
    p("rdb-del-sync-files", YESNO, "no", true, false),
    // Replication (src/repl/).
    Param {
        alias: Some("slave-serve-stale-data"),
        ..p("replica-serve-stale-data", YESNO, "yes", true, true)
    },
    Param {
        alias: Some("slave-read-only"),
        ..p("replica-read-only", YESNO, "yes", true, true)
    },
    p("repl-diskless-sync", YESNO, "yes", true, true),
    p(
        "repl-diskless-sync-delay",
        Kind::Int(0, I64MAX),
        "5",
        true,
        true,
    ),
    p(
        "repl-diskless-sync-max-replicas",
        Kind::Int(0, I64MAX),
        "0",
        true,
        false,
    ),
    p(
        "repl-diskless-load",
        Kind::Enum(&["disabled", "on-empty-db", "swapdb"]),
        "disabled",
        true,
        false,
    ),
    p("repl-backlog-size", Kind::Memory, "1048576", true, true),
    p("repl-backlog-ttl", Kind::Int(0, I64MAX), "3600", true, true),
    Param {
        alias: Some("repl-ping-slave-period"),
        ..p(
            "repl-ping-replica-period",
            Kind::Int(1, I64MAX),
            "10",
            true,
            true,
        )
    },
    p("repl-timeout", Kind::Int(1, I64MAX), "60", true, true),
    p("repl-disable-tcp-nodelay", YESNO, "no", true, false),
    Param {
        alias: Some("slaveof"),
        ..p("replicaof", Kind::Text, "", false, true)
    },
    p("masterauth", Kind::Text, "", true, true),
    p("masteruser", Kind::Text, "", true, true),
    Param {
        alias: Some("min-slaves-to-write"),
        ..p(
            "min-replicas-to-write",
            Kind::Int(0, I64MAX),
            "0",
            true,
            true,
        )
    },
    Param {
        alias: Some("min-slaves-max-lag"),
        ..p(
            "min-replicas-max-lag",
            Kind::Int(0, I64MAX),
            "10",
            true,
            true,
        )
    },
    Param {
        alias: Some("slave-priority"),
        ..p("replica-priority", Kind::Int(0, I64MAX), "100", true, true)
    },
    p("replica-announced", YESNO, "yes", true, true),
    Param {
        alias: Some("slave-announce-ip"),
        ..p("replica-announce-ip", Kind::Text, "", true, true)
    },
    Param {
        alias: Some("slave-announce-port"),
        ..p(
            "replica-announce-port",
            Kind::Int(0, 65535),
            "0",
            true,
            true,
        )
    },
    p("replica-ignore-maxmemory", YESNO, "yes", true, false),
    p("replica-lazy-flush", YESNO, "no", true, false),
    p("lazyfree-lazy-eviction", YESNO, "no", true, false),
    p("lazyfree-lazy-expire", YESNO, "no", true, false),
    p("lazyfree-lazy-server-del", YESNO, "no", true, false),
    p("lazyfree-lazy-user-del", YESNO, "no", true, false),
    p("lazyfree-lazy-user-flush", YESNO, "no", true, false),
    p(
        "hash-max-listpack-entries",
        Kind::Int(0, I64MAX),
        "512",
        true,
        false,
    ),
    p(
        "hash-max-listpack-value",
        Kind::Int(0, I64MAX),
        "64",
        true,
        false,
    ),
    p(
        "hash-max-ziplist-entries",
        Kind::Int(0, I64MAX),
        "512",
        true,
        false,
    ),
    p(
        "hash-max-ziplist-value",
        Kind::Int(0, I64MAX),
        "64",
        true,
        false,
    ),
    p(
        "list-max-listpack-size",
        Kind::Int(i64::MIN, I64MAX),
        "-2",
        true,
        false,
    ),
    p(
        "list-max-ziplist-size",
        Kind::Int(i64::MIN, I64MAX),
        "-2",
        true,
        false,
    ),
    p(
        "list-compress-depth",
        Kind::Int(0, I64MAX),
        "0",
        true,
        false,
    ),
    p(
        "set-max-intset-entries",
        Kind::Int(0, I64MAX),
        "512",
        true,
        false,
    ),
    p(
        "set-max-listpack-entries",
        Kind::Int(0, I64MAX),
        "128",
        true,
        false,
    ),
    p(
        "set-max-listpack-value",
        Kind::Int(0, I64MAX),
        "64",
        true,
        false,
    ),
    p(
        "zset-max-listpack-entries",
        Kind::Int(0, I64MAX),
        "128",
        true,
        false,
    ),
    p(
        "zset-max-listpack-value",
        Kind::Int(0, I64MAX),
        "64",
        true,
        false,
    ),
    p(
        "zset-max-ziplist-entries",
        Kind::Int(0, I64MAX),
        "128",
        true,
        false,
    ),
    p(
        "zset-max-ziplist-value",
        Kind::Int(0, I64MAX),
        "64",
        true,
        false,
    ),
    p("hll-sparse-max-bytes", Kind::Memory, "3000", true, true),
    p(
        "tracking-table-max-keys",
        Kind::Int(0, I64MAX),
        "1000000",
        true,
        true,
    ),
    p("stream-node-max-bytes", Kind::Memory, "4096", true, false),
    p(
        "stream-node-max-entries",
        Kind::Int(0, I64MAX),
        "100",
        true,
        false,
    ),
    p("activerehashing", YESNO, "yes", true, false),
    p("activedefrag", YESNO, "no", true, false),
    p("dynamic-hz", YESNO, "yes", true, false),
    p(
        "client-output-buffer-limit",
        Kind::Text,
        "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60",
        true,
        true,
    ),
    p(
        "client-query-buffer-limit",
        Kind::Memory,
        "1073741824",
        true,
        true,
    ),
    p("aof-use-rdb-preamble", YESNO, "yes", true, true),
    p("aof-rewrite-incremental-fsync", YESNO, "yes", true, false),
    p(
        "auto-aof-rewrite-percentage",
        Kind::Int(0, I64MAX),
        "100",
        true,
        true,
    ),
    p(
        "auto-aof-rewrite-min-size",
        Kind::Memory,
        "67108864",
        true,
        true,
    ),
    p("no-appendfsync-on-rewrite", YESNO, "no", true, false),
    Param {
        alias: Some("lua-time-limit"),
        ..p(
            "busy-reply-threshold",
            Kind::Int(0, I64MAX),
            "5000",
            true,
            true,
        )
    },
    // Cluster mode (src/cluster/, docs/cluster.md).
    p("cluster-enabled", YESNO, "no", false, true),
    p("cluster-config-file", Kind::Text, "nodes.conf", false, true),
    p(
        "cluster-node-timeout",
        Kind::Int(0, I64MAX),
        "15000",
        true,
        true,
    ),
    p("cluster-port", Kind::Int(0, 65535), "0", false, true),
    p("cluster-announce-ip", Kind::Text, "", true, true),
    p(
        "cluster-announce-port",
        Kind::Int(0, 65535),
        "0",
        true,
        true,
    ),
    p(
        "cluster-announce-bus-port",
        Kind::Int(0, 65535),
        "0",
        true,
        true,
    ),
    p(
        "cluster-announce-tls-port",
        Kind::Int(0, 65535),
        "0",
        true,
        true,
    ),
    p("cluster-announce-hostname", Kind::Text, "", true, true),
    p(
        "cluster-announce-human-nodename",
        Kind::Text,
        "",
        true,
        true,
    ),
    p("cluster-require-full-coverage", YESNO, "yes", true, true),
    p("cluster-allow-reads-when-down", YESNO, "no", true, true),
    p(
        "cluster-allow-pubsubshard-when-down",
        YESNO,
        "yes",
        true,
        false,
    ),
    Param {
        alias: Some("cluster-slave-validity-factor"),
        ..p(
            "cluster-replica-validity-factor",
            Kind::Int(0, I64MAX),
            "10",
            true,
            true,
        )
    },
    p("cluster-allow-replica-migration", YESNO, "yes", true, true),
    p(
        "cluster-migration-barrier",
        Kind::Int(0, I64MAX),
        "1",
        true,
        false,
    ),
    Param {
        alias: Some("cluster-slave-no-failover"),
        ..p("cluster-replica-no-failover", YESNO, "no", true, true)
    },
    p("cluster-link-sendbuf-limit", Kind::Memory, "0", true, false),
    p(
        "cluster-preferred-endpoint-type",
        Kind::Enum(&["ip", "hostname", "unknown-endpoint"]),
        "ip",
        true,
        false,
    ),
    p("io-threads", Kind::Int(1, 128), "1", false, false),
    p("io-threads-do-reads", YESNO, "no", false, false),
    p("maxmemory-samples", Kind::Int(1, 64), "5", true, true),
    p("maxmemory-clients", Kind::Text, "0", true, true),
    p("lfu-log-factor", Kind::Int(0, I64MAX), "10", true, true),
    p("lfu-decay-time", Kind::Int(0, I64MAX), "1", true, true),
    p(
        "enable-debug-command",
        Kind::Enum(&["yes", "no", "local"]),
        "no",
        false,
        true,
    ),
    p(
        "enable-protected-configs",
        Kind::Enum(&["yes", "no", "local"]),
        "no",
        false,
        false,
    ),
    p(
        "enable-module-command",
        Kind::Enum(&["yes", "no", "local"]),
        "no",
        false,
        false,
    ),
    p("latency-tracking", YESNO, "yes", true, false),
    p("syslog-enabled", YESNO, "no", false, false),
    p("jemalloc-bg-thread", YESNO, "yes", true, false),
    p("crash-log-enabled", YESNO, "yes", true, false),
    p(
        "activedefrag-ignore-bytes",
        Kind::Memory,
        "104857600",
        true,
        false,
    ),
    p("active-expire-effort", Kind::Int(1, 10), "1", true, false),
];

/// Settings CONFIG SET changes only with `enable-protected-configs` (Redis 7: where data
/// files go).
const PROTECTED: &[&str] = &["dir", "dbfilename"];

pub fn find_param(name: &str) -> Option<usize> {
    let lower = name.to_ascii_lowercase();
    PARAMS
        .iter()
        .position(|p| p.name == lower || p.alias == Some(lower.as_str()))
}

/// Parses a byte count with Redis's units: b, k, kb, m, mb, g, gb (k = 1000, kb = 1024).
pub fn parse_memory(s: &str) -> Option<u64> {
    // Redis's memtoull reads an empty value as 0.
    if s.is_empty() {
        return Some(0);
    }
    let lower = s.to_ascii_lowercase();
    let split = lower
        .find(|c: char| !c.is_ascii_digit() && c != '-')
        .unwrap_or(lower.len());
    let (num, unit) = lower.split_at(split);
    let n: i64 = num.parse().ok()?;
    if n < 0 {
        return None;
    }
    let mul: u64 = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1024 * 1024,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1024 * 1024 * 1024,
        _ => return None,
    };
    (n as u64).checked_mul(mul)
}

/// Normalises a value for storage, or says why it is not acceptable.
fn validate(param: &Param, value: &str) -> Result<String, String> {
    if param.name == "maxmemory-clients" {
        // Bytes, or a percentage of maxmemory (`10%`), as Redis takes it.
        if let Some(pct) = value.strip_suffix('%') {
            return match pct.parse::<u64>() {
                Ok(p) if p <= 100 => Ok(format!("{p}%")),
                _ => Err("argument must be a memory or percent value".into()),
            };
        }
        return parse_memory(value)
            .map(|v| v.to_string())
            .ok_or_else(|| "argument must be a memory or percent value".to_string());
    }
    if param.name == "save" {
        return match crate::persist::snapshot::parse_save_points(value) {
            Some(_) => Ok(value.split_whitespace().collect::<Vec<_>>().join(" ")),
            None => Err("Invalid save parameters".into()),
        };
    }
    if param.name == "dir" {
        // Kept absolute, as Redis (which chdir()s there) reports it.
        return match std::fs::canonicalize(value) {
            Ok(p) if p.is_dir() => Ok(p.to_string_lossy().into_owned()),
            Ok(_) => Err("Not a directory".into()),
            Err(e) => Err(match e.kind() {
                std::io::ErrorKind::NotFound => "No such file or directory".into(),
                std::io::ErrorKind::PermissionDenied => "Permission denied".into(),
                _ => e.to_string(),
            }),
        };
    }
    if param.name == "dbfilename" && (value.contains('/') || value.is_empty()) {
        return Err("dbfilename can't be a path, just a filename".into());
    }
    if param.name == "notify-keyspace-events" {
        return crate::pubsub::parse_classes(value)
            .map(crate::pubsub::classes_text)
            .ok_or_else(|| "Invalid event class character. Use 'Ag$lshzxeKEtmdn'.".to_string());
    }
    match param.kind {
        Kind::Int(min, max) => {
            let v: i64 = value
                .parse()
                .map_err(|_| "argument couldn't be parsed into an integer".to_string())?;
            if v < min || v > max {
                return Err(format!(
                    "argument must be between {} and {} inclusive",
                    min, max
                ));
            }
            Ok(v.to_string())
        }
        Kind::Memory => parse_memory(value)
            .map(|v| v.to_string())
            .ok_or_else(|| "argument must be a memory value".to_string()),
        Kind::Bool => match value.to_ascii_lowercase().as_str() {
            "yes" | "true" | "on" | "1" => Ok("yes".into()),
            "no" | "false" | "off" | "0" => Ok("no".into()),
            _ => Err("argument must be 'yes' or 'no'".into()),
        },
        Kind::Enum(options) => {
            let lower = value.to_ascii_lowercase();
            if options.contains(&lower.as_str()) {
                Ok(lower)
            } else {
                Err(format!(
                    "argument(s) must be one of the following: {}",
                    options.join(", ")
                ))
            }
        }
        Kind::Text => Ok(value.to_string()),
    }
}

#[derive(Clone)]
pub struct Config {
    values: Vec<String>,
    pub file: Option<std::path::PathBuf>,
    /// `user <name> <rules...>` lines of the configuration file, for ACL at start-up.
    pub user_lines: Vec<Vec<String>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            values: PARAMS.iter().map(|p| p.default.to_string()).collect(),
            file: None,
            user_lines: Vec::new(),
        }
    }
}

impl Config {
    pub fn get(&self, name: &str) -> &str {
        let i = find_param(name).unwrap_or_else(|| panic!("unknown parameter {name}"));
        &self.values[i]
    }

    pub fn get_i64(&self, name: &str) -> i64 {
        self.get(name).parse().unwrap_or(0)
    }

    pub fn get_bool(&self, name: &str) -> bool {
        self.get(name) == "yes"
    }

    /// Settings changed from their defaults that Kite stores but does not act on.
    pub fn ignored_settings(&self) -> Vec<(&'static str, &str)> {
        PARAMS
            .iter()
            .zip(&self.values)
            .filter(|(p, v)| !p.used && v.as_str() != p.default)
            .map(|(p, v)| (p.name, v.as_str()))
            .collect()
    }

    /// Sets a parameter at start-up (file or flags): immutability does not apply.
    pub fn set_initial(&mut self, name: &str, value: &str) -> Result<(), String> {
        let i = find_param(name)
            .ok_or_else(|| format!("Bad directive or wrong number of arguments: '{}'", name))?;
        let value = if PARAMS[i].name == "client-output-buffer-limit" {
            merge_output_buffer_limits(&self.values[i], value)?
        } else {
            value.to_string()
        };
        self.values[i] = validate(&PARAMS[i], &value)?;
        Ok(())
    }

    /// CONFIG SET of several pairs: all or nothing, with Redis's error texts.
    /// `local`: the request came over loopback (`enable-protected-configs local`).
    pub fn set_many(&mut self, pairs: &[(String, String)], local: bool) -> Result<(), String> {
        let mut staged = self.values.clone();
        let protected_ok = match self.get("enable-protected-configs") {
            "yes" => true,
            "local" => local,
            _ => false,
        };
        for (name, value) in pairs {
            let Some(i) = find_param(name) else {
                return Err(format!(
                    "ERR Unknown option or number of arguments for CONFIG SET - '{}'",
                    name
                ));
            };
            let param = &PARAMS[i];
            if !param.mutable {
                return Err(format!(
                    "ERR CONFIG SET failed (possibly related to argument '{}') - can't set immutable config",
                    name
                ));
            }
            if PROTECTED.contains(&param.name) && !protected_ok {
                return Err(format!(
                    "ERR CONFIG SET failed (possibly related to argument '{}') - can't set protected config",
                    name
                ));
            }
            let value = if param.name == "client-output-buffer-limit" {
                merge_output_buffer_limits(&staged[i], value)
            } else {
                Ok(value.clone())
            };
            staged[i] = value.and_then(|v| validate(param, &v)).map_err(|why| {
                format!(
                    "ERR CONFIG SET failed (possibly related to argument '{}') - {}",
                    name, why
                )
            })?;
        }
        self.values = staged;
        Ok(())
    }

    /// Pairs of (name, value) whose names match any of the glob patterns.
    pub fn matching(&self, patterns: &[Vec<u8>]) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = Vec::new();
        for (i, p) in PARAMS.iter().enumerate() {
            let names = std::iter::once(p.name).chain(p.alias);
            for name in names {
                if patterns
                    .iter()
                    .any(|pat| crate::commands::util::glob_match(pat, name.as_bytes(), true))
                    && !out.iter().any(|(n, _)| *n == name)
                {
                    out.push((name, self.values[i].clone()));
                }
            }
        }
        out
    }

    /// Reads a redis.conf-style file: `name value...` lines, `#` comments.
    pub fn load_file(&mut self, path: &std::path::Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "Fatal error, can't open config file '{}': {}",
                path.display(),
                e
            )
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words = split_config_line(line).ok_or_else(|| {
                format!("line {}: unbalanced quotes in configuration line", n + 1)
            })?;
            let Some((name, rest)) = words.split_first() else {
                continue;
            };
            if name.eq_ignore_ascii_case("user") {
                self.user_lines.push(rest.to_vec());
                continue;
            }
            let value = rest.join(" ");
            self.set_initial(name, &value).map_err(|e| {
                format!(
                    "*** FATAL CONFIG FILE ERROR *** line {}: {}: {}",
                    n + 1,
                    line,
                    e
                )
            })?;
        }
        self.file = Some(path.to_path_buf());
        Ok(())
    }
}

impl Config {
    /// CONFIG REWRITE: rewrites the file the server started with so it holds the
    /// configuration in force. Lines of known options take the current value where they
    /// stand (a repeated option keeps its first line); comments, blank lines and unknown
    /// lines stay; options changed from their defaults and not in the file are added at
    /// the end. The new file replaces the old one atomically.
    pub fn rewrite(&self) -> Result<(), String> {
        let Some(path) = &self.file else {
            return Err("ERR The server is running without a config file".into());
        };
        let old = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("ERR Rewriting config file: {e}")),
        };
        let mut written = vec![false; PARAMS.len()];
        let mut out = String::new();
        const MARK: &str = "# Generated by CONFIG REWRITE";
        for line in old.lines() {
            let trimmed = line.trim();
            if trimmed == MARK {
                continue;
            }
            let name = split_config_line(trimmed)
                .and_then(|w| w.into_iter().next())
                .filter(|_| !trimmed.starts_with('#'));
            let Some(i) = name.as_deref().and_then(find_param) else {
                out.push_str(line);
                out.push('\n');
                continue;
            };
            if written[i] {
                continue;
            }
            written[i] = true;
            if let Some(l) = self.config_line(i) {
                out.push_str(&l);
                out.push('\n');
            }
        }
        let mut added = false;
        for (i, p) in PARAMS.iter().enumerate() {
            if written[i] || self.values[i] == p.default {
                continue;
            }
            if let Some(l) = self.config_line(i) {
                if !added {
                    out.push_str(MARK);
                    out.push('\n');
                    added = true;
                }
                out.push_str(&l);
                out.push('\n');
            }
        }
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(out.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("ERR Rewriting config file: {e}")
        })
    }

    /// The line that sets option `i` to its current value; None for an empty
    /// `replicaof` (a master has no such line).
    fn config_line(&self, i: usize) -> Option<String> {
        let p = &PARAMS[i];
        let v = &self.values[i];
        if p.name == "replicaof" {
            return (!v.trim().is_empty()).then(|| format!("replicaof {v}"));
        }
        if p.name == "save" {
            return Some(if v.is_empty() {
                "save \"\"".to_string()
            } else {
                format!("save {v}")
            });
        }
        if p.name == "client-output-buffer-limit" {
            // One line per class, as Redis writes it.
            let words: Vec<&str> = v.split_whitespace().collect();
            let lines: Vec<String> = words
                .chunks(4)
                .map(|c| format!("client-output-buffer-limit {}", c.join(" ")))
                .collect();
            return Some(lines.join("\n"));
        }
        let needs_quotes = v.is_empty()
            || v.chars()
                .any(|c| c.is_whitespace() || c == '"' || c == '\'');
        Some(if needs_quotes {
            format!(
                "{} \"{}\"",
                p.name,
                v.replace('\\', "\\\\").replace('"', "\\\"")
            )
        } else {
            format!("{} {v}", p.name)
        })
    }
}

/// Splits a configuration line into words, honouring double and single quotes.
fn split_config_line(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&first) = chars.peek() else {
            return Some(words);
        };
        let mut word = String::new();
        if first == '"' || first == '\'' {
            chars.next();
            loop {
                match chars.next() {
                    None => return None,
                    Some(c) if c == first => break,
                    Some('\\') if first == '"' => match chars.next() {
                        Some('n') => word.push('\n'),
                        Some('t') => word.push('\t'),
                        Some(c) => word.push(c),
                        None => return None,
                    },
                    Some(c) => word.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                word.push(c);
                chars.next();
            }
        }
        words.push(word);
    }
}

/// `client-output-buffer-limit` as Redis changes it: the classes named replace theirs,
/// the others stay; the result lists all three in bytes, in Redis's order.
fn merge_output_buffer_limits(current: &str, change: &str) -> Result<String, String> {
    let words: Vec<&str> = change.split_whitespace().collect();
    if words.is_empty() || !words.len().is_multiple_of(4) {
        return Err("Wrong number of arguments in buffer limit configuration.".into());
    }
    let mut classes: Vec<(&str, (u64, u64, u64))> = ["normal", "slave", "pubsub"]
        .iter()
        .map(|c| (*c, output_buffer_class(current, c).unwrap_or((0, 0, 0))))
        .collect();
    for w in words.chunks(4) {
        let class = match w[0].to_ascii_lowercase().as_str() {
            "normal" => "normal",
            "replica" | "slave" => "slave",
            "pubsub" => "pubsub",
            _ => {
                return Err("Invalid client class specified in buffer limit configuration.".into())
            }
        };
        let hard = parse_memory(w[1]);
        let soft = parse_memory(w[2]);
        let secs = w[3].parse::<u64>().ok();
        let (Some(hard), Some(soft), Some(secs)) = (hard, soft, secs) else {
            return Err(
                "Error in hard, soft or soft_seconds setting in buffer limit configuration.".into(),
            );
        };
        if let Some(slot) = classes.iter_mut().find(|(c, _)| *c == class) {
            slot.1 = (hard, soft, secs);
        }
    }
    Ok(classes
        .iter()
        .map(|(c, (h, s, t))| format!("{c} {h} {s} {t}"))
        .collect::<Vec<_>>()
        .join(" "))
}

/// One class of `client-output-buffer-limit` (`normal`, `replica` or `slave`, `pubsub`):
/// hard bytes, soft bytes, soft seconds.
pub fn output_buffer_class(setting: &str, class: &str) -> Option<(u64, u64, u64)> {
    let words: Vec<&str> = setting.split_whitespace().collect();
    let same = |w: &str| {
        w == class || (matches!(w, "replica" | "slave") && matches!(class, "replica" | "slave"))
    };
    words
        .chunks(4)
        .rfind(|w| w.len() == 4 && same(w[0]))
        .map(|w| {
            let mem = |s: &str| parse_memory(s).unwrap_or(0);
            (mem(w[1]), mem(w[2]), w[3].parse().unwrap_or(0))
        })
}

/// Settings read on hot paths, kept in atomics so no thread takes a lock to read them.
pub struct Tunables {
    pub databases: usize,
    pub maxclients: AtomicUsize,
    pub timeout_secs: AtomicU64,
    pub proto_max_bulk_len: AtomicUsize,
    pub maxmemory: AtomicU64,
    pub migrate_connections: AtomicBool,
    pub park_yields: AtomicU32,
    pub slowlog_slower_than: AtomicI64,
    pub slowlog_max_len: AtomicUsize,
    pub latency_threshold_ms: AtomicU64,
    /// notify-keyspace-events as `pubsub::class` flags.
    pub notify_flags: AtomicU32,
    pub busy_reply_threshold_ms: AtomicU64,
    /// `client-output-buffer-limit` for the normal and pubsub classes: hard, soft bytes
    /// and soft seconds (the replica class lives in `repl`).
    pub obuf_normal: [AtomicU64; 3],
    pub obuf_pubsub: [AtomicU64; 3],
    pub query_buffer_limit: AtomicUsize,
    pub protected_mode: AtomicBool,
    /// `maxmemory-clients`: bytes, or a percentage of maxmemory when `..._percent`.
    pub maxmemory_clients: AtomicU64,
    pub maxmemory_clients_percent: AtomicBool,
    pub hll_sparse_max_bytes: AtomicUsize,
    pub tracking_table_max_keys: AtomicUsize,
    /// `maxmemory-policy` as `shard::evict::Policy::to_u8`, and its knobs.
    pub maxmemory_policy: std::sync::atomic::AtomicU8,
    /// The policy is an LFU one (read on every key access).
    pub lfu: AtomicBool,
    pub maxmemory_samples: AtomicUsize,
    pub lfu_log_factor: AtomicU64,
    pub lfu_decay_time: AtomicU64,
    /// `queue-tracking` and `queue-tracking-max-queues`: read by each thread's
    /// housekeeping, never on the command path.
    pub queue_tracking: AtomicBool,
    pub queue_tracking_max: AtomicUsize,
    pub http_open_metrics: AtomicBool,
}

impl Tunables {
    pub fn new(c: &Config) -> Tunables {
        let t = Tunables {
            databases: c.get_i64("databases") as usize,
            maxclients: AtomicUsize::new(0),
            timeout_secs: AtomicU64::new(0),
            proto_max_bulk_len: AtomicUsize::new(0),
            maxmemory: AtomicU64::new(0),
            migrate_connections: AtomicBool::new(true),
            park_yields: AtomicU32::new(1),
            slowlog_slower_than: AtomicI64::new(0),
            slowlog_max_len: AtomicUsize::new(0),
            latency_threshold_ms: AtomicU64::new(0),
            notify_flags: AtomicU32::new(0),
            busy_reply_threshold_ms: AtomicU64::new(5000),
            obuf_normal: Default::default(),
            obuf_pubsub: Default::default(),
            query_buffer_limit: AtomicUsize::new(1 << 30),
            hll_sparse_max_bytes: AtomicUsize::new(3000),
            tracking_table_max_keys: AtomicUsize::new(1_000_000),
            maxmemory_policy: Default::default(),
            lfu: AtomicBool::new(false),
            maxmemory_samples: AtomicUsize::new(5),
            queue_tracking: AtomicBool::new(true),
            queue_tracking_max: AtomicUsize::new(1024),
            http_open_metrics: AtomicBool::new(false),
            lfu_log_factor: AtomicU64::new(10),
            lfu_decay_time: AtomicU64::new(1),
            protected_mode: AtomicBool::new(true),
            maxmemory_clients: AtomicU64::new(0),
            maxmemory_clients_percent: AtomicBool::new(false),
        };
        t.refresh(c);
        t
    }

    /// Copies the current configuration into the atomics (after CONFIG SET).
    pub fn refresh(&self, c: &Config) {
        let r = Ordering::Relaxed;
        self.maxclients.store(c.get_i64("maxclients") as usize, r);
        self.timeout_secs.store(c.get_i64("timeout") as u64, r);
        self.proto_max_bulk_len
            .store(c.get_i64("proto-max-bulk-len") as usize, r);
        self.maxmemory.store(c.get_i64("maxmemory") as u64, r);
        self.migrate_connections
            .store(c.get_bool("migrate-connections"), r);
        self.park_yields.store(c.get_i64("park-yields") as u32, r);
        self.slowlog_slower_than
            .store(c.get_i64("slowlog-log-slower-than"), r);
        self.slowlog_max_len
            .store(c.get_i64("slowlog-max-len") as usize, r);
        self.latency_threshold_ms
            .store(c.get_i64("latency-monitor-threshold") as u64, r);
        self.busy_reply_threshold_ms
            .store(c.get_i64("busy-reply-threshold") as u64, r);
        let limits = c.get("client-output-buffer-limit");
        for (class, slots) in [("normal", &self.obuf_normal), ("pubsub", &self.obuf_pubsub)] {
            let v = output_buffer_class(limits, class).unwrap_or((0, 0, 0));
            slots[0].store(v.0, r);
            slots[1].store(v.1, r);
            slots[2].store(v.2, r);
        }
        self.query_buffer_limit
            .store(c.get_i64("client-query-buffer-limit") as usize, r);
        self.protected_mode.store(c.get_bool("protected-mode"), r);
        self.hll_sparse_max_bytes
            .store(c.get_i64("hll-sparse-max-bytes") as usize, r);
        self.tracking_table_max_keys
            .store(c.get_i64("tracking-table-max-keys") as usize, r);
        let policy = crate::shard::evict::Policy::parse(c.get("maxmemory-policy"));
        self.maxmemory_policy.store(policy.to_u8(), r);
        self.lfu.store(policy.is_lfu(), r);
        self.maxmemory_samples
            .store(c.get_i64("maxmemory-samples") as usize, r);
        self.lfu_log_factor
            .store(c.get_i64("lfu-log-factor") as u64, r);
        self.lfu_decay_time
            .store(c.get_i64("lfu-decay-time") as u64, r);
        self.queue_tracking.store(c.get_bool("queue-tracking"), r);
        self.queue_tracking_max
            .store(c.get_i64("queue-tracking-max-queues") as usize, r);
        self.http_open_metrics
            .store(c.get_bool("http-open-metrics"), r);
        let mc = c.get("maxmemory-clients");
        match mc.strip_suffix('%') {
            Some(p) => {
                self.maxmemory_clients.store(p.parse().unwrap_or(0), r);
                self.maxmemory_clients_percent.store(true, r);
            }
            None => {
                self.maxmemory_clients
                    .store(parse_memory(mc).unwrap_or(0), r);
                self.maxmemory_clients_percent.store(false, r);
            }
        }
        self.notify_flags.store(
            crate::pubsub::parse_classes(c.get("notify-keyspace-events")).unwrap_or(0),
            r,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_units() {
        assert_eq!(parse_memory("100"), Some(100));
        assert_eq!(parse_memory("1kb"), Some(1024));
        assert_eq!(parse_memory("1k"), Some(1000));
        assert_eq!(parse_memory("2GB"), Some(2 * 1024 * 1024 * 1024));
        assert_eq!(parse_memory("x"), None);
    }

    #[test]
    fn set_many_is_all_or_nothing() {
        let mut c = Config::default();
        let err = c
            .set_many(
                &[
                    ("maxclients".into(), "50".into()),
                    ("timeout".into(), "abc".into()),
                ],
                false,
            )
            .unwrap_err();
        assert!(err.contains("timeout"), "{err}");
        assert_eq!(c.get("maxclients"), "10000");
        c.set_many(&[("maxmemory".into(), "1mb".into())], false)
            .unwrap();
        assert_eq!(c.get("maxmemory"), "1048576");
        assert!(c
            .set_many(&[("databases".into(), "3".into())], false)
            .is_err());
        assert!(c.set_many(&[("nosuch".into(), "3".into())], false).is_err());
        // Where data files go is protected (enable-protected-configs).
        let e = c.set_many(&[("dir".into(), "/".into())], true).unwrap_err();
        assert!(e.contains("can't set protected config"), "{e}");
        c.set_initial("enable-protected-configs", "local").unwrap();
        assert!(c.set_many(&[("dir".into(), "/".into())], false).is_err());
        c.set_many(&[("dir".into(), "/".into())], true).unwrap();
    }

    #[test]
    fn glob_get_and_config_lines() {
        let c = Config::default();
        let m = c.matching(&[b"max*".to_vec()]);
        assert!(m.iter().any(|(n, _)| *n == "maxmemory"));
        assert_eq!(
            split_config_line("save \"\"").unwrap(),
            vec!["save".to_string(), "".to_string()]
        );
        assert_eq!(split_config_line("bind 127.0.0.1 ::1").unwrap().len(), 3);
    }
}
