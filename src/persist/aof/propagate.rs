//! Effects that are not a command's own words: the rewrites Redis 7 applies before it
//! propagates a command, so that replaying the log later (or on a replica) gives the same
//! data. Relative times become absolute ones, and a read-and-modify becomes the write it
//! did. Rewrites that need what the handler alone knows (the members SPOP chose, the
//! length XADD trimmed to) are made by the handlers themselves (`ExecCtx::log_as`).

use bytes::Bytes;

fn eq(a: &[u8], b: &str) -> bool {
    a.eq_ignore_ascii_case(b.as_bytes())
}

fn int(b: &[u8]) -> Option<i64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

fn word(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn num(n: i64) -> Bytes {
    Bytes::from(n.to_string())
}

/// The first bulk string of a reply (`$n\r\nbytes\r\n`), for commands answering with the
/// value they stored.
fn reply_bulk(reply: &[u8]) -> Option<Bytes> {
    let rest = reply.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\r')?;
    let len: usize = std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()?;
    let body = rest.get(nl + 2..nl + 2 + len)?;
    Some(Bytes::copy_from_slice(body))
}

/// An absolute expiry in ms from a relative or absolute one in `unit` (1 or 1000).
fn absolute(value: i64, unit: i64, relative: bool, now_ms: u64) -> i64 {
    let ms = value.saturating_mul(unit);
    if relative {
        ms.saturating_add(now_ms as i64)
    } else {
        ms
    }
}

fn expire_effect(key: &Bytes, at: i64, now_ms: u64) -> Vec<Bytes> {
    if at <= now_ms as i64 {
        vec![word("DEL"), key.clone()]
    } else {
        vec![word("PEXPIREAT"), key.clone(), num(at)]
    }
}

/// What to log for a command that changed the data, when it is not its own words. `reply`
/// is the command's reply; `now_ms` the clock it ran with.
pub fn rewrite(name: &str, args: &[Bytes], now_ms: u64, reply: &[u8]) -> Option<Vec<Vec<Bytes>>> {
    let one = |v: Vec<Bytes>| Some(vec![v]);
    match name {
        // The common SET key value: nothing to rewrite.
        "set" if args.len() <= 3 => None,
        "set" => {
            let mut out = Vec::with_capacity(args.len());
            let mut changed = false;
            let mut i = 0;
            while i < args.len() {
                let a = &args[i];
                if i >= 3 && i + 1 < args.len() {
                    let unit_rel = if eq(a, "ex") {
                        Some((1000, true))
                    } else if eq(a, "px") {
                        Some((1, true))
                    } else if eq(a, "exat") {
                        Some((1000, false))
                    } else {
                        None
                    };
                    if let Some((unit, rel)) = unit_rel {
                        let v = int(&args[i + 1])?;
                        out.push(word("PXAT"));
                        out.push(num(absolute(v, unit, rel, now_ms)));
                        changed = true;
                        i += 2;
                        continue;
                    }
                }
                if i >= 3 && eq(a, "get") {
                    changed = true;
                    i += 1;
                    continue;
                }
                out.push(a.clone());
                i += 1;
            }
            changed.then(|| vec![out])
        }
        "setex" | "psetex" if args.len() == 4 => {
            let unit = if name == "setex" { 1000 } else { 1 };
            let at = absolute(int(&args[2])?, unit, true, now_ms);
            one(vec![
                word("SET"),
                args[1].clone(),
                args[3].clone(),
                word("PXAT"),
                num(at),
            ])
        }
        "expire" | "pexpire" | "expireat" | "pexpireat" if args.len() >= 3 => {
            let (unit, rel) = match name {
                "expire" => (1000, true),
                "pexpire" => (1, true),
                "expireat" => (1000, false),
                _ => (1, false),
            };
            let at = absolute(int(&args[2])?, unit, rel, now_ms);
            one(expire_effect(&args[1], at, now_ms))
        }
        "getex" if args.len() >= 3 => {
            let opt = &args[2];
            if eq(opt, "persist") {
                return one(vec![word("PERSIST"), args[1].clone()]);
            }
            let (unit, rel) = if eq(opt, "ex") {
                (1000, true)
            } else if eq(opt, "px") {
                (1, true)
            } else if eq(opt, "exat") {
                (1000, false)
            } else {
                (1, false)
            };
            let at = absolute(int(args.get(3)?)?, unit, rel, now_ms);
            one(expire_effect(&args[1], at, now_ms))
        }
        "getdel" => one(vec![word("DEL"), args[1].clone()]),
        "getset" if args.len() == 3 => one(vec![word("SET"), args[1].clone(), args[2].clone()]),
        "incrbyfloat" => {
            let v = reply_bulk(reply)?;
            one(vec![word("SET"), args[1].clone(), v, word("KEEPTTL")])
        }
        "hincrbyfloat" if args.len() == 4 => {
            let v = reply_bulk(reply)?;
            one(vec![word("HSET"), args[1].clone(), args[2].clone(), v])
        }
        "restore" if args.len() >= 4 => {
            let ttl = int(&args[2])?;
            let abs = args[4..].iter().any(|a| eq(a, "absttl"));
            if ttl == 0 || abs {
                return None;
            }
            let mut out = args.to_vec();
            out[2] = num(ttl.saturating_add(now_ms as i64));
            out.push(word("ABSTTL"));
            one(out)
        }
        "xadd" => {
            // The id the server chose in place of `*` or `ms-*`.
            let id = reply_bulk(reply)?;
            let pos = xadd_id_position(args)?;
            let mut out = args.to_vec();
            out[pos] = id;
            one(out)
        }
        _ => None,
    }
}

/// Where XADD's id argument sits: after the key and the NOMKSTREAM / MAXLEN / MINID /
/// LIMIT options.
fn xadd_id_position(args: &[Bytes]) -> Option<usize> {
    let mut i = 2;
    while i < args.len() {
        let a = &args[i];
        if eq(a, "nomkstream") {
            i += 1;
        } else if eq(a, "maxlen") || eq(a, "minid") {
            i += 1;
            if args
                .get(i)
                .is_some_and(|t| &t[..] == b"~" || &t[..] == b"=")
            {
                i += 1;
            }
            i += 1;
        } else if eq(a, "limit") {
            i += 2;
        } else {
            return Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(v: &[&str]) -> Vec<Bytes> {
        v.iter().map(|s| word(s)).collect()
    }

    #[test]
    fn relative_times_become_absolute() {
        let now = 1_000_000;
        let r = rewrite(
            "set",
            &b(&["SET", "k", "v", "EX", "10", "NX"]),
            now,
            b"+OK\r\n",
        )
        .unwrap();
        assert_eq!(r, vec![b(&["SET", "k", "v", "PXAT", "1010000", "NX"])]);
        assert!(rewrite("set", &b(&["SET", "k", "v"]), now, b"+OK\r\n").is_none());
        let r = rewrite("expire", &b(&["EXPIRE", "k", "5"]), now, b":1\r\n").unwrap();
        assert_eq!(r, vec![b(&["PEXPIREAT", "k", "1005000"])]);
        let r = rewrite("expire", &b(&["EXPIRE", "k", "-1"]), now, b":1\r\n").unwrap();
        assert_eq!(r, vec![b(&["DEL", "k"])]);
        let r = rewrite("setex", &b(&["SETEX", "k", "2", "v"]), now, b"+OK\r\n").unwrap();
        assert_eq!(r, vec![b(&["SET", "k", "v", "PXAT", "1002000"])]);
        let r = rewrite(
            "incrbyfloat",
            &b(&["INCRBYFLOAT", "k", "1.5"]),
            now,
            b"$3\r\n2.5\r\n",
        )
        .unwrap();
        assert_eq!(r, vec![b(&["SET", "k", "2.5", "KEEPTTL"])]);
        let r = rewrite(
            "xadd",
            &b(&["XADD", "s", "MAXLEN", "~", "10", "*", "f", "v"]),
            now,
            b"$3\r\n1-0\r\n",
        )
        .unwrap();
        assert_eq!(
            r,
            vec![b(&["XADD", "s", "MAXLEN", "~", "10", "1-0", "f", "v"])]
        );
    }
}
