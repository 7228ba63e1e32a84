//! Pub/Sub delivery and keyspace notifications.
//!
//! Each thread keeps the subscriptions of its own connections. A message published on
//! any thread is sent to every thread that has at least one subscription (a per-thread
//! count in `Shared` lets publishers skip the others), which encodes it for each local
//! subscriber in that subscriber's protocol and queues it on the subscriber's connection.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use hashbrown::HashMap;
use tokio::sync::mpsc;

use crate::commands::util::glob_match;
use crate::protocol::reply::Reply;
use crate::shard::{Shared, Worker};

struct Subscriber {
    tx: mpsc::UnboundedSender<Bytes>,
    resp3: bool,
    /// Bytes queued for the connection and not yet written to its socket, shared with
    /// the connection (which takes them off as it writes).
    queued: Rc<std::cell::Cell<usize>>,
    /// When the queue went past the soft limit (unix ms), while it stays past it.
    soft_since: std::cell::Cell<Option<u64>>,
}

/// What a subscription names: a channel, a pattern, or a shard channel.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Channel,
    Pattern,
    Shard,
}

/// `client-output-buffer-limit pubsub`: hard bytes, soft bytes, soft seconds.
#[derive(Clone, Copy)]
pub struct OutputLimit {
    pub hard: u64,
    pub soft: u64,
    pub soft_secs: u64,
}

impl OutputLimit {
    /// Whether `queued` bytes break the limit, starting or clearing the soft clock.
    pub fn exceeded(
        &self,
        queued: u64,
        soft_since: &std::cell::Cell<Option<u64>>,
        now_ms: u64,
    ) -> bool {
        if self.hard > 0 && queued >= self.hard {
            return true;
        }
        if self.soft > 0 && queued >= self.soft {
            let since = soft_since.get().unwrap_or(now_ms);
            soft_since.set(Some(since));
            return now_ms.saturating_sub(since) >= self.soft_secs * 1000;
        }
        soft_since.set(None);
        false
    }
}

/// The subscriptions of one thread's connections.
#[derive(Default)]
pub struct Registry {
    channels: HashMap<Bytes, Vec<u64>>,
    patterns: HashMap<Bytes, Vec<u64>>,
    /// Shard channels (SSUBSCRIBE): a namespace of their own, reached by SPUBLISH.
    shard_channels: HashMap<Bytes, Vec<u64>>,
    subscribers: HashMap<u64, Subscriber>,
}

impl Registry {
    pub fn set_subscriber(
        &mut self,
        id: u64,
        tx: mpsc::UnboundedSender<Bytes>,
        resp3: bool,
        queued: Rc<std::cell::Cell<usize>>,
    ) {
        self.subscribers.insert(
            id,
            Subscriber {
                tx,
                resp3,
                queued,
                soft_since: std::cell::Cell::new(None),
            },
        );
    }

    fn map_mut(&mut self, kind: Kind) -> &mut HashMap<Bytes, Vec<u64>> {
        match kind {
            Kind::Channel => &mut self.channels,
            Kind::Pattern => &mut self.patterns,
            Kind::Shard => &mut self.shard_channels,
        }
    }

    /// Adds `id` to a channel, pattern or shard channel; false if it was there already.
    pub fn subscribe(&mut self, id: u64, name: &Bytes, kind: Kind) -> bool {
        let map = self.map_mut(kind);
        let ids = map.entry(name.clone()).or_default();
        if ids.contains(&id) {
            return false;
        }
        ids.push(id);
        true
    }

    pub fn unsubscribe(&mut self, id: u64, name: &Bytes, kind: Kind) -> bool {
        let map = self.map_mut(kind);
        let Some(ids) = map.get_mut(name) else {
            return false;
        };
        let before = ids.len();
        ids.retain(|&i| i != id);
        let removed = ids.len() != before;
        if ids.is_empty() {
            map.remove(name);
        }
        removed
    }

    /// Every (channel or pattern, subscriber ids, is a pattern) of this thread.
    pub fn all_subscriptions(&self) -> impl Iterator<Item = (&Bytes, &Vec<u64>, bool)> {
        self.channels
            .iter()
            .map(|(n, ids)| (n, ids, false))
            .chain(self.patterns.iter().map(|(n, ids)| (n, ids, true)))
            .chain(self.shard_channels.iter().map(|(n, ids)| (n, ids, false)))
    }

    /// Queues a message built for connection `id`'s protocol, if it is a subscriber
    /// (CLIENT TRACKING's redirect target).
    pub fn push_to(&self, id: u64, build: impl FnOnce(bool) -> Reply) -> bool {
        let Some(s) = self.subscribers.get(&id) else {
            return false;
        };
        let r = build(s.resp3);
        s.queued.set(s.queued.get() + r.buf.len());
        let _ = s.tx.send(r.buf.freeze());
        true
    }

    pub fn drop_subscriber(&mut self, id: u64) {
        self.subscribers.remove(&id);
    }

