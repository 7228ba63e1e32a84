//! TLS, checked as a black box with clients built on OpenSSL (redis-cli, Python's `ssl`
//! and redis-py, `openssl s_client`), following Redis's documented behaviour
//! (https://redis.io/docs/management/security/encryption/) and configuration names.
//! Each scenario runs at `--threads 1` and `--threads 4`:
//!
//! - `redis_cli_over_tls`: PING, SET/GET, a 1 MiB value both ways, 1000 commands through
//!   `redis-cli --tls --pipe`, all seen from the plain port too
//! - `redis_py_over_tls`: redis-py with `ssl=True` (RESP2 and RESP3), a 1 MiB value, a
//!   1000-command pipeline, Pub/Sub with a TLS subscriber and publishers on both ports,
//!   8 TLS connections at once, 1000 raw commands in one write
//! - `client_certificates`: `tls-auth-clients` yes (the default) / no / optional against
//!   no certificate, a trusted one and one from an untrusted CA
//! - `auth_clients_config_set`: the same, switched by CONFIG SET
//! - `ca_cert_dir`: `tls-ca-cert-dir` (a hashed directory) instead of a CA file
//! - `chains_and_bundles`: a `tls-cert-file` holding leaf + intermediate, a CA file with
//!   two roots, client certificates sent with and without their intermediate
//! - `plaintext_on_tls_port`: plain-text requests get no reply and are closed; clients
//!   stalled mid-handshake hold no one up
//! - `tls_protocols`, `tls_ciphersuites`, `tls_ciphers`: versions and suites, at start-up
//!   and (tls-protocols) by CONFIG SET
//! - `reload_certificates`, `reload_ca`: CONFIG SET of tls-cert-file/tls-key-file and
//!   tls-ca-cert-file reach new connections while open ones (TLS 1.3 and 1.2) go on; a
//!   reload naming a missing file fails and changes nothing
//! - `tls_only`: `--port 0 --tls-port N` (started without the harness, which waits on a
//!   plain port): served over TLS, no plain listener
//! - `config_get_tls`: CONFIG GET of the tls-* parameters
//!
//! Every test passes against a real redis-server 7.0 (Debian's build has TLS):
//!
//!     KITE_BIN=$(which redis-server) cargo test --release --test tls
//!
//! Needs `openssl`, `redis-cli` and `python3` with redis-py on PATH (scripts/test.sh
//! installs redis-server/redis-cli and redis-py). Each test makes its own certificates
//! in a temporary directory (see [`Certs`]): a CA, a server certificate for `localhost`
//! and 127.0.0.1 (EC P-256), a second server certificate from the same CA (RSA 2048 in
//! the PKCS#1 "BEGIN RSA PRIVATE KEY" form, for the reload test), a client certificate,
//! a second, untrusted CA with a client certificate of its own, and an intermediate CA.
//!
//! Every subprocess runs under a deadline (killed and reported when it passes) and every
//! socket read has a timeout, so a server that hangs makes a test fail, not hang.
//!
//! Redis 7.0 facts these tests rely on (checked against 7.0.15): a refused client
//! certificate shows up in a TLS 1.3 client only after its handshake, as a reset or an
//! alert on the first read, so "refused" here means "no reply to PING, and the
//! connection ends"; with `tls-auth-clients no` no certificate is requested, so a client
//! holding an untrusted one is served; a plain-text request on the TLS port gets no
//! reply and the connection is reset at once; CONFIG SET of tls-auth-clients,
//! tls-protocols and the certificate files applies to new connections; `CONFIG SET
//! tls-cert-file` naming a missing file fails with "ERR CONFIG SET failed ... Unable to
//! update TLS configuration" and keeps the old certificate; `tls-ciphersuites` limits
//! TLS 1.3 only and `tls-ciphers` TLS 1.2 only; CONFIG GET of an unset tls-protocols or
//! tls-ca-cert-dir is empty.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Subprocesses with deadlines
// ---------------------------------------------------------------------------

/// How long one client subprocess (redis-cli, python3, openssl) may run.
const CLIENT_LIMIT: Duration = Duration::from_secs(60);
/// How long a server may take to accept TLS connections.
const TLS_STARTUP: Duration = Duration::from_secs(10);

/// A child process killed (SIGKILL) and reaped when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Output {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
}

impl Output {
    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.len() > 120 {
            s.push_str(" <script>");
        } else {
            s.push(' ');
            s.push_str(&a);
        }
    }
    s
}

/// Reads a pipe to its end on a thread of its own.
fn drain<R: Read + Send + 'static>(r: Option<R>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut buf);
        }
        buf
    })
}

