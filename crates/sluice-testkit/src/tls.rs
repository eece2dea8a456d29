//! TLS for the tests: a throwaway certificate authority and a `redis-server` that speaks only TLS.

use std::path::Path;

use crate::harness::free_port;
use crate::redis::RedisProcess;

/// A certificate and its private key, PEM-encoded.
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A throwaway certificate authority for TLS tests.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The CA certificate, PEM-encoded.
    pub cert: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("key pair");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-signed CA").pem();
        TestCa {
            issuer: rcgen::Issuer::new(params, key),
            cert,
        }
    }

    /// A certificate for `localhost` and 127.0.0.1, usable by a server and as a client.
    pub fn issue(&self, name: &str) -> Pem {
        let key = rcgen::KeyPair::generate().expect("key pair");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).expect("signed certificate").pem();
        Pem {
            cert,
            key: key.serialize_pem(),
        }
    }
}

/// Writes `contents` to `dir/name` and returns the path.
pub fn write_file(dir: &Path, name: &str, contents: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("test file written");
    path
}

/// A `redis-server` that speaks only TLS (`--port 0 --tls-port P`) with a certificate, its key and the CA that
/// signs client certificates; clients must present one when `auth_clients`. `extra` adds arguments (ACL users).
pub fn redis_tls_server(
    dir: &Path,
    cert: &Path,
    key: &Path,
    ca: &Path,
    auth_clients: bool,
    extra: &[&str],
) -> RedisProcess {
    let port = free_port();
    let path = |p: &Path| p.display().to_string();
    let mut args: Vec<String> = [
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        &path(cert),
        "--tls-key-file",
        &path(key),
        "--tls-ca-cert-file",
        &path(ca),
        "--tls-auth-clients",
        if auth_clients { "yes" } else { "no" },
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &path(dir),
        "--logfile",
        &format!("{port}.log"),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    RedisProcess::spawn(port, &args, Some(dir.join(format!("{port}.log"))))
}
