//! Lists and top offenders as users meet them: run-time entries through sluice.v1 on one instance, in force on
//! another sharing its Redis within a second and named in Envoy's response headers; top offenders summed across both,
//! over gRPC and `GET /offenders`, and the dashboard's outcomes summed across both; a new instance answering with
//! the entries already stored; the list calls held to `--max-request-bytes`; a list fetched from a URL this
//! test serves, refreshed, kept when the URL fails, and a server that cannot fetch its list at start refusing to
//! start, naming the URL.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::limiter::LimiterSettings;
use sluice::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::proto::sluice::v1::get_top_offenders_request::Span;
use sluice::proto::sluice::v1::rate_limiter_client::RateLimiterClient;
use sluice::proto::sluice::v1::{GetListEntriesRequest, GetTopOffendersRequest, ListEntriesRequest};
use tonic::Code as GrpcCode;

use crate::harness::{ADMIN_TOKEN, RedisServer, TestServer, live_server_with};

const CONFIG: &str = "
domain: edge
lists:
  - {name: blocked, key: remote_address}
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
";

fn request(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

fn admin<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    request.metadata_mut().insert("authorization", bearer.parse().unwrap());
    request
}

/// The store's timeout where no test is about timeouts: it only bounds a hang. A busy host can take more than a quiet
/// one's half second to read 20 000 run-time entries, and a read that times out at start is one the server goes on
/// without.
const STORE_TIMEOUT: Duration = Duration::from_secs(10);

