//! Rules over xDS: an aggregated discovery service (ADS) client, state of the world, for the reference's
//! `RateLimitConfig` resources, which is how Envoy Gateway pushes rate limit configuration.
//!
//! This module owns the stream to the management server and what sluice does with what arrives on it. Every
//! `DiscoveryResponse` is a full snapshot: each resource is converted into the raw types a YAML file parses into
//! (so a snapshot means exactly what the same rules written as files mean, and its errors read the same, naming
//! `xds:<resource name>` where a file name would be), compiled, and swapped in whole. A snapshot that does not
//! compile never replaces the rules in force; it is rejected (NACK) with the compile error, and the management server
//! sees why. Counters survive a swap as they survive a file reload: their keys depend only on the domain, the
//! entries, the algorithm and the window.
//!
//! The stream is re-established after any error or end, with an exponential backoff that a response resets; in the
//! meantime the last good rules keep serving, and the first request of the new stream carries the last accepted
//! version. Until the first snapshot is in force the rule set is empty (unknown domains answer OK) and `/readyz`
//! says not ready. A snapshot of no resources is applied like any other: every policy was removed, and no domain is
//! limited any more, as in the reference.

use std::hash::{BuildHasher, Hash, Hasher};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataKey, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::config::{ConfigError, ConfigFile, RawDescriptor, RawDomain, RawRateLimit, RawReplaces};
use crate::limiter::Limiter;
use crate::proto::envoy::config::core::v3::Node;
use crate::proto::envoy::config::core::v3::node::UserAgentVersionType;
use crate::proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use crate::proto::google::rpc::Status;
use crate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use crate::rules::{Domains, RuleSet};
use crate::store::Store;

/// The resource type sluice subscribes to, as the reference and Envoy Gateway name it.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// How long a connection attempt to the management server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 pings on the idle stream, so that a management server gone without a word is noticed.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

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
    uri: http::Uri,
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
    name: MetadataKey<Ascii>,
    value: MetadataValue<Ascii>,
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
    initial: Duration,
    max: Duration,
    random_factor: f64,
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
    fn delay(&self, attempt: u32, unit: f64) -> Duration {
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
fn jitter() -> f64 {
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

/// Why the xDS client could not start.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("xds: cannot read {flag} '{}': {source}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("xds: {flag} needs an https:// --xds-server")]
    TlsWithoutHttps { flag: &'static str },
    #[error("xds: --xds-server '{url}': {source}")]
    Endpoint {
        url: String,
        source: tonic::transport::Error,
    },
}

/// Why a response was rejected: the message of its NACK.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    #[error("response type_url '{0}' is not {TYPE_URL}")]
    ResponseType(String),
    #[error("resources[{index}]: type_url '{type_url}' is not {TYPE_URL}")]
    ResourceType { index: usize, type_url: String },
    #[error("resources[{index}]: cannot decode a RateLimitConfig: {source}")]
    Decode { index: usize, source: prost::DecodeError },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Why a stream to the management server ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("stream failed: {code:?}: {message}")]
    Rpc { code: tonic::Code, message: String },
    #[error("the management server ended the stream")]
    Ended,
}

impl StreamError {
    fn rpc(status: tonic::Status) -> StreamError {
        StreamError::Rpc {
            code: status.code(),
            message: status.message().to_string(),
        }
    }
}

