//! The slow log and latency events of one thread; SLOWLOG and LATENCY merge all threads.

use std::collections::VecDeque;

use bytes::Bytes;
use hashbrown::HashMap;

#[derive(Clone)]
pub struct SlowEntry {
    pub id: u64,
    pub unix_secs: u64,
    pub usec: u64,
    pub args: Vec<Vec<u8>>,
    pub addr: String,
    pub name: Vec<u8>,
}

/// Redis keeps at most this many arguments of a slow command, each cut to 128 bytes.
const SLOWLOG_MAX_ARGS: usize = 32;
const SLOWLOG_MAX_ARG_LEN: usize = 128;

impl SlowEntry {
    pub fn new(
        id: u64,
        unix_secs: u64,
        usec: u64,
        argv: &[Bytes],
        addr: String,
        name: Vec<u8>,
    ) -> SlowEntry {
        let mut args = Vec::new();
        for (i, a) in argv.iter().enumerate() {
            if i == SLOWLOG_MAX_ARGS - 1 && argv.len() > SLOWLOG_MAX_ARGS {
                args.push(
                    format!("... ({} more arguments)", argv.len() - SLOWLOG_MAX_ARGS + 1)
                        .into_bytes(),
                );
                break;
            }
            if a.len() > SLOWLOG_MAX_ARG_LEN {
                let mut v = a[..SLOWLOG_MAX_ARG_LEN].to_vec();
                v.extend_from_slice(
                    format!("... ({} more bytes)", a.len() - SLOWLOG_MAX_ARG_LEN).as_bytes(),
                );
                args.push(v);
            } else {
                args.push(a.to_vec());
            }
        }
        SlowEntry {
            id,
            unix_secs,
            usec,
            args,
            addr,
            name,
        }
    }
}

#[derive(Clone, Default)]
pub struct LatencyEvent {
    pub history: VecDeque<(u64, u64)>,
    pub max_ms: u64,
}

/// Redis keeps 160 samples per latency event.
const LATENCY_HISTORY: usize = 160;

#[derive(Default)]
pub struct Logs {
    pub slow: VecDeque<SlowEntry>,
    pub latency: HashMap<&'static str, LatencyEvent>,
}

impl Logs {
    pub fn add_slow(&mut self, entry: SlowEntry, max_len: usize) {
        self.slow.push_front(entry);
        while self.slow.len() > max_len {
            self.slow.pop_back();
        }
    }

    pub fn add_latency(&mut self, event: &'static str, unix_secs: u64, ms: u64) {
        let e = self.latency.entry(event).or_default();
        // One sample per second per event, keeping the worst.
        match e.history.back_mut() {
            Some(last) if last.0 == unix_secs => last.1 = last.1.max(ms),
            _ => e.history.push_back((unix_secs, ms)),
        }
        while e.history.len() > LATENCY_HISTORY {
            e.history.pop_front();
        }
        e.max_ms = e.max_ms.max(ms);
    }
}
