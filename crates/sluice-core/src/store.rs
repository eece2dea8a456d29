//! Where counters live: one trait, [`Store`], with an in-memory implementation ([`memory`], the default) and a
//! Redis one ([`redis`], the Lua scripts of `lua/` run by EVALSHA). Both pass one contract suite
//! (`tests/contract.rs`) and a differential property test, so their answers never drift apart.
//!
//! A store receives every descriptor of one request at once and answers each on its own: a descriptor whose
//! counters could not be reached (a dead cluster primary, a key of the wrong type) gets its own error, and the others
//! keep their decisions. Each descriptor's limits (tiers) are decided together, atomically. Keys are built here, by
//! [`CounterKey`], in one documented encoding.

pub mod memory;
pub mod redis;

use std::future::Future;

use crate::rules::Algorithm;

/// What one instance tells every instance sharing its store (itself included), so that state kept beside the store
/// (the local over-limit cache, RLQS shares) follows what others did to it. Best effort, and fast: on Redis a
/// PUBLISH on one channel, heard within milliseconds; in memory, in-process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Capacity came back to these counters (a settlement's refund, a reset): a denial remembered for them may be
    /// stale.
    Freed(Vec<String>),
    /// These RLQS buckets changed (grants or demand moved): their shares should be sized again. Each is named by a
    /// string the quota code chooses.
    Quota(Vec<String>),
    /// The run-time entries of these lists changed (each named by its store key): read them again.
    Lists(Vec<String>),
    /// Notices may have been missed (the subscription was lost and is back): treat everything as changed.
    Missed,
}

/// How many notices a slow listener may fall behind before it is told [`Notice::Missed`] instead.
pub const NOTICE_BACKLOG: usize = 4_096;

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
    /// writing it. Every mode takes it: a hit, a peek (the hypothetical cost), a [forced](Hit::force) hit, a
    /// [reservation](Hit::reservation) (each tier holds its own estimate) and a [settlement](Settlement) (each tier's
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
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => self.burst,
            _ => self.limit,
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
    /// what a [forced](Hit::force) hit or a settlement's charge counts in that tier: `k + 1`, no longer up to
    /// `K + 1` (a bucket was charged at most `burst + 1` tokens already, so only windows count less), and what a
    /// reservation records as its estimate. Any count above a limit answers the same while it lasts.
    pub fn bounded_cost(&self, hit_cost: u64) -> u64 {
        self.cost.unwrap_or(hit_cost).min(self.capacity().saturating_add(1))
    }
}

/// One descriptor's hit against all its limits, decided together: every tier admits it, or none is charged (except a
/// lone fixed window, which counts denials as the reference does, but never a cost above its limit, which can never
/// fit, and a [forced](Hit::force) hit, which every tier counts).
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
    /// Count `cost` against every tier whatever the limits say: a usage that already happened (an RLQS usage
    /// report). The outcome still says whether it fit; later hits see the count, past the limit or not. For the
    /// counting algorithms only (`fixed_window`, `sliding_window`, `token_bucket`, `leaky_bucket`): a hit with a
    /// tier of another algorithm is decided as an ordinary one (see [`Hit::forced`]).
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
    pub force: bool,
    /// Hold what the hit is charged as a reservation, to be [settled](Store::settle) later with the actual costs (a
    /// cost budget: reserve an estimate, settle what was used). An admitted hit with a positive cost in some tier (or
    /// a [forced](Hit::force) one, which is always counted) also writes the record `reservation.key`: what each tier
    /// was charged (its bounded cost, [`TierSpec::bounded_cost`], 0 included) and when. A denied hit, a hit whose
    /// every tier's cost is 0 and a peek write none. For the counting algorithms only, as [`Hit::force`]: on a hit
    /// with a tier of another algorithm it is ignored.
    pub reservation: Option<ReservationSpec>,
}

impl Hit {
    /// Each tier's cost, in order, as the stores decide with it ([`TierSpec::bounded_cost`]).
    pub(crate) fn tier_costs(&self) -> Vec<u64> {
        self.tiers.iter().map(|t| t.bounded_cost(self.cost)).collect()
    }

