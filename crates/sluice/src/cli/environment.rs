//! The envoyproxy/ratelimit compatibility mode: the reference's environment variables, read as the reference reads
//! them, turned into sluice's own command-line flags.
//!
//! A deployment built around the reference (its container, its `RUNTIME_*` layout, its `REDIS_*` settings) switches
//! image and nothing else: `sluice serve --compat envoy-ratelimit`, or the binary run under the reference's name
//! (`/bin/ratelimit`), reads them. The translation is a pure function from the environment to flags, so it is
//! tested without a process, and every flag it produces goes through the same parsers as a flag typed by hand.
//! Flags given on the command line still win over the ones it produces.
//!
//! Every variable the reference has is accounted for: it is honoured (mapped onto a flag), refused (its value asks
//! for something sluice cannot do and ignoring it would change what the deployment does, e.g. a memcache backend
//! or a unix-socket gRPC listener), or ignored with a reason logged at start (statsd, the per-second Redis). The
//! docs' migration page (`docs/src/migration.md`) lists the same variables in a table.

use std::time::Duration;

/// What the environment said, as flags for `sluice serve`, and what was read and ignored.
#[derive(Debug, Default, PartialEq)]
pub struct Translation {
    /// Flags and their values, in order.
    pub args: Vec<String>,
    /// The variables that were set and honoured.
    pub read: Vec<&'static str>,
    /// The variables that were set and have no meaning in sluice, with why.
    pub ignored: Vec<(&'static str, &'static str)>,
}

/// A variable whose value cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CompatError {
    #[error("{var}='{value}': {message}")]
    Invalid {
        var: &'static str,
        value: String,
        message: String,
    },
    #[error("{var}='{value}' is not supported: {why}")]
    Unsupported {
        var: &'static str,
        value: String,
        why: &'static str,
    },
}

mod values;
mod variables;
pub use values::parse_duration;
use values::{encode, parse_bool, socket_addr, userinfo};
pub use variables::{HONOURED, IGNORED};

/// Why a variable sluice honours was ignored this time.
const NO_EFFECT: &str = "has no effect in this configuration, as in the reference";

/// Reads the reference's variables through `var` (the process environment, or a map in tests).
pub fn translate(var: impl Fn(&str) -> Option<String>) -> Result<Translation, CompatError> {
    let mut env = Env {
        var: &var,
        out: Translation::default(),
    };
    env.listeners()?;
    env.rules()?;
    env.redis()?;
    env.limits()?;
    env.telemetry()?;
    for (name, why) in IGNORED {
        if env.get(name).is_some() {
            env.out.ignored.push((name, why));
        }
    }
    for name in HONOURED {
        if env.get(name).is_some() && !env.out.read.contains(name) {
            env.out.ignored.push((name, NO_EFFECT));
        }
    }
    Ok(env.out)
}

/// Whether the command line asks for the compatibility mode: the binary runs as `ratelimit` (the reference's
/// `/bin/ratelimit`), or `--compat envoy-ratelimit` (or `SLUICE_COMPAT=envoy-ratelimit`) is given.
pub fn requested(args: &[std::ffi::OsString], var: impl Fn(&str) -> Option<String>) -> bool {
    let runs_as_reference = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|name| name == "ratelimit");
    let flag = args.windows(2).any(|w| w[0] == "--compat" && w[1] == MODE)
        || args.iter().any(|a| a.to_str() == Some("--compat=envoy-ratelimit"));
    runs_as_reference || flag || var("SLUICE_COMPAT").as_deref() == Some(MODE)
}

/// The one compatibility mode there is.
pub const MODE: &str = "envoy-ratelimit";

struct Env<'a, F: Fn(&str) -> Option<String>> {
    var: &'a F,
    out: Translation,
}

