//! The trust boundary (DESIGN §10): every endpoint refuses a peer without a certificate of the
//! cluster CA, with one that expired or was revoked; a valid certificate of the wrong role
//! cannot make another role's requests, nor speak for another trainer's session or another
//! worker's id; and the honest trainer's epoch completes exactly once meanwhile.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use stoker_client::Loader;
use stoker_net::{
    CERT_VALIDITY, ClusterCa, NetError, QuicCoordinator, Role, TlsConfigs, Tuning, Validity, client_endpoint, connect, insecure_tls,
};
use stoker_plan::ids::{CertKey, Epoch, JobId, LeaseId, Pass, Position, Rank, SessionId, WorkerId};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::expect_response;
use stoker_proto::wire::CONTROL_FRAME_LIMIT;
use stoker_proto::{ALPN, ControlRequest, ErrorCode, RaftKind, RemoteError, TrainerHello};
use stoker_testkit::{TestCluster, issue_configs};
use tracing::info;

use crate::common::{cluster_with, config_for};

/// A certificate of `role` from the cluster's CA, valid as `validity` says.
fn issued(cluster: &TestCluster, role: Role, name: &str, validity: Validity) -> (TlsConfigs, CertKey) {
    let ca = cluster.ca().expect("a secure cluster");
    let cert = ca.issue(role, name, (role == Role::Coordinator).then_some(1), &[], validity).expect("issue");
    let tls = stoker_net::mutual_tls(ca.cert_pem(), &cert.cert_pem, &cert.key_pem, None, ALPN).expect("tls");
    (tls, cert.key)
}

fn valid() -> Validity {
    Validity::from_now(CERT_VALIDITY)
}

/// What the coordinator answers `tls` asking for its status (the message, if refused).
fn coordinator_refusal(cluster: &TestCluster, tls: &TlsConfigs) -> Option<String> {
    cluster.call_with(tls, ControlRequest::Status).err().map(|error| error.to_string())
}

/// What worker 0 answers `tls` saying hello as a trainer (the message, if refused).
fn worker_refusal(cluster: &TestCluster, tls: &TlsConfigs) -> Option<String> {
    let worker = cluster.worker(0).expect("worker").local_addr();
    cluster.block_on(async {
        let endpoint = client_endpoint(tls, worker, Tuning::default()).expect("endpoint");
        let connection = match connect(&endpoint, worker, Duration::from_secs(5)).await {
            Ok(connection) => connection,
            Err(error) => return Some(error.to_string()),
        };
        let hello = TrainerHello { job: JobId(1), rank: Rank(0), session: SessionId(1), bulk: false };
        let answer = stoker_net::call::<_, ()>(&connection, &hello, CONTROL_FRAME_LIMIT).await;
        answer.err().map(|error: NetError| error.to_string())
    })
}

/// What worker 0's bulk port (TLS over TCP) answers `tls` saying hello (the error, if refused).
/// The hello is rank 1's, which never has a QUIC connection here (`worker_refusal` says hello
/// as rank 0, and the worker may not have seen that connection close yet).
fn bulk_refusal(cluster: &TestCluster, tls: &TlsConfigs) -> Option<String> {
    let worker = cluster.worker(0).expect("worker").local_addr();
    cluster.block_on(async {
        let mut connection = match stoker_net::bulk::connect(worker, tls, Duration::from_secs(5)).await {
            Ok(connection) => connection,
            Err(error) => return Some(error.to_string()),
        };
        let hello = TrainerHello { job: JobId(1), rank: Rank(1), session: SessionId(1), bulk: false };
        if let Err(error) = connection.writer.write_frame(&hello, CONTROL_FRAME_LIMIT).await {
            return Some(error.to_string());
        }
        match connection.reader.read_frame::<Result<(), RemoteError>>(CONTROL_FRAME_LIMIT).await {
            Ok(answer) => answer.err().map(|error| error.to_string()),
            Err(error) => Some(error.to_string()),
        }
    })
}

