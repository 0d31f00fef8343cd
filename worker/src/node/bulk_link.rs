//! A trainer's bulk connection at this worker (`stoker_common::net::bulk`): batches go out on
//! it one after another, and the trainer answers each in order. One task writes, one reads the
//! answers; a batch is delivered when its answer says so.
//!
//! A batch half-written cannot be taken back from a TCP stream: when one is not answered in
//! time, or either direction fails, the whole connection is closed and every batch on it
//! fails (and is made again, as on QUIC). Batches that never reached the writer are handed
//! back unsent, for QUIC to carry.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use stoker_common::net::DeliveryError;
use stoker_common::net::bulk::{BulkConnection, BulkError, BulkReader, BulkWriter, REPLY_FRAME_LIMIT};
use stoker_common::proto::{BatchHeader, BatchReply};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::debug;

/// Batches queued for the writer at most (a worker's batches in flight are few).
const QUEUE: usize = 64;

/// What became of a batch given to [`BulkLink::send`].
#[derive(Debug)]
pub(crate) enum Sent {
    /// The trainer received it.
    Delivered,
    /// It never reached the connection (closed before): send it another way.
    NotSent,
    /// It failed on the connection (refused, not answered in time, the connection broke).
    Failed(DeliveryError),
}

type Answer = oneshot::Sender<Result<(), DeliveryError>>;

/// Answers owed on one link, in order; `None` once the link closed.
type Owed = Mutex<Option<VecDeque<Answer>>>;

struct Outgoing {
    header: BatchHeader,
    payload: Bytes,
    answer: Answer,
}

/// The worker's end of one trainer's bulk connection.
pub(crate) struct BulkLink {
    queue: mpsc::Sender<Outgoing>,
    /// Answers owed, in the order their batches went out; `None` once closed (under the same
    /// lock, so that no answer is filed or matched after the close failed the others).
    owed: Arc<Owed>,
    open: Arc<AtomicBool>,
    closing: Notify,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    peer: String,
}

impl std::fmt::Debug for BulkLink {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("BulkLink").field("peer", &self.peer).field("open", &self.is_open()).finish()
    }
}

impl BulkLink {
    /// Start sending on `connection` (its hello already answered).
    pub(crate) fn start(connection: BulkConnection) -> Arc<Self> {
        let BulkConnection { reader, writer, addr, .. } = connection;
        let (queue, queued) = mpsc::channel(QUEUE);
        let owed = Arc::new(Mutex::new(Some(VecDeque::new())));
        let open = Arc::new(AtomicBool::new(true));
        let link = Arc::new(Self {
            queue,
            owed: Arc::clone(&owed),
            open: Arc::clone(&open),
            closing: Notify::new(),
            tasks: Mutex::default(),
            peer: addr.to_string(),
        });
        let writing = tokio::spawn(write_loop(writer, queued, Arc::clone(&owed), Arc::downgrade(&link)));
        let reading = tokio::spawn(read_loop(reader, owed, Arc::downgrade(&link)));
        link.tasks.lock().unwrap_or_else(PoisonError::into_inner).extend([writing, reading]);
        link
    }

    /// Whether batches can still go out on it.
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Wait until it is closed.
    pub(crate) async fn closed(&self) {
        loop {
            let closing = self.closing.notified();
            if !self.is_open() {
                return;
            }
            closing.await;
        }
    }

    /// Send one batch and wait (within `timeout`, from now) for the trainer's answer.
    pub(crate) async fn send(&self, header: BatchHeader, payload: Bytes, timeout: Duration) -> Sent {
        if !self.is_open() {
            return Sent::NotSent;
        }
        let (answer, answered) = oneshot::channel();
        let deadline = tokio::time::Instant::now() + timeout;
        match tokio::time::timeout_at(deadline, self.queue.send(Outgoing { header, payload, answer })).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Sent::NotSent,
            Err(_) => {
                self.close("the queue did not move");
                return Sent::Failed(DeliveryError::TimedOut { seconds: timeout.as_secs_f64() });
            }
        }
        match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok(Ok(()))) => Sent::Delivered,
            Ok(Ok(Err(error))) => Sent::Failed(error),
            // The writer dropped it unsent (the connection closed before its turn).
            Ok(Err(_)) => Sent::NotSent,
            Err(_) => {
                self.close("a batch was not answered in time");
                Sent::Failed(DeliveryError::TimedOut { seconds: timeout.as_secs_f64() })
            }
        }
    }

    /// Close the connection: every batch on it fails, every queued one goes back unsent.
    pub(crate) fn close(&self, why: &str) {
        if self.open.swap(false, Ordering::AcqRel) {
            debug!(peer = %self.peer, why, "closing a bulk connection");
        }
        self.closing.notify_waiters();
        for task in self.tasks.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            task.abort();
        }
        fail_owed(&self.owed, &BulkError::Closed);
    }
}

impl Drop for BulkLink {
    fn drop(&mut self) {
        self.close("no longer used");
    }
}

/// Close the book of answers: every batch owed one fails, and none is filed or matched after.
fn fail_owed(owed: &Owed, error: &BulkError) {
    let closed = owed.lock().unwrap_or_else(PoisonError::into_inner).take();
    for answer in closed.into_iter().flatten() {
        let _ = answer.send(Err(DeliveryError::Bulk(BulkError::Protocol(format!("the bulk connection failed: {error}")))));
    }
}

/// Send queued batches one after another; the answer each is owed is filed before its bytes go.
/// (The link holds this task's handle: the task holds only a weak reference to the link.)
async fn write_loop(mut writer: BulkWriter, mut queued: mpsc::Receiver<Outgoing>, owed: Arc<Owed>, link: Weak<BulkLink>) {
    while let Some(Outgoing { header, payload, answer }) = queued.recv().await {
        match owed.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            Some(owed) => owed.push_back(answer),
            // Closed: the batch goes back unsent (its answer is dropped).
            None => return,
        }
        if let Err(error) = writer.send_batch(&header, &payload).await {
            fail_owed(&owed, &error);
            if let Some(link) = link.upgrade() {
                link.close("a batch could not be written");
            }
            return;
        }
    }
}

/// Match the trainer's answers to the batches owed them, in order.
async fn read_loop(mut reader: BulkReader, owed: Arc<Owed>, link: Weak<BulkLink>) {
    let error = loop {
        let reply = match reader.read_frame::<BatchReply>(REPLY_FRAME_LIMIT).await {
            Ok(reply) => reply,
            Err(error) => break error,
        };
        let answer = match owed.lock().unwrap_or_else(PoisonError::into_inner).as_mut().map(VecDeque::pop_front) {
            Some(Some(answer)) => answer,
            Some(None) => break BulkError::Protocol("the trainer answered a batch it was not sent".to_owned()),
            // Closed meanwhile: every batch owed an answer has failed already.
            None => return,
        };
        let _ = answer.send(match reply {
            BatchReply::Received => Ok(()),
            BatchReply::Refused { reason } => Err(DeliveryError::Declined(reason)),
        });
    };
    fail_owed(&owed, &error);
    if let Some(link) = link.upgrade() {
        link.close("the answers stopped");
    }
}
