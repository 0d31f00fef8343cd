//! Three coordinators replicated with Raft (issue 17): the leader dies mid-epoch and training
//! goes on, exactly once; the whole cluster restarts and keeps its state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stoker_client::{Loader, LoaderConfig};
use stoker_coordinator::state::Command;
use stoker_plan::ids::{Epoch, Pass, Position, Rank, Step};
use stoker_plan::{EpochPlan, ShardTable, Tail};
use stoker_proto::{ControlRequest, ControlResponse};
use stoker_testkit::{ClusterConfig, TestCluster, wait_until};
use tracing::info;

use crate::common::{Seen, assert_in_order, config_for, dataset};

const SAMPLES: usize = 120;
const EPOCHS: u64 = 2;

fn raft_cluster() -> TestCluster {
    let config = ClusterConfig { workers: 2, coordinators: 3, ..Default::default() };
    let cluster = TestCluster::start(config).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    cluster
}

fn base_config(cluster: &TestCluster, job: &str) -> LoaderConfig {
    let mut base = cluster.loader_config("train", 4);
    base.tail = Tail::Partial;
    base.prefetch = 4;
    base.job_name = Some(job.to_owned());
    base
}

/// Two ranks consume `EPOCHS` epochs, pausing `pause` per batch and counting batches in
/// `consumed`.
fn run_ranks(base: &LoaderConfig, pause: Duration, consumed: &Arc<AtomicU64>) -> Vec<std::thread::JoinHandle<Vec<Seen>>> {
    (0..2)
        .map(|rank| {
            let config = config_for(base, rank, 2);
            let consumed = Arc::clone(consumed);
            std::thread::spawn(move || {
                let mut loader = Loader::attach(&config).expect("attach");
                let mut seen = Vec::new();
                for epoch in 0..EPOCHS {
                    loader.set_epoch(Epoch(epoch));
                    for batch in &mut loader {
                        let batch = batch.expect("batch");
                        seen.push(Seen { epoch, step: batch.step().0, keys: batch.keys().to_vec(), checksum: batch.checksum() });
                        consumed.fetch_add(1, Ordering::Relaxed);
                        std::thread::park_timeout(pause);
                    }
                }
                seen
            })
        })
        .collect()
}

fn finish(handles: Vec<std::thread::JoinHandle<Vec<Seen>>>) -> BTreeMap<u32, Vec<Seen>> {
    handles.into_iter().enumerate().map(|(rank, handle)| (rank as u32, handle.join().expect("rank thread"))).collect()
}

fn checksums(seen: &BTreeMap<u32, Vec<Seen>>) -> BTreeMap<(u64, u32, u64), u64> {
    seen.iter().flat_map(|(rank, records)| records.iter().map(|r| ((r.epoch, *rank, r.step), r.checksum))).collect()
}

fn assert_every_key_once_per_epoch(seen: &BTreeMap<u32, Vec<Seen>>) {
    for epoch in 0..EPOCHS {
        let mut keys: Vec<&String> = seen.values().flatten().filter(|r| r.epoch == epoch).flat_map(|r| &r.keys).collect();
        keys.sort();
        let total = keys.len();
        keys.dedup();
        assert_eq!((total, keys.len()), (SAMPLES, SAMPLES), "epoch {epoch}: every key exactly once");
    }
}

