//! Cluster mode (`--cluster-enabled yes`), black-box over raw RESP: the CLUSTER
//! subcommands' replies and error texts, slot ownership, -MOVED / -ASK / -CROSSSLOT /
//! -CLUSTERDOWN / -TRYAGAIN, nodes.conf written and read back at a restart, and small
//! clusters of two nodes that MEET over the cluster bus, split the slots, migrate a slot
//! and replicate.
//!
//! Written from Redis's documentation and checked against real Redis: every test passes
//! with `KITE_BIN=$(command -v redis-server)` (Debian's 7.0) and with a Redis 7.2 build.
//! Where 7.0 and 7.2 differ (CLUSTER MYSHARDID, one MEET error text) the 7.2 behaviour is
//! asserted and skipped only when the server is a redis-server older than 7.2.
//!
//! The cluster bus port is always given with `--cluster-port`: the harness picks ports
//! from the kernel's ephemeral range, where port+10000 may not exist. (tests/cluster/, the
//! Python suite, covers the default port+10000.)
//!
//! Every wait for the cluster to converge is a poll with a deadline (`wait_for`); nothing
//! asserts on a duration.

mod common;

use common::*;
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Kite's thread count in every test (ignored by redis-server).
const THREADS: usize = 2;
/// `cluster-node-timeout` of every node, in milliseconds.
const NODE_TIMEOUT_MS: &str = "2000";
/// Deadline of every wait for the cluster to converge (a bound, not an expectation).
const CONVERGE: Duration = Duration::from_secs(30);

const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
const NOT_SERVED: &str = "CLUSTERDOWN Hash slot not served";
const DOWN: &str = "CLUSTERDOWN The cluster is down";
const DOWN_RO: &str = "CLUSTERDOWN The cluster is down and only accepts read commands";
const TRYAGAIN: &str = "TRYAGAIN Multiple keys request during rehashing of slot";
const DISABLED: &str = "ERR This instance has cluster support disabled";
const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";
const NO_SUCH_ID: &str = "0123456789012345678901234567890123456789";

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn err(text: &str) -> Resp {
    Resp::Error(text.to_string())
}

fn int(i: i64) -> Resp {
    Resp::Integer(i)
}

/// The slot of a key, as the cluster specification defines it (hash tags included).
fn key_slot(key: &[u8]) -> u16 {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return crc16(&key[open + 1..open + 1 + len]) & 0x3FFF;
            }
        }
    }
    crc16(key) & 0x3FFF
}

/// A key without braces whose slot is `slot` (searched with the local CRC16).
fn key_in_slot(slot: u16, prefix: &str) -> String {
    (0u64..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| key_slot(k.as_bytes()) == slot)
        .unwrap()
}

fn is_hex40(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Polls `f` until it returns Ok; panics after `timeout` with `what` and the last Err.
#[track_caller]
fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) => {
                if Instant::now() > deadline {
                    panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The text of a bulk (RESP2) or verbatim (RESP3) reply, or a panic naming `what`.
#[track_caller]
fn text(r: &Resp, what: &str) -> String {
    match r {
        Resp::Bulk(_) | Resp::Verbatim { .. } => r.as_string().unwrap(),
        other => panic!("{what}: expected a bulk string, got {other}"),
    }
}

/// `field:value` lines (CLUSTER INFO, INFO) as a map; `#` lines skipped.
fn parse_fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim_end_matches('\r').to_string()))
        .collect()
}

/// `redis_version` from INFO server, when the server under test is a real redis-server.
fn redis_version(c: &mut Client) -> Option<(u32, u32)> {
    if !kite_is_redis() {
        return None;
    }
    let info = text(&c.cmd(&["INFO", "server"]), "INFO server");
    let v = parse_fields(&info)
        .get("redis_version")
        .cloned()
        .unwrap_or_default();
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    Some((it.next().unwrap_or(0), it.next().unwrap_or(0)))
}

/// True when the server under test is a redis-server older than 7.2 (Debian's 7.0): the
/// 7.2-only assertions are skipped then.
fn redis_before_72(c: &mut Client) -> bool {
    matches!(redis_version(c), Some(v) if v < (7, 2))
}

/// One line of CLUSTER NODES (or of nodes.conf).
#[derive(Clone, Debug)]
struct NodeLine {
    id: String,
    /// `ip:port@cport[,hostname]` as written
    addr: String,
    ip: String,
    port: u16,
    cport: u16,
    flags: Vec<String>,
    master: String,
    ping_sent: String,
    pong_recv: String,
    config_epoch: u64,
    link: String,
    /// Slot ranges and migration markers, as written (`0-8191`, `12182`,
    /// `[12182->-<id>]`).
    slots: Vec<String>,
    raw: String,
}

impl NodeLine {
    fn has_flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }
}

#[track_caller]
fn parse_node_line(line: &str) -> NodeLine {
    let f: Vec<&str> = line.split(' ').collect();
    assert!(
        f.len() >= 8,
        "CLUSTER NODES line with fewer than 8 fields: {line:?}"
    );
    let addr = f[1].to_string();
    let hostport = addr.split(',').next().unwrap();
    let (ipport, cport) = hostport
        .split_once('@')
        .unwrap_or_else(|| panic!("address without @cport in {line:?}"));
    let (ip, port) = ipport
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("address without :port in {line:?}"));
    NodeLine {
        id: f[0].to_string(),
        addr: addr.clone(),
        ip: ip.to_string(),
        port: port
            .parse()
            .unwrap_or_else(|_| panic!("bad port in {line:?}")),
        cport: cport
            .parse()
            .unwrap_or_else(|_| panic!("bad cport in {line:?}")),
        flags: f[2].split(',').map(String::from).collect(),
        master: f[3].to_string(),
        ping_sent: f[4].to_string(),
        pong_recv: f[5].to_string(),
        config_epoch: f[6]
            .parse()
            .unwrap_or_else(|_| panic!("bad config epoch in {line:?}")),
        link: f[7].to_string(),
        slots: f[8..].iter().map(|s| s.to_string()).collect(),
        raw: line.to_string(),
    }
}

/// A temporary directory removed when dropped.
struct TempDir(PathBuf);

static DIR_SEQ: AtomicUsize = AtomicUsize::new(0);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "kite-cluster-{tag}-{}-{}",
            std::process::id(),
            DIR_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn arg(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A node in cluster mode: `--cluster-enabled yes --cluster-node-timeout 2000
/// --cluster-port <free port>` plus `extra`.
struct Node {
    server: KiteServer,
    cport: u16,
}

impl Node {
    fn start(extra: &[&str]) -> Node {
        Self::start_with_config("nodes.conf", extra)
    }

    fn start_with_config(config_file: &str, extra: &[&str]) -> Node {
        let cport = free_port();
        let cport_s = cport.to_string();
        let mut args: Vec<&str> = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            config_file,
            "--cluster-node-timeout",
            NODE_TIMEOUT_MS,
            "--cluster-port",
            &cport_s,
        ];
        args.extend_from_slice(extra);
        let server = KiteServer::start(&args, THREADS);
        Node { server, cport }
    }

    fn port(&self) -> u16 {
        self.server.port
    }

    fn c(&self) -> Client {
        self.server.client()
    }

    fn cmd(&self, args: &[&str]) -> Resp {
        self.c().cmd(args)
    }

    fn id(&self) -> String {
        let r = self.cmd(&["CLUSTER", "MYID"]);
        let id = text(&r, "CLUSTER MYID");
        assert!(
            is_hex40(&id),
            "CLUSTER MYID {id:?}: want 40 lowercase hex digits"
        );
        id
    }

    fn info(&self) -> BTreeMap<String, String> {
        parse_fields(&text(&self.cmd(&["CLUSTER", "INFO"]), "CLUSTER INFO"))
    }

    fn info_field(&self, f: &str) -> String {
        self.info()
            .get(f)
            .cloned()
            .unwrap_or_else(|| panic!("CLUSTER INFO on port {} has no {f}", self.port()))
    }

    fn nodes_text(&self) -> String {
        text(&self.cmd(&["CLUSTER", "NODES"]), "CLUSTER NODES")
    }

    fn nodes(&self) -> Vec<NodeLine> {
        let t = self.nodes_text();
        assert!(
            t.ends_with('\n'),
            "CLUSTER NODES must end with a newline: {t:?}"
        );
        t.lines()
            .filter(|l| !l.is_empty())
            .map(parse_node_line)
            .collect()
    }

    fn myself(&self) -> NodeLine {
        let all = self.nodes();
        let mine: Vec<_> = all.iter().filter(|n| n.has_flag("myself")).collect();
        assert_eq!(
            mine.len(),
            1,
            "exactly one myself line in CLUSTER NODES: {all:?}"
        );
        mine[0].clone()
    }

    /// CLUSTER MEET other (with its bus port).
    fn meet(&self, other: &Node) {
        let port = other.port().to_string();
        let cport = other.cport.to_string();
        assert_eq!(
            self.cmd(&["CLUSTER", "MEET", "127.0.0.1", &port, &cport]),
            Resp::ok(),
            "CLUSTER MEET"
        );
    }

    /// Waits until CLUSTER INFO says cluster_state:ok.
    fn wait_state_ok(&self) {
        wait_for(
            &format!("cluster_state:ok on port {}", self.port()),
            CONVERGE,
            || {
                let i = self.info();
                if i.get("cluster_state").map(String::as_str) == Some("ok") {
                    Ok(())
                } else {
                    Err(format!("{i:?}"))
                }
            },
        );
    }
}

/// Waits until each node lists every other one (by id, port and bus port) as a connected
/// master or replica without fail flags, and CLUSTER INFO says cluster_known_nodes = N.
fn wait_all_know_each_other(nodes: &[&Node]) {
    let ids: Vec<String> = nodes.iter().map(|n| n.id()).collect();
    for n in nodes {
        wait_for(
            &format!(
                "port {} to list all {} nodes, connected",
                n.port(),
                nodes.len()
            ),
            CONVERGE,
            || {
                let lines = n.nodes();
                for (other, id) in nodes.iter().zip(&ids) {
                    let Some(l) = lines.iter().find(|l| &l.id == id) else {
                        return Err(format!("{id} missing: {lines:?}"));
                    };
                    let ok = l.port == other.port()
                        && l.cport == other.cport
                        && l.link == "connected"
                        && !l.has_flag("handshake")
                        && !l.has_flag("noaddr")
                        && !l.has_flag("fail?")
                        && !l.has_flag("fail")
                        && (l.has_flag("master") || l.has_flag("slave"));
                    if !ok {
                        return Err(format!("line {:?}", l.raw));
                    }
                }
                let known = n.info_field("cluster_known_nodes");
                if known != nodes.len().to_string() {
                    return Err(format!("cluster_known_nodes:{known}"));
                }
                Ok(())
            },
        );
    }
}