#[test]
fn every_endpoint_refuses_peers_without_a_valid_certificate_of_the_cluster() {
    let cluster = cluster_with(1);
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let (expired, _) = issued(&cluster, Role::Trainer, "expired", Validity { not_before: now - 2 * day, not_after: now - day });
    let other_ca = ClusterCa::generate("another CA", valid()).expect("CA");
    let foreign = issue_configs(&other_ca, Role::Trainer, "foreign", valid()).expect("tls");
    let (revoked, revoked_key) = issued(&cluster, Role::Trainer, "revoked", valid());
    let none = insecure_tls(ALPN).expect("tls");

    info!("--- a valid trainer certificate reaches both endpoints");
    assert_eq!(coordinator_refusal(&cluster, &revoked), None);
    assert_eq!(worker_refusal(&cluster, &revoked), None);
    let at_bulk = bulk_refusal(&cluster, &revoked);
    assert!(
        at_bulk.as_ref().is_some_and(|refusal| refusal.contains("joins one")),
        "no QUIC session: the hello is refused, got {at_bulk:?}"
    );
    let addrs = cluster.coordinator_list();
    let open = cluster.block_on(async { QuicCoordinator::with_addrs(addrs, &revoked).expect("client") });
    assert!(cluster.block_on(open.call(ControlRequest::Status)).is_ok(), "connected before the revocation");
    cluster.deny(revoked_key).expect("deny");
    info!("--- the connection that stayed open is refused at its next request");
    let cut = cluster.block_on(open.call(ControlRequest::Status)).expect_err("revoked while connected");
    assert!(cut.code == ErrorCode::Forbidden && cut.message.contains("revoked"), "{cut}");
    open.close();

    let cases = [
        ("no certificate", &none, "no certificate was presented", "certificate_required"),
        // The trainer does not trust the worker's CA, and refuses it first.
        ("another CA", &foreign, "not signed by a trusted cluster CA", "UnknownIssuer"),
        ("expired", &expired, "has expired", "certificate_expired"),
        ("revoked", &revoked, "revoked", "certificate_revoked"),
    ];
    for (what, tls, reason, bulk_alert) in cases {
        info!(what, "--- refused at the handshake");
        let at_coordinator = coordinator_refusal(&cluster, tls).unwrap_or_else(|| panic!("the coordinator served a peer with {what}"));
        assert!(at_coordinator.contains(reason), "{what} at the coordinator: {at_coordinator}");
        let at_worker = worker_refusal(&cluster, tls).unwrap_or_else(|| panic!("the worker served a peer with {what}"));
        assert!(at_worker.contains(reason), "{what} at the worker: {at_worker}");
        // The bulk port refuses in its TLS handshake too (the worker logs the reason; the
        // peer gets the alert).
        let at_bulk = bulk_refusal(&cluster, tls).unwrap_or_else(|| panic!("the bulk port served a peer with {what}"));
        eprintln!("{what} at the bulk port: {at_bulk}");
        assert!(at_bulk.contains(bulk_alert), "{what} at the bulk port: {at_bulk}");
    }
    info!("--- a valid certificate of another role than trainer cannot take batches");
    let at_worker = worker_refusal(&cluster, &cluster.tls(Role::Admin)).expect("an admin at the batch port");
    assert!(at_worker.contains("only trainers may connect here"), "{at_worker}");
    info!("--- a secure client refuses a server that runs --insecure");
    let plain = TestCluster::start(stoker_testkit::ClusterConfig { workers: 0, insecure: true, ..Default::default() }).expect("cluster");
    let refusal = plain.call_with(&cluster.tls(Role::Admin), ControlRequest::Status).expect_err("refused");
    assert!(refusal.to_string().contains("refused the peer's certificate"), "{refusal}");
    assert!(plain.call(ControlRequest::Status).is_ok(), "an insecure cluster serves insecure clients");
}

fn forbidden(answer: Result<stoker_proto::ControlResponse, RemoteError>, what: &str) -> String {
    let error = answer.expect_err(what);
    assert_eq!(error.code, ErrorCode::Forbidden, "{what}: {error}");
    error.message
}

