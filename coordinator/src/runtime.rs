//! The coordinator's runtime around its pure core ([`stoker_coordinator_core::Core`]): it owns
//! the lock, records the figures the core returns (lease hold times), reads manifests when the
//! core asks, and drives each request to its answer with a [`Committer`], the one difference
//! between local mode (apply at once: [`crate::local`]) and replicated mode (propose through
//! Raft: [`crate::driver`]).

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
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

    /// Whether checkpoints are flushed by a timer (replicated mode: an answer that must wait
    /// for a flush waits for the timer's next one), rather than at once (local mode).
    fn flushes_on_timer(&self) -> bool {
        false
    }
}

/// How long an answer waits for the flush that makes its checkpoint durable.
const DURABLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Flushes of checkpoints, as answers waiting for one see them.
#[derive(Clone, Copy, Debug, Default)]
struct Flushes {
    /// Flushes begun (counted before the core hands out what is pending).
    started: u64,
    /// The newest flush whose checkpoints all committed.
    committed: u64,
    /// Times this node stopped leading: what was pending is gone, and so are the waits.
    lost: u64,
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
    /// Flushes, for answers that wait until their checkpoint is durable.
    flushes: tokio::sync::watch::Sender<Flushes>,
    /// An answer waits for a flush: the timer flushes at its next tick.
    flush_wanted: AtomicBool,
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
        Self {
            core: Mutex::new(core),
            dataset_roots: config.dataset_roots.clone(),
            stores,
            lease_seconds: OnceLock::new(),
            flushes: tokio::sync::watch::Sender::new(Flushes::default()),
            flush_wanted: AtomicBool::new(false),
        }
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
                Outcome::Reply { answer, after_flush, .. } => {
                    if after_flush {
                        self.durable(committer, now).await?;
                    }
                    return answer;
                }
                Outcome::Commit { command, then } => {
                    committer.commit(command).await?;
                    match then {
                        Then::Again(again) => event = Event::Request { request: *again, caller },
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

    /// Wait until a flush that begins now has committed the checkpoints recorded so far
    /// (local mode: flush now). Refused if it does not happen within [`DURABLE_WITHIN`] or this
    /// node stops leading meanwhile: the caller sends its report again, to the leader.
    async fn durable<C>(&self, committer: &C, now: Instant) -> Result<(), RemoteError>
    where
        C: Committer,
    {
        if !committer.flushes_on_timer() {
            self.flush(committer, now).await;
            return Ok(());
        }
        let mut flushes_rx = self.flushes.subscribe();
        let asked = *flushes_rx.borrow_and_update();
        self.flush_wanted.store(true, Ordering::Release);
        let waited = tokio::time::timeout(
            DURABLE_WITHIN,
            flushes_rx.wait_for(|flushes| flushes.committed > asked.started || flushes.lost > asked.lost),
        )
        .await;
        match waited {
            Ok(Ok(flushes)) if flushes.committed > asked.started => Ok(()),
            Ok(_) => Err(RemoteError::new(
                ErrorCode::NotLeader { leader_hint: None },
                "this coordinator stopped leading before the progress was committed: report it again to the leader",
            )),
            Err(_) => Err(RemoteError::new(
                ErrorCode::Unavailable,
                format!("the progress was not committed within {DURABLE_WITHIN:?} (no majority?): report it again"),
            )),
        }
    }

    /// Whether an answer waits for a flush (the timer then flushes at its next tick).
    pub fn flush_wanted(&self) -> bool {
        self.flush_wanted.load(Ordering::Acquire)
    }

    /// The timer: expire leases, and commit the removal of idle jobs, `extra` (the driver's
    /// own commands) and, if `flush`, the checkpoints recorded since the last flush. A failed
    /// commit is tried again at a later tick.
    pub async fn tick<C>(&self, committer: &C, now: Instant, flush: bool, extra: Vec<Command>)
    where
        C: Committer,
    {
        let number_opt = flush.then(|| self.begin_flush());
        let mut commands = match self.step(Event::Tick { flush }, now) {
            Outcome::CommitEach(commands) => commands,
            _ => Vec::new(),
        };
        commands.extend(extra);
        let committed = self.commit_each(committer, commands, now).await;
        if let Some(number) = number_opt.filter(|_| committed) {
            self.flush_committed(number);
        }
    }

    /// Commit the checkpoints recorded since the last flush (local mode: after each request).
    pub async fn flush<C>(&self, committer: &C, now: Instant)
    where
        C: Committer,
    {
        let number = self.begin_flush();
        if let Outcome::CommitEach(commands) = self.step(Event::Flush, now)
            && !self.commit_each(committer, commands, now).await
        {
            return;
        }
        self.flush_committed(number);
    }

    /// Count a flush begun, before the core hands out what is pending: an answer that saw
    /// the count before is in this flush or in none before it. Returns its number.
    fn begin_flush(&self) -> u64 {
        self.flush_wanted.store(false, Ordering::Release);
        let mut number = 0;
        self.flushes.send_modify(|flushes| {
            flushes.started += 1;
            number = flushes.started;
        });
        number
    }

    fn flush_committed(&self, number: u64) {
        self.flushes.send_modify(|flushes| flushes.committed = flushes.committed.max(number));
    }

    /// Commit each command; whether every checkpoint among them committed.
    async fn commit_each<C>(&self, committer: &C, commands: Vec<Command>, now: Instant) -> bool
    where
        C: Committer,
    {
        let mut checkpoints_committed = true;
        for command in commands {
            if let Err(error) = committer.commit(command.clone()).await {
                warn!(failure = %error.message, "cannot commit; trying again at the next tick");
                checkpoints_committed &= !matches!(command, Command::RecordCheckpoints { .. });
                self.step(Event::CommitFailed { command }, now);
            }
        }
        checkpoints_committed
    }

    /// This node leads in `term` (its soft state starts afresh when the term is new).
    pub fn lead(&self, term: u64, now: Instant) {
        self.step(Event::Lead { term }, now);
    }

    /// This node no longer leads: its soft state is dropped, and answers waiting for a flush
    /// are refused (what they waited for is gone).
    pub fn follow(&self, now: Instant) {
        self.step(Event::Follow, now);
        if self.flushes.receiver_count() > 0 {
            self.flushes.send_modify(|flushes| flushes.lost += 1);
        }
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
