//! Long double arithmetic, as INCRBYFLOAT and HINCRBYFLOAT do it.
//!
//! Redis adds these increments in C `long double` (80-bit extended precision on x86-64)
//! and prints the sum with `%.17Lf` before trimming it, so results such as `10.5 + 0.1`
//! come out as `10.6` rather than the `10.6000000000000001` a `f64` would give. The
//! arithmetic, the parsing (`strtold`) and the printing live in `csrc/longdouble.c`,
//! compiled by `build.rs`; this module is the safe interface to it.

use std::ffi::{c_char, c_int, c_long};

extern "C" {
    #[allow(dead_code)] // reached through `is_valid`
    fn kite_ld_valid(s: *const c_char, len: usize) -> c_int;
    fn kite_ld_add(
        a: *const c_char,
        alen: usize,
        b: *const c_char,
        blen: usize,
        out: *mut c_char,
        outlen: usize,
    ) -> c_long;
}

/// Inputs this long or longer are refused, and no printed sum is longer.
pub const MAX_CHARS: usize = 5 * 1024;

pub const NOT_FLOAT: &str = "ERR value is not a valid float";
pub const NOT_FINITE: &str = "ERR increment would produce NaN or Infinity";

/// Why an addition failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddError {
    /// The current value does not read as a number.
    Current,
    /// The increment does not read as a number.
    Increment,
    /// The sum is NaN or infinite.
    NotFinite,
}

/// Whether `s` reads as a long double the way Redis's `string2ld` accepts it: the whole
/// input, no leading space, no NaN, no overflow to infinity or underflow to zero, fewer
/// than `MAX_CHARS` bytes. `inf`, `1e5`, `0x10` and `+1` are accepted. HINCRBYFLOAT
/// checks its increment with it before its current value, as Redis does.
#[allow(dead_code)] // for HINCRBYFLOAT
pub fn is_valid(s: &[u8]) -> bool {
    // SAFETY: the pointer and length describe `s`, which outlives the call; the C side
    // reads at most `len` bytes and keeps nothing.
    unsafe { kite_ld_valid(s.as_ptr().cast(), s.len()) != 0 }
}

/// Adds `incr` to `current` in long double and prints the sum as Redis does (`%.17Lf`,
/// trailing zeros and point removed, `-0` printed as `0`).
pub fn add(current: &[u8], incr: &[u8]) -> Result<Vec<u8>, AddError> {
    let mut buf = [0u8; MAX_CHARS];
    // SAFETY: all three pointer/length pairs describe live buffers owned by this frame or
    // borrowed for its duration; the C side writes at most `buf.len()` bytes into `buf`.
    let n = unsafe {
        kite_ld_add(
            current.as_ptr().cast(),
            current.len(),
            incr.as_ptr().cast(),
            incr.len(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    match n {
        -1 => Err(AddError::Current),
        -2 => Err(AddError::Increment),
        -3 => Err(AddError::NotFinite),
        // The largest finite long double prints in under 5,000 bytes, so the buffer is
        // never short; Redis would store an empty string if it were.
        n if n < 0 => Ok(Vec::new()),
        n => Ok(buf[..n as usize].to_vec()),
    }
}

/// INCRBYFLOAT's arithmetic with its error replies: the new value's bytes, or the error.
pub fn incr_by_float(current: &[u8], incr: &[u8]) -> Result<Vec<u8>, &'static str> {
    add(current, incr).map_err(|e| match e {
        AddError::Current | AddError::Increment => NOT_FLOAT,
        AddError::NotFinite => NOT_FINITE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(a: &str, b: &str) -> String {
        String::from_utf8(add(a.as_bytes(), b.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn sums_print_like_redis() {
        assert_eq!(sum("10.5", "0.1"), "10.6");
        assert_eq!(sum("0.1", "0.2"), "0.3");
        assert_eq!(sum("5.0e3", "2.0e2"), "5200");
        assert_eq!(sum("0", "3.0"), "3");
        assert_eq!(sum("0", "3.0e3"), "3000");
        assert_eq!(sum("0", "1e20"), "100000000000000000000");
        assert_eq!(sum("10", "-1.1"), "8.9");
        assert_eq!(sum("1", "-1.1"), "-0.1");
        assert_eq!(sum("0", "0x10"), "16");
        assert_eq!(sum("+1", "1"), "2");
        assert_eq!(sum("9223372036854775807", "1"), "9223372036854775808");
        assert_eq!(sum("0", "0.00000000000000001"), "0.00000000000000001");
        // Below the 17th decimal the digits are rounded away.
        assert_eq!(sum("0", "0.000000000000000001"), "0");
    }

    #[test]
    fn negative_zero_prints_as_zero() {
        assert_eq!(sum("-0", "0"), "0");
        assert_eq!(sum("0", "-0.0"), "0");
        assert_eq!(sum("0", "-0.000000000000000001"), "0");
        // What the "no negative zero" scenario produces: x then -x through the text.
        let x = sum("0", &format!("{}", 1.0f64 / 41.0));
        assert_eq!(sum(&x, &format!("{}", -1.0f64 / 41.0)), "0");
    }

    #[test]
    fn non_finite_results_are_refused() {
        // Long double reaches about 1.19e4932, so sums past f64's range still succeed.
        let big = add(b"1e308", b"9e308").unwrap();
        assert_eq!(big.len(), 309);
        assert!(big.starts_with(b"99999999999999999998634942458"));
        assert_eq!(add(b"1e4932", b"1e4932"), Err(AddError::NotFinite));
        assert_eq!(add(b"0", b"inf"), Err(AddError::NotFinite));
        assert_eq!(add(b"-inf", b"1"), Err(AddError::NotFinite));
        assert_eq!(incr_by_float(b"0", b"inf"), Err(NOT_FINITE));
    }

    #[test]
    fn parsing_follows_strtold_with_redis_checks() {
        for ok in [
            "1", "1.5", "-1.5", "1e5", "0x10", "+3", ".5", "5.", "inf", "-inf", "1E-10",
        ] {
            assert!(is_valid(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "", " 1", "1 ", "\t1", "abc", "nan", "1x", "1e99999", "1e-99999", "--1",
        ] {
            assert!(!is_valid(bad.as_bytes()), "{bad:?}");
        }
        assert!(!is_valid(b"1\x002"));
        assert!(!is_valid(&[b'1'; MAX_CHARS]));
        assert!(is_valid(&[b'1'; 300]));
        assert_eq!(add(b"abc", b"1"), Err(AddError::Current));
        assert_eq!(add(b"1", b"abc"), Err(AddError::Increment));
        assert_eq!(incr_by_float(b"1", b"x"), Err(NOT_FLOAT));
    }

    #[test]
    fn huge_values_fit_the_buffer() {
        let v = add(b"1e4931", b"0").unwrap();
        assert_eq!(v.len(), 4932);
        assert!(v.starts_with(b"1") || v.starts_with(b"9"));
    }
}
