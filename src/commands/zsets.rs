//! The sorted set family: every non-blocking sorted set command of Redis 7.2, with its
//! replies, errors and keyspace events.
//!
//! Commands with keys on several shards (ZRANGESTORE, ZUNIONSTORE, ZINTERSTORE,
//! ZDIFFSTORE, ZUNION, ZINTER, ZDIFF, ZINTERCARD, ZMPOP) have a cross-shard form: it runs
//! while a transaction holds every key of the command, reads the sources on their shards,
//! computes here and writes the destination on its shard, so it is as atomic as the
//! single-shard form.
//!
//! [`pop_min_max`] is the pop the blocking BZPOPMIN, BZPOPMAX and BZMPOP are built on;
//! [`reply_bzpop`] and [`reply_mpop`] write their replies.

use std::collections::HashMap;

use bytes::Bytes;

use super::util::{eq_ci, glob_match, parse_i64, NOT_FLOAT, NOT_INT, SYNTAX_ERR};
use crate::cross_handler;
use crate::protocol::reply::{format_double, Reply};
use crate::server::session::Session;
use crate::shard::tx::Tx;
use crate::shard::{unix_ms, ExecCtx, Shard};
use crate::types::set::Set;
use crate::types::value::{Value, WRONGTYPE};
use crate::types::zset::{cmp_entry, ZSet};

const NOT_FLOAT_RANGE: &str = "ERR min or max is not a float";
const NOT_LEX_RANGE: &str = "ERR min or max not valid string range item";
const NAN_RESULT: &str = "ERR resulting score is not a number (NaN)";

/// Entries in (score, member) order, as store commands build them.
type Sorted = Vec<(f64, Box<[u8]>)>;

/// Popped entries, in pop order.
pub type Popped = Vec<(Box<[u8]>, f64)>;

/// The key held another type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrongType;

// ---------------------------------------------------------------------------------------
// Number parsing, as Redis's C library calls accept numbers
// ---------------------------------------------------------------------------------------

fn is_c_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// A number as `strtod` reads a whole string (leading spaces allowed, nothing after):
/// None for anything else, NaN, or a value out of range.
pub fn parse_c_double(s: &[u8]) -> Option<f64> {
    let start = s.iter().position(|&c| !is_c_space(c))?;
    match strtod_literal(&s[start..])? {
        (v, false) if !v.is_nan() => Some(v),
        _ => None,
    }
}

/// A literal `strtod` consumes whole: decimal or hexadecimal (`0x1.8p3`) with an optional
/// sign, `inf`, `infinity`, `nan`. Returns the value and whether it overflowed to an
/// infinity or underflowed to zero (strtod's ERANGE cases that Redis refuses).
fn strtod_literal(s: &[u8]) -> Option<(f64, bool)> {
    let (neg, body) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let sign = |v: f64| if neg { -v } else { v };
    let lower = body.to_ascii_lowercase();
    if lower == b"inf" || lower == b"infinity" {
        return Some((sign(f64::INFINITY), false));
    }
    if lower == b"nan"
        || (lower.starts_with(b"nan(")
            && lower.ends_with(b")")
            && lower[4..lower.len() - 1]
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || *c == b'_'))
    {
        return Some((f64::NAN, false));
    }
    if lower.len() > 2 && lower.starts_with(b"0x") {
        return hex_literal(&lower[2..]).map(|(v, r)| (sign(v), r));
    }
    // Decimal: digits [. digits] [e [sign] digits], at least one mantissa digit.
    let mut i = 0;
    let digits = |from: usize| {
        body[from..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count()
    };
    let int_digits = digits(i);
    i += int_digits;
    let mut frac_digits = 0;
    if body.get(i) == Some(&b'.') {
        i += 1;
        frac_digits = digits(i);
        i += frac_digits;
    }
    if int_digits + frac_digits == 0 {
        return None;
    }
    if matches!(body.get(i), Some(b'e') | Some(b'E')) {
        let mut j = i + 1;
        if matches!(body.get(j), Some(b'+') | Some(b'-')) {
            j += 1;
        }
        let exp_digits = digits(j);
        if exp_digits == 0 {
            return None;
        }
        i = j + exp_digits;
    }
    if i != body.len() {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?;
    let v: f64 = text.parse().ok()?;
    let mantissa_nonzero = body
        .iter()
        .take_while(|c| !matches!(c, b'e' | b'E'))
        .any(|c| (b'1'..=b'9').contains(c));
    let range_error = v.is_infinite() || (v == 0.0 && mantissa_nonzero);
    Some((sign(v), range_error))
}

/// The part of a hexadecimal float after `0x`: hex digits [. hex digits] [p [sign] digits].
fn hex_literal(s: &[u8]) -> Option<(f64, bool)> {
    let mut mant: u128 = 0;
    let mut shift: i64 = 0;
    let mut any = false;
    let mut sticky = false;
    let mut i = 0;
    let mut seen_dot = false;
    while i < s.len() {
        let c = s[i];
        if c == b'.' && !seen_dot {
            seen_dot = true;
        } else if let Some(d) = (c as char).to_digit(16) {
            any = true;
            if mant >> 120 == 0 {
                mant = mant * 16 + d as u128;
                if seen_dot {
                    shift -= 4;
                }
            } else {
                sticky |= d != 0;
                if !seen_dot {
                    shift += 4;
                }
            }
        } else {
            break;
        }
        i += 1;
    }
    if !any {
        return None;
    }
    if i < s.len() {
        if s[i] != b'p' {
            return None;
        }
        let mut j = i + 1;
        let neg = match s.get(j) {
            Some(b'-') => {
                j += 1;
                true
            }
            Some(b'+') => {
                j += 1;
                false
            }
            _ => false,
        };
        if j >= s.len() || !s[j..].iter().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let e: i64 = std::str::from_utf8(&s[j..])
            .ok()?
            .parse()
            .unwrap_or(i64::MAX / 4);
        shift = shift.saturating_add(if neg { -e } else { e });
    }
    if sticky {
        mant |= 1;
    }
    let v = (mant as f64) * 2f64.powi(shift.clamp(-2000, 2000) as i32);
    let range_error = v.is_infinite() || (v == 0.0 && mant != 0);
    Some((v, range_error))
}

/// A score, increment or weight, as Redis's `string2d` reads one: the whole argument,
/// no leading space, no overflow or underflow, never NaN.
pub fn parse_score(arg: &[u8]) -> Option<f64> {
    if arg.is_empty() || is_c_space(arg[0]) {
        return None;
    }
    match strtod_literal(arg)? {
        (v, false) if !v.is_nan() => Some(v),
        _ => None,
    }
}

/// One end of a score range (ZRANGEBYSCORE, ZCOUNT...): `(` makes it exclusive; the rest
/// is read the way `strtod` is called there, so leading spaces pass, an empty string is 0,
/// overflow gives an infinity, and bytes after a NUL are ignored.
fn parse_score_bound(arg: &[u8]) -> Option<(f64, bool)> {
    let (ex, rest) = match arg.first() {
        Some(b'(') => (true, &arg[1..]),
        _ => (false, arg),
    };
    let rest = rest
        .iter()
        .position(|&c| c == 0)
        .map_or(rest, |n| &rest[..n]);
    if rest.is_empty() {
        return Some((0.0, ex));
    }
    let start = rest.iter().position(|&c| !is_c_space(c))?;
    match strtod_literal(&rest[start..])? {
        (v, _) if !v.is_nan() => Some((v, ex)),
        _ => None,
    }
}

#[derive(Clone, Copy, Debug)]
struct ScoreRange {
    min: f64,
    max: f64,
    minex: bool,
    maxex: bool,
}

impl ScoreRange {
    fn parse(min: &[u8], max: &[u8]) -> Option<ScoreRange> {
        let (min, minex) = parse_score_bound(min)?;
        let (max, maxex) = parse_score_bound(max)?;
        Some(ScoreRange {
            min,
            max,
            minex,
            maxex,
        })
    }

    fn gte_min(&self, v: f64) -> bool {
        if self.minex {
            v > self.min
        } else {
            v >= self.min
        }
    }

    fn lte_max(&self, v: f64) -> bool {
        if self.maxex {
            v < self.max
        } else {
            v <= self.max
        }
    }

    fn is_empty(&self) -> bool {
        self.min > self.max || (self.min == self.max && (self.minex || self.maxex))
    }
}

/// One end of a lex range: `-`, `+`, or a string with `[` (inclusive) or `(`.
#[derive(Clone, Debug, PartialEq)]
enum Lex {
    Min,
    Max,
    Val(Vec<u8>),
}

#[derive(Clone, Debug)]
struct LexRange {
    min: Lex,
    max: Lex,
    minex: bool,
    maxex: bool,
}

fn parse_lex_item(arg: &[u8]) -> Option<(Lex, bool)> {
    // `+` and `-` must stand alone (Redis reads them as C strings: a NUL ends them).
    let alone = arg.get(1).is_none_or(|&c| c == 0);
    match arg.first()? {
        b'+' if alone => Some((Lex::Max, true)),
        b'-' if alone => Some((Lex::Min, true)),
        b'(' => Some((Lex::Val(arg[1..].to_vec()), true)),
        b'[' => Some((Lex::Val(arg[1..].to_vec()), false)),
        _ => None,
    }
}

/// Compares two lex range items, `-` below and `+` above every string.
fn cmp_lex(a: &Lex, b: &Lex) -> i32 {
    match (a, b) {
        (Lex::Min, Lex::Min) | (Lex::Max, Lex::Max) => 0,
        (Lex::Min, _) | (_, Lex::Max) => -1,
        (Lex::Max, _) | (_, Lex::Min) => 1,
        (Lex::Val(x), Lex::Val(y)) => x.cmp(y) as i32,
    }
}

fn cmp_value_lex(v: &[u8], b: &Lex) -> i32 {
    match b {
        Lex::Min => 1,
        Lex::Max => -1,
        Lex::Val(y) => v.cmp(y) as i32,
    }
}

impl LexRange {
    fn parse(min: &[u8], max: &[u8]) -> Option<LexRange> {
        let (min, minex) = parse_lex_item(min)?;
        let (max, maxex) = parse_lex_item(max)?;
        Some(LexRange {
            min,
            max,
            minex,
            maxex,
        })
    }

    fn gte_min(&self, v: &[u8]) -> bool {
        let c = cmp_value_lex(v, &self.min);
        if self.minex {
            c > 0
        } else {
            c >= 0
        }
    }

    fn lte_max(&self, v: &[u8]) -> bool {
        let c = cmp_value_lex(v, &self.max);
        if self.maxex {
            c < 0
        } else {
            c <= 0
        }
    }

    fn is_empty(&self) -> bool {
        let c = cmp_lex(&self.min, &self.max);
        c > 0 || (c == 0 && (self.minex || self.maxex))
    }
}

/// A score or lex range as predicates on entries.
#[derive(Clone, Debug)]
enum Span {
    Score(ScoreRange),
    Lex(LexRange),
}

impl Span {
    fn gte(&self, s: f64, m: &[u8]) -> bool {
        match self {
            Span::Score(r) => r.gte_min(s),
            Span::Lex(r) => r.gte_min(m),
        }
    }

    fn lte(&self, s: f64, m: &[u8]) -> bool {
        match self {
            Span::Score(r) => r.lte_max(s),
            Span::Lex(r) => r.lte_max(m),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Span::Score(r) => r.is_empty(),
            Span::Lex(r) => r.is_empty(),
        }
    }

    /// Whether some part of the set can be in range: the range is not empty, the tail
    /// reaches its minimum and the head its maximum (checked before any walk, as Redis
    /// does).
    fn touches(&self, z: &ZSet) -> bool {
        if self.is_empty() || z.is_empty() {
            return false;
        }
        let (hm, hs) = z.get(0).expect("non-empty");
        let (tm, ts) = z.get(z.len() - 1).expect("non-empty");
        self.gte(ts, tm) && self.lte(hs, hm)
    }

    /// Rank of the first entry at or above the minimum.
    fn first_gte(&self, z: &ZSet) -> Option<usize> {
        match self {
            Span::Score(r) => z.first_where_score(|s| r.gte_min(s)),
            Span::Lex(r) => z.first_where(|_, m| r.gte_min(m)),
        }
    }

    /// Rank of the last entry at or below the maximum.
    fn last_lte(&self, z: &ZSet) -> Option<usize> {
        match self {
            Span::Score(r) => z.last_where_score(|s| r.lte_max(s)),
            Span::Lex(r) => z.last_where(|_, m| r.lte_max(m)),
        }
    }

    /// Rank of the first entry in range.
    fn first_in(&self, z: &ZSet) -> Option<usize> {
        if !self.touches(z) {
            return None;
        }
        let i = self.first_gte(z)?;
        let (m, s) = z.get(i)?;
        self.lte(s, m).then_some(i)
    }

    /// Rank of the last entry in range.
    fn last_in(&self, z: &ZSet) -> Option<usize> {
        if !self.touches(z) {
            return None;
        }
        let i = self.last_lte(z)?;
        let (m, s) = z.get(i)?;
        self.gte(s, m).then_some(i)
    }

    /// (first rank, count) of the run of entries in range from the first one. A
    /// listpack is walked, as Redis walks it; a skiplist answers from two ranks in
    /// O(log n), as Redis's does.
    fn run(&self, z: &ZSet) -> Option<(usize, usize)> {
        let first = self.first_in(z)?;
        let mut n = 0;
        match z {
            ZSet::Small(_) => z.visit(first, false, |m, s| {
                if self.lte(s, m) {
                    n += 1;
                    true
                } else {
                    false
                }
            }),
            ZSet::Big(_) => {
                n = self
                    .last_lte(z)
                    .map_or(0, |last| (last + 1).saturating_sub(first))
            }
        }
        Some((first, n))
    }
}

// ---------------------------------------------------------------------------------------
// Keyspace access
// ---------------------------------------------------------------------------------------

/// Looks a key up for reading (a keyspace hit or miss, lazy expiry) and hands back the
/// sorted set found together with the reply buffer.
fn read_zset<'a>(
    ctx: &'a mut ExecCtx,
    key: &[u8],
) -> (Result<Option<&'a ZSet>, WrongType>, &'a mut Reply) {
    let live = ctx.get_read(key).is_some();
    let out = &mut *ctx.out;
    if !live {
        return (Ok(None), out);
    }
    match ctx.shard.dbs[ctx.db].table.get(key).map(|e| &e.value) {
        Some(Value::ZSet(z)) => (Ok(Some(z)), out),
        Some(_) => (Err(WrongType), out),
        None => (Ok(None), out),
    }
}

