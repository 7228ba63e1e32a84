//! The thread's epoll and the sockets registered with it. Owns readiness: which socket
//! may be read or written without waiting, and whom to wake when that changes. Never
//! reads or writes a socket itself (the callers of `try_io` do), and never touches the
//! ring (`uring` submits what this module asks for and hands back the completions).
//!
//! Registration is edge-triggered: the kernel reports a change once, the socket keeps it
//! as readiness, and the reader clears it when a read would block. Each registration's
//! event token is the address of its `IoSlot`, kept alive (one `Rc` count) until the
//! socket leaves the epoll and no receive of the ring still names it. A socket leaves
//! only while a task runs, never while a batch of events is being handed out, and the
//! kernel reports nothing for it after `EPOLL_CTL_DEL`, so no token of a freed slot is
//! ever read.
//!
//! Reads through the ring (docs/event-loop.md, "Reads and the wait through io_uring"):
//! on a thread whose ring waits, a plain connection's socket is read by a receive the
//! loop arms when its reader finds nothing to take, into a buffer the slot keeps
//! (`ahead`). The completion fills the buffer and wakes the reader, which takes those
//! bytes before it reads the socket itself, and so must anything else that reads it (the
//! busy-script hook, through `take_read_ahead`; a migrating connection, through
//! `Socket::into_std`), so bytes never change order. Nothing reads a socket whose receive
//! is armed. Where the ring has provided buffers (`receive_many`), the receive is
//! multishot: it stays armed across requests, each completion's bytes are copied from
//! the ring's buffer to the end of `ahead`, and the reader takes them while it stays
//! armed. Otherwise it is one receive into `ahead`'s spare room, which is not touched
//! until its completion.

use bytes::BytesMut;
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// The eventfd's token (no slot lives at address 0).
pub(crate) const EVENTFD_TOKEN: u64 = 0;

const READABLE: u8 = 1;
const WRITABLE: u8 = 2;
/// The peer closed its side (or the socket failed): reads stay ready, since the edge
/// that said so will not come again and the next read must see the end.
const READ_CLOSED: u8 = 4;
/// The socket hung up or failed: writes stay ready, to see the error.
const WRITE_CLOSED: u8 = 8;

/// Bytes one receive of the ring takes at most; more stay in the kernel, for the reader
/// to take itself (bounded memory, and the kernel's flow control still applies).
const AHEAD_ROOM: usize = 16 * 1024;

/// `IORING_RECVSEND_POLL_FIRST`: a receive is armed only after its socket was found
/// empty, so the kernel waits for bytes before it tries.
const RECV_POLL_FIRST: u16 = 1;

/// The ring's provided-buffer group that multishot receives take their buffers from.
pub(crate) const RECEIVE_GROUP: u16 = 0;

/// Bytes of each of the ring's provided buffers: a completion that fills one is a large
/// request's, whose rest the reader reads itself.
pub(crate) const RECEIVE_BUFFER: usize = AHEAD_ROOM;

/// Bytes a multishot receive may pile up in `ahead` before it is cancelled. Its reader
/// is busy (a long pipeline, a client that does not read its replies): past this, the
/// bytes stay in the socket, where the kernel's flow control holds the client back,
/// and the reader reads them itself when it comes to them.
const AHEAD_LIMIT: usize = 4 * AHEAD_ROOM;

/// Epoll events a socket read through the ring is registered for: writability only (a
/// send cut short waits for it), so arriving bytes cost no epoll event.
const RING_READ_EVENTS: u32 = (libc::EPOLLOUT | libc::EPOLLET) as u32;
const ALL_EVENTS: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

