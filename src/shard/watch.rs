//! Keys watched by WATCH, per shard.
//!
//! A watching connection shares one flag with every shard holding one of its watched
//! keys; a shard raises the flag when such a key changes, and EXEC reads it after it has
//! locked the keys of the transaction, so no change can slip in between.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hashbrown::HashMap;

struct Watcher {
    client: u64,
    dirty: Arc<AtomicBool>,
    /// The key had already expired (but was not yet deleted) when it was watched: its
    /// deletion by expiry is then no change, as in Redis.
    expired_at_watch: bool,
}

pub struct WatchTable {
    per_db: Vec<HashMap<Box<[u8]>, Vec<Watcher>>>,
    count: usize,
}

impl WatchTable {
    pub fn new(databases: usize) -> WatchTable {
        WatchTable {
            per_db: (0..databases).map(|_| HashMap::new()).collect(),
            count: 0,
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn add(
        &mut self,
        db: usize,
        key: &[u8],
        client: u64,
        dirty: Arc<AtomicBool>,
        expired: bool,
    ) {
        let list = self.per_db[db].entry(key.into()).or_default();
        if list.iter().any(|w| w.client == client) {
            return;
        }
        list.push(Watcher {
            client,
            dirty,
            expired_at_watch: expired,
        });
        self.count += 1;
    }

    pub fn remove(&mut self, db: usize, key: &[u8], client: u64) {
        if let Some(list) = self.per_db[db].get_mut(key) {
            let before = list.len();
            list.retain(|w| w.client != client);
            self.count -= before - list.len();
            if list.is_empty() {
                self.per_db[db].remove(key);
            }
        }
    }

    pub fn touch(&mut self, db: usize, key: &[u8]) {
        if let Some(list) = self.per_db[db].get(key) {
            for w in list {
                w.dirty.store(true, Ordering::Release);
            }
        }
    }

    pub fn touch_expired(&mut self, db: usize, key: &[u8]) {
        if self.count == 0 {
            return;
        }
        if let Some(list) = self.per_db[db].get(key) {
            for w in list.iter().filter(|w| !w.expired_at_watch) {
                w.dirty.store(true, Ordering::Release);
            }
        }
    }

    /// Whether `key` was watched by `client` while already expired.
    pub fn was_expired_at_watch(&self, db: usize, key: &[u8], client: u64) -> bool {
        self.per_db[db]
            .get(key)
            .and_then(|l| l.iter().find(|w| w.client == client))
            .is_some_and(|w| w.expired_at_watch)
    }

    /// Every watched key of `db`, for SWAPDB and FLUSHDB which change keys wholesale.
    pub fn keys(&self, db: usize) -> Vec<Box<[u8]>> {
        self.per_db[db].keys().cloned().collect()
    }
}
