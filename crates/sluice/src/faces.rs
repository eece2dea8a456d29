//! What clients talk to: the gRPC services and the HTTP endpoints. Each face is a thin conversion between its wire
//! format and the core's plain types. The faces never import each other: what two of them share has a module of its
//! own ([`wire`], [`errors`], [`auth`], [`headers`]).
//!
//! - [`grpc`]: Envoy's `RateLimitService/ShouldRateLimit` and `sluice.v1.RateLimiter` (decisions, GetRemaining,
//!   Reset, Release, the cost budgets' Check, Report, Reserve and Settle).
//! - [`rlqs`]: Envoy's `RateLimitQuotaService`, one task per stream over the core's quotas.
//! - [`http`]: the admin listener (health, readiness, metrics, configuration dump) and the reference's JSON API on
//!   its own listener; [`json`]: that API's JSON mapping.
//! - [`headers`]: the rate limit response headers (`RateLimit-*`, or the reference's `X-RateLimit-*`).
//! - [`prometheus`]: the core's metrics as Prometheus text.
//! - [`ui`]: the dashboard on the admin listener, `/ui`.
//!
//! What they share:
//!
//! - [`wire`]: a `RateLimitRequest` into the core's request, a decision into a `RateLimitResponse`, and the byte cap
//!   on a request; the gRPC services and the JSON API convert through it.
//! - [`errors`]: the one place where the core's errors become gRPC statuses and HTTP answers.
//! - [`auth`]: the admin token, checked on gRPC calls and on the admin listener.

pub mod auth;
pub mod errors;
pub mod grpc;
pub mod headers;
pub mod http;
pub mod json;
pub mod prometheus;
pub mod rlqs;
pub mod ui;
pub mod wire;
