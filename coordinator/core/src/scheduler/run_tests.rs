use std::collections::BTreeSet;
use std::time::Duration;

use super::*;

fn key() -> RunKey {
    RunKey { job: JobId(1), epoch: Epoch(0), start: Position(0) }
}

fn run(steps: u64, world_size: u32, prefetch: u32, chunk_steps: u32) -> Run {
    Run::new(key(), steps, world_size, prefetch, chunk_steps, |_| Counted::MayCome)
}

/// Grant everything grantable now to live trainers, numbering leases from 1.
fn grant_all(run: &mut Run, now: Instant) -> Vec<(LeaseId, Chunk)> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    run.grant(1000, now, |_| true, |_| 0, || LeaseId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))
}

fn covered(chunks: &[(LeaseId, Chunk)]) -> BTreeSet<(u32, u64)> {
    chunks.iter().flat_map(|(_, c)| chunk_steps(c).map(move |s| (c.rank.0, s))).collect()
}

fn order(chunks: &[(LeaseId, Chunk)]) -> Vec<(u64, u32)> {
    chunks.iter().map(|(_, c)| (c.first_step.0, c.rank.0)).collect()
}

#[test]
fn chunks_come_in_step_then_rank_order_within_the_window() {
    let now = Instant::now();
    let mut run = run(10, 2, 4, 2);
    let granted = grant_all(&mut run, now);
    assert_eq!(order(&granted), vec![(0, 0), (0, 1), (2, 0), (2, 1)], "steps 0..4 only: the window is 4");
    assert!(grant_all(&mut run, now).is_empty(), "nothing more until a rank consumes");
    run.set_consumed(Rank(0), 4);
    assert!(grant_all(&mut run, now).is_empty(), "the slowest rank holds the window");
    run.set_consumed(Rank(1), 2);
    assert_eq!(order(&grant_all(&mut run, now)), vec![(4, 0), (4, 1)]);
}

#[test]
fn every_step_of_every_rank_is_granted_once_without_failures() {
    let now = Instant::now();
    let mut run = run(7, 3, 3, 2);
    let mut all = Vec::new();
    for _ in 0..40 {
        let granted = run.grant(2, now, |_| true, |_| 0, || LeaseId(all.len() as u64 + 1000));
        all.extend(granted.iter().copied());
        // Each rank consumes the next step once it has been made.
        let made = covered(&all);
        for rank in 0..3 {
            let next = run.consumed(Rank(rank));
            if made.contains(&(rank, next)) {
                run.set_consumed(Rank(rank), next + 1);
            }
        }
    }
    let steps: Vec<(u32, u64)> = all.iter().flat_map(|(_, c)| chunk_steps(c).map(move |s| (c.rank.0, s))).collect();
    let unique = covered(&all);
    assert_eq!(steps.len(), unique.len(), "no step granted twice");
    assert_eq!(unique.len(), 21, "3 ranks x 7 steps");
    assert!(run.is_finished());
}

#[test]
fn a_rank_that_starts_the_run_again_gets_every_delivered_step_again() {
    let now = Instant::now();
    let mut run = run(4, 2, 10, 2);
    let first = grant_all(&mut run, now);
    for (lease, chunk) in &first {
        run.delivered(chunk, *lease, now);
    }
    run.set_consumed(Rank(0), 4);
    run.restart_rank(Rank(0), 0, &[], now);
    assert_eq!(run.consumed(Rank(0)), 0);
    let again = covered(&grant_all(&mut run, now));
    assert_eq!(again, covered(&first).into_iter().filter(|(rank, _)| *rank == 0).collect(), "rank 0's steps, once more");
}

/// Regression (issue 15, loss path 1): a rank that had consumed nothing yet was left alone
/// by a restart, but its first batches may already have been delivered to a trainer that died
/// (or dropped them with `set_epoch`/`load_state_dict`) before yielding them.
#[test]
fn a_restart_before_the_first_step_was_consumed_makes_the_delivered_steps_again() {
    let now = Instant::now();
    let mut run = run(4, 1, 10, 2);
    let first = grant_all(&mut run, now);
    for (lease, chunk) in &first {
        run.delivered(chunk, *lease, now);
    }
    assert_eq!(run.consumed(Rank(0)), 0);
    run.restart_rank(Rank(0), 0, &[Step(3)], now);
    let again = covered(&grant_all(&mut run, now));
    assert_eq!(again, [(0, 0), (0, 1), (0, 2)].into_iter().collect(), "every delivered step but the one the trainer holds");
}

