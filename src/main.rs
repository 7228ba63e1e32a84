//! Kite: a multi-threaded Redis-protocol server for background-job workloads.

use kite::{acl, clock, cluster, config, memory, net, persist, repl, scripting, server, shard};

use std::net::{TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use clap::Parser;

use config::{Config, Tunables};
use shard::placement::Placement;
use shard::Shared;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Kite — a Redis-compatible server that uses every core.
///
/// Settings come from an optional redis.conf-style file (first argument), then from the
/// flags below, which win. Any Redis parameter can also be changed at run time with
/// CONFIG SET.
#[derive(Parser, Debug)]
#[command(name = "kite", version, about, long_about = None)]
struct Cli {
    /// A redis.conf-style configuration file (`port 7000`, one setting per line).
    config_file: Option<PathBuf>,
    /// TCP port to listen on [default: 6379].
    #[arg(long)]
    port: Option<u16>,
    /// Addresses to listen on, separated by spaces [default: 127.0.0.1].
    #[arg(long)]
    bind: Option<String>,
    /// Worker threads, each owning one shard of the keyspace [default: number of CPUs].
    #[arg(long, alias = "proactor_threads")]
    threads: Option<usize>,
    /// Password clients must give with AUTH or HELLO.
    #[arg(long)]
    requirepass: Option<String>,
    /// Number of databases [default: 16].
    #[arg(long)]
    databases: Option<usize>,
    /// Maximum simultaneous clients [default: 10000].
    #[arg(long)]
    maxclients: Option<u64>,
    /// Close a client after this many idle seconds; 0 never [default: 0].
    #[arg(long)]
    timeout: Option<u64>,
    /// Hashtags starting with this prefix go to shards in round-robin order of first use.
    #[arg(long)]
    shard_round_robin_prefix: Option<String>,
    /// Key prefixes of job queues laid out as `<prefix>:<queue>:...` (BullMQ, Bull,
    /// bee-queue): all keys of one queue share a shard and a lock tag, comma-separated;
    /// empty for none [default: bull,bq].
    #[arg(long)]
    queue_key_prefixes: Option<String>,
    /// Keys with a {hashtag} are placed and locked by it (Dragonfly's flag; always the
    /// case in Kite, accepted for compatibility): yes or no [default: yes].
    #[arg(long, num_args = 0..=1, default_missing_value = "yes")]
    lock_on_hashtags: Option<String>,
    /// Move a connection to the thread owning the keys it keeps using: yes or no [default: yes].
    #[arg(long, num_args = 0..=1, default_missing_value = "yes")]
    migrate_connections: Option<String>,
    /// Log level: debug, verbose, notice, warning, nothing [default: notice].
    #[arg(long)]
    loglevel: Option<String>,
    /// Log to this file instead of standard output.
    #[arg(long)]
    logfile: Option<String>,
    /// Refuse writes once allocated memory passes this many bytes (units: kb, mb, gb); 0 is no limit.
    #[arg(long)]
    maxmemory: Option<String>,
    /// Also serve HTTP (/metrics, the dashboard) on this port; 0 is off [default: 0].
    #[arg(long)]
    http_port: Option<u16>,
    /// Largest bulk string a client may send [default: 512mb].
    #[arg(long)]
    proto_max_bulk_len: Option<String>,
}

fn build_config(cli: &Cli) -> Result<Config, String> {
    let mut c = Config::default();
    if let Some(path) = &cli.config_file {
        c.load_file(path)?;
    }
    let mut set = |name: &str, value: Option<String>| -> Result<(), String> {
        match value {
            Some(v) => c
                .set_initial(name, &v)
                .map_err(|e| format!("--{name}: {e}")),
            None => Ok(()),
        }
    };
    set("port", cli.port.map(|v| v.to_string()))?;
    set("bind", cli.bind.clone())?;
    set("threads", cli.threads.map(|v| v.to_string()))?;
    set("requirepass", cli.requirepass.clone())?;
    set("databases", cli.databases.map(|v| v.to_string()))?;
    set("maxclients", cli.maxclients.map(|v| v.to_string()))?;
    set("timeout", cli.timeout.map(|v| v.to_string()))?;
    set(
        "shard-round-robin-prefix",
        cli.shard_round_robin_prefix.clone(),
    )?;
    set("migrate-connections", cli.migrate_connections.clone())?;
    set("queue-key-prefixes", cli.queue_key_prefixes.clone())?;
    set("lock-on-hashtags", cli.lock_on_hashtags.clone())?;
    set("loglevel", cli.loglevel.clone())?;
    set("logfile", cli.logfile.clone())?;
    set("maxmemory", cli.maxmemory.clone())?;
    set("proto-max-bulk-len", cli.proto_max_bulk_len.clone())?;
    set("http-port", cli.http_port.map(|v| v.to_string()))?;
    Ok(c)
}

fn init_logging(config: &Config) {
    let level = match config.get("loglevel") {
        "debug" => tracing::Level::DEBUG,
        "verbose" => tracing::Level::INFO,
        "warning" => tracing::Level::WARN,
        "nothing" => tracing::Level::ERROR,
        _ => tracing::Level::INFO,
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_target(false);
    let logfile = config.get("logfile");
    if logfile.is_empty() {
        builder.init();
    } else {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logfile)
        {
            Ok(f) => builder.with_writer(Mutex::new(f)).with_ansi(false).init(),
            Err(e) => {
                eprintln!("Can't open the log file {logfile}: {e}");
                std::process::exit(1);
            }
        }
    }
}

fn run_id() -> String {
    let seed = shard::unix_us() ^ ((std::process::id() as u64) << 32);
    let mut x = seed | 1;
    (0..40)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from_digit((x % 16) as u32, 16).expect("hex digit")
        })
        .collect()
}

