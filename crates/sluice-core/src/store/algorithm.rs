//! Each algorithm's arithmetic, written once in Rust: a file per algorithm (`algorithm/<name>.rs`, named as its
//! script `lua/<name>.lua`) holds the state it keeps, the check that decides a hit against that state, the commit
//! that writes it and, for the counting algorithms, the refund of a settlement. Both stores call it: the memory store
//! over the states it keeps, the Redis store over the integers its script answers (a window's
//! count, a bucket's arrival time, a sorted set's count and places). The scripts are the twins, step by step, and the
//! differential test holds the two to identical answers.
//!
//! This file is where the algorithms meet: what a check finds ([`Check`]) and how it becomes a tier's answer
//! ([`Check::outcome`]), the state of one counter ([`Counter`]), the keyspace a commit writes to ([`Keyspace`]), and
//! the dispatch by algorithm ([`check`], [`commit`], [`refund`]). Adding an algorithm adds an arm to each of them.

pub(crate) mod bucketed_window;
pub(crate) mod concurrency;
pub(crate) mod fixed_window;
pub(crate) mod queue;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod token_bucket;

use super::{OwnCount, TierOutcome, TierSpec};

use bucketed_window::Buckets;
use concurrency::Leases;
use fixed_window::Fixed;
use queue::Queue;
use sliding_log::Log;
use sliding_window::Sliding;
use token_bucket::Tat;

/// How a limit counts hits: each has its file here (`algorithm/<name>.rs`, its arithmetic, which both stores decide
/// by) and its script beside it (`algorithm/<name>.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Epoch-aligned fixed windows, the reference's only algorithm, and a limit's unless it names another.
    #[default]
    FixedWindow,
    /// The two-window weighted counter.
    SlidingWindow,
    /// Exactly at most N in any interval of the window's length.
    SlidingLog,
    /// Continuous refill at `requests_per_unit` per window into a bucket of `burst`.
    TokenBucket,
    /// The token bucket with a default burst of 1: evenly spaced hits.
    LeakyBucket,
    /// At most N in flight; a lease per admitted hit, released or expiring after the window.
    Concurrency,
    /// At most N waiting entries in a Redis Stream that workers drain.
    Queue,
    /// A window split into sub-windows (`buckets`), exact to one sub-window; limits of one descriptor with the same
    /// sub-window share its counts.
    BucketedWindow,
}

