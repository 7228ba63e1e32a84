//! Who is served first when clients wait on sets of keys that overlap, repeat or share a
//! key. Kite remembers a client blocked by BLPOP, BRPOP, BZPOPMIN, BLMOVE or XREAD on
//! several keys not with one entry per key but with one entry in the queue of its
//! unordered set of keys (a "wait group"), and a key that gains data looks through every
//! group that names it for the client that has waited longest. These tests pin, from the
//! clients' side, what that must keep exactly as Redis does it:
//!
//! - a key that gains data serves the clients waiting on it in the order they blocked,
//!   whatever other keys each one waits on, and whether their sets are equal, overlap,
//!   contain one another or list the same keys in another order; one push of several
//!   elements serves several waiters in that order, each popping from its own end;
//! - a push to a key that only some of the sets name serves the oldest client among
//!   those sets only, and leaves the data in place when nobody waits on that key;
//! - a client that was served and calls again on the same set goes to the back, behind
//!   everyone still waiting, on one thread or spread over four, even when the next push
//!   races with its new call;
//! - a waiter that times out, is CLIENT UNBLOCKed or is killed while it is first in line
//!   takes nothing with it: the next push goes to the next client, and every element is
//!   either received once or still in its list;
//! - a waiter for another type on the same key does not hold the queue: a list push
//!   serves the list poppers behind a BZPOPMIN (which stays blocked), and the reverse;
//! - XREAD is not a pop: every reader whose last ID is below a new entry gets it, each
//!   from the ID it gave (`$` or explicit), on sets that share the stream;
//! - sixty distinct sets that share one hot key are served in blocking order, again
//!   after everyone blocks once more in a new order, so remembered sets are reused.
//!
//! Each scenario runs at `--threads 1` and `--threads 4` (keys come from `spread_keys`,
//! so the keys of one set sit on different threads). Waits are bounded (reads time out,
//! loops count); short sleeps only pace polling, and nothing asserts on time. The seed is
//! `KITE_BLOCKING_GROUPS_SEED` (default below). Every test passes against redis-server 7.0
//! (`KITE_BIN=/usr/bin/redis-server`): no case depends on where 7.0 (which serves a woken
//! client from the key that gained data) and 7.2 (which runs the woken command again, in
//! its own argument order) differ, because a served client never has data on two of its
//! keys at once.

mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::ErrorKind;
use std::thread;
use std::time::{Duration, Instant};

use common::blocked::{
    blocked_names, client_id, distinct, info_int, read_reply, shuffled, wait_blocked, REPLY_WAIT,
    SETTLE_WAIT,
};
use common::{seeds_from_env, shard_of, spread_keys, Client, KiteServer, Resp, Rng};

