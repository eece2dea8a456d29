//! Calls on one counter in one script call, shared: a compact fixed window's hits as one INCRBY, a compact global
//! window's identical hits as one call, and the buckets and sliding windows several calls hit marked shared.

use std::collections::HashMap;

use super::Call;
use crate::store::redis::compact::{Compact, CompactTier, GlobalTier};

/// Calls on the same counter in one script call share one: a compact fixed window's count is the same whichever hit
/// comes first, so `k` hits on one window's key are one INCRBY of their summed counted costs, and each hit's count
/// before it is the shared count before plus the counted costs of the hits ahead of it in the call: exactly the
/// counts serial hits would see. Identical hits of a compact global window (same counter, limit, cost and time) are
/// one call that carries how many they are: each counts while it fits, so a hit's count before it follows from the
/// first's and how many are ahead of it (`GlobalTier::counted_ahead`). Returns the calls to send and, per call given,
/// the index of the call sent for it and what is ahead of it in that call (counted costs, or identical hits).
pub(super) fn coalesce(mut calls: Vec<Call>) -> (Vec<Call>, Vec<Planned>) {
    mark_shared(&mut calls);
    let globals = same_globals(&calls);
    let shares = same_windows(&calls);
    let mut sent: Vec<Call> = Vec::with_capacity(calls.len());
    let mut sent_at: Vec<usize> = Vec::with_capacity(calls.len());
    let mut plan = Vec::with_capacity(calls.len());
    for ((call, share), global) in calls.into_iter().zip(shares).zip(globals) {
        let own = call.compact.as_ref().map(|l| l.tier.clone());
        if let (Some(first), Some(CompactTier::Global(own))) = (global, &own) {
            let j = sent_at[first];
            let ahead = match sent[j].compact.as_mut() {
                Some(Compact {
                    tier: CompactTier::Global(g),
                    ..
                }) => {
                    g.times += 1;
                    g.times - 1
                }
                _ => 0,
            };
            sent_at.push(j);
            plan.push(Planned {
                sent: j,
                ahead,
                own: Some(CompactTier::Global(*own)),
            });
            continue;
        }
        match (share, own) {
            (Some(first), Some(CompactTier::Window(own))) => {
                let j = sent_at[first];
                let ahead = match sent[j].compact.as_mut() {
                    Some(Compact {
                        tier: CompactTier::Window(w),
                        ..
                    }) => {
                        let ahead = w.counted;
                        w.counted += own.counted;
                        ahead
                    }
                    _ => 0,
                };
                sent_at.push(j);
                plan.push(Planned {
                    sent: j,
                    ahead,
                    own: Some(CompactTier::Window(own)),
                });
            }
            (_, own) => {
                sent_at.push(sent.len());
                plan.push(Planned {
                    sent: sent.len(),
                    ahead: 0,
                    own,
                });
                sent.push(call);
            }
        }
    }
    (sent, plan)
}

/// Per call, the earlier call whose counter it shares if both are compact fixed windows on one window's key (see
/// [`coalesce`]), found by borrowing the keys: no map at all when fewer than two calls could share.
fn same_windows(calls: &[Call]) -> Vec<Option<usize>> {
    let window = |c: &Call| {
        matches!(
            c.compact,
            Some(Compact {
                tier: CompactTier::Window(_),
                ..
            })
        )
    };
    let compact = calls.iter().filter(|c| window(c)).count();
    let mut shares: Vec<Option<usize>> = vec![None; calls.len()];
    if compact > 1 {
        let mut first: HashMap<&str, usize> = HashMap::with_capacity(compact);
        // The previous window's counter, whose first call is known without hashing its key again: under load the
        // calls of one hot counter follow one another.
        let mut last: Option<(&str, usize)> = None;
        for (i, call) in calls.iter().enumerate() {
            if let (true, Some(l)) = (window(call), &call.compact) {
                let key = l.key.as_str();
                let j = match last {
                    Some((k, j)) if k == key => j,
                    _ => *first.entry(key).or_insert(i),
                };
                last = Some((key, j));
                shares[i] = (j != i).then_some(j);
            }
        }
    }
    shares
}

/// Per call, the earlier call it is identical to if both are compact global windows on the same counter with the same
/// limit, cost and time (see [`coalesce`]); no map at all when fewer than two calls are global.
fn same_globals(calls: &[Call]) -> Vec<Option<usize>> {
    fn identity(c: &Call) -> Option<(&str, GlobalTier)> {
        match &c.compact {
            Some(Compact {
                key,
                tier: CompactTier::Global(g),
            }) => Some((key.as_str(), *g)),
            _ => None,
        }
    }
    let mut same = vec![None; calls.len()];
    if calls.iter().filter_map(identity).nth(1).is_none() {
        return same;
    }
    let mut first: HashMap<(&str, GlobalTier), usize> = HashMap::new();
    for (i, call) in calls.iter().enumerate() {
        if let Some(id) = identity(call) {
            let j = *first.entry(id).or_insert(i);
            same[i] = (j != i).then_some(j);
        }
    }
    same
}

/// Marks the compact buckets and sliding windows whose counter another compact call of the batch hits ([`Compact::share`]),
/// when all of them see it in one window (a sliding window's calls given times across an edge are left unshared).
fn mark_shared(calls: &mut [Call]) {
    fn key(c: &Call) -> Option<(&str, u64)> {
        c.compact.as_ref().and_then(Compact::share_key)
    }
    if calls.iter().filter_map(key).nth(1).is_none() {
        return;
    }
    let shared: Vec<bool> = {
        // Per counter: how many calls hit it, and whether they all see it in one window.
        let mut seen: HashMap<&str, (usize, u64, bool)> = HashMap::new();
        for (k, start) in calls.iter().filter_map(key) {
            let entry = seen.entry(k).or_insert((0, start, true));
            entry.0 += 1;
            entry.2 &= entry.1 == start;
        }
        calls
            .iter()
            .map(|c| key(c).is_some_and(|(k, _)| matches!(seen[k], (n, _, true) if n > 1)))
            .collect()
    };
    for (call, shared) in calls.iter_mut().zip(shared) {
        if let (true, Some(l)) = (shared, call.compact.as_mut()) {
            l.share();
        }
    }
}

/// Where a call's answer comes from once calls on one counter are shared ([`coalesce`]).
pub(super) struct Planned {
    /// The call sent for it.
    pub(super) sent: usize,
    /// For a compact fixed window: the counted costs of the hits ahead of it in the shared call; for a compact global
    /// window, how many identical hits are ahead of it.
    pub(super) ahead: u64,
    /// For a compact call: what it is decided by.
    pub(super) own: Option<CompactTier>,
}