#[test]
fn forged_requests_with_the_wrong_certificate_are_refused_and_the_honest_epoch_completes_once() {
    let cluster = cluster_with(1);
    let mut base = cluster.loader_config("train", 4);
    base.prefetch = 2;
    let config = config_for(&base, 0, 1);
    let mut loader = Loader::attach(&config).expect("attach");
    loader.set_epoch(Epoch(0));
    let (job, session) = (loader.job(), loader.session());
    let steps = loader.len().expect("steps");

    let trainer = cluster.tls(Role::Trainer);
    let worker = cluster.tls(Role::Worker);
    let admin = cluster.tls(Role::Admin);
    let (mallory, _) = issued(&cluster, Role::Trainer, "mallory", valid());
    let (rogue_worker, _) = issued(&cluster, Role::Worker, "rogue-worker", valid());
    let workers = expect_response!(cluster.call(ControlRequest::Status).expect("status"), Status { status }).expect("status").workers;
    let honest_worker: WorkerId = workers.first().expect("a worker").info.id;

    info!("--- each role is refused the others' requests");
    let add = ControlRequest::AddDataset { name: "evil".to_owned(), manifest: "/dev/zero".to_owned() };
    assert!(forbidden(cluster.call_with(&worker, add.clone()), "a worker adds a dataset").contains("needs the admin role"));
    forbidden(cluster.call_with(&trainer, add), "a trainer adds a dataset");
    forbidden(
        cluster.call_with(&trainer, ControlRequest::PullChunks { worker: honest_worker, max: 8, held: Vec::new() }),
        "a trainer pulls chunks",
    );
    let fatal = ControlRequest::ChunkFatal { worker: honest_worker, lease: LeaseId(1), reason: "forged".to_owned() };
    forbidden(cluster.call_with(&trainer, fatal.clone()), "a trainer fails the job");
    forbidden(cluster.call_with(&admin, ControlRequest::Raft { kind: RaftKind::Vote, payload: b"{}".to_vec() }), "an admin speaks Raft");
    let remove = ControlRequest::RemoveJob { name: config.job_spec().expect("spec").name, job, force: true };
    forbidden(cluster.call_with(&trainer, remove), "a trainer removes the job");
    forbidden(cluster.call_with(&worker, ControlRequest::Detach { job, rank: Rank(0), session }), "a worker detaches the trainer");

    info!("--- a worker certificate cannot speak for another worker's id");
    let message = forbidden(cluster.call_with(&rogue_worker, fatal), "a rogue worker fails the job as the honest one");
    assert!(message.contains(&honest_worker.to_string()), "{message}");
    for lease in [LeaseId(1), LeaseId(u64::MAX)] {
        forbidden(cluster.call_with(&rogue_worker, ControlRequest::ChunkDone { worker: honest_worker, lease }), "a rogue chunk done");
    }
    forbidden(cluster.call_with(&rogue_worker, ControlRequest::Deregister { worker: honest_worker }), "a rogue deregistration");

    info!("--- another trainer certificate cannot speak for the honest session");
    let report = ControlRequest::ReportProgress {
        job,
        rank: Rank(0),
        epoch: Epoch(0),
        start: Position(0),
        consumed: steps,
        wait_seconds: 0.0,
        batches: 0,
        samples: 0,
        session,
        pass: Pass(1),
        missing: Vec::new(),
        workers_version: 0,
    };
    forbidden(cluster.call_with(&mallory, report), "mallory reports the honest rank's epoch consumed");
    forbidden(cluster.call_with(&mallory, ControlRequest::Detach { job, rank: Rank(0), session }), "mallory detaches the honest trainer");

    info!("--- mallory says hello to the worker as the honest session and a newer one");
    let worker_addr = cluster.worker(0).expect("worker").local_addr();
    let (taken_by_mallory, received, loader) = cluster.block_on(async {
        let endpoint = client_endpoint(&mallory, worker_addr, Tuning::default()).expect("endpoint");
        let mut connections = Vec::new();
        for claimed in [session, SessionId(session.0 + 1), SessionId(u64::MAX)] {
            let (connection, answer) =
                crate::common::trainer_hello(&endpoint, worker_addr, TrainerHello { job, rank: Rank(0), session: claimed, bulk: false })
                    .await;
            info!(%claimed, ?answer, "mallory's hello");
            connections.push(connection);
        }
        // The honest trainer consumes its epoch meanwhile (on this runtime's blocking pool).
        let consumer = tokio::task::spawn_blocking(move || {
            let mut seen: BTreeMap<u64, Vec<String>> = BTreeMap::new();
            for batch in &mut loader {
                let batch = batch.expect("every honest step arrives");
                seen.insert(batch.step().0, batch.keys().to_vec());
            }
            (seen, loader)
        });
        let (received, loader) = consumer.await.expect("the honest trainer");
        let mut taken = 0;
        for connection in &connections {
            while let Ok(Ok(_stream)) = tokio::time::timeout(Duration::from_millis(200), connection.accept_uni()).await {
                taken += 1;
            }
        }
        (taken, received, loader)
    });
    assert_eq!(taken_by_mallory, 0, "mallory received batches of the honest rank");
    assert_eq!(received.keys().copied().collect::<Vec<_>>(), (0..steps).collect::<Vec<_>>(), "every step once, in order");
    let keys: Vec<&String> = received.values().flatten().collect();
    let unique: std::collections::BTreeSet<&String> = keys.iter().copied().collect();
    assert_eq!(keys.len(), unique.len(), "no sample twice");
    drop(loader);
}

