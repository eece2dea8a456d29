//! What every algorithm of the memory store shares, the twin of `lua/prelude.lua`: the shapes a key's state takes
//! (each the Redis value its script keeps), what a check finds (the fields of a script's `check` state), the
//! keyspace a commit writes to with its one "update the state or create it" step, what a settlement's refund writes,
//! and the scripts' helpers (`ceil_ms`, `MAX_COUNT`).
//!
//! The algorithm files and the store's driver (`memory.rs`) import this file and it imports neither: an algorithm
//! reaches the shards only through [`Keyspace`], which the driver's shard implements, so no two files import each
//! other.

use std::collections::VecDeque;

/// The most a fixed window's count holds (`MAX_COUNT` in `lua/prelude.lua`): a lone fixed window counts its
/// denials, so hits of up to `u32::MAX` each could otherwise push it past 2^53, where the scripts' doubles stop
/// being exact. Any count above a limit answers the same.
pub(super) const MAX_COUNT: u64 = 1 << 52;

/// The most a sliding window's current count holds (`MAX_SLIDING_COUNT` in `lua/prelude.lua`): only forced hits
/// take it past its limit, and with the previous window's count (at most as much) and a cost added, the estimate
/// stays below 2^53.
pub(super) const MAX_SLIDING_COUNT: u64 = 1 << 51;

/// The most a bucket's arrival time is ever past an empty bucket's, `now + tolerance` (`MAX_DEBT_US` in
/// `lua/prelude.lua`): about 9 years of debt, which only forced hits run up. Times stay below 2^53 with the largest
/// bucket the configuration accepts (100 years) priced on top.
pub(super) const MAX_DEBT_US: u64 = 1 << 48;

/// The state of one key, shaped like the Redis value its script keeps.
#[derive(Debug, Clone)]
pub(super) enum State {
    Fixed(Fixed),
    Sliding(Sliding),
    Log(Log),
    Tat(Tat),
    Leases(Leases),
    Queue(Queue),
    Records(Records),
    Reservation(Reservation),
    Ledger(Ledger),
}

/// A fixed window's count: the hash {w, n} of `lua/fixed_window.lua`.
#[derive(Debug, Clone, Default)]
pub(super) struct Fixed {
    pub(super) w: u64,
    pub(super) n: u64,
}

/// A sliding window's counts: the hash {w, c, p} of `lua/sliding_window.lua`.
#[derive(Debug, Clone, Default)]
pub(super) struct Sliding {
    pub(super) w: u64,
    pub(super) c: u64,
    pub(super) p: u64,
}

/// Hit times, ascending: the sorted set of `lua/sliding_log.lua`.
#[derive(Debug, Clone, Default)]
pub(super) struct Log(pub(super) VecDeque<u64>);

/// A bucket's theoretical arrival time: the string of `lua/token_bucket.lua`.
#[derive(Debug, Clone, Default)]
pub(super) struct Tat(pub(super) u64);

/// (lease id, deadline): the sorted set of `lua/concurrency.lua`.
#[derive(Debug, Clone, Default)]
pub(super) struct Leases(pub(super) Vec<(String, u64)>);

/// Entry ids (ms, seq), oldest first, and the last id generated: the stream of `lua/queue.lua`.
#[derive(Debug, Clone, Default)]
pub(super) struct Queue {
    pub(super) entries: VecDeque<(u64, u64)>,
    pub(super) last: (u64, u64),
}

/// A descriptor's hit records, newest first: the list `lua/decide.lua` keeps.
#[derive(Debug, Clone, Default)]
pub(super) struct Records(pub(super) VecDeque<String>);

/// What a reservation charged each tier, in order, and when: the hash {e, t} `lua/decide.lua` keeps (its x, when it
/// expires by the decision's clock, is the entry's expiry).
#[derive(Debug, Clone, Default)]
pub(super) struct Reservation {
    pub(super) estimates: Vec<u64>,
    pub(super) at: u64,
    /// When it expires unsettled; the state itself lives `RESERVATION_GRACE_US` longer, to be reaped.
    pub(super) expires_at: u64,
}

/// An RLQS bucket's grant ledger: per holder, (held, want, until), the hash of `lua/ledger.lua`.
#[derive(Debug, Clone, Default)]
pub(super) struct Ledger(pub(super) std::collections::BTreeMap<String, (u64, u64, u64)>);

/// One shape of [`State`]: what [`Keyspace::upsert`] finds in, or makes into, a key's state.
pub(super) trait Shape: Default + Into<State> {
    /// The state as this shape, if it has it.
    fn of(state: &mut State) -> Option<&mut Self>;
}

macro_rules! shapes {
    ($($shape:ident),*) => {$(
        impl From<$shape> for State {
            fn from(shape: $shape) -> State {
                State::$shape(shape)
            }
        }

        impl Shape for $shape {
            fn of(state: &mut State) -> Option<&mut $shape> {
                match state {
                    State::$shape(shape) => Some(shape),
                    _ => None,
                }
            }
        }
    )*};
}

shapes!(Fixed, Sliding, Log, Tat, Leases, Queue, Records, Reservation, Ledger);

/// When a committed state expires: the script's PEXPIRE.
#[derive(Debug, Clone, Copy)]
pub(super) enum Expiry {
    /// At this time, whether the write created the state or updated it.
    Always(u64),
    /// At this time when the write creates the state; a state it updates keeps its expiry (a fixed window's TTL is
    /// set by its first hit and never extended).
    OnCreate(u64),
}

/// The keys a commit writes, as a script writes Redis keys: the memory store's shard.
pub(super) trait Keyspace {
    /// The step every commit shares: the live state of `key`, updated in place by `update` when it has the shape
    /// `T`; otherwise (no state, an expired one, another shape) a new one, `T::default()` updated, that replaces
    /// it. Either way the state then expires as `expiry` says. Returns what `update` returns.
    fn upsert<T: Shape, R>(&mut self, key: &str, now: u64, expiry: Expiry, update: impl FnOnce(&mut T) -> R) -> R;
}

/// What a tier's check found, as the scripts' `check` returns it.
#[derive(Debug, Clone)]
pub(super) struct Check {
    pub(super) ok: bool,
    pub(super) used0: u64,
    pub(super) used: u64,
    pub(super) rem0: u64,
    pub(super) rem1: u64,
    pub(super) reset0: u64,
    pub(super) reset1: u64,
    /// `None`: never.
    pub(super) retry: Option<u64>,
    /// What commit writes.
    pub(super) write: Write,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Write {
    Fixed { start: u64, n: u64, reset: u64 },
    Sliding { start: u64, c: u64, p: u64 },
    Log,
    Tat(u64),
    Lease,
    Queue,
}

/// What a settlement's refund writes to one tier, as the function a script's `refund` returns: the key's new state,
/// and its new expiry (`None`: it keeps its own). Written only over a live state, never creating one.
#[derive(Debug, Clone)]
pub(super) struct Refund {
    pub(super) state: State,
    /// What came back: at most the amount asked, less when the state held less.
    pub(super) given: u64,
    pub(super) expires_at_us: Option<u64>,
}

/// `ceil_ms` of `lua/prelude.lua`, in microseconds: a TTL rounded up to whole milliseconds, at least one.
pub(super) fn ceil_ms_us(us: u64) -> u64 {
    us.div_ceil(1_000).max(1) * 1_000
}

pub(super) fn retry(never: bool, ok: bool, wait: u64) -> Option<u64> {
    if never {
        None
    } else if ok {
        Some(0)
    } else {
        Some(wait)
    }
}
