//! ACL (Redis 7 access control lists), black-box: users and passwords (ACL SETUSER, AUTH,
//! HELLO AUTH, `requirepass`), command, key, channel and selector rules with Redis's
//! NOPERM replies, scripts, the ACL subcommands (LIST, USERS, GETUSER, DELUSER, CAT,
//! GENPASS, DRYRUN, LOG, LOAD, SAVE), the connections of deleted or killed users,
//! CLIENT LIST / CLIENT KILL USER, `--aclfile` and `user` lines in a configuration file.
//!
//! Kite targets Redis 7.2, while the reference in CI is Debian's redis-server 7.0. The
//! two word a few replies differently, so the expected texts come from [`Ver`], chosen
//! by the `redis_version` the server reports (Kite says 7.2.x). Only the wording differs;
//! the behaviour checked is the same. The 7.0 / 7.2 differences:
//! - NOPERM replies: 7.0 `this user has no permissions to run the 'set' command`,
//!   `... to access one of the keys used as arguments` / `... channels ...`; 7.2
//!   `User alice has no permissions to run the 'set' command`, `No permissions to access
//!   a key`, `No permissions to access a channel`.
//! - ACL DRYRUN: 7.0 `This user has no permissions ...`, 7.2 `User alice has no
//!   permissions ...` (the key or channel named in both).
//! - Scripts: 7.0 `ERR The user executing the script can't run this command or
//!   subcommand`, 7.2 `ERR ACL failure in script: <the NOPERM text>`.
//! - 7.2 gives every user the `sanitize-payload` flag, shown by ACL LIST and GETUSER.
//! - 7.2's ACL LOG entries have `entry-id`, `timestamp-created` and
//!   `timestamp-last-updated` after 7.0's fields.
//!   (7.0 also sets the flag on `reset`, so on the default user of a `user default` line.)
//! - HELLO before AUTH: 7.0 says `the HELLO AUTH <user> <pass> option`, 7.2 `the HELLO
//!   <proto> AUTH <user> <pass> option`.
//! - 7.2 keeps command rules as written (`+@read -@dangerous`) where 7.0 rewrites them
//!   into a minimal list (`+@read -keys -sort_ro`) and lists single commands in no fixed
//!   order: exact ACL LIST / GETUSER lines below only use rules both print alike (at most
//!   one single command per rule list).
//!
//! Everything here passes against redis-server 7.0.15 and 7.2.4. Run against real Redis
//! with `KITE_BIN=$(which redis-server) cargo test --release --test acl`.
//!
//! Documented behaviour that these tests pin down and that one might guess otherwise:
//! ACL SETUSER `off` or a password change does not disconnect the user's open
//! connections (only new AUTHs fail); ACL DELUSER, CLIENT KILL USER, ACL LOAD without the
//! user, and taking away a channel a client is subscribed to do.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    assert_err_prefix, encode_command, free_port, kite_bin, kite_is_redis, Client, KiteServer, Resp,
};

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
/// SHA-256 of "pw".
const SHA_PW: &str = "30c952fab122c3f9759f02a6d95c3758b246b4fee239957b2d4fee46e26170c4";
/// SHA-256 of "secret".
const SHA_SECRET: &str = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";
/// SHA-256 of "x".
const SHA_X: &str = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881";
/// SHA-256 of "other".
const SHA_OTHER: &str = "d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa";

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Runs `$body(threads)` as two tests, at `--threads 1` and `--threads 4`.
macro_rules! threads_1_and_4 {
    ($body:ident, $t1:ident, $t4:ident) => {
        #[test]
        fn $t1() {
            $body(1)
        }
        #[test]
        fn $t4() {
            $body(4)
        }
    };
}

/// The wording of the server's ACL replies: Redis 7.0's or 7.2's (see the module doc).
#[derive(Clone, Copy, Debug)]
struct Ver {
    v72: bool,
}

impl Ver {
    fn of(c: &mut Client) -> Ver {
        let info = c.cmd(&["INFO", "server"]).as_string().expect("INFO server");
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .expect("INFO server has redis_version")
            .trim()
            .to_string();
        Ver {
            v72: !version.starts_with("7.0.") && !version.starts_with("6."),
        }
    }

    fn noperm_cmd(&self, user: &str, cmd: &str) -> Resp {
        Resp::Error(if self.v72 {
            format!("NOPERM User {user} has no permissions to run the '{cmd}' command")
        } else {
            format!("NOPERM this user has no permissions to run the '{cmd}' command")
        })
    }

    fn noperm_key(&self) -> Resp {
        Resp::Error(if self.v72 {
            "NOPERM No permissions to access a key".into()
        } else {
            "NOPERM this user has no permissions to access one of the keys used as arguments".into()
        })
    }

    fn noperm_channel(&self) -> Resp {
        Resp::Error(if self.v72 {
            "NOPERM No permissions to access a channel".into()
        } else {
            "NOPERM this user has no permissions to access one of the channels used as \
             arguments"
                .into()
        })
    }

    fn dryrun_cmd(&self, user: &str, cmd: &str) -> Resp {
        Resp::bulk(if self.v72 {
            format!("User {user} has no permissions to run the '{cmd}' command")
        } else {
            format!("This user has no permissions to run the '{cmd}' command")
        })
    }

    fn dryrun_key(&self, user: &str, key: &str) -> Resp {
        Resp::bulk(if self.v72 {
            format!("User {user} has no permissions to access the '{key}' key")
        } else {
            format!("This user has no permissions to access the '{key}' key")
        })
    }

    fn dryrun_channel(&self, user: &str, chan: &str) -> Resp {
        Resp::bulk(if self.v72 {
            format!("User {user} has no permissions to access the '{chan}' channel")
        } else {
            format!("This user has no permissions to access the '{chan}' channel")
        })
    }

    /// How an error raised by `redis.call` for a denied command starts.
    fn script_cmd_denied(&self, user: &str, cmd: &str) -> String {
        if self.v72 {
            format!(
                "ERR ACL failure in script: User {user} has no permissions to run the \
                 '{cmd}' command"
            )
        } else {
            "ERR The user executing the script can't run this command or subcommand".into()
        }
    }

    /// How an error raised by `redis.call` for a denied key starts (and the whole error
    /// that `redis.pcall` returns).
    fn script_key_denied(&self) -> String {
        if self.v72 {
            "ERR ACL failure in script: No permissions to access a key".into()
        } else {
            "ERR The user executing the script can't access at least one of the keys \
             mentioned in the command arguments"
                .into()
        }
    }

    /// HELLO's refusal before authentication (7.0 leaves out `<proto>`).
    fn hello_noauth(&self) -> Resp {
        Resp::Error(format!(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise \
             the HELLO {}AUTH <user> <pass> option can be used to authenticate the client and \
             select the RESP protocol version at the same time",
            if self.v72 { "<proto> " } else { "" }
        ))
    }

    /// The flags part of an ACL LIST line: `flags` plus 7.2's `sanitize-payload`.
    fn flags(&self, flags: &str) -> String {
        if self.v72 {
            format!("{flags} sanitize-payload")
        } else {
            flags.to_string()
        }
    }

    /// One ACL LIST line.
    fn list_line(&self, user: &str, flags: &str, rest: &str) -> String {
        if rest.is_empty() {
            format!("user {user} {}", self.flags(flags))
        } else {
            format!("user {user} {} {rest}", self.flags(flags))
        }
    }

    /// The `flags` array of ACL GETUSER (RESP2).
    fn flag_array(&self, flags: &[&str]) -> Resp {
        let mut v: Vec<Resp> = flags.iter().map(Resp::bulk).collect();
        if self.v72 {
            v.push(Resp::bulk("sanitize-payload"));
        }
        Resp::Array(v)
    }

    /// The fields of an ACL LOG entry, in order.
    fn log_fields(&self) -> Vec<&'static str> {
        let mut f = vec![
            "count",
            "reason",
            "context",
            "object",
            "username",
            "age-seconds",
            "client-info",
        ];
        if self.v72 {
            f.extend(["entry-id", "timestamp-created", "timestamp-last-updated"]);
        }
        f
    }
}

fn ok() -> Resp {
    Resp::ok()
}

fn bulk(s: &str) -> Resp {
    Resp::bulk(s)
}

fn bulks(items: &[&str]) -> Resp {
    Resp::Array(items.iter().map(Resp::bulk).collect())
}

/// Runs ACL SETUSER `user` `rules...` and asserts +OK.
#[track_caller]
fn setuser(admin: &mut Client, user: &str, rules: &[&str]) {
    let mut args = vec!["ACL", "SETUSER", user];
    args.extend_from_slice(rules);
    let r = admin.cmd(&args);
    assert_eq!(r, ok(), "ACL SETUSER {user} {rules:?}");
}

/// A new connection authenticated as `user`.
#[track_caller]
fn login(port: u16, user: &str, pass: &str) -> Client {
    let mut c = Client::connect(port);
    let r = c.cmd(&["AUTH", user, pass]);
    assert_eq!(r, ok(), "AUTH {user} {pass}");
    c
}

/// Asserts that the server closed `c`: a PING sent on it gets no reply.
#[track_caller]
fn assert_closed(c: &mut Client, what: &str) {
    c.set_timeout(Some(Duration::from_secs(5)));
    let _ = c.try_send_raw(&encode_command(&["PING"]));
    if let Ok(r) = c.try_read() {
        panic!("{what}: expected the server to have closed the connection, got {r}");
    }
}

/// The lines of ACL LIST.
#[track_caller]
fn acl_list(c: &mut Client) -> Vec<String> {
    let r = c.cmd(&["ACL", "LIST"]);
    r.as_array()
        .unwrap_or_else(|| panic!("ACL LIST: {r}"))
        .iter()
        .map(|x| x.as_string().expect("ACL LIST line"))
        .collect()
}

/// ACL GETUSER's RESP2 reply as (field, value) pairs.
#[track_caller]
fn getuser_fields(c: &mut Client, user: &str) -> Vec<(String, Resp)> {
    let r = c.cmd(&["ACL", "GETUSER", user]);
    let items = r
        .as_array()
        .unwrap_or_else(|| panic!("ACL GETUSER {user}: {r}"));
    assert!(items.len().is_multiple_of(2), "odd GETUSER reply {r}");
    items
        .chunks(2)
        .map(|p| (p[0].as_string().expect("field name"), p[1].clone()))
        .collect()
}

