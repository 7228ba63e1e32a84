//! Blocking pops over sets of many keys, as job-queue clients use them: Sidekiq's
//! `BRPOP q1 q2 ... qN timeout` with the queues reshuffled on every call, BullMQ-style
//! sorted sets, many workers sharing one queue. The same client calls again and again on
//! the same (unordered) set of keys, so these tests pin the semantics a server must keep
//! however it remembers those sets between calls:
//!
//! - every pushed element is received exactly once, with the right key, whether it was
//!   pushed before the call or while the client was blocked;
//! - when several keys hold data, the first one in the *current* call's argument order
//!   is served (the order of an earlier call with the same set means nothing);
//! - data that arrives between two calls by any path (RENAME, RESTORE, COPY, MOVE,
//!   SWAPDB, LMOVE, a served BLMOVE, MULTI/EXEC, EVAL, SORT ... STORE) is seen at once,
//!   and data that leaves (DEL, pops, LTRIM, expiry, RENAME, MOVE, SWAPDB, FLUSHDB, a
//!   type change...) is not seen any more;
//! - a set that differs from a known one by one key, repeats keys, has keys that would
//!   run together if joined, or is used from another database, is served from its own
//!   keys only;
//! - WRONGTYPE comes from the first existing key in argument order;
//! - first blocked, first served, across different sets sharing a key, and again after
//!   everyone re-blocks in another order;
//! - BLPOP, BRPOP, BLMPOP, BLMOVE, BZPOPMIN and BZMPOP on one set each get data of their
//!   type; timeouts answer `*-1` (RESP2) or `_` (RESP3);
//! - a killed, closed or CLIENT UNBLOCKed waiter loses nothing;
//! - hundreds of distinct sets from a few clients conserve every element.
//!
//! Each scenario runs at `--threads 1` and `--threads 4` (keys are spread over the
//! shards with `spread_keys`). Every wait is bounded (reads time out, loops count), and
//! nothing asserts on time. The seed is `KITE_BLOCKING_SETS_SEED` (default below).
//! Everything here passes against redis-server 7.0 (`KITE_BIN=/usr/bin/redis-server`).

mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use common::blocked::{
    blocked_names, client_id, distinct, info_int, read_reply, shuffled, wait_blocked, REPLY_WAIT,
};
use common::{seeds_from_env, spread_keys, Client, KiteServer, Resp, Rng};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

fn seed(salt: u64) -> u64 {
    seeds_from_env("KITE_BLOCKING_SETS_SEED", &[20_261_126])[0]
        .wrapping_mul(1_000_003)
        .wrapping_add(salt)
}

fn bulk(s: &str) -> Resp {
    Resp::bulk(s)
}

fn arr(items: Vec<Resp>) -> Resp {
    Resp::Array(items)
}

fn pair(key: &str, value: &str) -> Resp {
    arr(vec![bulk(key), bulk(value)])
}

fn bulks<S: AsRef<str>>(items: &[S]) -> Resp {
    arr(items.iter().map(|s| bulk(s.as_ref())).collect())
}

// ---------------------------------------------------------------------------
// A model of the lists, and the pops run against it
// ---------------------------------------------------------------------------

/// What the lists should hold (head first). Empty lists are removed, as in Redis.
#[derive(Default)]
struct Lists(HashMap<String, VecDeque<String>>);

impl Lists {
    fn rpush(&mut self, key: &str, v: &str) -> usize {
        let l = self.0.entry(key.to_string()).or_default();
        l.push_back(v.to_string());
        l.len()
    }

    fn lpush(&mut self, key: &str, v: &str) -> usize {
        let l = self.0.entry(key.to_string()).or_default();
        l.push_front(v.to_string());
        l.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn contents(&self, key: &str) -> Vec<String> {
        self.0
            .get(key)
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn first_nonempty<'a>(&self, order: &'a [String]) -> Option<&'a String> {
        order.iter().find(|k| self.0.contains_key(k.as_str()))
    }

    fn pop(&mut self, key: &str, left: bool) -> Option<String> {
        let l = self.0.get_mut(key)?;
        let v = if left { l.pop_front() } else { l.pop_back() };
        if l.is_empty() {
            self.0.remove(key);
        }
        v
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// A blocking pop from a list.
#[derive(Clone, Copy, Debug)]
enum Pop {
    Left,
    Right,
    /// BLMPOP numkeys keys... LEFT|RIGHT COUNT count
    Multi {
        left: bool,
        count: usize,
    },
}

impl Pop {
    fn random(rng: &mut Rng) -> Pop {
        match rng.below(4) {
            0 => Pop::Left,
            1 => Pop::Right,
            _ => Pop::Multi {
                left: rng.chance(50),
                count: rng.range(1, 3) as usize,
            },
        }
    }

    fn args(self, order: &[String], timeout: &str) -> Vec<String> {
        let mut cmd: Vec<String> = Vec::with_capacity(order.len() + 6);
        match self {
            Pop::Left | Pop::Right => {
                let name = if matches!(self, Pop::Left) {
                    "BLPOP"
                } else {
                    "BRPOP"
                };
                cmd.push(name.into());
                cmd.extend(order.iter().cloned());
                cmd.push(timeout.into());
            }
            Pop::Multi { left, count } => {
                cmd.push("BLMPOP".into());
                cmd.push(timeout.into());
                cmd.push(order.len().to_string());
                cmd.extend(order.iter().cloned());
                let side = if left { "LEFT" } else { "RIGHT" };
                cmd.push(side.into());
                cmd.push("COUNT".into());
                cmd.push(count.to_string());
            }
        }
        cmd
    }

    /// The reply Redis gives when the lists are as `model` says at call time, and the
    /// model after the pop. A null array when every key is empty (the call times out).
    fn expect(self, model: &mut Lists, order: &[String]) -> Resp {
        let Some(key) = model.first_nonempty(order) else {
            return Resp::NullArray;
        };
        match self {
            Pop::Left | Pop::Right => {
                let v = model.pop(key, matches!(self, Pop::Left)).unwrap();
                pair(key, &v)
            }
            Pop::Multi { left, count } => {
                let mut got = Vec::new();
                while got.len() < count {
                    match model.pop(key, left) {
                        Some(v) => got.push(bulk(&v)),
                        None => break,
                    }
                }
                arr(vec![bulk(key), arr(got)])
            }
        }
    }
}

fn short(cmd: &[String]) -> String {
    if cmd.len() <= 8 {
        cmd.join(" ")
    } else {
        format!(
            "{} ... ({} arguments) ... {}",
            cmd[..4].join(" "),
            cmd.len(),
            cmd[cmd.len() - 3..].join(" ")
        )
    }
}

macro_rules! threads_1_and_4 {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn threads1() {
                    super::scenarios::$name(1);
                }
                #[test]
                fn threads4() {
                    super::scenarios::$name(4);
                }
            }
        )*
    };
}

threads_1_and_4!(
    sidekiq_shuffled_brpop,
    argument_order,
    arrivals_between_calls,
    departures_between_calls,
    sets_that_differ_subtly,
    wrongtype_in_known_set,
    fairness_across_sets,
    mixed_types_same_set,
    disconnect_and_unblock,
    many_distinct_sets,
);

/// A push of one type serves the waiters of that type queued behind a waiter of the
/// other type on the same key, as redis-server does (Kite served nobody until the fix).
mod mixed_types_other_type_first {
    #[test]
    fn threads1() {
        super::scenarios::mixed_types_other_type_first(1);
    }
    #[test]
    fn threads4() {
        super::scenarios::mixed_types_other_type_first(4);
    }
}

mod scenarios {
    use super::*;

