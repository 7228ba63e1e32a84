//! Each shard thread's own loop (docs/event-loop.md, step 2a): runs the thread's tasks,
//! waits for its sockets on its own epoll (`reactor`) and keeps its timers in a wheel
//! (`time`). Owns when the thread runs, waits and is woken; never parses a request and
//! never touches shard data (the tasks it runs do).
//!
//! Off a loop thread (the cluster bus's thread, unit tests under tokio) `spawn_local` and
//! the timers fall back on tokio's, so code shared with those places needs no second form.

pub mod reactor;
pub mod time;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::shard::mailbox::Mailbox;

pub use reactor::{take_read_ahead, Interest, Socket};

type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

/// One spawned task's place. The future is taken out while it is polled, so a task may
/// spawn, wake or drop others (and itself be woken) from inside its poll.
struct TaskSlot {
    generation: u32,
    live: bool,
    scheduled: bool,
    future: Option<LocalFuture>,
    waker: Option<Waker>,
}

struct Tasks {
    slots: Vec<TaskSlot>,
    free: Vec<u32>,
    ready: VecDeque<u32>,
}

/// What a task's waker needs to find it from any thread.
struct TaskWaker {
    key: u64,
    loop_id: usize,
    remote: Arc<Remote>,
}

/// Wake-ups from other threads: the woken tasks' keys, with the mailbox's rule of waking
/// the thread only when it sleeps (its waker writes the loop's eventfd).
struct Remote {
    woken: Mailbox<u64>,
}

thread_local! {
    /// Non-zero on a thread that runs a Kite loop.
    static LOOP_ID: Cell<usize> = const { Cell::new(0) };
    static TASKS: RefCell<Tasks> = const {
        RefCell::new(Tasks {
            slots: Vec::new(),
            free: Vec::new(),
            ready: VecDeque::new(),
        })
    };
    static REMOTE: RefCell<Option<Arc<Remote>>> = const { RefCell::new(None) };
}

static NEXT_LOOP_ID: AtomicUsize = AtomicUsize::new(1);

/// Ready events a task may take in one poll before it is made to yield (tokio's coop
/// budget did this under `LocalSet`): a client that keeps a pipeline full, or a
/// replication stream that never runs dry, must not keep the thread from its other
/// connections, its mail and its send batch.
const BUDGET_PER_POLL: u32 = 128;

thread_local! {
    static BUDGET: Cell<u32> = const { Cell::new(BUDGET_PER_POLL) };
}

/// Takes one unit of the running task's budget; when it is spent, asks for the task to
/// be polled again on the next pass and says `Pending`.
#[inline]
pub fn poll_budget(cx: &mut Context<'_>) -> Poll<()> {
    BUDGET.with(|b| match b.get() {
        0 => {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
        n => {
            b.set(n - 1);
            Poll::Ready(())
        }
    })
}

/// Yields to the rest of the thread once the task has used its budget for this poll.
/// Loops that take their input from tokio types (whose own budget does not run here) call
/// it once per item.
pub async fn cooperate() {
    std::future::poll_fn(poll_budget).await
}

fn key_of(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

/// Puts a task of this thread on the ready queue, unless it is there already or gone.
fn schedule_here(key: u64) {
    TASKS.with_borrow_mut(|t| {
        let index = key as u32;
        let Some(slot) = t.slots.get_mut(index as usize) else {
            return;
        };
        if slot.live && slot.generation == (key >> 32) as u32 && !slot.scheduled {
            slot.scheduled = true;
            t.ready.push_back(index);
        }
    });
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if LOOP_ID.with(|id| id.get()) == self.loop_id {
            schedule_here(self.key);
        } else {
            self.remote.woken.push(self.key);
        }
    }
}

/// Writes the loop's eventfd: the one system call a sleeping thread costs its waker.
struct Unpark {
    eventfd: i32,
}

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd the loop keeps open for the
        // life of the process.
        unsafe { libc::write(self.eventfd, (&one as *const u64).cast(), 8) };
    }
}

/// A spawned task's result.
pub struct JoinHandle<T> {
    inner: JoinInner<T>,
}

enum JoinInner<T> {
    Kite(Rc<RefCell<JoinState<T>>>),
    Tokio(tokio::task::JoinHandle<T>),
}