/// ACL LOG's entries (RESP2) as lists of (field, value).
#[track_caller]
fn acl_log(c: &mut Client, count: Option<&str>) -> Vec<Vec<(String, Resp)>> {
    let r = match count {
        Some(n) => c.cmd(&["ACL", "LOG", n]),
        None => c.cmd(&["ACL", "LOG"]),
    };
    r.as_array()
        .unwrap_or_else(|| panic!("ACL LOG: {r}"))
        .iter()
        .map(|e| {
            let items = e.as_array().unwrap_or_else(|| panic!("ACL LOG entry {e}"));
            items
                .chunks(2)
                .map(|p| (p[0].as_string().expect("field name"), p[1].clone()))
                .collect()
        })
        .collect()
}

fn field<'a>(entry: &'a [(String, Resp)], name: &str) -> &'a Resp {
    entry
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no field {name} in {entry:?}"))
}

fn field_str(entry: &[(String, Resp)], name: &str) -> String {
    let v = field(entry, name);
    v.as_string()
        .unwrap_or_else(|| panic!("field {name} is not a string: {v}"))
}

/// A temporary directory for one test, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "kite-acl-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A server started from a configuration file (the harness passes only flags): the
/// file is the first argument, as redis-server requires, then `--threads` for Kite.
struct ConfServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl ConfServer {
    /// Writes `port`, `bind`, `dir` and no persistence, then `body`, to a file in `dir`
    /// and starts the server under test on it.
    fn start(dir: &Path, body: &str, threads: usize) -> ConfServer {
        let port = free_port();
        let conf = dir.join("server.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nsave \"\"\nappendonly no\n{body}",
            dir.display()
        );
        fs::write(&conf, text).expect("write config file");
        let log = dir.join("server.log");
        let out = fs::File::create(&log).expect("create log");
        let err = out.try_clone().expect("clone log");
        let mut cmd = Command::new(kite_bin());
        cmd.arg(&conf);
        if !kite_is_redis() {
            cmd.args(["--threads", &threads.to_string()]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start the server with a config file");
        let mut s = ConfServer { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!(
                    "server with a config file exited ({status}):\n{}",
                    fs::read_to_string(&s.log).unwrap_or_default()
                );
            }
            if Client::try_connect(port).is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "server with a config file did not listen on {port}:\n{}",
                fs::read_to_string(&s.log).unwrap_or_default()
            );
            thread::sleep(Duration::from_millis(20));
        }
        s
    }
}

impl Drop for ConfServer {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!(
                "--- server output ---\n{}",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// Users, passwords, AUTH
// ---------------------------------------------------------------------------

fn passwords_and_auth(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);

    // A new connection is the default user.
    let mut c = s.raw_client();
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("default"));

    // >password
    setuser(&mut admin, "alice", &["on", ">pw", "allkeys", "+@all"]);
    assert_eq!(c.cmd(&["AUTH", "alice", "pw"]), ok());
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("alice"));
    // A failed AUTH leaves the connection as it was.
    assert_eq!(
        c.cmd(&["AUTH", "alice", "wrong"]),
        Resp::Error(WRONGPASS.into())
    );
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("alice"));
    assert_eq!(
        c.cmd(&["AUTH", "nobody", "pw"]),
        Resp::Error(WRONGPASS.into())
    );
    // Back to the default user with its (empty) password list: nopass.
    assert_eq!(c.cmd(&["AUTH", "default", "anything"]), ok());
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("default"));

    // #<sha256>: the hash is stored, the clear text is what AUTH takes.
    let hash_rule = format!("#{SHA_SECRET}");
    setuser(&mut admin, "bob", &["on", &hash_rule, "allkeys", "+@all"]);
    assert_eq!(c.cmd(&["AUTH", "bob", "secret"]), ok());
    assert_eq!(
        c.cmd(&["AUTH", "bob", SHA_SECRET]),
        Resp::Error(WRONGPASS.into())
    );
    let hashes = getuser_fields(&mut admin, "bob");
    assert_eq!(hashes[1], ("passwords".to_string(), bulks(&[SHA_SECRET])));

    // Several passwords; <pass and !hash remove one.
    setuser(&mut admin, "carol", &["on", ">pw", ">other", "+@all"]);
    assert_eq!(c.cmd(&["AUTH", "carol", "pw"]), ok());
    assert_eq!(c.cmd(&["AUTH", "carol", "other"]), ok());
    setuser(&mut admin, "carol", &["<pw"]);
    assert_eq!(
        c.cmd(&["AUTH", "carol", "pw"]),
        Resp::Error(WRONGPASS.into())
    );
    assert_eq!(c.cmd(&["AUTH", "carol", "other"]), ok());
    let rm_hash = format!("!{SHA_OTHER}");
    setuser(&mut admin, "carol", &[&rm_hash]);
    assert_eq!(
        c.cmd(&["AUTH", "carol", "other"]),
        Resp::Error(WRONGPASS.into())
    );

    // nopass: any password; resetpass: none at all (and clears nopass).
    setuser(&mut admin, "dan", &["on", "nopass", "+@all"]);
    assert_eq!(c.cmd(&["AUTH", "dan", "whatever"]), ok());
    assert_eq!(c.cmd(&["AUTH", "dan", ""]), ok());
    setuser(&mut admin, "dan", &["resetpass"]);
    assert_eq!(
        c.cmd(&["AUTH", "dan", "whatever"]),
        Resp::Error(WRONGPASS.into())
    );
    // >pass clears nopass.
    setuser(&mut admin, "dan", &["nopass", ">pw"]);
    assert_eq!(
        c.cmd(&["AUTH", "dan", "whatever"]),
        Resp::Error(WRONGPASS.into())
    );
    assert_eq!(c.cmd(&["AUTH", "dan", "pw"]), ok());

    // off: a right password is refused too; on again lets it in.
    setuser(&mut admin, "erin", &["off", ">pw", "+@all"]);
    assert_eq!(
        c.cmd(&["AUTH", "erin", "pw"]),
        Resp::Error(WRONGPASS.into())
    );
    setuser(&mut admin, "erin", &["on"]);
    assert_eq!(c.cmd(&["AUTH", "erin", "pw"]), ok());

    // A user created with no rules is off, with no passwords and no permissions.
    setuser(&mut admin, "fred", &[]);
    assert_eq!(c.cmd(&["AUTH", "fred", ""]), Resp::Error(WRONGPASS.into()));
    let list = acl_list(&mut admin);
    assert!(
        list.contains(&v.list_line("fred", "off", "resetchannels -@all")),
        "{list:?}"
    );

    // reset: back to the new-user state (with the sanitize-payload flag, which 7.0
    // also sets on reset although it does not give it to new users).
    setuser(&mut admin, "alice", &["reset"]);
    assert_eq!(
        c.cmd(&["AUTH", "alice", "pw"]),
        Resp::Error(WRONGPASS.into())
    );
    let list = acl_list(&mut admin);
    assert!(
        list.contains(&"user alice off sanitize-payload resetchannels -@all".to_string()),
        "{list:?}"
    );

    // AUTH <password> is for the default user, which has no password.
    let mut d = s.raw_client();
    assert_eq!(
        d.cmd(&["AUTH", "pw"]),
        Resp::Error(
            "ERR AUTH <password> called without any password configured for the default \
             user. Are you sure your configuration is correct?"
                .into()
        )
    );
    assert_eq!(
        d.cmd(&["AUTH", "a", "b", "c"]),
        Resp::Error("ERR syntax error".into())
    );

    // Bad rules.
    assert_eq!(
        admin.cmd(&["ACL", "SETUSER", "x", "bogus"]),
        Resp::Error("ERR Error in ACL SETUSER modifier 'bogus': Syntax error".into())
    );
    assert_eq!(
        admin.cmd(&["ACL", "SETUSER", "x", "#abc"]),
        Resp::Error(
            "ERR Error in ACL SETUSER modifier '#abc': The password hash must be exactly 64 \
             characters and contain only lowercase hexadecimal characters"
                .into()
        )
    );
    assert_eq!(
        admin.cmd(&["ACL", "SETUSER", "x", "<nothere"]),
        Resp::Error(
            "ERR Error in ACL SETUSER modifier '<nothere': The password you are trying to \
             remove from the user does not exist"
                .into()
        )
    );
    assert_eq!(
        admin.cmd(&["ACL", "SETUSER", "x", "+nosuchcommand"]),
        Resp::Error(
            "ERR Error in ACL SETUSER modifier '+nosuchcommand': Unknown command or category \
             name in ACL"
                .into()
        )
    );
    assert_eq!(
        admin.cmd(&["ACL", "SETUSER", "x", "+@nosuchcategory"]),
        Resp::Error(
            "ERR Error in ACL SETUSER modifier '+@nosuchcategory': Unknown command or \
             category name in ACL"
                .into()
        )
    );
    // A failed SETUSER creates nothing.
    assert_eq!(admin.cmd(&["ACL", "GETUSER", "x"]), Resp::NullBulk);

    // A password on the default user: AUTH with one argument now works, new
    // connections need it, connections already open stay in.
    setuser(&mut admin, "default", &[">pw"]);
    let mut e = s.raw_client();
    assert_eq!(
        e.cmd(&["GET", "k"]),
        Resp::Error("NOAUTH Authentication required.".into())
    );
    assert_eq!(e.cmd(&["AUTH", "wrong"]), Resp::Error(WRONGPASS.into()));
    assert_eq!(e.cmd(&["AUTH", "pw"]), ok());
    assert_eq!(e.cmd(&["ACL", "WHOAMI"]), bulk("default"));
    assert_eq!(admin.cmd(&["PING"]), Resp::simple("PONG"));
}
threads_1_and_4!(
    passwords_and_auth,
    passwords_and_auth_t1,
    passwords_and_auth_t4
);

