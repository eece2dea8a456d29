//! The in-memory store: the default when no Redis URL is given. It decides as the Lua scripts of `lua/` do, step by
//! step: each algorithm's check, commit and refund are its file in `store/algorithm/`, by which the Redis store reads
//! what its scripts saw too, and the decision loop (`memory/decide.rs`) is the twin of `lua/decide.lua`. A differential property test
//! holds the two stores to identical answers.
//!
//! State lives in sharded hash maps behind short-held mutexes (never across an `.await`). Every key of one
//! descriptor hashes to the same shard, so a descriptor's tiers are decided under one lock, atomically. A state
//! expires when the script's key would (its TTL), and is invisible from then on; each shard evicts what expired a
//! few states per access (`memory/shard.rs`).

mod decide;
mod shard;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::algorithm::Counter;
use super::algorithm::concurrency::Leases;
use super::algorithm::fixed_window::Fixed;
use super::algorithm::queue::Queue;
use super::algorithm::sliding_window::Sliding;
use super::{
    Announcements, Answers, CounterKey, Counters, Grant, Granted, Grants, Hit, ListChange, ListEntry, Lists, Notice,
    Offenders, RegionCount, RegionCounts, Releases, Reservations, SERIES_TTL_US, Series, Settled, Settlement, Span,
    StoreError, StreamReset, TOP_BUCKET_TTL_US, Tally, WindowRef, ranked,
};
use shard::{Entry, Shard, State};

const SHARDS: usize = 64;

/// Counters in this process's memory.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// Notices go to this process's listeners only: no other instance shares this store.
    notices: tokio::sync::broadcast::Sender<Notice>,
    /// The lists' run-time entries: per list key, each value's expiry (`None`: never).
    lists: Mutex<HashMap<String, HashMap<String, Option<u64>>>>,
    /// The buckets of top values, by bucket key: the bucket's end of life and its counts.
    tops: Mutex<HashMap<String, Bucket>>,
    /// The seconds of outcome counts, by key: when each goes, and its counts.
    seconds: Mutex<HashMap<String, Bucket>>,
    /// What the other regions counted in global windows, by [`CounterKey::regions`] key: when each goes, and each
    /// region's count (`lua/merge.lua`'s hashes).
    regions: Mutex<HashMap<String, Bucket>>,
}

/// A bucket of top values: when it goes, and its counts.
type Bucket = (u64, HashMap<String, u64>);

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore {
            notices: tokio::sync::broadcast::Sender::new(super::NOTICE_BACKLOG),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            lists: Mutex::default(),
            tops: Mutex::default(),
            seconds: Mutex::default(),
            regions: Mutex::default(),
        }
    }

    /// How many keys are held, expired or not (for tests of eviction).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard of a descriptor's keys, with a few of its expired states evicted.
    fn shard(&self, tag: u64, now_us: u64) -> MutexGuard<'_, Shard> {
        let mut shard = lock(&self.shards[(tag % SHARDS as u64) as usize]);
        shard.sweep(now_us);
        shard
    }
}

/// A poisoned shard only means another thread panicked mid-update of plain data; the data is still usable.
/// The wall clock, in microseconds since the Unix epoch.
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Counters for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn hit(&self, now_us: u64, hits: &[Hit]) -> Answers {
        hits.iter().map(|h| Ok(self.decide(now_us, h))).collect()
    }

    async fn reset(&self, keys: &[CounterKey]) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for key in keys {
            let mut shard = lock(&self.shards[(key.tag() % SHARDS as u64) as usize]);
            deleted += u64::from(shard.entries.remove(key.as_str()).is_some());
        }
        Ok(deleted)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl Releases for MemoryStore {
    async fn release(&self, keys: &[CounterKey], lease: &str) -> Result<u64, StoreError> {
        let mut released = 0;
        for key in keys {
            let mut shard = lock(&self.shards[(key.tag() % SHARDS as u64) as usize]);
            if let Some(Entry {
                state: State::Counter(Counter::Leases(Leases(leases))),
                ..
            }) = shard.entries.get_mut(key.as_str())
            {
                let before = leases.len();
                leases.retain(|l| l.0 != lease);
                released += (before - leases.len()) as u64;
            }
        }
        Ok(released)
    }

    async fn reset_idle_streams(&self, now_us: u64, keys: &[CounterKey]) -> Result<StreamReset, StoreError> {
        let mut reset = StreamReset::default();
        for key in keys {
            let mut shard = lock(&self.shards[(key.tag() % SHARDS as u64) as usize]);
            match shard.live(key.as_str(), now_us) {
                Some(State::Counter(Counter::Queue(Queue { entries, .. }))) if !entries.is_empty() => {
                    reset.kept.push(key.clone())
                }
                _ => {
                    let removed = shard.entries.remove(key.as_str());
                    reset.deleted += u64::from(removed.is_some_and(|e| e.expires_at_us > now_us));
                }
            }
        }
        Ok(reset)
    }
}

