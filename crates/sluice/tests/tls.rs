//! TLS, with certificates made in the test: to Redis (`rediss://` with a private CA, a client certificate for
//! `tls-auth-clients`, an ACL user with only the commands sluice needs), and on the gRPC listener (TLS, mutual TLS,
//! certificate files replaced on disk and picked up by the next connection, bad files refused by name), and the JSON
//! API's listener under the same mutual TLS.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sluice::limiter::{Code, Descriptor, LimiterSettings, Request};
use sluice::operations::tls::{ServerTls, ServerTlsFiles};
use sluice::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::store::redis::{RedisSettings, RedisStore, RedisTls};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::harness::{
    ACL_PASSWORD, Pem, TestCa, TestServer, limiter, limiter_with, memory, post_request, readme_acl_user,
    redis_tls_server, write_file,
};

const CONFIG: &str = "
domain: tls
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
";

fn request() -> Request {
    Request {
        domain: "tls".into(),
        descriptors: vec![Descriptor {
            entries: vec![("user".into(), "alice".into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

/// Writes a certificate and its key as `<name>.crt` and `<name>.key`.
fn write_pair(dir: &Path, name: &str, pem: &Pem) -> (PathBuf, PathBuf) {
    (
        write_file(dir, &format!("{name}.crt"), &pem.cert),
        write_file(dir, &format!("{name}.key"), &pem.key),
    )
}

async fn store(url: &str, tls: RedisTls) -> RedisStore {
    RedisStore::connect(&RedisSettings {
        url: url.to_string(),
        timeout: Duration::from_millis(500),
        pool_size: 1,
        server_time: true,
        tls,
    })
    .await
    .expect("the settings are valid")
}

/// Whether one decision through `store` succeeds (the limit is 5 per hour; the first calls are admitted).
async fn decides(store: RedisStore) -> bool {
    let (l, _) = limiter(CONFIG, store);
    match l.decisions().should_rate_limit(&request()).await {
        Ok(decision) => decision.overall == Code::Ok,
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_trusts_the_given_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("redis test ca");
    let ca_file = write_file(dir.path(), "ca.crt", &ca.cert);
    let (cert, key) = write_pair(dir.path(), "redis", &ca.issue("redis"));
    let redis = redis_tls_server(dir.path(), &cert, &key, &ca_file, false, &[]);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let with_ca = RedisTls {
        ca: Some(ca_file.clone()),
        ..RedisTls::default()
    };

    assert!(decides(store(&url, with_ca).await).await, "TLS with the CA");
    assert!(
        !decides(store(&url, RedisTls::default()).await).await,
        "the system's roots do not know the test CA"
    );
    let other = TestCa::new("another ca");
    let other_ca = RedisTls {
        ca: Some(write_file(dir.path(), "other.crt", &other.cert)),
        ..RedisTls::default()
    };
    assert!(
        !decides(store(&url, other_ca).await).await,
        "a server signed by another CA"
    );
    assert!(
        !decides(store(&format!("redis://127.0.0.1:{}", redis.port), RedisTls::default()).await).await,
        "plain text to the TLS port"
    );
}

/// The documented least-privilege ACL user (password [`ACL_PASSWORD`]), and the default user off, as
/// `redis-server` arguments.
fn acl_user_args() -> Vec<String> {
    let mut args = vec!["--user".to_string()];
    args.extend(readme_acl_user("sluice:"));
    args.extend(["--user", "default", "off"].map(String::from));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_mutual_tls_with_a_least_privilege_acl_user() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("redis test ca");
    let ca_file = write_file(dir.path(), "ca.crt", &ca.cert);
    let (cert, key) = write_pair(dir.path(), "redis", &ca.issue("redis"));
    let (client_cert, client_key) = write_pair(dir.path(), "client", &ca.issue("sluice"));
    let acl = acl_user_args();
    let acl: Vec<&str> = acl.iter().map(String::as_str).collect();
    let redis = redis_tls_server(dir.path(), &cert, &key, &ca_file, true, &acl);
    let url = |auth: &str| format!("rediss://{auth}127.0.0.1:{}", redis.port);
    let full = RedisTls {
        ca: Some(ca_file.clone()),
        cert: Some(client_cert.clone()),
        key: Some(client_key.clone()),
    };

    assert!(
        decides(store(&url(&format!("sluice:{ACL_PASSWORD}@")), full.clone()).await).await,
        "client certificate and ACL user"
    );
    let ca_only = RedisTls {
        ca: Some(ca_file.clone()),
        ..RedisTls::default()
    };
    assert!(
        !decides(store(&url(&format!("sluice:{ACL_PASSWORD}@")), ca_only).await).await,
        "no client certificate"
    );
    assert!(
        !decides(store(&url("sluice:wrong@"), full.clone()).await).await,
        "wrong password"
    );
    assert!(
        !decides(store(&url(""), full.clone()).await).await,
        "the default user is off"
    );

    // The user is confined to the prefix, inside the script too: the same call under another prefix is refused.
    let other_prefix = LimiterSettings {
        key_prefix: "other:".into(),
        ..LimiterSettings::default()
    };
    let (l, _) = limiter_with(
        CONFIG,
        store(&url(&format!("sluice:{ACL_PASSWORD}@")), full.clone()).await,
        other_prefix,
    );
    assert!(
        l.decisions().should_rate_limit(&request()).await.is_err(),
        "keys outside ~sluice:*"
    );
    let mismatched = RedisTls {
        key: Some(key.clone()),
        ..full
    };
    let e = RedisStore::connect(&RedisSettings {
        url: url(&format!("sluice:{ACL_PASSWORD}@")),
        timeout: Duration::from_millis(500),
        pool_size: 1,
        server_time: true,
        tls: mismatched,
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("redis tls key") && e.contains("redis.key") && e.contains("client.crt"),
        "{e}"
    );
}

fn rls_request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "tls".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "bob".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// One ShouldRateLimit over a new connection; the error, connecting or calling, as text.
async fn call(server: &TestServer, tls: Option<ClientTlsConfig>) -> Result<(), String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Channel::from_shared(format!("{scheme}://{}", server.grpc))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(|e| format!("{e:?}"))?;
    }
    let channel = endpoint.connect().await.map_err(|e| format!("connect: {e:?}"))?;
    RateLimitServiceClient::new(channel)
        .should_rate_limit(rls_request())
        .await
        .map(|_| ())
        .map_err(|e| format!("call: {e:?}"))
}

fn trusting(ca: &TestCa) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.cert))
        .domain_name("localhost")
}

fn presenting(ca: &TestCa, identity: &Pem) -> ClientTlsConfig {
    trusting(ca).identity(Identity::from_pem(&identity.cert, &identity.key))
}

async fn tls_server(files: ServerTlsFiles) -> TestServer {
    let (l, _) = limiter(CONFIG, memory());
    TestServer::start_with(l, Some(files)).await
}

#[tokio::test]
async fn grpc_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("grpc test ca");
    let (cert, key) = write_pair(dir.path(), "server", &ca.issue("sluice"));
    let server = tls_server(ServerTlsFiles {
        cert,
        key,
        client_ca: None,
    })
    .await;

    call(&server, Some(trusting(&ca))).await.expect("TLS call");
    assert!(call(&server, None).await.is_err(), "plain text is refused");
    assert!(
        call(&server, Some(trusting(&TestCa::new("other")))).await.is_err(),
        "a client that does not trust the CA refuses the server"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn grpc_mutual_tls_refuses_clients_without_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("grpc test ca");
    let (cert, key) = write_pair(dir.path(), "server", &ca.issue("sluice"));
    let client_ca = write_file(dir.path(), "clients.crt", &ca.cert);
    let server = tls_server(ServerTlsFiles {
        cert,
        key,
        client_ca: Some(client_ca),
    })
    .await;

    call(&server, Some(presenting(&ca, &ca.issue("envoy"))))
        .await
        .expect("a client with a certificate from the client CA");
    let e = call(&server, Some(trusting(&ca))).await.unwrap_err();
    assert!(
        e.contains("CertificateRequired"),
        "refused for want of a certificate: {e}"
    );
    let stranger = TestCa::new("stranger");
    assert!(
        call(&server, Some(presenting(&ca, &stranger.issue("envoy"))))
            .await
            .is_err(),
        "a certificate from another CA is refused"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn grpc_certificates_are_reloaded_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (TestCa::new("old ca"), TestCa::new("new ca"));
    let (cert, key) = write_pair(dir.path(), "server", &old_ca.issue("sluice"));
    let server = tls_server(ServerTlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: None,
    })
    .await;
    call(&server, Some(trusting(&old_ca)))
        .await
        .expect("the old certificate");
    assert!(call(&server, Some(trusting(&new_ca))).await.is_err());
    let kept = Channel::from_shared(format!("https://{}", server.grpc))
        .unwrap()
        .tls_config(trusting(&old_ca))
        .unwrap()
        .connect()
        .await
        .unwrap();

    // Half a replacement (a new certificate, the old key) does not load: the old pair keeps serving.
    let replacement = new_ca.issue("sluice");
    std::fs::write(&cert, &replacement.cert).unwrap();
    call(&server, Some(trusting(&old_ca)))
        .await
        .expect("a certificate without its key is not used");
    // Garbage is not used either.
    std::fs::write(&key, "not a key").unwrap();
    call(&server, Some(trusting(&old_ca)))
        .await
        .expect("a garbage key is not used");
    // The full pair is, by the next connection, without a restart.
    std::fs::write(&key, &replacement.key).unwrap();
    call(&server, Some(trusting(&new_ca)))
        .await
        .expect("the new certificate");
    assert!(
        call(&server, Some(trusting(&old_ca))).await.is_err(),
        "the old one is gone"
    );
    // A connection made before keeps working.
    RateLimitServiceClient::new(kept)
        .should_rate_limit(rls_request())
        .await
        .expect("an open connection survives the reload");
    server.shutdown().await;
}

const JSON_REQUEST: &str = r#"{"domain": "tls", "descriptors": [{"entries": [{"key": "user", "value": "carol"}]}]}"#;

/// One `POST /json` to the JSON API's listener: over TLS trusting `ca` (presenting `identity` if given), or in plain
/// text without `ca`. The status code, or why there was none.
async fn json_call(server: &TestServer, ca: Option<&Path>, identity: Option<(&Path, &Path)>) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn exchange<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut io: T) -> Result<u16, String> {
        let request = post_request("/json", JSON_REQUEST);
        io.write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut response = Vec::new();
        io.read_to_end(&mut response).await.map_err(|e| format!("read: {e}"))?;
        let response = String::from_utf8_lossy(&response);
        response
            .get(9..12)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| format!("no HTTP answer: {response:?}"))
    }
    let tcp = tokio::net::TcpStream::connect(server.json)
        .await
        .map_err(|e| e.to_string())?;
    let Some(ca) = ca else {
        return exchange(tcp).await;
    };
    let roots = sluice::pem::load_roots("ca", ca).map_err(|e| e.to_string())?;
    let builder = rustls::ClientConfig::builder_with_provider(sluice::pem::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                sluice::pem::load_certs("cert", cert).map_err(|e| e.to_string())?,
                sluice::pem::load_key("key", key).map_err(|e| e.to_string())?,
            )
            .map_err(|e| e.to_string())?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    exchange(tls).await
}

