//! Cost budgets through gRPC (`sluice.v1.RateLimiter` Check, Report, Reserve, Settle), over the memory store and a
//! real Redis, on a manual clock: many reservations at once never overspend, Settle refunds and charges, an unsettled
//! reservation expires at its estimate, Report past the limit makes the next Check deny, huge costs neither wrap nor
//! fail, bad input is INVALID_ARGUMENT naming the field, and the cost metrics count each kind.

use std::collections::HashMap;

use sluice::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::sluice::v1::rate_limiter_client::RateLimiterClient;
use sluice::proto::sluice::v1::{CostRequest, ReserveRequest, SettleRequest};
use sluice::store::Store;
use tonic::transport::Channel;

use crate::harness::{RedisServer, TestServer, limiter, memory, redis_store};

const RULES: &str = "domain: llm
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000, name: tokens}
";

fn user(name: &str) -> Vec<RateLimitDescriptor> {
    vec![RateLimitDescriptor {
        entries: vec![Entry {
            key: "user".into(),
            value: name.into(),
        }],
        ..Default::default()
    }]
}

fn reserve(name: &str, estimate: u64, ttl_s: Option<i64>) -> ReserveRequest {
    ReserveRequest {
        domain: "llm".into(),
        descriptors: user(name),
        estimate: Some(estimate),
        estimates: HashMap::new(),
        ttl: ttl_s.map(|seconds| prost_types::Duration { seconds, nanos: 0 }),
    }
}

fn settle(name: &str, id: &str, actual: u64) -> SettleRequest {
    SettleRequest {
        domain: "llm".into(),
        descriptors: user(name),
        reservation_id: id.into(),
        actual: Some(actual),
        actuals: HashMap::new(),
    }
}

fn cost(name: &str, cost: u64) -> CostRequest {
    CostRequest {
        domain: "llm".into(),
        descriptors: user(name),
        cost: Some(cost),
        costs: HashMap::new(),
    }
}

async fn client(server: &TestServer) -> RateLimiterClient<Channel> {
    RateLimiterClient::connect(server.grpc_url()).await.unwrap()
}

async fn budgets_through_grpc(store: impl Store) {
    let (l, clock) = limiter(RULES, store);
    let server = TestServer::start(l.clone()).await;
    let c = client(&server).await;

    // 50 reservations of 100 at once against 1 000: exactly 10 are held.
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.reserve(reserve("ann", 100, None)).await.unwrap().into_inner()
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        if r.reservation_id.is_empty() {
            assert_eq!(r.overall_code, Code::OverLimit as i32);
        } else {
            assert_eq!(r.overall_code, Code::Ok as i32);
            assert_eq!(r.ttl.unwrap().seconds, 300, "the default TTL");
            ids.push(r.reservation_id);
        }
    }
    assert_eq!(ids.len(), 10);
    let mut c1 = c.clone();
    assert_eq!(
        c1.check(cost("ann", 1)).await.unwrap().into_inner().overall_code,
        Code::OverLimit as i32
    );

    // Settling refunds (20 spent of 100) and charges (150 of 100).
    let refunded = c1.settle(settle("ann", &ids[0], 20)).await.unwrap().into_inner();
    assert!(refunded.settled);
    assert_eq!(
        (refunded.settlements[0].refunded, refunded.settlements[0].charged),
        (80, 0)
    );
    let charged = c1.settle(settle("ann", &ids[1], 150)).await.unwrap().into_inner();
    assert_eq!(
        (charged.settlements[0].refunded, charged.settlements[0].charged),
        (0, 50)
    );
    assert!(
        !c1.settle(settle("ann", &ids[1], 0)).await.unwrap().into_inner().settled,
        "twice"
    );
    let check = c1.check(cost("ann", 30)).await.unwrap().into_inner();
    assert_eq!(
        (check.overall_code, check.statuses[0].limit_remaining),
        (Code::Ok as i32, 30)
    );

    // An unsettled reservation expires after its TTL and stays charged at its estimate.
    let short = c1.reserve(reserve("bob", 400, Some(2))).await.unwrap().into_inner();
    clock.advance(2_000_000);
    assert!(
        !c1.settle(settle("bob", &short.reservation_id, 0))
            .await
            .unwrap()
            .into_inner()
            .settled
    );
    let check = c1.check(cost("bob", 601)).await.unwrap().into_inner();
    assert_eq!(
        (check.overall_code, check.statuses[0].limit_remaining),
        (Code::OverLimit as i32, 0)
    );
    // The instance that made it counts it as expired once it reaps it (the server does every 5 s); bob's 400 was
    // settled by no one, and ann's 8 unsettled reservations of 100 have not expired yet.
    clock.advance(1_000_000);
    assert_eq!(l.budgets().reap_expired().await.unwrap(), 400);

    // Report is never refused, counts past the limit, and the next Check denies; a huge cost neither wraps nor fails.
    let report = c1.report(cost("cid", u64::MAX)).await.unwrap().into_inner();
    assert_eq!(
        (report.overall_code, report.statuses[0].limit_remaining),
        (Code::Ok as i32, 0)
    );
    assert_eq!(
        c1.check(cost("cid", 0)).await.unwrap().into_inner().overall_code,
        Code::OverLimit as i32
    );
    let huge = c1.reserve(reserve("dan", u64::MAX, None)).await.unwrap().into_inner();
    assert!(huge.reservation_id.is_empty() && huge.overall_code == Code::OverLimit as i32);

    // Bad input names the field.
    let e = c1.reserve(reserve("ann", 1, Some(0))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("ttl must be"), "{e:?}");
    let e = c1.settle(settle("ann", "", 1)).await.unwrap_err();
    assert!(e.message().starts_with("reservation_id"), "{e:?}");
    let e = c1.check(CostRequest::default()).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::InvalidArgument, "domain is empty")
    );

    // The cost metrics count each kind.
    let (_, metrics) = server.http_get("/metrics").await;
    let series = |kind: &str| {
        let prefix =
            format!("sluice_rule_cost_total{{domain=\"llm\",rule=\"llm.user\",limit=\"tokens\",kind=\"{kind}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {kind} series in:\n{metrics}"))
    };
    // 10 reservations of 100, bob's 400; settled: two estimates of 100; refunded 80, charged 50; reported 1 001.
    assert_eq!(series("reserved"), 1_400);
    assert_eq!(series("settled"), 200);
    assert_eq!(series("actual"), 170);
    assert_eq!((series("refunded"), series("charged")), (80, 50));
    assert_eq!(series("reported"), 1_001);
    assert_eq!(series("expired"), 400);
    server.shutdown().await;
}