/// Two masters that met: A owns 0-8191, B 8192-16383; both ok and both see all 16384 slots
/// with the right owner.
fn two_masters() -> (Node, Node) {
    let a = Node::start(&[]);
    let b = Node::start(&[]);
    a.meet(&b);
    wait_all_know_each_other(&[&a, &b]);
    assert_eq!(
        a.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "8191"]),
        Resp::ok()
    );
    assert_eq!(
        b.cmd(&["CLUSTER", "ADDSLOTSRANGE", "8192", "16383"]),
        Resp::ok()
    );
    let (ida, idb) = (a.id(), b.id());
    for n in [&a, &b] {
        wait_for(
            &format!(
                "port {} to see A with 0-8191 and B with 8192-16383",
                n.port()
            ),
            CONVERGE,
            || {
                let lines = n.nodes();
                let slots_of =
                    |id: &str| lines.iter().find(|l| l.id == id).map(|l| l.slots.clone());
                if slots_of(&ida) == Some(vec!["0-8191".into()])
                    && slots_of(&idb) == Some(vec!["8192-16383".into()])
                {
                    Ok(())
                } else {
                    Err(format!("{lines:?}"))
                }
            },
        );
        n.wait_state_ok();
    }
    (a, b)
}

fn moved(slot: u16, port: u16) -> Resp {
    err(&format!("MOVED {slot} 127.0.0.1:{port}"))
}

fn ask(slot: u16, port: u16) -> Resp {
    err(&format!("ASK {slot} 127.0.0.1:{port}"))
}

// ---------------------------------------------------------------------------
// Single node
// ---------------------------------------------------------------------------

#[test]
fn keyslot_values_and_hash_tags() {
    let n = Node::start(&[]);
    let mut c = n.c();
    // Values from Redis's documentation (CLUSTER KEYSLOT, the cluster specification's hash
    // tags) and from redis-server.
    for (key, slot) in [
        ("somekey", 11058),
        ("foo", 12182),
        ("bar", 5061),
        ("{user1000}.following", 3443),
        ("{user1000}.followers", 3443),
        ("user1000", 3443),
        ("foo{}{bar}", 8363), // the first {} is empty: the whole key is hashed
        ("{}foo", 9500),      // likewise
        ("foo{{bar}}", 4015), // hashes "{bar"
        ("foo{bar}{zap}", 5061), // only the first tag: "bar"
        ("foo{bar}", 5061),
        ("{bar", key_slot(b"{bar") as i64), // no closing brace: the whole key
        ("", 0),
        ("123456789", 12739), // CRC16/XMODEM check value 0x31C3 mod 16384
    ] {
        assert_eq!(
            c.cmd(&["CLUSTER", "KEYSLOT", key]),
            int(slot),
            "CLUSTER KEYSLOT {key:?}"
        );
    }
    // Binary keys and random ones agree with the specification's algorithm.
    let mut rng = Rng::new(11);
    for i in 0..300 {
        let len = rng.index(24);
        let mut key = rng.bytes(len);
        if i % 3 == 0 {
            // with a brace or two somewhere
            let at = rng.index(key.len() + 1);
            key.insert(at, b'{');
            let at2 = rng.index(key.len() + 1);
            key.insert(at2, b'}');
        }
        let r = c.cmd(&[b"CLUSTER".as_slice(), b"KEYSLOT", &key]);
        assert_eq!(
            r,
            int(key_slot(&key) as i64),
            "CLUSTER KEYSLOT {}",
            escape_bytes(&key)
        );
    }
    assert_eq!(
        c.cmd(&["CLUSTER", "KEYSLOT"]),
        err("ERR wrong number of arguments for 'cluster|keyslot' command")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "KEYSLOT", "a", "b"]),
        err("ERR wrong number of arguments for 'cluster|keyslot' command")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "NOSUCHTHING"]),
        err("ERR unknown subcommand 'NOSUCHTHING'. Try CLUSTER HELP.")
    );
    assert_eq!(
        c.cmd(&["CLUSTER"]),
        err("ERR wrong number of arguments for 'cluster' command")
    );
    let help = c.cmd(&["CLUSTER", "HELP"]);
    assert!(
        help.as_array().is_some_and(|a| a.len() > 10),
        "CLUSTER HELP: an array of lines, got {help}"
    );
}

#[test]
fn fresh_node_info_myid_nodes_slots_shards() {
    let n = Node::start(&[]);
    let mut c = n.c();

    // CLUSTER INFO: a bulk string of CRLF-terminated field:value lines.
    let raw = text(&c.cmd(&["CLUSTER", "INFO"]), "CLUSTER INFO");
    assert!(
        raw.ends_with("\r\n"),
        "CLUSTER INFO lines end with CRLF: {raw:?}"
    );
    let info = parse_fields(&raw);
    for field in [
        "cluster_state",
        "cluster_slots_assigned",
        "cluster_slots_ok",
        "cluster_slots_pfail",
        "cluster_slots_fail",
        "cluster_known_nodes",
        "cluster_size",
        "cluster_current_epoch",
        "cluster_my_epoch",
        "cluster_stats_messages_sent",
        "cluster_stats_messages_received",
        "total_cluster_links_buffer_limit_exceeded",
    ] {
        assert!(
            info.contains_key(field),
            "CLUSTER INFO lacks {field}: {raw}"
        );
    }
    let names: Vec<&str> = raw.lines().filter_map(|l| l.split(':').next()).collect();
    assert_eq!(
        names[0], "cluster_state",
        "cluster_state comes first: {raw}"
    );
    for (field, want) in [
        ("cluster_state", "fail"),
        ("cluster_slots_assigned", "0"),
        ("cluster_slots_ok", "0"),
        ("cluster_slots_pfail", "0"),
        ("cluster_slots_fail", "0"),
        ("cluster_known_nodes", "1"),
        ("cluster_current_epoch", "0"),
        ("cluster_my_epoch", "0"),
        ("total_cluster_links_buffer_limit_exceeded", "0"),
    ] {
        assert_eq!(info[field], want, "fresh node CLUSTER INFO {field}: {raw}");
    }
    // Redis says cluster_size:1 for the first 2 s after start (its state is not recomputed
    // before then), 0 after: the number of masters serving at least one slot.
    wait_for("cluster_size:0 on a node with no slots", CONVERGE, || {
        let s = n.info_field("cluster_size");
        if s == "0" {
            Ok(())
        } else {
            Err(s)
        }
    });

    // INFO cluster.
    let ic = text(&c.cmd(&["INFO", "cluster"]), "INFO cluster");
    assert!(ic.starts_with("# Cluster\r\n"), "INFO cluster: {ic:?}");
    assert_eq!(
        parse_fields(&ic).get("cluster_enabled").map(String::as_str),
        Some("1"),
        "{ic}"
    );
    let all = text(&c.cmd(&["INFO"]), "INFO");
    assert!(
        all.contains("\r\ncluster_enabled:1\r\n"),
        "INFO (default) lacks cluster_enabled:1"
    );

    // CONFIG GET of the settings it was started with.
    let cfg = c.cmd(&["CONFIG", "GET", "cluster-enabled"]);
    assert_eq!(
        cfg,
        Resp::Array(vec![Resp::bulk("cluster-enabled"), Resp::bulk("yes")])
    );
    let cfg = c.cmd(&["CONFIG", "GET", "cluster-node-timeout"]);
    assert_eq!(
        cfg,
        Resp::Array(vec![
            Resp::bulk("cluster-node-timeout"),
            Resp::bulk(NODE_TIMEOUT_MS)
        ])
    );
    let cfg = c.cmd(&["CONFIG", "GET", "cluster-port"]);
    assert_eq!(
        cfg,
        Resp::Array(vec![
            Resp::bulk("cluster-port"),
            Resp::bulk(n.cport.to_string())
        ])
    );
    let cfg = c.cmd(&["CONFIG", "GET", "cluster-config-file"]);
    assert_eq!(
        cfg,
        Resp::Array(vec![
            Resp::bulk("cluster-config-file"),
            Resp::bulk("nodes.conf")
        ])
    );
    assert_err_prefix(
        &c.cmd(&["CONFIG", "SET", "cluster-enabled", "no"]),
        "ERR CONFIG SET failed",
    );

    // CLUSTER MYID: 40 hex digits, the same on every call.
    let id = n.id();
    assert_eq!(n.id(), id);

    // CLUSTER NODES: one line for myself.
    let lines = n.nodes();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let me = &lines[0];
    assert_eq!(me.id, id);
    assert_eq!(
        me.flags,
        vec!["myself".to_string(), "master".to_string()],
        "{}",
        me.raw
    );
    assert_eq!(me.master, "-", "{}", me.raw);
    assert_eq!(
        (me.ping_sent.as_str(), me.pong_recv.as_str()),
        ("0", "0"),
        "{}",
        me.raw
    );
    assert_eq!(me.config_epoch, 0, "{}", me.raw);
    assert_eq!(me.link, "connected", "{}", me.raw);
    assert!(me.slots.is_empty(), "{}", me.raw);
    assert_eq!((me.port, me.cport), (n.port(), n.cport), "{}", me.raw);
    // Before any MEET, Redis does not know its own address yet and writes ":port@cport".
    assert!(me.ip.is_empty() || me.ip == "127.0.0.1", "{}", me.raw);

    // CLUSTER SLOTS, SHARDS and LINKS.
    assert_eq!(c.cmd(&["CLUSTER", "SLOTS"]), Resp::Array(vec![]));
    assert_eq!(c.cmd(&["CLUSTER", "LINKS"]), Resp::Array(vec![]));
    let shards = c.cmd(&["CLUSTER", "SHARDS"]);
    let shards = shards.as_array().expect("CLUSTER SHARDS array").to_vec();
    assert_eq!(shards.len(), 1, "one shard: {shards:?}");
    let shard = flat_map(&shards[0]);
    assert_eq!(shard.get("slots"), Some(&Resp::Array(vec![])), "{shard:?}");
    let shard_nodes = shard["nodes"].as_array().expect("nodes array").to_vec();
    assert_eq!(shard_nodes.len(), 1);
    let node = flat_map(&shard_nodes[0]);
    assert_eq!(node.get("id"), Some(&Resp::bulk(&id)), "{node:?}");
    assert_eq!(node.get("port"), Some(&int(n.port() as i64)), "{node:?}");
    assert_eq!(node.get("role"), Some(&Resp::bulk("master")), "{node:?}");
    assert_eq!(node.get("health"), Some(&Resp::bulk("online")), "{node:?}");
    assert_eq!(node.get("replication-offset"), Some(&int(0)), "{node:?}");
    for f in ["ip", "endpoint"] {
        assert!(
            node.contains_key(f),
            "CLUSTER SHARDS node lacks {f}: {node:?}"
        );
    }

    // CLUSTER MYSHARDID (Redis 7.2; 7.0 answers "unknown subcommand").
    if !redis_before_72(&mut c) {
        let sid = text(&c.cmd(&["CLUSTER", "MYSHARDID"]), "CLUSTER MYSHARDID");
        assert!(is_hex40(&sid), "CLUSTER MYSHARDID {sid:?}");
        assert_eq!(text(&c.cmd(&["CLUSTER", "MYSHARDID"]), "MYSHARDID"), sid);
    }

    // Connection-state commands of cluster mode.
    for cmd in ["READONLY", "READWRITE", "ASKING"] {
        assert_eq!(c.cmd(&[cmd]), Resp::ok(), "{cmd}");
    }
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
}

