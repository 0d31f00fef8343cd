//! Certificate checks on both ends of a handshake: signed by a CA of the node's bundle, valid
//! now, not on the deny list, and naming a Stoker role. A refusal is logged here with its
//! reason; the peer learns it from the TLS alert (see [`super::refusal_reason`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tracing::{error, warn};

use super::TlsError;
use super::identity::{cert_key, describe};
use stoker_plan::ids::CertKey;

/// Certificates refused whatever signed them: a file of the SHA-256s of their public keys, one per line
/// (`#` starts a comment), read again whenever it changes, so a revocation takes effect at the
/// next handshake without a restart. A change is seen at once when the file's modification time
/// or length changed, and otherwise by its content, compared at most every
/// [`CONTENT_CHECK_EVERY`] (issue 31, item 3: a rewrite within the file system's time
/// granularity that kept the length went unseen).
#[derive(Debug)]
pub(crate) struct DenyList {
    path: Option<PathBuf>,
    loaded: Mutex<Loaded>,
}

/// How often an unchanged-looking deny list is read to compare its content.
const CONTENT_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The deny list as last read.
#[derive(Debug, Default)]
struct Loaded {
    stamp: Option<Stamp>,
    /// The xxh3 of the bytes the keys were read from (`None`: no file).
    digest: Option<u64>,
    /// When the content was last compared.
    checked: Option<std::time::Instant>,
    keys: HashSet<CertKey>,
}

impl DenyList {
    /// The list in `path` (absent: nothing is denied until it appears).
    pub(crate) fn at(path: Option<PathBuf>) -> Result<Self, TlsError> {
        let list = Self { path, loaded: Mutex::new(Loaded::default()) };
        if let Some(path) = &list.path
            && path.exists()
        {
            let text = std::fs::read_to_string(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })?;
            let keys = parse_deny_list(path, &text)?;
            *list.loaded.lock() = Loaded {
                stamp: modified(path),
                digest: Some(xxhash_rust::xxh3::xxh3_64(text.as_bytes())),
                checked: Some(std::time::Instant::now()),
                keys,
            };
        }
        Ok(list)
    }

    /// Whether `key` is denied. A list that became unreadable or malformed since it was last
    /// read (caught half-copied, say) leaves the last good one in force, and is read again at
    /// the next check: a revocation is never lifted by a broken file, and a file being written
    /// does not cut off every peer. A list that was removed denies nothing.
    pub(crate) fn denies(&self, key: &CertKey) -> bool {
        let Some(path) = &self.path else { return false };
        let mut loaded = self.loaded.lock();
        let stamp = modified(path);
        let now = std::time::Instant::now();
        let content_due = loaded.checked.is_none_or(|checked| now.saturating_duration_since(checked) >= CONTENT_CHECK_EVERY);
        if stamp != loaded.stamp || content_due {
            loaded.checked = Some(now);
            let read = match std::fs::read_to_string(path) {
                Ok(text) => Ok(Some(text)),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(TlsError::Read { path: path.to_owned(), source }),
            };
            let digest = read.as_ref().ok().and_then(|text| text.as_ref().map(|text| xxhash_rust::xxh3::xxh3_64(text.as_bytes())));
            let changed = stamp != loaded.stamp || digest != loaded.digest;
            match read.and_then(|text| text.map(|text| parse_deny_list(path, &text)).transpose()) {
                Ok(keys) if changed => {
                    *loaded = Loaded { stamp, digest, checked: Some(now), keys: keys.unwrap_or_default() };
                }
                Ok(_) => {}
                Err(failure) => {
                    // Nothing is taken: the next check reads the file again.
                    loaded.stamp = None;
                    error!(%failure, "the deny list cannot be read: the last good one stays in force until it is fixed");
                }
            }
        }
        loaded.keys.contains(key)
    }
}

/// When a file last changed, and its length (a rewrite within the file system's time
/// granularity still changes one of them, unless it keeps the length too).
type Stamp = (SystemTime, u64);

