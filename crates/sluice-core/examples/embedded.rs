//! A small HTTP service that limits its own requests in-process with `sluice-core`: the same YAML files, algorithms
//! and Redis scripts as the sluice service, with no rate-limit service in between.
//!
//! ```sh
//! cargo run -p sluice-core --example embedded -- --config crates/sluice-core/examples/embedded.yaml
//! curl -i -H 'x-user: alice' http://127.0.0.1:3000/      # 200 three times a minute, then 429 with retry-after
//! ```
//!
//! Flags: `--config PATH` (a YAML file or a directory, as `sluice serve` takes), `--listen ADDR` (default
//! `127.0.0.1:3000`; port 0 picks a free one), `--redis URL` (counters in Redis, shared with every other instance
//! and with sluice servers on the same Redis; default: in memory). It prints `listening on ADDR` once it serves.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use sluice_core::clock::SystemClock;
use sluice_core::config;
use sluice_core::limiter::{Code, Descriptor, Limiter, LimiterSettings};
use sluice_core::metrics::Metrics;
use sluice_core::rules::RuleSet;
use sluice_core::store::Store;
use sluice_core::store::memory::MemoryStore;
use sluice_core::store::redis::{RedisSettings, RedisStore};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Flags {
    config: PathBuf,
    listen: SocketAddr,
    redis: Option<String>,
}

fn flags() -> Result<Flags, Error> {
    let mut args = std::env::args().skip(1);
    let (mut config, mut listen, mut redis) = (None, "127.0.0.1:3000".parse()?, None);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(value()?)),
            "--listen" => listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--redis" => redis = Some(value()?),
            other => return Err(format!("unknown flag '{other}' (--config PATH, --listen ADDR, --redis URL)").into()),
        }
    }
    let config = config.ok_or("--config PATH is required")?;
    Ok(Flags { config, listen, redis })
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let flags = flags()?;
    // The limits, compiled once; metrics go nowhere here (pass a `metrics::Sink` to keep them).
    let metrics = Metrics::discarded(0.8);
    let rules = RuleSet::compile(&config::load(&flags.config)?, &metrics)?;
    let settings = LimiterSettings::default();
    match flags.redis {
        None => {
            serve(
                Limiter::new(rules, MemoryStore::new(), Arc::new(SystemClock), metrics, settings),
                flags.listen,
            )
            .await
        }
        Some(url) => {
            let store = RedisStore::connect(&RedisSettings {
                url,
                timeout: Duration::from_millis(100),
                pool_size: 2,
                server_time: true,
                tls: Default::default(),
            })
            .await?;
            serve(
                Limiter::new(rules, store, Arc::new(SystemClock), metrics, settings),
                flags.listen,
            )
            .await
        }
    }
}

/// Serves HTTP/1 on `listen`, asking `limiter` about every request before answering it.
async fn serve<S: Store>(limiter: Limiter<S>, listen: SocketAddr) -> Result<(), Error> {
    let limiter = Arc::new(limiter);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(limiter.clone(), request));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// 200 when the request's user is within their limits, 429 with `retry-after` when not, 503 when the store cannot
/// decide (the limiter's default failure policy).
async fn answer<S: Store>(
    limiter: Arc<Limiter<S>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let user = request
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous");
    let ask = sluice_core::limiter::Request {
        domain: "embedded".into(),
        descriptors: vec![Descriptor {
            entries: vec![("user".into(), user.into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    };
    let response = match limiter.decisions().should_rate_limit(&ask).await {
        Ok(decision) if decision.overall == Code::Ok => Response::new(Full::from(format!("hello, {user}\n"))),
        Ok(decision) => {
            let wait = decision.statuses[0]
                .reset_after_us
                .unwrap_or(1_000_000)
                .div_ceil(1_000_000);
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header("retry-after", wait.to_string())
                .body(Full::from("slow down\n"))
                .unwrap_or_default()
        }
        Err(e) => Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .body(Full::from(format!("{e}\n")))
            .unwrap_or_default(),
    };
    Ok(response)
}