/// Looks a key up for writing.
fn write_zset<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a mut ZSet>, WrongType> {
    match ctx.get(key) {
        None => Ok(None),
        Some(e) => match &mut e.value {
            Value::ZSet(z) => Ok(Some(z)),
            _ => Err(WrongType),
        },
    }
}

/// Signals a change to a sorted set changed in place, deleting the key when it emptied;
/// `event` is the zset event to publish.
fn after_change(ctx: &mut ExecCtx, key: &[u8], event: &'static str, emptied: bool) {
    ctx.notify(b'z', event, key);
    if emptied {
        ctx.delete(key);
        ctx.notify(b'g', "del", key);
    } else {
        ctx.modified(key);
    }
}

// ---------------------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------------------

/// Members, with their scores when asked: a flat array in RESP2, pairs in RESP3.
fn reply_entries<M: AsRef<[u8]>>(out: &mut Reply, items: &[(M, f64)], withscores: bool) {
    if !withscores {
        out.array(items.len());
        for (m, _) in items {
            out.bulk(m.as_ref());
        }
    } else if out.resp3 {
        out.array(items.len());
        for (m, s) in items {
            out.array(2);
            out.bulk(m.as_ref());
            out.double(*s);
        }
    } else {
        out.array(items.len() * 2);
        for (m, s) in items {
            out.bulk(m.as_ref());
            out.double(*s);
        }
    }
}

/// Popped entries: flat `[member, score, ...]`, or `[[member, score], ...]` when
/// `nested` (ZPOPMIN with a count in RESP3, and ZMPOP).
fn reply_popped(out: &mut Reply, items: &[(Box<[u8]>, f64)], nested: bool) {
    if nested {
        out.array(items.len());
        for (m, s) in items {
            out.array(2);
            out.bulk(m);
            out.double(*s);
        }
    } else {
        out.array(items.len() * 2);
        for (m, s) in items {
            out.bulk(m);
            out.double(*s);
        }
    }
}

/// BZPOPMIN/BZPOPMAX's reply when an element is served: `[key, member, score]`.
#[allow(dead_code)] // for the blocking commands, which live elsewhere
pub fn reply_bzpop(out: &mut Reply, key: &[u8], member: &[u8], score: f64) {
    out.array(3);
    out.bulk(key);
    out.bulk(member);
    out.double(score);
}

/// ZMPOP/BZMPOP's reply when entries were popped: `[key, [[member, score], ...]]`.
pub fn reply_mpop(out: &mut Reply, key: &[u8], items: &[(Box<[u8]>, f64)]) {
    out.array(2);
    out.bulk(key);
    reply_popped(out, items, true);
}

// ---------------------------------------------------------------------------------------
// ZADD, ZINCRBY
// ---------------------------------------------------------------------------------------

#[derive(Default, Clone, Copy)]
struct AddFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

enum Outcome {
    Nop,
    Added(f64),
    Updated(f64),
    Same(f64),
}

/// One score-member pair of ZADD, with Redis's `zsetAdd` rules. Err: the increment made
/// the score NaN.
fn add_one(z: &mut ZSet, member: &[u8], score: f64, f: AddFlags) -> Result<Outcome, ()> {
    match z.score(member) {
        Some(cur) => {
            if f.nx {
                return Ok(Outcome::Nop);
            }
            let mut score = score;
            if f.incr {
                score += cur;
                if score.is_nan() {
                    return Err(());
                }
            }
            if (f.lt && score >= cur) || (f.gt && score <= cur) {
                return Ok(Outcome::Nop);
            }
            if score != cur {
                z.set_score(member, cur, score);
                Ok(Outcome::Updated(score))
            } else {
                Ok(Outcome::Same(score))
            }
        }
        None if !f.xx => {
            z.insert(member, score);
            Ok(Outcome::Added(score))
        }
        None => Ok(Outcome::Nop),
    }
}

