//! What sluice decides a compact call's answer to be: each algorithm's own check (`store/algorithm/`), the one the
//! memory store decides by, made from the integers the script returned.

use fred::types::Value;

use super::{BucketTier, CompactTier, GlobalTier, SlidingTier, WindowTier};
use crate::store::Outcome;
use crate::store::algorithm::{self, fixed_window, sliding_window, token_bucket};
use crate::store::redis::reply::Reply;

impl CompactTier {
    /// The decision's time, or `None` for the server's.
    pub(in crate::store::redis) fn now_us(&self) -> Option<u64> {
        match self {
            CompactTier::Window(t) => t.now_us,
            CompactTier::Bucket(t) => t.now_us,
            CompactTier::Sliding(t) => t.now_us,
            CompactTier::Global(t) => t.now_us,
        }
    }

    /// The decision from the script's answer at `now_us` (a fixed window's count plus `ahead`, the counted costs of
    /// the hits ahead of it in a shared count); `None` when the answer is not of the call's shape (an error, which the
    /// caller passes on).
    pub(in crate::store::redis) fn answer(&self, value: &Value, ahead: u64, now_us: u64) -> Option<Reply> {
        self.decided(value, ahead, now_us).map(Reply::Decided)
    }

    /// A hit's decision from the script's answer (see [`CompactTier::answer`]).
    fn decided(&self, value: &Value, ahead: u64, now_us: u64) -> Option<Outcome> {
        let int = |v: &Value| v.as_i64().map(|n| n.max(0) as u64);
        match (self, value) {
            (CompactTier::Window(t), Value::Integer(n)) => Some(t.answer((*n).max(0) as u64 + ahead, now_us)),
            (CompactTier::Bucket(t), Value::Integer(n)) => Some(t.answer((*n).max(0) as u64, now_us)),
            (CompactTier::Sliding(t), Value::Array(counts)) => match &counts[..] {
                [c, p] => Some(t.answer(int(c)?, int(p)?, now_us)),
                _ => None,
            },
            // `ahead`: the hits ahead of this one in the call, each counted while it fits.
            (CompactTier::Global(t), Value::Array(counts)) => match (t.sliding, &counts[..]) {
                (false, [n, others]) => {
                    let (n, others) = (int(n)?, int(others)?);
                    let n = n + t.counted_ahead(n, others, ahead);
                    Some(t.answer(others, now_us, |limit| {
                        fixed_window::check_count(limit, t.window_us, now_us, t.cost, n)
                    }))
                }
                (true, [c, p, others]) => {
                    let (c, p, others) = (int(c)?, int(p)?, int(others)?);
                    let start = now_us - now_us % t.window_us.max(1);
                    let estimate = sliding_window::sw_estimate(p, c, now_us - start, t.window_us.max(1));
                    let c = c + t.counted_ahead(estimate, others, ahead);
                    Some(t.answer(others, now_us, |limit| {
                        sliding_window::check_counts(limit, t.window_us, now_us, t.cost, c, p)
                    }))
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// An ordinary hit's outcome on one tier, from its algorithm's check: a hit that fits and costs something was
/// written.
fn single(check: &crate::store::algorithm::Check, cost: u64, id: Option<String>) -> Outcome {
    let written = check.ok && cost > 0;
    Outcome {
        admitted: check.ok,
        tiers: vec![check.outcome(written, false, false, id.filter(|_| written))],
        records: Vec::new(),
    }
}

impl WindowTier {
    /// The decision from the count `n` before the hit.
    fn answer(&self, n: u64, now_us: u64) -> Outcome {
        single(
            &fixed_window::check_count(self.limit, self.window_us, now_us, self.cost, n),
            self.cost,
            None,
        )
    }
}

impl GlobalTier {
    /// What the `ahead` identical hits before one counted, from the count `used` (a sliding window's estimate) and
    /// the others' count the first found: each counts its cost while it fits what the others leave, and once one does
    /// not, none after it does (the global forms' `hit` counts as many).
    fn counted_ahead(&self, used: u64, others: u64, ahead: u64) -> u64 {
        let room = self.limit.saturating_sub(others).saturating_sub(used);
        match self.cost {
            0 => 0,
            cost => (room / cost).min(ahead) * cost,
        }
    }

    /// The decision from the other regions' count `others` and the algorithm's `check` against a limit. A hit that
    /// counted reports the count it left in its window ([`TierOutcome::own`](crate::store::TierOutcome::own)): what
    /// the script wrote.
    fn answer(&self, others: u64, now_us: u64, check: impl FnOnce(u64) -> algorithm::Check) -> Outcome {
        let check = algorithm::global_check((self.limit, self.window_us), now_us, self.cost, others, check);
        let mut outcome = single(&check, self.cost, None);
        if check.ok && self.cost > 0 {
            outcome.tiers[0].own = algorithm::own_count(&check, self.cost);
        }
        outcome
    }
}

impl BucketTier {
    /// The decision from the arrival time `tat` the hit found (at least its time).
    fn answer(&self, tat: u64, now_us: u64) -> Outcome {
        let check = token_bucket::check_tat(self.interval, self.burst, now_us, self.cost, false, tat);
        single(&check, self.cost, None)
    }
}

impl SlidingTier {
    /// The decision from the counts of the current window `c` and the previous one `p` the hit found.
    fn answer(&self, c: u64, p: u64, now_us: u64) -> Outcome {
        let check = sliding_window::check_counts(self.limit, self.window_us, now_us, self.cost, c, p);
        single(&check, self.cost, None)
    }
}
