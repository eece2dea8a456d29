//! PEM files for TLS: certificates, private keys and trust stores read with rustls, every error naming the file and
//! what it was for. The Redis client's TLS uses them, and so does the service's gRPC listener.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS file that cannot be used. Every message names the file and what it was for.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} '{}': {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{what} '{}': {reason}", path.display())]
    Invalid {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{what} '{}' does not fit certificate '{}': {reason}", key.display(), cert.display())]
    Pair {
        what: &'static str,
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("{0}")]
    Config(String),
}

/// The one crypto provider sluice uses, passed explicitly so that no process-wide default is needed.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

pub fn invalid(what: &'static str, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::Invalid {
        what,
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn pem_reason(e: &pem::Error) -> String {
    match e {
        pem::Error::NoItemsFound => "nothing PEM-encoded found".to_string(),
        other => format!("not valid PEM: {other:?}"),
    }
}

/// Every certificate of a PEM file; at least one.
pub fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    parse_certs(what, path, &read(what, path)?)
}

pub fn parse_certs(what: &'static str, path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, path, pem_reason(&e)))?;
    if certs.is_empty() {
        return Err(invalid(what, path, "no PEM certificate found"));
    }
    Ok(certs)
}

/// The first private key of a PEM file.
pub fn load_key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    parse_key(what, path, &read(what, path)?)
}

pub fn parse_key(what: &'static str, path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => invalid(what, path, "no PEM private key found"),
        other => invalid(what, path, pem_reason(&other)),
    })
}

/// A trust store of every certificate of a PEM file.
pub fn load_roots(what: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    parse_roots(what, path, &read(what, path)?)
}

pub fn parse_roots(what: &'static str, path: &Path, bytes: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certs(what, path, bytes)? {
        roots
            .add(cert)
            .map_err(|e| invalid(what, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// The system's trusted roots; unreadable ones are logged and skipped.
pub fn native_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::warn!(error = %error, "cannot read a system CA certificate");
    }
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if ignored > 0 {
        tracing::warn!(added, ignored, "some system CA certificates are not usable");
    }
    roots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_garbage_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = load_certs("grpc tls certificate", &missing).unwrap_err().to_string();
        assert!(e.starts_with("grpc tls certificate '"), "{e}");
        assert!(e.contains("missing.pem"), "{e}");

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "hello\n").unwrap();
        let e = load_certs("grpc tls certificate", &garbage).unwrap_err().to_string();
        assert!(e.contains("garbage.pem") && e.contains("no PEM certificate"), "{e}");
        let e = load_key("grpc tls key", &garbage).unwrap_err().to_string();
        assert!(e.contains("garbage.pem") && e.contains("no PEM private key"), "{e}");

        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = load_certs("grpc tls certificate", &broken).unwrap_err().to_string();
        assert!(e.contains("broken.pem") && e.contains("not valid PEM"), "{e}");
    }
}
