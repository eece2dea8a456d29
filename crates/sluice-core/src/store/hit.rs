//! What a store is asked and what it answers: one descriptor's hit against its limits ([`Hit`], one [`TierSpec`] per
//! limit), a reservation and its settlement, and the outcome of each ([`Outcome`], [`Settled`]), or why it could not be
//! decided ([`StoreError`]).

use super::{CounterKey, OwnCount};
use crate::store::Algorithm;

/// One limit of a descriptor, as the store applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSpec {
    pub key: CounterKey,
    pub algorithm: Algorithm,
    /// Hits per window (a `requests_per_unit`, so at most `u32::MAX`: the scripts' arithmetic stays exact).
    pub limit: u64,
    pub window_us: u64,
    pub burst: u64,
    /// This tier's own cost; `None` for the hit's [`cost`](Hit::cost). A descriptor whose limits count different
    /// things (input tokens against one, output tokens against another, a priced sum against a credits limit) gives
    /// each tier its cost, and the tiers are still decided together, all or nothing. 0 checks the tier without
    /// writing it. Every mode takes it: a hit, a peek (the hypothetical cost), a [forced](Mode::Report) hit, a
    /// [reservation](Mode::Reserve) (each tier holds its own estimate) and a [settlement](Settlement) (each tier's
    /// actual cost). Bounded as any cost is ([`TierSpec::bounded_cost`]).
    pub cost: Option<u64>,
    /// Counted in every region ([`crate::regions`]): a `fixed_window` or `sliding_window` tier that also counts what
    /// the other regions counted in its window, as they shipped it ([`CounterKey::regions`]), and is decided against
    /// the sum. Such a tier never takes a lone call's compact form and never counts a denial.
    pub global: bool,
}

impl TierSpec {
    /// The largest cost that can ever fit: the bucket for buckets, the limit otherwise. (`concurrency` and `queue`
    /// take one place for any positive cost; their limit bounds it all the same.)
    pub fn capacity(&self) -> u64 {
        if self.algorithm.is_bucket() {
            self.burst
        } else {
            self.limit
        }
    }

    /// The cost this tier is decided with, for a hit of `hit_cost`: its own [`cost`](TierSpec::cost), else
    /// `hit_cost`, and at most the tier's capacity + 1. A cost above the capacity fits never, whatever its size
    /// (denied, consuming nothing, `retry_after_us` `None`), and bounding it keeps every sum and product in the stores
    /// far from overflow, in `u64` and in the scripts' doubles alike (at most 2^32).
    ///
    /// The bound is per tier. It was once one for the whole hit, the largest tier's capacity + 1; for a hit whose
    /// tiers all take the hit's cost the answers are the same except where a tier's cost is above its capacity
    /// while another tier's capacity is larger. Let `c` be the cost, `k` the tier's capacity and `K` the largest:
    /// the tier saw `min(c, K + 1)` and now sees `min(c, k + 1)`. Where `c <= k + 1` both are `c`. Where `c > k + 1`
    /// both are above `k`, so the tier denies alike (`ok` false, `remaining` 0, `retry_after_us` `None`), the hit is
    /// denied alike and an ordinary hit writes nothing alike (a lone fixed window has `K = k`). What differs there:
    /// the tier's `used` (the count the hit would leave) is its count + `k + 1` instead of + `min(c, K + 1)`, and
    /// what a [forced](Mode::Report) hit or a settlement's charge counts in that tier: `k + 1`, no longer up to
    /// `K + 1` (a bucket was charged at most `burst + 1` tokens already, so only windows count less), and what a
    /// reservation records as its estimate. Any count above a limit answers the same while it lasts.
    pub fn bounded_cost(&self, hit_cost: u64) -> u64 {
        self.cost.unwrap_or(hit_cost).min(self.capacity().saturating_add(1))
    }
}

/// One descriptor's hit against all its limits, decided together: every tier admits it, or none is charged (except a
/// lone fixed window, which counts denials as the reference does, but never a cost above its limit, which can never
/// fit, and a [forced](Mode::Report) hit, which every tier counts).
///
/// Each tier is decided with its own cost ([`TierSpec::bounded_cost`]: the tier's [`cost`](TierSpec::cost), else the
/// hit's `cost`, bounded by the tier's capacity + 1): the hit is admitted only if every tier admits its own cost, an
/// admitted hit commits each tier with its own cost, and a tier whose cost is 0 is checked but never written (it
/// takes no lease, appends no queue entry). A hit is written at all only if some tier's cost is positive. Each
/// tier's outcome is that of its own cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hit {
    pub tiers: Vec<TierSpec>,
    /// The cost of every tier without a [`cost`](TierSpec::cost) of its own. 0 checks without consuming. For
    /// `peek`, the hypothetical cost.
    pub cost: u64,
    /// The lease id an admitted hit takes in `concurrency` tiers.
    pub lease: String,
    /// The fields of the entry an admitted hit appends to `queue` tiers.
    pub fields: Vec<(String, String)>,
    pub record: Option<RecordSpec>,
    /// What the call does with the hit ([`Mode`]): count it where it fits, only report on it, count it whatever the
    /// limits say, or hold what it is charged as a reservation.
    pub mode: Mode,
}