fn requirepass_protects_default_user(threads: usize) {
    let s = KiteServer::start(&["--requirepass", "x"], threads);
    let mut admin = s.client(); // the harness AUTHs with the password
    let v = Ver::of(&mut admin);

    let mut c = s.raw_client();
    let noauth = Resp::Error("NOAUTH Authentication required.".into());
    assert_eq!(c.cmd(&["PING"]), noauth);
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), noauth);
    assert_eq!(c.cmd(&["AUTH", "wrong"]), Resp::Error(WRONGPASS.into()));
    assert_eq!(c.cmd(&["AUTH", "x"]), ok());
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));

    let mut c2 = s.raw_client();
    assert_eq!(c2.cmd(&["AUTH", "default", "x"]), ok());
    assert_eq!(c2.cmd(&["ACL", "WHOAMI"]), bulk("default"));

    // requirepass is the default user's one password.
    let list = acl_list(&mut admin);
    assert_eq!(
        list,
        vec![v.list_line("default", "on", &format!("#{SHA_X} ~* &* +@all"))]
    );

    // Other users log in as usual.
    setuser(&mut admin, "alice", &["on", ">pw", "allkeys", "+@all"]);
    let mut c3 = s.raw_client();
    assert_eq!(c3.cmd(&["AUTH", "alice", "pw"]), ok());
    assert_eq!(c3.cmd(&["SET", "k", "v"]), ok());

    // HELLO without AUTH is refused; with AUTH it logs in.
    let mut h = s.raw_client();
    assert_eq!(h.cmd(&["HELLO", "3"]), v.hello_noauth());
    let r = h.cmd(&["HELLO", "3", "AUTH", "default", "x"]);
    assert!(matches!(r, Resp::Map(_)), "HELLO 3 AUTH: {r}");
    assert_eq!(h.cmd(&["GET", "k"]), bulk("v"));
}
threads_1_and_4!(
    requirepass_protects_default_user,
    requirepass_protects_default_user_t1,
    requirepass_protects_default_user_t4
);

fn hello_auth(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    setuser(&mut admin, "alice", &["on", ">pw", "allkeys", "+@all"]);
    setuser(&mut admin, "off_user", &["off", ">pw", "allkeys", "+@all"]);

    let mut c = s.raw_client();
    let r = c.cmd(&["HELLO", "3", "AUTH", "alice", "pw"]);
    let Resp::Map(pairs) = &r else {
        panic!("HELLO 3 AUTH: {r}")
    };
    assert!(
        pairs.contains(&(bulk("proto"), Resp::Integer(3))),
        "HELLO 3 reply: {r}"
    );
    // RESP3 from now on, logged in as alice.
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("alice"));
    assert_eq!(c.cmd(&["HSET", "h", "f", "v"]), Resp::Integer(1));
    assert!(matches!(c.cmd(&["HGETALL", "h"]), Resp::Map(_)));

    // HELLO 2 AUTH with SETNAME.
    let mut c2 = s.raw_client();
    let r = c2.cmd(&["HELLO", "2", "AUTH", "alice", "pw", "SETNAME", "worker"]);
    assert!(matches!(r, Resp::Array(_)), "HELLO 2 AUTH: {r}");
    assert_eq!(c2.cmd(&["ACL", "WHOAMI"]), bulk("alice"));
    assert_eq!(c2.cmd(&["CLIENT", "GETNAME"]), bulk("worker"));

    // Failures.
    let mut c3 = s.raw_client();
    assert_eq!(
        c3.cmd(&["HELLO", "3", "AUTH", "alice", "bad"]),
        Resp::Error(WRONGPASS.into())
    );
    assert_eq!(
        c3.cmd(&["HELLO", "3", "AUTH", "nobody", "pw"]),
        Resp::Error(WRONGPASS.into())
    );
    assert_eq!(
        c3.cmd(&["HELLO", "3", "AUTH", "off_user", "pw"]),
        Resp::Error(WRONGPASS.into())
    );
    // Still the default user, still RESP2.
    assert_eq!(c3.cmd(&["ACL", "WHOAMI"]), bulk("default"));
    assert_eq!(c3.cmd(&["HGETALL", "h"]), bulks(&["f", "v"]));
}
threads_1_and_4!(hello_auth, hello_auth_t1, hello_auth_t4);

// ---------------------------------------------------------------------------
// Command rules
// ---------------------------------------------------------------------------

fn command_rules(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);
    admin.cmd(&["SET", "k", "v"]);

    // +get only.
    setuser(&mut admin, "alice", &["on", "nopass", "allkeys", "+get"]);
    let mut a = login(s.port, "alice", "x");
    assert_eq!(a.cmd(&["GET", "k"]), bulk("v"));
    assert_eq!(a.cmd(&["SET", "k", "w"]), v.noperm_cmd("alice", "set"));
    assert_eq!(a.cmd(&["ping"]), v.noperm_cmd("alice", "ping"));
    // Unknown commands are still unknown, not denied.
    assert_err_prefix(&a.cmd(&["NOSUCHCMD"]), "ERR unknown command 'NOSUCHCMD'");
    assert_eq!(admin.cmd(&["GET", "k"]), bulk("v"));

    // +@read, then -get.
    setuser(&mut admin, "bob", &["on", "nopass", "allkeys", "+@read"]);
    let mut b = login(s.port, "bob", "x");
    assert_eq!(b.cmd(&["GET", "k"]), bulk("v"));
    assert_eq!(
        b.cmd(&["MGET", "k", "nokey"]),
        Resp::Array(vec![bulk("v"), Resp::NullBulk])
    );
    assert_eq!(b.cmd(&["STRLEN", "k"]), Resp::Integer(1));
    assert_eq!(b.cmd(&["SET", "k", "w"]), v.noperm_cmd("bob", "set"));
    assert_eq!(b.cmd(&["HSET", "h", "f", "v"]), v.noperm_cmd("bob", "hset"));
    assert_eq!(b.cmd(&["DEL", "k"]), v.noperm_cmd("bob", "del"));
    setuser(&mut admin, "bob", &["-get"]);
    assert_eq!(b.cmd(&["GET", "k"]), v.noperm_cmd("bob", "get"));
    assert_eq!(b.cmd(&["MGET", "k"]), Resp::Array(vec![bulk("v")]));

    // +@all -@dangerous.
    setuser(
        &mut admin,
        "carol",
        &["on", "nopass", "allkeys", "+@all", "-@dangerous"],
    );
    let mut c = login(s.port, "carol", "x");
    assert_eq!(c.cmd(&["SET", "k2", "v"]), ok());
    assert_eq!(c.cmd(&["FLUSHALL"]), v.noperm_cmd("carol", "flushall"));
    assert_eq!(c.cmd(&["KEYS", "*"]), v.noperm_cmd("carol", "keys"));
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "maxmemory", "0"]),
        v.noperm_cmd("carol", "config|set")
    );
    assert_eq!(c.cmd(&["DBSIZE"]), Resp::Integer(2));

    // nocommands +config|get: one subcommand of a container command.
    setuser(
        &mut admin,
        "dave",
        &["on", "nopass", "allkeys", "nocommands", "+config|get"],
    );
    let mut d = login(s.port, "dave", "x");
    let r = d.cmd(&["CONFIG", "GET", "maxmemory"]);
    assert_eq!(r, bulks(&["maxmemory", "0"]));
    assert_eq!(
        d.cmd(&["CONFIG", "SET", "maxmemory", "0"]),
        v.noperm_cmd("dave", "config|set")
    );
    assert_eq!(d.cmd(&["GET", "k"]), v.noperm_cmd("dave", "get"));
    // allcommands, then nocommands again.
    setuser(&mut admin, "dave", &["allcommands"]);
    assert_eq!(d.cmd(&["SET", "k3", "v"]), ok());
    assert_eq!(d.cmd(&["FLUSHALL"]), ok());
    setuser(&mut admin, "dave", &["nocommands"]);
    assert_eq!(d.cmd(&["PING"]), v.noperm_cmd("dave", "ping"));
    assert_eq!(
        d.cmd(&["ACL", "WHOAMI"]),
        v.noperm_cmd("dave", "acl|whoami")
    );
    // AUTH is always allowed: dave can switch to another user.
    assert_eq!(d.cmd(&["AUTH", "carol", "x"]), ok());
    assert_eq!(d.cmd(&["ACL", "WHOAMI"]), bulk("carol"));

    // A denied command inside MULTI is refused when queued and aborts EXEC.
    assert_eq!(a.cmd(&["MULTI"]), v.noperm_cmd("alice", "multi"));
    setuser(&mut admin, "alice", &["+multi", "+exec"]);
    assert_eq!(a.cmd(&["MULTI"]), ok());
    assert_eq!(a.cmd(&["GET", "k"]), Resp::simple("QUEUED"));
    assert_eq!(a.cmd(&["SET", "k", "w"]), v.noperm_cmd("alice", "set"));
    assert_eq!(
        a.cmd(&["EXEC"]),
        Resp::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(admin.cmd(&["GET", "k"]), Resp::NullBulk); // FLUSHALL above
}
threads_1_and_4!(command_rules, command_rules_t1, command_rules_t4);

/// EXEC checks each queued command again: rules changed since MULTI refuse that command
/// alone, with its own error in EXEC's reply.
fn rules_changed_before_exec(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    admin.cmd(&["SET", "other", "o"]);
    setuser(&mut admin, "alice", &["on", "nopass", "allkeys", "+@all"]);
    let mut a = login(s.port, "alice", "x");
    assert_eq!(a.cmd(&["MULTI"]), ok());
    assert_eq!(a.cmd(&["SET", "k1", "v"]), Resp::simple("QUEUED"));
    assert_eq!(a.cmd(&["GET", "other"]), Resp::simple("QUEUED"));
    assert_eq!(a.cmd(&["INCR", "n"]), Resp::simple("QUEUED"));
    assert_eq!(a.cmd(&["GET", "n"]), Resp::simple("QUEUED"));
    setuser(&mut admin, "alice", &["-set", "resetkeys", "~n*"]);
    let prefix = "NOPERM ACLs rules changed between the moment the transaction was accumulated \
                  and the EXEC call. This command is no longer allowed for the following \
                  reason: ";
    assert_eq!(
        a.cmd(&["EXEC"]),
        Resp::Array(vec![
            Resp::Error(format!(
                "{prefix}no permission to execute the command or subcommand"
            )),
            Resp::Error(format!("{prefix}no permission to touch the specified keys")),
            Resp::Integer(1),
            bulk("1"),
        ])
    );
    assert_eq!(admin.cmd(&["EXISTS", "k1"]), Resp::Integer(0));
    let log = acl_log(&mut admin, None);
    let summary: Vec<(String, String, String)> = log
        .iter()
        .map(|e| {
            (
                field_str(e, "reason"),
                field_str(e, "context"),
                field_str(e, "object"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("key".to_string(), "multi".to_string(), "other".to_string()),
            (
                "command".to_string(),
                "multi".to_string(),
                "set".to_string()
            ),
        ]
    );
}
threads_1_and_4!(
    rules_changed_before_exec,
    rules_changed_before_exec_t1,
    rules_changed_before_exec_t4
);

/// Rule changes apply to connections already logged in, on every thread.
fn rule_changes_reach_open_connections(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);
    for i in 0..16 {
        admin.cmd(&["SET", &format!("key:{i}"), &i.to_string()]);
    }
    setuser(&mut admin, "alice", &["on", "nopass", "allkeys", "+set"]);
    let mut conns: Vec<Client> = (0..8).map(|_| login(s.port, "alice", "x")).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        // Touch different keys so that connections may settle on different shards.
        assert_eq!(c.cmd(&["SET", &format!("key:{i}"), "x"]), ok());
        assert_eq!(
            c.cmd(&["GET", &format!("key:{i}")]),
            v.noperm_cmd("alice", "get")
        );
    }
    setuser(&mut admin, "alice", &["+get"]);
    for (i, c) in conns.iter_mut().enumerate() {
        assert_eq!(c.cmd(&["GET", &format!("key:{i}")]), bulk("x"));
    }
    setuser(&mut admin, "alice", &["resetkeys", "~key:1*"]);
    for (i, c) in conns.iter_mut().enumerate() {
        let r = c.cmd(&["GET", &format!("key:{}", i + 8)]);
        if i + 8 >= 10 {
            assert_eq!(r, bulk(&(i + 8).to_string()));
        } else {
            assert_eq!(r, v.noperm_key());
        }
    }
    setuser(&mut admin, "alice", &["-get"]);
    for (i, c) in conns.iter_mut().enumerate() {
        assert_eq!(
            c.cmd(&["GET", &format!("key:1{i}")]),
            v.noperm_cmd("alice", "get")
        );
    }
}
threads_1_and_4!(
    rule_changes_reach_open_connections,
    rule_changes_reach_open_connections_t1,
    rule_changes_reach_open_connections_t4
);

