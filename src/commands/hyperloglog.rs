//! The HyperLogLog family: PFADD, PFCOUNT, PFMERGE, PFDEBUG and PFSELFTEST, over string
//! values in Redis's layout (`types::hll`).
//!
//! PFCOUNT and PFMERGE over keys on several shards read each source on its shard under
//! the transaction that holds every key, fold the registers on the coordinating thread,
//! and write PFMERGE's result on the destination's shard.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::cross_handler;
use crate::shard::ExecCtx;
use crate::types::hll::{self, Corrupt};
use crate::types::value::{StrValue, Value, WRONGTYPE};

fn max_bytes(ctx: &ExecCtx) -> usize {
    ctx.shard
        .shared
        .tunables
        .hll_sparse_max_bytes
        .load(Ordering::Relaxed)
}

/// The HLL bytes at `key` for reading: Ok(None) when missing, Err(reply) when the key
/// holds something that is not an HLL.
fn read<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a [u8]>, &'static str> {
    match ctx.get_read(key) {
        None => Ok(None),
        Some(e) => match &e.value {
            Value::Str(s) => match s.raw_bytes() {
                Some(b) if hll::looks_valid(b) => Ok(Some(b)),
                _ => Err(hll::WRONG_HLL),
            },
            _ => Err(WRONGTYPE),
        },
    }
}

/// The HLL bytes at `key` for changing in place (the value becomes `raw`, as in Redis).
fn write<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a mut Vec<u8>>, &'static str> {
    match ctx.get(key) {
        None => Ok(None),
        Some(e) => match &mut e.value {
            // Checked before `make_mut`, which turns the string `raw`: a refused PFADD
            // leaves it as it was, as Redis does.
            Value::Str(s) if s.raw_bytes().is_some_and(hll::looks_valid) => Ok(Some(s.make_mut())),
            Value::Str(_) => Err(hll::WRONG_HLL),
            _ => Err(WRONGTYPE),
        },
    }
}

fn err(_: Corrupt) -> &'static str {
    hll::INVALID
}

pub fn pfadd(ctx: &mut ExecCtx, args: &[Bytes]) {
    let key = &args[1];
    let max = max_bytes(ctx);
    let mut updated = false;
    if !ctx.exists(key) {
        ctx.set(key, Value::Str(StrValue::Mutated(hll::new_sparse())), 0);
        updated = true;
    }
    let result = match write(ctx, key) {
        Err(e) => Err(e),
        Ok(None) => unreachable!("PFADD's key was just made"),
        Ok(Some(v)) => {
            let mut r = Ok(());
            for ele in &args[2..] {
                match hll::add(v, ele, max) {
                    Ok(changed) => updated |= changed,
                    Err(c) => {
                        r = Err(err(c));
                        break;
                    }
                }
            }
            if updated && r.is_ok() {
                hll::invalidate_cache(v);
            }
            r
        }
    };
    if let Err(e) = result {
        // Registers raised before a corrupt opcode stay raised, as in Redis; the change
        // is still a change for watchers and the log.
        if updated {
            ctx.modified(key);
        }
        return ctx.out.error(e);
    }
    if updated {
        ctx.modified(key);
        ctx.notify(b'$', "pfadd", key);
    }
    ctx.out.int(updated as i64);
}

/// Folds every key's registers into `max`, in argument order (the first bad key answers).
fn merge_keys(ctx: &mut ExecCtx, keys: &[Bytes], max: &mut [u8]) -> Result<bool, &'static str> {
    let mut any_dense = false;
    for k in keys {
        if let Some(v) = read(ctx, k)? {
            any_dense |= !hll::is_sparse(v);
            hll::merge_into(max, v).map_err(err)?;
        }
    }
    Ok(any_dense)
}

pub fn pfcount(ctx: &mut ExecCtx, args: &[Bytes]) {
    if args.len() > 2 {
        let mut max = vec![0u8; hll::REGISTERS];
        return match merge_keys(ctx, &args[1..], &mut max) {
            Ok(_) => ctx.out.int(hll::count_registers(&max) as i64),
            Err(e) => ctx.out.error(e),
        };
    }
    let key = &args[1];
    match read(ctx, key) {
        Err(e) => return ctx.out.error(e),
        Ok(None) => return ctx.out.int(0),
        Ok(Some(v)) => {
            if let Some(c) = hll::cached(v) {
                return ctx.out.int(c as i64);
            }
        }
    }
    // The cache is stale: count, and store the count in the value (a change Redis
    // propagates, though PFCOUNT is a read command).
    let v = match write(ctx, key) {
        Ok(Some(v)) => v,
        Ok(None) => return ctx.out.int(0),
        Err(e) => return ctx.out.error(e),
    };
    match hll::count(v) {
        Err(c) => ctx.out.error(err(c)),
        Ok(card) => {
            hll::store_cache(v, card);
            ctx.modified(key);
            ctx.out.int(card as i64);
        }
    }
}

