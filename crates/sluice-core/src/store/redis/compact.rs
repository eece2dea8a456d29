//! The fast form of the commonest call (`fixed_window.lua`'s `hit`): a hit on a plain counter, a descriptor whose one
//! limit is a fixed window counted here alone, with nothing else to write. It travels as the window's key and two
//! numbers, one INCRBY where the decision loop (`lua/decide.lua`) takes its bookkeeping, and comes back as the
//! window's count before the hit, from which sluice makes the [`Outcome`] by the fixed window's own check
//! (`store/algorithm/fixed_window.rs`), the one the memory store decides by (the differential test holds the fast form,
//! the loop and the memory store to the same answers).

use fred::types::Value;

use crate::store::algorithm::fixed_window;
use crate::store::{CounterKey, Outcome, TierSpec};

/// A call in its compact form: its counter's key (the window's key is built from it when the call is assembled) and
/// what sluice decides it by.
#[derive(Debug, Clone)]
pub(super) struct Compact {
    pub(super) key: CounterKey,
    pub(super) tier: WindowTier,
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
    pub(super) now_us: Option<u64>,
}

impl Compact {
    /// A lone fixed window decided by the server's clock: its window and the cost it counts. Several in a row that
    /// share both travel as one run in the declared form (`call::declared`).
    pub(super) fn lone_window(&self) -> Option<(u64, u64)> {
        let t = &self.tier;
        t.now_us.is_none().then_some((t.window_us, t.counted))
    }

    /// The plain counter's hit in its compact form; `None` when the form does not apply: a window of 0, a time or
    /// window past i64.
    pub(super) fn of(now_us: Option<u64>, tier: &TierSpec, cost: u64) -> Option<Compact> {
        let fits =
            tier.window_us > 0 && tier.window_us <= i64::MAX as u64 && now_us.is_none_or(|now| now <= i64::MAX as u64);
        let cost = tier.bounded_cost(cost);
        fits.then(|| Compact {
            key: tier.key.clone(),
            tier: WindowTier {
                limit: tier.limit,
                window_us: tier.window_us,
                cost,
                counted: if cost <= tier.limit { cost } else { 0 },
                now_us,
            },
        })
    }

    /// Its key, the window's, by the server's clock the window's at `guess`, this host's time when the call is
    /// assembled, which the script checks against the server's.
    pub(super) fn push_keys(&self, guess: u64, out: &mut Vec<Value>) {
        let now = self.tier.now_us.unwrap_or(guess);
        let start = now - now % self.tier.window_us;
        out.push(Value::from(String::from(self.key.window(start))));
    }

    /// Its arguments: the window and the cost counted, then the decision's time, when it is given.
    pub(super) fn push_args(&self, out: &mut Vec<Value>) {
        let int = |n: u64| Value::Integer(n as i64);
        out.extend([int(self.tier.window_us), int(self.tier.counted)]);
        out.extend(self.tier.now_us.map(int));
    }
}

impl WindowTier {
    /// The decision from the script's answer at `now_us`, the window's count before the hit plus `ahead`, the counted
    /// costs of the hits ahead of it in a shared count; `None` when the answer is not a count (an error, which the
    /// caller passes on).
    pub(super) fn answer(&self, value: &Value, ahead: u64, now_us: u64) -> Option<Outcome> {
        let Value::Integer(n) = value else { return None };
        let check = fixed_window::check_count(
            self.limit,
            self.window_us,
            now_us,
            self.cost,
            (*n).max(0) as u64 + ahead,
        );
        let written = check.ok && self.cost > 0;
        Some(Outcome {
            admitted: check.ok,
            tiers: vec![check.outcome(written, false, false, None)],
            records: Vec::new(),
        })
    }
}
