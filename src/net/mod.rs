//! Every client socket and its bytes: the thread's event loop (`event_loop`, `uring`),
//! sockets as connections see them (plain TCP, or TLS over TCP with rustls, behind one
//! `Stream` type), the listeners (`listen`), a connection's life from accept to close
//! (`conn`), the HTTP endpoints (`http`) and the TLS settings (`tls`). Nothing outside
//! this folder reads, writes or shuts a client's socket. Never runs a command or touches
//! shard data: a connection hands its parsed commands to `server::dispatch` and sends what
//! they left in its buffer.

pub mod conn;
pub mod event_loop;
pub mod http;
pub mod listen;
pub mod notify;
pub mod stream_io;
pub mod tls;
pub mod uring;

use std::cell::{Cell, RefCell};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::rc::Rc;

use bytes::BytesMut;
use event_loop::{Interest, Socket};

/// What this thread's loop did, for INFO (each thread reports its own; nothing shared
/// is touched per pass).
#[derive(Clone, Copy, Default)]
pub struct LoopCounters {
    /// Times the thread ran out of work and went to wait for more.
    pub passes: u64,
    /// Times a connection's task woke for its socket or a notification: with many idle
    /// connections this grows with the active ones only.
    pub visits: u64,
    /// Send batches sent, sends in them, and sends the socket cut short (`uring`).
    pub send_batches: u64,
    pub batched_sends: u64,
    pub short_sends: u64,
    /// Passes that armed receives for the connections' readers, and receives that
    /// brought bytes (`event_loop::reactor::receives_to_arm`, `received`).
    pub read_ahead_batches: u64,
    pub reads_ahead: u64,
}

thread_local! {
    static COUNTERS: Cell<LoopCounters> = const {
        Cell::new(LoopCounters {
            passes: 0,
            visits: 0,
            send_batches: 0,
            batched_sends: 0,
            short_sends: 0,
            read_ahead_batches: 0,
            reads_ahead: 0,
        })
    };
}

pub(crate) fn count(f: impl FnOnce(&mut LoopCounters)) {
    COUNTERS.with(|c| {
        let mut v = c.get();
        f(&mut v);
        c.set(v);
    });
}

/// This thread's counters.
pub fn loop_counters() -> LoopCounters {
    COUNTERS.with(|c| c.get())
}

/// The thread is about to wait: the end of a pass. (Its replies already left when its
/// pass ended: the loop, `net::event_loop`, sends the batch at the end of every pass.)
pub fn end_of_pass() {
    count(|c| c.passes += 1);
}

/// A connection's task woke and went round its loop once.
pub fn count_visit() {
    count(|c| c.visits += 1);
}

thread_local! {
    /// The sockets of this thread's client connections, by client id. A connection's
    /// state (`Session`) holds no socket: the connection loop keeps its own handle, and
    /// what else must reach the client's socket (a blocked command watching for the
    /// client leaving, PSYNC turning the connection into a replica's stream) asks here.
    static LINKS: RefCell<hashbrown::HashMap<u64, Rc<Stream>>> = RefCell::default();
}

/// Client `client`'s place on this thread's list of sockets, from a connection's start
/// (or its arrival from another thread) until it is dropped: when the connection closes
/// or leaves for another thread, and also when its task is dropped after a panic, so the
/// socket is never kept open by the list.
pub struct Listed(u64);

impl Listed {
    pub fn attach(client: u64, stream: Rc<Stream>) -> Listed {
        LINKS.with(|l| l.borrow_mut().insert(client, stream));
        Listed(client)
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        // `try_with`: a task dropped while the thread is torn down.
        let _ = LINKS.try_with(|l| l.borrow_mut().remove(&self.0));
    }
}

/// Client `client`'s socket, if it is connected on this thread; None for a session with
/// no client (the AOF replay, a replica applying its master's stream).
pub fn link(client: u64) -> Option<Rc<Stream>> {
    LINKS.with(|l| l.borrow().get(&client).cloned())
}

