//! Assembly and lifecycle: loads the configuration (or starts the xDS client that will deliver it), picks the store,
//! binds the gRPC and HTTP listeners, serves until the shutdown future resolves, then drains in-flight calls within a
//! bounded grace period.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;

use crate::clock::SystemClock;
use crate::config::{self, ConfigError};
use crate::faces::grpc::{EnvoyService, SluiceService};
use crate::faces::http::{self, JsonListener, RulesReady};
use crate::faces::rlqs::QuotaService;
use crate::limiter::{Limiter, LimiterSettings};
use crate::metrics::Metrics;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use crate::proto::sluice::v1::rate_limiter_server::RateLimiterServer;
use crate::quota::{QuotaCaps, Quotas};
use crate::regions::{RegionSettings, Replicator};
use crate::rules::{Domains, RuleSet};
use crate::sources::reload::{Reloader, WatchError};
use crate::sources::xds::{XdsClient, XdsError, XdsSettings};
use crate::store::memory::MemoryStore;
use crate::store::redis::{FormatCheck, RedisSettings, RedisStore};
use crate::store::{Store, StoreError};

pub mod grpc;
mod regions;

use grpc::Routes as _;
use regions::Shipping;

/// Where the rules come from.
#[derive(Debug, Clone)]
pub enum RuleSource {
    /// A YAML file or a directory of them, reloaded when they change.
    Files(PathBuf),
    /// An xDS management server's snapshots; until the first arrives the rule set is empty.
    Xds(Box<XdsSettings>),
}

/// Everything `sluice serve` is told.
#[derive(Debug, Clone)]
pub struct Settings {
    pub rules: RuleSource,
    /// Whether files (or xDS resources) of one domain merge (`--merge-domains`, the reference's
    /// `MERGE_DOMAIN_CONFIG`).
    pub domains: Domains,
    pub grpc_addr: SocketAddr,
    /// The admin endpoints: metrics, health, readiness, the rules in force.
    pub http_addr: SocketAddr,
    /// The JSON API (`POST /json`, `GET /healthcheck`); `None`: not served.
    pub json_addr: Option<SocketAddr>,
    /// A listener of its own for Prometheus metrics, and their path; `None`: metrics are on the admin listener only.
    pub metrics: Option<(SocketAddr, String)>,
    /// `None`: the in-memory store.
    pub redis: Option<RedisSettings>,
    /// This region and the others (`--region`, `--region-redis`); only with Redis.
    pub regions: Option<Regions>,
    pub limiter: LimiterSettings,
    pub near_limit_ratio: f64,
    pub serve: ServeOptions,
}

/// This region, and the other regions' Redis URLs (name, URL), which take this region's counts of global limits.
#[derive(Debug, Clone)]
pub struct Regions {
    pub settings: RegionSettings,
    pub others: Vec<(String, String)>,
}

/// How the listeners behave.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// How long in-flight calls may take to finish after a shutdown signal.
    pub grace_period: Duration,
    /// Enables `sluice.v1.RateLimiter/Reset` for callers that present it.
    pub admin_token: Option<String>,
    /// TLS (mutual when a client CA is given) on the gRPC listener and the JSON API's; the files are re-read when
    /// they change.
    pub tls: Option<crate::operations::tls::ServerTlsFiles>,
    /// Rate limit headers to add to responses, for the most constrained status.
    pub response_headers: crate::faces::headers::ResponseHeaders,
    /// Bounds on the Rate Limit Quota Service's streams.
    pub quota_caps: QuotaCaps,
}

/// The bound HTTP listeners: the admin endpoints, and the JSON API and the metrics listener (with its path) when
/// they are served.
#[derive(Debug)]
pub struct HttpListeners {
    pub admin: TcpListener,
    pub json: Option<TcpListener>,
    pub metrics: Option<(TcpListener, String)>,
}

impl From<TcpListener> for HttpListeners {
    /// The admin endpoints alone.
    fn from(admin: TcpListener) -> Self {
        HttpListeners {
            admin,
            json: None,
            metrics: None,
        }
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error(transparent)]
    Xds(#[from] XdsError),
    #[error("{0}")]
    Serve(String),
}

/// The tokio runtime for `threads` threads (0: [`auto_threads`]), and the number of threads it got. One thread gets
/// the current-thread scheduler, which runs woken tasks in the order they were woken: the replies Redis sent in one
/// read complete many requests before their HTTP/2 connection task runs again, so their answers leave in one write
/// (about 24 per write, against 3 with the multi-thread scheduler's one worker, whose LIFO slot runs each woken
/// connection task at once). That costs a fifth less CPU per decision (BENCHMARKS.md).
pub fn runtime(threads: usize) -> std::io::Result<(tokio::runtime::Runtime, usize)> {
    let threads = if threads == 0 { auto_threads() } else { threads };
    let mut builder = match threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
    };
    Ok((builder.enable_all().build()?, threads))
}

