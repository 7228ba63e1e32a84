//! The thread's io_uring ring: it sends the replies of a pass with one system call
//! (docs/event-loop.md, "Replies of one pass in one system call"), and, where it can, it
//! is also what the thread waits on: the pass's one `io_uring_enter` submits the sends
//! and the receives the readers asked for, and waits for the next completion or timer
//! ("Reads and the wait through io_uring").
//!
//! Owns the ring and the list of connections whose replies wait in it. Decides nothing
//! about what is sent or read: a connection hands over finished bytes
//! (`Stream::queue_for_pass`) and this module only sends them, in one `io_uring_enter`
//! for the whole list, and tells a connection when its socket took less than all; the
//! reactor hands over the receives to arm (`reactor::receives_to_arm`) and gets their
//! completions (`reactor::received`). Never parses or runs a command.
//!
//! Every send carries `MSG_DONTWAIT`, so the kernel completes it inside the submitting
//! call (done, cut short, or `-EAGAIN`) rather than parking it: once `flush` or `pass`
//! returns no reply's buffer is in the kernel's hands. Should a completion ever be
//! missing (a kernel that parks the send after all), the send is cancelled and waited
//! for before any buffer is let go, and the thread stops using its ring. If even that
//! fails, the buffer the kernel may still read is never freed or reused (`ABANDONED`)
//! and its connection is closed: memory stays safe and the lost replies are not silent.
//! Receives are armed (the kernel completes them when bytes come) into buffers their
//! slots keep until the completion; a ring given up cancels them first. Where the kernel
//! takes a ring of provided buffers, a receive is multishot instead: armed once, it
//! completes every time bytes come, each time into one of the thread's provided buffers,
//! which is given back to the kernel as soon as the reactor has copied its bytes out.

use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use std::sync::Mutex;

use io_uring::{cqueue, opcode, types, IoUring};

use super::event_loop::reactor;
use super::Stream;

/// Replies larger than this are written at once by their connection: batching saves a
/// system call, which a large write amortises anyway.
pub const MAX_QUEUED: usize = 64 * 1024;

/// Sends per `io_uring_enter`; a longer list is sent in chunks of this size.
const ENTRIES: u32 = 256;

/// Submission slots: a chunk of sends, and as many receives and watches beside it.
const RING_ENTRIES: u32 = 2 * ENTRIES;

/// Completion slots: armed receives may all complete in one wait. More are kept by the
/// kernel (`IORING_FEAT_NODROP`) and taken by a further enter.
const COMPLETION_ENTRIES: u32 = 4096;

/// How many times a failing `io_uring_enter` is retried before the thread gives up its
/// ring and writes replies itself.
const ENTER_RETRIES: usize = 16;

/// How long one wait for a cancellation's answer lasts (it comes inside the call on
/// every kernel seen; this bounds the failure cases it exists for).
const CANCEL_WAIT_MS: i32 = 100;

/// `IORING_ENTER_GETEVENTS`: run the ring's deferred work (receives whose bytes came),
/// and wait if asked to.
const GETEVENTS: u32 = 1;

struct Batch {
    ring: IoUring,
    /// Connections with replies waiting, in the order they were handed over.
    waiting: Vec<Rc<Stream>>,
}

thread_local! {
    static BATCH: RefCell<Option<Batch>> = const { RefCell::new(None) };
    static ON: Cell<bool> = const { Cell::new(false) };
    /// The ring is what the thread waits on (and reads plain sockets with): the
    /// thread's epoll and eventfd, watched by multishot polls.
    static WAITS: Cell<Option<Watched>> = const { Cell::new(None) };
    /// The epoll's watch has fired since the loop last looked: `epoll_wait(0)` is due.
    static EPOLL_DUE: Cell<bool> = const { Cell::new(false) };
    /// Connections whose last batched send was cut short: they send the rest themselves.
    /// Kept apart from the ring (it outlives a ring given up) so a busy script's hook can
    /// tell they are owed output (`owes_output`).
    static STALLED: RefCell<Vec<Weak<Stream>>> = const { RefCell::new(Vec::new()) };
    /// Buffers the kernel might still read after the ring failed in the middle of a send:
    /// kept for the thread's life rather than freed. Empty unless that ever happens.
    static ABANDONED: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    /// The buffers multishot receives fill, once the kernel took them.
    static PROVIDED: RefCell<Option<Provided>> = const { RefCell::new(None) };
}

