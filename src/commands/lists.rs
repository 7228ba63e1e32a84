//! The list family: pushes and pops, ranges and edits, moves between lists, and the
//! blocking pops (their waiting is in `crate::blocking`; the forms here are what they do
//! when an element is there, and what they do inside MULTI).

use bytes::Bytes;

use super::util::{eq_ci, parse_i64, NOT_INT, SYNTAX_ERR};
use crate::blocking::{parse_timeout, BlockCall, BlockOp, Data};
use crate::cross_handler;
use crate::protocol::reply::Reply;
use crate::server::session::Session;
use crate::shard::{unix_ms, ExecCtx, Shard};
use crate::types::list::List;
use crate::types::value::{Value, WRONGTYPE};

/// The list at `key`: Ok(None) when missing, Err when it holds another type.
fn list_mut<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a mut List>, ()> {
    match ctx.get(key) {
        None => Ok(None),
        Some(e) => match &mut e.value {
            Value::List(l) => Ok(Some(l)),
            _ => Err(()),
        },
    }
}

fn list_read<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a List>, ()> {
    match ctx.get_read(key) {
        None => Ok(None),
        Some(e) => match &e.value {
            Value::List(l) => Ok(Some(l)),
            _ => Err(()),
        },
    }
}

fn push_values(l: &mut List, values: &[Bytes], front: bool, now_ms: u64) {
    for v in values {
        if front {
            l.push_front_at(v, now_ms);
        } else {
            l.push_back_at(v, now_ms);
        }
    }
}

/// LPUSH/RPUSH/LPUSHX/RPUSHX: returns the new length, Err on a wrong type.
fn push_to(
    ctx: &mut ExecCtx,
    key: &[u8],
    values: &[Bytes],
    front: bool,
    only_existing: bool,
) -> Result<usize, ()> {
    let now = ctx.now_ms;
    let len = match list_mut(ctx, key)? {
        None if only_existing => return Ok(0),
        None => {
            let mut l = List::new();
            push_values(&mut l, values, front, ctx.now_ms);
            let n = l.len();
            ctx.set(key, Value::List(Box::new(l)), 0);
            n
        }
        Some(l) => {
            push_values(l, values, front, now);
            let n = l.len();
            ctx.modified(key);
            n
        }
    };
    ctx.notify(b'l', if front { "lpush" } else { "rpush" }, key);
    ctx.key_ready(key);
    ctx.shard
        .queues
        .pushed(ctx.db, key, values.len() as u64, front, ctx.now_ms);
    Ok(len)
}

fn push(ctx: &mut ExecCtx, args: &[Bytes], front: bool, only_existing: bool) {
    match push_to(ctx, &args[1], &args[2..], front, only_existing) {
        Ok(n) => ctx.out.int(n as i64),
        Err(()) => ctx.out.error(WRONGTYPE),
    }
}

pub fn lpush(ctx: &mut ExecCtx, args: &[Bytes]) {
    push(ctx, args, true, false);
}

pub fn rpush(ctx: &mut ExecCtx, args: &[Bytes]) {
    push(ctx, args, false, false);
}

pub fn lpushx(ctx: &mut ExecCtx, args: &[Bytes]) {
    push(ctx, args, true, true);
}

pub fn rpushx(ctx: &mut ExecCtx, args: &[Bytes]) {
    push(ctx, args, false, true);
}

/// Pops up to `count` items from one end, deleting the key once it is empty.
fn pop_items(
    ctx: &mut ExecCtx,
    key: &[u8],
    front: bool,
    count: usize,
) -> Result<Option<Vec<Box<[u8]>>>, ()> {
    let mut waits = crate::observe::Waits::default();
    let (items, empty) = match list_mut(ctx, key)? {
        None => return Ok(None),
        Some(l) => {
            let mut items = Vec::with_capacity(count.min(l.len()));
            while items.len() < count {
                match if front {
                    l.pop_front_timed()
                } else {
                    l.pop_back_timed()
                } {
                    Some((v, pushed_ms)) => {
                        items.push(v);
                        waits.popped(Some(pushed_ms));
                    }
                    None => break,
                }
            }
            (items, l.is_empty())
        }
    };
    after_pop(ctx, key, front, !items.is_empty(), empty, &waits);
    Ok(Some(items))
}

