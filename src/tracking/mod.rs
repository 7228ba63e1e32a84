//! Client-side caching (CLIENT TRACKING): which clients read which keys, and the
//! invalidation messages sent when those keys change. Design: docs/tracking.md.
//!
//! Owns each shard's table of tracked keys, each thread's registry of tracking
//! connections, and the delivery of `invalidate` messages between them. It never reads or
//! changes key data: shards call in when a key is read or modified.

use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hashbrown::HashMap;
use tokio::sync::mpsc;

use crate::protocol::reply::Reply;
use crate::shard::{Shared, Worker};

/// The connection a shard is running a command for, as tracking needs it.
#[derive(Clone, Copy, Debug)]
pub struct Reader {
    pub id: u64,
    pub thread: usize,
    pub noloop: bool,
    /// This command's read keys are to be remembered (default mode, or OPTIN after
    /// CACHING yes, or OPTOUT without CACHING no).
    pub remember: bool,
}

#[derive(Clone, Copy)]
struct Entry {
    id: u64,
    thread: usize,
    noloop: bool,
}

/// One invalidation on its way to a client's thread. `key` None: everything (a flush).
struct Pending {
    thread: usize,
    id: u64,
    key: Option<Bytes>,
    /// The BCAST prefix that matched (each prefix's keys go in a message of their own).
    bcast: Option<Bytes>,
}

/// A BCAST prefix of one client, as every shard sees it.
#[derive(Clone)]
pub struct Bcast {
    pub prefix: Bytes,
    pub id: u64,
    pub thread: usize,
    pub noloop: bool,
}

/// Server-wide tracking state shared by the threads: counts and the BCAST prefixes.
#[derive(Default)]
pub struct Global {
    /// Connections with tracking on (INFO's tracking_clients).
    pub clients: AtomicUsize,
    bcast: Mutex<Arc<Vec<Bcast>>>,
    bcast_version: AtomicU64,
    bcast_count: AtomicUsize,
}

impl Global {
    pub fn set_bcast(&self, id: u64, entries: Vec<Bcast>) {
        let mut g = self.bcast.lock().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<Bcast> = g.iter().filter(|b| b.id != id).cloned().collect();
        list.extend(entries);
        self.bcast_count.store(list.len(), Ordering::Release);
        *g = Arc::new(list);
        self.bcast_version.fetch_add(1, Ordering::AcqRel);
    }

    pub fn prefixes(&self) -> usize {
        let g = self.bcast.lock().unwrap_or_else(|e| e.into_inner());
        let mut p: Vec<&Bytes> = g.iter().map(|b| &b.prefix).collect();
        p.sort();
        p.dedup();
        p.len()
    }
}

/// A shard's tracked keys and the invalidations its current command produced.
#[derive(Default)]
pub struct Table {
    keys: HashMap<Bytes, Vec<Entry>>,
    items: usize,
    pending: Vec<Pending>,
    bcast_seen: u64,
    bcast: Arc<Vec<Bcast>>,
}

impl Table {
    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    pub fn items(&self) -> usize {
        self.items
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Remembers that `reader` read `key`; a table past its share of
    /// `tracking-table-max-keys` invalidates another key early.
    pub fn remember(&mut self, max: usize, nshards: usize, key: &[u8], reader: &Reader) {
        if !self.keys.contains_key(key) {
            self.keys.insert(Bytes::copy_from_slice(key), Vec::new());
        }
        let entries = self.keys.get_mut(key).expect("just inserted");
        if entries.iter().any(|e| e.id == reader.id) {
            return;
        }
        entries.push(Entry {
            id: reader.id,
            thread: reader.thread,
            noloop: reader.noloop,
        });
        self.items += 1;
        if max > 0 {
            let share = max.div_ceil(nshards.max(1));
            // Victims are picked in one walk: a limit lowered under a large table costs
            // one pass, not one walk from the table's start per victim.
            let excess = self.keys.len().saturating_sub(share);
            if excess > 0 {
                let victims: Vec<Bytes> = self
                    .keys
                    .keys()
                    .filter(|k| &k[..] != key)
                    .take(excess)
                    .cloned()
                    .collect();
                for victim in victims {
                    self.invalidate_entries(&victim, None);
                }
            }
        }
    }

    fn invalidate_entries(&mut self, key: &[u8], current: Option<&Reader>) {
        let Some(entries) = self.keys.remove(key) else {
            return;
        };
        self.items -= entries.len();
        let key = Bytes::copy_from_slice(key);
        for e in entries {
            if e.noloop && current.is_some_and(|c| c.id == e.id) {
                continue;
            }
            self.pending.push(Pending {
                thread: e.thread,
                id: e.id,
                key: Some(key.clone()),
                bcast: None,
            });
        }
    }

    /// `key` changed: readers that remembered it, and BCAST clients whose prefix it
    /// matches, are to be told. `current` made the change.
    #[inline]
    pub fn modified(&mut self, g: &Global, key: &[u8], current: Option<&Reader>) {
        if !self.keys.is_empty() {
            self.invalidate_entries(key, current);
        }
        if g.bcast_count.load(Ordering::Acquire) > 0 {
            self.bcast_modified(g, key, current);
        }
    }

    fn bcast_modified(&mut self, g: &Global, key: &[u8], current: Option<&Reader>) {
        let v = g.bcast_version.load(Ordering::Acquire);
        if v != self.bcast_seen {
            self.bcast = g.bcast.lock().unwrap_or_else(|e| e.into_inner()).clone();
            self.bcast_seen = v;
        }
        let list = self.bcast.clone();
        for b in list.iter() {
            if !key.starts_with(&b.prefix) {
                continue;
            }
            if b.noloop && current.is_some_and(|c| c.id == b.id) {
                continue;
            }
            self.pending.push(Pending {
                thread: b.thread,
                id: b.id,
                key: Some(Bytes::copy_from_slice(key)),
                bcast: Some(b.prefix.clone()),
            });
        }
    }

    /// A flush: every tracked key is forgotten (clients are told by `flush_all`).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.items = 0;
    }

