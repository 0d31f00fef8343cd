//! Who may ask what (DESIGN §10). The role in a peer's certificate decides which requests it
//! may make at all ([`authorize`]); the certificate itself decides whose session or worker id it
//! may speak for (the core's `authz::Owners`, and the worker keys its scheduler keeps). Under `--insecure`
//! every peer is [`PeerIdentity::Unchecked`] and may do everything.

use stoker_net::{PeerIdentity, Role};
use stoker_proto::{ControlRequest, ErrorCode, RemoteError};

/// Refuse `request` if `caller`'s role may not make it.
pub(crate) fn authorize(caller: &PeerIdentity, request: &ControlRequest) -> Result<(), RemoteError> {
    match Role::required_for(request) {
        Some(role) if !caller.is(role) => Err(RemoteError::new(
            ErrorCode::Forbidden,
            format!("{} needs the {role} role; this certificate is {caller}", request_name(request)),
        )),
        _ => Ok(()),
    }
}

fn request_name(request: &ControlRequest) -> &'static str {
    match request {
        ControlRequest::AddDataset { .. } => "adding a dataset",
        ControlRequest::RemoveJob { .. } => "removing a job",
        ControlRequest::AddNode { .. } => "adding a coordinator",
        ControlRequest::RemoveNode { .. } => "removing a coordinator",
        ControlRequest::Attach { .. } => "attaching to a job",
        ControlRequest::OpenEpoch { .. } => "opening an epoch",
        ControlRequest::ReportProgress { .. } => "reporting progress",
        ControlRequest::Detach { .. } => "detaching",
        ControlRequest::RegisterWorker { .. } => "registering a worker",
        ControlRequest::Heartbeat { .. } => "a worker heartbeat",
        ControlRequest::PullChunks { .. } => "pulling chunks",
        ControlRequest::ChunkDone { .. } | ControlRequest::ChunkFailed { .. } | ControlRequest::ChunkFatal { .. } => "reporting a chunk",
        ControlRequest::Deregister { .. } => "deregistering a worker",
        ControlRequest::Raft { .. } => "Raft",
        ControlRequest::ListDatasets | ControlRequest::Status | ControlRequest::NodeStatus => "reading status",
    }
}

#[cfg(test)]
mod tests {
    use stoker_net::Peer;
    use stoker_proto::RaftKind;

    use stoker_plan::ids::{CertKey, JobId, Rank, SessionId};

    use super::*;

    fn certified(role: Role) -> PeerIdentity {
        PeerIdentity::Certified(Peer { role, name: "test".to_owned(), key: CertKey([role as u8 + 1; 32]) })
    }

    #[test]
    fn each_role_is_refused_the_requests_of_the_others() {
        let requests = [
            (ControlRequest::AddDataset { name: "d".to_owned(), manifest: "/m".to_owned() }, Some(Role::Admin)),
            (ControlRequest::PullChunks { worker: stoker_plan::ids::WorkerId(1), max: 1, held: Vec::new() }, Some(Role::Worker)),
            (ControlRequest::Raft { kind: RaftKind::Vote, payload: Vec::new() }, Some(Role::Coordinator)),
            (ControlRequest::Detach { job: JobId(1), rank: Rank(0), session: SessionId(1) }, Some(Role::Trainer)),
            (ControlRequest::Status, None),
        ];
        for (request, needed) in requests {
            assert!(authorize(&PeerIdentity::Unchecked, &request).is_ok());
            for role in Role::ALL {
                let answer = authorize(&certified(role), &request);
                let allowed = needed.is_none_or(|needed| needed == role);
                assert_eq!(answer.is_ok(), allowed, "{role} {request:?}");
                if let Err(error) = answer {
                    assert_eq!(error.code, ErrorCode::Forbidden);
                    assert!(error.message.contains(&format!("needs the {} role", needed.map_or("", |role| role.as_str()))), "{error}");
                }
            }
        }
    }
}