/// What follows a pop: its event, the queue's metrics, and the key deleted once empty.
fn after_pop(
    ctx: &mut ExecCtx,
    key: &[u8],
    front: bool,
    popped: bool,
    empty: bool,
    waits: &crate::observe::Waits,
) {
    if popped {
        ctx.notify(b'l', if front { "lpop" } else { "rpop" }, key);
        ctx.shard.queues.popped(ctx.db, key, waits, ctx.now_ms);
    }
    if empty {
        ctx.delete(key);
        ctx.notify(b'g', "del", key);
    } else if popped {
        ctx.modified(key);
    }
}

/// Pops one element and writes it into the reply, after `head` has written what comes
/// before it, while the element still lies in its chunk: RPOP, LPOP and an unblocked
/// BRPOP, a queue's commands, then take no allocation and copy per element. Ok(false):
/// the key is missing and nothing was written.
fn pop_one_into_reply(
    ctx: &mut ExecCtx,
    key: &[u8],
    front: bool,
    head: impl FnOnce(&mut Reply),
) -> Result<bool, ()> {
    let mut waits = crate::observe::Waits::default();
    let empty = {
        let (entry, out) = ctx.get_and_out(key);
        let Some(e) = entry else {
            return Ok(false);
        };
        let Value::List(l) = &mut e.value else {
            return Err(());
        };
        let popped = l.pop_with(front, |v| {
            head(out);
            out.bulk(v);
        });
        // A stored list is never empty (the last pop deletes its key).
        let Some(((), pushed_ms)) = popped else {
            return Ok(false);
        };
        waits.popped(Some(pushed_ms));
        l.is_empty()
    };
    after_pop(ctx, key, front, true, empty, &waits);
    Ok(true)
}

fn parse_positive_count(arg: &[u8]) -> Result<usize, &'static str> {
    match parse_i64(arg) {
        Ok(n) if n >= 0 => Ok(n as usize),
        _ => Err("ERR value is out of range, must be positive"),
    }
}

fn pop(ctx: &mut ExecCtx, args: &[Bytes], front: bool) {
    if args.len() > 3 {
        return ctx
            .out
            .error(&super::arity_error(if front { "lpop" } else { "rpop" }));
    }
    let count = match args.get(2).map(|a| parse_positive_count(a)) {
        None => {
            return match pop_one_into_reply(ctx, &args[1], front, |_| {}) {
                Err(()) => ctx.out.error(WRONGTYPE),
                Ok(false) => ctx.out.null(),
                Ok(true) => {}
            };
        }
        Some(Ok(n)) => Some(n),
        Some(Err(e)) => return ctx.out.error(e),
    };
    match pop_items(ctx, &args[1], front, count.unwrap_or(1)) {
        Err(()) => ctx.out.error(WRONGTYPE),
        Ok(None) => {
            if count.is_some() {
                ctx.out.null_array()
            } else {
                ctx.out.null()
            }
        }
        Ok(Some(items)) => match count {
            None => ctx.out.bulk(&items[0]),
            Some(_) => {
                ctx.out.array(items.len());
                for v in &items {
                    ctx.out.bulk(v);
                }
            }
        },
    }
}

pub fn lpop(ctx: &mut ExecCtx, args: &[Bytes]) {
    pop(ctx, args, true);
}

pub fn rpop(ctx: &mut ExecCtx, args: &[Bytes]) {
    pop(ctx, args, false);
}

pub fn llen(ctx: &mut ExecCtx, args: &[Bytes]) {
    match list_read(ctx, &args[1]) {
        Err(()) => ctx.out.error(WRONGTYPE),
        Ok(l) => {
            let n = l.map_or(0, |l| l.len());
            ctx.out.int(n as i64)
        }
    }
}

/// Resolves Redis-style inclusive indices (negative from the end) against `len`.
fn clamp_range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let start = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let stop = if stop < 0 {
        len + stop
    } else {
        stop.min(len - 1)
    };
    if start > stop || start >= len {
        None
    } else {
        Some((start as usize, stop as usize))
    }
}

