//! String and bitmap commands (Redis 7.2 semantics, replies and error texts).
//!
//! Every handler reads arguments in the order Redis reads them, so that a command with
//! several faults reports the same one Redis reports. The pure parts (ranges, bit
//! searches, bitfields, LCS) are plain functions over byte slices, shared by the
//! single-shard and cross-shard forms and tested on their own.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::commands::arity_error;
use crate::commands::util::{parse_i64, NOT_INT, OVERFLOW, SYNTAX_ERR};
use crate::protocol::reply::Reply;
use crate::shard::{ExecCtx, Shard, Shared, Worker};
use crate::types::longdouble;
use crate::types::table::Entry;
use crate::types::value::{parse_canonical_i64, StrValue, Value, WRONGTYPE};

const STRING_TOO_LONG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";
const BIT_OFFSET_ERR: &str = "ERR bit offset is not an integer or out of range";
const BIT_VALUE_ERR: &str = "ERR bit is not an integer or out of range";
const OFFSET_RANGE_ERR: &str = "ERR offset is out of range";
const DECR_OVERFLOW: &str = "ERR decrement would overflow";
const BITPOS_BIT_ERR: &str = "ERR The bit argument must be 1 or 0.";
const BITOP_NOT_ERR: &str = "ERR BITOP NOT must be called with a single source key.";
const BITFIELD_TYPE_ERR: &str =
    "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.";
const BITFIELD_OVERFLOW_ERR: &str = "ERR Invalid OVERFLOW type specified";
const BITFIELD_RO_ERR: &str = "ERR BITFIELD_RO only supports the GET subcommand";
const LCS_TYPE_ERR: &str = "ERR The specified keys must contain string values";
const LCS_BOTH_ERR: &str = "ERR If you want both the length and indexes, please just use IDX.";
const LCS_TOO_LONG: &str = "ERR String too long for LCS";
const LCS_MEMORY_ERR: &str =
    "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len";

// ---------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------

/// The string held by a value, or None for another type.
fn str_ref(v: &Value) -> Option<&StrValue> {
    match v {
        Value::Str(s) => Some(s),
        _ => None,
    }
}

fn str_mut(v: &mut Value) -> Option<&mut StrValue> {
    match v {
        Value::Str(s) => Some(s),
        _ => None,
    }
}

/// A read lookup that also hands back the reply buffer (see `ExecCtx::get_read_and_out`).
fn lookup<'c>(ctx: &'c mut ExecCtx<'_>, key: &[u8]) -> (Option<&'c mut Entry>, &'c mut Reply) {
    ctx.get_read_and_out(key)
}

/// What `reply_string` found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Found {
    Missing,
    String,
    WrongType,
}

/// Replies the string in `entry`: null when there is none, WRONGTYPE for another type.
fn reply_string(out: &mut Reply, entry: Option<&mut Entry>) -> Found {
    match entry {
        None => {
            out.null();
            Found::Missing
        }
        Some(e) => match str_ref(&e.value) {
            Some(s) => {
                let mut scratch = [0u8; 20];
                out.bulk(s.as_bytes(&mut scratch));
                Found::String
            }
            None => {
                out.error(WRONGTYPE);
                Found::WrongType
            }
        },
    }
}

fn reply_int(out: &mut Reply, r: Result<i64, &'static str>) {
    match r {
        Ok(v) => out.int(v),
        Err(e) => out.error(e),
    }
}

/// Compares an option word as Redis's `strcasecmp` does: case-insensitive, and the
/// argument ends at its first NUL byte.
fn opt_is(arg: &[u8], word: &str) -> bool {
    let end = arg.iter().position(|&b| b == 0).unwrap_or(arg.len());
    arg[..end].eq_ignore_ascii_case(word.as_bytes())
}

/// The configured proto-max-bulk-len: the longest string a command may build, and the
/// bound of bit offsets and of LCS's working memory.
fn max_bulk(shared: &Shared) -> u64 {
    shared.tunables.proto_max_bulk_len.load(Ordering::Relaxed) as u64
}

/// Redis's `checkStringLength`: refuses results longer than proto-max-bulk-len (`max`).
fn check_string_length(size: u64, append: u64, max: u64) -> Result<(), &'static str> {
    match size.checked_add(append) {
        Some(total) if total <= max => Ok(()),
        _ => Err(STRING_TOO_LONG),
    }
}

/// A string value built by a command rather than given by the client: `raw`, as Redis
/// encodes the strings SETRANGE, SETBIT, BITFIELD and BITOP create.
fn built(v: Vec<u8>) -> Value {
    Value::Str(StrValue::Mutated(v))
}

/// A string value from client bytes, encoded as Redis's `tryObjectEncoding` would.
fn given(v: &[u8]) -> Value {
    Value::Str(StrValue::from_bytes(v))
}

/// Reads a string for a multi-key command: None when missing, Err for another type.
fn read_string(ctx: &mut ExecCtx, key: &[u8]) -> Result<Option<Vec<u8>>, ()> {
    match ctx.get_read(key) {
        None => Ok(None),
        Some(e) => match str_ref(&e.value) {
            Some(s) => Ok(Some(s.to_vec())),
            None => Err(()),
        },
    }
}

/// Groups argument positions by the shard owning the key at each, shards ascending and
/// positions in argument order within a shard (duplicates kept).
fn by_shard(
    worker: &Worker,
    args: &[Bytes],
    positions: impl Iterator<Item = usize>,
) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for p in positions {
        let s = worker.shard_of(&args[p]);
        match groups.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push(p),
            None => groups.push((s, vec![p])),
        }
    }
    groups.sort_by_key(|g| g.0);
    groups
}

fn pick(args: &[Bytes], positions: &[usize]) -> Vec<Bytes> {
    positions.iter().map(|&i| args[i].clone()).collect()
}

// ---------------------------------------------------------------------------------------
// GET, SET and their variants
// ---------------------------------------------------------------------------------------

pub fn get(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (entry, out) = lookup(ctx, &args[1]);
    reply_string(out, entry);
}

/// The expiry forms of SET and GETEX.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ExpireKind {
    Ex,
    Px,
    ExAt,
    PxAt,
}

impl ExpireKind {
    fn seconds(self) -> bool {
        matches!(self, ExpireKind::Ex | ExpireKind::ExAt)
    }

    fn relative(self) -> bool {
        matches!(self, ExpireKind::Ex | ExpireKind::Px)
    }
}

#[derive(Default, Debug)]
struct SetOptions<'a> {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    expire: Option<(ExpireKind, &'a [u8])>,
}

/// Parses the options of SET (`for_set`) or GETEX with Redis's conflict rules: NX and XX
/// exclude each other, the four expiry forms exclude each other and KEEPTTL/PERSIST, the
/// same option may repeat (the last expiry value wins), and anything else is a syntax
/// error. Expiry values are only read later.
fn parse_set_options(args: &[Bytes], for_set: bool) -> Result<SetOptions<'_>, &'static str> {
    let mut o = SetOptions::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i][..];
        let has_next = i + 1 < args.len();
        let kind = if opt_is(a, "ex") {
            Some(ExpireKind::Ex)
        } else if opt_is(a, "px") {
            Some(ExpireKind::Px)
        } else if opt_is(a, "exat") {
            Some(ExpireKind::ExAt)
        } else if opt_is(a, "pxat") {
            Some(ExpireKind::PxAt)
        } else {
            None
        };
        if let Some(kind) = kind {
            let other_form = matches!(o.expire, Some((k, _)) if k != kind);
            if o.keepttl || o.persist || other_form || !has_next {
                return Err(SYNTAX_ERR);
            }
            o.expire = Some((kind, &args[i + 1][..]));
            i += 2;
            continue;
        }
        if for_set && opt_is(a, "nx") && !o.xx {
            o.nx = true;
        } else if for_set && opt_is(a, "xx") && !o.nx {
            o.xx = true;
        } else if for_set && opt_is(a, "get") {
            o.get = true;
        } else if for_set && opt_is(a, "keepttl") && o.expire.is_none() && !o.persist {
            o.keepttl = true;
        } else if !for_set && opt_is(a, "persist") && o.expire.is_none() && !o.keepttl {
            o.persist = true;
        } else {
            return Err(SYNTAX_ERR);
        }
        i += 1;
    }
    Ok(o)
}

#[derive(Debug, PartialEq, Eq)]
enum ExpireError {
    NotInt,
    Invalid,
}

/// Turns an expiry argument into an absolute unix time in milliseconds, refusing what
/// Redis refuses: non-integers, values <= 0, seconds that overflow once in milliseconds,
/// and relative times that overflow once added to the clock.
fn expire_at(arg: &[u8], kind: ExpireKind, now_ms: u64) -> Result<u64, ExpireError> {
    let v = parse_canonical_i64(arg).ok_or(ExpireError::NotInt)?;
    if v <= 0 || (kind.seconds() && v > i64::MAX / 1000) {
        return Err(ExpireError::Invalid);
    }
    let mut ms = if kind.seconds() { v * 1000 } else { v };
    if kind.relative() {
        ms = ms.checked_add(now_ms as i64).ok_or(ExpireError::Invalid)?;
    }
    if ms <= 0 {
        return Err(ExpireError::Invalid);
    }
    Ok(ms as u64)
}

fn reply_expire_error(out: &mut Reply, e: ExpireError, cmd: &str) {
    match e {
        ExpireError::NotInt => out.error(NOT_INT),
        ExpireError::Invalid => out.error(&format!("ERR invalid expire time in '{cmd}' command")),
    }
}

/// How a SET-family command answers: SET's `+OK`/null, or SETNX's `:1`/`:0`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SetReplies {
    OkNull,
    OneZero,
}

/// The SET family (SET, SETNX, SETEX, PSETEX): expiry check, optional GET of the old
/// value, NX/XX condition, then the write.
fn set_generic(
    ctx: &mut ExecCtx,
    key: &[u8],
    value: &[u8],
    o: &SetOptions,
    cmd: &str,
    replies: SetReplies,
) {
    let mut at = 0;
    if let Some((kind, arg)) = o.expire {
        match expire_at(arg, kind, ctx.now_ms) {
            Ok(t) => at = t,
            Err(e) => return reply_expire_error(ctx.out, e, cmd),
        }
    }
    if o.get {
        let (entry, out) = lookup(ctx, key);
        if reply_string(out, entry) == Found::WrongType {
            return;
        }
    }
    // A plain SET needs nothing of the old key: it is replaced in the same probe that
    // finds it (`ExecCtx::set_unlooked` expires it first if its time is up, and counts
    // the access the lookup would have counted).
    let looked = o.nx || o.xx || o.keepttl || o.get;
    let existing = if looked {
        ctx.get(key).map(|e| e.expire_at())
    } else {
        None
    };
    if (o.nx && existing.is_some()) || (o.xx && existing.is_none()) {
        if !o.get {
            match replies {
                SetReplies::OkNull => ctx.out.null(),
                SetReplies::OneZero => ctx.out.int(0),
            }
        }
        return;
    }
    let expire = if o.expire.is_some() {
        at
    } else if o.keepttl {
        existing.unwrap_or(0)
    } else {
        0
    };
    if looked {
        ctx.set(key, given(value), expire);
    } else {
        ctx.set_unlooked(key, given(value), expire);
    }
    ctx.notify(b'$', "set", key);
    if o.expire.is_some() {
        ctx.notify(b'g', "expire", key);
    }
    if !o.get {
        match replies {
            SetReplies::OkNull => ctx.out.ok(),
            SetReplies::OneZero => ctx.out.int(1),
        }
    }
}

/// SET key value [NX|XX] [GET] [EX s|PX ms|EXAT ts|PXAT ts|KEEPTTL]
pub fn set(ctx: &mut ExecCtx, args: &[Bytes]) {
    match parse_set_options(&args[3..], true) {
        Ok(o) => set_generic(ctx, &args[1], &args[2], &o, "set", SetReplies::OkNull),
        Err(e) => ctx.out.error(e),
    }
}

pub fn setnx(ctx: &mut ExecCtx, args: &[Bytes]) {
    let o = SetOptions {
        nx: true,
        ..SetOptions::default()
    };
    set_generic(ctx, &args[1], &args[2], &o, "setnx", SetReplies::OneZero);
}

/// SETEX key seconds value
pub fn setex(ctx: &mut ExecCtx, args: &[Bytes]) {
    let o = SetOptions {
        expire: Some((ExpireKind::Ex, &args[2][..])),
        ..SetOptions::default()
    };
    set_generic(ctx, &args[1], &args[3], &o, "setex", SetReplies::OkNull);
}

