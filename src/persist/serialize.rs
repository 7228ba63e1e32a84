//! A snapshot's work on one shard: its tables serialized on the shard's own thread, a
//! little per pass of the event loop, and handed to the writer thread (`rdbfile`).
//!
//! Memory stays small because nothing waits in bulk: records go out in 32 KiB messages
//! through a bounded channel, and while the writer is behind the shard produces nothing
//! (except what a write forces, see `types::table`). A large list is not serialized when
//! its segment is saved: the snapshot keeps a clone of it, which shares the list's chunks
//! (`types::list`), and writes it a few nodes per pass. The live list copies a chunk only
//! when it changes one the snapshot still holds, so a queue being pushed and popped
//! during the snapshot costs a few chunks at its two ends, not a copy of the queue.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{Duration, Instant};

use super::rdb::write::{put_key_value, put_len, put_list_node, put_raw_string, Options, Sink};
use super::rdb::{op, ty};
use crate::shard::Worker;
use crate::types::list::List;
use crate::types::table::{Entry, SegmentSink};
use crate::types::value::Value;

/// Bytes gathered before a message goes to the writer.
const MESSAGE_BYTES: usize = 32 * 1024;
/// Messages a shard keeps when the writer's channel is full, before it stops producing.
const OUTBOX_MAX: usize = 2;
/// Lists with more chunks than this are written a few nodes per pass from a clone.
const DEFER_NODES: usize = 16;
/// Nodes of a deferred list written per step.
const NODES_PER_STEP: usize = 4;
/// Time a shard spends on its snapshot per pass before serving clients again.
const STEP_BUDGET: Duration = Duration::from_micros(300);

/// Serialized bytes on their way to the writer. Blobs (listpacks, intsets) are
/// compressed by the writer thread, not by the shard that built them.
pub enum Piece {
    Raw(Vec<u8>),
    Blob(Vec<u8>),
}

/// What a shard sends the writer.
pub enum Msg {
    /// Whole records of one database.
    Records { db: usize, pieces: Vec<Piece> },
    /// Part of the record of one large list; the parts of one id are written in order and
    /// placed in the file after the records.
    Part {
        id: u64,
        db: usize,
        pieces: Vec<Piece>,
    },
}

/// Bytes being gathered into one message.
#[derive(Default)]
struct Gather {
    raw: Vec<u8>,
    pieces: Vec<Piece>,
    held: usize,
    compress: bool,
}

impl Gather {
    fn take(&mut self) -> Vec<Piece> {
        if !self.raw.is_empty() {
            self.pieces.push(Piece::Raw(std::mem::take(&mut self.raw)));
        }
        self.held = 0;
        std::mem::take(&mut self.pieces)
    }
}

impl Sink for Gather {
    fn put(&mut self, bytes: &[u8]) {
        self.held += bytes.len();
        self.raw.extend_from_slice(bytes);
    }

    fn put_blob(&mut self, blob: Vec<u8>, _opts: &Options) {
        if !self.compress || blob.len() <= 20 {
            put_raw_string(self, &blob);
            return;
        }
        if !self.raw.is_empty() {
            self.pieces.push(Piece::Raw(std::mem::take(&mut self.raw)));
        }
        self.held += blob.len();
        self.pieces.push(Piece::Blob(blob));
    }
}

/// A large list written from a clone, a few nodes at a time.
struct Deferred {
    id: u64,
    db: usize,
    key: Box<[u8]>,
    expire_at: u64,
    list: List,
    /// The chunk index to continue from; None before the record's header is written.
    next: Option<usize>,
}

/// One shard's snapshot in progress.
pub struct ShardSnapshot {
    opts: Options,
    to_writer: Option<SyncSender<Msg>>,
    /// Records being gathered, per database.
    open: Vec<Gather>,
    /// Messages the writer's channel had no room for yet.
    outbox: VecDeque<Msg>,
    deferred: VecDeque<Deferred>,
    next_part: u64,
}

impl ShardSnapshot {
    fn gather(&mut self, db: usize) -> &mut Gather {
        let compress = self.opts.compress;
        let g = &mut self.open[db];
        g.compress = compress;
        g
    }

    fn save_entry(&mut self, db: usize, e: &Entry) {
        if let Value::List(l) = &e.value {
            if l.node_count() > DEFER_NODES {
                self.next_part += 1;
                self.deferred.push_back(Deferred {
                    id: self.next_part,
                    db,
                    key: e.key.as_bytes().into(),
                    expire_at: e.expire_at(),
                    list: (**l).clone(),
                    next: None,
                });
                return;
            }
        }
        let opts = self.opts;
        let g = self.gather(db);
        put_key_value(g, &e.key, &e.value, e.expire_at(), &opts);
        if g.held >= MESSAGE_BYTES {
            let pieces = g.take();
            self.outbox.push_back(Msg::Records { db, pieces });
        }
    }

