//! Where counters live: the memory store ([`memory`], the default) and the Redis store ([`redis`], the Lua scripts of
//! `lua/` run by EVALSHA), each implementing one small trait for the counters ([`Counters`]: decide, peek, reset) and
//! one per capability beside them (leases and streams, reservations, the RLQS ledger, notices, run-time lists, top
//! values, outcome series, region counts); [`Store`] is all of them. Both stores pass one contract suite
//! (`tests/contract.rs`) and a differential property test, so their answers never drift apart. Each algorithm's
//! arithmetic is written once, in `store/algorithm`, and both stores decide by it.
//!
//! A store receives every descriptor of one request at once and answers each on its own: a descriptor whose
//! counters could not be reached (a dead cluster primary, a key of the wrong type) gets its own error, and the others
//! keep their decisions. Each descriptor's limits (tiers) are decided together, atomically. Keys are built by
//! [`CounterKey`], in one documented encoding.

pub(crate) mod algorithm;
mod hit;
mod key;
mod ledger;
pub mod memory;
pub mod redis;
mod tallies;
mod windows;

use std::future::Future;

pub use algorithm::Algorithm;
pub use hit::*;
pub use key::*;
pub use ledger::*;
pub use tallies::*;
pub use windows::*;

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
    /// An instance (named by a string it chooses) has this many RLQS streams connected. Said when the number changes,
    /// and every [`STREAMS_EVERY_US`] while it is not 0: an instance not heard from for three times that has none.
    Streams(String, u64),
    /// The run-time entries of these lists changed (each named by its store key): read them again.
    Lists(Vec<String>),
    /// Notices may have been missed (the subscription was lost and is back): treat everything as changed.
    Missed,
}

/// How often an instance with RLQS streams says how many it has ([`Notice::Streams`]), in microseconds.
pub const STREAMS_EVERY_US: u64 = 1_000_000;

/// How many notices a slow listener may fall behind before it is told [`Notice::Missed`] instead.
pub const NOTICE_BACKLOG: usize = 4_096;

/// The counters: every descriptor's decisions. `now_us` is the request's time in microseconds since the Unix epoch,
/// read once per request (the Redis store may use the server's clock instead, see [`redis::RedisSettings`]).
pub trait Counters: Send + Sync + 'static {
    /// A short name for metrics and logs: `memory` or `redis`.
    fn name(&self) -> &'static str;

    /// Decides every hit of one request, each in its [`Mode`] (a peek changes nothing), and answers each, in order.
    fn hit(&self, now_us: u64, hits: &[Hit]) -> impl Future<Output = Answers> + Send;

    /// The failure domain of a hit: which server holds its counters. Hits of one domain reach the store or fail
    /// together, and each domain has a circuit breaker of its own. A store on one server has one domain, 0.
    fn failure_domain(&self, _hit: &Hit) -> u64 {
        0
    }

    /// Deletes exactly the counters `keys`; returns how many existed.
    fn reset(&self, keys: &[CounterKey]) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Whether the store answers (for `/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// What finished work gives back: a concurrency limit's leases, a queue's idle streams.
pub trait Releases: Send + Sync + 'static {
    /// Ends the lease `lease` in each of the `concurrency` counters `keys`; returns how many it ended.
    fn release(&self, keys: &[CounterKey], lease: &str) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes each of the `queue` streams `keys` that holds no entry at `now_us`, each checked and deleted
    /// atomically, so that work appended meanwhile is never lost; returns how many existed and were deleted, and the
    /// streams kept because they still hold entries.
    fn reset_idle_streams(
        &self,
        now_us: u64,
        keys: &[CounterKey],
    ) -> impl Future<Output = Result<StreamReset, StoreError>> + Send;
}

/// Cost budgets: the settlement of what a [reservation](Mode::Reserve) held.
pub trait Reservations: Send + Sync + 'static {
    /// Settles each reservation, in order, each atomically (it reads and deletes the record and charges or refunds
    /// every tier in one step), independently of the others: see [`Settled`]. A reservation settles once; a second
    /// settlement finds nothing.
    fn settle(
        &self,
        now_us: u64,
        settlements: &[Settlement],
    ) -> impl Future<Output = Vec<Result<Settled, StoreError>>> + Send;
}

/// The RLQS grant ledger: what each Envoy may hold of a bucket's quota, shared by every instance on one store.
pub trait Grants: Send + Sync + 'static {
    /// Updates each grant's holder in its ledger and decides what it may hold, each atomically with the ledger and
    /// the quota's limits, independently of the others. Entries whose time has come are removed first. The holder's
    /// entry becomes `held` and `want` (a want of 0 removes it, and it gets 0); then, with `left` the least any
    /// limit has left (or a rate's limit, [`Grant::rate`]), less a reserve of a [`RESERVE_PARTS`]th for a budget,
    /// shared out to the live holders by want ([`targets`]: max-min fair, and the surplus by want), it gets:
    /// - below its share: more, up to its share, from what no holder holds, the reserve left alone unless it is a
    ///   newcomer;
    /// - above it: its share, at once (its entry keeps what it holds);
    /// - a newcomer to a budget with no other holder, at most what is left divided by the streams connected
    ///   ([`Grant::newcomer`]); nothing once nothing is left ([`allot`]).
    ///
    /// For a budget its entry becomes the larger of that and `held` (at most its entry before): tokens handed out are
    /// not taken back before the holder says it has not spent them. So, if every holder's amount only ever grows by a
    /// grant and goes down by what it reports used (or was never handed out), what all holders hold together never
    /// exceeds what is left, rounding included. For a rate its entry is what it gets. The entry then lasts `ttl_us`.
    fn grant(&self, now_us: u64, grants: &[Grant]) -> impl Future<Output = Vec<Result<Granted, StoreError>>> + Send;
}

/// What the instances sharing one store tell each other ([`Notice`]).
pub trait Announcements: Send + Sync + 'static {
    /// Tells every instance sharing this store, this one included, about `notice`. Best effort: a notice that cannot
    /// be sent is logged and dropped (the listeners' own loss of the subscription is what [`Announcements::hearing`] tells).
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

/// The run-time entries of deny and allow lists.
pub trait Lists: Send + Sync + 'static {
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
}

/// The top values of each rule (the top offenders): counts in buckets of ten seconds and a minute.
pub trait Offenders: Send + Sync + 'static {
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
}

/// The per-second outcome counts the dashboard reads.
pub trait Series: Send + Sync + 'static {
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
}

/// The counts of global limits' windows shipped between regions ([`crate::regions`]).
pub trait RegionCounts: Send + Sync + 'static {
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
}

/// A whole store: the counters and every capability beside them. The memory and Redis stores implement each trait;
/// code that needs only one capability asks for that one.
pub trait Store:
    Counters + Releases + Reservations + Grants + Announcements + Lists + Offenders + Series + RegionCounts
{
}

impl<T> Store for T where
    T: Counters + Releases + Reservations + Grants + Announcements + Lists + Offenders + Series + RegionCounts
{
}
