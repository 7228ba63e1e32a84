//! The replication stream, kept by the AOF writer thread: the one place that sees every
//! effect in the server's order. It turns pieces into the stream (SELECT where the
//! database changes, PING every `repl-ping-replica-period`), keeps the backlog and the
//! offset, and queues the bytes for each attached replica. On a replica it passes on the
//! master's bytes verbatim instead, so chained replicas share the master's offsets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::backlog::Backlog;
use super::{random_id, ReplicaEntry};
use crate::persist::aof::effects::{encode, select_bytes, Piece};
use crate::shard::Shared;

/// A replica's queue: what the writer hands it, and how much is waiting to be sent.
pub struct Feed {
    pub entry: Arc<ReplicaEntry>,
    pub tx: mpsc::UnboundedSender<Bytes>,
    pub queued: Arc<AtomicU64>,
    /// Set when the stream drops this replica (past its output buffer limit), so its
    /// task stops even while a write to the replica is stuck.
    pub dropped: Arc<std::sync::atomic::AtomicBool>,
    soft_since: Option<Instant>,
}

/// The feed task's side of a replica's queue.
pub struct FeedEnd {
    pub rx: mpsc::UnboundedReceiver<Bytes>,
    pub queued: Arc<AtomicU64>,
    pub dropped: Arc<std::sync::atomic::AtomicBool>,
}

impl Feed {
    pub fn new(entry: Arc<ReplicaEntry>) -> (Feed, FeedEnd) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        (
            Feed {
                entry,
                tx,
                queued: queued.clone(),
                dropped: dropped.clone(),
                soft_since: None,
            },
            FeedEnd {
                rx,
                queued,
                dropped,
            },
        )
    }

    fn send(&self, b: Bytes) -> bool {
        self.queued.fetch_add(b.len() as u64, Ordering::Relaxed);
        self.tx.send(b).is_ok()
    }
}

/// Where a full sync's RDB starts in the stream.
pub struct Attached {
    pub replid: String,
    pub offset: u64,
    /// The database the stream is in at that point (the RDB's `repl-stream-db`).
    pub stream_db: usize,
}

pub enum ReplMsg {
    /// A full sync's cut: the replica gets every byte after this point.
    Attach {
        feed: Feed,
        reply: std::sync::mpsc::Sender<Attached>,
    },
    /// PSYNC: continue from offset `from` of history `replid` if the backlog holds it.
    /// Answers the id to announce, or gives the feed back (a full sync is needed).
    Continue {
        replid: String,
        from: u64,
        feed: Feed,
        reply: oneshot::Sender<Result<String, Feed>>,
    },
    /// The offset after everything handed over before this message (WAIT).
    Offset(oneshot::Sender<u64>),
    /// Asks every replica for an ACK now (WAIT).
    GetAck,
    /// A PUBLISH, for replicas' subscribers (the stream only, not the AOF).
    Publish(Vec<u8>),
    /// A replica's master sent these bytes, now applied (`db`: the database the stream is
    /// in after them).
    Upstream { bytes: Bytes, db: usize },
    /// This server loaded its master's dataset at `offset` of `replid` (a full sync), and
    /// the stream goes on in database `db`.
    Follow {
        replid: String,
        offset: u64,
        db: usize,
    },
    /// The master accepted a partial resync under `replid` (a new id when it was
    /// promoted): the stream goes on from where this server's dataset stands.
    Resumed { replid: String },
    /// REPLICAOF NO ONE: a new history starts here; replicas may continue under the old id.
    Promote { done: oneshot::Sender<()> },
    /// A replica's link ended.
    Detach(u64),
}

pub struct Stream {
    shared: Arc<Shared>,
    backlog: Option<Backlog>,
    /// The database the stream is in; None when the next piece must SELECT.
    db: Option<usize>,
    pending: Vec<u8>,
    feeds: Vec<Feed>,
    /// This server is a replica: the stream is its master's bytes.
    upstream: bool,
    last_ping: Instant,
    /// When the last replica left (the backlog's time to live counts from there).
    alone_since: Option<Instant>,
}

impl Stream {
    pub fn new(shared: Arc<Shared>) -> Stream {
        Stream {
            shared,
            backlog: None,
            db: None,
            pending: Vec::new(),
            feeds: Vec::new(),
            upstream: false,
            last_ping: Instant::now(),
            alone_since: None,
        }
    }

    fn offset(&self) -> u64 {
        match &self.backlog {
            Some(b) => b.first() + b.histlen() - 1 + self.pending.len() as u64,
            None => self.shared.repl.offset.load(Ordering::Relaxed),
        }
    }