#[test]
fn killing_the_leader_mid_epoch_loses_and_repeats_nothing() {
    let mut cluster = raft_cluster();
    let steps = (SAMPLES as u64).div_ceil(8);
    let baseline = {
        info!("--- a run without failures");
        let seen = finish(run_ranks(&base_config(&cluster, "baseline"), Duration::ZERO, &Arc::new(AtomicU64::new(0))));
        assert_in_order(&seen, steps, EPOCHS);
        checksums(&seen)
    };
    let consumed = Arc::new(AtomicU64::new(0));
    // 100 ms a batch: 3 s an epoch, so that the kill and the election fall mid-epoch.
    let ranks = run_ranks(&base_config(&cluster, "failover"), Duration::from_millis(100), &consumed);
    {
        info!("--- kill the leader mid-epoch");
        wait_until(Duration::from_secs(60), "ranks are a few steps into epoch 0", || consumed.load(Ordering::Relaxed) >= 6)
            .expect("progress");
        let leader = cluster.leader_index().expect("a leader");
        let at_kill = consumed.load(Ordering::Relaxed);
        cluster.kill_coordinator_node(leader);
        let killed = Instant::now();
        let new_leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("a new leader");
        let election = killed.elapsed();
        info!(?election, new_leader, "new leader");
        assert_ne!(new_leader, leader);
        // The election timeout is 0.5–1 s; debug builds and a loaded machine get slack.
        assert!(election < Duration::from_secs(5), "a new leader took {election:?}");
        let total = 2 * EPOCHS * steps;
        assert!(at_kill < total / 4, "the leader died early in epoch 0 ({at_kill} of {total} batches)");
        let at_election = consumed.load(Ordering::Relaxed);
        assert!(at_election < total, "the new leader serves the rest ({at_election} of {total} batches were consumed by then)");
    }
    {
        info!("--- training goes on: every key once per epoch, the same batches as without the failure");
        let seen = finish(ranks);
        assert_in_order(&seen, steps, EPOCHS);
        assert_every_key_once_per_epoch(&seen);
        assert_eq!(checksums(&seen), baseline, "batch checksums equal those of the run without the failure");
    }
}

#[test]
fn a_whole_cluster_restart_keeps_datasets_jobs_and_checkpoints_and_a_trainer_resumes() {
    let mut cluster = raft_cluster();
    let config = config_for(&base_config(&cluster, "resumed"), 0, 1);
    let (state, before) = {
        info!("--- one rank consumes 5 steps and saves its state");
        let mut loader = Loader::attach(&config).expect("attach");
        loader.set_epoch(Epoch(0));
        for batch in (&mut loader).take(5) {
            batch.expect("batch");
        }
        let state = loader.state().expect("state");
        drop(loader);
        let core = cluster.coordinator().expect("leader");
        wait_until(Duration::from_secs(10), "the checkpoint of step 4 is committed", || {
            core.state().checkpoints.values().any(|checkpoint| checkpoint.position.0 == 20)
        })
        .expect("checkpoint");
        // A second job that failed (as a worker's `ChunkFatal` makes it): its reason is durable.
        let leader = cluster.coordinator_node(cluster.leader_index().expect("leader")).expect("running");
        let mut failing = config_for(&base_config(&cluster, "failing"), 0, 1).job_spec().expect("spec");
        failing.plan.seed = 99;
        cluster.block_on(leader.commit(Command::CreateJob { spec: failing, creator: None, bounds: None })).expect("job");
        let failed = *core.state().jobs.keys().max().expect("a job");
        let reason = "shard-000003.tar: sample 0042 cannot be decoded".to_owned();
        cluster.block_on(leader.commit(Command::FailJob { job: failed, reason: reason.clone() })).expect("failure");
        assert_eq!(core.state().failed.get(&failed), Some(&reason));
        (state, core.state())
    };
    {
        info!("--- every coordinator stops, then every one starts again");
        for index in 0..3 {
            cluster.kill_coordinator_node(index);
        }
        for index in 0..3 {
            cluster.start_coordinator_node(index).expect("restart");
        }
        cluster.wait_for_leader(Duration::from_secs(20)).expect("a leader");
        let core = cluster.coordinator().expect("leader");
        wait_until(Duration::from_secs(10), "the leader has applied the log", || core.state() == before).expect("state back");
    }
    {
        info!("--- the trainer resumes from its state: steps 5.. of epoch 0");
        cluster.wait_for_workers().expect("workers registered with the new leader");
        let mut loader = Loader::attach(&config).expect("attach again");
        loader.resume(&state).expect("resume");
        let steps: Vec<u64> = (&mut loader).map(|batch| batch.expect("batch").step().0).collect();
        assert_eq!(steps, (5..30).collect::<Vec<_>>());
    }
}

