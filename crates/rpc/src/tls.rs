//! TLS on braid connections (rustls): an option on top of the cluster secret's
//! handshake, which still runs inside the TLS session.
//!
//! A node's TLS settings are a directory ([`TlsDir`]) with the cluster's CA
//! (`ca.pem`), the node's certificate (`cert.pem`, its chain, signed by that CA) and
//! key (`key.pem`), as etcd and Kubernetes have their nodes keep them. Both ends
//! prove themselves (mutual TLS): a server takes only clients whose certificate the
//! cluster's CA signed, and a client takes only a server whose certificate the CA
//! signed for the address it dialled (an IP address or DNS name among the
//! certificate's subject alternative names). A server with TLS takes plain
//! connections too unless it is told to require TLS; a client with TLS never falls
//! back to plain.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

/// What TLS runs over: the socket, read through a buffer. rustls reads 4 KiB at a
/// time; a 1 MiB transfer was 256 `recv` calls, and on this project's 2-core machine
/// TLS moved 40 % less than plain TCP with them.
pub type Wire = tokio::io::BufReader<TcpStream>;

/// Bytes read from a TLS connection's socket at a time.
const WIRE_READ_BYTES: usize = 256 << 10;

/// `stream` as TLS runs over it.
pub fn wire(stream: TcpStream) -> Wire {
    tokio::io::BufReader::with_capacity(WIRE_READ_BYTES, stream)
}

/// The first byte of a TLS handshake record: how a server tells a TLS client from
/// a plain one before it reads anything.
pub const HANDSHAKE_RECORD: u8 = 0x16;

/// Where a node's TLS files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsDir(pub PathBuf);

impl TlsDir {
    pub fn ca(&self) -> PathBuf {
        self.0.join("ca.pem")
    }
    pub fn cert(&self) -> PathBuf {
        self.0.join("cert.pem")
    }
    pub fn key(&self) -> PathBuf {
        self.0.join("key.pem")
    }
}

/// A node's TLS identity, ready for both ends of a connection.
pub struct TlsContext {
    pub dir: TlsDir,
    client: tokio_rustls::TlsConnector,
    server: tokio_rustls::TlsAcceptor,
    /// A server refuses plain connections.
    pub required: bool,
}

impl std::fmt::Debug for TlsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsContext").field("dir", &self.dir).field("required", &self.required).finish()
    }
}

/// ring's suites, AES-128-GCM first: a third fewer AES rounds than AES-256 for the
/// same protection a cluster's links need, and bulk data is what braid moves.
fn provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(p)
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs: Vec<_> = CertificateDer::pem_reader_iter(BufReader::new(file))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

impl TlsContext {
    /// Loads the files of `dir`; every problem (a missing file, a key that is not
    /// the certificate's, a CA that is not one) is an error naming the file.
    pub fn load(dir: &Path, required: bool) -> Result<Arc<TlsContext>, String> {
        let dir = TlsDir(dir.to_path_buf());
        let mut roots = RootCertStore::empty();
        for ca in certs(&dir.ca())? {
            roots.add(ca).map_err(|e| format!("{}: not a usable CA certificate: {e}", dir.ca().display()))?;
        }
        let roots = Arc::new(roots);
        let chain = certs(&dir.cert())?;
        let key = PrivateKeyDer::from_pem_file(dir.key())
            .map_err(|e| format!("{}: not a PEM private key: {e}", dir.key().display()))?;
        let bad = |e: &dyn std::fmt::Display| format!("TLS settings in {}: {e}", dir.0.display());
        let verify_clients =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider()).build().map_err(|e| bad(&e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e))?
            .with_client_cert_verifier(verify_clients)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| bad(&e))?;
        let verify_servers =
            WebPkiServerVerifier::builder_with_provider(roots, provider()).build().map_err(|e| bad(&e))?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e))?
            .with_webpki_verifier(verify_servers)
            .with_client_auth_cert(chain, key)
            .map_err(|e| bad(&e))?;
        Ok(Arc::new(TlsContext {
            dir,
            client: tokio_rustls::TlsConnector::from(Arc::new(client)),
            server: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            required,
        }))
    }

    /// The client end over `stream`, to the server dialled as `addr` (`HOST:PORT`):
    /// its certificate must name `HOST`.
    pub async fn connect(
        &self,
        addr: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<Wire>, String> {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: not a server name: {e}"))?;
        self.client.connect(name, wire(stream)).await.map_err(|e| match e.kind() {
            // A server without TLS settings closes a connection that begins with TLS.
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
                format!("TLS: {e} (the server closed the connection: does it have TLS settings, --tls-dir?)")
            }
            _ => format!("TLS: {e}"),
        })
    }

    /// What takes the server end of TLS connections (for servers of other protocols:
    /// the NBD export).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.server.clone()
    }

    /// The server end over `stream`.
    pub async fn accept(&self, stream: TcpStream) -> Result<tokio_rustls::server::TlsStream<Wire>, String> {
        self.server.accept(wire(stream)).await.map_err(|e| format!("TLS: {e}"))
    }
}

/// Whether a failed exchange over TLS failed because the peer refused us at the TLS
/// level (our certificate, its expiry, its CA): not worth retrying. With TLS 1.3 a
/// client learns that the server refused its certificate only at its first read.
pub fn refused_by_peer(reason: &str) -> bool {
    reason.contains("received fatal alert")
}
