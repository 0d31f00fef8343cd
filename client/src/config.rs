//! What a trainer asks for: the job spec, its rank, and how long to wait.

use std::num::NonZeroU32;
use std::time::Duration;

use stoker_net::CoordinatorAddrs;
use stoker_net::TlsSource;
use stoker_net::bulk::BatchTransport;
use stoker_plan::ids::Rank;
use stoker_plan::transform::{Recipe, TransformSpec};
use stoker_plan::{PlanSpec, Shuffle, Tail};
use stoker_proto::JobSpec;

use crate::error::ClientError;

/// The shortest `nack_after` accepted: below it a rank asks for steps that are merely in flight.
pub const MIN_NACK_AFTER: Duration = Duration::from_millis(50);

/// Settings of a [`crate::Loader`].
#[derive(Clone, Debug)]
pub struct LoaderConfig {
    /// The coordinator's address, or the addresses of the nodes of a replicated coordinator
    /// (calls follow the Raft leader among them).
    pub coordinator: CoordinatorAddrs,
    /// Dataset name, as registered with `stoker dataset add`.
    pub dataset: String,
    /// Job name [default: derived from the dataset, the spec and the run id, so the ranks of
    /// one run share it].
    pub job_name: Option<String>,
    /// Names the training run, so that two runs with identical settings get two jobs instead of
    /// sharing one (and taking each other's ranks) [default: `TORCHELASTIC_RUN_ID`, which
    /// torchrun sets, else none]. Ignored when `job_name` is given.
    pub run_id: Option<String>,
    /// Samples per batch per rank.
    pub batch_size: u32,
    /// This trainer's rank [default: `RANK` from the environment, else 0].
    pub rank: Option<u32>,
    /// Number of ranks [default: `WORLD_SIZE` from the environment, else 1].
    pub world_size: Option<u32>,
    /// Seed of shuffling and augmentation.
    pub seed: u64,
    /// Shuffle mode.
    pub shuffle: Shuffle,
    /// Tail policy.
    pub tail: Tail,
    /// Transforms the workers apply.
    pub transforms: TransformSpec,
    /// Steps the workers may run ahead of the slowest rank.
    pub prefetch: u32,
    /// How long to wait for one batch before giving up.
    pub batch_timeout: Duration,
    /// How long to wait for a step before telling the coordinator it is missing (so that a
    /// batch lost after delivery is made again instead of waited for until the timeout).
    pub nack_after: Duration,
    /// Where the trainer's certificate comes from [default: the local CA, which works on one
    /// machine; give a trainer certificate's directory for a cluster].
    pub tls: TlsSource,
    /// Most batches this trainer holds before it yields them (waiting for an earlier step, or
    /// of the next epoch, made early) [default: 4 × prefetch + 16]. Past it the batch farthest
    /// ahead is dropped and made again later, so a worker sending far ahead (a bug, or a
    /// hostile one) cannot fill the trainer's memory; as many more may be arriving at once.
    pub max_buffered_batches: Option<u32>,
    /// How batches arrive [default: a bulk connection (TLS over TCP) to every worker that
    /// takes one, QUIC from the rest]; [`BatchTransport::Quic`] receives over QUIC only.
    pub batch_transport: BatchTransport,
}

impl LoaderConfig {
    /// Defaults: RandomResizedCrop(224) + RandomHorizontalFlip, window shuffle, tail `drop`,
    /// seed 0, prefetch 8, a 5-minute batch timeout, missing steps reported after 1 s.
    /// `coordinator` is one address (a `SocketAddr`) or a [`CoordinatorAddrs`] list.
    pub fn new(coordinator: impl Into<CoordinatorAddrs>, dataset: impl Into<String>, batch_size: u32) -> Self {
        Self {
            coordinator: coordinator.into(),
            dataset: dataset.into(),
            job_name: None,
            run_id: None,
            batch_size,
            rank: None,
            world_size: None,
            seed: 0,
            shuffle: Shuffle::default(),
            tail: Tail::default(),
            transforms: TransformSpec::imagenet_train(224),
            prefetch: 8,
            batch_timeout: Duration::from_secs(300),
            nack_after: Duration::from_secs(1),
            tls: TlsSource::Local,
            max_buffered_batches: None,
            batch_transport: BatchTransport::Tcp,
        }
    }

    /// Rank and world size, from the fields or from `RANK`/`WORLD_SIZE` (as torchrun sets them).
    pub fn rank_and_world_size(&self) -> Result<(Rank, NonZeroU32), ClientError> {
        let from_env = |name: &str| -> Result<Option<u32>, ClientError> {
            match std::env::var(name) {
                Ok(text) => {
                    text.trim().parse().map(Some).map_err(|_| ClientError::Config { message: format!("{name}={text:?} is not a number") })
                }
                Err(_) => Ok(None),
            }
        };
        let rank = match self.rank {
            Some(rank) => rank,
            None => from_env("RANK")?.unwrap_or(0),
        };
        let world_size = match self.world_size {
            Some(world_size) => world_size,
            None => from_env("WORLD_SIZE")?.unwrap_or(1),
        };
        let world_size =
            NonZeroU32::new(world_size).ok_or_else(|| ClientError::Config { message: "world size must be at least 1".to_owned() })?;
        if rank >= world_size.get() {
            return Err(ClientError::Config { message: format!("rank {rank} is outside world size {world_size} (ranks count from 0)") });
        }
        Ok((Rank(rank), world_size))
    }

