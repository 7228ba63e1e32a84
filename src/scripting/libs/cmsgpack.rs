//! `cmsgpack`: MessagePack with the behaviour of lua-cmsgpack 0.4.0 as
//! shipped in Redis 7.
//!
//! Encoding: integral numbers use the smallest integer format, other numbers
//! float32 when that is exact and float64 otherwise; strings always use the
//! str formats (fixstr/str8/16/32, never bin); a table whose keys are exactly
//! 1..n is an array, anything else a map; tables nested 16 deep, functions
//! and userdata become nil. Decoding accepts the formats the encoder writes
//! (plus signed/unsigned integers of every width) and rejects bin and ext.

use mlua::{Lua, MultiValue, Table, Value};

use super::{
    arg_error, double_to_int32, Args, LibError, LibResult, Results, Spine, Wrapper, LUA_MAX_C_STACK,
};

/// Tables nested deeper than this are packed as nil (guards against cycles).
const MAX_NESTING: usize = 16;

pub(super) fn module(lua: &Lua, wrap: &Wrapper) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("pack", wrap.one(lua, pack)?)?;
    t.raw_set(
        "unpack",
        wrap.many_with(
            lua,
            |lua, args| {
                let a = Args::new(lua, args, "unpack");
                unpack(&a, 0, 0)
            },
            unpack_fast,
        )?,
    )?;
    t.raw_set(
        "unpack_one",
        wrap.many(lua, |lua, args| {
            let a = Args::new(lua, args, "unpack_one");
            let offset = a.opt_integer(2, 0)?;
            unpack(&a, 1, offset as i32)
        })?,
    )?;
    t.raw_set(
        "unpack_limit",
        wrap.many(lua, |lua, args| {
            let a = Args::new(lua, args, "unpack_limit");
            let limit = a.integer(2)?;
            let offset = a.opt_integer(3, 0)?;
            unpack(&a, limit as i32, offset as i32)
        })?,
    )?;
    t.raw_set("_NAME", "cmsgpack")?;
    t.raw_set("_VERSION", "lua-cmsgpack 0.4.0")?;
    t.raw_set("_COPYRIGHT", "Copyright (C) 2012, Salvatore Sanfilippo")?;
    t.raw_set("_DESCRIPTION", "MessagePack C implementation for Lua")?;
    Ok(t)
}

// ---------------------------------------------------------------- unpack, fast path

/// Inputs the fast path takes: at most this many top-level values and this deep.
const FAST_MAX_VALUES: usize = 1000;
const FAST_MAX_DEPTH: usize = 64;

/// `cmsgpack.unpack(s)` for ordinary input (what job queues store: a map of options):
/// the input is checked in Rust first, then its values are built straight on the Lua
/// stack. Anything else (other arguments, malformed or extreme input) goes to the full
/// implementation (`lib_call` with the same upvalues), which reproduces Redis's errors
/// and limits.
unsafe extern "C-unwind" fn unpack_fast(state: *mut mlua::ffi::lua_State) -> std::os::raw::c_int {
    use mlua::ffi;
    if ffi::lua_gettop(state) == 1 && ffi::lua_type(state, 1) == ffi::LUA_TSTRING {
        let mut len = 0usize;
        let p = ffi::lua_tolstring(state, 1, &mut len) as *const u8;
        // The string stays on the stack, so the bytes stay put while we read them.
        let data = std::slice::from_raw_parts(p, len);
        if let Some(count) = fast_check(data) {
            ffi::luaL_checkstack(state, count as i32 + 8, c"too many results".as_ptr());
            let mut pos = 0;
            for _ in 0..count {
                fast_push(state, data, &mut pos);
            }
            return count as i32;
        }
    }
    super::lib_call(state)
}