fn zadd_generic(ctx: &mut ExecCtx, args: &[Bytes], mut flags: AddFlags) {
    let mut idx = 2;
    while idx < args.len() {
        let a = &args[idx];
        if eq_ci(a, "nx") {
            flags.nx = true;
        } else if eq_ci(a, "xx") {
            flags.xx = true;
        } else if eq_ci(a, "ch") {
            flags.ch = true;
        } else if eq_ci(a, "incr") {
            flags.incr = true;
        } else if eq_ci(a, "gt") {
            flags.gt = true;
        } else if eq_ci(a, "lt") {
            flags.lt = true;
        } else {
            break;
        }
        idx += 1;
    }
    let elements = args.len() - idx;
    if !elements.is_multiple_of(2) || elements == 0 {
        return ctx.out.error(SYNTAX_ERR);
    }
    let pairs = elements / 2;
    if flags.nx && flags.xx {
        return ctx
            .out
            .error("ERR XX and NX options at the same time are not compatible");
    }
    if flags.gt as u8 + flags.lt as u8 + flags.nx as u8 > 1 {
        return ctx
            .out
            .error("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if flags.incr && pairs > 1 {
        return ctx
            .out
            .error("ERR INCR option supports a single increment-element pair");
    }
    let mut scores = Vec::with_capacity(pairs);
    for j in 0..pairs {
        match parse_score(&args[idx + 2 * j]) {
            Some(s) => scores.push(s),
            None => return ctx.out.error(NOT_FLOAT),
        }
    }
    let key = &args[1];
    let (mut added, mut updated, mut processed) = (0i64, 0i64, 0i64);
    let mut last_score = 0.0;
    let mut nan = false;
    let mut apply = |z: &mut ZSet| {
        for (j, &score) in scores.iter().enumerate() {
            match add_one(z, &args[idx + 2 * j + 1], score, flags) {
                Err(()) => {
                    nan = true;
                    return;
                }
                Ok(Outcome::Nop) => {}
                Ok(Outcome::Added(s)) => {
                    added += 1;
                    processed += 1;
                    last_score = s;
                }
                Ok(Outcome::Updated(s)) => {
                    updated += 1;
                    processed += 1;
                    last_score = s;
                }
                Ok(Outcome::Same(s)) => {
                    processed += 1;
                    last_score = s;
                }
            }
        }
    };
    match write_zset(ctx, key) {
        Err(WrongType) => return ctx.out.error(WRONGTYPE),
        Ok(Some(z)) => {
            z.reserve_for(pairs);
            apply(z);
        }
        Ok(None) => {
            if !flags.xx {
                // Redis sizes a new set by the pair count and the first member.
                let mut z = ZSet::with_hint(pairs, args[idx + 1].len());
                apply(&mut z);
                ctx.set(key, Value::ZSet(Box::new(z)), 0);
            }
        }
    }
    if added > 0 || updated > 0 {
        ctx.notify(b'z', if flags.incr { "zincr" } else { "zadd" }, key);
        ctx.modified(key);
    }
    if added > 0 {
        ctx.key_ready(key);
        // New members of a sorted set that is a queue are its pushes.
        ctx.shard
            .queues
            .pushed(ctx.db, key, added as u64, false, ctx.now_ms);
    }
    if nan {
        return ctx.out.error(NAN_RESULT);
    }
    if flags.incr {
        if processed > 0 {
            ctx.out.double(last_score);
        } else {
            ctx.out.null();
        }
    } else {
        ctx.out.int(if flags.ch { added + updated } else { added });
    }
}

/// ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]
pub fn zadd(ctx: &mut ExecCtx, args: &[Bytes]) {
    zadd_generic(ctx, args, AddFlags::default());
}

/// ZINCRBY key increment member (ZADD's parser with INCR, as in Redis: `ZINCRBY k nx m`
/// is a syntax error).
pub fn zincrby(ctx: &mut ExecCtx, args: &[Bytes]) {
    zadd_generic(
        ctx,
        args,
        AddFlags {
            incr: true,
            ..AddFlags::default()
        },
    );
}

// ---------------------------------------------------------------------------------------
// ZREM, ZCARD, ZSCORE, ZMSCORE, ZRANK, ZREVRANK
// ---------------------------------------------------------------------------------------

pub fn zrem(ctx: &mut ExecCtx, args: &[Bytes]) {
    let key = &args[1];
    let (deleted, emptied) = match write_zset(ctx, key) {
        Err(WrongType) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.int(0),
        Ok(Some(z)) => {
            let mut n = 0;
            for m in &args[2..] {
                if z.remove(m).is_some() {
                    n += 1;
                }
                if z.is_empty() {
                    break;
                }
            }
            (n, z.is_empty())
        }
    };
    if deleted > 0 {
        after_change(ctx, key, "zrem", emptied);
    }
    ctx.out.int(deleted);
}

pub fn zcard(ctx: &mut ExecCtx, args: &[Bytes]) {
    match read_zset(ctx, &args[1]) {
        (Err(WrongType), out) => out.error(WRONGTYPE),
        (Ok(None), out) => out.int(0),
        (Ok(Some(z)), out) => out.int(z.len() as i64),
    }
}

pub fn zscore(ctx: &mut ExecCtx, args: &[Bytes]) {
    match read_zset(ctx, &args[1]) {
        (Err(WrongType), out) => out.error(WRONGTYPE),
        (Ok(None), out) => out.null(),
        (Ok(Some(z)), out) => match z.score(&args[2]) {
            Some(s) => out.double(s),
            None => out.null(),
        },
    }
}

pub fn zmscore(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (z, out) = match read_zset(ctx, &args[1]) {
        (Err(WrongType), out) => return out.error(WRONGTYPE),
        (Ok(z), out) => (z, out),
    };
    out.array(args.len() - 2);
    for m in &args[2..] {
        match z.and_then(|z| z.score(m)) {
            Some(s) => out.double(s),
            None => out.null(),
        }
    }
}

fn zrank_generic(ctx: &mut ExecCtx, args: &[Bytes], rev: bool) {
    if args.len() > 4 {
        let name = if rev { "zrevrank" } else { "zrank" };
        return ctx.out.error(&super::arity_error(name));
    }
    let withscore = match args.get(3) {
        None => false,
        Some(a) if eq_ci(a, "withscore") => true,
        Some(_) => return ctx.out.error(SYNTAX_ERR),
    };
    let (z, out) = match read_zset(ctx, &args[1]) {
        (Err(WrongType), out) => return out.error(WRONGTYPE),
        (Ok(z), out) => (z, out),
    };
    match z.and_then(|z| z.rank(&args[2]).map(|r| (r, z.len()))) {
        Some(((rank, score), len)) => {
            let rank = if rev { len - 1 - rank } else { rank };
            if withscore {
                out.array(2);
                out.int(rank as i64);
                out.double(score);
            } else {
                out.int(rank as i64);
            }
        }
        None if withscore => out.null_array(),
        None => out.null(),
    }
}

/// ZRANK key member [WITHSCORE]
pub fn zrank(ctx: &mut ExecCtx, args: &[Bytes]) {
    zrank_generic(ctx, args, false);
}

pub fn zrevrank(ctx: &mut ExecCtx, args: &[Bytes]) {
    zrank_generic(ctx, args, true);
}

// ---------------------------------------------------------------------------------------
// ZCOUNT, ZLEXCOUNT
// ---------------------------------------------------------------------------------------

fn count_span(ctx: &mut ExecCtx, key: &[u8], span: Span) {
    match read_zset(ctx, key) {
        (Err(WrongType), out) => out.error(WRONGTYPE),
        (Ok(None), out) => out.int(0),
        (Ok(Some(z)), out) => out.int(span.run(z).map_or(0, |(_, n)| n as i64)),
    }
}

pub fn zcount(ctx: &mut ExecCtx, args: &[Bytes]) {
    match ScoreRange::parse(&args[2], &args[3]) {
        Some(r) => count_span(ctx, &args[1], Span::Score(r)),
        None => ctx.out.error(NOT_FLOAT_RANGE),
    }
}

pub fn zlexcount(ctx: &mut ExecCtx, args: &[Bytes]) {
    match LexRange::parse(&args[2], &args[3]) {
        Some(r) => count_span(ctx, &args[1], Span::Lex(r)),
        None => ctx.out.error(NOT_LEX_RANGE),
    }
}

// ---------------------------------------------------------------------------------------
// ZRANGE and friends
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum RangeKind {
    Rank(i64, i64),
    Span(Span),
}

#[derive(Clone, Debug)]
struct RangeSpec {
    kind: RangeKind,
    rev: bool,
    withscores: bool,
    offset: i64,
    /// Negative: no limit.
    limit: i64,
}

#[derive(Clone, Copy, PartialEq)]
enum By {
    Auto,
    Rank,
    Score,
    Lex,
}

/// Parses `<min> <max> [BYSCORE|BYLEX] [REV] [WITHSCORES] [LIMIT offset count]` from
/// position `start` (the source key), as Redis's `zrangeGenericCommand` does, including
/// the order of its checks. `by` and `rev` are fixed by the older commands.
fn parse_range(
    args: &[Bytes],
    start: usize,
    store: bool,
    mut by: By,
    mut rev: Option<bool>,
) -> Result<RangeSpec, &'static str> {
    let (mut withscores, mut offset, mut limit) = (false, 0i64, -1i64);
    let mut j = start + 3;
    while j < args.len() {
        let left = args.len() - j - 1;
        let a = &args[j];
        if !store && eq_ci(a, "withscores") {
            withscores = true;
        } else if eq_ci(a, "limit") && left >= 2 {
            offset = parse_i64(&args[j + 1])?;
            limit = parse_i64(&args[j + 2])?;
            j += 2;
        } else if rev.is_none() && eq_ci(a, "rev") {
            rev = Some(true);
        } else if by == By::Auto && eq_ci(a, "bylex") {
            by = By::Lex;
        } else if by == By::Auto && eq_ci(a, "byscore") {
            by = By::Score;
        } else {
            return Err(SYNTAX_ERR);
        }
        j += 1;
    }
    let rev = rev.unwrap_or(false);
    if by == By::Auto {
        by = By::Rank;
    }
    // Redis tells LIMIT -1 from no LIMIT only by the value.
    if limit != -1 && by == By::Rank {
        return Err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        );
    }
    if withscores && by == By::Lex {
        return Err("ERR syntax error, WITHSCORES not supported in combination with BYLEX");
    }
    let (mut lo, mut hi) = (&args[start + 1], &args[start + 2]);
    if rev && by != By::Rank {
        std::mem::swap(&mut lo, &mut hi);
    }
    let kind = match by {
        By::Score => RangeKind::Span(Span::Score(
            ScoreRange::parse(lo, hi).ok_or(NOT_FLOAT_RANGE)?,
        )),
        By::Lex => RangeKind::Span(Span::Lex(LexRange::parse(lo, hi).ok_or(NOT_LEX_RANGE)?)),
        _ => RangeKind::Rank(parse_i64(lo)?, parse_i64(hi)?),
    };
    Ok(RangeSpec {
        kind,
        rev,
        withscores,
        offset,
        limit,
    })
}

/// Redis's index arithmetic for rank ranges: Some(first, last) inclusive, clamped.
fn rank_bounds(start: i64, end: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let mut start = if start < 0 { len + start } else { start };
    let mut end = if end < 0 { len + end } else { end };
    if start < 0 {
        start = 0;
    }
    if start > end || start >= len {
        return None;
    }
    if end >= len {
        end = len - 1;
    }
    Some((start as usize, end as usize))
}

