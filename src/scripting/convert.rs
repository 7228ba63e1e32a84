//! Redis's conversion rules between replies and Lua values, both ways.
//!
//! Commands called from a script write their reply as RESP bytes, exactly as for a
//! client; those bytes are read back here into Lua values. A script's return value is
//! written as a reply following the same rules Redis 7 documents.

use mlua::{Lua, Table, Value};

use crate::protocol::reply::Reply;

/// A Lua number as Redis casts it to an integer reply: truncation toward zero, with
/// what the C cast gives (the lowest integer) for values out of range and NaN.
pub fn lua_number_to_i64(n: f64) -> i64 {
    // 2^63 as a double; the range is [-2^63, 2^63).
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if n.is_nan() || !(-LIMIT..LIMIT).contains(&n) {
        i64::MIN
    } else {
        n as i64
    }
}

/// The fields that make a table result something other than an array, as Lua strings
/// made once per interpreter: looking a table up by a Rust `&str` makes (and interns) a
/// new Lua string in a protected call each time, seven times for an array result.
pub struct ReplyKeys {
    err: mlua::String,
    ok: mlua::String,
    double: mlua::String,
    big_number: mlua::String,
    map: mlua::String,
    set: mlua::String,
    verbatim_string: mlua::String,
}

impl ReplyKeys {
    pub fn new(lua: &Lua) -> mlua::Result<ReplyKeys> {
        Ok(ReplyKeys {
            err: lua.create_string("err")?,
            ok: lua.create_string("ok")?,
            double: lua.create_string("double")?,
            big_number: lua.create_string("big_number")?,
            map: lua.create_string("map")?,
            set: lua.create_string("set")?,
            verbatim_string: lua.create_string("verbatim_string")?,
        })
    }
}

/// Writes a script's result as a reply. `resp3_script` is the script's `redis.setresp`
/// choice, which decides how booleans convert.
pub fn lua_to_reply(
    v: &Value,
    out: &mut Reply,
    resp3_script: bool,
    depth: usize,
    keys: &ReplyKeys,
) {
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
        Value::Integer(i) => out.int(*i),
        Value::Number(n) => out.int(lua_number_to_i64(*n)),
        Value::String(s) => out.bulk(&s.as_bytes()),
        Value::Table(t) => table_to_reply(t, out, resp3_script, depth, keys),
        _ => out.null(),
    }
}

fn table_to_reply(t: &Table, out: &mut Reply, resp3_script: bool, depth: usize, k: &ReplyKeys) {
    if let Ok(Value::String(e)) = t.raw_get::<Value>(&k.err) {
        out.error_bytes(&e.as_bytes());
        return;
    }
    if let Ok(Value::String(s)) = t.raw_get::<Value>(&k.ok) {
        out.buf.extend_from_slice(b"+");
        for &b in s.as_bytes().iter() {
            out.buf
                .extend_from_slice(&[if b == b'\r' || b == b'\n' { b' ' } else { b }]);
        }
        out.buf.extend_from_slice(b"\r\n");
        return;
    }
    match t.raw_get::<Value>(&k.double) {
        Ok(Value::Number(d)) => return out.double(d),
        Ok(Value::Integer(d)) => return out.double(d as f64),
        _ => {}
    }
    if let Ok(Value::String(s)) = t.raw_get::<Value>(&k.big_number) {
        if out.resp3 {
            out.buf.extend_from_slice(b"(");
            out.buf.extend_from_slice(&s.as_bytes());
            out.buf.extend_from_slice(b"\r\n");
        } else {
            out.bulk(&s.as_bytes());
        }
        return;
    }
    if let Ok(Value::Table(m)) = t.raw_get::<Value>(&k.map) {
        let pairs: Vec<(Value, Value)> = m.pairs::<Value, Value>().filter_map(Result::ok).collect();
        out.map(pairs.len());
        for (key, v) in &pairs {
            lua_to_reply(key, out, resp3_script, depth + 1, k);
            lua_to_reply(v, out, resp3_script, depth + 1, k);
        }
        return;
    }
    if let Ok(Value::Table(s)) = t.raw_get::<Value>(&k.set) {
        let keys: Vec<Value> = s
            .pairs::<Value, Value>()
            .filter_map(Result::ok)
            .map(|(key, _)| key)
            .collect();
        out.set(keys.len());
        for key in &keys {
            lua_to_reply(key, out, resp3_script, depth + 1, k);
        }
        return;
    }
    if let Ok(Value::Table(v)) = t.raw_get::<Value>(&k.verbatim_string) {
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
        lua_to_reply(v, out, resp3_script, depth + 1, k);
    }
}

