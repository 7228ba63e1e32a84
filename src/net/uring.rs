//! The thread's io_uring ring, used to send the replies of a pass with one system call
//! (docs/event-loop.md, "Replies of one pass in one system call").
//!
//! Owns the ring and the list of connections whose replies wait in it. Decides nothing
//! about what is sent: a connection hands over finished bytes (`Stream::queue_for_pass`)
//! and this module only sends them, in one `io_uring_enter` for the whole list, and
//! tells a connection when its socket took less than all. Never reads a socket, parses
//! or runs a command.
//!
//! Every send carries `MSG_DONTWAIT`, so the kernel completes it inside the submitting
//! call (sent, cut short, or `-EAGAIN`) rather than parking it: once `flush` returns no
//! buffer is in the kernel's hands. Should a completion ever be missing, `flush` waits
//! for it before it lets go of any buffer.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};

use super::Stream;

/// Replies larger than this are written at once by their connection: batching saves a
/// system call, which a large write amortises anyway.
pub const MAX_QUEUED: usize = 64 * 1024;

/// Submission slots; a longer list is sent in chunks of this size.
const ENTRIES: u32 = 256;

/// How many times a failing `io_uring_enter` is retried before the thread gives up its
/// ring and writes replies itself.
const ENTER_RETRIES: usize = 16;

struct Batch {
    ring: IoUring,
    /// Connections with replies waiting, in the order they were handed over.
    waiting: Vec<Rc<Stream>>,
    /// Connections whose last send was cut short: they send the rest themselves. Kept so
    /// a busy script's hook can tell they are owed output (`owes_output`).
    stalled: Vec<Weak<Stream>>,
}

thread_local! {
    static BATCH: RefCell<Option<Batch>> = const { RefCell::new(None) };
    static ON: Cell<bool> = const { Cell::new(false) };
}

/// Threads whose replies go through a ring, and the reason the first one that could not
/// set one up gave (INFO server).
static THREADS_ON_RING: AtomicUsize = AtomicUsize::new(0);
static SETUP_ERROR: Mutex<String> = Mutex::new(String::new());

/// Passes that sent a batch, replies sent in them, and sends the socket cut short
/// (INFO stats: `kite_send_batches`, `kite_batched_sends`, `kite_batch_short_sends`).
pub static BATCHES: AtomicU64 = AtomicU64::new(0);
pub static BATCHED: AtomicU64 = AtomicU64::new(0);
pub static SHORT: AtomicU64 = AtomicU64::new(0);

