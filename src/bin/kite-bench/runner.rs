//! Running many connections on a few client threads: each thread drives its share with a
//! single-threaded tokio runtime; a shared `Ctl` counts operations, stops the run when
//! the work is done, the time limit passes or Ctrl-C is pressed, and records the instant
//! (and the server's CPU time) at which the last operation completed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::report::Mark;
use crate::signal;

/// Where and how to run.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub pid: Option<i32>,
    pub client_threads: usize,
    pub max_seconds: f64,
}

pub struct Ctl {
    pub count: Arc<AtomicU64>,
    pub total: u64,
    pub deadline: Instant,
    stop: AtomicBool,
    pid: Option<i32>,
    start: Mutex<Option<Mark>>,
    end: Mutex<Option<Mark>>,
    err: Mutex<Option<String>>,
    barrier: Barrier,
}

impl Ctl {
    pub fn new(t: &Target, total: u64) -> Ctl {
        Ctl {
            count: Arc::new(AtomicU64::new(0)),
            total,
            deadline: Instant::now() + Duration::from_secs_f64(t.max_seconds),
            stop: AtomicBool::new(false),
            pid: t.pid,
            start: Mutex::new(None),
            end: Mutex::new(None),
            err: Mutex::new(None),
            barrier: Barrier::new(t.client_threads.max(1)),
        }
    }

    pub fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || signal::stopping() || Instant::now() >= self.deadline
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Counts `n` operations; the one that reaches the total marks the end and stops the run.
    pub fn add(&self, n: u64) {
        let before = self.count.fetch_add(n, Ordering::Relaxed);
        if self.total > 0 && before < self.total && before + n >= self.total {
            self.mark_end();
            self.stop();
        }
    }

    pub fn done(&self) -> bool {
        self.count.load(Ordering::Relaxed) >= self.total
    }

    pub fn mark_end(&self) {
        let m = Mark::now(self.pid);
        let mut e = self.end.lock().unwrap();
        if e.is_none() {
            *e = Some(m);
        }
    }

    pub fn fail(&self, e: impl ToString) {
        let mut g = self.err.lock().unwrap();
        if g.is_none() {
            *g = Some(e.to_string());
        }
        drop(g);
        self.stop();
    }

    /// Every client thread calls this once its connections are set up; the start is
    /// marked (by `before_start`, then the clock) once all have arrived, before any goes on.
    pub fn sync_start(&self, before_start: impl FnOnce()) {
        if self.barrier.wait().is_leader() {
            before_start();
            *self.start.lock().unwrap() = Some(Mark::now(self.pid));
        }
        self.barrier.wait();
    }

    pub fn start_mark(&self) -> Option<Mark> {
        *self.start.lock().unwrap()
    }

    /// The end mark: when the last operation completed, else now (stopped early).
    pub fn end_mark(&self) -> Mark {
        self.end
            .lock()
            .unwrap()
            .unwrap_or_else(|| Mark::now(self.pid))
    }

    pub fn error(&self) -> Option<String> {
        self.err.lock().unwrap().clone()
    }
}

/// Runs `f(i)` for i in 0..n, each on its own thread with a single-threaded runtime.
pub fn on_threads<T, F, Fut>(n: usize, f: F) -> io::Result<Vec<T>>
where
    F: Fn(usize) -> Fut + Sync,
    Fut: Future<Output = io::Result<T>>,
    T: Send,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n.max(1))
            .map(|i| {
                let f = &f;
                s.spawn(move || -> io::Result<T> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, f(i))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("client thread panicked")))
            })
            .collect()
    })
}

/// Waits for the tasks of one client thread; aborts the rest once the run must stop.
pub async fn supervise(ctl: &Ctl, handles: Vec<JoinHandle<io::Result<()>>>) {
    loop {
        if handles.iter().all(|h| h.is_finished()) {
            break;
        }
        if ctl.should_stop() {
            for h in &handles {
                h.abort();
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for h in handles {
        match h.await {
            Ok(Err(e)) => ctl.fail(e),
            Err(e) if e.is_panic() => ctl.fail("a client task panicked"),
            _ => {}
        }
    }
}

/// A small, fast PRNG (xorshift64*), seeded per task.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix(seed.wrapping_add(0x9E37_79B9_7F4A_7C15)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next() >> 32) * n) >> 32
    }
}

/// A bijection on u64 (SplitMix64's finalizer), used to make unique-looking ids.
pub fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
