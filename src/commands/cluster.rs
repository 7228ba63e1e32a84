//! The cluster command family: CLUSTER's subcommands, READONLY, READWRITE and ASKING.
//! With `cluster-enabled no` they say that cluster support is disabled, as Redis does;
//! in cluster mode they read and change `cluster::state` (docs/cluster.md).

use bytes::Bytes;

use crate::async_handler;
use crate::cluster::state::{flags, name_str, parse_name, Name, Node, State, MSG_NAMES};
use crate::cluster::{Cluster, SLOTS};
use crate::commands::util::{eq_ci, parse_i64};
use crate::server::session::Session;
use crate::shard::placement;

pub const CLUSTER_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("addslots", -3, "admin stale no_async_loading"),
    ("addslotsrange", -4, "admin stale no_async_loading"),
    ("bumpepoch", 2, "admin stale no_async_loading"),
    ("count-failure-reports", 3, "admin stale"),
    ("countkeysinslot", 3, "stale"),
    ("delslots", -3, "admin stale no_async_loading"),
    ("delslotsrange", -4, "admin stale no_async_loading"),
    ("failover", -2, "admin stale no_async_loading"),
    ("flushslots", 2, "admin stale no_async_loading"),
    ("forget", 3, "admin stale no_async_loading"),
    ("getkeysinslot", 4, "stale"),
    ("help", 2, "loading stale"),
    ("info", 2, "stale"),
    ("keyslot", 3, "stale"),
    ("links", 2, "stale"),
    ("meet", -4, "admin stale no_async_loading"),
    ("myid", 2, "stale"),
    ("myshardid", 2, "stale"),
    ("nodes", 2, "stale"),
    ("replicas", 3, "admin stale"),
    ("replicate", 3, "admin stale no_async_loading"),
    ("reset", -2, "admin stale noscript"),
    ("saveconfig", 2, "admin stale no_async_loading"),
    ("set-config-epoch", 3, "admin stale no_async_loading"),
    ("setslot", -4, "admin stale no_async_loading"),
    ("shards", 2, "stale"),
    ("slaves", 3, "admin stale"),
    ("slots", 2, "stale"),
];

const DISABLED: &str = "ERR This instance has cluster support disabled";
const NOT_INT: &str = "ERR value is not an integer or out of range";

/// CLUSTER, READONLY, READWRITE, ASKING with cluster mode off.
pub fn disabled(sess: &mut Session, _args: &[Bytes]) {
    sess.error(DISABLED);
}

pub fn readonly(sess: &mut Session, _args: &[Bytes]) {
    if sess.worker.shared.cluster.is_none() {
        return sess.error(DISABLED);
    }
    sess.readonly = true;
    sess.out.ok();
}

pub fn readwrite(sess: &mut Session, _args: &[Bytes]) {
    if sess.worker.shared.cluster.is_none() {
        return sess.error(DISABLED);
    }
    sess.readonly = false;
    sess.out.ok();
}

pub fn asking(sess: &mut Session, _args: &[Bytes]) {
    if sess.worker.shared.cluster.is_none() {
        return sess.error(DISABLED);
    }
    sess.asking = true;
    sess.out.ok();
}