/// Runs `cmd` with `stdin` as its input, killing it (and panicking) after `limit`.
fn run_with_timeout(cmd: &mut Command, stdin: &[u8], limit: Duration) -> Output {
    let what = describe(cmd);
    let child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"));
    let mut guard = ChildGuard(child);
    let input = stdin.to_vec();
    let mut child_stdin = guard.0.stdin.take();
    let writer = thread::spawn(move || {
        if let Some(w) = child_stdin.as_mut() {
            let _ = w.write_all(&input);
        }
        drop(child_stdin);
    });
    let out = drain(guard.0.stdout.take());
    let err = drain(guard.0.stderr.take());
    let deadline = Instant::now() + limit;
    let status = loop {
        match guard.0.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => panic!("waiting for `{what}`: {e}"),
        }
        if Instant::now() > deadline {
            let _ = guard.0.kill();
            let _ = guard.0.wait();
            let stdout = out.join().unwrap_or_default();
            let stderr = err.join().unwrap_or_default();
            panic!(
                "`{what}` did not finish within {limit:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                String::from_utf8_lossy(&stdout[..stdout.len().min(4000)]),
                String::from_utf8_lossy(&stderr)
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    let _ = writer.join();
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned(),
    }
}

/// Runs a command that must succeed; returns its stdout.
#[track_caller]
fn run_ok(cmd: &mut Command, stdin: &[u8]) -> String {
    let what = describe(cmd);
    let out = run_with_timeout(cmd, stdin, CLIENT_LIMIT);
    assert!(
        out.status.success(),
        "`{what}` failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        out.stdout_text(),
        out.stderr
    );
    out.stdout_text()
}

// ---------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------

static CERT_SEQ: AtomicUsize = AtomicUsize::new(0);

const OPENSSL_EXTENSIONS: &str = "\
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// A temporary directory of certificates, removed when dropped:
/// - `ca.crt`/`ca.key`: the trusted CA; `cadir/`: a hashed directory holding `ca.crt`
///   (for `tls-ca-cert-dir`)
/// - `server.crt`/`server.key`: EC P-256, OU=server-1, CN=localhost, SAN localhost and
///   127.0.0.1, signed by the CA
/// - `server2.crt`/`server2.key`: the same names with OU=server-2, RSA 2048 with a
///   PKCS#1 key file, signed by the CA
/// - `client.crt`/`client.key`: a client certificate signed by the CA
/// - `ca2.crt`/`ca2.key` and `badclient.crt`/`badclient.key`: a CA the server does not
///   trust and a client certificate it signed
/// - `inter.crt`: an intermediate CA signed by the first; `server3` (OU=server3, names as
///   server-1) and `client3` signed by it, and `server3-chain.crt` / `client3-chain.crt`
///   (leaf then intermediate, keys as `*-chain.key`)
/// - `bundle.crt`: `ca.crt` and `ca2.crt` in one file
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn make() -> Certs {
        let dir = std::env::temp_dir().join(format!(
            "kite-tls-test-{}-{}",
            std::process::id(),
            CERT_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create the certificate directory");
        let certs = Certs { dir };
        fs::write(certs.dir.join("ext.cnf"), OPENSSL_EXTENSIONS).expect("write ext.cnf");
        certs.ec_key("ca");
        certs.self_signed("ca", "/O=Kite Tests/CN=Kite Test CA", 1);
        certs.ec_key("ca2");
        certs.self_signed("ca2", "/O=Kite Tests/CN=Kite Untrusted CA", 2);
        certs.ec_key("server");
        certs.leaf(
            "server",
            "/O=Kite Tests/OU=server-1/CN=localhost",
            "ca",
            "server",
            10,
        );
        certs.openssl(&["genrsa", "-traditional", "-out", "server2.key", "2048"]);
        certs.leaf(
            "server2",
            "/O=Kite Tests/OU=server-2/CN=localhost",
            "ca",
            "server",
            11,
        );
        certs.ec_key("client");
        certs.leaf(
            "client",
            "/O=Kite Tests/OU=client/CN=kite-client",
            "ca",
            "client",
            12,
        );
        certs.ec_key("badclient");
        certs.leaf(
            "badclient",
            "/O=Kite Tests/OU=untrusted-client/CN=kite-bad-client",
            "ca2",
            "client",
            13,
        );
        // An intermediate CA under the first, and a server and a client certificate it
        // signed, each also as a chain file (leaf then intermediate).
        certs.ec_key("inter");
        certs.leaf(
            "inter",
            "/O=Kite Tests/CN=Kite Intermediate CA",
            "ca",
            "ca",
            20,
        );
        for (name, ext, serial) in [("server3", "server", 21), ("client3", "client", 22)] {
            certs.ec_key(name);
            let subject = format!("/O=Kite Tests/OU={name}/CN=localhost");
            certs.leaf(name, &subject, "inter", ext, serial);
            let mut chain = fs::read(certs.dir.join(format!("{name}.crt"))).expect("read");
            chain.extend(fs::read(certs.dir.join("inter.crt")).expect("read inter.crt"));
            fs::write(certs.dir.join(format!("{name}-chain.crt")), chain).expect("write");
            fs::copy(
                certs.dir.join(format!("{name}.key")),
                certs.dir.join(format!("{name}-chain.key")),
            )
            .expect("copy key");
        }
        // Both roots in one CA file.
        let mut bundle = fs::read(certs.dir.join("ca.crt")).expect("read ca.crt");
        bundle.extend(fs::read(certs.dir.join("ca2.crt")).expect("read ca2.crt"));
        fs::write(certs.dir.join("bundle.crt"), bundle).expect("write bundle.crt");
        // A hashed CA directory as `openssl rehash` makes it (<hash>.0 -> ca.crt).
        let cadir = certs.dir.join("cadir");
        fs::create_dir_all(&cadir).expect("create cadir");
        fs::copy(certs.dir.join("ca.crt"), cadir.join("ca.crt")).expect("copy ca.crt");
        let hash = certs.openssl(&["x509", "-hash", "-noout", "-in", "ca.crt"]);
        std::os::unix::fs::symlink("ca.crt", cadir.join(format!("{}.0", hash.trim())))
            .expect("symlink the CA hash");
        certs
    }

    fn openssl(&self, args: &[&str]) -> String {
        run_ok(
            Command::new("openssl").args(args).current_dir(&self.dir),
            b"",
        )
    }

    fn ec_key(&self, name: &str) {
        let out = format!("{name}.key");
        self.openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &out,
        ]);
    }

    fn self_signed(&self, name: &str, subject: &str, serial: u32) {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        self.openssl(&["req", "-new", "-key", &key, "-subj", subject, "-out", &csr]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-signkey",
            &key,
            "-days",
            "3650",
            "-extfile",
            "ext.cnf",
            "-extensions",
            "ca",
            "-set_serial",
            &serial.to_string(),
            "-out",
            &crt,
        ]);
    }

    fn leaf(&self, name: &str, subject: &str, ca: &str, ext: &str, serial: u32) {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
        self.openssl(&["req", "-new", "-key", &key, "-subj", subject, "-out", &csr]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-set_serial",
            &serial.to_string(),
            "-days",
            "3650",
            "-extfile",
            "ext.cnf",
            "-extensions",
            ext,
            "-out",
            &crt,
        ]);
    }

    /// Absolute path of a file in the directory.
    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// The usual server arguments: TLS on `tls_port` with server.crt and the CA file.
    fn server_args(&self, tls_port: u16) -> Vec<String> {
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            self.path("server.crt"),
            "--tls-key-file".into(),
            self.path("server.key"),
            "--tls-ca-cert-file".into(),
            self.path("ca.crt"),
        ]
    }

    /// redis-cli arguments for a TLS connection with the good client certificate.
    fn cli_args(&self, tls_port: u16) -> Vec<String> {
        vec![
            "--tls".into(),
            "--cacert".into(),
            self.path("ca.crt"),
            "--cert".into(),
            self.path("client.crt"),
            "--key".into(),
            self.path("client.key"),
            "-h".into(),
            "127.0.0.1".into(),
            "-p".into(),
            tls_port.to_string(),
        ]
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------
// Servers
// ---------------------------------------------------------------------------

/// Waits until something accepts TCP connections on 127.0.0.1:`port`.
fn wait_accepting(port: u16) {
    let deadline = Instant::now() + TLS_STARTUP;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    while TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing accepts connections on the TLS port {port} within {TLS_STARTUP:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Starts the server under test with TLS on a free port: `base` (usually
/// `Certs::server_args`) then `extra`. Returns the server and its TLS port.
fn start_with(certs: &Certs, extra: &[&str], threads: usize) -> (KiteServer, u16) {
    let tls_port = free_port();
    let mut args = certs.server_args(tls_port);
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let server = KiteServer::start(&refs, threads);
    wait_accepting(tls_port);
    (server, tls_port)
}

/// CONFIG GET of one parameter (None when the server lists nothing).
fn config_get(c: &mut Client, name: &str) -> Option<String> {
    let r = c.cmd(&["CONFIG", "GET", name]);
    let items = r
        .as_array()
        .unwrap_or_else(|| panic!("CONFIG GET {name}: expected an array, got {r}"))
        .to_vec();
    match items.as_slice() {
        [] => None,
        [k, v] => {
            assert_eq!(
                k.as_bytes(),
                Some(name.as_bytes()),
                "CONFIG GET {name}: {r}"
            );
            Some(String::from_utf8_lossy(v.as_bytes().expect("value")).into_owned())
        }
        _ => panic!("CONFIG GET {name}: unexpected reply {r}"),
    }
}

// ---------------------------------------------------------------------------
// Python TLS clients
// ---------------------------------------------------------------------------

/// Prepended to every Python script: `context()`, a small RESP client `Conn` over TLS,
/// and `ping_outcome()`. `TLS_DIR`, `TLS_PORT` and `PLAIN_PORT` come from the
/// environment.
const PY_PRELUDE: &str = r##"
import os, socket, ssl, sys, time
D = os.environ['TLS_DIR']
PORT = int(os.environ['TLS_PORT'])
PLAIN = int(os.environ.get('PLAIN_PORT') or 0)

def context(cert='client', ca='ca', min_version=None, max_version=None, ciphers=None):
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ciphers:
        c.set_ciphers(ciphers)
    c.load_verify_locations(os.path.join(D, ca + '.crt'))
    if cert:
        c.load_cert_chain(os.path.join(D, cert + '.crt'), os.path.join(D, cert + '.key'))
    if min_version:
        c.minimum_version = getattr(ssl.TLSVersion, min_version)
    if max_version:
        c.maximum_version = getattr(ssl.TLSVersion, max_version)
    return c

def enc(*args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)

class Conn:
    """A RESP2 client over TLS (verifies the server as 'localhost')."""
    def __init__(self, port=None, timeout=5, **kw):
        raw = socket.create_connection(('127.0.0.1', port or PORT), timeout=timeout)
        try:
            self.sock = context(**kw).wrap_socket(raw, server_hostname='localhost')
        except BaseException:
            raw.close()
            raise
        self.buf = b''
    def send(self, *args):
        self.sock.sendall(enc(*args))
    def _fill(self):
        d = self.sock.recv(1 << 16)
        if not d:
            raise EOFError('connection closed by the server')
        self.buf += d
    def _line(self):
        while b'\r\n' not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b'\r\n', 1)
        return line
    def _exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data
    def read(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b'+':
            return rest.decode()
        if t == b'-':
            return 'ERR:' + rest.decode()
        if t == b':':
            return int(rest)
        if t == b'$':
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if t in (b'*', b'>'):
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ValueError('unexpected reply line %r' % line)
    def cmd(self, *args):
        self.send(*args)
        return self.read()
    def peer_ou(self):
        subject = self.sock.getpeercert()['subject']
        return [v for rdn in subject for (k, v) in rdn if k == 'organizationalUnitName'][0]
    def close(self):
        self.sock.close()

def ping_outcome(**kw):
    """PONG when a TLS connection made with these options answers PING; REFUSED when
    the handshake fails or the server ends the connection; TIMEOUT when the server
    neither answers nor closes within 5 s."""
    try:
        c = Conn(**kw)
        try:
            r = c.cmd('PING')
        finally:
            c.close()
        return 'PONG' if r == 'PONG' else 'UNEXPECTED %r' % (r,)
    except socket.timeout:
        return 'TIMEOUT'
    except (ssl.SSLError, ConnectionError, EOFError, OSError):
        return 'REFUSED'
"##;

fn python_command(certs: &Certs, tls_port: u16, plain_port: Option<u16>, script: &str) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(format!("{PY_PRELUDE}\n{script}"))
        .env("TLS_DIR", &certs.dir)
        .env("TLS_PORT", tls_port.to_string())
        .env(
            "PLAIN_PORT",
            plain_port.map(|p| p.to_string()).unwrap_or_default(),
        )
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

/// Runs a Python script (after the prelude) that must exit 0; returns its stdout.
#[track_caller]
fn python(certs: &Certs, tls_port: u16, plain_port: Option<u16>, script: &str) -> String {
    run_ok(
        &mut python_command(certs, tls_port, plain_port, script),
        b"",
    )
}

/// What a TLS client made with the Python keyword arguments `kwargs` (e.g.
/// `cert=None`, `cert='badclient'`, `max_version='TLSv1_2'`) gets for PING: PONG,
/// REFUSED or TIMEOUT.
#[track_caller]
fn ping_over_tls(certs: &Certs, tls_port: u16, kwargs: &str) -> String {
    python(
        certs,
        tls_port,
        None,
        &format!("print(ping_outcome({kwargs}))"),
    )
    .trim()
    .to_string()
}

/// Waits until a TLS client with the good certificate gets PONG on `tls_port`.
fn wait_tls_pong(certs: &Certs, tls_port: u16) {
    let script = format!(
        "deadline = time.time() + {}\n\
         while ping_outcome() != 'PONG':\n    \
             assert time.time() < deadline, 'no PONG over TLS'\n    \
             time.sleep(0.05)\n\
         print('PONG')",
        TLS_STARTUP.as_secs()
    );
    assert_eq!(python(certs, tls_port, None, &script).trim(), "PONG");
}

/// A long-running Python process whose stdout lines arrive through a channel.
struct PyProcess {
    child: ChildGuard,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: thread::JoinHandle<Vec<u8>>,
}

impl PyProcess {
    fn spawn(certs: &Certs, tls_port: u16, script: &str) -> PyProcess {
        let mut child = python_command(certs, tls_port, None, script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start python3");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let stderr = drain(child.stderr.take());
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        PyProcess {
            child: ChildGuard(child),
            stdin,
            lines: rx,
            stderr,
        }
    }

    /// The next line of output, or a panic (with the process's stderr) after 20 s.
    fn line(&mut self, what: &str) -> String {
        match self.lines.recv_timeout(Duration::from_secs(20)) {
            Ok(l) => l,
            Err(e) => {
                let _ = self.child.0.kill();
                let _ = self.child.0.wait();
                let stderr = std::mem::replace(&mut self.stderr, thread::spawn(Vec::new));
                panic!(
                    "no output from the Python client ({what}): {e}\n--- stderr ---\n{}",
                    String::from_utf8_lossy(&stderr.join().unwrap_or_default())
                );
            }
        }
    }

    fn say(&mut self, line: &str) {
        let w = self.stdin.as_mut().expect("stdin");
        w.write_all(format!("{line}\n").as_bytes())
            .expect("write to python");
        w.flush().expect("flush");
    }
}

// ---------------------------------------------------------------------------
// Other clients
// ---------------------------------------------------------------------------

fn redis_cli(args: &[String], cmd: &[&str], stdin: &[u8]) -> Output {
    run_with_timeout(
        Command::new("redis-cli").args(args).args(cmd),
        stdin,
        CLIENT_LIMIT,
    )
}

/// `openssl s_client` with the good client certificate: sends `input` and reads until
/// the server closes (so `input` should end with QUIT).
fn s_client(certs: &Certs, tls_port: u16, extra: &[&str], input: &[u8]) -> Output {
    let connect = format!("127.0.0.1:{tls_port}");
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect", &connect, "-servername", "localhost"])
        .args(["-CAfile", &certs.path("ca.crt"), "-verify_return_error"])
        .args([
            "-cert",
            &certs.path("client.crt"),
            "-key",
            &certs.path("client.key"),
        ])
        .args(["-quiet", "-ign_eof"])
        .args(extra);
    run_with_timeout(&mut cmd, input, CLIENT_LIMIT)
}

/// Reads from a raw socket until the peer closes or `limit` passes; returns the bytes
/// and whether it closed (EOF or reset).
fn read_until_close(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (out, false);
        }
        s.set_read_timeout(Some(left)).expect("set_read_timeout");
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return (out, false)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return (out, true),
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// TCP ports process `pid` listens on (from /proc: its socket inodes in LISTEN state).
fn listening_ports(pid: u32) -> BTreeSet<u16> {
    let mut inodes = BTreeSet::new();
    if let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in entries.flatten() {
            if let Ok(target) = fs::read_link(e.path()) {
                let t = target.to_string_lossy();
                if let Some(n) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    inodes.insert(n.to_string());
                }
            }
        }
    }
    let mut ports = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" || !inodes.contains(f[9]) {
                continue;
            }
            if let Some(port) = f[1].rsplit(':').next() {
                ports.insert(u16::from_str_radix(port, 16).expect("port in /proc/net/tcp"));
            }
        }
    }
    ports
}