/// Polls `done` every 10 ms for at most `within`; how long it took.
async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_time_entries_and_offenders_are_shared_by_two_instances() {
    let redis = RedisServer::start();
    let settings = LimiterSettings::default;
    let a = live_server_with(&redis.url(), CONFIG, STORE_TIMEOUT, settings()).await;
    let b = live_server_with(&redis.url(), CONFIG, STORE_TIMEOUT, settings()).await;
    let mut admin_a = RateLimiterClient::connect(a.grpc_url()).await.unwrap();
    let mut admin_b = RateLimiterClient::connect(b.grpc_url()).await.unwrap();
    let mut envoy_b = RateLimitServiceClient::connect(b.grpc_url()).await.unwrap();
    let add = |values: &[&str], ttl: Option<u64>| ListEntriesRequest {
        domain: "edge".into(),
        list: "blocked".into(),
        values: values.iter().map(|v| v.to_string()).collect(),
        ttl: ttl.map(|s| prost_types::Duration {
            seconds: s as i64,
            nanos: 0,
        }),
    };

    // Refused without the token, with a malformed value, for an unknown list, with a TTL over a year.
    let denied = admin_a
        .add_list_entries(add(&["203.0.113.0/24"], None))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), GrpcCode::Unauthenticated, "{denied:?}");
    let bad = admin_a
        .add_list_entries(admin(add(&["ok", "10.0.0.0/40"], None)))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), GrpcCode::InvalidArgument);
    assert!(
        bad.message()
            .starts_with("values[1]: '10.0.0.0/40' is not a CIDR range"),
        "{}",
        bad.message()
    );
    let mut unknown = add(&["x"], None);
    unknown.list = "nope".into();
    let missing = admin_a.add_list_entries(admin(unknown)).await.unwrap_err();
    assert_eq!(
        (missing.code(), missing.message()),
        (GrpcCode::NotFound, "list: domain 'edge' has no list 'nope'")
    );
    let long = admin_a
        .add_list_entries(admin(add(&["x"], Some(400 * 86_400))))
        .await
        .unwrap_err();
    assert!(
        long.message()
            .starts_with("ttl is 34560000s, over the longest a list entry may stay"),
        "{long:?}"
    );

    // Added on A for a minute: denied on B within a second, Envoy told which list.
    let before = envoy_b
        .should_rate_limit(request("remote_address", "203.0.113.7"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(before.overall_code, Code::Ok as i32);
    let changed = admin_a
        .add_list_entries(admin(add(&["203.0.113.0/24"], Some(60))))
        .await
        .unwrap();
    assert_eq!(changed.into_inner().changed, 1);
    let took = until("B denies the listed address", Duration::from_secs(2), async || {
        let r = envoy_b
            .should_rate_limit(request("remote_address", "203.0.113.7"))
            .await
            .unwrap()
            .into_inner();
        r.overall_code == Code::OverLimit as i32 && header(&r, "x-sluice-list-deny") == Some("blocked")
    })
    .await;
    assert!(took < Duration::from_secs(1), "{took:?}");
    let entries = admin_b
        .get_list_entries(admin(GetListEntriesRequest {
            domain: "edge".into(),
            list: "blocked".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].value, "203.0.113.0/24");
    let left = entries[0].expires_in.unwrap().seconds;
    assert!((58..=60).contains(&left), "{left}");
    // Removed on B: A lets it through within a second.
    let mut envoy_a = RateLimitServiceClient::connect(a.grpc_url()).await.unwrap();
    admin_b
        .remove_list_entries(admin(add(&["203.0.113.0/24"], None)))
        .await
        .unwrap();
    let took = until("A lets the address through", Duration::from_secs(2), async || {
        let r = envoy_a
            .should_rate_limit(request("remote_address", "203.0.113.7"))
            .await
            .unwrap()
            .into_inner();
        r.overall_code == Code::Ok as i32
    })
    .await;
    assert!(took < Duration::from_secs(1), "{took:?}");

    // Offenders: alice sends 5 to each instance against an hourly limit of 3; bob 1.
    for _ in 0..5 {
        envoy_a.should_rate_limit(request("user", "alice")).await.unwrap();
        envoy_b.should_rate_limit(request("user", "alice")).await.unwrap();
    }
    envoy_a.should_rate_limit(request("user", "bob")).await.unwrap();
    let top = |span: Span, limit: u32| GetTopOffendersRequest {
        domain: "edge".into(),
        span: span as i32,
        limit,
    };
    until(
        "both instances' offenders are stored",
        2 * sluice::limiter::FLUSH_EVERY + Duration::from_secs(2),
        async || {
            let rules = admin_a
                .get_top_offenders(admin(top(Span::Minute, 10)))
                .await
                .unwrap()
                .into_inner()
                .rules;
            rules
                .iter()
                .any(|r| r.rule == "edge.user" && r.denied.first().is_some_and(|d| d.count == 7))
        },
    )
    .await;
    let rules = admin_a
        .get_top_offenders(admin(top(Span::Hour, 10)))
        .await
        .unwrap()
        .into_inner()
        .rules;
    let user = rules.iter().find(|r| r.rule == "edge.user").expect("the user rule");
    let hits: Vec<(&str, u64)> = user.hits.iter().map(|o| (o.value.as_str(), o.count)).collect();
    assert_eq!(hits, [("user=alice", 10), ("user=bob", 1)]);
    // The dashboard on either instance shows both instances' outcomes: 3 of alice's 10 and bob's 1 allowed.
    let (_, overview) = get_with_token(&b, "/ui/api/overview?domain=edge").await;
    let overview: serde_json::Value = serde_json::from_str(&overview).unwrap();
    assert_eq!(
        overview["last_minute"]["edge.user"],
        serde_json::json!({"allowed": 4, "denied": 7}),
        "{overview}"
    );
    let (status, series) = get_with_token(&a, "/ui/api/series?domain=edge&range=60").await;
    assert_eq!(status, 200, "{series}");
    let series: serde_json::Value = serde_json::from_str(&series).unwrap();
    assert_eq!(series["instances"]["count"], 2, "both instances' heartbeats: {series}");
    let (status, body) = b.http_get("/offenders?domain=edge&span=hour&limit=1").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = get_with_token(&b, "/offenders?domain=edge&span=hour&limit=1").await;
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["span"], "hour");
    let user = json["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "edge.user")
        .cloned();
    let user = user.unwrap_or_else(|| panic!("edge.user in {json}"));
    assert_eq!(user["denied"], serde_json::json!([{"value": "user=alice", "count": 7}]));
    for (path, want) in [
        ("/offenders?domain=nope", 404),
        ("/offenders?domain=edge&span=day", 400),
        ("/offenders", 400),
        ("/offenders?domain=edge&limit=0", 400),
    ] {
        assert_eq!(get_with_token(&b, path).await.0, want, "{path}");
    }
    let err = admin_a
        .get_top_offenders(admin(top(Span::Minute, 5000)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument);
    a.shutdown().await;
    b.shutdown().await;
}

/// `GET path` on the admin port with the admin token.
async fn get_with_token(server: &TestServer, path: &str) -> (u16, String) {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nConnection: close\r\n\r\n"
    );
    crate::harness::http_exchange(tokio::net::TcpStream::connect(server.http).await.unwrap(), &request).await
}

/// What the test's list server answers: a status and a body, changed by the test.
type Served = Arc<Mutex<(u16, String)>>;

/// Serves `served` at `/list.txt` on a free port; the URL.
async fn list_server(served: Served) -> String {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/list.txt", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/list.txt",
        get(move || {
            let served = served.clone();
            async move {
                let (status, body) = served.lock().unwrap().clone();
                (axum::http::StatusCode::from_u16(status).unwrap(), body)
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn url_config(url: &str) -> String {
    format!(
        "domain: edge\nlists:\n  - {{name: feed, key: remote_address, url: '{url}', refresh_seconds: 1}}\ndescriptors:\n  - key: remote_address\n    rate_limit: {{unit: hour, requests_per_unit: 1000}}\n"
    )
}

/// `sluice serve` on `config`, its log piped.
fn serve(dir: &std::path::Path, config: &str) -> std::process::Child {
    std::fs::write(dir.join("edge.yaml"), config).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .env_clear()
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_from_a_url_is_fetched_refreshed_and_kept_when_the_url_fails() {
    let served: Served = Arc::new(Mutex::new((200, "# feed\n198.51.100.0/24\n".to_string())));
    let url = list_server(served.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = (crate::harness::free_port(), crate::harness::free_port());
    std::fs::write(dir.path().join("edge.yaml"), url_config(&url)).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(dir.path())
        .args([
            "--grpc-addr",
            &format!("127.0.0.1:{grpc}"),
            "--http-addr",
            &format!("127.0.0.1:{http}"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let result = async {
        let mut envoy = None;
        until("sluice serves", Duration::from_secs(10), async || {
            envoy = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
                .await
                .ok();
            envoy.is_some()
        })
        .await;
        let mut envoy = envoy.unwrap();
        let mut code = async |ip: &str| {
            envoy
                .should_rate_limit(request("remote_address", ip))
                .await
                .unwrap()
                .into_inner()
                .overall_code
        };
        // Fetched before the server served: the first call is already denied.
        assert_eq!(code("198.51.100.9").await, Code::OverLimit as i32);
        assert_eq!(code("192.0.2.1").await, Code::Ok as i32);
        // The list changes at its URL: in force after the next refresh.
        *served.lock().unwrap() = (200, "192.0.2.0/24\n".into());
        until("the new list is fetched", Duration::from_secs(5), async || {
            code("192.0.2.1").await == Code::OverLimit as i32
        })
        .await;
        assert_eq!(code("198.51.100.9").await, Code::Ok as i32, "the old values are gone");
        // The URL fails, then serves a malformed line: the last good list stays, /readyz (still ready) names it.
        let readyz = async || admin_get(http, "/readyz").await;
        for (status, body, why) in [
            (503, "down".to_string(), "answered 503"),
            (
                200,
                "192.0.2.0/24\n10.0.0.0/99\n".to_string(),
                "line 2: '10.0.0.0/99' is not a CIDR range",
            ),
        ] {
            *served.lock().unwrap() = (status, body);
            until("the failure is reported", Duration::from_secs(5), async || {
                readyz().await.1.contains(why)
            })
            .await;
            let (code_now, body) = readyz().await;
            assert_eq!(code_now, 200, "{body}");
            assert!(
                body.starts_with("ready\nlist edge/feed: '") && body.contains(&url),
                "{body}"
            );
            assert_eq!(
                code("192.0.2.1").await,
                Code::OverLimit as i32,
                "the last good list stays"
            );
        }
        let metrics = admin_get(http, "/metrics").await.1;
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("sluice_list_fetches_total{") && l.contains("result=\"failure\"")),
            "{metrics}"
        );
        assert!(
            metrics.contains("sluice_list_entries{domain=\"edge\",list=\"feed\",source=\"fetched\"} 1"),
            "{metrics}"
        );
        // Mended: the failure is cleared.
        *served.lock().unwrap() = (200, "192.0.2.0/24\n203.0.113.0/24\n".into());
        until("the mended list is fetched", Duration::from_secs(5), async || {
            readyz().await.1 == "ready\n"
        })
        .await;
        assert_eq!(code("203.0.113.1").await, Code::OverLimit as i32);
    }
    .await;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    result
}

/// `GET path` on the admin port `port`: status and body.
async fn admin_get(port: u16, path: &str) -> (u16, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    crate::harness::http_exchange(
        tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
        &request,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_cannot_be_fetched_at_start_stops_the_server_naming_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let port = crate::harness::free_port();
    let url = format!("http://127.0.0.1:{port}/list.txt");
    let served: Served = Arc::new(Mutex::new((404, String::new())));
    let found = list_server(served).await;
    for (url, why) in [
        (url.as_str(), "cannot fetch"),
        (found.as_str(), "answered 404 Not Found"),
    ] {
        let child = serve(dir.path(), &url_config(url));
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("error: list 'feed' of domain 'edge': ") && err.contains(url) && err.contains(why),
            "{err}"
        );
    }
}

#[tokio::test]
async fn the_admin_list_calls_are_held_to_the_request_cap_and_the_values_a_call_may_carry_fit_in_it() {
    let (limiter, _) = crate::harness::limiter(CONFIG, sluice::store::memory::MemoryStore::new());
    let cap = limiter.settings().caps.max_request_bytes;
    assert_eq!(cap, 65_536);
    let server = TestServer::start(limiter).await;
    let mut client = RateLimiterClient::connect(server.grpc_url()).await.unwrap();
    let entries = |values: Vec<String>| ListEntriesRequest {
        domain: "edge".into(),
        list: "blocked".into(),
        values,
        ttl: None,
    };
    let over_cap = |status: tonic::Status| {
        assert_eq!(status.code(), GrpcCode::InvalidArgument, "{status:?}");
        assert!(status.message().contains("--max-request-bytes"), "{}", status.message());
    };

    // 1 000 values of 80 bytes: within the count, over the byte cap, on every list call.
    let long: Vec<String> = (0..1_000).map(|i| format!("{i:080}")).collect();
    over_cap(client.add_list_entries(admin(entries(long.clone()))).await.unwrap_err());
    over_cap(client.remove_list_entries(admin(entries(long))).await.unwrap_err());
    let huge = "x".repeat(cap + 1);
    let get = GetListEntriesRequest {
        domain: huge.clone(),
        list: "blocked".into(),
    };
    over_cap(client.get_list_entries(admin(get)).await.unwrap_err());
    let top = GetTopOffendersRequest {
        domain: huge,
        span: Span::Minute as i32,
        limit: 1,
    };
    over_cap(client.get_top_offenders(admin(top)).await.unwrap_err());

    // The most values a call may carry, each the longest address or range, fit in the default cap.
    let longest: Vec<String> = (0..1_000)
        .map(|i| {
            format!(
                "ffff:ffff:ffff:ffff:ffff:ffff:255.255.{}.{}/128",
                100 + i / 100,
                100 + i % 100
            )
        })
        .collect();
    assert!(longest.iter().all(|v| v.len() == 49));
    let added = client.add_list_entries(admin(entries(longest))).await.unwrap();
    assert_eq!(added.into_inner().changed, 1_000);
    // One more is refused by its count, naming it.
    let many: Vec<String> = (0..1_001).map(|i| format!("10.0.{}.{}", i / 256, i % 256)).collect();
    let refused = client.add_list_entries(admin(entries(many))).await.unwrap_err();
    assert_eq!(
        (refused.code(), refused.message()),
        (GrpcCode::InvalidArgument, "values: 1001 given, at most 1000 per call")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_instance_answers_with_the_run_time_entries_already_stored() {
    let redis = RedisServer::start();
    let settings = LimiterSettings::default;
    let a = live_server_with(&redis.url(), CONFIG, STORE_TIMEOUT, settings()).await;
    let mut admin_a = RateLimiterClient::connect(a.grpc_url()).await.unwrap();
    // Enough entries that reading them takes a while, and the one that matters.
    for chunk in 0..20 {
        let values: Vec<String> = (0..1_000)
            .map(|i| format!("10.{chunk}.{}.{}", i / 256, i % 256))
            .collect();
        let request = ListEntriesRequest {
            domain: "edge".into(),
            list: "blocked".into(),
            values,
            ttl: None,
        };
        admin_a.add_list_entries(admin(request)).await.unwrap();
    }
    let deny = ListEntriesRequest {
        domain: "edge".into(),
        list: "blocked".into(),
        values: vec!["203.0.113.0/24".into()],
        ttl: None,
    };
    admin_a.add_list_entries(admin(deny)).await.unwrap();

    // A new instance: its very first answer, and its first ready, already hold the entry.
    let b = live_server_with(&redis.url(), CONFIG, STORE_TIMEOUT, settings()).await;
    let mut envoy_b = RateLimitServiceClient::connect(b.grpc_url()).await.unwrap();
    let first = envoy_b
        .should_rate_limit(request("remote_address", "203.0.113.7"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.overall_code, Code::OverLimit as i32, "{first:?}");
    assert_eq!(header(&first, "x-sluice-list-deny"), Some("blocked"));
    let c = live_server_with(&redis.url(), CONFIG, STORE_TIMEOUT, settings()).await;
    let (status, body) = c.http_get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    let mut envoy_c = RateLimitServiceClient::connect(c.grpc_url()).await.unwrap();
    let after_ready = envoy_c
        .should_rate_limit(request("remote_address", "203.0.113.7"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after_ready.overall_code, Code::OverLimit as i32, "{after_ready:?}");
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

/// A Redis that cannot be read at start does not keep a server with lists from serving: it answers by its failure
/// policy (the run-time entries are read when Redis can be), as a server without lists does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_lists_serves_when_redis_cannot_be_read_at_start() {
    let nowhere = format!("redis://127.0.0.1:{}", crate::harness::free_port());
    let server = live_server_with(&nowhere, CONFIG, Duration::from_millis(100), LimiterSettings::default()).await;
    let mut envoy = RateLimitServiceClient::connect(server.grpc_url()).await.unwrap();
    // The default policy answers UNAVAILABLE for a store that times out: the server's answer, not a transport error.
    let answer = envoy
        .should_rate_limit(request("remote_address", "203.0.113.7"))
        .await
        .unwrap_err();
    assert_eq!(answer.code(), GrpcCode::Unavailable, "{answer:?}");
    assert!(answer.message().starts_with("rate limit store"), "{answer:?}");
    server.shutdown().await;
}