impl Algorithm {
    pub const ALL: [Algorithm; 8] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Concurrency,
        Algorithm::Queue,
        Algorithm::BucketedWindow,
    ];

    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Concurrency => "concurrency",
            Algorithm::Queue => "queue",
            Algorithm::BucketedWindow => "bucketed_window",
        }
    }

    /// A token or leaky bucket: counts against a `burst`.
    pub fn is_bucket(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }

    /// A counting algorithm: it can count a usage whatever the limits say (a forced hit), hold a reservation and
    /// settle it. The others keep sets (of hits, leases, entries) or shared sub-window counts that a charge or a
    /// refund cannot move.
    pub fn counts(self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::TokenBucket | Algorithm::LeakyBucket
        )
    }

    /// Whether it can be counted across regions: a window whose counts the regions add up.
    pub fn can_be_global(self) -> bool {
        self.keys_per_window()
    }

    /// Whether its windows are named, each by its number after the counter's key
    /// ([`CounterKey::window`](crate::store::CounterKey::window)): the fixed and the sliding window (a plain counter's
    /// windows, and the other regions' counts of a global window).
    pub fn keys_per_window(self) -> bool {
        matches!(self, Algorithm::FixedWindow | Algorithm::SlidingWindow)
    }

    /// Whether its state is ended by clients (leases released, entries drained), so that what is left now is not
    /// what is left later.
    pub fn ended_by_clients(self) -> bool {
        matches!(self, Algorithm::Concurrency | Algorithm::Queue)
    }

    /// Whether envoyproxy/ratelimit knows it (the fixed window, its only algorithm): a descriptor's one limit of it,
    /// counting requests in one region, keeps the reference's key layout for the drop-in.
    pub fn is_reference(self) -> bool {
        self == Algorithm::FixedWindow
    }

    /// Whether a lone limit of it counts its denials too, as the reference's fixed windows do (never a cost above
    /// its limit, which can never fit, nor a refused reservation, which holds nothing, nor a global window's).
    pub fn counts_denials_alone(self) -> bool {
        self == Algorithm::FixedWindow
    }

    /// Whether an admitted hit takes a lease, held until released or expired (a concurrency limit).
    pub fn takes_lease(self) -> bool {
        self == Algorithm::Concurrency
    }

    /// Whether an admitted hit appends an entry to a stream that workers drain (a queue).
    pub fn queues(self) -> bool {
        self == Algorithm::Queue
    }

    /// Whether its `burst` is the number of sub-windows its window is split into (a bucketed window).
    pub fn has_sub_windows(self) -> bool {
        self == Algorithm::BucketedWindow
    }

    /// Whether admitted hits are spaced evenly, as a queue drained at the rate would release them (a leaky bucket):
    /// what the simulator reports as delays.
    pub fn spaces_hits(self) -> bool {
        self == Algorithm::LeakyBucket
    }

    /// The burst of a limit of `requests` per window that names none: a leaky bucket's is 1, every other's the
    /// requests.
    pub fn default_burst(self, requests: u32) -> u32 {
        match self {
            Algorithm::LeakyBucket => 1,
            _ => requests,
        }
    }

    /// How many windows a count weighs in: a sliding window's is the previous one all through the next window.
    pub fn windows_weighed(self) -> u64 {
        match self {
            Algorithm::SlidingWindow => 2,
            _ => 1,
        }
    }

    /// What the other regions' counts of a global window weigh at `elapsed_us` into the current window of
    /// `window_us`, from their counts of the previous window and of the current one: the current's for a fixed
    /// window, the weighted estimate for a sliding one (as over its own counts).
    pub fn others_weigh(self, previous: u64, current: u64, elapsed_us: u64, window_us: u64) -> u64 {
        match self {
            Algorithm::SlidingWindow => sliding_window::sw_estimate(previous, current, elapsed_us, window_us),
            _ => current,
        }
    }

    /// The name the decision script knows its global form by (`global:` and its name), for those that can be global.
    pub fn global_name(self) -> Option<&'static str> {
        match self {
            Algorithm::FixedWindow => Some("global:fixed_window"),
            Algorithm::SlidingWindow => Some("global:sliding_window"),
            _ => None,
        }
    }

    /// The span a counter of a limit over `window_us` (with `burst`) is named by: the window, but a bucketed
    /// window's sub-window, so that the limits of one descriptor with the same sub-window share their counts.
    pub fn counter_span_us(self, window_us: u64, burst: u64) -> u64 {
        if self.has_sub_windows() {
            window_us / burst.max(1)
        } else {
            window_us
        }
    }
}

/// The most a fixed window's count holds (`MAX_COUNT` in `lua/prelude.lua`): a lone fixed window counts its
/// denials, so hits of up to `u32::MAX` each could otherwise push it past 2^53, where the scripts' doubles stop
/// being exact. Any count above a limit answers the same.
pub(crate) const MAX_COUNT: u64 = 1 << 52;

/// The most a sliding window's current count holds (`MAX_SLIDING_COUNT` in `lua/prelude.lua`): only forced hits
/// take it past its limit, and with the previous window's count (at most as much) and a cost added, the estimate
/// stays below 2^53.
pub(crate) const MAX_SLIDING_COUNT: u64 = 1 << 51;

/// The most a bucket's arrival time is ever past an empty bucket's, `now + tolerance` (`MAX_DEBT_US` in
/// `lua/prelude.lua`): about 9 years of debt, which only forced hits run up. Times stay below 2^53 with the largest
/// bucket the configuration accepts (100 years) priced on top.
pub(crate) const MAX_DEBT_US: u64 = 1 << 48;

/// The state one counter keeps, shaped like the Redis value its script keeps.
#[derive(Debug, Clone)]
pub(crate) enum Counter {
    Fixed(Fixed),
    Sliding(Sliding),
    Log(Log),
    Tat(Tat),
    Leases(Leases),
    Queue(Queue),
    Buckets(Buckets),
}

/// One shape of [`Counter`]: what [`Keyspace::upsert`] finds in, or makes into, a counter's state.
pub(crate) trait CounterState: Default + Into<Counter> {
    /// The state as this shape, if it has it.
    fn of(counter: &Counter) -> Option<&Self>;
    fn of_mut(counter: &mut Counter) -> Option<&mut Self>;
}

