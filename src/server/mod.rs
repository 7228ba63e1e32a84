//! The server's threads: start-up, each worker thread's mailbox and housekeeping
//! (expiry, idle and evicted clients, signals), the accepting threads; a session's state
//! (`session`) and the running of its commands (`dispatch`). Connections' sockets are
//! `net`'s.

pub mod dispatch;
pub mod session;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::commands;
use crate::shard::mailbox::Mailbox;
use crate::shard::{run_batch, unix_ms, Mail, Shard, Shared, Worker};

/// Starts one worker thread per shard and serves `listeners` until the process exits.
pub fn run(
    shared: Arc<Shared>,
    listeners: Vec<(std::net::TcpListener, bool)>,
    http_listeners: Vec<std::net::TcpListener>,
) -> std::io::Result<()> {
    let n = shared.nshards();
    let mailboxes: Vec<Arc<Mailbox>> = (0..n).map(|_| Arc::default()).collect();
    if shared.mailboxes.set(mailboxes.clone()).is_err() {
        unreachable!("mailboxes are set once");
    }
    crate::persist::aof::writer::start(shared.clone())?;
    // The dataset on disk is read while clients already connect (they get -LOADING).
    crate::persist::load::load_at_startup(shared.clone());
    // Cluster mode: the bus listens from the start (docs/cluster.md).
    crate::cluster::bus::start(shared.clone()).map_err(std::io::Error::other)?;
    // The `replicaof` line: follow that master from the start (the link waits for the
    // threads' mailboxes, set above).
    let replicaof = shared
        .config
        .lock()
        .expect("config lock")
        .get("replicaof")
        .to_string();
    if let Some((host, port)) = replicaof.trim().split_once(' ') {
        match port.trim().parse::<u16>() {
            Ok(port) => {
                let host = host.to_string();
                shared.send(
                    0,
                    Box::new(move |w| {
                        let shared = w.shared.clone();
                        crate::net::event_loop::spawn_local(async move {
                            crate::repl::replica::follow(&shared, host, port).await
                        });
                    }),
                );
            }
            Err(_) => tracing::warn!("Ignoring the replicaof line '{replicaof}': bad port"),
        }
    }
    let mut handles = Vec::with_capacity(n);
    for (id, mailbox) in mailboxes.into_iter().enumerate() {
        let shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("kite-shard-{id}"))
            .spawn(move || worker_main(id, shared, mailbox))?;
        handles.push(handle);
    }
    crate::net::listen::start(&shared, listeners, http_listeners)?;
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

fn worker_main(id: usize, shared: Arc<Shared>, mailbox: Arc<Mailbox>) {
    crate::shard::set_current_thread(id);
    let wanted = shared.config.lock().expect("config lock").get("event-loop") != "epoll";
    match crate::net::uring::start_thread(wanted) {
        Ok(true) if id == 0 => tracing::info!("Replies are sent through io_uring"),
        Ok(false) if id == 0 => {
            tracing::info!("Replies are written one by one (event-loop epoll)")
        }
        Err(e) => tracing::warn!("Thread {id}: {e}; replies are written one by one"),
        _ => {}
    }
    // tokio stays for what is off the request path (outbound links, signals): its
    // types work here through the `kite-io` thread's runtime, which drives them.
    let _tokio = crate::net::event_loop::tokio_handle().enter();
    let event_loop = crate::net::event_loop::EventLoop::new().expect("the thread's event loop");
    if id == 0 {
        // Read by the test harness (KITE_REQUIRE_IO_URING), so a silent fallback cannot
        // pass for the io_uring loop.
        if crate::net::uring::waits() {
            tracing::info!(
                "Event loop: io_uring (one io_uring_enter per pass sends, receives and waits)"
            );
        } else {
            let (_, _, why) = crate::net::uring::describe();
            tracing::info!(
                "Event loop: epoll ({})",
                if why.is_empty() {
                    "event-loop epoll"
                } else {
                    why.as_str()
                }
            );
        }
    }
    let databases = shared.tunables.databases;
    let worker = Rc::new(Worker {
        id,
        shard: RefCell::new(Shard::new(
            id,
            databases,
            commands::table().len(),
            shared.clone(),
        )),
        shared: shared.clone(),
        clients: RefCell::new(Default::default()),
        mailbox,
        deferred: RefCell::new(Default::default()),
    });
    crate::net::event_loop::spawn_local(housekeeping(worker.clone()));
    if worker.id == 0 {
        crate::net::event_loop::spawn_local(on_signals(worker.clone()));
    }
    {
        let worker = worker.clone();
        crate::net::event_loop::spawn_local(async move { serve_mailbox(&worker).await });
    }
    crate::shard::mailbox::open_outbox(id, shared.mailboxes.get().expect("mailboxes set"));
    let parking = shared;
    let hinted = worker.clone();
    let panicked = worker.clone();
    event_loop.run(crate::net::event_loop::Parking {
        fresh_requests: Box::new(move |requests| {
            crate::server::dispatch::prefetch_first_keys(&hinted, requests)
        }),
        end_of_run: Box::new(crate::shard::mailbox::flush_outbox),
        before: Box::new(move || {
            // With one thread there is no answer from another thread to wait for.
            let yields = if parking.nshards() > 1 {
                parking.tunables.park_yields.load(Ordering::Relaxed)
            } else {
                0
            };
            crate::shard::mailbox::before_park(yields)
        }),
        after: Box::new(crate::shard::mailbox::after_unpark),
        after_panic: Box::new(move || panicked.shard.borrow_mut().recover_from_panic()),
    })
}

