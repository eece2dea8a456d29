//! Chaos, bounded to about a minute: two `sluice serve` processes share one Redis while clients on both drive exact
//! limits, and the harness injects the faults production meets, one after the other: sluice started before its
//! Redis, Redis frozen (SIGSTOP) and thawed, its scripts flushed, the configuration reloaded (SIGHUP); then two more
//! processes started before a Redis Cluster exists, and one of its primaries killed. After every fault, decisions
//! must reach the store again within a stated bound on both processes, and at the end it holds that: no process
//! panicked, no call went past its bound, no exact limit admitted more than its size with the store deciding, and
//! nothing latched (both ready, both deciding).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use crate::harness::{RedisCluster, RedisServer, free_port, signal};

/// The size of every exact limit.
const LIMIT: u32 = 10;
/// sluice's store timeout and breaker cooldown in this test.
const STORE_TIMEOUT: Duration = Duration::from_millis(100);
const COOLDOWN: Duration = Duration::from_millis(500);
/// No call may take longer (three store timeouts, the worst case of a hung Redis, plus a loaded machine's slack).
const CALL_BOUND: Duration = Duration::from_secs(2);
/// Decisions reach the store again within this of a fault's end (the cooldown plus one second).
const RECOVERY: Duration = Duration::from_millis(1_500);

fn config(extra_rule: bool) -> String {
    let mut yaml = format!(
        "domain: chaos\nfailure_policy: fail_open\ndescriptors:\n\
         \x20 - key: log\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, algorithm: sliding_log}}\n\
         \x20 - key: fixed\n    rate_limit: {{unit: day, requests_per_unit: {LIMIT}}}\n"
    );
    if extra_rule {
        yaml.push_str("  - key: added\n    rate_limit: {unit: minute, requests_per_unit: 5}\n");
    }
    yaml
}

/// A `sluice serve` process, killed when dropped; its stderr goes to a file read for panics.
struct Sluice {
    child: Child,
    grpc: u16,
    http: u16,
    log: PathBuf,
}

