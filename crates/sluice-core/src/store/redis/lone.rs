//! The compact forms of the commonest calls: a hit on a descriptor with one limit and nothing else to write, a fixed
//! window (`lua/lone_fixed_window.lua`), a token or leaky bucket (`lua/lone_bucket.lua`) or a sliding window
//! (`lua/lone_sliding_window.lua`), or with several fixed windows (a second, a minute and an hour: `lone_windows` in
//! `lua/lone_fixed_window.lua`). Each travels as its keys and two to four numbers per limit instead of the driver's
//! twelve arguments and five per limit, and comes back as integers (a window's count before the hit, the bucket's
//! arrival time before it, the sliding window's two counts) from which sluice makes the decision, exactly as the
//! driver's check would (the differential test holds the two paths to the same answers).

use fred::types::Value;

use crate::rules::Algorithm;
use crate::store::{CounterKey, TierSpec};

/// A lone call: its counter's key (a fixed window's key is built from it when the call is assembled; for several
/// windows, the first's) and what sluice decides it by.
#[derive(Debug, Clone)]
pub(super) struct Lone {
    pub(super) key: CounterKey,
    pub(super) tier: LoneTier,
}

/// What sluice decides a lone call by.
#[derive(Debug, Clone)]
pub(super) enum LoneTier {
    Window(WindowTier),
    Bucket(BucketTier),
    Sliding(SlidingTier),
    /// Several fixed windows, each with its counter's key, decided together.
    Windows(Vec<(CounterKey, WindowTier)>),
    /// A sliding log or a concurrency limit.
    Set(SetTier),
}

/// What sluice needs to decide a lone sliding log or concurrency limit from the live count, the newest place and the
/// place that must leave first (`lua/lone_sorted_set.lua`), as `lua/sliding_log.lua`'s or `lua/concurrency.lua`'s
/// check decides it.
#[derive(Debug, Clone)]
pub(super) struct SetTier {
    /// A sliding log (places are hit times, live for a window); else a concurrency limit (places are lease
    /// deadlines, and any positive cost takes one).
    log: bool,
    limit: u64,
    window_us: u64,
    /// The hit's cost, bounded by the limit + 1.
    cost: u64,
    /// A concurrency limit's lease id.
    lease: String,
    now_us: Option<u64>,
}

/// What sluice needs to decide a lone sliding window from the counts the hit found, as `lua/sliding_window.lua`'s
/// check decides it.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlidingTier {
    limit: u64,
    window_us: u64,
    /// The hit's cost, bounded by the limit + 1.
    cost: u64,
    now_us: Option<u64>,
    /// Another lone call of the same script call hits the same counter (see [`Lone::share`]).
    shared: bool,
}

/// What sluice needs to decide a lone fixed window from the window's count before the hit, as
/// `lua/fixed_window.lua`'s check decides it.
#[derive(Debug, Clone, Copy)]
pub(super) struct WindowTier {
    limit: u64,
    window_us: u64,
    /// The hit's cost, bounded by the limit + 1.
    cost: u64,
    /// The cost counted: `cost`, or 0 for a cost that is not (0 itself, or one above the limit, which never fits).
    pub(super) counted: u64,
    /// The decision's time, or `None` for the server's (which the call's answer carries).
    now_us: Option<u64>,
}

/// What sluice needs to decide a lone token or leaky bucket from the arrival time before the hit, as
/// `lua/token_bucket.lua`'s check decides it.
#[derive(Debug, Clone, Copy)]
pub(super) struct BucketTier {
    /// The emission interval, `ceil(window / limit)`, at least 1.
    interval: u64,
    burst: u64,
    /// The hit's cost, bounded by the burst + 1.
    cost: u64,
    now_us: Option<u64>,
    /// Another lone call of the same script call hits the same bucket (see [`Lone::share`]).
    shared: bool,
}