pub fn lrange(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (Ok(start), Ok(stop)) = (parse_i64(&args[2]), parse_i64(&args[3])) else {
        return ctx.out.error(NOT_INT);
    };
    let resp3 = ctx.out.resp3;
    let mut out = Reply::new(resp3);
    match list_read(ctx, &args[1]) {
        Err(()) => out.error(WRONGTYPE),
        Ok(None) => out.array(0),
        Ok(Some(l)) => match clamp_range(start, stop, l.len()) {
            None => out.array(0),
            Some((a, b)) => {
                out.array(b - a + 1);
                for v in l.iter().skip(a).take(b - a + 1) {
                    out.bulk(v);
                }
            }
        },
    }
    ctx.out.raw(&out.buf);
}

/// A Redis list index (negative from the end) as a position, if in range.
fn position(index: i64, len: usize) -> Option<usize> {
    let i = if index < 0 { len as i64 + index } else { index };
    (0..len as i64).contains(&i).then_some(i as usize)
}

pub fn lindex(ctx: &mut ExecCtx, args: &[Bytes]) {
    let Ok(index) = parse_i64(&args[2]) else {
        return ctx.out.error(NOT_INT);
    };
    let item = match list_read(ctx, &args[1]) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => None,
        Ok(Some(l)) => position(index, l.len()).and_then(|i| l.get(i).map(|v| v.to_vec())),
    };
    match item {
        Some(v) => ctx.out.bulk(&v),
        None => ctx.out.null(),
    }
}

pub fn lset(ctx: &mut ExecCtx, args: &[Bytes]) {
    let Ok(index) = parse_i64(&args[2]) else {
        return ctx.out.error(NOT_INT);
    };
    let key = &args[1];
    let done = match list_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.error("ERR no such key"),
        Ok(Some(l)) => match position(index, l.len()) {
            Some(i) => l.set(i, &args[3]),
            None => false,
        },
    };
    if !done {
        return ctx.out.error("ERR index out of range");
    }
    ctx.modified(key);
    ctx.notify(b'l', "lset", key);
    ctx.out.ok();
}

pub fn linsert(ctx: &mut ExecCtx, args: &[Bytes]) {
    let before = if eq_ci(&args[2], "before") {
        true
    } else if eq_ci(&args[2], "after") {
        false
    } else {
        return ctx.out.error(SYNTAX_ERR);
    };
    let key = &args[1];
    let len = match list_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.int(0),
        Ok(Some(l)) => {
            let found = l.iter().position(|v| v == &args[3][..]);
            match found {
                None => -1,
                Some(i) => {
                    l.insert(if before { i } else { i + 1 }, &args[4]);
                    l.len() as i64
                }
            }
        }
    };
    if len < 0 {
        return ctx.out.int(-1);
    }
    ctx.modified(key);
    ctx.notify(b'l', "linsert", key);
    ctx.out.int(len);
}

pub fn lrem(ctx: &mut ExecCtx, args: &[Bytes]) {
    let Ok(count) = parse_i64(&args[2]) else {
        return ctx.out.error(NOT_INT);
    };
    let key = &args[1];
    let (removed, empty) = match list_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.int(0),
        Ok(Some(l)) => {
            let n = l.remove_matching(&args[3], count.unsigned_abs() as usize, count < 0);
            (n, l.is_empty())
        }
    };
    if removed > 0 {
        ctx.modified(key);
        ctx.notify(b'l', "lrem", key);
        if empty {
            ctx.delete(key);
            ctx.notify(b'g', "del", key);
        }
    }
    ctx.out.int(removed as i64);
}

pub fn ltrim(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (Ok(start), Ok(stop)) = (parse_i64(&args[2]), parse_i64(&args[3])) else {
        return ctx.out.error(NOT_INT);
    };
    let key = &args[1];
    let empty = match list_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.ok(),
        Ok(Some(l)) => {
            match clamp_range(start, stop, l.len()) {
                None => l.clear(),
                Some((a, b)) => l.keep_range(a, b),
            }
            l.is_empty()
        }
    };
    ctx.modified(key);
    ctx.notify(b'l', "ltrim", key);
    if empty {
        ctx.delete(key);
        ctx.notify(b'g', "del", key);
    }
    ctx.out.ok();
}