macro_rules! counter_states {
    ($($shape:ident),*) => {$(
        impl From<$shape> for Counter {
            fn from(shape: $shape) -> Counter {
                Counter::$shape(shape)
            }
        }

        impl CounterState for $shape {
            fn of(counter: &Counter) -> Option<&$shape> {
                match counter {
                    Counter::$shape(shape) => Some(shape),
                    _ => None,
                }
            }

            fn of_mut(counter: &mut Counter) -> Option<&mut $shape> {
                match counter {
                    Counter::$shape(shape) => Some(shape),
                    _ => None,
                }
            }
        }
    )*};
}

counter_states!(Fixed, Sliding, Log, Tat, Leases, Queue, Buckets);

/// When a committed state expires: the script's PEXPIRE.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expiry {
    /// At this time, whether the write created the state or updated it.
    Always(u64),
    /// At this time when the write creates the state; a state it updates keeps its expiry (a fixed window's TTL is
    /// set by its first hit and never extended).
    OnCreate(u64),
    /// At this time at the earliest: a state it updates keeps a later expiry (counts that several tiers share live as
    /// long as the longest of them needs).
    AtLeast(u64),
}

/// The keys a commit writes, as a script writes Redis keys: the memory store's shard.
pub(crate) trait Keyspace {
    /// The step every commit shares: the live state of `key`, updated in place by `update` when it has the shape
    /// `T`; otherwise (no state, an expired one, another shape) a new one, `T::default()` updated, that replaces
    /// it. Either way the state then expires as `expiry` says. Returns what `update` returns.
    fn upsert<T: CounterState, R>(
        &mut self,
        key: &str,
        now: u64,
        expiry: Expiry,
        update: impl FnOnce(&mut T) -> R,
    ) -> R;

    /// The number of the decision under way: tiers that share a counter write it once per decision (`decision` in
    /// `lua/prelude.lua`).
    fn decision(&self) -> u64;
}

/// What a tier's check found, as the scripts' `check` returns it.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub(crate) ok: bool,
    pub(crate) used0: u64,
    pub(crate) used: u64,
    pub(crate) rem0: u64,
    pub(crate) rem1: u64,
    pub(crate) reset0: u64,
    pub(crate) reset1: u64,
    /// `None`: never.
    pub(crate) retry: Option<u64>,
    /// What commit writes.
    pub(crate) write: Write,
}

/// What a commit writes, as its check found it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Write {
    Fixed { start: u64, n: u64, reset: u64 },
    Sliding { start: u64, c: u64, p: u64 },
    Log,
    Tat(u64),
    Lease,
    Queue,
    Buckets,
}

impl Check {
    /// The tier's answer (`lua/decide.lua`'s six values): `written` when the hit was committed with a positive cost
    /// (what is left and the reset are then those after it), `peek` for a report that changes nothing (the count
    /// now), `force` for a hit counted whether it fits or not (what it leaves is reported even where it did not fit);
    /// otherwise a tier the hit does not fit has nothing left. `id` is what a commit created (a lease, a queue entry).
    pub(crate) fn outcome(&self, written: bool, peek: bool, force: bool, id: Option<String>) -> TierOutcome {
        let (mut remaining, reset) = if written {
            (self.rem1, self.reset1)
        } else {
            (self.rem0, self.reset0)
        };
        if !peek && !force && !self.ok {
            remaining = 0;
        }
        TierOutcome {
            ok: self.ok,
            used: if peek { self.used0 } else { self.used },
            remaining,
            reset_after_us: reset,
            retry_after_us: self.retry,
            id,
            own: None,
        }
    }
}

/// What a settlement's refund writes to one tier, as the function a script's `refund` returns: the counter's new
/// state, and its new expiry (`None`: it keeps its own). Written only over a live state, never creating one.
#[derive(Debug, Clone)]
pub(crate) struct Refund {
    pub(crate) state: Counter,
    /// What came back: at most the amount asked, less when the state held less.
    pub(crate) given: u64,
    pub(crate) expires_at_us: Option<u64>,
}

/// What a commit of `cost` by a window tier's `check` leaves as the count of its window (the current one, for a
/// sliding window), as its commit writes it: a global window's own count after a hit that counted, shipped to the other
/// regions. `None` for the other algorithms.
pub(crate) fn own_count(check: &Check, cost: u64) -> Option<OwnCount> {
    match check.write {
        Write::Fixed { start, n, .. } => Some(OwnCount {
            start_us: start,
            count: n.saturating_add(cost).min(MAX_COUNT),
        }),
        Write::Sliding { start, c, .. } => Some(OwnCount {
            start_us: start,
            count: c.saturating_add(cost).min(MAX_SLIDING_COUNT),
        }),
        _ => None,
    }
}