/// Found by review: the coordinator and workers' batch ports let any peer open 1,024 batch
/// streams with 64 MiB windows that nobody reads (quinn buffers them): 256 MiB a connection.
/// Now a peer may open no unidirectional stream there at all.
#[test]
fn coordinators_and_batch_ports_take_no_batch_streams_from_peers() {
    let cluster = cluster_with(1);
    let tls = cluster.tls(Role::Trainer);
    for addr in [cluster.coordinator_addr(), cluster.worker(0).expect("worker").local_addr()] {
        let opened = cluster.block_on(async {
            let endpoint = client_endpoint(&tls, addr, Tuning::default()).expect("endpoint");
            let connection = connect(&endpoint, addr, Duration::from_secs(5)).await.expect("connect");
            tokio::time::timeout(Duration::from_millis(500), connection.open_uni()).await.is_ok()
        });
        assert!(!opened, "{addr} let a peer open a unidirectional stream");
    }
}

/// Issue 31, item 6: four other trainer certificates holding every slot of a (job, rank) at a
/// worker (each said hello for it first) do not keep the rank's batches from its trainer: the
/// slots are reserved for the session the coordinator granted the rank's chunks to, and its
/// trainer takes a squatter's place. Before, the trainer was refused for as long as they stayed.
#[test]
fn squatters_on_a_ranks_slots_give_way_to_the_granted_trainer() {
    let cluster = cluster_with(1);
    let worker = cluster.worker(0).expect("worker").local_addr();
    let squatters: Vec<quinn::Connection> = (0..4)
        .map(|index| {
            let (tls, _) = issued(&cluster, Role::Trainer, &format!("squatter-{index}"), valid());
            cluster.block_on(async {
                let endpoint = client_endpoint(&tls, worker, Tuning::default()).expect("endpoint");
                // The first job of the cluster is job-1; any session will do.
                let hello = TrainerHello { job: JobId(1), rank: Rank(0), session: SessionId(u64::MAX), bulk: false };
                let (connection, answer) = crate::common::trainer_hello(&endpoint, worker, hello).await;
                assert!(answer.is_ok(), "a squatter takes a slot: {answer:?}");
                connection
            })
        })
        .collect();
    let mut base = cluster.loader_config("train", 4);
    base.job_name = Some("squatted".to_owned());
    base.batch_timeout = Duration::from_secs(60);
    let config = config_for(&base, 0, 1);
    let mut loader = Loader::attach(&config).expect("attach");
    assert_eq!(loader.job(), JobId(1));
    loader.set_epoch(Epoch(0));
    let steps = loader.len().expect("steps");
    let mut yielded = 0;
    for batch in &mut loader {
        batch.expect("a batch of the honest trainer's rank");
        yielded += 1;
    }
    assert_eq!(yielded, steps, "every step once");
    let closed = squatters.iter().filter(|connection| connection.close_reason().is_some()).count();
    assert!(closed >= 1, "a squatter gave its slot up");
}