/// A RESP2 flat `[k1, v1, k2, v2...]` array (or a RESP3 map) keyed by its string keys.
#[track_caller]
fn flat_map(r: &Resp) -> BTreeMap<String, Resp> {
    match r {
        Resp::Map(m) => m
            .iter()
            .map(|(k, v)| (k.as_string().expect("string key"), v.clone()))
            .collect(),
        _ => {
            let a = r
                .as_array()
                .unwrap_or_else(|| panic!("expected a flat map, got {r}"));
            assert!(a.len().is_multiple_of(2), "odd-length flat map {r}");
            a.chunks(2)
                .map(|kv| (kv[0].as_string().expect("string key"), kv[1].clone()))
                .collect()
        }
    }
}

#[test]
fn cluster_commands_refused_without_cluster_mode() {
    let s = KiteServer::start(&[], THREADS);
    let mut c = s.client();
    for cmd in [
        vec!["CLUSTER", "INFO"],
        vec!["CLUSTER", "MYID"],
        vec!["CLUSTER", "NODES"],
        vec!["CLUSTER", "SLOTS"],
        vec!["CLUSTER", "SHARDS"],
        vec!["CLUSTER", "KEYSLOT", "foo"],
        vec!["CLUSTER", "ADDSLOTS", "1"],
        vec!["READONLY"],
        vec!["READWRITE"],
        vec!["ASKING"],
    ] {
        assert_eq!(
            c.cmd(&cmd),
            err(DISABLED),
            "{cmd:?} without --cluster-enabled"
        );
    }
    let ic = text(&c.cmd(&["INFO", "cluster"]), "INFO cluster");
    assert_eq!(
        parse_fields(&ic).get("cluster_enabled").map(String::as_str),
        Some("0"),
        "{ic}"
    );
    assert_eq!(c.cmd(&["SELECT", "1"]), Resp::ok());
}

#[test]
fn addslots_delslots_errors_and_accounting() {
    let n = Node::start(&[]);
    let mut c = n.c();
    for bad in ["16384", "-1", "abc", "99999999999999999999"] {
        assert_eq!(
            c.cmd(&["CLUSTER", "ADDSLOTS", bad]),
            err("ERR Invalid or out of range slot"),
            "ADDSLOTS {bad}"
        );
        assert_eq!(
            c.cmd(&["CLUSTER", "DELSLOTS", bad]),
            err("ERR Invalid or out of range slot"),
            "DELSLOTS {bad}"
        );
    }
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTS"]),
        err("ERR wrong number of arguments for 'cluster|addslots' command")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTS", "5", "5"]),
        err("ERR Slot 5 specified multiple times")
    );
    assert_eq!(c.cmd(&["CLUSTER", "ADDSLOTS", "5", "6"]), Resp::ok());
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTS", "5"]),
        err("ERR Slot 5 is already busy")
    );
    // Checked before anything is assigned: 7 is not taken either.
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTS", "7", "6"]),
        err("ERR Slot 6 is already busy")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "DELSLOTS", "7"]),
        err("ERR Slot 7 is already unassigned")
    );

    // ADDSLOTSRANGE.
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "10", "9"]),
        err("ERR start slot number 10 is greater than end slot number 9")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "10"]),
        err("ERR wrong number of arguments for 'cluster|addslotsrange' command")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "10", "20", "30"]),
        err("ERR wrong number of arguments for 'cluster|addslotsrange' command")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "10", "20", "15", "25"]),
        err("ERR Slot 15 specified multiple times")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "10", "16384"]),
        err("ERR Invalid or out of range slot")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "4", "8"]),
        err("ERR Slot 5 is already busy")
    );
    assert_eq!(
        c.cmd(&[
            "CLUSTER",
            "ADDSLOTSRANGE",
            "100",
            "199",
            "300",
            "300",
            "16000",
            "16383"
        ]),
        Resp::ok()
    );
    // 5-6, 100-199, 300, 16000-16383
    let want_slots = ["5-6", "100-199", "300", "16000-16383"];
    let me = n.myself();
    assert_eq!(me.slots, want_slots, "{}", me.raw);
    let info = n.info();
    assert_eq!(
        info["cluster_slots_assigned"],
        (2 + 100 + 1 + 384).to_string()
    );
    assert_eq!(info["cluster_slots_ok"], (2 + 100 + 1 + 384).to_string());
    assert_eq!(info["cluster_state"], "fail", "not every slot is covered");

    // CLUSTER SLOTS: one entry per range, [start, end, [ip, port, id, ...]].
    let slots = c.cmd(&["CLUSTER", "SLOTS"]);
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    let id = n.id();
    for e in slots.as_array().expect("CLUSTER SLOTS array") {
        let e = e.as_array().expect("slot range entry");
        assert!(e.len() >= 3, "{slots}");
        ranges.push((e[0].as_int().unwrap(), e[1].as_int().unwrap()));
        let master = e[2].as_array().expect("node entry");
        assert!(master.len() >= 3, "node entry [ip, port, id, ...]: {slots}");
        assert_eq!(master[1], int(n.port() as i64), "{slots}");
        assert_eq!(master[2], Resp::bulk(&id), "{slots}");
    }
    ranges.sort();
    assert_eq!(ranges, vec![(5, 6), (100, 199), (300, 300), (16000, 16383)]);

    // DELSLOTS / DELSLOTSRANGE.
    assert_eq!(
        c.cmd(&["CLUSTER", "DELSLOTS", "6", "6"]),
        err("ERR Slot 6 specified multiple times")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "DELSLOTS", "7"]),
        err("ERR Slot 7 is already unassigned")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "DELSLOTSRANGE", "150", "250"]),
        err("ERR Slot 200 is already unassigned")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "DELSLOTSRANGE", "20", "10"]),
        err("ERR start slot number 20 is greater than end slot number 10")
    );
    assert_eq!(c.cmd(&["CLUSTER", "DELSLOTS", "6", "300"]), Resp::ok());
    assert_eq!(
        c.cmd(&["CLUSTER", "DELSLOTSRANGE", "100", "149", "16100", "16383"]),
        Resp::ok()
    );
    assert_eq!(n.myself().slots, ["5", "150-199", "16000-16099"]);
    assert_eq!(
        n.info_field("cluster_slots_assigned"),
        (1 + 50 + 100).to_string()
    );

    // FLUSHSLOTS needs an empty database... which a node without its slots can't fill, so
    // only the success case here (the error is checked in full_coverage_single_node).
    assert_eq!(c.cmd(&["CLUSTER", "FLUSHSLOTS"]), Resp::ok());
    assert!(n.myself().slots.is_empty());
    assert_eq!(n.info_field("cluster_slots_assigned"), "0");
}

