//! Invariant tests under several client threads against a multi-threaded Kite.
//! Every loop is bounded by a count; nothing here measures time.

mod common;

use common::*;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;

const ACCOUNTS: usize = 20;
const INITIAL: i64 = 1000;

fn account(i: usize) -> String {
    // No hashtags: the accounts spread over all shards.
    format!("acct:{i}")
}

fn int_of(r: &Resp) -> i64 {
    r.parse_int()
        .unwrap_or_else(|| panic!("expected an integer (or integer string), got {r}"))
}

fn sum_balances(r: &Resp) -> i64 {
    r.as_array()
        .unwrap_or_else(|| panic!("expected MGET array, got {r}"))
        .iter()
        .map(int_of)
        .sum()
}

fn mget_accounts() -> Vec<String> {
    let mut cmd = vec!["MGET".to_string()];
    cmd.extend((0..ACCOUNTS).map(account));
    cmd
}

fn bank_transfers(threads: usize) {
    const WRITERS: usize = 8;
    const TRANSFERS: usize = 300;
    const READS: usize = 300;
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    let mut mset = vec!["MSET".to_string()];
    for i in 0..ACCOUNTS {
        mset.push(account(i));
        mset.push(INITIAL.to_string());
    }
    assert_eq!(c.cmd(&mset), Resp::ok());
    let total = INITIAL * ACCOUNTS as i64;
    let deltas = Mutex::new(vec![0i64; ACCOUNTS]);
    thread::scope(|s| {
        for w in 0..WRITERS {
            let kite = &kite;
            let deltas = &deltas;
            s.spawn(move || {
                let mut c = kite.client();
                let mut rng = Rng::new(1000 + w as u64);
                let mut local = vec![0i64; ACCOUNTS];
                for t in 0..TRANSFERS {
                    let from = rng.index(ACCOUNTS);
                    let mut to = rng.index(ACCOUNTS - 1);
                    if to >= from {
                        to += 1;
                    }
                    let amount = rng.range(1, 50);
                    let cmds = vec![
                        vec!["MULTI".to_string()],
                        vec!["DECRBY".to_string(), account(from), amount.to_string()],
                        vec!["INCRBY".to_string(), account(to), amount.to_string()],
                        vec!["EXEC".to_string()],
                    ];
                    // Half the transfers pipelined in one write, half one by one.
                    let replies: Vec<Resp> = if t % 2 == 0 {
                        c.pipeline(&cmds)
                    } else {
                        cmds.iter().map(|cmd| c.cmd(cmd)).collect()
                    };
                    assert_eq!(replies[0], Resp::ok(), "MULTI");
                    assert_eq!(replies[1], Resp::simple("QUEUED"));
                    assert_eq!(replies[2], Resp::simple("QUEUED"));
                    let exec = replies[3]
                        .as_array()
                        .unwrap_or_else(|| panic!("EXEC returned {}", replies[3]));
                    assert_eq!(exec.len(), 2, "EXEC returned {}", replies[3]);
                    assert!(
                        exec.iter().all(|r| r.as_int().is_some()),
                        "EXEC returned {}",
                        replies[3]
                    );
                    local[from] -= amount;
                    local[to] += amount;
                }
                let mut d = deltas.lock().unwrap();
                for (acc, v) in d.iter_mut().zip(local) {
                    *acc += v;
                }
            });
        }
        // Reader inside MULTI/EXEC.
        let kite_ref = &kite;
        s.spawn(move || {
            let mut c = kite_ref.client();
            for i in 0..READS {
                let replies = c.pipeline(&[
                    vec!["MULTI".to_string()],
                    mget_accounts(),
                    vec!["EXEC".to_string()],
                ]);
                let exec = replies[2]
                    .as_array()
                    .unwrap_or_else(|| panic!("EXEC returned {}", replies[2]));
                let sum = sum_balances(&exec[0]);
                assert_eq!(
                    sum, total,
                    "read #{i} in MULTI/EXEC saw a partial transfer: {}",
                    exec[0]
                );
            }
        });
        // Plain MGET is atomic too.
        s.spawn(move || {
            let mut c = kite_ref.client();
            for i in 0..READS {
                let r = c.cmd(&mget_accounts());
                assert_eq!(
                    sum_balances(&r),
                    total,
                    "plain MGET #{i} saw a partial transfer: {r}"
                );
            }
        });
    });
    let r = c.cmd(&mget_accounts());
    assert_eq!(sum_balances(&r), total, "total not conserved: {r}");
    let deltas = deltas.into_inner().unwrap();
    for (i, v) in r.as_array().unwrap().iter().enumerate() {
        assert_eq!(int_of(v), INITIAL + deltas[i], "balance of {}", account(i));
    }
}

#[test]
fn bank_transfers_conserve_total_threads4() {
    bank_transfers(4);
}

#[test]
fn bank_transfers_conserve_total_threads2() {
    bank_transfers(2);
}

