//! Connections: a lean async one for the load (raw writes of pre-encoded commands, replies
//! only delimited, never built) and a blocking one for set-up, INFO and clean-up.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream as StdStream};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::resp;

const READ_CHUNK: usize = 64 * 1024;

fn proto_err(e: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Read buffer shared by both kinds of connection.
struct ReadBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    fn new() -> ReadBuf {
        ReadBuf {
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
        }
    }

    /// The next complete reply's range, consuming it.
    fn next(&mut self) -> io::Result<Option<(usize, usize)>> {
        match resp::reply_end(&self.buf[..self.end], self.start).map_err(proto_err)? {
            Some(e) => {
                let r = (self.start, e);
                self.start = e;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                Ok(Some(r))
            }
            None => Ok(None),
        }
    }

    /// Room to read into, compacting or growing the buffer when little is left.
    fn spare(&mut self) -> &mut [u8] {
        if self.buf.len() - self.end < READ_CHUNK / 4 {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.buf.len() - self.end < READ_CHUNK / 4 {
                let n = self.buf.len() * 2;
                self.buf.resize(n, 0);
            }
        }
        &mut self.buf[self.end..]
    }
}

/// An async load connection.
pub struct Conn {
    stream: TcpStream,
    rb: ReadBuf,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            rb: ReadBuf::new(),
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    async fn fill(&mut self) -> io::Result<()> {
        let n = self.stream.read(self.rb.spare()).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection",
            ));
        }
        self.rb.end += n;
        Ok(())
    }

    /// Reads `n` replies, handing each to `f`; an error reply stops with an error unless
    /// `f` returns true for it.
    pub async fn read_replies<F: FnMut(&[u8]) -> bool>(
        &mut self,
        n: usize,
        mut f: F,
    ) -> io::Result<()> {
        let mut got = 0;
        while got < n {
            while got < n {
                let Some((a, b)) = self.rb.next()? else {
                    break;
                };
                let reply = &self.rb.buf[a..b];
                let ok = f(reply);
                if !ok {
                    if let Some(e) = resp::error_text(reply) {
                        return Err(io::Error::other(format!("server error: {e}")));
                    }
                }
                got += 1;
            }
            if got < n {
                self.fill().await?;
            }
        }
        Ok(())
    }

    /// Reads `n` replies, failing on any error reply.
    pub async fn expect(&mut self, n: usize) -> io::Result<()> {
        self.read_replies(n, |r| r.first() != Some(&b'-')).await
    }
}

/// A blocking connection for set-up, INFO and clean-up.
pub struct Admin {
    stream: StdStream,
    rb: ReadBuf,
}

impl Admin {
    pub fn connect(addr: SocketAddr) -> io::Result<Admin> {
        let stream = StdStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Admin {
            stream,
            rb: ReadBuf::new(),
        })
    }

    fn read_one(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some((a, b)) = self.rb.next()? {
                return Ok(self.rb.buf[a..b].to_vec());
            }
            let n = self.stream.read(self.rb.spare())?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ));
            }
            self.rb.end += n;
        }
    }

    /// Runs one command and returns its raw reply; an error reply is an `Err`.
    pub fn cmd(&mut self, args: &[&[u8]]) -> io::Result<Vec<u8>> {
        let mut b = Vec::new();
        resp::encode(&mut b, args);
        self.stream.write_all(&b)?;
        let r = self.read_one()?;
        match resp::error_text(&r) {
            Some(e) => Err(io::Error::other(format!("server error: {e}"))),
            None => Ok(r),
        }
    }

    /// Sends pre-encoded commands (`count` of them) and reads every reply, keeping at most
    /// about 1 MB in flight; fails on the first error reply.
    pub fn pipeline(&mut self, cmds: &[Vec<u8>]) -> io::Result<()> {
        let mut sent = 0;
        let mut read = 0;
        while read < cmds.len() {
            let mut batch = Vec::new();
            while sent < cmds.len() && batch.len() < 1 << 20 && sent - read < 4096 {
                batch.extend_from_slice(&cmds[sent]);
                sent += 1;
            }
            if !batch.is_empty() {
                self.stream.write_all(&batch)?;
            }
            while read < sent {
                let r = self.read_one()?;
                if let Some(e) = resp::error_text(&r) {
                    return Err(io::Error::other(format!("server error: {e}")));
                }
                read += 1;
            }
        }
        Ok(())
    }

    /// One INFO section as `field -> value`.
    pub fn info(&mut self, section: &str) -> io::Result<BTreeMap<String, String>> {
        let r = self.cmd(&[b"INFO", section.as_bytes()])?;
        let body = resp::bulk(&r)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        let mut m = BTreeMap::new();
        for line in body.lines() {
            if let Some((k, v)) = line.split_once(':') {
                m.insert(k.to_string(), v.trim().to_string());
            }
        }
        Ok(m)
    }

    pub fn info_u64(&mut self, section: &str, field: &str) -> io::Result<u64> {
        let m = self.info(section)?;
        m.get(field)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| io::Error::other(format!("INFO {section} has no {field}")))
    }

    /// `INFO commandstats` as `command -> (calls, usec)`.
    pub fn commandstats(&mut self) -> io::Result<BTreeMap<String, (u64, u64)>> {
        let m = self.info("commandstats")?;
        let mut out = BTreeMap::new();
        for (k, v) in m {
            let Some(name) = k.strip_prefix("cmdstat_") else {
                continue;
            };
            let mut calls = 0;
            let mut usec = 0;
            for kv in v.split(',') {
                match kv.split_once('=') {
                    Some(("calls", n)) => calls = n.parse().unwrap_or(0),
                    Some(("usec", n)) => usec = n.parse().unwrap_or(0),
                    _ => {}
                }
            }
            out.insert(name.to_string(), (calls, usec));
        }
        Ok(out)
    }

    /// Deletes keys, 500 per DEL.
    pub fn del_keys(&mut self, keys: &[Vec<u8>]) -> io::Result<()> {
        let cmds: Vec<Vec<u8>> = keys
            .chunks(500)
            .map(|chunk| {
                let mut args: Vec<&[u8]> = vec![b"DEL"];
                args.extend(chunk.iter().map(|k| k.as_slice()));
                let mut b = Vec::new();
                resp::encode(&mut b, &args);
                b
            })
            .collect();
        self.pipeline(&cmds)
    }
}

/// Waits until the server reports at least `n` blocked clients, up to `limit`.
pub fn wait_blocked(admin: &mut Admin, n: u64, limit: Duration) -> io::Result<bool> {
    let t0 = std::time::Instant::now();
    loop {
        let b = admin.info_u64("clients", "blocked_clients").unwrap_or(0);
        if b >= n {
            return Ok(true);
        }
        if t0.elapsed() > limit || crate::signal::stopping() {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