/// The entries a range selects, in reply order.
fn range_entries<'a>(z: &'a ZSet, spec: &RangeSpec) -> Vec<(&'a [u8], f64)> {
    let mut v = Vec::new();
    match &spec.kind {
        RangeKind::Rank(a, b) => {
            let Some((start, end)) = rank_bounds(*a, *b, z.len()) else {
                return v;
            };
            let n = end - start + 1;
            v.reserve(n);
            let from = if spec.rev { z.len() - 1 - start } else { start };
            z.visit(from, spec.rev, |m, s| {
                v.push((m, s));
                v.len() < n
            });
        }
        RangeKind::Span(span) => {
            // A negative offset walks off the end in Redis: nothing is returned.
            if spec.offset < 0 || spec.limit == 0 {
                return v;
            }
            let offset = spec.offset as usize;
            let from = if spec.rev {
                match span.last_in(z) {
                    Some(last) if last >= offset => last - offset,
                    _ => return v,
                }
            } else {
                match span.first_in(z) {
                    Some(first) => first.saturating_add(offset),
                    None => return v,
                }
            };
            let limit = if spec.limit < 0 {
                usize::MAX
            } else {
                spec.limit as usize
            };
            z.visit(from, spec.rev, |m, s| {
                let inside = if spec.rev {
                    span.gte(s, m)
                } else {
                    span.lte(s, m)
                };
                if inside {
                    v.push((m, s));
                }
                inside && v.len() < limit
            });
        }
    }
    v
}

fn zrange_reply(ctx: &mut ExecCtx, args: &[Bytes], by: By, rev: Option<bool>) {
    let spec = match parse_range(args, 1, false, by, rev) {
        Ok(s) => s,
        Err(e) => return ctx.out.error(e),
    };
    match read_zset(ctx, &args[1]) {
        (Err(WrongType), out) => out.error(WRONGTYPE),
        (Ok(None), out) => out.array(0),
        (Ok(Some(z)), out) => {
            let items = range_entries(z, &spec);
            reply_entries(out, &items, spec.withscores);
        }
    }
}

/// ZRANGE key start stop [BYSCORE|BYLEX] [REV] [LIMIT offset count] [WITHSCORES]
pub fn zrange(ctx: &mut ExecCtx, args: &[Bytes]) {
    zrange_reply(ctx, args, By::Auto, None);
}

pub fn zrevrange(ctx: &mut ExecCtx, args: &[Bytes]) {
    zrange_reply(ctx, args, By::Rank, Some(true));
}

pub fn zrangebyscore(ctx: &mut ExecCtx, args: &[Bytes]) {
    zrange_reply(ctx, args, By::Score, Some(false));
}

pub fn zrevrangebyscore(ctx: &mut ExecCtx, args: &[Bytes]) {
    zrange_reply(ctx, args, By::Score, Some(true));
}

pub fn zrangebylex(ctx: &mut ExecCtx, args: &[Bytes]) {
    zrange_reply(ctx, args, By::Lex, Some(false));
}

pub fn zrevrangebylex(ctx: &mut ExecCtx, args: &[Bytes]) {
    zrange_reply(ctx, args, By::Lex, Some(true));
}

/// The source side of ZRANGESTORE: the selected entries, sorted, owned.
fn rangestore_read(ctx: &mut ExecCtx, src: &[u8], spec: &RangeSpec) -> Result<Sorted, WrongType> {
    match read_zset(ctx, src).0? {
        None => Ok(Vec::new()),
        Some(z) => {
            let mut v: Sorted = range_entries(z, spec)
                .into_iter()
                .map(|(m, s)| (s, m.into()))
                .collect();
            if spec.rev {
                v.reverse();
            }
            Ok(v)
        }
    }
}

/// Writes the result of a store command at `dst`: an empty result deletes it. Returns
/// the stored length.
fn store_result(ctx: &mut ExecCtx, dst: &[u8], entries: Sorted, event: &'static str) -> i64 {
    if entries.is_empty() {
        if ctx.delete(dst) {
            ctx.notify(b'g', "del", dst);
        }
        return 0;
    }
    let n = entries.len() as i64;
    ctx.set(dst, Value::ZSet(Box::new(ZSet::from_sorted(entries))), 0);
    ctx.notify(b'z', event, dst);
    ctx.key_ready(dst);
    n
}

/// ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]
pub fn zrangestore(ctx: &mut ExecCtx, args: &[Bytes]) {
    let spec = match parse_range(args, 2, true, By::Auto, None) {
        Ok(s) => s,
        Err(e) => return ctx.out.error(e),
    };
    match rangestore_read(ctx, &args[2], &spec) {
        Err(WrongType) => ctx.out.error(WRONGTYPE),
        Ok(entries) => {
            let n = store_result(ctx, &args[1], entries, "zrangestore");
            ctx.out.int(n);
        }
    }
}

cross_handler!(zrangestore_cross, |sess, args, tx| {
    let spec = match parse_range(&args, 2, true, By::Auto, None) {
        Ok(s) => s,
        Err(e) => return sess.out.error(e),
    };
    let db = sess.db;
    let src = args[2].clone();
    let read = tx
        .run(sess.worker.shard_of(&src), move |sh| {
            sh.with_ctx(db, |ctx| rangestore_read(ctx, &src, &spec))
        })
        .await;
    let entries = match read {
        Ok(e) => e,
        Err(WrongType) => return sess.out.error(WRONGTYPE),
    };
    let dst = args[1].clone();
    let n = tx
        .run(sess.worker.shard_of(&dst), move |sh| {
            sh.with_ctx(db, |ctx| store_result(ctx, &dst, entries, "zrangestore"))
        })
        .await;
    sess.out.int(n);
});

// ---------------------------------------------------------------------------------------
// ZREMRANGEBYRANK, ZREMRANGEBYSCORE, ZREMRANGEBYLEX
// ---------------------------------------------------------------------------------------

fn zremrange(ctx: &mut ExecCtx, key: &[u8], kind: RangeKind, event: &'static str) {
    let (removed, emptied) = match write_zset(ctx, key) {
        Err(WrongType) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.int(0),
        Ok(Some(z)) => {
            let (start, n) = match &kind {
                RangeKind::Rank(a, b) => match rank_bounds(*a, *b, z.len()) {
                    Some((s, e)) => (s, e - s + 1),
                    None => (0, 0),
                },
                RangeKind::Span(span) => span.run(z).unwrap_or((0, 0)),
            };
            z.remove_range(start, start + n);
            (n, z.is_empty())
        }
    };
    if removed > 0 {
        after_change(ctx, key, event, emptied);
    }
    ctx.out.int(removed as i64);
}

pub fn zremrangebyrank(ctx: &mut ExecCtx, args: &[Bytes]) {
    match (parse_i64(&args[2]), parse_i64(&args[3])) {
        (Ok(a), Ok(b)) => zremrange(ctx, &args[1], RangeKind::Rank(a, b), "zremrangebyrank"),
        _ => ctx.out.error(NOT_INT),
    }
}

pub fn zremrangebyscore(ctx: &mut ExecCtx, args: &[Bytes]) {
    match ScoreRange::parse(&args[2], &args[3]) {
        Some(r) => zremrange(
            ctx,
            &args[1],
            RangeKind::Span(Span::Score(r)),
            "zremrangebyscore",
        ),
        None => ctx.out.error(NOT_FLOAT_RANGE),
    }
}

pub fn zremrangebylex(ctx: &mut ExecCtx, args: &[Bytes]) {
    match LexRange::parse(&args[2], &args[3]) {
        Some(r) => zremrange(
            ctx,
            &args[1],
            RangeKind::Span(Span::Lex(r)),
            "zremrangebylex",
        ),
        None => ctx.out.error(NOT_LEX_RANGE),
    }
}

// ---------------------------------------------------------------------------------------
// Popping: ZPOPMIN, ZPOPMAX, ZMPOP, and the primitive of the blocking forms
// ---------------------------------------------------------------------------------------

/// Pops up to `count` entries from the lowest scores (or the highest with `max`) of the
/// sorted set at `key`, in pop order, with everything Redis does around it: the
/// `zpopmin`/`zpopmax` event, deleting the key (and the `del` event) when it empties, and
/// the change signal for WATCH.
///
/// Returns `Ok(None)` when the key does not exist, `Err(WrongType)` when it holds another
/// type, `Ok(Some(vec![]))` for `count == 0` (nothing changes). Sorted sets are never
/// empty in the keyspace, so an existing key with `count >= 1` always yields entries.
///
/// This is what BZPOPMIN/BZPOPMAX (count 1, reply with [`reply_bzpop`]) and BZMPOP (reply
/// with [`reply_mpop`]) call on the shard owning `key` when they can be served.
pub fn pop_min_max(
    ctx: &mut ExecCtx,
    key: &[u8],
    max: bool,
    count: usize,
) -> Result<Option<Popped>, WrongType> {
    let (items, emptied) = match write_zset(ctx, key)? {
        None => return Ok(None),
        Some(_) if count == 0 => return Ok(Some(Vec::new())),
        Some(z) => {
            let n = count.min(z.len());
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(z.pop(max).expect("within length"));
            }
            (items, z.is_empty())
        }
    };
    after_change(ctx, key, if max { "zpopmax" } else { "zpopmin" }, emptied);
    if !items.is_empty() {
        // A sorted set keeps no push times: its pops count, its waits are unknown.
        let mut waits = crate::observe::Waits::default();
        for _ in &items {
            waits.popped(None);
        }
        ctx.shard.queues.popped(ctx.db, key, &waits, ctx.now_ms);
    }
    Ok(Some(items))
}

fn zpop(ctx: &mut ExecCtx, args: &[Bytes], max: bool) {
    if args.len() > 3 {
        return ctx.out.error(SYNTAX_ERR);
    }
    let count = match args.get(2) {
        None => None,
        // Redis gives the range message for anything but a count >= 0.
        Some(a) => match parse_i64(a) {
            Ok(n) if n >= 0 => Some(n as usize),
            _ => return ctx.out.error("ERR value is out of range, must be positive"),
        },
    };
    match pop_min_max(ctx, &args[1], max, count.unwrap_or(1)) {
        Err(WrongType) => ctx.out.error(WRONGTYPE),
        Ok(None) => ctx.out.array(0),
        Ok(Some(items)) if items.is_empty() => ctx.out.array(0),
        Ok(Some(items)) => {
            let nested = ctx.out.resp3 && count.is_some();
            reply_popped(ctx.out, &items, nested);
        }
    }
}