    /// [`Self::max_buffered_batches`], or its default.
    pub fn buffered_limit(&self) -> usize {
        self.max_buffered_batches.map_or_else(|| 4 * self.prefetch as usize + 16, |max| max as usize)
    }

    /// The job spec these settings ask for.
    pub fn job_spec(&self) -> Result<JobSpec, ClientError> {
        let (_, world_size) = self.rank_and_world_size()?;
        let batch_size =
            NonZeroU32::new(self.batch_size).ok_or_else(|| ClientError::Config { message: "batch size must be at least 1".to_owned() })?;
        if self.prefetch == 0 {
            return Err(ClientError::Config { message: "prefetch must be at least 1 step".to_owned() });
        }
        if self.max_buffered_batches.is_some_and(|max| max < self.prefetch) {
            return Err(ClientError::Config {
                message: format!(
                    "max_buffered_batches {} is below prefetch {}: the batches of one window would not fit; raise it",
                    self.max_buffered_batches.unwrap_or_default(),
                    self.prefetch
                ),
            });
        }
        if self.nack_after < MIN_NACK_AFTER {
            return Err(ClientError::Config {
                message: format!(
                    "nack_after {:?} is below {MIN_NACK_AFTER:?}: a rank would ask for steps again before a batch in flight could arrive; \
                     use at least {MIN_NACK_AFTER:?} (the default is 1 s)",
                    self.nack_after
                ),
            });
        }
        Recipe::new(&self.transforms).map_err(|error| ClientError::Config { message: error.to_string() })?;
        let transforms = serde_json::to_string(&self.transforms).map_err(|error| ClientError::Config { message: error.to_string() })?;
        let plan = PlanSpec { seed: self.seed, world_size, batch_size, shuffle: self.shuffle, tail: self.tail };
        let mut spec = JobSpec { name: String::new(), dataset: self.dataset.clone(), plan, transforms, prefetch: self.prefetch };
        spec.name = match &self.job_name {
            Some(name) => name.clone(),
            None => {
                let identity = format!("{}|{:?}|{}|{}", spec.dataset, spec.plan, spec.transforms, spec.prefetch);
                let hash = xxhash_rust::xxh3::xxh3_64(identity.as_bytes()) as u32;
                // torchrun says "none" when no --rdzv-id was given: no run id.
                let from_env = || std::env::var("TORCHELASTIC_RUN_ID").ok().filter(|run| run != "none");
                match self.run_id.clone().or_else(from_env).filter(|run| !run.is_empty()) {
                    Some(run) => format!("{}-{hash:08x}-{}", spec.dataset, sanitized(&run)),
                    None => format!("{}-{hash:08x}", spec.dataset),
                }
            }
        };
        Ok(spec)
    }
}

/// `run` with characters other than ASCII letters, digits, `-`, `_` and `.` replaced by `_`,
/// at most 64 of them (a job name shows in `stoker status` and logs).
fn sanitized(run: &str) -> String {
    run.chars().take(64).map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LoaderConfig {
        let mut config = LoaderConfig::new("127.0.0.1:7400".parse::<std::net::SocketAddr>().expect("an address"), "train", 8);
        config.rank = Some(0);
        config.world_size = Some(1);
        config
    }

    #[test]
    fn a_nack_after_too_short_for_a_batch_in_flight_is_refused_with_the_floor() {
        let mut config = config();
        config.nack_after = Duration::from_millis(5);
        let error = config.job_spec().expect_err("5 ms is below the floor").to_string();
        assert!(error.contains("nack_after") && error.contains("50ms"), "{error}");
        config.nack_after = MIN_NACK_AFTER;
        assert!(config.job_spec().is_ok());
    }

    /// Issue 16, item 7: two runs with identical settings shared one job and took each other's
    /// ranks; a run id (torchrun's, by default) names a job of its own.
    #[test]
    fn a_run_id_names_a_job_of_its_own_and_a_job_name_wins() {
        let mut config = config();
        config.run_id = Some("run a".to_owned());
        let first = config.job_spec().expect("spec").name;
        config.run_id = Some("run-b".to_owned());
        let second = config.job_spec().expect("spec").name;
        assert_ne!(first, second);
        assert!(first.ends_with("-run_a"), "{first}");
        config.job_name = Some("mine".to_owned());
        assert_eq!(config.job_spec().expect("spec").name, "mine");
    }
}
