//! FAILOVER (Redis 6.2+): a planned switch of roles with a replica. The master pauses
//! writes, waits until the chosen replica has acknowledged its whole stream, then becomes
//! that replica's replica with `PSYNC <replid> <offset> FAILOVER`, which tells the replica
//! to promote itself and continue the old master with a partial resync.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::{replica, stream::ReplMsg, REPLICA_ONLINE};
use crate::commands::util::{eq_ci, parse_i64};
use crate::persist::aof::writer::ToWriter;
use crate::server::session::Session;
use crate::shard::clients::Pause;
use crate::shard::{broadcast, unix_ms, Worker};

pub const NONE: u8 = 0;
pub const WAITING_FOR_SYNC: u8 = 1;
pub const IN_PROGRESS: u8 = 2;

pub fn state_name(state: u8) -> &'static str {
    match state {
        WAITING_FOR_SYNC => "waiting-for-sync",
        IN_PROGRESS => "failover-in-progress",
        _ => "no-failover",
    }
}

struct Plan {
    target: Option<(String, u16)>,
    force: bool,
    timeout_ms: u64,
}

fn parse(args: &[Bytes]) -> Result<Result<Plan, ()>, String> {
    let mut plan = Plan {
        target: None,
        force: false,
        timeout_ms: 0,
    };
    let mut abort = false;
    let mut i = 1;
    while i < args.len() {
        if eq_ci(&args[i], "to") && i + 2 < args.len() {
            let port = match parse_i64(&args[i + 2]) {
                Ok(p) if (0..=65535).contains(&p) => p as u16,
                _ => return Err("ERR value is not an integer or out of range".into()),
            };
            plan.target = Some((String::from_utf8_lossy(&args[i + 1]).into_owned(), port));
            i += 3;
        } else if eq_ci(&args[i], "force") {
            plan.force = true;
            i += 1;
        } else if eq_ci(&args[i], "abort") {
            abort = true;
            i += 1;
        } else if eq_ci(&args[i], "timeout") && i + 1 < args.len() {
            match parse_i64(&args[i + 1]) {
                Ok(t) if t > 0 => plan.timeout_ms = t as u64,
                Ok(_) => return Err("ERR FAILOVER timeout must be greater than 0".into()),
                Err(e) => return Err(e.into()),
            }
            i += 2;
        } else {
            return Err("ERR syntax error".into());
        }
    }
    if abort {
        if plan.target.is_some() || plan.force || plan.timeout_ms > 0 {
            return Err("ERR syntax error".into());
        }
        return Ok(Err(()));
    }
    if plan.force && (plan.target.is_none() || plan.timeout_ms == 0) {
        return Err(
            "ERR FAILOVER with force option requires both a timeout and target HOST and IP.".into(),
        );
    }
    Ok(Ok(plan))
}

/// The FAILOVER command: checks, then runs the switch in the background and answers OK.
pub async fn command(sess: &mut Session, args: &[Bytes]) {
    let worker = sess.worker.clone();
    let shared = &worker.shared;
    let r = &shared.repl;
    let plan = match parse(args) {
        Ok(p) => p,
        Err(e) => return sess.error(&e),
    };
    let Ok(plan) = plan else {
        if r.failover_state.load(Ordering::Acquire) == NONE {
            return sess.error("ERR No failover in progress.");
        }
        r.failover_abort.store(true, Ordering::Release);
        return sess.out.ok();
    };
    if r.is_replica() {
        return sess.error("ERR FAILOVER is not valid when server is a replica.");
    }
    let replicas = r.replicas();
    if replicas.is_empty() {
        return sess.error("ERR FAILOVER requires connected replicas.");
    }
    if r.failover_state.load(Ordering::Acquire) != NONE {
        return sess.error("ERR FAILOVER already in progress.");
    }
    if let Some((host, port)) = &plan.target {
        let Some(e) = replicas
            .iter()
            .find(|e| e.ip == *host && e.port.load(Ordering::Relaxed) == *port as u64)
        else {
            return sess.error("ERR FAILOVER target HOST and PORT is not a replica.");
        };
        if e.state.load(Ordering::Relaxed) != REPLICA_ONLINE {
            return sess.error("ERR FAILOVER target replica is not online.");
        }
    }
    r.failover_abort.store(false, Ordering::Release);
    r.failover_state.store(WAITING_FOR_SYNC, Ordering::Release);
    tracing::info!("FAILOVER requested");
    pause_writes(&worker, true).await;
    crate::net::event_loop::spawn_local(run(worker.clone(), plan));
    sess.out.ok();
}

