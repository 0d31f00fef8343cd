//! The worker's registration with the coordinator: the id it was given, the timings that came
//! with it, and when the coordinator last answered (what readiness reports).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use stoker_plan::ids::WorkerId;
use stoker_proto::api::CoordinatorApi;
use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, RemoteError};
use tracing::{info, warn};

/// This worker as the coordinator knows it.
#[derive(Debug)]
pub(crate) struct Registration {
    /// Our worker id from the coordinator; 0 while unregistered.
    worker: AtomicU64,
    /// Random for this worker: its registrations replace only its own earlier ones.
    instance: u64,
    /// Registrations asked for so far.
    attempts: AtomicU64,
    heartbeat_millis: AtomicU64,
    /// A job's pipeline counts as stuck after this long without making anything of the work
    /// it holds (half the coordinator's lease stall timeout; see `LeaseLedger::job_stuck`).
    stuck_after_millis: AtomicU64,
    /// When the coordinator last answered a registration or heartbeat (for readiness).
    heard_at: Mutex<Option<Instant>>,
}

impl Registration {
    /// Not registered yet; `instance` tells this worker's registrations from others'.
    pub(crate) fn new(instance: u64) -> Self {
        Self {
            worker: AtomicU64::new(0),
            instance,
            attempts: AtomicU64::new(0),
            heartbeat_millis: AtomicU64::new(500),
            stuck_after_millis: AtomicU64::new(30_000),
            heard_at: Mutex::new(None),
        }
    }

    /// Our id, while registered.
    pub(crate) fn current(&self) -> Option<WorkerId> {
        let id = self.worker.load(Ordering::Acquire);
        (id != 0).then_some(WorkerId(id))
    }

    /// Register as a worker serving trainers at `addr` with `threads` decode threads.
    pub(crate) async fn register<A>(&self, api: &A, addr: SocketAddr, threads: usize) -> Option<WorkerId>
    where
        A: CoordinatorApi,
    {
        let attempt = self.attempts.fetch_add(1, Ordering::AcqRel) + 1;
        let request = ControlRequest::RegisterWorker { addr, threads: threads as u32, instance: self.instance, attempt };
        let answer = api.call(request).await.and_then(|response| {
            expect_response!(response, WorkerRegistered { worker, heartbeat_millis, lease_ttl_millis, lease_stall_millis })
        });
        match answer {
            Ok((worker, heartbeat_millis, lease_ttl_millis, lease_stall_millis)) => {
                self.heartbeat_millis.store(heartbeat_millis.max(10), Ordering::Release);
                self.stuck_after_millis.store((lease_stall_millis / 2).max(10), Ordering::Release);
                self.worker.store(worker.0, Ordering::Release);
                self.heard();
                info!(%worker, heartbeat_millis, lease_ttl_millis, "registered with the coordinator");
                Some(worker)
            }
            Err(error) => {
                warn!(%error, "cannot register with the coordinator; retrying");
                None
            }
        }
    }

    /// The coordinator does not know `worker`: register again, unless the id was already
    /// replaced (an answer to a request sent under an earlier id must not drop the current one).
    pub(crate) fn forgotten(&self, worker: WorkerId, error: &RemoteError) {
        if self.worker.compare_exchange(worker.0, 0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            warn!(%error, "the coordinator forgot this worker; registering again");
        }
    }

    /// The coordinator answered this worker now.
    pub(crate) fn heard(&self) {
        *self.heard_at.lock() = Some(Instant::now());
    }

    /// How often to heartbeat, as the coordinator asked.
    pub(crate) fn heartbeat_period(&self) -> Duration {
        Duration::from_millis(self.heartbeat_millis.load(Ordering::Acquire))
    }

    /// How long a job's pipeline may make nothing of the work it holds before it counts as
    /// stuck.
    pub(crate) fn stuck_after(&self) -> Duration {
        Duration::from_millis(self.stuck_after_millis.load(Ordering::Acquire))
    }

    /// Whether the worker is registered and the coordinator answered it lately (within three
    /// heartbeats, at least 3 s): what readiness and `stoker_worker_registered` say.
    pub(crate) fn linked(&self) -> Result<(), String> {
        if self.current().is_none() {
            return Err("not registered with the coordinator yet".to_owned());
        }
        let within = (3 * self.heartbeat_period()).max(Duration::from_secs(3));
        match *self.heard_at.lock() {
            Some(at) if at.elapsed() <= within => Ok(()),
            _ => Err(format!("the coordinator has not answered for over {within:?}")),
        }
    }
}
