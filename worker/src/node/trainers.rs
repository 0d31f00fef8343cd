//! The trainers connected to this worker, by (job, rank). A trainer opens its connection with
//! a [`TrainerHello`]; batches for its rank then go out on that connection. When two trainers of
//! one rank are connected (a forked or restarted trainer while the old one still runs), the
//! newest session is served, as at the coordinator: a hello of an older session than the one
//! registered is refused, so the old trainer cannot take the rank's batches back by dialling
//! again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use quinn::Connection;
use stoker_common::ids::{JobId, Rank, SessionId};
use stoker_common::proto::{ErrorCode, RemoteError, TrainerHello};
use stoker_common::wire::{self, CONTROL_FRAME_LIMIT};
use tokio::sync::Notify;
use tracing::{debug, info};

/// Connections by (job, rank), each with the session of its hello.
#[derive(Debug, Default)]
pub(crate) struct Trainers {
    connections: Mutex<HashMap<(JobId, Rank), (SessionId, Connection)>>,
    changed: Notify,
}

impl Trainers {
    fn live(&self, job: JobId, rank: Rank, oldest: SessionId) -> Option<Connection> {
        let connections = self.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        connections
            .get(&(job, rank))
            .filter(|(session, _)| *session >= oldest)
            .map(|(_, connection)| connection)
            .filter(|connection| connection.close_reason().is_none())
            .cloned()
    }

    /// The connection of (job, rank) of session `oldest` or a newer one, waiting up to
    /// `patience` for it. An older trainer still connected (the parent of a forked trainer,
    /// whose child's hello has not arrived yet) would take batches its successor needs.
    pub(crate) async fn wait_for(&self, job: JobId, rank: Rank, oldest: SessionId, patience: Duration) -> Option<Connection> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let changed = self.changed.notified();
            if let Some(connection) = self.live(job, rank, oldest) {
                return Some(connection);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }

    /// Trainer connections still open (closed ones stay listed until a newer trainer of the
    /// rank connects).
    pub(crate) fn open(&self) -> usize {
        let connections = self.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        connections.values().filter(|(_, connection)| connection.close_reason().is_none()).count()
    }

    /// Trainers connected now.
    pub(crate) fn count(&self) -> usize {
        self.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Serve one incoming trainer connection: read its hello, answer, and register it.
    pub(crate) async fn accept(&self, connection: Connection) {
        let addr = connection.remote_address();
        let (mut send, mut recv) = match connection.accept_bi().await {
            Ok(streams) => streams,
            Err(error) => {
                debug!(%addr, %error, "trainer connection closed before its hello");
                return;
            }
        };
        let hello = wire::read_frame::<TrainerHello>(&mut recv, CONTROL_FRAME_LIMIT).await;
        let answer: Result<(), RemoteError> = match &hello {
            Ok(hello) => self.register(hello, &connection),
            Err(error) => Err(RemoteError::new(ErrorCode::InvalidArgument, format!("expected a trainer hello: {error}"))),
        };
        let _ = wire::write_frame(&mut send, &answer, CONTROL_FRAME_LIMIT).await;
        let _ = send.finish();
        match (hello, answer) {
            (Ok(hello), Ok(())) => {
                info!(job = %hello.job, rank = %hello.rank, session = %hello.session, %addr, "trainer connected");
                self.changed.notify_waiters();
            }
            (_, Err(error)) => {
                debug!(%addr, %error, "trainer hello refused");
                // Let the answer reach the peer, then close.
                let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
                connection.close(1u32.into(), b"trainer hello refused");
            }
            (Err(_), Ok(())) => {}
        }
    }

    /// Serve `connection` for the hello's (job, rank) unless a newer session of it is
    /// connected; a session's own new connection (after a connection loss) replaces its old one.
    fn register(&self, hello: &TrainerHello, connection: &Connection) -> Result<(), RemoteError> {
        let mut connections = self.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (hello.job, hello.rank);
        if let Some((newest, current)) = connections.get(&key)
            && *newest > hello.session
            && current.close_reason().is_none()
        {
            return Err(RemoteError::new(
                ErrorCode::Superseded,
                format!("{} of {} is served to a newer trainer ({newest}) than this one ({})", hello.rank, hello.job, hello.session),
            ));
        }
        connections.insert(key, (hello.session, connection.clone()));
        Ok(())
    }
}