    /// Delivers a message to this thread's subscribers; returns how many received it,
    /// and the subscribers whose queue is now past `limit` (to be disconnected). A
    /// shard message (SPUBLISH) goes to shard-channel subscribers only, as `smessage`.
    pub fn deliver(
        &self,
        channel: &[u8],
        message: &[u8],
        shard: bool,
        limit: OutputLimit,
    ) -> (usize, Vec<u64>) {
        let mut n = 0;
        let mut over = Vec::new();
        let now = crate::shard::unix_ms();
        let mut send = |id: u64, s: &Subscriber, r: Reply| {
            let len = r.buf.len();
            s.queued.set(s.queued.get() + len);
            let _ = s.tx.send(r.buf.freeze());
            if limit.exceeded(s.queued.get() as u64, &s.soft_since, now) {
                over.push(id);
            }
        };
        let (map, kind): (_, &[u8]) = if shard {
            (&self.shard_channels, b"smessage")
        } else {
            (&self.channels, b"message")
        };
        for &id in map.get(channel).into_iter().flatten() {
            if let Some(s) = self.subscribers.get(&id) {
                let mut r = Reply::new(s.resp3);
                r.push(3);
                r.bulk(kind);
                r.bulk(channel);
                r.bulk(message);
                send(id, s, r);
                n += 1;
            }
        }
        if shard {
            return (n, over);
        }
        for (pattern, ids) in &self.patterns {
            if !glob_match(pattern, channel, false) {
                continue;
            }
            for &id in ids {
                if let Some(s) = self.subscribers.get(&id) {
                    let mut r = Reply::new(s.resp3);
                    r.push(4);
                    r.bulk(b"pmessage");
                    r.bulk(pattern);
                    r.bulk(channel);
                    r.bulk(message);
                    send(id, s, r);
                    n += 1;
                }
            }
        }
        (n, over)
    }

    pub fn channel_names(&self, shard: bool) -> impl Iterator<Item = &Bytes> {
        if shard {
            self.shard_channels.keys()
        } else {
            self.channels.keys()
        }
    }

    pub fn channel_subscribers(&self, channel: &[u8], shard: bool) -> usize {
        let map = if shard {
            &self.shard_channels
        } else {
            &self.channels
        };
        map.get(channel).map_or(0, |v| v.len())
    }

    pub fn pattern_names(&self) -> impl Iterator<Item = &Bytes> {
        self.patterns.keys()
    }
}

/// Delivers to this thread's subscribers, and disconnects those whose unsent messages
/// passed `client-output-buffer-limit pubsub`: a subscriber that stops reading costs no
/// more than its limit.
fn deliver_here(worker: &Rc<Worker>, channel: &[u8], message: &[u8], shard: bool) -> usize {
    let t = &worker.shared.tunables.obuf_pubsub;
    let limit = OutputLimit {
        hard: t[0].load(Ordering::Relaxed),
        soft: t[1].load(Ordering::Relaxed),
        soft_secs: t[2].load(Ordering::Relaxed),
    };
    let (n, over) = worker
        .clients
        .borrow()
        .pubsub
        .deliver(channel, message, shard, limit);
    if !over.is_empty() {
        let mut clients = worker.clients.borrow_mut();
        for id in over {
            clients.pubsub.drop_subscriber(id);
            if let Some(h) = clients.map.get(&id) {
                crate::net::conn::close_for_output_limit(h, "pubsub");
            }
        }
    }
    n
}

/// Publishes without waiting for the count (keyspace notifications).
///
/// Returns how many receivers this thread had (a script's PUBLISH reports those, as it
/// cannot wait for the other threads' counts).
pub fn publish(worker: &Rc<Worker>, channel: Bytes, message: Bytes) -> usize {
    let shared = &worker.shared;
    let mut here = 0;
    for t in 0..worker.nshards() {
        if shared.subscriptions[t].load(Ordering::Acquire) == 0 {
            continue;
        }
        if t == worker.id {
            here = deliver_here(worker, &channel, &message, false);
        } else {
            let (c, m) = (channel.clone(), message.clone());
            shared.send(
                t,
                Box::new(move |w| {
                    deliver_here(w, &c, &m, false);
                }),
            );
        }
    }
    here
}

/// Delivers a message another cluster node published (the bus's PUBLISH and
/// PUBLISHSHARD) to this node's subscribers, from outside the shard threads.
pub fn deliver_from_bus(
    shared: &crate::shard::Shared,
    channel: Bytes,
    message: Bytes,
    shard: bool,
) {
    for t in 0..shared.nshards() {
        if shared.subscriptions[t].load(Ordering::Acquire) == 0 {
            continue;
        }
        let (c, m) = (channel.clone(), message.clone());
        shared.send(
            t,
            Box::new(move |w| {
                deliver_here(w, &c, &m, shard);
            }),
        );
    }
}

