//! `struct`: binary packing with the behaviour of Roberto Ierusalimschy's
//! struct library as shipped in Redis 7 (x86-64 sizes: short 2, int 4,
//! long and size_t 8; native order little-endian; no alignment by default).
//!
//! Format options: `<` `>` byte order, `!n` maximum alignment (default 8),
//! ` ` ignored, `x` one zero byte, `b B h H l L T i[n] I[n]` integers
//! (lowercase signed), `f` `d` floats, `s` zero-terminated string, `c[n]`
//! fixed-size string (`c0`: whole string / size from the previous value).

use mlua::{Lua, MultiValue, Table, Value};

use super::{
    arg_error, double_to_integer, Args, LibError, LibResult, Results, Wrapper, LUA_MAX_C_STACK,
};

/// Largest integer size `i[n]` / `I[n]` accepts.
const MAX_INT_SIZE: usize = 32;
/// Default for `!` without a number: the alignment of a double.
const MAX_ALIGN: usize = 8;

pub(super) fn module(lua: &Lua, wrap: &Wrapper) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("pack", wrap.one(lua, pack)?)?;
    t.raw_set("unpack", wrap.many(lua, unpack)?)?;
    t.raw_set("size", wrap.one(lua, size)?)?;
    Ok(t)
}

struct Header {
    little: bool,
    align: usize,
}

impl Default for Header {
    fn default() -> Self {
        Header {
            little: cfg!(target_endian = "little"),
            align: 1,
        }
    }
}

/// A format string being read, option by option. Like the C string it is,
/// it ends at the first NUL byte.
struct Format {
    bytes: Vec<u8>,
    pos: usize,
}

impl Format {
    fn new(a: &Args) -> LibResult<Self> {
        let s = a.bytes(1)?;
        let s = s.as_bytes();
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        Ok(Format {
            bytes: s[..end].to_vec(),
            pos: 0,
        })
    }

    fn next_option(&mut self) -> Option<u8> {
        let c = self.bytes.get(self.pos).copied();
        self.pos += 1;
        c
    }

    /// An optional decimal count after an option.
    fn number(&mut self, default: usize) -> LibResult<usize> {
        if !self.peek_digit() {
            return Ok(default);
        }
        let mut a: i32 = 0;
        while self.peek_digit() {
            let d = (self.bytes[self.pos] - b'0') as i32;
            if a > i32::MAX / 10 || a * 10 > i32::MAX - d {
                return Err(LibError::At("integral size overflow".into()));
            }
            a = a * 10 + d;
            self.pos += 1;
        }
        Ok(a as usize)
    }

    fn peek_digit(&self) -> bool {
        self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit)
    }

    /// The size in bytes of option `opt` (0 for options without data).
    fn size_of(&mut self, opt: u8) -> LibResult<usize> {
        Ok(match opt {
            b'b' | b'B' | b'x' => 1,
            b'h' | b'H' => 2,
            b'l' | b'L' | b'T' | b'd' => 8,
            b'f' => 4,
            b'c' => self.number(1)?,
            b'i' | b'I' => {
                let n = self.number(4)?;
                if n > MAX_INT_SIZE {
                    return Err(LibError::At(format!(
                        "integral size {n} is larger than limit of {MAX_INT_SIZE}"
                    )));
                }
                n
            }
            _ => 0,
        })
    }

    /// Applies a byte-order / alignment option; anything else is invalid.
    fn control(&mut self, opt: u8, h: &mut Header, fname: &str) -> LibResult<()> {
        match opt {
            b' ' => {}
            b'>' => h.little = false,
            b'<' => h.little = true,
            b'!' => {
                let a = self.number(MAX_ALIGN)?;
                if !a.is_power_of_two() {
                    return Err(LibError::At(format!("alignment {a} is not a power of 2")));
                }
                h.align = a;
            }
            _ => {
                return Err(arg_error(
                    1,
                    fname,
                    format!("invalid format option '{}'", opt as char),
                ))
            }
        }
        Ok(())
    }
}

