//! The sliding log in memory, the twin of `lua/sliding_log.lua`: exactly at most `limit` hits in any interval of
//! `window`, one time per hit in a [`Log`] state that expires when its newest hit leaves the interval.

use super::prelude::{Check, Expiry, Keyspace, Log, State, Write, ceil_ms_us};
use crate::store::TierSpec;

/// What a hit of `cost` would find at `now`: the hits still inside the interval.
pub(super) fn check(state: Option<&State>, t: &TierSpec, now: u64, cost: u64) -> Check {
    let (limit, window) = (t.limit, t.window_us);
    let empty = Log::default();
    let Log(log) = match state {
        Some(State::Log(log)) => log,
        _ => &empty,
    };
    let mut live = log.iter().copied().filter(|&ts| ts + window > now);
    let count = live.clone().count() as u64;
    let used = count.saturating_add(cost);
    let ok = used <= limit;
    let reset0 = log
        .back()
        .filter(|_| count > 0)
        .map_or(0, |newest| newest + window - now);
    let retry = if cost > limit {
        None
    } else if ok {
        Some(0)
    } else {
        live.nth((count - (limit - cost) - 1) as usize)
            .map(|ts| ts + window - now)
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
pub(super) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64, cost: u64) {
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
