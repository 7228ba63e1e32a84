//! A thread's mailbox: how every other thread reaches it, without a wake-up per message.
//!
//! Owns the queue of `Mail` bound for one thread and the rule for waking that thread. It
//! never runs the mail itself (the thread's loop in `server/` does) and knows nothing of
//! shards or sockets.
//!
//! Senders push onto a lock-free stack (one compare-and-swap each); the owning thread
//! takes the whole stack with one swap and reverses it, so mail from one sender arrives in
//! the order it was sent. A thread about to sleep raises its `sleeping` flag and looks at
//! its queue once more; a sender looks at the flag after pushing and wakes the thread only
//! if it was raised and the sender is the one that lowers it. So a busy thread is never
//! woken (it finds its mail before it sleeps), and a sleeping one is woken once however
//! many messages reach it. Both sides use sequentially consistent operations on the flag
//! and the queue head: of "sender pushed, then read the flag" and "thread raised the
//! flag, then read the queue", at least one sees the other.
//!
//! Hops and their results do not even cost a push each: a loop thread holds them in its
//! outbox until its pass's tasks have run, then sends each thread its share as one push
//! (`post`, `flush_outbox`).
//!
//! The thread's loop (`net::event_loop`) calls `before_park` when it runs out of work and
//! `after_unpark` when it wakes; the wake is the mailbox task's waker, which reaches a
//! sleeping loop through its eventfd: the only system call a sleep costs a sender.

use std::cell::RefCell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;

use super::Mail;

/// What one push carries: a message, or the messages one thread queued for this one
/// during a pass (`post`), in order.
enum Parcel<T> {
    One(T),
    Many(Vec<T>),
}

struct Node<T> {
    parcel: Parcel<T>,
    next: *mut Node<T>,
}

/// Generic over what it carries so its ordering can be tested without a shard thread.
pub struct Mailbox<T = Mail> {
    /// Newest first; null when empty.
    head: AtomicPtr<Node<T>>,
    sleeping: AtomicBool,
    /// The owning thread's mailbox future. Locked only to replace it and by the one
    /// sender that wins a sleeping thread's flag, never per message.
    waker: Mutex<Option<Waker>>,
    /// Wake-ups senders had to send (INFO's `mailbox_wakeups`).
    pub wakeups: AtomicU64,
    /// Messages pushed (INFO's `mailbox_messages`).
    pub messages: AtomicU64,
    /// Pushes, a pass's bundle counting once (INFO's `mailbox_pushes`): fewer than
    /// `messages` by what the outbox saved.
    pub pushes: AtomicU64,
}

// SAFETY: nodes are reached only through `head`; a node belongs to the stack from its
// successful push until the single consumer takes the whole stack with a swap, so no two
// threads touch one node's fields at once. `Mail` is `Send`.
unsafe impl<T: Send> Send for Mailbox<T> {}
unsafe impl<T: Send> Sync for Mailbox<T> {}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Mailbox {
            head: AtomicPtr::new(ptr::null_mut()),
            sleeping: AtomicBool::new(false),
            waker: Mutex::new(None),
            wakeups: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            pushes: AtomicU64::new(0),
        }
    }
}

impl<T> Mailbox<T> {
    /// Queues `mail`; wakes the owning thread only if it is asleep.
    pub fn push(&self, mail: T) {
        self.push_parcel(Parcel::One(mail), 1);
    }

    /// Queues `mails` in order, as one push: one node, one exchange, at most one wake-up.
    pub fn push_all(&self, mut mails: Vec<T>) {
        match mails.len() {
            0 => {}
            1 => self.push(mails.pop().expect("one message")),
            n => self.push_parcel(Parcel::Many(mails), n as u64),
        }
    }

