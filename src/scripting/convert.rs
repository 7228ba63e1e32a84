//! Redis's conversion rules between replies and Lua values, both ways.
//!
//! Commands called from a script write their reply as RESP bytes, exactly as for a
//! client; those bytes are read back here into Lua values. A script's return value is
//! written as a reply following the same rules Redis 7 documents.

use mlua::{Lua, Table, Value};

use crate::protocol::reply::Reply;

/// Reads one RESP reply starting at `*pos` into a Lua value. An error reply becomes an
/// `{err=...}` table and sets `*is_error` (only at the top level, as Redis does).
pub fn resp_to_lua(
    lua: &Lua,
    buf: &[u8],
    pos: &mut usize,
    is_error: &mut bool,
) -> mlua::Result<Value> {
    let kind = buf[*pos];
    let line_end = find_crlf(buf, *pos + 1);
    let line = &buf[*pos + 1..line_end];
    *pos = line_end + 2;
    let v = match kind {
        b'+' => {
            let t = lua.create_table()?;
            t.raw_set("ok", lua.create_string(line)?)?;
            Value::Table(t)
        }
        b'-' => {
            *is_error = true;
            let t = lua.create_table()?;
            t.raw_set("err", lua.create_string(line)?)?;
            Value::Table(t)
        }
        b':' => Value::Number(parse_i64(line) as f64),
        b'$' => {
            let n = parse_i64(line);
            if n < 0 {
                Value::Boolean(false)
            } else {
                let n = n as usize;
                let s = lua.create_string(&buf[*pos..*pos + n])?;
                *pos += n + 2;
                Value::String(s)
            }
        }
        b'*' | b'~' | b'>' => {
            let n = parse_i64(line);
            if n < 0 {
                return Ok(Value::Boolean(false));
            }
            let items = lua.create_table_with_capacity(n as usize, 0)?;
            for i in 1..=n {
                let mut nested_err = false;
                let v = resp_to_lua(lua, buf, pos, &mut nested_err)?;
                if kind == b'~' {
                    items.raw_set(v, true)?;
                } else {
                    items.raw_set(i, v)?;
                }
            }
            if kind == b'~' {
                let t = lua.create_table()?;
                t.raw_set("set", items)?;
                Value::Table(t)
            } else {
                Value::Table(items)
            }
        }
        b'%' | b'|' => {
            let n = parse_i64(line);
            let map = lua.create_table()?;
            for _ in 0..n {
                let mut e = false;
                let k = resp_to_lua(lua, buf, pos, &mut e)?;
                let v = resp_to_lua(lua, buf, pos, &mut e)?;
                map.raw_set(k, v)?;
            }
            if kind == b'|' {
                // Attributes are dropped; the reply that follows is the value.
                return resp_to_lua(lua, buf, pos, is_error);
            }
            let t = lua.create_table()?;
            t.raw_set("map", map)?;
            Value::Table(t)
        }
        b'_' => Value::Nil,
        b'#' => Value::Boolean(line == b"t"),
        b',' => {
            let t = lua.create_table()?;
            let d = std::str::from_utf8(line)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or(f64::NAN);
            t.raw_set("double", d)?;
            Value::Table(t)
        }
        b'(' => {
            let t = lua.create_table()?;
            t.raw_set("big_number", lua.create_string(line)?)?;
            Value::Table(t)
        }
        b'=' => {
            let n = parse_i64(line) as usize;
            let body = &buf[*pos..*pos + n];
            *pos += n + 2;
            let t = lua.create_table()?;
            let inner = lua.create_table()?;
            inner.raw_set("format", lua.create_string(&body[..3.min(body.len())])?)?;
            inner.raw_set("string", lua.create_string(body.get(4..).unwrap_or(&[]))?)?;
            t.raw_set("verbatim_string", inner)?;
            Value::Table(t)
        }
        _ => Value::Nil,
    };
    Ok(v)
}

fn find_crlf(buf: &[u8], from: usize) -> usize {
    buf[from..]
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| p + from)
        .unwrap_or(buf.len())
}

