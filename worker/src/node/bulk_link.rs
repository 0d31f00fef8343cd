//! A trainer's bulk connection at this worker (`stoker_net::bulk`): batches go out on
//! it one after another, and the trainer answers each in order. One task writes, one reads the
//! answers; a batch is delivered when its answer says so.
//!
//! A batch half-written cannot be taken back from a TCP stream: when one that went out is not
//! answered in time, or either direction fails, the whole connection is closed and every batch
//! on it fails (and is made again, as on QUIC). A batch whose time runs out while it still
//! waits its turn is withdrawn alone (the writer skips it), so a backlog on a slow link fails
//! only the batches it held back, not those going out. Batches that never reached the writer
//! when the connection closed are handed back unsent, for QUIC to carry.
//!
//! A close ends what the worker sends with an alert when the writer is between batches:
//! `close_notify` for an orderly close, or the alert a record the reader refused calls for
//! (`bad_record_mac` for one tampered with); mid-batch nothing more can be said on the stream.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use std::time::Duration;

use bytes::Bytes;
use stoker_net::DeliveryError;
use stoker_net::bulk::{self, BulkConnection, BulkError, BulkReader, BulkWriter, REPLY_FRAME_LIMIT};
use stoker_proto::{BatchHeader, BatchReply};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::debug;

/// Batches queued for the writer at most (a worker's batches in flight are few).
const QUEUE: usize = 64;
/// How long the writer tries to send its closing alert to a trainer that may not be reading.
const ALERT_TIMEOUT: Duration = Duration::from_secs(1);

/// What became of a batch given to [`BulkLink::send`].
#[derive(Debug)]
pub(crate) enum Sent {
    /// The trainer received it.
    Delivered,
    /// It never reached the connection (closed before): send it another way.
    Unsent,
    /// It failed on the connection (refused, not answered in time, the connection broke).
    Failed(DeliveryError),
}

type Answer = oneshot::Sender<Result<(), DeliveryError>>;

/// Answers owed on one link, in order; `None` once the link closed.
type Owed = Mutex<Option<VecDeque<Answer>>>;

/// A queued batch waits its turn; then the writer takes it, unless its sender gave up on it first.
const WAITING: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

struct Outgoing {
    header: BatchHeader,
    payload: Bytes,
    answer: Answer,
    /// [`WAITING`], then [`TAKEN`] or [`WITHDRAWN`], whichever side gets there first.
    turn: Arc<AtomicU8>,
}

/// The worker's end of one trainer's bulk connection.
pub(crate) struct BulkLink {
    queue: mpsc::Sender<Outgoing>,
    /// Answers owed, in the order their batches went out; `None` once closed (under the same
    /// lock, so that no answer is filed or matched after the close failed the others).
    owed: Arc<Owed>,
    open: Arc<AtomicBool>,
    closing: Notify,
    /// The alert the writer ends with once the link closes ([`bulk::alert`]).
    ending: watch::Sender<Option<u8>>,
    /// The reader's task (the writer ends itself, within [`ALERT_TIMEOUT`] of the close).
    reading: Mutex<Option<JoinHandle<()>>>,
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
        let (ending, ended) = watch::channel(None);
        let link = Arc::new(Self {
            queue,
            owed: Arc::clone(&owed),
            open: Arc::clone(&open),
            closing: Notify::new(),
            ending,
            reading: Mutex::default(),
            peer: addr.to_string(),
        });
        tokio::spawn(write_loop(writer, queued, Arc::clone(&owed), Arc::downgrade(&link), ended));
        *link.reading.lock() = Some(tokio::spawn(read_loop(reader, owed, Arc::downgrade(&link))));
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
            return Sent::Unsent;
        }
        let (answer, answered) = oneshot::channel();
        let turn = Arc::new(AtomicU8::new(WAITING));
        let deadline = tokio::time::Instant::now() + timeout;
        let outgoing = Outgoing { header, payload, answer, turn: Arc::clone(&turn) };
        match tokio::time::timeout_at(deadline, self.queue.send(outgoing)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Sent::Unsent,
            Err(_) => {
                self.close("the queue did not move");
                return Sent::Failed(DeliveryError::TimedOut { seconds: timeout.as_secs_f64() });
            }
        }
        match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok(Ok(()))) => Sent::Delivered,
            Ok(Ok(Err(error))) => Sent::Failed(error),
            // The writer dropped it unsent (the connection closed before its turn).
            Ok(Err(_)) => Sent::Unsent,
            Err(_) => {
                // Still waiting its turn: withdrawn, it fails alone. Gone out: the connection
                // does not move, and closes.
                if turn.compare_exchange(WAITING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    self.close("a batch was not answered in time");
                }
                Sent::Failed(DeliveryError::TimedOut { seconds: timeout.as_secs_f64() })
            }
        }
    }

    /// Close the connection: every batch on it fails, every queued one goes back unsent, and
    /// the trainer is sent `close_notify`.
    pub(crate) fn close(&self, why: &str) {
        self.close_with(why, bulk::alert::CLOSE_NOTIFY);
    }

    /// [`Self::close`], ending with the alert `description`.
    fn close_with(&self, why: &str, description: u8) {
        if self.open.swap(false, Ordering::AcqRel) {
            debug!(peer = %self.peer, why, description, "closing a bulk connection");
        }
        // The first reason stands.
        self.ending.send_if_modified(|ending| ending.is_none() && ending.replace(description).is_none());
        self.closing.notify_waiters();
        if let Some(task) = self.reading.lock().take() {
            task.abort();
        }
        fail_owed(&self.owed, &BulkError::Protocol(format!("closed by this worker: {why}")));
    }
}

