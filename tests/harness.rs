//! Real components for the tests: `redis-server` processes on free ports, sluice servers on `127.0.0.1:0`, and a
//! TCP proxy that can hold Redis's replies back.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::ManualClock;
use sluice::config;
use sluice::limiter::{Limiter, LimiterSettings};
use sluice::metrics::Metrics;
use sluice::rules::{Algorithm, RuleSet};
use sluice::store::memory::MemoryStore;
use sluice::store::redis::{RedisSettings, RedisStore};
use sluice::store::{CounterKey, Store, TierSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Instantiates each named `async fn name(store: impl Store)` of the calling module twice: once over the
/// in-memory store, once over a fresh `redis-server`.
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory_store {
            $(#[tokio::test] async fn $name() { super::$name(crate::harness::memory()).await; })*
        }
        mod redis_store {
            $(#[tokio::test] async fn $name() {
                let redis = crate::harness::RedisServer::start();
                super::$name(crate::harness::redis_store(&redis.url()).await).await;
            })*
        }
    };
}

/// [`both_stores!`], and once more over a fresh `redis-server` reached as the README's least-privilege ACL user, so
/// that the documented ACL cannot miss a command the store or its scripts use.
macro_rules! every_store {
    ($($name:ident),* $(,)?) => {
        both_stores!($($name),*);
        mod redis_acl_user {
            $(#[tokio::test] async fn $name() {
                let redis = crate::harness::RedisServer::start();
                let url = redis.acl_user_url();
                super::$name(crate::harness::redis_store(&url).await).await;
            })*
        }
    };
}

/// The password the tests give the README's ACL user.
pub const ACL_PASSWORD: &str = "s3cret-pw";

/// The rules of the README's least-privilege ACL user, as `ACL SETUSER` (or `redis-server --user`) takes them,
/// parsed from the README's `ACL SETUSER sluice ...` line with [`ACL_PASSWORD`] for its `>PASSWORD` and, as the
/// README says to do for another `--key-prefix`, `key_prefix` for the `sluice:` of `~sluice:*`.
pub fn readme_acl_user(key_prefix: &str) -> Vec<String> {
    let readme = include_str!("../README.md");
    let line = readme
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER sluice "))
        .expect("the README has an `ACL SETUSER sluice ...` line");
    std::iter::once("sluice")
        .chain(line.split_whitespace())
        .map(|rule| match rule {
            ">PASSWORD" => format!(">{ACL_PASSWORD}"),
            "~sluice:*" => format!("~{key_prefix}*"),
            other => other.to_string(),
        })
        .collect()
}

/// A time far from any window edge of every unit: 2024-01-01T00:00:00Z plus ten seconds.
pub const T0: u64 = 1_704_067_210_000_000;

/// The admin token test servers accept for `Reset`.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on 127.0.0.1")
}

