//! The in-memory store: the default when no Redis URL is given. Each algorithm here mirrors its Lua script in
//! `lua/` step by step (same integer arithmetic, same floating-point expression where the script has one), and a
//! differential property test holds the two to identical answers.
//!
//! State lives in sharded hash maps behind short-held mutexes (never across an `.await`). Every key of one
//! descriptor hashes to the same shard, so a descriptor's tiers are decided under one lock, atomically. A state
//! expires when the script's key would (its TTL), and is invisible from then on. Each shard keeps its keys in a
//! schedule ordered by expiry and, on every access, removes a few of the states that are due, so memory stays
//! bounded by the live counters and the work of evicting is proportional to what expires: nothing scans a shard, and
//! states that expire together (fixed windows all end on the same boundary) go over the next accesses rather than in
//! one pause.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Answers, CounterKey, Hit, Outcome, Store, StoreError, StreamReset, TierOutcome, TierSpec};
use crate::rules::Algorithm;

const SHARDS: usize = 64;
/// The most a fixed window's count holds (`MAX_COUNT` in `lua/fixed_window.lua`): a lone fixed window counts its
/// denials, so hits of up to `u32::MAX` each could otherwise push it past 2^53, where the scripts' doubles stop
/// being exact. Any count above a limit answers the same.
const MAX_COUNT: u64 = 1 << 52;
/// States evicted per shard access at most: about the cost of one more lookup, and far more than one access adds.
const SWEEP_BATCH: usize = 16;

/// Counters in this process's memory.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<Arc<str>, Entry>,
    /// Every key of `entries` (once, unless a reset dropped it and it came back before its item came due) at the
    /// expiry it had when it was scheduled. An item that comes due evicts its state if the state has expired, and is
    /// scheduled again at the state's current expiry otherwise; a state whose expiry moved earlier (a clock step
    /// back) is evicted at the later time, and is invisible from its expiry on either way.
    schedule: BinaryHeap<Reverse<(u64, Arc<str>)>>,
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    expires_at_us: u64,
}

/// The state of one key, shaped like the Redis value its script keeps.
#[derive(Debug, Clone)]
enum State {
    Fixed {
        w: u64,
        n: u64,
    },
    Sliding {
        w: u64,
        c: u64,
        p: u64,
    },
    /// Hit times, ascending.
    Log(VecDeque<u64>),
    Tat(u64),
    /// (lease id, deadline).
    Leases(Vec<(String, u64)>),
    /// Entry ids (ms, seq), oldest first, and the last id generated.
    Queue {
        entries: VecDeque<(u64, u64)>,
        last: (u64, u64),
    },
    Records(VecDeque<String>),
}

/// What a tier's check found, as the scripts' `check` returns it.
#[derive(Debug, Clone)]
struct Check {
    ok: bool,
    used0: u64,
    used: u64,
    rem0: u64,
    rem1: u64,
    reset0: u64,
    reset1: u64,
    /// `None`: never.
    retry: Option<u64>,
    /// What commit writes.
    write: Write,
}

