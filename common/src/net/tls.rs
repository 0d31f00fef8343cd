//! TLS for QUIC. For now every node makes a self-signed certificate at start and peers do not
//! verify each other: traffic is encrypted but not authenticated. Mutual TLS with a cluster
//! CA (`stoker certs init`, DESIGN §10) replaces this; until then run Stoker on a trusted
//! network only.

use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::NetError;
use crate::proto::ALPN;

/// Server and client crypto configs of one node.
#[derive(Clone)]
pub struct TlsConfigs {
    /// For accepting connections.
    pub server: Arc<QuicServerConfig>,
    /// For making connections.
    pub client: Arc<QuicClientConfig>,
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
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider())))
        .with_no_client_auth();
    client.alpn_protocols = vec![alpn.to_vec()];
    Ok(TlsConfigs {
        server: Arc::new(QuicServerConfig::try_from(server).map_err(setup)?),
        client: Arc::new(QuicClientConfig::try_from(client).map_err(setup)?),
    })
}

impl std::fmt::Debug for TlsConfigs {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("TlsConfigs")
    }
}

impl TlsConfigs {
    /// [`insecure_tls`] with [`ALPN`].
    pub fn insecure() -> Result<Self, NetError> {
        insecure_tls(ALPN)
    }
}

/// Accepts any certificate but still checks the handshake signatures, so the session keys are
/// bound to the certificate the server presented.
#[derive(Debug)]
struct AcceptAnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, signature, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, signature, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
