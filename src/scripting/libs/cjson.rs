//! `cjson`: JSON encode/decode with the behaviour of lua-cjson 2.1.0 as
//! shipped in Redis 7 (same output, same settings, same error texts).

use std::cell::Cell;
use std::rc::Rc;

use mlua::{Function, LightUserData, Lua, MultiValue, Table, Value};

use super::{
    arg_error, double_to_int32, format_g, strtod_prefix, type_name, Args, LibError, LibResult,
    Results, Spine, Wrapper, LUA_MAX_C_STACK,
};

/// What `encode` does with NaN and infinities.
#[derive(Clone, Copy, PartialEq)]
enum InvalidNumbers {
    /// Refuse them (the default).
    Off,
    /// Write `nan`, `inf`, `-inf`.
    On,
    /// Write `null`.
    Null,
}

/// The settings of one cjson instance (`cjson` itself or one `cjson.new()`).
#[derive(Clone, Copy)]
struct Config {
    sparse_convert: bool,
    sparse_ratio: i32,
    sparse_safe: i32,
    encode_max_depth: i32,
    decode_max_depth: i32,
    encode_invalid: InvalidNumbers,
    decode_invalid: bool,
    keep_buffer: bool,
    precision: i32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            sparse_convert: false,
            sparse_ratio: 2,
            sparse_safe: 10,
            encode_max_depth: 1000,
            decode_max_depth: 1000,
            encode_invalid: InvalidNumbers::Off,
            decode_invalid: true,
            keep_buffer: true,
            precision: 14,
        }
    }
}

type Shared = Rc<Cell<Config>>;

/// The value `cjson.null` (a NULL light userdata, as in C).
fn null() -> Value {
    Value::LightUserData(LightUserData(std::ptr::null_mut()))
}

/// Builds one cjson module table with its own settings.
pub(super) fn module(lua: &Lua, wrap: &Wrapper) -> mlua::Result<Table> {
    let cfg: Shared = Rc::new(Cell::new(Config::default()));
    let t = lua.create_table()?;

    let c = cfg.clone();
    let next: Function = lua.globals().raw_get("next")?;
    t.raw_set(
        "encode",
        wrap.one(lua, move |lua, args| encode(lua, &c.get(), &next, args))?,
    )?;
    let c = cfg.clone();
    t.raw_set(
        "decode",
        wrap.one(lua, move |lua, args| decode(lua, &c.get(), args))?,
    )?;

    let c = cfg.clone();
    t.raw_set(
        "encode_sparse_array",
        wrap.many(lua, move |lua, args| {
            let a = Args::new(lua, args, "encode_sparse_array");
            let mut cfg = c.get();
            max_args(&a, 3)?;
            let mut convert = cfg.sparse_convert as u8;
            let r1 = enum_option(&a, 1, &mut convert, &["off", "on"], true)?;
            let r2 = integer_option(&a, 2, &mut cfg.sparse_ratio, 0, i32::MAX)?;
            let r3 = integer_option(&a, 3, &mut cfg.sparse_safe, 0, i32::MAX)?;
            cfg.sparse_convert = convert != 0;
            c.set(cfg);
            let mut out = Results::new(lua)?;
            for r in [r1, r2, r3] {
                out.push(r)?;
            }
            Ok(out)
        })?,
    )?;

    int_setting(lua, wrap, &t, &cfg, "encode_max_depth", 1, i32::MAX, |c| {
        &mut c.encode_max_depth
    })?;
    int_setting(lua, wrap, &t, &cfg, "decode_max_depth", 1, i32::MAX, |c| {
        &mut c.decode_max_depth
    })?;
    int_setting(lua, wrap, &t, &cfg, "encode_number_precision", 1, 14, |c| {
        &mut c.precision
    })?;

    let c = cfg.clone();
    t.raw_set(
        "encode_keep_buffer",
        wrap.one(lua, move |lua, args| {
            let a = Args::new(lua, args, "encode_keep_buffer");
            max_args(&a, 1)?;
            let mut cfg = c.get();
            let mut v = cfg.keep_buffer as u8;
            let r = enum_option(&a, 1, &mut v, &["off", "on"], true)?;
            cfg.keep_buffer = v != 0;
            c.set(cfg);
            Ok(r)
        })?,
    )?;

    let c = cfg.clone();
    t.raw_set(
        "encode_invalid_numbers",
        wrap.one(lua, move |lua, args| {
            let a = Args::new(lua, args, "encode_invalid_numbers");
            max_args(&a, 1)?;
            let mut cfg = c.get();
            let mut v = cfg.encode_invalid as u8;
            let r = enum_option(&a, 1, &mut v, &["off", "on", "null"], true)?;
            cfg.encode_invalid = match v {
                0 => InvalidNumbers::Off,
                1 => InvalidNumbers::On,
                _ => InvalidNumbers::Null,
            };
            c.set(cfg);
            Ok(r)
        })?,
    )?;

    let c = cfg.clone();
    t.raw_set(
        "decode_invalid_numbers",
        wrap.one(lua, move |lua, args| {
            let a = Args::new(lua, args, "decode_invalid_numbers");
            max_args(&a, 1)?;
            let mut cfg = c.get();
            let mut v = cfg.decode_invalid as u8;
            let r = enum_option(&a, 1, &mut v, &["off", "on"], true)?;
            cfg.decode_invalid = v != 0;
            c.set(cfg);
            Ok(r)
        })?,
    )?;

    let w = wrap.clone();
    t.raw_set(
        "new",
        wrap.one(lua, move |lua, _| Ok(Value::Table(module(lua, &w)?)))?,
    )?;
    t.raw_set("null", null())?;
    t.raw_set("_NAME", "cjson")?;
    t.raw_set("_VERSION", "2.1.0")?;
    Ok(t)
}