thread_local! {
    static EPOLL: Cell<RawFd> = const { Cell::new(-1) };
    /// Plain sockets registered from now on are read through the thread's ring.
    static RING_READS: Cell<bool> = const { Cell::new(false) };
    /// The sockets read through the ring (or read ahead), by descriptor, for the
    /// busy-script hook, which knows a connection by its descriptor only (set once per
    /// connection, not per read), and for leaving the ring.
    static BY_FD: RefCell<Vec<Option<Rc<IoSlot>>>> = const { RefCell::new(Vec::new()) };
    /// Sockets whose reader asked for a receive, for the pass's `io_uring_enter`.
    static TO_ARM: RefCell<Vec<Rc<IoSlot>>> = const { RefCell::new(Vec::new()) };
    /// Receives are multishot, into the ring's provided buffers (`uring` registered them).
    static MULTISHOT: Cell<bool> = const { Cell::new(false) };
    /// Sockets whose multishot receive is to be cancelled by the next pass: its reader
    /// fell behind (`AHEAD_LIMIT`), or a completion filled a whole buffer (a large
    /// request, which the reader reads faster itself, with no copy).
    static TO_CANCEL: RefCell<Vec<Rc<IoSlot>>> = const { RefCell::new(Vec::new()) };
    /// Sockets whose read-ahead went from empty to holding bytes since `hint_fresh` last
    /// ran (in a pass's wait, or in the busy-script hook's reaping): what each holds is
    /// where a request starts (unless its reader holds the start of one), and
    /// `hint_fresh` shows those bytes to the worker before any reader runs.
    static FRESH: RefCell<Vec<Rc<IoSlot>>> = const { RefCell::new(Vec::new()) };
}

/// How many fresh requests `hint_fresh` shows at a time.
const HINT_BATCH: usize = 16;

pub(super) fn set_epoll(fd: RawFd) {
    EPOLL.with(|e| e.set(fd));
}

/// From now on, plain sockets of this thread are read through its ring (`uring` says so
/// once its ring waits for the thread).
pub(crate) fn read_through_ring(on: bool) {
    RING_READS.with(|r| r.set(on));
}

/// From now on, receives armed on this thread are multishot, into the ring's provided
/// buffers (`RECEIVE_GROUP`); off again if the kernel refuses one.
pub(crate) fn receive_many(on: bool) {
    MULTISHOT.with(|m| m.set(on));
}

/// Whether this thread's receives are multishot.
pub(crate) fn receives_many() -> bool {
    MULTISHOT.with(|m| m.get())
}

/// What a caller waits for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Interest {
    Readable,
    Writable,
}

impl Interest {
    fn bit(self) -> u8 {
        match self {
            Interest::Readable => READABLE,
            Interest::Writable => WRITABLE,
        }
    }
}

#[derive(Default)]
struct IoSlot {
    ready: Cell<u8>,
    reader: RefCell<Option<Waker>>,
    writer: RefCell<Option<Waker>>,
    fd: Cell<RawFd>,
    /// A plain connection's socket, read only through `Socket::read_plain` (and the
    /// hook, through `take_read_ahead`): the loop may read it for its reader.
    read_ahead: Cell<bool>,
    /// Read through the ring: its reader asks for receives instead of waiting for epoll.
    on_ring: Cell<bool>,
    /// A receive is in the kernel: nothing else may read the socket until its (last)
    /// completion, nor touch `ahead` unless the receive is multishot.
    armed: Cell<bool>,
    /// The armed receive is multishot: it writes into the ring's buffers, not `ahead`,
    /// and ends only with a completion without `IORING_CQE_F_MORE`.
    armed_many: Cell<bool>,
    /// Listed in `TO_CANCEL`.
    cancel_asked: Cell<bool>,
    /// Listed in `TO_ARM`.
    arm_asked: Cell<bool>,
    /// Bytes the armed receive may write.
    armed_len: Cell<u32>,
    /// The socket was dropped with a receive armed: the completion frees the slot.
    leaving: Cell<bool>,
    /// Bytes read by the loop, in order, before anything still in the socket.
    ahead: RefCell<BytesMut>,
    /// A receive's buffer was left with the kernel (a ring that failed mid-read): the
    /// byte stream has a hole, so the connection must end.
    broken: Cell<bool>,
}

impl IoSlot {
    /// Whether the kernel may be writing into `ahead` now.
    fn ahead_lent(&self) -> bool {
        self.armed.get() && !self.armed_many.get()
    }

    fn holds_ahead(&self) -> bool {
        self.read_ahead.get()
            && !self.ahead_lent()
            && (!self.ahead.borrow().is_empty() || self.broken.get())
    }

    /// Moves the bytes read ahead to the end of `buf`; how many.
    fn take_ahead(&self, buf: &mut BytesMut) -> usize {
        if self.ahead_lent() {
            return 0;
        }
        let mut ahead = self.ahead.borrow_mut();
        let n = ahead.len();
        if n == 0 {
            return 0;
        }
        if buf.is_empty() && buf.capacity() <= ahead.capacity() {
            // The usual case (the reader parsed all it had): the two buffers change
            // places, so the bytes are not copied and neither allocation is lost. (A
            // reader's larger buffer, reserved for a large request, stays with it.)
            std::mem::swap(&mut *ahead, buf);
        } else {
            buf.extend_from_slice(&ahead);
            ahead.clear();
        }
        // A burst a multishot receive brought in for a busy reader (up to the provided
        // buffers' worth in one wait) does not stay with the connection for its life.
        if ahead.capacity() > AHEAD_LIMIT {
            *ahead = BytesMut::new();
        }
        n
    }

