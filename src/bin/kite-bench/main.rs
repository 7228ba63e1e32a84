//! kite-bench: the workloads of BENCHMARKS.md against any Redis-protocol server on this
//! machine, with the server's CPU time per operation read from /proc; and `compare`, which
//! starts Kite and redis-server side by side and tabulates the ratios.
//!
//! Every run is bounded in count and in time and talks to loopback addresses only.

mod compare;
mod conn;
mod procfs;
mod report;
mod resp;
mod runner;
mod scripts;
mod signal;
mod workloads;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use report::RunResult;
use runner::Target;

/// Benchmarks for Kite and any Redis-protocol server on this machine (loopback only).
#[derive(Parser, Debug)]
#[command(name = "kite-bench", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    server: ServerArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Debug, Clone)]
struct ServerArgs {
    /// Server host: a loopback address or name (other addresses are refused).
    #[arg(long, global = true, default_value = "127.0.0.1")]
    host: String,
    /// Server port.
    #[arg(long, global = true, default_value_t = 6379)]
    port: u16,
    /// Server process id, for its CPU time [default: the process listening on the port].
    #[arg(long, global = true)]
    server_pid: Option<i32>,
    /// Client threads driving the connections.
    #[arg(long, global = true, default_value_t = 1)]
    client_threads: usize,
    /// Upper bound on any one run, in seconds; a run stopped by it is marked incomplete.
    #[arg(long, global = true, default_value_t = 120.0)]
    max_seconds: f64,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Q queues pre-filled with Sidekiq-shaped jobs, drained by BRPOP consumers.
    Drain(DrainArgs),
    /// BRPOP over k of 234 keys by many consumers while producers LPUSH to random keys.
    BrpopKeys(BrpopKeysArgs),
    /// SET, GET, LPUSH, RPOP from many connections, unpipelined and pipelined.
    Ops(OpsArgs),
    /// Push-to-pop latency: one producer at a fixed rate, blocked consumers.
    Latency(LatencyArgs),
    /// Memory per queued 150-byte job (INFO memory and RSS).
    Memory(MemoryArgs),
    /// BullMQ's Queue.add from Node worker threads (bench/bullmq; needs scripting).
    BullmqAdd(scripts::BullmqArgs),
    /// BullMQ Workers processing jobs added beforehand (bench/bullmq; needs scripting).
    BullmqProcess(scripts::BullmqProcessArgs),
    /// Real Sidekiq processes draining pushed jobs (bench/sidekiq).
    SidekiqDrain(scripts::SidekiqArgs),
    /// Start Kite and redis-server, run workloads against each, tabulate the ratios.
    Compare(Box<compare::CompareArgs>),
}

#[derive(Args, Debug, Clone)]
pub struct DrainArgs {
    /// Numbers of queues; one run for each (e.g. 1,2,8).
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub queues: Vec<usize>,
    /// Jobs per queue.
    #[arg(long, default_value_t = 100_000)]
    pub jobs: u64,
    /// Consumer connections per queue.
    #[arg(long, default_value_t = 10)]
    pub consumers: usize,
    /// BRPOP timeout, seconds.
    #[arg(long, default_value_t = 2.0)]
    pub timeout: f64,
    /// Queue names: this prefix and the queue's number.
    #[arg(long, default_value = "queue:bench")]
    pub prefix: String,
}

#[derive(Args, Debug, Clone)]
pub struct BrpopKeysArgs {
    /// Number of lists.
    #[arg(long, default_value_t = 234)]
    pub keys: usize,
    /// Keys per BRPOP call; one run for each (e.g. 234,117,47,24).
    #[arg(long, value_delimiter = ',', default_value = "234")]
    pub keys_per_call: Vec<usize>,
    /// Consumer connections; one run for each (e.g. 1000,100).
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    pub consumers: Vec<usize>,
    /// Producer connections.
    #[arg(long, default_value_t = 100)]
    pub producers: usize,
    /// Messages each producer pushes (the published experiment used 1000).
    #[arg(long, default_value_t = 100)]
    pub messages_per_producer: u64,
    /// BRPOP timeout, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub timeout: f64,
    /// Key names: this prefix and the key's number.
    #[arg(long, default_value = "brpop:q")]
    pub prefix: String,
    /// Each consumer keeps one key set and shuffles it on every call (Sidekiq's
    /// pattern), instead of drawing a new random set each time.
    #[arg(long)]
    pub fixed_sets: bool,
}

