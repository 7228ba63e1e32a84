//! Queue tracking and the HTTP side of a socket, black-box, from `docs/observe.md`:
//! which keys are queues (lists popped from or blocked on, sorted sets popped from,
//! streams read by a group; job-framework layouts from their first push), `KITE QUEUES`
//! and `KITE QUEUE` in RESP2 and RESP3, `INFO queues`, `queue-tracking` and
//! `queue-tracking-max-queues`, Prometheus `/metrics` and the other HTTP paths on the RESP
//! port and on `http-port`, HTTP basic auth following the RESP port's rules (requirepass,
//! ACL users and their key patterns, `http-open-metrics`), and the cross-protocol defence
//! (`POST` / `Host:` sent as commands close the connection).
//!
//! Everything but the `cross_protocol_*` and `inline_get_*` tests is Kite-only and skipped
//! when `KITE_BIN` is a redis-server; those also pass against redis-server 7.0, which is
//! where their expected behaviour comes from.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{encode_command, free_port, kite_is_redis, shard_of, Client, KiteServer, Resp};

/// How long a poll for a state that must come (a client blocking, a listener opening) may
/// take before the test fails.
const POLL_LIMIT: Duration = Duration::from_secs(5);

/// The fields `KITE QUEUES` gives for every queue.
const QUEUE_FIELDS: &[&str] = &[
    "name",
    "framework",
    "type",
    "db",
    "depth",
    "pushed",
    "popped",
    "consumers",
    "push_rate",
    "pop_rate",
    "oldest_age_ms",
    "wait_p50_ms",
    "wait_p99_ms",
    "jobs",
];

/// True (after saying so) when the server under test is a real redis-server, which has
/// none of this.
fn skip_kite_only(test: &str) -> bool {
    if kite_is_redis() {
        eprintln!("SKIP {test}: queue tracking and HTTP are Kite-only");
        return true;
    }
    false
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/// Polls `f` until it gives `Some`, for at most [`POLL_LIMIT`].
#[track_caller]
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + POLL_LIMIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {POLL_LIMIT:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[track_caller]
fn int(c: &mut Client, cmd: &[&str]) -> i64 {
    let r = c.cmd(cmd);
    r.as_int()
        .unwrap_or_else(|| panic!("`{}` answered {r}, not an integer", cmd.join(" ")))
}

#[track_caller]
fn ok(c: &mut Client, cmd: &[&str]) {
    let r = c.cmd(cmd);
    assert_eq!(r, Resp::ok(), "reply to `{}`", cmd.join(" "));
}

#[track_caller]
fn bulk_reply(c: &mut Client, cmd: &[&str], expected: &str) {
    let r = c.cmd(cmd);
    assert_eq!(r, Resp::bulk(expected), "reply to `{}`", cmd.join(" "));
}

#[track_caller]
fn null_reply(c: &mut Client, cmd: &[&str]) {
    let r = c.cmd(cmd);
    assert!(r.is_null(), "`{}` answered {r}, not a null", cmd.join(" "));
}

fn resp3(port: u16, password: Option<&str>) -> Client {
    let mut c = Client::connect(port);
    let r = match password {
        Some(pw) => c.cmd(&["HELLO", "3", "AUTH", "default", pw]),
        None => c.cmd(&["HELLO", "3"]),
    };
    assert!(matches!(r, Resp::Map(_)), "HELLO 3 answered {r}");
    c
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

fn unix_now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis()
}

/// Standard Base64 with padding (RFC 4648), for `Authorization: Basic`.
fn base64(input: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(TABLE[(n >> 18) as usize & 63] as char);
        out.push(TABLE[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            TABLE[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            TABLE[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

#[test]
fn base64_encoder_self_check() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    assert_eq!(base64(b"default:pw"), "ZGVmYXVsdDpwdw==");
    assert_eq!(base64(&[0xff, 0xfe, 0xfd, 0xfc]), "//79/A==");
}

// ---------------------------------------------------------------------------
// KITE QUEUES replies
// ---------------------------------------------------------------------------

/// The (field, value) pairs of a RESP3 map or a RESP2 flat array.
#[track_caller]
fn pairs(r: &Resp) -> Vec<(String, Resp)> {
    match r {
        Resp::Map(m) => m
            .iter()
            .map(|(k, v)| {
                let k = k
                    .as_string()
                    .unwrap_or_else(|| panic!("map key {k} is not a string in {r}"));
                (k, v.clone())
            })
            .collect(),
        Resp::Array(items) => {
            assert!(
                items.len() % 2 == 0,
                "a flat field/value array of odd length: {r}"
            );
            items
                .chunks(2)
                .map(|kv| {
                    let k = kv[0]
                        .as_string()
                        .unwrap_or_else(|| panic!("field name {} is not a string in {r}", kv[0]));
                    (k, kv[1].clone())
                })
                .collect()
        }
        other => panic!("expected a map (RESP3) or a flat array (RESP2), got {other}"),
    }
}

/// One queue of `KITE QUEUES` / `KITE QUEUE`.
#[derive(Clone, Debug)]
struct Queue {
    fields: Vec<(String, Resp)>,
}

impl Queue {
    #[track_caller]
    fn from_resp(r: &Resp) -> Queue {
        let fields = pairs(r);
        let mut seen = BTreeSet::new();
        for (k, _) in &fields {
            assert!(seen.insert(k.clone()), "field {k} twice in {r}");
        }
        for f in QUEUE_FIELDS {
            assert!(seen.contains(*f), "no field {f} in queue {r}");
        }
        Queue { fields }
    }

    #[track_caller]
    fn get(&self, k: &str) -> &Resp {
        self.fields
            .iter()
            .find(|(f, _)| f == k)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no field {k} in {self:?}"))
    }

    #[track_caller]
    fn name(&self) -> Vec<u8> {
        self.get("name")
            .as_bytes()
            .unwrap_or_else(|| panic!("name is not a string in {self:?}"))
            .to_vec()
    }

    fn name_str(&self) -> String {
        String::from_utf8_lossy(&self.name()).into_owned()
    }

    #[track_caller]
    fn text(&self, k: &str) -> String {
        self.get(k)
            .as_string()
            .unwrap_or_else(|| panic!("{k} is not a string in {self:?}"))
    }

    /// An integer field (RESP integer; a numeric string is accepted too).
    #[track_caller]
    fn int(&self, k: &str) -> i64 {
        let v = self.get(k);
        v.parse_int()
            .unwrap_or_else(|| panic!("{k} of {} is {v}, not an integer", self.name_str()))
    }

    /// A field that is a number or a null: `None` for the null.
    #[track_caller]
    fn opt_num(&self, k: &str) -> Option<f64> {
        let v = self.get(k);
        if v.is_null() {
            return None;
        }
        Some(
            resp_f64(v).unwrap_or_else(|| {
                panic!("{k} of {} is {v}, not a number or null", self.name_str())
            }),
        )
    }

    #[track_caller]
    fn num(&self, k: &str) -> f64 {
        self.opt_num(k)
            .unwrap_or_else(|| panic!("{k} of {} is null", self.name_str()))
    }

    /// The `jobs` map, state -> count.
    #[track_caller]
    fn jobs(&self) -> BTreeMap<String, i64> {
        pairs(self.get("jobs"))
            .into_iter()
            .map(|(k, v)| {
                let n = v
                    .parse_int()
                    .unwrap_or_else(|| panic!("jobs.{k} is {v}, not an integer"));
                (k, n)
            })
            .collect()
    }
}

/// A double (RESP3 `,`), an integer, or a numeric string (RESP2).
fn resp_f64(v: &Resp) -> Option<f64> {
    match v {
        Resp::Double(t) => parse_f64(t),
        Resp::Integer(i) => Some(*i as f64),
        _ => v.as_string().and_then(|s| parse_f64(&s)),
    }
}

fn parse_f64(s: &str) -> Option<f64> {
    match s.trim() {
        "inf" | "+inf" | "+Inf" | "Inf" => Some(f64::INFINITY),
        "-inf" | "-Inf" => Some(f64::NEG_INFINITY),
        t => t.parse().ok(),
    }
}

/// `KITE QUEUES [pattern]`, checked to be sorted by name.
#[track_caller]
fn kite_queues(c: &mut Client, pattern: Option<&str>) -> Vec<Queue> {
    let r = match pattern {
        Some(p) => c.cmd(&["KITE", "QUEUES", p]),
        None => c.cmd(&["KITE", "QUEUES"]),
    };
    let items = r
        .as_array()
        .unwrap_or_else(|| panic!("KITE QUEUES {pattern:?} answered {r}, not an array"));
    let queues: Vec<Queue> = items.iter().map(Queue::from_resp).collect();
    let names: Vec<Vec<u8>> = queues.iter().map(|q| q.name()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "KITE QUEUES is not sorted by name");
    queues
}

fn queue_names(queues: &[Queue]) -> Vec<String> {
    queues.iter().map(|q| q.name_str()).collect()
}

#[track_caller]
fn find_queue<'a>(queues: &'a [Queue], name: &str) -> &'a Queue {
    queues
        .iter()
        .find(|q| q.name() == name.as_bytes())
        .unwrap_or_else(|| {
            panic!(
                "no queue {name:?} in KITE QUEUES: {:?}",
                queue_names(queues)
            )
        })
}

#[track_caller]
fn queue(c: &mut Client, name: &str) -> Queue {
    find_queue(&kite_queues(c, None), name).clone()
}

#[track_caller]
fn assert_not_queue(c: &mut Client, name: &str) {
    let qs = kite_queues(c, None);
    assert!(
        qs.iter().all(|q| q.name() != name.as_bytes()),
        "{name:?} was made a queue: {:?}",
        queue_names(&qs)
    );
}

/// `pushed`, `popped`, `depth` of one queue.
#[track_caller]
fn assert_counts(q: &Queue, depth: i64, pushed: i64, popped: i64) {
    let name = q.name_str();
    assert_eq!(q.int("depth"), depth, "depth of {name}: {q:?}");
    assert_eq!(q.int("pushed"), pushed, "pushed of {name}: {q:?}");
    assert_eq!(q.int("popped"), popped, "popped of {name}: {q:?}");
}

// ---------------------------------------------------------------------------
// INFO queues
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct InfoQueues {
    /// `queue_tracking`, `queues_tracked`, ... (every `k:v` line but rows and frameworks).
    fields: BTreeMap<String, String>,
    /// `queueN` rows in N order, each as its `k=v` pairs.
    rows: Vec<BTreeMap<String, String>>,
    /// `framework_<name>` lines as their `k=v` pairs.
    frameworks: BTreeMap<String, BTreeMap<String, String>>,
}

impl InfoQueues {
    #[track_caller]
    fn field(&self, k: &str) -> &str {
        self.fields
            .get(k)
            .map(|s| s.as_str())
            .unwrap_or_else(|| panic!("no {k} in INFO queues: {self:?}"))
    }

    #[track_caller]
    fn int(&self, k: &str) -> i64 {
        self.field(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k} in INFO queues is not an integer"))
    }

    #[track_caller]
    fn row(&self, name: &str) -> &BTreeMap<String, String> {
        self.rows
            .iter()
            .find(|r| r.get("name").map(|s| s.as_str()) == Some(name))
            .unwrap_or_else(|| panic!("no queue row name={name} in INFO queues: {self:?}"))
    }
}

fn kv_list(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .unwrap_or_else(|| panic!("no '=' in {kv:?} of {s:?}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Parses the `# Queues` section out of an INFO text (empty when there is none).
fn parse_info_queues(text: &str) -> InfoQueues {
    let mut out = InfoQueues::default();
    let mut in_section = false;
    let mut numbered: BTreeMap<usize, BTreeMap<String, String>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(h) = line.strip_prefix("# ") {
            in_section = h.trim() == "Queues";
            continue;
        }
        if !in_section || line.is_empty() {
            continue;
        }
        let (k, v) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("INFO queues line without ':': {line:?}"));
        if let Some(n) = k
            .strip_prefix("queue")
            .and_then(|n| n.parse::<usize>().ok())
        {
            assert!(
                numbered.insert(n, kv_list(v)).is_none(),
                "queue{n} twice in INFO queues"
            );
        } else if let Some(fw) = k.strip_prefix("framework_") {
            out.frameworks.insert(fw.to_string(), kv_list(v));
        } else {
            out.fields.insert(k.to_string(), v.to_string());
        }
    }
    for (i, (n, row)) in numbered.into_iter().enumerate() {
        assert_eq!(i, n, "queueN rows are not numbered 0, 1, 2...: {text}");
        out.rows.push(row);
    }
    out
}

#[track_caller]
fn info_text(c: &mut Client, section: Option<&str>) -> String {
    let r = match section {
        Some(s) => c.cmd(&["INFO", s]),
        None => c.cmd(&["INFO"]),
    };
    r.as_string()
        .unwrap_or_else(|| panic!("INFO {section:?} answered {r}"))
}

#[track_caller]
fn info_queues(c: &mut Client) -> InfoQueues {
    let text = info_text(c, Some("queues"));
    assert!(
        text.lines().any(|l| l.trim_end() == "# Queues"),
        "no # Queues header in INFO queues: {text:?}"
    );
    parse_info_queues(&text)
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct HttpReply {
    status: u16,
    /// Header names in lower case.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl HttpReply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == &name.to_ascii_lowercase())
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    #[track_caller]
    fn expect_status(&self, status: u16, what: &str) -> &Self {
        assert_eq!(
            self.status,
            status,
            "{what}: status {} (headers {:?}, body {:?})",
            self.status,
            self.headers,
            truncate(&self.text(), 400)
        );
        self
    }

    #[track_caller]
    fn content_type(&self) -> String {
        self.header("content-type")
            .unwrap_or_else(|| panic!("no Content-Type in {:?}", self.headers))
            .to_ascii_lowercase()
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn connect_raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set_read_timeout");
    s.set_nodelay(true).expect("set_nodelay");
    s
}

/// Reads until the server closes; panics if it keeps the connection open for 10 s.
fn read_to_eof(s: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!(
                    "{what}: the server did not close the connection after answering; got {:?}",
                    truncate(&String::from_utf8_lossy(&out), 400)
                )
            }
            // A reset after the answer is a close too.
            Err(_) => return out,
        }
    }
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or("").trim().to_string();
        let size = usize::from_str_radix(&size_text, 16)
            .unwrap_or_else(|_| panic!("bad chunk size {size_text:?}"));
        body = &body[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// Parses a whole HTTP/1.x response (the server closed after it).
#[track_caller]
fn parse_http(raw: &[u8], what: &str, head_request: bool) -> HttpReply {
    let text = String::from_utf8_lossy(raw);
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("{what}: no end of headers in {:?}", truncate(&text, 400)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    assert!(
        version.starts_with("HTTP/1."),
        "{what}: not an HTTP/1.x status line: {status_line:?}"
    );
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{what}: bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l
                .split_once(':')
                .unwrap_or_else(|| panic!("{what}: bad header line {l:?}"));
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let mut reply = HttpReply {
        status,
        headers,
        body: Vec::new(),
    };
    if head_request {
        assert!(
            body.is_empty(),
            "{what}: a HEAD response has a body: {:?}",
            String::from_utf8_lossy(&body)
        );
        return reply;
    }
    if reply
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        body = dechunk(&body);
    } else if let Some(len) = reply.header("content-length") {
        let len: usize = len
            .parse()
            .unwrap_or_else(|_| panic!("{what}: bad Content-Length {len:?}"));
        assert!(
            body.len() >= len,
            "{what}: Content-Length {len} but only {} bytes came before the close",
            body.len()
        );
        body.truncate(len);
    }
    reply.body = body;
    reply
}

/// Sends `request` as it is on a new connection and reads the response to EOF.
#[track_caller]
fn http_raw(port: u16, request: &[u8], head_request: bool) -> HttpReply {
    let what =
        String::from_utf8_lossy(request.split(|&b| b == b'\r').next().unwrap_or(b"")).into_owned();
    let mut s = connect_raw(port);
    s.write_all(request)
        .unwrap_or_else(|e| panic!("{what}: write failed: {e}"));
    let raw = read_to_eof(&mut s, &what);
    parse_http(&raw, &what, head_request)
}

/// `method path HTTP/1.1` with `Host:` and, given credentials, basic auth.
#[track_caller]
fn http_req(port: u16, method: &str, path: &str, auth: Option<(&str, &str)>) -> HttpReply {
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kite-test\r\n");
    if let Some((user, pass)) = auth {
        req.push_str(&format!(
            "Authorization: Basic {}\r\n",
            base64(format!("{user}:{pass}").as_bytes())
        ));
    }
    req.push_str("\r\n");
    http_raw(port, req.as_bytes(), method == "HEAD")
}

#[track_caller]
fn get(port: u16, path: &str) -> HttpReply {
    http_req(port, "GET", path, None)
}

#[track_caller]
fn get_as(port: u16, path: &str, user: &str, pass: &str) -> HttpReply {
    http_req(port, "GET", path, Some((user, pass)))
}

#[track_caller]
fn assert_unauthorized(r: &HttpReply, what: &str) {
    r.expect_status(401, what);
    let auth = r
        .header("www-authenticate")
        .unwrap_or_else(|| panic!("{what}: 401 without WWW-Authenticate: {:?}", r.headers));
    assert!(
        auth.starts_with("Basic"),
        "{what}: WWW-Authenticate is {auth:?}, not Basic"
    );
    assert!(
        auth.contains("realm=\"kite\""),
        "{what}: WWW-Authenticate is {auth:?}, without realm=\"kite\""
    );
}

// ---------------------------------------------------------------------------
// Prometheus text format
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug, Default)]
struct Metrics {
    samples: Vec<Sample>,
    /// `# TYPE` lines: metric name -> type.
    types: BTreeMap<String, String>,
}

impl Metrics {
    fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The samples named `name` whose labels include all of `labels`.
    fn matching<'a>(&'a self, name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(|x| x.as_str()) == Some(*v))
            })
            .collect()
    }

    /// The one sample named `name` with exactly these labels (`le` aside).
    #[track_caller]
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self
            .matching(name, labels)
            .into_iter()
            .filter(|s| s.labels.len() == labels.len())
            .collect();
        assert_eq!(
            found.len(),
            1,
            "expected one sample {name}{labels:?}, found {found:?}"
        );
        found[0].value
    }

    fn has_name(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn prom_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => {
            let ok = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'));
            if ok {
                s.parse().ok()
            } else {
                None
            }
        }
    }
}

