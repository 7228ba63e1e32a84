//! What a run measured, written as one JSON object and one readable line; the progress bar.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A JSON value, enough for our output.
#[derive(Clone, Debug)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(n) => {
                let _ = write!(out, "{n}");
            }
            Json::Num(x) => {
                if x.is_finite() {
                    // Enough digits for µs figures, no noise.
                    let r = (x * 1000.0).round() / 1000.0;
                    let _ = write!(out, "{r}");
                } else {
                    out.push_str("null");
                }
            }
            Json::Str(s) => kite::observe::api::string(out, s.as_bytes()),
            Json::Arr(v) => {
                out.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    x.write(out);
                }
                out.push(']');
            }
            Json::Obj(v) => {
                out.push('{');
                for (i, (k, x)) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    Json::Str(k.clone()).write(out);
                    out.push(':');
                    x.write(out);
                }
                out.push('}');
            }
        }
    }

    pub fn to_text(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }
}

impl From<u64> for Json {
    fn from(n: u64) -> Json {
        Json::Int(n as i64)
    }
}
impl From<usize> for Json {
    fn from(n: usize) -> Json {
        Json::Int(n as i64)
    }
}
impl From<f64> for Json {
    fn from(x: f64) -> Json {
        Json::Num(x)
    }
}
impl From<&str> for Json {
    fn from(s: &str) -> Json {
        Json::Str(s.to_string())
    }
}
impl From<String> for Json {
    fn from(s: String) -> Json {
        Json::Str(s)
    }
}
impl From<bool> for Json {
    fn from(b: bool) -> Json {
        Json::Bool(b)
    }
}
impl<T: Into<Json>> From<Option<T>> for Json {
    fn from(o: Option<T>) -> Json {
        match o {
            Some(x) => x.into(),
            None => Json::Null,
        }
    }
}

/// Push-to-pop latency percentiles, in µs.
#[derive(Clone, Debug)]
pub struct Latency {
    pub samples: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Latency {
    /// From samples in nanoseconds.
    pub fn from_ns(mut v: Vec<u64>) -> Option<Latency> {
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let at = |q: f64| {
            let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
            v[i] as f64 / 1000.0
        };
        Some(Latency {
            samples: v.len(),
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
            max: *v.last().unwrap() as f64 / 1000.0,
        })
    }
}

/// A point in time with the server's and the client's CPU time.
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    pub at: Instant,
    pub server_cpu: Option<f64>,
    pub client_cpu: f64,
}

impl Mark {
    pub fn now(pid: Option<i32>) -> Mark {
        Mark {
            at: Instant::now(),
            server_cpu: pid.and_then(crate::procfs::cpu_seconds),
            client_cpu: crate::procfs::self_cpu_seconds(),
        }
    }
}

/// One run's figures.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub workload: String,
    /// Short name of the case within a comparison, e.g. `drain Q=2`.
    pub case: String,
    pub server: String,
    pub server_pid: Option<i32>,
    pub params: Vec<(String, Json)>,
    /// What one operation is: job, message, request.
    pub unit: String,
    pub ops: u64,
    pub seconds: f64,
    pub complete: bool,
    pub server_cpu_s: Option<f64>,
    pub client_cpu_s: f64,
    pub latency: Option<Latency>,
    pub extra: Vec<(String, Json)>,
    /// command, calls, usec (deltas over the run)
    pub commandstats: Vec<(String, u64, u64)>,
    pub note: Option<String>,
}

impl RunResult {
    pub fn new(workload: &str, case: String, unit: &str) -> RunResult {
        RunResult {
            workload: workload.to_string(),
            case,
            server: String::new(),
            server_pid: None,
            params: Vec::new(),
            unit: unit.to_string(),
            ops: 0,
            seconds: 0.0,
            complete: true,
            server_cpu_s: None,
            client_cpu_s: 0.0,
            latency: None,
            extra: Vec::new(),
            commandstats: Vec::new(),
            note: None,
        }
    }

