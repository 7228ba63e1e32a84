//! The thread's io_uring ring, used to send the replies of a pass with one system call
//! (docs/event-loop.md, "Replies of one pass in one system call"), and to read the
//! sockets a wait found readable with one more ("Reads of a pass in one system call").
//!
//! Owns the ring and the list of connections whose replies wait in it. Decides nothing
//! about what is sent or read: a connection hands over finished bytes
//! (`Stream::queue_for_pass`) and this module only sends them, in one `io_uring_enter`
//! for the whole list, and tells a connection when its socket took less than all; the
//! reactor hands over buffers to read into (`flush_and_recv`) and gets the results. Never
//! parses or runs a command.
//!
//! Every send and receive carries `MSG_DONTWAIT`, so the kernel completes it inside the
//! submitting call (done, cut short, or `-EAGAIN`) rather than parking it: once `flush`
//! or `flush_and_recv` returns no buffer is in the kernel's hands. Should a completion ever be missing (a kernel that
//! parks the send after all), `flush` cancels it and waits for the answer before it lets
//! go of any buffer, and the thread stops using its ring. If even that fails, the buffer
//! the kernel may still read is never freed or reused (`ABANDONED`) and its connection is
//! closed: memory stays safe and the lost replies are not silent.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
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
}

thread_local! {
    static BATCH: RefCell<Option<Batch>> = const { RefCell::new(None) };
    static ON: Cell<bool> = const { Cell::new(false) };
    /// Connections whose last batched send was cut short: they send the rest themselves.
    /// Kept apart from the ring (it outlives a ring given up) so a busy script's hook can
    /// tell they are owed output (`owes_output`).
    static STALLED: RefCell<Vec<Weak<Stream>>> = const { RefCell::new(Vec::new()) };
    /// Buffers the kernel might still read after the ring failed in the middle of a send:
    /// kept for the thread's life rather than freed. Empty unless that ever happens.
    static ABANDONED: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// Marks the completions of cancellations, apart from those of sends (a send's is its
/// index in the chunk).
const CANCEL_TAG: u64 = 1 << 63;

/// Threads whose replies go through a ring, and why the last one that could not set one
/// up, or gave one up, did so (INFO server).
static THREADS_ON_RING: AtomicUsize = AtomicUsize::new(0);
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

fn record_error(msg: &str) {
    *LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()) = msg.to_string();
}

/// Sets up this thread's ring, unless `wanted` is false (`--event-loop epoll`). On any
/// error the thread writes replies itself; the error is returned and kept for INFO.
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
                })
            });
            ON.with(|on| on.set(true));
            THREADS_ON_RING.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        Err(e) => {
            let msg = format!("io_uring setup failed: {e}");
            record_error(&msg);
            Err(msg)
        }
    }
}

/// What INFO server reports: how replies are sent, and why not through a ring if not.
pub fn describe() -> (&'static str, String) {
    let on = THREADS_ON_RING.load(Ordering::Relaxed) > 0;
    let err = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()).clone();
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

/// Whether the connection on `fd` still owes its client bytes of a send cut short, so a
/// busy script's hook must not answer it first.
pub fn owes_output(fd: i32) -> bool {
    STALLED.with(|v| {
        v.borrow()
            .iter()
            .filter_map(|w| w.upgrade())
            .any(|s| s.raw_fd() == fd && s.owes_output())
    })
}

/// Sends every waiting connection's replies: one `io_uring_enter` per 256 connections.
/// Called at the end of each turn of the thread's tasks and wherever waiting would
/// reorder output. Never re-entered: nothing it calls runs a task.
pub fn flush() {
    // SAFETY: no receives.
    unsafe { flush_and_recv(&mut []) };
}

/// One receive of a batch: into `len` bytes at `buf` from socket `fd`. `result` is set
/// to the bytes received, a negative errno, `LEFT_WITH_KERNEL`, or 0: nothing read (the
/// end of the stream, or a receive never tried), which the socket's reader finds out by
/// reading itself.
pub struct Recv {
    pub fd: i32,
    pub buf: *mut u8,
    pub len: u32,
    pub result: i32,
}

/// A receive the kernel did not complete and could not be made to give up: it may still
/// write into its buffer, which the caller must never free or reuse.
pub const LEFT_WITH_KERNEL: i32 = i32::MIN;

