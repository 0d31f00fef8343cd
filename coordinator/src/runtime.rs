//! The coordinator's runtime around its pure core ([`stoker_coordinator_core::Core`]): it owns
//! the lock, records the figures the core returns (lease hold times), reads manifests when the
//! core asks, and drives each request to its answer with a [`Committer`], the one difference
//! between local mode (apply at once: [`crate::local`]) and replicated mode (propose through
//! Raft: [`crate::driver`]).

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;
use stoker_coordinator_core::state::{Applied, ClusterState, Command};
use stoker_coordinator_core::{Core, Event, Figures, IdSource, Outcome, Then};
use stoker_obs::prometheus::Histogram;
use stoker_plan::ids::CertKey;
use stoker_proto::{ClusterStatus, ControlRequest, ControlResponse, ErrorCode, RemoteError};
use stoker_store::{ObjectStores, ObjectUri};
use tracing::warn;

use crate::config::CoordinatorConfig;
use crate::raft::Replica;
use crate::sources::wall_millis;

/// Where committed commands go: the one thing local and replicated mode do differently.
pub trait Committer: Sync {
    /// Make `command` durable where this mode does, and apply it to the core (on every
    /// replica); returns what it did.
    fn commit(&self, command: Command) -> impl Future<Output = Result<Applied, RemoteError>> + Send;

    /// Run `work` (blocking file IO: a manifest read) where this mode runs such work.
    fn blocking<T, F>(&self, work: F) -> impl Future<Output = Result<T, RemoteError>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static;
}

/// The most rounds one request may take: it commits at most twice (create a job, clear its
/// failure) and reads at most one manifest, then answers.
const MAX_ROUNDS: usize = 4;

/// A coordinator's core under its lock, with what the core may not do itself.
pub struct Coordinator {
    core: Mutex<Core>,
    /// Folders manifests must be in (validated: resolved).
    dataset_roots: Vec<PathBuf>,
    /// Clients of object stores, for manifests at `s3://` URIs (confined to `--object-root`).
    stores: Arc<ObjectStores>,
    /// How long leases are held until done, once metrics are on.
    lease_seconds: OnceLock<Histogram>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Coordinator").field("dataset_roots", &self.dataset_roots).finish_non_exhaustive()
    }
}

impl Coordinator {
    /// A coordinator over `state` with a validated `config`, reporting `advertised` as its
    /// address, ids from `ids` and counted ids from `id_base` on, started at `now`.
    pub fn new(
        config: &CoordinatorConfig,
        advertised: String,
        state: ClusterState,
        ids: Box<dyn IdSource>,
        id_base: u64,
        now: Instant,
    ) -> Self {
        let core = Core::new(config.core(), advertised, state, ids, id_base, now);
        let stores = Arc::new(ObjectStores::new(config.store.clone(), config.object_roots.clone()));
        Self { core: Mutex::new(core), dataset_roots: config.dataset_roots.clone(), stores, lease_seconds: OnceLock::new() }
    }

    /// Step the core once, and record the figures it returns.
    pub fn step(&self, event: Event, now: Instant) -> Outcome {
        let outcome = self.core.lock().step(event, now);
        if let Outcome::Reply { lease_held_opt: Some(held), .. } = &outcome
            && let Some(histogram) = self.lease_seconds.get()
        {
            histogram.observe(held.as_secs_f64());
        }
        outcome
    }