const HELP: &[&str] = &[
    "CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ADDSLOTS <slot> [<slot> ...]",
    "    Assign slots to current node.",
    "ADDSLOTSRANGE <start slot> <end slot> [<start slot> <end slot> ...]",
    "    Assign slots which are between <start-slot> and <end-slot> to current node.",
    "BUMPEPOCH",
    "    Advance the cluster config epoch.",
    "COUNT-FAILURE-REPORTS <node-id>",
    "    Return number of failure reports for <node-id>.",
    "COUNTKEYSINSLOT <slot>",
    "    Return the number of keys in <slot>.",
    "DELSLOTS <slot> [<slot> ...]",
    "    Delete slots information from current node.",
    "DELSLOTSRANGE <start slot> <end slot> [<start slot> <end slot> ...]",
    "    Delete slots information which are between <start-slot> and <end-slot>.",
    "FAILOVER [FORCE|TAKEOVER]",
    "    Promote current replica node to being a master (not built in Kite yet).",
    "FORGET <node-id>",
    "    Remove a node from the cluster.",
    "GETKEYSINSLOT <slot> <count>",
    "    Return key names stored by current node in a slot.",
    "FLUSHSLOTS",
    "    Delete current node own slots information.",
    "INFO",
    "    Return information about the cluster.",
    "KEYSLOT <key>",
    "    Return the hash slot for <key>.",
    "LINKS",
    "    Return information about all network links between this node and its peers.",
    "MEET <ip> <port> [<bus-port>]",
    "    Connect nodes into a working cluster.",
    "MYID",
    "    Return the node id.",
    "MYSHARDID",
    "    Return the node's shard id.",
    "NODES",
    "    Return cluster configuration seen by node.",
    "REPLICATE <node-id>",
    "    Configure current node as replica to <node-id>.",
    "RESET [HARD|SOFT]",
    "    Reset current node (default: soft).",
    "SET-CONFIG-EPOCH <epoch>",
    "    Set config epoch of current node.",
    "SETSLOT <slot> (IMPORTING <node-id>|MIGRATING <node-id>|STABLE|NODE <node-id>)",
    "    Set slot state.",
    "REPLICAS <node-id>",
    "    Return <node-id> replicas.",
    "SAVECONFIG",
    "    Force saving cluster configuration on disk.",
    "SHARDS",
    "    Return information about slot range mappings and the nodes associated with them.",
    "SLOTS",
    "    Return information about slots range mappings. Each range is made of:",
    "    start, end, master and replicas IP addresses, ports and ids",
    "HELP",
    "    Print this help.",
];