#[derive(Debug, Clone)]
enum Write {
    Fixed { start: u64, n: u64, reset: u64 },
    Sliding { start: u64, c: u64, p: u64 },
    Log,
    Tat(u64),
    Lease,
    Queue,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

fn ceil_ms_us(us: u64) -> u64 {
    us.div_ceil(1_000).max(1) * 1_000
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
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

    fn decide(&self, now: u64, hit: &Hit, peek: bool) -> Outcome {
        let tag = hit.tiers.first().map(|t| t.key.tag()).unwrap_or_default();
        let mut shard = self.shard(tag, now);
        let cost = hit.bounded_cost();
        let checks: Vec<Check> = hit.tiers.iter().map(|t| shard.check(t, now, cost)).collect();
        let admitted = checks.iter().all(|c| c.ok);
        // A lone fixed window counts its denials, as the reference does, except a cost that can never fit.
        let lone_fixed =
            hit.tiers.len() == 1 && hit.tiers[0].algorithm == Algorithm::FixedWindow && cost <= hit.tiers[0].limit;
        let commit = !peek && cost > 0 && (admitted || lone_fixed);
        let mut longest = 0;
        let mut tiers = Vec::with_capacity(checks.len());
        for (spec, check) in hit.tiers.iter().zip(checks) {
            let (mut remaining, mut reset, mut id) = (check.rem0, check.reset0, None);
            if commit {
                id = shard.commit(spec, &check, now, cost, hit);
                (remaining, reset) = (check.rem1, check.reset1);
            }
            if !peek && !check.ok {
                remaining = 0;
            }
            longest = longest.max(reset);
            tiers.push(TierOutcome {
                ok: check.ok,
                used: if peek { check.used0 } else { check.used },
                remaining,
                reset_after_us: reset,
                retry_after_us: check.retry,
                id,
            });
        }
        let mut records = Vec::new();
        if let Some(record) = &hit.record {
            let key = record.key.as_str();
            if let (true, Some(value)) = (commit, &record.value) {
                let expires = now + ceil_ms_us(longest.max(1));
                let push = |list: &mut VecDeque<String>| {
                    list.push_front(value.clone());
                    list.truncate(record.size as usize);
                };
                match shard.live_mut(key, now) {
                    Some(Entry {
                        state: State::Records(list),
                        expires_at_us,
                    }) => {
                        push(list);
                        *expires_at_us = expires;
                    }
                    _ => {
                        let mut list = VecDeque::new();
                        push(&mut list);
                        shard.set(key, State::Records(list), expires);
                    }
                }
            } else if peek {
                if let Some(State::Records(list)) = shard.live(key, now) {
                    records = list.iter().take(record.size as usize).cloned().collect();
                }
            }
        }
        Outcome {
            admitted,
            tiers,
            records,
        }
    }
}

/// A poisoned shard only means another thread panicked mid-update of plain data; the data is still usable.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shard {
    /// Evicts up to [`SWEEP_BATCH`] states whose scheduled expiry has passed, and schedules again those whose
    /// expiry has since moved later.
    fn sweep(&mut self, now: u64) {
        for _ in 0..SWEEP_BATCH {
            let Some(next) = self.schedule.peek_mut() else {
                return;
            };
            if next.0.0 > now {
                return;
            }
            let Reverse((_, key)) = PeekMut::pop(next);
            match self.entries.get(&key).map(|e| e.expires_at_us) {
                Some(expires) if expires > now => self.schedule.push(Reverse((expires, key))),
                Some(_) => {
                    self.entries.remove(&key);
                }
                None => {}
            }
        }
    }

    /// Adds the state of a key that has none, and schedules it.
    fn insert(&mut self, key: &str, entry: Entry) {
        let key: Arc<str> = Arc::from(key);
        self.schedule.push(Reverse((entry.expires_at_us, Arc::clone(&key))));
        self.entries.insert(key, entry);
    }

    fn live_mut(&mut self, key: &str, now: u64) -> Option<&mut Entry> {
        self.entries.get_mut(key).filter(|e| e.expires_at_us > now)
    }

    fn live(&self, key: &str, now: u64) -> Option<&State> {
        self.entries
            .get(key)
            .filter(|e| e.expires_at_us > now)
            .map(|e| &e.state)
    }

    /// Stores a state, in place when the key exists (no allocation on the hot path).
    fn set(&mut self, key: &str, state: State, expires_at_us: u64) {
        match self.entries.get_mut(key) {
            Some(entry) => *entry = Entry { state, expires_at_us },
            None => self.insert(key, Entry { state, expires_at_us }),
        }
    }

