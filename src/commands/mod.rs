//! Commands: the table (in `table.rs`), routing to shards, and one file per family.

pub mod acl;
pub mod cluster;
pub mod connection;
pub mod diagnostics;
pub mod geo;
pub mod hashes;
pub mod hyperloglog;
pub mod keys;
pub mod keyspecs;
pub mod kite;
pub mod lists;
pub mod lolwut;
pub mod migrate;
pub mod persistence;
pub mod pubsub;
pub mod replication;
pub mod scripting;
pub mod server;
pub mod sets;
pub mod sort;
pub mod streams;
pub mod strings;
pub mod table;
pub mod transactions;
pub mod util;
pub mod zsets;

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use bytes::Bytes;
use hashbrown::HashMap;

use crate::server::session::Session;
use crate::shard::tx::Tx;
use crate::shard::{exec_here_for, run_batch_on, ExecCtx};

pub type LocalBoxFuture<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Runs on the shard that owns every key of the command.
pub type ExecFn = fn(&mut ExecCtx, &[Bytes]);
/// Runs on the connection's thread, synchronously (connection state, no keys).
pub type ConnFn = fn(&mut Session, &[Bytes]);
/// Runs on the connection's thread and may talk to other shards.
pub type AsyncFn = for<'a> fn(&'a mut Session, Vec<Bytes>) -> LocalBoxFuture<'a>;
/// Runs a command whose keys span shards, under a transaction holding all its keys.
pub type CrossFn = for<'a> fn(&'a mut Session, Vec<Bytes>, &'a Tx) -> LocalBoxFuture<'a>;

#[derive(Clone, Copy)]
pub enum Handler {
    Shard(ExecFn),
    /// A multi-key command: the shard form when all keys share a shard, else the cross form.
    Multi(ExecFn, CrossFn),
    Conn(ConnFn),
    Async(AsyncFn),
}

/// Where a command's keys are.
#[derive(Clone, Copy)]
pub enum Keys {
    None,
    /// first, last (negative counts from the end), step: as COMMAND INFO reports.
    Range(i32, i32, i32),
    /// Keys found by parsing the arguments; also returns the COMMAND INFO triple.
    Custom(fn(&[Bytes]) -> Vec<usize>, (i32, i32, i32)),
}

pub mod flags {
    pub const WRITE: u32 = 1;
    pub const READONLY: u32 = 1 << 1;
    pub const DENYOOM: u32 = 1 << 2;
    pub const ADMIN: u32 = 1 << 3;
    pub const PUBSUB: u32 = 1 << 4;
    pub const NOSCRIPT: u32 = 1 << 5;
    pub const BLOCKING: u32 = 1 << 6;
    pub const LOADING: u32 = 1 << 7;
    pub const STALE: u32 = 1 << 8;
    pub const SKIP_MONITOR: u32 = 1 << 9;
    pub const SKIP_SLOWLOG: u32 = 1 << 10;
    pub const FAST: u32 = 1 << 11;
    pub const NO_AUTH: u32 = 1 << 12;
    pub const MAY_REPLICATE: u32 = 1 << 13;
    /// Executed at once even inside MULTI (EXEC, DISCARD, MULTI, WATCH, QUIT, RESET).
    pub const NO_QUEUE: u32 = 1 << 14;
    pub const NO_MULTI: u32 = 1 << 15;
    pub const ALLOW_BUSY: u32 = 1 << 16;
    /// Touches every shard (FLUSHALL, SWAPDB...): inside a transaction it locks them whole.
    pub const GLOBAL: u32 = 1 << 17;
    pub const NO_ASYNC_LOADING: u32 = 1 << 18;
    /// Scripts and functions: may name no key at all (Redis's NO_MANDATORY_KEYS); they
    /// are also shown to MONITOR by their own handler's rule, before what they run.
    pub const NO_MANDATORY_KEYS: u32 = 1 << 19;

    pub const NAMES: &[(u32, &str)] = &[
        (WRITE, "write"),
        (READONLY, "readonly"),
        (DENYOOM, "denyoom"),
        (ADMIN, "admin"),
        (PUBSUB, "pubsub"),
        (NOSCRIPT, "noscript"),
        (BLOCKING, "blocking"),
        (LOADING, "loading"),
        (STALE, "stale"),
        (SKIP_MONITOR, "skip_monitor"),
        (SKIP_SLOWLOG, "skip_slowlog"),
        (FAST, "fast"),
        (NO_AUTH, "no_auth"),
        (MAY_REPLICATE, "may_replicate"),
        (NO_MULTI, "no_multi"),
        (ALLOW_BUSY, "allow_busy"),
        (NO_ASYNC_LOADING, "no_async_loading"),
        (NO_MANDATORY_KEYS, "no_mandatory_keys"),
    ];

    pub fn parse(s: &str) -> u32 {
        let mut f = 0;
        for word in s.split_whitespace() {
            match word {
                "noqueue" => f |= NO_QUEUE,
                "global" => f |= GLOBAL,
                w => {
                    f |= NAMES
                        .iter()
                        .find(|(_, n)| *n == w)
                        .unwrap_or_else(|| panic!("unknown command flag {w}"))
                        .0
                }
            }
        }
        f
    }
}

