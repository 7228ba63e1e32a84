//! What a batch of commands sent to another thread travels in, and how its result finds
//! the connection that waits for it.
//!
//! Owns, per thread, the spare buffers hops are made of and the table of results this
//! thread's connections still wait for. It never runs a command and never touches shard
//! data or a socket: `run_batch_on` and the thread's mailbox loop call in here.
//!
//! Why not a `oneshot` channel per hop: a hop already travels both ways through the two
//! threads' mailboxes, so the channel's shared allocation, its atomic state and its own
//! waker protocol bought nothing but their cost. A result now comes back as a slot number
//! in the mailbox message, and the waiting connection finds it in a table only its own
//! thread touches. The batch's command queue and reply buffer come back with the result
//! and are kept for the next hop instead of being freed and allocated again.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};

use super::mailbox::Mailbox;
use super::{BatchResult, Mail};
use crate::commands::Command;

/// The commands of a batch, in order.
pub type Cmds = VecDeque<(&'static Command, Vec<Bytes>)>;

/// Spare queues and buffers a thread keeps: about the hops its connections have in
/// flight at once. More are freed.
const SPARES_KEPT: usize = 64;
/// A reply buffer that grew past this is freed rather than kept, so one large reply does
/// not stay allocated for the life of the thread.
const SPARE_REPLY_BYTES: usize = 16 * 1024;
/// Likewise for a command queue's capacity.
const SPARE_CMDS: usize = 256;
/// A new reply buffer's capacity: a pipeline's worth of short replies.
const REPLY_CAPACITY: usize = 256;

#[derive(Default)]
struct Spares {
    cmds: Vec<Cmds>,
    replies: Vec<BytesMut>,
}

enum Slot {
    Free,
    /// The connection waits; its waker, once it has polled.
    Waiting(Option<Waker>),
    Ready(BatchResult),
    /// The batch was lost on the other thread (it panicked or stopped).
    Lost,
    /// The connection stopped waiting (it was dropped): the result is freed on arrival.
    Abandoned,
}

#[derive(Default)]
struct Pending {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

thread_local! {
    static SPARES: RefCell<Spares> = RefCell::default();
    static PENDING: RefCell<Pending> = RefCell::default();
}

/// An empty command queue for a batch, reused when this thread has one.
pub fn cmds() -> Cmds {
    SPARES
        .with(|s| s.borrow_mut().cmds.pop())
        .unwrap_or_default()
}

/// An empty reply buffer for a batch, reused when this thread has one.
pub fn reply_buffer() -> BytesMut {
    SPARES
        .with(|s| s.borrow_mut().replies.pop())
        .unwrap_or_else(|| BytesMut::with_capacity(REPLY_CAPACITY))
}

/// Keeps a finished batch's reply buffer and command queue for the next hop, after
/// dropping the commands that ran (`BatchResult::spent`): here, on the thread that parsed
/// them.
pub fn recycle(mut reply: BytesMut, mut spent: Cmds) {
    spent.clear();
    SPARES.with(|s| {
        let mut s = s.borrow_mut();
        if s.replies.len() < SPARES_KEPT && reply.capacity() <= SPARE_REPLY_BYTES {
            reply.clear();
            s.replies.push(reply);
        }
        if s.cmds.len() < SPARES_KEPT && spent.capacity() <= SPARE_CMDS {
            s.cmds.push(spent);
        }
    });
}

/// The right to answer one batch, sent with it. `answer` consumes it; dropped unanswered
/// (the batch was lost), it tells the waiting connection so, which then fails as it did
/// when the channel's sender was dropped.
pub struct Ticket {
    home: Arc<Mailbox>,
    home_thread: usize,
    slot: u32,
    answered: bool,
}

impl Ticket {
    /// Hands `result` to the connection waiting on this thread's slot: through the home
    /// thread's mailbox, or at once when this is the home thread (`here`).
    pub fn answer(mut self, result: BatchResult, here: bool) {
        self.answered = true;
        if here {
            deliver(self.slot, Some(result));
        } else {
            // With this pass's other results for that thread.
            super::mailbox::post(
                self.home_thread,
                &self.home,
                Mail::Done(self.slot, Some(result)),
            );
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.answered {
            self.home.push(Mail::Done(self.slot, None));
        }
    }
}

/// Opens a slot for a batch about to be sent from this thread, number `home_thread`,
/// whose mailbox is `home`.
pub fn open(home: &Arc<Mailbox>, home_thread: usize) -> (Ticket, Answer) {
    let slot = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        match p.free.pop() {
            Some(i) => {
                p.slots[i as usize] = Slot::Waiting(None);
                i
            }
            None => {
                p.slots.push(Slot::Waiting(None));
                (p.slots.len() - 1) as u32
            }
        }
    });
    (
        Ticket {
            home: home.clone(),
            home_thread,
            slot,
            answered: false,
        },
        Answer {
            slot,
            finished: false,
            _this_thread: PhantomData,
        },
    )
}

/// A result (or, with `None`, the news that the batch was lost) reaching its slot on the
/// home thread: from the mailbox loop, or from `Ticket::answer` on the home thread.
pub fn deliver(slot: u32, result: Option<BatchResult>) {
    // Whatever nobody waits for any more is dropped after the table is let go.
    let mut unwanted = None;
    // `try_with`: a thread being torn down drops the mail it still held.
    let waker = PENDING
        .try_with(|p| {
            let mut p = p.borrow_mut();
            let Some(s) = p.slots.get_mut(slot as usize) else {
                unwanted = result;
                return None;
            };
            match s {
                Slot::Waiting(waker) => {
                    let waker = waker.take();
                    *s = match result {
                        Some(r) => Slot::Ready(r),
                        None => Slot::Lost,
                    };
                    waker
                }
                Slot::Abandoned => {
                    *s = Slot::Free;
                    p.free.push(slot);
                    unwanted = result;
                    None
                }
                // Each slot has one ticket, so nothing else can arrive; keep what is there.
                _ => {
                    unwanted = result;
                    None
                }
            }
        })
        .ok()
        .flatten();
    drop(unwanted);
    if let Some(w) = waker {
        w.wake();
    }
}

/// The connection's side of a slot: resolves to the batch's result, or `None` when the
/// batch was lost.
pub struct Answer {
    slot: u32,
    finished: bool,
    /// The slot lives in this thread's table.
    _this_thread: PhantomData<*const ()>,
}

impl Future for Answer {
    type Output = Option<BatchResult>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        debug_assert!(!self.finished, "an answer is taken once");
        let slot = self.slot;
        let out = PENDING.with(|p| {
            let mut p = p.borrow_mut();
            let s = &mut p.slots[slot as usize];
            match s {
                Slot::Waiting(waker) => {
                    match waker {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        _ => *waker = Some(cx.waker().clone()),
                    }
                    Poll::Pending
                }
                Slot::Ready(_) => {
                    let Slot::Ready(r) = std::mem::replace(s, Slot::Free) else {
                        unreachable!("matched above");
                    };
                    p.free.push(slot);
                    Poll::Ready(Some(r))
                }
                _ => {
                    *s = Slot::Free;
                    p.free.push(slot);
                    Poll::Ready(None)
                }
            }
        });
        if out.is_ready() {
            self.finished = true;
        }
        out
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let slot = self.slot;
        let unwanted = PENDING.try_with(|p| {
            let mut p = p.borrow_mut();
            let s = &mut p.slots[slot as usize];
            match std::mem::replace(s, Slot::Abandoned) {
                Slot::Waiting(_) => None,
                other => {
                    *s = Slot::Free;
                    p.free.push(slot);
                    Some(other)
                }
            }
        });
        drop(unwanted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::reply::Reply;
    use std::task::Wake;

    struct Count(std::sync::atomic::AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn result(text: &[u8]) -> BatchResult {
        let mut out = Reply::new(false);
        out.buf.extend_from_slice(text);
        BatchResult::new(out, Cmds::new(), Vec::new())
    }

    fn poll(answer: &mut Answer, waker: &Waker) -> Poll<Option<BatchResult>> {
        Pin::new(answer).poll(&mut Context::from_waker(waker))
    }

    /// Runs the home thread's mailbox as its loop would.
    fn run_mail(home: &Mailbox) {
        let mut mail = VecDeque::new();
        home.take_into(&mut mail);
        for m in mail {
            match m {
                Mail::Done(slot, r) => deliver(slot, r),
                _ => panic!("only results come home here"),
            }
        }
    }

    #[test]
    fn a_result_from_another_thread_wakes_its_connection_once() {
        let home = Arc::new(Mailbox::default());
        let count = Arc::new(Count(0.into()));
        let waker = Waker::from(count.clone());
        let (ticket, mut answer) = open(&home, 0);
        assert!(poll(&mut answer, &waker).is_pending());
        std::thread::spawn(move || ticket.answer(result(b"+OK\r\n"), false))
            .join()
            .unwrap();
        assert!(
            poll(&mut answer, &waker).is_pending(),
            "not yet taken from the mailbox"
        );
        run_mail(&home);
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        match poll(&mut answer, &waker) {
            Poll::Ready(Some(r)) => assert_eq!(&r.out.buf[..], b"+OK\r\n"),
            _ => panic!("the result arrived"),
        }
    }

    #[test]
    fn a_batch_lost_on_the_other_thread_ends_the_wait() {
        let home = Arc::new(Mailbox::default());
        let waker = Waker::from(Arc::new(Count(0.into())));
        let (ticket, mut answer) = open(&home, 0);
        assert!(poll(&mut answer, &waker).is_pending());
        std::thread::spawn(move || drop(ticket)).join().unwrap();
        run_mail(&home);
        assert!(matches!(poll(&mut answer, &waker), Poll::Ready(None)));
    }

    #[test]
    fn a_slot_whose_connection_left_is_reused_once_its_result_comes() {
        let home = Arc::new(Mailbox::default());
        let (ticket, answer) = open(&home, 0);
        let slot = ticket.slot;
        drop(answer);
        ticket.answer(result(b"+late\r\n"), false);
        let (other, _waiting) = open(&home, 0);
        assert_ne!(other.slot, slot, "still taken until the result comes");
        run_mail(&home);
        let (again, _answer) = open(&home, 0);
        assert_eq!(again.slot, slot);
        for t in [other, again] {
            t.answer(result(b""), true);
        }
    }

    #[test]
    fn spent_queues_come_back_empty_and_large_buffers_are_freed() {
        let _ = cmds();
        let mut big = BytesMut::with_capacity(SPARE_REPLY_BYTES * 2);
        big.extend_from_slice(b"x");
        let huge = Cmds::with_capacity(SPARE_CMDS * 2);
        let kept_before = SPARES.with(|s| (s.borrow().replies.len(), s.borrow().cmds.len()));
        recycle(big, huge);
        assert_eq!(
            SPARES.with(|s| (s.borrow().replies.len(), s.borrow().cmds.len())),
            kept_before
        );
        // The commands that ran are dropped here; their queue serves the next hop.
        let mut spent = Cmds::with_capacity(4);
        let arg = Bytes::from_static(b"k");
        spent.push_back((crate::commands::table().lookup(b"get").unwrap(), vec![arg]));
        let mut small = reply_buffer();
        small.extend_from_slice(b"+OK\r\n");
        recycle(small, spent);
        assert!(reply_buffer().is_empty());
        let next = cmds();
        assert!(next.is_empty());
        assert!(next.capacity() >= 4);
    }
}
