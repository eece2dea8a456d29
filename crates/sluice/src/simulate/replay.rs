//! One candidate's run: the traffic replayed through the decision core over the in-memory store, on a clock the
//! replay moves to each request's time, with the domain's limits counted by the candidate's algorithm.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::traffic::Traffic;
use crate::clock::ManualClock;
use crate::config::{ConfigFile, RawDescriptor};
use crate::limiter::{Code, Decision, Descriptor, Limiter, LimiterSettings, Request};
use crate::metrics::Metrics;
use crate::rules::{Algorithm, Limit, RuleSet};
use crate::store::memory::MemoryStore;

/// The replay's time zero: a day boundary, so every window (aligned to the Unix epoch) starts with the traffic.
pub const START_US: u64 = 1_767_225_600_000_000;

/// The resolution of the per-interval counts: 100 ms.
pub const TICK_US: u64 = 100_000;

/// What one candidate did to the traffic.
pub struct Run {
    /// The algorithm, and whether it is the rule's own.
    pub algorithm: Algorithm,
    pub own: bool,
    /// The limit the traffic's descriptor met (its first), as the candidate counts it.
    pub limit: Limit,
    /// The whole seconds the per-second figures cover ([`Traffic::charted_seconds`]).
    pub charted_seconds: usize,
    /// Per 100 ms, every key together, over the traffic's seconds.
    pub admitted: Vec<u32>,
    pub denied: Vec<u32>,
    /// Per 100 ms, what the busiest keys (up to [`TRACKED_KEYS`], by requests) had admitted: their limits are the
    /// ones a window's figures are measured against.
    pub admitted_by_key: Vec<Vec<u32>>,
    /// Per key: requests, admitted.
    pub per_key: Vec<(u64, u64)>,
    /// For the leaky bucket: how long each admitted request waits in a queue served at the limit's rate, in
    /// microseconds: one queue per key, served one request every emission interval, a request waiting exactly for
    /// the ones ahead of it.
    pub delays_us: Vec<u64>,
    pub elapsed: Duration,
}

/// The most keys whose windows are measured one by one.
pub const TRACKED_KEYS: usize = 20;

/// The configuration with every limit of `domain` counted by `algorithm`: a bucket's `burst` (a bucketed window's
/// `buckets`) is `burst` when given, the limit's own otherwise; other algorithms have none.
pub fn with_algorithm(files: &[ConfigFile], domain: &str, algorithm: Algorithm, burst: Option<u32>) -> Vec<ConfigFile> {
    fn rewrite(d: &mut RawDescriptor, algorithm: Algorithm, burst: Option<u32>) {
        let limits = d
            .rate_limit
            .iter_mut()
            .map(|b| &mut **b)
            .chain(d.rate_limits.iter_mut().flatten());
        for rl in limits {
            rl.algorithm = Some(algorithm.name().into());
            rl.burst = if algorithm.is_bucket() {
                burst.or(rl.burst)
            } else {
                None
            };
            // A bucketed window's number after ':' is its sub-windows', the default when it has none.
            rl.buckets = if algorithm.has_sub_windows() {
                burst.or(rl.buckets)
            } else {
                None
            };
        }
        d.descriptors.iter_mut().for_each(|c| rewrite(c, algorithm, burst));
    }
    let mut files = files.to_vec();
    for file in files.iter_mut().filter(|f| f.domain.domain == domain) {
        file.domain
            .descriptors
            .iter_mut()
            .for_each(|d| rewrite(d, algorithm, burst));
    }
    files
}