/// Pushes the RESP reply at `buf[*pos..]` onto the Lua stack as one value, following
/// Redis's rules (nil bulk -> false, status -> {ok=}, error -> {err=}, RESP3 types as
/// {map=}, {set=}, {double=}, {big_number=}, {verbatim_string=}). Works on the raw stack:
/// no Rust value with a destructor lives across these calls, so a Lua error (out of
/// memory) may unwind through them.
///
/// # Safety
/// `state` is a live Lua state in a C function, and `buf` holds complete RESP replies
/// written by Kite's own reply writer.
pub unsafe fn push_resp(state: *mut mlua::ffi::lua_State, buf: &[u8], pos: &mut usize) {
    use mlua::ffi;
    ffi::luaL_checkstack(state, 6, c"reply nested too deep".as_ptr());
    let kind = buf[*pos];
    let line_start = *pos + 1;
    let line_end = line_start
        + buf[line_start..]
            .iter()
            .position(|&b| b == b'\r')
            .unwrap_or(0);
    let line = &buf[line_start..line_end];
    *pos = line_end + 2;
    let push_str = |s: &[u8]| ffi::lua_pushlstring(state, s.as_ptr() as *const _, s.len());
    match kind {
        b'+' | b'-' => {
            ffi::lua_createtable(state, 0, 1);
            push_str(line);
            ffi::lua_setfield(
                state,
                -2,
                if kind == b'+' {
                    c"ok".as_ptr()
                } else {
                    c"err".as_ptr()
                },
            );
        }
        b':' => ffi::lua_pushnumber(state, parse_int(line) as f64),
        b'$' => {
            let n = parse_int(line);
            if n < 0 {
                ffi::lua_pushboolean(state, 0);
            } else {
                let n = n as usize;
                push_str(&buf[*pos..*pos + n]);
                *pos += n + 2;
            }
        }
        b'*' | b'>' => {
            let n = parse_int(line);
            if n < 0 {
                ffi::lua_pushboolean(state, 0);
            } else {
                ffi::lua_createtable(state, n as i32, 0);
                for i in 1..=n {
                    push_resp(state, buf, pos);
                    ffi::lua_rawseti(state, -2, i as _);
                }
            }
        }
        b'~' => {
            let n = parse_int(line);
            ffi::lua_createtable(state, 0, 1);
            ffi::lua_createtable(state, 0, n.max(0) as i32);
            for _ in 0..n {
                push_resp(state, buf, pos);
                ffi::lua_pushboolean(state, 1);
                ffi::lua_rawset(state, -3);
            }
            ffi::lua_setfield(state, -2, c"set".as_ptr());
        }
        b'%' => {
            let n = parse_int(line);
            ffi::lua_createtable(state, 0, 1);
            ffi::lua_createtable(state, 0, n.max(0) as i32);
            for _ in 0..n {
                push_resp(state, buf, pos);
                push_resp(state, buf, pos);
                ffi::lua_rawset(state, -3);
            }
            ffi::lua_setfield(state, -2, c"map".as_ptr());
        }
        b'|' => {
            // Attributes are dropped; the reply that follows is the value.
            let n = parse_int(line);
            for _ in 0..n * 2 {
                push_resp(state, buf, pos);
                ffi::lua_settop(state, -2);
            }
            push_resp(state, buf, pos);
        }
        b'_' => ffi::lua_pushnil(state),
        b'#' => ffi::lua_pushboolean(state, (line == b"t") as i32),
        b',' => {
            let d = std::str::from_utf8(line)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or(f64::NAN);
            ffi::lua_createtable(state, 0, 1);
            ffi::lua_pushnumber(state, d);
            ffi::lua_setfield(state, -2, c"double".as_ptr());
        }
        b'(' => {
            ffi::lua_createtable(state, 0, 1);
            push_str(line);
            ffi::lua_setfield(state, -2, c"big_number".as_ptr());
        }
        b'=' => {
            let n = parse_int(line).max(0) as usize;
            let body = &buf[*pos..*pos + n];
            *pos += n + 2;
            ffi::lua_createtable(state, 0, 1);
            ffi::lua_createtable(state, 0, 2);
            push_str(&body[..3.min(body.len())]);
            ffi::lua_setfield(state, -2, c"format".as_ptr());
            push_str(body.get(4..).unwrap_or(&[]));
            ffi::lua_setfield(state, -2, c"string".as_ptr());
            ffi::lua_setfield(state, -2, c"verbatim_string".as_ptr());
        }
        _ => ffi::lua_pushnil(state),
    }
}

fn parse_int(s: &[u8]) -> i64 {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    let mut v: i64 = 0;
    for &d in digits {
        v = v
            .wrapping_mul(10)
            .wrapping_add((d.wrapping_sub(b'0')) as i64);
    }
    if neg {
        v.wrapping_neg()
    } else {
        v
    }
}
