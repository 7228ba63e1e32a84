//! BGREWRITEAOF without fork, automatic rewrites, and `CONFIG SET appendonly`.
//!
//! A rewrite is a snapshot (`persist::snapshot`) written as the AOF's new base. At the
//! snapshot's cut, while every shard is locked, the writer switches to a new incremental
//! file: effects before the cut are in the base, effects after it in the new file. When
//! the base is complete the manifest names it and the older files go. Turning the AOF on
//! at run time is the same rewrite, with capture starting at the cut.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::oneshot;

use super::manifest::{Manifest, Names};
use super::writer::ToWriter;
use crate::persist::snapshot;
use crate::shard::{unix_ms, Worker};

pub const STARTED: &str = "Background append only file rewriting started";
pub const SCHEDULED: &str = "Background append only file rewriting scheduled";

/// BGREWRITEAOF: the status line to reply, or the error.
pub fn bgrewriteaof(worker: &Rc<Worker>) -> Result<&'static str, String> {
    let st = &worker.shared.persist.aof;
    if st.rewrite_in_progress.load(Ordering::Acquire) {
        return Err("ERR Background append only file rewriting already in progress".into());
    }
    if worker
        .shared
        .persist
        .bgsave_in_progress
        .load(Ordering::Acquire)
    {
        st.rewrite_scheduled.store(true, Ordering::Release);
        return Ok(SCHEDULED);
    }
    start(worker)?;
    Ok(STARTED)
}

/// Starts a rewrite in the background.
pub fn start(worker: &Rc<Worker>) -> Result<(), String> {
    let st = &worker.shared.persist.aof;
    snapshot::claim(worker)?;
    st.rewrite_in_progress.store(true, Ordering::Release);
    st.rewrite_scheduled.store(false, Ordering::Release);
    st.rewrite_started_unix
        .store(unix_ms() / 1000, Ordering::Relaxed);
    let w = worker.clone();
    crate::net::event_loop::spawn_local(async move {
        let started = Instant::now();
        let result = run(&w).await;
        let shared = &w.shared;
        let st = &shared.persist.aof;
        st.last_rewrite_secs
            .store(started.elapsed().as_secs() as i64, Ordering::Relaxed);
        match &result {
            Ok(()) => {
                st.rewrites.fetch_add(1, Ordering::Relaxed);
                st.last_rewrite_ok.store(true, Ordering::Relaxed);
                st.rewrite_base_size
                    .store(st.current_size.load(Ordering::Relaxed), Ordering::Relaxed);
                tracing::info!("Background AOF rewrite finished successfully");
            }
            Err(e) => {
                st.last_rewrite_ok.store(false, Ordering::Relaxed);
                tracing::warn!("Background AOF rewrite failed: {e}");
            }
        }
        st.rewrite_in_progress.store(false, Ordering::Release);
        shared
            .persist
            .bgsave_in_progress
            .store(false, Ordering::Release);
    });
    Ok(())
}

