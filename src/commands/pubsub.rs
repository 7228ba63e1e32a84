//! The Pub/Sub family: SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH, PUBSUB.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::util::glob_match;
use crate::async_handler;
use crate::server::session::Session;
use crate::shard::broadcast;

/// Commands a RESP2 connection may run while subscribed.
pub fn allowed_while_subscribed(name: &str) -> bool {
    matches!(
        name,
        "subscribe"
            | "unsubscribe"
            | "psubscribe"
            | "punsubscribe"
            | "ssubscribe"
            | "sunsubscribe"
            | "ping"
            | "quit"
            | "reset"
    )
}

fn confirm(sess: &mut Session, kind: &[u8], name: Option<&[u8]>) {
    let count = sess.subscriptions() as i64;
    sess.out.push(3);
    sess.out.bulk(kind);
    match name {
        Some(n) => sess.out.bulk(n),
        None => sess.out.null(),
    }
    sess.out.int(count);
}

fn subscribe_to(sess: &mut Session, names: &[Bytes], pattern: bool) {
    let tx = sess.push_sender();
    let id = sess.id;
    let resp3 = sess.out.resp3;
    let worker = sess.worker.clone();
    worker
        .clients
        .borrow_mut()
        .pubsub
        .set_subscriber(id, tx, resp3, sess.push_queued.clone());
    for name in names {
        let added = worker
            .clients
            .borrow_mut()
            .pubsub
            .subscribe(id, name, pattern);
        if added {
            worker.shared.subscriptions[worker.id].fetch_add(1, Ordering::AcqRel);
            if pattern {
                sess.patterns.push(name.clone());
            } else {
                sess.channels.push(name.clone());
            }
        }
        confirm(
            sess,
            if pattern { b"psubscribe" } else { b"subscribe" },
            Some(name),
        );
    }
    update_info(sess);
}

fn unsubscribe_from(sess: &mut Session, names: &[Bytes], pattern: bool, reply: bool) {
    let id = sess.id;
    let worker = sess.worker.clone();
    let names: Vec<Bytes> = if names.is_empty() {
        let set = if pattern {
            &sess.patterns
        } else {
            &sess.channels
        };
        set.to_vec()
    } else {
        names.to_vec()
    };
    let kind: &[u8] = if pattern {
        b"punsubscribe"
    } else {
        b"unsubscribe"
    };
    if names.is_empty() && reply {
        confirm(sess, kind, None);
    }
    for name in names {
        let removed = worker
            .clients
            .borrow_mut()
            .pubsub
            .unsubscribe(id, &name, pattern);
        if removed {
            worker.shared.subscriptions[worker.id].fetch_sub(1, Ordering::AcqRel);
        }
        if pattern {
            sess.patterns.retain(|p| *p != name);
        } else {
            sess.channels.retain(|c| *c != name);
        }
        if reply {
            confirm(sess, kind, Some(&name));
        }
    }
    if sess.subscriptions() == 0 {
        worker.clients.borrow_mut().pubsub.drop_subscriber(id);
    }
    update_info(sess);
}

fn update_info(sess: &mut Session) {
    let mut info = sess.handle.info.borrow_mut();
    info.sub = sess.channels.len();
    info.psub = sess.patterns.len();
}

/// Drops every subscription of a closing (or RESET) connection.
pub fn unsubscribe_all(sess: &mut Session) {
    if sess.subscriptions() > 0 {
        unsubscribe_from(sess, &[], false, false);
        unsubscribe_from(sess, &[], true, false);
    }
}

pub fn subscribe(sess: &mut Session, args: &[Bytes]) {
    subscribe_to(sess, &args[1..], false);
}

pub fn psubscribe(sess: &mut Session, args: &[Bytes]) {
    subscribe_to(sess, &args[1..], true);
}

pub fn unsubscribe(sess: &mut Session, args: &[Bytes]) {
    unsubscribe_from(sess, &args[1..], false, true);
}

pub fn punsubscribe(sess: &mut Session, args: &[Bytes]) {
    unsubscribe_from(sess, &args[1..], true, true);
}

async_handler!(publish, |sess, args| {
    let n = crate::pubsub::publish_counted(&sess.worker, args[1].clone(), args[2].clone()).await;
    // As Redis does, a master's messages reach its replicas' subscribers through the
    // replication stream (never the AOF).
    if !sess.replaying {
        crate::repl::master::propagate_publish(&sess.worker, &args);
    }
    sess.out.int(n as i64);
});

pub const PUBSUB_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("channels", -2, "pubsub loading stale"),
    ("help", 2, "loading stale"),
    ("numpat", 2, "pubsub loading stale"),
    ("numsub", -2, "pubsub loading stale"),
];

const PUBSUB_HELP: &[&str] = &[
    "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CHANNELS [<pattern>]",
    "    Channels with at least one subscriber, optionally matching a pattern.",
    "NUMPAT",
    "    How many patterns clients are subscribed to.",
    "NUMSUB [<channel> ...]",
    "    The number of subscribers of each channel.",
    "HELP",
    "    Print this help.",
];

async_handler!(pubsub, |sess, args| {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "channels" => {
            if args.len() > 3 {
                return sess.out.error(&super::arity_error("pubsub|channels"));
            }
            let pattern = args.get(2).cloned();
            let names = broadcast(&sess.worker, move |w| {
                let clients = w.clients.borrow();
                clients
                    .pubsub
                    .channel_names()
                    .filter(|c| pattern.as_ref().is_none_or(|p| glob_match(p, c, false)))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .await;
            let mut all: Vec<Bytes> = names.into_iter().flatten().collect();
            all.sort();
            all.dedup();
            sess.out.array(all.len());
            for c in all {
                sess.out.bulk(&c);
            }
        }
        "numsub" => {
            let channels: Vec<Bytes> = args[2..].to_vec();
            let query = channels.clone();
            let counts = broadcast(&sess.worker, move |w| {
                let clients = w.clients.borrow();
                query
                    .iter()
                    .map(|c| clients.pubsub.channel_subscribers(c))
                    .collect::<Vec<_>>()
            })
            .await;
            // A flat array in RESP3 too, as Redis 7 answers (clients parse it so).
            sess.out.array(channels.len() * 2);
            for (i, c) in channels.iter().enumerate() {
                sess.out.bulk(c);
                sess.out
                    .int(counts.iter().map(|v| v[i]).sum::<usize>() as i64);
            }
        }
        "numpat" => {
            let pats = broadcast(&sess.worker, |w| {
                w.clients
                    .borrow()
                    .pubsub
                    .pattern_names()
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .await;
            let mut all: Vec<Bytes> = pats.into_iter().flatten().collect();
            all.sort();
            all.dedup();
            sess.out.int(all.len() as i64);
        }
        "help" => {
            sess.out.array(PUBSUB_HELP.len());
            for l in PUBSUB_HELP {
                sess.out.simple(l);
            }
        }
        _ => unreachable!("subcommands are checked before dispatch"),
    }
});
