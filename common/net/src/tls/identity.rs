//! Who a peer is: the role and name its certificate names (subject OU and CN, as
//! [`super::ClusterCa::issue`] writes them), a coordinator's Raft node id (a URI subject
//! alternative name `urn:stoker:node-id:N`) and the certificate's SHA-256.

use std::fmt;

use quinn::Connection;
use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};

use super::TlsError;
use stoker_plan::ids::CertKey;
use stoker_proto::ControlRequest;

/// What a certificate lets its holder do (DESIGN §10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Speaks Raft with the other coordinators; serves the control plane.
    Coordinator,
    /// Pulls chunks, reports them, pushes batches to trainers.
    Worker,
    /// Attaches to jobs, opens epochs, reports progress of its own session.
    Trainer,
    /// Adds and removes datasets, jobs and coordinators.
    Admin,
}

impl Role {
    /// Every role.
    pub const ALL: [Self; 4] = [Self::Coordinator, Self::Worker, Self::Trainer, Self::Admin];

    /// Its name, as certificates and flags spell it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Coordinator => "coordinator",
            Self::Worker => "worker",
            Self::Trainer => "trainer",
            Self::Admin => "admin",
        }
    }

    /// The role a request needs; `None`: any certified peer may ask (read-only requests).
    pub fn required_for(request: &ControlRequest) -> Option<Self> {
        match request {
            ControlRequest::AddDataset { .. }
            | ControlRequest::RemoveJob { .. }
            | ControlRequest::AddNode { .. }
            | ControlRequest::RemoveNode { .. } => Some(Self::Admin),
            ControlRequest::Attach { .. }
            | ControlRequest::OpenEpoch { .. }
            | ControlRequest::ReportProgress { .. }
            | ControlRequest::Detach { .. } => Some(Self::Trainer),
            ControlRequest::RegisterWorker { .. }
            | ControlRequest::Heartbeat { .. }
            | ControlRequest::PullChunks { .. }
            | ControlRequest::ChunkDone { .. }
            | ControlRequest::ChunkFailed { .. }
            | ControlRequest::ChunkFatal { .. }
            | ControlRequest::Deregister { .. } => Some(Self::Worker),
            ControlRequest::Raft { .. } => Some(Self::Coordinator),
            ControlRequest::ListDatasets | ControlRequest::Status | ControlRequest::NodeStatus => None,
        }
    }

    /// The role named `text`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|role| role.as_str() == text)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// A peer as its certificate proves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its role.
    pub role: Role,
    /// Its name (the certificate's common name).
    pub name: String,
    /// The Raft node id a coordinator certificate is bound to ([`NODE_ID_URI`]); none in other
    /// roles' certificates and in coordinator certificates of earlier versions.
    pub node_id: Option<u64>,
    /// The certificate's SHA-256.
    pub key: CertKey,
}

impl fmt::Display for Peer {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.node_id {
            Some(id) => write!(formatter, "{} '{}' node {id} ({})", self.role, self.name, self.key),
            None => write!(formatter, "{} '{}' ({})", self.role, self.name, self.key),
        }
    }
}

/// The prefix of the URI subject alternative name that binds a coordinator certificate to its
/// Raft node id: `urn:stoker:node-id:3` is node 3 (decimal, as `--node-id` takes it).
pub const NODE_ID_URI: &str = "urn:stoker:node-id:";

/// The URI subject alternative name of node `id`.
pub(crate) fn node_id_uri(id: u64) -> String {
    format!("{NODE_ID_URI}{id}")
}

/// The node id in a certificate's URI subject alternative names: none if it names none; an
/// error if it names more than one or one that is not a decimal number.
fn node_id_of(cert: &x509_parser::certificate::X509Certificate<'_>) -> Result<Option<u64>, TlsError> {
    let bad = |message: String| TlsError::BadCertificate { message };
    let names = cert.subject_alternative_name().map_err(|error| bad(format!("unreadable subject alternative names: {error}")))?;
    let mut ids = names.iter().flat_map(|names| names.value.general_names.iter()).filter_map(|name| match name {
        x509_parser::extensions::GeneralName::URI(uri) => uri.strip_prefix(NODE_ID_URI),
        _ => None,
    });
    let Some(text) = ids.next() else { return Ok(None) };
    if ids.next().is_some() {
        return Err(bad("it names more than one Raft node id".to_owned()));
    }
    // Digits only: `+3` or ` 3` would parse, and two spellings of one id are one too many.
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(bad(format!("its Raft node id {text:?} is not a decimal number")));
    }
    text.parse().map(Some).map_err(|error| bad(format!("its Raft node id {text:?}: {error}")))
}