    /// Whether the hit is counted whatever the limits say: `force`, when every tier counts (`fixed_window`,
    /// `sliding_window`, `token_bucket`, `leaky_bucket`). Both stores decide by this one test.
    pub fn forced(&self) -> bool {
        self.force && self.counts()
    }

    /// The reservation the hit holds if it is admitted: `reservation`, when every tier counts. Both stores decide
    /// by this one test.
    pub(crate) fn reserves(&self) -> Option<&ReservationSpec> {
        self.reservation.as_ref().filter(|_| self.counts())
    }

    /// Whether every tier is of a counting algorithm (`fixed_window`, `sliding_window`, `token_bucket`,
    /// `leaky_bucket`): what forced hits, reservations and settlements need.
    pub(crate) fn counts(&self) -> bool {
        self.tiers.iter().all(|t| {
            matches!(
                t.algorithm,
                Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::TokenBucket | Algorithm::LeakyBucket
            )
        })
    }
}

/// What an admitted hit holds against its tiers until settled: the record `key` (same hash tag as the
/// descriptor's tiers, built by [`Identity::reservation`]) lives `ttl_us`.
///
/// The record keeps the cost each tier was charged (its estimate, in tier order), when, and when it expires by the
/// decision's clock (`now_us` + `ttl_us`, rounded up to whole milliseconds as every TTL is; `ttl_us` is bounded by
/// [`MAX_RESERVATION_TTL_US`]): a settlement at or after that time finds nothing, whether or not the key is still
/// there. A reservation that is never settled simply expires, and what it was charged stays counted, as any hit is.
/// In Redis the record is a hash `{e, t, x}`: `e` the estimates as decimal integers joined by `,` (a single number for
/// one tier), `t` when it was charged and `x` when it expires, in microseconds (see `lua/decide.lua`).
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
/// `hit` names the descriptor's tiers (as the reserving hit did, in the same order) and carries the actual costs: each
/// tier's is its own [`cost`](TierSpec::cost), else the hit's `cost`, bounded as any cost is
/// ([`TierSpec::bounded_cost`]: at most the tier's capacity + 1, so the arithmetic stays exact); its other fields are
/// not read. `reservation` is the record the reserving hit wrote ([`ReservationSpec::key`]), with the same hash tag as
/// the tiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub hit: Hit,
    pub reservation: CounterKey,
    /// Reap instead of settle: only a reservation that has expired unsettled is found (a record is kept
    /// [`RESERVATION_GRACE_US`] past its expiry for this), its record removed and its estimates reported as
    /// settled at the estimate; no counter changes. One that is still live, or gone, is `Unknown`.
    pub reap: bool,
}

/// How long a reservation record outlives its expiry, so that the instance that made it can reap it: count it as
/// expired unsettled. Settling it in that time finds nothing.
pub const RESERVATION_GRACE_US: u64 = 60_000_000;

/// What [`Store::settle`] did with one settlement.
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
/// - `actual > estimate`: `charged` = `actual - estimate` is counted on the tier as a [forced](Hit::force) hit of
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

/// One holder's claim on an RLQS bucket's quota, in the bucket's grant ledger ([`Store::grant`]). A holder is one
/// Envoy's stream; the ledger records, per holder, the tokens it was granted and has not yet reported used, and how
/// many it wants, so that every instance on one store shares out the same quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The quota's limits (their `cost` is not read): what the quota has left is the least any of them has left now,
    /// as a peek of cost 0 reports it.
    pub tiers: Vec<TierSpec>,
    /// The ledger, with the tiers' hash tag ([`Identity::grants`]).
    pub ledger: CounterKey,
    pub holder: String,
    /// What the holder holds now by its own account: what it was granted less what it reported used (0 once it is
    /// known to have spent everything). At most [`MAX_LEDGER_AMOUNT`].
    pub held: u64,
    /// How many tokens it wants (its recent demand), at most [`MAX_LEDGER_AMOUNT`]; 0: it leaves the ledger.
    pub want: u64,
    /// How long its entry lasts without another grant (an entry whose time has come counts for nothing and is
    /// removed).
    pub ttl_us: u64,
}