    fn wake_reader(&self) {
        if let Some(w) = self.reader.borrow_mut().take() {
            w.wake();
        }
    }
}

/// Hands one event to its socket: sets its readiness and wakes who waits for it.
pub(super) fn dispatch(token: u64, events: u32) {
    // SAFETY: the token is the address of an `IoSlot` whose registration holds one `Rc`
    // count until it leaves the epoll, which happens only between event batches.
    let slot = unsafe { &*(token as usize as *const IoSlot) };
    let mut bits = 0;
    let hangup = (libc::EPOLLHUP | libc::EPOLLERR) as u32;
    if events & (libc::EPOLLIN as u32 | libc::EPOLLRDHUP as u32 | hangup) != 0 {
        bits |= READABLE;
    }
    if events & (libc::EPOLLOUT as u32 | hangup) != 0 {
        bits |= WRITABLE;
    }
    if events & (libc::EPOLLRDHUP as u32 | hangup) != 0 {
        bits |= READ_CLOSED;
    }
    if events & hangup != 0 {
        bits |= WRITE_CLOSED;
    }
    if slot.on_ring.get() {
        // Its receive reports the end or the error itself; a read of the socket now
        // could race that receive for bytes.
        bits &= WRITABLE | WRITE_CLOSED;
    }
    slot.ready.set(slot.ready.get() | bits);
    if bits & WRITABLE != 0 {
        if let Some(w) = slot.writer.borrow_mut().take() {
            w.wake();
        }
    }
    if bits & READABLE != 0 {
        slot.wake_reader();
    }
}

/// The user data that names a slot's receive in the ring.
pub(crate) type Token = u64;

/// Builds a receive for every socket whose reader asked for one since the last pass, and
/// hands each to `push` with its token. Called by `uring` while it fills the pass's
/// submission; the buffers stay untouched until `received` (or for ever if the ring
/// fails to give one back: `leave_ring`).
pub(crate) fn receives_to_arm(push: &mut dyn FnMut(io_uring::squeue::Entry, Token)) -> usize {
    let asked = TO_ARM.with(|t| std::mem::take(&mut *t.borrow_mut()));
    let many = receives_many();
    let mut armed = 0;
    for slot in &asked {
        slot.arm_asked.set(false);
        if !slot.on_ring.get()
            || slot.leaving.get()
            || slot.armed.get()
            || slot.broken.get()
            || !slot.ahead.borrow().is_empty()
            || slot.ready.get() & READABLE != 0
        {
            continue;
        }
        let token = Rc::as_ptr(slot) as usize as Token;
        if many {
            let entry =
                io_uring::opcode::RecvMulti::new(io_uring::types::Fd(slot.fd.get()), RECEIVE_GROUP)
                    .build();
            slot.armed.set(true);
            slot.armed_many.set(true);
            push(entry, token);
            armed += 1;
            continue;
        }
        let (buf, room) = {
            let mut ahead = slot.ahead.borrow_mut();
            if ahead.capacity() < 1024 {
                ahead.reserve(AHEAD_ROOM);
            }
            let spare = ahead.spare_capacity_mut();
            (
                spare.as_mut_ptr().cast::<u8>(),
                spare.len().min(AHEAD_ROOM) as u32,
            )
        };
        let entry = io_uring::opcode::Recv::new(io_uring::types::Fd(slot.fd.get()), buf, room)
            .ioprio(RECV_POLL_FIRST)
            .build();
        slot.armed.set(true);
        slot.armed_len.set(room);
        push(entry, token);
        armed += 1;
    }
    // The list's allocation is kept for the next pass.
    TO_ARM.with(|t| {
        let mut t = t.borrow_mut();
        if t.is_empty() {
            let mut asked = asked;
            asked.clear();
            *t = asked;
        }
    });
    armed
}

