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

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
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

mod settings;
use settings::jitter;
pub use settings::{Backoff, Header, NodeMetadata, ServerUrl, XdsSettings, XdsSettingsError, XdsTls};

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
            lists: Vec::new(),
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
        buckets: None,
        record: None,
        cost: None,
        price: None,
        global: false,
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
mod tests;