    /// One consumer BRPOPs the same 60 queues, reshuffled on every call, with timeouts of
    /// 0.1 to 1 s; between its calls a producer pushes to a random queue, before the call
    /// or while it is blocked (waited for, or racing with the call). Every element is
    /// received exactly once, from the key the model says, and nothing else arrives.
    pub fn sidekiq_shuffled_brpop(threads: usize) {
        const ROUNDS: usize = 250;
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(1));
        let keys = spread_keys("sidekiq:queue:", 60);
        let mut consumer = s.client();
        let mut producer = s.client();
        let mut admin = s.client();
        let mut model = Lists::default();
        let mut seq = 0usize;
        // Calls served at once, woken by a push, timed out before their push, empty.
        let (mut at_once, mut woken, mut late, mut empty) = (0, 0, 0, 0);
        for round in 0..ROUNDS {
            let order = shuffled(&mut rng, &keys);
            let roll = rng.below(100);
            if !model.is_empty() || roll < 35 {
                // Pushes acknowledged before the call: served at once, from the first
                // non-empty queue in this call's order.
                // (fewer while earlier ones wait, so the queues drain)
                let n = if model.is_empty() {
                    rng.range(1, 3)
                } else {
                    rng.range(0, 1)
                };
                for _ in 0..n {
                    let k = rng.pick(&keys).clone();
                    let v = format!("job-{seq}");
                    seq += 1;
                    let (cmd, len) = if rng.chance(50) {
                        ("RPUSH", model.rpush(&k, &v))
                    } else {
                        ("LPUSH", model.lpush(&k, &v))
                    };
                    assert_eq!(
                        producer.cmd(&[cmd, &k, &v]),
                        Resp::Integer(len as i64),
                        "{cmd} {k}"
                    );
                }
                let timeout = *rng.pick(&["0.1", "0.2", "0.5", "1"]);
                let cmd = Pop::Right.args(&order, timeout);
                let want = Pop::Right.expect(&mut model, &order);
                let got = consumer.cmd(&cmd);
                assert_eq!(got, want, "round {round}: `{}`", short(&cmd));
                at_once += 1;
            } else if roll < 85 {
                // A push while the consumer waits: after it is counted blocked, or sent
                // right behind its call (either order gives the same reply).
                let surely_blocked = roll < 65;
                // One call in four waits long enough that a null reply can only be a
                // lost wake-up.
                let strict = surely_blocked && rng.chance(25);
                let timeout = if strict {
                    "10"
                } else {
                    *rng.pick(&["0.5", "1"])
                };
                let cmd = Pop::Right.args(&order, timeout);
                consumer.send(&cmd);
                if surely_blocked {
                    wait_blocked(&mut admin, 1, &format!("round {round}"));
                }
                let k = rng.pick(&keys).clone();
                let v = format!("job-{seq}");
                seq += 1;
                let push = if rng.chance(50) { "RPUSH" } else { "LPUSH" };
                assert_eq!(producer.cmd(&[push, &k, &v]), Resp::Integer(1));
                let got = read_reply(&mut consumer, &format!("round {round}"));
                if got.is_null() && !strict {
                    // The call timed out before the push was applied (a loaded machine):
                    // then the element must still be in its list, for a later call.
                    late += 1;
                    assert_eq!(
                        admin.cmd(&["LRANGE", &k, "0", "-1"]),
                        bulks(&[&v]),
                        "round {round}: `{}` timed out; {push} {k} {v} must have stayed",
                        short(&cmd)
                    );
                    model.rpush(&k, &v);
                } else {
                    assert_eq!(
                        got,
                        pair(&k, &v),
                        "round {round}: `{}` blocked, then {push} {k} {v}",
                        short(&cmd)
                    );
                    woken += 1;
                }
            } else {
                // Nothing anywhere: the call times out.
                let timeout = *rng.pick(&["0.1", "0.2"]);
                let cmd = Pop::Right.args(&order, timeout);
                assert_eq!(
                    consumer.cmd(&cmd),
                    Resp::NullArray,
                    "round {round}: `{}` on empty queues",
                    short(&cmd)
                );
                empty += 1;
            }
        }
        // Whatever is left is received, in model order; then nothing more.
        let mut guard = 0;
        while !model.is_empty() {
            guard += 1;
            assert!(guard < 1000, "draining never ends");
            let order = shuffled(&mut rng, &keys);
            let cmd = Pop::Right.args(&order, "0.1");
            let want = Pop::Right.expect(&mut model, &order);
            assert_eq!(consumer.cmd(&cmd), want, "draining: `{}`", short(&cmd));
        }
        let order = shuffled(&mut rng, &keys);
        assert_eq!(
            consumer.cmd(&Pop::Right.args(&order, "0.1")),
            Resp::NullArray
        );
        let mut exists = vec!["EXISTS".to_string()];
        exists.extend(keys.iter().cloned());
        assert_eq!(
            admin.cmd(&exists),
            Resp::Integer(0),
            "queues left non-empty"
        );
        assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
        eprintln!(
            "sidekiq_shuffled_brpop: {at_once} calls served at once, {woken} woken by a \
             push, {late} timed out before their push, {empty} timed out on empty queues"
        );
    }

    /// With the same 64 keys reshuffled on every call, two or three of them are filled
    /// and BLPOP / BRPOP / BLMPOP must serve the first non-empty key of *this* call's
    /// order. Leftovers are kept half of the time, so earlier rounds' data competes too.
    pub fn argument_order(threads: usize) {
        const ROUNDS: usize = 300;
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(2));
        let keys = spread_keys("order:", 64);
        let mut consumer = s.client();
        let mut writer = s.client();
        let mut model = Lists::default();
        let mut seq = 0usize;
        for round in 0..ROUNDS {
            if model.is_empty() && rng.chance(25) {
                // The set is known to the server from an earlier call that waited.
                let order = shuffled(&mut rng, &keys);
                let op = Pop::random(&mut rng);
                let cmd = op.args(&order, "0.01");
                assert_eq!(consumer.cmd(&cmd), Resp::NullArray, "`{}`", short(&cmd));
            }
            let order = shuffled(&mut rng, &keys);
            let fill = rng.range(2, 3) as usize;
            for i in distinct(&mut rng, keys.len(), fill) {
                let k = &keys[i];
                let n = rng.range(1, 3);
                let mut cmd = vec!["RPUSH".to_string(), k.clone()];
                let mut len = 0;
                for _ in 0..n {
                    let v = format!("{k}|{seq}");
                    seq += 1;
                    len = model.rpush(k, &v);
                    cmd.push(v);
                }
                assert_eq!(writer.cmd(&cmd), Resp::Integer(len as i64));
            }
            let op = Pop::random(&mut rng);
            let timeout = *rng.pick(&["0", "0.01", "1"]);
            let cmd = op.args(&order, timeout);
            let want = op.expect(&mut model, &order);
            assert_eq!(
                consumer.cmd(&cmd),
                want,
                "round {round}: several keys hold data; `{}` serves the first in its \
                 own argument order",
                short(&cmd)
            );
            if rng.chance(50) && !model.is_empty() {
                let mut del = vec!["DEL".to_string()];
                del.extend(model.0.keys().cloned());
                let n = model.0.len() as i64;
                assert_eq!(writer.cmd(&del), Resp::Integer(n));
                model.clear();
            }
        }
        assert_eq!(info_int(&mut writer, "blocked_clients"), 0);
    }

    const SRC: &str = "arrive:src";

    /// Makes data arrive at `target` by `path`; returns the list it holds afterwards
    /// (head first). The consumer (db 0) is not blocked meanwhile.
    fn arrive(
        path: &str,
        target: &str,
        w: &mut Client,
        consumer: &mut Client,
        helper: &mut Client,
        check_empty: &mut dyn FnMut(&mut Client, &str),
    ) -> Vec<&'static str> {
        let ok = Resp::ok();
        match path {
            "rpush onto a list the set was served from" => {
                // (the list was emptied by the previous call, see the caller)
                assert_eq!(w.cmd(&["RPUSH", target, "a", "b"]), Resp::Integer(2));
                vec!["a", "b"]
            }
            "lpush creating a list" => {
                assert_eq!(w.cmd(&["LPUSH", target, "a", "b"]), Resp::Integer(2));
                vec!["b", "a"]
            }
            "rpushx after lpush in one transaction" => {
                assert_eq!(w.cmd(&["MULTI"]), ok);
                w.cmd(&["LPUSH", target, "a"]);
                w.cmd(&["RPUSHX", target, "b"]);
                assert_eq!(
                    w.cmd(&["EXEC"]),
                    arr(vec![Resp::Integer(1), Resp::Integer(2)])
                );
                vec!["a", "b"]
            }
            "the consumer's own rpush" => {
                assert_eq!(consumer.cmd(&["RPUSH", target, "own"]), Resp::Integer(1));
                vec!["own"]
            }
            "rename" => {
                assert_eq!(w.cmd(&["RPUSH", SRC, "x", "y"]), Resp::Integer(2));
                assert_eq!(w.cmd(&["RENAME", SRC, target]), ok);
                vec!["x", "y"]
            }
            "renamenx" => {
                assert_eq!(w.cmd(&["RPUSH", SRC, "x", "y"]), Resp::Integer(2));
                assert_eq!(w.cmd(&["RENAMENX", SRC, target]), Resp::Integer(1));
                vec!["x", "y"]
            }
            "restore of a dump" => {
                assert_eq!(w.cmd(&["RPUSH", SRC, "x", "y"]), Resp::Integer(2));
                let dump = w.cmd(&["DUMP", SRC]);
                let payload = dump
                    .as_bytes()
                    .unwrap_or_else(|| panic!("DUMP answered {dump}"))
                    .to_vec();
                assert_eq!(w.cmd(&["DEL", SRC]), Resp::Integer(1));
                let r = w.cmd(&[b"RESTORE".as_slice(), target.as_bytes(), b"0", &payload]);
                assert_eq!(r, ok, "RESTORE {target}");
                vec!["x", "y"]
            }
            "copy" => {
                assert_eq!(w.cmd(&["RPUSH", SRC, "x", "y"]), Resp::Integer(2));
                assert_eq!(w.cmd(&["COPY", SRC, target]), Resp::Integer(1));
                vec!["x", "y"]
            }
            "move from db 1" => {
                assert_eq!(w.cmd(&["SELECT", "1"]), ok);
                assert_eq!(w.cmd(&["RPUSH", target, "x", "y"]), Resp::Integer(2));
                // The same name in db 1 is not in the consumer's db.
                check_empty(consumer, "a list of the same name in db 1");
                assert_eq!(w.cmd(&["MOVE", target, "0"]), Resp::Integer(1));
                assert_eq!(w.cmd(&["SELECT", "0"]), ok);
                vec!["x", "y"]
            }
            "swapdb" => {
                assert_eq!(w.cmd(&["SELECT", "1"]), ok);
                assert_eq!(w.cmd(&["RPUSH", target, "x", "y"]), Resp::Integer(2));
                assert_eq!(w.cmd(&["SELECT", "0"]), ok);
                check_empty(consumer, "a list of the same name in db 1");
                assert_eq!(w.cmd(&["SWAPDB", "0", "1"]), ok);
                vec!["x", "y"]
            }
            "lmove" => {
                assert_eq!(w.cmd(&["RPUSH", SRC, "x", "y", "z"]), Resp::Integer(3));
                assert_eq!(w.cmd(&["LMOVE", SRC, target, "RIGHT", "LEFT"]), bulk("z"));
                vec!["z"]
            }
            "rpoplpush" => {
                assert_eq!(w.cmd(&["RPUSH", SRC, "x", "y"]), Resp::Integer(2));
                assert_eq!(w.cmd(&["RPOPLPUSH", SRC, target]), bulk("y"));
                vec!["y"]
            }
            "a blocked blmove served" => {
                helper.send(&["BLMOVE", SRC, target, "LEFT", "RIGHT", "10"]);
                wait_blocked(w, 1, "BLMOVE src target");
                assert_eq!(w.cmd(&["RPUSH", SRC, "m"]), Resp::Integer(1));
                assert_eq!(read_reply(helper, "the blocked BLMOVE"), bulk("m"));
                vec!["m"]
            }
            "multi/exec" => {
                assert_eq!(w.cmd(&["MULTI"]), ok);
                w.cmd(&["RPUSH", target, "a"]);
                w.cmd(&["LPUSH", target, "b"]);
                w.cmd(&["RPUSH", target, "c"]);
                assert_eq!(
                    w.cmd(&["EXEC"]),
                    arr(vec![Resp::Integer(1), Resp::Integer(2), Resp::Integer(3)])
                );
                vec!["b", "a", "c"]
            }
            "eval" => {
                let script = "return redis.call('rpush', KEYS[1], ARGV[1], ARGV[2])";
                assert_eq!(
                    w.cmd(&["EVAL", script, "1", target, "x", "y"]),
                    Resp::Integer(2)
                );
                vec!["x", "y"]
            }
            "sort store" => {
                assert_eq!(w.cmd(&["RPUSH", SRC, "3", "1", "2"]), Resp::Integer(3));
                assert_eq!(w.cmd(&["SORT", SRC, "STORE", target]), Resp::Integer(3));
                vec!["1", "2", "3"]
            }
            other => panic!("unknown path {other}"),
        }
    }

    const PATHS: &[&str] = &[
        "rpush onto a list the set was served from",
        "lpush creating a list",
        "rpushx after lpush in one transaction",
        "the consumer's own rpush",
        "rename",
        "renamenx",
        "restore of a dump",
        "copy",
        "move from db 1",
        "swapdb",
        "lmove",
        "rpoplpush",
        "a blocked blmove served",
        "multi/exec",
        "eval",
        "sort store",
    ];

    /// The consumer calls on its set of 50 keys and times out; data then arrives at one
    /// key of the set by some path; the next call on the same set (reshuffled) returns
    /// it at once.
    pub fn arrivals_between_calls(threads: usize) {
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(3));
        let keys = spread_keys("arrive:", 50);
        let mut consumer = s.client();
        let mut writer = s.client();
        let mut helper = s.client();
        for pass in 0..2 {
            let mut paths = PATHS.to_vec();
            rng.shuffle(&mut paths);
            for (i, path) in paths.into_iter().enumerate() {
                let what = format!("pass {pass}, {path}");
                let target = keys[rng.index(keys.len())].clone();
                let op = if (i + pass) % 2 == 0 {
                    Pop::Right
                } else {
                    Pop::Left
                };
                if path.starts_with("rpush onto") {
                    assert_eq!(writer.cmd(&["RPUSH", &target, "old"]), Resp::Integer(1));
                    let order = shuffled(&mut rng, &keys);
                    assert_eq!(
                        consumer.cmd(&op.args(&order, "1")),
                        pair(&target, "old"),
                        "{what}: first call"
                    );
                }
                let keys_for_check = keys.clone();
                let mut check_rng = Rng::new(seed(300 + i as u64));
                let mut check_empty = move |c: &mut Client, why: &str| {
                    let order = shuffled(&mut check_rng, &keys_for_check);
                    let cmd = op.args(&order, "0.01");
                    assert_eq!(
                        c.cmd(&cmd),
                        Resp::NullArray,
                        "{why}: `{}` must time out",
                        short(&cmd)
                    );
                };
                check_empty(&mut consumer, &format!("{what}: before the data arrives"));
                let content = arrive(
                    path,
                    &target,
                    &mut writer,
                    &mut consumer,
                    &mut helper,
                    &mut check_empty,
                );
                let order = shuffled(&mut rng, &keys);
                let cmd = op.args(&order, "0.5");
                let mut model = Lists::default();
                for v in &content {
                    model.rpush(&target, v);
                }
                let want = op.expect(&mut model, &order);
                assert_eq!(
                    consumer.cmd(&cmd),
                    want,
                    "{what}: the call after the data arrived at {target}: `{}`",
                    short(&cmd)
                );
                assert_eq!(
                    writer.cmd(&["LRANGE", &target, "0", "-1"]),
                    bulks(&model.contents(&target)),
                    "{what}: what is left at {target}"
                );
                assert_eq!(writer.cmd(&["FLUSHALL"]), Resp::ok());
            }
        }
        assert_eq!(info_int(&mut writer, "blocked_clients"), 0);
    }

    const DEPARTURES: &[&str] = &[
        "del",
        "unlink",
        "lpop with a count",
        "ltrim to nothing",
        "lrem",
        "expire 0",
        "pexpire, then the time passes",
        "rename away",
        "rename onto another key of the set",
        "move to db 1",
        "swapdb",
        "flushdb",
        "lmove away",
        "a blmove served from it",
        "multi/exec pop",
        "eval del",
        "set to a string",
        "restore replace with a sorted set",
    ];

    /// The complement of `arrivals_between_calls`: a key of the set is served from and
    /// keeps one element; that element then leaves by some path; the next call on the
    /// same set must not see it (it times out, or answers WRONGTYPE where the key now
    /// holds another type, or serves the key it was renamed to). The set still works
    /// afterwards.
    pub fn departures_between_calls(threads: usize) {
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(9));
        let keys = spread_keys("depart:", 50);
        let mut consumer = s.client();
        let mut w = s.client();
        let mut helper = s.client();
        let ok = Resp::ok();
        for pass in 0..2 {
            let mut paths = DEPARTURES.to_vec();
            rng.shuffle(&mut paths);
            for (i, path) in paths.into_iter().enumerate() {
                let what = format!("pass {pass}, {path}");
                let ij = distinct(&mut rng, keys.len(), 2);
                let (t, other) = (keys[ij[0]].clone(), keys[ij[1]].clone());
                let op = if (i + pass) % 2 == 0 {
                    Pop::Right
                } else {
                    Pop::Left
                };
                assert_eq!(w.cmd(&["RPUSH", &t, "a", "b"]), Resp::Integer(2));
                let order = shuffled(&mut rng, &keys);
                let first = if matches!(op, Pop::Left) { "a" } else { "b" };
                let left = if matches!(op, Pop::Left) { "b" } else { "a" };
                assert_eq!(
                    consumer.cmd(&op.args(&order, "1")),
                    pair(&t, first),
                    "{what}: first call"
                );
                let mut want = Resp::NullArray;
                match path {
                    "del" => assert_eq!(w.cmd(&["DEL", &t]), Resp::Integer(1)),
                    "unlink" => assert_eq!(w.cmd(&["UNLINK", &t]), Resp::Integer(1)),
                    "lpop with a count" => {
                        assert_eq!(w.cmd(&["LPOP", &t, "5"]), bulks(&[left]))
                    }
                    "ltrim to nothing" => assert_eq!(w.cmd(&["LTRIM", &t, "1", "0"]), ok),
                    "lrem" => assert_eq!(w.cmd(&["LREM", &t, "0", left]), Resp::Integer(1)),
                    "expire 0" => assert_eq!(w.cmd(&["EXPIRE", &t, "0"]), Resp::Integer(1)),
                    "pexpire, then the time passes" => {
                        assert_eq!(w.cmd(&["PEXPIRE", &t, "1"]), Resp::Integer(1));
                        thread::sleep(Duration::from_millis(10));
                    }
                    "rename away" => assert_eq!(w.cmd(&["RENAME", &t, "depart:away"]), ok),
                    "rename onto another key of the set" => {
                        assert_eq!(w.cmd(&["RENAME", &t, &other]), ok);
                        want = pair(&other, left);
                    }
                    "move to db 1" => assert_eq!(w.cmd(&["MOVE", &t, "1"]), Resp::Integer(1)),
                    "swapdb" => assert_eq!(w.cmd(&["SWAPDB", "0", "1"]), ok),
                    "flushdb" => assert_eq!(w.cmd(&["FLUSHDB"]), ok),
                    "lmove away" => assert_eq!(
                        w.cmd(&["LMOVE", &t, "depart:away", "LEFT", "LEFT"]),
                        bulk(left)
                    ),
                    "a blmove served from it" => assert_eq!(
                        helper.cmd(&["BLMOVE", &t, "depart:away", "LEFT", "LEFT", "1"]),
                        bulk(left)
                    ),
                    "multi/exec pop" => {
                        assert_eq!(w.cmd(&["MULTI"]), ok);
                        w.cmd(&["RPOP", &t]);
                        assert_eq!(w.cmd(&["EXEC"]), arr(vec![bulk(left)]));
                    }
                    "eval del" => assert_eq!(
                        w.cmd(&["EVAL", "return redis.call('del', KEYS[1])", "1", &t]),
                        Resp::Integer(1)
                    ),
                    "set to a string" => {
                        assert_eq!(w.cmd(&["SET", &t, "str"]), ok);
                        want = Resp::Error(WRONGTYPE.into());
                    }
                    "restore replace with a sorted set" => {
                        assert_eq!(w.cmd(&["ZADD", "depart:z", "1", "m"]), Resp::Integer(1));
                        let dump = w.cmd(&["DUMP", "depart:z"]);
                        let payload = dump
                            .as_bytes()
                            .unwrap_or_else(|| panic!("DUMP answered {dump}"))
                            .to_vec();
                        let r = w.cmd(&[
                            b"RESTORE".as_slice(),
                            t.as_bytes(),
                            b"0",
                            &payload,
                            b"REPLACE",
                        ]);
                        assert_eq!(r, ok, "RESTORE {t} ... REPLACE");
                        want = Resp::Error(WRONGTYPE.into());
                    }
                    other => panic!("unknown path {other}"),
                }
                let order = shuffled(&mut rng, &keys);
                let cmd = op.args(&order, "0.01");
                assert_eq!(
                    consumer.cmd(&cmd),
                    want,
                    "{what}: the call after {t}'s last element left: `{}`",
                    short(&cmd)
                );
                assert_eq!(w.cmd(&["FLUSHALL"]), ok);
                // The set still serves what comes next.
                let k = keys[rng.index(keys.len())].clone();
                assert_eq!(w.cmd(&["LPUSH", &k, "next"]), Resp::Integer(1));
                let order = shuffled(&mut rng, &keys);
                assert_eq!(
                    consumer.cmd(&op.args(&order, "1")),
                    pair(&k, "next"),
                    "{what}: the call after that"
                );
            }
        }
        assert_eq!(info_int(&mut w, "blocked_clients"), 0);
    }

    /// Sets that differ from a known one by a single key (a subset, a superset, one key
    /// swapped), that repeat keys, whose keys would run together if joined (spaces,
    /// NUL, commas, CRLF, the empty key), and the same set in another database: each is
    /// served exactly from its own keys.
    pub fn sets_that_differ_subtly(threads: usize) {
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(10));
        let base = spread_keys("subtle:", 40);
        let mut c = s.client();
        let mut w = s.client();
        let null = Resp::NullArray;
        let call = |c: &mut Client, rng: &mut Rng, set: &[String], timeout: &str| {
            let order = shuffled(rng, set);
            c.cmd(&Pop::Right.args(&order, timeout))
        };
        assert_eq!(call(&mut c, &mut rng, &base, "0.01"), null);

        // A subset: the missing key's data is not served, and stays.
        let x = base[rng.index(base.len())].clone();
        let subset: Vec<String> = base.iter().filter(|k| **k != x).cloned().collect();
        assert_eq!(call(&mut c, &mut rng, &subset, "0.01"), null);
        assert_eq!(w.cmd(&["RPUSH", &x, "vx"]), Resp::Integer(1));
        assert_eq!(
            call(&mut c, &mut rng, &subset, "0.01"),
            null,
            "subset without {x}"
        );
        assert_eq!(w.cmd(&["LLEN", &x]), Resp::Integer(1));
        // One key swapped for another.
        let y = "subtle:extra".to_string();
        let mut swapped = subset.clone();
        swapped.push(y.clone());
        assert_eq!(
            call(&mut c, &mut rng, &swapped, "0.01"),
            null,
            "{x} swapped for {y}"
        );
        assert_eq!(w.cmd(&["RPUSH", &y, "vy"]), Resp::Integer(1));
        assert_eq!(call(&mut c, &mut rng, &swapped, "0.01"), pair(&y, "vy"));
        // The whole set, then a superset.
        assert_eq!(call(&mut c, &mut rng, &base, "0.01"), pair(&x, "vx"));
        let mut superset = base.clone();
        superset.push(y.clone());
        assert_eq!(call(&mut c, &mut rng, &superset, "0.01"), null);
        assert_eq!(w.cmd(&["LPUSH", &y, "vy2"]), Resp::Integer(1));
        assert_eq!(
            call(&mut c, &mut rng, &base, "0.01"),
            null,
            "base without {y}"
        );
        assert_eq!(call(&mut c, &mut rng, &superset, "0.01"), pair(&y, "vy2"));

        // Repeated keys: served once, woken once.
        let d = base[rng.index(base.len())].clone();
        let mut dups = base.clone();
        dups.extend([d.clone(), d.clone(), base[0].clone()]);
        assert_eq!(call(&mut c, &mut rng, &dups, "0.01"), null);
        let order = shuffled(&mut rng, &dups);
        c.send(&Pop::Right.args(&order, "10"));
        wait_blocked(&mut w, 1, "BRPOP with repeated keys");
        assert_eq!(w.cmd(&["RPUSH", &d, "a", "b"]), Resp::Integer(2));
        assert_eq!(read_reply(&mut c, "repeated keys"), pair(&d, "b"));
        wait_blocked(&mut w, 0, "after the repeated-keys wake-up");
        assert_eq!(w.cmd(&["LRANGE", &d, "0", "-1"]), bulks(&["a"]));
        assert_eq!(call(&mut c, &mut rng, &dups, "0.01"), pair(&d, "a"));

        // Keys that run together when joined.
        let odd: Vec<Vec<String>> = [
            &["p q", "r"][..],
            &["p", "q r"],
            &["p q r"],
            &["", "p q r "],
            &["p\0q", "r\0"],
            &["p", "q\0r"],
            &["p,q", "r,"],
            &["p", "q,r"],
            &["p\r\nq", "r"],
            &["p\r\n", "q r\r\n"],
            &["subtle", "subtle:"],
        ]
        .iter()
        .map(|set| set.iter().map(|k| k.to_string()).collect())
        .collect();
        for set in &odd {
            assert_eq!(call(&mut c, &mut rng, set, "0.01"), null, "{set:?}");
        }
        for (i, set) in odd.iter().enumerate() {
            for k in set {
                let v = format!("v{i}");
                assert_eq!(w.cmd(&["RPUSH", k, &v]), Resp::Integer(1));
                for (j, other) in odd.iter().enumerate() {
                    if j == i {
                        continue;
                    }
                    let want = if other.contains(k) {
                        pair(k, &v)
                    } else {
                        null.clone()
                    };
                    let got = call(&mut c, &mut rng, other, "0.01");
                    assert_eq!(got, want, "{k:?} pushed; call on {other:?}");
                    if !got.is_null() {
                        w.cmd(&["RPUSH", k, &v]);
                    }
                }
                assert_eq!(
                    call(&mut c, &mut rng, set, "0.01"),
                    pair(k, &v),
                    "{k:?} pushed; call on {set:?}"
                );
            }
        }

        // The same set in another database.
        assert_eq!(c.cmd(&["SELECT", "1"]), Resp::ok());
        assert_eq!(call(&mut c, &mut rng, &base, "0.01"), null);
        let x = base[rng.index(base.len())].clone();
        assert_eq!(w.cmd(&["RPUSH", &x, "db0"]), Resp::Integer(1));
        assert_eq!(
            call(&mut c, &mut rng, &base, "0.01"),
            null,
            "db 1, {x} in db 0"
        );
        assert_eq!(w.cmd(&["SELECT", "1"]), Resp::ok());
        assert_eq!(w.cmd(&["RPUSH", &x, "db1"]), Resp::Integer(1));
        assert_eq!(call(&mut c, &mut rng, &base, "0.01"), pair(&x, "db1"));
        assert_eq!(c.cmd(&["SELECT", "0"]), Resp::ok());
        assert_eq!(call(&mut c, &mut rng, &base, "0.01"), pair(&x, "db0"));
        // Two clients blocked on the same set, in db 0 (first) and db 1: a push in
        // db 1 goes to the second.
        let mut c1 = s.client();
        assert_eq!(c1.cmd(&["SELECT", "1"]), Resp::ok());
        let order = shuffled(&mut rng, &base);
        c.send(&Pop::Right.args(&order, "10"));
        wait_blocked(&mut w, 1, "db 0 waiter");
        let order = shuffled(&mut rng, &base);
        c1.send(&Pop::Left.args(&order, "10"));
        wait_blocked(&mut w, 2, "db 1 waiter");
        assert_eq!(w.cmd(&["LPUSH", &x, "in-db1"]), Resp::Integer(1));
        assert_eq!(read_reply(&mut c1, "db 1 waiter"), pair(&x, "in-db1"));
        wait_blocked(&mut w, 1, "db 0 waiter still blocked");
        assert_eq!(w.cmd(&["SELECT", "0"]), Resp::ok());
        assert_eq!(w.cmd(&["LPUSH", &x, "in-db0"]), Resp::Integer(1));
        assert_eq!(read_reply(&mut c, "db 0 waiter"), pair(&x, "in-db0"));
        assert_eq!(info_int(&mut w, "blocked_clients"), 0);
    }

    /// The first existing key in argument order decides: a string (or a sorted set)
    /// there is WRONGTYPE, a list there is served, on a set the server knows from
    /// earlier calls; and after an error the same set still blocks and is woken.
    pub fn wrongtype_in_known_set(threads: usize) {
        const ROUNDS: usize = 60;
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(4));
        let keys = spread_keys("wt:", 40);
        let mut consumer = s.client();
        let mut writer = s.client();
        let wrongtype = Resp::Error(WRONGTYPE.into());

        // Make the set known: one call blocks and is woken, one times out.
        let order = shuffled(&mut rng, &keys);
        consumer.send(&Pop::Right.args(&order, "10"));
        wait_blocked(&mut writer, 1, "first BRPOP on the set");
        assert_eq!(writer.cmd(&["RPUSH", &keys[7], "first"]), Resp::Integer(1));
        assert_eq!(
            read_reply(&mut consumer, "first BRPOP"),
            pair(&keys[7], "first")
        );
        let order = shuffled(&mut rng, &keys);
        assert_eq!(
            consumer.cmd(&Pop::Left.args(&order, "0.01")),
            Resp::NullArray
        );

        for round in 0..ROUNDS {
            let ij = distinct(&mut rng, keys.len(), 2);
            let (bad, good) = (keys[ij[0]].clone(), keys[ij[1]].clone());
            let bad_is_zset = round % 3 == 2;
            if bad_is_zset {
                assert_eq!(writer.cmd(&["ZADD", &bad, "1", "m"]), Resp::Integer(1));
            } else {
                assert_eq!(writer.cmd(&["SET", &bad, "str"]), Resp::ok());
            }
            assert_eq!(writer.cmd(&["RPUSH", &good, "v1", "v2"]), Resp::Integer(2));
            let order = shuffled(&mut rng, &keys);
            let pos = |k: &str| order.iter().position(|x| x == k).unwrap();
            let op = match round % 3 {
                0 => Pop::Right,
                1 => Pop::Left,
                _ => Pop::Multi {
                    left: round % 2 == 0,
                    count: 1,
                },
            };
            let cmd = op.args(&order, "1");
            let mut model = Lists::default();
            model.rpush(&good, "v1");
            model.rpush(&good, "v2");
            let want = if pos(&bad) < pos(&good) {
                wrongtype.clone()
            } else {
                op.expect(&mut model, &order)
            };
            assert_eq!(
                consumer.cmd(&cmd),
                want,
                "round {round}: wrong type at {bad} (argument {}), a list at {good} \
                 (argument {}): `{}`",
                pos(&bad),
                pos(&good),
                short(&cmd)
            );
            if round % 4 == 0 {
                // The wrong-type key alone: an error at once, no blocking.
                writer.cmd(&["DEL", &good]);
                let order = shuffled(&mut rng, &keys);
                let cmd = op.args(&order, "0");
                assert_eq!(
                    consumer.cmd(&cmd),
                    wrongtype,
                    "round {round}: only {bad} exists: `{}`",
                    short(&cmd)
                );
            }
            writer.cmd(&["DEL", &bad, &good]);
            if round % 6 == 0 {
                // After the error the same set blocks, and a push wakes it.
                let order = shuffled(&mut rng, &keys);
                consumer.send(&Pop::Right.args(&order, "10"));
                wait_blocked(&mut writer, 1, &format!("round {round}: re-blocking"));
                let k = keys[rng.index(keys.len())].clone();
                assert_eq!(writer.cmd(&["LPUSH", &k, "w"]), Resp::Integer(1));
                assert_eq!(
                    read_reply(&mut consumer, "re-blocked BRPOP"),
                    pair(&k, "w"),
                    "round {round}"
                );
            }
        }

        // The other way round: BZPOPMIN on the same set, a list is the wrong type.
        for round in 0..20 {
            let ij = distinct(&mut rng, keys.len(), 2);
            let (list, zset) = (keys[ij[0]].clone(), keys[ij[1]].clone());
            assert_eq!(writer.cmd(&["RPUSH", &list, "a"]), Resp::Integer(1));
            assert_eq!(
                writer.cmd(&["ZADD", &zset, "2", "two", "1", "one"]),
                Resp::Integer(2)
            );
            let order = shuffled(&mut rng, &keys);
            let pos = |k: &str| order.iter().position(|x| x == k).unwrap();
            let mut cmd = vec!["BZPOPMIN".to_string()];
            cmd.extend(order.iter().cloned());
            cmd.push("1".into());
            let want = if pos(&list) < pos(&zset) {
                wrongtype.clone()
            } else {
                bulks(&[zset.as_str(), "one", "1"])
            };
            assert_eq!(
                consumer.cmd(&cmd),
                want,
                "round {round}: a list at {list} (argument {}), a sorted set at {zset} \
                 (argument {}): `{}`",
                pos(&list),
                pos(&zset),
                short(&cmd)
            );
            writer.cmd(&["DEL", &list, &zset]);
        }
        assert_eq!(info_int(&mut writer, "blocked_clients"), 0);
    }

    /// Five clients block, one after the other, on sets that share the key K (three on
    /// one set in different orders, one on another set, one on K alone); pushes to K,
    /// one at a time, serve them in the order they blocked. Then they all block again
    /// in another order, and that order is the one respected.
    pub fn fairness_across_sets(threads: usize) {
        const N: usize = 5;
        const ROUNDS: usize = 8;
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(5));
        let k = "fair:shared".to_string();
        let mut set_a = spread_keys("fair:a:", 12);
        set_a.push(k.clone());
        let mut set_b = spread_keys("fair:b:", 6);
        set_b.push(k.clone());
        let sets: Vec<Vec<String>> =
            vec![set_a.clone(), set_a.clone(), set_b, vec![k.clone()], set_a];
        let mut admin = s.client();
        let mut clients: Vec<Client> = (0..N)
            .map(|i| {
                let mut c = s.client();
                assert_eq!(c.cmd(&["CLIENT", "SETNAME", &format!("w{i}")]), Resp::ok());
                c
            })
            .collect();
        let mut previous: Vec<usize> = Vec::new();
        for round in 0..ROUNDS {
            let mut order: Vec<usize> = (0..N).collect();
            rng.shuffle(&mut order);
            if order == previous {
                order.rotate_left(1);
            }
            if round == ROUNDS - 1 {
                // Certainly different: the reverse of the previous round.
                order = previous.iter().rev().copied().collect();
            }
            for (pos, &i) in order.iter().enumerate() {
                let keys = shuffled(&mut rng, &sets[i]);
                let op = if (i + round) % 2 == 0 {
                    Pop::Right
                } else {
                    Pop::Left
                };
                clients[i].send(&op.args(&keys, "0"));
                wait_blocked(
                    &mut admin,
                    pos as i64 + 1,
                    &format!("round {round}: w{i} blocking"),
                );
            }
            let mut waiting: Vec<String> = (0..N).map(|i| format!("w{i}")).collect();
            for (pos, &i) in order.iter().enumerate() {
                let v = format!("r{round}-e{pos}");
                assert_eq!(admin.cmd(&["RPUSH", &k, &v]), Resp::Integer(1));
                wait_blocked(
                    &mut admin,
                    (N - pos - 1) as i64,
                    &format!("round {round}: push {pos}"),
                );
                let still = blocked_names(&mut admin);
                let served: Vec<String> = waiting
                    .iter()
                    .filter(|n| !still.contains(n))
                    .cloned()
                    .collect();
                assert_eq!(
                    served,
                    vec![format!("w{i}")],
                    "round {round}: blocking order {order:?}; push {pos} to {k} must \
                     serve w{i}, the oldest waiter"
                );
                waiting.retain(|n| *n != served[0]);
                assert_eq!(
                    read_reply(&mut clients[i], &format!("round {round}: w{i}")),
                    pair(&k, &v),
                    "round {round}: w{i}'s reply"
                );
            }
            assert_eq!(admin.cmd(&["EXISTS", &k]), Resp::Integer(0));
            previous = order;
        }
        assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
    }

    /// A waiter in `mixed_types`: what it calls on the shared set.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Waiter {
        Blpop,
        Brpop,
        /// BLMPOP ... LEFT COUNT 2
        Blmpop,
        /// BLMOVE lk mix:dst LEFT RIGHT (on the list key alone)
        Blmove,
        Bzpopmin,
        /// BZMPOP ... MAX COUNT 2
        Bzmpop,
    }

    const MIX_DST: &str = "mix:dst";

    impl Waiter {
        fn is_zset(self) -> bool {
            matches!(self, Waiter::Bzpopmin | Waiter::Bzmpop)
        }

        fn args(self, rng: &mut Rng, keys: &[String], lk: &str, timeout: &str) -> Vec<String> {
            let order = shuffled(rng, keys);
            let n = order.len().to_string();
            let cat = |head: &[&str], tail: &[&str]| -> Vec<String> {
                let mut v: Vec<String> = head.iter().map(|s| s.to_string()).collect();
                v.extend(order.iter().cloned());
                v.extend(tail.iter().map(|s| s.to_string()));
                v
            };
            match self {
                Waiter::Blpop => Pop::Left.args(&order, timeout),
                Waiter::Brpop => Pop::Right.args(&order, timeout),
                Waiter::Blmpop => Pop::Multi {
                    left: true,
                    count: 2,
                }
                .args(&order, timeout),
                Waiter::Blmove => ["BLMOVE", lk, MIX_DST, "LEFT", "RIGHT", timeout]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                Waiter::Bzpopmin => cat(&["BZPOPMIN"], &[timeout]),
                Waiter::Bzmpop => cat(&["BZMPOP", timeout, &n], &["MAX", "COUNT", "2"]),
            }
        }

        /// The reply when served from `list` (head first) or `zset` (by score), which
        /// it consumes.
        fn serve(
            self,
            lk: &str,
            zk: &str,
            list: &mut VecDeque<String>,
            zset: &mut VecDeque<(String, String)>,
            moved: &mut Vec<String>,
        ) -> Resp {
            match self {
                Waiter::Blpop => pair(lk, &list.pop_front().unwrap()),
                Waiter::Brpop => pair(lk, &list.pop_back().unwrap()),
                Waiter::Blmpop => {
                    let got: Vec<String> = (0..2).filter_map(|_| list.pop_front()).collect();
                    arr(vec![bulk(lk), bulks(&got)])
                }
                Waiter::Blmove => {
                    let v = list.pop_front().unwrap();
                    moved.push(v.clone());
                    bulk(&v)
                }
                Waiter::Bzpopmin => {
                    let (m, s) = zset.pop_front().unwrap();
                    bulks(&[zk, &m, &s])
                }
                Waiter::Bzmpop => {
                    let got: Vec<Resp> = (0..2)
                        .filter_map(|_| zset.pop_back())
                        .map(|(m, s)| bulks(&[m, s]))
                        .collect();
                    arr(vec![bulk(zk), arr(got)])
                }
            }
        }
    }

    /// BLPOP, BRPOP, BLMPOP, BZPOPMIN and BZMPOP from clients on the same unordered set
    /// (each its own order), and BLMOVE on one key of it. A ZADD serves the sorted-set
    /// waiters only and one RPUSH of five elements the list waiters, each in the order
    /// they blocked. With `interleaved`, the oldest waiter on the key pushed to is of the
    /// other type (Kite, unlike Redis, then serves nobody: see
    /// `mixed_types_other_type_first`); without, the waiters of each type are grouped
    /// and the first push matches the oldest. Then, on the empty set, every one of them
    /// times out with a null (`*-1` in RESP2, `_` in RESP3).
    fn mixed_types(threads: usize, interleaved: bool) {
        use Waiter::*;
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(if interleaved { 66 } else { 6 }));
        let keys = spread_keys("mix:", 24);
        let mut admin = s.client();
        let all = [Blpop, Brpop, Blmpop, Blmove, Bzpopmin, Bzmpop];
        let mut clients: Vec<Client> = all.iter().map(|_| s.client()).collect();
        let mut resp3 = s.client();
        assert!(
            matches!(resp3.cmd(&["HELLO", "3"]), Resp::Map(_)),
            "HELLO 3"
        );
        let slot = |w: Waiter| all.iter().position(|x| *x == w).unwrap();
        for round in 0..4 {
            let ij = distinct(&mut rng, keys.len(), 2);
            let (lk, zk) = (keys[ij[0]].clone(), keys[ij[1]].clone());
            let mut lists = vec![Blpop, Brpop, Blmpop, Blmove];
            rng.shuffle(&mut lists);
            let mut zsets = vec![Bzpopmin, Bzmpop];
            rng.shuffle(&mut zsets);
            let zadd_first = round % 2 == 0;
            let order: Vec<Waiter> = match (interleaved, zadd_first) {
                (false, true) => zsets.iter().chain(&lists).copied().collect(),
                (false, false) => lists.iter().chain(&zsets).copied().collect(),
                (true, true) => {
                    // The oldest waiter on the sorted set's key is a list pop.
                    if lists[0] == Blmove {
                        lists.rotate_left(1);
                    }
                    vec![lists[0], zsets[0], lists[1], lists[2], zsets[1], lists[3]]
                }
                (true, false) => {
                    vec![zsets[0], lists[0], lists[1], zsets[1], lists[2], lists[3]]
                }
            };
            let what = format!("round {round}, blocking order {order:?}");
            for (n, w) in order.iter().enumerate() {
                let cmd = w.args(&mut rng, &keys, &lk, "0");
                clients[slot(*w)].send(&cmd);
                wait_blocked(&mut admin, n as i64 + 1, &format!("{what}: {w:?}"));
            }
            let mut list: VecDeque<String> = (1..=5).map(|i| i.to_string()).collect();
            let mut zset: VecDeque<(String, String)> =
                (1..=3).map(|i| (format!("z{i}"), i.to_string())).collect();
            let mut moved = Vec::new();
            let mut left = order.len() as i64;
            for zset_turn in [zadd_first, !zadd_first] {
                if zset_turn {
                    assert_eq!(
                        admin.cmd(&["ZADD", &zk, "1", "z1", "2", "z2", "3", "z3"]),
                        Resp::Integer(3)
                    );
                } else {
                    assert_eq!(
                        admin.cmd(&["RPUSH", &lk, "1", "2", "3", "4", "5"]),
                        Resp::Integer(5)
                    );
                }
                for w in order.iter().filter(|w| w.is_zset() == zset_turn) {
                    let want = w.serve(&lk, &zk, &mut list, &mut zset, &mut moved);
                    let got = read_reply(
                        &mut clients[slot(*w)],
                        &format!(
                            "{what}: {w:?} after {}",
                            if zset_turn { "ZADD" } else { "RPUSH" }
                        ),
                    );
                    assert_eq!(got, want, "{what}: {w:?}'s reply");
                    left -= 1;
                }
                wait_blocked(&mut admin, left, &what);
            }
            assert_eq!(admin.cmd(&["EXISTS", &lk, &zk]), Resp::Integer(0));
            assert_eq!(admin.cmd(&["LRANGE", MIX_DST, "0", "-1"]), bulks(&moved));
            assert_eq!(admin.cmd(&["DEL", MIX_DST]), Resp::Integer(1));

            // Nothing anywhere: all of them time out with a null array, `_` in RESP3.
            for w in all {
                let cmd = w.args(&mut rng, &keys, &lk, "0.02");
                assert_eq!(
                    clients[slot(w)].cmd(&cmd),
                    Resp::NullArray,
                    "{w:?} timing out: `{}`",
                    short(&cmd)
                );
                assert_eq!(
                    resp3.cmd(&cmd),
                    Resp::Null,
                    "{w:?} timing out in RESP3: `{}`",
                    short(&cmd)
                );
            }
            // RESP3 data replies on the same set: BRPOP an array, BZPOPMIN's score a
            // double.
            assert_eq!(admin.cmd(&["RPUSH", &lk, "r3"]), Resp::Integer(1));
            let cmd = Brpop.args(&mut rng, &keys, &lk, "1");
            assert_eq!(resp3.cmd(&cmd), pair(&lk, "r3"));
            assert_eq!(admin.cmd(&["ZADD", &zk, "5", "m"]), Resp::Integer(1));
            let cmd = Bzpopmin.args(&mut rng, &keys, &lk, "1");
            assert_eq!(
                resp3.cmd(&cmd),
                arr(vec![bulk(&zk), bulk("m"), Resp::Double("5".into())])
            );
        }
        assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
    }

    pub fn mixed_types_same_set(threads: usize) {
        mixed_types(threads, false);
    }

    /// Redis serves, on a push, the oldest waiter *of the pushed type*: list waiters
    /// ahead of a sorted-set waiter on the same key do not stop a ZADD from serving it
    /// (and the reverse for RPUSH). Kite (at 1792cbd) serves nobody there: both clients
    /// stay blocked until their timeouts (the sorted-set waiter then answers `*-1` while
    /// the member is still in the key).
    pub fn mixed_types_other_type_first(threads: usize) {
        mixed_types(threads, true);
    }

    /// Waiters on sets sharing the key K leave (CLIENT KILL, closing the socket) or are
    /// unblocked (CLIENT UNBLOCK, with and without ERROR): a later push goes to the next
    /// waiter, or stays in the list for the next call; nothing is lost.
    pub fn disconnect_and_unblock(threads: usize) {
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(7));
        let k = "gone:shared".to_string();
        let mut s1 = spread_keys("gone:a:", 30);
        s1.push(k.clone());
        let mut s2 = spread_keys("gone:b:", 12);
        s2.push(k.clone());
        let mut admin = s.client();

        // 1. The oldest waiter is killed: the push goes to the next one.
        let mut w1 = s.client();
        let id1 = client_id(&mut w1);
        w1.send(&Pop::Right.args(&shuffled(&mut rng, &s1), "0"));
        wait_blocked(&mut admin, 1, "w1");
        let mut w2 = s.client();
        w2.send(&Pop::Left.args(&shuffled(&mut rng, &s2), "0"));
        wait_blocked(&mut admin, 2, "w2");
        assert_eq!(admin.cmd(&["CLIENT", "KILL", "ID", &id1]), Resp::Integer(1));
        wait_blocked(&mut admin, 1, "after CLIENT KILL");
        w1.set_timeout(Some(REPLY_WAIT));
        match w1.try_read() {
            Err(_) => {}
            Ok(r) => panic!("the killed client got a reply: {r}"),
        }
        assert_eq!(admin.cmd(&["RPUSH", &k, "x"]), Resp::Integer(1));
        assert_eq!(read_reply(&mut w2, "w2"), pair(&k, "x"));
        wait_blocked(&mut admin, 0, "w2 served");

        // 2. The only waiter closes its socket: the push stays in the list, and the
        // next call on the same set (another client) gets it at once.
        let mut w3 = s.client();
        w3.send(&Pop::Right.args(&shuffled(&mut rng, &s1), "0"));
        wait_blocked(&mut admin, 1, "w3");
        drop(w3);
        wait_blocked(&mut admin, 0, "after w3 closed");
        assert_eq!(admin.cmd(&["RPUSH", &k, "y"]), Resp::Integer(1));
        assert_eq!(admin.cmd(&["LLEN", &k]), Resp::Integer(1));
        let mut w4 = s.client();
        assert_eq!(
            w4.cmd(&Pop::Right.args(&shuffled(&mut rng, &s1), "1")),
            pair(&k, "y")
        );

        // 3. Three waiters on the same set; the first two are killed: one push of two
        // elements serves the third once and leaves the other element.
        let mut ws: Vec<(Client, String)> = (0..3)
            .map(|_| {
                let mut c = s.client();
                let id = client_id(&mut c);
                (c, id)
            })
            .collect();
        for (n, (c, _)) in ws.iter_mut().enumerate() {
            c.send(&Pop::Right.args(&shuffled(&mut rng, &s1), "0"));
            wait_blocked(&mut admin, n as i64 + 1, "waiters on one set");
        }
        for (_, id) in &ws[..2] {
            assert_eq!(admin.cmd(&["CLIENT", "KILL", "ID", id]), Resp::Integer(1));
        }
        wait_blocked(&mut admin, 1, "two of three killed");
        assert_eq!(admin.cmd(&["RPUSH", &k, "a", "b"]), Resp::Integer(2));
        assert_eq!(read_reply(&mut ws[2].0, "the third waiter"), pair(&k, "b"));
        assert_eq!(admin.cmd(&["LRANGE", &k, "0", "-1"]), bulks(&["a"]));
        assert_eq!(admin.cmd(&["DEL", &k]), Resp::Integer(1));
        drop(ws);

        // 4. CLIENT UNBLOCK ... ERROR, then CLIENT UNBLOCK (a timeout), on a known set.
        let mut w = s.client();
        let id = client_id(&mut w);
        assert_eq!(
            w.cmd(&Pop::Right.args(&shuffled(&mut rng, &s1), "0.01")),
            Resp::NullArray
        );
        w.send(&Pop::Right.args(&shuffled(&mut rng, &s1), "0"));
        wait_blocked(&mut admin, 1, "w before CLIENT UNBLOCK ERROR");
        assert_eq!(
            admin.cmd(&["CLIENT", "UNBLOCK", &id, "ERROR"]),
            Resp::Integer(1)
        );
        assert_eq!(
            read_reply(&mut w, "CLIENT UNBLOCK ERROR"),
            Resp::Error("UNBLOCKED client unblocked via CLIENT UNBLOCK".into())
        );
        wait_blocked(&mut admin, 0, "after CLIENT UNBLOCK ERROR");
        assert_eq!(admin.cmd(&["RPUSH", &k, "c"]), Resp::Integer(1));
        assert_eq!(admin.cmd(&["LLEN", &k]), Resp::Integer(1));
        assert_eq!(
            w.cmd(&Pop::Left.args(&shuffled(&mut rng, &s1), "1")),
            pair(&k, "c")
        );
        w.send(&Pop::Left.args(&shuffled(&mut rng, &s1), "0"));
        wait_blocked(&mut admin, 1, "w before CLIENT UNBLOCK");
        assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", &id]), Resp::Integer(1));
        assert_eq!(read_reply(&mut w, "CLIENT UNBLOCK"), Resp::NullArray);
        assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", &id]), Resp::Integer(0));
        // Still woken normally afterwards.
        w.send(&Pop::Right.args(&shuffled(&mut rng, &s1), "0"));
        wait_blocked(&mut admin, 1, "w after two unblocks");
        assert_eq!(admin.cmd(&["LPUSH", &k, "d"]), Resp::Integer(1));
        assert_eq!(read_reply(&mut w, "w after two unblocks"), pair(&k, "d"));
        assert_eq!(admin.cmd(&["EXISTS", &k]), Resp::Integer(0));
        assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
    }

    /// 200 distinct random sets of 30 keys (out of 300) from four clients with short
    /// timeouts, first with nothing to pop, then while every key gets pushed to: every
    /// element is received once or still in its list, and no client stays blocked.
    pub fn many_distinct_sets(threads: usize) {
        const POOL: usize = 300;
        const SETS: usize = 200;
        const SET_SIZE: usize = 30;
        const CLIENTS: usize = 4;
        const PUSHES_PER_KEY: usize = 2;
        const MAX_CALLS: usize = 1500;
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(8));
        let keys = spread_keys("many:", POOL);
        let sets: Vec<Vec<String>> = (0..SETS)
            .map(|_| {
                distinct(&mut rng, POOL, SET_SIZE)
                    .into_iter()
                    .map(|i| keys[i].clone())
                    .collect()
            })
            .collect();
        let pushing_done = AtomicBool::new(false);
        let phase1_done = AtomicUsize::new(0);
        let received: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
        let mut pushed: Vec<String> = Vec::new();
        thread::scope(|scope| {
            for c in 0..CLIENTS {
                let (sets, pushing_done, received, phase1_done) =
                    (&sets, &pushing_done, &received, &phase1_done);
                let mut client = s.client();
                let mut rng = Rng::new(seed(80 + c as u64));
                scope.spawn(move || {
                    let mine: Vec<&Vec<String>> = sets.iter().skip(c).step_by(CLIENTS).collect();
                    let mut got = Vec::new();
                    // Phase 1: every set once, nothing to pop.
                    for (n, set) in mine.iter().enumerate() {
                        let op = if n % 2 == 0 { Pop::Right } else { Pop::Left };
                        let cmd = op.args(set, "0.01");
                        assert_eq!(client.cmd(&cmd), Resp::NullArray, "client {c}, set {n}");
                    }
                    phase1_done.fetch_add(1, Ordering::SeqCst);
                    // Phase 2: random sets of its own, until the pushes are over and a few
                    // calls more (bounded).
                    let mut after_done = 0;
                    for call in 0..MAX_CALLS {
                        if pushing_done.load(Ordering::SeqCst) {
                            after_done += 1;
                            if after_done > 20 {
                                break;
                            }
                        }
                        let pick = rng.index(mine.len());
                        let set = shuffled(&mut rng, mine[pick]);
                        let op = if call % 3 == 0 { Pop::Left } else { Pop::Right };
                        let timeout = *rng.pick(&["0.01", "0.02", "0.05"]);
                        let cmd = op.args(&set, timeout);
                        client.send(&cmd);
                        let r = read_reply(&mut client, &format!("client {c}, call {call}"));
                        if r.is_null() {
                            assert_eq!(r, Resp::NullArray);
                            continue;
                        }
                        let items = r
                            .as_array()
                            .unwrap_or_else(|| panic!("client {c}: `{}` -> {r}", short(&cmd)));
                        let (k, v) = (items[0].as_string().unwrap(), items[1].as_string().unwrap());
                        assert!(set.contains(&k), "client {c}: {k} is not in its set");
                        assert!(
                            v.starts_with(&format!("{k}|")),
                            "client {c}: {v} popped from {k}"
                        );
                        got.push((k, v));
                    }
                    received.lock().unwrap().extend(got);
                });
            }
            // Pushes to every key of the pool, in batches, while the clients call.
            // (after every client's first phase, which expects nothing to pop)
            let deadline = Instant::now() + Duration::from_secs(30);
            while phase1_done.load(Ordering::SeqCst) < CLIENTS {
                if Instant::now() > deadline {
                    pushing_done.store(true, Ordering::SeqCst);
                    panic!("the clients' first phase did not finish");
                }
                thread::sleep(Duration::from_millis(2));
            }
            let mut producer = s.client();
            let mut admin = s.client();
            let mut order: Vec<&String> = keys.iter().collect();
            for round in 0..PUSHES_PER_KEY {
                rng.shuffle(&mut order);
                for batch in order.chunks(25) {
                    let cmds: Vec<Vec<String>> = batch
                        .iter()
                        .map(|k| {
                            let v = format!("{k}|{round}");
                            pushed.push(v.clone());
                            vec!["LPUSH".to_string(), k.to_string(), v]
                        })
                        .collect();
                    for r in producer.pipeline(&cmds) {
                        assert!(r.as_int().is_some(), "LPUSH answered {r}");
                    }
                    // Let the clients run in between (bounded: one INFO round trip).
                    info_int(&mut admin, "blocked_clients");
                }
            }
            pushing_done.store(true, Ordering::SeqCst);
        });
        let mut admin = s.client();
        wait_blocked(&mut admin, 0, "after all clients stopped");
        let received = received.into_inner().unwrap();
        let mut seen: HashSet<String> = HashSet::new();
        for (_, v) in &received {
            assert!(seen.insert(v.clone()), "{v} received twice");
        }
        let mut left = 0;
        for k in &keys {
            let r = admin.cmd(&["LRANGE", k, "0", "-1"]);
            for v in r.as_array().unwrap() {
                let v = v.as_string().unwrap();
                assert!(v.starts_with(&format!("{k}|")), "{v} found in {k}");
                assert!(seen.insert(v.clone()), "{v} both received and still in {k}");
                left += 1;
            }
        }
        assert_eq!(
            received.len() + left,
            pushed.len(),
            "received {} + left in lists {left} != pushed {}",
            received.len(),
            pushed.len()
        );
        eprintln!(
            "many_distinct_sets: {} received, {left} left in their lists",
            received.len()
        );
        let pushed: HashSet<String> = pushed.into_iter().collect();
        assert_eq!(
            seen, pushed,
            "the received and remaining elements are the pushed ones"
        );
    }
}

