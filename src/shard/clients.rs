//! The clients connected to one thread: what CLIENT LIST/INFO/KILL and INFO read.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use hashbrown::HashMap;
use tokio::sync::Notify;

pub use crate::net::notify::LocalNotify;
use crate::shard::unix_ms;

/// What is known about a client, printed by CLIENT LIST/INFO. Plain data, so it can move
/// with its connection to another thread.
#[derive(Clone, Debug)]
pub struct ClientInfo {
    pub id: u64,
    pub addr: String,
    pub laddr: String,
    pub fd: i32,
    pub name: Vec<u8>,
    pub lib_name: Vec<u8>,
    pub lib_ver: Vec<u8>,
    pub created_unix_ms: u64,
    pub last_interaction_unix_ms: u64,
    pub db: usize,
    pub resp: u8,
    pub multi: i64,
    pub watch: usize,
    pub last_cmd: &'static str,
    pub no_evict: bool,
    pub no_touch: bool,
    pub monitor: bool,
    pub blocked: bool,
    pub sub: usize,
    pub psub: usize,
    pub ssub: usize,
    pub user: std::sync::Arc<str>,
    /// KIND_NORMAL, or a replication link (CLIENT LIST flags S and M, CLIENT KILL TYPE).
    pub kind: u8,
    /// CLIENT TRACKING: on (flag t), BCAST (B), broken redirect (R), and the redirect
    /// (`redir=`: -1 when off).
    pub tracking: bool,
    pub tracking_bcast: bool,
    pub tracking_broken: bool,
    pub redir: i64,
    /// Bytes of the request being run (Redis reports them as `qbuf` to the client
    /// asking, whose query buffer still holds them).
    pub qbuf: usize,
}

/// Redis keeps a client's replies in a 16 KB buffer, then in a list of blocks of that
/// size; CLIENT LIST's obl, oll and omem describe them. Kite's replies are one buffer, shown
/// the same way so that tools comparing omem across clients find slow readers.
const REPLY_CHUNK: usize = 16 * 1024;

pub const KIND_NORMAL: u8 = 0;
pub const KIND_REPLICA: u8 = 1;
pub const KIND_MASTER: u8 = 2;

impl ClientInfo {
    pub fn new(id: u64, addr: String, laddr: String, fd: i32) -> ClientInfo {
        let now = unix_ms();
        ClientInfo {
            id,
            addr,
            laddr,
            fd,
            name: Vec::new(),
            lib_name: Vec::new(),
            lib_ver: Vec::new(),
            created_unix_ms: now,
            last_interaction_unix_ms: now,
            db: 0,
            resp: 2,
            multi: -1,
            watch: 0,
            last_cmd: "NULL",
            no_evict: false,
            no_touch: false,
            monitor: false,
            blocked: false,
            sub: 0,
            psub: 0,
            ssub: 0,
            user: "default".into(),
            kind: KIND_NORMAL,
            tracking: false,
            tracking_bcast: false,
            tracking_broken: false,
            redir: -1,
            qbuf: 0,
        }
    }

