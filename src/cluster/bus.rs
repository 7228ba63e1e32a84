//! The cluster bus: links to the other nodes, the cron, failure detection.

/// How long a forgotten node is kept out of gossip (Redis's blacklist TTL).
pub const FORGET_TTL_MS: u64 = 60_000;