pub struct Command {
    pub id: usize,
    pub name: &'static str,
    pub arity: i32,
    pub flags: u32,
    pub keys: Keys,
    pub group: &'static str,
    pub since: &'static str,
    pub summary: &'static str,
    pub handler: Handler,
    /// Subcommands of a container command (CLIENT, CONFIG...), for COMMAND's replies.
    pub subcommands: &'static [(&'static str, i32, &'static str)],
    /// For blocking commands: how they block. Inside MULTI (and scripts) they run their
    /// handler instead, which never blocks.
    pub block: Option<BlockSpecFn>,
    /// For commands that read keys no argument names (SORT's BY and GET patterns): true
    /// when this call does, so it runs on the multi-shard path with every shard held.
    pub spreads: Option<fn(&[Bytes]) -> bool>,
}

/// Parses a blocking command into what the blocking machinery needs; None when this call
/// does not block (XREAD without BLOCK).
pub type BlockSpecFn = fn(&[Bytes]) -> Result<Option<crate::blocking::BlockCall>, String>;

impl Command {
    #[inline]
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    pub fn arity_ok(&self, argc: usize) -> bool {
        let a = self.arity;
        if a >= 0 {
            argc == a as usize
        } else {
            argc >= (-a) as usize
        }
    }

    /// Indices of the key arguments of `args` (the command name is index 0).
    pub fn key_positions(&self, args: &[Bytes]) -> Vec<usize> {
        match self.keys {
            Keys::None => Vec::new(),
            Keys::Range(first, last, step) => {
                range_positions(first, last, step, args.len()).collect()
            }
            Keys::Custom(f, _) => f(args),
        }
    }

    /// Whether `test` holds for every key argument of `args`, stopping at the first that
    /// fails; a key range is walked without the vector `key_positions` builds.
    pub fn keys_all<'a>(&self, args: &'a [Bytes], mut test: impl FnMut(&'a [u8]) -> bool) -> bool {
        match self.keys {
            Keys::None => true,
            Keys::Range(first, last, step) => {
                range_positions(first, last, step, args.len()).all(|i| test(&args[i]))
            }
            Keys::Custom(f, _) => f(args).into_iter().all(|i| test(&args[i])),
        }
    }

    pub fn key_spec(&self) -> (i32, i32, i32) {
        match self.keys {
            Keys::None => (0, 0, 0),
            Keys::Range(a, b, c) => (a, b, c),
            Keys::Custom(_, spec) => spec,
        }
    }

    /// The function that runs this command on a shard, if it is a keyed command.
    pub fn exec_fn(&self) -> Option<ExecFn> {
        match self.handler {
            Handler::Shard(f) | Handler::Multi(f, _) => Some(f),
            _ => None,
        }
    }
}

/// The key positions of a `Keys::Range` over `argc` arguments, without a vector.
fn range_positions(first: i32, last: i32, step: i32, argc: usize) -> impl Iterator<Item = usize> {
    let argc = argc as i32;
    let last = if last < 0 {
        argc + last
    } else {
        last.min(argc - 1)
    };
    let end = last.min(argc - 1);
    (first..=end)
        .step_by(step.max(1) as usize)
        .filter(|&i| i >= 0)
        .map(|i| i as usize)
}

pub struct CommandTable {
    pub commands: Vec<Command>,
    by_name: NameIndex,
    /// "client|list" and the like, for CLIENT LIST's `cmd=` field.
    full_names: HashMap<(usize, &'static str), &'static str>,
}

static TABLE: OnceLock<CommandTable> = OnceLock::new();

/// Command names to table positions by a perfect hash: a name of up to 23 bytes is packed,
/// ASCII case folded, into three words, and a multiply-shift of them (with a multiplier
/// searched for at start-up so that no two commands share a slot) picks the one slot to
/// look at; the name is then checked by comparing three words. Every request does one
/// lookup, so it costs no probe loop and no byte-by-byte compare.
struct NameIndex {
    slots: Vec<u16>,
    /// Each command's name packed as `pack` packs a request's, by command id.
    packed: Vec<[u64; 3]>,
    multiplier: u64,
    shift: u32,
}

/// Longest command name the index can hold (Redis's longest is 20 bytes): the last of
/// the 24 bytes holds the length.
const NAME_MAX: usize = 23;

/// Each ASCII capital of the eight bytes made small, every other byte left as it is.
#[inline]
fn ascii_lowercase_word(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let low7 = w & (0x7f * ONES);
    // A byte's top bit after each sum: its low seven bits are at least 'A', past 'Z'.
    let from_a = low7 + (0x80 - u64::from(b'A')) * ONES;
    let past_z = low7 + (0x80 - u64::from(b'Z') - 1) * ONES;
    // Capitals only among bytes whose own top bit is clear.
    let capitals = from_a & !past_z & !w & (0x80 * ONES);
    w | (capitals >> 2)
}

impl NameIndex {
    /// The name's bytes, ASCII case folded, little-endian in three words, zero past the
    /// end, and its length in the last byte (so "get" and "get\0" differ). Built from a
    /// few overlapping loads rather than byte by byte: a name is packed per request.
    #[inline]
    fn pack(name: &[u8]) -> Option<[u64; 3]> {
        let len = name.len();
        let word = |at: usize| u64::from_le_bytes(name[at..at + 8].try_into().expect("8 bytes"));
        let fold = ascii_lowercase_word;
        let mut words = match len {
            1..=3 => {
                let b = |i: usize| u64::from(name[i]) << (i * 8);
                [fold(b(0) | b(len / 2) | b(len - 1)), 0, 0]
            }
            4..=8 => {
                let half = |at: usize| {
                    u64::from(u32::from_le_bytes(
                        name[at..at + 4].try_into().expect("4 bytes"),
                    ))
                };
                [fold(half(0) | half(len - 4) << ((len - 4) * 8)), 0, 0]
            }
            9..=16 => [fold(word(0)), fold(word(len - 8) >> ((16 - len) * 8)), 0],
            17..=NAME_MAX => [
                fold(word(0)),
                fold(word(8)),
                fold(word(len - 8) >> ((24 - len) * 8)),
            ],
            _ => return None,
        };
        words[2] |= (len as u64) << 56;
        Some(words)
    }