/// A tier's answer from its check, in either store: `written` when the hit was committed to it with its positive
/// `cost`, `peek` for a report that changes nothing, `force` for a hit counted whether it fits or not (see
/// [`Check::outcome`]); a global tier that was written also tells the count it left, shipped to the other regions.
pub(crate) fn tier_outcome(
    t: &TierSpec,
    check: &Check,
    cost: u64,
    (written, peek, force): (bool, bool, bool),
    id: Option<String>,
) -> TierOutcome {
    let mut tier = check.outcome(written, peek, force, id);
    if t.global && written {
        tier.own = own_count(check, cost);
    }
    tier
}

/// A global window's check (`prelude.lua`'s `global_of` and the global forms' `hit`): its algorithm's, made by `check` against its
/// limit (of a window of `window_us`) less `others`, what the other regions counted (a fixed window's sum, a sliding window's weighted estimate),
/// and reporting the sum as used; a cost that fits the limit fits again once the window has passed, whatever the
/// others counted. Both stores decide a global tier by it.
pub(crate) fn global_check(
    (limit, window_us): (u64, u64),
    now: u64,
    cost: u64,
    others: u64,
    check: impl FnOnce(u64) -> Check,
) -> Check {
    let mut c = check(limit.saturating_sub(others));
    c.used0 = c.used0.saturating_add(others);
    c.used = c.used.saturating_add(others);
    if c.retry.is_none() && cost <= limit {
        let window = window_us.max(1);
        c.retry = Some(now - now % window + window - now);
    }
    c
}

/// What a tier's hit of `cost` would find in `state` (its live state, if any) at `now`, by its algorithm's check;
/// `force`: what a forced hit would leave (only a bucket's check needs to know: the counts' commits take a cost that
/// does not fit as it is).
pub(crate) fn check(t: &TierSpec, state: Option<&Counter>, now: u64, cost: u64, force: bool) -> Check {
    fn shape<T: CounterState>(state: Option<&Counter>) -> Option<&T> {
        state.and_then(T::of)
    }
    match t.algorithm {
        Algorithm::FixedWindow => fixed_window::check(shape(state), t, now, cost),
        Algorithm::SlidingWindow => sliding_window::check(shape(state), t, now, cost),
        Algorithm::SlidingLog => sliding_log::check(shape(state), t, now, cost),
        Algorithm::TokenBucket | Algorithm::LeakyBucket => token_bucket::check(shape(state), t, now, cost, force),
        Algorithm::Concurrency => concurrency::check(shape(state), t, now, cost),
        Algorithm::Queue => queue::check(shape(state), t, now, cost),
        Algorithm::BucketedWindow => bucketed_window::check(shape(state), t, now, cost),
    }
}

/// What a tier's hit of `cost` found, from what the decision script saw of the tier (its algorithm's `check` in
/// `algorithm/<name>.lua`), integers where -1 is nothing: a fixed window's count; a sliding window's counts of the
/// current and the previous window; a bucket's arrival time; for a sliding log, a concurrency limit, a queue and a
/// bucketed window, the live count, the newest place (a hit's time, a lease's deadline, an entry's millisecond, a
/// sub-window's start) and the place that must leave before the hit fits; for a global window, then what the other
/// regions counted. Decided by the same check the memory store decides by.
pub(crate) fn seen(t: &TierSpec, now: u64, cost: u64, force: bool, values: &[i64]) -> Check {
    let at = |i: usize| values.get(i).copied().unwrap_or(-1);
    if t.global {
        let own = values.len().saturating_sub(1);
        let others = count_of(at(own));
        let second = if own > 1 { at(1) } else { -1 };
        return global_check((t.limit, t.window_us), now, cost, others, |limit| {
            view(t, limit, now, cost, force, [at(0), second, -1])
        });
    }
    view(t, t.limit, now, cost, force, [at(0), at(1), at(2)])
}

/// How many values the decision script answers for a tier (its algorithm's `width` in `algorithm/<name>.lua`): what
/// its check saw, a queue's entry id after them, a global window's others' count after them.
pub(crate) fn seen_width(t: &TierSpec) -> usize {
    let own = match t.algorithm {
        Algorithm::FixedWindow | Algorithm::TokenBucket | Algorithm::LeakyBucket => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::SlidingLog | Algorithm::Concurrency | Algorithm::BucketedWindow => 3,
        Algorithm::Queue => 4,
    };
    own + usize::from(t.global)
}

