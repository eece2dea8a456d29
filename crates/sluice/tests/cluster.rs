//! Redis Cluster through fred, end to end over gRPC: three primaries with a replica each. Limits hold whatever slot a
//! descriptor lands on, hostile values route and never collide, descriptors on different primaries are decided
//! concurrently, scripts come back after `SCRIPT FLUSH` and a restart, and a killed primary's slots recover once its
//! replica is promoted, without restarting sluice.

use std::collections::BTreeMap;

use sluice::rules::Algorithm;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

use crate::harness::{
    COUNTERS_SCRIPT, RedisCluster, TestServer, counter_of, info_field, is_series, keys, limiter, live_server_with,
    poll_until, redis_cli, redis_store, redis_store_with, replica_of, script_calls, stored_counts,
};
use sluice::store::{CounterKey, KeyLayout};

const CONFIG: &str = "
domain: spread
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 3, name: per_minute}
      - {unit: hour, requests_per_unit: 10, name: per_hour}
  - key: bulk
    rate_limit: {unit: hour, requests_per_unit: 1000000}
";

fn request(key: &str, values: &[String]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "spread".into(),
        descriptors: values
            .iter()
            .map(|v| RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value: v.clone(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn call(client: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    client
        .should_rate_limit(r)
        .await
        .expect("the call succeeds")
        .into_inner()
}

fn remaining(response: &RateLimitResponse) -> Vec<u32> {
    response.statuses.iter().map(|s| s.limit_remaining).collect()
}

/// Every counter key of the cluster, by the primary that holds it: every key but the outcome counts the server adds
/// once a second, however long a busy host makes the test.
fn keys_by_primary(cluster: &RedisCluster) -> BTreeMap<u16, Vec<String>> {
    cluster
        .primaries()
        .into_iter()
        .map(|p| (p, keys(p).into_iter().filter(|k| !is_series(k)).collect()))
        .collect()
}

/// Checks that each `user` value's two counters (a minute's and an hour's fixed window) are two records of its
/// descriptor's packed state, one key on one primary, and that nothing else is there.
fn assert_descriptors_on_one_slot(by_primary: &BTreeMap<u16, Vec<String>>, values: &[String]) {
    for v in values {
        let id = CounterKey::builder("sluice:", "spread")
            .layout(KeyLayout::Compact)
            .entry("user", v)
            .finish();
        let state = id.tier(Algorithm::FixedWindow, 60_000_000).packed();
        assert_eq!(state, id.tier(Algorithm::FixedWindow, 3_600_000_000).packed());
        let held: Vec<u16> = by_primary
            .iter()
            .filter(|(_, keys)| keys.iter().any(|k| k == state.as_str()))
            .map(|(&port, _)| port)
            .collect();
        assert_eq!(held.len(), 1, "one packed state for {:?}", &v[..v.len().min(16)]);
        let records = stored_counts(&redis_cli(held[0], &["EVAL", COUNTERS_SCRIPT, "0", state.as_str()]));
        assert_eq!(
            records.len(),
            2,
            "both windows of {:?}: {records:?}",
            &v[..v.len().min(16)]
        );
    }
    assert_eq!(
        by_primary.values().map(Vec::len).sum::<usize>(),
        values.len(),
        "no other key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_on_every_primary() {
    let cluster = RedisCluster::start();
    let (l, _) = limiter(CONFIG, redis_store(&cluster.url()).await);
    let server = TestServer::start(l).await;
    let mut client = RateLimitServiceClient::connect(server.grpc_url()).await.unwrap();
    let values: Vec<String> = (0..24).map(|i| format!("u{i}")).collect();

    for round in 1..=3u32 {
        for chunk in values.chunks(8) {
            let response = call(&mut client, request("user", chunk)).await;
            assert_eq!(response.overall_code, Code::Ok as i32, "round {round}");
            assert_eq!(remaining(&response), vec![3 - round; chunk.len()], "round {round}");
        }
    }
    for chunk in values.chunks(8) {
        let response = call(&mut client, request("user", chunk)).await;
        assert_eq!(response.overall_code, Code::OverLimit as i32);
        assert!(response.statuses.iter().all(|s| s.code == Code::OverLimit as i32));
    }

    let by_primary = keys_by_primary(&cluster);
    assert_eq!(by_primary.len(), 3, "three primaries");
    for (port, keys) in &by_primary {
        assert!(!keys.is_empty(), "primary {port} holds counters");
    }
    assert_eq!(
        by_primary.values().map(Vec::len).sum::<usize>(),
        24,
        "one packed state per descriptor, for its two limits"
    );
    assert_descriptors_on_one_slot(&by_primary, &values);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_route_and_never_collide() {
    let cluster = RedisCluster::start();
    let (l, _) = limiter(CONFIG, redis_store(&cluster.url()).await);
    let server = TestServer::start(l).await;
    let mut client = RateLimitServiceClient::connect(server.grpc_url()).await.unwrap();
    let values: Vec<String> = [
        "", "{", "}", "{}", "}{", "{user}", "a{b}c", "\\xff", "\u{ff}", "|", "=", "1:u", "u=1:u",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["x".repeat(4096), "x".repeat(4095)])
    .collect();

    for round in 1..=2u32 {
        let response = call(&mut client, request("user", &values)).await;
        assert_eq!(response.overall_code, Code::Ok as i32);
        assert_eq!(remaining(&response), vec![3 - round; values.len()], "round {round}");
    }
    // Each value has a counter of its own: using up "{" leaves "}" and "{}" where they were.
    let brace = vec!["{".to_string()];
    assert_eq!(remaining(&call(&mut client, request("user", &brace)).await), [0]);
    let over = call(&mut client, request("user", &brace)).await;
    assert_eq!(over.statuses[0].code, Code::OverLimit as i32);
    let others = call(&mut client, request("user", &["}".to_string(), "{}".to_string()])).await;
    assert_eq!(others.overall_code, Code::Ok as i32);
    assert_eq!(remaining(&others), [0, 0]);

    let by_primary = keys_by_primary(&cluster);
    assert_eq!(
        by_primary.values().map(Vec::len).sum::<usize>(),
        values.len(),
        "one packed state per distinct value"
    );
    assert_descriptors_on_one_slot(&by_primary, &values);
    assert!(
        by_primary.values().filter(|k| !k.is_empty()).count() >= 2,
        "the values spread over primaries"
    );
    server.shutdown().await;
}

/// Finds, after a warm-up call, one `bulk` value whose counter lives on each primary.
async fn one_value_per_primary(
    cluster: &RedisCluster,
    client: &mut RateLimitServiceClient<Channel>,
) -> BTreeMap<u16, String> {
    let candidates: Vec<String> = (0..24).map(|i| format!("b{i}")).collect();
    call(client, request("bulk", &candidates)).await;
    let mut chosen = BTreeMap::new();
    for v in &candidates {
        if let Some(port) = cluster.owner_of(&counter_of(
            "sluice:",
            "spread",
            &[("bulk", v)],
            Algorithm::FixedWindow,
            3_600_000_000,
        )) {
            chosen.entry(port).or_insert_with(|| v.clone());
        }
    }
    assert_eq!(chosen.len(), 3, "24 values cover the three primaries");
    chosen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primaries_work_on_one_request_concurrently() {
    let cluster = RedisCluster::start();
    let (l, _) = limiter(CONFIG, redis_store_with(&cluster.url(), Duration::from_secs(10)).await);
    let server = TestServer::start(l).await;
    let mut client = RateLimitServiceClient::connect(server.grpc_url()).await.unwrap();
    let chosen = one_value_per_primary(&cluster, &mut client).await;
    let (&paused, _) = chosen.iter().next().unwrap();
    // The paused primary's descriptor comes first in the request.
    let mut ordered: Vec<(u16, String)> = chosen.iter().map(|(p, v)| (*p, v.clone())).collect();
    ordered.sort_by_key(|(p, _)| *p != paused);
    let values: Vec<String> = ordered.iter().map(|(_, v)| v.clone()).collect();
    let before: Vec<u64> = ordered.iter().map(|(p, _)| script_calls(*p)).collect();

    // The first primary stops running scripts; the other two must still get and run theirs while the call waits.
    assert_eq!(redis_cli(paused, &["CLIENT", "PAUSE", "5000", "WRITE"]).trim(), "OK");
    let started = Instant::now();
    let pending = tokio::spawn(async move { client.should_rate_limit(request("bulk", &values)).await });
    let others_ran = poll_until(Duration::from_secs(3), || {
        ordered[1..]
            .iter()
            .zip(&before[1..])
            .all(|((p, _), b)| script_calls(*p) > *b)
    });
    let still_waiting = !pending.is_finished();
    assert_eq!(redis_cli(paused, &["CLIENT", "UNPAUSE"]).trim(), "OK");
    assert!(
        others_ran,
        "the other primaries ran their descriptors while the first was paused"
    );
    assert!(still_waiting, "the call waits for the paused primary");
    let response = pending.await.unwrap().expect("the call succeeds").into_inner();
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!(script_calls(paused), before[0] + 1);
    eprintln!(
        "cluster concurrency: other primaries answered while one was paused; call took {:?}",
        started.elapsed()
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_come_back_after_flush_and_restart() {
    let mut cluster = RedisCluster::start();
    let (l, _) = limiter(CONFIG, redis_store(&cluster.url()).await);
    let server = TestServer::start(l).await;
    let mut client = RateLimitServiceClient::connect(server.grpc_url()).await.unwrap();
    let chosen = one_value_per_primary(&cluster, &mut client).await;
    let values: Vec<String> = chosen.values().cloned().collect();
    // The decision script runs as a function: its library, named `sluice_<its SHA1's first 16 hex digits>`.
    let loaded = |port: u16| redis_cli(port, &["FUNCTION", "LIST", "LIBRARYNAME", "sluice_*"]).contains("sluice_");
    assert!(chosen.keys().all(|&p| loaded(p)), "the library is on every primary");

    // Functions and scripts flushed on one primary: the very next call reloads the library there and succeeds.
    let (&flushed, _) = chosen.iter().next().unwrap();
    assert_eq!(redis_cli(flushed, &["FUNCTION", "FLUSH"]).trim(), "OK");
    assert_eq!(redis_cli(flushed, &["SCRIPT", "FLUSH"]).trim(), "OK");
    assert!(!loaded(flushed));
    let response = call(&mut client, request("bulk", &values)).await;
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert!(loaded(flushed), "reloaded on the primary that lost it");

    // A restarted primary (same node, empty memory): calls succeed again once it is back.
    let (&restarted, _) = chosen.iter().nth(1).unwrap();
    cluster.node(restarted).kill();
    cluster.restart(restarted);
    assert!(cluster.wait_settled(Duration::from_secs(20)), "the cluster settles");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut attempts = 0;
    loop {
        attempts += 1;
        match client.should_rate_limit(request("bulk", &values)).await {
            Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => break,
            other => assert!(Instant::now() < deadline, "no recovery after the restart: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let owner = cluster.primaries();
    assert!(
        owner.iter().all(|&p| loaded(p)),
        "the script is on every primary again (after {attempts} attempt(s))"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_recovers_after_promotion() {
    let mut cluster = RedisCluster::start();
    // A store timeout of a second, not the live server's 200 ms: calls on the killed primary still fail quickly,
    // and a call on a healthy one is not failed for being slow on a busy host, which this test would count as the
    // failover's doing.
    let server = live_server_with(&cluster.url(), CONFIG, Duration::from_secs(1), Default::default()).await;
    let mut client = RateLimitServiceClient::connect(server.grpc_url()).await.unwrap();
    let chosen = one_value_per_primary(&cluster, &mut client).await;
    let (&victim, victim_value) = chosen.iter().next().unwrap();
    let all: Vec<String> = chosen.values().cloned().collect();
    let healthy: Vec<String> = chosen.values().filter(|v| *v != victim_value).cloned().collect();
    let nodes: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let victim_replica = replica_of(victim, &nodes).expect("the victim has a replica");

    // Watch for the promotion from a plain thread, to split detection and election from the client's catch-up.
    let promoted_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (promoted_at, stop) = (promoted_at.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if info_field(victim_replica, "replication", "role").as_deref() == Some("master") {
                    *promoted_at.lock().unwrap() = Some(Instant::now());
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let killed_at = Instant::now();
    cluster.node(victim).kill();
    let (mut first_error, mut recovered) = (None::<Instant>, None::<Instant>);
    let (mut calls, mut errors, mut healthy_errors, mut successes_after) = (0u32, 0u32, 0u32, 0u32);
    let mut healthy_calls = 0u32;
    let deadline = killed_at + Duration::from_secs(20);
    while Instant::now() < deadline && successes_after < 20 {
        calls += 1;
        let mixed = calls % 2 == 0;
        healthy_calls += u32::from(!mixed);
        let r = request("bulk", if mixed { &all } else { &healthy });
        let mut call = tonic::Request::new(r);
        call.set_timeout(Duration::from_secs(3));
        match client.should_rate_limit(call).await {
            Ok(response) => {
                assert_eq!(response.get_ref().overall_code, Code::Ok as i32);
                if mixed && first_error.is_some() {
                    recovered.get_or_insert_with(Instant::now);
                    successes_after += 1;
                }
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                errors += 1;
                healthy_errors += u32::from(!mixed);
                if !mixed && healthy_errors == 1 {
                    eprintln!("first failed call on healthy primaries: {status:?}");
                }
                first_error.get_or_insert_with(Instant::now);
                successes_after = 0;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let promoted = *promoted_at.lock().unwrap();
    let first_error = first_error.expect("calls on the killed primary's slot fail until a replica takes over");
    let recovered = recovered.expect("calls succeed again after the promotion, without a restart");
    eprintln!(
        "cluster failover: first error {:?} after the kill; replica promoted {:?} after the kill; recovered {:?} \
         after the first error ({:?} after the promotion); {errors} of {calls} calls failed; calls touching only \
         healthy primaries: {healthy_errors} of {healthy_calls} failed",
        first_error - killed_at,
        promoted.map(|p| p - killed_at),
        recovered - first_error,
        promoted.map(|p| recovered.saturating_duration_since(p)),
    );
    assert!(promoted.is_some(), "the replica was promoted");
    assert_eq!(successes_after, 20, "steady again after recovery");
    assert!(
        healthy_errors * 100 <= healthy_calls,
        "calls whose keys live on the other primaries keep succeeding during the failover (at least 99%): \
         {healthy_errors} of {healthy_calls} failed"
    );
    server.shutdown().await;
}
