//! sluice: a rate-limit decision service, wire-compatible with Envoy's rate limit service, over the decision core
//! of [`sluice_core`].
//!
//! The core (configuration, rules, the limiter, the stores, the breaker and the cache) is re-exported here under
//! its own module names. What this crate adds, in the order a request meets it:
//!
//! - [`api`]: the gRPC services (Envoy's `RateLimitService`, `sluice.v1.RateLimiter`), thin conversions that
//!   hand plain requests to the core and map its errors to gRPC statuses in one place.
//! - [`rlqs`]: Envoy's `RateLimitQuotaService`, one task per stream over the core's [`quota`].
//! - [`http`], [`json`], [`headers`]: the HTTP endpoints (admin, and the reference's JSON API on its own listener),
//!   their JSON mapping, and rate limit response headers.
//! - [`prometheus`], [`telemetry`]: the core's metrics as Prometheus text; logs and traces.
//! - [`reload`]: watches the configuration and swaps in new rules when it changes, or on SIGHUP.
//! - [`xds`]: or, instead of files, takes the rules from an xDS management server (Envoy Gateway) as they are pushed.
//! - [`compat`]: envoyproxy/ratelimit's environment variables, turned into `serve` flags (`--compat envoy-ratelimit`).
//! - [`server`]: assembly, listeners and graceful shutdown; [`tls`]: TLS on the gRPC listener (certificates
//!   reloaded when their files change).
//! - [`proto`]: the generated protobuf types, which the tools crate uses too.

#![forbid(unsafe_code)]

pub use sluice_core::{breaker, cache, clock, config, limiter, metrics, pem, quota, rules, store};

pub mod api;
pub mod compat;
pub mod headers;
pub mod http;
pub mod json;
pub mod prometheus;
pub mod proto;
pub mod reload;
pub mod rlqs;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod xds;