/// A client connection's socket.
pub struct Stream {
    tcp: Socket,
    /// The TLS session, for connections accepted on `tls-port`.
    tls: Option<RefCell<rustls::ServerConnection>>,
    /// Replies handed to the thread's send batch (`uring`) and not yet all sent. Every
    /// other write sends these first, so nothing overtakes them.
    unsent: RefCell<BytesMut>,
    /// Listed in the thread's send batch.
    in_batch: Cell<bool>,
    /// The batch's send failed: the connection is broken and closes at its next write.
    send_failed: Cell<bool>,
    /// Given when the batch left bytes behind (the socket was full) or failed, so the
    /// connection's task sends the rest itself.
    pub stalled: notify::LocalNotify,
    /// Bytes that came while the connection's task waited on something else (a blocked
    /// command, WAIT) and watched for the client leaving (`gone`): the next `read_some`
    /// gives them first.
    held: RefCell<BytesMut>,
}

impl Stream {
    pub fn plain(tcp: Socket) -> Stream {
        // Read only through `read_plain`, which takes the loop's read-ahead first.
        tcp.allow_read_ahead();
        Stream::with(tcp, None)
    }

    pub fn tls(tcp: Socket, session: rustls::ServerConnection) -> Stream {
        Stream::with(tcp, Some(RefCell::new(session)))
    }

    fn with(tcp: Socket, tls: Option<RefCell<rustls::ServerConnection>>) -> Stream {
        Stream {
            tcp,
            tls,
            unsent: RefCell::new(BytesMut::new()),
            in_batch: Cell::new(false),
            send_failed: Cell::new(false),
            stalled: Default::default(),
            held: RefCell::new(BytesMut::new()),
        }
    }

    fn raw_fd(&self) -> i32 {
        self.tcp.as_raw_fd()
    }

    /// Hands a finished group of replies to this thread's send batch, leaving `buf`
    /// empty (its buffer and the batch's are swapped, not copied). False, with `buf`
    /// untouched, when the connection must write them itself: no ring on this thread,
    /// TLS, a large reply, or bytes a cut-short send left behind.
    pub fn queue_for_pass(self: &Rc<Self>, buf: &mut BytesMut) -> bool {
        if self.tls.is_some() || self.send_failed.get() || !uring::enabled() {
            return false;
        }
        {
            let mut unsent = self.unsent.borrow_mut();
            // A connection whose replies pile up in one pass (a deep pipeline read in
            // several turns) writes them itself past the limit, so its memory stays
            // bounded and visible.
            if unsent.len() + buf.len() > uring::MAX_QUEUED {
                return false;
            }
            if unsent.is_empty() {
                std::mem::swap(&mut *unsent, buf);
                buf.clear();
            } else if self.in_batch.get() {
                unsent.extend_from_slice(buf);
                buf.clear();
            } else {
                return false;
            }
        }
        if !self.in_batch.replace(true) {
            uring::enqueue(self.clone());
        }
        true
    }

    /// Bytes handed to the batch are still unsent (or were lost to a broken socket, which
    /// the connection's next write reports).
    pub fn owes_output(&self) -> bool {
        self.send_failed.get() || !self.unsent.borrow().is_empty()
    }

    /// A send of the batch was cut short and the connection has not sent the rest yet.
    fn stalled_out(&self) -> bool {
        !self.in_batch.get() && self.owes_output()
    }

    /// Reply bytes handed to the send batch and not yet in the socket.
    pub fn unsent_len(&self) -> usize {
        self.unsent.borrow().len()
    }

    /// Bytes the unsent buffer holds room for (the connection's memory).
    pub fn unsent_capacity(&self) -> usize {
        self.unsent.borrow().capacity()
    }

