//! Memory accounting: jemalloc's own figures, refreshed a few times a second into atomics
//! that INFO and the maxmemory check read without asking the allocator.

use std::sync::atomic::Ordering;

use tikv_jemalloc_ctl::{epoch, stats};

use crate::shard::Shared;

/// Returns the calling thread's cached free blocks to jemalloc, so that memory freed
/// here (eviction) shows in the next reading.
pub fn flush_thread_cache() {
    // SAFETY: "thread.tcache.flush" takes no value and only acts on this thread.
    let _ = unsafe { tikv_jemalloc_ctl::raw::write(b"thread.tcache.flush\0", ()) };
}

/// MEMORY PURGE: every arena gives its unused dirty pages back to the system.
pub fn purge() {
    // SAFETY: "arena.<MALLCTL_ARENAS_ALL>.purge" takes no value.
    let _ = unsafe { tikv_jemalloc_ctl::raw::write(b"arena.4096.purge\0", ()) };
}

pub fn refresh(shared: &Shared) {
    if epoch::advance().is_err() {
        return;
    }
    if let Ok(allocated) = stats::allocated::read() {
        shared.used_memory.store(allocated, Ordering::Relaxed);
        shared.peak_memory.fetch_max(allocated, Ordering::Relaxed);
        let _ = shared.startup_memory.compare_exchange(
            0,
            allocated,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}