// ---------------------------------------------------------------------------
// Key patterns
// ---------------------------------------------------------------------------

fn key_patterns(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);

    // ~foo*
    setuser(&mut admin, "alice", &["on", "nopass", "~foo*", "+@all"]);
    let mut a = login(s.port, "alice", "x");
    assert_eq!(a.cmd(&["SET", "foo1", "v"]), ok());
    assert_eq!(a.cmd(&["GET", "foo1"]), bulk("v"));
    assert_eq!(a.cmd(&["SET", "bar", "v"]), v.noperm_key());
    assert_eq!(a.cmd(&["GET", "bar"]), v.noperm_key());
    assert_eq!(a.cmd(&["EXISTS", "bar"]), v.noperm_key());
    // Commands without keys are not affected.
    assert_eq!(a.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(a.cmd(&["DBSIZE"]), Resp::Integer(1));
    assert_eq!(admin.cmd(&["EXISTS", "bar"]), Resp::Integer(0));

    // Glob classes in patterns.
    setuser(&mut admin, "alice", &["~x[ab]:*"]);
    assert_eq!(a.cmd(&["SET", "xa:1", "v"]), ok());
    assert_eq!(a.cmd(&["SET", "xb:1", "v"]), ok());
    assert_eq!(a.cmd(&["SET", "xc:1", "v"]), v.noperm_key());

    // resetkeys, then allkeys.
    setuser(&mut admin, "alice", &["resetkeys"]);
    assert_eq!(a.cmd(&["GET", "foo1"]), v.noperm_key());
    assert_eq!(a.cmd(&["SET", "xa:1", "v"]), v.noperm_key());
    setuser(&mut admin, "alice", &["allkeys"]);
    assert_eq!(a.cmd(&["SET", "bar", "v"]), ok());
    setuser(&mut admin, "alice", &["resetkeys", "~bar"]);
    assert_eq!(a.cmd(&["GET", "bar"]), bulk("v"));
    assert_eq!(a.cmd(&["GET", "foo1"]), v.noperm_key());

    // %R~ read-only and %W~ write-only patterns.
    admin.cmd(&["SET", "r1", "read-me"]);
    admin.cmd(&["SET", "w1", "write-me"]);
    setuser(
        &mut admin,
        "bob",
        &["on", "nopass", "%R~r*", "%W~w*", "+@all"],
    );
    let mut b = login(s.port, "bob", "x");
    assert_eq!(b.cmd(&["GET", "r1"]), bulk("read-me"));
    assert_eq!(b.cmd(&["STRLEN", "r1"]), Resp::Integer(7));
    assert_eq!(b.cmd(&["SET", "r1", "v"]), v.noperm_key());
    assert_eq!(b.cmd(&["APPEND", "r1", "v"]), v.noperm_key());
    assert_eq!(b.cmd(&["SET", "w1", "v"]), ok());
    assert_eq!(b.cmd(&["GET", "w1"]), v.noperm_key());
    // COPY reads its source and writes its destination.
    assert_eq!(b.cmd(&["COPY", "r1", "w2"]), Resp::Integer(1));
    assert_eq!(b.cmd(&["COPY", "w1", "r2"]), v.noperm_key());
    assert_eq!(admin.cmd(&["GET", "w2"]), bulk("read-me"));
    assert_eq!(admin.cmd(&["EXISTS", "r2"]), Resp::Integer(0));
    // %RW~ is the same as ~.
    setuser(&mut admin, "bob", &["%RW~rw*"]);
    assert_eq!(b.cmd(&["SET", "rw1", "v"]), ok());
    assert_eq!(b.cmd(&["GET", "rw1"]), bulk("v"));
}
threads_1_and_4!(key_patterns, key_patterns_t1, key_patterns_t4);

/// Commands on many keys (spread over every shard at --threads 4) with one denied key:
/// the whole command is refused and nothing is written.
fn multi_key_commands(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);
    setuser(&mut admin, "alice", &["on", "nopass", "~k:*", "+@all"]);
    let mut a = login(s.port, "alice", "x");
    let keys: Vec<String> = (0..64).map(|i| format!("k:{i}")).collect();

    // MSET of 64 allowed keys and one denied key.
    let mut mset: Vec<String> = vec!["MSET".into()];
    for k in &keys {
        mset.push(k.clone());
        mset.push("v".into());
    }
    let mut denied = mset.clone();
    denied.extend(["other".to_string(), "v".to_string()]);
    assert_eq!(a.cmd(&denied), v.noperm_key());
    let mut exists: Vec<String> = vec!["EXISTS".into()];
    exists.extend(keys.iter().cloned());
    exists.push("other".into());
    assert_eq!(admin.cmd(&exists), Resp::Integer(0));
    // Denied key first.
    let mut denied_first: Vec<String> = vec!["MSET".into(), "other".into(), "v".into()];
    denied_first.extend(mset[1..].iter().cloned());
    assert_eq!(a.cmd(&denied_first), v.noperm_key());
    assert_eq!(admin.cmd(&exists), Resp::Integer(0));

    assert_eq!(a.cmd(&mset), ok());
    let mut mget: Vec<String> = vec!["MGET".into()];
    mget.extend(keys.iter().cloned());
    let r = a.cmd(&mget);
    assert_eq!(r.as_array().map(|x| x.len()), Some(64), "{r}");
    let mut mget_denied = mget.clone();
    mget_denied.insert(33, "other".into());
    assert_eq!(a.cmd(&mget_denied), v.noperm_key());

    // DEL / UNLINK of allowed keys plus a denied one deletes nothing.
    admin.cmd(&["SET", "other", "v"]);
    let mut del: Vec<String> = vec!["DEL".into()];
    del.extend(keys.iter().cloned());
    del.push("other".into());
    assert_eq!(a.cmd(&del), v.noperm_key());
    del[0] = "UNLINK".into();
    assert_eq!(a.cmd(&del), v.noperm_key());
    assert_eq!(admin.cmd(&exists), Resp::Integer(65));

    // Set operations: a denied source or a denied destination.
    admin.cmd(&["SADD", "k:s1", "a", "b"]);
    admin.cmd(&["SADD", "k:s2", "b", "c"]);
    admin.cmd(&["SADD", "secret-set", "z"]);
    assert_eq!(
        a.cmd(&["SUNIONSTORE", "k:dest", "k:s1", "k:s2"]),
        Resp::Integer(3)
    );
    assert_eq!(
        a.cmd(&["SUNIONSTORE", "k:dest", "k:s1", "secret-set"]),
        v.noperm_key()
    );
    assert_eq!(
        a.cmd(&["SUNIONSTORE", "elsewhere", "k:s1", "k:s2"]),
        v.noperm_key()
    );
    assert_eq!(admin.cmd(&["EXISTS", "elsewhere"]), Resp::Integer(0));
    assert_eq!(admin.cmd(&["SCARD", "k:dest"]), Resp::Integer(3));
    // RENAME to a denied name.
    assert_eq!(a.cmd(&["RENAME", "k:dest", "outside"]), v.noperm_key());
    assert_eq!(
        admin.cmd(&["EXISTS", "k:dest", "outside"]),
        Resp::Integer(1)
    );

    // All 64 allowed keys deleted at once.
    del.pop();
    del[0] = "DEL".into();
    assert_eq!(a.cmd(&del), Resp::Integer(64));
}
threads_1_and_4!(
    multi_key_commands,
    multi_key_commands_t1,
    multi_key_commands_t4
);

// ---------------------------------------------------------------------------
// Channels
// ---------------------------------------------------------------------------