/// Parses one sample line strictly: `name{label="value",...} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| "no value".to_string())?;
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let mut consumed = None;
        loop {
            // A label name, `=`, a quoted value; then `,` or `}`.
            let start = match chars.peek() {
                Some(&(_, '}')) => {
                    let (i, _) = chars.next().unwrap();
                    consumed = Some(i + 1);
                    break;
                }
                Some(&(i, _)) => i,
                None => break,
            };
            let mut eq = None;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    eq = Some(i);
                    break;
                }
            }
            let eq = eq.ok_or("label without '='")?;
            let lname = &after[start..eq];
            if !is_label_name(lname) {
                return Err(format!("bad label name {lname:?}"));
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {lname} value not quoted"));
            }
            let mut value = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        other => return Err(format!("bad escape \\{other:?} in label {lname}")),
                    },
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\n' => return Err("newline in a label value".into()),
                    c => value.push(c),
                }
            }
            if !closed {
                return Err(format!("label {lname} value not closed"));
            }
            if labels.insert(lname.to_string(), value).is_some() {
                return Err(format!("label {lname} twice"));
            }
            match chars.next() {
                Some((_, ',')) => {}
                Some((i, '}')) => {
                    consumed = Some(i + 1);
                    break;
                }
                other => return Err(format!("after label {lname}: {other:?}")),
            }
        }
        let consumed = consumed.ok_or("label set not closed")?;
        rest = &after[consumed..];
    }
    let rest = rest
        .strip_prefix(' ')
        .ok_or_else(|| "no space before the value".to_string())?;
    let mut parts = rest.split(' ');
    let value_text = parts.next().unwrap_or("");
    let value = prom_value(value_text).ok_or_else(|| format!("bad value {value_text:?}"))?;
    if let Some(ts) = parts.next() {
        if ts.parse::<i64>().is_err() {
            return Err(format!("bad timestamp {ts:?}"));
        }
    }
    if parts.next().is_some() {
        return Err("junk after the timestamp".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses a whole exposition, failing on any line that is not in the text format.
#[track_caller]
fn parse_metrics(text: &str) -> Metrics {
    let mut m = Metrics::default();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "the exposition does not end with a newline"
    );
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim_start();
            if let Some(t) = comment.strip_prefix("TYPE ") {
                let mut p = t.split(' ');
                let (name, ty) = (p.next().unwrap_or(""), p.next().unwrap_or(""));
                assert!(is_metric_name(name), "bad # TYPE line {line:?}");
                assert!(
                    matches!(
                        ty,
                        "counter" | "gauge" | "histogram" | "summary" | "untyped"
                    ),
                    "bad type in {line:?}"
                );
                assert!(p.next().is_none(), "junk in {line:?}");
                assert!(
                    m.types.insert(name.to_string(), ty.to_string()).is_none(),
                    "two # TYPE lines for {name}"
                );
            } else if let Some(h) = comment.strip_prefix("HELP ") {
                let name = h.split(' ').next().unwrap_or("");
                assert!(is_metric_name(name), "bad # HELP line {line:?}");
            }
            continue;
        }
        match parse_sample(line) {
            Ok(s) => m.samples.push(s),
            Err(e) => panic!("not a Prometheus text-format line ({e}): {line:?}"),
        }
    }
    m
}

#[track_caller]
fn metrics(port: u16, auth: Option<(&str, &str)>) -> Metrics {
    let r = http_req(port, "GET", "/metrics", auth);
    r.expect_status(200, "GET /metrics");
    let ct = r.content_type();
    assert!(
        ct.starts_with("text/plain"),
        "GET /metrics Content-Type is {ct:?}"
    );
    parse_metrics(&r.text())
}

/// The queue names that have a `kite_queue_depth` sample.
fn metric_queues(m: &Metrics) -> BTreeSet<String> {
    m.all("kite_queue_depth")
        .filter_map(|s| s.labels.get("queue").cloned())
        .collect()
}

