//! The `sluice` binary: parses the command line, sets up logs, and runs the server or checks a configuration.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sluice::breaker::BreakerSettings;
use sluice::faces::headers::{HeaderMode, LegacyNames, ResponseHeaders};
use sluice::limiter::{Caps, LimiterSettings};
use sluice::metrics::Metrics;
use sluice::operations::telemetry::{self, LogFormat, OtlpProtocol, TelemetrySettings};
use sluice::operations::tls::ServerTlsFiles;
use sluice::quota::QuotaCaps;
use sluice::regions::RegionSettings;
use sluice::rules::FailurePolicy;
use sluice::rules::{Domains, RuleSet};
use sluice::server::{self, ServeOptions, Settings};
use sluice::sources::compat::{self, Translation};
use sluice::store::redis::{RedisSettings, RedisTls};

/// glibc's allocator spends a fifth of a decision's CPU time under load (measured with perf); mimalloc far less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Hands back to the system the pages mimalloc keeps after they are freed: after loading a large configuration, a
/// thread that then idles would keep the memory of the parse and of the replaced rules resident.
fn release_freed_memory() {
    // SAFETY: mi_collect only returns memory that is free; it may be called at any time, from any thread.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// A rate-limit decision service, wire-compatible with Envoy's rate limit service.
///
/// A flag given twice takes its last value, so that the command line wins over the flags the compatibility mode
/// derives from the environment.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the gRPC rate limit services and the HTTP endpoints.
    Serve(Box<ServeArgs>),
    /// Validate a configuration and print its domains and rules; exit 1 with the error otherwise.
    Check {
        /// A YAML file, or a directory of *.yaml/*.yml files (one domain per file).
        #[arg(long, env = "SLUICE_CONFIG")]
        config: PathBuf,
        /// Files of one domain merge into one tree (a top-level descriptor defined twice is an error).
        #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
        merge_domains: bool,
    },
    /// Replay traffic (a shape or a CSV trace) through the decision core once per candidate algorithm, and write
    /// what each did to it: report.html with charts, summary.csv, per_second.csv.
    Simulate {
        /// The rules: a YAML file, or a directory of them.
        #[arg(long)]
        config: PathBuf,
        /// The traffic: a YAML file describing a shape, or naming a CSV trace (see docs/src/simulate.md).
        #[arg(long)]
        traffic: PathBuf,
        /// A candidate algorithm besides the rule's own; repeat, or separate with commas.
        #[arg(long = "algorithm", value_delimiter = ',')]
        algorithms: Vec<String>,
        /// Where the report is written (created when missing).
        #[arg(long, default_value = "simulate-report")]
        out: PathBuf,
    },
}

/// `--failure-policy`, spelled as in the YAML files (`fail_open`) or with dashes (`fail-open`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Policy {
    #[value(name = "fail-open", alias = "fail_open")]
    FailOpen,
    #[value(name = "fail-closed", alias = "fail_closed")]
    FailClosed,
    Error,
}