fn watch_increments(threads: usize) {
    const WORKERS: usize = 8;
    const SUCCESSES: usize = 200;
    const MAX_ATTEMPTS: usize = 100_000;
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    assert_eq!(c.cmd(&["SET", "counter", "0"]), Resp::ok());
    let aborted = AtomicUsize::new(0);
    thread::scope(|s| {
        for w in 0..WORKERS {
            let kite = &kite;
            let aborted = &aborted;
            s.spawn(move || {
                let mut c = kite.client();
                let mut done = 0;
                let mut attempts = 0;
                while done < SUCCESSES {
                    attempts += 1;
                    assert!(
                        attempts <= MAX_ATTEMPTS,
                        "worker {w}: only {done} successful increments in {MAX_ATTEMPTS} attempts"
                    );
                    assert_eq!(c.cmd(&["WATCH", "counter"]), Resp::ok());
                    let v = int_of(&c.cmd(&["GET", "counter"]));
                    assert_eq!(c.cmd(&["MULTI"]), Resp::ok());
                    let next = (v + 1).to_string();
                    assert_eq!(
                        c.cmd(&["SET", "counter", next.as_str()]),
                        Resp::simple("QUEUED")
                    );
                    let r = c.cmd(&["EXEC"]);
                    if r.is_null() {
                        aborted.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    assert_eq!(r, Resp::Array(vec![Resp::ok()]), "EXEC");
                    done += 1;
                }
            });
        }
    });
    assert_eq!(
        c.cmd(&["GET", "counter"]),
        Resp::bulk((WORKERS * SUCCESSES).to_string()),
        "lost or duplicated increments ({} EXECs aborted)",
        aborted.load(Ordering::Relaxed)
    );
}

#[test]
fn watch_guarded_increments_threads4() {
    watch_increments(4);
}

#[test]
fn watch_guarded_increments_threads2() {
    watch_increments(2);
}

fn mset_mget_atomic(threads: usize) {
    const KEYS: usize = 16;
    const WRITERS: usize = 3;
    const READERS: usize = 3;
    const ROUNDS: usize = 300;
    let kite = KiteServer::start(&[], threads);
    let keys: Vec<String> = (0..KEYS).map(|i| format!("m:{i}")).collect();
    let mset = |v: &str| {
        let mut cmd = vec!["MSET".to_string()];
        for k in &keys {
            cmd.push(k.clone());
            cmd.push(v.to_string());
        }
        cmd
    };
    let mut mget = vec!["MGET".to_string()];
    mget.extend(keys.iter().cloned());
    let mut del = vec!["DEL".to_string()];
    del.extend(keys.iter().cloned());
    let mut c = kite.client();
    assert_eq!(c.cmd(&mset("init")), Resp::ok());
    let check_uniform = |r: &Resp, what: &str| {
        let vals = r
            .as_array()
            .unwrap_or_else(|| panic!("{what}: expected an array, got {r}"));
        assert_eq!(vals.len(), KEYS, "{what}: {r}");
        assert!(
            vals.iter().all(|v| v == &vals[0]),
            "{what} saw a half-applied multi-key write: {r}"
        );
    };
    thread::scope(|s| {
        for w in 0..WRITERS {
            let (kite, mset, del) = (&kite, &mset, &del);
            s.spawn(move || {
                let mut c = kite.client();
                for i in 0..ROUNDS {
                    if i % 25 == 24 {
                        // Multi-key DEL is atomic as well: all gone or none.
                        assert!(c.cmd(del).as_int().is_some());
                    } else {
                        assert_eq!(c.cmd(&mset(&format!("w{w}-{i}"))), Resp::ok());
                    }
                }
            });
        }
        for r in 0..READERS {
            let (kite, mget, keys, check_uniform) = (&kite, &mget, &keys, &check_uniform);
            s.spawn(move || {
                let mut c = kite.client();
                for i in 0..ROUNDS {
                    if r == 0 && i % 2 == 0 {
                        // Individual GETs inside one transaction.
                        let mut cmds = vec![vec!["MULTI".to_string()]];
                        cmds.extend(keys.iter().map(|k| vec!["GET".to_string(), k.clone()]));
                        cmds.push(vec!["EXEC".to_string()]);
                        let replies = c.pipeline(&cmds);
                        check_uniform(replies.last().unwrap(), "MULTI/GET.../EXEC");
                    } else {
                        check_uniform(&c.cmd(mget), "MGET");
                    }
                }
            });
        }
    });
    check_uniform(&c.cmd(&mget), "final MGET");
}

#[test]
fn cross_shard_mset_mget_atomic_threads4() {
    mset_mget_atomic(4);
}

#[test]
fn cross_shard_mset_mget_atomic_threads2() {
    mset_mget_atomic(2);
}

fn blocking_pops_exactly_once(threads: usize) {
    const PRODUCERS: usize = 4;
    const CONSUMERS: usize = 4;
    const PER_PRODUCER: usize = 250;
    const TOTAL: usize = PRODUCERS * PER_PRODUCER;
    const QUEUES: [&str; 4] = ["q:alpha", "q:beta", "q:gamma", "q:delta"];
    let kite = KiteServer::start(&[], threads);
    let popped = AtomicUsize::new(0);
    let seen = Mutex::new(Vec::<String>::new());
    thread::scope(|s| {
        for cons in 0..CONSUMERS {
            let (kite, popped, seen) = (&kite, &popped, &seen);
            s.spawn(move || {
                let mut c = kite.client();
                let mut mine = Vec::new();
                let mut rng = Rng::new(77 + cons as u64);
                // Bounded: at most TOTAL pops plus a few hundred empty timeouts.
                for _ in 0..(TOTAL + 300) {
                    if popped.load(Ordering::SeqCst) >= TOTAL {
                        break;
                    }
                    let mut cmd = vec!["BRPOP".to_string()];
                    let mut qs = QUEUES.to_vec();
                    rng.shuffle(&mut qs);
                    cmd.extend(qs.iter().map(|q| q.to_string()));
                    cmd.push("1".to_string());
                    let r = c.cmd(&cmd);
                    if r.is_null() {
                        continue;
                    }
                    let pair = r.as_array().unwrap_or_else(|| panic!("BRPOP returned {r}"));
                    assert_eq!(pair.len(), 2, "BRPOP returned {r}");
                    let q = pair[0].as_string().unwrap();
                    let job = pair[1].as_string().unwrap();
                    assert!(QUEUES.contains(&q.as_str()), "BRPOP named queue {q}");
                    assert!(
                        job.starts_with(&format!("{q}/")),
                        "job {job} popped from {q}"
                    );
                    mine.push(job);
                    popped.fetch_add(1, Ordering::SeqCst);
                }
                seen.lock().unwrap().extend(mine);
            });
        }
        for p in 0..PRODUCERS {
            let kite = &kite;
            s.spawn(move || {
                let mut c = kite.client();
                let mut rng = Rng::new(500 + p as u64);
                let mut j = 0;
                while j < PER_PRODUCER {
                    let q = *rng.pick(&QUEUES);
                    // Push 1..=3 jobs at once (LPUSH with several values).
                    let n = (rng.range(1, 3) as usize).min(PER_PRODUCER - j);
                    let mut cmd = vec!["LPUSH".to_string(), q.to_string()];
                    for k in 0..n {
                        cmd.push(format!("{q}/p{p}-{}", j + k));
                    }
                    assert!(c.cmd(&cmd).as_int().is_some());
                    j += n;
                }
            });
        }
    });
    let seen = seen.into_inner().unwrap();
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "some job was popped twice");
    assert_eq!(
        seen.len(),
        TOTAL,
        "jobs lost: popped {} of {TOTAL}",
        seen.len()
    );
    let mut c = kite.client();
    for q in QUEUES {
        assert_eq!(c.cmd(&["LLEN", q]), Resp::Integer(0), "{q} not drained");
    }
}

