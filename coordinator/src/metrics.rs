//! The coordinator's metrics (DESIGN §9), read from its state at each scrape: workers, chunks
//! and flow windows per job, faults, Raft, and each trainer rank's figures from its progress
//! reports (so trainers need no scrape target of their own). Per-job and per-rank figures come
//! from the leader's soft state; a follower exports none of them.

use std::sync::{Arc, Weak};
use std::time::Instant;

use stoker_obs::error::ObsError;
use stoker_obs::prometheus::{CounterVec, GaugeVec, IntCounter, IntGauge, IntGaugeVec};
use stoker_obs::{Metrics, latency_buckets, mirror_counter};

use crate::driver::Driver;
use stoker_coordinator_core::Figures;

const JOB: &[&str] = &["stoker_job"];
const RANK: &[&str] = &["stoker_job", "rank"];

struct Families {
    workers: IntGauge,
    chunks: IntGaugeVec,
    steps_queued: IntGaugeVec,
    chunks_done: CounterVec,
    batches_done: CounterVec,
    window_fill: GaugeVec,
    worker_cores: GaugeVec,
    worker_cores_wanted: GaugeVec,
    job_cores_wanted: GaugeVec,
    job_stall: GaugeVec,
    leases_expired: CounterVec,
    chunks_failed: CounterVec,
    sessions_superseded: CounterVec,
    step: IntGaugeVec,
    epoch: IntGaugeVec,
    steps_per_epoch: IntGaugeVec,
    world_size: IntGaugeVec,
    live_ranks: IntGaugeVec,
    wait: CounterVec,
    batches: CounterVec,
    samples: CounterVec,
    raft: RaftFamilies,
}

struct RaftFamilies {
    term: IntGauge,
    leader: IntGauge,
    leader_id: IntGauge,
    applied: IntGauge,
    last_log: IntGauge,
    log_entries: IntGauge,
    voters: IntGauge,
}

impl Families {
    fn register(metrics: &Metrics) -> Result<Self, ObsError> {
        // Counters whose totals live in the leader's state are mirrored at each scrape; they
        // reset (to Prometheus, a counter reset) when leadership moves.
        let unlabelled = |name: &str, help: &str| metrics.float_counter_vec(name, help, &[]);
        Ok(Self {
            workers: metrics.gauge("stoker_coordinator_workers", "Workers whose heartbeats arrive (leader only).")?,
            chunks: metrics.gauge_vec("stoker_coordinator_chunks", "Chunks of each job by state (leased: granted to a worker, not done).", &["stoker_job", "state"])?,
            steps_queued: metrics.gauge_vec("stoker_coordinator_steps_queued", "Steps of each job waiting for a worker.", JOB)?,
            chunks_done: metrics.float_counter_vec("stoker_coordinator_chunks_done_total", "Chunks of each job delivered.", JOB)?,
            batches_done: metrics.float_counter_vec("stoker_coordinator_batches_done_total", "Batches (steps) of each job delivered: the job's cluster throughput.", JOB)?,
            window_fill: metrics.float_gauge_vec(
                "stoker_coordinator_flow_window_fill",
                "How full each job's flow windows are: steps granted ahead of the ranks still consuming, over what the windows hold (0..1).",
                JOB,
            )?,
            worker_cores: metrics.float_gauge_vec("stoker_coordinator_worker_cores", "Decode threads of the workers whose heartbeats arrive (leader only).", &[])?,
            worker_cores_wanted: metrics.float_gauge_vec(
                "stoker_coordinator_worker_cores_wanted",
                "Worker decode threads that would serve every job without data stalls, at what a worker core makes now: the jobs' stoker_job_worker_cores_wanted summed (leader only; scale workers on it).",
                &[],
            )?,
            job_cores_wanted: metrics.float_gauge_vec(
                "stoker_job_worker_cores_wanted",
                "Worker decode threads that would serve each job without data stalls: its samples per second over the share of time its ranks do not wait, over the images per second of a busy worker core (over about the last 30 s).",
                JOB,
            )?,
            job_stall: metrics.float_gauge_vec(
                "stoker_job_stall_ratio",
                "Share of each job's rank time spent waiting for data, over about the last 30 s (0..1).",
                JOB,
            )?,
            leases_expired: unlabelled("stoker_coordinator_leases_expired_total", "Leases that expired (their worker went silent or stalled); their chunks were granted again.")?,
            chunks_failed: unlabelled("stoker_coordinator_chunks_failed_total", "Chunks workers reported failed; they were granted again (retried).")?,
            sessions_superseded: unlabelled("stoker_coordinator_sessions_superseded_total", "Trainer sessions replaced by a newer trainer of the same rank.")?,
            step: metrics.gauge_vec("stoker_job_step", "Steps of its current epoch each rank has consumed.", RANK)?,
            epoch: metrics.gauge_vec("stoker_job_epoch", "The epoch each rank is in.", RANK)?,
            steps_per_epoch: metrics.gauge_vec("stoker_job_steps_per_epoch", "Steps in the current epoch of each job (per rank).", JOB)?,
            world_size: metrics.gauge_vec("stoker_job_world_size", "Ranks of each job.", JOB)?,
            live_ranks: metrics.gauge_vec("stoker_job_live_ranks", "Ranks of each job whose trainer is live.", JOB)?,
            wait: metrics.float_counter_vec(
                "stoker_trainer_wait_seconds_total",
                "Seconds each rank's training loop waited for data, as its trainer reports it: the data stall.",
                RANK,
            )?,
            batches: metrics.float_counter_vec("stoker_trainer_batches_total", "Batches each rank's trainer yielded, as it reports it.", RANK)?,
            samples: metrics.float_counter_vec("stoker_trainer_samples_total", "Samples in them.", RANK)?,
            raft: RaftFamilies {
                term: metrics.gauge("stoker_raft_term", "This coordinator's Raft term.")?,
                leader: metrics.gauge("stoker_raft_leader", "1 on the coordinator that leads, else 0.")?,
                leader_id: metrics.gauge("stoker_raft_leader_id", "Node id of the leader as this coordinator knows it (0: none).")?,
                applied: metrics.gauge("stoker_raft_applied_index", "Index of the last log entry applied to the state.")?,
                last_log: metrics.gauge("stoker_raft_last_log_index", "Index of the last entry in the log.")?,
                log_entries: metrics.gauge("stoker_raft_log_entries", "Entries kept in the log (behind them: a snapshot).")?,
                voters: metrics.gauge("stoker_raft_voters", "Voting coordinators in the membership.")?,
            },
        })
    }