/// Writes merged registers into `dst` (created sparse when missing, made dense first when
/// any source was dense), as Redis's PFMERGE does register by register.
fn store_merge(ctx: &mut ExecCtx, dst: &[u8], max: &[u8], dense: bool) -> Result<(), &'static str> {
    let limit = max_bytes(ctx);
    if !ctx.exists(dst) {
        ctx.set(dst, Value::Str(StrValue::Mutated(hll::new_sparse())), 0);
    }
    let v = write(ctx, dst)?.expect("PFMERGE's destination was just made");
    if dense {
        hll::sparse_to_dense(v).map_err(err)?;
    }
    for (i, &m) in max.iter().enumerate() {
        if m != 0 {
            // A corrupt destination was refused when it was read as a source.
            let _ = hll::set_register(v, i, m, limit);
        }
    }
    hll::invalidate_cache(v);
    ctx.modified(dst);
    ctx.notify(b'$', "pfadd", dst);
    Ok(())
}

pub fn pfmerge(ctx: &mut ExecCtx, args: &[Bytes]) {
    let mut max = vec![0u8; hll::REGISTERS];
    let r = merge_keys(ctx, &args[1..], &mut max)
        .and_then(|dense| store_merge(ctx, &args[1], &max, dense));
    match r {
        Ok(()) => ctx.out.ok(),
        Err(e) => ctx.out.error(e),
    }
}

/// Reads every key on its own shard and folds them here, in argument order.
async fn merge_cross(
    sess: &mut crate::server::session::Session,
    keys: &[Bytes],
    tx: &crate::shard::tx::Tx,
) -> Result<(Vec<u8>, bool), &'static str> {
    let db = sess.db;
    let mut max = vec![0u8; hll::REGISTERS];
    let mut dense = false;
    for k in keys {
        let key = k.clone();
        let copy = tx
            .run(sess.worker.shard_of(k), move |sh| {
                sh.with_ctx(db, |ctx| read(ctx, &key).map(|v| v.map(|b| b.to_vec())))
            })
            .await?;
        if let Some(v) = copy {
            dense |= !hll::is_sparse(&v);
            hll::merge_into(&mut max, &v).map_err(err)?;
        }
    }
    Ok((max, dense))
}

cross_handler!(pfcount_cross, |sess, args, tx| {
    match merge_cross(sess, &args[1..], tx).await {
        Ok((max, _)) => sess.out.int(hll::count_registers(&max) as i64),
        Err(e) => sess.out.error(e),
    }
});

cross_handler!(pfmerge_cross, |sess, args, tx| {
    let (max, dense) = match merge_cross(sess, &args[1..], tx).await {
        Ok(m) => m,
        Err(e) => return sess.out.error(e),
    };
    let db = sess.db;
    let dst = args[1].clone();
    let r = tx
        .run(sess.worker.shard_of(&dst), move |sh| {
            sh.with_ctx(db, |ctx| store_merge(ctx, &dst, &max, dense))
        })
        .await;
    match r {
        Ok(()) => sess.out.ok(),
        Err(e) => sess.out.error(e),
    }
});

pub fn pfdebug(ctx: &mut ExecCtx, args: &[Bytes]) {
    let sub = String::from_utf8_lossy(&args[1]).into_owned();
    let key = &args[2];
    let v = match write(ctx, key) {
        Ok(Some(v)) => v,
        Ok(None) => return ctx.out.error("ERR The specified key does not exist"),
        Err(e) => return ctx.out.error(e),
    };
    match sub.to_ascii_lowercase().as_str() {
        "getreg" => {
            let converted = hll::is_sparse(v);
            if let Err(c) = hll::sparse_to_dense(v) {
                return ctx.out.error(err(c));
            }
            let regs = hll::registers(v);
            if converted {
                ctx.modified(key);
            }
            ctx.out.array(regs.len());
            for r in regs {
                ctx.out.int(r as i64);
            }
        }
        "decode" => {
            if !hll::is_sparse(v) {
                return ctx.out.error("ERR HLL encoding is not sparse");
            }
            let text = hll::decode(v);
            ctx.out.bulk(text.as_bytes());
        }
        "encoding" => {
            let name = if hll::is_sparse(v) { "sparse" } else { "dense" };
            ctx.out.simple(name);
        }
        "todense" => {
            let converted = hll::is_sparse(v);
            if let Err(c) = hll::sparse_to_dense(v) {
                return ctx.out.error(err(c));
            }
            if converted {
                ctx.modified(key);
            }
            ctx.out.int(converted as i64);
        }
        _ => ctx
            .out
            .error(&format!("ERR Unknown PFDEBUG subcommand '{sub}'")),
    }
}

pub fn pfselftest(sess: &mut crate::server::session::Session, _args: &[Bytes]) {
    let mut state = crate::clock::unix_ms() | 1;
    let random = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let max = sess
        .worker
        .shared
        .tunables
        .hll_sparse_max_bytes
        .load(Ordering::Relaxed);
    match hll::self_test(random, max) {
        Ok(()) => sess.out.ok(),
        Err(e) => sess.out.error(&format!("ERR {e}")),
    }
}
