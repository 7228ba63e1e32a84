//! A cheap clock for the command path.
//!
//! Every command needs the time (expiry checks, access times, command statistics), and a
//! profile of pipelined SET/GET showed `clock_gettime` taking 13% of the server's CPU on
//! these virtual machines. On x86-64 this clock reads the CPU's time-stamp counter and
//! converts it with a rate measured at start-up; each thread re-anchors it to the system
//! clock every 100 ms (`resync`), so it never drifts far from wall time.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn system_unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn ticks() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn ticks() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Ticks per microsecond, measured once.
fn ticks_per_us() -> f64 {
    static RATE: OnceLock<f64> = OnceLock::new();
    *RATE.get_or_init(|| {
        let (t0, i0) = (ticks(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, elapsed) = (ticks(), i0.elapsed());
        let rate = (t1.wrapping_sub(t0)) as f64 / elapsed.as_micros().max(1) as f64;
        if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            1000.0
        }
    })
}

/// Microseconds per tick in 32.32 fixed point: a multiply instead of a float division on
/// every reading (a command reads the clock twice; at depth 16, `perf annotate` put
/// about a sixth of `exec_here`'s samples on the division and the conversions).
fn us_per_tick_fixed() -> u64 {
    static SCALE: OnceLock<u64> = OnceLock::new();
    *SCALE.get_or_init(|| ((1u64 << 32) as f64 / ticks_per_us()).max(1.0) as u64)
}

#[inline]
fn ticks_to_us(ticks: u64) -> u64 {
    ((ticks as u128 * us_per_tick_fixed() as u128) >> 32) as u64
}

thread_local! {
    /// (ticks, unix µs) at the last anchoring.
    static ANCHOR: Cell<(u64, u64)> = Cell::new((ticks(), system_unix_us()));
}

/// Measures the tick rate; call once at start-up, before threads serve clients.
pub fn init() {
    us_per_tick_fixed();
}

/// Re-anchors this thread's clock to the system clock.
pub fn resync() {
    ANCHOR.with(|a| a.set((ticks(), system_unix_us())));
}

/// Unix time in microseconds.
#[inline]
pub fn unix_us() -> u64 {
    unix_us_at(ticks())
}

#[inline]
fn unix_us_at(at: u64) -> u64 {
    let (t0, u0) = ANCHOR.with(|a| a.get());
    // A reading from before the anchor (a stopwatch started before this thread's first
    // look at the clock anchored it, or a core whose counter lags a little) is the
    // anchor's time, not a wrapped difference centuries ahead, which expired every key.
    u0 + ticks_to_us(at.saturating_sub(t0))
}

/// Unix time in milliseconds.
#[inline]
pub fn unix_ms() -> u64 {
    unix_us() / 1000
}

/// A point in time for measuring durations.
#[derive(Clone, Copy)]
pub struct Stopwatch(u64);

impl Stopwatch {
    #[inline]
    pub fn start() -> Stopwatch {
        Stopwatch(ticks())
    }

    #[inline]
    pub fn elapsed_us(&self) -> u64 {
        ticks_to_us(ticks().wrapping_sub(self.0))
    }

    /// Unix time in milliseconds when the stopwatch started: a command's "now" and its
    /// duration's start from one reading of the counter.
    #[inline]
    pub fn unix_ms(&self) -> u64 {
        unix_us_at(self.0) / 1000
    }
}

/// Runs `f` and measures its own run time: the time spent inside its polls, not the
/// time it spent suspended between them (waiting for another thread's answer, a lock,
/// or the other tasks of this thread).
pub async fn own_time<F: std::future::Future>(f: F) -> (F::Output, u64) {
    let mut f = std::pin::pin!(f);
    let mut spent = 0u64;
    let out = std::future::poll_fn(|cx| {
        let t0 = ticks();
        let r = f.as_mut().poll(cx);
        // Saturating: a thread moved to a core whose counter lags must not count ages.
        spent = spent.saturating_add(ticks().saturating_sub(t0));
        r
    })
    .await;
    (out, ticks_to_us(spent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopwatch_started_before_the_thread_anchors_its_clock_tells_the_present() {
        init();
        // A fresh thread: its anchor is made by the first look at the clock, which here
        // comes after the stopwatch's reading (as on a loader's first command).
        let (from_watch, system) = std::thread::spawn(|| {
            let w = Stopwatch::start();
            std::thread::sleep(Duration::from_millis(2));
            (w.unix_ms(), system_unix_us() / 1000)
        })
        .join()
        .expect("the thread ran");
        assert!(
            from_watch.abs_diff(system) < 1000,
            "{from_watch} against the system's {system}"
        );
    }

    #[test]
    fn follows_the_system_clock() {
        init();
        resync();
        let a = unix_us();
        let s = system_unix_us();
        assert!(a.abs_diff(s) < 50_000, "{a} vs {s}");
        let w = Stopwatch::start();
        std::thread::sleep(Duration::from_millis(30));
        let us = w.elapsed_us();
        assert!((25_000..200_000).contains(&us), "{us}");
    }
}
