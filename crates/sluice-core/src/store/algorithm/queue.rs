//! The queue, the twin of `queue.lua`, beside it: at most `limit` entries waiting, each stale `window` after its id's
//! millisecond, in a [`Queue`] state (the Redis stream's ids) that expires `window` after the last append. Ids are
//! generated as XADD `<ms>-*` generates them.

use std::collections::VecDeque;

use super::{Check, Expiry, Keyspace, Write, ceil_ms_us};
use crate::store::TierSpec;

/// Entry ids (ms, seq), oldest first, and the last id generated.
#[derive(Debug, Clone, Default)]
pub(crate) struct Queue {
    pub(crate) entries: VecDeque<(u64, u64)>,
    pub(crate) last: (u64, u64),
}

/// What a hit would find at `now`: the entries still waiting. Any positive cost appends one entry.
pub(crate) fn check(state: Option<&Queue>, t: &TierSpec, now: u64, cost: u64) -> Check {
    let (limit, window) = (t.limit, t.window_us);
    let cutoff = queue_cutoff(now, window);
    // Newest first, as XREVRANGE reads them, at most limit + 1.
    let waiting: Vec<u64> = match state {
        Some(Queue { entries, .. }) => entries
            .iter()
            .rev()
            .map(|e| e.0)
            .take_while(|&ms| ms >= cutoff)
            .take(usize::try_from(limit).unwrap_or(usize::MAX).saturating_add(1))
            .collect(),
        None => Vec::new(),
    };
    let len = waiting.len() as u64;
    let slots = u64::from(cost > 0);
    // The entry that must go stale before the hit fits, when it does not fit but could.
    let leaving = (slots <= limit && len + slots > limit).then(|| waiting[(limit - slots) as usize]);
    check_view(limit, window, now, cost, len, waiting.first().copied(), leaving)
}

/// What a hit of `cost` would find at `now` among `len` waiting entries, the newest of its millisecond `newest`,
/// where the entry of the millisecond `leaving` must go stale before the hit fits (`queue.lua`'s check reads them).
pub(crate) fn check_view(
    limit: u64,
    window: u64,
    now: u64,
    cost: u64,
    len: u64,
    newest: Option<u64>,
    leaving: Option<u64>,
) -> Check {
    let slots = u64::from(cost > 0);
    let ok = len + slots <= limit;
    let stale_at = |ms: u64| (ms * 1_000 + window).saturating_sub(now);
    let reset0 = newest.map_or(0, stale_at);
    let retry = if slots > limit {
        None
    } else if ok {
        Some(0)
    } else {
        leaving.map(stale_at)
    };
    Check {
        ok,
        used0: len,
        used: len + slots,
        rem0: limit.saturating_sub(len),
        rem1: limit.saturating_sub(len + slots),
        reset0,
        reset1: if slots > 0 { stale_at(now / 1_000) } else { reset0 },
        retry,
        write: Write::Queue,
    }
}

/// Appends one entry at `now`, trimming the stale ones; returns its id, `<ms>-<seq>`.
pub(crate) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64) -> String {
    let window = t.window_us;
    let expiry = Expiry::Always(now + ceil_ms_us(window));
    let id = keys.upsert(t.key.as_str(), now, expiry, |queue: &mut Queue| {
        let cutoff = queue_cutoff(now, window);
        queue.entries.retain(|e| e.0 >= cutoff);
        let ms = now / 1_000;
        // As XADD `<ms>-*`: a new millisecond starts at sequence 0; a clock behind the last id appends after it.
        let id = match ms.cmp(&queue.last.0) {
            std::cmp::Ordering::Greater => (ms, 0),
            _ => (queue.last.0, queue.last.1 + 1),
        };
        queue.entries.push_back(id);
        queue.last = id;
        id
    });
    format!("{}-{}", id.0, id.1)
}

/// The smallest entry millisecond still waiting at `now`: an entry is stale once `ms * 1000 + window <= now`.
fn queue_cutoff(now: u64, window: u64) -> u64 {
    now.saturating_sub(window) / 1_000 + 1
}