#[test]
fn blocking_pops_take_each_job_once_threads4() {
    blocking_pops_exactly_once(4);
}

#[test]
fn blocking_pops_take_each_job_once_threads2() {
    blocking_pops_exactly_once(2);
}

fn lmove_conserves_elements(threads: usize) {
    const LISTS: [&str; 4] = ["l:one", "l:two", "l:three", "l:four"];
    const PER_LIST: usize = 25;
    const MOVERS: usize = 4;
    const MOVES: usize = 300;
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    for l in LISTS {
        let mut cmd = vec!["RPUSH".to_string(), l.to_string()];
        cmd.extend((0..PER_LIST).map(|i| format!("{l}-{i}")));
        assert_eq!(c.cmd(&cmd), Resp::Integer(PER_LIST as i64));
    }
    let total = (LISTS.len() * PER_LIST) as i64;
    thread::scope(|s| {
        for m in 0..MOVERS {
            let kite = &kite;
            s.spawn(move || {
                let mut c = kite.client();
                let mut rng = Rng::new(900 + m as u64);
                for _ in 0..MOVES {
                    let src = *rng.pick(&LISTS);
                    let dst = *rng.pick(&LISTS);
                    let r = if rng.chance(50) {
                        c.cmd(&[
                            "LMOVE",
                            src,
                            dst,
                            *rng.pick(&["LEFT", "RIGHT"]),
                            *rng.pick(&["LEFT", "RIGHT"]),
                        ])
                    } else {
                        c.cmd(&["RPOPLPUSH", src, dst])
                    };
                    assert!(!r.is_error(), "move failed: {r}");
                }
            });
        }
        let kite = &kite;
        s.spawn(move || {
            let mut c = kite.client();
            for i in 0..300 {
                let mut cmds = vec![vec!["MULTI".to_string()]];
                cmds.extend(
                    LISTS
                        .iter()
                        .map(|l| vec!["LLEN".to_string(), l.to_string()]),
                );
                cmds.push(vec!["EXEC".to_string()]);
                let replies = c.pipeline(&cmds);
                let exec = replies.last().unwrap();
                let sum: i64 = exec
                    .as_array()
                    .unwrap_or_else(|| panic!("EXEC returned {exec}"))
                    .iter()
                    .map(int_of)
                    .sum();
                assert_eq!(sum, total, "read #{i}: elements not conserved: {exec}");
            }
        });
    });
    let mut all = HashSet::new();
    let mut count = 0;
    for l in LISTS {
        let r = c.cmd(&["LRANGE", l, "0", "-1"]);
        count += r.as_array().map_or(0, |a| a.len());
        all.extend(bytes_set(&r));
    }
    assert_eq!(count as i64, total, "element count changed");
    assert_eq!(all.len() as i64, total, "elements lost or duplicated");
}

#[test]
fn cross_shard_list_moves_conserve_elements_threads4() {
    lmove_conserves_elements(4);
}

#[test]
fn cross_shard_list_moves_conserve_elements_threads2() {
    lmove_conserves_elements(2);
}