fn channels(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);

    // A new user has no channels (acl-pubsub-default resetchannels).
    setuser(&mut admin, "bob", &["on", "nopass", "allkeys", "+@all"]);
    let mut b = login(s.port, "bob", "x");
    assert_eq!(b.cmd(&["PUBLISH", "any", "m"]), v.noperm_channel());
    setuser(&mut admin, "bob", &["allchannels"]);
    assert_eq!(b.cmd(&["PUBLISH", "any", "m"]), Resp::Integer(0));
    setuser(&mut admin, "bob", &["resetchannels"]);
    assert_eq!(b.cmd(&["PUBLISH", "any", "m"]), v.noperm_channel());

    // &chan*
    setuser(
        &mut admin,
        "alice",
        &["on", "nopass", "allkeys", "+@all", "&chan*"],
    );
    let mut p = login(s.port, "alice", "x");
    assert_eq!(p.cmd(&["PUBLISH", "chan1", "m"]), Resp::Integer(0));
    assert_eq!(p.cmd(&["PUBLISH", "other", "m"]), v.noperm_channel());

    let mut sub = login(s.port, "alice", "x");
    assert_eq!(sub.cmd(&["SUBSCRIBE", "other"]), v.noperm_channel());
    // One denied channel refuses the whole command.
    assert_eq!(
        sub.cmd(&["SUBSCRIBE", "chan2", "other"]),
        v.noperm_channel()
    );
    assert_eq!(admin.cmd(&["PUBLISH", "chan2", "m"]), Resp::Integer(0));
    // A pattern must be one of the allowed patterns, literally.
    assert_eq!(sub.cmd(&["PSUBSCRIBE", "ch*"]), v.noperm_channel());
    assert_eq!(sub.cmd(&["PSUBSCRIBE", "chan1*"]), v.noperm_channel());
    assert_eq!(
        sub.cmd(&["SUBSCRIBE", "chan1"]),
        Resp::Array(vec![bulk("subscribe"), bulk("chan1"), Resp::Integer(1)])
    );
    assert_eq!(
        sub.cmd(&["PSUBSCRIBE", "chan*"]),
        Resp::Array(vec![bulk("psubscribe"), bulk("chan*"), Resp::Integer(2)])
    );
    assert_eq!(p.cmd(&["PUBLISH", "chan1", "hello"]), Resp::Integer(2));
    assert_eq!(
        sub.read(),
        Resp::Array(vec![bulk("message"), bulk("chan1"), bulk("hello")])
    );
    assert_eq!(
        sub.read(),
        Resp::Array(vec![
            bulk("pmessage"),
            bulk("chan*"),
            bulk("chan1"),
            bulk("hello")
        ])
    );
    // Denied while subscribed: an error, the subscriptions stay.
    assert_eq!(sub.cmd(&["SUBSCRIBE", "other"]), v.noperm_channel());
    assert_eq!(admin.cmd(&["PUBLISH", "chan1", "again"]), Resp::Integer(2));
    assert_eq!(
        sub.read(),
        Resp::Array(vec![bulk("message"), bulk("chan1"), bulk("again")])
    );
    assert_eq!(
        sub.read(),
        Resp::Array(vec![
            bulk("pmessage"),
            bulk("chan*"),
            bulk("chan1"),
            bulk("again")
        ])
    );

    // Taking the channel away disconnects the subscriber, not the publisher.
    setuser(&mut admin, "alice", &["resetchannels", "&news"]);
    assert_closed(&mut sub, "alice subscribed to chan1 after resetchannels");
    assert_eq!(p.cmd(&["PUBLISH", "chan1", "m"]), v.noperm_channel());
    assert_eq!(p.cmd(&["PUBLISH", "news", "m"]), Resp::Integer(0));
}
threads_1_and_4!(channels, channels_t1, channels_t4);

// ---------------------------------------------------------------------------
// Selectors and GETUSER
// ---------------------------------------------------------------------------

fn selectors(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);
    admin.cmd(&["SET", "sel1", "s"]);
    admin.cmd(&["SET", "foo1", "f"]);

    setuser(
        &mut admin,
        "alice",
        &["on", "nopass", "~foo*", "+set", "(+get ~sel*)"],
    );
    let mut a = login(s.port, "alice", "x");
    // The root allows SET on foo*, the selector GET on sel*.
    assert_eq!(a.cmd(&["SET", "foo1", "v"]), ok());
    assert_eq!(a.cmd(&["GET", "sel1"]), bulk("s"));
    // Both fail: a key error wins over a command error.
    assert_eq!(a.cmd(&["GET", "foo1"]), v.noperm_key());
    assert_eq!(a.cmd(&["SET", "sel1", "v"]), v.noperm_key());
    // Neither allows the command at all.
    assert_eq!(a.cmd(&["DEL", "foo1"]), v.noperm_cmd("alice", "del"));

    // A second selector, and read-only keys in it.
    setuser(&mut admin, "alice", &["(+strlen %R~ro*)"]);
    admin.cmd(&["SET", "ro1", "abc"]);
    assert_eq!(a.cmd(&["STRLEN", "ro1"]), Resp::Integer(3));
    assert_eq!(a.cmd(&["GET", "sel1"]), bulk("s"));

    let fields = getuser_fields(&mut admin, "alice");
    let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "flags",
            "passwords",
            "commands",
            "keys",
            "channels",
            "selectors"
        ]
    );
    assert_eq!(
        fields[5].1,
        Resp::Array(vec![
            Resp::Array(vec![
                bulk("commands"),
                bulk("-@all +get"),
                bulk("keys"),
                bulk("~sel*"),
                bulk("channels"),
                bulk(""),
            ]),
            Resp::Array(vec![
                bulk("commands"),
                bulk("-@all +strlen"),
                bulk("keys"),
                bulk("%R~ro*"),
                bulk("channels"),
                bulk(""),
            ]),
        ])
    );
    let list = acl_list(&mut admin);
    assert!(
        list.contains(&v.list_line(
            "alice",
            "on nopass",
            "~foo* resetchannels -@all +set (~sel* resetchannels -@all +get) \
             (%R~ro* resetchannels -@all +strlen)"
        )),
        "{list:?}"
    );

    // clearselectors keeps the root only.
    setuser(&mut admin, "alice", &["clearselectors"]);
    assert_eq!(a.cmd(&["GET", "sel1"]), v.noperm_cmd("alice", "get"));
    assert_eq!(a.cmd(&["SET", "foo1", "w"]), ok());
    assert_eq!(
        getuser_fields(&mut admin, "alice")[5].1,
        Resp::Array(vec![])
    );

    assert_eq!(
        admin.cmd(&["ACL", "SETUSER", "alice", "(+get"]),
        Resp::Error("ERR Unmatched parenthesis in acl selector starting at '(+get'.".into())
    );
}
threads_1_and_4!(selectors, selectors_t1, selectors_t4);

fn getuser_reply_shape(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);

    assert_eq!(
        admin.cmd(&["ACL", "GETUSER", "default"]),
        Resp::Array(vec![
            bulk("flags"),
            v.flag_array(&["on", "nopass"]),
            bulk("passwords"),
            Resp::Array(vec![]),
            bulk("commands"),
            bulk("+@all"),
            bulk("keys"),
            bulk("~*"),
            bulk("channels"),
            bulk("&*"),
            bulk("selectors"),
            Resp::Array(vec![]),
        ])
    );

    setuser(
        &mut admin,
        "alice",
        &["on", ">pw", ">secret", "~foo*", "%R~r*", "&chan*", "+get"],
    );
    assert_eq!(
        admin.cmd(&["ACL", "GETUSER", "alice"]),
        Resp::Array(vec![
            bulk("flags"),
            v.flag_array(&["on"]),
            bulk("passwords"),
            bulks(&[SHA_PW, SHA_SECRET]),
            bulk("commands"),
            bulk("-@all +get"),
            bulk("keys"),
            bulk("~foo* %R~r*"),
            bulk("channels"),
            bulk("&chan*"),
            bulk("selectors"),
            Resp::Array(vec![]),
        ])
    );

    // A subcommand rule. (Only one command per rule list here: 7.0 lists several
    // single commands in no fixed order.)
    setuser(&mut admin, "sub", &["on", "nopass", "+config|get"]);
    assert_eq!(
        getuser_fields(&mut admin, "sub")[2],
        ("commands".to_string(), bulk("-@all +config|get"))
    );

    setuser(&mut admin, "bob", &[]);
    assert_eq!(
        admin.cmd(&["ACL", "GETUSER", "bob"]),
        Resp::Array(vec![
            bulk("flags"),
            v.flag_array(&["off"]),
            bulk("passwords"),
            Resp::Array(vec![]),
            bulk("commands"),
            bulk("-@all"),
            bulk("keys"),
            bulk(""),
            bulk("channels"),
            bulk(""),
            bulk("selectors"),
            Resp::Array(vec![]),
        ])
    );

    setuser(
        &mut admin,
        "carol",
        &[
            "on",
            "nopass",
            "allkeys",
            "allchannels",
            "+@all",
            "-flushall",
            "(+set %W~w*)",
        ],
    );
    assert_eq!(
        admin.cmd(&["ACL", "GETUSER", "carol"]),
        Resp::Array(vec![
            bulk("flags"),
            v.flag_array(&["on", "nopass"]),
            bulk("passwords"),
            Resp::Array(vec![]),
            bulk("commands"),
            bulk("+@all -flushall"),
            bulk("keys"),
            bulk("~*"),
            bulk("channels"),
            bulk("&*"),
            bulk("selectors"),
            Resp::Array(vec![Resp::Array(vec![
                bulk("commands"),
                bulk("-@all +set"),
                bulk("keys"),
                bulk("%W~w*"),
                bulk("channels"),
                bulk(""),
            ])]),
        ])
    );

    assert_eq!(admin.cmd(&["ACL", "GETUSER", "nobody"]), Resp::NullBulk);

    // RESP3: a map, flags as a set.
    let mut c3 = s.client();
    let r = c3.cmd(&["HELLO", "3"]);
    assert!(matches!(r, Resp::Map(_)), "{r}");
    let r = c3.cmd(&["ACL", "GETUSER", "alice"]);
    let Resp::Map(pairs) = &r else {
        panic!("RESP3 ACL GETUSER: {r}")
    };
    let keys: Vec<Resp> = pairs.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(
        keys,
        [
            "flags",
            "passwords",
            "commands",
            "keys",
            "channels",
            "selectors"
        ]
        .iter()
        .map(|s| bulk(s))
        .collect::<Vec<_>>()
    );
    let Resp::Set(flags) = &pairs[0].1 else {
        panic!("RESP3 flags not a set: {r}")
    };
    assert!(flags.contains(&bulk("on")), "{r}");
    assert_eq!(pairs[2].1, bulk("-@all +get"));
    assert_eq!(c3.cmd(&["ACL", "GETUSER", "nobody"]), Resp::Null);
}
threads_1_and_4!(
    getuser_reply_shape,
    getuser_reply_shape_t1,
    getuser_reply_shape_t4
);

// ---------------------------------------------------------------------------
// Scripts
// ---------------------------------------------------------------------------

