//! ACL and the permission check each command passes before it runs (see
//! docs/security.md). Users and their rules live in `crate::acl`.

use std::sync::Arc;

use bytes::Bytes;

use super::util::{eq_ci, parse_i64, printable};
use super::{table, Command};
use crate::acl::commands::{acl_commands, CATEGORIES};
use crate::acl::{self as acl_mod, Context, Denied, Reason, User};
use crate::async_handler;
use crate::server::session::Session;
use crate::shard::{broadcast, unix_ms};

/// Looks the connection's user up again after any ACL change. False when the user is
/// gone (the connection is being closed by ACL DELUSER).
fn refresh_user(sess: &mut Session) -> bool {
    let acl = &sess.worker.shared.acl;
    let v = acl.version();
    if v == sess.acl_version {
        return true;
    }
    sess.acl_version = v;
    match acl.user(&sess.user.name) {
        Some(u) => {
            sess.user = u;
            true
        }
        None => false,
    }
}

fn context(sess: &Session) -> Context {
    if sess.multi.is_some() {
        Context::Multi
    } else {
        Context::Toplevel
    }
}

fn client_line(sess: &Session) -> String {
    sess.handle.line(unix_ms())
}

/// Checks a call for `user`; on a denial, counts it, logs it in ACL LOG under `context`
/// and returns what was refused, the command's full name and the object at fault.
fn check_and_log<'a>(
    shared: &crate::shard::Shared,
    user: &User,
    cmd: &'static Command,
    args: &'a [Bytes],
    context: Context,
    client_info: impl FnOnce() -> String,
) -> Option<(Denied, &'static str, &'a [u8])> {
    let (denied, pos) = user.check(cmd, args).err()?;
    let ids = acl_commands();
    let full_name = ids.entries[ids.id_of_call(cmd, args)].full_name;
    let object: &[u8] = match denied {
        Denied::Command => full_name.as_bytes(),
        _ => &args[pos],
    };
    shared.acl.log_denial(
        denied.into(),
        context,
        object,
        &user.name,
        client_info(),
        unix_ms(),
    );
    Some((denied, full_name, object))
}

/// The connection's user, looked up again if ACL changed; None when it was deleted.
fn current_user(sess: &mut Session) -> Option<Arc<User>> {
    refresh_user(sess).then(|| sess.user.clone())
}

/// The permission check before a command runs or is queued: on a denial, the NOPERM
/// error (for the caller to send) after counting it and logging it in ACL LOG.
#[inline]
pub fn denial(sess: &mut Session, cmd: &'static Command, args: &[Bytes]) -> Option<String> {
    if sess.acl_version == sess.worker.shared.acl.version() && sess.user.unrestricted {
        return None;
    }
    let Some(user) = current_user(sess) else {
        sess.close_after_reply = true;
        return Some("NOPERM this user has been deleted".into());
    };
    let shared = sess.worker.shared.clone();
    let (denied, full_name, object) =
        check_and_log(&shared, &user, cmd, args, context(sess), || {
            client_line(sess)
        })?;
    Some(format!(
        "NOPERM {}",
        acl_mod::denial_text(denied, &user.name, full_name, object, false)
    ))
}

/// EXEC's second look at each queued command, for rules changed since it was queued:
/// the error that takes the command's place, as Redis words it.
pub fn exec_denial(sess: &mut Session, cmd: &'static Command, args: &[Bytes]) -> Option<String> {
    if sess.acl_version == sess.worker.shared.acl.version() && sess.user.unrestricted {
        return None;
    }
    let Some(user) = current_user(sess) else {
        return Some("NOPERM this user has been deleted".into());
    };
    let shared = sess.worker.shared.clone();
    let (denied, _, _) = check_and_log(&shared, &user, cmd, args, Context::Multi, || {
        client_line(sess)
    })?;
    let reason = match denied {
        Denied::Command => "no permission to execute the command or subcommand",
        Denied::Key => "no permission to touch the specified keys",
        Denied::Channel => "no permission to access one of the channels used as arguments",
    };
    Some(format!("NOPERM ACLs rules changed between the moment the transaction was accumulated and the EXEC call. This command is no longer allowed for the following reason: {reason}"))
}

/// The check `redis.call` makes inside a script for the script's caller.
pub fn script_denial(
    user: &User,
    client_id: u64,
    cmd: &'static Command,
    args: &[Bytes],
    shared: &crate::shard::Shared,
) -> Option<String> {
    if user.unrestricted {
        return None;
    }
    let (denied, full_name, object) = check_and_log(shared, user, cmd, args, Context::Lua, || {
        format!("id={client_id} user={}", user.name)
    })?;
    Some(format!(
        "ERR ACL failure in script: {}",
        acl_mod::denial_text(denied, &user.name, full_name, object, false)
    ))
}

pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// AUTH and HELLO AUTH: switches the connection to the user, or logs the failure.
pub fn authenticate(sess: &mut Session, name: &[u8], pass: &[u8], command: &[u8]) -> bool {
    let acl = &sess.worker.shared.acl;
    match acl.authenticate(name, pass) {
        Some(u) => {
            sess.acl_version = acl.version();
            sess.handle.info.borrow_mut().user = u.name.as_str().into();
            sess.user = u;
            sess.authenticated = true;
            true
        }
        None => {
            let name = String::from_utf8_lossy(name).into_owned();
            acl.log_denial(
                Reason::Auth,
                context(sess),
                command,
                &name,
                client_line(sess),
                unix_ms(),
            );
            false
        }
    }
}

/// RESET: back to the default user, authenticated only when it needs no password.
pub fn reset_user(sess: &mut Session) {
    let acl = &sess.worker.shared.acl;
    sess.acl_version = acl.version();
    sess.user = acl.default_user();
    sess.authenticated = acl.default_open();
    sess.handle.info.borrow_mut().user = "default".into();
}

/// Disconnects the clients of deleted users, and the subscribers of a changed user that
/// hold channels or patterns it no longer grants.
async fn disconnect(sess: &Session, deleted: Vec<String>, changed: Option<Arc<User>>) {
    let me = sess.id;
    let killed_me = broadcast(&sess.worker, move |w| {
        let clients = w.clients.borrow();
        let mut doomed: Vec<u64> = Vec::new();
        for h in clients.map.values() {
            let info = h.info.borrow();
            if deleted.iter().any(|d| d.as_str() == &*info.user) {
                doomed.push(info.id);
            }
        }
        if let Some(u) = &changed {
            for (name, ids, is_pattern) in clients.pubsub.all_subscriptions() {
                if u.channel_allowed(name, is_pattern) {
                    continue;
                }
                for id in ids {
                    if clients
                        .map
                        .get(id)
                        .is_some_and(|h| *h.info.borrow().user == *u.name.as_str())
                    {
                        doomed.push(*id);
                    }
                }
            }
        }
        let mut me_too = false;
        for id in doomed {
            if id == me {
                // The caller still gets its reply; it closes after it.
                me_too = true;
            } else if let Some(h) = clients.map.get(&id) {
                h.kill();
            }
        }
        me_too
    })
    .await;
    let _ = killed_me;
}