#[test]
fn prometheus_line_parser_self_check() {
    let s = parse_sample(r#"kite_queue_depth{queue="q1",framework="none"} 3"#).unwrap();
    assert_eq!(s.name, "kite_queue_depth");
    assert_eq!(s.labels["queue"], "q1");
    assert_eq!(s.value, 3.0);
    let s = parse_sample(r#"a_bucket{le="+Inf",q="x\"y\\z",} 1.5e3 1700000000000"#).unwrap();
    assert_eq!(s.labels["le"], "+Inf");
    assert_eq!(s.labels["q"], "x\"y\\z");
    assert_eq!(s.value, 1500.0);
    assert!(parse_sample("kite_up 1").is_ok());
    assert!(parse_sample("kite_up").is_err());
    assert!(parse_sample("kite up 1").is_err());
    assert!(parse_sample("1kite 1").is_err());
    assert!(parse_sample(r#"x{q=1} 1"#).is_err());
    assert!(parse_sample(r#"x{q="1"} one"#).is_err());
    assert!(parse_sample(r#"x{q="1" 1"#).is_err());
}

// ---------------------------------------------------------------------------
// 1. A plain list used as a queue
// ---------------------------------------------------------------------------

fn list_queue(threads: usize) {
    if skip_kite_only("list_queue") {
        return;
    }
    if threads == 2 {
        let shards: BTreeSet<usize> = ["q1", "q2", "q3"].iter().map(|k| shard_of(k, 2)).collect();
        assert_eq!(shards.len(), 2, "the test keys should span both shards");
    }
    let server = KiteServer::start(&[], threads);
    let mut c = server.client();

    // q1 and q3 become queues when a consumer blocks on them while they are empty (the
    // block times out), so every push after it is counted.
    null_reply(&mut c, &["BLPOP", "q1", "0.05"]);
    null_reply(&mut c, &["BLPOP", "q3", "0.05"]);
    assert_eq!(
        int(&mut c, &["RPUSH", "q1", "a", "b", "c", "d", "e", "f"]),
        6
    );
    assert_eq!(int(&mut c, &["LPUSH", "q1", "z"]), 7);
    bulk_reply(&mut c, &["RPOP", "q1"], "f");
    bulk_reply(&mut c, &["LPOP", "q1"], "z");
    bulk_reply(&mut c, &["LMOVE", "q1", "dst", "LEFT", "RIGHT"], "a");
    assert_eq!(
        c.cmd(&["BRPOP", "q1", "0"]),
        Resp::Array(vec![Resp::bulk("q1"), Resp::bulk("e")])
    );
    // q1 holds b c d now: 7 pushed, 4 popped.
    let big: Vec<u8> = (0..300u32).map(|i| b'a' + (i % 26) as u8).collect();
    assert_eq!(c.cmd(&[b"RPUSH".as_slice(), b"q3", &big]), Resp::Integer(1));
    // Read-only commands and pushes make no queue.
    assert_eq!(int(&mut c, &["LLEN", "q1"]), 3);
    c.cmd(&["LRANGE", "dst", "0", "-1"]);

    let qs = kite_queues(&mut c, None);
    assert_eq!(
        queue_names(&qs),
        ["q1", "q3"],
        "only the keys popped from or blocked on are queues (dst was only pushed to)"
    );
    let q3 = find_queue(&qs, "q3");
    assert_counts(q3, 1, 1, 0);
    assert_eq!(
        q3.opt_num("wait_p50_ms"),
        None,
        "wait_p50_ms before any pop"
    );
    assert_eq!(
        q3.opt_num("wait_p99_ms"),
        None,
        "wait_p99_ms before any pop"
    );
    assert!(q3.num("oldest_age_ms") >= 0.0);

    // consumers: two clients blocked on q2 now (q2 is on the other shard at 2 threads).
    let mut w1 = server.client();
    let mut w2 = server.client();
    w1.send(&["BLPOP", "q2", "0"]);
    w2.send(&["BLPOP", "q2", "0"]);
    wait_for("2 consumers on q2", || {
        let qs = kite_queues(&mut c, None);
        let q2 = qs.iter().find(|q| q.name() == b"q2")?;
        (q2.int("consumers") == 2).then_some(())
    });
    let q2 = queue(&mut c, "q2");
    assert_eq!(q2.text("type"), "list");
    assert_counts(&q2, 0, 0, 0);
    assert_eq!(queue(&mut c, "q1").int("consumers"), 0);
    assert!(int(&mut c, &["RPUSH", "q2", "m1", "m2"]) >= 0);
    let mut served = BTreeSet::new();
    for w in [&mut w1, &mut w2] {
        let r = w.read();
        let items = r.as_array().unwrap_or_else(|| panic!("BLPOP answered {r}"));
        assert_eq!(items[0], Resp::bulk("q2"));
        served.insert(items[1].as_string().unwrap());
    }
    assert_eq!(served, BTreeSet::from(["m1".to_string(), "m2".to_string()]));
    wait_for("0 consumers on q2 once served", || {
        (queue(&mut c, "q2").int("consumers") == 0).then_some(())
    });
    let q2 = queue(&mut c, "q2");
    assert_counts(&q2, 0, 2, 2);
    assert_eq!(
        q2.opt_num("oldest_age_ms"),
        None,
        "oldest_age_ms of an empty queue"
    );
    assert!(
        q2.opt_num("wait_p50_ms").is_some(),
        "wait_p50_ms after pops"
    );

    // A queue in another database.
    ok(&mut c, &["SELECT", "1"]);
    null_reply(&mut c, &["BLPOP", "dbq", "0.05"]);
    assert_eq!(int(&mut c, &["RPUSH", "dbq", "x", "y"]), 2);
    bulk_reply(&mut c, &["LPOP", "dbq"], "x");
    ok(&mut c, &["SELECT", "0"]);

    // Ages: the elements left in q1 and q3 were pushed over 1.2 s ago.
    thread::sleep(Duration::from_millis(1200));
    let qs = kite_queues(&mut c, None);
    assert_eq!(queue_names(&qs), ["dbq", "q1", "q2", "q3"]);
    let dbq = find_queue(&qs, "dbq");
    assert_eq!(dbq.int("db"), 1, "db of a queue in database 1");
    assert_counts(dbq, 1, 2, 1);
    let q1 = find_queue(&qs, "q1");
    assert_eq!(q1.text("framework"), "none");
    assert_eq!(q1.text("type"), "list");
    assert_eq!(q1.int("db"), 0);
    assert_counts(q1, 3, 7, 4);
    assert_eq!(q1.int("consumers"), 0);
    let age = q1.num("oldest_age_ms");
    assert!(
        (1000.0..=5000.0).contains(&age),
        "oldest_age_ms of q1 is {age}, its oldest element was pushed 1.2 s ago"
    );
    let p50 = q1.num("wait_p50_ms");
    let p99 = q1.num("wait_p99_ms");
    assert!(0.0 <= p50 && p50 <= p99, "q1 wait p50 {p50} p99 {p99}");
    for rate in ["push_rate", "pop_rate"] {
        let r = q1.num(rate);
        assert!(r.is_finite() && r >= 0.0, "{rate} of q1 is {r}");
    }
    assert!(
        q1.jobs().is_empty(),
        "jobs of a plain list: {:?}",
        q1.jobs()
    );
    let age3 = find_queue(&qs, "q3").num("oldest_age_ms");
    assert!(
        (1000.0..=5000.0).contains(&age3),
        "oldest_age_ms of q3 is {age3}"
    );

    // KITE QUEUE: one queue's map, its history and its newest elements (cut to 256 bytes).
    let r = c.cmd(&["KITE", "QUEUE", "q3"]);
    let one = Queue::from_resp(&r);
    assert_eq!(one.name(), b"q3");
    assert_counts(&one, 1, 1, 0);
    let newest = one
        .get("newest")
        .as_array()
        .unwrap_or_else(|| panic!("newest is not an array: {r}"))
        .to_vec();
    assert_eq!(newest, vec![Resp::bulk(&big[..256])], "newest of q3");

    // A pop 1.2 s after the push: the wait is at least about that.
    assert_eq!(c.cmd(&["LPOP", "q3"]), Resp::bulk(&big));
    let q3 = queue(&mut c, "q3");
    assert_counts(&q3, 0, 1, 1);
    let w = q3.num("wait_p50_ms");
    assert!(
        w >= 900.0,
        "wait_p50_ms of an element popped 1.2 s after its push: {w}"
    );
    assert!(q3.num("wait_p99_ms") >= w);

    let history = wait_for("a history sample of q1", || {
        let r = c.cmd(&["KITE", "QUEUE", "q1"]);
        let q = Queue::from_resp(&r);
        let h = q
            .get("history")
            .as_array()
            .unwrap_or_else(|| panic!("history is not an array: {r}"))
            .to_vec();
        (!h.is_empty()).then_some((q, h))
    });
    let (q1, h) = history;
    assert_counts(&q1, 3, 7, 4);
    let mut last_t = 0;
    for entry in &h {
        let e = entry
            .as_array()
            .unwrap_or_else(|| panic!("history entry {entry} is not an array"));
        assert_eq!(
            e.len(),
            4,
            "history entry {entry}: [unix_seconds, depth, pushed, popped]"
        );
        let v: Vec<i64> = e
            .iter()
            .map(|x| {
                x.as_int()
                    .unwrap_or_else(|| panic!("{entry} holds non-integers"))
            })
            .collect();
        assert!(
            (v[0] - unix_now()).abs() <= 60,
            "history time {} is not near now {}",
            v[0],
            unix_now()
        );
        assert!(v[0] >= last_t, "history is not oldest first: {h:?}");
        last_t = v[0];
        assert!((0..=7).contains(&v[1]) && (0..=7).contains(&v[2]) && (0..=4).contains(&v[3]));
    }
    let newest: BTreeSet<Vec<u8>> = q1
        .get("newest")
        .as_array()
        .expect("newest is an array")
        .iter()
        .map(|x| x.as_bytes().expect("newest holds strings").to_vec())
        .collect();
    assert_eq!(
        newest,
        BTreeSet::from([b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]),
        "newest of q1 (all three of its elements)"
    );
    let r = c.cmd(&["KITE", "QUEUE", "nosuchqueue"]);
    assert!(r.is_null(), "KITE QUEUE of an unknown name: {r}");
    assert_not_queue(&mut c, "dst");
    let r = c.cmd(&["KITE", "QUEUE", "dst"]);
    assert!(r.is_null(), "KITE QUEUE of a key only pushed to: {r}");

    // The glob argument.
    assert_eq!(
        queue_names(&kite_queues(&mut c, Some("q[12]"))),
        ["q1", "q2"]
    );
    assert_eq!(
        queue_names(&kite_queues(&mut c, Some("q?"))),
        ["q1", "q2", "q3"]
    );
    assert_eq!(
        queue_names(&kite_queues(&mut c, Some("*"))),
        ["dbq", "q1", "q2", "q3"]
    );
    assert!(kite_queues(&mut c, Some("nomatch*")).is_empty());

    // KITE HELP.
    let r = c.cmd(&["KITE", "HELP"]);
    let lines = r
        .as_array()
        .unwrap_or_else(|| panic!("KITE HELP answered {r}"));
    let text: String = lines
        .iter()
        .map(|l| {
            l.as_string()
                .unwrap_or_else(|| panic!("KITE HELP line {l}"))
                + "\n"
        })
        .collect::<String>()
        .to_ascii_uppercase();
    assert!(
        text.contains("QUEUES") && text.replace("QUEUES", "").contains("QUEUE"),
        "KITE HELP does not list QUEUES and QUEUE: {text}"
    );

    reply_forms(server.port);
}

/// RESP3 maps with typed values; RESP2 flat arrays with the same fields and values.
fn reply_forms(port: u16) {
    let mut c3 = resp3(port, None);
    let r = c3.cmd(&["KITE", "QUEUES", "q[12]"]);
    let items = r
        .as_array()
        .unwrap_or_else(|| panic!("RESP3 KITE QUEUES: {r}"));
    assert_eq!(items.len(), 2);
    for item in items {
        let Resp::Map(m) = item else {
            panic!("RESP3 KITE QUEUES element is not a map: {item}")
        };
        let get = |k: &str| {
            m.iter()
                .find(|(f, _)| f.as_bytes() == Some(k.as_bytes()))
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {k} in {item}"))
        };
        assert!(matches!(get("name"), Resp::Bulk(_)), "name in {item}");
        for k in ["db", "depth", "pushed", "popped", "consumers"] {
            assert!(matches!(get(k), Resp::Integer(_)), "{k} in {item}");
        }
        for k in ["push_rate", "pop_rate", "wait_p50_ms", "wait_p99_ms"] {
            assert!(matches!(get(k), Resp::Double(_)), "{k} in {item}");
        }
        assert!(
            matches!(get("jobs"), Resp::Map(ref j) if j.is_empty()),
            "jobs in {item}"
        );
        let age = get("oldest_age_ms");
        if get("name") == Resp::bulk("q1") {
            assert!(matches!(age, Resp::Integer(_)), "oldest_age_ms in {item}");
        } else {
            assert_eq!(age, Resp::Null, "oldest_age_ms of the empty q2 in RESP3");
        }
    }
    let r = c3.cmd(&["KITE", "QUEUE", "q1"]);
    assert!(matches!(r, Resp::Map(_)), "RESP3 KITE QUEUE q1: {r}");
    assert_eq!(c3.cmd(&["KITE", "QUEUE", "nosuchqueue"]), Resp::Null);

    let mut c2 = Client::connect(port);
    let r2 = c2.cmd(&["KITE", "QUEUES", "q[12]"]);
    let items2 = r2
        .as_array()
        .unwrap_or_else(|| panic!("RESP2 KITE QUEUES: {r2}"));
    assert_eq!(items2.len(), 2);
    for (i, item) in items2.iter().enumerate() {
        assert!(
            matches!(item, Resp::Array(_)),
            "RESP2 KITE QUEUES element is not a flat array: {item}"
        );
        let q2 = Queue::from_resp(item);
        let q3 = Queue::from_resp(&items[i]);
        assert_eq!(q2.name(), q3.name());
        for k in ["db", "depth", "pushed", "popped", "consumers"] {
            assert!(matches!(q2.get(k), Resp::Integer(_)), "{k} in {item}");
            assert_eq!(q2.int(k), q3.int(k), "{k} in RESP2 and RESP3");
        }
        for k in ["name", "framework", "type"] {
            assert_eq!(q2.text(k), q3.text(k), "{k} in RESP2 and RESP3");
        }
        assert!(
            matches!(q2.get("jobs"), Resp::Array(j) if j.is_empty()),
            "jobs in RESP2: {item}"
        );
        assert_eq!(
            q2.opt_num("oldest_age_ms").is_some(),
            q3.opt_num("oldest_age_ms").is_some()
        );
        assert!(
            q2.opt_num("wait_p50_ms").is_some(),
            "RESP2 wait_p50_ms: {item}"
        );
    }
    let r = c2.cmd(&["KITE", "QUEUE", "q1"]);
    assert!(matches!(r, Resp::Array(_)), "RESP2 KITE QUEUE q1: {r}");
    let r = c2.cmd(&["KITE", "QUEUE", "nosuchqueue"]);
    assert!(r.is_null(), "RESP2 KITE QUEUE of an unknown name: {r}");
}

#[test]
fn list_queue_threads1() {
    list_queue(1);
}

#[test]
fn list_queue_threads2() {
    list_queue(2);
}

/// A sorted set popped from and a stream read by a group are queues of those types.
fn zset_and_stream_queues(threads: usize) {
    if skip_kite_only("zset_and_stream_queues") {
        return;
    }
    let server = KiteServer::start(&[], threads);
    let mut c = server.client();
    assert_eq!(
        int(&mut c, &["ZADD", "zq", "1", "a", "2", "b", "3", "c"]),
        3
    );
    let r = c.cmd(&["ZPOPMIN", "zq"]);
    assert_eq!(r.as_array().map(|a| a.len()), Some(2), "ZPOPMIN: {r}");
    let r = c.cmd(&["BZPOPMAX", "zq", "0"]);
    assert_eq!(r.as_array().map(|a| a.len()), Some(3), "BZPOPMAX: {r}");
    let zq = queue(&mut c, "zq");
    assert_eq!(zq.text("type"), "zset");
    assert_eq!(zq.text("framework"), "none");
    assert_eq!(zq.int("depth"), 1);
    assert_eq!(zq.int("popped"), 2);
    assert_eq!(
        zq.opt_num("oldest_age_ms"),
        None,
        "a sorted set has no oldest age"
    );

    // A stream whose first entry is 10 s old, read by a consumer group.
    let id = format!("{}-1", unix_now_ms() - 10_000);
    bulk_reply(&mut c, &["XADD", "sq", &id, "f", "v"], &id);
    ok(&mut c, &["XGROUP", "CREATE", "sq", "g", "0"]);
    let r = c.cmd(&[
        "XREADGROUP",
        "GROUP",
        "g",
        "c1",
        "COUNT",
        "1",
        "STREAMS",
        "sq",
        ">",
    ]);
    assert!(!r.is_null(), "XREADGROUP: {r}");
    let sq = queue(&mut c, "sq");
    assert_eq!(sq.text("type"), "stream");
    assert_eq!(sq.int("depth"), 1, "a stream's depth is its length");
    let age = sq.num("oldest_age_ms");
    assert!(
        (9000.0..=60_000.0).contains(&age),
        "oldest_age_ms of a stream whose first ID is 10 s old: {age}"
    );

    // A stream blocked on through a group is a queue too.
    ok(&mut c, &["XGROUP", "CREATE", "sq2", "g", "$", "MKSTREAM"]);
    let r = c.cmd(&[
        "XREADGROUP",
        "GROUP",
        "g",
        "c1",
        "BLOCK",
        "50",
        "STREAMS",
        "sq2",
        ">",
    ]);
    assert!(r.is_null(), "XREADGROUP BLOCK on an empty stream: {r}");
    assert_eq!(queue(&mut c, "sq2").text("type"), "stream");

    // XADD and ZADD alone make none.
    bulk_reply(&mut c, &["XADD", "plainstream", "1-1", "f", "v"], "1-1");
    assert_eq!(int(&mut c, &["ZADD", "plainzset", "1", "a"]), 1);
    assert_eq!(queue_names(&kite_queues(&mut c, None)), ["sq", "sq2", "zq"]);
}

#[test]
fn zset_and_stream_queues_threads1() {
    zset_and_stream_queues(1);
}

#[test]
fn zset_and_stream_queues_threads2() {
    zset_and_stream_queues(2);
}

// ---------------------------------------------------------------------------
// 2. Framework layouts
// ---------------------------------------------------------------------------

/// Writes a BullMQ queue `bull:emails` (3 waiting, 1 active, 2 delayed, 4 completed,
/// 1 failed, 1 prioritized) and a Sidekiq queue `queue:default` (2 waiting; 3 scheduled,
/// 1 retry, 2 dead framework-wide).
fn write_bull_and_sidekiq(c: &mut Client) {
    assert_eq!(int(c, &["LPUSH", "bull:emails:wait", "j1", "j2", "j3"]), 3);
    assert_eq!(
        int(c, &["ZADD", "bull:emails:delayed", "1", "d1", "2", "d2"]),
        2
    );
    assert_eq!(
        int(
            c,
            &[
                "ZADD",
                "bull:emails:completed",
                "1",
                "c1",
                "2",
                "c2",
                "3",
                "c3",
                "4",
                "c4"
            ]
        ),
        4
    );
    assert_eq!(int(c, &["LPUSH", "bull:emails:active", "a1"]), 1);
    assert_eq!(int(c, &["ZADD", "bull:emails:failed", "1", "f1"]), 1);
    assert_eq!(int(c, &["ZADD", "bull:emails:prioritized", "1", "p1"]), 1);
    assert_eq!(int(c, &["HSET", "bull:emails:1", "name", "welcome"]), 1);

    assert_eq!(int(c, &["SADD", "queues", "default"]), 1);
    assert_eq!(
        int(c, &["LPUSH", "queue:default", "{\"jid\":1}", "{\"jid\":2}"]),
        2
    );
    assert_eq!(
        int(c, &["ZADD", "schedule", "1", "s1", "2", "s2", "3", "s3"]),
        3
    );
    assert_eq!(int(c, &["ZADD", "retry", "1", "r1"]), 1);
    assert_eq!(int(c, &["ZADD", "dead", "1", "x1", "2", "x2"]), 2);
}

#[track_caller]
fn assert_jobs(q: &Queue, expected: &[(&str, i64)]) {
    let jobs = q.jobs();
    for (state, n) in expected {
        assert_eq!(
            jobs.get(*state).copied(),
            Some(*n),
            "jobs.{state} of {}: {jobs:?}",
            q.name_str()
        );
    }
    for (state, n) in &jobs {
        if !expected.iter().any(|(s, _)| s == state) {
            assert_eq!(
                *n,
                0,
                "jobs.{state} of {} (nothing written): {jobs:?}",
                q.name_str()
            );
        }
    }
}

fn frameworks(threads: usize) {
    if skip_kite_only("frameworks") {
        return;
    }
    let server = KiteServer::start(&[], threads);
    let mut c = server.client();

    // Only pushed to: not a queue.
    assert_eq!(int(&mut c, &["LPUSH", "mylist", "a", "b", "c"]), 3);
    assert_eq!(int(&mut c, &["RPUSH", "mylist", "d"]), 4);
    assert!(
        kite_queues(&mut c, None).is_empty(),
        "a list only pushed to is no queue"
    );
    assert_not_queue(&mut c, "mylist");
    assert!(info_queues(&mut c).rows.is_empty());

    write_bull_and_sidekiq(&mut c);

    // RQ.
    assert_eq!(int(&mut c, &["SADD", "rq:queues", "rq:queue:default"]), 1);
    assert_eq!(int(&mut c, &["RPUSH", "rq:queue:default", "id1", "id2"]), 2);
    assert_eq!(int(&mut c, &["ZADD", "rq:wip:default", "1", "w1"]), 1);
    assert_eq!(
        int(
            &mut c,
            &["ZADD", "rq:finished:default", "1", "f1", "2", "f2"]
        ),
        2
    );
    assert_eq!(int(&mut c, &["ZADD", "rq:failed:default", "1", "x1"]), 1);

    // bee-queue (prefix bq).
    assert_eq!(int(&mut c, &["HSET", "bq:mail:jobs", "1", "{}"]), 1);
    assert_eq!(int(&mut c, &["LPUSH", "bq:mail:waiting", "1"]), 1);
    assert_eq!(int(&mut c, &["SADD", "bq:mail:succeeded", "7", "8"]), 2);

    // Celery: a worker blocks on the queue and Kombu's priority lists, then a task comes.
    let r = c.cmd(&[
        b"BRPOP".as_slice(),
        b"celery",
        b"celery\x06\x163",
        b"celery\x06\x166",
        b"celery\x06\x169",
        b"0.05",
    ]);
    assert!(r.is_null(), "BRPOP on empty Celery lists: {r}");
    assert_eq!(int(&mut c, &["LPUSH", "celery", "task1"]), 1);

    let qs = kite_queues(&mut c, None);
    assert_eq!(
        queue_names(&qs),
        [
            "bq:mail",
            "bull:emails",
            "celery",
            "queue:default",
            "rq:queue:default"
        ],
        "one queue per framework queue (mylist is none)"
    );

    let bull = find_queue(&qs, "bull:emails");
    assert!(
        matches!(bull.text("framework").as_str(), "bullmq" | "bull"),
        "framework of bull:emails: {bull:?}"
    );
    assert_eq!(bull.text("type"), "list");
    assert_eq!(
        bull.int("depth"),
        3,
        "depth of a framework queue is its waiting list"
    );
    assert_jobs(
        bull,
        &[
            ("waiting", 3),
            ("active", 1),
            ("delayed", 2),
            ("completed", 4),
            ("failed", 1),
            ("prioritized", 1),
        ],
    );

    let sk = find_queue(&qs, "queue:default");
    assert_eq!(sk.text("framework"), "sidekiq");
    assert_eq!(sk.text("type"), "list");
    assert_eq!(sk.int("depth"), 2);
    assert_eq!(sk.jobs().get("waiting").copied(), Some(2), "{sk:?}");

    let rq = find_queue(&qs, "rq:queue:default");
    assert_eq!(rq.text("framework"), "rq");
    assert_eq!(rq.int("depth"), 2);
    assert_jobs(
        rq,
        &[
            ("waiting", 2),
            ("active", 1),
            ("completed", 2),
            ("failed", 1),
        ],
    );

    let bq = find_queue(&qs, "bq:mail");
    assert_eq!(bq.text("framework"), "bee-queue");
    assert_eq!(bq.int("depth"), 1);
    assert_jobs(bq, &[("waiting", 1), ("completed", 2)]);

    let celery = find_queue(&qs, "celery");
    assert_eq!(celery.text("framework"), "celery");
    assert_eq!(celery.int("depth"), 1);

    // A BullMQ 5 worker blocks on the marker: it is the queue's consumer, and the marker
    // makes the queue BullMQ's.
    let mut worker = server.client();
    worker.send(&["BZPOPMIN", "bull:emails:marker", "0"]);
    wait_for("the BullMQ worker to count as a consumer", || {
        (queue(&mut c, "bull:emails").int("consumers") == 1).then_some(())
    });
    assert_eq!(queue(&mut c, "bull:emails").text("framework"), "bullmq");
    assert_eq!(int(&mut c, &["ZADD", "bull:emails:marker", "0", "0"]), 1);
    let r = worker.read();
    assert_eq!(
        r.as_array().map(|a| a.len()),
        Some(3),
        "BZPOPMIN woke with {r}"
    );
    wait_for("no consumer once the worker is served", || {
        (queue(&mut c, "bull:emails").int("consumers") == 0).then_some(())
    });
    // The worker takes a job: wait -> active.
    bulk_reply(
        &mut c,
        &[
            "LMOVE",
            "bull:emails:wait",
            "bull:emails:active",
            "RIGHT",
            "LEFT",
        ],
        "j1",
    );
    let bull = queue(&mut c, "bull:emails");
    assert_eq!(bull.int("depth"), 2);
    assert_jobs(
        &bull,
        &[
            ("waiting", 2),
            ("active", 2),
            ("delayed", 2),
            ("completed", 4),
            ("failed", 1),
            ("prioritized", 1),
        ],
    );
    assert!(
        bull.int("popped") >= 1,
        "the LMOVE out of :wait is a pop: {bull:?}"
    );

    // The marker, the state keys, the job hash: no queues of their own.
    let names = queue_names(&kite_queues(&mut c, None));
    assert_eq!(
        names,
        [
            "bq:mail",
            "bull:emails",
            "celery",
            "queue:default",
            "rq:queue:default"
        ]
    );
    assert_eq!(
        queue_names(&kite_queues(&mut c, Some("bull:*"))),
        ["bull:emails"]
    );

    // INFO queues: the rows and the Sidekiq framework-wide line.
    let info = info_queues(&mut c);
    assert_eq!(info.int("queues_tracked"), 5);
    let row = info.row("bull:emails");
    assert_eq!(row["framework"], "bullmq");
    assert_eq!(row["type"], "list");
    assert_eq!(row["depth"], "2");
    assert_eq!(row["jobs_waiting"], "2");
    assert_eq!(row["jobs_active"], "2");
    assert_eq!(row["jobs_delayed"], "2");
    assert_eq!(row["jobs_completed"], "4");
    assert_eq!(row["jobs_failed"], "1");
    let row = info.row("queue:default");
    assert_eq!(row["framework"], "sidekiq");
    assert_eq!(row["depth"], "2");
    let row = info.row("rq:queue:default");
    assert_eq!(row["framework"], "rq");
    let sidekiq = info
        .frameworks
        .get("sidekiq")
        .unwrap_or_else(|| panic!("no framework_sidekiq line: {info:?}"));
    assert_eq!(sidekiq.get("scheduled").map(|s| s.as_str()), Some("3"));
    assert_eq!(sidekiq.get("retry").map(|s| s.as_str()), Some("1"));
    assert_eq!(sidekiq.get("dead").map(|s| s.as_str()), Some("2"));

    // Lengths are read when reported.
    assert_eq!(int(&mut c, &["ZADD", "dead", "3", "x3"]), 1);
    assert_eq!(int(&mut c, &["LPUSH", "queue:default", "{\"jid\":3}"]), 3);
    let info = info_queues(&mut c);
    assert_eq!(info.frameworks["sidekiq"]["dead"], "3");
    assert_eq!(info.row("queue:default")["depth"], "3");

    // /metrics: per-queue job states, and the framework-wide ones with queue="".
    let m = metrics(server.port, None);
    assert_eq!(
        m.value(
            "kite_queue_jobs",
            &[
                ("queue", "bull:emails"),
                ("framework", "bullmq"),
                ("state", "completed")
            ]
        ),
        4.0
    );
    assert_eq!(
        m.value(
            "kite_queue_jobs",
            &[
                ("queue", ""),
                ("framework", "sidekiq"),
                ("state", "scheduled")
            ]
        ),
        3.0
    );
    assert_eq!(
        m.value(
            "kite_queue_depth",
            &[("queue", "queue:default"), ("framework", "sidekiq")]
        ),
        3.0
    );
    assert!(!metric_queues(&m).contains("mylist"));
}

#[test]
fn frameworks_threads1() {
    frameworks(1);
}

#[test]
fn frameworks_threads2() {
    frameworks(2);
}

// ---------------------------------------------------------------------------
// 3. INFO queues
// ---------------------------------------------------------------------------

fn info_section(threads: usize) {
    if skip_kite_only("info_section") {
        return;
    }
    let server = KiteServer::start(&[], threads);
    let mut c = server.client();
    // q1: 3 pushed, 1 popped; eq: emptied; wq: pushed, never popped; zq: a sorted set;
    // a name that needs escaping.
    null_reply(&mut c, &["BLPOP", "q1", "0.05"]);
    assert_eq!(int(&mut c, &["RPUSH", "q1", "a", "b", "c"]), 3);
    bulk_reply(&mut c, &["LPOP", "q1"], "a");
    assert_eq!(int(&mut c, &["RPUSH", "eq", "x"]), 1);
    bulk_reply(&mut c, &["LPOP", "eq"], "x");
    null_reply(&mut c, &["BLPOP", "wq", "0.05"]);
    assert_eq!(int(&mut c, &["RPUSH", "wq", "x"]), 1);
    assert_eq!(
        int(&mut c, &["ZADD", "zq", "1", "a", "2", "b", "3", "c"]),
        3
    );
    assert_eq!(
        c.cmd(&["ZPOPMIN", "zq"]).as_array().map(|a| a.len()),
        Some(2)
    );
    let odd: &[u8] = b"od,d=q%\xff";
    assert_eq!(
        c.cmd(&[b"RPUSH".as_slice(), odd, b"x", b"y"]),
        Resp::Integer(2)
    );
    assert_eq!(c.cmd(&[b"LPOP".as_slice(), odd]), Resp::bulk("x"));

    // Not in plain INFO; in INFO queues, all and everything.
    let plain = info_text(&mut c, None);
    assert!(
        !plain.contains("# Queues") && !plain.contains("queue_tracking:"),
        "plain INFO shows the Queues section"
    );
    assert!(!info_text(&mut c, Some("default")).contains("# Queues"));
    for section in ["queues", "all", "everything", "QUEUES"] {
        let text = info_text(&mut c, Some(section));
        let info = parse_info_queues(&text);
        assert_eq!(
            info.fields.get("queues_tracked").map(|s| s.as_str()),
            Some("5"),
            "queues_tracked in INFO {section}"
        );
        assert_eq!(info.rows.len(), 5, "queue rows in INFO {section}");
    }

    let info = info_queues(&mut c);
    assert_eq!(info.field("queue_tracking"), "1");
    assert_eq!(info.int("queues_tracked"), 5);
    assert_eq!(info.int("queues_overflow"), 0);
    let names: Vec<String> = info.rows.iter().map(|r| r["name"].clone()).collect();
    assert_eq!(names.len(), 5);
    let escaped = &names[1];
    assert_eq!(
        escaped.to_ascii_uppercase(),
        "OD%2CD%3DQ%25%FF",
        "a name with `,` `=` `%` and a non-ASCII byte, escaped: {names:?}"
    );
    assert_eq!(
        [&names[0], &names[2], &names[3], &names[4]],
        ["eq", "q1", "wq", "zq"],
        "rows sorted by name: {names:?}"
    );
    for row in &info.rows {
        for f in [
            "name",
            "framework",
            "type",
            "depth",
            "pushed",
            "popped",
            "consumers",
            "oldest_age_ms",
            "wait_p50_ms",
            "wait_p99_ms",
        ] {
            assert!(row.contains_key(f), "no {f} in INFO row {row:?}");
        }
    }
    let num = |row: &BTreeMap<String, String>, k: &str| -> f64 {
        row[k]
            .parse()
            .unwrap_or_else(|_| panic!("{k} is not a number in {row:?}"))
    };

    let q1 = info.row("q1");
    assert_eq!(q1["framework"], "none");
    assert_eq!(q1["type"], "list");
    assert_eq!(q1["depth"], "2");
    assert_eq!(q1["pushed"], "3");
    assert_eq!(q1["popped"], "1");
    assert_eq!(q1["consumers"], "0");
    assert!(num(q1, "oldest_age_ms") >= 0.0);
    assert!(num(q1, "wait_p50_ms") >= 0.0);
    assert!(num(q1, "wait_p99_ms") >= num(q1, "wait_p50_ms"));

    let eq = info.row("eq");
    assert_eq!(eq["depth"], "0");
    assert_eq!(eq["popped"], "1");
    assert_eq!(
        num(eq, "oldest_age_ms"),
        -1.0,
        "oldest_age_ms of an empty queue"
    );
    assert!(num(eq, "wait_p50_ms") >= 0.0);

    let wq = info.row("wq");
    assert_eq!(wq["depth"], "1");
    assert_eq!(wq["pushed"], "1");
    assert_eq!(
        num(wq, "wait_p50_ms"),
        -1.0,
        "wait_p50_ms before the first pop"
    );
    assert_eq!(
        num(wq, "wait_p99_ms"),
        -1.0,
        "wait_p99_ms before the first pop"
    );
    assert!(num(wq, "oldest_age_ms") >= 0.0);

    let zq = info.row("zq");
    assert_eq!(zq["type"], "zset");
    assert_eq!(zq["depth"], "2");
    assert_eq!(zq["popped"], "1");
    assert_eq!(
        num(zq, "oldest_age_ms"),
        -1.0,
        "oldest_age_ms of a sorted set"
    );

    // The same figures as KITE QUEUES.
    let qs = kite_queues(&mut c, None);
    assert_eq!(qs.len(), 5);
    assert_eq!(qs[1].name(), odd);
    for q in &qs {
        if q.name() == odd {
            continue;
        }
        let row = info.row(&q.name_str());
        for k in ["depth", "pushed", "popped", "consumers"] {
            assert_eq!(row[k], q.int(k).to_string(), "{k} of {}", q.name_str());
        }
    }
}

#[test]
fn info_queues_threads1() {
    info_section(1);
}

#[test]
fn info_queues_threads2() {
    info_section(2);
}

// ---------------------------------------------------------------------------
// 4. queue-tracking and queue-tracking-max-queues
// ---------------------------------------------------------------------------

#[test]
fn queue_tracking_off_and_on() {
    if skip_kite_only("queue_tracking_off_and_on") {
        return;
    }
    let server = KiteServer::start(&["--queue-tracking", "no"], 2);
    let mut c = server.client();
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "queue-tracking"]),
        Resp::Array(vec![Resp::bulk("queue-tracking"), Resp::bulk("no")])
    );
    null_reply(&mut c, &["BLPOP", "q1", "0.05"]);
    assert_eq!(int(&mut c, &["RPUSH", "q1", "a", "b", "c"]), 3);
    bulk_reply(&mut c, &["LPOP", "q1"], "a");
    assert_eq!(int(&mut c, &["LPUSH", "bull:emails:wait", "j1"]), 1);
    assert!(kite_queues(&mut c, None).is_empty(), "tracking is off");
    let info = info_queues(&mut c);
    assert_eq!(info.field("queue_tracking"), "0");
    assert_eq!(info.int("queues_tracked"), 0);
    assert!(info.rows.is_empty());
    let m = metrics(server.port, None);
    assert_eq!(m.value("kite_queues_tracked", &[]), 0.0);
    assert!(metric_queues(&m).is_empty());

    ok(&mut c, &["CONFIG", "SET", "queue-tracking", "yes"]);
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "queue-tracking"]),
        Resp::Array(vec![Resp::bulk("queue-tracking"), Resp::bulk("yes")])
    );
    bulk_reply(&mut c, &["LPOP", "q1"], "b");
    let q1 = queue(&mut c, "q1");
    assert_counts(&q1, 1, 0, 1);
    let info = info_queues(&mut c);
    assert_eq!(info.field("queue_tracking"), "1");
    assert!(info.int("queues_tracked") >= 1);
    assert_eq!(info.row("q1")["popped"], "1");

    ok(&mut c, &["CONFIG", "SET", "queue-tracking", "no"]);
    bulk_reply(&mut c, &["LPOP", "q1"], "c");
    assert!(
        kite_queues(&mut c, None).is_empty(),
        "tables emptied when turned off"
    );
    let info = info_queues(&mut c);
    assert_eq!(info.field("queue_tracking"), "0");
    assert_eq!(info.int("queues_tracked"), 0);
}

#[test]
fn queue_tracking_max_queues() {
    if skip_kite_only("queue_tracking_max_queues") {
        return;
    }
    let server = KiteServer::start(&["--queue-tracking-max-queues", "2"], 1);
    let mut c = server.client();
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "queue-tracking-max-queues"]),
        Resp::Array(vec![
            Resp::bulk("queue-tracking-max-queues"),
            Resp::bulk("2")
        ])
    );
    for k in ["qa", "qb", "qc", "qd"] {
        assert_eq!(int(&mut c, &["RPUSH", k, "x", "y"]), 2);
        bulk_reply(&mut c, &["LPOP", k], "x");
    }
    let qs = kite_queues(&mut c, None);
    assert_eq!(
        queue_names(&qs),
        ["qa", "qb"],
        "the first two queues are tracked, the others are past the cap"
    );
    let info = info_queues(&mut c);
    assert_eq!(info.int("queues_tracked"), 2);
    assert!(
        info.int("queues_overflow") >= 2,
        "queues_overflow: {:?}",
        info.fields
    );
    assert_eq!(info.rows.len(), 2);
    // The tracked ones go on counting.
    bulk_reply(&mut c, &["LPOP", "qa"], "y");
    assert_counts(&queue(&mut c, "qa"), 0, 0, 2);
    let m = metrics(server.port, None);
    assert_eq!(m.value("kite_queues_tracked", &[]), 2.0);
    assert!(m.value("kite_queues_overflow", &[]) >= 2.0);
}

