//! The HTTP faces. The admin listener serves Prometheus `/metrics`, liveness `/healthz`, readiness `/readyz` (ready
//! only when decisions can reach the store: it answers and no circuit breaker is open; and, with rules over xDS, once
//! the first snapshot is in force) and `GET /rlconfig`, the rules in force. The reference's JSON API, `POST /json`,
//! decides (and counts) requests, so it is a face of its own: served only on its own listener (`--json-addr`), with
//! the gRPC listener's TLS when that has one, and held to the same request caps as gRPC. A deployment that locks gRPC
//! down (mutual TLS) therefore never leaves an open side door beside the health checks.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;

use crate::faces::auth::allowed;
use crate::faces::errors::{self, plain};
use crate::faces::headers::ResponseHeaders;
use crate::faces::wire::{check_request_bytes, to_core, to_response};
use crate::limiter::{Code, Limiter};
use crate::store::{Span, Store};

/// The admin routes over a limiter: metrics, health, readiness and the rules in force. Nothing here decides.
pub fn router<S: Store>(limiter: Arc<Limiter<S>>) -> Router {
    gated_router(limiter, RulesReady::default())
}

/// The admin routes, with `/readyz` also waiting for `rules`.
pub fn gated_router<S: Store>(limiter: Arc<Limiter<S>>, rules: RulesReady) -> Router {
    Router::new()
        .route("/metrics", get(metrics::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready::<S>))
        .route("/rlconfig", get(rlconfig::<S>))
        .with_state((limiter, rules))
}

/// Whether the rules are in force: always with files (they load before anything is served); with rules over xDS,
/// once the first snapshot is (the reference's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
#[derive(Debug, Clone, Default)]
pub struct RulesReady(Option<watch::Receiver<bool>>);

impl RulesReady {
    /// Ready once `applied` turns true.
    pub fn when(applied: watch::Receiver<bool>) -> RulesReady {
        RulesReady(Some(applied))
    }

    pub fn is_ready(&self) -> bool {
        self.0.as_ref().is_none_or(|applied| *applied.borrow())
    }