/// The serving threads when `--worker-threads` is not given: one per CPU the process may use (its cgroup's CPU quota
/// and affinity included, as the standard library counts them), except that with one or two CPUs a single thread
/// serves. There a second scheduler thread buys no throughput: the CPUs are shared with the clients, Redis and the
/// kernel's network work, and the threads' wake-ups and stolen tasks, with answers written one by one instead of in
/// batches, about double the CPU time of a decision (BENCHMARKS.md, "Worker threads").
pub fn auto_threads() -> usize {
    match std::thread::available_parallelism().map_or(1, |n| n.get()) {
        n @ 3.. => n,
        _ => 1,
    }
}

/// Loads the configuration and serves until `shutdown` resolves, reloading the configuration when it changes (or
/// taking it from the xDS server as it is pushed).
pub async fn run(settings: Settings, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServerError> {
    let metrics = crate::faces::prometheus::metrics(settings.near_limit_ratio);
    let rules = match &settings.rules {
        RuleSource::Files(path) => {
            let rules = RuleSet::compile_owned(config::load(path)?, &metrics, settings.domains)?;
            metrics.config_loaded(rules.digest());
            tracing::info!(config = %path.display(), summary = %rules.headline(), "configuration loaded");
            crate::sources::reload::after_load();
            rules
        }
        RuleSource::Xds(xds) => {
            tracing::info!(server = %xds.server, node = %xds.node_id, "rules over xDS: none until the first snapshot");
            RuleSet::compile_with(&[], &metrics, settings.domains)?
        }
    };
    let grpc = bind(settings.grpc_addr).await?;
    let http = HttpListeners {
        admin: bind(settings.http_addr).await?,
        json: match settings.json_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        },
        metrics: match &settings.metrics {
            Some((addr, path)) => Some((bind(*addr).await?, path.clone())),
            None => None,
        },
    };
    let listeners = (grpc, http);
    match &settings.redis {
        None if settings.regions.is_some() => Err(ServerError::Serve(
            "--region needs --redis-url: the other regions ship their counts into this region's Redis".into(),
        )),
        None => {
            tracing::info!("store: in memory");
            start(&settings, rules, metrics, MemoryStore::new(), listeners, None, shutdown).await
        }
        Some(redis) => {
            let store = RedisStore::connect(redis).await?;
            tracing::info!(timeout = ?redis.timeout, pool = redis.pool_size, "store: redis");
            check_format(&store, &settings.limiter.key_prefix).await?;
            let replicator = match &settings.regions {
                Some(regions) => Some(regions::replicator(redis, regions).await?),
                None => None,
            };
            start(&settings, rules, metrics, store, listeners, replicator, shutdown).await
        }
    }
}

/// Refuses a Redis that holds another storage format than this version's. When the marker cannot be read
/// yet (the server, or the primary of its slot, is not reachable), nothing waits: the check goes on in the background
/// until it gets an answer, and says in the log what it found.
async fn check_format(store: &RedisStore, prefix: &str) -> Result<(), ServerError> {
    match store.check_format(prefix).await {
        Ok(FormatCheck::Known) => Ok(()),
        Ok(FormatCheck::Unknown(found)) => Err(ServerError::Serve(FormatCheck::refusal(prefix, &found))),
        Err(e) => {
            tracing::warn!(error = %e, "storage format: the marker could not be read yet; checking in the background");
            let (store, prefix) = (store.clone(), prefix.to_string());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    match store.check_format(&prefix).await {
                        Ok(FormatCheck::Known) => return,
                        Ok(FormatCheck::Unknown(found)) => {
                            return tracing::error!("{}", FormatCheck::refusal(&prefix, &found));
                        }
                        Err(_) => {}
                    }
                }
            });
            Ok(())
        }
    }
}

