//! The listening sockets: one thread per listener accepts and deals each connection to
//! the worker threads in turn (`conn` takes it from there). Never reads from a connection.

use std::sync::Arc;
use std::time::Duration;

use crate::shard::Shared;

/// Starts a thread per listener: client ports (`tls` marks `tls-port`) and `http-port`s.
pub fn start(
    shared: &Arc<Shared>,
    listeners: Vec<(std::net::TcpListener, bool)>,
    http_listeners: Vec<std::net::TcpListener>,
) -> std::io::Result<()> {
    for (l, tls) in listeners {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("kite-accept".into())
            .spawn(move || accept_loop(shared, l, tls))?;
    }
    for l in http_listeners {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("kite-accept-http".into())
            .spawn(move || accept_http_loop(shared, l))?;
    }
    Ok(())
}

/// Accepts connections on a thread of its own and hands them to the shard threads in
/// turn, through each one's inbox: a thread busy in a script still answers its new
/// connections from its Lua hook (`scripting::busy`), while one whose mailbox is served
/// takes them at once.
fn accept_loop(shared: Arc<Shared>, listener: std::net::TcpListener, tls: bool) {
    accept_each(&shared, &listener, "", |target, stream| {
        shared.inbox[target]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((stream, tls));
        shared.send(target, Box::new(super::conn::take_inbox));
    });
}

/// Accepts connections for ever, dealing them to the threads in turn.
fn accept_each(
    shared: &Shared,
    listener: &std::net::TcpListener,
    what: &str,
    mut deal: impl FnMut(usize, std::net::TcpStream),
) {
    let n = shared.nshards();
    let mut next = 0usize;
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors and similar: wait a little rather than spin.
                tracing::warn!("accept failed{what}: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        deal(next % n, stream);
        next = next.wrapping_add(1);
    }
}

/// Accepts on `http-port` and deals the connections to the threads in turn.
fn accept_http_loop(shared: Arc<Shared>, listener: std::net::TcpListener) {
    accept_each(&shared, &listener, " on http-port", |target, stream| {
        shared.send(target, Box::new(move |w| super::http::accept(w, stream)));
    });
}