impl<F: Fn(&str) -> Option<String>> Env<'_, F> {
    /// A variable's value when it is set to something (the reference treats empty as unset).
    fn get(&self, name: &str) -> Option<String> {
        (self.var)(name).filter(|v| !v.trim().is_empty())
    }

    /// A variable's value, counted as read when set.
    fn read(&mut self, name: &'static str) -> Option<String> {
        let value = self.get(name)?;
        self.out.read.push(name);
        Some(value.trim().to_string())
    }

    fn read_or(&mut self, name: &'static str, default: &str) -> String {
        self.read(name).unwrap_or_else(|| default.to_string())
    }

    fn flag(&mut self, flag: &str, value: impl Into<String>) {
        self.out.args.push(flag.to_string());
        self.out.args.push(value.into());
    }

    /// Passes each variable that is set to its flag, as it is.
    fn pass(&mut self, pairs: &[(&'static str, &str)]) {
        for &(var, flag) in pairs {
            if let Some(value) = self.read(var) {
                self.flag(flag, value);
            }
        }
    }

    fn switch(&mut self, flag: &str) {
        self.out.args.push(flag.to_string());
    }

    fn bool(&mut self, name: &'static str) -> Result<Option<bool>, CompatError> {
        match self.read(name) {
            None => Ok(None),
            Some(v) => parse_bool(&v)
                .map(Some)
                .ok_or_else(|| invalid(name, &v, "not a boolean (true or false)")),
        }
    }

    fn duration(&mut self, name: &'static str) -> Result<Option<Duration>, CompatError> {
        match self.read(name) {
            None => Ok(None),
            Some(v) => parse_duration(&v)
                .map(Some)
                .ok_or_else(|| invalid(name, &v, "not a duration (a number with a unit: 100ms, 10s, 1m)")),
        }
    }

    fn number<T: std::str::FromStr>(&mut self, name: &'static str) -> Result<Option<T>, CompatError> {
        match self.read(name) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| invalid(name, &v, "not a number")),
        }
    }

    fn unsupported_when(
        &mut self,
        name: &'static str,
        is_unsupported: impl Fn(&str) -> bool,
        why: &'static str,
    ) -> Result<(), CompatError> {
        match self.get(name) {
            Some(value) if is_unsupported(value.trim()) => Err(CompatError::Unsupported { var: name, value, why }),
            Some(_) => {
                self.out.read.push(name);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// `HOST`/`PORT` (the JSON API and `/healthcheck`), `GRPC_HOST`/`GRPC_PORT`, `DEBUG_HOST`/`DEBUG_PORT` (the admin
    /// endpoints), the Prometheus listener and gRPC TLS.
    fn listeners(&mut self) -> Result<(), CompatError> {
        let json = self.address(("HOST", "0.0.0.0"), ("PORT", "8080"))?;
        self.flag("--json-addr", json);
        let grpc = self.address(("GRPC_HOST", "0.0.0.0"), ("GRPC_PORT", "8081"))?;
        self.flag("--grpc-addr", grpc);
        let debug = self.address(("DEBUG_HOST", "0.0.0.0"), ("DEBUG_PORT", "6070"))?;
        self.flag("--http-addr", debug);
        self.unsupported_when("GRPC_UDS", |_| true, "gRPC is served on TCP (GRPC_HOST, GRPC_PORT)")?;
        if self.bool("USE_PROMETHEUS")? == Some(true) {
            let addr = self.read_or("PROMETHEUS_ADDR", ":9090");
            let addr = socket_addr(&addr)
                .ok_or_else(|| invalid("PROMETHEUS_ADDR", &addr, "not an address (host:port or :port)"))?;
            self.flag("--metrics-addr", addr);
            let path = self.read_or("PROMETHEUS_PATH", "/metrics");
            self.flag("--metrics-path", path);
        }
        if self.bool("GRPC_SERVER_USE_TLS")? == Some(true) {
            self.pass(&[
                ("GRPC_SERVER_TLS_CERT", "--grpc-tls-cert"),
                ("GRPC_SERVER_TLS_KEY", "--grpc-tls-key"),
                ("GRPC_CLIENT_TLS_CACERT", "--grpc-tls-client-ca"),
            ]);
            self.unsupported_when(
                "GRPC_CLIENT_TLS_SAN",
                |_| true,
                "client certificates are verified against GRPC_CLIENT_TLS_CACERT only; without a SAN check, \
                 ignoring it would admit clients the reference refuses",
            )?;
        }
        Ok(())
    }

    fn address(
        &mut self,
        (host_var, host): (&'static str, &str),
        (port_var, port): (&'static str, &str),
    ) -> Result<String, CompatError> {
        let host = self.read_or(host_var, host);
        let port = self.read_or(port_var, port);
        if port.parse::<u16>().is_err() {
            return Err(invalid(port_var, &port, "not a port number"));
        }
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        match addr.parse::<std::net::SocketAddr>() {
            Ok(a) => Ok(a.to_string()),
            Err(_) => Err(invalid(host_var, &host, "not an IP address")),
        }
    }

    /// Where the rules come from: the runtime directory (`CONFIG_TYPE=FILE`), or xDS (`GRPC_XDS_SOTW`).
    fn rules(&mut self) -> Result<(), CompatError> {
        if self.bool("MERGE_DOMAIN_CONFIG")? == Some(true) {
            self.switch("--merge-domains");
        }
        let kind = self.read_or("CONFIG_TYPE", "FILE");
        match kind.to_ascii_uppercase().as_str() {
            "FILE" => {
                let root = self.read_or("RUNTIME_ROOT", "/srv/runtime_data/current");
                let sub = self.read("RUNTIME_SUBDIRECTORY").unwrap_or_default();
                let app = self.read_or("RUNTIME_APPDIRECTORY", "config");
                let mut dir = std::path::PathBuf::from(root);
                dir.push(sub);
                dir.push(app);
                self.flag("--config", dir.to_string_lossy());
                Ok(())
            }
            "GRPC_XDS_SOTW" => self.xds(),
            _ => Err(invalid("CONFIG_TYPE", &kind, "expected FILE or GRPC_XDS_SOTW")),
        }
    }

    fn xds(&mut self) -> Result<(), CompatError> {
        let tls = self.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS")? == Some(true);
        let server = self.read_or("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000");
        let scheme = if tls { "https" } else { "http" };
        self.flag("--xds-server", format!("{scheme}://{server}"));
        let node = self.read_or("CONFIG_GRPC_XDS_NODE_ID", "default");
        self.flag("--xds-node-id", node);
        if let Some(metadata) = self.read("CONFIG_GRPC_XDS_NODE_METADATA") {
            self.flag("--xds-node-metadata", metadata);
        }
        if let Some(headers) = self.read("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") {
            for header in headers.split(',').filter(|h| !h.trim().is_empty()) {
                self.flag("--xds-header", header.trim());
            }
        }
        if tls {
            self.pass(&[
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--xds-tls-ca"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--xds-tls-cert"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--xds-tls-key"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "--xds-tls-san"),
            ]);
        }
        // The reference waits CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL before retrying a failed connection and
        // backs off between stream errors; sluice has one backoff for both, starting at the retry interval.
        let initial = match self.duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")? {
            Some(d) => Some(d),
            None => self.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")?,
        };
        if let Some(d) = initial {
            self.flag("--xds-backoff-initial-ms", d.as_millis().max(1).to_string());
        }
        if let Some(d) = self.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL")? {
            self.flag("--xds-backoff-max-ms", d.as_millis().max(1).to_string());
        }
        let jitter = self.bool("XDS_CLIENT_BACKOFF_JITTER")?;
        let factor = self.number::<f64>("XDS_CLIENT_BACKOFF_RANDOM_FACTOR")?;
        match (jitter, factor) {
            (Some(false), _) => self.flag("--xds-backoff-random-factor", "0"),
            (_, Some(f)) => self.flag("--xds-backoff-random-factor", f.to_string()),
            _ => {}
        }
        if let Some(bytes) = self.number::<u64>("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")? {
            self.flag("--xds-max-message-bytes", bytes.to_string());
        }
        Ok(())
    }

    /// `BACKEND_TYPE`, `REDIS_*`: one Redis URL, its TLS files, pool and timeout.
    fn redis(&mut self) -> Result<(), CompatError> {
        self.unsupported_when(
            "BACKEND_TYPE",
            |v| !v.eq_ignore_ascii_case("redis"),
            "the counters are kept in Redis",
        )?;
        self.unsupported_when("MEMCACHE_HOST_PORT", |_| true, "memcache is not supported; use Redis")?;
        self.unsupported_when("MEMCACHE_SRV", |_| true, "memcache is not supported; use Redis")?;
        let socket = self.read_or("REDIS_SOCKET_TYPE", "unix");
        let kind = self.read_or("REDIS_TYPE", "SINGLE");
        let url = self.read_or("REDIS_URL", "/var/run/nutcracker/ratelimit.sock");
        let tls = self.bool("REDIS_TLS")? == Some(true);
        let auth = self.read("REDIS_AUTH").map(|a| userinfo(&a)).unwrap_or_default();
        let redis_url = self.redis_url(socket, &kind, &url, tls, &auth)?;
        self.flag("--redis-url", redis_url);
        if tls {
            self.pass(&[
                ("REDIS_TLS_CACERT", "--redis-tls-ca"),
                ("REDIS_TLS_CLIENT_CERT", "--redis-tls-cert"),
                ("REDIS_TLS_CLIENT_KEY", "--redis-tls-key"),
            ]);
        }
        if let Some(size) = self.number::<u64>("REDIS_POOL_SIZE")? {
            self.flag("--redis-pool-size", size.clamp(1, 256).to_string());
        }
        if let Some(timeout) = self.duration("REDIS_TIMEOUT")? {
            let ms = timeout.as_millis().clamp(1, 60_000);
            self.flag("--redis-timeout-ms", ms.to_string());
        }
        Ok(())
    }

    /// The URL of the Redis the reference's variables name: `REDIS_SOCKET_TYPE` and `REDIS_TYPE` say how `url` (a
    /// socket path, host:port, or a list of them) is to be read; `auth` is the userinfo of `REDIS_AUTH`.
    fn redis_url(
        &mut self,
        socket: String,
        kind: &str,
        url: &str,
        tls: bool,
        auth: &str,
    ) -> Result<String, CompatError> {
        let s = if tls { "s" } else { "" };
        match (socket.to_ascii_lowercase().as_str(), kind.to_ascii_lowercase().as_str()) {
            ("unix", "single") => {
                if tls {
                    return Err(CompatError::Unsupported {
                        var: "REDIS_TLS",
                        value: "true".into(),
                        why: "TLS over a unix socket",
                    });
                }
                // fred wants a host before the path when the URL carries credentials.
                let host = if auth.is_empty() { "" } else { "localhost" };
                Ok(format!("redis+unix://{auth}{host}{}", url.trim()))
            }
            ("unix", _) => Err(CompatError::Unsupported {
                var: "REDIS_SOCKET_TYPE",
                value: socket,
                why: "a sentinel or cluster is reached over tcp (REDIS_SOCKET_TYPE=tcp)",
            }),
            ("tcp", "single") => Ok(format!("redis{s}://{auth}{}", url.trim())),
            ("tcp", "cluster") => {
                let list: Vec<&str> = url.split(',').collect();
                let rest = if list.len() > 1 {
                    format!("?{}", nodes(&list[1..]))
                } else {
                    String::new()
                };
                Ok(format!("redis{s}-cluster://{auth}{}{rest}", list[0].trim()))
            }
            ("tcp", "sentinel") => self.sentinel_url(s, url, auth),
            ("tcp", _) => Err(invalid("REDIS_TYPE", kind, "expected SINGLE, SENTINEL or CLUSTER")),
            _ => Err(invalid("REDIS_SOCKET_TYPE", &socket, "expected tcp or unix")),
        }
    }

    /// A sentinel's URL from `url`, the master's name then the sentinels, and `REDIS_SENTINEL_AUTH`; `s` is "s" for
    /// TLS.
    fn sentinel_url(&mut self, s: &str, url: &str, auth: &str) -> Result<String, CompatError> {
        let list: Vec<&str> = url.split(',').collect();
        if list.len() < 2 {
            return Err(invalid(
                "REDIS_URL",
                url,
                "a sentinel URL is the master's name then the sentinels: name,host:port[,host:port...]",
            ));
        }
        let mut query = format!("sentinelServiceName={}", list[0].trim());
        if list.len() > 2 {
            query = format!("{query}&{}", nodes(&list[2..]));
        }
        if let Some(sentinel) = self.read("REDIS_SENTINEL_AUTH") {
            let (user, pass) = sentinel.split_once(':').unwrap_or(("", &sentinel));
            if !user.is_empty() {
                query = format!("{query}&sentinelUsername={}", encode(user));
            }
            query = format!("{query}&sentinelPassword={}", encode(pass));
        }
        Ok(format!("redis{s}-sentinel://{auth}{}?{query}", list[1].trim()))
    }

    /// The decision's settings: cache, prefix, near-limit ratio, shadow mode, metadata, response headers.
    fn limits(&mut self) -> Result<(), CompatError> {
        // The reference sizes its cache in bytes, and has none by default; sluice counts entries, each about 128
        // bytes.
        let bytes = self.number::<u64>("LOCAL_CACHE_SIZE_IN_BYTES")?.unwrap_or(0);
        self.flag("--local-cache-size", (bytes / 128).to_string());
        if let Some(ratio) = self.read("NEAR_LIMIT_RATIO") {
            self.flag("--near-limit-ratio", ratio);
        }
        // The reference's keys, with its prefix (none unless set), so counts carry over at the switch.
        let prefix = self.read("CACHE_KEY_PREFIX").unwrap_or_default();
        if let Err(e) = sluice_core::store::check_prefix(&prefix) {
            return Err(invalid("CACHE_KEY_PREFIX", &prefix, &e));
        }
        self.flag("--key-prefix", prefix);
        self.flag("--key-layout", "reference".to_string());
        if self.bool("SHADOW_MODE")? == Some(true) {
            self.switch("--shadow-mode");
        }
        if self.bool("RESPONSE_DYNAMIC_METADATA")? == Some(true) {
            self.switch("--response-metadata");
        }
        if self.bool("LIMIT_RESPONSE_HEADERS_ENABLED")? == Some(true) {
            self.flag("--response-headers", "legacy");
        }
        self.pass(&[
            ("LIMIT_LIMIT_HEADER", "--limit-header"),
            ("LIMIT_REMAINING_HEADER", "--remaining-header"),
            ("LIMIT_RESET_HEADER", "--reset-header"),
        ]);
        Ok(())
    }

    /// `LOG_LEVEL`, `LOG_FORMAT` and `TRACING_*`.
    fn telemetry(&mut self) -> Result<(), CompatError> {
        if let Some(level) = self.read("LOG_LEVEL") {
            let filter = match level.to_ascii_lowercase().as_str() {
                "panic" | "fatal" | "error" => "error",
                "warn" | "warning" => "warn",
                "info" => "info",
                "debug" => "debug",
                "trace" => "trace",
                _ => {
                    return Err(invalid(
                        "LOG_LEVEL",
                        &level,
                        "expected trace, debug, info, warn, error, fatal or panic",
                    ));
                }
            };
            self.flag("--log-level", filter);
        }
        if let Some(format) = self.read("LOG_FORMAT") {
            match format.to_ascii_lowercase().as_str() {
                "text" | "json" => self.flag("--log-format", format.to_ascii_lowercase()),
                _ => return Err(invalid("LOG_FORMAT", &format, "expected text or json")),
            }
        }
        if self.bool("TRACING_ENABLED")? != Some(true) {
            return Ok(());
        }
        let protocol = self.read_or("TRACING_EXPORTER_PROTOCOL", "http");
        let protocol = match protocol.to_ascii_lowercase().as_str() {
            "http" => "http-protobuf",
            "grpc" => "grpc",
            _ => return Err(invalid("TRACING_EXPORTER_PROTOCOL", &protocol, "expected http or grpc")),
        };
        self.flag("--otlp-protocol", protocol);
        // The reference leaves the endpoint to the standard OTEL_EXPORTER_OTLP_* variables, whose default is the
        // local collector.
        if ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
            .iter()
            .all(|v| self.get(v).is_none())
        {
            let port = if protocol == "grpc" { 4317 } else { 4318 };
            self.flag("--otlp-endpoint", format!("http://localhost:{port}"));
        }
        let name = self.read_or("TRACING_SERVICE_NAME", "RateLimit");
        self.flag("--otlp-service-name", name);
        let mut attributes = Vec::new();
        if let Some(ns) = self.read("TRACING_SERVICE_NAMESPACE") {
            attributes.push(format!("service.namespace={ns}"));
        }
        if let Some(id) = self.read("TRACING_SERVICE_INSTANCE_ID") {
            attributes.push(format!("service.instance.id={id}"));
        }
        if !attributes.is_empty() {
            self.flag("--otlp-resource-attributes", attributes.join(","));
        }
        if let Some(rate) = self.number::<f64>("TRACING_SAMPLING_RATE")? {
            if !(0.0..=1.0).contains(&rate) {
                return Err(invalid(
                    "TRACING_SAMPLING_RATE",
                    &rate.to_string(),
                    "not a ratio between 0 and 1",
                ));
            }
            self.flag("--otlp-sampling-ratio", rate.to_string());
        }
        Ok(())
    }
}

/// Redis nodes as a URL's query: `node=host:port&node=...`.
fn nodes(list: &[&str]) -> String {
    list.iter()
        .map(|n| format!("node={}", n.trim()))
        .collect::<Vec<_>>()
        .join("&")
}

fn invalid(var: &'static str, value: &str, message: &str) -> CompatError {
    CompatError::Invalid {
        var,
        value: value.to_string(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests;
