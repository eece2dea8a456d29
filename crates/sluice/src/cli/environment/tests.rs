//! The compatibility mode's tests: the translation of the reference's variables, as a pure function of a map.
use std::collections::HashMap;

use super::*;

fn with(vars: &[(&str, &str)]) -> Result<Translation, CompatError> {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    translate(|name| map.get(name).cloned())
}

fn flag<'a>(t: &'a Translation, name: &str) -> Option<&'a str> {
    t.args.iter().position(|a| a == name).map(|i| t.args[i + 1].as_str())
}

#[test]
fn the_reference_defaults() {
    let t = with(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")]).unwrap();
    assert_eq!(flag(&t, "--json-addr"), Some("0.0.0.0:8080"));
    assert_eq!(flag(&t, "--grpc-addr"), Some("0.0.0.0:8081"));
    assert_eq!(flag(&t, "--http-addr"), Some("0.0.0.0:6070"));
    assert_eq!(flag(&t, "--config"), Some("/srv/runtime_data/current/config"));
    assert_eq!(flag(&t, "--redis-url"), Some("redis://redis:6379"));
    assert_eq!(t.read, vec!["REDIS_SOCKET_TYPE", "REDIS_URL"]);
    assert!(t.ignored.is_empty());
}

#[test]
fn runtime_paths_listeners_and_switches() {
    let t = with(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_APPDIRECTORY", "limits"),
        ("PORT", "9000"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "9001"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":9102"),
        ("MERGE_DOMAIN_CONFIG", "true"),
        ("SHADOW_MODE", "1"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_REMAINING_HEADER", "X-Left"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
        ("LOG_LEVEL", "WARN"),
        ("LOG_FORMAT", "json"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "r:6379"),
        ("REDIS_TIMEOUT", "250ms"),
        ("REDIS_POOL_SIZE", "10"),
        ("USE_STATSD", "false"),
    ])
    .unwrap();
    assert_eq!(flag(&t, "--config"), Some("/data/ratelimit/limits"));
    assert_eq!(flag(&t, "--json-addr"), Some("0.0.0.0:9000"));
    assert_eq!(flag(&t, "--grpc-addr"), Some("127.0.0.1:9001"));
    assert_eq!(flag(&t, "--metrics-addr"), Some("0.0.0.0:9102"));
    assert_eq!(flag(&t, "--metrics-path"), Some("/metrics"));
    assert!(t.args.iter().any(|a| a == "--merge-domains") && t.args.iter().any(|a| a == "--shadow-mode"));
    assert_eq!(flag(&t, "--response-headers"), Some("legacy"));
    assert_eq!(flag(&t, "--remaining-header"), Some("X-Left"));
    assert_eq!(flag(&t, "--local-cache-size"), Some("8192"));
    assert_eq!(flag(&t, "--log-level"), Some("warn"));
    assert_eq!(flag(&t, "--log-format"), Some("json"));
    assert_eq!(flag(&t, "--redis-timeout-ms"), Some("250"));
    assert_eq!(flag(&t, "--redis-pool-size"), Some("10"));
    assert_eq!(t.ignored.len(), 1);
    assert_eq!(t.ignored[0].0, "USE_STATSD");
}

#[test]
fn redis_kinds_and_auth() {
    let url = |vars: &[(&str, &str)]| flag(&with(vars).unwrap(), "--redis-url").map(str::to_string);
    assert_eq!(
        url(&[("REDIS_URL", "/run/r.sock"), ("REDIS_AUTH", "p@ss")]).as_deref(),
        Some("redis+unix://:p%40ss@localhost/run/r.sock")
    );
    assert_eq!(
        url(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "a:7000,b:7001,c:7002"),
            ("REDIS_AUTH", "app:secret"),
            ("REDIS_TLS", "true"),
        ])
        .as_deref(),
        Some("rediss-cluster://app:secret@a:7000?node=b:7001&node=c:7002")
    );
    assert_eq!(
        url(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ("REDIS_SENTINEL_AUTH", "sentinelpass"),
        ])
        .as_deref(),
        Some("redis-sentinel://s1:26379?sentinelServiceName=mymaster&node=s2:26379&sentinelPassword=sentinelpass")
    );
    let e = with(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "SENTINEL"),
        ("REDIS_URL", "s1:26379"),
    ])
    .unwrap_err();
    assert!(e.to_string().starts_with("REDIS_URL='s1:26379': a sentinel URL"), "{e}");
}