#[derive(Args, Debug, Clone)]
pub struct OpsArgs {
    /// Commands, in order: set, get, lpush, rpop, evalsha (a one-write script), push (a
    /// Sidekiq client push, MULTI/SADD/LPUSH/EXEC over 8 queues, counted as one request),
    /// rq-enqueue (an RQ enqueue: MULTI/SADD/HSET/HSET/RPUSH/EXEC, the job's hash a key of
    /// its own), celery-ack (kombu's unacked bookkeeping for one message: MULTI/ZADD/HSET/
    /// EXEC then MULTI/ZREM/HDEL/EXEC).
    #[arg(long, value_delimiter = ',', default_value = "set,get,lpush,rpop")]
    pub commands: Vec<String>,
    /// Pipeline depths; every command runs at each.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub pipeline: Vec<usize>,
    /// Connections.
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Requests per command and depth [default: 100000 × min(pipeline, 8)].
    #[arg(long, default_value_t = 0)]
    pub requests: u64,
    /// Random keys drawn from this many.
    #[arg(long, default_value_t = 10_000)]
    pub keyspace: u64,
    /// Value size in bytes for SET and LPUSH.
    #[arg(long, default_value_t = 3)]
    pub data_size: usize,
    /// The set of queue names the `push` case adds to on every push (Sidekiq's `queues`).
    /// Every push waits for the others on this key; its shard decides whether it is the
    /// first or the last shard a push locks.
    #[arg(long, default_value = "kb:queues")]
    pub queue_set: String,
    /// Queues the `push` case spreads its jobs over (`kb:queue:0`, `kb:queue:1`...).
    #[arg(long, default_value_t = 8)]
    pub push_queues: u64,
}

#[derive(Args, Debug, Clone)]
pub struct LatencyArgs {
    /// Jobs pushed per second.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// How long the producer pushes.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Blocked consumer connections.
    #[arg(long, default_value_t = 10)]
    pub consumers: usize,
    /// BRPOP timeout, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub timeout: f64,
    /// Queue name.
    #[arg(long, default_value = "queue:latency")]
    pub queue: String,
}

#[derive(Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Jobs queued.
    #[arg(long, default_value_t = 1_000_000)]
    pub jobs: u64,
    /// Queue name.
    #[arg(long, default_value = "queue:memory")]
    pub queue: String,
    /// Leave the queue in place afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// Resolves host:port and refuses anything that is not a loopback address.
pub fn loopback_addr(host: &str, port: u16) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    // Prefer IPv4: servers here listen on 127.0.0.1 by default.
    addrs
        .iter()
        .find(|a| a.is_ipv4() && a.ip().is_loopback())
        .or_else(|| addrs.iter().find(|a| a.ip().is_loopback()))
        .copied()
        .ok_or_else(|| {
            format!("{host} is not a loopback address: kite-bench only targets this machine")
        })
}

fn target(s: &ServerArgs) -> Result<Target, String> {
    let addr = loopback_addr(&s.host, s.port)?;
    let pid = s.server_pid.or_else(|| procfs::pid_listening_on(s.port));
    if pid.is_none() {
        eprintln!(
            "kite-bench: no process found listening on port {}; server CPU will not be measured (give --server-pid)",
            s.port
        );
    }
    if s.max_seconds.is_nan() || s.max_seconds <= 0.0 {
        return Err("--max-seconds must be positive".into());
    }
    Ok(Target {
        addr,
        pid,
        client_threads: s.client_threads.max(1),
        max_seconds: s.max_seconds,
    })
}

/// Prints a result: JSON on stdout, the readable line on stderr.
pub fn emit(r: &RunResult) {
    println!("{}", r.to_json().to_text());
    eprintln!("{}", r.readable());
}