fn modified(path: &Path) -> Option<Stamp> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// Parse the deny list `text`, read from `path`.
fn parse_deny_list(path: &Path, text: &str) -> Result<HashSet<CertKey>, TlsError> {
    let mut keys = HashSet::new();
    for (index, line) in text.lines().enumerate() {
        let entry = line.split('#').next().unwrap_or_default().trim();
        if entry.is_empty() {
            continue;
        }
        let first = entry.split_whitespace().next().unwrap_or_default();
        let key = CertKey::from_hex(first).ok_or_else(|| TlsError::Malformed {
            path: path.to_owned(),
            message: format!("line {}: expected the SHA-256 of a certificate's public key as 64 hex digits (`stoker certs revoke` writes them), got {first:?}", index + 1),
        })?;
        keys.insert(key);
    }
    Ok(keys)
}

fn revoked() -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Revoked)
}

/// The signature checks every verifier shares.
#[derive(Debug)]
struct Signatures(Arc<CryptoProvider>);

impl Signatures {
    fn tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, signature, &self.0.signature_verification_algorithms)
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, signature, &self.0.signature_verification_algorithms)
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A certificate that verified must also name a role.
fn check_role(end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
    describe(end_entity).map(|_| ()).map_err(|failure| {
        warn!(%failure, "refused a certificate of the cluster CA");
        rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
    })
}

/// How clients check the server: chain to a CA of the bundle, validity, deny list, role. The
/// name the client dialled is not checked (nodes are dialled by address, and a certificate's
/// role is what matters); callers check the role and, for workers, the key the coordinator
/// handed out.
#[derive(Debug)]
pub(crate) struct ClusterServerVerifier {
    roots: Arc<RootCertStore>,
    deny: Arc<DenyList>,
    signatures: Signatures,
}

impl ClusterServerVerifier {
    pub(crate) fn new(roots: Arc<RootCertStore>, deny: Arc<DenyList>, provider: Arc<CryptoProvider>) -> Self {
        Self { roots, deny, signatures: Signatures(provider) }
    }
}

impl ServerCertVerifier for ClusterServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.deny.denies(&cert_key(end_entity.as_ref())) {
            warn!("the server's certificate is on the deny list");
            return Err(revoked());
        }
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.signatures.0.signature_verification_algorithms.all,
        )
        .inspect_err(|failure| warn!(%failure, "refused the server's certificate"))?;
        check_role(end_entity)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls12(message, cert, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls13(message, cert, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures.schemes()
    }
}

/// How servers check clients: rustls's WebPKI client verifier (chain, validity, client-auth
/// usage) behind the deny list, then the role. A certificate is mandatory.
#[derive(Debug)]
pub(crate) struct ClusterClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    deny: Arc<DenyList>,
}

impl ClusterClientVerifier {
    pub(crate) fn new(roots: Arc<RootCertStore>, deny: Arc<DenyList>, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let inner = WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|error| TlsError::BadCertificate { message: format!("the CA bundle cannot verify clients: {error}") })?;
        Ok(Self { inner, deny })
    }
}

impl ClientCertVerifier for ClusterClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let key = cert_key(end_entity.as_ref());
        if self.deny.denies(&key) {
            warn!(%key, "refused a client certificate: it is on the deny list (revoked)");
            return Err(revoked());
        }
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
            .inspect_err(|failure| warn!(%key, %failure, "refused a client certificate"))?;
        check_role(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// What `--insecure` clients use: accepts any server certificate but still checks the
/// handshake signatures, so the session keys are bound to the certificate the server presented.
#[derive(Debug)]
pub(crate) struct AcceptAnyServer(Signatures);

impl AcceptAnyServer {
    pub(crate) fn new(provider: Arc<CryptoProvider>) -> Self {
        Self(Signatures(provider))
    }
}

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
        self.0.tls12(message, cert, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.tls13(message, cert, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.schemes()
    }
}
