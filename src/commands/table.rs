//! The command table: every command Kite knows, in one place, with the metadata COMMAND
//! reports (arity, flags, key positions) and the function that runs it.

use bytes::Bytes;

use super::{
    acl, cluster, connection as conn, diagnostics as diag, geo, hashes, hyperloglog as hll, keys,
    kite, lists, lolwut, migrate, persistence, pubsub, replication, scripting, server, sets, sort,
    streams, strings, transactions as tx, zsets,
};
use super::{Command, Handler, Keys};
use Handler::{Async, Conn, Multi, Shard};

#[allow(clippy::too_many_arguments)]
fn c(
    name: &'static str,
    arity: i32,
    flags: &str,
    keys: Keys,
    group: &'static str,
    since: &'static str,
    summary: &'static str,
    handler: Handler,
) -> Command {
    Command {
        id: 0,
        name,
        arity,
        flags: super::flags::parse(flags),
        keys,
        group,
        since,
        summary,
        handler,
        subcommands: &[],
        block: None,
        spreads: None,
    }
}

fn spreading(mut cmd: Command, f: fn(&[Bytes]) -> bool) -> Command {
    cmd.spreads = Some(f);
    cmd
}

fn blocking(mut cmd: Command, spec: super::BlockSpecFn) -> Command {
    cmd.block = Some(spec);
    cmd
}

const NONE: Keys = Keys::None;
const K1: Keys = Keys::Range(1, 1, 1);
const K12: Keys = Keys::Range(1, 2, 1);
const KALL: Keys = Keys::Range(1, -1, 1);
const KPAIRS: Keys = Keys::Range(1, -1, 2);
/// Every argument but the last (BLPOP key... timeout).
const KBUTLAST: Keys = Keys::Range(1, -2, 1);

const GEORADIUS_KEYS: Keys = Keys::Custom(geo::georadius_keys, (1, 1, 1));
const SORT_KEYS: Keys = Keys::Custom(sort::sort_keys, (1, 1, 1));
const MIGRATE_KEYS: Keys = Keys::Custom(migrate::migrate_keys, (3, 3, 1));
const EVAL_KEYS: Keys = Keys::Custom(scripting::eval_keys, (0, 0, 0));

const ACL_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("cat", -2, "noscript loading stale"),
    ("deluser", -3, "admin noscript loading stale"),
    ("dryrun", -4, "admin noscript loading stale"),
    ("genpass", -2, "noscript loading stale"),
    ("getuser", 3, "admin noscript loading stale"),
    ("help", 2, "loading stale"),
    ("list", 2, "admin noscript loading stale"),
    ("load", 2, "admin noscript loading stale"),
    ("log", -2, "admin noscript loading stale"),
    ("save", 2, "admin noscript loading stale"),
    ("setuser", -3, "admin noscript loading stale"),
    ("users", 2, "admin noscript loading stale"),
    ("whoami", 2, "noscript loading stale"),
];

const SCRIPT_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("debug", 3, "noscript"),
    ("exists", -3, "noscript"),
    ("flush", -2, "noscript may_replicate"),
    ("help", 2, "loading stale"),
    ("kill", 2, "noscript allow_busy"),
    ("load", 3, "noscript may_replicate stale"),
];

const FUNCTION_SUBCOMMANDS: &[(&str, i32, &str)] = &[
    ("delete", 3, "noscript write"),
    ("dump", 2, "noscript"),
    ("flush", -2, "noscript write"),
    ("help", 2, "loading stale"),
    ("kill", 2, "noscript allow_busy"),
    ("list", -2, "noscript"),
    ("load", -3, "noscript write denyoom"),
    ("restore", -3, "noscript write denyoom"),
    ("stats", 2, "noscript allow_busy"),
];

/// OBJECT <subcommand> key: the key is the third argument, except for HELP.
fn object_keys(args: &[Bytes]) -> Vec<usize> {
    if args.len() > 2 {
        vec![2]
    } else {
        Vec::new()
    }
}

fn with_subcommands(
    mut cmd: Command,
    subs: &'static [(&'static str, i32, &'static str)],
) -> Command {
    cmd.subcommands = subs;
    cmd
}

