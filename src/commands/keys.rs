//! The keyspace family: DEL, EXISTS, TYPE, RENAME, COPY, MOVE, KEYS, SCAN, RANDOMKEY,
//! expiry, OBJECT, DUMP/RESTORE, and the whole-database commands (DBSIZE, FLUSHDB,
//! FLUSHALL, SWAPDB).

use bytes::Bytes;

use super::util::{eq_ci, glob_match, parse_i64, NOT_INT, NO_SUCH_KEY, SYNTAX_ERR};
use crate::protocol::reply::Reply;
use crate::server::session::Session;
use crate::shard::tx::{keys_by_shard, Tx};
use crate::shard::{broadcast, hop, unix_ms, ExecCtx, Shard};
use crate::types::value::{StrValue, Value};
use crate::{async_handler, cross_handler};

const DB_RANGE: &str = "ERR DB index is out of range";
const SAME_OBJECT: &str = "ERR source and destination objects are the same";

// ---- DEL / UNLINK / EXISTS / TOUCH ----

/// Deletes keys, with a `del` event for each one that existed.
fn delete_keys(ctx: &mut ExecCtx, keys: &[Bytes]) -> i64 {
    let mut n = 0;
    for k in keys {
        if ctx.delete(k) {
            ctx.notify(b'g', "del", k);
            n += 1;
        }
    }
    n
}

fn del_here(sh: &mut Shard, db: usize, keys: &[Bytes]) -> i64 {
    let mut out = Reply::new(false);
    let mut ctx = sh.ctx(db, &mut out);
    delete_keys(&mut ctx, keys)
}

pub fn del(ctx: &mut ExecCtx, args: &[Bytes]) {
    let n = delete_keys(ctx, &args[1..]);
    ctx.out.int(n);
}

/// Sums an integer computed per shard over a command's keys.
async fn sum_over_shards(
    sess: &mut Session,
    keys: &[Bytes],
    tx: &Tx,
    f: fn(&mut Shard, usize, &[Bytes]) -> i64,
) -> i64 {
    let db = sess.db;
    let mut total = 0;
    for (shard, keys) in keys_by_shard(&sess.worker, keys) {
        total += tx.run(shard, move |sh| f(sh, db, &keys)).await;
    }
    total
}

cross_handler!(del_cross, |sess, args, tx| {
    let n = sum_over_shards(sess, &args[1..], tx, del_here).await;
    sess.out.int(n);
});

fn exists_here(sh: &mut Shard, db: usize, keys: &[Bytes]) -> i64 {
    let now = unix_ms();
    keys.iter()
        .filter(|k| sh.lookup(db, k, now).is_some())
        .count() as i64
}

pub fn exists(ctx: &mut ExecCtx, args: &[Bytes]) {
    let n = args[1..].iter().filter(|k| ctx.exists(k)).count();
    ctx.out.int(n as i64);
}

cross_handler!(exists_cross, |sess, args, tx| {
    let n = sum_over_shards(sess, &args[1..], tx, exists_here).await;
    sess.out.int(n);
});

fn touch_here(sh: &mut Shard, db: usize, keys: &[Bytes]) -> i64 {
    let mut out = Reply::new(false);
    let mut ctx = sh.ctx(db, &mut out);
    keys.iter().filter(|k| ctx.get(k).is_some()).count() as i64
}

pub fn touch(ctx: &mut ExecCtx, args: &[Bytes]) {
    let n = args[1..].iter().filter(|k| ctx.get(k).is_some()).count();
    ctx.out.int(n as i64);
}

cross_handler!(touch_cross, |sess, args, tx| {
    let n = sum_over_shards(sess, &args[1..], tx, touch_here).await;
    sess.out.int(n);
});

pub fn type_(ctx: &mut ExecCtx, args: &[Bytes]) {
    let name = match ctx.get(&args[1]) {
        Some(e) => e.value.type_name(),
        None => "none",
    };
    ctx.out.simple(name);
}

