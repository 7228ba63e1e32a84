//! `bit`: 32-bit bitwise operations with the behaviour of LuaBitOp 1.0.2 as
//! shipped in Redis 7. Results are signed 32-bit numbers.

use mlua::{Lua, MultiValue, Table, Value};

use super::{Args, LibResult, Wrapper};

/// Converts a Lua number to 32 bits the way LuaBitOp does on doubles: adding
/// 2^52 + 2^51 leaves the value, rounded to an integer and taken modulo 2^32,
/// in the low mantissa bits.
fn to_bits(x: f64) -> u32 {
    (x + 6_755_399_441_055_744.0).to_bits() as u32
}

fn arg(a: &Args, n: usize) -> LibResult<u32> {
    a.number(n).map(to_bits)
}

type Unary = fn(u32) -> u32;
type Binary = fn(u32, u32) -> u32;

fn ret(b: u32) -> Value {
    Value::Number(b as i32 as f64)
}

pub(super) fn module(lua: &Lua, wrap: &Wrapper) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let unary: [(&'static str, Unary); 3] = [
        ("tobit", |b| b),
        ("bnot", |b| !b),
        ("bswap", u32::swap_bytes),
    ];
    for (name, op) in unary {
        let f = wrap.one(lua, move |lua, args: MultiValue| {
            let a = Args::new(lua, args, name);
            Ok(ret(op(arg(&a, 1)?)))
        })?;
        t.raw_set(name, f)?;
    }

    let folds: [(&'static str, Binary); 3] = [
        ("band", |x, y| x & y),
        ("bor", |x, y| x | y),
        ("bxor", |x, y| x ^ y),
    ];
    for (name, op) in folds {
        let f = wrap.one(lua, move |lua, args: MultiValue| {
            let a = Args::new(lua, args, name);
            let mut b = arg(&a, 1)?;
            // Checked from the last argument down, as the C code does.
            for n in (2..=a.len()).rev() {
                b = op(b, arg(&a, n)?);
            }
            Ok(ret(b))
        })?;
        t.raw_set(name, f)?;
    }

    let shifts: [(&'static str, Binary); 5] = [
        ("lshift", |b, n| b << n),
        ("rshift", |b, n| b >> n),
        ("arshift", |b, n| ((b as i32) >> n) as u32),
        ("rol", u32::rotate_left),
        ("ror", u32::rotate_right),
    ];
    for (name, op) in shifts {
        let f = wrap.one(lua, move |lua, args: MultiValue| {
            let a = Args::new(lua, args, name);
            let b = arg(&a, 1)?;
            let n = arg(&a, 2)? & 31;
            Ok(ret(op(b, n)))
        })?;
        t.raw_set(name, f)?;
    }

    t.raw_set("tohex", wrap.one(lua, tohex)?)?;
    Ok(t)
}

/// `tohex(x [, n])`: the low |n| hex digits of x (default 8), uppercase when
/// n is negative.
fn tohex(lua: &Lua, args: MultiValue) -> LibResult<Value> {
    let a = Args::new(lua, args, "tohex");
    let mut b = arg(&a, 1)?;
    let mut n = if a.len() < 2 { 8 } else { arg(&a, 2)? as i32 };
    let mut digits: &[u8; 16] = b"0123456789abcdef";
    if n < 0 {
        n = n.wrapping_neg();
        digits = b"0123456789ABCDEF";
    }
    // i32::MIN stays negative when negated; Redis's build prints 8 digits.
    if !(0..=8).contains(&n) {
        n = 8;
    }
    let mut buf = vec![0u8; n as usize];
    for slot in buf.iter_mut().rev() {
        *slot = digits[(b & 15) as usize];
        b >>= 4;
    }
    Ok(Value::String(lua.create_string(&buf)?))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{err, eval, lua};

    #[test]
    fn matches_redis() {
        let l = lua();
        let cases = [
            ("bit.tobit(2^32+5)", "5"),
            ("bit.tobit(2^31)", "-2147483648"),
            ("bit.tobit(-1)", "-1"),
            ("bit.tobit(1.5)", "2"),
            ("bit.tobit(2.5)", "2"),
            ("bit.tobit(-1.5)", "-2"),
            ("bit.tobit('0x10')", "16"),
            ("bit.tobit(2^52+3)", "2"),
            ("bit.tobit(2^60+7)", "0"),
            ("bit.tobit(1/0)", "0"),
            ("bit.tobit(0/0)", "0"),
            ("bit.tobit(-2^31-1)", "2147483647"),
            ("bit.tohex(255)", "000000ff"),
            ("bit.tohex(-1)", "ffffffff"),
            ("bit.tohex(255, 2)", "ff"),
            ("bit.tohex(255, -2)", "FF"),
            ("bit.tohex(255, -10)", "000000FF"),
            ("bit.tohex(255, 0)", ""),
            ("bit.tohex(0x1234, 12)", "00001234"),
            ("bit.tohex(255, -2^31)", "000000FF"),
            ("bit.tohex(255, 2^32-3)", "0FF"),
            ("bit.tohex(255, '3')", "0ff"),
            ("bit.bnot(0)", "-1"),
            ("bit.band(0xff, 0x0f, 0x3)", "3"),
            ("bit.bor(1, 2, 4)", "7"),
            ("bit.bxor(1, 3)", "2"),
            ("bit.band(5)", "5"),
            ("bit.lshift(1, 31)", "-2147483648"),
            ("bit.lshift(1, 32)", "1"),
            ("bit.lshift(1, 33)", "2"),
            ("bit.lshift(1, -1)", "-2147483648"),
            ("bit.rshift(-1, 28)", "15"),
            ("bit.arshift(-256, 4)", "-16"),
            ("bit.rol(0x80000001, 1)", "3"),
            ("bit.ror(1, 1)", "-2147483648"),
            ("bit.bswap(0x12345678)", "2018915346"),
        ];
        for (code, want) in cases {
            assert_eq!(eval(&l, &format!("return {code}")), want, "{code}");
        }
        let errors = [
            (
                "bit.band()",
                "bad argument #1 to 'band' (number expected, got no value)",
            ),
            (
                "bit.band(1, 'x')",
                "bad argument #2 to 'band' (number expected, got string)",
            ),
            (
                "bit.tobit({})",
                "bad argument #1 to 'tobit' (number expected, got table)",
            ),
            (
                "bit.tohex(1, {})",
                "bad argument #2 to 'tohex' (number expected, got table)",
            ),
            (
                "bit.tohex(1, nil)",
                "bad argument #2 to 'tohex' (number expected, got nil)",
            ),
        ];
        for (code, want) in errors {
            assert_eq!(err(&l, code), format!("user_script:1: {want}"), "{code}");
        }
    }
}