async_handler!(cluster, |sess, args| {
    let shared = sess.worker.shared.clone();
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    if sub == "help" {
        sess.out.array(HELP.len());
        for l in HELP {
            sess.out.simple(l);
        }
        return;
    }
    let Some(c) = shared.cluster.as_deref() else {
        return sess.error(DISABLED);
    };
    // Subcommands whose argument count the table leaves open, as Redis words it.
    let too_many = match sub.as_str() {
        "reset" | "failover" => args.len() > 3,
        "meet" => args.len() > 5,
        _ => false,
    };
    if too_many {
        return sess.error(&format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try CLUSTER HELP.",
            String::from_utf8_lossy(&args[1]).to_ascii_uppercase()
        ));
    }
    match sub.as_str() {
        "info" => {
            let text = info_text(&c.lock());
            sess.out.verbatim(text.as_bytes());
        }
        "myid" => {
            let st = c.lock();
            sess.out.bulk(&st.myself);
        }
        "myshardid" => {
            let st = c.lock();
            let id = shard_id(&st, st.me());
            sess.out.bulk(&id);
        }
        "nodes" => {
            let text = c.lock().nodes_text(crate::cluster::now_ms());
            sess.out.verbatim(text.as_bytes());
        }
        "replicas" | "slaves" => {
            let st = c.lock();
            let Some(name) = parse_name(&args[2]).filter(|n| st.nodes.contains_key(n)) else {
                drop(st);
                return sess.error(&format!(
                    "ERR Unknown node {}",
                    String::from_utf8_lossy(&args[2])
                ));
            };
            if !st.nodes[&name].is_master() {
                drop(st);
                return sess.error("ERR The specified node is not a master");
            }
            let now = crate::cluster::now_ms();
            let lines: Vec<String> = st
                .replicas_of(&name)
                .iter()
                .map(|n| st.describe(n, false, now))
                .collect();
            drop(st);
            sess.out.array(lines.len());
            for l in lines {
                sess.out.bulk(l.as_bytes());
            }
        }
        "slots" => slots_reply(sess, c),
        "shards" => shards_reply(sess, c),
        "links" => links_reply(sess, c),
        "keyslot" => sess.out.int(placement::slot(&args[2]) as i64),
        "countkeysinslot" => {
            if parse_i64(&args[2]).is_err() {
                return sess.error(NOT_INT);
            }
            let Some(slot) = slot_arg(&args[2]) else {
                return sess.error("ERR Invalid slot");
            };
            let n = keys_in_slot(sess, slot, usize::MAX).await.len();
            sess.out.int(n as i64);
        }
        "getkeysinslot" => {
            if parse_i64(&args[2]).is_err() || parse_i64(&args[3]).is_err() {
                return sess.error(NOT_INT);
            }
            let (Some(slot), Ok(count)) = (slot_arg(&args[2]), parse_i64(&args[3])) else {
                return sess.error("ERR Invalid slot or number of keys");
            };
            if count < 0 {
                return sess.error("ERR Invalid slot or number of keys");
            }
            let keys = keys_in_slot(sess, slot, count as usize).await;
            sess.out.array(keys.len());
            for k in keys {
                sess.out.bulk(&k);
            }
        }
        "count-failure-reports" => {
            let st = c.lock();
            let n = parse_name(&args[2])
                .and_then(|n| st.nodes.get(&n))
                .map(|n| n.fail_reports.len());
            drop(st);
            match n {
                Some(n) => sess.out.int(n as i64),
                None => sess.error(&format!(
                    "ERR Unknown node {}",
                    String::from_utf8_lossy(&args[2])
                )),
            }
        }
        "addslots" | "delslots" | "addslotsrange" | "delslotsrange" => {
            let range = sub.ends_with("range");
            let slots = if range {
                if args.len() % 2 == 1 {
                    return sess.error(&format!(
                        "ERR wrong number of arguments for 'cluster|{sub}' command"
                    ));
                }
                let mut v = Vec::new();
                for pair in args[2..].chunks(2) {
                    let (Some(a), Some(b)) = (slot_arg(&pair[0]), slot_arg(&pair[1])) else {
                        return sess.error("ERR Invalid or out of range slot");
                    };
                    if a > b {
                        return sess.error(&format!(
                            "ERR start slot number {a} is greater than end slot number {b}"
                        ));
                    }
                    v.extend(a..=b);
                }
                v
            } else {
                let mut v = Vec::new();
                for a in &args[2..] {
                    let Some(s) = slot_arg(a) else {
                        return sess.error("ERR Invalid or out of range slot");
                    };
                    v.push(s);
                }
                v
            };
            let add = sub.starts_with("add");
            let r = change_slots(c, &slots, add);
            match r {
                Ok(()) => sess.out.ok(),
                Err(e) => sess.error(&e),
            }
        }
        "flushslots" => {
            let db_empty = crate::shard::broadcast(&sess.worker, |w| w.shard.borrow().keys_in(0))
                .await
                .iter()
                .sum::<usize>()
                == 0;
            if !db_empty {
                return sess.error("ERR DB must be empty to perform CLUSTER FLUSHSLOTS.");
            }
            let mut st = c.lock();
            let me = st.myself;
            for slot in 0..SLOTS {
                if st.owner[slot] == Some(me) {
                    st.unassign(slot);
                }
            }
            let r = c.commit(&mut st, true);
            drop(st);
            reply_saved(sess, r);
        }
        "setslot" => setslot(sess, c, &args).await,
        "meet" => {
            let ip = String::from_utf8_lossy(&args[2]).into_owned();
            if args.len() > 5 {
                return sess.error("ERR syntax error");
            }
            let Ok(port) = parse_i64(&args[3]) else {
                return sess.error(&format!(
                    "ERR Invalid base port specified: {}",
                    String::from_utf8_lossy(&args[3])
                ));
            };
            let cport = match args.get(4) {
                Some(a) => match parse_i64(a) {
                    Ok(c) => c,
                    Err(_) => {
                        return sess.error(&format!(
                            "ERR Invalid bus port specified: {}",
                            String::from_utf8_lossy(a)
                        ))
                    }
                },
                None => port + 10000,
            };
            let valid = |p: i64| (1..=65535).contains(&p);
            if ip.parse::<std::net::IpAddr>().is_err() || !valid(port) || !valid(cport) {
                return sess.error(&format!(
                    "ERR Invalid node address specified: {ip}:{}",
                    String::from_utf8_lossy(&args[3])
                ));
            }
            c.lock().meets.push((ip, port as u16, cport as u16));
            c.wake.notify_one();
            sess.out.ok();
        }
        "forget" => {
            let mut st = c.lock();
            let Some(name) = parse_name(&args[2]).filter(|n| st.nodes.contains_key(n)) else {
                drop(st);
                return sess.error(&format!(
                    "ERR Unknown node {}",
                    String::from_utf8_lossy(&args[2])
                ));
            };
            if name == st.myself {
                drop(st);
                return sess.error("ERR I tried hard but I can't forget myself...");
            }
            if st.me().has(flags::REPLICA) && st.me().master == Some(name) {
                drop(st);
                return sess.error("ERR Can't forget my master!");
            }
            st.remove_node(&name);
            st.forgotten.insert(
                name,
                crate::cluster::now_ms() + crate::cluster::bus::FORGET_TTL_MS,
            );
            let r = c.commit(&mut st, true);
            drop(st);
            reply_saved(sess, r);
        }
        "replicate" => replicate(sess, c, &args).await,
        "reset" => {
            let hard = match args.get(2) {
                None => false,
                Some(a) if eq_ci(a, "hard") => true,
                Some(a) if eq_ci(a, "soft") => false,
                Some(_) => return sess.error("ERR syntax error"),
            };
            if args.len() > 3 {
                return sess.error("ERR syntax error");
            }
            let is_master = c.lock().i_am_master();
            let keys = crate::shard::broadcast(&sess.worker, |w| w.shard.borrow().keys_in(0))
                .await
                .iter()
                .sum::<usize>();
            if is_master && keys > 0 {
                return sess
                    .error("ERR CLUSTER RESET can't be called with master nodes containing keys");
            }
            if !is_master {
                crate::repl::replica::promote(&shared).await;
                flush_all(sess).await;
            }
            let r = {
                let mut st = c.lock();
                reset(&mut st, hard);
                c.commit(&mut st, true)
            };
            c.wake.notify_one();
            reply_saved(sess, r);
        }
        "saveconfig" => {
            let st = c.lock();
            let r = c.save_now(&st);
            drop(st);
            match r {
                Ok(()) => sess.out.ok(),
                Err(e) => sess.error(&format!("ERR error saving the cluster node config: {e}")),
            }
        }
        "set-config-epoch" => {
            let epoch = match parse_i64(&args[2]) {
                Err(_) => return sess.error(NOT_INT),
                Ok(e) if e >= 0 => e as u64,
                _ => {
                    return sess.error(&format!(
                        "ERR Invalid config epoch specified: {}",
                        String::from_utf8_lossy(&args[2])
                    ))
                }
            };
            let mut st = c.lock();
            if st.nodes.len() > 1 {
                drop(st);
                return sess.error("ERR The user can assign a config epoch only when the node does not know any other node.");
            }
            if st.me().config_epoch != 0 {
                drop(st);
                return sess.error("ERR Node config epoch is already non-zero");
            }
            st.me_mut().config_epoch = epoch;
            if st.current_epoch < epoch {
                st.current_epoch = epoch;
            }
            let r = c.commit(&mut st, true);
            drop(st);
            reply_saved(sess, r);
        }
        "bumpepoch" => {
            let mut st = c.lock();
            let reply = bump_epoch(&mut st);
            let r = c.commit(&mut st, true);
            drop(st);
            match r {
                Ok(()) => sess.out.simple(&reply),
                Err(e) => sess.error(&format!("ERR {e}")),
            }
        }
        "failover" => {
            let mode = match args.get(2) {
                None => "",
                Some(a) if eq_ci(a, "force") && args.len() == 3 => "force",
                Some(a) if eq_ci(a, "takeover") && args.len() == 3 => "takeover",
                Some(_) => return sess.error("ERR syntax error"),
            };
            let r = match failover_request(c, mode) {
                Ok(r) => r,
                Err(e) => return sess.error(e),
            };
            if mode == "takeover" {
                crate::repl::replica::promote(&shared).await;
            }
            c.wake.notify_one();
            reply_saved(sess, r);
        }
        _ => sess.error(&format!(
            "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
            crate::commands::util::printable(&args[1], 128)
        )),
    }
});

