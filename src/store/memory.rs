//! The in-memory store: the default when no Redis URL is given, with the same answers as the Redis scripts.
//!
//! Counters live in sharded hash maps, each behind a short-held mutex (never across an `.await`). A counter expires
//! at the end of its window; each shard sweeps out expired counters at most once per second of request time, so
//! memory stays bounded by the keys of the live windows.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};

use super::{Hit, Outcome, Remaining, Store, StoreError, fixed_window};

const SHARDS: usize = 64;
const SWEEP_EVERY_US: u64 = 1_000_000;

/// Counters in this process's memory.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

#[derive(Debug, Default)]
struct Shard {
    counters: HashMap<String, Counter>,
    next_sweep_us: u64,
}

#[derive(Debug, Clone, Copy)]
struct Counter {
    used: u64,
    expires_at_us: u64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    /// How many counters are held, expired or not (for tests of eviction).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).counters.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &str, now_us: u64) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        let mut shard = lock(&self.shards[index]);
        if now_us >= shard.next_sweep_us {
            shard.counters.retain(|_, c| c.expires_at_us > now_us);
            shard.next_sweep_us = now_us + SWEEP_EVERY_US;
        }
        shard
    }

    fn current(shard: &Shard, key: &str, now_us: u64) -> u64 {
        match shard.counters.get(key) {
            Some(c) if c.expires_at_us > now_us => c.used,
            _ => 0,
        }
    }
}

/// A poisoned shard only means another thread panicked mid-update of plain integers; the data is still usable.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn hit(&self, now_us: u64, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        let outcomes = hits
            .iter()
            .map(|hit| {
                let key = hit.key.as_str();
                let mut shard = self.shard(key, now_us);
                let used = if hit.cost == 0 {
                    Self::current(&shard, key, now_us)
                } else {
                    let expires_at_us =
                        fixed_window::window_start(now_us, hit.window_us) + hit.window_us;
                    match shard.counters.get_mut(key) {
                        Some(c) if c.expires_at_us > now_us => {
                            c.used = c.used.saturating_add(hit.cost);
                            c.used
                        }
                        _ => {
                            let c = Counter {
                                used: hit.cost,
                                expires_at_us,
                            };
                            shard.counters.insert(key.to_owned(), c);
                            hit.cost
                        }
                    }
                };
                fixed_window::outcome(
                    used,
                    hit.limit,
                    fixed_window::reset_after(now_us, hit.window_us),
                )
            })
            .collect();
        Ok(outcomes)
    }

    async fn peek(&self, now_us: u64, hits: &[Hit]) -> Result<Vec<Remaining>, StoreError> {
        Ok(hits
            .iter()
            .map(|hit| {
                let used = Self::current(
                    &self.shard(hit.key.as_str(), now_us),
                    hit.key.as_str(),
                    now_us,
                );
                fixed_window::remaining(
                    used,
                    hit.limit,
                    hit.cost,
                    fixed_window::reset_after(now_us, hit.window_us),
                )
            })
            .collect())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
