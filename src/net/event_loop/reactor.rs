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

thread_local! {
    static EPOLL: Cell<RawFd> = const { Cell::new(-1) };
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
}

impl IoSlot {
    #[inline]
    fn poll_ready(&self, interest: Interest, cx: &mut Context<'_>) -> Poll<()> {
        if self.ready.get() & interest.bit() != 0 {
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
    slot.ready.set(slot.ready.get() | bits);
    if bits & READABLE != 0 {
        if let Some(w) = slot.reader.borrow_mut().take() {
            w.wake();
        }
    }
    if bits & WRITABLE != 0 {
        if let Some(w) = slot.writer.borrow_mut().take() {
            w.wake();
        }
    }
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

    /// Leaves the loop and gives the socket back (a connection moving to another thread).
    pub fn into_std(mut self) -> std::net::TcpStream {
        self.deregister();
        self.tcp.take().expect("a socket in use")
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
