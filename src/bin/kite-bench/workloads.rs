//! The workloads of BENCHMARKS.md: drain, brpop-keys, ops, latency, memory.

use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conn::{wait_blocked, Admin, Conn};
use crate::report::{commandstats_delta, Json, Latency, Mark, Progress, RunResult};
use crate::resp;
use crate::runner::{on_threads, splitmix, supervise, Ctl, Rng, Target};

/// Size of the Sidekiq-shaped jobs.
pub const JOB_BYTES: usize = 150;

/// A Sidekiq-shaped job (~150 bytes of JSON) with a unique 24-hex-digit jid.
pub fn sidekiq_job(out: &mut Vec<u8>, queue: &str, q: u64, seq: u64) {
    let start = out.len();
    let jid = splitmix(seq ^ (q << 48));
    // Sidekiq stores the queue's short name ("default" for the list "queue:default").
    let queue = queue.strip_prefix("queue:").unwrap_or(queue);
    let head = format!("{{\"queue\":\"{queue}\",\"class\":\"BenchJob\",\"args\":[{seq},\"");
    let tail = format!(
        "\"],\"jid\":\"{jid:016x}{:08x}\",\"created_at\":1700000000.123,\"enqueued_at\":1700000000.124}}",
        (q as u32) ^ (seq as u32).rotate_left(16)
    );
    out.extend_from_slice(head.as_bytes());
    let pad = JOB_BYTES.saturating_sub(head.len() + tail.len());
    out.extend(std::iter::repeat_n(b'x', pad));
    out.extend_from_slice(tail.as_bytes());
    debug_assert!(out.len() - start >= JOB_BYTES || queue.len() > 16);
}

/// Finishes a result: window, commandstats, error.
fn finish(
    mut r: RunResult,
    t: &Target,
    ctl: &Ctl,
    admin: &mut Admin,
    stats0: &std::collections::BTreeMap<String, (u64, u64)>,
) -> io::Result<RunResult> {
    if let Some(e) = ctl.error() {
        return Err(io::Error::other(e));
    }
    let start = ctl
        .start_mark()
        .ok_or_else(|| io::Error::other("the run never started"))?;
    let end = ctl.end_mark();
    r.set_window(&start, &end);
    r.ops = ctl.count.load(Ordering::Relaxed).min(ctl.total.max(1));
    r.complete = ctl.done();
    r.server = t.addr.to_string();
    r.server_pid = t.pid;
    if let Ok(stats1) = admin.commandstats() {
        r.commandstats = commandstats_delta(stats0, &stats1);
    }
    Ok(r)
}

fn progress(label: &str, ctl: &Ctl, t: &Target) -> Progress {
    Progress::start(
        label.to_string(),
        ctl.count.clone(),
        ctl.total,
        Duration::from_secs_f64(t.max_seconds),
    )
}

// ---------------------------------------------------------------------------------------
// drain
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct DrainOpts {
    pub queues: usize,
    pub jobs: u64,
    pub consumers: usize,
    pub timeout: f64,
    pub prefix: String,
}

