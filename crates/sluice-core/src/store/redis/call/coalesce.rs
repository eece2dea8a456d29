//! Calls on one counter in one script call, shared: a plain counter's compact hits on one window as one INCRBY.

use std::collections::HashMap;

use super::Call;
use crate::store::redis::compact::{Compact, WindowTier};

/// Calls on the same counter in one script call share one: a compact fixed window's count is the same whichever hit
/// comes first, so `k` hits on one window's key are one INCRBY of their summed counted costs, and each hit's count
/// before it is the shared count before plus the counted costs of the hits ahead of it in the call: exactly the
/// counts serial hits would see. Returns the calls to send and, per call given, the index of the call sent for it and
/// the counted costs ahead of it in that call.
pub(super) fn coalesce(calls: Vec<Call>) -> (Vec<Call>, Vec<Planned>) {
    let shares = same_windows(&calls);
    let mut sent: Vec<Call> = Vec::with_capacity(calls.len());
    let mut sent_at: Vec<usize> = Vec::with_capacity(calls.len());
    let mut plan = Vec::with_capacity(calls.len());
    for (call, share) in calls.into_iter().zip(shares) {
        let own = call.compact.as_ref().map(|l| l.tier);
        match (share, own) {
            (Some(first), Some(own)) => {
                let j = sent_at[first];
                let ahead = match sent[j].compact.as_mut() {
                    Some(Compact { tier: w, .. }) => {
                        let ahead = w.counted;
                        w.counted += own.counted;
                        ahead
                    }
                    None => 0,
                };
                sent_at.push(j);
                plan.push(Planned {
                    sent: j,
                    ahead,
                    own: Some(own),
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
    let window = |c: &Call| c.compact.is_some();
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

/// Where a call's answer comes from once calls on one counter are shared ([`coalesce`]).
pub(super) struct Planned {
    /// The call sent for it.
    pub(super) sent: usize,
    /// For a plain counter's compact hit: the counted costs of the hits ahead of it in the shared call.
    pub(super) ahead: u64,
    /// For a compact call: what it is decided by.
    pub(super) own: Option<WindowTier>,
}