/// ZPOPMIN key [count]
pub fn zpopmin(ctx: &mut ExecCtx, args: &[Bytes]) {
    zpop(ctx, args, false);
}

pub fn zpopmax(ctx: &mut ExecCtx, args: &[Bytes]) {
    zpop(ctx, args, true);
}

/// The validated numkeys of a ZMPOP-style command whose numkeys is at `at`, when its keys
/// fit in the arguments.
fn valid_numkeys(args: &[Bytes], at: usize) -> Option<usize> {
    let n = parse_i64(args.get(at)?).ok()?;
    (n >= 1 && (n as u64) <= (args.len() - at - 1) as u64).then_some(n as usize)
}

/// Key positions of ZMPOP numkeys key [key ...] MIN|MAX [COUNT count].
pub fn zmpop_keys(args: &[Bytes]) -> Vec<usize> {
    valid_numkeys(args, 1).map_or(Vec::new(), |n| (2..2 + n).collect())
}

struct MpopArgs {
    keys: Vec<Bytes>,
    max: bool,
    count: usize,
}

fn parse_mpop(args: &[Bytes]) -> Result<MpopArgs, &'static str> {
    const NUMKEYS: &str = "ERR numkeys should be greater than 0";
    let n = match parse_i64(&args[1]) {
        Ok(n) if n >= 1 => n as u64,
        _ => return Err(NUMKEYS),
    };
    let where_idx = 2u64.saturating_add(n);
    if where_idx >= args.len() as u64 {
        return Err(SYNTAX_ERR);
    }
    let where_idx = where_idx as usize;
    let max = if eq_ci(&args[where_idx], "min") {
        false
    } else if eq_ci(&args[where_idx], "max") {
        true
    } else {
        return Err(SYNTAX_ERR);
    };
    let mut count: Option<usize> = None;
    let mut j = where_idx + 1;
    while j < args.len() {
        if count.is_none() && eq_ci(&args[j], "count") && j + 1 < args.len() {
            match parse_i64(&args[j + 1]) {
                Ok(c) if c >= 1 => count = Some(c as usize),
                _ => return Err("ERR count should be greater than 0"),
            }
            j += 2;
        } else {
            return Err(SYNTAX_ERR);
        }
    }
    Ok(MpopArgs {
        keys: args[2..where_idx].to_vec(),
        max,
        count: count.unwrap_or(1),
    })
}

/// ZMPOP's and BZMPOP's pop on one shard: the first non-empty sorted set in key order,
/// logged as the ZPOPMIN/ZPOPMAX it was.
fn mpop_here(ctx: &mut ExecCtx, a: &MpopArgs) {
    for key in &a.keys {
        match pop_min_max(ctx, key, a.max, a.count) {
            Err(WrongType) => return ctx.out.error(WRONGTYPE),
            Ok(None) => continue,
            Ok(Some(items)) => {
                if ctx.logging() {
                    let name: &'static [u8] = if a.max { b"ZPOPMAX" } else { b"ZPOPMIN" };
                    let n = items.len().to_string();
                    ctx.log_as(crate::persist::aof::effects::words(&[
                        name,
                        key,
                        n.as_bytes(),
                    ]));
                }
                return reply_mpop(ctx.out, key, &items);
            }
        }
    }
    ctx.out.null_array();
}

/// ZMPOP numkeys key [key ...] MIN|MAX [COUNT count]
pub fn zmpop(ctx: &mut ExecCtx, args: &[Bytes]) {
    let a = match parse_mpop(args) {
        Ok(a) => a,
        Err(e) => return ctx.out.error(e),
    };
    mpop_here(ctx, &a);
}

cross_handler!(zmpop_cross, |sess, args, tx| {
    let a = match parse_mpop(&args) {
        Ok(a) => a,
        Err(e) => return sess.out.error(e),
    };
    let db = sess.db;
    for key in a.keys {
        let k = key.clone();
        let (max, count) = (a.max, a.count);
        let popped = tx
            .run(sess.worker.shard_of(&key), move |sh| {
                sh.with_ctx(db, |ctx| pop_min_max(ctx, &k, max, count))
            })
            .await;
        match popped {
            Err(WrongType) => return sess.out.error(WRONGTYPE),
            Ok(None) => continue,
            Ok(Some(items)) => return reply_mpop(&mut sess.out, &key, &items),
        }
    }
    sess.out.null_array();
});

// ---------------------------------------------------------------------------------------
// ZUNION, ZINTER, ZDIFF, ZINTERCARD and the STORE forms
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Debug)]
enum SetOp {
    Union,
    Inter,
    Diff,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Aggregate {
    Sum,
    Min,
    Max,
}

fn aggregate(target: &mut f64, v: f64, how: Aggregate) {
    match how {
        Aggregate::Sum => {
            *target += v;
            // inf + -inf: Redis keeps 0 rather than NaN.
            if target.is_nan() {
                *target = 0.0;
            }
        }
        Aggregate::Min => {
            if v < *target {
                *target = v;
            }
        }
        Aggregate::Max => {
            if v > *target {
                *target = v;
            }
        }
    }
}

/// Which command of the family runs, and where its arguments are.
#[derive(Clone, Copy)]
struct SetCmd {
    op: SetOp,
    /// Position of numkeys: 1, or 2 for the STORE forms.
    numkeys_at: usize,
    store: bool,
    card: bool,
    name: &'static str,
}

struct SetOpts {
    weights: Vec<f64>,
    agg: Aggregate,
    withscores: bool,
    limit: usize,
}

/// numkeys and the key positions; errors as Redis checks them before any lookup.
fn parse_setop_keys(args: &[Bytes], c: SetCmd) -> Result<std::ops::Range<usize>, String> {
    let n = parse_i64(&args[c.numkeys_at]).map_err(|e| e.to_string())?;
    if n < 1 {
        return Err(format!(
            "ERR at least 1 input key is needed for '{}' command",
            c.name
        ));
    }
    let first = c.numkeys_at + 1;
    if n as u64 > (args.len() - first) as u64 {
        return Err(SYNTAX_ERR.into());
    }
    Ok(first..first + n as usize)
}

/// The options after the keys (checked after the key lookups, as in Redis).
fn parse_setop_opts(
    args: &[Bytes],
    keys: &std::ops::Range<usize>,
    c: SetCmd,
) -> Result<SetOpts, &'static str> {
    let n = keys.len();
    let mut o = SetOpts {
        weights: vec![1.0; n],
        agg: Aggregate::Sum,
        withscores: false,
        limit: 0,
    };
    let mut j = keys.end;
    while j < args.len() {
        let remaining = args.len() - j;
        let a = &args[j];
        if c.op != SetOp::Diff && !c.card && remaining > n && eq_ci(a, "weights") {
            for i in 0..n {
                o.weights[i] =
                    parse_score(&args[j + 1 + i]).ok_or("ERR weight value is not a float")?;
            }
            j += 1 + n;
        } else if c.op != SetOp::Diff && !c.card && remaining >= 2 && eq_ci(a, "aggregate") {
            let v = &args[j + 1];
            o.agg = if eq_ci(v, "sum") {
                Aggregate::Sum
            } else if eq_ci(v, "min") {
                Aggregate::Min
            } else if eq_ci(v, "max") {
                Aggregate::Max
            } else {
                return Err(SYNTAX_ERR);
            };
            j += 2;
        } else if !c.store && !c.card && eq_ci(a, "withscores") {
            o.withscores = true;
            j += 1;
        } else if c.card && remaining >= 2 && eq_ci(a, "limit") {
            o.limit = match parse_i64(&args[j + 1]) {
                Ok(l) if l >= 0 => l as usize,
                _ => return Err("ERR LIMIT can't be negative"),
            };
            j += 2;
        } else {
            return Err(SYNTAX_ERR);
        }
    }
    Ok(o)
}

/// A source of a set operation: sorted sets, and plain sets whose members score 1.
#[derive(Clone, Copy)]
enum Src<'a> {
    Missing,
    Z(&'a ZSet),
    S(&'a Set),
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::Missing => 0,
            Src::Z(z) => z.len(),
            Src::S(s) => set_len(s),
        }
    }

    fn find(&self, m: &[u8]) -> Option<f64> {
        match self {
            Src::Missing => None,
            Src::Z(z) => z.score(m),
            Src::S(s) => set_contains(s, m).then_some(1.0),
        }
    }

    fn for_each(&self, mut f: impl FnMut(&[u8], f64)) {
        match self {
            Src::Missing => {}
            Src::Z(z) => z.visit(0, false, |m, s| {
                f(m, s);
                true
            }),
            Src::S(s) => {
                for m in set_members(s) {
                    f(&m, 1.0);
                }
            }
        }
    }
}

// The plain-set side of ZUNION/ZINTER/ZDIFF. `Set` belongs to the sets family, which is
// built on its own branch; on this branch it has no members API yet and no command can
// create one, so a set source is always empty here. These three functions are the whole
// interface this family needs from it (length, membership, members) and are where it
// plugs in.
fn set_len(s: &Set) -> usize {
    s.len()
}

fn set_contains(s: &Set, m: &[u8]) -> bool {
    s.contains(m)
}

fn set_members(s: &Set) -> Vec<Vec<u8>> {
    let mut scratch = [0u8; 20];
    s.iter().map(|m| m.bytes(&mut scratch).to_vec()).collect()
}