/// The cap is the server's, however many threads share it: two queues at most with four
/// threads, where each thread's share of two is less than one queue.
#[test]
fn queue_tracking_max_queues_over_more_threads_than_queues() {
    if skip_kite_only("queue_tracking_max_queues_over_more_threads_than_queues") {
        return;
    }
    let server = KiteServer::start(&["--queue-tracking-max-queues", "2"], 4);
    let mut c = server.client();
    let names: Vec<String> = (0..16).map(|i| format!("capq{i}")).collect();
    for k in &names {
        assert_eq!(int(&mut c, &["RPUSH", k, "x", "y"]), 2);
        bulk_reply(&mut c, &["LPOP", k], "x");
    }
    let info = info_queues(&mut c);
    assert_eq!(
        info.int("queues_tracked"),
        2,
        "INFO queues: {:?}",
        info.fields
    );
    assert_eq!(info.int("queues_overflow"), 14, "{:?}", info.fields);
    assert_eq!(kite_queues(&mut c, None).len(), 2);
}

// ---------------------------------------------------------------------------
// 5. HTTP on the RESP port
// ---------------------------------------------------------------------------

/// q1: 5 pushed, 2 popped, 3 left; q2: 1 pushed and popped (on the other shard at 2
/// threads).
fn setup_http_queues(c: &mut Client) {
    null_reply(c, &["BLPOP", "q1", "0.05"]);
    null_reply(c, &["BLPOP", "q2", "0.05"]);
    assert_eq!(int(c, &["RPUSH", "q1", "a", "b", "c", "d", "e"]), 5);
    bulk_reply(c, &["LPOP", "q1"], "a");
    bulk_reply(c, &["RPOP", "q1"], "e");
    assert_eq!(int(c, &["RPUSH", "q2", "x"]), 1);
    bulk_reply(c, &["LPOP", "q2"], "x");
}