/// The most a ledger records of one holder's tokens or wants: exact in the scripts' doubles.
pub const MAX_LEDGER_AMOUNT: u64 = 1 << 52;

/// What [`Store::grant`] decided for a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Granted {
    /// What the holder may hold from now on: see [`Store::grant`]. Its entry is the larger of this and what it held.
    pub held: u64,
    /// Its max-min fair share of what is left.
    pub share: u64,
    /// What the quota has left (the least of its limits).
    pub left: u64,
    /// The holder's entry now: the larger of `held` and what it holds (at most its entry before).
    pub entry: u64,
    /// The live holders, this one included (0 holders besides when it left).
    pub holders: u64,
    /// What every live holder holds, this one's new amount included: never more than `left` when a grant began
    /// within it.
    pub total_held: u64,
}

/// Max-min fair shares of `capacity` among holders that want `wants` (name, want), in the order given: holders are
/// served from the least wanting up (ties by name), each getting what it wants or an equal part, rounded down, of
/// what the ones before left, whichever is less. What rounding leaves over stays unassigned: the shares never add
/// up to more than `capacity`. Doorman's FAIR_SHARE, in whole tokens; `lua/ledger.lua`'s `fair_shares` is its twin.
pub fn fair_shares(capacity: u64, wants: &[(&str, u64)]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by(|&a, &b| (wants[a].1, wants[a].0).cmp(&(wants[b].1, wants[b].0)));
    let mut shares = vec![0; wants.len()];
    let mut left = capacity;
    for (served, &i) in order.iter().enumerate() {
        let equal = left / (wants.len() - served) as u64;
        let share = wants[i].1.min(equal);
        shares[i] = share;
        left -= share;
    }
    shares
}

/// What a holder holding `held` gets, wanting its `share`, when the others hold `others` (each `(held, share)`) of a
/// quota with `left` left: the rule of [`Store::grant`], shared by both stores (`lua/ledger.lua`'s `grant` is its
/// twin).
pub fn granted_amount(left: u64, held: u64, share: u64, others: &[(u64, u64)]) -> u64 {
    if left == 0 {
        return 0;
    }
    let others_held: u64 = others.iter().map(|o| o.0).sum();
    let free = left.saturating_sub(others_held).saturating_sub(held);
    if held < share {
        held + (share - held).min(free)
    } else {
        // Give back what the others lack of their shares and cannot take from what is free, and what the holders hold
        // past what is left (usage admitted outside any grant), never going below the share.
        let lacking: u64 = others.iter().map(|&(h, s)| s.saturating_sub(h)).sum();
        let over = (others_held + held).saturating_sub(left);
        let back = lacking.saturating_sub(free).saturating_add(over);
        share.max(held - back.min(held))
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

/// One window of a global limit's counter (a `fixed_window` or `sliding_window` tier whose
/// [`global`](TierSpec::global) is set): the tier's key, its window and the window's first microsecond.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WindowRef {
    pub key: CounterKey,
    pub algorithm: Algorithm,
    pub window_us: u64,
    pub start_us: u64,
}

impl WindowRef {
    /// The window of `tier` that `now_us` falls in.
    pub fn of(tier: &TierSpec, now_us: u64) -> WindowRef {
        WindowRef {
            key: tier.key.clone(),
            algorithm: tier.algorithm,
            window_us: tier.window_us,
            start_us: now_us - now_us % tier.window_us.max(1),
        }
    }

    /// Until when its count still weighs in decisions: the window's end, and a sliding window's next window too
    /// (it is the previous one there), plus a second's grace as the counters' own keys have.
    pub fn expires_us(&self) -> u64 {
        let windows = if self.algorithm == Algorithm::SlidingWindow {
            2
        } else {
            1
        };
        self.start_us + windows * self.window_us + 1_000_000
    }
}

/// One region's own count in one window, as shipped to the others ([`Store::merge_counts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionCount {
    pub window: WindowRef,
    pub count: u64,
}

/// One answer per hit, in order: its outcome, or why its counters could not be decided.
pub type Answers = Vec<Result<Outcome, StoreError>>;

