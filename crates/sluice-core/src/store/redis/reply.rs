//! What comes back from a script call: each descriptor's [`Reply`] (decided by sluice from a compact form's integers,
//! or the script's own answer), read into outcomes, settlements and grants, and Redis's errors told apart (a missing
//! script, a refusal by the cluster's topology, a redirection).

use fred::error::Error as FredError;
use fred::types::Value;

use crate::store::algorithm::{self, seen_width};
use crate::store::{Granted, Hit, Outcome, Settled, Settlement, StoreError, TierSettled, TierSpec};

/// One descriptor's answer from a script call: decided or settled by sluice from a fast form's integers, what the
/// decision loop saw, or another answer (an error, or nil: not decided there).
#[derive(Debug, Clone)]
pub(super) enum Reply {
    Decided(Outcome),
    /// The decision loop's answer (`lua/decide.lua`): its places, and the time it was decided at.
    Seen(Vec<Value>, u64),
    /// Any other answer: an error, or nil (not decided there).
    Script(Value),
}

/// Whether a descriptor's answer in a node's batch says it was not decided there, nothing of it written: its slot is
/// served elsewhere or migrating (see `lua/batch.lua`).
pub(super) fn unserved(reply: &Reply) -> bool {
    matches!(reply, Reply::Script(Value::Null))
}

fn bad() -> StoreError {
    StoreError::Script("unexpected script answer".into())
}

/// The places of one descriptor's answer from the decision loop and the time it was decided at, or the error that
/// stopped it alone (see `lua/batch.lua`).
fn items(reply: Reply) -> Result<(Vec<Value>, u64), StoreError> {
    match reply {
        Reply::Seen(items, now) => Ok((items, now)),
        Reply::Script(Value::String(error)) => Err(StoreError::Script(error.to_string())),
        _ => Err(bad()),
    }
}

/// Reads a hit's answer: decided from a compact form, or `decide.lua`'s.
pub(super) fn parse(reply: Reply, hit: &Hit) -> Result<Outcome, StoreError> {
    match reply {
        Reply::Decided(outcome) => Ok(outcome),
        reply => {
            let (items, now) = items(reply)?;
            let cost = |t: &TierSpec| t.bounded_cost(hit.cost);
            let modes = (hit.peeks(), hit.forces());
            let (mut outcome, rest) = decided(&items, now, (&hit.tiers, &hit.lease), cost, modes)?;
            if let Some(Value::Array(records)) = rest.first() {
                outcome.records = records.iter().filter_map(Value::as_string).collect();
            }
            Ok(outcome)
        }
    }
}