#[tokio::test]
async fn the_json_api_shares_the_grpc_listener_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("grpc test ca");
    let ca_file = write_file(dir.path(), "ca.crt", &ca.cert);
    let (cert, key) = write_pair(dir.path(), "server", &ca.issue("sluice"));
    let (client_cert, client_key) = write_pair(dir.path(), "client", &ca.issue("envoy"));
    let stranger = TestCa::new("stranger");
    let (stranger_cert, stranger_key) = write_pair(dir.path(), "stranger", &stranger.issue("envoy"));
    let server = tls_server(ServerTlsFiles {
        cert,
        key,
        client_ca: Some(ca_file.clone()),
    })
    .await;

    let with_certificate = json_call(&server, Some(&ca_file), Some((&client_cert, &client_key))).await;
    assert_eq!(
        with_certificate,
        Ok(200),
        "a client with a certificate from the client CA"
    );
    assert!(json_call(&server, None, None).await.is_err(), "plain text is refused");
    let without = json_call(&server, Some(&ca_file), None).await;
    assert!(without.is_err(), "no client certificate: {without:?}");
    let foreign = json_call(&server, Some(&ca_file), Some((&stranger_cert, &stranger_key))).await;
    assert!(foreign.is_err(), "a certificate from another CA: {foreign:?}");
    // The admin endpoints stay plain for probes and scrapers, and decide nothing.
    assert_eq!(server.http_get("/healthz").await.0, 200);
    assert_eq!(server.http_post("/json", JSON_REQUEST).await.0, 404);
    server.shutdown().await;
}