/// PSETEX key milliseconds value
pub fn psetex(ctx: &mut ExecCtx, args: &[Bytes]) {
    let o = SetOptions {
        expire: Some((ExpireKind::Px, &args[2][..])),
        ..SetOptions::default()
    };
    set_generic(ctx, &args[1], &args[3], &o, "psetex", SetReplies::OkNull);
}

/// GETEX key [EX s|PX ms|EXAT ts|PXAT ts|PERSIST]
pub fn getex(ctx: &mut ExecCtx, args: &[Bytes]) {
    let o = match parse_set_options(&args[2..], false) {
        Ok(o) => o,
        Err(e) => return ctx.out.error(e),
    };
    let key = &args[1][..];
    let now = ctx.now_ms;
    let (entry, out) = lookup(ctx, key);
    let Some(e) = entry else {
        return out.null();
    };
    let Some(s) = str_ref(&e.value) else {
        return out.error(WRONGTYPE);
    };
    // The expiry is validated only once the key is known to be a string.
    let at = match o.expire {
        None => None,
        Some((kind, arg)) => match expire_at(arg, kind, now) {
            Ok(t) => Some(t),
            Err(err) => return reply_expire_error(out, err, "getex"),
        },
    };
    let mut scratch = [0u8; 20];
    out.bulk(s.as_bytes(&mut scratch));
    let had_ttl = e.expire_at() != 0;
    match at {
        // An absolute time already past deletes the key, as Redis does.
        Some(t) if ctx.already_expired(t as i64) => {
            ctx.delete(key);
            ctx.notify(b'g', "del", key);
        }
        Some(t) => {
            ctx.set_expire(key, t);
            ctx.notify(b'g', "expire", key);
        }
        None if o.persist && had_ttl => {
            ctx.set_expire(key, 0);
            ctx.notify(b'g', "persist", key);
        }
        None => {}
    }
}

pub fn getdel(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (entry, out) = lookup(ctx, &args[1]);
    if reply_string(out, entry) == Found::String {
        ctx.delete(&args[1]);
        ctx.notify(b'g', "del", &args[1]);
    }
}

/// GETSET key value: the old value, and the new one stored without a TTL.
pub fn getset(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (entry, out) = lookup(ctx, &args[1]);
    if reply_string(out, entry) != Found::WrongType {
        ctx.set(&args[1], given(&args[2]), 0);
        ctx.notify(b'$', "set", &args[1]);
    }
}

// ---------------------------------------------------------------------------------------
// MGET, MSET, MSETNX
// ---------------------------------------------------------------------------------------

pub fn mget(ctx: &mut ExecCtx, args: &[Bytes]) {
    ctx.out.array(args.len() - 1);
    for key in &args[1..] {
        let (entry, out) = lookup(ctx, key);
        match entry.and_then(|e| str_ref(&e.value)) {
            Some(s) => {
                let mut scratch = [0u8; 20];
                out.bulk(s.as_bytes(&mut scratch));
            }
            None => out.null(),
        }
    }
}

crate::cross_handler!(mget_cross, |sess, args, tx| {
    let db = sess.db;
    let mut values: Vec<Option<Vec<u8>>> = vec![None; args.len()];
    for (shard, positions) in by_shard(&sess.worker, &args, 1..args.len()) {
        let keys = pick(&args, &positions);
        let found = tx
            .run(shard, move |sh: &mut Shard| {
                sh.with_ctx(db, |ctx| {
                    keys.iter()
                        .map(|k| read_string(ctx, k).unwrap_or(None))
                        .collect::<Vec<_>>()
                })
            })
            .await;
        for (p, v) in positions.into_iter().zip(found) {
            values[p] = v;
        }
    }
    sess.out.array(args.len() - 1);
    for v in &values[1..] {
        sess.out.opt_bulk(v.as_deref());
    }
});

/// MSET and MSETNX take key/value pairs: an odd count of arguments after the name.
fn pairs_ok(args: &[Bytes]) -> bool {
    args.len() % 2 == 1
}

fn set_pairs<'k>(ctx: &mut ExecCtx, pairs: impl Iterator<Item = (&'k [u8], &'k [u8])>) {
    for (k, v) in pairs {
        ctx.set(k, given(v), 0);
        ctx.notify(b'$', "set", k);
    }
}

fn arg_pairs(args: &[Bytes]) -> impl Iterator<Item = (&[u8], &[u8])> {
    args.chunks_exact(2).map(|p| (&p[0][..], &p[1][..]))
}

pub fn mset(ctx: &mut ExecCtx, args: &[Bytes]) {
    if !pairs_ok(args) {
        return ctx.out.error(&arity_error("mset"));
    }
    set_pairs(ctx, arg_pairs(&args[1..]));
    ctx.out.ok();
}

pub fn msetnx(ctx: &mut ExecCtx, args: &[Bytes]) {
    if !pairs_ok(args) {
        return ctx.out.error(&arity_error("msetnx"));
    }
    if args[1..].iter().step_by(2).any(|k| ctx.get(k).is_some()) {
        return ctx.out.int(0);
    }
    set_pairs(ctx, arg_pairs(&args[1..]));
    ctx.out.int(1);
}

/// The pairs whose keys sit at `positions`, owned for another thread.
fn owned_pairs(args: &[Bytes], positions: &[usize]) -> Vec<(Bytes, Bytes)> {
    positions
        .iter()
        .map(|&i| (args[i].clone(), args[i + 1].clone()))
        .collect()
}

async fn set_pairs_everywhere(
    worker: &Worker,
    tx: &crate::shard::tx::Tx,
    db: usize,
    args: &[Bytes],
) {
    for (shard, positions) in by_shard(worker, args, (1..args.len()).step_by(2)) {
        let pairs = owned_pairs(args, &positions);
        tx.run(shard, move |sh: &mut Shard| {
            sh.with_ctx(db, |ctx| {
                set_pairs(ctx, pairs.iter().map(|(k, v)| (&k[..], &v[..])))
            })
        })
        .await;
    }
}

crate::cross_handler!(mset_cross, |sess, args, tx| {
    if !pairs_ok(&args) {
        sess.out.error(&arity_error("mset"));
        return;
    }
    set_pairs_everywhere(&sess.worker, tx, sess.db, &args).await;
    sess.out.ok();
});

crate::cross_handler!(msetnx_cross, |sess, args, tx| {
    if !pairs_ok(&args) {
        sess.out.error(&arity_error("msetnx"));
        return;
    }
    let db = sess.db;
    // Every key is locked: check them all, then write them all.
    for (shard, positions) in by_shard(&sess.worker, &args, (1..args.len()).step_by(2)) {
        let keys = pick(&args, &positions);
        let exists = tx
            .run(shard, move |sh: &mut Shard| {
                sh.with_ctx(db, |ctx| keys.iter().any(|k| ctx.get(k).is_some()))
            })
            .await;
        if exists {
            sess.out.int(0);
            return;
        }
    }
    set_pairs_everywhere(&sess.worker, tx, db, &args).await;
    sess.out.int(1);
});

// ---------------------------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------------------------

/// Adds `incr` to the integer at `key` (0 when missing), keeping its TTL.
fn incr_by(ctx: &mut ExecCtx, key: &[u8], incr: i64) -> Result<i64, &'static str> {
    if let Some(e) = ctx.get(key) {
        let s = str_mut(&mut e.value).ok_or(WRONGTYPE)?;
        let v = s.as_i64().ok_or(NOT_INT)?;
        let n = v.checked_add(incr).ok_or(OVERFLOW)?;
        *s = StrValue::Int(n);
        ctx.modified(key);
        ctx.notify(b'$', "incrby", key);
        return Ok(n);
    }
    ctx.set(key, Value::Str(StrValue::Int(incr)), 0);
    ctx.notify(b'$', "incrby", key);
    Ok(incr)
}

pub fn incr(ctx: &mut ExecCtx, args: &[Bytes]) {
    let r = incr_by(ctx, &args[1], 1);
    reply_int(ctx.out, r);
}

pub fn decr(ctx: &mut ExecCtx, args: &[Bytes]) {
    let r = incr_by(ctx, &args[1], -1);
    reply_int(ctx.out, r);
}

pub fn incrby(ctx: &mut ExecCtx, args: &[Bytes]) {
    let r = parse_i64(&args[2]).and_then(|by| incr_by(ctx, &args[1], by));
    reply_int(ctx.out, r);
}

pub fn decrby(ctx: &mut ExecCtx, args: &[Bytes]) {
    let r = parse_i64(&args[2]).and_then(|by| {
        if by == i64::MIN {
            Err(DECR_OVERFLOW)
        } else {
            incr_by(ctx, &args[1], -by)
        }
    });
    reply_int(ctx.out, r);
}

/// Adds a float increment in long double (see `types::longdouble`), keeping the TTL.
fn incr_by_float(ctx: &mut ExecCtx, key: &[u8], incr: &[u8]) -> Result<Vec<u8>, &'static str> {
    if let Some(e) = ctx.get(key) {
        let s = str_mut(&mut e.value).ok_or(WRONGTYPE)?;
        let mut scratch = [0u8; 20];
        let new = longdouble::incr_by_float(s.as_bytes(&mut scratch), incr)?;
        // Redis stores the printed sum as a plain string (embstr or raw), never an int.
        *s = StrValue::from_bytes_not_int(&new);
        ctx.modified(key);
        ctx.notify(b'$', "incrbyfloat", key);
        return Ok(new);
    }
    let new = longdouble::incr_by_float(b"0", incr)?;
    ctx.set(key, Value::Str(StrValue::from_bytes_not_int(&new)), 0);
    ctx.notify(b'$', "incrbyfloat", key);
    Ok(new)
}

pub fn incrbyfloat(ctx: &mut ExecCtx, args: &[Bytes]) {
    match incr_by_float(ctx, &args[1], &args[2]) {
        Ok(v) => ctx.out.bulk(&v),
        Err(e) => ctx.out.error(e),
    }
}

// ---------------------------------------------------------------------------------------
// APPEND, STRLEN, GETRANGE, SETRANGE
// ---------------------------------------------------------------------------------------

fn append_to(ctx: &mut ExecCtx, key: &[u8], tail: &[u8]) -> Result<i64, &'static str> {
    let max = max_bulk(&ctx.shard.shared);
    if let Some(e) = ctx.get(key) {
        let s = str_mut(&mut e.value).ok_or(WRONGTYPE)?;
        check_string_length(s.len() as u64, tail.len() as u64, max)?;
        let v = s.make_mut();
        v.extend_from_slice(tail);
        let len = v.len() as i64;
        ctx.modified(key);
        ctx.notify(b'$', "append", key);
        return Ok(len);
    }
    ctx.set(key, given(tail), 0);
    ctx.notify(b'$', "append", key);
    Ok(tail.len() as i64)
}

pub fn append(ctx: &mut ExecCtx, args: &[Bytes]) {
    let r = append_to(ctx, &args[1], &args[2]);
    reply_int(ctx.out, r);
}

pub fn strlen(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (entry, out) = lookup(ctx, &args[1]);
    match entry {
        None => out.int(0),
        Some(e) => match str_ref(&e.value) {
            Some(s) => out.int(s.len() as i64),
            None => out.error(WRONGTYPE),
        },
    }
}

/// GETRANGE's inclusive byte range over a string of `len` bytes, None when empty.
fn substr_range(len: usize, start: i64, end: i64) -> Option<(usize, usize)> {
    if start < 0 && end < 0 && start > end {
        return None;
    }
    let len = len as i64;
    let start = if start < 0 { len + start } else { start }.max(0);
    let mut end = if end < 0 { len + end } else { end }.max(0);
    if end >= len {
        end = len - 1;
    }
    if start > end || len == 0 {
        None
    } else {
        Some((start as usize, end as usize))
    }
}

/// GETRANGE key start end (and SUBSTR).
pub fn getrange(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (start, end) = match (parse_i64(&args[2]), parse_i64(&args[3])) {
        (Ok(s), Ok(e)) => (s, e),
        (Err(e), _) | (_, Err(e)) => return ctx.out.error(e),
    };
    let (entry, out) = lookup(ctx, &args[1]);
    let Some(e) = entry else {
        return out.bulk(b"");
    };
    let Some(s) = str_ref(&e.value) else {
        return out.error(WRONGTYPE);
    };
    let mut scratch = [0u8; 20];
    let bytes = s.as_bytes(&mut scratch);
    match substr_range(bytes.len(), start, end) {
        Some((lo, hi)) => out.bulk(&bytes[lo..=hi]),
        None => out.bulk(b""),
    }
}

