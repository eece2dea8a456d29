//! Several regions, one limit, measured from outside: three regions, each its own redis-server and one or two sluice
//! servers answering gRPC, linked through forwarders the test slows and cuts. Load on every region; the totals
//! admitted stay within the bound the README states; a cut link heals without losing or double counting; a region
//! that cannot be reached, at start or later, never slows a local decision.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::*;
use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::regions::{RegionSettings, Replicator};
use sluice::rules::Algorithm;
use sluice::store::CounterKey;
use tonic::transport::Channel;

/// 2 000 requests an hour per API key, worldwide; the hour never ends during a test (the clocks stand at T0).
const YAML: &str = "domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 2000, global: true}
";
const LIMIT: usize = 2_000;
const HOUR_US: u64 = 3_600_000_000;
const INTERVAL: Duration = Duration::from_millis(100);
const NAMES: [&str; 3] = ["eu", "us", "ap"];

/// One sluice server of a region, shipping to the others through the links.
struct Instance {
    server: TestServer,
    region: usize,
    shipping: tokio::task::JoinHandle<()>,
}

/// Three regions: their Redis servers, the links between them (`links[from][to]`, to `to`'s Redis) and instances.
struct World {
    redis: Vec<RedisServer>,
    links: Vec<Vec<Option<Link>>>,
    instances: Vec<Instance>,
}

impl World {
    /// `per_region[r]` instances in region r; `extra` adds, to every instance of region 0, a link to a region of
    /// that name whose Redis is at that URL.
    async fn start(per_region: [usize; 3], extra: Option<(&str, String)>) -> World {
        let redis: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let mut links = Vec::new();
        for from in 0..3 {
            let mut row = Vec::new();
            for (to, server) in redis.iter().enumerate() {
                row.push(if from == to {
                    None
                } else {
                    Some(Link::start(server.port).await)
                });
            }
            links.push(row);
        }
        let mut instances = Vec::new();
        for (region, &n) in per_region.iter().enumerate() {
            for _ in 0..n {
                let mut others = Vec::new();
                for (to, link) in links[region].iter().enumerate() {
                    if let Some(link) = link {
                        others.push((
                            NAMES[to].to_string(),
                            redis_store_with(&link.url(), Duration::from_secs(1)).await,
                        ));
                    }
                }
                if let (0, Some((name, url))) = (region, &extra) {
                    others.push((name.to_string(), redis_store_with(url, Duration::from_secs(1)).await));
                }
                let (limiter, _clock) = limiter(YAML, redis_store(&redis[region].url()).await);
                let replicator = Replicator::new(
                    RegionSettings {
                        name: NAMES[region].to_string(),
                        interval: INTERVAL,
                        backlog: 100_000,
                        timeout: Duration::from_secs(1),
                    },
                    others,
                );
                limiter.join_regions(replicator.shared());
                let shipping = tokio::spawn({
                    let (replicator, limiter) = (Arc::new(replicator), limiter.clone());
                    async move {
                        replicator
                            .run(limiter.store(), limiter.clock(), limiter.metrics())
                            .await
                    }
                });
                instances.push(Instance {
                    server: TestServer::start(limiter).await,
                    region,
                    shipping,
                });
            }
        }
        World {
            redis,
            links,
            instances,
        }
    }

    /// Stops shipping and the servers, draining them.
    async fn stop(self) {
        for instance in self.instances {
            instance.shipping.abort();
            instance.server.shutdown().await;
        }
    }

    fn link(&self, from: usize, to: usize) -> &Link {
        self.links[from][to].as_ref().expect("a link between two regions")
    }

    /// Region `r`'s own count of the key's window, and what it holds of each other region's.
    fn view(&self, r: usize, value: &str) -> (u64, Vec<(String, u64)>) {
        let (key, start) = (counter_key(value), T0 - T0 % HOUR_US);
        let own = self.redis[r]
            .cli(&["--raw", "GET", key.window(start).as_str()])
            .trim()
            .parse()
            .unwrap_or(0);
        let fields = self.redis[r].cli(&["--raw", "HGETALL", key.regions(start).as_str()]);
        let fields: Vec<&str> = fields.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let others = fields
            .chunks(2)
            .map(|pair| (pair[0].to_string(), pair[1].parse().unwrap_or(0)))
            .collect();
        (own, others)
    }