/// The entries of a set operation, sorted.
fn compute_setop(srcs: &[Src], opts: &SetOpts, op: SetOp) -> Sorted {
    let mut out: Sorted = Vec::new();
    match op {
        SetOp::Union | SetOp::Inter => {
            // Smallest first, ties in argument order (Redis's qsort is glibc's merge sort).
            let mut order: Vec<usize> = (0..srcs.len()).collect();
            order.sort_by_key(|&i| srcs[i].len());
            let w = |i: usize, s: f64| {
                let v = opts.weights[i] * s;
                if v.is_nan() {
                    0.0
                } else {
                    v
                }
            };
            if op == SetOp::Union {
                let mut acc: HashMap<Box<[u8]>, f64> = HashMap::new();
                for &i in &order {
                    srcs[i].for_each(|m, s| {
                        let v = w(i, s);
                        match acc.get_mut(m) {
                            Some(t) => aggregate(t, v, opts.agg),
                            None => {
                                acc.insert(m.into(), v);
                            }
                        }
                    });
                }
                out = acc.into_iter().map(|(m, s)| (s, m)).collect();
            } else if srcs[order[0]].len() > 0 {
                let first = order[0];
                srcs[first].for_each(|m, s| {
                    let mut score = w(first, s);
                    for &j in &order[1..] {
                        match srcs[j].find(m) {
                            Some(v) => aggregate(&mut score, v * opts.weights[j], opts.agg),
                            None => return,
                        }
                    }
                    out.push((score, m.into()));
                });
            }
        }
        SetOp::Diff => {
            srcs[0].for_each(|m, s| {
                if srcs[1..].iter().all(|o| o.find(m).is_none()) {
                    out.push((s, m.into()));
                }
            });
        }
    }
    out.sort_by(|a, b| cmp_entry(a.0, &a.1, b.0, &b.1));
    out
}

/// ZINTERCARD's count: members in every source, stopping at `limit` (0: no limit).
fn intercard(srcs: &[Src], limit: usize) -> usize {
    let mut order: Vec<usize> = (0..srcs.len()).collect();
    order.sort_by_key(|&i| srcs[i].len());
    let mut n = 0usize;
    let mut done = false;
    srcs[order[0]].for_each(|m, _| {
        if done {
            return;
        }
        if order[1..].iter().all(|&j| srcs[j].find(m).is_some()) {
            n += 1;
            if limit > 0 && n >= limit {
                done = true;
            }
        }
    });
    n
}

/// What a set operation ends with.
enum SetOpResult {
    Card(usize),
    Entries(Sorted),
}

fn run_setop(srcs: &[Src], opts: &SetOpts, c: SetCmd) -> SetOpResult {
    if c.card {
        SetOpResult::Card(intercard(srcs, opts.limit))
    } else {
        SetOpResult::Entries(compute_setop(srcs, opts, c.op))
    }
}

fn store_event(op: SetOp) -> &'static str {
    match op {
        SetOp::Union => "zunionstore",
        SetOp::Inter => "zinterstore",
        SetOp::Diff => "zdiffstore",
    }
}

/// Writes a set operation's reply (not the STORE forms').
fn reply_setop(out: &mut Reply, res: SetOpResult, withscores: bool) {
    match res {
        SetOpResult::Card(n) => out.int(n as i64),
        SetOpResult::Entries(e) => {
            let items: Vec<(&[u8], f64)> = e.iter().map(|(s, m)| (&m[..], *s)).collect();
            reply_entries(out, &items, withscores);
        }
    }
}

/// A source value lifted out of its shard for a cross-shard operation.
enum Owned {
    Missing,
    Z(ZSet),
    S(Set),
}

impl Owned {
    fn src(&self) -> Src<'_> {
        match self {
            Owned::Missing => Src::Missing,
            Owned::Z(z) => Src::Z(z),
            Owned::S(s) => Src::S(s),
        }
    }
}

/// Looks the sources up in argument order; a key of another type stops at once.
fn lookup_sources(ctx: &mut ExecCtx, keys: &[Bytes]) -> Result<(), WrongType> {
    for k in keys {
        if let Some(e) = ctx.get_read(k) {
            if !matches!(e.value, Value::ZSet(_) | Value::Set(_)) {
                return Err(WrongType);
            }
        }
    }
    Ok(())
}

fn setop_generic(ctx: &mut ExecCtx, args: &[Bytes], c: SetCmd) {
    let keys = match parse_setop_keys(args, c) {
        Ok(k) => k,
        Err(e) => return ctx.out.error(&e),
    };
    let key_args = &args[keys.clone()];
    if lookup_sources(ctx, key_args).is_err() {
        return ctx.out.error(WRONGTYPE);
    }
    let opts = match parse_setop_opts(args, &keys, c) {
        Ok(o) => o,
        Err(e) => return ctx.out.error(e),
    };
    let res = {
        let table = &ctx.shard.dbs[ctx.db].table;
        let srcs: Vec<Src> = key_args
            .iter()
            .map(|k| match table.get(k).map(|e| &e.value) {
                Some(Value::ZSet(z)) => Src::Z(z),
                Some(Value::Set(s)) => Src::S(s),
                _ => Src::Missing,
            })
            .collect();
        run_setop(&srcs, &opts, c)
    };
    if c.store {
        let SetOpResult::Entries(e) = res else {
            unreachable!("store forms compute entries")
        };
        let n = store_result(ctx, &args[1], e, store_event(c.op));
        ctx.out.int(n);
    } else {
        reply_setop(ctx.out, res, opts.withscores);
    }
}

async fn setop_cross(
    sess: &mut crate::server::session::Session,
    args: Vec<Bytes>,
    tx: &crate::shard::tx::Tx,
    c: SetCmd,
) {
    let keys = match parse_setop_keys(&args, c) {
        Ok(k) => k,
        Err(e) => return sess.out.error(&e),
    };
    let db = sess.db;
    // Read the sources shard by shard, each key in argument order within its shard; the
    // first key of another type in argument order decides the error.
    let mut owned: Vec<Option<Result<Owned, WrongType>>> = (0..keys.len()).map(|_| None).collect();
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, k) in args[keys.clone()].iter().enumerate() {
        let s = sess.worker.shard_of(k);
        match groups.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push(i),
            None => groups.push((s, vec![i])),
        }
    }
    groups.sort_by_key(|g| g.0);
    for (shard, idxs) in groups {
        let ks: Vec<Bytes> = idxs.iter().map(|&i| args[keys.start + i].clone()).collect();
        let got = tx
            .run(shard, move |sh| {
                sh.with_ctx(db, |ctx| {
                    ks.iter()
                        .map(|k| match ctx.get_read(k).map(|e| &e.value) {
                            None => Ok(Owned::Missing),
                            Some(Value::ZSet(z)) => Ok(Owned::Z((**z).clone())),
                            Some(Value::Set(s)) => Ok(Owned::S((**s).clone())),
                            Some(_) => Err(WrongType),
                        })
                        .collect::<Vec<_>>()
                })
            })
            .await;
        for (i, r) in idxs.into_iter().zip(got) {
            owned[i] = Some(r);
        }
    }
    let mut values = Vec::with_capacity(owned.len());
    for r in owned {
        match r.expect("every key read") {
            Ok(v) => values.push(v),
            Err(WrongType) => return sess.out.error(WRONGTYPE),
        }
    }
    let opts = match parse_setop_opts(&args, &keys, c) {
        Ok(o) => o,
        Err(e) => return sess.out.error(e),
    };
    let srcs: Vec<Src> = values.iter().map(Owned::src).collect();
    let res = run_setop(&srcs, &opts, c);
    drop(srcs);
    if c.store {
        let SetOpResult::Entries(e) = res else {
            unreachable!("store forms compute entries")
        };
        let dst = args[1].clone();
        let event = store_event(c.op);
        let n = tx
            .run(sess.worker.shard_of(&dst), move |sh| {
                sh.with_ctx(db, |ctx| store_result(ctx, &dst, e, event))
            })
            .await;
        sess.out.int(n);
    } else {
        reply_setop(&mut sess.out, res, opts.withscores);
    }
}

/// Key positions of ZUNION/ZINTER/ZDIFF/ZINTERCARD numkeys key [key ...] ...
pub fn numkeys_keys(args: &[Bytes]) -> Vec<usize> {
    valid_numkeys(args, 1).map_or(Vec::new(), |n| (2..2 + n).collect())
}

/// Key positions of ZUNIONSTORE/ZINTERSTORE/ZDIFFSTORE dst numkeys key [key ...] ...
pub fn store_numkeys_keys(args: &[Bytes]) -> Vec<usize> {
    let mut v = vec![1];
    if let Some(n) = valid_numkeys(args, 2) {
        v.extend(3..3 + n);
    }
    v
}

const ZUNION: SetCmd = SetCmd {
    op: SetOp::Union,
    numkeys_at: 1,
    store: false,
    card: false,
    name: "zunion",
};
const ZINTER: SetCmd = SetCmd {
    op: SetOp::Inter,
    name: "zinter",
    ..ZUNION
};
const ZDIFF: SetCmd = SetCmd {
    op: SetOp::Diff,
    name: "zdiff",
    ..ZUNION
};
const ZINTERCARD: SetCmd = SetCmd {
    op: SetOp::Inter,
    card: true,
    name: "zintercard",
    ..ZUNION
};
const ZUNIONSTORE: SetCmd = SetCmd {
    op: SetOp::Union,
    numkeys_at: 2,
    store: true,
    card: false,
    name: "zunionstore",
};
const ZINTERSTORE: SetCmd = SetCmd {
    op: SetOp::Inter,
    name: "zinterstore",
    ..ZUNIONSTORE
};
const ZDIFFSTORE: SetCmd = SetCmd {
    op: SetOp::Diff,
    name: "zdiffstore",
    ..ZUNIONSTORE
};

/// ZUNION numkeys key [key ...] [WEIGHTS weight ...] [AGGREGATE SUM|MIN|MAX] [WITHSCORES]
pub fn zunion(ctx: &mut ExecCtx, args: &[Bytes]) {
    setop_generic(ctx, args, ZUNION);
}

cross_handler!(zunion_cross, |sess, args, tx| {
    setop_cross(sess, args, tx, ZUNION).await
});

/// ZINTER numkeys key [key ...] [WEIGHTS weight ...] [AGGREGATE SUM|MIN|MAX] [WITHSCORES]
pub fn zinter(ctx: &mut ExecCtx, args: &[Bytes]) {
    setop_generic(ctx, args, ZINTER);
}