/// A `redis-server` process on a free port, killed when dropped.
pub struct RedisServer {
    child: Child,
    pub port: u16,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_on(free_port())
    }

    /// Starts on a given port, e.g. to bring a stopped server back where clients expect it.
    pub fn start_on(port: u16) -> RedisServer {
        let child = Command::new("redis-server")
            .args(base_args(port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the README's test command installs it)");
        let server = RedisServer { child, port };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["PING"]).trim() == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Creates the README's ACL user (see [`readme_acl_user`]) for the tests' key prefix, `test:`, and returns a URL
    /// that connects as it.
    pub fn acl_user_url(&self) -> String {
        let mut args = vec!["ACL", "SETUSER"];
        let rules = readme_acl_user("test:");
        args.extend(rules.iter().map(String::as_str));
        assert_eq!(self.cli(&args).trim(), "OK", "ACL SETUSER {rules:?}");
        format!("redis://sluice:{ACL_PASSWORD}@127.0.0.1:{}", self.port)
    }

    /// Runs one command with `redis-cli` and returns its raw output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--no-raw"])
            .args(args)
            .output()
            .expect("redis-cli must be installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every key with its value and remaining TTL in milliseconds, sorted: a snapshot to compare.
    pub fn snapshot(&self) -> Vec<(String, String, i64)> {
        let keys = self.cli(&["--raw", "KEYS", "*"]);
        let mut out: Vec<_> = keys
            .lines()
            .filter(|k| !k.is_empty())
            .map(|k| {
                let value = self.cli(&["DUMP", k]).trim().to_string();
                let ttl: i64 = self.cli(&["--raw", "PTTL", k]).trim().parse().unwrap_or(-3);
                (k.to_string(), value, ttl)
            })
            .collect();
        out.sort();
        out
    }

    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers, as with a hung host.
    pub fn pause(&self) {
        signal(self.child.id(), "STOP");
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        signal(self.child.id(), "CONT");
    }
}

/// Sends a signal to a process by its PID with `kill(1)`.
pub fn signal(pid: u32, name: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(sent, "kill -{name} {pid}");
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One limit of the descriptor `k=<name>` in domain `d`, as the store receives it.
pub fn tier(name: &str, algorithm: Algorithm, limit: u64, window_us: u64, burst: u64) -> TierSpec {
    TierSpec {
        key: CounterKey::builder("test:", "d")
            .entry("k", name)
            .finish()
            .tier(algorithm, window_us),
        algorithm,
        limit,
        window_us,
        burst,
    }
}

/// Compiles a one-file configuration.
pub fn rules(yaml: &str, metrics: &Metrics) -> RuleSet {
    let file = config::parse(Path::new("test.yaml"), yaml).expect("test config parses");
    RuleSet::compile(&[file], metrics).expect("test config compiles")
}

/// A limiter over `store` with a manual clock at [`T0`].
pub fn limiter<S: Store>(yaml: &str, store: S) -> (Arc<Limiter<S>>, Arc<ManualClock>) {
    limiter_with(yaml, store, LimiterSettings::default())
}

pub fn limiter_with<S: Store>(yaml: &str, store: S, settings: LimiterSettings) -> (Arc<Limiter<S>>, Arc<ManualClock>) {
    let metrics = Metrics::new(0.8);
    let clock = Arc::new(ManualClock::new(T0));
    let limiter = Limiter::new(rules(yaml, &metrics), store, clock.clone(), metrics, settings);
    (Arc::new(limiter), clock)
}

/// Every outcome of a store call, which must have decided every hit.
pub fn decided(answers: sluice::store::Answers) -> Vec<sluice::store::Outcome> {
    answers
        .into_iter()
        .map(|a| a.expect("the store decides every hit"))
        .collect()
}

pub fn memory() -> MemoryStore {
    MemoryStore::new()
}

pub async fn redis_store(url: &str) -> RedisStore {
    redis_store_with(url, Duration::from_millis(500)).await
}

pub async fn redis_store_with(url: &str, timeout: Duration) -> RedisStore {
    RedisStore::connect(&RedisSettings {
        url: url.to_string(),
        timeout,
        pool_size: 1,
        server_time: false,
        tls: Default::default(),
    })
    .await
    .expect("redis store connects")
}

/// A sluice server deciding by Redis's own clock over `url`, as in production: for failover tests, where time is
/// real and cannot be injected.
pub async fn live_server(url: &str, yaml: &str) -> TestServer {
    live_server_with(url, yaml, Duration::from_millis(200), LimiterSettings::default()).await
}

/// [`live_server`] with a store timeout and limiter settings of the test's choosing.
pub async fn live_server_with(url: &str, yaml: &str, timeout: Duration, settings: LimiterSettings) -> TestServer {
    let store = RedisStore::connect(&RedisSettings {
        url: url.to_string(),
        timeout,
        pool_size: 1,
        server_time: true,
        tls: Default::default(),
    })
    .await
    .expect("store connects");
    let metrics = Metrics::new(0.8);
    let limiter = Limiter::new(
        rules(yaml, &metrics),
        store,
        Arc::new(sluice::clock::SystemClock),
        metrics,
        settings,
    );
    TestServer::start(Arc::new(limiter)).await
}

/// A sluice server on ephemeral ports, stopped when dropped.
pub struct TestServer {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The JSON API's listener (`POST /json`), with the gRPC listener's TLS when that has one.
    pub json: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start<S: Store>(limiter: Arc<Limiter<S>>) -> TestServer {
        TestServer::start_with(limiter, None).await
    }

    /// Starts with TLS on the gRPC listener when `tls` is given.
    pub async fn start_with<S: Store>(
        limiter: Arc<Limiter<S>>,
        tls: Option<sluice::tls::ServerTlsFiles>,
    ) -> TestServer {
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let json = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (grpc_addr, http_addr, json_addr) = (
            grpc.local_addr().unwrap(),
            http.local_addr().unwrap(),
            json.local_addr().unwrap(),
        );
        let http = sluice::server::HttpListeners {
            admin: http,
            json: Some(json),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            let options = sluice::server::ServeOptions {
                grace_period: Duration::from_secs(2),
                admin_token: Some(ADMIN_TOKEN.to_string()),
                tls,
            };
            sluice::server::serve(limiter, grpc, http, shutdown, &options)
                .await
                .expect("server runs");
        });
        TestServer {
            grpc: grpc_addr,
            http: http_addr,
            json: json_addr,
            stop: Some(stop),
            task,
        }
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// Stops accepting, drains, and waits for the server to return.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.expect("server task ends cleanly");
    }

    /// `GET path` on the HTTP port: status code and body.
    pub async fn http_get(&self, path: &str) -> (u16, String) {
        self.http_request(&format!(
            "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
        ))
        .await
    }

    /// `POST path` with a JSON body on the HTTP admin port: status code and body.
    pub async fn http_post(&self, path: &str, body: &str) -> (u16, String) {
        self.post_to(self.http, path, body).await
    }

    /// `POST /json` with `body` on the JSON API's port (plain text): status code and body.
    pub async fn json_post(&self, body: &str) -> (u16, String) {
        self.post_to(self.json, "/json", body).await
    }

    async fn post_to(&self, addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
        http_exchange(TcpStream::connect(addr).await.unwrap(), &post_request(path, body)).await
    }

    async fn http_request(&self, request: &str) -> (u16, String) {
        http_exchange(TcpStream::connect(self.http).await.unwrap(), request).await
    }
}

/// An HTTP/1.1 `POST path` of a JSON body, closing the connection after the answer.
pub fn post_request(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Writes one HTTP/1.1 request on `stream` and reads the answer to its end: status code and body.
pub async fn http_exchange<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: T,
    request: &str,
) -> (u16, String) {
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A TCP proxy in front of Redis that can hold back every reply while forwarding requests, to prove that a client
/// sends a batch of commands without waiting for answers (one round trip).
pub struct ReplyGate {
    pub port: u16,
    open: tokio::sync::watch::Sender<bool>,
}

impl ReplyGate {
    pub async fn start(redis_port: u16) -> ReplyGate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, watcher) = tokio::sync::watch::channel(true);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut gate = watcher.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    };
                    let down = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if gate.wait_for(|open| *open).await.is_err() || cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::join!(up, down);
                });
            }
        });
        ReplyGate { port, open }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn hold(&self) {
        let _ = self.open.send(false);
    }

    pub fn release(&self) {
        let _ = self.open.send(true);
    }
}

