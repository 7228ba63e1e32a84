//! The check every command passes in cluster mode before it runs (Redis's
//! `getNodeByQuery`): all its keys in one slot, that slot served here, or the
//! redirection that tells the client where to go.

use bytes::Bytes;

use super::view;
use super::Cluster;
use crate::commands::{flags, Command, Keys};
use crate::server::session::Session;
use crate::shard::placement;

pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
pub const TRYAGAIN: &str = "TRYAGAIN Multiple keys request during rehashing of slot";
pub const DOWN: &str = "CLUSTERDOWN The cluster is down";
pub const DOWN_RO: &str = "CLUSTERDOWN The cluster is down and only accepts read commands";
pub const UNBOUND: &str = "CLUSTERDOWN Hash slot not served";

/// What the check decided.
pub enum Check {
    Serve,
    Refuse(String),
    /// The slot is moving: whether its keys are here decides (`resolve`).
    Probe(Probe),
}

pub struct Probe {
    slot: usize,
    keys: Vec<Bytes>,
    migrating: bool,
    importing: bool,
    multiple: bool,
}

/// Shard channels are keys as far as slots go (SPUBLISH, SSUBSCRIBE, SUNSUBSCRIBE).
fn shard_channels<'a>(cmd: &Command, args: &'a [Bytes]) -> Option<&'a [Bytes]> {
    match cmd.name {
        "spublish" => Some(&args[1..2.min(args.len())]),
        "ssubscribe" | "sunsubscribe" => Some(&args[1..]),
        _ => None,
    }
}

pub fn check(c: &Cluster, sess: &Session, cmd: &'static Command, args: &[Bytes]) -> Check {
    // The master's stream and the AOF replay are obeyed, as in Redis.
    if sess.replaying {
        return Check::Serve;
    }
    let exec = cmd.name == "exec";
    let channels = shard_channels(cmd, args);
    if !exec && channels.is_none() && matches!(cmd.keys, Keys::None) {
        return Check::Serve;
    }
    // The common case, one key named by the table: its slot's byte decides, no list.
    if let (Keys::Range(first, last, _), None, false) = (cmd.keys, channels, exec) {
        if first == last && (first as usize) < args.len() {
            let v = c.view.get(placement::slot(&args[first as usize]));
            if v & view::HERE != 0 && v & view::MIGRATING == 0 && c.view.ok() {
                return Check::Serve;
            }
        }
    }
    let mut keys: Vec<&Bytes> = Vec::new();
    let mut writes = cmd.has(flags::WRITE);
    if exec {
        let Some(m) = &sess.multi else {
            return Check::Serve;
        };
        for (qc, qargs) in &m.queued {
            writes |= qc.has(flags::WRITE);
            if let Some(ch) = shard_channels(qc, qargs) {
                keys.extend(ch);
            } else {
                keys.extend(qc.key_positions(qargs).into_iter().map(|i| &qargs[i]));
            }
        }
    } else if let Some(ch) = channels {
        keys.extend(ch);
    } else {
        keys.extend(cmd.key_positions(args).into_iter().map(|i| &args[i]));
    }
    let Some(first) = keys.first() else {
        return Check::Serve;
    };
    let slot = placement::slot(first);
    let mut multiple = false;
    for k in &keys[1..] {
        if placement::slot(k) != slot {
            return Check::Refuse(CROSSSLOT.into());
        }
        multiple = true;
    }
    let v = c.view.get(slot);
    if v & (view::HERE | view::ELSEWHERE) == 0 {
        return Check::Refuse(UNBOUND.into());
    }
    if !c.view.ok() {
        if channels.is_some() {
            // cluster-allow-pubsubshard-when-down is yes by default: served.
        } else if !c.lock().allow_reads_when_down {
            return Check::Refuse(DOWN.into());
        } else if writes {
            return Check::Refuse(DOWN_RO.into());
        }
    }
    let migrating = v & view::HERE != 0 && v & view::MIGRATING != 0;
    let importing = v & view::HERE == 0 && v & view::IMPORTING != 0;
    if migrating || importing {
        // MIGRATE itself runs on a moving slot whatever its keys' state.
        if cmd.name == "migrate" {
            return Check::Serve;
        }
        if migrating || sess.asking || cmd.name == "restore-asking" {
            return Check::Probe(Probe {
                slot,
                keys: keys.into_iter().cloned().collect(),
                migrating,
                importing,
                multiple,
            });
        }
    }
    if v & view::HERE != 0 {
        return Check::Serve;
    }
    if v & view::MY_MASTER != 0 && (sess.readonly || channels.is_some()) && !writes {
        return Check::Serve;
    }
    Check::Refuse(moved(c, "MOVED", slot))
}