/// The number of top-level values when every byte of `data` is well-formed input the
/// fast path handles (no nil or NaN map keys, bounded depth and count), else None.
fn fast_check(data: &[u8]) -> Option<usize> {
    fn skip(d: &[u8], pos: &mut usize, depth: usize, map_key: bool) -> Option<()> {
        if depth > FAST_MAX_DEPTH {
            return None;
        }
        let tag = *d.get(*pos)?;
        *pos += 1;
        let bytes = |n: usize, pos: &mut usize| -> Option<u64> {
            let s = d.get(*pos..*pos + n)?;
            *pos += n;
            Some(s.iter().fold(0u64, |a, &b| (a << 8) | b as u64))
        };
        let (items, pairs) = match tag {
            0xc0 if map_key => return None,
            0xc0 | 0xc2 | 0xc3 | 0x00..=0x7f | 0xe0..=0xff => return Some(()),
            0xcc..=0xcf => return bytes(1 << (tag - 0xcc), pos).map(|_| ()),
            0xd0..=0xd3 => return bytes(1 << (tag - 0xd0), pos).map(|_| ()),
            0xca => {
                let u = bytes(4, pos)?;
                return (!(map_key && f32::from_bits(u as u32).is_nan())).then_some(());
            }
            0xcb => {
                let u = bytes(8, pos)?;
                return (!(map_key && f64::from_bits(u).is_nan())).then_some(());
            }
            0xa0..=0xbf => {
                let n = (tag & 0x1f) as usize;
                return bytes(n, pos).map(|_| ()).or_else(|| (n == 0).then_some(()));
            }
            0xd9..=0xdb => {
                let n = bytes(1 << (tag - 0xd9), pos)? as usize;
                d.get(*pos..*pos + n)?;
                *pos += n;
                return Some(());
            }
            0x90..=0x9f => ((tag & 0x0f) as usize, false),
            0xdc => (bytes(2, pos)? as usize, false),
            0xdd => (bytes(4, pos)? as usize, false),
            0x80..=0x8f => ((tag & 0x0f) as usize, true),
            0xde => (bytes(2, pos)? as usize, true),
            0xdf => (bytes(4, pos)? as usize, true),
            _ => return None,
        };
        // Every element takes at least a byte: a count beyond the input is malformed.
        if items > d.len() - *pos {
            return None;
        }
        for _ in 0..items {
            if pairs {
                skip(d, pos, depth + 1, true)?;
            }
            skip(d, pos, depth + 1, false)?;
        }
        Some(())
    }
    let mut pos = 0;
    let mut count = 0;
    while pos < data.len() {
        skip(data, &mut pos, 0, false)?;
        count += 1;
        if count > FAST_MAX_VALUES {
            return None;
        }
    }
    Some(count)
}

/// Pushes the value at `data[*pos..]`, which `fast_check` found well-formed.
unsafe fn fast_push(state: *mut mlua::ffi::lua_State, data: &[u8], pos: &mut usize) {
    use mlua::ffi;
    ffi::luaL_checkstack(state, 4, c"nested too deep".as_ptr());
    let tag = data[*pos];
    *pos += 1;
    let mut uint = |n: usize| -> u64 {
        let v = data[*pos..*pos + n]
            .iter()
            .fold(0u64, |a, &b| (a << 8) | b as u64);
        *pos += n;
        v
    };
    match tag {
        0xc0 => ffi::lua_pushnil(state),
        0xc2 => ffi::lua_pushboolean(state, 0),
        0xc3 => ffi::lua_pushboolean(state, 1),
        0x00..=0x7f => ffi::lua_pushnumber(state, tag as f64),
        0xe0..=0xff => ffi::lua_pushnumber(state, tag as i8 as f64),
        0xcc..=0xce => ffi::lua_pushnumber(state, uint(1 << (tag - 0xcc)) as f64),
        // uint64 goes through a signed 64-bit integer in the C code.
        0xcf => ffi::lua_pushnumber(state, uint(8) as i64 as f64),
        0xd0..=0xd3 => {
            let width = 1usize << (tag - 0xd0);
            let shift = 64 - 8 * width;
            let u = uint(width);
            ffi::lua_pushnumber(state, (((u << shift) as i64) >> shift) as f64);
        }
        0xca => ffi::lua_pushnumber(state, f32::from_bits(uint(4) as u32) as f64),
        0xcb => ffi::lua_pushnumber(state, f64::from_bits(uint(8))),
        0xa0..=0xbf | 0xd9..=0xdb => {
            let n = if tag <= 0xbf {
                (tag & 0x1f) as usize
            } else {
                uint(1 << (tag - 0xd9)) as usize
            };
            let s = &data[*pos..*pos + n];
            *pos += n;
            ffi::lua_pushlstring(state, s.as_ptr() as *const _, n);
        }
        0x90..=0x9f | 0xdc | 0xdd => {
            let n = match tag {
                0xdc => uint(2) as usize,
                0xdd => uint(4) as usize,
                _ => (tag & 0x0f) as usize,
            };
            ffi::lua_createtable(state, n as i32, 0);
            for i in 1..=n {
                fast_push(state, data, pos);
                ffi::lua_rawseti(state, -2, i as _);
            }
        }
        _ => {
            let n = match tag {
                0xde => uint(2) as usize,
                0xdf => uint(4) as usize,
                _ => (tag & 0x0f) as usize,
            };
            ffi::lua_createtable(state, 0, n as i32);
            for _ in 0..n {
                fast_push(state, data, pos);
                fast_push(state, data, pos);
                ffi::lua_rawset(state, -3);
            }
        }
    }
}