/// Round trips to other threads (INFO `hops`) counted while `run` runs; `setup` runs
/// before each try, outside the count. INFO itself asks the threads without a hop. The
/// least of the tries, so that a hop of a background task during one of them does not
/// count.
fn hops_of(
    admin: &mut Client,
    mut setup: impl FnMut(&mut Client),
    mut run: impl FnMut(),
    tries: usize,
) -> i64 {
    let hops = |admin: &mut Client| -> i64 {
        common::info_field(admin, "transactions", "hops")
            .parse()
            .unwrap()
    };
    let mut least = i64::MAX;
    for _ in 0..tries {
        setup(admin);
        let h1 = hops(admin);
        run();
        let h2 = hops(admin);
        least = least.min(h2 - h1);
    }
    least
}

/// A consumer re-blocking on a key set it blocked on before, whose keys hold something on
/// both threads, is served from the first of them in its call's order after one round
/// trip to ask and at most one to take: the threads name their keys that hold something,
/// instead of asking for the call's keys to be sent again (which took three round trips
/// when the first key was on the other thread). Redis-level behaviour is pinned by the
/// scenarios above; this pins the cost of the common case of a busy consumer.
#[test]
fn a_known_set_holding_data_is_served_without_sending_the_keys_again() {
    if common::kite_is_redis() {
        return;
    }
    let s = KiteServer::start(&[], 2);
    // Keys 0 and 2 on one thread, 1 and 3 on the other.
    let keys = spread_keys("known:", 4);
    let mut c = s.client();
    let mut admin = s.client();
    for side in [0usize, 1] {
        // The first key holding data in the measured call's order is on one thread
        // (`side`), a later one on the other thread, and the two empty keys in between.
        let (first, later, empty) = if side == 0 {
            (0, 3, [2, 1])
        } else {
            (1, 2, [3, 0])
        };
        let order: Vec<&str> = [first, empty[0], empty[1], later]
            .iter()
            .map(|&i| keys[i].as_str())
            .collect();
        // The set becomes known: a call that blocks, then is served by a push.
        let mut call: Vec<&str> = vec!["BRPOP"];
        call.extend(keys.iter().map(|k| k.as_str()));
        call.push("10");
        c.send(&call);
        wait_blocked(&mut admin, 1, "learning the set");
        admin.cmd(&["LPUSH", &keys[later], "wake"]);
        assert_eq!(
            read_reply(&mut c, "the learning call"),
            pair(&keys[later], "wake")
        );
        admin.cmd(&["LPUSH", &keys[later], "b"]);
        let mut served = Vec::new();
        // Measured: the same set again, in another order, with data on both threads.
        let hops = hops_of(
            &mut admin,
            |admin| {
                admin.cmd(&["LPUSH", &keys[first], "a"]);
            },
            || {
                let mut call: Vec<&str> = vec!["BRPOP"];
                call.extend(order.iter().copied());
                call.push("10");
                served.push(c.cmd(&call));
            },
            3,
        );
        for r in &served {
            assert_eq!(r, &pair(&keys[first], "a"), "order {order:?}");
        }
        assert!(
            hops <= 2,
            "re-blocking on a known set with data on both threads took {hops} round trips \
             (first key holding data on side {side})"
        );
        admin.cmd(&["DEL", &keys[0], &keys[1], &keys[2], &keys[3]]);
    }
}