/// Publishes and counts the receivers on every thread (PUBLISH; SPUBLISH with `shard`).
pub async fn publish_counted(
    worker: &Rc<Worker>,
    channel: Bytes,
    message: Bytes,
    shard: bool,
) -> usize {
    let shared = worker.shared.clone();
    let mut waiting = Vec::new();
    let mut n = 0;
    for t in 0..worker.nshards() {
        if shared.subscriptions[t].load(Ordering::Acquire) == 0 {
            continue;
        }
        if t == worker.id {
            n += deliver_here(worker, &channel, &message, shard);
        } else {
            let (c, m) = (channel.clone(), message.clone());
            let (tx, rx) = tokio::sync::oneshot::channel();
            shared.send(
                t,
                Box::new(move |w| {
                    let _ = tx.send(deliver_here(w, &c, &m, shard));
                }),
            );
            waiting.push(rx);
        }
    }
    for rx in waiting {
        n += rx.await.unwrap_or(0);
    }
    n
}

/// Keyspace event classes, as letters of notify-keyspace-events.
pub mod class {
    pub const KEYSPACE: u32 = 1 << 0;
    pub const KEYEVENT: u32 = 1 << 1;
    pub const GENERIC: u32 = 1 << 2;
    pub const STRING: u32 = 1 << 3;
    pub const LIST: u32 = 1 << 4;
    pub const SET: u32 = 1 << 5;
    pub const HASH: u32 = 1 << 6;
    pub const ZSET: u32 = 1 << 7;
    pub const EXPIRED: u32 = 1 << 8;
    pub const EVICTED: u32 = 1 << 9;
    pub const STREAM: u32 = 1 << 10;
    pub const KEY_MISS: u32 = 1 << 11;
    pub const MODULE: u32 = 1 << 12;
    pub const NEW: u32 = 1 << 13;
    /// `A`: every class but key-miss and new.
    pub const ALL: u32 =
        GENERIC | STRING | LIST | SET | HASH | ZSET | EXPIRED | EVICTED | STREAM | MODULE;

    pub fn of_letter(c: u8) -> Option<u32> {
        Some(match c {
            b'A' => ALL,
            b'g' => GENERIC,
            b'$' => STRING,
            b'l' => LIST,
            b's' => SET,
            b'h' => HASH,
            b'z' => ZSET,
            b'x' => EXPIRED,
            b'e' => EVICTED,
            b't' => STREAM,
            b'K' => KEYSPACE,
            b'E' => KEYEVENT,
            b'm' => KEY_MISS,
            b'd' => MODULE,
            b'n' => NEW,
            _ => return None,
        })
    }
}

/// Parses notify-keyspace-events; None for a character Redis does not know.
pub fn parse_classes(s: &str) -> Option<u32> {
    s.bytes()
        .try_fold(0u32, |acc, c| class::of_letter(c).map(|f| acc | f))
}

/// The canonical text of a set of classes, as CONFIG GET prints it.
pub fn classes_text(flags: u32) -> String {
    let mut s = String::new();
    if flags & class::ALL == class::ALL {
        s.push('A');
    } else {
        for (c, f) in [
            ('g', class::GENERIC),
            ('$', class::STRING),
            ('l', class::LIST),
            ('s', class::SET),
            ('h', class::HASH),
            ('z', class::ZSET),
            ('x', class::EXPIRED),
            ('e', class::EVICTED),
            ('t', class::STREAM),
            ('d', class::MODULE),
        ] {
            if flags & f != 0 {
                s.push(c);
            }
        }
    }
    for (c, f) in [
        ('K', class::KEYSPACE),
        ('E', class::KEYEVENT),
        ('m', class::KEY_MISS),
        ('n', class::NEW),
    ] {
        if flags & f != 0 {
            s.push(c);
        }
    }
    s
}

/// Maps a class letter used by the command families to its flag.
pub fn class_of(letter: u8) -> u32 {
    if letter == b'A' {
        return 0;
    }
    class::of_letter(letter).unwrap_or(0)
}

/// Whether events of class `letter` are published at all right now.
#[inline]
pub fn wanted(shared: &Shared, letter: u8) -> bool {
    let flags = shared.tunables.notify_flags.load(Ordering::Relaxed);
    flags & (class::KEYSPACE | class::KEYEVENT) != 0 && flags & class_of(letter) != 0
}

/// Publishes one keyspace event on the keyspace and keyevent channels as configured.
pub fn publish_event(worker: &Rc<Worker>, db: usize, event: &str, key: &[u8]) {
    let flags = worker.shared.tunables.notify_flags.load(Ordering::Relaxed);
    if flags & class::KEYSPACE != 0 {
        let mut channel = format!("__keyspace@{db}__:").into_bytes();
        channel.extend_from_slice(key);
        publish(
            worker,
            Bytes::from(channel),
            Bytes::copy_from_slice(event.as_bytes()),
        );
    }
    if flags & class::KEYEVENT != 0 {
        let channel = format!("__keyevent@{db}__:{event}");
        publish(worker, Bytes::from(channel), Bytes::copy_from_slice(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_trip() {
        assert_eq!(classes_text(parse_classes("KEA").unwrap()), "AKE");
        assert_eq!(classes_text(parse_classes("Kl$").unwrap()), "$lK");
        assert_eq!(classes_text(parse_classes("").unwrap()), "");
        assert!(parse_classes("Kq").is_none());
        assert_eq!(classes_text(parse_classes("AKEmn").unwrap()), "AKEmn");
    }
}