/// The first key `<tag><i>` on `shard` of a two-thread Kite.
fn key_on_shard(shard: usize, tag: &str) -> String {
    key_on_shard_of(2, shard, tag)
}

fn info_hops(c: &mut Client) -> i64 {
    info_field(c, "transactions", "hops")
}

/// A multi-shard EXEC asks each other shard once: its commands travel with the lock
/// request. Sidekiq's push (MULTI, SADD queues, LPUSH queue:x, EXEC) is one of these on
/// every job, and all of them share the `queues` key, so every round trip made while its
/// lock is held is a wait for every other push.
#[test]
fn a_multi_shard_exec_asks_the_other_shard_once() {
    let server = KiteServer::start(&[], 2);
    let (a, b) = (key_on_shard(0, "a"), key_on_shard(1, "b"));
    let (c, d) = (key_on_shard(0, "c"), key_on_shard(1, "d"));
    let mut admin = server.client();
    // Two connections, dealt to the two threads in turn: each shard is the other one
    // for one of them.
    let mut clients = [server.client(), server.client()];
    const ROUNDS: i64 = 20;
    let before = info_hops(&mut admin);
    for round in 0..ROUNDS {
        let client = &mut clients[round as usize % 2];
        let replies = client.pipeline(&[
            vec!["MULTI"],
            vec!["SADD", &a, "x"],
            vec!["LPUSH", &b, "job"],
            vec!["INCR", &c],
            vec!["RPUSH", &d, "job"],
            vec!["EXEC"],
        ]);
        let exec = replies
            .last()
            .unwrap()
            .as_array()
            .expect("EXEC array")
            .to_vec();
        assert_eq!(exec.len(), 4, "EXEC replies: {exec:?}");
        assert_eq!(exec[2], Resp::Integer(round + 1));
    }
    let hops = info_hops(&mut admin) - before;
    assert!(
        hops <= ROUNDS + 4,
        "{ROUNDS} two-shard transactions made {hops} hops to the other thread"
    );
    assert_eq!(admin.cmd(&["LLEN", &b]), Resp::Integer(ROUNDS));
    assert_eq!(admin.cmd(&["LLEN", &d]), Resp::Integer(ROUNDS));
}

fn info_field(c: &mut Client, section: &str, name: &str) -> i64 {
    let info = c.cmd(&["INFO", section]).as_string().expect("INFO text");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in INFO {section}"))
}

/// Keeps the thread of `key`'s shard busy for `ms` milliseconds with a script (scripts
/// run on the thread of their key), from a thread of the test's.
fn keep_busy(server: &KiteServer, key: &str, ms: u64) -> thread::JoinHandle<()> {
    let mut runner = server.client();
    let script = format!(
        "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
         repeat local n = redis.call('TIME') until n[1] * 1000000 + n[2] - s > {} \
         return 1",
        ms * 1000
    );
    let key = key.to_string();
    thread::spawn(move || {
        assert_eq!(runner.cmd(&["EVAL", &script, "1", &key]), Resp::Integer(1));
    })
}

/// Pushes queued behind one another on the shard of a key they all name go on together
/// (a convoy): one round trip to the other shard for all of them, not one each.
#[test]
fn pushes_queued_behind_a_hot_key_travel_together() {
    let server = KiteServer::start(&[], 2);
    let (set, list, busy) = (
        key_on_shard(0, "queues"),
        key_on_shard(1, "queue:"),
        key_on_shard(1, "busy"),
    );
    let mut admin = server.client();
    let before = info_field(&mut admin, "transactions", "convoy_joins");
    // A script on the list's shard keeps its thread busy for 0.3 s (scripts run on
    // the thread of their key): the first push to take the set waits there for it,
    // holding the set, and the pushes behind it queue on the set.
    let script = keep_busy(&server, &busy, 300);
    thread::sleep(std::time::Duration::from_millis(100));
    const PUSHERS: usize = 12;
    let pushers: Vec<_> = (0..PUSHERS)
        .map(|i| {
            let mut c = server.client();
            let (set, list) = (set.clone(), list.clone());
            thread::spawn(move || {
                let job = format!("job{i}");
                let replies = c.pipeline(&[
                    vec!["MULTI"],
                    vec!["SADD", &set, "default"],
                    vec!["LPUSH", &list, &job],
                    vec!["EXEC"],
                ]);
                let exec = replies[3].as_array().expect("EXEC array").to_vec();
                assert_eq!(exec.len(), 2, "EXEC replies: {exec:?}");
            })
        })
        .collect();
    for p in pushers {
        p.join().unwrap();
    }
    script.join().unwrap();
    assert_eq!(admin.cmd(&["LLEN", &list]), Resp::Integer(PUSHERS as i64));
    assert_eq!(admin.cmd(&["SCARD", &set]), Resp::Integer(1));
    let joins = info_field(&mut admin, "transactions", "convoy_joins") - before;
    assert!(
        joins >= 1,
        "{PUSHERS} pushes queued behind a held key, and none went on with another"
    );
}