// ---------------------------------------------------------------------------
// 1. redis-cli over TLS
// ---------------------------------------------------------------------------

fn redis_cli_over_tls(threads: usize) {
    let certs = Certs::make();
    let (kite, tls_port) = start_with(&certs, &[], threads);
    let cli = certs.cli_args(tls_port);
    let mut plain = kite.client();

    let out = redis_cli(&cli, &["PING"], b"");
    assert!(
        out.status.success(),
        "redis-cli --tls PING failed: {}",
        out.stderr
    );
    assert_eq!(out.stdout_text(), "PONG\n", "redis-cli --tls PING");

    let out = redis_cli(&cli, &["SET", "tls:key", "over tls"], b"");
    assert_eq!(out.stdout_text(), "OK\n", "SET over TLS ({})", out.stderr);
    let out = redis_cli(&cli, &["GET", "tls:key"], b"");
    assert_eq!(
        out.stdout_text(),
        "over tls\n",
        "GET over TLS ({})",
        out.stderr
    );
    // The same dataset is seen from the plain port.
    assert_eq!(
        plain.cmd(&["GET", "tls:key"]),
        Resp::Bulk(b"over tls".to_vec())
    );

    // A 1 MiB value both ways (many TLS records each way).
    let mut rng = Rng::new(threads as u64);
    let alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let big: Vec<u8> = (0..1 << 20).map(|_| *rng.pick(alphabet)).collect();
    let out = redis_cli(&cli, &["-x", "SET", "tls:big"], &big);
    assert_eq!(
        out.stdout_text(),
        "OK\n",
        "SET of 1 MiB over TLS ({})",
        out.stderr
    );
    assert_eq!(plain.cmd(&["STRLEN", "tls:big"]), Resp::Integer(1 << 20));
    let out = redis_cli(&cli, &["GET", "tls:big"], b"");
    let mut want = big.clone();
    want.push(b'\n');
    assert!(
        out.stdout == want,
        "GET of 1 MiB over TLS returned {} bytes, not the value set ({})",
        out.stdout.len(),
        out.stderr
    );

    // 1000 commands through --pipe.
    let mut pipe = Vec::new();
    for i in 0..1000 {
        if i % 2 == 0 {
            pipe.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n$7\r\ntls:ctr\r\n");
        } else {
            let v = format!("v{i}");
            pipe.extend_from_slice(
                format!(
                    "*3\r\n$5\r\nRPUSH\r\n$8\r\ntls:list\r\n${}\r\n{v}\r\n",
                    v.len()
                )
                .as_bytes(),
            );
        }
    }
    let mut args = cli.clone();
    args.push("--pipe".into());
    let out = redis_cli(&args, &[], &pipe);
    assert!(
        out.status.success(),
        "redis-cli --tls --pipe failed: {}",
        out.stderr
    );
    assert!(
        out.stdout_text().contains("errors: 0, replies: 1000"),
        "redis-cli --tls --pipe: {}{}",
        out.stdout_text(),
        out.stderr
    );
    assert_eq!(plain.cmd(&["GET", "tls:ctr"]), Resp::Bulk(b"500".to_vec()));
    assert_eq!(plain.cmd(&["LLEN", "tls:list"]), Resp::Integer(500));
    assert_eq!(
        plain.cmd(&["LINDEX", "tls:list", "-1"]),
        Resp::Bulk(b"v999".to_vec())
    );
}

