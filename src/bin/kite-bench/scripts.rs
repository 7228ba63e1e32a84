//! `bullmq-add` and `sidekiq-drain`: run the real client libraries through the scripts in
//! bench/bullmq and bench/sidekiq (which install their own dependencies), and turn the JSON
//! they print into a result like every other run's.

use std::io;
use std::process::{Command, Stdio};

use clap::Args;

use crate::report::{Json, RunResult};
use crate::runner::Target;

#[derive(Args, Debug, Clone)]
pub struct BullmqArgs {
    /// Queues (one BullMQ Queue each).
    #[arg(long, default_value_t = 4)]
    pub queues: usize,
    /// Node worker threads calling Queue.add.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Adds in flight per worker thread.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// How long to add, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Give each queue a `{hashtag}` prefix instead of BullMQ's default `bull`.
    #[arg(long)]
    pub hashtag: bool,
}

#[derive(Args, Debug, Clone)]
pub struct BullmqProcessArgs {
    /// Queues, filled before the measured part.
    #[arg(long, default_value_t = 4)]
    pub queues: usize,
    /// Jobs per queue.
    #[arg(long, default_value_t = 5000)]
    pub jobs: u64,
    /// Node worker threads, each running one BullMQ Worker per queue.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Concurrency of each BullMQ Worker.
    #[arg(long, default_value_t = 50)]
    pub concurrency: usize,
    /// Give each queue a `{hashtag}` prefix instead of BullMQ's default `bull`.
    #[arg(long)]
    pub hashtag: bool,
}

#[derive(Args, Debug, Clone)]
pub struct SidekiqArgs {
    /// Queues; one sidekiq process each.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Jobs per queue, pushed with push_bulk before the processes start.
    #[arg(long, default_value_t = 20_000)]
    pub jobs: u64,
    /// Sidekiq threads per process (-c).
    #[arg(long, default_value_t = 10)]
    pub concurrency: usize,
}

/// Runs a script, passing its stderr through, and parses the last JSON line it printed.
fn run_script(script: &std::path::Path, args: &[String], t: &Target) -> io::Result<String> {
    run_script_with(script, None, args, t)
}

/// `run_script` with a first argument naming what the script runs (`process`).
fn run_script_with(
    script: &std::path::Path,
    what: Option<&str>,
    args: &[String],
    t: &Target,
) -> io::Result<String> {
    if !script.is_file() {
        return Err(io::Error::other(format!(
            "{} not found (run from the repository root)",
            script.display()
        )));
    }
    let mut cmd = Command::new("bash");
    cmd.arg(script);
    if let Some(w) = what {
        cmd.arg(w);
    }
    cmd.arg("--host")
        .arg(t.addr.ip().to_string())
        .arg("--port")
        .arg(t.addr.port().to_string())
        .arg("--max-seconds")
        .arg(format!("{}", t.max_seconds));
    if let Some(pid) = t.pid {
        cmd.arg("--pid").arg(pid.to_string());
    }
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or("")
        .to_string();
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{} failed ({}): {}",
            script.display(),
            out.status,
            if last.is_empty() {
                stdout.trim()
            } else {
                &last
            }
        )));
    }
    if last.is_empty() {
        return Err(io::Error::other(format!(
            "{} printed no JSON",
            script.display()
        )));
    }
    Ok(last)
}

/// A number from a flat JSON object (our scripts' output), without a JSON parser.
pub fn json_num(text: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let at = text.find(&pat)? + pat.len();
    let rest = text[at..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | 'e' | 'E' | '+')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn from_script(workload: &str, case: String, unit: &str, t: &Target, text: &str) -> RunResult {
    let mut r = RunResult::new(workload, case, unit);
    r.server = t.addr.to_string();
    r.server_pid = t.pid;
    r.ops = json_num(text, "operations").unwrap_or(0.0) as u64;
    r.seconds = json_num(text, "seconds").unwrap_or(0.0);
    r.server_cpu_s = json_num(text, "server_cpu_s");
    r.client_cpu_s = json_num(text, "client_cpu_s").unwrap_or(0.0);
    r.extra
        .push(("script_output".into(), Json::Str(text.to_string())));
    r
}

pub fn bullmq(t: &Target, a: &BullmqArgs) -> io::Result<RunResult> {
    let script = crate::bench_dir().join("bullmq/run.sh");
    let mut args = vec![
        "--queues".into(),
        a.queues.to_string(),
        "--workers".into(),
        a.workers.to_string(),
        "--concurrency".into(),
        a.concurrency.to_string(),
        "--seconds".into(),
        a.seconds.to_string(),
    ];
    if a.hashtag {
        args.push("--hashtag".into());
    }
    let text = run_script(&script, &args, t)?;
    let mut r = from_script(
        "bullmq-add",
        format!(
            "bullmq-add Q={}{}",
            a.queues,
            if a.hashtag { " {hashtag}" } else { "" }
        ),
        "add",
        t,
        &text,
    );
    r.params = vec![
        ("queues".into(), a.queues.into()),
        ("workers".into(), a.workers.into()),
        ("concurrency".into(), a.concurrency.into()),
        ("seconds".into(), a.seconds.into()),
        ("hashtag".into(), a.hashtag.into()),
    ];
    Ok(r)
}

pub fn bullmq_process(t: &Target, a: &BullmqProcessArgs) -> io::Result<RunResult> {
    let script = crate::bench_dir().join("bullmq/run.sh");
    let mut args = vec![
        "--queues".into(),
        a.queues.to_string(),
        "--jobs".into(),
        a.jobs.to_string(),
        "--workers".into(),
        a.workers.to_string(),
        "--concurrency".into(),
        a.concurrency.to_string(),
    ];
    if a.hashtag {
        args.push("--hashtag".into());
    }
    let text = run_script_with(&script, Some("process"), &args, t)?;
    let mut r = from_script(
        "bullmq-process",
        format!(
            "bullmq-process Q={}{}",
            a.queues,
            if a.hashtag { " {hashtag}" } else { "" }
        ),
        "job",
        t,
        &text,
    );
    r.params = vec![
        ("queues".into(), a.queues.into()),
        ("jobs".into(), a.jobs.into()),
        ("workers".into(), a.workers.into()),
        ("concurrency".into(), a.concurrency.into()),
        ("hashtag".into(), a.hashtag.into()),
    ];
    Ok(r)
}

pub fn sidekiq(t: &Target, a: &SidekiqArgs) -> io::Result<RunResult> {
    let script = crate::bench_dir().join("sidekiq/run.sh");
    let args = vec![
        "--queues".into(),
        a.queues.to_string(),
        "--jobs".into(),
        a.jobs.to_string(),
        "--concurrency".into(),
        a.concurrency.to_string(),
    ];
    let text = run_script(&script, &args, t)?;
    let mut r = from_script(
        "sidekiq-drain",
        format!("sidekiq-drain Q={}", a.queues),
        "job",
        t,
        &text,
    );
    r.complete = !text.contains("\"complete\":false");
    r.params = vec![
        ("queues".into(), a.queues.into()),
        ("jobs_per_queue".into(), a.jobs.into()),
        ("concurrency".into(), a.concurrency.into()),
    ];
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_numbers() {
        let t = r#"{"operations":1234,"seconds":2.5,"server_cpu_s":null,"x":-1e3}"#;
        assert_eq!(json_num(t, "operations"), Some(1234.0));
        assert_eq!(json_num(t, "seconds"), Some(2.5));
        assert_eq!(json_num(t, "server_cpu_s"), None);
        assert_eq!(json_num(t, "x"), Some(-1000.0));
    }
}