    /// Waits (at most 10 s) until every region's view of `value`'s window is `want`'s: each region's own count, and
    /// exactly the others' own counts.
    async fn settled(&self, value: &str) -> Vec<(u64, Vec<(String, u64)>)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let views: Vec<_> = (0..3).map(|r| self.view(r, value)).collect();
            let agreed = (0..3).all(|r| {
                (0..3).filter(|&o| o != r).all(|o| {
                    let held = views[r].1.iter().find(|(n, _)| n == NAMES[o]).map_or(0, |f| f.1);
                    held == views[o].0
                })
            });
            if agreed || Instant::now() > deadline {
                return views;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The key of the API key's counter.
fn counter_key(value: &str) -> CounterKey {
    CounterKey::builder("sluice:", "edge")
        .entry("api_key", value)
        .finish()
        .tier(Algorithm::FixedWindow, HOUR_US)
}

fn request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".into(),
                value: value.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

async fn client(server: &TestServer) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("client connects")
}

/// `n` calls for `value`, one every `every`: when each admitted call was answered, and each call's latency.
async fn load(server: &TestServer, value: &str, n: usize, every: Duration) -> (Vec<Instant>, Vec<Duration>) {
    let mut client = client(server).await;
    let mut tick = tokio::time::interval(every);
    let (mut admitted, mut latencies) = (Vec::new(), Vec::new());
    for _ in 0..n {
        tick.tick().await;
        let started = Instant::now();
        let answer = client
            .should_rate_limit(request(value))
            .await
            .expect("decided")
            .into_inner();
        latencies.push(started.elapsed());
        if answer.overall_code == Code::Ok as i32 {
            admitted.push(Instant::now());
        }
    }
    (admitted, latencies)
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

/// Load on every region (two instances in the first) through links of `delay` each way: the regions together admit
/// at least the limit, and at most the limit plus what the other regions admitted within the staleness
/// (interval + delay + a read, a write and scheduling) before the last admission. Then every region's view agrees.
async fn within_the_bound(delay: Duration, value: &str) {
    let world = World::start([2, 1, 1], None).await;
    for from in 0..3 {
        for to in (0..3).filter(|&to| to != from) {
            world.link(from, to).delay(delay);
        }
    }
    // 4 instances x 1 000 calls, one every 4 ms each: 1 000 calls a second offered, 4 000 against a limit of 2 000.
    let loads = world.instances.iter().map(|i| async move {
        let (admitted, _) = load(&i.server, value, 1_000, Duration::from_millis(4)).await;
        admitted.into_iter().map(|t| (i.region, t)).collect::<Vec<_>>()
    });
    let admitted: Vec<(usize, Instant)> = futures::future::join_all(loads).await.into_iter().flatten().collect();
    let total = admitted.len();
    let &(last_region, last) = admitted.iter().max_by_key(|(_, t)| *t).expect("some calls admitted");
    let staleness = INTERVAL + delay + Duration::from_millis(100);
    let late = admitted
        .iter()
        .filter(|(r, t)| *r != last_region && *t + staleness > last)
        .count();
    let per_region: Vec<usize> = (0..3)
        .map(|r| admitted.iter().filter(|(x, _)| *x == r).count())
        .collect();
    eprintln!(
        "delay {delay:?}: admitted {total} ({per_region:?}) against {LIMIT}; the other regions admitted {late} within \
         {staleness:?} of the last admission (in {})",
        NAMES[last_region]
    );
    assert!(total >= LIMIT, "the regions together admit the limit: {total}");
    assert!(
        total <= LIMIT + late,
        "at most the limit plus what the others admitted within {staleness:?} of the last admission: {total} > \
         {LIMIT} + {late}"
    );
    let views = world.settled(value).await;
    for (r, (own, others)) in views.iter().enumerate() {
        let seen = own + others.iter().map(|o| o.1).sum::<u64>();
        assert_eq!(
            seen as usize, total,
            "{} sees every region's count once: {views:?}",
            NAMES[r]
        );
        assert_eq!(
            *own as usize, per_region[r],
            "{}'s own count is what it admitted",
            NAMES[r]
        );
    }
    world.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_on_every_region_stays_within_the_bound() {
    within_the_bound(Duration::ZERO, "fast-links").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_on_every_region_stays_within_the_bound_over_slow_links() {
    within_the_bound(Duration::from_millis(50), "slow-links").await;
}

/// A region that cannot be reached at start, and a link cut under load then healed: local decisions go on at the
/// same speed, readiness names the regions not linked, and once healed the region that was cut off holds exactly
/// what was counted, no less and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_link_heals_without_losing_or_double_counting_and_never_slows_a_decision() {
    // "sa": a port nothing listens on.
    let closed = free_port();
    let world = World::start([1, 1, 1], Some(("sa", format!("redis://127.0.0.1:{closed}")))).await;
    let eu = &world.instances[0].server;
    let linked = |body: &str, region: &str| body.contains(&format!("region {region}: linked"));

    // Linked to us and ap within a few intervals; sa never.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut body = String::new();
    while Instant::now() < deadline {
        body = eu.http_get("/readyz").await.1;
        if linked(&body, "us") && linked(&body, "ap") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(linked(&body, "us") && linked(&body, "ap"), "{body}");
    assert!(body.contains("region sa: not linked"), "{body}");
    let (code, _) = eu.http_get("/readyz").await;
    assert_eq!(code, 200, "a region not linked does not make this one unready");

    let (_, before) = load(eu, "cut", 300, Duration::from_millis(2)).await;
    world.link(0, 1).cut();
    let (_, during) = load(eu, "cut", 300, Duration::from_millis(2)).await;
    // A shipment to us waits out its timeout (1 s) before the link is known to be down.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut body = String::new();
    while !body.contains("region us: not linked") && Instant::now() < deadline {
        body = eu.http_get("/readyz").await.1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(body.contains("region us: not linked"), "{body}");
    let (before, during) = (median(before), median(during));
    eprintln!("median decision: {before:?} linked, {during:?} with us cut off and sa unreachable");
    assert!(
        during <= before * 3 + Duration::from_millis(5),
        "a cut link does not slow local decisions: {during:?} against {before:?}"
    );

    // ap has every count; us has only what was shipped before the cut.
    let deadline = Instant::now() + Duration::from_secs(5);
    while world.view(2, "cut").1 != vec![("eu".to_string(), 600)] && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(world.view(0, "cut").0, 600);
    assert_eq!(world.view(2, "cut").1, vec![("eu".to_string(), 600)]);
    let held = world.view(1, "cut").1.iter().map(|f| f.1).sum::<u64>();
    assert!(held < 600, "us was cut off before the last counts: it holds {held}");

    world.link(0, 1).heal();
    let views = world.settled("cut").await;
    assert_eq!(
        views[1].1,
        vec![("eu".to_string(), 600)],
        "healed: us holds exactly eu's count"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !linked(&eu.http_get("/readyz").await.1, "us") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(linked(&eu.http_get("/readyz").await.1, "us"));
    world.stop().await;
}