/// A new connection on the thread of shard 0: connections are dealt to the threads in
/// turn, and a GET of a key on shard 1 is a hop only from thread 0.
fn client_on_thread_zero(server: &KiteServer, admin: &mut Client) -> Client {
    let probe = key_on_shard(1, "probe");
    for _ in 0..8 {
        let mut c = server.client();
        let before = info_field(admin, "transactions", "one_hop_commands");
        c.cmd(&["GET", &probe]);
        if info_field(admin, "transactions", "one_hop_commands") > before {
            return c;
        }
    }
    panic!("no connection landed on thread 0 in 8 tries");
}

/// A command queued on a key behind a transaction runs before the transactions queued
/// after it, even though it holds nothing while it waits. Before, the release that
/// restarted it also granted the key to the next transaction in the queue, and the
/// command, finding the key taken, queued again at the back: under a steady stream of
/// Sidekiq pushes (all naming `queues`), a reader of `queues` could wait for ever.
#[test]
fn a_command_queued_behind_a_transaction_is_not_overtaken_by_later_ones() {
    let server = KiteServer::start(&[], 2);
    let (set, list, busy) = (
        key_on_shard(0, "queues"),
        key_on_shard(1, "queue:"),
        key_on_shard(1, "busy"),
    );
    let mut admin = server.client();
    // The push, the reader and the push after it all start on thread 0, which stays free
    // while a script keeps thread 1 busy for a second.
    let mut first = client_on_thread_zero(&server, &mut admin);
    let mut reader = client_on_thread_zero(&server, &mut admin);
    let mut second = client_on_thread_zero(&server, &mut admin);
    let script = keep_busy(&server, &busy, 1000);
    let pause = || thread::sleep(std::time::Duration::from_millis(250));
    let push = |c: &mut Client, job: &str| {
        let replies = c.pipeline(&[
            vec!["MULTI"],
            vec!["SADD", &set, job],
            vec!["LPUSH", &list, job],
            vec!["EXEC"],
        ]);
        let exec = replies[3].as_array().expect("EXEC array").to_vec();
        assert_eq!(exec.len(), 2, "EXEC replies: {exec:?}");
    };
    let seen = thread::scope(|s| {
        pause();
        // Holds the set on shard 0 while it waits for the list's shard.
        s.spawn(|| push(&mut first, "first"));
        pause();
        // Queued on the set behind the first push.
        let seen = s.spawn(|| reader.cmd(&["SCARD", &set]));
        pause();
        // Queued on the set behind the reader.
        s.spawn(|| push(&mut second, "second"));
        seen.join().unwrap()
    });
    script.join().unwrap();
    assert_eq!(
        seen,
        Resp::Integer(1),
        "the reader, queued before the second push, saw its member"
    );
    assert_eq!(admin.cmd(&["SCARD", &set]), Resp::Integer(2));
    assert_eq!(admin.cmd(&["LLEN", &list]), Resp::Integer(2));
}

/// A push whose list is on the set's shard (a one-shard EXEC) goes on in a convoy with
/// the two-shard pushes queued on the set around it, instead of ending the convoy:
/// Sidekiq's pushes to several queues mix both kinds on one `queues` set.
#[test]
fn one_shard_pushes_queued_on_a_hot_key_join_the_convoy() {
    let server = KiteServer::start(&[], 2);
    let (set, near, far, busy) = (
        key_on_shard(0, "queues"),
        key_on_shard(0, "queue:"),
        key_on_shard(1, "queue:"),
        key_on_shard(1, "busy"),
    );
    let mut admin = server.client();
    let before = info_field(&mut admin, "transactions", "convoy_joins");
    // Every push starts on thread 0, which stays free while a script keeps thread 1 busy.
    let mut first = client_on_thread_zero(&server, &mut admin);
    let mut queued: Vec<Client> = (0..6)
        .map(|_| client_on_thread_zero(&server, &mut admin))
        .collect();
    let script = keep_busy(&server, &busy, 800);
    let pause = || thread::sleep(std::time::Duration::from_millis(250));
    let push = |c: &mut Client, list: &str, job: &str| {
        let replies = c.pipeline(&[
            vec!["MULTI"],
            vec!["SADD", &set, job],
            vec!["LPUSH", list, job],
            vec!["EXEC"],
        ]);
        let exec = replies[3].as_array().expect("EXEC array").to_vec();
        assert_eq!(exec.len(), 2, "{job}: {exec:?}");
        assert_eq!(exec[0], Resp::Integer(1), "{job}: {exec:?}");
        assert!(
            matches!(exec[1], Resp::Integer(n) if n >= 1),
            "{job}: {exec:?}"
        );
    };
    thread::scope(|s| {
        pause();
        // Holds the set on shard 0 while it waits for the far list's shard.
        s.spawn(|| push(&mut first, &far, "first"));
        pause();
        // Queued on the set behind it: one-shard and two-shard pushes in turn.
        for (i, c) in queued.iter_mut().enumerate() {
            let list = if i % 2 == 0 { &near } else { &far };
            let push = &push;
            s.spawn(move || push(c, list, &format!("job{i}")));
        }
    });
    script.join().unwrap();
    assert_eq!(admin.cmd(&["SCARD", &set]), Resp::Integer(7));
    assert_eq!(admin.cmd(&["LLEN", &near]), Resp::Integer(3));
    assert_eq!(admin.cmd(&["LLEN", &far]), Resp::Integer(4));
    let joins = info_field(&mut admin, "transactions", "convoy_joins") - before;
    assert!(
        joins >= 5,
        "6 pushes queued behind a held key, one- and two-shard; {joins} went on with the first of them"
    );
}

