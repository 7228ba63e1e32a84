//! The streams family: XADD, XLEN, XRANGE/XREVRANGE, XDEL, XTRIM, XREAD, consumer groups
//! (XGROUP, XREADGROUP, XACK, XPENDING, XCLAIM, XAUTOCLAIM), XSETID and XINFO, with Redis
//! 7.2's replies and errors.
//!
//! Blocking (`BLOCK`) is parsed and validated, and served at once when data is there; a
//! read that would have to wait answers `BLOCK_UNSUPPORTED` until the blocking work wires
//! it. That work builds on these entry points:
//!
//! - [`parse_read`] parses XREAD/XREADGROUP into a [`ReadRequest`] (keys, raw ids, COUNT,
//!   BLOCK, GROUP, NOACK); [`check_read_key`] validates one key in Redis's order and
//!   resolves its id (`$` becomes `After(last id)` at that moment, `>` is `New`).
//! - [`read_entries_after`]: XREAD's read of one stream (entries after an id).
//! - [`read_group_new`]: XREADGROUP's `>` read of one stream for a consumer (creates the
//!   consumer, moves the group's last id, fills the PEL, respects COUNT).
//! - [`write_read_reply`] assembles the per-stream parts into the final reply.
//!
//! Commands call `ctx.key_ready(key)` after XADD and XGROUP DESTROY, so that waiters can be
//! served (or told their group is gone).
//!
//! Notes for serving waiters the way Redis 7.2 does: a read with history ids never waits
//! (it is always answered at once); `$` is resolved when the command first runs; a woken
//! XREADGROUP re-runs [`read_group_new`], which answers NOGROUP when the group or the key
//! went away and WRONGTYPE when the key changed type (the reply a woken client gets);
//! a stream whose last entries were deleted has nothing to serve, so its readers keep
//! waiting. Inside MULTI (or a script) Redis answers a read that would wait with a null
//! array.

use bytes::Bytes;

use super::util::{eq_ci, parse_i64, NO_SUCH_KEY, SYNTAX_ERR};
use crate::cross_handler;
use crate::protocol::reply::Reply;
use crate::server::session::Session;
use crate::shard::tx::Tx;
use crate::shard::{unix_ms, ExecCtx, Shard};
use crate::types::stream::{
    EntryRef, Group, Log, Stream, StreamId, Trim, NODE_MAX_ENTRIES, UNKNOWN_READ,
};
use crate::types::value::{parse_canonical_i64, Value, WRONGTYPE};

const INVALID_ID: &str = "ERR Invalid stream ID specified as stream command argument";
const XADD_ID_TOO_SMALL: &str =
    "ERR The ID specified in XADD is equal or smaller than the target stream top item";
const XADD_ID_ZERO: &str = "ERR The ID specified in XADD must be greater than 0-0";
const EXHAUSTED: &str =
    "ERR The stream has exhausted the last possible ID, unable to add more items";
const TOO_LARGE: &str = "ERR Elements are too large to be stored";
const BAD_START: &str = "ERR invalid start ID for the interval";
const BAD_END: &str = "ERR invalid end ID for the interval";
const NEED_KEY: &str = "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the MKSTREAM option to create an empty stream automatically.";

// ---------------------------------------------------------------------------
// Ids and arguments
// ---------------------------------------------------------------------------

/// The argument as C code sees it: up to its first NUL byte.
fn c_str(b: &[u8]) -> &[u8] {
    b.iter().position(|&c| c == 0).map_or(b, |n| &b[..n])
}

/// An unsigned number as Redis's `string2ull` reads it: a canonical integer (never
/// negative), or else what `strtoull` accepts (leading spaces, a sign, leading zeros;
/// a minus wraps around), with nothing left over.
fn parse_u64_loose(s: &[u8]) -> Option<u64> {
    if let Some(v) = parse_canonical_i64(s) {
        return u64::try_from(v).ok();
    }
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let mut neg = false;
    if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
        neg = s[i] == b'-';
        i += 1;
    }
    let digits = i;
    let mut v: u64 = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        v = v.checked_mul(10)?.checked_add((s[i] - b'0') as u64)?;
        i += 1;
    }
    if i == digits || i != s.len() {
        return None;
    }
    Some(if neg { v.wrapping_neg() } else { v })
}

/// Parses `<ms>-<seq>`, `<ms>` (seq = `missing_seq`), `-` and `+` (unless `strict`),
/// and with `auto_seq` also `<ms>-*`. Returns the id and whether the sequence was given.
fn parse_id_full(
    arg: &[u8],
    missing_seq: u64,
    strict: bool,
    auto_seq: bool,
) -> Result<(StreamId, bool), &'static str> {
    if arg.len() > 127 {
        return Err(INVALID_ID);
    }
    let s = c_str(arg);
    match s {
        b"-" if !strict => return Ok((StreamId::MIN, true)),
        b"+" if !strict => return Ok((StreamId::MAX, true)),
        b"-" | b"+" => return Err(INVALID_ID),
        _ => {}
    }
    let (ms, seq, given) = match s.iter().position(|&c| c == b'-') {
        Some(p) => {
            let ms = parse_u64_loose(&s[..p]).ok_or(INVALID_ID)?;
            let rest = &s[p + 1..];
            if auto_seq && rest == b"*" {
                (ms, 0, false)
            } else {
                (ms, parse_u64_loose(rest).ok_or(INVALID_ID)?, true)
            }
        }
        None => (parse_u64_loose(s).ok_or(INVALID_ID)?, missing_seq, true),
    };
    Ok((StreamId::new(ms, seq), given))
}

fn parse_id(arg: &[u8], missing_seq: u64) -> Result<StreamId, &'static str> {
    parse_id_full(arg, missing_seq, false, false).map(|r| r.0)
}

fn parse_strict_id(arg: &[u8]) -> Result<StreamId, &'static str> {
    parse_id_full(arg, 0, true, false).map(|r| r.0)
}

/// A range bound: `(` makes it exclusive (then `-` and `+` are refused).
fn parse_interval(arg: &[u8], missing_seq: u64) -> Result<(StreamId, bool), &'static str> {
    if arg.len() > 1 && arg[0] == b'(' {
        Ok((parse_id_full(&arg[1..], missing_seq, true, false)?.0, true))
    } else {
        Ok((parse_id(arg, missing_seq)?, false))
    }
}

/// The start of a range: exclusive bounds move up one.
fn parse_start(arg: &[u8]) -> Result<StreamId, &'static str> {
    match parse_interval(arg, 0)? {
        (id, true) => id.next().ok_or(BAD_START),
        (id, false) => Ok(id),
    }
}

/// The end of a range: exclusive bounds move down one.
fn parse_end(arg: &[u8]) -> Result<StreamId, &'static str> {
    match parse_interval(arg, u64::MAX)? {
        (id, true) => id.prev().ok_or(BAD_END),
        (id, false) => Ok(id),
    }
}

/// `%s` of a C string in an error message, cut like `%.128s` where Redis does.
fn msg_arg(b: &[u8]) -> &[u8] {
    c_str(b)
}

fn nogroup_key_group(key: &[u8], group: &[u8], suffix: &str) -> Vec<u8> {
    let mut m = b"NOGROUP No such key '".to_vec();
    m.extend_from_slice(msg_arg(key));
    m.extend_from_slice(b"' or consumer group '");
    m.extend_from_slice(msg_arg(group));
    m.extend_from_slice(b"'");
    m.extend_from_slice(suffix.as_bytes());
    m
}

fn nogroup_group_key(group: &[u8], key: &[u8]) -> Vec<u8> {
    let mut m = b"NOGROUP No such consumer group '".to_vec();
    m.extend_from_slice(msg_arg(group));
    m.extend_from_slice(b"' for key name '");
    m.extend_from_slice(msg_arg(key));
    m.push(b'\'');
    m
}

fn subcommand_syntax_error(sub: &[u8], cmd: &str) -> Vec<u8> {
    let sub = c_str(sub);
    let mut m = b"ERR unknown subcommand or wrong number of arguments for '".to_vec();
    m.extend_from_slice(&sub[..sub.len().min(128)]);
    m.extend_from_slice(format!("'. Try {cmd} HELP.").as_bytes());
    m
}

// ---------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------

fn put_id(out: &mut Reply, id: StreamId) {
    let mut buf = [0u8; 41];
    let mut n = 0;
    for (i, part) in [id.ms, id.seq].into_iter().enumerate() {
        if i == 1 {
            buf[n] = b'-';
            n += 1;
        }
        let mut tmp = [0u8; 20];
        let mut pos = 20;
        let mut v = part;
        loop {
            pos -= 1;
            tmp[pos] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        buf[n..n + 20 - pos].copy_from_slice(&tmp[pos..]);
        n += 20 - pos;
    }
    out.bulk(&buf[..n]);
}

fn put_entry(out: &mut Reply, e: &EntryRef<'_>) {
    out.array(2);
    put_id(out, e.id);
    out.array(e.pair_count() * 2);
    for (f, v) in e.pairs() {
        out.bulk(f);
        out.bulk(v);
    }
}

/// Writes an array of the entries `range` yields, at most `count` (0: all). The range is
/// walked twice, first to count, so a long reply needs no buffer besides itself.
fn put_entries<'a, I: Iterator<Item = EntryRef<'a>>>(
    out: &mut Reply,
    range: impl Fn() -> I,
    count: usize,
) {
    let limit = if count > 0 { count } else { usize::MAX };
    let n = range().take(limit).count();
    out.array(n);
    for e in range().take(n) {
        put_entry(out, &e);
    }
}

fn put_opt_int(out: &mut Reply, v: Option<i64>) {
    match v {
        Some(v) => out.int(v),
        None => out.null(),
    }
}

// ---------------------------------------------------------------------------
// Lookups
// ---------------------------------------------------------------------------

/// The stream at `key` for a write: Ok(None) when missing, Err on another type.
fn stream_mut<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a mut Stream>, ()> {
    match ctx.get(key) {
        None => Ok(None),
        Some(e) => match &mut e.value {
            Value::Stream(s) => Ok(Some(s)),
            _ => Err(()),
        },
    }
}

/// Like `stream_mut`, counting a keyspace hit or miss as Redis's read lookups do.
fn stream_read<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a mut Stream>, ()> {
    match ctx.get_read(key) {
        None => Ok(None),
        Some(e) => match &mut e.value {
            Value::Stream(s) => Ok(Some(s)),
            _ => Err(()),
        },
    }
}

/// A read lookup like `stream_read` that leaves the reply free to be written while the
/// stream is borrowed.
fn split_read<'a>(
    ctx: &'a mut ExecCtx,
    key: &[u8],
) -> (Result<Option<&'a mut Stream>, ()>, &'a mut Reply) {
    let (entry, out) = ctx.get_read_and_out(key);
    let found = match entry {
        None => Ok(None),
        Some(e) => match &mut e.value {
            Value::Stream(s) => Ok(Some(&mut **s)),
            _ => Err(()),
        },
    };
    (found, out)
}