/// Provided buffers per thread: enough for the receives that complete between two looks
/// at the ring (more than a pass's worth on a thousand connections); a receive that
/// finds none left ends (`ENOBUFS`) and its reader reads the socket itself.
const PROVIDED_BUFFERS: u16 = 128;

/// Bytes from one provided buffer's start to the next's: one cache line more than a
/// buffer, so that their first lines, where a small request lands, fall in different
/// cache sets. With a power-of-two stride they all fell in the same few sets and each
/// receive's copy missed (the kernel's `_copy_to_iter` went from 0.8% to 2.1% of the
/// server's samples for unpipelined SETs).
const BUFFER_STRIDE: usize = reactor::RECEIVE_BUFFER + 64;

/// The thread's ring of provided buffers (`IORING_REGISTER_PBUF_RING`): one page of ring
/// entries, then the buffers, mapped once and never unmapped (a ring given up may leave
/// the kernel a receive that still writes into them). About 2 MiB of address space per
/// thread; a buffer's pages are touched only as far as receives fill it.
struct Provided {
    entries: *mut types::BufRingEntry,
    buffers: *mut u8,
    /// The next entry to hand a buffer back in; published to the kernel after each reap.
    tail: u16,
}

impl Provided {
    /// Maps and registers the buffers with `ring`.
    fn register(ring: &IoUring) -> Result<Provided, String> {
        let count = PROVIDED_BUFFERS as usize;
        let entries_len = count * std::mem::size_of::<types::BufRingEntry>();
        let len = entries_len + count * BUFFER_STRIDE;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        let mut provided = Provided {
            entries: base.cast(),
            // SAFETY: within the mapping, which is `len` long.
            buffers: unsafe { base.cast::<u8>().add(entries_len) },
            tail: 0,
        };
        for bid in 0..PROVIDED_BUFFERS {
            provided.give_back(bid);
        }
        provided.publish();
        // SAFETY: the entries are page-aligned (the mapping's start) and, like the
        // buffers, live for the thread's life and longer.
        let registered = unsafe {
            ring.submitter().register_buf_ring_with_flags(
                base as u64,
                PROVIDED_BUFFERS,
                reactor::RECEIVE_GROUP,
                0,
            )
        };
        if let Err(e) = registered {
            // SAFETY: the kernel refused the ring, so nothing but this function refers to
            // the mapping.
            unsafe { libc::munmap(base, len) };
            return Err(format!("provided buffers: {e}"));
        }
        Ok(provided)
    }

