//! The sets family: SADD, SREM, SMEMBERS, SISMEMBER, SMISMEMBER, SCARD, SPOP,
//! SRANDMEMBER, SMOVE, SINTER, SINTERCARD, SINTERSTORE, SUNION, SUNIONSTORE, SDIFF,
//! SDIFFSTORE and SSCAN.
//!
//! Commands on several keys have a cross-shard form that runs while a transaction holds
//! all their keys: the sources are copied from their shards, combined on the
//! coordinating thread, and a STORE result is written on the destination's shard, so
//! nobody sees a half-done command.

use std::rc::Rc;

use bytes::Bytes;

use super::util::{eq_ci, glob_match, parse_cursor, parse_i64, NOT_INT, SYNTAX_ERR};
use crate::cross_handler;
use crate::protocol::reply::Reply;
use crate::shard::tx::Tx;
use crate::shard::{ExecCtx, Shard, Worker};
use crate::types::set::{self, Member, Rng, Set};
use crate::types::table::Entry;
use crate::types::value::{Value, WRONGTYPE};

const NOT_POSITIVE: &str = "ERR value is out of range, must be positive";
const COUNT_RANGE: &str =
    "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807";
const NUMKEYS_ERR: &str = "ERR numkeys should be greater than 0";
const NUMKEYS_ARGS_ERR: &str = "ERR Number of keys can't be greater than number of args";
const LIMIT_ERR: &str = "ERR LIMIT can't be negative";

// ---------------------------------------------------------------------------------------
// Lookups
// ---------------------------------------------------------------------------------------

/// What a key holds, as far as a set command cares.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Missing,
    Set,
    Other,
}

fn kind(e: Option<&mut Entry>) -> Kind {
    match e {
        None => Kind::Missing,
        Some(e) if matches!(e.value, Value::Set(_)) => Kind::Set,
        Some(_) => Kind::Other,
    }
}

/// The set at `key` for a write: Ok(None) when missing, Err when another type is there.
fn set_mut<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a mut Set>, ()> {
    match ctx.get(key) {
        None => Ok(None),
        Some(e) => match &mut e.value {
            Value::Set(s) => Ok(Some(s)),
            _ => Err(()),
        },
    }
}

/// A live set already looked up in this command, borrowed from the table alone.
fn peek<'a>(shard: &'a Shard, db: usize, key: &[u8]) -> Option<&'a Set> {
    match shard.dbs[db].table.get(key) {
        Some(Entry {
            value: Value::Set(s),
            ..
        }) => Some(s),
        _ => None,
    }
}

/// Looks `key` up for a read (a keyspace hit or miss) and lends the set together with
/// the reply buffer, so members can be written while the set is borrowed.
fn read_set<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<(&'a Set, &'a mut Reply)>, ()> {
    match kind(ctx.get_read(key)) {
        Kind::Missing => Ok(None),
        Kind::Other => Err(()),
        Kind::Set => {
            let s = peek(ctx.shard, ctx.db, key).expect("just found");
            Ok(Some((s, &mut *ctx.out)))
        }
    }
}

/// Looks every key up for a read, stopping at the first that holds another type (Err),
/// then lends the sets (None for a missing key) and the reply buffer.
fn read_sets<'a>(
    ctx: &'a mut ExecCtx,
    keys: &[Bytes],
) -> Result<(Vec<Option<&'a Set>>, &'a mut Reply), ()> {
    for k in keys {
        if kind(ctx.get_read(k)) == Kind::Other {
            return Err(());
        }
    }
    let shard: &'a Shard = ctx.shard;
    let sets = keys.iter().map(|k| peek(shard, ctx.db, k)).collect();
    Ok((sets, &mut *ctx.out))
}