// ---- RENAME / RENAMENX / COPY / MOVE ----

/// A value taken out of (or copied from) one key, with its expiry, to be written elsewhere.
type Moved = Option<(Value, u64)>;

fn take_key(sh: &mut Shard, db: usize, key: &[u8]) -> Moved {
    let now = unix_ms();
    sh.lookup(db, key, now)?;
    let e = sh.dbs[db].table.remove(key)?;
    sh.modified(db, key);
    let at = e.expire_at();
    Some((e.value, at))
}

fn copy_key(sh: &mut Shard, db: usize, key: &[u8]) -> Moved {
    let now = unix_ms();
    let e = sh.lookup(db, key, now)?;
    Some((e.value.clone(), e.expire_at()))
}

fn put_key(sh: &mut Shard, db: usize, key: &[u8], value: Value, expire_at: u64) {
    let mut out = Reply::new(false);
    let mut ctx = sh.ctx(db, &mut out);
    ctx.set(key, value, expire_at);
}

fn key_exists(sh: &mut Shard, db: usize, key: &[u8]) -> bool {
    sh.lookup(db, key, unix_ms()).is_some()
}

/// RENAME and RENAMENX on one shard.
fn rename_local(ctx: &mut ExecCtx, args: &[Bytes], nx: bool) {
    let (src, dst) = (&args[1], &args[2]);
    if !ctx.exists(src) {
        ctx.out.error(NO_SUCH_KEY);
        return;
    }
    if src == dst {
        if nx {
            ctx.out.int(0);
        } else {
            ctx.out.ok();
        }
        return;
    }
    if nx && ctx.exists(dst) {
        ctx.out.int(0);
        return;
    }
    let (value, expire) = take_key(ctx.shard, ctx.db, src).expect("checked above");
    ctx.notify(b'g', "rename_from", src);
    ctx.set(dst, value, expire);
    ctx.notify(b'g', "rename_to", dst);
    if nx {
        ctx.out.int(1);
    } else {
        ctx.out.ok();
    }
}

pub fn rename(ctx: &mut ExecCtx, args: &[Bytes]) {
    rename_local(ctx, args, false);
}

pub fn renamenx(ctx: &mut ExecCtx, args: &[Bytes]) {
    rename_local(ctx, args, true);
}

async fn rename_spread(sess: &mut Session, args: Vec<Bytes>, tx: &Tx, nx: bool) {
    let db = sess.db;
    let (src, dst) = (args[1].clone(), args[2].clone());
    let src_shard = sess.worker.shard_of(&src);
    let dst_shard = sess.worker.shard_of(&dst);
    let s = src.clone();
    if !tx.run(src_shard, move |sh| key_exists(sh, db, &s)).await {
        sess.out.error(NO_SUCH_KEY);
        return;
    }
    if nx {
        let d = dst.clone();
        if tx.run(dst_shard, move |sh| key_exists(sh, db, &d)).await {
            sess.out.int(0);
            return;
        }
    }
    let Some((value, expire)) = tx
        .run(src_shard, move |sh| {
            let taken = take_key(sh, db, &src);
            sh.event(db, b'g', "rename_from", &src);
            taken
        })
        .await
    else {
        sess.out.error(NO_SUCH_KEY);
        return;
    };
    tx.run(dst_shard, move |sh| {
        put_key(sh, db, &dst, value, expire);
        sh.event(db, b'g', "rename_to", &dst);
    })
    .await;
    if nx {
        sess.out.int(1);
    } else {
        sess.out.ok();
    }
}

cross_handler!(rename_cross, |sess, args, tx| {
    rename_spread(sess, args, tx, false).await;
});

cross_handler!(renamenx_cross, |sess, args, tx| {
    rename_spread(sess, args, tx, true).await;
});

struct CopyArgs {
    dst_db: usize,
    replace: bool,
}