pub fn run_drain(
    t: &Target,
    a: &DrainArgs,
    each: &mut dyn FnMut(RunResult),
) -> std::io::Result<()> {
    for &q in &a.queues {
        let r = workloads::drain(
            t,
            &workloads::DrainOpts {
                queues: q.max(1),
                jobs: a.jobs,
                consumers: a.consumers.max(1),
                timeout: a.timeout,
                prefix: a.prefix.clone(),
            },
        )?;
        each(r);
        if signal::stopping() {
            break;
        }
    }
    Ok(())
}

pub fn run_brpop_keys(
    t: &Target,
    a: &BrpopKeysArgs,
    each: &mut dyn FnMut(RunResult),
) -> std::io::Result<()> {
    for &c in &a.consumers {
        for &k in &a.keys_per_call {
            let r = workloads::brpop_keys(
                t,
                &workloads::BrpopKeysOpts {
                    keys: a.keys.max(1),
                    keys_per_call: k,
                    consumers: c.max(1),
                    producers: a.producers.max(1),
                    messages_per_producer: a.messages_per_producer,
                    timeout: a.timeout,
                    prefix: a.prefix.clone(),
                    fixed_sets: a.fixed_sets,
                },
            )?;
            each(r);
            if signal::stopping() {
                return Ok(());
            }
        }
    }
    Ok(())
}

pub fn run_ops(t: &Target, a: &OpsArgs, each: &mut dyn FnMut(RunResult)) -> std::io::Result<()> {
    workloads::ops(
        t,
        &workloads::OpsOpts {
            commands: a.commands.clone(),
            pipelines: a.pipeline.clone(),
            connections: a.connections,
            requests: a.requests,
            keyspace: a.keyspace.max(1),
            data_size: a.data_size,
            queue_set: a.queue_set.clone(),
            push_queues: a.push_queues,
        },
        |r| each(r.clone()),
    )?;
    Ok(())
}

pub fn run_latency(t: &Target, a: &LatencyArgs) -> std::io::Result<RunResult> {
    workloads::latency(
        t,
        &workloads::LatencyOpts {
            rate: a.rate.max(1),
            seconds: a.seconds,
            consumers: a.consumers.max(1),
            queue: a.queue.clone(),
            timeout: a.timeout,
        },
    )
}

pub fn run_memory(t: &Target, a: &MemoryArgs) -> std::io::Result<RunResult> {
    workloads::memory(
        t,
        &workloads::MemoryOpts {
            jobs: a.jobs.max(1),
            queue: a.queue.clone(),
            keep: a.keep,
        },
    )
}

/// The repository's `bench/` folder: next to the current directory, else where this
/// binary was built from.
pub fn bench_dir() -> PathBuf {
    let here = PathBuf::from("bench");
    if here.join("bullmq").is_dir() {
        return here;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench")
}

fn main() -> ExitCode {
    signal::install();
    procfs::raise_nofile();
    let cli = Cli::parse();
    let result: Result<(), String> = (|| {
        if let Cmd::Compare(a) = &cli.cmd {
            return compare::run(a, &cli.server).map_err(|e| e.to_string());
        }
        let t = target(&cli.server)?;
        let mut each = |r: RunResult| emit(&r);
        let res = match &cli.cmd {
            Cmd::Drain(a) => run_drain(&t, a, &mut each),
            Cmd::BrpopKeys(a) => run_brpop_keys(&t, a, &mut each),
            Cmd::Ops(a) => run_ops(&t, a, &mut each),
            Cmd::Latency(a) => run_latency(&t, a).map(&mut each),
            Cmd::Memory(a) => run_memory(&t, a).map(&mut each),
            Cmd::BullmqAdd(a) => scripts::bullmq(&t, a).map(&mut each),
            Cmd::BullmqProcess(a) => scripts::bullmq_process(&t, a).map(&mut each),
            Cmd::SidekiqDrain(a) => scripts::sidekiq(&t, a).map(&mut each),
            Cmd::Compare(_) => unreachable!(),
        };
        res.map_err(|e| e.to_string())
    })();
    match result {
        Ok(()) if signal::stopping() => ExitCode::from(130),
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kite-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
