//! What a PEM file of certificates holds, for `stoker certs show` and `revoke`.

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::TlsError;
use super::identity::{cert_key, describe};
use stoker_plan::ids::CertKey;

/// One certificate, described.
#[derive(Clone, Debug)]
pub struct CertSummary {
    /// Its subject.
    pub subject: String,
    /// Its issuer.
    pub issuer: String,
    /// The Stoker role it names, if any (a CA names none).
    pub role: Option<String>,
    /// Its name (common name).
    pub name: String,
    /// The Raft node id a coordinator certificate is bound to.
    pub node_id: Option<u64>,
    /// Valid from.
    pub not_before: String,
    /// Valid until.
    pub not_after: String,
    /// Whether it is valid now.
    pub valid_now: bool,
    /// The SHA-256 of its public key.
    pub key: CertKey,
}

/// Describe every certificate in PEM `text`.
pub fn summarize_pem(text: &str) -> Result<Vec<CertSummary>, TlsError> {
    let bad = |message: String| TlsError::BadCertificate { message };
    let mut summaries = Vec::new();
    for cert in CertificateDer::pem_slice_iter(text.as_bytes()) {
        let der = cert.map_err(|error| bad(format!("not PEM certificates: {error}")))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).map_err(|error| bad(format!("cannot parse: {error}")))?;
        let peer_opt = describe(&der).ok();
        summaries.push(CertSummary {
            subject: parsed.subject().to_string(),
            issuer: parsed.issuer().to_string(),
            role: peer_opt.as_ref().map(|peer| peer.role.to_string()),
            node_id: peer_opt.as_ref().and_then(|peer| peer.node_id),
            name: peer_opt.map(|peer| peer.name).unwrap_or_default(),
            not_before: parsed.validity().not_before.to_string(),
            not_after: parsed.validity().not_after.to_string(),
            valid_now: parsed.validity().is_valid(),
            key: cert_key(der.as_ref()),
        });
    }
    if summaries.is_empty() {
        return Err(bad("no PEM certificate in it".to_owned()));
    }
    Ok(summaries)
}