fn parse_copy(args: &[Bytes], db: usize, databases: usize) -> Result<CopyArgs, &'static str> {
    let mut c = CopyArgs {
        dst_db: db,
        replace: false,
    };
    let mut i = 3;
    while i < args.len() {
        if eq_ci(&args[i], "replace") {
            c.replace = true;
        } else if eq_ci(&args[i], "db") && i + 1 < args.len() {
            let n = parse_i64(&args[i + 1])?;
            if n < 0 || n as usize >= databases {
                return Err(DB_RANGE);
            }
            c.dst_db = n as usize;
            i += 1;
        } else {
            return Err(SYNTAX_ERR);
        }
        i += 1;
    }
    Ok(c)
}

pub fn copy(ctx: &mut ExecCtx, args: &[Bytes]) {
    let databases = ctx.shard.dbs.len();
    let c = match parse_copy(args, ctx.db, databases) {
        Ok(c) => c,
        Err(e) => return ctx.out.error(e),
    };
    if ctx.shard.shared.cluster.is_some() && (c.dst_db != 0 || ctx.db != 0) {
        return ctx
            .out
            .error("ERR Copying to another database is not allowed in cluster mode");
    }
    let (src, dst) = (&args[1], &args[2]);
    if src == dst && c.dst_db == ctx.db {
        return ctx.out.error(SAME_OBJECT);
    }
    let Some((value, expire)) = copy_key(ctx.shard, ctx.db, src) else {
        return ctx.out.int(0);
    };
    if !c.replace && key_exists(ctx.shard, c.dst_db, dst) {
        return ctx.out.int(0);
    }
    put_key(ctx.shard, c.dst_db, dst, value, expire);
    ctx.shard.event(c.dst_db, b'g', "copy_to", dst);
    ctx.out.int(1);
}

cross_handler!(copy_cross, |sess, args, tx| {
    let databases = sess.worker.shared.tunables.databases;
    let c = match parse_copy(&args, sess.db, databases) {
        Ok(c) => c,
        Err(e) => return sess.out.error(e),
    };
    let db = sess.db;
    let (src, dst) = (args[1].clone(), args[2].clone());
    let src_shard = sess.worker.shard_of(&src);
    let dst_shard = sess.worker.shard_of(&dst);
    let Some((value, expire)) = tx.run(src_shard, move |sh| copy_key(sh, db, &src)).await else {
        return sess.out.int(0);
    };
    let (dst_db, replace) = (c.dst_db, c.replace);
    let done = tx
        .run(dst_shard, move |sh| {
            if !replace && key_exists(sh, dst_db, &dst) {
                return false;
            }
            put_key(sh, dst_db, &dst, value, expire);
            sh.event(dst_db, b'g', "copy_to", &dst);
            true
        })
        .await;
    sess.out.int(done as i64);
});

pub fn move_(ctx: &mut ExecCtx, args: &[Bytes]) {
    if ctx.shard.shared.cluster.is_some() {
        return ctx.out.error("ERR MOVE is not allowed in cluster mode");
    }
    let target = match parse_i64(&args[2]) {
        Ok(n) if n >= 0 && (n as usize) < ctx.shard.dbs.len() => n as usize,
        Ok(_) => return ctx.out.error(DB_RANGE),
        Err(_) => return ctx.out.error(NOT_INT),
    };
    if target == ctx.db {
        return ctx.out.error(SAME_OBJECT);
    }
    let key = &args[1];
    if !ctx.exists(key) || key_exists(ctx.shard, target, key) {
        return ctx.out.int(0);
    }
    let (value, expire) = take_key(ctx.shard, ctx.db, key).expect("checked above");
    put_key(ctx.shard, target, key, value, expire);
    ctx.notify(b'g', "move_from", key);
    ctx.shard.event(target, b'g', "move_to", key);
    ctx.out.int(1);
}

// ---- DUMP / RESTORE ----