    pub fn set_window(&mut self, a: &Mark, b: &Mark) {
        self.seconds = b.at.duration_since(a.at).as_secs_f64();
        self.server_cpu_s = match (a.server_cpu, b.server_cpu) {
            (Some(x), Some(y)) => Some(y - x),
            _ => None,
        };
        self.client_cpu_s = b.client_cpu - a.client_cpu;
    }

    pub fn ops_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }

    pub fn server_us_per_op(&self) -> Option<f64> {
        let c = self.server_cpu_s?;
        (self.ops > 0).then(|| c * 1e6 / self.ops as f64)
    }

    pub fn client_us_per_op(&self) -> Option<f64> {
        (self.ops > 0).then(|| self.client_cpu_s * 1e6 / self.ops as f64)
    }

    pub fn extra_f64(&self, key: &str) -> Option<f64> {
        self.extra
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| match v {
                Json::Num(x) => Some(*x),
                Json::Int(n) => Some(*n as f64),
                _ => None,
            })
    }

    pub fn to_json(&self) -> Json {
        let mut o: Vec<(String, Json)> = vec![
            ("workload".into(), self.workload.as_str().into()),
            ("case".into(), self.case.as_str().into()),
            ("server".into(), self.server.as_str().into()),
            (
                "server_pid".into(),
                self.server_pid.map(|p| p as u64).into(),
            ),
            ("parameters".into(), Json::Obj(self.params.clone())),
            ("unit".into(), self.unit.as_str().into()),
            ("operations".into(), self.ops.into()),
            ("seconds".into(), self.seconds.into()),
            ("ops_per_s".into(), self.ops_per_s().into()),
            ("complete".into(), self.complete.into()),
            ("server_cpu_s".into(), self.server_cpu_s.into()),
            (
                "server_cpu_us_per_op".into(),
                self.server_us_per_op().into(),
            ),
            ("client_cpu_s".into(), self.client_cpu_s.into()),
            (
                "client_cpu_us_per_op".into(),
                self.client_us_per_op().into(),
            ),
        ];
        if let Some(l) = &self.latency {
            o.push((
                "latency_us".into(),
                Json::Obj(vec![
                    ("samples".into(), l.samples.into()),
                    ("p50".into(), l.p50.into()),
                    ("p90".into(), l.p90.into()),
                    ("p99".into(), l.p99.into()),
                    ("p999".into(), l.p999.into()),
                    ("max".into(), l.max.into()),
                ]),
            ));
        }
        o.extend(self.extra.iter().cloned());
        o.push((
            "commandstats".into(),
            Json::Obj(
                self.commandstats
                    .iter()
                    .map(|(c, calls, usec)| {
                        (
                            c.clone(),
                            Json::Obj(vec![
                                ("calls".into(), (*calls).into()),
                                ("usec".into(), (*usec).into()),
                                (
                                    "usec_per_call".into(),
                                    if *calls > 0 {
                                        Json::Num(*usec as f64 / *calls as f64)
                                    } else {
                                        Json::Null
                                    },
                                ),
                            ]),
                        )
                    })
                    .collect(),
            ),
        ));
        if let Some(n) = &self.note {
            o.push(("note".into(), n.as_str().into()));
        }
        Json::Obj(o)
    }

    pub fn readable(&self) -> String {
        let mut s = format!(
            "{} @ {}: {} {}s in {:.2} s = {}/s",
            self.case,
            self.server,
            self.ops,
            self.unit,
            self.seconds,
            human(self.ops_per_s())
        );
        match self.server_us_per_op() {
            Some(us) => {
                let _ = write!(
                    s,
                    "; server CPU {:.2} s = {:.2} µs/{}",
                    self.server_cpu_s.unwrap_or(0.0),
                    us,
                    self.unit
                );
            }
            None => s.push_str("; server CPU unknown (no pid)"),
        }
        if let Some(us) = self.client_us_per_op() {
            let _ = write!(s, "; client {us:.2} µs/{}", self.unit);
        }
        if let Some(l) = &self.latency {
            let _ = write!(
                s,
                "; latency p50 {:.0} µs p99 {:.0} µs p999 {:.0} µs",
                l.p50, l.p99, l.p999
            );
        }
        if let Some(b) = self.extra_f64("used_memory_per_job") {
            let _ = write!(s, "; used_memory {b:.1} B/job");
        }
        if let Some(b) = self.extra_f64("rss_per_job") {
            let _ = write!(s, "; RSS {b:.1} B/job");
        }
        if !self.complete {
            s.push_str(" [INCOMPLETE: stopped by time limit or Ctrl-C]");
        }
        s
    }
}

