//! The control plane: the nodes this node knows, who serves each slot, the epochs, and
//! the cluster's health. Everything here is changed under `Cluster::state`'s lock, by
//! the bus thread and by CLUSTER commands; `publish` copies the slot map into the view
//! the data path reads.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::view::{self, SlotView};
use super::SLOTS;

pub type Name = [u8; 40];

/// Node flags, with the bit values of Redis's bus (they travel in every header).
pub mod flags {
    pub const MASTER: u16 = 1;
    pub const REPLICA: u16 = 2;
    pub const PFAIL: u16 = 4;
    pub const FAIL: u16 = 8;
    pub const MYSELF: u16 = 16;
    pub const HANDSHAKE: u16 = 32;
    pub const NOADDR: u16 = 64;
    pub const MEET: u16 = 128;
    pub const MIGRATE_TO: u16 = 256;
    pub const NOFAILOVER: u16 = 512;
}

/// A random node name: 40 lower-case hex digits from the kernel's random source.
pub fn random_name() -> Name {
    use std::io::Read;
    let mut bytes = [0u8; 20];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut bytes);
    }
    let mut name = [0u8; 40];
    for (i, b) in bytes.iter().enumerate() {
        name[2 * i] = b"0123456789abcdef"[(b >> 4) as usize];
        name[2 * i + 1] = b"0123456789abcdef"[(b & 15) as usize];
    }
    name
}

pub fn name_str(n: &Name) -> &str {
    std::str::from_utf8(n).unwrap_or("????????????????????????????????????????")
}

pub fn parse_name(s: &[u8]) -> Option<Name> {
    (s.len() == 40 && s.iter().all(|b| b.is_ascii_hexdigit())).then(|| {
        let mut n = [0u8; 40];
        for (d, b) in n.iter_mut().zip(s) {
            *d = b.to_ascii_lowercase();
        }
        n
    })
}

pub struct Node {
    pub name: Name,
    pub flags: u16,
    pub ip: String,
    /// The client port, the other client port (TLS when `port` is plain), the bus port.
    pub port: u16,
    pub pport: u16,
    pub cport: u16,
    pub hostname: String,
    pub human_name: String,
    pub shard_id: Name,
    /// The master this node replicates.
    pub master: Option<Name>,
    pub config_epoch: u64,
    /// Unix ms of the ping in flight (0: none) and of the last pong.
    pub ping_sent: u64,
    pub pong_received: u64,
    /// Unix ms of the last message of any kind from it.
    pub data_received: u64,
    pub fail_time: u64,
    /// When this node last voted for one of its replicas... or this replica asked.
    pub voted_time: u64,
    pub repl_offset: u64,
    /// The slots it claims (for this node: the slots it serves).
    pub slots: Box<[u8; SLOTS / 8]>,
    pub numslots: usize,
    /// Masters that reported it PFAIL/FAIL, and when.
    pub fail_reports: HashMap<Name, u64>,
    /// The outbound bus link (the bus's id for it, 0: none) and whether it is connected
    /// (CLUSTER NODES' link state).
    pub link: u64,
    pub link_up: bool,
    pub link_since: u64,
    /// Created by a MEET from this side: the name is a placeholder until its first PONG.
    pub created: u64,
}

impl Node {
    pub fn new(name: Name, flags: u16) -> Node {
        Node {
            name,
            flags,
            ip: String::new(),
            port: 0,
            pport: 0,
            cport: 0,
            hostname: String::new(),
            human_name: String::new(),
            // A master's shard is named after it until a Redis 7.2 peer says otherwise
            // (its shard-id extension): every Kite node then agrees on the id without
            // sending the extension, which Redis 7.0 logs as unknown on every ping.
            // Replicas take their master's.
            shard_id: name,
            master: None,
            config_epoch: 0,
            ping_sent: 0,
            pong_received: 0,
            data_received: 0,
            fail_time: 0,
            voted_time: 0,
            repl_offset: 0,
            slots: Box::new([0; SLOTS / 8]),
            numslots: 0,
            fail_reports: HashMap::new(),
            link: 0,
            link_up: false,
            link_since: 0,
            created: super::now_ms(),
        }
    }