/// Every metric name the spec lists as server-wide.
const SERVER_METRICS: &[&str] = &[
    "kite_up",
    "kite_uptime_seconds",
    "kite_commands_total",
    "kite_command_paths_total",
    "kite_errors_total",
    "kite_connected_clients",
    "kite_blocked_clients",
    "kite_memory_used_bytes",
    "kite_memory_rss_bytes",
    "kite_maxmemory_bytes",
    "kite_keys",
    "kite_expired_keys_total",
    "kite_evicted_keys_total",
    "kite_thread_cpu_seconds_total",
    "kite_thread_ops_per_second",
    "kite_thread_keys",
    "kite_rdb_changes_since_last_save",
    "kite_rdb_last_save_timestamp_seconds",
    "kite_rdb_bgsave_in_progress",
    "kite_aof_enabled",
    "kite_replication_master",
    "kite_connected_replicas",
    "kite_replication_offset",
    "kite_queues_tracked",
    "kite_queues_overflow",
];

/// The /metrics checks shared by the RESP port and `http-port`.
fn check_metrics(m: &Metrics, threads: usize, dbsize: i64) {
    let q1 = [("queue", "q1"), ("framework", "none")];
    let q2 = [("queue", "q2"), ("framework", "none")];
    assert_eq!(m.value("kite_queue_depth", &q1), 3.0);
    assert_eq!(m.value("kite_queue_depth", &q2), 0.0);
    assert_eq!(m.value("kite_queue_pushed_total", &q1), 5.0);
    assert_eq!(m.value("kite_queue_popped_total", &q1), 2.0);
    assert_eq!(m.value("kite_queue_popped_total", &q2), 1.0);
    assert_eq!(m.value("kite_queue_consumers", &q1), 0.0);
    assert!(m.value("kite_queue_oldest_age_seconds", &q1) >= 0.0);
    assert_eq!(metric_queues(m), BTreeSet::from(["q1".into(), "q2".into()]));

    // The wait histogram: cumulative buckets ending in +Inf, _count, _sum.
    let mut buckets: Vec<(f64, f64)> = m
        .matching("kite_queue_wait_seconds_bucket", &q1)
        .iter()
        .map(|s| {
            let le = s
                .labels
                .get("le")
                .unwrap_or_else(|| panic!("bucket without le: {s:?}"));
            let le = prom_value(le).unwrap_or_else(|| panic!("bad le {le:?}"));
            (le, s.value)
        })
        .collect();
    assert!(buckets.len() >= 2, "wait buckets of q1: {buckets:?}");
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    assert_eq!(
        buckets.last().unwrap().0,
        f64::INFINITY,
        "no le=\"+Inf\" bucket"
    );
    assert_eq!(buckets.last().unwrap().1, 2.0, "+Inf bucket = pops of q1");
    for w in buckets.windows(2) {
        assert!(w[0].1 <= w[1].1, "buckets are not cumulative: {buckets:?}");
    }
    assert_eq!(m.value("kite_queue_wait_seconds_count", &q1), 2.0);
    let sum = m.value("kite_queue_wait_seconds_sum", &q1);
    assert!(sum >= 0.0 && sum.is_finite(), "wait _sum of q1: {sum}");
    assert_eq!(
        m.types.get("kite_queue_wait_seconds").map(|s| s.as_str()),
        Some("histogram")
    );
    assert_eq!(
        m.types.get("kite_queue_depth").map(|s| s.as_str()),
        Some("gauge")
    );

    // Server-wide.
    for name in SERVER_METRICS {
        assert!(m.has_name(name), "no {name} in /metrics");
    }
    assert_eq!(m.value("kite_up", &[]), 1.0);
    assert!(m.value("kite_connected_clients", &[]) >= 1.0);
    assert_eq!(m.value("kite_blocked_clients", &[]), 0.0);
    assert_eq!(m.value("kite_replication_master", &[]), 1.0);
    assert_eq!(m.value("kite_queues_tracked", &[]), 2.0);
    assert_eq!(m.value("kite_queues_overflow", &[]), 0.0);
    assert_eq!(m.value("kite_keys", &[("db", "0")]), dbsize as f64);
    let rpush: f64 = m
        .all("kite_commands_total")
        .filter(|s| {
            s.labels
                .get("cmd")
                .is_some_and(|c| c.eq_ignore_ascii_case("rpush"))
        })
        .map(|s| s.value)
        .sum();
    assert!(
        rpush >= 2.0,
        "kite_commands_total{{cmd=\"rpush\"}} is {rpush}"
    );
    assert!(
        m.all("kite_errors_total").any(|s| s.value >= 1.0),
        "kite_errors_total after an unknown command"
    );
    for s in m.all("kite_command_paths_total") {
        let p = s.labels.get("path").map(|p| p.as_str()).unwrap_or("");
        assert!(
            matches!(p, "inline" | "one_hop" | "multi_shard"),
            "kite_command_paths_total path {p:?}"
        );
    }
    let threads_seen: BTreeSet<&String> = m
        .all("kite_thread_keys")
        .filter_map(|s| s.labels.get("thread"))
        .collect();
    assert!(
        threads_seen.len() >= threads,
        "kite_thread_keys for {threads} threads: {threads_seen:?}"
    );
}

