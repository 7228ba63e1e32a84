//! The slot map as the data path reads it: one atomic byte per slot, written by the
//! control plane (`state.rs`) under its lock whenever ownership changes, read by every
//! keyed command with a relaxed load. A command racing a change sees the old owner or
//! the new one, which is what a Redis client racing a reshard sees too.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};

use super::SLOTS;

/// No node serves the slot.
pub const UNASSIGNED: u8 = 0;
/// This node serves it.
pub const HERE: u8 = 1;
/// Another node serves it.
pub const ELSEWHERE: u8 = 2;
/// Served here and being moved to another node (keys missing here get -ASK).
pub const MIGRATING: u8 = 4;
/// Being moved here from another node (served after ASKING).
pub const IMPORTING: u8 = 8;
/// Served by the master this node replicates (READONLY connections read it here).
pub const MY_MASTER: u8 = 16;

pub struct SlotView {
    slots: Box<[AtomicU8]>,
    /// `cluster_state:ok`.
    ok: AtomicBool,
}

impl Default for SlotView {
    fn default() -> Self {
        SlotView {
            slots: (0..SLOTS).map(|_| AtomicU8::new(UNASSIGNED)).collect(),
            ok: AtomicBool::new(false),
        }
    }
}

impl SlotView {
    #[inline]
    pub fn get(&self, slot: usize) -> u8 {
        self.slots[slot].load(Relaxed)
    }

    pub fn set(&self, slot: usize, v: u8) {
        self.slots[slot].store(v, Relaxed);
    }

    #[inline]
    pub fn ok(&self) -> bool {
        self.ok.load(Relaxed)
    }

    pub fn set_ok(&self, ok: bool) {
        self.ok.store(ok, Relaxed);
    }
}