pub fn human(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// A progress bar on stderr, drawn once a run has lasted two seconds.
pub struct Progress {
    done: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Progress {
    /// `count` grows toward `total` (0 when only time tells); `limit` bounds the run.
    pub fn start(label: String, count: Arc<AtomicU64>, total: u64, limit: Duration) -> Progress {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let handle = std::thread::spawn(move || {
            // SAFETY: isatty only inspects the descriptor.
            let tty = unsafe { libc::isatty(2) } == 1;
            let t0 = Instant::now();
            let mut drawn = false;
            let mut last_plain = Instant::now();
            while !d.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let el = t0.elapsed();
                if el < Duration::from_secs(2) {
                    continue;
                }
                let n = count.load(Ordering::Relaxed);
                let frac = if total > 0 {
                    n as f64 / total as f64
                } else {
                    el.as_secs_f64() / limit.as_secs_f64()
                }
                .clamp(0.0, 1.0);
                let width = 30;
                let fill = (frac * width as f64) as usize;
                let line = format!(
                    "{label} [{}{}] {:>3.0}% {n}{} {:.1}s",
                    "#".repeat(fill),
                    " ".repeat(width - fill),
                    frac * 100.0,
                    if total > 0 {
                        format!("/{total}")
                    } else {
                        String::new()
                    },
                    el.as_secs_f64()
                );
                let mut err = std::io::stderr().lock();
                if tty {
                    let _ = write!(err, "\r{line}\x1b[K");
                    drawn = true;
                } else if last_plain.elapsed() >= Duration::from_secs(5) || !drawn {
                    let _ = writeln!(err, "{line}");
                    last_plain = Instant::now();
                    drawn = true;
                }
                let _ = err.flush();
            }
            if drawn && tty {
                let _ = write!(std::io::stderr(), "\r\x1b[K");
            }
        });
        Progress {
            done,
            handle: Some(handle),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The commandstats delta between two snapshots, leaving out INFO itself.
pub fn commandstats_delta(
    a: &std::collections::BTreeMap<String, (u64, u64)>,
    b: &std::collections::BTreeMap<String, (u64, u64)>,
) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    for (name, (calls, usec)) in b {
        if name == "info" {
            continue;
        }
        let (c0, u0) = a.get(name).copied().unwrap_or((0, 0));
        if *calls > c0 {
            out.push((name.clone(), calls - c0, usec.saturating_sub(u0)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_percentiles() {
        let j = Json::Obj(vec![
            ("a".into(), Json::Str("x\"y".into())),
            ("b".into(), Json::Num(1.23456)),
            ("c".into(), Json::Null),
        ]);
        assert_eq!(j.to_text(), r#"{"a":"x\"y","b":1.235,"c":null}"#);
        let l = Latency::from_ns((1..=1000).map(|i| i * 1000).collect()).unwrap();
        assert_eq!(l.p50, 500.0);
        assert_eq!(l.p99, 990.0);
        assert_eq!(l.p999, 999.0);
        assert_eq!(l.max, 1000.0);
    }
}
