//! The test cluster's TLS: a fresh cluster CA per cluster and one certificate per role (mutual
//! TLS, as a deployed cluster runs), or `--insecure`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use stoker_net::{CERT_VALIDITY, ClusterCa, DENY_LIST, Role, TlsConfigs, Validity, mutual_tls};
use stoker_plan::ids::CertKey;
use stoker_proto::ALPN;

use crate::TestkitError;

/// A cluster's certificates: the CA (to issue more, as tests of refusals do) and one set of
/// TLS configs per role.
#[derive(Debug)]
pub struct ClusterTls {
    ca_opt: Option<ClusterCa>,
    /// The deny list every node of the cluster reads (in a folder removed on drop).
    deny_dir: Option<PathBuf>,
    configs: BTreeMap<&'static str, TlsConfigs>,
    insecure: TlsConfigs,
}

impl ClusterTls {
    /// A new CA and a certificate for each role; `insecure`: none, nothing checked.
    pub fn new(insecure: bool) -> Result<Self, TestkitError> {
        let plain = TlsConfigs::insecure().map_err(|error| error.to_string())?;
        if insecure {
            return Ok(Self { ca_opt: None, deny_dir: None, configs: BTreeMap::new(), insecure: plain });
        }
        let ca = ClusterCa::generate("Stoker test CA", Validity::from_now(CERT_VALIDITY)).map_err(|error| error.to_string())?;
        let deny_dir = crate::unique_temp_dir("stoker-tls")?;
        let deny = deny_dir.join(DENY_LIST);
        let mut configs = BTreeMap::new();
        for role in Role::ALL {
            let issued = ca.issue(role, &format!("test-{role}"), &["localhost".to_owned()], Validity::from_now(CERT_VALIDITY));
            let issued = issued.map_err(|error| error.to_string())?;
            let tls = mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, Some(deny.clone()), ALPN)
                .map_err(|error| error.to_string())?;
            configs.insert(role.as_str(), tls);
        }
        Ok(Self { ca_opt: Some(ca), deny_dir: Some(deny_dir), configs, insecure: plain })
    }

    /// The configs of a peer of `role`.
    pub fn configs(&self, role: Role) -> TlsConfigs {
        self.configs.get(role.as_str()).cloned().unwrap_or_else(|| self.insecure.clone())
    }

    /// The cluster CA (none when insecure).
    pub fn ca(&self) -> Option<&ClusterCa> {
        self.ca_opt.as_ref()
    }

    /// Put `key` on the deny list every node reads (they refuse it from the next handshake).
    pub fn deny(&self, key: CertKey) -> Result<(), TestkitError> {
        let dir = self.deny_dir.as_ref().ok_or("an insecure cluster has no deny list")?;
        let mut file =
            std::fs::OpenOptions::new().create(true).append(true).open(dir.join(DENY_LIST)).map_err(|error| error.to_string())?;
        writeln!(file, "{} # denied by a test", key.hex()).map_err(|error| error.to_string())
    }
}

impl Drop for ClusterTls {
    fn drop(&mut self) {
        if let Some(dir) = &self.deny_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// TLS configs with a new certificate of `ca` for `role`, trusting `ca` only.
pub fn issue_configs(ca: &ClusterCa, role: Role, name: &str, validity: Validity) -> Result<TlsConfigs, TestkitError> {
    let issued = ca.issue(role, name, &["localhost".to_owned()], validity).map_err(|error| error.to_string())?;
    mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, None, ALPN).map_err(|error| error.to_string())
}
