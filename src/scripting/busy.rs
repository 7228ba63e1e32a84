//! Serving a thread's clients while its script runs past `busy-reply-threshold`.
//!
//! The thread is inside Lua, so its event loop is stopped. Redis answers from inside the
//! Lua hook; so does Kite, on its own terms: the hook (every few milliseconds) reads,
//! through `net::stream_io`'s calls that do not wait, the sockets of this thread's
//! connections that were idle waiting for a request, and of new connections handed to
//! this thread, parses what arrived and answers at once: SCRIPT
//! KILL, FUNCTION KILL and SHUTDOWN NOSAVE act, everything else gets -BUSY. Nothing here
//! touches shard data or runs a command. Bytes of an unfinished request, and output the
//! socket could not take, wait on the connection for its own task to pick up once the
//! script ends (`net::conn::absorb_hook_io`).

use std::cell::{Cell, RefCell};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use crate::net::stream_io;
use crate::protocol::parse::{ParseLimits, RequestParser};
use crate::shard::{BatchResult, Mail, Worker};

/// How often the hook looks at the sockets while the script is busy.
const SERVE_EVERY: Duration = Duration::from_millis(5);
/// Input kept per connection while busy: a client streaming more gets closed.
const MAX_HELD_INPUT: usize = 1 << 20;

/// A connection accepted while this thread was busy, registered once the script ends.
struct Held {
    stream: std::net::TcpStream,
    /// Came on the TLS port: its bytes are encrypted, so the hook leaves it alone.
    tls: bool,
    input: BytesMut,
    output: Vec<u8>,
    closed: bool,
}

thread_local! {
    static LAST_SERVED: Cell<Option<Instant>> = const { Cell::new(None) };
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

/// Called by the Lua hook while this thread's script is past the threshold.
pub fn serve(worker: &Rc<Worker>) {
    let now = Instant::now();
    if LAST_SERVED.with(|l| l.get().is_some_and(|t| now.duration_since(t) < SERVE_EVERY)) {
        return;
    }
    LAST_SERVED.with(|l| l.set(Some(now)));
    // Replies made before the script started go before any -BUSY; bytes the loop's
    // receives took since the last look are handed to their sockets.
    crate::net::uring::look();
    let shared = &worker.shared;
    let arrived = std::mem::take(
        &mut *shared.inbox[worker.id]
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        for (stream, tls) in arrived {
            let _ = stream.set_nonblocking(true);
            held.push(Held {
                stream,
                tls,
                input: BytesMut::new(),
                output: Vec::new(),
                closed: false,
            });
        }
        for h in held.iter_mut().filter(|h| !h.closed && !h.tls) {
            let fd = h.stream.as_raw_fd();
            if !stream_io::recv_now(fd, &mut h.input, MAX_HELD_INPUT) {
                h.closed = true;
                continue;
            }
            let mut out = std::mem::take(&mut h.output);
            answer(worker, &mut h.input, &mut out);
            h.output = stream_io::send_now(fd, out);
        }
    });
    answer_mailbox(worker);
    // The loop's pass does not end while the script runs: what it held for other
    // threads (the BUSY answers above among it) leaves now.
    crate::shard::mailbox::flush_outbox();
    let Ok(clients) = worker.clients.try_borrow() else {
        return;
    };
    for handle in clients.map.values() {
        if !handle.idle_read.get() || handle.killed.get() {
            continue;
        }
        let fd = handle.info.borrow().fd;
        // Replies the socket did not take yet come first: this one waits for its task.
        if crate::net::uring::owes_output(fd) {
            continue;
        }
        let mut input = handle.hook_in.borrow_mut();
        let before = input.len();
        // What the loop read from this socket comes before what is still in it, and a
        // socket the loop's receive is armed on is read only by that receive.
        let alive = match crate::net::event_loop::take_read_ahead(fd, &mut input) {
            None => false,
            Some(true) => stream_io::recv_now(fd, &mut input, MAX_HELD_INPUT),
            // The loop's receive brings its bytes while the script runs: the same limit.
            Some(false) => input.len() <= MAX_HELD_INPUT,
        };
        if !alive {
            drop(input);
            handle.kill();
            continue;
        }
        if input.len() == before {
            continue;
        }
        // A new connection's first line may be an HTTP request: the connection loop
        // answers it once the script is over.
        if !handle.resp_confirmed.get()
            && crate::net::http::sniff(&input, 0) != crate::net::http::Sniff::Resp
        {
            handle.hook_touched.set(true);
            handle.wake.notify_one();
            continue;
        }
        let mut out = std::mem::take(&mut *handle.hook_out.borrow_mut());
        let pending_before = !out.is_empty();
        let mut replies = Vec::new();
        let attack = answer(worker, &mut input, &mut replies);
        drop(input);
        if attack {
            // POST or Host: (cross-protocol scripting): closed at once, unanswered, as
            // the connection loop would; the loop lets go of it after the script.
            stream_io::shut_now(fd);
            handle.kill();
            continue;
        }
        // Output already waiting goes first, so nothing is sent out of order.
        if pending_before {
            out.extend_from_slice(&replies);
        } else {
            out = stream_io::send_now(fd, replies);
        }
        *handle.hook_out.borrow_mut() = out;
        handle.hook_touched.set(true);
        handle.wake.notify_one();
    }
}