/// Copies the sets at `keys` from the shards owning them, in argument order; Err when
/// one holds another type.
async fn fetch_sets(
    worker: &Rc<Worker>,
    tx: &Tx,
    db: usize,
    keys: &[Bytes],
) -> Result<Vec<Option<Box<Set>>>, ()> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let s = worker.shard_of(k);
        match groups.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push(i),
            None => groups.push((s, vec![i])),
        }
    }
    groups.sort_by_key(|g| g.0);
    let mut out: Vec<Option<Box<Set>>> = (0..keys.len()).map(|_| None).collect();
    for (shard, positions) in groups {
        let names: Vec<Bytes> = positions.iter().map(|&i| keys[i].clone()).collect();
        let found = tx
            .run(shard, move |sh| {
                sh.with_ctx(db, |ctx| {
                    let mut v = Vec::with_capacity(names.len());
                    for k in &names {
                        match ctx.get_read(k) {
                            None => v.push(None),
                            Some(e) => match &e.value {
                                Value::Set(s) => v.push(Some(s.clone())),
                                _ => return Err(()),
                            },
                        }
                    }
                    Ok(v)
                })
            })
            .await?;
        for (i, s) in positions.into_iter().zip(found) {
            out[i] = s;
        }
    }
    Ok(out)
}

fn borrow_all(sets: &[Option<Box<Set>>]) -> Vec<Option<&Set>> {
    sets.iter().map(|s| s.as_deref()).collect()
}

fn bulk_member(out: &mut Reply, m: Member) {
    let mut scratch = [0u8; 20];
    out.bulk(m.bytes(&mut scratch));
}

/// A whole set as a RESP3 set (an array in RESP2), in the set's own order.
fn reply_set(out: &mut Reply, s: &Set) {
    out.set(s.len());
    for m in s.iter() {
        bulk_member(out, m);
    }
}

// ---------------------------------------------------------------------------------------
// Single-key commands
// ---------------------------------------------------------------------------------------

pub fn sadd(ctx: &mut ExecCtx, args: &[Bytes]) {
    let key = &args[1];
    let members = &args[2..];
    let (added, created) = match set_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(Some(s)) => {
            s.prepare_for(members.len());
            let n = members.iter().filter(|m| s.add(m)).count();
            s.trim();
            (n, false)
        }
        Ok(None) => {
            let mut s = Set::create_for(&members[0], members.len());
            let n = members.iter().filter(|m| s.add(m)).count();
            s.trim();
            ctx.set(key, Value::Set(Box::new(s)), 0);
            (n, true)
        }
    };
    if added > 0 {
        if !created {
            ctx.modified(key);
        }
        ctx.notify(b's', "sadd", key);
    }
    ctx.out.int(added as i64);
}

pub fn srem(ctx: &mut ExecCtx, args: &[Bytes]) {
    let key = &args[1];
    let (removed, emptied) = match set_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.int(0),
        Ok(Some(s)) => {
            let mut n = 0;
            for m in &args[2..] {
                if s.remove(m) {
                    n += 1;
                    if s.is_empty() {
                        break;
                    }
                }
            }
            s.trim();
            (n, s.is_empty())
        }
    };
    if removed > 0 {
        if emptied {
            ctx.delete(key);
        } else {
            ctx.modified(key);
        }
        ctx.notify(b's', "srem", key);
        if emptied {
            ctx.notify(b'g', "del", key);
        }
    }
    ctx.out.int(removed);
}

pub fn smembers(ctx: &mut ExecCtx, args: &[Bytes]) {
    match read_set(ctx, &args[1]) {
        Err(()) => ctx.out.error(WRONGTYPE),
        Ok(None) => ctx.out.set(0),
        Ok(Some((s, out))) => reply_set(out, s),
    }
}

pub fn sismember(ctx: &mut ExecCtx, args: &[Bytes]) {
    match read_set(ctx, &args[1]) {
        Err(()) => ctx.out.error(WRONGTYPE),
        Ok(None) => ctx.out.int(0),
        Ok(Some((s, out))) => out.int(s.contains(&args[2]) as i64),
    }
}

