//! `cluster-config-file` in Redis's format: one CLUSTER NODES line per node (this node's
//! line also lists the slots it is migrating and importing), then
//! `vars currentEpoch N lastVoteEpoch M`. Written whole to a temporary file, synced and
//! renamed over the old one, so a crash leaves the old file or the new one.

use std::io::Write;
use std::path::Path;

use super::state::{flags, parse_name, Name, Node, State};
use super::SLOTS;

pub fn render(st: &State) -> String {
    let mut names: Vec<&Name> = st.nodes.keys().collect();
    names.sort_by_key(|n| (**n != st.myself, **n));
    let now = super::now_ms();
    let mut out = String::new();
    for name in names {
        let n = &st.nodes[name];
        // Nodes still in handshake have no real name yet: Redis does not save them.
        if n.has(flags::HANDSHAKE) {
            continue;
        }
        out.push_str(&st.describe(n, true, now));
        out.push('\n');
    }
    out.push_str(&format!(
        "vars currentEpoch {} lastVoteEpoch {}\n",
        st.current_epoch, st.last_vote_epoch
    ));
    out
}

pub fn save(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(
        "{}.tmp-{}",
        path.file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("nodes.conf"),
        std::process::id()
    ));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Reads a config file into a state. Ok(None) when the file does not exist or is empty
/// (a new node); Err with Redis's complaint when it cannot be understood.
pub fn load(path: &Path) -> Result<Option<State>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("Can't open {}: {e}", path.display())),
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    let bad = |line: &str| {
        format!(
            "Unrecoverable error: corrupted cluster config file \"{}\".",
            line.trim()
        )
    };
    let mut nodes: Vec<Node> = Vec::new();
    let mut myself = None;
    let mut vars = (0u64, 0u64);
    let mut migrating = Vec::new();
    let mut importing = Vec::new();
    let mut slots: Vec<(usize, Name)> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if f[0] == "vars" {
            let mut i = 1;
            while i + 1 < f.len() {
                let v = f[i + 1].parse().map_err(|_| bad(line))?;
                match f[i] {
                    "currentEpoch" => vars.0 = v,
                    "lastVoteEpoch" => vars.1 = v,
                    _ => {}
                }
                i += 2;
            }
            continue;
        }
        if f.len() < 8 {
            return Err(bad(line));
        }
        let name = parse_name(f[0].as_bytes()).ok_or_else(|| bad(line))?;
        let mut n = Node::new(name, 0);
        parse_addr(&mut n, f[1]).ok_or_else(|| bad(line))?;
        for w in f[2].split(',') {
            n.flags |= match w {
                "myself" => flags::MYSELF,
                "master" => flags::MASTER,
                "slave" => flags::REPLICA,
                "fail?" => flags::PFAIL,
                "fail" => flags::FAIL,
                "handshake" => flags::HANDSHAKE,
                "noaddr" => flags::NOADDR,
                "nofailover" => flags::NOFAILOVER,
                _ => 0,
            };
        }
        if n.has(flags::MYSELF) {
            myself = Some(name);
        }
        if f[3] != "-" {
            n.master = Some(parse_name(f[3].as_bytes()).ok_or_else(|| bad(line))?);
        }
        n.config_epoch = f[6].parse().map_err(|_| bad(line))?;
        for s in &f[8..] {
            if let Some(inner) = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                if let Some((slot, to)) = inner.split_once("->-") {
                    let slot: usize = slot.parse().map_err(|_| bad(line))?;
                    migrating.push((slot, parse_name(to.as_bytes()).ok_or_else(|| bad(line))?));
                } else if let Some((slot, from)) = inner.split_once("-<-") {
                    let slot: usize = slot.parse().map_err(|_| bad(line))?;
                    importing.push((slot, parse_name(from.as_bytes()).ok_or_else(|| bad(line))?));
                } else {
                    return Err(bad(line));
                }
                continue;
            }
            let (a, b) = match s.split_once('-') {
                Some((a, b)) => (a.parse::<usize>(), b.parse::<usize>()),
                None => (s.parse::<usize>(), s.parse::<usize>()),
            };
            let (Ok(a), Ok(b)) = (a, b) else {
                return Err(bad(line));
            };
            if a > b || b >= SLOTS {
                return Err(bad(line));
            }
            for slot in a..=b {
                slots.push((slot, name));
            }
        }
        nodes.push(n);
    }
    let Some(me) = myself else {
        return Err("Unrecoverable error: corrupted cluster config file: no myself line.".into());
    };
    let mut st = State::new(me);
    st.nodes.clear();
    for mut n in nodes {
        // Links are made afresh; failure flags are re-learnt from the cluster.
        n.flags &= !(flags::PFAIL | flags::HANDSHAKE | flags::MEET);
        st.nodes.insert(n.name, n);
    }
    for (slot, name) in slots {
        st.assign(slot, name);
    }
    for (slot, to) in migrating {
        st.migrating_to.insert(slot, to);
    }
    for (slot, from) in importing {
        st.importing_from.insert(slot, from);
    }
    st.current_epoch = vars.0.max(st.max_config_epoch());
    st.last_vote_epoch = vars.1;
    Ok(Some(st))
}

/// `ip:port@cport[,hostname][,aux=value...]`, the 7.0 and 7.2 forms.
pub fn parse_addr(n: &mut Node, s: &str) -> Option<()> {
    let mut parts = s.split(',');
    let main = parts.next()?;
    let (ipport, cport) = main.split_once('@')?;
    let (ip, port) = ipport.rsplit_once(':')?;
    n.ip = ip.to_string();
    n.port = port.parse().ok()?;
    n.cport = cport.parse().ok()?;
    for p in parts {
        match p.split_once('=') {
            None => n.hostname = p.to_string(),
            Some(("shard-id", v)) => {
                if let Some(id) = parse_name(v.as_bytes()) {
                    n.shard_id = id;
                }
            }
            Some(("nodename", v)) => n.human_name = v.to_string(),
            Some(("tls-port", v)) => n.pport = v.parse().unwrap_or(0),
            Some(("tcp-port", v)) => n.pport = v.parse().unwrap_or(0),
            Some(_) => {}
        }
    }
    Some(())
}
