//! Building replies straight into the connection's output buffer, in RESP2 or RESP3.
//!
//! Handlers never build an intermediate reply tree: they write bytes, so a reply computed
//! on another shard's thread travels back as one buffer and is appended as it is.

use bytes::{BufMut, BytesMut};

/// A reply under construction for one client protocol version.
pub struct Reply {
    pub buf: BytesMut,
    pub resp3: bool,
}

/// Writes `v` in decimal without going through `fmt`, which is measurably slower on the hot path.
pub fn put_int(buf: &mut BytesMut, v: i64) {
    let mut tmp = [0u8; 20];
    let mut pos = tmp.len();
    let mut n = v.unsigned_abs();
    loop {
        pos -= 1;
        tmp[pos] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        buf.put_u8(b'-');
    }
    buf.extend_from_slice(&tmp[pos..]);
}

impl Reply {
    pub fn new(resp3: bool) -> Reply {
        Reply {
            buf: BytesMut::with_capacity(64),
            resp3,
        }
    }

    pub fn with_buf(buf: BytesMut, resp3: bool) -> Reply {
        Reply { buf, resp3 }
    }

    #[inline]
    fn line(&mut self, prefix: u8, len: i64) {
        self.buf.put_u8(prefix);
        put_int(&mut self.buf, len);
        self.buf.put_slice(b"\r\n");
    }

    pub fn ok(&mut self) {
        self.buf.put_slice(b"+OK\r\n");
    }

    pub fn simple(&mut self, s: &str) {
        self.buf.put_u8(b'+');
        self.buf.put_slice(s.as_bytes());
        self.buf.put_slice(b"\r\n");
    }

    /// An error reply; `msg` includes its code (`ERR ...`, `WRONGTYPE ...`). Newlines are
    /// replaced so that a message can never break the framing.
    pub fn error(&mut self, msg: &str) {
        self.error_bytes(msg.as_bytes());
    }

    /// An error reply whose text may hold any bytes (it echoes client input).
    pub fn error_bytes(&mut self, msg: &[u8]) {
        self.buf.put_u8(b'-');
        for &b in msg {
            self.buf
                .put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        self.buf.put_slice(b"\r\n");
    }

    pub fn int(&mut self, v: i64) {
        self.buf.put_u8(b':');
        put_int(&mut self.buf, v);
        self.buf.put_slice(b"\r\n");
    }

    pub fn bulk(&mut self, data: &[u8]) {
        self.line(b'$', data.len() as i64);
        self.buf.put_slice(data);
        self.buf.put_slice(b"\r\n");
    }

    pub fn opt_bulk(&mut self, data: Option<&[u8]>) {
        match data {
            Some(d) => self.bulk(d),
            None => self.null(),
        }
    }

    /// The null bulk string (`$-1` in RESP2).
    pub fn null(&mut self) {
        if self.resp3 {
            self.buf.put_slice(b"_\r\n");
        } else {
            self.buf.put_slice(b"$-1\r\n");
        }
    }

    /// The null array (`*-1` in RESP2), as EXEC and BLPOP's timeout return.
    pub fn null_array(&mut self) {
        if self.resp3 {
            self.buf.put_slice(b"_\r\n");
        } else {
            self.buf.put_slice(b"*-1\r\n");
        }
    }

    pub fn array(&mut self, len: usize) {
        self.line(b'*', len as i64);
    }

    /// A map of `len` pairs; RESP2 clients get a flat array of 2×len items.
    pub fn map(&mut self, len: usize) {
        if self.resp3 {
            self.line(b'%', len as i64);
        } else {
            self.line(b'*', 2 * len as i64);
        }
    }

    pub fn set(&mut self, len: usize) {
        self.line(if self.resp3 { b'~' } else { b'*' }, len as i64);
    }

    /// Free text such as INFO's or CLIENT LIST's: a verbatim string in RESP3.
    pub fn verbatim(&mut self, text: &[u8]) {
        if self.resp3 {
            self.line(b'=', text.len() as i64 + 4);
            self.buf.put_slice(b"txt:");
            self.buf.put_slice(text);
            self.buf.put_slice(b"\r\n");
        } else {
            self.bulk(text);
        }
    }

    pub fn raw(&mut self, bytes: &[u8]) {
        self.buf.put_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_format_like_decimal() {
        for v in [0i64, 1, -1, 42, i64::MAX, i64::MIN, 1000000007] {
            let mut b = BytesMut::new();
            put_int(&mut b, v);
            assert_eq!(&b[..], v.to_string().as_bytes());
        }
    }

    #[test]
    fn resp2_and_resp3_nulls_differ() {
        let mut r = Reply::new(false);
        r.null();
        r.null_array();
        assert_eq!(&r.buf[..], b"$-1\r\n*-1\r\n");
        let mut r = Reply::new(true);
        r.null();
        r.map(1);
        assert_eq!(&r.buf[..], b"_\r\n%1\r\n");
    }
}