    /// The first `len` bytes of buffer `bid`, which a completion just filled.
    fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        if bid >= PROVIDED_BUFFERS {
            return &[];
        }
        // SAFETY: `bid` names one of the buffers; the kernel wrote `len` of its bytes
        // (at most its size) and writes no more until it is given back.
        unsafe {
            std::slice::from_raw_parts(
                self.buffers.add(bid as usize * BUFFER_STRIDE),
                len.min(reactor::RECEIVE_BUFFER),
            )
        }
    }

    /// Queues buffer `bid` for the kernel again (seen by it once `publish`ed).
    fn give_back(&mut self, bid: u16) {
        if bid >= PROVIDED_BUFFERS {
            return;
        }
        let at = (self.tail & (PROVIDED_BUFFERS - 1)) as usize;
        // SAFETY: `at` is within the ring's entries; the kernel reads an entry only once
        // the tail has passed it, which `publish` does after this write.
        let entry = unsafe { &mut *self.entries.add(at) };
        // SAFETY: as in `bytes`.
        entry.set_addr(unsafe { self.buffers.add(bid as usize * BUFFER_STRIDE) } as u64);
        entry.set_len(reactor::RECEIVE_BUFFER as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Tells the kernel about the buffers given back.
    fn publish(&self) {
        // SAFETY: the tail is a u16 inside the first entry (its reserved field), aligned,
        // which the kernel only reads; the release store orders the entries' writes
        // before it.
        unsafe {
            let tail = types::BufRingEntry::tail(self.entries) as *mut u16;
            std::sync::atomic::AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
    }
}

/// The descriptors a waiting ring watches, and whether each watch is armed.
#[derive(Clone, Copy)]
struct Watched {
    epoll: RawFd,
    eventfd: RawFd,
    epoll_armed: bool,
    eventfd_armed: bool,
}

/// Marks completions the loop ignores (cancellations' own answers).
const CANCEL_TAG: u64 = 1 << 63;
/// Marks a receive's completion; the rest is the reactor's token for its socket.
const RECEIVE_TAG: u64 = 1 << 62;
/// Marks a watch's completion: the epoll's, or (with `EVENTFD_WATCH`) the eventfd's.
const WATCH_TAG: u64 = 1 << 61;
const EVENTFD_WATCH: u64 = 1;

/// Threads whose replies go through a ring, threads that wait on one, and why the last
/// one that could not set one up, or gave one up, did so (INFO server).
static THREADS_ON_RING: AtomicUsize = AtomicUsize::new(0);
static THREADS_WAITING: AtomicUsize = AtomicUsize::new(0);
static THREADS_RECEIVING_MANY: AtomicUsize = AtomicUsize::new(0);
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
        .setup_cqsize(COMPLETION_ENTRIES)
        .build(RING_ENTRIES);
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

/// Makes the thread's ring what its loop waits on, watching `epoll` and `eventfd` (the
/// loop's), and the way its plain sockets are read. False, with nothing changed, if the
/// thread has no ring or the kernel lacks what the wait needs (a timeout on the wait,
/// `IORING_FEAT_EXT_ARG`, or non-dropping completions).
pub fn wait_on_ring(epoll: RawFd, eventfd: RawFd) -> bool {
    let able = BATCH.with(|b| {
        b.borrow().as_ref().is_some_and(|batch| {
            let p = batch.ring.params();
            p.is_feature_ext_arg() && p.is_feature_nodrop()
        })
    });
    if !able {
        if enabled() {
            record_error(
                "this kernel's io_uring cannot wait with a timeout; the loop waits on epoll",
            );
        }
        return false;
    }
    WAITS.with(|w| {
        w.set(Some(Watched {
            epoll,
            eventfd,
            epoll_armed: false,
            eventfd_armed: false,
        }))
    });
    reactor::read_through_ring(true);
    THREADS_WAITING.fetch_add(1, Ordering::Relaxed);
    let provided = BATCH.with(|b| {
        b.borrow()
            .as_ref()
            .map(|batch| Provided::register(&batch.ring))
    });
    match provided {
        Some(Ok(provided)) => {
            PROVIDED.with(|p| *p.borrow_mut() = Some(provided));
            reactor::receive_many(true);
            THREADS_RECEIVING_MANY.fetch_add(1, Ordering::Relaxed);
        }
        Some(Err(e)) => {
            tracing::info!("One receive per wait on this thread's ring ({e})");
        }
        None => {}
    }
    true
}

/// The kernel refused a multishot receive: this thread arms one receive per wait now.
pub(crate) fn multishot_refused() {
    tracing::info!("This kernel refused a multishot receive; one receive per wait from now on");
    THREADS_RECEIVING_MANY.fetch_sub(1, Ordering::Relaxed);
}

/// How this thread's loop reads plain sockets, for INFO server: `multishot` where a
/// thread's ring receives into provided buffers, `single` where its ring arms one
/// receive per wait, `recv` where the loop reads them itself.
pub fn receives() -> &'static str {
    if THREADS_RECEIVING_MANY.load(Ordering::Relaxed) > 0 {
        "multishot"
    } else if THREADS_WAITING.load(Ordering::Relaxed) > 0 {
        "single"
    } else {
        "recv"
    }
}

/// Whether this thread's loop waits on its ring (it may give the ring up at run time).
pub fn waits() -> bool {
    WAITS.with(|w| w.get().is_some())
}

/// What INFO server reports: what the threads wait on (`multiplexing_api`), how replies
/// are sent, and why not through a ring if not.
pub fn describe() -> (&'static str, &'static str, String) {
    let waiting = THREADS_WAITING.load(Ordering::Relaxed) > 0;
    let on = THREADS_ON_RING.load(Ordering::Relaxed) > 0;
    let err = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()).clone();
    (
        if waiting { "io_uring" } else { "epoll" },
        if on { "io_uring" } else { "write" },
        err,
    )
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

/// How a submission waits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Submits only.
    No,
    /// Also takes the completions that are ready (receives whose bytes came), without
    /// waiting.
    Look,
    /// Waits for one completion beyond the sends, or this many milliseconds (-1: no
    /// limit).
    For(i32),
}

