//! Redis behind Sentinel through fred (`redis-sentinel://`): the primary is found through the Sentinel, with the
//! data servers' password and none for the Sentinel itself, and when the primary is killed calls recover on the
//! promoted replica without restarting sluice.

use std::time::{Duration, Instant};

use sluice::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use crate::harness::{RedisSentinel, SENTINEL_REDIS_PASSWORD, live_server};

const CONFIG: &str = "
domain: ha
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
";

fn request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "ha".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// How many rate-limit counters the server on `port` holds: the keys of the `user` limit's windows, compact (the
/// dashboard's per-second outcome counts, written in the background, have a `|` in their keys and are not counted).
fn counters(port: u16) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "--no-auth-warning",
            "-a",
            SENTINEL_REDIS_PASSWORD,
        ])
        .args(["--raw", "KEYS", "sluice:{*"])
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty() && !l.contains('|'))
        .count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_follow_a_sentinel_failover() {
    let mut ha = RedisSentinel::start();
    let (old_primary, replica) = (ha.primary.port, ha.replica.port);
    let server = live_server(&ha.url(), CONFIG).await;
    let mut client = RateLimitServiceClient::connect(server.grpc_url()).await.unwrap();
    let before = client
        .should_rate_limit(request("a"))
        .await
        .expect("served by the primary");
    assert_eq!(before.get_ref().overall_code, Code::Ok as i32);
    assert_eq!(
        counters(old_primary),
        1,
        "the counter is on the primary the Sentinel named"
    );

    let killed_at = Instant::now();
    ha.primary.kill();
    let (mut first_error, mut recovered) = (None::<Instant>, None::<Instant>);
    let (mut calls, mut errors, mut successes_after) = (0u32, 0u32, 0u32);
    let deadline = killed_at + Duration::from_secs(20);
    while Instant::now() < deadline && successes_after < 20 {
        calls += 1;
        let mut call = tonic::Request::new(request(&format!("v{}", calls % 8)));
        call.set_timeout(Duration::from_secs(3));
        match client.should_rate_limit(call).await {
            Ok(response) => {
                assert_eq!(response.get_ref().overall_code, Code::Ok as i32);
                if first_error.is_some() {
                    recovered.get_or_insert_with(Instant::now);
                    successes_after += 1;
                }
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                errors += 1;
                first_error.get_or_insert_with(Instant::now);
                successes_after = 0;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first_error = first_error.expect("calls fail while there is no primary");
    let recovered = recovered.expect("calls succeed again after the failover, without a restart");
    eprintln!(
        "sentinel failover: first error {:?} after the kill; recovered {:?} after the first error ({:?} after the \
         kill); {errors} of {calls} calls failed",
        first_error - killed_at,
        recovered - first_error,
        recovered - killed_at,
    );
    assert_eq!(successes_after, 20, "steady again after recovery");
    assert_eq!(ha.master_port(), Some(replica), "the Sentinel promoted the replica");
    assert!(
        counters(replica) > 1,
        "new counters are written to the promoted replica"
    );
    server.shutdown().await;
}