#[test]
fn full_coverage_single_node() {
    let n = Node::start(&[]);
    let mut c = n.c();
    // No slot served yet: key commands are refused, others work.
    assert_eq!(c.cmd(&["GET", "foo"]), err(NOT_SERVED));
    assert_eq!(c.cmd(&["SET", "foo", "1"]), err(NOT_SERVED));
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(c.cmd(&["DBSIZE"]), int(0));

    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Resp::ok()
    );
    n.wait_state_ok();
    let info = n.info();
    assert_eq!(info["cluster_slots_assigned"], "16384");
    assert_eq!(info["cluster_slots_ok"], "16384");
    assert_eq!(info["cluster_size"], "1");
    assert_eq!(info["cluster_known_nodes"], "1");
    assert_eq!(n.myself().slots, ["0-16383"]);
    let slots = c.cmd(&["CLUSTER", "SLOTS"]);
    let e = &slots.as_array().unwrap()[0];
    let e = e.as_array().unwrap();
    assert_eq!((&e[0], &e[1]), (&int(0), &int(16383)), "{slots}");
    let shards = c.cmd(&["CLUSTER", "SHARDS"]);
    let shard = flat_map(&shards.as_array().unwrap()[0]);
    assert_eq!(
        shard["slots"],
        Resp::Array(vec![int(0), int(16383)]),
        "{shards}"
    );

    assert_eq!(c.cmd(&["SET", "foo", "bar"]), Resp::ok());
    assert_eq!(c.cmd(&["GET", "foo"]), Resp::bulk("bar"));

    // COUNTKEYSINSLOT / GETKEYSINSLOT.
    let tag_slot = key_slot(b"{user1000}").to_string();
    for i in 0..7 {
        assert_eq!(
            c.cmd(&["SET", &format!("{{user1000}}.k{i}"), "v"]),
            Resp::ok()
        );
    }
    let other = key_in_slot(key_slot(b"{user1000}"), "plain");
    assert_eq!(c.cmd(&["SET", &other, "v"]), Resp::ok());
    assert_eq!(c.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &tag_slot]), int(8));
    assert_eq!(c.cmd(&["CLUSTER", "COUNTKEYSINSLOT", "12182"]), int(1));
    assert_eq!(c.cmd(&["CLUSTER", "COUNTKEYSINSLOT", "0"]), int(0));
    let all = bytes_set(&c.cmd(&["CLUSTER", "GETKEYSINSLOT", &tag_slot, "100"]));
    let mut want: HashSet<Vec<u8>> = (0..7)
        .map(|i| format!("{{user1000}}.k{i}").into_bytes())
        .collect();
    want.insert(other.clone().into_bytes());
    assert_eq!(all, want);
    let three = bytes_set(&c.cmd(&["CLUSTER", "GETKEYSINSLOT", &tag_slot, "3"]));
    assert_eq!(three.len(), 3);
    assert!(three.is_subset(&want));
    assert_eq!(
        c.cmd(&["CLUSTER", "GETKEYSINSLOT", &tag_slot, "0"]),
        Resp::Array(vec![])
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "GETKEYSINSLOT", "0", "10"]),
        Resp::Array(vec![])
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "GETKEYSINSLOT", "12182", "10"]),
        Resp::Array(vec![Resp::bulk("foo")])
    );
    // A deleted key is no longer counted.
    assert_eq!(c.cmd(&["DEL", &other]), int(1));
    assert_eq!(c.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &tag_slot]), int(7));
    for bad in ["16384", "-1"] {
        assert_eq!(
            c.cmd(&["CLUSTER", "COUNTKEYSINSLOT", bad]),
            err("ERR Invalid slot")
        );
        assert_eq!(
            c.cmd(&["CLUSTER", "GETKEYSINSLOT", bad, "1"]),
            err("ERR Invalid slot or number of keys")
        );
    }
    assert_eq!(
        c.cmd(&["CLUSTER", "GETKEYSINSLOT", "0", "-1"]),
        err("ERR Invalid slot or number of keys")
    );
    for bad in [
        vec!["CLUSTER", "COUNTKEYSINSLOT", "abc"],
        vec!["CLUSTER", "GETKEYSINSLOT", "abc", "1"],
        vec!["CLUSTER", "GETKEYSINSLOT", "0", "abc"],
    ] {
        assert_eq!(
            c.cmd(&bad),
            err("ERR value is not an integer or out of range"),
            "{bad:?}"
        );
    }

    // FLUSHSLOTS and RESET refuse a node holding keys.
    assert_eq!(
        c.cmd(&["CLUSTER", "FLUSHSLOTS"]),
        err("ERR DB must be empty to perform CLUSTER FLUSHSLOTS.")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "RESET"]),
        err("ERR CLUSTER RESET can't be called with master nodes containing keys")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "RESET", "SOFT", "now"]),
        err("ERR unknown subcommand or wrong number of arguments for 'RESET'. Try CLUSTER HELP.")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "RESET", "sideways"]),
        err("ERR syntax error")
    );

    // SETSLOT on a slot I own.
    assert_eq!(c.cmd(&["CLUSTER", "SETSLOT", "5", "STABLE"]), Resp::ok());
    assert_eq!(
        c.cmd(&["CLUSTER", "SETSLOT", "16384", "STABLE"]),
        err("ERR Invalid or out of range slot")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "SETSLOT", "5", "SIDEWAYS"]),
        err("ERR Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "SETSLOT", "5", "MIGRATING"]),
        err("ERR Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "SETSLOT", "5"]),
        err("ERR wrong number of arguments for 'cluster|setslot' command")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "SETSLOT", "5", "MIGRATING", NO_SUCH_ID]),
        err(&format!("ERR I don't know about node {NO_SUCH_ID}"))
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "SETSLOT", "5", "IMPORTING", NO_SUCH_ID]),
        err("ERR I'm already the owner of hash slot 5")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "SETSLOT", "5", "NODE", NO_SUCH_ID]),
        err(&format!("ERR Unknown node {NO_SUCH_ID}"))
    );

    // Commands of other nodes' business, with an unknown node id.
    for sub in ["COUNT-FAILURE-REPORTS", "FORGET", "REPLICATE"] {
        assert_eq!(
            c.cmd(&["CLUSTER", sub, NO_SUCH_ID]),
            err(&format!("ERR Unknown node {NO_SUCH_ID}")),
            "CLUSTER {sub}"
        );
    }
    let me = n.id();
    assert_eq!(
        c.cmd(&["CLUSTER", "FORGET", &me]),
        err("ERR I tried hard but I can't forget myself...")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "REPLICATE", &me]),
        err("ERR Can't replicate myself")
    );
    assert_eq!(c.cmd(&["CLUSTER", "COUNT-FAILURE-REPORTS", &me]), int(0));
    assert_eq!(c.cmd(&["CLUSTER", "SAVECONFIG"]), Resp::ok());
}