/// Sends every waiting connection's replies, and arms the receives asked for: one
/// `io_uring_enter` per 256 connections. Called wherever waiting would reorder output.
/// Never re-entered: nothing it calls runs a task.
pub fn flush() {
    run(Wait::No);
}

/// Like `flush`, and takes the receives that have completed (the busy-script hook, which
/// must see bytes that came for connections the loop reads).
pub fn look() {
    run(Wait::Look);
}

/// The pass's one `io_uring_enter` on a thread whose loop waits on its ring: sends the
/// pass's replies, arms the receives asked for, and waits for the next completion, at
/// most `timeout_ms` (-1: no limit; 0: does not wait). True when the epoll has events
/// (`epoll_wait(0)` is due).
pub fn pass(timeout_ms: i32) -> bool {
    run(if timeout_ms == 0 {
        Wait::Look
    } else {
        Wait::For(timeout_ms)
    });
    EPOLL_DUE.with(|d| d.replace(false))
}

/// Cancels the receive armed on a socket that is leaving the thread (`token`'s), and
/// takes its completion, so no ring but this one has ever read the socket once it goes.
/// The socket's slot says whether that worked (it is no longer armed).
pub(crate) fn cancel_receive_now(token: reactor::Token) {
    BATCH.with(|b| {
        let Ok(mut guard) = b.try_borrow_mut() else {
            return;
        };
        let Some(batch) = guard.as_mut() else {
            return;
        };
        let cancel = opcode::AsyncCancel::new(RECEIVE_TAG | token)
            .build()
            .user_data(CANCEL_TAG);
        // SAFETY: a cancellation carries no buffer; the queue is empty between calls.
        if unsafe { batch.ring.submission().push(&cancel) }.is_err() {
            return;
        }
        for _ in 0..ENTER_RETRIES {
            if enter(&mut batch.ring, Wait::For(CANCEL_WAIT_MS), 0).is_err() {
                return;
            }
            reap(&mut batch.ring, &[], None);
            if !reactor::is_armed(token) {
                return;
            }
        }
    });
}

fn run(wait: Wait) {
    BATCH.with(|b| {
        let Ok(mut guard) = b.try_borrow_mut() else {
            return;
        };
        let Some(batch) = guard.as_mut() else {
            return;
        };
        let waits = waits();
        if batch.waiting.is_empty() && wait == Wait::No && !reactor::receives_asked() {
            return;
        }
        let mut waiting = std::mem::take(&mut batch.waiting);
        let mut healthy = !waits || arm(&mut batch.ring);
        {
            let mut sends: &[Rc<Stream>] = &waiting;
            loop {
                let n = sends.len().min(ENTRIES as usize);
                let (now, later) = sends.split_at(n);
                let this_wait = if later.is_empty() { wait } else { Wait::No };
                if healthy {
                    healthy = submit(&mut batch.ring, now, this_wait);
                } else {
                    // Never handed to the kernel: the connections send them themselves.
                    for s in now {
                        s.in_batch.set(false);
                        stall(s);
                    }
                }
                sends = later;
                if sends.is_empty() {
                    break;
                }
            }
        }
        // Dropping the list lets go of connections that closed while their replies
        // waited: their sockets close now, after the replies.
        waiting.clear();
        batch.waiting = waiting;
        if !healthy {
            give_up(&mut guard);
        }
    })
}