struct JoinState<T> {
    value: Option<T>,
    /// The task is over: with no value, it panicked.
    finished: bool,
    waiter: Option<Waker>,
}

/// Marks the task finished however it ends (a panic unwinds through it too).
struct Finish<T>(Rc<RefCell<JoinState<T>>>);

impl<T> Drop for Finish<T> {
    fn drop(&mut self) {
        let waiter = {
            let mut s = self.0.borrow_mut();
            s.finished = true;
            s.waiter.take()
        };
        if let Some(w) = waiter {
            w.wake();
        }
    }
}

/// The task ended without a result: it panicked (or, off a loop thread, tokio dropped it).
#[derive(Debug)]
pub struct JoinError;

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.inner {
            JoinInner::Kite(state) => {
                let mut state = state.borrow_mut();
                match state.value.take() {
                    Some(v) => Poll::Ready(Ok(v)),
                    None if state.finished => Poll::Ready(Err(JoinError)),
                    None => {
                        state.waiter = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }
            }
            JoinInner::Tokio(h) => Pin::new(h).poll(cx).map_err(|_| JoinError),
        }
    }
}

/// Runs `future` on this thread's loop (or, off a loop thread, on tokio's `LocalSet`).
pub fn spawn_local<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let loop_id = LOOP_ID.with(|id| id.get());
    if loop_id == 0 {
        return JoinHandle {
            inner: JoinInner::Tokio(tokio::task::spawn_local(future)),
        };
    }
    let state = Rc::new(RefCell::new(JoinState {
        value: None,
        finished: false,
        waiter: None,
    }));
    let finish = Finish(state.clone());
    let task: LocalFuture = Box::pin(async move {
        let v = future.await;
        finish.0.borrow_mut().value = Some(v);
        drop(finish);
    });
    let remote = REMOTE
        .with_borrow(|r| r.clone())
        .expect("a loop thread has its remote");
    TASKS.with_borrow_mut(|t| {
        let index = match t.free.pop() {
            Some(i) => i,
            None => {
                t.slots.push(TaskSlot {
                    generation: 0,
                    live: false,
                    scheduled: false,
                    future: None,
                    waker: None,
                });
                (t.slots.len() - 1) as u32
            }
        };
        let slot = &mut t.slots[index as usize];
        slot.live = true;
        slot.scheduled = true;
        slot.future = Some(task);
        slot.waker = Some(Waker::from(Arc::new(TaskWaker {
            key: key_of(index, slot.generation),
            loop_id,
            remote,
        })));
        t.ready.push_back(index);
    });
    JoinHandle {
        inner: JoinInner::Kite(state),
    }
}

/// Polls the first task on the ready queue; false when the queue is empty.
fn run_one(after_panic: &mut dyn FnMut()) -> bool {
    let taken = TASKS.with_borrow_mut(|t| loop {
        let index = t.ready.pop_front()?;
        let slot = &mut t.slots[index as usize];
        // A task that woke itself and then finished left its index behind (and the slot
        // may have a new task, already queued): skip what is not scheduled.
        if !slot.scheduled {
            continue;
        }
        slot.scheduled = false;
        if let (Some(future), Some(waker)) = (slot.future.take(), slot.waker.take()) {
            return Some((index, future, waker));
        }
    });
    let Some((index, mut future, waker)) = taken else {
        return false;
    };
    BUDGET.with(|b| b.set(BUDGET_PER_POLL));
    // A task that panics ends alone, as under tokio: the thread and its other connections
    // go on (the panic hook has printed the message; a `JoinHandle` gets `JoinError`).
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        future.as_mut().poll(&mut Context::from_waker(&waker))
    }));
    let done = match polled {
        Ok(p) => p.is_ready(),
        Err(_) => {
            tracing::error!("A task panicked and was dropped; its connection, if any, is closed");
            true
        }
    };
    let panicked = polled.is_err();
    if panicked {
        // Before the drop too: dropping the task can release its locks and run what
        // waited for them, which must not inherit the panicked command's AOF hold.
        after_panic();
    }
    if done {
        TASKS.with_borrow_mut(|t| {
            let slot = &mut t.slots[index as usize];
            slot.live = false;
            slot.scheduled = false;
            slot.generation = slot.generation.wrapping_add(1);
            t.free.push(index);
        });
        // Dropped outside the borrow: a future's fields may wake or spawn as they go.
        // Dropping one can run work too (a transaction's release starts what waited for
        // its keys), so the thread's state is put back after the drop.
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(future)));
        drop(waker);
        if panicked || dropped.is_err() {
            after_panic();
        }
    } else {
        TASKS.with_borrow_mut(|t| {
            let slot = &mut t.slots[index as usize];
            slot.future = Some(future);
            slot.waker = Some(waker);
        });
    }
    true
}

