//! What running the service takes besides its faces and sources.
//!
//! - [`telemetry`]: logs (text, plain when not at a terminal, or JSON) and traces exported over OTLP.
//! - [`tls`]: TLS on the listeners, certificates re-read when their files change.

pub mod telemetry;
pub mod tls;