/// Pipelined commands sent here by other threads' connections get BUSY at once, as they
/// would had they arrived a moment later, whether they came before the script started
/// (taken with it from the mailbox, not run yet) or since; everything else (transaction
/// steps, broadcasts, EXEC on this shard) waits for the script, in order.
fn answer_mailbox(worker: &Rc<Worker>) {
    let Ok(mut deferred) = worker.deferred.try_borrow_mut() else {
        return;
    };
    // What the loop took before the script started and has not run yet comes first, then
    // what arrived since: batches among either are answered, the rest keeps its order.
    let mut arrived = std::mem::take(&mut *deferred);
    worker.mailbox.take_into(&mut arrived);
    let text = crate::commands::scripting::busy_text(&worker.shared);
    for mail in arrived {
        match mail {
            // A part of a two-shard unit runs whole or not at all: it goes back unrun, and
            // its connection then sends its commands one run at a time, to get BUSY.
            Mail::Batch(b) if b.whole => crate::shard::refuse(worker, b),
            Mail::Batch(mut b) if b.atomic.is_none() => {
                for _ in b.ran..b.cmds.len() {
                    b.out.error(text);
                }
                let result = BatchResult::new(b.out, b.cmds, b.slow);
                worker.shared.answer_batch(b.from, b.done, result);
            }
            other => deferred.push_back(other),
        }
    }
}

/// Once the script has ended: the connections met while busy become ordinary ones.
pub fn release(worker: &Rc<Worker>) {
    if !worker.deferred.borrow().is_empty() {
        // The thread's loop may be parked on an empty mailbox: this wakes it to run
        // what the hook set aside.
        worker.shared.send(worker.id, Box::new(|_| {}));
    }
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    LAST_SERVED.with(|l| l.set(None));
    for h in held {
        if h.closed {
            continue;
        }
        crate::net::conn::accept_with(worker, h.stream, h.tls, h.input, h.output);
    }
}

/// Answers every whole request in `input`, leaving an unfinished one there.
/// Answers the whole requests in `input`; true when one was `POST` or `Host:` (the
/// connection must close, unanswered).
fn answer(worker: &Rc<Worker>, input: &mut BytesMut, out: &mut Vec<u8>) -> bool {
    let mut parser = RequestParser::default();
    let limits = ParseLimits::default();
    let mut work = input.clone();
    let total = work.len();
    let mut consumed = 0;
    loop {
        match parser.next_command(&mut work, &limits) {
            Ok(Some(args))
                if args.first().is_some_and(|n| {
                    n.eq_ignore_ascii_case(b"post") || n.eq_ignore_ascii_case(b"host:")
                }) =>
            {
                return true;
            }
            Ok(Some(args)) => {
                consumed = total - work.len();
                out.extend_from_slice(&reply_to(worker, &args));
            }
            Ok(None) => break,
            Err(e) => {
                // A broken request: answer as the connection will, and drop the bytes.
                out.extend_from_slice(format!("-{}\r\n", e.0).as_bytes());
                consumed = total;
                break;
            }
        }
    }
    let _ = input.split_to(consumed);
    false
}

fn reply_to(worker: &Rc<Worker>, args: &[bytes::Bytes]) -> Vec<u8> {
    let is = |i: usize, word: &str| {
        args.get(i)
            .is_some_and(|a| a.eq_ignore_ascii_case(word.as_bytes()))
    };
    if args.len() == 2 && (is(0, "script") || is(0, "function")) && is(1, "kill") {
        return match crate::commands::scripting::kill_busy(&worker.shared, is(0, "script")) {
            Ok(()) => b"+OK\r\n".to_vec(),
            Err(e) => format!("-{e}\r\n").into_bytes(),
        };
    }
    if args.len() == 2 && is(0, "shutdown") && is(1, "nosave") {
        shutdown_now(worker);
    }
    format!(
        "-{}\r\n",
        crate::commands::scripting::busy_text(&worker.shared)
    )
    .into_bytes()
}

/// SHUTDOWN NOSAVE from inside the hook: the AOF's written part reaches the disk (the
/// busy script's own effects are still held back, as Redis never logged them either),
/// then the process exits.
fn shutdown_now(worker: &Rc<Worker>) -> ! {
    tracing::warn!("User requested shutdown while a script was busy...");
    let shared = &worker.shared;
    shared
        .shutting_down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    if shared.persist.aof.file_on() {
        let (done, mut wait) = tokio::sync::oneshot::channel();
        shared
            .persist
            .aof
            .send(crate::persist::aof::writer::ToWriter::Sync { done });
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match wait.try_recv() {
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                _ => break,
            }
        }
    }
    tracing::warn!("Kite is now ready to exit, bye bye...");
    std::process::exit(0);
}