    #[inline]
    fn slot(words: &[u64; 3], multiplier: u64, shift: u32) -> usize {
        let mixed = words[0] ^ words[1].rotate_left(21) ^ words[2].rotate_left(42);
        (mixed.wrapping_mul(multiplier) >> shift) as usize
    }

    fn new(commands: &[Command]) -> NameIndex {
        let packed: Vec<[u64; 3]> = commands
            .iter()
            .map(|c| {
                assert!(
                    !c.name.bytes().any(|b| b.is_ascii_uppercase()),
                    "command names are lowercase: {}",
                    c.name
                );
                Self::pack(c.name.as_bytes()).expect("command names fit the index")
            })
            .collect();
        // A table 32 times the commands finds a multiplier in a few dozen tries; a
        // bigger one is taken only if none was found.
        let mut bits = (commands.len() * 32).next_power_of_two().trailing_zeros();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        loop {
            let shift = 64 - bits;
            for _ in 0..1000 {
                // splitmix64's step, made odd: a multiplier for multiply-shift.
                seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = seed;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                let multiplier = (z ^ (z >> 31)) | 1;
                let mut slots = vec![u16::MAX; 1 << bits];
                let placed = packed.iter().enumerate().all(|(id, words)| {
                    let slot = &mut slots[Self::slot(words, multiplier, shift)];
                    let free = *slot == u16::MAX;
                    *slot = id as u16;
                    free
                });
                if placed {
                    return NameIndex {
                        slots,
                        packed,
                        multiplier,
                        shift,
                    };
                }
            }
            bits += 1;
            assert!(bits <= 20, "no perfect hash for the command names");
        }
    }

    #[inline]
    fn find<'a>(&self, commands: &'a [Command], name: &[u8]) -> Option<&'a Command> {
        let words = Self::pack(name)?;
        let id = self.slots[Self::slot(&words, self.multiplier, self.shift)];
        (self.packed.get(id as usize) == Some(&words)).then(|| &commands[id as usize])
    }
}

pub fn table() -> &'static CommandTable {
    TABLE.get_or_init(|| {
        let mut commands = table::all();
        for (i, c) in commands.iter_mut().enumerate() {
            c.id = i;
        }
        let by_name = NameIndex::new(&commands);
        let mut full_names = HashMap::new();
        for c in &commands {
            for (sub, _, _) in c.subcommands {
                let full: &'static str = Box::leak(format!("{}|{}", c.name, sub).into_boxed_str());
                full_names.insert((c.id, *sub), full);
            }
        }
        CommandTable {
            commands,
            by_name,
            full_names,
        }
    })
}

impl CommandTable {
    /// Finds a command by name, case-insensitively, without allocating.
    #[inline]
    pub fn lookup(&'static self, name: &[u8]) -> Option<&'static Command> {
        self.by_name.find(&self.commands, name)
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.commands.len()
    }

    /// The name CLIENT LIST shows for a call: `get`, or `client|list` for a subcommand.
    pub fn display_name(&self, cmd: &'static Command, args: &[Bytes]) -> &'static str {
        if cmd.subcommands.is_empty() || args.len() < 2 {
            return cmd.name;
        }
        let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
        cmd.subcommands
            .iter()
            .find(|(n, _, _)| *n == sub)
            .and_then(|(n, _, _)| self.full_names.get(&(cmd.id, *n)).copied())
            .unwrap_or(cmd.name)
    }
}

/// Where a keyed command runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Route {
    /// No keys: on the connection's thread.
    Here,
    /// Every key on this shard.
    Shard(usize),
    /// Keys on several shards.
    Spread,
}

/// Finds the shard(s) of a command's keys.
pub fn route(sess: &Session, cmd: &Command, args: &[Bytes]) -> Route {
    // (A command that `spreads` never has a single-key range: SORT and SORT_RO find
    // their keys by parsing, so the check below is reached.)
    if let Keys::Range(first, last, _) = cmd.keys {
        if first == last && (first as usize) < args.len() {
            return Route::Shard(sess.worker.shard_of(&args[first as usize]));
        }
    }
    if let Some(spreads) = cmd.spreads {
        if sess.worker.nshards() > 1 && spreads(args) {
            return Route::Spread;
        }
    }
    // A plain range (BRPOP's keys, MGET's) is walked without collecting its positions.
    match cmd.keys {
        Keys::Range(first, last, step) => {
            same_shard(sess, range_positions(first, last, step, args.len()), args)
        }
        _ => same_shard(sess, cmd.key_positions(args).into_iter(), args),
    }
}

/// The shard of keys at `positions` when they share one: `Here` without keys.
fn same_shard(sess: &Session, mut positions: impl Iterator<Item = usize>, args: &[Bytes]) -> Route {
    let Some(first) = positions.next() else {
        return Route::Here;
    };
    let shard = sess.worker.shard_of(&args[first]);
    for p in positions {
        if sess.worker.shard_of(&args[p]) != shard {
            return Route::Spread;
        }
    }
    Route::Shard(shard)
}

/// The text of a C string argument as Redis's `%s` prints it: up to the first NUL.
fn c_str(b: &[u8]) -> &[u8] {
    b.iter().position(|&c| c == 0).map_or(b, |n| &b[..n])
}

/// The error for an unknown command, byte for byte as Redis builds it: the name and the
/// arguments printed as C strings, the arguments cut to 128 bytes in all.
pub fn unknown_command_error(args: &[Bytes]) -> Vec<u8> {
    let name = c_str(&args[0]);
    let mut list: Vec<u8> = Vec::new();
    for a in &args[1..] {
        if list.len() >= 128 {
            break;
        }
        let a = c_str(a);
        let take = a.len().min(128 - list.len());
        list.push(b'\'');
        list.extend_from_slice(&a[..take]);
        list.extend_from_slice(b"' ");
    }
    let mut msg = b"ERR unknown command '".to_vec();
    msg.extend_from_slice(&name[..name.len().min(128)]);
    msg.extend_from_slice(b"', with args beginning with: ");
    msg.extend_from_slice(&list);
    msg
}

pub fn arity_error(name: &str) -> String {
    format!("ERR wrong number of arguments for '{}' command", name)
}

/// Checks a container command's subcommand name and arity, as Redis 7 does before
/// running it.
pub fn check_subcommand(cmd: &Command, args: &[Bytes]) -> Result<(), String> {
    // A container that runs bare (COMMAND) has nothing to check.
    let Some(first) = args.get(1) else {
        return Ok(());
    };
    let sub = String::from_utf8_lossy(first).to_ascii_lowercase();
    match cmd.subcommands.iter().find(|(n, _, _)| *n == sub) {
        None => Err(format!(
            "ERR unknown subcommand '{}'. Try {} HELP.",
            util::printable(&args[1], 128),
            cmd.name.to_ascii_uppercase()
        )),
        Some((name, arity, _)) => {
            let ok = if *arity >= 0 {
                args.len() == *arity as usize
            } else {
                args.len() >= (-*arity) as usize
            };
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "ERR wrong number of arguments for '{}|{}' command",
                    cmd.name, name
                ))
            }
        }
    }
}

