//! One shard of the memory store: the states of the keys whose hash tag falls in it, each with the time it expires
//! (the script's TTL), and a schedule of those times, so that memory stays bounded by the live counters and the work
//! of evicting is proportional to what expires: nothing scans a shard, and states that expire together (fixed
//! windows all end on the same boundary) go over the next accesses rather than in one pause.
//!
//! A key's state is a counter's ([`Counter`], kept by its algorithm's file in `store/algorithm/`) or one of the
//! decision loop's own: hit records, a reservation, an RLQS grant ledger. Every write goes through one "update the state or
//! create it" step, [`Shard::upsert`], which is also the [`Keyspace`] the algorithms' commits write to.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use crate::store::algorithm::{Counter, CounterState, Expiry, Keyspace};

/// States evicted per shard access at most: about the cost of one more lookup, and far more than one access adds.
pub(super) const SWEEP_BATCH: usize = 16;

/// The state of one key, shaped like the Redis value its script keeps.
#[derive(Debug, Clone)]
pub(super) enum State {
    Counter(Counter),
    Records(Records),
    Reservation(Reservation),
    Ledger(Ledger),
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

/// An RLQS bucket's grant ledger: per holder, (held, want, until, newcomer), the hash of `lua/ledger.lua`.
#[derive(Debug, Clone, Default)]
pub(super) struct Ledger(pub(super) BTreeMap<String, (u64, u64, u64, bool)>);

/// One shape of [`State`]: what [`Shard::upsert`] finds in, or makes into, a key's state.
pub(super) trait Shape: Default {
    /// The state as this shape, if it has it.
    fn of(state: &mut State) -> Option<&mut Self>;
    fn into_state(self) -> State;
}

impl<T: CounterState> Shape for T {
    fn of(state: &mut State) -> Option<&mut T> {
        match state {
            State::Counter(counter) => T::of_mut(counter),
            _ => None,
        }
    }

    fn into_state(self) -> State {
        State::Counter(self.into())
    }
}

macro_rules! shapes {
    ($($shape:ident),*) => {$(
        impl Shape for $shape {
            fn of(state: &mut State) -> Option<&mut $shape> {
                match state {
                    State::$shape(shape) => Some(shape),
                    _ => None,
                }
            }

            fn into_state(self) -> State {
                State::$shape(self)
            }
        }
    )*};
}

shapes!(Records, Reservation, Ledger);

#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) entries: HashMap<Arc<str>, Entry>,
    /// Every key of `entries` (once, unless a reset or a settlement dropped it and it came back before its item came
    /// due) at the expiry it had when it was scheduled. An item that comes due evicts its state if the state has
    /// expired, and is scheduled again at the state's current expiry otherwise; a state whose expiry moved earlier (a
    /// clock step back, a bucket's refund) is evicted at the later time, and is invisible from its expiry on either
    /// way.
    pub(super) schedule: BinaryHeap<Reverse<(u64, Arc<str>)>>,
    /// The decisions made on this shard so far: the number of the one under way ([`Keyspace::decision`]).
    pub(super) decisions: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) state: State,
    pub(super) expires_at_us: u64,
}