#[test]
fn a_restart_leaves_leased_and_queued_steps_alone() {
    let now = Instant::now();
    let mut run = run(6, 1, 4, 2);
    let leased = run.grant(1, now, |_| true, |_| 0, || LeaseId(1));
    assert_eq!(order(&leased), vec![(0, 0)]);
    run.restart_rank(Rank(0), 0, &[], now);
    let rest = grant_all(&mut run, now);
    assert_eq!(order(&rest), vec![(2, 0)], "steps 0 and 1 stay leased; 2 and 3 were queued already");
}

#[test]
fn a_step_reported_missing_is_made_again_once_its_delivery_is_old_enough() {
    let now = Instant::now();
    let grace = Duration::from_secs(1);
    let mut run = run(4, 1, 10, 2);
    let granted = grant_all(&mut run, now);
    let (lease, chunk) = granted[0];
    assert_eq!(run.missing(Rank(0), &[Step(0)], grace, now + grace), 0, "leased: on its way");
    run.delivered(&chunk, lease, now);
    assert_eq!(run.missing(Rank(0), &[Step(0)], grace, now), 0, "delivered just now: may still be being read");
    assert_eq!(run.missing(Rank(0), &[Step(0), Step(9)], grace, now + grace), 1, "step 9 is not in the run");
    assert_eq!(order(&grant_all(&mut run, now + grace)), vec![(0, 0)]);
    assert_eq!(run.missing(Rank(0), &[Step(0)], grace, now + grace * 5), 0, "leased again: asking twice makes it once");
}

#[test]
fn a_failed_lease_is_queued_again_with_its_delay_and_a_late_report_of_an_old_lease_is_ignored() {
    let now = Instant::now();
    let later = now + Duration::from_secs(1);
    let mut run = run(10, 1, 10, 4);
    let granted = run.grant(1, now, |_| true, |_| 0, || LeaseId(1));
    let (lease, chunk) = granted[0];
    assert_eq!(chunk.steps, 4);
    run.set_consumed(Rank(0), 1);
    run.requeue(&chunk, lease, Some(later));
    let waiting = grant_all(&mut run, now);
    assert!(waiting.iter().all(|(_, c)| c.first_step.0 >= 4), "the requeued steps wait until later: {waiting:?}");
    let retried = run.grant(10, later, |_| true, |_| 0, || LeaseId(7));
    assert_eq!(retried.len(), 1);
    assert_eq!((retried[0].1.first_step, retried[0].1.steps), (Step(1), 3), "trimmed to what the rank still needs");
    run.delivered(&chunk, lease, later);
    run.requeue(&chunk, lease, None);
    assert!(grant_all(&mut run, later).is_empty(), "the old lease no longer owns its steps");
}

/// Regression (issue 15, loss path 3): a run created while a rank was already in a later run
/// started that rank at 0, and the window stayed pinned at `prefetch` steps forever.
#[test]
fn a_rank_already_past_the_run_holds_no_window_in_it() {
    let now = Instant::now();
    let mut run = Run::new(key(), 10, 2, 2, 1, |rank| if rank == Rank(1) { Counted::Ahead } else { Counted::MayCome });
    let mut granted = Vec::new();
    for step in 0..10 {
        granted.extend(grant_all(&mut run, now));
        run.set_consumed(Rank(0), step + 1);
    }
    assert!(run.is_finished(), "rank 0 alone finishes the run");
    assert_eq!(covered(&granted), (0..10).map(|step| (0, step)).collect(), "only rank 0's steps are made");
}

