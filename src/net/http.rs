//! HTTP on Kite's sockets: `GET /metrics`, `/healthz`, the dashboard and its JSON, on the
//! RESP port (a connection whose first line is an HTTP request line) and on `http-port`.
//!
//! Owns telling HTTP from RESP, reading one request, access (the RESP port's rules:
//! protected mode, and basic auth against ACL users once the default user has a
//! password) and writing the response. It renders nothing itself (`crate::observe`
//! does) and never touches shard data. One request per connection: the response says
//! `Connection: close`, which every scraper and browser handles.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use super::Stream;
use crate::acl::user::User;
use crate::observe;
use crate::shard::Worker;

/// The longest request head read; past it the connection gets 431.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request's head, and to read the answer.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, PartialEq, Eq)]
pub enum Sniff {
    /// The bytes so far could still be an HTTP request line.
    NeedMore,
    Http,
    Resp,
}

/// Whether a connection's first bytes are an HTTP `GET` or `HEAD` request line. A RESP
/// client's inline `GET key` has no ` HTTP/1.x` at its end, and a RESP array starts with
/// `*`, so only a real request line is taken for HTTP. `scanned`: how many bytes an
/// earlier call already found without a newline (a line dripped in is scanned once).
pub fn sniff(buf: &[u8], scanned: usize) -> Sniff {
    let method = [b"GET ".as_slice(), b"HEAD ".as_slice()]
        .into_iter()
        .find(|m| buf[..buf.len().min(m.len())] == m[..buf.len().min(m.len())]);
    let Some(method) = method else {
        return Sniff::Resp;
    };
    if buf.len() < method.len() {
        return Sniff::NeedMore;
    }
    let from = scanned.min(buf.len());
    let nl = buf[from..buf.len().min(MAX_HEAD)]
        .iter()
        .position(|&b| b == b'\n')
        .map(|i| from + i);
    let Some(nl) = nl else {
        return if buf.len() >= MAX_HEAD {
            Sniff::Resp
        } else {
            Sniff::NeedMore
        };
    };
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    if line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0") {
        Sniff::Http
    } else {
        Sniff::Resp
    }
}

struct Request {
    method: String,
    path: String,
    query: String,
    authorization: Option<String>,
    host: Option<String>,
}

fn parse_head(head: &[u8]) -> Option<Request> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n").flat_map(|l| l.split('\n'));
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let target = first.next()?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (mut authorization, mut host) = (None, None);
    for l in lines {
        if let Some((name, value)) = l.split_once(':') {
            let name = name.trim();
            if name.eq_ignore_ascii_case("authorization") {
                authorization = Some(value.trim().to_string());
            } else if name.eq_ignore_ascii_case("host") {
                host = Some(value.trim().to_string());
            }
        }
    }
    Some(Request {
        method,
        path: path.to_string(),
        query: query.to_string(),
        authorization,
        host,
    })
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// `%XX` and `+` in a query value.
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    out
}

fn query_param(query: &str, name: &str) -> Option<Vec<u8>> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| percent_decode(v))
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    extra: &'static str,
}

impl Response {
    fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.as_bytes().to_vec(),
            extra: "",
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// Who is asking: a user whose permissions decide what is shown, or anyone (open
/// metrics).
enum Viewer {
    User(Arc<User>),
    Anyone,
}

impl Viewer {
    /// Whether the viewer may read `key` (a queue's, a framework's).
    fn allows(&self, key: &[u8]) -> bool {
        match self {
            Viewer::User(u) => u.selectors.iter().any(|s| s.key_allowed(key, true, false)),
            Viewer::Anyone => true,
        }
    }

    /// Whether the viewer may run `argv` on the RESP port: what a page shows needs the
    /// permission of the command that shows it there (INFO, CLIENT LIST, SLOWLOG GET).
    fn may(&self, argv: &[&str]) -> bool {
        match self {
            Viewer::Anyone => true,
            Viewer::User(u) => {
                let Some(cmd) = crate::commands::table().lookup(argv[0].as_bytes()) else {
                    return false;
                };
                let args: Vec<bytes::Bytes> = argv
                    .iter()
                    .map(|a| bytes::Bytes::copy_from_slice(a.as_bytes()))
                    .collect();
                u.check(cmd, &args).is_ok()
            }
        }
    }
}

/// What a page may show its viewer beyond the queues its key patterns allow.
pub struct Shown<'a> {
    pub key: &'a dyn Fn(&[u8]) -> bool,
    pub clients: bool,
    pub slowlog: bool,
}

