//! The fast forms of the commonest calls, each in its algorithm's script (`store/algorithm/<name>.lua`): a hit on a
//! descriptor with one limit and nothing else to write, a fixed window, a token or leaky bucket or a sliding window
//! (each script's `hit`), or a global fixed or sliding window (the global forms' `hit`), or a reservation or a
//! settlement on fixed windows alone (`fixed_window.lua`'s `reserve` and `settle`). Each travels as its keys and two
//! to four numbers per limit, one fused step where the decision loop (`lua/decide.lua`) takes three, and comes back
//! as integers (a window's count before the hit, the bucket's arrival time before it, the sliding window's two
//! counts) from which sluice makes the [`Outcome`] by each algorithm's own check in `store/algorithm/`, the one the
//! memory store decides by (the differential test holds the fast forms, the loop and the memory store to the same
//! answers).

use fred::types::Value;

use crate::store::Algorithm;
use crate::store::{CounterKey, TierSpec};

mod answer;

/// A call in its compact form: its counter's key (a fixed window's key is built from it when the call is assembled; for several
/// windows, the first's) and what sluice decides it by.
#[derive(Debug, Clone)]
pub(super) struct Compact {
    pub(super) key: CounterKey,
    pub(super) tier: CompactTier,
}

/// What sluice decides a compact call by.
#[derive(Debug, Clone)]
pub(super) enum CompactTier {
    Window(WindowTier),
    Bucket(BucketTier),
    Sliding(SlidingTier),
    /// A global fixed or sliding window.
    Global(GlobalTier),
}

/// What sluice needs to decide a lone global window from its own counts and the other regions' count the hit found
/// (the global forms' `hit`), as the global forms' check decides it ([`algorithm::global_check`]). Calls alike in
/// all of it but `times` are identical hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct GlobalTier {
    /// A sliding window; else a fixed one.
    sliding: bool,
    limit: u64,
    window_us: u64,
    /// The hit's cost, bounded by the limit + 1.
    cost: u64,
    now_us: Option<u64>,
    /// Another compact call of the same script call hits the same counter (see [`Compact::share`]).
    shared: bool,
    /// How many identical hits the call carries, decided one after the other (see `call.rs`'s `coalesce`).
    pub(super) times: u64,
}

/// What sluice needs to decide a lone sliding window from the counts the hit found, as `algorithm/sliding_window.lua`'s
/// check decides it.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlidingTier {
    limit: u64,
    window_us: u64,
    /// The hit's cost, bounded by the limit + 1.
    cost: u64,
    now_us: Option<u64>,
    /// Another compact call of the same script call hits the same counter (see [`Compact::share`]).
    shared: bool,
}

/// What sluice needs to decide a lone fixed window from the window's count before the hit, as
/// `algorithm/fixed_window.lua`'s check decides it.
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
/// `algorithm/token_bucket.lua`'s check decides it.
#[derive(Debug, Clone, Copy)]
pub(super) struct BucketTier {
    /// The emission interval, `ceil(window / limit)`, at least 1.
    interval: u64,
    burst: u64,
    /// The hit's cost, bounded by the burst + 1.
    cost: u64,
    now_us: Option<u64>,
    /// Another compact call of the same script call hits the same bucket (see [`Compact::share`]).
    shared: bool,
}

impl Compact {
    /// A lone fixed window decided by the server's clock: its window and the cost it counts. Several in a row that
    /// share both travel as one run in the declared form (`call::declared`).
    pub(super) fn lone_window(&self) -> Option<(u64, u64)> {
        match &self.tier {
            CompactTier::Window(t) if t.now_us.is_none() => Some((t.window_us, t.counted)),
            _ => None,
        }
    }

    /// The commonest call, a hit on one limit with nothing else to write, in its compact form; `None` when the form
    /// does not apply: another algorithm, a window of 0, a time past i64.
    pub(super) fn of(now_us: Option<u64>, tier: &TierSpec, cost: u64) -> Option<Compact> {
        if !compact(now_us, tier) {
            return None;
        }
        let cost = tier.bounded_cost(cost);
        if tier.global {
            let sliding = match tier.algorithm {
                Algorithm::FixedWindow => false,
                Algorithm::SlidingWindow => true,
                _ => return None,
            };
            let global = GlobalTier {
                sliding,
                limit: tier.limit,
                window_us: tier.window_us,
                cost,
                now_us,
                shared: false,
                times: 1,
            };
            return Some(Compact {
                key: tier.key.clone(),
                tier: CompactTier::Global(global),
            });
        }
        let tier_of = match tier.algorithm {
            Algorithm::FixedWindow => CompactTier::Window(WindowTier::of(now_us, tier, cost)),
            Algorithm::SlidingWindow => CompactTier::Sliding(SlidingTier {
                limit: tier.limit,
                window_us: tier.window_us,
                cost,
                now_us,
                shared: false,
            }),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => CompactTier::Bucket(BucketTier {
                interval: tier.window_us.div_ceil(tier.limit.max(1)).max(1),
                burst: tier.burst,
                cost,
                now_us,
                shared: false,
            }),
            _ => return None,
        };
        Some(Compact {
            key: tier.key.clone(),
            tier: tier_of,
        })
    }