/// CLUSTER FAILOVER's checks and state change (the caller stops replicating for
/// TAKEOVER). Err is the reply refusing it.
fn failover_request(c: &Cluster, mode: &str) -> Result<Result<(), String>, &'static str> {
    let mut st = c.lock();
    if st.i_am_master() {
        return Err("ERR You should send CLUSTER FAILOVER to a replica");
    }
    let Some(master) = st.me().master.filter(|m| st.nodes.contains_key(m)) else {
        return Err("ERR I'm a replica but my master is unknown to me");
    };
    let m = &st.nodes[&master];
    if mode.is_empty() && (m.failed() || !m.link_up) {
        return Err("ERR Master is down or failed, please use CLUSTER FAILOVER FORCE");
    }
    let now = crate::cluster::now_ms();
    Ok(match mode {
        "takeover" => {
            // No agreement asked: a new epoch of its own, and the slots.
            bump_epoch(&mut st);
            crate::cluster::failover::take_over(&mut st, master);
            c.commit(&mut st, true)
        }
        _ => {
            st.election = crate::cluster::state::Election {
                forced: true,
                manual_until: now + 5000,
                wait_for_master: mode.is_empty(),
                ..Default::default()
            };
            // A plain FAILOVER first asks the master to pause its writes (MFSTART).
            st.manual_start = mode.is_empty();
            Ok(())
        }
    })
}

