//! The move from the full key layout to the compact one ([`KeyLayout`]): when a server's counters first took compact
//! names (`lua/layout.lua`), and, while the layout moves, the move of the counters an earlier version wrote to their
//! compact names before each decision reads them (`lua/move.lua`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use fred::interfaces::LuaInterface;
use fred::types::Value;
use fred::types::scripts::Script;

use super::RedisStore;
use crate::store::algorithm::window_starts;
use crate::store::{Algorithm, CounterKey, Hit, KeyLayout, StoreError, TierSpec};

const LAYOUT: &str = include_str!("../lua/layout.lua");
const MOVE: &str = include_str!("../lua/move.lua");

/// `move.lua`, called by EVALSHA (loaded on NOSCRIPT).
fn move_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::from_lua(MOVE))
}

/// The most counters [`Moved`] remembers before it starts over.
const MOVED_MAX: usize = 1 << 20;

/// The counters this store has moved to their compact names (by compact name), which it never moves again: a
/// decision pays the move's call only for counters it has not yet seen since the start. Bounded: past
/// [`MOVED_MAX`] it forgets them all, and each is looked at once more.
#[derive(Debug, Clone, Default)]
pub(super) struct Moved(Arc<Mutex<HashSet<Box<str>>>>);

impl Moved {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Box<str>>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

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
    /// compact names, each once per store: one call against one server, one per descriptor in a cluster. Nothing is
    /// sent when every such counter was moved before.
    pub(super) async fn move_counters<'a>(
        &self,
        now_us: u64,
        hits: impl Iterator<Item = &'a Hit>,
    ) -> Result<(), StoreError> {
        let mut calls: Vec<(Vec<String>, Vec<&'static str>)> = Vec::new();
        let mut counters: Vec<Box<str>> = Vec::new();
        {
            let moved = self.moved.lock();
            for hit in hits {
                let (mut keys, mut kinds) = (Vec::new(), Vec::new());
                for t in &hit.tiers {
                    if t.key.has_previous() && !moved.contains(t.key.as_str()) {
                        pairs(t, now_us, &mut keys, &mut kinds);
                        counters.push(t.key.as_str().into());
                    }
                }
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
        }
        if calls.is_empty() {
            return Ok(());
        }
        let moves = calls.into_iter().map(|(keys, kinds)| async move {
            let client = self.client_for(&CounterKey::named(keys[0].clone(), 0))?;
            let _: Value = move_script()
                .evalsha_with_reload(&client, keys, kinds)
                .await
                .map_err(|e| self.classify(e))?;
            Ok::<(), StoreError>(())
        });
        futures::future::try_join_all(moves).await?;
        let mut moved = self.moved.lock();
        if moved.len() + counters.len() > MOVED_MAX {
            moved.clear();
        }
        moved.extend(counters);
        Ok(())
    }
}

/// Whether a limit of `hits` carries a name of the full layout: only then is there anything to move, so a decision
/// outside a move takes no lock and builds no call.
pub(super) fn moving<'a>(mut hits: impl Iterator<Item = &'a Hit>) -> bool {
    hits.any(|hit| hit.tiers.iter().any(|t| t.key.has_previous()))
}

/// Every key with a name of the full layout among `keys`, under both names: what a reset or a release touches while
/// the layout moves.
pub(super) fn with_previous(keys: &[CounterKey]) -> Vec<CounterKey> {
    let mut all = keys.to_vec();
    all.extend(keys.iter().filter_map(CounterKey::previous));
    all
}

/// The pairs of names (full, compact) of every counter the limit `t` may read now, and per pair whether it is a count
/// ('n') or another state ('m'): the limit's own key, its windows' keys, and a global limit's regions' counts.
fn pairs(t: &TierSpec, now_us: u64, keys: &mut Vec<String>, kinds: &mut Vec<&'static str>) {
    let Some(previous) = t.key.previous() else { return };
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