impl Lone {
    /// The commonest call, a hit on one limit with nothing else to write, in its compact form; `None` when the form
    /// does not apply: another algorithm, a window of 0, a time past i64.
    pub(super) fn of(now_us: Option<u64>, tier: &TierSpec, cost: u64, lease: &str) -> Option<Lone> {
        if !compact(now_us, tier) {
            return None;
        }
        let cost = tier.bounded_cost(cost);
        let tier_of = match tier.algorithm {
            Algorithm::FixedWindow => LoneTier::Window(WindowTier::of(now_us, tier, cost)),
            Algorithm::SlidingWindow => LoneTier::Sliding(SlidingTier {
                limit: tier.limit,
                window_us: tier.window_us,
                cost,
                now_us,
                shared: false,
            }),
            Algorithm::SlidingLog | Algorithm::Concurrency => LoneTier::Set(SetTier {
                log: tier.algorithm == Algorithm::SlidingLog,
                limit: tier.limit,
                window_us: tier.window_us,
                cost,
                lease: lease.to_string(),
                now_us,
            }),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => LoneTier::Bucket(BucketTier {
                interval: tier.window_us.div_ceil(tier.limit.max(1)).max(1),
                burst: tier.burst,
                cost,
                now_us,
                shared: false,
            }),
            _ => return None,
        };
        Some(Lone {
            key: tier.key.clone(),
            tier: tier_of,
        })
    }

    /// A hit on several fixed windows with nothing else to write, in its compact form; `None` when the form does not
    /// apply: another algorithm among them, a window of 0, a time past i64, fewer than two tiers.
    pub(super) fn windows(now_us: Option<u64>, tiers: &[TierSpec], cost: u64) -> Option<Lone> {
        let fits = |t: &TierSpec| t.algorithm == Algorithm::FixedWindow && compact(now_us, t);
        if tiers.len() < 2 || !tiers.iter().all(fits) {
            return None;
        }
        let windows = tiers
            .iter()
            .map(|t| (t.key.clone(), WindowTier::of(now_us, t, t.bounded_cost(cost))))
            .collect();
        Some(Lone {
            key: tiers[0].key.clone(),
            tier: LoneTier::Windows(windows),
        })
    }

    /// Marks a bucket or sliding window that another lone call of the same script call hits too: the script then
    /// reads it once and writes it once for all of them (`lua/lone_bucket.lua`), and a counter hit once is written
    /// at once, with nothing to remember.
    pub(super) fn share(&mut self) {
        match &mut self.tier {
            LoneTier::Bucket(t) => t.shared = true,
            LoneTier::Sliding(t) => t.shared = true,
            LoneTier::Window(_) | LoneTier::Windows(_) | LoneTier::Set(_) => {}
        }
    }

    /// For a counter the script may read and write once for several lone calls of one script call (a bucket, a
    /// sliding window: [`Lone::share`]): its key, and the start of the window its call sees (a sliding window's by
    /// the given time; 0 otherwise, and for the server's clock, which is one for the whole call).
    pub(super) fn share_key(&self) -> Option<(&str, u64)> {
        match &self.tier {
            LoneTier::Bucket(_) => Some((self.key.as_str(), 0)),
            LoneTier::Sliding(t) => Some((self.key.as_str(), t.now_us.map_or(0, |now| now - now % t.window_us))),
            LoneTier::Window(_) | LoneTier::Windows(_) | LoneTier::Set(_) => None,
        }
    }

    /// How many keys [`Lone::push_keys`] pushes.
    pub(super) fn key_count(&self) -> usize {
        match &self.tier {
            LoneTier::Windows(tiers) => tiers.len(),
            LoneTier::Sliding(_) => 2,
            LoneTier::Window(_) | LoneTier::Bucket(_) | LoneTier::Set(_) => 1,
        }
    }

    /// How many places its answer takes in the script's answers (`lua/batch.lua`).
    pub(super) fn width(&self) -> usize {
        match &self.tier {
            LoneTier::Set(_) => 3,
            _ => self.key_count(),
        }
    }