impl Drop for BulkLink {
    fn drop(&mut self) {
        self.close("no longer used");
    }
}

/// Close the book of answers: every batch owed one fails, and none is filed or matched after.
fn fail_owed(owed: &Owed, error: &BulkError) {
    let closed = owed.lock().take();
    for answer in closed.into_iter().flatten() {
        let _ = answer.send(Err(DeliveryError::Bulk(BulkError::Protocol(format!("the bulk connection failed: {error}")))));
    }
}

/// Send queued batches one after another; the answer each is owed is filed before its bytes go.
/// Once the link closes, end with its alert if no batch is half sent. (The task holds only a
/// weak reference to the link, and ends itself.)
async fn write_loop(
    mut writer: BulkWriter,
    mut queued: mpsc::Receiver<Outgoing>,
    owed: Arc<Owed>,
    link: Weak<BulkLink>,
    mut ending: watch::Receiver<Option<u8>>,
) {
    let description = loop {
        let next = tokio::select! {
            biased;
            closed = ending.wait_for(Option::is_some) => break closed.ok().and_then(|ending| *ending),
            next = queued.recv() => next,
        };
        // Every sender gone: the link was dropped (and closed).
        let Some(Outgoing { header, payload, answer, turn }) = next else { break *ending.borrow() };
        // Its sender gave up on it while it waited (and counted it failed): it does not go.
        if turn.compare_exchange(WAITING, TAKEN, Ordering::AcqRel, Ordering::Acquire).is_err() {
            continue;
        }
        match owed.lock().as_mut() {
            Some(owed) => owed.push_back(answer),
            // Closed: the batch goes back unsent (its answer is dropped).
            None => continue,
        }
        let sent = tokio::select! {
            biased;
            // Closed with the batch half sent: nothing more can be said on this stream.
            _ = ending.wait_for(Option::is_some) => return,
            sent = writer.send_batch(&header, &payload) => sent,
        };
        if let Err(error) = sent {
            fail_owed(&owed, &error);
            if let Some(link) = link.upgrade() {
                link.close("a batch could not be written");
            }
            return;
        }
    };
    writer.end(description.unwrap_or(bulk::alert::CLOSE_NOTIFY), ALERT_TIMEOUT).await;
}