/// Queues the watches that are not armed and the receives readers asked for, entering
/// the ring whenever a chunk of sends would no longer fit beside them. False if the ring
/// failed.
fn arm(ring: &mut IoUring) -> bool {
    let mut healthy = true;
    WAITS.with(|w| {
        let Some(mut watched) = w.get() else {
            return;
        };
        let mut sq = ring.submission();
        if !watched.epoll_armed {
            let entry = opcode::PollAdd::new(types::Fd(watched.epoll), libc::POLLIN as u32)
                .multi(true)
                .build()
                .user_data(WATCH_TAG);
            // SAFETY: a poll carries no buffer; the queue has room (it is empty here).
            if unsafe { sq.push(&entry) }.is_ok() {
                watched.epoll_armed = true;
                // Events may have come while nothing watched: look once.
                EPOLL_DUE.with(|d| d.set(true));
            }
        }
        if !watched.eventfd_armed {
            let entry = opcode::PollAdd::new(types::Fd(watched.eventfd), libc::POLLIN as u32)
                .multi(true)
                .build()
                .user_data(WATCH_TAG | EVENTFD_WATCH);
            // SAFETY: as above.
            if unsafe { sq.push(&entry) }.is_ok() {
                watched.eventfd_armed = true;
            }
        }
        w.set(Some(watched));
    });
    let armed = reactor::receives_to_arm(&mut |entry, token| {
        if !healthy {
            // The ring failed on an earlier chunk: this receive never reaches it.
            reactor::received(token, -libc::ECANCELED, false, &[]);
            return;
        }
        if ring.submission().len() >= (RING_ENTRIES - ENTRIES) as usize {
            healthy = enter(ring, Wait::No, 0).is_ok();
            reap(ring, &[], None);
        }
        let entry = entry.user_data(RECEIVE_TAG | token);
        // SAFETY: the reactor keeps the receive's buffer untouched until its completion
        // (`received`), which the ring gives even if cancelled, and for ever if a ring
        // that failed never gives it (`reactor::leave_ring`). There is room: see above.
        if !healthy || unsafe { ring.submission().push(&entry) }.is_err() {
            healthy = false;
            reactor::received(token, -libc::ECANCELED, false, &[]);
        }
    });
    if armed > 0 {
        super::count(|c| c.read_ahead_batches += 1);
    }
    reactor::receives_to_cancel(&mut |token| {
        if !healthy {
            return;
        }
        if ring.submission().len() >= (RING_ENTRIES - ENTRIES) as usize {
            healthy = enter(ring, Wait::No, 0).is_ok();
            reap(ring, &[], None);
        }
        let cancel = opcode::AsyncCancel::new(RECEIVE_TAG | token)
            .build()
            .user_data(CANCEL_TAG);
        // SAFETY: a cancellation carries no buffer. There is room: see above.
        if healthy && unsafe { ring.submission().push(&cancel) }.is_err() {
            healthy = false;
        }
    });
    healthy
}

/// Takes every completion ready: a send's goes to `answers` (its index among `sends`),
/// a receive's to the reactor, a watch's sets what the loop must look at.
fn reap(ring: &mut IoUring, sends: &[Rc<Stream>], mut answers: Option<&mut Answers>) {
    loop {
        let mut given_back = false;
        for cqe in ring.completion() {
            let tag = cqe.user_data();
            let result = cqe.result();
            if tag & CANCEL_TAG != 0 {
                continue;
            }
            if tag & RECEIVE_TAG != 0 {
                let flags = cqe.flags();
                let token = tag & !RECEIVE_TAG;
                let more = cqueue::more(flags);
                match cqueue::buffer_select(flags) {
                    Some(bid) => PROVIDED.with(|p| {
                        let mut p = p.borrow_mut();
                        match p.as_mut() {
                            Some(provided) => {
                                let len = result.max(0) as usize;
                                reactor::received(token, result, more, provided.bytes(bid, len));
                                provided.give_back(bid);
                                given_back = true;
                            }
                            None => reactor::received(token, result, more, &[]),
                        }
                    }),
                    None => reactor::received(token, result, more, &[]),
                }
            } else if tag & WATCH_TAG != 0 {
                watched(tag, result, cqueue::more(cqe.flags()));
            } else if let Some(answers) = answers.as_deref_mut() {
                answers.take(tag, result, sends);
            }
        }
        if given_back {
            PROVIDED.with(|p| {
                if let Some(provided) = p.borrow().as_ref() {
                    provided.publish();
                }
            });
        }
        // Completions the queue had no room for wait in the kernel: one more enter
        // brings them.
        if !ring.submission().cq_overflow() || enter(ring, Wait::Look, 0).is_err() {
            return;
        }
    }
}

