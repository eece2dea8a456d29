//! How to reach Redis: the URL, the timeout bounding every call, the pool, whose clock decides, and TLS files; and
//! the connection pool they make.

use std::path::PathBuf;
use std::time::Duration;

use fred::clients::Pool;
use fred::types::Builder;
use fred::types::config::{Config, ReconnectPolicy, TlsConnector};

use crate::pem::{self as tls, TlsError};
use crate::store::StoreError;

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// `redis://`, `rediss://`, `redis-cluster://` or `redis-sentinel://` URL.
    pub url: String,
    /// The bound on every store call, connection included.
    pub timeout: Duration,
    /// Connections (fred clients), each pipelining many requests.
    pub pool_size: usize,
    /// Decide by Redis's own clock (`TIME` in the script), one clock for every sluice instance. Tests turn it off to
    /// drive time themselves.
    pub server_time: bool,
    /// Files for TLS to Redis; only with a `rediss` URL.
    pub tls: RedisTls,
}

/// TLS to Redis beyond what a `rediss://` URL gives (the system's roots, no client certificate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM CA certificates to trust instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain, for a Redis with `tls-auth-clients`; needs `key`.
    pub cert: Option<PathBuf>,
    /// The client certificate's PEM private key; needs `cert`.
    pub key: Option<PathBuf>,
}

impl RedisTls {
    /// Whether any file is given.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// The rustls client configuration the files describe.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let roots = match &self.ca {
            Some(ca) => tls::load_roots("redis tls ca", ca)?,
            None => tls::native_roots(),
        };
        let builder = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(format!("redis tls: {e}")))?
            .with_root_certificates(roots);
        match (&self.cert, &self.key) {
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(cert), Some(key)) => {
                let chain = tls::load_certs("redis tls certificate", cert)?;
                let private = tls::load_key("redis tls key", key)?;
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| TlsError::Pair {
                        what: "redis tls key",
                        cert: cert.clone(),
                        key: key.clone(),
                        reason: e.to_string(),
                    })
            }
            (Some(_), None) => Err(TlsError::Config("redis tls: a client certificate needs its key".into())),
            (None, Some(_)) => Err(TlsError::Config("redis tls: a client key needs its certificate".into())),
        }
    }
}

/// The connections to the server `config` names, not yet connecting. Every command is bounded by `timeout`; a
/// server that cannot be reached, at start as later, is retried in the background.
pub(super) fn build_pool(config: Config, timeout: Duration, size: usize) -> Result<Pool, StoreError> {
    builder(config, timeout)
        .build_pool(size.max(1))
        .map_err(|e| StoreError::Other(e.details().to_string()))
}

/// The settings every connection to the store shares: the command pool's and the notices' subscriber.
pub(super) fn builder(mut config: Config, timeout: Duration) -> Builder {
    // Keep retrying a server that is down at start instead of failing for good (fred's default).
    config.fail_fast = false;
    let mut builder = Builder::from_config(config);
    builder
        .with_performance_config(|p| p.default_command_timeout = timeout)
        .with_connection_config(|c| {
            c.connection_timeout = timeout.max(Duration::from_millis(500));
            c.internal_command_timeout = timeout.max(Duration::from_millis(500));
            // A write that failed mid-flight may have been applied: never resend it.
            c.max_command_attempts = 1;
            // Requests and answers are small and latency is the product: no Nagle delay on the socket.
            c.tcp.nodelay = Some(true);
        })
        // Retry forever, backing off to at most 500 ms: after a failover the new primary is found within half a
        // second of its promotion, at the cost of a cheap connection attempt twice a second while Redis is down.
        .set_policy(ReconnectPolicy::new_exponential(0, 50, 500, 2));
    builder
}

/// fred's configuration of `settings`: the URL, and the TLS files when given (which need a TLS URL).
pub(super) fn config_of(settings: &RedisSettings) -> Result<Config, StoreError> {
    let mut config = Config::from_url(&settings.url).map_err(|e| {
        StoreError::Other(format!(
            "invalid redis url '{}': {}",
            redact(&settings.url),
            e.details()
        ))
    })?;
    if settings.tls.is_set() {
        if !config.uses_tls() {
            return Err(StoreError::Other(format!(
                "redis tls files need a TLS url (rediss://, rediss-cluster://, rediss-sentinel://), not '{}'",
                redact(&settings.url)
            )));
        }
        let client = settings
            .tls
            .client_config()
            .map_err(|e| StoreError::Other(e.to_string()))?;
        config.tls = Some(TlsConnector::from(client).into());
    }
    Ok(config)
}

/// The URL with its password, if any, replaced by `***`.
pub(super) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    let Some(at) = url[scheme_end..authority_end].rfind('@').map(|i| scheme_end + i) else {
        return url.to_string();
    };
    match url[scheme_end..at].find(':').map(|i| scheme_end + i) {
        Some(colon) => format!("{}:***{}", &url[..colon], &url[at..]),
        None => url.to_string(),
    }
}