    /// Resolves when the rules are in force (never, if what would tell is gone first).
    pub async fn wait(&mut self) {
        if let Some(applied) = &mut self.0 {
            if applied.wait_for(|a| *a).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The admin routes' state.
type Admin<S> = (Arc<Limiter<S>>, RulesReady);

/// The JSON API: `POST /json`, answering with the rate limit headers `headers` asks for. A body is read up to
/// `--max-request-bytes` and no further.
pub fn json_router<S: Store>(limiter: Arc<Limiter<S>>, headers: ResponseHeaders, rules: RulesReady) -> Router {
    let cap = limiter.settings().caps.max_request_bytes;
    Router::new()
        .route("/json", post(json::<S>))
        .route("/healthcheck", get(healthcheck::<S>))
        .layer(DefaultBodyLimit::max(cap))
        .with_state(Arc::new((limiter, headers, rules)))
}

/// The JSON API's connections, plain or after a TLS handshake, as axum takes them.
pub struct JsonListener {
    incoming: crate::operations::tls::Incoming,
    addr: SocketAddr,
}

impl JsonListener {
    /// Accepts on `listener`, with TLS when `tls` is given (the gRPC listener's files), offering HTTP/1.1.
    pub fn new(
        listener: tokio::net::TcpListener,
        tls: Option<&crate::operations::tls::ServerTlsFiles>,
    ) -> Result<JsonListener, crate::operations::tls::TlsError> {
        let addr = listener
            .local_addr()
            .map_err(|e| crate::operations::tls::TlsError::Config(format!("json listener: {e}")))?;
        let incoming = crate::operations::tls::incoming_for(crate::operations::tls::Face::Json, listener, tls)?;
        Ok(JsonListener { incoming, addr })
    }
}

impl axum::serve::Listener for JsonListener {
    type Io = crate::operations::tls::Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.incoming.next().await {
                Some(Ok(conn)) => return (conn, self.addr),
                Some(Err(e)) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "json: cannot accept a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

async fn metrics<S: Store>(State((limiter, _)): State<Admin<S>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        limiter.metrics().render(),
    )
}

/// Whether decisions can be made: the rules are in force and the store answers with no breaker open.
async fn readiness<S: Store>(limiter: &Limiter<S>, rules: &RulesReady) -> Result<(), String> {
    if !rules.is_ready() {
        return Err("no configuration received from the xDS server yet".to_string());
    }
    limiter.ready().await.map_err(|e| e.to_string())
}

async fn ready<S: Store>(State((limiter, rules)): State<Admin<S>>) -> impl IntoResponse {
    match readiness(&limiter, &rules).await {
        // Ready: a list whose last fetch failed still decides with its last good values, and is named.
        Ok(()) => (
            StatusCode::OK,
            std::iter::once("ready".to_string())
                .chain(limiter.lists().failures())
                .chain(limiter.region_lines())
                .map(|line| line + "\n")
                .collect(),
        ),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
    }
}

/// `GET /healthcheck` on the JSON API's listener, where the reference serves it (Kubernetes probes of a reference
/// deployment point there): 200 `OK` when ready (as `/readyz`), 500 otherwise, as the reference answers.
async fn healthcheck<S: Store>(State(state): State<JsonState<S>>) -> impl IntoResponse {
    let (limiter, _, rules) = &*state;
    match readiness(limiter, rules).await {
        Ok(()) => (StatusCode::OK, "OK".to_string()),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("not ready: {e}\n")),
    }
}

/// `GET /offenders?domain=D&span=minute|hour&limit=N` on the admin listener: per rule of the domain, the values hit
/// most and denied most (as sluice.v1 GetTopOffenders), as JSON. With an admin token, the request must carry it as
/// `Authorization: Bearer <token>` (401 otherwise); 400 for a missing domain, an unknown span or a limit over 1 000,
/// 404 for an unknown domain, 503 when the store fails.
pub fn offenders_router<S: Store>(limiter: Arc<Limiter<S>>, token: Option<Arc<str>>) -> Router {
    Router::new()
        .route("/offenders", get(offenders::<S>))
        .with_state(Arc::new((limiter, token)))
}

/// A limiter, and the admin token its route needs (if any).
type Guarded<S> = Arc<(Arc<Limiter<S>>, Option<Arc<str>>)>;

async fn offenders<S: Store>(
    State(state): State<Guarded<S>>,
    request_headers: axum::http::HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let (limiter, token) = &*state;
    if let Err(refused) = allowed(token.as_deref(), &request_headers, &query) {
        return refused.into_response();
    }
    let Some(domain) = query.get("domain").filter(|d| !d.is_empty()) else {
        return plain(StatusCode::BAD_REQUEST, "domain: missing (?domain=NAME)");
    };
    let span = match query.get("span").map(String::as_str) {
        None | Some("minute") => Span::Minute,
        Some("hour") => Span::Hour,
        Some(other) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("span: '{other}' is neither minute nor hour"),
            );
        }
    };
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => 10,
        Some(Ok(n @ 1..=1_000)) => n,
        Some(_) => return plain(StatusCode::BAD_REQUEST, "limit: a number from 1 to 1000"),
    };
    let rules = match limiter.tallies().top_offenders(domain, span, limit).await {
        Ok(rules) => rules,
        Err(e) => return errors::read_failed(e),
    };
    let list = |l: &[(String, u64)]| -> serde_json::Value {
        l.iter()
            .map(|(value, count)| serde_json::json!({"value": value, "count": count}))
            .collect()
    };
    let body = serde_json::json!({
        "domain": domain,
        "span": if span == Span::Minute { "minute" } else { "hour" },
        "rules": rules
            .iter()
            .map(|r| serde_json::json!({"rule": r.rule, "hits": list(&r.hits), "denied": list(&r.denied)}))
            .collect::<Vec<_>>(),
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The JSON API's state: the limiter, the headers to add, and whether the rules are in force; shared, as axum clones
/// the state for every request.
type JsonState<S> = Arc<(Arc<Limiter<S>>, ResponseHeaders, RulesReady)>;

/// The Prometheus text alone, at `path`: the listener of `--metrics-addr` (the reference's `PROMETHEUS_ADDR` and
/// `PROMETHEUS_PATH`), for scrapers that should see nothing else.
pub fn metrics_router<S: Store>(limiter: Arc<Limiter<S>>, path: &str) -> Router {
    Router::new()
        .route(path, get(metrics::<S>))
        .with_state((limiter, RulesReady::default()))
}

/// Every domain and rule in force, one per line, as `sluice check` prints them.
async fn rlconfig<S: Store>(State((limiter, _)): State<Admin<S>>) -> impl IntoResponse {
    limiter.rules().summary()
}

/// `POST /json`: a proto3-JSON `RateLimitRequest` in, the JSON `RateLimitResponse` out, with 200 for OK and 429 for
/// OVER_LIMIT (as the reference answers); 413 for a body over `--max-request-bytes`, 400 for bad JSON or an invalid
/// request, 503 when the store fails.
async fn json<S: Store>(State(state): State<JsonState<S>>, body: Result<Bytes, BytesRejection>) -> Response {
    let (limiter, headers, _) = &*state;
    let invalid = |status: StatusCode, message: String| {
        limiter.metrics().invalid_request("should_rate_limit");
        plain(status, message)
    };
    let cap = limiter.settings().caps.max_request_bytes;
    let body = match body {
        Ok(body) => body,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return invalid(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body is over the cap of {cap} bytes (--max-request-bytes)"),
            );
        }
        Err(e) => return invalid(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}")),
    };
    if let Err(e) = check_request_bytes(limiter, body.len()) {
        return errors::too_large(e);
    }
    let value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return invalid(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")),
    };
    let request = match crate::faces::json::request(&value) {
        Ok(r) => r,
        Err(e) => return invalid(StatusCode::BAD_REQUEST, format!("invalid RateLimitRequest: {e}")),
    };
    let core = to_core(request.domain, request.descriptors, request.hits_addend);
    match limiter.decisions().should_rate_limit(&core).await {
        Ok(decision) => {
            let status = match decision.overall {
                Code::Ok => StatusCode::OK,
                Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
            };
            let body = crate::faces::json::response(&to_response(decision, headers));
            (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Err(e) => errors::decision_failed(e),
    }
}