pub fn lpos(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (mut rank, mut count, mut maxlen) = (1i64, None::<usize>, 0usize);
    let mut i = 3;
    while i < args.len() {
        if i + 1 >= args.len() {
            return ctx.out.error(SYNTAX_ERR);
        }
        let Ok(v) = parse_i64(&args[i + 1]) else {
            return ctx.out.error(NOT_INT);
        };
        if eq_ci(&args[i], "rank") {
            if v == 0 {
                return ctx.out.error("ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list");
            }
            if v == i64::MIN {
                return ctx.out.error("ERR value is out of range");
            }
            rank = v;
        } else if eq_ci(&args[i], "count") {
            if v < 0 {
                return ctx.out.error("ERR COUNT can't be negative");
            }
            count = Some(v as usize);
        } else if eq_ci(&args[i], "maxlen") {
            if v < 0 {
                return ctx.out.error("ERR MAXLEN can't be negative");
            }
            maxlen = v as usize;
        } else {
            return ctx.out.error(SYNTAX_ERR);
        }
        i += 2;
    }
    let target = &args[2];
    let found: Vec<usize> = match list_read(ctx, &args[1]) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => Vec::new(),
        Ok(Some(l)) => {
            let want = match count {
                Some(0) => usize::MAX,
                Some(n) => n,
                None => 1,
            };
            let skip = rank.unsigned_abs() as usize - 1;
            let limit = if maxlen == 0 { l.len() } else { maxlen };
            let len = l.len();
            let matches: Box<dyn Iterator<Item = usize>> = if rank > 0 {
                Box::new(
                    l.iter()
                        .enumerate()
                        .take(limit)
                        .filter(|(_, v)| *v == &target[..])
                        .map(|(i, _)| i),
                )
            } else {
                Box::new(
                    l.iter()
                        .rev()
                        .enumerate()
                        .take(limit)
                        .filter(|(_, v)| *v == &target[..])
                        .map(move |(i, _)| len - 1 - i),
                )
            };
            matches.skip(skip).take(want).collect()
        }
    };
    match count {
        None => match found.first() {
            Some(&p) => ctx.out.int(p as i64),
            None => ctx.out.null(),
        },
        Some(_) => {
            ctx.out.array(found.len());
            for p in found {
                ctx.out.int(p as i64);
            }
        }
    }
}

/// LEFT or RIGHT: true for LEFT.
fn parse_side(arg: &[u8]) -> Option<bool> {
    if eq_ci(arg, "left") {
        Some(true)
    } else if eq_ci(arg, "right") {
        Some(false)
    } else {
        None
    }
}

/// The ends of LMOVE/BLMOVE (`LEFT|RIGHT LEFT|RIGHT` at `at`) or of RPOPLPUSH/BRPOPLPUSH.
fn move_sides(args: &[Bytes], at: usize) -> Result<(bool, bool), &'static str> {
    if eq_ci(&args[0], "rpoplpush") || eq_ci(&args[0], "brpoplpush") {
        return Ok((false, true));
    }
    match (parse_side(&args[at]), parse_side(&args[at + 1])) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(SYNTAX_ERR),
    }
}

/// Whether `key` can receive a pushed element (missing, or a list).
fn is_list_or_missing(sh: &mut Shard, db: usize, key: &[u8]) -> bool {
    match sh.lookup(db, key, unix_ms()) {
        None => true,
        Some(e) => matches!(e.value, Value::List(_)),
    }
}

/// The source side of a move: Err(()) wrong type, Ok(None) missing.
fn pop_one(sh: &mut Shard, db: usize, key: &[u8], front: bool) -> Result<Option<Box<[u8]>>, ()> {
    sh.with_ctx(db, |ctx| {
        Ok(pop_items(ctx, key, front, 1)?.and_then(|mut v| v.pop()))
    })
}

fn push_one(sh: &mut Shard, db: usize, key: &[u8], front: bool, value: &[u8]) {
    sh.with_ctx(db, |ctx| {
        let _ = push_to(ctx, key, &[Bytes::copy_from_slice(value)], front, false);
    });
}

