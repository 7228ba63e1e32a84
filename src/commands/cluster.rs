//! The cluster command family as a server with `cluster-enabled no` answers it: CLUSTER,
//! READONLY, READWRITE and ASKING are known (so ACL rules, COMMAND and clients that probe
//! for cluster mode see them) and say that cluster support is disabled, as Redis does.
//! Cluster mode itself is issue 16.

use bytes::Bytes;

use crate::server::session::Session;

pub const CLUSTER_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("addslots", -3, "admin stale no_async_loading"),
    ("addslotsrange", -4, "admin stale no_async_loading"),
    ("bumpepoch", 2, "admin stale no_async_loading"),
    ("count-failure-reports", 3, "admin stale"),
    ("countkeysinslot", 3, "stale"),
    ("delslots", -3, "admin stale no_async_loading"),
    ("delslotsrange", -4, "admin stale no_async_loading"),
    ("failover", -2, "admin stale no_async_loading"),
    ("flushslots", 2, "admin stale no_async_loading"),
    ("forget", 3, "admin stale no_async_loading"),
    ("getkeysinslot", 4, "stale"),
    ("help", 2, "loading stale"),
    ("info", 2, "stale"),
    ("keyslot", 3, "stale"),
    ("links", 2, "stale"),
    ("meet", -4, "admin stale no_async_loading"),
    ("myid", 2, "stale"),
    ("myshardid", 2, "stale"),
    ("nodes", 2, "stale"),
    ("replicas", 3, "admin stale"),
    ("replicate", 3, "admin stale no_async_loading"),
    ("reset", -2, "admin stale noscript"),
    ("saveconfig", 2, "admin stale no_async_loading"),
    ("set-config-epoch", 3, "admin stale no_async_loading"),
    ("setslot", -4, "admin stale no_async_loading"),
    ("shards", 2, "stale"),
    ("slaves", 3, "admin stale"),
    ("slots", 2, "stale"),
];

const DISABLED: &str = "ERR This instance has cluster support disabled";

/// CLUSTER, READONLY, READWRITE, ASKING.
pub fn disabled(sess: &mut Session, _args: &[Bytes]) {
    sess.error(DISABLED);
}