pub fn smismember(ctx: &mut ExecCtx, args: &[Bytes]) {
    let members = &args[2..];
    match read_set(ctx, &args[1]) {
        Err(()) => ctx.out.error(WRONGTYPE),
        Ok(None) => {
            ctx.out.array(members.len());
            for _ in members {
                ctx.out.int(0);
            }
        }
        Ok(Some((s, out))) => {
            out.array(members.len());
            for m in members {
                out.int(s.contains(m) as i64);
            }
        }
    }
}

pub fn scard(ctx: &mut ExecCtx, args: &[Bytes]) {
    match read_set(ctx, &args[1]) {
        Err(()) => ctx.out.error(WRONGTYPE),
        Ok(None) => ctx.out.int(0),
        Ok(Some((s, out))) => out.int(s.len() as i64),
    }
}

pub fn spop(ctx: &mut ExecCtx, args: &[Bytes]) {
    if args.len() > 3 {
        return ctx.out.error(SYNTAX_ERR);
    }
    if args.len() == 3 {
        return spop_count(ctx, args);
    }
    let key = &args[1];
    let mut rng = Rng::new(ctx.shard.random());
    let (member, emptied) = match set_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.null(),
        Ok(Some(s)) => {
            let m = s.pop_random(&mut rng);
            s.trim();
            (m, s.is_empty())
        }
    };
    ctx.notify(b's', "spop", key);
    if ctx.logging() {
        // Chance chose the member: the log names it.
        ctx.log_as(crate::persist::aof::effects::words(&[
            b"SREM", key, &member,
        ]));
    }
    ctx.out.bulk(&member);
    if emptied {
        ctx.delete(key);
        ctx.notify(b'g', "del", key);
    } else {
        ctx.modified(key);
    }
}

fn spop_count(ctx: &mut ExecCtx, args: &[Bytes]) {
    let count = match parse_i64(&args[2]) {
        Ok(n) if n >= 0 => n as usize,
        _ => return ctx.out.error(NOT_POSITIVE),
    };
    let key = &args[1];
    let mut rng = Rng::new(ctx.shard.random());
    let resp3 = ctx.out.resp3;
    let mut out = Reply::new(resp3);
    let emptied = match set_mut(ctx, key) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.set(0),
        Ok(Some(_)) if count == 0 => return ctx.out.set(0),
        Ok(Some(s)) => {
            if count >= s.len() {
                // Redis answers this case with SUNION of the key, whose order (integers
                // ascending first, for a listpack) differs from the set's own.
                reply_set(&mut out, &set::union(&[Some(&*s)]));
                true
            } else {
                let popped = s.pop_many(count, &mut rng);
                s.trim();
                out.set(popped.len());
                for m in &popped {
                    out.bulk(m);
                }
                if ctx.shard.aof_on() {
                    // The members chance chose, in SREMs of at most 1024, as Redis logs them.
                    for chunk in popped.chunks(1024) {
                        let mut argv = vec![Bytes::from_static(b"SREM"), key.clone()];
                        argv.extend(chunk.iter().map(|m| Bytes::copy_from_slice(m)));
                        ctx.log_as(argv);
                    }
                }
                false
            }
        }
    };
    ctx.notify(b's', "spop", key);
    if emptied {
        if ctx.logging() {
            ctx.log_as(crate::persist::aof::effects::words(&[b"DEL", key]));
        }
        ctx.delete(key);
        ctx.notify(b'g', "del", key);
    } else {
        ctx.modified(key);
    }
    ctx.out.raw(&out.buf);
}

