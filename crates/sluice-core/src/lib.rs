//! sluice-core: the rate-limit decision core, with no network face. Embed it to get the sluice service's semantics
//! in-process: the same configuration files, the same algorithms, the same Redis scripts.
//!
//! The pieces, in the order a request meets them:
//!
//! - [`config`]: the envoyproxy/ratelimit YAML files as written (raw serde types, every key checked).
//! - [`rules`]: those files compiled into an immutable matcher per domain; invalid configurations stop here.
//! - [`limiter`]: the decision core, the `Limiter` and its parts: decisions, budgets, lists, tallies, buckets.
//! - [`quota`]: Envoy's Rate Limit Quota Service over the limiter: usage reports in, quota assignments out.
//! - [`store`]: where counters live, one trait with an in-memory and a Redis (Lua) implementation, behind a
//!   circuit [`breaker`] per server and a local over-limit [`cache`].
//! - [`regions`]: limits counted across regions, each deciding from its own store and shipping its counts.
//! - [`clock`]: injected time, read once per request.
//! - [`metrics`]: counters recorded through the `metrics` facade into a sink the embedder chooses.
//! - [`pem`]: TLS files for the Redis client.
//!
//! A minimal embedding (see `examples/embedded.rs` for a whole HTTP service):
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use sluice_core::{clock::SystemClock, config, limiter::*, metrics::Metrics, rules::RuleSet, store::memory::MemoryStore};
//!
//! let metrics = Metrics::discarded(0.8);
//! let rules = RuleSet::compile(&config::load("limits.yaml".as_ref())?, &metrics)?;
//! let limiter = Limiter::new(rules, MemoryStore::new(), Arc::new(SystemClock), metrics, LimiterSettings::default());
//! let request = Request {
//!     domain: "edge".into(),
//!     descriptors: vec![Descriptor { entries: vec![("user".into(), "alice".into())], ..Descriptor::default() }],
//!     hits_addend: 0,
//! };
//! let allowed = limiter.decisions().should_rate_limit(&request).await?.overall == Code::Ok;
//! # let _ = allowed; Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod breaker;
pub mod cache;
pub mod clock;
pub mod config;
pub mod limiter;
pub mod metrics;
pub mod pem;
pub mod quota;
pub mod regions;
pub mod rules;
pub mod store;
