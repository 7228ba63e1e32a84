//! ACL: users, their rules, the permission check and the ACL log (see docs/security.md).
//!
//! Owns the user table and the ACL file. The command path only reads an atomic version
//! and the connection's own `Arc<User>`; the mutex here is taken by ACL commands, AUTH,
//! and a connection's first command after a change. Never touches shard data; clients
//! are disconnected by asking each thread (`commands::server::broadcast`).

pub mod commands;
pub mod tables;
pub mod user;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

pub use user::{Denied, User};

/// Where a denial happened, for ACL LOG's `context`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Context {
    Toplevel,
    Multi,
    Lua,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Auth,
    Command,
    Key,
    Channel,
}

impl From<Denied> for Reason {
    fn from(d: Denied) -> Reason {
        match d {
            Denied::Command => Reason::Command,
            Denied::Key => Reason::Key,
            Denied::Channel => Reason::Channel,
        }
    }
}

pub struct LogEntry {
    pub count: u64,
    pub reason: Reason,
    pub context: Context,
    pub object: String,
    pub username: String,
    pub client_info: String,
    pub entry_id: u64,
    pub created_ms: u64,
    pub updated_ms: u64,
}

/// Denials within this long of each other with the same details share one entry.
const LOG_GROUPING_MS: u64 = 60_000;

struct Inner {
    users: BTreeMap<String, Arc<User>>,
    log: VecDeque<LogEntry>,
    next_entry_id: u64,
}

pub struct Acl {
    /// Moves on every change to any user; connections compare it with what they saw.
    version: AtomicU64,
    /// `default` is on and needs no password: new connections start authenticated.
    default_open: AtomicBool,
    inner: Mutex<Inner>,
    /// INFO's acl_access_denied_auth / cmd / key / channel.
    pub denied: [AtomicU64; 4],
    pub log_max_len: AtomicU64,
}

impl Default for Acl {
    fn default() -> Self {
        Self::new()
    }
}

