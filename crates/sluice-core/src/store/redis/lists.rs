//! The run-time entries of deny and allow lists in Redis: one sorted set per list, each value scored by its expiry.

use fred::types::Value;

use super::{RedisStore, integer, scored};
use crate::store::{CounterKey, ListChange, ListEntry, Lists, StoreError};

/// A list's run-time entries are a sorted set: each value scored by its expiry in microseconds, `+inf` for none.
impl RedisStore {
    async fn drop_expired(&self, now_us: u64, list: &CounterKey) -> Result<(), StoreError> {
        let args = vec![Value::from("-inf"), Value::from(now_us.to_string())];
        self.command(list, "ZREMRANGEBYSCORE", args).await.map(|_| ())
    }
}

impl Lists for RedisStore {
    async fn list_change(
        &self,
        now_us: u64,
        list: &CounterKey,
        change: ListChange<'_>,
    ) -> Result<Option<u64>, StoreError> {
        self.drop_expired(now_us, list).await?;
        match change {
            ListChange::Add {
                values,
                expires_us,
                max,
            } => {
                // Renewed values count as new here: a list near its bound may refuse a renewal that would fit.
                let held = integer(&self.command(list, "ZCARD", Vec::new()).await?);
                if held as usize + values.len() > max {
                    return Ok(None);
                }
                let score = expires_us.map_or_else(|| "+inf".to_string(), |e| e.to_string());
                let mut args = Vec::with_capacity(values.len() * 2);
                for value in values {
                    args.push(Value::from(score.as_str()));
                    args.push(Value::from(value.as_str()));
                }
                Ok(Some(integer(&self.command(list, "ZADD", args).await?)))
            }
            ListChange::Remove { values } => {
                let args = values.iter().map(|v| Value::from(v.as_str())).collect();
                Ok(Some(integer(&self.command(list, "ZREM", args).await?)))
            }
        }
    }

    async fn list_entries(&self, now_us: u64, list: &CounterKey) -> Result<Vec<ListEntry>, StoreError> {
        let args = vec![
            Value::from(format!("({now_us}")),
            Value::from("+inf"),
            Value::from("WITHSCORES"),
        ];
        let reply = self.command(list, "ZRANGEBYSCORE", args).await?;
        Ok(scored(reply)
            .into_iter()
            .map(|(value, score)| ListEntry {
                value,
                expires_us: score.is_finite().then_some(score as u64),
            })
            .collect())
    }
}