/// Match the trainer's answers to the batches owed them, in order.
async fn read_loop(mut reader: BulkReader, owed: Arc<Owed>, link: Weak<BulkLink>) {
    let error = loop {
        let reply = match reader.read_frame::<BatchReply>(REPLY_FRAME_LIMIT).await {
            Ok(reply) => reply,
            Err(error) => break error,
        };
        let answer = match owed.lock().as_mut().map(VecDeque::pop_front) {
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
        link.close_with("the answers stopped", error.alert());
    }
}

#[cfg(test)]
mod tests {
    use stoker_net::bulk::{self, Received};
    use stoker_net::{PayloadPool, TlsConfigs};
    use stoker_plan::ids::Step;
    use tokio::net::TcpListener;

    use super::*;

    fn header(step: u64, payload: &[u8]) -> BatchHeader {
        BatchHeader::opaque(Step(step), payload)
    }

    /// A link at the worker's end of a loopback bulk connection, and the trainer's end.
    async fn linked() -> (Arc<BulkLink>, BulkConnection) {
        let tls = TlsConfigs::insecure().expect("tls");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let addr = listener.local_addr().expect("address");
        let worker_tls = tls.clone();
        let accepted = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.expect("accept");
            bulk::accept(socket, &worker_tls).await.expect("handshake")
        });
        let trainer = bulk::connect(addr, &tls, Duration::from_secs(5)).await.expect("handshake");
        (BulkLink::start(accepted.await.expect("worker")), trainer)
    }

    /// A batch whose time runs out behind a large one that a slow trainer is still taking is
    /// withdrawn alone: the large one is delivered, the link stays open, and the withdrawn one
    /// never goes out (the next batch the trainer reads is the one sent after it).
    #[test]
    fn a_batch_timed_out_in_the_queue_is_withdrawn_and_the_link_goes_on() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        runtime.block_on(async {
            let (link, mut trainer) = linked().await;
            // 64 MiB: far more than the socket buffers hold, so it is still going out while
            // the trainer does not read.
            let large = Bytes::from(vec![1u8; 64 << 20]);
            let small = Bytes::from(vec![2u8; 1024]);
            let (first, second) = {
                let link = Arc::clone(&link);
                let (large_header, small_header) = (header(0, &large), header(1, &small));
                let first = tokio::spawn({
                    let link = Arc::clone(&link);
                    async move { link.send(large_header, large, Duration::from_secs(60)).await }
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
                let second = link.send(small_header, small, Duration::from_millis(300)).await;
                (first, second)
            };
            assert!(matches!(second, Sent::Failed(DeliveryError::TimedOut { .. })), "{second:?}");
            assert!(link.is_open(), "a batch withdrawn from the queue closed the link");
            let third = {
                let link = Arc::clone(&link);
                let small = Bytes::from(vec![3u8; 1024]);
                tokio::spawn(async move { link.send(header(2, &small), small, Duration::from_secs(60)).await })
            };
            let pool = PayloadPool::new(2);
            for expected in [0, 2] {
                match trainer.reader.receive_batch(&pool, |_| Ok(()), 0, Duration::from_secs(30)).await.expect("a batch") {
                    Received::Batch(header, _) => assert_eq!(header.step, Step(expected), "the withdrawn batch went out"),
                    Received::Refused(reason) => panic!("refused: {reason}"),
                }
                trainer.writer.reply(&BatchReply::Received).await.expect("answer");
            }
            assert!(matches!(first.await.expect("first"), Sent::Delivered));
            assert!(matches!(third.await.expect("third"), Sent::Delivered));
        });
    }

    /// A link closed between batches ends with `close_notify`: the trainer tells an orderly
    /// close from a cut connection (which reads as [`BulkError::Truncated`]).
    #[test]
    fn a_closed_link_tells_the_trainer_so_with_close_notify() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        runtime.block_on(async {
            let (link, mut trainer) = linked().await;
            let small = Bytes::from(vec![2u8; 1024]);
            let sent = {
                let link = Arc::clone(&link);
                tokio::spawn(async move { link.send(header(0, &small), small, Duration::from_secs(30)).await })
            };
            let pool = PayloadPool::new(2);
            let received = trainer.reader.receive_batch(&pool, |_| Ok(()), 0, Duration::from_secs(30)).await.expect("a batch");
            assert!(matches!(received, Received::Batch(..)));
            trainer.writer.reply(&BatchReply::Received).await.expect("answer");
            assert!(matches!(sent.await.expect("sent"), Sent::Delivered));
            link.close("the trainer left");
            let after =
                tokio::time::timeout(Duration::from_secs(10), trainer.reader.receive_batch(&pool, |_| Ok(()), 0, Duration::from_secs(30)))
                    .await
                    .expect("the close within 10 s")
                    .expect_err("nothing after the close");
            assert!(matches!(after, BulkError::Closed), "an orderly close, not a cut connection: {after}");
        });
    }
}