async fn pause_writes(worker: &Rc<Worker>, on: bool) {
    broadcast(worker, move |w| {
        let mut clients = w.clients.borrow_mut();
        if on {
            clients.pause = Pause {
                // Held until the failover ends, which a timeout or ABORT bounds.
                until_unix_ms: u64::MAX / 2,
                writes_only: true,
            };
        } else {
            clients.pause = Pause::default();
            clients.pause_notify.notify_waiters();
        }
    })
    .await;
}

async fn run(worker: Rc<Worker>, plan: Plan) {
    let shared = worker.shared.clone();
    let r = &shared.repl;
    let started = unix_ms();
    let timed_out = || plan.timeout_ms > 0 && unix_ms().saturating_sub(started) >= plan.timeout_ms;
    // Waiting for the replica to have everything. One GETACK: its answer (and the
    // replica's ACK each second after it) tells where the replica stands; asking again
    // would move the offset it must reach.
    shared.persist.aof.send(ToWriter::Repl(ReplMsg::GetAck));
    let chosen = loop {
        if r.failover_abort.load(Ordering::Acquire) {
            return end(&worker, "FAILOVER aborted by user request").await;
        }
        let offset = super::master::current_offset(&worker).await;
        let caught_up = r.replicas().into_iter().find(|e| {
            e.state.load(Ordering::Relaxed) == REPLICA_ONLINE
                && plan
                    .target
                    .as_ref()
                    .is_none_or(|(h, p)| e.ip == *h && e.port.load(Ordering::Relaxed) == *p as u64)
                && e.ack_offset.load(Ordering::Relaxed) >= offset
        });
        if let Some(e) = caught_up {
            break (e.ip.clone(), e.port.load(Ordering::Relaxed) as u16);
        }
        if timed_out() {
            match (&plan.target, plan.force) {
                (Some(t), true) => break t.clone(),
                _ => {
                    return end(
                        &worker,
                        "FAILOVER to the replica timed out: no replica caught up",
                    )
                    .await
                }
            }
        }
        crate::net::event_loop::time::sleep(Duration::from_millis(10)).await;
    };
    r.failover_state.store(IN_PROGRESS, Ordering::Release);
    tracing::info!(
        "FAILOVER: the replica {}:{} has the whole stream; switching roles",
        chosen.0,
        chosen.1
    );
    r.failover_result.store(0, Ordering::Release);
    r.failover_psync.store(true, Ordering::Release);
    replica::follow(&shared, chosen.0.clone(), chosen.1).await;
    // The link's PSYNC ... FAILOVER decides: accepted, or refused.
    let outcome = loop {
        match r.failover_result.load(Ordering::Acquire) {
            1 => break Ok(()),
            2 => break Err("the target refused PSYNC FAILOVER"),
            _ => {}
        }
        if r.failover_abort.load(Ordering::Acquire) {
            break Err("FAILOVER aborted by user request");
        }
        if plan.timeout_ms > 0 && unix_ms().saturating_sub(started) >= plan.timeout_ms + 10_000 {
            break Err("FAILOVER to the replica timed out while switching roles");
        }
        crate::net::event_loop::time::sleep(Duration::from_millis(10)).await;
    };
    r.failover_psync.store(false, Ordering::Release);
    match outcome {
        Ok(()) => {
            tracing::info!(
                "Failover target {}:{} is now the master",
                chosen.0,
                chosen.1
            );
            r.failover_state.store(NONE, Ordering::Release);
            pause_writes(&worker, false).await;
        }
        Err(why) => {
            // Back to being the master, under a new history as after REPLICAOF NO ONE.
            replica::promote(&shared).await;
            end(&worker, why).await;
        }
    }
}

async fn end(worker: &Rc<Worker>, why: &str) {
    tracing::warn!("FAILOVER ended without a switch: {why}");
    worker
        .shared
        .repl
        .failover_state
        .store(NONE, Ordering::Release);
    pause_writes(worker, false).await;
}
