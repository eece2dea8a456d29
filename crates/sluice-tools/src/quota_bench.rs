//! `sluice-quota-bench`: how many RLQS usage reports one sluice absorbs. It opens `--streams` streams, as that many
//! Envoys would, spreads `--buckets` buckets over them, and has each stream report all its buckets in one message
//! as soon as the previous answer arrived (closed loop; Envoy itself reports every 5 s). It counts messages and
//! bucket reports per second, the round trip of a message, and fails on any stream error or missing answer.

use std::collections::HashMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::proto::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};

/// The flags of `sluice-quota-bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct QuotaBenchArgs {
    /// The sluice gRPC address (plaintext HTTP/2).
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub target: String,
    /// Streams, each on its own connection (one per Envoy).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub streams: u32,
    /// Buckets in all, spread evenly over the streams: `{name: <bucket-name>, user: <n>}`.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub buckets: u32,
    /// The RLQS domain.
    #[arg(long, default_value = "edge-quota")]
    pub domain: String,
    /// The `name` entry of every bucket id.
    #[arg(long, default_value = "per_user")]
    pub bucket_name: String,
    /// How long to measure, e.g. 500ms, 10s, 2m.
    #[arg(long, default_value = "10s", value_parser = crate::bench::parse_duration)]
    pub duration: Duration,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What one run measured.
#[derive(Debug)]
pub struct QuotaReport {
    pub messages: u64,
    pub bucket_reports: u64,
    pub elapsed: Duration,
    pub round_trip_us: Histogram<u64>,
}

impl QuotaReport {
    pub fn text(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        let q = |p: f64| self.round_trip_us.value_at_quantile(p) as f64 / 1000.0;
        format!(
            "messages/s        {:.0}\nbucket reports/s  {:.0}\nround trip (ms)   p50 {:.2}  p99 {:.2}  max {:.2}\n",
            self.messages as f64 / secs,
            self.bucket_reports as f64 / secs,
            q(0.5),
            q(0.99),
            self.round_trip_us.max() as f64 / 1000.0
        )
    }

    pub fn json(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        serde_json::json!({
            "messages_per_second": self.messages as f64 / secs,
            "bucket_reports_per_second": self.bucket_reports as f64 / secs,
            "round_trip_ms": {
                "p50": self.round_trip_us.value_at_quantile(0.5) as f64 / 1000.0,
                "p99": self.round_trip_us.value_at_quantile(0.99) as f64 / 1000.0,
                "max": self.round_trip_us.max() as f64 / 1000.0,
            },
        })
        .to_string()
    }
}

/// Runs the load; an error names the stream that failed and why.
pub async fn run(args: &QuotaBenchArgs) -> anyhow::Result<QuotaReport> {
    let end = Instant::now() + args.duration;
    let per_stream = args.buckets.div_ceil(args.streams);
    let mut tasks = tokio::task::JoinSet::new();
    for stream in 0..args.streams {
        let first = stream * per_stream;
        let last = (first + per_stream).min(args.buckets);
        let buckets: Vec<BucketId> = (first..last)
            .map(|n| BucketId {
                bucket: HashMap::from([
                    ("name".to_string(), args.bucket_name.clone()),
                    ("user".to_string(), n.to_string()),
                ]),
            })
            .collect();
        if buckets.is_empty() {
            continue;
        }
        let mut client = RateLimitQuotaServiceClient::connect(args.target.clone()).await?;
        let domain = args.domain.clone();
        tasks.spawn(async move {
            let (send, rx) = mpsc::channel(1);
            let mut answers = client
                .stream_rate_limit_quotas(ReceiverStream::new(rx))
                .await?
                .into_inner();
            let mut histogram = Histogram::<u64>::new(3)?;
            let (mut messages, mut reports) = (0u64, 0u64);
            let usages: Vec<BucketQuotaUsage> = buckets
                .into_iter()
                .map(|id| BucketQuotaUsage {
                    bucket_id: Some(id),
                    time_elapsed: Some(prost_types::Duration { seconds: 5, nanos: 0 }),
                    num_requests_allowed: 1,
                    num_requests_denied: 0,
                })
                .collect();
            while Instant::now() < end {
                let sent = Instant::now();
                let message = RateLimitQuotaUsageReports {
                    domain: domain.clone(),
                    bucket_quota_usages: usages.clone(),
                };
                send.send(message).await?;
                // The answer to this message: one action per bucket (a push between could carry fewer).
                let mut answered = 0;
                while answered < usages.len() {
                    let answer = tokio::time::timeout(Duration::from_secs(5), answers.message())
                        .await
                        .map_err(|_| anyhow::anyhow!("stream {stream}: no answer within 5 s"))??
                        .ok_or_else(|| anyhow::anyhow!("stream {stream}: ended by the server"))?;
                    answered += answer.bucket_action.len();
                }
                histogram.record(sent.elapsed().as_micros() as u64)?;
                messages += 1;
                reports += usages.len() as u64;
            }
            anyhow::Ok((messages, reports, histogram))
        });
    }
    let started = Instant::now();
    let mut report = QuotaReport {
        messages: 0,
        bucket_reports: 0,
        elapsed: Duration::ZERO,
        round_trip_us: Histogram::<u64>::new(3)?,
    };
    while let Some(done) = tasks.join_next().await {
        let (messages, reports, histogram) = done??;
        report.messages += messages;
        report.bucket_reports += reports;
        report.round_trip_us.add(histogram)?;
    }
    report.elapsed = started.elapsed();
    Ok(report)
}
