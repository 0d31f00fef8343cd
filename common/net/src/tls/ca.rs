//! The cluster CA (`stoker certs`): make one, load it, issue node and client certificates, and
//! the local CA that a single machine uses when no `--tls-dir` is given.
//!
//! A CA directory holds `ca.pem` and `ca.key` (owner-only). A node's TLS directory holds
//! `ca.pem` (the CAs it trusts: one, or two during a rotation), `node.pem`, `node.key` and,
//! optionally, `revoked` (the deny list).

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType, SerialNumber,
};
use tracing::info;

use super::TlsError;
use super::identity::{Role, cert_key, node_id_uri};
use crate::random::{self, random_u64};
use stoker_plan::ids::CertKey;

/// File names in a CA directory and a node's TLS directory.
pub const CA_CERT: &str = "ca.pem";
/// The CA's private key (CA directory only).
pub const CA_KEY: &str = "ca.key";
/// A node's certificate.
pub const NODE_CERT: &str = "node.pem";
/// A node's private key.
pub const NODE_KEY: &str = "node.key";
/// The deny list of a node's TLS directory.
pub const DENY_LIST: &str = "revoked";

/// How long a CA is valid by default: 10 years.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 86_400);
/// How long a node certificate is valid by default: 1 year.
pub const CERT_VALIDITY: Duration = Duration::from_secs(365 * 86_400);

/// When a certificate is valid.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    /// From.
    pub not_before: SystemTime,
    /// Until.
    pub not_after: SystemTime,
}

impl Validity {
    /// From an hour ago (clocks differ a little) for `length`.
    pub fn from_now(length: Duration) -> Self {
        let now = SystemTime::now();
        Self { not_before: now - Duration::from_secs(3600), not_after: now + length }
    }
}

/// A certificate and its key, issued by a [`ClusterCa`].
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
    /// The SHA-256 of its public key (what the deny list names).
    pub key: CertKey,
}

/// A cluster CA that can issue certificates.
pub struct ClusterCa {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ClusterCa")
    }
}

fn generation(error: rcgen::Error) -> TlsError {
    TlsError::Generate { message: error.to_string() }
}

fn random_serial() -> Result<SerialNumber, TlsError> {
    let mut bytes = [0u8; 16];
    random::fill(&mut bytes).map_err(|error| TlsError::Generate { message: error.to_string() })?;
    // Positive, and never a leading zero byte (DER integers are minimal).
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}

impl ClusterCa {
    /// A new CA named `name` and a random id, valid as `validity` says. The id keeps two CAs
    /// of one name apart: a certificate of the other is then "not signed by a trusted CA",
    /// not a signature that fails to verify against a namesake.
    pub fn generate(name: &str, validity: Validity) -> Result<Self, TlsError> {
        let key = KeyPair::generate().map_err(generation)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, format!("{name} {:08x}", random_u64() as u32));
        params.distinguished_name.push(DnType::OrganizationName, "stoker");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = validity.not_before.into();
        params.not_after = validity.not_after.into();
        params.serial_number = Some(random_serial()?);
        let cert = params.self_signed(&key).map_err(generation)?;
        let key_pem = key.serialize_pem();
        Ok(Self { cert_pem: cert.pem(), key_pem, issuer: Issuer::new(params, key) })
    }

    /// The CA kept in `dir` (`ca.pem`, `ca.key`).
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let cert_pem = read_text(&dir.join(CA_CERT))?;
        let key_pem = read_text(&dir.join(CA_KEY))?;
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|error| TlsError::Malformed { path: dir.join(CA_KEY), message: format!("not a private key: {error}") })?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .map_err(|error| TlsError::Malformed { path: dir.join(CA_CERT), message: format!("not a CA certificate: {error}") })?;
        Ok(Self { cert_pem, key_pem, issuer })
    }

    /// Write it to `dir` (created; the key readable by its owner only). Refuses to overwrite
    /// a CA already there: every certificate it issued would stop working.
    pub fn write(&self, dir: &Path) -> Result<(), TlsError> {
        if dir.join(CA_KEY).exists() || dir.join(CA_CERT).exists() {
            return Err(TlsError::Exists { path: dir.join(CA_CERT) });
        }
        fs::create_dir_all(dir).map_err(|source| TlsError::Write { path: dir.to_owned(), source })?;
        write_file(&dir.join(CA_KEY), &self.key_pem, true)?;
        write_file(&dir.join(CA_CERT), &self.cert_pem, false)
    }

    /// Its certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A certificate for a peer of `role` named `name`, usable to serve and to dial (server
    /// and client authentication), with `hosts` as its DNS or IP subject names. A coordinator
    /// certificate is bound to its Raft node id `node_id` (required for that role, refused for
    /// the others): peers accept its Raft messages only as that node's.
    pub fn issue(&self, role: Role, name: &str, node_id: Option<u64>, hosts: &[String], validity: Validity) -> Result<Issued, TlsError> {
        if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
            return Err(TlsError::Generate { message: format!("a certificate name must be 1 to 64 printable characters, not {name:?}") });
        }
        match (role, node_id) {
            (Role::Coordinator, None) => {
                return Err(TlsError::Generate {
                    message: "a coordinator certificate names its Raft node id (`--node-id N`, the node's own --node-id)".to_owned(),
                });
            }
            (Role::Coordinator, Some(0)) => {
                return Err(TlsError::Generate { message: "Raft node ids start at 1".to_owned() });
            }
            (Role::Coordinator, Some(_)) | (_, None) => {}
            (other, Some(_)) => {
                return Err(TlsError::Generate {
                    message: format!("only coordinator certificates name a Raft node id; a {other} certificate takes no --node-id"),
                });
            }
        }
        let key = KeyPair::generate().map_err(generation)?;
        let mut names = vec!["stoker".to_owned()];
        names.extend(hosts.iter().cloned());
        let mut params = CertificateParams::new(names).map_err(generation)?;
        if let Some(id) = node_id {
            let uri = node_id_uri(id).try_into().map_err(generation)?;
            params.subject_alt_names.push(SanType::URI(uri));
        }
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.distinguished_name.push(DnType::OrganizationName, "stoker");
        params.distinguished_name.push(DnType::OrganizationalUnitName, role.as_str());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = validity.not_before.into();
        params.not_after = validity.not_after.into();
        params.serial_number = Some(random_serial()?);
        let cert = params.signed_by(&key, &self.issuer).map_err(generation)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem(), key: cert_key(cert.der().as_ref()) })
    }
}