/// What a store call does with one hit: the one shape a call's mode takes, from the limiter down to the script's
/// first argument (`ScriptMode` in the Redis store's call).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Mode {
    /// Count the hit where every tier admits it (a lone fixed window counts its denials, as the reference does).
    #[default]
    Hit,
    /// Report on the hit (its `cost` is hypothetical) without creating, changing or extending anything; the outcome
    /// carries the hit records.
    Peek,
    /// Count `cost` against every tier whatever the limits say: a usage that already happened (an RLQS usage report).
    /// The outcome still says whether it fit; later hits see the count, past the limit or not. For the counting
    /// algorithms only (`fixed_window`, `sliding_window`, `token_bucket`, `leaky_bucket`): a hit with a tier of
    /// another algorithm is decided as an ordinary one (see [`Hit::forced`]).
    ///
    /// Each tier counts its own cost ([`TierSpec::bounded_cost`]), bounded as for any hit: a report larger than a
    /// tier's capacity + 1 is counted there as that capacity + 1 (a bucket tier is charged at most its `burst` + 1
    /// tokens). Any count above a limit answers the same while it lasts; what is lost is only how long the excess
    /// would have weighed (the part a sliding window carries into its next window, a bucket's debt). A tier whose
    /// cost is 0 is not written, and a forced hit whose every tier's cost is 0 writes nothing. Counts stay exact
    /// however many reports arrive: a fixed window's stops at `MAX_COUNT` (2^52), a sliding window's current count at
    /// 2^51, and a bucket's debt (how far its arrival time is past an empty bucket's) at 2^48 us, about 9 years.
    ///
    /// The outcome's `admitted`, and each tier's `ok` and `retry_after_us`, are those of an ordinary hit (decided
    /// before counting); `used`, `remaining` and `reset_after_us` are each tier's state after counting.
    Report,
    /// A hit whose charge is held as a reservation, to be [settled](super::Reservations::settle) later with the
    /// actual costs (a cost budget: reserve an estimate, settle what was used). An admitted hit with a positive cost
    /// in some tier also writes the record `key`: what each tier was charged (its bounded cost,
    /// [`TierSpec::bounded_cost`], 0 included) and when. A denied hit and a hit whose every tier's cost is 0 write
    /// none. For the counting algorithms only, as [`Mode::Report`]: on a hit with a tier of another algorithm it is
    /// an ordinary hit.
    Reserve(ReservationSpec),
    /// A [report](Mode::Report) whose charge is held as a [reservation](Mode::Reserve): always counted, so always
    /// recorded.
    ReserveReport(ReservationSpec),
}

impl Mode {
    /// The mode of a hit that is forced (`force`) or not, holding `reservation` or not.
    pub fn of(force: bool, reservation: Option<ReservationSpec>) -> Mode {
        match (force, reservation) {
            (false, None) => Mode::Hit,
            (true, None) => Mode::Report,
            (false, Some(r)) => Mode::Reserve(r),
            (true, Some(r)) => Mode::ReserveReport(r),
        }
    }
}

/// Each tier's cost, in order, as the stores decide with it ([`TierSpec::bounded_cost`]), where `cost` is the cost of
/// every tier without its own.
pub(crate) fn tier_costs(tiers: &[TierSpec], cost: u64) -> Vec<u64> {
    tiers.iter().map(|t| t.bounded_cost(cost)).collect()
}

/// Whether every tier is of a counting algorithm (`fixed_window`, `sliding_window`, `token_bucket`,
/// `leaky_bucket`): what forced hits, reservations and settlements need.
pub(crate) fn all_count(tiers: &[TierSpec]) -> bool {
    tiers.iter().all(|t| t.algorithm.counts())
}

impl Hit {
    /// Each tier's cost, in order, as the stores decide with it ([`TierSpec::bounded_cost`]).
    pub(crate) fn tier_costs(&self) -> Vec<u64> {
        tier_costs(&self.tiers, self.cost)
    }

    /// Whether the hit only reports ([`Mode::Peek`]).
    pub fn peeks(&self) -> bool {
        self.mode == Mode::Peek
    }

    /// Whether the hit asks to be counted whatever the limits say ([`Mode::Report`], [`Mode::ReserveReport`]),
    /// whether or not its tiers can be.
    pub fn reports(&self) -> bool {
        matches!(self.mode, Mode::Report | Mode::ReserveReport(_))
    }