fn scripts(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);
    admin.cmd(&["SET", "foo1", "f"]);
    admin.cmd(&["SET", "bar", "b"]);

    setuser(&mut admin, "alice", &["on", "nopass", "~foo*", "+get"]);
    let mut a = login(s.port, "alice", "x");
    // EVAL itself needs permission.
    assert_eq!(
        a.cmd(&["EVAL", "return 1", "0"]),
        v.noperm_cmd("alice", "eval")
    );
    setuser(&mut admin, "alice", &["+eval", "+evalsha", "+script|load"]);
    assert_eq!(a.cmd(&["EVAL", "return 1", "0"]), Resp::Integer(1));
    assert_eq!(
        a.cmd(&["EVAL", "return redis.call('get', KEYS[1])", "1", "foo1"]),
        bulk("f")
    );

    // A command the user may not run.
    let r = a.cmd(&["EVAL", "return redis.call('set', 'foo1', 'x')", "0"]);
    let text = r
        .error_text()
        .unwrap_or_else(|| panic!("expected an error, got {r}"));
    let want = v.script_cmd_denied("alice", "set");
    assert!(
        text.starts_with(&want),
        "got {text:?}, want it to start with {want:?}"
    );
    assert_eq!(admin.cmd(&["GET", "foo1"]), bulk("f"));

    // A key the user may not touch, named inside the script.
    let r = a.cmd(&["EVAL", "return redis.call('get', 'bar')", "0"]);
    let text = r
        .error_text()
        .unwrap_or_else(|| panic!("expected an error, got {r}"));
    let want = v.script_key_denied();
    assert!(
        text.starts_with(&want),
        "got {text:?}, want it to start with {want:?}"
    );
    // redis.pcall hands the error to the script, which returns it.
    assert_eq!(
        a.cmd(&["EVAL", "return redis.pcall('get', 'bar')", "0"]),
        Resp::Error(v.script_key_denied())
    );
    let r = a.cmd(&[
        "EVAL",
        "local e = redis.pcall('set', 'foo1', 'x'); return type(e) == 'table' and e.err ~= nil",
        "0",
    ]);
    assert_eq!(r, Resp::Integer(1));
    // A denied key declared in KEYS refuses EVAL before it runs.
    assert_eq!(
        a.cmd(&["EVAL", "return redis.call('get', KEYS[1])", "1", "bar"]),
        v.noperm_key()
    );

    // EVALSHA of a script loaded by someone else is checked the same way.
    let sha = admin
        .cmd(&[
            "SCRIPT",
            "LOAD",
            "return redis.call('set', KEYS[1], ARGV[1])",
        ])
        .as_string()
        .expect("sha");
    let r = a.cmd(&["EVALSHA", &sha, "1", "foo1", "y"]);
    let text = r
        .error_text()
        .unwrap_or_else(|| panic!("expected an error, got {r}"));
    assert!(
        text.starts_with(&v.script_cmd_denied("alice", "set")),
        "{text}"
    );
    setuser(&mut admin, "alice", &["+set"]);
    assert_eq!(a.cmd(&["EVALSHA", &sha, "1", "foo1", "y"]), ok());
    assert_eq!(admin.cmd(&["GET", "foo1"]), bulk("y"));
}
threads_1_and_4!(scripts, scripts_t1, scripts_t4);

// ---------------------------------------------------------------------------
// ACL LIST, USERS, DELUSER, CAT, GENPASS, DRYRUN, LOG
// ---------------------------------------------------------------------------

fn list_users_deluser(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);

    assert_eq!(
        acl_list(&mut admin),
        vec![v.list_line("default", "on nopass", "~* &* +@all")]
    );
    assert_eq!(admin.cmd(&["ACL", "USERS"]), bulks(&["default"]));

    setuser(&mut admin, "alice", &["on", ">pw", "~foo*", "+get"]);
    setuser(
        &mut admin,
        "carol",
        &["on", ">secret", ">pw", "~*", "&*", "+@all", "-@dangerous"],
    );
    setuser(&mut admin, "dave", &[]);
    setuser(
        &mut admin,
        "erin",
        &[
            "on",
            "nopass",
            "allkeys",
            "allchannels",
            "allcommands",
            "-flushall",
        ],
    );
    setuser(
        &mut admin,
        "bob",
        &[
            "on", "nopass", "%R~r*", "%W~w*", "~foo*", "&chan*", "+@read",
        ],
    );
    assert_eq!(
        acl_list(&mut admin),
        vec![
            v.list_line(
                "alice",
                "on",
                &format!("#{SHA_PW} ~foo* resetchannels -@all +get")
            ),
            v.list_line(
                "bob",
                "on nopass",
                "%R~r* %W~w* ~foo* resetchannels &chan* -@all +@read"
            ),
            v.list_line(
                "carol",
                "on",
                &format!("#{SHA_SECRET} #{SHA_PW} ~* &* +@all -@dangerous")
            ),
            v.list_line("dave", "off", "resetchannels -@all"),
            v.list_line("default", "on nopass", "~* &* +@all"),
            v.list_line("erin", "on nopass", "~* &* +@all -flushall"),
        ]
    );
    assert_eq!(
        admin.cmd(&["ACL", "USERS"]),
        bulks(&["alice", "bob", "carol", "dave", "default", "erin"])
    );

    // The default user can be changed but not deleted.
    setuser(&mut admin, "default", &["resetkeys", "~*", "-flushall"]);
    assert!(acl_list(&mut admin).contains(&v.list_line(
        "default",
        "on nopass",
        "~* &* +@all -flushall"
    )));
    assert_eq!(
        admin.cmd(&["ACL", "DELUSER", "default"]),
        Resp::Error("ERR The 'default' user cannot be removed".into())
    );
    assert_eq!(
        admin.cmd(&["ACL", "DELUSER", "alice", "default"]),
        Resp::Error("ERR The 'default' user cannot be removed".into())
    );

    // DELUSER counts the users it removed; unknown names count 0.
    assert_eq!(
        admin.cmd(&["ACL", "DELUSER", "alice", "nobody"]),
        Resp::Integer(1)
    );
    assert_eq!(admin.cmd(&["ACL", "DELUSER", "alice"]), Resp::Integer(0));
    assert_eq!(
        admin.cmd(&["ACL", "DELUSER", "carol", "dave", "carol"]),
        Resp::Integer(2)
    );
    assert_eq!(
        admin.cmd(&["ACL", "USERS"]),
        bulks(&["bob", "default", "erin"])
    );
    let mut c = s.raw_client();
    assert_eq!(
        c.cmd(&["AUTH", "alice", "pw"]),
        Resp::Error(WRONGPASS.into())
    );
    // A deleted name can be created again, from scratch.
    setuser(&mut admin, "alice", &[]);
    assert!(acl_list(&mut admin).contains(&v.list_line("alice", "off", "resetchannels -@all")));
}
threads_1_and_4!(
    list_users_deluser,
    list_users_deluser_t1,
    list_users_deluser_t4
);

#[test]
fn acl_cat() {
    let s = KiteServer::start(&[], 1);
    let mut admin = s.client();
    let cats: Vec<String> = admin
        .cmd(&["ACL", "CAT"])
        .as_array()
        .expect("ACL CAT array")
        .iter()
        .map(|x| x.as_string().unwrap())
        .collect();
    for want in [
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
    ] {
        assert!(
            cats.iter().any(|c| c == want),
            "ACL CAT lacks {want}: {cats:?}"
        );
    }

    let members = |c: &mut Client, cat: &str| -> Vec<String> {
        c.cmd(&["ACL", "CAT", cat])
            .as_array()
            .unwrap_or_else(|| panic!("ACL CAT {cat}"))
            .iter()
            .map(|x| x.as_string().unwrap())
            .collect()
    };
    let read = members(&mut admin, "read");
    for cmd in [
        "get", "mget", "hget", "lrange", "zrange", "xrange", "exists",
    ] {
        assert!(
            read.iter().any(|c| c == cmd),
            "ACL CAT read lacks {cmd}: {read:?}"
        );
    }
    for cmd in ["set", "del", "flushall"] {
        assert!(!read.iter().any(|c| c == cmd), "ACL CAT read has {cmd}");
    }
    let write = members(&mut admin, "write");
    for cmd in ["set", "del", "lpush", "hset"] {
        assert!(
            write.iter().any(|c| c == cmd),
            "ACL CAT write lacks {cmd}: {write:?}"
        );
    }
    assert!(!write.iter().any(|c| c == "get"));
    let dangerous = members(&mut admin, "dangerous");
    for cmd in ["flushall", "flushdb", "keys", "debug"] {
        assert!(
            dangerous.iter().any(|c| c == cmd),
            "ACL CAT dangerous lacks {cmd}"
        );
    }
    let pubsub = members(&mut admin, "pubsub");
    for cmd in ["publish", "subscribe", "psubscribe"] {
        assert!(
            pubsub.iter().any(|c| c == cmd),
            "ACL CAT pubsub lacks {cmd}"
        );
    }
    assert_eq!(
        admin.cmd(&["ACL", "CAT", "nosuchcategory"]),
        Resp::Error("ERR Unknown category 'nosuchcategory'".into())
    );
}

#[test]
fn acl_genpass() {
    let s = KiteServer::start(&[], 1);
    let mut admin = s.client();
    let hex = |r: &Resp| -> String {
        let t = r.as_string().unwrap_or_else(|| panic!("GENPASS: {r}"));
        assert!(
            t.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "not lowercase hex: {t:?}"
        );
        t
    };
    let p1 = hex(&admin.cmd(&["ACL", "GENPASS"]));
    let p2 = hex(&admin.cmd(&["ACL", "GENPASS"]));
    assert_eq!(p1.len(), 64);
    assert_eq!(p2.len(), 64);
    assert_ne!(p1, p2);
    // bits are rounded up to whole hex digits.
    for (bits, len) in [("128", 32), ("5", 2), ("1", 1), ("4", 1), ("4096", 1024)] {
        let p = hex(&admin.cmd(&["ACL", "GENPASS", bits]));
        assert_eq!(p.len(), len, "ACL GENPASS {bits}: {p}");
    }
    let err = Resp::Error(
        "ERR ACL GENPASS argument must be the number of bits for the output password, a \
         positive number up to 4096"
            .into(),
    );
    assert_eq!(admin.cmd(&["ACL", "GENPASS", "0"]), err);
    assert_eq!(admin.cmd(&["ACL", "GENPASS", "-8"]), err);
    assert_eq!(admin.cmd(&["ACL", "GENPASS", "4097"]), err);
    assert!(admin.cmd(&["ACL", "GENPASS", "abc"]).is_error());
}