/// Active expiry goes on while a transaction holds other keys on the shard: only the
/// keys a transaction holds wait for it. Under a steady stream of pushes, every one
/// holding `queues`, a shard could otherwise go without active expiry for as long as
/// the stream lasts.
#[test]
fn keys_expire_on_a_shard_while_a_transaction_holds_another_key_there() {
    let server = KiteServer::start(&[], 2);
    let (set, list, busy, volatile) = (
        key_on_shard(0, "queues"),
        key_on_shard(1, "queue:"),
        key_on_shard(1, "busy"),
        key_on_shard(0, "expiring"),
    );
    let mut admin = server.client();
    assert_eq!(
        admin.cmd(&["CONFIG", "SET", "notify-keyspace-events", "Exs"]),
        Resp::ok()
    );
    let mut pusher = client_on_thread_zero(&server, &mut admin);
    let mut setter = client_on_thread_zero(&server, &mut admin);
    let mut sub = client_on_thread_zero(&server, &mut admin);
    sub.send(&["SUBSCRIBE", "__keyevent@0__:expired", "__keyevent@0__:sadd"]);
    for _ in 0..2 {
        sub.read();
    }
    let script = keep_busy(&server, &busy, 1200);
    thread::sleep(std::time::Duration::from_millis(250));
    thread::scope(|s| {
        // Holds the set on shard 0 until the script lets the list's shard go.
        s.spawn(|| {
            pusher.pipeline(&[
                vec!["MULTI"],
                vec!["SADD", &set, "default"],
                vec!["LPUSH", &list, "job"],
                vec!["EXEC"],
            ])
        });
        thread::sleep(std::time::Duration::from_millis(150));
        // Expires while the set is still held; nothing reads it.
        assert_eq!(
            setter.cmd(&["SET", &volatile, "1", "PX", "300"]),
            Resp::ok()
        );
    });
    script.join().unwrap();
    let mut events = Vec::new();
    for _ in 0..2 {
        let msg = sub.read();
        let parts = msg.as_array().expect("a message").to_vec();
        events.push(parts[1].as_string().unwrap_or_default());
    }
    assert_eq!(
        events,
        vec!["__keyevent@0__:expired", "__keyevent@0__:sadd"],
        "the key expired only once the push let its key go"
    );
}

/// What the AOF files of `server`'s data directory hold, as text.
fn aof_text(admin: &mut Client) -> String {
    let dir = admin
        .cmd(&["CONFIG", "GET", "dir"])
        .as_array()
        .expect("dir")[1]
        .as_string()
        .expect("a path");
    let mut text = String::new();
    let aof_dir = std::path::Path::new(&dir).join("appendonlydir");
    for entry in std::fs::read_dir(&aof_dir).expect("the AOF directory") {
        let bytes = std::fs::read(entry.expect("an entry").path()).expect("an AOF file");
        text.push_str(&String::from_utf8_lossy(&bytes));
    }
    text
}

/// A command that panics on a shard's thread (a bug) costs its own connection and
/// nothing else: the thread goes on running the work other threads send it. Before, the
/// panic ended the task that runs the thread's mail, and every later command for that
/// shard from another thread's connection waited for ever. At 2 and 4 threads.
#[test]
fn a_command_that_panics_on_another_thread_leaves_that_thread_serving() {
    for threads in [2, 4] {
        let mut server = KiteServer::start(&[], threads);
        let mut admin = server.client();
        let last = threads - 1;
        let poison = key_on_shard_of(threads, last, "poison");
        let mut victim = client_on_thread(&server, &mut admin, threads, 0);
        assert_eq!(victim.cmd(&["DEBUG", "PANIC-ON-KEY", &poison]), Resp::ok());
        victim.send(&["SET", &poison, "1"]);
        let (_, closed) = victim.read_raw_until_close(std::time::Duration::from_secs(5));
        assert!(closed, "the connection whose command panicked is closed");
        let mut other = client_on_thread(&server, &mut admin, threads, 0);
        for i in 0..20 {
            let key = key_on_shard_of(threads, last, &format!("after{i}-"));
            assert_eq!(other.cmd(&["SET", &key, "v"]), Resp::ok());
            assert_eq!(other.cmd(&["GET", &key]), Resp::bulk("v"));
        }
        assert_eq!(other.cmd(&["SET", &poison, "2"]), Resp::ok());
        assert_eq!(other.cmd(&["GET", &poison]), Resp::bulk("2"));
        server.assert_alive();
    }
}

/// Runs MULTI; SET `first`; SET `poison`; EXEC on `victim`, where `poison`'s command
/// panics, and checks that the connection is closed.
fn exec_that_panics(victim: &mut Client, first: &str, poison: &str) {
    for cmd in [
        vec!["MULTI"],
        vec!["SET", first, "1"],
        vec!["SET", poison, "1"],
    ] {
        victim.cmd(&cmd);
    }
    victim.send(&["EXEC"]);
    let (_, closed) = victim.read_raw_until_close(std::time::Duration::from_secs(5));
    assert!(
        closed,
        "the connection whose transaction panicked is closed"
    );
}