    fn check(&self, t: &TierSpec, now: u64, cost: u64) -> Check {
        let state = self.live(t.key.as_str(), now);
        let (limit, window) = (t.limit, t.window_us);
        match t.algorithm {
            Algorithm::FixedWindow => {
                let start = now - now % window;
                let n = match state {
                    Some(State::Fixed { w, n }) if *w == start => *n,
                    _ => 0,
                };
                let reset = start + window - now;
                let used = n.saturating_add(cost);
                let ok = used <= limit;
                Check {
                    ok,
                    used0: n,
                    used,
                    rem0: limit.saturating_sub(n),
                    rem1: limit.saturating_sub(used),
                    reset0: reset,
                    reset1: reset,
                    retry: retry(cost > limit, ok, reset),
                    write: Write::Fixed { start, n, reset },
                }
            }
            Algorithm::SlidingWindow => {
                let start = now - now % window;
                let (mut c, mut p) = (0, 0);
                match state {
                    Some(State::Sliding { w, c: sc, p: sp }) if *w == start => (c, p) = (*sc, *sp),
                    Some(State::Sliding { w, c: sc, .. }) if *w + window == start => (c, p) = (0, *sc),
                    _ => {}
                }
                let elapsed = now - start;
                let est = sw_estimate(p, c, elapsed, window);
                let used = est.saturating_add(cost);
                let ok = used <= limit;
                let until_empty = |cc: u64, pp: u64| {
                    if cc > 0 {
                        start + 2 * window - now
                    } else if pp > 0 {
                        start + window - now
                    } else {
                        0
                    }
                };
                let retry = if cost > limit {
                    None
                } else if ok {
                    Some(0)
                } else if let Some(e) = sw_first_fit(p, c, window, elapsed, window, limit - cost) {
                    Some(e - elapsed)
                } else if let Some(e) = sw_first_fit(c, 0, window, 0, window, limit - cost) {
                    Some(window - elapsed + e)
                } else {
                    Some(2 * window - elapsed)
                };
                Check {
                    ok,
                    used0: est,
                    used,
                    rem0: limit.saturating_sub(est),
                    rem1: limit.saturating_sub(used),
                    reset0: until_empty(c, p),
                    reset1: until_empty(c.saturating_add(cost), p),
                    retry,
                    write: Write::Sliding { start, c, p },
                }
            }
            Algorithm::SlidingLog => {
                let empty = VecDeque::new();
                let log = match state {
                    Some(State::Log(log)) => log,
                    _ => &empty,
                };
                let mut live = log.iter().copied().filter(|&ts| ts + window > now);
                let count = live.clone().count() as u64;
                let used = count.saturating_add(cost);
                let ok = used <= limit;
                let reset0 = log
                    .back()
                    .filter(|_| count > 0)
                    .map_or(0, |newest| newest + window - now);
                let retry = if cost > limit {
                    None
                } else if ok {
                    Some(0)
                } else {
                    live.nth((count - (limit - cost) - 1) as usize)
                        .map(|ts| ts + window - now)
                };
                Check {
                    ok,
                    used0: count,
                    used,
                    rem0: limit.saturating_sub(count),
                    rem1: limit.saturating_sub(used),
                    reset0,
                    reset1: if cost > 0 { window } else { reset0 },
                    retry,
                    write: Write::Log,
                }
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let interval = window.div_ceil(limit.max(1));
                let tolerance = t.burst.saturating_mul(interval);
                let tat = match state {
                    Some(State::Tat(tat)) => (*tat).max(now),
                    _ => now,
                };
                // A cost above the bucket never fits: it is not priced (its product could leave the exact range).
                let over = cost > t.burst;
                let new = if over {
                    tat
                } else {
                    tat.saturating_add(cost.saturating_mul(interval))
                };
                let ok = !over && new - now <= tolerance;
                let full = now.saturating_add(tolerance);
                let rem0 = full.saturating_sub(tat) / interval;
                let rem1 = match full.checked_sub(new) {
                    Some(room) if !over => room / interval,
                    _ => 0,
                };
                Check {
                    ok,
                    used0: t.burst.saturating_sub(rem0),
                    used: t.burst - rem1,
                    rem0,
                    rem1,
                    reset0: tat - now,
                    reset1: new - now,
                    retry: retry(over, ok, (new - now).saturating_sub(tolerance)),
                    write: Write::Tat(new),
                }
            }
            Algorithm::Concurrency => {
                let mut live: Vec<u64> = match state {
                    Some(State::Leases(leases)) => leases.iter().map(|l| l.1).filter(|&d| d > now).collect(),
                    _ => Vec::new(),
                };
                live.sort_unstable();
                let count = live.len() as u64;
                let slots = u64::from(cost > 0);
                let ok = count + slots <= limit;
                let reset0 = live.last().map_or(0, |last| last - now);
                let retry = if slots > limit {
                    None
                } else if ok {
                    Some(0)
                } else {
                    Some(live[(count + slots - limit - 1) as usize] - now)
                };
                Check {
                    ok,
                    used0: count,
                    used: count + slots,
                    rem0: limit.saturating_sub(count),
                    rem1: limit.saturating_sub(count + slots),
                    reset0,
                    reset1: if slots > 0 { window } else { reset0 },
                    retry,
                    write: Write::Lease,
                }
            }
            Algorithm::Queue => {
                let cutoff = queue_cutoff(now, window);
                // Newest first, as XREVRANGE reads them, at most limit + 1.
                let waiting: Vec<u64> = match state {
                    Some(State::Queue { entries, .. }) => entries
                        .iter()
                        .rev()
                        .map(|e| e.0)
                        .take_while(|&ms| ms >= cutoff)
                        .take(usize::try_from(limit).unwrap_or(usize::MAX).saturating_add(1))
                        .collect(),
                    _ => Vec::new(),
                };
                let len = waiting.len() as u64;
                let slots = u64::from(cost > 0);
                let ok = len + slots <= limit;
                let stale_at = |ms: u64| ms * 1_000 + window - now;
                let reset0 = waiting.first().map_or(0, |&ms| stale_at(ms));
                let retry = if slots > limit {
                    None
                } else if ok {
                    Some(0)
                } else {
                    Some(stale_at(waiting[(limit - slots) as usize]))
                };
                Check {
                    ok,
                    used0: len,
                    used: len + slots,
                    rem0: limit.saturating_sub(len),
                    rem1: limit.saturating_sub(len + slots),
                    reset0,
                    reset1: if slots > 0 { stale_at(now / 1_000) } else { reset0 },
                    retry,
                    write: Write::Queue,
                }
            }
        }
    }

