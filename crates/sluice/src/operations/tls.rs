//! TLS: the gRPC listener's certificates (shared by the JSON API's listener), reloaded when their files change, and
//! the client side of TLS to Redis.
//!
//! The gRPC server terminates TLS itself, with rustls over the ring provider, instead of through tonic's
//! `tls_config`, which fixes the certificate for the life of the process. Before each handshake [`ServerTls`] reads
//! the files (a few kilobytes, little next to the handshake's own cryptography) and rebuilds its rustls
//! configuration when their bytes differ from what it saw last: exact, where modification times are as coarse as a
//! kernel tick, and indifferent to how the files are replaced (in place, by rename, by a symlink swap as Kubernetes
//! does for mounted secrets). Connections already open keep the certificate they were made with. A replacement that does not load (half written, or a key that does not fit the certificate) is logged
//! once, and the previous certificate stays in use until the files change again. At startup a bad file is fatal,
//! with an error naming it. Handshakes run in tasks of their own, bounded by [`HANDSHAKE_TIMEOUT`], so a slow or
//! silent client never holds up the accept loop.
//!
//! The PEM loaders are the core's ([`sluice_core::pem`]), shared with the Redis client.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::server::{Connected, TcpConnectInfo};

pub use sluice_core::pem::TlsError;
use sluice_core::pem::{invalid, parse_certs, parse_key, parse_roots, provider};

/// How long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The gRPC listener's TLS files, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates; when set, clients must present a certificate signed by one of them (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// The bytes of each file, or why it could not be read: what a reload compares.
type Snapshot = Vec<Result<Vec<u8>, io::ErrorKind>>;

/// The gRPC listener's TLS configuration, rebuilt when its files change.
pub struct ServerTls {
    face: Face,
    files: ServerTlsFiles,
    state: Mutex<ServerState>,
}

struct ServerState {
    acceptor: TlsAcceptor,
    /// The files as last read, loaded or not: a bad replacement is reported once, not per handshake.
    seen: Snapshot,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the files, or says which one is wrong.
    pub fn load(files: ServerTlsFiles) -> Result<ServerTls, TlsError> {
        ServerTls::load_for(files, Face::Grpc)
    }

    /// Loads the files for the listener of `face`, which decides the protocols offered (ALPN).
    fn load_for(files: ServerTlsFiles, face: Face) -> Result<ServerTls, TlsError> {
        let seen = files.snapshot();
        let config = files.server_config(&seen, face)?;
        Ok(ServerTls {
            face,
            files,
            state: Mutex::new(ServerState {
                acceptor: TlsAcceptor::from(config),
                seen,
            }),
        })
    }

    /// The acceptor for the next handshake, rebuilt first if a file changed since the last look.
    pub fn acceptor(&self) -> TlsAcceptor {
        let now = self.files.snapshot();
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if now != state.seen {
            let built = self.files.server_config(&now, self.face);
            state.seen = now;
            match built {
                Ok(config) => {
                    state.acceptor = TlsAcceptor::from(config);
                    tracing::info!(face = self.face.name(), cert = %self.files.cert.display(), "tls: certificate files changed; reloaded");
                }
                Err(e) => {
                    tracing::warn!(face = self.face.name(), error = %e, "tls: certificate files changed but do not load; keeping the previous ones")
                }
            }
        }
        state.acceptor.clone()
    }
}

impl ServerTlsFiles {
    fn paths(&self) -> impl Iterator<Item = (&'static str, &Path)> {
        [
            ("grpc tls certificate", Some(&self.cert)),
            ("grpc tls key", Some(&self.key)),
            ("grpc tls client ca", self.client_ca.as_ref()),
        ]
        .into_iter()
        .filter_map(|(what, path)| path.map(|p| (what, p.as_path())))
    }

    fn snapshot(&self) -> Snapshot {
        self.paths()
            .map(|(_, path)| std::fs::read(path).map_err(|e| e.kind()))
            .collect()
    }