    /// The keys, in the script's form: a fixed window's is its window's key, by the server's clock the window's at
    /// `guess`, this host's time when the call is assembled, which the script checks against the server's; several
    /// windows' are theirs; a sliding window's are its window's and the previous one's, built alike; a bucket's is
    /// its counter's.
    pub(super) fn push_keys(&self, guess: u64, out: &mut Vec<Value>) {
        let start = |now_us: Option<u64>, window_us: u64| {
            let now = now_us.unwrap_or(guess);
            now - now % window_us
        };
        let window = |key: &CounterKey, start: u64| Value::from(String::from(key.window(start)));
        match &self.tier {
            LoneTier::Window(t) => out.push(window(&self.key, start(t.now_us, t.window_us))),
            LoneTier::Windows(tiers) => {
                out.extend(tiers.iter().map(|(key, t)| window(key, start(t.now_us, t.window_us))))
            }
            LoneTier::Sliding(t) => {
                let start = start(t.now_us, t.window_us);
                out.push(window(&self.key, start));
                out.push(window(&self.key, start.saturating_sub(t.window_us)));
            }
            LoneTier::Bucket(_) | LoneTier::Set(_) => out.push(Value::from(self.key.as_str())),
        }
    }

    /// The arguments, in the script's form. A fixed window: the window and the cost counted. A bucket: 'b' ('B'
    /// when shared), the interval, the burst and the cost. A sliding window: 's' ('S' when shared), the window, the
    /// limit and the cost. Several windows: 'w', their number, and each one's window, limit and cost. Then the
    /// decision's time, when it is given.
    pub(super) fn push_args(&self, out: &mut Vec<Value>) {
        let int = |n: u64| Value::Integer(n as i64);
        match &self.tier {
            LoneTier::Window(t) => out.extend([int(t.window_us), int(t.counted)]),
            LoneTier::Bucket(t) => out.extend([
                Value::from(if t.shared { "B" } else { "b" }),
                int(t.interval),
                int(t.burst),
                int(t.cost),
            ]),
            LoneTier::Sliding(t) => out.extend([
                Value::from(if t.shared { "S" } else { "s" }),
                int(t.window_us),
                int(t.limit),
                int(t.cost),
            ]),
            LoneTier::Set(t) => {
                out.extend([
                    Value::from(if t.log { "l" } else { "c" }),
                    int(t.window_us),
                    int(t.limit),
                    int(t.cost),
                ]);
                if !t.log {
                    out.push(Value::from(t.lease.as_str()));
                }
            }
            LoneTier::Windows(tiers) => {
                out.extend([Value::from("w"), int(tiers.len() as u64)]);
                for (_, t) in tiers {
                    out.extend([int(t.window_us), int(t.limit), int(t.cost)]);
                }
            }
        }
        out.extend(self.tier.now_us().map(int));
    }
}

/// Whether a tier's numbers fit a compact form: a window, and a time and window within i64.
fn compact(now_us: Option<u64>, tier: &TierSpec) -> bool {
    tier.window_us > 0 && tier.window_us <= i64::MAX as u64 && now_us.is_none_or(|now| now <= i64::MAX as u64)
}

impl LoneTier {
    /// The decision's time, or `None` for the server's.
    pub(super) fn now_us(&self) -> Option<u64> {
        match self {
            LoneTier::Window(t) => t.now_us,
            LoneTier::Bucket(t) => t.now_us,
            LoneTier::Sliding(t) => t.now_us,
            LoneTier::Windows(tiers) => tiers.first().and_then(|(_, t)| t.now_us),
            LoneTier::Set(t) => t.now_us,
        }
    }