impl From<Policy> for FailurePolicy {
    fn from(p: Policy) -> FailurePolicy {
        match p {
            Policy::FailOpen => FailurePolicy::FailOpen,
            Policy::FailClosed => FailurePolicy::FailClosed,
            Policy::Error => FailurePolicy::Error,
        }
    }
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// A YAML file, or a directory of *.yaml/*.yml files (one domain per file). Required unless --xds-server.
    #[arg(
        long,
        env = "SLUICE_CONFIG",
        required_unless_present = "xds_server",
        conflicts_with = "xds_server"
    )]
    config: Option<PathBuf>,
    /// Take the rules from this xDS management server (Envoy Gateway) instead of files: http://host:port, or
    /// https://host:port for TLS. An ADS client, state of the world, for RateLimitConfig resources.
    #[arg(long, env = "SLUICE_XDS_SERVER", value_parser = clap::value_parser!(sluice::sources::xds::ServerUrl))]
    xds_server: Option<sluice::sources::xds::ServerUrl>,
    /// The node id sent to the xDS server (which keys its snapshots on it).
    #[arg(
        long,
        env = "SLUICE_XDS_NODE_ID",
        default_value = "default",
        conflicts_with = "config"
    )]
    xds_node_id: String,
    /// Node metadata sent to the xDS server: comma-separated key:value or key=value.
    #[arg(long, env = "SLUICE_XDS_NODE_METADATA", value_parser = clap::value_parser!(sluice::sources::xds::NodeMetadata), conflicts_with = "config")]
    xds_node_metadata: Option<sluice::sources::xds::NodeMetadata>,
    /// An extra header (gRPC metadata) on the xDS stream, name:value; repeat it, or separate with commas.
    #[arg(long, env = "SLUICE_XDS_HEADER", value_delimiter = ',', value_parser = clap::value_parser!(sluice::sources::xds::Header), conflicts_with = "config")]
    xds_header: Vec<sluice::sources::xds::Header>,
    /// PEM CA certificates to trust for an https:// xDS server, instead of the system's roots.
    #[arg(long, env = "SLUICE_XDS_TLS_CA", conflicts_with = "config")]
    xds_tls_ca: Option<PathBuf>,
    /// PEM client certificate for the xDS server (mutual TLS); needs --xds-tls-key.
    #[arg(
        long,
        env = "SLUICE_XDS_TLS_CERT",
        requires = "xds_tls_key",
        conflicts_with = "config"
    )]
    xds_tls_cert: Option<PathBuf>,
    /// PEM private key of --xds-tls-cert.
    #[arg(
        long,
        env = "SLUICE_XDS_TLS_KEY",
        requires = "xds_tls_cert",
        conflicts_with = "config"
    )]
    xds_tls_key: Option<PathBuf>,
    /// The name the xDS server's certificate must carry, instead of the host of --xds-server.
    #[arg(long, env = "SLUICE_XDS_TLS_SAN", conflicts_with = "config")]
    xds_tls_san: Option<String>,
    /// First delay before reconnecting to the xDS server, in milliseconds; it doubles per failed attempt.
    #[arg(long, env = "SLUICE_XDS_BACKOFF_INITIAL_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000), conflicts_with = "config")]
    xds_backoff_initial_ms: u64,
    /// Longest delay before reconnecting to the xDS server, in milliseconds (at least the initial delay).
    #[arg(long, env = "SLUICE_XDS_BACKOFF_MAX_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000), conflicts_with = "config")]
    xds_backoff_max_ms: u64,
    /// Each reconnection delay is spread by up to this share of itself, either way (0: none).
    #[arg(long, env = "SLUICE_XDS_BACKOFF_RANDOM_FACTOR", default_value_t = 0.5, value_parser = parse_ratio, conflicts_with = "config")]
    xds_backoff_random_factor: f64,
    /// The largest response accepted from the xDS server, in bytes.
    #[arg(long, env = "SLUICE_XDS_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=1_073_741_824), conflicts_with = "config")]
    xds_max_message_bytes: u64,
    /// Files of one domain merge into one tree, as the reference does under MERGE_DOMAIN_CONFIG (a top-level
    /// descriptor defined in two files is an error naming both). Without it a domain in two files is an error.
    #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
    merge_domains: bool,
    /// Address of the gRPC server.
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Address of the HTTP admin server (/metrics, /healthz, /readyz, /rlconfig).
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// Address of the JSON API (`POST /json`, the reference's HTTP decision endpoint), with the gRPC listener's TLS
    /// when that has one. Not served unless given.
    #[arg(long, env = "SLUICE_JSON_ADDR")]
    json_addr: Option<SocketAddr>,
    /// Redis URL (redis://, rediss://, redis-cluster://, redis-sentinel://). Without it counters live in memory.
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis_url: Option<String>,
    /// Bound on every Redis call, in milliseconds.
    #[arg(long, env = "SLUICE_REDIS_TIMEOUT_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    redis_timeout_ms: u64,
    /// Redis connections, each pipelining many calls; against one server also the script calls in flight at once
    /// (at least 2), each shared by the requests that waited for it.
    #[arg(long, env = "SLUICE_REDIS_POOL_SIZE", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=256))]
    redis_pool_size: u64,
    /// This region's name: global limits (`global: true`) count every region, this one deciding from its own Redis
    /// and shipping its counts to the others' (--region-redis). Needs --redis-url.
    #[arg(long, env = "SLUICE_REGION", requires = "redis_url")]
    region: Option<String>,
    /// Another region and its Redis, as NAME=URL (repeat the flag, or separate with commas). That Redis takes this
    /// region's counts of global limits; the region's own sluice ships it theirs into --redis-url.
    #[arg(long, env = "SLUICE_REGION_REDIS", value_delimiter = ',', value_parser = parse_region_redis, requires = "region")]
    region_redis: Vec<(String, String)>,
    /// How often counts of global limits are shipped to the other regions, in milliseconds.
    #[arg(long, env = "SLUICE_REGION_INTERVAL_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    region_interval_ms: u64,
    /// The most window counts kept per region while it cannot be reached; what comes past it is dropped and
    /// counted (sluice_region_dropped_total).
    #[arg(long, env = "SLUICE_REGION_BACKLOG", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    region_backlog: u64,
    /// Bound on one shipment to another region's Redis, connection included, in milliseconds.
    #[arg(long, env = "SLUICE_REGION_TIMEOUT_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    region_timeout_ms: u64,
    /// PEM CA certificates to trust for a rediss:// URL, instead of the system's roots.
    #[arg(long, env = "SLUICE_REDIS_TLS_CA", requires = "redis_url")]
    redis_tls_ca: Option<PathBuf>,
    /// PEM client certificate for Redis (tls-auth-clients); needs --redis-tls-key.
    #[arg(long, env = "SLUICE_REDIS_TLS_CERT", requires_all = ["redis_url", "redis_tls_key"])]
    redis_tls_cert: Option<PathBuf>,
    /// PEM private key of --redis-tls-cert.
    #[arg(long, env = "SLUICE_REDIS_TLS_KEY", requires = "redis_tls_cert")]
    redis_tls_key: Option<PathBuf>,
    /// PEM certificate chain for TLS on the gRPC listener; needs --grpc-tls-key. Re-read when the file changes.
    #[arg(long, env = "SLUICE_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert. Re-read when the file changes.
    #[arg(long, env = "SLUICE_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    grpc_tls_key: Option<PathBuf>,
    /// PEM CA certificates: gRPC clients must present a certificate they signed (mutual TLS).
    #[arg(long, env = "SLUICE_GRPC_TLS_CLIENT_CA", requires = "grpc_tls_cert")]
    grpc_tls_client_ca: Option<PathBuf>,
    /// Threads that serve requests (0: one per CPU the process may use, its cgroup's quota included, but a single
    /// one with two CPUs or fewer). Where sluice shares its cores with Redis or other busy processes, fewer threads
    /// cost less CPU per decision; 1 is the cheapest (one scheduler that batches answers).
    #[arg(long, env = "SLUICE_WORKER_THREADS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1024))]
    worker_threads: u64,
    /// Prefix of every counter key; may not contain '{' or '}'.
    #[arg(long, env = "SLUICE_KEY_PREFIX", default_value = "sluice:", value_parser = parse_prefix)]
    key_prefix: String,
    /// Answer OK whatever the limits say (statuses still report OVER_LIMIT).
    #[arg(long, env = "SLUICE_SHADOW_MODE")]
    shadow_mode: bool,
    /// Merge the `metadata` of the rules that passed into the response's dynamic_metadata.
    #[arg(long, env = "SLUICE_RESPONSE_METADATA")]
    response_metadata: bool,
    /// What to answer when Redis fails or times out, for domains whose file does not set `failure_policy`.
    #[arg(long, env = "SLUICE_FAILURE_POLICY", value_enum, default_value = "error")]
    failure_policy: Policy,
    /// Consecutive failed Redis calls that open the circuit breaker (0: never open it).
    #[arg(long, env = "SLUICE_BREAKER_FAILURES", default_value_t = 5)]
    breaker_failures: u32,
    /// How long the open breaker answers by the failure policy before probing Redis again, in milliseconds.
    #[arg(long, env = "SLUICE_BREAKER_COOLDOWN_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    breaker_cooldown_ms: u64,
    /// Over-limit descriptors remembered locally until their retry time (0: no local cache).
    #[arg(long, env = "SLUICE_LOCAL_CACHE_SIZE", default_value_t = 100_000)]
    local_cache_size: usize,
    /// Most descriptors in one request.
    #[arg(long, env = "SLUICE_MAX_DESCRIPTORS", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    max_descriptors: u64,
    /// Most entries in one descriptor.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    max_entries: u64,
    /// Most bytes in one entry key or value, or in the domain.
    #[arg(long, env = "SLUICE_MAX_VALUE_BYTES", default_value_t = 4_096, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    max_value_bytes: u64,
    /// Most bytes in one encoded request.
    #[arg(long, env = "SLUICE_MAX_REQUEST_BYTES", default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(64..=4_194_304))]
    max_request_bytes: u64,
    /// Most calls waiting for a permit at once (sluice.v1 WaitForPermit); past it a call is refused with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "SLUICE_MAX_WAITERS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_waiters: u64,
    /// Values kept per rule in each bucket of top offenders (the values hit and denied most, at GET /offenders and
    /// sluice.v1 GetTopOffenders); 0 tracks none.
    #[arg(long, env = "SLUICE_TOP_OFFENDERS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    top_offenders: u64,
    /// Most RLQS streams open at once (Envoy's rate limit quota filter keeps one per Envoy and filter config).
    #[arg(long, env = "SLUICE_RLQS_MAX_STREAMS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    rlqs_max_streams: u64,
    /// Most buckets one RLQS stream may report.
    #[arg(long, env = "SLUICE_RLQS_MAX_BUCKETS", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    rlqs_max_buckets: u64,
    /// Rate limit headers to add to responses (response_headers_to_add), for the most constrained status.
    #[arg(long, env = "SLUICE_RESPONSE_HEADERS", value_enum, default_value = "off")]
    response_headers: HeaderMode,
    /// A hit is "near the limit" in metrics when the count after it exceeds this share of the limit.
    #[arg(long, env = "SLUICE_NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_ratio)]
    near_limit_ratio: f64,
    /// Seconds in-flight calls may take to finish after SIGTERM/SIGINT.
    #[arg(long, env = "SLUICE_GRACE_PERIOD_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3_600))]
    grace_period_secs: u64,
    /// Enables the admin calls (Reset, the list calls, GetTopOffenders) for callers presenting this token
    /// (`authorization: Bearer <token>`); GET /offenders then needs it too.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Log line format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Log filter when RUST_LOG is not set: a level (error, warn, info, debug, trace) or tracing directives.
    #[arg(long, env = "SLUICE_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Base URL of an OTLP collector to export traces to (as OTEL_EXPORTER_OTLP_ENDPOINT, which is read without it).
    #[arg(long, env = "SLUICE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// OTLP transport; without it OTEL_EXPORTER_OTLP_PROTOCOL (grpc or http/protobuf), else grpc.
    #[arg(long, env = "SLUICE_OTLP_PROTOCOL", value_enum)]
    otlp_protocol: Option<OtlpProtocol>,
    /// service.name of the exported spans (default: OTEL_SERVICE_NAME, else sluice).
    #[arg(long, env = "SLUICE_OTLP_SERVICE_NAME")]
    otlp_service_name: Option<String>,
    /// More resource attributes of the exported spans, as key=value,key=value.
    #[arg(long, env = "SLUICE_OTLP_RESOURCE_ATTRIBUTES", value_parser = parse_attributes)]
    otlp_resource_attributes: Option<Attributes>,
    /// Share of traces sampled, 0 to 1, following the caller's sampling decision when there is one.
    #[arg(long, env = "SLUICE_OTLP_SAMPLING_RATIO", value_parser = parse_ratio)]
    otlp_sampling_ratio: Option<f64>,
    /// Serve Prometheus metrics on a listener of their own too (the admin listener keeps /metrics).
    #[arg(long, env = "SLUICE_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Path of the metrics on --metrics-addr.
    #[arg(long, env = "SLUICE_METRICS_PATH", default_value = "/metrics", value_parser = parse_path, requires = "metrics_addr")]
    metrics_path: String,
    /// Name of the legacy limit header (--response-headers legacy or both).
    #[arg(long, env = "SLUICE_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = sluice::faces::headers::check_name)]
    limit_header: String,
    /// Name of the legacy remaining header.
    #[arg(long, env = "SLUICE_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = sluice::faces::headers::check_name)]
    remaining_header: String,
    /// Name of the legacy reset header.
    #[arg(long, env = "SLUICE_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = sluice::faces::headers::check_name)]
    reset_header: String,
    /// Read the environment variables of another rate limit service: `envoy-ratelimit` reads envoyproxy/ratelimit's
    /// (docs/src/migration.md). Also on when the binary runs as `ratelimit`.
    #[arg(long, env = "SLUICE_COMPAT", value_parser = [sluice::sources::compat::MODE])]
    compat: Option<String>,
}