fn reply_saved(sess: &mut Session, r: Result<(), String>) {
    match r {
        Ok(()) => sess.out.ok(),
        Err(e) => sess.error(&format!("ERR {e}")),
    }
}

fn slot_arg(a: &[u8]) -> Option<usize> {
    parse_i64(a)
        .ok()
        .filter(|s| (0..SLOTS as i64).contains(s))
        .map(|s| s as usize)
}

fn shard_id(_st: &State, n: &Node) -> Name {
    n.shard_id
}

/// Keys of database 0 in `slot`, up to `max`, from every shard (a slot's keys may sit on
/// several threads when a placement rule spreads hashtags).
async fn keys_in_slot(sess: &Session, slot: usize, max: usize) -> Vec<Vec<u8>> {
    let per_shard = crate::shard::broadcast(&sess.worker, move |w| {
        let sh = w.shard.borrow();
        let now = crate::shard::unix_ms();
        sh.dbs[0]
            .table
            .iter()
            .filter(|e| !e.is_expired(now) && placement::slot(&e.key) == slot)
            .take(max)
            .map(|e| e.key.to_vec())
            .collect::<Vec<_>>()
    })
    .await;
    per_shard.into_iter().flatten().take(max).collect()
}

fn change_slots(c: &Cluster, slots: &[usize], add: bool) -> Result<(), String> {
    let mut st = c.lock();
    let mut seen = std::collections::HashSet::new();
    for &s in slots {
        if add && st.owner[s].is_some() {
            return Err(format!("ERR Slot {s} is already busy"));
        }
        if !add && st.owner[s].is_none() {
            return Err(format!("ERR Slot {s} is already unassigned"));
        }
        if !seen.insert(s) {
            return Err(format!("ERR Slot {s} specified multiple times"));
        }
    }
    let me = st.myself;
    for &s in slots {
        if add {
            st.assign(s, me);
            // A slot given to this node by hand is no longer being imported.
            st.importing_from.remove(&s);
        } else {
            st.unassign(s);
            st.importing_from.remove(&s);
            st.migrating_to.remove(&s);
        }
    }
    c.commit(&mut st, true).map_err(|e| format!("ERR {e}"))
}

/// Redis's clusterBumpConfigEpochWithoutConsensus, as BUMPEPOCH answers it.
pub fn bump_epoch(st: &mut State) -> String {
    let max = st.max_config_epoch();
    let mine = st.me().config_epoch;
    if mine == 0 || mine != max {
        st.current_epoch += 1;
        let e = st.current_epoch;
        st.me_mut().config_epoch = e;
        format!("BUMPED {e}")
    } else {
        format!("STILL {mine}")
    }
}

fn reset(st: &mut State, hard: bool) {
    let me = st.myself;
    let others: Vec<Name> = st.nodes.keys().filter(|n| **n != me).copied().collect();
    for n in others {
        st.remove_node(&n);
    }
    for slot in 0..SLOTS {
        st.unassign(slot);
    }
    st.migrating_to.clear();
    st.importing_from.clear();
    let m = st.me_mut();
    m.flags = flags::MYSELF | flags::MASTER;
    m.master = None;
    if hard {
        m.config_epoch = 0;
        st.current_epoch = 0;
        st.last_vote_epoch = 0;
        let new = crate::cluster::state::random_name();
        let mut node = st.nodes.remove(&me).expect("myself");
        node.name = new;
        node.shard_id = new;
        st.myself = new;
        st.nodes.insert(new, node);
    }
}

async fn flush_all(sess: &Session) {
    crate::shard::broadcast(&sess.worker, |w| {
        let mut sh = w.shard.borrow_mut();
        sh.dbs[0].table.clear();
    })
    .await;
}