/// Sends every waiting connection's replies and receives into every buffer of `reads`,
/// without waiting: one `io_uring_enter` for up to 256 of them together, sends first.
/// False, with nothing read or sent, if this thread has no ring.
///
/// # Safety
/// Each `buf` of `reads` must be valid for writes of `len` bytes until this returns,
/// and for ever where the result is `LEFT_WITH_KERNEL`.
pub unsafe fn flush_and_recv(reads: &mut [Recv]) -> bool {
    BATCH.with(|b| {
        let Ok(mut guard) = b.try_borrow_mut() else {
            return false;
        };
        let Some(batch) = guard.as_mut() else {
            return false;
        };
        if batch.waiting.is_empty() && reads.is_empty() {
            return true;
        }
        // The loop reads ahead only right after a wait, and sends before every wait, so
        // no send is queued here. (Were one queued, dropping the list below could free a
        // socket whose read-ahead the caller has yet to apply.)
        debug_assert!(reads.is_empty() || batch.waiting.is_empty());
        let mut waiting = std::mem::take(&mut batch.waiting);
        let mut healthy = true;
        {
            let mut sends: &[Rc<Stream>] = &waiting;
            let mut recvs: &mut [Recv] = reads;
            while !sends.is_empty() || !recvs.is_empty() {
                let ns = sends.len().min(ENTRIES as usize);
                let nr = recvs.len().min(ENTRIES as usize - ns);
                let (sends_now, sends_later) = sends.split_at(ns);
                let (recvs_now, recvs_later) = std::mem::take(&mut recvs).split_at_mut(nr);
                if healthy {
                    healthy = submit(&mut batch.ring, sends_now, recvs_now);
                } else {
                    // Never handed to the kernel: the connections send them themselves,
                    // and the readers read for themselves.
                    for s in sends_now {
                        s.in_batch.set(false);
                        stall(s);
                    }
                    for r in recvs_now.iter_mut() {
                        r.result = 0;
                    }
                }
                sends = sends_later;
                recvs = recvs_later;
            }
        }
        // Dropping the list lets go of connections that closed while their replies
        // waited: their sockets close now, after the replies.
        waiting.clear();
        batch.waiting = waiting;
        if !healthy {
            tracing::warn!("io_uring stopped working on this thread; replies are written and sockets read one by one from now on");
            record_error("io_uring failed at run time (see the log)");
            guard.take();
            ON.with(|on| on.set(false));
            THREADS_ON_RING.fetch_sub(1, Ordering::Relaxed);
        }
        true
    })
}

/// Marks the completions of receives, apart from those of sends (a send's is its index
/// among the sends).
const RECV_TAG: u64 = 1 << 62;

/// One `io_uring_enter` for `sends` and `recvs` (together at most the ring's size);
/// false if the ring is to be given up (every connection and receive has then been told
/// what became of its bytes).
fn submit(ring: &mut IoUring, sends: &[Rc<Stream>], recvs: &mut [Recv]) -> bool {
    // Which sends went to the kernel.
    let mut pushed = Bits::default();
    let mut expected = 0usize;
    {
        let mut sq = ring.submission();
        for (i, s) in sends.iter().enumerate() {
            s.in_batch.set(false);
            let unsent = s.unsent.borrow();
            if unsent.is_empty() || s.send_failed.get() {
                continue;
            }
            let entry =
                opcode::Send::new(types::Fd(s.raw_fd()), unsent.as_ptr(), unsent.len() as u32)
                    .flags(libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
                    .build()
                    .user_data(i as u64);
            // SAFETY: the buffer stays alive and unchanged until this entry's completion
            // is taken below, before this function returns (or, if the kernel never
            // answers, for ever: `abandon`): nothing else runs meanwhile on this thread,
            // and the list holds the connection. The entries never outnumber the ring's
            // slots, and the ring is empty between calls.
            if unsafe { sq.push(&entry) }.is_err() {
                unreachable!("a chunk fits the ring");
            }
            pushed.set(i);
            expected += 1;
        }
        for (j, r) in recvs.iter().enumerate() {
            let entry = opcode::Recv::new(types::Fd(r.fd), r.buf, r.len)
                .flags(libc::MSG_DONTWAIT)
                .build()
                .user_data(RECV_TAG | j as u64);
            // SAFETY: the caller keeps the buffer valid until this returns (or for ever
            // if it is left with the kernel).
            if unsafe { sq.push(&entry) }.is_err() {
                unreachable!("a chunk fits the ring");
            }
            expected += 1;
        }
    }
    if expected == 0 {
        return true;
    }
    // Submit. Nothing reached the kernel if this fails, and the ring (with the entries
    // still in it) is dropped by the caller, so the connections send and read for
    // themselves.
    if let Err(e) = enter(ring, 0) {
        tracing::warn!("io_uring_enter failed: {e}");
        for s in sends {
            stall(s);
        }
        for r in recvs.iter_mut() {
            r.result = 0;
        }
        return false;
    }
    let mut answers = Answers {
        sent: Bits::default(),
        received: Bits::default(),
        left: expected,
    };
    for cqe in ring.completion() {
        answers.take(cqe.user_data(), cqe.result(), sends, recvs);
    }
    let sends_pushed = pushed.count();
    if sends_pushed > 0 {
        super::count(|c| {
            c.send_batches += 1;
            c.batched_sends += sends_pushed as u64;
        });
    }
    if answers.left == 0 {
        return true;
    }
    // This kernel parked an entry instead of completing it in the call: cancel what is
    // missing, wait for every answer, and stop using the ring.
    let missing: Vec<u64> = (0..sends.len())
        .filter(|&i| pushed.has(i) && !answers.sent.has(i))
        .map(|i| i as u64)
        .chain(
            (0..recvs.len())
                .filter(|&j| !answers.received.has(j))
                .map(|j| RECV_TAG | j as u64),
        )
        .collect();
    let give_up = |recvs: &mut [Recv], answers: &Answers| {
        tracing::warn!("io_uring_enter failed while cancelling parked entries");
        for i in (0..sends.len()).filter(|&i| pushed.has(i) && !answers.sent.has(i)) {
            abandon(&sends[i]);
        }
        for (j, r) in recvs.iter_mut().enumerate() {
            if !answers.received.has(j) {
                r.result = LEFT_WITH_KERNEL;
            }
        }
    };
    for &tag in &missing {
        let cancel = opcode::AsyncCancel::new(tag)
            .build()
            .user_data(CANCEL_TAG | tag);
        // SAFETY: a cancellation carries no buffer. Entries the kernel did not take yet
        // may still fill the queue: submitting makes room (they complete as above).
        while unsafe { ring.submission().push(&cancel) }.is_err() {
            if enter(ring, 0).is_err() {
                give_up(recvs, &answers);
                return false;
            }
        }
    }
    while answers.left > 0 {
        if enter(ring, 1).is_err() {
            give_up(recvs, &answers);
            return false;
        }
        for cqe in ring.completion() {
            if cqe.user_data() & CANCEL_TAG == 0 {
                answers.take(cqe.user_data(), cqe.result(), sends, recvs);
            }
        }
    }
    false
}

/// Which entries of one `submit` have had their completion, and how many have not.
struct Answers {
    sent: Bits,
    received: Bits,
    left: usize,
}

/// One bit per entry of a submit (a set of booleans is cleared every pass; this is a
/// quarter of a cache line).
#[derive(Default)]
struct Bits([u64; ENTRIES as usize / 64]);

impl Bits {
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }

    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }

    fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
}

