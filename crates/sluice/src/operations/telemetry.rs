//! Logs and traces. Logs: `tracing` events to standard error, as text or JSON, filtered by `RUST_LOG` (default
//! `--log-level`, `info`). Traces: the same `tracing` spans, exported over OTLP (gRPC, or HTTP with protobuf bodies)
//! when `--otlp-endpoint` or the standard OpenTelemetry variables ask for it, and joined to the caller's trace through
//! the W3C `traceparent`/`tracestate` gRPC metadata ([`GrpcTraceLayer`]).
//!
//! Export is opt-in: without `--otlp-endpoint`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! no exporter, no propagator and no per-call span are set up, and the logs are what they would be without the
//! tracing half.

use std::task::{Context, Poll};

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Instrument;
use tracing::instrument::Instrumented;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (port 4317 by convention).
    Grpc,
    /// OTLP over HTTP with protobuf bodies, POSTed to `<endpoint>/v1/traces` (port 4318 by convention).
    HttpProtobuf,
}

/// What the command line says about logs and traces; what it leaves out comes from the standard variables.
#[derive(Debug, Clone)]
pub struct TelemetrySettings {
    pub format: LogFormat,
    /// The log filter when `RUST_LOG` is not set (`info`, `warn`, `sluice=debug`, ...).
    pub level: String,
    /// The collector's base URL; `None`: `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`, or no export.
    pub endpoint: Option<String>,
    /// `None`: `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` (`grpc` or `http/protobuf`), else gRPC.
    pub protocol: Option<OtlpProtocol>,
    /// `service.name`; `None`: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, else `sluice`.
    pub service_name: Option<String>,
    /// More resource attributes (`service.namespace`, `service.instance.id`, ...), over the variables' ones.
    pub resource_attributes: Vec<(String, String)>,
    /// The share of traces sampled (parent-based); `None`: `OTEL_TRACES_SAMPLER(_ARG)`, else all.
    pub sampling_ratio: Option<f64>,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            format: LogFormat::Text,
            level: "info".to_string(),
            endpoint: None,
            protocol: None,
            service_name: None,
            resource_attributes: Vec::new(),
            sampling_ratio: None,
        }
    }
}

/// The variables that switch trace export on, most specific first (the order the OTLP exporter reads them in).
const ENDPOINT_VARS: [&str; 2] = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"];

/// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names the service.
const DEFAULT_SERVICE_NAME: &str = "sluice";

/// Why logs or traces could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("{var}='{value}': cannot build the OTLP span exporter: {source}")]
    Exporter {
        var: &'static str,
        value: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("log level '{level}': {message}")]
    Level { level: String, message: String },
    #[error("{var} is set but the OTLP export runtime cannot start: {source}")]
    Runtime { var: &'static str, source: std::io::Error },
    #[error("cannot install the log subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// Keeps trace export running; dropping it exports the spans still queued and stops the exporter.
///
/// Hold it until the server has returned, so the spans of the last calls (graceful shutdown included) are sent.
#[must_use = "dropping the guard stops trace export"]
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    export: Option<Export>,
}

#[derive(Debug)]
struct Export {
    provider: SdkTracerProvider,
    /// Runs the gRPC channel of the exporter. It is separate from the server's runtime because the spans are flushed
    /// when the guard drops, after that runtime is gone.
    runtime: tokio::runtime::Runtime,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(export) = self.export.take() {
            // Blocks until the batch processor has exported what it holds (bounded by the SDK's shutdown timeout).
            if let Err(e) = export.provider.shutdown() {
                tracing::warn!(error = %e, "could not export the last spans");
            }
            export.runtime.shutdown_background();
        }
    }
}

