//! Socket reads and writes through a shared `&Stream` (plain or TLS, `net`), so that a
//! blocked command can be told of its client leaving (`gone`) without reading the socket
//! itself, while the connection loop owns the buffers.

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

/// Completes when the send batch left this connection's replies unsent (the socket was
/// full) or failed: the connection then sends the rest itself (`write_all`).
pub async fn stalled(stream: Option<&Stream>) {
    match stream {
        Some(s) => s.stalled.notified().await,
        None => std::future::pending().await,
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
