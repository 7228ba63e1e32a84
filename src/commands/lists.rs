//! The list family (the non-blocking core: pushes, pops, LLEN, LRANGE, LINDEX, LMOVE,
//! RPOPLPUSH). Blocking pops arrive with the data-types work.

use bytes::Bytes;

use super::util::{eq_ci, parse_i64, NOT_INT, SYNTAX_ERR};
use crate::cross_handler;
use crate::protocol::reply::Reply;
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

fn push(ctx: &mut ExecCtx, args: &[Bytes], front: bool, only_existing: bool) {
    let key = &args[1];
    let len = match list_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) if only_existing => return ctx.out.int(0),
        Ok(None) => {
            let mut l = List::new();
            for v in &args[2..] {
                if front {
                    l.push_front(v);
                } else {
                    l.push_back(v);
                }
            }
            let n = l.len();
            ctx.set(key, Value::List(Box::new(l)), 0);
            n
        }
        Ok(Some(l)) => {
            for v in &args[2..] {
                if front {
                    l.push_front(v);
                } else {
                    l.push_back(v);
                }
            }
            let n = l.len();
            ctx.modified(key);
            n
        }
    };
    ctx.out.int(len as i64);
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
    let (items, empty) = match list_mut(ctx, key)? {
        None => return Ok(None),
        Some(l) => {
            let mut items = Vec::with_capacity(count.min(l.len()));
            while items.len() < count {
                match if front { l.pop_front() } else { l.pop_back() } {
                    Some(v) => items.push(v),
                    None => break,
                }
            }
            (items, l.is_empty())
        }
    };
    if empty {
        ctx.delete(key);
    } else if !items.is_empty() {
        ctx.modified(key);
    }
    Ok(Some(items))
}

fn pop(ctx: &mut ExecCtx, args: &[Bytes], front: bool) {
    let count = match args.get(2) {
        None => None,
        Some(a) => match parse_i64(a) {
            Ok(n) if n >= 0 => Some(n as usize),
            _ => return ctx.out.error("ERR value is out of range, must be positive"),
        },
    };
    if args.len() > 3 {
        return ctx
            .out
            .error(&super::arity_error(if front { "lpop" } else { "rpop" }));
    }
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
    match ctx.get_read(&args[1]) {
        None => ctx.out.int(0),
        Some(e) => match &e.value {
            Value::List(l) => {
                let n = l.len();
                ctx.out.int(n as i64)
            }
            _ => ctx.out.error(WRONGTYPE),
        },
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
    let Some(e) = ctx.get_read(&args[1]) else {
        return ctx.out.array(0);
    };
    let Value::List(l) = &e.value else {
        return ctx.out.error(WRONGTYPE);
    };
    let mut out = Reply::new(resp3);
    match clamp_range(start, stop, l.len()) {
        None => out.array(0),
        Some((a, b)) => {
            out.array(b - a + 1);
            for v in l.iter().skip(a).take(b - a + 1) {
                out.bulk(v);
            }
        }
    }
    ctx.out.raw(&out.buf);
}

pub fn lindex(ctx: &mut ExecCtx, args: &[Bytes]) {
    let Ok(index) = parse_i64(&args[2]) else {
        return ctx.out.error(NOT_INT);
    };
    let Some(e) = ctx.get_read(&args[1]) else {
        return ctx.out.null();
    };
    let Value::List(l) = &e.value else {
        return ctx.out.error(WRONGTYPE);
    };
    let len = l.len() as i64;
    let i = if index < 0 { len + index } else { index };
    let item = if (0..len).contains(&i) {
        l.get(i as usize).map(|v| v.to_vec())
    } else {
        None
    };
    match item {
        Some(v) => ctx.out.bulk(&v),
        None => ctx.out.null(),
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

fn lmove_sides(args: &[Bytes]) -> Result<(bool, bool), &'static str> {
    if eq_ci(&args[0], "rpoplpush") {
        return Ok((false, true));
    }
    match (parse_side(&args[3]), parse_side(&args[4])) {
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
    let mut out = Reply::new(false);
    let mut ctx = sh.ctx(db, &mut out);
    Ok(pop_items(&mut ctx, key, front, 1)?.and_then(|mut v| v.pop()))
}

fn push_one(sh: &mut Shard, db: usize, key: &[u8], front: bool, value: &[u8]) {
    let mut out = Reply::new(false);
    let mut ctx = sh.ctx(db, &mut out);
    let args = [
        Bytes::new(),
        Bytes::copy_from_slice(key),
        Bytes::copy_from_slice(value),
    ];
    push(&mut ctx, &args, front, false);
}

/// LMOVE and RPOPLPUSH with both keys on this shard.
pub fn lmove(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (from_left, to_left) = match lmove_sides(args) {
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

cross_handler!(lmove_cross, |sess, args, tx| {
    let (from_left, to_left) = match lmove_sides(&args) {
        Ok(s) => s,
        Err(e) => return sess.out.error(e),
    };
    let db = sess.db;
    let (src, dst) = (args[1].clone(), args[2].clone());
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
    let popped = tx
        .run(src_shard, move |sh| pop_one(sh, db, &src, from_left))
        .await;
    match popped {
        Ok(Some(v)) => {
            let value = v.clone();
            tx.run(dst_shard, move |sh| push_one(sh, db, &dst, to_left, &value))
                .await;
            sess.out.bulk(&v);
        }
        Ok(None) => sess.out.null(),
        Err(()) => sess.out.error(WRONGTYPE),
    }
});
