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

/// Formats a double the way Redis prints scores and RESP2 doubles: `%.17g`, with `inf`/`-inf`.
pub fn format_double(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v.is_nan() {
        return "nan".into();
    }
    format_g17(v)
}

/// C's `%.17g`: 17 significant digits, exponent form when the exponent is < -4 or >= 17,
/// trailing zeros removed.
fn format_g17(v: f64) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let sci = format!("{:.16e}", v);
    let (mantissa, exp) = sci.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent");
    if !(-4..17).contains(&exp) {
        let m = trim_fraction(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{}e{}{:02}", m, sign, exp.abs());
    }
    let decimals = (16 - exp).max(0) as usize;
    trim_fraction(&format!("{:.*}", decimals, v)).to_string()
}

fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
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

    pub fn bulk_int(&mut self, v: i64) {
        let mut tmp = BytesMut::with_capacity(20);
        put_int(&mut tmp, v);
        self.bulk(&tmp);
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

    pub fn push(&mut self, len: usize) {
        self.line(if self.resp3 { b'>' } else { b'*' }, len as i64);
    }

    pub fn double(&mut self, v: f64) {
        let text = format_double(v);
        if self.resp3 {
            self.buf.put_u8(b',');
            self.buf.put_slice(text.as_bytes());
            self.buf.put_slice(b"\r\n");
        } else {
            self.bulk(text.as_bytes());
        }
    }

    pub fn boolean(&mut self, v: bool) {
        if self.resp3 {
            self.buf.put_slice(if v { b"#t\r\n" } else { b"#f\r\n" });
        } else {
            self.int(v as i64);
        }
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

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
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
    fn doubles_format_like_printf_g17() {
        assert_eq!(format_double(1.5), "1.5");
        assert_eq!(format_double(0.1), "0.10000000000000001");
        assert_eq!(format_double(100.0), "100");
        assert_eq!(format_double(1e17), "1e+17");
        assert_eq!(format_double(1.0e-5), "1.0000000000000001e-05");
        assert_eq!(format_double(f64::INFINITY), "inf");
        assert_eq!(format_double(-3.0), "-3");
        assert_eq!(format_double(9007199254740993.0), "9007199254740992");
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
