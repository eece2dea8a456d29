//! The local over-limit cache: a descriptor the store just denied, whose denial cannot end before a known time, is
//! answered locally until then without a store call. A flood of one over-limit key then costs no Redis round trips.
//!
//! Only algorithms whose retry time is exact and cannot be cut short by anyone else are cached (fixed and sliding
//! windows, sliding log, token and leaky buckets); a concurrency lease can be released and a queue drained early, so
//! those are always asked. An entry is used only for a hit at least as costly as the one denied (a larger cost can
//! only wait longer), and expires at the script's own retry time. Memory is bounded by `capacity` entries.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};

const SHARDS: usize = 16;

/// A denial remembered until `until_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    /// No hit of at least `cost` fits before this time.
    pub until_us: u64,
    pub cost: u64,
    /// The tier that denied, and when it is full again.
    pub tier: usize,
    pub reset_at_us: u64,
}

/// Denials by descriptor (the key of its first tier).
#[derive(Debug)]
pub struct LocalCache {
    shards: Box<[Mutex<HashMap<String, Denial>>]>,
    per_shard: usize,
    hasher: RandomState,
}

impl LocalCache {
    /// A cache of at most `capacity` denials; 0 disables it.
    pub fn new(capacity: usize) -> LocalCache {
        LocalCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<String, Denial>> {
        let m = &self.shards[self.hasher.hash_one(key) as usize % SHARDS];
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The denial that still holds for a hit of `cost` on `key` at `now_us`.
    pub fn get(&self, key: &str, cost: u64, now_us: u64) -> Option<Denial> {
        if self.per_shard == 0 || cost == 0 {
            return None;
        }
        let shard = self.shard(key);
        shard
            .get(key)
            .copied()
            .filter(|d| now_us < d.until_us && cost >= d.cost)
    }

    /// Remembers a denial; when the shard is full, expired entries make room first, and if none has expired the
    /// denial is not remembered.
    pub fn insert(&self, key: &str, denial: Denial, now_us: u64) {
        if self.per_shard == 0 || denial.until_us <= now_us {
            return;
        }
        let mut shard = self.shard(key);
        if shard.len() >= self.per_shard && !shard.contains_key(key) {
            shard.retain(|_, d| d.until_us > now_us);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(key.to_owned(), denial);
    }

    /// Forgets every denial (after a reload: limits may have changed under the same keys).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// Forgets the denials of `keys` (after a Reset).
    pub fn remove(&self, keys: &[&str]) {
        for key in keys {
            self.shard(key).remove(*key);
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map_or(0, |s| s.len())).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(until_us: u64, cost: u64) -> Denial {
        Denial {
            until_us,
            cost,
            tier: 0,
            reset_at_us: until_us,
        }
    }

    #[test]
    fn holds_until_the_retry_time_for_costs_at_least_as_large() {
        let c = LocalCache::new(100);
        c.insert("k", denial(1_000, 2), 0);
        assert!(c.get("k", 2, 999).is_some());
        assert!(c.get("k", 3, 999).is_some());
        assert!(c.get("k", 1, 999).is_none(), "a smaller cost may fit earlier");
        assert!(c.get("k", 0, 999).is_none(), "checks without cost always ask");
        assert!(c.get("k", 2, 1_000).is_none(), "expired");
        c.remove(&["k"]);
        assert!(c.get("k", 2, 0).is_none());
    }

    #[test]
    fn bounded_and_disabled() {
        let c = LocalCache::new(SHARDS);
        for i in 0..1_000 {
            c.insert(&format!("k{i}"), denial(10, 1), 0);
        }
        assert!(c.len() <= SHARDS, "{}", c.len());
        for i in 0..1_000 {
            c.insert(&format!("j{i}"), denial(30, 1), 20);
        }
        assert!(c.len() <= SHARDS && !c.is_empty(), "expired entries make room");
        let off = LocalCache::new(0);
        off.insert("k", denial(10, 1), 0);
        assert!(off.get("k", 1, 0).is_none());
    }
}