impl Acl {
    pub fn new() -> Acl {
        let mut users = BTreeMap::new();
        users.insert("default".to_string(), Arc::new(User::default_user()));
        Acl {
            version: AtomicU64::new(1),
            default_open: AtomicBool::new(true),
            inner: Mutex::new(Inner {
                users,
                log: VecDeque::new(),
                next_entry_id: 0,
            }),
            denied: Default::default(),
            log_max_len: AtomicU64::new(128),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[inline]
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether a new connection is authenticated as `default` at once.
    pub fn default_open(&self) -> bool {
        self.default_open.load(Ordering::Acquire)
    }

    fn changed(&self, inner: &Inner) {
        let d = &inner.users["default"];
        self.default_open
            .store(d.enabled && d.nopass, Ordering::Release);
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    pub fn user(&self, name: &str) -> Option<Arc<User>> {
        self.lock().users.get(name).cloned()
    }

    pub fn default_user(&self) -> Arc<User> {
        self.user("default")
            .expect("the default user always exists")
    }

    pub fn users(&self) -> Vec<Arc<User>> {
        self.lock().users.values().cloned().collect()
    }

    /// AUTH: the user when the name and password match and the user is on.
    pub fn authenticate(&self, name: &[u8], pass: &[u8]) -> Option<Arc<User>> {
        let name = std::str::from_utf8(name).ok()?;
        let u = self.user(name)?;
        (u.enabled && u.password_ok(pass)).then_some(u)
    }

    /// ACL SETUSER: applies every rule to a copy, and stores it only if all are valid.
    /// Returns the user before and after the change.
    pub fn set_user(
        &self,
        name: &str,
        rules: &[Bytes],
        all_channels_by_default: bool,
    ) -> Result<(Option<Arc<User>>, Arc<User>), String> {
        if name.bytes().any(|c| c.is_ascii_whitespace() || c == 0) {
            return Err("ERR Usernames can't contain spaces or null characters".into());
        }
        let merged = user::merge_selectors(rules).map_err(|i| {
            format!(
                "ERR Unmatched parenthesis in acl selector starting at '{}'.",
                String::from_utf8_lossy(&rules[i])
            )
        })?;
        let mut inner = self.lock();
        let before = inner.users.get(name).cloned();
        let mut u = match &before {
            Some(u) => (**u).clone(),
            None => User::new(name, all_channels_by_default),
        };
        for op in &merged {
            u.apply(op, all_channels_by_default).map_err(|e| {
                format!(
                    "ERR Error in ACL SETUSER modifier '{}': {}",
                    String::from_utf8_lossy(op),
                    e
                )
            })?;
        }
        let after = Arc::new(u);
        inner.users.insert(name.to_string(), after.clone());
        self.changed(&inner);
        Ok((before, after))
    }

    /// ACL DELUSER: the users removed.
    pub fn delete_users(&self, names: &[Bytes]) -> Result<Vec<String>, String> {
        if names.iter().any(|n| &n[..] == b"default") {
            return Err("ERR The 'default' user cannot be removed".into());
        }
        let mut inner = self.lock();
        let mut removed = Vec::new();
        for n in names {
            let n = String::from_utf8_lossy(n).into_owned();
            if inner.users.remove(&n).is_some() {
                removed.push(n);
            }
        }
        if !removed.is_empty() {
            self.changed(&inner);
        }
        Ok(removed)
    }

    /// Replaces every user at once (ACL LOAD, start-up). `default` is kept as it was
    /// when the new set does not define it.
    pub fn replace_all(&self, mut users: BTreeMap<String, Arc<User>>) {
        let mut inner = self.lock();
        if !users.contains_key("default") {
            users.insert("default".into(), Arc::new(User::default_user()));
        }
        inner.users = users;
        self.changed(&inner);
    }

    /// `requirepass`: the default user's only password, or none.
    pub fn set_requirepass(&self, pass: &str) {
        let mut inner = self.lock();
        let mut d = (*inner.users["default"]).clone();
        d.apply(b"resetpass", false).expect("built-in rule");
        if pass.is_empty() {
            d.apply(b"nopass", false).expect("built-in rule");
        } else {
            let mut op = b">".to_vec();
            op.extend_from_slice(pass.as_bytes());
            d.apply(&op, false).expect("built-in rule");
        }
        inner.users.insert("default".into(), Arc::new(d));
        self.changed(&inner);
    }

    /// Records a denial in INFO's counters and ACL LOG.
    pub fn log_denial(
        &self,
        reason: Reason,
        context: Context,
        object: &[u8],
        username: &str,
        client_info: String,
        now_ms: u64,
    ) {
        let slot = match reason {
            Reason::Auth => 0,
            Reason::Command => 1,
            Reason::Key => 2,
            Reason::Channel => 3,
        };
        self.denied[slot].fetch_add(1, Ordering::Relaxed);
        let max = self.log_max_len.load(Ordering::Relaxed) as usize;
        let mut inner = self.lock();
        let object = String::from_utf8_lossy(object).into_owned();
        // Redis looks only at the ten most recent entries for one to update.
        let found = inner.log.iter().take(10).position(|e| {
            e.reason == reason
                && e.context == context
                && now_ms.abs_diff(e.updated_ms) <= LOG_GROUPING_MS
                && e.object == object
                && e.username == username
        });
        if let Some(i) = found {
            let mut e = inner.log.remove(i).expect("found above");
            e.count += 1;
            e.updated_ms = now_ms;
            e.client_info = client_info;
            inner.log.push_front(e);
        } else if max > 0 {
            let id = inner.next_entry_id;
            inner.next_entry_id += 1;
            inner.log.push_front(LogEntry {
                count: 1,
                reason,
                context,
                object,
                username: username.to_string(),
                client_info,
                entry_id: id,
                created_ms: now_ms,
                updated_ms: now_ms,
            });
        }
        inner.log.truncate(max);
    }

    pub fn with_log<R>(&self, f: impl FnOnce(&mut VecDeque<LogEntry>) -> R) -> R {
        f(&mut self.lock().log)
    }
}

/// The text of a denial, as Redis words it (`verbose` names the key or channel, as ACL
/// DRYRUN does).
pub fn denial_text(
    denied: Denied,
    user: &str,
    full_name: &str,
    object: &[u8],
    verbose: bool,
) -> String {
    match denied {
        Denied::Command => {
            format!("User {user} has no permissions to run the '{full_name}' command")
        }
        Denied::Key if verbose => format!(
            "User {user} has no permissions to access the '{}' key",
            String::from_utf8_lossy(object)
        ),
        Denied::Key => "No permissions to access a key".into(),
        Denied::Channel if verbose => format!(
            "User {user} has no permissions to access the '{}' channel",
            String::from_utf8_lossy(object)
        ),
        Denied::Channel => "No permissions to access a channel".into(),
    }
}

/// Reads an ACL file: every line must be valid, or nothing changes (Redis's errors,
/// joined, come back instead).
pub fn parse_acl_file(
    path: &str,
    text: &str,
    all_channels_by_default: bool,
) -> Result<BTreeMap<String, Arc<User>>, String> {
    let mut users: BTreeMap<String, Arc<User>> = BTreeMap::new();
    let mut errors = String::new();
    for (i, line) in text.split('\n').enumerate() {
        let line = line.trim_matches(|c| c == ' ' || c == '\t' || c == '\r');
        if line.is_empty() {
            continue;
        }
        let words: Vec<Bytes> = line
            .split(' ')
            .filter(|w| !w.is_empty())
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect();
        if words.len() < 2 || &words[0][..] != b"user" {
            errors.push_str(&format!(
                "{path}:{} should start with user keyword followed by the username. ",
                i + 1
            ));
            continue;
        }
        let name = String::from_utf8_lossy(&words[1]).into_owned();
        if users.contains_key(&name) {
            errors.push_str(&format!(
                "WARNING: Duplicate user '{name}' found on line {}. ",
                i + 1
            ));
            continue;
        }
        match build_user(&name, &words[2..], all_channels_by_default) {
            Ok(u) => {
                users.insert(name, Arc::new(u));
            }
            Err(e) => errors.push_str(&format!("{path}:{}: {e}. ", i + 1)),
        }
    }
    if errors.is_empty() {
        Ok(users)
    } else {
        errors.push_str(
            "WARNING: ACL errors detected, no change to the previously active ACL rules was performed",
        );
        Err(errors)
    }
}

/// A user from its rules, starting from nothing (`user` lines, ACL files).
pub fn build_user(
    name: &str,
    rules: &[Bytes],
    all_channels_by_default: bool,
) -> Result<User, String> {
    let merged = user::merge_selectors(rules).map_err(|i| {
        format!(
            "Unmatched parenthesis in selector definition starting at '{}'",
            String::from_utf8_lossy(&rules[i])
        )
    })?;
    let mut u = User::new(name, all_channels_by_default);
    for op in &merged {
        u.apply(op, all_channels_by_default).map_err(|e| {
            if e == user::ERR_UNKNOWN {
                format!(
                    "Error in applying operation '{}': {e}",
                    String::from_utf8_lossy(op)
                )
            } else {
                e.to_string()
            }
        })?;
    }
    Ok(u)
}

/// The lines ACL SAVE writes.
pub fn file_text(users: &[Arc<User>]) -> String {
    users
        .iter()
        .map(|u| format!("user {} {}\n", u.name, u.describe()))
        .collect()
}

/// The users at start-up: `requirepass` for `default`, then the `user` lines of the
/// configuration file or the ACL file (not both, as Redis refuses).
pub fn init(config: &crate::config::Config) -> Result<Acl, String> {
    let acl = Acl::new();
    acl.set_requirepass(config.get("requirepass"));
    acl.log_max_len
        .store(config.get_i64("acllog-max-len") as u64, Ordering::Relaxed);
    let all_channels = config.get("acl-pubsub-default") == "allchannels";
    let aclfile = config.get("aclfile");
    if !aclfile.is_empty() && !config.user_lines.is_empty() {
        return Err("Configuring Redis with users defined in redis.conf and at the same setting an ACL file path is invalid. This setup is very likely to lead to configuration errors and security holes, please define either an ACL file or declare users directly in your redis.conf, but not both.".into());
    }
    if !aclfile.is_empty() {
        let text = match std::fs::read_to_string(aclfile) {
            Ok(t) => t,
            // A missing file is an empty one until ACL SAVE writes it, as in Redis.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("Error loading ACLs, opening file '{aclfile}': {e}")),
        };
        let users = parse_acl_file(aclfile, &text, all_channels)
            .map_err(|e| format!("Aborting Redis startup because of ACL errors: {e}"))?;
        if !users.is_empty() {
            acl.replace_all_keeping_default(users);
        }
    } else if !config.user_lines.is_empty() {
        let mut users = BTreeMap::new();
        for line in &config.user_lines {
            let Some((name, rules)) = line.split_first() else {
                continue;
            };
            let rules: Vec<Bytes> = rules
                .iter()
                .map(|r| Bytes::copy_from_slice(r.as_bytes()))
                .collect();
            let u = build_user(name, &rules, all_channels)
                .map_err(|e| format!("Error in user declaration '{name}': {e}"))?;
            if users.insert(name.clone(), Arc::new(u)).is_some() {
                return Err(format!(
                    "Duplicate user '{name}' found in the configuration"
                ));
            }
        }
        acl.replace_all_keeping_default(users);
    }
    Ok(acl)
}

impl Acl {
    /// Like `replace_all`, but a set without `default` keeps the current one (with its
    /// `requirepass`), as start-up does in Redis.
    pub fn replace_all_keeping_default(&self, mut users: BTreeMap<String, Arc<User>>) {
        if !users.contains_key("default") {
            users.insert("default".into(), self.default_user());
        }
        self.replace_all(users);
    }
}