/// LMOVE and RPOPLPUSH (and their blocking forms inside MULTI) with both keys here.
fn move_here(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (from_left, to_left) = match move_sides(args, 3) {
        Ok(s) => s,
        Err(e) => return ctx.out.error(e),
    };
    let (src, dst) = (&args[1], &args[2]);
    match list_mut(ctx, src) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.null(),
        Ok(Some(_)) => {}
    }
    if !is_list_or_missing(ctx.shard, ctx.db, dst) {
        return ctx.out.error(WRONGTYPE);
    }
    match pop_one(ctx.shard, ctx.db, src, from_left) {
        Ok(Some(v)) => {
            push_one(ctx.shard, ctx.db, dst, to_left, &v);
            ctx.out.bulk(&v);
        }
        Ok(None) => ctx.out.null(),
        Err(()) => ctx.out.error(WRONGTYPE),
    }
}

pub fn lmove(ctx: &mut ExecCtx, args: &[Bytes]) {
    move_here(ctx, args);
}

/// LMOVE across shards, under a transaction holding both keys.
/// `LMOVE src dst LEFT|RIGHT LEFT|RIGHT`, the effect of any list move.
pub fn move_effect(src: &Bytes, dst: &Bytes, from_left: bool, to_left: bool) -> Vec<Bytes> {
    let side = |l: bool| Bytes::from_static(if l { b"LEFT" } else { b"RIGHT" });
    vec![
        Bytes::from_static(b"LMOVE"),
        src.clone(),
        dst.clone(),
        side(from_left),
        side(to_left),
    ]
}

pub async fn move_across(
    sess: &mut Session,
    src: Bytes,
    dst: Bytes,
    from_left: bool,
    to_left: bool,
    tx: &crate::shard::tx::Tx,
) {
    let db = sess.db;
    let src_shard = sess.worker.shard_of(&src);
    let dst_shard = sess.worker.shard_of(&dst);
    let s = src.clone();
    let src_state = tx
        .run(src_shard, move |sh| match sh.lookup(db, &s, unix_ms()) {
            None => Ok(false),
            Some(e) => match e.value {
                Value::List(_) => Ok(true),
                _ => Err(()),
            },
        })
        .await;
    match src_state {
        Err(()) => return sess.out.error(WRONGTYPE),
        Ok(false) => return sess.out.null(),
        Ok(true) => {}
    }
    let d = dst.clone();
    if !tx
        .run(dst_shard, move |sh| is_list_or_missing(sh, db, &d))
        .await
    {
        return sess.out.error(WRONGTYPE);
    }
    let s = src.clone();
    let popped = tx
        .run(src_shard, move |sh| pop_one(sh, db, &s, from_left))
        .await;
    match popped {
        Ok(Some(v)) => {
            let value = v.clone();
            let d = dst.clone();
            tx.run(dst_shard, move |sh| push_one(sh, db, &d, to_left, &value))
                .await;
            // Logged as the move it was, whichever command (LMOVE, RPOPLPUSH, a served
            // BLMOVE or BRPOPLPUSH) made it.
            tx.log_as(move_effect(&src, &dst, from_left, to_left));
            sess.out.bulk(&v);
        }
        Ok(None) => sess.out.null(),
        Err(()) => sess.out.error(WRONGTYPE),
    }
}

cross_handler!(lmove_cross, |sess, args, tx| {
    let (from_left, to_left) = match move_sides(&args, 3) {
        Ok(s) => s,
        Err(e) => return sess.out.error(e),
    };
    move_across(
        sess,
        args[1].clone(),
        args[2].clone(),
        from_left,
        to_left,
        tx,
    )
    .await;
});

// ---- LMPOP and the blocking family ----