/// What [`Store::reset_idle_streams`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamReset {
    /// Empty streams that existed and were deleted.
    pub deleted: u64,
    /// Streams kept because entries still wait in them, in the order given.
    pub kept: Vec<CounterKey>,
}

/// A change to a list's run-time entries.
#[derive(Debug, Clone, Copy)]
pub enum ListChange<'a> {
    /// Adds `values` (or renews them, when present) until `expires_us`, or for good; refused when the list would then
    /// hold more than `max` entries.
    Add {
        values: &'a [String],
        expires_us: Option<u64>,
        max: usize,
    },
    Remove {
        values: &'a [String],
    },
}

/// Counts to add to a set of top values (see [`Store::tally`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    pub set: CounterKey,
    pub counts: Vec<(String, u64)>,
}

/// How far back [`Store::top`] sums: the last minute (the six 10-second buckets before the current one, and the
/// current one: 60 to 70 seconds), or the last hour (sixty minute buckets and the current one: 60 to 61 minutes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    Minute,
    Hour,
}

impl Span {
    /// The length of its buckets, and how many buckets it sums.
    pub fn buckets(self) -> (u64, u64) {
        match self {
            Span::Minute => (TOP_SHORT_BUCKET_US, 7),
            Span::Hour => (TOP_LONG_BUCKET_US, 61),
        }
    }

    /// The bucket keys of `set` it sums at `now_us`, newest first.
    pub fn keys(self, set: &CounterKey, now_us: u64) -> Vec<CounterKey> {
        let (width, count) = self.buckets();
        let current = now_us - now_us % width;
        (0..count)
            .filter_map(|i| current.checked_sub(i * width))
            .map(|start| set.bucket(self, start))
            .collect()
    }
}

/// Summed counts, largest first (ties by value).
pub fn ranked(sums: std::collections::HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = sums.into_iter().collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all
}

/// The buckets of top values: ten seconds, and a minute.
pub const TOP_SHORT_BUCKET_US: u64 = 10_000_000;
pub const TOP_LONG_BUCKET_US: u64 = 60_000_000;
/// How long a bucket of top values is kept: the hour it serves and ten minutes.
pub const TOP_BUCKET_TTL_US: u64 = 4_200_000_000;

/// How long a second of outcome counts is kept: the dashboard's fifteen minutes, and one more.
pub const SERIES_TTL_US: u64 = 960_000_000;

/// One run-time entry of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    pub value: String,
    /// When it expires, in microseconds since the Unix epoch; `None`: never.
    pub expires_us: Option<u64>,
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

    /// Whether the server failed to answer (rather than answering with an error about this one call, such as a key
    /// of the wrong type): what counts against its circuit breaker.
    pub fn is_unreachable(&self) -> bool {
        !matches!(self, StoreError::Script(_))
    }
}

