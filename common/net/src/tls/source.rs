//! Where a node's TLS comes from: the flags (`--tls-dir`, `--insecure`) or the local CA.

use std::path::PathBuf;

use tracing::{info, warn};

use super::{Role, TlsConfigs, TlsError, ensure_local, local_ca_dir};
use crate::NetError;

/// How a node or client sets up TLS.
#[derive(Clone, Debug, Default)]
pub enum TlsSource {
    /// Certificates of the local CA ([`local_ca_dir`]), made on first use: every process of
    /// this user on this machine trusts every other, and nothing else. The default, so that a
    /// single machine needs no set-up.
    #[default]
    Local,
    /// A node's TLS directory (`--tls-dir`), as `stoker certs issue` writes it.
    Dir(PathBuf),
    /// TLS material already loaded (tests, embedders).
    Loaded(TlsConfigs),
    /// No certificate checks at all (`--insecure`): encrypted, but anyone may do anything.
    Insecure,
}

impl TlsSource {
    /// From the flags: `--tls-dir` and `--insecure` exclude each other; neither is the local CA.
    pub fn from_flags(dir_opt: Option<PathBuf>, insecure: bool) -> Result<Self, TlsError> {
        match (dir_opt, insecure) {
            (Some(dir), true) => Err(TlsError::Malformed {
                path: dir,
                message: "--tls-dir and --insecure exclude each other (STOKER_TLS_DIR may be set in the environment)".to_owned(),
            }),
            (Some(dir), false) => Ok(Self::Dir(dir)),
            (None, true) => Ok(Self::Insecure),
            (None, false) => Ok(Self::Local),
        }
    }

    /// The configs of a peer of `role`; a certificate of another role is refused here, before
    /// any peer refuses it.
    pub fn load(&self, role: Role) -> Result<TlsConfigs, NetError> {
        self.load_as(Some(role), None)
    }

    /// The configs of coordinator `node_id`: from the local CA, a certificate bound to that
    /// node id (the coordinator itself refuses a certificate of another id at start).
    pub fn load_coordinator(&self, node_id: u64) -> Result<TlsConfigs, NetError> {
        self.load_as(Some(Role::Coordinator), Some(node_id))
    }

    /// The configs of a client that makes requests needing `needed` (`None`: any role will do,
    /// as for `stoker status`; the local CA then issues an admin certificate).
    pub fn load_for(&self, needed: Option<Role>) -> Result<TlsConfigs, NetError> {
        self.load_as(needed, None)
    }

    fn load_as(&self, needed: Option<Role>, node_id: Option<u64>) -> Result<TlsConfigs, NetError> {
        let configs = match self {
            Self::Insecure => {
                warn!("INSECURE: --insecure: certificates are not checked; anyone who reaches a Stoker port may do anything");
                return TlsConfigs::insecure();
            }
            Self::Loaded(configs) => configs.clone(),
            Self::Dir(dir) => TlsConfigs::from_dir(dir)?,
            Self::Local => {
                let role = needed.unwrap_or(Role::Admin);
                let dir = ensure_local(&local_ca_dir(), role, node_id.filter(|_| role == Role::Coordinator))?;
                info!(dir = %dir.display(), "TLS with the local CA (this machine only; for several hosts see `stoker certs`)");
                TlsConfigs::from_dir(&dir)?
            }
        };
        match (configs.own(), needed) {
            (Some(own), Some(role)) if own.role != role => Err(NetError::Tls(TlsError::BadCertificate {
                message: format!(
                    "this process needs the {role} role, but its certificate is {own}: issue one with `stoker certs issue --role {role}`"
                ),
            })),
            _ => Ok(configs),
        }
    }
}