    /// Marks a bucket, sliding window or global window that another compact call of the same script call hits too:
    /// the script then reads it once and writes it once for all of them (`algorithm/token_bucket.lua`), and a counter hit
    /// once is written at once, with nothing to remember.
    pub(super) fn share(&mut self) {
        match &mut self.tier {
            CompactTier::Bucket(t) => t.shared = true,
            CompactTier::Sliding(t) => t.shared = true,
            CompactTier::Global(t) => t.shared = true,
            CompactTier::Window(_) => {}
        }
    }

    /// For a counter the script may read and write once for several compact calls of one script call (a bucket, a
    /// sliding or a global window: [`Compact::share`]): its key, and the start of the window its call sees (a
    /// window's by the given time; 0 otherwise, and for the server's clock, which is one for the whole call).
    pub(super) fn share_key(&self) -> Option<(&str, u64)> {
        match &self.tier {
            CompactTier::Bucket(_) => Some((self.key.as_str(), 0)),
            CompactTier::Sliding(t) => Some((self.key.as_str(), t.now_us.map_or(0, |now| now - now % t.window_us))),
            CompactTier::Global(t) => Some((self.key.as_str(), t.now_us.map_or(0, |now| now - now % t.window_us))),
            CompactTier::Window(_) => None,
        }
    }

    /// How many keys [`Compact::push_keys`] pushes.
    pub(super) fn key_count(&self) -> usize {
        match &self.tier {
            CompactTier::Sliding(_) => 2,
            CompactTier::Global(t) => 1 + usize::from(t.sliding),
            CompactTier::Window(_) | CompactTier::Bucket(_) => 1,
        }
    }

    /// How many places its answer takes in the script's answers (`lua/batch.lua`).
    pub(super) fn width(&self) -> usize {
        match &self.tier {
            // The own counts, then the others'.
            CompactTier::Global(_) => self.key_count() + 1,
            _ => self.key_count(),
        }
    }

    /// The keys, in the script's form: a fixed window's is its window's key, by the server's clock the window's at
    /// `guess`, this host's time when the call is assembled, which the script checks against the server's; several
    /// windows' are theirs; a sliding window's are its window's and the previous one's, built alike; a bucket's is
    /// its counter's; a reservation's or a settlement's are its windows' and its record's.
    pub(super) fn push_keys(&self, guess: u64, out: &mut Vec<Value>) {
        let start = |now_us: Option<u64>, window_us: u64| {
            let now = now_us.unwrap_or(guess);
            now - now % window_us
        };
        let window = |key: &CounterKey, start: u64| Value::from(String::from(key.window(start)));
        match &self.tier {
            CompactTier::Window(t) => out.push(window(&self.key, start(t.now_us, t.window_us))),
            CompactTier::Sliding(SlidingTier { now_us, window_us, .. })
            | CompactTier::Global(GlobalTier {
                sliding: true,
                now_us,
                window_us,
                ..
            }) => {
                let start = start(*now_us, *window_us);
                out.push(window(&self.key, start));
                out.push(window(&self.key, start.saturating_sub(*window_us)));
            }
            CompactTier::Global(t) => out.push(window(&self.key, start(t.now_us, t.window_us))),
            CompactTier::Bucket(_) => out.push(Value::from(self.key.as_str())),
        }
    }

    /// The arguments, in the script's form. A fixed window: the window and the cost counted. A bucket: 'b' ('B'
    /// when shared), the interval, the burst and the cost. A sliding window: 's' ('S' when shared), the window, the
    /// limit and the cost. Several windows: 'w', their number, and each one's window, limit and cost. A global
    /// window: 'gw' (fixed) or 'gs' (sliding), in capitals when shared, the window, the limit, the cost and how many
    /// identical hits. A reservation: 'r', its number of windows, each one's window, limit and estimate, and the
    /// record's TTL. A settlement: 'e', its number of windows, and each one's window, limit and actual cost. Then the
    /// decision's time, when it is given.
    pub(super) fn push_args(&self, out: &mut Vec<Value>) {
        let int = |n: u64| Value::Integer(n as i64);
        match &self.tier {
            CompactTier::Window(t) => out.extend([int(t.window_us), int(t.counted)]),
            CompactTier::Bucket(t) => out.extend([
                Value::from(if t.shared { "B" } else { "b" }),
                int(t.interval),
                int(t.burst),
                int(t.cost),
            ]),
            CompactTier::Sliding(t) => out.extend([
                Value::from(if t.shared { "S" } else { "s" }),
                int(t.window_us),
                int(t.limit),
                int(t.cost),
            ]),
            CompactTier::Global(t) => out.extend([
                Value::from(match (t.sliding, t.shared) {
                    (false, false) => "gw",
                    (false, true) => "GW",
                    (true, false) => "gs",
                    (true, true) => "GS",
                }),
                int(t.window_us),
                int(t.limit),
                int(t.cost),
                int(t.times),
            ]),
        }
        out.extend(self.tier.now_us().map(int));
    }
}

/// Whether a tier's numbers fit a compact form: a window, and a time and window within i64.
fn compact(now_us: Option<u64>, tier: &TierSpec) -> bool {
    tier.window_us > 0 && tier.window_us <= i64::MAX as u64 && now_us.is_none_or(|now| now <= i64::MAX as u64)
}

impl WindowTier {
    /// A fixed window `tier` hit at `now_us` (`None`: by the server's clock) with `cost`, bounded by the limit + 1.
    fn of(now_us: Option<u64>, tier: &TierSpec, cost: u64) -> WindowTier {
        WindowTier {
            limit: tier.limit,
            window_us: tier.window_us,
            cost,
            counted: if cost <= tier.limit { cost } else { 0 },
            now_us,
        }
    }
}