/// A watch fired (or ended: it is armed again on the next pass).
fn watched(tag: u64, result: i32, more: bool) {
    WAITS.with(|w| {
        let Some(mut watched) = w.get() else {
            return;
        };
        if tag & EVENTFD_WATCH != 0 {
            if result > 0 {
                let mut sink = 0u64;
                // SAFETY: reads 8 bytes into a live u64 (resets the eventfd).
                unsafe { libc::read(watched.eventfd, (&mut sink as *mut u64).cast(), 8) };
            }
            watched.eventfd_armed &= more;
        } else {
            EPOLL_DUE.with(|d| d.set(true));
            watched.epoll_armed &= more;
        }
        w.set(Some(watched));
    });
}

/// One `io_uring_enter` for `sends` (at most the ring's chunk) and whatever else is
/// queued, waiting as `wait` says; false if the ring is to be given up (every
/// connection has then been told what became of its bytes).
fn submit(ring: &mut IoUring, sends: &[Rc<Stream>], wait: Wait) -> bool {
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
            // and the list holds the connection. A chunk of sends fits beside what
            // `arm` queued; should it not, nothing of the chunk is submitted (the ring
            // is given up with the entries still queued) and each connection sends
            // its bytes itself.
            if unsafe { sq.push(&entry) }.is_err() {
                drop(unsent);
                drop(sq);
                for s in sends {
                    stall(s);
                }
                return false;
            }
            pushed.set(i);
            expected += 1;
        }
    }
    if wait == Wait::No && ring.submission().is_empty() {
        return true;
    }
    // Submit (and wait). Nothing reached the kernel if this fails (the entries stay
    // queued, and `give_up` drops the ring without entering it again), so the
    // connections send for themselves.
    if let Err(e) = enter(ring, wait, expected) {
        tracing::warn!("io_uring_enter failed: {e}");
        for s in sends {
            stall(s);
        }
        return false;
    }
    let mut answers = Answers {
        sent: Bits::default(),
        left: expected,
    };
    reap(ring, sends, Some(&mut answers));
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
    // This kernel parked a send instead of completing it in the call: cancel what is
    // missing, wait for every answer, and stop using the ring.
    let missing: Vec<u64> = (0..sends.len())
        .filter(|&i| pushed.has(i) && !answers.sent.has(i))
        .map(|i| i as u64)
        .collect();
    let give_up = |answers: &Answers| {
        tracing::warn!("io_uring_enter failed while cancelling parked sends");
        for i in (0..sends.len()).filter(|&i| pushed.has(i) && !answers.sent.has(i)) {
            abandon(&sends[i]);
        }
    };
    for &tag in &missing {
        let cancel = opcode::AsyncCancel::new(tag)
            .build()
            .user_data(CANCEL_TAG | tag);
        // SAFETY: a cancellation carries no buffer. Entries the kernel did not take yet
        // may still fill the queue: submitting makes room (they complete as above).
        while unsafe { ring.submission().push(&cancel) }.is_err() {
            if enter(ring, Wait::No, 0).is_err() {
                give_up(&answers);
                return false;
            }
        }
    }
    for _ in 0..ENTER_RETRIES {
        if answers.left == 0 {
            return false;
        }
        if enter(ring, Wait::For(CANCEL_WAIT_MS), 0).is_err() {
            break;
        }
        reap(ring, sends, Some(&mut answers));
    }
    if answers.left > 0 {
        give_up(&answers);
    }
    false
}

/// Which sends of one `submit` have had their completion, and how many have not.
struct Answers {
    sent: Bits,
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
    /// Applies one completion to its send (once: a late duplicate is ignored).
    fn take(&mut self, tag: u64, result: i32, sends: &[Rc<Stream>]) {
        let i = tag as usize;
        if i < sends.len() && !self.sent.has(i) {
            self.sent.set(i);
            self.left -= 1;
            sent(&sends[i], result);
        }
    }
}

