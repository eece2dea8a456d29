//! The sliding log, the twin of `sliding_log.lua`, beside it: exactly at most `limit` hits in any interval of `window`, one
//! time per hit in a [`Log`] state (in Redis, a sorted set) that expires when its newest hit leaves the interval. The
//! compact form (`sliding_log.lua`'s `hit`) returns the live count, the newest time and the time that must leave
//! before the hit fits, and the same [`check_view`] decides from them.

use std::collections::VecDeque;

use super::{Check, Expiry, Keyspace, Write, ceil_ms_us};
use crate::store::TierSpec;

/// Hit times, ascending.
#[derive(Debug, Clone, Default)]
pub(crate) struct Log(pub(crate) VecDeque<u64>);

/// What a hit of `cost` would find at `now`: the hits still inside the interval.
pub(crate) fn check(state: Option<&Log>, t: &TierSpec, now: u64, cost: u64) -> Check {
    let (limit, window) = (t.limit, t.window_us);
    let empty = Log::default();
    let Log(log) = state.unwrap_or(&empty);
    let mut live = log.iter().copied().filter(|&ts| ts + window > now);
    let count = live.clone().count() as u64;
    let newest = log.back().copied().unwrap_or_default();
    // The time that must leave the interval before the hit fits, when it does not fit but could.
    let leaving = if cost <= limit && count.saturating_add(cost) > limit {
        live.nth((count - (limit - cost) - 1) as usize)
    } else {
        None
    };
    check_view(limit, window, now, cost, count, newest, leaving)
}

/// What a hit of `cost` would find at `now` in a log of `count` live hits, the newest at `newest` (read only when
/// `count` is positive), where the hit at `leaving` must leave the interval before it fits.
pub(crate) fn check_view(
    limit: u64,
    window: u64,
    now: u64,
    cost: u64,
    count: u64,
    newest: u64,
    leaving: Option<u64>,
) -> Check {
    let used = count.saturating_add(cost);
    let ok = used <= limit;
    let reset0 = if count > 0 {
        (newest + window).saturating_sub(now)
    } else {
        0
    };
    let retry = if cost > limit {
        None
    } else if ok {
        Some(0)
    } else {
        leaving.map(|ts| (ts + window).saturating_sub(now))
    };
    Check {
        ok,
        used0: count,
        used,
        rem0: limit.saturating_sub(count),
        rem1: limit.saturating_sub(used),
        reset0,
        reset1: if cost > 0 { window } else { reset0 },
        retry,
        write: Write::Log,
    }
}

/// Logs `cost` hits at `now`, dropping the ones that left the interval.
pub(crate) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64, cost: u64) {
    let window = t.window_us;
    let expiry = Expiry::Always(now + ceil_ms_us(window));
    keys.upsert(t.key.as_str(), now, expiry, |Log(log): &mut Log| {
        log.retain(|&ts| ts + window > now);
        // Kept in time order, as the sorted set is, even if the clock stepped back.
        let at = log.partition_point(|&ts| ts <= now);
        for _ in 0..cost {
            log.insert(at, now);
        }
    });
}
