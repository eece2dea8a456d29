//! The counts of global limits' windows in Redis: this region's own counts read from their records in the packed
//! state (the decision script's mode 'count'), and the other regions' counts merged in (`lua/merge.lua`), by EVALSHA
//! on the slot of its keys, at most a batch at a time (by EVAL once when the server does not hold the script yet,
//! which loads it there).

use std::sync::LazyLock;
use std::sync::atomic::Ordering;

use fred::types::Value;
use fred::types::scripts::Script;

use super::call::Call;
use super::reply::is_noscript;
use super::{RedisStore, reply};
use crate::store::{CounterKey, RegionCount, RegionCounts, StoreError, WindowRef};

/// The script that takes a region's shipped counts (`lua/merge.lua`).
const MERGE: &str = include_str!("../lua/merge.lua");

/// The SHA1 of [`MERGE`], which EVALSHA names it by.
static SHA: LazyLock<String> = LazyLock::new(|| Script::from_lua(MERGE).sha1().to_string());

/// The most windows one call of [`MERGE`] carries.
const MERGE_BATCH: usize = 512;

impl RedisStore {
    /// The positions of `keys` grouped by cluster slot (one group on a single server), at most MERGE_BATCH each.
    fn by_slot(&self, keys: &[CounterKey]) -> Vec<Vec<usize>> {
        let mut by_slot: std::collections::BTreeMap<Option<u16>, Vec<usize>> = Default::default();
        for (i, key) in keys.iter().enumerate() {
            let slot = self
                .cluster
                .as_ref()
                .map(|_| fred::util::redis_keyslot(key.as_str().as_bytes()));
            by_slot.entry(slot).or_default().push(i);
        }
        by_slot
            .into_values()
            .flat_map(|group| group.chunks(MERGE_BATCH).map(<[usize]>::to_vec).collect::<Vec<_>>())
            .collect()
    }

    /// Runs `script` (whose SHA1 is `sha`) by EVALSHA on the server of `first` (whose slot every key shares), with
    /// `keys` and `args`; by EVAL, which loads it, until the server first answered one, and when it answers NOSCRIPT
    /// (a NOSCRIPT call ran nothing).
    async fn eval(
        &self,
        (script, sha): (&'static str, &'static str),
        first: &CounterKey,
        keys: Vec<Value>,
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        let mut all = Vec::with_capacity(2 + keys.len() + args.len());
        all.push(Value::from(sha));
        all.push(Value::Integer(keys.len() as i64));
        all.extend(keys);
        all.extend(args);
        let eval = |mut all: Vec<Value>| {
            all[0] = Value::from(script);
            async move {
                let answer = self.send(first, "EVAL", all).await;
                if answer.is_ok() {
                    self.region_scripts.store(true, Ordering::Relaxed);
                }
                answer
            }
        };
        if !self.region_scripts.load(Ordering::Relaxed) {
            return eval(all).await;
        }
        match self.send_raw(first, "EVALSHA", all.clone()).await {
            Err(e) if is_noscript(&e) => eval(all).await,
            answer => answer.map_err(|e| self.classify(e)),
        }
    }
}

impl RegionCounts for RedisStore {
    async fn window_counts(&self, _now_us: u64, windows: &[WindowRef]) -> Result<Vec<u64>, StoreError> {
        // Each window's count read from its counter's record in the packed state, by the decision script.
        let routed = self.cluster.is_some();
        let counts = self
            .run_calls(
                windows,
                |w| Call::count(None, w, routed),
                |reply, _| reply::number(reply),
            )
            .await;
        counts.into_iter().collect()
    }

    async fn merge_counts(&self, now_us: u64, region: &str, counts: &[RegionCount]) -> Result<(), StoreError> {
        // One EVALSHA of merge.lua per slot and MERGE_BATCH windows (one per batch on a single server).
        let keys: Vec<CounterKey> = counts.iter().map(|c| c.window.key.regions(c.window.start_us)).collect();
        let calls = self.by_slot(&keys).into_iter().map(|group| {
            let chunk: Vec<Value> = group.iter().map(|&i| Value::from(keys[i].as_str())).collect();
            let mut args = vec![Value::from(region)];
            for &i in &group {
                let c = &counts[i];
                let ttl_ms = c.window.expires_us().saturating_sub(now_us).div_ceil(1_000).max(1);
                args.push(Value::Integer(c.count.min(i64::MAX as u64) as i64));
                args.push(Value::Integer(ttl_ms as i64));
            }
            let first = keys[group[0]].clone();
            async move { self.eval((MERGE, &SHA), &first, chunk, args).await }
        });
        futures::future::try_join_all(calls).await.map(|_| ())
    }
}
