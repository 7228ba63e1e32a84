//! The cluster bus: a thread of its own (`kite-cluster`) that listens on the bus port,
//! keeps one outbound link to every known node, answers pings, spreads gossip, detects
//! failures and applies what other nodes say about slots and epochs, as Redis's
//! `clusterCron` and `clusterProcessPacket` do.
//!
//! Every message is handled under the control-plane lock in one synchronous step that
//! returns what to do next (`Act`); sockets are written after the lock is released.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::state::{flags, name_str, Name, Node, State, MSG_TYPES};
use super::wire::{self, Body, Extensions, Gossip, Header, Message};
use super::{now_ms, Cluster, SLOTS};
use crate::shard::Shared;

/// How long a forgotten node is kept out of gossip (Redis's blacklist TTL).
pub const FORGET_TTL_MS: u64 = 60_000;
/// A master with slots comes back from FAIL only after this many node timeouts.
const FAIL_UNDO_MULT: u64 = 2;
/// Failure reports older than this many node timeouts no longer count.
const FAIL_REPORT_VALIDITY_MULT: u64 = 2;

/// What handling a message or a cron turn asks for once the lock is released.
pub(super) enum Act {
    /// Write on the link the message came from.
    Reply(Vec<u8>),
    /// Write on every connected outbound link.
    Broadcast(Vec<u8>),
    /// Close a link by id.
    Close(u64),
    /// Open an outbound link to this node.
    Connect(Name),
    /// Write on a node's outbound link (a ping).
    Send(Name, Vec<u8>),
    /// Replicate this master from now on.
    Follow(String, u16),
    /// Delete this node's keys in these slots (another node won them).
    DropSlots(Vec<usize>),
    /// Stop replicating: this replica won its election.
    Promote,
    /// Pause (Some(until)) or resume (None) client writes on every thread: a master's
    /// part of a manual failover.
    PauseWrites(Option<u64>),
}

struct Link {
    tx: mpsc::UnboundedSender<Vec<u8>>,
}

pub(super) struct Bus {
    pub(super) shared: Arc<Shared>,
    links: RefCell<HashMap<u64, Link>>,
    next_link: std::cell::Cell<u64>,
    rng: std::cell::Cell<u64>,
}

impl Bus {
    fn cluster(&self) -> &Cluster {
        self.shared.cluster.as_deref().expect("cluster mode")
    }

    fn new_link_id(&self) -> u64 {
        let id = self.next_link.get() + 1;
        self.next_link.set(id);
        id
    }

    pub(super) fn random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x
    }
}