async fn start<S: Store>(
    settings: &Settings,
    rules: RuleSet,
    metrics: Metrics,
    store: S,
    (grpc, http): (TcpListener, HttpListeners),
    replicator: Option<Replicator<RedisStore>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let limiter = Arc::new(Limiter::new(
        rules,
        store,
        Arc::new(SystemClock),
        metrics,
        settings.limiter.clone(),
    ));
    // Shipping runs until the servers have drained, then ships what was not shipped yet (see `Shipping::stop`); it
    // stops at once if this returns early.
    let shipping = replicator.map(|replicator| Shipping::start(&limiter, replicator));
    if !limiter.lists().with_urls().is_empty() {
        let client = crate::sources::lists::client().map_err(ServerError::Serve)?;
        crate::sources::lists::fetch_all(&limiter, &client)
            .await
            .map_err(ServerError::Serve)?;
    }
    // Whichever source runs is stopped when this returns.
    let (_reloader, _xds, ready) = match &settings.rules {
        RuleSource::Files(path) => {
            let reloader = Reloader::start(limiter.clone(), path.clone(), settings.domains)?;
            (Some(reloader), None, RulesReady::default())
        }
        RuleSource::Xds(xds) => {
            let client = XdsClient::start(limiter.clone(), (**xds).clone(), settings.domains)?;
            let ready = RulesReady::when(client.applied());
            (None, Some(client), ready)
        }
    };
    let served = serve_gated(limiter, grpc, http, shutdown, &settings.serve, ready).await;
    if let (Some(shipping), Some(regions)) = (shipping, &settings.regions) {
        shipping.stop(regions.settings.timeout).await;
    }
    served
}

/// Keeps the metrics' memory flat between scrapes.
async fn upkeep(metrics: Metrics) {
    let mut every = tokio::time::interval(Duration::from_secs(5));
    loop {
        every.tick().await;
        metrics.run_upkeep();
    }
}

