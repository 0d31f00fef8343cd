//! Reaching the other coordinators: their addresses (`host:port`, a name looked up) and their
//! own status, for `stoker status`, redirects and the checks at start.

use std::net::SocketAddr;
use std::time::Duration;

use quinn::Endpoint;
use stoker_net::{Role, call, connect_to};
use stoker_proto::wire::CONTROL_FRAME_LIMIT;
use stoker_proto::{ControlRequest, ControlResponse, CoordinatorStatus};

/// How long the leader waits for each other coordinator's status in `stoker status`.
const PEER_STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// `addr` as a socket address if it is one literally (no lookup).
pub(crate) fn resolve_now(addr: &str) -> Option<SocketAddr> {
    addr.parse().ok()
}

/// The socket address of `host:port` (a name is looked up), or `None`.
pub(crate) async fn resolve(addr: &str) -> Option<SocketAddr> {
    if let Ok(parsed) = addr.parse() {
        return Some(parsed);
    }
    tokio::net::lookup_host(addr).await.ok()?.next()
}

/// Ask the coordinator at `addr` for its own status, from `endpoint`; `None` if it does not
/// answer within [`PEER_STATUS_TIMEOUT`].
pub(crate) async fn ask_status(endpoint: &Endpoint, addr: &str) -> Option<CoordinatorStatus> {
    let target = resolve(addr).await?;
    let asked = tokio::time::timeout(PEER_STATUS_TIMEOUT, async {
        let connection = connect_to(endpoint, target, PEER_STATUS_TIMEOUT, Role::Coordinator).await.ok()?;
        let answer = call::<_, ControlResponse>(&connection, &ControlRequest::NodeStatus, CONTROL_FRAME_LIMIT).await.ok();
        connection.close(0u32.into(), b"status");
        match answer? {
            ControlResponse::NodeStatus { node } => Some(node),
            _ => None,
        }
    });
    asked.await.ok().flatten()
}
