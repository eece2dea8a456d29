//! Where the rules come from: files (`--config`, reloaded when they change) or an xDS management server
//! (`--xds-server` and its node, TLS, backoff and size flags), and whether files of one domain merge.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::cli::values::parse_ratio;
use crate::rules::Domains;
use crate::server::RuleSource;
use crate::sources::xds::{self, Backoff, XdsSettings, XdsTls};

/// `serve`'s flags for the source of the rules.
#[derive(Debug, Args)]
pub(super) struct RuleFlags {
    /// A YAML file, or a directory of *.yaml/*.yml files (one domain per file). Required unless --xds-server.
    #[arg(
        long,
        env = "SLUICE_CONFIG",
        required_unless_present = "xds_server",
        conflicts_with = "xds_server"
    )]
    pub(super) config: Option<PathBuf>,
    /// Take the rules from this xDS management server (Envoy Gateway) instead of files: http://host:port, or
    /// https://host:port for TLS. An ADS client, state of the world, for RateLimitConfig resources.
    #[arg(long, env = "SLUICE_XDS_SERVER", value_parser = clap::value_parser!(xds::ServerUrl))]
    pub(super) xds_server: Option<xds::ServerUrl>,
    /// The node id sent to the xDS server (which keys its snapshots on it).
    #[arg(
        long,
        env = "SLUICE_XDS_NODE_ID",
        default_value = "default",
        conflicts_with = "config"
    )]
    pub(super) xds_node_id: String,
    /// Node metadata sent to the xDS server: comma-separated key:value or key=value.
    #[arg(long, env = "SLUICE_XDS_NODE_METADATA", value_parser = clap::value_parser!(xds::NodeMetadata), conflicts_with = "config")]
    pub(super) xds_node_metadata: Option<xds::NodeMetadata>,
    /// An extra header (gRPC metadata) on the xDS stream, name:value; repeat it, or separate with commas.
    #[arg(long, env = "SLUICE_XDS_HEADER", value_delimiter = ',', value_parser = clap::value_parser!(xds::Header), conflicts_with = "config")]
    pub(super) xds_header: Vec<xds::Header>,
    /// PEM CA certificates to trust for an https:// xDS server, instead of the system's roots.
    #[arg(long, env = "SLUICE_XDS_TLS_CA", conflicts_with = "config")]
    pub(super) xds_tls_ca: Option<PathBuf>,
    /// PEM client certificate for the xDS server (mutual TLS); needs --xds-tls-key.
    #[arg(
        long,
        env = "SLUICE_XDS_TLS_CERT",
        requires = "xds_tls_key",
        conflicts_with = "config"
    )]
    pub(super) xds_tls_cert: Option<PathBuf>,
    /// PEM private key of --xds-tls-cert.
    #[arg(
        long,
        env = "SLUICE_XDS_TLS_KEY",
        requires = "xds_tls_cert",
        conflicts_with = "config"
    )]
    pub(super) xds_tls_key: Option<PathBuf>,
    /// The name the xDS server's certificate must carry, instead of the host of --xds-server.
    #[arg(long, env = "SLUICE_XDS_TLS_SAN", conflicts_with = "config")]
    pub(super) xds_tls_san: Option<String>,
    /// First delay before reconnecting to the xDS server, in milliseconds; it doubles per failed attempt.
    #[arg(long, env = "SLUICE_XDS_BACKOFF_INITIAL_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000), conflicts_with = "config")]
    pub(super) xds_backoff_initial_ms: u64,
    /// Longest delay before reconnecting to the xDS server, in milliseconds (at least the initial delay).
    #[arg(long, env = "SLUICE_XDS_BACKOFF_MAX_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000), conflicts_with = "config")]
    pub(super) xds_backoff_max_ms: u64,
    /// Each reconnection delay is spread by up to this share of itself, either way (0: none).
    #[arg(long, env = "SLUICE_XDS_BACKOFF_RANDOM_FACTOR", default_value_t = 0.5, value_parser = parse_ratio, conflicts_with = "config")]
    pub(super) xds_backoff_random_factor: f64,
    /// The largest response accepted from the xDS server, in bytes.
    #[arg(long, env = "SLUICE_XDS_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=1_073_741_824), conflicts_with = "config")]
    pub(super) xds_max_message_bytes: u64,
    /// Files of one domain merge into one tree, as the reference does under MERGE_DOMAIN_CONFIG (a top-level
    /// descriptor defined in two files is an error naming both). Without it a domain in two files is an error.
    #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
    pub(super) merge_domains: bool,
}

impl RuleFlags {
    /// The xDS server's settings when one is given, else the files.
    pub(super) fn source(self) -> RuleSource {
        match (self.xds_server, self.config) {
            (Some(server), _) => RuleSource::Xds(Box::new(XdsSettings {
                server,
                node_id: self.xds_node_id,
                node_metadata: self.xds_node_metadata.unwrap_or_default(),
                headers: self.xds_header,
                tls: XdsTls {
                    ca: self.xds_tls_ca,
                    cert: self.xds_tls_cert,
                    key: self.xds_tls_key,
                    san: self.xds_tls_san,
                },
                backoff: Backoff::new(
                    Duration::from_millis(self.xds_backoff_initial_ms),
                    Duration::from_millis(self.xds_backoff_max_ms),
                    self.xds_backoff_random_factor,
                ),
                max_message_bytes: self.xds_max_message_bytes as usize,
            })),
            (None, config) => RuleSource::Files(config.unwrap_or_default()),
        }
    }
}

/// Whether files of one domain merge (`--merge-domains`, on `serve` and `check`).
pub(super) fn domains(merge: bool) -> Domains {
    if merge { Domains::Merged } else { Domains::OnePerFile }
}