    /// Sends what the last command produced to the clients' threads, one message per
    /// thread, keys grouped per client.
    pub fn send_pending(&mut self, worker: &Rc<Worker>) {
        if self.pending.is_empty() {
            return;
        }
        type Group = (u64, Option<Bytes>, Vec<Bytes>);
        let mut by_thread: Vec<(usize, Vec<Group>)> = Vec::new();
        for p in self.pending.drain(..) {
            let group = match by_thread.iter_mut().find(|g| g.0 == p.thread) {
                Some(g) => g,
                None => {
                    by_thread.push((p.thread, Vec::new()));
                    by_thread.last_mut().unwrap()
                }
            };
            let key = p.key.expect("key invalidations only here");
            // Default mode tells each key in a message of its own, as Redis does; BCAST
            // gathers what the command changed, in key order (Redis's radix tree).
            // (Duplicates within a BCAST message go after sorting, below: no scan per key.)
            let found = match p.bcast {
                None => None,
                Some(_) => group.1.iter_mut().find(|c| c.0 == p.id && c.1 == p.bcast),
            };
            match found {
                Some(c) => c.2.push(key),
                None => group.1.push((p.id, p.bcast, vec![key])),
            }
        }
        for (_, list) in &mut by_thread {
            for c in list.iter_mut().filter(|c| c.1.is_some()) {
                c.2.sort();
                c.2.dedup();
            }
        }
        for (thread, list) in by_thread {
            if thread == worker.id {
                deliver(worker, strip(list));
            } else {
                worker.shared.send(
                    thread,
                    Box::new(move |w: &Rc<Worker>| deliver(w, strip(list))),
                );
            }
        }
    }
}

fn strip(list: Vec<(u64, Option<Bytes>, Vec<Bytes>)>) -> Vec<(u64, bool, Vec<Bytes>)> {
    list.into_iter()
        .map(|(id, p, keys)| (id, p.is_some(), keys))
        .collect()
}

/// A tracking connection, in its thread's registry.
pub struct Tracker {
    pub push: mpsc::UnboundedSender<Bytes>,
    pub queued: Rc<std::cell::Cell<usize>>,
    pub resp3: bool,
    pub bcast: bool,
    pub optin: bool,
    pub optout: bool,
    pub noloop: bool,
    /// 0: none.
    pub redirect: u64,
    pub redirect_thread: usize,
    pub broken: bool,
    pub prefixes: Vec<Bytes>,
}

/// Builds an `invalidate` message: a push in RESP3, a Pub/Sub message on
/// `__redis__:invalidate` for a RESP2 redirect target. `keys` None: a flush (null).
fn message(resp3: bool, keys: Option<&[Bytes]>) -> Reply {
    let mut r = Reply::new(resp3);
    if resp3 {
        r.push(2);
        r.bulk(b"invalidate");
    } else {
        r.array(3);
        r.bulk(b"message");
        r.bulk(b"__redis__:invalidate");
    }
    match keys {
        Some(ks) => {
            r.array(ks.len());
            for k in ks {
                r.bulk(k);
            }
        }
        None => r.null(),
    }
    r
}

fn send_to(push: &mpsc::UnboundedSender<Bytes>, queued: &std::cell::Cell<usize>, r: Reply) {
    queued.set(queued.get() + r.buf.len());
    let _ = push.send(r.buf.freeze());
}

/// On a client's thread: hands invalidations to the tracking connections (or their
/// redirect targets).
fn deliver(worker: &Rc<Worker>, list: Vec<(u64, bool, Vec<Bytes>)>) {
    for (id, bcast, keys) in list {
        deliver_one(worker, id, Some(bcast), Some(keys));
    }
}