/// Runs `f` with a context on `sh` (for the cross-shard forms); keyspace hits and misses
/// are counted as they are for ordinary commands.
fn on_shard<R>(
    sh: &mut Shard,
    db: usize,
    resp3: bool,
    f: impl FnOnce(&mut ExecCtx) -> R,
) -> (R, Vec<u8>) {
    let mut out = Reply::new(resp3);
    let (r, hits, misses) = {
        let mut ctx = sh.ctx(db, &mut out);
        let r = f(&mut ctx);
        (r, ctx.hits, ctx.misses)
    };
    sh.stats.keyspace_hits += hits;
    sh.stats.keyspace_misses += misses;
    (r, out.buf.to_vec())
}

// ---------------------------------------------------------------------------
// XADD, XTRIM
// ---------------------------------------------------------------------------

#[derive(Default)]
struct AddTrimArgs {
    trim: Option<Trim>,
    approx: bool,
    limit: u64,
    nomkstream: bool,
    /// The id given to XADD and whether its sequence was given (`<ms>-*` leaves it out).
    id: Option<(StreamId, bool)>,
}

/// Parses the options shared by XADD and XTRIM. Returns them and the index where XADD's
/// id was found (the argument count for XTRIM or when no id came).
fn parse_add_trim(args: &[Bytes], xadd: bool) -> Result<(AddTrimArgs, usize), &'static str> {
    let mut a = AddTrimArgs::default();
    let mut limit_given = false;
    let mut i = 2;
    while i < args.len() {
        let more = args.len() - 1 - i;
        let opt = &args[i][..];
        if xadd && c_str(opt) == b"*" {
            break;
        } else if (eq_ci(opt, "maxlen") || eq_ci(opt, "minid")) && more >= 1 {
            if a.trim.is_some() {
                return Err(
                    "ERR syntax error, MAXLEN and MINID options at the same time are not compatible",
                );
            }
            let next = c_str(&args[i + 1]);
            if more >= 2 && (next == b"~" || next == b"=") {
                a.approx = next == b"~";
                i += 1;
            }
            let arg = &args[i + 1];
            a.trim = Some(if eq_ci(opt, "maxlen") {
                let n = parse_i64(arg)?;
                if n < 0 {
                    return Err("ERR The MAXLEN argument must be >= 0.");
                }
                Trim::MaxLen(n as u64)
            } else {
                Trim::MinId(parse_id(arg, 0)?)
            });
            i += 1;
        } else if eq_ci(opt, "limit") && more >= 1 {
            let n = parse_i64(&args[i + 1])?;
            if n < 0 {
                return Err("ERR The LIMIT argument must be >= 0.");
            }
            a.limit = n as u64;
            limit_given = true;
            i += 1;
        } else if xadd && eq_ci(opt, "nomkstream") {
            a.nomkstream = true;
        } else if xadd {
            a.id = Some(parse_id_full(opt, 0, true, true)?);
            break;
        } else {
            return Err(SYNTAX_ERR);
        }
        i += 1;
    }
    if a.limit > 0 && a.trim.is_none() {
        return Err(
            "ERR syntax error, LIMIT cannot be used without specifying a trimming strategy",
        );
    }
    if !xadd && a.trim.is_none() {
        return Err("ERR syntax error, XTRIM must be called with a trimming strategy");
    }
    if limit_given {
        if !a.approx {
            return Err("ERR syntax error, LIMIT cannot be used without the special ~ option");
        }
    } else {
        // Approximate trimming does a bounded amount of work unless told otherwise.
        a.limit = if a.approx {
            100 * NODE_MAX_ENTRIES as u64
        } else {
            0
        };
    }
    Ok((a, i))
}

/// After an approximate trim, the exact threshold that keeps what it kept: replaying `~`
/// elsewhere would trim by that server's node layout, not this one's.
fn exact_threshold(log: &Log, trim: Option<Trim>, approx: bool) -> Option<String> {
    if !approx {
        return None;
    }
    Some(match trim? {
        Trim::MaxLen(_) => log.len().to_string(),
        Trim::MinId(_) => log.first_entry_id().unwrap_or(log.last_id).to_string(),
    })
}

/// XADD's or XTRIM's words with `~ threshold` made `= exact` (and LIMIT, which needs `~`,
/// dropped), as Redis propagates them.
fn exact_trim_args(args: &[Bytes], exact: Option<String>) -> Vec<Bytes> {
    let Some(exact) = exact else {
        return args.to_vec();
    };
    let mut out = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if i >= 2 && (eq_ci(a, "maxlen") || eq_ci(a, "minid")) && i + 1 < args.len() {
            out.push(a.clone());
            out.push(Bytes::from_static(b"="));
            let next = c_str(&args[i + 1]);
            i += if next == b"~" || next == b"=" { 3 } else { 2 };
            out.push(Bytes::from(exact.clone()));
        } else if i >= 2 && eq_ci(a, "limit") && i + 1 < args.len() {
            i += 2;
        } else {
            out.push(a.clone());
            i += 1;
        }
    }
    out
}

/// XADD key [NOMKSTREAM] [MAXLEN|MINID [=|~] threshold [LIMIT count]] <*|id> field value ...
pub fn xadd(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (a, idpos) = match parse_add_trim(args, true) {
        Ok(r) => r,
        Err(e) => return ctx.out.error(e),
    };
    let fields = idpos + 1;
    if args.len() < fields + 2 || (args.len() - fields) % 2 == 1 {
        return ctx.out.error(&super::arity_error("xadd"));
    }
    let pairs = &args[fields..];
    if let Some((id, true)) = a.id {
        if id.is_zero() {
            return ctx.out.error(XADD_ID_ZERO);
        }
    }
    let key = &args[1];
    let now = ctx.now_ms;
    let mut created = None;
    let logging = ctx.shard.aof_on();
    let (id, trimmed, effect) = {
        let s = match stream_mut(ctx, key) {
            Err(()) => return ctx.out.error(WRONGTYPE),
            Ok(None) if a.nomkstream => return ctx.out.null(),
            Ok(None) => created.insert(Box::new(Stream::new())),
            Ok(Some(s)) => s,
        };
        let log = &mut s.log;
        if log.last_id == StreamId::MAX {
            return ctx.out.error(EXHAUSTED);
        }
        let id = match a.id {
            Some((id, true)) => id,
            Some((id, false)) => {
                if log.last_id.ms == id.ms {
                    match log.last_id.next() {
                        Some(n) if n.ms == id.ms => n,
                        _ => return ctx.out.error(XADD_ID_TOO_SMALL),
                    }
                } else {
                    id
                }
            }
            None => {
                if now > log.last_id.ms {
                    StreamId::new(now, 0)
                } else {
                    log.last_id.next().expect("below the last possible id")
                }
            }
        };
        if id <= log.last_id {
            return ctx.out.error(XADD_ID_TOO_SMALL);
        }
        if !Log::entry_fits(pairs) {
            return ctx.out.error(TOO_LARGE);
        }
        log.append(id, pairs);
        let trimmed = match a.trim {
            Some(how) => log.trim(how, a.approx, a.limit),
            None => 0,
        };
        // The id chosen, and an approximate trim as the exact one it turned out to be.
        let effect = logging.then(|| {
            let threshold = exact_threshold(log, a.trim, a.approx);
            let mut argv = exact_trim_args(&args[..idpos], threshold);
            argv.push(Bytes::from(id.to_string()));
            argv.extend_from_slice(&args[idpos + 1..]);
            argv
        });
        (id, trimmed, effect)
    };
    if let Some(argv) = effect {
        ctx.log_as(argv);
    }
    match created {
        Some(s) => ctx.set(key, Value::Stream(s), 0),
        None => ctx.modified(key),
    }
    put_id(ctx.out, id);
    ctx.notify(b'x', "xadd", key);
    ctx.shard.queues.pushed(ctx.db, key, 1, false, ctx.now_ms);
    if trimmed > 0 {
        ctx.notify(b'x', "xtrim", key);
    }
    ctx.key_ready(key);
}

/// XTRIM key MAXLEN|MINID [=|~] threshold [LIMIT count]
pub fn xtrim(ctx: &mut ExecCtx, args: &[Bytes]) {
    let a = match parse_add_trim(args, false) {
        Ok((a, _)) => a,
        Err(e) => return ctx.out.error(e),
    };
    let key = &args[1];
    let logging = ctx.shard.aof_on();
    let (deleted, threshold) = match stream_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => (0, None),
        Ok(Some(s)) => {
            let n = s.log.trim(a.trim.expect("checked"), a.approx, a.limit);
            (
                n,
                logging
                    .then(|| exact_threshold(&s.log, a.trim, a.approx))
                    .flatten(),
            )
        }
    };
    if deleted > 0 && logging {
        ctx.log_as(exact_trim_args(args, threshold));
    }
    if deleted > 0 {
        ctx.notify(b'x', "xtrim", key);
        ctx.modified(key);
    }
    ctx.out.int(deleted as i64);
}