/// A follower cut off from the others: the majority keeps serving (a dataset added, an epoch
/// trained), there is never more than one leader, and after healing the follower catches up.
#[test]
fn a_follower_cut_off_cannot_lead_alone_and_catches_up_after_healing() {
    let cluster = raft_cluster();
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("leader");
    let cut = (leader + 1) % 3;
    info!(cut, "--- cut a follower off");
    cluster.coordinator_node(cut).expect("running").set_isolated(true);
    let leaders = || (0..3).filter(|index| cluster.coordinator_node(*index).is_some_and(|node| node.is_leader())).count();
    let majority = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            // Two election timeouts and more: the cut-off node campaigns and never wins.
            let until = Instant::now() + Duration::from_secs(4);
            let mut most = 0;
            while Instant::now() < until {
                most = most.max(leaders());
                assert!(!cluster.coordinator_node(cut).is_some_and(|node| node.is_leader()), "the cut-off node leads alone");
                std::thread::park_timeout(Duration::from_millis(10));
            }
            most
        });
        cluster.add_dataset("second", &dataset()).expect("the majority commits");
        let seen = crate::common::consume(&base_config(&cluster, "partitioned"), 2, 1);
        assert_in_order(&seen, (SAMPLES as u64).div_ceil(8), 1);
        watcher.join().expect("watcher")
    });
    assert_eq!(majority, 1, "exactly one leader while partitioned");
    info!("--- heal");
    cluster.coordinator_node(cut).expect("running").set_isolated(false);
    let leader_state = || cluster.coordinator().map(|core| core.state());
    wait_until(Duration::from_secs(20), "the healed follower has the leader's state", || {
        let mine = cluster.coordinator_node(cut).expect("running").core().state();
        leader_state().is_some_and(|state| state == mine && state.datasets.contains_key("second"))
    })
    .expect("caught up");
}

/// A node that lost its disk must not come back under its old id (it forgot its vote): once
/// the cluster has seen every node take part, a node started on an empty data directory with
/// an id the cluster knows is refused, and told what to do.
#[test]
fn a_node_id_the_cluster_knows_is_refused_on_an_empty_data_directory() {
    let mut cluster = raft_cluster();
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("leader");
    let core = cluster.coordinator().expect("leader");
    wait_until(Duration::from_secs(10), "every node recorded as joined", || core.nodes_joined().len() == 3).expect("joined");
    let victim = (leader + 1) % 3;
    cluster.kill_coordinator_node(victim);
    let dir = cluster.coordinator_data_dir(victim);
    std::fs::remove_dir_all(&dir).expect("wipe");
    let refused = cluster.start_coordinator_node(victim).expect_err("refused");
    assert!(refused.contains("took part in this cluster before") && refused.contains("remove-node"), "{refused}");
}

/// A leader cut off from the other coordinators but not from clients stops scheduling once
/// its leadership is no longer confirmed, while the others elect a new leader: clients are
/// sent on, not served by two schedulers.
#[test]
fn a_leader_cut_off_from_the_other_coordinators_stops_serving() {
    let cluster = raft_cluster();
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("leader");
    let addr = cluster.coordinator_node(leader).expect("leader").local_addr();
    let ask_it = || {
        cluster.block_on(async {
            let client = stoker_net::QuicCoordinator::new(addr, &cluster.tls(stoker_net::Role::Admin)).expect("client");
            let answer = stoker_proto::api::CoordinatorApi::call(&client, ControlRequest::Status).await;
            stoker_proto::api::CoordinatorApi::close(&client);
            answer
        })
    };
    assert!(ask_it().is_ok(), "it serves while it leads");
    cluster.coordinator_node(leader).expect("leader").set_isolated(true);
    let cut_at = Instant::now();
    wait_until(Duration::from_secs(10), "another coordinator leads", || {
        (0..3).any(|index| index != leader && cluster.coordinator_node(index).is_some_and(|node| node.is_leader()))
    })
    .expect("a new leader");
    wait_until(Duration::from_secs(5), "the cut-off leader refuses to serve", || {
        ask_it().is_err_and(|error| matches!(error.code, stoker_proto::ErrorCode::NotLeader { .. }))
    })
    .expect("refusal");
    info!(after = ?cut_at.elapsed(), "the cut-off leader stopped serving");
    assert!(cluster.add_dataset("after-the-cut", &dataset()).is_ok(), "the majority serves");
    cluster.coordinator_node(leader).expect("node").set_isolated(false);
}