/// Parses `numkeys key... LEFT|RIGHT [COUNT n]` starting at `at`.
fn parse_mpop(args: &[Bytes], at: usize) -> Result<(Vec<Bytes>, bool, usize), &'static str> {
    let numkeys = match parse_i64(&args[at]) {
        Ok(n) if n > 0 => n as usize,
        Ok(_) => return Err("ERR numkeys should be greater than 0"),
        Err(_) => return Err("ERR numkeys should be greater than 0"),
    };
    let first = at + 1;
    if args.len() < first + numkeys + 1 {
        return Err(SYNTAX_ERR);
    }
    let keys = args[first..first + numkeys].to_vec();
    let mut i = first + numkeys;
    let left = parse_side(&args[i]).ok_or(SYNTAX_ERR)?;
    i += 1;
    let mut count = None;
    while i < args.len() {
        if eq_ci(&args[i], "count") && i + 1 < args.len() && count.is_none() {
            count = Some(match parse_i64(&args[i + 1]) {
                Ok(n) if n > 0 => n as usize,
                _ => return Err("ERR count should be greater than 0"),
            });
            i += 2;
        } else {
            return Err(SYNTAX_ERR);
        }
    }
    Ok((keys, left, count.unwrap_or(1)))
}

/// Key positions of LMPOP (numkeys at 1) and BLMPOP (timeout at 1, numkeys at 2).
fn mpop_keys(args: &[Bytes], numkeys_at: usize) -> Vec<usize> {
    let n = parse_i64(args.get(numkeys_at).map_or(&b""[..], |a| a)).unwrap_or(0);
    if n <= 0 {
        return Vec::new();
    }
    (numkeys_at + 1..(numkeys_at + 1 + n as usize).min(args.len())).collect()
}

pub fn lmpop_keys(args: &[Bytes]) -> Vec<usize> {
    mpop_keys(args, 1)
}

pub fn blmpop_keys(args: &[Bytes]) -> Vec<usize> {
    mpop_keys(args, 2)
}

/// Pops from the first non-empty list of `keys` on this shard; writes `[key, [elements]]`
/// or a null array, and returns whether it wrote something other than the null.
fn mpop_here(ctx: &mut ExecCtx, keys: &[Bytes], left: bool, count: usize) -> bool {
    for key in keys {
        match pop_items(ctx, key, left, count) {
            Err(()) => {
                ctx.out.error(WRONGTYPE);
                return true;
            }
            Ok(None) => continue,
            Ok(Some(items)) => {
                if ctx.logging() {
                    let name: &'static [u8] = if left { b"LPOP" } else { b"RPOP" };
                    let n = items.len().to_string();
                    ctx.log_as(crate::persist::aof::effects::words(&[
                        name,
                        key,
                        n.as_bytes(),
                    ]));
                }
                ctx.out.array(2);
                ctx.out.bulk(key);
                ctx.out.array(items.len());
                for v in &items {
                    ctx.out.bulk(v);
                }
                return true;
            }
        }
    }
    false
}

pub fn lmpop(ctx: &mut ExecCtx, args: &[Bytes]) {
    match parse_mpop(args, 1) {
        Err(e) => ctx.out.error(e),
        Ok((keys, left, count)) => {
            if !mpop_here(ctx, &keys, left, count) {
                ctx.out.null_array();
            }
        }
    }
}

/// LMPOP over keys on several shards: tries them in order under the transaction's locks.
async fn mpop_across(
    sess: &mut Session,
    keys: Vec<Bytes>,
    left: bool,
    count: usize,
    tx: &crate::shard::tx::Tx,
) {
    let db = sess.db;
    let resp3 = sess.out.resp3;
    for key in keys {
        let k = key.clone();
        let reply = tx
            .run(sess.worker.shard_of(&key), move |sh| {
                let mut out = Reply::new(resp3);
                let mut ctx = sh.ctx(db, &mut out);
                let wrote = mpop_here(&mut ctx, &[k], left, count);
                let effect = ctx.effect.take();
                wrote.then_some((out.buf, effect))
            })
            .await;
        if let Some((r, effect)) = reply {
            // The pop it became, as on one shard.
            for argv in effect.into_iter().flatten() {
                tx.log_as(argv);
            }
            return sess.out.raw(&r);
        }
    }
    sess.out.null_array();
}

cross_handler!(lmpop_cross, |sess, args, tx| {
    match parse_mpop(&args, 1) {
        Err(e) => sess.out.error(e),
        Ok((keys, left, count)) => mpop_across(sess, keys, left, count, tx).await,
    }
});