/// Installs the process's log subscriber and, when an OTLP endpoint is given, the OTLP span exporter and the W3C
/// TraceContext propagator. Call once, from the binary.
///
/// The exporter follows the standard variables for what `settings` leaves out: `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`,
/// `_PROTOCOL`, `_HEADERS`, `_TIMEOUT`, `_COMPRESSION`, `OTEL_SERVICE_NAME` (default `sluice`),
/// `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)`, `OTEL_BSP_*`. `OTEL_SDK_DISABLED=true` switches it off.
pub fn init(settings: &TelemetrySettings) -> Result<TelemetryGuard, TelemetryError> {
    // Logs keep their own filter, so `RUST_LOG=warn` quiets the logs without stopping the spans sent to OTLP.
    let filter = match EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(_) => EnvFilter::try_new(&settings.level).map_err(|e| TelemetryError::Level {
            level: settings.level.clone(),
            message: e.to_string(),
        })?,
    };
    // Colour only for a person at a terminal: a file or a pipe (what Kubernetes collects) gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = match settings.format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![fmt];

    let mut guard = TelemetryGuard::default();
    let endpoint = match &settings.endpoint {
        Some(url) if !sdk_disabled() => Some(("--otlp-endpoint", url.clone())),
        Some(_) => None,
        None => otlp_endpoint(),
    };
    if let Some((var, value)) = endpoint {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sluice-otlp")
            .enable_all()
            .build()
            .map_err(|source| TelemetryError::Runtime { var, source })?;
        let exporter = match settings.protocol.unwrap_or_else(protocol_from_env) {
            OtlpProtocol::Grpc => {
                // The exporter's gRPC channel spawns its worker on the runtime current when it is built.
                let _entered = runtime.enter();
                let builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                match &settings.endpoint {
                    Some(url) => builder.with_endpoint(url.clone()).build(),
                    None => builder.build(),
                }
            }
            OtlpProtocol::HttpProtobuf => {
                let client = RuntimeHttpClient::new(runtime.handle().clone());
                let builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_http_client(client);
                match &settings.endpoint {
                    Some(url) => builder.with_endpoint(traces_url(url)).build(),
                    None => builder.build(),
                }
            }
        }
        .map_err(|source| TelemetryError::Exporter { var, value, source })?;
        let mut provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource(settings));
        if let Some(ratio) = settings.sampling_ratio {
            provider = provider.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))));
        }
        let provider = provider.build();
        let tracer = provider.tracer(env!("CARGO_PKG_NAME"));
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        // Only sluice's own spans: the exporter's HTTP/2 client would otherwise trace its own exports. The per-call
        // spans are at DEBUG, so that without export (and with logs at INFO) they cost nothing on the hot path.
        let spans = Targets::new().with_target(env!("CARGO_CRATE_NAME"), LevelFilter::DEBUG);
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(spans)
                .boxed(),
        );
        guard.export = Some(Export { provider, runtime });
    }

    tracing_subscriber::registry().with(layers).try_init()?;
    Ok(guard)
}

/// `OTEL_SDK_DISABLED=true`.
fn sdk_disabled() -> bool {
    std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// The protocol the standard variables name (`http/protobuf`, or `grpc`, the default).
fn protocol_from_env() -> OtlpProtocol {
    let named = ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]
        .into_iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()));
    match named.as_deref().map(str::trim) {
        Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
        _ => OtlpProtocol::Grpc,
    }
}

/// The traces URL under a collector's base URL, as the standard variable's value is read.
fn traces_url(base: &str) -> String {
    if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{}/v1/traces", base.trim_end_matches('/'))
    }
}

/// An HTTP/1.1 client for the OTLP exporter whose requests run on the export runtime: the batch processor exports
/// from a thread of its own, outside any tokio runtime, so each request is spawned onto the runtime and awaited.
#[derive(Debug, Clone)]
struct RuntimeHttpClient {
    runtime: tokio::runtime::Handle,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
}

/// The longest an export may take, reading the answer included.
const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl RuntimeHttpClient {
    fn new(runtime: tokio::runtime::Handle) -> Self {
        let client = {
            let _entered = runtime.enter();
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
        };
        RuntimeHttpClient { runtime, client }
    }

    async fn send(&self, request: http::Request<bytes::Bytes>) -> Result<http::Response<bytes::Bytes>, HttpError> {
        use http_body_util::BodyExt as _;
        let client = self.client.clone();
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, http_body_util::Full::new(body));
        let exchange = async move {
            let response = client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = http_body_util::Limited::new(body, 4 << 20).collect().await?.to_bytes();
            Ok::<_, HttpError>(http::Response::from_parts(parts, body))
        };
        self.runtime
            .spawn(async move {
                tokio::time::timeout(EXPORT_TIMEOUT, exchange)
                    .await
                    .map_err(|_| HttpError::from("the OTLP export timed out"))?
            })
            .await?
    }
}

type HttpError = opentelemetry_http::HttpError;

