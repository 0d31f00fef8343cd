//! The trainers connected to this worker, by (job, rank). A trainer opens its connection with
//! a [`TrainerHello`]; batches for its rank then go out on that connection. When two trainers of
//! one rank are connected (a forked or restarted trainer while the old one still runs), the
//! newest session is served, as at the coordinator: a hello of an older session than one
//! registered with the same certificate is refused, so the old trainer cannot take the rank's
//! batches back by dialling again.
//!
//! Under mutual TLS a chunk's batches go only to a connection made with the certificate that
//! owns the grant's session (`ChunkGrant::trainer`): a peer with another trainer certificate
//! that claims the rank's session, or a newer one, is kept apart and gets nothing of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use quinn::Connection;
use stoker_net::{PeerIdentity, REQUEST_TIMEOUT, Role, SUPERSEDED_CLOSE_CODE, TlsConfigs};
use stoker_plan::ids::{CertKey, JobId, Rank, SessionId};
use stoker_proto::wire::CONTROL_FRAME_LIMIT;
use stoker_proto::{ErrorCode, RemoteError, TrainerHello};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use super::bulk_link::BulkLink;

/// Connections kept per (job, rank): one per certificate, so that a trainer certificate cannot
/// crowd out another by dialling many times.
const CONNECTIONS_PER_RANK: usize = 4;

/// One trainer connection of a rank.
#[derive(Debug)]
struct Entry {
    session: SessionId,
    key: CertKey,
    connection: Connection,
    /// The same trainer's bulk connection, once it made one.
    bulk: Option<Arc<BulkLink>>,
    /// The trainer said a bulk connection follows: until then (or until this instant passes)
    /// its batches wait for it.
    bulk_expected_until: Option<tokio::time::Instant>,
}

/// How long a trainer's first batches wait for the bulk connection its hello announced
/// (it is made right after the hello: milliseconds); then they go over QUIC.
const BULK_PATIENCE: Duration = Duration::from_secs(2);

/// What [`Trainers::live`] found.
enum Lookup {
    Ready(TrainerLink),
    /// The trainer is connected; its bulk connection is due by then.
    BulkDue(tokio::time::Instant),
    Absent,
}

/// Where a rank's batches go: its QUIC connection, and its bulk connection if it has one.
#[derive(Debug)]
pub(crate) struct TrainerLink {
    pub(crate) connection: Connection,
    pub(crate) bulk: Option<Arc<BulkLink>>,
}

impl Entry {
    fn is_open(&self) -> bool {
        self.connection.close_reason().is_none()
    }

    /// Close its bulk connection (the entry is going); `false`, for `retain`.
    fn close_bulk(&self, why: &str) -> bool {
        if let Some(bulk) = &self.bulk {
            bulk.close(why);
        }
        false
    }
}

/// Entries one trainer certificate may hold over all ranks: hellos name any (job, rank), and
/// the table must not grow without bound for one peer.
const CONNECTIONS_PER_CERTIFICATE: usize = 1024;

/// Ranks whose granted owner is remembered (a bound on the table; past it, it starts afresh).
const GRANTED_OWNERS: usize = 1 << 16;

/// Connections by (job, rank).
#[derive(Debug)]
pub(crate) struct Trainers {
    connections: Mutex<HashMap<(JobId, Rank), Vec<Entry>>>,
    /// The newest session the coordinator granted each rank's chunks to, with its owner's
    /// certificate: a rank's slots are reserved for it (issue 31, item 6). Learnt from grants.
    granted: Mutex<HashMap<(JobId, Rank), (SessionId, CertKey)>>,
    changed: Notify,
    /// For the deny list: a certificate revoked while connected gets no more batches.
    tls: TlsConfigs,
    /// Whether this worker takes bulk connections (`--batch-transport tcp`): if not, a
    /// trainer's announced one is never waited for.
    takes_bulk: bool,
}

