//! Whose session a request may speak for (DESIGN §10): the certificate that attached owns the
//! rank's newest session ([`Owners`]); the worker keys the scheduler keeps do the same for
//! worker ids. Which requests a role may make at all is the coordinator's `authz`.

use std::collections::BTreeMap;

use stoker_plan::ids::{CertKey, JobId, Rank, SessionId};
use stoker_proto::{ErrorCode, RemoteError};

/// The refusal of a request that speaks for what another certificate owns.
pub fn not_yours(what: impl std::fmt::Display, owner: CertKey, caller: CertKey) -> RemoteError {
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
            Some((owned, owner)) if *owned == session && *owner != caller => Err(not_yours(session, *owner, caller)),
            _ => Ok(()),
        }
    }

    /// `caller` owns `session`, the rank's newest.
    pub(crate) fn record(&mut self, job: JobId, rank: Rank, session: SessionId, caller: CertKey) {
        self.sessions.insert((job, rank), (session, caller));
    }

    /// The owner of `session` of (job, rank), if known (`None` admits nobody).
    pub(crate) fn owner(&self, job: JobId, rank: Rank, session: SessionId) -> Option<CertKey> {
        self.sessions.get(&(job, rank)).filter(|(owned, _)| *owned == session).map(|(_, owner)| *owner)
    }

    /// Forget every owner (a new leader's soft state starts empty).
    pub(crate) fn clear(&mut self) {
        self.sessions.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(owners.owner(JobId(1), Rank(0), SessionId(5)), Some(honest));
        assert_eq!(owners.owner(JobId(1), Rank(0), SessionId(6)), None);
        // An unchecked owner (`--insecure`) is no wildcard for a certificate.
        owners.record(JobId(1), Rank(1), SessionId(7), CertKey::UNCHECKED);
        assert!(owners.check(JobId(1), Rank(1), SessionId(7), honest).is_err());
    }
}