/// Counter storage. `now_us` is the request's time in microseconds since the Unix epoch, read once per request
/// (the Redis store may use the server's clock instead, see [`redis::RedisSettings`]).
pub trait Store: Send + Sync + 'static {
    /// A short name for metrics and logs: `memory` or `redis`.
    fn name(&self) -> &'static str;

    /// Applies every hit of one request and answers each, in order.
    fn hit(&self, now_us: u64, hits: &[Hit]) -> impl Future<Output = Answers> + Send;

    /// Reports on `hits` (their `cost` is hypothetical) without creating, changing or extending anything.
    fn peek(&self, now_us: u64, hits: &[Hit]) -> impl Future<Output = Answers> + Send;

    /// The failure domain of a hit: which server holds its counters. Hits of one domain reach the store or fail
    /// together, and each domain has a circuit breaker of its own. A store on one server has one domain, 0.
    fn failure_domain(&self, _hit: &Hit) -> u64 {
        0
    }

    /// Ends the lease `lease` in each of the `concurrency` counters `keys`; returns how many it ended.
    fn release(&self, keys: &[CounterKey], lease: &str) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes exactly the counters `keys`; returns how many existed.
    fn reset(&self, keys: &[CounterKey]) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes each of the `queue` streams `keys` that holds no entry at `now_us`, each checked and deleted
    /// atomically, so that work appended meanwhile is never lost; returns how many existed and were deleted, and the
    /// streams kept because they still hold entries.
    fn reset_idle_streams(
        &self,
        now_us: u64,
        keys: &[CounterKey],
    ) -> impl Future<Output = Result<StreamReset, StoreError>> + Send;

    /// Settles each reservation, in order, each atomically (it reads and deletes the record and charges or refunds
    /// every tier in one step), independently of the others: see [`Settled`]. A reservation settles once; a second
    /// settlement finds nothing.
    fn settle(
        &self,
        now_us: u64,
        settlements: &[Settlement],
    ) -> impl Future<Output = Vec<Result<Settled, StoreError>>> + Send;

    /// Updates each grant's holder in its ledger and decides what it may hold, each atomically with the ledger and
    /// the quota's limits, independently of the others. Entries whose time has come are removed first. The holder's
    /// entry becomes `held` and `want` (a want of 0 removes it, and it gets 0); then, with `left` the least any
    /// limit has left and each live holder's max-min fair share of it by want ([`fair_shares`]), it gets:
    /// - below its share: more, up to its share, from what no holder holds (`left` less every holder's amount);
    /// - above it: less, by what the others lack of their shares beyond what is free, never below its share
    ///   ([`granted_amount`]);
    /// - nothing once nothing is left.
    ///
    /// Its entry becomes the larger of that and `held` (at most its entry before): tokens handed out are not taken
    /// back before the holder says it has not spent them. So, if every holder's amount only ever grows by a grant and goes down by what it reports
    /// used (or was never handed out), what all holders hold together never exceeds what is left, rounding included.
    /// The entry then lasts `ttl_us`.
    fn grant(&self, now_us: u64, grants: &[Grant]) -> impl Future<Output = Vec<Result<Granted, StoreError>>> + Send;

    /// Changes the run-time entries of the list stored under `list` (see [`ListChange`]); entries expired at
    /// `now_us` are removed first. Returns how many entries were added or removed; `None` when an addition would make
    /// the list hold more than its bound (nothing is added then).
    fn list_change(
        &self,
        now_us: u64,
        list: &CounterKey,
        change: ListChange<'_>,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// The run-time entries of the list stored under `list` that have not expired at `now_us`.
    fn list_entries(
        &self,
        now_us: u64,
        list: &CounterKey,
    ) -> impl Future<Output = Result<Vec<ListEntry>, StoreError>> + Send;

    /// Adds each tally's counts into the buckets of its set that hold `now_us` (a 10-second one and a minute one),
    /// keeping the `kept` largest of each bucket; buckets expire after an hour and ten minutes. Not atomic across
    /// tallies: a failure may leave some added.
    fn tally(&self, now_us: u64, tallies: &[Tally], kept: usize)
    -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The counts of the set `set` over `span` back from `now_us`, summed across its buckets, largest first.
    fn top(
        &self,
        now_us: u64,
        set: &CounterKey,
        span: Span,
    ) -> impl Future<Output = Result<Vec<(String, u64)>, StoreError>> + Send;

    /// Adds per-second counts into the hashes of the set `set`: each `(second, field, n)` into the hash of that second
    /// (seconds since the Unix epoch), each hash gone [`SERIES_TTL_US`] after its last write.
    fn series_add(
        &self,
        set: &CounterKey,
        counts: &[(u64, String, u64)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The hashes of the set `set` for the seconds `from..=to`, in order (empty where nothing was counted).
    fn series_read(
        &self,
        set: &CounterKey,
        from: u64,
        to: u64,
    ) -> impl Future<Output = Result<Vec<std::collections::HashMap<String, u64>>, StoreError>> + Send;

    /// This region's own counts in `windows` of global limits at `now_us` (0 where nothing is counted): what is
    /// shipped to the other regions ([`crate::regions`]).
    fn window_counts(
        &self,
        now_us: u64,
        windows: &[WindowRef],
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;

    /// Takes what `region` counted in each window, keeping the larger of it and what is known of that region there:
    /// a count shipped twice, late or out of order changes nothing. Each window's record of the other regions lives
    /// until the window's [`expires_us`](WindowRef::expires_us), by `now_us`.
    fn merge_counts(
        &self,
        now_us: u64,
        region: &str,
        counts: &[RegionCount],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether the store answers (for `/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Tells every instance sharing this store, this one included, about `notice`. Best effort: a notice that cannot
    /// be sent is logged and dropped (the listeners' own loss of the subscription is what [`Store::hearing`] tells).
    fn announce(&self, notice: Notice) -> impl Future<Output = ()> + Send;

    /// The notices announced by every instance sharing the store (this one included), as they arrive; each call gives
    /// a new receiver. A receiver that lags more than [`NOTICE_BACKLOG`] behind loses the oldest: it must then treat
    /// everything as changed, as for [`Notice::Missed`].
    fn notices(&self) -> tokio::sync::broadcast::Receiver<Notice>;

    /// Whether notices from other instances reach this one now. While they do not (the subscription is down or not
    /// yet up), state that relies on them must not be trusted: the local cache answers nothing.
    fn hearing(&self) -> bool {
        true
    }
}

/// The name of one counter in a store.
///
/// Encoding: `<prefix>{<tag>}<identity>|<algorithm>/<window seconds>`, `<prefix>{<tag>}<identity>|records` for
/// hit records, `<prefix>{<tag>}<identity>|grants` for the grant ledger of an RLQS bucket, and
/// `<prefix>{<tag>}<identity>|reservation/<id>` for the record of a reservation (`<id>` as the caller gives it, last
/// in the key, after a name no algorithm has). In Redis a fixed window keeps each window's count under its own key,
/// the counter's key then `:<start>`, the window's first microsecond in decimal ([`CounterKey::window`]). `<identity>` is `<domain>`
/// then, per descriptor entry, `|<key>=<value>`, every piece written as `<byte length>:<bytes>` (so `a_b`+`c` and
/// `a`+`b_c` can never collide, whatever bytes the request carries); an RLQS bucket's identity is `rlqs|` then the
/// same, with its entries in key order.
/// `<tag>` is 16 hex digits of a 64-bit FNV-1a hash of `<identity>`: a Redis hash tag that keeps every key of one
/// descriptor on one cluster slot, and that raw request text never reaches. The prefix may not contain `{` or `}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterKey {
    key: String,
    tag: u64,
}

impl From<CounterKey> for String {
    fn from(key: CounterKey) -> String {
        key.key
    }
}

impl CounterKey {
    /// The key of the run-time entries of the list `name` in `domain`: `<prefix>{<tag>}list|<domain>|<name>=`, every
    /// piece with its length, an identity no descriptor or bucket can have (theirs start with a length or `rlqs|`).
    pub fn list(prefix: &str, domain: &str, name: &str) -> CounterKey {
        let identity = KeyBuilder::start(prefix, "list|", domain).entry(name, "").finish();
        CounterKey {
            key: identity.base,
            tag: identity.tag,
        }
    }

    /// The set of top values `kind` (`hits`, `denied`) of the rule `rule` in `domain`:
    /// `<prefix>{<tag>}top|<domain>|<rule>=<kind>`, every piece with its length.
    pub fn top(prefix: &str, domain: &str, rule: &str, kind: &str) -> CounterKey {
        let identity = KeyBuilder::start(prefix, "top|", domain).entry(rule, kind).finish();
        CounterKey {
            key: identity.base,
            tag: identity.tag,
        }
    }

    /// The per-second outcome counts of `domain` (see [`Store::series_add`]): `<prefix>{<tag>}series|<domain>`, and
    /// `:<second>` per second.
    pub fn series(prefix: &str, domain: &str) -> CounterKey {
        let identity = KeyBuilder::start(prefix, "series|", domain).finish();
        CounterKey {
            key: identity.base,
            tag: identity.tag,
        }
    }

    /// One second of a set of per-second counts.
    pub fn second(&self, second: u64) -> CounterKey {
        let mut key = String::with_capacity(self.key.len() + 12);
        key.push_str(&self.key);
        key.push(':');
        push_decimal(&mut key, second);
        CounterKey { key, tag: self.tag }
    }

    /// One bucket of a set of top values: the set's key, `:s` (ten seconds) or `:m` (a minute), and the bucket's
    /// first microsecond.
    pub fn bucket(&self, span: Span, start_us: u64) -> CounterKey {
        let mut key = String::with_capacity(self.key.len() + 20);
        key.push_str(&self.key);
        key.push_str(if span == Span::Minute { ":s" } else { ":m" });
        push_decimal(&mut key, start_us);
        CounterKey { key, tag: self.tag }
    }

    /// Starts the identity of a descriptor in `domain`, with the configured prefix.
    pub fn builder(prefix: &str, domain: &str) -> KeyBuilder {
        KeyBuilder::start(prefix, "", domain)
    }

    /// Starts the identity of an RLQS bucket in `domain`. Its counters never meet a descriptor's: the identity
    /// starts with `rlqs|`, where a descriptor's starts with a length.
    pub fn bucket_builder(prefix: &str, domain: &str) -> KeyBuilder {
        KeyBuilder::start(prefix, "rlqs|", domain)
    }

    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The hash of the identity: equal for every key of one descriptor.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The key of one window of a fixed or sliding window's counter in Redis: this key, `:`, and the window's first
    /// microsecond (`lua/fixed_window.lua`'s `window_of`, `lua/sliding_window.lua`'s `sw_read`).
    pub fn window(&self, start_us: u64) -> CounterKey {
        let mut key = String::with_capacity(self.key.len() + 18);
        key.push_str(&self.key);
        key.push(':');
        push_decimal(&mut key, start_us);
        CounterKey { key, tag: self.tag }
    }

    /// The key of what the other regions counted in one window of a global limit ([`CounterKey::window`] then
    /// `@regions`): a hash, one field per region, each that region's own count (`lua/global.lua`).
    pub fn regions(&self, start_us: u64) -> CounterKey {
        let mut key = self.window(start_us);
        key.key.push_str(REGIONS_SUFFIX);
        key
    }
}

/// What [`CounterKey::regions`] appends to a window's key (`lua/global.lua` knows it too).
const REGIONS_SUFFIX: &str = "@regions";

/// Appends entries to an identity.
#[derive(Debug)]
pub struct KeyBuilder {
    /// The whole key so far: the prefix, the tag's place, then the identity.
    out: String,
    /// Where the tag's 16 hex digits go, once the identity is complete.
    tag_at: usize,
}

impl KeyBuilder {
    /// The key is built in one string, the tag's digits written in place at the end: a key costs one allocation
    /// and no formatting, on every hit.
    fn start(prefix: &str, kind: &str, domain: &str) -> KeyBuilder {
        let mut out = String::with_capacity(prefix.len() + 18 + kind.len() + domain.len() + 64);
        out.push_str(prefix);
        out.push('{');
        let tag_at = out.len();
        out.push_str("0000000000000000}");
        out.push_str(kind);
        piece(&mut out, domain);
        KeyBuilder { out, tag_at }
    }

    pub fn entry(mut self, key: &str, value: &str) -> KeyBuilder {
        self.out.push('|');
        piece(&mut self.out, key);
        self.out.push('=');
        piece(&mut self.out, value);
        self
    }

    /// Finishes the identity.
    pub fn finish(mut self) -> Identity {
        let digits = self.tag_at..self.tag_at + 16;
        let tag = fnv1a(&self.out.as_bytes()[digits.end + 1..]);
        let mut hex = [0u8; 16];
        for (i, d) in hex.iter_mut().enumerate() {
            *d = b"0123456789abcdef"[((tag >> (60 - 4 * i)) & 0xf) as usize];
        }
        self.out
            .replace_range(digits, std::str::from_utf8(&hex).unwrap_or_default());
        Identity { base: self.out, tag }
    }
}

/// The identity of one descriptor, from which its counters' keys are derived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    base: String,
    tag: u64,
}

impl Identity {
    /// The key of one limit's state.
    pub fn tier(&self, algorithm: Algorithm, window_us: u64) -> CounterKey {
        let name = algorithm.name();
        let mut key = String::with_capacity(self.base.len() + name.len() + 22);
        key.push_str(&self.base);
        key.push('|');
        key.push_str(name);
        key.push('/');
        push_decimal(&mut key, window_us / 1_000_000);
        CounterKey { key, tag: self.tag }
    }

    /// The key of a limit that counts a cost of its own (see `rules::TierCost`): `label` names it, so that two limits
    /// with the same algorithm and window (input and output tokens per minute) keep separate counters.
    pub fn tier_costing(&self, algorithm: Algorithm, window_us: u64, label: &str) -> CounterKey {
        let mut key = format!("{}|{}/{}/", self.base, algorithm.name(), window_us / 1_000_000);
        piece(&mut key, label);
        CounterKey { key, tag: self.tag }
    }

    /// The grant ledger of an RLQS bucket's quota ([`Grant`]): `<base>|grants`.
    pub fn grants(&self) -> CounterKey {
        CounterKey {
            key: format!("{}|grants", self.base),
            tag: self.tag,
        }
    }

    /// The key of the record of the reservation `id` ([`ReservationSpec`]): `<base>|reservation/<id>`, with the
    /// descriptor's hash tag.
    pub fn reservation(&self, id: &str) -> CounterKey {
        CounterKey {
            key: format!("{}|reservation/{id}", self.base),
            tag: self.tag,
        }
    }

    /// The key of the hit-record list.
    pub fn records(&self) -> CounterKey {
        CounterKey {
            key: format!("{}|records", self.base),
            tag: self.tag,
        }
    }
}

fn piece(out: &mut String, s: &str) {
    push_decimal(out, s.len() as u64);
    out.push(':');
    out.push_str(s);
}

/// Appends `n` in decimal, without going through `fmt` (keys are built on every hit).
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// 64-bit FNV-1a: stable across processes and versions, which a hash tag must be.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Checks a key prefix: it may not contain hash-tag braces.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.contains(['{', '}']) {
        return Err(format!("key prefix '{prefix}' may not contain '{{' or '}}'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(entries: &[(&str, &str)]) -> String {
        let mut b = CounterKey::builder("p:", "d");
        for (k, v) in entries {
            b = b.entry(k, v);
        }
        b.finish().tier(Algorithm::FixedWindow, 60_000_000).key
    }

    #[test]
    fn encoding_is_unambiguous() {
        assert_ne!(key(&[("a_b", "c")]), key(&[("a", "b_c")]));
        assert_ne!(key(&[("a", "b|c=d")]), key(&[("a", "b"), ("c", "d")]));
        assert_ne!(key(&[("a", "")]), key(&[("a", "}")]));
    }

    #[test]
    fn layout_and_hash_tag() {
        let k = key(&[("user", "{x}")]);
        assert!(k.starts_with("p:{"), "{k}");
        let tag_end = k.find('}').unwrap();
        assert_eq!(tag_end, 3 + 16, "{k}");
        assert!(k[3..tag_end].chars().all(|c| c.is_ascii_hexdigit()));
        assert!(k.ends_with("1:d|4:user=3:{x}|fixed_window/60"), "{k}");
        // Byte for byte: counters written by one version are found by the next.
        assert_eq!(k, "p:{424ad63badd19887}1:d|4:user=3:{x}|fixed_window/60");
    }

    #[test]
    fn every_key_of_a_descriptor_shares_the_tag() {
        let id = CounterKey::builder("", "d").entry("k", "v").finish();
        let a = id.tier(Algorithm::FixedWindow, 1_000_000);
        let b = id.tier(Algorithm::TokenBucket, 1_000_000);
        let r = id.records();
        let v = id.reservation("req-1");
        assert!(v.key.ends_with("1:k=1:v|reservation/req-1"), "{}", v.key);
        assert_eq!(v.tag(), a.tag());
        assert_eq!(v.key[..18], a.key[..18]);
        assert_ne!(a, b);
        assert_eq!(a.key[..18], b.key[..18]);
        assert_eq!(a.key[..18], r.key[..18]);
        assert_eq!((a.tag(), b.tag()), (r.tag(), r.tag()));
        assert!(check_prefix("a{").is_err());
    }
}