/// Splits the command line into what clap parses and redis-server-style `--name value`
/// pairs naming any other configuration parameter (`--dir /data --save ""`).
fn split_config_flags(args: Vec<String>) -> (Vec<String>, Vec<(String, String)>) {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let known: Vec<String> = cmd
        .get_arguments()
        .flat_map(|a| {
            a.get_long()
                .into_iter()
                .chain(a.get_all_aliases().into_iter().flatten())
                .map(|l| l.replace('_', "-"))
        })
        .chain(["help".to_string(), "version".to_string()])
        .collect();
    let mut keep = Vec::with_capacity(args.len());
    let mut pairs = Vec::new();
    let mut it = args.into_iter().peekable();
    while let Some(a) = it.next() {
        let name = a.strip_prefix("--").map(|n| n.replace('_', "-"));
        match name {
            Some(n) if !n.is_empty() && !known.contains(&n) && config::find_param(&n).is_some() => {
                // A value may be several words, as redis-server takes them:
                // `--replicaof 127.0.0.1 6379`, `--save 60 1000 300 10`. Words after the
                // first continue it only while they look like parts of such a value
                // (numbers, sizes, buffer classes), so a configuration file named after
                // the flags is still the file.
                let mut words: Vec<String> = Vec::new();
                while let Some(v) = it.peek() {
                    let continues = !v.starts_with("--")
                        && (config::parse_memory(v).is_some()
                            || matches!(v.as_str(), "normal" | "replica" | "slave" | "pubsub"));
                    if words.is_empty() && !(v.starts_with("--") && v.len() > 2) || continues {
                        words.push(it.next().unwrap_or_default());
                    } else {
                        break;
                    }
                }
                let value = words.join(" ");
                pairs.push((n, value));
            }
            _ => keep.push(a),
        }
    }
    (keep, pairs)
}

