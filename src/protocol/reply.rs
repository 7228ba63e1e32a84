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
pub fn put_int(buf: &mut impl BufMut, v: i64) {
    let (head, at) = header(b':', v);
    buf.put_slice(&head[at + 1..head.len() - 2]);
}

/// `<prefix><v>\r\n` (a length, a count, an integer reply), formed on the stack so that it
/// reaches the reply buffer as one copy instead of a write per part. Returns the bytes and
/// where they start in them: the longest, `:-9223372036854775808\r\n`, takes 23.
#[inline]
fn header(prefix: u8, v: i64) -> ([u8; 24], usize) {
    let mut head = [0u8; 24];
    let mut at = head.len() - 2;
    head[at] = b'\r';
    head[at + 1] = b'\n';
    let mut n = v.unsigned_abs();
    loop {
        at -= 1;
        head[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        at -= 1;
        head[at] = b'-';
    }
    at -= 1;
    head[at] = prefix;
    (head, at)
}

/// Formats a double as Redis 7.2 prints scores and RESP2 doubles: the shortest text that
/// reads back as the same double, in `%g` style (exponent form below 1e-4 and from 1e17),
/// with `inf`, `-inf` and `nan`.
pub fn format_double(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v.is_nan() {
        return "nan".into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.5e-7", "1e20".
    let sci = format!("{:e}", v);
    let (mantissa, exp) = sci.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent");
    if !(-4..17).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{}e{}{:02}", mantissa, sign, exp.abs());
    }
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let negative = v < 0.0;
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            for _ in digits.len()..int_len {
                out.push('0');
            }
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
    out
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
        let (head, at) = header(prefix, len);
        self.buf.extend_from_slice(&head[at..]);
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
        self.line(b':', v);
    }

    /// A bulk string: its header formed on the stack, the whole reply reserved at once.
    pub fn bulk(&mut self, data: &[u8]) {
        let (head, at) = header(b'$', data.len() as i64);
        self.buf.reserve(head.len() - at + data.len() + 2);
        self.buf.extend_from_slice(&head[at..]);
        self.buf.extend_from_slice(data);
        self.buf.extend_from_slice(b"\r\n");
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

    /// A double: `,` in RESP3, a bulk string in RESP2.
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

    /// A push message header (`>` in RESP3; an array in RESP2), for pub/sub messages.
    pub fn push(&mut self, len: usize) {
        self.line(if self.resp3 { b'>' } else { b'*' }, len as i64);
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
    fn integer_replies_and_bulk_headers_format_like_decimal() {
        for v in [0i64, 1, -1, 9, 10, 42, -42, i64::MAX, i64::MIN, 1000000007] {
            let mut r = Reply::new(false);
            r.int(v);
            assert_eq!(&r.buf[..], format!(":{v}\r\n").as_bytes());
            let mut r = Reply::new(false);
            r.array(v.unsigned_abs().min(1 << 40) as usize);
            assert_eq!(
                &r.buf[..],
                format!("*{}\r\n", v.unsigned_abs().min(1 << 40)).as_bytes()
            );
        }
        for len in [0usize, 1, 9, 10, 99, 100, 65536] {
            let data = vec![b'x'; len];
            let mut r = Reply::new(false);
            r.bulk(&data);
            let mut want = format!("${len}\r\n").into_bytes();
            want.extend_from_slice(&data);
            want.extend_from_slice(b"\r\n");
            assert_eq!(&r.buf[..], &want[..]);
        }
    }

    #[test]
    fn doubles_print_shortest_round_trip_text() {
        assert_eq!(format_double(1.5), "1.5");
        assert_eq!(format_double(0.1), "0.1");
        assert_eq!(format_double(100.0), "100");
        assert_eq!(format_double(1e17), "1e+17");
        assert_eq!(format_double(1.0e-5), "1e-05");
        assert_eq!(format_double(0.0001), "0.0001");
        assert_eq!(format_double(f64::INFINITY), "inf");
        assert_eq!(format_double(-3.0), "-3");
        assert_eq!(format_double(-0.25), "-0.25");
        assert_eq!(format_double(9007199254740993.0), "9007199254740992");
        assert_eq!(format_double(123456.789), "123456.789");
        for v in [0.1 + 0.2, 1.0 / 3.0, 1e-300, 6.02e23, -2.5e-5] {
            assert_eq!(format_double(v).parse::<f64>().unwrap(), v);
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
