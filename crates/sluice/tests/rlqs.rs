//! The Rate Limit Quota Service through gRPC: a stream answers each report with assignments, the RLQS metrics show
//! what it did, bounds on streams answer RESOURCE_EXHAUSTED, a bad message ends the stream with INVALID_ARGUMENT, and
//! a graceful shutdown ends every open stream with UNAVAILABLE instead of waiting for it.

use std::collections::HashMap;
use std::time::Duration;

use sluice::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction;
use sluice::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use sluice::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use sluice::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use sluice::proto::envoy::r#type::v3::rate_limit_strategy::Strategy;
use sluice::quota::QuotaCaps;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::harness::{TestServer, limiter, memory};

const RULES: &str = "domain: q
quota_buckets:
  - bucket: {name: per_user, user: }
    rate_limit: {unit: hour, requests_per_unit: 10}
";

struct Stream {
    send: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    async fn open(server: &TestServer) -> Result<Stream, tonic::Status> {
        let mut client = RateLimitQuotaServiceClient::connect(server.grpc_url()).await.unwrap();
        let (send, rx) = mpsc::channel(4);
        let answers = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Stream { send, answers })
    }

    async fn report(&self, domain: &str, user: &str, allowed: u64, denied: u64) {
        let bucket = HashMap::from([
            ("name".to_string(), "per_user".to_string()),
            ("user".into(), user.into()),
        ]);
        let usage = BucketQuotaUsage {
            bucket_id: Some(BucketId { bucket }),
            time_elapsed: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        };
        let message = RateLimitQuotaUsageReports {
            domain: domain.into(),
            bucket_quota_usages: vec![usage],
        };
        self.send.send(message).await.unwrap();
    }

    async fn next(&mut self) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
        tokio::time::timeout(Duration::from_secs(5), self.answers.message())
            .await
            .expect("an answer within 5 s")
    }
}

/// Each action's strategy, in order.
fn strategies(response: &RateLimitQuotaResponse) -> Vec<Strategy> {
    response
        .bucket_action
        .iter()
        .map(|action| match &action.bucket_action {
            Some(BucketAction::QuotaAssignmentAction(a)) => a.rate_limit_strategy.unwrap().strategy.unwrap(),
            other => panic!("an assignment expected: {other:?}"),
        })
        .collect()
}

fn strategy(response: &RateLimitQuotaResponse) -> Strategy {
    match &strategies(response)[..] {
        [one] => *one,
        _ => panic!("one action expected: {response:?}"),
    }
}

#[tokio::test]
async fn reports_are_answered_and_counted_in_metrics() {
    let (l, _) = limiter(RULES, memory());
    let server = TestServer::start(l).await;
    let mut stream = Stream::open(&server).await.unwrap();
    stream.report("q", "ann", 4, 0).await;
    // A bucket that starts full: a DENY_ALL first, so that Envoy carries no fill fraction over; then all of the 6
    // left (too few to keep a reserve), as the only stream connected.
    match &strategies(&stream.next().await.unwrap().unwrap())[..] {
        [Strategy::BlanketRule(1), Strategy::TokenBucket(bucket)] => assert_eq!(bucket.max_tokens, 6),
        other => panic!("{other:?}"),
    }
    let (_, overview) = server
        .http_get("/ui/api/overview?domain=q&token=test-admin-token")
        .await;
    assert!(
        overview.contains("\"strategy\":\"token_bucket\"") && overview.contains("\"tokens\":6"),
        "{overview}"
    );
    stream.report("", "ann", 7, 2).await;
    assert!(matches!(
        strategy(&stream.next().await.unwrap().unwrap()),
        Strategy::BlanketRule(1)
    ));
    // The dashboard shows what the stream was last told: a DENY_ALL for ann's bucket.
    let (status, overview) = server
        .http_get("/ui/api/overview?domain=q&token=test-admin-token")
        .await;
    assert_eq!(status, 200, "{overview}");
    let overview: serde_json::Value = serde_json::from_str(&overview).unwrap();
    let shares = overview["rlqs_assignments"].as_array().unwrap();
    assert_eq!(shares.len(), 1, "{overview}");
    assert_eq!(shares[0]["bucket"], "name=per_user, user=ann");
    assert_eq!(shares[0]["strategy"], "deny_all");
    // cy's Envoy denied 3 while cy's quota had 9 left: 3 wrongful denials (ann's 2 came with her quota spent).
    stream.report("", "cy", 1, 3).await;
    stream.next().await.unwrap().unwrap();
    let (_, metrics) = server.http_get("/metrics").await;
    for line in [
        "sluice_rlqs_streams 1",
        "sluice_rlqs_buckets 2",
        "sluice_rlqs_assignments_total{strategy=\"token_bucket\"} 2",
        "sluice_rlqs_assignments_total{strategy=\"deny_all\"} 1",
        "sluice_rlqs_usage_total{result=\"allowed\"} 12",
        "sluice_rlqs_usage_total{result=\"denied\"} 5",
        "sluice_rlqs_quota_exhausted_total 1",
        "sluice_rlqs_wrongful_denials_total{domain=\"q\",rule=\"q.bucket.name_per_user.user\"} 3",
        "sluice_rule_hits_total{domain=\"q\",rule=\"q.bucket.name_per_user.user\"} 17",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing `{line}` in:\n{metrics}");
    }
    // The dashboard's rule rows count the reported usage, as they count decisions (flushed once a second).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, overview) = server
            .http_get("/ui/api/overview?domain=q&token=test-admin-token")
            .await;
        let overview: serde_json::Value = serde_json::from_str(&overview).unwrap();
        let row = &overview["last_minute"]["q.bucket.name_per_user.user"];
        if *row == serde_json::json!({"allowed": 12, "denied": 5}) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the rule row says {row}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A stream that ends gives back its place and its watches, and leaves the dashboard.
    drop(stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, metrics) = server.http_get("/metrics").await;
        let (_, overview) = server
            .http_get("/ui/api/overview?domain=q&token=test-admin-token")
            .await;
        if metrics.lines().any(|l| l == "sluice_rlqs_streams 0")
            && metrics.lines().any(|l| l == "sluice_rlqs_buckets 0")
            && overview.contains("\"rlqs_assignments\":[]")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stream's watches were never given back:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.shutdown().await;
}