/// An error and its sources, `outer: inner: ...` (a transport error alone says only "transport error").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        // Wrappers often repeat their source's text.
        if !text.ends_with(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

/// The running client; dropping it ends the stream and the task.
pub struct XdsClient {
    task: JoinHandle<()>,
    applied: watch::Receiver<bool>,
}

impl Drop for XdsClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl XdsClient {
    /// Starts the client: it connects (and reconnects) to the management server and swaps every accepted snapshot
    /// into `limiter`, merging resources of one domain as `domains` says. Fails only on settings that can never
    /// work (unreadable TLS files, TLS options without TLS).
    pub fn start<S: Store>(
        limiter: Arc<Limiter<S>>,
        settings: XdsSettings,
        domains: Domains,
    ) -> Result<XdsClient, XdsError> {
        let endpoint = endpoint(&settings)?;
        let (applied_tx, applied) = watch::channel(false);
        let client = Client {
            limiter,
            domains,
            node: node(&settings),
            settings,
            version: String::new(),
            applied: applied_tx,
        };
        let task = tokio::spawn(client.run(endpoint));
        Ok(XdsClient { task, applied })
    }

    /// Turns true once the first snapshot is in force, and stays true.
    pub fn applied(&self) -> watch::Receiver<bool> {
        self.applied.clone()
    }
}

/// The channel settings: TLS when the URL says https, keepalive, timeouts.
fn endpoint(settings: &XdsSettings) -> Result<Endpoint, XdsError> {
    let url = settings.server.to_string();
    let endpoint_err = |source| XdsError::Endpoint {
        url: url.clone(),
        source,
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(endpoint_err)?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let tls = &settings.tls;
    if !settings.server.is_tls() {
        let given = [
            ("--xds-tls-ca", tls.ca.is_some()),
            ("--xds-tls-cert", tls.cert.is_some()),
            ("--xds-tls-key", tls.key.is_some()),
            ("--xds-tls-san", tls.san.is_some()),
        ];
        return match given.into_iter().find(|(_, set)| *set) {
            Some((flag, _)) => Err(XdsError::TlsWithoutHttps { flag }),
            None => Ok(endpoint),
        };
    }
    let read = |flag: &'static str, path: &PathBuf| {
        std::fs::read(path).map_err(|source| XdsError::Read {
            flag,
            path: path.clone(),
            source,
        })
    };
    let mut config = ClientTlsConfig::new();
    config = match &tls.ca {
        Some(ca) => config.ca_certificate(Certificate::from_pem(read("--xds-tls-ca", ca)?)),
        None => config.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        config = config.identity(Identity::from_pem(
            read("--xds-tls-cert", cert)?,
            read("--xds-tls-key", key)?,
        ));
    }
    if let Some(san) = &tls.san {
        config = config.domain_name(san.clone());
    }
    endpoint = endpoint.tls_config(config).map_err(endpoint_err)?;
    Ok(endpoint)
}

/// How sluice introduces itself.
fn node(settings: &XdsSettings) -> Node {
    let fields = settings
        .node_metadata
        .0
        .iter()
        .map(|(k, v)| {
            let value = prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(v.clone())),
            };
            (k.clone(), value)
        })
        .collect();
    Node {
        id: settings.node_id.clone(),
        cluster: String::new(),
        metadata: Some(prost_types::Struct { fields }),
        user_agent_name: "sluice".to_string(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_string(),
        )),
    }
}

/// The client task's state.
struct Client<S> {
    limiter: Arc<Limiter<S>>,
    domains: Domains,
    settings: XdsSettings,
    node: Node,
    /// The version of the last accepted snapshot; empty before any.
    version: String,
    applied: watch::Sender<bool>,
}