impl Trainers {
    /// No trainers yet; `tls` is the worker's (its deny list is asked before every batch).
    pub(crate) fn new(tls: TlsConfigs, takes_bulk: bool) -> Self {
        Self { connections: Mutex::default(), granted: Mutex::default(), changed: Notify::new(), tls, takes_bulk }
    }

    /// The rank's connection; with `patient`, not yet if its announced bulk connection is due.
    fn live(&self, job: JobId, rank: Rank, oldest: SessionId, owner: CertKey, patient: bool) -> Lookup {
        let connections = self.connections.lock();
        let Some(entries) = connections.get(&(job, rank)) else { return Lookup::Absent };
        for entry in entries.iter().filter(|entry| entry.is_open() && self.tls.is_denied(&entry.key)) {
            warn!(key = %entry.key, "closing a trainer connection: its certificate was revoked since it connected");
            entry.connection.close(3u32.into(), b"certificate revoked");
            if let Some(bulk) = &entry.bulk {
                bulk.close("its certificate was revoked");
            }
        }
        let newest = entries
            .iter()
            .filter(|entry| entry.session >= oldest && entry.key == owner && entry.is_open())
            .max_by_key(|entry| entry.session);
        match newest {
            None => Lookup::Absent,
            Some(entry) => match (&entry.bulk, entry.bulk_expected_until) {
                (None, Some(due)) if patient && due > tokio::time::Instant::now() => Lookup::BulkDue(due),
                (bulk, _) => Lookup::Ready(TrainerLink {
                    connection: entry.connection.clone(),
                    bulk: bulk.as_ref().filter(|bulk| bulk.is_open()).cloned(),
                }),
            },
        }
    }