/// Whether `host` (a Host header) names this machine by address or as localhost.
fn host_is_address(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest
            .split(']')
            .next()
            .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

fn access(worker: &Rc<Worker>, req: &Request) -> Result<Viewer, Response> {
    let acl = &worker.shared.acl;
    // The default user, when it needs no password, is who an HTTP client without
    // credentials is, as a RESP client is; one that may not even run INFO must log in.
    if acl.default_open() && req.authorization.is_none() {
        let viewer = Viewer::User(acl.default_user());
        if viewer.may(&["info"]) || req.path == "/healthz" {
            return Ok(viewer);
        }
    }
    let scrape = matches!(req.path.as_str(), "/metrics" | "/healthz");
    if scrape
        && worker
            .shared
            .tunables
            .http_open_metrics
            .load(Ordering::Relaxed)
    {
        return Ok(Viewer::Anyone);
    }
    let denied = Response {
        status: 401,
        content_type: "text/plain; charset=utf-8",
        body: b"Authentication required.\n".to_vec(),
        extra: "WWW-Authenticate: Basic realm=\"kite\", charset=\"UTF-8\"\r\n",
    };
    let credentials = req
        .authorization
        .as_deref()
        .and_then(|a| {
            let (scheme, rest) = a.split_once(' ')?;
            scheme.eq_ignore_ascii_case("basic").then_some(rest)
        })
        .and_then(|b64| base64_decode(b64.trim()));
    let Some(credentials) = credentials else {
        return Err(denied);
    };
    let colon = credentials.iter().position(|&b| b == b':');
    let (name, pass) = match colon {
        Some(i) => (&credentials[..i], &credentials[i + 1..]),
        None => (&credentials[..], &b""[..]),
    };
    let name = if name.is_empty() {
        b"default".as_slice()
    } else {
        name
    };
    match acl.authenticate(name, pass) {
        Some(user) => Ok(Viewer::User(user)),
        None => {
            // In ACL LOG as a failed AUTH, like any other wrong password.
            acl.log_denial(
                crate::acl::Reason::Auth,
                crate::acl::Context::Toplevel,
                b"AUTH",
                &String::from_utf8_lossy(name),
                "http".into(),
                crate::shard::unix_ms(),
            );
            Err(denied)
        }
    }
}

async fn respond(worker: &Rc<Worker>, req: &Request) -> Response {
    if req.method != "GET" && req.method != "HEAD" {
        return Response::text(405, "Only GET and HEAD are served.\n");
    }
    let viewer = match access(worker, req) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let data_path = matches!(req.path.as_str(), "/metrics" | "/api/state" | "/api/queue");
    if data_path && !viewer.may(&["info"]) {
        return Response::text(
            403,
            "This user may not run INFO, which these figures come from.\n",
        );
    }
    // With no password anywhere, a web page could rename its own host to 127.0.0.1 (DNS
    // rebinding) and read the dashboard's data as its own: without credentials, the API
    // answers only requests addressed to an IP address or localhost.
    let open = req.authorization.is_none() && matches!(viewer, Viewer::User(_));
    if open && req.path.starts_with("/api/") && !req.host.as_deref().is_some_and(host_is_address) {
        return Response::text(
            403,
            "Without a password, the dashboard's data is served to requests addressed to an IP address or localhost only (a defence against DNS rebinding). Use the address, or set a password.\n",
        );
    }
    let allows = |k: &[u8]| viewer.allows(k);
    let shown = Shown {
        key: &allows,
        clients: viewer.may(&["client", "list"]),
        slowlog: viewer.may(&["slowlog", "get"]),
    };
    match req.path.as_str() {
        "/" | "/index.html" => Response {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: observe::DASHBOARD_HTML.as_bytes().to_vec(),
            extra: "",
        },
        "/metrics" => Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: observe::prometheus::render(worker, &allows)
                .await
                .into_bytes(),
            extra: "",
        },
        "/healthz" => {
            if worker.shared.persist.loading.load(Ordering::Acquire) {
                Response::text(503, "loading\n")
            } else {
                Response::text(200, "ok\n")
            }
        }
        "/api/state" => Response {
            status: 200,
            content_type: "application/json",
            body: observe::api::state(worker, &shown).await.into_bytes(),
            extra: "",
        },
        "/api/queue" => {
            let name = query_param(&req.query, "name").unwrap_or_default();
            match observe::api::queue(worker, &name, &allows).await {
                Some(json) => Response {
                    status: 200,
                    content_type: "application/json",
                    body: json.into_bytes(),
                    extra: "",
                },
                None => Response::text(404, "No such queue.\n"),
            }
        }
        _ => Response::text(404, "Not found.\n"),
    }
}

/// HTTP connections open now (on both ports): past `MAX_OPEN`, new ones are closed.
static OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const MAX_OPEN: usize = 256;

