//! TLS for QUIC (DESIGN §10). Two modes:
//! * **mutual TLS** ([`TlsConfigs::from_dir`]): every node and client presents a certificate of
//!   the cluster CA, and checks the other side's; the role in a certificate decides what its
//!   holder may do ([`Role`], checked by the coordinator and the workers);
//! * **insecure** ([`TlsConfigs::insecure`], `--insecure`): a self-signed certificate and no
//!   checks. Traffic is encrypted but anyone who can reach a port may do anything.

mod ca;
mod identity;
mod inspect;
mod source;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub use self::ca::{
    CA_CERT, CA_KEY, CA_VALIDITY, CERT_VALIDITY, ClusterCa, DENY_LIST, Issued, NODE_CERT, NODE_KEY, Validity, ensure_local, local_ca_dir,
};
pub(crate) use self::identity::chain_identity;
pub use self::identity::{NODE_ID_URI, Peer, PeerIdentity, Role, cert_key, describe, peer_identity};
pub use self::inspect::{CertSummary, summarize_pem};
pub use self::source::TlsSource;
use self::verify::{AcceptAnyServer, ClusterClientVerifier, ClusterServerVerifier, DenyList};
use super::NetError;
use stoker_plan::ids::CertKey;
use stoker_proto::ALPN;

/// TLS material that cannot be read, parsed or made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file cannot be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds something else than expected.
    #[error("{path}: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A certificate is not a Stoker certificate.
    #[error("not a usable Stoker certificate: {message}")]
    BadCertificate {
        /// Why.
        message: String,
    },
    /// Making a key or certificate failed.
    #[error("cannot make a certificate: {message}")]
    Generate {
        /// Why.
        message: String,
    },
    /// A CA is already there.
    #[error("{path} already exists: a new CA would invalidate every certificate the old one issued (remove it first if you mean it)")]
    Exists {
        /// The file.
        path: PathBuf,
    },
}

/// Server and client crypto configs of one node, and who it is.
#[derive(Clone)]
pub struct TlsConfigs {
    /// For accepting connections.
    pub server: Arc<QuicServerConfig>,
    /// For making connections.
    pub client: Arc<QuicClientConfig>,
    /// The same for bulk connections (TLS over TCP, [`crate::bulk`]).
    bulk_server: Arc<rustls::ServerConfig>,
    bulk_client: Arc<rustls::ClientConfig>,
    bulk_alpn: Vec<u8>,
    own: Option<Peer>,
    deny: Option<Arc<DenyList>>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn setup(error: impl std::fmt::Display) -> NetError {
    NetError::Setup { message: error.to_string() }
}

/// A fresh self-signed server certificate and a client that accepts any server certificate,
/// both offering `alpn` (the protocol's [`ALPN`] unless a test wants another).
pub fn insecure_tls(alpn: &[u8]) -> Result<TlsConfigs, NetError> {
    let certified = rcgen::generate_simple_self_signed(vec!["stoker".to_owned(), "localhost".to_owned()]).map_err(setup)?;
    let cert_der = certified.cert.der().clone();
    let key_der = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(setup)?
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key_der.into())
        .map_err(setup)?;
    server.alpn_protocols = vec![alpn.to_vec()];
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(setup)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer::new(provider())))
        .with_no_client_auth();
    client.alpn_protocols = vec![alpn.to_vec()];
    let (bulk_server, bulk_client) = bulk_configs(&server, &client, alpn);
    Ok(TlsConfigs {
        server: Arc::new(QuicServerConfig::try_from(server).map_err(setup)?),
        client: Arc::new(QuicClientConfig::try_from(client).map_err(setup)?),
        bulk_server,
        bulk_client,
        bulk_alpn: stoker_proto::bulk_alpn(alpn),
        own: None,
        deny: None,
    })
}