fn dryrun(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);
    setuser(
        &mut admin,
        "alice",
        &[
            "on",
            "nopass",
            "~foo*",
            "&chan*",
            "+get",
            "+publish",
            "+config|get",
            "(+set ~sel*)",
        ],
    );
    let dry = |c: &mut Client, args: &[&str]| {
        let mut full = vec!["ACL", "DRYRUN", "alice"];
        full.extend_from_slice(args);
        c.cmd(&full)
    };
    assert_eq!(dry(&mut admin, &["GET", "foo1"]), ok());
    assert_eq!(dry(&mut admin, &["SET", "sel1", "v"]), ok());
    assert_eq!(dry(&mut admin, &["PUBLISH", "chan1", "m"]), ok());
    assert_eq!(dry(&mut admin, &["CONFIG", "GET", "maxmemory"]), ok());
    assert_eq!(
        dry(&mut admin, &["DEL", "foo1"]),
        v.dryrun_cmd("alice", "del")
    );
    assert_eq!(
        dry(&mut admin, &["CONFIG", "SET", "maxmemory", "0"]),
        v.dryrun_cmd("alice", "config|set")
    );
    assert_eq!(
        dry(&mut admin, &["GET", "bar"]),
        v.dryrun_key("alice", "bar")
    );
    assert_eq!(
        dry(&mut admin, &["PUBLISH", "other", "m"]),
        v.dryrun_channel("alice", "other")
    );
    // Nothing ran.
    assert_eq!(admin.cmd(&["EXISTS", "sel1"]), Resp::Integer(0));
    assert_eq!(
        admin.cmd(&["ACL", "DRYRUN", "nobody", "GET", "k"]),
        Resp::Error("ERR User 'nobody' not found".into())
    );
    assert_eq!(
        dry(&mut admin, &["NOSUCHCMD", "k"]),
        Resp::Error("ERR Command 'NOSUCHCMD' not found".into())
    );
    assert_eq!(
        dry(&mut admin, &["GET"]),
        Resp::Error("ERR wrong number of arguments for 'get' command".into())
    );
}
threads_1_and_4!(dryrun, dryrun_t1, dryrun_t4);

fn acl_log_entries(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);
    assert_eq!(admin.cmd(&["ACL", "LOG"]), Resp::Array(vec![]));
    setuser(
        &mut admin,
        "alice",
        &[
            "on", ">pw", "~foo*", "&chan*", "+get", "+publish", "+multi", "+exec", "+eval",
        ],
    );

    // A failed AUTH: reason auth, the attempted user name.
    let mut c = s.raw_client();
    assert_eq!(
        c.cmd(&["auth", "alice", "wrong"]),
        Resp::Error(WRONGPASS.into())
    );
    let log = acl_log(&mut admin, None);
    assert_eq!(log.len(), 1, "{log:?}");
    let e = &log[0];
    let names: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, v.log_fields());
    assert_eq!(field(e, "count"), &Resp::Integer(1));
    assert_eq!(field_str(e, "reason"), "auth");
    assert_eq!(field_str(e, "context"), "toplevel");
    assert_eq!(field_str(e, "object"), "auth");
    assert_eq!(field_str(e, "username"), "alice");
    let info = field_str(e, "client-info");
    assert!(info.contains(" user=default "), "{info}");
    assert!(info.starts_with("id="), "{info}");

    // Denied command, key and channel, newest first.
    assert_eq!(c.cmd(&["AUTH", "alice", "pw"]), ok());
    assert_eq!(c.cmd(&["SET", "foo1", "v"]), v.noperm_cmd("alice", "set"));
    assert_eq!(c.cmd(&["GET", "bar"]), v.noperm_key());
    assert_eq!(c.cmd(&["PUBLISH", "other", "m"]), v.noperm_channel());
    let log = acl_log(&mut admin, None);
    assert_eq!(log.len(), 4, "{log:?}");
    let summary: Vec<(String, String, String, String)> = log
        .iter()
        .map(|e| {
            (
                field_str(e, "reason"),
                field_str(e, "context"),
                field_str(e, "object"),
                field_str(e, "username"),
            )
        })
        .collect();
    let row = |a: &str, b: &str, c: &str, d: &str| {
        (a.to_string(), b.to_string(), c.to_string(), d.to_string())
    };
    assert_eq!(
        summary,
        vec![
            row("channel", "toplevel", "other", "alice"),
            row("key", "toplevel", "bar", "alice"),
            row("command", "toplevel", "set", "alice"),
            row("auth", "toplevel", "auth", "alice"),
        ]
    );
    assert!(field_str(&log[0], "client-info").contains(" user=alice "));
    for e in &log {
        let names: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, v.log_fields());
    }

    // The same denial again counts in its entry, which moves to the top.
    assert_eq!(c.cmd(&["SET", "foo1", "v"]), v.noperm_cmd("alice", "set"));
    assert_eq!(c.cmd(&["SET", "foo2", "v"]), v.noperm_cmd("alice", "set"));
    let log = acl_log(&mut admin, None);
    assert_eq!(log.len(), 4, "{log:?}");
    assert_eq!(field_str(&log[0], "reason"), "command");
    assert_eq!(field(&log[0], "count"), &Resp::Integer(3));

    // MULTI and script contexts.
    assert_eq!(c.cmd(&["MULTI"]), ok());
    assert_eq!(c.cmd(&["GET", "bar2"]), v.noperm_key());
    assert_eq!(c.cmd(&["DISCARD"]), v.noperm_cmd("alice", "discard"));
    assert_eq!(
        c.cmd(&["EXEC"]),
        Resp::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    let r = c.cmd(&["EVAL", "return redis.call('get', 'bar3')", "0"]);
    assert!(r.is_error(), "{r}");
    let log = acl_log(&mut admin, Some("3"));
    assert_eq!(log.len(), 3);
    assert_eq!(
        (
            field_str(&log[0], "reason"),
            field_str(&log[0], "context"),
            field_str(&log[0], "object")
        ),
        ("key".to_string(), "lua".to_string(), "bar3".to_string())
    );
    assert_eq!(
        (
            field_str(&log[1], "reason"),
            field_str(&log[1], "context"),
            field_str(&log[1], "object")
        ),
        (
            "command".to_string(),
            "multi".to_string(),
            "discard".to_string()
        )
    );
    assert_eq!(
        (
            field_str(&log[2], "reason"),
            field_str(&log[2], "context"),
            field_str(&log[2], "object")
        ),
        ("key".to_string(), "multi".to_string(), "bar2".to_string())
    );

    // ACL LOG <count>.
    let one = acl_log(&mut admin, Some("1"));
    assert_eq!(one.len(), 1);
    assert_eq!(field_str(&one[0], "object"), "bar3");
    assert_eq!(acl_log(&mut admin, None).len(), 7);
    assert_eq!(acl_log(&mut admin, Some("100")).len(), 7);
    assert_eq!(acl_log(&mut admin, Some("0")).len(), 0);
    assert_err_prefix(&admin.cmd(&["ACL", "LOG", "many"]), "ERR");

    // RESET empties it.
    assert_eq!(admin.cmd(&["ACL", "LOG", "RESET"]), ok());
    assert_eq!(admin.cmd(&["ACL", "LOG"]), Resp::Array(vec![]));
    // HELLO AUTH failures are logged too.
    let mut h = s.raw_client();
    assert_eq!(
        h.cmd(&["hello", "3", "AUTH", "alice", "bad"]),
        Resp::Error(WRONGPASS.into())
    );
    let log = acl_log(&mut admin, None);
    assert_eq!(log.len(), 1);
    assert_eq!(field_str(&log[0], "reason"), "auth");
    assert_eq!(field_str(&log[0], "username"), "alice");
}
threads_1_and_4!(acl_log_entries, acl_log_entries_t1, acl_log_entries_t4);

// ---------------------------------------------------------------------------
// Connections of deleted, changed and killed users
// ---------------------------------------------------------------------------

fn deleted_user_connections_close(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    setuser(&mut admin, "alice", &["on", ">pw", "allkeys", "+@all"]);
    setuser(&mut admin, "bob", &["on", ">pw", "allkeys", "+@all"]);
    let mut alices: Vec<Client> = (0..4).map(|_| login(s.port, "alice", "pw")).collect();
    for (i, a) in alices.iter_mut().enumerate() {
        assert_eq!(a.cmd(&["SET", &format!("a:{i}"), "v"]), ok());
    }
    let mut bob = login(s.port, "bob", "pw");
    // A connection that logged in as alice and then switched to bob is bob's.
    let mut switched = login(s.port, "alice", "pw");
    assert_eq!(switched.cmd(&["AUTH", "bob", "pw"]), ok());

    assert_eq!(admin.cmd(&["ACL", "DELUSER", "alice"]), Resp::Integer(1));
    for (i, a) in alices.iter_mut().enumerate() {
        assert_closed(a, &format!("alice connection {i} after ACL DELUSER"));
    }
    assert_eq!(bob.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(switched.cmd(&["ACL", "WHOAMI"]), bulk("bob"));
    assert_eq!(admin.cmd(&["DBSIZE"]), Resp::Integer(4));
}
threads_1_and_4!(
    deleted_user_connections_close,
    deleted_user_connections_close_t1,
    deleted_user_connections_close_t4
);

/// As documented for `off` ("previously authenticated connections will still work"),
/// disabling a user or changing its passwords refuses new logins only.
fn off_and_resetpass_keep_open_connections(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);
    setuser(&mut admin, "alice", &["on", ">pw", "allkeys", "+@all"]);
    let mut a1 = login(s.port, "alice", "pw");
    let mut a2 = login(s.port, "alice", "pw");

    setuser(&mut admin, "alice", &["off"]);
    let mut c = s.raw_client();
    assert_eq!(
        c.cmd(&["AUTH", "alice", "pw"]),
        Resp::Error(WRONGPASS.into())
    );
    assert_eq!(a1.cmd(&["SET", "k", "1"]), ok());
    assert_eq!(a1.cmd(&["ACL", "WHOAMI"]), bulk("alice"));

    setuser(&mut admin, "alice", &["on", "resetpass", ">new"]);
    assert_eq!(
        c.cmd(&["AUTH", "alice", "pw"]),
        Resp::Error(WRONGPASS.into())
    );
    assert_eq!(c.cmd(&["AUTH", "alice", "new"]), ok());
    assert_eq!(a2.cmd(&["INCR", "k"]), Resp::Integer(2));

    // Rules still apply to them at once.
    setuser(&mut admin, "alice", &["-incr"]);
    assert_eq!(a1.cmd(&["INCR", "k"]), v.noperm_cmd("alice", "incr"));
    assert_eq!(a2.cmd(&["INCR", "k"]), v.noperm_cmd("alice", "incr"));
}
threads_1_and_4!(
    off_and_resetpass_keep_open_connections,
    off_and_resetpass_keep_open_connections_t1,
    off_and_resetpass_keep_open_connections_t4
);

