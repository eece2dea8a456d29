//! sluice: a rate-limit decision service, wire-compatible with Envoy's rate limit service.
//!
//! The pieces, in the order a request meets them:
//!
//! - [`config`]: the envoyproxy/ratelimit YAML files as written (raw serde types, every key checked).
//! - [`rules`]: those files compiled into an immutable matcher per domain; invalid configurations stop here.
//! - [`api`]: the gRPC services (Envoy's `RateLimitService`, `sluice.v1.RateLimiter`), thin conversions that
//!   hand plain requests to the core and map its errors to gRPC statuses in one place.
//! - [`limiter`]: the decision core, `should_rate_limit` and `get_remaining`; it knows no gRPC and no Redis.
//! - [`store`]: where counters live, one trait with an in-memory and a Redis (Lua) implementation, behind a
//!   circuit [`breaker`] and a local over-limit [`cache`].
//! - [`clock`]: injected time, read once per request.
//! - [`metrics`], [`http`], [`json`], [`headers`], [`telemetry`]: Prometheus counters, the HTTP endpoints and their
//!   JSON mapping, rate limit response headers, logs and traces.
//! - [`reload`]: watches the configuration and swaps in new rules when it changes, or on SIGHUP.
//! - [`server`]: assembly, listeners and graceful shutdown.
//! - [`tls`]: TLS on the gRPC listener (certificates reloaded when their files change), PEM files for Redis TLS.
//! - [`bench`]: `sluice bench`, a load generator that drives either API over real gRPC connections and reports
//!   throughput, checked answers and latency percentiles; [`client`]: `sluice client`, one call from the shell.

#![forbid(unsafe_code)]

pub mod api;
pub mod bench;
pub mod breaker;
pub mod cache;
pub mod client;
pub mod clock;
pub mod config;
pub mod headers;
pub mod http;
pub mod json;
pub mod limiter;
pub mod metrics;
pub mod proto;
pub mod reload;
pub mod rules;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tls;