/// Binds the bus port on every `bind` address and starts the bus thread.
pub fn start(shared: Arc<Shared>) -> Result<(), String> {
    let Some(c) = shared.cluster.as_deref() else {
        return Ok(());
    };
    let binds = shared
        .config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get("bind")
        .to_string();
    let mut listeners = Vec::new();
    for addr in binds.split_whitespace() {
        let addr = addr.trim_start_matches('-');
        let target = if addr.contains(':') {
            format!("[{addr}]:{}", c.cport)
        } else {
            format!("{addr}:{}", c.cport)
        };
        let l = std::net::TcpListener::bind(&target)
            .map_err(|e| format!("Could not bind the cluster bus on {target}: {e}"))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        listeners.push(l);
    }
    std::thread::Builder::new()
        .name("kite-cluster".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, run(shared, listeners));
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

async fn run(shared: Arc<Shared>, listeners: Vec<std::net::TcpListener>) {
    let seed = now_ms() ^ ((std::process::id() as u64) << 20) | 1;
    let bus = Rc::new(Bus {
        shared,
        links: RefCell::new(HashMap::new()),
        next_link: Default::default(),
        rng: std::cell::Cell::new(seed),
    });
    for l in listeners {
        let Ok(l) = TcpListener::from_std(l) else {
            continue;
        };
        tokio::task::spawn_local(accept_loop(bus.clone(), l));
    }
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut iteration = 0u64;
    let mut published = bus
        .cluster()
        .publish_rx
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .expect("the bus starts once");
    loop {
        let cron_turn = tokio::select! {
            _ = tick.tick() => true,
            _ = bus.cluster().wake.notified() => false,
            Some(p) = published.recv() => {
                let acts = publish_acts(&bus, p);
                perform(&bus, None, acts).await;
                continue;
            }
        };
        let acts = {
            let c = bus.cluster();
            let mut st = c.lock();
            let config = bus.shared.config.lock().unwrap_or_else(|p| p.into_inner());
            c.apply_settings(&mut st, &config);
            drop(config);
            let mut acts = take_meets(&mut st);
            if cron_turn {
                iteration += 1;
                acts.extend(cron(&bus, &mut st, iteration));
            } else {
                acts.extend(connect_missing(&mut st));
            }
            if std::mem::take(&mut st.manual_start) {
                if let Some(m) = st.me().master {
                    st.sent[wire::MFSTART as usize] += 1;
                    let hd = header(&bus.shared, &st, wire::MFSTART);
                    acts.push(Act::Send(m, wire::encode_bare(&hd, wire::MFSTART)));
                }
            }
            acts.extend(super::failover::election(&bus, &mut st));
            if std::mem::take(&mut st.broadcast_pong) {
                st.sent[wire::PONG as usize] += 1;
                acts.push(Act::Broadcast(build_ping(
                    &bus.shared,
                    &mut st,
                    wire::PONG,
                    bus.random(),
                )));
            }
            let save = st.save_pending;
            if let Err(e) = c.commit(&mut st, save) {
                tracing::warn!("{e}");
            }
            acts
        };
        perform(&bus, None, acts).await;
    }
}

async fn accept_loop(bus: Rc<Bus>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                let id = bus.new_link_id();
                tokio::task::spawn_local(serve_link(bus.clone(), id, stream, None, None));
            }
            Err(e) => {
                tracing::warn!("Error accepting cluster node: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Runs one link: its writer, and its reader handling each message whole. `outbound`
/// names the node this side connected to; inbound links name none.
async fn serve_link(
    bus: Rc<Bus>,
    id: u64,
    stream: TcpStream,
    outbound: Option<Name>,
    first: Option<Vec<u8>>,
) {
    let local_ip = stream.local_addr().ok().map(|a| ip_of(&a));
    let peer_ip = stream.peer_addr().ok().map(|a| ip_of(&a));
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    if let Some(m) = first {
        let _ = tx.send(m);
    }
    bus.links.borrow_mut().insert(id, Link { tx });
    tokio::task::spawn_local(async move {
        while let Some(buf) = rx.recv().await {
            if wr.write_all(&buf).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let mut outbound = outbound;
    let mut buf = Vec::new();
    loop {
        let mut first8 = [0u8; 8];
        if rd.read_exact(&mut first8).await.is_err() {
            break;
        }
        let Some(len) = wire::frame_len(&first8) else {
            tracing::warn!("Closing a cluster link: not a cluster bus message");
            break;
        };
        buf.clear();
        buf.extend_from_slice(&first8);
        buf.resize(len, 0);
        if rd.read_exact(&mut buf[8..]).await.is_err() {
            break;
        }
        let msg = match wire::decode(&buf) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("Dropping a cluster bus message: {e}");
                continue;
            }
        };
        if !bus.links.borrow().contains_key(&id) {
            break;
        }
        let ctx = LinkCtx {
            id,
            outbound,
            local_ip: local_ip.clone(),
            peer_ip: peer_ip.clone(),
        };
        let (acts, renamed) = {
            let c = bus.cluster();
            let mut st = c.lock();
            let (acts, renamed) = process(&bus.shared, &mut st, &ctx, msg);
            let save = st.save_pending;
            if let Err(e) = c.commit(&mut st, save) {
                tracing::warn!("{e}");
            }
            (acts, renamed)
        };
        if let Some(n) = renamed {
            outbound = Some(n);
        }
        let closing = acts.iter().any(|a| matches!(a, Act::Close(l) if *l == id));
        perform(&bus, Some(id), acts).await;
        if closing {
            break;
        }
    }
    bus.links.borrow_mut().remove(&id);
    if let Some(name) = outbound {
        let c = bus.cluster();
        let mut st = c.lock();
        if let Some(n) = st.nodes.get_mut(&name) {
            if n.link == id {
                n.link = 0;
                n.link_up = false;
            }
        }
    }
}

fn ip_of(a: &SocketAddr) -> String {
    match a {
        SocketAddr::V4(v) => v.ip().to_string(),
        SocketAddr::V6(v) => match v.ip().to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v.ip().to_string(),
        },
    }
}

async fn perform(bus: &Rc<Bus>, link: Option<u64>, acts: Vec<Act>) {
    for a in acts {
        match a {
            Act::Reply(m) => {
                if let Some(l) =
                    link.and_then(|id| bus.links.borrow().get(&id).map(|l| l.tx.clone()))
                {
                    let _ = l.send(m);
                }
            }
            Act::Broadcast(m) => {
                let ids: Vec<u64> = {
                    let st = bus.cluster().lock();
                    st.nodes
                        .values()
                        .filter(|n| n.link_up && !n.has(flags::HANDSHAKE))
                        .map(|n| n.link)
                        .collect()
                };
                let links = bus.links.borrow();
                for id in ids {
                    if let Some(l) = links.get(&id) {
                        let _ = l.tx.send(m.clone());
                    }
                }
            }
            Act::Send(name, m) => {
                let id = bus.cluster().lock().nodes.get(&name).map_or(0, |n| n.link);
                if let Some(l) = bus.links.borrow().get(&id) {
                    let _ = l.tx.send(m);
                }
            }
            Act::Close(id) => {
                bus.links.borrow_mut().remove(&id);
            }
            Act::Connect(name) => {
                let target = {
                    let mut st = bus.cluster().lock();
                    let timeout = st.node_timeout;
                    match st.nodes.get_mut(&name) {
                        Some(n) if n.link == 0 => {
                            let id = bus.new_link_id();
                            n.link = id;
                            Some((id, n.ip.clone(), n.cport, timeout))
                        }
                        _ => None,
                    }
                };
                if let Some((id, ip, cport, timeout)) = target {
                    tokio::task::spawn_local(connect(bus.clone(), id, name, ip, cport, timeout));
                }
            }
            Act::Follow(host, port) => {
                crate::repl::replica::follow(&bus.shared, host, port).await;
            }
            Act::DropSlots(slots) => drop_slots(&bus.shared, slots),
            Act::Promote => crate::repl::replica::promote(&bus.shared).await,
            Act::PauseWrites(until) => super::failover::pause_writes(&bus.shared, until),
        }
    }
}

async fn connect(bus: Rc<Bus>, id: u64, name: Name, ip: String, cport: u16, timeout: u64) {
    let started = now_ms();
    let conn = tokio::time::timeout(
        Duration::from_millis(timeout.max(100)),
        TcpStream::connect((ip.as_str(), cport)),
    )
    .await;
    let stream = match conn {
        Ok(Ok(s)) => s,
        _ => {
            let mut st = bus.cluster().lock();
            if let Some(n) = st.nodes.get_mut(&name) {
                if n.link == id {
                    n.link = 0;
                    n.link_up = false;
                }
                // A node that cannot be reached counts as one that was pinged and did
                // not answer: without this a node that died between pings would never
                // be suspected (Redis does the same when its connect fails).
                if n.ping_sent == 0 {
                    n.ping_sent = started;
                }
            }
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let first = {
        let c = bus.cluster();
        let mut st = c.lock();
        let now = now_ms();
        let Some(n) = st.nodes.get_mut(&name) else {
            return;
        };
        if n.link != id {
            return;
        }
        n.link_up = true;
        n.link_since = now;
        let typ = if n.has(flags::MEET) {
            n.flags &= !flags::MEET;
            wire::MEET
        } else {
            wire::PING
        };
        if n.ping_sent == 0 {
            n.ping_sent = now;
        }
        st.sent[typ as usize] += 1;
        build_ping(&bus.shared, &mut st, typ, bus.random())
    };
    serve_link(bus, id, stream, Some(name), Some(first)).await;
}

/// CLUSTER MEET's requests: a node in handshake for each, which the cron connects to.
fn take_meets(st: &mut State) -> Vec<Act> {
    let meets = std::mem::take(&mut st.meets);
    let mut acts = Vec::new();
    for (ip, port, cport) in meets {
        if let Some(name) = start_handshake(st, &ip, port, cport) {
            acts.push(Act::Connect(name));
        }
    }
    acts
}

/// A new node known only by its address: a random name until its first PONG.
fn start_handshake(st: &mut State, ip: &str, port: u16, cport: u16) -> Option<Name> {
    let ip = match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => v6
            .to_ipv4_mapped()
            .map_or_else(|| v6.to_string(), |v4| v4.to_string()),
        Ok(a) => a.to_string(),
        Err(_) => return None,
    };
    let busy = st.nodes.values().any(|n| {
        n.has(flags::HANDSHAKE)
            && n.ip.eq_ignore_ascii_case(&ip)
            && n.port == port
            && n.cport == cport
    });
    if busy {
        return None;
    }
    let mut n = Node::new(super::state::random_name(), flags::HANDSHAKE | flags::MEET);
    n.ip = ip;
    n.port = port;
    n.cport = cport;
    let name = n.name;
    st.nodes.insert(name, n);
    Some(name)
}

fn connect_missing(st: &mut State) -> Vec<Act> {
    st.nodes
        .values()
        .filter(|n| !n.has(flags::MYSELF | flags::NOADDR) && n.link == 0)
        .map(|n| Act::Connect(n.name))
        .collect()
}

/// Redis's clusterCron, run every 100 ms.
fn cron(bus: &Bus, st: &mut State, iteration: u64) -> Vec<Act> {
    let now = now_ms();
    let timeout = st.node_timeout;
    let handshake_timeout = timeout.max(1000);
    let mut acts = Vec::new();
    st.forgotten.retain(|_, until| *until > now);
    // Handshakes that never completed are given up.
    let stale: Vec<Name> = st
        .nodes
        .values()
        .filter(|n| n.has(flags::HANDSHAKE) && now.saturating_sub(n.created) > handshake_timeout)
        .map(|n| n.name)
        .collect();
    for name in stale {
        if let Some(n) = st.nodes.get(&name) {
            if n.link != 0 {
                acts.push(Act::Close(n.link));
            }
        }
        st.remove_node(&name);
    }
    acts.extend(connect_missing(st));
    // A master paused for a manual failover pings that replica every turn, so it
    // learns the final offset at once; the pause lapses on its own.
    if let Some(r) = st.manual.replica {
        if now >= st.manual.until {
            st.manual = Default::default();
        } else if st.nodes.get(&r).is_some_and(|n| n.link_up) {
            acts.push(ping(&bus.shared, st, r, bus.random()));
        }
    }
    // Once a second, ping the node heard from longest ago among five picked at random.
    if iteration.is_multiple_of(10) {
        let candidates: Vec<Name> = st
            .nodes
            .values()
            .filter(|n| n.link_up && n.ping_sent == 0 && !n.has(flags::MYSELF | flags::HANDSHAKE))
            .map(|n| n.name)
            .collect();
        let mut best: Option<(u64, Name)> = None;
        for _ in 0..5.min(candidates.len()) {
            let pick = candidates[(bus.random() % candidates.len() as u64) as usize];
            let pong = st.nodes[&pick].pong_received;
            if best.is_none_or(|(p, _)| pong < p) {
                best = Some((pong, pick));
            }
        }
        if let Some((_, name)) = best {
            acts.push(ping(&bus.shared, st, name, bus.random()));
        }
    }
    let names: Vec<Name> = st.nodes.keys().copied().collect();
    let mut changed = false;
    for name in names {
        let n = &st.nodes[&name];
        if n.has(flags::MYSELF | flags::NOADDR | flags::HANDSHAKE) {
            continue;
        }
        // A link that answers nothing for half the timeout is dropped and made again:
        // the node may be fine and the connection lost.
        if n.link_up
            && now.saturating_sub(n.link_since) > timeout
            && n.ping_sent != 0
            && now.saturating_sub(n.ping_sent) > timeout / 2
            && now.saturating_sub(n.data_received) > timeout / 2
        {
            acts.push(Act::Close(n.link));
            let n = st.nodes.get_mut(&name).expect("known");
            n.link = 0;
            n.link_up = false;
            continue;
        }
        if n.link_up && n.ping_sent == 0 && now.saturating_sub(n.pong_received) > timeout / 2 {
            acts.push(ping(&bus.shared, st, name, bus.random()));
            continue;
        }
        let n = &st.nodes[&name];
        if n.ping_sent != 0 {
            let delay = now.saturating_sub(n.ping_sent);
            let data_delay = now.saturating_sub(n.data_received);
            if delay.min(data_delay) > timeout && !n.has(flags::PFAIL | flags::FAIL) {
                tracing::info!("*** NODE {} possibly failing", name_str(&name));
                st.nodes.get_mut(&name).expect("known").flags |= flags::PFAIL;
                changed = true;
            }
        }
    }
    if changed {
        st.update_health();
    }
    acts
}

fn ping(shared: &Shared, st: &mut State, name: Name, seed: u64) -> Act {
    let now = now_ms();
    if let Some(n) = st.nodes.get_mut(&name) {
        if n.ping_sent == 0 {
            n.ping_sent = now;
        }
    }
    st.sent[wire::PING as usize] += 1;
    Act::Send(name, build_ping(shared, st, wire::PING, seed))
}

/// This node's header, as every message carries it.
pub(super) fn header(shared: &Shared, st: &State, typ: u16) -> Header {
    let me = st.me();
    let master = me
        .master
        .filter(|_| me.has(flags::REPLICA))
        .and_then(|m| st.nodes.get(&m));
    let (slots, config_epoch) = match master {
        Some(m) => (m.slots.clone(), m.config_epoch),
        None => (me.slots.clone(), me.config_epoch),
    };
    let announced = shared
        .config
        .try_lock()
        .map(|c| c.get("cluster-announce-ip").to_string())
        .unwrap_or_default();
    Header {
        typ,
        count: 0,
        port: me.port,
        current_epoch: st.current_epoch,
        config_epoch,
        offset: shared
            .repl
            .offset
            .load(std::sync::atomic::Ordering::Relaxed),
        sender: me.name,
        slots,
        slaveof: master.map_or([0; 40], |m| m.name),
        myip: announced,
        extensions: 0,
        pport: me.pport,
        cport: me.cport,
        flags: me.flags,
        state: if st.ok { 0 } else { 1 },
        mflags: [
            wire::FLAG0_EXT_DATA
                | if st.manual.replica.is_some() && me.is_master() {
                    wire::FLAG0_PAUSED
                } else {
                    0
                },
            0,
            0,
        ],
    }
}

/// A PING, PONG or MEET with gossip about a tenth of the nodes (at least three) and
/// every node this one thinks may be failing, as Redis's clusterSendPing chooses.
fn build_ping(shared: &Shared, st: &mut State, typ: u16, mut seed: u64) -> Vec<u8> {
    let h = header(shared, st, typ);
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let fresh = st.nodes.len().saturating_sub(2);
    let wanted = (st.nodes.len() / 10).max(3).min(fresh);
    let all: Vec<&Node> = st.nodes.values().collect();
    let mut chosen: Vec<Name> = Vec::new();
    let mut tries = wanted * 3;
    while chosen.len() < wanted && tries > 0 && !all.is_empty() {
        tries -= 1;
        let n = all[(rand() % all.len() as u64) as usize];
        if n.has(flags::MYSELF | flags::PFAIL | flags::HANDSHAKE | flags::NOADDR)
            || (n.link == 0 && n.numslots == 0)
            || chosen.contains(&n.name)
        {
            continue;
        }
        chosen.push(n.name);
    }
    for n in &all {
        if n.has(flags::PFAIL)
            && !n.has(flags::HANDSHAKE | flags::NOADDR)
            && !chosen.contains(&n.name)
        {
            chosen.push(n.name);
        }
    }
    let gossip: Vec<Gossip> = chosen
        .iter()
        .map(|name| {
            let n = &st.nodes[name];
            Gossip {
                name: n.name,
                ping_sent: (n.ping_sent / 1000) as u32,
                pong_received: (n.pong_received / 1000) as u32,
                ip: n.ip.clone(),
                port: n.port,
                cport: n.cport,
                flags: n.flags,
                pport: n.pport,
            }
        })
        .collect();
    let me = st.me();
    let ext = Extensions {
        hostname: (!me.hostname.is_empty()).then(|| me.hostname.clone()),
        human_name: (!me.human_name.is_empty()).then(|| me.human_name.clone()),
        shard_id: None,
        // Redis 7.2 also sends forgotten nodes and the shard id; 7.0 logs a warning for
        // every extension it does not know, on every ping, so Kite leaves them out.
        forgotten: Vec::new(),
    };
    wire::encode_ping(&h, &gossip, &ext)
}

struct LinkCtx {
    id: u64,
    outbound: Option<Name>,
    local_ip: Option<String>,
    peer_ip: Option<String>,
}

fn count_received(st: &mut State, typ: u16) {
    if (typ as usize) < MSG_TYPES {
        st.received[typ as usize] += 1;
    }
}

/// Redis's clusterProcessPacket for one message. Returns what to do, and the new name of
/// the node this outbound link leads to when its handshake completed.
fn process(
    shared: &Shared,
    st: &mut State,
    link: &LinkCtx,
    m: Message,
) -> (Vec<Act>, Option<Name>) {
    let now = now_ms();
    let h = &m.header;
    let typ = h.typ;
    count_received(st, typ);
    let mut acts = Vec::new();
    let mut renamed = None;
    // A message in this node's own name (a link back to itself, or a forgery) says
    // nothing about the cluster.
    if h.sender == st.myself {
        return (acts, None);
    }
    let sender_known = st
        .nodes
        .get(&h.sender)
        .is_some_and(|n| !n.has(flags::HANDSHAKE));
    if sender_known {
        let s = st.nodes.get_mut(&h.sender).expect("known");
        s.data_received = now;
        if h.slaveof == [0; 40] && h.config_epoch > s.config_epoch {
            s.config_epoch = h.config_epoch;
            st.save_pending = true;
        }
        st.nodes.get_mut(&h.sender).expect("known").repl_offset = h.offset;
        if h.current_epoch > st.current_epoch {
            st.current_epoch = h.current_epoch;
            st.save_pending = true;
        }
    }
    let is_ping = matches!(typ, wire::PING | wire::PONG | wire::MEET);
    if typ == wire::PING || typ == wire::MEET {
        // Learn this node's own address from the link a MEET (or the first ping) came
        // in on, unless it is announced.
        let announced = shared
            .config
            .try_lock()
            .map(|c| !c.get("cluster-announce-ip").is_empty())
            .unwrap_or(true);
        if !announced && (typ == wire::MEET || st.me().ip.is_empty()) {
            if let Some(ip) = &link.local_ip {
                if &st.me().ip != ip {
                    st.me_mut().ip = ip.clone();
                    st.save_pending = true;
                }
            }
        }
        if !sender_known && typ == wire::MEET {
            let ip = if h.myip.is_empty() {
                link.peer_ip.clone().unwrap_or_default()
            } else {
                h.myip.clone()
            };
            let mut n = Node::new(super::state::random_name(), flags::HANDSHAKE);
            n.ip = ip;
            n.port = h.port;
            n.pport = h.pport;
            n.cport = h.cport;
            let name = n.name;
            st.nodes.insert(name, n);
            acts.push(Act::Connect(name));
            st.save_pending = true;
            // A MEET's gossip introduces the rest of the sender's cluster.
            if let Body::Gossip(g) = &m.body {
                acts.extend(gossip_section(st, None, g));
            }
        }
        st.sent[wire::PONG as usize] += 1;
        acts.push(Act::Reply(build_ping(
            shared,
            st,
            wire::PONG,
            now ^ 0x9e37_79b9,
        )));
    }
    if is_ping {
        if let Some(to) = link.outbound {
            let handshake = st.nodes.get(&to).is_some_and(|n| n.has(flags::HANDSHAKE));
            if handshake {
                if sender_known {
                    // Already known under its real name: this handshake was a duplicate.
                    update_address(st, &h.sender, &to);
                    st.remove_node(&to);
                    acts.push(Act::Close(link.id));
                    return (acts, None);
                }
                // The handshake completes: the node takes its real name.
                let Some(mut n) = st.nodes.remove(&to) else {
                    return (acts, None);
                };
                n.name = h.sender;
                n.shard_id = h.sender;
                n.flags &= !(flags::HANDSHAKE | flags::MEET);
                n.flags |= h.flags & (flags::MASTER | flags::REPLICA);
                n.data_received = now;
                st.nodes.insert(h.sender, n);
                renamed = Some(h.sender);
                st.save_pending = true;
                tracing::info!("Handshake with node {} completed.", name_str(&h.sender));
            } else if to != h.sender {
                // Another node now answers at that address: forget the address.
                if let Some(n) = st.nodes.get_mut(&to) {
                    n.flags |= flags::NOADDR;
                    n.ip.clear();
                    n.port = 0;
                    n.cport = 0;
                    n.link = 0;
                    n.link_up = false;
                }
                acts.push(Act::Close(link.id));
                st.save_pending = true;
                return (acts, None);
            }
        }
    }
    let sender_known = st
        .nodes
        .get(&h.sender)
        .is_some_and(|n| !n.has(flags::HANDSHAKE));
    // (After a handshake the link leads to the renamed node: its first PONG counts.)
    if is_ping && typ == wire::PONG && renamed.or(link.outbound) == Some(h.sender) {
        let n = st.nodes.get_mut(&h.sender).expect("known");
        n.pong_received = now;
        n.ping_sent = 0;
        if n.has(flags::PFAIL) {
            n.flags &= !flags::PFAIL;
        } else if n.has(flags::FAIL) {
            clear_failure_if_needed(st, &h.sender, now);
        }
    }
    if !sender_known {
        return (acts, renamed);
    }
    let sender = h.sender;
    if is_ping {
        if let Some(ext_host) = &m.ext.hostname {
            st.nodes.get_mut(&sender).expect("known").hostname = ext_host.clone();
        }
        if let Some(hn) = &m.ext.human_name {
            st.nodes.get_mut(&sender).expect("known").human_name = hn.clone();
        }
        if let Some(id) = m.ext.shard_id {
            st.nodes.get_mut(&sender).expect("known").shard_id = id;
        }
        for (name, ttl) in &m.ext.forgotten {
            if *name != st.myself
                && *name != sender
                && st.nodes.contains_key(name)
                && st.me().master != Some(*name)
            {
                st.remove_node(name);
                st.forgotten.insert(*name, now + ttl * 1000);
                st.save_pending = true;
            }
        }
        // Its role.
        if h.slaveof == [0; 40] {
            let n = st.nodes.get_mut(&sender).expect("known");
            if n.has(flags::REPLICA) || !n.is_master() {
                n.flags = (n.flags & !flags::REPLICA) | flags::MASTER;
                n.master = None;
                st.save_pending = true;
            }
        } else {
            let was_master = st.nodes[&sender].is_master();
            if was_master {
                for slot in 0..SLOTS {
                    if st.owner[slot] == Some(sender) {
                        st.unassign(slot);
                    }
                }
                st.migrating_to.retain(|_, n| *n != sender);
                st.importing_from.retain(|_, n| *n != sender);
            }
            let known_master = st.nodes.contains_key(&h.slaveof);
            let n = st.nodes.get_mut(&sender).expect("known");
            if was_master || n.master != Some(h.slaveof) {
                n.flags = (n.flags & !flags::MASTER) | flags::REPLICA;
                if known_master {
                    n.master = Some(h.slaveof);
                    let shard = st.nodes[&h.slaveof].shard_id;
                    st.nodes.get_mut(&sender).expect("known").shard_id = shard;
                }
                st.save_pending = true;
            }
        }
        // Its slots, when it is a master and claims something new.
        if h.slaveof == [0; 40] {
            let dirty = st.nodes[&sender].slots[..] != h.slots[..];
            if dirty {
                acts.extend(update_slots_with(st, sender, h.config_epoch, &h.slots));
                // Slots it claims that a node with a newer configuration serves: tell it.
                for slot in 0..SLOTS {
                    if h.slots[slot / 8] & (1 << (slot % 8)) == 0 {
                        continue;
                    }
                    let Some(owner) = st.owner[slot] else {
                        continue;
                    };
                    if owner == sender {
                        continue;
                    }
                    let o = &st.nodes[&owner];
                    if o.config_epoch > h.config_epoch {
                        let hd = header(shared, st, wire::UPDATE);
                        let o = &st.nodes[&owner];
                        let msg = wire::encode_update(&hd, o.config_epoch, &o.name, &o.slots);
                        st.sent[wire::UPDATE as usize] += 1;
                        acts.push(Act::Reply(msg));
                        break;
                    }
                }
            }
            // Two masters with one config epoch: the one with the smaller name moves on.
            let me = st.me();
            if me.is_master() && me.config_epoch == h.config_epoch && sender < st.myself {
                // (Redis: act only when the sender's name is the smaller.)
            } else if me.is_master()
                && me.config_epoch == h.config_epoch
                && st.nodes[&sender].is_master()
                && sender > st.myself
            {
                st.current_epoch += 1;
                let e = st.current_epoch;
                st.me_mut().config_epoch = e;
                st.save_pending = true;
                tracing::warn!(
                    "WARNING: configEpoch collision with node {}. configEpoch set to {e}",
                    name_str(&sender)
                );
            }
        }
        if let Body::Gossip(g) = &m.body {
            acts.extend(gossip_section(st, Some(sender), g));
        }
    }
    // A replica in a manual failover learns the offset its paused master stopped at.
    if is_ping
        && h.mflags[0] & wire::FLAG0_PAUSED != 0
        && st.me().master == Some(sender)
        && st.election.wait_for_master
    {
        st.election.master_offset = Some(h.offset);
        if let Some(c) = shared.cluster.as_deref() {
            c.wake.notify_one();
        }
    }
    match typ {
        wire::AUTH_REQUEST => acts.extend(super::failover::vote_if_needed(shared, st, h)),
        wire::MFSTART => {
            // One of this master's replicas starts a manual failover: writes stop here
            // so it can catch up exactly (twice the replica's 5 s to finish).
            let mine = st.nodes[&sender].master == Some(st.myself) && st.i_am_master();
            if mine {
                let until = now + 10_000;
                st.manual.replica = Some(sender);
                st.manual.until = until;
                tracing::info!(
                    "Manual failover requested by replica {}.",
                    name_str(&sender)
                );
                acts.push(Act::PauseWrites(Some(until)));
                acts.push(ping(shared, st, sender, now | 1));
            }
        }
        wire::AUTH_ACK => {
            // A vote counts from a master serving slots, for this election's epoch.
            let voter_ok = st.nodes[&sender].is_master() && st.nodes[&sender].numslots > 0;
            if voter_ok && st.election.sent && h.current_epoch >= st.election.epoch {
                st.election.votes += 1;
                tracing::info!(
                    "Failover auth granted to me by {} ({} votes)",
                    name_str(&sender),
                    st.election.votes
                );
                if let Some(c) = shared.cluster.as_deref() {
                    c.wake.notify_one();
                }
            }
        }
        _ => {}
    }
    match &m.body {
        Body::Fail(about) if typ == wire::FAIL => {
            if let Some(n) = st.nodes.get_mut(about) {
                if !n.has(flags::FAIL | flags::MYSELF) {
                    tracing::info!(
                        "FAIL message received from {} about {}",
                        name_str(&sender),
                        name_str(about)
                    );
                    n.flags = (n.flags | flags::FAIL) & !flags::PFAIL;
                    n.fail_time = now;
                    st.save_pending = true;
                }
            }
        }
        Body::Publish { channel, message } => {
            crate::pubsub::deliver_from_bus(
                shared,
                bytes::Bytes::copy_from_slice(channel),
                bytes::Bytes::copy_from_slice(message),
                typ == wire::PUBLISHSHARD,
            );
        }
        Body::Update {
            config_epoch,
            name,
            slots,
        } if typ == wire::UPDATE => {
            let epoch = *config_epoch;
            if let Some(n) = st.nodes.get_mut(name) {
                if n.config_epoch < epoch {
                    n.config_epoch = epoch;
                    if n.has(flags::REPLICA) {
                        n.flags = (n.flags & !flags::REPLICA) | flags::MASTER;
                        n.master = None;
                    }
                    let name = *name;
                    acts.extend(update_slots_with(st, name, epoch, slots));
                    st.save_pending = true;
                }
            }
        }
        _ => {}
    }
    (acts, renamed)
}

/// When a known node turns out to answer at a new address.
fn update_address(st: &mut State, real: &Name, handshake: &Name) {
    let Some(h) = st.nodes.get(handshake) else {
        return;
    };
    let (ip, port, cport) = (h.ip.clone(), h.port, h.cport);
    if let Some(n) = st.nodes.get_mut(real) {
        if n.ip != ip || n.port != port || n.cport != cport {
            n.ip = ip;
            n.port = port;
            n.cport = cport;
            n.flags &= !flags::NOADDR;
            st.save_pending = true;
        }
    }
}

/// Redis's clusterUpdateSlotsConfigWith: `sender` claims `slots` at `epoch`; it takes
/// each slot whose owner has an older configuration (or none).
fn update_slots_with(
    st: &mut State,
    sender: Name,
    epoch: u64,
    slots: &[u8; SLOTS / 8],
) -> Vec<Act> {
    let mut acts = Vec::new();
    if sender == st.myself {
        return acts;
    }
    let me = st.myself;
    let my_master = st.me().master.filter(|_| st.me().has(flags::REPLICA));
    let cur_primary = my_master.unwrap_or(me);
    let mut lost_to = false;
    let mut moved_from_primary = 0;
    let mut dirty = Vec::new();
    for slot in 0..SLOTS {
        if slots[slot / 8] & (1 << (slot % 8)) == 0 {
            continue;
        }
        let owner = st.owner[slot];
        if owner == Some(sender) || st.importing_from.contains_key(&slot) {
            continue;
        }
        let older = match owner.and_then(|o| st.nodes.get(&o)) {
            None => true,
            Some(o) => o.config_epoch < epoch,
        };
        if !older {
            continue;
        }
        if owner == Some(me) {
            dirty.push(slot);
        }
        if owner == Some(cur_primary) {
            lost_to = true;
            moved_from_primary += 1;
        }
        st.migrating_to.remove(&slot);
        st.assign(slot, sender);
        st.save_pending = true;
    }
    let primary_empty = st.nodes.get(&cur_primary).is_none_or(|n| n.numslots == 0);
    // A failover (the sender took exactly what we served) always moves us along; a
    // reshard that emptied our shard only with cluster-allow-replica-migration.
    let failover = st.nodes[&sender].numslots == moved_from_primary;
    if lost_to && primary_empty && (st.allow_replica_migration || failover) {
        // This node's (or its master's) last slots went to `sender`: a failover or a
        // reshard emptied it, and it follows the new owner, as Redis's replicas do.
        let (ip, port) = {
            let n = &st.nodes[&sender];
            (n.ip.clone(), n.port)
        };
        tracing::info!(
            "Configuration change detected. Reconfiguring myself as a replica of {}",
            name_str(&sender)
        );
        let m = st.me_mut();
        m.flags = (m.flags & !flags::MASTER) | flags::REPLICA;
        m.master = Some(sender);
        st.migrating_to.clear();
        st.importing_from.clear();
        st.save_pending = true;
        if st.manual.replica.take().is_some() {
            acts.push(Act::PauseWrites(None));
        }
        acts.push(Act::Follow(ip, port));
    } else if !dirty.is_empty() {
        acts.push(Act::DropSlots(dirty));
    }
    acts
}

/// Redis's clusterProcessGossipSection: failure reports, fresher pong times, and
/// handshakes with nodes not known yet. `sender` is None for a MEET's gossip.
fn gossip_section(st: &mut State, sender: Option<Name>, gossip: &[Gossip]) -> Vec<Act> {
    let now = now_ms();
    let mut acts = Vec::new();
    let sender_is_master = sender.is_some_and(|s| st.nodes.get(&s).is_some_and(|n| n.is_master()));
    for g in gossip {
        if st.nodes.contains_key(&g.name) {
            if g.name == st.myself {
                continue;
            }
            if let (Some(s), true) = (sender, sender_is_master) {
                let n = st.nodes.get_mut(&g.name).expect("known");
                if g.flags & (flags::FAIL | flags::PFAIL) != 0 {
                    n.fail_reports.insert(s, now);
                    if let Some(act) = mark_failing_if_needed(st, &g.name) {
                        acts.push(act);
                    }
                } else {
                    n.fail_reports.remove(&s);
                }
            }
            let n = st.nodes.get_mut(&g.name).expect("known");
            if g.flags & (flags::FAIL | flags::PFAIL) == 0
                && n.ping_sent == 0
                && n.fail_reports.is_empty()
            {
                let pong = g.pong_received as u64 * 1000;
                if pong <= now + 500 && pong > n.pong_received {
                    n.pong_received = pong;
                }
            }
            // A failed node with no link that others see at a new address moved there.
            if n.has(flags::FAIL | flags::PFAIL)
                && !n.link_up
                && g.flags & flags::NOADDR == 0
                && (n.ip != g.ip || n.port != g.port || n.cport != g.cport)
            {
                n.ip = g.ip.clone();
                n.port = g.port;
                n.cport = g.cport;
                n.flags &= !flags::NOADDR;
                if n.link != 0 {
                    acts.push(Act::Close(n.link));
                    n.link = 0;
                }
                st.save_pending = true;
            }
        } else if sender.is_some()
            && g.flags & flags::NOADDR == 0
            && !st.forgotten.contains_key(&g.name)
            && !g.ip.is_empty()
        {
            // Gossip from a known node is trusted with the name itself (a handshake
            // with the address alone could reach another cluster reusing it).
            let mut n = Node::new(g.name, g.flags & !(flags::MYSELF | flags::MEET));
            n.ip = g.ip.clone();
            n.port = g.port;
            n.pport = g.pport;
            n.cport = g.cport;
            st.nodes.insert(g.name, n);
            st.save_pending = true;
            acts.push(Act::Connect(g.name));
        }
    }
    acts
}

/// PFAIL becomes FAIL once a majority of the masters (this one included, if a master)
/// report the node within the validity window; then everyone is told.
fn mark_failing_if_needed(st: &mut State, name: &Name) -> Option<Act> {
    let now = now_ms();
    let validity = st.node_timeout * FAIL_REPORT_VALIDITY_MULT;
    let quorum = st.size() / 2 + 1;
    let me_master = st.i_am_master();
    let n = st.nodes.get_mut(name)?;
    n.fail_reports
        .retain(|_, t| now.saturating_sub(*t) <= validity);
    if !n.has(flags::PFAIL) || n.has(flags::FAIL) {
        return None;
    }
    let failures = n.fail_reports.len() + usize::from(me_master);
    if failures < quorum {
        return None;
    }
    tracing::info!(
        "Marking node {} as failing (quorum reached).",
        name_str(name)
    );
    n.flags = (n.flags | flags::FAIL) & !flags::PFAIL;
    n.fail_time = now;
    st.save_pending = true;
    st.update_health();
    None.or(Some(())).map(|_| {
        // The FAIL message is built here; the header needs no Shared for its fields
        // beyond what the state holds, so the offset is left at zero.
        let hd = Header {
            typ: wire::FAIL,
            count: 0,
            port: st.me().port,
            current_epoch: st.current_epoch,
            config_epoch: st.me().config_epoch,
            offset: 0,
            sender: st.myself,
            slots: st.me().slots.clone(),
            slaveof: st.me().master.unwrap_or([0; 40]),
            myip: String::new(),
            extensions: 0,
            pport: st.me().pport,
            cport: st.me().cport,
            flags: st.me().flags,
            state: if st.ok { 0 } else { 1 },
            mflags: [0; 3],
        };
        st.sent[wire::FAIL as usize] += 1;
        Act::Broadcast(wire::encode_fail(&hd, name))
    })
}

/// A FAIL is lifted when the node is heard from again: at once for a replica or a master
/// without slots, after a while for a master that still serves slots (its replicas
/// may be taking over).
fn clear_failure_if_needed(st: &mut State, name: &Name, now: u64) {
    let timeout = st.node_timeout;
    let Some(n) = st.nodes.get_mut(name) else {
        return;
    };
    if n.has(flags::REPLICA) || n.numslots == 0 {
        n.flags &= !flags::FAIL;
        st.save_pending = true;
        return;
    }
    if now.saturating_sub(n.fail_time) > timeout * FAIL_UNDO_MULT {
        n.flags &= !flags::FAIL;
        st.save_pending = true;
    }
}

/// Deletes this node's keys in slots another node now serves, on every shard, as
/// deletions the AOF and replicas see.
fn drop_slots(shared: &Arc<Shared>, slots: Vec<usize>) {
    let slots: Arc<std::collections::HashSet<usize>> = Arc::new(slots.into_iter().collect());
    for target in 0..shared.nshards() {
        let slots = slots.clone();
        shared.send(
            target,
            Box::new(move |w| {
                let mut sh = w.shard.borrow_mut();
                let keys: Vec<Vec<u8>> = sh.dbs[0]
                    .table
                    .iter()
                    .filter(|e| slots.contains(&crate::shard::placement::slot(&e.key)))
                    .map(|e| e.key.to_vec())
                    .collect();
                for k in keys {
                    if sh.dbs[0].table.remove(&k).is_some() {
                        sh.log_effect(0, &[b"DEL".as_slice(), &k]);
                        sh.modified(0, &k);
                        sh.blocking.mark_ready(0, &k);
                    }
                }
                drop(sh);
                crate::shard::after_command(w);
            }),
        );
    }
}

/// A message published here, for the nodes that should hear it: every node for PUBLISH,
/// the other nodes of this shard (master and replicas) for SPUBLISH.
fn publish_acts(bus: &Bus, (shard, channel, message): super::Published) -> Vec<Act> {
    let mut st = bus.cluster().lock();
    let typ = if shard {
        wire::PUBLISHSHARD
    } else {
        wire::PUBLISH
    };
    let hd = header(&bus.shared, &st, typ);
    let msg = wire::encode_publish(&hd, typ, &channel, &message);
    st.sent[typ as usize] += 1;
    if !shard {
        return vec![Act::Broadcast(msg)];
    }
    let my_shard = st.me().shard_id;
    st.nodes
        .values()
        .filter(|n| !n.has(flags::MYSELF | flags::HANDSHAKE) && n.shard_id == my_shard && n.link_up)
        .map(|n| Act::Send(n.name, msg.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ping_from(sender: Name, forgotten: Vec<(Name, u64)>) -> Message {
        let h = Header {
            typ: wire::PING,
            count: 0,
            port: 7001,
            current_epoch: 1,
            config_epoch: 1,
            offset: 0,
            sender,
            slots: Box::new([0; SLOTS / 8]),
            slaveof: [0; 40],
            myip: String::new(),
            extensions: 0,
            pport: 0,
            cport: 17001,
            flags: flags::MASTER,
            state: 0,
            mflags: [0; 3],
        };
        let ext = Extensions {
            forgotten,
            ..Default::default()
        };
        wire::decode(&wire::encode_ping(&h, &[], &ext)).expect("a valid ping")
    }

    fn link() -> LinkCtx {
        LinkCtx {
            id: 1,
            outbound: None,
            local_ip: Some("127.0.0.1".into()),
            peer_ip: Some("127.0.0.1".into()),
        }
    }

    /// A peer's ping that asks to forget the peer itself (or this node) must not remove
    /// a node the message is still being applied to.
    #[test]
    fn forgotten_extension_naming_its_sender_is_ignored() {
        let shared = Shared::for_tests(1);
        let me = [b'a'; 40];
        let peer = [b'b'; 40];
        let mut st = State::new(me);
        st.nodes.insert(peer, Node::new(peer, flags::MASTER));
        let (acts, _) = process(
            &shared,
            &mut st,
            &link(),
            ping_from(peer, vec![(peer, 60), (me, 60)]),
        );
        assert!(st.nodes.contains_key(&peer) && st.nodes.contains_key(&me));
        assert!(
            acts.iter().any(|a| matches!(a, Act::Reply(_))),
            "a ping is answered"
        );
    }

    /// A message in this node's own name changes nothing.
    #[test]
    fn message_in_own_name_is_ignored() {
        let shared = Shared::for_tests(1);
        let me = [b'a'; 40];
        let mut st = State::new(me);
        let mut m = ping_from(me, Vec::new());
        m.header.slaveof = [b'c'; 40];
        let (acts, _) = process(&shared, &mut st, &link(), m);
        assert!(acts.is_empty());
        assert!(st.me().is_master());
    }
}