/// Padding needed before an item of `size` bytes at offset `len`.
fn padding(len: usize, h: &Header, opt: u8, size: usize) -> usize {
    if size == 0 || opt == b'c' {
        return 0;
    }
    let size = size.min(h.align);
    (size.wrapping_sub(len & (size - 1))) & (size - 1)
}

fn is_integer_option(opt: u8) -> bool {
    matches!(
        opt,
        b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I'
    )
}

/// A C `(unsigned long)` cast of a double on x86-64.
fn double_to_u64(x: f64) -> u64 {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if x < TWO_63 {
        double_to_integer(x) as u64
    } else {
        (double_to_integer(x - TWO_63) as u64) ^ (1 << 63)
    }
}

fn put_bytes(out: &mut Vec<u8>, native_le: &[u8], little: bool) {
    if little {
        out.extend_from_slice(native_le);
    } else {
        out.extend(native_le.iter().rev());
    }
}

fn pack(lua: &Lua, args: MultiValue) -> LibResult<Value> {
    let mut a = Args::new(lua, args, "pack");
    let mut fmt = Format::new(&a)?;
    // In the C code the slot just past the arguments holds a nil, so a
    // missing argument reads as nil rather than "no value".
    a.vals.push(Value::Nil);
    let mut h = Header::default();
    let mut arg = 2;
    let mut out = Vec::new();
    while let Some(opt) = fmt.next_option() {
        let size = fmt.size_of(opt)?;
        let pad = padding(out.len(), &h, opt, size);
        out.resize(out.len() + pad, 0);
        match opt {
            _ if is_integer_option(opt) => {
                let n = a.number(arg)?;
                arg += 1;
                let mut value = if n < 0.0 {
                    double_to_integer(n) as u64
                } else {
                    double_to_u64(n)
                };
                let mut le = Vec::with_capacity(size);
                for _ in 0..size {
                    le.push(value as u8);
                    value >>= 8;
                }
                put_bytes(&mut out, &le, h.little);
            }
            b'x' => out.push(0),
            b'f' => {
                let x = a.number(arg)? as f32;
                arg += 1;
                put_bytes(&mut out, &x.to_le_bytes(), h.little);
            }
            b'd' => {
                let x = a.number(arg)?;
                arg += 1;
                put_bytes(&mut out, &x.to_le_bytes(), h.little);
            }
            b'c' | b's' => {
                let s = a.bytes(arg)?;
                let s = s.as_bytes();
                arg += 1;
                let size = if size == 0 { s.len() } else { size };
                if s.len() < size {
                    // (The C code names the argument after the string.)
                    return Err(arg_error(arg, "pack", "string too short"));
                }
                out.extend_from_slice(&s[..size]);
                if opt == b's' {
                    out.push(0);
                }
            }
            _ => fmt.control(opt, &mut h, "pack")?,
        }
    }
    Ok(Value::String(lua.create_string(&out)?))
}

fn read_integer(bytes: &[u8], little: bool, signed: bool) -> f64 {
    let fold = |acc: u64, b: &u8| (acc << 8) | *b as u64;
    let mut l = if little {
        bytes.iter().rev().fold(0, fold)
    } else {
        bytes.iter().fold(0, fold)
    };
    if !signed {
        return l as f64;
    }
    // Sign extension from the item's top bit; for sizes past 8 bytes the
    // C shift count wraps modulo 64 on x86-64, and so does this one.
    let shift = (bytes.len() * 8).wrapping_sub(1) & 63;
    let mask = u64::MAX << shift;
    if l & mask != 0 {
        l |= mask;
    }
    l as i64 as f64
}