    /// Answer one request of `caller`: step the core, commit what it asks through
    /// `committer` and read the manifests it asks for, until it answers. The drive loop of
    /// both modes.
    pub async fn serve<C>(
        &self,
        committer: &C,
        request: ControlRequest,
        caller: CertKey,
        now: Instant,
    ) -> Result<ControlResponse, RemoteError>
    where
        C: Committer,
    {
        let mut event = Event::Request { request, caller };
        for _ in 0..MAX_ROUNDS {
            match self.step(event, now) {
                Outcome::Reply { answer, .. } => return answer,
                Outcome::Commit { command, then } => {
                    committer.commit(command).await?;
                    match then {
                        Then::Again(again) => event = Event::Request { request: again, caller },
                        Then::Reply(answer) => return Ok(answer),
                    }
                }
                Outcome::ReadManifest { name, manifest } if ObjectUri::is_object_uri(&manifest) => {
                    let read = crate::manifests::read_remote(&self.stores, &manifest).await;
                    event = Event::ManifestRead { name, read };
                }
                Outcome::ReadManifest { name, manifest } => {
                    let roots = self.dataset_roots.clone();
                    let read = committer.blocking(move || crate::manifests::read(&roots, &manifest)).await?;
                    event = Event::ManifestRead { name, read };
                }
                Outcome::CommitEach(_) | Outcome::Done => {
                    return Err(RemoteError::new(ErrorCode::Internal, "the coordinator's core gave a request no answer"));
                }
            }
        }
        Err(RemoteError::new(ErrorCode::Internal, "a request kept asking for commits"))
    }

    /// The timer: expire leases, and commit the removal of idle jobs, `extra` (the driver's
    /// own commands) and, if `flush`, the checkpoints recorded since the last flush. A failed
    /// commit is tried again at a later tick.
    pub async fn tick<C>(&self, committer: &C, now: Instant, flush: bool, extra: Vec<Command>)
    where
        C: Committer,
    {
        let mut commands = match self.step(Event::Tick { flush }, now) {
            Outcome::CommitEach(commands) => commands,
            _ => Vec::new(),
        };
        commands.extend(extra);
        self.commit_each(committer, commands, now).await;
    }

    /// Commit the checkpoints recorded since the last flush (local mode: after each request).
    pub async fn flush<C>(&self, committer: &C, now: Instant)
    where
        C: Committer,
    {
        if let Outcome::CommitEach(commands) = self.step(Event::Flush, now) {
            self.commit_each(committer, commands, now).await;
        }
    }

    async fn commit_each<C>(&self, committer: &C, commands: Vec<Command>, now: Instant)
    where
        C: Committer,
    {
        for command in commands {
            if let Err(error) = committer.commit(command.clone()).await {
                warn!(failure = %error.message, "cannot commit; trying again at the next tick");
                self.step(Event::CommitFailed { command }, now);
            }
        }
    }

    /// This node leads in `term` (its soft state starts afresh when the term is new).
    pub fn lead(&self, term: u64, now: Instant) {
        self.step(Event::Lead { term, wall_millis: wall_millis() }, now);
    }

    /// This node no longer leads: its soft state is dropped.
    pub fn follow(&self, now: Instant) {
        self.step(Event::Follow { wall_millis: wall_millis() }, now);
    }

    /// What `stoker status` shows of this coordinator's state.
    pub fn status(&self, now: Instant) -> ClusterStatus {
        self.core.lock().status(now)
    }

    /// Time every lease held until done into `histogram` from now on.
    pub fn observe_leases(&self, histogram: Histogram) {
        let _ = self.lease_seconds.set(histogram);
    }

    /// What the metrics show: the leader's soft state (empty on a follower).
    pub fn figures(&self, now: Instant) -> Figures {
        self.core.lock().figures(now)
    }

    /// Leases expired so far (for metrics and tests).
    pub fn leases_expired(&self) -> u64 {
        self.core.lock().leases_expired()
    }

    /// Chunks workers reported failed so far (for metrics and tests).
    pub fn chunks_failed(&self) -> u64 {
        self.core.lock().chunks_failed()
    }

    /// Coordinator node ids that took part in the cluster.
    pub fn nodes_joined(&self) -> std::collections::BTreeSet<u64> {
        self.core.lock().state().nodes_joined.clone()
    }

    /// A copy of the durable state (for tests and status).
    pub fn state(&self) -> ClusterState {
        self.core.lock().state().clone()
    }
}

impl Replica for Coordinator {
    fn apply(&self, command: Command) -> Applied {
        self.core.lock().apply(command)
    }

    fn snapshot(&self) -> ClusterState {
        self.state()
    }

    fn restore(&self, state: ClusterState) {
        self.core.lock().restore(state);
    }
}
