//! The one place where the core's errors become answers: gRPC statuses for the gRPC services, HTTP statuses with
//! plain-text bodies for the JSON API and the admin listener's reads. A store's details never reach a client: it
//! hears that the store is unavailable (or timed out, on gRPC), and the logs say why.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tonic::Status;

use crate::limiter::{Cap, LimitError};
use crate::quota::QuotaError;
use crate::store::StoreError;

/// What a client hears when the store failed.
const STORE_UNAVAILABLE: &str = "rate limit store unavailable";

/// A decision's error as a gRPC status.
pub fn to_status(error: LimitError) -> Status {
    match error {
        LimitError::InvalidArgument(message) => Status::invalid_argument(message),
        LimitError::OverCap { cap, message } => Status::invalid_argument(over_cap(cap, &message)),
        LimitError::Store(StoreError::Timeout(after)) => {
            Status::unavailable(format!("rate limit store timed out after {after:?}"))
        }
        LimitError::Store(_) => Status::unavailable(STORE_UNAVAILABLE),
        LimitError::Busy(message) => Status::resource_exhausted(message),
        LimitError::NotFound(message) => Status::not_found(message),
    }
}

/// An RLQS stream's error as the gRPC status that ends it.
pub fn quota_status(error: QuotaError) -> Status {
    match error {
        QuotaError::Invalid(m) => Status::invalid_argument(m),
        QuotaError::OverCap(m) => Status::resource_exhausted(m),
        QuotaError::Unavailable(m) => Status::unavailable(m),
    }
}

/// An over-cap message naming the flag that sets the cap.
pub fn over_cap(cap: Cap, message: &str) -> String {
    let flag = match cap {
        Cap::Descriptors => "--max-descriptors",
        Cap::Entries => "--max-entries",
        Cap::ValueBytes => "--max-value-bytes",
        Cap::RequestBytes => "--max-request-bytes",
    };
    format!("{message} ({flag})")
}

/// A plain-text HTTP answer: the message and a line end.
pub fn plain(status: StatusCode, message: impl Into<String>) -> Response {
    (status, format!("{}\n", message.into())).into_response()
}

/// The JSON API's answer to a decision that failed: 400 for an invalid request or one over a cap, 503 when the store
/// failed or the server is too busy, 404 for what does not exist.
pub fn decision_failed(error: LimitError) -> Response {
    match error {
        LimitError::InvalidArgument(m) => plain(StatusCode::BAD_REQUEST, m),
        LimitError::OverCap { cap, message } => plain(StatusCode::BAD_REQUEST, over_cap(cap, &message)),
        LimitError::Store(_) => plain(StatusCode::SERVICE_UNAVAILABLE, STORE_UNAVAILABLE),
        LimitError::Busy(m) => plain(StatusCode::SERVICE_UNAVAILABLE, m),
        LimitError::NotFound(m) => plain(StatusCode::NOT_FOUND, m),
    }
}

/// The JSON API's answer to a body over `--max-request-bytes`: 413, naming the cap.
pub fn too_large(error: LimitError) -> Response {
    match error {
        LimitError::OverCap { cap, message } => plain(StatusCode::PAYLOAD_TOO_LARGE, over_cap(cap, &message)),
        other => decision_failed(other),
    }
}

/// The answer to a read on the admin listener (`/offenders`) that failed: 404 for an unknown domain, 503 otherwise.
pub fn read_failed(error: LimitError) -> Response {
    match error {
        LimitError::NotFound(m) => plain(StatusCode::NOT_FOUND, m),
        _ => plain(StatusCode::SERVICE_UNAVAILABLE, STORE_UNAVAILABLE),
    }
}

/// The dashboard's answer to a read that failed: as [`read_failed`], except that a domain gone since the request
/// was checked is answered with the core's message as it is, without a line end.
pub fn dashboard_read_failed(error: LimitError) -> Response {
    match error {
        LimitError::NotFound(m) => (StatusCode::NOT_FOUND, m).into_response(),
        other => read_failed(other),
    }
}
