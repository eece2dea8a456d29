//! What clients talk to: the gRPC services and the HTTP endpoints. Each face is a thin conversion between its wire
//! format and the core's plain types; errors are mapped to gRPC statuses in one place ([`grpc`]).
//!
//! - [`grpc`]: Envoy's `RateLimitService/ShouldRateLimit` and `sluice.v1.RateLimiter` (decisions, GetRemaining,
//!   Reset, Release, the cost budgets' Check, Report, Reserve and Settle).
//! - [`rlqs`]: Envoy's `RateLimitQuotaService`, one task per stream over the core's quotas.
//! - [`http`]: the admin listener (health, readiness, metrics, configuration dump) and the reference's JSON API on
//!   its own listener; [`json`]: that API's JSON mapping.
//! - [`headers`]: the rate limit response headers (`RateLimit-*`, or the reference's `X-RateLimit-*`).
//! - [`prometheus`]: the core's metrics as Prometheus text.
//! - [`ui`]: the dashboard on the admin listener, `/ui`.

pub mod grpc;
pub mod headers;
pub mod http;
pub mod json;
pub mod prometheus;
pub mod rlqs;
pub mod ui;
