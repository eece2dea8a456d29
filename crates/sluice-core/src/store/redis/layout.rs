//! The move from the full key layout to the compact one ([`KeyLayout`]): when a server's counters first took compact
//! names (`lua/layout.lua`), and, while the layout moves, the move of the counters an earlier version wrote to their
//! compact names before each decision reads them (`lua/move.lua`).

use fred::interfaces::LuaInterface;
use fred::types::Value;

use super::RedisStore;
use crate::store::algorithm::window_starts;
use crate::store::{Algorithm, CounterKey, Hit, KeyLayout, StoreError};

const LAYOUT: &str = include_str!("../lua/layout.lua");
const MOVE: &str = include_str!("../lua/move.lua");

/// How long past a counter's window its previous name is still read: the grace a window's key outlives its window
/// (`WINDOW_KEY_GRACE_US` of `fixed_window.lua`) and some.
const MOVE_GRACE_US: u64 = 60_000_000;

impl RedisStore {
    /// The layout to write counters' keys in, for `wanted` (the configured one) with `prefix`: the full or the
    /// reference's layout as asked; else compact, and moving the counters of the full layout while any may still count: from the first
    /// time sluice wrote compact keys to this server, for twice `longest_us` (a sliding window reads its previous
    /// window) and a minute. A server that held no key at that first time has nothing to move. When the marker
    /// cannot be read (the server is down at start), the layout moves from now: a move costs a call, never a count.
    pub async fn key_layout(&self, wanted: KeyLayout, prefix: &str, longest_us: u64, now_us: u64) -> KeyLayout {
        if wanted != KeyLayout::Compact {
            return wanted;
        }
        let marker = format!("{prefix}layout");
        let span = longest_us.saturating_mul(2).saturating_add(MOVE_GRACE_US);
        let read = async {
            let client = self.client_for(&CounterKey::named(marker.clone(), 0))?;
            let value: Value = client
                .eval(LAYOUT, vec![marker.clone()], vec![now_us.to_string()])
                .await
                .map_err(|e| self.classify(e))?;
            Ok::<_, StoreError>(value.as_string().unwrap_or_default())
        };
        let since = match read.await {
            Ok(value) if value == "fresh" => return KeyLayout::Compact,
            Ok(value) => value.parse::<u64>().unwrap_or(now_us),
            Err(e) => {
                tracing::warn!(error = %e, marker, "key layout: the marker could not be read; moving counters of the full layout");
                now_us
            }
        };
        let until_us = since.saturating_add(span);
        if until_us <= now_us {
            return KeyLayout::Compact;
        }
        tracing::info!(
            since_us = since,
            until_us,
            "key layout: moving counters of the full layout to compact keys"
        );
        KeyLayout::Moving { until_us }
    }

    /// Moves the counters of `hits` that carry a name of the full layout ([`CounterKey::previous`]) to their
    /// compact names: one call against one server, one per descriptor in a cluster. Nothing is sent when none does.
    pub(super) async fn move_counters<'a>(
        &self,
        now_us: u64,
        hits: impl Iterator<Item = &'a Hit>,
    ) -> Result<(), StoreError> {
        let mut calls: Vec<(Vec<String>, Vec<&'static str>)> = Vec::new();
        for hit in hits {
            let (mut keys, mut kinds) = (Vec::new(), Vec::new());
            pairs(hit, now_us, &mut keys, &mut kinds);
            if keys.is_empty() {
                continue;
            }
            match calls.last_mut() {
                Some((k, a)) if self.cluster.is_none() => {
                    k.extend(keys);
                    a.extend(kinds);
                }
                _ => calls.push((keys, kinds)),
            }
        }
        let moves = calls.into_iter().map(|(keys, kinds)| async move {
            let client = self.client_for(&CounterKey::named(keys[0].clone(), 0))?;
            let _: Value = client.eval(MOVE, keys, kinds).await.map_err(|e| self.classify(e))?;
            Ok::<(), StoreError>(())
        });
        futures::future::try_join_all(moves).await.map(|_| ())
    }
}

/// Every key with a name of the full layout among `keys`, under both names: what a reset or a release touches while
/// the layout moves.
pub(super) fn with_previous(keys: &[CounterKey]) -> Vec<CounterKey> {
    let mut all = keys.to_vec();
    all.extend(keys.iter().filter_map(CounterKey::previous));
    all
}

/// The pairs of names (full, compact) of every counter `hit`'s limits may read now, and per pair whether it is a
/// count ('n') or another state ('m'): a limit's own key, its windows' keys, and a global limit's regions' counts.
fn pairs(hit: &Hit, now_us: u64, keys: &mut Vec<String>, kinds: &mut Vec<&'static str>) {
    for t in &hit.tiers {
        let Some(previous) = t.key.previous() else { continue };
        let mut pair = |old: CounterKey, new: CounterKey, kind| {
            keys.push(old.into());
            keys.push(new.into());
            kinds.push(kind);
        };
        let counted = matches!(
            t.algorithm,
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::BucketedWindow
        );
        if counted {
            for start in window_starts(t.algorithm, t.window_us, t.burst, now_us) {
                pair(previous.window(start), t.key.window(start), "n");
                if t.global {
                    pair(previous.regions(start), t.key.regions(start), "m");
                }
            }
        }
        pair(previous, t.key.clone(), "m");
    }
}