    /// Applies a hit of `cost` (the bounded one) that `check` found.
    fn commit(&mut self, t: &TierSpec, check: &Check, now: u64, cost: u64, hit: &Hit) -> Option<String> {
        let key = t.key.as_str();
        let window = t.window_us;
        match &check.write {
            Write::Fixed { start, n, reset } => {
                let expires = match self.live(key, now) {
                    Some(_) if *n > 0 => self.entries[key].expires_at_us,
                    _ => now + ceil_ms_us(*reset),
                };
                self.set(
                    key,
                    State::Fixed {
                        w: *start,
                        n: n.saturating_add(cost).min(MAX_COUNT),
                    },
                    expires,
                );
                None
            }
            Write::Sliding { start, c, p } => {
                let state = State::Sliding {
                    w: *start,
                    c: c + cost,
                    p: *p,
                };
                self.set(key, state, now + ceil_ms_us(start + 2 * window - now));
                None
            }
            Write::Log => {
                let expires = now + ceil_ms_us(window);
                let add = |log: &mut VecDeque<u64>| {
                    log.retain(|&ts| ts + window > now);
                    // Kept in time order, as the sorted set is, even if the clock stepped back.
                    let at = log.partition_point(|&ts| ts <= now);
                    for _ in 0..cost {
                        log.insert(at, now);
                    }
                };
                match self.live_mut(key, now) {
                    Some(Entry {
                        state: State::Log(log),
                        expires_at_us,
                    }) => {
                        add(log);
                        *expires_at_us = expires;
                    }
                    _ => {
                        let mut log = VecDeque::new();
                        add(&mut log);
                        self.set(key, State::Log(log), expires);
                    }
                }
                None
            }
            Write::Tat(new) => {
                self.set(key, State::Tat(*new), now + ceil_ms_us(new - now));
                None
            }
            Write::Lease => {
                let expires = now + ceil_ms_us(window);
                let take = |leases: &mut Vec<(String, u64)>| {
                    leases.retain(|l| l.1 > now);
                    match leases.iter_mut().find(|l| l.0 == hit.lease) {
                        Some(l) => l.1 = now + window,
                        None => leases.push((hit.lease.clone(), now + window)),
                    }
                };
                match self.live_mut(key, now) {
                    Some(Entry {
                        state: State::Leases(leases),
                        expires_at_us,
                    }) => {
                        take(leases);
                        *expires_at_us = expires;
                    }
                    _ => {
                        let mut leases = Vec::new();
                        take(&mut leases);
                        self.set(key, State::Leases(leases), expires);
                    }
                }
                Some(hit.lease.clone())
            }
            Write::Queue => {
                let (mut entries, last) = match self.live(key, now) {
                    Some(State::Queue { entries, last }) => (entries.clone(), *last),
                    _ => (VecDeque::new(), (0, 0)),
                };
                let cutoff = queue_cutoff(now, window);
                entries.retain(|e| e.0 >= cutoff);
                let ms = now / 1_000;
                // As XADD `<ms>-*`: a new millisecond starts at sequence 0; a clock behind the last id appends after it.
                let id = match ms.cmp(&last.0) {
                    std::cmp::Ordering::Greater => (ms, 0),
                    _ => (last.0, last.1 + 1),
                };
                entries.push_back(id);
                self.set(key, State::Queue { entries, last: id }, now + ceil_ms_us(window));
                Some(format!("{}-{}", id.0, id.1))
            }
        }
    }
}

/// The smallest entry millisecond still waiting at `now`: an entry is stale once `ms * 1000 + window <= now`.
fn queue_cutoff(now: u64, window: u64) -> u64 {
    now.saturating_sub(window) / 1_000 + 1
}

