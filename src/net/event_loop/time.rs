//! The thread's timers: a hashed wheel of 1 ms slots (blocking timeouts, WAIT, CLIENT
//! PAUSE, housekeeping ticks, replication heartbeats). Owns deadlines and whom to wake at
//! each; never decides what a timeout means.
//!
//! A timer sits in slot `deadline % SLOTS`; one due more than a turn away stays there
//! until its round comes. Inserting is a push, cancelling marks the entry free (the slot
//! drops its stale key when the wheel next passes it), and each pass walks the slots of
//! the milliseconds that went by. The loop sleeps until the earliest deadline, cached and
//! found again by walking the slots only once it has passed.
//!
//! Off a loop thread every timer here is tokio's.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const SLOTS: usize = 512;

struct Entry {
    generation: u32,
    deadline: u64,
    /// `Some` while waiting; `None` once fired (while `live`) or free.
    waker: Option<Waker>,
    live: bool,
}

impl Entry {
    /// Its deadline passed and its waker was called; the `Sleep` has not seen it yet.
    fn fired(&self) -> bool {
        self.live && self.waker.is_none()
    }
}

struct Wheel {
    epoch: Instant,
    /// Every deadline up to this millisecond has fired.
    now: u64,
    slots: Vec<Vec<u64>>,
    entries: Vec<Entry>,
    free: Vec<u32>,
    waiting: usize,
    /// No waiting timer is due before this (it may be earlier than the real earliest
    /// when that one was cancelled; never later).
    earliest: u64,
}

thread_local! {
    static WHEEL: RefCell<Option<Wheel>> = const { RefCell::new(None) };
}

pub(super) fn start() {
    WHEEL.with_borrow_mut(|w| *w = Some(Wheel::new()));
}

impl Wheel {
    fn new() -> Wheel {
        Wheel {
            epoch: Instant::now(),
            now: 0,
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            entries: Vec::new(),
            free: Vec::new(),
            waiting: 0,
            earliest: u64::MAX,
        }
    }

    /// Milliseconds since the epoch, rounded up: a timer never fires early.
    fn ms_ceil(&self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.epoch);
        let ms = d.as_millis() as u64;
        if !d.subsec_nanos().is_multiple_of(1_000_000) {
            ms + 1
        } else {
            ms
        }
    }

    fn ms_now(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.epoch)
            .as_millis() as u64
    }

    fn insert(&mut self, deadline: u64, waker: Waker) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Entry {
                    generation: 0,
                    deadline: 0,
                    waker: None,
                    live: false,
                });
                (self.entries.len() - 1) as u32
            }
        };
        let e = &mut self.entries[index as usize];
        e.deadline = deadline;
        e.waker = Some(waker);
        e.live = true;
        let key = (u64::from(e.generation) << 32) | u64::from(index);
        self.slots[(deadline % SLOTS as u64) as usize].push(key);
        self.waiting += 1;
        self.earliest = self.earliest.min(deadline);
        key
    }

    fn entry(&mut self, key: u64) -> Option<&mut Entry> {
        self.entries
            .get_mut(key as u32 as usize)
            .filter(|e| e.live && e.generation == (key >> 32) as u32)
    }

    fn release(&mut self, key: u64) {
        let index = key as u32;
        let Some(e) = self.entry(key) else { return };
        let was_waiting = e.waker.take().is_some();
        e.live = false;
        e.generation = e.generation.wrapping_add(1);
        if was_waiting {
            self.waiting -= 1;
        }
        self.free.push(index);
    }

    /// Fires every timer due by `to`, handing their wakers to `fire`.
    fn advance(&mut self, to: u64, fire: &mut Vec<Waker>) {
        if to <= self.now {
            return;
        }
        let from = self.now + 1;
        self.now = to;
        let span = (to - from + 1).min(SLOTS as u64);
        for t in from..from + span {
            let slot = (t % SLOTS as u64) as usize;
            if self.slots[slot].is_empty() {
                continue;
            }
            let mut keys = std::mem::take(&mut self.slots[slot]);
            keys.retain(|&key| {
                let Some(e) = self.entry(key) else {
                    return false;
                };
                if e.waker.is_none() {
                    return false;
                }
                if e.deadline > to {
                    return true;
                }
                if let Some(w) = e.waker.take() {
                    fire.push(w);
                }
                self.waiting -= 1;
                false
            });
            // Nothing ran while the slot was out (wakers are only collected), so it is
            // put back as it was, less the fired and stale keys.
            self.slots[slot] = keys;
        }
    }

    /// Milliseconds until the earliest waiting deadline, if any.
    fn next_deadline(&mut self) -> Option<u64> {
        if self.waiting == 0 {
            self.earliest = u64::MAX;
            return None;
        }
        if self.earliest > self.now {
            return Some(self.earliest);
        }
        // The cached earliest has passed (fired or cancelled): walk one turn of slots in
        // time order. A timer due within the turn is found in the slot of its own
        // millisecond; past that, waking once a turn to look again is cheap.
        for t in self.now + 1..=self.now + SLOTS as u64 {
            let slot = (t % SLOTS as u64) as usize;
            let due = self.slots[slot].iter().any(|&key| {
                self.entries.get(key as u32 as usize).is_some_and(|e| {
                    e.live
                        && e.generation == (key >> 32) as u32
                        && e.waker.is_some()
                        && e.deadline == t
                })
            });
            if due {
                self.earliest = t;
                return Some(t);
            }
        }
        self.earliest = self.now + SLOTS as u64;
        Some(self.earliest)
    }
}

