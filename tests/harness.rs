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
use sluice::rules::RuleSet;
use sluice::store::Store;
use sluice::store::memory::MemoryStore;
use sluice::store::redis::{RedisSettings, RedisStore};
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
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
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
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
    })
    .await
    .expect("redis store connects")
}

/// A sluice server on ephemeral ports, stopped when dropped.
pub struct TestServer {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start<S: Store>(limiter: Arc<Limiter<S>>) -> TestServer {
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (grpc_addr, http_addr) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            let options = sluice::server::ServeOptions {
                grace_period: Duration::from_secs(2),
                admin_token: Some(ADMIN_TOKEN.to_string()),
            };
            sluice::server::serve(limiter, grpc, http, shutdown, &options)
                .await
                .expect("server runs");
        });
        TestServer {
            grpc: grpc_addr,
            http: http_addr,
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

    /// `POST path` with a JSON body on the HTTP port: status code and body.
    pub async fn http_post(&self, path: &str, body: &str) -> (u16, String) {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.http_request(&(head + body)).await
    }

    async fn http_request(&self, request: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(self.http).await.unwrap();
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
