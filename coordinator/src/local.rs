//! Local mode: a coordinator whose commits are applied at once, in memory (tests, the protocol
//! model, and [`CoordinatorApi`] by direct calls for tests of worker and client logic). It runs
//! the same drive loop as a replicated coordinator ([`Coordinator::serve`]), with a committer
//! that applies at once.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use stoker_coordinator_core::state::{Applied, ClusterState, Command};
use stoker_coordinator_core::{Figures, IdSource};
use stoker_plan::ids::CertKey;
use stoker_proto::api::CoordinatorApi;
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, RemoteError};

use crate::config::CoordinatorConfig;
use crate::error::CoordinatorError;
use crate::raft::Replica;
use crate::runtime::{Committer, Coordinator};

/// Commits by applying at once; blocking work runs in place.
#[derive(Clone, Copy, Debug)]
pub struct ApplyAtOnce<'a>(pub &'a Coordinator);

impl Committer for ApplyAtOnce<'_> {
    async fn commit(&self, command: Command) -> Result<Applied, RemoteError> {
        Ok(self.0.apply(command))
    }

    async fn blocking<T, F>(&self, work: F) -> Result<T, RemoteError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        Ok(work())
    }
}

/// The output of `future` if it completes without waiting (a drive loop over a committer that
/// never waits, such as [`ApplyAtOnce`]); `None` if it would wait.
pub fn ready<F: Future>(future: F) -> Option<F::Output> {
    let mut context = Context::from_waker(Waker::noop());
    match std::pin::pin!(future).poll(&mut context) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

fn would_wait() -> RemoteError {
    RemoteError::new(ErrorCode::Internal, "a local coordinator's request waited on something")
}

/// A coordinator in memory: every commit applied at once, checkpoints committed after each
/// request.
#[derive(Clone, Debug)]
pub struct LocalCoordinator {
    coordinator: Arc<Coordinator>,
}

impl LocalCoordinator {
    /// A coordinator over `state`, with ids from `ids` and counted ids from `id_base` on,
    /// started at `now` (the protocol model drives it with a simulated clock, and "restarts"
    /// it by building a new one from the old one's durable state).
    pub fn new(
        config: CoordinatorConfig,
        state: ClusterState,
        ids: Box<dyn IdSource>,
        id_base: u64,
        now: Instant,
    ) -> Result<Self, CoordinatorError> {
        let config = config.validate()?;
        Ok(Self { coordinator: Arc::new(Coordinator::new(&config, "in-memory".to_owned(), state, ids, id_base, now)) })
    }

    /// Answer one request at `now`.
    pub fn handle(&self, request: ControlRequest, now: Instant) -> Result<ControlResponse, RemoteError> {
        self.handle_as(request, CertKey::UNCHECKED, now)
    }

    /// [`LocalCoordinator::handle`] for a peer proving `caller` (its role already checked).
    pub fn handle_as(&self, request: ControlRequest, caller: CertKey, now: Instant) -> Result<ControlResponse, RemoteError> {
        let committer = ApplyAtOnce(&self.coordinator);
        let answer = ready(self.coordinator.serve(&committer, request, caller, now)).unwrap_or_else(|| Err(would_wait()));
        // Local mode has no timer to flush checkpoints: they are committed at once.
        ready(self.coordinator.flush(&committer, now));
        answer
    }

    /// The timer: expire leases, remove jobs idle for the job TTL.
    pub fn tick(&self, now: Instant) {
        ready(self.coordinator.tick(&ApplyAtOnce(&self.coordinator), now, true, Vec::new()));
    }

    /// This node leads in `term`, as after a fail-over (its soft state starts afresh).
    pub fn lead(&self, term: u64, now: Instant) {
        self.coordinator.lead(term, now);
    }

    /// The coordinator behind it.
    pub fn coordinator(&self) -> &Arc<Coordinator> {
        &self.coordinator
    }

    /// A copy of the durable state.
    pub fn state(&self) -> ClusterState {
        self.coordinator.state()
    }

    /// What the metrics show.
    pub fn figures(&self, now: Instant) -> Figures {
        self.coordinator.figures(now)
    }
}

impl CoordinatorApi for LocalCoordinator {
    async fn call(&self, request: ControlRequest) -> Result<ControlResponse, RemoteError> {
        self.handle(request, Instant::now())
    }
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