fn set_range(
    ctx: &mut ExecCtx,
    key: &[u8],
    offset: &[u8],
    value: &[u8],
) -> Result<i64, &'static str> {
    let offset = parse_i64(offset)?;
    if offset < 0 {
        return Err(OFFSET_RANGE_ERR);
    }
    let max = max_bulk(&ctx.shard.shared);
    if let Some(e) = ctx.get(key) {
        let s = str_mut(&mut e.value).ok_or(WRONGTYPE)?;
        if value.is_empty() {
            return Ok(s.len() as i64);
        }
        check_string_length(offset as u64, value.len() as u64, max)?;
        let v = s.make_mut();
        let (start, end) = (offset as usize, offset as usize + value.len());
        if v.len() < end {
            v.resize(end, 0);
        }
        v[start..end].copy_from_slice(value);
        let len = v.len() as i64;
        ctx.modified(key);
        ctx.notify(b'$', "setrange", key);
        return Ok(len);
    }
    if value.is_empty() {
        return Ok(0);
    }
    check_string_length(offset as u64, value.len() as u64, max)?;
    let mut v = vec![0u8; offset as usize + value.len()];
    v[offset as usize..].copy_from_slice(value);
    let len = v.len() as i64;
    ctx.set(key, built(v), 0);
    ctx.notify(b'$', "setrange", key);
    Ok(len)
}

/// SETRANGE key offset value
pub fn setrange(ctx: &mut ExecCtx, args: &[Bytes]) {
    let r = set_range(ctx, &args[1], &args[2], &args[3]);
    reply_int(ctx.out, r);
}

// ---------------------------------------------------------------------------------------
// LCS
// ---------------------------------------------------------------------------------------

#[derive(Default, Debug, PartialEq, Eq)]
struct LcsOptions {
    len: bool,
    idx: bool,
    with_match_len: bool,
    min_match_len: u64,
}

fn parse_lcs_options(args: &[Bytes]) -> Result<LcsOptions, &'static str> {
    let mut o = LcsOptions::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i][..];
        let more = i + 1 < args.len();
        if opt_is(a, "idx") {
            o.idx = true;
        } else if opt_is(a, "len") {
            o.len = true;
        } else if opt_is(a, "withmatchlen") {
            o.with_match_len = true;
        } else if opt_is(a, "minmatchlen") && more {
            o.min_match_len = parse_i64(&args[i + 1])?.max(0) as u64;
            i += 1;
        } else {
            return Err(SYNTAX_ERR);
        }
        i += 1;
    }
    if o.idx && o.len {
        return Err(LCS_BOTH_ERR);
    }
    Ok(o)
}

/// One matched run: inclusive byte ranges in the first and second string.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct LcsRange {
    a: (usize, usize),
    b: (usize, usize),
}

impl LcsRange {
    fn len(&self) -> usize {
        self.a.1 - self.a.0 + 1
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Lcs {
    len: usize,
    seq: Vec<u8>,
    /// Runs found walking back from the ends of both strings (so, last first).
    ranges: Vec<LcsRange>,
}

/// The longest common subsequence by the classic dynamic programme, walked back with
/// Redis's tie-break (step in `a` only when that keeps a strictly longer LCS), so the
/// sequence and ranges are the ones Redis reports. With `walk` false only the length is
/// computed.
fn lcs_compute(a: &[u8], b: &[u8], walk: bool) -> Lcs {
    let w = b.len() + 1;
    if !walk {
        // Two rows are enough for the length alone.
        let mut prev = vec![0u32; w];
        let mut cur = vec![0u32; w];
        for &ca in a {
            for j in 1..w {
                cur[j] = if ca == b[j - 1] {
                    prev[j - 1] + 1
                } else {
                    prev[j].max(cur[j - 1])
                };
            }
            std::mem::swap(&mut prev, &mut cur);
        }
        return Lcs {
            len: prev[w - 1] as usize,
            seq: Vec::new(),
            ranges: Vec::new(),
        };
    }
    let mut t = vec![0u32; (a.len() + 1) * w];
    for i in 1..=a.len() {
        for j in 1..w {
            t[i * w + j] = if a[i - 1] == b[j - 1] {
                t[(i - 1) * w + j - 1] + 1
            } else {
                t[(i - 1) * w + j].max(t[i * w + j - 1])
            };
        }
    }
    let len = t[a.len() * w + b.len()] as usize;
    let mut seq = vec![0u8; len];
    let mut k = len;
    let mut ranges = Vec::new();
    let mut run: Option<LcsRange> = None;
    let (mut i, mut j) = (a.len(), b.len());
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            k -= 1;
            seq[k] = a[i - 1];
            match &mut run {
                None => {
                    run = Some(LcsRange {
                        a: (i - 1, i - 1),
                        b: (j - 1, j - 1),
                    })
                }
                Some(r) if r.a.0 == i && r.b.0 == j => {
                    r.a.0 -= 1;
                    r.b.0 -= 1;
                }
                Some(_) => emit = true,
            }
            if let Some(r) = &run {
                if r.a.0 == 0 || r.b.0 == 0 {
                    emit = true;
                }
            }
            i -= 1;
            j -= 1;
        } else {
            if t[(i - 1) * w + j] > t[i * w + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            emit = run.is_some();
        }
        if emit {
            ranges.extend(run.take());
        }
    }
    Lcs { len, seq, ranges }
}

/// LCS's reply once both strings are known (missing keys read as empty strings).
fn lcs_reply(out: &mut Reply, a: &[u8], b: &[u8], opts: &[Bytes], max: u64) {
    let o = match parse_lcs_options(opts) {
        Ok(o) => o,
        Err(e) => return out.error(e),
    };
    if a.len() as u64 >= u32::MAX as u64 - 1 || b.len() as u64 >= u32::MAX as u64 - 1 {
        return out.error(LCS_TOO_LONG);
    }
    let cells = (a.len() as u64 + 1) * (b.len() as u64 + 1);
    if cells.saturating_mul(4) > max {
        return out.error(LCS_MEMORY_ERR);
    }
    let r = lcs_compute(a, b, o.idx || !o.len);
    if o.idx {
        let shown: Vec<&LcsRange> = r
            .ranges
            .iter()
            .filter(|m| m.len() as u64 >= o.min_match_len)
            .collect();
        out.map(2);
        out.bulk(b"matches");
        out.array(shown.len());
        for m in shown {
            out.array(if o.with_match_len { 3 } else { 2 });
            out.array(2);
            out.int(m.a.0 as i64);
            out.int(m.a.1 as i64);
            out.array(2);
            out.int(m.b.0 as i64);
            out.int(m.b.1 as i64);
            if o.with_match_len {
                out.int(m.len() as i64);
            }
        }
        out.bulk(b"len");
        out.int(r.len as i64);
    } else if o.len {
        out.int(r.len as i64);
    } else {
        out.bulk(&r.seq);
    }
}

/// LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN]
pub fn lcs(ctx: &mut ExecCtx, args: &[Bytes]) {
    let a = read_string(ctx, &args[1]);
    let b = read_string(ctx, &args[2]);
    let max = max_bulk(&ctx.shard.shared);
    lcs_finish(ctx.out, a, b, &args[3..], max);
}

fn lcs_finish(
    out: &mut Reply,
    a: Result<Option<Vec<u8>>, ()>,
    b: Result<Option<Vec<u8>>, ()>,
    opts: &[Bytes],
    max: u64,
) {
    match (a, b) {
        (Ok(a), Ok(b)) => lcs_reply(
            out,
            a.as_deref().unwrap_or(b""),
            b.as_deref().unwrap_or(b""),
            opts,
            max,
        ),
        _ => out.error(LCS_TYPE_ERR),
    }
}

crate::cross_handler!(lcs_cross, |sess, args, tx| {
    let db = sess.db;
    let mut read = Vec::with_capacity(2);
    for key in [args[1].clone(), args[2].clone()] {
        let shard = sess.worker.shard_of(&key);
        let r = tx
            .run(shard, move |sh: &mut Shard| {
                sh.with_ctx(db, |ctx| read_string(ctx, &key))
            })
            .await;
        read.push(r);
    }
    let b = read.pop().expect("two keys read");
    let a = read.pop().expect("two keys read");
    let max = max_bulk(&sess.worker.shared);
    lcs_finish(&mut sess.out, a, b, &args[3..], max);
});

// ---------------------------------------------------------------------------------------
// Bits: SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP
// ---------------------------------------------------------------------------------------

/// Redis's bit offset argument: a non-negative integer below `max` (proto-max-bulk-len)
/// bytes. With `bits` > 0 (BITFIELD) the form `#n` means `n * bits`.
fn bit_offset(arg: &[u8], bits: u32, max: u64) -> Result<u64, &'static str> {
    let hash = bits > 0 && arg.first() == Some(&b'#');
    let digits = if hash { &arg[1..] } else { arg };
    let mut v = parse_canonical_i64(digits).ok_or(BIT_OFFSET_ERR)?;
    if hash {
        // Redis multiplies in (wrapping) 64-bit arithmetic before the range check.
        v = v.wrapping_mul(bits as i64);
    }
    if v < 0 || (v as u64 >> 3) >= max {
        return Err(BIT_OFFSET_ERR);
    }
    Ok(v as u64)
}

fn set_bit(ctx: &mut ExecCtx, args: &[Bytes]) -> Result<i64, &'static str> {
    let key = &args[1][..];
    let offset = bit_offset(&args[2], 0, max_bulk(&ctx.shard.shared))?;
    let on = parse_canonical_i64(&args[3]).ok_or(BIT_VALUE_ERR)?;
    if on & !1 != 0 {
        return Err(BIT_VALUE_ERR);
    }
    let byte = (offset >> 3) as usize;
    let shift = 7 - (offset & 7) as u32;
    let mask = 1u8 << shift;
    if let Some(e) = ctx.get(key) {
        let s = str_mut(&mut e.value).ok_or(WRONGTYPE)?;
        // Like Redis, the value becomes raw even when nothing changes.
        let v = s.make_mut();
        let grew = v.len() <= byte;
        if grew {
            v.resize(byte + 1, 0);
        }
        let old = v[byte] & mask != 0;
        if on == 1 {
            v[byte] |= mask;
        } else {
            v[byte] &= !mask;
        }
        if grew || old != (on == 1) {
            ctx.modified(key);
            ctx.notify(b'$', "setbit", key);
        }
        return Ok(old as i64);
    }
    let mut v = vec![0u8; byte + 1];
    if on == 1 {
        v[byte] |= mask;
    }
    ctx.set(key, built(v), 0);
    ctx.notify(b'$', "setbit", key);
    Ok(0)
}

/// SETBIT key offset 0|1: the bit's previous value.
pub fn setbit(ctx: &mut ExecCtx, args: &[Bytes]) {
    let r = set_bit(ctx, args);
    reply_int(ctx.out, r);
}

/// GETBIT key offset
pub fn getbit(ctx: &mut ExecCtx, args: &[Bytes]) {
    let offset = match bit_offset(&args[2], 0, max_bulk(&ctx.shard.shared)) {
        Ok(o) => o,
        Err(e) => return ctx.out.error(e),
    };
    let (entry, out) = lookup(ctx, &args[1]);
    let Some(e) = entry else {
        return out.int(0);
    };
    let Some(s) = str_ref(&e.value) else {
        return out.error(WRONGTYPE);
    };
    let mut scratch = [0u8; 20];
    let bytes = s.as_bytes(&mut scratch);
    out.int(bit_at(bytes, offset) as i64);
}

fn bit_at(p: &[u8], offset: u64) -> bool {
    let byte = (offset >> 3) as usize;
    byte < p.len() && p[byte] & (0x80 >> (offset & 7)) != 0
}

/// Resolves a BITCOUNT/BITPOS range (byte or bit units; negative counts from the end;
/// clamped to the string) into an inclusive range of bit positions, None when empty.
fn bit_range(len: usize, start: i64, end: i64, bit_units: bool) -> Option<(u64, u64)> {
    let total = if bit_units {
        len as i64 * 8
    } else {
        len as i64
    };
    let start = if start < 0 { total + start } else { start }.max(0);
    let mut end = if end < 0 { total + end } else { end }.max(0);
    if end >= total {
        end = total - 1;
    }
    if start > end {
        return None;
    }
    let (s, e) = (start as u64, end as u64);
    Some(if bit_units {
        (s, e)
    } else {
        (s * 8, e * 8 + 7)
    })
}

fn popcount(p: &[u8]) -> u64 {
    let mut chunks = p.chunks_exact(8);
    let mut n: u64 = 0;
    for c in &mut chunks {
        n += u64::from_ne_bytes(c.try_into().expect("8-byte chunk")).count_ones() as u64;
    }
    n + chunks
        .remainder()
        .iter()
        .map(|b| b.count_ones() as u64)
        .sum::<u64>()
}

