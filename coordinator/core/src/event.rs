//! What goes into [`crate::Core::step`] and what comes out.

use std::time::Duration;

use stoker_plan::ids::CertKey;
use stoker_proto::{ControlRequest, ControlResponse, DatasetInfo, RemoteError};

use crate::state::Command;

/// Something that happened, for the core to decide on.
#[derive(Debug)]
pub enum Event {
    /// A request of a trainer, worker or admin, made with the certificate `caller` proved (its
    /// role already checked; [`CertKey::UNCHECKED`] under `--insecure`).
    Request {
        /// The request.
        request: ControlRequest,
        /// Its caller's certificate.
        caller: CertKey,
    },
    /// The manifest an [`Outcome::ReadManifest`] asked for, as the driver read it.
    ManifestRead {
        /// The dataset's name.
        name: String,
        /// Its description, or why it cannot be added.
        read: Result<DatasetInfo, RemoteError>,
    },
    /// The timer: expire leases and forget dead workers; find jobs idle for the job TTL and,
    /// if `flush`, the checkpoints recorded since the last flush ([`Outcome::Commit`]s).
    Tick {
        /// Whether to hand out the recorded checkpoints for a commit.
        flush: bool,
    },
    /// Hand out the checkpoints recorded since the last flush, as one command to commit
    /// ([`Outcome::CommitEach`]).
    Flush,
    /// A command the core asked for could not be committed (leadership moved, a timeout).
    CommitFailed {
        /// The command.
        command: Command,
    },
    /// This node leads in `term` (asked at every request and tick; only the first in a term
    /// changes anything): its soft state starts afresh.
    Lead {
        /// The Raft term: the ids this leader hands out (workers, sessions) are drawn from it,
        /// so no two leaders hand out the same id, whatever their clocks say.
        term: u64,
    },
    /// This node no longer leads: its soft state is dropped.
    Follow,
}

/// What the driver does next.
#[derive(Debug)]
pub enum Outcome {
    /// Answer the request.
    Reply {
        /// The answer.
        answer: Result<ControlResponse, RemoteError>,
        /// How long a lease was held until done (a `ChunkDone`), for the driver to record.
        lease_held_opt: Option<Duration>,
        /// Whether the answer may go out only once a flush that started after this step has
        /// committed: a progress report whose job has a checkpoint pending is acknowledged
        /// only when that checkpoint is durable, so that it survives a leadership change.
        after_flush: bool,
    },
    /// Commit `command` (it is valid now), then go on with `then`.
    Commit {
        /// The change.
        command: Command,
        /// What to do once it is committed and applied.
        then: Then,
    },
    /// Read the manifest at `manifest` (a file or the folder holding `manifest.json`) for the
    /// dataset `name`, and step [`Event::ManifestRead`] with what it says.
    ReadManifest {
        /// The dataset's name.
        name: String,
        /// Where its manifest is, as given.
        manifest: String,
    },
    /// Commit each of these, one by one; a failed one is stepped back as
    /// [`Event::CommitFailed`] (the timer's removals of idle jobs, checkpoints).
    CommitEach(Vec<Command>),
    /// Nothing to do.
    Done,
}

/// What follows a commit.
#[derive(Debug)]
pub enum Then {
    /// Step this request again (it now finds the job it created, say). Boxed: an attach holds
    /// a whole job spec, and `Outcome` stays small for the answers that are most of its uses.
    Again(Box<ControlRequest>),
    /// Answer this.
    Reply(ControlResponse),
}

impl Outcome {
    /// An answer with no figures.
    pub fn reply(answer: Result<ControlResponse, RemoteError>) -> Self {
        Self::Reply { answer, lease_held_opt: None, after_flush: false }
    }
}