/// The RDB options DUMP (and MIGRATE) write with (version, rdbcompression).
pub fn dump_options(shared: &crate::shard::Shared) -> crate::persist::rdb::write::Options {
    let c = shared.config.lock().expect("config lock");
    crate::persist::rdb::write::Options {
        version: c.get_i64("rdb-version") as u16,
        compress: c.get_bool("rdbcompression"),
    }
}

pub fn dump(ctx: &mut ExecCtx, args: &[Bytes]) {
    let opts = dump_options(&ctx.shard.shared);
    let (entry, out) = ctx.get_read_and_out(&args[1]);
    match entry {
        Some(e) => out.bulk(&crate::persist::rdb::write::dump_payload(&e.value, &opts)),
        None => out.null(),
    }
}

/// RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME seconds] [FREQ frequency], with
/// Redis's checks in Redis's order.
pub fn restore(ctx: &mut ExecCtx, args: &[Bytes]) {
    let (mut replace, mut absttl) = (false, false);
    let (mut idle, mut freq): (Option<i64>, Option<i64>) = (None, None);
    let mut j = 4;
    while j < args.len() {
        let more = j + 1 < args.len();
        if eq_ci(&args[j], "replace") {
            replace = true;
        } else if eq_ci(&args[j], "absttl") {
            absttl = true;
        } else if eq_ci(&args[j], "idletime") && more && freq.is_none() {
            let Ok(v) = parse_i64(&args[j + 1]) else {
                return ctx.out.error(NOT_INT);
            };
            if v < 0 {
                return ctx.out.error("ERR Invalid IDLETIME value, must be >= 0");
            }
            idle = Some(v);
            j += 1;
        } else if eq_ci(&args[j], "freq") && more && idle.is_none() {
            let Ok(v) = parse_i64(&args[j + 1]) else {
                return ctx.out.error(NOT_INT);
            };
            if !(0..=255).contains(&v) {
                return ctx
                    .out
                    .error("ERR Invalid FREQ value, must be >= 0 and <= 255");
            }
            freq = Some(v);
            j += 1;
        } else {
            return ctx.out.error(SYNTAX_ERR);
        }
        j += 1;
    }
    let key = &args[1];
    if !replace && ctx.exists(key) {
        return ctx.out.error("BUSYKEY Target key name already exists.");
    }
    let Ok(mut ttl) = parse_i64(&args[2]) else {
        return ctx.out.error(NOT_INT);
    };
    if ttl < 0 {
        return ctx.out.error("ERR Invalid TTL value, must be >= 0");
    }
    let verify = ctx
        .shard
        .shared
        .config
        .lock()
        .expect("config lock")
        .get_bool("rdbchecksum");
    let value = match crate::persist::rdb::read::read_payload(&args[3], verify) {
        Ok(v) => v,
        Err(true) => {
            return ctx
                .out
                .error("ERR DUMP payload version or checksum are wrong")
        }
        Err(false) => return ctx.out.error("ERR Bad data format"),
    };
    let deleted = replace && ctx.delete(key);
    if ttl != 0 && !absttl {
        ttl = ttl.saturating_add(ctx.now_ms as i64);
    }
    if ttl != 0 && ctx.already_expired(ttl) {
        if deleted {
            ctx.notify(b'g', "del", key);
        }
        return ctx.out.ok();
    }
    ctx.set(key, value, ttl as u64);
    // IDLETIME counts under an LRU policy, FREQ under an LFU one (Redis's
    // objectSetLRUOrLFU).
    let lfu = ctx.shard.stamp(ctx.now_ms).is_lfu();
    let field = match (lfu, idle, freq) {
        (false, Some(idle), _) => Some(
            ctx.shard
                .lru_at(ctx.now_ms)
                .saturating_sub(idle.min(u32::MAX as i64) as u32),
        ),
        (true, _, Some(f)) => Some(((((ctx.now_ms / 60_000) & 0xFFFF) as u32) << 8) | f as u32),
        _ => None,
    };
    if let Some(v) = field {
        if let Some(e) = ctx.shard.dbs[ctx.db].table.get_mut(key) {
            e.lru = v;
        }
    }
    ctx.key_ready(key);
    ctx.notify(b'g', "restore", key);
    ctx.out.ok();
}