/// Set bits among bit positions `first..=last` of `p` (both within `p`).
fn count_bits(p: &[u8], first: u64, last: u64) -> u64 {
    let (fb, lb) = ((first >> 3) as usize, (last >> 3) as usize);
    let mut n = popcount(&p[fb..=lb]);
    let head = (first & 7) as u32;
    if head > 0 {
        n -= (p[fb] >> (8 - head)).count_ones() as u64;
    }
    let tail = 7 - (last & 7) as u32;
    if tail > 0 {
        n -= (p[lb] & ((1u8 << tail) - 1)).count_ones() as u64;
    }
    n
}

/// BITCOUNT's answer for the string `p` and the arguments after the key.
fn bitcount_of(p: &[u8], range: &[Bytes]) -> Result<i64, &'static str> {
    match range.len() {
        0 => Ok(popcount(p) as i64),
        2 | 3 => {
            let start = parse_i64(&range[0])?;
            let end = parse_i64(&range[1])?;
            if start < 0 && end < 0 && start > end {
                return Ok(0);
            }
            let bit_units = match range.get(2) {
                None => false,
                Some(u) if opt_is(u, "bit") => true,
                Some(u) if opt_is(u, "byte") => false,
                Some(_) => return Err(SYNTAX_ERR),
            };
            Ok(match bit_range(p.len(), start, end, bit_units) {
                Some((first, last)) => count_bits(p, first, last) as i64,
                None => 0,
            })
        }
        _ => Err(SYNTAX_ERR),
    }
}

/// BITCOUNT key [start end [BYTE|BIT]]
pub fn bitcount(ctx: &mut ExecCtx, args: &[Bytes]) {
    // Redis 7.2 looks the key up before it reads the range.
    let (entry, out) = lookup(ctx, &args[1]);
    let Some(e) = entry else {
        return out.int(0);
    };
    let Some(s) = str_ref(&e.value) else {
        return out.error(WRONGTYPE);
    };
    let mut scratch = [0u8; 20];
    reply_int(out, bitcount_of(s.as_bytes(&mut scratch), &args[2..]));
}

/// The first bit equal to `bit` among positions `first..=last` of `p` (within `p`).
fn find_bit(p: &[u8], first: u64, last: u64, bit: bool) -> Option<u64> {
    let (fb, lb) = ((first >> 3) as usize, (last >> 3) as usize);
    let skip: u64 = if bit { 0 } else { u64::MAX };
    let mut i = fb;
    while i <= lb {
        // Whole words strictly inside the range without the bit are skipped at once.
        if i > fb && i + 8 <= lb {
            let w = u64::from_ne_bytes(p[i..i + 8].try_into().expect("8 bytes"));
            if w == skip {
                i += 8;
                continue;
            }
        }
        let mut b = if bit { p[i] } else { !p[i] };
        if i == fb {
            b &= 0xFF >> (first & 7);
        }
        if i == lb {
            b &= 0xFF << (7 - (last & 7));
        }
        if b != 0 {
            return Some(i as u64 * 8 + b.leading_zeros() as u64);
        }
        i += 1;
    }
    None
}

/// BITPOS's answer for the string `p` and the arguments after the bit.
fn bitpos_of(p: &[u8], bit: bool, range: &[Bytes]) -> Result<i64, &'static str> {
    if range.len() > 3 {
        return Err(SYNTAX_ERR);
    }
    let mut start = 0;
    let mut end = -1;
    let mut bit_units = false;
    if let Some(s) = range.first() {
        start = parse_i64(s)?;
    }
    if let Some(u) = range.get(2) {
        bit_units = if opt_is(u, "bit") {
            true
        } else if opt_is(u, "byte") {
            false
        } else {
            return Err(SYNTAX_ERR);
        };
    }
    let end_given = range.len() >= 2;
    if end_given {
        end = parse_i64(&range[1])?;
    }
    let Some((first, last)) = bit_range(p.len(), start, end, bit_units) else {
        return Ok(-1);
    };
    Ok(match find_bit(p, first, last, bit) {
        Some(pos) => pos as i64,
        None if bit || end_given => -1,
        // Looking for a clear bit with no end given: the string reads as padded with
        // zeros, so the answer is the first bit past it.
        None => last as i64 + 1,
    })
}

/// BITPOS key bit [start [end [BYTE|BIT]]]
pub fn bitpos(ctx: &mut ExecCtx, args: &[Bytes]) {
    let bit = match parse_i64(&args[2]) {
        Ok(b @ (0 | 1)) => b == 1,
        Ok(_) => return ctx.out.error(BITPOS_BIT_ERR),
        Err(e) => return ctx.out.error(e),
    };
    let (entry, out) = lookup(ctx, &args[1]);
    let Some(e) = entry else {
        return out.int(if bit { -1 } else { 0 });
    };
    let Some(s) = str_ref(&e.value) else {
        return out.error(WRONGTYPE);
    };
    let mut scratch = [0u8; 20];
    reply_int(out, bitpos_of(s.as_bytes(&mut scratch), bit, &args[3..]));
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BitOp {
    And,
    Or,
    Xor,
    Not,
}

fn parse_bitop(args: &[Bytes]) -> Result<BitOp, &'static str> {
    let name = &args[1][..];
    let op = if opt_is(name, "and") {
        BitOp::And
    } else if opt_is(name, "or") {
        BitOp::Or
    } else if opt_is(name, "xor") {
        BitOp::Xor
    } else if opt_is(name, "not") {
        BitOp::Not
    } else {
        return Err(SYNTAX_ERR);
    };
    if op == BitOp::Not && args.len() != 4 {
        return Err(BITOP_NOT_ERR);
    }
    Ok(op)
}

/// The result of a BITOP over `sources` (missing keys as empty strings, all shorter
/// strings padded with zeros to the longest).
fn bitop_compute(op: BitOp, sources: &[Option<Vec<u8>>]) -> Vec<u8> {
    let src = |i: usize| sources[i].as_deref().unwrap_or(b"");
    let maxlen = (0..sources.len()).map(|i| src(i).len()).max().unwrap_or(0);
    let mut res = vec![0u8; maxlen];
    res[..src(0).len()].copy_from_slice(src(0));
    if op == BitOp::Not {
        res.iter_mut().for_each(|b| *b = !*b);
        return res;
    }
    for i in 1..sources.len() {
        let s = src(i);
        match op {
            BitOp::And => {
                for (r, x) in res.iter_mut().zip(s.iter().chain(std::iter::repeat(&0))) {
                    *r &= x;
                }
            }
            BitOp::Or => res.iter_mut().zip(s).for_each(|(r, x)| *r |= x),
            BitOp::Xor => res.iter_mut().zip(s).for_each(|(r, x)| *r ^= x),
            BitOp::Not => unreachable!("NOT has a single source"),
        }
    }
    res
}

/// Stores a BITOP result at `dest` (an empty result deletes it); returns its length.
fn bitop_store(ctx: &mut ExecCtx, dest: &[u8], res: Vec<u8>) -> i64 {
    let len = res.len() as i64;
    if res.is_empty() {
        if ctx.delete(dest) {
            ctx.notify(b'g', "del", dest);
        }
    } else {
        ctx.set(dest, built(res), 0);
        ctx.notify(b'$', "set", dest);
    }
    len
}

/// BITOP AND|OR|XOR|NOT destkey key [key ...]
pub fn bitop(ctx: &mut ExecCtx, args: &[Bytes]) {
    let op = match parse_bitop(args) {
        Ok(op) => op,
        Err(e) => return ctx.out.error(e),
    };
    let mut sources = Vec::with_capacity(args.len() - 3);
    for key in &args[3..] {
        match read_string(ctx, key) {
            Ok(v) => sources.push(v),
            Err(()) => return ctx.out.error(WRONGTYPE),
        }
    }
    let n = bitop_store(ctx, &args[2], bitop_compute(op, &sources));
    ctx.out.int(n);
}

crate::cross_handler!(bitop_cross, |sess, args, tx| {
    let op = match parse_bitop(&args) {
        Ok(op) => op,
        Err(e) => {
            sess.out.error(e);
            return;
        }
    };
    let db = sess.db;
    let mut sources: Vec<Option<Vec<u8>>> = vec![None; args.len()];
    for (shard, positions) in by_shard(&sess.worker, &args, 3..args.len()) {
        let keys = pick(&args, &positions);
        let read = tx
            .run(shard, move |sh: &mut Shard| {
                sh.with_ctx(db, |ctx| {
                    keys.iter()
                        .map(|k| read_string(ctx, k))
                        .collect::<Result<Vec<_>, ()>>()
                })
            })
            .await;
        match read {
            Ok(values) => {
                for (p, v) in positions.into_iter().zip(values) {
                    sources[p] = v;
                }
            }
            Err(()) => {
                sess.out.error(WRONGTYPE);
                return;
            }
        }
    }
    let res = bitop_compute(op, &sources[3..]);
    let dest = args[2].clone();
    let shard = sess.worker.shard_of(&dest);
    let n = tx
        .run(shard, move |sh: &mut Shard| {
            sh.with_ctx(db, |ctx| bitop_store(ctx, &dest, res))
        })
        .await;
    sess.out.int(n);
});

// ---------------------------------------------------------------------------------------
// BITFIELD
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FieldOp {
    Get,
    Set(i64),
    Incr(i64),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Field {
    op: FieldOp,
    signed: bool,
    bits: u32,
    offset: u64,
    overflow: Overflow,
}

/// A bitfield type: `i1`..`i64` or `u1`..`u63` (lowercase; the argument ends at a NUL
/// as in C).
fn field_type(arg: &[u8]) -> Result<(bool, u32), &'static str> {
    let signed = match arg.first() {
        Some(b'i') => true,
        Some(b'u') => false,
        _ => return Err(BITFIELD_TYPE_ERR),
    };
    let rest = &arg[1..];
    let rest = &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())];
    match parse_canonical_i64(rest) {
        Some(n) if n >= 1 && (n <= 63 || (signed && n == 64)) => Ok((signed, n as u32)),
        _ => Err(BITFIELD_TYPE_ERR),
    }
}

/// Parses BITFIELD's operations; also returns the highest bit a write touches (None for
/// a read-only list).
fn parse_bitfield(args: &[Bytes], max: u64) -> Result<(Vec<Field>, Option<u64>), &'static str> {
    let mut fields = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut highest: Option<u64> = None;
    let mut j = 2;
    while j < args.len() {
        let remaining = args.len() - j - 1;
        let sub = &args[j][..];
        let is_get = opt_is(sub, "get") && remaining >= 2;
        let is_set = opt_is(sub, "set") && remaining >= 3;
        let is_incr = opt_is(sub, "incrby") && remaining >= 3;
        if !is_get && !is_set && !is_incr {
            if opt_is(sub, "overflow") && remaining >= 1 {
                let mode = &args[j + 1][..];
                overflow = if opt_is(mode, "wrap") {
                    Overflow::Wrap
                } else if opt_is(mode, "sat") {
                    Overflow::Sat
                } else if opt_is(mode, "fail") {
                    Overflow::Fail
                } else {
                    return Err(BITFIELD_OVERFLOW_ERR);
                };
                j += 2;
                continue;
            }
            return Err(SYNTAX_ERR);
        }
        let (signed, bits) = field_type(&args[j + 1])?;
        let offset = bit_offset(&args[j + 2], bits, max)?;
        let op = if is_get {
            FieldOp::Get
        } else {
            let last = offset + bits as u64 - 1;
            highest = Some(highest.map_or(last, |h| h.max(last)));
            let v = parse_i64(&args[j + 3])?;
            if is_set {
                FieldOp::Set(v)
            } else {
                FieldOp::Incr(v)
            }
        };
        fields.push(Field {
            op,
            signed,
            bits,
            offset,
            overflow,
        });
        j += if is_get { 3 } else { 4 };
    }
    Ok((fields, highest))
}

/// Reads `bits` bits (1..=64) at bit `offset`, most significant first; bits past the end
/// of `p` read as zero.
fn get_unsigned(p: &[u8], offset: u64, bits: u32) -> u64 {
    let byte = (offset >> 3) as usize;
    let mut acc: u128 = 0;
    for i in 0..9 {
        acc = (acc << 8) | p.get(byte + i).copied().unwrap_or(0) as u128;
    }
    // The 72 bits read sit at the bottom of `acc`: lift the wanted ones to the top.
    ((acc << (56 + (offset & 7) as u32)) >> (128 - bits)) as u64
}

fn get_signed(p: &[u8], offset: u64, bits: u32) -> i64 {
    let u = get_unsigned(p, offset, bits);
    let spare = 64 - bits;
    ((u << spare) as i64) >> spare
}