    /// Hands queued messages to the writer while its channel has room.
    fn pump(&mut self) {
        let Some(tx) = &self.to_writer else {
            self.outbox.clear();
            return;
        };
        while let Some(m) = self.outbox.pop_front() {
            match tx.try_send(m) {
                Ok(()) => {}
                Err(TrySendError::Full(m)) => {
                    self.outbox.push_front(m);
                    return;
                }
                // The writer gave up (it reports why); what is left is moot.
                Err(TrySendError::Disconnected(_)) => {
                    self.outbox.clear();
                    return;
                }
            }
        }
    }

    /// Writes the next few nodes of a deferred list; false when none is left.
    fn step_deferred(&mut self) -> bool {
        let opts = self.opts;
        let compress = opts.compress;
        let Some(d) = self.deferred.front_mut() else {
            return false;
        };
        let mut g = Gather {
            compress,
            ..Gather::default()
        };
        let from = match d.next {
            Some(i) => i,
            None => {
                if d.expire_at != 0 {
                    g.put_u8(op::EXPIRETIME_MS);
                    g.put(&(d.expire_at as i64).to_le_bytes());
                }
                g.put_u8(ty::LIST_QUICKLIST_2);
                super::rdb::write::put_string(&mut g, &d.key, &opts);
                put_len(&mut g, d.list.node_count() as u64);
                0
            }
        };
        let mut next = None;
        for (after, node) in d.list.nodes_from(from).take(NODES_PER_STEP) {
            put_list_node(&mut g, node, &opts);
            next = Some(after);
        }
        let (id, db) = (d.id, d.db);
        match next {
            Some(after) => d.next = Some(after),
            None => {
                self.deferred.pop_front();
            }
        }
        let pieces = g.take();
        if !pieces.is_empty() {
            self.outbox.push_back(Msg::Part { id, db, pieces });
        }
        true
    }

    fn idle_for_writer(&self) -> bool {
        self.outbox.len() > OUTBOX_MAX
    }
}

/// The sink of one table (one database of one shard).
struct TableSink {
    db: usize,
    snap: Rc<RefCell<ShardSnapshot>>,
}

impl SegmentSink for TableSink {
    fn save(&mut self, entries: &mut dyn Iterator<Item = &Entry>) {
        let mut snap = self.snap.borrow_mut();
        for e in entries {
            snap.save_entry(self.db, e);
        }
        snap.pump();
    }
}

/// Starts a snapshot on this shard: every table gets a sink, and a task writes the tables
/// a little per pass until they are done. Returns the shard's write counter at the cut.
pub fn begin_on_shard(w: &Rc<Worker>, to_writer: &SyncSender<Msg>, opts: Options) -> u64 {
    let mut sh = w.shard.borrow_mut();
    let snap = Rc::new(RefCell::new(ShardSnapshot {
        opts,
        to_writer: Some(to_writer.clone()),
        open: (0..sh.dbs.len()).map(|_| Gather::default()).collect(),
        outbox: VecDeque::new(),
        deferred: VecDeque::new(),
        next_part: (w.id as u64) << 40,
    }));
    for (db, d) in sh.dbs.iter_mut().enumerate() {
        d.table.begin_snapshot(Box::new(TableSink {
            db,
            snap: snap.clone(),
        }));
    }
    let w = w.clone();
    crate::net::event_loop::spawn_local(async move {
        loop {
            match run_step(&w, &snap) {
                Step::Done => break,
                Step::More => tokio::task::yield_now().await,
                // Spinning would take the CPU the writer needs to catch up.
                Step::WriterBehind => {
                    crate::net::event_loop::time::sleep(Duration::from_millis(1)).await
                }
            }
        }
    });
    sh.dirty
}

enum Step {
    Done,
    More,
    WriterBehind,
}

/// One pass of the shard's snapshot work.
fn run_step(w: &Rc<Worker>, snap: &Rc<RefCell<ShardSnapshot>>) -> Step {
    let started = Instant::now();
    snap.borrow_mut().pump();
    while started.elapsed() < STEP_BUDGET && !snap.borrow().idle_for_writer() {
        if snap.borrow_mut().step_deferred() {
            snap.borrow_mut().pump();
            continue;
        }
        let mut sh = w.shard.borrow_mut();
        let Some(d) = sh.dbs.iter_mut().find(|d| d.table.snapshot_running()) else {
            break;
        };
        // The sink handed back at the end is dropped: its table is done.
        d.table.snapshot_step(4);
        drop(sh);
        snap.borrow_mut().pump();
    }
    let tables_done = !w
        .shard
        .borrow()
        .dbs
        .iter()
        .any(|d| d.table.snapshot_running());
    let mut s = snap.borrow_mut();
    if s.idle_for_writer() {
        return Step::WriterBehind;
    }
    if !tables_done || !s.deferred.is_empty() {
        return Step::More;
    }
    for db in 0..s.open.len() {
        let pieces = s.open[db].take();
        if !pieces.is_empty() {
            s.outbox.push_back(Msg::Records { db, pieces });
        }
    }
    s.pump();
    if s.outbox.is_empty() {
        // The last sender of this shard goes: once all are gone the writer finishes.
        s.to_writer = None;
        return Step::Done;
    }
    Step::WriterBehind
}
