//! Socket reads and writes through a shared `&TcpStream`, so that a blocked command can
//! watch its own connection for a disconnect while the connection loop owns the buffers.

use std::io;

use bytes::BytesMut;
use tokio::net::TcpStream;

/// Reads what is available (at least one byte, or 0 at end of stream).
///
/// A read that leaves room in the buffer has taken everything the socket held, so the
/// socket is marked not ready at once: without that, the next wait would return
/// immediately and cost one more `recv` that finds nothing, one extra system call per
/// request on an unpipelined connection.
/// A session without a socket (the AOF replay) never has anything to read.
pub async fn read_some(stream: Option<&TcpStream>, buf: &mut BytesMut) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    use tokio::io::Interest;
    let Some(stream) = stream else {
        return std::future::pending().await;
    };
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(16 * 1024);
    }
    loop {
        stream.readable().await?;
        let mut got = 0usize;
        let fd = stream.as_raw_fd();
        let result = stream.try_io(Interest::READABLE, || {
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

/// Writes all of `data`, trying first without waiting: the socket is usually writable.
/// Without a socket (the AOF replay) the bytes are dropped.
pub async fn write_all(stream: Option<&TcpStream>, mut data: &[u8]) -> io::Result<()> {
    let Some(stream) = stream else {
        return Ok(());
    };
    while !data.is_empty() {
        match stream.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