    /// The reservation the hit asks to hold, whether or not its tiers can hold one.
    pub fn reservation(&self) -> Option<&ReservationSpec> {
        match &self.mode {
            Mode::Reserve(r) | Mode::ReserveReport(r) => Some(r),
            _ => None,
        }
    }

    /// Whether the hit is counted whatever the limits say: it [reports](Hit::reports), and every tier counts
    /// (`fixed_window`, `sliding_window`, `token_bucket`, `leaky_bucket`). Both stores decide by this one test.
    pub fn forced(&self) -> bool {
        self.reports() && self.counts()
    }

    /// Whether the decision counts the hit whatever the limits say: [forced](Hit::forced), not a peek, and of a
    /// positive cost in some tier (a forced hit of nothing writes nothing). What each tier then leaves is reported,
    /// even where the hit did not fit.
    pub(crate) fn forces(&self) -> bool {
        !self.peeks() && self.forced() && self.tiers.iter().any(|t| t.bounded_cost(self.cost) > 0)
    }

    /// The reservation the hit holds if it is admitted: its [reservation](Hit::reservation), when every tier counts.
    /// Both stores decide by this one test.
    pub(crate) fn reserves(&self) -> Option<&ReservationSpec> {
        self.reservation().filter(|_| self.counts())
    }

    /// Whether every tier is of a counting algorithm: what forced hits and reservations need ([`all_count`]).
    pub(crate) fn counts(&self) -> bool {
        all_count(&self.tiers)
    }
}

/// What an admitted hit holds against its tiers until settled: the record `key` (same hash tag as the
/// descriptor's tiers, built by [`Identity::reservation`](super::Identity::reservation)) lives `ttl_us`.
///
/// The record keeps the cost each tier was charged (its estimate, in tier order), when, and when it expires by the
/// decision's clock (`now_us` + `ttl_us`, rounded up to whole milliseconds as every TTL is; `ttl_us` is bounded by
/// [`MAX_RESERVATION_TTL_US`]): a settlement at or after that time finds nothing, whether or not the key is still
/// there. A reservation that is never settled simply expires, and what it was charged stays counted, as any hit is.
/// In Redis the record is the text `<t> <x> <e>`: `t` when it was charged and `x` when it expires, in microseconds,
/// and `e` the estimates as decimal integers joined by `,` (a single number for one tier); see `lua/prelude.lua`'s
/// `record_write`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationSpec {
    pub key: CounterKey,
    pub ttl_us: u64,
}

/// The longest a reservation record lives: 2^48 us, about 9 years. A longer `ttl_us` is taken as this one, which keeps
/// every expiry time exact in the scripts' doubles.
pub const MAX_RESERVATION_TTL_US: u64 = 1 << 48;

impl ReservationSpec {
    /// `ttl_us`, at most [`MAX_RESERVATION_TTL_US`]: what both stores keep the record for.
    pub(crate) fn bounded_ttl_us(&self) -> u64 {
        self.ttl_us.min(MAX_RESERVATION_TTL_US)
    }
}

/// Replace a reservation's estimates with the actual costs.
///
/// `tiers` are the descriptor's tiers (as the reserving hit named them, in the same order), each with its actual cost:
/// its own [`cost`](TierSpec::cost), else `cost`, bounded as any cost is ([`TierSpec::bounded_cost`]: at most the
/// tier's capacity + 1, so the arithmetic stays exact). `reservation` is the record the reserving hit wrote
/// ([`ReservationSpec::key`]), with the same hash tag as the tiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub tiers: Vec<TierSpec>,
    /// The actual cost of every tier without a [`cost`](TierSpec::cost) of its own.
    pub cost: u64,
    pub reservation: CounterKey,
    /// Reap instead of settle: only a reservation that has expired unsettled is found (a record is kept
    /// [`RESERVATION_GRACE_US`] past its expiry for this), its record removed and its estimates reported as
    /// settled at the estimate; no counter changes. One that is still live, or gone, is `Unknown`.
    pub reap: bool,
}

/// How long a reservation record outlives its expiry, so that the instance that made it can reap it: count it as
/// expired unsettled. Settling it in that time finds nothing.
pub const RESERVATION_GRACE_US: u64 = 60_000_000;

/// What [`Reservations::settle`](crate::store::Reservations::settle) did with one settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// No such reservation: it expired (and stays charged at its estimates), was settled already, or never existed.
    /// Also the answer, touching nothing, for a settlement whose hit has a tier that does not count (another algorithm
    /// than `fixed_window`, `sliding_window`, `token_bucket`, `leaky_bucket`), and for one whose hit has not as many
    /// tiers as the reservation holds estimates (the record is left as it is).
    Unknown,
    /// The estimates were replaced, each tier by its own difference ([`TierSettled`], one per tier, in order), and
    /// `outcome` is each tier's state after, as a peek of cost 1 at `now_us` reports it (`admitted`, and per tier
    /// `ok`, `used`, `remaining`, `reset_after_us`, `retry_after_us`). The record is gone.
    Done { tiers: Vec<TierSettled>, outcome: Outcome },
}