/// `--otlp-resource-attributes`, parsed.
#[derive(Debug, Clone)]
struct Attributes(Vec<(String, String)>);

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

fn parse_path(s: &str) -> Result<String, String> {
    if s.starts_with('/') && !s.contains(char::is_whitespace) {
        Ok(s.to_string())
    } else {
        Err(format!("'{s}' is not a path (it starts with '/')"))
    }
}

fn parse_prefix(s: &str) -> Result<String, String> {
    sluice::store::check_prefix(s).map(|()| s.to_string())
}

/// `NAME=URL`: another region and its Redis.
fn parse_region_redis(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, url)) if !name.trim().is_empty() && !url.trim().is_empty() => {
            Ok((name.trim().to_string(), url.trim().to_string()))
        }
        _ => Err(format!(
            "'{s}' is not NAME=URL (a region and its Redis, e.g. eu=redis://redis.eu:6379)"
        )),
    }
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("'{s}' is not a ratio between 0 and 1")),
    }
}

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let env = |name: &str| std::env::var(name).ok();
    let mut compat = None;
    if compat::requested(&args, env) {
        let translation = match compat::translate(env) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        // The derived flags go right after `serve`, so that the flags on the command line come later and win. Run
        // as `ratelimit`, the binary serves: the reference takes no command.
        let at = match args.get(1).and_then(|a| a.to_str()) {
            Some("serve") => Some(2),
            Some("check" | "simulate") => None,
            _ => {
                args.insert(1, "serve".into());
                Some(2)
            }
        };
        if let Some(at) = at {
            args.splice(at..at, translation.args.iter().map(OsString::from));
            compat = Some(translation);
        }
    }
    match Cli::parse_from(args).command {
        Command::Check { config, merge_domains } => check(&config, domains(merge_domains)),
        Command::Serve(args) => serve(*args, compat),
        Command::Simulate {
            config,
            traffic,
            algorithms,
            out,
        } => simulate(sluice::simulate::Simulation {
            config,
            traffic,
            algorithms,
            out,
        }),
    }
}

