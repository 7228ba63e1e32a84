//! The thread's epoll and the sockets registered with it. Owns readiness: which socket
//! may be read or written without waiting, and whom to wake when that changes. Never
//! reads or writes a socket itself (the callers of `try_io` do).
//!
//! Registration is edge-triggered: the kernel reports a change once, the socket keeps it
//! as readiness, and the reader clears it when a read would block. Each registration's
//! event token is the address of its `IoSlot`, kept alive (one `Rc` count) until the
//! socket leaves the epoll. A socket leaves only while a task runs, never while a
//! batch of events is being handed out, and the kernel reports nothing for it after
//! `EPOLL_CTL_DEL`, so no token of a freed slot is ever read.
//!
//! Read-ahead (docs/event-loop.md, "Reads of a pass in one system call"): a plain
//! connection's socket that an event reports readable is read by the loop itself, with
//! every other such socket, in one `io_uring_enter` (`uring::flush_and_recv`), into a buffer
//! the slot keeps (`ahead`). Its reader takes those bytes before it reads the socket
//! again, and so must anything else that reads it (the busy-script hook, through
//! `take_read_ahead`; a migrating connection, through `Socket::into_std`), so bytes never
//! change order.

use bytes::BytesMut;
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// The eventfd's token (no slot lives at address 0).
pub(super) const EVENTFD_TOKEN: u64 = 0;

const READABLE: u8 = 1;
const WRITABLE: u8 = 2;
/// The peer closed its side (or the socket failed): reads stay ready, since the edge
/// that said so will not come again and the next read must see the end.
const READ_CLOSED: u8 = 4;
/// The socket hung up or failed: writes stay ready, to see the error.
const WRITE_CLOSED: u8 = 8;

/// Bytes the loop reads ahead for one socket at most; more stay in the kernel, for the
/// reader to take itself (bounded memory, and the kernel's flow control still applies).
const AHEAD_ROOM: usize = 16 * 1024;