/// Delivers to tracking client `id`; `bcast` Some(mode): only if it still tracks in
/// that mode; `keys` None: the null invalidation of a flush.
fn deliver_one(worker: &Rc<Worker>, id: u64, bcast: Option<bool>, keys: Option<Vec<Bytes>>) {
    let clients = worker.clients.borrow();
    let Some(t) = clients.trackers.get(&id) else {
        return;
    };
    if bcast.is_some_and(|b| b != t.bcast) {
        return;
    }
    if t.redirect == 0 {
        if t.resp3 {
            send_to(&t.push, &t.queued, message(true, keys.as_deref()));
        }
        return;
    }
    let (target, tthread) = (t.redirect, t.redirect_thread);
    drop(clients);
    let from_thread = worker.id;
    let forward = move |w: &Rc<Worker>| {
        if !push_to_client(w, target, keys.as_deref()) {
            let mark_broken = move |w: &Rc<Worker>| redirect_broken(w, id, target);
            if from_thread == w.id {
                mark_broken(w);
            } else {
                w.shared.send(from_thread, Box::new(mark_broken));
            }
        }
    };
    if tthread == worker.id {
        forward(worker);
    } else {
        worker.shared.send(tthread, Box::new(forward));
    }
}

/// Pushes an invalidation to connection `id` of this thread if it can take one.
fn push_to_client(w: &Rc<Worker>, id: u64, keys: Option<&[Bytes]>) -> bool {
    let clients = w.clients.borrow();
    if !clients.map.contains_key(&id) {
        return false;
    }
    if let Some(t) = clients.trackers.get(&id) {
        if t.resp3 {
            send_to(&t.push, &t.queued, message(true, keys));
            return true;
        }
    }
    if clients.pubsub.push_to(id, |resp3| message(resp3, keys)) {
        return true;
    }
    // A RESP3 connection that neither subscribes nor tracks: its own push channel.
    let h = &clients.map[&id];
    if h.info.borrow().resp == 3 {
        if let Some(tx) = h.push.borrow().as_ref() {
            let _ = tx.send(message(true, keys).buf.freeze());
        }
    }
    true
}

/// Makes sure connection `id` of this thread has a push channel (it is becoming a
/// redirect target): one is made here and handed to the session, which takes it over
/// at its next pass; nothing sent meanwhile is lost.
pub fn ensure_push(w: &Rc<Worker>, id: u64) {
    let clients = w.clients.borrow();
    let Some(h) = clients.map.get(&id) else {
        return;
    };
    if h.push.borrow().is_some() {
        return;
    }
    let (tx, rx) = mpsc::unbounded_channel();
    *h.push.borrow_mut() = Some(tx);
    *h.adopt_rx.borrow_mut() = Some(rx);
    h.wake.notify_one();
}

fn redirect_broken(w: &Rc<Worker>, id: u64, target: u64) {
    let mut clients = w.clients.borrow_mut();
    if let Some(h) = clients.map.get(&id) {
        h.info.borrow_mut().tracking_broken = true;
    }
    let Some(t) = clients.trackers.get_mut(&id) else {
        return;
    };
    t.broken = true;
    if t.resp3 {
        let mut r = Reply::new(true);
        r.push(2);
        r.bulk(b"tracking-redir-broken");
        r.int(target as i64);
        send_to(&t.push, &t.queued, r);
    }
}

/// FLUSHALL / FLUSHDB: every tracking client gets a null invalidation, and every
/// shard forgets its tracked keys.
pub async fn flush_all(worker: &Rc<Worker>) {
    if worker.shared.tracking.clients.load(Ordering::Relaxed) == 0 {
        return;
    }
    crate::shard::broadcast(worker, |w| {
        w.shard.borrow_mut().tracking.clear();
        let ids: Vec<u64> = w.clients.borrow().trackers.keys().copied().collect();
        for id in ids {
            deliver_one(w, id, None, None);
        }
    })
    .await;
}

/// Totals for INFO: (keys, items, prefixes).
pub async fn totals(worker: &Rc<Worker>) -> (usize, usize, usize) {
    let per = crate::shard::broadcast(worker, |w| {
        let sh = w.shard.borrow();
        (sh.tracking.keys(), sh.tracking.items())
    })
    .await;
    let (k, i) = per.iter().fold((0, 0), |acc, p| (acc.0 + p.0, acc.1 + p.1));
    (k, i, worker.shared.tracking.prefixes())
}

/// Finds the thread of connection `id`, if it is connected.
pub async fn thread_of(worker: &Rc<Worker>, id: u64) -> Option<usize> {
    let found = crate::shard::broadcast(worker, move |w| {
        let here = w.clients.borrow().map.contains_key(&id);
        if here {
            ensure_push(w, id);
        }
        here.then_some(w.id)
    })
    .await;
    found.into_iter().flatten().next()
}

/// Whether the shared state says anything is tracked at all (the cheap check before
/// building a reader for each command).
pub fn any(shared: &Shared) -> bool {
    shared.tracking.clients.load(Ordering::Relaxed) > 0
}