#[test]
fn redis_cli_over_tls_threads1() {
    redis_cli_over_tls(1);
}

#[test]
fn redis_cli_over_tls_threads4() {
    redis_cli_over_tls(4);
}

// ---------------------------------------------------------------------------
// 2. redis-py and a raw Python TLS client
// ---------------------------------------------------------------------------

const REDIS_PY_SCRIPT: &str = r##"
import threading
import redis

def client(**kw):
    return redis.Redis(host='127.0.0.1', port=PORT, ssl=True,
                       ssl_ca_certs=os.path.join(D, 'ca.crt'),
                       ssl_certfile=os.path.join(D, 'client.crt'),
                       ssl_keyfile=os.path.join(D, 'client.key'),
                       ssl_check_hostname=True,
                       socket_timeout=10, socket_connect_timeout=10, **kw)

r = client()
assert r.ping() is True
assert r.set('py:k', 'v1') is True
assert r.get('py:k') == b'v1', r.get('py:k')
plain = redis.Redis(host='127.0.0.1', port=PLAIN, socket_timeout=10)
assert plain.get('py:k') == b'v1'

# RESP3 over TLS (HELLO 3 on a TLS connection).
r3 = client(protocol=3)
assert r3.ping() is True
assert r3.hset('py:h', mapping={'a': '1', 'b': '2'}) == 2
assert r3.hgetall('py:h') == {b'a': b'1', b'b': b'2'}, r3.hgetall('py:h')

# 1 MiB value.
big = os.urandom(1 << 20)
assert r.set('py:big', big) is True
assert r.get('py:big') == big
assert plain.strlen('py:big') == 1 << 20

# A pipeline of 1000 commands.
p = r.pipeline(transaction=False)
for i in range(1000):
    p.incr('py:ctr')
res = p.execute()
assert res == list(range(1, 1001)), res[:10]

# Pub/Sub: a subscriber over TLS gets messages published over TLS and over plain TCP.
ps = client().pubsub()
ps.subscribe('py:chan')
deadline = time.time() + 10
msg = None
while time.time() < deadline:
    msg = ps.get_message(timeout=1)
    if msg and msg['type'] == 'subscribe':
        break
assert msg and msg['type'] == 'subscribe', msg
assert r.publish('py:chan', 'from-tls') == 1
assert plain.publish('py:chan', 'from-plain') == 1
got = []
while len(got) < 2 and time.time() < deadline:
    msg = ps.get_message(timeout=1)
    if msg and msg['type'] == 'message':
        got.append(msg['data'])
assert got == [b'from-tls', b'from-plain'], got
ps.close()

# Several TLS connections at once (spread over the server's threads).
errors = []
def worker(n):
    try:
        c = client()
        for i in range(200):
            c.incr('py:shared')
            c.set('py:w:%d:%d' % (n, i), i)
        c.close()
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
for t in ts: t.start()
for t in ts: t.join(60)
assert not errors, errors
assert r.get('py:shared') == b'1600', r.get('py:shared')

# A raw pipeline: 1000 commands in one write, 1000 replies read back.
c = Conn(timeout=10)
c.sock.sendall(b''.join(enc('RPUSH', 'py:raw', i) for i in range(1000)))
replies = [c.read() for _ in range(1000)]
assert replies == list(range(1, 1001)), replies[:10]
assert c.cmd('LRANGE', 'py:raw', -2, -1) == [b'998', b'999']
c.close()
print('OK')
"##;

fn redis_py_over_tls(threads: usize) {
    let certs = Certs::make();
    let (kite, tls_port) = start_with(&certs, &[], threads);
    let out = python(&certs, tls_port, Some(kite.port), REDIS_PY_SCRIPT);
    assert_eq!(out.trim(), "OK");
    assert_eq!(kite.client().cmd(&["LLEN", "py:raw"]), Resp::Integer(1000));
}

#[test]
fn redis_py_over_tls_threads1() {
    redis_py_over_tls(1);
}

#[test]
fn redis_py_over_tls_threads4() {
    redis_py_over_tls(4);
}