pub fn srandmember(ctx: &mut ExecCtx, args: &[Bytes]) {
    if args.len() > 3 {
        return ctx.out.error(SYNTAX_ERR);
    }
    let mut rng = Rng::new(ctx.shard.random());
    if args.len() == 2 {
        return match read_set(ctx, &args[1]) {
            Err(()) => ctx.out.error(WRONGTYPE),
            Ok(None) => ctx.out.null(),
            Ok(Some((s, out))) => bulk_member(out, s.random_member(&mut rng)),
        };
    }
    let count = match parse_i64(&args[2]) {
        Err(e) => return ctx.out.error(e),
        Ok(i64::MIN) => return ctx.out.error(COUNT_RANGE),
        Ok(n) => n,
    };
    let (s, out) = match read_set(ctx, &args[1]) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => return ctx.out.array(0),
        Ok(Some(found)) => found,
    };
    let size = s.len();
    let wanted = count.unsigned_abs() as usize;
    if count == 0 {
        out.array(0);
    } else if count < 0 || count == 1 {
        out.array(wanted);
        for _ in 0..wanted {
            bulk_member(out, s.random_member(&mut rng));
        }
    } else if wanted >= size {
        out.array(size);
        for m in s.iter() {
            bulk_member(out, m);
        }
    } else {
        let picked = s.sample_distinct(wanted, &mut rng);
        out.array(picked.len());
        for m in &picked {
            out.bulk(m);
        }
    }
}

// ---------------------------------------------------------------------------------------
// SMOVE
// ---------------------------------------------------------------------------------------

/// Removes `m` from the set at `src` (known to be one); false when it was not there.
fn take_member(ctx: &mut ExecCtx, src: &[u8], m: &[u8]) -> bool {
    let emptied = match set_mut(ctx, src) {
        Ok(Some(s)) => {
            if !s.remove(m) {
                return false;
            }
            s.trim();
            s.is_empty()
        }
        _ => return false,
    };
    ctx.notify(b's', "srem", src);
    if emptied {
        ctx.delete(src);
        ctx.notify(b'g', "del", src);
    } else {
        ctx.modified(src);
    }
    true
}

/// Adds `m` to the set at `dst` (missing or a set), creating it as Redis would.
fn put_member(ctx: &mut ExecCtx, dst: &[u8], m: &[u8]) {
    let added = match set_mut(ctx, dst) {
        Ok(Some(s)) => {
            let added = s.add(m);
            s.trim();
            added
        }
        _ => {
            let mut s = Set::create_for(m, 1);
            s.add(m);
            s.trim();
            ctx.set(dst, Value::Set(Box::new(s)), 0);
            true
        }
    };
    if added {
        ctx.modified(dst);
        ctx.notify(b's', "sadd", dst);
    }
}

pub fn smove(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (src, dst, m) = (&args[1], &args[2], &args[3]);
    let src_kind = kind(ctx.get(src));
    let dst_kind = kind(ctx.get(dst));
    match src_kind {
        Kind::Missing => return ctx.out.int(0),
        Kind::Other => return ctx.out.error(WRONGTYPE),
        Kind::Set => {}
    }
    if dst_kind == Kind::Other {
        return ctx.out.error(WRONGTYPE);
    }
    if src == dst {
        let member = peek(ctx.shard, ctx.db, src).is_some_and(|s| s.contains(m));
        return ctx.out.int(member as i64);
    }
    if !take_member(ctx, src, m) {
        return ctx.out.int(0);
    }
    put_member(ctx, dst, m);
    ctx.out.int(1);
}

cross_handler!(smove_cross, |sess, args, tx| {
    let db = sess.db;
    let (src, dst, m) = (args[1].clone(), args[2].clone(), args[3].clone());
    let src_shard = sess.worker.shard_of(&src);
    let dst_shard = sess.worker.shard_of(&dst);
    let k = src.clone();
    let src_kind = tx
        .run(src_shard, move |sh| {
            sh.with_ctx(db, |ctx| kind(ctx.get(&k)))
        })
        .await;
    let k = dst.clone();
    let dst_kind = tx
        .run(dst_shard, move |sh| {
            sh.with_ctx(db, |ctx| kind(ctx.get(&k)))
        })
        .await;
    match src_kind {
        Kind::Missing => return sess.out.int(0),
        Kind::Other => return sess.out.error(WRONGTYPE),
        Kind::Set => {}
    }
    if dst_kind == Kind::Other {
        return sess.out.error(WRONGTYPE);
    }
    let member = m.clone();
    let taken = tx
        .run(src_shard, move |sh| {
            sh.with_ctx(db, |ctx| take_member(ctx, &src, &member))
        })
        .await;
    if !taken {
        return sess.out.int(0);
    }
    tx.run(dst_shard, move |sh| {
        sh.with_ctx(db, |ctx| put_member(ctx, &dst, &m))
    })
    .await;
    sess.out.int(1);
});

