//! Who may ask what (DESIGN §10). The role in a peer's certificate decides which requests it
//! may make at all ([`authorize`]); the certificate itself decides whose session or worker id it
//! may speak for (the core's `authz::Owners`, and the worker keys its scheduler keeps), and a
//! coordinator certificate which Raft node it may speak as ([`authorize_raft_sender`]). Under
//! `--insecure` every peer is [`PeerIdentity::Unchecked`] and may do everything.

use std::collections::BTreeSet;

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

/// Refuse a Raft message that says it comes from node `sender` (its vote's leader id: the
/// leader of an append or a snapshot, the candidate of a vote) unless `caller`'s certificate is
/// bound to that node id and, where `members` is not empty (the membership this node knows,
/// given for votes only), the node is a voter or learner of it. A node that knows no membership
/// yet (started with `--join`, waiting to be added) has no state to protect: it takes a sender
/// bound to its own id by its certificate.
pub(crate) fn authorize_raft_sender(caller: &PeerIdentity, sender: u64, members: &BTreeSet<u64>) -> Result<(), RemoteError> {
    let PeerIdentity::Certified(peer) = caller else { return Ok(()) };
    let forbidden = |message: String| Err(RemoteError::new(ErrorCode::Forbidden, message));
    match peer.node_id {
        None => forbidden(format!(
            "a Raft message from node {sender} under a certificate that names no node id ({peer}): reissue it with \
             `stoker certs issue --role coordinator --node-id {sender}`"
        )),
        Some(certified) if certified != sender => forbidden(format!(
            "a Raft message from node {sender} under the certificate of node {certified} ({peer}): a coordinator speaks Raft \
             only as the node its certificate names"
        )),
        Some(_) if !members.is_empty() && !members.contains(&sender) => forbidden(format!(
            "a Raft message from node {sender} (certificate of node {sender}, {peer}), which is not a member or learner of \
             this cluster (members {members:?}): add it with `stoker cluster add-node` first"
        )),
        Some(_) => Ok(()),
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
        PeerIdentity::Certified(Peer { role, name: "test".to_owned(), node_id: None, key: CertKey([role as u8 + 1; 32]) })
    }

    fn coordinator(node_id: Option<u64>) -> PeerIdentity {
        PeerIdentity::Certified(Peer { role: Role::Coordinator, name: "c".to_owned(), node_id, key: CertKey([9; 32]) })
    }

    #[test]
    fn raft_messages_are_taken_only_from_a_member_under_its_own_node_id() {
        let members = BTreeSet::from([1, 2, 3]);
        assert!(authorize_raft_sender(&coordinator(Some(2)), 2, &members).is_ok());
        assert!(authorize_raft_sender(&PeerIdentity::Unchecked, 7, &members).is_ok(), "--insecure checks nothing");
        let refused = |caller: PeerIdentity, sender: u64, members: &BTreeSet<u64>| {
            let error = authorize_raft_sender(&caller, sender, members).expect_err("refused");
            assert_eq!(error.code, ErrorCode::Forbidden);
            error.message
        };
        let message = refused(coordinator(Some(3)), 2, &members);
        assert!(message.contains("from node 2") && message.contains("certificate of node 3"), "{message}");
        let message = refused(coordinator(Some(4)), 4, &members);
        assert!(message.contains("node 4") && message.contains("not a member"), "{message}");
        let message = refused(coordinator(None), 2, &members);
        assert!(message.contains("--node-id 2"), "{message}");
        // A node waiting to be added knows no members: its own id binds the sender still.
        assert!(authorize_raft_sender(&coordinator(Some(4)), 4, &BTreeSet::new()).is_ok());
        refused(coordinator(Some(4)), 1, &BTreeSet::new());
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