async fn run(worker: &Rc<Worker>) -> Result<(), String> {
    let shared = worker.shared.clone();
    let (names, _) = super::replay::names(&shared);
    std::fs::create_dir_all(&names.dir)
        .map_err(|e| format!("can't create {}: {e}", names.dir.display()))?;
    let temp = names.temp_rewrite();
    let preamble = shared
        .config
        .lock()
        .expect("config lock")
        .get_bool("aof-use-rdb-preamble");
    // Without the RDB preamble the snapshot is read back and written as commands.
    let snapshot_path = if preamble {
        temp.clone()
    } else {
        temp.with_extension("rdb")
    };
    let enabling = !shared.persist.aof.file_on();
    let (switched_tx, switched) = oneshot::channel();
    let layout = Names {
        dir: names.dir.clone(),
        stem: names.stem.clone(),
    };
    let at_cut: snapshot::AtCut = Box::new(move |w: &Rc<Worker>| {
        let st = &w.shared.persist.aof;
        if enabling {
            // A new layout whose manifest is written only once the base exists; the old
            // files (an earlier AOF) stay listed as history, so no name is reused.
            let old = std::fs::read_to_string(layout.manifest())
                .ok()
                .and_then(|t| Manifest::parse(&t).ok())
                .unwrap_or_default();
            let mut history = old.history;
            history.extend(old.base);
            history.extend(old.incrs);
            let fresh = Manifest {
                base: None,
                incrs: Vec::new(),
                history,
            };
            st.send(ToWriter::Open {
                names: layout,
                manifest: fresh,
                persist: false,
                done: switched_tx,
            });
            super::refresh_settings(&w.shared);
            st.on.store(true, Ordering::Release);
        } else {
            st.send(ToWriter::Rotate { done: switched_tx });
        }
        Vec::new()
    });
    let cut = snapshot::cut(
        worker,
        snapshot::Target::File(snapshot_path.clone()),
        Some(at_cut),
    )
    .await?;
    let mut written = cut
        .written
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("the snapshot writer stopped")));
    if !preamble && written.is_ok() {
        let (from, to) = (snapshot_path.clone(), temp.clone());
        let (tx, rx) = oneshot::channel();
        // Off the shard's thread: converting a large snapshot takes a while.
        std::thread::spawn(move || {
            let _ = tx.send(super::resp_base::rdb_to_commands(&from, &to));
        });
        written = rx
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the rewrite thread failed")));
        let _ = std::fs::remove_file(&snapshot_path);
    }
    let switched = switched
        .await
        .unwrap_or_else(|_| Err("the AOF writer stopped".into()));
    let outcome = match (written, switched) {
        (Ok(_), Ok(())) => {
            let (done, wait) = oneshot::channel();
            shared.persist.aof.send(ToWriter::RewriteDone {
                temp: temp.clone(),
                rdb: preamble,
                done,
            });
            wait.await
                .unwrap_or_else(|_| Err("the AOF writer stopped".into()))
        }
        (Err(e), _) => Err(e.to_string()),
        (_, Err(e)) => Err(e),
    };
    if outcome.is_err() {
        let _ = std::fs::remove_file(&temp);
        if enabling {
            // Turning the AOF on failed: back off, as Redis does.
            shared.persist.aof.on.store(false, Ordering::Release);
            let (done, _) = oneshot::channel();
            shared.persist.aof.send(ToWriter::Close { done });
        }
    }
    outcome
}

/// Applies `appendonly` and `appendfsync` after CONFIG SET.
pub fn on_config_change(worker: &Rc<Worker>) {
    let shared = &worker.shared;
    super::refresh_settings(shared);
    let want = shared
        .config
        .lock()
        .expect("config lock")
        .get_bool("appendonly");
    let st = &shared.persist.aof;
    let on = st.file_on() || st.rewrite_in_progress.load(Ordering::Acquire);
    if want && !on {
        if shared.persist.bgsave_in_progress.load(Ordering::Acquire) || start(worker).is_err() {
            st.rewrite_scheduled.store(true, Ordering::Release);
        }
    } else if !want && st.file_on() {
        st.on.store(false, Ordering::Release);
        let (done, _) = oneshot::channel();
        st.send(ToWriter::Close { done });
        shared.persist.refresh_gate(shared);
    }
}

/// Run once a second on thread 0: scheduled rewrites, and automatic ones once the AOF
/// has grown by `auto-aof-rewrite-percentage` past `auto-aof-rewrite-min-size`.
pub fn cron(worker: &Rc<Worker>) {
    let shared = &worker.shared;
    let st = &shared.persist.aof;
    if st.rewrite_in_progress.load(Ordering::Acquire)
        || shared.persist.bgsave_in_progress.load(Ordering::Acquire)
    {
        return;
    }
    let want = shared
        .config
        .lock()
        .expect("config lock")
        .get_bool("appendonly");
    if st.rewrite_scheduled.load(Ordering::Acquire) {
        if want || st.file_on() {
            let _ = start(worker);
        } else {
            st.rewrite_scheduled.store(false, Ordering::Release);
        }
        return;
    }
    if !st.file_on() {
        return;
    }
    let (percentage, min_size) = {
        let c = shared.config.lock().expect("config lock");
        (
            c.get_i64("auto-aof-rewrite-percentage"),
            c.get_i64("auto-aof-rewrite-min-size"),
        )
    };
    let size = st.current_size.load(Ordering::Relaxed);
    let base = st.rewrite_base_size.load(Ordering::Relaxed).max(1);
    if percentage > 0 && size as i64 > min_size {
        let growth = (size * 100 / base) as i64 - 100;
        if growth >= percentage {
            tracing::info!("Starting automatic rewriting of AOF on {growth}% growth");
            let _ = start(worker);
        }
    }
}