// ---------------------------------------------------------------- packing

fn pack(lua: &Lua, args: MultiValue) -> LibResult<Value> {
    if args.is_empty() {
        return Err(arg_error(0, "pack", "MessagePack pack needs input."));
    }
    let mut out = Vec::new();
    for v in args.iter() {
        encode(&mut out, v, 0)?;
    }
    Ok(Value::String(lua.create_string(&out)?))
}

fn encode(out: &mut Vec<u8>, v: &Value, level: usize) -> LibResult<()> {
    match v {
        Value::String(s) => encode_bytes(out, &s.as_bytes()),
        Value::Boolean(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Value::Number(x) => encode_number(out, *x),
        Value::Integer(i) => encode_int(out, *i),
        Value::Table(t) if level < MAX_NESTING => encode_table(out, t, level)?,
        _ => out.push(0xc0),
    }
    Ok(())
}

fn encode_bytes(out: &mut Vec<u8>, s: &[u8]) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n <= 0xff {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s);
}

fn encode_number(out: &mut Vec<u8>, x: f64) {
    // Integral values that fit an int64 go out as integers (-0 as 0).
    let fits_i64 = (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&x);
    if fits_i64 && x.trunc() == x {
        encode_int(out, x as i64);
    } else if x == (x as f32) as f64 {
        out.push(0xca);
        out.extend_from_slice(&(x as f32).to_be_bytes());
    } else {
        out.push(0xcb);
        out.extend_from_slice(&x.to_be_bytes());
    }
}

