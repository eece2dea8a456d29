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
//!
//! The file layout mirrors `lua/`: this file is the driver, as `decide.lua` and `batch.lua` are (the store, its
//! shards and their eviction schedule, the decision of one descriptor across its tiers, the hit records, the
//! reservations and their settlement, and the [`Store`] impl); each algorithm's check and commit (and a counting
//! algorithm's refund) is in `memory/<algorithm>.rs`, named as its script; and `memory/prelude.rs`, as
//! `lua/prelude.lua`, holds what they share, including the one "update the state or create it" step
//! (`Keyspace::upsert`) that every commit goes through.

mod concurrency;
mod fixed_window;
mod prelude;
mod queue;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    Answers, CounterKey, Grant, Granted, Hit, ListChange, ListEntry, Notice, Outcome, RESERVATION_GRACE_US,
    RegionCount, SERIES_TTL_US, Settled, Settlement, Span, Store, StoreError, StreamReset, TOP_BUCKET_TTL_US, Tally,
    TierOutcome, TierSettled, TierSpec, WindowRef, fair_shares, granted_amount, ranked,
};
use crate::rules::Algorithm;
use prelude::{
    Check, Expiry, Fixed, Keyspace, Leases, Ledger, Queue, Records, Refund, Reservation, Shape, Sliding, State, Write,
    ceil_ms_us,
};