#[tokio::test]
async fn budgets_through_grpc_in_memory() {
    budgets_through_grpc(memory()).await;
}

#[tokio::test]
async fn budgets_through_grpc_on_redis() {
    let redis = RedisServer::start();
    budgets_through_grpc(redis_store(&redis.url()).await).await;
}

/// On the dashboard a Report is no decision: its rule's series counts it apart (`reported`), neither allowed nor
/// denied, while a Reserve is a decision like any other.
#[tokio::test]
async fn the_dashboard_shows_reports_apart_from_decisions() {
    let (l, clock) = limiter(RULES, memory());
    let server = TestServer::start(l.clone()).await;
    let mut c = client(&server).await;
    let held = c.reserve(reserve("ann", 100, None)).await.unwrap().into_inner();
    assert_eq!(held.overall_code, Code::Ok as i32);
    for n in [10, 2_000] {
        let reported = c.report(cost("ann", n)).await.unwrap().into_inner();
        assert_eq!(reported.overall_code, Code::Ok as i32, "a report is never refused");
    }
    let denied = c.reserve(reserve("ann", 1_000, None)).await.unwrap().into_inner();
    assert_eq!(denied.overall_code, Code::OverLimit as i32);
    l.tallies().flush_series().await;
    // The seconds served end two seconds before now.
    clock.advance(3_000_000);
    let token = format!("token={}", crate::harness::ADMIN_TOKEN);
    let (status, body) = server
        .http_get(&format!("/ui/api/series?domain=llm&range=60&{token}"))
        .await;
    assert_eq!(status, 200, "{body}");
    let series: serde_json::Value = serde_json::from_str(&body).unwrap();
    let sum = |kind: &str| -> u64 {
        let counts = series["rules"]["llm.user"][kind].as_array();
        let counts = counts.unwrap_or_else(|| panic!("{kind} in {series}"));
        counts.iter().map(|n| n.as_u64().unwrap()).sum()
    };
    assert_eq!((sum("allowed"), sum("denied"), sum("reported")), (1, 1, 2), "{series}");
    let (status, body) = server.http_get(&format!("/ui/api/overview?domain=llm&{token}")).await;
    assert_eq!(status, 200, "{body}");
    let overview: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        overview["last_minute"]["llm.user"],
        serde_json::json!({"allowed": 1, "denied": 1, "reported": 2}),
        "{overview}"
    );
    server.shutdown().await;
}