#[track_caller]
fn check_other_paths(port: u16) {
    let r = get(port, "/healthz");
    r.expect_status(200, "GET /healthz");
    assert_eq!(r.text().trim(), "ok");

    let r = http_req(port, "HEAD", "/healthz", None);
    r.expect_status(200, "HEAD /healthz");

    get(port, "/nope").expect_status(404, "GET /nope");
    get(port, "/metricsx").expect_status(404, "GET /metricsx");

    let r = get(port, "/");
    r.expect_status(200, "GET /");
    assert!(
        r.content_type().starts_with("text/html"),
        "GET / {:?}",
        r.headers
    );
    assert!(
        r.text().to_ascii_lowercase().contains("<html"),
        "GET / is not an HTML page"
    );

    let r = get(port, "/api/state");
    r.expect_status(200, "GET /api/state");
    assert!(
        r.content_type().contains("json"),
        "GET /api/state {:?}",
        r.headers
    );
    let body = r.text();
    assert!(
        body.trim_start().starts_with('{'),
        "/api/state: {}",
        truncate(&body, 300)
    );
    assert!(
        body.trim_end().ends_with('}'),
        "/api/state: {}",
        truncate(&body, 300)
    );
    assert!(
        body.contains("\"q1\"") && body.contains("\"q2\""),
        "queues in /api/state"
    );

    let r = get(port, "/api/queue?name=q1");
    r.expect_status(200, "GET /api/queue?name=q1");
    let body = r.text();
    assert!(
        body.trim_start().starts_with('{'),
        "/api/queue: {}",
        truncate(&body, 300)
    );
    assert!(
        body.contains("\"q1\""),
        "/api/queue?name=q1: {}",
        truncate(&body, 300)
    );

    // HTTP/1.0, and a request line that arrives in pieces.
    let r = http_raw(port, b"GET /healthz HTTP/1.0\r\n\r\n", false);
    r.expect_status(200, "GET /healthz HTTP/1.0");
    assert_eq!(r.text().trim(), "ok");
    let mut s = connect_raw(port);
    s.write_all(b"GET /heal").unwrap();
    thread::sleep(Duration::from_millis(100));
    s.write_all(b"thz HTTP/1.1\r\nHost: x\r\n").unwrap();
    thread::sleep(Duration::from_millis(100));
    s.write_all(b"\r\n").unwrap();
    let r = parse_http(&read_to_eof(&mut s, "split GET"), "split GET", false);
    r.expect_status(200, "GET /healthz sent in three writes");
    assert_eq!(r.text().trim(), "ok");
}

