//! The randomized protocol model (issue 15, item 5): thousands of schedules of grants, acks,
//! lease expiry, worker death and wedging, trainer restarts, re-iteration, `set_epoch`,
//! `load_state_dict`, coordinator restarts and late, duplicated and reordered messages, each
//! checked for "every step of every pass yielded exactly once, in order, and every rank
//! finished". `STOKER_MODEL_SEED=N` replays one schedule; `STOKER_MODEL_SCHEDULES=N` runs N.

use std::time::Instant;

use stoker_testkit::model::{FaultCounts, Scale, run, run_at};

/// Schedules per `make test` unless `STOKER_MODEL_SCHEDULES` says otherwise.
const DEFAULT_SCHEDULES: u64 = 2_000;

/// Schedules of hundreds of ranks per `make test` unless `STOKER_MODEL_LARGE_SCHEDULES` says
/// otherwise.
const DEFAULT_LARGE_SCHEDULES: u64 = 3;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|text| text.trim().parse().ok())
}

/// Every schedule keeps the promise; the faults of interest were all exercised.
#[test]
fn every_step_is_yielded_exactly_once_under_random_faults() {
    if let Some(seed) = env_u64("STOKER_MODEL_SEED") {
        match run(seed) {
            Ok(outcome) => eprintln!("seed {seed}: ok, {outcome:?}"),
            Err(failure) => panic!("{failure}"),
        }
        return;
    }
    let schedules = env_u64("STOKER_MODEL_SCHEDULES").unwrap_or(DEFAULT_SCHEDULES);
    // `STOKER_MODEL_FIRST_SEED=N`: the schedules from seed N on (to go past a known failure).
    let first = env_u64("STOKER_MODEL_FIRST_SEED").unwrap_or(0);
    let started = Instant::now();
    let mut total = FaultCounts::default();
    let mut steps = 0;
    for seed in first..first.saturating_add(schedules) {
        let outcome = run(seed).unwrap_or_else(|failure| panic!("{failure}"));
        steps += outcome.steps_yielded;
        let c = outcome.counts;
        total.worker_deaths += c.worker_deaths;
        total.worker_wedges += c.worker_wedges;
        total.trainer_restarts += c.trainer_restarts;
        total.coordinator_restarts += c.coordinator_restarts;
        total.late_messages += c.late_messages;
        total.duplicated_messages += c.duplicated_messages;
        total.lost_batches += c.lost_batches;
        total.duplicated_batches += c.duplicated_batches;
        total.set_epochs += c.set_epochs;
        total.loads += c.loads;
        total.missing_reports += c.missing_reports;
        total.duplicates += c.duplicates;
        total.dropped += c.dropped;
        total.pauses += c.pauses;
        total.most_makes_of_a_step = total.most_makes_of_a_step.max(c.most_makes_of_a_step);
        total.refusals += c.refusals;
        total.most_quiet_refusals_of_a_chunk = total.most_quiet_refusals_of_a_chunk.max(c.most_quiet_refusals_of_a_chunk);
        total.stuck_reports += c.stuck_reports;
        total.open_retries += c.open_retries;
    }
    eprintln!("{schedules} schedules in {:.1} s, {steps} steps yielded; {total:?}", started.elapsed().as_secs_f64());
    // The model is only as good as the faults it makes: each kind must have happened.
    for (what, count) in [
        ("worker deaths", total.worker_deaths),
        ("worker wedges", total.worker_wedges),
        ("trainer restarts", total.trainer_restarts),
        ("late messages", total.late_messages),
        ("duplicated messages", total.duplicated_messages),
        ("batches lost after acknowledgement", total.lost_batches),
        ("duplicated batches", total.duplicated_batches),
        ("set_epoch calls", total.set_epochs),
        ("load_state_dict calls", total.loads),
        ("missing-step reports", total.missing_reports),
        ("paused training loops", total.pauses),
        ("stuck jobs reported", total.stuck_reports),
        ("opens asked again", total.open_retries),
    ] {
        assert!(count > 0 || schedules < 200, "no {what} in {schedules} schedules: the model does not exercise them");
    }
}

/// The same promise with 100–300 ranks and 20–120 workers (issue 35): the faults, late and
/// duplicated messages and restarts of the small schedules, where the scheduler's indexes, flow
/// windows and liveness hold many ranks and workers at once. `STOKER_MODEL_LARGE_SEED=N`
/// replays one; `STOKER_MODEL_LARGE_SCHEDULES=N` runs N from `STOKER_MODEL_LARGE_FIRST_SEED`.
#[test]
fn at_hundreds_of_ranks() {
    let seeds = match env_u64("STOKER_MODEL_LARGE_SEED") {
        Some(seed) => seed..seed + 1,
        None => {
            let first = env_u64("STOKER_MODEL_LARGE_FIRST_SEED").unwrap_or(0);
            first..first.saturating_add(env_u64("STOKER_MODEL_LARGE_SCHEDULES").unwrap_or(DEFAULT_LARGE_SCHEDULES))
        }
    };
    let started = Instant::now();
    let (mut steps, mut deaths, mut late) = (0, 0, 0);
    for seed in seeds.clone() {
        let outcome = run_at(seed, Scale::Large).unwrap_or_else(|failure| panic!("{failure}"));
        eprintln!("seed {seed}: {} steps, {:?} simulated", outcome.steps_yielded, outcome.simulated);
        steps += outcome.steps_yielded;
        deaths += outcome.counts.worker_deaths;
        late += outcome.counts.late_messages;
    }
    eprintln!("{} large schedules in {:.1} s, {steps} steps yielded", seeds.end - seeds.start, started.elapsed().as_secs_f64());
    assert!(steps > 0, "the large schedules yielded nothing");
    assert!(
        deaths > 0 && late > 0 || seeds.end - seeds.start < 3,
        "no worker deaths or late messages: the large schedules exercise no faults"
    );
}