// ---------------------------------------------------------------------------------------
// SINTER, SINTERCARD, SUNION, SDIFF and the STORE forms
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Inter,
    Union,
    Diff,
}

impl Op {
    fn store_event(self) -> &'static str {
        match self {
            Op::Inter => "sinterstore",
            Op::Union => "sunionstore",
            Op::Diff => "sdiffstore",
        }
    }
}

/// Writes the reply of SINTER, SUNION or SDIFF over `sets` (None: a missing key).
fn reply_op(out: &mut Reply, op: Op, keys: &[Bytes], sets: &[Option<&Set>]) {
    match op {
        Op::Inter => {
            let Some(present) = sets.iter().copied().collect::<Option<Vec<&Set>>>() else {
                return out.set(0);
            };
            let members = set::intersection(&present);
            out.set(members.len());
            for m in members {
                bulk_member(out, m);
            }
        }
        _ => reply_set(out, &compute(op, keys, sets)),
    }
}

/// The value a STORE form writes (or the result SUNION and SDIFF reply with).
fn compute(op: Op, keys: &[Bytes], sets: &[Option<&Set>]) -> Set {
    match op {
        Op::Inter => match sets.iter().copied().collect::<Option<Vec<&Set>>>() {
            Some(present) => set::intersection_set(&present),
            None => Set::new_intset(),
        },
        Op::Union => set::union(sets),
        Op::Diff => {
            let repeated = sets[0].is_some() && keys[1..].iter().any(|k| *k == keys[0]);
            set::difference(sets, repeated)
        }
    }
}

/// Stores a STORE form's result at `dst` (deleting it when the result is empty) and
/// returns the size stored.
fn store(ctx: &mut ExecCtx, dst: &[u8], result: Set, event: &'static str) -> i64 {
    if result.is_empty() {
        if ctx.delete(dst) {
            ctx.notify(b'g', "del", dst);
        }
        return 0;
    }
    let n = result.len() as i64;
    let mut result = result;
    result.trim();
    ctx.set(dst, Value::Set(Box::new(result)), 0);
    ctx.notify(b's', event, dst);
    n
}

fn read_op(ctx: &mut ExecCtx, args: &[Bytes], op: Op) {
    let keys = &args[1..];
    match read_sets(ctx, keys) {
        Err(()) => ctx.out.error(WRONGTYPE),
        Ok((sets, out)) => reply_op(out, op, keys, &sets),
    }
}

fn store_op(ctx: &mut ExecCtx, args: &[Bytes], op: Op) {
    let keys = &args[2..];
    let result = match read_sets(ctx, keys) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok((sets, _)) => compute(op, keys, &sets),
    };
    let n = store(ctx, &args[1], result, op.store_event());
    ctx.out.int(n);
}

async fn read_op_cross(
    sess: &mut crate::server::session::Session,
    args: &[Bytes],
    tx: &Tx,
    op: Op,
) {
    let keys = &args[1..];
    match fetch_sets(&sess.worker, tx, sess.db, keys).await {
        Err(()) => sess.out.error(WRONGTYPE),
        Ok(sets) => reply_op(&mut sess.out, op, keys, &borrow_all(&sets)),
    }
}

async fn store_op_cross(
    sess: &mut crate::server::session::Session,
    args: &[Bytes],
    tx: &Tx,
    op: Op,
) {
    let keys = &args[2..];
    let result = match fetch_sets(&sess.worker, tx, sess.db, keys).await {
        Err(()) => return sess.out.error(WRONGTYPE),
        Ok(sets) => compute(op, keys, &borrow_all(&sets)),
    };
    let db = sess.db;
    let dst = args[1].clone();
    let event = op.store_event();
    let n = tx
        .run(sess.worker.shard_of(&dst), move |sh| {
            sh.with_ctx(db, |ctx| store(ctx, &dst, result, event))
        })
        .await;
    sess.out.int(n);
}