fn http_on_resp_port(threads: usize) {
    if skip_kite_only("http_on_resp_port") {
        return;
    }
    let mut server = KiteServer::start(&[], threads);
    let mut c = server.client();
    setup_http_queues(&mut c);
    assert!(c.cmd(&["NOSUCHCOMMAND"]).is_error());
    let dbsize = int(&mut c, &["DBSIZE"]);

    let m = metrics(server.port, None);
    check_metrics(&m, threads, dbsize);
    check_other_paths(server.port);

    // The RESP client on the same port still works, and new ones too.
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(int(&mut c, &["LLEN", "q1"]), 3);
    let mut fresh = server.client();
    assert_eq!(fresh.cmd(&["PING"]), Resp::simple("PONG"));

    // An HTTP request left half-sent does not hold up RESP clients.
    let mut half = connect_raw(server.port);
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    thread::sleep(Duration::from_millis(100));
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(fresh.cmd(&["SET", "k", "v"]), Resp::ok());
    half.write_all(b"\r\n").unwrap();
    let r = parse_http(&read_to_eof(&mut half, "half GET"), "half GET", false);
    r.expect_status(200, "GET /metrics finished late");
    assert!(r.text().contains("kite_queue_depth{"));

    // A RESP GET on a fresh connection is still a RESP GET (inline and multibulk).
    let mut raw = Client::connect(server.port);
    raw.send_raw(b"GET k\r\n");
    assert_eq!(raw.read(), Resp::bulk("v"));
    let mut raw = Client::connect(server.port);
    raw.send_raw(&encode_command(&["GET", "k"]));
    assert_eq!(raw.read(), Resp::bulk("v"));

    // The HTTP connections did not upset the server.
    let m2 = metrics(server.port, None);
    assert_eq!(
        m2.value(
            "kite_queue_depth",
            &[("queue", "q1"), ("framework", "none")]
        ),
        3.0
    );
    server.assert_alive();
}

#[test]
fn http_on_resp_port_threads1() {
    http_on_resp_port(1);
}

#[test]
fn http_on_resp_port_threads2() {
    http_on_resp_port(2);
}

// ---------------------------------------------------------------------------
// 6. http-port
// ---------------------------------------------------------------------------

#[test]
fn http_port_listener() {
    if skip_kite_only("http_port_listener") {
        return;
    }
    let p = free_port();
    let ps = p.to_string();
    let server = KiteServer::start(&["--http-port", &ps], 2);
    let mut c = server.client();
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "http-port"]),
        Resp::Array(vec![Resp::bulk("http-port"), Resp::bulk(&ps)])
    );
    wait_for("the http-port listener", || {
        TcpStream::connect(("127.0.0.1", p)).ok()
    });
    setup_http_queues(&mut c);
    assert!(c.cmd(&["NOSUCHCOMMAND"]).is_error());
    let dbsize = int(&mut c, &["DBSIZE"]);

    check_metrics(&metrics(p, None), 2, dbsize);
    check_other_paths(p);
    http_req(p, "DELETE", "/", None).expect_status(405, "DELETE / on http-port");
    http_req(p, "POST", "/metrics", None).expect_status(405, "POST /metrics on http-port");

    // It speaks only HTTP: a RESP PING gets no +PONG.
    for ping in [encode_command(&["PING"]), b"PING\r\n".to_vec()] {
        let mut s = connect_raw(p);
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let _ = s.write_all(&ping);
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let text = String::from_utf8_lossy(&got);
        assert!(
            !text.contains("+PONG"),
            "a RESP PING on http-port got {text:?}"
        );
    }

    // The main port goes on with both.
    assert_eq!(c.cmd(&["PING"]), Resp::simple("PONG"));
    get(server.port, "/healthz").expect_status(200, "GET /healthz on the RESP port");
}

// ---------------------------------------------------------------------------
// 7. Access
// ---------------------------------------------------------------------------

#[test]
fn http_basic_auth_requirepass() {
    if skip_kite_only("http_basic_auth_requirepass") {
        return;
    }
    let p = free_port();
    let ps = p.to_string();
    let server = KiteServer::start(&["--requirepass", "pw", "--http-port", &ps], 2);
    let mut c = server.client();
    setup_http_queues(&mut c);
    wait_for("the http-port listener", || {
        TcpStream::connect(("127.0.0.1", p)).ok()
    });

    for port in [server.port, p] {
        for path in [
            "/metrics",
            "/healthz",
            "/",
            "/api/state",
            "/api/queue?name=q1",
        ] {
            assert_unauthorized(&get(port, path), &format!("GET {path} without credentials"));
            assert_unauthorized(
                &get_as(port, path, "default", "wrong"),
                &format!("GET {path} with a wrong password"),
            );
            assert_unauthorized(
                &get_as(port, path, "nobody", "pw"),
                &format!("GET {path} as an unknown user"),
            );
        }
        assert_unauthorized(
            &http_req(port, "HEAD", "/healthz", None),
            "HEAD /healthz without credentials",
        );
        // A malformed Authorization header is no credential either.
        let r = http_raw(
            port,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic !!!not-base64\r\n\r\n",
            false,
        );
        assert_unauthorized(&r, "GET /metrics with a malformed Authorization");

        let r = get_as(port, "/metrics", "default", "pw");
        r.expect_status(200, "GET /metrics as default:pw");
        let m = parse_metrics(&r.text());
        assert_eq!(
            m.value(
                "kite_queue_depth",
                &[("queue", "q1"), ("framework", "none")]
            ),
            3.0
        );
        let r = get_as(port, "/healthz", "default", "pw");
        r.expect_status(200, "GET /healthz as default:pw");
        assert_eq!(r.text().trim(), "ok");
        get_as(port, "/", "default", "pw").expect_status(200, "GET / as default:pw");
        let r = get_as(port, "/api/state", "default", "pw");
        r.expect_status(200, "GET /api/state as default:pw");
        assert!(r.text().contains("\"q1\""));
    }
    // RESP is unchanged.
    let mut raw = server.raw_client();
    assert!(raw
        .cmd(&["PING"])
        .error_text()
        .is_some_and(|e| e.starts_with("NOAUTH")));
}

#[test]
fn http_acl_user_sees_only_readable_queues() {
    if skip_kite_only("http_acl_user_sees_only_readable_queues") {
        return;
    }
    // No slow log: its entries would name keys in /api/state.
    let server = KiteServer::start(&["--requirepass", "pw", "--slowlog-max-len", "0"], 2);
    let mut c = server.client();
    ok(
        &mut c,
        &["ACL", "SETUSER", "alice", "on", ">apw", "~bull:*", "+@all"],
    );
    ok(
        &mut c,
        &["ACL", "SETUSER", "bob", "off", ">bpw", "~*", "+@all"],
    );
    write_bull_and_sidekiq(&mut c);
    null_reply(&mut c, &["BLPOP", "q1", "0.05"]);
    assert_eq!(int(&mut c, &["RPUSH", "q1", "a"]), 1);
    let port = server.port;

    let all = metric_queues(&metrics(port, Some(("default", "pw"))));
    assert_eq!(
        all,
        BTreeSet::from(["bull:emails".into(), "queue:default".into(), "q1".into()]),
        "the default user sees every queue"
    );

    let alice = metrics(port, Some(("alice", "apw")));
    assert_eq!(
        metric_queues(&alice),
        BTreeSet::from(["bull:emails".to_string()]),
        "alice (~bull:*) sees only bull:emails in /metrics"
    );
    assert!(
        alice.samples.iter().all(|s| s
            .labels
            .get("queue")
            .is_none_or(|q| q.is_empty() || q == "bull:emails")),
        "alice sees another queue's series"
    );
    let r = get_as(port, "/api/state", "alice", "apw");
    r.expect_status(200, "GET /api/state as alice");
    let body = r.text();
    assert!(
        body.contains("\"bull:emails\""),
        "alice's /api/state lacks bull:emails"
    );
    assert!(
        !body.contains("\"queue:default\"") && !body.contains("\"q1\""),
        "alice's /api/state shows a queue outside ~bull:*: {}",
        truncate(&body, 2000)
    );
    let r = get_as(port, "/api/state", "default", "pw");
    r.expect_status(200, "GET /api/state as default");
    assert!(r.text().contains("\"queue:default\""));

    assert_unauthorized(
        &get_as(port, "/metrics", "alice", "pw"),
        "alice with default's password",
    );
    assert_unauthorized(&get_as(port, "/metrics", "bob", "bpw"), "a disabled user");
}

#[test]
fn http_open_metrics() {
    if skip_kite_only("http_open_metrics") {
        return;
    }
    let server = KiteServer::start(
        &[
            "--requirepass",
            "pw",
            "--http-open-metrics",
            "yes",
            "--slowlog-max-len",
            "0",
        ],
        2,
    );
    let mut c = server.client();
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "http-open-metrics"]),
        Resp::Array(vec![Resp::bulk("http-open-metrics"), Resp::bulk("yes")])
    );
    ok(
        &mut c,
        &["ACL", "SETUSER", "alice", "on", ">apw", "~bull:*", "+@all"],
    );
    write_bull_and_sidekiq(&mut c);
    let port = server.port;

    let m = metrics(port, None);
    assert_eq!(
        metric_queues(&m),
        BTreeSet::from(["bull:emails".into(), "queue:default".into()]),
        "open /metrics shows every queue"
    );
    let r = get(port, "/healthz");
    r.expect_status(200, "open GET /healthz");
    assert_eq!(r.text().trim(), "ok");
    http_req(port, "HEAD", "/healthz", None).expect_status(200, "open HEAD /healthz");
    assert_unauthorized(&get(port, "/"), "GET / with open metrics");
    assert_unauthorized(&get(port, "/api/state"), "GET /api/state with open metrics");
    assert_unauthorized(
        &get(port, "/api/queue?name=bull:emails"),
        "GET /api/queue with open metrics",
    );
    get_as(port, "/", "default", "pw").expect_status(200, "GET / as default");
    get_as(port, "/api/state", "alice", "apw").expect_status(200, "GET /api/state as alice");
}

#[test]
fn http_access_follows_runtime_changes() {
    if skip_kite_only("http_access_follows_runtime_changes") {
        return;
    }
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    let port = server.port;
    get(port, "/metrics").expect_status(200, "GET /metrics with no password");
    get(port, "/api/state").expect_status(200, "GET /api/state with no password");

    ok(&mut c, &["CONFIG", "SET", "requirepass", "pw"]);
    assert_unauthorized(
        &get(port, "/metrics"),
        "GET /metrics after CONFIG SET requirepass",
    );
    get_as(port, "/metrics", "default", "pw").expect_status(200, "GET /metrics as default:pw");

    ok(&mut c, &["CONFIG", "SET", "requirepass", ""]);
    get(port, "/metrics").expect_status(200, "GET /metrics after the password is removed");

    // A default user with an ACL password (no requirepass).
    ok(&mut c, &["ACL", "SETUSER", "default", "resetpass", ">dpw"]);
    assert_unauthorized(
        &get(port, "/metrics"),
        "GET /metrics once default has a password",
    );
    assert_unauthorized(
        &get(port, "/healthz"),
        "GET /healthz once default has a password",
    );
    get_as(port, "/metrics", "default", "dpw").expect_status(200, "GET /metrics as default:dpw");
    ok(&mut c, &["ACL", "SETUSER", "default", "nopass"]);
    get(port, "/healthz").expect_status(200, "GET /healthz after nopass");
}

// ---------------------------------------------------------------------------
// 8. Cross-protocol defence (also checked against redis-server)
// ---------------------------------------------------------------------------