fn ready_len() -> usize {
    TASKS.with_borrow(|t| t.ready.len())
}

/// What `Parking::fresh_requests` is shown: the bytes waiting in read-ahead buffers that
/// were empty when they came (usually where a request starts).
pub type FreshRequests = dyn FnMut(&[&[u8]]);

/// What the thread does between its tasks and its wait, and how it waits when it has
/// run out of work.
pub struct Parking {
    /// Called once a pass's tasks have run, before the sockets are looked at: work they
    /// queued for other threads leaves now, together (the shard's outbox).
    pub end_of_run: Box<dyn FnMut()>,
    /// Called before the thread sleeps: it may wake tasks (mail found on a last look),
    /// in which case the thread does not sleep.
    pub before: Box<dyn FnMut()>,
    /// Called when the thread is awake again after `before`.
    pub after: Box<dyn FnMut()>,
    /// Shown, before a pass's tasks run, the bytes completions brought to readers that
    /// had none waiting (`reactor::hint_fresh`): where requests start, as a hint. It must
    /// not read or write sockets: the buffers are borrowed while it runs, and a receive
    /// completing into one would find it so.
    pub fresh_requests: Box<FreshRequests>,
    /// Called after a task panicked and was dropped (or panicked as it was dropped): it
    /// puts back whatever thread state the task left half-changed, so the thread and its
    /// other connections go on.
    pub after_panic: Box<dyn FnMut()>,
}

/// The thread's loop: its epoll, its eventfd and the mailbox of tasks woken elsewhere.
pub struct EventLoop {
    epoll: i32,
    eventfd: i32,
    remote: Arc<Remote>,
}

