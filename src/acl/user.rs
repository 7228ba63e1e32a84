//! Users and selectors: parsing ACL SETUSER rules, describing them back as ACL LIST and
//! ACL GETUSER show them, and checking one command against them.

use std::collections::HashMap;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::commands::{acl_commands, category_bit};
use crate::commands::util::glob_match;
use crate::commands::Command;

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KeyPattern {
    pub pattern: Vec<u8>,
    pub read: bool,
    pub write: bool,
}

impl KeyPattern {
    fn describe(&self) -> String {
        let p = String::from_utf8_lossy(&self.pattern);
        match (self.read, self.write) {
            (true, true) => format!("~{p}"),
            (true, false) => format!("%R~{p}"),
            _ => format!("%W~{p}"),
        }
    }
}

/// One set of permissions: the root one of a user, or a `( ... )` selector.
#[derive(Clone)]
pub struct Selector {
    /// One bit per ACL command id.
    allowed: Vec<u64>,
    /// Every bit is set (Redis's ALLCOMMANDS): the bitmap need not be read.
    all_commands: bool,
    /// Started from +@all: commands added later would be allowed (Redis's reserved bit).
    future: bool,
    /// `+cmd|arg` for commands without subcommands: the first arguments allowed.
    first_args: HashMap<usize, Vec<String>>,
    /// The command rules in the order given, as ACL LIST repeats them.
    rules: String,
    pub all_keys: bool,
    pub keys: Vec<KeyPattern>,
    pub all_channels: bool,
    pub channels: Vec<Vec<u8>>,
}

/// Why a command was refused.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Denied {
    Command,
    Key,
    Channel,
}

impl Selector {
    fn new() -> Selector {
        Selector {
            allowed: vec![0; acl_commands().len().div_ceil(64)],
            all_commands: false,
            future: false,
            first_args: HashMap::new(),
            rules: String::new(),
            all_keys: false,
            keys: Vec::new(),
            all_channels: false,
            channels: Vec::new(),
        }
    }

    fn bit(&self, id: usize) -> bool {
        self.allowed[id / 64] & (1 << (id % 64)) != 0
    }

    fn set_bit(&mut self, id: usize, on: bool) {
        if on {
            self.allowed[id / 64] |= 1 << (id % 64);
        } else {
            self.allowed[id / 64] &= !(1 << (id % 64));
            self.all_commands = false;
        }
    }

    /// Allows or denies a command with its subcommands.
    fn change(&mut self, id: usize, allow: bool) {
        self.set_bit(id, allow);
        self.first_args.remove(&id);
        for child in acl_commands().children(id) {
            self.set_bit(child, allow);
        }
    }

    /// Keeps the rule text in order: a rule replaces earlier ones for the same name
    /// (and, for a whole command, the rules for its subcommands).
    fn record_rule(&mut self, rule: &str, allow: bool) {
        let rule = rule.to_ascii_lowercase();
        let kept: Vec<&str> = self
            .rules
            .split(' ')
            .filter(|r| !r.is_empty())
            .filter(|r| {
                let body = &r[1..];
                !(body == rule
                    || (body.len() > rule.len()
                        && body.starts_with(rule.as_str())
                        && body.as_bytes()[rule.len()] == b'|'))
            })
            .collect();
        let mut s = kept.join(" ");
        if !s.is_empty() {
            s.push(' ');
        }
        s.push(if allow { '+' } else { '-' });
        s.push_str(&rule);
        self.rules = s;
    }

    fn set_all(&mut self, allow: bool) {
        let fill = if allow { u64::MAX } else { 0 };
        self.allowed.iter_mut().for_each(|w| *w = fill);
        self.all_commands = allow;
        self.future = allow;
        self.rules.clear();
        self.first_args.clear();
    }

