//! The top values of each rule and the per-second outcome counts in Redis: sorted sets per bucket, hashes per second.

use fred::types::Value;

use super::{RedisStore, scored};
use crate::store::{CounterKey, Offenders, SERIES_TTL_US, Series, Span, StoreError, TOP_BUCKET_TTL_US, Tally, ranked};

impl Offenders for RedisStore {
    async fn tally(&self, now_us: u64, tallies: &[Tally], kept: usize) -> Result<(), StoreError> {
        // Per bucket: an increment per value, the smallest past `kept` removed (lowest score first, then lowest
        // value, as the memory store trims), the bucket's life renewed. fred pipelines the commands of one
        // connection, so a tally costs about one round trip.
        let mut calls = Vec::new();
        for tally in tallies {
            for span in [Span::Minute, Span::Hour] {
                let (width, _) = span.buckets();
                let bucket = tally.set.bucket(span, now_us - now_us % width);
                calls.push(async move {
                    let adds = tally.counts.iter().map(|(value, n)| {
                        self.command(
                            &bucket,
                            "ZINCRBY",
                            vec![Value::from(n.to_string()), Value::from(value.as_str())],
                        )
                    });
                    futures::future::try_join_all(adds).await?;
                    let trim = vec![Value::from(0), Value::from(-(kept as i64) - 1)];
                    self.command(&bucket, "ZREMRANGEBYRANK", trim).await?;
                    let ttl = Value::from((TOP_BUCKET_TTL_US / 1_000).to_string());
                    self.command(&bucket, "PEXPIRE", vec![ttl]).await
                });
            }
        }
        futures::future::try_join_all(calls).await.map(|_| ())
    }

    async fn top(&self, now_us: u64, set: &CounterKey, span: Span) -> Result<Vec<(String, u64)>, StoreError> {
        let keys = span.keys(set, now_us);
        let reads = keys.iter().map(|key| {
            let args = vec![Value::from(0), Value::from(-1), Value::from("WITHSCORES")];
            self.command(key, "ZRANGE", args)
        });
        let mut sums = std::collections::HashMap::new();
        for reply in futures::future::try_join_all(reads).await? {
            for (value, score) in scored(reply) {
                *sums.entry(value).or_default() += score as u64;
            }
        }
        Ok(ranked(sums))
    }
}

impl Series for RedisStore {
    async fn series_add(&self, set: &CounterKey, counts: &[(u64, String, u64)]) -> Result<(), StoreError> {
        let mut by_second: std::collections::BTreeMap<u64, Vec<Value>> = std::collections::BTreeMap::new();
        for (second, field, n) in counts {
            by_second
                .entry(*second)
                .or_default()
                .extend([Value::from(field.as_str()), Value::from(n.to_string())]);
        }
        let calls = by_second.into_iter().map(|(second, fields)| async move {
            let key = set.second(second);
            // HINCRBY per field: a hash per second, renewed for SERIES_TTL_US.
            let adds = fields
                .chunks(2)
                .map(|pair| self.command(&key, "HINCRBY", pair.to_vec()));
            futures::future::try_join_all(adds).await?;
            let ttl = Value::from((SERIES_TTL_US / 1_000).to_string());
            self.command(&key, "PEXPIRE", vec![ttl]).await
        });
        futures::future::try_join_all(calls).await.map(|_| ())
    }

    async fn series_read(
        &self,
        set: &CounterKey,
        from: u64,
        to: u64,
    ) -> Result<Vec<std::collections::HashMap<String, u64>>, StoreError> {
        let keys: Vec<CounterKey> = (from..=to).map(|s| set.second(s)).collect();
        let reads = keys.iter().map(|key| self.command(key, "HGETALL", Vec::new()));
        let replies = futures::future::try_join_all(reads).await?;
        Ok(replies
            .into_iter()
            .map(|reply| {
                let flat: Vec<Value> = match reply {
                    Value::Array(items) => items,
                    Value::Map(map) => map.inner().into_iter().flat_map(|(k, v)| [Value::from(k), v]).collect(),
                    _ => Vec::new(),
                };
                flat.chunks_exact(2)
                    .filter_map(|p| Some((p[0].as_string()?, p[1].as_u64().unwrap_or(0))))
                    .collect()
            })
            .collect())
    }
}