impl Answers {
    /// Applies one completion to its send or receive (once: a late duplicate is ignored).
    fn take(&mut self, tag: u64, result: i32, sends: &[Rc<Stream>], recvs: &mut [Recv]) {
        if tag & RECV_TAG != 0 {
            let j = (tag & !RECV_TAG) as usize;
            if !self.received.has(j) {
                self.received.set(j);
                self.left -= 1;
                // Cancelled means nothing was read: left to the reader, as a 0 is.
                recvs[j].result = if result == -libc::ECANCELED {
                    0
                } else {
                    result
                };
            }
        } else {
            let i = tag as usize;
            if !self.sent.has(i) {
                self.sent.set(i);
                self.left -= 1;
                sent(&sends[i], result);
            }
        }
    }
}

/// `io_uring_enter` submitting what is queued and waiting for `want` completions,
/// retrying the errors that mean "try again".
fn enter(ring: &IoUring, want: usize) -> std::io::Result<usize> {
    let mut tries = 0;
    loop {
        match ring.submit_and_wait(want) {
            Err(e)
                if tries < ENTER_RETRIES
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) =>
            {
                tries += 1;
            }
            other => return other,
        }
    }
}

/// Applies one send's result to its connection.
fn sent(s: &Rc<Stream>, result: i32) {
    if result >= 0 {
        let mut unsent = s.unsent.borrow_mut();
        let n = (result as usize).min(unsent.len());
        if n == unsent.len() {
            unsent.clear();
            return;
        }
        bytes::Buf::advance(&mut *unsent, n);
        drop(unsent);
        super::count(|c| c.short_sends += 1);
        stall(s);
    } else if -result == libc::EAGAIN || -result == libc::ECANCELED {
        // Nothing was sent: the connection sends it all itself.
        super::count(|c| c.short_sends += 1);
        stall(s);
    } else {
        // The connection is broken. Its bytes stay, so it still owes output; its next
        // write fails and it closes.
        s.send_failed.set(true);
        s.stalled.notify_one();
    }
}

/// The socket took less than all: the connection sends the rest itself, waiting for the
/// socket as any write does.
fn stall(s: &Rc<Stream>) {
    if s.owes_output() {
        STALLED.with(|v| {
            let mut v = v.borrow_mut();
            if v.len() >= 64 {
                v.retain(|w| w.upgrade().is_some_and(|o| o.stalled_out()));
            }
            v.push(Rc::downgrade(s));
        });
    }
    s.stalled.notify_one();
}

/// The kernel may still read this connection's bytes: keep them for ever, and close the
/// connection (its replies are lost, so it must not go on as if they were sent).
fn abandon(s: &Rc<Stream>) {
    let bytes = std::mem::take(&mut *s.unsent.borrow_mut());
    ABANDONED.with(|a| a.borrow_mut().push(bytes));
    s.send_failed.set(true);
    s.stalled.notify_one();
}