fn unpack(lua: &Lua, args: MultiValue) -> LibResult<Results> {
    let a = Args::new(lua, args, "unpack");
    let mut fmt = Format::new(&a)?;
    let data = a.bytes(2)?;
    let data = data.as_bytes();
    let ld = data.len();
    let mut pos = a.opt_integer(3, 1)? as usize;
    if pos == 0 {
        return Err(arg_error(3, "unpack", "offset must be 1 or greater"));
    }
    pos -= 1;
    let too_short = || arg_error(2, "unpack", "data string too short");
    let mut h = Header::default();
    let mut out = Results::new(lua)?;
    while let Some(opt) = fmt.next_option() {
        let mut size = fmt.size_of(opt)?;
        pos = pos.wrapping_add(padding(pos, &h, opt, size));
        if size > ld || pos > ld - size {
            return Err(too_short());
        }
        if a.len() + out.len() + 2 > LUA_MAX_C_STACK {
            return Err(LibError::At("stack overflow (too many results)".into()));
        }
        match opt {
            _ if is_integer_option(opt) => {
                let x = read_integer(&data[pos..pos + size], h.little, opt.is_ascii_lowercase());
                out.push(Value::Number(x))?;
            }
            b'x' => {}
            b'f' => {
                let mut b = [0u8; 4];
                b.copy_from_slice(&data[pos..pos + 4]);
                let x = if h.little {
                    f32::from_le_bytes(b)
                } else {
                    f32::from_be_bytes(b)
                };
                out.push(Value::Number(x as f64))?;
            }
            b'd' => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&data[pos..pos + 8]);
                let x = if h.little {
                    f64::from_le_bytes(b)
                } else {
                    f64::from_be_bytes(b)
                };
                out.push(Value::Number(x))?;
            }
            b'c' => {
                if size == 0 {
                    // `c0` takes its length from the value just unpacked.
                    let prev = match out.len() {
                        0 => None,
                        _ => lua.coerce_number(out.pop()?)?,
                    };
                    let Some(n) = prev else {
                        return Err(LibError::At("format 'c0' needs a previous size".into()));
                    };
                    size = double_to_u64(n) as usize;
                    if size > ld || pos > ld - size {
                        return Err(too_short());
                    }
                }
                out.push(Value::String(lua.create_string(&data[pos..pos + size])?))?;
            }
            b's' => {
                let Some(len) = data[pos..].iter().position(|&b| b == 0) else {
                    return Err(LibError::At("unfinished string in data".into()));
                };
                out.push(Value::String(lua.create_string(&data[pos..pos + len])?))?;
                size = len + 1;
            }
            _ => fmt.control(opt, &mut h, "unpack")?,
        }
        pos = pos.wrapping_add(size);
    }
    out.push(Value::Number(pos.wrapping_add(1) as i64 as f64))?;
    Ok(out)
}