impl Reservations for MemoryStore {
    async fn settle(&self, now_us: u64, settlements: &[Settlement]) -> Vec<Result<Settled, StoreError>> {
        settlements.iter().map(|s| Ok(self.settle_one(now_us, s))).collect()
    }
}

impl Grants for MemoryStore {
    async fn grant(&self, now_us: u64, grants: &[Grant]) -> Vec<Result<Granted, StoreError>> {
        grants.iter().map(|g| Ok(self.grant_one(now_us, g))).collect()
    }
}

impl Announcements for MemoryStore {
    async fn announce(&self, notice: Notice) {
        // No listener is not an error: nothing keeps state beside the store.
        let _ = self.notices.send(notice);
    }

    fn notices(&self) -> tokio::sync::broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }
}

impl Lists for MemoryStore {
    async fn list_change(
        &self,
        now_us: u64,
        list: &CounterKey,
        change: ListChange<'_>,
    ) -> Result<Option<u64>, StoreError> {
        let mut lists = lock(&self.lists);
        let entries = lists.entry(list.as_str().to_string()).or_default();
        entries.retain(|_, expires| expires.is_none_or(|e| e > now_us));
        let changed = match change {
            ListChange::Add {
                values,
                expires_us,
                max,
            } => {
                let new = values.iter().filter(|v| !entries.contains_key(v.as_str())).count();
                if entries.len() + new > max {
                    return Ok(None);
                }
                for value in values {
                    entries.insert(value.clone(), expires_us);
                }
                new
            }
            ListChange::Remove { values } => values.iter().filter(|v| entries.remove(v.as_str()).is_some()).count(),
        };
        if entries.is_empty() {
            lists.remove(list.as_str());
        }
        Ok(Some(changed as u64))
    }

    async fn list_entries(&self, now_us: u64, list: &CounterKey) -> Result<Vec<ListEntry>, StoreError> {
        let lists = lock(&self.lists);
        let mut entries: Vec<ListEntry> = lists
            .get(list.as_str())
            .into_iter()
            .flatten()
            .filter(|(_, expires)| expires.is_none_or(|e| e > now_us))
            .map(|(value, &expires_us)| ListEntry {
                value: value.clone(),
                expires_us,
            })
            .collect();
        entries.sort_by(|a, b| a.value.cmp(&b.value));
        Ok(entries)
    }
}

impl Offenders for MemoryStore {
    async fn tally(&self, now_us: u64, tallies: &[Tally], kept: usize) -> Result<(), StoreError> {
        let mut tops = lock(&self.tops);
        tops.retain(|_, (expires, _)| *expires > now_us);
        for tally in tallies {
            for span in [Span::Minute, Span::Hour] {
                let (width, _) = span.buckets();
                let start = now_us - now_us % width;
                let (_, counts) = tops
                    .entry(tally.set.bucket(span, start).as_str().to_string())
                    .or_insert((start + TOP_BUCKET_TTL_US, HashMap::new()));
                for (value, n) in &tally.counts {
                    *counts.entry(value.clone()).or_default() += n;
                }
                if counts.len() > kept {
                    // The `kept` largest stay (ties broken by value, as Redis orders a sorted set).
                    let mut all: Vec<(String, u64)> = counts.drain().collect();
                    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
                    all.truncate(kept);
                    counts.extend(all);
                }
            }
        }
        Ok(())
    }

    async fn top(&self, now_us: u64, set: &CounterKey, span: Span) -> Result<Vec<(String, u64)>, StoreError> {
        let tops = lock(&self.tops);
        let mut sums: HashMap<String, u64> = HashMap::new();
        for key in span.keys(set, now_us) {
            if let Some((_, counts)) = tops.get(key.as_str()).filter(|(e, _)| *e > now_us) {
                for (value, n) in counts {
                    *sums.entry(value.clone()).or_default() += n;
                }
            }
        }
        Ok(ranked(sums))
    }
}