/// Writes the low `bits` bits of `value` at bit `offset`; `p` must cover them.
fn set_field(p: &mut [u8], offset: u64, bits: u32, value: u64) {
    for i in 0..bits as u64 {
        let bit = (value >> (bits as u64 - 1 - i)) & 1;
        let pos = offset + i;
        let byte = (pos >> 3) as usize;
        let mask = 0x80u8 >> (pos & 7);
        if bit == 1 {
            p[byte] |= mask;
        } else {
            p[byte] &= !mask;
        }
    }
}

/// The signed value to store for `value + incr` in a field of `bits` bits, or None when
/// it overflows under FAIL. The overflow test is Redis's, including its treatment of SET
/// values far below the range (they count as overflowing upwards for SAT).
fn signed_result(value: i64, incr: i64, bits: u32, mode: Overflow) -> Option<i64> {
    let max: i64 = if bits == 64 {
        i64::MAX
    } else {
        (1i64 << (bits - 1)) - 1
    };
    let min = -max - 1;
    let max_incr = (max as u64).wrapping_sub(value as u64) as i64;
    let min_incr = min.wrapping_sub(value);
    let up = value > max
        || (bits != 64 && incr > max_incr)
        || (value >= 0 && incr > 0 && incr > max_incr);
    let down = !up
        && (value < min
            || (bits != 64 && incr < min_incr)
            || (value < 0 && incr < 0 && incr < min_incr));
    if !up && !down {
        return Some(value.wrapping_add(incr));
    }
    match mode {
        Overflow::Fail => None,
        Overflow::Sat => Some(if up { max } else { min }),
        Overflow::Wrap => {
            let sum = (value as u64).wrapping_add(incr as u64);
            let spare = 64 - bits;
            Some(((sum << spare) as i64) >> spare)
        }
    }
}

/// The unsigned counterpart of `signed_result` (fields of 1..=63 bits). A negative SET
/// value is a huge unsigned one, so it overflows upwards.
fn unsigned_result(value: u64, incr: i64, bits: u32, mode: Overflow) -> Option<u64> {
    let max: u64 = (1u64 << bits) - 1;
    let max_incr = max.wrapping_sub(value) as i64;
    let min_incr = (value as i64).wrapping_neg();
    let up = value > max || (incr > 0 && incr > max_incr);
    let down = !up && incr < 0 && incr < min_incr;
    if !up && !down {
        return Some(value.wrapping_add(incr as u64));
    }
    match mode {
        Overflow::Fail => None,
        Overflow::Sat => Some(if up { max } else { 0 }),
        Overflow::Wrap => Some(value.wrapping_add(incr as u64) & max),
    }
}

/// Runs one field operation on `p` (long enough for any write): the reply value, or
/// None for an overflow under FAIL (nothing written then).
fn run_field(p: &mut [u8], f: &Field) -> Option<i64> {
    let (arg, is_set) = match f.op {
        FieldOp::Get => {
            return Some(if f.signed {
                get_signed(p, f.offset, f.bits)
            } else {
                get_unsigned(p, f.offset, f.bits) as i64
            })
        }
        FieldOp::Set(v) => (v, true),
        FieldOp::Incr(v) => (v, false),
    };
    if f.signed {
        let old = get_signed(p, f.offset, f.bits);
        let new = if is_set {
            signed_result(arg, 0, f.bits, f.overflow)?
        } else {
            signed_result(old, arg, f.bits, f.overflow)?
        };
        set_field(p, f.offset, f.bits, new as u64);
        Some(if is_set { old } else { new })
    } else {
        let old = get_unsigned(p, f.offset, f.bits);
        let new = if is_set {
            unsigned_result(arg as u64, 0, f.bits, f.overflow)?
        } else {
            unsigned_result(old, arg, f.bits, f.overflow)?
        };
        set_field(p, f.offset, f.bits, new);
        Some(if is_set { old as i64 } else { new as i64 })
    }
}

fn reply_fields(out: &mut Reply, results: &[Option<i64>]) {
    out.array(results.len());
    for r in results {
        match r {
            Some(v) => out.int(*v),
            None => out.null(),
        }
    }
}

fn bitfield_generic(ctx: &mut ExecCtx, args: &[Bytes], read_only_cmd: bool) {
    let (fields, highest) = match parse_bitfield(args, max_bulk(&ctx.shard.shared)) {
        Ok(x) => x,
        Err(e) => return ctx.out.error(e),
    };
    let key = &args[1][..];
    let Some(highest) = highest else {
        // Only GETs: read, a missing key reading as zeros.
        let (entry, out) = lookup(ctx, key);
        let mut scratch = [0u8; 20];
        let bytes: &[u8] = match entry {
            None => b"",
            Some(e) => match str_ref(&e.value) {
                Some(s) => s.as_bytes(&mut scratch),
                None => return out.error(WRONGTYPE),
            },
        };
        out.array(fields.len());
        for f in &fields {
            out.int(if f.signed {
                get_signed(bytes, f.offset, f.bits)
            } else {
                get_unsigned(bytes, f.offset, f.bits) as i64
            });
        }
        return;
    };
    if read_only_cmd {
        return ctx.out.error(BITFIELD_RO_ERR);
    }
    let need = (highest >> 3) as usize + 1;
    let results: Vec<Option<i64>> = match ctx.get(key) {
        Some(e) => {
            let Some(s) = str_mut(&mut e.value) else {
                return ctx.out.error(WRONGTYPE);
            };
            let v = s.make_mut();
            if v.len() < need {
                v.resize(need, 0);
            }
            let r = fields.iter().map(|f| run_field(v, f)).collect();
            ctx.modified(key);
            ctx.notify(b'$', "setbit", key);
            r
        }
        None => {
            let mut v = vec![0u8; need];
            let r = fields.iter().map(|f| run_field(&mut v, f)).collect();
            ctx.set(key, built(v), 0);
            ctx.notify(b'$', "setbit", key);
            r
        }
    };
    reply_fields(ctx.out, &results);
}

/// BITFIELD key [GET type offset] [SET type offset value] [INCRBY type offset incr]
/// [OVERFLOW WRAP|SAT|FAIL] ...
pub fn bitfield(ctx: &mut ExecCtx, args: &[Bytes]) {
    bitfield_generic(ctx, args, false);
}