/// Installs a setting function that takes one optional integer in `min..=max`.
#[allow(clippy::too_many_arguments)]
fn int_setting(
    lua: &Lua,
    wrap: &Wrapper,
    t: &Table,
    cfg: &Shared,
    name: &'static str,
    min: i32,
    max: i32,
    field: fn(&mut Config) -> &mut i32,
) -> mlua::Result<()> {
    let c = cfg.clone();
    let f = wrap.one(lua, move |lua, args| {
        let a = Args::new(lua, args, name);
        max_args(&a, 1)?;
        let mut cfg = c.get();
        let r = integer_option(&a, 1, field(&mut cfg), min, max)?;
        c.set(cfg);
        Ok(r)
    })?;
    t.raw_set(name, f)
}

fn max_args(a: &Args, n: usize) -> LibResult<()> {
    if a.len() > n {
        return Err(arg_error(n + 1, a.fname, "found too many arguments"));
    }
    Ok(())
}

/// An integer setting: nil leaves it alone; the current value is returned.
/// (The range error always names argument 1, as lua-cjson does.)
fn integer_option(a: &Args, n: usize, setting: &mut i32, min: i32, max: i32) -> LibResult<Value> {
    if !a.is_none_or_nil(n) {
        let value = a.integer(n)? as i32;
        if value < min || value > max {
            return Err(arg_error(
                1,
                a.fname,
                format!("expected integer between {min} and {max}"),
            ));
        }
        *setting = value;
    }
    Ok(Value::Integer(*setting as i64))
}

/// A setting chosen by name from `options` (or by boolean when `bools`):
/// reported back as a boolean for off/on and by name otherwise.
fn enum_option(
    a: &Args,
    n: usize,
    setting: &mut u8,
    options: &[&str],
    bools: bool,
) -> LibResult<Value> {
    if !a.is_none_or_nil(n) {
        match a.get(n) {
            Some(Value::Boolean(b)) if bools => *setting = *b as u8,
            _ => {
                let s = a.bytes(n)?;
                let s = s.as_bytes();
                match options.iter().position(|o| o.as_bytes() == &s[..]) {
                    Some(i) => *setting = i as u8,
                    None => {
                        return Err(arg_error(
                            n,
                            a.fname,
                            format!("invalid option '{}'", String::from_utf8_lossy(&s)),
                        ))
                    }
                }
            }
        }
    }
    if bools && *setting <= 1 {
        Ok(Value::Boolean(*setting == 1))
    } else {
        Ok(Value::String(
            a.lua.create_string(options[*setting as usize])?,
        ))
    }
}

// ---------------------------------------------------------------- encoding

fn encode(lua: &Lua, cfg: &Config, next: &Function, args: MultiValue) -> LibResult<Value> {
    let a = Args::new(lua, args, "encode");
    if a.len() != 1 {
        return Err(arg_error(1, "encode", "expected 1 argument"));
    }
    let mut enc = Encoder {
        cfg,
        out: Vec::new(),
        next,
    };
    enc.encode(lua, &a.vals[0])?;
    Ok(Value::String(lua.create_string(&enc.out)?))
}

struct Encoder<'a> {
    cfg: &'a Config,
    out: Vec<u8>,
    /// Lua's `next`, to walk objects in the same order as the C encoder.
    next: &'a Function,
}

fn cannot_serialise(what: &str, why: &str) -> LibError {
    LibError::At(format!("Cannot serialise {what}: {why}"))
}

/// A table being written (the table itself, and for an object the last
/// key visited, are in the spine at the same level).
enum OpenTable {
    Array { len: i32, next: i32 },
    Object { first: bool },
}

impl OpenTable {
    /// Lua stack slots the C encoder holds for this level (the array
    /// element, or the key and value being visited).
    fn slots(&self) -> usize {
        match self {
            OpenTable::Array { .. } => 1,
            OpenTable::Object { .. } => 2,
        }
    }
}