#[test]
fn crossslot_and_hash_tags() {
    let n = Node::start(&[]);
    let mut c = n.c();
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Resp::ok()
    );
    n.wait_state_ok();
    assert_ne!(key_slot(b"a"), key_slot(b"b"));

    // Multi-key commands over two slots, all served here.
    for cmd in [
        vec!["MSET", "a", "1", "b", "2"],
        vec!["MSETNX", "a", "1", "b", "2"],
        vec!["MGET", "a", "b"],
        vec!["DEL", "a", "b"],
        vec!["UNLINK", "a", "b"],
        vec!["EXISTS", "a", "b"],
        vec!["TOUCH", "a", "b"],
        vec!["RPOPLPUSH", "a", "b"],
        vec!["LMOVE", "a", "b", "LEFT", "RIGHT"],
        vec!["RENAME", "a", "b"],
        vec!["SUNIONSTORE", "a", "b"],
        vec!["SINTER", "a", "b"],
        vec!["BRPOP", "a", "b", "1"],
        vec!["BLPOP", "a", "b", "0"],
        vec!["EVAL", "return 1", "2", "a", "b"],
        vec!["PFCOUNT", "a", "b"],
        vec!["WATCH", "a", "b"],
    ] {
        assert_eq!(c.cmd(&cmd), err(CROSSSLOT), "{cmd:?}");
    }
    // Nothing was written.
    assert_eq!(c.cmd(&["DBSIZE"]), int(0));

    // Hash tags put the keys in one slot.
    assert_eq!(c.cmd(&["MSET", "{u}a", "1", "{u}b", "2"]), Resp::ok());
    assert_eq!(
        c.cmd(&["MGET", "{u}a", "{u}b"]),
        Resp::Array(vec![Resp::bulk("1"), Resp::bulk("2")])
    );
    assert_eq!(c.cmd(&["RPUSH", "{u}list", "x", "y"]), int(2));
    assert_eq!(
        c.cmd(&["RPOPLPUSH", "{u}list", "{u}other"]),
        Resp::bulk("y")
    );
    assert_eq!(
        c.cmd(&["BRPOP", "{u}nothing", "{u}list", "1"]),
        Resp::Array(vec![Resp::bulk("{u}list"), Resp::bulk("x")])
    );
    assert_eq!(
        c.cmd(&[
            "EVAL",
            "return redis.call('GET', KEYS[1]) .. redis.call('GET', KEYS[2])",
            "2",
            "{u}a",
            "{u}b"
        ]),
        Resp::bulk("12")
    );
    assert_eq!(c.cmd(&["DEL", "{u}a", "{u}b", "{u}other"]), int(3));
    // Two different keys that happen to share a slot are not cross-slot either.
    let k1 = "k0".to_string();
    let k2 = (1u64..)
        .map(|i| format!("k{i}"))
        .find(|k| key_slot(k.as_bytes()) == key_slot(k1.as_bytes()))
        .unwrap();
    assert_eq!(c.cmd(&["MSET", &k1, "1", &k2, "2"]), Resp::ok());
    assert_eq!(c.cmd(&["DEL", &k1, &k2]), int(2));

    // MULTI/EXEC whose commands each name one slot but two slots in all: every command is
    // queued, EXEC answers -CROSSSLOT (not EXECABORT) and nothing runs.
    assert_eq!(c.cmd(&["MULTI"]), Resp::ok());
    assert_eq!(c.cmd(&["SET", "a", "1"]), Resp::simple("QUEUED"));
    assert_eq!(c.cmd(&["SET", "b", "2"]), Resp::simple("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), err(CROSSSLOT));
    // The transaction is gone: the connection is out of MULTI and nothing was set.
    assert_eq!(c.cmd(&["MGET", "a"]), Resp::Array(vec![Resp::NullBulk]));
    assert_eq!(c.cmd(&["EXISTS", "b"]), int(0));
    assert_eq!(c.cmd(&["EXEC"]), err("ERR EXEC without MULTI"));
    // A transaction within one slot runs.
    assert_eq!(c.cmd(&["MULTI"]), Resp::ok());
    assert_eq!(c.cmd(&["SET", "{t}a", "1"]), Resp::simple("QUEUED"));
    assert_eq!(c.cmd(&["INCR", "{t}b"]), Resp::simple("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), Resp::Array(vec![Resp::ok(), int(1)]));
    // A cross-slot command inside MULTI is refused at once and aborts the transaction.
    assert_eq!(c.cmd(&["MULTI"]), Resp::ok());
    assert_eq!(c.cmd(&["MSET", "a", "1", "b", "2"]), err(CROSSSLOT));
    assert_eq!(c.cmd(&["SET", "{t}a", "2"]), Resp::simple("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), err(EXECABORT));
    assert_eq!(c.cmd(&["GET", "{t}a"]), Resp::bulk("1"));

    // A script may touch undeclared keys of slots this node serves.
    assert_eq!(
        c.cmd(&[
            "EVAL",
            "redis.call('SET', 'a', 'x'); return redis.call('GET', 'b')",
            "0"
        ]),
        Resp::NullBulk
    );
    assert_eq!(c.cmd(&["GET", "a"]), Resp::bulk("x"));
    // A script with a shebang may not reach keys of two slots unless its flags say
    // allow-cross-slot-keys (one without a shebang may, as above, for compatibility).
    let r = c.cmd(&[
        "EVAL",
        "#!lua\nredis.call('SET', 'a', 'y')\nreturn redis.call('GET', 'b')",
        "0",
    ]);
    assert_err_prefix(
        &r,
        "ERR Script attempted to access keys that do not hash to the same slot",
    );
    assert_eq!(
        c.cmd(&[
            "EVAL",
            "#!lua flags=allow-cross-slot-keys\nredis.call('SET', 'b', 'z')\nreturn redis.call('GET', 'a')",
            "0",
        ]),
        Resp::bulk("y")
    );
    assert_eq!(c.cmd(&["GET", "b"]), Resp::bulk("z"));
}

#[test]
fn select_and_other_databases_refused() {
    let n = Node::start(&[]);
    let mut c = n.c();
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Resp::ok()
    );
    n.wait_state_ok();
    assert_eq!(
        c.cmd(&["SELECT", "1"]),
        err("ERR SELECT is not allowed in cluster mode")
    );
    assert_eq!(
        c.cmd(&["SELECT", "15"]),
        err("ERR SELECT is not allowed in cluster mode")
    );
    assert_eq!(c.cmd(&["SELECT", "0"]), Resp::ok());
    assert_eq!(c.cmd(&["SET", "foo", "1"]), Resp::ok());
    assert_eq!(
        c.cmd(&["MOVE", "foo", "1"]),
        err("ERR MOVE is not allowed in cluster mode")
    );
    assert_eq!(
        c.cmd(&["SWAPDB", "0", "1"]),
        err("ERR SWAPDB is not allowed in cluster mode")
    );
    assert_eq!(c.cmd(&["GET", "foo"]), Resp::bulk("1"));
}

#[test]
fn clusterdown_states() {
    // Full coverage required (the default): one unassigned slot takes the whole node down.
    let n = Node::start(&[]);
    let mut c = n.c();
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Resp::ok()
    );
    n.wait_state_ok();
    assert_eq!(c.cmd(&["SET", "foo", "1"]), Resp::ok());
    let a_slot = key_slot(b"a").to_string();
    assert_eq!(c.cmd(&["CLUSTER", "DELSLOTS", &a_slot]), Resp::ok());
    wait_for("cluster_state:fail after DELSLOTS", CONVERGE, || {
        let s = n.info_field("cluster_state");
        if s == "fail" {
            Ok(())
        } else {
            Err(s)
        }
    });
    assert_eq!(c.cmd(&["GET", "foo"]), err(DOWN));
    assert_eq!(c.cmd(&["SET", "foo", "2"]), err(DOWN));
    assert_eq!(c.cmd(&["GET", "a"]), err(NOT_SERVED));
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(c.cmd(&["CLUSTER", "ADDSLOTS", &a_slot]), Resp::ok());
    n.wait_state_ok();
    assert_eq!(c.cmd(&["GET", "foo"]), Resp::bulk("1"));

    // allow-reads-when-down: reads served, writes refused.
    let r = Node::start(&["--cluster-allow-reads-when-down", "yes"]);
    let mut rc = r.c();
    assert_eq!(
        rc.cmd(&["CONFIG", "GET", "cluster-allow-reads-when-down"]),
        Resp::Array(vec![
            Resp::bulk("cluster-allow-reads-when-down"),
            Resp::bulk("yes")
        ])
    );
    assert_eq!(
        rc.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Resp::ok()
    );
    r.wait_state_ok();
    assert_eq!(rc.cmd(&["SET", "foo", "1"]), Resp::ok());
    assert_eq!(rc.cmd(&["CLUSTER", "DELSLOTS", &a_slot]), Resp::ok());
    wait_for("cluster_state:fail after DELSLOTS", CONVERGE, || {
        let s = r.info_field("cluster_state");
        if s == "fail" {
            Ok(())
        } else {
            Err(s)
        }
    });
    assert_eq!(rc.cmd(&["GET", "foo"]), Resp::bulk("1"));
    assert_eq!(rc.cmd(&["SET", "foo", "2"]), err(DOWN_RO));
    assert_eq!(rc.cmd(&["GET", "a"]), err(NOT_SERVED));

    // require-full-coverage no: the node stays up, only the missing slot is refused.
    let p = Node::start(&["--cluster-require-full-coverage", "no"]);
    let mut pc = p.c();
    assert_eq!(
        pc.cmd(&["CONFIG", "GET", "cluster-require-full-coverage"]),
        Resp::Array(vec![
            Resp::bulk("cluster-require-full-coverage"),
            Resp::bulk("no")
        ])
    );
    assert_eq!(
        pc.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Resp::ok()
    );
    assert_eq!(pc.cmd(&["CLUSTER", "DELSLOTS", &a_slot]), Resp::ok());
    p.wait_state_ok();
    assert_eq!(p.info_field("cluster_slots_assigned"), "16383");
    assert_eq!(pc.cmd(&["SET", "foo", "1"]), Resp::ok());
    assert_eq!(pc.cmd(&["GET", "a"]), err(NOT_SERVED));
    assert_eq!(pc.cmd(&["SET", "a", "1"]), err(NOT_SERVED));
    // (CONFIG SET cluster-require-full-coverage yes does not take an ok node down by
    // itself in Redis: its state is recomputed on the next event, so nothing is asserted
    // about it here.)
}

#[test]
fn epochs_on_a_lone_node() {
    let n = Node::start(&[]);
    let mut c = n.c();
    assert_eq!(
        c.cmd(&["CLUSTER", "SET-CONFIG-EPOCH", "-1"]),
        err("ERR Invalid config epoch specified: -1")
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "SET-CONFIG-EPOCH", "abc"]),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.cmd(&["CLUSTER", "SET-CONFIG-EPOCH", "7"]), Resp::ok());
    let info = n.info();
    assert_eq!(
        (
            info["cluster_current_epoch"].as_str(),
            info["cluster_my_epoch"].as_str()
        ),
        ("7", "7")
    );
    assert_eq!(n.myself().config_epoch, 7);
    assert_eq!(
        c.cmd(&["CLUSTER", "SET-CONFIG-EPOCH", "9"]),
        err("ERR Node config epoch is already non-zero")
    );
    // Already the greatest epoch: BUMPEPOCH leaves it.
    assert_eq!(c.cmd(&["CLUSTER", "BUMPEPOCH"]), Resp::simple("STILL 7"));

    let m = Node::start(&[]);
    let mut mc = m.c();
    assert_eq!(mc.cmd(&["CLUSTER", "BUMPEPOCH"]), Resp::simple("BUMPED 1"));
    assert_eq!(mc.cmd(&["CLUSTER", "BUMPEPOCH"]), Resp::simple("STILL 1"));
    assert_eq!(m.info_field("cluster_my_epoch"), "1");
    assert_eq!(m.info_field("cluster_current_epoch"), "1");
}

#[test]
fn announce_ip_is_used_at_once() {
    let n = Node::start(&["--cluster-announce-ip", "127.0.0.1"]);
    let mut c = n.c();
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "cluster-announce-ip"]),
        Resp::Array(vec![
            Resp::bulk("cluster-announce-ip"),
            Resp::bulk("127.0.0.1")
        ])
    );
    // Without a MEET the node would not know its address; the announced one is used.
    wait_for(
        "the myself line to carry the announced ip",
        CONVERGE,
        || {
            let me = n.myself();
            if me
                .addr
                .starts_with(&format!("127.0.0.1:{}@{}", n.port(), n.cport))
            {
                Ok(())
            } else {
                Err(me.raw)
            }
        },
    );
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Resp::ok()
    );
    n.wait_state_ok();
    let slots = c.cmd(&["CLUSTER", "SLOTS"]);
    let e = slots.as_array().unwrap()[0].as_array().unwrap().to_vec();
    let master = e[2].as_array().unwrap();
    assert_eq!(master[0], Resp::bulk("127.0.0.1"), "{slots}");
}

// ---------------------------------------------------------------------------
// nodes.conf and restarts
// ---------------------------------------------------------------------------

/// nodes.conf as written: the myself line and the vars line.
fn read_nodes_conf(path: &Path) -> Result<(NodeLine, String), String> {
    let t = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut myself = None;
    let mut vars = None;
    for l in t.lines() {
        if l.starts_with("vars ") {
            vars = Some(l.to_string());
        } else if !l.trim().is_empty() {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() >= 8 && f[2].split(',').any(|x| x == "myself") {
                myself = Some(parse_node_line(l));
            }
        }
    }
    match (myself, vars) {
        (Some(m), Some(v)) => Ok((m, v)),
        _ => Err(format!(
            "no myself line or no vars line in {}:\n{t}",
            path.display()
        )),
    }
}