/// Whether the subcommand called (XGROUP CREATE, SCRIPT KILL...) carries `flag` in the
/// table.
pub fn subcommand_has(cmd: &Command, args: &[Bytes], flag: &str) -> bool {
    if cmd.subcommands.is_empty() || args.len() < 2 {
        return false;
    }
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    cmd.subcommands
        .iter()
        .any(|(n, _, f)| *n == sub && f.split_whitespace().any(|w| w == flag))
}

/// What still runs while a script is past the busy threshold: SCRIPT KILL, FUNCTION
/// KILL and STATS, SHUTDOWN and the connection commands flagged `allow_busy`.
fn allowed_while_busy(cmd: &Command, args: &[Bytes]) -> bool {
    if cmd.name == "shutdown" {
        // Only SHUTDOWN NOSAVE: a save would need the busy shard.
        return args.len() == 2 && args[1].eq_ignore_ascii_case(b"nosave");
    }
    cmd.has(flags::ALLOW_BUSY) || subcommand_has(cmd, args, "allow_busy")
}

/// While a script is past the busy threshold on some thread, whether this command needs
/// that thread: keys on its shard, or work that reaches every shard (server commands,
/// scripts, EXEC). Connection commands (but PING) and commands whose keys all live on
/// other shards go on being served: a script is atomic for its own shard only.
fn needs_busy_shard(sess: &Session, cmd: &Command, args: &[Bytes]) -> bool {
    use crate::scripting::run::{BUSY_RUNNING, KIND_GLOBAL};
    use std::sync::atomic::Ordering::Acquire;
    let shared = &sess.worker.shared;
    let running = |s: usize| shared.busy[s].load(Acquire) >= BUSY_RUNNING;
    // A script holding other shards' keys holds them all as far as BUSY goes.
    let global = (0..shared.busy.len())
        .any(|s| running(s) && shared.busy_kind[s].load(Acquire) & KIND_GLOBAL != 0);
    let busy = |s: usize| global || running(s);
    match cmd.handler {
        // PING is the health check (Sentinel, probes): it reports the busy server as
        // Redis does, and Sentinel answers a BUSY master with SCRIPT KILL.
        Handler::Conn(_) => cmd.name == "ping",
        Handler::Shard(_) | Handler::Multi(..) => cmd
            .key_positions(args)
            .iter()
            .any(|&p| busy(sess.worker.shard_of(&args[p]))),
        Handler::Async(_) => true,
    }
}

/// Refuses a known command before it runs. Refusing EXEC discards the transaction (and
/// says EXECABORT even outside MULTI), as Redis does.
fn reject_command(sess: &mut Session, cmd: &'static Command, msg: &str) {
    sess.count_rejected(cmd);
    if cmd.name == "exec" {
        sess.multi = None;
        sess.handle.info.borrow_mut().multi = -1;
        transactions::unwatch_all(sess);
        let reason = msg.split_once(' ').map_or(msg, |(_, rest)| rest);
        sess.reject(&format!(
            "EXECABORT Transaction discarded because of: {reason}"
        ));
    } else {
        sess.reject(msg);
    }
}