impl Encoder<'_> {
    /// Appends `root`. Nesting is handled with an explicit stack (depth can
    /// reach several thousand when the limit is raised), and `slots`
    /// mirrors the Lua stack the C encoder would use, which bounds depth the
    /// same way it does there.
    fn encode(&mut self, lua: &Lua, root: &Value) -> LibResult<()> {
        let spine = Spine::new(lua)?;
        let mut stack: Vec<OpenTable> = Vec::new();
        let mut slots: usize = 1;
        let mut current = root.clone();
        loop {
            match current {
                Value::Table(t) => {
                    let depth = stack.len() as i32 + 1;
                    if depth > self.cfg.encode_max_depth || slots + 3 > LUA_MAX_C_STACK {
                        return Err(LibError::At(format!(
                            "Cannot serialise, excessive nesting ({depth})"
                        )));
                    }
                    let open = match self.array_length(&t)? {
                        Some(len) if len > 0 => {
                            self.out.push(b'[');
                            OpenTable::Array { len, next: 1 }
                        }
                        _ => {
                            self.out.push(b'{');
                            OpenTable::Object { first: true }
                        }
                    };
                    slots += open.slots();
                    stack.push(open);
                    spine.set_table(stack.len(), t)?;
                }
                other => self.scalar(&other)?,
            }
            // Move on to the next value to write, closing finished tables.
            loop {
                let level = stack.len();
                let Some(top) = stack.last_mut() else {
                    return Ok(());
                };
                match top {
                    OpenTable::Array { len, next } => {
                        if *next <= *len {
                            if *next > 1 {
                                self.out.push(b',');
                            }
                            current = spine.table(level)?.raw_get(*next)?;
                            *next += 1;
                            break;
                        }
                        self.out.push(b']');
                    }
                    OpenTable::Object { first } => {
                        let t = spine.table(level)?;
                        let after = spine.key(level)?;
                        let (k, v): (Value, Value) = self.next.call((t, after))?;
                        if !k.is_nil() {
                            if !*first {
                                self.out.push(b',');
                            }
                            *first = false;
                            self.key(&k)?;
                            spine.set_key(level, k)?;
                            current = v;
                            break;
                        }
                        self.out.push(b'}');
                    }
                }
                let done = stack.pop().expect("non-empty");
                slots -= done.slots();
            }
        }
    }

    fn scalar(&mut self, v: &Value) -> LibResult<()> {
        match v {
            Value::String(s) => self.string(&s.as_bytes()),
            Value::Number(x) => self.number(*x)?,
            Value::Integer(i) => self.number(*i as f64)?,
            Value::Boolean(true) => self.out.extend_from_slice(b"true"),
            Value::Boolean(false) => self.out.extend_from_slice(b"false"),
            Value::Nil => self.out.extend_from_slice(b"null"),
            Value::LightUserData(p) if p.0.is_null() => self.out.extend_from_slice(b"null"),
            other => {
                return Err(cannot_serialise(
                    type_name(Some(other)),
                    "type not supported",
                ))
            }
        }
        Ok(())
    }

    /// An object key and its colon.
    fn key(&mut self, k: &Value) -> LibResult<()> {
        match k {
            Value::Number(_) | Value::Integer(_) => {
                let x = match k {
                    Value::Integer(i) => *i as f64,
                    Value::Number(x) => *x,
                    _ => unreachable!(),
                };
                self.out.push(b'"');
                self.number(x)?;
                self.out.extend_from_slice(b"\":");
            }
            Value::String(s) => {
                self.string(&s.as_bytes());
                self.out.push(b':');
            }
            other => {
                return Err(cannot_serialise(
                    type_name(Some(other)),
                    "table key must be a number or string",
                ))
            }
        }
        Ok(())
    }

    fn number(&mut self, x: f64) -> LibResult<()> {
        if !x.is_finite() {
            match self.cfg.encode_invalid {
                InvalidNumbers::Off => {
                    return Err(cannot_serialise("number", "must not be NaN or Inf"))
                }
                InvalidNumbers::Null => {
                    self.out.extend_from_slice(b"null");
                    return Ok(());
                }
                InvalidNumbers::On if x.is_nan() => {
                    self.out.extend_from_slice(b"nan");
                    return Ok(());
                }
                InvalidNumbers::On => {}
            }
        }
        self.out
            .extend_from_slice(format_g(x, self.cfg.precision).as_bytes());
        Ok(())
    }

    fn string(&mut self, s: &[u8]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        self.out.reserve(s.len() + 2);
        self.out.push(b'"');
        for &b in s {
            match b {
                b'"' => self.out.extend_from_slice(b"\\\""),
                b'\\' => self.out.extend_from_slice(b"\\\\"),
                b'/' => self.out.extend_from_slice(b"\\/"),
                b'\n' => self.out.extend_from_slice(b"\\n"),
                b'\r' => self.out.extend_from_slice(b"\\r"),
                b'\t' => self.out.extend_from_slice(b"\\t"),
                0x08 => self.out.extend_from_slice(b"\\b"),
                0x0c => self.out.extend_from_slice(b"\\f"),
                0..=0x1f | 0x7f => {
                    self.out.extend_from_slice(b"\\u00");
                    self.out.push(HEX[(b >> 4) as usize]);
                    self.out.push(HEX[(b & 15) as usize]);
                }
                _ => self.out.push(b),
            }
        }
        self.out.push(b'"');
    }

    /// `Some(n)` when the table's keys are all positive integers (n is the
    /// largest, 0 for an empty table); `None` when it must be an object.
    fn array_length(&self, t: &Table) -> LibResult<Option<i32>> {
        let mut max: i32 = 0;
        let mut items: i32 = 0;
        for pair in t.pairs::<Value, Value>() {
            let (k, _) = pair?;
            let k = match k {
                Value::Number(x) => x,
                Value::Integer(i) => i as f64,
                _ => return Ok(None),
            };
            if k != 0.0 && k.floor() == k && k >= 1.0 {
                // The C code keeps the maximum in an int.
                if k > max as f64 {
                    max = double_to_int32(k);
                }
                items = items.wrapping_add(1);
                continue;
            }
            return Ok(None);
        }
        let cfg = self.cfg;
        if cfg.sparse_ratio > 0
            && max > items.wrapping_mul(cfg.sparse_ratio)
            && max > cfg.sparse_safe
        {
            if !cfg.sparse_convert {
                return Err(cannot_serialise("table", "excessively sparse array"));
            }
            return Ok(None);
        }
        Ok(Some(max))
    }
}

// ---------------------------------------------------------------- decoding

fn decode(lua: &Lua, cfg: &Config, args: MultiValue) -> LibResult<Value> {
    let a = Args::new(lua, args, "decode");
    if a.len() != 1 {
        return Err(arg_error(1, "decode", "expected 1 argument"));
    }
    let text = a.bytes(1)?;
    let data = text.as_bytes();
    if data.len() >= 2 && (data[0] == 0 || data[1] == 0) {
        return Err(LibError::At(
            "JSON parser does not support UTF-16 or UTF-32".into(),
        ));
    }
    let mut p = Parser {
        lua,
        cfg,
        data: &data,
        pos: 0,
        depth: 0,
    };
    let tok = p.next_token();
    let value = p.value(tok)?;
    let tok = p.next_token();
    if !matches!(tok.kind, Kind::End) {
        return Err(parse_error("the end", &tok));
    }
    Ok(value)
}