    /// A piece of effects from the shards.
    pub fn piece(&mut self, p: &Piece) {
        if self.backlog.is_none() || self.upstream || p.bytes.is_empty() {
            return;
        }
        if self.db != Some(p.start_db) {
            self.pending.extend_from_slice(&select_bytes(p.start_db));
        }
        self.pending.extend_from_slice(&p.bytes);
        self.db = Some(p.end_db);
    }

    fn ensure_backlog(&mut self) {
        if self.backlog.is_none() {
            let size = self.shared.repl.backlog_size.load(Ordering::Relaxed) as usize;
            let offset = self.shared.repl.offset.load(Ordering::Relaxed);
            self.backlog = Some(Backlog::new(size, offset));
            self.db = None;
            self.shared.persist.aof.repl.store(true, Ordering::Release);
            self.shared
                .repl
                .backlog_active
                .store(true, Ordering::Relaxed);
            self.publish();
        }
    }

    fn set_ids(&self, f: impl FnOnce(&mut super::Ids)) {
        f(&mut self.shared.repl.ids.lock().expect("repl ids lock"));
    }

    fn drop_feeds(&mut self, why: &str) {
        for f in self.feeds.drain(..) {
            tracing::info!(
                "Dropping the link of replica {}:{}: {why}",
                f.entry.ip,
                f.entry.port.load(Ordering::Relaxed)
            );
        }
    }

    pub fn handle(&mut self, m: ReplMsg) {
        match m {
            ReplMsg::Attach { feed, reply } => {
                self.flush();
                self.ensure_backlog();
                if !self.upstream {
                    // The replica's client starts in database 0 of its own choosing:
                    // the next piece says which one it is in.
                    self.db = None;
                }
                let ids = self.shared.repl.ids();
                let _ = reply.send(Attached {
                    replid: ids.replid,
                    offset: self.offset(),
                    stream_db: self.db.unwrap_or(0),
                });
                self.feeds.push(feed);
                self.alone_since = None;
            }
            ReplMsg::Continue {
                replid,
                from,
                feed,
                reply,
            } => {
                self.flush();
                let ids = self.shared.repl.ids();
                let known = replid == ids.replid
                    || (replid == ids.replid2 && (from as i64) <= ids.second_offset);
                let data = if known {
                    self.backlog.as_ref().and_then(|b| b.since(from))
                } else {
                    None
                };
                match data {
                    Some(bytes) => {
                        if !bytes.is_empty() {
                            feed.send(Bytes::from(bytes));
                        }
                        self.feeds.push(feed);
                        self.alone_since = None;
                        let _ = reply.send(Ok(ids.replid));
                    }
                    None => {
                        let _ = reply.send(Err(feed));
                    }
                }
            }
            ReplMsg::Offset(reply) => {
                let _ = reply.send(self.offset());
            }
            ReplMsg::GetAck => {
                if self.backlog.is_some() && !self.upstream && !self.feeds.is_empty() {
                    encode(
                        &mut self.pending,
                        &[b"REPLCONF".as_slice(), b"GETACK", b"*"],
                    );
                }
            }
            ReplMsg::Publish(bytes) => {
                if self.backlog.is_some() && !self.upstream {
                    self.pending.extend_from_slice(&bytes);
                }
            }
            ReplMsg::Upstream { bytes, db } => {
                if self.upstream {
                    self.ensure_backlog();
                    self.pending.extend_from_slice(&bytes);
                    self.db = Some(db);
                }
            }
            ReplMsg::Follow { replid, offset, db } => {
                self.flush();
                self.drop_feeds("its master did a full resync");
                let size = self.shared.repl.backlog_size.load(Ordering::Relaxed) as usize;
                self.backlog = Some(Backlog::new(size, offset));
                self.shared.repl.offset.store(offset, Ordering::Relaxed);
                self.shared.persist.aof.repl.store(true, Ordering::Release);
                self.shared
                    .repl
                    .backlog_active
                    .store(true, Ordering::Relaxed);
                self.upstream = true;
                self.db = Some(db);
                self.set_ids(|ids| {
                    ids.replid = replid;
                    ids.replid2 = "0".repeat(40);
                    ids.second_offset = -1;
                });
                self.publish();
            }
            ReplMsg::Resumed { replid } => {
                self.flush();
                self.ensure_backlog();
                self.upstream = true;
                let ids = self.shared.repl.ids();
                if replid != ids.replid {
                    self.drop_feeds("its master's replication id changed");
                    let next = self.offset() + 1;
                    self.set_ids(|ids| {
                        ids.replid2 = std::mem::replace(&mut ids.replid, replid);
                        ids.second_offset = next as i64;
                    });
                }
            }
            ReplMsg::Promote { done } => {
                self.flush();
                self.ensure_backlog();
                // Replicas learn the new id by reconnecting; the old one lets them continue.
                self.drop_feeds("this server stopped being a replica");
                let next = self.offset() + 1;
                self.set_ids(|ids| {
                    ids.replid2 = std::mem::replace(&mut ids.replid, random_id());
                    ids.second_offset = next as i64;
                });
                self.upstream = false;
                self.db = None;
                // The backlog's time to live starts now, not when the last replica left.
                self.alone_since = None;
                let _ = done.send(());
            }
            ReplMsg::Detach(id) => {
                self.feeds.retain(|f| f.entry.client_id != id);
                if self.feeds.is_empty() {
                    self.alone_since = Some(Instant::now());
                }
            }
        }
    }

