//! The cluster CA, the deny list and the handshake checks, over real QUIC on loopback.

use std::net::UdpSocket;
use std::time::{Duration, SystemTime};

use super::*;
use crate::{NetError, Tuning, client_endpoint, connect, serve_calls, server_endpoint};
use stoker_plan::ids::CertKey;
use stoker_proto::wire::CONTROL_FRAME_LIMIT;
use stoker_proto::{ControlRequest, ControlResponse, RemoteError};

fn valid() -> Validity {
    Validity::from_now(CERT_VALIDITY)
}

fn configs(ca: &ClusterCa, trusted: &str, role: Role, deny: Option<PathBuf>) -> TlsConfigs {
    let issued = ca.issue(role, &format!("unit-{role}"), (role == Role::Coordinator).then_some(1), &[], valid()).expect("issue");
    mutual_tls(trusted, &issued.cert_pem, &issued.key_pem, deny, ALPN).expect("tls")
}

/// Serve `ListDatasets` with `tls` on loopback until the runtime ends; its address.
fn serve(tls: &TlsConfigs) -> std::net::SocketAddr {
    let endpoint = server_endpoint(UdpSocket::bind("127.0.0.1:0").expect("socket"), tls, Tuning::default()).expect("endpoint");
    let addr = endpoint.local_addr().expect("address");
    tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            let Ok(connection) = incoming.await else { continue };
            tokio::spawn(serve_calls(connection, crate::ServeLimits::new(CONTROL_FRAME_LIMIT), |_request: ControlRequest| async {
                Ok::<_, RemoteError>(ControlResponse::Datasets { datasets: Vec::new() })
            }));
        }
    });
    addr
}

/// Whether a call from `tls` to `addr` is served.
async fn served(tls: &TlsConfigs, addr: std::net::SocketAddr) -> Result<(), NetError> {
    let endpoint = client_endpoint(tls, addr, Tuning::default())?;
    let connection = connect(&endpoint, addr, Duration::from_secs(5)).await?;
    crate::call::<_, ControlResponse>(&connection, &ControlRequest::ListDatasets, CONTROL_FRAME_LIMIT).await?;
    Ok(())
}

#[test]
fn an_issued_certificate_names_its_role_and_name() {
    let ca = ClusterCa::generate("unit CA", valid()).expect("CA");
    let issued = ca.issue(Role::Worker, "w-7", None, &["10.0.0.7".to_owned()], valid()).expect("issue");
    let tls = mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, None, ALPN).expect("tls");
    let own = tls.own().expect("checked");
    assert_eq!((own.role, own.name.as_str(), own.key), (Role::Worker, "w-7", issued.key));
    let summary = summarize_pem(&issued.cert_pem).expect("summary");
    assert_eq!(summary[0].role.as_deref(), Some("worker"));
    // The CA's own certificate names no role: it cannot be used as a node's.
    let refused = mutual_tls(ca.cert_pem(), ca.cert_pem(), &issued.key_pem, None, ALPN).expect_err("a CA certificate");
    assert!(refused.to_string().contains("names no Stoker role"), "{refused}");
    assert!(ca.issue(Role::Admin, "", None, &[], valid()).is_err(), "an empty name");
}

#[test]
fn a_coordinator_certificate_names_its_node_id_and_only_a_coordinators_does() {
    let ca = ClusterCa::generate("unit CA", valid()).expect("CA");
    let issued = ca.issue(Role::Coordinator, "c3", Some(3), &[], valid()).expect("issue");
    let tls = mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, None, ALPN).expect("tls");
    assert_eq!(tls.own().map(|own| (own.role, own.node_id)), Some((Role::Coordinator, Some(3))));
    assert_eq!(summarize_pem(&issued.cert_pem).expect("summary")[0].node_id, Some(3));
    let worker = ca.issue(Role::Worker, "w", None, &[], valid()).expect("issue");
    assert_eq!(summarize_pem(&worker.cert_pem).expect("summary")[0].node_id, None);
    let missing = ca.issue(Role::Coordinator, "c", None, &[], valid()).expect_err("no node id");
    assert!(missing.to_string().contains("names its Raft node id"), "{missing}");
    let extra = ca.issue(Role::Trainer, "t", Some(2), &[], valid()).expect_err("a trainer with a node id");
    assert!(extra.to_string().contains("only coordinator certificates"), "{extra}");
    assert!(ca.issue(Role::Coordinator, "c", Some(0), &[], valid()).is_err(), "node ids start at 1");
}

#[test]
fn a_ca_written_and_loaded_again_issues_certificates_the_first_one_trusts() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = ClusterCa::generate("unit CA", valid()).expect("CA");
    ca.write(dir.path()).expect("write");
    assert!(matches!(ca.write(dir.path()), Err(TlsError::Exists { .. })), "a second CA over the first is refused");
    let loaded = ClusterCa::load(dir.path()).expect("load");
    let node = dir.path().join("node");
    loaded.issue(Role::Trainer, "t", None, &[], valid()).expect("issue").write_node_dir(&node, ca.cert_pem()).expect("node dir");
    let tls = TlsConfigs::from_dir(&node).expect("from dir");
    assert_eq!(tls.own().map(|own| own.role), Some(Role::Trainer));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(node.join(NODE_KEY)).expect("key").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key is its owner's only");
}

