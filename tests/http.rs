//! The HTTP face over TCP: the reference's `POST /json`, `GET /rlconfig`, and the rate limit response headers on
//! both the JSON and gRPC answers.

use sluice::headers::HeaderMode;
use sluice::limiter::LimiterSettings;
use sluice::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use crate::harness::{TestServer, limiter, limiter_with, memory};

const CONFIG: &str = "
domain: edge
descriptors:
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 2, name: login}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100}
";

const LOGIN: &str = r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "path", "value": "/login"}]}]}"#;

#[tokio::test]
async fn json_answers_200_then_429_and_400_for_bad_input() {
    let (l, _) = limiter(CONFIG, memory());
    let server = TestServer::start(l).await;
    let (code, body) = server.http_post("/json", LOGIN).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["code"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(v["statuses"][0]["currentLimit"]["name"], "login");
    assert_eq!(v["statuses"][0]["limitRemaining"], 1);
    assert_eq!(v["statuses"][0]["durationUntilReset"], "50s");
    server.http_post("/json", LOGIN).await;
    let (code, body) = server.http_post("/json", LOGIN).await;
    assert_eq!(code, 429, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["overallCode"], "OVER_LIMIT");

    for (bad, want) in [
        ("{not json", "invalid JSON"),
        (
            r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "a", "val": "b"}]}]}"#,
            "unknown field 'val'",
        ),
        (
            r#"{"domain": "", "descriptors": [{"entries": [{"key": "a"}]}]}"#,
            "domain is empty",
        ),
        (r#"{"domain": "edge", "descriptors": []}"#, "no descriptors"),
    ] {
        let (code, body) = server.http_post("/json", bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains(want), "{bad}: {body}");
    }
    let (code, body) = server
        .http_post(
            "/json",
            r#"{"domain": "other", "descriptors": [{"entries": [{"key": "a"}]}]}"#,
        )
        .await;
    assert_eq!(
        (code, body.trim()),
        (200, r#"{"overallCode":"OK","statuses":[{"code":"OK"}]}"#)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn rlconfig_lists_the_rules_in_force() {
    let (l, _) = limiter(CONFIG, memory());
    let server = TestServer::start(l).await;
    let (code, body) = server.http_get("/rlconfig").await;
    assert_eq!(code, 200);
    assert!(
        body.contains("edge.path_/login: 2 per minute (fixed_window), name login"),
        "{body}"
    );
    assert!(body.contains("edge.user: 100 per hour (fixed_window)"), "{body}");
    server.shutdown().await;
}

#[tokio::test]
async fn response_headers_describe_the_most_constrained_status() {
    let settings = LimiterSettings {
        response_headers: HeaderMode::Both,
        ..LimiterSettings::default()
    };
    let (l, _) = limiter_with(CONFIG, memory(), settings);
    let server = TestServer::start(l).await;
    let mut client = RateLimitServiceClient::connect(server.grpc_url()).await.unwrap();
    let descriptor = |k: &str, v: &str| RateLimitDescriptor {
        entries: vec![Entry {
            key: k.into(),
            value: v.into(),
        }],
        ..Default::default()
    };
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor("user", "u"), descriptor("path", "/login")],
        hits_addend: 0,
    };
    let headers = |r: &sluice::proto::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect::<Vec<_>>()
    };
    let first = client.should_rate_limit(request.clone()).await.unwrap().into_inner();
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(
        headers(&first),
        [
            pair("RateLimit-Limit", "2"),
            pair("RateLimit-Remaining", "1"),
            pair("RateLimit-Reset", "50"),
            pair("RateLimit-Policy", "\"login\";q=2;w=60"),
            pair("RateLimit", "\"login\";r=1;t=50"),
        ]
    );
    client.should_rate_limit(request.clone()).await.unwrap();
    let over = client.should_rate_limit(request).await.unwrap().into_inner();
    assert!(
        headers(&over).contains(&pair("Retry-After", "50")),
        "{:?}",
        headers(&over)
    );
    let (code, body) = server.http_post("/json", LOGIN).await;
    assert_eq!(code, 429);
    assert!(body.contains(r#"{"key":"Retry-After","value":"50"}"#), "{body}");
    server.shutdown().await;
}