    pub fn has(&self, f: u16) -> bool {
        self.flags & f != 0
    }

    pub fn is_master(&self) -> bool {
        self.has(flags::MASTER)
    }

    pub fn owns(&self, slot: usize) -> bool {
        self.slots[slot / 8] & (1 << (slot % 8)) != 0
    }

    pub fn set_slot_bit(&mut self, slot: usize, on: bool) {
        let was = self.owns(slot);
        if on && !was {
            self.slots[slot / 8] |= 1 << (slot % 8);
            self.numslots += 1;
        } else if !on && was {
            self.slots[slot / 8] &= !(1 << (slot % 8));
            self.numslots -= 1;
        }
    }

    pub fn failed(&self) -> bool {
        self.has(flags::FAIL)
    }

    /// The flags column of CLUSTER NODES.
    pub fn flags_text(&self) -> String {
        let mut parts = Vec::new();
        for (f, word) in [
            (flags::MYSELF, "myself"),
            (flags::MASTER, "master"),
            (flags::REPLICA, "slave"),
            (flags::PFAIL, "fail?"),
            (flags::FAIL, "fail"),
            (flags::HANDSHAKE, "handshake"),
            (flags::NOADDR, "noaddr"),
            (flags::NOFAILOVER, "nofailover"),
        ] {
            if self.has(f) {
                parts.push(word);
            }
        }
        if parts.is_empty() {
            "noflags".into()
        } else {
            parts.join(",")
        }
    }

    /// `ip:port@cport[,hostname]`.
    pub fn addr_text(&self) -> String {
        let mut s = format!("{}:{}@{}", self.ip, self.port, self.cport);
        if !self.hostname.is_empty() {
            let _ = write!(s, ",{}", self.hostname);
        }
        s
    }

    /// The slot ranges this node serves, as `a-b` or `a`.
    pub fn ranges(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut start = None;
        for slot in 0..=SLOTS {
            let on = slot < SLOTS && self.owns(slot);
            match (on, start) {
                (true, None) => start = Some(slot),
                (false, Some(s)) => {
                    out.push((s, slot - 1));
                    start = None;
                }
                _ => {}
            }
        }
        out
    }
}

/// Message counters by type, for CLUSTER INFO.
pub const MSG_TYPES: usize = 11;
pub const MSG_NAMES: [&str; MSG_TYPES] = [
    "ping",
    "pong",
    "meet",
    "fail",
    "publish",
    "auth-req",
    "auth-ack",
    "update",
    "mfstart",
    "module",
    "publishshard",
];

pub struct State {
    pub myself: Name,
    pub current_epoch: u64,
    pub last_vote_epoch: u64,
    pub nodes: HashMap<Name, Node>,
    /// Who serves each slot.
    pub owner: Vec<Option<Name>>,
    pub migrating_to: HashMap<usize, Name>,
    pub importing_from: HashMap<usize, Name>,
    pub ok: bool,
    /// Nodes forgotten by CLUSTER FORGET, not to be re-added from gossip until then (ms).
    pub forgotten: HashMap<Name, u64>,
    pub sent: [u64; MSG_TYPES],
    pub received: [u64; MSG_TYPES],
    /// The configuration changed in a way a restart must see: the bus thread writes
    /// `cluster-config-file` at its next turn.
    pub save_pending: bool,
    pub require_full_coverage: bool,
    pub allow_reads_when_down: bool,
    pub node_timeout: u64,
    /// MEETs asked for by CLUSTER MEET, for the bus thread to start.
    pub meets: Vec<(String, u16, u16)>,
    /// Tell every node about this one now (after taking slots), not at the next ping.
    pub broadcast_pong: bool,
    /// This replica's election (Redis's failover_auth_*), and a manual failover asked
    /// for by CLUSTER FAILOVER FORCE (the master need not be failing).
    pub election: Election,
    pub manual: ManualFailover,
    /// CLUSTER FAILOVER asked this replica to send MFSTART to its master.
    pub manual_start: bool,
    pub replica_no_failover: bool,
    pub replica_validity_factor: u64,
    pub allow_replica_migration: bool,
}

