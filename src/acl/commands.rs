//! ACL's view of the command table: one id per command and per subcommand (the bit a
//! selector keeps for it), its categories and the keys it reads or writes.

use std::sync::OnceLock;

use bytes::Bytes;

use super::tables;
use crate::commands::{flags, table, Command};

/// Redis's categories, in the order ACL CAT lists them.
pub const CATEGORIES: &[&str] = &[
    "keyspace",
    "read",
    "write",
    "set",
    "sortedset",
    "list",
    "hash",
    "string",
    "bitmap",
    "hyperloglog",
    "geo",
    "stream",
    "pubsub",
    "admin",
    "fast",
    "slow",
    "blocking",
    "dangerous",
    "connection",
    "transaction",
    "scripting",
];

pub fn category_bit(name: &str) -> Option<u32> {
    let lower = name.to_ascii_lowercase();
    CATEGORIES
        .iter()
        .position(|c| *c == lower)
        .map(|i| 1u32 << i)
}

fn cat(name: &str) -> u32 {
    category_bit(name).unwrap_or(0)
}

/// What ACL knows of one command or subcommand.
pub struct Entry {
    /// `get`, or `config|get`.
    pub full_name: &'static str,
    pub categories: u32,
    /// The container's ACL id, for a subcommand.
    pub parent: Option<usize>,
    /// Reads and writes per key position; the last entry covers the remaining keys.
    pub key_access: Vec<(bool, bool)>,
    pub no_auth: bool,
}

pub struct AclCommands {
    pub entries: Vec<Entry>,
    /// The ACL id of each command of the table (by `Command::id`); its subcommands
    /// follow it, in the order of `Command::subcommands`.
    base: Vec<usize>,
}

static IDS: OnceLock<AclCommands> = OnceLock::new();

pub fn acl_commands() -> &'static AclCommands {
    IDS.get_or_init(build)
}

fn implied(flag_words: &[&str], explicit: u32) -> u32 {
    let mut c = explicit;
    let has = |w: &str| flag_words.contains(&w);
    if has("write") {
        c |= cat("write");
    }
    if has("readonly") && explicit & cat("scripting") == 0 {
        c |= cat("read");
    }
    if has("admin") {
        c |= cat("admin") | cat("dangerous");
    }
    if has("pubsub") {
        c |= cat("pubsub");
    }
    if has("fast") {
        c |= cat("fast");
    }
    if has("blocking") {
        c |= cat("blocking");
    }
    if c & cat("fast") == 0 {
        c |= cat("slow");
    }
    c
}

fn explicit_categories(full: &str) -> u32 {
    tables::EXPLICIT
        .iter()
        .find(|(n, _)| *n == full)
        .map_or(0, |(_, cats)| {
            cats.split(' ').map(cat).fold(0, |a, b| a | b)
        })
}

fn key_access(full: &str, readonly: bool) -> Vec<(bool, bool)> {
    match tables::KEY_ACCESS.iter().find(|(n, _)| *n == full) {
        Some((_, specs)) => specs
            .split(' ')
            .map(|s| (s.contains('R'), s.contains('W')))
            .collect(),
        None if readonly => vec![(true, false)],
        None => vec![(true, true)],
    }
}

fn build() -> AclCommands {
    let mut entries = Vec::new();
    let mut base = Vec::new();
    for cmd in &table().commands {
        let words: Vec<&str> = flags::NAMES
            .iter()
            .filter(|(f, _)| cmd.has(*f))
            .map(|(_, n)| *n)
            .collect();
        let id = entries.len();
        base.push(id);
        entries.push(Entry {
            full_name: cmd.name,
            categories: implied(&words, explicit_categories(cmd.name)),
            parent: None,
            key_access: key_access(cmd.name, cmd.has(flags::READONLY)),
            no_auth: cmd.has(flags::NO_AUTH),
        });
        for (sub, _, sub_flags) in cmd.subcommands {
            let full: &'static str = Box::leak(format!("{}|{}", cmd.name, sub).into_boxed_str());
            let words: Vec<&str> = sub_flags.split_whitespace().collect();
            entries.push(Entry {
                full_name: full,
                categories: implied(&words, explicit_categories(full)),
                parent: Some(id),
                key_access: key_access(full, words.contains(&"readonly")),
                no_auth: words.contains(&"no_auth"),
            });
        }
    }
    AclCommands { entries, base }
}

impl AclCommands {
    /// The categories of a command (or of its subcommand `sub`), as `@name`s in ACL
    /// CAT's order: what COMMAND INFO reports.
    pub fn category_names(&self, cmd: &Command, sub: Option<&str>) -> Vec<String> {
        let base = self.base[cmd.id];
        let id = match sub {
            None => base,
            Some(s) => cmd
                .subcommands
                .iter()
                .position(|(n, _, _)| *n == s)
                .map_or(base, |i| base + 1 + i),
        };
        let bits = self.entries[id].categories;
        CATEGORIES
            .iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .map(|(_, c)| format!("@{c}"))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The id of the command a call runs: its subcommand's when it names a known one.
    pub fn id_of_call(&self, cmd: &Command, args: &[Bytes]) -> usize {
        let base = self.base[cmd.id];
        if cmd.subcommands.is_empty() || args.len() < 2 {
            return base;
        }
        let sub = &args[1];
        match cmd
            .subcommands
            .iter()
            .position(|(n, _, _)| n.as_bytes().eq_ignore_ascii_case(sub))
        {
            Some(i) => base + 1 + i,
            None => base,
        }
    }

    /// The ids a rule names: `get` (the command and its subcommands) or `config|get`.
    /// None for an unknown name; `Err(first_arg)` for `cmd|arg` on a command without
    /// subcommands (Redis's deprecated first-argument rules).
    pub fn lookup_rule(&self, name: &str) -> Option<Result<(usize, usize), (usize, String)>> {
        let lower = name.to_ascii_lowercase();
        match lower.split_once('|') {
            None => {
                let cmd = table().lookup(lower.as_bytes())?;
                let id = self.base[cmd.id];
                Some(Ok((id, id + 1 + cmd.subcommands.len())))
            }
            Some((c, sub)) => {
                let cmd = table().lookup(c.as_bytes())?;
                let id = self.base[cmd.id];
                if cmd.subcommands.is_empty() {
                    return Some(Err((id, sub.to_string())));
                }
                let i = cmd.subcommands.iter().position(|(n, _, _)| *n == sub)?;
                Some(Ok((id + 1 + i, id + 2 + i)))
            }
        }
    }

    /// Whether the ACL id is a subcommand (first arguments of those are refused).
    pub fn is_sub(&self, id: usize) -> bool {
        self.entries[id].parent.is_some()
    }

    /// The children ids of a container command, empty for others.
    pub fn children(&self, id: usize) -> std::ops::Range<usize> {
        let mut end = id + 1;
        while end < self.entries.len() && self.entries[end].parent == Some(id) {
            end += 1;
        }
        id + 1..end
    }
}