const SHARDS: usize = 64;
/// States evicted per shard access at most: about the cost of one more lookup, and far more than one access adds.
const SWEEP_BATCH: usize = 16;

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

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<Arc<str>, Entry>,
    /// Every key of `entries` (once, unless a reset or a settlement dropped it and it came back before its item came
    /// due) at the expiry it had when it was scheduled. An item that comes due evicts its state if the state has
    /// expired, and is scheduled again at the state's current expiry otherwise; a state whose expiry moved earlier (a
    /// clock step back, a bucket's refund) is evicted at the later time, and is invisible from its expiry on either
    /// way.
    schedule: BinaryHeap<Reverse<(u64, Arc<str>)>>,
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
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

    fn decide(&self, now: u64, hit: &Hit, peek: bool) -> Outcome {
        let tag = hit.tiers.first().map(|t| t.key.tag()).unwrap_or_default();
        let mut shard = self.shard(tag, now);
        // Each tier's own cost, bounded by its capacity + 1 (`TierSpec::bounded_cost`); the hit is written at all only
        // if one of them is positive.
        let cost = |t: &TierSpec| t.bounded_cost(hit.cost);
        let positive = hit.tiers.iter().any(|t| cost(t) > 0);
        // A forced hit is counted by every tier, fitting or not; what it leaves is reported, even where it did not fit.
        let force = !peek && positive && hit.forced();
        let checks: Vec<Check> = hit
            .tiers
            .iter()
            .map(|t| self.check_tier(&shard, t, now, cost(t), force))
            .collect();
        let admitted = checks.iter().all(|c| c.ok);
        // A lone fixed window counts its denials, as the reference does, except a cost that can never fit.
        // Not when reserving: a refused reservation holds nothing. Nor a global one (`lua/global.lua`).
        let lone_fixed = match hit.tiers.as_slice() {
            [t] => {
                t.algorithm == Algorithm::FixedWindow && !t.global && cost(t) <= t.limit && hit.reservation.is_none()
            }
            _ => false,
        };
        let commit = !peek && positive && (admitted || lone_fixed || force);
        // The reservation record, written as `lua/decide.lua` writes it: for a hit admitted and committed, or forced.
        if let Some(r) = hit.reserves().filter(|_| commit && (admitted || force)) {
            let expires_at = now + ceil_ms_us(r.bounded_ttl_us());
            let expiry = Expiry::Always(expires_at + RESERVATION_GRACE_US);
            let estimates = hit.tier_costs();
            shard.upsert(r.key.as_str(), now, expiry, |state: &mut Reservation| {
                *state = Reservation {
                    estimates,
                    at: now,
                    expires_at,
                }
            });
        }
        let mut longest = 0;
        let mut tiers = Vec::with_capacity(checks.len());
        for (spec, check) in hit.tiers.iter().zip(checks) {
            let (mut remaining, mut reset, mut id) = (check.rem0, check.reset0, None);
            // A tier whose cost is 0 is checked, never written (it takes no lease, appends no entry).
            let cost = cost(spec);
            if commit && cost > 0 {
                id = shard.commit(spec, &check, now, cost, hit);
                (remaining, reset) = (check.rem1, check.reset1);
            }
            if !peek && !force && !check.ok {
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
                let expiry = Expiry::Always(now + ceil_ms_us(longest.max(1)));
                shard.upsert(key, now, expiry, |Records(list): &mut Records| {
                    list.push_front(value.clone());
                    list.truncate(record.size as usize);
                });
            } else if peek {
                if let Some(State::Records(Records(list))) = shard.live(key, now) {
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

    /// A tier's check; a global one's against its limit less what the other regions counted, reporting the sum, as
    /// `lua/global.lua` decides it.
    fn check_tier(&self, shard: &Shard, t: &TierSpec, now: u64, cost: u64, force: bool) -> Check {
        if !t.global {
            return shard.check(t, now, cost, force);
        }
        let window = t.window_us.max(1);
        let start = now - now % window;
        let regions = lock(&self.regions);
        let count = |s: u64| {
            regions
                .get(t.key.regions(s).as_str())
                .filter(|(expires, _)| *expires > now)
                .map_or(0, |(_, counts)| counts.values().sum::<u64>())
        };
        let others = match t.algorithm {
            Algorithm::SlidingWindow => {
                sliding_window::sw_estimate(count(start.saturating_sub(window)), count(start), now - start, window)
            }
            _ => count(start),
        };
        drop(regions);
        let reduced = TierSpec {
            limit: t.limit.saturating_sub(others),
            ..t.clone()
        };
        let mut check = shard.check(&reduced, now, cost, force);
        check.used0 = check.used0.saturating_add(others);
        check.used = check.used.saturating_add(others);
        if check.retry.is_none() && cost <= t.limit {
            check.retry = Some(start + window - now);
        }
        check
    }

    /// Settles one reservation under its descriptor's shard lock, as `settle` in `lua/decide.lua` does.
    fn settle_one(&self, now: u64, settlement: &Settlement) -> Settled {
        let hit = &settlement.hit;
        if !hit.counts() {
            return Settled::Unknown;
        }
        let key = settlement.reservation.as_str();
        // The shard `decide` wrote the record in: its tiers' (the record shares their hash tag).
        let tag = hit.tiers.first().map(|t| t.key.tag()).unwrap_or_default();
        let mut shard = self.shard(tag, now);
        let (estimates, at) = match shard.live(key, now) {
            // One estimate per tier, or the settlement names other tiers than the reservation: left as it is. A
            // settlement finds only a live reservation, a reaping only an expired one.
            Some(State::Reservation(r))
                if r.estimates.len() == hit.tiers.len() && (r.expires_at <= now) == settlement.reap =>
            {
                (r.estimates.clone(), r.at)
            }
            _ => return Settled::Unknown,
        };
        // Reaped: settled at the estimates, which changes no tier.
        let actuals = if settlement.reap {
            estimates.clone()
        } else {
            hit.tier_costs()
        };
        let mut settled: Vec<TierSettled> = estimates
            .iter()
            .zip(actuals)
            .map(|(&estimate, actual)| TierSettled::new(estimate, actual))
            .collect();
        // Every tier is read before any is written, as the script does (there a key of the wrong type stops the
        // settlement before it changes anything): a tier charged more is counted as a forced hit of the difference,
        // a tier charged less gives the difference back.
        let checks: Vec<Option<Check>> = hit
            .tiers
            .iter()
            .zip(&settled)
            .map(|(t, s)| (s.charged > 0).then(|| shard.check(t, now, s.charged, true)))
            .collect();
        let refunds: Vec<Option<Refund>> = hit
            .tiers
            .iter()
            .zip(&settled)
            .map(|(t, s)| (s.refunded > 0).then(|| shard.refund(t, now, at, s.refunded)).flatten())
            .collect();
        // What is reported as refunded is what came back to a window still in force.
        for (s, refund) in settled.iter_mut().zip(&refunds) {
            s.refunded = refund.as_ref().map_or(0, |r| r.given);
        }
        shard.entries.remove(key);
        for (((spec, s), check), refund) in hit.tiers.iter().zip(&settled).zip(&checks).zip(refunds) {
            if let Some(check) = check {
                shard.commit(spec, check, now, s.charged, hit);
            }
            if let Some(refund) = refund {
                shard.give_back(spec, now, refund);
            }
        }
        // Each tier as a peek of cost 1 reports it.
        let checks: Vec<Check> = hit.tiers.iter().map(|t| shard.check(t, now, 1, false)).collect();
        let outcome = Outcome {
            admitted: checks.iter().all(|c| c.ok),
            tiers: checks
                .into_iter()
                .map(|c| TierOutcome {
                    ok: c.ok,
                    used: c.used0,
                    remaining: c.rem0,
                    reset_after_us: c.reset0,
                    retry_after_us: c.retry,
                    id: None,
                })
                .collect(),
            records: Vec::new(),
        };
        Settled::Done {
            tiers: settled,
            outcome,
        }
    }
}

impl MemoryStore {
    /// One grant under its bucket's shard lock, as `grant` in `lua/ledger.lua` does: what is left is read and the
    /// ledger updated in one step.
    fn grant_one(&self, now: u64, grant: &Grant) -> Granted {
        let mut shard = self.shard(grant.ledger.tag(), now);
        let left = grant
            .tiers
            .iter()
            .map(|t| shard.check(t, now, 0, false).rem0)
            .min()
            .unwrap_or(0);
        let key = grant.ledger.as_str();
        let mut entries = match shard.live(key, now) {
            Some(State::Ledger(Ledger(entries))) => entries.clone(),
            _ => Default::default(),
        };
        entries.retain(|_, e| e.2 > now);
        let previous = entries.remove(&grant.holder).map_or(0, |e| e.0);
        // A holder holds at most what its entry says it was granted.
        let (held, want) = (grant.held.min(previous), grant.want);
        let mut granted = Granted {
            left,
            holders: entries.len() as u64,
            total_held: entries.values().map(|e| e.0).sum(),
            ..Granted::default()
        };
        if want > 0 {
            let mut wants: Vec<(&str, u64)> = entries.iter().map(|(h, e)| (h.as_str(), e.1)).collect();
            wants.push((&grant.holder, want));
            let shares = fair_shares(left, &wants);
            let others: Vec<(u64, u64)> = entries.values().zip(&shares).map(|(e, &s)| (e.0, s)).collect();
            let share = shares[shares.len() - 1];
            let amount = granted_amount(left, held, share, &others);
            // Tokens handed out are not taken back before the holder reports them unspent.
            let entry = amount.max(held);
            granted = Granted {
                held: amount,
                share,
                entry,
                holders: granted.holders + 1,
                total_held: granted.total_held + entry,
                ..granted
            };
            entries.insert(grant.holder.clone(), (entry, want, now + grant.ttl_us));
        }
        let until = entries.values().map(|e| e.2).max().unwrap_or(now);
        shard.upsert(key, now, Expiry::Always(until), |Ledger(ledger): &mut Ledger| {
            *ledger = entries;
        });
        granted
    }
}

/// A lone sliding window's decision for the Redis store's compact form (`store/redis/lone.rs`), from the counts `c`
/// of the current window and `p` of the previous one that a hit of `cost` found at `now`, by this store's arithmetic
/// (the twin of the script's): whether it fits, then the count after it, what is left, the time until the counts
/// are empty and until a hit of `cost` fits (`None`: never), as `lua/decide.lua` answers an ordinary hit.
pub(super) fn sliding_window_decision(
    limit: u64,
    window: u64,
    now: u64,
    cost: u64,
    c: u64,
    p: u64,
) -> (bool, u64, u64, u64, Option<u64>) {
    let s = sliding_window::check_counts(limit, window, now, cost, c, p);
    let (remaining, reset) = match (s.ok, cost > 0) {
        (true, true) => (s.rem1, s.reset1),
        (true, false) => (s.rem0, s.reset0),
        (false, _) => (0, s.reset0),
    };
    (s.ok, s.used, remaining, reset, s.retry)
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

    /// What a tier's hit would find, by its algorithm's check; `force`: what a forced hit would leave (only a
    /// bucket's check needs to know: the counts' commits take a cost that does not fit as it is).
    fn check(&self, t: &TierSpec, now: u64, cost: u64, force: bool) -> Check {
        let state = self.live(t.key.as_str(), now);
        match t.algorithm {
            Algorithm::FixedWindow => fixed_window::check(state, t, now, cost),
            Algorithm::SlidingWindow => sliding_window::check(state, t, now, cost),
            Algorithm::SlidingLog => sliding_log::check(state, t, now, cost),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => token_bucket::check(state, t, now, cost, force),
            Algorithm::Concurrency => concurrency::check(state, t, now, cost),
            Algorithm::Queue => queue::check(state, t, now, cost),
        }
    }

    /// Applies a hit of `cost` (the bounded one) that `check` found, by its algorithm's commit.
    fn commit(&mut self, t: &TierSpec, check: &Check, now: u64, cost: u64, hit: &Hit) -> Option<String> {
        match check.write {
            Write::Fixed { start, n, reset } => fixed_window::commit(self, t, now, cost, start, n, reset),
            Write::Sliding { start, c, p } => sliding_window::commit(self, t, now, cost, start, c, p),
            Write::Log => sliding_log::commit(self, t, now, cost),
            Write::Tat(new) => token_bucket::commit(self, t, now, new),
            Write::Lease => return Some(concurrency::commit(self, t, now, &hit.lease)),
            Write::Queue => return Some(queue::commit(self, t, now)),
        }
        None
    }

    /// What a settlement's refund of `amount`, charged at `at`, would write to a counting tier, by its algorithm's
    /// refund; `None` for nothing (and for the algorithms that do not count, which a settlement never reaches).
    fn refund(&self, t: &TierSpec, now: u64, at: u64, amount: u64) -> Option<Refund> {
        let state = self.live(t.key.as_str(), now);
        match t.algorithm {
            Algorithm::FixedWindow => fixed_window::refund(state, t, now, at, amount),
            Algorithm::SlidingWindow => sliding_window::refund(state, t, now, at, amount),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => token_bucket::refund(state, t, now, at, amount),
            Algorithm::SlidingLog | Algorithm::Concurrency | Algorithm::Queue => None,
        }
    }

    /// Writes a refund over the tier's live state, which `refund` found: never creates one.
    fn give_back(&mut self, t: &TierSpec, now: u64, refund: Refund) {
        if let Some(entry) = self.live_mut(t.key.as_str(), now) {
            entry.state = refund.state;
            if let Some(at) = refund.expires_at_us {
                entry.expires_at_us = at;
            }
        }
    }
}

impl Keyspace for Shard {
    fn upsert<T: Shape, R>(&mut self, key: &str, now: u64, expiry: Expiry, update: impl FnOnce(&mut T) -> R) -> R {
        if let Some(entry) = self.live_mut(key, now)
            && let Some(state) = T::of(&mut entry.state)
        {
            let out = update(state);
            if let Expiry::Always(at) = expiry {
                entry.expires_at_us = at;
            }
            return out;
        }
        let mut state = T::default();
        let out = update(&mut state);
        let (Expiry::Always(at) | Expiry::OnCreate(at)) = expiry;
        self.set(key, state.into(), at);
        out
    }
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
                state: State::Leases(Leases(leases)),
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

    async fn settle(&self, now_us: u64, settlements: &[Settlement]) -> Vec<Result<Settled, StoreError>> {
        settlements.iter().map(|s| Ok(self.settle_one(now_us, s))).collect()
    }

    async fn grant(&self, now_us: u64, grants: &[Grant]) -> Vec<Result<Granted, StoreError>> {
        grants.iter().map(|g| Ok(self.grant_one(now_us, g))).collect()
    }

    async fn announce(&self, notice: Notice) {
        // No listener is not an error: nothing keeps state beside the store.
        let _ = self.notices.send(notice);
    }

    fn notices(&self) -> tokio::sync::broadcast::Receiver<Notice> {
        self.notices.subscribe()
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
                Some(State::Queue(Queue { entries, .. })) if !entries.is_empty() => reset.kept.push(key.clone()),
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

    async fn window_counts(&self, now_us: u64, windows: &[WindowRef]) -> Result<Vec<u64>, StoreError> {
        let now = now_us;
        Ok(windows
            .iter()
            .map(|w| {
                let shard = lock(&self.shards[(w.key.tag() % SHARDS as u64) as usize]);
                match shard.live(w.key.as_str(), now) {
                    Some(State::Fixed(Fixed { w: start, n })) if *start == w.start_us => *n,
                    Some(State::Sliding(Sliding { w: start, c, .. })) if *start == w.start_us => *c,
                    Some(State::Sliding(Sliding { w: start, p, .. })) if *start == w.start_us + w.window_us => *p,
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

#[cfg(test)]
mod tests {
    use super::prelude::{Fixed, Log, MAX_COUNT, MAX_SLIDING_COUNT, Sliding, Tat};
    use super::*;

    /// The twin of `redis_forced_counts_stop_at_their_bounds` in `tests/contract.rs`: the same seeded counts, the same
    /// answers.
    #[test]
    fn forced_counts_stop_at_their_bounds() {
        let (now, minute) = (1_704_067_210_000_000, 60_000_000);
        let start = now - now % minute;
        let store = MemoryStore::new();
        for (algorithm, seeded, bound) in [
            (
                Algorithm::FixedWindow,
                State::Fixed(Fixed {
                    w: start,
                    n: MAX_COUNT - 1,
                }),
                MAX_COUNT,
            ),
            (
                Algorithm::SlidingWindow,
                State::Sliding(Sliding {
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
                force: true,
                ..Hit::default()
            };
            lock(&store.shards[(key.tag() % SHARDS as u64) as usize]).set(key.as_str(), seeded, now + minute);
            let count = || match lock(&store.shards[(key.tag() % SHARDS as u64) as usize]).live(key.as_str(), now) {
                Some(State::Fixed(f)) => f.n,
                Some(State::Sliding(s)) => s.c,
                other => panic!("{other:?}"),
            };
            let o = store.decide(now, &hit, false);
            assert_eq!(o.tiers[0].used, bound - 1 + 4, "{algorithm:?}: the cost counts as 4");
            assert_eq!(count(), bound, "{algorithm:?}");
            store.decide(now, &hit, false);
            assert_eq!(count(), bound, "{algorithm:?}");
        }
    }

    fn fixed(expires_at_us: u64) -> Entry {
        Entry {
            state: State::Fixed(Fixed { w: 0, n: 1 }),
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
        shard.set("k", State::Tat(Tat(30)), 30);
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

    #[test]
    fn upsert_updates_a_live_state_of_its_shape_and_creates_one_otherwise() {
        let mut shard = Shard::default();
        let count = |shard: &mut Shard, now, expiry| shard.upsert("k", now, expiry, |f: &mut Fixed| f.n += 1);
        count(&mut shard, 0, Expiry::OnCreate(10));
        assert_eq!(shard.schedule.len(), 1, "a new key is scheduled");
        count(&mut shard, 5, Expiry::OnCreate(50));
        assert!(matches!(shard.live("k", 5), Some(State::Fixed(Fixed { n: 2, .. }))));
        assert_eq!(
            shard.entries["k"].expires_at_us, 10,
            "an update keeps an on-create expiry"
        );
        count(&mut shard, 6, Expiry::Always(20));
        assert_eq!(shard.entries["k"].expires_at_us, 20, "and takes an always one");
        count(&mut shard, 20, Expiry::OnCreate(40));
        assert!(
            matches!(shard.live("k", 20), Some(State::Fixed(Fixed { n: 1, .. }))),
            "an expired state is replaced, not updated"
        );
        assert_eq!(shard.entries["k"].expires_at_us, 40);
        shard.upsert("k", 21, Expiry::OnCreate(60), |Log(log): &mut Log| log.push_back(21));
        assert!(
            matches!(shard.live("k", 21), Some(State::Log(_))),
            "another shape is replaced"
        );
        assert_eq!(shard.entries["k"].expires_at_us, 60);
        assert_eq!(shard.schedule.len(), 1, "a key written again is not scheduled twice");
    }
}