enum Kind {
    ObjBegin,
    ObjEnd,
    ArrBegin,
    ArrEnd,
    Str(Vec<u8>),
    Num(f64),
    Bool(bool),
    Null,
    Colon,
    Comma,
    End,
    Error(&'static str),
}

struct Token {
    kind: Kind,
    /// 0-based offset reported (plus one) in error messages.
    index: usize,
}

fn parse_error(expected: &str, tok: &Token) -> LibError {
    let found = match &tok.kind {
        Kind::ObjBegin => "T_OBJ_BEGIN",
        Kind::ObjEnd => "T_OBJ_END",
        Kind::ArrBegin => "T_ARR_BEGIN",
        Kind::ArrEnd => "T_ARR_END",
        Kind::Str(_) => "T_STRING",
        Kind::Num(_) => "T_NUMBER",
        Kind::Bool(_) => "T_BOOLEAN",
        Kind::Null => "T_NULL",
        Kind::Colon => "T_COLON",
        Kind::Comma => "T_COMMA",
        Kind::End => "T_END",
        Kind::Error(msg) => msg,
    };
    LibError::At(format!(
        "Expected {expected} but found {found} at character {}",
        tok.index + 1
    ))
}

struct Parser<'a> {
    lua: &'a Lua,
    cfg: &'a Config,
    data: &'a [u8],
    pos: usize,
    depth: i32,
}

