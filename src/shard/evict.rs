//! maxmemory-policy: which key a shard gives up when memory is past `maxmemory`, the
//! LFU counter arithmetic, and the eviction step a shard runs on its own keys
//! (docs/eviction.md). It decides nothing about when to evict: the command path asks.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use super::{Shard, Worker};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Policy {
    NoEviction,
    AllkeysLru,
    AllkeysLfu,
    AllkeysRandom,
    VolatileLru,
    VolatileLfu,
    VolatileRandom,
    VolatileTtl,
}

impl Policy {
    pub fn parse(s: &str) -> Policy {
        match s {
            "allkeys-lru" => Policy::AllkeysLru,
            "allkeys-lfu" => Policy::AllkeysLfu,
            "allkeys-random" => Policy::AllkeysRandom,
            "volatile-lru" => Policy::VolatileLru,
            "volatile-lfu" => Policy::VolatileLfu,
            "volatile-random" => Policy::VolatileRandom,
            "volatile-ttl" => Policy::VolatileTtl,
            _ => Policy::NoEviction,
        }
    }

    pub fn to_u8(self) -> u8 {
        self as u8
    }

    pub fn from_u8(v: u8) -> Policy {
        [
            Policy::NoEviction,
            Policy::AllkeysLru,
            Policy::AllkeysLfu,
            Policy::AllkeysRandom,
            Policy::VolatileLru,
            Policy::VolatileLfu,
            Policy::VolatileRandom,
            Policy::VolatileTtl,
        ][v as usize % 8]
    }

    pub fn is_lfu(self) -> bool {
        matches!(self, Policy::AllkeysLfu | Policy::VolatileLfu)
    }

    fn volatile(self) -> bool {
        matches!(
            self,
            Policy::VolatileLru
                | Policy::VolatileLfu
                | Policy::VolatileRandom
                | Policy::VolatileTtl
        )
    }
}

// ---------------------------------------------------------------------------------------
// LFU: an 8-bit logarithmic counter and the minute (16 bits) it was last decayed, packed
// into the key's access field as Redis packs them.
// ---------------------------------------------------------------------------------------

const LFU_INIT_VAL: u32 = 5;

fn minutes(now_ms: u64) -> u32 {
    ((now_ms / 60_000) & 0xFFFF) as u32
}

/// The access field of a key just created under an LFU policy.
pub fn lfu_new(now_ms: u64) -> u32 {
    (minutes(now_ms) << 8) | LFU_INIT_VAL
}

/// The counter after the decay due since it was last touched (OBJECT FREQ).
pub fn lfu_decayed(field: u32, now_ms: u64, decay_time: u64) -> u32 {
    let counter = field & 0xFF;
    let ldt = (field >> 8) & 0xFFFF;
    let now = minutes(now_ms);
    let elapsed = if now >= ldt {
        now - ldt
    } else {
        65535 - ldt + now
    };
    let periods = (elapsed as u64).checked_div(decay_time).unwrap_or(0);
    counter.saturating_sub(periods.min(255) as u32)
}

/// An access: decay, then a logarithmic increment (`r` uniform in [0, 1)).
pub fn lfu_touch(field: u32, now_ms: u64, log_factor: u64, decay_time: u64, r: f64) -> u32 {
    let mut counter = lfu_decayed(field, now_ms, decay_time);
    if counter < 255 {
        let base = counter.saturating_sub(LFU_INIT_VAL) as f64;
        let p = 1.0 / (base * log_factor as f64 + 1.0);
        if r < p {
            counter += 1;
        }
    }
    (minutes(now_ms) << 8) | counter
}

// ---------------------------------------------------------------------------------------
// Choosing and deleting victims
// ---------------------------------------------------------------------------------------

/// What one shard freed in one eviction step.
#[derive(Default, Clone, Copy)]
pub struct Freed {
    pub keys: usize,
    pub bytes: usize,
}

impl Shard {
    /// Deletes victims chosen by `policy` until the estimated size of what went covers
    /// `want` bytes (or `max_keys` went, or nothing is left to evict).
    pub fn evict(&mut self, policy: Policy, want: usize, max_keys: usize) -> Freed {
        let mut freed = Freed::default();
        let now = crate::clock::unix_ms();
        while freed.bytes < want && freed.keys < max_keys {
            let Some((db, key)) = self.pick_victim(policy, now) else {
                break;
            };
            let Some(e) = self.dbs[db].table.remove(&key) else {
                break;
            };
            freed.keys += 1;
            freed.bytes += e.key.heap_size() + e.value.heap_size() + 64;
            drop(e);
            self.log_effect(db, &[b"DEL".as_slice(), &key]);
            self.stats.evicted_keys += 1;
            self.dirty += 1;
            self.watches.touch(db, &key);
            self.track_modified(&key);
            self.event(db, b'e', "evicted", &key);
        }
        freed
    }