/// Wherever the rank went (a later epoch, another start of this one, an earlier epoch), it
/// holds no window here; only whether it counts as past the run differs.
#[test]
fn a_departed_rank_releases_the_window_and_its_queued_steps() {
    let now = Instant::now();
    let later = RunKey { epoch: Epoch(1), ..key() };
    let elsewhere = RunKey { start: Position(8), ..key() };
    let mut earlier_epoch_run = Run::new(RunKey { epoch: Epoch(2), ..key() }, 6, 2, 2, 2, |_| Counted::MayCome);
    for (to, run) in [(later, &mut run(6, 2, 2, 2)), (elsewhere, &mut run(6, 2, 2, 2)), (key(), &mut earlier_epoch_run)] {
        assert_eq!(grant_all(run, now).len(), 2);
        run.set_consumed(Rank(0), 2);
        run.depart(Rank(1), to);
        let next = grant_all(run, now);
        assert_eq!(order(&next), vec![(2, 0)], "rank 1 gets nothing more, rank 0 goes on ({to:?})");
        assert_eq!(run.queued_len(), 0);
        let mut rest = Vec::new();
        for step in 3..=6 {
            run.set_consumed(Rank(0), step);
            rest.extend(grant_all(run, now));
        }
        assert_eq!(order(&rest), vec![(4, 0)], "rank 0 is not held by rank 1 ({to:?})");
        assert!(run.is_finished(), "{to:?}");
    }
}

/// Found by review: with no trainer live, the window's base used to be the run's end, and a
/// pull cut and scanned every step of every rank. Nothing enters the window of a rank whose
/// trainer is not live.
#[test]
fn a_run_with_no_live_trainer_cuts_nothing_and_a_silent_rank_holds_only_its_window() {
    let now = Instant::now();
    let mut run = run(1000, 4, 4, 2);
    assert!(run.grant(100, now, |_| false, |_| 0, || LeaseId(1)).is_empty());
    assert_eq!(run.queued_len(), 0, "nothing cut with nobody to take it");
    // Rank 0 live, consuming through the run; the others silent.
    let mut lease = 0;
    for consumed in 0..1000 {
        for (id, chunk) in run.grant(
            100,
            now,
            |rank| rank == Rank(0),
            |_| 0,
            || {
                lease += 1;
                LeaseId(lease)
            },
        ) {
            run.delivered(&chunk, id, now);
        }
        run.set_consumed(Rank(0), consumed + 1);
    }
    assert_eq!(run.queued_len(), 0, "no steps of the silent ranks pile up");
    // A silent rank that comes back is cut from where it was.
    let back = run.grant(100, now, |rank| rank == Rank(1), |_| 0, || LeaseId(9999));
    assert_eq!(order(&back), vec![(0, 1), (2, 1)], "its first window");
}

#[test]
fn a_checkpoint_waits_for_every_ranks_position_to_be_known() {
    let now = Instant::now();
    let mut run = Run::new(key(), 4, 2, 4, 2, |rank| if rank == Rank(1) { Counted::Absent } else { Counted::MayCome });
    run.restart_rank(Rank(0), 0, &[], now);
    run.set_consumed(Rank(0), 2);
    assert_eq!(run.checkpointable_consumed(), None, "rank 1 was absent: its position is unknown");
    run.restart_rank(Rank(1), 1, &[], now);
    assert_eq!(run.checkpointable_consumed(), Some(1));
    run.detach(Rank(1));
    assert_eq!(run.checkpointable_consumed(), None, "it detached");
    // A rank that left for an earlier epoch (a restarted trainer resuming from its own state)
    // is not past this run (found by review); one that left for a later epoch is.
    run.depart(Rank(1), RunKey { epoch: Epoch(0), ..key() });
    assert_eq!(run.checkpointable_consumed(), None, "rank 1 went back: not past this run");
    let mut later = Run::new(RunKey { epoch: Epoch(1), ..key() }, 4, 2, 4, 2, |_| Counted::MayCome);
    later.set_consumed(Rank(0), 3);
    later.depart(Rank(1), RunKey { epoch: Epoch(0), ..key() });
    assert_eq!(later.checkpointable_consumed(), None, "rank 1 went back to epoch 0");
    later.depart(Rank(1), RunKey { epoch: Epoch(2), ..key() });
    assert_eq!(later.checkpointable_consumed(), Some(3), "rank 1 is past the run");
}