impl EventLoop {
    /// Makes this thread a loop thread. Tasks may be spawned from here on; they run once
    /// `run` is called.
    pub fn new() -> io::Result<EventLoop> {
        // SAFETY: plain system calls; their results are checked.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        let eventfd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if eventfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: reactor::EVENTFD_TOKEN,
        };
        // SAFETY: both descriptors were just made; `ev` lives across the call.
        if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, eventfd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let remote = Arc::new(Remote {
            woken: Mailbox::default(),
        });
        remote
            .woken
            .set_waker(&Waker::from(Arc::new(Unpark { eventfd })));
        LOOP_ID.with(|id| id.set(NEXT_LOOP_ID.fetch_add(1, Ordering::Relaxed)));
        REMOTE.with_borrow_mut(|r| *r = Some(remote.clone()));
        reactor::set_epoll(epoll);
        if crate::net::uring::wait_on_ring(epoll, eventfd) {
            // The ring watches the eventfd itself: through the epoll, a wake-up would cost
            // an `epoll_wait` more.
            // SAFETY: both descriptors were just made.
            unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, eventfd, std::ptr::null_mut()) };
        }
        time::start();
        Ok(EventLoop {
            epoll,
            eventfd,
            remote,
        })
    }

    /// Runs the thread's tasks for ever.
    pub fn run(self, mut parking: Parking) -> ! {
        self.drive(&mut parking, &|| false);
        unreachable!("a shard thread's loop never ends")
    }

    /// Runs the thread's tasks until `future` is done, and returns its output (tests, and
    /// tools that need a loop for a while).
    pub fn block_on<F: Future + 'static>(self, future: F) -> F::Output
    where
        F::Output: 'static,
    {
        let out = Rc::new(RefCell::new(None));
        let slot = out.clone();
        spawn_local(async move { *slot.borrow_mut() = Some(future.await) });
        let mut parking = Parking {
            end_of_run: Box::new(|| {}),
            before: Box::new(|| {}),
            after: Box::new(|| {}),
            fresh_requests: Box::new(|_| {}),
            after_panic: Box::new(|| {}),
        };
        self.drive(&mut parking, &|| out.borrow().is_some());
        let v = out.borrow_mut().take().expect("the future finished");
        v
    }

    fn drive(&self, parking: &mut Parking, done: &dyn Fn() -> bool) {
        let mut events: Vec<libc::epoll_event> = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut woken = VecDeque::new();
        loop {
            // Each task that was ready when the pass began runs once; one woken meanwhile
            // (by a task, or by itself to yield) waits for the next pass, after the
            // sockets have been looked at.
            reactor::hint_fresh(&mut *parking.fresh_requests);
            let mut n = ready_len();
            while n > 0 && run_one(&mut *parking.after_panic) {
                n -= 1;
            }
            (parking.end_of_run)();
            let on_ring = crate::net::uring::waits();
            if !on_ring || done() {
                // This pass's replies leave together (on a ring that waits, they leave
                // with the wait below).
                crate::net::uring::flush();
            }
            if done() {
                return;
            }

            let mut timeout = 0;
            let mut parked = false;
            if ready_len() == 0 {
                crate::net::end_of_pass();
                (parking.before)();
                parked = true;
                if ready_len() == 0 && !self.remote.woken.about_to_sleep() {
                    timeout = time::next_timeout_ms();
                }
            }
            let epoll_due = if on_ring {
                // One system call: the sends, the receives readers asked for, and the
                // wait. The completions are handed out inside it.
                crate::net::uring::pass(timeout)
            } else {
                true
            };
            let mut wait = if on_ring { 0 } else { timeout };
            let mut look = epoll_due;
            while look {
                // SAFETY: `events` outlives the call and its length is what the kernel
                // is told.
                let got = unsafe {
                    libc::epoll_wait(self.epoll, events.as_mut_ptr(), events.len() as i32, wait)
                };
                for ev in events.iter().take(got.max(0) as usize) {
                    let token = ev.u64;
                    if token == reactor::EVENTFD_TOKEN {
                        let mut sink = 0u64;
                        // SAFETY: reads 8 bytes into a live u64 (resets the eventfd).
                        unsafe { libc::read(self.eventfd, (&mut sink as *mut u64).cast(), 8) };
                    } else {
                        reactor::dispatch(token, ev.events);
                    }
                }
                // The ring's watch fires when an event comes, not while events wait: a
                // full batch may have left some, so look again without waiting.
                look = on_ring && got as usize == events.len();
                wait = 0;
            }
            if parked {
                self.remote.woken.awake();
                (parking.after)();
            }
            if self.remote.woken.has_mail() {
                self.remote.woken.take_into(&mut woken);
                for key in woken.drain(..) {
                    schedule_here(key);
                }
            }
            time::advance();
        }
    }
}