async_handler!(acl, |sess, args| {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    let shared = sess.worker.shared.clone();
    let acl = &shared.acl;
    let all_channels = shared
        .config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get("acl-pubsub-default")
        == "allchannels";
    match sub.as_str() {
        "setuser" if args.len() >= 3 => {
            let name = String::from_utf8_lossy(&args[2]).into_owned();
            match acl.set_user(&name, &args[3..], all_channels) {
                Ok((before, after)) => {
                    if before.is_some() {
                        let me = self_affected(sess, &after);
                        disconnect(sess, Vec::new(), Some(after)).await;
                        if me {
                            sess.close_after_reply = true;
                        }
                    }
                    sess.out.ok();
                }
                Err(e) => sess.error(&e),
            }
        }
        "deluser" if args.len() >= 3 => match acl.delete_users(&args[2..]) {
            Ok(removed) => {
                let n = removed.len() as i64;
                if removed.iter().any(|r| *r == sess.user.name) {
                    sess.close_after_reply = true;
                }
                disconnect(sess, removed, None).await;
                sess.out.int(n);
            }
            Err(e) => sess.error(&e),
        },
        "getuser" if args.len() == 3 => {
            let Some(u) = acl.user(&String::from_utf8_lossy(&args[2])) else {
                return sess.out.null();
            };
            sess.out.map(6);
            sess.out.bulk(b"flags");
            let flags = u.flag_names();
            sess.out.set(flags.len());
            for f in flags {
                sess.out.bulk(f.as_bytes());
            }
            sess.out.bulk(b"passwords");
            sess.out.array(u.passwords.len());
            for p in &u.passwords {
                sess.out.bulk(p.as_bytes());
            }
            for (k, v) in User::selector_fields(&u.selectors[0]) {
                sess.out.bulk(k.as_bytes());
                sess.out.bulk(v.as_bytes());
            }
            sess.out.bulk(b"selectors");
            sess.out.array(u.selectors.len() - 1);
            for s in &u.selectors[1..] {
                sess.out.map(3);
                for (k, v) in User::selector_fields(s) {
                    sess.out.bulk(k.as_bytes());
                    sess.out.bulk(v.as_bytes());
                }
            }
        }
        "list" | "users" if args.len() == 2 => {
            let users = acl.users();
            sess.out.array(users.len());
            for u in users {
                if sub == "users" {
                    sess.out.bulk(u.name.as_bytes());
                } else {
                    sess.out
                        .bulk(format!("user {} {}", u.name, u.describe()).as_bytes());
                }
            }
        }
        "whoami" if args.len() == 2 => {
            let name = sess.user.name.clone();
            sess.out.bulk(name.as_bytes());
        }
        "load" | "save" if args.len() == 2 => {
            let path = shared
                .config
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get("aclfile")
                .to_string();
            if path.is_empty() {
                return sess.error("ERR This Redis instance is not configured to use an ACL file. You may want to specify users via the ACL SETUSER command and then issue a CONFIG REWRITE (assuming you have a Redis configuration file set) in order to store users in the Redis configuration.");
            }
            if sub == "save" {
                match save_file(&path, &acl.users()) {
                    Ok(()) => sess.out.ok(),
                    Err(e) => {
                        tracing::warn!("ACL SAVE to {path}: {e}");
                        sess.error("ERR There was an error trying to save the ACLs. Please check the server logs for more information")
                    }
                }
            } else {
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e) => {
                        return sess.error(&format!(
                            "ERR Error loading ACLs, opening file '{path}': {e}"
                        ))
                    }
                };
                match acl_mod::parse_acl_file(&path, &text, all_channels) {
                    Ok(users) => {
                        let before: Vec<Arc<User>> = acl.users();
                        acl.replace_all_keeping_default(users);
                        // Connections of users that are gone or changed: Redis closes
                        // every client of a user the file redefines.
                        let names: Vec<String> = before
                            .iter()
                            .map(|u| u.name.clone())
                            .filter(|n| n != "default")
                            .collect();
                        if names.iter().any(|n| *n == sess.user.name) {
                            sess.close_after_reply = true;
                        }
                        disconnect(sess, names, None).await;
                        sess.out.ok();
                    }
                    Err(e) => sess.error(&format!("ERR {e}")),
                }
            }
        }
        "cat" if args.len() == 2 => {
            sess.out.array(CATEGORIES.len());
            for c in CATEGORIES {
                sess.out.bulk(c.as_bytes());
            }
        }
        "cat" if args.len() == 3 => {
            let Some(bit) = crate::acl::commands::category_bit(&String::from_utf8_lossy(&args[2]))
            else {
                return sess.error(&format!(
                    "ERR Unknown category '{}'",
                    printable(&args[2], 128)
                ));
            };
            let names: Vec<&str> = acl_commands()
                .entries
                .iter()
                .filter(|e| e.categories & bit != 0)
                .map(|e| e.full_name)
                .collect();
            sess.out.array(names.len());
            for n in names {
                sess.out.bulk(n.as_bytes());
            }
        }
        "genpass" if args.len() <= 3 => {
            let bits = if args.len() == 3 {
                match parse_i64(&args[2]) {
                    Ok(b) => b,
                    Err(_) => return sess.error("ERR value is not an integer or out of range"),
                }
            } else {
                256
            };
            if bits <= 0 || bits > 4096 {
                return sess.error("ERR ACL GENPASS argument must be the number of bits for the output password, a positive number up to 4096");
            }
            let chars = (bits as usize).div_ceil(4);
            sess.out.bulk(random_hex(chars).as_bytes());
        }
        "log" if args.len() <= 3 => {
            let mut count = 10usize;
            if args.len() == 3 {
                if eq_ci(&args[2], "reset") {
                    acl.with_log(|l| l.clear());
                    return sess.out.ok();
                }
                match parse_i64(&args[2]) {
                    Ok(n) => count = n.max(0) as usize,
                    Err(_) => return sess.error("ERR value is not an integer or out of range"),
                }
            }
            let now = unix_ms();
            let resp3 = sess.out.resp3;
            let mut out =
                std::mem::replace(&mut sess.out, crate::protocol::reply::Reply::new(resp3));
            acl.with_log(|log| {
                let n = count.min(log.len());
                out.array(n);
                for e in log.iter().take(n) {
                    out.map(10);
                    out.bulk(b"count");
                    out.int(e.count as i64);
                    out.bulk(b"reason");
                    out.bulk(match e.reason {
                        Reason::Auth => b"auth".as_slice(),
                        Reason::Command => b"command",
                        Reason::Key => b"key",
                        Reason::Channel => b"channel",
                    });
                    out.bulk(b"context");
                    out.bulk(match e.context {
                        Context::Toplevel => b"toplevel".as_slice(),
                        Context::Multi => b"multi",
                        Context::Lua => b"lua",
                    });
                    out.bulk(b"object");
                    out.bulk(e.object.as_bytes());
                    out.bulk(b"username");
                    out.bulk(e.username.as_bytes());
                    out.bulk(b"age-seconds");
                    out.double(now.saturating_sub(e.updated_ms) as f64 / 1000.0);
                    out.bulk(b"client-info");
                    out.bulk(e.client_info.as_bytes());
                    out.bulk(b"entry-id");
                    out.int(e.entry_id as i64);
                    out.bulk(b"timestamp-created");
                    out.int(e.created_ms as i64);
                    out.bulk(b"timestamp-last-updated");
                    out.int(e.updated_ms as i64);
                }
            });
            sess.out = out;
        }
        "dryrun" if args.len() >= 4 => {
            let name = String::from_utf8_lossy(&args[2]).into_owned();
            let Some(u) = acl.user(&name) else {
                return sess.error(&format!("ERR User '{name}' not found"));
            };
            let call = &args[3..];
            let Some(cmd) = table().lookup(&call[0]) else {
                return sess.error(&format!(
                    "ERR Command '{}' not found",
                    String::from_utf8_lossy(&call[0])
                ));
            };
            let ids = acl_commands();
            let full = ids.entries[ids.id_of_call(cmd, call)].full_name;
            if !cmd.arity_ok(call.len()) {
                return sess.error(&format!(
                    "ERR wrong number of arguments for '{full}' command"
                ));
            }
            match u.check(cmd, call) {
                Ok(()) => sess.out.ok(),
                Err((denied, pos)) => {
                    let object: &[u8] = if denied == Denied::Command {
                        full.as_bytes()
                    } else {
                        &call[pos]
                    };
                    let text = acl_mod::denial_text(denied, &u.name, full, object, true);
                    sess.out.bulk(text.as_bytes());
                }
            }
        }
        "help" if args.len() == 2 => {
            let lines = [
                "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CAT [<category>]",
                "    List all commands that belong to <category>, or all command categories",
                "    when no category is specified.",
                "DELUSER <username> [<username> ...]",
                "    Delete a list of users.",
                "DRYRUN <username> <command> [<arg> ...]",
                "    Returns whether the user can execute the given command without executing the command.",
                "GETUSER <username>",
                "    Get the user's details.",
                "GENPASS [<bits>]",
                "    Generate a secure 256-bit user password. The optional `bits` argument can",
                "    be used to specify a different size.",
                "LIST",
                "    Show users details in config file format.",
                "LOAD",
                "    Reload users from the ACL file.",
                "LOG [<count> | RESET]",
                "    Show the ACL log entries.",
                "SAVE",
                "    Save the current config to the ACL file.",
                "SETUSER <username> <attribute> [<attribute> ...]",
                "    Create or modify a user with the specified attributes.",
                "USERS",
                "    List all the registered usernames.",
                "WHOAMI",
                "    Return the current connection username.",
                "HELP",
                "    Print this help.",
            ];
            sess.out.array(lines.len());
            for l in lines {
                sess.out.simple(l);
            }
        }
        _ => sess.error(&format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try ACL HELP.",
            printable(&args[1], 128)
        )),
    }
});

/// Whether a change to a user takes away a channel this connection holds.
fn self_affected(sess: &Session, after: &User) -> bool {
    sess.user.name == after.name
        && (sess
            .channels
            .iter()
            .any(|c| !after.channel_allowed(c, false))
            || sess
                .patterns
                .iter()
                .any(|p| !after.channel_allowed(p, true)))
}

/// ACL SAVE: the whole file written beside the old one, then renamed over it.
fn save_file(path: &str, users: &[Arc<User>]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = format!("{path}.tmp-{}", std::process::id());
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(acl_mod::file_text(users).as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// Hex characters from the kernel's random source.
fn random_hex(chars: usize) -> String {
    use std::io::Read;
    let mut bytes = vec![0u8; chars.div_ceil(2)];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut bytes);
    }
    let mut s: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    s.truncate(chars);
    s
}