/// A consumer blocking again and again on the same many keys, reshuffled each time as
/// Sidekiq does, registers once per thread holding some of them, not once per key
/// (INFO `blocking_registrations`): what blocking costs must not grow with the number of
/// queues a consumer serves. Redis-level behaviour is pinned by the scenarios above.
#[test]
fn blocking_again_on_a_known_set_registers_once_per_thread_not_per_key() {
    if common::kite_is_redis() {
        return;
    }
    const KEYS: usize = 120;
    const CALLS: i64 = 10;
    for threads in [1usize, 2] {
        let s = KiteServer::start(&[], threads);
        let keys = spread_keys("regs:", KEYS);
        let mut c = s.client();
        let mut admin = s.client();
        let mut rng = Rng::new(seed(77));
        let registrations = |admin: &mut Client| -> i64 {
            common::info_field(admin, "transactions", "blocking_registrations")
                .parse()
                .unwrap()
        };
        let before = registrations(&mut admin);
        for i in 0..CALLS {
            let mut call = vec!["BRPOP".to_string()];
            call.extend(shuffled(&mut rng, &keys));
            call.push("10".to_string());
            c.send(&call.iter().map(|s| s.as_str()).collect::<Vec<_>>());
            wait_blocked(&mut admin, 1, "the consumer");
            let key = &keys[rng.below(KEYS as u64) as usize];
            let value = format!("job{i}");
            admin.cmd(&["LPUSH", key, &value]);
            assert_eq!(read_reply(&mut c, "a served call"), pair(key, &value));
        }
        let per_call = (registrations(&mut admin) - before) as f64 / CALLS as f64;
        assert!(
            per_call <= threads as f64,
            "a call on {KEYS} known keys over {threads} threads made {per_call} registrations"
        );
    }
}