    /// Hands what accumulated to the backlog and the replicas' queues, and drops replicas
    /// past their output buffer limit.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let Some(backlog) = &mut self.backlog else {
            self.pending.clear();
            return;
        };
        backlog.append(&self.pending);
        let bytes = Bytes::from(std::mem::take(&mut self.pending));
        self.feeds.retain(|f| f.send(bytes.clone()));
        if !self.upstream {
            let end = self.offset();
            self.shared.repl.offset.store(end, Ordering::Relaxed);
        }
        self.enforce_limits();
        self.publish();
    }

    fn enforce_limits(&mut self) {
        let r = &self.shared.repl;
        let hard = r.obuf_hard.load(Ordering::Relaxed);
        let soft = r.obuf_soft.load(Ordering::Relaxed);
        let secs = r.obuf_soft_secs.load(Ordering::Relaxed);
        let now = Instant::now();
        self.feeds.retain_mut(|f| {
            let q = f.queued.load(Ordering::Relaxed);
            let over_soft = soft > 0 && q > soft;
            if !over_soft {
                f.soft_since = None;
            }
            let drop_it = (hard > 0 && q > hard)
                || (over_soft && f.soft_since.is_some_and(|t| now.duration_since(t).as_secs() >= secs));
            if over_soft && f.soft_since.is_none() {
                f.soft_since = Some(now);
            }
            if drop_it {
                f.dropped.store(true, Ordering::Release);
                tracing::warn!(
                    "Client id={} (replica {}:{}) scheduled to be closed ASAP for overcoming of output buffer limits ({q} bytes queued).",
                    f.entry.client_id,
                    f.entry.ip,
                    f.entry.port.load(Ordering::Relaxed)
                );
            }
            !drop_it
        });
    }

    fn publish(&self) {
        if let Some(b) = &self.backlog {
            let r = &self.shared.repl;
            r.backlog_first.store(b.first(), Ordering::Relaxed);
            r.backlog_histlen.store(b.histlen(), Ordering::Relaxed);
        }
    }

    /// Timers, from the writer's loop: PING to replicas, the backlog's size and time to
    /// live.
    pub fn tick(&mut self) {
        let Some(b) = &mut self.backlog else {
            return;
        };
        let r = &self.shared.repl;
        let size = r.backlog_size.load(Ordering::Relaxed) as usize;
        b.resize(size);
        // No PING while this server is turning replica (REPLICAOF, FAILOVER): its offset
        // must hold still for the PSYNC that continues its history.
        let switching =
            r.is_replica() || r.failover_state.load(Ordering::Relaxed) != super::failover::NONE;
        if !self.upstream && !self.feeds.is_empty() && !switching {
            let period = r.ping_period_s.load(Ordering::Relaxed);
            if self.last_ping.elapsed().as_secs() >= period {
                self.last_ping = Instant::now();
                encode(&mut self.pending, &[b"ping".as_slice()]);
            }
        }
        if !self.upstream && self.feeds.is_empty() {
            let ttl = self
                .shared
                .config
                .lock()
                .expect("config lock")
                .get_i64("repl-backlog-ttl");
            let since = *self.alone_since.get_or_insert_with(Instant::now);
            if ttl > 0 && since.elapsed().as_secs() >= ttl as u64 {
                tracing::info!(
                    "Replication backlog freed after {ttl} seconds without connected replicas."
                );
                self.backlog = None;
                self.shared
                    .repl
                    .backlog_active
                    .store(false, Ordering::Relaxed);
                self.shared.persist.aof.repl.store(false, Ordering::Release);
                self.set_ids(|ids| {
                    ids.replid = random_id();
                    ids.replid2 = "0".repeat(40);
                    ids.second_offset = -1;
                });
            }
        }
        self.flush();
    }
}