impl<S: Store> Client<S> {
    /// Keeps a stream open for as long as the task lives.
    async fn run(mut self, endpoint: Endpoint) {
        let mut attempt = 0_u32;
        loop {
            let error = self.stream(&endpoint, &mut attempt).await;
            let delay = self.settings.backoff.delay(attempt, jitter());
            attempt = attempt.saturating_add(1);
            tracing::warn!(
                server = %self.settings.server,
                error = %error,
                retry_in = ?delay,
                version = %self.version,
                "no stream to the xDS management server; the rules in force stay"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// One stream: subscribes, then answers every response with an ACK or a NACK until the stream fails or ends.
    /// A response resets `attempt`.
    #[tracing::instrument(skip_all, fields(server = %self.settings.server, node = %self.settings.node_id))]
    async fn stream(&mut self, endpoint: &Endpoint, attempt: &mut u32) -> StreamError {
        let channel = match endpoint.connect().await {
            Ok(channel) => channel,
            Err(e) => return StreamError::Connect(chain(&e)),
        };
        let mut client =
            AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(self.settings.max_message_bytes);
        // Room for the subscription and one answer: the loop below sends one answer per response read.
        let (requests, outbound) = mpsc::channel(2);
        let subscribe = DiscoveryRequest {
            version_info: self.version.clone(),
            node: Some(self.node.clone()),
            type_url: TYPE_URL.to_string(),
            ..DiscoveryRequest::default()
        };
        if requests.send(subscribe).await.is_err() {
            return StreamError::Ended;
        }
        let mut request = tonic::Request::new(ReceiverStream::new(outbound));
        for header in &self.settings.headers {
            request.metadata_mut().append(header.name.clone(), header.value.clone());
        }
        let mut responses = match client.stream_aggregated_resources(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => return StreamError::rpc(status),
        };
        tracing::info!(version = %self.version, "subscribed to RateLimitConfig resources");
        loop {
            let response = match responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return StreamError::Ended,
                Err(status) => return StreamError::rpc(status),
            };
            *attempt = 0;
            let answer = self.answer(response);
            if requests.send(answer).await.is_err() {
                return StreamError::Ended;
            }
        }
    }

    /// Applies a response when it compiles; returns its ACK, or its NACK.
    fn answer(&mut self, response: DiscoveryResponse) -> DiscoveryRequest {
        let metrics = self.limiter.metrics();
        let reply = |version: &str, error_detail: Option<Status>| DiscoveryRequest {
            version_info: version.to_string(),
            type_url: TYPE_URL.to_string(),
            response_nonce: response.nonce.clone(),
            error_detail,
            ..DiscoveryRequest::default()
        };
        match snapshot(&response, metrics, self.domains) {
            Ok(rules) => {
                let digest = rules.digest();
                let first = !*self.applied.borrow();
                if first || digest != self.limiter.rules().digest() {
                    tracing::info!(
                        version = %response.version_info,
                        resources = response.resources.len(),
                        summary = %rules.headline(),
                        digest = format!("{digest:016x}"),
                        "configuration applied from xDS"
                    );
                    self.limiter.reload(rules);
                    crate::sources::reload::after_load();
                    metrics.config_reload(Ok(digest));
                } else {
                    tracing::debug!(version = %response.version_info, "xDS snapshot unchanged");
                }
                self.applied.send_replace(true);
                self.version.clone_from(&response.version_info);
                reply(&response.version_info, None)
            }
            Err(rejection) => {
                tracing::warn!(
                    version = %response.version_info,
                    nonce = %response.nonce,
                    error = %rejection,
                    "xDS snapshot rejected (NACK); the rules in force stay"
                );
                metrics.config_reload(Err(()));
                let status = Status {
                    code: INVALID_ARGUMENT,
                    message: rejection.to_string(),
                    details: Vec::new(),
                };
                reply(&self.version, Some(status))
            }
        }
    }
}

/// Decodes, converts and compiles every resource of a response.
pub fn snapshot(
    response: &DiscoveryResponse,
    metrics: &crate::metrics::Metrics,
    domains: Domains,
) -> Result<RuleSet, Rejection> {
    if response.type_url != TYPE_URL {
        return Err(Rejection::ResponseType(response.type_url.clone()));
    }
    // No resources is a snapshot too: every policy was removed, so no domain is limited (as the reference does).
    let mut files = Vec::with_capacity(response.resources.len());
    for (index, resource) in response.resources.iter().enumerate() {
        if resource.type_url != TYPE_URL {
            return Err(Rejection::ResourceType {
                index,
                type_url: resource.type_url.clone(),
            });
        }
        let config =
            RateLimitConfig::decode(resource.value.as_slice()).map_err(|source| Rejection::Decode { index, source })?;
        let mut hasher = std::hash::DefaultHasher::new();
        (&config.name, &resource.value).hash(&mut hasher);
        files.push(config_file(&config, index, hasher.finish())?);
    }
    Ok(RuleSet::compile_owned(files, metrics, domains)?)
}

/// Converts one resource into the raw types of a configuration file named `xds:<resource name>`
/// (`xds:resources[<index>]` for an unnamed one), as the reference turns it into its YAML model.
pub fn config_file(config: &RateLimitConfig, index: usize, digest: u64) -> Result<ConfigFile, ConfigError> {
    let path = if config.name.is_empty() {
        PathBuf::from(format!("xds:resources[{index}]"))
    } else {
        PathBuf::from(format!("xds:{}", config.name))
    };
    let descriptors = descriptors(&path, &config.descriptors, "descriptors")?;
    Ok(ConfigFile {
        domain: RawDomain {
            domain: config.domain.clone(),
            descriptors,
            failure_policy: None,
            quota_buckets: Vec::new(),
        },
        path,
        digest,
    })
}

fn descriptors(
    file: &std::path::Path,
    list: &[RateLimitDescriptor],
    at: &str,
) -> Result<Vec<RawDescriptor>, ConfigError> {
    list.iter()
        .enumerate()
        .map(|(i, d)| {
            let at = format!("{at}[{i}]");
            Ok(RawDescriptor {
                key: d.key.as_str().into(),
                // Empty: no value, as in the reference.
                value: (!d.value.is_empty()).then(|| d.value.as_str().into()),
                rate_limit: d
                    .rate_limit
                    .as_ref()
                    .map(|p| policy(file, p, &format!("{at}.rate_limit")).map(Box::new))
                    .transpose()?,
                rate_limits: None,
                descriptors: descriptors(file, &d.descriptors, &format!("{at}.descriptors"))?,
                shadow_mode: d.shadow_mode,
                detailed_metric: d.detailed_metric,
                value_to_metric: false,
                share_threshold: false,
                quota_mode: d.quota_mode,
                cost_reports: false,
                metadata: d.metadata.as_ref().map(|m| Box::new(mapping(m))),
            })
        })
        .collect()
}

fn policy(file: &std::path::Path, p: &RateLimitPolicy, at: &str) -> Result<RawRateLimit, ConfigError> {
    // UNKNOWN is no unit, which is what an unlimited rule has (the reference reads it so too).
    let unit = match RateLimitUnit::try_from(p.unit) {
        Ok(RateLimitUnit::Unknown) => None,
        Ok(unit) => Some(unit.as_str_name().to_ascii_lowercase().into()),
        Err(_) => {
            return Err(ConfigError::Invalid {
                file: file.to_path_buf(),
                path: format!("{at}.unit"),
                message: format!("unknown unit number {}", p.unit),
            });
        }
    };
    Ok(RawRateLimit {
        unit,
        requests_per_unit: p.requests_per_unit,
        unlimited: p.unlimited,
        name: (!p.name.is_empty()).then(|| p.name.as_str().into()),
        replaces: p
            .replaces
            .iter()
            .map(|r| RawReplaces { name: r.name.clone() })
            .collect(),
        algorithm: None,
        unit_multiplier: None,
        burst: None,
        record: None,
        cost: None,
        price: None,
    })
}

/// A protobuf `Struct` as the mapping a file's `metadata` would be.
fn mapping(s: &prost_types::Struct) -> crate::config::RawMetadata {
    s.fields.iter().map(|(k, v)| (k.clone(), json(v))).collect()
}

fn json(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    use serde_json::Value as J;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => J::Null,
        Some(Kind::NumberValue(n)) => J::from(*n),
        Some(Kind::StringValue(s)) => J::String(s.clone()),
        Some(Kind::BoolValue(b)) => J::Bool(*b),
        Some(Kind::StructValue(s)) => J::Object(mapping(s)),
        Some(Kind::ListValue(l)) => J::Array(l.values.iter().map(json).collect()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use prost_types::value::Kind;

    use super::*;
    use crate::clock::SystemClock;
    use crate::limiter::LimiterSettings;
    use crate::metrics::Metrics;
    use crate::proto::ratelimit::config::ratelimit::v3::RateLimitReplace;
    use crate::store::memory::MemoryStore;

    fn limit(unit: RateLimitUnit, requests: u32, name: &str) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: requests,
            name: name.to_string(),
            ..RateLimitPolicy::default()
        })
    }

