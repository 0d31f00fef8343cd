//! Who may ask what (DESIGN §10). The role in a peer's certificate decides which requests it
//! may make at all ([`authorize`]); the certificate itself decides whose session or worker id it
//! may speak for ([`Owners`], and the worker keys the scheduler keeps). Under `--insecure`
//! every peer is [`PeerIdentity::Unchecked`] and may do everything.

use std::collections::BTreeMap;

use stoker_net::{PeerIdentity, Role};
use stoker_plan::ids::{CertKey, JobId, Rank, SessionId};
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

/// The refusal of a request that speaks for what another certificate owns.
pub(crate) fn not_yours(what: impl std::fmt::Display, owner: CertKey, caller: CertKey) -> RemoteError {
    RemoteError::new(ErrorCode::Forbidden, format!("{what} belongs to {owner}, and this request was made with {caller}"))
}

/// Which certificate owns each rank's newest session: the one that attached (or, after a
/// coordinator restart, the first to open it again). Soft state, dropped with the seats.
#[derive(Debug, Default)]
pub(crate) struct Owners {
    sessions: BTreeMap<(JobId, Rank), (SessionId, CertKey)>,
}

impl Owners {
    /// Refuse `caller` speaking for `session` of (job, rank) if another certificate owns it.
    pub(crate) fn check(&self, job: JobId, rank: Rank, session: SessionId, caller: CertKey) -> Result<(), RemoteError> {
        match self.sessions.get(&(job, rank)) {
            Some((owned, owner)) if *owned == session && !owner.admits(&caller) => Err(not_yours(session, *owner, caller)),
            _ => Ok(()),
        }
    }

    /// `caller` owns `session`, the rank's newest.
    pub(crate) fn record(&mut self, job: JobId, rank: Rank, session: SessionId, caller: CertKey) {
        self.sessions.insert((job, rank), (session, caller));
    }

    /// The owner of `session` of (job, rank), or [`CertKey::UNCHECKED`] if not known.
    pub(crate) fn owner(&self, job: JobId, rank: Rank, session: SessionId) -> CertKey {
        self.sessions.get(&(job, rank)).filter(|(owned, _)| *owned == session).map_or(CertKey::UNCHECKED, |(_, owner)| *owner)
    }

    /// Forget every owner (a new leader's soft state starts empty).
    pub(crate) fn clear(&mut self) {
        self.sessions.clear();
    }
}

#[cfg(test)]
mod tests {
    use stoker_net::Peer;
    use stoker_proto::RaftKind;

    use super::*;

    fn certified(role: Role) -> PeerIdentity {
        PeerIdentity::Certified(Peer { role, name: "test".to_owned(), key: CertKey([role as u8 + 1; 32]) })
    }

    #[test]
    fn each_role_is_refused_the_requests_of_the_others() {
        let requests = [
            (ControlRequest::AddDataset { name: "d".to_owned(), manifest: "/m".to_owned() }, Some(Role::Admin)),
            (ControlRequest::PullChunks { worker: stoker_plan::ids::WorkerId(1), max: 1 }, Some(Role::Worker)),
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

    #[test]
    fn a_session_is_spoken_for_by_its_owner_only() {
        let (honest, forger) = (CertKey([1; 32]), CertKey([2; 32]));
        let mut owners = Owners::default();
        owners.record(JobId(1), Rank(0), SessionId(5), honest);
        assert!(owners.check(JobId(1), Rank(0), SessionId(5), honest).is_ok());
        let refused = owners.check(JobId(1), Rank(0), SessionId(5), forger).expect_err("another certificate");
        assert_eq!(refused.code, ErrorCode::Forbidden);
        // Another session is the seats' business (superseded or adopted), not the owners'.
        assert!(owners.check(JobId(1), Rank(0), SessionId(6), forger).is_ok());
        assert_eq!(owners.owner(JobId(1), Rank(0), SessionId(5)), honest);
        assert_eq!(owners.owner(JobId(1), Rank(0), SessionId(6)), CertKey::UNCHECKED);
    }
}