    fn pick_victim(&mut self, policy: Policy, now_ms: u64) -> Option<(usize, Box<[u8]>)> {
        let samples = self
            .shared
            .tunables
            .maxmemory_samples
            .load(Ordering::Relaxed)
            .max(1);
        let decay = self.shared.tunables.lfu_decay_time.load(Ordering::Relaxed);
        let lru_now = self.lru_at(now_ms);
        let ndbs = self.dbs.len();
        let mut best: Option<(u64, usize, Box<[u8]>)> = None;
        if self.locks.whole_held() {
            return None;
        }
        for step in 0..ndbs {
            let db = (self.evict_next_db + step) % ndbs;
            let random = matches!(policy, Policy::AllkeysRandom | Policy::VolatileRandom);
            let draws = if random { 1 } else { samples };
            // A key a transaction holds is drawn again (a few times at most): its block in
            // the AOF, written when it lets go, must not follow a DEL of the key.
            let (mut drawn, mut held_draws) = (0, 0);
            while drawn < draws {
                let rand = || self.random();
                let table = &self.dbs[db].table;
                let e = if policy.volatile() {
                    table.random_volatile_entry(rand)
                } else {
                    table.random_entry(rand)
                };
                let Some(e) = e else {
                    break;
                };
                if self.locks.is_held(e.key.as_bytes()) {
                    held_draws += 1;
                    if held_draws > HELD_DRAWS_MOST {
                        break;
                    }
                    continue;
                }
                drawn += 1;
                // Higher is a better victim.
                let score = match policy {
                    Policy::AllkeysLru | Policy::VolatileLru => {
                        lru_now.saturating_sub(e.lru) as u64
                    }
                    Policy::AllkeysLfu | Policy::VolatileLfu => {
                        255 - lfu_decayed(e.lru, now_ms, decay) as u64
                    }
                    Policy::VolatileTtl => u64::MAX - e.expire_at(),
                    _ => 0,
                };
                if best.as_ref().is_none_or(|b| score > b.0) {
                    best = Some((score, db, e.key.as_bytes().into()));
                }
            }
            if random && best.is_some() {
                // Random policies take keys from the databases in turn, as Redis does.
                self.evict_next_db = (db + 1) % ndbs;
                break;
            }
        }
        best.map(|(_, db, k)| (db, k))
    }
}

/// How many keys held by transactions one pick of a victim may draw before it gives up
/// on a database.
const HELD_DRAWS_MOST: usize = 16;

/// Whether a policy other than `noeviction` is set (and this is no replica, which
/// leaves eviction to its master): only then is it worth reading memory per command.
pub fn evicting(shared: &crate::shard::Shared) -> bool {
    shared.tunables.maxmemory_policy.load(Ordering::Relaxed) != Policy::NoEviction.to_u8()
        && !shared.repl.is_replica()
}

/// Evicts, shard by shard, until memory is under `maxmemory` or nothing more can go.
/// Returns whether memory is under the limit now.
pub async fn make_room(worker: &Rc<Worker>) -> bool {
    let shared = worker.shared.clone();
    let policy = Policy::from_u8(shared.tunables.maxmemory_policy.load(Ordering::Relaxed));
    for _ in 0..64 {
        crate::memory::refresh(&shared);
        let max = shared.tunables.maxmemory.load(Ordering::Relaxed);
        let used = shared.used_memory.load(Ordering::Relaxed) as u64;
        if max == 0 || used <= max {
            return true;
        }
        if policy == Policy::NoEviction || shared.repl.is_replica() {
            return false;
        }
        let share = ((used - max) as usize).div_ceil(worker.nshards()).max(1);
        let freed = crate::shard::broadcast(worker, move |w| {
            let f = w.shard.borrow_mut().evict(policy, share, 256);
            if f.keys > 0 {
                // Freed blocks wait in this thread's allocator cache; give them back so
                // the next reading of memory sees them gone.
                crate::memory::flush_thread_cache();
                crate::shard::after_command(w);
            }
            f.keys
        })
        .await;
        if freed.iter().all(|&n| n == 0) {
            crate::memory::refresh(&shared);
            return !shared.over_maxmemory();
        }
    }
    !shared.over_maxmemory()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::locks::LockKeys;
    use crate::types::value::{StrValue, Value};

    /// A transaction holding a key may have read or written it, and its block reaches
    /// the AOF when it lets go: a DEL of that key logged now would come first there, and
    /// a replay or a replica would keep what the master evicted.
    #[test]
    fn keys_a_transaction_holds_are_not_evicted() {
        let mut sh = crate::shard::Shard::for_tests(1);
        for key in [&b"held"[..], b"free"] {
            let value = Value::Str(StrValue::from_bytes(b"value"));
            sh.dbs[0].table.insert(key, value, 0, 0);
        }
        let (grant, _granted) = tokio::sync::oneshot::channel();
        sh.locks.acquire(
            LockKeys::Keys(vec![bytes::Bytes::from_static(b"held")]),
            grant,
        );
        let freed = sh.evict(Policy::AllkeysRandom, usize::MAX, 16);
        assert_eq!(freed.keys, 1);
        assert!(
            sh.dbs[0].table.get(b"held").is_some(),
            "a held key was evicted"
        );
        assert!(sh.dbs[0].table.get(b"free").is_none());
    }

    #[test]
    fn lfu_counter_grows_slowly_and_decays() {
        let now = 10 * 60_000;
        let mut f = lfu_new(now);
        assert_eq!(f & 0xFF, LFU_INIT_VAL);
        for _ in 0..100 {
            f = lfu_touch(f, now, 10, 1, 0.0);
        }
        assert_eq!(f & 0xFF, LFU_INIT_VAL + 100);
        // Three minutes later, three decay periods of one minute.
        assert_eq!(lfu_decayed(f, now + 3 * 60_000, 1), LFU_INIT_VAL + 97);
        // A high counter rarely grows.
        assert_eq!(lfu_touch(f, now, 10, 1, 0.5) & 0xFF, LFU_INIT_VAL + 100);
    }
}
