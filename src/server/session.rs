//! The state of one client connection, as command handlers see it.

use std::rc::Rc;

use bytes::Bytes;

use crate::commands::transactions::{MultiState, WatchState};
use crate::commands::Command;
use crate::protocol::reply::Reply;
use crate::shard::clients::ClientHandle;
use crate::shard::Worker;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReplyMode {
    On,
    Off,
    /// Skip the reply of the next command only.
    SkipNext,
    /// Skipping the reply of the current command.
    Skipping,
}

pub struct Session {
    pub worker: Rc<Worker>,
    pub id: u64,
    pub db: usize,
    pub out: Reply,
    pub authenticated: bool,
    /// The ACL user this connection runs as, and the ACL version it was looked up at.
    pub user: std::sync::Arc<crate::acl::User>,
    pub acl_version: u64,
    pub no_touch: bool,
    pub multi: Option<MultiState>,
    pub watching: Option<WatchState>,
    /// Running the commands of EXEC, whose transaction already holds every lock needed.
    pub in_exec: bool,
    pub reply_mode: ReplyMode,
    /// Close once the pending replies are written (QUIT, protocol errors).
    pub close_after_reply: bool,
    pub handle: Rc<ClientHandle>,
    /// The shard the recent keyed commands went to, and how many in a row.
    pub affinity: (usize, u32),
    /// The route the connection loop already found for the command it is running (by
    /// the command's table entry), so the key is not hashed again to run it.
    pub route_hint: Option<(&'static crate::commands::Command, crate::commands::Route)>,
    /// Messages pushed to this connection outside request/reply: MONITOR lines and
    /// Pub/Sub messages, already encoded.
    pub push_rx: Option<tokio::sync::mpsc::UnboundedReceiver<Bytes>>,
    pub push_tx: Option<tokio::sync::mpsc::UnboundedSender<Bytes>>,
    /// Bytes of Pub/Sub messages queued on `push_rx` and not yet written (the pubsub
    /// class of `client-output-buffer-limit` counts them).
    pub push_queued: Rc<std::cell::Cell<usize>>,
    /// When the reply buffer went past the normal class's soft limit (unix ms).
    pub obuf_soft_since: std::cell::Cell<Option<u64>>,
    pub monitoring: bool,
    /// Pub/Sub channels and patterns this connection is subscribed to, in subscription
    /// order (UNSUBSCRIBE without arguments answers in that order).
    pub channels: Vec<Bytes>,
    pub patterns: Vec<Bytes>,
    /// Shard channels (SSUBSCRIBE), counted apart from the others as Redis counts them.
    pub shard_channels: Vec<Bytes>,
    /// Output bytes written to the socket while a command ran (a blocking command sends
    /// the replies before it before it parks).
    pub flushed_mid_command: usize,
    /// Effects of a global command run inside EXEC (FLUSHALL, a script...), for the
    /// transaction's AOF block.
    pub aof_pending: Vec<crate::persist::aof::Piece>,
    /// Commands run since the replies were last written, and whether one of them may
    /// have written (the write barrier of `appendfsync always`).
    pub unflushed_replies: usize,
    pub unflushed_write: bool,
    /// Argument vectors of commands already run, emptied, for the parser's next
    /// requests: a command's vector is then not allocated and freed per request.
    pub spare_args: crate::protocol::parse::SpareArgs,
    /// The AOF replay at start-up, or a replica applying its master's stream: runs
    /// while clients get -LOADING, may write on a read-only replica, never blocks.
    pub replaying: bool,
    /// What a replica said with REPLCONF before PSYNC.
    pub replconf: Option<Box<crate::repl::master::ReplConf>>,
    /// WAIT's reference: whether a command that may write ran since the last WAIT, and
    /// the stream offset that covered this connection's writes then.
    pub wrote_since_wait: bool,
    pub write_offset: u64,
    /// CLIENT TRACKING is on (its modes live in the thread's registry), and CLIENT
    /// CACHING was given for the next command or transaction.
    pub tracking: bool,
    pub caching: bool,
    /// Output that goes out whatever CLIENT REPLY says (subscription confirmations).
    pub forced: Vec<u8>,
    /// Time the running command spent blocked on keys: not execution time (INFO
    /// commandstats and the slow log count only the time a command ran, as Redis 7 does).
    pub blocked_us: u64,
    /// Set by a command whose work ran partly on other threads (a script run where its
    /// key lives): that work's run time there. The command then counts its own run time
    /// here plus this, and not the time it spent waiting for the other thread.
    pub away_us: Option<u64>,
    /// The key set of this connection's last blocked call, by shard: a consumer that
    /// blocks on it again (Sidekiq, shuffled) skips placing each key.
    pub last_block: Option<Box<crate::blocking::LastBlock>>,
    /// Cluster mode: ASKING was sent (the next command, or the transaction, may use an
    /// importing slot), and READONLY (reads of the master's slots served on a replica).
    pub asking: bool,
    pub readonly: bool,
}

/// The part of a connection's state that goes with it when it moves to another thread:
/// what earlier commands chose (SELECT, HELLO, AUTH, CLIENT NO-TOUCH, CLIENT REPLY,
/// READONLY, ASKING) and what WAIT measures from. Nothing in it belongs to one thread.
pub struct Carried {
    pub db: usize,
    pub resp3: bool,
    pub authenticated: bool,
    pub user: std::sync::Arc<crate::acl::User>,
    pub acl_version: u64,
    pub no_touch: bool,
    pub reply_mode: ReplyMode,
    pub readonly: bool,
    pub asking: bool,
    /// WAIT's reference (`Session::wrote_since_wait`, `write_offset`): writes made on the
    /// old thread still count.
    pub wrote_since_wait: bool,
    pub write_offset: u64,
}

impl Carried {
    /// A new connection's: database 0, RESP2, the default user.
    pub fn fresh(shared: &crate::shard::Shared) -> Carried {
        Carried {
            db: 0,
            resp3: false,
            acl_version: shared.acl.version(),
            authenticated: shared.acl.default_open(),
            user: shared.acl.default_user(),
            no_touch: false,
            reply_mode: ReplyMode::On,
            readonly: false,
            asking: false,
            wrote_since_wait: false,
            write_offset: 0,
        }
    }
}

impl Session {
    /// `client-query-buffer-limit`: input a client may have waiting before it is closed
    /// (its own buffer, or what is held while a command of its waits).
    pub fn query_buffer_limit(&self) -> usize {
        self.worker
            .shared
            .tunables
            .query_buffer_limit
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The state of a client connection arriving on this thread, new or moved.
    pub fn open(worker: &Rc<Worker>, id: u64, handle: Rc<ClientHandle>, c: Carried) -> Session {
        Session {
            worker: worker.clone(),
            id,
            db: c.db,
            out: Reply::with_buf(bytes::BytesMut::with_capacity(16 * 1024), c.resp3),
            authenticated: c.authenticated,
            user: c.user,
            acl_version: c.acl_version,
            no_touch: c.no_touch,
            multi: None,
            watching: None,
            in_exec: false,
            reply_mode: c.reply_mode,
            close_after_reply: false,
            handle,
            affinity: (worker.id, 0),
            route_hint: None,
            push_rx: None,
            push_tx: None,
            push_queued: Default::default(),
            obuf_soft_since: Default::default(),
            monitoring: false,
            channels: Vec::new(),
            shard_channels: Vec::new(),
            patterns: Vec::new(),
            flushed_mid_command: 0,
            aof_pending: Vec::new(),
            unflushed_replies: 0,
            unflushed_write: false,
            spare_args: Default::default(),
            replaying: false,
            replconf: None,
            wrote_since_wait: c.wrote_since_wait,
            write_offset: c.write_offset,
            tracking: false,
            caching: false,
            forced: Vec::new(),
            blocked_us: 0,
            away_us: None,
            last_block: None,
            asking: c.asking,
            readonly: c.readonly,
        }
    }

    /// How a batch of this connection's commands runs on another shard, outside a
    /// transaction; `reader` is its CLIENT TRACKING state where that is wanted.
    pub fn batch_spec(&self, reader: Option<crate::tracking::Reader>) -> crate::shard::BatchSpec {
        crate::shard::BatchSpec {
            db: self.db,
            resp3: self.out.resp3,
            client_id: self.id,
            no_touch: self.no_touch,
            atomic: None,
            reader,
            whole: false,
        }
    }

    /// What goes with the connection if it moves to another thread.
    pub fn carried(&self) -> Carried {
        Carried {
            db: self.db,
            resp3: self.out.resp3,
            authenticated: self.authenticated,
            user: self.user.clone(),
            acl_version: self.acl_version,
            no_touch: self.no_touch,
            reply_mode: self.reply_mode,
            readonly: self.readonly,
            asking: self.asking,
            wrote_since_wait: self.wrote_since_wait,
            write_offset: self.write_offset,
        }
    }

    /// Ends a connection that closes here (not one that moves): its watches, tracking,
    /// MONITOR and subscriptions go, and it stops counting against `maxclients`.
    pub fn close(&mut self) {
        crate::commands::transactions::unwatch_all(self);
        crate::commands::connection::disable_tracking(self);
        crate::commands::connection::stop_monitor(self);
        crate::commands::pubsub::unsubscribe_all(self);
        self.worker
            .shared
            .connected_clients
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// A session with no client behind it (the AOF replay).
    pub fn detached(worker: &Rc<Worker>, id: u64) -> Session {
        use crate::shard::clients::{ClientHandle, ClientInfo};
        let handle = ClientHandle::new(ClientInfo::new(id, "aof".into(), String::new(), -1));
        let carried = Carried {
            authenticated: true,
            user: std::sync::Arc::new(crate::acl::User::default_user()),
            // Never the ACL's version: the replay's user is not looked up again.
            acl_version: u64::MAX,
            ..Carried::fresh(&worker.shared)
        };
        Session {
            // No client reads its replies: no room kept for them.
            out: Reply::new(false),
            ..Session::open(worker, id, handle, carried)
        }
    }

    /// Replies an error for a command refused before it ran; inside MULTI it also makes
    /// EXEC fail, as Redis does for errors found while queueing.
    pub fn reject(&mut self, msg: &str) {
        self.reject_bytes(msg.as_bytes());
    }

    pub fn reject_bytes(&mut self, msg: &[u8]) {
        self.out.error_bytes(msg);
        let mut shard = self.worker.shard.borrow_mut();
        let start = self.out.buf.len() - msg.len() - 3;
        shard.stats.record_error(&self.out.buf[start..]);
        if let Some(m) = &mut self.multi {
            m.aborted = true;
        }
    }

    /// Replies an error produced while a command ran.
    pub fn error(&mut self, msg: &str) {
        self.out.error(msg);
    }

    pub fn count_rejected(&mut self, cmd: &Command) {
        self.worker.shard.borrow_mut().stats.commands[cmd.id].rejected += 1;
    }

    pub fn note_command(&mut self, cmd: &'static Command, args: &[Bytes]) {
        // Only a container (CLIENT, CONFIG...) shows a subcommand: nothing to look up
        // for the rest.
        let name = if cmd.subcommands.is_empty() {
            cmd.name
        } else {
            crate::commands::table().display_name(cmd, args)
        };
        self.handle.info.borrow_mut().last_cmd = name;
    }

    pub fn over_maxmemory(&self) -> bool {
        self.worker.shared.over_maxmemory()
    }

    /// Counts a command that ran on this thread (connection and cross-shard commands).
    pub fn record_here(
        &mut self,
        cmd: &Command,
        args: &[Bytes],
        start: crate::clock::Stopwatch,
        mark: usize,
    ) {
        let usec = start
            .elapsed_us()
            .saturating_sub(std::mem::take(&mut self.blocked_us));
        self.record_run(cmd, args, usec, mark);
    }

    /// Counts a command that ran for `usec`, however that was measured.
    pub fn record_run(&mut self, cmd: &Command, args: &[Bytes], usec: u64, mark: usize) {
        self.blocked_us = 0;
        let mut shard = self.worker.shard.borrow_mut();
        let handle = &self.handle;
        shard.log_if_slow(cmd, args, usec, || {
            let info = handle.info.borrow();
            (info.addr.clone(), info.name.clone())
        });
        let st = &mut shard.stats;
        st.total_commands += 1;
        let c = &mut st.commands[cmd.id];
        c.record(usec);
        if self.out.buf.get(mark) == Some(&b'-') {
            c.failed += 1;
            st.record_error(&self.out.buf[mark..]);
        }
    }

    /// What a shard running this connection's command needs for CLIENT TRACKING.
    #[inline]
    pub fn reader(&self) -> Option<crate::tracking::Reader> {
        if !self.tracking {
            return None;
        }
        let clients = self.worker.clients.borrow();
        let t = clients.trackers.get(&self.id)?;
        Some(crate::tracking::Reader {
            id: self.id,
            thread: self.worker.id,
            noloop: t.noloop,
            remember: !(t.bcast || (t.optin && !self.caching) || (t.optout && self.caching)),
        })
    }

    /// The channel for pushed messages, created on first use.
    pub fn push_sender(&mut self) -> tokio::sync::mpsc::UnboundedSender<Bytes> {
        if let Some(tx) = &self.push_tx {
            return tx.clone();
        }
        if let Some(rx) = self.handle.adopt_rx.borrow_mut().take() {
            if let Some(tx) = self.handle.push.borrow().clone() {
                self.push_tx = Some(tx.clone());
                self.push_rx = Some(rx);
                return tx;
            }
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.push_tx = Some(tx.clone());
        self.push_rx = Some(rx);
        *self.handle.push.borrow_mut() = Some(tx.clone());
        tx
    }

    /// Every subscription, shard channels included (what puts a RESP2 connection in
    /// subscribed mode).
    pub fn subscriptions(&self) -> usize {
        self.channels.len() + self.patterns.len() + self.shard_channels.len()
    }

    pub fn set_db(&mut self, db: usize) {
        self.db = db;
        self.handle.info.borrow_mut().db = db;
    }
}