// ---------------------------------------------------------------------------
// XLEN, XRANGE, XREVRANGE, XDEL
// ---------------------------------------------------------------------------

pub fn xlen(ctx: &mut ExecCtx, args: &[Bytes]) {
    let n = match stream_read(ctx, &args[1]) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => 0,
        Ok(Some(s)) => s.log.len(),
    };
    ctx.out.int(n as i64);
}

fn range_command(ctx: &mut ExecCtx, args: &[Bytes], rev: bool) {
    let (start_arg, end_arg) = if rev {
        (&args[3], &args[2])
    } else {
        (&args[2], &args[3])
    };
    let start = match parse_start(start_arg) {
        Ok(id) => id,
        Err(e) => return ctx.out.error(e),
    };
    let end = match parse_end(end_arg) {
        Ok(id) => id,
        Err(e) => return ctx.out.error(e),
    };
    let mut count: Option<usize> = None;
    let mut j = 4;
    while j < args.len() {
        if eq_ci(&args[j], "count") && j + 1 < args.len() {
            match parse_i64(&args[j + 1]) {
                Ok(n) => count = Some(n.max(0) as usize),
                Err(e) => return ctx.out.error(e),
            }
            j += 2;
        } else {
            return ctx.out.error(SYNTAX_ERR);
        }
    }
    let (found, out) = split_read(ctx, &args[1]);
    match found {
        Err(()) => out.error(WRONGTYPE),
        Ok(None) => out.array(0),
        Ok(Some(_)) if count == Some(0) => out.null_array(),
        Ok(Some(s)) => {
            let n = count.unwrap_or(0);
            if rev {
                put_entries(out, || s.log.range_rev(start, end), n);
            } else {
                put_entries(out, || s.log.range(start, end), n);
            }
        }
    }
}

/// XRANGE key start end [COUNT n]
pub fn xrange(ctx: &mut ExecCtx, args: &[Bytes]) {
    range_command(ctx, args, false);
}

/// XREVRANGE key end start [COUNT n]
pub fn xrevrange(ctx: &mut ExecCtx, args: &[Bytes]) {
    range_command(ctx, args, true);
}

/// XDEL key id [id ...]
pub fn xdel(ctx: &mut ExecCtx, args: &[Bytes]) {
    let key = &args[1];
    let deleted = {
        let s = match stream_mut(ctx, key) {
            Err(()) => return ctx.out.error(WRONGTYPE),
            Ok(None) => return ctx.out.int(0),
            Ok(Some(s)) => s,
        };
        let mut ids = Vec::with_capacity(args.len() - 2);
        for a in &args[2..] {
            match parse_strict_id(a) {
                Ok(id) => ids.push(id),
                Err(e) => return ctx.out.error(e),
            }
        }
        s.log.delete(&ids)
    };
    if deleted > 0 {
        ctx.modified(key);
        ctx.notify(b'x', "xdel", key);
    }
    ctx.out.int(deleted as i64);
}

// ---------------------------------------------------------------------------
// XREAD, XREADGROUP
// ---------------------------------------------------------------------------

/// Where a read starts in one stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// Entries with greater ids (XREAD; XREADGROUP's reads of a consumer's history).
    After(StreamId),
    /// XREADGROUP's `>`: entries the group has not delivered yet.
    New,
}

/// A parsed XREAD or XREADGROUP.
#[derive(Clone, Debug)]
pub struct ReadRequest {
    /// At most this many entries per stream; 0 for all.
    pub count: usize,
    /// BLOCK's timeout in ms (0: forever), when given.
    pub block_ms: Option<u64>,
    /// GROUP's group and consumer names.
    pub group: Option<(Bytes, Bytes)>,
    pub noack: bool,
    pub keys: Vec<Bytes>,
    /// The id arguments as given, one per key; see [`check_read_key`].
    pub ids: Vec<Bytes>,
}

/// Parses XREAD (`group` false) or XREADGROUP arguments, with Redis's errors.
pub fn parse_read(args: &[Bytes], group: bool, now_ms: u64) -> Result<ReadRequest, String> {
    let mut req = ReadRequest {
        count: 0,
        block_ms: None,
        group: None,
        noack: false,
        keys: Vec::new(),
        ids: Vec::new(),
    };
    let mut streams_at = 0;
    let mut i = 1;
    while i < args.len() {
        let more = args.len() - 1 - i;
        let o = &args[i][..];
        if eq_ci(o, "block") && more >= 1 {
            i += 1;
            let t = parse_i64(&args[i])
                .map_err(|_| "ERR timeout is not an integer or out of range".to_string())?;
            if t < 0 {
                return Err("ERR timeout is negative".into());
            }
            if t > 0 && t > i64::MAX - now_ms as i64 {
                return Err("ERR timeout is out of range".into());
            }
            req.block_ms = Some(t as u64);
        } else if eq_ci(o, "count") && more >= 1 {
            i += 1;
            req.count = parse_i64(&args[i]).map_err(str::to_string)?.max(0) as usize;
        } else if eq_ci(o, "streams") && more >= 1 {
            streams_at = i + 1;
            let n = args.len() - streams_at;
            if !n.is_multiple_of(2) {
                return Err(if group {
                    "ERR Unbalanced 'xreadgroup' list of streams: for each stream key an ID or '>' must be specified."
                } else {
                    "ERR Unbalanced 'xread' list of streams: for each stream key an ID or '$' must be specified."
                }
                .into());
            }
            req.keys = args[streams_at..streams_at + n / 2].to_vec();
            req.ids = args[streams_at + n / 2..].to_vec();
            break;
        } else if eq_ci(o, "group") && more >= 2 {
            if !group {
                return Err(
                    "ERR The GROUP option is only supported by XREADGROUP. You called XREAD instead."
                        .into(),
                );
            }
            req.group = Some((args[i + 1].clone(), args[i + 2].clone()));
            i += 2;
        } else if eq_ci(o, "noack") {
            if !group {
                return Err(
                    "ERR The NOACK option is only supported by XREADGROUP. You called XREAD instead."
                        .into(),
                );
            }
            req.noack = true;
        } else {
            return Err(SYNTAX_ERR.into());
        }
        i += 1;
    }
    if streams_at == 0 {
        return Err(SYNTAX_ERR.into());
    }
    if group && req.group.is_none() {
        return Err("ERR Missing GROUP option for XREADGROUP".into());
    }
    Ok(req)
}

/// Key positions of XREAD/XREADGROUP: the first half of what follows STREAMS.
fn read_keys(args: &[Bytes], group: bool) -> Vec<usize> {
    match parse_read(args, group, 0) {
        Err(_) => Vec::new(),
        Ok(req) => {
            let first = args.len() - 2 * req.keys.len();
            (first..first + req.keys.len()).collect()
        }
    }
}

pub fn xread_keys(args: &[Bytes]) -> Vec<usize> {
    read_keys(args, false)
}

pub fn xreadgroup_keys(args: &[Bytes]) -> Vec<usize> {
    read_keys(args, true)
}

/// What validating one key of a read needs to know about it.
#[derive(Clone, Copy, Debug)]
pub struct ReadKeyState {
    pub wrong_type: bool,
    pub exists: bool,
    pub has_group: bool,
    pub last_id: StreamId,
}

/// Looks at one key of a read (a read lookup, as Redis does).
pub fn read_key_state(ctx: &mut ExecCtx, key: &[u8], group: Option<&[u8]>) -> ReadKeyState {
    match stream_read(ctx, key) {
        Err(()) => ReadKeyState {
            wrong_type: true,
            exists: true,
            has_group: false,
            last_id: StreamId::MIN,
        },
        Ok(None) => ReadKeyState {
            wrong_type: false,
            exists: false,
            has_group: false,
            last_id: StreamId::MIN,
        },
        Ok(Some(s)) => ReadKeyState {
            wrong_type: false,
            exists: true,
            has_group: group.is_some_and(|g| s.groups.contains_key(g)),
            last_id: s.log.last_id,
        },
    }
}

/// Validates key `i` of a read in Redis's order (type, group, id) and resolves its id:
/// `$` becomes the stream's last id now, `>` is [`ReadFrom::New`].
pub fn check_read_key(
    req: &ReadRequest,
    i: usize,
    state: &ReadKeyState,
) -> Result<ReadFrom, Vec<u8>> {
    if state.wrong_type {
        return Err(WRONGTYPE.as_bytes().to_vec());
    }
    if let Some((g, _)) = &req.group {
        if !state.exists || !state.has_group {
            return Err(nogroup_key_group(
                &req.keys[i],
                g,
                " in XREADGROUP with GROUP option",
            ));
        }
    }
    let arg = c_str(&req.ids[i]);
    if arg == b"$" {
        if req.group.is_some() {
            return Err(b"ERR The $ ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just return an empty result set.".to_vec());
        }
        return Ok(ReadFrom::After(state.last_id));
    }
    if arg == b">" {
        if req.group.is_none() {
            return Err(b"ERR The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option.".to_vec());
        }
        return Ok(ReadFrom::New);
    }
    match parse_strict_id(&req.ids[i]) {
        Err(e) => Err(e.as_bytes().to_vec()),
        // Redis's `>` is the greatest id, so that id means the same.
        Ok(StreamId::MAX) if req.group.is_some() => Ok(ReadFrom::New),
        Ok(id) => Ok(ReadFrom::After(id)),
    }
}