    fn node(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.to_string(),
            value: value.to_string(),
            rate_limit,
            ..RateLimitDescriptor::default()
        }
    }

    fn resource(config: &RateLimitConfig) -> prost_types::Any {
        prost_types::Any {
            type_url: TYPE_URL.to_string(),
            value: config.encode_to_vec(),
        }
    }

    fn response(version: &str, nonce: &str, configs: &[RateLimitConfig]) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: version.to_string(),
            resources: configs.iter().map(resource).collect(),
            type_url: TYPE_URL.to_string(),
            nonce: nonce.to_string(),
            ..DiscoveryResponse::default()
        }
    }

    fn config(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
        RateLimitConfig {
            name: name.to_string(),
            domain: domain.to_string(),
            descriptors,
        }
    }

    fn discarded() -> Metrics {
        Metrics::discarded(0.8)
    }

    #[test]
    fn units_are_spelled_as_in_yaml_and_unknown_is_none() {
        let units = [
            (RateLimitUnit::Second, "second"),
            (RateLimitUnit::Minute, "minute"),
            (RateLimitUnit::Hour, "hour"),
            (RateLimitUnit::Day, "day"),
            (RateLimitUnit::Week, "week"),
            (RateLimitUnit::Month, "month"),
            (RateLimitUnit::Year, "year"),
        ];
        for (unit, name) in units {
            let c = config("r", "d", vec![node("k", "", limit(unit, 1, ""))]);
            let file = config_file(&c, 0, 0).unwrap();
            let rl = file.domain.descriptors[0].rate_limit.as_ref().unwrap();
            assert_eq!(rl.unit.as_deref(), Some(name));
        }
        let unlimited = RateLimitPolicy {
            unlimited: true,
            ..RateLimitPolicy::default()
        };
        let c = config("r", "d", vec![node("k", "", Some(unlimited))]);
        let file = config_file(&c, 0, 0).unwrap();
        assert_eq!(file.domain.descriptors[0].rate_limit.as_ref().unwrap().unit, None);
        // An unlimited rule with UNKNOWN compiles, as in the reference.
        RuleSet::compile(&[file], &discarded()).unwrap();
    }

    #[test]
    fn a_snapshot_means_what_the_same_yaml_means() {
        let mut metadata = prost_types::Struct::default();
        let string = |s: &str| prost_types::Value {
            kind: Some(Kind::StringValue(s.to_string())),
        };
        metadata.fields.insert("team".into(), string("payments"));
        metadata.fields.insert(
            "tags".into(),
            prost_types::Value {
                kind: Some(Kind::ListValue(prost_types::ListValue {
                    values: vec![
                        string("a"),
                        prost_types::Value {
                            kind: Some(Kind::BoolValue(true)),
                        },
                        prost_types::Value {
                            kind: Some(Kind::NumberValue(1.5)),
                        },
                    ],
                })),
            },
        );
        let mut nested = node("path", "/api/*", limit(RateLimitUnit::Day, 4, ""));
        nested.descriptors = vec![node("user", "", limit(RateLimitUnit::Hour, 2, "api-user"))];
        nested.quota_mode = true;
        let mut region = node("region", "", limit(RateLimitUnit::Day, 10, "region"));
        if let Some(rl) = region.rate_limit.as_mut() {
            rl.replaces = vec![RateLimitReplace { name: "team".into() }];
        }
        let mut team = node("team", "", limit(RateLimitUnit::Day, 1, "team"));
        team.shadow_mode = true;
        team.detailed_metric = true;
        team.metadata = Some(metadata);
        let c = config("edge-policy", "edge", vec![nested, team, region]);
        let file = config_file(&c, 0, 7).unwrap();
        assert_eq!(file.path, Path::new("xds:edge-policy"));
        assert_eq!(file.digest, 7);

        let yaml = "domain: edge
descriptors:
  - key: path
    value: /api/*
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 4}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 2, name: api-user}
  - key: team
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 1, name: team}
    metadata: {tags: [a, true, 1.5], team: payments}
  - key: region
    rate_limit: {unit: day, requests_per_unit: 10, name: region, replaces: [{name: team}]}
";
        let parsed = crate::config::parse(Path::new("xds:edge-policy"), yaml).unwrap();
        assert_eq!(format!("{:?}", file.domain), format!("{:?}", parsed.domain));
        let from_xds = RuleSet::compile(&[file], &discarded()).unwrap();
        let from_yaml = RuleSet::compile(&[parsed], &discarded()).unwrap();
        assert_eq!(from_xds.summary(), from_yaml.summary());
    }

    #[test]
    fn errors_name_the_resource_and_the_path() {
        let bad = config(
            "edge-policy",
            "edge",
            vec![node("a", "", None), node("b", "", limit(RateLimitUnit::Unknown, 5, ""))],
        );
        let e = snapshot(&response("1", "n", &[bad]), &discarded(), Domains::OnePerFile)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'xds:edge-policy'"), "{e}");
        assert!(e.contains("descriptors[1].rate_limit.unit"), "{e}");

        let mut weird = config("w", "d", vec![node("a", "", limit(RateLimitUnit::Day, 1, ""))]);
        weird.descriptors[0].rate_limit.as_mut().unwrap().unit = 42;
        let e = config_file(&weird, 0, 0).unwrap_err().to_string();
        assert_eq!(
            e,
            "config 'xds:w': descriptors[0].rate_limit.unit: unknown unit number 42"
        );

        let twice = [
            config("one", "d", vec![node("a", "", limit(RateLimitUnit::Day, 1, ""))]),
            config("two", "d", vec![node("b", "", limit(RateLimitUnit::Day, 1, ""))]),
        ];
        let e = snapshot(&response("1", "n", &twice), &discarded(), Domains::OnePerFile)
            .unwrap_err()
            .to_string();
        assert!(e.contains("xds:two") && e.contains("xds:one"), "{e}");
        snapshot(&response("1", "n", &twice), &discarded(), Domains::Merged).unwrap();

        let unnamed = config("", "", vec![]);
        let e = snapshot(&response("1", "n", &[unnamed]), &discarded(), Domains::OnePerFile)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'xds:resources[0]'"), "{e}");
    }

    #[test]
    fn what_the_network_may_send_is_rejected_not_trusted() {
        let good = config("r", "d", vec![node("a", "", limit(RateLimitUnit::Day, 1, ""))]);
        let m = discarded();
        let reject = |r: &DiscoveryResponse| snapshot(r, &m, Domains::OnePerFile).unwrap_err().to_string();

        let mut wrong = response("1", "n", std::slice::from_ref(&good));
        wrong.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        assert!(reject(&wrong).contains("envoy.config.cluster.v3.Cluster"));

        let empty = snapshot(&response("1", "n", &[]), &m, Domains::OnePerFile).unwrap();
        assert!(empty.domain("d").is_none());

        let mut other = response("1", "n", std::slice::from_ref(&good));
        other.resources[0].type_url = "type.googleapis.com/google.protobuf.Empty".into();
        assert!(reject(&other).starts_with("resources[0]: type_url"));

        let mut garbage = response("1", "n", std::slice::from_ref(&good));
        garbage.resources[0].value = vec![0xff, 0xff, 0xff];
        assert!(reject(&garbage).starts_with("resources[0]: cannot decode"));
    }

    fn client() -> Client<MemoryStore> {
        let limiter = Limiter::new(
            RuleSet::compile(&[], &discarded()).unwrap(),
            MemoryStore::new(),
            Arc::new(SystemClock),
            discarded(),
            LimiterSettings::default(),
        );
        let settings = XdsSettings {
            server: "http://127.0.0.1:1".parse().unwrap(),
            node_id: "n".into(),
            node_metadata: NodeMetadata::default(),
            headers: Vec::new(),
            tls: XdsTls::default(),
            backoff: Backoff::default(),
            max_message_bytes: 1 << 20,
        };
        Client {
            limiter: Arc::new(limiter),
            domains: Domains::OnePerFile,
            node: node_of(&settings),
            settings,
            version: String::new(),
            applied: watch::channel(false).0,
        }
    }

    fn node_of(settings: &XdsSettings) -> Node {
        super::node(settings)
    }

    #[test]
    fn a_good_snapshot_is_applied_and_acked_a_bad_one_nacked_with_the_last_version() {
        let mut c = client();
        let good = config("r", "d", vec![node("a", "", limit(RateLimitUnit::Day, 1, ""))]);
        let ack = c.answer(response("v1", "n1", &[good]));
        assert_eq!((ack.version_info.as_str(), ack.response_nonce.as_str()), ("v1", "n1"));
        assert!(ack.error_detail.is_none());
        assert!(*c.applied.borrow());
        let in_force = c.limiter.rules().digest();

        let bad = config("broken", "d", vec![node("", "", None)]);
        let nack = c.answer(response("v2", "n2", &[bad]));
        assert_eq!((nack.version_info.as_str(), nack.response_nonce.as_str()), ("v1", "n2"));
        let status = nack.error_detail.unwrap();
        assert_eq!(status.code, INVALID_ARGUMENT);
        assert!(status.message.contains("xds:broken"), "{}", status.message);
        assert_eq!(c.limiter.rules().digest(), in_force);
        assert_eq!(c.version, "v1");
    }

    #[test]
    fn backoff_doubles_up_to_the_max_within_the_random_factor() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1_000), 0.5);
        let ms = |attempt, unit| b.delay(attempt, unit).as_millis();
        assert_eq!(
            [ms(0, 0.0), ms(1, 0.0), ms(2, 0.0), ms(3, 0.0), ms(4, 0.0)],
            [100, 200, 400, 800, 1_000]
        );
        assert_eq!((ms(0, -1.0), ms(0, 1.0)), (50, 150));
        assert_eq!(ms(10, 1.0), 1_000);
        assert_eq!(ms(u32::MAX, -1.0), 500);
        // A max below the initial delay is the initial delay.
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(10), 0.0);
        assert_eq!(b.delay(5, 0.0), Duration::from_millis(100));
        for _ in 0..100 {
            assert!((-1.0..=1.0).contains(&jitter()));
        }
    }

    #[test]
    fn settings_are_parsed_and_bad_ones_named() {
        let meta: NodeMetadata = "k1:v1, k2=v2,,url=http://x:1".parse().unwrap();
        let pairs = [("k1", "v1"), ("k2", "v2"), ("url", "http://x:1")];
        assert_eq!(meta.0, pairs.map(|(k, v)| (k.to_string(), v.to_string())));
        assert_eq!("".parse::<NodeMetadata>().unwrap(), NodeMetadata::default());
        assert_eq!(
            "a=1,b".parse::<NodeMetadata>().unwrap_err().to_string(),
            "'b': expected key:value or key=value"
        );

        let h: Header = "X-Tenant: blue".parse().unwrap();
        assert_eq!((h.name.as_str(), h.value.to_str().unwrap()), ("x-tenant", "blue"));
        assert!("novalue".parse::<Header>().is_err());
        assert!("bad name:v".parse::<Header>().is_err());

        assert!("https://xds.example:443".parse::<ServerUrl>().unwrap().is_tls());
        assert!(!"http://127.0.0.1:18000".parse::<ServerUrl>().unwrap().is_tls());
        for bad in ["127.0.0.1:18000", "grpc://x:1", "http://x:1/path", "http://"] {
            assert!(bad.parse::<ServerUrl>().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn tls_options_need_https_and_readable_files() {
        let mut settings = client().settings;
        settings.tls.san = Some("xds.internal".into());
        let e = endpoint(&settings).unwrap_err().to_string();
        assert_eq!(e, "xds: --xds-tls-san needs an https:// --xds-server");
        settings.server = "https://127.0.0.1:1".parse().unwrap();
        settings.tls.ca = Some("/nonexistent/ca.pem".into());
        let e = endpoint(&settings).unwrap_err().to_string();
        assert!(
            e.starts_with("xds: cannot read --xds-tls-ca '/nonexistent/ca.pem'"),
            "{e}"
        );
    }
}