// ---- Whole-keyspace reads: KEYS, SCAN, RANDOMKEY, DBSIZE ----

async_handler!(keys, |sess, args| {
    let db = sess.db;
    let pattern = args[1].clone();
    let all = pattern[..] == b"*"[..];
    let found = broadcast(&sess.worker, move |w| {
        let now = unix_ms();
        let shard = w.shard.borrow();
        shard.dbs[db]
            .table
            .iter()
            .filter(|e| !e.is_expired(now) && (all || glob_match(&pattern, &e.key, false)))
            .map(|e| e.key.to_vec())
            .collect::<Vec<_>>()
    })
    .await;
    let n: usize = found.iter().map(|v| v.len()).sum();
    sess.out.array(n);
    for k in found.iter().flatten() {
        sess.out.bulk(k);
    }
});

/// Bits of a SCAN cursor that name the shard; the rest is that shard's table cursor.
const SHARD_BITS: u32 = 10;

async_handler!(scan, |sess, args| {
    let Some(cursor) = super::util::parse_cursor(&args[1]) else {
        return sess.out.error("ERR invalid cursor");
    };
    let mut count = 10usize;
    let mut pattern: Option<Bytes> = None;
    let mut type_filter: Option<String> = None;
    let mut i = 2;
    while i < args.len() {
        if i + 1 >= args.len() {
            return sess.out.error(SYNTAX_ERR);
        }
        if eq_ci(&args[i], "count") {
            match parse_i64(&args[i + 1]) {
                Ok(n) if n >= 1 => count = n as usize,
                Ok(_) => return sess.out.error(SYNTAX_ERR),
                Err(e) => return sess.out.error(e),
            }
        } else if eq_ci(&args[i], "match") {
            pattern = Some(args[i + 1].clone());
        } else if eq_ci(&args[i], "type") {
            type_filter = Some(String::from_utf8_lossy(&args[i + 1]).to_ascii_lowercase());
        } else {
            return sess.out.error(SYNTAX_ERR);
        }
        i += 2;
    }
    let nshards = sess.worker.nshards() as u64;
    let mut shard = cursor & ((1 << SHARD_BITS) - 1);
    let mut table_cursor = cursor >> SHARD_BITS;
    if shard >= nshards {
        shard = 0;
        table_cursor = 0;
    }
    let db = sess.db;
    let mut keys = Vec::new();
    let next = loop {
        let (p, t) = (pattern.clone(), type_filter.clone());
        let (found, next_table) = hop(&sess.worker, shard as usize, move |w| {
            let now = unix_ms();
            let shard = w.shard.borrow();
            let mut found = Vec::new();
            let next = shard.dbs[db].table.scan(table_cursor, count, |e| {
                if e.is_expired(now) {
                    return;
                }
                if let Some(p) = &p {
                    if !glob_match(p, &e.key, false) {
                        return;
                    }
                }
                if let Some(t) = &t {
                    if e.value.type_name() != t {
                        return;
                    }
                }
                found.push(e.key.to_vec());
            });
            (found, next)
        })
        .await;
        keys.extend(found);
        if next_table != 0 {
            break (next_table << SHARD_BITS) | shard;
        }
        shard += 1;
        table_cursor = 0;
        if shard >= nshards {
            break 0;
        }
        // Continue into the next shard only while this call returned too little.
        if keys.len() >= count {
            break shard;
        }
    };
    sess.out.array(2);
    sess.out.bulk(next.to_string().as_bytes());
    sess.out.array(keys.len());
    for k in &keys {
        sess.out.bulk(k);
    }
});