/// XREAD's read of one stream: writes the array of entries after `after` (at most
/// `count`, 0 for all) and returns true, or writes nothing and returns false when there
/// is none (missing key, empty stream, nothing newer). Err on a key of another type.
pub fn read_entries_after(
    ctx: &mut ExecCtx,
    key: &[u8],
    after: StreamId,
    count: usize,
    out: &mut Reply,
) -> Result<bool, &'static str> {
    let s = match stream_read(ctx, key) {
        Err(()) => return Err(WRONGTYPE),
        Ok(None) => return Ok(false),
        Ok(Some(s)) => s,
    };
    match s.log.last_entry_id() {
        Some(last) if last > after => {
            let start = after.next().expect("below an existing id");
            put_entries(out, || s.log.range(start, StreamId::MAX), count);
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// The consumer of a group, created (with its keyspace event) when missing; its
/// seen-time becomes now.
fn touch_consumer(ctx: &mut ExecCtx, key: &[u8], group: &[u8], consumer: &[u8]) -> Option<u32> {
    let now = ctx.now_ms as i64;
    let (slot, created) = {
        let s = stream_mut(ctx, key).ok()??;
        let g = s.groups.get_mut(group)?;
        let (slot, created) = g.get_or_create(consumer, now);
        g.consumer_mut(slot).seen_time = now;
        (slot, created)
    };
    if created {
        ctx.notify(b'x', "xgroup-createconsumer", key);
        ctx.shard.dirty += 1;
    }
    Some(slot)
}

/// Delivers to consumer `slot` the entries the group has not seen, at most `count` (0:
/// all), moving the group's last id and read counter and, unless `noack`, adding them
/// to the PELs. Writes the entries array.
fn deliver_new(
    s: &mut Stream,
    group: &[u8],
    slot: u32,
    count: usize,
    noack: bool,
    now: i64,
    out: &mut Reply,
) -> Vec<StreamId> {
    let Stream { log, groups } = s;
    let g = groups.get_mut(group).expect("group checked");
    let mut body = Reply::new(out.resp3);
    let mut delivered = Vec::new();
    if let Some(start) = g.last_id.next() {
        for e in log.range(start, StreamId::MAX) {
            if count > 0 && delivered.len() == count {
                break;
            }
            put_entry(&mut body, &e);
            delivered.push(e.id);
        }
    }
    for id in &delivered {
        let id = *id;
        if id > g.last_id {
            if g.entries_read != UNKNOWN_READ
                && g.last_id >= log.first_id
                && !log.has_tombstones_from(g.last_id)
            {
                g.entries_read += 1;
            } else if log.entries_added > 0 {
                g.entries_read = log.entries_read_at(id);
            }
            g.last_id = id;
        }
        if !noack {
            g.assign(id, slot, |_| (now, 1));
            g.consumer_mut(slot).active_time = now;
        }
    }
    out.array(delivered.len());
    out.raw(&body.buf);
    delivered
}

/// XREADGROUP's `>` read of one stream for `consumer` (created when missing): writes the
/// array of entries delivered and returns true, or writes nothing and returns false when
/// the group has seen every entry. Err with the reply error when the key has another
/// type or the key or group is gone.
pub fn read_group_new(
    ctx: &mut ExecCtx,
    key: &[u8],
    group: &[u8],
    consumer: &[u8],
    count: usize,
    noack: bool,
    out: &mut Reply,
) -> Result<bool, Vec<u8>> {
    let st = read_key_state(ctx, key, Some(group));
    if st.wrong_type {
        return Err(WRONGTYPE.as_bytes().to_vec());
    }
    if !st.has_group {
        return Err(nogroup_key_group(
            key,
            group,
            " in XREADGROUP with GROUP option",
        ));
    }
    let slot = touch_consumer(ctx, key, group, consumer).expect("group checked");
    serve_group_new(ctx, key, group, slot, count, noack, out)
}

fn serve_group_new(
    ctx: &mut ExecCtx,
    key: &[u8],
    group: &[u8],
    slot: u32,
    count: usize,
    noack: bool,
    out: &mut Reply,
) -> Result<bool, Vec<u8>> {
    let now = ctx.now_ms as i64;
    let logging = ctx.shard.aof_on();
    let s = match stream_read(ctx, key) {
        Ok(Some(s)) => s,
        _ => {
            return Err(nogroup_key_group(
                key,
                group,
                " in XREADGROUP with GROUP option",
            ))
        }
    };
    let group_last = match s.groups.get(group) {
        Some(g) => g.last_id,
        None => {
            return Err(nogroup_key_group(
                key,
                group,
                " in XREADGROUP with GROUP option",
            ))
        }
    };
    match s.log.last_entry_id() {
        Some(last) if last > group_last => {
            let delivered = deliver_new(s, group, slot, count, noack, now, out);
            let effects = logging.then(|| {
                let g = s.groups.get(group).expect("group checked");
                delivery_effects(key, group, g.consumer_name(slot), &delivered, g, noack)
            });
            for argv in effects.into_iter().flatten() {
                ctx.log_as(argv);
            }
            // The group's position and pending entries changed.
            ctx.shard.dirty += 1;
            // Deliveries to a group are a stream queue's pops; an entry's ID holds the
            // time it was added.
            let mut waits = crate::observe::Waits::default();
            for id in &delivered {
                waits.popped(Some(id.ms));
            }
            ctx.shard.queues.popped(ctx.db, key, &waits, ctx.now_ms);
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// What a `>` read changed, as commands that replay it exactly (Redis 7.2's form): each
/// delivery an XCLAIM with its time, then the group's position with its read counter.
fn delivery_effects(
    key: &[u8],
    group: &[u8],
    consumer: &[u8],
    delivered: &[StreamId],
    g: &Group,
    noack: bool,
) -> Vec<Vec<Bytes>> {
    let mut out = Vec::with_capacity(delivered.len() + 2);
    if noack {
        let b = Bytes::copy_from_slice;
        out.push(vec![
            b(b"XGROUP"),
            b(b"CREATECONSUMER"),
            b(key),
            b(group),
            b(consumer),
        ]);
    } else {
        for &id in delivered {
            out.push(claim_effect(key, group, consumer, id, g));
        }
    }
    out.push(setid_effect(key, group, g));
    out
}

/// A consumer's history: its pending entries after `after`; deleted entries come as the
/// id with a null. Each one found counts as delivered again.
fn read_history(
    s: &mut Stream,
    group: &[u8],
    slot: u32,
    after: StreamId,
    count: usize,
    now: i64,
    out: &mut Reply,
) {
    let Stream { log, groups } = s;
    let g = groups.get_mut(group).expect("group checked");
    let ids: Vec<StreamId> = match after.next() {
        None => Vec::new(),
        Some(start) => {
            let pel = g.consumer(slot).pel.range(start..);
            if count > 0 {
                pel.take(count).copied().collect()
            } else {
                pel.copied().collect()
            }
        }
    };
    out.array(ids.len());
    for id in ids {
        match log.get(id) {
            Some(e) => {
                put_entry(out, &e);
                if let Some(n) = g.pel.get_mut(&id) {
                    n.delivery_time = now;
                    n.delivery_count += 1;
                }
            }
            None => {
                out.array(2);
                put_id(out, id);
                out.null_array();
            }
        }
    }
}

/// One stream of a read, with everything needed to serve it on its shard.
#[derive(Clone, Debug)]
struct KeyRead {
    key: Bytes,
    group: Option<(Bytes, Bytes)>,
    count: usize,
    noack: bool,
    from: ReadFrom,
}

/// Serves one stream of a validated read: the entries array, or None when this stream
/// adds nothing to the reply.
fn serve_key(ctx: &mut ExecCtx, r: &KeyRead) -> Option<Vec<u8>> {
    let mut out = Reply::new(ctx.out.resp3);
    match &r.group {
        None => {
            let ReadFrom::After(after) = r.from else {
                return None;
            };
            match read_entries_after(ctx, &r.key, after, r.count, &mut out) {
                Ok(true) => Some(out.buf.to_vec()),
                _ => None,
            }
        }
        Some((group, consumer)) => match r.from {
            ReadFrom::After(after) => {
                let slot = touch_consumer(ctx, &r.key, group, consumer)?;
                let now = ctx.now_ms as i64;
                let s = stream_read(ctx, &r.key).ok()??;
                read_history(s, group, slot, after, r.count, now, &mut out);
                Some(out.buf.to_vec())
            }
            ReadFrom::New => {
                match read_group_new(ctx, &r.key, group, consumer, r.count, r.noack, &mut out) {
                    Ok(true) => Some(out.buf.to_vec()),
                    _ => None,
                }
            }
        },
    }
}

/// Writes a read's reply from the parts of the streams that had something: a map of
/// key to entries (RESP3) or an array of [key, entries] pairs (RESP2).
pub fn write_read_reply(out: &mut Reply, parts: &[(Bytes, Vec<u8>)]) {
    if out.resp3 {
        out.map(parts.len());
    } else {
        out.array(parts.len());
    }
    for (key, entries) in parts {
        if !out.resp3 {
            out.array(2);
        }
        out.bulk(key);
        out.raw(entries);
    }
}

/// The reply when no stream had anything (outside MULTI, a BLOCK read then waits: see
/// `crate::blocking`).
fn write_nothing(out: &mut Reply) {
    out.null_array();
}

/// How XREAD/XREADGROUP block: only with BLOCK, and only outside MULTI.
fn read_call(args: &[Bytes], group: bool) -> Result<Option<crate::blocking::BlockCall>, String> {
    let req = parse_read(args, group, unix_ms())?;
    let Some(ms) = req.block_ms else {
        return Ok(None);
    };
    Ok(Some(crate::blocking::BlockCall {
        keys: req.keys,
        keys_at: None,
        op: crate::blocking::BlockOp::XRead {
            reads: Vec::new(),
            group: req.group,
            count: req.count,
            noack: req.noack,
        },
        timeout: (ms > 0).then(|| std::time::Duration::from_millis(ms)),
    }))
}

pub fn xread_call(args: &[Bytes]) -> Result<Option<crate::blocking::BlockCall>, String> {
    read_call(args, false)
}

pub fn xreadgroup_call(args: &[Bytes]) -> Result<Option<crate::blocking::BlockCall>, String> {
    read_call(args, true)
}

/// Where a blocked read of one stream starts, from its id argument (`$` already replaced
/// by an explicit id).
pub fn blocked_read_from(arg: &[u8], group: bool) -> Option<ReadFrom> {
    if group && c_str(arg) == b">" {
        return Some(ReadFrom::New);
    }
    match parse_strict_id(arg) {
        Ok(StreamId::MAX) if group => Some(ReadFrom::New),
        Ok(id) => Some(ReadFrom::After(id)),
        Err(_) => None,
    }
}

/// The last id of the stream at `key` (`$` of XREAD), the smallest id when missing.
pub fn last_id(ctx: &mut ExecCtx, key: &[u8]) -> StreamId {
    read_key_state(ctx, key, None).last_id
}

/// Whether a blocked read of `key` has something to take now: new entries, or (for a
/// group) an error to report because the key, its type or the group changed.
pub fn blocked_read_ready(
    ctx: &mut ExecCtx,
    key: &[u8],
    from: ReadFrom,
    group: Option<&[u8]>,
) -> bool {
    match group {
        None => {
            let ReadFrom::After(after) = from else {
                return false;
            };
            matches!(stream_read(ctx, key), Ok(Some(s)) if s.log.last_entry_id().is_some_and(|l| l > after))
        }
        Some(g) => match stream_read(ctx, key) {
            Ok(Some(s)) => match s.groups.get(g) {
                None => true,
                Some(grp) => s.log.last_entry_id().is_some_and(|l| l > grp.last_id),
            },
            _ => true,
        },
    }
}

/// Serves a blocked read of one stream: the reply (entries of that one stream, or the
/// error a woken XREADGROUP gets).
pub fn serve_blocked_read(
    ctx: &mut ExecCtx,
    key: &Bytes,
    from: ReadFrom,
    group: Option<&(Bytes, Bytes)>,
    count: usize,
    noack: bool,
    resp3: bool,
) -> Reply {
    let mut entries = Reply::new(resp3);
    let mut out = Reply::new(resp3);
    let found = match (group, from) {
        (None, ReadFrom::After(after)) => read_entries_after(ctx, key, after, count, &mut entries)
            .map_err(|e| e.as_bytes().to_vec()),
        (Some((g, c)), _) => read_group_new(ctx, key, g, c, count, noack, &mut entries),
        (None, ReadFrom::New) => Ok(false),
    };
    match found {
        Ok(true) => write_read_reply(&mut out, &[(key.clone(), entries.buf.to_vec())]),
        Ok(false) => out.null_array(),
        Err(e) => out.error_bytes(&e),
    }
    out
}

fn read_command(ctx: &mut ExecCtx, args: &[Bytes], group: bool) {
    let req = match parse_read(args, group, ctx.now_ms) {
        Ok(r) => r,
        Err(e) => return ctx.out.error(&e),
    };
    let gname = req.group.as_ref().map(|g| g.0.clone());
    let mut reads = Vec::with_capacity(req.keys.len());
    for i in 0..req.keys.len() {
        let st = read_key_state(ctx, &req.keys[i], gname.as_deref());
        match check_read_key(&req, i, &st) {
            Ok(from) => reads.push(KeyRead {
                key: req.keys[i].clone(),
                group: req.group.clone(),
                count: req.count,
                noack: req.noack,
                from,
            }),
            Err(e) => return ctx.out.error_bytes(&e),
        }
    }
    let mut parts = Vec::new();
    for r in &reads {
        if let Some(p) = serve_key(ctx, r) {
            parts.push((r.key.clone(), p));
        }
    }
    if parts.is_empty() {
        write_nothing(ctx.out);
    } else {
        write_read_reply(ctx.out, &parts);
    }
}

/// XREAD [COUNT n] [BLOCK ms] STREAMS key ... id ...
pub fn xread(ctx: &mut ExecCtx, args: &[Bytes]) {
    read_command(ctx, args, false);
}

/// XREADGROUP GROUP group consumer [COUNT n] [BLOCK ms] [NOACK] STREAMS key ... id ...
pub fn xreadgroup(ctx: &mut ExecCtx, args: &[Bytes]) {
    read_command(ctx, args, true);
}

/// The cross-shard form: validates every key on its shard in order, then serves each.
async fn read_cross(sess: &mut Session, args: Vec<Bytes>, tx: &Tx, group: bool) {
    let req = match parse_read(&args, group, unix_ms()) {
        Ok(r) => r,
        Err(e) => return sess.out.error(&e),
    };
    let (db, resp3) = (sess.db, sess.out.resp3);
    let gname = req.group.as_ref().map(|g| g.0.clone());
    let mut reads = Vec::with_capacity(req.keys.len());
    for i in 0..req.keys.len() {
        let key = req.keys[i].clone();
        let g = gname.clone();
        let shard = sess.worker.shard_of(&key);
        let st = tx
            .run(shard, move |sh| {
                on_shard(sh, db, resp3, |ctx| read_key_state(ctx, &key, g.as_deref())).0
            })
            .await;
        match check_read_key(&req, i, &st) {
            Ok(from) => reads.push(KeyRead {
                key: req.keys[i].clone(),
                group: req.group.clone(),
                count: req.count,
                noack: req.noack,
                from,
            }),
            Err(e) => return sess.out.error_bytes(&e),
        }
    }
    let mut parts = Vec::new();
    for r in reads {
        let shard = sess.worker.shard_of(&r.key);
        let key = r.key.clone();
        let part = tx
            .run(shard, move |sh| {
                on_shard(sh, db, resp3, |ctx| serve_key(ctx, &r)).0
            })
            .await;
        if let Some(p) = part {
            parts.push((key, p));
        }
    }
    if parts.is_empty() {
        write_nothing(&mut sess.out);
    } else {
        write_read_reply(&mut sess.out, &parts);
    }
}

cross_handler!(xread_cross, |sess, args, tx| {
    read_cross(sess, args, tx, false).await
});

cross_handler!(xreadgroup_cross, |sess, args, tx| {
    read_cross(sess, args, tx, true).await
});

// ---------------------------------------------------------------------------
// XGROUP
// ---------------------------------------------------------------------------

pub const XGROUP_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("create", -5, "write denyoom"),
    ("createconsumer", 5, "write denyoom"),
    ("delconsumer", 5, "write"),
    ("destroy", 4, "write"),
    ("help", 2, "loading stale"),
    ("setid", -5, "write"),
];

const XGROUP_HELP: &[&str] = &[
    "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CREATE <key> <groupname> <id|$> [option]",
    "    Creates a consumer group that delivers entries after <id> ($: the current last).",
    "    Options are:",
    "    * MKSTREAM",
    "      Creates an empty stream when the key does not exist.",
    "    * ENTRIESREAD entries_read",
    "      Sets how many entries the group has read, the base of its lag.",
    "CREATECONSUMER <key> <groupname> <consumer>",
    "    Adds a consumer to the group.",
    "DELCONSUMER <key> <groupname> <consumer>",
    "    Removes a consumer together with its pending entries.",
    "DESTROY <key> <groupname>",
    "    Removes the group.",
    "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
    "    Moves the group's last delivered id, and sets its read counter.",
    "HELP",
    "    Print this help.",
];

/// XGROUP and XINFO: the key is the third argument, except for HELP.
pub fn container_keys(args: &[Bytes]) -> Vec<usize> {
    if args.len() > 2 && !eq_ci(&args[1], "help") {
        vec![2]
    } else {
        Vec::new()
    }
}

fn help(out: &mut Reply, lines: &[&str]) {
    out.array(lines.len());
    for l in lines {
        out.simple(l);
    }
}

pub fn xgroup(ctx: &mut ExecCtx, args: &[Bytes]) {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    if sub == "help" {
        return help(ctx.out, XGROUP_HELP);
    }
    let (key, gname) = (&args[2], &args[3][..]);
    let create = sub == "create";
    let setid = sub == "setid";
    let mut mkstream = false;
    let mut entries_read = UNKNOWN_READ;
    let mut i = 5;
    while i < args.len() {
        if create && eq_ci(&args[i], "mkstream") {
            mkstream = true;
            i += 1;
        } else if (create || setid) && eq_ci(&args[i], "entriesread") && i + 1 < args.len() {
            match parse_i64(&args[i + 1]) {
                Err(e) => return ctx.out.error(e),
                Ok(n) if n < 0 && n != UNKNOWN_READ => {
                    return ctx
                        .out
                        .error("ERR value for ENTRIESREAD must be positive or -1")
                }
                Ok(n) => entries_read = n,
            }
            i += 2;
        } else {
            return ctx
                .out
                .error_bytes(&subcommand_syntax_error(&args[1], "XGROUP"));
        }
    }
    let now = ctx.now_ms as i64;
    let (exists, has_group, last_id) = match stream_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => (false, false, StreamId::MIN),
        Ok(Some(s)) => (true, s.groups.contains_key(gname), s.log.last_id),
    };
    if !(exists || create && mkstream) {
        return ctx.out.error(NEED_KEY);
    }
    if !has_group && matches!(sub.as_str(), "setid" | "createconsumer" | "delconsumer") {
        return ctx.out.error_bytes(&nogroup_group_key(gname, key));
    }
    let argc = args.len();
    match sub.as_str() {
        "create" if argc <= 8 => {
            let id = if c_str(&args[4]) == b"$" {
                last_id
            } else {
                match parse_strict_id(&args[4]) {
                    Ok(id) => id,
                    Err(e) => return ctx.out.error(e),
                }
            };
            if !exists {
                ctx.set(key, Value::Stream(Box::default()), 0);
            }
            let Ok(Some(s)) = stream_mut(ctx, key) else {
                unreachable!("stream just checked or created")
            };
            if s.groups.contains_key(gname) {
                return ctx
                    .out
                    .error("BUSYGROUP Consumer Group name already exists");
            }
            s.groups.insert(gname.into(), Group::new(id, entries_read));
            ctx.out.ok();
            ctx.notify(b'x', "xgroup-create", key);
            ctx.shard.dirty += 1;
        }
        "setid" if argc == 5 || argc == 7 => {
            let id = if c_str(&args[4]) == b"$" {
                last_id
            } else {
                match parse_id(&args[4], 0) {
                    Ok(id) => id,
                    Err(e) => return ctx.out.error(e),
                }
            };
            if let Ok(Some(s)) = stream_mut(ctx, key) {
                let g = s.groups.get_mut(gname).expect("group checked");
                g.last_id = id;
                g.entries_read = entries_read;
            }
            ctx.out.ok();
            ctx.notify(b'x', "xgroup-setid", key);
            ctx.shard.dirty += 1;
        }
        "destroy" => {
            let removed = match stream_mut(ctx, key) {
                Ok(Some(s)) => s.groups.remove(gname).is_some(),
                _ => false,
            };
            if removed {
                ctx.out.int(1);
                ctx.notify(b'x', "xgroup-destroy", key);
                ctx.shard.dirty += 1;
                // Consumers blocked on the group must learn it is gone.
                ctx.key_ready(key);
            } else {
                ctx.out.int(0);
            }
        }
        "createconsumer" => {
            let created = match stream_mut(ctx, key) {
                Ok(Some(s)) => {
                    let g = s.groups.get_mut(gname).expect("group checked");
                    g.get_or_create(&args[4], now).1
                }
                _ => false,
            };
            ctx.out.int(created as i64);
            if created {
                ctx.notify(b'x', "xgroup-createconsumer", key);
                ctx.shard.dirty += 1;
            }
        }
        "delconsumer" => {
            let pending = match stream_mut(ctx, key) {
                Ok(Some(s)) => s
                    .groups
                    .get_mut(gname)
                    .expect("group checked")
                    .delete_consumer(&args[4]),
                _ => None,
            };
            ctx.out.int(pending.unwrap_or(0) as i64);
            if pending.is_some() {
                ctx.notify(b'x', "xgroup-delconsumer", key);
                ctx.shard.dirty += 1;
            }
        }
        _ => ctx
            .out
            .error_bytes(&subcommand_syntax_error(&args[1], "XGROUP")),
    }
}

// ---------------------------------------------------------------------------
// XACK, XPENDING
// ---------------------------------------------------------------------------

/// XACK key group id [id ...]
pub fn xack(ctx: &mut ExecCtx, args: &[Bytes]) {
    let s = match stream_read(ctx, &args[1]) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(s) => s,
    };
    let Some(g) = s.and_then(|s| s.groups.get_mut(&args[2][..])) else {
        return ctx.out.int(0);
    };
    let mut ids = Vec::with_capacity(args.len() - 3);
    for a in &args[3..] {
        match parse_strict_id(a) {
            Ok(id) => ids.push(id),
            Err(e) => return ctx.out.error(e),
        }
    }
    let acked = ids.into_iter().filter(|&id| g.ack(id)).count();
    ctx.shard.dirty += acked as u64;
    ctx.out.int(acked as i64);
}

/// XPENDING key group [[IDLE min-idle] start end count [consumer]]
pub fn xpending(ctx: &mut ExecCtx, args: &[Bytes]) {
    let argc = args.len();
    if argc != 3 && !(6..=9).contains(&argc) {
        return ctx.out.error(SYNTAX_ERR);
    }
    let mut min_idle = 0i64;
    let mut range = None;
    let mut consumer = None;
    if argc >= 6 {
        let mut at = 3;
        if eq_ci(&args[3], "idle") {
            match parse_i64(&args[4]) {
                Ok(v) => min_idle = v,
                Err(e) => return ctx.out.error(e),
            }
            if argc < 8 {
                return ctx.out.error(SYNTAX_ERR);
            }
            at += 2;
        }
        let count = match parse_i64(&args[at + 2]) {
            Ok(v) => v.max(0) as usize,
            Err(e) => return ctx.out.error(e),
        };
        let start = match parse_start(&args[at]) {
            Ok(id) => id,
            Err(e) => return ctx.out.error(e),
        };
        let end = match parse_end(&args[at + 1]) {
            Ok(id) => id,
            Err(e) => return ctx.out.error(e),
        };
        range = Some((start, end, count));
        consumer = args.get(at + 3).cloned();
    }
    let now = ctx.now_ms as i64;
    let resp3 = ctx.out.resp3;
    let (key, gname) = (&args[1], &args[2]);
    let mut out = Reply::new(resp3);
    {
        let s = match stream_read(ctx, key) {
            Err(()) => return ctx.out.error(WRONGTYPE),
            Ok(s) => s,
        };
        let Some(g) = s.and_then(|s| s.groups.get(&gname[..])) else {
            return ctx.out.error_bytes(&nogroup_key_group(key, gname, ""));
        };
        match range {
            None => {
                out.array(4);
                out.int(g.pel.len() as i64);
                match (g.pel.keys().next(), g.pel.keys().next_back()) {
                    (Some(&first), Some(&last)) => {
                        put_id(&mut out, first);
                        put_id(&mut out, last);
                        let owners: Vec<_> = g.consumers().filter(|c| !c.pel.is_empty()).collect();
                        out.array(owners.len());
                        for c in owners {
                            out.array(2);
                            out.bulk(&c.name);
                            out.bulk(c.pel.len().to_string().as_bytes());
                        }
                    }
                    _ => {
                        out.null();
                        out.null();
                        out.null_array();
                    }
                }
            }
            Some((start, end, count)) => {
                let slot = match &consumer {
                    None => None,
                    Some(name) => match g.find(name) {
                        Some(slot) => Some(slot),
                        None => {
                            out.array(0);
                            ctx.out.raw(&out.buf);
                            return;
                        }
                    },
                };
                let mut body = Reply::new(resp3);
                let mut n = 0;
                let ids: Box<dyn Iterator<Item = StreamId>> = match slot {
                    _ if start > end => Box::new(std::iter::empty()),
                    Some(slot) => Box::new(g.consumer(slot).pel.range(start..=end).copied()),
                    None => Box::new(g.pel.range(start..=end).map(|(id, _)| *id)),
                };
                for id in ids {
                    if n == count {
                        break;
                    }
                    let nack = &g.pel[&id];
                    if min_idle != 0 && now - nack.delivery_time < min_idle {
                        continue;
                    }
                    n += 1;
                    body.array(4);
                    put_id(&mut body, id);
                    body.bulk(g.consumer_name(nack.consumer));
                    body.int((now - nack.delivery_time).max(0));
                    body.int(nack.delivery_count as i64);
                }
                out.array(n);
                out.raw(&body.buf);
            }
        }
    }
    ctx.out.raw(&out.buf);
}

// ---------------------------------------------------------------------------
// XCLAIM, XAUTOCLAIM
// ---------------------------------------------------------------------------

/// XCLAIM key group consumer min-idle-time id [id ...] [IDLE ms] [TIME ms] [RETRYCOUNT n]
/// [FORCE] [JUSTID] [LASTID id]
pub fn xclaim(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (key, gname, cname) = (&args[1], &args[2][..], &args[3][..]);
    match stream_read(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(Some(s)) if s.groups.contains_key(gname) => {}
        Ok(_) => return ctx.out.error_bytes(&nogroup_key_group(key, gname, "")),
    }
    let min_idle = match parse_i64(&args[4]) {
        Ok(v) => v.max(0),
        Err(_) => {
            return ctx
                .out
                .error("ERR Invalid min-idle-time argument for XCLAIM")
        }
    };
    let mut ids = Vec::new();
    let mut j = 5;
    while j < args.len() {
        match parse_strict_id(&args[j]) {
            Ok(id) => ids.push(id),
            Err(_) => break,
        }
        j += 1;
    }
    let now = ctx.now_ms as i64;
    let (mut force, mut justid) = (false, false);
    let mut retrycount: i64 = -1;
    let mut delivery: i64 = -1;
    let mut last_id = StreamId::MIN;
    while j < args.len() {
        let more = args.len() - 1 - j;
        let opt = &args[j][..];
        let int_opt = |v: &Bytes, what: &str| {
            parse_i64(v).map_err(|_| format!("ERR Invalid {what} option argument for XCLAIM"))
        };
        if eq_ci(opt, "force") {
            force = true;
        } else if eq_ci(opt, "justid") {
            justid = true;
        } else if eq_ci(opt, "idle") && more >= 1 {
            j += 1;
            match int_opt(&args[j], "IDLE") {
                Ok(v) => delivery = now.wrapping_sub(v),
                Err(e) => return ctx.out.error(&e),
            }
        } else if eq_ci(opt, "time") && more >= 1 {
            j += 1;
            match int_opt(&args[j], "TIME") {
                Ok(v) => delivery = v,
                Err(e) => return ctx.out.error(&e),
            }
        } else if eq_ci(opt, "retrycount") && more >= 1 {
            j += 1;
            match int_opt(&args[j], "RETRYCOUNT") {
                Ok(v) => retrycount = v,
                Err(e) => return ctx.out.error(&e),
            }
        } else if eq_ci(opt, "lastid") && more >= 1 {
            j += 1;
            match parse_strict_id(&args[j]) {
                Ok(id) => last_id = id,
                Err(e) => return ctx.out.error(e),
            }
        } else {
            let mut m = b"ERR Unrecognized XCLAIM option '".to_vec();
            m.extend_from_slice(msg_arg(opt));
            m.push(b'\'');
            return ctx.out.error_bytes(&m);
        }
        j += 1;
    }
    // A bogus time (negative, or in the future) means now, as in Redis.
    if delivery < 0 || delivery > now {
        delivery = now;
    }
    let Some(slot) = touch_consumer(ctx, key, gname, cname) else {
        return ctx.out.error_bytes(&nogroup_key_group(key, gname, ""));
    };
    let resp3 = ctx.out.resp3;
    let mut body = Reply::new(resp3);
    let mut n = 0;
    let logging = ctx.shard.aof_on();
    let mut effects = Vec::new();
    if let Ok(Some(s)) = stream_mut(ctx, key) {
        let Stream { log, groups } = s;
        let g = groups.get_mut(gname).expect("group checked");
        if last_id > g.last_id {
            g.last_id = last_id;
            if logging {
                effects.push(setid_effect(key, gname, g));
            }
        }
        for id in ids {
            let pending = g.pel.get(&id).copied();
            let Some(entry) = log.get(id) else {
                // The entry is gone: its pending record goes too.
                if pending.is_some() {
                    g.ack(id);
                    if logging {
                        effects.push(ack_effect(key, gname, id));
                    }
                }
                continue;
            };
            if pending.is_none() && !force {
                continue;
            }
            if let Some(p) = pending {
                if min_idle > 0 && now - p.delivery_time < min_idle {
                    continue;
                }
            }
            g.assign(id, slot, |old| {
                let count = match old {
                    _ if retrycount >= 0 => retrycount as u64,
                    Some(o) if !justid => o.delivery_count + 1,
                    Some(o) => o.delivery_count,
                    // A record FORCE creates starts at one delivery, like a fresh read.
                    None if justid => 1,
                    None => 2,
                };
                (delivery, count)
            });
            g.consumer_mut(slot).active_time = now;
            if logging {
                effects.push(claim_effect(key, gname, cname, id, g));
            }
            if justid {
                put_id(&mut body, id);
            } else {
                put_entry(&mut body, &entry);
            }
            n += 1;
        }
    }
    if logging {
        // Which entries were idle long enough depends on the moment: log what happened.
        ctx.effect = Some(effects);
    }
    // Claims (and the seen time of the consumer) change the group.
    ctx.shard.dirty += 1;
    ctx.out.array(n);
    ctx.out.raw(&body.buf);
}

/// A claim as the AOF logs it: the entry's owner, delivery time and count, exactly.
fn claim_effect(key: &[u8], group: &[u8], consumer: &[u8], id: StreamId, g: &Group) -> Vec<Bytes> {
    let p = g.pel[&id];
    let b = Bytes::copy_from_slice;
    vec![
        b(b"XCLAIM"),
        b(key),
        b(group),
        b(consumer),
        b(b"0"),
        Bytes::from(id.to_string()),
        b(b"TIME"),
        Bytes::from(p.delivery_time.to_string()),
        b(b"RETRYCOUNT"),
        Bytes::from(p.delivery_count.to_string()),
        b(b"FORCE"),
        b(b"JUSTID"),
        b(b"LASTID"),
        Bytes::from(g.last_id.to_string()),
    ]
}

/// A pending entry whose stream entry is gone, dropped from the group.
fn ack_effect(key: &[u8], group: &[u8], id: StreamId) -> Vec<Bytes> {
    let b = Bytes::copy_from_slice;
    vec![b(b"XACK"), b(key), b(group), Bytes::from(id.to_string())]
}

fn setid_effect(key: &[u8], group: &[u8], g: &Group) -> Vec<Bytes> {
    let b = Bytes::copy_from_slice;
    vec![
        b(b"XGROUP"),
        b(b"SETID"),
        b(key),
        b(group),
        Bytes::from(g.last_id.to_string()),
        b(b"ENTRIESREAD"),
        Bytes::from(g.entries_read.to_string()),
    ]
}

/// The largest XAUTOCLAIM COUNT whose scratch array (16 bytes an id) Redis could
/// allocate: a terabyte.
const AUTOCLAIM_ALLOC_MAX: u64 = 1 << 36;

/// XAUTOCLAIM key group consumer min-idle-time start [COUNT count] [JUSTID]
pub fn xautoclaim(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (key, gname, cname) = (&args[1], &args[2][..], &args[3][..]);
    let min_idle = match parse_i64(&args[4]) {
        Ok(v) => v.max(0),
        Err(_) => {
            return ctx
                .out
                .error("ERR Invalid min-idle-time argument for XAUTOCLAIM")
        }
    };
    let start = match parse_start(&args[5]) {
        Ok(id) => id,
        Err(e) => return ctx.out.error(e),
    };
    let mut count: u64 = 100;
    let mut justid = false;
    let mut j = 6;
    while j < args.len() {
        let more = args.len() - 1 - j;
        if eq_ci(&args[j], "count") && more >= 1 {
            // Redis bounds COUNT so that its scratch arrays cannot overflow.
            let max = (i64::MAX / 16) as u64;
            match parse_i64(&args[j + 1]) {
                Ok(v) if v >= 1 && v as u64 <= max => count = v as u64,
                _ => return ctx.out.error("ERR COUNT must be > 0"),
            }
            j += 1;
        } else if eq_ci(&args[j], "justid") {
            justid = true;
        } else {
            return ctx.out.error(SYNTAX_ERR);
        }
        j += 1;
    }
    match stream_read(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(Some(s)) if s.groups.contains_key(gname) => {}
        Ok(_) => return ctx.out.error_bytes(&nogroup_key_group(key, gname, "")),
    }
    // Redis allocates COUNT ids up front; a COUNT no allocator can satisfy fails there.
    if count > AUTOCLAIM_ALLOC_MAX {
        return ctx
            .out
            .error("ERR Insufficient memory, failed allocating transient memory, COUNT too high.");
    }
    let Some(slot) = touch_consumer(ctx, key, gname, cname) else {
        return ctx.out.error_bytes(&nogroup_key_group(key, gname, ""));
    };
    let now = ctx.now_ms as i64;
    let resp3 = ctx.out.resp3;
    let mut body = Reply::new(resp3);
    let mut claimed = 0;
    let mut deleted = Vec::new();
    let mut cursor = StreamId::MIN;
    let logging = ctx.shard.aof_on();
    let mut effects = Vec::new();
    if let Ok(Some(s)) = stream_mut(ctx, key) {
        let Stream { log, groups } = s;
        let g = groups.get_mut(gname).expect("group checked");
        let attempts = count.saturating_mul(10);
        let candidates: Vec<StreamId> = g
            .pel
            .range(start..)
            .take(attempts.min(usize::MAX as u64) as usize)
            .map(|(id, _)| *id)
            .collect();
        let mut examined = 0;
        let mut last = None;
        for id in candidates.iter().copied() {
            if count == 0 {
                break;
            }
            examined += 1;
            last = Some(id);
            let Some(entry) = log.get(id) else {
                g.ack(id);
                if logging {
                    effects.push(ack_effect(key, gname, id));
                }
                deleted.push(id);
                count -= 1;
                continue;
            };
            let nack = g.pel[&id];
            if min_idle > 0 && now - nack.delivery_time < min_idle {
                continue;
            }
            g.assign(id, slot, |old| {
                let c = old.map_or(0, |o| o.delivery_count);
                (now, if justid { c } else { c + 1 })
            });
            g.consumer_mut(slot).active_time = now;
            if logging {
                effects.push(claim_effect(key, gname, cname, id, g));
            }
            if justid {
                put_id(&mut body, id);
            } else {
                put_entry(&mut body, &entry);
            }
            claimed += 1;
            count -= 1;
        }
        // The cursor is the pending entry after the last one looked at, unless the scan
        // ran off the end of the list.
        let ran_out = examined == candidates.len() && (candidates.len() as u64) < attempts;
        if !ran_out {
            if let Some(last) = last {
                cursor = g
                    .pel
                    .range((std::ops::Bound::Excluded(last), std::ops::Bound::Unbounded))
                    .next()
                    .map_or(StreamId::MIN, |(id, _)| *id);
            }
        }
    }
    if claimed > 0 || !deleted.is_empty() {
        ctx.shard.dirty += 1;
    }
    if logging {
        ctx.effect = Some(effects);
    }
    let out = &mut *ctx.out;
    out.array(3);
    put_id(out, cursor);
    out.array(claimed);
    out.raw(&body.buf);
    out.array(deleted.len());
    for id in deleted {
        put_id(out, id);
    }
}

// ---------------------------------------------------------------------------
// XSETID
// ---------------------------------------------------------------------------

/// XSETID key last-id [ENTRIESADDED entries-added] [MAXDELETEDID max-deleted-id]
pub fn xsetid(ctx: &mut ExecCtx, args: &[Bytes]) {
    let id = match parse_strict_id(&args[2]) {
        Ok(id) => id,
        Err(e) => return ctx.out.error(e),
    };
    let mut entries_added: Option<u64> = None;
    let mut max_deleted = StreamId::MIN;
    let mut i = 3;
    while i < args.len() {
        let more = args.len() - 1 - i;
        if eq_ci(&args[i], "entriesadded") && more >= 1 {
            match parse_i64(&args[i + 1]) {
                Err(e) => return ctx.out.error(e),
                Ok(n) if n < 0 => return ctx.out.error("ERR entries_added must be positive"),
                Ok(n) => entries_added = Some(n as u64),
            }
        } else if eq_ci(&args[i], "maxdeletedid") && more >= 1 {
            match parse_strict_id(&args[i + 1]) {
                Err(e) => return ctx.out.error(e),
                Ok(m) if id < m => {
                    return ctx.out.error(
                        "ERR The ID specified in XSETID is smaller than the provided max_deleted_entry_id",
                    )
                }
                Ok(m) => max_deleted = m,
            }
        } else {
            return ctx.out.error(SYNTAX_ERR);
        }
        i += 2;
    }
    let key = &args[1];
    {
        let s = match stream_mut(ctx, key) {
            Err(()) => return ctx.out.error(WRONGTYPE),
            Ok(None) => return ctx.out.error(NO_SUCH_KEY),
            Ok(Some(s)) => s,
        };
        let log = &mut s.log;
        if id < log.max_deleted {
            return ctx.out.error(
                "ERR The ID specified in XSETID is smaller than current max_deleted_entry_id",
            );
        }
        if !log.is_empty() {
            let top = log.last_entry_id().unwrap_or(StreamId::MIN);
            if id < top {
                return ctx.out.error(
                    "ERR The ID specified in XSETID is smaller than the target stream top item",
                );
            }
            if entries_added.is_some_and(|n| log.len() > n) {
                return ctx.out.error(
                    "ERR The entries_added specified in XSETID is smaller than the target stream length",
                );
            }
        }
        log.last_id = id;
        if let Some(n) = entries_added {
            log.entries_added = n;
        }
        if !max_deleted.is_zero() {
            log.max_deleted = max_deleted;
        }
    }
    ctx.out.ok();
    ctx.notify(b'x', "xsetid", key);
    ctx.shard.dirty += 1;
}

// ---------------------------------------------------------------------------
// XINFO
// ---------------------------------------------------------------------------

pub const XINFO_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("consumers", 4, "readonly"),
    ("groups", 3, "readonly"),
    ("help", 2, "loading stale"),
    ("stream", -3, "readonly"),
];

const XINFO_HELP: &[&str] = &[
    "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CONSUMERS <key> <groupname>",
    "    The consumers of a group, with their pending counts and idle times.",
    "GROUPS <key>",
    "    The consumer groups of a stream.",
    "STREAM <key> [FULL [COUNT <count>]",
    "    The state of a stream; FULL adds its entries, groups and pending lists.",
    "HELP",
    "    Print this help.",
];

fn group_summary(out: &mut Reply, log: &Log, name: &[u8], g: &Group) {
    out.map(6);
    out.bulk(b"name");
    out.bulk(name);
    out.bulk(b"consumers");
    out.int(g.consumer_count() as i64);
    out.bulk(b"pending");
    out.int(g.pel.len() as i64);
    out.bulk(b"last-delivered-id");
    put_id(out, g.last_id);
    out.bulk(b"entries-read");
    put_opt_int(
        out,
        (g.entries_read != UNKNOWN_READ).then_some(g.entries_read),
    );
    out.bulk(b"lag");
    put_opt_int(out, log.lag(g));
}

fn stream_header(out: &mut Reply, s: &Stream) {
    let log = &s.log;
    out.bulk(b"length");
    out.int(log.len() as i64);
    out.bulk(b"radix-tree-keys");
    out.int(log.node_count() as i64);
    out.bulk(b"radix-tree-nodes");
    out.int(log.radix_nodes() as i64);
    out.bulk(b"last-generated-id");
    put_id(out, log.last_id);
    out.bulk(b"max-deleted-entry-id");
    put_id(out, log.max_deleted);
    out.bulk(b"entries-added");
    out.int(log.entries_added as i64);
    out.bulk(b"recorded-first-entry-id");
    put_id(out, log.first_id);
}

fn stream_info(out: &mut Reply, s: &Stream) {
    out.map(10);
    stream_header(out, s);
    out.bulk(b"groups");
    out.int(s.groups.len() as i64);
    for (label, e) in [
        (&b"first-entry"[..], s.log.first_entry()),
        (&b"last-entry"[..], s.log.last_entry()),
    ] {
        out.bulk(label);
        match e {
            Some(e) => put_entry(out, &e),
            None => out.null(),
        }
    }
}

fn stream_info_full(out: &mut Reply, s: &Stream, count: usize) {
    let take = |n: usize| if count == 0 { n } else { n.min(count) };
    out.map(9);
    stream_header(out, s);
    out.bulk(b"entries");
    put_entries(out, || s.log.range(StreamId::MIN, StreamId::MAX), count);
    out.bulk(b"groups");
    out.array(s.groups.len());
    for (name, g) in &s.groups {
        out.map(7);
        out.bulk(b"name");
        out.bulk(name);
        out.bulk(b"last-delivered-id");
        put_id(out, g.last_id);
        out.bulk(b"entries-read");
        put_opt_int(
            out,
            (g.entries_read != UNKNOWN_READ).then_some(g.entries_read),
        );
        out.bulk(b"lag");
        put_opt_int(out, s.log.lag(g));
        out.bulk(b"pel-count");
        out.int(g.pel.len() as i64);
        out.bulk(b"pending");
        out.array(take(g.pel.len()));
        for (id, n) in g.pel.iter().take(take(g.pel.len())) {
            out.array(4);
            put_id(out, *id);
            out.bulk(g.consumer_name(n.consumer));
            out.int(n.delivery_time);
            out.int(n.delivery_count as i64);
        }
        out.bulk(b"consumers");
        out.array(g.consumer_count());
        for c in g.consumers() {
            out.map(5);
            out.bulk(b"name");
            out.bulk(&c.name);
            out.bulk(b"seen-time");
            out.int(c.seen_time);
            out.bulk(b"active-time");
            out.int(c.active_time);
            out.bulk(b"pel-count");
            out.int(c.pel.len() as i64);
            out.bulk(b"pending");
            out.array(take(c.pel.len()));
            for id in c.pel.iter().take(take(c.pel.len())) {
                let n = &g.pel[id];
                out.array(3);
                put_id(out, *id);
                out.int(n.delivery_time);
                out.int(n.delivery_count as i64);
            }
        }
    }
}

pub fn xinfo(ctx: &mut ExecCtx, args: &[Bytes]) {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    if sub == "help" {
        return help(ctx.out, XINFO_HELP);
    }
    let key = &args[2];
    let now = ctx.now_ms as i64;
    let resp3 = ctx.out.resp3;
    let mut out = Reply::new(resp3);
    {
        let s = match stream_read(ctx, key) {
            Err(()) => return ctx.out.error(WRONGTYPE),
            Ok(None) => return ctx.out.error(NO_SUCH_KEY),
            Ok(Some(s)) => s,
        };
        match sub.as_str() {
            "consumers" => {
                let Some(g) = s.groups.get(&args[3][..]) else {
                    return ctx.out.error_bytes(&nogroup_group_key(&args[3], key));
                };
                out.array(g.consumer_count());
                for c in g.consumers() {
                    out.map(4);
                    out.bulk(b"name");
                    out.bulk(&c.name);
                    out.bulk(b"pending");
                    out.int(c.pel.len() as i64);
                    out.bulk(b"idle");
                    out.int((now - c.seen_time).max(0));
                    out.bulk(b"inactive");
                    out.int(if c.active_time == -1 {
                        -1
                    } else {
                        (now - c.active_time).max(0)
                    });
                }
            }
            "groups" => {
                out.array(s.groups.len());
                for (name, g) in &s.groups {
                    group_summary(&mut out, &s.log, name, g);
                }
            }
            _ => {
                let rest = &args[3..];
                let bad = || subcommand_syntax_error(&args[1], "XINFO");
                match rest.len() {
                    0 => stream_info(&mut out, s),
                    1 | 3 => {
                        if !eq_ci(&rest[0], "full")
                            || (rest.len() == 3 && !eq_ci(&rest[1], "count"))
                        {
                            return ctx.out.error_bytes(&bad());
                        }
                        let count = if rest.len() == 3 {
                            match parse_i64(&rest[2]) {
                                Ok(n) => n.max(0) as usize,
                                Err(e) => return ctx.out.error(e),
                            }
                        } else {
                            10
                        };
                        stream_info_full(&mut out, s, count);
                    }
                    _ => return ctx.out.error_bytes(&bad()),
                }
            }
        }
    }
    ctx.out.raw(&out.buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ms: u64, seq: u64) -> StreamId {
        StreamId::new(ms, seq)
    }

    #[test]
    fn ids_parse_like_redis() {
        assert_eq!(parse_id(b"5", 0), Ok(id(5, 0)));
        assert_eq!(parse_id(b"5", u64::MAX), Ok(id(5, u64::MAX)));
        assert_eq!(parse_id(b"5-3", 0), Ok(id(5, 3)));
        assert_eq!(parse_id(b"-", 0), Ok(StreamId::MIN));
        assert_eq!(parse_id(b"+", 0), Ok(StreamId::MAX));
        assert_eq!(parse_strict_id(b"-"), Err(INVALID_ID));
        assert_eq!(parse_id(b"00005-000", 0), Ok(id(5, 0)));
        assert_eq!(parse_id(b" 6", 0), Ok(id(6, 0)));
        assert_eq!(parse_id(b"+7", 0), Ok(id(7, 0)));
        assert_eq!(parse_id(b"5--05", 0), Ok(id(5, u64::MAX - 4)));
        assert_eq!(parse_id(b"5--5", 0), Err(INVALID_ID));
        assert_eq!(parse_id(b"-1", 0), Err(INVALID_ID));
        assert_eq!(parse_id(b"1-x", 0), Err(INVALID_ID));
        assert_eq!(parse_id(b"", 0), Err(INVALID_ID));
        assert_eq!(parse_id(b"18446744073709551616", 0), Err(INVALID_ID));
        assert_eq!(parse_id(b"7\0junk", 0), Ok(id(7, 0)));
        assert_eq!(parse_id_full(b"7-*", 0, true, true), Ok((id(7, 0), false)));
        assert_eq!(parse_id(b"7-*", 0), Err(INVALID_ID));
        assert_eq!(parse_start(b"(5"), Ok(id(5, 1)));
        assert_eq!(parse_end(b"(5"), Ok(id(5, u64::MAX - 1)));
        assert_eq!(parse_end(b"(0-0"), Err(BAD_END));
        assert_eq!(parse_start(b"(+"), Err(INVALID_ID));
        assert_eq!(parse_start(b"("), Err(INVALID_ID));
    }

    #[test]
    fn read_arguments() {
        let a = |s: &str| -> Vec<Bytes> {
            s.split(' ')
                .map(|w| Bytes::copy_from_slice(w.as_bytes()))
                .collect()
        };
        let r = parse_read(&a("XREAD COUNT 2 BLOCK 0 STREAMS a b 0 $"), false, 1).unwrap();
        assert_eq!(r.count, 2);
        assert_eq!(r.block_ms, Some(0));
        assert_eq!(r.keys.len(), 2);
        assert_eq!(xread_keys(&a("XREAD COUNT 2 STREAMS a b 0 $")), vec![4, 5]);
        assert!(parse_read(&a("XREAD STREAMS a b 0"), false, 1)
            .unwrap_err()
            .contains("Unbalanced 'xread'"));
        assert_eq!(
            xreadgroup_keys(&a("XREADGROUP GROUP g c NOACK STREAMS k >")),
            vec![6]
        );
        assert!(parse_read(&a("XREADGROUP STREAMS k >"), true, 1)
            .unwrap_err()
            .contains("Missing GROUP"));
    }
}
