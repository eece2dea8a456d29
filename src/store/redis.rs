//! The Redis store: counters kept by the Lua scripts in `lua/`, run by EVALSHA through fred.
//!
//! All counters of one request go out in one pipeline: one network round trip against a standalone Redis, one
//! EVALSHA per counter. A script missing from the server (NOSCRIPT after a restart, failover or `SCRIPT FLUSH`) is
//! loaded again and only the calls that failed are retried, which is safe because a NOSCRIPT call ran nothing.
//! Every call is bounded by a timeout; a failure surfaces as a [`StoreError`], which the API answers UNAVAILABLE.

use std::time::Duration;

use fred::clients::Pool;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, KeysInterface, LuaInterface};
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::scripts::Script;
use fred::types::{Builder, ClusterHash, CustomCommand, Value};

use super::{Hit, Outcome, Remaining, Store, StoreError, fixed_window};

const FIXED_WINDOW: &str = include_str!("../../lua/fixed_window.lua");

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// `redis://`, `rediss://`, `redis-cluster://` or `redis-sentinel://` URL.
    pub url: String,
    /// The bound on every store call, connection included.
    pub timeout: Duration,
    /// Connections (fred clients), each pipelining many requests.
    pub pool_size: usize,
}

/// Counters in Redis.
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    fixed_window: Script,
    timeout: Duration,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Builds the pool and starts connecting. A Redis that is down at start is not fatal: the pool keeps
    /// reconnecting and `/readyz` says unready until it answers.
    pub async fn connect(settings: &RedisSettings) -> Result<RedisStore, StoreError> {
        let config = Config::from_url(&settings.url).map_err(|e| {
            StoreError::Other(format!(
                "invalid redis url '{}': {}",
                settings.url,
                e.details()
            ))
        })?;
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
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "redis is not reachable yet; retrying in the background")
            }
            Err(_) => tracing::warn!("redis did not answer within 2s; retrying in the background"),
        }
        Ok(RedisStore {
            pool,
            fixed_window: Script::from_lua(FIXED_WINDOW),
            timeout,
        })
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.timeout)))
    }

    /// Sends one EVALSHA per hit in one pipeline; reloads the script and resends the calls that met NOSCRIPT.
    async fn eval_hits(&self, now_us: u64, hits: &[Hit]) -> Result<Vec<i64>, StoreError> {
        let client = self.pool.next();
        let mut results: Vec<Option<i64>> = vec![None; hits.len()];
        let mut pending: Vec<usize> = (0..hits.len()).collect();
        for attempt in 0..2 {
            let pipeline = client.pipeline();
            for &i in &pending {
                let hit = &hits[i];
                let ttl_ms = fixed_window::reset_after(now_us, hit.window_us)
                    .div_ceil(1_000)
                    .max(1);
                let args: Vec<Value> = vec![
                    Value::from(self.fixed_window.sha1().clone()),
                    Value::Integer(1),
                    Value::from(hit.key.as_str()),
                    Value::Integer(hit.cost as i64),
                    Value::Integer(ttl_ms as i64),
                ];
                let _: () = pipeline.custom(evalsha(), args).await.map_err(classify)?;
            }
            let answers: Vec<Result<i64, FredError>> = pipeline.try_all().await;
            let mut missing = Vec::new();
            for (&i, answer) in pending.iter().zip(answers) {
                match answer {
                    Ok(used) => results[i] = Some(used),
                    Err(e) if attempt == 0 && is_noscript(&e) => missing.push(i),
                    Err(e) => return Err(classify(e)),
                }
            }
            if missing.is_empty() {
                break;
            }
            self.load_scripts().await?;
            pending = missing;
        }
        results
            .into_iter()
            .map(|r| {
                r.ok_or_else(|| StoreError::Script("script still missing after reload".into()))
            })
            .collect()
    }

    async fn load_scripts(&self) -> Result<(), StoreError> {
        let client = self.pool.next();
        let lua = FIXED_WINDOW;
        let loaded: Result<String, FredError> = if client.is_clustered() {
            client.script_load_cluster(lua).await
        } else {
            client.script_load(lua).await
        };
        loaded.map(|_| ()).map_err(classify)
    }
}

/// EVALSHA as a custom command, routed in a cluster by its key (argument 2: `sha numkeys key ...`); fred's typed
/// `evalsha` cannot be queued in a pipeline.
fn evalsha() -> CustomCommand {
    CustomCommand::new_static("EVALSHA", ClusterHash::Offset(2), false)
}

fn is_noscript(e: &FredError) -> bool {
    e.details().starts_with("NOSCRIPT")
}

fn classify(e: FredError) -> StoreError {
    match e.kind() {
        ErrorKind::Timeout => StoreError::Connection(format!("timeout: {}", e.details())),
        ErrorKind::IO
        | ErrorKind::Canceled
        | ErrorKind::Routing
        | ErrorKind::Cluster
        | ErrorKind::Sentinel => StoreError::Connection(e.details().to_string()),
        _ if is_noscript(&e) || e.details().starts_with("ERR Error running script") => {
            StoreError::Script(e.details().to_string())
        }
        _ => StoreError::Other(e.details().to_string()),
    }
}

fn as_count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn hit(&self, now_us: u64, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        let used = self.bounded(self.eval_hits(now_us, hits)).await?;
        Ok(hits
            .iter()
            .zip(used)
            .map(|(hit, used)| {
                fixed_window::outcome(
                    as_count(used),
                    hit.limit,
                    fixed_window::reset_after(now_us, hit.window_us),
                )
            })
            .collect())
    }

    async fn peek(&self, now_us: u64, hits: &[Hit]) -> Result<Vec<Remaining>, StoreError> {
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        let read = async {
            let pipeline = self.pool.next().pipeline();
            for hit in hits {
                let _: () = pipeline.get(hit.key.as_str()).await.map_err(classify)?;
            }
            let values: Vec<Result<Option<i64>, FredError>> = pipeline.try_all().await;
            values
                .into_iter()
                .map(|v| v.map_err(classify))
                .collect::<Result<Vec<_>, _>>()
        };
        let values = self.bounded(read).await?;
        Ok(hits
            .iter()
            .zip(values)
            .map(|(hit, used)| {
                let used = as_count(used.unwrap_or(0));
                fixed_window::remaining(
                    used,
                    hit.limit,
                    hit.cost,
                    fixed_window::reset_after(now_us, hit.window_us),
                )
            })
            .collect())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(async {
            let _: Value = self.pool.next().ping(None).await.map_err(classify)?;
            Ok(())
        })
        .await
    }
}
