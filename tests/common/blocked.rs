//! Helpers for tests of blocked clients: waiting until a given number (or given names)
//! are blocked, reading a reply that must come, and drawing key orders.

use std::thread;
use std::time::{Duration, Instant};

use super::{info_field, Client, Resp, Rng};

/// How long a client waits for a reply that must come (far longer than any timeout a
/// test gives a blocking command, except "for ever" ones, which the test always wakes).
pub const REPLY_WAIT: Duration = Duration::from_secs(15);
/// How long the server may take to show a client as blocked.
pub const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// A field of `INFO clients`, as a number.
pub fn info_int(c: &mut Client, field: &str) -> i64 {
    info_field(c, "clients", field).parse().unwrap()
}

/// Waits until INFO says exactly `n` clients are blocked.
#[track_caller]
pub fn wait_blocked(c: &mut Client, n: i64, what: &str) {
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        let now = info_int(c, "blocked_clients");
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: expected {n} blocked clients, INFO clients says {now}"
        );
        thread::sleep(Duration::from_millis(2));
    }
}

/// The names of the clients CLIENT LIST shows blocked, sorted.
pub fn blocked_names(c: &mut Client) -> Vec<String> {
    let r = c.cmd(&["CLIENT", "LIST"]);
    let text = r
        .as_string()
        .unwrap_or_else(|| panic!("CLIENT LIST answered {r}"));
    let mut names = Vec::new();
    for line in text.lines() {
        let field = |name: &str| {
            line.split(' ')
                .find_map(|f| f.strip_prefix(&format!("{name}=")))
                .unwrap_or("")
                .to_string()
        };
        if field("flags").contains('b') {
            names.push(field("name"));
        }
    }
    names.sort();
    names
}

pub fn client_id(c: &mut Client) -> String {
    let r = c.cmd(&["CLIENT", "ID"]);
    r.as_int()
        .unwrap_or_else(|| panic!("CLIENT ID answered {r}"))
        .to_string()
}

/// A reply that must come, within `REPLY_WAIT`.
#[track_caller]
pub fn read_reply(c: &mut Client, what: &str) -> Resp {
    c.set_timeout(Some(REPLY_WAIT));
    c.try_read()
        .unwrap_or_else(|e| panic!("{what}: no reply within {REPLY_WAIT:?}: {e}"))
}

pub fn shuffled(rng: &mut Rng, keys: &[String]) -> Vec<String> {
    let mut v = keys.to_vec();
    rng.shuffle(&mut v);
    v
}

/// `count` distinct numbers below `n`, in random order.
pub fn distinct(rng: &mut Rng, n: usize, count: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut idx);
    idx.truncate(count);
    idx
}