cross_handler!(zinter_cross, |sess, args, tx| {
    setop_cross(sess, args, tx, ZINTER).await
});

/// ZDIFF numkeys key [key ...] [WITHSCORES]
pub fn zdiff(ctx: &mut ExecCtx, args: &[Bytes]) {
    setop_generic(ctx, args, ZDIFF);
}

cross_handler!(zdiff_cross, |sess, args, tx| {
    setop_cross(sess, args, tx, ZDIFF).await
});

/// ZINTERCARD numkeys key [key ...] [LIMIT limit]
pub fn zintercard(ctx: &mut ExecCtx, args: &[Bytes]) {
    setop_generic(ctx, args, ZINTERCARD);
}

cross_handler!(zintercard_cross, |sess, args, tx| {
    setop_cross(sess, args, tx, ZINTERCARD).await
});

/// ZUNIONSTORE dst numkeys key [key ...] [WEIGHTS weight ...] [AGGREGATE SUM|MIN|MAX]
pub fn zunionstore(ctx: &mut ExecCtx, args: &[Bytes]) {
    setop_generic(ctx, args, ZUNIONSTORE);
}

cross_handler!(zunionstore_cross, |sess, args, tx| {
    setop_cross(sess, args, tx, ZUNIONSTORE).await
});

/// ZINTERSTORE dst numkeys key [key ...] [WEIGHTS weight ...] [AGGREGATE SUM|MIN|MAX]
pub fn zinterstore(ctx: &mut ExecCtx, args: &[Bytes]) {
    setop_generic(ctx, args, ZINTERSTORE);
}

cross_handler!(zinterstore_cross, |sess, args, tx| {
    setop_cross(sess, args, tx, ZINTERSTORE).await
});

/// ZDIFFSTORE dst numkeys key [key ...]
pub fn zdiffstore(ctx: &mut ExecCtx, args: &[Bytes]) {
    setop_generic(ctx, args, ZDIFFSTORE);
}

cross_handler!(zdiffstore_cross, |sess, args, tx| {
    setop_cross(sess, args, tx, ZDIFFSTORE).await
});

// ---------------------------------------------------------------------------------------
// ZRANDMEMBER
// ---------------------------------------------------------------------------------------

/// Most members a negative-count ZRANDMEMBER returns. Redis has no bound and would build
/// the whole reply (running out of memory on absurd counts); Kite refuses those.
const RANDMEMBER_MAX: u64 = 10_000_000;

/// `count` distinct ranks below `size`, in the order drawn (Floyd's sampling).
fn sample_ranks(shard: &Shard, size: usize, count: usize) -> Vec<usize> {
    let mut chosen = std::collections::HashSet::with_capacity(count);
    let mut order = Vec::with_capacity(count);
    for j in size - count..size {
        let t = (shard.random() % (j as u64 + 1)) as usize;
        let pick = if chosen.contains(&t) { j } else { t };
        chosen.insert(pick);
        order.push(pick);
    }
    order
}

/// ZRANDMEMBER key [count [WITHSCORES]]
pub fn zrandmember(ctx: &mut ExecCtx, args: &[Bytes]) {
    let mut count: Option<i64> = None;
    let mut withscores = false;
    if args.len() >= 3 {
        let l = match parse_i64(&args[2]) {
            Err(e) => return ctx.out.error(e),
            Ok(i64::MIN) => {
                return ctx.out.error(
                    "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807",
                )
            }
            Ok(l) => l,
        };
        if args.len() > 4 || (args.len() == 4 && !eq_ci(&args[3], "withscores")) {
            return ctx.out.error(SYNTAX_ERR);
        }
        if args.len() == 4 {
            withscores = true;
            if !(-(i64::MAX / 2)..=i64::MAX / 2).contains(&l) {
                return ctx.out.error("ERR value is out of range");
            }
        }
        count = Some(l);
    }
    let live = ctx.get_read(&args[1]).is_some();
    let shard: &Shard = ctx.shard;
    let out = &mut *ctx.out;
    let z = match live
        .then(|| shard.dbs[ctx.db].table.get(&args[1]))
        .flatten()
    {
        None => {
            return match count {
                None => out.null(),
                Some(_) => out.array(0),
            }
        }
        Some(e) => match &e.value {
            Value::ZSet(z) => z,
            _ => return out.error(WRONGTYPE),
        },
    };
    let size = z.len();
    let random_rank = || (shard.random() % size as u64) as usize;
    let Some(l) = count else {
        let (m, _) = z.get(random_rank()).expect("rank below length");
        return out.bulk(m);
    };
    if l == 0 {
        return out.array(0);
    }
    let uniq = l > 0;
    let n = l.unsigned_abs();
    let picks: Vec<usize> = if !uniq || n == 1 {
        if n > RANDMEMBER_MAX {
            return out.error("ERR value is out of range");
        }
        (0..n).map(|_| random_rank()).collect()
    } else if n as usize >= size {
        // The whole set, from the highest score down, as Redis walks it.
        (0..size).rev().collect()
    } else {
        let mut picks = sample_ranks(shard, size, n as usize);
        if matches!(**z, ZSet::Small(_)) {
            // A listpack is sampled in its own order.
            picks.sort_unstable();
        }
        picks
    };
    let items: Vec<(&[u8], f64)> = if let ZSet::Small(_) = **z {
        let all: Vec<(&[u8], f64)> = {
            let mut v = Vec::with_capacity(size);
            z.visit(0, false, |m, s| {
                v.push((m, s));
                true
            });
            v
        };
        picks.iter().map(|&r| all[r]).collect()
    } else {
        picks
            .iter()
            .map(|&r| z.get(r).expect("rank below length"))
            .collect()
    };
    reply_entries(out, &items, withscores);
}

// ---------------------------------------------------------------------------------------
// ZSCAN
// ---------------------------------------------------------------------------------------