/// Writes keys on `shard` through `writer` and checks that each, once acknowledged, is
/// in the AOF (the server runs `appendfsync always`).
fn assert_later_writes_reach_the_aof(writer: &mut Client, admin: &mut Client, shard: usize) {
    let later: Vec<String> = (0..4)
        .map(|i| key_on_shard(shard, &format!("later{i}-")))
        .collect();
    for key in &later {
        assert_eq!(writer.cmd(&["SET", key, "kept"]), Resp::ok());
    }
    let aof = aof_text(admin);
    for key in &later {
        assert!(
            aof.contains(key.as_str()),
            "{key} acknowledged but not in the AOF"
        );
    }
}

/// A transaction whose command panics on one shard lets its keys go, and that shard's
/// later writes still reach the AOF before they are acknowledged. Before, the panic left
/// the shard holding its AOF buffer for the transaction's block, so every later write
/// there was answered and never written.
#[test]
fn writes_after_a_transaction_panicked_still_reach_the_aof() {
    let server = KiteServer::start(&["--appendonly", "yes", "--appendfsync", "always"], 2);
    let mut admin = server.client();
    let (first, poison) = (key_on_shard(0, "first"), key_on_shard(1, "poison"));
    assert_eq!(admin.cmd(&["DEBUG", "PANIC-ON-KEY", &poison]), Resp::ok());
    exec_that_panics(&mut server.client(), &first, &poison);
    // Its keys are free again, from either thread.
    for _ in 0..2 {
        let mut c = server.client();
        assert_eq!(c.cmd(&["SET", &first, "2"]), Resp::ok());
        assert_eq!(c.cmd(&["SET", &poison, "2"]), Resp::ok());
    }
    assert_later_writes_reach_the_aof(&mut server.client(), &mut admin, 1);
}

/// A transaction whose command panics on the connection's own thread: that thread's
/// later writes still reach the AOF before they are acknowledged.
#[test]
fn writes_after_a_transaction_panicked_on_its_own_thread_still_reach_the_aof() {
    let server = KiteServer::start(&["--appendonly", "yes", "--appendfsync", "always"], 2);
    let mut admin = server.client();
    let (before, poison) = (key_on_shard(0, "before"), key_on_shard(0, "poison"));
    let mut victim = client_on_thread_zero(&server, &mut admin);
    assert_eq!(victim.cmd(&["DEBUG", "PANIC-ON-KEY", &poison]), Resp::ok());
    exec_that_panics(&mut victim, &before, &poison);
    let mut writer = client_on_thread_zero(&server, &mut admin);
    assert_later_writes_reach_the_aof(&mut writer, &mut admin, 0);
}

/// The first key `<tag><i>` on `shard` of a `threads`-thread server.
fn key_on_shard_of(threads: usize, shard: usize, tag: &str) -> String {
    (0..)
        .map(|i| format!("{tag}{i}"))
        .find(|k| shard_of(k, threads) == shard)
        .expect("a key")
}

/// A connection on thread `thread` of a `threads`-thread server: one whose GET of a key
/// on that thread's shard runs without a hop.
fn client_on_thread(
    server: &KiteServer,
    admin: &mut Client,
    threads: usize,
    thread: usize,
) -> Client {
    let probe = key_on_shard_of(threads, thread, "probe");
    for _ in 0..4 * threads {
        let mut c = server.client();
        let before = info_field(admin, "transactions", "one_hop_commands");
        c.cmd(&["GET", &probe]);
        if info_field(admin, "transactions", "one_hop_commands") == before {
            return c;
        }
    }
    panic!("no connection landed on thread {thread}");
}

/// A client waits in BLMOVE on a list for a list of another shard; a transaction pushes
/// to the list and, held up on a later shard, keeps it while a read of the list queues
/// behind it. When the transaction lets the list go, the waiter is served before the
/// queued read (Redis serves blocked clients as soon as the command that readied them
/// ends), and EXEC answers once the element has landed: its connection, reading the
/// destination next, finds it. (This passed before the release served its waiters ahead
/// of the queued work, when the queued batch served the waiter and kept the move to wait
/// for as its own: the landing still reached the destination's thread first here.)
#[test]
fn a_move_readied_by_a_transaction_lands_before_exec_answers_though_work_waited_on_its_list() {
    let threads = 3;
    let server = KiteServer::start(&[], threads);
    let on = |shard: usize, tag: &str| key_on_shard_of(threads, shard, tag);
    let (dst, src, other, busy) = (on(0, "dst"), on(1, "src"), on(2, "other"), on(2, "busy"));
    let mut admin = server.client();
    let mut mover = server.client();
    mover.send(&["BLMOVE", &src, &dst, "LEFT", "RIGHT", "10"]);
    common::blocked::wait_blocked(&mut admin, 1, "the mover");
    let mut pusher = client_on_thread(&server, &mut admin, threads, 0);
    let mut reader = client_on_thread(&server, &mut admin, threads, 0);
    let mut runner = server.client();
    let script = "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
                  repeat local n = redis.call('TIME') until n[1] * 1000000 + n[2] - s > 800000 \
                  return 1";
    thread::scope(|s| {
        let busy_run = s.spawn(|| runner.cmd(&["EVAL", script, "1", &busy]));
        thread::sleep(std::time::Duration::from_millis(250));
        let push = s.spawn(|| {
            pusher.pipeline(&[
                vec!["MULTI"],
                vec!["LPUSH", &src, "job"],
                vec!["SET", &other, "x"],
                vec!["EXEC"],
                vec!["LRANGE", &dst, "0", "-1"],
            ])
        });
        thread::sleep(std::time::Duration::from_millis(150));
        // Queued behind the transaction, which holds the list until the script ends.
        assert_eq!(reader.cmd(&["LLEN", &src]), Resp::Integer(0));
        let replies = push.join().unwrap();
        assert_eq!(
            replies[4],
            Resp::Array(vec![Resp::bulk("job")]),
            "the destination right after EXEC"
        );
        assert_eq!(busy_run.join().unwrap(), Resp::Integer(1));
    });
    assert_eq!(mover.read(), Resp::bulk("job"));
}