fn retry(never: bool, ok: bool, wait: u64) -> Option<u64> {
    if never {
        None
    } else if ok {
        Some(0)
    } else {
        Some(wait)
    }
}

/// The sliding window's count at `elapsed` into the current window: the previous window's hits weighted by the
/// part of it still inside the sliding interval, plus the current window's. The same expression, evaluated in the
/// same order, as `lua/sliding_window.lua`, so both round alike.
fn sw_estimate(p: u64, c: u64, elapsed: u64, window: u64) -> u64 {
    (p as f64 * (window - elapsed) as f64 / window as f64).floor() as u64 + c
}

/// The first offset in `[lo, hi)` where the estimate is at most `need`, by binary search (it never grows).
fn sw_first_fit(p: u64, c: u64, window: u64, mut lo: u64, mut hi: u64, need: u64) -> Option<u64> {
    if lo >= hi || sw_estimate(p, c, hi - 1, window) > need {
        return None;
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if sw_estimate(p, c, mid, window) <= need {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn hit(&self, now_us: u64, hits: &[Hit]) -> Answers {
        hits.iter().map(|h| Ok(self.decide(now_us, h, false))).collect()
    }

    async fn peek(&self, now_us: u64, hits: &[Hit]) -> Answers {
        hits.iter().map(|h| Ok(self.decide(now_us, h, true))).collect()
    }

    async fn release(&self, keys: &[CounterKey], lease: &str) -> Result<u64, StoreError> {
        let mut released = 0;
        for key in keys {
            let mut shard = lock(&self.shards[(key.tag() % SHARDS as u64) as usize]);
            if let Some(Entry {
                state: State::Leases(leases),
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

    async fn reset(&self, keys: &[CounterKey]) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for key in keys {
            let mut shard = lock(&self.shards[(key.tag() % SHARDS as u64) as usize]);
            deleted += u64::from(shard.entries.remove(key.as_str()).is_some());
        }
        Ok(deleted)
    }

    async fn reset_idle_streams(&self, now_us: u64, keys: &[CounterKey]) -> Result<StreamReset, StoreError> {
        let mut reset = StreamReset::default();
        for key in keys {
            let mut shard = lock(&self.shards[(key.tag() % SHARDS as u64) as usize]);
            match shard.live(key.as_str(), now_us) {
                Some(State::Queue { entries, .. }) if !entries.is_empty() => reset.kept.push(key.clone()),
                _ => {
                    let removed = shard.entries.remove(key.as_str());
                    reset.deleted += u64::from(removed.is_some_and(|e| e.expires_at_us > now_us));
                }
            }
        }
        Ok(reset)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(expires_at_us: u64) -> Entry {
        Entry {
            state: State::Fixed { w: 0, n: 1 },
            expires_at_us,
        }
    }

    #[test]
    fn states_that_expire_together_are_evicted_a_batch_per_access() {
        let mut shard = Shard::default();
        for i in 0..40 {
            shard.insert(&format!("k{i}"), fixed(10));
        }
        shard.sweep(9);
        assert_eq!(shard.entries.len(), 40, "nothing is due yet");
        let mut left = vec![];
        for _ in 0..3 {
            shard.sweep(10);
            left.push(shard.entries.len());
        }
        assert_eq!(left, [40 - SWEEP_BATCH, 40 - 2 * SWEEP_BATCH, 0]);
        assert!(shard.schedule.is_empty());
    }

    #[test]
    fn a_state_whose_expiry_moved_later_is_scheduled_again_not_evicted() {
        let mut shard = Shard::default();
        shard.insert("k", fixed(10));
        shard.set("k", State::Tat(30), 30);
        shard.sweep(20);
        assert!(shard.live("k", 20).is_some());
        assert_eq!(shard.schedule.len(), 1);
        assert_eq!(shard.schedule.peek().map(|Reverse((due, _))| *due), Some(30));
        shard.sweep(30);
        assert!(shard.entries.is_empty() && shard.schedule.is_empty());
    }

    #[test]
    fn a_key_reset_and_written_again_is_still_evicted() {
        let mut shard = Shard::default();
        shard.insert("k", fixed(10));
        shard.entries.remove("k");
        shard.insert("k", fixed(20));
        shard.sweep(15);
        assert!(
            shard.live("k", 15).is_some(),
            "the stale item leaves the new state alone"
        );
        shard.sweep(20);
        assert!(shard.entries.is_empty() && shard.schedule.is_empty());
    }
}