#[test]
fn xds() {
    let t = with(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "cp:18000"),
        ("CONFIG_GRPC_XDS_NODE_ID", "n1"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:1,b:2"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "cp.example"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1m"),
        ("XDS_CLIENT_BACKOFF_JITTER", "false"),
    ])
    .unwrap();
    assert_eq!(flag(&t, "--config"), None);
    assert_eq!(flag(&t, "--xds-server"), Some("https://cp:18000"));
    assert_eq!(flag(&t, "--xds-node-id"), Some("n1"));
    assert_eq!(flag(&t, "--xds-tls-san"), Some("cp.example"));
    assert_eq!(flag(&t, "--xds-backoff-max-ms"), Some("60000"));
    assert_eq!(flag(&t, "--xds-backoff-random-factor"), Some("0"));
    assert_eq!(t.args.iter().filter(|a| *a == "--xds-header").count(), 2);
}

#[test]
fn bad_and_unsupported_values_name_the_variable() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("PORT", "http")], "PORT='http': not a port number"),
        (&[("HOST", "localhost")], "HOST='localhost': not an IP address"),
        (&[("USE_PROMETHEUS", "yes")], "USE_PROMETHEUS='yes': not a boolean"),
        (&[("REDIS_TIMEOUT", "10")], "REDIS_TIMEOUT='10': not a duration"),
        (
            &[("CONFIG_TYPE", "CONSUL")],
            "CONFIG_TYPE='CONSUL': expected FILE or GRPC_XDS_SOTW",
        ),
        (
            &[("BACKEND_TYPE", "memcache")],
            "BACKEND_TYPE='memcache' is not supported",
        ),
        (
            &[("GRPC_UDS", "/run/rl.sock")],
            "GRPC_UDS='/run/rl.sock' is not supported",
        ),
        (&[("CACHE_KEY_PREFIX", "{a}")], "CACHE_KEY_PREFIX='{a}'"),
        (&[("LOG_LEVEL", "loud")], "LOG_LEVEL='loud'"),
        (&[("REDIS_SOCKET_TYPE", "udp")], "REDIS_SOCKET_TYPE='udp'"),
    ];
    for (vars, want) in cases {
        let e = with(vars).unwrap_err().to_string();
        assert!(e.starts_with(want), "{vars:?}: {e}");
    }
}

#[test]
fn a_variable_without_effect_here_is_said_to_be_ignored() {
    let t = with(&[
        ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
        ("PROMETHEUS_ADDR", ":9102"),
        ("TRACING_SERVICE_NAME", "rl"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "r:6379"),
    ])
    .unwrap();
    let ignored: Vec<&str> = t.ignored.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        ignored,
        ["GRPC_SERVER_TLS_CERT", "PROMETHEUS_ADDR", "TRACING_SERVICE_NAME"]
    );
    assert!(t.ignored.iter().all(|(_, why)| *why == NO_EFFECT));
    // Every variable is either honoured or listed as ignored, never both.
    assert!(HONOURED.iter().all(|h| IGNORED.iter().all(|(i, _)| i != h)));
}

#[test]
fn go_durations() {
    assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
    assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("1.5h"), Some(Duration::from_secs(5400)));
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("0"), Some(Duration::ZERO));
    for bad in ["", "10", "s", "-1s", "1d", "1e400s"] {
        assert_eq!(parse_duration(bad), None, "{bad}");
    }
}

#[test]
fn requested_by_name_flag_or_variable() {
    let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
    let none = |_: &str| None;
    assert!(requested(&args(&["/bin/ratelimit"]), none));
    assert!(requested(
        &args(&["sluice", "serve", "--compat", "envoy-ratelimit"]),
        none
    ));
    assert!(requested(&args(&["sluice", "serve", "--compat=envoy-ratelimit"]), none));
    assert!(requested(&args(&["sluice", "serve"]), |v: &str| (v == "SLUICE_COMPAT")
        .then(|| MODE.to_string())));
    assert!(!requested(&args(&["/usr/local/bin/sluice", "serve"]), none));
}