/// Mail run between yields, so connections on this thread are not starved by a flood of
/// it (tokio's channel gave the same guarantee through its budget).
const MAIL_PER_TURN: usize = 128;

/// Runs this thread's mail for ever: everything taken earlier first, then what arrived.
async fn serve_mailbox(worker: &Rc<Worker>) {
    loop {
        let mut ran = 0;
        loop {
            let next = {
                let mut deferred = worker.deferred.borrow_mut();
                if deferred.is_empty() && worker.mailbox.take_into(&mut deferred) > 1 {
                    crate::shard::prefetch_batches(worker, deferred.iter().take(MAIL_PER_TURN));
                }
                deferred.pop_front()
            };
            let Some(mail) = next else { break };
            // Mail that panics (a bug in a command) is dropped alone, and what it left
            // half-changed put back: unwinding through this task would end it, and with
            // it every later hop to this shard.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match mail {
                Mail::Run(f) => f(worker),
                Mail::Batch(b) => run_batch(worker, b),
                Mail::Done(slot, result) => crate::shard::hops::deliver(slot, result),
            }));
            if outcome.is_err() {
                tracing::error!(
                    "Work sent to this thread panicked and was dropped; the connection that sent it is closed"
                );
                worker.shard.borrow_mut().recover_from_panic();
            }
            ran += 1;
            if ran == MAIL_PER_TURN {
                crate::shard::mailbox::flush_outbox();
                tokio::task::yield_now().await;
                ran = 0;
            }
        }
        // The results of the batches just run leave now, each thread's as one push,
        // rather than after the rest of the pass's tasks (a long command among them would
        // hold them).
        crate::shard::mailbox::flush_outbox();
        std::future::poll_fn(|cx| {
            if worker.mailbox.has_mail() || !worker.deferred.borrow().is_empty() {
                return std::task::Poll::Ready(());
            }
            crate::shard::mailbox::waiting(&worker.mailbox, cx.waker());
            // Mail pushed while the waker was being stored found no waker to call: look
            // once more now that it is in place.
            if worker.mailbox.has_mail() {
                return std::task::Poll::Ready(());
            }
            std::task::Poll::Pending
        })
        .await;
    }
}

/// Periodic work of each thread: active expiry, the ops/sec samples, idle-client timeouts
/// and (on thread 0) the memory figures.
async fn housekeeping(worker: Rc<Worker>) {
    let mut tick = crate::net::event_loop::time::interval(Duration::from_millis(100));
    let mut ticks = 0u64;
    loop {
        tick.tick().await;
        ticks += 1;
        if worker.id == 0 && ticks.is_multiple_of(10) {
            crate::persist::snapshot::cron(&worker).await;
            crate::repl::cron(&worker.shared);
        }
        crate::clock::resync();
        let now = unix_ms();
        // A replica expires nothing itself: its master's DELs do (docs/replication.md).
        // While writes are paused (CLIENT PAUSE, FAILOVER) expiry waits too, as in Redis,
        // so the replication offset holds still.
        let paused = worker.clients.borrow().pause.until_unix_ms > now;
        if worker.shared.active_expire.load(Ordering::Relaxed)
            && !worker.shared.repl.is_replica()
            && !paused
        {
            active_expire(&worker, now);
            crate::shard::after_command(&worker);
        }
        worker.shard.borrow_mut().sample_ops(now);
        observe_queues(&worker, now, ticks.is_multiple_of(10));
        close_idle_clients(&worker);
        evict_clients(&worker);
        if let Some(c) = worker.shared.cluster.as_deref() {
            crate::cluster::redirect::redirect_blocked(c, &worker);
        }
        if worker.id == 0 {
            crate::memory::refresh(&worker.shared);
        }
    }
}