/// Validates and runs one command for a session: lookup, arity, authentication, MULTI
/// queueing, then execution on the right thread.
pub async fn execute(sess: &mut Session, cmd: Option<&'static Command>, args: Vec<Bytes>) {
    let Some(cmd) = cmd else {
        let msg = unknown_command_error(&args);
        sess.reject_bytes(&msg);
        return;
    };
    if !cmd.arity_ok(args.len()) {
        reject_command(sess, cmd, &arity_error(cmd.name));
        return;
    }
    if !cmd.subcommands.is_empty() {
        if let Err(msg) = check_subcommand(cmd, &args) {
            reject_command(sess, cmd, &msg);
            return;
        }
    }
    if sess.subscriptions() > 0 && !sess.out.resp3 && !pubsub::allowed_while_subscribed(cmd.name) {
        let msg = format!(
            "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context",
            table().display_name(cmd, &args)
        );
        sess.reject(&msg);
        return;
    }
    if !sess.authenticated && !cmd.has(flags::NO_AUTH) {
        reject_command(sess, cmd, "NOAUTH Authentication required.");
        return;
    }
    // The master's stream and the AOF replay run as no user, as in Redis.
    if !sess.replaying {
        if let Some(msg) = acl::denial(sess, cmd, &args) {
            reject_command(sess, cmd, &msg);
            return;
        }
    }
    // Cluster mode: keys in one slot, served here, or a redirection (docs/cluster.md).
    if sess.worker.shared.cluster.is_some() {
        let shared = sess.worker.shared.clone();
        let c = shared.cluster.as_deref().expect("cluster mode");
        use crate::cluster::redirect::{check, resolve, Check};
        let refusal = match check(c, sess, cmd, &args) {
            Check::Serve => None,
            Check::Refuse(msg) => Some(msg),
            Check::Probe(p) => resolve(c, sess, p).await,
        };
        if let Some(msg) = refusal {
            sess.count_rejected(cmd);
            if cmd.name == "exec" {
                // Redis drops the transaction and answers with the redirection itself.
                sess.multi = None;
                sess.handle.info.borrow_mut().multi = -1;
                transactions::unwatch_all(sess);
            }
            sess.reject(&msg);
            return;
        }
    }
    // Past maxmemory, an evicting policy makes room first (docs/eviction.md).
    if !sess.replaying
        && sess.over_maxmemory()
        && crate::shard::evict::evicting(&sess.worker.shared)
    {
        crate::shard::evict::make_room(&sess.worker).await;
    }
    // Past maxmemory, Redis refuses commands that may grow memory, also while queueing
    // them and at an EXEC that queued one.
    let grows = cmd.has(flags::DENYOOM)
        || subcommand_has(cmd, &args, "denyoom")
        || (cmd.name == "exec"
            && sess
                .multi
                .as_ref()
                .is_some_and(|m| m.queued.iter().any(|(c, _)| c.has(flags::DENYOOM))));
    // The master's stream is applied whatever this replica's state (as Redis exempts
    // its master client): refusing it would leave the replica diverged.
    if grows && !sess.replaying && sess.over_maxmemory() {
        reject_command(
            sess,
            cmd,
            "OOM command not allowed when used memory > 'maxmemory'.",
        );
        return;
    }
    let gate = sess.worker.shared.persist.gate();
    if gate != 0 {
        if gate & crate::persist::GATE_LOADING != 0 && !cmd.has(flags::LOADING) && !sess.replaying {
            reject_command(sess, cmd, crate::persist::LOADING_ERR);
            return;
        }
        // As in Redis, a failed snapshot stops writes (and PING) until one succeeds.
        let writes = cmd.has(flags::WRITE)
            || cmd.name == "ping"
            || (cmd.name == "exec"
                && sess
                    .multi
                    .as_ref()
                    .is_some_and(|m| m.queued.iter().any(|(c, _)| c.has(flags::WRITE))));
        if gate & crate::persist::GATE_MISCONF != 0 && writes && !sess.replaying {
            reject_command(sess, cmd, crate::persist::MISCONF_ERR);
            return;
        }
        if gate & crate::persist::GATE_AOF != 0 && writes && cmd.name != "ping" && !sess.replaying {
            let msg = sess.worker.shared.persist.aof.error_reply();
            reject_command(sess, cmd, &msg);
            return;
        }
        if gate & crate::persist::GATE_REPL != 0 && !sess.replaying {
            let shared = &sess.worker.shared;
            let writes = cmd.has(flags::WRITE)
                || (cmd.name == "exec"
                    && sess
                        .multi
                        .as_ref()
                        .is_some_and(|m| m.queued.iter().any(|(c, _)| c.has(flags::WRITE))));
            if writes {
                if let Some(msg) = crate::repl::write_refusal(shared) {
                    reject_command(sess, cmd, msg);
                    return;
                }
            }
            // As in Redis, a write on a read-only replica is READONLY before MASTERDOWN.
            if !cmd.has(flags::STALE)
                && !subcommand_has(cmd, &args, "stale")
                && crate::repl::stale_refused(shared)
            {
                reject_command(sess, cmd, crate::repl::MASTERDOWN_ERR);
                return;
            }
        }
    }
    if sess
        .worker
        .shared
        .busy_count
        .load(std::sync::atomic::Ordering::Relaxed)
        > 0
        && !allowed_while_busy(cmd, &args)
        && !sess.replaying
        && needs_busy_shard(sess, cmd, &args)
    {
        sess.count_rejected(cmd);
        if let Some(m) = &mut sess.multi {
            m.aborted = true;
        }
        let shared = sess.worker.shared.clone();
        scripting::busy_error(&shared, &mut sess.out);
        return;
    }
    if sess.multi.is_some() && !cmd.has(flags::NO_QUEUE) {
        transactions::queue(sess, cmd, args);
        return;
    }
    sess.note_command(cmd, &args);
    if sess
        .worker
        .shared
        .monitors
        .load(std::sync::atomic::Ordering::Relaxed)
        > 0
        // Scripts are shown before the commands they run, as Redis feeds them.
        && (!cmd.has(flags::SKIP_MONITOR) || cmd.has(flags::NO_MANDATORY_KEYS))
    {
        server::feed_monitors(sess, cmd, &args);
    }
    run(sess, cmd, args).await;
}

