//! The local over-limit cache: a descriptor the store just denied, whose denial cannot end before a known time, is
//! answered locally until then without a store call. A flood of one over-limit key then costs no Redis round trips.
//!
//! Only algorithms whose retry time is exact and cannot be cut short by anyone else are cached (fixed and sliding
//! windows, sliding log, token and leaky buckets); a concurrency lease can be released and a queue drained early, so
//! those are always asked. An entry is used only for a hit at least as costly as the one denied (a larger cost can
//! only wait longer), and expires at the script's own retry time. Memory is bounded by `capacity` entries.
//!
//! A denial holds only for the limits it was made under: it is kept by the descriptor's counter and a fingerprint of
//! its limits, so a request that brings its own limit (a `RateLimitOverride`) on the same entries can never make the
//! configured limit answer from its denial, nor the reverse. A reload or a Reset bumps the cache's generation, and a
//! denial decided by a request that started before it is dropped instead of stored: a stale answer in flight across
//! the change cannot shadow a raised limit or a reset counter.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

const SHARDS: usize = 16;
/// Denials kept for one counter under different limits at most (overrides on the same entries).
const PER_KEY: usize = 4;

/// A denial remembered until `until_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    /// A fingerprint of the limits the denial was made under; it answers only for the same limits.
    pub limits: u64,
    /// No hit of at least `cost` fits before this time.
    pub until_us: u64,
    pub cost: u64,
    /// The tier that denied, and when it is full again.
    pub tier: usize,
    pub reset_at_us: u64,
}

/// One shard: the denials of a descriptor (the key of its first tier), one per set of limits.
type Shard = HashMap<String, Vec<Denial>>;

/// Denials by descriptor, then by limits.
#[derive(Debug)]
pub struct LocalCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    /// Bumped by every clear and removal; a denial is stored only under the generation its request started in.
    generation: AtomicU64,
}

impl LocalCache {
    /// A cache of at most `capacity` denials; 0 disables it.
    pub fn new(capacity: usize) -> LocalCache {
        LocalCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
            generation: AtomicU64::new(0),
        }
    }

    /// Whether the cache was built with no room (`--local-cache-size 0`).
    pub fn is_disabled(&self) -> bool {
        self.per_shard == 0
    }

    /// The generation now: read before a store call, handed to [`LocalCache::insert`] with its denial.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let m = &self.shards[self.hasher.hash_one(key) as usize % SHARDS];
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The denial that still holds for a hit of `cost` on `key` under the limits whose fingerprint `limits` gives
    /// (computed only when `key` has denials at all) at `now_us`.
    pub fn get(&self, key: &str, limits: impl FnOnce() -> u64, cost: u64, now_us: u64) -> Option<Denial> {
        if self.per_shard == 0 || cost == 0 {
            return None;
        }
        let shard = self.shard(key);
        let denials = shard.get(key)?;
        let limits = limits();
        denials
            .iter()
            .find(|d| d.limits == limits)
            .copied()
            .filter(|d| now_us < d.until_us && cost >= d.cost)
    }

    /// Remembers a denial decided by a request that started in `generation`; a clear or removal since then drops
    /// it. When the shard is full, expired entries make room first, and if none has expired the denial is not
    /// remembered.
    pub fn insert(&self, key: &str, denial: Denial, now_us: u64, generation: u64) {
        if self.per_shard == 0 || denial.until_us <= now_us {
            return;
        }
        let mut shard = self.shard(key);
        // Under the shard's lock: a clear or removal bumps the generation before it takes the lock.
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if shard.len() >= self.per_shard && !shard.contains_key(key) {
            shard.retain(|_, ds| {
                ds.retain(|d| d.until_us > now_us);
                !ds.is_empty()
            });
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let denials = shard.entry(key.to_owned()).or_default();
        denials.retain(|d| d.limits != denial.limits && d.until_us > now_us);
        if denials.len() >= PER_KEY {
            denials.remove(0);
        }
        denials.push(denial);
    }

    /// Forgets every denial (after a reload: limits may have changed under the same keys).
    pub fn clear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        for shard in self.shards.iter() {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// Forgets the denials of `keys` (after a Reset).
    pub fn remove(&self, keys: &[&str]) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        for key in keys {
            self.shard(key).remove(*key);
        }
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.values().map(Vec::len).sum()))
            .sum()
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
            limits: 7,
            until_us,
            cost,
            tier: 0,
            reset_at_us: until_us,
        }
    }

    #[test]
    fn holds_until_the_retry_time_for_costs_at_least_as_large() {
        let c = LocalCache::new(100);
        c.insert("k", denial(1_000, 2), 0, c.generation());
        assert!(c.get("k", || 7, 2, 999).is_some());
        assert!(c.get("k", || 7, 3, 999).is_some());
        assert!(c.get("k", || 7, 1, 999).is_none(), "a smaller cost may fit earlier");
        assert!(c.get("k", || 7, 0, 999).is_none(), "checks without cost always ask");
        assert!(c.get("k", || 7, 2, 1_000).is_none(), "expired");
        c.remove(&["k"]);
        assert!(c.get("k", || 7, 2, 0).is_none());
    }

    #[test]
    fn a_denial_answers_only_for_its_own_limits() {
        let c = LocalCache::new(100);
        c.insert("k", denial(1_000, 1), 0, c.generation());
        assert!(
            c.get("k", || 8, 1, 10).is_none(),
            "other limits on the same counter ask the store"
        );
        c.insert(
            "k",
            Denial {
                limits: 8,
                ..denial(500, 1)
            },
            0,
            c.generation(),
        );
        assert_eq!(c.get("k", || 7, 1, 10).map(|d| d.until_us), Some(1_000));
        assert_eq!(c.get("k", || 8, 1, 10).map(|d| d.until_us), Some(500));
    }

    #[test]
    fn a_denial_from_before_a_clear_is_not_stored() {
        let c = LocalCache::new(100);
        let started = c.generation();
        c.clear();
        c.insert("k", denial(1_000, 1), 0, started);
        assert!(c.get("k", || 7, 1, 10).is_none(), "decided under the old rules");
        let started = c.generation();
        c.remove(&["other"]);
        c.insert("k", denial(1_000, 1), 0, started);
        assert!(c.get("k", || 7, 1, 10).is_none(), "decided before a reset");
        c.insert("k", denial(1_000, 1), 0, c.generation());
        assert!(c.get("k", || 7, 1, 10).is_some());
    }

    #[test]
    fn bounded_and_disabled() {
        let c = LocalCache::new(SHARDS);
        for i in 0..1_000 {
            c.insert(&format!("k{i}"), denial(10, 1), 0, 0);
        }
        assert!(c.len() <= SHARDS, "{}", c.len());
        for i in 0..1_000 {
            c.insert(&format!("j{i}"), denial(30, 1), 20, 0);
        }
        assert!(c.len() <= SHARDS && !c.is_empty(), "expired entries make room");
        for limits in 0..10 {
            c.insert(
                "j0",
                Denial {
                    limits,
                    ..denial(30, 1)
                },
                20,
                0,
            );
        }
        assert!(c.len() <= SHARDS * PER_KEY, "{}", c.len());
        let off = LocalCache::new(0);
        off.insert("k", denial(10, 1), 0, 0);
        assert!(off.get("k", || 7, 1, 0).is_none());
    }
}