    fn push_parcel(&self, parcel: Parcel<T>, count: u64) {
        let node = Box::into_raw(Box::new(Node {
            parcel,
            next: ptr::null_mut(),
        }));
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` is ours until the exchange below publishes it.
            unsafe { (*node).next = head };
            match self
                .head
                .compare_exchange_weak(head, node, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => head = now,
            }
        }
        self.messages.fetch_add(count, Ordering::Relaxed);
        self.pushes.fetch_add(1, Ordering::Relaxed);
        if self.sleeping.load(Ordering::SeqCst) && self.sleeping.swap(false, Ordering::SeqCst) {
            self.wakeups.fetch_add(1, Ordering::Relaxed);
            let waker = self.waker.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    /// Whether anything waits; cheap enough to ask on every pass.
    pub fn has_mail(&self) -> bool {
        !self.head.load(Ordering::SeqCst).is_null()
    }

    /// Takes everything queued, oldest first, onto the end of `into`. Owning thread only.
    pub fn take_into(&self, into: &mut std::collections::VecDeque<T>) -> usize {
        let mut node = self.head.swap(ptr::null_mut(), Ordering::SeqCst);
        let start = into.len();
        // Taken newest first: turn the chain round (its links, not the messages, which
        // are large) so it is walked in sending order.
        let mut oldest = ptr::null_mut();
        while !node.is_null() {
            // SAFETY: the swap made this chain ours alone.
            let next = unsafe { (*node).next };
            unsafe { (*node).next = oldest };
            oldest = node;
            node = next;
        }
        node = oldest;
        while !node.is_null() {
            // SAFETY: the chain is ours alone; each node was boxed by `push_parcel`.
            let boxed = unsafe { Box::from_raw(node) };
            node = boxed.next;
            match boxed.parcel {
                Parcel::One(mail) => into.push_back(mail),
                Parcel::Many(mails) => into.extend(mails),
            }
        }
        into.len() - start
    }

    /// The owning thread is about to sleep: raise the flag, then look once more. True
    /// when mail came in meanwhile and the flag was lowered again: do not sleep.
    pub fn about_to_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        self.has_mail() && self.sleeping.swap(false, Ordering::SeqCst)
    }

    /// The owning thread is awake: senders need not wake it.
    pub fn awake(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// Remembers the owning thread's waker (its mailbox future's), if it changed.
    pub fn set_waker(&self, waker: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(|p| p.into_inner());
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
    }
}

impl<T> Drop for Mailbox<T> {
    fn drop(&mut self) {
        let mut rest = std::collections::VecDeque::new();
        self.take_into(&mut rest);
    }
}

thread_local! {
    /// This thread's own mailbox and its future's waker, for the park hooks.
    static OWN: RefCell<Option<(Arc<Mailbox>, Waker)>> = const { RefCell::new(None) };
}

/// Mail a loop thread queued during its pass for the other threads: each thread's share
/// leaves as one push when the pass's tasks have run (`flush_outbox`, called by the
/// loop before it looks at its sockets or sleeps), the way the pass's replies leave
/// together. Only hops and their results go this way (`post`): their senders wait for
/// the answer by yielding to the loop, so nothing waits on mail still held here. Every
/// other send (`Shared::send`) flushes the outbox first and goes at once, because some
/// of its callers then wait for it without yielding (`sync_call`), and so that what one
/// thread sends still arrives in the order it was sent. (A ticket dropped unanswered
/// pushes its `Done(slot, None)` at once: nothing else concerns that slot.) A thread that
/// opens its outbox must run a loop that flushes it (`Parking::end_of_run`):
/// `EventLoop::block_on`'s does not, so no shard thread uses it.
struct Outbox {
    own: usize,
    to: Vec<(Arc<Mailbox>, Vec<Mail>)>,
    /// The threads with mail held, in the order they were first written to this pass.
    held_for: Vec<usize>,
}

thread_local! {
    static OUTBOX: RefCell<Option<Outbox>> = const { RefCell::new(None) };
}

/// Makes this thread, number `own`, hold its hops for the end of each pass. Called once
/// by a shard thread before its loop starts; elsewhere `post` pushes at once.
pub fn open_outbox(own: usize, mailboxes: &[Arc<Mailbox>]) {
    OUTBOX.with(|o| {
        *o.borrow_mut() = Some(Outbox {
            own,
            to: mailboxes.iter().map(|m| (m.clone(), Vec::new())).collect(),
            held_for: Vec::new(),
        })
    });
}

/// Sends `mail` to thread `to`, whose mailbox is `mailbox`: with the rest of this pass's
/// mail for it on a loop thread, at once anywhere else (and to this thread itself).
pub fn post(to: usize, mailbox: &Mailbox, mail: Mail) {
    // `try_with`: a ticket dropped while the thread is torn down still gets through.
    let holds = OUTBOX
        .try_with(|o| {
            o.borrow()
                .as_ref()
                .is_some_and(|ob| ob.own != to && to < ob.to.len())
        })
        .unwrap_or(false);
    if !holds {
        mailbox.push(mail);
        return;
    }
    OUTBOX.with(|o| {
        let mut o = o.borrow_mut();
        let ob = o.as_mut().expect("looked at above");
        let held = &mut ob.to[to].1;
        if held.is_empty() {
            ob.held_for.push(to);
        }
        held.push(mail);
    });
}

/// Sends what this thread's pass held back (`post`), each thread's share as one push.
pub fn flush_outbox() {
    let _ = OUTBOX.try_with(|o| {
        let mut o = o.borrow_mut();
        let Some(Outbox { to, held_for, .. }) = o.as_mut() else {
            return;
        };
        for t in held_for.drain(..) {
            let (mailbox, held) = &mut to[t];
            // A lone message goes as it is and the list keeps its capacity; a bundle
            // goes in the list itself (the messages are large: not copied again), and a
            // new list of the same capacity takes its place.
            if held.len() == 1 {
                mailbox.push(held.pop().expect("one message"));
            } else {
                let capacity = held.capacity();
                mailbox.push_all(std::mem::replace(held, Vec::with_capacity(capacity)));
            }
        }
    });
}

/// Called by the thread's loop when it finds its mailbox empty and waits on `waker`.
pub fn waiting(mailbox: &Arc<Mailbox>, waker: &Waker) {
    OWN.with(|own| {
        let mut own = own.borrow_mut();
        if own
            .as_ref()
            .is_some_and(|(m, w)| Arc::ptr_eq(m, mailbox) && w.will_wake(waker))
        {
            return;
        }
        mailbox.set_waker(waker);
        *own = Some((mailbox.clone(), waker.clone()));
    });
}

/// The loop is about to sleep: raise the flag, then look once more. Mail that came in
/// meanwhile wakes the mailbox future here, on this thread, which costs no system call and
/// keeps the loop from sleeping.
///
/// First, up to `yields` times (`park-yields`; 0 with one thread), the thread gives its
/// core away with `sched_yield` and looks at its mailbox when it runs again. A thread
/// about to sleep has usually just sent work to another thread and waits for the answer;
/// on a machine whose cores are all busy (the client's included) the answer is often
/// there by the time the thread runs again, and a sleep and an eventfd wake-up are
/// saved. Unlike spinning it takes no core from anyone; on an idle machine it returns at
/// once. Measured in BENCHMARKS.md ("One yield before sleeping").
pub fn before_park(yields: u32) {
    OWN.with(|own| {
        let own = own.borrow();
        let Some((mailbox, waker)) = own.as_ref() else {
            return;
        };
        if yields > 0 {
            // The pass's replies leave before the core is given away, not after the
            // yield (a ring that waits would send them with its wait).
            crate::net::uring::flush();
        }
        for _ in 0..yields {
            if mailbox.has_mail() {
                waker.wake_by_ref();
                return;
            }
            // SAFETY: sched_yield takes no arguments and only gives the core away.
            unsafe { libc::sched_yield() };
        }
        mailbox.sleeping.store(true, Ordering::SeqCst);
        if mailbox.has_mail() && mailbox.sleeping.swap(false, Ordering::SeqCst) {
            waker.wake_by_ref();
        }
    });
}

/// The loop is awake again, so senders need not wake this thread. Mail
/// sent from now on is found before the next sleep.
pub fn after_unpark() {
    OWN.with(|own| {
        if let Some((mailbox, _)) = own.borrow().as_ref() {
            mailbox.sleeping.store(false, Ordering::SeqCst);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    #[test]
    fn each_senders_mail_arrives_in_order_and_none_is_lost() {
        let mb: Arc<Mailbox<(u32, u32)>> = Arc::new(Mailbox::default());
        let senders: Vec<_> = (0..4u32)
            .map(|s| {
                let mb = mb.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u32 {
                        mb.push((s, i));
                    }
                })
            })
            .collect();
        let mut taken = VecDeque::new();
        let mut next = [0u32; 4];
        let mut count = 0;
        while count < 80_000 {
            count += mb.take_into(&mut taken);
            for (s, i) in taken.drain(..) {
                assert_eq!(i, next[s as usize], "sender {s} out of order");
                next[s as usize] += 1;
            }
        }
        for s in senders {
            s.join().unwrap();
        }
        assert_eq!(next, [20_000; 4]);
        assert!(!mb.has_mail());
    }

    #[test]
    fn a_sleeping_thread_is_woken_once_and_a_busy_one_never() {
        struct Count(AtomicU64);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(AtomicU64::new(0)));
        let waker = Waker::from(count.clone());
        let mb: Arc<Mailbox> = Arc::new(Mailbox::default());
        waiting(&mb, &waker);
        let run = || Mail::Run(Box::new(|_| {}));
        // Awake: no wake-up however much arrives.
        for _ in 0..10 {
            mb.push(run());
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        // Mail already there when it goes to sleep: it wakes itself, on its own thread.
        before_park(0);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        after_unpark();
        let mut taken = VecDeque::new();
        assert_eq!(mb.take_into(&mut taken), 10);
        // Asleep on an empty mailbox: the first message wakes it, the rest do not.
        before_park(0);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        for _ in 0..10 {
            mb.push(run());
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(mb.wakeups.load(Ordering::SeqCst), 1);
        after_unpark();
        mb.take_into(&mut taken);
        // Yielding first: mail found then wakes it on its own thread, and the flag stays
        // down (no sender pays for a wake-up); found nothing, it sleeps as before.
        mb.push(run());
        before_park(2);
        assert_eq!(count.0.load(Ordering::SeqCst), 3);
        assert!(!mb.sleeping.load(Ordering::SeqCst));
        mb.take_into(&mut taken);
        before_park(2);
        assert!(mb.sleeping.load(Ordering::SeqCst));
        mb.push(run());
        assert_eq!(count.0.load(Ordering::SeqCst), 4);
        assert_eq!(mb.wakeups.load(Ordering::SeqCst), 2);
        OWN.with(|o| *o.borrow_mut() = None);
    }

    fn slots(mb: &Mailbox) -> Vec<u32> {
        let mut taken = VecDeque::new();
        mb.take_into(&mut taken);
        taken
            .into_iter()
            .map(|m| match m {
                Mail::Done(slot, _) => slot,
                _ => panic!("only results were sent"),
            })
            .collect()
    }

    #[test]
    fn a_pass_posts_each_threads_mail_as_one_push_in_order() {
        let shared = crate::shard::Shared::for_tests(3);
        let boxes: Vec<Arc<Mailbox>> = (0..3).map(|_| Arc::new(Mailbox::default())).collect();
        assert!(shared.mailboxes.set(boxes.clone()).is_ok());
        // Before the outbox is opened (any thread but a shard's), a post goes at once.
        post(1, &boxes[1], Mail::Done(7, None));
        assert_eq!(slots(&boxes[1]), [7]);
        open_outbox(0, &boxes);
        for slot in 0..5 {
            post(1, &boxes[1], Mail::Done(slot, None));
        }
        post(2, &boxes[2], Mail::Done(9, None));
        // To its own thread it goes at once.
        post(0, &boxes[0], Mail::Done(8, None));
        assert_eq!(slots(&boxes[0]), [8]);
        assert!(
            !boxes[1].has_mail() && !boxes[2].has_mail(),
            "held for the pass"
        );
        let pushes = boxes[1].pushes.load(Ordering::Relaxed);
        flush_outbox();
        assert_eq!(boxes[1].pushes.load(Ordering::Relaxed), pushes + 1);
        assert_eq!(slots(&boxes[1]), [0, 1, 2, 3, 4]);
        assert_eq!(slots(&boxes[2]), [9]);
        // A send that goes at once comes after what was held, not before it.
        post(1, &boxes[1], Mail::Done(10, None));
        post(1, &boxes[1], Mail::Done(11, None));
        shared.send(1, Box::new(|_| {}));
        let mut taken = VecDeque::new();
        boxes[1].take_into(&mut taken);
        assert!(matches!(
            (&taken[0], &taken[1], &taken[2]),
            (Mail::Done(10, _), Mail::Done(11, _), Mail::Run(_))
        ));
        flush_outbox();
        assert!(!boxes[1].has_mail(), "nothing held twice");
        OUTBOX.with(|o| *o.borrow_mut() = None);
    }

    #[test]
    fn a_sleeper_is_always_woken_under_contention() {
        // Many senders against one thread that sleeps whenever its queue looks empty:
        // every message is taken, and the thread never sleeps with mail waiting.
        let mb: Arc<Mailbox<u64>> = Arc::new(Mailbox::default());
        let parked = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        struct Unpark(Arc<(Mutex<bool>, std::sync::Condvar)>);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                *self.0 .0.lock().unwrap() = true;
                self.0 .1.notify_one();
            }
        }
        mb.set_waker(&Waker::from(Arc::new(Unpark(parked.clone()))));
        const PER: u64 = 20_000;
        let senders: Vec<_> = (0..6u64)
            .map(|_| {
                let mb = mb.clone();
                std::thread::spawn(move || {
                    for i in 0..PER {
                        mb.push(i);
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut taken = VecDeque::new();
        let mut got = 0u64;
        while got < 6 * PER {
            got += mb.take_into(&mut taken) as u64;
            taken.clear();
            if got == 6 * PER {
                break;
            }
            // Sleep as the loop does: raise the flag, look again, then wait to be woken.
            mb.sleeping.store(true, Ordering::SeqCst);
            if mb.has_mail() {
                mb.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            let (lock, cv) = &*parked;
            let mut woken = lock.lock().unwrap();
            let slept = std::time::Instant::now();
            while !*woken {
                woken = cv
                    .wait_timeout(woken, std::time::Duration::from_millis(100))
                    .unwrap()
                    .0;
                assert!(
                    *woken || !mb.has_mail() || slept.elapsed().as_secs() < 5,
                    "asleep with mail waiting: a lost wake-up"
                );
            }
            *woken = false;
            mb.sleeping.store(false, Ordering::SeqCst);
        }
        for s in senders {
            s.join().unwrap();
        }
        assert_eq!(got, 6 * PER);
    }
}