async_handler!(randomkey, |sess, _args| {
    let db = sess.db;
    let n = sess.worker.nshards();
    let start = sess.worker.shard.borrow().random() as usize % n;
    for step in 0..n {
        let target = (start + step) % n;
        let found = hop(&sess.worker, target, move |w| {
            let mut shard = w.shard.borrow_mut();
            let now = unix_ms();
            // Expired keys found on the way are deleted, as Redis does, a bounded number of times.
            for _ in 0..100 {
                let pick = {
                    let sh = &*shard;
                    sh.dbs[db]
                        .table
                        .random_entry(|| sh.random())
                        .map(|e| (e.key.to_vec(), e.is_expired(now)))
                };
                match pick {
                    None => return None,
                    Some((k, false)) => return Some(k),
                    Some((k, true)) => shard.expire_key(db, &k),
                }
            }
            None
        })
        .await;
        if let Some(k) = found {
            return sess.out.bulk(&k);
        }
    }
    sess.out.null();
});

async_handler!(dbsize, |sess, _args| {
    let db = sess.db;
    let sizes = broadcast(&sess.worker, move |w| w.shard.borrow().keys_in(db)).await;
    sess.out.int(sizes.iter().sum::<usize>() as i64);
});

// ---- Whole-keyspace writes: FLUSHDB, FLUSHALL, SWAPDB ----

fn flush_mode_ok(args: &[Bytes]) -> bool {
    match args.len() {
        1 => true,
        2 => eq_ci(&args[1], "async") || eq_ci(&args[1], "sync"),
        _ => false,
    }
}

/// Runs `f` on every shard with every shard locked whole (unless EXEC already holds them).
/// `effect` is what the AOF logs, once, where the command ran.
async fn on_every_shard_locked(
    sess: &mut Session,
    effect: &[Bytes],
    f: impl Fn(&mut Shard) + Send + Sync + 'static,
) {
    let tx = if sess.in_exec {
        None
    } else {
        Some(Tx::lock_keys(&sess.worker, &[], true).await)
    };
    broadcast(&sess.worker, move |w| f(&mut w.shard.borrow_mut())).await;
    match &tx {
        Some(tx) => tx.log(sess.db, effect),
        None => super::log_global_effect(sess, effect),
    }
    drop(tx);
}

async_handler!(flushdb, |sess, args| {
    if !flush_mode_ok(&args) {
        return sess.out.error(SYNTAX_ERR);
    }
    let db = sess.db;
    on_every_shard_locked(sess, &args, move |sh| sh.flush_db(db)).await;
    crate::tracking::flush_all(&sess.worker).await;
    sess.out.ok();
});

async_handler!(flushall, |sess, args| {
    if !flush_mode_ok(&args) {
        return sess.out.error(SYNTAX_ERR);
    }
    on_every_shard_locked(sess, &args, |sh| {
        for db in 0..sh.dbs.len() {
            sh.flush_db(db);
        }
    })
    .await;
    crate::tracking::flush_all(&sess.worker).await;
    sess.out.ok();
});

async_handler!(swapdb, |sess, args| {
    if sess.worker.shared.cluster.is_some() {
        return sess.out.error("ERR SWAPDB is not allowed in cluster mode");
    }
    let databases = sess.worker.shared.tunables.databases;
    let Ok(a) = parse_i64(&args[1]) else {
        return sess.out.error("ERR invalid first DB index");
    };
    let Ok(b) = parse_i64(&args[2]) else {
        return sess.out.error("ERR invalid second DB index");
    };
    if a < 0 || b < 0 || a as usize >= databases || b as usize >= databases {
        return sess.out.error(DB_RANGE);
    }
    let (a, b) = (a as usize, b as usize);
    if a != b {
        on_every_shard_locked(sess, &args, move |sh| sh.swap_dbs(a, b)).await;
    }
    sess.out.ok();
});