    /// One line of CLIENT LIST, with Redis 7.2's fields in Redis's order; `out_pending` and
    /// `memory` are the handle's (`ClientHandle::line` passes them).
    fn line(&self, now_ms: u64, out_pending: usize, memory: usize) -> String {
        let age = now_ms.saturating_sub(self.created_unix_ms) / 1000;
        let idle = now_ms.saturating_sub(self.last_interaction_unix_ms) / 1000;
        let mut flags = String::new();
        match self.kind {
            KIND_REPLICA => flags.push('S'),
            KIND_MASTER => flags.push('M'),
            _ => {}
        }
        if self.monitor {
            flags.push('O');
        }
        if self.sub + self.psub + self.ssub > 0 {
            flags.push('P');
        }
        if self.multi >= 0 {
            flags.push('x');
        }
        if self.blocked {
            flags.push('b');
        }
        if self.tracking {
            flags.push('t');
        }
        if self.tracking_broken {
            flags.push('R');
        }
        if self.tracking_bcast {
            flags.push('B');
        }
        if self.no_evict {
            flags.push('e');
        }
        if self.no_touch {
            flags.push('T');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        let obl = out_pending.min(REPLY_CHUNK);
        format!(
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db={} sub={} psub={} ssub={} multi={} qbuf={} qbuf-free={} argv-mem=0 multi-mem=0 rbs=1024 rbp=0 obl={} oll={} omem={} tot-mem={} events=r cmd={} user={} redir={} resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            String::from_utf8_lossy(&self.name),
            age,
            idle,
            flags,
            self.db,
            self.sub,
            self.psub,
            self.ssub,
            self.multi,
            self.qbuf,
            if self.qbuf > 0 { 20474 - self.qbuf.min(20474) } else { 0 },
            obl,
            (out_pending - obl).div_ceil(REPLY_CHUNK),
            out_pending - obl,
            memory.max(out_pending),
            self.last_cmd,
            self.user,
            self.redir,
            self.resp,
            String::from_utf8_lossy(&self.lib_name),
            String::from_utf8_lossy(&self.lib_ver),
        )
    }
}

/// A live connection as its thread's registry sees it.
pub struct ClientHandle {
    pub info: RefCell<ClientInfo>,
    /// Set by CLIENT KILL (or the idle timeout); the connection closes at its next chance.
    pub killed: Cell<bool>,
    pub wake: LocalNotify,
    /// Unix ms of the last command (the idle timeout's clock).
    pub last_active: Cell<u64>,
    /// Waiting in a blocking command.
    pub blocked: Cell<bool>,
    /// Set by CLIENT UNBLOCK: Some(true) to fail with an error, Some(false) to time out.
    pub unblock: Cell<Option<bool>>,
    /// The error to fail with instead of CLIENT UNBLOCK's (cluster mode: the blocked
    /// key's slot moved to another node).
    pub unblock_error: RefCell<Option<String>>,
    /// Cluster mode: the slot of the first key a blocked call waits on, and whether a
    /// replica may keep serving it (a READONLY connection's read).
    pub blocked_slot: Cell<Option<(u16, bool)>>,
    /// Waiting for a request with nothing buffered: a busy script's hook may answer it
    /// (`scripting::busy`).
    pub idle_read: Cell<bool>,
    /// The connection's first line was RESP, not an HTTP request line: the hook may
    /// answer what it reads (an HTTP request waits for the connection loop).
    pub resp_confirmed: Cell<bool>,
    /// What that hook read but did not answer (an unfinished request), what it could
    /// not send, and whether either holds anything.
    pub hook_in: RefCell<bytes::BytesMut>,
    pub hook_out: RefCell<Vec<u8>>,
    pub hook_touched: Cell<bool>,
    /// Bytes this connection's buffers hold (input, replies, queued messages), as of its
    /// last pass: what `maxmemory-clients` counts, and CLIENT LIST's tot-mem.
    pub memory: Cell<usize>,
    /// Reply bytes made but not yet taken by the socket, as of the last pass or of the
    /// write the connection waits in (CLIENT LIST's obl, oll and omem).
    pub out_pending: Cell<usize>,
    /// The connection's push channel, once it has one (a CLIENT TRACKING redirect
    /// target is pushed to through it), and a receiver made for it by another
    /// connection that the session takes over at its next pass.
    pub push: RefCell<Option<tokio::sync::mpsc::UnboundedSender<bytes::Bytes>>>,
    pub adopt_rx: RefCell<Option<tokio::sync::mpsc::UnboundedReceiver<bytes::Bytes>>>,
}

impl ClientHandle {
    /// This connection's line of CLIENT LIST.
    pub fn line(&self, now_ms: u64) -> String {
        self.info
            .borrow()
            .line(now_ms, self.out_pending.get(), self.memory.get())
    }

    pub fn new(info: ClientInfo) -> Rc<ClientHandle> {
        Rc::new(ClientHandle {
            info: RefCell::new(info),
            killed: Cell::new(false),
            wake: LocalNotify::default(),
            last_active: Cell::new(unix_ms()),
            blocked: Cell::new(false),
            unblock: Cell::new(None),
            unblock_error: RefCell::new(None),
            blocked_slot: Cell::new(None),
            idle_read: Cell::new(false),
            resp_confirmed: Cell::new(false),
            hook_in: RefCell::new(bytes::BytesMut::new()),
            hook_out: RefCell::new(Vec::new()),
            hook_touched: Cell::new(false),
            memory: Cell::new(0),
            out_pending: Cell::new(0),
            push: RefCell::new(None),
            adopt_rx: RefCell::new(None),
        })
    }

    pub fn kill(&self) {
        self.killed.set(true);
        self.wake.notify_one();
    }
}

/// CLIENT PAUSE state, kept by every thread (set by a broadcast).
#[derive(Clone, Copy, Default)]
pub struct Pause {
    pub until_unix_ms: u64,
    /// True for `WRITE` pauses, false for `ALL`.
    pub writes_only: bool,
}

#[derive(Default)]
pub struct Clients {
    pub map: HashMap<u64, Rc<ClientHandle>>,
    /// Connections of this thread in MONITOR mode, fed by every thread.
    pub monitors: Vec<(u64, tokio::sync::mpsc::UnboundedSender<bytes::Bytes>)>,
    pub pause: Pause,
    pub pause_notify: Rc<Notify>,
    /// Connections of this thread waiting in a blocking command (INFO blocked_clients).
    pub blocked: usize,
    pub pubsub: crate::pubsub::Registry,
    /// Connections of this thread with CLIENT TRACKING on.
    pub trackers: HashMap<u64, crate::tracking::Tracker>,
}

impl Clients {
    pub fn add(&mut self, handle: Rc<ClientHandle>) {
        let id = handle.info.borrow().id;
        self.map.insert(id, handle);
    }

    pub fn remove(&mut self, id: u64) -> Option<Rc<ClientHandle>> {
        self.map.remove(&id)
    }
}