/// Runs a validated command outside MULTI.
pub async fn run(sess: &mut Session, cmd: &'static Command, mut args: Vec<Bytes>) {
    if let Some(call) = cmd.block {
        // Inside EXEC, and while replaying the AOF, a blocking command runs its
        // non-blocking form: a file must not be able to stop start-up for ever.
        if !sess.in_exec && !sess.replaying {
            let start = crate::clock::Stopwatch::start();
            let flushed_before = sess.flushed_mid_command;
            let mark = sess.out.buf.len();
            // A first try on one shard runs through exec_here, which counts the call.
            let mut counted = false;
            match call(&args) {
                Ok(Some(call)) => {
                    if matches!(call.op, crate::blocking::BlockOp::XRead { .. }) {
                        let args = std::mem::take(&mut args);
                        crate::blocking::run_stream_read(sess, cmd, args, call).await;
                        // Its read ran as the command (`run_handler`), which counted it.
                        counted = true;
                    } else {
                        match served_at_once(sess, cmd, &args).await {
                            Some(true) => return,
                            Some(false) => counted = true,
                            None => {}
                        }
                        crate::blocking::run_blocking(sess, call, &args).await;
                    }
                }
                Ok(None) => return run_handler(sess, cmd, args).await,
                Err(e) => sess.out.error(&e),
            }
            if counted {
                // The wait is nobody's run time; left here, `record_here` would take it off
                // the connection's next command.
                sess.blocked_us = 0;
            } else {
                let mark = mark.saturating_sub(sess.flushed_mid_command - flushed_before);
                sess.record_here(cmd, &args, start, mark);
            }
            return;
        }
    }
    run_handler(sess, cmd, args).await;
}

/// A blocking command whose keys all live on one shard first runs its non-blocking form
/// there (inline when that is this thread): when an element is waiting, as it is while a
/// queue drains, that is the whole call, with none of the waiter's set-up. True when it
/// answered; false when it found nothing and left no reply; None when the keys span
/// shards and nothing was tried.
async fn served_at_once(sess: &mut Session, cmd: &'static Command, args: &[Bytes]) -> Option<bool> {
    if !matches!(route(sess, cmd, args), Route::Shard(_)) {
        return None;
    }
    let mark = sess.out.buf.len();
    run_handler(sess, cmd, args.to_vec()).await;
    if found_nothing(&sess.out.buf[mark..]) {
        sess.out.buf.truncate(mark);
        return Some(false);
    }
    Some(true)
}

/// Whether a blocking command's non-blocking form, having written `reply`, found nothing
/// to take (a null of either protocol), so that the call must wait.
pub fn found_nothing(reply: &[u8]) -> bool {
    reply == b"*-1\r\n" || reply == b"$-1\r\n" || reply == b"_\r\n"
}

/// Waits for a blocking command (not a stream read) whose first try, already counted,
/// found nothing: what `run` does after `served_at_once`, for a caller that made the try
/// itself (`server::dispatch`, for a pop on its own thread's shard).
pub async fn wait_after_try(sess: &mut Session, cmd: &'static Command, args: &[Bytes]) {
    let call = cmd.block.expect("a blocking command");
    match call(args) {
        Ok(Some(call)) => crate::blocking::run_blocking(sess, call, args).await,
        // The try checked the arguments the way `call` does: unreachable in practice,
        // answered rather than dropped.
        Ok(None) => sess.out.null_array(),
        Err(e) => sess.out.error(&e),
    }
    // As in `run`: the counted try leaves no record for the wait to come off.
    sess.blocked_us = 0;
}

