//! The control-plane benchmark (issue 35; `stoker bench control-plane`): the real coordinator
//! core — the same request handling, scheduler and state machine a coordinator runs — driven in
//! process by simulated trainers and workers, on a virtual clock, with every answer checked.
//!
//! Each simulated rank attaches, opens epoch 0 and reports its progress every virtual second;
//! each simulated worker registers, heartbeats, pulls chunks and reports each one done in the
//! next round (its batches take no time: what is measured is the coordinator's cost only).
//! Every grant is checked against the simulation's own book: no step of a rank is ever leased
//! to two live leases, none is made twice, and the epoch ends with every step of every rank
//! made exactly once. Commands the core commits are applied at once (as in local mode) and
//! counted with their size in the replicated log's encoding (JSON).
//!
//! What it does not include: Raft's own cost (the append, the followers), the network, TLS
//! and serialisation of the requests (the QUIC mode of issue 35 is not built).

mod sim;

use serde::Serialize;

pub use self::sim::run;

/// The simulated cluster.
#[derive(Clone, Debug, Serialize)]
pub struct ControlBenchConfig {
    /// Trainer ranks in all, split evenly over the jobs.
    pub ranks: u32,
    /// Workers.
    pub workers: u32,
    /// Jobs (all on one dataset).
    pub jobs: u32,
    /// Steps of the epoch each rank runs.
    pub steps: u32,
    /// Steps per chunk (the coordinator's `--chunk-steps`).
    pub chunk_steps: u32,
    /// Each job's flow window, in steps.
    pub prefetch: u32,
    /// Chunks a worker asks for at a time.
    pub pull_max: u32,
    /// Virtual milliseconds per round (each worker pulls once a round).
    pub round_millis: u64,
    /// Rounds before the benchmark gives up (a stall is reported, not waited out).
    pub max_rounds: u64,
}

impl Default for ControlBenchConfig {
    fn default() -> Self {
        Self {
            ranks: 1_000,
            workers: 100,
            jobs: 2,
            steps: 16,
            chunk_steps: 2,
            prefetch: 8,
            pull_max: 4,
            round_millis: 100,
            max_rounds: 10_000,
        }
    }
}

/// The cost of one kind of request.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindReport {
    /// The request's name (`PullChunks`, ...).
    pub kind: &'static str,
    /// How many were stepped.
    pub count: u64,
    /// Time in the core, all of them, in seconds.
    pub total_seconds: f64,
    /// Median time of one, in microseconds.
    pub p50_micros: f64,
    /// 99th percentile, in microseconds.
    pub p99_micros: f64,
    /// The slowest, in microseconds.
    pub max_micros: f64,
}

/// What the benchmark measured.
#[derive(Clone, Debug, Serialize)]
pub struct ControlBenchReport {
    /// The cluster simulated.
    pub config: ControlBenchConfig,
    /// Chunks granted (epoch 0's, and the first of epoch 1, which the core plans ahead).
    pub grants: u64,
    /// Steps of epoch 0 made (all of them, every rank's, or the run fails).
    pub steps_made: u64,
    /// Grants per second of core time spent on the steady state's requests (pulls, done
    /// reports, progress reports, heartbeats, ticks): what one core could sustain.
    pub grants_per_core_second: f64,
    /// Core time per 1,000 grants, in milliseconds (all of the steady state's requests).
    pub core_millis_per_1000_grants: f64,
    /// Share of one core the progress reports took at their real rate (every rank once a
    /// virtual second).
    pub progress_core_share: f64,
    /// Virtual seconds the epoch took.
    pub virtual_seconds: f64,
    /// Commands committed to the replicated log during the steady state, per virtual second.
    pub log_entries_per_second: f64,
    /// Their bytes (JSON, as the log stores them) per virtual second.
    pub log_bytes_per_second: f64,
    /// Commands committed while attaching and registering.
    pub setup_log_entries: u64,
    /// Refusals and errors the core answered, by request kind (none expected).
    pub errors: Vec<(String, u64)>,
    /// Per request kind.
    pub kinds: Vec<KindReport>,
    /// Bytes of memory the process gained for the ranks' attaches (per rank) and the workers'
    /// registrations (per worker), when the caller can measure it.
    pub memory_per_rank_bytes: Option<f64>,
    /// See `memory_per_rank_bytes`.
    pub memory_per_worker_bytes: Option<f64>,
}

/// A benchmark that could not run, or found the core breaking a rule.
#[derive(Debug, thiserror::Error)]
pub enum ControlBenchError {
    /// The configuration cannot be simulated.
    #[error("{0}")]
    Config(String),
    /// The core broke exactly-once: a step leased twice, made twice, or never made.
    #[error("exactly-once broken: {0}")]
    Violation(String),
    /// The epoch did not finish within `max_rounds`.
    #[error("the epoch did not finish in {rounds} rounds: {done} of {expected} steps made (raise --max-rounds, or this is a stall)")]
    Stalled {
        /// Rounds run.
        rounds: u64,
        /// Steps made.
        done: u64,
        /// Steps the epoch has.
        expected: u64,
    },
    /// A request the simulation makes was refused where it must not be.
    #[error("{kind} refused: {message}")]
    Refused {
        /// The request.
        kind: &'static str,
        /// The refusal.
        message: String,
    },
}
