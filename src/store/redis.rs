//! The Redis store: state kept by the Lua scripts in `lua/`, run by EVALSHA through fred.
//!
//! The scripts are loaded as one: `prelude.lua`, every algorithm file, then `decide.lua`, the driver that decides a
//! descriptor against all its tiers atomically. Each descriptor is one EVALSHA (its keys share a hash tag, so one
//! cluster slot), and all descriptors of a request go out in one pipeline: one network round trip against a
//! standalone Redis. A script missing from the server (NOSCRIPT after a restart, failover or `SCRIPT FLUSH`) is
//! loaded again and only the calls that failed are resent, which is safe because a NOSCRIPT call ran nothing.
//! Every call is bounded by a timeout; a failure surfaces as a [`StoreError`], which the API answers UNAVAILABLE.

use std::time::Duration;

use fred::clients::Pool;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, LuaInterface};
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::scripts::Script;
use fred::types::{Builder, ClusterHash, CustomCommand, Value};

use super::{CounterKey, Hit, Outcome, RecordSpec, Store, StoreError, TierOutcome};

/// The decision script: every algorithm and the driver, in one atomic unit.
pub const SCRIPT: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/sliding_window.lua"),
    include_str!("../../lua/sliding_log.lua"),
    include_str!("../../lua/token_bucket.lua"),
    include_str!("../../lua/concurrency.lua"),
    include_str!("../../lua/queue.lua"),
    include_str!("../../lua/decide.lua"),
);

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// `redis://`, `rediss://`, `redis-cluster://` or `redis-sentinel://` URL.
    pub url: String,
    /// The bound on every store call, connection included.
    pub timeout: Duration,
    /// Connections (fred clients), each pipelining many requests.
    pub pool_size: usize,
    /// Decide by Redis's own clock (`TIME` in the script), one clock for every sluice instance. Tests turn it off to
    /// drive time themselves.
    pub server_time: bool,
}

/// State in Redis.
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    script: Script,
    timeout: Duration,
    server_time: bool,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Hit,
    Peek,
}

impl RedisStore {
    /// Builds the pool and starts connecting. A Redis that is down at start is not fatal: the pool keeps
    /// reconnecting and `/readyz` says unready until it answers.
    pub async fn connect(settings: &RedisSettings) -> Result<RedisStore, StoreError> {
        let config = Config::from_url(&settings.url)
            .map_err(|e| StoreError::Other(format!("invalid redis url '{}': {}", settings.url, e.details())))?;
        let timeout = settings.timeout;
        let pool = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = timeout)
            .with_connection_config(|c| {
                c.connection_timeout = timeout.max(Duration::from_millis(500));
                c.internal_command_timeout = timeout.max(Duration::from_millis(500));
                // A write that failed mid-flight may have been applied: never resend it.
                c.max_command_attempts = 1;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
            .build_pool(settings.pool_size.max(1))
            .map_err(|e| StoreError::Other(e.details().to_string()))?;
        pool.connect();
        match tokio::time::timeout(Duration::from_secs(2), pool.wait_for_connect()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "redis is not reachable yet; retrying in the background"),
            Err(_) => tracing::warn!("redis did not answer within 2s; retrying in the background"),
        }
        Ok(RedisStore {
            pool,
            script: Script::from_lua(SCRIPT),
            timeout,
            server_time: settings.server_time,
        })
    }

