//! The HTTP face: Prometheus `/metrics`, liveness `/healthz`, readiness `/readyz` (ready only when decisions can
//! reach the store: it answers and no circuit breaker is open), the reference's JSON API `POST /json`, and `GET /rlconfig`, the rules in force.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::api::{to_core, to_response};
use crate::limiter::{Code, LimitError, Limiter};
use crate::store::Store;

/// The HTTP routes over a limiter.
pub fn router<S: Store>(limiter: Arc<Limiter<S>>) -> Router {
    Router::new()
        .route("/metrics", get(metrics::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready::<S>))
        .route("/json", post(json::<S>))
        .route("/rlconfig", get(rlconfig::<S>))
        .with_state(limiter)
}

async fn metrics<S: Store>(State(limiter): State<Arc<Limiter<S>>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        limiter.metrics().render(),
    )
}

async fn ready<S: Store>(State(limiter): State<Arc<Limiter<S>>>) -> impl IntoResponse {
    match limiter.ready().await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
    }
}

/// Every domain and rule in force, one per line, as `sluice check` prints them.
async fn rlconfig<S: Store>(State(limiter): State<Arc<Limiter<S>>>) -> impl IntoResponse {
    limiter.rules().summary()
}

/// `POST /json`: a proto3-JSON `RateLimitRequest` in, the JSON `RateLimitResponse` out, with 200 for OK and 429 for
/// OVER_LIMIT (as the reference answers); 400 for bad JSON or an invalid request, 503 when the store fails.
async fn json<S: Store>(State(limiter): State<Arc<Limiter<S>>>, body: Bytes) -> Response {
    let error = |status: StatusCode, message: String| (status, format!("{message}\n")).into_response();
    let value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")),
    };
    let request = match crate::json::request(&value) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid RateLimitRequest: {e}")),
    };
    let core = to_core(request.domain, request.descriptors, request.hits_addend);
    match limiter.should_rate_limit(&core).await {
        Ok(decision) => {
            let status = match decision.overall {
                Code::Ok => StatusCode::OK,
                Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
            };
            let body = crate::json::response(&to_response(decision, limiter.settings().response_headers));
            (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Err(LimitError::InvalidArgument(m)) => error(StatusCode::BAD_REQUEST, m),
        Err(LimitError::Store(_)) => error(StatusCode::SERVICE_UNAVAILABLE, "rate limit store unavailable".into()),
    }
}