    /// Export `figures` (`None`: this node does not lead, and exports none of them: a series
    /// that goes away is stale to Prometheus, where one set to 0 would read as a counter reset
    /// and its next value as an increase).
    fn update(&self, figures_opt: Option<&Figures>) {
        let empty = Figures::default();
        let figures = figures_opt.unwrap_or(&empty);
        self.workers.set(figures.workers_alive as i64);
        for (counter, total) in [
            (&self.leases_expired, figures.leases_expired),
            (&self.chunks_failed, figures.chunks_failed),
            (&self.sessions_superseded, figures.sessions_superseded),
        ] {
            match figures_opt {
                Some(_) => mirror_counter(&counter.with_label_values(&[] as &[&str]), total as f64),
                None => counter.reset(),
            }
        }
        // Label sets of removed jobs go; the others are set again below.
        for gauge in [&self.chunks, &self.steps_queued, &self.step, &self.epoch, &self.steps_per_epoch, &self.world_size, &self.live_ranks]
        {
            gauge.reset();
        }
        for gauge in [&self.window_fill, &self.worker_cores, &self.worker_cores_wanted, &self.job_cores_wanted, &self.job_stall] {
            gauge.reset();
        }
        if figures_opt.is_some() {
            self.worker_cores.with_label_values(&[] as &[&str]).set(f64::from(figures.worker_cores));
            // Unknown is absent, not 0 (an autoscaler would read 0 as "scale down"): while a
            // job with figures has no estimate (no worker has measured what a core makes).
            let demands: Vec<_> = figures.jobs.iter().filter_map(|job| job.demand).collect();
            if demands.iter().all(|demand| demand.worker_cores.is_some()) {
                let wanted = demands.iter().filter_map(|demand| demand.worker_cores).sum();
                self.worker_cores_wanted.with_label_values(&[] as &[&str]).set(wanted);
            }
        }
        let mut kept = Vec::new();
        for job in &figures.jobs {
            let name = job.name.as_str();
            self.chunks.with_label_values(&[name, "leased"]).set(i64::from(job.chunks_leased));
            self.steps_queued.with_label_values(&[name]).set(i64::from(job.steps_queued));
            mirror_counter(&self.chunks_done.with_label_values(&[name]), job.done.chunks as f64);
            mirror_counter(&self.batches_done.with_label_values(&[name]), job.done.steps as f64);
            let (pending, capacity) = job.window;
            self.window_fill.with_label_values(&[name]).set(if capacity == 0 { 0.0 } else { pending as f64 / capacity as f64 });
            self.world_size.with_label_values(&[name]).set(i64::from(job.world_size));
            self.live_ranks.with_label_values(&[name]).set(job.live_ranks as i64);
            if let Some(demand) = job.demand {
                self.job_stall.with_label_values(&[name]).set(demand.stall);
                if let Some(cores) = demand.worker_cores {
                    self.job_cores_wanted.with_label_values(&[name]).set(cores);
                }
            }
            for (status, totals_opt) in &job.ranks {
                let rank = status.rank.0.to_string();
                let labels = [name, rank.as_str()];
                self.step.with_label_values(&labels).set(status.consumed.0 as i64);
                self.epoch.with_label_values(&labels).set(status.epoch.0 as i64);
                self.steps_per_epoch.with_label_values(&[name]).set(status.steps as i64);
                if let Some(totals) = totals_opt {
                    mirror_counter(&self.wait.with_label_values(&labels), totals.wait_seconds);
                    mirror_counter(&self.batches.with_label_values(&labels), totals.batches as f64);
                    mirror_counter(&self.samples.with_label_values(&labels), totals.samples as f64);
                    kept.push((name.to_owned(), rank));
                }
            }
        }
        // Counters of ranks and jobs no longer known go (a follower has none).
        for counter in [&self.wait, &self.batches, &self.samples] {
            retain_labels(counter, &kept);
        }
        let jobs: Vec<(String, String)> = figures.jobs.iter().map(|job| (job.name.clone(), String::new())).collect();
        for counter in [&self.chunks_done, &self.batches_done] {
            retain_labels(counter, &jobs);
        }
    }
}