/// BLPOP/BRPOP inside MULTI (or with every key on one shard, not blocking): the first
/// non-empty list in key order, or a null array.
fn bpop_here(ctx: &mut ExecCtx, args: &[Bytes], left: bool) {
    if let Err(e) = parse_timeout(&args[args.len() - 1]) {
        return ctx.out.error(e);
    }
    let keys = &args[1..args.len() - 1];
    for key in keys {
        let head = |out: &mut Reply| {
            out.array(2);
            out.bulk(key);
        };
        match pop_one_into_reply(ctx, key, left, head) {
            Err(()) => return ctx.out.error(WRONGTYPE),
            Ok(false) => continue,
            Ok(true) => {
                if ctx.logging() {
                    let name: &'static [u8] = if left { b"LPOP" } else { b"RPOP" };
                    ctx.log_as(crate::persist::aof::effects::words(&[name, key]));
                }
                return;
            }
        }
    }
    ctx.out.null_array();
}

pub fn blpop(ctx: &mut ExecCtx, args: &[Bytes]) {
    bpop_here(ctx, args, true);
}

pub fn brpop(ctx: &mut ExecCtx, args: &[Bytes]) {
    bpop_here(ctx, args, false);
}

async fn bpop_across(sess: &mut Session, args: Vec<Bytes>, tx: &crate::shard::tx::Tx, left: bool) {
    if let Err(e) = parse_timeout(&args[args.len() - 1]) {
        return sess.out.error(e);
    }
    let db = sess.db;
    let resp3 = sess.out.resp3;
    for key in &args[1..args.len() - 1] {
        let k = key.clone();
        let reply = tx
            .run(sess.worker.shard_of(key), move |sh| {
                let mut out = Reply::new(resp3);
                let mut ctx = sh.ctx(db, &mut out);
                match pop_items(&mut ctx, &k, left, 1) {
                    Err(()) => Some(Err(())),
                    Ok(None) => None,
                    Ok(Some(items)) => {
                        ctx.out.array(2);
                        ctx.out.bulk(&k);
                        ctx.out.bulk(&items[0]);
                        Some(Ok(out.buf))
                    }
                }
            })
            .await;
        match reply {
            None => continue,
            Some(Err(())) => return sess.out.error(WRONGTYPE),
            Some(Ok(r)) => {
                let name: &'static [u8] = if left { b"LPOP" } else { b"RPOP" };
                tx.log_as(crate::persist::aof::effects::words(&[name, key]));
                return sess.out.raw(&r);
            }
        }
    }
    sess.out.null_array();
}

cross_handler!(blpop_cross, |sess, args, tx| {
    bpop_across(sess, args, tx, true).await;
});

cross_handler!(brpop_cross, |sess, args, tx| {
    bpop_across(sess, args, tx, false).await;
});

/// BLMOVE/BRPOPLPUSH inside MULTI: LMOVE (its timeout is checked but unused).
pub fn blmove(ctx: &mut ExecCtx, args: &[Bytes]) {
    if let Err(e) = parse_timeout(&args[args.len() - 1]) {
        return ctx.out.error(e);
    }
    if ctx.logging() {
        // Logged only if it moved something: the non-blocking form of the same move.
        let mut argv = args[..args.len() - 1].to_vec();
        argv[0] = if eq_ci(&args[0], "brpoplpush") {
            Bytes::from_static(b"RPOPLPUSH")
        } else {
            Bytes::from_static(b"LMOVE")
        };
        ctx.log_as(argv);
    }
    move_here(ctx, args);
}

cross_handler!(blmove_cross, |sess, args, tx| {
    if let Err(e) = parse_timeout(&args[args.len() - 1]) {
        return sess.out.error(e);
    }
    let (from_left, to_left) = match move_sides(&args, 3) {
        Ok(s) => s,
        Err(e) => return sess.out.error(e),
    };
    move_across(
        sess,
        args[1].clone(),
        args[2].clone(),
        from_left,
        to_left,
        tx,
    )
    .await;
});

pub fn blmpop(ctx: &mut ExecCtx, args: &[Bytes]) {
    if let Err(e) = parse_timeout(&args[1]) {
        return ctx.out.error(e);
    }
    match parse_mpop(args, 2) {
        Err(e) => ctx.out.error(e),
        Ok((keys, left, count)) => {
            if !mpop_here(ctx, &keys, left, count) {
                ctx.out.null_array();
            }
        }
    }
}