#[rustfmt::skip]
pub fn all() -> Vec<Command> {
    vec![
        // Connection
        c("ping", -1, "fast", NONE, "connection", "1.0.0", "Answers PONG, or echoes its argument.", Conn(conn::ping)),
        c("echo", 2, "loading stale fast", NONE, "connection", "1.0.0", "Returns its argument.", Conn(conn::echo)),
        c("quit", -1, "allow_busy noscript loading stale fast no_auth noqueue", NONE, "connection", "1.0.0", "Closes the connection after replying.", Conn(conn::quit)),
        c("reset", 1, "noscript loading stale fast no_auth allow_busy noqueue", NONE, "connection", "6.2.0", "Returns the connection to its initial state.", Conn(conn::reset)),
        c("auth", -2, "noscript loading stale fast no_auth allow_busy", NONE, "connection", "1.0.0", "Authenticates the connection.", Conn(conn::auth)),
        c("select", 2, "loading stale fast", NONE, "connection", "1.0.0", "Changes the selected database.", Conn(conn::select)),
        c("hello", -1, "noscript loading stale fast no_auth allow_busy", NONE, "connection", "6.0.0", "Chooses the protocol version, optionally authenticating and naming the connection.", Conn(conn::hello)),
        with_subcommands(
            c("client", -2, "", NONE, "connection", "2.4.0", "Inspects and manages client connections.", Async(conn::client)),
            conn::CLIENT_SUBCOMMANDS,
        ),
        with_subcommands(
            c("acl", -2, "", NONE, "server", "6.0.0", "Manages ACL users and shows the ACL log.", Async(acl::acl)),
            ACL_SUBCOMMANDS,
        ),
        // Server
        c("info", -1, "loading stale", NONE, "server", "1.0.0", "Reports server information and statistics.", Async(server::info)),
        with_subcommands(
            c("config", -2, "", NONE, "server", "2.0.0", "Reads and changes configuration at run time.", Conn(server::config)),
            server::CONFIG_SUBCOMMANDS,
        ),
        with_subcommands(
            c("command", -1, "loading stale", NONE, "server", "2.8.13", "Describes the commands the server knows.", Conn(server::command)),
            server::COMMAND_SUBCOMMANDS,
        ),
        c("lolwut", -1, "readonly fast", NONE, "server", "5.0.0", "Draws computer art and shows the version.", Conn(lolwut::lolwut)),
        with_subcommands(
            c("module", -2, "", NONE, "server", "4.0.0", "Lists, loads and unloads modules (Kite runs none).", Conn(server::module)),
            server::MODULE_SUBCOMMANDS,
        ),
        // Cluster commands (cluster mode: src/cluster/, docs/cluster.md)
        with_subcommands(
            c("cluster", -2, "", NONE, "cluster", "3.0.0", "Cluster administration.", Async(cluster::cluster)),
            cluster::CLUSTER_SUBCOMMANDS,
        ),
        c("readonly", 1, "loading stale fast", NONE, "cluster", "3.0.0", "Lets a cluster replica serve this connection's reads of its master's slots.", Conn(cluster::readonly)),
        c("readwrite", 1, "loading stale fast", NONE, "cluster", "3.0.0", "Ends READONLY: reads go to the master again.", Conn(cluster::readwrite)),
        c("asking", 1, "fast", NONE, "cluster", "3.0.0", "Marks the next command as following an -ASK redirection.", Conn(cluster::asking)),
        c("time", 1, "loading stale fast", NONE, "server", "2.6.0", "Returns the server time.", Conn(server::time)),
        c("wait", 3, "noscript", NONE, "generic", "3.0.0", "Waits for replicas to acknowledge the connection's writes.", Async(replication::wait)),
        c("waitaof", 4, "noscript", NONE, "generic", "7.2.0", "Waits for the connection's writes to reach the AOF on disk, here and on replicas.", Async(replication::waitaof)),
        // Replication
        c("replicaof", 3, "admin noscript stale no_async_loading", NONE, "server", "5.0.0", "Makes the server a replica of another, or promotes it to a master.", Async(replication::replicaof)),
        c("slaveof", 3, "admin noscript stale no_async_loading", NONE, "server", "1.0.0", "Makes the server a replica of another, or promotes it to a master (the old name).", Async(replication::replicaof)),
        c("role", 1, "noscript loading stale fast", NONE, "server", "2.8.12", "Says whether this server is a master or a replica, with its replication state.", Async(replication::role)),
        c("replconf", -1, "admin noscript loading stale allow_busy", NONE, "server", "3.0.0", "An internal command for configuring the replication stream.", Conn(replication::replconf)),
        c("psync", -3, "admin noscript no_async_loading no_multi", NONE, "server", "2.8.0", "An internal command used in replication.", Async(replication::psync)),
        c("failover", -1, "admin noscript stale", NONE, "server", "6.2.0", "Starts a coordinated failover from this master to one of its replicas.", Async(replication::failover)),
        c("sync", 1, "admin noscript no_async_loading no_multi", NONE, "server", "1.0.0", "An internal command used in replication.", Async(replication::sync)),
        c("lastsave", 1, "loading stale fast", NONE, "server", "1.0.0", "Returns the unix time of the last save.", Conn(server::lastsave)),
        c("debug", -2, "admin noscript loading stale", NONE, "server", "1.0.0", "Debugging helpers.", Async(server::debug)),
        c("shutdown", -1, "admin noscript loading stale no_multi allow_busy", NONE, "server", "1.0.0", "Stops the server.", Async(persistence::shutdown)),
        c("save", 1, "admin noscript no_async_loading no_multi", NONE, "server", "1.0.0", "Synchronously saves the database(s) to disk.", Async(persistence::save)),
        c("bgrewriteaof", 1, "admin noscript no_async_loading", NONE, "server", "1.0.0", "Asynchronously rewrites the append-only file to disk.", Async(persistence::bgrewriteaof)),
        c("bgsave", -1, "admin noscript no_async_loading", NONE, "server", "1.0.0", "Asynchronously saves the database(s) to disk.", Async(persistence::bgsave)),
        with_subcommands(
            c("memory", -2, "", NONE, "server", "4.0.0", "Reports memory use.", Async(diag::memory)),
            diag::MEMORY_SUBCOMMANDS,
        ),
        c("monitor", 1, "admin noscript loading stale", NONE, "server", "1.0.0", "Streams every command the server runs.", Async(server::monitor)),
        with_subcommands(
            c("slowlog", -2, "", NONE, "server", "2.2.12", "Reads or resets the slow log.", Async(server::slowlog)),
            server::SLOWLOG_SUBCOMMANDS,
        ),
        with_subcommands(
            c("kite", -2, "", NONE, "server", "0.1.0", "Kite's own commands: the queues it tracks.", Async(kite::kite)),
            crate::observe::report::KITE_SUBCOMMANDS,
        ),
        with_subcommands(
            c("latency", -2, "", NONE, "server", "2.8.13", "Reports latency events.", Async(diag::latency)),
            diag::LATENCY_SUBCOMMANDS,
        ),
        c("dbsize", 1, "readonly fast", NONE, "server", "1.0.0", "Returns the number of keys in the selected database.", Async(keys::dbsize)),
        c("flushdb", -1, "write global", NONE, "server", "1.0.0", "Removes every key of the selected database.", Async(keys::flushdb)),
        c("flushall", -1, "write global", NONE, "server", "1.0.0", "Removes every key of every database.", Async(keys::flushall)),
        c("swapdb", 3, "write fast global", NONE, "server", "4.0.0", "Swaps two databases.", Async(keys::swapdb)),
        // Keyspace
        c("del", -2, "write", KALL, "generic", "1.0.0", "Deletes keys.", Multi(keys::del, keys::del_cross)),
        c("unlink", -2, "write fast", KALL, "generic", "4.0.0", "Deletes keys (memory reclaimed at once here too).", Multi(keys::del, keys::del_cross)),
        c("exists", -2, "readonly fast", KALL, "generic", "1.0.0", "Counts how many of the keys exist.", Multi(keys::exists, keys::exists_cross)),
        c("touch", -2, "readonly fast", KALL, "generic", "3.2.1", "Updates the access time of keys and counts those that exist.", Multi(keys::touch, keys::touch_cross)),
        c("type", 2, "readonly fast", K1, "generic", "1.0.0", "Returns the type of a key's value.", Shard(keys::type_)),
        c("rename", 3, "write", K12, "generic", "1.0.0", "Renames a key, replacing the target.", Multi(keys::rename, keys::rename_cross)),
        c("renamenx", 3, "write fast", K12, "generic", "1.0.0", "Renames a key unless the target exists.", Multi(keys::renamenx, keys::renamenx_cross)),
        c("copy", -3, "write denyoom", K12, "generic", "6.2.0", "Copies a key's value to another key.", Multi(keys::copy, keys::copy_cross)),
        c("move", 3, "write fast", K1, "generic", "1.0.0", "Moves a key to another database.", Shard(keys::move_)),
        c("dump", 2, "readonly", K1, "generic", "2.6.0", "Returns a serialized representation of the value stored at a key.", Shard(keys::dump)),
        c("restore", -4, "write denyoom", K1, "generic", "2.6.0", "Creates a key from the serialized representation of a value.", Shard(keys::restore)),
        c("restore-asking", -4, "write denyoom", K1, "server", "3.0.0", "RESTORE for a slot being imported (what MIGRATE sends in cluster mode).", Shard(keys::restore)),
        c("keys", 2, "readonly", NONE, "generic", "1.0.0", "Returns the keys matching a pattern.", Async(keys::keys)),
        c("scan", -2, "readonly", NONE, "generic", "2.8.0", "Iterates over the keyspace with a cursor.", Async(keys::scan)),
        c("randomkey", 1, "readonly", NONE, "generic", "1.0.0", "Returns a random key.", Async(keys::randomkey)),
        c("expire", -3, "write fast", K1, "generic", "1.0.0", "Sets a time to live in seconds.", Shard(keys::expire)),
        c("pexpire", -3, "write fast", K1, "generic", "2.6.0", "Sets a time to live in milliseconds.", Shard(keys::pexpire)),
        c("expireat", -3, "write fast", K1, "generic", "1.2.0", "Sets an expiry as a unix time in seconds.", Shard(keys::expireat)),
        c("pexpireat", -3, "write fast", K1, "generic", "2.6.0", "Sets an expiry as a unix time in milliseconds.", Shard(keys::pexpireat)),
        c("ttl", 2, "readonly fast", K1, "generic", "1.0.0", "Returns the time to live in seconds.", Shard(keys::ttl)),
        c("pttl", 2, "readonly fast", K1, "generic", "2.6.0", "Returns the time to live in milliseconds.", Shard(keys::pttl)),
        c("expiretime", 2, "readonly fast", K1, "generic", "7.0.0", "Returns the expiry as a unix time in seconds.", Shard(keys::expiretime)),
        c("pexpiretime", 2, "readonly fast", K1, "generic", "7.0.0", "Returns the expiry as a unix time in milliseconds.", Shard(keys::pexpiretime)),
        c("persist", 2, "write fast", K1, "generic", "2.2.0", "Removes a key's expiry.", Shard(keys::persist)),
        with_subcommands(
            c("object", -2, "readonly", Keys::Custom(object_keys, (2, 2, 1)), "generic", "2.2.3", "Inspects the internals of a key's value.", Shard(keys::object)),
            keys::OBJECT_SUBCOMMANDS,
        ),
        // Strings
        c("get", 2, "readonly fast", K1, "string", "1.0.0", "Returns the string value of a key.", Shard(strings::get)),
        c("set", -3, "write denyoom", K1, "string", "1.0.0", "Sets the string value of a key, with options.", Shard(strings::set)),
        c("getex", -2, "write fast", K1, "string", "6.2.0", "Returns a string value and changes its expiry.", Shard(strings::getex)),
        c("getdel", 2, "write fast", K1, "string", "6.2.0", "Returns a string value and deletes the key.", Shard(strings::getdel)),
        c("getset", 3, "write denyoom fast", K1, "string", "1.0.0", "Sets a string value and returns the old one.", Shard(strings::getset)),
        c("mget", -2, "readonly fast", KALL, "string", "1.0.0", "Returns the values of several keys.", Multi(strings::mget, strings::mget_cross)),
        c("mset", -3, "write denyoom", KPAIRS, "string", "1.0.1", "Sets several keys at once.", Multi(strings::mset, strings::mset_cross)),
        c("msetnx", -3, "write denyoom", KPAIRS, "string", "1.0.1", "Sets several keys only if none exists.", Multi(strings::msetnx, strings::msetnx_cross)),
        c("setnx", 3, "write denyoom fast", K1, "string", "1.0.0", "Sets a key only if it does not exist.", Shard(strings::setnx)),
        c("setex", 4, "write denyoom", K1, "string", "2.0.0", "Sets a value with a time to live in seconds.", Shard(strings::setex)),
        c("psetex", 4, "write denyoom", K1, "string", "2.6.0", "Sets a value with a time to live in milliseconds.", Shard(strings::psetex)),
        c("incr", 2, "write denyoom fast", K1, "string", "1.0.0", "Adds one to an integer value.", Shard(strings::incr)),
        c("decr", 2, "write denyoom fast", K1, "string", "1.0.0", "Subtracts one from an integer value.", Shard(strings::decr)),
        c("incrby", 3, "write denyoom fast", K1, "string", "1.0.0", "Adds to an integer value.", Shard(strings::incrby)),
        c("decrby", 3, "write denyoom fast", K1, "string", "1.0.0", "Subtracts from an integer value.", Shard(strings::decrby)),
        c("incrbyfloat", 3, "write denyoom fast", K1, "string", "2.6.0", "Adds to a floating point value.", Shard(strings::incrbyfloat)),
        c("append", 3, "write denyoom fast", K1, "string", "2.0.0", "Appends to a string value.", Shard(strings::append)),
        c("strlen", 2, "readonly fast", K1, "string", "2.2.0", "Returns the length of a string value.", Shard(strings::strlen)),
        c("getrange", 4, "readonly", K1, "string", "2.4.0", "Returns a substring of a string value.", Shard(strings::getrange)),
        c("substr", 4, "readonly", K1, "string", "1.0.0", "Returns a substring of a string value (old name of GETRANGE).", Shard(strings::getrange)),
        c("setrange", 4, "write denyoom", K1, "string", "2.2.0", "Overwrites part of a string value.", Shard(strings::setrange)),
        c("lcs", -3, "readonly", K12, "string", "7.0.0", "Finds the longest common subsequence of two string values.", Multi(strings::lcs, strings::lcs_cross)),
        c("setbit", 4, "write denyoom", K1, "bitmap", "2.2.0", "Sets or clears one bit.", Shard(strings::setbit)),
        c("getbit", 3, "readonly fast", K1, "bitmap", "2.2.0", "Returns one bit.", Shard(strings::getbit)),
        c("bitcount", -2, "readonly", K1, "bitmap", "2.6.0", "Counts set bits.", Shard(strings::bitcount)),
        c("bitpos", -3, "readonly", K1, "bitmap", "2.8.7", "Finds the first set or clear bit.", Shard(strings::bitpos)),
        c("bitop", -4, "write denyoom", Keys::Range(2, -1, 1), "bitmap", "2.6.0", "Combines string values bitwise into a key.", Multi(strings::bitop, strings::bitop_cross)),
        c("bitfield", -2, "write denyoom", K1, "bitmap", "3.2.0", "Reads and writes integer fields of a bitmap.", Shard(strings::bitfield)),
        c("bitfield_ro", -2, "readonly fast", K1, "bitmap", "6.0.0", "Reads integer fields of a bitmap.", Shard(strings::bitfield_ro)),
        // Lists
        c("lpush", -3, "write denyoom fast", K1, "list", "1.0.0", "Prepends values to a list.", Shard(lists::lpush)),
        c("rpush", -3, "write denyoom fast", K1, "list", "1.0.0", "Appends values to a list.", Shard(lists::rpush)),
        c("lpushx", -3, "write denyoom fast", K1, "list", "2.2.0", "Prepends values to an existing list.", Shard(lists::lpushx)),
        c("rpushx", -3, "write denyoom fast", K1, "list", "2.2.0", "Appends values to an existing list.", Shard(lists::rpushx)),
        c("lpop", -2, "write fast", K1, "list", "1.0.0", "Removes and returns the first elements of a list.", Shard(lists::lpop)),
        c("rpop", -2, "write fast", K1, "list", "1.0.0", "Removes and returns the last elements of a list.", Shard(lists::rpop)),
        c("llen", 2, "readonly fast", K1, "list", "1.0.0", "Returns the length of a list.", Shard(lists::llen)),
        c("lrange", 4, "readonly", K1, "list", "1.0.0", "Returns a range of a list.", Shard(lists::lrange)),
        c("lindex", 3, "readonly", K1, "list", "1.0.0", "Returns the element at an index of a list.", Shard(lists::lindex)),
        c("lset", 4, "write denyoom", K1, "list", "1.0.0", "Replaces the element at an index of a list.", Shard(lists::lset)),
        c("linsert", 5, "write denyoom", K1, "list", "2.2.0", "Inserts an element before or after another.", Shard(lists::linsert)),
        c("lrem", 4, "write", K1, "list", "1.0.0", "Removes elements equal to a value.", Shard(lists::lrem)),
        c("ltrim", 4, "write", K1, "list", "1.0.0", "Keeps only a range of a list.", Shard(lists::ltrim)),
        c("lpos", -3, "readonly", K1, "list", "6.0.6", "Finds the positions of an element.", Shard(lists::lpos)),
        c("lmove", 5, "write denyoom", K12, "list", "6.2.0", "Moves an element from one list to another.", Multi(lists::lmove, lists::lmove_cross)),
        c("rpoplpush", 3, "write denyoom", K12, "list", "1.2.0", "Moves the last element of a list to the head of another.", Multi(lists::lmove, lists::lmove_cross)),
        c("lmpop", -4, "write", Keys::Custom(lists::lmpop_keys, (0, 0, 0)), "list", "7.0.0", "Pops elements from the first non-empty list.", Multi(lists::lmpop, lists::lmpop_cross)),
        blocking(c("blpop", -3, "write blocking", KBUTLAST, "list", "2.0.0", "Pops the first element of the first non-empty list, waiting for one.", Multi(lists::blpop, lists::blpop_cross)), lists::bpop_call),
        blocking(c("brpop", -3, "write blocking", KBUTLAST, "list", "2.0.0", "Pops the last element of the first non-empty list, waiting for one.", Multi(lists::brpop, lists::brpop_cross)), lists::bpop_call),
        blocking(c("blmove", 6, "write denyoom blocking", K12, "list", "6.2.0", "Moves an element between lists, waiting for one.", Multi(lists::blmove, lists::blmove_cross)), lists::blmove_call),
        blocking(c("brpoplpush", 4, "write denyoom blocking", K12, "list", "2.2.0", "Moves the last element of a list to another, waiting for one.", Multi(lists::blmove, lists::blmove_cross)), lists::blmove_call),
        blocking(c("blmpop", -5, "write blocking", Keys::Custom(lists::blmpop_keys, (0, 0, 0)), "list", "7.0.0", "Pops elements from the first non-empty list, waiting for one.", Multi(lists::blmpop, lists::blmpop_cross)), lists::blmpop_call),
        // Pub/Sub
        c("subscribe", -2, "pubsub noscript loading stale", NONE, "pubsub", "2.0.0", "Listens for messages on channels.", Conn(pubsub::subscribe)),
        c("unsubscribe", -1, "pubsub noscript loading stale", NONE, "pubsub", "2.0.0", "Stops listening on channels.", Conn(pubsub::unsubscribe)),
        c("psubscribe", -2, "pubsub noscript loading stale", NONE, "pubsub", "2.0.0", "Listens for messages on channels matching patterns.", Conn(pubsub::psubscribe)),
        c("punsubscribe", -1, "pubsub noscript loading stale", NONE, "pubsub", "2.0.0", "Stops listening on patterns.", Conn(pubsub::punsubscribe)),
        c("publish", 3, "pubsub loading stale fast may_replicate", NONE, "pubsub", "2.0.0", "Sends a message to a channel's subscribers.", Async(pubsub::publish)),
        c("ssubscribe", -2, "pubsub noscript loading stale", NONE, "pubsub", "7.0.0", "Listens for messages on shard channels.", Conn(pubsub::ssubscribe)),
        c("sunsubscribe", -1, "pubsub noscript loading stale", NONE, "pubsub", "7.0.0", "Stops listening on shard channels.", Conn(pubsub::sunsubscribe)),
        c("spublish", 3, "pubsub loading stale fast may_replicate", NONE, "pubsub", "7.0.0", "Sends a message to a shard channel's subscribers.", Async(pubsub::spublish)),
        with_subcommands(
            c("pubsub", -2, "", NONE, "pubsub", "2.8.0", "Inspects the Pub/Sub state.", Async(pubsub::pubsub)),
            pubsub::PUBSUB_SUBCOMMANDS,
        ),
        // Hashes
        c("hset", -4, "write denyoom fast", K1, "hash", "2.0.0", "Sets fields of a hash, creating it when missing.", Shard(hashes::hset)),
        c("hsetnx", 4, "write denyoom fast", K1, "hash", "2.0.0", "Sets one hash field only when it is absent.", Shard(hashes::hsetnx)),
        c("hmset", -4, "write denyoom fast", K1, "hash", "2.0.0", "Sets fields of a hash (older form of HSET that answers OK).", Shard(hashes::hmset)),
        c("hget", 3, "readonly fast", K1, "hash", "2.0.0", "Returns the value of one hash field.", Shard(hashes::hget)),
        c("hmget", -3, "readonly fast", K1, "hash", "2.0.0", "Returns the values of several hash fields.", Shard(hashes::hmget)),
        c("hdel", -3, "write fast", K1, "hash", "2.0.0", "Removes fields from a hash.", Shard(hashes::hdel)),
        c("hexists", 3, "readonly fast", K1, "hash", "2.0.0", "Tells whether a hash field exists.", Shard(hashes::hexists)),
        c("hlen", 2, "readonly fast", K1, "hash", "2.0.0", "Counts the fields of a hash.", Shard(hashes::hlen)),
        c("hstrlen", 3, "readonly fast", K1, "hash", "3.2.0", "Returns the length of a hash field's value.", Shard(hashes::hstrlen)),
        c("hkeys", 2, "readonly", K1, "hash", "2.0.0", "Returns every field name of a hash.", Shard(hashes::hkeys)),
        c("hvals", 2, "readonly", K1, "hash", "2.0.0", "Returns every value of a hash.", Shard(hashes::hvals)),
        c("hgetall", 2, "readonly", K1, "hash", "2.0.0", "Returns every field and value of a hash.", Shard(hashes::hgetall)),
        c("hincrby", 4, "write denyoom fast", K1, "hash", "2.0.0", "Adds an integer to a hash field.", Shard(hashes::hincrby)),
        c("hincrbyfloat", 4, "write denyoom fast", K1, "hash", "2.6.0", "Adds a floating point number to a hash field.", Shard(hashes::hincrbyfloat)),
        c("hrandfield", -2, "readonly", K1, "hash", "6.2.0", "Returns random fields of a hash, optionally with values.", Shard(hashes::hrandfield)),
        c("migrate", -6, "write", MIGRATE_KEYS, "generic", "2.6.0", "Moves keys to another server, atomically here.", Async(migrate::migrate)),
        // SORT
        spreading(c("sort", -2, "write denyoom", SORT_KEYS, "generic", "1.0.0", "Sorts the elements of a list, set or sorted set, optionally storing the result.", Multi(sort::sort, sort::sort_cross)), sort::spreads),
        spreading(c("sort_ro", -2, "readonly", SORT_KEYS, "generic", "7.0.0", "Sorts the elements of a list, set or sorted set.", Multi(sort::sort, sort::sort_cross)), sort::spreads),
        // Geo
        c("geoadd", -5, "write denyoom", K1, "geo", "3.2.0", "Adds members with their longitude and latitude to a sorted set.", Shard(geo::geoadd)),
        c("geodist", -4, "readonly", K1, "geo", "3.2.0", "Returns the distance between two members.", Shard(geo::geodist)),
        c("geohash", -2, "readonly", K1, "geo", "3.2.0", "Returns members' positions as geohash strings.", Shard(geo::geohash)),
        c("geopos", -2, "readonly", K1, "geo", "3.2.0", "Returns members' longitude and latitude.", Shard(geo::geopos)),
        c("georadius", -6, "write denyoom", GEORADIUS_KEYS, "geo", "3.2.0", "Finds members within a radius of a point, optionally storing them.", Multi(geo::georadius, geo::georadius_cross)),
        c("georadius_ro", -6, "readonly", K1, "geo", "3.2.10", "Finds members within a radius of a point.", Shard(geo::georadius_ro)),
        c("georadiusbymember", -5, "write denyoom", GEORADIUS_KEYS, "geo", "3.2.0", "Finds members within a radius of a member, optionally storing them.", Multi(geo::georadiusbymember, geo::georadiusbymember_cross)),
        c("georadiusbymember_ro", -5, "readonly", K1, "geo", "3.2.10", "Finds members within a radius of a member.", Shard(geo::georadiusbymember_ro)),
        c("geosearch", -7, "readonly", K1, "geo", "6.2.0", "Finds members within a circle or a box.", Shard(geo::geosearch)),
        c("geosearchstore", -8, "write denyoom", K12, "geo", "6.2.0", "Finds members within a circle or a box and stores them.", Multi(geo::geosearchstore, geo::geosearchstore_cross)),
        // HyperLogLog
        c("pfadd", -2, "write denyoom fast", K1, "hyperloglog", "2.8.9", "Adds elements to a HyperLogLog, creating it when missing.", Shard(hll::pfadd)),
        c("pfcount", -2, "readonly may_replicate", KALL, "hyperloglog", "2.8.9", "Estimates the number of distinct elements added to one or more HyperLogLogs.", Multi(hll::pfcount, hll::pfcount_cross)),
        c("pfmerge", -2, "write denyoom", KALL, "hyperloglog", "2.8.9", "Merges HyperLogLogs into a destination.", Multi(hll::pfmerge, hll::pfmerge_cross)),
        c("pfdebug", 3, "write denyoom admin", Keys::Range(2, 2, 1), "hyperloglog", "2.8.9", "Internal commands for debugging HyperLogLog values.", Shard(hll::pfdebug)),
        c("pfselftest", 1, "admin", NONE, "hyperloglog", "2.8.9", "Runs the HyperLogLog self test.", Conn(hll::pfselftest)),
        c("hscan", -3, "readonly", K1, "hash", "2.8.0", "Iterates over the fields and values of a hash with a cursor.", Shard(hashes::hscan)),
        // Sets
        c("sadd", -3, "write denyoom fast", K1, "set", "1.0.0", "Adds members to a set.", Shard(sets::sadd)),
        c("srem", -3, "write fast", K1, "set", "1.0.0", "Removes members from a set.", Shard(sets::srem)),
        c("smembers", 2, "readonly", K1, "set", "1.0.0", "Returns every member of a set.", Shard(sets::smembers)),
        c("sismember", 3, "readonly fast", K1, "set", "1.0.0", "Tells whether a value is a member of a set.", Shard(sets::sismember)),
        c("smismember", -3, "readonly fast", K1, "set", "6.2.0", "Tells, for each value, whether it is a member of a set.", Shard(sets::smismember)),
        c("scard", 2, "readonly fast", K1, "set", "1.0.0", "Returns the number of members of a set.", Shard(sets::scard)),
        c("spop", -2, "write fast", K1, "set", "1.0.0", "Removes and returns random members of a set.", Shard(sets::spop)),
        c("srandmember", -2, "readonly", K1, "set", "1.0.0", "Returns random members of a set without removing them.", Shard(sets::srandmember)),
        c("smove", 4, "write fast", K12, "set", "1.0.0", "Moves a member from one set to another.", Multi(sets::smove, sets::smove_cross)),
        c("sinter", -2, "readonly", KALL, "set", "1.0.0", "Returns the members common to all the given sets.", Multi(sets::sinter, sets::sinter_cross)),
        c("sintercard", -3, "readonly", Keys::Custom(sets::sintercard_keys, (0, 0, 0)), "set", "7.0.0", "Counts the members common to all the given sets, up to a limit.", Multi(sets::sintercard, sets::sintercard_cross)),
        c("sinterstore", -3, "write denyoom", KALL, "set", "1.0.0", "Stores the intersection of sets in a key.", Multi(sets::sinterstore, sets::sinterstore_cross)),
        c("sunion", -2, "readonly", KALL, "set", "1.0.0", "Returns the members of any of the given sets.", Multi(sets::sunion, sets::sunion_cross)),
        c("sunionstore", -3, "write denyoom", KALL, "set", "1.0.0", "Stores the union of sets in a key.", Multi(sets::sunionstore, sets::sunionstore_cross)),
        c("sdiff", -2, "readonly", KALL, "set", "1.0.0", "Returns the members of the first set that are in none of the others.", Multi(sets::sdiff, sets::sdiff_cross)),
        c("sdiffstore", -3, "write denyoom", KALL, "set", "1.0.0", "Stores the difference of sets in a key.", Multi(sets::sdiffstore, sets::sdiffstore_cross)),
        c("sscan", -3, "readonly", K1, "set", "2.8.0", "Iterates over the members of a set with a cursor.", Shard(sets::sscan)),
        // Streams
        c("xadd", -5, "write denyoom fast", K1, "stream", "5.0.0", "Appends an entry to a stream, creating and trimming it as asked.", Shard(streams::xadd)),
        c("xlen", 2, "readonly fast", K1, "stream", "5.0.0", "Returns the number of entries in a stream.", Shard(streams::xlen)),
        c("xrange", -4, "readonly", K1, "stream", "5.0.0", "Returns the entries of a stream between two ids.", Shard(streams::xrange)),
        c("xrevrange", -4, "readonly", K1, "stream", "5.0.0", "Returns the entries of a stream between two ids, newest first.", Shard(streams::xrevrange)),
        c("xdel", -3, "write fast", K1, "stream", "5.0.0", "Deletes entries of a stream by id.", Shard(streams::xdel)),
        c("xtrim", -4, "write", K1, "stream", "5.0.0", "Drops the oldest entries of a stream by length or id.", Shard(streams::xtrim)),
        blocking(c("xread", -4, "readonly blocking", Keys::Custom(streams::xread_keys, (0, 0, 0)), "stream", "5.0.0", "Reads entries newer than given ids from one or more streams.", Multi(streams::xread, streams::xread_cross)), streams::xread_call),
        blocking(c("xreadgroup", -7, "write blocking", Keys::Custom(streams::xreadgroup_keys, (0, 0, 0)), "stream", "5.0.0", "Reads entries for a consumer of a group, recording them as pending.", Multi(streams::xreadgroup, streams::xreadgroup_cross)), streams::xreadgroup_call),
        with_subcommands(
            c("xgroup", -2, "", Keys::Custom(streams::container_keys, (0, 0, 0)), "stream", "5.0.0", "Creates, changes and removes consumer groups and consumers.", Shard(streams::xgroup)),
            streams::XGROUP_SUBCOMMANDS,
        ),
        c("xack", -4, "write fast", K1, "stream", "5.0.0", "Acknowledges pending entries of a consumer group.", Shard(streams::xack)),
        c("xpending", -3, "readonly", K1, "stream", "5.0.0", "Inspects the pending entries of a consumer group.", Shard(streams::xpending)),
        c("xclaim", -6, "write fast", K1, "stream", "5.0.0", "Gives pending entries to another consumer.", Shard(streams::xclaim)),
        c("xautoclaim", -6, "write fast", K1, "stream", "6.2.0", "Gives pending entries idle long enough to another consumer, scanning with a cursor.", Shard(streams::xautoclaim)),
        c("xsetid", -3, "write denyoom fast", K1, "stream", "5.0.0", "Sets the last id and counters of a stream.", Shard(streams::xsetid)),
        with_subcommands(
            c("xinfo", -2, "", Keys::Custom(streams::container_keys, (0, 0, 0)), "stream", "5.0.0", "Describes streams, their consumer groups and consumers.", Shard(streams::xinfo)),
            streams::XINFO_SUBCOMMANDS,
        ),
        // Sorted sets
        c("zadd", -4, "write denyoom fast", K1, "sorted-set", "1.2.0", "Adds members with scores, or updates their scores.", Shard(zsets::zadd)),
        c("zincrby", 4, "write denyoom fast", K1, "sorted-set", "1.2.0", "Adds to the score of a member.", Shard(zsets::zincrby)),
        c("zrem", -3, "write fast", K1, "sorted-set", "1.2.0", "Removes members.", Shard(zsets::zrem)),
        c("zcard", 2, "readonly fast", K1, "sorted-set", "1.2.0", "Returns the number of members.", Shard(zsets::zcard)),
        c("zcount", 4, "readonly fast", K1, "sorted-set", "2.0.0", "Counts the members within a score range.", Shard(zsets::zcount)),
        c("zlexcount", 4, "readonly fast", K1, "sorted-set", "2.8.9", "Counts the members within a lexicographical range.", Shard(zsets::zlexcount)),
        c("zscore", 3, "readonly fast", K1, "sorted-set", "1.2.0", "Returns the score of a member.", Shard(zsets::zscore)),
        c("zmscore", -3, "readonly fast", K1, "sorted-set", "6.2.0", "Returns the scores of several members.", Shard(zsets::zmscore)),
        c("zrank", -3, "readonly fast", K1, "sorted-set", "2.0.0", "Returns the position of a member, lowest score first.", Shard(zsets::zrank)),
        c("zrevrank", -3, "readonly fast", K1, "sorted-set", "2.0.0", "Returns the position of a member, highest score first.", Shard(zsets::zrevrank)),
        c("zrange", -4, "readonly", K1, "sorted-set", "1.2.0", "Returns members by rank, score or lexicographical range.", Shard(zsets::zrange)),
        c("zrangestore", -5, "write denyoom", K12, "sorted-set", "6.2.0", "Stores a range of a sorted set at another key.", Multi(zsets::zrangestore, zsets::zrangestore_cross)),
        c("zrangebyscore", -4, "readonly", K1, "sorted-set", "1.0.5", "Returns members within a score range.", Shard(zsets::zrangebyscore)),
        c("zrevrangebyscore", -4, "readonly", K1, "sorted-set", "2.2.0", "Returns members within a score range, highest first.", Shard(zsets::zrevrangebyscore)),
        c("zrangebylex", -4, "readonly", K1, "sorted-set", "2.8.9", "Returns members within a lexicographical range.", Shard(zsets::zrangebylex)),
        c("zrevrangebylex", -4, "readonly", K1, "sorted-set", "2.8.9", "Returns members within a lexicographical range, last first.", Shard(zsets::zrevrangebylex)),
        c("zrevrange", -4, "readonly", K1, "sorted-set", "1.2.0", "Returns members by rank, highest score first.", Shard(zsets::zrevrange)),
        c("zremrangebyscore", 4, "write", K1, "sorted-set", "1.2.0", "Removes the members within a score range.", Shard(zsets::zremrangebyscore)),
        c("zremrangebyrank", 4, "write", K1, "sorted-set", "2.0.0", "Removes the members within a rank range.", Shard(zsets::zremrangebyrank)),
        c("zremrangebylex", 4, "write", K1, "sorted-set", "2.8.9", "Removes the members within a lexicographical range.", Shard(zsets::zremrangebylex)),
        blocking(c("bzpopmin", -3, "write blocking fast", KBUTLAST, "sorted-set", "5.0.0", "Pops the lowest-scored member of the first non-empty sorted set, waiting for one.", Multi(zsets::bzpopmin, zsets::bzpopmin_cross)), zsets::bzpop_call),
        blocking(c("bzpopmax", -3, "write blocking fast", KBUTLAST, "sorted-set", "5.0.0", "Pops the highest-scored member of the first non-empty sorted set, waiting for one.", Multi(zsets::bzpopmax, zsets::bzpopmax_cross)), zsets::bzpop_call),
        blocking(c("bzmpop", -5, "write blocking", Keys::Custom(zsets::bzmpop_keys, (0, 0, 0)), "sorted-set", "7.0.0", "Pops members from the first non-empty sorted set, waiting for one.", Multi(zsets::bzmpop, zsets::bzmpop_cross)), zsets::bzmpop_call),
        c("zpopmin", -2, "write fast", K1, "sorted-set", "5.0.0", "Removes and returns the members with the lowest scores.", Shard(zsets::zpopmin)),
        c("zpopmax", -2, "write fast", K1, "sorted-set", "5.0.0", "Removes and returns the members with the highest scores.", Shard(zsets::zpopmax)),
        c("zmpop", -4, "write", Keys::Custom(zsets::zmpop_keys, (0, 0, 0)), "sorted-set", "7.0.0", "Pops members from the first non-empty sorted set of several.", Multi(zsets::zmpop, zsets::zmpop_cross)),
        c("zunion", -3, "readonly", Keys::Custom(zsets::numkeys_keys, (0, 0, 0)), "sorted-set", "6.2.0", "Returns the union of sorted sets.", Multi(zsets::zunion, zsets::zunion_cross)),
        c("zinter", -3, "readonly", Keys::Custom(zsets::numkeys_keys, (0, 0, 0)), "sorted-set", "6.2.0", "Returns the intersection of sorted sets.", Multi(zsets::zinter, zsets::zinter_cross)),
        c("zdiff", -3, "readonly", Keys::Custom(zsets::numkeys_keys, (0, 0, 0)), "sorted-set", "6.2.0", "Returns the members of the first sorted set absent from the others.", Multi(zsets::zdiff, zsets::zdiff_cross)),
        c("zintercard", -3, "readonly", Keys::Custom(zsets::numkeys_keys, (0, 0, 0)), "sorted-set", "7.0.0", "Counts the members of the intersection of sorted sets.", Multi(zsets::zintercard, zsets::zintercard_cross)),
        c("zunionstore", -4, "write denyoom", Keys::Custom(zsets::store_numkeys_keys, (1, 1, 1)), "sorted-set", "2.0.0", "Stores the union of sorted sets.", Multi(zsets::zunionstore, zsets::zunionstore_cross)),
        c("zinterstore", -4, "write denyoom", Keys::Custom(zsets::store_numkeys_keys, (1, 1, 1)), "sorted-set", "2.0.0", "Stores the intersection of sorted sets.", Multi(zsets::zinterstore, zsets::zinterstore_cross)),
        c("zdiffstore", -4, "write denyoom", Keys::Custom(zsets::store_numkeys_keys, (1, 1, 1)), "sorted-set", "6.2.0", "Stores the difference of sorted sets.", Multi(zsets::zdiffstore, zsets::zdiffstore_cross)),
        c("zrandmember", -2, "readonly", K1, "sorted-set", "6.2.0", "Returns random members.", Shard(zsets::zrandmember)),
        c("zscan", -3, "readonly", K1, "sorted-set", "2.8.0", "Iterates over members and scores with a cursor.", Shard(zsets::zscan)),
        // Transactions
        c("multi", 1, "noscript loading stale fast allow_busy noqueue", NONE, "transactions", "1.2.0", "Starts a transaction.", Conn(tx::multi)),
        c("exec", 1, "noscript loading stale skip_slowlog noqueue", NONE, "transactions", "1.2.0", "Runs the queued commands atomically.", Async(tx::exec)),
        c("discard", 1, "noscript loading stale fast allow_busy noqueue", NONE, "transactions", "2.0.0", "Drops the queued commands.", Conn(tx::discard)),
        c("watch", -2, "noscript loading stale fast allow_busy noqueue", KALL, "transactions", "2.2.0", "Makes the next EXEC conditional on keys staying unchanged.", Async(tx::watch)),
        c("unwatch", 1, "noscript loading stale fast allow_busy", NONE, "transactions", "2.2.0", "Forgets all watched keys.", Conn(tx::unwatch)),
        // Scripting
        c("eval", -3, "noscript skip_monitor may_replicate stale no_mandatory_keys", EVAL_KEYS, "scripting", "2.6.0", "Runs a Lua script.", Async(scripting::eval)),
        c("evalsha", -3, "noscript skip_monitor may_replicate stale no_mandatory_keys", EVAL_KEYS, "scripting", "2.6.0", "Runs a cached Lua script by its SHA1.", Async(scripting::evalsha)),
        c("eval_ro", -3, "noscript skip_monitor stale readonly no_mandatory_keys", EVAL_KEYS, "scripting", "7.0.0", "Runs a read-only Lua script.", Async(scripting::eval_ro)),
        c("evalsha_ro", -3, "noscript skip_monitor stale readonly no_mandatory_keys", EVAL_KEYS, "scripting", "7.0.0", "Runs a cached read-only Lua script by its SHA1.", Async(scripting::evalsha_ro)),
        c("fcall", -3, "noscript skip_monitor may_replicate stale no_mandatory_keys", EVAL_KEYS, "scripting", "7.0.0", "Calls a function.", Async(scripting::fcall)),
        c("fcall_ro", -3, "noscript skip_monitor stale readonly no_mandatory_keys", EVAL_KEYS, "scripting", "7.0.0", "Calls a read-only function.", Async(scripting::fcall_ro)),
        with_subcommands(
            c("script", -2, "", NONE, "scripting", "2.6.0", "Manages the script cache.", Async(scripting::script)),
            SCRIPT_SUBCOMMANDS,
        ),
        with_subcommands(
            c("function", -2, "", NONE, "scripting", "7.0.0", "Manages function libraries.", Async(scripting::function)),
            FUNCTION_SUBCOMMANDS,
        ),
    ]
}