/// BITFIELD_RO key [GET type offset] ...
pub fn bitfield_ro(ctx: &mut ExecCtx, args: &[Bytes]) {
    bitfield_generic(ctx, args, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    type Handler = fn(&mut ExecCtx, &[Bytes]);

    fn shard() -> Shard {
        Shard::for_tests(1)
    }

    fn argv(args: &[&[u8]]) -> Vec<Bytes> {
        args.iter().map(|a| Bytes::copy_from_slice(a)).collect()
    }

    /// Runs a handler on `sh` and returns its raw RESP2 reply.
    fn run(sh: &mut Shard, f: Handler, args: &[&str]) -> String {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        runb(sh, f, &args)
    }

    fn runb(sh: &mut Shard, f: Handler, args: &[&[u8]]) -> String {
        let args = argv(args);
        let mut out = Reply::new(false);
        let mut ctx = sh.ctx(0, &mut out);
        f(&mut ctx, &args);
        String::from_utf8_lossy(&out.buf).into_owned()
    }

    fn expire_of(sh: &Shard, key: &str) -> Option<u64> {
        sh.dbs[0].table.get(key.as_bytes()).map(|e| e.expire_at())
    }

    fn encoding_of(sh: &Shard, key: &str) -> &'static str {
        sh.dbs[0]
            .table
            .get(key.as_bytes())
            .unwrap()
            .value
            .encoding()
    }

    fn b(v: &[&str]) -> Vec<Bytes> {
        v.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    // --- bitfield ----------------------------------------------------------------------

    /// Reference model: bit-by-bit reads and exact (i128) arithmetic.
    fn model_get(p: &[u8], offset: u64, bits: u32, signed: bool) -> i128 {
        let mut v: i128 = 0;
        for i in 0..bits as u64 {
            v = (v << 1) | bit_at(p, offset + i) as i128;
        }
        if signed && v >= 1i128 << (bits - 1) {
            v -= 1i128 << bits;
        }
        v
    }

    fn model_limits(bits: u32, signed: bool) -> (i128, i128) {
        if signed {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        } else {
            (0, (1i128 << bits) - 1)
        }
    }

    fn model_fit(v: i128, bits: u32, signed: bool, mode: Overflow) -> Option<i128> {
        let (min, max) = model_limits(bits, signed);
        if (min..=max).contains(&v) {
            return Some(v);
        }
        match mode {
            Overflow::Fail => None,
            Overflow::Sat => Some(if v > max { max } else { min }),
            Overflow::Wrap => {
                let m = v.rem_euclid(1i128 << bits);
                Some(if signed && m > max {
                    m - (1i128 << bits)
                } else {
                    m
                })
            }
        }
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn bitfield_matches_model_for_every_width_and_mode() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for bits in 1..=64u32 {
            for signed in [true, false] {
                if !signed && bits == 64 {
                    continue;
                }
                for mode in [Overflow::Wrap, Overflow::Sat, Overflow::Fail] {
                    for _ in 0..40 {
                        let mut p: Vec<u8> = (0..20).map(|_| rng.next() as u8).collect();
                        let offset = rng.next() % 60 + (bits as u64 % 2); // odd and even
                        let (min, max) = model_limits(bits, signed);
                        let old = model_get(&p, offset, bits, signed);
                        let got = if signed {
                            get_signed(&p, offset, bits) as i128
                        } else {
                            get_unsigned(&p, offset, bits) as i128
                        };
                        assert_eq!(got, old, "get bits={bits} signed={signed}");
                        // INCRBY by a value that sometimes overflows.
                        let incr = match rng.next() % 4 {
                            0 => (rng.next() % 8) as i64 - 4,
                            1 => rng.next() as i64,
                            2 => (max - old + 1).clamp(i64::MIN as i128, i64::MAX as i128) as i64,
                            _ => (min - old - 1).clamp(i64::MIN as i128, i64::MAX as i128) as i64,
                        };
                        let f = Field {
                            op: FieldOp::Incr(incr),
                            signed,
                            bits,
                            offset,
                            overflow: mode,
                        };
                        let before = p.clone();
                        let want = model_fit(old + incr as i128, bits, signed, mode);
                        let r = run_field(&mut p, &f);
                        assert_eq!(
                            r.map(|v| v as i128),
                            want,
                            "incr bits={bits} {mode:?} old={old} incr={incr}"
                        );
                        match want {
                            None => assert_eq!(p, before),
                            Some(w) => {
                                assert_eq!(model_get(&p, offset, bits, signed), w);
                                // Bits outside the field are untouched.
                                for i in 0..160u64 {
                                    if i < offset || i >= offset + bits as u64 {
                                        assert_eq!(bit_at(&p, i), bit_at(&before, i));
                                    }
                                }
                            }
                        }
                        // SET of an in-range value returns the old value and stores it.
                        let cur = model_get(&p, offset, bits, signed);
                        let v = (min + (rng.next() as i128).rem_euclid(max - min + 1)) as i64;
                        let f = Field {
                            op: FieldOp::Set(v),
                            ..f
                        };
                        assert_eq!(run_field(&mut p, &f), Some(cur as i64));
                        assert_eq!(model_get(&p, offset, bits, signed), v as i128);
                    }
                }
            }
        }
    }

    #[test]
    fn bitfield_set_out_of_range() {
        let mut p = vec![0u8; 4];
        let set = |v: i64, signed: bool, bits: u32, mode: Overflow| Field {
            op: FieldOp::Set(v),
            signed,
            bits,
            offset: 3,
            overflow: mode,
        };
        // u8: 256 wraps to 0, saturates to 255; -1 reads as a huge unsigned: 255 both ways.
        assert_eq!(
            run_field(&mut p, &set(256, false, 8, Overflow::Wrap)),
            Some(0)
        );
        assert_eq!(get_unsigned(&p, 3, 8), 0);
        run_field(&mut p, &set(256, false, 8, Overflow::Sat));
        assert_eq!(get_unsigned(&p, 3, 8), 255);
        run_field(&mut p, &set(-1, false, 8, Overflow::Wrap));
        assert_eq!(get_unsigned(&p, 3, 8), 255);
        run_field(&mut p, &set(0, false, 8, Overflow::Wrap));
        run_field(&mut p, &set(-1, false, 8, Overflow::Sat));
        assert_eq!(get_unsigned(&p, 3, 8), 255);
        assert_eq!(run_field(&mut p, &set(-1, false, 8, Overflow::Fail)), None);
        // i8: 200 wraps to -56, -200 saturates to -128.
        run_field(&mut p, &set(200, true, 8, Overflow::Wrap));
        assert_eq!(get_signed(&p, 3, 8), -56);
        run_field(&mut p, &set(-200, true, 8, Overflow::Sat));
        assert_eq!(get_signed(&p, 3, 8), -128);
        // Redis's test counts values this far below the range as overflowing upwards.
        run_field(&mut p, &set(i64::MIN, true, 8, Overflow::Sat));
        assert_eq!(get_signed(&p, 3, 8), 127);
        // i64 INCRBY overflow.
        let mut q = vec![0u8; 9];
        let f = |op, mode| Field {
            op,
            signed: true,
            bits: 64,
            offset: 5,
            overflow: mode,
        };
        run_field(&mut q, &f(FieldOp::Set(i64::MAX), Overflow::Wrap));
        assert_eq!(
            run_field(&mut q, &f(FieldOp::Incr(1), Overflow::Wrap)),
            Some(i64::MIN)
        );
        assert_eq!(
            run_field(&mut q, &f(FieldOp::Incr(-1), Overflow::Sat)),
            Some(i64::MIN)
        );
        assert_eq!(
            run_field(&mut q, &f(FieldOp::Incr(-1), Overflow::Fail)),
            None
        );
        assert_eq!(get_signed(&q, 5, 64), i64::MIN);
    }

    #[test]
    fn bitfield_parsing_and_errors() {
        let parse = |v: &[&str]| parse_bitfield(&b(v), 512 << 20);
        let (f, hi) = parse(&[
            "bitfield", "k", "get", "u8", "#2", "incrby", "i5", "100", "1",
        ])
        .unwrap();
        assert_eq!(f[0].offset, 16);
        assert_eq!(hi, Some(104));
        assert_eq!(
            parse(&["bitfield", "k", "get", "u64", "0"]),
            Err(BITFIELD_TYPE_ERR)
        );
        assert_eq!(
            parse(&["bitfield", "k", "get", "I8", "0"]),
            Err(BITFIELD_TYPE_ERR)
        );
        assert_eq!(
            parse(&["bitfield", "k", "get", "i0", "0"]),
            Err(BITFIELD_TYPE_ERR)
        );
        assert!(parse(&["bitfield", "k", "get", "i64", "0"]).is_ok());
        assert_eq!(
            parse(&["bitfield", "k", "get", "u8", "-1"]),
            Err(BIT_OFFSET_ERR)
        );
        assert_eq!(
            parse(&["bitfield", "k", "get", "u8", "#-1"]),
            Err(BIT_OFFSET_ERR)
        );
        assert_eq!(
            parse(&["bitfield", "k", "get", "u8", "4294967296"]),
            Err(BIT_OFFSET_ERR)
        );
        assert!(parse(&["bitfield", "k", "get", "u8", "4294967295"]).is_ok());
        assert_eq!(
            parse(&["bitfield", "k", "set", "u8", "0", "x"]),
            Err(NOT_INT)
        );
        assert_eq!(parse(&["bitfield", "k", "set", "u8", "0"]), Err(SYNTAX_ERR));
        assert_eq!(
            parse(&["bitfield", "k", "overflow", "foo"]),
            Err(BITFIELD_OVERFLOW_ERR)
        );
        assert_eq!(parse(&["bitfield", "k", "overflow"]), Err(SYNTAX_ERR));
        assert_eq!(parse(&["bitfield", "k", "foo"]), Err(SYNTAX_ERR));
        assert_eq!(parse(&["bitfield", "k"]), Ok((vec![], None)));
    }

    #[test]
    fn bitfield_commands() {
        let mut sh = shard();
        let s = &mut sh;
        assert_eq!(
            run(s, bitfield, &["bitfield", "k", "get", "u8", "0"]),
            "*1\r\n:0\r\n"
        );
        assert!(s.dbs[0].table.get(b"k").is_none());
        assert_eq!(
            run(
                s,
                bitfield,
                &["bitfield", "k", "incrby", "i5", "100", "1", "get", "u4", "0"]
            ),
            "*2\r\n:1\r\n:0\r\n"
        );
        assert_eq!(encoding_of(s, "k"), "raw");
        // The documented saturating and failing counters.
        let mut replies = Vec::new();
        for _ in 0..4 {
            replies.push(run(
                s,
                bitfield,
                &[
                    "bitfield", "c", "incrby", "u2", "100", "1", "overflow", "sat", "incrby", "u2",
                    "102", "1",
                ],
            ));
        }
        assert_eq!(replies[0], "*2\r\n:1\r\n:1\r\n");
        assert_eq!(replies[2], "*2\r\n:3\r\n:3\r\n");
        assert_eq!(replies[3], "*2\r\n:0\r\n:3\r\n");
        let fail = &[
            "bitfield", "f", "overflow", "fail", "incrby", "u2", "102", "1",
        ];
        for want in [
            "*1\r\n:1\r\n",
            "*1\r\n:2\r\n",
            "*1\r\n:3\r\n",
            "*1\r\n$-1\r\n",
        ] {
            assert_eq!(run(s, bitfield, fail), want);
        }
        assert_eq!(
            run(
                s,
                bitfield_ro,
                &["bitfield_ro", "k", "get", "u8", "0", "set", "u8", "0", "1"]
            ),
            format!("-{BITFIELD_RO_ERR}\r\n")
        );
        assert_eq!(
            run(s, bitfield_ro, &["bitfield_ro", "k", "get", "i5", "100"]),
            "*1\r\n:1\r\n"
        );
        // Reads past the end are zeros; an int-encoded value reads as its digits.
        run(s, set, &["set", "n", "1"]);
        assert_eq!(
            run(
                s,
                bitfield_ro,
                &["bitfield_ro", "n", "get", "u8", "0", "get", "u8", "8"]
            ),
            "*2\r\n:49\r\n:0\r\n"
        );
        assert_eq!(encoding_of(s, "n"), "int");
    }

    // --- bit counting and searching --------------------------------------------------------

    #[test]
    fn bitcount_ranges() {
        let p = b"foobar";
        let count = |v: &[&str]| bitcount_of(p, &b(v));
        assert_eq!(count(&[]), Ok(26));
        assert_eq!(count(&["0", "0"]), Ok(4));
        assert_eq!(count(&["1", "1"]), Ok(6));
        assert_eq!(count(&["1", "1", "BYTE"]), Ok(6));
        assert_eq!(count(&["5", "30", "BIT"]), Ok(17));
        assert_eq!(count(&["-2", "-1"]), Ok(7));
        assert_eq!(count(&["-1", "-2"]), Ok(0));
        assert_eq!(count(&["-100", "100"]), Ok(26));
        assert_eq!(count(&["0", "-1", "bit"]), Ok(26));
        assert_eq!(count(&["-3", "-1", "bit"]), Ok(1)); // 'r' = 0x72 ends in 010
        assert_eq!(count(&["3", "2"]), Ok(0));
        assert_eq!(count(&["0"]), Err(SYNTAX_ERR));
        assert_eq!(count(&["0", "1", "bits"]), Err(SYNTAX_ERR));
        assert_eq!(count(&["a", "1"]), Err(NOT_INT));
        assert_eq!(count(&["0", "1", "bit", "x"]), Err(SYNTAX_ERR));
        assert_eq!(bitcount_of(b"", &b(&["0", "-1"])), Ok(0));
        // Every single-bit range agrees with bit_at.
        for first in 0..48u64 {
            for last in first..48 {
                let want = (first..=last).filter(|&i| bit_at(p, i)).count() as u64;
                assert_eq!(count_bits(p, first, last), want);
            }
        }
    }

    #[test]
    fn bitpos_ranges() {
        let pos = |p: &[u8], bit: bool, v: &[&str]| bitpos_of(p, bit, &b(v));
        assert_eq!(pos(b"\xff\xf0\x00", false, &[]), Ok(12));
        assert_eq!(pos(b"\x00\xff\xf0", true, &["0"]), Ok(8));
        assert_eq!(pos(b"\x00\xff\xf0", true, &["2"]), Ok(16));
        assert_eq!(pos(b"\x00\xff\xf0", true, &["2", "-1", "BYTE"]), Ok(16));
        assert_eq!(pos(b"\x00\xff\xf0", true, &["7", "15", "BIT"]), Ok(8));
        assert_eq!(pos(b"\x00\xff\xf0", true, &["7", "-3", "bit"]), Ok(8));
        assert_eq!(pos(b"\x00\x00\x00", true, &[]), Ok(-1));
        assert_eq!(pos(b"\x00\x00\x00", true, &["7", "-3", "BIT"]), Ok(-1));
        // Clear bits: past the end when no end is given, -1 when one is.
        assert_eq!(pos(b"\xff\xff\xff", false, &[]), Ok(24));
        assert_eq!(pos(b"\xff\xff\xff", false, &["1"]), Ok(24));
        assert_eq!(pos(b"\xff\xff\xff", false, &["0", "-1"]), Ok(-1));
        assert_eq!(pos(b"\xff\xff\xff", false, &["0", "100"]), Ok(-1));
        assert_eq!(pos(b"\xff\xff\xff", false, &["3", "5", "bit"]), Ok(-1));
        assert_eq!(pos(b"\xff\xfe\xff", false, &["3", "-1", "bit"]), Ok(15));
        assert_eq!(pos(b"", false, &[]), Ok(-1));
        assert_eq!(pos(b"", true, &[]), Ok(-1));
        assert_eq!(pos(b"\xff", true, &["2", "1"]), Ok(-1));
        assert_eq!(pos(b"\x01", true, &["0", "0", "x"]), Err(SYNTAX_ERR));
        assert_eq!(pos(b"\x01", true, &["0", "y", "x"]), Err(SYNTAX_ERR));
        assert_eq!(pos(b"\x01", true, &["0", "y", "bit"]), Err(NOT_INT));
        assert_eq!(pos(b"\x01", true, &["0", "0", "bit", "x"]), Err(SYNTAX_ERR));
        // Exhaustive agreement with a bit-by-bit search on a long pattern.
        let mut p = vec![0u8; 40];
        p[17] = 0x10;
        p[30] = 0xef;
        let q: Vec<u8> = p.iter().map(|x| !x).collect();
        for first in (0..320u64).step_by(3) {
            for last in (first..320).step_by(5) {
                let want = (first..=last).find(|&i| bit_at(&p, i));
                assert_eq!(find_bit(&p, first, last, true), want);
                let want0 = (first..=last).find(|&i| !bit_at(&q, i));
                assert_eq!(find_bit(&q, first, last, false), want0);
            }
        }
    }

    #[test]
    fn bit_commands() {
        let mut sh = shard();
        let s = &mut sh;
        assert_eq!(run(s, setbit, &["setbit", "k", "7", "1"]), ":0\r\n");
        assert_eq!(run(s, setbit, &["setbit", "k", "7", "1"]), ":1\r\n");
        assert_eq!(run(s, get, &["get", "k"]), "$1\r\n\x01\r\n");
        assert_eq!(
            run(s, setbit, &["setbit", "k", "x", "1"]),
            format!("-{BIT_OFFSET_ERR}\r\n")
        );
        assert_eq!(
            run(s, setbit, &["setbit", "k", "-1", "1"]),
            format!("-{BIT_OFFSET_ERR}\r\n")
        );
        assert_eq!(
            run(s, setbit, &["setbit", "k", "4294967296", "1"]),
            format!("-{BIT_OFFSET_ERR}\r\n")
        );
        assert_eq!(
            run(s, setbit, &["setbit", "k", "1", "2"]),
            format!("-{BIT_VALUE_ERR}\r\n")
        );
        assert_eq!(
            run(s, setbit, &["setbit", "k", "1", "-1"]),
            format!("-{BIT_VALUE_ERR}\r\n")
        );
        assert_eq!(run(s, getbit, &["getbit", "k", "7"]), ":1\r\n");
        assert_eq!(run(s, getbit, &["getbit", "k", "100"]), ":0\r\n");
        assert_eq!(run(s, getbit, &["getbit", "nokey", "100"]), ":0\r\n");
        assert_eq!(
            run(s, getbit, &["getbit", "nokey", "-1"]),
            format!("-{BIT_OFFSET_ERR}\r\n")
        );
        // SETBIT keeps the TTL and makes the value raw.
        run(s, set, &["set", "t", "12", "ex", "100"]);
        assert_eq!(encoding_of(s, "t"), "int");
        run(s, setbit, &["setbit", "t", "0", "0"]);
        assert_eq!(encoding_of(s, "t"), "raw");
        assert!(expire_of(s, "t").unwrap() > 0);
        // BITCOUNT and BITPOS look the key up first (Redis 7.2).
        assert_eq!(run(s, bitcount, &["bitcount", "nokey", "0"]), ":0\r\n");
        assert_eq!(
            run(s, bitcount, &["bitcount", "k", "0"]),
            "-ERR syntax error\r\n"
        );
        assert_eq!(run(s, bitcount, &["bitcount", "k"]), ":1\r\n");
        assert_eq!(run(s, bitpos, &["bitpos", "nokey", "1", "x"]), ":-1\r\n");
        assert_eq!(run(s, bitpos, &["bitpos", "nokey", "0"]), ":0\r\n");
        assert_eq!(
            run(s, bitpos, &["bitpos", "nokey", "2"]),
            format!("-{BITPOS_BIT_ERR}\r\n")
        );
        assert_eq!(run(s, bitpos, &["bitpos", "k", "1"]), ":7\r\n");
        assert_eq!(
            run(s, bitpos, &["bitpos", "k", "1", "0", "-1", "bit", "x"]),
            "-ERR syntax error\r\n"
        );
        // BITOP.
        run(s, set, &["set", "a", "abc"]);
        run(s, set, &["set", "bb", "\u{1}"]);
        assert_eq!(run(s, bitop, &["bitop", "and", "d", "a", "bb"]), ":3\r\n");
        assert_eq!(run(s, get, &["get", "d"]), "$3\r\n\x01\x00\x00\r\n");
        assert_eq!(
            run(s, bitop, &["bitop", "or", "d", "a", "bb", "missing"]),
            ":3\r\n"
        );
        assert_eq!(run(s, get, &["get", "d"]), "$3\r\nabc\r\n");
        assert_eq!(run(s, bitop, &["bitop", "xor", "d", "a", "a"]), ":3\r\n");
        assert_eq!(run(s, get, &["get", "d"]), "$3\r\n\x00\x00\x00\r\n");
        assert_eq!(runb(s, bitop, &[b"bitop", b"not", b"d", b"bb"]), ":1\r\n");
        assert_eq!(runb(s, get, &[b"get", b"d"]), "$1\r\n\u{fffd}\r\n");
        assert_eq!(
            run(s, bitop, &["bitop", "not", "d", "a", "bb"]),
            format!("-{BITOP_NOT_ERR}\r\n")
        );
        assert_eq!(
            run(s, bitop, &["bitop", "nand", "d", "a"]),
            "-ERR syntax error\r\n"
        );
        assert_eq!(run(s, bitop, &["bitop", "and", "d", "m1", "m2"]), ":0\r\n");
        assert!(s.dbs[0].table.get(b"d").is_none());
        assert_eq!(
            bitop_compute(
                BitOp::And,
                &[Some(b"\xff\xff".to_vec()), Some(b"\x0f".to_vec())]
            ),
            b"\x0f\x00"
        );
        assert_eq!(
            bitop_compute(BitOp::Or, &[None, Some(b"\x0f".to_vec())]),
            b"\x0f"
        );
    }

    // --- LCS ---------------------------------------------------------------------------

    #[test]
    fn lcs_matches_redis_examples() {
        let r = lcs_compute(b"ohmytext", b"mynewtext", true);
        assert_eq!(r.seq, b"mytext");
        assert_eq!(r.len, 6);
        assert_eq!(
            r.ranges,
            vec![
                LcsRange {
                    a: (4, 7),
                    b: (5, 8)
                },
                LcsRange {
                    a: (2, 3),
                    b: (0, 1)
                }
            ]
        );
        assert_eq!(lcs_compute(b"ohmytext", b"mynewtext", false).len, 6);
        assert_eq!(lcs_compute(b"", b"abc", true).len, 0);
        assert_eq!(
            lcs_compute(b"abc", b"abc", true).ranges,
            vec![LcsRange {
                a: (0, 2),
                b: (0, 2)
            }]
        );
        // Length-only and full computations agree.
        let mut rng = Rng(42);
        for _ in 0..200 {
            let a: Vec<u8> = (0..rng.next() % 30)
                .map(|_| b'a' + (rng.next() % 3) as u8)
                .collect();
            let c: Vec<u8> = (0..rng.next() % 30)
                .map(|_| b'a' + (rng.next() % 3) as u8)
                .collect();
            let full = lcs_compute(&a, &c, true);
            assert_eq!(full.len, lcs_compute(&a, &c, false).len);
            assert_eq!(full.seq.len(), full.len);
            let covered: usize = full.ranges.iter().map(|m| m.len()).sum();
            assert_eq!(covered, full.len);
        }
    }

    #[test]
    fn lcs_command_replies() {
        let mut sh = shard();
        let s = &mut sh;
        run(s, set, &["set", "key1", "ohmytext"]);
        run(s, set, &["set", "key2", "mynewtext"]);
        assert_eq!(run(s, lcs, &["lcs", "key1", "key2"]), "$6\r\nmytext\r\n");
        assert_eq!(run(s, lcs, &["lcs", "key1", "key2", "LEN"]), ":6\r\n");
        assert_eq!(
            run(s, lcs, &["lcs", "key1", "key2", "IDX"]),
            "*4\r\n$7\r\nmatches\r\n*2\r\n*2\r\n*2\r\n:4\r\n:7\r\n*2\r\n:5\r\n:8\r\n*2\r\n*2\r\n:2\r\n:3\r\n*2\r\n:0\r\n:1\r\n$3\r\nlen\r\n:6\r\n"
        );
        assert_eq!(
            run(s, lcs, &["lcs", "key1", "key2", "IDX", "MINMATCHLEN", "4", "WITHMATCHLEN"]),
            "*4\r\n$7\r\nmatches\r\n*1\r\n*3\r\n*2\r\n:4\r\n:7\r\n*2\r\n:5\r\n:8\r\n:4\r\n$3\r\nlen\r\n:6\r\n"
        );
        assert_eq!(
            run(s, lcs, &["lcs", "key1", "key2", "IDX", "LEN"]),
            format!("-{LCS_BOTH_ERR}\r\n")
        );
        assert_eq!(
            run(s, lcs, &["lcs", "key1", "key2", "MINMATCHLEN"]),
            "-ERR syntax error\r\n"
        );
        assert_eq!(
            run(s, lcs, &["lcs", "key1", "key2", "MINMATCHLEN", "x"]),
            format!("-{NOT_INT}\r\n")
        );
        assert_eq!(run(s, lcs, &["lcs", "key1", "nokey"]), "$0\r\n\r\n");
        let big = "a".repeat(12000);
        run(s, set, &["set", "big", &big]);
        assert_eq!(
            run(s, lcs, &["lcs", "big", "big", "LEN"]),
            format!("-{LCS_MEMORY_ERR}\r\n")
        );
    }

    // --- SET family and counters ----------------------------------------------------------

    #[test]
    fn set_option_rules() {
        let ok = |v: &[&str], set: bool| parse_set_options(&b(v), set).is_ok();
        assert!(ok(&["nx", "get", "ex", "10"], true));
        assert!(ok(&["NX", "nx"], true));
        assert!(ok(&["ex", "1", "EX", "2"], true));
        assert!(ok(&["keepttl", "xx"], true));
        assert!(!ok(&["nx", "xx"], true));
        assert!(!ok(&["xx", "nx"], true));
        assert!(!ok(&["ex", "1", "px", "2"], true));
        assert!(!ok(&["keepttl", "ex", "1"], true));
        assert!(!ok(&["px", "1", "keepttl"], true));
        assert!(!ok(&["ex"], true));
        assert!(!ok(&["persist"], true));
        assert!(!ok(&["foo"], true));
        assert!(ok(&["persist"], false));
        assert!(ok(&["exat", "1"], false));
        assert!(!ok(&["persist", "ex", "1"], false));
        assert!(!ok(&["keepttl"], false));
        assert!(!ok(&["get"], false));
        assert!(!ok(&["nx"], false));
        let args = b(&["ex", "x", "ex", "20"]);
        let o = parse_set_options(&args, true).unwrap();
        assert_eq!(o.expire, Some((ExpireKind::Ex, &b"20"[..])));
    }

    #[test]
    fn expire_arguments() {
        let now = 1_700_000_000_000;
        assert_eq!(expire_at(b"10", ExpireKind::Ex, now), Ok(now + 10_000));
        assert_eq!(expire_at(b"10", ExpireKind::Px, now), Ok(now + 10));
        assert_eq!(expire_at(b"10", ExpireKind::ExAt, now), Ok(10_000));
        assert_eq!(expire_at(b"10", ExpireKind::PxAt, now), Ok(10));
        assert_eq!(
            expire_at(b"0", ExpireKind::Ex, now),
            Err(ExpireError::Invalid)
        );
        assert_eq!(
            expire_at(b"-5", ExpireKind::PxAt, now),
            Err(ExpireError::Invalid)
        );
        assert_eq!(
            expire_at(b"x", ExpireKind::Ex, now),
            Err(ExpireError::NotInt)
        );
        assert_eq!(
            expire_at(b"9223372036854775", ExpireKind::ExAt, now),
            Ok(9_223_372_036_854_775_000)
        );
        assert_eq!(
            expire_at(b"9223372036854776", ExpireKind::ExAt, now),
            Err(ExpireError::Invalid)
        );
        assert_eq!(
            expire_at(b"9223372036854775807", ExpireKind::Px, now),
            Err(ExpireError::Invalid)
        );
        assert_eq!(
            expire_at(b"9223372036854775807", ExpireKind::PxAt, now),
            Ok(i64::MAX as u64)
        );
    }

    #[test]
    fn set_family_commands() {
        let mut sh = shard();
        let s = &mut sh;
        assert_eq!(run(s, set, &["set", "k", "v"]), "+OK\r\n");
        assert_eq!(run(s, get, &["get", "k"]), "$1\r\nv\r\n");
        assert_eq!(run(s, get, &["get", "nokey"]), "$-1\r\n");
        assert_eq!(run(s, set, &["set", "k", "v2", "nx"]), "$-1\r\n");
        assert_eq!(run(s, set, &["set", "k", "v2", "nx", "get"]), "$1\r\nv\r\n");
        assert_eq!(run(s, set, &["set", "k", "v2", "xx", "get"]), "$1\r\nv\r\n");
        assert_eq!(run(s, get, &["get", "k"]), "$2\r\nv2\r\n");
        assert_eq!(run(s, set, &["set", "n", "v", "xx"]), "$-1\r\n");
        assert_eq!(run(s, set, &["set", "n", "v", "get"]), "$-1\r\n");
        assert_eq!(
            run(s, set, &["set", "k", "v", "ex", "0"]),
            "-ERR invalid expire time in 'set' command\r\n"
        );
        assert_eq!(
            run(s, set, &["set", "k", "v", "px", "-1"]),
            "-ERR invalid expire time in 'set' command\r\n"
        );
        assert_eq!(
            run(s, set, &["set", "k", "v", "ex", "1.5"]),
            format!("-{NOT_INT}\r\n")
        );
        assert_eq!(
            run(s, set, &["set", "k", "v", "ex", "9223372036854775807"]),
            "-ERR invalid expire time in 'set' command\r\n"
        );
        assert_eq!(
            run(s, set, &["set", "k", "v", "nx", "xx"]),
            "-ERR syntax error\r\n"
        );
        // TTLs: EX sets, KEEPTTL keeps, plain SET clears.
        run(s, set, &["set", "k", "v", "ex", "100"]);
        let t = expire_of(s, "k").unwrap();
        assert!(t > 0);
        run(s, set, &["set", "k", "w", "keepttl"]);
        assert_eq!(expire_of(s, "k"), Some(t));
        run(s, set, &["set", "k", "w"]);
        assert_eq!(expire_of(s, "k"), Some(0));
        // A past absolute time leaves nothing readable.
        assert_eq!(run(s, set, &["set", "p", "v", "pxat", "1"]), "+OK\r\n");
        assert_eq!(run(s, get, &["get", "p"]), "$-1\r\n");
        // SETNX / SETEX / PSETEX.
        assert_eq!(run(s, setnx, &["setnx", "x", "1"]), ":1\r\n");
        assert_eq!(run(s, setnx, &["setnx", "x", "2"]), ":0\r\n");
        assert_eq!(
            run(s, setex, &["setex", "x", "0", "v"]),
            "-ERR invalid expire time in 'setex' command\r\n"
        );
        assert_eq!(
            run(s, psetex, &["psetex", "x", "-3", "v"]),
            "-ERR invalid expire time in 'psetex' command\r\n"
        );
        assert_eq!(
            run(s, setex, &["setex", "x", "abc", "v"]),
            format!("-{NOT_INT}\r\n")
        );
        assert_eq!(run(s, setex, &["setex", "x", "100", "v"]), "+OK\r\n");
        assert!(expire_of(s, "x").unwrap() > 0);
        // GETSET clears the TTL; GETDEL deletes.
        assert_eq!(run(s, getset, &["getset", "x", "w"]), "$1\r\nv\r\n");
        assert_eq!(expire_of(s, "x"), Some(0));
        assert_eq!(run(s, getset, &["getset", "newkey", "w"]), "$-1\r\n");
        assert_eq!(run(s, getdel, &["getdel", "x"]), "$1\r\nw\r\n");
        assert_eq!(run(s, getdel, &["getdel", "x"]), "$-1\r\n");
        // Encodings follow Redis.
        run(s, set, &["set", "e", "12345"]);
        assert_eq!(encoding_of(s, "e"), "int");
        run(s, set, &["set", "e", "012"]);
        assert_eq!(encoding_of(s, "e"), "embstr");
    }

    #[test]
    fn getex_variants() {
        let mut sh = shard();
        let s = &mut sh;
        assert_eq!(run(s, getex, &["getex", "k", "ex", "-1"]), "$-1\r\n");
        run(s, set, &["set", "k", "v"]);
        assert_eq!(
            run(s, getex, &["getex", "k", "ex", "-1"]),
            "-ERR invalid expire time in 'getex' command\r\n"
        );
        assert_eq!(
            run(s, getex, &["getex", "k", "keepttl"]),
            "-ERR syntax error\r\n"
        );
        assert_eq!(run(s, getex, &["getex", "k", "ex", "100"]), "$1\r\nv\r\n");
        assert!(expire_of(s, "k").unwrap() > 0);
        assert_eq!(run(s, getex, &["getex", "k", "persist"]), "$1\r\nv\r\n");
        assert_eq!(expire_of(s, "k"), Some(0));
        assert_eq!(run(s, getex, &["getex", "k"]), "$1\r\nv\r\n");
        assert_eq!(run(s, getex, &["getex", "k", "pxat", "1"]), "$1\r\nv\r\n");
        assert!(s.dbs[0].table.get(b"k").is_none());
    }

    #[test]
    fn mget_mset() {
        let mut sh = shard();
        let s = &mut sh;
        assert_eq!(
            run(s, mset, &["mset", "a", "1", "b", "2", "a", "3"]),
            "+OK\r\n"
        );
        assert_eq!(
            run(s, mget, &["mget", "a", "b", "c"]),
            "*3\r\n$1\r\n3\r\n$1\r\n2\r\n$-1\r\n"
        );
        assert_eq!(
            run(s, mset, &["mset", "a", "1", "b"]),
            "-ERR wrong number of arguments for 'mset' command\r\n"
        );
        assert_eq!(run(s, msetnx, &["msetnx", "c", "1", "a", "2"]), ":0\r\n");
        assert!(s.dbs[0].table.get(b"c").is_none());
        assert_eq!(run(s, msetnx, &["msetnx", "c", "1", "d", "2"]), ":1\r\n");
        assert_eq!(
            run(s, msetnx, &["msetnx", "c"]),
            "-ERR wrong number of arguments for 'msetnx' command\r\n"
        );
    }

    #[test]
    fn counters() {
        let mut sh = shard();
        let s = &mut sh;
        assert_eq!(run(s, incr, &["incr", "n"]), ":1\r\n");
        assert_eq!(run(s, incrby, &["incrby", "n", "10"]), ":11\r\n");
        assert_eq!(run(s, decr, &["decr", "n"]), ":10\r\n");
        assert_eq!(run(s, decrby, &["decrby", "n", "-5"]), ":15\r\n");
        assert_eq!(
            run(s, decrby, &["decrby", "n", "-9223372036854775808"]),
            format!("-{DECR_OVERFLOW}\r\n")
        );
        assert_eq!(
            run(s, incrby, &["incrby", "n", "1.5"]),
            format!("-{NOT_INT}\r\n")
        );
        assert_eq!(
            run(s, incrby, &["incrby", "n", "9223372036854775807"]),
            format!("-{OVERFLOW}\r\n")
        );
        run(s, set, &["set", "m", "-9223372036854775808"]);
        assert_eq!(run(s, decr, &["decr", "m"]), format!("-{OVERFLOW}\r\n"));
        run(s, set, &["set", "f", "1.0"]);
        assert_eq!(run(s, incr, &["incr", "f"]), format!("-{NOT_INT}\r\n"));
        run(s, set, &["set", "sp", " 1"]);
        assert_eq!(run(s, incr, &["incr", "sp"]), format!("-{NOT_INT}\r\n"));
        // INCR keeps the TTL.
        run(s, set, &["set", "t", "5", "ex", "100"]);
        assert_eq!(run(s, incr, &["incr", "t"]), ":6\r\n");
        assert!(expire_of(s, "t").unwrap() > 0);
        assert_eq!(encoding_of(s, "t"), "int");
        // INCRBYFLOAT.
        run(s, set, &["set", "fl", "10.50"]);
        assert_eq!(
            run(s, incrbyfloat, &["incrbyfloat", "fl", "0.1"]),
            "$4\r\n10.6\r\n"
        );
        // 10.6 is inexact in long double too, and 17 decimals show it (as in Redis).
        assert_eq!(
            run(s, incrbyfloat, &["incrbyfloat", "fl", "-5.0e3"]),
            "$23\r\n-4989.39999999999999991\r\n"
        );
        assert_eq!(
            run(s, incrbyfloat, &["incrbyfloat", "nf", "3.0e3"]),
            "$4\r\n3000\r\n"
        );
        assert_eq!(encoding_of(s, "nf"), "embstr");
        assert_eq!(
            run(s, incrbyfloat, &["incrbyfloat", "nf", "abc"]),
            "-ERR value is not a valid float\r\n"
        );
        assert_eq!(
            run(s, incrbyfloat, &["incrbyfloat", "nf", "inf"]),
            "-ERR increment would produce NaN or Infinity\r\n"
        );
        assert_eq!(
            run(s, incrbyfloat, &["incrbyfloat", "n", "1"]),
            "$2\r\n16\r\n"
        );
        assert_eq!(
            run(s, incrbyfloat, &["incrbyfloat", "sp", "1"]),
            "-ERR value is not a valid float\r\n"
        );
        run(s, set, &["set", "t", "5", "px", "100000"]);
        run(s, incrbyfloat, &["incrbyfloat", "t", "0.5"]);
        assert!(expire_of(s, "t").unwrap() > 0);
        // "1\0002" is not a float.
        run(s, set, &["set", "z", "1"]);
        run(s, setrange, &["setrange", "z", "2", "2"]);
        assert_eq!(
            run(s, incrbyfloat, &["incrbyfloat", "z", "1"]),
            "-ERR value is not a valid float\r\n"
        );
    }

    #[test]
    fn ranges_and_appends() {
        let mut sh = shard();
        let s = &mut sh;
        assert_eq!(run(s, append, &["append", "k", "Hello"]), ":5\r\n");
        assert_eq!(encoding_of(s, "k"), "embstr");
        assert_eq!(run(s, append, &["append", "k", " World"]), ":11\r\n");
        assert_eq!(encoding_of(s, "k"), "raw");
        assert_eq!(run(s, strlen, &["strlen", "k"]), ":11\r\n");
        assert_eq!(run(s, strlen, &["strlen", "nokey"]), ":0\r\n");
        assert_eq!(
            run(s, getrange, &["getrange", "k", "0", "4"]),
            "$5\r\nHello\r\n"
        );
        assert_eq!(
            run(s, getrange, &["getrange", "k", "-5", "-1"]),
            "$5\r\nWorld\r\n"
        );
        assert_eq!(
            run(s, getrange, &["getrange", "k", "-1", "-5"]),
            "$0\r\n\r\n"
        );
        assert_eq!(run(s, getrange, &["getrange", "k", "5", "3"]), "$0\r\n\r\n");
        assert_eq!(
            run(s, getrange, &["getrange", "k", "0", "100"]),
            "$11\r\nHello World\r\n"
        );
        assert_eq!(
            run(s, getrange, &["getrange", "k", "-100", "0"]),
            "$1\r\nH\r\n"
        );
        assert_eq!(
            run(s, getrange, &["getrange", "nokey", "0", "1"]),
            "$0\r\n\r\n"
        );
        assert_eq!(
            run(s, getrange, &["getrange", "nokey", "x", "1"]),
            format!("-{NOT_INT}\r\n")
        );
        run(s, set, &["set", "i", "12345"]);
        assert_eq!(
            run(s, getrange, &["getrange", "i", "1", "2"]),
            "$2\r\n23\r\n"
        );
        assert_eq!(
            run(s, setrange, &["setrange", "k", "6", "Redis"]),
            ":11\r\n"
        );
        assert_eq!(run(s, get, &["get", "k"]), "$11\r\nHello Redis\r\n");
        assert_eq!(run(s, setrange, &["setrange", "new", "3", "ab"]), ":5\r\n");
        assert_eq!(run(s, get, &["get", "new"]), "$5\r\n\x00\x00\x00ab\r\n");
        assert_eq!(encoding_of(s, "new"), "raw");
        assert_eq!(run(s, setrange, &["setrange", "none", "3", ""]), ":0\r\n");
        assert!(s.dbs[0].table.get(b"none").is_none());
        assert_eq!(run(s, setrange, &["setrange", "i", "1", ""]), ":5\r\n");
        assert_eq!(encoding_of(s, "i"), "int");
        assert_eq!(
            run(s, setrange, &["setrange", "k", "-1", "x"]),
            format!("-{OFFSET_RANGE_ERR}\r\n")
        );
        assert_eq!(
            run(s, setrange, &["setrange", "k", "536870912", "x"]),
            format!("-{STRING_TOO_LONG}\r\n")
        );
        assert_eq!(
            run(s, setrange, &["setrange", "k", "536870911", ""]),
            ":11\r\n"
        );
        assert_eq!(substr_range(0, 0, -1), None);
        assert_eq!(substr_range(3, i64::MIN, i64::MAX), Some((0, 2)));
    }

    #[test]
    fn other_types_are_refused_and_left_alone() {
        let mut sh = shard();
        let s = &mut sh;
        let wrong = format!("-{WRONGTYPE}\r\n");
        let make_list = |s: &mut Shard| {
            s.dbs[0]
                .table
                .insert(b"l", Value::List(Box::default()), 0, 0);
        };
        make_list(s);
        let cases: &[(Handler, &[&str])] = &[
            (get, &["get", "l"]),
            (getex, &["getex", "l", "ex", "10"]),
            (getdel, &["getdel", "l"]),
            (getset, &["getset", "l", "v"]),
            (set, &["set", "l", "v", "get"]),
            (incr, &["incr", "l"]),
            (decrby, &["decrby", "l", "2"]),
            (incrbyfloat, &["incrbyfloat", "l", "1"]),
            (append, &["append", "l", "x"]),
            (strlen, &["strlen", "l"]),
            (getrange, &["getrange", "l", "0", "1"]),
            (setrange, &["setrange", "l", "0", "x"]),
            (setrange, &["setrange", "l", "0", ""]),
            (setbit, &["setbit", "l", "0", "1"]),
            (getbit, &["getbit", "l", "0"]),
            (bitcount, &["bitcount", "l", "0"]),
            (bitpos, &["bitpos", "l", "1", "x"]),
            (bitfield, &["bitfield", "l", "set", "u8", "0", "1"]),
            (bitfield, &["bitfield", "l", "get", "u8", "0"]),
            (bitfield_ro, &["bitfield_ro", "l", "get", "u8", "0"]),
            (bitop, &["bitop", "and", "d", "l"]),
        ];
        for (f, args) in cases {
            assert_eq!(run(s, *f, args), wrong, "{args:?}");
            assert_eq!(
                s.dbs[0].table.get(b"l").unwrap().value.type_name(),
                "list",
                "{args:?}"
            );
        }
        assert_eq!(
            run(s, lcs, &["lcs", "l", "x"]),
            format!("-{LCS_TYPE_ERR}\r\n")
        );
        assert_eq!(run(s, mget, &["mget", "l"]), "*1\r\n$-1\r\n");
        assert_eq!(run(s, setnx, &["setnx", "l", "v"]), ":0\r\n");
        assert_eq!(run(s, msetnx, &["msetnx", "l", "v"]), ":0\r\n");
        assert_eq!(run(s, set, &["set", "l", "v", "nx", "get"]), wrong);
        // Plain SET, MSET and BITOP's destination overwrite any type.
        assert_eq!(run(s, set, &["set", "l", "v"]), "+OK\r\n");
        make_list(s);
        assert_eq!(run(s, mset, &["mset", "l", "v"]), "+OK\r\n");
        make_list(s);
        run(s, set, &["set", "src", "a"]);
        assert_eq!(run(s, bitop, &["bitop", "or", "l", "src"]), ":1\r\n");
        assert_eq!(run(s, get, &["get", "l"]), "$1\r\na\r\n");
    }
}