    async fn bounded<T>(&self, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.timeout)))
    }

    /// The EVALSHA arguments of one descriptor: `sha numkeys keys... argv...` (see `lua/decide.lua`).
    fn args(&self, mode: Mode, now_us: u64, hit: &Hit) -> Vec<Value> {
        let record = hit.record.as_ref().filter(|r| mode == Mode::Peek || r.value.is_some());
        let keys = hit.tiers.len() + usize::from(record.is_some());
        let mut args: Vec<Value> = Vec::with_capacity(2 + keys + 7 + 2 * hit.fields.len() + 4 * hit.tiers.len());
        args.push(Value::from(self.script.sha1().clone()));
        args.push(Value::Integer(keys as i64));
        args.extend(hit.tiers.iter().map(|t| Value::from(t.key.as_str())));
        if let Some(r) = record {
            args.push(Value::from(r.key.as_str()));
        }
        args.push(Value::from(if mode == Mode::Hit { "hit" } else { "peek" }));
        args.push(if self.server_time {
            Value::from("")
        } else {
            Value::Integer(now_us as i64)
        });
        args.push(Value::Integer(hit.cost as i64));
        args.push(Value::from(hit.lease.as_str()));
        match &hit.record {
            Some(RecordSpec { size, value, .. }) if mode == Mode::Peek || value.is_some() => {
                args.push(Value::Integer(i64::from(*size)));
                args.push(Value::from(value.as_deref().unwrap_or_default()));
            }
            _ => {
                args.push(Value::Integer(0));
                args.push(Value::from(""));
            }
        }
        args.push(Value::Integer(2 * hit.fields.len() as i64));
        for (k, v) in &hit.fields {
            args.push(Value::from(k.as_str()));
            args.push(Value::from(v.as_str()));
        }
        for t in &hit.tiers {
            args.push(Value::from(t.algorithm.name()));
            args.push(Value::Integer(t.limit as i64));
            args.push(Value::Integer(t.window_us as i64));
            args.push(Value::Integer(t.burst as i64));
        }
        args
    }

    /// Sends one EVALSHA per hit in one pipeline; reloads the script and resends the calls that met NOSCRIPT.
    async fn run(&self, mode: Mode, now_us: u64, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        let client = self.pool.next();
        let mut results: Vec<Option<Outcome>> = vec![None; hits.len()];
        let mut pending: Vec<usize> = (0..hits.len()).collect();
        for attempt in 0..2 {
            let pipeline = client.pipeline();
            for &i in &pending {
                let _: () = pipeline
                    .custom(evalsha(), self.args(mode, now_us, &hits[i]))
                    .await
                    .map_err(classify)?;
            }
            let answers: Vec<Result<Value, FredError>> = pipeline.try_all().await;
            let mut missing = Vec::new();
            for (&i, answer) in pending.iter().zip(answers) {
                match answer {
                    Ok(value) => results[i] = Some(parse(value, hits[i].tiers.len())?),
                    Err(e) if attempt == 0 && is_noscript(&e) => missing.push(i),
                    Err(e) => return Err(classify(e)),
                }
            }
            if missing.is_empty() {
                break;
            }
            self.load_script().await?;
            pending = missing;
        }
        results
            .into_iter()
            .map(|r| r.ok_or_else(|| StoreError::Script("script still missing after reload".into())))
            .collect()
    }

    async fn load_script(&self) -> Result<(), StoreError> {
        let client = self.pool.next();
        let loaded: Result<String, FredError> = if client.is_clustered() {
            client.script_load_cluster(SCRIPT).await
        } else {
            client.script_load(SCRIPT).await
        };
        loaded.map(|_| ()).map_err(classify)
    }

    /// Sends one single-key command per key in one pipeline and adds up the integer answers.
    async fn per_key(
        &self,
        command: &'static str,
        keys: &[CounterKey],
        extra: Option<&str>,
    ) -> Result<u64, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        self.bounded(async {
            let pipeline = self.pool.next().pipeline();
            for key in keys {
                let mut args = vec![Value::from(key.as_str())];
                args.extend(extra.map(Value::from));
                let _: () = pipeline
                    .custom(CustomCommand::new_static(command, ClusterHash::FirstKey, false), args)
                    .await
                    .map_err(classify)?;
            }
            let counts: Vec<Result<i64, FredError>> = pipeline.try_all().await;
            counts
                .into_iter()
                .map(|c| c.map(|n| n.max(0) as u64).map_err(classify))
                .sum()
        })
        .await
    }
}

/// EVALSHA as a custom command, routed in a cluster by its first key (argument 2: `sha numkeys key ...`); fred's
/// typed `evalsha` cannot be queued in a pipeline.
fn evalsha() -> CustomCommand {
    CustomCommand::new_static("EVALSHA", ClusterHash::Offset(2), false)
}

/// Reads `decide.lua`'s answer.
fn parse(value: Value, tiers: usize) -> Result<Outcome, StoreError> {
    let bad = || StoreError::Script("unexpected script answer".into());
    let Value::Array(items) = value else { return Err(bad()) };
    if items.len() < 1 + 6 * tiers {
        return Err(bad());
    }
    let int = |v: &Value| v.as_i64().ok_or_else(bad);
    let count = |v: &Value| int(v).map(|n| n.max(0) as u64);
    let admitted = int(&items[0])? == 1;
    let mut outcomes = Vec::with_capacity(tiers);
    for t in items[1..1 + 6 * tiers].chunks_exact(6) {
        let retry = int(&t[4])?;
        let id = t[5].as_string().filter(|s| !s.is_empty());
        outcomes.push(TierOutcome {
            ok: int(&t[0])? == 1,
            used: count(&t[1])?,
            remaining: count(&t[2])?,
            reset_after_us: count(&t[3])?,
            retry_after_us: u64::try_from(retry).ok(),
            id,
        });
    }
    let records = items[1 + 6 * tiers..].iter().filter_map(Value::as_string).collect();
    Ok(Outcome {
        admitted,
        tiers: outcomes,
        records,
    })
}

fn is_noscript(e: &FredError) -> bool {
    e.details().starts_with("NOSCRIPT")
}

fn classify(e: FredError) -> StoreError {
    match e.kind() {
        ErrorKind::Timeout => StoreError::Connection(format!("timeout: {}", e.details())),
        ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Routing | ErrorKind::Cluster | ErrorKind::Sentinel => {
            StoreError::Connection(e.details().to_string())
        }
        _ if is_noscript(&e) || e.details().contains("script") => StoreError::Script(e.details().to_string()),
        _ => StoreError::Other(e.details().to_string()),
    }
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn hit(&self, now_us: u64, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        self.bounded(self.run(Mode::Hit, now_us, hits)).await
    }

    async fn peek(&self, now_us: u64, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        self.bounded(self.run(Mode::Peek, now_us, hits)).await
    }

    async fn release(&self, keys: &[CounterKey], lease: &str) -> Result<u64, StoreError> {
        self.per_key("ZREM", keys, Some(lease)).await
    }

    async fn reset(&self, keys: &[CounterKey]) -> Result<u64, StoreError> {
        self.per_key("DEL", keys, None).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(async {
            let _: Value = self.pool.next().ping(None).await.map_err(classify)?;
            Ok(())
        })
        .await
    }
}