fn size(lua: &Lua, args: MultiValue) -> LibResult<Value> {
    let a = Args::new(lua, args, "size");
    let mut fmt = Format::new(&a)?;
    let mut h = Header::default();
    let mut pos: usize = 0;
    while let Some(opt) = fmt.next_option() {
        let size = fmt.size_of(opt)?;
        pos = pos.wrapping_add(padding(pos, &h, opt, size));
        if opt == b's' {
            return Err(arg_error(1, "size", "option 's' has no fixed size"));
        }
        if opt == b'c' && size == 0 {
            return Err(arg_error(1, "size", "option 'c0' has no fixed size"));
        }
        if !opt.is_ascii_alphanumeric() {
            fmt.control(opt, &mut h, "size")?;
        }
        pos = pos.wrapping_add(size);
    }
    Ok(Value::Number(pos as f64))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{err, eval, lua};

    const HEX: &str = "local function hx(s) return (s:gsub('.', function(c) return string.format('%02x', c:byte()) end)) end ";

    #[test]
    fn pack_matches_redis() {
        let l = lua();
        let cases = [
            ("'>i', 1", "00000001"),
            (
                "'<bBhHlLTiI', -1, 255, -2, 65535, -3, 4, 5, -6, 7",
                "fffffefffffffdffffffffffffff04000000000000000500000000000000faffffff07000000",
            ),
            ("'>i3I2i8', -1, 258, -2", "ffffff0102fffffffffffffffe"),
            ("'!4bi', 1, 2", "0100000002000000"),
            ("'!bd', 1, 2", "01000000000000000000000000000040"),
            ("'!2bd', 1, 2", "01000000000000000040"),
            ("'!bxh', 1, 2", "01000200"),
            ("'!8bi3d', 1, 2, 3", "01000002000000000000000000000840"),
            ("'<fd', 1.5, 0.1", "0000c03f9a9999999999b93f"),
            ("'>fd', 1.5, 0.1", "3fc000003fb999999999999a"),
            ("'sc3c0', 'ab', 'xyz', 'hello'", "61620078797a68656c6c6f"),
            ("'s', 'a\\0b'", "61006200"),
            ("'<i16', -1", "ffffffffffffffff0000000000000000"),
            ("'<i', 2^40+5", "05000000"),
            ("'<I', -1", "ffffffff"),
            ("'<i', 1.9", "01000000"),
            ("'<i', -1.9", "ffffffff"),
            ("'<l', 2^63", "0000000000000080"),
            ("'<l', 2^64+4096", "0000000000000000"),
            ("'<L', 1e30", "0000000000000000"),
            ("'< i', 1", "01000000"),
            ("'<f', 1e300", "0000807f"),
            ("'<I', 2^32+1", "01000000"),
            ("'<i', 0/0", "00000000"),
            ("'<b', '12'", "0c"),
            ("'<b\\0i', 1, 2", "01"),
        ];
        for (args, want) in cases {
            let code = format!("{HEX}return hx(struct.pack({args}))");
            assert_eq!(eval(&l, &code), want, "{args}");
        }
        let errors = [
            (
                "struct.pack('c5', 'ab')",
                "bad argument #3 to 'pack' (string too short)",
            ),
            (
                "struct.pack('i', 'x')",
                "bad argument #2 to 'pack' (number expected, got string)",
            ),
            (
                "struct.pack('i')",
                "bad argument #2 to 'pack' (number expected, got nil)",
            ),
            (
                "struct.pack('iii', 1)",
                "bad argument #3 to 'pack' (number expected, got nil)",
            ),
            (
                "struct.pack('bs', 1)",
                "bad argument #3 to 'pack' (string expected, got nil)",
            ),
            (
                "struct.pack('q', 1)",
                "bad argument #1 to 'pack' (invalid format option 'q')",
            ),
            ("struct.pack('!3i', 1)", "alignment 3 is not a power of 2"),
            (
                "struct.pack('i33', 1)",
                "integral size 33 is larger than limit of 32",
            ),
            ("struct.pack('i99999999999', 1)", "integral size overflow"),
            (
                "struct.pack()",
                "bad argument #1 to 'pack' (string expected, got no value)",
            ),
        ];
        for (code, want) in errors {
            assert_eq!(err(&l, code), format!("user_script:1: {want}"), "{code}");
        }
    }

    #[test]
    fn unpack_and_size_match_redis() {
        let l = lua();
        let show = "local function s(...) local t = {} for i = 1, select('#', ...) do t[i] = tostring((select(i, ...))) end return table.concat(t, ',') end return ";
        let cases = [
            ("struct.unpack('<bBhH', '\\255\\255\\254\\255\\255\\255')", "-1,255,-2,65535,7"),
            ("struct.unpack('>i3', '\\255\\255\\254')", "-2,4"),
            ("struct.unpack('<i', '\\1\\0\\0\\0\\2\\0\\0\\0', 5)", "2,9"),
            ("struct.unpack('<i', '\\1\\0\\0\\0\\2\\0\\0\\0', '5')", "2,9"),
            ("struct.unpack('s', 'ab\\0cd')", "ab,4"),
            ("struct.unpack('bc0', '\\2abc')", "ab,4"),
            ("struct.unpack('c1c0', '3abcd')", "abc,5"),
            ("struct.unpack('!4bi', '\\1\\0\\0\\0\\2\\0\\0\\0')", "1,2,9"),
            ("struct.unpack('x', 'a')", "2"),
            ("struct.unpack('<d', struct.pack('<d', 0.1))", "0.1,9"),
            ("struct.unpack('>f', struct.pack('>f', 0.5))", "0.5,5"),
            ("struct.unpack('<L', '\\255\\255\\255\\255\\255\\255\\255\\255')", "1.844674407371e+19,9"),
            ("struct.unpack('<l', '\\255\\255\\255\\255\\255\\255\\255\\127')", "9.2233720368548e+18,9"),
            ("struct.unpack('<i16', string.rep('\\255', 16))", "-1,17"),
            ("struct.unpack('<I16', string.rep('\\255', 16))", "1.844674407371e+19,17"),
            ("struct.unpack('<i12', string.rep('\\255', 12))", "-1,13"),
            ("struct.unpack('<i9', '\\1'..string.rep('\\0', 8))", "1,10"),
            ("struct.unpack('<i9', '\\128'..string.rep('\\0', 8))", "-128,10"),
            ("struct.unpack('<i0', '')", "0,1"),
            ("struct.unpack('<b', '\\1', 1, 9)", "1,2"),
            ("struct.unpack(string.rep('x', 20000)..'b', string.rep('a', 20001))", "97,20002"),
            ("struct.size('<i!4dc3'), struct.size('bh'), struct.size('!bh'), struct.size('!bd')", "15,3,4,16"),
            ("struct.size('!4bi'), struct.size('!bi3'), struct.size('!i3b'), struct.size('!8hi3d')", "8,6,6,16"),
            ("struct.size('y')", "0"),
        ];
        for (code, want) in cases {
            assert_eq!(eval(&l, &format!("{show}s({code})")), want, "{code}");
        }
        let errors = [
            (
                "struct.unpack('<i', '\\1\\0\\0', 1)",
                "bad argument #2 to 'unpack' (data string too short)",
            ),
            (
                "struct.unpack('<i', '\\1\\0\\0\\0', 0)",
                "bad argument #3 to 'unpack' (offset must be 1 or greater)",
            ),
            (
                "struct.unpack('<i', '\\1\\0\\0\\0', -1)",
                "bad argument #2 to 'unpack' (data string too short)",
            ),
            ("struct.unpack('s', 'ab')", "unfinished string in data"),
            (
                "struct.unpack('s', 'ab\\0', 4)",
                "unfinished string in data",
            ),
            (
                "struct.unpack('s', 'ab\\0', 5)",
                "bad argument #2 to 'unpack' (data string too short)",
            ),
            (
                "struct.unpack('c0', 'abc')",
                "format 'c0' needs a previous size",
            ),
            (
                "struct.unpack('c2c0', '12abc')",
                "bad argument #2 to 'unpack' (data string too short)",
            ),
            (
                "struct.unpack('bc0', '\\255abc')",
                "bad argument #2 to 'unpack' (data string too short)",
            ),
            (
                "struct.unpack('y', '')",
                "bad argument #1 to 'unpack' (invalid format option 'y')",
            ),
            (
                "struct.unpack(5, 'ab')",
                "bad argument #1 to 'unpack' (invalid format option '5')",
            ),
            (
                "struct.unpack('i', 5)",
                "bad argument #2 to 'unpack' (data string too short)",
            ),
            (
                "struct.unpack('i')",
                "bad argument #2 to 'unpack' (string expected, got no value)",
            ),
            (
                "struct.unpack(string.rep('b', 8000), string.rep('a', 8000))",
                "stack overflow (too many results)",
            ),
            (
                "struct.size('s')",
                "bad argument #1 to 'size' (option 's' has no fixed size)",
            ),
            (
                "struct.size('c0')",
                "bad argument #1 to 'size' (option 'c0' has no fixed size)",
            ),
            (
                "struct.size('?')",
                "bad argument #1 to 'size' (invalid format option '?')",
            ),
            ("struct.size('!3')", "alignment 3 is not a power of 2"),
        ];
        for (code, want) in errors {
            assert_eq!(err(&l, code), format!("user_script:1: {want}"), "{code}");
        }
    }
}