fn seed(salt: u64) -> u64 {
    seeds_from_env("KITE_BLOCKING_GROUPS_SEED", &[20_261_203])[0]
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

/// The RESP2 reply of XREAD served from one stream: `[[stream, [[id, [field, value]]...]]]`.
fn xreply(stream: &str, entries: &[(&str, &str, &str)]) -> Resp {
    let entries: Vec<Resp> = entries
        .iter()
        .map(|(id, f, v)| arr(vec![bulk(id), bulks(&[f, v])]))
        .collect();
    arr(vec![arr(vec![bulk(stream), arr(entries)])])
}

/// `BLPOP keys... timeout` (left) or `BRPOP keys... timeout`.
fn pop_cmd(left: bool, keys: &[String], timeout: &str) -> Vec<String> {
    let mut cmd = vec![if left { "BLPOP" } else { "BRPOP" }.to_string()];
    cmd.extend(keys.iter().cloned());
    cmd.push(timeout.to_string());
    cmd
}

/// Waits (bounded) until the clients CLIENT LIST shows blocked are exactly those named in
/// `want`. When a push serves the wrong client, the set never matches, and the message
/// names who was served instead.
#[track_caller]
fn wait_blocked_set<S: AsRef<str>>(c: &mut Client, want: &[S], what: &str) {
    let mut want: Vec<String> = want.iter().map(|s| s.as_ref().to_string()).collect();
    want.sort();
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        let now = blocked_names(c);
        if now == want {
            return;
        }
        if Instant::now() >= deadline {
            let not_blocked: Vec<&String> = want.iter().filter(|n| !now.contains(n)).collect();
            let still_blocked: Vec<&String> = now.iter().filter(|n| !want.contains(n)).collect();
            panic!(
                "{what}: expected exactly {want:?} blocked, CLIENT LIST shows {now:?} \
                 (not blocked but should be: {not_blocked:?}; blocked but should have \
                 been served: {still_blocked:?})"
            );
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Waits (bounded) until the client named `name` is among the blocked ones.
#[track_caller]
fn wait_name_blocked(c: &mut Client, name: &str, what: &str) {
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        let now = blocked_names(c);
        if now.iter().any(|n| n == name) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {name} never blocked; CLIENT LIST shows {now:?} blocked"
        );
        thread::sleep(Duration::from_millis(2));
    }
}

/// After `c` (named `name`) sent a blocking call with a short timeout: waits until the
/// server shows it blocked (None), or until its reply has come (the timeout expired before
/// the blocked state was seen), which is then read and returned. The reply is only
/// peeked at until it is whole, so nothing is lost to the short waits.
#[track_caller]
fn blocked_or_replied(admin: &mut Client, c: &mut Client, name: &str, what: &str) -> Option<Resp> {
    let probe = c.try_clone_stream();
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        if blocked_names(admin).iter().any(|n| n == name) {
            c.set_timeout(Some(REPLY_WAIT));
            return None;
        }
        probe
            .set_read_timeout(Some(Duration::from_millis(2)))
            .expect("set_read_timeout");
        let mut byte = [0u8; 1];
        match probe.peek(&mut byte) {
            Ok(0) => panic!("{what}: {name}'s connection was closed"),
            Ok(_) => return Some(read_reply(c, what)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("{what}: {name}'s connection failed: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {name} neither blocked nor answered"
        );
    }
}

/// A client with a name (CLIENT SETNAME), so CLIENT LIST tells who is blocked.
fn named(s: &KiteServer, name: &str) -> Client {
    let mut c = s.client();
    assert_eq!(
        c.cmd(&["CLIENT", "SETNAME", name]),
        Resp::ok(),
        "SETNAME {name}"
    );
    c
}

/// The connection of a killed client is closed without a reply.
#[track_caller]
fn assert_closed(c: &mut Client, what: &str) {
    c.set_timeout(Some(REPLY_WAIT));
    if let Ok(r) = c.try_read() {
        panic!("{what}: the killed client got a reply: {r}");
    }
}

/// Sends a blocking call and waits until the server counts `n` blocked clients.
#[track_caller]
fn block(c: &mut Client, admin: &mut Client, cmd: &[String], n: i64, what: &str) {
    c.send(cmd);
    wait_blocked(admin, n, what);
}

/// What the lists should hold (head first), and a count of every element pushed,
/// received by a client, or found left in a list at the end.
#[derive(Default)]
struct Ledger {
    lists: HashMap<String, VecDeque<String>>,
    pushed: usize,
    received: usize,
    left_over: usize,
}

impl Ledger {
    /// `RPUSH key vals...` through `c`, checking the length it answers.
    #[track_caller]
    fn rpush(&mut self, c: &mut Client, key: &str, vals: &[String]) {
        let l = self.lists.entry(key.to_string()).or_default();
        l.extend(vals.iter().cloned());
        let len = l.len() as i64;
        let mut cmd = vec!["RPUSH".to_string(), key.to_string()];
        cmd.extend(vals.iter().cloned());
        assert_eq!(c.cmd(&cmd), Resp::Integer(len), "RPUSH {key} {vals:?}");
        self.pushed += vals.len();
    }

    /// Reads the reply of `c`, a BLPOP (`left`) or BRPOP served from `key`: the element
    /// the model pops from that end (waiters are served one after the other, in the
    /// order this is called).
    #[track_caller]
    fn served(&mut self, c: &mut Client, key: &str, left: bool, what: &str) {
        let l = self
            .lists
            .get_mut(key)
            .unwrap_or_else(|| panic!("{what}: the model holds nothing at {key}"));
        let popped = if left { l.pop_front() } else { l.pop_back() };
        let v = popped.expect("non-empty model list");
        if l.is_empty() {
            self.lists.remove(key);
        }
        assert_eq!(
            read_reply(c, what),
            pair(key, &v),
            "{what}: {} served from {key}",
            if left { "BLPOP" } else { "BRPOP" }
        );
        self.received += 1;
    }

    fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }

    /// Checks what the lists still hold, counts it and deletes it (so that later calls
    /// on the same keys block).
    #[track_caller]
    fn settle(&mut self, c: &mut Client, what: &str) {
        let mut keys: Vec<String> = self.lists.keys().cloned().collect();
        keys.sort();
        for k in keys {
            let want: Vec<String> = self.lists[&k].iter().cloned().collect();
            assert_eq!(
                c.cmd(&["LRANGE", &k, "0", "-1"]),
                bulks(&want),
                "{what}: what is left at {k}"
            );
            assert_eq!(c.cmd(&["DEL", &k]), Resp::Integer(1), "{what}: DEL {k}");
            self.left_over += want.len();
        }
        self.lists.clear();
    }

    /// Every element pushed was received once or found left in its list.
    #[track_caller]
    fn assert_conserved(&self, what: &str) {
        assert_eq!(
            self.received + self.left_over,
            self.pushed,
            "{what}: received {} + left in lists {} != pushed {}",
            self.received,
            self.left_over,
            self.pushed
        );
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
    overlapping_sets_fifo,
    one_set_many_clients,
    front_waiter_leaves,
    mixed_types_on_one_key,
    xread_readers_share_a_stream,
    hot_key_many_sets,
    reblock_goes_behind,
);

mod scenarios {
    use super::*;

    /// A waits on {k1, k2}, B on {k2, k3}, C on {k3, k1, k2}, D on {k2} alone (a BLMOVE
    /// into a fourth key), blocking in that order, each seen blocked before the next
    /// calls. One RPUSH of four elements to k2 serves A, B, C, D in that order, each from
    /// its own end of the list; pushes to k1 or k3 serve the oldest of the clients whose
    /// set names that key, and stay in the list when none is left; two pushes in one
    /// transaction serve one client each.
    pub fn overlapping_sets_fifo(threads: usize) {
        let s = KiteServer::start(&[], threads);
        let keys = spread_keys("ovl:", 4);
        let (k1, k2, k3, dst) = (
            keys[0].as_str(),
            keys[1].as_str(),
            keys[2].as_str(),
            keys[3].as_str(),
        );
        let mut admin = s.client();
        let names = ["ovl-a", "ovl-b", "ovl-c", "ovl-d"];
        let sets: Vec<Vec<String>> = vec![
            vec![k1.to_string(), k2.to_string()],
            vec![k2.to_string(), k3.to_string()],
            vec![k3.to_string(), k1.to_string(), k2.to_string()],
            vec![k2.to_string()],
        ];
        let mut clients: Vec<Client> = names.iter().map(|n| named(&s, n)).collect();
        // D moves what it pops to the tail of `dst`; everyone else pops.
        let call = |i: usize, left: bool| -> Vec<String> {
            if i == 3 {
                let from = if left { "LEFT" } else { "RIGHT" };
                ["BLMOVE", k2, dst, from, "RIGHT", "0"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            } else {
                pop_cmd(left, &sets[i], "0")
            }
        };
        let want = |i: usize, key: &str, v: &str| -> Resp {
            if i == 3 {
                bulk(v)
            } else {
                pair(key, v)
            }
        };
        let block_all =
            |clients: &mut Vec<Client>, admin: &mut Client, left: [bool; 4], what: &str| {
                for i in 0..4 {
                    clients[i].send(&call(i, left[i]));
                    wait_blocked(
                        admin,
                        i as i64 + 1,
                        &format!("{what}: {} blocking", names[i]),
                    );
                }
                wait_blocked_set(admin, &names, what);
            };
        let mut moved: Vec<&str> = Vec::new();

        // 1. Everyone pops from the left: the elements go out in blocking order.
        let what = "one RPUSH of four to the key all four sets share, all from the left";
        block_all(&mut clients, &mut admin, [true; 4], what);
        assert_eq!(
            admin.cmd(&["RPUSH", k2, "e1", "e2", "e3", "e4"]),
            Resp::Integer(4)
        );
        wait_blocked(&mut admin, 0, what);
        for (i, v) in ["e1", "e2", "e3", "e4"].into_iter().enumerate() {
            assert_eq!(
                read_reply(&mut clients[i], what),
                want(i, k2, v),
                "{what}: {} blocked in position {i}",
                names[i]
            );
        }
        moved.push("e4");
        assert_eq!(admin.cmd(&["EXISTS", k2]), Resp::Integer(0));

        // 2. Alternating ends: A takes the tail, B the head, C the tail, D the head.
        let what = "one RPUSH of four to the shared key, alternating ends";
        block_all(&mut clients, &mut admin, [false, true, false, true], what);
        assert_eq!(
            admin.cmd(&["RPUSH", k2, "e1", "e2", "e3", "e4"]),
            Resp::Integer(4)
        );
        wait_blocked(&mut admin, 0, what);
        for (i, v) in ["e4", "e1", "e3", "e2"].into_iter().enumerate() {
            assert_eq!(
                read_reply(&mut clients[i], what),
                want(i, k2, v),
                "{what}: {} blocked in position {i}",
                names[i]
            );
        }
        moved.push("e2");
        assert_eq!(admin.cmd(&["EXISTS", k2]), Resp::Integer(0));

        // 3. Pushes to k1 and k3, one at a time: the oldest waiter naming that key.
        let what = "pushes to k1 and k3 one at a time";
        block_all(&mut clients, &mut admin, [true; 4], what);
        let steps: [(&str, &str, Option<usize>); 5] = [
            (k3, "s1", Some(1)), // B and C wait on k3: B blocked first
            (k1, "s2", Some(0)), // A and C wait on k1: A blocked first
            (k3, "s3", Some(2)), // only C is left on k3
            (k1, "s4", None),    // nobody is left on k1: it stays
            (k2, "s5", Some(3)), // D
        ];
        let mut waiting: Vec<usize> = (0..4).collect();
        for (key, v, who) in steps {
            let step = format!("{what}: RPUSH {key} {v}");
            assert_eq!(admin.cmd(&["RPUSH", key, v]), Resp::Integer(1), "{step}");
            if let Some(i) = who {
                waiting.retain(|&w| w != i);
            }
            let still: Vec<&str> = waiting.iter().map(|&i| names[i]).collect();
            wait_blocked_set(&mut admin, &still, &step);
            if let Some(i) = who {
                assert_eq!(
                    read_reply(&mut clients[i], &step),
                    want(i, key, v),
                    "{step}: {}",
                    names[i]
                );
            }
        }
        moved.push("s5");
        assert_eq!(admin.cmd(&["LRANGE", k1, "0", "-1"]), bulks(&["s4"]));
        assert_eq!(admin.cmd(&["DEL", k1]), Resp::Integer(1));

        // 4. Two pushes in one transaction: k3 to B (before C), k1 to A (before C),
        // whichever key is looked at first. Then C and D share k2, C first.
        let what = "MULTI: RPUSH k3, RPUSH k1";
        block_all(&mut clients, &mut admin, [true; 4], what);
        assert_eq!(admin.cmd(&["MULTI"]), Resp::ok());
        assert_eq!(admin.cmd(&["RPUSH", k3, "m1"]), Resp::simple("QUEUED"));
        assert_eq!(admin.cmd(&["RPUSH", k1, "m2"]), Resp::simple("QUEUED"));
        assert_eq!(
            admin.cmd(&["EXEC"]),
            arr(vec![Resp::Integer(1), Resp::Integer(1)])
        );
        wait_blocked_set(&mut admin, &[names[2], names[3]], what);
        assert_eq!(
            read_reply(&mut clients[0], what),
            pair(k1, "m2"),
            "{what}: A"
        );
        assert_eq!(
            read_reply(&mut clients[1], what),
            pair(k3, "m1"),
            "{what}: B"
        );
        let what = "RPUSH of two to k2 with C and D left";
        assert_eq!(admin.cmd(&["RPUSH", k2, "m3", "m4"]), Resp::Integer(2));
        wait_blocked(&mut admin, 0, what);
        assert_eq!(
            read_reply(&mut clients[2], what),
            pair(k2, "m3"),
            "{what}: C"
        );
        assert_eq!(read_reply(&mut clients[3], what), bulk("m4"), "{what}: D");
        moved.push("m4");

        assert_eq!(admin.cmd(&["EXISTS", k1, k2, k3]), Resp::Integer(0));
        assert_eq!(admin.cmd(&["LRANGE", dst, "0", "-1"]), bulks(&moved));
        assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
    }

    /// 30 clients on the same 20 keys, each call in its own shuffled order (even clients
    /// BLPOP, odd ones BRPOP). Pushes to random keys, one at a time (sometimes of two or
    /// three elements): each element goes to the client that has waited longest among
    /// those still blocked; a served client blocks again later, at the back. The test keeps
    /// the line in a FIFO and checks every delivery.
    pub fn one_set_many_clients(threads: usize) {
        const CLIENTS: usize = 30;
        const KEYS: usize = 20;
        const STEPS: usize = 80;
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(2));
        let keys = spread_keys("same:", KEYS);
        let mut admin = s.client();
        let names: Vec<String> = (0..CLIENTS).map(|i| format!("same-{i:02}")).collect();
        let mut clients: Vec<Client> = names.iter().map(|n| named(&s, n)).collect();
        let left = |i: usize| i.is_multiple_of(2);
        let mut fifo: VecDeque<usize> = VecDeque::new();
        let mut resting: Vec<usize> = (0..CLIENTS).collect();
        let mut ledger = Ledger::default();
        for step in 0..STEPS {
            // Some of the clients not blocked call again, in a random order (all of them
            // when few are blocked).
            rng.shuffle(&mut resting);
            let n = if fifo.len() < 3 {
                resting.len()
            } else {
                rng.index(resting.len() + 1)
            };
            let rejoin: Vec<usize> = resting.drain(..n).collect();
            for i in rejoin {
                let order = shuffled(&mut rng, &keys);
                fifo.push_back(i);
                block(
                    &mut clients[i],
                    &mut admin,
                    &pop_cmd(left(i), &order, "0"),
                    fifo.len() as i64,
                    &format!("step {step}: {} blocking", names[i]),
                );
            }
            // One push to a random key.
            let m = if fifo.len() >= 3 && rng.chance(25) {
                rng.range(2, 3) as usize
            } else {
                1
            };
            let key = rng.pick(&keys).clone();
            let vals: Vec<String> = (0..m).map(|j| format!("v{step}-{j}")).collect();
            ledger.rpush(&mut admin, &key, &vals);
            let served: Vec<usize> = (0..m).map(|_| fifo.pop_front().unwrap()).collect();
            let served_names: Vec<&str> = served.iter().map(|&i| names[i].as_str()).collect();
            let what = format!("step {step}: RPUSH {key} {vals:?} must serve {served_names:?}");
            let still: Vec<&str> = fifo.iter().map(|&i| names[i].as_str()).collect();
            wait_blocked_set(&mut admin, &still, &what);
            for &i in &served {
                ledger.served(
                    &mut clients[i],
                    &key,
                    left(i),
                    &format!("{what}: {}", names[i]),
                );
                resting.push(i);
            }
            assert!(ledger.is_empty(), "{what}: an element was left over");
        }
        // Everyone blocks again; one push of an element per client serves all of them
        // in line order.
        rng.shuffle(&mut resting);
        let rejoin: Vec<usize> = std::mem::take(&mut resting);
        for i in rejoin {
            let order = shuffled(&mut rng, &keys);
            fifo.push_back(i);
            block(
                &mut clients[i],
                &mut admin,
                &pop_cmd(left(i), &order, "0"),
                fifo.len() as i64,
                &format!("last round: {} blocking", names[i]),
            );
        }
        assert_eq!(fifo.len(), CLIENTS);
        let key = rng.pick(&keys).clone();
        let vals: Vec<String> = (0..CLIENTS).map(|j| format!("last-{j}")).collect();
        ledger.rpush(&mut admin, &key, &vals);
        wait_blocked(&mut admin, 0, "one push of an element per client");
        for i in fifo.drain(..) {
            let what = format!("one push of {CLIENTS} to {key}: {}", names[i]);
            ledger.served(&mut clients[i], &key, left(i), &what);
        }
        assert!(ledger.is_empty());
        ledger.assert_conserved("one set, many clients");
        let mut exists = vec!["EXISTS".to_string()];
        exists.extend(keys.iter().cloned());
        assert_eq!(admin.cmd(&exists), Resp::Integer(0));
    }

    /// Three clients wait on the same 8 keys (each call in its own order). The first in
    /// line leaves while others wait behind it: its 0.1 s timeout expires, CLIENT UNBLOCK
    /// (with and without ERROR) ends its call, or CLIENT KILL closes it. The next push goes
    /// to the next client in line; a client unblocked and calling again goes to the back;
    /// a push with nobody left stays in its list. Every element is received once or
    /// found in its list at the end.
    pub fn front_waiter_leaves(threads: usize) {
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(3));
        let set = spread_keys("front:", 8);
        let mut admin = s.client();
        let names: Vec<String> = (0..3).map(|i| format!("front-w{i}")).collect();
        let mut w: Vec<Client> = names.iter().map(|n| named(&s, n)).collect();
        let ids: Vec<String> = w.iter_mut().map(client_id).collect();
        let pick = |rng: &mut Rng| set[rng.index(set.len())].clone();
        let mut ledger = Ledger::default();

        // 1. The first in line times out.
        for it in 0..2 {
            let what = format!("timeout {it}");
            w[0].send(&pop_cmd(true, &shuffled(&mut rng, &set), "0.1"));
            // Seen blocked before the others call (or, on a slow machine, already timed
            // out: the pushes below then go to the same clients).
            let early = blocked_or_replied(&mut admin, &mut w[0], &names[0], &what);
            w[1].send(&pop_cmd(true, &shuffled(&mut rng, &set), "0"));
            wait_name_blocked(&mut admin, &names[1], &what);
            w[2].send(&pop_cmd(false, &shuffled(&mut rng, &set), "0"));
            wait_name_blocked(&mut admin, &names[2], &what);
            let r0 = match early {
                Some(r) => r,
                None => read_reply(&mut w[0], &what),
            };
            assert_eq!(r0, Resp::NullArray, "{what}: w0 times out");
            wait_blocked_set(&mut admin, &names[1..], &format!("{what}: w0 gone"));
            let k = pick(&mut rng);
            ledger.rpush(&mut admin, &k, &[format!("t{it}-a")]);
            wait_blocked_set(
                &mut admin,
                &names[2..],
                &format!("{what}: RPUSH {k} serves w1"),
            );
            ledger.served(&mut w[1], &k, true, &format!("{what}: w1"));
            let k2 = pick(&mut rng);
            ledger.rpush(&mut admin, &k2, &[format!("t{it}-b"), format!("t{it}-c")]);
            wait_blocked(&mut admin, 0, &format!("{what}: RPUSH {k2} serves w2"));
            ledger.served(&mut w[2], &k2, false, &format!("{what}: w2"));
            ledger.settle(&mut admin, &what);
        }

        // 2. CLIENT UNBLOCK of the first in line: it answers a null, calls again and is
        // now last; one push of three serves w1, w2, w0 in that order.
        let what = "CLIENT UNBLOCK";
        let order = |rng: &mut Rng| shuffled(rng, &set);
        block(
            &mut w[0],
            &mut admin,
            &pop_cmd(true, &order(&mut rng), "0"),
            1,
            what,
        );
        block(
            &mut w[1],
            &mut admin,
            &pop_cmd(true, &order(&mut rng), "0"),
            2,
            what,
        );
        block(
            &mut w[2],
            &mut admin,
            &pop_cmd(false, &order(&mut rng), "0"),
            3,
            what,
        );
        assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", &ids[0]]), Resp::Integer(1));
        assert_eq!(read_reply(&mut w[0], what), Resp::NullArray, "{what}: w0");
        wait_blocked_set(&mut admin, &names[1..], what);
        block(
            &mut w[0],
            &mut admin,
            &pop_cmd(true, &order(&mut rng), "0"),
            3,
            what,
        );
        let k = pick(&mut rng);
        let vals: Vec<String> = ["u-a", "u-b", "u-c"]
            .iter()
            .map(|v| v.to_string())
            .collect();
        ledger.rpush(&mut admin, &k, &vals);
        wait_blocked(&mut admin, 0, what);
        ledger.served(&mut w[1], &k, true, "CLIENT UNBLOCK: w1 (first now)");
        ledger.served(&mut w[2], &k, false, "CLIENT UNBLOCK: w2 (second)");
        ledger.served(&mut w[0], &k, true, "CLIENT UNBLOCK: w0 (back of the line)");
        ledger.settle(&mut admin, what);

        // 3. CLIENT UNBLOCK ... ERROR of the first in line (w1 this time).
        let what = "CLIENT UNBLOCK ERROR";
        block(
            &mut w[1],
            &mut admin,
            &pop_cmd(true, &order(&mut rng), "0"),
            1,
            what,
        );
        block(
            &mut w[2],
            &mut admin,
            &pop_cmd(true, &order(&mut rng), "0"),
            2,
            what,
        );
        block(
            &mut w[0],
            &mut admin,
            &pop_cmd(false, &order(&mut rng), "0"),
            3,
            what,
        );
        assert_eq!(
            admin.cmd(&["CLIENT", "UNBLOCK", &ids[1], "ERROR"]),
            Resp::Integer(1)
        );
        assert_eq!(
            read_reply(&mut w[1], what),
            Resp::Error("UNBLOCKED client unblocked via CLIENT UNBLOCK".into())
        );
        wait_blocked_set(&mut admin, &[&names[2], &names[0]], what);
        let k = pick(&mut rng);
        ledger.rpush(&mut admin, &k, &["x-a".to_string()]);
        wait_blocked_set(
            &mut admin,
            &[&names[0]],
            &format!("{what}: RPUSH {k} serves w2"),
        );
        ledger.served(&mut w[2], &k, true, &format!("{what}: w2"));
        let k2 = pick(&mut rng);
        ledger.rpush(&mut admin, &k2, &["x-b".to_string(), "x-c".to_string()]);
        wait_blocked(&mut admin, 0, what);
        ledger.served(&mut w[0], &k2, false, &format!("{what}: w0"));
        ledger.settle(&mut admin, what);

        // 4. CLIENT KILL of the first in line: one push of two serves the two behind it.
        let what = "CLIENT KILL ID";
        block(
            &mut w[0],
            &mut admin,
            &pop_cmd(true, &order(&mut rng), "0"),
            1,
            what,
        );
        block(
            &mut w[1],
            &mut admin,
            &pop_cmd(false, &order(&mut rng), "0"),
            2,
            what,
        );
        block(
            &mut w[2],
            &mut admin,
            &pop_cmd(true, &order(&mut rng), "0"),
            3,
            what,
        );
        assert_eq!(
            admin.cmd(&["CLIENT", "KILL", "ID", &ids[0]]),
            Resp::Integer(1)
        );
        wait_blocked_set(&mut admin, &names[1..], what);
        assert_closed(&mut w[0], what);
        let k = pick(&mut rng);
        ledger.rpush(&mut admin, &k, &["k-a".to_string(), "k-b".to_string()]);
        wait_blocked(&mut admin, 0, what);
        ledger.served(&mut w[1], &k, false, &format!("{what}: w1"));
        ledger.served(&mut w[2], &k, true, &format!("{what}: w2"));
        ledger.settle(&mut admin, what);

        // 5. The only waiter is killed: the push stays, and the next call on the set
        // (another client) gets it at once.
        let what = "CLIENT KILL ID of the only waiter";
        block(
            &mut w[1],
            &mut admin,
            &pop_cmd(true, &order(&mut rng), "0"),
            1,
            what,
        );
        assert_eq!(
            admin.cmd(&["CLIENT", "KILL", "ID", &ids[1]]),
            Resp::Integer(1)
        );
        wait_blocked(&mut admin, 0, what);
        assert_closed(&mut w[1], what);
        let k = pick(&mut rng);
        ledger.rpush(&mut admin, &k, &["k-c".to_string()]);
        assert_eq!(admin.cmd(&["LLEN", &k]), Resp::Integer(1), "{what}");
        w[2].send(&pop_cmd(true, &order(&mut rng), "1"));
        ledger.served(&mut w[2], &k, true, &format!("{what}: the next call"));
        ledger.settle(&mut admin, what);

        ledger.assert_conserved("front waiter leaves");
        let mut llen = 0;
        for k in &set {
            llen += admin.cmd(&["LLEN", k]).as_int().unwrap();
        }
        assert_eq!(llen, 0, "every list was drained or deleted");
        assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
    }

    /// A BZPOPMIN on z blocks first, BLPOPs on {z, other} and {other2, z} after it. A list
    /// push to z serves the list poppers in their order and leaves the BZPOPMIN blocked
    /// (it waits for a sorted set); a ZADD elsewhere does not wake it; after DEL z, a ZADD
    /// to z serves it. The same the other way round (a BLPOP first, BZPOPMINs behind), and
    /// with both kinds of waiter on one unordered set.
    pub fn mixed_types_on_one_key(threads: usize) {
        let s = KiteServer::start(&[], threads);
        let keys = spread_keys("mixop:", 4);
        let (z, other, other2, unrelated) = (
            keys[0].as_str(),
            keys[1].as_str(),
            keys[2].as_str(),
            keys[3].as_str(),
        );
        let mut admin = s.client();
        let names = ["mixop-a", "mixop-b", "mixop-c", "mixop-d"];
        let mut c: Vec<Client> = names.iter().map(|n| named(&s, n)).collect();

        // 1. Sorted-set waiter first, list waiters behind it.
        let what = "BZPOPMIN z, then BLPOP z other, then BLPOP other2 z; RPUSH z";
        c[0].send(&["BZPOPMIN", z, "0"]);
        wait_blocked(&mut admin, 1, what);
        c[1].send(&["BLPOP", z, other, "0"]);
        wait_blocked(&mut admin, 2, what);
        c[2].send(&["BLPOP", other2, z, "0"]);
        wait_blocked(&mut admin, 3, what);
        assert_eq!(admin.cmd(&["RPUSH", z, "x", "y", "w"]), Resp::Integer(3));
        wait_blocked_set(&mut admin, &[names[0]], what);
        assert_eq!(read_reply(&mut c[1], what), pair(z, "x"), "{what}: B");
        assert_eq!(read_reply(&mut c[2], what), pair(z, "y"), "{what}: C");
        assert_eq!(admin.cmd(&["LRANGE", z, "0", "-1"]), bulks(&["w"]));
        // A sorted set appearing at a key A does not wait on leaves it blocked.
        assert_eq!(admin.cmd(&["ZADD", unrelated, "1", "q"]), Resp::Integer(1));
        wait_blocked_set(&mut admin, &[names[0]], "ZADD on another key");
        assert_eq!(admin.cmd(&["DEL", unrelated]), Resp::Integer(1));
        wait_blocked_set(&mut admin, &[names[0]], "DEL of the list at z");
        assert_eq!(admin.cmd(&["DEL", z]), Resp::Integer(1));
        assert_eq!(admin.cmd(&["ZADD", z, "1", "m"]), Resp::Integer(1));
        wait_blocked(&mut admin, 0, "ZADD z serves A");
        assert_eq!(
            read_reply(&mut c[0], "ZADD z serves A"),
            bulks(&[z, "m", "1"])
        );
        assert_eq!(admin.cmd(&["EXISTS", z]), Resp::Integer(0));

        // 2. List waiter first, sorted-set waiters behind it.
        let what = "BLPOP z, then BZPOPMIN z other, then BZPOPMIN other2 z; ZADD z";
        c[0].send(&["BLPOP", z, "0"]);
        wait_blocked(&mut admin, 1, what);
        c[1].send(&["BZPOPMIN", z, other, "0"]);
        wait_blocked(&mut admin, 2, what);
        c[2].send(&["BZPOPMIN", other2, z, "0"]);
        wait_blocked(&mut admin, 3, what);
        assert_eq!(
            admin.cmd(&["ZADD", z, "1", "m1", "2", "m2", "3", "m3"]),
            Resp::Integer(3)
        );
        wait_blocked_set(&mut admin, &[names[0]], what);
        assert_eq!(
            read_reply(&mut c[1], what),
            bulks(&[z, "m1", "1"]),
            "{what}: B"
        );
        assert_eq!(
            read_reply(&mut c[2], what),
            bulks(&[z, "m2", "2"]),
            "{what}: C"
        );
        assert_eq!(
            admin.cmd(&["ZRANGE", z, "0", "-1", "WITHSCORES"]),
            bulks(&["m3", "3"])
        );
        assert_eq!(admin.cmd(&["DEL", z]), Resp::Integer(1));
        assert_eq!(admin.cmd(&["RPUSH", z, "v"]), Resp::Integer(1));
        wait_blocked(&mut admin, 0, "RPUSH z serves A");
        assert_eq!(read_reply(&mut c[0], "RPUSH z serves A"), pair(z, "v"));
        assert_eq!(admin.cmd(&["EXISTS", z]), Resp::Integer(0));

        // 3. Both kinds on one unordered set {z, other}, alternating.
        let what = "BZPOPMIN and BLPOP alternating on {z, other}";
        c[0].send(&["BZPOPMIN", other, z, "0"]);
        wait_blocked(&mut admin, 1, what);
        c[1].send(&["BLPOP", z, other, "0"]);
        wait_blocked(&mut admin, 2, what);
        c[2].send(&["BZPOPMIN", z, other, "0"]);
        wait_blocked(&mut admin, 3, what);
        c[3].send(&["BLPOP", other, z, "0"]);
        wait_blocked(&mut admin, 4, what);
        assert_eq!(admin.cmd(&["RPUSH", z, "x", "y"]), Resp::Integer(2));
        wait_blocked_set(
            &mut admin,
            &[names[0], names[2]],
            &format!("{what}: RPUSH z"),
        );
        assert_eq!(read_reply(&mut c[1], what), pair(z, "x"), "{what}: B");
        assert_eq!(read_reply(&mut c[3], what), pair(z, "y"), "{what}: D");
        assert_eq!(
            admin.cmd(&["ZADD", other, "1", "p", "2", "q"]),
            Resp::Integer(2)
        );
        wait_blocked(&mut admin, 0, &format!("{what}: ZADD other"));
        assert_eq!(
            read_reply(&mut c[0], what),
            bulks(&[other, "p", "1"]),
            "{what}: A"
        );
        assert_eq!(
            read_reply(&mut c[2], what),
            bulks(&[other, "q", "2"]),
            "{what}: C"
        );
        assert_eq!(admin.cmd(&["EXISTS", z, other]), Resp::Integer(0));
        assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
    }

    /// Four XREAD BLOCK 0 readers on sets sharing stream s2, with different last IDs: `$`
    /// on {s1, s2}, `$` on {s2}, 5-0 on s2 with `$` on s3, and 2-1 / 0-0 on {s2, s1}
    /// (the first set in another order). An entry 3-1 on s2 reaches all three readers
    /// waiting below it; the one waiting past 5-0 gets only 6-1, not 4-1. Then the same
    /// sets again: an entry on s1 reaches both readers naming s1, one on s3 the reader
    /// naming s3, one on s2 the reader left.
    pub fn xread_readers_share_a_stream(threads: usize) {
        let s = KiteServer::start(&[], threads);
        let keys = spread_keys("xgrp:", 3);
        let (s1, s2, s3) = (keys[0].as_str(), keys[1].as_str(), keys[2].as_str());
        let mut admin = s.client();
        assert_eq!(admin.cmd(&["XADD", s2, "1-1", "f", "a"]), bulk("1-1"));
        assert_eq!(admin.cmd(&["XADD", s2, "2-1", "f", "b"]), bulk("2-1"));
        let names = ["xgrp-r1", "xgrp-r2", "xgrp-r3", "xgrp-r4"];
        let mut r: Vec<Client> = names.iter().map(|n| named(&s, n)).collect();

        let calls: [Vec<&str>; 4] = [
            vec!["XREAD", "BLOCK", "0", "STREAMS", s1, s2, "$", "$"],
            vec!["XREAD", "BLOCK", "0", "STREAMS", s2, "$"],
            vec![
                "XREAD", "COUNT", "10", "BLOCK", "0", "STREAMS", s2, s3, "5-0", "$",
            ],
            vec!["XREAD", "BLOCK", "0", "STREAMS", s2, s1, "2-1", "0-0"],
        ];
        for (i, call) in calls.iter().enumerate() {
            r[i].send(call);
            wait_blocked(
                &mut admin,
                i as i64 + 1,
                &format!("round 1: {} blocking", names[i]),
            );
        }
        let what = "round 1: XADD s2 3-1";
        assert_eq!(admin.cmd(&["XADD", s2, "3-1", "f", "c"]), bulk("3-1"));
        wait_blocked_set(&mut admin, &[names[2]], what);
        for i in [0, 1, 3] {
            assert_eq!(
                read_reply(&mut r[i], what),
                xreply(s2, &[("3-1", "f", "c")]),
                "{what}: {}",
                names[i]
            );
        }
        // 4-1 is not past 5-0: the reader waiting there gets 6-1 alone.
        assert_eq!(admin.cmd(&["XADD", s2, "4-1", "f", "d"]), bulk("4-1"));
        assert_eq!(admin.cmd(&["XADD", s2, "6-1", "f", "e"]), bulk("6-1"));
        let what = "round 1: XADD s2 4-1, XADD s2 6-1";
        wait_blocked(&mut admin, 0, what);
        assert_eq!(
            read_reply(&mut r[2], what),
            xreply(s2, &[("6-1", "f", "e")]),
            "{what}: {}",
            names[2]
        );

        // Round 2: the same unordered sets, other orders and IDs.
        let calls: [Vec<&str>; 4] = [
            vec!["XREAD", "BLOCK", "0", "STREAMS", s1, s2, "$", "$"],
            vec!["XREAD", "BLOCK", "0", "STREAMS", s2, "$"],
            vec!["XREAD", "BLOCK", "0", "STREAMS", s3, s2, "$", "$"],
            vec!["XREAD", "BLOCK", "0", "STREAMS", s2, s1, "6-1", "0-0"],
        ];
        for (i, call) in calls.iter().enumerate() {
            r[i].send(call);
            wait_blocked(
                &mut admin,
                i as i64 + 1,
                &format!("round 2: {} blocking", names[i]),
            );
        }
        let what = "round 2: XADD s1 1-1";
        assert_eq!(admin.cmd(&["XADD", s1, "1-1", "g", "h"]), bulk("1-1"));
        wait_blocked_set(&mut admin, &[names[1], names[2]], what);
        for i in [0, 3] {
            assert_eq!(
                read_reply(&mut r[i], what),
                xreply(s1, &[("1-1", "g", "h")]),
                "{what}: {}",
                names[i]
            );
        }
        let what = "round 2: XADD s3 1-1";
        assert_eq!(admin.cmd(&["XADD", s3, "1-1", "i", "j"]), bulk("1-1"));
        wait_blocked_set(&mut admin, &[names[1]], what);
        assert_eq!(
            read_reply(&mut r[2], what),
            xreply(s3, &[("1-1", "i", "j")]),
            "{what}: {}",
            names[2]
        );
        let what = "round 2: XADD s2 7-1";
        assert_eq!(admin.cmd(&["XADD", s2, "7-1", "k", "l"]), bulk("7-1"));
        wait_blocked(&mut admin, 0, what);
        assert_eq!(
            read_reply(&mut r[1], what),
            xreply(s2, &[("7-1", "k", "l")]),
            "{what}: {}",
            names[1]
        );
        assert_eq!(admin.cmd(&["XLEN", s2]), Resp::Integer(6));
    }

    /// 60 clients, each on the hot key plus 5 of 40 other keys (60 distinct sets), block
    /// in a known order. A few pushes to other keys first serve the oldest client whose
    /// set names that key (or stay when none does); then pushes to the hot key, one at a
    /// time, reach the rest in blocking order. Three rounds, each in a new order, on the
    /// same sets.
    pub fn hot_key_many_sets(threads: usize) {
        const CLIENTS: usize = 60;
        const POOL: usize = 40;
        const OTHERS: usize = 5;
        const ROUNDS: usize = 3;
        const PROBES: usize = 3;
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(6));
        let hot = "hot:key".to_string();
        let pool = spread_keys("hot:other:", POOL);
        let mut seen: HashSet<Vec<usize>> = HashSet::new();
        let mut sets: Vec<Vec<String>> = Vec::new();
        for _ in 0..10_000 {
            if sets.len() == CLIENTS {
                break;
            }
            let mut idx = distinct(&mut rng, POOL, OTHERS);
            idx.sort();
            if seen.insert(idx.clone()) {
                let mut set: Vec<String> = idx.iter().map(|&i| pool[i].clone()).collect();
                set.push(hot.clone());
                sets.push(set);
            }
        }
        assert_eq!(sets.len(), CLIENTS, "distinct sets");
        let mut admin = s.client();
        let names: Vec<String> = (0..CLIENTS).map(|i| format!("hot-{i:02}")).collect();
        let mut clients: Vec<Client> = names.iter().map(|n| named(&s, n)).collect();
        let mut previous: Vec<usize> = Vec::new();
        for round in 0..ROUNDS {
            let mut order: Vec<usize> = (0..CLIENTS).collect();
            rng.shuffle(&mut order);
            if order == previous {
                order.reverse();
            }
            let left = |i: usize| (i + round).is_multiple_of(2);
            for (pos, &i) in order.iter().enumerate() {
                let keys = shuffled(&mut rng, &sets[i]);
                block(
                    &mut clients[i],
                    &mut admin,
                    &pop_cmd(left(i), &keys, "0"),
                    pos as i64 + 1,
                    &format!("round {round}: {} blocking in position {pos}", names[i]),
                );
            }
            let mut waiting = order.clone();
            // Pushes to other keys: the oldest waiter among the sets naming that key.
            for probe in 0..PROBES {
                let key = pool[rng.index(POOL)].clone();
                let v = format!("r{round}-p{probe}");
                assert_eq!(admin.cmd(&["RPUSH", &key, &v]), Resp::Integer(1));
                match waiting.iter().position(|&j| sets[j].contains(&key)) {
                    Some(p) => {
                        let i = waiting.remove(p);
                        let what = format!(
                            "round {round}: RPUSH {key} must serve {}, the oldest waiter \
                             naming it",
                            names[i]
                        );
                        let still: Vec<&str> = waiting.iter().map(|&j| names[j].as_str()).collect();
                        wait_blocked_set(&mut admin, &still, &what);
                        assert_eq!(read_reply(&mut clients[i], &what), pair(&key, &v), "{what}");
                    }
                    None => {
                        let what = format!("round {round}: RPUSH {key}, which nobody waits on");
                        let still: Vec<&str> = waiting.iter().map(|&j| names[j].as_str()).collect();
                        wait_blocked_set(&mut admin, &still, &what);
                        assert_eq!(
                            admin.cmd(&["LRANGE", &key, "0", "-1"]),
                            bulks(&[&v]),
                            "{what}"
                        );
                        assert_eq!(admin.cmd(&["DEL", &key]), Resp::Integer(1));
                    }
                }
            }
            // Pushes to the hot key: everyone left, in blocking order.
            for n in 0..waiting.len() {
                let i = waiting[n];
                let v = format!("r{round}-h{n}");
                assert_eq!(admin.cmd(&["RPUSH", &hot, &v]), Resp::Integer(1));
                let what = format!(
                    "round {round}: hot push {n} must serve {}, the oldest waiter",
                    names[i]
                );
                let still: Vec<&str> = waiting[n + 1..]
                    .iter()
                    .map(|&j| names[j].as_str())
                    .collect();
                wait_blocked_set(&mut admin, &still, &what);
                assert_eq!(read_reply(&mut clients[i], &what), pair(&hot, &v), "{what}");
            }
            assert_eq!(admin.cmd(&["EXISTS", &hot]), Resp::Integer(0));
            previous = order;
        }
        let mut exists = vec!["EXISTS".to_string()];
        exists.extend(pool.iter().cloned());
        assert_eq!(admin.cmd(&exists), Resp::Integer(0));
        assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
    }

    /// Four clients on the same 8 keys (two per thread at `--threads 4`). Each push goes to
    /// a key on another thread than the one before and serves the first in line, who
    /// then calls again on the same set (in another order) and is now last. Every other
    /// round the next push is sent right after that call without waiting for it: the next
    /// client in line must get it whether or not the call is in yet. Finally one push
    /// of four elements serves all four in line order.
    pub fn reblock_goes_behind(threads: usize) {
        const N: usize = 4;
        const ROUNDS: usize = 16;
        let s = KiteServer::start(&[], threads);
        let mut rng = Rng::new(seed(7));
        let set = spread_keys("behind:", 8);
        let mut admin = s.client();
        let names: Vec<String> = (0..N).map(|i| format!("behind-c{i}")).collect();
        let mut c: Vec<Client> = names.iter().map(|n| named(&s, n)).collect();
        let left = |i: usize| i.is_multiple_of(2);
        let names_of =
            |q: &VecDeque<usize>| -> Vec<String> { q.iter().map(|&i| names[i].clone()).collect() };
        let mut fifo: VecDeque<usize> = VecDeque::new();
        for (i, client) in c.iter_mut().enumerate() {
            fifo.push_back(i);
            let cmd = pop_cmd(left(i), &shuffled(&mut rng, &set), "0");
            block(client, &mut admin, &cmd, fifo.len() as i64, "first calls");
        }
        for round in 0..ROUNDS {
            let key = set[round % set.len()].clone();
            let front = fifo.pop_front().unwrap();
            let v = format!("r{round}");
            assert_eq!(admin.cmd(&["RPUSH", &key, &v]), Resp::Integer(1));
            let what = format!(
                "round {round}: RPUSH {key} must serve {}, first in line",
                names[front]
            );
            wait_blocked_set(&mut admin, &names_of(&fifo), &what);
            assert_eq!(read_reply(&mut c[front], &what), pair(&key, &v), "{what}");
            // The same set again, in another order: behind everyone still waiting.
            c[front].send(&pop_cmd(left(front), &shuffled(&mut rng, &set), "0"));
            if round % 2 == 1 {
                // Right away, a push to a key on another thread: the next in line gets
                // it, whether `front`'s new call came in before it or after.
                let key2 = set[(round + 1) % set.len()].clone();
                if threads == 4 {
                    assert_ne!(shard_of(&key, 4), shard_of(&key2, 4), "{key} and {key2}");
                }
                let next = fifo.pop_front().unwrap();
                let v2 = format!("r{round}-racing");
                assert_eq!(admin.cmd(&["RPUSH", &key2, &v2]), Resp::Integer(1));
                let what = format!(
                    "round {round}: RPUSH {key2} racing with {}'s new call must serve {}",
                    names[front], names[next]
                );
                let mut want = names_of(&fifo);
                want.push(names[front].clone());
                wait_blocked_set(&mut admin, &want, &what);
                assert_eq!(read_reply(&mut c[next], &what), pair(&key2, &v2), "{what}");
                fifo.push_back(front);
                c[next].send(&pop_cmd(left(next), &shuffled(&mut rng, &set), "0"));
                fifo.push_back(next);
            } else {
                fifo.push_back(front);
            }
            wait_blocked(
                &mut admin,
                N as i64,
                &format!("round {round}: everyone waits again"),
            );
        }
        // One push of four: everyone, in line order, each from its own end.
        let key = set[rng.index(set.len())].clone();
        let vals: Vec<String> = (0..N).map(|j| format!("last-{j}")).collect();
        let mut ledger = Ledger::default();
        ledger.rpush(&mut admin, &key, &vals);
        wait_blocked(&mut admin, 0, "one push of four");
        for i in fifo.drain(..) {
            let what = format!("one push of four to {key}: {}", names[i]);
            ledger.served(&mut c[i], &key, left(i), &what);
        }
        assert!(ledger.is_empty());
        assert_eq!(admin.cmd(&["EXISTS", &key]), Resp::Integer(0));
    }
}