cross_handler!(blmpop_cross, |sess, args, tx| {
    if let Err(e) = parse_timeout(&args[1]) {
        return sess.out.error(e);
    }
    match parse_mpop(&args, 2) {
        Err(e) => sess.out.error(e),
        Ok((keys, left, count)) => mpop_across(sess, keys, left, count, tx).await,
    }
});

// ---- What the blocking machinery calls ----

/// How BLPOP/BRPOP block: their keys, the op and the timeout.
pub fn bpop_call(args: &[Bytes]) -> Result<Option<BlockCall>, String> {
    let timeout = parse_timeout(&args[args.len() - 1])?;
    let left = eq_ci(&args[0], "blpop");
    Ok(Some(BlockCall {
        keys: Vec::new(),
        keys_at: Some(1..args.len() - 1),
        op: BlockOp::ListPop { left },
        timeout,
    }))
}

pub fn blmove_call(args: &[Bytes]) -> Result<Option<BlockCall>, String> {
    let timeout = parse_timeout(&args[args.len() - 1])?;
    let (from_left, to_left) = move_sides(args, 3)?;
    Ok(Some(BlockCall {
        keys: vec![args[1].clone()],
        keys_at: None,
        op: BlockOp::ListMove {
            from_left,
            to_left,
            dst: args[2].clone(),
        },
        timeout,
    }))
}

pub fn blmpop_call(args: &[Bytes]) -> Result<Option<BlockCall>, String> {
    let timeout = parse_timeout(&args[1])?;
    let (keys, left, count) = parse_mpop(args, 2)?;
    Ok(Some(BlockCall {
        keys,
        keys_at: None,
        op: BlockOp::ListMultiPop { left, count },
        timeout,
    }))
}

/// Whether `key` holds a non-empty list (or something a list waiter cannot take).
pub fn list_data(sh: &mut Shard, db: usize, key: &[u8]) -> Data {
    match sh.lookup(db, key, unix_ms()) {
        None => Data::Empty,
        Some(e) => match &e.value {
            Value::List(l) if !l.is_empty() => Data::Ready,
            Value::List(_) => Data::Empty,
            _ => Data::WrongType,
        },
    }
}

/// Whether the destination of a blocked move can take an element.
pub fn move_target_ok(sh: &mut Shard, db: usize, dst: &[u8]) -> bool {
    is_list_or_missing(sh, db, dst)
}

/// Pops up to `count` elements for a served waiter (the key holds a non-empty list).
pub fn pop_for_waiter(
    sh: &mut Shard,
    db: usize,
    key: &[u8],
    left: bool,
    count: usize,
) -> Vec<Box<[u8]>> {
    sh.with_ctx(db, |ctx| {
        pop_items(ctx, key, left, count)
            .ok()
            .flatten()
            .unwrap_or_default()
    })
}

/// Moves one element for a served BLMOVE waiter whose destination is on this shard.
pub fn move_for_waiter(
    sh: &mut Shard,
    db: usize,
    key: &[u8],
    from_left: bool,
    dst: &[u8],
    to_left: bool,
) -> Box<[u8]> {
    let v = pop_one(sh, db, key, from_left)
        .ok()
        .flatten()
        .expect("served only when the list holds an element");
    push_one(sh, db, dst, to_left, &v);
    v
}

/// Pushes an element a blocked move brought from another shard.
pub fn push_for_waiter(sh: &mut Shard, db: usize, key: &[u8], left: bool, value: &[u8]) {
    push_one(sh, db, key, left, value);
}

/// Puts back elements taken for a client that left before it got them.
pub fn push_back_for_waiter(
    sh: &mut Shard,
    db: usize,
    key: &[u8],
    left: bool,
    values: Vec<Box<[u8]>>,
) {
    let values: Vec<Bytes> = values
        .into_iter()
        .rev()
        .map(|v| Bytes::from(v.into_vec()))
        .collect();
    sh.with_ctx(db, |ctx| {
        let _ = push_to(ctx, key, &values, left, false);
    });
}