    /// Applies one selector rule; the error is Redis's reason text.
    fn apply(&mut self, op: &[u8]) -> Result<(), &'static str> {
        let text = String::from_utf8_lossy(op);
        let lower = text.to_ascii_lowercase();
        match lower.as_str() {
            "allkeys" | "~*" => {
                self.all_keys = true;
                self.keys.clear();
                return Ok(());
            }
            "resetkeys" => {
                self.all_keys = false;
                self.keys.clear();
                return Ok(());
            }
            "allchannels" | "&*" => {
                self.all_channels = true;
                self.channels.clear();
                return Ok(());
            }
            "resetchannels" => {
                self.all_channels = false;
                self.channels.clear();
                return Ok(());
            }
            "allcommands" | "+@all" => {
                self.set_all(true);
                return Ok(());
            }
            "nocommands" | "-@all" => {
                self.set_all(false);
                return Ok(());
            }
            _ => {}
        }
        match op.first() {
            Some(b'~') | Some(b'%') => {
                if self.all_keys {
                    return Err(ERR_KEYS_AFTER_ALL);
                }
                let (read, write, rest) = if op[0] == b'%' {
                    let (mut r, mut w) = (false, false);
                    let mut i = 1;
                    loop {
                        match op.get(i).map(|c| c.to_ascii_uppercase()) {
                            Some(b'R') if !r => r = true,
                            Some(b'W') if !w => w = true,
                            Some(b'~') if r || w => {
                                i += 1;
                                break;
                            }
                            _ => return Err(ERR_SYNTAX),
                        }
                        i += 1;
                    }
                    (r, w, &op[i..])
                } else {
                    (true, true, &op[1..])
                };
                if has_spaces(rest) {
                    return Err(ERR_SYNTAX);
                }
                match self.keys.iter_mut().find(|k| k.pattern == rest) {
                    Some(k) => {
                        k.read |= read;
                        k.write |= write;
                    }
                    None => self.keys.push(KeyPattern {
                        pattern: rest.to_vec(),
                        read,
                        write,
                    }),
                }
                Ok(())
            }
            Some(b'&') => {
                if self.all_channels {
                    return Err(ERR_CHANNELS_AFTER_ALL);
                }
                let rest = &op[1..];
                if has_spaces(rest) {
                    return Err(ERR_SYNTAX);
                }
                if !self.channels.iter().any(|c| c == rest) {
                    self.channels.push(rest.to_vec());
                }
                Ok(())
            }
            Some(b'+') | Some(b'-') if op.get(1) == Some(&b'@') => {
                let allow = op[0] == b'+';
                let bit = category_bit(&lower[2..]).ok_or(ERR_UNKNOWN)?;
                self.record_rule(&lower[1..], allow);
                let ids = acl_commands();
                for id in 0..ids.len() {
                    if ids.entries[id].categories & bit != 0 {
                        self.change(id, allow);
                    }
                }
                Ok(())
            }
            Some(b'+') | Some(b'-') => {
                let allow = op[0] == b'+';
                let name = &lower[1..];
                let ids = acl_commands();
                match ids.lookup_rule(name) {
                    None => Err(ERR_UNKNOWN),
                    Some(Ok((start, _))) => {
                        self.change(start, allow);
                        self.record_rule(ids.entries[start].full_name, allow);
                        Ok(())
                    }
                    Some(Err((id, first_arg))) => {
                        if !allow {
                            return Err(ERR_UNKNOWN);
                        }
                        if ids.is_sub(id) {
                            return Err(ERR_FIRST_ARG_OF_SUB);
                        }
                        if first_arg.is_empty() {
                            return Err(ERR_SYNTAX);
                        }
                        tracing::warn!(
                            "Deprecation warning: Allowing a first arg of an otherwise blocked command is a misuse of ACL and may get disabled in the future (offender: +{name})"
                        );
                        let list = self.first_args.entry(id).or_default();
                        if !list.iter().any(|a| a.eq_ignore_ascii_case(&first_arg)) {
                            list.push(first_arg);
                        }
                        self.record_rule(name, true);
                        Ok(())
                    }
                }
            }
            _ => Err(ERR_SYNTAX),
        }
    }

    /// `+@all -get`: the command rules, as ACL LIST and GETUSER show them.
    fn describe_commands(&self) -> String {
        let mut s = String::from(if self.future { "+@all" } else { "-@all" });
        if !self.rules.is_empty() {
            s.push(' ');
            s.push_str(&self.rules);
        }
        s
    }

    fn describe_keys(&self) -> String {
        if self.all_keys {
            return "~*".into();
        }
        self.keys
            .iter()
            .map(KeyPattern::describe)
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn describe_channels(&self) -> String {
        if self.all_channels {
            return "&*".into();
        }
        self.channels
            .iter()
            .map(|c| format!("&{}", String::from_utf8_lossy(c)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The selector as an ACL LIST fragment: keys, channels, then command rules.
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.all_keys {
            parts.push("~*".to_string());
        } else {
            parts.extend(self.keys.iter().map(KeyPattern::describe));
        }
        if self.all_channels {
            parts.push("&*".into());
        } else {
            parts.push("resetchannels".into());
            parts.extend(
                self.channels
                    .iter()
                    .map(|c| format!("&{}", String::from_utf8_lossy(c))),
            );
        }
        parts.push(self.describe_commands());
        parts.join(" ")
    }

    pub fn key_allowed(&self, key: &[u8], read: bool, write: bool) -> bool {
        self.all_keys
            || self.keys.iter().any(|p| {
                (!read || p.read) && (!write || p.write) && glob_match(&p.pattern, key, false)
            })
    }

    /// A plain channel (PUBLISH, SUBSCRIBE) matches the patterns; a PSUBSCRIBE pattern
    /// must equal one of them.
    pub fn channel_allowed(&self, channel: &[u8], is_pattern: bool) -> bool {
        self.all_channels
            || self.channels.iter().any(|p| {
                if is_pattern {
                    p == channel
                } else {
                    glob_match(p, channel, false)
                }
            })
    }

    /// Checks a call; on a denial also returns the argument at fault (0 for the command).
    fn check(&self, id: usize, cmd: &Command, args: &[Bytes]) -> Result<(), (Denied, usize)> {
        let ids = acl_commands();
        let entry = &ids.entries[id];
        if !self.all_commands && !entry.no_auth && !self.bit(id) {
            let allowed_by_arg = args.len() >= 2
                && self.first_args.get(&id).is_some_and(|l| {
                    l.iter()
                        .any(|a| a.as_bytes().eq_ignore_ascii_case(&args[1]))
                });
            if !allowed_by_arg {
                return Err((Denied::Command, 0));
            }
        }
        if !self.all_keys {
            let access = &entry.key_access;
            for (n, pos) in cmd.key_positions(args).into_iter().enumerate() {
                let (mut read, write) = access[n.min(access.len() - 1)];
                // Redis's SET key spec reads the key only with GET.
                if cmd.name == "set" {
                    read = args[3..].iter().any(|a| a.eq_ignore_ascii_case(b"get"));
                }
                if !self.key_allowed(&args[pos], read, write) {
                    return Err((Denied::Key, pos));
                }
            }
        }
        if !self.all_channels {
            for (pos, is_pattern) in channel_positions(cmd, args) {
                if !self.channel_allowed(&args[pos], is_pattern) {
                    return Err((Denied::Channel, pos));
                }
            }
        }
        Ok(())
    }
}

/// The channel arguments a Pub/Sub command publishes or subscribes to, and whether each
/// is a pattern.
fn channel_positions(cmd: &Command, args: &[Bytes]) -> Vec<(usize, bool)> {
    match cmd.name {
        "publish" | "spublish" if args.len() > 1 => vec![(1, false)],
        "subscribe" | "ssubscribe" => (1..args.len()).map(|i| (i, false)).collect(),
        "psubscribe" => (1..args.len()).map(|i| (i, true)).collect(),
        _ => Vec::new(),
    }
}

fn has_spaces(s: &[u8]) -> bool {
    s.iter().any(|&c| c.is_ascii_whitespace() || c == 0)
}

pub const ERR_SYNTAX: &str = "Syntax error";
pub const ERR_UNKNOWN: &str = "Unknown command or category name in ACL";
const ERR_KEYS_AFTER_ALL: &str = "Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of patterns";
const ERR_CHANNELS_AFTER_ALL: &str = "Adding a pattern after the * pattern (or the 'allchannels' flag) is not valid and does not have any effect. Try 'resetchannels' to start with an empty list of channels";
const ERR_NO_SUCH_PASSWORD: &str =
    "The password you are trying to remove from the user does not exist";
const ERR_BAD_HASH: &str =
    "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters";
const ERR_FIRST_ARG_OF_SUB: &str = "Allowing first-arg of a subcommand is not supported";

#[derive(Clone)]
pub struct User {
    pub name: String,
    pub enabled: bool,
    pub nopass: bool,
    pub sanitize_payload: bool,
    pub skip_sanitize_payload: bool,
    /// SHA-256 of each password, as lowercase hex.
    pub passwords: Vec<String>,
    /// The root selector first, then the `( ... )` ones.
    pub selectors: Vec<Selector>,
    /// May run anything on any key and channel: the check is skipped.
    pub unrestricted: bool,
}

pub fn hash_password(p: &[u8]) -> String {
    let digest = Sha256::digest(p);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn valid_hash(h: &[u8]) -> bool {
    h.len() == 64 && h.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

impl User {
    /// A new user as ACL SETUSER creates it: off, no passwords, no commands, no keys,
    /// and channels as `acl-pubsub-default` says.
    pub fn new(name: &str, all_channels_by_default: bool) -> User {
        let mut root = Selector::new();
        root.all_channels = all_channels_by_default;
        let mut u = User {
            name: name.to_string(),
            enabled: false,
            nopass: false,
            sanitize_payload: true,
            skip_sanitize_payload: false,
            passwords: Vec::new(),
            selectors: vec![root],
            unrestricted: false,
        };
        u.refresh();
        u
    }

    /// `default` as Redis starts it: on, nopass, every command, key and channel.
    pub fn default_user() -> User {
        let mut u = User::new("default", false);
        for op in ["+@all", "~*", "&*", "on", "nopass"] {
            u.apply(op.as_bytes(), false).expect("built-in rule");
        }
        u.refresh();
        u
    }

    pub fn refresh(&mut self) {
        let root = &self.selectors[0];
        self.unrestricted =
            self.selectors.len() == 1 && root.all_commands && root.all_keys && root.all_channels;
    }

    /// Applies one ACL SETUSER argument (a selector arrives whole, parentheses included).
    pub fn apply(&mut self, op: &[u8], all_channels_by_default: bool) -> Result<(), &'static str> {
        if op.is_empty() {
            return Ok(());
        }
        let lower = String::from_utf8_lossy(op).to_ascii_lowercase();
        match lower.as_str() {
            "on" => self.enabled = true,
            "off" => self.enabled = false,
            "skip-sanitize-payload" => {
                self.skip_sanitize_payload = true;
                self.sanitize_payload = false;
            }
            "sanitize-payload" => {
                self.skip_sanitize_payload = false;
                self.sanitize_payload = true;
            }
            "nopass" => {
                self.nopass = true;
                self.passwords.clear();
            }
            "resetpass" => {
                self.nopass = false;
                self.passwords.clear();
            }
            "clearselectors" => self.selectors.truncate(1),
            "reset" => {
                self.apply(b"resetpass", all_channels_by_default)?;
                self.apply(b"resetkeys", all_channels_by_default)?;
                self.apply(b"resetchannels", all_channels_by_default)?;
                if all_channels_by_default {
                    self.apply(b"allchannels", all_channels_by_default)?;
                }
                self.apply(b"off", all_channels_by_default)?;
                self.apply(b"sanitize-payload", all_channels_by_default)?;
                self.apply(b"clearselectors", all_channels_by_default)?;
                self.apply(b"-@all", all_channels_by_default)?;
            }
            _ => match op[0] {
                b'>' | b'#' => {
                    let hash = if op[0] == b'>' {
                        hash_password(&op[1..])
                    } else {
                        if !valid_hash(&op[1..]) {
                            return Err(ERR_BAD_HASH);
                        }
                        String::from_utf8_lossy(&op[1..]).into_owned()
                    };
                    if !self.passwords.contains(&hash) {
                        self.passwords.push(hash);
                    }
                    self.nopass = false;
                }
                b'<' | b'!' => {
                    let hash = if op[0] == b'<' {
                        hash_password(&op[1..])
                    } else {
                        if !valid_hash(&op[1..]) {
                            return Err(ERR_BAD_HASH);
                        }
                        String::from_utf8_lossy(&op[1..]).into_owned()
                    };
                    let before = self.passwords.len();
                    self.passwords.retain(|p| *p != hash);
                    if self.passwords.len() == before {
                        return Err(ERR_NO_SUCH_PASSWORD);
                    }
                }
                b'(' if op.last() == Some(&b')') => {
                    let mut s = Selector::new();
                    for part in split_args(&op[1..op.len() - 1]) {
                        s.apply(&part)?;
                    }
                    self.selectors.push(s);
                }
                _ => self.selectors[0].apply(op)?,
            },
        }
        self.refresh();
        Ok(())
    }

    pub fn password_ok(&self, pass: &[u8]) -> bool {
        if self.nopass {
            return true;
        }
        let hash = hash_password(pass);
        // Compares every stored hash in full, whatever matched, so timing says nothing.
        self.passwords.iter().fold(false, |found, p| {
            found | constant_time_eq(p.as_bytes(), hash.as_bytes())
        })
    }

    /// The flags ACL LIST and GETUSER show, in Redis's order.
    pub fn flag_names(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        v.push(if self.enabled { "on" } else { "off" });
        if self.nopass {
            v.push("nopass");
        }
        if self.skip_sanitize_payload {
            v.push("skip-sanitize-payload");
        }
        if self.sanitize_payload {
            v.push("sanitize-payload");
        }
        v
    }

    /// The user as an ACL LIST / ACL file line, without the leading `user <name> `.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.flag_names().iter().map(|s| s.to_string()).collect();
        parts.extend(self.passwords.iter().map(|p| format!("#{p}")));
        parts.push(self.selectors[0].describe());
        let mut s = parts.join(" ");
        for sel in &self.selectors[1..] {
            s.push_str(&format!(" ({})", sel.describe()));
        }
        s
    }

    /// Checks a call against every selector: allowed when one allows all of it. The
    /// denial reported is the command when no selector allowed it, else the key or
    /// channel furthest along that some selector refused, as Redis picks it.
    pub fn check(&self, cmd: &Command, args: &[Bytes]) -> Result<(), (Denied, usize)> {
        if self.unrestricted {
            return Ok(());
        }
        let id = acl_commands().id_of_call(cmd, args);
        let mut worst = (Denied::Command, 0);
        for sel in &self.selectors {
            match sel.check(id, cmd, args) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    if e.0 > worst.0 || (e.0 == worst.0 && e.1 > worst.1) {
                        worst = e;
                    }
                }
            }
        }
        Err(worst)
    }

    /// Whether any selector grants this channel (for deciding which subscribers a
    /// change leaves without permission).
    pub fn channel_allowed(&self, channel: &[u8], is_pattern: bool) -> bool {
        self.selectors
            .iter()
            .any(|s| s.channel_allowed(channel, is_pattern))
    }

    /// ACL GETUSER's description of one selector: commands, keys, channels.
    pub fn selector_fields(sel: &Selector) -> [(&'static str, String); 3] {
        [
            ("commands", sel.describe_commands()),
            ("keys", sel.describe_keys()),
            ("channels", sel.describe_channels()),
        ]
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Splits a selector body on spaces (no quoting inside selectors, as in Redis's use of
/// plain space-separated operations).
fn split_args(s: &[u8]) -> Vec<Vec<u8>> {
    s.split(|&c| c == b' ')
        .filter(|p| !p.is_empty())
        .map(|p| p.to_vec())
        .collect()
}

/// Joins `(a`, `b`, `c)` arguments back into one selector argument, as Redis does
/// before applying ACL SETUSER's rules. Err(index) for an unclosed parenthesis.
pub fn merge_selectors(args: &[Bytes]) -> Result<Vec<Vec<u8>>, usize> {
    let mut out = Vec::new();
    let mut open: Option<(usize, Vec<u8>)> = None;
    for (i, a) in args.iter().enumerate() {
        if let Some((_, buf)) = open.as_mut() {
            buf.push(b' ');
            buf.extend_from_slice(a);
            if a.last() == Some(&b')') {
                out.push(open.take().unwrap().1);
            }
            continue;
        }
        if a.first() == Some(&b'(') && a.last() != Some(&b')') {
            open = Some((i, a.to_vec()));
            continue;
        }
        out.push(a.to_vec());
    }
    match open {
        Some((i, _)) => Err(i),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::table;

    fn args(v: &[&str]) -> Vec<Bytes> {
        v.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    fn user(rules: &[&str]) -> User {
        let mut u = User::new("alice", false);
        for r in rules {
            u.apply(r.as_bytes(), false).unwrap();
        }
        u
    }

    fn check(u: &User, a: &[&str]) -> Result<(), (Denied, usize)> {
        let a = args(a);
        let cmd = table().lookup(&a[0]).unwrap();
        u.check(cmd, &a)
    }

    #[test]
    fn rules_and_description() {
        let u = user(&["on", ">pw", "+get", "~foo*", "+@hash", "-hset"]);
        assert_eq!(
            u.describe(),
            format!(
                "on sanitize-payload #{} ~foo* resetchannels -@all +get +@hash -hset",
                hash_password(b"pw")
            )
        );
        assert!(check(&u, &["get", "foo1"]).is_ok());
        assert_eq!(check(&u, &["get", "bar"]), Err((Denied::Key, 1)));
        assert_eq!(check(&u, &["set", "foo", "x"]), Err((Denied::Command, 0)));
        assert_eq!(
            check(&u, &["hset", "foo", "a", "b"]),
            Err((Denied::Command, 0))
        );
        assert!(check(&u, &["hget", "foo", "a"]).is_ok());
        // A later rule for the same command replaces the earlier one in the text.
        let u = user(&["+get", "-get", "+config|get", "-config"]);
        assert_eq!(u.selectors[0].describe_commands(), "-@all -get -config");
    }

    #[test]
    fn read_write_patterns_and_selectors() {
        let u = user(&["+@all", "%R~r*", "%W~w*"]);
        assert!(check(&u, &["get", "r1"]).is_ok());
        assert_eq!(check(&u, &["set", "r1", "v"]), Err((Denied::Key, 1)));
        assert!(check(&u, &["lpush", "w1", "v"]).is_ok());
        assert_eq!(check(&u, &["get", "w1"]), Err((Denied::Key, 1)));
        let u = user(&["+set", "~a*", "(+get ~b*)"]);
        assert!(check(&u, &["get", "b1"]).is_ok());
        assert_eq!(check(&u, &["get", "a1"]), Err((Denied::Key, 1)));
        assert!(check(&u, &["set", "a1", "v"]).is_ok());
        assert!(u.describe().ends_with("(~b* resetchannels -@all +get)"));
    }

    #[test]
    fn channels_and_categories() {
        let u = user(&["+@all", "~*", "&news.*"]);
        assert!(check(&u, &["publish", "news.a", "m"]).is_ok());
        assert_eq!(
            check(&u, &["publish", "other", "m"]),
            Err((Denied::Channel, 1))
        );
        assert!(check(&u, &["psubscribe", "news.*"]).is_ok());
        assert_eq!(
            check(&u, &["psubscribe", "news.a*"]),
            Err((Denied::Channel, 1))
        );
        let u = user(&["+@all", "-@dangerous", "~*", "&*"]);
        assert_eq!(check(&u, &["keys", "*"]), Err((Denied::Command, 0)));
        assert_eq!(
            check(&u, &["config", "set", "a", "b"]),
            Err((Denied::Command, 0))
        );
        assert!(check(&u, &["get", "k"]).is_ok());
        assert!(!u.unrestricted);
        assert!(User::default_user().unrestricted);
    }
}