// ---- Expiry ----

/// The NX/XX/GT/LT options of the EXPIRE family; XX may be combined with GT or LT.
#[derive(Clone, Copy, Default)]
struct ExpireCond {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

impl ExpireCond {
    /// Whether a new expiry `at` may replace `current` (0: the key has none, which
    /// counts as living forever).
    fn allows(&self, current: u64, at: i64) -> bool {
        let has_ttl = current != 0;
        !(self.nx && has_ttl
            || self.xx && !has_ttl
            || self.gt && (!has_ttl || at <= current as i64)
            || self.lt && has_ttl && at >= current as i64)
    }
}

fn parse_expire_cond(args: &[Bytes]) -> Result<ExpireCond, String> {
    let mut c = ExpireCond::default();
    for a in &args[3..] {
        if eq_ci(a, "nx") {
            c.nx = true;
        } else if eq_ci(a, "xx") {
            c.xx = true;
        } else if eq_ci(a, "gt") {
            c.gt = true;
        } else if eq_ci(a, "lt") {
            c.lt = true;
        } else {
            return Err(format!(
                "ERR Unsupported option {}",
                String::from_utf8_lossy(a)
            ));
        }
    }
    if c.nx && (c.xx || c.gt || c.lt) {
        return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
    }
    if c.gt && c.lt {
        return Err("ERR GT and LT options at the same time are not compatible".into());
    }
    Ok(c)
}

/// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT: `unit_ms` is 1000 for seconds, `relative` adds now.
fn expire_generic(ctx: &mut ExecCtx, args: &[Bytes], unit_ms: i64, relative: bool) {
    let name = std::str::from_utf8(&args[0])
        .unwrap_or("expire")
        .to_ascii_lowercase();
    let cond = match parse_expire_cond(args) {
        Ok(c) => c,
        Err(e) => return ctx.out.error(&e),
    };
    let when = match parse_i64(&args[2]) {
        Ok(v) => v,
        Err(e) => return ctx.out.error(e),
    };
    let invalid = format!("ERR invalid expire time in '{}' command", name);
    let Some(mut at) = when.checked_mul(unit_ms) else {
        return ctx.out.error(&invalid);
    };
    if relative {
        match at.checked_add(ctx.now_ms as i64) {
            Some(v) => at = v,
            None => return ctx.out.error(&invalid),
        }
    }
    let key = &args[1];
    let current = match ctx.get(key) {
        None => return ctx.out.int(0),
        Some(e) => e.expire_at(),
    };
    if !cond.allows(current, at) {
        return ctx.out.int(0);
    }
    if ctx.already_expired(at) {
        ctx.delete(key);
        ctx.notify(b'g', "del", key);
    } else {
        ctx.set_expire(key, at as u64);
        ctx.notify(b'g', "expire", key);
    }
    ctx.out.int(1);
}

pub fn expire(ctx: &mut ExecCtx, args: &[Bytes]) {
    expire_generic(ctx, args, 1000, true);
}

pub fn pexpire(ctx: &mut ExecCtx, args: &[Bytes]) {
    expire_generic(ctx, args, 1, true);
}

pub fn expireat(ctx: &mut ExecCtx, args: &[Bytes]) {
    expire_generic(ctx, args, 1000, false);
}

pub fn pexpireat(ctx: &mut ExecCtx, args: &[Bytes]) {
    expire_generic(ctx, args, 1, false);
}

/// The expiry of a key: None when missing, Some(0) when persistent.
fn expiry_of(ctx: &mut ExecCtx, key: &[u8]) -> Option<u64> {
    ctx.get_read(key).map(|e| e.expire_at())
}

pub fn ttl(ctx: &mut ExecCtx, args: &[Bytes]) {
    match expiry_of(ctx, &args[1]) {
        None => ctx.out.int(-2),
        Some(0) => ctx.out.int(-1),
        Some(at) => ctx
            .out
            .int(((at.saturating_sub(ctx.now_ms) + 500) / 1000) as i64),
    }
}

pub fn pttl(ctx: &mut ExecCtx, args: &[Bytes]) {
    match expiry_of(ctx, &args[1]) {
        None => ctx.out.int(-2),
        Some(0) => ctx.out.int(-1),
        Some(at) => ctx.out.int(at.saturating_sub(ctx.now_ms) as i64),
    }
}

pub fn expiretime(ctx: &mut ExecCtx, args: &[Bytes]) {
    match expiry_of(ctx, &args[1]) {
        None => ctx.out.int(-2),
        Some(0) => ctx.out.int(-1),
        Some(at) => ctx.out.int(((at as u128 + 500) / 1000) as i64),
    }
}

pub fn pexpiretime(ctx: &mut ExecCtx, args: &[Bytes]) {
    match expiry_of(ctx, &args[1]) {
        None => ctx.out.int(-2),
        Some(0) => ctx.out.int(-1),
        Some(at) => ctx.out.int(at as i64),
    }
}

pub fn persist(ctx: &mut ExecCtx, args: &[Bytes]) {
    let has_ttl = matches!(ctx.get(&args[1]), Some(e) if e.expire_at() != 0);
    if has_ttl {
        ctx.set_expire(&args[1], 0);
        ctx.notify(b'g', "persist", &args[1]);
    }
    ctx.out.int(has_ttl as i64);
}

// ---- OBJECT ----

pub const OBJECT_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("encoding", 3, "readonly"),
    ("freq", 3, "readonly"),
    ("help", 2, "loading stale"),
    ("idletime", 3, "readonly"),
    ("refcount", 3, "readonly"),
];