fn main() {
    let (args, config_flags) = split_config_flags(std::env::args().collect());
    let cli = Cli::parse_from(args);
    let config = match build_config(&cli).and_then(|mut c| {
        for (name, value) in &config_flags {
            c.set_initial(name, value)
                .map_err(|e| format!("--{name}: {e}"))?;
        }
        // Resolve `dir` once, as Redis does by moving there at start-up.
        let dir = c.get("dir").to_string();
        c.set_initial("dir", &dir)
            .map_err(|e| format!("Can't chdir to '{dir}': {e}"))?;
        Ok(c)
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    init_logging(&config);
    clock::init();
    for (name, value) in config.ignored_settings() {
        tracing::warn!("setting '{name} {value}' is accepted but has no effect in Kite yet");
    }
    let mut threads = config.get_i64("threads") as usize;
    if threads == 0 {
        threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    }
    let port = config.get_i64("port") as u16;
    let tls_port = config.get_i64("tls-port") as u16;
    if port == 0 && tls_port == 0 {
        eprintln!("Configured to not listen anywhere, exiting.");
        std::process::exit(1);
    }
    if let Err(e) = net::tls::reload(&config) {
        eprintln!("Failed to configure TLS: {e}");
        std::process::exit(1);
    }
    // Port 0 turns a listener off, as in Redis.
    let mut listeners = Vec::new();
    for (listen_port, tls) in [(port, false), (tls_port, true)] {
        if listen_port == 0 {
            continue;
        }
        for addr in config.get("bind").split_whitespace() {
            let addr = addr.trim_start_matches('-');
            let target = if addr.contains(':') {
                format!("[{addr}]:{listen_port}")
            } else {
                format!("{addr}:{listen_port}")
            };
            let resolved = match target.to_socket_addrs() {
                Ok(mut a) => a.next(),
                Err(_) => None,
            };
            let Some(sockaddr) = resolved else {
                eprintln!("Invalid bind address '{addr}'");
                std::process::exit(1);
            };
            match TcpListener::bind(sockaddr) {
                Ok(l) => listeners.push((l, tls)),
                Err(e) => {
                    eprintln!("Could not create server TCP listening socket {target}: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
    // `http-port`: HTTP only (metrics, the dashboard), on the same addresses.
    let mut http_listeners = Vec::new();
    let http_port = config.get_i64("http-port") as u16;
    if http_port != 0 {
        for addr in config.get("bind").split_whitespace() {
            let addr = addr.trim_start_matches('-');
            let target = if addr.contains(':') {
                format!("[{addr}]:{http_port}")
            } else {
                format!("{addr}:{http_port}")
            };
            match TcpListener::bind(&target) {
                Ok(l) => http_listeners.push(l),
                Err(e) => {
                    eprintln!("Could not create the HTTP listening socket {target}: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
    let rr_prefix = Some(config.get("shard-round-robin-prefix").as_bytes().to_vec());
    let tunables = Tunables::new(&config);
    let acl = match acl::init(&config) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let cluster = match cluster::Cluster::from_config(&config) {
        Ok(c) => c.map(Box::new),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let shared = Arc::new(Shared {
        tracking: Default::default(),
        placement: Placement::new(threads, rr_prefix).with_queue_prefixes(
            config
                .get("queue-key-prefixes")
                .split(',')
                .map(|p| p.trim().as_bytes().to_vec())
                .filter(|p| !p.is_empty())
                .collect(),
        ),
        mailboxes: OnceLock::new(),
        tunables,
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
        lastsave_unix: AtomicU64::new(shard::unix_ms() / 1000),
        active_expire: AtomicBool::new(true),
        run_id: run_id(),
        next_slowlog_id: AtomicU64::new(0),
        subscriptions: (0..threads).map(|_| AtomicUsize::new(0)).collect(),
        busy: (0..threads).map(|_| Default::default()).collect(),
        busy_wrote: (0..threads).map(|_| AtomicBool::new(false)).collect(),
        busy_kind: (0..threads).map(|_| Default::default()).collect(),
        busy_count: AtomicUsize::new(0),
        transacting: (0..threads).map(|_| Default::default()).collect(),
        sync_calls: scripting::run::sync_queues(threads),
        persist: persist::State::new(),
        repl: repl::ReplState::default(),
        acl,
        inbox: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
        client_memory: (0..threads).map(|_| Default::default()).collect(),
        evicted_clients: AtomicU64::new(0),
        cluster,
    });
    repl::refresh_settings(&shared);
    memory::refresh(&shared);
    tracing::info!(
        "Kite {} ready: {} threads, port {}",
        env!("CARGO_PKG_VERSION"),
        threads,
        port
    );
    if let Err(e) = server::run(shared, listeners, http_listeners) {
        eprintln!("failed to start worker threads: {e}");
        std::process::exit(1);
    }
}