async fn setslot(sess: &mut Session, c: &Cluster, args: &[Bytes]) {
    if c.lock().me().has(flags::REPLICA) {
        return sess.error("ERR Please use SETSLOT only with masters.");
    }
    let Some(slot) = slot_arg(&args[2]) else {
        return sess.error("ERR Invalid or out of range slot");
    };
    let action = String::from_utf8_lossy(&args[3]).to_ascii_lowercase();
    let want_node = matches!(action.as_str(), "importing" | "migrating" | "node");
    if (want_node && args.len() != 5) || (action == "stable" && args.len() != 4) {
        return sess
            .error("ERR Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP");
    }
    {
        // Who owns the slot is checked before the node is looked up, as Redis does.
        let st = c.lock();
        let mine = st.owner[slot] == Some(st.myself);
        drop(st);
        if action == "migrating" && !mine {
            return sess.error(&format!("ERR I'm not the owner of hash slot {slot}"));
        }
        if action == "importing" && mine {
            return sess.error(&format!("ERR I'm already the owner of hash slot {slot}"));
        }
    }
    let node = if want_node {
        let st = c.lock();
        match parse_name(&args[4]).filter(|n| st.nodes.contains_key(n)) {
            Some(n) => Some(n),
            None => {
                drop(st);
                let what = if action == "node" {
                    "Unknown node"
                } else {
                    "I don't know about node"
                };
                return sess.error(&format!("ERR {what} {}", String::from_utf8_lossy(&args[4])));
            }
        }
    } else {
        None
    };
    match action.as_str() {
        "migrating" | "importing" => {
            let mut st = c.lock();
            let n = node.expect("node");
            if !st.nodes[&n].is_master() {
                drop(st);
                return sess.error("ERR Target node is not a master");
            }
            if action == "migrating" {
                st.migrating_to.insert(slot, n);
            } else {
                st.importing_from.insert(slot, n);
            }
            let r = c.commit(&mut st, true);
            drop(st);
            reply_saved(sess, r);
        }
        "stable" => {
            let mut st = c.lock();
            st.migrating_to.remove(&slot);
            st.importing_from.remove(&slot);
            let r = c.commit(&mut st, true);
            drop(st);
            reply_saved(sess, r);
        }
        "node" => {
            let n = node.expect("node");
            let me = c.lock().myself;
            let owned_by_me = c.lock().owner[slot] == Some(me);
            if owned_by_me && n != me && !keys_in_slot(sess, slot, 1).await.is_empty() {
                return sess.error(&format!("ERR Can't assign hashslot {slot} to a different node while I still hold keys for this hash slot."));
            }
            let (r, follow) = assign_slot(c, slot, n);
            if let Some((ip, port)) = follow {
                crate::repl::replica::follow(&sess.worker.shared, ip, port).await;
            }
            c.wake.notify_one();
            reply_saved(sess, r);
        }
        _ => sess
            .error("ERR Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP"),
    }
}

/// SETSLOT NODE's change of owner. Returns the save's outcome and, when this master gave
/// its last slot away, the address of the master it now follows.
fn assign_slot(c: &Cluster, slot: usize, n: Name) -> (Result<(), String>, Option<(String, u16)>) {
    let mut st = c.lock();
    let me = st.myself;
    let was_mine = st.owner[slot] == Some(me);
    if was_mine && n != me {
        // Giving the slot away ends its migration.
        st.migrating_to.remove(&slot);
    }
    if n == me && st.importing_from.remove(&slot).is_some() {
        // Redis bumps the epoch without agreement when an import ends here, so the new
        // owner's claim wins over the old owner's, and tells every node at once rather
        // than at their next pings.
        bump_epoch(&mut st);
        st.broadcast_pong = true;
    }
    st.assign(slot, n);
    // As in Redis 7, a master that gave its last slot away becomes a replica of the node
    // that took it (with cluster-allow-replica-migration).
    let mut follow = None;
    if was_mine
        && n != me
        && st.i_am_master()
        && st.me().numslots == 0
        && st.allow_replica_migration
    {
        let (ip, port) = (st.nodes[&n].ip.clone(), st.nodes[&n].port);
        let shard = st.nodes[&n].shard_id;
        let m = st.me_mut();
        m.flags = (m.flags & !flags::MASTER) | flags::REPLICA;
        m.master = Some(n);
        m.shard_id = shard;
        st.migrating_to.clear();
        st.importing_from.clear();
        follow = Some((ip, port));
    }
    (c.commit(&mut st, true), follow)
}