impl Parser<'_> {
    /// The byte at `i`; the input behaves as if NUL-terminated (a NUL byte
    /// anywhere ends the document, as in C).
    fn at(&self, i: usize) -> u8 {
        self.data.get(i).copied().unwrap_or(0)
    }

    fn token(&self, kind: Kind, index: usize) -> Token {
        Token { kind, index }
    }

    fn error_here(&self, msg: &'static str) -> Token {
        self.token(Kind::Error(msg), self.pos)
    }

    fn next_token(&mut self) -> Token {
        while matches!(self.at(self.pos), b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
        let start = self.pos;
        let ch = self.at(start);
        let single = match ch {
            b'{' => Some(Kind::ObjBegin),
            b'}' => Some(Kind::ObjEnd),
            b'[' => Some(Kind::ArrBegin),
            b']' => Some(Kind::ArrEnd),
            b':' => Some(Kind::Colon),
            b',' => Some(Kind::Comma),
            _ => None,
        };
        if let Some(kind) = single {
            self.pos += 1;
            return self.token(kind, start);
        }
        match ch {
            0 => self.token(Kind::End, start),
            b'"' => self.string_token(),
            b'-' | b'0'..=b'9' => {
                if !self.cfg.decode_invalid && self.is_invalid_number() {
                    return self.error_here("invalid number");
                }
                self.number_token()
            }
            b't' | b'f' | b'n' | b'i' | b'I' | b'N' | b'+' => {
                let rest = &self.data[start..];
                if rest.starts_with(b"true") {
                    self.pos += 4;
                    self.token(Kind::Bool(true), start)
                } else if rest.starts_with(b"false") {
                    self.pos += 5;
                    self.token(Kind::Bool(false), start)
                } else if rest.starts_with(b"null") {
                    self.pos += 4;
                    self.token(Kind::Null, start)
                } else if self.cfg.decode_invalid && self.is_invalid_number() {
                    self.number_token()
                } else {
                    self.error_here("invalid token")
                }
            }
            _ => self.error_here("invalid token"),
        }
    }

    /// Numbers that JSON forbids but strtod reads: a leading `+`, hex,
    /// leading zeros, inf and nan.
    fn is_invalid_number(&self) -> bool {
        let mut p = self.pos;
        match self.at(p) {
            b'+' => return true,
            b'-' => p += 1,
            _ => {}
        }
        let c = self.at(p);
        if c == b'0' {
            let c2 = self.at(p + 1);
            return (c2 | 0x20) == b'x' || c2.is_ascii_digit();
        }
        if c <= b'9' {
            return false;
        }
        let word = |w: &[u8]| {
            self.data.len() >= p + w.len() && self.data[p..p + w.len()].eq_ignore_ascii_case(w)
        };
        word(b"inf") || word(b"nan")
    }

    fn number_token(&mut self) -> Token {
        let start = self.pos;
        match strtod_prefix(&self.data[start..]) {
            Some((x, used)) => {
                self.pos += used;
                self.token(Kind::Num(x), start)
            }
            None => self.error_here("invalid number"),
        }
    }

    fn string_token(&mut self) -> Token {
        let start = self.pos;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            let ch = self.at(self.pos);
            match ch {
                b'"' => break,
                0 => return self.error_here("unexpected end of string"),
                b'\\' => {
                    let plain = match self.at(self.pos + 1) {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            if !self.unicode_escape(&mut out) {
                                return self.error_here("invalid unicode escape code");
                            }
                            continue;
                        }
                        _ => return self.error_here("invalid escape code"),
                    };
                    out.push(plain);
                    self.pos += 2;
                }
                _ => {
                    out.push(ch);
                    self.pos += 1;
                }
            }
        }
        self.pos += 1;
        self.token(Kind::Str(out), start)
    }

    fn hex4(&self, at: usize) -> Option<u32> {
        let mut v = 0;
        for i in 0..4 {
            v = v << 4 | (self.at(at + i) as char).to_digit(16)?;
        }
        Some(v)
    }

    /// Decodes `\uXXXX` (or a surrogate pair of them) at `pos` into UTF-8.
    fn unicode_escape(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(mut cp) = self.hex4(self.pos + 2) else {
            return false;
        };
        let mut len = 6;
        if cp & 0xF800 == 0xD800 {
            if cp & 0x400 != 0 {
                return false; // a low surrogate cannot come first
            }
            if self.at(self.pos + 6) != b'\\' || self.at(self.pos + 7) != b'u' {
                return false;
            }
            let Some(low) = self.hex4(self.pos + 8) else {
                return false;
            };
            if low & 0xFC00 != 0xDC00 {
                return false;
            }
            cp = (((cp & 0x3FF) << 10) | (low & 0x3FF)) + 0x10000;
            len = 12;
        }
        let c = char::from_u32(cp).expect("no surrogates left");
        let mut buf = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        self.pos += len;
        true
    }

    /// Enters an array or object. `slots` mirrors the C parser's Lua stack
    /// and `needed` the room it asks for (2 for an array, 3 for an object).
    fn descend(&mut self, slots: usize, needed: usize) -> LibResult<()> {
        self.depth += 1;
        if self.depth > self.cfg.decode_max_depth || slots + needed > LUA_MAX_C_STACK {
            return Err(LibError::At(format!(
                "Found too many nested data structures ({}) at character {}",
                self.depth, self.pos
            )));
        }
        Ok(())
    }

    /// Parses the value starting with `tok`. Nesting is handled with an
    /// explicit stack, and `slots` mirrors the Lua stack of the C parser
    /// (the input, plus a table per open array, a table and a key per open
    /// object), which is what bounds depth there.
    fn value(&mut self, mut tok: Token) -> LibResult<Value> {
        let spine = Spine::new(self.lua)?;
        let mut stack: Vec<OpenValue> = Vec::new();
        let mut slots: usize = 1;
        loop {
            let mut v = match tok.kind {
                Kind::Str(s) => Value::String(self.lua.create_string(s)?),
                Kind::Num(x) => Value::Number(x),
                Kind::Bool(b) => Value::Boolean(b),
                Kind::Null => null(),
                Kind::ObjBegin => {
                    self.descend(slots, 3)?;
                    let t = self.lua.create_table()?;
                    let first = self.next_token();
                    if matches!(first.kind, Kind::ObjEnd) {
                        self.depth -= 1;
                        Value::Table(t)
                    } else {
                        let key = self.key_and_colon(first)?;
                        slots += 2;
                        stack.push(OpenValue::Object);
                        spine.set_table(stack.len(), t)?;
                        spine.set_key(stack.len(), Value::String(key))?;
                        tok = self.next_token();
                        continue;
                    }
                }
                Kind::ArrBegin => {
                    self.descend(slots, 2)?;
                    let t = self.lua.create_table()?;
                    let first = self.next_token();
                    if matches!(first.kind, Kind::ArrEnd) {
                        self.depth -= 1;
                        Value::Table(t)
                    } else {
                        slots += 1;
                        stack.push(OpenValue::Array { next: 1 });
                        spine.set_table(stack.len(), t)?;
                        tok = first;
                        continue;
                    }
                }
                _ => return Err(parse_error("value", &tok)),
            };
            // Store `v` in its container; close containers that end here.
            loop {
                let level = stack.len();
                let Some(top) = stack.last_mut() else {
                    return Ok(v);
                };
                let closed = match top {
                    OpenValue::Array { next } => {
                        spine.table(level)?.raw_set(*next, v)?;
                        *next += 1;
                        let sep = self.next_token();
                        match sep.kind {
                            Kind::ArrEnd => true,
                            Kind::Comma => false,
                            _ => return Err(parse_error("comma or array end", &sep)),
                        }
                    }
                    OpenValue::Object => {
                        spine.table(level)?.raw_set(spine.key(level)?, v)?;
                        let sep = self.next_token();
                        match sep.kind {
                            Kind::ObjEnd => true,
                            Kind::Comma => {
                                let next = self.next_token();
                                let key = self.key_and_colon(next)?;
                                spine.set_key(level, Value::String(key))?;
                                false
                            }
                            _ => return Err(parse_error("comma or object end", &sep)),
                        }
                    }
                };
                if !closed {
                    tok = self.next_token();
                    break;
                }
                self.depth -= 1;
                slots -= match stack.pop().expect("non-empty") {
                    OpenValue::Array { .. } => 1,
                    OpenValue::Object => 2,
                };
                v = Value::Table(spine.table(level)?);
            }
        }
    }

    /// An object key (which must be a string) and the colon after it.
    fn key_and_colon(&mut self, tok: Token) -> LibResult<mlua::String> {
        let Kind::Str(key) = tok.kind else {
            return Err(parse_error("object key string", &tok));
        };
        let key = self.lua.create_string(key)?;
        let colon = self.next_token();
        if !matches!(colon.kind, Kind::Colon) {
            return Err(parse_error("colon", &colon));
        }
        Ok(key)
    }
}

/// An array or object being parsed (its table, and an object's current
/// key, are in the spine at the same level).
enum OpenValue {
    Array { next: i64 },
    Object,
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{err, eval, lua};