/// `cluster remove-node` then `cluster add-node`: a dead node is taken out, a new empty node
/// joins under a new id, catches up, votes, and can lead.
#[test]
fn a_dead_node_is_replaced_by_a_new_one_through_remove_and_add() {
    use stoker_proto::{ControlRequest, ControlResponse};
    let mut cluster = raft_cluster();
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("leader");
    let dead = (leader + 1) % 3;
    cluster.kill_coordinator_node(dead);
    let removed = cluster.call(ControlRequest::RemoveNode { id: dead as u64 + 1 }).expect("removed");
    let ControlResponse::MembershipChanged { voters } = removed else { panic!("{removed:?}") };
    assert_eq!(voters.len(), 2, "{voters:?}");
    let unknown = cluster.call(ControlRequest::RemoveNode { id: 42 }).expect_err("not a member");
    assert_eq!(unknown.code, stoker_proto::ErrorCode::NotFound, "{unknown:?}");
    let new = cluster.start_joining_coordinator().expect("a new node");
    let addr = cluster.coordinator_node(new).expect("running").local_addr().to_string();
    let bad = cluster.call(ControlRequest::AddNode { id: new as u64 + 1, addr: "no-port".into() }).expect_err("refused");
    assert!(bad.message.contains("HOST:PORT"), "{bad:?}");
    let added = cluster.call(ControlRequest::AddNode { id: new as u64 + 1, addr }).expect("added");
    let ControlResponse::MembershipChanged { voters } = added else { panic!("{added:?}") };
    assert_eq!(voters.len(), 3, "{voters:?}");
    assert!(voters.iter().any(|(id, _)| *id == new as u64 + 1));
    let core = cluster.coordinator().expect("leader");
    wait_until(Duration::from_secs(10), "the new node has the leader's state", || {
        cluster.coordinator_node(new).expect("running").core().state() == core.state()
    })
    .expect("caught up");
    info!("--- the old leader goes: the new node's vote is needed, and the cluster still leads");
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("leader");
    cluster.kill_coordinator_node(leader);
    cluster.wait_for_leader(Duration::from_secs(10)).expect("a leader among the two left");
    assert!(cluster.add_dataset("after-replacement", &dataset()).is_ok());
}

/// Issue 31, item 7: a progress report the leader acknowledged is durable. The leader is
/// killed right after it answers; the new leader has the checkpoint the report made. Before,
/// checkpoints waited up to a second for the timer's flush after the answer, and a leader that
/// died meanwhile took them along.
#[test]
fn an_acknowledged_checkpoint_survives_the_leaders_death() {
    let mut cluster = TestCluster::start(ClusterConfig { workers: 0, coordinators: 3, ..Default::default() }).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    let spec = config_for(&base_config(&cluster, "durable"), 0, 1).job_spec().expect("spec");
    let attached = cluster.call(ControlRequest::Attach { spec: spec.clone(), rank: Rank(0), client: 1 }).expect("attach");
    let ControlResponse::Attached { job, dataset, session, .. } = attached else { panic!("attach: {attached:?}") };
    let opened = cluster.call(crate::common::first_open(job, session)).expect("open");
    assert!(matches!(opened, ControlResponse::EpochOpened { steps } if steps > 3), "{opened:?}");
    let consumed = 3;
    let report = ControlRequest::ReportProgress {
        job,
        rank: Rank(0),
        session,
        epoch: Epoch(0),
        start: Position(0),
        consumed,
        wait_seconds: 0.0,
        batches: consumed,
        samples: consumed * 4,
        pass: Pass(1),
        missing: Vec::new(),
        workers_version: 0,
    };
    let leader = cluster.leader_index().expect("a leader");
    let answer = cluster.call(report).expect("the report is acknowledged");
    assert!(matches!(answer, ControlResponse::ProgressRecorded { .. }), "{answer:?}");
    cluster.kill_coordinator_node(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("a new leader");
    assert_ne!(new_leader, leader);
    let table = Arc::new(ShardTable::new(dataset.shard_counts.iter().copied()).expect("table"));
    let acknowledged = EpochPlan::new(table, spec.plan, Epoch(0)).checkpoint_after(Step(consumed - 1));
    let mut checkpoint_opt = None;
    wait_until(Duration::from_secs(20), "the new leader answers status", || {
        let Ok(ControlResponse::Status { status }) = cluster.call(ControlRequest::Status) else { return false };
        checkpoint_opt = status.jobs.iter().find(|status| status.id == job).map(|status| status.checkpoint);
        true
    })
    .expect("status");
    assert_eq!(checkpoint_opt, Some(Some(acknowledged)), "the acknowledged checkpoint survived the leader");
}