/// A SCAN cursor as Redis reads one, with `strtoul`: no leading space, the whole string
/// up to a NUL, no overflow; a sign is accepted (`-1` wraps around) and an empty string
/// is cursor 0.
fn parse_cursor(a: &[u8]) -> Option<u64> {
    if a.first().is_some_and(|&c| is_c_space(c)) {
        return None;
    }
    let s = a.iter().position(|&c| c == 0).map_or(a, |n| &a[..n]);
    if s.is_empty() {
        return Some(0);
    }
    let (neg, digits) = match s[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let mut v: u64 = 0;
    for &c in digits {
        v = v.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    Some(if neg { v.wrapping_neg() } else { v })
}

/// ZSCAN key cursor [MATCH pattern] [COUNT count]
pub fn zscan(ctx: &mut ExecCtx, args: &[Bytes]) {
    let Some(cursor) = parse_cursor(&args[2]) else {
        return ctx.out.error("ERR invalid cursor");
    };
    let (z, out) = match read_zset(ctx, &args[1]) {
        (Err(WrongType), out) => return out.error(WRONGTYPE),
        (Ok(None), out) => {
            out.array(2);
            out.bulk(b"0");
            return out.array(0);
        }
        (Ok(Some(z)), out) => (z, out),
    };
    let mut count = 10usize;
    let mut pattern: Option<&[u8]> = None;
    let mut i = 3;
    while i < args.len() {
        let more = args.len() - i >= 2;
        if eq_ci(&args[i], "count") && more {
            match parse_i64(&args[i + 1]) {
                Err(e) => return out.error(e),
                Ok(c) if c < 1 => return out.error(SYNTAX_ERR),
                Ok(c) => count = c as usize,
            }
        } else if eq_ci(&args[i], "match") && more {
            let p = &args[i + 1][..];
            pattern = (p != b"*").then_some(p);
        } else {
            return out.error(SYNTAX_ERR);
        }
        i += 2;
    }
    let mut items: Vec<(&[u8], f64)> = Vec::new();
    let next = z.scan(cursor, count, |m, s| {
        if pattern.is_none_or(|p| glob_match(p, m, false)) {
            items.push((m, s));
        }
    });
    out.array(2);
    out.bulk(next.to_string().as_bytes());
    out.array(items.len() * 2);
    for (m, s) in items {
        out.bulk(m);
        out.bulk(format_double(s).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_parse_like_string2d() {
        assert_eq!(parse_score(b"1.5"), Some(1.5));
        assert_eq!(parse_score(b"+5"), Some(5.0));
        assert_eq!(parse_score(b".5"), Some(0.5));
        assert_eq!(parse_score(b"5."), Some(5.0));
        assert_eq!(parse_score(b"1e3"), Some(1000.0));
        assert_eq!(parse_score(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_score(b"Infinity"), Some(f64::INFINITY));
        assert_eq!(parse_score(b"0x10"), Some(16.0));
        assert_eq!(parse_score(b"0x1.8p1"), Some(3.0));
        assert!(parse_score(b"-0").unwrap().is_sign_negative());
        assert!(parse_score(b"4e-320").is_some(), "denormals are kept");
        for bad in [
            &b""[..],
            b" 1",
            b"1 ",
            b"nan",
            b"-nan",
            b"1e400",
            b"1e-400",
            b"1e",
            b"1e+",
            b"0x",
            b"0x1p",
            b"--1",
            b"1\x00",
            b"abc",
            b"(1",
        ] {
            assert_eq!(parse_score(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn range_bounds_parse_like_strtod() {
        assert_eq!(parse_score_bound(b"(1.5"), Some((1.5, true)));
        assert_eq!(parse_score_bound(b"1.5"), Some((1.5, false)));
        assert_eq!(parse_score_bound(b""), Some((0.0, false)));
        assert_eq!(parse_score_bound(b"("), Some((0.0, true)));
        assert_eq!(parse_score_bound(b" 5"), Some((5.0, false)));
        assert_eq!(parse_score_bound(b"5\x00junk"), Some((5.0, false)));
        assert_eq!(parse_score_bound(b"1e400"), Some((f64::INFINITY, false)));
        assert_eq!(parse_score_bound(b"-inf"), Some((f64::NEG_INFINITY, false)));
        for bad in [&b" "[..], b"5 ", b"nan", b"((1", b"abc", b"1x"] {
            assert_eq!(
                parse_score_bound(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn lex_ranges() {
        let r = LexRange::parse(b"[b", b"(d").unwrap();
        assert!(!r.gte_min(b"a") && r.gte_min(b"b") && r.gte_min(b"c"));
        assert!(r.lte_max(b"c") && !r.lte_max(b"d"));
        assert!(!r.is_empty());
        let all = LexRange::parse(b"-", b"+").unwrap();
        assert!(all.gte_min(b"") && all.lte_max(b"\xff\xff"));
        assert!(LexRange::parse(b"-", b"-").unwrap().is_empty());
        assert!(LexRange::parse(b"+", b"-").unwrap().is_empty());
        assert!(LexRange::parse(b"(a", b"[a").unwrap().is_empty());
        assert!(!LexRange::parse(b"[a", b"[a").unwrap().is_empty());
        assert!(LexRange::parse(b"+\x00", b"-").is_some());
        for bad in [&b""[..], b"a", b"+x", b"-x"] {
            assert!(LexRange::parse(bad, b"+").is_none());
        }
    }

    #[test]
    fn scan_cursors_parse_like_strtoul() {
        assert_eq!(parse_cursor(b"0"), Some(0));
        assert_eq!(parse_cursor(b""), Some(0));
        assert_eq!(parse_cursor(b"+7"), Some(7));
        assert_eq!(parse_cursor(b"-1"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551616"), None);
        assert_eq!(parse_cursor(b" 5"), None);
        assert_eq!(parse_cursor(b"5 "), None);
        assert_eq!(parse_cursor(b"x"), None);
    }

    #[test]
    fn rank_bounds_clamp_like_redis() {
        assert_eq!(rank_bounds(0, -1, 5), Some((0, 4)));
        assert_eq!(rank_bounds(-100, 100, 5), Some((0, 4)));
        assert_eq!(rank_bounds(3, 1, 5), None);
        assert_eq!(rank_bounds(5, 10, 5), None);
        assert_eq!(rank_bounds(-2, -1, 5), Some((3, 4)));
        assert_eq!(rank_bounds(0, -6, 5), None);
        assert_eq!(rank_bounds(0, 0, 0), None);
    }

    #[test]
    fn numkeys_key_positions() {
        let a = |v: &[&str]| {
            v.iter()
                .map(|s| Bytes::from(s.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            numkeys_keys(&a(&["zunion", "2", "a", "b", "WITHSCORES"])),
            vec![2, 3]
        );
        assert_eq!(
            numkeys_keys(&a(&["zunion", "3", "a", "b"])),
            Vec::<usize>::new()
        );
        assert_eq!(numkeys_keys(&a(&["zunion", "x", "a"])), Vec::<usize>::new());
        assert_eq!(
            store_numkeys_keys(&a(&["zunionstore", "d", "2", "a", "b"])),
            vec![1, 3, 4]
        );
        assert_eq!(
            store_numkeys_keys(&a(&["zunionstore", "d", "0", "a"])),
            vec![1]
        );
        assert_eq!(zmpop_keys(&a(&["zmpop", "1", "a", "MIN"])), vec![2]);
        assert_eq!(
            zmpop_keys(&a(&["zmpop", "-1", "a", "MIN"])),
            Vec::<usize>::new()
        );
    }
}

// ---------------------------------------------------------------------------------------
// BZPOPMIN, BZPOPMAX, BZMPOP (their waiting is in `crate::blocking`)
// ---------------------------------------------------------------------------------------

/// The non-blocking form of BZPOPMIN/BZPOPMAX (inside MULTI): the first non-empty sorted
/// set in key order, or a null array.
fn bzpop_here(ctx: &mut ExecCtx, args: &[Bytes], max: bool) {
    if let Err(e) = crate::blocking::parse_timeout(&args[args.len() - 1]) {
        return ctx.out.error(e);
    }
    for key in &args[1..args.len() - 1] {
        match pop_min_max(ctx, key, max, 1) {
            Err(WrongType) => return ctx.out.error(WRONGTYPE),
            Ok(Some(items)) if !items.is_empty() => {
                if ctx.logging() {
                    let name: &'static [u8] = if max { b"ZPOPMAX" } else { b"ZPOPMIN" };
                    ctx.log_as(crate::persist::aof::effects::words(&[name, key]));
                }
                return reply_bzpop(ctx.out, key, &items[0].0, items[0].1);
            }
            _ => continue,
        }
    }
    ctx.out.null_array();
}

pub fn bzpopmin(ctx: &mut ExecCtx, args: &[Bytes]) {
    bzpop_here(ctx, args, false);
}

pub fn bzpopmax(ctx: &mut ExecCtx, args: &[Bytes]) {
    bzpop_here(ctx, args, true);
}

async fn bzpop_across(sess: &mut Session, args: Vec<Bytes>, tx: &Tx, max: bool) {
    if let Err(e) = crate::blocking::parse_timeout(&args[args.len() - 1]) {
        return sess.out.error(e);
    }
    let db = sess.db;
    for key in &args[1..args.len() - 1] {
        let k = key.clone();
        let popped = tx
            .run(sess.worker.shard_of(key), move |sh| {
                sh.with_ctx(db, |ctx| pop_min_max(ctx, &k, max, 1))
            })
            .await;
        match popped {
            Err(WrongType) => return sess.out.error(WRONGTYPE),
            Ok(Some(items)) if !items.is_empty() => {
                return reply_bzpop(&mut sess.out, key, &items[0].0, items[0].1)
            }
            _ => continue,
        }
    }
    sess.out.null_array();
}

cross_handler!(bzpopmin_cross, |sess, args, tx| {
    bzpop_across(sess, args, tx, false).await;
});

cross_handler!(bzpopmax_cross, |sess, args, tx| {
    bzpop_across(sess, args, tx, true).await;
});

/// BZMPOP timeout numkeys key ... MIN|MAX [COUNT n]: its arguments after the timeout are
/// ZMPOP's.
fn bzmpop_args(args: &[Bytes]) -> Result<(Option<std::time::Duration>, MpopArgs), String> {
    let timeout = crate::blocking::parse_timeout(&args[1])?;
    let a = parse_mpop(&args[1..])?;
    Ok((timeout, a))
}

pub fn bzmpop_keys(args: &[Bytes]) -> Vec<usize> {
    valid_numkeys(args, 2).map_or(Vec::new(), |n| (3..3 + n).collect())
}

pub fn bzmpop(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (_, a) = match bzmpop_args(args) {
        Ok(x) => x,
        Err(e) => return ctx.out.error(&e),
    };
    mpop_here(ctx, &a);
}

cross_handler!(bzmpop_cross, |sess, args, tx| {
    let (_, a) = match bzmpop_args(&args) {
        Ok(x) => x,
        Err(e) => return sess.out.error(&e),
    };
    let db = sess.db;
    for key in a.keys {
        let k = key.clone();
        let (max, count) = (a.max, a.count);
        let popped = tx
            .run(sess.worker.shard_of(&key), move |sh| {
                sh.with_ctx(db, |ctx| pop_min_max(ctx, &k, max, count))
            })
            .await;
        match popped {
            Err(WrongType) => return sess.out.error(WRONGTYPE),
            Ok(None) => continue,
            Ok(Some(items)) => return reply_mpop(&mut sess.out, &key, &items),
        }
    }
    sess.out.null_array();
});

pub fn bzpop_call(args: &[Bytes]) -> Result<Option<crate::blocking::BlockCall>, String> {
    let timeout = crate::blocking::parse_timeout(&args[args.len() - 1])?;
    Ok(Some(crate::blocking::BlockCall {
        keys: Vec::new(),
        keys_at: Some(1..args.len() - 1),
        op: crate::blocking::BlockOp::ZPop {
            max: eq_ci(&args[0], "bzpopmax"),
            count: 1,
            multi: false,
        },
        timeout,
    }))
}

pub fn bzmpop_call(args: &[Bytes]) -> Result<Option<crate::blocking::BlockCall>, String> {
    let (timeout, a) = bzmpop_args(args)?;
    Ok(Some(crate::blocking::BlockCall {
        keys: a.keys,
        keys_at: None,
        op: crate::blocking::BlockOp::ZPop {
            max: a.max,
            count: a.count,
            multi: true,
        },
        timeout,
    }))
}

/// What a sorted set holds for a blocked pop.
pub fn zset_data(sh: &mut Shard, db: usize, key: &[u8]) -> crate::blocking::Data {
    use crate::blocking::Data;
    match sh.lookup(db, key, unix_ms()) {
        None => Data::Empty,
        Some(e) => match &e.value {
            Value::ZSet(z) if !z.is_empty() => Data::Ready,
            Value::ZSet(_) => Data::Empty,
            _ => Data::WrongType,
        },
    }
}

/// Pops for a served BZPOPMIN/BZPOPMAX/BZMPOP waiter and writes its reply.
pub fn pop_for_waiter(
    sh: &mut Shard,
    db: usize,
    key: &[u8],
    max: bool,
    count: usize,
    multi: bool,
    out: &mut Reply,
) -> Popped {
    let items = sh
        .with_ctx(db, |ctx| pop_min_max(ctx, key, max, count))
        .ok()
        .flatten()
        .unwrap_or_default();
    if multi {
        reply_mpop(out, key, &items);
    } else if let Some((m, s)) = items.first() {
        reply_bzpop(out, key, m, *s);
    }
    items
}

/// Puts back members popped for a client that left before it got them.
pub fn push_back_for_waiter(sh: &mut Shard, db: usize, key: &[u8], items: Popped) {
    let mut args = vec![Bytes::from_static(b"ZADD"), Bytes::copy_from_slice(key)];
    for (m, s) in items {
        args.push(Bytes::from(crate::protocol::reply::format_double(s)));
        args.push(Bytes::from(m.into_vec()));
    }
    sh.log_effect(db, &args);
    sh.with_ctx(db, |ctx| zadd(ctx, &args));
}
