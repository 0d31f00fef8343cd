//! Trainer restarts (DESIGN §4.6) and backpressure.

use std::collections::BTreeSet;
use std::time::Duration;

use stoker_client::Loader;
use stoker_net::{PayloadPool, Role, Tuning, client_endpoint, receive_batch};
use stoker_plan::Tail;
use stoker_plan::ids::{Epoch, Pass, Position, Rank};
use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, TrainerHello};
use stoker_testkit::wait_until;
use tracing::info;

use crate::common::{cluster_with, config_for, trainer_hello};

/// Both ranks stop after step 3 and new loaders resume from the saved state: the remaining
/// batches are byte-identical to an uninterrupted run. Resuming the same state with world
/// size 1 yields exactly the samples not yet consumed.
#[test]
fn a_resumed_trainer_gets_the_same_remaining_batches() {
    let cluster = cluster_with(2);
    let mut base = cluster.loader_config("train", 4);
    base.tail = Tail::Partial;
    let epoch = Epoch(1);
    let uninterrupted: Vec<Vec<(u64, u64, Vec<String>)>> = {
        info!("--- reference: epoch 1 without interruption");
        let handles: Vec<_> = (0..2u32)
            .map(|rank| {
                let config = config_for(&base, rank, 2);
                std::thread::spawn(move || {
                    let mut loader = Loader::attach(&config).expect("attach");
                    loader.set_epoch(epoch);
                    (&mut loader).map(|b| b.expect("batch")).map(|b| (b.step().0, b.checksum(), b.keys().to_vec())).collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("rank")).collect()
    };
    let (state, consumed_keys) = {
        info!("--- both ranks stop after step 3 and save their state");
        let handles: Vec<_> = (0..2u32)
            .map(|rank| {
                let config = config_for(&base, rank, 2);
                std::thread::spawn(move || {
                    let mut loader = Loader::attach(&config).expect("attach");
                    loader.set_epoch(epoch);
                    let keys: Vec<String> = (&mut loader).take(4).flat_map(|b| b.expect("batch").keys().to_vec()).collect();
                    (loader.state().expect("state"), keys)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|handle| handle.join().expect("rank")).collect();
        assert_eq!(results[0].0, results[1].0, "ranks in lockstep save the same checkpoint");
        (results[0].0.clone(), results.iter().flat_map(|(_, keys)| keys.clone()).collect::<Vec<_>>())
    };
    {
        info!("--- new loaders resume: the remaining steps are byte-identical");
        let handles: Vec<_> = (0..2u32)
            .map(|rank| {
                let config = config_for(&base, rank, 2);
                let state = state.clone();
                std::thread::spawn(move || {
                    let mut loader = Loader::attach(&config).expect("attach");
                    loader.resume(&state).expect("resume");
                    (&mut loader).map(|b| b.expect("batch")).map(|b| (b.step().0, b.checksum(), b.keys().to_vec())).collect::<Vec<_>>()
                })
            })
            .collect();
        for (rank, handle) in handles.into_iter().enumerate() {
            let resumed = handle.join().expect("rank");
            let expected: Vec<_> = uninterrupted[rank][4..].to_vec();
            assert_eq!(resumed, expected, "rank {rank}: steps 4.. with their epoch numbers (issue 16, item 3), same bytes");
        }
    }
    {
        info!("--- resuming with world size 1 re-partitions the rest of the epoch");
        let config = config_for(&base, 0, 1);
        let mut loader = Loader::attach(&config).expect("attach");
        loader.resume(&state).expect("resume");
        // 120 samples, batch 4: 30 steps an epoch; 32 consumed, so 22 steps remain and the
        // first is the epoch's step 8 (issue 16, item 3: steps and length after a resume).
        assert_eq!((loader.len().expect("len"), loader.remaining().expect("remaining")), (30, 22));
        let batches: Vec<_> = (&mut loader).map(|b| b.expect("batch")).collect();
        assert_eq!(batches.iter().map(|b| b.step().0).collect::<Vec<_>>(), (8..30).collect::<Vec<_>>());
        let rest: Vec<String> = batches.iter().flat_map(|b| b.keys().to_vec()).collect();
        let all: Vec<&String> = consumed_keys.iter().chain(&rest).collect();
        let unique: BTreeSet<&String> = all.iter().copied().collect();
        assert_eq!((all.len(), unique.len()), (120, 120), "consumed before + after = every key once");
    }
}

/// Issue 16, item 2 (and a wedge the protocol model found with `tail="pad"`): the state saved
/// after an epoch's last batch said "this epoch, position 0" (or, with `pad`, a position past
/// the data, which the coordinator refused to open). It is the next epoch's start, and a
/// loader resuming it iterates that whole epoch.
#[test]
fn the_state_saved_after_an_epoch_resumes_at_the_next_epoch() {
    let cluster = cluster_with(1);
    for tail in [Tail::Pad, Tail::Partial] {
        let mut base = cluster.loader_config("train", 7);
        base.tail = tail;
        base.job_name = Some(format!("epoch-end-{tail:?}"));
        let config = config_for(&base, 0, 1);
        let state = {
            let mut loader = Loader::attach(&config).expect("attach");
            loader.set_epoch(Epoch(2));
            let steps = (&mut loader).inspect(|batch| assert!(batch.is_ok(), "{batch:?}")).count();
            assert_eq!(steps, 18, "{tail:?}: 120 samples / 7");
            let state = loader.state().expect("state");
            assert_eq!((state.checkpoint.epoch, state.checkpoint.position.0), (Epoch(3), 0), "{tail:?}");
            state
        };
        let reference: Vec<u64> = {
            let mut loader = Loader::attach(&config).expect("attach");
            loader.set_epoch(Epoch(3));
            (&mut loader).map(|batch| batch.expect("batch").checksum()).collect()
        };
        let mut resumed = Loader::attach(&config).expect("attach");
        resumed.resume(&state).expect("resume");
        assert_eq!(resumed.len().expect("len"), 18, "{tail:?}: a whole epoch");
        let checksums: Vec<u64> = (&mut resumed).map(|batch| batch.expect("batch").checksum()).collect();
        assert_eq!(checksums, reference, "{tail:?}: epoch 3 from its start");
    }
}

/// A rank that stops consuming holds the job inside its flow window: its buffer stops
/// growing, the workers' outstanding work stays bounded, and it resumes when consumed again.
#[test]
fn a_stalled_trainer_holds_memory_inside_the_window() {
    let cluster = cluster_with(2);
    let mut base = cluster.loader_config("train", 2);
    base.tail = Tail::Partial;
    base.prefetch = 4;
    let config = config_for(&base, 0, 1);
    let mut loader = Loader::attach(&config).expect("attach");
    loader.set_epoch(Epoch(0));
    {
        info!("--- consume one batch, then stop");
        loader.next().expect("a batch").expect("valid");
        wait_until(Duration::from_secs(20), "the window fills", || loader.buffered_batches() >= 3).expect("prefetch");
        std::thread::park_timeout(Duration::from_millis(800));
        let buffered = loader.buffered_batches();
        // Window: steps below 1 + prefetch(4), cut in chunks of 2 → at most steps 1..=5.
        assert!(buffered <= 5, "buffered {buffered} batches with a window of 4");
        for index in 0..2 {
            let outstanding = cluster.worker(index).map_or(0, |worker| worker.outstanding_batches());
            assert!(outstanding <= 4, "worker {index} has {outstanding} batches outstanding");
        }
    }
    {
        info!("--- consuming again finishes the epoch");
        let rest = (&mut loader).inspect(|batch| assert!(batch.is_ok(), "{batch:?}")).count();
        assert_eq!(rest as u64 + 1, 60, "120 samples / batch 2");
    }
}

/// A second loader attaching as the same rank while the first is still alive (a notebook
/// re-run, a forked child) is the one served: it gets the whole epoch from its position, and
/// the first one's requests are refused instead of taking the rank's run back.
#[test]
fn the_newest_trainer_of_a_rank_is_the_one_served() {
    let cluster = cluster_with(1);
    let config = config_for(&cluster.loader_config("train", 4), 0, 1);
    let mut first = Loader::attach(&config).expect("attach");
    let taken: Vec<u64> = (&mut first).take(3).map(|batch| batch.expect("batch").step().0).collect();
    assert_eq!(taken, [0, 1, 2]);
    let state = first.state().expect("state");
    let mut second = Loader::attach(&config).expect("attach again");
    second.resume(&state).expect("resume");
    let steps = second.len().expect("len");
    assert_eq!(second.remaining().expect("remaining"), steps - 3);
    let rest: Vec<u64> = (&mut second).map(|batch| batch.expect("batch").step().0).collect();
    assert_eq!(rest, (3..steps).collect::<Vec<_>>(), "the newest trainer gets every remaining step");
    assert_eq!(second.remaining().expect("remaining"), 0);
    wait_until(Duration::from_secs(20), "the superseded loader to report an error", || {
        first.next_batch().is_some_and(|next| next.is_err())
    })
    .expect("superseded");
    match first.next_batch() {
        Some(Err(stoker_client::ClientError::Superseded { rank: 0, .. })) => {}
        other => panic!("expected Superseded, got {other:?}"),
    }
}

/// The window of the test above, held open: the new trainer has attached and opened its run,
/// but its hello has not reached the worker, where the old trainer is still connected. The
/// grants carry the new session, so the worker waits for it; before, it pushed the new run's
/// batches to the old trainer, which took them, and those steps never reached the new one.
#[test]
fn batches_granted_for_a_new_session_wait_for_it_rather_than_go_to_the_old_trainer() {
    let cluster = cluster_with(1);
    let worker = cluster.worker(0).expect("worker").local_addr();
    let config = config_for(&cluster.loader_config("train", 4), 0, 1);
    let mut old = Loader::attach(&config).expect("attach");
    assert_eq!(old.next_batch().expect("a batch").expect("batch").step().0, 0, "the old trainer is connected and served");

    let attach = cluster.call(ControlRequest::Attach { spec: old.spec().clone(), rank: Rank(0), client: 2 }).expect("attach");
    let (job, _, _, _, session) = expect_response!(attach, Attached { job, dataset, workers, checkpoint, session }).expect("attached");
    let open = ControlRequest::OpenEpoch {
        job,
        rank: Rank(0),
        epoch: Epoch(1),
        start: Position(0),
        session,
        pass: Pass(1),
        consumed: 0,
        holding: Vec::new(),
    };
    let steps = expect_response!(cluster.call(open).expect("open"), EpochOpened { steps }).expect("opened");
    let window = u64::from(config.prefetch).min(steps);
    info!(%session, window, "--- the new trainer opened epoch 1; its hello comes a second later");
    std::thread::sleep(Duration::from_secs(1));

    let tls = cluster.tls(Role::Trainer);
    let received: BTreeSet<u64> = cluster.block_on(async {
        let endpoint = client_endpoint(&tls, worker, Tuning::default()).expect("endpoint");
        let (connection, answer) = trainer_hello(&endpoint, worker, TrainerHello { job, rank: Rank(0), session, bulk: false }).await;
        assert_eq!(answer, Ok(()), "the new session is served");
        let pool = PayloadPool::new(2);
        let mut received = BTreeSet::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while (received.len() as u64) < window {
            let Ok(accepted) = tokio::time::timeout_at(deadline, connection.accept_uni()).await else { break };
            let mut recv = accepted.expect("stream");
            let (header, _) = receive_batch(&mut recv, &pool, |_| Ok(())).await.expect("batch");
            assert_eq!((header.job, header.rank), (job, Rank(0)));
            if header.epoch == Epoch(1) {
                received.insert(header.step.0);
            }
        }
        received
    });
    assert_eq!(received, (0..window).collect(), "every step of the new run's first window reaches the new trainer");
    drop(old);
}
