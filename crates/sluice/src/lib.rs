//! sluice: a rate-limit decision service, wire-compatible with Envoy's rate limit service, over the decision core
//! of [`sluice_core`].
//!
//! The core (configuration, rules, the limiter, the stores, the breaker and the cache) is re-exported here under
//! its own module names. What this crate adds:
//!
//! - [`faces`]: what clients talk to. gRPC: Envoy's `RateLimitService`, `sluice.v1.RateLimiter` and its cost budgets
//!   ([`faces::grpc`]), Envoy's `RateLimitQuotaService` ([`faces::rlqs`]); HTTP: the admin endpoints and the
//!   reference's JSON API ([`faces::http`], [`faces::json`]), rate limit response headers ([`faces::headers`]) and
//!   the metrics as Prometheus text ([`faces::prometheus`]).
//! - [`sources`]: where the rules come from. Files, watched and reloaded ([`sources::reload`]); an xDS management
//!   server such as Envoy Gateway ([`sources::xds`]); the values of lists fetched from URLs ([`sources::lists`]).
//! - [`operations`]: what running it takes besides: logs and traces ([`operations::telemetry`]), TLS on the
//!   listeners with certificates reloaded when their files change ([`operations::tls`]).
//! - [`server`]: the assembly of all of it, the listeners, and graceful shutdown.
//! - [`cli`]: the command line (`serve`, `check`, `simulate`), `serve`'s flags grouped by concern, and
//!   envoyproxy/ratelimit's environment variables turned into `serve` flags ([`cli::environment`]).
//! - [`simulate`]: the strategy lab (`sluice simulate`): traffic replayed through the core once per algorithm, and
//!   a report of what each did, drawn with [`charts`] (which the dashboard draws with too).
//! - [`proto`]: the generated protobuf types, which the tools crate uses too.
//!
//! Outer modules import inner ones: the server imports the faces, the sources and the operations; the faces import
//! the operations (TLS) and what they share ([`faces::wire`], [`faces::errors`], [`faces::auth`]), never each other;
//! nothing imports the server but the command line, and nothing imports the command line.

#![forbid(unsafe_code)]

pub use sluice_core::{breaker, cache, clock, config, limiter, metrics, pem, quota, regions, rules, store};

pub mod charts;
pub mod cli;
pub mod faces;
pub mod operations;
pub mod proto;
pub mod server;
pub mod simulate;
pub mod sources;