#[test]
fn nodes_conf_written_and_reloaded_at_restart() {
    let dir = TempDir::new("restart");
    let dir_arg = dir.arg();
    let conf_name = "nodes-restart.conf";
    let conf = dir.path().join(conf_name);
    let args = ["--dir", dir_arg.as_str()];

    let n = Node::start_with_config(conf_name, &args);
    let mut c = n.c();
    let id = n.id();
    let shard_id = if redis_before_72(&mut c) {
        None
    } else {
        Some(text(&c.cmd(&["CLUSTER", "MYSHARDID"]), "CLUSTER MYSHARDID"))
    };
    assert_eq!(c.cmd(&["CLUSTER", "SET-CONFIG-EPOCH", "5"]), Resp::ok());
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "99", "200", "16383"]),
        Resp::ok()
    );
    // The file follows the change without being asked to.
    let (me, vars) = wait_for("nodes.conf to have the slots and epoch 5", CONVERGE, || {
        let (me, vars) = read_nodes_conf(&conf)?;
        if me.id == id
            && me.slots == ["0-99", "200-16383"]
            && me.config_epoch == 5
            && vars.split_whitespace().collect::<Vec<_>>()
                == ["vars", "currentEpoch", "5", "lastVoteEpoch", "0"]
        {
            Ok((me, vars))
        } else {
            Err(format!("{} / {vars}", me.raw))
        }
    });
    assert_eq!(me.flags, ["myself", "master"], "{}", me.raw);
    assert_eq!(me.master, "-", "{}", me.raw);
    assert_eq!(me.link, "connected", "{}", me.raw);
    assert!(
        vars.starts_with("vars currentEpoch 5 lastVoteEpoch 0"),
        "{vars}"
    );
    assert_eq!(c.cmd(&["CLUSTER", "SAVECONFIG"]), Resp::ok());
    drop(c);
    drop(n); // SIGKILL

    let n = Node::start_with_config(conf_name, &args);
    let mut c = n.c();
    assert_eq!(
        n.id(),
        id,
        "CLUSTER MYID after a restart with the same nodes.conf"
    );
    let me = n.myself();
    assert_eq!(me.slots, ["0-99", "200-16383"], "{}", me.raw);
    assert_eq!(me.config_epoch, 5, "{}", me.raw);
    let info = n.info();
    assert_eq!(info["cluster_current_epoch"], "5");
    assert_eq!(info["cluster_my_epoch"], "5");
    assert_eq!(info["cluster_slots_assigned"], (16384 - 100).to_string());
    assert_eq!(info["cluster_known_nodes"], "1");
    assert_eq!(c.cmd(&["CLUSTER", "BUMPEPOCH"]), Resp::simple("STILL 5"));
    if let Some(sid) = shard_id {
        assert_eq!(
            text(&c.cmd(&["CLUSTER", "MYSHARDID"]), "CLUSTER MYSHARDID"),
            sid,
            "CLUSTER MYSHARDID after a restart"
        );
    }
    // And it goes on serving once its last slots come back.
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "100", "199"]),
        Resp::ok()
    );
    n.wait_state_ok();
    assert_eq!(c.cmd(&["SET", "foo", "bar"]), Resp::ok());
    drop(c);
    drop(n);

    // CLUSTER RESET HARD: a new id, epochs back to 0, no slots (written to the file too).
    let n = Node::start_with_config(conf_name, &args);
    let mut c = n.c();
    assert_eq!(n.id(), id);
    assert_eq!(c.cmd(&["FLUSHALL"]), Resp::ok());
    assert_eq!(c.cmd(&["CLUSTER", "RESET", "SOFT"]), Resp::ok());
    assert_eq!(n.id(), id, "RESET SOFT keeps the node id");
    assert!(n.myself().slots.is_empty());
    assert_eq!(
        n.info_field("cluster_current_epoch"),
        "5",
        "RESET SOFT keeps the epochs"
    );
    assert_eq!(c.cmd(&["CLUSTER", "RESET", "HARD"]), Resp::ok());
    let new_id = n.id();
    assert_ne!(new_id, id, "RESET HARD makes a new node id");
    let info = n.info();
    assert_eq!(
        (
            info["cluster_current_epoch"].as_str(),
            info["cluster_my_epoch"].as_str()
        ),
        ("0", "0")
    );
    wait_for("nodes.conf to have the new id", CONVERGE, || {
        let (me, vars) = read_nodes_conf(&conf)?;
        if me.id == new_id && me.slots.is_empty() && vars.starts_with("vars currentEpoch 0 ") {
            Ok(())
        } else {
            Err(format!("{} / {vars}", me.raw))
        }
    });
}

// ---------------------------------------------------------------------------
// Two or three nodes
// ---------------------------------------------------------------------------

#[test]
fn meet_gossip_links_and_epochs() {
    let a = Node::start(&[]);
    let b = Node::start(&[]);
    let c3 = Node::start(&[]);
    let mut ac = a.c();
    assert_eq!(
        ac.cmd(&["CLUSTER", "MEET", "1.2.3.400", "7000"]),
        err("ERR Invalid node address specified: 1.2.3.400:7000")
    );
    assert_eq!(
        ac.cmd(&["CLUSTER", "MEET", "127.0.0.1", "70000"]),
        err("ERR Invalid node address specified: 127.0.0.1:70000")
    );
    assert_eq!(
        ac.cmd(&["CLUSTER", "MEET", "127.0.0.1"]),
        err("ERR wrong number of arguments for 'cluster|meet' command")
    );
    if !redis_before_72(&mut ac) {
        // Redis 7.0 says "Invalid TCP base port specified: abc".
        assert_eq!(
            ac.cmd(&["CLUSTER", "MEET", "127.0.0.1", "abc"]),
            err("ERR Invalid base port specified: abc")
        );
    }

    // A meets B, B meets C: A learns C by gossip.
    a.meet(&b);
    b.meet(&c3);
    wait_all_know_each_other(&[&a, &b, &c3]);
    let ids = [a.id(), b.id(), c3.id()];
    for n in [&a, &b, &c3] {
        for l in n.nodes() {
            assert_eq!(
                l.ip, "127.0.0.1",
                "after MEET every address is known: {}",
                l.raw
            );
            assert_eq!(l.master, "-", "{}", l.raw);
            assert!(l.slots.is_empty(), "{}", l.raw);
            if !l.has_flag("myself") {
                assert_eq!(l.flags, ["master"], "{}", l.raw);
            }
        }
    }

    // Three masters that all started at config epoch 0 end with distinct epochs (the
    // specification's config epoch collision resolution).
    wait_for("distinct config epochs", CONVERGE, || {
        let lines = a.nodes();
        let epochs: HashSet<u64> = lines.iter().map(|l| l.config_epoch).collect();
        if epochs.len() == 3 {
            Ok(())
        } else {
            Err(format!("{lines:?}"))
        }
    });
    wait_for("the same current epoch everywhere", CONVERGE, || {
        let e: Vec<String> = [&a, &b, &c3]
            .iter()
            .map(|n| n.info_field("cluster_current_epoch"))
            .collect();
        let max_cfg = a.nodes().iter().map(|l| l.config_epoch).max().unwrap();
        if e.iter().all(|x| *x == max_cfg.to_string()) {
            Ok(())
        } else {
            Err(format!("current epochs {e:?}, max config epoch {max_cfg}"))
        }
    });

    // Once another node is known, the epoch can't be set by hand.
    assert_eq!(
        ac.cmd(&["CLUSTER", "SET-CONFIG-EPOCH", "100"]),
        err("ERR The user can assign a config epoch only when the node does not know any other node.")
    );

    // CLUSTER LINKS: a link to and a link from each peer.
    wait_for(
        "CLUSTER LINKS on A: to and from both peers",
        CONVERGE,
        || {
            let links = ac.cmd(&["CLUSTER", "LINKS"]);
            let mut seen = HashSet::new();
            for l in links.as_array().ok_or(format!("{links}"))? {
                let m = flat_map(l);
                for f in [
                    "direction",
                    "node",
                    "create-time",
                    "events",
                    "send-buffer-allocated",
                    "send-buffer-used",
                ] {
                    if !m.contains_key(f) {
                        return Err(format!("link without {f}: {l}"));
                    }
                }
                seen.insert((
                    m["direction"].as_string().unwrap(),
                    m["node"].as_string().unwrap(),
                ));
            }
            let want: HashSet<(String, String)> = ids[1..]
                .iter()
                .flat_map(|id| {
                    [
                        ("to".to_string(), id.clone()),
                        ("from".to_string(), id.clone()),
                    ]
                })
                .collect();
            if seen == want {
                Ok(())
            } else {
                Err(format!("{links}"))
            }
        },
    );

    // Statistics of the bus messages count up.
    wait_for("cluster_stats_messages_sent/received > 0", CONVERGE, || {
        let i = a.info();
        let sent: u64 = i["cluster_stats_messages_sent"].parse().unwrap();
        let recv: u64 = i["cluster_stats_messages_received"].parse().unwrap();
        let ping = i.contains_key("cluster_stats_messages_ping_sent");
        if sent > 0 && recv > 0 && ping {
            Ok(())
        } else {
            Err(format!("{i:?}"))
        }
    });
    assert_eq!(
        ac.cmd(&["CLUSTER", "COUNT-FAILURE-REPORTS", &ids[1]]),
        int(0)
    );

    // FORGET: gone from A's table at once (and, for 60 s, not re-added by gossip).
    assert_eq!(ac.cmd(&["CLUSTER", "FORGET", &ids[2]]), Resp::ok());
    let lines = a.nodes();
    assert!(
        lines.iter().all(|l| l.id != ids[2]),
        "C still listed after FORGET: {lines:?}"
    );
    assert_eq!(a.info_field("cluster_known_nodes"), "2");
}