    /// The decision, in `lua/decide.lua`'s answer for one tier, from the script's answer at `now_us` (a fixed
    /// window's count plus `ahead`, the counted costs of the hits ahead of it in a shared count); `None` when the
    /// answer is not of the call's shape (an error, which the caller passes on).
    pub(super) fn answer(&self, value: &Value, ahead: u64, now_us: u64) -> Option<Value> {
        let int = |v: &Value| v.as_i64().map(|n| n.max(0) as u64);
        match (self, value) {
            (LoneTier::Window(t), Value::Integer(n)) => Some(t.answer((*n).max(0) as u64 + ahead, now_us)),
            (LoneTier::Bucket(t), Value::Integer(n)) => Some(t.answer((*n).max(0) as u64, now_us)),
            (LoneTier::Sliding(t), Value::Array(counts)) => match &counts[..] {
                [c, p] => Some(t.answer(int(c)?, int(p)?, now_us)),
                _ => None,
            },
            (LoneTier::Set(t), Value::Array(values)) => match &values[..] {
                [count, newest, first] => Some(t.answer(int(count)?, newest.as_i64()?, first.as_i64()?, now_us)),
                _ => None,
            },
            (LoneTier::Windows(tiers), Value::Array(counts)) if counts.len() == tiers.len() => {
                let counts: Vec<u64> = counts.iter().map(int).collect::<Option<_>>()?;
                Some(windows_answer(tiers, &counts, now_us))
            }
            _ => None,
        }
    }
}

/// One tier's part of `decide.lua`'s answer: ok, used, remaining, reset, retry and entry id.
fn tier_values(ok: bool, used: u64, remaining: u64, reset: u64, retry: i64) -> [Value; 6] {
    let int = |n: u64| Value::Integer(n.min(i64::MAX as u64) as i64);
    [
        Value::Integer(i64::from(ok)),
        int(used),
        int(remaining),
        int(reset),
        Value::Integer(retry),
        Value::from(""),
    ]
}

/// `decide.lua`'s answer for one tier: admitted, then the tier's values ([`tier_values`]).
fn decided(ok: bool, used: u64, remaining: u64, reset: u64, retry: i64) -> Value {
    let mut answer = vec![Value::Integer(i64::from(ok))];
    answer.extend(tier_values(ok, used, remaining, reset, retry));
    Value::Array(answer)
}

/// `decide.lua`'s answer for several fixed windows from their counts before the hit: admitted when every window
/// takes its cost, and then counted in each (`lua/lone_fixed_window.lua`'s lone_windows).
fn windows_answer(tiers: &[(CounterKey, WindowTier)], counts: &[u64], now_us: u64) -> Value {
    let fits = |(t, n): (&WindowTier, u64)| n.saturating_add(t.cost) <= t.limit;
    let pairs = || tiers.iter().map(|(_, t)| t).zip(counts.iter().copied());
    let admitted = pairs().all(fits);
    let counted = admitted && tiers.iter().any(|(_, t)| t.cost > 0);
    let mut answer = Vec::with_capacity(1 + 6 * tiers.len());
    answer.push(Value::Integer(i64::from(admitted)));
    for (t, n) in pairs() {
        let (ok, reset, retry) = t.check(n, now_us);
        // What is left after a counted hit, now otherwise, and 0 where the hit does not fit.
        let remaining = match (ok, counted && t.cost > 0) {
            (false, _) => 0,
            (true, true) => t.limit - n - t.cost,
            (true, false) => t.limit.saturating_sub(n),
        };
        answer.extend(tier_values(ok, n.saturating_add(t.cost), remaining, reset, retry));
    }
    Value::Array(answer)
}

impl WindowTier {
    fn of(now_us: Option<u64>, tier: &TierSpec, cost: u64) -> WindowTier {
        WindowTier {
            limit: tier.limit,
            window_us: tier.window_us,
            cost,
            counted: if cost <= tier.limit { cost } else { 0 },
            now_us,
        }
    }