/// Sends `first` and expects `first_reply` back, then sends `attack` and expects the
/// server to close the connection without answering it.
#[track_caller]
fn expect_closed_after(port: u16, first: &[u8], first_reply: &[u8], attack: &[u8]) {
    let mut raw = Client::connect(port);
    if !first.is_empty() {
        raw.send_raw(first);
        let got = raw.read_raw_exact(first_reply.len());
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(first_reply),
            "reply to {:?}",
            String::from_utf8_lossy(first)
        );
    }
    let _ = raw.try_send_raw(attack);
    let (rest, closed) = raw.read_raw_until_close(Duration::from_secs(5));
    assert!(
        closed,
        "the connection was left open after {:?}",
        String::from_utf8_lossy(attack)
    );
    assert!(
        rest.is_empty(),
        "{:?} was answered with {:?}",
        String::from_utf8_lossy(attack),
        String::from_utf8_lossy(&rest)
    );
}

fn cross_protocol(threads: usize) {
    let mut server = KiteServer::start(&[], threads);
    let mut other = server.client();
    assert_eq!(other.cmd(&["PING"]), Resp::simple("PONG"));

    expect_closed_after(
        server.port,
        b"SET a b\r\n",
        b"+OK\r\n",
        b"POST / HTTP/1.1\r\n",
    );
    expect_closed_after(
        server.port,
        b"SET a b\r\n",
        b"+OK\r\n",
        b"Host: example.com\r\n",
    );
    expect_closed_after(
        server.port,
        b"PING\r\n",
        b"+PONG\r\n",
        b"host: example.com\r\n",
    );
    // As RESP arrays.
    expect_closed_after(
        server.port,
        &encode_command(&["PING"]),
        b"+PONG\r\n",
        &encode_command(&["POST", "/", "HTTP/1.1"]),
    );
    expect_closed_after(
        server.port,
        &encode_command(&["PING"]),
        b"+PONG\r\n",
        &encode_command(&["Host:", "example.com"]),
    );
    // A browser's POST on a fresh connection: closed before its body runs.
    expect_closed_after(
        server.port,
        b"",
        b"",
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n\
          Content-Length: 15\r\n\r\nSET pwned yes\r\n",
    );
    expect_closed_after(
        server.port,
        b"",
        b"",
        b"Host: 127.0.0.1\r\nSET pwned yes\r\n",
    );

    // The others are still served, and nothing ran.
    assert_eq!(other.cmd(&["PING"]), Resp::simple("PONG"));
    assert_eq!(other.cmd(&["GET", "a"]), Resp::bulk("b"));
    assert_eq!(other.cmd(&["EXISTS", "pwned"]), Resp::Integer(0));
    server.assert_alive();
}

#[test]
fn cross_protocol_threads1() {
    cross_protocol(1);
}

#[test]
fn cross_protocol_threads2() {
    cross_protocol(2);
}

/// Only a connection's first line can be HTTP: a GET request line after a RESP command is
/// RESP (an error at most), and its `Host:` header closes the connection.
#[test]
fn cross_protocol_get_after_a_command_is_not_http() {
    let server = KiteServer::start(&[], 2);
    let mut raw = Client::connect(server.port);
    raw.send_raw(b"PING\r\n");
    assert_eq!(raw.read(), Resp::simple("PONG"));
    raw.send_raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let (rest, closed) = raw.read_raw_until_close(Duration::from_secs(5));
    let text = String::from_utf8_lossy(&rest);
    assert!(closed, "left open after a Host: line; got {text:?}");
    assert!(
        !text.contains("HTTP/1."),
        "answered as HTTP mid-connection: {text:?}"
    );
    assert!(
        text.is_empty() || text.starts_with("-ERR"),
        "unexpected reply {text:?}"
    );
    server.client().cmd(&["PING"]);
}

/// Before AUTH too.
#[test]
fn cross_protocol_before_auth() {
    let mut server = KiteServer::start(&["--requirepass", "pw"], 2);
    expect_closed_after(server.port, b"", b"", b"POST / HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_closed_after(
        server.port,
        b"PING\r\n",
        b"-NOAUTH Authentication required.\r\n",
        b"Host: x\r\n",
    );
    server.assert_alive();
}

/// `GET key` stays a RESP command, inline or as an array; a GET line that does not end in
/// `HTTP/1.x` is RESP too.
#[test]
fn inline_get_is_still_resp() {
    let server = KiteServer::start(&[], 2);
    let mut c = server.client();
    ok(&mut c, &["SET", "k", "v"]);
    let mut raw = Client::connect(server.port);
    raw.send_raw(b"GET k\r\n");
    assert_eq!(raw.read(), Resp::bulk("v"));
    raw.send_raw(b"GET k\r\n");
    assert_eq!(raw.read(), Resp::bulk("v"));
    let mut raw = Client::connect(server.port);
    raw.send_raw(&encode_command(&["GET", "k"]));
    assert_eq!(raw.read(), Resp::bulk("v"));
    let mut raw = Client::connect(server.port);
    raw.send_raw(b"GET k HTTP\r\n");
    let r = raw.read();
    assert!(
        r.error_text().is_some_and(|e| e.starts_with("ERR")),
        "GET k HTTP answered {r}"
    );
    assert_eq!(raw.cmd(&["PING"]), Resp::simple("PONG"));
}

// ---------------------------------------------------------------------------
// Review findings: what a page shows follows the viewer's permissions; DNS rebinding;
// busy scripts; sorted-set pushes; databases in /metrics
// ---------------------------------------------------------------------------

/// /api/state shows another user's queue nowhere (not in INFO's lines either), and
/// the clients and the slow log only to a user who may run CLIENT LIST and SLOWLOG GET.
#[test]
fn http_state_follows_permissions() {
    if skip_kite_only("http_state_follows_permissions") {
        return;
    }
    let server = KiteServer::start(&["--requirepass", "pw"], 2);
    let mut c = server.client();
    ok(
        &mut c,
        &[
            "ACL", "SETUSER", "carol", "on", ">cpw", "~bull:*", "+@all", "-client", "-slowlog",
        ],
    );
    ok(
        &mut c,
        &[
            "ACL", "SETUSER", "dave", "on", ">dpw", "~*", "+@all", "-info",
        ],
    );
    write_bull_and_sidekiq(&mut c);
    ok(&mut c, &["CLIENT", "SETNAME", "secret-client-name"]);
    ok(&mut c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    int(&mut c, &["LPUSH", "slow-secret-key", "x"]);
    let port = server.port;
    let state = get_as(port, "/api/state", "carol", "cpw");
    state.expect_status(200, "carol's /api/state");
    let text = state.text();
    assert!(
        text.contains("bull:emails"),
        "carol sees her queue: {}",
        truncate(&text, 300)
    );
    for hidden in ["queue:default", "secret-client-name", "slow-secret-key"] {
        assert!(!text.contains(hidden), "carol's /api/state shows {hidden}");
    }
    get_as(port, "/metrics", "dave", "dpw").expect_status(403, "dave may not run INFO");
    get_as(port, "/api/state", "dave", "dpw").expect_status(403, "dave may not run INFO");
    get_as(port, "/healthz", "dave", "dpw").expect_status(200, "/healthz needs no INFO");
}

/// A default user that needs no password but may run nothing does not open HTTP.
#[test]
fn http_open_default_user_without_info_must_log_in() {
    if skip_kite_only("http_open_default_user_without_info_must_log_in") {
        return;
    }
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    ok(
        &mut c,
        &["ACL", "SETUSER", "admin", "on", ">apw", "~*", "&*", "+@all"],
    );
    ok(&mut c, &["ACL", "SETUSER", "default", "-@all"]);
    assert_unauthorized(
        &get(server.port, "/metrics"),
        "/metrics as a default user with -@all",
    );
    get_as(server.port, "/metrics", "admin", "apw").expect_status(200, "admin's /metrics");
}

/// Without a password, the dashboard's data answers only requests addressed to an IP
/// address or localhost (a page that rebinds its own name to 127.0.0.1 gets nothing).
#[test]
fn http_open_api_refuses_other_hosts() {
    if skip_kite_only("http_open_api_refuses_other_hosts") {
        return;
    }
    let server = KiteServer::start(&[], 1);
    let request = |host: &str, path: &str| {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        http_raw(server.port, req.as_bytes(), false)
    };
    request("evil.example", "/api/state").expect_status(403, "/api/state for evil.example");
    request("evil.example:6379", "/api/queue?name=x").expect_status(403, "/api/queue");
    let local = format!("127.0.0.1:{}", server.port);
    request(&local, "/api/state").expect_status(200, "/api/state by address");
    request("localhost", "/api/state").expect_status(200, "/api/state for localhost");
    request("evil.example", "/metrics").expect_status(200, "/metrics stays open");
}

/// An HTTP request line that arrives while a script is busy is answered as HTTP once the
/// script ends (not with -BUSY); a POST then is closed, not answered.
#[test]
fn http_during_a_busy_script() {
    if skip_kite_only("http_during_a_busy_script") {
        return;
    }
    let server = KiteServer::start(&["--busy-reply-threshold", "50"], 1);
    let mut c = server.client();
    let port = server.port;
    // Connections made before the script starts, each sending its first line during it.
    let mut http = connect_raw(port);
    let mut post = connect_raw(port);
    let mut killer = server.client();
    // All four connections are known to the server before the script starts.
    wait_for("four clients in CLIENT LIST", || {
        let list = killer
            .cmd(&["CLIENT", "LIST"])
            .as_string()
            .unwrap_or_default();
        (list.lines().count() == 4).then_some(())
    });
    let script = std::thread::spawn(move || {
        c.cmd(&["EVAL", "local i = 0 while true do i = i + 1 end", "0"])
    });
    wait_for("the script to be busy", || {
        let r = killer.cmd(&["PING"]);
        r.error_text()
            .is_some_and(|e| e.starts_with("BUSY"))
            .then_some(())
    });
    http.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    post.write_all(b"POST / HTTP/1.1\r\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let posted = read_to_eof(&mut post, "POST during a busy script");
    assert!(
        posted.is_empty(),
        "POST answered: {:?}",
        String::from_utf8_lossy(&posted)
    );
    let r = killer.cmd(&["SCRIPT", "KILL"]);
    assert_eq!(r, Resp::ok());
    let _ = script.join();
    let raw = read_to_eof(&mut http, "GET during a busy script");
    let reply = parse_http(&raw, "GET /healthz during a busy script", false);
    reply.expect_status(200, "GET /healthz after the script");
    assert_eq!(reply.text(), "ok\n");
}

/// ZADD to a sorted set that is a queue counts as pushes.
#[test]
fn zset_queue_counts_zadd() {
    if skip_kite_only("zset_queue_counts_zadd") {
        return;
    }
    let server = KiteServer::start(&[], 2);
    let mut c = server.client();
    null_reply(&mut c, &["BZPOPMIN", "prio", "0.05"]);
    assert_eq!(
        int(&mut c, &["ZADD", "prio", "1", "a", "2", "b", "3", "c"]),
        3
    );
    assert_eq!(int(&mut c, &["ZADD", "prio", "5", "a"]), 0);
    let _ = c.cmd(&["ZPOPMIN", "prio"]);
    assert_counts(&queue(&mut c, "prio"), 2, 3, 1);
}

/// The same queue name in two databases gives two series in /metrics.
#[test]
fn metrics_tell_databases_apart() {
    if skip_kite_only("metrics_tell_databases_apart") {
        return;
    }
    let server = KiteServer::start(&[], 1);
    let mut c = server.client();
    null_reply(&mut c, &["BLPOP", "same", "0.05"]);
    int(&mut c, &["RPUSH", "same", "a"]);
    ok(&mut c, &["SELECT", "1"]);
    null_reply(&mut c, &["BLPOP", "same", "0.05"]);
    int(&mut c, &["RPUSH", "same", "a", "b"]);
    let text = get(server.port, "/metrics")
        .expect_status(200, "/metrics")
        .text();
    let depth: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("kite_queue_depth{queue=\"same\""))
        .collect();
    assert_eq!(depth.len(), 2, "one series per database: {depth:?}");
    assert!(
        depth
            .iter()
            .any(|l| l.contains("db=\"1\"") && l.ends_with(" 2")),
        "{depth:?}"
    );
}