/// Runs a command's handler on the right thread (never blocking).
pub async fn run_handler(sess: &mut Session, cmd: &'static Command, args: Vec<Bytes>) {
    match cmd.handler {
        Handler::Conn(f) => {
            let start = crate::clock::Stopwatch::start();
            let mark = sess.out.buf.len();
            f(sess, &args);
            sess.record_here(cmd, &args, start, mark);
        }
        Handler::Async(f) => {
            let start = crate::clock::Stopwatch::start();
            let mark = sess.out.buf.len();
            let kept = args.clone();
            sess.away_us = None;
            let ((), own_us) = crate::clock::own_time(f(sess, args)).await;
            match sess.away_us.take() {
                // A script run on another thread: its run time there, not the wait.
                Some(away) => sess.record_run(cmd, &kept, own_us + away, mark),
                None => sess.record_here(cmd, &kept, start, mark),
            }
        }
        Handler::Shard(f) | Handler::Multi(f, _) => match sess
            .route_hint
            .take()
            .filter(|(hinted, _)| std::ptr::eq(*hinted, cmd))
            .map_or_else(|| route(sess, cmd, &args), |(_, r)| r)
        {
            Route::Here => run_on_shard(sess, sess.worker.id, cmd, f, args).await,
            Route::Shard(s) => run_on_shard(sess, s, cmd, f, args).await,
            Route::Spread => {
                let Handler::Multi(_, cross) = cmd.handler else {
                    unreachable!("single-shard command with keys on several shards")
                };
                let mark = sess.out.buf.len();
                let keys: Vec<Bytes> = cmd
                    .key_positions(&args)
                    .into_iter()
                    .map(|i| args[i].clone())
                    .collect();
                let whole = cmd.spreads.is_some_and(|f| f(&args));
                let kept = args.clone();
                // Its run time here and its steps' run time on the other shards: waiting
                // for their locks and answers is not run time (Redis, on one thread,
                // counts only the time a command runs).
                let (tx, own_us) = crate::clock::own_time(async {
                    let tx = Tx::lock_keys(&sess.worker, &keys, whole).await;
                    let db = sess.db;
                    tx.logged(db, &kept, cross(sess, args, &tx)).await;
                    remember_spread_keys(sess, cmd, &kept, &tx).await;
                    tx
                })
                .await;
                let away_us = tx.away_us();
                // Outside its own time: releasing the locks runs what waited for them, and
                // a move to another shard it set off lands before the reply.
                tx.end().await;
                sess.worker.shard.borrow_mut().stats.multi_shard += 1;
                sess.record_run(cmd, &kept, own_us + away_us, mark);
            }
        },
    }
}

/// CLIENT TRACKING: the keys a multi-shard read named are remembered on their shards
/// while the transaction still holds them, so no write falls in between.
pub async fn remember_spread_keys(sess: &Session, cmd: &Command, args: &[Bytes], tx: &Tx) {
    let Some(reader) = sess.reader().filter(|r| r.remember) else {
        return;
    };
    if !cmd.has(flags::READONLY) {
        return;
    }
    let keys: Vec<Bytes> = cmd
        .key_positions(args)
        .into_iter()
        .map(|i| args[i].clone())
        .collect();
    for (shard, keys) in crate::shard::tx::keys_by_shard(&sess.worker, keys.iter()) {
        tx.run(shard, move |sh| {
            let max = sh
                .shared
                .tunables
                .tracking_table_max_keys
                .load(std::sync::atomic::Ordering::Relaxed);
            let n = sh.shared.nshards();
            for k in keys {
                sh.tracking.remember(max, n, &k, &reader);
            }
        })
        .await;
    }
}

/// Runs a keyed command on this thread's shard when no lock holds its keys (None when
/// one does: it must then wait in the lock queue). The events and blocked clients it
/// leaves are served before returning; the blocked moves it set off are returned, for
/// the connection to wait for before it answers.
#[inline]
pub fn run_here_if_free(
    sess: &mut Session,
    cmd: &'static Command,
    f: ExecFn,
    args: &[Bytes],
) -> Option<Vec<tokio::sync::oneshot::Receiver<()>>> {
    run_here_checked(sess, cmd, f, args, true)
}

/// `run_here_if_free` without the lock check: for a command whose keys the caller holds
/// (`server::dispatch::run_unit`).
#[inline]
pub fn run_here(
    sess: &mut Session,
    cmd: &'static Command,
    f: ExecFn,
    args: &[Bytes],
) -> Vec<tokio::sync::oneshot::Receiver<()>> {
    run_here_checked(sess, cmd, f, args, false).expect("not checked, so run")
}

/// Both of the above, each with `check_locks` constant once inlined, so the inline path
/// of every request keeps one borrow of the shard and one call.
#[inline(always)]
fn run_here_checked(
    sess: &mut Session,
    cmd: &'static Command,
    f: ExecFn,
    args: &[Bytes],
    check_locks: bool,
) -> Option<Vec<tokio::sync::oneshot::Receiver<()>>> {
    let worker = sess.worker.clone();
    let reader = sess.reader();
    let pending = {
        let mut shard = worker.shard.borrow_mut();
        if check_locks && !shard.locks.is_idle() {
            let pos = cmd.key_positions(args);
            let write = cmd.has(flags::WRITE);
            if !shard
                .locks
                .is_free_to(pos.iter().map(|&i| &args[i][..]), write)
            {
                return None;
            }
        }
        shard.stats.inline += 1;
        shard.current = reader;
        let handle = &sess.handle;
        exec_here_for(
            &mut shard,
            cmd,
            f,
            args,
            sess.db,
            &mut sess.out,
            sess.no_touch,
            &|| {
                let info = handle.info.borrow();
                (info.addr.clone(), info.name.clone())
            },
        );
        shard.current = None;
        shard.blocking.has_ready() || !shard.events.is_empty() || shard.tracking.has_pending()
    };
    if !pending {
        return Some(Vec::new());
    }
    crate::shard::after_command(&worker);
    let moves = std::mem::take(&mut worker.shard.borrow_mut().settling);
    Some(moves)
}

/// Runs a keyed command on shard `target`: inline when that is this thread and its keys
/// are free, else as a one-command batch (a hop, or a wait in the lock queue).
async fn run_on_shard(
    sess: &mut Session,
    target: usize,
    cmd: &'static Command,
    f: crate::commands::ExecFn,
    args: Vec<Bytes>,
) {
    let worker = sess.worker.clone();
    if target == worker.id {
        if let Some(moves) = run_here_if_free(sess, cmd, f, &args) {
            if !moves.is_empty() {
                crate::shard::settle(moves).await;
            }
            return;
        }
    } else {
        worker.shard.borrow_mut().stats.one_hop += 1;
    }
    let mut cmds = crate::shard::hops::cmds();
    cmds.push_back((cmd, args));
    let spec = sess.batch_spec(sess.reader());
    let result = run_batch_on(&worker, target, cmds, spec).await;
    crate::shard::settle(result.settle).await;
    sess.out.buf.extend_from_slice(&result.out.buf);
    crate::shard::hops::recycle(result.out.buf, result.spent);
}