/// Runs `redis-cli` against a plain port and returns its raw (`--raw`) output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--raw"])
        .args(args)
        .output()
        .expect("redis-cli must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One field of `INFO` output (`INFO <section>`), e.g. `role` or `master_link_status`.
pub fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let prefix = format!("{field}:");
    redis_cli(port, &["INFO", section])
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(|v| v.trim().to_string()))
}

/// How many EVALSHA calls a server has run.
pub fn evalsha_count(port: u16) -> u64 {
    redis_cli(port, &["INFO", "commandstats"])
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split(['=', ',']).nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Polls `check` every 50 ms until it holds or `limit` passes; says whether it held.
pub fn poll_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `redis-server` (or Sentinel) started with any arguments on `port`, ready once the port accepts connections,
/// killed by its PID when dropped.
pub struct RedisProcess {
    child: Option<Child>,
    pub port: u16,
    log: Option<std::path::PathBuf>,
}

impl RedisProcess {
    /// Starts `redis-server args...`; `log` is where the server writes (passed as `--logfile` by the caller, read
    /// back when the server does not come up).
    pub fn spawn(port: u16, args: &[String], log: Option<std::path::PathBuf>) -> RedisProcess {
        let child = Command::new("redis-server")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let mut process = RedisProcess {
            child: Some(child),
            port,
            log,
        };
        let up = poll_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() || process.exited()
        });
        if !up || process.exited() {
            let log = process
                .log
                .as_ref()
                .and_then(|l| std::fs::read_to_string(l).ok())
                .unwrap_or_default();
            panic!("redis-server on port {port} did not start: {args:?}\n{log}");
        }
        process
    }

    fn exited(&mut self) -> bool {
        self.child.as_mut().is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// Kills the process (SIGKILL to its PID) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn alive(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every test server: loopback only, no persistence.
fn base_args(port: u16) -> Vec<String> {
    let port = port.to_string();
    [
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(String::from)
    .to_vec()
}

/// The arguments of a cluster or Sentinel node: the base ones, a log file in `dir`.
fn server_args(port: u16, dir: &Path) -> Vec<String> {
    let mut args = base_args(port);
    args.extend(
        [
            "--dir",
            &dir.display().to_string(),
            "--logfile",
            &format!("{port}.log"),
            // A replica's first sync starts at once instead of after the default 5 s wait for more replicas.
            "--repl-diskless-sync-delay",
            "0",
        ]
        .map(String::from),
    );
    args
}

/// A Redis Cluster of three primaries with one replica each, on free ports in a temporary directory, with a node
/// timeout of one second so that a replica takes over quickly. Every node is killed when dropped.
pub struct RedisCluster {
    pub nodes: Vec<RedisProcess>,
    dir: tempfile::TempDir,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let cluster = RedisCluster::unformed();
        cluster.create();
        cluster
    }

    /// Six cluster-enabled nodes that know nothing of each other yet: no slot is served until [`Self::create`].
    pub fn unformed() -> RedisCluster {
        let dir = tempfile::tempdir().expect("temporary directory");
        let nodes: Vec<RedisProcess> = (0..6)
            .map(|_| RedisCluster::spawn_node(dir.path(), free_port()))
            .collect();
        RedisCluster { nodes, dir }
    }

    /// Forms the cluster (`redis-cli --cluster create`, one replica per primary) and waits until it has settled.
    pub fn create(&self) {
        let nodes = &self.nodes;
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let mut create = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli must be installed");
        let created = poll_until(Duration::from_secs(30), || matches!(create.try_wait(), Ok(Some(_))));
        if !created {
            let _ = create.kill();
            let _ = create.wait();
            panic!("redis-cli --cluster create did not finish");
        }
        assert!(
            self.wait_settled(Duration::from_secs(20)),
            "the cluster did not reach cluster_state:ok with three synced replicas"
        );
    }

    fn spawn_node(dir: &Path, port: u16) -> RedisProcess {
        let mut args = server_args(port, dir);
        args.extend(
            [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                "--cluster-port",
                &free_port().to_string(),
                "--cluster-node-timeout",
                "1000",
                // While one primary's slots fail over, the other primaries keep answering for theirs.
                "--cluster-require-full-coverage",
                "no",
            ]
            .map(String::from),
        );
        RedisProcess::spawn(port, &args, Some(dir.join(format!("{port}.log"))))
    }

    /// Until every live node says `cluster_state:ok`, there are three primaries and every replica's link is up.
    pub fn wait_settled(&self, limit: Duration) -> bool {
        poll_until(limit, || {
            let live: Vec<u16> = self.nodes.iter().filter(|n| n.alive()).map(|n| n.port).collect();
            let ok = live.iter().all(|&p| {
                redis_cli(p, &["CLUSTER", "INFO"])
                    .lines()
                    .any(|l| l.trim() == "cluster_state:ok")
            });
            let replicas_synced = live.iter().all(|&p| {
                info_field(p, "replication", "role").as_deref() != Some("slave")
                    || info_field(p, "replication", "master_link_status").as_deref() == Some("up")
            });
            ok && replicas_synced && self.primaries().len() == 3
        })
    }

    /// `redis-cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let mut nodes = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port));
        let first = nodes.next().unwrap_or_default();
        let rest: Vec<String> = nodes.map(|n| format!("node={n}")).collect();
        format!("redis-cluster://{first}?{}", rest.join("&"))
    }

    /// The ports of the live nodes that are primaries owning slots.
    pub fn primaries(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.alive())
            .map(|n| n.port)
            .filter(|&p| info_field(p, "replication", "role").as_deref() == Some("master") && owns_slots(p))
            .collect()
    }

    /// The live primary holding a key that contains `needle`.
    pub fn owner_of(&self, needle: &str) -> Option<u16> {
        self.primaries()
            .into_iter()
            .find(|&p| keys(p).iter().any(|k| k.contains(needle)))
    }

    pub fn node(&mut self, port: u16) -> &mut RedisProcess {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster")
    }

    /// Starts a killed node again on its port, with its `nodes-P.conf` (so it rejoins as the same node).
    pub fn restart(&mut self, port: u16) {
        let node = RedisCluster::spawn_node(self.dir.path(), port);
        *self.node(port) = node;
    }
}

