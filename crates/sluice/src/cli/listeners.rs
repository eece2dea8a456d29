//! Where clients reach sluice, and what they must present: the gRPC, admin, JSON API and metrics listeners, TLS on
//! the gRPC listener (and the JSON API's), and the admin token.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::operations::tls::ServerTlsFiles;

/// `serve`'s flags for the listeners.
#[derive(Debug, Args)]
pub(super) struct ListenerFlags {
    /// Address of the gRPC server.
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    pub(super) grpc_addr: SocketAddr,
    /// Address of the HTTP admin server (/metrics, /healthz, /readyz, /rlconfig).
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub(super) http_addr: SocketAddr,
    /// Address of the JSON API (`POST /json`, the reference's HTTP decision endpoint), with the gRPC listener's TLS
    /// when that has one. Not served unless given.
    #[arg(long, env = "SLUICE_JSON_ADDR")]
    pub(super) json_addr: Option<SocketAddr>,
    /// Serve Prometheus metrics on a listener of their own too (the admin listener keeps /metrics).
    #[arg(long, env = "SLUICE_METRICS_ADDR")]
    pub(super) metrics_addr: Option<SocketAddr>,
    /// Path of the metrics on --metrics-addr.
    #[arg(long, env = "SLUICE_METRICS_PATH", default_value = "/metrics", value_parser = parse_path, requires = "metrics_addr")]
    pub(super) metrics_path: String,
    /// PEM certificate chain for TLS on the gRPC listener; needs --grpc-tls-key. Re-read when the file changes.
    #[arg(long, env = "SLUICE_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    pub(super) grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert. Re-read when the file changes.
    #[arg(long, env = "SLUICE_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    pub(super) grpc_tls_key: Option<PathBuf>,
    /// PEM CA certificates: gRPC clients must present a certificate they signed (mutual TLS).
    #[arg(long, env = "SLUICE_GRPC_TLS_CLIENT_CA", requires = "grpc_tls_cert")]
    pub(super) grpc_tls_client_ca: Option<PathBuf>,
    /// Enables the admin calls (Reset, the list calls, GetTopOffenders) for callers presenting this token
    /// (`authorization: Bearer <token>`). It also guards the admin listener's GET /offenders and the dashboard (/ui
    /// and its data), which then need it as that header or as `?token=<token>`; unset, those two are open.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub(super) admin_token: Option<String>,
}

impl ListenerFlags {
    /// The metrics listener's address and path, when it is served.
    pub(super) fn metrics(&self) -> Option<(SocketAddr, String)> {
        self.metrics_addr.map(|addr| (addr, self.metrics_path.clone()))
    }

    /// TLS on the gRPC listener, when a certificate and its key are given.
    pub(super) fn tls(&self) -> Option<ServerTlsFiles> {
        self.grpc_tls_cert
            .clone()
            .zip(self.grpc_tls_key.clone())
            .map(|(cert, key)| ServerTlsFiles {
                cert,
                key,
                client_ca: self.grpc_tls_client_ca.clone(),
            })
    }

    /// The admin token; an empty one is none.
    pub(super) fn admin_token(&self) -> Option<String> {
        self.admin_token.clone().filter(|t| !t.is_empty())
    }
}

/// A URL path: it starts with '/' and holds no whitespace.
fn parse_path(s: &str) -> Result<String, String> {
    if s.starts_with('/') && !s.contains(char::is_whitespace) {
        Ok(s.to_string())
    } else {
        Err(format!("'{s}' is not a path (it starts with '/')"))
    }
}