fn encode_int(out: &mut Vec<u8>, n: i64) {
    if n >= 0 {
        if n <= 127 {
            out.push(n as u8);
        } else if n <= 0xff {
            out.extend_from_slice(&[0xcc, n as u8]);
        } else if n <= 0xffff {
            out.push(0xcd);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else if n <= 0xffff_ffff {
            out.push(0xce);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    } else if n >= -32 {
        out.push(n as i8 as u8);
    } else if n >= -128 {
        out.extend_from_slice(&[0xd0, n as i8 as u8]);
    } else if n >= -32768 {
        out.push(0xd1);
        out.extend_from_slice(&(n as i16).to_be_bytes());
    } else if n >= -2_147_483_648 {
        out.push(0xd2);
        out.extend_from_slice(&(n as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// Array when the keys are exactly 1..n (so the empty table too).
fn is_array(t: &Table) -> LibResult<bool> {
    let mut count: f64 = 0.0;
    let mut max: f64 = 0.0;
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let k = match k {
            Value::Number(x) => x,
            Value::Integer(i) => i as f64,
            _ => return Ok(false),
        };
        // The key must be a positive value that survives a C (int) cast.
        if k <= 0.0 || !k.is_finite() || double_to_int32(k) as f64 != k {
            return Ok(false);
        }
        max = max.max(k);
        count += 1.0;
    }
    Ok(max == count)
}

fn encode_table(out: &mut Vec<u8>, t: &Table, level: usize) -> LibResult<()> {
    if is_array(t)? {
        let len = t.raw_len();
        container_header(out, len, 0x90, 0xdc);
        for i in 1..=len {
            let v: Value = t.raw_get(i)?;
            encode(out, &v, level + 1)?;
        }
    } else {
        let mut len = 0;
        for pair in t.pairs::<Value, Value>() {
            pair?;
            len += 1;
        }
        container_header(out, len, 0x80, 0xde);
        for pair in t.pairs::<Value, Value>() {
            let (k, v) = pair?;
            encode(out, &k, level + 1)?;
            encode(out, &v, level + 1)?;
        }
    }
    Ok(())
}

/// fixarray/fixmap (`fix`), else the 16-bit (`wide`) or 32-bit form.
fn container_header(out: &mut Vec<u8>, len: usize, fix: u8, wide: u8) {
    if len <= 15 {
        out.push(fix | len as u8);
    } else if len <= 0xffff {
        out.push(wide);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(wide + 1);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

// ---------------------------------------------------------------- unpacking

/// Decodes up to `limit` values starting at byte `offset`. With neither
/// (the plain `unpack`) it decodes everything and returns just the values;
/// otherwise the next offset (-1 once the input is used up) comes first.
fn unpack(a: &Args, limit: i32, offset: i32) -> LibResult<Results> {
    let s = a.bytes(1)?;
    let data = s.as_bytes();
    let decode_all = limit == 0 && offset == 0;
    if offset < 0 || limit < 0 {
        // (The C code prints the input length where it means the limit.)
        return Err(LibError::At(format!(
            "Invalid request to unpack with offset of {offset} and limit of {}.",
            data.len() as i32
        )));
    }
    if offset as usize > data.len() {
        return Err(LibError::At(format!(
            "Start offset {offset} greater than input length {}.",
            data.len() as i32
        )));
    }
    let limit = if decode_all { i32::MAX } else { limit };
    let mut d = Decoder {
        lua: a.lua,
        data: &data,
        pos: offset as usize,
        // The C function's stack holds only the input string at this point.
        slots: 1,
        spine: Spine::new(a.lua)?,
    };
    let mut out = Results::new(a.lua)?;
    if !decode_all {
        out.push(Value::Nil)?; // the next offset goes here
    }
    let mut count: i32 = 0;
    while d.pos < data.len() && count < limit {
        let v = d.value()?;
        out.push(v)?;
        count += 1;
    }
    if !decode_all {
        let next = if d.pos == data.len() {
            -1
        } else {
            d.pos as i64
        };
        out.set(1, Value::Integer(next))?;
    }
    Ok(out)
}

struct Decoder<'a> {
    lua: &'a Lua,
    data: &'a [u8],
    pos: usize,
    /// Mirrors the Lua stack the C decoder would be using, so that inputs
    /// too long or too deep for it fail here too, with the same message.
    slots: usize,
    /// The arrays and maps being filled (their tables and pending keys).
    spine: Spine,
}

/// What one type byte (and its header) introduces.
enum Item {
    Value(Value),
    Array(usize),
    Map(usize),
}

/// An array or map being filled (its table and pending key are in the
/// spine, at the same level).
enum Open {
    Array { len: usize, next: usize },
    Map { left: usize, has_key: bool },
}

fn missing() -> LibError {
    LibError::At("Missing bytes in input.".into())
}

fn stack_overflow(what: &str) -> LibError {
    LibError::At(format!("stack overflow ({what})"))
}

impl<'a> Decoder<'a> {
    /// Fails unless `n` more bytes are available (consumes nothing).
    fn need(&self, n: usize) -> LibResult<()> {
        if self.data.len() - self.pos < n {
            return Err(missing());
        }
        Ok(())
    }

    fn take(&mut self, n: usize) -> LibResult<&'a [u8]> {
        self.need(n)?;
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// A big-endian unsigned integer of `n` bytes.
    fn uint(&mut self, n: usize) -> LibResult<u64> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | b as u64))
    }

    /// After the type byte, a header of `width` bytes then that many bytes.
    fn sized_string(&mut self, width: usize) -> LibResult<Item> {
        self.need(1 + width)?;
        let len = self.data[self.pos + 1..self.pos + 1 + width]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | b as usize);
        self.need(1 + width + len)?;
        self.pos += 1 + width;
        let s = self.take(len)?;
        Ok(Item::Value(Value::String(self.lua.create_string(s)?)))
    }

    /// After the type byte, a number of `width` bytes.
    fn number(&mut self, width: usize, convert: impl Fn(u64) -> f64) -> LibResult<Item> {
        self.need(1 + width)?;
        self.pos += 1;
        let u = self.uint(width)?;
        Ok(Item::Value(Value::Number(convert(u))))
    }

    /// After the type byte, a count of `width` bytes.
    fn count(&mut self, width: usize) -> LibResult<usize> {
        self.need(1 + width)?;
        self.pos += 1;
        Ok(self.uint(width)? as usize)
    }

    fn single(&mut self, v: Value) -> Item {
        self.pos += 1;
        Item::Value(v)
    }

    fn item(&mut self) -> LibResult<Item> {
        self.need(1)?;
        if self.slots + 1 > LUA_MAX_C_STACK {
            return Err(stack_overflow(
                "too many return values at once; use unpack_one or unpack_limit instead.",
            ));
        }
        let tag = self.data[self.pos];
        Ok(match tag {
            0xc0 => self.single(Value::Nil),
            0xc2 => self.single(Value::Boolean(false)),
            0xc3 => self.single(Value::Boolean(true)),
            0x00..=0x7f => self.single(Value::Number(tag as f64)),
            0xe0..=0xff => self.single(Value::Number(tag as i8 as f64)),
            0xcc..=0xce => self.number(1 << (tag - 0xcc), |u| u as f64)?,
            // uint64 goes through a signed 64-bit integer in the C code.
            0xcf => self.number(8, |u| u as i64 as f64)?,
            0xd0..=0xd3 => {
                let width = 1 << (tag - 0xd0);
                let shift = 64 - 8 * width;
                self.number(width, move |u| (((u << shift) as i64) >> shift) as f64)?
            }
            0xca => self.number(4, |u| f32::from_bits(u as u32) as f64)?,
            0xcb => self.number(8, f64::from_bits)?,
            0xa0..=0xbf => {
                let len = (tag & 0x1f) as usize;
                self.need(1 + len)?;
                self.pos += 1;
                let s = self.take(len)?;
                Item::Value(Value::String(self.lua.create_string(s)?))
            }
            0xd9 => self.sized_string(1)?,
            0xda => self.sized_string(2)?,
            0xdb => self.sized_string(4)?,
            0x90..=0x9f => {
                self.pos += 1;
                Item::Array((tag & 0x0f) as usize)
            }
            0xdc => Item::Array(self.count(2)?),
            0xdd => Item::Array(self.count(4)?),
            0x80..=0x8f => {
                self.pos += 1;
                Item::Map((tag & 0x0f) as usize)
            }
            0xde => Item::Map(self.count(2)?),
            0xdf => Item::Map(self.count(4)?),
            _ => return Err(LibError::At("Bad data format in input.".into())),
        })
    }

    /// Decodes one complete value, leaving it counted in `slots`. Nesting
    /// uses an explicit stack, so deep input cannot exhaust the Rust stack.
    /// The innermost container (table and pending map key) is held in
    /// `top`; outer ones wait in the spine.
    fn value(&mut self) -> LibResult<Value> {
        let mut stack: Vec<Open> = Vec::new();
        let mut top: Option<(Table, Value)> = None;
        loop {
            let (t, open) = match self.item()? {
                Item::Value(v) => {
                    self.slots += 1;
                    match self.store(v, &mut stack, &mut top)? {
                        Some(done) => return Ok(done),
                        None => continue,
                    }
                }
                Item::Array(len) => {
                    let t = self.lua.create_table()?;
                    self.slots += 1;
                    if self.slots + 1 > LUA_MAX_C_STACK {
                        return Err(stack_overflow("in function mp_decode_to_lua_array"));
                    }
                    if len == 0 {
                        match self.store(Value::Table(t), &mut stack, &mut top)? {
                            Some(done) => return Ok(done),
                            None => continue,
                        }
                    }
                    self.slots += 1; // the index of the first element
                    (t, Open::Array { len, next: 1 })
                }
                Item::Map(len) => {
                    let t = self.lua.create_table()?;
                    if len == 0 {
                        self.slots += 1;
                        match self.store(Value::Table(t), &mut stack, &mut top)? {
                            Some(done) => return Ok(done),
                            None => continue,
                        }
                    }
                    self.slots += 1;
                    (
                        t,
                        Open::Map {
                            left: len,
                            has_key: false,
                        },
                    )
                }
            };
            // A non-empty container opens: park the enclosing one's key.
            if let Some((_, key)) = top.take() {
                self.spine.set_key(stack.len(), key)?;
            }
            stack.push(open);
            self.spine.set_table(stack.len(), t.clone())?;
            top = Some((t, Value::Nil));
        }
    }

    /// Stores the complete value `v` (already counted in `slots`) in the
    /// innermost container, closing containers that become full. Returns
    /// the top-level value once nothing is left open.
    fn store(
        &mut self,
        mut v: Value,
        stack: &mut Vec<Open>,
        top: &mut Option<(Table, Value)>,
    ) -> LibResult<Option<Value>> {
        loop {
            let level = stack.len();
            let Some(open) = stack.last_mut() else {
                return Ok(Some(v));
            };
            let (t, key) = top.as_mut().expect("top is the innermost open container");
            match open {
                Open::Array { len, next } => {
                    t.raw_set(*next, v)?;
                    self.slots -= 2; // value and index
                    if *next < *len {
                        *next += 1;
                        self.slots += 1;
                        return Ok(None);
                    }
                }
                Open::Map { left, has_key } => {
                    if !*has_key {
                        // The key waits (on the stack, in C) for its value.
                        *key = v;
                        *has_key = true;
                        return Ok(None);
                    }
                    let k = std::mem::replace(key, Value::Nil);
                    match &k {
                        Value::Nil => return Err(LibError::Bare("table index is nil".into())),
                        Value::Number(x) if x.is_nan() => {
                            return Err(LibError::Bare("table index is NaN".into()))
                        }
                        _ => {}
                    }
                    t.raw_set(k, v)?;
                    *has_key = false;
                    self.slots -= 2;
                    *left -= 1;
                    if *left > 0 {
                        return Ok(None);
                    }
                }
            }
            // The container is complete: it becomes the value (its table
            // slot now counts as the value's slot).
            stack.pop();
            let (t, _) = top.take().expect("closed container");
            v = Value::Table(t);
            if level > 1 {
                *top = Some((self.spine.table(level - 1)?, self.spine.key(level - 1)?));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{err, eval, lua};

    const HEX: &str = "local function hx(s) return (s:gsub('.', function(c) return string.format('%02x', c:byte()) end)) end ";
    const SHOW: &str = "local function s(...) local t = {} for i = 1, select('#', ...) do t[i] = tostring((select(i, ...))) end return table.concat(t, ',') end ";

    #[test]
    fn pack_matches_redis() {
        let l = lua();
        let cases = [
            (
                "1, -1, 127, 128, 255, 256, 65535, 65536, 2^32-1, 2^32, -32, -33, -128, -129, -32768, -32769, -2^31, -2^31-1",
                "01ff7fcc80ccffcd0100cdffffce00010000ceffffffffcf0000000100000000e0d0dfd080d1ff7fd18000d2ffff7fffd280000000d3ffffffff7fffffff",
            ),
            (
                "0.5, 0.1, 1/0, -1/0, 2^63, -2^63, 2^64, 1e300, -0.0",
                "ca3f000000cb3fb999999999999aca7f800000caff800000ca5f000000d38000000000000000ca5f800000cb7e37e43c8800759c00",
            ),
            ("2^63+2048", "cb43e0000000000001"),
            ("-2^63-2048", "cbc3e0000000000001"),
            ("2^62", "cf4000000000000000"),
            ("1e19", "cb43e158e460913d00"),
            ("nil, true, false, 'abc', {}, {1,2}, {a=1}, function() end", "c0c3c2a36162639092010281a16101c0"),
            ("{1,2,nil,4}", "83010102020404"),
            ("{[1.5]=1}", "81ca3fc0000001"),
        ];
        for (args, want) in cases {
            let code = format!("{HEX}return hx(cmsgpack.pack({args}))");
            assert_eq!(eval(&l, &code), want, "{args}");
        }
        let prefixes = [
            ("string.rep('x',31)", "bf78"),
            ("string.rep('x',32)", "d92078"),
            ("string.rep('x',256)", "da010078"),
            ("string.rep('x',65536)", "db0001000078"),
            (
                "(function() local t={} for i=1,16 do t[i]=i end return t end)()",
                "dc00100102",
            ),
            (
                "(function() local t={} for i=1,16 do t['k'..i]=i end return t end)()",
                "de0010a",
            ),
        ];
        for (arg, want) in prefixes {
            let code = format!("{HEX}return hx(cmsgpack.pack({arg}))");
            assert!(eval(&l, &code).starts_with(want), "{arg}");
        }
        // Tables nested 16 deep become nil (cycles terminate the same way).
        assert_eq!(
            eval(&l, &format!("{HEX}local t={{}} local c=t for i=1,20 do c[1]={{}} c=c[1] end return hx(cmsgpack.pack(t))")),
            format!("{}c0", "91".repeat(16))
        );
        assert_eq!(
            eval(
                &l,
                &format!("{HEX}local t={{}} t[1]=t return hx(cmsgpack.pack(t))")
            ),
            format!("{}c0", "91".repeat(16))
        );
        assert_eq!(
            err(&l, "cmsgpack.pack()"),
            "user_script:1: bad argument #0 to 'pack' (MessagePack pack needs input.)"
        );
    }

    #[test]
    fn unpack_matches_redis() {
        let l = lua();
        let cases = [
            ("cmsgpack.unpack(cmsgpack.pack(1,'a',{1,2},{a=3}))", "1,a,table,table"),
            ("cmsgpack.unpack(cmsgpack.pack(1,nil,3))", "1,nil,3"),
            ("cmsgpack.unpack_one(cmsgpack.pack(1,2,3))", "1,1"),
            ("cmsgpack.unpack_one(cmsgpack.pack(1,2,3), 1)", "2,2"),
            ("cmsgpack.unpack_one(cmsgpack.pack(1,2,3), 2)", "-1,3"),
            ("cmsgpack.unpack_one(cmsgpack.pack(1,2,3), 3)", "-1"),
            ("cmsgpack.unpack_limit(cmsgpack.pack(1,2,3), 2)", "2,1,2"),
            ("cmsgpack.unpack_limit(cmsgpack.pack(1,2,3), 0)", "1,2,3"),
            ("cmsgpack.unpack_limit(cmsgpack.pack(1,2,3), 0, 1)", "1"),
            ("cmsgpack.unpack_limit(cmsgpack.pack(1,2,3), 5, 1)", "-1,2,3"),
            ("cmsgpack.unpack('')", ""),
            ("cmsgpack.unpack_one('')", "-1"),
            ("cmsgpack.unpack(5)", "53"),
            ("cmsgpack.unpack('\\207\\255\\255\\255\\255\\255\\255\\255\\255')", "-1"),
            ("cmsgpack.unpack('\\207\\128\\0\\0\\0\\0\\0\\0\\0')", "-9.2233720368548e+18"),
            ("cmsgpack.unpack('\\211\\128\\0\\0\\0\\0\\0\\0\\0')", "-9.2233720368548e+18"),
            ("cmsgpack.unpack('\\202\\63\\192\\0\\0')", "1.5"),
            ("cmsgpack.unpack('\\217\\2ab')", "ab"),
            ("cmsgpack.unpack('\\208\\128\\209\\255\\254\\210\\255\\255\\255\\253\\204\\200\\205\\1\\0\\206\\0\\1\\0\\0\\224')", "-128,-2,-3,200,256,65536,-32"),
            ("#cmsgpack.unpack('\\148\\1\\192\\3\\192')", "1"),
            ("cmsgpack.unpack(cmsgpack.pack({a={b={1,2.5,'x'}}})).a.b[2]", "2.5"),
            ("select('#', cmsgpack.unpack(string.rep('\\1', 7999)))", "7999"),
            ("select('#', cmsgpack.unpack(string.rep('\\161a', 7999)))", "7999"),
            ("select(7999, cmsgpack.unpack(string.rep('\\161a', 7999)))", "a"),
            ("#cmsgpack.unpack(string.rep('\\129\\1', 3999)..'\\1')", "1"),
            ("#cmsgpack.unpack(string.rep('\\145', 3999)..'\\1')", "1"),
        ];
        for (code, want) in cases {
            let code = format!("{SHOW}return s({code})");
            let code = code.replace("s(cmsgpack.unpack(cmsgpack.pack(1,'a'", "s((function(...) local t = {...} for i = 1, #t do if type(t[i]) == 'table' then t[i] = 'table' end end return unpack(t) end)(cmsgpack.unpack(cmsgpack.pack(1,'a'");
            let code = if code.contains("'table'") {
                format!("{code})")
            } else {
                code
            };
            assert_eq!(eval(&l, &code), want, "{code}");
        }
        let errors = [
            ("cmsgpack.unpack_one(cmsgpack.pack(1,2,3), 4)", "user_script:1: Start offset 4 greater than input length 3."),
            ("cmsgpack.unpack_one(cmsgpack.pack(1,2,3), -1)", "user_script:1: Invalid request to unpack with offset of -1 and limit of 3."),
            ("cmsgpack.unpack_limit(cmsgpack.pack(1,2,3), -1)", "user_script:1: Invalid request to unpack with offset of 0 and limit of 3."),
            ("cmsgpack.unpack_limit(cmsgpack.pack(1,2,3))", "user_script:1: bad argument #2 to 'unpack_limit' (number expected, got no value)"),
            ("cmsgpack.unpack('\\205\\1')", "user_script:1: Missing bytes in input."),
            ("cmsgpack.unpack('\\146\\1')", "user_script:1: Missing bytes in input."),
            ("cmsgpack.unpack('\\217\\5ab')", "user_script:1: Missing bytes in input."),
            ("cmsgpack.unpack('\\193')", "user_script:1: Bad data format in input."),
            ("cmsgpack.unpack('\\196\\1a')", "user_script:1: Bad data format in input."),
            ("cmsgpack.unpack('\\129\\192\\1')", "table index is nil"),
            ("cmsgpack.unpack()", "user_script:1: bad argument #1 to 'unpack' (string expected, got no value)"),
            ("cmsgpack.unpack({})", "user_script:1: bad argument #1 to 'unpack' (string expected, got table)"),
            ("cmsgpack.unpack(string.rep('\\1', 8000))", "user_script:1: stack overflow (too many return values at once; use unpack_one or unpack_limit instead.)"),
            ("cmsgpack.unpack(string.rep('\\145', 4000)..'\\1')", "user_script:1: stack overflow (in function mp_decode_to_lua_array)"),
            ("cmsgpack.unpack(string.rep('\\129\\1', 4000)..'\\1')", "user_script:1: stack overflow (too many return values at once; use unpack_one or unpack_limit instead.)"),
        ];
        for (code, want) in errors {
            assert_eq!(err(&l, code), want, "{code}");
        }
    }
}
