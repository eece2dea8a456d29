//! The HTTP faces over TCP: the reference's `POST /json` on its own listener under gRPC's request caps, `GET
//! /rlconfig` on the admin listener, and the rate limit response headers on both the JSON and gRPC answers.

use sluice::faces::headers::{HeaderMode, ResponseHeaders};
use sluice::limiter::{Caps, LimiterSettings};
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
    let (code, body) = server.json_post(LOGIN).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["code"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(v["statuses"][0]["currentLimit"]["name"], "login");
    assert_eq!(v["statuses"][0]["limitRemaining"], 1);
    assert_eq!(v["statuses"][0]["durationUntilReset"], "50s");
    server.json_post(LOGIN).await;
    let (code, body) = server.json_post(LOGIN).await;
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
        let (code, body) = server.json_post(bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains(want), "{bad}: {body}");
    }
    let (code, body) = server
        .json_post(r#"{"domain": "other", "descriptors": [{"entries": [{"key": "a"}]}]}"#)
        .await;
    assert_eq!(
        (code, body.trim()),
        (200, r#"{"overallCode":"OK","statuses":[{"code":"OK"}]}"#)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn rlconfig_lists_the_rules_in_force_each_limit_by_its_name() {
    let config = format!(
        "{CONFIG}  - key: api\n    rate_limits:\n      - {{unit: second, requests_per_unit: 10, name: multi_s}}\n      \
         - {{unit: minute, requests_per_unit: 100, name: multi_m}}\n"
    );
    let (l, _) = limiter(&config, memory());
    let server = TestServer::start(l).await;
    let (code, body) = server.http_get("/rlconfig").await;
    assert_eq!(code, 200);
    assert!(
        body.contains("edge.path_/login: 2 per minute (fixed_window), name login"),
        "{body}"
    );
    assert!(body.contains("edge.user: 100 per hour (fixed_window)"), "{body}");
    assert!(
        body.contains(
            "edge.api: 10 per second (fixed_window), name multi_s and 100 per minute (fixed_window), name multi_m"
        ),
        "{body}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn response_headers_describe_the_most_constrained_status() {
    let (l, _) = limiter(CONFIG, memory());
    let options = sluice::server::ServeOptions {
        response_headers: ResponseHeaders::standard(HeaderMode::Both),
        ..TestServer::options()
    };
    let server = TestServer::start_serving(l, options).await;
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
    let (code, body) = server.json_post(LOGIN).await;
    assert_eq!(code, 429);
    assert!(body.contains(r#"{"key":"Retry-After","value":"50"}"#), "{body}");
    server.shutdown().await;
}

/// Requests to `edge` answered OK, from `/metrics`.
async fn decided(server: &TestServer) -> u64 {
    let (code, metrics) = server.http_get("/metrics").await;
    assert_eq!(code, 200);
    metrics
        .lines()
        .find(|l| l.starts_with(r#"sluice_requests_total{domain="edge",rpc="should_rate_limit",result="ok"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count of edge's decisions in {metrics}"))
}

#[tokio::test]
async fn json_is_served_on_its_own_listener_only() {
    let (l, _) = limiter(CONFIG, memory());
    let server = TestServer::start(l).await;
    let (code, _) = server.http_post("/json", LOGIN).await;
    assert_eq!(code, 404, "the admin listener does not decide");
    assert_eq!(decided(&server).await, 0, "nothing was counted");
    let (code, _) = server.json_post(LOGIN).await;
    assert_eq!(code, 200, "the JSON listener does");
    assert_eq!(decided(&server).await, 1);
    server.shutdown().await;
}

#[tokio::test]
async fn json_bodies_are_held_to_the_request_byte_cap() {
    let settings = LimiterSettings {
        caps: Caps {
            max_request_bytes: 200,
            ..Caps::default()
        },
        ..LimiterSettings::default()
    };
    let (l, _) = limiter_with(CONFIG, memory(), settings);
    let server = TestServer::start(l).await;
    // A valid request, padded with whitespace past the cap: refused before it is parsed or counted.
    let padded = format!("{LOGIN}{}", " ".repeat(200 - LOGIN.len() + 1));
    assert_eq!(padded.len(), 201);
    let (code, body) = server.json_post(&padded).await;
    assert_eq!(code, 413, "{body}");
    assert!(
        body.contains("over the cap of 200") && body.contains("--max-request-bytes"),
        "{body}"
    );
    // Far past it: refused the same way, naming the cap.
    let huge = format!("{LOGIN}{}", " ".repeat(10_000));
    let (code, body) = server.json_post(&huge).await;
    assert_eq!(code, 413);
    assert!(body.contains("--max-request-bytes"), "{body}");
    // Exactly at the cap: decided, and the refused ones consumed nothing.
    let exact = format!("{LOGIN}{}", " ".repeat(200 - LOGIN.len()));
    let (code, body) = server.json_post(&exact).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["statuses"][0]["limitRemaining"], 1);
    let (_, metrics) = server.http_get("/metrics").await;
    let invalid = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_requests_total{") && l.contains("result=\"invalid_argument\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum::<u64>();
    assert_eq!(invalid, 2, "{metrics}");
    server.shutdown().await;
}

/// A request a list decided says which, in `response_headers_to_add` whatever the header mode, and counts in
/// `sluice_list_matches_total`.
#[tokio::test]
async fn a_listed_request_names_its_list_in_a_header_and_a_metric() {
    let config = "
domain: edge
lists:
  - {name: blocked, key: remote_address, values: ['10.0.0.0/8']}
  - {name: health, key: user_agent, action: allow, values: ['kube-probe/*']}
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user_agent
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let (l, _) = limiter(config, memory());
    let server = TestServer::start(l).await;
    let mut client = RateLimitServiceClient::connect(server.grpc_url()).await.unwrap();
    let request = |entries: &[(&str, &str)]| RateLimitRequest {
        domain: "edge".into(),
        descriptors: entries
            .iter()
            .map(|(k, v)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    };
    let denied = client
        .should_rate_limit(request(&[("remote_address", "10.20.30.40")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(denied.overall_code, 2, "OVER_LIMIT");
    let header: Vec<(String, String)> = denied
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(header, [("X-Sluice-List-Deny".to_string(), "blocked".to_string())]);
    for _ in 0..3 {
        let allowed = client
            .should_rate_limit(request(&[
                ("user_agent", "kube-probe/1.31"),
                ("remote_address", "192.0.2.1"),
            ]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            allowed.overall_code, 1,
            "OK past a limit of 1: the probe skips the limits"
        );
        assert_eq!(allowed.response_headers_to_add[0].key, "X-Sluice-List-Allow");
        assert_eq!(allowed.response_headers_to_add[0].value, "health");
    }
    let (_, metrics) = server.http_get("/metrics").await;
    for line in [
        r#"sluice_list_matches_total{domain="edge",list="blocked",action="deny"} 1"#,
        r#"sluice_list_matches_total{domain="edge",list="health",action="allow"} 3"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    server.shutdown().await;
}

/// Every `/ui` path answers 401 without the admin token, an unknown one included (a path is no way around the token);
/// with the token, an unknown path is 404.
#[tokio::test]
async fn every_dashboard_path_needs_the_token_before_it_is_found_or_not() {
    let (l, _) = limiter(CONFIG, memory());
    let server = TestServer::start(l).await;
    let token = crate::harness::ADMIN_TOKEN;
    for path in ["/ui", "/ui/api/domains", "/ui/assets/dashboard.js"] {
        assert_eq!(server.http_get(path).await.0, 401, "{path}");
        assert_eq!(server.http_get(&format!("{path}?token={token}")).await.0, 200, "{path}");
    }
    for path in [
        "/ui/",
        "/ui/nope",
        "/ui/api/nope",
        "/ui/api/series/extra",
        "/ui/assets/nope.js",
        "/ui/a/b/c",
    ] {
        let (status, body) = server.http_get(path).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(body.contains("needs the admin token"), "{path}: {body}");
        let (status, body) = server.http_get(&format!("{path}?token={token}")).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    server.shutdown().await;
}