// ---------------------------------------------------------------------------
// 3. Client certificates: tls-auth-clients yes / no / optional
// ---------------------------------------------------------------------------

/// PING outcomes for: no certificate, the CA's client certificate, the untrusted one.
fn auth_matrix(certs: &Certs, tls_port: u16) -> String {
    python(
        certs,
        tls_port,
        None,
        "print('none', ping_outcome(cert=None))\n\
         print('trusted', ping_outcome(cert='client'))\n\
         print('untrusted', ping_outcome(cert='badclient'))",
    )
}

fn client_certificates(threads: usize) {
    let certs = Certs::make();
    for (mode, want) in [
        (None, "none REFUSED\ntrusted PONG\nuntrusted REFUSED\n"),
        (
            Some("yes"),
            "none REFUSED\ntrusted PONG\nuntrusted REFUSED\n",
        ),
        // Not requested, so not sent: the untrusted certificate does not matter either.
        (Some("no"), "none PONG\ntrusted PONG\nuntrusted PONG\n"),
        (
            Some("optional"),
            "none PONG\ntrusted PONG\nuntrusted REFUSED\n",
        ),
    ] {
        let extra: Vec<&str> = match mode {
            Some(m) => vec!["--tls-auth-clients", m],
            None => vec![],
        };
        let (mut kite, tls_port) = start_with(&certs, &extra, threads);
        let got = auth_matrix(&certs, tls_port);
        assert_eq!(got, want, "tls-auth-clients {mode:?} (none = the default)");

        if mode.is_none() {
            // redis-cli without a certificate: no PONG, a failure status.
            let args: Vec<String> = vec![
                "--tls".into(),
                "--cacert".into(),
                certs.path("ca.crt"),
                "-h".into(),
                "127.0.0.1".into(),
                "-p".into(),
                tls_port.to_string(),
            ];
            let out = redis_cli(&args, &["PING"], b"");
            assert!(
                !out.status.success() && !out.stdout_text().contains("PONG"),
                "redis-cli without a client certificate got {:?} / {} ({})",
                out.stdout_text(),
                out.stderr,
                out.status
            );
            // The same with the untrusted CA's certificate.
            let mut bad = args.clone();
            bad.extend([
                "--cert".into(),
                certs.path("badclient.crt"),
                "--key".into(),
                certs.path("badclient.key"),
            ]);
            let out = redis_cli(&bad, &["PING"], b"");
            assert!(
                !out.status.success() && !out.stdout_text().contains("PONG"),
                "redis-cli with an untrusted client certificate got {:?} / {} ({})",
                out.stdout_text(),
                out.stderr,
                out.status
            );
            // And with the trusted one, PONG.
            let out = redis_cli(&certs.cli_args(tls_port), &["PING"], b"");
            assert_eq!(out.stdout_text(), "PONG\n", "{}", out.stderr);
        }
        // Refused handshakes leave the server serving.
        kite.assert_alive();
    }
}

#[test]
fn client_certificates_threads1() {
    client_certificates(1);
}

#[test]
fn client_certificates_threads4() {
    client_certificates(4);
}

/// CONFIG SET tls-auth-clients changes what new connections need.
fn auth_clients_config_set(threads: usize) {
    let certs = Certs::make();
    let (kite, tls_port) = start_with(&certs, &[], threads);
    let mut c = kite.client();
    assert_eq!(
        config_get(&mut c, "tls-auth-clients").as_deref(),
        Some("yes")
    );
    assert_eq!(
        auth_matrix(&certs, tls_port),
        "none REFUSED\ntrusted PONG\nuntrusted REFUSED\n",
        "default"
    );
    for (mode, want) in [
        ("no", "none PONG\ntrusted PONG\nuntrusted PONG\n"),
        ("optional", "none PONG\ntrusted PONG\nuntrusted REFUSED\n"),
        ("yes", "none REFUSED\ntrusted PONG\nuntrusted REFUSED\n"),
    ] {
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "tls-auth-clients", mode]),
            Resp::ok(),
            "CONFIG SET tls-auth-clients {mode}"
        );
        assert_eq!(
            config_get(&mut c, "tls-auth-clients").as_deref(),
            Some(mode)
        );
        assert_eq!(
            auth_matrix(&certs, tls_port),
            want,
            "after CONFIG SET tls-auth-clients {mode}"
        );
    }
    assert_err_prefix(
        &c.cmd(&["CONFIG", "SET", "tls-auth-clients", "maybe"]),
        "ERR",
    );
    assert_eq!(
        config_get(&mut c, "tls-auth-clients").as_deref(),
        Some("yes")
    );
}

#[test]
fn auth_clients_config_set_threads1() {
    auth_clients_config_set(1);
}

#[test]
fn auth_clients_config_set_threads4() {
    auth_clients_config_set(4);
}