impl Series for MemoryStore {
    async fn series_add(&self, set: &CounterKey, counts: &[(u64, String, u64)]) -> Result<(), StoreError> {
        let mut seconds = lock(&self.seconds);
        // A second lives as long as in Redis: its TTL from now (the wall clock: these counts are for people to read).
        let now_us = wall_us();
        seconds.retain(|_, (expires, _)| *expires > now_us);
        for (second, field, n) in counts {
            let (expires, hash) = seconds.entry(set.second(*second).as_str().to_string()).or_default();
            *expires = now_us + SERIES_TTL_US;
            *hash.entry(field.clone()).or_default() += n;
        }
        Ok(())
    }

    async fn series_read(&self, set: &CounterKey, from: u64, to: u64) -> Result<Vec<HashMap<String, u64>>, StoreError> {
        let seconds = lock(&self.seconds);
        Ok((from..=to)
            .map(|s| {
                seconds
                    .get(set.second(s).as_str())
                    .map(|(_, h)| h.clone())
                    .unwrap_or_default()
            })
            .collect())
    }
}

impl RegionCounts for MemoryStore {
    async fn window_counts(&self, now_us: u64, windows: &[WindowRef]) -> Result<Vec<u64>, StoreError> {
        let now = now_us;
        Ok(windows
            .iter()
            .map(|w| {
                let shard = lock(&self.shards[(w.key.tag() % SHARDS as u64) as usize]);
                match shard.counter(w.key.as_str(), now) {
                    Some(Counter::Fixed(Fixed { w: start, n })) if *start == w.start_us => *n,
                    Some(Counter::Sliding(Sliding { w: start, c, .. })) if *start == w.start_us => *c,
                    Some(Counter::Sliding(Sliding { w: start, p, .. })) if *start == w.start_us + w.window_us => *p,
                    _ => 0,
                }
            })
            .collect())
    }

    async fn merge_counts(&self, now_us: u64, region: &str, counts: &[RegionCount]) -> Result<(), StoreError> {
        let mut regions = lock(&self.regions);
        regions.retain(|_, (expires, _)| *expires > now_us);
        for c in counts {
            let key = c.window.key.regions(c.window.start_us);
            let (expires, held) = regions.entry(String::from(key)).or_default();
            *expires = (*expires).max(c.window.expires_us());
            let n = held.entry(region.to_string()).or_default();
            *n = (*n).max(c.count);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Algorithm;
    use crate::store::TierSpec;
    use crate::store::algorithm::{MAX_COUNT, MAX_SLIDING_COUNT};

    /// The twin of `redis_forced_counts_stop_at_their_bounds` in `tests/contract/forced.rs`: the same seeded counts, the same
    /// answers.
    #[test]
    fn forced_counts_stop_at_their_bounds() {
        let (now, minute) = (1_704_067_210_000_000, 60_000_000);
        let start = now - now % minute;
        let store = MemoryStore::new();
        for (algorithm, seeded, bound) in [
            (
                Algorithm::FixedWindow,
                Counter::Fixed(Fixed {
                    w: start,
                    n: MAX_COUNT - 1,
                }),
                MAX_COUNT,
            ),
            (
                Algorithm::SlidingWindow,
                Counter::Sliding(Sliding {
                    w: start,
                    c: MAX_SLIDING_COUNT - 1,
                    p: 0,
                }),
                MAX_SLIDING_COUNT,
            ),
        ] {
            let key = CounterKey::builder("t:", "d")
                .entry("k", "v")
                .finish()
                .tier(algorithm, minute);
            let hit = Hit {
                tiers: vec![TierSpec {
                    key: key.clone(),
                    algorithm,
                    limit: 3,
                    window_us: minute,
                    burst: 3,
                    cost: None,
                    global: false,
                }],
                cost: 5,
                mode: crate::store::Mode::Report,
                ..Hit::default()
            };
            lock(&store.shards[(key.tag() % SHARDS as u64) as usize]).set(
                key.as_str(),
                State::Counter(seeded),
                now + minute,
            );
            let count = || match lock(&store.shards[(key.tag() % SHARDS as u64) as usize]).counter(key.as_str(), now) {
                Some(Counter::Fixed(f)) => f.n,
                Some(Counter::Sliding(s)) => s.c,
                other => panic!("{other:?}"),
            };
            let o = store.decide(now, &hit);
            assert_eq!(o.tiers[0].used, bound - 1 + 4, "{algorithm:?}: the cost counts as 4");
            assert_eq!(count(), bound, "{algorithm:?}");
            store.decide(now, &hit);
            assert_eq!(count(), bound, "{algorithm:?}");
        }
    }
}