#[derive(Default)]
pub struct Election {
    /// Unix ms when this replica may ask for votes (0: no election scheduled).
    pub start_at: u64,
    pub sent: bool,
    pub epoch: u64,
    pub votes: usize,
    /// CLUSTER FAILOVER FORCE: masters vote even though the master is not failing; and
    /// when that request lapses.
    pub forced: bool,
    pub manual_until: u64,
    /// Plain CLUSTER FAILOVER: the election waits until this replica has applied
    /// everything its paused master reported (`master_offset`, from pings flagged
    /// PAUSED; None until the first).
    pub wait_for_master: bool,
    pub master_offset: Option<u64>,
}

/// A master's side of a manual failover: writes paused until `until` for `replica`.
#[derive(Default)]
pub struct ManualFailover {
    pub replica: Option<Name>,
    pub until: u64,
}

impl State {
    pub fn new(myself: Name) -> State {
        let mut nodes = HashMap::new();
        nodes.insert(myself, Node::new(myself, flags::MYSELF | flags::MASTER));
        State {
            myself,
            current_epoch: 0,
            last_vote_epoch: 0,
            nodes,
            owner: vec![None; SLOTS],
            migrating_to: HashMap::new(),
            importing_from: HashMap::new(),
            ok: false,
            forgotten: HashMap::new(),
            sent: [0; MSG_TYPES],
            received: [0; MSG_TYPES],
            save_pending: false,
            require_full_coverage: true,
            allow_reads_when_down: false,
            node_timeout: 15000,
            meets: Vec::new(),
            broadcast_pong: false,
            election: Election::default(),
            manual: ManualFailover::default(),
            manual_start: false,
            replica_no_failover: false,
            replica_validity_factor: 10,
            allow_replica_migration: true,
        }
    }

    pub fn me(&self) -> &Node {
        &self.nodes[&self.myself]
    }

    pub fn me_mut(&mut self) -> &mut Node {
        self.nodes.get_mut(&self.myself).expect("myself is a node")
    }

    pub fn i_am_master(&self) -> bool {
        self.me().is_master()
    }

    /// Gives `slot` to `node` (which must be known), taking it from its previous owner.
    pub fn assign(&mut self, slot: usize, node: Name) {
        if let Some(prev) = self.owner[slot] {
            if let Some(n) = self.nodes.get_mut(&prev) {
                n.set_slot_bit(slot, false);
            }
        }
        if let Some(n) = self.nodes.get_mut(&node) {
            n.set_slot_bit(slot, true);
            self.owner[slot] = Some(node);
        } else {
            self.owner[slot] = None;
        }
    }

    pub fn unassign(&mut self, slot: usize) {
        if let Some(prev) = self.owner[slot].take() {
            if let Some(n) = self.nodes.get_mut(&prev) {
                n.set_slot_bit(slot, false);
            }
        }
    }

    pub fn slots_assigned(&self) -> usize {
        self.owner.iter().filter(|o| o.is_some()).count()
    }

    /// Removes a node and everything that names it.
    pub fn remove_node(&mut self, name: &Name) {
        for slot in 0..SLOTS {
            if self.owner[slot] == Some(*name) {
                self.owner[slot] = None;
            }
        }
        self.migrating_to.retain(|_, n| n != name);
        self.importing_from.retain(|_, n| n != name);
        for n in self.nodes.values_mut() {
            n.fail_reports.remove(name);
            if n.master == Some(*name) {
                n.master = None;
            }
        }
        self.nodes.remove(name);
    }

    pub fn max_config_epoch(&self) -> u64 {
        self.nodes
            .values()
            .map(|n| n.config_epoch)
            .max()
            .unwrap_or(0)
            .max(self.current_epoch)
    }