pub fn drain(t: &Target, o: &DrainOpts) -> io::Result<RunResult> {
    let names: Vec<String> = (0..o.queues).map(|i| format!("{}{i}", o.prefix)).collect();
    let mut admin = Admin::connect(t.addr)?;
    admin.del_keys(
        &names
            .iter()
            .map(|n| n.as_bytes().to_vec())
            .collect::<Vec<_>>(),
    )?;
    for (q, name) in names.iter().enumerate() {
        fill_queue(&mut admin, name, q as u64, 0, o.jobs)?;
        if crate::signal::stopping() {
            return Err(io::Error::other("interrupted"));
        }
    }
    let total = o.jobs * o.queues as u64;
    let ctl = Arc::new(Ctl::new(t, total));
    let stats0 = admin.commandstats()?;
    let conns = o.queues * o.consumers;
    let threads = t.client_threads.max(1);
    let _bar = progress("drain", &ctl, t);
    let timeout = format!("{}", o.timeout);
    on_threads(threads, |ti| {
        let ctl = ctl.clone();
        let names = names.clone();
        let timeout = timeout.clone();
        async move {
            let mut mine = Vec::new();
            let mut setup_err = None;
            for j in (ti..conns).step_by(threads) {
                match Conn::connect(t.addr).await {
                    Ok(c) => mine.push((c, j % names.len())),
                    Err(e) => {
                        setup_err = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = setup_err {
                ctl.fail(e);
            }
            ctl.sync_start(|| {});
            let mut handles = Vec::new();
            for (mut c, q) in mine {
                let ctl = ctl.clone();
                let mut cmd = Vec::new();
                resp::encode(
                    &mut cmd,
                    &[b"BRPOP", names[q].as_bytes(), timeout.as_bytes()],
                );
                handles.push(tokio::task::spawn_local(async move {
                    while !ctl.should_stop() {
                        c.send(&cmd).await?;
                        let mut got = false;
                        c.read_replies(1, |r| {
                            got = r.first() == Some(&b'*') && r.get(1) != Some(&b'-');
                            false
                        })
                        .await?;
                        if got {
                            ctl.add(1);
                        } else {
                            break; // timed out: this queue is empty
                        }
                    }
                    Ok(())
                }));
            }
            supervise(&ctl, handles).await;
            Ok(())
        }
    })?;
    let mut r = RunResult::new("drain", format!("drain Q={}", o.queues), "job");
    r.params = vec![
        ("queues".into(), o.queues.into()),
        ("jobs_per_queue".into(), o.jobs.into()),
        ("consumers_per_queue".into(), o.consumers.into()),
        ("brpop_timeout".into(), o.timeout.into()),
        ("job_bytes".into(), JOB_BYTES.into()),
        ("client_threads".into(), threads.into()),
        (
            "queue_names".into(),
            Json::Arr(names.iter().map(|n| n.as_str().into()).collect()),
        ),
    ];
    let r = finish(r, t, &ctl, &mut admin, &stats0)?;
    admin.del_keys(
        &names
            .iter()
            .map(|n| n.as_bytes().to_vec())
            .collect::<Vec<_>>(),
    )?;
    Ok(r)
}

// ---------------------------------------------------------------------------------------
// brpop-keys
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct BrpopKeysOpts {
    pub keys: usize,
    pub keys_per_call: usize,
    pub consumers: usize,
    pub producers: usize,
    pub messages_per_producer: u64,
    pub timeout: f64,
    pub prefix: String,
    /// Each consumer keeps the key set it drew first and only shuffles its order on every
    /// call, as Sidekiq does with its weighted queues.
    pub fixed_sets: bool,
}

/// `BRPOP` over the keys `names[i]` for each `i` of `chosen`, then the timeout.
fn encode_brpop(out: &mut Vec<u8>, chosen: &[u32], names: &[Vec<u8>], timeout: &[u8]) {
    out.clear();
    let mut args: Vec<&[u8]> = Vec::with_capacity(chosen.len() + 2);
    args.push(b"BRPOP");
    for &i in chosen {
        args.push(&names[i as usize]);
    }
    args.push(timeout);
    resp::encode(out, &args);
}

/// The next BRPOP of a consumer with a fixed key set: the same `k` keys, shuffled.
fn brpop_shuffled(
    out: &mut Vec<u8>,
    rng: &mut Rng,
    idx: &mut [u32],
    k: usize,
    names: &[Vec<u8>],
    timeout: &[u8],
) {
    for i in (1..k).rev() {
        let j = rng.below((i + 1) as u64) as usize;
        idx.swap(i, j);
    }
    encode_brpop(out, &idx[..k], names, timeout);
}

/// A BRPOP over `k` distinct random keys out of `keys`.
fn brpop_random(
    out: &mut Vec<u8>,
    rng: &mut Rng,
    idx: &mut [u32],
    k: usize,
    names: &[Vec<u8>],
    timeout: &[u8],
) {
    let n = idx.len();
    for i in 0..k {
        let j = i + rng.below((n - i) as u64) as usize;
        idx.swap(i, j);
    }
    encode_brpop(out, &idx[..k], names, timeout);
}

pub fn brpop_keys(t: &Target, o: &BrpopKeysOpts) -> io::Result<RunResult> {
    let k = o.keys_per_call.clamp(1, o.keys);
    let names: Vec<Vec<u8>> = (0..o.keys)
        .map(|i| format!("{}{i}", o.prefix).into_bytes())
        .collect();
    let mut admin = Admin::connect(t.addr)?;
    admin.del_keys(&names)?;
    let total = o.producers as u64 * o.messages_per_producer;
    let ctl = Arc::new(Ctl::new(t, total));
    let stats0 = admin.commandstats()?;
    let threads = t.client_threads.max(1);
    let calls = Arc::new(AtomicU64::new(0));
    let _bar = progress(&format!("brpop-keys {}x{}", o.consumers, k), &ctl, t);
    let timeout = format!("{}", o.timeout).into_bytes();
    let blocked_ok = Arc::new(Mutex::new(true));
    on_threads(threads, |ti| {
        let ctl = ctl.clone();
        let names = names.clone();
        let timeout = timeout.clone();
        let calls = calls.clone();
        let blocked_ok = blocked_ok.clone();
        async move {
            let names = Rc::new(names);
            let mut consumers = Vec::new();
            let mut producers = Vec::new();
            let setup: io::Result<()> = async {
                for j in (ti..o.consumers).step_by(threads) {
                    let mut c = Conn::connect(t.addr).await?;
                    let mut rng = Rng::new(j as u64 + 1);
                    let mut idx: Vec<u32> = (0..names.len() as u32).collect();
                    let mut cmd = Vec::new();
                    brpop_random(&mut cmd, &mut rng, &mut idx, k, &names, &timeout);
                    if o.fixed_sets {
                        // Consumer j's set holds key j mod keys: with at least as many
                        // consumers as keys, every key has one, so every push is taken.
                        let own = (j % names.len()) as u32;
                        let at = idx.iter().position(|&i| i == own).expect("a key index");
                        if at >= k {
                            idx.swap(0, at);
                        }
                        brpop_shuffled(&mut cmd, &mut rng, &mut idx, k, &names, &timeout);
                    }
                    c.send(&cmd).await?;
                    consumers.push((c, rng, idx));
                }
                for j in (ti..o.producers).step_by(threads) {
                    producers.push((Conn::connect(t.addr).await?, j));
                }
                Ok(())
            }
            .await;
            if let Err(e) = setup {
                ctl.fail(e);
            }
            ctl.sync_start(|| {
                // Every consumer is parked in BRPOP before the first push.
                if let Ok(mut a) = Admin::connect(t.addr) {
                    let ok = wait_blocked(&mut a, o.consumers as u64, Duration::from_secs(30))
                        .unwrap_or(false);
                    *blocked_ok.lock().unwrap() = ok;
                }
            });
            let mut handles = Vec::new();
            for (mut c, mut rng, mut idx) in consumers {
                let ctl = ctl.clone();
                let names = names.clone();
                let timeout = timeout.clone();
                let calls = calls.clone();
                let fixed_sets = o.fixed_sets;
                handles.push(tokio::task::spawn_local(async move {
                    let mut cmd = Vec::new();
                    let mut first = true;
                    loop {
                        if !first {
                            if ctl.should_stop() {
                                break;
                            }
                            if fixed_sets {
                                brpop_shuffled(&mut cmd, &mut rng, &mut idx, k, &names, &timeout);
                            } else {
                                brpop_random(&mut cmd, &mut rng, &mut idx, k, &names, &timeout);
                            }
                            c.send(&cmd).await?;
                        }
                        first = false;
                        let mut got = false;
                        c.read_replies(1, |r| {
                            got = r.first() == Some(&b'*') && r.get(1) != Some(&b'-');
                            false
                        })
                        .await?;
                        calls.fetch_add(1, Ordering::Relaxed);
                        if got {
                            ctl.add(1);
                        }
                    }
                    Ok(())
                }));
            }
            for (mut c, j) in producers {
                let ctl = ctl.clone();
                let names = names.clone();
                let n = o.messages_per_producer;
                handles.push(tokio::task::spawn_local(async move {
                    let mut rng = Rng::new(1_000_000 + j as u64);
                    let mut cmd = Vec::new();
                    for i in 0..n {
                        if ctl.should_stop() {
                            break;
                        }
                        let key = &names[rng.below(names.len() as u64) as usize];
                        let msg = format!("msg:{j}:{i}");
                        cmd.clear();
                        resp::encode(&mut cmd, &[b"LPUSH", key, msg.as_bytes()]);
                        c.send(&cmd).await?;
                        c.expect(1).await?;
                    }
                    Ok(())
                }));
            }
            supervise(&ctl, handles).await;
            Ok(())
        }
    })?;
    let mut r = RunResult::new(
        "brpop-keys",
        format!(
            "brpop-keys C={} k={}{}",
            o.consumers,
            k,
            if o.fixed_sets { " fixed sets" } else { "" }
        ),
        "message",
    );
    r.params = vec![
        ("keys".into(), o.keys.into()),
        ("keys_per_call".into(), k.into()),
        ("consumers".into(), o.consumers.into()),
        ("producers".into(), o.producers.into()),
        (
            "messages_per_producer".into(),
            o.messages_per_producer.into(),
        ),
        ("brpop_timeout".into(), o.timeout.into()),
        ("client_threads".into(), threads.into()),
        ("fixed_sets".into(), o.fixed_sets.into()),
    ];
    let mut r = finish(r, t, &ctl, &mut admin, &stats0)?;
    r.extra
        .push(("brpop_calls".into(), calls.load(Ordering::Relaxed).into()));
    if !*blocked_ok.lock().unwrap() {
        r.note =
            Some("not every consumer was reported blocked before the producers started".into());
    }
    admin.del_keys(&names)?;
    Ok(r)
}

// ---------------------------------------------------------------------------------------
// ops
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct OpsOpts {
    pub commands: Vec<String>,
    pub pipelines: Vec<usize>,
    pub connections: usize,
    /// Requests per case; 0: 100 000 × min(pipeline, 8).
    pub requests: u64,
    pub keyspace: u64,
    pub data_size: usize,
    /// The `push` case's set of queue names.
    pub queue_set: String,
    /// The `push` case's number of queues.
    pub push_queues: u64,
}

/// The small script of the `evalsha` case: one write and its reply, as queue libraries'
/// scripts do in their shortest form.
const OPS_SCRIPT: &[u8] = b"return redis.call('SET', KEYS[1], ARGV[1])";

/// One Sidekiq client push (Sidekiq 7's `Client#raw_push`): the queue named in the set of
/// queues and the job pushed onto its list, in one MULTI/EXEC. Four replies.
fn encode_push(out: &mut Vec<u8>, queue_set: &[u8], queue: u64, seq: u64) {
    let list = ops_key("push", queue);
    let mut job = Vec::with_capacity(JOB_BYTES);
    sidekiq_job(&mut job, &String::from_utf8_lossy(&list), queue, seq);
    resp::encode(out, &[b"MULTI"]);
    resp::encode(out, &[b"SADD", queue_set, &list[b"kb:queue:".len()..]]);
    resp::encode(out, &[b"LPUSH", &list, &job]);
    resp::encode(out, &[b"EXEC"]);
}

/// One RQ enqueue (`Queue.enqueue_job`, RQ 1.x and 2.x): the queue named in the set of
/// queues, the job's hash written (its status, then the whole job), and its id pushed
/// onto the queue's list, in one MULTI/EXEC. Six replies. The job's hash is a key of its
/// own, so the shards a transaction spans change from job to job.
fn encode_rq_enqueue(out: &mut Vec<u8>, queue: u64, id: u64) {
    let list = ops_key("rq-enqueue", queue);
    let job_id = format!("{:016x}", splitmix(id));
    let job = format!("kb:rq:job:{job_id}");
    let mut data = Vec::with_capacity(JOB_BYTES);
    sidekiq_job(&mut data, &String::from_utf8_lossy(&list), queue, id);
    resp::encode(out, &[b"MULTI"]);
    resp::encode(out, &[b"SADD", b"kb:rq:queues", &list]);
    resp::encode(out, &[b"HSET", job.as_bytes(), b"status", b"queued"]);
    resp::encode(
        out,
        &[
            b"HSET",
            job.as_bytes(),
            b"created_at",
            b"2026-11-29T10:00:00.000000Z",
            b"data",
            &data,
            b"description",
            b"bench.job(1)",
            b"timeout",
            b"180",
            b"origin",
            &list[b"kb:rq:queue:".len()..],
            b"enqueued_at",
            b"2026-11-29T10:00:00.000001Z",
        ],
    );
    resp::encode(out, &[b"RPUSH", &list, job_id.as_bytes()]);
    resp::encode(out, &[b"EXEC"]);
}

/// One Celery message's acknowledgement bookkeeping by kombu's Redis transport: on
/// delivery the message is recorded as unacknowledged (ZADD to the index, HSET of the
/// message), on acknowledgement both are removed, each in one MULTI/EXEC. Eight replies;
/// both keys are named by every message.
fn encode_celery_ack(out: &mut Vec<u8>, tag: u64) {
    let tag = format!(
        "{:08x}-0000-4000-8000-{:012x}",
        tag as u32,
        splitmix(tag) >> 16
    );
    let mut message = Vec::with_capacity(JOB_BYTES);
    sidekiq_job(&mut message, "celery", 0, 0);
    resp::encode(out, &[b"MULTI"]);
    resp::encode(
        out,
        &[
            b"ZADD",
            b"kb:unacked_index",
            b"1764410400.123",
            tag.as_bytes(),
        ],
    );
    resp::encode(out, &[b"HSET", b"kb:unacked", tag.as_bytes(), &message]);
    resp::encode(out, &[b"EXEC"]);
    resp::encode(out, &[b"MULTI"]);
    resp::encode(out, &[b"ZREM", b"kb:unacked_index", tag.as_bytes()]);
    resp::encode(out, &[b"HDEL", b"kb:unacked", tag.as_bytes()]);
    resp::encode(out, &[b"EXEC"]);
}

fn ops_key(cmd: &str, n: u64) -> Vec<u8> {
    match cmd {
        "lpush" | "rpop" => format!("kb:list:{n}").into_bytes(),
        "push" => format!("kb:queue:{n}").into_bytes(),
        "rq-enqueue" => format!("kb:rq:queue:{n}").into_bytes(),
        _ => format!("kb:key:{n}").into_bytes(),
    }
}

/// Runs every (pipeline, command) case; one result each.
pub fn ops(
    t: &Target,
    o: &OpsOpts,
    mut each: impl FnMut(&RunResult),
) -> io::Result<Vec<RunResult>> {
    let mut out = Vec::new();
    let mut admin = Admin::connect(t.addr)?;
    let mut all_keys: Vec<Vec<u8>> = (0..o.keyspace)
        .flat_map(|n| [ops_key("set", n), ops_key("lpush", n)])
        .collect();
    all_keys.extend((0..o.push_queues).map(|n| ops_key("push", n)));
    all_keys.push(o.queue_set.as_bytes().to_vec());
    if o.commands
        .iter()
        .any(|c| c.eq_ignore_ascii_case("rq-enqueue"))
    {
        all_keys.extend((0..o.push_queues).map(|n| ops_key("rq-enqueue", n)));
        all_keys.push(b"kb:rq:queues".to_vec());
        // Job ids repeat with each connection's ring (`ops_case`).
        let ids = (o.connections * RING) as u64;
        all_keys.extend((0..ids).map(|id| format!("kb:rq:job:{:016x}", splitmix(id)).into_bytes()));
    }
    all_keys.extend([b"kb:unacked".to_vec(), b"kb:unacked_index".to_vec()]);
    admin.del_keys(&all_keys)?;
    let value = vec![b'x'; o.data_size];
    for &p in &o.pipelines {
        for cmd in &o.commands {
            let cmd = cmd.to_ascii_lowercase();
            let p = p.max(1);
            let requests = if o.requests > 0 {
                o.requests
            } else {
                100_000 * p.min(8) as u64
            };
            // Set-up outside the measured window: GET reads existing keys, RPOP pops
            // existing elements.
            match cmd.as_str() {
                "get" => {
                    let cmds: Vec<Vec<u8>> = (0..o.keyspace)
                        .map(|n| {
                            let mut b = Vec::new();
                            resp::encode(&mut b, &[b"SET", &ops_key("set", n), &value]);
                            b
                        })
                        .collect();
                    admin.pipeline(&cmds)?;
                }
                "rpop" => {
                    let per_key = (requests * 3 / 2).div_ceil(o.keyspace.max(1));
                    let mut cmds = Vec::new();
                    for n in 0..o.keyspace {
                        let key = ops_key("rpop", n);
                        let mut left = per_key;
                        while left > 0 {
                            let m = left.min(200);
                            let mut args: Vec<&[u8]> = vec![b"LPUSH", &key];
                            for _ in 0..m {
                                args.push(&value);
                            }
                            let mut b = Vec::new();
                            resp::encode(&mut b, &args);
                            cmds.push(b);
                            left -= m;
                        }
                        if cmds.len() >= 2000 {
                            admin.pipeline(&cmds)?;
                            cmds.clear();
                        }
                    }
                    admin.pipeline(&cmds)?;
                }
                "set" | "lpush" | "push" | "rq-enqueue" | "celery-ack" => {}
                "evalsha" => {
                    // Loaded outside the measured window; a server without it would
                    // answer NOSCRIPT and fail the run.
                    admin.cmd(&[b"SCRIPT", b"LOAD", OPS_SCRIPT])?;
                }
                other => {
                    return Err(io::Error::other(format!(
                        "ops: unknown command {other} (set, get, lpush, rpop, evalsha, push, \
                         rq-enqueue, celery-ack)"
                    )))
                }
            }
            let r = ops_case(t, o, &cmd, p, requests, &value, &mut admin)?;
            each(&r);
            out.push(r);
            if crate::signal::stopping() {
                break;
            }
        }
    }
    admin.del_keys(&all_keys)?;
    Ok(out)
}

fn ops_case(
    t: &Target,
    o: &OpsOpts,
    cmd: &str,
    p: usize,
    requests: u64,
    value: &[u8],
    admin: &mut Admin,
) -> io::Result<RunResult> {
    let conns = o.connections.max(1);
    let sha = sha1_hex(OPS_SCRIPT);
    let sha = sha.as_bytes();
    // A push is one unit of four commands (MULTI, SADD, LPUSH, EXEC), and so on.
    let replies_per_unit = match cmd {
        "push" => 4,
        "rq-enqueue" => 6,
        "celery-ack" => 8,
        _ => 1,
    };
    let batches_per_conn = requests.div_ceil((conns * p) as u64);
    let total = batches_per_conn * (conns * p) as u64;
    let ctl = Arc::new(Ctl::new(t, total));
    let stats0 = admin.commandstats()?;
    let threads = t.client_threads.max(1);
    let _bar = progress(&format!("{} P={p}", cmd.to_uppercase()), &ctl, t);
    on_threads(threads, |ti| {
        let ctl = ctl.clone();
        async move {
            let mut mine = Vec::new();
            let setup: io::Result<()> = async {
                for j in (ti..conns).step_by(threads) {
                    let c = Conn::connect(t.addr).await?;
                    // A ring of pre-encoded commands on random keys, a multiple of p long.
                    let mut rng = Rng::new(j as u64 * 7919 + 17);
                    let n = p * RING.div_ceil(p);
                    let mut ring = Vec::with_capacity(n * 40);
                    let mut offs = Vec::with_capacity(n + 1);
                    for seq in 0..n {
                        offs.push(ring.len());
                        let unit = (j * n + seq) as u64;
                        match cmd {
                            "push" => {
                                let queue = rng.below(o.push_queues.max(1));
                                encode_push(&mut ring, o.queue_set.as_bytes(), queue, unit);
                                continue;
                            }
                            "rq-enqueue" => {
                                let queue = rng.below(o.push_queues.max(1));
                                encode_rq_enqueue(&mut ring, queue, (j * RING + seq % RING) as u64);
                                continue;
                            }
                            "celery-ack" => {
                                encode_celery_ack(&mut ring, unit);
                                continue;
                            }
                            _ => {}
                        }
                        let key = ops_key(cmd, rng.below(o.keyspace.max(1)));
                        match cmd {
                            "set" => resp::encode(&mut ring, &[b"SET", &key, value]),
                            "get" => resp::encode(&mut ring, &[b"GET", &key]),
                            "lpush" => resp::encode(&mut ring, &[b"LPUSH", &key, value]),
                            "evalsha" => {
                                resp::encode(&mut ring, &[b"EVALSHA", sha, b"1", &key, value])
                            }
                            _ => resp::encode(&mut ring, &[b"RPOP", &key]),
                        }
                    }
                    offs.push(ring.len());
                    mine.push((c, ring, offs));
                }
                Ok(())
            }
            .await;
            if let Err(e) = setup {
                ctl.fail(e);
            }
            ctl.sync_start(|| {});
            let mut handles = Vec::new();
            for (mut c, ring, offs) in mine {
                let ctl = ctl.clone();
                handles.push(tokio::task::spawn_local(async move {
                    let slots = offs.len() - 1;
                    let mut at = 0usize;
                    for _ in 0..batches_per_conn {
                        if ctl.should_stop() {
                            break;
                        }
                        c.send(&ring[offs[at]..offs[at + p]]).await?;
                        c.expect(p * replies_per_unit).await?;
                        ctl.add(p as u64);
                        at += p;
                        if at >= slots {
                            at = 0;
                        }
                    }
                    Ok(())
                }));
            }
            supervise(&ctl, handles).await;
            Ok(())
        }
    })?;
    let mut r = RunResult::new(
        "ops",
        format!("ops {} P={p}", cmd.to_uppercase()),
        "request",
    );
    r.params = vec![
        ("command".into(), cmd.to_uppercase().into()),
        ("pipeline".into(), p.into()),
        ("connections".into(), conns.into()),
        ("requests".into(), total.into()),
        ("keyspace".into(), o.keyspace.into()),
        ("data_size".into(), o.data_size.into()),
        ("queue_set".into(), o.queue_set.clone().into()),
        ("push_queues".into(), o.push_queues.into()),
        ("client_threads".into(), threads.into()),
    ];
    finish(r, t, &ctl, admin, &stats0)
}

/// Units in each connection's ring of pre-encoded requests (rounded up to a multiple of
/// the pipeline depth).
const RING: usize = 1024;

fn sha1_hex(data: &[u8]) -> String {
    sha1_smol::Sha1::from(data).digest().to_string()
}

// ---------------------------------------------------------------------------------------
// latency
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct LatencyOpts {
    pub rate: u64,
    pub seconds: f64,
    pub consumers: usize,
    pub queue: String,
    pub timeout: f64,
}

fn base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    base().elapsed().as_nanos() as u64
}

/// The `"enqueued_ns":N` stamp inside a job.
fn stamp(job: &[u8]) -> Option<u64> {
    const TAG: &[u8] = b"\"enqueued_ns\":";
    let at = job.windows(TAG.len()).position(|w| w == TAG)? + TAG.len();
    let mut n = 0u64;
    let mut any = false;
    for &d in &job[at..] {
        if !d.is_ascii_digit() {
            break;
        }
        n = n * 10 + (d - b'0') as u64;
        any = true;
    }
    any.then_some(n)
}

pub fn latency(t: &Target, o: &LatencyOpts) -> io::Result<RunResult> {
    base();
    let total = ((o.rate as f64) * o.seconds).round().max(1.0) as u64;
    let mut admin = Admin::connect(t.addr)?;
    admin.del_keys(&[o.queue.as_bytes().to_vec()])?;
    let ctl = Arc::new(Ctl::new(t, total));
    let stats0 = admin.commandstats()?;
    let threads = t.client_threads.max(1);
    let samples: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let _bar = progress("latency", &ctl, t);
    let timeout = format!("{}", o.timeout);
    on_threads(threads, |ti| {
        let ctl = ctl.clone();
        let samples = samples.clone();
        let timeout = timeout.clone();
        async move {
            let mut cmd = Vec::new();
            resp::encode(
                &mut cmd,
                &[b"BRPOP", o.queue.as_bytes(), timeout.as_bytes()],
            );
            let cmd = Rc::new(cmd);
            let mut consumers = Vec::new();
            let mut producer = None;
            let setup: io::Result<()> = async {
                for _ in (ti..o.consumers).step_by(threads) {
                    let mut c = Conn::connect(t.addr).await?;
                    c.send(&cmd).await?;
                    consumers.push(c);
                }
                // The producer runs on the last client thread.
                if ti == threads - 1 {
                    producer = Some(Conn::connect(t.addr).await?);
                }
                Ok(())
            }
            .await;
            if let Err(e) = setup {
                ctl.fail(e);
            }
            ctl.sync_start(|| {
                if let Ok(mut a) = Admin::connect(t.addr) {
                    let _ = wait_blocked(&mut a, o.consumers as u64, Duration::from_secs(10));
                }
            });
            let mut handles = Vec::new();
            for mut c in consumers {
                let ctl = ctl.clone();
                let cmd = cmd.clone();
                let samples = samples.clone();
                handles.push(tokio::task::spawn_local(async move {
                    let mut first = true;
                    let res: io::Result<()> = async {
                        loop {
                            if !first {
                                if ctl.should_stop() {
                                    break;
                                }
                                c.send(&cmd).await?;
                            }
                            first = false;
                            let mut got = None;
                            c.read_replies(1, |r| {
                                got = resp::array_bulk(r, 1).and_then(stamp);
                                false
                            })
                            .await?;
                            if let Some(ts) = got {
                                // Recorded at once: the task may be aborted at the end.
                                samples.lock().unwrap().push(now_ns().saturating_sub(ts));
                                ctl.add(1);
                            }
                        }
                        Ok(())
                    }
                    .await;
                    res
                }));
            }
            if let Some(mut c) = producer {
                let ctl = ctl.clone();
                let queue = o.queue.clone();
                let rate = o.rate as f64;
                handles.push(tokio::task::spawn_local(async move {
                    let t0 = Instant::now();
                    let mut sent = 0u64;
                    let mut buf = Vec::new();
                    let mut job = Vec::new();
                    while sent < total && !ctl.should_stop() {
                        let due = ((t0.elapsed().as_secs_f64() * rate) as u64 + 1).min(total);
                        if due > sent {
                            buf.clear();
                            let ts = now_ns();
                            for i in sent..due {
                                job.clear();
                                job.extend_from_slice(b"{\"class\":\"LatencyJob\",\"jid\":\"");
                                job.extend_from_slice(format!("{:024x}", splitmix(i)).as_bytes());
                                job.extend_from_slice(b"\",\"enqueued_ns\":");
                                resp::push_uint(&mut job, ts);
                                job.extend_from_slice(b",\"args\":[\"");
                                let pad = JOB_BYTES.saturating_sub(job.len() + 3);
                                job.extend(std::iter::repeat_n(b'x', pad));
                                job.extend_from_slice(b"\"]}");
                                resp::encode(&mut buf, &[b"LPUSH", queue.as_bytes(), &job]);
                            }
                            c.send(&buf).await?;
                            c.expect((due - sent) as usize).await?;
                            sent = due;
                        }
                        let next = t0 + Duration::from_secs_f64(sent as f64 / rate);
                        tokio::time::sleep_until(next.into()).await;
                    }
                    Ok(())
                }));
            }
            supervise(&ctl, handles).await;
            Ok(())
        }
    })?;
    let mut r = RunResult::new("latency", format!("latency rate={}", o.rate), "job");
    r.params = vec![
        ("rate".into(), o.rate.into()),
        ("seconds".into(), o.seconds.into()),
        ("consumers".into(), o.consumers.into()),
        ("queue".into(), o.queue.as_str().into()),
        ("client_threads".into(), threads.into()),
    ];
    let mut r = finish(r, t, &ctl, &mut admin, &stats0)?;
    r.latency = Latency::from_ns(std::mem::take(&mut *samples.lock().unwrap()));
    admin.del_keys(&[o.queue.as_bytes().to_vec()])?;
    Ok(r)
}

// ---------------------------------------------------------------------------------------
// memory
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct MemoryOpts {
    pub jobs: u64,
    pub queue: String,
    pub keep: bool,
}

pub fn memory(t: &Target, o: &MemoryOpts) -> io::Result<RunResult> {
    let mut admin = Admin::connect(t.addr)?;
    let q = o.queue.as_bytes().to_vec();
    admin.del_keys(std::slice::from_ref(&q))?;
    // Kite refreshes used_memory every 100 ms.
    std::thread::sleep(Duration::from_millis(300));
    let mem0 = admin.info("memory")?;
    let rss0 = t.pid.and_then(crate::procfs::rss_bytes);
    let stats0 = admin.commandstats()?;
    let a = Mark::now(t.pid);
    let ctl = Arc::new(Ctl::new(t, o.jobs));
    let bar = progress("memory fill", &ctl, t);
    // Fill in slices so the progress bar moves.
    let mut done = 0;
    while done < o.jobs && !crate::signal::stopping() {
        let n = (o.jobs - done).min(100_000);
        fill_queue(&mut admin, &o.queue, 0, done, n)?;
        done += n;
        ctl.count.store(done, Ordering::Relaxed);
    }
    let b = Mark::now(t.pid);
    ctl.stop();
    drop(bar);
    std::thread::sleep(Duration::from_millis(300));
    let mem1 = admin.info("memory")?;
    let rss1 = t.pid.and_then(crate::procfs::rss_bytes);
    let len = resp::integer(&admin.cmd(&[b"LLEN", &q])?).unwrap_or(-1);
    let get = |m: &std::collections::BTreeMap<String, String>, k: &str| -> Option<f64> {
        m.get(k).and_then(|v| v.parse::<f64>().ok())
    };
    let per = |x0: Option<f64>, x1: Option<f64>| match (x0, x1) {
        (Some(x0), Some(x1)) if done > 0 => Some((x1 - x0) / done as f64),
        _ => None,
    };
    let mut r = RunResult::new("memory", format!("memory {}k jobs", o.jobs / 1000), "job");
    r.set_window(&a, &b);
    r.ops = done;
    r.complete = done == o.jobs && len == done as i64;
    r.server = t.addr.to_string();
    r.server_pid = t.pid;
    r.params = vec![
        ("jobs".into(), o.jobs.into()),
        ("job_bytes".into(), JOB_BYTES.into()),
        ("queue".into(), o.queue.as_str().into()),
    ];
    let um0 = get(&mem0, "used_memory");
    let um1 = get(&mem1, "used_memory");
    r.extra = vec![
        ("llen".into(), Json::Int(len)),
        ("used_memory_before".into(), um0.into()),
        ("used_memory_after".into(), um1.into()),
        ("used_memory_per_job".into(), per(um0, um1).into()),
        (
            "used_memory_rss_per_job".into(),
            per(get(&mem0, "used_memory_rss"), get(&mem1, "used_memory_rss")).into(),
        ),
        ("rss_before".into(), rss0.map(|x| x as f64).into()),
        ("rss_after".into(), rss1.map(|x| x as f64).into()),
        (
            "rss_per_job".into(),
            per(rss0.map(|x| x as f64), rss1.map(|x| x as f64)).into(),
        ),
    ];
    if let Ok(stats1) = admin.commandstats() {
        r.commandstats = commandstats_delta(&stats0, &stats1);
    }
    if !o.keep {
        admin.del_keys(&[q])?;
    }
    Ok(r)
}

/// Pushes `n` Sidekiq-shaped jobs (numbered from `from`) onto `queue` with LPUSH, 100 per
/// command, pipelined.
fn fill_queue(admin: &mut Admin, queue: &str, q: u64, from: u64, n: u64) -> io::Result<()> {
    let per_cmd = 100u64;
    let mut seq = from;
    let end = from + n;
    while seq < end {
        let mut cmds = Vec::new();
        while seq < end && cmds.len() < 1000 {
            let m = per_cmd.min(end - seq);
            let mut vals: Vec<Vec<u8>> = Vec::with_capacity(m as usize);
            for _ in 0..m {
                let mut j = Vec::with_capacity(JOB_BYTES + 8);
                sidekiq_job(&mut j, queue, q, seq);
                vals.push(j);
                seq += 1;
            }
            let mut args: Vec<&[u8]> = vec![b"LPUSH", queue.as_bytes()];
            args.extend(vals.iter().map(|v| v.as_slice()));
            let mut b = Vec::new();
            resp::encode(&mut b, &args);
            cmds.push(b);
        }
        admin.pipeline(&cmds)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_sidekiq_shaped_and_unique() {
        let mut seen = std::collections::HashSet::new();
        for seq in 0..1000 {
            let mut j = Vec::new();
            sidekiq_job(&mut j, "queue:bench0", 0, seq);
            assert!(
                j.len() >= JOB_BYTES && j.len() <= JOB_BYTES + 4,
                "{}",
                j.len()
            );
            let s = String::from_utf8(j).unwrap();
            let jid = s.split("\"jid\":\"").nth(1).unwrap()[..24].to_string();
            assert!(jid.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(seen.insert(jid));
        }
    }

    #[test]
    fn stamps_round_trip() {
        assert_eq!(stamp(b"{\"enqueued_ns\":12345,\"x\":1}"), Some(12345));
        assert_eq!(stamp(b"{}"), None);
    }
}
