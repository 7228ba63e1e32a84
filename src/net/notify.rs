//! A wake-up for one task from its own thread, without a lock: what a connection's task
//! waits on besides its socket. Owns nothing else.

use std::cell::{Cell, RefCell};

/// A wake-up for the one task that serves a connection, from its own thread: kills, a
/// busy script's hook, tracking redirects, replies the send batch could not finish.
/// tokio's `Notify` does the same across threads with a mutex-guarded waiter list, which
/// the connection loop paid for (a lock, a waiter registered and removed) on every
/// request it waited for.
///
/// A notification is never lost: it stays as a permit until a `notified()` takes it, and
/// wakes the registered task if any. A wake-up that finds the task no longer waiting is
/// harmless: every waiter checks why it was woken.
#[derive(Default)]
pub struct LocalNotify {
    permit: Cell<bool>,
    waker: RefCell<Option<std::task::Waker>>,
}

impl LocalNotify {
    pub fn notify_one(&self) {
        self.permit.set(true);
        let waiting = self.waker.borrow_mut().take();
        if let Some(w) = waiting {
            w.wake();
        }
    }

    /// Completes once a notification is (or already was) given, taking it.
    pub fn notified(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.permit.replace(false) {
                return std::task::Poll::Ready(());
            }
            let mut slot = self.waker.borrow_mut();
            if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *slot = Some(cx.waker().clone());
            }
            std::task::Poll::Pending
        })
    }
}
