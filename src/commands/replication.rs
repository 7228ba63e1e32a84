//! Replication commands: REPLICAOF/SLAVEOF, ROLE, REPLCONF, PSYNC, SYNC and WAIT. The
//! mechanism behind them is in src/repl/.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::util::{eq_ci, parse_i64};
use crate::async_handler;
use crate::repl::{self, master, replica};
use crate::server::session::Session;

async_handler!(replicaof, |sess, args| {
    let shared = sess.worker.shared.clone();
    if shared.cluster.is_some() {
        return sess.error("ERR REPLICAOF not allowed in cluster mode.");
    }
    if eq_ci(&args[1], "no") && eq_ci(&args[2], "one") {
        if shared.repl.is_replica() {
            replica::promote(&shared).await;
        }
        return sess.out.ok();
    }
    let port = match parse_i64(&args[2]) {
        Ok(p) if (0..=65535).contains(&p) => p as u16,
        _ => return sess.error("ERR Invalid master port"),
    };
    let host = String::from_utf8_lossy(&args[1]).into_owned();
    if shared.repl.is_replica() {
        let same = shared
            .repl
            .master
            .lock()
            .expect("master lock")
            .as_ref()
            .is_some_and(|m| m.host.eq_ignore_ascii_case(&host) && m.port == port);
        if same {
            tracing::info!("REPLICAOF would result into synchronization with the master we are already connected with. No operation performed.");
            sess.out.simple("OK Already connected to specified master");
            return;
        }
    }
    replica::follow(&shared, host.clone(), port).await;
    tracing::info!(
        "REPLICAOF {host}:{port} enabled (user request from 'id={}')",
        sess.id
    );
    sess.out.ok();
});

async_handler!(role, |sess, _args| {
    let shared = sess.worker.shared.clone();
    let r = &shared.repl;
    if r.is_replica() {
        let m = r.master.lock().expect("master lock").clone();
        let (host, port) = m.map_or((String::new(), 0), |m| (m.host, m.port));
        let state = match r.link.load(Ordering::Relaxed) {
            repl::LINK_CONNECT => "connect",
            repl::LINK_CONNECTING => "connecting",
            repl::LINK_HANDSHAKE => "handshake",
            repl::LINK_SYNC => "sync",
            repl::LINK_CONNECTED => "connected",
            _ => "none",
        };
        let offset = if r.backlog_active.load(Ordering::Relaxed) {
            r.offset.load(Ordering::Relaxed) as i64
        } else {
            -1
        };
        sess.out.array(5);
        sess.out.bulk(b"slave");
        sess.out.bulk(host.as_bytes());
        sess.out.int(port as i64);
        sess.out.bulk(state.as_bytes());
        sess.out.int(offset);
        return;
    }
    let offset = master::current_offset(&sess.worker).await;
    let replicas: Vec<_> = r
        .replicas()
        .into_iter()
        .filter(|e| e.state.load(Ordering::Relaxed) == repl::REPLICA_ONLINE)
        .collect();
    sess.out.array(3);
    sess.out.bulk(b"master");
    sess.out.int(offset as i64);
    sess.out.array(replicas.len());
    for e in replicas {
        sess.out.array(3);
        sess.out.bulk(e.ip.as_bytes());
        sess.out
            .bulk(e.port.load(Ordering::Relaxed).to_string().as_bytes());
        sess.out
            .bulk(e.ack_offset.load(Ordering::Relaxed).to_string().as_bytes());
    }
});

/// REPLCONF: what a replica says about itself before PSYNC (its port, address and
/// capabilities). ACK and GETACK only mean something on a replication link, which
/// reads them itself; from a client they are ignored, as in Redis.
pub fn replconf(sess: &mut Session, args: &[Bytes]) {
    if args.len().is_multiple_of(2) {
        return sess.error("ERR syntax error");
    }
    let mut conf = sess.replconf.as_deref().cloned().unwrap_or_default();
    let mut i = 1;
    while i + 1 < args.len() {
        let (opt, val) = (&args[i], &args[i + 1]);
        if eq_ci(opt, "listening-port") {
            match parse_i64(val) {
                Ok(p) if (0..=65535).contains(&p) => conf.listening_port = p as u16,
                _ => return sess.error("ERR value is not an integer or out of range"),
            }
        } else if eq_ci(opt, "ip-address") {
            conf.ip = Some(String::from_utf8_lossy(val).into_owned());
        } else if eq_ci(opt, "capa") {
            if eq_ci(val, "eof") {
                conf.capa_eof = true;
            } else if eq_ci(val, "psync2") {
                conf.capa_psync2 = true;
            }
        } else if eq_ci(opt, "ack") || eq_ci(opt, "getack") || eq_ci(opt, "fack") {
            return;
        } else if eq_ci(opt, "rdb-only") || eq_ci(opt, "rdb-filter-only") {
            // Accepted for redis-cli --rdb; the stream after the RDB is sent anyway.
        } else {
            return sess.error(&format!(
                "ERR Unrecognized REPLCONF option: {}",
                String::from_utf8_lossy(opt)
            ));
        }
        i += 2;
    }
    sess.replconf = Some(Box::new(conf));
    sess.out.ok();
}