/// Logs a command that changed state outside the shards (FUNCTION LOAD...), or that ran
/// on every shard at once, where it ran: into the running EXEC's block, else straight to
/// the AOF writer.
pub fn log_global_effect(sess: &mut Session, argv: &[Bytes]) {
    if !sess.worker.shared.persist.aof.is_on() {
        return;
    }
    let mut e = crate::persist::aof::Effects::default();
    e.push(sess.db, argv);
    let piece = e.take_all();
    if sess.in_exec {
        sess.aof_pending.push(piece);
    } else {
        sess.worker.shared.persist.aof.send_piece(piece);
    }
}

/// Boxes an async handler body; keeps handler definitions short.
#[macro_export]
macro_rules! async_handler {
    ($name:ident, |$sess:ident, $args:ident| $body:block) => {
        pub fn $name<'a>(
            $sess: &'a mut $crate::server::session::Session,
            $args: Vec<bytes::Bytes>,
        ) -> $crate::commands::LocalBoxFuture<'a> {
            Box::pin(async move { $body })
        }
    };
}

/// Boxes a cross-shard handler body.
#[macro_export]
macro_rules! cross_handler {
    ($name:ident, |$sess:ident, $args:ident, $tx:ident| $body:block) => {
        pub fn $name<'a>(
            $sess: &'a mut $crate::server::session::Session,
            $args: Vec<bytes::Bytes>,
            $tx: &'a $crate::shard::tx::Tx,
        ) -> $crate::commands::LocalBoxFuture<'a> {
            Box::pin(async move { $body })
        }
    };
}

#[cfg(test)]
mod tests {
    use super::table;

    /// Every command is found by its name in any case, and nothing else is: no prefix,
    /// no name with a byte more (a zero byte among them), no folding past ASCII.
    #[test]
    fn lookup_finds_each_command_and_nothing_else() {
        let t = table();
        for c in &t.commands {
            let name = c.name.as_bytes();
            let upper = name.to_ascii_uppercase();
            let mixed: Vec<u8> = name
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    if i % 2 == 0 {
                        b.to_ascii_uppercase()
                    } else {
                        *b
                    }
                })
                .collect();
            for n in [name, &upper[..], &mixed[..]] {
                assert_eq!(t.lookup(n).map(|f| f.id), Some(c.id), "{}", c.name);
            }
            let mut longer = name.to_vec();
            longer.push(0);
            assert!(t.lookup(&longer).is_none(), "{}\\0", c.name);
            longer.pop();
            longer.push(b'x');
            assert!(t
                .lookup(&longer)
                .is_none_or(|f| f.name.as_bytes() == &longer[..]));
            if name.len() > 1 {
                let prefix = &name[..name.len() - 1];
                assert!(t.lookup(prefix).is_none_or(|f| f.name.as_bytes() == prefix));
            }
            // A byte with the high bit set is not an ASCII letter in either case.
            let mut high = name.to_vec();
            high[0] |= 0x80;
            assert!(t.lookup(&high).is_none(), "{:?}", high);
        }
        assert!(t.lookup(b"").is_none());
        assert!(t.lookup(&[b'a'; 24]).is_none());
        assert!(t.lookup(&[b'a'; 300]).is_none());
        assert!(t.lookup(b"get\0").is_none());
        assert!(t.lookup(b"ge").is_none());
        assert!(t.lookup(b"G\xc5T").is_none());
        assert_eq!(t.lookup(b"GeT").map(|c| c.name), Some("get"));
        assert_eq!(
            t.lookup(b"GEORADIUSBYMEMBER_RO").map(|c| c.name),
            Some("georadiusbymember_ro")
        );
    }

    /// The word-at-a-time case folding agrees with the byte-at-a-time one for every byte
    /// at every position.
    #[test]
    fn word_lowercase_matches_bytes() {
        for b in 0..=255u8 {
            for at in 0..8 {
                let mut bytes = [b'Q', 0, b'z', 0x80, b'@', b'[', b'`', b'{'];
                bytes[at] = b;
                let folded = super::ascii_lowercase_word(u64::from_le_bytes(bytes));
                assert_eq!(folded.to_le_bytes(), bytes.map(|c| c.to_ascii_lowercase()));
            }
        }
    }

    /// Packing by overlapping loads gives the name's bytes in order, zero past the end,
    /// for every length.
    #[test]
    fn pack_lays_out_every_length() {
        let name: Vec<u8> = (1..=30u8).map(|i| b'A' + i % 26).collect();
        for len in 0..=30 {
            let packed = super::NameIndex::pack(&name[..len]);
            if len == 0 || len > super::NAME_MAX {
                assert!(packed.is_none(), "{len}");
                continue;
            }
            let mut expected = [0u8; 24];
            for (i, b) in name[..len].iter().enumerate() {
                expected[i] = b.to_ascii_lowercase();
            }
            expected[23] = len as u8;
            let words = packed.unwrap();
            let mut got = [0u8; 24];
            for (i, w) in words.iter().enumerate() {
                got[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
            }
            assert_eq!(got, expected, "{len}");
        }
    }
}