#[tokio::test]
async fn bad_messages_and_caps_end_streams_with_their_status() {
    let (l, _) = limiter(RULES, memory());
    let options = sluice::server::ServeOptions {
        quota_caps: QuotaCaps {
            max_streams: 1,
            ..QuotaCaps::default()
        },
        ..TestServer::options()
    };
    let server = TestServer::start_serving(l, options).await;
    let mut first = Stream::open(&server).await.unwrap();
    // The server has room for one stream.
    let second = match Stream::open(&server).await {
        Ok(mut s) => s.next().await.map(|_| ()),
        Err(status) => Err(status),
    };
    let status = second.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("--rlqs-max-streams"), "{status:?}");
    first.report("", "ann", 1, 0).await;
    let status = first.next().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "domain: empty in the stream's first message");
    // The ended stream gives its place back (once its task has seen the end).
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let mut third = Stream::open(&server).await.unwrap();
        third.report("q", "ann", 1, 0).await;
        match third.next().await {
            Ok(answer) => {
                assert!(answer.is_some());
                break;
            }
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                assert!(std::time::Instant::now() < deadline, "the place was never given back");
                tokio::task::yield_now().await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_open_streams_with_unavailable() {
    let (l, _) = limiter(RULES, memory());
    let server = TestServer::start(l).await;
    let mut stream = Stream::open(&server).await.unwrap();
    stream.report("q", "ann", 1, 0).await;
    assert!(stream.next().await.unwrap().is_some());
    // The stream stays open from the client's side; shutdown must not wait for it (the grace period is 2 s).
    let started = std::time::Instant::now();
    let shutdown = tokio::spawn(server.shutdown());
    let status = stream.next().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    shutdown.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}

/// `--max-request-bytes` bounds RLQS messages too: one over it ends the stream with INVALID_ARGUMENT naming the flag.
#[tokio::test]
async fn a_report_over_the_request_cap_is_refused_by_name() {
    let settings = sluice::limiter::LimiterSettings {
        caps: sluice::limiter::Caps {
            max_request_bytes: 512,
            ..Default::default()
        },
        ..Default::default()
    };
    let (l, _) = crate::harness::limiter_with(RULES, memory(), settings);
    let server = TestServer::start(l).await;
    let mut stream = Stream::open(&server).await.unwrap();
    stream.report("q", "ann", 1, 0).await;
    assert!(stream.next().await.unwrap().is_some(), "a small report is answered");
    stream.report("q", &"x".repeat(600), 1, 0).await;
    let status = stream.next().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("--max-request-bytes"), "{status:?}");
    server.shutdown().await;
}
