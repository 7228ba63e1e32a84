//! Socket reads and writes through a shared `&Stream` (plain or TLS, `net`), so that a
//! blocked command can be told of its client leaving (`gone`) without reading the socket
//! itself, while the connection loop owns the buffers; and the few reads and writes that
//! cannot wait, by descriptor, for the busy-script hook (`scripting::busy`), which runs
//! inside Lua while the thread's loop is stopped.

use std::io;

use crate::net::Stream;
use bytes::BytesMut;

/// Reads what is available (at least one byte, or 0 at end of stream). A session
/// without a socket (the AOF replay) never has anything to read.
pub async fn read_some(stream: Option<&Stream>, buf: &mut BytesMut) -> io::Result<usize> {
    match stream {
        Some(s) => s.read_some(buf).await,
        None => std::future::pending().await,
    }
}

/// Completes when the client has left (closed or failed) or has sent more than
/// `max_held` bytes meanwhile; what it sends waits in the stream for the connection's
/// next read. Never, without a socket (the AOF replay). In the second case, returns the
/// first bytes held, for the log line of a client closed for its query buffer.
pub async fn gone(stream: Option<&Stream>, max_held: usize) -> Option<Vec<u8>> {
    match stream {
        Some(s) => s.gone(max_held).await,
        None => std::future::pending().await,
    }
}

/// Writes all of `data`. Without a socket (the AOF replay) the bytes are dropped.
pub async fn write_all(stream: Option<&Stream>, data: &[u8]) -> io::Result<()> {
    match stream {
        Some(s) => s.write_all(data).await,
        None => Ok(()),
    }
}

/// Sends what the send batch still holds for this connection, waiting for the socket:
/// for a command about to wait (a blocking pop, CLIENT PAUSE, WAIT), whose earlier
/// replies nothing else would send until it ends.
pub async fn settle(stream: Option<&Stream>) -> io::Result<()> {
    match stream {
        Some(s) if s.owes_output() => s.write_all(&[]).await,
        _ => Ok(()),
    }
}

/// Reads whatever socket `fd` holds now onto `buf`, without waiting. False when the peer
/// closed it, it failed, or `buf` holds more than `max` bytes.
pub fn recv_now(fd: i32, buf: &mut BytesMut, max: usize) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if buf.len() > max {
            return false;
        }
        // SAFETY: recv writes at most chunk.len() bytes into the stack buffer.
        let n = unsafe {
            libc::recv(
                fd,
                chunk.as_mut_ptr().cast(),
                chunk.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => return false,
            n if n > 0 => buf.extend_from_slice(&chunk[..n as usize]),
            _ => {
                let e = io::Error::last_os_error();
                return matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                );
            }
        }
    }
}

/// Sends what socket `fd` takes now, without waiting; returns the rest.
pub fn send_now(fd: i32, out: Vec<u8>) -> Vec<u8> {
    let mut sent = 0;
    while sent < out.len() {
        // SAFETY: send reads within the vector's initialised bytes.
        let n = unsafe {
            libc::send(
                fd,
                out[sent..].as_ptr().cast(),
                out.len() - sent,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n <= 0 {
            break;
        }
        sent += n as usize;
    }
    out[sent..].to_vec()
}

/// Ends both directions of socket `fd` at once (a request that must be closed unanswered).
/// The descriptor stays open, and owned by its connection, until the loop closes it.
pub fn shut_now(fd: i32) {
    // SAFETY: shutdown takes a descriptor the caller's connection still owns; it closes
    // nothing.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// Answers a connection refused before it started (protected mode, maxclients) with one
/// error line, then closes it.
pub fn refuse(stream: std::net::TcpStream, reply: &[u8]) {
    let mut stream = stream;
    let _ = std::io::Write::write_all(&mut stream, reply);
}