fn simulate(sim: sluice::simulate::Simulation) -> ExitCode {
    match sluice::simulate::run(&sim) {
        Ok(done) => {
            for f in &done.figures {
                let delay = f.delay_ms.map_or(String::new(), |(m, p)| {
                    format!(", queue delay {m:.1} ms mean, {p:.1} ms p99")
                });
                println!(
                    "{}: {} of {} admitted, worst window {} ({:.2}x the limit), {} around window edges, fairness {:.3}{delay}",
                    f.algorithm, f.admitted, f.requests, f.worst_window, f.overshoot, f.edge_burst, f.fairness
                );
            }
            println!(
                "{} requests per algorithm, {:.0} decisions/s; report in {}",
                done.requests,
                done.decisions_per_second,
                sim.out.join("report.html").display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn domains(merge: bool) -> Domains {
    if merge { Domains::Merged } else { Domains::OnePerFile }
}

fn check(config: &std::path::Path, domains: Domains) -> ExitCode {
    let compiled =
        sluice::config::load(config).and_then(|files| RuleSet::compile_owned(files, &Metrics::discarded(0.8), domains));
    match compiled {
        Ok(rules) => {
            print!("{}", rules.summary());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs, compat: Option<Translation>) -> ExitCode {
    // Set once, before anything loads.
    let _ = sluice::sources::reload::AFTER_LOAD.set(release_freed_memory);
    let worker_threads = args.worker_threads;
    let telemetry = TelemetrySettings {
        format: args.log_format,
        level: args.log_level,
        endpoint: args.otlp_endpoint,
        protocol: args.otlp_protocol,
        service_name: args.otlp_service_name,
        resource_attributes: args.otlp_resource_attributes.map(|a| a.0).unwrap_or_default(),
        sampling_ratio: args.otlp_sampling_ratio,
    };
    // Dropped when `serve` returns, after the server has drained: that flushes the last spans.
    let _telemetry = match telemetry::init(&telemetry) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(t) = &compat {
        tracing::info!(read = ?t.read, "envoy-ratelimit compatibility: the reference's variables read");
        for (variable, why) in &t.ignored {
            tracing::warn!(variable, why, "envoy-ratelimit compatibility: variable ignored");
        }
    }
    if let Some(region) = &args.region {
        let others: Vec<String> = args.region_redis.iter().map(|(n, _)| n.clone()).collect();
        if let Err(e) = sluice::regions::check_names(region, &others) {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    let settings = Settings {
        rules: match (args.xds_server, args.config) {
            (Some(server), _) => server::RuleSource::Xds(Box::new(sluice::sources::xds::XdsSettings {
                server,
                node_id: args.xds_node_id,
                node_metadata: args.xds_node_metadata.unwrap_or_default(),
                headers: args.xds_header,
                tls: sluice::sources::xds::XdsTls {
                    ca: args.xds_tls_ca,
                    cert: args.xds_tls_cert,
                    key: args.xds_tls_key,
                    san: args.xds_tls_san,
                },
                backoff: sluice::sources::xds::Backoff::new(
                    Duration::from_millis(args.xds_backoff_initial_ms),
                    Duration::from_millis(args.xds_backoff_max_ms),
                    args.xds_backoff_random_factor,
                ),
                max_message_bytes: args.xds_max_message_bytes as usize,
            })),
            (None, config) => server::RuleSource::Files(config.unwrap_or_default()),
        },
        domains: domains(args.merge_domains),
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
        json_addr: args.json_addr,
        metrics: args.metrics_addr.map(|addr| (addr, args.metrics_path)),
        redis: args.redis_url.map(|url| RedisSettings {
            url,
            timeout: Duration::from_millis(args.redis_timeout_ms),
            pool_size: args.redis_pool_size as usize,
            server_time: true,
            tls: RedisTls {
                ca: args.redis_tls_ca,
                cert: args.redis_tls_cert,
                key: args.redis_tls_key,
            },
        }),
        regions: args.region.map(|name| server::Regions {
            settings: RegionSettings {
                name,
                interval: Duration::from_millis(args.region_interval_ms),
                backlog: args.region_backlog as usize,
                timeout: Duration::from_millis(args.region_timeout_ms),
            },
            others: args.region_redis,
        }),
        limiter: LimiterSettings {
            key_prefix: args.key_prefix,
            shadow_mode: args.shadow_mode,
            response_metadata: args.response_metadata,
            failure_policy: args.failure_policy.into(),
            breaker: BreakerSettings {
                failures: args.breaker_failures,
                cooldown: Duration::from_millis(args.breaker_cooldown_ms),
            },
            local_cache_size: args.local_cache_size,
            caps: Caps {
                max_descriptors: args.max_descriptors as usize,
                max_entries: args.max_entries as usize,
                max_value_bytes: args.max_value_bytes as usize,
                max_request_bytes: args.max_request_bytes as usize,
            },
            max_waiters: args.max_waiters as usize,
            top_offenders: args.top_offenders as usize,
        },
        near_limit_ratio: args.near_limit_ratio,
        serve: ServeOptions {
            grace_period: Duration::from_secs(args.grace_period_secs),
            admin_token: args.admin_token.filter(|t| !t.is_empty()),
            tls: args
                .grpc_tls_cert
                .zip(args.grpc_tls_key)
                .map(|(cert, key)| ServerTlsFiles {
                    cert,
                    key,
                    client_ca: args.grpc_tls_client_ca,
                }),
            response_headers: ResponseHeaders {
                mode: args.response_headers,
                names: LegacyNames {
                    limit: args.limit_header.into(),
                    remaining: args.remaining_header.into(),
                    reset: args.reset_header.into(),
                },
            },
            quota_caps: QuotaCaps {
                max_streams: args.rlqs_max_streams as usize,
                max_buckets_per_stream: args.rlqs_max_buckets as usize,
                max_value_bytes: args.max_value_bytes as usize,
            },
        },
    };
    let runtime = match server::runtime(worker_threads as usize) {
        Ok((rt, threads)) => {
            tracing::info!(threads, "runtime started");
            rt
        }
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(server::run(settings, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sluice stopped");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = term => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
