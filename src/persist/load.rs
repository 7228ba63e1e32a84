//! Loading an RDB file: at start-up and for DEBUG RELOAD.
//!
//! One loader thread reads the file and sends each key, in batches, to the thread of the
//! shard that owns it; shards insert on their own threads. Meanwhile clients get
//! `-LOADING` (see `State::gate`). A file that cannot be read whole is an error naming the
//! file and the byte offset: Kite never starts on part of a dataset.

use std::io::BufReader;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use super::rdb::read::{FileReader, Record};
use crate::shard::{unix_ms, Shared, Worker};
use crate::types::value::Value;

/// Keys sent to a shard in one message.
const BATCH: usize = 256;

type Item = (usize, Vec<u8>, Value, u64, Option<u64>);

pub struct Loaded {
    pub keys: u64,
    pub expired_skipped: u64,
    /// Where the RDB ended in the file (an AOF base may go on with commands after it).
    pub end: u64,
    /// The AUX fields (a replication sync's `repl-stream-db` among them).
    pub aux: Vec<(Vec<u8>, Vec<u8>)>,
}

fn send_batch(shared: &Shared, shard: usize, batch: Vec<Item>) {
    shared.send(
        shard,
        Box::new(move |w: &Rc<Worker>| {
            let mut sh = w.shard.borrow_mut();
            let now_lru = sh.lru_clock();
            for (db, key, value, expire_at, idle) in batch {
                let lru = now_lru.saturating_sub(idle.unwrap_or(0).min(u32::MAX as u64) as u32);
                sh.dbs[db].table.insert(&key, value, expire_at, lru);
                // A replica's readers (XREAD BLOCK) may wait on keys a full sync brings.
                sh.blocking.mark_ready(db, &key);
            }
            let ready = sh.blocking.has_ready();
            drop(sh);
            if ready {
                crate::shard::after_command(w);
            }
        }),
    );
}

/// Waits until every shard has applied what was sent to it before.
fn barrier(shared: &Shared) {
    let (ack, acks) = mpsc::channel();
    for s in 0..shared.nshards() {
        let ack = ack.clone();
        shared.send(
            s,
            Box::new(move |_| {
                let _ = ack.send(());
            }),
        );
    }
    drop(ack);
    for _ in 0..shared.nshards() {
        let _ = acks.recv();
    }
}

/// Reads `path` into the shards. Blocks: run it on a thread of its own. Ok(None) when the
/// file does not exist.
pub fn load_file(shared: &Arc<Shared>, path: &Path) -> Result<Option<Loaded>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("can't open {}: {e}", path.display())),
    };
    let verify = shared
        .config
        .lock()
        .expect("config lock")
        .get_bool("rdbchecksum");
    let name = path.display().to_string();
    let at = |e: super::rdb::read::Error| {
        format!(
            "bad RDB file {name}: {} at offset {} (the file is left as it is; Kite will not start on part of it)",
            e.msg, e.offset
        )
    };
    let mut reader =
        FileReader::open(BufReader::with_capacity(1 << 20, file), verify).map_err(at)?;
    let databases = shared.tunables.databases;
    let mut batches: Vec<Vec<Item>> = (0..shared.nshards()).map(|_| Vec::new()).collect();
    let mut db = 0usize;
    let mut loaded = Loaded {
        keys: 0,
        expired_skipped: 0,
        end: 0,
        aux: Vec::new(),
    };
    let now = unix_ms();
    let mut libraries = Vec::new();
    loop {
        let offset = reader.r.offset();
        let record = match reader.next().map_err(at)? {
            Some(r) => r,
            None => break,
        };
        match record {
            Record::Eof => {
                loaded.end = reader.r.offset();
                break;
            }
            Record::SelectDb(n) => {
                if n as usize >= databases {
                    return Err(format!(
                        "bad RDB file {name}: it selects database {n} but Kite has {databases} (raise 'databases'), at offset {offset}"
                    ));
                }
                db = n as usize;
            }
            Record::ResizeDb => {}
            Record::Aux(k, v) => {
                tracing::debug!(
                    "RDB aux {}: {}",
                    String::from_utf8_lossy(&k),
                    String::from_utf8_lossy(&v)
                );
                loaded.aux.push((k, v));
            }
            Record::Function(code) => libraries.push((code, offset)),
            Record::Key(k) => {
                let Some(value) = k.value else { continue };
                if k.expire_at != 0 && k.expire_at <= now {
                    loaded.expired_skipped += 1;
                    continue;
                }
                let shard = shared.placement.shard_of(&k.key);
                batches[shard].push((db, k.key, value, k.expire_at, k.idle));
                loaded.keys += 1;
                if batches[shard].len() >= BATCH {
                    send_batch(shared, shard, std::mem::take(&mut batches[shard]));
                }
            }
        }
    }
    for (shard, batch) in batches.into_iter().enumerate() {
        if !batch.is_empty() {
            send_batch(shared, shard, batch);
        }
    }
    barrier(shared);
    if !libraries.is_empty() {
        let libs: Result<Vec<_>, String> = crate::scripting::vm::with_vm(|vm| {
            libraries
                .iter()
                .map(|(code, offset)| {
                    crate::scripting::functions::compile_library(vm, code).map_err(|e| {
                        format!("bad RDB file {name}: function library at offset {offset}: {e}")
                    })
                })
                .collect()
        });
        crate::scripting::registry()
            .install(libs?, true, false)
            .map_err(|e| format!("bad RDB file {name}: {e}"))?;
    }
    Ok(Some(loaded))
}

/// The start-up load: clients get -LOADING until it is done; a bad file stops the server.
pub fn load_at_startup(shared: Arc<Shared>) {
    if shared
        .config
        .lock()
        .expect("config lock")
        .get_bool("appendonly")
    {
        // With the AOF on, it alone holds the dataset, as in Redis.
        return super::aof::replay::load_at_startup(shared);
    }
    let path = {
        let c = shared.config.lock().expect("config lock");
        Path::new(c.get("dir")).join(c.get("dbfilename"))
    };
    if !path.exists() {
        return;
    }
    spawn_loader(shared, "kite-rdb-loader", move |shared| {
        let started = std::time::Instant::now();
        if let Some(l) = load_file(shared, &path)? {
            crate::repl::replica::restore_from_rdb(shared, &l.aux);
            shared.persist.loaded_keys.store(l.keys, Ordering::Relaxed);
            shared
                .persist
                .loaded_expired
                .store(l.expired_skipped, Ordering::Relaxed);
            tracing::info!(
                "DB loaded from disk: {} keys ({} expired skipped) in {:.3} seconds",
                l.keys,
                l.expired_skipped,
                started.elapsed().as_secs_f64()
            );
        }
        Ok(())
    });
}

/// Runs `load` on a thread of its own while clients get -LOADING; an error stops the
/// server: Kite never starts on part of a dataset.
pub fn spawn_loader(
    shared: Arc<Shared>,
    name: &str,
    load: impl FnOnce(&Arc<Shared>) -> Result<(), String> + Send + 'static,
) {
    let state = &shared.persist;
    state.loading.store(true, Ordering::Release);
    state
        .loading_started_unix
        .store(unix_ms() / 1000, Ordering::Relaxed);
    state.refresh_gate(&shared);
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || match load(&shared) {
            Ok(()) => {
                shared.persist.loading.store(false, Ordering::Release);
                shared.persist.refresh_gate(&shared);
            }
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("{e}");
                std::process::exit(1);
            }
        });
    if let Err(e) = spawned {
        eprintln!("cannot start the {name} thread: {e}");
        std::process::exit(1);
    }
}