async fn replicate(sess: &mut Session, c: &Cluster, args: &[Bytes]) {
    let shared = sess.worker.shared.clone();
    let (master, host, port) = {
        let st = c.lock();
        let Some(name) = parse_name(&args[2]).filter(|n| st.nodes.contains_key(n)) else {
            drop(st);
            return sess.error(&format!(
                "ERR Unknown node {}",
                String::from_utf8_lossy(&args[2])
            ));
        };
        if name == st.myself {
            drop(st);
            return sess.error("ERR Can't replicate myself");
        }
        let m = &st.nodes[&name];
        if m.has(flags::REPLICA) {
            drop(st);
            return sess.error("ERR I can only replicate a master, not a replica.");
        }
        if st.i_am_master() && st.me().numslots > 0 {
            drop(st);
            return sess
                .error("ERR To set a master the node must be empty and without assigned slots.");
        }
        (name, m.ip.clone(), m.port)
    };
    let keys = crate::shard::broadcast(&sess.worker, |w| w.shard.borrow().keys_in(0))
        .await
        .iter()
        .sum::<usize>();
    if c.lock().i_am_master() && keys > 0 {
        return sess
            .error("ERR To set a master the node must be empty and without assigned slots.");
    }
    let r = {
        let mut st = c.lock();
        let me = st.me_mut();
        me.flags = (me.flags & !flags::MASTER) | flags::REPLICA;
        me.master = Some(master);
        let shard = st.nodes[&master].shard_id;
        st.me_mut().shard_id = shard;
        st.migrating_to.clear();
        st.importing_from.clear();
        c.commit(&mut st, true)
    };
    crate::repl::replica::follow(&shared, host, port).await;
    c.wake.notify_one();
    reply_saved(sess, r);
}

fn info_text(st: &State) -> String {
    let mut ok = 0;
    let mut pfail = 0;
    let mut fail = 0;
    let mut assigned = 0;
    for o in &st.owner {
        if let Some(n) = o.and_then(|n| st.nodes.get(&n)) {
            assigned += 1;
            if n.has(flags::FAIL) {
                fail += 1;
            } else if n.has(flags::PFAIL) {
                pfail += 1;
            } else {
                ok += 1;
            }
        }
    }
    let me = st.me();
    let my_epoch = me
        .master
        .filter(|_| me.has(flags::REPLICA))
        .and_then(|m| st.nodes.get(&m))
        .map_or(me.config_epoch, |m| m.config_epoch);
    let mut s = format!(
        "cluster_state:{}\r\ncluster_slots_assigned:{assigned}\r\ncluster_slots_ok:{ok}\r\ncluster_slots_pfail:{pfail}\r\ncluster_slots_fail:{fail}\r\ncluster_known_nodes:{}\r\ncluster_size:{}\r\ncluster_current_epoch:{}\r\ncluster_my_epoch:{my_epoch}\r\n",
        if st.ok { "ok" } else { "fail" },
        st.nodes.len(),
        st.size(),
        st.current_epoch,
    );
    for (counts, dir) in [(&st.sent, "sent"), (&st.received, "received")] {
        for (name, n) in MSG_NAMES.iter().zip(counts.iter()) {
            if *n > 0 {
                s.push_str(&format!("cluster_stats_messages_{name}_{dir}:{n}\r\n"));
            }
        }
        let total: u64 = counts.iter().sum();
        s.push_str(&format!("cluster_stats_messages_{dir}:{total}\r\n"));
    }
    s.push_str("total_cluster_links_buffer_limit_exceeded:0\r\n");
    s
}

/// The nodes serving a master's slots: the master, then its replicas.
fn node_entry(sess: &mut Session, n: &Node) {
    sess.out.array(4);
    sess.out.bulk(n.ip.as_bytes());
    sess.out.int(n.port as i64);
    sess.out.bulk(&n.name);
    if n.hostname.is_empty() {
        sess.out.map(0);
    } else {
        sess.out.map(1);
        sess.out.bulk(b"hostname");
        sess.out.bulk(n.hostname.as_bytes());
    }
}

