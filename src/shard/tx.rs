//! Multi-shard transactions.
//!
//! A transaction gets a global id, locks exactly the keys it touches on each shard it
//! touches (ascending shard order, so it cannot deadlock with another), runs its steps on
//! those shards, and releases everything when dropped. Commands on other keys are never
//! held up by it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::locks::LockKeys;
use super::{hop, release_locks, Shard, Worker};

pub struct Tx {
    worker: Rc<Worker>,
    pub id: u64,
    held: Vec<(usize, LockKeys)>,
    /// Keyspace events of the steps, published in step order once the locks go (shards
    /// publishing on their own could reorder them).
    events: RefCell<Vec<(usize, &'static str, Bytes)>>,
}

/// Groups keys by owning shard, in ascending shard order, keeping repeats (EXISTS a a
/// counts twice).
pub fn keys_by_shard<'a>(
    worker: &Worker,
    keys: impl IntoIterator<Item = &'a Bytes>,
) -> Vec<(usize, Vec<Bytes>)> {
    let mut groups: Vec<(usize, Vec<Bytes>)> = Vec::new();
    for k in keys {
        let s = worker.shard_of(k);
        match groups.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push(k.clone()),
            None => groups.push((s, vec![k.clone()])),
        }
    }
    groups.sort_by_key(|g| g.0);
    groups
}

impl Tx {
    /// Locks `wants` shard by shard in ascending order and returns once all are held.
    pub async fn begin(worker: &Rc<Worker>, mut wants: Vec<(usize, LockKeys)>) -> Tx {
        wants.sort_by_key(|w| w.0);
        let id = worker.shared.next_tx_id.fetch_add(1, Ordering::Relaxed);
        let mut tx = Tx {
            worker: worker.clone(),
            id,
            held: Vec::with_capacity(wants.len()),
            events: RefCell::new(Vec::new()),
        };
        for (shard, keys) in wants {
            let (grant, granted) = oneshot::channel();
            let request = keys.clone();
            if shard == worker.id {
                worker.shard.borrow_mut().locks.acquire(request, grant);
            } else {
                worker.shard.borrow_mut().stats.hops += 1;
                worker.shared.send(
                    shard,
                    Box::new(move |w| w.shard.borrow_mut().locks.acquire(request, grant)),
                );
            }
            granted.await.expect("shard thread stopped");
            tx.held.push((shard, keys));
        }
        tracing::trace!(
            tx = tx.id,
            shards = tx.held.len(),
            "transaction holds its locks"
        );
        tx
    }

    /// Locks the given keys (grouped by shard) plus, with `all_shards`, every shard whole.
    pub async fn lock_keys(worker: &Rc<Worker>, keys: &[Bytes], all_shards: bool) -> Tx {
        let wants = if all_shards {
            (0..worker.nshards()).map(|s| (s, LockKeys::All)).collect()
        } else {
            keys_by_shard(worker, keys)
                .into_iter()
                .map(|(s, ks)| (s, LockKeys::Keys(ks)))
                .collect()
        };
        Tx::begin(worker, wants).await
    }

    /// Runs `f` on `shard` under this transaction's locks.
    pub async fn run<R, F>(&self, shard: usize, f: F) -> R
    where
        R: Send + 'static,
        F: FnOnce(&mut Shard) -> R + Send + 'static,
    {
        let (result, events) = hop(&self.worker, shard, move |w| {
            let mut sh = w.shard.borrow_mut();
            let result = f(&mut sh);
            (result, std::mem::take(&mut sh.events))
        })
        .await;
        self.events.borrow_mut().extend(events);
        result
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        tracing::trace!(tx = self.id, "transaction releases its locks");
        for (shard, keys) in self.held.drain(..) {
            if shard == self.worker.id {
                release_locks(&self.worker, &keys);
            } else {
                self.worker
                    .shared
                    .send(shard, Box::new(move |w| release_locks(w, &keys)));
            }
        }
        for (db, event, key) in self.events.take() {
            crate::pubsub::publish_event(&self.worker, db, event, &key);
        }
    }
}