#[test]
fn moved_between_two_masters() {
    let (a, b) = two_masters();
    let (mut ac, mut bc) = (a.c(), b.c());
    for n in [&a, &b] {
        let i = n.info();
        assert_eq!(i["cluster_size"], "2", "{i:?}");
        assert_eq!(i["cluster_known_nodes"], "2", "{i:?}");
        assert_eq!(i["cluster_slots_assigned"], "16384", "{i:?}");
    }
    let foo = key_slot(b"foo"); // 12182, B's
    let bar = key_slot(b"bar"); // 5061, A's
    assert_eq!((foo, bar), (12182, 5061));

    // Keys of the other node's slots: -MOVED <slot> <ip>:<port>, reads and writes alike.
    assert_eq!(ac.cmd(&["GET", "foo"]), moved(foo, b.port()));
    assert_eq!(ac.cmd(&["SET", "foo", "1"]), moved(foo, b.port()));
    assert_eq!(ac.cmd(&["MGET", "foo", "{foo}x"]), moved(foo, b.port()));
    assert_eq!(
        ac.cmd(&["EVAL", "return 1", "1", "foo"]),
        moved(foo, b.port())
    );
    assert_eq!(bc.cmd(&["GET", "bar"]), moved(bar, a.port()));
    assert_eq!(bc.cmd(&["SET", "{user1000}x", "1"]), moved(3443, a.port()));
    // READONLY changes nothing on a master.
    assert_eq!(ac.cmd(&["READONLY"]), Resp::ok());
    assert_eq!(ac.cmd(&["GET", "foo"]), moved(foo, b.port()));
    assert_eq!(ac.cmd(&["READWRITE"]), Resp::ok());
    // Keys of two slots: CROSSSLOT even when both slots live elsewhere.
    assert_eq!(ac.cmd(&["MGET", "foo", "a"]), err(CROSSSLOT));
    // Own keys are served.
    assert_eq!(ac.cmd(&["SET", "bar", "x"]), Resp::ok());
    assert_eq!(bc.cmd(&["SET", "foo", "y"]), Resp::ok());
    assert_eq!(ac.cmd(&["GET", "bar"]), Resp::bulk("x"));
    assert_eq!(bc.cmd(&["GET", "foo"]), Resp::bulk("y"));

    // MULTI: a command for another node is refused when queued, EXEC aborts.
    assert_eq!(ac.cmd(&["MULTI"]), Resp::ok());
    assert_eq!(ac.cmd(&["SET", "bar", "z"]), Resp::simple("QUEUED"));
    assert_eq!(ac.cmd(&["SET", "foo", "z"]), moved(foo, b.port()));
    assert_eq!(ac.cmd(&["EXEC"]), err(EXECABORT));
    assert_eq!(ac.cmd(&["GET", "bar"]), Resp::bulk("x"));

    // A script may not reach a key of a slot served elsewhere.
    let r = ac.cmd(&["EVAL", "return redis.call('GET', 'foo')", "0"]);
    assert_err_prefix(
        &r,
        "ERR Script attempted to access a non local key in a cluster node script",
    );

    // CLUSTER SLOTS / SHARDS describe both.
    let slots = ac.cmd(&["CLUSTER", "SLOTS"]);
    let mut seen: Vec<(i64, i64, i64, String)> = Vec::new();
    for e in slots.as_array().unwrap() {
        let e = e.as_array().unwrap();
        let m = e[2].as_array().unwrap();
        assert_eq!(m[0], Resp::bulk("127.0.0.1"), "{slots}");
        seen.push((
            e[0].as_int().unwrap(),
            e[1].as_int().unwrap(),
            m[1].as_int().unwrap(),
            m[2].as_string().unwrap(),
        ));
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (0, 8191, a.port() as i64, a.id()),
            (8192, 16383, b.port() as i64, b.id())
        ]
    );
    let shards = bc.cmd(&["CLUSTER", "SHARDS"]);
    let mut by_port = BTreeMap::new();
    for s in shards.as_array().unwrap() {
        let s = flat_map(s);
        let nodes = s["nodes"].as_array().unwrap().to_vec();
        assert_eq!(nodes.len(), 1, "{shards}");
        let node = flat_map(&nodes[0]);
        assert_eq!(node["ip"], Resp::bulk("127.0.0.1"), "{shards}");
        assert_eq!(node["endpoint"], Resp::bulk("127.0.0.1"), "{shards}");
        assert_eq!(node["role"], Resp::bulk("master"), "{shards}");
        assert_eq!(node["health"], Resp::bulk("online"), "{shards}");
        by_port.insert(node["port"].as_int().unwrap(), s["slots"].clone());
    }
    assert_eq!(
        by_port[&(a.port() as i64)],
        Resp::Array(vec![int(0), int(8191)])
    );
    assert_eq!(
        by_port[&(b.port() as i64)],
        Resp::Array(vec![int(8192), int(16383)])
    );

    // Own-slot errors with another node known.
    let idb = b.id();
    assert_eq!(
        ac.cmd(&["CLUSTER", "REPLICATE", &idb]),
        err("ERR To set a master the node must be empty and without assigned slots.")
    );
    assert_eq!(
        ac.cmd(&["CLUSTER", "SETSLOT", &foo.to_string(), "MIGRATING", &idb]),
        err(&format!("ERR I'm not the owner of hash slot {foo}"))
    );
    assert_eq!(
        ac.cmd(&["CLUSTER", "ADDSLOTS", &foo.to_string()]),
        err(&format!("ERR Slot {foo} is already busy"))
    );
    // SETSLOT NODE may not give away a slot that still holds keys here.
    assert_eq!(
        ac.cmd(&["CLUSTER", "SETSLOT", &bar.to_string(), "NODE", &idb]),
        err(&format!(
            "ERR Can't assign hashslot {bar} to a different node while I still hold keys for this hash slot."
        ))
    );
}

#[test]
fn delslots_then_addslots_on_another_node_moves_the_slot() {
    let (a, b) = two_masters();
    let (mut ac, mut bc) = (a.c(), b.c());
    // Slot 100 of A, empty, handed to B by hand.
    let key = key_in_slot(100, "k");
    assert_eq!(ac.cmd(&["GET", &key]), Resp::NullBulk);
    assert_eq!(ac.cmd(&["CLUSTER", "DELSLOTS", "100"]), Resp::ok());
    assert_eq!(ac.cmd(&["GET", &key]), err(NOT_SERVED));
    // DELSLOTS is local: B still has slot 100 on A, and refuses to take it.
    assert_eq!(bc.cmd(&["GET", &key]), moved(100, a.port()));
    assert_eq!(
        bc.cmd(&["CLUSTER", "ADDSLOTS", "100"]),
        err("ERR Slot 100 is already busy")
    );
    assert_eq!(bc.cmd(&["CLUSTER", "DELSLOTS", "100"]), Resp::ok());
    assert_eq!(bc.cmd(&["GET", &key]), err(NOT_SERVED));
    assert_eq!(bc.cmd(&["CLUSTER", "ADDSLOTS", "100"]), Resp::ok());
    assert_eq!(bc.cmd(&["SET", &key, "v"]), Resp::ok());
    // A learns the new owner from B's gossip (B's claim with its config epoch) and
    // redirects.
    wait_for("A to redirect slot 100 to B", CONVERGE, || {
        let r = a.c().cmd(&["GET", &key]);
        if r == moved(100, b.port()) {
            Ok(())
        } else {
            Err(format!("{r}"))
        }
    });
    let idb = b.id();
    wait_for("A's CLUSTER NODES to show 100 on B", CONVERGE, || {
        let l = a.nodes().into_iter().find(|l| l.id == idb).unwrap();
        if l.slots == ["100", "8192-16383"] {
            Ok(())
        } else {
            Err(l.raw)
        }
    });
    assert_eq!(a.myself().slots, ["0-99", "101-8191"]);
    a.wait_state_ok();
    b.wait_state_ok();
}

#[test]
fn ask_redirections_during_a_slot_migration() {
    let (a, b) = two_masters();
    let (mut ac, mut bc) = (a.c(), b.c());
    let (ida, idb) = (a.id(), b.id());
    let slot = key_slot(b"foo"); // B's, moving to A
    let s = slot.to_string();
    assert_eq!(bc.cmd(&["SET", "foo", "bar"]), Resp::ok());
    assert_eq!(bc.cmd(&["SET", "{foo}k2", "v2"]), Resp::ok());

    assert_eq!(
        bc.cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &ida]),
        err(&format!("ERR I'm already the owner of hash slot {slot}"))
    );
    assert_eq!(
        ac.cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", NO_SUCH_ID]),
        err(&format!("ERR I don't know about node {NO_SUCH_ID}"))
    );
    assert_eq!(
        ac.cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &idb]),
        Resp::ok()
    );
    assert_eq!(
        bc.cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &ida]),
        Resp::ok()
    );
    // The markers in CLUSTER NODES' myself lines.
    let marker_b = format!("[{slot}->-{ida}]");
    let marker_a = format!("[{slot}-<-{idb}]");
    assert!(b.myself().slots.contains(&marker_b), "{}", b.myself().raw);
    assert!(a.myself().slots.contains(&marker_a), "{}", a.myself().raw);

    // On the source: existing keys served, missing ones -ASK to the target.
    assert_eq!(bc.cmd(&["GET", "foo"]), Resp::bulk("bar"));
    assert_eq!(bc.cmd(&["GET", "{foo}missing"]), ask(slot, a.port()));
    assert_eq!(bc.cmd(&["SET", "{foo}new", "1"]), ask(slot, a.port()));
    assert_eq!(
        bc.cmd(&["MGET", "foo", "{foo}k2"]),
        Resp::Array(vec![Resp::bulk("bar"), Resp::bulk("v2")])
    );
    assert_eq!(bc.cmd(&["MGET", "foo", "{foo}missing"]), err(TRYAGAIN));
    // On the target: -MOVED to the owner unless the command follows ASKING (once).
    assert_eq!(ac.cmd(&["GET", "{foo}missing"]), moved(slot, b.port()));
    assert_eq!(ac.cmd(&["ASKING"]), Resp::ok());
    assert_eq!(ac.cmd(&["GET", "{foo}missing"]), Resp::NullBulk);
    assert_eq!(ac.cmd(&["GET", "{foo}missing"]), moved(slot, b.port()));
    assert_eq!(ac.cmd(&["ASKING"]), Resp::ok());
    assert_eq!(ac.cmd(&["SET", "{foo}new", "1"]), Resp::ok());

    // MIGRATE ... KEYS moves the keys; the source then asks for them too.
    let port_a = a.port().to_string();
    assert_eq!(
        bc.cmd(&[
            "MIGRATE",
            "127.0.0.1",
            &port_a,
            "",
            "0",
            "5000",
            "KEYS",
            "foo"
        ]),
        Resp::ok()
    );
    assert_eq!(bc.cmd(&["GET", "foo"]), ask(slot, a.port()));
    assert_eq!(bc.cmd(&["MGET", "foo", "{foo}k2"]), err(TRYAGAIN));
    assert_eq!(ac.cmd(&["ASKING"]), Resp::ok());
    assert_eq!(ac.cmd(&["MGET", "foo", "{foo}k2"]), err(TRYAGAIN));
    assert_eq!(ac.cmd(&["ASKING"]), Resp::ok());
    assert_eq!(ac.cmd(&["GET", "foo"]), Resp::bulk("bar"));
    assert_eq!(
        bc.cmd(&[
            "MIGRATE",
            "127.0.0.1",
            &port_a,
            "",
            "0",
            "5000",
            "KEYS",
            "{foo}k2"
        ]),
        Resp::ok()
    );
    assert_eq!(bc.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &s]), int(0));
    assert_eq!(ac.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &s]), int(3));
    assert_eq!(
        bc.cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "10"]),
        Resp::Array(vec![])
    );

    // SETSLOT NODE on both ends the migration: A owns the slot (with a new epoch).
    assert_eq!(
        ac.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &ida]),
        Resp::ok()
    );
    assert_eq!(
        bc.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &ida]),
        Resp::ok()
    );
    assert_eq!(bc.cmd(&["GET", "foo"]), moved(slot, a.port()));
    assert_eq!(ac.cmd(&["GET", "foo"]), Resp::bulk("bar"));
    assert_eq!(ac.cmd(&["GET", "{foo}new"]), Resp::bulk("1"));
    let me_a = a.myself();
    // The importing node takes the greatest config epoch (bumping its own unless it has
    // it already), so that its claim wins.
    let b_seen = a.nodes().into_iter().find(|l| l.id == idb).unwrap();
    assert!(
        me_a.config_epoch > b_seen.config_epoch,
        "the importing node's epoch must be the greatest: {} / {}",
        me_a.raw,
        b_seen.raw
    );
    assert_eq!(me_a.slots, ["0-8191", s.as_str()], "{}", me_a.raw);
    let me_b = b.myself();
    assert_eq!(
        me_b.slots,
        ["8192-12181".to_string(), "12183-16383".to_string()],
        "{}",
        me_b.raw
    );
    // Both agree, and stay ok.
    wait_for("B to see A with the migrated slot", CONVERGE, || {
        let l = b.nodes().into_iter().find(|l| l.id == ida).unwrap();
        if l.slots == ["0-8191", s.as_str()] {
            Ok(())
        } else {
            Err(l.raw)
        }
    });
    a.wait_state_ok();
    b.wait_state_ok();

    // SETSLOT STABLE clears a marker that was set.
    assert_eq!(
        ac.cmd(&["CLUSTER", "SETSLOT", "9000", "IMPORTING", &idb]),
        Resp::ok()
    );
    assert!(a.myself().slots.contains(&format!("[9000-<-{idb}]")));
    assert_eq!(
        ac.cmd(&["CLUSTER", "SETSLOT", "9000", "STABLE"]),
        Resp::ok()
    );
    assert!(
        a.myself().slots.iter().all(|x| !x.starts_with('[')),
        "{}",
        a.myself().raw
    );
}

