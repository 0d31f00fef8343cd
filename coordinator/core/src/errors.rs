//! The refusals the core answers with, as wire errors.

use stoker_proto::{ErrorCode, RemoteError};

use crate::scheduler::{Refusal, SeatRefusal};

/// A request that cannot be served as asked.
pub(crate) fn invalid(message: impl Into<String>) -> RemoteError {
    RemoteError::new(ErrorCode::InvalidArgument, message)
}

/// A request about something the coordinator does not know.
pub(crate) fn not_found(message: impl Into<String>) -> RemoteError {
    RemoteError::new(ErrorCode::NotFound, message)
}

/// What the scheduler refused, as the caller is told.
pub(crate) fn refused(refusal: Refusal) -> RemoteError {
    match refusal {
        Refusal::NotYours { worker, owner, caller } => crate::authz::not_yours(worker, owner, caller),
        Refusal::TooManyWorkers { key } => RemoteError::new(
            ErrorCode::Forbidden,
            format!(
                "{key} has {} workers registered, the most one certificate may: give each worker host (or group) its own \
                 certificate (`stoker certs issue --role worker`)",
                crate::scheduler::MAX_WORKERS_PER_CERTIFICATE
            ),
        ),
        Refusal::TooManyRuns { job, open } => {
            let runs: Vec<String> = open.iter().map(|key| format!("{} from {}", key.epoch, key.start)).collect();
            RemoteError::new(
                ErrorCode::Unavailable,
                format!(
                    "{job} has {} epoch runs open ({}), the most a job may have: its ranks are in epochs far apart \
                     (a trainer that skips epochs, or a hostile certificate); asked again until one of them ends",
                    open.len(),
                    runs.join(", ")
                ),
            )
        }
        Refusal::UnknownWorker(worker) => {
            not_found(format!("{worker} is not registered (the coordinator restarted or declared it dead): register again"))
        }
        Refusal::Seat(SeatRefusal::Superseded { job, rank, session }) => RemoteError::new(
            ErrorCode::Superseded,
            format!("another trainer attached as {rank} of {job} since this one ({session}); only the newest is served"),
        ),
        Refusal::Seat(SeatRefusal::Stale { pass, current }) => {
            RemoteError::new(ErrorCode::Stale, format!("{pass} is older than {current}, which this trainer opened since: ignored"))
        }
    }
}
