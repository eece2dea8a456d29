//! The guard around every store call: the circuit breaker of each failure domain (a refused domain's hits answer
//! at once), the local over-limit cache (a denial that still holds answers without a call), and the call's timing,
//! error count and log. The limiter decides; this file is what stands between its decisions and the store.
//!
//! The cache is kept true to what every instance sharing the store does: whatever gives capacity back (a
//! settlement's refund, a reset) is [freed](Guard::freed) here at once and announced to the others, and a task
//! listening to the store's notices drops the denials they name (all of them after a missed notice). While notices
//! cannot be heard (a lost subscription) the cache answers nothing, so a denial never outlives a refund by more than
//! a notice's delivery.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use tracing::Instrument;

use super::global::Regions;
use crate::breaker::Breakers;
use crate::cache::{Denial, LocalCache};
use crate::metrics::Metrics;
use crate::rules::Algorithm;
use crate::store::{Announcements, Answers, Counters, Hit, Notice, Outcome, StoreError, TierOutcome};

/// A store with its breakers, its local cache and its call metrics.
pub struct Guard<S> {
    store: S,
    breakers: Breakers,
    cache: Arc<LocalCache>,
    /// Set once the task that applies the store's notices to the cache runs: started on the first use inside a
    /// runtime (a use outside one leaves the cache unused, and tries again next time).
    listening: OnceLock<()>,
    /// Notices applied to the cache so far.
    heard: Arc<AtomicU64>,
    /// Store call latency, registered once: hits and peeks.
    latency: [metrics::Histogram; 2],
    metrics: Metrics,
    /// Set when this instance is one region of several: the windows of global limits its hits count in are noted
    /// there, to be shipped.
    regions: OnceLock<Arc<Regions>>,
}

impl<S: Counters + Announcements> Guard<S> {
    pub fn new(store: S, breakers: Breakers, cache: LocalCache, metrics: Metrics) -> Guard<S> {
        Guard {
            latency: [
                metrics.store_histogram(store.name(), "hit"),
                metrics.store_histogram(store.name(), "peek"),
            ],
            store,
            breakers,
            cache: Arc::new(cache),
            listening: OnceLock::new(),
            heard: Arc::default(),
            metrics,
            regions: OnceLock::new(),
        }
    }

    /// Makes this instance one region of several (once; a second call changes nothing).
    pub fn join_regions(&self, shared: Arc<Regions>) {
        let _ = self.regions.set(shared);
    }

    /// The regions this instance is one of, if any.
    pub fn regions(&self) -> Option<&Arc<Regions>> {
        self.regions.get()
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn cache(&self) -> &LocalCache {
        &self.cache
    }

    /// Capacity came back to `keys` (a refund, a reset): their denials are dropped here at once, and on every
    /// other instance sharing the store when it hears of it.
    pub async fn freed(&self, keys: Vec<String>) {
        if keys.is_empty() {
            return;
        }
        self.cache.remove(&keys.iter().map(String::as_str).collect::<Vec<_>>());
        self.store.announce(Notice::Freed(keys)).await;
    }

    /// How many notices the cache has applied: what a caller waits on to know that a change announced elsewhere is
    /// in force here.
    pub fn notices_heard(&self) -> u64 {
        self.heard.load(Ordering::Acquire)
    }

    /// Whether the cache may answer: it is on, the task that applies notices runs, and notices are heard now.
    fn trusted(&self) -> bool {
        if self.cache.is_disabled() {
            return false;
        }
        if self.listening.get().is_none() {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return false;
            };
            self.listening.get_or_init(|| {
                let (cache, heard) = (Arc::downgrade(&self.cache), self.heard.clone());
                runtime.spawn(apply_notices(cache, heard, self.store.notices()));
            });
        }
        self.store.hearing()
    }

