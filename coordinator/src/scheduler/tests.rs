use std::collections::BTreeMap;

use stoker_common::ids::{Epoch, Step};

use super::*;

fn config() -> SchedulerConfig {
    SchedulerConfig {
        lease_ttl: Duration::from_secs(3),
        chunk_steps: 2,
        retry_delay: Duration::from_secs(1),
        trainer_ttl: Duration::from_secs(5),
    }
}

fn key() -> RunKey {
    RunKey { job: JobId(1), epoch: Epoch(0), start: 0 }
}

fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7500))
}

/// Step coverage per (rank, step) of granted chunks.
fn tally(granted: &[(LeaseId, Chunk)], counts: &mut BTreeMap<(u32, u64), u32>) {
    for (_, chunk) in granted {
        for step in chunk.first_step.0..chunk.first_step.0 + u64::from(chunk.steps) {
            *counts.entry((chunk.rank.0, step)).or_default() += 1;
        }
    }
}

#[test]
fn an_expired_lease_is_granted_again_to_another_worker() {
    let start = Instant::now();
    let mut scheduler = Scheduler::new(config(), 1);
    scheduler.open_run(key(), Rank(0), 4, 1, 8, start);
    let dead = scheduler.register_worker(addr(), 1, start);
    let alive = scheduler.register_worker(addr(), 1, start);
    let granted = scheduler.pull(dead, 1, start).expect("registered");
    assert_eq!(granted.len(), 1);
    let later = start + Duration::from_secs(2);
    scheduler.heartbeat(alive, &[], 0, later).expect("registered");
    let others = scheduler.pull(alive, 10, later).expect("registered");
    assert_eq!(others.iter().map(|(_, c)| c.first_step).collect::<Vec<_>>(), vec![Step(2)], "the dead worker's lease is still valid");
    let expired_at = start + Duration::from_secs(4);
    scheduler.heartbeat(alive, &[others[0].0], 0, expired_at).expect("registered");
    let regranted = scheduler.pull(alive, 10, expired_at).expect("registered");
    assert_eq!(regranted.iter().map(|(_, c)| c.first_step).collect::<Vec<_>>(), vec![Step(0)]);
    assert_eq!(scheduler.leases_expired(), 1);
    let revoked = scheduler.heartbeat(dead, &[granted[0].0], 0, expired_at).expect("still known");
    assert_eq!(revoked, vec![granted[0].0], "the dead worker learns its lease is gone");
}

#[test]
fn a_deregistered_worker_hands_its_chunks_back_at_once() {
    let now = Instant::now();
    let mut scheduler = Scheduler::new(config(), 1);
    scheduler.open_run(key(), Rank(0), 2, 1, 8, now);
    let leaving = scheduler.register_worker(addr(), 1, now);
    let staying = scheduler.register_worker(addr(), 1, now);
    assert_eq!(scheduler.pull(leaving, 5, now).expect("registered").len(), 1);
    assert!(scheduler.pull(staying, 5, now).expect("registered").is_empty());
    scheduler.deregister(leaving);
    assert_eq!(scheduler.pull(staying, 5, now).expect("registered").len(), 1);
    assert_eq!(scheduler.pull(leaving, 1, now), Err(Refusal::UnknownWorker(leaving)));
}

#[test]
fn with_failures_every_step_is_still_covered_and_the_window_holds() {
    // Workers fail every third chunk; ranks consume what arrives in order.
    let start = Instant::now();
    let mut scheduler = Scheduler::new(config(), 1);
    let (steps, world_size, prefetch) = (9, 3, 4);
    for rank in 0..world_size {
        scheduler.open_run(key(), Rank(rank), steps, world_size, prefetch, start);
    }
    let worker = scheduler.register_worker(addr(), 1, start);
    let mut delivered: BTreeMap<(u32, u64), u32> = BTreeMap::new();
    let mut consumed = vec![0u64; world_size as usize];
    let mut now = start;
    for round in 0..200u32 {
        now += Duration::from_millis(500);
        scheduler.heartbeat(worker, &[], 0, now).expect("registered");
        let granted = scheduler.pull(worker, 2, now).expect("registered");
        for (index, (lease, chunk)) in granted.iter().enumerate() {
            let slowest = *consumed.iter().min().unwrap_or(&0);
            assert!(chunk.first_step.0 < slowest + u64::from(prefetch), "window: {chunk:?} with slowest {slowest}");
            if (round as usize + index).is_multiple_of(3) {
                scheduler.chunk_failed(worker, *lease, now);
            } else {
                tally(&[(*lease, *chunk)], &mut delivered);
                scheduler.chunk_done(worker, *lease);
            }
        }
        for rank in 0..world_size {
            while delivered.contains_key(&(rank, consumed[rank as usize])) && consumed[rank as usize] < steps {
                consumed[rank as usize] += 1;
            }
            scheduler.record_progress(key(), Rank(rank), consumed[rank as usize], now);
        }
        if !scheduler.has_run(key()) {
            break;
        }
    }
    assert!(!scheduler.has_run(key()), "the run finished: consumed {consumed:?}");
    assert_eq!(delivered.len(), (steps * u64::from(world_size)) as usize);
}

#[test]
fn opening_a_new_epoch_releases_the_rank_from_the_old_one() {
    let now = Instant::now();
    let mut scheduler = Scheduler::new(config(), 1);
    scheduler.open_run(key(), Rank(0), 4, 1, 8, now);
    let next = RunKey { epoch: Epoch(1), ..key() };
    scheduler.open_run(next, Rank(0), 4, 1, 8, now);
    assert!(!scheduler.has_run(key()), "its only rank left epoch 0");
    assert!(scheduler.has_run(next));
    let worker = scheduler.register_worker(addr(), 1, now);
    assert!(scheduler.pull(worker, 10, now).expect("registered").iter().all(|(_, c)| c.epoch == Epoch(1)));
}

#[test]
fn chunks_of_a_rank_whose_trainer_went_silent_wait_for_it() {
    let start = Instant::now();
    let mut scheduler = Scheduler::new(config(), 1);
    scheduler.open_run(key(), Rank(0), 8, 2, 8, start);
    scheduler.open_run(key(), Rank(1), 8, 2, 8, start);
    let worker = scheduler.register_worker(addr(), 1, start);
    let ranks = |granted: &[(LeaseId, Chunk)]| granted.iter().map(|(_, chunk)| chunk.rank.0).collect::<Vec<_>>();
    let first = scheduler.pull(worker, 2, start).expect("registered");
    assert_eq!(ranks(&first), [0, 1]);
    for (lease, _) in first {
        scheduler.chunk_done(worker, lease);
    }
    // Rank 1's trainer goes away; rank 0 keeps reporting.
    let later = start + config().trainer_ttl + Duration::from_secs(1);
    scheduler.heartbeat(worker, &[], 0, later).expect("registered");
    scheduler.record_progress(key(), Rank(0), 0, later);
    assert_eq!(ranks(&scheduler.pull(worker, 10, later).expect("registered")), [0, 0, 0], "rank 1's chunks wait");
    // It comes back (a restarted trainer attaches and opens the run again).
    scheduler.open_run(key(), Rank(1), 8, 2, 8, later);
    assert_eq!(ranks(&scheduler.pull(worker, 10, later).expect("registered")), [1, 1, 1]);
}
