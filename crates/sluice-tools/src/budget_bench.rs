//! `sluice-budget-bench`: how many Reserve+Settle pairs one sluice serves. `--callers` tasks over `--connections`
//! connections each reserve an estimate for a user drawn from `--users`, then settle it at once with a smaller actual
//! cost, as fast as answered (closed loop). It counts pairs per second and the round trip of a pair, and fails on any
//! RPC error or on a reservation that was refused or not found at settlement (size the budget in the config so
//! that it never runs out).

use std::collections::HashMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use crate::proto::sluice::v1::rate_limiter_client::RateLimiterClient;
use crate::proto::sluice::v1::{ReserveRequest, SettleRequest};

/// The flags of `sluice-budget-bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BudgetBenchArgs {
    /// The sluice gRPC address (plaintext HTTP/2).
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub target: String,
    /// Separate HTTP/2 connections.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1_024))]
    pub connections: u32,
    /// Concurrent callers, each reserving then settling in a loop.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub callers: u32,
    /// Users the callers draw from (descriptor `user=<n>`).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub users: u32,
    /// The domain.
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// The estimate each reservation holds; the settlement's actual cost is half of it.
    #[arg(long, default_value_t = 100)]
    pub estimate: u64,
    /// How long to measure, e.g. 500ms, 10s, 2m.
    #[arg(long, default_value = "10s", value_parser = crate::bench::parse_duration)]
    pub duration: Duration,
}

/// Runs the load and prints pairs per second and the round trip of a pair.
pub async fn run(args: &BudgetBenchArgs) -> anyhow::Result<String> {
    let mut clients = Vec::new();
    for _ in 0..args.connections {
        clients.push(RateLimiterClient::connect(args.target.clone()).await?);
    }
    let end = Instant::now() + args.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..args.callers {
        let mut client = clients[(caller % args.connections) as usize].clone();
        let (domain, estimate, users) = (args.domain.clone(), args.estimate, args.users);
        tasks.spawn(async move {
            let mut histogram = Histogram::<u64>::new(3)?;
            let mut n = u64::from(caller);
            while Instant::now() < end {
                // A cheap spread over the users: a multiplicative step per caller.
                n = n
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let descriptors = vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "user".into(),
                        value: ((n >> 33) % u64::from(users)).to_string(),
                    }],
                    ..Default::default()
                }];
                let started = Instant::now();
                let reserved = client
                    .reserve(ReserveRequest {
                        domain: domain.clone(),
                        descriptors: descriptors.clone(),
                        estimate: Some(estimate),
                        estimates: HashMap::new(),
                        ttl: None,
                    })
                    .await?
                    .into_inner();
                anyhow::ensure!(
                    !reserved.reservation_id.is_empty(),
                    "a reservation was refused: raise the budget"
                );
                let settled = client
                    .settle(SettleRequest {
                        domain: domain.clone(),
                        descriptors,
                        reservation_id: reserved.reservation_id,
                        actual: Some(estimate / 2),
                        actuals: HashMap::new(),
                    })
                    .await?
                    .into_inner();
                anyhow::ensure!(settled.settled, "a reservation was not found at settlement");
                histogram.record(started.elapsed().as_micros() as u64)?;
            }
            anyhow::Ok(histogram)
        });
    }
    let started = Instant::now();
    let mut all = Histogram::<u64>::new(3)?;
    while let Some(done) = tasks.join_next().await {
        all.add(done??)?;
    }
    let secs = started.elapsed().as_secs_f64();
    let ms = |q: f64| all.value_at_quantile(q) as f64 / 1000.0;
    Ok(format!(
        "pairs/s           {:.0}\npair round trip   p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms\n",
        all.len() as f64 / secs,
        ms(0.5),
        ms(0.99),
        all.max() as f64 / 1000.0
    ))
}