/// What TLS proved about the other end of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerIdentity {
    /// Nothing: this node runs `--insecure`, so any peer may do anything.
    Unchecked,
    /// A certificate of the cluster CA.
    Certified(Peer),
}

impl PeerIdentity {
    /// Whether this peer may act as `role`.
    pub fn is(&self, role: Role) -> bool {
        match self {
            Self::Unchecked => true,
            Self::Certified(peer) => peer.role == role,
        }
    }

    /// Its certificate's key ([`CertKey::UNCHECKED`] when unchecked).
    pub fn key(&self) -> CertKey {
        match self {
            Self::Unchecked => CertKey::UNCHECKED,
            Self::Certified(peer) => peer.key,
        }
    }

    /// The Raft node id its certificate is bound to, when certified and it names one.
    pub fn node_id(&self) -> Option<u64> {
        match self {
            Self::Unchecked => None,
            Self::Certified(peer) => peer.node_id,
        }
    }

    /// Its role, when certified.
    pub fn role(&self) -> Option<Role> {
        match self {
            Self::Unchecked => None,
            Self::Certified(peer) => Some(peer.role),
        }
    }
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unchecked => formatter.write_str("an unchecked peer (--insecure)"),
            Self::Certified(peer) => write!(formatter, "{peer}"),
        }
    }
}

/// A certificate's key: the SHA-256 of its subject public key (SPKI), not of the whole
/// certificate. The holder of an ECDSA certificate can re-encode its signature (s for n − s)
/// into different bytes that still verify; a fingerprint of the bytes would then miss the deny
/// list. Its key pair it cannot change. Bytes that do not parse as a certificate are hashed
/// whole (they pass no handshake anyway).
pub fn cert_key(der: &[u8]) -> CertKey {
    let hashed = match x509_parser::parse_x509_certificate(der) {
        Ok((_, cert)) => cert.tbs_certificate.subject_pki.raw,
        Err(_) => der,
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, hashed);
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    CertKey(key)
}

/// The role, name, node id and key of a Stoker certificate.
pub fn describe(der: &CertificateDer<'_>) -> Result<Peer, TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|error| TlsError::BadCertificate { message: format!("cannot parse it: {error}") })?;
    let subject = cert.subject();
    let text = |attribute: &x509_parser::x509::AttributeTypeAndValue<'_>| attribute.as_str().ok().map(str::to_owned);
    let unit_opt = subject.iter_organizational_unit().find_map(text);
    let role = unit_opt.as_deref().and_then(Role::parse).ok_or_else(|| TlsError::BadCertificate {
        message: format!(
            "it names no Stoker role (subject OU {:?}; one of coordinator, worker, trainer, admin): issue it with `stoker certs issue`",
            unit_opt.unwrap_or_default()
        ),
    })?;
    let name = subject.iter_common_name().find_map(text).unwrap_or_default();
    let node_id = node_id_of(&cert)?;
    Ok(Peer { role, name, node_id, key: cert_key(der.as_ref()) })
}

/// What TLS proved about `connection`'s peer: [`PeerIdentity::Unchecked`] when `checked` is
/// false (this node runs `--insecure`). A checked connection without a readable certificate
/// cannot exist (the handshake demands one); should it, the peer gets no role at all.
pub fn peer_identity(connection: &Connection, checked: bool) -> Option<PeerIdentity> {
    if !checked {
        return Some(PeerIdentity::Unchecked);
    }
    let any = connection.peer_identity()?;
    let chain = any.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    chain_identity(&chain, checked)
}

/// What a certificate chain the handshake verified proves (see [`peer_identity`]).
pub(crate) fn chain_identity(chain: &[CertificateDer<'static>], checked: bool) -> Option<PeerIdentity> {
    if !checked {
        return Some(PeerIdentity::Unchecked);
    }
    describe(chain.first()?).ok().map(PeerIdentity::Certified)
}
