//! Ctrl-C: the first SIGINT (or SIGTERM) asks every run to stop, so the servers a
//! comparison started are stopped by their `Drop`; a second one kills them at once and
//! exits.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
const MAX_CHILDREN: usize = 8;
static CHILDREN: [AtomicI32; MAX_CHILDREN] = [const { AtomicI32::new(0) }; MAX_CHILDREN];

extern "C" fn on_signal(_sig: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        for c in &CHILDREN {
            let pid = c.load(Ordering::SeqCst);
            if pid > 0 {
                // SAFETY: kill and _exit are async-signal-safe.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        // SAFETY: as above.
        unsafe { libc::_exit(130) };
    }
}

pub fn install() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only touches atomics and async-signal-safe calls.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// True once Ctrl-C was pressed.
pub fn stopping() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Remembers a child server so a second Ctrl-C can kill it.
pub fn register_child(pid: i32) {
    for c in &CHILDREN {
        if c.compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

pub fn forget_child(pid: i32) {
    for c in &CHILDREN {
        let _ = c.compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}