/// Fires what is due; called by the loop after each wait.
pub(super) fn advance() {
    let mut fire = Vec::new();
    WHEEL.with_borrow_mut(|w| {
        let Some(w) = w.as_mut() else { return };
        if w.waiting == 0 {
            // Nothing waits: keep up without walking the slots (stale keys in them are
            // skipped whenever they are walked).
            w.now = w.now.max(w.ms_now());
            return;
        }
        let now = w.ms_now();
        w.advance(now, &mut fire);
    });
    for waker in fire {
        waker.wake();
    }
}

/// How long the loop may wait (its `io_uring_enter` or `epoll_wait`): until the earliest timer, or -1 for none.
pub(super) fn next_timeout_ms() -> i32 {
    WHEEL.with_borrow_mut(|w| {
        let Some(w) = w.as_mut() else { return -1 };
        match w.next_deadline() {
            None => -1,
            Some(d) => d.saturating_sub(w.ms_now()).min(i32::MAX as u64) as i32,
        }
    })
}

/// A timer: `sleep` or `sleep_until`.
pub struct Sleep {
    inner: SleepInner,
    /// A wheel timer belongs to its thread's wheel: never sent elsewhere.
    _here: std::marker::PhantomData<std::rc::Rc<()>>,
}

enum SleepInner {
    Wheel { deadline: Instant, key: Option<u64> },
    Tokio(Pin<Box<tokio::time::Sleep>>),
}

pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(far_or(Instant::now(), duration))
}

