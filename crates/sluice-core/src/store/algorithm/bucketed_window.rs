//! The bucketed sliding window, the twin of `bucketed_window.lua`, beside it: a window of `window` split into `buckets`
//! sub-windows of `window / buckets` each (the tier's `burst` carries the number), epoch-aligned, one count per
//! sub-window. A window's count is the sum of the sub-windows it spans, the current one included, so it is exact to
//! one sub-window: a sub-window stops counting `window` after it starts. In Redis the sub-windows are one hash at the
//! counter's key, with their sum beside them (`bucketed_window.lua`); in memory a [`Buckets`] state holds them.
//!
//! The counters are named by the sub-window's length, not the window's (see `rules::Limit::counter_span_us`), so
//! several limits of one descriptor with the same sub-window share them: 1 000 a second, 5 000 per 10 s and 7 000
//! per 15 s read the same one-second counts, and a hit is one increment for all of them. Within one decision a
//! shared counter is written once (by the first of its tiers) and lives as long as the longest window needs it.
//! Forced hits, reservations and settlements do not apply (it is not one of the counting algorithms).

use std::collections::VecDeque;

use super::{Check, Expiry, Keyspace, Write, ceil_ms_us};
use crate::store::TierSpec;

/// The sub-windows' counts, oldest first: (first microsecond, count, when it stops being kept), and the decision that
/// last wrote them (a shared counter is written once per decision).
#[derive(Debug, Clone, Default)]
pub(crate) struct Buckets {
    pub(crate) subs: VecDeque<(u64, u64, u64)>,
    pub(crate) decision: u64,
}

/// The length of one sub-window of a tier: its window over its number of sub-windows, at least 1.
pub(crate) fn width(t: &TierSpec) -> u64 {
    (t.window_us / t.burst.max(1)).max(1)
}

/// What a hit of `cost` would find at `now`: the counts of the sub-windows the window spans (the current one and
/// the `buckets - 1` before it, none before the epoch), read in one pass over the state's sub-windows.
pub(crate) fn check(state: Option<&Buckets>, t: &TierSpec, now: u64, cost: u64) -> Check {
    let (width, buckets) = (width(t), t.burst.max(1));
    let current = now - now % width;
    let spanned = (current / width + 1).min(buckets);
    let first = current - (spanned - 1) * width;
    let mut counts = vec![0u64; spanned as usize];
    for &(start, n, kept_until) in state.iter().flat_map(|b| &b.subs) {
        if start >= first && start <= current && kept_until > now && (start - first) % width == 0 {
            counts[((start - first) / width) as usize] = n;
        }
    }
    check_counts(t.limit, width, t.window_us, now, cost, &counts)
}

/// What a hit of `cost` would find at `now` in sub-windows of `width` holding `counts`, oldest first, the last the
/// current one, in a window of `window`. A sub-window starting at `s` stops counting at `s + window`.
pub(crate) fn check_counts(limit: u64, width: u64, window: u64, now: u64, cost: u64, counts: &[u64]) -> Check {
    let current = now - now % width;
    let n = counts.iter().fold(0u64, |sum, &c| sum.saturating_add(c));
    // The start of the `i`-th sub-window given.
    let last = counts.len().saturating_sub(1) as u64;
    let start = |i: usize| current.saturating_sub((last - i as u64) * width);
    let newest = counts.iter().rposition(|&c| c > 0).map(start);
    // The first sub-window whose leaving brings the count low enough for the cost, when it does not fit but could.
    let mut leaving = None;
    if cost <= limit && n.saturating_add(cost) > limit {
        let mut left = n;
        for (i, &c) in counts.iter().enumerate() {
            left -= c.min(left);
            if left.saturating_add(cost) <= limit {
                leaving = Some(start(i));
                break;
            }
        }
    }
    check_view(limit, width, window, now, cost, (n, newest, leaving))
}

/// What a hit of `cost` would find at `now` in sub-windows of `width` whose count over a window of `window` is `n`,
/// the newest of them that holds any starting at `newest`, where the sub-window starting at `leaving` must leave the
/// window before the hit fits (`bucketed_window.lua`'s check reads the three).
pub(crate) fn check_view(
    limit: u64,
    width: u64,
    window: u64,
    now: u64,
    cost: u64,
    (n, newest, leaving): (u64, Option<u64>, Option<u64>),
) -> Check {
    let current = now - now % width;
    let used = n.saturating_add(cost);
    let ok = used <= limit;
    let leaves = |start: u64| (start + window).saturating_sub(now);
    let reset0 = newest.map_or(0, leaves);
    let retry = if cost > limit {
        None
    } else if ok {
        Some(0)
    } else {
        Some(leaves(leaving.unwrap_or(current)))
    };
    Check {
        ok,
        used0: n,
        used,
        rem0: limit.saturating_sub(n),
        rem1: limit.saturating_sub(used),
        reset0,
        reset1: if cost > 0 { leaves(current) } else { reset0 },
        retry,
        write: Write::Buckets,
    }
}

/// Counts a hit of `cost` in the current sub-window, unless a tier of the same decision did already, and keeps the
/// sub-window until the longest window of its tiers no longer counts it.
pub(crate) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64, cost: u64) {
    let current = now - now % width(t);
    let until = now + ceil_ms_us((current + t.window_us).saturating_sub(now));
    let decision = keys.decision();
    keys.upsert(t.key.as_str(), now, Expiry::AtLeast(until), |b: &mut Buckets| {
        b.subs.retain(|s| s.2 > now);
        match b.subs.iter_mut().find(|s| s.0 == current) {
            Some(sub) => {
                if b.decision != decision {
                    sub.1 = sub.1.saturating_add(cost);
                }
                sub.2 = sub.2.max(until);
            }
            None => {
                let at = b.subs.partition_point(|s| s.0 < current);
                b.subs.insert(at, (current, cost, until));
            }
        }
        b.decision = decision;
    });
}