/// Applies a receive's completion (`result`: bytes, or a negative errno) to its socket.
/// A multishot receive's completion brings its bytes in `data` (in the ring's buffer,
/// given back once this returns), and says with `more` whether the receive stays armed.
pub(crate) fn received(token: Token, result: i32, more: bool, data: &[u8]) {
    // SAFETY: an armed receive's slot holds one `Rc` count (its registration's, or, once
    // the socket was dropped, one kept for this completion) until its last completion
    // returns.
    let slot = unsafe { &*(token as usize as *const IoSlot) };
    let many = slot.armed_many.get();
    let ended = !(many && more);
    if ended {
        slot.armed.set(false);
        slot.armed_many.set(false);
        slot.cancel_asked.set(false);
    }
    if slot.leaving.get() {
        if ended {
            // SAFETY: the count the dropped socket left for this completion.
            drop(unsafe { Rc::from_raw(token as usize as *const IoSlot) });
        }
        return;
    }
    if many && ended && result == -libc::EINVAL {
        // This kernel takes provided buffers but not multishot receives: one receive per
        // wait from now on (the woken reader asks for it).
        if receives_many() {
            receive_many(false);
            crate::net::uring::multishot_refused();
        }
    } else if result > 0 {
        let mut ahead = slot.ahead.borrow_mut();
        if ahead.is_empty() {
            note_fresh(slot);
        }
        if many {
            if data.len() != result as usize {
                // Bytes the kernel took without handing them over: the stream has a hole.
                slot.broken.set(true);
            }
            ahead.extend_from_slice(data);
            if more && (ahead.len() >= AHEAD_LIMIT || data.len() >= RECEIVE_BUFFER) {
                ask_cancel(slot);
            }
        } else {
            let len = ahead.len() + result as usize;
            // SAFETY: the kernel wrote `result` bytes at the start of the spare capacity
            // it was given, which nothing touched meanwhile.
            unsafe { ahead.set_len(len) };
        }
        drop(ahead);
        if (!many && result as u32 >= slot.armed_len.get()) || (many && ended) {
            // More may wait: the reader reads the rest itself, into its own buffer.
            slot.ready.set(slot.ready.get() | READABLE);
        }
        crate::net::count(|c| c.reads_ahead += 1);
    } else if result == 0
        || !matches!(
            -result,
            libc::ECANCELED | libc::EAGAIN | libc::EINTR | libc::ENOBUFS | libc::ENOMEM
        )
    {
        // The end of the stream, or an error (reported once): the reader's own read
        // finds the end and closes.
        slot.ready.set(slot.ready.get() | READABLE | READ_CLOSED);
    } else if many {
        // Cancelled (its reader fell behind), or out of buffers: what is left stays in
        // the socket, for the reader to read itself before it asks for a receive again.
        slot.ready.set(slot.ready.get() | READABLE);
    }
    // Otherwise nothing was read and nothing is wrong with the socket: the woken reader
    // finds nothing to take and asks for another receive.
    slot.wake_reader();
}

fn ask_cancel(slot: &IoSlot) {
    if slot.cancel_asked.replace(true) {
        return;
    }
    // SAFETY: `slot` is a live slot's, reached through its token: one more count for the
    // list, given back when the list is taken.
    let rc = unsafe {
        let ptr = slot as *const IoSlot;
        Rc::increment_strong_count(ptr);
        Rc::from_raw(ptr)
    };
    TO_CANCEL.with(|t| t.borrow_mut().push(rc));
}

/// The most sockets `FRESH` holds: the busy-script hook reaps completions and takes
/// their bytes while no pass runs, so a long script would otherwise grow the list for as
/// long as clients kept sending.
const FRESH_MAX: usize = 4 * HINT_BATCH;

fn note_fresh(slot: &IoSlot) {
    FRESH.with(|f| {
        let mut fresh = f.borrow_mut();
        if fresh.len() < FRESH_MAX {
            // SAFETY: as in `ask_cancel`: one more count, given back when the list is
            // taken.
            fresh.push(unsafe {
                let ptr = slot as *const IoSlot;
                Rc::increment_strong_count(ptr);
                Rc::from_raw(ptr)
            });
        }
    });
}