/// The runtime that drives the tokio types still used on loop threads (outbound links,
/// signals): one current-thread runtime on a thread of its own, started on first
/// use. Its wake-ups reach a loop thread's tasks through their remote wakers.
pub fn tokio_handle() -> tokio::runtime::Handle {
    static HANDLE: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("kite-io".into())
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("tokio runtime");
                    let _ = tx.send(runtime.handle().clone());
                    runtime.block_on(std::future::pending::<()>());
                })
                .expect("the kite-io thread");
            rx.recv().expect("the kite-io runtime")
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::time::{sleep, timeout};
    use super::*;
    use std::time::{Duration, Instant};

    /// Runs `f`'s future on a fresh loop thread and returns its output.
    fn on_loop<T: Send + 'static, F: Future<Output = T> + 'static>(
        f: impl FnOnce() -> F + Send + 'static,
    ) -> T {
        std::thread::spawn(move || EventLoop::new().expect("loop").block_on(f()))
            .join()
            .expect("loop thread")
    }

    #[test]
    fn timers_fire_in_deadline_order_and_never_early() {
        let order = on_loop(|| async {
            let log = Rc::new(RefCell::new(Vec::new()));
            let start = Instant::now();
            let handles: Vec<_> = [30u64, 5, 18, 0, 12]
                .into_iter()
                .map(|ms| {
                    let log = log.clone();
                    spawn_local(async move {
                        sleep(Duration::from_millis(ms)).await;
                        let waited = start.elapsed();
                        assert!(
                            waited >= Duration::from_millis(ms),
                            "{ms} ms fired at {waited:?}"
                        );
                        log.borrow_mut().push(ms);
                    })
                })
                .collect();
            for h in handles {
                h.await.expect("task");
            }
            let v = log.borrow().clone();
            v
        });
        assert_eq!(order, vec![0, 5, 12, 18, 30]);
    }

    #[test]
    fn timeout_gives_the_value_or_elapsed_and_a_cancelled_timer_stays_quiet() {
        let (fast, slow, later) = on_loop(|| async {
            let fast = timeout(Duration::from_millis(200), async { 7 }).await;
            let slow = timeout(Duration::from_millis(10), std::future::pending::<()>()).await;
            // The 200 ms timer above was cancelled when its future won; waiting past it
            // must not disturb anything.
            sleep(Duration::from_millis(20)).await;
            (fast, slow, 1)
        });
        assert_eq!(fast, Ok(7));
        assert_eq!(slow, Err(time::Elapsed));
        assert_eq!(later, 1);
    }

    #[test]
    fn a_sleeping_loop_is_woken_by_another_thread_every_time() {
        // No timers and no sockets: the loop sleeps in epoll_wait with no timeout, and only
        // the remote wake (the eventfd) can get it going again. Bounded: 300 rounds.
        let rounds = on_loop(|| async {
            let mut n = 0;
            for i in 0..300u32 {
                let (tx, rx) = tokio::sync::oneshot::channel();
                std::thread::spawn(move || {
                    if i % 3 == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    let _ = tx.send(i);
                });
                assert_eq!(rx.await.expect("sender"), i);
                n += 1;
            }
            n
        });
        assert_eq!(rounds, 300);
    }

    #[test]
    fn a_panicking_task_ends_alone() {
        let (joined, after) = on_loop(|| async {
            let bad = spawn_local(async {
                if std::hint::black_box(true) {
                    panic!("a test task panics on purpose");
                }
                1
            });
            let joined = bad.await.is_err();
            let good = spawn_local(async { 2 }).await.expect("a later task runs");
            (joined, good)
        });
        assert!(joined, "the panicked task's handle reports an error");
        assert_eq!(after, 2);
    }

    #[test]
    fn a_task_that_is_always_ready_still_lets_the_others_run() {
        // A socket whose peer has gone stays readable for ever (edge-triggered epoll
        // reports the close once), and a loop that only waits for readiness would hold
        // the thread without the budget.
        let turns = on_loop(|| async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (ours, _) = listener.accept().expect("accept");
            drop(peer);
            let socket = Socket::from_std(ours).expect("register");
            let stop = Rc::new(Cell::new(false));
            let setter = {
                let stop = stop.clone();
                spawn_local(async move { stop.set(true) })
            };
            let mut turns = 0u64;
            while !stop.get() {
                socket.readable().await.expect("readable");
                turns += 1;
                assert!(turns < 1_000_000, "the other task never ran");
            }
            // And the same for a loop of tokio-fed work that calls `cooperate`.
            let stop2 = Rc::new(Cell::new(false));
            {
                let stop2 = stop2.clone();
                spawn_local(async move { stop2.set(true) });
            }
            let mut spins = 0u64;
            while !stop2.get() {
                cooperate().await;
                spins += 1;
                assert!(spins < 1_000_000, "cooperate never yielded");
            }
            setter.await.expect("setter");
            turns
        });
        assert!(
            turns <= BUDGET_PER_POLL as u64 + 1,
            "{turns} turns before yielding"
        );
    }

    #[test]
    fn a_timer_of_any_length_can_be_set() {
        let r = on_loop(|| async {
            timeout(Duration::MAX, async { 3 })
                .await
                .expect("no panic, no elapse")
        });
        assert_eq!(r, 3);
    }

    #[test]
    fn a_task_yielding_lets_the_others_run() {
        let log = on_loop(|| async {
            let log = Rc::new(RefCell::new(Vec::new()));
            let tasks: Vec<_> = ["a", "b"]
                .into_iter()
                .map(|name| {
                    let log = log.clone();
                    spawn_local(async move {
                        for i in 0..3 {
                            log.borrow_mut().push(format!("{name}{i}"));
                            tokio::task::yield_now().await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
            let v = log.borrow().clone();
            v
        });
        assert_eq!(log, ["a0", "b0", "a1", "b1", "a2", "b2"]);
    }
}
