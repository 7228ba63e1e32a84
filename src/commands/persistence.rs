//! The persistence commands: SAVE, BGSAVE, SHUTDOWN, DEBUG RELOAD. What they do lives in
//! `persist/`; this file parses arguments and shapes replies as Redis does.

use bytes::Bytes;
use std::sync::atomic::Ordering;

use super::util::{eq_ci, SYNTAX_ERR};
use crate::async_handler;
use crate::persist::snapshot;
use crate::shard::broadcast;
use crate::shard::tx::Tx;

async_handler!(save, |sess, _args| {
    match snapshot::save(&sess.worker).await {
        Ok(()) => sess.out.ok(),
        Err(e) if e.contains("already in progress") => sess.out.error(&e),
        Err(_) => sess.out.error("ERR"),
    }
});

async_handler!(bgsave, |sess, args| {
    // SCHEDULE defers a BGSAVE only behind an AOF rewrite: behind another BGSAVE it is
    // refused like a plain one, as in Redis.
    if args.len() > 2 || args.get(1).is_some_and(|a| !eq_ci(a, "schedule")) {
        return sess.out.error(SYNTAX_ERR);
    }
    let persist = &sess.worker.shared.persist;
    if persist.aof.rewrite_in_progress.load(Ordering::Acquire) {
        if args.len() == 2 {
            persist.bgsave_scheduled.store(true, Ordering::Release);
            return sess.out.simple("Background saving scheduled");
        }
        return sess.out.error("ERR An AOF log rewriting in progress: can't BGSAVE right now. Use BGSAVE SCHEDULE in order to schedule a BGSAVE whenever possible.");
    }
    match snapshot::bgsave(&sess.worker).await {
        Ok(()) => sess.out.simple("Background saving started"),
        Err(e) => sess.out.error(&e),
    }
});

async_handler!(bgrewriteaof, |sess, _args| {
    match crate::persist::aof::rewrite::bgrewriteaof(&sess.worker) {
        Ok(status) => sess.out.simple(status),
        Err(e) => sess.out.error(&e),
    }
});

async_handler!(shutdown, |sess, args| {
    let (mut nosave, mut save, mut force, mut abort) = (false, false, false, false);
    for a in &args[1..] {
        if eq_ci(a, "nosave") {
            nosave = true;
        } else if eq_ci(a, "save") {
            save = true;
        } else if eq_ci(a, "now") {
        } else if eq_ci(a, "force") {
            force = true;
        } else if eq_ci(a, "abort") {
            abort = true;
        } else {
            return sess.out.error(SYNTAX_ERR);
        }
    }
    if (abort && args.len() > 2) || (nosave && save) {
        return sess.out.error(SYNTAX_ERR);
    }
    if abort {
        return sess.out.error("ERR No shutdown in progress.");
    }
    tracing::warn!("User requested shutdown...");
    let choice = if nosave {
        Some(false)
    } else if save {
        Some(true)
    } else {
        None
    };
    if let Err(e) = snapshot::shutdown(&sess.worker, choice, force).await {
        sess.out.error(&e);
    }
});

/// DEBUG RELOAD [MERGE] [NOFLUSH] [NOSAVE]: saves, empties the server and loads the file
/// back, holding every shard meanwhile.
pub async fn debug_reload(sess: &mut crate::server::session::Session, opts: &[Bytes]) {
    // MERGE (keys in the file replace keys present) is what loading always does here.
    let (mut flush, mut save) = (true, true);
    for o in opts {
        if eq_ci(o, "merge") {
        } else if eq_ci(o, "noflush") {
            flush = false;
        } else if eq_ci(o, "nosave") {
            save = false;
        } else {
            return sess
                .out
                .error("ERR DEBUG RELOAD only supports the MERGE, NOFLUSH and NOSAVE options.");
        }
    }
    if save {
        if let Err(e) = snapshot::save(&sess.worker).await {
            return sess.out.error(&e);
        }
    }
    let tx = Tx::lock_keys(&sess.worker, &[], true).await;
    if flush {
        broadcast(&sess.worker, |w| {
            let mut sh = w.shard.borrow_mut();
            for db in 0..sh.dbs.len() {
                sh.flush_db(db);
            }
        })
        .await;
    }
    let path = snapshot::rdb_path(&sess.worker);
    let shared = sess.worker.shared.clone();
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = done.send(crate::persist::load::load_file(&shared, &path));
    });
    let loaded = result
        .await
        .unwrap_or_else(|_| Err("the loader stopped".into()));
    drop(tx);
    match loaded {
        Ok(_) => sess.out.ok(),
        Err(e) => {
            tracing::warn!("{e}");
            sess.out
                .error("ERR Error trying to load the RDB dump, check server logs.")
        }
    }
}