/// Whether a node's own line in `CLUSTER NODES` lists slots.
fn owns_slots(port: u16) -> bool {
    redis_cli(port, &["CLUSTER", "NODES"])
        .lines()
        .find(|l| l.contains("myself"))
        .is_some_and(|l| l.split(' ').count() > 8)
}

/// Every key of a server (`KEYS *`; test servers hold few).
pub fn keys(port: u16) -> Vec<String> {
    redis_cli(port, &["KEYS", "*"])
        .lines()
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
}

/// One primary with one replica and one Sentinel watching them as `mymaster` (quorum 1, down after 500 ms), on
/// free ports in a temporary directory. The data servers require the password [`SENTINEL_REDIS_PASSWORD`]; the
/// Sentinel has none. Every process is killed when dropped.
pub struct RedisSentinel {
    pub primary: RedisProcess,
    pub replica: RedisProcess,
    pub sentinel: RedisProcess,
    _dir: tempfile::TempDir,
}

pub const SENTINEL_REDIS_PASSWORD: &str = "sentinel-test-pw";

impl RedisSentinel {
    pub fn start() -> RedisSentinel {
        RedisSentinel::start_on(RedisSentinel::ports())
    }

    /// Free ports for the primary, the replica and the Sentinel.
    pub fn ports() -> (u16, u16, u16) {
        (free_port(), free_port(), free_port())
    }