#[test]
fn bad_tls_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca");
    let (cert, key) = write_pair(dir.path(), "server", &ca.issue("a"));
    let (_, other_key) = write_pair(dir.path(), "other", &ca.issue("b"));
    let garbage = write_file(dir.path(), "garbage.pem", "garbage");
    let load = |cert: &Path, key: &Path, client_ca: Option<&Path>| {
        ServerTls::load(ServerTlsFiles {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            client_ca: client_ca.map(Path::to_path_buf),
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    assert_eq!(load(&cert, &key, None), Ok(()));
    let missing = dir.path().join("missing.crt");
    let e = load(&missing, &key, None).unwrap_err();
    assert!(
        e.starts_with("grpc tls certificate '") && e.contains("missing.crt"),
        "{e}"
    );
    let e = load(&cert, &garbage, None).unwrap_err();
    assert!(e.starts_with("grpc tls key '") && e.contains("garbage.pem"), "{e}");
    let e = load(&cert, &other_key, None).unwrap_err();
    assert!(
        e.contains("other.key") && e.contains("does not fit certificate") && e.contains("server.crt"),
        "{e}"
    );
    let e = load(&cert, &key, Some(&garbage)).unwrap_err();
    assert!(
        e.starts_with("grpc tls client ca '") && e.contains("garbage.pem"),
        "{e}"
    );

    // The binary stops with the same message, before serving anything.
    let config = write_file(dir.path(), "config.yaml", CONFIG);
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&config)
        .arg("--grpc-tls-cert")
        .arg(&missing)
        .arg("--grpc-tls-key")
        .arg(&key)
        .output()
        .expect("the sluice binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("grpc tls certificate '") && stderr.contains("missing.crt"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