/// Sets up this thread's ring, unless `wanted` is false (`--event-loop epoll`). On any
/// error the thread writes replies itself; the error is logged and kept for INFO.
pub fn start_thread(wanted: bool) -> Result<bool, String> {
    if !wanted {
        return Ok(false);
    }
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(ENTRIES);
    match ring {
        Ok(ring) => {
            BATCH.with(|b| {
                *b.borrow_mut() = Some(Batch {
                    ring,
                    waiting: Vec::with_capacity(ENTRIES as usize),
                    stalled: Vec::new(),
                })
            });
            ON.with(|on| on.set(true));
            THREADS_ON_RING.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        Err(e) => {
            let msg = format!("io_uring setup failed: {e}");
            let mut first = SETUP_ERROR.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_empty() {
                *first = msg.clone();
            }
            Err(msg)
        }
    }
}

/// What INFO server reports: how replies are sent, and why not through a ring if not.
pub fn describe() -> (&'static str, String) {
    let on = THREADS_ON_RING.load(Ordering::Relaxed) > 0;
    let err = SETUP_ERROR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    (if on { "io_uring" } else { "write" }, err)
}

/// Whether this thread sends replies through its ring.
pub fn enabled() -> bool {
    ON.with(|on| on.get())
}

/// Lists a connection whose replies now wait (`Stream::queue_for_pass` calls it once per
/// pass and connection). A full list is sent at once.
pub(super) fn enqueue(stream: Rc<Stream>) {
    let full = BATCH.with(|b| match b.borrow_mut().as_mut() {
        Some(batch) => {
            batch.waiting.push(stream);
            batch.waiting.len() >= ENTRIES as usize
        }
        None => false,
    });
    if full {
        flush();
    }
}

/// Whether the connection on `fd` still owes its client bytes a send cut short, so a
/// busy script's hook must not answer it first.
pub fn owes_output(fd: i32) -> bool {
    BATCH.with(|b| {
        let Ok(mut guard) = b.try_borrow_mut() else {
            return false;
        };
        let Some(batch) = guard.as_mut() else {
            return false;
        };
        batch
            .stalled
            .retain(|w| w.upgrade().is_some_and(|s| s.stalled_out()));
        batch
            .stalled
            .iter()
            .any(|w| w.upgrade().is_some_and(|s| s.raw_fd() == fd))
    })
}

/// Sends every waiting connection's replies: one `io_uring_enter` per 256 connections.
/// Called when the thread is about to sleep and wherever waiting would reorder output.
pub fn flush() {
    BATCH.with(|b| {
        // A flush already under way on this thread (cannot happen today) sends the rest.
        let Ok(mut guard) = b.try_borrow_mut() else {
            return;
        };
        let Some(batch) = guard.as_mut() else {
            return;
        };
        if batch.waiting.is_empty() {
            return;
        }
        let mut waiting = std::mem::take(&mut batch.waiting);
        let mut healthy = true;
        for chunk in waiting.chunks(ENTRIES as usize) {
            if healthy {
                healthy = send_chunk(batch, chunk);
            } else {
                for s in chunk {
                    s.in_batch.set(false);
                    stall(&mut batch.stalled, s);
                }
            }
        }
        // Dropping the list lets go of connections that closed while their replies
        // waited: their sockets close now, after the replies.
        waiting.clear();
        batch.waiting = waiting;
        BATCHES.fetch_add(1, Ordering::Relaxed);
        if !healthy {
            tracing::warn!(
                "io_uring stopped working on this thread; replies are written one by one"
            );
            guard.take();
            ON.with(|on| on.set(false));
            THREADS_ON_RING.fetch_sub(1, Ordering::Relaxed);
        }
    });
}

/// Sends one chunk; false if the ring failed (the chunk's unsent connections are then
/// told to send for themselves).
fn send_chunk(batch: &mut Batch, chunk: &[Rc<Stream>]) -> bool {
    let mut expected = 0usize;
    {
        let mut sq = batch.ring.submission();
        for (i, s) in chunk.iter().enumerate() {
            s.in_batch.set(false);
            let unsent = s.unsent.borrow();
            if unsent.is_empty() {
                continue;
            }
            let entry =
                opcode::Send::new(types::Fd(s.raw_fd()), unsent.as_ptr(), unsent.len() as u32)
                    .flags(libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
                    .build()
                    .user_data(i as u64);
            // SAFETY: the buffer stays alive and unchanged until this entry's completion
            // is taken below, before this function returns: nothing else runs meanwhile
            // on this thread, and the list holds the connection. A chunk never holds more
            // entries than the ring has slots, and the ring is empty between chunks.
            if unsafe { sq.push(&entry) }.is_err() {
                unreachable!("a chunk fits the ring");
            }
            expected += 1;
        }
    }
    if expected == 0 {
        return true;
    }
    let Batch { ring, stalled, .. } = batch;
    let mut completed = 0usize;
    let mut failures = 0usize;
    let mut first = true;
    while completed < expected {
        // The first call only submits (the sends complete inside it); a later one, if
        // any completion is missing, waits for it.
        let want = if first { 0 } else { expected - completed };
        first = false;
        if let Err(e) = ring.submit_and_wait(want) {
            failures += 1;
            if failures < ENTER_RETRIES
                && matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                )
            {
                continue;
            }
            tracing::warn!("io_uring_enter failed: {e}");
            // The ring is dropped by the caller, so nothing left in it is ever sent:
            // every connection still holding bytes sends them itself.
            for s in chunk {
                stall(stalled, s);
            }
            return false;
        }
        for cqe in ring.completion() {
            completed += 1;
            sent(stalled, &chunk[cqe.user_data() as usize], cqe.result());
        }
    }
    BATCHED.fetch_add(expected as u64, Ordering::Relaxed);
    true
}

/// Applies one send's result to its connection.
fn sent(stalled: &mut Vec<Weak<Stream>>, s: &Rc<Stream>, result: i32) {
    if result >= 0 {
        let mut unsent = s.unsent.borrow_mut();
        let n = (result as usize).min(unsent.len());
        if n == unsent.len() {
            unsent.clear();
            return;
        }
        bytes::Buf::advance(&mut *unsent, n);
        drop(unsent);
        SHORT.fetch_add(1, Ordering::Relaxed);
        stall(stalled, s);
    } else if -result == libc::EAGAIN {
        SHORT.fetch_add(1, Ordering::Relaxed);
        stall(stalled, s);
    } else {
        // The connection is gone or broken: it closes at its next write.
        s.send_failed.set(true);
        s.unsent.borrow_mut().clear();
        s.stalled.notify_one();
    }
}

/// The socket took less than all: the connection sends the rest itself, waiting for the
/// socket as any write does.
fn stall(stalled: &mut Vec<Weak<Stream>>, s: &Rc<Stream>) {
    if !s.unsent.borrow().is_empty() {
        // The list holds only connections still owed output, each once.
        stalled.retain(|w| {
            w.upgrade()
                .is_some_and(|o| o.stalled_out() && !Rc::ptr_eq(&o, s))
        });
        stalled.push(Rc::downgrade(s));
    }
    s.stalled.notify_one();
}