    #[test]
    fn encodes_like_redis() {
        let l = lua();
        let cases = [
            ("cjson.encode({1,2,{a=1}})", r#"[1,2,{"a":1}]"#),
            ("cjson.encode({})", "{}"),
            ("cjson.encode({a={}})", r#"{"a":{}}"#),
            (
                r#"cjson.encode('a/b"\\\n\t\1\127\31\11\8\12\13')"#,
                r#""a\/b\"\\\n\t\u0001\u007f\u001f\u000b\b\f\r""#,
            ),
            ("cjson.encode(0.1)", "0.1"),
            ("cjson.encode(1/3)", "0.33333333333333"),
            ("cjson.encode(1e20)", "1e+20"),
            ("cjson.encode(-1.5e-7)", "-1.5e-07"),
            ("cjson.encode(2^53)", "9.007199254741e+15"),
            ("cjson.encode(100)", "100"),
            ("cjson.encode({[1]=1,[2]=2,[4]=4})", "[1,2,null,4]"),
            ("cjson.encode({1,2,3,nil,5})", "[1,2,3,null,5]"),
            (
                "cjson.encode({[1]=1,[2]=2,[3]=3,[10]=1})",
                "[1,2,3,null,null,null,null,null,null,1]",
            ),
            ("cjson.encode({[1]=1,a=2})", r#"{"1":1,"a":2}"#),
            ("cjson.encode({[1.5]=1})", r#"{"1.5":1}"#),
            ("cjson.encode({[0]=1})", r#"{"0":1}"#),
            ("cjson.encode({[-1]=1})", r#"{"-1":1}"#),
            ("cjson.encode(cjson.null)", "null"),
            ("cjson.encode(true)", "true"),
            ("cjson.encode('\\128\\255')", "\"\u{fffd}\u{fffd}\""),
            (
                r#"cjson.encode(cjson.decode('{"a":[1,2,{"b":null}],"c":"x"}'))"#,
                r#"{"a":[1,2,{"b":null}],"c":"x"}"#,
            ),
        ];
        for (code, want) in cases {
            assert_eq!(eval(&l, &format!("return {code}")), want, "{code}");
        }
    }

    #[test]
    fn encode_errors() {
        let l = lua();
        let cases = [
            (
                "cjson.encode(1/0)",
                "Cannot serialise number: must not be NaN or Inf",
            ),
            (
                "cjson.encode({[1]=1,[2]=2,[20]=4})",
                "Cannot serialise table: excessively sparse array",
            ),
            (
                "cjson.encode({[11]=1})",
                "Cannot serialise table: excessively sparse array",
            ),
            (
                "cjson.encode({[true]=1})",
                "Cannot serialise boolean: table key must be a number or string",
            ),
            (
                "cjson.encode({f=function() end})",
                "Cannot serialise function: type not supported",
            ),
            (
                "cjson.encode(coroutine.create(function() end))",
                "Cannot serialise thread: type not supported",
            ),
            (
                "cjson.encode({[1/0]=1})",
                "Cannot serialise number: must not be NaN or Inf",
            ),
            (
                "cjson.encode()",
                "bad argument #1 to 'encode' (expected 1 argument)",
            ),
            (
                "cjson.encode(1, 2)",
                "bad argument #1 to 'encode' (expected 1 argument)",
            ),
            (
                "local t={} local c=t for i=1,1000 do c[1]={} c=c[1] end cjson.encode(t)",
                "Cannot serialise, excessive nesting (1001)",
            ),
            (
                "local t={} t[1]=t cjson.encode(t)",
                "Cannot serialise, excessive nesting (1001)",
            ),
        ];
        for (code, want) in cases {
            assert_eq!(err(&l, code), format!("user_script:1: {want}"), "{code}");
        }
        assert_eq!(
            eval(
                &l,
                "local t={} local c=t for i=1,999 do c[1]={} c=c[1] end return #cjson.encode(t)"
            ),
            "2000"
        );
    }

    #[test]
    fn decodes_like_redis() {
        let l = lua();
        let cases = [
            ("cjson.decode('[1,2,3]')[3]", "3"),
            ("cjson.decode(12)", "12"),
            (
                "cjson.decode('12345678901234567890')",
                "1.2345678901235e+19",
            ),
            ("cjson.decode('1.5e3')", "1500"),
            ("cjson.decode('0x10')", "16"),
            ("cjson.decode('-0x10')", "-16"),
            ("cjson.decode('0x1p4')", "16"),
            ("cjson.decode('nan')", "nan"),
            ("cjson.decode('-nan')", "-nan"),
            ("cjson.decode('nan(12)')", "nan"),
            ("cjson.decode('inf')", "inf"),
            ("cjson.decode('Inf')", "inf"),
            ("cjson.decode('infinity')", "inf"),
            ("cjson.decode('-Infinity')", "-inf"),
            ("cjson.decode('1e400')", "inf"),
            ("cjson.decode('01')", "1"),
            ("cjson.decode('1.')", "1"),
            ("cjson.decode('+1')", "1"),
            ("cjson.decode('null') == cjson.null", "true"),
            ("type(cjson.null)", "userdata"),
            ("tostring(cjson.null)", "userdata: (nil)"),
            (
                "cjson.decode('  [true,false,null]  ')[3] == cjson.null",
                "true",
            ),
            ("cjson.decode('\"\\\\u00e9\"')", "é"),
            ("cjson.decode('\"\\\\ud83d\\\\ude00\"')", "😀"),
            ("cjson.decode('\"\\\\uD83D\\\\uDE00\"')", "😀"),
            ("#cjson.decode('\"\\\\u0000x\"')", "2"),
            ("cjson.decode('\"a\\\\/b\\\\n\"')", "a/b\n"),
            ("cjson.decode('\"a\\nb\"')", "a\nb"),
            ("cjson.decode('12\\0 x')", "12"),
            ("cjson.decode('[1]\\0garbage')[1]", "1"),
            ("cjson.decode('{\"a\":{\"b\":[1,{}]}}').a.b[1]", "1"),
            (
                "#cjson.encode(cjson.decode(string.rep('[',1000)..string.rep(']',1000)))",
                "2000",
            ),
            ("type(cjson.new())", "table"),
            ("cjson.new().encode({1})", "[1]"),
            ("cjson._NAME .. cjson._VERSION", "cjson2.1.0"),
        ];
        for (code, want) in cases {
            assert_eq!(eval(&l, &format!("return {code}")), want, "{code}");
        }
    }

    #[test]
    fn decode_errors() {
        let l = lua();
        let cases = [
            ("x", "Expected value but found invalid token at character 1"),
            ("", "Expected value but found T_END at character 1"),
            ("[1,", "Expected value but found T_END at character 4"),
            (
                "{\"a\":1,}",
                "Expected object key string but found T_OBJ_END at character 8",
            ),
            (
                "{1:2}",
                "Expected object key string but found T_NUMBER at character 2",
            ),
            (
                "[1 2]",
                "Expected comma or array end but found T_NUMBER at character 4",
            ),
            (
                "\"abc",
                "Expected value but found unexpected end of string at character 5",
            ),
            (
                "\"a\\0b\"",
                "Expected value but found unexpected end of string at character 3",
            ),
            (
                "\"\\\\ud83d\"",
                "Expected value but found invalid unicode escape code at character 2",
            ),
            (
                "\"\\\\udc00\"",
                "Expected value but found invalid unicode escape code at character 2",
            ),
            (
                "\"\\\\u12\"",
                "Expected value but found invalid unicode escape code at character 2",
            ),
            (
                "\"\\\\ud800\\\\u0041\"",
                "Expected value but found invalid unicode escape code at character 2",
            ),
            (
                "\"\\\\x\"",
                "Expected value but found invalid escape code at character 2",
            ),
            ("1 2", "Expected the end but found T_NUMBER at character 3"),
            (
                "-",
                "Expected value but found invalid number at character 1",
            ),
            (
                ".5",
                "Expected value but found invalid token at character 1",
            ),
            (
                "1e",
                "Expected the end but found invalid token at character 2",
            ),
            (
                "0x",
                "Expected the end but found invalid token at character 2",
            ),
            (
                "1.5x",
                "Expected the end but found invalid token at character 4",
            ),
            (
                "tru",
                "Expected value but found invalid token at character 1",
            ),
            (
                "ix",
                "Expected value but found invalid token at character 1",
            ),
            (
                "truex",
                "Expected the end but found invalid token at character 5",
            ),
            (
                "[truex]",
                "Expected comma or array end but found invalid token at character 6",
            ),
            (
                "{\"a\" 1}",
                "Expected colon but found T_NUMBER at character 6",
            ),
            (
                "{\"a\":1 \"b\"}",
                "Expected comma or object end but found T_STRING at character 8",
            ),
            (
                "{\"a\":1",
                "Expected comma or object end but found T_END at character 7",
            ),
            ("]", "Expected value but found T_ARR_END at character 1"),
            (":", "Expected value but found T_COLON at character 1"),
            (",", "Expected value but found T_COMMA at character 1"),
            ("}", "Expected value but found T_OBJ_END at character 1"),
            ("a\\0", "JSON parser does not support UTF-16 or UTF-32"),
        ];
        for (json, want) in cases {
            let code = format!("cjson.decode('{json}')");
            assert_eq!(err(&l, &code), format!("user_script:1: {want}"), "{code}");
        }
        let more = [
            (
                "cjson.decode(string.rep('[',1001)..string.rep(']',1001))",
                "Found too many nested data structures (1001) at character 1001",
            ),
            (
                "cjson.decode(string.rep('{\"a\":',1001)..'1'..string.rep('}',1001))",
                "Found too many nested data structures (1001) at character 5001",
            ),
            (
                "cjson.decode({})",
                "bad argument #1 to 'decode' (string expected, got table)",
            ),
            (
                "cjson.decode()",
                "bad argument #1 to 'decode' (expected 1 argument)",
            ),
        ];
        for (code, want) in more {
            assert_eq!(err(&l, code), format!("user_script:1: {want}"), "{code}");
        }
        // Raised like luaL_error: the position is the caller's, and pcall
        // as the direct caller gives none.
        assert_eq!(
            eval(&l, "return select(2, pcall(cjson.decode, 'x'))"),
            "Expected value but found invalid token at character 1"
        );
    }

    /// With the depth limits raised, Lua's C stack bounds nesting, at the
    /// depths redis-server reaches (arrays need fewer stack slots).
    #[test]
    fn deep_nesting_hits_the_lua_stack_limit() {
        let l = lua();
        eval(
            &l,
            "cjson.decode_max_depth(100000) cjson.encode_max_depth(100000)",
        );
        let arrays = |n: usize| format!("string.rep('[', {n})..string.rep(']', {n})");
        let objects = |n: usize| format!("string.rep('{{\"a\":', {n})..'1'..string.rep('}}', {n})");
        assert_eq!(
            eval(
                &l,
                &format!("return #cjson.encode(cjson.decode({}))", arrays(7997))
            ),
            "15994"
        );
        assert_eq!(
            eval(&l, &format!("return type(cjson.decode({}))", arrays(7998))),
            "table"
        );
        assert_eq!(
            err(&l, &format!("cjson.decode({})", arrays(7999))),
            "user_script:1: Found too many nested data structures (7999) at character 7999"
        );
        assert_eq!(
            eval(&l, &format!("return type(cjson.decode({}))", objects(3999))),
            "table"
        );
        assert_eq!(
            err(&l, &format!("cjson.decode({})", objects(4000))),
            "user_script:1: Found too many nested data structures (4000) at character 19996"
        );
        assert_eq!(
            err(&l, &format!("cjson.encode(cjson.decode({}))", arrays(7998))),
            "user_script:1: Cannot serialise, excessive nesting (7998)"
        );
        // Wide structures: many live values at once.
        assert_eq!(
            eval(&l, "local t = {} for i = 1, 20000 do t['k'..i] = {'v'..i} end local d = cjson.decode(cjson.encode(t)) return d.k19999[1]"),
            "v19999"
        );
        let nest = "local function mk(n) local t = {} local c = t for i = 1, n - 1 do c.a = {} c = c.a end return t end ";
        assert_eq!(
            eval(&l, &format!("{nest} return #cjson.encode(mk(3999))")),
            "23990"
        );
        assert_eq!(
            err(&l, &format!("{nest} cjson.encode(mk(4000))")),
            "user_script:1: Cannot serialise, excessive nesting (4000)"
        );
    }

    #[test]
    fn settings() {
        let l = lua();
        let r = |code: &str| eval(&l, &format!("return table.concat({{{code}}}, ',')"));
        let show = "local function s(...) local t = {} for i = 1, select('#', ...) do t[i] = tostring((select(i, ...))) end return table.concat(t, ',') end return ";
        let e = |code: &str| eval(&l, &format!("{show}{code}"));
        assert_eq!(e("cjson.encode_max_depth()"), "1000");
        assert_eq!(e("s(cjson.encode_sparse_array())"), "false,2,10");
        assert_eq!(e("s(cjson.encode_keep_buffer())"), "true");
        assert_eq!(e("s(cjson.encode_invalid_numbers())"), "false");
        assert_eq!(e("s(cjson.decode_invalid_numbers())"), "true");
        assert_eq!(
            r("cjson.encode_number_precision(3), cjson.encode(1/3)"),
            "3,0.333"
        );
        assert_eq!(r("cjson.encode_number_precision(14)"), "14");
        assert_eq!(
            r("cjson.encode_max_depth('5'), cjson.encode_max_depth(2.5)"),
            "5,2"
        );
        assert_eq!(
            err(&l, "cjson.encode({{{1}}})"),
            "user_script:1: Cannot serialise, excessive nesting (3)"
        );
        assert_eq!(r("cjson.encode_max_depth(1000)"), "1000");
        assert_eq!(r("cjson.decode_max_depth(2)"), "2");
        assert_eq!(
            err(&l, "cjson.decode('[[[1]]]')"),
            "user_script:1: Found too many nested data structures (3) at character 3"
        );
        assert_eq!(r("cjson.decode_max_depth(1000)"), "1000");
        assert_eq!(
            e("s(cjson.encode_invalid_numbers('null'), cjson.encode(0/0), cjson.encode(-1/0))"),
            "null,null,null"
        );
        assert_eq!(
            e("s(cjson.encode_invalid_numbers(true), cjson.encode(0/0), cjson.encode(1/0), cjson.encode(-1/0))"),
            "true,nan,inf,-inf"
        );
        assert_eq!(e("s(cjson.encode_invalid_numbers('off'))"), "false");
        assert_eq!(
            e("s(cjson.encode_sparse_array(true), cjson.encode({[11]=1}))"),
            r#"true,{"11":1}"#
        );
        assert_eq!(
            e("s(cjson.encode_sparse_array(false, 0), cjson.encode({[30]=1}):len())"),
            "false,148"
        );
        assert_eq!(
            e("s(cjson.encode_sparse_array(false, 2, 10))"),
            "false,2,10"
        );
        assert_eq!(e("s(cjson.decode_invalid_numbers(false))"), "false");
        assert_eq!(
            err(&l, "cjson.decode('nan')"),
            "user_script:1: Expected value but found invalid token at character 1"
        );
        assert_eq!(
            err(&l, "cjson.decode('0x10')"),
            "user_script:1: Expected value but found invalid number at character 1"
        );
        assert_eq!(
            err(&l, "cjson.decode('+1')"),
            "user_script:1: Expected value but found invalid token at character 1"
        );
        assert_eq!(e("cjson.decode('1e400')"), "inf");
        assert_eq!(e("s(cjson.decode_invalid_numbers('on'))"), "true");
        // A cjson.new() instance has its own settings.
        assert_eq!(
            e("s(cjson.new().encode_number_precision(2), cjson.encode_number_precision())"),
            "2,14"
        );
        let errors = [
            ("cjson.encode_number_precision(0)", "bad argument #1 to 'encode_number_precision' (expected integer between 1 and 14)"),
            ("cjson.encode_number_precision(15)", "bad argument #1 to 'encode_number_precision' (expected integer between 1 and 14)"),
            ("cjson.encode_max_depth(0)", "bad argument #1 to 'encode_max_depth' (expected integer between 1 and 2147483647)"),
            ("cjson.encode_max_depth('x')", "bad argument #1 to 'encode_max_depth' (number expected, got string)"),
            ("cjson.encode_max_depth(1, 2)", "bad argument #2 to 'encode_max_depth' (found too many arguments)"),
            ("cjson.encode_sparse_array(1, 2, 3, 4)", "bad argument #4 to 'encode_sparse_array' (found too many arguments)"),
            ("cjson.encode_sparse_array('x')", "bad argument #1 to 'encode_sparse_array' (invalid option 'x')"),
            ("cjson.encode_sparse_array(true, -1)", "bad argument #1 to 'encode_sparse_array' (expected integer between 0 and 2147483647)"),
            ("cjson.encode_keep_buffer(1)", "bad argument #1 to 'encode_keep_buffer' (invalid option '1')"),
            ("cjson.encode_keep_buffer('yes')", "bad argument #1 to 'encode_keep_buffer' (invalid option 'yes')"),
            ("cjson.encode_invalid_numbers('bad')", "bad argument #1 to 'encode_invalid_numbers' (invalid option 'bad')"),
        ];
        for (code, want) in errors {
            assert_eq!(err(&l, code), format!("user_script:1: {want}"), "{code}");
        }
    }
}