impl Sluice {
    /// Starts a process and waits until it serves HTTP (ready or not). A process that exits first (another test
    /// took one of its free ports in the meantime) is started again on other ports.
    async fn start(config: &Path, redis_url: &str, dir: &Path) -> Sluice {
        for _ in 0..3 {
            let mut sluice = Sluice::spawn(config, redis_url, dir);
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if http_status(sluice.http, "/healthz").await == Some(200) {
                    return sluice;
                }
                if matches!(sluice.child.try_wait(), Ok(Some(_))) {
                    eprintln!("sluice on :{} exited before serving:\n{}", sluice.grpc, sluice.log());
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sluice on :{} never served:\n{}",
                    sluice.grpc,
                    sluice.log()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        panic!("sluice did not start in three tries");
    }

    fn spawn(config: &Path, redis_url: &str, dir: &Path) -> Sluice {
        let (grpc, http) = (free_port(), free_port());
        let log = dir.join(format!("sluice-{grpc}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .args(["--redis-url", redis_url])
            .args(["--redis-timeout-ms", &STORE_TIMEOUT.as_millis().to_string()])
            .args(["--breaker-failures", "3"])
            .args(["--breaker-cooldown-ms", &COOLDOWN.as_millis().to_string()])
            .args(["--worker-threads", "1"])
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("the sluice binary runs");
        Sluice { child, grpc, http, log }
    }

    async fn ready(&self) -> bool {
        http_status(self.http, "/readyz").await == Some(200)
    }

    /// Whether `/readyz` says ready within `limit`, printing why not if it never does.
    async fn ready_within(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.ready().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ready = self.ready().await;
        if !ready {
            eprintln!(
                "sluice on :{} not ready: {}\n{}",
                self.grpc,
                http_body(self.http, "/readyz").await,
                self.log()
            );
        }
        ready
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn http_body(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return String::new();
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let _ = stream.write_all(request.as_bytes()).await;
    let mut response = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut response)).await;
    response
}

async fn http_status(port: u16, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut response)).await;
    response.split_whitespace().nth(1)?.parse().ok()
}

/// What the clients saw: store-decided admissions per descriptor, the slowest call, and calls by outcome.
#[derive(Default)]
struct Tally {
    admitted: HashMap<(String, String), u32>,
    slowest: Duration,
    calls: u32,
    decided: u32,
    errors: Vec<String>,
}

/// Clients on every process: each call asks for `log=<v>` and `fixed=<v>`, where `<v>` is the round the harness is
/// in, so every round starts fresh exact limits while faults come and go.
struct Clients {
    round: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
    /// Per process (by gRPC port): when it last decided with the store.
    last_decided: Arc<Mutex<HashMap<u16, Instant>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Clients {
    fn start(ports: &[u16], prefix: &str) -> Clients {
        let clients = Clients {
            round: Arc::new(AtomicU32::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            tally: Arc::default(),
            last_decided: Arc::default(),
            tasks: Vec::new(),
        };
        let mut tasks = Vec::new();
        for &port in ports {
            for _ in 0..2 {
                let (round, stop, tally, last) = (
                    clients.round.clone(),
                    clients.stop.clone(),
                    clients.tally.clone(),
                    clients.last_decided.clone(),
                );
                let prefix = prefix.to_string();
                tasks.push(tokio::spawn(async move {
                    let mut client = None;
                    while !stop.load(Ordering::Relaxed) {
                        if client.is_none() {
                            client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
                                .await
                                .ok();
                            if client.is_none() {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                continue;
                            }
                        }
                        let Some(c) = client.as_mut() else { continue };
                        let value = format!("{prefix}{}", round.load(Ordering::Relaxed));
                        let descriptor = |key: &str| RateLimitDescriptor {
                            entries: vec![Entry {
                                key: key.into(),
                                value: value.clone(),
                            }],
                            ..RateLimitDescriptor::default()
                        };
                        let mut call = tonic::Request::new(RateLimitRequest {
                            domain: "chaos".into(),
                            descriptors: vec![descriptor("log"), descriptor("fixed")],
                            hits_addend: 0,
                        });
                        call.set_timeout(Duration::from_secs(5));
                        let started = Instant::now();
                        let answer = c.should_rate_limit(call).await;
                        let took = started.elapsed();
                        {
                            let mut t = tally.lock().unwrap();
                            t.calls += 1;
                            t.slowest = t.slowest.max(took);
                            match answer {
                                Ok(r) => {
                                    let r = r.into_inner();
                                    let mut by_store = false;
                                    for (key, s) in ["log", "fixed"].iter().zip(&r.statuses) {
                                        if s.current_limit.is_some() {
                                            by_store = true;
                                            if s.code == Code::Ok as i32 {
                                                *t.admitted.entry((key.to_string(), value.clone())).or_default() += 1;
                                            }
                                        }
                                    }
                                    if by_store {
                                        t.decided += 1;
                                        last.lock().unwrap().insert(port, Instant::now());
                                    }
                                }
                                Err(status) => t.errors.push(format!("port {port}: {status:?}")),
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }));
            }
        }
        Clients { tasks, ..clients }
    }

    fn next_round(&self) {
        self.round.fetch_add(1, Ordering::Relaxed);
    }

    /// How long until every process in `ports` has decided with the store after `since`, polling up to `limit`.
    async fn recovered(&self, ports: &[u16], since: Instant, limit: Duration) -> Option<Duration> {
        while since.elapsed() < limit {
            let last = self.last_decided.lock().unwrap().clone();
            if ports.iter().all(|p| last.get(p).is_some_and(|t| *t > since)) {
                return Some(since.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    async fn stop(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("a client task ends cleanly");
        }
        Arc::try_unwrap(self.tally)
            .ok()
            .expect("no client holds the tally")
            .into_inner()
            .unwrap()
    }
}

/// Asserts what must hold whatever happened, and prints the run.
fn check(name: &str, tally: &Tally, processes: &[&Sluice], allowed_over: impl Fn(&str) -> bool) {
    eprintln!(
        "chaos {name}: {} calls, {} decided with the store, slowest {:?}, {} gRPC errors",
        tally.calls,
        tally.decided,
        tally.slowest,
        tally.errors.len()
    );
    assert!(
        tally.errors.is_empty(),
        "{name}: calls failed: {:?}",
        &tally.errors[..tally.errors.len().min(5)]
    );
    assert!(tally.slowest < CALL_BOUND, "{name}: a call took {:?}", tally.slowest);
    for ((key, value), admitted) in &tally.admitted {
        assert!(
            *admitted <= LIMIT || allowed_over(value),
            "{name}: {key}={value} admitted {admitted} with the store deciding, over its limit of {LIMIT}"
        );
    }
    assert!(
        tally.admitted.values().any(|&n| n == LIMIT),
        "{name}: some limit filled up, so the bound was tested: {:?}",
        tally.admitted
    );
    for p in processes {
        let log = p.log();
        assert!(
            !log.contains("panicked"),
            "{name}: sluice on :{} panicked:\n{log}",
            p.grpc
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_in_a_row_never_latch_nor_overshoot() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chaos.yaml");
    std::fs::write(&file, config(false)).unwrap();
    let mut timings: Vec<(&str, Duration)> = Vec::new();

    // Standalone: sluice first, Redis a moment later.
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let (a, b) = (
        Sluice::start(&file, &url, dir.path()).await,
        Sluice::start(&file, &url, dir.path()).await,
    );
    let ports = [a.grpc, b.grpc];
    let clients = Clients::start(&ports, "s");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!a.ready().await && !b.ready().await, "not ready before Redis exists");
    let redis = RedisServer::start_on(port);
    let up = Instant::now();
    let took = clients.recovered(&ports, up, Duration::from_secs(5)).await;
    timings.push((
        "redis started after sluice",
        took.expect("deciding within 5 s of Redis starting"),
    ));

    for round in 0..2 {
        clients.next_round();
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.pause();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert!(!a.ready().await, "never ready while Redis is frozen");
        redis.resume();
        let thawed = Instant::now();
        let took = clients.recovered(&ports, thawed, RECOVERY).await;
        timings.push((
            "redis frozen 1.5 s, thawed",
            took.unwrap_or_else(|| panic!("round {round}: no recovery")),
        ));
    }

    clients.next_round();
    redis.flush_scripts();
    let flushed = Instant::now();
    let took = clients.recovered(&ports, flushed, RECOVERY).await;
    timings.push((
        "scripts flushed",
        took.expect("deciding again after the scripts are flushed"),
    ));

    clients.next_round();
    std::fs::write(&file, config(true)).unwrap();
    signal(a.child.id(), "HUP");
    signal(b.child.id(), "HUP");
    let reloaded = Instant::now();
    let took = clients.recovered(&ports, reloaded, RECOVERY).await;
    timings.push(("configuration reloaded", took.expect("deciding after the reload")));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tally = clients.stop().await;
    check("standalone", &tally, &[&a, &b], |_| false);
    assert!(
        a.ready_within(RECOVERY).await && b.ready_within(RECOVERY).await,
        "both ready at the end"
    );
    drop((a, b, redis));

    // Cluster: sluice before the cluster is created, then a primary killed.
    std::fs::write(&file, config(false)).unwrap();
    let mut cluster = RedisCluster::unformed();
    let (c, d) = (
        Sluice::start(&file, &cluster.url(), dir.path()).await,
        Sluice::start(&file, &cluster.url(), dir.path()).await,
    );
    let ports = [c.grpc, d.grpc];
    let clients = Clients::start(&ports, "c");
    cluster.create();
    let formed = Instant::now();
    let took = clients.recovered(&ports, formed, Duration::from_secs(5)).await;
    timings.push((
        "cluster created after sluice",
        took.expect("deciding within 5 s of the cluster settling"),
    ));
    let victim = cluster.primaries()[0];
    let before_kill = clients.round.load(Ordering::Relaxed);
    clients.next_round();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.node(victim).kill();
    let killed = Instant::now();
    assert!(cluster.wait_settled(Duration::from_secs(20)), "a replica takes over");
    let settled = Instant::now();
    clients.next_round();
    let took = clients.recovered(&ports, settled, RECOVERY).await;
    timings.push((
        "cluster primary killed, replica promoted",
        took.expect("deciding after the promotion"),
    ));
    eprintln!("chaos: promotion took {:?} after the kill", settled - killed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tally = clients.stop().await;
    // Replication is asynchronous: the killed primary's last writes may be lost, so the rounds that ran across the
    // kill may overshoot on its slots (Redis's own guarantee), and only there.
    let across_kill = [format!("c{before_kill}"), format!("c{}", before_kill + 1)];
    check("cluster", &tally, &[&c, &d], |v| across_kill.iter().any(|k| k == v));
    assert!(
        c.ready_within(RECOVERY).await && d.ready_within(RECOVERY).await,
        "both ready at the end"
    );

    for (fault, took) in &timings {
        eprintln!("chaos: {fault}: deciding again after {took:?}");
    }
}