    /// One store call behind the circuit breakers of the hits' failure domains: the hits of a domain whose breaker
    /// is open are refused at once, the others go to the store together, and each domain's breaker then learns
    /// whether its server answered. One answer per hit, in order.
    pub async fn call(&self, now_us: u64, hits: &[Hit]) -> Answers {
        // A call's hits are all peeks or none (each caller makes them so): timed, traced and logged as its kind.
        let op = if hits.first().is_some_and(Hit::peeks) {
            "peek"
        } else {
            "hit"
        };
        if hits.iter().all(|h| self.store.failure_domain(h) == 0) {
            return self.call_one_domain(op, now_us, hits).await;
        }
        let domains: Vec<u64> = hits.iter().map(|h| self.store.failure_domain(h)).collect();
        let mut breakers = Vec::with_capacity(1);
        for &d in &domains {
            if !breakers.iter().any(|(known, _)| *known == d) {
                breakers.push((d, self.breakers.get(d)));
            }
        }
        // Passes are dropped unrecorded if this future is: an abandoned probe frees its slot (see `breaker`).
        let passes: Vec<_> = breakers.iter().map(|(d, b)| (*d, b.allow(now_us))).collect();
        let allowed = |d: u64| passes.iter().any(|(known, pass)| *known == d && pass.is_some());
        let refused = || Err(StoreError::Connection("circuit breaker open".into()));
        let answers = if domains.iter().all(|&d| allowed(d)) {
            self.timed_call(op, now_us, hits).await
        } else {
            let open: Vec<Hit> = hits
                .iter()
                .zip(&domains)
                .filter(|(_, d)| allowed(**d))
                .map(|(h, _)| h.clone())
                .collect();
            let mut answers = if open.is_empty() {
                Vec::new()
            } else {
                self.timed_call(op, now_us, &open).await
            }
            .into_iter();
            domains
                .iter()
                .map(|&d| {
                    if allowed(d) {
                        answers.next().unwrap_or_else(refused)
                    } else {
                        refused()
                    }
                })
                .collect()
        };
        let mut changed = false;
        for (d, pass) in passes {
            changed |= match pass {
                Some(pass) => {
                    let answered = domains.iter().zip(&answers).filter(|(known, _)| **known == d);
                    pass.record(answered.map(|(_, a)| a).all(reached), now_us)
                }
                None => true,
            };
        }
        if changed {
            self.metrics.breaker_state(self.breakers.state(now_us) as u8);
        }
        answers
    }

    /// [`Guard::call`] for hits that all live on one server (every hit of a store on one server): no per-domain
    /// bookkeeping on the hot path.
    async fn call_one_domain(&self, op: &'static str, now_us: u64, hits: &[Hit]) -> Answers {
        let Some(pass) = self.breakers.first().allow(now_us) else {
            self.metrics.breaker_state(self.breakers.state(now_us) as u8);
            return hits
                .iter()
                .map(|_| Err(StoreError::Connection("circuit breaker open".into())))
                .collect();
        };
        let answers = self.timed_call(op, now_us, hits).await;
        if pass.record(answers.iter().all(reached), now_us) {
            self.metrics.breaker_state(self.breakers.state(now_us) as u8);
        }
        answers
    }

    /// The store call itself, timed, its errors counted and logged.
    async fn timed_call(&self, op: &'static str, now_us: u64, hits: &[Hit]) -> Answers {
        let started = Instant::now();
        let (store, descriptors) = (self.store.name(), hits.len());
        // The store's future is boxed: moved by value through this state machine it cost a large memmove per call.
        let answers = match op {
            "peek" => {
                let span = tracing::debug_span!("store.peek", store, descriptors);
                Box::pin(self.store.hit(now_us, hits)).instrument(span).await
            }
            _ => {
                let span = tracing::debug_span!("store.hit", store, descriptors);
                let answers = Box::pin(self.store.hit(now_us, hits)).instrument(span).await;
                if let Some(regions) = self.regions.get() {
                    regions.note(now_us, hits, &answers);
                }
                answers
            }
        };
        let mut answers = answers;
        answers.resize_with(hits.len(), || {
            Err(StoreError::Other("store returned too few outcomes".into()))
        });
        self.record_store_call(op, started, answers.iter().find_map(|a| a.as_ref().err()));
        let unknown = answers
            .iter()
            .zip(hits)
            .filter(|(a, hit)| !hit.peeks() && a.as_ref().is_err_and(StoreError::may_have_run))
            .count();
        if unknown > 0 {
            self.metrics.unknown_outcomes(store, unknown as u64);
        }
        answers
    }