/// tls-ca-cert-dir (a hashed directory) instead of tls-ca-cert-file.
fn ca_cert_dir(threads: usize) {
    let certs = Certs::make();
    let tls_port = free_port();
    let args = [
        "--tls-port".to_string(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        certs.path("server.crt"),
        "--tls-key-file".into(),
        certs.path("server.key"),
        "--tls-ca-cert-dir".into(),
        certs.path("cadir"),
    ];
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let kite = KiteServer::start(&refs, threads);
    wait_accepting(tls_port);
    assert_eq!(
        auth_matrix(&certs, tls_port),
        "none REFUSED\ntrusted PONG\nuntrusted REFUSED\n"
    );
    let mut c = kite.client();
    assert_eq!(
        config_get(&mut c, "tls-ca-cert-dir"),
        Some(certs.path("cadir"))
    );
    assert_eq!(config_get(&mut c, "tls-ca-cert-file").as_deref(), Some(""));
}

#[test]
fn ca_cert_dir_threads1() {
    ca_cert_dir(1);
}

#[test]
fn ca_cert_dir_threads4() {
    ca_cert_dir(4);
}

// ---------------------------------------------------------------------------
// 4. Plain text and stalled handshakes on the TLS port
// ---------------------------------------------------------------------------

fn plaintext_on_tls_port(threads: usize) {
    let certs = Certs::make();
    let (mut kite, tls_port) = start_with(&certs, &[], threads);
    let addr: SocketAddr = ([127, 0, 0, 1], tls_port).into();

    // Clients that connect and send nothing, or half a ClientHello, and stay: they must
    // not hold up anyone else's handshake.
    let mut idle = Vec::new();
    for i in 0..4 {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        if i % 2 == 1 {
            s.write_all(&[0x16, 0x03, 0x01, 0x00]).expect("write");
        }
        idle.push(s);
    }
    let started = Instant::now();
    assert_eq!(
        ping_over_tls(&certs, tls_port, ""),
        "PONG",
        "beside stalled handshakes"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a TLS PING took {:?} while other handshakes were stalled",
        started.elapsed()
    );

    for request in [&b"*1\r\n$4\r\nPING\r\n"[..], b"PING\r\n"] {
        for _ in 0..10 {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
            // The server may close before the whole request is written.
            let _ = s.write_all(request);
            let started = Instant::now();
            let (bytes, closed) = read_until_close(&mut s, Duration::from_secs(5));
            assert!(
                !contains(&bytes, b"PONG"),
                "a plain-text {:?} on the TLS port was answered: {:?}",
                String::from_utf8_lossy(request),
                String::from_utf8_lossy(&bytes)
            );
            assert!(
                closed,
                "a plain-text {:?} on the TLS port: the connection was still open after {:?}",
                String::from_utf8_lossy(request),
                started.elapsed()
            );
        }
    }

    // Everyone else is still served, on both ports.
    assert_eq!(
        ping_over_tls(&certs, tls_port, ""),
        "PONG",
        "after plain-text clients"
    );
    kite.assert_alive();
    drop(idle);
    assert_eq!(ping_over_tls(&certs, tls_port, ""), "PONG");
}

#[test]
fn plaintext_on_tls_port_threads1() {
    plaintext_on_tls_port(1);
}

#[test]
fn plaintext_on_tls_port_threads4() {
    plaintext_on_tls_port(4);
}

// ---------------------------------------------------------------------------
// 5. tls-protocols and tls-ciphersuites
// ---------------------------------------------------------------------------

fn tls_protocols(threads: usize) {
    let certs = Certs::make();
    let versions = "print('v1.2', ping_outcome(max_version='TLSv1_2'))\n\
                    print('v1.3', ping_outcome(min_version='TLSv1_3'))\n\
                    c = Conn(); print('default', c.sock.version()); c.close()";

    // Default: TLS 1.2 and 1.3 both work, and 1.3 is chosen when the client offers it.
    let (kite, tls_port) = start_with(&certs, &[], threads);
    assert_eq!(
        python(&certs, tls_port, None, versions),
        "v1.2 PONG\nv1.3 PONG\ndefault TLSv1.3\n",
        "no tls-protocols"
    );
    drop(kite);

    let (kite, tls_port) = start_with(&certs, &["--tls-protocols", "TLSv1.3"], threads);
    assert_eq!(
        python(&certs, tls_port, None, versions),
        "v1.2 REFUSED\nv1.3 PONG\ndefault TLSv1.3\n",
        "tls-protocols TLSv1.3"
    );
    // openssl s_client forced to TLS 1.2 fails too; forced to 1.3 it gets PONG.
    let out = s_client(&certs, tls_port, &["-tls1_2"], b"PING\r\nQUIT\r\n");
    assert!(
        !out.status.success() && !contains(&out.stdout, b"PONG"),
        "s_client -tls1_2 against tls-protocols TLSv1.3: {} / {}",
        out.stdout_text(),
        out.stderr
    );
    let out = s_client(&certs, tls_port, &["-tls1_3"], b"PING\r\nQUIT\r\n");
    assert_eq!(
        out.stdout_text(),
        "+PONG\r\n+OK\r\n",
        "s_client -tls1_3: {}",
        out.stderr
    );
    assert_eq!(
        config_get(&mut kite.client(), "tls-protocols").as_deref(),
        Some("TLSv1.3")
    );
    drop(kite);

    let (kite, tls_port) = start_with(&certs, &["--tls-protocols", "TLSv1.2"], threads);
    assert_eq!(
        python(&certs, tls_port, None, versions),
        "v1.2 PONG\nv1.3 REFUSED\ndefault TLSv1.2\n",
        "tls-protocols TLSv1.2"
    );
    drop(kite);

    let (kite, tls_port) = start_with(&certs, &["--tls-protocols", "TLSv1.2 TLSv1.3"], threads);
    assert_eq!(
        python(&certs, tls_port, None, versions),
        "v1.2 PONG\nv1.3 PONG\ndefault TLSv1.3\n",
        "tls-protocols \"TLSv1.2 TLSv1.3\""
    );

    // CONFIG SET tls-protocols applies to new connections; an open one goes on.
    let mut old = PyProcess::spawn(
        &certs,
        tls_port,
        "a = Conn(timeout=20, max_version='TLSv1_2')\nprint(a.cmd('PING'))\n\
         sys.stdin.readline()\nprint(a.cmd('PING'))",
    );
    assert_eq!(old.line("a TLS 1.2 connection"), "PONG");
    let mut c = kite.client();
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "tls-protocols", "TLSv1.3"]),
        Resp::ok()
    );
    assert_eq!(
        config_get(&mut c, "tls-protocols").as_deref(),
        Some("TLSv1.3")
    );
    assert_eq!(
        python(&certs, tls_port, None, versions),
        "v1.2 REFUSED\nv1.3 PONG\ndefault TLSv1.3\n",
        "after CONFIG SET tls-protocols TLSv1.3"
    );
    old.say("go");
    assert_eq!(old.line("the TLS 1.2 connection after the change"), "PONG");
}

#[test]
fn tls_protocols_threads1() {
    tls_protocols(1);
}

#[test]
fn tls_protocols_threads4() {
    tls_protocols(4);
}

fn tls_ciphersuites(threads: usize) {
    let certs = Certs::make();
    let (kite, tls_port) = start_with(
        &certs,
        &["--tls-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"],
        threads,
    );
    // Python offers all three TLS 1.3 suites; the server must pick the one it allows.
    // TLS 1.2 (its ciphers are tls-ciphers) is not affected.
    let out = python(
        &certs,
        tls_port,
        None,
        "try:\n    \
             c = Conn(min_version='TLSv1_3')\n    \
             print('v1.3', c.sock.cipher()[0], c.cmd('PING'))\n\
         except Exception as e:\n    \
             print('v1.3 failed:', repr(e))\n\
         print('v1.2', ping_outcome(max_version='TLSv1_2'))",
    );
    assert_eq!(
        out, "v1.3 TLS_CHACHA20_POLY1305_SHA256 PONG\nv1.2 PONG\n",
        "tls-ciphersuites TLS_CHACHA20_POLY1305_SHA256"
    );
    let out = s_client(
        &certs,
        tls_port,
        &["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"],
        b"PING\r\nQUIT\r\n",
    );
    assert_eq!(out.stdout_text(), "+PONG\r\n+OK\r\n", "{}", out.stderr);
    let out = s_client(
        &certs,
        tls_port,
        &["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"],
        b"PING\r\nQUIT\r\n",
    );
    assert!(
        !out.status.success() && !contains(&out.stdout, b"PONG"),
        "a client offering only TLS_AES_128_GCM_SHA256 was served: {} / {}",
        out.stdout_text(),
        out.stderr
    );
    assert_eq!(
        config_get(&mut kite.client(), "tls-ciphersuites").as_deref(),
        Some("TLS_CHACHA20_POLY1305_SHA256")
    );
}

#[test]
fn tls_ciphersuites_threads1() {
    tls_ciphersuites(1);
}

#[test]
fn tls_ciphersuites_threads4() {
    tls_ciphersuites(4);
}

/// tls-ciphers: the TLS 1.2 ciphers (OpenSSL names); TLS 1.3 is not affected.
fn tls_ciphers(threads: usize) {
    let certs = Certs::make();
    let (kite, tls_port) = start_with(
        &certs,
        &["--tls-ciphers", "ECDHE-ECDSA-CHACHA20-POLY1305"],
        threads,
    );
    let out = python(
        &certs,
        tls_port,
        None,
        "print('aes128', ping_outcome(max_version='TLSv1_2', ciphers='ECDHE-ECDSA-AES128-GCM-SHA256'))\n\
         print('chacha', ping_outcome(max_version='TLSv1_2', ciphers='ECDHE-ECDSA-CHACHA20-POLY1305'))\n\
         c = Conn(max_version='TLSv1_2'); print(c.sock.version(), c.sock.cipher()[0], c.cmd('PING'))\n\
         c = Conn(); print(c.sock.version(), c.cmd('PING'))",
    );
    assert_eq!(
        out,
        "aes128 REFUSED\nchacha PONG\nTLSv1.2 ECDHE-ECDSA-CHACHA20-POLY1305 PONG\nTLSv1.3 PONG\n",
        "tls-ciphers ECDHE-ECDSA-CHACHA20-POLY1305"
    );
    assert_eq!(
        config_get(&mut kite.client(), "tls-ciphers").as_deref(),
        Some("ECDHE-ECDSA-CHACHA20-POLY1305")
    );
}