    /// The rustls configuration from a snapshot of the files (cert, key, then the client CA if any).
    fn server_config(&self, snapshot: &Snapshot, face: Face) -> Result<Arc<ServerConfig>, TlsError> {
        let mut contents = Vec::with_capacity(3);
        for ((what, path), bytes) in self.paths().zip(snapshot) {
            contents.push(bytes.as_deref().map_err(|&kind| TlsError::Read {
                what,
                path: path.to_path_buf(),
                source: io::Error::from(kind),
            })?);
        }
        let chain = parse_certs("grpc tls certificate", &self.cert, contents[0])?;
        let key = parse_key("grpc tls key", &self.key, contents[1])?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(format!("grpc tls: {e}")))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let roots = parse_roots("grpc tls client ca", ca, contents[2])?;
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                    .build()
                    .map_err(|e| invalid("grpc tls client ca", ca, e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| TlsError::Pair {
            what: "grpc tls key",
            cert: self.cert.clone(),
            key: self.key.clone(),
            reason: e.to_string(),
        })?;
        config.alpn_protocols = vec![face.alpn().to_vec()];
        Ok(Arc::new(config))
    }
}

/// One accepted gRPC connection, plain or TLS.
#[derive(Debug)]
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// The gRPC listener's connections, as tonic's `serve_with_incoming_shutdown` takes them.
pub type Incoming = Pin<Box<dyn Stream<Item = io::Result<Conn>> + Send>>;

/// The listeners that may share the gRPC listener's TLS: each offers its own protocol in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    /// gRPC: HTTP/2.
    Grpc,
    /// The JSON API (`POST /json`): HTTP/1.1.
    Json,
}

impl Face {
    fn name(self) -> &'static str {
        match self {
            Face::Grpc => "grpc",
            Face::Json => "json",
        }
    }

    fn alpn(self) -> &'static [u8] {
        match self {
            Face::Grpc => b"h2",
            Face::Json => b"http/1.1",
        }
    }
}

/// Turns the bound gRPC listener into the server's incoming connections: as they come without `tls`, after a
/// handshake with it. Fails, naming the file, when a TLS file cannot be used.
pub fn incoming(listener: TcpListener, tls: Option<&ServerTlsFiles>) -> Result<Incoming, TlsError> {
    incoming_for(Face::Grpc, listener, tls)
}

/// [`incoming`] for the listener of `face`.
pub fn incoming_for(face: Face, listener: TcpListener, tls: Option<&ServerTlsFiles>) -> Result<Incoming, TlsError> {
    use tokio_stream::StreamExt as _;
    let Some(files) = tls else {
        return Ok(Box::pin(
            // tonic ignores its own `tcp_nodelay` for an incoming stream: set it here, as for TLS connections.
            TcpListenerStream::new(listener).map(|conn| {
                conn.map(|tcp| {
                    let _ = tcp.set_nodelay(true);
                    Conn::Plain(tcp)
                })
            }),
        ));
    };
    let tls = Arc::new(ServerTls::load_for(files.clone(), face)?);
    tracing::info!(face = face.name(), cert = %files.cert.display(), mutual = files.client_ca.is_some(), "tls on");
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, tls, tx));
    Ok(Box::pin(ReceiverStream::new(rx).map(Ok)))
}

/// Accepts connections and hands each to a handshake task, until the server drops its end of the channel (at
/// shutdown), which closes the listener.
async fn accept_loop(listener: TcpListener, tls: Arc<ServerTls>, tx: mpsc::Sender<Conn>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = tx.closed() => return,
        };
        let (tcp, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors and the like: pause instead of spinning.
                tracing::warn!(face = tls.face.name(), error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (tls, tx) = (tls.clone(), tx.clone());
        tokio::spawn(async move {
            let acceptor = tls.acceptor();
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = tx.send(Conn::Tls(Box::new(stream))).await;
                }
                Ok(Err(e)) => handshake_failed(tls.face, peer, &e.to_string()),
                Err(_) => handshake_failed(tls.face, peer, "timed out"),
            }
        });
    }
}

fn handshake_failed(face: Face, peer: SocketAddr, error: &str) {
    tracing::debug!(face = face.name(), peer = %peer, error, "tls handshake failed");
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        match self {
            Conn::Plain(s) => s.connect_info(),
            Conn::Tls(s) => s.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