#[test]
fn the_deny_list_is_read_again_when_it_changes_and_a_broken_one_keeps_the_last_good_in_force() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join(DENY_LIST);
    let (one, two) = (CertKey([1; 32]), CertKey([2; 32]));
    let list = DenyList::at(Some(path.clone())).expect("absent is empty");
    assert!(!list.denies(&one));
    std::fs::write(&path, format!("# revoked\n{} # a worker\n", one.hex())).expect("write");
    assert!(list.denies(&one) && !list.denies(&two));
    // Caught half-written (review of issue 19: a broken list used to refuse every peer).
    std::fs::write(&path, format!("{}\n{}", one.hex(), &two.hex()[..20])).expect("write");
    assert!(list.denies(&one) && !list.denies(&two), "the last good list stays in force");
    std::fs::write(&path, format!("{}\n{}\n", one.hex(), two.hex())).expect("write");
    assert!(list.denies(&one) && list.denies(&two), "the mended file is read at the next check");
    std::fs::write(&path, "not a fingerprint\n").expect("write");
    assert!(list.denies(&two), "a broken file lifts no revocation");
    assert!(matches!(DenyList::at(Some(path)), Err(TlsError::Malformed { .. })), "a broken list is refused at start");
}

#[test]
fn flags_choose_the_source_and_refuse_both() {
    assert!(matches!(TlsSource::from_flags(None, false), Ok(TlsSource::Local)));
    assert!(matches!(TlsSource::from_flags(None, true), Ok(TlsSource::Insecure)));
    assert!(TlsSource::from_flags(Some(PathBuf::from("d")), true).is_err());
}

#[test]
fn processes_racing_to_make_the_local_ca_share_one() {
    let dir = tempfile::tempdir().expect("dir");
    let local = dir.path().join("local-ca");
    let keys: Vec<CertKey> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let node = ensure_local(&local, Role::Worker, None).expect("local");
                    TlsConfigs::from_dir(&node).expect("tls").own().expect("checked").key
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("thread")).collect()
    });
    assert!(keys.windows(2).all(|pair| pair[0] == pair[1]), "one certificate for the role: {keys:?}");
    let staging: Vec<_> = std::fs::read_dir(dir.path()).expect("list").filter_map(Result::ok).map(|entry| entry.file_name()).collect();
    assert_eq!(staging.len(), 1, "no staging folder left behind: {staging:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_rotation_a_bundle_of_two_cas_accepts_both_and_a_single_one_refuses_the_other() {
    let (old, new) = (ClusterCa::generate("old", valid()).expect("CA"), ClusterCa::generate("new", valid()).expect("CA"));
    let bundle = format!("{}{}", old.cert_pem(), new.cert_pem());
    let server = serve(&configs(&new, &bundle, Role::Coordinator, None));
    served(&configs(&old, &bundle, Role::Admin, None), server).await.expect("an old-CA client during the rotation");
    served(&configs(&new, new.cert_pem(), Role::Admin, None), server).await.expect("a new-CA client");
    let after = serve(&configs(&new, new.cert_pem(), Role::Coordinator, None));
    let refused = served(&configs(&old, &bundle, Role::Admin, None), after).await.expect_err("the old CA after the rotation");
    assert!(refused.to_string().contains("not signed by a trusted cluster CA"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_server_certificate_is_refused_by_the_client() {
    let ca = ClusterCa::generate("unit CA", valid()).expect("CA");
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let expired =
        ca.issue(Role::Coordinator, "old", Some(1), &[], Validity { not_before: now - 2 * day, not_after: now - day }).expect("issue");
    let server = serve(&mutual_tls(ca.cert_pem(), &expired.cert_pem, &expired.key_pem, None, ALPN).expect("tls"));
    let refused = served(&configs(&ca, ca.cert_pem(), Role::Admin, None), server).await.expect_err("expired");
    assert!(refused.to_string().contains("this node refused the peer's certificate: the certificate has expired"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refuses_a_server_of_another_role_or_with_another_key_than_named() {
    let ca = ClusterCa::generate("unit CA", valid()).expect("CA");
    let worker = configs(&ca, ca.cert_pem(), Role::Worker, None);
    let worker_key = worker.own().expect("checked").key;
    let server = serve(&worker);
    let trainer = configs(&ca, ca.cert_pem(), Role::Trainer, None);
    let endpoint = client_endpoint(&trainer, server, Tuning::default()).expect("endpoint");
    let wrong_role = crate::connect_to(&endpoint, server, Duration::from_secs(5), Role::Coordinator).await.expect_err("a worker");
    assert!(
        matches!(wrong_role, NetError::WrongPeer { .. }) && wrong_role.to_string().contains("where the coordinator role"),
        "{wrong_role}"
    );
    let connection = connect(&endpoint, server, Duration::from_secs(5)).await.expect("connect");
    crate::check_peer(&connection, Role::Worker, Some(worker_key)).expect("the worker the coordinator named");
    let other = crate::check_peer(&connection, Role::Worker, Some(CertKey([9; 32]))).expect_err("another worker's key");
    assert!(other.to_string().contains("not the certificate"), "{other}");
}

/// Issue 31, item 3: a deny list rewritten with the same length and modification time (within
/// the file system's time granularity) is still read again: its content is compared.
#[test]
fn a_deny_list_rewritten_with_the_same_length_and_time_is_read_again() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join(DENY_LIST);
    let (one, two) = (CertKey([1; 32]), CertKey([2; 32]));
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let write = |key: CertKey| {
        std::fs::write(&path, format!("{}\n", key.hex())).expect("write");
        std::fs::File::options().write(true).open(&path).expect("open").set_modified(when).expect("set the time");
    };
    write(one);
    let list = DenyList::at(Some(path.clone())).expect("list");
    assert!(list.denies(&one) && !list.denies(&two));
    write(two);
    let started = std::time::Instant::now();
    while !list.denies(&two) && started.elapsed() < Duration::from_secs(5) {
        std::thread::park_timeout(Duration::from_millis(50));
    }
    assert!(list.denies(&two) && !list.denies(&one), "the new content is in force within {:?}", started.elapsed());
}