/// `from + duration`, or about thirty years on where that would overflow (a setting of
/// `repl-timeout` near i64::MAX seconds means "never").
fn far_or(from: Instant, duration: Duration) -> Instant {
    from.checked_add(duration)
        .or_else(|| from.checked_add(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(from)
}

pub fn sleep_until(deadline: Instant) -> Sleep {
    let on_loop = WHEEL.with_borrow(|w| w.is_some());
    Sleep {
        inner: if on_loop {
            SleepInner::Wheel {
                deadline,
                key: None,
            }
        } else {
            SleepInner::Tokio(Box::pin(tokio::time::sleep_until(
                tokio::time::Instant::from_std(deadline),
            )))
        },
        _here: std::marker::PhantomData,
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.inner {
            SleepInner::Tokio(s) => s.as_mut().poll(cx),
            SleepInner::Wheel { deadline, key } => WHEEL.with_borrow_mut(|w| {
                let w = w.as_mut().expect("a wheel timer polled on its own thread");
                match *key {
                    None => {
                        let at = w.ms_ceil(*deadline);
                        if at <= w.now || Instant::now() >= *deadline {
                            return Poll::Ready(());
                        }
                        *key = Some(w.insert(at, cx.waker().clone()));
                        Poll::Pending
                    }
                    Some(k) => {
                        let Some(e) = w.entry(k) else {
                            return Poll::Ready(());
                        };
                        if e.fired() {
                            w.release(k);
                            *key = None;
                            // Polled again it stays done.
                            *deadline = w.epoch;
                            return Poll::Ready(());
                        }
                        if !e.waker.as_ref().is_some_and(|x| x.will_wake(cx.waker())) {
                            e.waker = Some(cx.waker().clone());
                        }
                        Poll::Pending
                    }
                }
            }),
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let SleepInner::Wheel { key: Some(k), .. } = self.inner {
            // The wheel may be gone already when the thread's locals are being torn down.
            let _ = WHEEL.try_with(|w| {
                if let Some(w) = w.borrow_mut().as_mut() {
                    w.release(k);
                }
            });
        }
    }
}

/// `timeout` ran out.
#[derive(Debug, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// `future`, or `Elapsed` if it is not done within `duration`.
pub struct Timeout<F> {
    future: F,
    sleep: Sleep,
}

pub fn timeout<F: Future>(duration: Duration, future: F) -> Timeout<F> {
    Timeout {
        future,
        sleep: sleep(duration),
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `future` is never moved out of the pinned `Timeout` (structural
        // pinning); `sleep` is Unpin.
        let this = unsafe { self.get_unchecked_mut() };
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        if let Poll::Ready(v) = future.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match Pin::new(&mut this.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A periodic tick. The first completes at once. A tick less than a period late keeps
/// the schedule; one later than that moves it to a period after the late tick, so missed
/// ticks never come in a burst (between tokio's `Delay` and `Skip`).
pub struct Interval {
    period: Duration,
    next: Instant,
}

pub fn interval(period: Duration) -> Interval {
    Interval {
        period,
        next: Instant::now(),
    }
}

impl Interval {
    /// Waits for the next tick. Dropping the wait leaves the tick where it was.
    pub async fn tick(&mut self) -> Instant {
        let due = self.next;
        if Instant::now() < due {
            sleep_until(due).await;
        }
        let now = Instant::now();
        self.next = if now > far_or(due, self.period) {
            far_or(now, self.period)
        } else {
            far_or(due, self.period)
        };
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel() -> Wheel {
        Wheel::new()
    }

    #[test]
    fn a_timer_past_one_turn_waits_for_its_round() {
        let mut w = wheel();
        let key = w.insert(700, Waker::noop().clone());
        let mut fired = Vec::new();
        // 700 shares slot 188 with 188: passing it in the first turn fires nothing.
        w.advance(600, &mut fired);
        assert!(fired.is_empty());
        assert!(!w.entry(key).expect("waiting").fired());
        assert_eq!(w.next_deadline(), Some(700));
        w.advance(699, &mut fired);
        assert!(fired.is_empty());
        w.advance(700, &mut fired);
        assert_eq!(fired.len(), 1);
        assert!(w.entry(key).expect("fired, not yet released").fired());
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn next_deadline_skips_cancelled_timers_and_a_long_gap_fires_everything() {
        let mut w = wheel();
        let early = w.insert(5, Waker::noop().clone());
        let _late = w.insert(40, Waker::noop().clone());
        let _far = w.insert(5000, Waker::noop().clone());
        assert_eq!(w.next_deadline(), Some(5));
        w.release(early);
        let mut fired = Vec::new();
        w.advance(6, &mut fired);
        assert!(fired.is_empty(), "a cancelled timer fired");
        assert_eq!(w.next_deadline(), Some(40));
        // The thread was held for seconds: one advance walks each slot once and fires
        // all that are due.
        w.advance(6000, &mut fired);
        assert_eq!(fired.len(), 2);
        assert_eq!(w.waiting, 0);
        assert_eq!(w.next_deadline(), None);
    }
}
