//! The hash family (Redis 7.2 semantics, replies and error texts).
//!
//! Handlers read their arguments in the order Redis reads them, so a command with several
//! faults reports the one Redis reports: an odd HSET is an arity error even on a key of
//! another type, HINCRBY checks its increment before the key, HRANDFIELD and HSCAN check
//! their cursor or count before the key and their options after it.

use bytes::Bytes;

use super::util::parse_cursor;

use crate::commands::arity_error;
use crate::commands::util::{glob_match, parse_i64, NOT_INT, OVERFLOW, SYNTAX_ERR};
use crate::protocol::reply::Reply;
use crate::shard::ExecCtx;
use crate::types::hash::Hash;
use crate::types::longdouble::{self, AddError};
use crate::types::table::Entry;
use crate::types::value::{parse_canonical_i64, Value, WRONGTYPE};

const HASH_NOT_INT: &str = "ERR hash value is not an integer";
const HASH_NOT_FLOAT: &str = "ERR hash value is not a float";
const INCR_NOT_FINITE: &str = "ERR value is NaN or Infinity";
const OUT_OF_RANGE: &str = "ERR value is out of range";
const RANDFIELD_RANGE: &str =
    "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807";
const INVALID_CURSOR: &str = "ERR invalid cursor";

// ---------------------------------------------------------------------------------------
// Lookups
// ---------------------------------------------------------------------------------------

/// A read lookup that also hands back the reply buffer (see `ExecCtx::get_read_and_out`).
fn lookup<'c>(ctx: &'c mut ExecCtx<'_>, key: &[u8]) -> (Option<&'c mut Entry>, &'c mut Reply) {
    ctx.get_read_and_out(key)
}

/// What a read lookup found.
enum Found<'a> {
    Missing,
    Hash(&'a Hash),
    WrongType,
}

fn read<'c>(ctx: &'c mut ExecCtx<'_>, key: &[u8]) -> (Found<'c>, &'c mut Reply) {
    let (entry, out) = lookup(ctx, key);
    let found = match entry {
        None => Found::Missing,
        Some(e) => match &e.value {
            Value::Hash(h) => Found::Hash(h),
            _ => Found::WrongType,
        },
    };
    (found, out)
}

/// The hash at `key` for writing: Ok(None) when missing, Err when another type.
fn hash_mut<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a mut Hash>, ()> {
    match ctx.get(key) {
        None => Ok(None),
        Some(e) => match &mut e.value {
            Value::Hash(h) => Ok(Some(h)),
            _ => Err(()),
        },
    }
}

/// Applies `f` to the hash at `key`, creating the key when it is missing, as Redis's
/// write-or-create lookup does; an error from `f` on a new hash leaves no key behind.
fn with_hash<T>(
    ctx: &mut ExecCtx,
    key: &[u8],
    f: impl FnOnce(&mut Hash) -> Result<T, &'static str>,
) -> Result<T, &'static str> {
    match hash_mut(ctx, key) {
        Err(()) => Err(WRONGTYPE),
        Ok(Some(h)) => {
            let r = f(h)?;
            ctx.modified(key);
            Ok(r)
        }
        Ok(None) => {
            let mut h = Hash::new();
            let r = f(&mut h)?;
            if !h.is_empty() {
                ctx.set(key, Value::Hash(Box::new(h)), 0);
            }
            Ok(r)
        }
    }
}

/// Compares an option word as Redis's `strcasecmp` does: case-insensitive, the argument
/// ending at its first NUL byte.
fn opt_is(arg: &[u8], word: &str) -> bool {
    let end = arg.iter().position(|&b| b == 0).unwrap_or(arg.len());
    arg[..end].eq_ignore_ascii_case(word.as_bytes())
}

// ---------------------------------------------------------------------------------------
// Writes
// ---------------------------------------------------------------------------------------