thread_local! {
    static EPOLL: Cell<RawFd> = const { Cell::new(-1) };
    /// The sockets that may be read ahead, by descriptor, for the busy-script hook, which
    /// knows a connection by its descriptor only (set once per connection, not per read).
    static BY_FD: RefCell<Vec<Option<Rc<IoSlot>>>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn set_epoll(fd: RawFd) {
    EPOLL.with(|e| e.set(fd));
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
    /// The loop may read this socket ahead of its reader (a plain connection's, read only
    /// through `Socket::read_plain`).
    read_ahead: Cell<bool>,
    /// Bytes read ahead, in order, before anything still in the socket.
    ahead: RefCell<BytesMut>,
    /// A read-ahead's buffer was left with the kernel (a ring that failed mid-read): the
    /// byte stream has a hole, so the connection must end.
    broken: Cell<bool>,
}

impl IoSlot {
    #[inline]
    fn poll_ready(&self, interest: Interest, cx: &mut Context<'_>) -> Poll<()> {
        if self.ready.get() & interest.bit() != 0
            || (interest == Interest::Readable && self.holds_ahead())
        {
            return super::poll_budget(cx);
        }
        let mut slot = match interest {
            Interest::Readable => self.reader.borrow_mut(),
            Interest::Writable => self.writer.borrow_mut(),
        };
        if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *slot = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    fn holds_ahead(&self) -> bool {
        self.read_ahead.get() && (!self.ahead.borrow().is_empty() || self.broken.get())
    }

    /// Moves the bytes read ahead to the end of `buf`; how many.
    fn take_ahead(&self, buf: &mut BytesMut) -> usize {
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
        n
    }
}

/// Hands one event to its socket: sets its readiness and wakes who waits for it. True
/// when the socket is to be read ahead (`read_ahead`, with this token).
pub(super) fn dispatch(token: u64, events: u32) -> bool {
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
    slot.ready.set(slot.ready.get() | bits);
    if bits & WRITABLE != 0 {
        if let Some(w) = slot.writer.borrow_mut().take() {
            w.wake();
        }
    }
    if bits & READABLE != 0 {
        if let Some(w) = slot.reader.borrow_mut().take() {
            w.wake();
        }
        return slot.read_ahead.get() && slot.ahead.borrow().is_empty();
    }
    false
}

/// Reads every socket of `tokens` (from `dispatch`, this wait's) in one `io_uring_enter`,
/// before the tasks run. Without a ring on this thread, does nothing: each reader reads
/// its socket itself. `reads` is scratch space, kept by the caller between passes.
pub(super) fn read_ahead(tokens: &mut Vec<u64>, reads: &mut Vec<crate::net::uring::Recv>) {
    if tokens.is_empty() {
        return;
    }
    reads.clear();
    for &token in tokens.iter() {
        // SAFETY: as in `dispatch`: no socket leaves the epoll between the event batch
        // and this read-ahead (no task runs in between).
        let slot = unsafe { &*(token as usize as *const IoSlot) };
        let mut ahead = slot.ahead.borrow_mut();
        // `ahead` is empty here (only an empty one is read into).
        if ahead.capacity() < 1024 {
            ahead.reserve(AHEAD_ROOM);
        }
        let spare = ahead.spare_capacity_mut();
        let room = spare.len().min(AHEAD_ROOM);
        reads.push(crate::net::uring::Recv {
            fd: slot.fd.get(),
            buf: spare.as_mut_ptr().cast(),
            len: room as u32,
            result: 0,
        });
    }
    // SAFETY: each buffer is the spare capacity of a slot's `ahead`, which nothing else
    // touches until this returns (no task runs meanwhile, and the registrations keep
    // the slots alive). A buffer the kernel kept is reported as `LEFT_WITH_KERNEL` and
    // leaked below.
    if unsafe { crate::net::uring::flush_and_recv(reads) } {
        for (&token, read) in tokens.iter().zip(reads.iter()) {
            // SAFETY: as above.
            let slot = unsafe { &*(token as usize as *const IoSlot) };
            let result = read.result;
            if result > 0 {
                let mut ahead = slot.ahead.borrow_mut();
                let len = ahead.len() + result as usize;
                // SAFETY: the kernel wrote `result` bytes at the start of the spare
                // capacity it was given.
                unsafe { ahead.set_len(len) };
            } else if result == crate::net::uring::LEFT_WITH_KERNEL {
                std::mem::forget(std::mem::take(&mut *slot.ahead.borrow_mut()));
                slot.broken.set(true);
                continue;
            }
            // A short read drained the socket (and -EAGAIN found it empty). At the end of
            // the stream the reader's own read finds it again; after an error (which the
            // kernel reports once) it finds the end of the stream, and closes all the
            // same.
            let drained = (result > 0 && (result as u32) < read.len) || result == -libc::EAGAIN;
            if drained && slot.ready.get() & READ_CLOSED == 0 {
                slot.ready.set(slot.ready.get() & !READABLE);
            }
        }
        crate::net::count(|c| {
            c.read_ahead_batches += 1;
            c.reads_ahead += reads.len() as u64;
        });
    }
    tokens.clear();
}

/// Takes the bytes the loop read ahead for the socket `fd`, appending them to `buf`, so
/// a reader that reads the socket by its descriptor (the busy-script hook) keeps their
/// order. False if the connection is broken.
pub fn take_read_ahead(fd: RawFd, buf: &mut BytesMut) -> bool {
    BY_FD.with(|by_fd| {
        let by_fd = by_fd.borrow();
        let Some(Some(slot)) = by_fd.get(fd as usize) else {
            return true;
        };
        if slot.broken.get() {
            return false;
        }
        slot.take_ahead(buf);
        true
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
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
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

    /// Ready for `interest`, or registers the caller to be woken when it is.
    #[inline]
    pub fn poll_ready(&self, interest: Interest, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.slot.poll_ready(interest, cx).map(Ok)
    }

    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_ready(Interest::Readable, cx)
    }

    /// Lets the loop read this socket ahead of its reader (`read_ahead`). Only for a
    /// socket read through `take_read_ahead_into` first, every time.
    pub fn allow_read_ahead(&self) {
        self.slot.read_ahead.set(true);
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
        if self.slot.ahead.borrow().is_empty() && !self.slot.broken.get() {
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
    /// with the bytes read ahead from it, which come before anything still in it.
    pub fn into_std(mut self) -> (std::net::TcpStream, BytesMut) {
        let ahead = std::mem::take(&mut *self.slot.ahead.borrow_mut());
        self.deregister();
        (self.tcp.take().expect("a socket in use"), ahead)
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
            if self.slot.read_ahead.replace(false) {
                self.slot.ahead.borrow_mut().clear();
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