impl Issued {
    /// Write a node's TLS directory: this certificate and key, and `trusted` (the CA bundle) as
    /// `ca.pem`. Existing files are replaced (a renewal).
    pub fn write_node_dir(&self, dir: &Path, trusted: &str) -> Result<(), TlsError> {
        fs::create_dir_all(dir).map_err(|source| TlsError::Write { path: dir.to_owned(), source })?;
        write_file(&dir.join(NODE_KEY), &self.key_pem, true)?;
        write_file(&dir.join(NODE_CERT), &self.cert_pem, false)?;
        write_file(&dir.join(CA_CERT), trusted, false)
    }
}

pub(crate) fn read_text(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

/// Write `text` to `path` through a temporary file and a rename (a reader never sees half a
/// key), owner-only when `secret`.
fn write_file(path: &Path, text: &str, secret: bool) -> Result<(), TlsError> {
    let temporary = path.with_extension(format!("tmp-{}", std::process::id()));
    let failure = |source| TlsError::Write { path: path.to_owned(), source };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true).mode(if secret { 0o600 } else { 0o644 });
    let mut file = options.open(&temporary).map_err(failure)?;
    file.write_all(text.as_bytes()).map_err(failure)?;
    file.sync_all().map_err(failure)?;
    fs::rename(&temporary, path).map_err(failure)
}

/// Where the local CA lives: `$STOKER_LOCAL_CA`, else `$XDG_DATA_HOME/stoker/local-ca`, else
/// `~/.local/share/stoker/local-ca`.
pub fn local_ca_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("STOKER_LOCAL_CA").filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir);
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data.join("stoker/local-ca")
}

/// The TLS directory of `role` under the local CA in `dir`, making the CA and the certificate
/// on first use. Every process of one user on one machine shares them; processes starting
/// together race safely (each makes its own and renames it into place; the first wins). A
/// coordinator's certificate names its Raft node id `node_id` (one directory per id,
/// `coordinator-N`); the other roles take none.
pub fn ensure_local(dir: &Path, role: Role, node_id: Option<u64>) -> Result<PathBuf, TlsError> {
    if !dir.join(CA_KEY).exists() {
        let staging = staging_dir(dir)?;
        let ca = ClusterCa::generate("Stoker local CA", Validity::from_now(CA_VALIDITY))?;
        ca.write(&staging)?;
        if fs::rename(&staging, dir).is_ok() {
            info!(dir = %dir.display(), "made the local CA (single machine only; for a cluster see `stoker certs init`)");
        } else {
            let _ = fs::remove_dir_all(&staging);
        }
    }
    let (node, name) = match node_id {
        Some(id) => (dir.join(format!("{role}-{id}")), format!("local-{role}-{id}")),
        None => (dir.join(role.as_str()), format!("local-{role}")),
    };
    if !node.join(NODE_CERT).exists() {
        let ca = ClusterCa::load(dir)?;
        let issued = ca.issue(role, &name, node_id, &["localhost".to_owned()], Validity::from_now(CA_VALIDITY))?;
        let staging = staging_dir(&node)?;
        issued.write_node_dir(&staging, ca.cert_pem())?;
        if fs::rename(&staging, &node).is_err() {
            let _ = fs::remove_dir_all(&staging);
        }
    }
    Ok(node)
}

/// A fresh directory beside `dir` to build it in.
fn staging_dir(dir: &Path) -> Result<PathBuf, TlsError> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|source| TlsError::Write { path: parent.to_owned(), source })?;
    let nonce = random_u64();
    let name = format!(".{}.{}", dir.file_name().and_then(|name| name.to_str()).unwrap_or("tls"), nonce);
    Ok(parent.join(name))
}