/// Reads a settlement's answer, `decide.lua`'s in settle mode: `{ 0 }`, or `{ 1 }`,
/// then per tier (estimate, actual, charged, refunded), then the answer of a peek of cost 1.
pub(super) fn parse_settled(reply: Reply, settlement: &Settlement) -> Result<Settled, StoreError> {
    let (items, now) = items(reply)?;
    let tiers = settlement.tiers.len();
    let count = |v: &Value| v.as_i64().map(|n| n.max(0) as u64).ok_or_else(bad);
    match items.first().and_then(Value::as_i64) {
        Some(0) => Ok(Settled::Unknown),
        Some(1) if items.len() > 4 * tiers => {
            let settled = items[1..1 + 4 * tiers]
                .chunks_exact(4)
                .map(|t| {
                    Ok(TierSettled {
                        estimate: count(&t[0])?,
                        actual: count(&t[1])?,
                        charged: count(&t[2])?,
                        refunded: count(&t[3])?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let tiers = (&settlement.tiers[..], "");
            let (outcome, _) = decided(&items[1 + 4 * tiers.0.len()..], now, tiers, |_| 1, (true, false))?;
            Ok(Settled::Done {
                tiers: settled,
                outcome,
            })
        }
        _ => Err(bad()),
    }
}

/// The one number of a call of one place (decide.lua's modes 'forget', 'count'): how many records a reset forgot, a
/// window's count.
pub(super) fn number(reply: Reply) -> Result<u64, StoreError> {
    // One place: the answer comes alone, not as an array.
    match reply {
        Reply::Script(Value::Integer(n)) => Ok(n.max(0) as u64),
        other => Err(items(other).err().unwrap_or_else(bad)),
    }
}

/// Reads `decide.lua`'s answer in grant mode: `ledger.lua`'s five counts.
pub(super) fn parse_granted(reply: Reply) -> Result<Granted, StoreError> {
    let (items, _) = items(reply)?;
    let count = |i: usize| {
        items
            .get(i)
            .and_then(Value::as_i64)
            .map(|n| n.max(0) as u64)
            .ok_or_else(bad)
    };
    Ok(Granted {
        held: count(0)?,
        share: count(1)?,
        left: count(2)?,
        holders: count(3)?,
        total_held: count(4)?,
        entry: count(5)?,
    })
}

/// The outcome of `decide.lua`'s answer `items` on `tiers` (with the hit's `lease`), decided at `now`, each tier with
/// `cost(tier)`, a peek or a forced hit as `(peek, force)` say: the flags (admitted 1, committed 2), then per tier what its check saw (see
/// [`algorithm::seen`]; a queue's entry id after it). Each tier's numbers are made from what its check saw, by the
/// check the memory store decides by. Returns the places after the tiers' (a peek's hit records).
fn decided<'a>(
    items: &'a [Value],
    now: u64,
    (tiers, lease): (&[TierSpec], &str),
    cost: impl Fn(&TierSpec) -> u64,
    (peek, force): (bool, bool),
) -> Result<(Outcome, &'a [Value]), StoreError> {
    let int = |v: &Value| v.as_i64().ok_or_else(bad);
    let flags = int(items.first().ok_or_else(bad)?)?;
    let committed = flags & 2 != 0;
    let mut at = 1;
    let mut outcomes = Vec::with_capacity(tiers.len());
    for t in tiers {
        let width = seen_width(t);
        let values = items.get(at..at + width).ok_or_else(bad)?;
        at += width;
        let own = if t.algorithm.queues() { &values[..3] } else { values };
        let mut seen = [-1i64; 4];
        for (s, v) in seen.iter_mut().zip(own) {
            *s = int(v)?;
        }
        let cost = cost(t);
        let check = algorithm::seen(t, now, cost, force, &seen[..own.len()]);
        let written = committed && cost > 0;
        // What the commit created: a queue's entry, or the lease a concurrency limit took.
        let id = if t.algorithm.queues() {
            values[3].as_string().filter(|s| !s.is_empty())
        } else {
            (written && t.algorithm.takes_lease()).then(|| lease.to_string())
        };
        outcomes.push(algorithm::tier_outcome(t, &check, cost, (written, peek, force), id));
    }
    let outcome = Outcome {
        admitted: flags & 1 != 0,
        tiers: outcomes,
        records: Vec::new(),
    };
    Ok((outcome, &items[at..]))
}

pub(super) fn is_noscript(e: &FredError) -> bool {
    e.details().starts_with("NOSCRIPT")
}

/// Whether a cluster node refused a whole call before running any of it because of where slots are: a redirection
/// (MOVED, ASK), a multi-key call during a slot's migration (TRYAGAIN), keys of several slots (CROSSSLOT), or a node
/// that is a replica now (READONLY, after a failover the slot map has not caught up with). The call ran nothing and
/// may be sent again, each descriptor to its own slot.
pub(super) fn refused_by_topology(e: &FredError) -> bool {
    let first = e.details().split_whitespace().next().unwrap_or_default();
    matches!(first, "MOVED" | "ASK" | "TRYAGAIN" | "CROSSSLOT" | "READONLY")
}

/// Whether a cluster node asked for the call again later: a multi-key call while the keys of its slot are split
/// between two nodes by a migration. The call ran nothing.
pub(super) fn is_tryagain(e: &FredError) -> bool {
    e.details().starts_with("TRYAGAIN")
}

/// A cluster redirection: whether it is ASK (else MOVED), and the `host:port` it names.
pub(super) fn redirection(e: &FredError) -> Option<(bool, String)> {
    let mut parts = e.details().split_whitespace();
    let ask = match parts.next()? {
        "MOVED" => false,
        "ASK" => true,
        _ => return None,
    };
    let _slot = parts.next()?;
    Some((ask, parts.next()?.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fred::error::ErrorKind;

    #[test]
    fn refusals_before_running_are_told_from_failures_that_may_have_run() {
        let e = |details: &str| FredError::new(ErrorKind::Unknown, details.to_string());
        for refused in [
            "MOVED 3300 127.0.0.1:7001",
            "ASK 3300 127.0.0.1:7001",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "READONLY You can't write against a read only replica.",
        ] {
            assert!(refused_by_topology(&e(refused)), "{refused}");
        }
        for other in [
            "ERR unknown",
            "NOSCRIPT No matching script",
            "WRONGTYPE Operation",
            "LOADING",
        ] {
            assert!(!refused_by_topology(&e(other)), "{other}");
        }
        assert!(is_tryagain(&e("TRYAGAIN Multiple keys")) && !is_tryagain(&e("MOVED 1 h:1")));
        let script = Reply::Script;
        assert!(unserved(&script(Value::Null)) && !unserved(&script(Value::Integer(0))));
        assert!(!unserved(&script(Value::Array(Vec::new()))));
    }
}
