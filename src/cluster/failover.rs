//! Failover: a replica's election to replace its failed master (and CLUSTER FAILOVER's
//! forced and manual forms), a master's vote, and the hand-over of the slots, as Redis's
//! clusterHandleSlaveFailover and clusterSendFailoverAuthIfNeeded do. Runs on the bus
//! thread under the control-plane lock, like everything in `bus.rs`; it never touches a
//! shard's data (stopping replication is `repl`'s work, asked for with `Act::Promote`).

use std::sync::Arc;

use super::bus::{header, Act, Bus};
use super::state::{flags, name_str, Name, State};
use super::wire::{self, Header};
use super::{now_ms, SLOTS};
use crate::shard::Shared;

/// A master's vote for a replica asking to replace its failed master (Redis's
/// clusterSendFailoverAuthIfNeeded): one vote per epoch, none for a replica whose master
/// is healthy (unless forced), none twice for one master within two node timeouts, and
/// none when a slot it claims has a newer owner.
pub(super) fn vote_if_needed(shared: &Shared, st: &mut State, h: &Header) -> Vec<Act> {
    let now = now_ms();
    let me = st.me();
    if !me.is_master() || me.numslots == 0 {
        return Vec::new();
    }
    if h.current_epoch < st.current_epoch || st.last_vote_epoch == st.current_epoch {
        return Vec::new();
    }
    if h.slaveof == [0; 40] {
        return Vec::new();
    }
    let Some(master) = st.nodes.get(&h.slaveof) else {
        return Vec::new();
    };
    let forced = h.mflags[0] & wire::FLAG0_FORCEACK != 0;
    if !master.failed() && !forced {
        return Vec::new();
    }
    if now.saturating_sub(master.voted_time) < st.node_timeout * 2 {
        return Vec::new();
    }
    for slot in 0..SLOTS {
        if h.slots[slot / 8] & (1 << (slot % 8)) == 0 {
            continue;
        }
        if let Some(owner) = st.owner[slot].and_then(|o| st.nodes.get(&o)) {
            if owner.config_epoch > h.config_epoch {
                return Vec::new();
            }
        }
    }
    st.last_vote_epoch = st.current_epoch;
    st.nodes.get_mut(&h.slaveof).expect("known").voted_time = now;
    st.save_pending = true;
    tracing::info!(
        "Failover auth granted to {} for epoch {}",
        name_str(&h.sender),
        st.current_epoch
    );
    st.sent[wire::AUTH_ACK as usize] += 1;
    let ack = wire::encode_bare(&header(shared, st, wire::AUTH_ACK), wire::AUTH_ACK);
    vec![Act::Send(h.sender, ack)]
}

/// A replica's side of failover (Redis's clusterHandleSlaveFailover), run each turn:
/// when its master has failed (or CLUSTER FAILOVER FORCE asked), wait a delay that
/// grows with how far behind the other replicas it is, ask the masters for votes in a
/// new epoch, and take the master's slots with a majority of them.
pub(super) fn election(bus: &Bus, st: &mut State) -> Vec<Act> {
    let now = now_ms();
    let me = st.me();
    let Some(master_name) = me.master.filter(|_| me.has(flags::REPLICA)) else {
        st.election = Default::default();
        return Vec::new();
    };
    let Some(master) = st.nodes.get(&master_name) else {
        return Vec::new();
    };
    let manual = st.election.forced && now < st.election.manual_until;
    if !manual && st.election.forced {
        st.election = Default::default();
    }
    if (!master.failed() && !manual) || master.numslots == 0 {
        st.election.start_at = 0;
        return Vec::new();
    }
    if st.replica_no_failover && !manual {
        return Vec::new();
    }
    let repl = &bus.shared.repl;
    let my_offset = repl.offset.load(std::sync::atomic::Ordering::Relaxed);
    if !manual && st.replica_validity_factor > 0 {
        // Data too old to be trusted: a replica cut off from its master for long stays
        // out of elections.
        let down_since = repl
            .link_down_since_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        let age = if repl.link_up() || down_since == 0 {
            0
        } else {
            now.saturating_sub(down_since)
                .saturating_sub(st.node_timeout)
        };
        if age > st.node_timeout * st.replica_validity_factor + 10_000 {
            return Vec::new();
        }
    }
    let auth_timeout = (st.node_timeout * 2).max(2000);
    let retry = auth_timeout * 2;
    let e = &st.election;
    if e.start_at == 0 || now > e.start_at + retry {
        let rank = st
            .replicas_of(&master_name)
            .iter()
            .filter(|r| !r.has(flags::MYSELF) && r.repl_offset > my_offset)
            .count() as u64;
        let start = if manual {
            now
        } else {
            now + 500 + bus.random() % 500 + rank * 1000
        };
        st.election.start_at = start;
        st.election.sent = false;
        st.election.votes = 0;
        tracing::info!(
            "Start of election delayed for {} milliseconds (rank #{rank}, offset {my_offset}).",
            start - now
        );
        return Vec::new();
    }
    if now < e.start_at || now - e.start_at > auth_timeout {
        return Vec::new();
    }
    // A plain CLUSTER FAILOVER first catches up with everything the paused master has.
    if manual && e.wait_for_master && e.master_offset.is_none_or(|o| my_offset < o) {
        return Vec::new();
    }
    if !e.sent {
        st.current_epoch += 1;
        st.election.epoch = st.current_epoch;
        st.election.sent = true;
        st.save_pending = true;
        tracing::info!(
            "Starting a failover election for epoch {}.",
            st.current_epoch
        );
        let mut hd = header(&bus.shared, st, wire::AUTH_REQUEST);
        if manual {
            hd.mflags[0] |= wire::FLAG0_FORCEACK;
        }
        st.sent[wire::AUTH_REQUEST as usize] += 1;
        return vec![Act::Broadcast(wire::encode_bare(&hd, wire::AUTH_REQUEST))];
    }
    if st.election.votes < st.size() / 2 + 1 {
        return Vec::new();
    }
    tracing::info!("Failover election won: I'm the new master.");
    take_over(st, master_name);
    let epoch = st.election.epoch;
    if epoch > st.me().config_epoch {
        st.me_mut().config_epoch = epoch;
    }
    st.election = Default::default();
    vec![Act::Promote]
}

/// This replica becomes a master serving every slot its master served, and tells
/// everyone (CLUSTER FAILOVER TAKEOVER and a won election).
pub fn take_over(st: &mut State, old_master: Name) {
    let me = st.myself;
    for slot in 0..SLOTS {
        if st.owner[slot] == Some(old_master) {
            st.assign(slot, me);
        }
    }
    let m = st.me_mut();
    m.flags = (m.flags & !flags::REPLICA) | flags::MASTER;
    m.master = None;
    st.save_pending = true;
    st.broadcast_pong = true;
}

/// Client writes paused (or resumed) on every thread, as CLIENT PAUSE WRITE does.
pub(super) fn pause_writes(shared: &Arc<Shared>, until: Option<u64>) {
    use crate::shard::clients::Pause;
    for target in 0..shared.nshards() {
        shared.send(
            target,
            Box::new(move |w| {
                let mut clients = w.clients.borrow_mut();
                match until {
                    Some(until) => {
                        if clients.pause.until_unix_ms < until {
                            clients.pause = Pause {
                                until_unix_ms: until,
                                writes_only: true,
                            };
                        }
                    }
                    None => {
                        clients.pause = Pause::default();
                        clients.pause_notify.notify_waiters();
                    }
                }
            }),
        );
    }
}