/// `io_uring_enter` submitting what is queued and waiting as `wait` says, `sends` being
/// the completions that come inside the call before the wait starts; retries the errors
/// that mean "try again". A wait that ends by its timeout or a signal is not an error.
fn enter(ring: &mut IoUring, wait: Wait, sends: usize) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        let queued = ring.submission().len();
        let result = match wait {
            Wait::No => ring.submit().map(|_| ()),
            // SAFETY: no argument is passed, so none is read.
            Wait::Look => unsafe {
                ring.submitter()
                    .enter::<libc::sigset_t>(queued as u32, 0, GETEVENTS, None)
                    .map(|_| ())
            },
            Wait::For(ms) if ms < 0 => ring.submit_and_wait(sends + 1).map(|_| ()),
            Wait::For(ms) => {
                let ts = types::Timespec::new()
                    .sec(ms as u64 / 1000)
                    .nsec((ms as u32 % 1000) * 1_000_000);
                let args = types::SubmitArgs::new().timespec(&ts);
                ring.submitter()
                    .submit_with_args(sends + 1, &args)
                    .map(|_| ())
            }
        };
        match result {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR)) => {
                // The wait ended; what was queued was taken unless the queue says not.
                if ring.submission().is_empty() {
                    return Ok(());
                }
                tries += 1;
            }
            Err(e)
                if tries < ENTER_RETRIES
                    && matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) =>
            {
                tries += 1;
            }
            Err(e) => return Err(e),
            // The kernel took less than all (it then does not wait): enter again.
            Ok(()) if !ring.submission().is_empty() => tries += 1,
            Ok(()) => return Ok(()),
        }
        if tries > ENTER_RETRIES {
            return Err(std::io::Error::other(
                "io_uring_enter kept being interrupted",
            ));
        }
    }
}

/// The ring failed (or parked a send): every receive armed in it is cancelled where the
/// ring still answers, the thread's sockets go back to epoll, its eventfd back into the
/// epoll, and the ring is dropped.
fn give_up(guard: &mut std::cell::RefMut<'_, Option<Batch>>) {
    tracing::warn!("io_uring stopped working on this thread; it waits on epoll, and writes and reads sockets one by one from now on");
    record_error("io_uring failed at run time (see the log)");
    // Entries still queued (a failed submission) would go with any further enter, sends
    // included, which their connections now send themselves: so the ring is entered
    // again only if its queue is empty.
    if let Some(batch) = guard
        .as_mut()
        .filter(|b| unsafe { b.ring.submission_shared() }.is_empty())
    {
        let armed = reactor::armed_receives();
        let mut cancelled = true;
        for token in &armed {
            let cancel = opcode::AsyncCancel::new(RECEIVE_TAG | token)
                .build()
                .user_data(CANCEL_TAG);
            // SAFETY: a cancellation carries no buffer.
            while unsafe { batch.ring.submission().push(&cancel) }.is_err() {
                if enter(&mut batch.ring, Wait::No, 0).is_err() {
                    cancelled = false;
                    break;
                }
                reap(&mut batch.ring, &[], None);
            }
        }
        for _ in 0..ENTER_RETRIES {
            if !cancelled || reactor::armed_receives().is_empty() {
                break;
            }
            if enter(&mut batch.ring, Wait::For(CANCEL_WAIT_MS), 0).is_err() {
                break;
            }
            reap(&mut batch.ring, &[], None);
        }
    }
    if reactor::receives_many() {
        THREADS_RECEIVING_MANY.fetch_sub(1, Ordering::Relaxed);
    }
    // What is still armed keeps its buffer for ever and breaks its connection.
    reactor::leave_ring();
    if let Some(watched) = WAITS.with(|w| w.take()) {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: reactor::EVENTFD_TOKEN,
        };
        // SAFETY: both descriptors are the loop's, open for the thread's life.
        unsafe { libc::epoll_ctl(watched.epoll, libc::EPOLL_CTL_ADD, watched.eventfd, &mut ev) };
        THREADS_WAITING.fetch_sub(1, Ordering::Relaxed);
    }
    guard.take();
    ON.with(|on| on.set(false));
    THREADS_ON_RING.fetch_sub(1, Ordering::Relaxed);
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
