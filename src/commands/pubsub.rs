//! The Pub/Sub family: SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH, the
//! sharded forms SSUBSCRIBE, SUNSUBSCRIBE, SPUBLISH, and PUBSUB.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::util::glob_match;
use crate::async_handler;
use crate::pubsub::Kind;
use crate::server::session::{ReplyMode, Session};
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

fn confirm(sess: &mut Session, kind: Kind, reply: &[u8], name: Option<&[u8]>) {
    // Shard subscriptions are counted apart from channels and patterns, as in Redis.
    let count = match kind {
        Kind::Shard => sess.shard_channels.len(),
        _ => sess.channels.len() + sess.patterns.len(),
    } as i64;
    let mut r = crate::protocol::reply::Reply::new(sess.out.resp3);
    r.push(3);
    r.bulk(reply);
    match name {
        Some(n) => r.bulk(n),
        None => r.null(),
    }
    r.int(count);
    // Confirmations are pushed even while CLIENT REPLY is OFF or skipping, as Redis
    // does: they go past the reply filter.
    match sess.reply_mode {
        ReplyMode::Off | ReplyMode::Skipping => sess.forced.extend_from_slice(&r.buf),
        _ => sess.out.buf.extend_from_slice(&r.buf),
    }
}

fn list_mut(sess: &mut Session, kind: Kind) -> &mut Vec<Bytes> {
    match kind {
        Kind::Channel => &mut sess.channels,
        Kind::Pattern => &mut sess.patterns,
        Kind::Shard => &mut sess.shard_channels,
    }
}

fn subscribe_to(sess: &mut Session, names: &[Bytes], kind: Kind) {
    let tx = sess.push_sender();
    let id = sess.id;
    let resp3 = sess.out.resp3;
    let worker = sess.worker.clone();
    worker
        .clients
        .borrow_mut()
        .pubsub
        .set_subscriber(id, tx, resp3, sess.push_queued.clone());
    let reply: &[u8] = match kind {
        Kind::Channel => b"subscribe",
        Kind::Pattern => b"psubscribe",
        Kind::Shard => b"ssubscribe",
    };
    for name in names {
        let added = worker.clients.borrow_mut().pubsub.subscribe(id, name, kind);
        if added {
            worker.shared.subscriptions[worker.id].fetch_add(1, Ordering::AcqRel);
            list_mut(sess, kind).push(name.clone());
        }
        confirm(sess, kind, reply, Some(name));
    }
    update_info(sess);
}

