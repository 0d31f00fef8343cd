//! Issue 31, item 2: what valid trainer certificates may make the replicated state hold is
//! bounded, an attach storm of one loader writes nothing, and a follower that missed the flood
//! catches up by a snapshot, which stays under the transfer limit.

use std::sync::Arc;
use std::time::Duration;

use stoker_coordinator::config::MIN_STATE_BYTES;
use stoker_coordinator::state_budget::state_bytes;
use stoker_net::{QuicCoordinator, Role};
use stoker_plan::ids::{JobId, Rank};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, JobSpec, RemoteError};
use stoker_testkit::{ClusterConfig, TestCluster, wait_until};
use tracing::info;

use crate::common::{config_for, dataset};

/// Ranks of each job of the flood.
const WORLD_SIZE: u32 = 256;
/// Attaches in flight at once.
const IN_FLIGHT: usize = 32;
/// Jobs the flood tries to create, far more than the state's limit lets it.
const JOBS_TRIED: usize = 40;

fn spec(cluster: &TestCluster, name: &str) -> JobSpec {
    let mut config = config_for(&cluster.loader_config("train", 4), 0, WORLD_SIZE);
    config.job_name = Some(name.to_owned());
    config.job_spec().expect("spec")
}

/// Attach every `(spec, rank, client)` through one trainer connection, `IN_FLIGHT` at once;
/// the answers in no particular order.
fn attach_all(
    cluster: &TestCluster,
    client: &Arc<QuicCoordinator>,
    attaches: Vec<(JobSpec, Rank, u64)>,
) -> Vec<Result<ControlResponse, RemoteError>> {
    cluster.block_on(async {
        let mut answers = Vec::with_capacity(attaches.len());
        for wave in attaches.chunks(IN_FLIGHT) {
            let mut calls = tokio::task::JoinSet::new();
            for (spec, rank, client_id) in wave.iter().cloned() {
                let client = Arc::clone(client);
                calls.spawn(async move { client.call(ControlRequest::Attach { spec, rank, client: client_id }).await });
            }
            while let Some(answer) = calls.join_next().await {
                answers.push(answer.expect("attach task"));
            }
        }
        answers
    })
}

#[test]
fn a_session_flood_is_bounded_and_a_follower_catches_up_by_snapshot() {
    let config = ClusterConfig {
        workers: 0,
        coordinators: 3,
        configure_coordinator: Some(|config| {
            config.max_state_bytes = MIN_STATE_BYTES;
            config.max_world_size = 1024;
        }),
        ..ClusterConfig::default()
    };
    let mut cluster = TestCluster::start(config).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("leader");
    let lagging = (leader + 1) % 3;
    let lagging_had = cluster.coordinator_node(lagging).expect("running").last_log_index();
    info!(lagging, lagging_had, "--- a follower goes away before the flood");
    cluster.kill_coordinator_node(lagging);

    let (addrs, tls) = (cluster.coordinator_list(), cluster.tls(Role::Trainer));
    let trainer = Arc::new(cluster.block_on(async { QuicCoordinator::with_addrs(addrs, &tls) }).expect("client"));
    // One trainer certificate creates job after job of 256 ranks: refused once the state
    // would go over its limit, with the flag to raise it.
    let mut created = Vec::new();
    let mut refusal = None;
    for index in 0..JOBS_TRIED {
        let spec = spec(&cluster, &format!("flood-{index}"));
        match attach_all(&cluster, &trainer, vec![(spec.clone(), Rank(0), 1)]).remove(0) {
            Ok(ControlResponse::Attached { job, .. }) => created.push((job, spec)),
            Ok(other) => panic!("{other:?}"),
            Err(error) => {
                refusal = Some(error);
                break;
            }
        }
    }
    let refusal = refusal.unwrap_or_else(|| panic!("{JOBS_TRIED} jobs of {WORLD_SIZE} ranks created under a 1 MiB state limit"));
    assert_eq!(refusal.code, ErrorCode::InvalidArgument, "{refusal:?}");
    assert!(refusal.message.contains("--max-state-bytes") && refusal.message.contains("stoker job rm"), "{}", refusal.message);
    info!(jobs = created.len(), "--- every rank of every job attaches");
    let every_rank: Vec<_> = created.iter().flat_map(|(_, spec)| (0..WORLD_SIZE).map(move |rank| (spec.clone(), Rank(rank), 1))).collect();
    let answers = attach_all(&cluster, &trainer, every_rank.clone());
    assert!(answers.iter().all(Result::is_ok), "{:?}", answers.iter().find(|answer| answer.is_err()));

    info!("--- the same loaders ask again (their answers lost): nothing is written");
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("leader");
    let before = cluster.coordinator_node(leader).expect("running").last_log_index();
    let again = attach_all(&cluster, &trainer, every_rank.iter().take(512).cloned().collect());
    assert!(again.iter().all(Result::is_ok));
    let written = cluster.coordinator_node(leader).expect("running").last_log_index() - before;
    // The checkpoint flush and heartbeats of nothing write nothing either; allow a stray entry.
    assert!(written <= 2, "an attach storm of 512 repeated attaches wrote {written} entries");

    info!("--- new loaders take ranks over: one entry each, and the state does not grow");
    let takeovers: Vec<_> = (0..WORLD_SIZE).map(|rank| (created[0].1.clone(), Rank(rank), 2)).collect();
    assert!(attach_all(&cluster, &trainer, takeovers).iter().all(Result::is_ok));
    trainer.close();

    let state = cluster.coordinator_node(leader).expect("running").core().state();
    let sessions: usize = state.sessions.values().map(|ranks| ranks.len()).sum();
    assert_eq!(sessions, created.len() * WORLD_SIZE as usize, "one record per rank of the jobs kept");
    let snapshot_bytes = serde_json::to_vec(&state).expect("json").len() as u64;
    let charged = state_bytes(&state);
    info!(jobs = created.len(), sessions, snapshot_bytes, charged, "--- the state at its limit");
    assert!(snapshot_bytes <= charged && charged <= MIN_STATE_BYTES, "{snapshot_bytes} bytes, charged {charged}");
    assert!(state.jobs.keys().all(|job| created.iter().any(|(id, _)| id == job)), "only the jobs created: {:?}", state.jobs.keys());

    // The leader snapshotted and purged its log past what the lagging follower has: it can
    // only catch up by a snapshot.
    let purged = || cluster.coordinator_node(leader).expect("running").last_purged_index();
    wait_until(Duration::from_secs(10), "the leader purged the entries the follower lacks", || purged() > lagging_had).expect("purged");
    info!(purged = purged(), "--- the follower comes back");
    cluster.start_coordinator_node(lagging).expect("restart");
    let node = |index: usize| cluster.coordinator_node(index).expect("running");
    wait_until(Duration::from_secs(30), "the follower has the leader's state", || {
        cluster.coordinator().is_some_and(|core| core.state() == node(lagging).core().state())
    })
    .expect("caught up");
    assert!(node(lagging).last_purged_index() > lagging_had, "the follower's log starts past what it had: a snapshot came");
    let first: JobId = created[0].0;
    assert_eq!(node(lagging).core().state().sessions.get(&first).map(|ranks| ranks.len()), Some(WORLD_SIZE as usize));
}
