//! The HTTP face: Prometheus `/metrics`, liveness `/healthz` and readiness `/readyz` (ready only when the store
//! answers).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::limiter::Limiter;
use crate::store::Store;

/// The HTTP routes over a limiter.
pub fn router<S: Store>(limiter: Arc<Limiter<S>>) -> Router {
    Router::new()
        .route("/metrics", get(metrics::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready::<S>))
        .with_state(limiter)
}

async fn metrics<S: Store>(State(limiter): State<Arc<Limiter<S>>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        limiter.metrics().render(),
    )
}

async fn ready<S: Store>(State(limiter): State<Arc<Limiter<S>>>) -> impl IntoResponse {
    match limiter.store().ping().await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
    }
}