    /// Recomputes `ok` as Redis's clusterUpdateState does: every slot served by a
    /// reachable node (unless full coverage is not required) and a majority of the
    /// masters that serve slots reachable from here.
    pub fn update_health(&mut self) {
        let mut ok = true;
        if self.require_full_coverage {
            for o in &self.owner {
                match o.and_then(|n| self.nodes.get(&n)) {
                    Some(n) if !n.failed() => {}
                    _ => {
                        ok = false;
                        break;
                    }
                }
            }
        }
        let masters: Vec<&Node> = self
            .nodes
            .values()
            .filter(|n| n.is_master() && n.numslots > 0)
            .collect();
        let size = masters.len();
        let reachable = masters
            .iter()
            .filter(|n| !n.has(flags::PFAIL | flags::FAIL))
            .count();
        if reachable < size / 2 + 1 {
            ok = false;
        }
        self.ok = ok;
    }

    /// Copies the slot map and health into the data path's view.
    pub fn publish(&self, v: &SlotView) {
        let me = self.me();
        let my_master = me.master;
        for slot in 0..SLOTS {
            let mut b = match self.owner[slot] {
                None => view::UNASSIGNED,
                Some(n) if n == self.myself => view::HERE,
                Some(n) => {
                    if Some(n) == my_master {
                        view::ELSEWHERE | view::MY_MASTER
                    } else {
                        view::ELSEWHERE
                    }
                }
            };
            if self.migrating_to.contains_key(&slot) {
                b |= view::MIGRATING;
            }
            if self.importing_from.contains_key(&slot) {
                b |= view::IMPORTING;
            }
            v.set(slot, b);
        }
        v.set_ok(self.ok);
    }

    /// One line of CLUSTER NODES (and of the config file, with `for_file`).
    pub fn describe(&self, n: &Node, for_file: bool, now: u64) -> String {
        let mut s = String::with_capacity(128);
        let mut addr = n.addr_text();
        if for_file {
            // Redis 7.2's aux fields, kept in the file only.
            if n.hostname.is_empty() {
                addr.push(',');
            }
            let _ = write!(addr, ",shard-id={}", name_str(&n.shard_id));
        }
        let _ = write!(
            s,
            "{} {} {} {} {} {} {} {}",
            name_str(&n.name),
            addr,
            n.flags_text(),
            n.master.as_ref().map_or("-", name_str),
            n.ping_sent,
            n.pong_received,
            // A replica shows its master's epoch, as Redis prints it.
            n.master
                .filter(|_| n.has(flags::REPLICA))
                .and_then(|m| self.nodes.get(&m))
                .map_or(n.config_epoch, |m| m.config_epoch),
            if n.has(flags::MYSELF) || n.link_up {
                "connected"
            } else {
                "disconnected"
            }
        );
        let _ = now;
        if n.numslots > 0 {
            for (a, b) in n.ranges() {
                if a == b {
                    let _ = write!(s, " {a}");
                } else {
                    let _ = write!(s, " {a}-{b}");
                }
            }
        }
        if n.has(flags::MYSELF) {
            let mut mig: Vec<_> = self.migrating_to.iter().collect();
            mig.sort();
            for (slot, to) in mig {
                let _ = write!(s, " [{slot}->-{}]", name_str(to));
            }
            let mut imp: Vec<_> = self.importing_from.iter().collect();
            imp.sort();
            for (slot, from) in imp {
                let _ = write!(s, " [{slot}-<-{}]", name_str(from));
            }
        }
        s
    }

    /// CLUSTER NODES: myself first, then the rest by name.
    pub fn nodes_text(&self, now: u64) -> String {
        let mut names: Vec<&Name> = self.nodes.keys().collect();
        names.sort_by_key(|n| (**n != self.myself, **n));
        let mut out = String::new();
        for name in names {
            out.push_str(&self.describe(&self.nodes[name], false, now));
            out.push('\n');
        }
        out
    }

    /// The replicas of `master`.
    pub fn replicas_of(&self, master: &Name) -> Vec<&Node> {
        let mut v: Vec<&Node> = self
            .nodes
            .values()
            .filter(|n| n.master.as_ref() == Some(master) && n.has(flags::REPLICA))
            .collect();
        v.sort_by_key(|n| n.name);
        v
    }

    /// Masters serving at least one slot (the cluster's size).
    pub fn size(&self) -> usize {
        self.nodes
            .values()
            .filter(|n| n.is_master() && n.numslots > 0)
            .count()
    }
}
