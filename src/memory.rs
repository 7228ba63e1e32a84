//! Memory accounting: jemalloc's own figures, refreshed a few times a second into atomics
//! that INFO and the maxmemory check read without asking the allocator.

use std::sync::atomic::Ordering;

use tikv_jemalloc_ctl::{epoch, stats};

use crate::shard::Shared;

pub fn refresh(shared: &Shared) {
    if epoch::advance().is_err() {
        return;
    }
    if let Ok(allocated) = stats::allocated::read() {
        shared.used_memory.store(allocated, Ordering::Relaxed);
        shared.peak_memory.fetch_max(allocated, Ordering::Relaxed);
    }
}