const OBJECT_HELP: &[&str] = &[
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    How the value of <key> is stored internally.",
    "FREQ <key>",
    "    The logarithmic access frequency counter of <key> (LFU policies only).",
    "IDLETIME <key>",
    "    Seconds since <key> was last read or written.",
    "REFCOUNT <key>",
    "    How many references the value of <key> has.",
    "HELP",
    "    Print this help.",
];

/// Redis shares the objects of small integers, and reports that as a huge refcount.
const SHARED_REFCOUNT: i64 = i32::MAX as i64;
const SHARED_INTEGERS: i64 = 10_000;

pub fn object(ctx: &mut ExecCtx, args: &[Bytes]) {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    if sub == "help" {
        ctx.out.array(OBJECT_HELP.len());
        for line in OBJECT_HELP {
            ctx.out.simple(line);
        }
        return;
    }
    let lru_now = ctx.shard.lru_clock();
    let lfu = ctx.shard.stamp(ctx.now_ms).is_lfu();
    let decay = ctx
        .shard
        .shared
        .tunables
        .lfu_decay_time
        .load(std::sync::atomic::Ordering::Relaxed);
    let Some(e) = ctx.shard.lookup(ctx.db, &args[2], ctx.now_ms) else {
        return ctx.out.null();
    };
    match sub.as_str() {
        "encoding" => {
            let enc = e.value.encoding();
            ctx.out.bulk(enc.as_bytes());
        }
        "refcount" => {
            let shared = matches!(&e.value, Value::Str(StrValue::Int(i)) if (0..SHARED_INTEGERS).contains(i));
            ctx.out.int(if shared { SHARED_REFCOUNT } else { 1 });
        }
        "idletime" if lfu => ctx.out.error(
            "ERR An LFU maxmemory policy is selected, idle time not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.",
        ),
        "idletime" => {
            let idle = lru_now.saturating_sub(e.lru);
            ctx.out.int(idle as i64);
        }
        _ if lfu => {
            let freq = crate::shard::evict::lfu_decayed(e.lru, ctx.now_ms, decay);
            ctx.out.int(freq as i64);
        }
        _ => ctx.out.error(
            "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.",
        ),
    }
}