pub fn sinter(ctx: &mut ExecCtx, args: &[Bytes]) {
    read_op(ctx, args, Op::Inter);
}

pub fn sunion(ctx: &mut ExecCtx, args: &[Bytes]) {
    read_op(ctx, args, Op::Union);
}

pub fn sdiff(ctx: &mut ExecCtx, args: &[Bytes]) {
    read_op(ctx, args, Op::Diff);
}

pub fn sinterstore(ctx: &mut ExecCtx, args: &[Bytes]) {
    store_op(ctx, args, Op::Inter);
}

pub fn sunionstore(ctx: &mut ExecCtx, args: &[Bytes]) {
    store_op(ctx, args, Op::Union);
}

pub fn sdiffstore(ctx: &mut ExecCtx, args: &[Bytes]) {
    store_op(ctx, args, Op::Diff);
}

cross_handler!(sinter_cross, |sess, args, tx| {
    read_op_cross(sess, &args, tx, Op::Inter).await;
});

cross_handler!(sunion_cross, |sess, args, tx| {
    read_op_cross(sess, &args, tx, Op::Union).await;
});

cross_handler!(sdiff_cross, |sess, args, tx| {
    read_op_cross(sess, &args, tx, Op::Diff).await;
});

cross_handler!(sinterstore_cross, |sess, args, tx| {
    store_op_cross(sess, &args, tx, Op::Inter).await;
});

cross_handler!(sunionstore_cross, |sess, args, tx| {
    store_op_cross(sess, &args, tx, Op::Union).await;
});

cross_handler!(sdiffstore_cross, |sess, args, tx| {
    store_op_cross(sess, &args, tx, Op::Diff).await;
});

/// SINTERCARD's numkeys and LIMIT, checked in Redis's order.
fn parse_sintercard(args: &[Bytes]) -> Result<(usize, usize), &'static str> {
    let numkeys = match parse_i64(&args[1]) {
        Ok(n) if n >= 1 => n as u64,
        _ => return Err(NUMKEYS_ERR),
    };
    if numkeys > (args.len() - 2) as u64 {
        return Err(NUMKEYS_ARGS_ERR);
    }
    let numkeys = numkeys as usize;
    let mut limit = 0;
    let mut j = 2 + numkeys;
    while j < args.len() {
        if eq_ci(&args[j], "limit") && j + 1 < args.len() {
            limit = match parse_i64(&args[j + 1]) {
                Ok(n) if n >= 0 => n as usize,
                _ => return Err(LIMIT_ERR),
            };
            j += 2;
        } else {
            return Err(SYNTAX_ERR);
        }
    }
    Ok((numkeys, limit))
}

/// SINTERCARD's key positions: the `numkeys` arguments after it, none when numkeys is
/// invalid (the command then answers its error where it is).
pub fn sintercard_keys(args: &[Bytes]) -> Vec<usize> {
    match parse_i64(&args[1]) {
        Ok(n) if n >= 1 && n as u64 <= (args.len() - 2) as u64 => (2..2 + n as usize).collect(),
        _ => Vec::new(),
    }
}

fn intersection_card(sets: &[Option<&Set>], limit: usize) -> i64 {
    match sets.iter().copied().collect::<Option<Vec<&Set>>>() {
        Some(present) => set::intersection_card(&present, limit) as i64,
        None => 0,
    }
}

pub fn sintercard(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (numkeys, limit) = match parse_sintercard(args) {
        Ok(p) => p,
        Err(e) => return ctx.out.error(e),
    };
    match read_sets(ctx, &args[2..2 + numkeys]) {
        Err(()) => ctx.out.error(WRONGTYPE),
        Ok((sets, out)) => out.int(intersection_card(&sets, limit)),
    }
}