/// Shows `hint` the bytes that completions brought to empty read-ahead buffers since it
/// was last called, up to `HINT_BATCH` buffers at a time, before their readers run: with
/// one request per connection, this is the one look at a pass's requests together, so
/// the worker can start loading their keys at once rather than one miss per reader
/// (BENCHMARKS.md, "Prefetching across connections"). The bytes are only a hint: a
/// reader may hold the start of a request whose rest they are.
pub(crate) fn hint_fresh(hint: &mut dyn FnMut(&[&[u8]])) {
    let fresh = FRESH.with(|f| std::mem::take(&mut *f.borrow_mut()));
    if fresh.is_empty() {
        return;
    }
    for group in fresh.chunks(HINT_BATCH) {
        let held: [Option<std::cell::Ref<'_, BytesMut>>; HINT_BATCH] = std::array::from_fn(|i| {
            group
                .get(i)
                .filter(|slot| !slot.leaving.get())
                .and_then(|slot| slot.ahead.try_borrow().ok())
        });
        let mut requests: [&[u8]; HINT_BATCH] = [&[]; HINT_BATCH];
        let mut n = 0;
        for bytes in held.iter().flatten().filter(|b| !b.is_empty()) {
            requests[n] = &bytes[..];
            n += 1;
        }
        if n > 0 {
            hint(&requests[..n]);
        }
    }
    // The list's allocation is kept for the next pass.
    FRESH.with(|f| {
        let mut f = f.borrow_mut();
        if f.is_empty() {
            let mut fresh = fresh;
            fresh.clear();
            *f = fresh;
        }
    });
}

/// The tokens of the multishot receives to cancel, for the pass's `io_uring_enter`: those
/// still armed among the ones asked for.
pub(crate) fn receives_to_cancel(push: &mut dyn FnMut(Token)) {
    let asked = TO_CANCEL.with(|t| std::mem::take(&mut *t.borrow_mut()));
    for slot in &asked {
        if slot.armed_many.get() && slot.cancel_asked.get() && !slot.leaving.get() {
            push(Rc::as_ptr(slot) as usize as Token);
        }
    }
}

/// Whether any reader asked for a receive since the last submission.
pub(crate) fn receives_asked() -> bool {
    TO_ARM.with(|t| !t.borrow().is_empty())
}

/// Whether the receive `token` names is still in the kernel.
pub(crate) fn is_armed(token: Token) -> bool {
    // SAFETY: the caller holds the socket `token` names (`Socket::into_std`).
    unsafe { &*(token as usize as *const IoSlot) }.armed.get()
}

/// The tokens of every receive armed on this thread's sockets (to cancel them all).
pub(crate) fn armed_receives() -> Vec<Token> {
    BY_FD.with(|by_fd| {
        by_fd
            .borrow()
            .iter()
            .flatten()
            .filter(|s| s.armed.get())
            .map(|s| Rc::as_ptr(s) as usize as Token)
            .collect()
    })
}

/// The thread's ring is gone: its sockets go back to epoll, readable. A receive still
/// armed (one the kernel could not be made to give back) keeps its buffer for ever and
/// breaks its connection.
pub(crate) fn leave_ring() {
    read_through_ring(false);
    receive_many(false);
    TO_ARM.with(|t| t.borrow_mut().clear());
    TO_CANCEL.with(|t| t.borrow_mut().clear());
    let epoll = EPOLL.with(|e| e.get());
    BY_FD.with(|by_fd| {
        for slot in by_fd.borrow().iter().flatten() {
            if !slot.on_ring.replace(false) {
                continue;
            }
            slot.arm_asked.set(false);
            if slot.armed.replace(false) {
                if !slot.armed_many.replace(false) {
                    std::mem::forget(std::mem::take(&mut *slot.ahead.borrow_mut()));
                }
                slot.broken.set(true);
            }
            let mut ev = libc::epoll_event {
                events: ALL_EVENTS,
                u64: Rc::as_ptr(slot) as usize as u64,
            };
            // SAFETY: both descriptors are open while the slot is listed; `ev` lives
            // across the call.
            unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_MOD, slot.fd.get(), &mut ev) };
            slot.ready.set(slot.ready.get() | READABLE);
            slot.wake_reader();
        }
    });
}

/// Takes the bytes the loop read for the socket `fd`, appending them to `buf`, so a
/// reader that reads the socket by its descriptor (the busy-script hook) keeps their
/// order. `None` if the connection is broken; `Some(false)` if the loop's receive is
/// armed on it, so the caller must not read the socket itself (what comes arrives
/// through the ring: `uring::look`).
pub fn take_read_ahead(fd: RawFd, buf: &mut BytesMut) -> Option<bool> {
    BY_FD.with(|by_fd| {
        let by_fd = by_fd.borrow();
        let Some(Some(slot)) = by_fd.get(fd as usize) else {
            return Some(true);
        };
        if slot.broken.get() {
            return None;
        }
        slot.take_ahead(buf);
        Some(!slot.armed.get())
    })
}