    /// The URL a Sentinel on `port` will answer, before it runs.
    pub fn url_for(port: u16) -> String {
        format!("redis-sentinel://:{SENTINEL_REDIS_PASSWORD}@127.0.0.1:{port}?sentinelServiceName=mymaster")
    }

    /// Starts the primary, the replica and the Sentinel on the given ports.
    pub fn start_on((p, r, s): (u16, u16, u16)) -> RedisSentinel {
        let dir = tempfile::tempdir().expect("temporary directory");
        let auth = [
            "--requirepass",
            SENTINEL_REDIS_PASSWORD,
            "--masterauth",
            SENTINEL_REDIS_PASSWORD,
        ]
        .map(String::from);
        let mut args = server_args(p, dir.path());
        args.extend(auth.clone());
        let primary = RedisProcess::spawn(p, &args, Some(dir.path().join(format!("{p}.log"))));
        let mut args = server_args(r, dir.path());
        args.extend(auth);
        args.extend(["--replicaof", "127.0.0.1", &p.to_string()].map(String::from));
        let replica = RedisProcess::spawn(r, &args, Some(dir.path().join(format!("{r}.log"))));
        let authed = |port: u16, field: &str| {
            let out = Command::new("redis-cli")
                .args([
                    "-p",
                    &port.to_string(),
                    "--no-auth-warning",
                    "-a",
                    SENTINEL_REDIS_PASSWORD,
                ])
                .args(["--raw", "INFO", "replication"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_string()))
        };
        assert!(
            poll_until(Duration::from_secs(10), || authed(r, "master_link_status").as_deref()
                == Some("up")),
            "the replica did not sync"
        );
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {s}\nbind 127.0.0.1\ndir {dir}\nlogfile {s}.log\n\
                 sentinel monitor mymaster 127.0.0.1 {p} 1\n\
                 sentinel auth-pass mymaster {SENTINEL_REDIS_PASSWORD}\n\
                 sentinel down-after-milliseconds mymaster 500\n\
                 sentinel failover-timeout mymaster 2000\n\
                 sentinel parallel-syncs mymaster 1\n",
                dir = dir.path().display()
            ),
        )
        .expect("sentinel.conf written");
        let sentinel = RedisProcess::spawn(
            s,
            &[conf.display().to_string(), "--sentinel".to_string()],
            Some(dir.path().join(format!("{s}.log"))),
        );
        let cluster = RedisSentinel {
            primary,
            replica,
            sentinel,
            _dir: dir,
        };
        assert!(
            poll_until(Duration::from_secs(15), || {
                cluster.master_port() == Some(p)
                    && redis_cli(s, &["SENTINEL", "replicas", "mymaster"]).contains(&r.to_string())
            }),
            "the sentinel did not discover the primary and its replica"
        );
        cluster
    }

    /// The primary's port as the Sentinel reports it.
    pub fn master_port(&self) -> Option<u16> {
        redis_cli(self.sentinel.port, &["SENTINEL", "get-master-addr-by-name", "mymaster"])
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
    }

    /// `redis-sentinel://` with the data servers' password; the Sentinel itself is asked without one.
    pub fn url(&self) -> String {
        RedisSentinel::url_for(self.sentinel.port)
    }
}