fn client_list_and_kill_user(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    setuser(&mut admin, "alice", &["on", ">pw", "allkeys", "+@all"]);
    let mut a1 = login(s.port, "alice", "pw");
    let mut a2 = login(s.port, "alice", "pw");
    assert_eq!(a1.cmd(&["CLIENT", "SETNAME", "alice-1"]), ok());
    let mut other = s.raw_client();
    assert_eq!(other.cmd(&["PING"]), Resp::simple("PONG"));

    let list = admin
        .cmd(&["CLIENT", "LIST"])
        .as_string()
        .expect("CLIENT LIST");
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 4, "{list}");
    let alice_lines = lines.iter().filter(|l| l.contains(" user=alice ")).count();
    let default_lines = lines
        .iter()
        .filter(|l| l.contains(" user=default "))
        .count();
    assert_eq!((alice_lines, default_lines), (2, 2), "{list}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" name=alice-1 ") && l.contains(" user=alice ")),
        "{list}"
    );
    let info = a2
        .cmd(&["CLIENT", "INFO"])
        .as_string()
        .expect("CLIENT INFO");
    assert!(info.contains(" user=alice "), "{info}");

    assert_eq!(
        admin.cmd(&["CLIENT", "KILL", "USER", "alice"]),
        Resp::Integer(2)
    );
    assert_closed(&mut a1, "alice-1 after CLIENT KILL USER");
    assert_closed(&mut a2, "alice-2 after CLIENT KILL USER");
    assert_eq!(admin.cmd(&["PING"]), Resp::simple("PONG"));
    drop(other);
    // The user itself is still there.
    let mut a3 = login(s.port, "alice", "pw");
    assert_eq!(a3.cmd(&["ACL", "WHOAMI"]), bulk("alice"));
    assert_eq!(
        admin.cmd(&["CLIENT", "KILL", "USER", "nobody"]),
        Resp::Error("ERR No such user 'nobody'".into())
    );
    setuser(&mut admin, "bob", &["on", ">pw"]);
    assert_eq!(
        admin.cmd(&["CLIENT", "KILL", "USER", "bob"]),
        Resp::Integer(0)
    );
}
threads_1_and_4!(
    client_list_and_kill_user,
    client_list_and_kill_user_t1,
    client_list_and_kill_user_t4
);

// ---------------------------------------------------------------------------
// ACL files and configuration files
// ---------------------------------------------------------------------------

fn aclfile_load_and_save(threads: usize) {
    let dir = TempDir::new("aclfile");
    let path = dir.path().join("users.acl");
    fs::write(
        &path,
        "user alice on >pw ~foo* +get\nuser default on nopass ~* &* +@all\n",
    )
    .unwrap();
    let path_s = path.to_string_lossy().into_owned();
    let s = KiteServer::start(&["--aclfile", &path_s], threads);
    let mut admin = s.client();
    let v = Ver::of(&mut admin);
    assert_eq!(
        acl_list(&mut admin),
        vec![
            v.list_line(
                "alice",
                "on",
                &format!("#{SHA_PW} ~foo* resetchannels -@all +get")
            ),
            v.list_line("default", "on nopass", "~* &* +@all"),
        ]
    );
    let mut a = login(s.port, "alice", "pw");
    assert_eq!(a.cmd(&["GET", "foo1"]), Resp::NullBulk);
    assert_eq!(a.cmd(&["SET", "foo1", "v"]), v.noperm_cmd("alice", "set"));

    // ACL SAVE writes the users as ACL LIST shows them.
    setuser(&mut admin, "bob", &["on", ">secret", "allkeys", "+@all"]);
    assert_eq!(admin.cmd(&["ACL", "SAVE"]), ok());
    let saved: Vec<String> = fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(saved, acl_list(&mut admin));

    // Edit the file and ACL LOAD: the file's users replace the server's.
    fs::write(
        &path,
        "user carol on >other ~c:* +@all\nuser default on nopass ~* &* +@all\n",
    )
    .unwrap();
    assert_eq!(admin.cmd(&["ACL", "LOAD"]), ok());
    assert_eq!(admin.cmd(&["ACL", "USERS"]), bulks(&["carol", "default"]));
    assert_eq!(
        acl_list(&mut admin),
        vec![
            v.list_line(
                "carol",
                "on",
                &format!("#{SHA_OTHER} ~c:* resetchannels +@all")
            ),
            v.list_line("default", "on nopass", "~* &* +@all"),
        ]
    );
    let mut c = s.raw_client();
    assert_eq!(
        c.cmd(&["AUTH", "bob", "secret"]),
        Resp::Error(WRONGPASS.into())
    );
    assert_eq!(c.cmd(&["AUTH", "carol", "other"]), ok());
    assert_eq!(c.cmd(&["SET", "c:1", "v"]), ok());
    // alice no longer exists: her connection is gone.
    assert_closed(&mut a, "alice after ACL LOAD without her");

    // A file with an error changes nothing.
    fs::write(&path, "user dave on >pw +@all\nuser erin on bogusrule\n").unwrap();
    let r = admin.cmd(&["ACL", "LOAD"]);
    let text = r
        .error_text()
        .unwrap_or_else(|| panic!("ACL LOAD of a bad file: {r}"));
    assert!(text.starts_with("ERR "), "{text}");
    assert!(
        text.ends_with(
            "WARNING: ACL errors detected, no change to the previously active ACL rules \
             was performed"
        ),
        "{text}"
    );
    assert_eq!(admin.cmd(&["ACL", "USERS"]), bulks(&["carol", "default"]));
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("carol"));
}
threads_1_and_4!(
    aclfile_load_and_save,
    aclfile_load_and_save_t1,
    aclfile_load_and_save_t4
);

fn acl_load_save_without_aclfile(threads: usize) {
    let s = KiteServer::start(&[], threads);
    let mut admin = s.client();
    let err = Resp::Error(
        "ERR This Redis instance is not configured to use an ACL file. You may want to \
         specify users via the ACL SETUSER command and then issue a CONFIG REWRITE (assuming \
         you have a Redis configuration file set) in order to store users in the Redis \
         configuration."
            .into(),
    );
    assert_eq!(admin.cmd(&["ACL", "LOAD"]), err);
    assert_eq!(admin.cmd(&["ACL", "SAVE"]), err);
}
threads_1_and_4!(
    acl_load_save_without_aclfile,
    acl_load_save_without_aclfile_t1,
    acl_load_save_without_aclfile_t4
);

fn config_file_users(threads: usize) {
    let dir = TempDir::new("conf");
    let body = format!(
        "user alice on >pw ~foo* +get\n\
         user bob on nopass allkeys allchannels +@all -flushall\n\
         user default on #{SHA_X} ~* &* +@all\n"
    );
    let s = ConfServer::start(dir.path(), &body, threads);
    let mut c = Client::connect(s.port);
    assert_eq!(
        c.cmd(&["PING"]),
        Resp::Error("NOAUTH Authentication required.".into())
    );
    assert_eq!(c.cmd(&["AUTH", "x"]), ok());
    let v = Ver::of(&mut c);
    assert_eq!(
        acl_list(&mut c),
        vec![
            v.list_line(
                "alice",
                "on",
                &format!("#{SHA_PW} ~foo* resetchannels -@all +get")
            ),
            v.list_line("bob", "on nopass", "~* &* +@all -flushall"),
            // A `user default` line resets the default user first, which sets
            // sanitize-payload in 7.0 too.
            format!("user default on sanitize-payload #{SHA_X} ~* &* +@all"),
        ]
    );
    c.cmd(&["SET", "foo1", "v"]);

    let mut a = login(s.port, "alice", "pw");
    assert_eq!(a.cmd(&["GET", "foo1"]), bulk("v"));
    assert_eq!(a.cmd(&["GET", "bar"]), v.noperm_key());
    assert_eq!(a.cmd(&["SET", "foo1", "w"]), v.noperm_cmd("alice", "set"));
    let mut b = login(s.port, "bob", "anything");
    assert_eq!(b.cmd(&["SET", "bar", "v"]), ok());
    assert_eq!(b.cmd(&["FLUSHALL"]), v.noperm_cmd("bob", "flushall"));
}
threads_1_and_4!(
    config_file_users,
    config_file_users_t1,
    config_file_users_t4
);

/// A replica applies its master's stream whatever its own default user may do (the
/// master link runs as no user, as in Redis): here the replica's default user may not
/// write, and MULTI/EXEC and a script from the master still land.
fn replica_stream_ignores_acl(threads: usize) {
    let master = KiteServer::start(&["--repl-diskless-sync-delay", "0"], threads);
    let replica = KiteServer::start(&[], threads);
    let mut m = master.client();
    let mut r = replica.client();
    assert_eq!(r.cmd(&["ACL", "SETUSER", "default", "-@write"]), Resp::ok());
    assert_eq!(
        r.cmd(&["REPLICAOF", "127.0.0.1", &master.port.to_string()]),
        Resp::ok()
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let info = r
            .cmd(&["INFO", "replication"])
            .as_string()
            .unwrap_or_default();
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never synced: {info}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(m.cmd(&["SET", "plain", "1"]), Resp::ok());
    assert_eq!(m.cmd(&["MULTI"]), Resp::ok());
    m.cmd(&["SET", "in-multi", "2"]);
    m.cmd(&["INCR", "counter"]);
    assert!(m.cmd(&["EXEC"]).as_array().is_some());
    m.cmd(&[
        "EVAL",
        "redis.call('set', KEYS[1], 'from-script') return 1",
        "1",
        "scripted",
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while r.cmd(&["GET", "scripted"]) != Resp::bulk("from-script") {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica did not apply the stream"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(r.cmd(&["GET", "plain"]), Resp::bulk("1"));
    assert_eq!(r.cmd(&["GET", "in-multi"]), Resp::bulk("2"));
    assert_eq!(r.cmd(&["GET", "counter"]), Resp::bulk("1"));
    // The replica's own clients are still held to the rule.
    assert_eq!(r.cmd(&["REPLICAOF", "NO", "ONE"]), Resp::ok());
    let denied = r.cmd(&["SET", "mine", "x"]);
    assert!(
        denied.error_text().is_some_and(|e| e.starts_with("NOPERM")),
        "{denied}"
    );
}

#[test]
fn replica_stream_ignores_acl_t1() {
    replica_stream_ignores_acl(1);
}

#[test]
fn replica_stream_ignores_acl_t4() {
    replica_stream_ignores_acl(4);
}