impl opentelemetry_http::HttpClient for RuntimeHttpClient {
    fn send_bytes<'a, 'f>(
        &'a self,
        request: http::Request<bytes::Bytes>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<http::Response<bytes::Bytes>, HttpError>> + Send + 'f>>
    where
        'a: 'f,
        Self: 'f,
    {
        Box::pin(self.send(request))
    }
}

/// The endpoint variable that switches export on, with its value; `None` when export is off.
fn otlp_endpoint() -> Option<(&'static str, String)> {
    if sdk_disabled() {
        return None;
    }
    ENDPOINT_VARS
        .into_iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()).map(|v| (var, v)))
}

/// The SDK's resource (from `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, under the settings' name and
/// attributes), named `sluice` when nothing names the service; the SDK's own fallback would be
/// `unknown_service:sluice`.
fn resource(settings: &TelemetrySettings) -> Resource {
    let builder = Resource::builder().with_attributes(
        settings
            .resource_attributes
            .iter()
            .map(|(k, v)| opentelemetry::KeyValue::new(k.clone(), v.clone())),
    );
    if let Some(name) = &settings.service_name {
        return builder.with_service_name(name.clone()).build();
    }
    let named = settings.resource_attributes.iter().any(|(k, _)| k == "service.name")
        || std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || EnvResourceDetector::new()
            .detect()
            .get(&opentelemetry::Key::from_static_str("service.name"))
            .is_some();
    if named {
        builder.build()
    } else {
        builder.with_service_name(DEFAULT_SERVICE_NAME).build()
    }
}

/// A tower layer for the gRPC server: each call runs in a `grpc` span (OpenTelemetry kind `server`, named
/// `package.Service/Method`) whose parent is the trace context found in the call's `traceparent`/`tracestate`
/// metadata. The handlers' `#[tracing::instrument]` spans, and the store calls under them, become its children, so
/// sluice's spans join the caller's (Envoy's) trace.
///
/// Without trace export it does nothing: no span, so the logs and the cost of a call are what they were.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcTraceLayer;

impl<S> tower::Layer<S> for GrpcTraceLayer {
    type Service = GrpcTrace<S>;

    fn layer(&self, inner: S) -> GrpcTrace<S> {
        GrpcTrace { inner }
    }
}

/// The service [`GrpcTraceLayer`] wraps around the gRPC router.
#[derive(Debug, Clone)]
pub struct GrpcTrace<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for GrpcTrace<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // `init` installs a propagator only when it exports spans; without one, calls run without a span and log as
        // they would without this layer.
        let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator
                .fields()
                .next()
                .is_some()
                .then(|| propagator.extract(&Metadata(request.headers())))
        });
        let span = match parent {
            Some(parent) => {
                let span = rpc_span(request.uri().path());
                // Fails only if something filtered the span out; the call is then not traced.
                let _ = span.set_parent(parent);
                span
            }
            None => tracing::Span::none(),
        };
        let future = span.in_scope(|| self.inner.call(request));
        future.instrument(span)
    }
}

/// The span of one call to `path` (`/package.Service/Method`), with the OpenTelemetry RPC attributes.
fn rpc_span(path: &str) -> tracing::Span {
    let (name, service, method) = rpc_names(path);
    tracing::info_span!(
        "grpc",
        otel.name = name,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
    )
}

/// `/package.Service/Method` as the span name `package.Service/Method`, the service and the method.
fn rpc_names(path: &str) -> (&str, &str, &str) {
    let name = path.strip_prefix('/').unwrap_or(path);
    let (service, method) = name.split_once('/').unwrap_or((name, ""));
    (name, service, method)
}

/// The headers of a gRPC call, read by the propagator (gRPC metadata is HTTP/2 headers).
struct Metadata<'a>(&'a http::HeaderMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;

    use super::*;

    #[test]
    fn the_propagator_reads_traceparent_from_grpc_metadata() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            http::HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let cx = TraceContextPropagator::new().extract(&Metadata(&headers));
        let remote = cx.span().span_context().clone();
        assert!(remote.is_remote());
        assert_eq!(remote.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(remote.span_id().to_string(), "b7ad6b7169203331");
        assert!(remote.is_sampled());
    }

    #[test]
    fn rpc_names_follow_the_rpc_conventions() {
        assert_eq!(
            rpc_names("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
            (
                "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                "envoy.service.ratelimit.v3.RateLimitService",
                "ShouldRateLimit"
            )
        );
        assert_eq!(rpc_names("/no-method"), ("no-method", "no-method", ""));
        assert_eq!(rpc_names(""), ("", "", ""));
    }
}