#[test]
fn tls_ciphers_threads1() {
    tls_ciphers(1);
}

#[test]
fn tls_ciphers_threads4() {
    tls_ciphers(4);
}

// ---------------------------------------------------------------------------
// Certificate chains and CA bundles
// ---------------------------------------------------------------------------

/// A tls-cert-file holding the leaf and an intermediate (as a `fullchain.pem`), and a
/// tls-ca-cert-file holding two roots; clients may present chains too.
fn chains_and_bundles(threads: usize) {
    let certs = Certs::make();
    let tls_port = free_port();
    let args = [
        "--tls-port".to_string(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        certs.path("server3-chain.crt"),
        "--tls-key-file".into(),
        certs.path("server3.key"),
        "--tls-ca-cert-file".into(),
        certs.path("bundle.crt"),
    ];
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let mut kite = KiteServer::start(&refs, threads);
    wait_accepting(tls_port);
    // The client trusts only the root: the server must send the intermediate.
    let out = python(
        &certs,
        tls_port,
        None,
        "c = Conn(); print(c.peer_ou(), c.cmd('PING')); c.close()\n\
         print('none', ping_outcome(cert=None))\n\
         print('ca', ping_outcome(cert='client'))\n\
         print('ca2', ping_outcome(cert='badclient'))\n\
         print('chain', ping_outcome(cert='client3-chain'))\n\
         print('leaf without its intermediate', ping_outcome(cert='client3'))",
    );
    assert_eq!(
        out,
        "server3 PONG\nnone REFUSED\nca PONG\nca2 PONG\nchain PONG\n\
         leaf without its intermediate REFUSED\n"
    );
    kite.assert_alive();
}

#[test]
fn chains_and_bundles_threads1() {
    chains_and_bundles(1);
}

#[test]
fn chains_and_bundles_threads4() {
    chains_and_bundles(4);
}

// ---------------------------------------------------------------------------
// 6. Certificates reloaded by CONFIG SET
// ---------------------------------------------------------------------------

const LONG_LIVED_CLIENT: &str = r##"
a = Conn(timeout=20)
b = Conn(timeout=20, max_version='TLSv1_2')
print('before', a.peer_ou(), a.cmd('PING'), b.peer_ou(), b.cmd('PING'))
sys.stdin.readline()
print('after', a.cmd('PING'), a.cmd('SET', 'reload:a', 'still here'), a.cmd('GET', 'reload:a').decode(),
      b.cmd('PING'), b.cmd('INCR', 'reload:b'))
"##;

fn reload_certificates(threads: usize) {
    let certs = Certs::make();
    let (mut kite, tls_port) = start_with(&certs, &[], threads);
    let mut c = kite.client();

    // Two open TLS connections (1.3 and 1.2) made with the first certificate.
    let mut old = PyProcess::spawn(&certs, tls_port, LONG_LIVED_CLIENT);
    assert_eq!(
        old.line("before the reload"),
        "before server-1 PONG server-1 PONG"
    );

    let r = c.cmd(&[
        "CONFIG",
        "SET",
        "tls-cert-file",
        &certs.path("server2.crt"),
        "tls-key-file",
        &certs.path("server2.key"),
    ]);
    assert_eq!(r, Resp::ok(), "CONFIG SET tls-cert-file/tls-key-file");
    assert_eq!(
        config_get(&mut c, "tls-cert-file"),
        Some(certs.path("server2.crt"))
    );
    assert_eq!(
        config_get(&mut c, "tls-key-file"),
        Some(certs.path("server2.key"))
    );

    // New connections get the new certificate, over TLS 1.3 and 1.2.
    let out = python(
        &certs,
        tls_port,
        None,
        "for v in ('TLSv1_3', 'TLSv1_2'):\n    \
             c = Conn(min_version=v, max_version=v)\n    \
             print(c.sock.version(), c.peer_ou(), c.cmd('PING'))\n    \
             c.close()",
    );
    assert_eq!(out, "TLSv1.3 server-2 PONG\nTLSv1.2 server-2 PONG\n");
    let s = s_client(&certs, tls_port, &["-showcerts"], b"PING\r\nQUIT\r\n");
    assert_eq!(
        s.stdout_text(),
        "+PONG\r\n+OK\r\n",
        "s_client after the reload"
    );
    assert!(
        s.stderr.contains("OU = server-2") && !s.stderr.contains("OU = server-1"),
        "s_client saw: {}",
        s.stderr
    );

    // The connections opened before go on.
    old.say("go");
    assert_eq!(
        old.line("after the reload"),
        "after PONG OK still here PONG 1"
    );

    // A reload that fails (missing file) is an error and changes nothing.
    let r = c.cmd(&["CONFIG", "SET", "tls-cert-file", &certs.path("missing.crt")]);
    assert_err_prefix(&r, "ERR");
    assert_eq!(
        config_get(&mut c, "tls-cert-file"),
        Some(certs.path("server2.crt"))
    );
    let out = python(
        &certs,
        tls_port,
        None,
        "c = Conn(); print(c.peer_ou(), c.cmd('PING'))",
    );
    assert_eq!(out, "server-2 PONG\n", "after a failed reload");

    // And back to the first certificate.
    let r = c.cmd(&[
        "CONFIG",
        "SET",
        "tls-cert-file",
        &certs.path("server.crt"),
        "tls-key-file",
        &certs.path("server.key"),
    ]);
    assert_eq!(r, Resp::ok());
    let out = python(
        &certs,
        tls_port,
        None,
        "c = Conn(); print(c.peer_ou(), c.cmd('PING'))",
    );
    assert_eq!(
        out, "server-1 PONG\n",
        "after reloading the first certificate"
    );
    kite.assert_alive();
}

#[test]
fn reload_certificates_threads1() {
    reload_certificates(1);
}

#[test]
fn reload_certificates_threads4() {
    reload_certificates(4);
}

/// CONFIG SET tls-ca-cert-file: new connections are checked against the new CA.
fn reload_ca(threads: usize) {
    let certs = Certs::make();
    let (kite, tls_port) = start_with(&certs, &[], threads);
    let mut c = kite.client();
    let mut old = PyProcess::spawn(
        &certs,
        tls_port,
        "a = Conn(timeout=20)\nprint(a.cmd('PING'))\nsys.stdin.readline()\nprint(a.cmd('PING'))",
    );
    assert_eq!(old.line("before the CA change"), "PONG");
    let r = c.cmd(&["CONFIG", "SET", "tls-ca-cert-file", &certs.path("ca2.crt")]);
    assert_eq!(r, Resp::ok(), "CONFIG SET tls-ca-cert-file");
    assert_eq!(
        config_get(&mut c, "tls-ca-cert-file"),
        Some(certs.path("ca2.crt"))
    );
    assert_eq!(
        auth_matrix(&certs, tls_port),
        "none REFUSED\ntrusted REFUSED\nuntrusted PONG\n",
        "after trusting only the second CA"
    );
    old.say("go");
    assert_eq!(old.line("after the CA change"), "PONG");
}

#[test]
fn reload_ca_threads1() {
    reload_ca(1);
}

#[test]
fn reload_ca_threads4() {
    reload_ca(4);
}

// ---------------------------------------------------------------------------
// 7. TLS only: --port 0
// ---------------------------------------------------------------------------

/// A server started directly (not through the harness, which waits on a plain port):
/// killed when dropped, its output printed if the test fails.
struct TlsOnlyServer {
    child: ChildGuard,
    log: PathBuf,
    dir: PathBuf,
}

impl TlsOnlyServer {
    fn start(certs: &Certs, tls_port: u16, threads: usize) -> TlsOnlyServer {
        let dir = certs.dir.join(format!("data-{threads}"));
        fs::create_dir_all(&dir).expect("data dir");
        let log = certs.dir.join(format!("server-{threads}.log"));
        let mut args: Vec<String> = vec![
            "--port".into(),
            "0".into(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.to_string_lossy().into_owned(),
            "--save".into(),
            "".into(),
        ];
        if kite_is_redis() {
            args.extend(["--appendonly".into(), "no".into()]);
        } else {
            args.extend(["--threads".into(), threads.to_string()]);
        }
        args.extend(certs.server_args(tls_port));
        let out = fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("clone log");
        let child = Command::new(kite_bin())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", kite_bin().display()));
        TlsOnlyServer {
            child: ChildGuard(child),
            log,
            dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

impl Drop for TlsOnlyServer {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!(
                "--- TLS-only server output ---\n{}\n--- end ---",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn tls_only(threads: usize) {
    let certs = Certs::make();
    let tls_port = free_port();
    let mut server = TlsOnlyServer::start(&certs, tls_port, threads);
    wait_tls_pong(&certs, tls_port);
    if let Ok(Some(status)) = server.child.0.try_wait() {
        panic!("the TLS-only server exited: {status}");
    }

    let out = redis_cli(&certs.cli_args(tls_port), &["SET", "only:tls", "yes"], b"");
    assert_eq!(out.stdout_text(), "OK\n", "{}", out.stderr);
    let out = python(
        &certs,
        tls_port,
        None,
        "c = Conn()\n\
         print(c.cmd('GET', 'only:tls').decode())\n\
         print(c.cmd('CONFIG', 'GET', 'port'))\n\
         print(c.cmd('CONFIG', 'GET', 'tls-port'))",
    );
    assert_eq!(
        out,
        format!("yes\n[b'port', b'0']\n[b'tls-port', b'{tls_port}']\n")
    );
    // The only port it listens on is the TLS port: there is no plain listener.
    let ports = listening_ports(server.pid());
    assert_eq!(
        ports,
        BTreeSet::from([tls_port]),
        "a server started with --port 0 --tls-port {tls_port} listens on {ports:?}"
    );
}

#[test]
fn tls_only_threads1() {
    tls_only(1);
}

#[test]
fn tls_only_threads4() {
    tls_only(4);
}

// ---------------------------------------------------------------------------
// 8. CONFIG GET
// ---------------------------------------------------------------------------

fn config_get_tls(threads: usize) {
    let certs = Certs::make();
    let (kite, tls_port) = start_with(&certs, &[], threads);
    let mut c = kite.client();
    let tls_port_text = tls_port.to_string();
    let cert = certs.path("server.crt");
    let key = certs.path("server.key");
    let ca = certs.path("ca.crt");
    for (name, want) in [
        ("tls-port", tls_port_text.as_str()),
        ("tls-auth-clients", "yes"),
        ("tls-cert-file", cert.as_str()),
        ("tls-key-file", key.as_str()),
        ("tls-ca-cert-file", ca.as_str()),
        ("tls-ca-cert-dir", ""),
        ("tls-protocols", ""),
        ("tls-replication", "no"),
    ] {
        assert_eq!(
            config_get(&mut c, name).as_deref(),
            Some(want),
            "CONFIG GET {name}"
        );
    }
    // The same answers over TLS.
    let out = python(
        &certs,
        tls_port,
        None,
        "c = Conn()\nprint(c.cmd('CONFIG', 'GET', 'tls-port'), c.cmd('CONFIG', 'GET', 'tls-auth-clients'))",
    );
    assert_eq!(
        out,
        format!("[b'tls-port', b'{tls_port}'] [b'tls-auth-clients', b'yes']\n")
    );
    drop(kite);

    let (kite, tls_port) = start_with(
        &certs,
        &[
            "--tls-auth-clients",
            "optional",
            "--tls-protocols",
            "TLSv1.2 TLSv1.3",
        ],
        threads,
    );
    let mut c = kite.client();
    assert_eq!(config_get(&mut c, "tls-port"), Some(tls_port.to_string()));
    assert_eq!(
        config_get(&mut c, "tls-auth-clients").as_deref(),
        Some("optional")
    );
    assert_eq!(
        config_get(&mut c, "tls-protocols").as_deref(),
        Some("TLSv1.2 TLSv1.3")
    );
    drop(kite);

    let (kite, _) = start_with(&certs, &["--tls-auth-clients", "no"], threads);
    assert_eq!(
        config_get(&mut kite.client(), "tls-auth-clients").as_deref(),
        Some("no")
    );
}

#[test]
fn config_get_tls_threads1() {
    config_get_tls(1);
}

#[test]
fn config_get_tls_threads4() {
    config_get_tls(4);
}

// ---------------------------------------------------------------------------
// Replication over TLS
// ---------------------------------------------------------------------------

fn info_field(c: &mut Client, section: &str, field: &str) -> Option<String> {
    let text = c.cmd(&["INFO", section]).as_string()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// `tls-replication yes`: a replica reaches its master's TLS port, presenting the client
/// certificate (`tls-client-cert-file`), does its full sync and follows the stream.
fn tls_replication(threads: usize) {
    let certs = Certs::make();
    let (master, master_tls) = start_with(&certs, &["--repl-diskless-sync-delay", "0"], threads);
    let mut m = master.client();
    assert_eq!(m.cmd(&["SET", "before", "1"]), Resp::ok());
    let (client_crt, client_key) = (certs.path("client.crt"), certs.path("client.key"));
    let (replica, _) = start_with(
        &certs,
        &[
            "--tls-replication",
            "yes",
            "--tls-client-cert-file",
            &client_crt,
            "--tls-client-key-file",
            &client_key,
        ],
        threads,
    );
    let mut r = replica.client();
    assert_eq!(
        r.cmd(&["REPLICAOF", "127.0.0.1", &master_tls.to_string()]),
        Resp::ok()
    );
    wait_for(
        "the replica's link to come up over TLS",
        Duration::from_secs(30),
        || info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up"),
    );
    assert_eq!(r.cmd(&["GET", "before"]), Resp::bulk("1"));
    assert_eq!(m.cmd(&["SET", "after", "2"]), Resp::ok());
    wait_for(
        "a write to reach the replica",
        Duration::from_secs(30),
        || r.cmd(&["GET", "after"]) == Resp::bulk("2"),
    );
    assert_eq!(
        info_field(&mut m, "replication", "connected_slaves").as_deref(),
        Some("1")
    );
}

#[test]
fn tls_replication_threads1() {
    tls_replication(1);
}

#[test]
fn tls_replication_threads4() {
    tls_replication(4);
}
