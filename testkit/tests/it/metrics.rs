//! Metrics of a whole cluster: what each role exports, and how many series a large job makes.

use std::collections::BTreeMap;

use std::time::Duration;

use stoker_proto::{ControlRequest, ControlResponse};

use crate::common::{cluster_with, consume};

/// Series per metric family in Prometheus' text format (a histogram's `_bucket`, `_sum` and
/// `_count` lines count as its own).
fn series_per_family(text: &str) -> BTreeMap<String, usize> {
    let mut families: BTreeMap<String, usize> = BTreeMap::new();
    let mut known = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            known.extend(rest.split_whitespace().next().map(str::to_owned));
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let family = known
            .iter()
            .rev()
            .find(|family| name == *family || name.strip_prefix(family.as_str()).is_some_and(|rest| rest.starts_with('_')))
            .cloned()
            .unwrap_or_else(|| name.to_owned());
        *families.entry(family).or_default() += 1;
    }
    families
}

#[test]
fn a_job_of_64_ranks_on_8_workers_makes_a_bounded_number_of_series() {
    const RANKS: u32 = 64;
    const WORKERS: usize = 8;
    let cluster = cluster_with(WORKERS);
    // 120 samples, one per batch: 64 ranks take one step each per epoch (the tail dropped).
    let base = cluster.loader_config("train", 1);
    let seen = consume(&base, RANKS, 1);
    assert_eq!(seen.values().map(Vec::len).sum::<usize>(), RANKS as usize, "every rank took its one step");

    let leader = cluster.leader_index().expect("a leader");
    let coordinator = series_per_family(&cluster.coordinator_metrics_text(leader).expect("coordinator metrics"));
    let workers: Vec<BTreeMap<String, usize>> =
        (0..WORKERS).map(|index| series_per_family(&cluster.worker_metrics_text(index).expect("worker metrics"))).collect();

    eprintln!("series per metric, coordinator (1 job, {RANKS} ranks):");
    for (family, count) in &coordinator {
        eprintln!("  {count:>5}  {family}");
    }
    eprintln!("  {:>5}  in all", coordinator.values().sum::<usize>());
    eprintln!("series per metric, each worker:");
    for (family, count) in &workers[0] {
        eprintln!("  {count:>5}  {family}");
    }
    eprintln!("  {:>5}  in all, x{WORKERS} workers", workers[0].values().sum::<usize>());

    // Per-rank figures: one series per rank of the job, no more (no per-worker or per-session
    // labels multiply them).
    for family in [
        "stoker_job_step",
        "stoker_job_epoch",
        "stoker_trainer_wait_seconds_total",
        "stoker_trainer_batches_total",
        "stoker_trainer_samples_total",
    ] {
        assert_eq!(coordinator.get(family), Some(&(RANKS as usize)), "{family}: {coordinator:?}");
    }
    // Everything else at the coordinator is per job, per state or a single figure.
    for (family, count) in &coordinator {
        let per_rank =
            family.starts_with("stoker_job_step") || family.starts_with("stoker_job_epoch") || family.starts_with("stoker_trainer_");
        assert!(per_rank || *count <= 20, "{family} has {count} series");
    }
    // A worker's series do not grow with ranks, jobs or trainers.
    for (index, families) in workers.iter().enumerate() {
        assert!(families.values().all(|count| *count <= 20), "worker {index}: {families:?}");
        assert_eq!(families.keys().collect::<Vec<_>>(), workers[0].keys().collect::<Vec<_>>(), "worker {index} exports the same families");
        assert!(families.get("stoker_worker_samples_total").is_some(), "worker {index}: {families:?}");
    }
    let made: u64 = (0..WORKERS)
        .map(|index| {
            let text = cluster.worker_metrics_text(index).expect("worker metrics");
            text.lines()
                .find_map(|line| line.strip_prefix("stoker_worker_samples_total "))
                .and_then(|value| value.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    assert!(made >= u64::from(RANKS), "the workers made {made} samples for {RANKS} one-sample steps");

    // A removed job's series go with it.
    let removed = cluster.remove_job(&job_name(&cluster), true);
    assert!(removed.is_ok(), "{removed:?}");
    let after = series_per_family(&cluster.coordinator_metrics_text(leader).expect("coordinator metrics"));
    for family in
        ["stoker_job_step", "stoker_trainer_wait_seconds_total", "stoker_trainer_samples_total", "stoker_coordinator_chunks_done_total"]
    {
        assert_eq!(after.get(family), None, "{family} outlived its job: {after:?}");
    }
}

/// The one job's name, from `stoker status`.
fn job_name(cluster: &stoker_testkit::TestCluster) -> String {
    match cluster.call(ControlRequest::Status) {
        Ok(ControlResponse::Status { status }) => status.jobs.first().map(|job| job.spec.name.clone()).expect("a job"),
        other => panic!("status: {other:?}"),
    }
}

/// The value of the series of `family` whose labels include `labels`, in `text`.
fn value_of(text: &str, family: &str, labels: &str) -> Option<f64> {
    text.lines().filter(|line| line.starts_with(family) && line.contains(labels)).find_map(|line| line.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_rank_that_gets_no_data_reports_its_growing_stall() {
    // No worker: the rank waits from its first step on, and the coordinator sees the wait grow
    // while nothing moves (the figure the stall alert reads).
    let cluster = cluster_with(0);
    let mut config = crate::common::config_for(&cluster.loader_config("train", 4), 0, 1);
    config.job_name = Some("starved".to_owned());
    let mut loader = stoker_client::Loader::attach(&config).expect("attach");
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        assert!(matches!(loader.next_within(Duration::from_millis(250)), Ok(stoker_client::Next::Waiting)));
    }
    let mut waited = 0.0;
    stoker_testkit::wait_until(Duration::from_secs(5), "the coordinator sees the stall", || {
        let text = cluster.coordinator_metrics_text(0).unwrap_or_default();
        waited = value_of(&text, "stoker_trainer_wait_seconds_total", "stoker_job=\"starved\"").unwrap_or(0.0);
        waited >= 3.0
    })
    .unwrap_or_else(|error| panic!("{error}: {waited} s of the rank's {:.1} s of waiting", loader.wait_seconds()));
}

#[test]
fn only_a_confirmed_leader_reports_itself_leader_and_ready() {
    let cluster = stoker_testkit::TestCluster::start(stoker_testkit::ClusterConfig { workers: 0, coordinators: 3, ..Default::default() })
        .expect("cluster");
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("a leader");
    let leads = |index: usize| value_of(&cluster.coordinator_metrics_text(index).unwrap_or_default(), "stoker_raft_leader ", "");
    stoker_testkit::wait_until(Duration::from_secs(5), "the leader confirmed", || leads(leader) == Some(1.0)).expect("confirmed");
    // A follower is ready once it has heard from the leader (under load, a moment later).
    stoker_testkit::wait_until(Duration::from_secs(5), "every coordinator ready", || {
        (0..3).all(|index| cluster.coordinator_ready(index).is_ok())
    })
    .expect("every coordinator ready");
    assert_eq!((0..3).filter(|index| leads(*index) == Some(1.0)).count(), 1, "one leader");

    // Cut off from the others, it keeps openraft's Leader state but not its majority.
    cluster.coordinator_node(leader).expect("running").set_isolated(true);
    stoker_testkit::wait_until(Duration::from_secs(5), "the cut-off leader reports itself not leading", || {
        leads(leader) == Some(0.0) && cluster.coordinator_ready(leader).is_err()
    })
    .expect("not leading");
    let others: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    stoker_testkit::wait_until(Duration::from_secs(10), "another leader", || others.iter().any(|index| leads(*index) == Some(1.0)))
        .expect("a new leader");
    let reason = cluster.coordinator_ready(leader).expect_err("not ready");
    assert!(reason.contains("majority"), "{reason}");
}

#[test]
fn a_worker_is_ready_while_the_coordinator_answers_it() {
    let mut cluster = cluster_with(1);
    stoker_testkit::wait_until(Duration::from_secs(10), "the worker ready", || cluster.worker_ready(0).is_ok()).expect("ready");
    cluster.stop_coordinator();
    stoker_testkit::wait_until(Duration::from_secs(15), "the worker not ready without a coordinator", || cluster.worker_ready(0).is_err())
        .expect("not ready");
    let reason = cluster.worker_ready(0).expect_err("not ready");
    assert!(reason.contains("not answered"), "{reason}");
    assert!(cluster.worker_metrics_text(0).expect("metrics").contains("stoker_worker_registered 0"));
    cluster.start_coordinator_again().expect("coordinator back");
    stoker_testkit::wait_until(Duration::from_secs(15), "the worker ready again", || cluster.worker_ready(0).is_ok()).expect("ready again");
}