cross_handler!(sintercard_cross, |sess, args, tx| {
    let (numkeys, limit) = match parse_sintercard(&args) {
        Ok(p) => p,
        Err(e) => return sess.out.error(e),
    };
    match fetch_sets(&sess.worker, tx, sess.db, &args[2..2 + numkeys]).await {
        Err(()) => sess.out.error(WRONGTYPE),
        Ok(sets) => {
            let n = intersection_card(&borrow_all(&sets), limit);
            sess.out.int(n)
        }
    }
});

// ---------------------------------------------------------------------------------------
// SSCAN
// ---------------------------------------------------------------------------------------

pub fn sscan(ctx: &mut ExecCtx, args: &[Bytes]) {
    let Some(cursor) = parse_cursor(&args[2]) else {
        return ctx.out.error("ERR invalid cursor");
    };
    let (s, out) = match read_set(ctx, &args[1]) {
        Err(()) => return ctx.out.error(WRONGTYPE),
        Ok(None) => {
            ctx.out.array(2);
            ctx.out.bulk(b"0");
            return ctx.out.array(0);
        }
        Ok(Some(found)) => found,
    };
    let mut count = 10usize;
    let mut pattern: Option<&[u8]> = None;
    let mut i = 3;
    while i < args.len() {
        let more = i + 1 < args.len();
        if eq_ci(&args[i], "count") && more {
            match parse_i64(&args[i + 1]) {
                Err(_) => return out.error(NOT_INT),
                Ok(n) if n < 1 => return out.error(SYNTAX_ERR),
                Ok(n) => count = n as usize,
            }
        } else if eq_ci(&args[i], "match") && more {
            let p = &args[i + 1][..];
            pattern = if p == b"*" { None } else { Some(p) };
        } else {
            return out.error(SYNTAX_ERR);
        }
        i += 2;
    }
    let mut found: Vec<Vec<u8>> = Vec::new();
    let next = s.scan(cursor, count, |m| {
        let mut scratch = [0u8; 20];
        let b = m.bytes(&mut scratch);
        if pattern.is_none_or(|p| glob_match(p, b, false)) {
            found.push(b.to_vec());
        }
    });
    out.array(2);
    out.bulk(next.to_string().as_bytes());
    out.array(found.len());
    for m in &found {
        out.bulk(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_parse_like_strtoul() {
        assert_eq!(parse_cursor(b"0"), Some(0));
        assert_eq!(parse_cursor(b"+5"), Some(5));
        assert_eq!(parse_cursor(b"-1"), Some(u64::MAX));
        assert_eq!(parse_cursor(b""), Some(0));
        assert_eq!(parse_cursor(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551616"), None);
        assert_eq!(parse_cursor(b" 5"), None);
        assert_eq!(parse_cursor(b"5 "), None);
        assert_eq!(parse_cursor(b"abc"), None);
        assert_eq!(parse_cursor(b"-"), None);
        assert_eq!(parse_cursor(b"7\0junk"), Some(7));
    }

    #[test]
    fn sintercard_arguments() {
        let a = |s: &str| -> Vec<Bytes> {
            s.split(' ')
                .map(|w| Bytes::copy_from_slice(w.as_bytes()))
                .collect()
        };
        assert_eq!(parse_sintercard(&a("sintercard 2 x y")), Ok((2, 0)));
        assert_eq!(parse_sintercard(&a("sintercard 1 x limit 3")), Ok((1, 3)));
        assert_eq!(parse_sintercard(&a("sintercard 0 x")), Err(NUMKEYS_ERR));
        assert_eq!(parse_sintercard(&a("sintercard x x")), Err(NUMKEYS_ERR));
        assert_eq!(
            parse_sintercard(&a("sintercard 3 x y")),
            Err(NUMKEYS_ARGS_ERR)
        );
        assert_eq!(
            parse_sintercard(&a("sintercard 1 x limit -1")),
            Err(LIMIT_ERR)
        );
        assert_eq!(
            parse_sintercard(&a("sintercard 1 x limit")),
            Err(SYNTAX_ERR)
        );
        assert_eq!(sintercard_keys(&a("sintercard 2 x y limit 1")), vec![2, 3]);
        assert!(sintercard_keys(&a("sintercard 5 x")).is_empty());
    }
}