/// What a settlement did to one tier: its `estimate` (what the reservation charged it) replaced with its `actual`
/// cost (as bounded, [`TierSpec::bounded_cost`]).
/// - `actual > estimate`: `charged` = `actual - estimate` is counted on the tier as a [forced](Mode::Report) hit of
///   that cost at `now_us` would be (past the limit if it must, with the same caps).
/// - `actual < estimate`: `estimate - actual` is asked back of the tier, from the state the reservation was charged
///   in, and `refunded` is what came back: a fixed window gives it back (down to 0) if the window it was charged in is still the
///   current one; a sliding window gives it back from the current window's count if it was charged in the current
///   window, from the previous window's if it was charged in that one; a bucket moves its arrival time back by that
///   many tokens, never before `now_us`. A tier whose window has passed (or whose state expired) gives back nothing
///   (`refunded` 0), and one that held less than asked gives back what it held. A refund never creates a key and never moves a window's expiry.
/// - `actual == estimate`: the tier does not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierSettled {
    pub estimate: u64,
    pub actual: u64,
    pub charged: u64,
    pub refunded: u64,
}

impl TierSettled {
    /// The tier's estimate replaced with `actual`: what is charged or refunded.
    pub(crate) fn new(estimate: u64, actual: u64) -> TierSettled {
        TierSettled {
            estimate,
            actual,
            charged: actual.saturating_sub(estimate),
            refunded: estimate.saturating_sub(actual),
        }
    }
}

/// Keep the last `size` values of the entry that hit, in the list `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSpec {
    pub key: CounterKey,
    pub size: u32,
    /// The value to record; `None` when the request does not carry the entry (nothing is recorded).
    pub value: Option<String>,
}

/// What one tier says about a hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierOutcome {
    /// The hit fits this tier.
    pub ok: bool,
    /// The count after the hit (now, for a peek), for near-limit metrics.
    pub used: u64,
    /// What is left after the hit (now, for a peek); 0 when the hit does not fit.
    pub remaining: u64,
    /// Time until the tier is full again (a fixed window: until it ends), in microseconds.
    pub reset_after_us: u64,
    /// Time until a hit of the cost fits this tier, if nothing else is admitted meanwhile: `Some(0)` now, `None`
    /// never (the cost exceeds the capacity).
    pub retry_after_us: Option<u64>,
    /// What an admitted hit created: the entry id in a `queue`, the lease in a `concurrency` tier.
    pub id: Option<String>,
    /// A global window the hit counted in: this region's own count of it after the hit, as the store saw it, which
    /// is what the other regions are shipped ([`crate::regions`]). `None` for any other tier, and where the store
    /// does not tell: that window's count is then read back before it is shipped.
    pub own: Option<OwnCount>,
}

/// The decision on one descriptor's hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Every tier admitted the hit.
    pub admitted: bool,
    /// One per tier, in order.
    pub tiers: Vec<TierOutcome>,
    /// For a peek, the recorded values, newest first.
    pub records: Vec<String>,
}

/// One answer per hit, in order: its outcome, or why its counters could not be decided.
pub type Answers = Vec<Result<Outcome, StoreError>>;

/// What [`Releases::reset_idle_streams`](crate::store::Releases::reset_idle_streams) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamReset {
    /// Empty streams that existed and were deleted.
    pub deleted: u64,
    /// Streams kept because entries still wait in them, in the order given.
    pub kept: Vec<CounterKey>,
}

/// Why a store could not answer. Every kind maps to gRPC UNAVAILABLE.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("store connection failed: {0}")]
    Connection(String),
    #[error("store script failed: {0}")]
    Script(String),
    #[error("store error: {0}")]
    Other(String),
}

impl StoreError {
    /// The `kind` label of the store error metric.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Connection(_) => "connection",
            StoreError::Script(_) => "script",
            StoreError::Other(_) => "other",
        }
    }

    /// Whether the call may have run on the server though its answer was lost: a timeout or a broken connection
    /// (the call may have been written and run before the answer failed to come). Every other error comes with
    /// nothing written: the script decides each descriptor whole or not at all, a refusal by the cluster's topology
    /// runs nothing, and sluice never sends a call again that may have run.
    pub fn may_have_run(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Connection(_))
    }

    /// Whether the server failed to answer (rather than answering with an error about this one call, such as a key
    /// of the wrong type): what counts against its circuit breaker.
    pub fn is_unreachable(&self) -> bool {
        !matches!(self, StoreError::Script(_))
    }
}