/// A value the script saw: a count (never below 0), or a place (`None` for -1, nothing).
fn count_of(v: i64) -> u64 {
    v.max(0) as u64
}

fn place_of(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

/// [`seen`] against `limit`.
fn view(t: &TierSpec, limit: u64, now: u64, cost: u64, force: bool, [a, b, c]: [i64; 3]) -> Check {
    let window = t.window_us;
    match t.algorithm {
        Algorithm::FixedWindow => fixed_window::check_count(limit, window, now, cost, count_of(a)),
        Algorithm::SlidingWindow => sliding_window::check_counts(limit, window, now, cost, count_of(a), count_of(b)),
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            token_bucket::check_tat(window.div_ceil(limit.max(1)), t.burst, now, cost, force, count_of(a))
        }
        Algorithm::SlidingLog => {
            sliding_log::check_view(limit, window, now, cost, count_of(a), count_of(b), place_of(c))
        }
        Algorithm::Concurrency => {
            concurrency::check_view(limit, window, now, cost, count_of(a), count_of(b), place_of(c))
        }
        Algorithm::Queue => queue::check_view(limit, window, now, cost, count_of(a), place_of(b), place_of(c)),
        Algorithm::BucketedWindow => bucketed_window::check_view(
            limit,
            bucketed_window::width(t),
            window,
            now,
            cost,
            (count_of(a), place_of(b), place_of(c)),
        ),
    }
}

/// Applies a hit of `cost` (the bounded one) that `check` found, by its algorithm's commit; returns what it created
/// (a concurrency tier's lease, a queue's entry id).
pub(crate) fn commit(
    keys: &mut impl Keyspace,
    t: &TierSpec,
    check: &Check,
    now: u64,
    cost: u64,
    lease: &str,
) -> Option<String> {
    match check.write {
        Write::Fixed { start, n, reset } => fixed_window::commit(keys, t, now, cost, start, n, reset),
        Write::Sliding { start, c, p } => sliding_window::commit(keys, t, now, cost, start, c, p),
        Write::Log => sliding_log::commit(keys, t, now, cost),
        Write::Tat(new) => token_bucket::commit(keys, t, now, new),
        Write::Buckets => bucketed_window::commit(keys, t, now, cost),
        Write::Lease => return Some(concurrency::commit(keys, t, now, lease)),
        Write::Queue => return Some(queue::commit(keys, t, now)),
    }
    None
}

/// What a settlement's refund of `amount`, charged at `at`, would write to a counting tier, by its algorithm's
/// refund; `None` for nothing (and for the algorithms that do not count, which a settlement never reaches).
pub(crate) fn refund(t: &TierSpec, state: Option<&Counter>, now: u64, at: u64, amount: u64) -> Option<Refund> {
    match t.algorithm {
        Algorithm::FixedWindow => fixed_window::refund(state.and_then(Fixed::of), t, now, at, amount),
        Algorithm::SlidingWindow => sliding_window::refund(state.and_then(Sliding::of), t, now, at, amount),
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            token_bucket::refund(state.and_then(Tat::of), t, now, at, amount)
        }
        Algorithm::SlidingLog | Algorithm::Concurrency | Algorithm::Queue | Algorithm::BucketedWindow => None,
    }
}

/// The first microseconds of the windows a plain counter (a lone fixed window of `window_us`) may hold a key for at
/// `now` in Redis ([`CounterKey::window`](crate::store::CounterKey::window)), so that a reset deletes every one: the
/// current window and the next (the store may decide by its own clock, a little ahead of this one). None for the
/// other algorithms, which keep no key per window.
pub(crate) fn window_starts(algorithm: Algorithm, window_us: u64, now: u64) -> impl Iterator<Item = u64> {
    let span = if algorithm == Algorithm::FixedWindow {
        window_us
    } else {
        0
    };
    let start = if span > 0 { now - now % span } else { 0 };
    let count = if span > 0 { 2 } else { 0 };
    (0..count).map(move |i| start.saturating_add(i * span))
}

/// `ceil_ms` of `lua/prelude.lua`, in microseconds: a TTL rounded up to whole milliseconds, at least one.
pub(crate) fn ceil_ms_us(us: u64) -> u64 {
    us.div_ceil(1_000).max(1) * 1_000
}

/// The retry time of a check: `None` when the cost can never fit, 0 when it fits now, else `wait`.
pub(crate) fn retry(never: bool, ok: bool, wait: u64) -> Option<u64> {
    if never {
        None
    } else if ok {
        Some(0)
    } else {
        Some(wait)
    }
}