/// HSET and HMSET: field/value pairs; the number of new fields.
fn set_pairs(ctx: &mut ExecCtx, args: &[Bytes], name: &str) -> Option<i64> {
    if args.len() % 2 == 1 {
        ctx.out.error(&arity_error(name));
        return None;
    }
    let key = &args[1];
    let pairs = &args[2..];
    let longest = pairs.iter().map(|a| a.len()).max().unwrap_or(0);
    let r = with_hash(ctx, key, |h| {
        h.prepare(pairs.len() / 2, longest);
        Ok(pairs
            .chunks_exact(2)
            .filter(|p| h.insert(&p[0], &p[1]))
            .count() as i64)
    });
    match r {
        Ok(added) => {
            ctx.notify(b'h', "hset", key);
            Some(added)
        }
        Err(e) => {
            ctx.out.error(e);
            None
        }
    }
}

pub fn hset(ctx: &mut ExecCtx, args: &[Bytes]) {
    if let Some(added) = set_pairs(ctx, args, "hset") {
        ctx.out.int(added);
    }
}

pub fn hmset(ctx: &mut ExecCtx, args: &[Bytes]) {
    if set_pairs(ctx, args, "hmset").is_some() {
        ctx.out.ok();
    }
}

pub fn hsetnx(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (key, field, value) = (&args[1], &args[2], &args[3]);
    let added = match hash_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(Some(h)) => {
            if h.contains(field) {
                false
            } else {
                h.insert(field, value);
                ctx.modified(key);
                true
            }
        }
        Ok(None) => {
            let mut h = Hash::new();
            h.insert(field, value);
            ctx.set(key, Value::Hash(Box::new(h)), 0);
            true
        }
    };
    if added {
        ctx.notify(b'h', "hset", key);
    }
    ctx.out.int(added as i64);
}

pub fn hdel(ctx: &mut ExecCtx, args: &[Bytes]) {
    let key = &args[1];
    let (removed, emptied) = match hash_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.int(0),
        Ok(Some(h)) => {
            let mut removed = 0;
            for f in &args[2..] {
                if h.remove(f) {
                    removed += 1;
                    if h.is_empty() {
                        break;
                    }
                }
            }
            (removed, h.is_empty())
        }
    };
    if removed > 0 {
        if emptied {
            ctx.delete(key);
        } else {
            ctx.modified(key);
        }
        ctx.notify(b'h', "hdel", key);
        if emptied {
            ctx.notify(b'g', "del", key);
        }
    }
    ctx.out.int(removed);
}

pub fn hincrby(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (key, field) = (&args[1], &args[2]);
    let incr = match parse_i64(&args[3]) {
        Ok(v) => v,
        Err(e) => return ctx.out.error(e),
    };
    let r = with_hash(ctx, key, |h| {
        let current = match h.get(field) {
            None => 0,
            Some(v) => parse_canonical_i64(v).ok_or(HASH_NOT_INT)?,
        };
        let new = current.checked_add(incr).ok_or(OVERFLOW)?;
        h.insert(field, new.to_string().as_bytes());
        Ok(new)
    });
    match r {
        Ok(v) => {
            ctx.notify(b'h', "hincrby", key);
            ctx.out.int(v);
        }
        Err(e) => ctx.out.error(e),
    }
}

/// Adds in C `long double` and prints the sum as Redis does (see `types::longdouble`).
pub fn hincrbyfloat(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (key, field, incr) = (&args[1], &args[2], &args[3]);
    if !longdouble::is_valid(incr) {
        return ctx.out.error(longdouble::NOT_FLOAT);
    }
    // A valid increment that is not finite is ±inf: zero plus it is not finite either.
    if longdouble::add(b"0", incr) == Err(AddError::NotFinite) {
        return ctx.out.error(INCR_NOT_FINITE);
    }
    let r = with_hash(ctx, key, |h| {
        let sum = longdouble::add(h.get(field).unwrap_or(b"0"), incr).map_err(|e| match e {
            AddError::Current => HASH_NOT_FLOAT,
            AddError::Increment => longdouble::NOT_FLOAT,
            AddError::NotFinite => longdouble::NOT_FINITE,
        })?;
        h.insert(field, &sum);
        Ok(sum)
    });
    match r {
        Ok(v) => {
            ctx.notify(b'h', "hincrbyfloat", key);
            ctx.out.bulk(&v);
        }
        Err(e) => ctx.out.error(e),
    }
}