/// Issue 31, item 3: a worker revoked mid-epoch is cut off by the trainer (its connections
/// closed: nothing more is taken from it), its chunks are made by the other worker, and the
/// epoch completes with every step once. Before, the trainer kept the revoked worker's
/// connection open and took what it sent.
#[test]
fn a_worker_revoked_mid_epoch_is_cut_off_and_the_epoch_completes_once() {
    let mut cluster = cluster_with(1);
    let (tls, revoked_key) = issued(&cluster, Role::Worker, "revoked-worker", valid());
    let revoked = cluster.add_worker_with(tls).expect("a worker of its own certificate");
    cluster.wait_for_workers().expect("workers");
    let mut base = cluster.loader_config("train", 4);
    base.job_name = Some("revoked-mid-epoch".to_owned());
    let config = config_for(&base, 0, 1);
    let mut loader = Loader::attach(&config).expect("attach");
    loader.set_epoch(Epoch(0));
    let steps = loader.len().expect("steps");
    let mut yielded = Vec::new();
    crate::common::wait_for_open_trainer(&cluster, revoked);
    for batch in &mut loader {
        yielded.push(batch.expect("a batch").step().0);
        if yielded.len() == 3 {
            cluster.deny(revoked_key).expect("deny");
        }
        std::thread::park_timeout(Duration::from_millis(150));
    }
    assert_eq!(yielded, (0..steps).collect::<Vec<_>>(), "every step once, in order");
    let worker = cluster.worker(revoked).expect("the revoked worker");
    assert_eq!(worker.open_trainers(), 0, "the trainer closed its connection to the revoked worker");
}

/// A forged Raft message's JSON (openraft's serde shape): sent as node `sender` in `term`.
fn raft_message(kind: RaftKind, sender: u64, term: u64) -> ControlRequest {
    let vote = format!(r#"{{"leader_id":{{"term":{term},"node_id":{sender}}},"committed":false}}"#);
    let payload = match kind {
        RaftKind::Vote => format!(r#"{{"vote":{vote},"last_log_id":null}}"#),
        RaftKind::AppendEntries => format!(r#"{{"vote":{vote},"prev_log_id":null,"entries":[],"leader_commit":null}}"#),
        RaftKind::InstallSnapshot => unreachable!("not forged here"),
    };
    ControlRequest::Raft { kind, payload: payload.into_bytes() }
}

/// Issue 31, item 4: a coordinator certificate speaks Raft only as the node it names, and only
/// while that node is a member; the forged term reaches no node, and the cluster keeps leading.
#[test]
fn raft_messages_under_another_nodes_certificate_or_a_non_members_are_refused() {
    let cluster = TestCluster::start(stoker_testkit::ClusterConfig { workers: 0, coordinators: 3, ..Default::default() }).expect("cluster");
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).expect("a leader");
    let before = cluster.coordinator_node(leader).expect("leader").raft().metrics().borrow().current_term;
    // Far ahead of any term an election under load could reach while the test runs.
    let forged = before + 1_000;
    let ca = cluster.ca().expect("a secure cluster");
    let node =
        |id: u64| stoker_testkit::issue_node_configs(ca, Role::Coordinator, &format!("forger-{id}"), Some(id), valid()).expect("issue");

    info!("--- node 2's certificate asks for votes and appends entries as node 1, in a far term");
    for kind in [RaftKind::Vote, RaftKind::AppendEntries] {
        let message = forbidden(cluster.call_with(&node(2), raft_message(kind, 1, forged)), "node 2 as node 1");
        assert!(message.contains("from node 1") && message.contains("certificate of node 2"), "{message}");
    }
    info!("--- a valid coordinator certificate of node 9, which is no member");
    let message = forbidden(cluster.call_with(&node(9), raft_message(RaftKind::Vote, 9, forged)), "node 9");
    assert!(message.contains("node 9") && message.contains("not a member"), "{message}");

    info!("--- node 2's own certificate as node 2 is heard (an old term: no vote granted)");
    let answer = cluster.call_with(&node(2), raft_message(RaftKind::Vote, 2, 0)).expect("node 2 is heard");
    assert!(matches!(answer, stoker_proto::ControlResponse::Raft { .. }), "{answer:?}");
    for index in 0..3 {
        let term = cluster.coordinator_node(index).expect("running").raft().metrics().borrow().current_term;
        assert!(term < forged, "node {}: the forged term {forged} reached it ({term})", index + 1);
    }
    cluster.wait_for_leader(Duration::from_secs(20)).expect("the cluster still leads");
}