/// Serves one HTTP request on `stream`, whose first bytes are in `buf`.
pub async fn serve(worker: &Rc<Worker>, stream: &Stream, buf: BytesMut) {
    if OPEN.fetch_add(1, Ordering::AcqRel) >= MAX_OPEN {
        OPEN.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    serve_one(worker, stream, buf).await;
    OPEN.fetch_sub(1, Ordering::AcqRel);
}

async fn serve_one(worker: &Rc<Worker>, stream: &Stream, mut buf: BytesMut) {
    // The whole head must arrive within READ_TIMEOUT, however it is dripped in.
    let head = crate::net::event_loop::time::timeout(READ_TIMEOUT, async {
        // Where the search for the blank line resumes: a head dripped in is scanned once.
        let mut searched = 0;
        loop {
            if let Some(i) = buf[searched..].windows(4).position(|w| w == b"\r\n\r\n") {
                return Some(Some(searched + i));
            }
            searched = buf.len().saturating_sub(3);
            if buf.len() > MAX_HEAD {
                return Some(None);
            }
            match stream.read_some(&mut buf).await {
                Ok(n) if n > 0 => {}
                _ => return None,
            }
        }
    })
    .await;
    let head_end = match head {
        Ok(Some(h)) => h,
        _ => return,
    };
    let head_only;
    let response = match head_end.map(|i| parse_head(&buf[..i])) {
        None => {
            head_only = false;
            Response::text(431, "Request head too large.\n")
        }
        Some(None) => {
            head_only = false;
            Response::text(400, "Bad request.\n")
        }
        Some(Some(req)) => {
            head_only = req.method == "HEAD";
            respond(worker, &req).await
        }
    };
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n{}Connection: close\r\n\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len(),
        response.extra
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(&response.body);
    }
    worker.shard.borrow_mut().stats.net_output_bytes += out.len() as u64;
    // A client that does not read its answer is dropped.
    let _ = crate::net::event_loop::time::timeout(WRITE_TIMEOUT, stream.write_all(&out)).await;
}

/// A connection accepted on `http-port`.
pub fn accept(worker: &Rc<Worker>, tcp: std::net::TcpStream) {
    let shared = &worker.shared;
    if shared.tunables.protected_mode.load(Ordering::Relaxed)
        && shared.acl.default_user().nopass
        && !tcp.peer_addr().is_ok_and(|a| a.ip().is_loopback())
    {
        let mut s = tcp;
        let body = "Protected mode: no password is set for the default user, so only loopback clients are served.\n";
        let _ = std::io::Write::write_all(
            &mut s,
            format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        return;
    }
    let _ = tcp.set_nonblocking(true);
    let Ok(tcp) = crate::net::event_loop::Socket::from_std(tcp) else {
        return;
    };
    let worker = worker.clone();
    crate::net::event_loop::spawn_local(async move {
        let stream = Stream::plain(tcp);
        serve(&worker, &stream, BytesMut::with_capacity(4096)).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_http_from_resp() {
        assert_eq!(
            sniff(b"GET /metrics HTTP/1.1\r\nHost: x\r\n", 0),
            Sniff::Http
        );
        assert_eq!(sniff(b"HEAD / HTTP/1.0\r\n", 0), Sniff::Http);
        assert_eq!(sniff(b"GET /metr", 0), Sniff::NeedMore);
        assert_eq!(sniff(b"GE", 0), Sniff::NeedMore);
        assert_eq!(sniff(b"GET key\r\n", 0), Sniff::Resp);
        assert_eq!(sniff(b"*1\r\n$4\r\nPING\r\n", 0), Sniff::Resp);
        assert_eq!(sniff(b"PING\r\n", 0), Sniff::Resp);
        assert_eq!(sniff(b"GETSET a b\r\n", 0), Sniff::Resp);
        // Resuming after bytes already scanned finds the same line.
        assert_eq!(sniff(b"GET /metrics HTTP/1.1\r\n", 9), Sniff::Http);
    }

    #[test]
    fn hosts_by_address() {
        for h in [
            "127.0.0.1:6379",
            "localhost:6379",
            "LOCALHOST",
            "[::1]:6379",
            "10.0.0.5",
        ] {
            assert!(host_is_address(h), "{h}");
        }
        for h in ["evil.example:6379", "kite", "[nope]:1"] {
            assert!(!host_is_address(h), "{h}");
        }
    }

    #[test]
    fn decodes() {
        assert_eq!(base64_decode("ZGVmYXVsdDpwdw==").unwrap(), b"default:pw");
        assert_eq!(percent_decode("bull%3Aemails+x"), b"bull:emails x");
        assert_eq!(percent_decode("100%"), b"100%");
    }
}