/// Applies the queue-tracking settings, and once a second records each queue's second.
fn observe_queues(worker: &Rc<Worker>, now: u64, each_second: bool) {
    crate::observe::configure(worker);
    let mut guard = worker.shard.borrow_mut();
    let sh = &mut *guard;
    if each_second {
        sh.sample_second(now);
    }
    if each_second && sh.queues.enabled && !sh.queues.is_empty() {
        let (dbs, blocking) = (&sh.dbs, &sh.blocking);
        // An empty queue with consumers blocked on it is alive.
        sh.queues.sample(now, |db, key| {
            crate::observe::report::key_len(dbs, db, key, now)
                .map(|(n, _)| n)
                .or_else(|| blocking.has_live_waiter(db, key).then_some(0))
        });
    }
}

/// SIGTERM and SIGINT shut the server down as SHUTDOWN does: saving first when save
/// points are set. If that save fails the server keeps running, as Redis does.
async fn on_signals(worker: Rc<Worker>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot listen for SIGTERM/SIGINT");
        return;
    };
    loop {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::warn!("Received {which} scheduling shutdown...");
        if let Err(e) = crate::persist::snapshot::shutdown(&worker, None, false).await {
            tracing::warn!("{e}");
        }
    }
}

/// Expires keys for up to a few milliseconds per tick, more while many are found.
fn active_expire(worker: &Rc<Worker>, now: u64) {
    let started = std::time::Instant::now();
    let budget = Duration::from_millis(2);
    // The cycle's DELs reach the AOF together.
    worker.shard.borrow_mut().aof_defer();
    loop {
        let more = worker.shard.borrow_mut().active_expire(now, 16);
        if !more || started.elapsed() > budget {
            break;
        }
    }
    worker.shard.borrow_mut().aof_undefer();
}

/// `maxmemory-clients`: each thread publishes the sum of its connections' buffers and
/// its largest evictable client. Past the limit, a thread closes its largest clients
/// while they are at least as large as every other thread's largest and the excess
/// lasts, so the largest clients go first, as in Redis, without the threads agreeing on
/// anything else. Replication links and CLIENT NO-EVICT clients are spared.
fn evict_clients(worker: &Rc<Worker>) {
    let shared = &worker.shared;
    let clients = worker.clients.borrow();
    let evictable = |h: &crate::shard::clients::ClientHandle| {
        let info = h.info.borrow();
        !info.no_evict && info.kind == crate::shard::clients::KIND_NORMAL && !h.killed.get()
    };
    // One pass for the figures every tick; candidates are sorted only past the limit.
    let (mut mine, mut largest) = (0usize, 0usize);
    for h in clients.map.values() {
        let m = h.memory.get();
        mine += m;
        if m > largest && evictable(h) {
            largest = m;
        }
    }
    let slots = &shared.client_memory[worker.id];
    slots[0].store(mine, Ordering::Relaxed);
    slots[1].store(largest, Ordering::Relaxed);
    let setting = shared.tunables.maxmemory_clients.load(Ordering::Relaxed);
    if setting == 0 {
        return;
    }
    let limit = if shared
        .tunables
        .maxmemory_clients_percent
        .load(Ordering::Relaxed)
    {
        shared.tunables.maxmemory.load(Ordering::Relaxed) * setting / 100
    } else {
        setting
    } as usize;
    let total: usize = shared
        .client_memory
        .iter()
        .map(|m| m[0].load(Ordering::Relaxed))
        .sum();
    if limit == 0 || total <= limit {
        return;
    }
    let others_largest = shared
        .client_memory
        .iter()
        .enumerate()
        .filter(|(t, _)| *t != worker.id)
        .map(|(_, m)| m[1].load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    let mut candidates: Vec<_> = clients
        .map
        .values()
        .filter(|h| evictable(h))
        .cloned()
        .collect();
    candidates.sort_by_key(|h| std::cmp::Reverse(h.memory.get()));
    let mut excess = total - limit;
    for h in candidates {
        let size = h.memory.get();
        if excess == 0 || size == 0 || size < others_largest {
            break;
        }
        excess = excess.saturating_sub(size);
        shared.evicted_clients.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("Evicting client: {}", h.line(unix_ms()));
        h.kill();
    }
}

fn close_idle_clients(worker: &Rc<Worker>) {
    let timeout = worker.shared.tunables.timeout_secs.load(Ordering::Relaxed);
    if timeout == 0 {
        return;
    }
    let limit_ms = timeout * 1000;
    let now = unix_ms();
    let clients = worker.clients.borrow();
    for h in clients.map.values() {
        let info = h.info.borrow();
        // As in Redis: subscribers, blocked clients and replication links stay.
        let exempt = info.multi >= 0
            || info.sub + info.psub + info.ssub > 0
            || h.blocked.get()
            || info.kind != crate::shard::clients::KIND_NORMAL;
        drop(info);
        if !exempt && now.saturating_sub(h.last_active.get()) > limit_ms {
            h.kill();
        }
    }
}
