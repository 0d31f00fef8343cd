//! The core stepped by hand, with no IO: what it asks the driver to do, and that its ids come
//! from the injected source only (the same seed, the same ids).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use stoker_plan::ids::{CertKey, Epoch, Pass, Position, Rank};
use stoker_plan::transform::TransformSpec;
use stoker_plan::{CHECKPOINT_VERSION, Checkpoint};
use stoker_proto::{ControlRequest, ControlResponse, DatasetInfo};

use super::*;
use crate::config::SchedulerConfig;
use crate::event::Then;
use crate::ids::SeededIds;
use crate::state::Applied;

fn config() -> CoreConfig {
    CoreConfig {
        scheduler: SchedulerConfig {
            lease_ttl: Duration::from_secs(3),
            lease_stall: Duration::from_secs(60),
            chunk_steps: 2,
            retry_delay: Duration::from_millis(500),
            trainer_ttl: Duration::from_secs(5),
            missing_grace: Duration::from_secs(1),
        },
        heartbeat: Duration::from_millis(500),
        job_ttl: None,
        max_batch_bytes: 1 << 30,
        max_world_size: 16,
        max_prefetch: 16,
        max_jobs: 10,
        max_datasets: 10,
    }
}

/// Step `request` to its answer as a driver in local mode does: commits applied at once, the
/// manifest "read" as `dataset`.
fn drive(core: &mut Core, request: ControlRequest, dataset: &DatasetInfo, now: Instant) -> ControlResponse {
    let mut event = Event::Request { request, caller: CertKey::UNCHECKED };
    for _ in 0..4 {
        match core.step(event, now) {
            Outcome::Reply { answer, .. } => return answer.unwrap_or_else(|error| panic!("{error}")),
            Outcome::Commit { command, then } => {
                core.apply(command);
                match then {
                    Then::Again(request) => event = Event::Request { request, caller: CertKey::UNCHECKED },
                    Then::Reply(answer) => return answer,
                }
            }
            Outcome::ReadManifest { name, .. } => event = Event::ManifestRead { name, read: Ok(dataset.clone()) },
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("too many rounds")
}

/// Attach rank 0 of a one-rank job, open epoch 0, register a worker and pull: the leases.
fn leases_granted(seed: u64) -> Vec<u64> {
    let now = Instant::now();
    let mut core = Core::new(config(), "test".into(), ClusterState::new(), Box::new(SeededIds::new(seed)), 1_000, now);
    let dataset = DatasetInfo { name: String::new(), manifest: "/data/manifest.json".into(), shard_counts: vec![8, 8], version: 7 };
    let added = drive(&mut core, ControlRequest::AddDataset { name: "train".into(), manifest: "/data".into() }, &dataset, now);
    assert!(matches!(added, ControlResponse::DatasetAdded { ref dataset } if dataset.name == "train"), "{added:?}");
    let mut spec = crate::state::tests::spec("job");
    spec.transforms = TransformSpec::imagenet_train(8);
    let attach = ControlRequest::Attach { spec, rank: Rank(0), client: 1 };
    let ControlResponse::Attached { job, session, .. } = drive(&mut core, attach, &dataset, now) else { panic!("attach") };
    let open = ControlRequest::OpenEpoch {
        job,
        rank: Rank(0),
        epoch: Epoch(0),
        start: Position(0),
        session,
        pass: Pass(1),
        consumed: 0,
        holding: Vec::new(),
    };
    drive(&mut core, open, &dataset, now);
    let addr: SocketAddr = "127.0.0.1:7500".parse().unwrap_or_else(|error| panic!("{error}"));
    let register = ControlRequest::RegisterWorker { addr, threads: 1, instance: 1, attempt: 1 };
    let ControlResponse::WorkerRegistered { worker, .. } = drive(&mut core, register, &dataset, now) else { panic!("register") };
    let ControlResponse::Chunks { grants } = drive(&mut core, ControlRequest::PullChunks { worker, max: 4 }, &dataset, now) else {
        panic!("pull")
    };
    assert!(!grants.is_empty(), "work to grant");
    grants.iter().map(|grant| grant.lease.0).collect()
}

#[test]
fn a_dataset_is_added_after_the_driver_reads_its_manifest() {
    let now = Instant::now();
    let mut core = Core::new(config(), "test".into(), ClusterState::new(), Box::new(SeededIds::new(1)), 1_000, now);
    let asked = core.step(
        Event::Request {
            request: ControlRequest::AddDataset { name: "train".into(), manifest: "/data".into() },
            caller: CertKey::UNCHECKED,
        },
        now,
    );
    assert!(matches!(&asked, Outcome::ReadManifest { name, manifest } if name == "train" && manifest == "/data"), "{asked:?}");
    let refused = core.step(Event::ManifestRead { name: "train".into(), read: Err(crate::errors::invalid("no such file")) }, now);
    assert!(matches!(refused, Outcome::Reply { answer: Err(_), .. }), "a failed read is the answer");
    assert!(core.state().datasets.is_empty(), "nothing committed");
}

#[test]
fn ids_come_from_the_injected_source_only() {
    assert_eq!(leases_granted(5), leases_granted(5), "the same seed, the same leases");
    assert_ne!(leases_granted(5), leases_granted(6), "another seed, other leases");
}

#[test]
fn the_timer_hands_out_checkpoints_once_and_takes_them_back_when_a_commit_fails() {
    let now = Instant::now();
    let mut core = Core::new(config(), "test".into(), ClusterState::new(), Box::new(SeededIds::new(1)), 1_000, now);
    let job = match core.apply(Command::CreateJob { spec: crate::state::tests::spec("job") }) {
        Applied::JobCreated(job) => job,
        other => panic!("{other:?}"),
    };
    let checkpoint = Checkpoint { version: CHECKPOINT_VERSION, epoch: Epoch(0), position: Position(4), order_fingerprint: 1 };
    core.pending.insert(job, checkpoint);
    let Outcome::CommitEach(commands) = core.step(Event::Tick { flush: true }, now) else { panic!("commands") };
    assert_eq!(commands, vec![Command::RecordCheckpoints { checkpoints: vec![(job, checkpoint)] }]);
    assert!(matches!(core.step(Event::Flush, now), Outcome::CommitEach(none) if none.is_empty()), "handed out once");
    for command in commands {
        core.step(Event::CommitFailed { command }, now);
    }
    let Outcome::CommitEach(again) = core.step(Event::Flush, now) else { panic!("commands") };
    assert_eq!(again.len(), 1, "taken back, committed at the next flush");
}