#[test]
fn replica_follows_its_master_and_serves_readonly() {
    let a = Node::start(&[]);
    let b = Node::start(&[]);
    let mut ac = a.c();
    assert_eq!(
        ac.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Resp::ok()
    );
    a.meet(&b);
    wait_all_know_each_other(&[&a, &b]);
    let (ida, idb) = (a.id(), b.id());
    let mut bc = b.c();
    assert_eq!(bc.cmd(&["CLUSTER", "REPLICATE", &ida]), Resp::ok());
    wait_for("B to be a replica of A (both views)", CONVERGE, || {
        let mb = b.myself();
        let seen_by_a = a.nodes().into_iter().find(|l| l.id == idb).unwrap();
        if mb.flags == ["myself", "slave"]
            && mb.master == ida
            && seen_by_a.flags == ["slave"]
            && seen_by_a.master == ida
        {
            Ok(())
        } else {
            Err(format!("{} / {}", mb.raw, seen_by_a.raw))
        }
    });
    wait_for(
        "B's INFO replication: role:slave, link up",
        CONVERGE,
        || {
            let i = parse_fields(&text(&b.cmd(&["INFO", "replication"]), "INFO replication"));
            if i.get("role").map(String::as_str) == Some("slave")
                && i.get("master_port") == Some(&a.port().to_string())
                && i.get("master_link_status").map(String::as_str) == Some("up")
            {
                Ok(())
            } else {
                Err(format!("{i:?}"))
            }
        },
    );
    a.wait_state_ok();
    b.wait_state_ok();

    for i in 0..50 {
        assert_eq!(
            ac.cmd(&["SET", &format!("key:{i}"), &i.to_string()]),
            Resp::ok()
        );
    }
    let last = "key:49";
    let slot = key_slot(last.as_bytes());
    // Without READONLY a replica redirects reads (and always writes) to its master.
    assert_eq!(bc.cmd(&["GET", last]), moved(slot, a.port()));
    assert_eq!(bc.cmd(&["READONLY"]), Resp::ok());
    wait_for("the replica to have every key", CONVERGE, || {
        for i in 0..50 {
            let r = bc.cmd(&["GET", &format!("key:{i}")]);
            if r != Resp::bulk(i.to_string()) {
                return Err(format!("key:{i} -> {r}"));
            }
        }
        Ok(())
    });
    // READONLY holds for as long as the connection lives, also when Kite moves it to the
    // thread that holds the keys it keeps using (a run of reads of one key on each slot
    // parity: at --threads 2 one of the two is on another thread).
    for parity in [0, 1] {
        let k = (0..50)
            .map(|i| format!("key:{i}"))
            .find(|k| key_slot(k.as_bytes()) % 2 == parity)
            .expect("a key of each slot parity");
        let want = Resp::bulk(&k[4..]);
        for _ in 0..200 {
            assert_eq!(bc.cmd(&["GET", &k]), want, "GET {k} with READONLY");
        }
    }
    assert_eq!(bc.cmd(&["SET", last, "x"]), moved(slot, a.port()));
    assert_eq!(bc.cmd(&["READWRITE"]), Resp::ok());
    assert_eq!(bc.cmd(&["GET", last]), moved(slot, a.port()));

    // CLUSTER SLOTS lists the replica after the master; SHARDS gives it role replica.
    wait_for("CLUSTER SLOTS on A to list the replica", CONVERGE, || {
        let slots = a.cmd(&["CLUSTER", "SLOTS"]);
        let e = slots
            .as_array()
            .and_then(|x| x.first())
            .and_then(|e| e.as_array())
            .map(|e| e.to_vec());
        match e {
            Some(e)
                if e.len() == 4
                    && e[2].as_array().map(|m| m[2].clone()) == Some(Resp::bulk(&ida))
                    && e[3].as_array().map(|m| (m[1].clone(), m[2].clone()))
                        == Some((int(b.port() as i64), Resp::bulk(&idb))) =>
            {
                Ok(())
            }
            _ => Err(format!("{slots}")),
        }
    });
    let shards = a.cmd(&["CLUSTER", "SHARDS"]);
    let shards = shards.as_array().unwrap().to_vec();
    assert_eq!(
        shards.len(),
        1,
        "master and replica make one shard: {shards:?}"
    );
    let nodes = flat_map(&shards[0])["nodes"].as_array().unwrap().to_vec();
    let roles: BTreeMap<String, Resp> = nodes
        .iter()
        .map(|n| {
            let m = flat_map(n);
            (m["id"].as_string().unwrap(), m["role"].clone())
        })
        .collect();
    assert_eq!(roles[&ida], Resp::bulk("master"));
    assert_eq!(roles[&idb], Resp::bulk("replica"));

    // Redis 7.2: a replica is in its master's shard.
    if !redis_before_72(&mut ac) {
        let sa = text(&ac.cmd(&["CLUSTER", "MYSHARDID"]), "MYSHARDID");
        wait_for(
            "the replica's MYSHARDID to be its master's",
            CONVERGE,
            || {
                let sb = text(&b.cmd(&["CLUSTER", "MYSHARDID"]), "MYSHARDID");
                if sb == sa {
                    Ok(())
                } else {
                    Err(format!("{sb} != {sa}"))
                }
            },
        );
    }
    // A replica with data can't be given slots; a master can't follow itself.
    assert_eq!(
        bc.cmd(&["CLUSTER", "REPLICATE", &idb]),
        err("ERR Can't replicate myself")
    );
    assert_eq!(ac.cmd(&["CLUSTER", "COUNT-FAILURE-REPORTS", &idb]), int(0));
}

/// A client blocked on a key whose slot moves to another node is answered with the
/// redirection (Redis's clusterRedirectBlockedClientIfNeeded), so a queue worker finds
/// the new owner instead of waiting on a node that will never see a push.
#[test]
fn blocked_client_is_redirected_when_its_slot_moves() {
    let (a, b) = two_masters();
    let key = key_in_slot(100, "queue");
    let slot = key_slot(key.as_bytes());
    let mut blocked = a.c();
    blocked.send(&["BLPOP", &key, "0"]);
    let mut ac = a.c();
    wait_for("the BLPOP to block", CONVERGE, || {
        let info = text(&ac.cmd(&["INFO", "clients"]), "INFO clients");
        match parse_fields(&info)
            .get("blocked_clients")
            .map(String::as_str)
        {
            Some("1") => Ok(()),
            other => Err(format!("blocked_clients {other:?}")),
        }
    });
    // The slot (empty) moves from A to B, as redis-cli --cluster reshard ends a move.
    let idb = b.id();
    let s = slot.to_string();
    assert_eq!(
        b.cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &a.id()]),
        Resp::ok()
    );
    assert_eq!(
        ac.cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &idb]),
        Resp::ok()
    );
    assert_eq!(b.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &idb]), Resp::ok());
    assert_eq!(
        ac.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &idb]),
        Resp::ok()
    );
    blocked.set_timeout(Some(CONVERGE));
    assert_eq!(blocked.read(), moved(slot, b.port()));
    // And the key is B's now.
    assert_eq!(ac.cmd(&["LPUSH", &key, "job"]), moved(slot, b.port()));
    assert_eq!(b.cmd(&["LPUSH", &key, "job"]), int(1));
}

/// A master that gives its last slot away becomes a replica of the node that took it
/// (cluster-allow-replica-migration, on by default), as `redis-cli --cluster reshard`
/// emptying a master leaves it in Redis 7.
#[test]
fn master_emptied_by_setslot_node_becomes_a_replica() {
    let a = Node::start(&[]);
    let b = Node::start(&[]);
    a.meet(&b);
    wait_all_know_each_other(&[&a, &b]);
    assert_eq!(a.cmd(&["CLUSTER", "ADDSLOTS", "0"]), Resp::ok());
    assert_eq!(
        b.cmd(&["CLUSTER", "ADDSLOTSRANGE", "1", "16383"]),
        Resp::ok()
    );
    let (ida, idb) = (a.id(), b.id());
    wait_for("B to see A with slot 0", CONVERGE, || {
        let seen = b.nodes().into_iter().find(|l| l.id == ida).unwrap();
        if seen.slots == ["0"] {
            Ok(())
        } else {
            Err(seen.raw)
        }
    });
    assert_eq!(
        b.cmd(&["CLUSTER", "SETSLOT", "0", "IMPORTING", &ida]),
        Resp::ok()
    );
    assert_eq!(
        a.cmd(&["CLUSTER", "SETSLOT", "0", "MIGRATING", &idb]),
        Resp::ok()
    );
    assert_eq!(
        b.cmd(&["CLUSTER", "SETSLOT", "0", "NODE", &idb]),
        Resp::ok()
    );
    // B's new claim (it bumps its epoch and tells everyone) may reach A first, which
    // then already follows B: redis-cli tolerates exactly this refusal.
    let r = a.cmd(&["CLUSTER", "SETSLOT", "0", "NODE", &idb]);
    assert!(
        r == Resp::ok() || r == err("ERR Please use SETSLOT only with masters."),
        "{r}"
    );
    wait_for("A to be B's replica", CONVERGE, || {
        let me = a.myself();
        if me.flags == ["myself", "slave"] && me.master == idb {
            Ok(())
        } else {
            Err(me.raw)
        }
    });
    // The emptied node can no longer take SETSLOT, as a replica.
    assert_eq!(
        a.cmd(&["CLUSTER", "SETSLOT", "0", "NODE", &idb]),
        err("ERR Please use SETSLOT only with masters.")
    );
}