/// A certificate and its private key, PEM-encoded.
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A throwaway certificate authority for TLS tests.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The CA certificate, PEM-encoded.
    pub cert: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("key pair");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-signed CA").pem();
        TestCa {
            issuer: rcgen::Issuer::new(params, key),
            cert,
        }
    }

    /// A certificate for `localhost` and 127.0.0.1, usable by a server and as a client.
    pub fn issue(&self, name: &str) -> Pem {
        let key = rcgen::KeyPair::generate().expect("key pair");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).expect("signed certificate").pem();
        Pem {
            cert,
            key: key.serialize_pem(),
        }
    }
}

/// Writes `contents` to `dir/name` and returns the path.
pub fn write_file(dir: &Path, name: &str, contents: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("test file written");
    path
}

/// A `redis-server` that speaks only TLS (`--port 0 --tls-port P`) with a certificate, its key and the CA that
/// signs client certificates; clients must present one when `auth_clients`. `extra` adds arguments (ACL users).
pub fn redis_tls_server(
    dir: &Path,
    cert: &Path,
    key: &Path,
    ca: &Path,
    auth_clients: bool,
    extra: &[&str],
) -> RedisProcess {
    let port = free_port();
    let path = |p: &Path| p.display().to_string();
    let mut args: Vec<String> = [
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        &path(cert),
        "--tls-key-file",
        &path(key),
        "--tls-ca-cert-file",
        &path(ca),
        "--tls-auth-clients",
        if auth_clients { "yes" } else { "no" },
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &path(dir),
        "--logfile",
        &format!("{port}.log"),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    RedisProcess::spawn(port, &args, Some(dir.join(format!("{port}.log"))))
}