    /// Sends what the batch still holds for this connection; true when nothing is left.
    fn send_unsent(&self) -> io::Result<bool> {
        if self.send_failed.get() {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let mut unsent = self.unsent.borrow_mut();
        while !unsent.is_empty() {
            match self.tcp.try_write(&unsent) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes::Buf::advance(&mut *unsent, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        unsent.clear();
        Ok(true)
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.tcp.peer_addr()
    }

    /// The plain socket, for moving the connection to another thread, with the bytes the
    /// loop read from it ahead of the connection (they come before the socket's). A TLS
    /// connection stays where it is (its session is not handed over).
    pub fn into_std(self) -> Option<(std::net::TcpStream, BytesMut)> {
        // The connection sends what the batch holds before it moves (`net::conn::serve`).
        debug_assert!(!self.owes_output(), "a migrating connection owes output");
        // A broken read left a hole in the input: the connection ends here.
        if self.tls.is_some() || self.tcp.is_broken() {
            return None;
        }
        let (tcp, ahead) = self.tcp.into_std()?;
        let mut input = self.held.take();
        input.extend_from_slice(&ahead);
        Some((tcp, input))
    }

    /// Bytes held for the connection's input besides its own buffer (read ahead, or held
    /// by `gone`): part of the connection's memory.
    pub fn input_capacity(&self) -> usize {
        self.held.borrow().capacity() + self.tcp.read_ahead_capacity()
    }

    /// Input read from the client that its task has not taken yet (a busy script's hook
    /// must not answer this connection before it is taken).
    pub fn holds_input(&self) -> bool {
        !self.held.borrow().is_empty()
    }

    /// Completes when the client has closed the connection or it failed, for a task
    /// waiting on something else (a blocked command, WAIT) that must notice the client
    /// leaving. Whatever the client sends meanwhile (commands pipelined behind the
    /// blocked one) is kept, in order, for the next `read_some`, up to `max_held` bytes:
    /// past that the client counts as gone (its query buffer limit), so a client cannot
    /// make the server buffer without end. Dropping the future loses nothing: bytes are
    /// moved into the stream in the same step they are read. Returns the first bytes
    /// held when the client went past `max_held` (for the log), `None` when it left.
    pub async fn gone(&self, max_held: usize) -> Option<Vec<u8>> {
        loop {
            {
                let held = self.held.borrow();
                if held.len() > max_held {
                    return Some(held[..held.len().min(64)].to_vec());
                }
            }
            // Wait without a buffer: most waiting clients send nothing until answered.
            if self.tls.is_none() && self.tcp.readable().await.is_err() {
                return None;
            }
            let mut got = BytesMut::new();
            // Past what is held already: the socket's (or the read-ahead's) next bytes.
            match self.read_unheld(&mut got).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => self.held.borrow_mut().extend_from_slice(&got),
            }
        }
    }

    /// Reads what is available (at least one byte, or 0 at end of stream).
    pub async fn read_some(&self, buf: &mut BytesMut) -> io::Result<usize> {
        {
            let mut held = self.held.borrow_mut();
            let n = held.len();
            if n > 0 {
                if buf.is_empty() {
                    std::mem::swap(&mut *held, buf);
                } else {
                    buf.extend_from_slice(&held);
                    held.clear();
                }
                return Ok(n);
            }
        }
        self.read_unheld(buf).await
    }

    /// Reads from the connection itself (the read-ahead, then the socket), leaving what
    /// `gone` holds where it is.
    async fn read_unheld(&self, buf: &mut BytesMut) -> io::Result<usize> {
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(16 * 1024);
        }
        match &self.tls {
            None => read_plain(&self.tcp, buf).await,
            Some(tls) => self.read_tls(tls, buf).await,
        }
    }

    async fn read_tls(
        &self,
        tls: &RefCell<rustls::ServerConnection>,
        buf: &mut BytesMut,
    ) -> io::Result<usize> {
        loop {
            // Decrypt what arrived, then hand over exactly the plaintext there is,
            // straight into the connection's buffer (no zeroed scratch, no extra copy).
            let state = tls.borrow_mut().process_new_packets();
            match state {
                Ok(io_state) => {
                    let avail = io_state.plaintext_bytes_to_read();
                    if avail > 0 {
                        let start = buf.len();
                        buf.resize(start + avail, 0);
                        let n = tls.borrow_mut().reader().read(&mut buf[start..])?;
                        buf.truncate(start + n);
                        return Ok(n);
                    }
                    if io_state.peer_has_closed() {
                        return Ok(0);
                    }
                }
                Err(e) => {
                    // Tell the peer why (a plain-text client gets an alert it will not
                    // understand), then give up on the connection.
                    tracing::warn!(
                        "Error accepting a client connection: {e} (addr={})",
                        self.peer_addr().map(|a| a.to_string()).unwrap_or_default()
                    );
                    let _ = self.flush_tls(tls).await;
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            }
            // The handshake, or a key update, may owe the peer bytes first.
            self.flush_tls(tls).await?;
            self.tcp.readable().await?;
            let got = self.tcp.try_io(Interest::Readable, || {
                tls.borrow_mut().read_tls(&mut FdIo(self.tcp.as_raw_fd()))
            });
            match got {
                Ok(0) => return Ok(0),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends the encrypted bytes the TLS session holds, waiting for the socket.
    async fn flush_tls(&self, tls: &RefCell<rustls::ServerConnection>) -> io::Result<()> {
        while tls.borrow().wants_write() {
            match self.tcp.try_io(Interest::Writable, || {
                tls.borrow_mut().write_tls(&mut FdIo(self.tcp.as_raw_fd()))
            }) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.tcp.writable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends what the TLS session holds without waiting; true when nothing is left.
    fn try_flush_tls(&self, tls: &RefCell<rustls::ServerConnection>) -> io::Result<bool> {
        while tls.borrow().wants_write() {
            match self.tcp.try_io(Interest::Writable, || {
                tls.borrow_mut().write_tls(&mut FdIo(self.tcp.as_raw_fd()))
            }) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Writes as much as the connection takes now. Over TLS, bytes the session
    /// accepted count as written; it sends them as the socket allows.
    pub fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        match &self.tls {
            None => {
                if !self.send_unsent()? {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                self.tcp.try_write(data)
            }
            Some(tls) => {
                // Encrypted bytes still waiting go first: the session's buffer is bounded.
                if !self.try_flush_tls(tls)? {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                let n = tls.borrow_mut().writer().write(data)?;
                self.try_flush_tls(tls)?;
                if n == 0 && !data.is_empty() {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            }
        }
    }

    /// Waits until `try_write` may make progress.
    pub async fn writable(&self) -> io::Result<()> {
        match &self.tls {
            None => self.tcp.writable().await,
            Some(tls) => {
                if tls.borrow().wants_write() {
                    self.tcp.writable().await?;
                    // Push what is pending so the next try_write finds room.
                    let _ = self.try_flush_tls(tls)?;
                }
                Ok(())
            }
        }
    }

    /// Writes all of `data`, after what the send batch left unsent.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !self.send_unsent()? {
            self.tcp.writable().await?;
        }
        while !data.is_empty() {
            match self.try_write(data) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait_writable().await?,
                Err(e) => return Err(e),
            }
        }
        if let Some(tls) = &self.tls {
            self.flush_tls(tls).await?;
        }
        Ok(())
    }

    async fn wait_writable(&self) -> io::Result<()> {
        match &self.tls {
            None => self.tcp.writable().await,
            Some(tls) => self.flush_tls(tls).await,
        }
    }
}

/// A socket as `std::io::Read`/`Write` for rustls, by its descriptor, without waiting.
struct FdIo(i32);

impl Read for FdIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: recv writes at most buf.len() bytes into buf.
        let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl Write for FdIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: send reads at most buf.len() bytes from buf.
        let n = unsafe { libc::send(self.0, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads from a plain socket.
///
/// A read that leaves room in the buffer has taken everything the socket held, so the
/// socket is marked not ready at once: without that, the next wait would return
/// immediately and cost one more `recv` that finds nothing, one extra system call per
/// request on an unpipelined connection.
///
/// Bytes the loop's receive read (`event_loop::reactor::received`) are taken first; the
/// socket is read only when there are none.
async fn read_plain(stream: &Socket, buf: &mut BytesMut) -> io::Result<usize> {
    loop {
        // Ready at once when the loop read bytes ahead (taken just below).
        // The stream's single reader slot, not `readable()`: that one links a waiter into
        // the socket's list under its lock and unlinks it when dropped, on every wait.
        std::future::poll_fn(|cx| stream.poll_read_ready(cx)).await?;
        let ahead = stream.take_read_ahead_into(buf)?;
        if ahead > 0 {
            return Ok(ahead);
        }
        let mut got = 0usize;
        let fd = stream.as_raw_fd();
        let result = stream.try_io(Interest::Readable, || {
            let spare = buf.spare_capacity_mut();
            let room = spare.len();
            // SAFETY: recv writes at most `room` bytes into the buffer's spare capacity,
            // which stays valid for the call; the bytes are only exposed after it
            // reports how many it wrote.
            let n = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), room, 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            // SAFETY: recv initialised the first `n` bytes of the spare capacity.
            unsafe { buf.set_len(buf.len() + n) };
            got = n;
            if n > 0 && n < room {
                // Drained: tell the reactor, and hand the bytes back below.
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match result {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if got > 0 {
                    return Ok(got);
                }
            }
            Err(e) => return Err(e),
        }
    }
}
