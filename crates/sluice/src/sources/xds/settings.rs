//! What the xDS client is told: the management server's URL, headers, node metadata, TLS, and the reconnection
//! backoff; each parsed from its flag with an error that names the input.

use std::hash::BuildHasher;
use std::str::FromStr;

use tonic::metadata::{Ascii, MetadataKey, MetadataValue};

use super::*;

/// Everything the xDS client is told.
#[derive(Debug, Clone)]
pub struct XdsSettings {
    pub server: ServerUrl,
    /// The node id; management servers key their snapshots on it.
    pub node_id: String,
    pub node_metadata: NodeMetadata,
    /// Extra gRPC metadata sent on the stream (e.g. an authorization header).
    pub headers: Vec<Header>,
    pub tls: XdsTls,
    pub backoff: Backoff,
    /// The largest response accepted, in bytes.
    pub max_message_bytes: usize,
}

/// The management server's address: `http://host:port` or `https://host:port` (TLS).
#[derive(Debug, Clone)]
pub struct ServerUrl {
    pub(super) uri: http::Uri,
}

impl ServerUrl {
    /// Whether the connection uses TLS.
    pub fn is_tls(&self) -> bool {
        self.uri.scheme_str() == Some("https")
    }
}

impl std::fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.uri.fmt(f)
    }
}

impl FromStr for ServerUrl {
    type Err = XdsSettingsError;

    fn from_str(s: &str) -> Result<ServerUrl, XdsSettingsError> {
        let bad = |why: &str| XdsSettingsError::Server {
            url: s.to_string(),
            why: why.to_string(),
        };
        let uri: http::Uri = s.parse().map_err(|_| bad("not a URL"))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(bad("expected http://host:port or https://host:port")),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(bad("no host"));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(bad("a path is not allowed"));
        }
        Ok(ServerUrl { uri })
    }
}

/// One extra header on the stream, `name:value`.
#[derive(Debug, Clone)]
pub struct Header {
    pub(super) name: MetadataKey<Ascii>,
    pub(super) value: MetadataValue<Ascii>,
}

impl FromStr for Header {
    type Err = XdsSettingsError;

    fn from_str(s: &str) -> Result<Header, XdsSettingsError> {
        let bad = |why: &str| XdsSettingsError::Header {
            header: s.to_string(),
            why: why.to_string(),
        };
        let (name, value) = s.split_once(':').ok_or_else(|| bad("expected name:value"))?;
        let name = name.trim().to_ascii_lowercase();
        Ok(Header {
            name: MetadataKey::from_bytes(name.as_bytes()).map_err(|_| bad("invalid header name"))?,
            value: MetadataValue::try_from(value.trim()).map_err(|_| bad("invalid header value"))?,
        })
    }
}

/// String fields of the node's metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMetadata(pub Vec<(String, String)>);

/// Written as the reference's `CONFIG_GRPC_XDS_NODE_METADATA`: comma-separated entries, each `key:value` or
/// `key=value` (split at the first `:` or `=`). Empty entries are skipped.
impl FromStr for NodeMetadata {
    type Err = XdsSettingsError;

    fn from_str(s: &str) -> Result<NodeMetadata, XdsSettingsError> {
        let mut fields = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let split = entry.find([':', '=']).filter(|&at| at > 0);
            let Some(at) = split else {
                return Err(XdsSettingsError::Metadata {
                    entry: entry.to_string(),
                });
            };
            fields.push((entry[..at].trim().to_string(), entry[at + 1..].trim().to_string()));
        }
        Ok(NodeMetadata(fields))
    }
}

/// TLS to the management server (with an `https://` URL).
#[derive(Debug, Clone, Default)]
pub struct XdsTls {
    /// PEM CA certificates to trust instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name the server's certificate must carry, instead of the URL's host.
    pub san: Option<String>,
}

/// Reconnection delays: `initial`, doubling per failed attempt up to `max`, each spread by up to ± `random_factor`
/// of itself (so that many instances do not reconnect in step). A response on a stream starts again from `initial`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub(super) initial: Duration,
    pub(super) max: Duration,
    pub(super) random_factor: f64,
}

impl Backoff {
    /// The reference's defaults are 10 s, 60 s and 0.5. `max` below `initial` is taken as `initial`; the random
    /// factor is clamped to [0, 1].
    pub fn new(initial: Duration, max: Duration, random_factor: f64) -> Backoff {
        let random_factor = if random_factor.is_finite() {
            random_factor.clamp(0.0, 1.0)
        } else {
            0.0
        };
        Backoff {
            initial,
            max: max.max(initial),
            random_factor,
        }
    }

    /// The delay before reconnection attempt `attempt` (0 for the first), given `unit`, a number in [-1, 1].
    pub(super) fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let doubled = self.initial.saturating_mul(1_u32 << attempt.min(20));
        let base = doubled.min(self.max).as_secs_f64();
        let spread = base * (1.0 + self.random_factor * unit.clamp(-1.0, 1.0));
        Duration::from_secs_f64(spread.max(0.0)).min(self.max)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_secs(10), Duration::from_secs(60), 0.5)
    }
}

/// A number in [-1, 1], different on each call (the standard library's per-instance random hash keys).
pub(super) fn jitter() -> f64 {
    let bits = std::collections::hash_map::RandomState::new().build_hasher().finish();
    (bits >> 11) as f64 / (1_u64 << 53) as f64 * 2.0 - 1.0
}

/// A bad xDS setting, naming the input.
#[derive(Debug, thiserror::Error)]
pub enum XdsSettingsError {
    #[error("'{url}': {why}")]
    Server { url: String, why: String },
    #[error("'{header}': {why}")]
    Header { header: String, why: String },
    #[error("'{entry}': expected key:value or key=value")]
    Metadata { entry: String },
}