// ---------------------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------------------

pub fn hget(ctx: &mut ExecCtx, args: &[Bytes]) {
    match read(ctx, &args[1]) {
        (Found::Missing, out) => out.null(),
        (Found::WrongType, out) => out.error(WRONGTYPE),
        (Found::Hash(h), out) => out.opt_bulk(h.get(&args[2])),
    }
}

pub fn hmget(ctx: &mut ExecCtx, args: &[Bytes]) {
    let fields = &args[2..];
    match read(ctx, &args[1]) {
        (Found::WrongType, out) => out.error(WRONGTYPE),
        (Found::Missing, out) => {
            out.array(fields.len());
            for _ in fields {
                out.null();
            }
        }
        (Found::Hash(h), out) => {
            out.array(fields.len());
            for f in fields {
                out.opt_bulk(h.get(f));
            }
        }
    }
}

pub fn hlen(ctx: &mut ExecCtx, args: &[Bytes]) {
    match read(ctx, &args[1]) {
        (Found::Missing, out) => out.int(0),
        (Found::WrongType, out) => out.error(WRONGTYPE),
        (Found::Hash(h), out) => out.int(h.len() as i64),
    }
}

pub fn hstrlen(ctx: &mut ExecCtx, args: &[Bytes]) {
    match read(ctx, &args[1]) {
        (Found::Missing, out) => out.int(0),
        (Found::WrongType, out) => out.error(WRONGTYPE),
        (Found::Hash(h), out) => out.int(h.get(&args[2]).map_or(0, |v| v.len()) as i64),
    }
}

