//! What sluice tells about itself: logs, traces exported over OTLP, and what the metrics count (hits near the limit,
//! the top offenders).

use clap::Args;

use crate::cli::values::parse_ratio;
use crate::operations::telemetry::{LogFormat, OtlpProtocol, TelemetrySettings};

/// `serve`'s flags for the telemetry.
#[derive(Debug, Args)]
pub(super) struct TelemetryFlags {
    /// Log line format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "text")]
    pub(super) log_format: LogFormat,
    /// Log filter when RUST_LOG is not set: a level (error, warn, info, debug, trace) or tracing directives.
    #[arg(long, env = "SLUICE_LOG_LEVEL", default_value = "info")]
    pub(super) log_level: String,
    /// Base URL of an OTLP collector to export traces to (as OTEL_EXPORTER_OTLP_ENDPOINT, which is read without it).
    #[arg(long, env = "SLUICE_OTLP_ENDPOINT")]
    pub(super) otlp_endpoint: Option<String>,
    /// OTLP transport; without it OTEL_EXPORTER_OTLP_PROTOCOL (grpc or http/protobuf), else grpc.
    #[arg(long, env = "SLUICE_OTLP_PROTOCOL", value_enum)]
    pub(super) otlp_protocol: Option<OtlpProtocol>,
    /// service.name of the exported spans (default: OTEL_SERVICE_NAME, else sluice).
    #[arg(long, env = "SLUICE_OTLP_SERVICE_NAME")]
    pub(super) otlp_service_name: Option<String>,
    /// More resource attributes of the exported spans, as key=value,key=value.
    #[arg(long, env = "SLUICE_OTLP_RESOURCE_ATTRIBUTES", value_parser = parse_attributes)]
    pub(super) otlp_resource_attributes: Option<Attributes>,
    /// Share of traces sampled, 0 to 1, following the caller's sampling decision when there is one.
    #[arg(long, env = "SLUICE_OTLP_SAMPLING_RATIO", value_parser = parse_ratio)]
    pub(super) otlp_sampling_ratio: Option<f64>,
    /// A hit is "near the limit" in metrics when the count after it exceeds this share of the limit.
    #[arg(long, env = "SLUICE_NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_ratio)]
    pub(super) near_limit_ratio: f64,
    /// Values kept per rule in each bucket of top offenders (the values hit and denied most, at GET /offenders and
    /// sluice.v1 GetTopOffenders); 0 tracks none.
    #[arg(long, env = "SLUICE_TOP_OFFENDERS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub(super) top_offenders: u64,
}

impl TelemetryFlags {
    /// The logs' and the traces' settings.
    pub(super) fn settings(&self) -> TelemetrySettings {
        TelemetrySettings {
            format: self.log_format,
            level: self.log_level.clone(),
            endpoint: self.otlp_endpoint.clone(),
            protocol: self.otlp_protocol,
            service_name: self.otlp_service_name.clone(),
            resource_attributes: self.otlp_resource_attributes.clone().map(|a| a.0).unwrap_or_default(),
            sampling_ratio: self.otlp_sampling_ratio,
        }
    }
}

/// `--otlp-resource-attributes`, parsed.
#[derive(Debug, Clone)]
pub(super) struct Attributes(Vec<(String, String)>);

/// `key=value,key=value`; empty pairs are skipped.
fn parse_attributes(s: &str) -> Result<Attributes, String> {
    s.split(',')
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => Err(format!("'{kv}' is not key=value")),
        })
        .collect::<Result<_, _>>()
        .map(Attributes)
}