/// A TCP socket registered with this thread's loop.
pub struct Socket {
    /// `None` only after `into_std` took it.
    tcp: Option<std::net::TcpStream>,
    slot: Rc<IoSlot>,
    epoll: RawFd,
}

impl Socket {
    /// Registers a (non-blocking) socket with this thread's loop.
    pub fn from_std(tcp: std::net::TcpStream) -> io::Result<Socket> {
        let epoll = EPOLL.with(|e| e.get());
        if epoll < 0 {
            return Err(io::Error::other("no Kite event loop on this thread"));
        }
        tcp.set_nonblocking(true)?;
        let slot = Rc::new(IoSlot::default());
        slot.fd.set(tcp.as_raw_fd());
        // Readable and writable until a try says otherwise: a connection handed over
        // with bytes already waiting, or one whose edge came before it was registered,
        // is read at once instead of waiting for an edge that will not come.
        slot.ready.set(READABLE | WRITABLE);
        let token = Rc::into_raw(slot.clone()) as usize as u64;
        let mut ev = libc::epoll_event {
            events: ALL_EVENTS,
            u64: token,
        };
        // SAFETY: both descriptors are open; `ev` lives across the call.
        if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, tcp.as_raw_fd(), &mut ev) } < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: the count taken above for the registration that failed.
            drop(unsafe { Rc::from_raw(token as usize as *const IoSlot) });
            return Err(e);
        }
        Ok(Socket {
            tcp: Some(tcp),
            slot,
            epoll,
        })
    }

    fn tcp(&self) -> &std::net::TcpStream {
        self.tcp.as_ref().expect("a socket in use")
    }

    /// Ready for `interest`, or registers the caller to be woken when it is. A reader
    /// of a socket read through the ring that finds nothing asks for a receive.
    #[inline]
    pub fn poll_ready(&self, interest: Interest, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let slot = &*self.slot;
        if slot.ready.get() & interest.bit() != 0
            || (interest == Interest::Readable && slot.holds_ahead())
        {
            return super::poll_budget(cx).map(Ok);
        }
        let mut waiter = match interest {
            Interest::Readable => slot.reader.borrow_mut(),
            Interest::Writable => slot.writer.borrow_mut(),
        };
        if !waiter.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waiter = Some(cx.waker().clone());
        }
        if interest == Interest::Readable
            && slot.on_ring.get()
            && !slot.armed.get()
            && !slot.arm_asked.replace(true)
        {
            TO_ARM.with(|t| t.borrow_mut().push(self.slot.clone()));
        }
        Poll::Pending
    }

    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_ready(Interest::Readable, cx)
    }

    /// Lets the loop read this socket for its reader (through the ring, when the thread
    /// reads that way). Only for a socket read through `take_read_ahead_into` first,
    /// every time.
    pub fn allow_read_ahead(&self) {
        self.slot.read_ahead.set(true);
        if RING_READS.with(|r| r.get()) {
            let mut ev = libc::epoll_event {
                events: RING_READ_EVENTS,
                u64: Rc::as_ptr(&self.slot) as usize as u64,
            };
            // SAFETY: both descriptors are open; `ev` lives across the call.
            let ok = unsafe {
                libc::epoll_ctl(self.epoll, libc::EPOLL_CTL_MOD, self.as_raw_fd(), &mut ev)
            } == 0;
            // Should the change fail, the socket stays on epoll for its reads.
            self.slot.on_ring.set(ok);
        }
        let fd = self.slot.fd.get() as usize;
        BY_FD.with(|by_fd| {
            let mut by_fd = by_fd.borrow_mut();
            if by_fd.len() <= fd {
                by_fd.resize(fd + 1, None);
            }
            by_fd[fd] = Some(self.slot.clone());
        });
    }

    /// Moves what the loop read ahead to the end of `buf`: how many bytes. An error if
    /// the read-ahead left a hole in the stream.
    #[inline]
    pub fn take_read_ahead_into(&self, buf: &mut BytesMut) -> io::Result<usize> {
        if self.slot.ahead_lent()
            || (self.slot.ahead.borrow().is_empty() && !self.slot.broken.get())
        {
            return Ok(0);
        }
        if self.slot.broken.get() {
            return Err(io::Error::other(
                "a read-ahead failed; the connection is broken",
            ));
        }
        Ok(self.slot.take_ahead(buf))
    }

    pub async fn readable(&self) -> io::Result<()> {
        poll_fn(|cx| self.poll_ready(Interest::Readable, cx)).await
    }

    pub async fn writable(&self) -> io::Result<()> {
        poll_fn(|cx| self.poll_ready(Interest::Writable, cx)).await
    }

    /// Runs `f` (one non-blocking system call on the socket) if the socket is ready for
    /// `interest`; a `WouldBlock` from it clears that readiness until the next event.
    pub fn try_io<R>(
        &self,
        interest: Interest,
        f: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        let bit = interest.bit();
        if self.slot.ready.get() & bit == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let result = f();
        if matches!(&result, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            let closed = match interest {
                Interest::Readable => READ_CLOSED,
                Interest::Writable => WRITE_CLOSED,
            };
            if self.slot.ready.get() & closed == 0 {
                self.slot.ready.set(self.slot.ready.get() & !bit);
            }
        }
        result
    }

    /// Writes what the socket takes now.
    pub fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        let fd = self.as_raw_fd();
        self.try_io(Interest::Writable, || {
            // SAFETY: send reads at most data.len() bytes from data.
            let n = unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), libc::MSG_NOSIGNAL) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        })
    }

    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.tcp().peer_addr()
    }

    /// A read-ahead left a hole in this socket's input (`take_read_ahead_into` fails).
    pub fn is_broken(&self) -> bool {
        self.slot.broken.get()
    }

    /// Bytes of buffer kept for read-ahead.
    pub fn read_ahead_capacity(&self) -> usize {
        self.slot.ahead.borrow().capacity()
    }

    /// Leaves the loop and gives the socket back (a connection moving to another thread),
    /// with the bytes read ahead from it, which come before anything still in it. `None`
    /// (the socket dropped) if a receive armed on it could not be taken back, or the read
    /// left a hole in the stream.
    pub fn into_std(mut self) -> Option<(std::net::TcpStream, BytesMut)> {
        if self.slot.armed.get() {
            // Another thread's ring must not race this one for the socket's bytes:
            // cancel the receive and take what it read before letting go.
            crate::net::uring::cancel_receive_now(Rc::as_ptr(&self.slot) as usize as Token);
        }
        if self.slot.armed.get() || self.slot.broken.get() {
            return None;
        }
        let ahead = std::mem::take(&mut *self.slot.ahead.borrow_mut());
        self.deregister();
        Some((self.tcp.take().expect("a socket in use"), ahead))
    }

    fn deregister(&mut self) {
        if let Some(tcp) = &self.tcp {
            // SAFETY: both descriptors are open; DEL ignores the event argument.
            unsafe {
                libc::epoll_ctl(
                    self.epoll,
                    libc::EPOLL_CTL_DEL,
                    tcp.as_raw_fd(),
                    std::ptr::null_mut(),
                )
            };
            // Nothing reads this socket ahead from now on, and what was read dies with it.
            self.slot.on_ring.set(false);
            if self.slot.read_ahead.replace(false) {
                if !self.slot.ahead_lent() {
                    self.slot.ahead.borrow_mut().clear();
                }
                let fd = self.slot.fd.get() as usize;
                // Not while the thread's locals are being torn down (a socket dropped
                // then has nothing to unlist).
                let _ = BY_FD.try_with(|by_fd| {
                    if let Some(entry) = by_fd.borrow_mut().get_mut(fd) {
                        if entry.as_ref().is_some_and(|s| Rc::ptr_eq(s, &self.slot)) {
                            *entry = None;
                        }
                    }
                });
            }
            if self.slot.armed.get() {
                // The kernel still holds a receive into the slot's buffer: the slot
                // lives until its completion. Shutting the socket down completes it at
                // once (and tells the peer now, not when the ring next runs).
                self.slot.leaving.set(true);
                // SAFETY: shutdown on the socket's own open descriptor.
                unsafe { libc::shutdown(tcp.as_raw_fd(), libc::SHUT_RDWR) };
                return;
            }
            // SAFETY: the count `from_std` leaked for the registration, which just ended.
            drop(unsafe { Rc::from_raw(Rc::as_ptr(&self.slot)) });
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.tcp().as_raw_fd()
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        self.deregister();
    }
}