async_handler!(psync, |sess, args| {
    if sess.multi.is_some() || sess.in_exec {
        return sess.error("ERR Command not allowed inside a transaction");
    }
    let replid = String::from_utf8_lossy(&args[1]).into_owned();
    let from = match parse_i64(&args[2]) {
        Ok(n) => n,
        Err(e) => return sess.error(e),
    };
    let from = if replid == "?" { 0 } else { from.max(0) as u64 };
    if args.len() > 3 {
        if args.len() != 4 || !eq_ci(&args[3], "failover") {
            return sess.error("ERR syntax error");
        }
        // The old master hands over: this replica becomes the master of their shared
        // history, and the caller continues it as a replica.
        let shared = sess.worker.shared.clone();
        if replid != shared.repl.ids().replid {
            return sess.error("ERR PSYNC FAILOVER replid must match my replid.");
        }
        tracing::info!("FAILOVER request received for replid {replid}.");
        replica::promote(&shared).await;
    }
    master::serve_replica(sess, Some((replid, from))).await;
});

async_handler!(sync, |sess, _args| {
    if sess.multi.is_some() || sess.in_exec {
        return sess.error("ERR Command not allowed inside a transaction");
    }
    master::serve_replica(sess, None).await;
});

async_handler!(wait, |sess, args| {
    let (Ok(replicas), Ok(timeout)) = (parse_i64(&args[1]), parse_i64(&args[2])) else {
        return sess
            .out
            .error("ERR value is not an integer or out of range");
    };
    if timeout < 0 {
        return sess.out.error("ERR timeout is negative");
    }
    if sess.worker.shared.repl.is_replica() {
        return sess
            .out
            .error("ERR WAIT cannot be used with replica instances. Please also note that since Redis 4.0 if a replica is configured to be writable (which is not the default) writes to replicas are just local and are not propagated.");
    }
    // The AOF replay and a master's stream never wait; nor does a transaction.
    if sess.replaying || sess.in_exec {
        let n = sess.worker.shared.repl.replicas().len() as i64;
        return sess.out.int(n);
    }
    let n = master::wait(sess, replicas, timeout as u64).await;
    sess.out.int(n);
});

async_handler!(waitaof, |sess, args| {
    let (Ok(numlocal), Ok(numreplicas), Ok(timeout)) = (
        parse_i64(&args[1]),
        parse_i64(&args[2]),
        parse_i64(&args[3]),
    ) else {
        return sess
            .out
            .error("ERR value is not an integer or out of range");
    };
    if timeout < 0 {
        return sess.out.error("ERR timeout is negative");
    }
    let shared = sess.worker.shared.clone();
    if shared.repl.is_replica() {
        return sess
            .out
            .error("ERR WAITAOF cannot be used with replica instances. Please also note that writes to replicas are just local and are not propagated.");
    }
    if numlocal > 0 && !shared.persist.aof.file_on() {
        return sess
            .out
            .error("ERR WAITAOF cannot be used when numlocal is set but appendonly is disabled.");
    }
    if sess.replaying || sess.in_exec {
        sess.out.array(2);
        sess.out.int(0);
        sess.out.int(0);
        return;
    }
    let (local, replicas) = master::waitaof(sess, numlocal > 0, numreplicas, timeout as u64).await;
    sess.out.array(2);
    sess.out.int(local as i64);
    sess.out.int(replicas);
});

async_handler!(failover, |sess, args| {
    crate::repl::failover::command(sess, &args).await;
});
