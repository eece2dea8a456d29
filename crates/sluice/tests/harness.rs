//! The service's test harness: the real components of `sluice-testkit`, limiters whose metrics render as
//! Prometheus text, and sluice servers on ephemeral ports.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice::clock::ManualClock;
use sluice::limiter::{Limiter, LimiterSettings};
use sluice::server::ServeOptions;
use sluice::store::Store;
use sluice::store::redis::{RedisSettings, RedisStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub use sluice_testkit::*;

/// The admin token test servers accept for `Reset`.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A limiter over `store` with a manual clock at [`T0`], its metrics rendered as Prometheus text.
pub fn limiter<S: Store>(yaml: &str, store: S) -> (Arc<Limiter<S>>, Arc<ManualClock>) {
    limiter_with(yaml, store, LimiterSettings::default())
}

pub fn limiter_with<S: Store>(yaml: &str, store: S, settings: LimiterSettings) -> (Arc<Limiter<S>>, Arc<ManualClock>) {
    limiter_over(yaml, store, settings, sluice::faces::prometheus::metrics(0.8))
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
    let metrics = sluice::faces::prometheus::metrics(0.8);
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
        tls: Option<sluice::operations::tls::ServerTlsFiles>,
    ) -> TestServer {
        TestServer::start_serving(
            limiter,
            ServeOptions {
                tls,
                ..TestServer::options()
            },
        )
        .await
    }

    /// What test servers serve with: a short grace period, and Reset enabled with [`ADMIN_TOKEN`].
    pub fn options() -> ServeOptions {
        ServeOptions {
            grace_period: Duration::from_secs(2),
            admin_token: Some(ADMIN_TOKEN.to_string()),
            ..ServeOptions::default()
        }
    }

    /// Starts with the given options.
    pub async fn start_serving<S: Store>(limiter: Arc<Limiter<S>>, options: ServeOptions) -> TestServer {
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
            metrics: None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
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

/// One ShouldRateLimit call in domain `edge` to a server on `port`, from a runtime of its own.
pub fn one_call(
    port: u16,
    key: &str,
    value: &str,
) -> Result<sluice::proto::envoy::service::ratelimit::v3::RateLimitResponse, String> {
    use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
    use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    };
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .map_err(|e| e.to_string())?;
        let answer = client.should_rate_limit(request).await.map_err(|e| e.to_string())?;
        Ok(answer.into_inner())
    })
}

/// `GET path` on a local port, blocking: the whole answer, or "" when nothing answers.
pub fn get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}