/// Counts the cost of the reservations this instance made that expired unsettled (see `Budgets::reap_expired`).
async fn reap_reservations<S: Store>(limiter: Arc<Limiter<S>>) {
    let mut every = tokio::time::interval(Duration::from_secs(5));
    loop {
        every.tick().await;
        if let Err(e) = limiter.budgets().reap_expired().await {
            tracing::debug!(error = %e, "expired reservations not reaped this time; they are tried again");
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// The gRPC services whose health is reported ("" is the server's).
const SERVICES: [&str; 4] = [
    "",
    "envoy.service.ratelimit.v3.RateLimitService",
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    "sluice.v1.RateLimiter",
];

/// Serves gRPC (the rate limit services and the rate limit quota service, health, reflection), the admin endpoints and, when it has a listener, the
/// JSON API on bound listeners until `shutdown` resolves, then stops accepting and gives in-flight calls `grace` to
/// finish.
pub async fn serve<S: Store>(
    limiter: Arc<Limiter<S>>,
    grpc: TcpListener,
    http: impl Into<HttpListeners>,
    shutdown: impl Future<Output = ()> + Send,
    options: &ServeOptions,
) -> Result<(), ServerError> {
    serve_gated(limiter, grpc, http, shutdown, options, RulesReady::default()).await
}

/// [`serve`], with `/readyz` and the gRPC health service not ready, nor serving, until `ready` says the rules are in
/// force.
async fn serve_gated<S: Store>(
    limiter: Arc<Limiter<S>>,
    grpc: TcpListener,
    http: impl Into<HttpListeners>,
    shutdown: impl Future<Output = ()> + Send,
    options: &ServeOptions,
    ready: RulesReady,
) -> Result<(), ServerError> {
    // A new instance answers, and reports ready, with the run-time list entries already stored. A store it cannot
    // read does not hold it back: it serves by its failure policy, and the lists' keeper reads them when it can.
    if let Err(e) = limiter.lists().read_all().await {
        tracing::warn!(error = %e, "run-time list entries not read at start; read again in the background");
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    let health_gate = report_health(&health, ready.clone()).await;
    let (stop, stopped) = watch::channel(false);
    let cx = Context {
        quotas: Quotas::new(limiter.clone(), options.quota_caps),
        limiter,
        options,
        admin_token: options.admin_token.as_deref().map(Arc::from),
        stopped,
    };
    let mut servers = Servers::start(&cx, grpc, http.into(), health_service, ready)?;
    let background = Background::spawn(&cx.limiter, health_gate);

    servers.until(shutdown, options.grace_period).await?;
    let _ = stop.send(true);
    background.abort();
    for service in SERVICES {
        health.set_service_status(service, ServingStatus::NotServing).await;
    }
    servers.drain(options.grace_period).await;
    // What this instance counted since its last flushes still counts.
    cx.limiter.tallies().flush_series().await;
    cx.limiter.tallies().flush_offenders().await;
    Ok(())
}

/// What every server is built over.
struct Context<'a, S> {
    limiter: Arc<Limiter<S>>,
    /// The RLQS streams, which the dashboard shows too.
    quotas: Arc<Quotas<S>>,
    options: &'a ServeOptions,
    admin_token: Option<Arc<str>>,
    /// Turns true when the servers are to stop accepting.
    stopped: watch::Receiver<bool>,
}

/// Resolves when `stopped` turns true (or its sender is gone).
async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Reports every service NOT_SERVING until `ready` says the rules are in force (at once, when they already are), then
/// SERVING; the task that waits for it is returned.
async fn report_health(health: &HealthReporter, ready: RulesReady) -> JoinHandle<()> {
    let initial = if ready.is_ready() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for service in SERVICES {
        health.set_service_status(service, initial).await;
    }
    tokio::spawn({
        let (health, mut ready) = (health.clone(), ready);
        async move {
            ready.wait().await;
            for service in SERVICES {
                health.set_service_status(service, ServingStatus::Serving).await;
            }
        }
    })
}

/// The servers' tasks, one per listener; the JSON API's and the metrics listener's end at once when they have no
/// listener.
struct Servers {
    grpc: JoinHandle<()>,
    http: JoinHandle<std::io::Result<()>>,
    json: JoinHandle<std::io::Result<()>>,
    metrics: JoinHandle<std::io::Result<()>>,
    json_on: bool,
    metrics_on: bool,
}

impl Servers {
    /// Starts a server on each listener: gRPC (with `health`), the admin endpoints (their `/readyz` waiting for
    /// `ready`), and the JSON API and the metrics when they have listeners. Nothing is started when a listener's TLS
    /// cannot be set up.
    fn start<S: Store>(
        cx: &Context<'_, S>,
        grpc: TcpListener,
        http: HttpListeners,
        health: HealthServer<impl Health>,
        ready: RulesReady,
    ) -> Result<Servers, ServerError> {
        let HttpListeners { admin, json, metrics } = http;
        let metrics_addr = metrics.as_ref().and_then(|(m, _)| m.local_addr().ok());
        let grpc_addr = grpc.local_addr().ok();
        let http_addr = admin.local_addr().ok();
        let json_addr = json.as_ref().and_then(|j| j.local_addr().ok());
        let json = match json {
            Some(listener) => Some(
                JsonListener::new(listener, cx.options.tls.as_ref()).map_err(|e| ServerError::Serve(e.to_string()))?,
            ),
            None => None,
        };
        let grpc = spawn_grpc(cx, grpc, health)?;
        let (json_on, metrics_on) = (json.is_some(), metrics.is_some());
        let headers = || cx.options.response_headers.clone();
        let json = spawn_maybe(json.map(|listener| {
            axum::serve(
                listener,
                http::json_router(cx.limiter.clone(), headers(), ready.clone()),
            )
            .with_graceful_shutdown(until_stopped(cx.stopped.clone()))
        }));
        let metrics = spawn_maybe(metrics.map(|(listener, path)| {
            axum::serve(listener, http::metrics_router(cx.limiter.clone(), &path))
                .with_graceful_shutdown(until_stopped(cx.stopped.clone()))
        }));
        let token = cx.admin_token.clone();
        let routes = http::gated_router(cx.limiter.clone(), ready)
            .merge(http::offenders_router(cx.limiter.clone(), token.clone()))
            .merge(crate::faces::ui::router(cx.limiter.clone(), cx.quotas.clone(), token));
        let http = tokio::spawn(
            axum::serve(admin, routes)
                .with_graceful_shutdown(until_stopped(cx.stopped.clone()))
                .into_future(),
        );
        tracing::info!(grpc = ?grpc_addr, http = ?http_addr, json = ?json_addr, metrics = ?metrics_addr, "serving");
        Ok(Servers {
            grpc,
            http,
            json,
            metrics,
            json_on,
            metrics_on,
        })
    }

    /// Resolves when `shutdown` does; an error when a server stopped before.
    async fn until(&mut self, shutdown: impl Future<Output = ()> + Send, grace: Duration) -> Result<(), ServerError> {
        tokio::select! {
            () = shutdown => tracing::info!(grace = ?grace, "shutting down: no new connections, draining in-flight calls"),
            r = &mut self.grpc => return Err(ServerError::Serve(format!("grpc server stopped: {r:?}"))),
            r = &mut self.http => return Err(ServerError::Serve(format!("http server stopped: {r:?}"))),
            r = &mut self.json, if self.json_on => return Err(ServerError::Serve(format!("json server stopped: {r:?}"))),
            r = &mut self.metrics, if self.metrics_on => {
                return Err(ServerError::Serve(format!("metrics server stopped: {r:?}")));
            }
        }
        Ok(())
    }

    /// Gives the servers, told to stop, `grace` to finish their in-flight calls.
    async fn drain(self, grace: Duration) {
        let finished = async { (self.grpc.await, self.http.await, self.json.await, self.metrics.await) };
        match tokio::time::timeout(grace, finished).await {
            Ok(_) => tracing::info!("drained; stopped"),
            Err(_) => {
                tracing::warn!(grace = ?grace, "grace period over; closing the connections still open")
            }
        }
    }
}

/// Spawns the gRPC server on `listener`, with the listeners' TLS: the rate limit services, the rate limit quota
/// service, `health` and reflection, until the servers are told to stop.
fn spawn_grpc<S: Store>(
    cx: &Context<'_, S>,
    listener: TcpListener,
    health: HealthServer<impl Health>,
) -> Result<JoinHandle<()>, ServerError> {
    fn reflection(b: tonic_reflection::server::Builder<'static>) -> tonic_reflection::server::Builder<'static> {
        b.register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    }
    let reflection_v1 = reflection(tonic_reflection::server::Builder::configure())
        .build_v1()
        .map_err(|e| ServerError::Serve(format!("reflection: {e}")))?;
    let reflection_v1alpha = reflection(tonic_reflection::server::Builder::configure())
        .build_v1alpha()
        .map_err(|e| ServerError::Serve(format!("reflection: {e}")))?;
    let (limiter, headers) = (&cx.limiter, &cx.options.response_headers);
    // The hot service last: it is matched first.
    let routes = grpc::Unimplemented
        .add(reflection_v1alpha)
        .add(reflection_v1)
        .add(health)
        // A report over --max-request-bytes is refused before it is decoded (see faces::rlqs).
        .add(
            RateLimitQuotaServiceServer::new(QuotaService::new(cx.quotas.clone(), cx.stopped.clone()))
                .max_decoding_message_size(limiter.settings().caps.max_request_bytes),
        )
        .add(RateLimiterServer::new(SluiceService::new(
            limiter.clone(),
            headers.clone(),
            cx.admin_token.clone(),
        )))
        .add(RateLimitServiceServer::new(EnvoyService::new(
            limiter.clone(),
            headers.clone(),
        )));
    let incoming = crate::operations::tls::incoming(listener, cx.options.tls.as_ref())
        .map_err(|e| ServerError::Serve(e.to_string()))?;
    Ok(tokio::spawn(grpc::serve(
        routes,
        incoming,
        until_stopped(cx.stopped.clone()),
    )))
}

/// Spawns a server that may not be served: without one, the task ends at once.
fn spawn_maybe<F>(server: Option<F>) -> JoinHandle<std::io::Result<()>>
where
    F: IntoFuture<Output = std::io::Result<()>> + Send + 'static,
    F::IntoFuture: Send,
{
    tokio::spawn(async move {
        match server {
            Some(server) => server.await,
            None => Ok(()),
        }
    })
}

/// The tasks that run beside the servers: the health gate, the lists kept in step across instances and fetched
/// from their URLs, the per-second tallies, the metrics' upkeep and the reaping of expired reservations.
struct Background(Vec<JoinHandle<()>>);

impl Background {
    /// Spawns them (the health gate is spawned already).
    fn spawn<S: Store>(limiter: &Arc<Limiter<S>>, health_gate: JoinHandle<()>) -> Background {
        Background(vec![
            health_gate,
            tokio::spawn({
                let limiter = limiter.clone();
                async move { limiter.lists().keep().await }
            }),
            tokio::spawn(crate::sources::lists::keep_fetching(limiter.clone())),
            tokio::spawn({
                let limiter = limiter.clone();
                async move { limiter.tallies().keep().await }
            }),
            tokio::spawn(upkeep(limiter.metrics().clone())),
            tokio::spawn(reap_reservations(limiter.clone())),
        ])
    }

    /// Stops them all.
    fn abort(self) {
        for task in self.0 {
            task.abort();
        }
    }
}
