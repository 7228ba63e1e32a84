//! Socket reads and writes through a shared `&TcpStream`, so that a blocked command can
//! watch its own connection for a disconnect while the connection loop owns the buffers.

use std::io;

use bytes::BytesMut;
use tokio::net::TcpStream;

/// Reads what is available (at least one byte, or 0 at end of stream).
pub async fn read_some(stream: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read_buf(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes all of `data`, trying first without waiting: the socket is usually writable.
pub async fn write_all(stream: &TcpStream, mut data: &[u8]) -> io::Result<()> {
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
