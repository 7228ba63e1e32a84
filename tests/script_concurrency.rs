//! Scripts under concurrency: many connections run scripts over shared and disjoint
//! queue tags, flows that reach into other queues (the global and escalation paths), and
//! cross-shard transactions beside them. Invariants must hold at the end; every loop is
//! bounded by a count, nothing measures time.

mod common;

use common::*;
use std::collections::HashSet;
use std::thread;

const QUEUES: usize = 6;
const CLIENTS: usize = 12;
const ROUNDS: usize = 250;
const ACCOUNT_START: i64 = 1000;
/// Distinct copies of each script (a comment differs): each SHA reaches another queue
/// for the first time on its own, so the escalation and restart paths run many times.
const VARIANTS: usize = 8;

fn queue(i: usize) -> String {
    format!("bull:cq{i}")
}

/// Moves one unit between two accounts of a queue, reading an undeclared key of the
/// same queue (same tag: no extra lock needed).
fn transfer_script(variant: usize) -> String {
    format!(
        "-- transfer {variant}
local q = ARGV[1]
local from = redis.call('DECRBY', KEYS[1], 1)
redis.call('INCRBY', KEYS[2], 1)
redis.call('INCR', q .. ':transfers')
return from"
    )
}

/// Finishes a job: pops it from its queue (a write), then records it in its parent's
/// queue, which may live on another shard and was not declared: the escalation path on
/// a new SHA, the global path afterwards.
fn finish_script(variant: usize) -> String {
    format!(
        "-- finish {variant}
local job = redis.call('LPOP', KEYS[1])
if not job then return false end
local parent = ARGV[1]
redis.call('INCR', parent .. ':children_done')
redis.call('RPUSH', parent .. ':results', job)
return job"
    )
}

/// Reads another queue's flag before writing anything: the restart path.
fn peek_script(variant: usize) -> String {
    format!(
        "-- peek {variant}
local other = redis.call('GET', ARGV[1] .. ':flag')
redis.call('INCR', KEYS[1])
return other"
    )
}

fn run(threads: usize) {
    let kite = KiteServer::start(&[], threads);
    let mut c = kite.client();
    let mut jobs_total = 0usize;
    for q in 0..QUEUES {
        let name = queue(q);
        c.cmd(&["SET", &format!("{name}:acct:a"), &ACCOUNT_START.to_string()]);
        c.cmd(&["SET", &format!("{name}:acct:b"), &ACCOUNT_START.to_string()]);
        c.cmd(&["SET", &format!("{name}:flag"), "up"]);
        let mut push = vec!["RPUSH".to_string(), format!("{name}:jobs")];
        for j in 0..400 {
            push.push(format!("{q}-{j}"));
        }
        jobs_total += 400;
        c.cmd(&push);
    }
    let mut shas = Vec::new();
    for v in 0..VARIANTS {
        for body in [transfer_script(v), finish_script(v), peek_script(v)] {
            let r = c.cmd(&["SCRIPT", "LOAD", &body]);
            shas.push(r.as_string().expect("SCRIPT LOAD gives the sha"));
        }
    }
    thread::scope(|s| {
        for t in 0..CLIENTS {
            let kite = &kite;
            let shas = &shas;
            s.spawn(move || {
                let mut c = kite.client();
                let mut rng = Rng::new(77 + t as u64);
                for _ in 0..ROUNDS {
                    let v = rng.below(VARIANTS as u64) as usize;
                    let q = rng.below(QUEUES as u64) as usize;
                    let other = (q + 1 + rng.below(QUEUES as u64 - 1) as usize) % QUEUES;
                    let name = queue(q);
                    let r = match rng.below(4) {
                        0 => c.cmd(&[
                            "EVALSHA",
                            &shas[v * 3],
                            "2",
                            &format!("{name}:acct:a"),
                            &format!("{name}:acct:b"),
                            &name,
                        ]),
                        1 => c.cmd(&[
                            "EVALSHA",
                            &shas[v * 3 + 1],
                            "1",
                            &format!("{name}:jobs"),
                            &queue(other),
                        ]),
                        2 => c.cmd(&[
                            "EVALSHA",
                            &shas[v * 3 + 2],
                            "1",
                            &format!("{name}:peeks"),
                            &queue(other),
                        ]),
                        _ => {
                            // A cross-shard transaction on keys the scripts also use.
                            c.cmd(&["MULTI"]);
                            c.cmd(&["INCR", &format!("{name}:tx")]);
                            c.cmd(&["INCR", &format!("{}:tx", queue(other))]);
                            c.cmd(&["GET", &format!("{}:flag", queue(other))]);
                            c.cmd(&["EXEC"])
                        }
                    };
                    assert!(!r.is_error(), "script or transaction failed: {r}");
                }
            });
        }
    });
    // Accounts: each queue's two accounts still sum to their start, and the transfer
    // counter matches what moved.
    let mut finished = 0i64;
    let mut results: HashSet<String> = HashSet::new();
    let mut tx_total = 0i64;
    for q in 0..QUEUES {
        let name = queue(q);
        let a = c
            .cmd(&["GET", &format!("{name}:acct:a")])
            .parse_int()
            .unwrap();
        let b = c
            .cmd(&["GET", &format!("{name}:acct:b")])
            .parse_int()
            .unwrap();
        assert_eq!(
            a + b,
            2 * ACCOUNT_START,
            "queue {name}: accounts lost a unit"
        );
        let moved = c
            .cmd(&["GET", &format!("{name}:transfers")])
            .parse_int()
            .unwrap_or(0);
        assert_eq!(
            ACCOUNT_START - a,
            moved,
            "queue {name}: transfers miscounted"
        );
        finished += c
            .cmd(&["GET", &format!("{name}:children_done")])
            .parse_int()
            .unwrap_or(0);
        let list = c.cmd(&["LRANGE", &format!("{name}:results"), "0", "-1"]);
        for job in list.as_array().unwrap() {
            let job = job.as_string().unwrap();
            assert!(results.insert(job.clone()), "job {job} finished twice");
        }
        tx_total += c
            .cmd(&["GET", &format!("{name}:tx")])
            .parse_int()
            .unwrap_or(0);
    }
    let left: usize = (0..QUEUES)
        .map(|q| {
            c.cmd(&["LLEN", &format!("{}:jobs", queue(q))])
                .as_int()
                .unwrap() as usize
        })
        .sum();
    assert_eq!(
        finished as usize,
        results.len(),
        "a finished job has no result"
    );
    assert_eq!(
        left + results.len(),
        jobs_total,
        "jobs were lost or duplicated"
    );
    assert_eq!(tx_total % 2, 0, "a transaction was applied in part");
    let info = c.cmd(&["INFO", "transactions"]).as_string().unwrap();
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    println!(
        "threads {threads}: fast {} global {} restarted {} escalated {}",
        field("scripts_fast_path"),
        field("scripts_global_path"),
        field("scripts_restarted"),
        field("scripts_escalated")
    );
    assert!(field("scripts_fast_path") > 0);
    if threads > 1 {
        assert!(
            field("scripts_global_path") > 0,
            "no script took the global path"
        );
        assert!(field("scripts_restarted") > 0, "no script was restarted");
    }
}

#[test]
fn scripts_keep_invariants_at_one_thread() {
    run(1);
}

#[test]
fn scripts_keep_invariants_at_four_threads() {
    run(4);
}