    /// The worst state of the breakers at `now_us`.
    pub fn breaker_state(&self, now_us: u64) -> crate::breaker::State {
        self.breakers.state(now_us)
    }

    /// Whether decisions can reach the store now: it answers a ping and no failure domain's breaker is open.
    pub async fn ready(&self, now_us: u64) -> Result<(), StoreError> {
        self.store.ping().await?;
        match self.breakers.state(now_us) {
            crate::breaker::State::Open => Err(StoreError::Connection("circuit breaker open".into())),
            _ => Ok(()),
        }
    }

    /// A denial from the local cache, as the outcome the store gave. Never for a forced hit: the store must count it
    /// whatever the limits say.
    pub fn cached(&self, hit: &Hit, now_us: u64) -> Option<Outcome> {
        if hit.reports() || !self.trusted() {
            return None;
        }
        let first = hit.tiers.first()?;
        let denial = self
            .cache
            .get(first.key.as_str(), || limits_fingerprint(hit), hit.cost, now_us)?;
        self.metrics.local_cache_hit();
        let tiers = hit
            .tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let denying = i == denial.tier;
                TierOutcome {
                    ok: !denying,
                    used: if denying { t.limit.saturating_add(hit.cost) } else { 0 },
                    remaining: 0,
                    reset_after_us: if denying {
                        denial.reset_at_us.saturating_sub(now_us)
                    } else {
                        0
                    },
                    retry_after_us: Some(if denying { denial.until_us - now_us } else { 0 }),
                    id: None,
                    own: None,
                }
            })
            .collect();
        Some(Outcome {
            admitted: false,
            tiers,
            records: Vec::new(),
        })
    }

    /// Remembers a denial whose end is known and cannot come early (see [`crate::cache`]), made by a request that
    /// started in the cache's `generation`. Not a forced hit's: it was counted, not refused.
    pub fn remember(&self, hit: &Hit, outcome: &Outcome, now_us: u64, generation: u64) {
        let exact = |a: Algorithm| !a.ended_by_clients();
        if !self.trusted()
            || outcome.admitted
            || hit.reports()
            || hit.cost == 0
            || !hit.tiers.iter().all(|t| exact(t.algorithm))
        {
            return;
        }
        let (tier, denied) = constraining(outcome);
        if let (Some(first), Some(retry)) = (hit.tiers.first(), denied.retry_after_us) {
            let denial = Denial {
                limits: limits_fingerprint(hit),
                until_us: now_us.saturating_add(retry),
                cost: hit.cost,
                tier,
                reset_at_us: now_us.saturating_add(denied.reset_after_us),
            };
            self.cache.insert(first.key.as_str(), denial, now_us, generation);
        }
    }

    fn record_store_call(&self, op: &'static str, started: Instant, error: Option<&StoreError>) {
        self.latency[usize::from(op == "peek")].record(started.elapsed().as_secs_f64());
        if let Some(e) = error {
            self.metrics.store_error(self.store.name(), e.kind());
            tracing::warn!(store = self.store.name(), op, error = %e, "store call failed");
        }
    }
}

/// The tier that decides a descriptor's status: when admitted, the one with the least left (then the longest
/// reset); when denied, the one that frees up last.
pub fn constraining(outcome: &Outcome) -> (usize, &TierOutcome) {
    let tiers = outcome.tiers.iter().enumerate();
    let chosen = if outcome.admitted {
        tiers.min_by_key(|(_, t)| (t.remaining, std::cmp::Reverse(t.reset_after_us)))
    } else {
        tiers
            .filter(|(_, t)| !t.ok)
            .max_by_key(|(_, t)| t.retry_after_us.unwrap_or(u64::MAX))
    };
    chosen.unwrap_or((0, &outcome.tiers[0]))
}