/// Transactions travelling together (a convoy) when one of them panics on a shard: that
/// one's connection is closed, and the others are answered and applied in full. Before,
/// the panic dropped the whole convoy: every member's connection was closed, each with
/// part of its transaction applied. What ran of the one that panicked is in memory, and
/// the AOF has every member's pushes in the order memory has them.
#[test]
fn a_transaction_that_panics_in_a_convoy_costs_the_others_nothing() {
    let server = KiteServer::start(&["--appendonly", "yes", "--appendfsync", "always"], 2);
    let (head, list, busy, poison) = (
        key_on_shard(0, "queues"),
        key_on_shard(1, "queue:"),
        key_on_shard(1, "busy"),
        key_on_shard(1, "poison"),
    );
    let mut admin = server.client();
    assert_eq!(admin.cmd(&["DEBUG", "PANIC-ON-KEY", &poison]), Resp::ok());
    // On the first list's thread: the other's is kept busy, and would not read them.
    let clients: Vec<Client> = (0..4)
        .map(|_| client_on_thread_zero(&server, &mut admin))
        .collect();
    let before = info_field(&mut admin, "transactions", "convoy_joins");
    // The first transaction holds `head` and waits on the busy thread; the others queue
    // on `head` behind it and go on together once it lets `head` go. The third of the
    // four panics, behind one that pushed to `head` before it in the same convoy.
    let script = keep_busy(&server, &busy, 400);
    thread::sleep(std::time::Duration::from_millis(100));
    let mut members = Vec::new();
    for (i, mut c) in clients.into_iter().enumerate() {
        let (head, list, poison) = (head.clone(), list.clone(), poison.clone());
        members.push(thread::spawn(move || {
            let member = format!("m{i}");
            let second = if i == 2 {
                vec!["SET".to_string(), poison, "x".to_string()]
            } else {
                vec!["LPUSH".to_string(), list, member.clone()]
            };
            let queued = [
                vec!["MULTI".to_string()],
                vec!["LPUSH".to_string(), head, member],
                second,
            ];
            for q in &queued {
                c.cmd(q);
            }
            c.send(&["EXEC"]);
            c.try_read().ok()
        }));
        thread::sleep(std::time::Duration::from_millis(50));
    }
    let answers: Vec<Option<Resp>> = members.into_iter().map(|m| m.join().unwrap()).collect();
    script.join().unwrap();
    assert!(
        answers[2].is_none(),
        "the transaction that panicked got {:?}",
        answers[2]
    );
    for i in [0, 1, 3] {
        let items = answers[i]
            .as_ref()
            .and_then(|a| a.as_array().map(|a| a.to_vec()))
            .unwrap_or_else(|| panic!("transaction {i} got {:?}", answers[i]));
        assert_eq!(items.len(), 2, "transaction {i}: {items:?}");
    }
    assert!(
        info_field(&mut admin, "transactions", "convoy_joins") > before,
        "no convoy"
    );
    assert_eq!(
        bytes_set(&admin.cmd(&["LRANGE", &list, "0", "-1"])),
        [b"m0".to_vec(), b"m1".to_vec(), b"m3".to_vec()]
            .into_iter()
            .collect()
    );
    // Every member pushed to `head`, the one that panicked too (its first command ran);
    // a replay of the AOF must push them in the order memory has them.
    let in_memory: Vec<String> = admin
        .cmd(&["LRANGE", &head, "0", "-1"])
        .as_array()
        .expect("a list")
        .iter()
        .rev()
        .map(|m| m.as_string().expect("a member"))
        .collect();
    assert_eq!(in_memory.len(), 4, "{in_memory:?}");
    let aof = aof_text(&mut admin);
    let mut in_aof: Vec<(usize, String)> = in_memory
        .iter()
        .map(|m| {
            let push = format!("${}\r\n{head}\r\n${}\r\n{m}\r\n", head.len(), m.len());
            let at = aof
                .find(&push)
                .unwrap_or_else(|| panic!("{m}'s push to {head} not in the AOF"));
            (at, m.clone())
        })
        .collect();
    in_aof.sort();
    let in_aof: Vec<String> = in_aof.into_iter().map(|(_, m)| m).collect();
    assert_eq!(
        in_aof, in_memory,
        "pushes to {head}: the AOF's order, memory's"
    );
    // Its keys were let go with the convoy.
    assert_eq!(admin.cmd(&["SET", &poison, "y"]), Resp::ok());
    assert_eq!(admin.cmd(&["LPUSH", &head, "m3"]), Resp::Integer(5));
}
