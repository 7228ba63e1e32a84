//! Just enough RESP for a load generator: encode commands into a buffer, find where a
//! reply ends without building it, and pull the value out of a BRPOP reply.

/// Appends one command, as a RESP array of bulk strings, to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_uint(out, args.len() as u64);
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        push_uint(out, a.len() as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes a decimal number without going through `fmt`.
pub fn push_uint(out: &mut Vec<u8>, mut n: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

/// Index just past the `\n` of the line starting at `pos`, and the index of its `\r`.
fn line(buf: &[u8], pos: usize) -> Option<(usize, usize)> {
    let nl = buf[pos..].iter().position(|&b| b == b'\n')? + pos;
    if nl == pos || buf[nl - 1] != b'\r' {
        // A bare \n would be a protocol error from the server; treat the line as ending here.
        return Some((nl, nl + 1));
    }
    Some((nl - 1, nl + 1))
}

fn int(s: &[u8]) -> Result<i64, String> {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() {
        return Err("empty length in reply".into());
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(format!(
                "bad length in reply: {:?}",
                String::from_utf8_lossy(s)
            ));
        }
        n = n.saturating_mul(10).saturating_add((d - b'0') as i64);
    }
    Ok(if neg { -n } else { n })
}

/// Where the reply starting at `buf[pos]` ends: `Ok(None)` while it is incomplete.
pub fn reply_end(buf: &[u8], pos: usize) -> Result<Option<usize>, String> {
    if pos >= buf.len() {
        return Ok(None);
    }
    let Some((cr, next)) = line(buf, pos + 1) else {
        return Ok(None);
    };
    match buf[pos] {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(Some(next)),
        b'$' | b'=' | b'!' => {
            let n = int(&buf[pos + 1..cr])?;
            if n < 0 {
                return Ok(Some(next));
            }
            let end = next + n as usize + 2;
            Ok(if end <= buf.len() { Some(end) } else { None })
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = int(&buf[pos + 1..cr])?;
            if n < 0 {
                return Ok(Some(next));
            }
            let n = if matches!(buf[pos], b'%' | b'|') {
                2 * n
            } else {
                n
            };
            let mut p = next;
            for _ in 0..n {
                match reply_end(buf, p)? {
                    Some(e) => p = e,
                    None => return Ok(None),
                }
            }
            Ok(Some(p))
        }
        other => Err(format!(
            "unexpected reply type byte {:?}",
            char::from(other)
        )),
    }
}

/// The text of an error reply (`-ERR ...`), if `reply` is one.
pub fn error_text(reply: &[u8]) -> Option<String> {
    if reply.first() == Some(&b'-') {
        let s = String::from_utf8_lossy(reply);
        Some(s.trim_start_matches('-').trim_end().to_string())
    } else {
        None
    }
}

/// The n-th element (0-based) of an array of bulk strings, e.g. the value (n = 1) of a
/// BRPOP reply. `None` for a nil reply or anything else.
pub fn array_bulk(reply: &[u8], n: usize) -> Option<&[u8]> {
    if reply.first() != Some(&b'*') {
        return None;
    }
    let (cr, mut p) = line(reply, 1)?;
    let len = int(&reply[1..cr]).ok()?;
    if len <= n as i64 {
        return None;
    }
    for i in 0..=n {
        if reply.get(p) != Some(&b'$') {
            return None;
        }
        let (cr, next) = line(reply, p + 1)?;
        let blen = int(&reply[p + 1..cr]).ok()?;
        if blen < 0 {
            return None;
        }
        let end = next + blen as usize;
        if i == n {
            return reply.get(next..end);
        }
        p = end + 2;
    }
    None
}

/// The payload of a bulk-string reply (`$n\r\n...`), `None` for nil or another type.
pub fn bulk(reply: &[u8]) -> Option<&[u8]> {
    if reply.first() != Some(&b'$') {
        return None;
    }
    let (cr, next) = line(reply, 1)?;
    let n = int(&reply[1..cr]).ok()?;
    if n < 0 {
        return None;
    }
    reply.get(next..next + n as usize)
}

/// The value of an integer reply (`:n`).
pub fn integer(reply: &[u8]) -> Option<i64> {
    if reply.first() != Some(&b':') {
        return None;
    }
    let (cr, _) = line(reply, 1)?;
    int(&reply[1..cr]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_finds_ends() {
        let mut b = Vec::new();
        encode(&mut b, &[b"SET", b"k", b"value"]);
        assert_eq!(b, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n");
        assert_eq!(reply_end(&b, 0).unwrap(), Some(b.len()));
        assert_eq!(reply_end(&b[..b.len() - 1], 0).unwrap(), None);
        assert_eq!(reply_end(b"+OK\r\n:1\r\n", 0).unwrap(), Some(5));
        assert_eq!(reply_end(b"+OK\r\n:1\r\n", 5).unwrap(), Some(9));
        assert_eq!(reply_end(b"$-1\r\n", 0).unwrap(), Some(5));
        assert_eq!(reply_end(b"*-1\r\n", 0).unwrap(), Some(5));
        assert_eq!(reply_end(b"$3\r\nab", 0).unwrap(), None);
        assert!(reply_end(b"?x\r\n", 0).is_err());
    }

    #[test]
    fn brpop_value() {
        let r = b"*2\r\n$1\r\nq\r\n$5\r\nhello\r\n";
        assert_eq!(reply_end(r, 0).unwrap(), Some(r.len()));
        assert_eq!(array_bulk(r, 1), Some(&b"hello"[..]));
        assert_eq!(array_bulk(r, 0), Some(&b"q"[..]));
        assert_eq!(array_bulk(b"*-1\r\n", 1), None);
        assert_eq!(bulk(b"$2\r\nhi\r\n"), Some(&b"hi"[..]));
        assert_eq!(integer(b":42\r\n"), Some(42));
        assert_eq!(error_text(b"-ERR x\r\n").as_deref(), Some("ERR x"));
    }
}