/// Remove every label set of `counter` whose `stoker_job` (and `rank`, where it has one) is not
/// in `kept` (the rank empty for per-job counters).
fn retain_labels(counter: &CounterVec, kept: &[(String, String)]) {
    use stoker_obs::prometheus::core::Collector;
    for family in counter.collect() {
        for metric in family.get_metric() {
            // The pairs come sorted by label name, not in the declared order: look them up.
            let labels: std::collections::HashMap<&str, &str> = metric.get_label().iter().map(|pair| (pair.name(), pair.value())).collect();
            let Some(job) = labels.get("stoker_job") else { continue };
            let known = match labels.get("rank") {
                Some(rank) => kept.iter().any(|(kept_job, kept_rank)| kept_job == job && kept_rank == rank),
                None => kept.iter().any(|(kept_job, _)| kept_job == job),
            };
            if !known && let Err(error) = counter.remove(&labels) {
                tracing::debug!(%error, "cannot remove a metric's series");
            }
        }
    }
}

/// Register the coordinator's metrics, refreshed from `driver` at each scrape, and its
/// readiness: a leader is known (the state is loaded once `start` returned). Returns the
/// counter of refused handshakes, for the accept loop.
pub(crate) fn observe(metrics: &Metrics, driver: &Arc<Driver>) -> Result<IntCounter, ObsError> {
    let families = Families::register(metrics)?;
    let lease_seconds = metrics.histogram(
        "stoker_coordinator_lease_seconds",
        "Time from a chunk's lease granted to the chunk reported done.",
        latency_buckets(),
    )?;
    driver.core().observe_leases(lease_seconds);
    let handshakes = metrics.counter(
        "stoker_handshakes_refused_total",
        "Connections refused or failed at the QUIC handshake (wrong protocol version, bad TLS).",
    )?;
    let weak: Weak<Driver> = Arc::downgrade(driver);
    metrics.on_scrape(move || {
        let Some(driver) = weak.upgrade() else { return };
        // Only a leader a majority confirmed exports the scheduling figures: a follower, or a
        // leader cut off from the others (which schedules nothing), exports none of them.
        let leads = driver.leads_confirmed();
        let figures_opt = leads.then(|| driver.core().figures(Instant::now()));
        families.update(figures_opt.as_ref());
        let raft = driver.raft();
        let raft_metrics = raft.metrics().borrow().clone();
        let r = &families.raft;
        r.term.set(raft_metrics.current_term as i64);
        r.leader.set(i64::from(leads));
        r.leader_id.set(raft_metrics.current_leader.unwrap_or(0) as i64);
        r.applied.set(raft_metrics.last_applied.map_or(0, |log_id| log_id.index) as i64);
        let last_log = raft_metrics.last_log_index.unwrap_or(0);
        r.last_log.set(last_log as i64);
        let entries = match (raft_metrics.last_log_index, raft_metrics.purged) {
            (Some(last), Some(purged)) => last.saturating_sub(purged.index),
            (Some(last), None) => last + 1,
            (None, _) => 0,
        };
        r.log_entries.set(entries as i64);
        r.voters.set(raft_metrics.membership_config.membership().voter_ids().count() as i64);
    });
    let weak: Weak<Driver> = Arc::downgrade(driver);
    metrics.set_readiness(move || {
        let Some(driver) = weak.upgrade() else { return Err("stopped".to_owned()) };
        if driver.leads_confirmed() {
            return Ok(());
        }
        let (state, leader) = {
            let metrics = driver.raft().metrics();
            let metrics = metrics.borrow();
            (metrics.state, metrics.current_leader)
        };
        match (state, leader) {
            (openraft::ServerState::Leader, _) => {
                Err("leader without a majority's confirmation (other coordinators unreachable?)".to_owned())
            }
            (_, Some(_)) => Ok(()),
            (_, None) => Err("no Raft leader known (fewer than a majority of coordinators reachable?)".to_owned()),
        }
    });
    Ok(handshakes)
}