/// Replays `traffic` against `rules`.
pub fn replay(rules: RuleSet, traffic: &Traffic, algorithm: Algorithm, own: bool) -> Result<Run, String> {
    let limit = first_limit(&rules, traffic)?;
    let clock = Arc::new(ManualClock::new(START_US));
    let settings = LimiterSettings {
        local_cache_size: 0,
        top_offenders: 0,
        ..LimiterSettings::default()
    };
    let limiter = Limiter::new(
        rules,
        MemoryStore::new(),
        clock.clone(),
        Metrics::discarded(0.8),
        settings,
    );
    let requests = requests(traffic);
    // Every arrival is before the traffic's end: no interval past it.
    let ticks = (traffic.seconds * 1_000_000).div_ceil(TICK_US) as usize;
    let tracked = tracked(traffic);
    let mut run = Run {
        algorithm,
        own,
        limit,
        charted_seconds: traffic.charted_seconds as usize,
        admitted: vec![0; ticks],
        denied: vec![0; ticks],
        admitted_by_key: vec![vec![0; ticks]; traffic.keys.len().min(TRACKED_KEYS)],
        per_key: vec![(0, 0); traffic.keys.len()],
        delays_us: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let mut queues = algorithm.spaces_hits().then(|| Queues::new(&limit, traffic.keys.len()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let start = Instant::now();
    runtime.block_on(async {
        for &(t, k) in &traffic.arrivals {
            clock.set(START_US + t);
            let decision = limiter
                .decisions()
                .should_rate_limit(&requests[k as usize])
                .await
                .map_err(|e| format!("the limiter refused a request: {e}"))?;
            let tick = (t / TICK_US) as usize;
            let admitted = run.record(&decision, tick, k as usize, tracked[k as usize]);
            if let (true, Some(queues)) = (admitted, queues.as_mut()) {
                run.delays_us.push(queues.admit(k as usize, t));
            }
        }
        Ok::<(), String>(())
    })?;
    run.elapsed = start.elapsed();
    Ok(run)
}

/// The limit the traffic's descriptor meets first: the first tier of the rule its first key matches.
fn first_limit(rules: &RuleSet, traffic: &Traffic) -> Result<Limit, String> {
    let domain = rules
        .domain(&traffic.domain)
        .ok_or_else(|| format!("domain '{}': no configuration file defines it", traffic.domain))?;
    let first = [(traffic.key.as_str(), traffic.keys[0].as_str())];
    let rule = domain
        .find(&first)
        .map(|m| m.rule)
        .ok_or_else(|| format!("domain '{}' has no rule for key '{}'", traffic.domain, traffic.key))?;
    rule.tiers
        .first()
        .map(|t| t.limit)
        .ok_or_else(|| format!("the rule '{}' is unlimited: nothing to simulate", rule.path))
}

/// One request per key, each carrying the traffic's descriptor with that key's value.
fn requests(traffic: &Traffic) -> Vec<Request> {
    traffic
        .keys
        .iter()
        .map(|k| Request {
            domain: traffic.domain.clone(),
            descriptors: vec![Descriptor {
                entries: vec![(traffic.key.clone(), k.clone())],
                ..Descriptor::default()
            }],
            hits_addend: 0,
        })
        .collect()
}

/// Per key, its slot among the busiest keys (the first [`TRACKED_KEYS`] by requests, ties to the lower index), or
/// `usize::MAX` when it is not among them.
fn tracked(traffic: &Traffic) -> Vec<usize> {
    let mut demand: Vec<(u64, usize)> = vec![(0, 0); traffic.keys.len()];
    for (i, d) in demand.iter_mut().enumerate() {
        d.1 = i;
    }
    for &(_, k) in &traffic.arrivals {
        demand[k as usize].0 += 1;
    }
    demand.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut tracked = vec![usize::MAX; traffic.keys.len()];
    for (slot, &(_, k)) in demand.iter().take(TRACKED_KEYS).enumerate() {
        tracked[k] = slot;
    }
    tracked
}

impl Run {
    /// Counts a decision on key `key` (tracked in `slot`, if any) in 100 ms interval `tick`; whether it was admitted.
    fn record(&mut self, decision: &Decision, tick: usize, key: usize, slot: usize) -> bool {
        let counts = &mut self.per_key[key];
        counts.0 += 1;
        if decision.overall == Code::Ok {
            self.admitted[tick] += 1;
            counts.1 += 1;
            if let Some(counts) = self.admitted_by_key.get_mut(slot) {
                counts[tick] += 1;
            }
            true
        } else {
            self.denied[tick] += 1;
            false
        }
    }
}

/// The queue a leaky bucket stands for, one per key: served at the limit's rate, one request every emission interval
/// (the window over the limit, rounded up to a microsecond as the bucket rounds it, so the queue and the bucket agree
/// on who is admitted). An admitted request waits for the ones ahead of it; a request that finds the queue empty is
/// served at once.
struct Queues {
    interval_us: u64,
    /// Per key, when its queue is empty again (microseconds from the start).
    empty_at_us: Vec<u64>,
}

impl Queues {
    fn new(limit: &Limit, keys: usize) -> Queues {
        Queues {
            interval_us: limit.window_us().div_ceil(u64::from(limit.requests.max(1))),
            empty_at_us: vec![0; keys],
        }
    }

    /// A request on `key` admitted at `t_us`: how long it waits, in microseconds. It holds the queue for one interval.
    fn admit(&mut self, key: usize, t_us: u64) -> u64 {
        let empty_at = &mut self.empty_at_us[key];
        let wait = empty_at.saturating_sub(t_us);
        *empty_at = (*empty_at).max(t_us) + self.interval_us;
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two requests ahead of a third, one interval (100 ms) apart in service: the third waits what is left of the
    /// first's service and all of the second's, to the microsecond.
    #[test]
    fn a_queue_waits_exactly_for_the_requests_ahead() {
        let mut queues = Queues {
            interval_us: 100_000,
            empty_at_us: vec![0; 2],
        };
        assert_eq!(queues.admit(0, 1_000_000), 0);
        assert_eq!(queues.admit(0, 1_030_000), 70_000);
        assert_eq!(queues.admit(0, 1_050_000), 150_000);
        // Another key has a queue of its own; an idle queue is empty again.
        assert_eq!(queues.admit(1, 1_050_000), 0);
        assert_eq!(queues.admit(0, 2_000_000), 0);
    }
}
