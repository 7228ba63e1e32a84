//! Argument parsing shared by the command families, with Redis's error texts.

use crate::types::value::parse_canonical_i64;

pub const SYNTAX_ERR: &str = "ERR syntax error";
pub const NOT_INT: &str = "ERR value is not an integer or out of range";
pub const NOT_FLOAT: &str = "ERR value is not a valid float";
pub const OVERFLOW: &str = "ERR increment or decrement would overflow";
pub const NO_SUCH_KEY: &str = "ERR no such key";

/// Parses an integer argument as Redis's `string2ll` does (strict: no spaces, no `+`).
pub fn parse_i64(arg: &[u8]) -> Result<i64, &'static str> {
    parse_canonical_i64(arg).ok_or(NOT_INT)
}

/// Parses a float as Redis's `string2d`/`strtold` based parsers do: no spaces, no empty
/// string, `inf`/`-inf` accepted, NaN rejected.
pub fn parse_f64(arg: &[u8]) -> Result<f64, &'static str> {
    let s = std::str::from_utf8(arg).map_err(|_| NOT_FLOAT)?;
    if s.is_empty() || s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace) {
        return Err(NOT_FLOAT);
    }
    let lower = s.to_ascii_lowercase();
    let v = match lower.as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => f64::INFINITY,
        "-inf" | "-infinity" => f64::NEG_INFINITY,
        _ => {
            // Rust accepts forms C does not ("1_0" no, but "infinity" variants handled
            // above); reject words like "nan".
            if lower.contains("nan") {
                return Err(NOT_FLOAT);
            }
            lower.parse::<f64>().map_err(|_| NOT_FLOAT)?
        }
    };
    if v.is_nan() {
        return Err(NOT_FLOAT);
    }
    Ok(v)
}