    /// Whether the hit fits the count `n` before it, the time until the window resets, and the retry time.
    fn check(&self, n: u64, now_us: u64) -> (bool, u64, i64) {
        let start = now_us - now_us % self.window_us;
        let reset = start + self.window_us - now_us;
        let ok = n.saturating_add(self.cost) <= self.limit;
        let retry = if self.cost > self.limit {
            -1
        } else if ok {
            0
        } else {
            reset as i64
        };
        (ok, reset, retry)
    }

    /// The decision from the count `n` before the hit.
    fn answer(&self, n: u64, now_us: u64) -> Value {
        let (ok, reset, retry) = self.check(n, now_us);
        let remaining = if ok { self.limit - n - self.cost } else { 0 };
        decided(ok, n.saturating_add(self.cost), remaining, reset, retry)
    }
}

impl BucketTier {
    /// The decision from the arrival time `tat` the hit found (at least its time): GCRA, in the same integer
    /// arithmetic as the script's check and the memory store's. A hit that fits and costs something was written.
    fn answer(&self, tat: u64, now_us: u64) -> Value {
        let (interval, now) = (self.interval, now_us);
        let tat = tat.max(now);
        let tolerance = self.burst.saturating_mul(interval);
        let over = self.cost > self.burst;
        let reach = if over {
            tat
        } else {
            tat.saturating_add(self.cost.saturating_mul(interval))
        };
        let ok = !over && reach - now <= tolerance;
        let full = now.saturating_add(tolerance);
        let rem0 = full.saturating_sub(tat) / interval;
        let rem1 = if over { 0 } else { full.saturating_sub(reach) / interval };
        let retry = if over {
            -1
        } else if ok {
            0
        } else {
            ((reach - now).saturating_sub(tolerance)).min(i64::MAX as u64) as i64
        };
        let (remaining, reset) = match (ok, self.cost > 0) {
            (true, true) => (rem1, reach - now),
            (true, false) => (rem0, tat - now),
            (false, _) => (0, tat - now),
        };
        decided(ok, self.burst - rem1.min(self.burst), remaining, reset, retry)
    }
}

impl SlidingTier {
    /// The decision from the counts of the current window `c` and the previous one `p` the hit found, by the memory
    /// store's arithmetic (the twin of the script's). A hit that fits and costs something was counted.
    fn answer(&self, c: u64, p: u64, now_us: u64) -> Value {
        let (ok, used, remaining, reset, retry) =
            crate::store::memory::sliding_window_decision(self.limit, self.window_us, now_us, self.cost, c, p);
        let retry = retry.map_or(-1, |r| r.min(i64::MAX as u64) as i64);
        decided(ok, used, remaining, reset, retry)
    }
}

impl SetTier {
    /// The decision from the live count, the newest place (-1: not read) and the place that must leave before the
    /// hit fits (-1: none). A hit that fits and costs something was counted.
    fn answer(&self, count: u64, newest: i64, first: i64, now_us: u64) -> Value {
        let slots = if self.log { self.cost } else { u64::from(self.cost > 0) };
        // A log's place frees a window after its time, a lease at its deadline.
        let life = if self.log { self.window_us } else { 0 };
        let until = |score: i64| (score.max(0) as u64 + life).saturating_sub(now_us);
        let used = count.saturating_add(slots);
        let ok = used <= self.limit;
        let counted = ok && slots > 0;
        let retry = if slots > self.limit {
            -1
        } else if ok {
            0
        } else {
            until(first).min(i64::MAX as u64) as i64
        };
        let (remaining, reset) = match (ok, counted) {
            (true, true) => (self.limit - used, self.window_us),
            (true, false) => (self.limit - count, if count > 0 { until(newest) } else { 0 }),
            (false, _) => (0, if count > 0 { until(newest) } else { 0 }),
        };
        let mut answer = decided(ok, used, remaining, reset, retry);
        if let (true, false, Value::Array(items)) = (counted, self.log, &mut answer) {
            // The tier's entry: the lease it took.
            items[6] = Value::from(self.lease.as_str());
        }
        answer
    }
}