/// `MOVED slot ip:port` or `ASK slot ip:port` to the node serving (or taking) `slot`.
fn moved(c: &Cluster, what: &str, slot: usize) -> String {
    let st = c.lock();
    let node = if what == "ASK" {
        st.migrating_to.get(&slot)
    } else {
        st.owner[slot].as_ref()
    }
    .and_then(|n| st.nodes.get(n));
    match node {
        Some(n) => format!("{what} {slot} {}:{}", n.ip, n.port),
        None => UNBOUND.into(),
    }
}

/// Decides a probe: how many of its keys this node holds.
pub async fn resolve(c: &Cluster, sess: &Session, p: Probe) -> Option<String> {
    let db = sess.db;
    let worker = &sess.worker;
    let mut missing = 0;
    let mut present = 0;
    for k in p.keys {
        let shard = worker.shard_of(&k);
        let here = crate::shard::hop(worker, shard, move |w| {
            let now = crate::shard::unix_ms();
            w.shard.borrow_mut().lookup(db, &k, now).is_some()
        })
        .await;
        if here {
            present += 1;
        } else {
            missing += 1;
        }
    }
    if p.migrating && missing > 0 {
        if present > 0 {
            return Some(TRYAGAIN.into());
        }
        return Some(moved(c, "ASK", p.slot));
    }
    if p.importing {
        if p.multiple && missing > 0 {
            return Some(TRYAGAIN.into());
        }
        return None;
    }
    None
}

/// A command a script calls, in cluster mode (Redis's scriptVerifyClusterState): its
/// keys must be served here, and in one slot with the script's other keys unless the
/// script may cross slots.
pub fn script_access<'a>(
    c: &Cluster,
    keys: impl Iterator<Item = &'a [u8]>,
    writes: bool,
    slot: &mut Option<usize>,
    cross_slot_ok: bool,
) -> Result<(), &'static str> {
    for key in keys {
        let s = placement::slot(key);
        if !c.view.ok() {
            if !c.lock().allow_reads_when_down {
                return Err("ERR Script attempted to execute a command while the cluster is down");
            }
            if writes {
                return Err("ERR Script attempted to execute a write command while the cluster is down and readonly");
            }
        }
        if c.view.get(s) & view::HERE == 0 {
            return Err("ERR Script attempted to access a non local key in a cluster node");
        }
        if !cross_slot_ok {
            match *slot {
                None => *slot = Some(s),
                Some(prev) if prev != s => {
                    return Err(
                        "ERR Script attempted to access keys that do not hash to the same slot",
                    )
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Clients blocked on a key whose slot is no longer served here (moved by a reshard or a
/// failover, or the cluster went down) are answered with the redirection, so a queue
/// worker reconnects to the right node (Redis's clusterRedirectBlockedClientIfNeeded).
/// Run by each thread's housekeeping for its own connections.
pub fn redirect_blocked(c: &Cluster, worker: &crate::shard::Worker) {
    let clients = worker.clients.borrow();
    for h in clients.map.values() {
        if !h.blocked.get() {
            continue;
        }
        let Some((slot, replica_read)) = h.blocked_slot.get() else {
            continue;
        };
        let slot = slot as usize;
        let msg = if !c.view.ok() {
            Some(DOWN.to_string())
        } else {
            let v = c.view.get(slot);
            let served = v & (view::HERE | view::IMPORTING) != 0
                || (replica_read && v & view::MY_MASTER != 0);
            if served {
                None
            } else if v & view::ELSEWHERE == 0 {
                Some(UNBOUND.to_string())
            } else {
                Some(moved(c, "MOVED", slot))
            }
        };
        if let Some(msg) = msg {
            *h.unblock_error.borrow_mut() = Some(msg);
            h.unblock.set(Some(true));
            h.wake.notify_one();
        }
    }
}