pub fn eq_ci(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

/// Renders bytes for an error message the way Redis does: printable ASCII kept, the rest
/// escaped, cut to `max` bytes.
pub fn printable(b: &[u8], max: usize) -> String {
    let mut s = String::new();
    for &c in b.iter().take(max) {
        match c {
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            b'\\' => s.push_str("\\\\"),
            b'"' => s.push_str("\\\""),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{:02x}", c)),
        }
    }
    s
}

/// Redis's `stringmatchlen`: glob matching with `*`, `?`, `[...]` (with `^` and ranges)
/// and `\` escapes, optionally case-insensitive.
pub fn glob_match(pattern: &[u8], text: &[u8], nocase: bool) -> bool {
    glob_inner(pattern, text, nocase, 0) == Glob::Match
}

#[derive(PartialEq, Eq)]
enum Glob {
    Match,
    NoMatch,
    /// A `*` tried every rest of the text and none matched: a `*` further out, trying a
    /// shorter rest, cannot match either (the fix for CVE-2022-36021, where patterns like
    /// `a*a*a*...b` took exponential time).
    GiveUp,
}

fn glob_inner(mut p: &[u8], mut s: &[u8], nocase: bool, depth: usize) -> Glob {
    // Bound recursion on hostile patterns (many stars), as Redis does.
    if depth > 1000 {
        return Glob::NoMatch;
    }
    let fold = |c: u8| if nocase { c.to_ascii_lowercase() } else { c };
    while !p.is_empty() {
        match p[0] {
            b'*' => {
                while p.len() > 1 && p[1] == b'*' {
                    p = &p[1..];
                }
                if p.len() == 1 {
                    return Glob::Match;
                }
                for i in 0..=s.len() {
                    match glob_inner(&p[1..], &s[i..], nocase, depth + 1) {
                        Glob::NoMatch => {}
                        found_or_hopeless => return found_or_hopeless,
                    }
                }
                return Glob::GiveUp;
            }
            b'?' => {
                if s.is_empty() {
                    return Glob::NoMatch;
                }
                s = &s[1..];
            }
            b'[' => {
                if s.is_empty() {
                    return Glob::NoMatch;
                }
                p = &p[1..];
                let not = !p.is_empty() && p[0] == b'^';
                if not {
                    p = &p[1..];
                }
                let mut matched = false;
                loop {
                    if p.is_empty() {
                        break;
                    }
                    if p[0] == b'\\' && p.len() >= 2 {
                        p = &p[1..];
                        if p[0] == s[0] {
                            matched = true;
                        }
                    } else if p[0] == b']' {
                        break;
                    } else if p.len() >= 3 && p[1] == b'-' {
                        let (mut start, mut end) = (p[0], p[2]);
                        if start > end {
                            std::mem::swap(&mut start, &mut end);
                        }
                        let c = s[0];
                        let (start, end, c) = if nocase {
                            (
                                start.to_ascii_lowercase(),
                                end.to_ascii_lowercase(),
                                c.to_ascii_lowercase(),
                            )
                        } else {
                            (start, end, c)
                        };
                        p = &p[2..];
                        if c >= start && c <= end {
                            matched = true;
                        }
                    } else if fold(p[0]) == fold(s[0]) {
                        matched = true;
                    }
                    p = &p[1..];
                }
                if not {
                    matched = !matched;
                }
                if !matched {
                    return Glob::NoMatch;
                }
                s = &s[1..];
                if p.is_empty() {
                    // Unterminated class: Redis treats the end of the pattern as its end.
                    return if s.is_empty() {
                        Glob::Match
                    } else {
                        Glob::NoMatch
                    };
                }
            }
            b'\\' if p.len() >= 2 => {
                p = &p[1..];
                if s.is_empty() || fold(p[0]) != fold(s[0]) {
                    return Glob::NoMatch;
                }
                s = &s[1..];
            }
            c => {
                if s.is_empty() || fold(c) != fold(s[0]) {
                    return Glob::NoMatch;
                }
                s = &s[1..];
            }
        }
        p = &p[1..];
        if s.is_empty() {
            while !p.is_empty() && p[0] == b'*' {
                p = &p[1..];
            }
            break;
        }
    }
    if p.is_empty() && s.is_empty() {
        Glob::Match
    } else {
        Glob::NoMatch
    }
}

/// A SCAN cursor read as C's `strtoul` reads it, as Redis 7.2 does: no leading space, an
/// optional sign (a minus wraps around), decimal digits to the end, no overflow. The
/// argument ends at a NUL byte, like a C string.
pub fn parse_cursor(arg: &[u8]) -> Option<u64> {
    let s = &arg[..arg.iter().position(|&b| b == 0).unwrap_or(arg.len())];
    let Some(&first) = s.first() else {
        return Some(0);
    };
    if first.is_ascii_whitespace() || first == 0x0b {
        return None;
    }
    let (negative, digits) = match first {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: u64 = 0;
    for d in digits {
        v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    Some(if negative { v.wrapping_neg() } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(b"*", b"anything", false));
        assert!(glob_match(b"h?llo", b"hello", false));
        assert!(glob_match(b"h[ae]llo", b"hallo", false));
        assert!(!glob_match(b"h[^e]llo", b"hello", false));
        assert!(glob_match(b"h[a-b]llo", b"hbllo", false));
        assert!(glob_match(b"user:*:name", b"user:42:name", false));
        assert!(!glob_match(b"user:*:name", b"user:42:age", false));
        assert!(glob_match(b"a\\*b", b"a*b", false));
        assert!(glob_match(b"HELLO", b"hello", true));
        assert!(!glob_match(b"a", b"", false));
        assert!(glob_match(b"", b"", false));
        assert!(glob_match(b"a*b*c", b"axxbyyc", false));
        assert!(!glob_match(b"a*b*c", b"axxbyyd", false));
        assert!(glob_match(b"*a*b", b"xxaxxab", false));
    }

    /// CVE-2022-36021: nested stars against a long run of one letter took exponential
    /// time (this test never ended before the fix); now a star that tried every rest of
    /// the text tells the stars outside it to stop.
    #[test]
    fn nested_stars_end() {
        let pattern = format!("{}b", "a*".repeat(40));
        let text = vec![b'a'; 200];
        assert!(!glob_match(pattern.as_bytes(), &text, false));
        let mut text_b = text.clone();
        text_b.push(b'b');
        assert!(glob_match(pattern.as_bytes(), &text_b, false));
    }

    #[test]
    fn floats() {
        assert_eq!(parse_f64(b"1.5"), Ok(1.5));
        assert_eq!(parse_f64(b"-inf"), Ok(f64::NEG_INFINITY));
        assert!(parse_f64(b"nan").is_err());
        assert!(parse_f64(b" 1").is_err());
        assert!(parse_f64(b"").is_err());
        assert!(parse_f64(b"1e5").is_ok());
    }
}

/// Redis's `pqsort`: a quicksort (Bentley-McIlroy, as in BSD's qsort) that only sorts
/// what it must for positions `lrange..=rrange` to hold the right elements in order.
/// Kept step for step, because the order it leaves equal elements in is what SORT ...
/// LIMIT and GEOSEARCH ... COUNT return.
pub fn pqsort<T>(
    v: &mut [T],
    cmp: &dyn Fn(&T, &T) -> std::cmp::Ordering,
    lrange: usize,
    rrange: usize,
) {
    use std::cmp::Ordering::{Equal, Greater, Less};
    fn med3<T>(
        v: &[T],
        a: usize,
        b: usize,
        c: usize,
        cmp: &dyn Fn(&T, &T) -> std::cmp::Ordering,
    ) -> usize {
        if cmp(&v[a], &v[b]) == Less {
            if cmp(&v[b], &v[c]) == Less {
                b
            } else if cmp(&v[a], &v[c]) == Less {
                c
            } else {
                a
            }
        } else if cmp(&v[b], &v[c]) == Greater {
            b
        } else if cmp(&v[a], &v[c]) == Less {
            a
        } else {
            c
        }
    }
    fn vecswap<T>(v: &mut [T], a: usize, b: usize, n: usize) {
        for i in 0..n {
            v.swap(a + i, b + i);
        }
    }
    // Whether the sub-array [s, s + n) overlaps the wanted range.
    let wanted =
        |s: usize, n: usize| !((lrange < s && rrange < s) || (lrange >= s + n && rrange >= s + n));
    fn run<T>(
        v: &mut [T],
        mut a: usize,
        mut n: usize,
        cmp: &dyn Fn(&T, &T) -> std::cmp::Ordering,
        wanted: &dyn Fn(usize, usize) -> bool,
    ) {
        loop {
            if n < 7 {
                for pm in a + 1..a + n {
                    let mut pl = pm;
                    while pl > a && cmp(&v[pl - 1], &v[pl]) == Greater {
                        v.swap(pl, pl - 1);
                        pl -= 1;
                    }
                }
                return;
            }
            let mut pm = a + n / 2;
            if n > 7 {
                let mut pl = a;
                let mut pn = a + n - 1;
                if n > 40 {
                    let d = n / 8;
                    pl = med3(v, pl, pl + d, pl + 2 * d, cmp);
                    pm = med3(v, pm - d, pm, pm + d, cmp);
                    pn = med3(v, pn - 2 * d, pn - d, pn, cmp);
                }
                pm = med3(v, pl, pm, pn, cmp);
            }
            v.swap(a, pm);
            let (mut pa, mut pb) = (a + 1, a + 1);
            let (mut pc, mut pd) = (a + n - 1, a + n - 1);
            loop {
                while pb <= pc {
                    let c = cmp(&v[pb], &v[a]);
                    if c == Greater {
                        break;
                    }
                    if c == Equal {
                        v.swap(pa, pb);
                        pa += 1;
                    }
                    pb += 1;
                }
                while pb <= pc {
                    let c = cmp(&v[pc], &v[a]);
                    if c == Less {
                        break;
                    }
                    if c == Equal {
                        v.swap(pc, pd);
                        pd -= 1;
                    }
                    pc -= 1;
                }
                if pb > pc {
                    break;
                }
                v.swap(pb, pc);
                pb += 1;
                pc -= 1;
            }
            let pn = a + n;
            let r = (pa - a).min(pb - pa);
            vecswap(v, a, pb - r, r);
            let r = (pd - pc).min(pn - pd - 1);
            vecswap(v, pb, pn - r, r);
            // The two sides are disjoint, so the order they are sorted in changes
            // nothing; recursing into the smaller one bounds the depth to log n
            // whatever the input (a client's data).
            let left = (a, pb - pa);
            let right = (pn - (pd - pc), pd - pc);
            let (small, large) = if left.1 <= right.1 {
                (left, right)
            } else {
                (right, left)
            };
            if small.1 > 1 && wanted(small.0, small.1) {
                run(v, small.0, small.1, cmp, wanted);
            }
            if large.1 > 1 && wanted(large.0, large.1) {
                a = large.0;
                n = large.1;
                continue;
            }
            return;
        }
    }
    let n = v.len();
    run(v, 0, n, cmp, &wanted);
}

#[cfg(test)]
mod pqsort_tests {
    use super::pqsort;

    #[test]
    fn sorts_the_asked_window() {
        let mut seed = 7u64;
        for len in [0usize, 1, 5, 8, 40, 41, 200, 1000] {
            let mut v: Vec<u64> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % 50
                })
                .collect();
            let mut sorted = v.clone();
            sorted.sort();
            if len == 0 {
                continue;
            }
            let hi = (len / 3).max(1) - 1;
            pqsort(&mut v, &|a: &u64, b: &u64| a.cmp(b), 0, hi);
            assert_eq!(&v[..=hi], &sorted[..=hi]);
        }
    }
}