fn unsubscribe_from(sess: &mut Session, names: &[Bytes], kind: Kind, reply: bool) {
    let id = sess.id;
    let worker = sess.worker.clone();
    let names: Vec<Bytes> = if names.is_empty() {
        list_mut(sess, kind).to_vec()
    } else {
        names.to_vec()
    };
    let verb: &[u8] = match kind {
        Kind::Channel => b"unsubscribe",
        Kind::Pattern => b"punsubscribe",
        Kind::Shard => b"sunsubscribe",
    };
    if names.is_empty() && reply {
        confirm(sess, kind, verb, None);
    }
    for name in names {
        let removed = worker
            .clients
            .borrow_mut()
            .pubsub
            .unsubscribe(id, &name, kind);
        if removed {
            worker.shared.subscriptions[worker.id].fetch_sub(1, Ordering::AcqRel);
        }
        list_mut(sess, kind).retain(|c| *c != name);
        if reply {
            confirm(sess, kind, verb, Some(&name));
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
    info.ssub = sess.shard_channels.len();
}

/// Drops every subscription of a closing (or RESET) connection.
pub fn unsubscribe_all(sess: &mut Session) {
    if sess.subscriptions() > 0 {
        unsubscribe_from(sess, &[], Kind::Channel, false);
        unsubscribe_from(sess, &[], Kind::Pattern, false);
        unsubscribe_from(sess, &[], Kind::Shard, false);
    }
}

pub fn subscribe(sess: &mut Session, args: &[Bytes]) {
    subscribe_to(sess, &args[1..], Kind::Channel);
}

pub fn psubscribe(sess: &mut Session, args: &[Bytes]) {
    subscribe_to(sess, &args[1..], Kind::Pattern);
}

pub fn ssubscribe(sess: &mut Session, args: &[Bytes]) {
    subscribe_to(sess, &args[1..], Kind::Shard);
}

pub fn unsubscribe(sess: &mut Session, args: &[Bytes]) {
    unsubscribe_from(sess, &args[1..], Kind::Channel, true);
}

pub fn punsubscribe(sess: &mut Session, args: &[Bytes]) {
    unsubscribe_from(sess, &args[1..], Kind::Pattern, true);
}

pub fn sunsubscribe(sess: &mut Session, args: &[Bytes]) {
    unsubscribe_from(sess, &args[1..], Kind::Shard, true);
}

async_handler!(spublish, |sess, args| {
    let n =
        crate::pubsub::publish_counted(&sess.worker, args[1].clone(), args[2].clone(), true).await;
    if let Some(c) = &sess.worker.shared.cluster {
        // In cluster mode the other nodes of this shard hear it over the bus.
        c.publish(true, args[1].clone(), args[2].clone());
    } else if !sess.replaying {
        crate::repl::master::propagate_publish(&sess.worker, &args);
    }
    sess.out.int(n as i64);
});

async_handler!(publish, |sess, args| {
    let n =
        crate::pubsub::publish_counted(&sess.worker, args[1].clone(), args[2].clone(), false).await;
    // As Redis does, a master's messages reach its replicas' subscribers through the
    // replication stream (never the AOF); in cluster mode every node hears it over the
    // bus instead.
    if let Some(c) = &sess.worker.shared.cluster {
        c.publish(false, args[1].clone(), args[2].clone());
    } else if !sess.replaying {
        crate::repl::master::propagate_publish(&sess.worker, &args);
    }
    sess.out.int(n as i64);
});

pub const PUBSUB_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("channels", -2, "pubsub loading stale"),
    ("help", 2, "loading stale"),
    ("numpat", 2, "pubsub loading stale"),
    ("numsub", -2, "pubsub loading stale"),
    ("shardchannels", -2, "pubsub loading stale"),
    ("shardnumsub", -2, "pubsub loading stale"),
];

const PUBSUB_HELP: &[&str] = &[
    "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CHANNELS [<pattern>]",
    "    Channels with at least one subscriber, optionally matching a pattern.",
    "NUMPAT",
    "    How many patterns clients are subscribed to.",
    "NUMSUB [<channel> ...]",
    "    The number of subscribers of each channel.",
    "SHARDCHANNELS [<pattern>]",
    "    Shard channels with at least one subscriber, optionally matching a pattern.",
    "SHARDNUMSUB [<shardchannel> ...]",
    "    The number of subscribers of each shard channel.",
    "HELP",
    "    Print this help.",
];

async_handler!(pubsub, |sess, args| {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "channels" | "shardchannels" => {
            let shard = sub == "shardchannels";
            if args.len() > 3 {
                return sess.out.error(&super::arity_error(if shard {
                    "pubsub|shardchannels"
                } else {
                    "pubsub|channels"
                }));
            }
            let pattern = args.get(2).cloned();
            let names = broadcast(&sess.worker, move |w| {
                let clients = w.clients.borrow();
                clients
                    .pubsub
                    .channel_names(shard)
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
        "numsub" | "shardnumsub" => {
            let shard = sub == "shardnumsub";
            let channels: Vec<Bytes> = args[2..].to_vec();
            let query = channels.clone();
            let counts = broadcast(&sess.worker, move |w| {
                let clients = w.clients.borrow();
                query
                    .iter()
                    .map(|c| clients.pubsub.channel_subscribers(c, shard))
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