/// Mutual TLS from PEM text: `trusted` (one CA or several), this node's certificate chain and
/// key, and the deny list's path (read again whenever it changes), offering `alpn`.
pub fn mutual_tls(trusted: &str, cert_pem: &str, key_pem: &str, deny_list: Option<PathBuf>, alpn: &[u8]) -> Result<TlsConfigs, TlsError> {
    let malformed = |what: &str, message: String| TlsError::Malformed { path: PathBuf::from(what), message };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(trusted.as_bytes()) {
        let cert = cert.map_err(|error| malformed(CA_CERT, format!("not PEM certificates: {error}")))?;
        roots.add(cert).map_err(|error| malformed(CA_CERT, format!("not a usable CA certificate: {error}")))?;
    }
    if roots.is_empty() {
        return Err(malformed(CA_CERT, "holds no certificate".to_owned()));
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|error| malformed(NODE_CERT, format!("not PEM certificates: {error}")))?;
    let own = describe(chain.first().ok_or_else(|| malformed(NODE_CERT, "holds no certificate".to_owned()))?)?;
    let key = || {
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|error| malformed(NODE_KEY, format!("not a PEM private key: {error}")))
    };
    let roots = Arc::new(roots);
    let deny = Arc::new(DenyList::at(deny_list)?);
    let deny_list = Arc::clone(&deny);
    let bad = |error: rustls::Error| TlsError::BadCertificate { message: error.to_string() };
    let client_verifier = ClusterClientVerifier::new(Arc::clone(&roots), Arc::clone(&deny), provider())?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(bad)?
        .with_client_cert_verifier(Arc::new(client_verifier))
        .with_single_cert(chain.clone(), key()?)
        .map_err(bad)?;
    server.alpn_protocols = vec![alpn.to_vec()];
    // No session resumption: a resumed session skips the certificate checks, so a certificate
    // revoked (or expired) since a peer's last connection would get in again. Handshakes are
    // rare (one connection per peer pair), so full ones cost nothing that matters.
    server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    server.send_tls13_tickets = 0;
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(bad)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ClusterServerVerifier::new(roots, deny, provider())))
        .with_client_auth_cert(chain, key()?)
        .map_err(bad)?;
    client.alpn_protocols = vec![alpn.to_vec()];
    client.resumption = rustls::client::Resumption::disabled();
    let quic = |error: quinn::crypto::rustls::NoInitialCipherSuite| TlsError::BadCertificate { message: error.to_string() };
    let (bulk_server, bulk_client) = bulk_configs(&server, &client, alpn);
    Ok(TlsConfigs {
        server: Arc::new(QuicServerConfig::try_from(server).map_err(quic)?),
        client: Arc::new(QuicClientConfig::try_from(client).map_err(quic)?),
        bulk_server,
        bulk_client,
        bulk_alpn: stoker_proto::bulk_alpn(alpn),
        own: Some(own),
        deny: Some(deny_list),
    })
}

/// The configs of bulk connections: those of QUIC with the bulk ALPN, and the traffic
/// secrets handed to our own record layer after the handshake.
fn bulk_configs(
    server: &rustls::ServerConfig,
    client: &rustls::ClientConfig,
    alpn: &[u8],
) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let (mut server, mut client) = (server.clone(), client.clone());
    server.alpn_protocols = vec![stoker_proto::bulk_alpn(alpn)];
    client.alpn_protocols = vec![stoker_proto::bulk_alpn(alpn)];
    server.enable_secret_extraction = true;
    client.enable_secret_extraction = true;
    // The record layer drops tickets; none are sent (or kept) at all.
    server.send_tls13_tickets = 0;
    (Arc::new(server), Arc::new(client))
}

impl std::fmt::Debug for TlsConfigs {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.own {
            None => formatter.write_str("TlsConfigs(insecure)"),
            Some(own) => write!(formatter, "TlsConfigs({own})"),
        }
    }
}

impl TlsConfigs {
    /// [`insecure_tls`] with [`ALPN`].
    pub fn insecure() -> Result<Self, NetError> {
        insecure_tls(ALPN)
    }

    /// Mutual TLS from a node's TLS directory (`ca.pem`, `node.pem`, `node.key`, optional
    /// `revoked`), as `stoker certs issue` writes it.
    pub fn from_dir(dir: &Path) -> Result<Self, TlsError> {
        let trusted = ca::read_text(&dir.join(CA_CERT))?;
        let cert = ca::read_text(&dir.join(NODE_CERT))?;
        let key = ca::read_text(&dir.join(NODE_KEY))?;
        let in_dir = |error: TlsError| match error {
            TlsError::Malformed { path, message } if path.is_relative() => TlsError::Malformed { path: dir.join(path), message },
            other => other,
        };
        mutual_tls(&trusted, &cert, &key, Some(dir.join(DENY_LIST)), ALPN).map_err(in_dir)
    }

    /// The server config of bulk connections.
    pub fn bulk_server(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.bulk_server)
    }

    /// The client config of bulk connections.
    pub fn bulk_client(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.bulk_client)
    }

    /// The ALPN of bulk connections.
    pub fn bulk_alpn(&self) -> Vec<u8> {
        self.bulk_alpn.clone()
    }

    /// Whether peers are checked (mutual TLS), rather than `--insecure`.
    pub fn is_checked(&self) -> bool {
        self.own.is_some()
    }

    /// This node's own identity (none when insecure).
    pub fn own(&self) -> Option<&Peer> {
        self.own.as_ref()
    }

    /// Whether the deny list names `key` now. Certificates are checked at the handshake; nodes
    /// ask this again for connections that stay open, so a revocation reaches them too.
    pub fn is_denied(&self, key: &CertKey) -> bool {
        self.deny.as_ref().is_some_and(|deny| deny.denies(key))
    }

    /// What TLS proved about `connection`'s peer (see [`peer_identity`]).
    pub fn peer(&self, connection: &quinn::Connection) -> Option<PeerIdentity> {
        peer_identity(connection, self.is_checked())
    }
}

#[cfg(test)]
mod tests;