pub fn hexists(ctx: &mut ExecCtx, args: &[Bytes]) {
    match read(ctx, &args[1]) {
        (Found::Missing, out) => out.int(0),
        (Found::WrongType, out) => out.error(WRONGTYPE),
        (Found::Hash(h), out) => out.int(h.contains(&args[2]) as i64),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Fields,
    Values,
    Both,
}

/// HKEYS, HVALS and HGETALL: arrays for one part, a map (RESP3) for both.
fn get_all(ctx: &mut ExecCtx, args: &[Bytes], part: Part) {
    let (found, out) = read(ctx, &args[1]);
    let h = match found {
        Found::WrongType => return out.error(WRONGTYPE),
        Found::Missing => {
            return if part == Part::Both {
                out.map(0)
            } else {
                out.array(0)
            };
        }
        Found::Hash(h) => h,
    };
    match part {
        Part::Both => out.map(h.len()),
        _ => out.array(h.len()),
    }
    for (f, v) in h.iter() {
        if part != Part::Values {
            out.bulk(f);
        }
        if part != Part::Fields {
            out.bulk(v);
        }
    }
}

pub fn hkeys(ctx: &mut ExecCtx, args: &[Bytes]) {
    get_all(ctx, args, Part::Fields);
}

pub fn hvals(ctx: &mut ExecCtx, args: &[Bytes]) {
    get_all(ctx, args, Part::Values);
}

pub fn hgetall(ctx: &mut ExecCtx, args: &[Bytes]) {
    get_all(ctx, args, Part::Both);
}

// ---------------------------------------------------------------------------------------
// HRANDFIELD
// ---------------------------------------------------------------------------------------

/// A xorshift64* generator seeded from the shard's: the lookup below holds the shard
/// borrowed while the picks are made.
fn local_rng(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

pub fn hrandfield(ctx: &mut ExecCtx, args: &[Bytes]) {
    let mut rand = local_rng(ctx.shard.random());
    if args.len() == 2 {
        let (found, out) = read(ctx, &args[1]);
        return match found {
            Found::Missing => out.null(),
            Found::WrongType => out.error(WRONGTYPE),
            Found::Hash(h) => out.bulk(h.random_pair(&mut rand).0),
        };
    }
    let n = match parse_i64(&args[2]) {
        Ok(n) if n == i64::MIN => return ctx.out.error(RANDFIELD_RANGE),
        Ok(n) => n,
        Err(e) => return ctx.out.error(e),
    };
    if args.len() > 4 || (args.len() == 4 && !opt_is(&args[3], "withvalues")) {
        return ctx.out.error(SYNTAX_ERR);
    }
    let with_values = args.len() == 4;
    // Redis refuses counts whose doubled reply length would overflow.
    if with_values && !(-(i64::MAX / 2)..=i64::MAX / 2).contains(&n) {
        return ctx.out.error(OUT_OF_RANGE);
    }
    let (found, out) = read(ctx, &args[1]);
    let h = match found {
        Found::Missing => return out.array(0),
        Found::WrongType => return out.error(WRONGTYPE),
        Found::Hash(h) => h,
    };
    let count = n.unsigned_abs() as usize;
    if count == 0 {
        return out.array(0);
    }
    let resp3 = out.resp3;
    let put = |out: &mut Reply, f: &[u8], v: &[u8]| {
        if with_values && resp3 {
            out.array(2);
        }
        out.bulk(f);
        if with_values {
            out.bulk(v);
        }
    };
    let header = |out: &mut Reply, pairs: usize| {
        out.array(if with_values && !resp3 {
            pairs * 2
        } else {
            pairs
        });
    };
    if n < 0 || count == 1 {
        header(out, count);
        h.random_pairs(count, &mut rand, |f, v| put(out, f, v));
    } else if count >= h.len() {
        header(out, h.len());
        for (f, v) in h.iter() {
            put(out, f, v);
        }
    } else {
        header(out, count);
        for (f, v) in h.sample_distinct(count, &mut rand) {
            put(out, f, v);
        }
    }
}

// ---------------------------------------------------------------------------------------
// HSCAN
// ---------------------------------------------------------------------------------------

pub fn hscan(ctx: &mut ExecCtx, args: &[Bytes]) {
    let Some(cursor) = parse_cursor(&args[2]) else {
        return ctx.out.error(INVALID_CURSOR);
    };
    let (found, out) = read(ctx, &args[1]);
    let h = match found {
        Found::Missing => {
            out.array(2);
            out.bulk(b"0");
            return out.array(0);
        }
        Found::WrongType => return out.error(WRONGTYPE),
        Found::Hash(h) => h,
    };
    let mut count = 10usize;
    let mut pattern: Option<&[u8]> = None;
    let mut i = 3;
    while i < args.len() {
        let has_value = i + 1 < args.len();
        if has_value && opt_is(&args[i], "count") {
            match parse_i64(&args[i + 1]) {
                Ok(n) if n >= 1 => count = n as usize,
                Ok(_) => return out.error(SYNTAX_ERR),
                Err(_) => return out.error(NOT_INT),
            }
        } else if has_value && opt_is(&args[i], "match") {
            pattern = Some(&args[i + 1]);
        } else {
            // NOVALUES arrived in Redis 7.4; 7.2 refuses it like any unknown word.
            return out.error(SYNTAX_ERR);
        }
        i += 2;
    }
    let mut pairs: Vec<(&[u8], &[u8])> = Vec::new();
    let next = h.scan(cursor, count, |f, v| {
        if pattern.is_none_or(|p| glob_match(p, f, false)) {
            pairs.push((f, v));
        }
    });
    out.array(2);
    out.bulk(next.to_string().as_bytes());
    out.array(pairs.len() * 2);
    for (f, v) in pairs {
        out.bulk(f);
        out.bulk(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::Shard;

    type Handler = fn(&mut ExecCtx, &[Bytes]);

    fn run_proto(sh: &mut Shard, f: Handler, args: &[&[u8]], resp3: bool) -> String {
        let args: Vec<Bytes> = args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
        let mut out = Reply::new(resp3);
        let mut ctx = sh.ctx(0, &mut out);
        f(&mut ctx, &args);
        String::from_utf8_lossy(&out.buf).into_owned()
    }

    fn run(sh: &mut Shard, f: Handler, args: &[&str]) -> String {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        run_proto(sh, f, &args, false)
    }

    fn run3(sh: &mut Shard, f: Handler, args: &[&str]) -> String {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        run_proto(sh, f, &args, true)
    }

    fn encoding_of(sh: &Shard, key: &str) -> Option<&'static str> {
        sh.dbs[0]
            .table
            .get(key.as_bytes())
            .map(|e| e.value.encoding())
    }

    fn set_string(sh: &mut Shard, key: &str) {
        let mut out = Reply::new(false);
        let mut ctx = sh.ctx(0, &mut out);
        ctx.set(
            key.as_bytes(),
            Value::Str(crate::types::value::StrValue::from_bytes(b"x")),
            0,
        );
    }

    #[test]
    fn set_get_and_friends() {
        let mut sh = Shard::for_tests(1);
        let s = &mut sh;
        assert_eq!(run(s, hset, &["hset", "h", "a", "1", "b", "2"]), ":2\r\n");
        assert_eq!(run(s, hset, &["hset", "h", "a", "3", "c", "4"]), ":1\r\n");
        assert_eq!(
            run(s, hset, &["hset", "h", "a", "1", "b"]),
            "-ERR wrong number of arguments for 'hset' command\r\n"
        );
        assert_eq!(
            run(s, hmset, &["hmset", "h", "a"]),
            "-ERR wrong number of arguments for 'hmset' command\r\n"
        );
        assert_eq!(run(s, hmset, &["hmset", "h", "d", "5"]), "+OK\r\n");
        assert_eq!(run(s, hget, &["hget", "h", "a"]), "$1\r\n3\r\n");
        assert_eq!(run(s, hget, &["hget", "h", "zz"]), "$-1\r\n");
        assert_eq!(run3(s, hget, &["hget", "h", "zz"]), "_\r\n");
        assert_eq!(run(s, hget, &["hget", "nokey", "a"]), "$-1\r\n");
        assert_eq!(
            run(s, hmget, &["hmget", "h", "a", "zz", "b"]),
            "*3\r\n$1\r\n3\r\n$-1\r\n$1\r\n2\r\n"
        );
        assert_eq!(
            run(s, hmget, &["hmget", "nokey", "a", "b"]),
            "*2\r\n$-1\r\n$-1\r\n"
        );
        assert_eq!(run(s, hlen, &["hlen", "h"]), ":4\r\n");
        assert_eq!(run(s, hlen, &["hlen", "nokey"]), ":0\r\n");
        assert_eq!(run(s, hstrlen, &["hstrlen", "h", "a"]), ":1\r\n");
        assert_eq!(run(s, hstrlen, &["hstrlen", "h", "zz"]), ":0\r\n");
        assert_eq!(run(s, hexists, &["hexists", "h", "a"]), ":1\r\n");
        assert_eq!(run(s, hexists, &["hexists", "h", "zz"]), ":0\r\n");
        assert_eq!(run(s, hsetnx, &["hsetnx", "h", "a", "9"]), ":0\r\n");
        assert_eq!(run(s, hsetnx, &["hsetnx", "h", "e", "9"]), ":1\r\n");
        assert_eq!(run(s, hsetnx, &["hsetnx", "n", "e", "9"]), ":1\r\n");
        assert_eq!(
            run(s, hkeys, &["hkeys", "h"]),
            "*5\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nd\r\n$1\r\ne\r\n"
        );
        assert_eq!(
            run(s, hvals, &["hvals", "h"]),
            "*5\r\n$1\r\n3\r\n$1\r\n2\r\n$1\r\n4\r\n$1\r\n5\r\n$1\r\n9\r\n"
        );
        assert_eq!(
            run(s, hgetall, &["hgetall", "n"]),
            "*2\r\n$1\r\ne\r\n$1\r\n9\r\n"
        );
        assert_eq!(
            run3(s, hgetall, &["hgetall", "n"]),
            "%1\r\n$1\r\ne\r\n$1\r\n9\r\n"
        );
        assert_eq!(run3(s, hgetall, &["hgetall", "nokey"]), "%0\r\n");
        assert_eq!(run3(s, hkeys, &["hkeys", "nokey"]), "*0\r\n");
        assert_eq!(encoding_of(s, "h"), Some("listpack"));
    }

    #[test]
    fn wrong_type_and_argument_order() {
        let mut sh = Shard::for_tests(1);
        let s = &mut sh;
        set_string(s, "s");
        let wt = format!("-{WRONGTYPE}\r\n");
        for (f, args) in [
            (hset as Handler, vec!["hset", "s", "a", "1"]),
            (hsetnx, vec!["hsetnx", "s", "a", "1"]),
            (hget, vec!["hget", "s", "a"]),
            (hmget, vec!["hmget", "s", "a"]),
            (hdel, vec!["hdel", "s", "a"]),
            (hlen, vec!["hlen", "s"]),
            (hstrlen, vec!["hstrlen", "s", "a"]),
            (hexists, vec!["hexists", "s", "a"]),
            (hkeys, vec!["hkeys", "s"]),
            (hvals, vec!["hvals", "s"]),
            (hgetall, vec!["hgetall", "s"]),
            (hincrby, vec!["hincrby", "s", "a", "1"]),
            (hincrbyfloat, vec!["hincrbyfloat", "s", "a", "1"]),
            (hrandfield, vec!["hrandfield", "s"]),
            (hrandfield, vec!["hrandfield", "s", "0"]),
            (hscan, vec!["hscan", "s", "0"]),
        ] {
            assert_eq!(run(s, f, &args), wt, "{args:?}");
        }
        // Checks Redis makes before it looks at the key.
        assert_eq!(
            run(s, hset, &["hset", "s", "a"]),
            "-ERR wrong number of arguments for 'hset' command\r\n"
        );
        assert_eq!(
            run(s, hincrby, &["hincrby", "s", "a", "x"]),
            "-ERR value is not an integer or out of range\r\n"
        );
        assert_eq!(
            run(s, hincrbyfloat, &["hincrbyfloat", "s", "a", "x"]),
            "-ERR value is not a valid float\r\n"
        );
        assert_eq!(
            run(s, hincrbyfloat, &["hincrbyfloat", "s", "a", "inf"]),
            "-ERR value is NaN or Infinity\r\n"
        );
        assert_eq!(
            run(s, hrandfield, &["hrandfield", "s", "1", "foo"]),
            "-ERR syntax error\r\n"
        );
        assert_eq!(
            run(s, hscan, &["hscan", "s", "x"]),
            "-ERR invalid cursor\r\n"
        );
        // Options are checked after the key: a missing key hides a bad one.
        assert_eq!(
            run(s, hscan, &["hscan", "nokey", "0", "bogus"]),
            "*2\r\n$1\r\n0\r\n*0\r\n"
        );
    }

    #[test]
    fn deleting_the_last_field_deletes_the_key() {
        let mut sh = Shard::for_tests(1);
        let s = &mut sh;
        run(s, hset, &["hset", "h", "a", "1", "b", "2"]);
        assert_eq!(run(s, hdel, &["hdel", "h", "a", "zz", "a"]), ":1\r\n");
        assert_eq!(run(s, hdel, &["hdel", "h", "b", "a"]), ":1\r\n");
        assert_eq!(encoding_of(s, "h"), None);
        assert_eq!(run(s, hdel, &["hdel", "h", "b"]), ":0\r\n");
    }

    #[test]
    fn counters() {
        let mut sh = Shard::for_tests(1);
        let s = &mut sh;
        assert_eq!(run(s, hincrby, &["hincrby", "h", "n", "5"]), ":5\r\n");
        assert_eq!(run(s, hincrby, &["hincrby", "h", "n", "-7"]), ":-2\r\n");
        run(
            s,
            hset,
            &[
                "hset",
                "h",
                "s",
                "abc",
                "z",
                "010",
                "m",
                "9223372036854775806",
            ],
        );
        assert_eq!(
            run(s, hincrby, &["hincrby", "h", "s", "1"]),
            "-ERR hash value is not an integer\r\n"
        );
        assert_eq!(
            run(s, hincrby, &["hincrby", "h", "z", "1"]),
            "-ERR hash value is not an integer\r\n"
        );
        assert_eq!(
            run(s, hincrby, &["hincrby", "h", "m", "1"]),
            ":9223372036854775807\r\n"
        );
        assert_eq!(
            run(s, hincrby, &["hincrby", "h", "m", "1"]),
            "-ERR increment or decrement would overflow\r\n"
        );
        assert_eq!(
            run(s, hincrbyfloat, &["hincrbyfloat", "f", "x", "10.5"]),
            "$4\r\n10.5\r\n"
        );
        assert_eq!(
            run(s, hincrbyfloat, &["hincrbyfloat", "f", "x", "0.1"]),
            "$4\r\n10.6\r\n"
        );
        assert_eq!(
            run(s, hincrbyfloat, &["hincrbyfloat", "h", "n", "1.5"]),
            "$4\r\n-0.5\r\n"
        );
        assert_eq!(
            run(s, hincrbyfloat, &["hincrbyfloat", "h", "s", "1"]),
            "-ERR hash value is not a float\r\n"
        );
        run(s, hset, &["hset", "h", "big", "1e4932"]);
        assert_eq!(
            run(s, hincrbyfloat, &["hincrbyfloat", "h", "big", "1e4932"]),
            "-ERR increment would produce NaN or Infinity\r\n"
        );
        // A long printed sum no longer fits the packed form.
        run(s, hset, &["hset", "g", "x", "1e308"]);
        assert_eq!(encoding_of(s, "g"), Some("listpack"));
        run(s, hincrbyfloat, &["hincrbyfloat", "g", "x", "1e308"]);
        assert_eq!(encoding_of(s, "g"), Some("hashtable"));
        // As does a long field.
        let long = "f".repeat(65);
        run(s, hincrby, &["hincrby", "i", &long, "1"]);
        assert_eq!(encoding_of(s, "i"), Some("hashtable"));
    }

    #[test]
    fn randfield_shapes() {
        let mut sh = Shard::for_tests(1);
        let s = &mut sh;
        assert_eq!(run(s, hrandfield, &["hrandfield", "nokey"]), "$-1\r\n");
        assert_eq!(run3(s, hrandfield, &["hrandfield", "nokey"]), "_\r\n");
        assert_eq!(run3(s, hrandfield, &["hrandfield", "nokey", "3"]), "*0\r\n");
        assert_eq!(
            run(
                s,
                hrandfield,
                &["hrandfield", "nokey", "-9223372036854775808"]
            ),
            format!("-{RANDFIELD_RANGE}\r\n")
        );
        assert_eq!(
            run(
                s,
                hrandfield,
                &["hrandfield", "nokey", "9223372036854775807", "withvalues"]
            ),
            "-ERR value is out of range\r\n"
        );
        run(s, hset, &["hset", "h", "a", "1"]);
        assert_eq!(run(s, hrandfield, &["hrandfield", "h"]), "$1\r\na\r\n");
        assert_eq!(run(s, hrandfield, &["hrandfield", "h", "0"]), "*0\r\n");
        assert_eq!(
            run(s, hrandfield, &["hrandfield", "h", "-2", "WithValues"]),
            "*4\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\na\r\n$1\r\n1\r\n"
        );
        assert_eq!(
            run3(s, hrandfield, &["hrandfield", "h", "-2", "withvalues"]),
            "*2\r\n*2\r\n$1\r\na\r\n$1\r\n1\r\n*2\r\n$1\r\na\r\n$1\r\n1\r\n"
        );
        assert_eq!(
            run3(s, hrandfield, &["hrandfield", "h", "5"]),
            "*1\r\n$1\r\na\r\n"
        );
    }

    #[test]
    fn cursors_read_like_strtoul() {
        assert_eq!(parse_cursor(b""), Some(0));
        assert_eq!(parse_cursor(b"17"), Some(17));
        assert_eq!(parse_cursor(b"+17"), Some(17));
        assert_eq!(parse_cursor(b"-1"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551616"), None);
        assert_eq!(parse_cursor(b" 1"), None);
        assert_eq!(parse_cursor(b"1 "), None);
        assert_eq!(parse_cursor(b"+"), None);
        assert_eq!(parse_cursor(b"1x"), None);
        assert_eq!(parse_cursor(b"12\x00zz"), Some(12));
    }

    #[test]
    fn scan_walks_big_hashes_with_a_cursor() {
        let mut sh = Shard::for_tests(1);
        let s = &mut sh;
        let mut args: Vec<String> = vec!["hset".into(), "h".into()];
        for i in 0..1000 {
            args.push(format!("f{i}"));
            args.push(format!("v{i}"));
        }
        let refs: Vec<&str> = args.iter().map(|a| a.as_str()).collect();
        run(s, hset, &refs);
        assert_eq!(encoding_of(s, "h"), Some("hashtable"));
        let mut seen = std::collections::HashSet::new();
        let mut cursor = "0".to_string();
        loop {
            let args: Vec<Bytes> = ["hscan", "h", &cursor, "COUNT", "7"]
                .iter()
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect();
            let mut out = Reply::new(false);
            let mut ctx = s.ctx(0, &mut out);
            hscan(&mut ctx, &args);
            let text = String::from_utf8_lossy(&out.buf).into_owned();
            let lines: Vec<&str> = text.split("\r\n").collect();
            cursor = lines[2].to_string();
            // Lines: *2, cursor length, cursor, *N, then length/field/length/value.
            for (i, l) in lines.iter().enumerate().skip(5).step_by(4) {
                if i + 2 < lines.len() {
                    assert_eq!(&l[1..], &lines[i + 2][1..]);
                    seen.insert(l.to_string());
                }
            }
            if cursor == "0" {
                break;
            }
        }
        assert_eq!(seen.len(), 1000);
        assert_eq!(
            run(s, hscan, &["hscan", "h", "0", "novalues"]),
            "-ERR syntax error\r\n"
        );
        assert_eq!(
            run(s, hscan, &["hscan", "h", "0", "count", "0"]),
            "-ERR syntax error\r\n"
        );
        assert_eq!(
            run(s, hscan, &["hscan", "h", "0", "match"]),
            "-ERR syntax error\r\n"
        );
        run(s, hset, &["hset", "p", "ab", "1", "b", "2", "ac", "3"]);
        assert_eq!(
            run(s, hscan, &["hscan", "p", "99", "match", "a*"]),
            "*2\r\n$1\r\n0\r\n*4\r\n$2\r\nab\r\n$1\r\n1\r\n$2\r\nac\r\n$1\r\n3\r\n"
        );
    }
}
