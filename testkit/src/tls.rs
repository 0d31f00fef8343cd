//! The test cluster's TLS: a fresh cluster CA per cluster and one certificate per role (mutual
//! TLS, as a deployed cluster runs), or `--insecure`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use stoker_net::{CERT_VALIDITY, ClusterCa, DENY_LIST, Role, TlsConfigs, Validity, mutual_tls};
use stoker_plan::ids::CertKey;
use stoker_proto::ALPN;

use crate::TestkitError;

/// A cluster's certificates: the CA (to issue more, as tests of refusals do), one set of TLS
/// configs per role (the coordinator's is node 1's) and one per coordinator node id.
#[derive(Debug)]
pub struct ClusterTls {
    ca_opt: Option<ClusterCa>,
    /// The deny list every node of the cluster reads (in a folder removed on drop).
    deny_dir: Option<PathBuf>,
    configs: BTreeMap<&'static str, TlsConfigs>,
    /// Each coordinator's own certificate, bound to its node id, issued on first use.
    coordinators: parking_lot::Mutex<BTreeMap<u64, TlsConfigs>>,
    insecure: TlsConfigs,
}

impl ClusterTls {
    /// A new CA and a certificate for each role; `insecure`: none, nothing checked.
    pub fn new(insecure: bool) -> Result<Self, TestkitError> {
        let plain = TlsConfigs::insecure().map_err(|error| error.to_string())?;
        if insecure {
            return Ok(Self { ca_opt: None, deny_dir: None, configs: BTreeMap::new(), coordinators: Default::default(), insecure: plain });
        }
        let ca = ClusterCa::generate("Stoker test CA", Validity::from_now(CERT_VALIDITY)).map_err(|error| error.to_string())?;
        let deny_dir = crate::unique_temp_dir("stoker-tls")?;
        let deny = deny_dir.join(DENY_LIST);
        let mut configs = BTreeMap::new();
        for role in Role::ALL {
            let node_id = (role == Role::Coordinator).then_some(1);
            configs.insert(role.as_str(), issue_with_deny_list(&ca, role, node_id, &deny)?);
        }
        let coordinators =
            parking_lot::Mutex::new(configs.get(Role::Coordinator.as_str()).map(|node| (1, node.clone())).into_iter().collect());
        Ok(Self { ca_opt: Some(ca), deny_dir: Some(deny_dir), configs, coordinators, insecure: plain })
    }

    /// The configs of coordinator `node_id`: a certificate bound to that node id (peers take
    /// its Raft messages only as that node's).
    pub fn coordinator(&self, node_id: u64) -> Result<TlsConfigs, TestkitError> {
        let (Some(ca), Some(deny_dir)) = (&self.ca_opt, &self.deny_dir) else { return Ok(self.insecure.clone()) };
        let mut coordinators = self.coordinators.lock();
        if let Some(configs) = coordinators.get(&node_id) {
            return Ok(configs.clone());
        }
        let configs = issue_with_deny_list(ca, Role::Coordinator, Some(node_id), &deny_dir.join(DENY_LIST))?;
        coordinators.insert(node_id, configs.clone());
        Ok(configs)
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

/// A certificate of `ca` for `role` (coordinator `node_id`), reading the cluster's deny list.
fn issue_with_deny_list(ca: &ClusterCa, role: Role, node_id: Option<u64>, deny: &std::path::Path) -> Result<TlsConfigs, TestkitError> {
    let name = match node_id {
        Some(id) => format!("test-{role}-{id}"),
        None => format!("test-{role}"),
    };
    let issued = ca.issue(role, &name, node_id, &["localhost".to_owned()], Validity::from_now(CERT_VALIDITY));
    let issued = issued.map_err(|error| error.to_string())?;
    mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, Some(deny.to_owned()), ALPN).map_err(|error| error.to_string())
}

/// TLS configs with a new certificate of `ca` for `role` (a coordinator's bound to `node_id`),
/// trusting `ca` only.
pub fn issue_node_configs(
    ca: &ClusterCa,
    role: Role,
    name: &str,
    node_id: Option<u64>,
    validity: Validity,
) -> Result<TlsConfigs, TestkitError> {
    let issued = ca.issue(role, name, node_id, &["localhost".to_owned()], validity).map_err(|error| error.to_string())?;
    mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, None, ALPN).map_err(|error| error.to_string())
}

/// TLS configs with a new certificate of `ca` for `role` (a coordinator's is node 1's),
/// trusting `ca` only.
pub fn issue_configs(ca: &ClusterCa, role: Role, name: &str, validity: Validity) -> Result<TlsConfigs, TestkitError> {
    let node_id = (role == Role::Coordinator).then_some(1);
    let issued = ca.issue(role, name, node_id, &["localhost".to_owned()], validity).map_err(|error| error.to_string())?;
    mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, None, ALPN).map_err(|error| error.to_string())
}
