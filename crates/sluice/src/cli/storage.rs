//! Where the counters live and what happens when their store fails: Redis (URL, timeout, pool, TLS; without it,
//! memory), the key prefix, the failure policy, the circuit breaker and the local over-limit cache.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::breaker::BreakerSettings;
use crate::rules::FailurePolicy;
use crate::store::KeyLayout;
use crate::store::redis::{RedisSettings, RedisTls};

/// `serve`'s flags for the store.
#[derive(Debug, Args)]
pub(super) struct StorageFlags {
    /// Redis URL (redis://, rediss://, redis-cluster://, redis-sentinel://). Without it counters live in memory.
    #[arg(long, env = "SLUICE_REDIS_URL")]
    pub(super) redis_url: Option<String>,
    /// Bound on every Redis call, in milliseconds.
    #[arg(long, env = "SLUICE_REDIS_TIMEOUT_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub(super) redis_timeout_ms: u64,
    /// Redis connections, each pipelining many calls; against one server also the script calls in flight at once
    /// (at least 2), each shared by the requests that waited for it.
    #[arg(long, env = "SLUICE_REDIS_POOL_SIZE", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub(super) redis_pool_size: u64,
    /// PEM CA certificates to trust for a rediss:// URL, instead of the system's roots.
    #[arg(long, env = "SLUICE_REDIS_TLS_CA", requires = "redis_url")]
    pub(super) redis_tls_ca: Option<PathBuf>,
    /// PEM client certificate for Redis (tls-auth-clients); needs --redis-tls-key.
    #[arg(long, env = "SLUICE_REDIS_TLS_CERT", requires_all = ["redis_url", "redis_tls_key"])]
    pub(super) redis_tls_cert: Option<PathBuf>,
    /// PEM private key of --redis-tls-cert.
    #[arg(long, env = "SLUICE_REDIS_TLS_KEY", requires = "redis_tls_cert")]
    pub(super) redis_tls_key: Option<PathBuf>,
    /// Prefix of every counter key; may not contain '{' or '}'.
    #[arg(long, env = "SLUICE_KEY_PREFIX", default_value = "sluice:", value_parser = parse_prefix)]
    pub(super) key_prefix: String,
    /// How counters' keys are written: `compact` (a digest of the descriptor: short keys, whatever the request
    /// carries) or `reference` (compact, but a descriptor's one fixed window under envoyproxy/ratelimit's key, so
    /// counts carry over from it; the compatibility mode's default).
    #[arg(long, env = "SLUICE_KEY_LAYOUT", value_enum, default_value = "compact")]
    pub(super) key_layout: Layout,
    /// What to answer when Redis fails or times out, for domains whose file does not set `failure_policy`.
    #[arg(long, env = "SLUICE_FAILURE_POLICY", value_enum, default_value = "error")]
    pub(super) failure_policy: Policy,
    /// Consecutive failed Redis calls that open the circuit breaker (0: never open it).
    #[arg(long, env = "SLUICE_BREAKER_FAILURES", default_value_t = 5)]
    pub(super) breaker_failures: u32,
    /// How long the open breaker answers by the failure policy before probing Redis again, in milliseconds.
    #[arg(long, env = "SLUICE_BREAKER_COOLDOWN_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub(super) breaker_cooldown_ms: u64,
    /// Over-limit descriptors remembered locally until their retry time (0: no local cache).
    #[arg(long, env = "SLUICE_LOCAL_CACHE_SIZE", default_value_t = 100_000)]
    pub(super) local_cache_size: usize,
}

impl StorageFlags {
    /// The Redis store's settings; `None`: the counters live in memory.
    pub(super) fn redis(&self) -> Option<RedisSettings> {
        self.redis_url.clone().map(|url| RedisSettings {
            url,
            timeout: Duration::from_millis(self.redis_timeout_ms),
            pool_size: self.redis_pool_size as usize,
            server_time: true,
            tls: RedisTls {
                ca: self.redis_tls_ca.clone(),
                cert: self.redis_tls_cert.clone(),
                key: self.redis_tls_key.clone(),
            },
        })
    }

    /// The circuit breaker in front of the store.
    pub(super) fn breaker(&self) -> BreakerSettings {
        BreakerSettings {
            failures: self.breaker_failures,
            cooldown: Duration::from_millis(self.breaker_cooldown_ms),
        }
    }
}

/// `--key-layout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Layout {
    Compact,
    Reference,
}

impl From<Layout> for KeyLayout {
    fn from(l: Layout) -> KeyLayout {
        match l {
            Layout::Compact => KeyLayout::Compact,
            Layout::Reference => KeyLayout::Reference,
        }
    }
}

/// `--failure-policy`, spelled as in the YAML files (`fail_open`) or with dashes (`fail-open`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Policy {
    #[value(name = "fail-open", alias = "fail_open")]
    FailOpen,
    #[value(name = "fail-closed", alias = "fail_closed")]
    FailClosed,
    Error,
}

impl From<Policy> for FailurePolicy {
    fn from(p: Policy) -> FailurePolicy {
        match p {
            Policy::FailOpen => FailurePolicy::FailOpen,
            Policy::FailClosed => FailurePolicy::FailClosed,
            Policy::Error => FailurePolicy::Error,
        }
    }
}

/// A key prefix the store can use (no '{' or '}').
fn parse_prefix(s: &str) -> Result<String, String> {
    crate::store::check_prefix(s).map(|()| s.to_string())
}