    /// The connection of (job, rank) of session `oldest` or a newer one, made with `owner`'s
    /// certificate, waiting up to `patience` for it. An older trainer still connected (the
    /// parent of a forked trainer, whose child's hello has not arrived yet) would take batches
    /// its successor needs.
    pub(crate) async fn wait_for(
        &self,
        job: JobId,
        rank: Rank,
        oldest: SessionId,
        owner: CertKey,
        patience: Duration,
    ) -> Option<TrainerLink> {
        self.granted_to(job, rank, oldest, owner);
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let changed = self.changed.notified();
            let wake = match self.live(job, rank, oldest, owner, true) {
                Lookup::Ready(link) => return Some(link),
                Lookup::BulkDue(due) => due.min(deadline),
                Lookup::Absent => deadline,
            };
            if tokio::time::timeout_at(wake, changed).await.is_err() && tokio::time::Instant::now() >= deadline {
                // Out of patience: a trainer whose bulk connection is still due takes QUIC.
                return match self.live(job, rank, oldest, owner, false) {
                    Lookup::Ready(link) => Some(link),
                    Lookup::BulkDue(_) | Lookup::Absent => None,
                };
            }
        }
    }

    /// The coordinator granted (job, rank)'s chunks to `session` of `owner`: the rank's slots
    /// are reserved for it from now on.
    fn granted_to(&self, job: JobId, rank: Rank, session: SessionId, owner: CertKey) {
        let mut granted = self.granted.lock();
        if granted.len() >= GRANTED_OWNERS && !granted.contains_key(&(job, rank)) {
            granted.clear();
        }
        let newest = granted.entry((job, rank)).or_insert((session, owner));
        if newest.0 <= session {
            *newest = (session, owner);
        }
    }

    /// Trainer connections still open (closed ones stay listed until a newer trainer of the
    /// rank connects).
    pub(crate) fn open(&self) -> usize {
        let connections = self.connections.lock();
        connections.values().flatten().filter(|entry| entry.is_open()).count()
    }

    /// Bulk connections open now.
    pub(crate) fn bulk_open(&self) -> usize {
        let connections = self.connections.lock();
        connections.values().flatten().filter(|entry| entry.bulk.as_ref().is_some_and(|bulk| bulk.is_open())).count()
    }

    /// Close every bulk connection (see `WorkerHandle::break_bulk_connections`).
    pub(crate) fn close_all_bulk(&self, why: &str) {
        let connections = self.connections.lock();
        for bulk in connections.values().flatten().filter_map(|entry| entry.bulk.as_ref()) {
            bulk.close(why);
        }
    }

    /// Trainers connected now.
    pub(crate) fn count(&self) -> usize {
        self.connections.lock().values().map(Vec::len).sum()
    }

    /// Serve one incoming trainer connection of `peer`: read its hello, answer, and register it.
    pub(crate) async fn accept(&self, connection: Connection, peer: PeerIdentity) {
        let addr = connection.remote_address();
        // Another role is refused in the answer to its hello, not by closing at once: a close
        // right after the handshake could reach the peer as a stateless reset ("reset by
        // peer"), without the reason.
        let trainer = peer.is(Role::Trainer);
        // A peer that sends no hello, or sends it slowly, is cut off.
        let hello_phase = async {
            let (send, mut recv) = connection.accept_bi().await?;
            Ok::<_, quinn::ConnectionError>((send, stoker_net::frame::read_frame::<TrainerHello>(&mut recv, CONTROL_FRAME_LIMIT).await))
        };
        let (mut send, hello) = match tokio::time::timeout(REQUEST_TIMEOUT, hello_phase).await {
            Ok(Ok(phase)) => phase,
            Ok(Err(error)) => {
                debug!(%addr, %error, "trainer connection closed before its hello");
                return;
            }
            Err(_) => {
                warn!(%addr, %peer, "no trainer hello within {REQUEST_TIMEOUT:?}: closing the connection (a slow or stalled sender)");
                connection.close(4u32.into(), b"no hello within the request timeout");
                return;
            }
        };
        let answer: Result<(), RemoteError> = match &hello {
            Ok(_) if !trainer => {
                warn!(%addr, %peer, "refused a connection to the batch port: only trainer certificates may receive batches");
                Err(RemoteError::new(ErrorCode::Forbidden, "only trainers may connect here".to_owned()))
            }
            Ok(hello) => self.register(hello, peer.key(), &connection),
            Err(error) => Err(RemoteError::new(ErrorCode::InvalidArgument, format!("expected a trainer hello: {error}"))),
        };
        let _ = stoker_net::frame::write_frame(&mut send, &answer, CONTROL_FRAME_LIMIT).await;
        let _ = send.finish();
        match (hello, answer) {
            (Ok(hello), Ok(())) => {
                info!(job = %hello.job, rank = %hello.rank, session = %hello.session, %addr, %peer, "trainer connected");
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

    /// Serve `connection` for the hello's (job, rank) unless a newer session of the same
    /// certificate is connected; a session's own new connection (after a connection loss)
    /// replaces its old one.
    fn register(&self, hello: &TrainerHello, key: CertKey, connection: &Connection) -> Result<(), RemoteError> {
        let mut connections = self.connections.lock();
        // Closed connections go, every rank's (their bulk connections with them); and one
        // certificate holds a bounded number.
        connections.retain(|_, entries| {
            entries.retain(|entry| entry.is_open() || entry.close_bulk("its trainer's QUIC connection closed"));
            !entries.is_empty()
        });
        let held = connections.values().flatten().filter(|entry| entry.key == key).count();
        if key != CertKey::UNCHECKED && held >= CONNECTIONS_PER_CERTIFICATE {
            return Err(RemoteError::new(
                ErrorCode::Unavailable,
                format!("this trainer certificate holds {held} connections here already (at most {CONNECTIONS_PER_CERTIFICATE})"),
            ));
        }
        let entries = connections.entry((hello.job, hello.rank)).or_default();
        if let Some(newer) = entries.iter().find(|entry| entry.key == key && entry.session > hello.session && entry.is_open()) {
            return Err(RemoteError::new(
                ErrorCode::Superseded,
                format!(
                    "{} of {} is served to a newer trainer ({}) than this one ({})",
                    hello.rank, hello.job, newer.session, hello.session
                ),
            ));
        }
        for older in entries.iter().filter(|entry| entry.key == key && entry.session < hello.session && entry.is_open()) {
            // A newer trainer of the rank: the old one stops now, not at its next report.
            older.connection.close(SUPERSEDED_CLOSE_CODE.into(), b"a newer trainer attached as this rank");
        }
        entries.retain(|entry| (entry.key != key && entry.is_open()) || entry.close_bulk("replaced by a newer connection of its trainer"));
        // The rank's slots are reserved for the session its chunks were granted to: its
        // trainer takes the place of a connection of another certificate.
        let reserved = self.granted.lock().get(&(hello.job, hello.rank)).is_some_and(|granted| *granted == (hello.session, key));
        if entries.len() >= CONNECTIONS_PER_RANK
            && reserved
            && let Some(squatter) = entries.iter().position(|entry| entry.key != key)
        {
            let squatter = entries.remove(squatter);
            warn!(job = %hello.job, rank = %hello.rank, key = %squatter.key, "a connection of another certificate held the rank's slot of the granted trainer: closing it");
            squatter.connection.close(5u32.into(), b"the rank's slot is reserved for the granted session");
            squatter.close_bulk("its slot went to the granted trainer");
        }
        if entries.len() >= CONNECTIONS_PER_RANK {
            return Err(RemoteError::new(
                ErrorCode::Unavailable,
                format!("{} trainer certificates are connected for {} of {} already", entries.len(), hello.rank, hello.job),
            ));
        }
        let bulk_expected_until = (hello.bulk && self.takes_bulk).then(|| tokio::time::Instant::now() + BULK_PATIENCE);
        entries.push(Entry { session: hello.session, key, connection: connection.clone(), bulk: None, bulk_expected_until });
        Ok(())
    }

    /// Whether a bulk connection of `key` for `hello` may join a QUIC connection here: an open
    /// one of the same (job, rank), session and certificate.
    pub(crate) fn can_attach_bulk(&self, hello: &TrainerHello, key: CertKey) -> Result<(), RemoteError> {
        self.with_entry(hello, key, |_| ())
    }

    /// Join `link` to its trainer's QUIC connection (see [`Self::can_attach_bulk`]), replacing
    /// an earlier bulk connection of it.
    pub(crate) fn attach_bulk(&self, hello: &TrainerHello, key: CertKey, link: &Arc<BulkLink>) -> Result<(), RemoteError> {
        let old = self.with_entry(hello, key, |entry| entry.bulk.replace(Arc::clone(link)))?;
        if let Some(old) = old {
            old.close("the trainer made a new bulk connection");
        }
        self.changed.notify_waiters();
        Ok(())
    }

    fn with_entry<T>(&self, hello: &TrainerHello, key: CertKey, act: impl FnOnce(&mut Entry) -> T) -> Result<T, RemoteError> {
        let mut connections = self.connections.lock();
        let entry = connections
            .get_mut(&(hello.job, hello.rank))
            .and_then(|entries| entries.iter_mut().find(|entry| entry.key == key && entry.session == hello.session && entry.is_open()));
        match entry {
            Some(entry) => Ok(act(entry)),
            None => Err(RemoteError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "no QUIC connection of {} of {} ({}) with this certificate here: a bulk connection joins one",
                    hello.rank, hello.job, hello.session
                ),
            )),
        }
    }

    /// `connection` closed: close its bulk connection too.
    pub(crate) fn closed(&self, connection: &Connection) {
        let connections = self.connections.lock();
        for entry in connections.values().flatten().filter(|entry| entry.connection.stable_id() == connection.stable_id()) {
            if let Some(bulk) = &entry.bulk {
                bulk.close("its trainer's QUIC connection closed");
            }
        }
    }
}