fn parse_i64(s: &[u8]) -> i64 {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A Lua number as Redis casts it to an integer reply: truncation toward zero, with
/// what the C cast gives (the lowest integer) for values out of range and NaN.
pub fn lua_number_to_i64(n: f64) -> i64 {
    if n.is_nan() || n >= 9.223_372_036_854_775_807e18 || n < -9.223_372_036_854_775_808e18 {
        i64::MIN
    } else {
        n as i64
    }
}

/// Writes a script's result as a reply. `resp3_script` is the script's `redis.setresp`
/// choice, which decides how booleans convert.
pub fn lua_to_reply(v: &Value, out: &mut Reply, resp3_script: bool, depth: usize) {
    if depth > 1000 {
        out.error("ERR reached lua stack limit");
        return;
    }
    match v {
        Value::Nil => out.null(),
        Value::Boolean(b) => {
            if resp3_script {
                if out.resp3 {
                    out.raw(if *b { b"#t\r\n" } else { b"#f\r\n" });
                } else {
                    out.int(*b as i64);
                }
            } else if *b {
                out.int(1);
            } else {
                out.null();
            }
        }
        Value::Integer(i) => out.int(*i as i64),
        Value::Number(n) => out.int(lua_number_to_i64(*n)),
        Value::String(s) => out.bulk(&s.as_bytes()),
        Value::Table(t) => table_to_reply(t, out, resp3_script, depth),
        _ => out.null(),
    }
}

fn table_to_reply(t: &Table, out: &mut Reply, resp3_script: bool, depth: usize) {
    if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
        out.error_bytes(&e.as_bytes());
        return;
    }
    if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
        out.buf.extend_from_slice(b"+");
        for &b in s.as_bytes().iter() {
            out.buf
                .extend_from_slice(&[if b == b'\r' || b == b'\n' { b' ' } else { b }]);
        }
        out.buf.extend_from_slice(b"\r\n");
        return;
    }
    match t.raw_get::<Value>("double") {
        Ok(Value::Number(d)) => return out.double(d),
        Ok(Value::Integer(d)) => return out.double(d as f64),
        _ => {}
    }
    if let Ok(Value::String(s)) = t.raw_get::<Value>("big_number") {
        if out.resp3 {
            out.buf.extend_from_slice(b"(");
            out.buf.extend_from_slice(&s.as_bytes());
            out.buf.extend_from_slice(b"\r\n");
        } else {
            out.bulk(&s.as_bytes());
        }
        return;
    }
    if let Ok(Value::Table(m)) = t.raw_get::<Value>("map") {
        let pairs: Vec<(Value, Value)> = m.pairs::<Value, Value>().filter_map(Result::ok).collect();
        out.map(pairs.len());
        for (k, v) in &pairs {
            lua_to_reply(k, out, resp3_script, depth + 1);
            lua_to_reply(v, out, resp3_script, depth + 1);
        }
        return;
    }
    if let Ok(Value::Table(s)) = t.raw_get::<Value>("set") {
        let keys: Vec<Value> = s
            .pairs::<Value, Value>()
            .filter_map(Result::ok)
            .map(|(k, _)| k)
            .collect();
        out.set(keys.len());
        for k in &keys {
            lua_to_reply(k, out, resp3_script, depth + 1);
        }
        return;
    }
    if let Ok(Value::Table(v)) = t.raw_get::<Value>("verbatim_string") {
        let format: Option<mlua::String> = v.raw_get("format").ok();
        let string: Option<mlua::String> = v.raw_get("string").ok();
        if let (Some(f), Some(s)) = (format, string) {
            if out.resp3 {
                let f = f.as_bytes();
                let s = s.as_bytes();
                out.buf
                    .extend_from_slice(format!("={}\r\n", s.len() + 4).as_bytes());
                out.buf.extend_from_slice(&f);
                out.buf.extend_from_slice(b":");
                out.buf.extend_from_slice(&s);
                out.buf.extend_from_slice(b"\r\n");
            } else {
                out.bulk(&s.as_bytes());
            }
            return;
        }
    }
    // An array: elements 1, 2, ... up to the first nil.
    let mut items = Vec::new();
    let mut i = 1;
    loop {
        match t.raw_get::<Value>(i) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(v) => items.push(v),
        }
        i += 1;
    }
    out.array(items.len());
    for v in &items {
        lua_to_reply(v, out, resp3_script, depth + 1);
    }
}