impl Shard {
    /// Evicts up to [`SWEEP_BATCH`] states whose scheduled expiry has passed, and schedules again those whose
    /// expiry has since moved later.
    pub(super) fn sweep(&mut self, now: u64) {
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
    pub(super) fn insert(&mut self, key: &str, entry: Entry) {
        let key: Arc<str> = Arc::from(key);
        self.schedule.push(Reverse((entry.expires_at_us, Arc::clone(&key))));
        self.entries.insert(key, entry);
    }

    pub(super) fn live_mut(&mut self, key: &str, now: u64) -> Option<&mut Entry> {
        self.entries.get_mut(key).filter(|e| e.expires_at_us > now)
    }

    pub(super) fn live(&self, key: &str, now: u64) -> Option<&State> {
        self.entries
            .get(key)
            .filter(|e| e.expires_at_us > now)
            .map(|e| &e.state)
    }

    /// The live state of a counter.
    pub(super) fn counter(&self, key: &str, now: u64) -> Option<&Counter> {
        match self.live(key, now) {
            Some(State::Counter(counter)) => Some(counter),
            _ => None,
        }
    }

    /// Stores a state, in place when the key exists (no allocation on the hot path).
    pub(super) fn set(&mut self, key: &str, state: State, expires_at_us: u64) {
        match self.entries.get_mut(key) {
            Some(entry) => *entry = Entry { state, expires_at_us },
            None => self.insert(key, Entry { state, expires_at_us }),
        }
    }

    /// The step every write shares: the live state of `key`, updated in place by `update` when it has the shape
    /// `T`; otherwise (no state, an expired one, another shape) a new one, `T::default()` updated, that replaces
    /// it. Either way the state then expires as `expiry` says. Returns what `update` returns.
    pub(super) fn upsert<T: Shape, R>(
        &mut self,
        key: &str,
        now: u64,
        expiry: Expiry,
        update: impl FnOnce(&mut T) -> R,
    ) -> R {
        if let Some(entry) = self.live_mut(key, now)
            && let Some(state) = T::of(&mut entry.state)
        {
            let out = update(state);
            match expiry {
                Expiry::Always(at) => entry.expires_at_us = at,
                Expiry::AtLeast(at) => entry.expires_at_us = entry.expires_at_us.max(at),
                Expiry::OnCreate(_) => {}
            }
            return out;
        }
        let mut state = T::default();
        let out = update(&mut state);
        let (Expiry::Always(at) | Expiry::OnCreate(at) | Expiry::AtLeast(at)) = expiry;
        self.set(key, state.into_state(), at);
        out
    }

    /// Writes a refund over a counter's live state, which its algorithm's refund found: never creates one.
    pub(super) fn give_back(&mut self, key: &str, now: u64, refund: crate::store::algorithm::Refund) {
        if let Some(entry) = self.live_mut(key, now) {
            entry.state = State::Counter(refund.state);
            if let Some(at) = refund.expires_at_us {
                entry.expires_at_us = at;
            }
        }
    }
}

impl Keyspace for Shard {
    fn upsert<T: CounterState, R>(
        &mut self,
        key: &str,
        now: u64,
        expiry: Expiry,
        update: impl FnOnce(&mut T) -> R,
    ) -> R {
        Shard::upsert(self, key, now, expiry, update)
    }

    fn decision(&self) -> u64 {
        self.decisions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::algorithm::fixed_window::Fixed;
    use crate::store::algorithm::sliding_log::Log;
    use crate::store::algorithm::token_bucket::Tat;

    fn fixed(expires_at_us: u64) -> Entry {
        Entry {
            state: State::Counter(Counter::Fixed(Fixed { w: 0, n: 1 })),
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
        shard.set("k", State::Counter(Counter::Tat(Tat(30))), 30);
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
        let n = |shard: &Shard, now| match shard.counter("k", now) {
            Some(Counter::Fixed(f)) => Some(f.n),
            _ => None,
        };
        count(&mut shard, 0, Expiry::OnCreate(10));
        assert_eq!(shard.schedule.len(), 1, "a new key is scheduled");
        count(&mut shard, 5, Expiry::OnCreate(50));
        assert_eq!(n(&shard, 5), Some(2));
        assert_eq!(
            shard.entries["k"].expires_at_us, 10,
            "an update keeps an on-create expiry"
        );
        count(&mut shard, 6, Expiry::Always(20));
        assert_eq!(shard.entries["k"].expires_at_us, 20, "and takes an always one");
        count(&mut shard, 20, Expiry::OnCreate(40));
        assert_eq!(n(&shard, 20), Some(1), "an expired state is replaced, not updated");
        assert_eq!(shard.entries["k"].expires_at_us, 40);
        shard.upsert("k", 21, Expiry::OnCreate(60), |Log(log): &mut Log| log.push_back(21));
        assert!(
            matches!(shard.counter("k", 21), Some(Counter::Log(_))),
            "another shape is replaced"
        );
        assert_eq!(shard.entries["k"].expires_at_us, 60);
        assert_eq!(shard.schedule.len(), 1, "a key written again is not scheduled twice");
    }
}