fn slots_reply(sess: &mut Session, c: &Cluster) {
    let st = c.lock();
    let mut masters: Vec<&Node> = st
        .nodes
        .values()
        .filter(|n| n.is_master() && n.numslots > 0)
        .collect();
    masters.sort_by_key(|n| n.ranges().first().map(|r| r.0));
    let mut entries: Vec<(usize, usize, &Node)> = Vec::new();
    for m in masters {
        for (a, b) in m.ranges() {
            entries.push((a, b, m));
        }
    }
    entries.sort_by_key(|e| e.0);
    sess.out.array(entries.len());
    for (a, b, m) in entries {
        let my_offset = sess
            .worker
            .shared
            .repl
            .offset
            .load(std::sync::atomic::Ordering::Relaxed);
        // Redis lists only replicas that are not failing and have replicated something.
        let replicas: Vec<&Node> = st
            .replicas_of(&m.name)
            .into_iter()
            .filter(|r| {
                let offset = if r.has(flags::MYSELF) {
                    my_offset
                } else {
                    r.repl_offset
                };
                !r.failed() && offset != 0
            })
            .collect();
        sess.out.array(3 + replicas.len());
        sess.out.int(a as i64);
        sess.out.int(b as i64);
        node_entry(sess, m);
        for r in replicas {
            node_entry(sess, r);
        }
    }
}

fn shards_reply(sess: &mut Session, c: &Cluster) {
    let st = c.lock();
    let mut masters: Vec<&Node> = st.nodes.values().filter(|n| n.is_master()).collect();
    masters.sort_by_key(|n| (n.ranges().first().map_or(usize::MAX, |r| r.0), n.name));
    sess.out.array(masters.len());
    let now = crate::cluster::now_ms();
    let my_offset = sess
        .worker
        .shared
        .repl
        .offset
        .load(std::sync::atomic::Ordering::Relaxed);
    for m in masters {
        sess.out.map(2);
        sess.out.bulk(b"slots");
        let ranges = m.ranges();
        sess.out.array(ranges.len() * 2);
        for (a, b) in ranges {
            sess.out.int(a as i64);
            sess.out.int(b as i64);
        }
        sess.out.bulk(b"nodes");
        let mut members = vec![m];
        members.extend(st.replicas_of(&m.name));
        sess.out.array(members.len());
        for n in members {
            let hostname = !n.hostname.is_empty();
            let port = n.port != 0;
            sess.out.map(6 + usize::from(hostname) + usize::from(port));
            sess.out.bulk(b"id");
            sess.out.bulk(&n.name);
            if port {
                sess.out.bulk(b"port");
                sess.out.int(n.port as i64);
            }
            sess.out.bulk(b"ip");
            sess.out.bulk(n.ip.as_bytes());
            sess.out.bulk(b"endpoint");
            sess.out.bulk(n.ip.as_bytes());
            if hostname {
                sess.out.bulk(b"hostname");
                sess.out.bulk(n.hostname.as_bytes());
            }
            sess.out.bulk(b"role");
            sess.out
                .bulk(if n.is_master() { b"master" } else { b"replica" });
            sess.out.bulk(b"replication-offset");
            let offset = if n.has(flags::MYSELF) {
                my_offset
            } else {
                n.repl_offset
            };
            sess.out.int(offset as i64);
            sess.out.bulk(b"health");
            let health: &[u8] = if n.failed() {
                b"fail"
            } else if n.has(flags::REPLICA) && offset == 0 {
                b"loading"
            } else {
                b"online"
            };
            sess.out.bulk(health);
            let _ = now;
        }
    }
}

fn links_reply(sess: &mut Session, c: &Cluster) {
    let st = c.lock();
    let mut links: Vec<(&'static str, &Node)> = Vec::new();
    let mut names: Vec<&Name> = st.nodes.keys().filter(|n| **n != st.myself).collect();
    names.sort();
    for name in names {
        let n = &st.nodes[name];
        if n.link_up {
            links.push(("to", n));
        }
        if n.data_received > 0 && !n.has(flags::HANDSHAKE) {
            links.push(("from", n));
        }
    }
    sess.out.array(links.len());
    for (dir, n) in links {
        sess.out.map(6);
        sess.out.bulk(b"direction");
        sess.out.bulk(dir.as_bytes());
        sess.out.bulk(b"node");
        sess.out.bulk(name_str(&n.name).as_bytes());
        sess.out.bulk(b"create-time");
        sess.out.int(n.link_since as i64);
        sess.out.bulk(b"events");
        sess.out.bulk(if dir == "to" { b"rw" } else { b"r" });
        sess.out.bulk(b"send-buffer-allocated");
        sess.out.int(0);
        sess.out.bulk(b"send-buffer-used");
        sess.out.int(0);
    }
}
