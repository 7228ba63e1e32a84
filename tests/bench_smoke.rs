//! Smoke tests for kite-bench: every workload runs against a Kite for a tiny, bounded count
//! and prints well-formed results. No timing is asserted.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::KiteServer;

fn bench(server: &KiteServer, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_kite-bench"))
        .arg("--port")
        .arg(server.port.to_string())
        .arg("--server-pid")
        .arg(server.pid().to_string())
        .arg("--max-seconds")
        .arg("30")
        .args(args)
        .output()
        .expect("run kite-bench");
    assert!(
        out.status.success(),
        "kite-bench {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The JSON lines printed on stdout.
fn results(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(String::from)
        .collect()
}

fn num(line: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let at = line.find(&pat)? + pat.len();
    let rest = &line[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn check(line: &str, workload: &str, ops: u64) {
    assert!(
        line.contains(&format!("\"workload\":\"{workload}\"")),
        "{line}"
    );
    assert!(line.contains("\"complete\":true"), "{line}");
    assert_eq!(num(line, "operations"), Some(ops as f64), "{line}");
    assert!(num(line, "server_cpu_s").is_some(), "{line}");
    assert!(line.contains("\"commandstats\":{"), "{line}");
}

#[test]
fn ops_runs_every_command_and_depth() {
    let s = KiteServer::start(&[], 2);
    let out = bench(
        &s,
        &[
            "ops",
            "--requests",
            "160",
            "--connections",
            "4",
            "--keyspace",
            "50",
            "--pipeline",
            "1,4",
        ],
    );
    let lines = results(&out);
    assert_eq!(lines.len(), 8, "{lines:?}");
    for l in &lines {
        check(l, "ops", 160);
    }
    assert!(
        lines[7].contains("\"case\":\"ops RPOP P=4\""),
        "{}",
        lines[7]
    );
    // The readable line goes to stderr.
    assert!(String::from_utf8_lossy(&out.stderr).contains("ops SET P=1 @"));
    // It cleans up after itself.
    let mut c = s.client();
    assert_eq!(c.cmd(&["DBSIZE"]).as_int(), Some(0));
}

/// The transaction shapes of the queue libraries: every reply read, every key removed.
#[test]
fn ops_runs_the_queue_libraries_transactions() {
    let s = KiteServer::start(&[], 2);
    let out = bench(
        &s,
        &[
            "ops",
            "--commands",
            "push,rq-enqueue,celery-ack",
            "--requests",
            "80",
            "--connections",
            "4",
            "--pipeline",
            "1,4",
        ],
    );
    let lines = results(&out);
    assert_eq!(lines.len(), 6, "{lines:?}");
    for l in &lines {
        check(l, "ops", 80);
    }
    // Cases run depth by depth; a celery-ack unit is two transactions.
    for (l, execs) in lines.iter().zip([80, 80, 160, 80, 80, 160]) {
        assert!(l.contains(&format!("\"exec\":{{\"calls\":{execs}")), "{l}");
    }
    let mut c = s.client();
    assert_eq!(c.cmd(&["DBSIZE"]).as_int(), Some(0));
}

#[test]
fn drain_empties_every_queue() {
    let s = KiteServer::start(&[], 2);
    let out = bench(
        &s,
        &[
            "drain",
            "--queues",
            "2",
            "--jobs",
            "300",
            "--consumers",
            "3",
        ],
    );
    let lines = results(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    check(&lines[0], "drain", 600);
    assert!(lines[0].contains("\"brpop\":{\"calls\":"), "{}", lines[0]);
}

#[test]
fn brpop_keys_delivers_every_message() {
    let s = KiteServer::start(&[], 2);
    let out = bench(
        &s,
        &[
            "brpop-keys",
            "--keys",
            "30",
            "--keys-per-call",
            "30,5",
            "--consumers",
            "20",
            "--producers",
            "4",
            "--messages-per-producer",
            "10",
        ],
    );
    let lines = results(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for l in &lines {
        check(l, "brpop-keys", 40);
    }
}

#[test]
fn latency_and_memory() {
    let s = KiteServer::start(&[], 2);
    let out = bench(
        &s,
        &[
            "latency",
            "--rate",
            "400",
            "--seconds",
            "0.5",
            "--consumers",
            "3",
        ],
    );
    let lines = results(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    check(&lines[0], "latency", 200);
    assert!(num(&lines[0], "p99").is_some(), "{}", lines[0]);
    assert_eq!(num(&lines[0], "samples"), Some(200.0), "{}", lines[0]);

    let out = bench(&s, &["memory", "--jobs", "2000"]);
    let lines = results(&out);
    check(&lines[0], "memory", 2000);
    assert!(
        num(&lines[0], "used_memory_per_job").is_some(),
        "{}",
        lines[0]
    );
    assert_eq!(num(&lines[0], "llen"), Some(2000.0), "{}", lines[0]);
}

#[test]
fn refuses_addresses_off_this_machine() {
    let out = Command::new(env!("CARGO_BIN_EXE_kite-bench"))
        .args(["--host", "192.0.2.1", "ops", "--requests", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a loopback address"));
}

#[test]
fn compare_writes_table_and_chart() {
    if common::kite_is_redis() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kite-bench-smoke-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_kite-bench"))
        .arg("--max-seconds")
        .arg("30")
        .arg("compare")
        .arg("--kite")
        .arg(env!("CARGO_BIN_EXE_kite"))
        .arg("--redis")
        .arg(common::redis_server_bin())
        .args([
            "--workloads",
            "ops,drain",
            "--reps",
            "1",
            "--ops-requests",
            "100",
            "--ops-commands",
            "set,rpop",
            "--ops-pipeline",
            "1",
            "--drain-queues",
            "1",
            "--drain-jobs",
            "200",
        ])
        .arg("--out-dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for row in [
        "| ops SET P=1 | redis |",
        "| ops SET P=1 | kite t2 |",
        "| drain Q=1 | kite t1 |",
    ] {
        assert!(table.contains(row), "{table}");
    }
    let svg = std::fs::read_to_string(Path::new(&dir).join("ratios.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let runs = std::fs::read_to_string(Path::new(&dir).join("runs.jsonl")).unwrap();
    assert_eq!(runs.lines().count(), 9, "{runs}");
    let _ = std::fs::remove_dir_all(&dir);
}