/// Whether a store's answer means its server answered (an error about this one call, such as a key of the wrong
/// type, still does): what a breaker learns from a call.
fn reached(answer: &Result<Outcome, StoreError>) -> bool {
    answer.as_ref().err().is_none_or(|e| !e.is_unreachable())
}

/// What a cached denial is bound to besides its counter: every limit of the hit (algorithm, size, window, burst).
fn limits_fingerprint(hit: &Hit) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    for t in &hit.tiers {
        (t.algorithm.name(), t.limit, t.window_us, t.burst).hash(&mut h);
    }
    h.finish()
}

/// Applies the store's notices to the cache until the cache or the store is gone.
async fn apply_notices(
    cache: Weak<LocalCache>,
    heard: Arc<AtomicU64>,
    mut notices: tokio::sync::broadcast::Receiver<Notice>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let notice = notices.recv().await;
        let Some(cache) = cache.upgrade() else { return };
        match notice {
            Ok(Notice::Freed(keys)) => cache.remove(&keys.iter().map(String::as_str).collect::<Vec<_>>()),
            Ok(Notice::Missed) | Err(RecvError::Lagged(_)) => cache.clear(),
            Ok(Notice::Quota(_) | Notice::Lists(_) | Notice::Streams(..)) => {}
            Err(RecvError::Closed) => return,
        }
        heard.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::BreakerSettings;
    use crate::store::memory::MemoryStore;
    use crate::store::{CounterKey, TierSpec};

    const NOW: u64 = 1_704_067_210_000_000;

    fn guard() -> Guard<MemoryStore> {
        Guard::new(
            MemoryStore::new(),
            Breakers::new(BreakerSettings::default()),
            LocalCache::new(100),
            Metrics::discarded(0.8),
        )
    }

    fn hit(cost: u64, force: bool) -> Hit {
        let key = CounterKey::builder("t:", "d").entry("k", "v").finish();
        Hit {
            tiers: vec![TierSpec {
                key: key.tier(Algorithm::FixedWindow, 60_000_000),
                algorithm: Algorithm::FixedWindow,
                limit: 2,
                window_us: 60_000_000,
                burst: 2,
                cost: None,
                global: false,
            }],
            cost,
            mode: if force {
                crate::store::Mode::Report
            } else {
                crate::store::Mode::Hit
            },
            ..Hit::default()
        }
    }

    async fn decide(guard: &Guard<MemoryStore>, h: &Hit) -> Outcome {
        let mut answers = guard.call(NOW, std::slice::from_ref(h)).await;
        answers.remove(0).expect("the memory store answers")
    }

    #[tokio::test]
    async fn a_forced_hit_bypasses_the_local_cache() {
        let guard = guard();
        let generation = guard.cache().generation();
        let (normal, forced) = (hit(1, false), hit(1, true));
        for _ in 0..2 {
            assert!(decide(&guard, &normal).await.admitted);
        }
        let denied = decide(&guard, &normal).await;
        assert!(!denied.admitted);
        guard.remember(&normal, &denied, NOW, generation);
        assert!(
            guard.cached(&normal, NOW).is_some(),
            "an ordinary hit is answered from the cache"
        );
        assert!(
            guard.cached(&forced, NOW).is_none(),
            "a forced hit always reaches the store"
        );
        let counted = decide(&guard, &forced).await;
        assert!(!counted.admitted);
        // A lone fixed window counted the denied hit too: 3, and the forced one on top.
        assert_eq!(counted.tiers[0].used, 4, "the store counted it past the limit");
    }

    #[tokio::test]
    async fn a_forced_hit_is_never_remembered_as_a_denial() {
        let guard = guard();
        let generation = guard.cache().generation();
        for _ in 0..2 {
            assert!(decide(&guard, &hit(1, false)).await.admitted);
        }
        let forced = hit(1, true);
        let counted = decide(&guard, &forced).await;
        assert!(!counted.admitted);
        assert!(
            counted.tiers[0].retry_after_us.is_some(),
            "an ordinary hit's denial like this one is cached"
        );
        guard.remember(&forced, &counted, NOW, generation);
        assert!(guard.cached(&hit(1, false), NOW).is_none(), "nothing was remembered");
    }
}
