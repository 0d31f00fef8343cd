//! Receiving batches from one worker: the trainer dials the worker, says which (job, rank) it
//! is, then accepts one unidirectional stream per batch and verifies each before handing it on.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use quinn::{Connection, Endpoint};
use stoker_net::bulk::{self, Received};
use stoker_net::{DeliveryError, NetError, PayloadPool, PeerIdentity, Role, TlsConfigs, call, check_peer, connect, receive_batch};
use stoker_plan::ids::{Epoch, JobId, Position, Rank, SessionId};
use stoker_plan::{EpochPlan, PlanSpec, ShardTable};
use stoker_proto::wire::{BATCH_PAYLOAD_LIMIT, CONTROL_FRAME_LIMIT};
use stoker_proto::{BatchHeader, BatchReply, RemoteError, TrainerHello, WorkerInfo};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::batch::{HeldCount, ReceivedBatch};

/// What a batch for this trainer must look like.
#[derive(Clone, Debug)]
pub(crate) struct Expect {
    pub(crate) job: JobId,
    pub(crate) rank: Rank,
    /// This loader's session (workers serve the newest of a rank).
    pub(crate) session: SessionId,
    /// Largest payload: a full batch of the job's sample size.
    pub(crate) max_payload: u64,
    /// The job's own plans, to check each batch's samples against.
    pub(crate) plans: Arc<PlanBook>,
    /// Batches in memory here, against their limit.
    pub(crate) held: Arc<HeldCount>,
}

/// The job's epoch plans as this trainer computes them, to verify that a batch holds the
/// samples its step must hold: its header's plan digest is compared with this plan's, and
/// its dataset version with the job's. A worker that planned from another manifest (rewritten
/// in place, different on its host) or for another job under a reused id is refused.
#[derive(Debug)]
pub(crate) struct PlanBook {
    table: Arc<ShardTable>,
    spec: PlanSpec,
    dataset_version: u64,
    plans: Mutex<HashMap<(Epoch, Position), Arc<EpochPlan>>>,
}

impl PlanBook {
    pub(crate) fn new(table: Arc<ShardTable>, spec: PlanSpec, dataset_version: u64) -> Self {
        Self { table, spec, dataset_version, plans: Mutex::new(HashMap::new()) }
    }

    /// Whether `header` holds what this trainer's plan puts at its step.
    fn check(&self, header: &BatchHeader) -> Result<(), String> {
        if self.dataset_version != 0 && header.dataset_version != self.dataset_version {
            return Err(format!(
                "batch made from dataset version {:016x}, the job's is {:016x}: the worker read another manifest",
                header.dataset_version, self.dataset_version
            ));
        }
        if header.start.0 > self.table.samples() {
            return Err(format!("batch of a run starting at {} past the epoch's {} samples", header.start, self.table.samples()));
        }
        let plan = {
            let mut plans = self.plans.lock();
            if plans.len() > 8 {
                plans.clear();
            }
            let plan = plans
                .entry((header.epoch, header.start))
                .or_insert_with(|| Arc::new(EpochPlan::starting_at(Arc::clone(&self.table), self.spec, header.epoch, header.start)));
            Arc::clone(plan)
        };
        let planned = plan.layout().batch_len(header.rank, header.step);
        if u64::from(header.shape[0]) != u64::from(planned) {
            return Err(format!("{} holds {} samples, the plan {planned}", header.step, header.shape[0]));
        }
        let digest = plan.batch_digest(header.dataset_version, header.rank, header.step);
        if header.plan_digest != digest {
            return Err(format!("{} of {} holds other samples than this trainer's plan (digest mismatch)", header.step, header.epoch));
        }
        Ok(())
    }
}

/// How long one batch may take to arrive, from its stream's first byte (a worker's delivery
/// timeout is 30 s; a 154 MB f32 batch takes under a second on a 10 Gb/s link).
const BATCH_RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Counters of the receive side.
#[derive(Debug, Default)]
pub(crate) struct ReceiveStats {
    pub(crate) received: AtomicU64,
    pub(crate) rejected: AtomicU64,
}

/// Dial `worker` and introduce ourselves, saying whether a bulk connection follows.
pub(crate) async fn connect_worker(endpoint: &Endpoint, worker: WorkerInfo, expect: &Expect, bulk: bool) -> Result<Connection, NetError> {
    let connection = connect(endpoint, worker.addr, Duration::from_secs(5)).await?;
    // Batches only from the worker the coordinator named: its role and its very certificate.
    check_peer(&connection, Role::Worker, Some(worker.key))?;
    let hello = TrainerHello { job: expect.job, rank: expect.rank, session: expect.session, bulk };
    call::<_, ()>(&connection, &hello, CONTROL_FRAME_LIMIT).await?;
    Ok(connection)
}

/// Accept batch streams on `connection` until it closes.
pub(crate) async fn receive_loop(
    connection: Connection,
    expect: Expect,
    batches_tx: mpsc::UnboundedSender<ReceivedBatch>,
    stats: Arc<ReceiveStats>,
    pool: PayloadPool,
) {
    let addr = connection.remote_address();
    loop {
        let mut recv = match connection.accept_uni().await {
            Ok(recv) => recv,
            Err(error) => {
                debug!(%addr, %error, "worker connection closed");
                return;
            }
        };
        let (batches_tx, stats, pool, expect) = (batches_tx.clone(), Arc::clone(&stats), pool.clone(), expect.clone());
        tokio::spawn(async move {
            let mut held_opt = None;
            let check = |header: &BatchHeader| {
                check_header(header, &expect)?;
                held_opt = Some(expect.held.reserve()?);
                Ok(())
            };
            // A worker that trickles a batch holds its place among the batches in memory no
            // longer than this; the step is made again.
            let received = tokio::time::timeout(BATCH_RECEIVE_TIMEOUT, receive_batch(&mut recv, &pool, check)).await;
            let received =
                received.unwrap_or_else(|_| Err(DeliveryError::Unexpected(format!("not received within {BATCH_RECEIVE_TIMEOUT:?}"))));
            match received {
                Ok((header, payload)) => {
                    stats.received.fetch_add(1, Ordering::AcqRel);
                    let _ = batches_tx.send(ReceivedBatch { header, payload, step_offset: 0, _held: held_opt });
                }
                Err(reason) => {
                    stats.rejected.fetch_add(1, Ordering::AcqRel);
                    warn!(%addr, %reason, "batch rejected");
                    let _ = recv.stop(1u32.into());
                }
            }
        });
    }
}

/// How long a bulk connection waits before it is made again after it failed, at most.
const BULK_RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a trainer waits for a worker to answer its bulk hello.
const BULK_HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a closing alert may take to go out to a worker that may not be reading.
const BULK_ALERT_TIMEOUT: Duration = Duration::from_secs(1);

/// Keep a bulk connection to `worker` while `connection` (its QUIC connection, whose hello
/// was answered) lasts: batches the worker sends on it are received like those on QUIC. When
/// it fails it is made again, waiting longer each time (1 s, doubling to 30 s); the worker
/// sends over QUIC meanwhile.
pub(crate) async fn bulk_loop(
    connection: Connection,
    worker: WorkerInfo,
    tls: TlsConfigs,
    expect: Expect,
    batches_tx: mpsc::UnboundedSender<ReceivedBatch>,
    stats: Arc<ReceiveStats>,
    pool: PayloadPool,
) {
    let mut wait = Duration::from_secs(1);
    let mut told = false;
    loop {
        let outcome = tokio::select! {
            _ = connection.closed() => return,
            outcome = bulk_session(worker, &tls, &expect, &batches_tx, &stats, &pool) => outcome,
        };
        match outcome {
            // It carried batches and then ended: make it again at once.
            Ok((error, batches)) if batches > 0 => {
                debug!(worker = %worker.id, %error, batches, "bulk connection ended");
                wait = Duration::from_secs(1);
                continue;
            }
            // Made, but it ended before any batch: as if it had not been made (a worker that
            // answers and hangs up must not make this trainer dial in a loop).
            Ok((error, _)) | Err(error) => {
                if !told {
                    info!(worker = %worker.id, addr = %worker.addr, %error, "no bulk connection to this worker: its batches come over QUIC");
                    told = true;
                }
            }
        }
        tokio::select! {
            _ = connection.closed() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(BULK_RETRY_MAX);
    }
}

/// Make a bulk connection to `worker` and receive on it until it fails: `Err` when it could
/// not be made, `Ok` with why it ended and how many batches it carried otherwise.
async fn bulk_session(
    worker: WorkerInfo,
    tls: &TlsConfigs,
    expect: &Expect,
    batches_tx: &mpsc::UnboundedSender<ReceivedBatch>,
    stats: &ReceiveStats,
    pool: &PayloadPool,
) -> Result<(String, u64), String> {
    let mut bulk = bulk::connect(worker.addr, tls, Duration::from_secs(5)).await.map_err(|error| error.to_string())?;
    // Batches only from the worker the coordinator named, as on QUIC.
    if let PeerIdentity::Certified(peer) = &bulk.peer
        && (peer.role != Role::Worker || worker.key != peer.key)
    {
        return Err(format!("it presents {peer}, not the worker certificate {} the coordinator named", worker.key));
    }
    let hello = TrainerHello { job: expect.job, rank: expect.rank, session: expect.session, bulk: true };
    let greeting = async {
        bulk.writer.write_frame(&hello, bulk::HELLO_FRAME_LIMIT).await.map_err(|error| error.to_string())?;
        bulk.reader.read_frame::<Result<(), RemoteError>>(bulk::HELLO_FRAME_LIMIT).await.map_err(|error| error.to_string())
    };
    // The worker answers at once (it gives a hello 5 s from accept in all).
    let answer = tokio::time::timeout(BULK_HELLO_TIMEOUT, greeting)
        .await
        .map_err(|_| format!("the worker did not answer the bulk hello within {BULK_HELLO_TIMEOUT:?}"))??;
    answer.map_err(|error| format!("the worker refused the bulk connection: {error}"))?;
    debug!(worker = %worker.id, "bulk connection made");
    let mut batches = 0;
    loop {
        let mut held_opt = None;
        let check = |header: &BatchHeader| {
            check_header(header, expect)?;
            held_opt = Some(expect.held.reserve()?);
            Ok(())
        };
        // Waiting for a batch takes as long as it takes (the QUIC connection's end ends it);
        // one that trickles holds its place no longer than the timeout, and is made again.
        let received = match bulk.reader.receive_batch(pool, check, expect.max_payload, BATCH_RECEIVE_TIMEOUT).await {
            Ok(received) => received,
            Err(error) => {
                // The worker hears why (this end's replies are always whole): `bad_record_mac`
                // for a record tampered with on the way, `close_notify` otherwise.
                bulk.writer.end(error.alert(), BULK_ALERT_TIMEOUT).await;
                return Ok((error.to_string(), batches));
            }
        };
        // A worker revoked since the connection was made gets nothing more taken from it.
        if tls.is_denied(&worker.key) {
            bulk.writer.end(bulk::alert::CERTIFICATE_REVOKED, BULK_ALERT_TIMEOUT).await;
            return Ok(("the worker's certificate is revoked".to_owned(), batches));
        }
        let reply = match received {
            Received::Batch(header, payload) => {
                stats.received.fetch_add(1, Ordering::AcqRel);
                batches += 1;
                let _ = batches_tx.send(ReceivedBatch { header, payload, step_offset: 0, _held: held_opt });
                BatchReply::Received
            }
            Received::Refused(reason) => {
                stats.rejected.fetch_add(1, Ordering::AcqRel);
                warn!(addr = %worker.addr, %reason, "batch rejected");
                BatchReply::Refused { reason }
            }
        };
        if let Err(error) = bulk.writer.reply(&reply).await {
            return Ok((error.to_string(), batches));
        }
    }
}

/// A header is for this trainer, its sizes agree with each other and with the job, and it
/// holds the samples this trainer's plan puts at its step.
fn check_header(header: &BatchHeader, expect: &Expect) -> Result<(), String> {
    if header.job != expect.job || header.rank != expect.rank {
        return Err(format!("batch for {} {} reached {} {}", header.job, header.rank, expect.job, expect.rank));
    }
    // Checked: a product that wraps could match a small payload_len.
    let expected_len = header
        .shape
        .iter()
        .try_fold(header.dtype.size() as u64, |bytes, &dimension| bytes.checked_mul(u64::from(dimension)))
        .unwrap_or(u64::MAX);
    if header.payload_len != expected_len || header.payload_len > expect.max_payload || header.payload_len > BATCH_PAYLOAD_LIMIT {
        return Err(format!(
            "payload of {} bytes does not fit shape {:?} (or exceeds the job's {} bytes)",
            header.payload_len, header.shape, expect.max_payload
        ));
    }
    let samples = header.shape[0] as usize;
    let out_of_range = |indices: &[u32]| indices.iter().any(|&index| index as usize >= samples);
    if header.labels.len() != samples || header.keys.len() != samples || out_of_range(&header.replaced) || out_of_range(&header.corrupt) {
        return Err(format!("labels/keys/replaced/corrupt do not match the {samples} samples of the shape"));
    }
    expect.plans.check(header)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use stoker_plan::ids::{Epoch, Step};
    use stoker_plan::transform::{OutputDtype, OutputLayout};
    use stoker_plan::{Shuffle, Tail};

    use super::*;

    const VERSION: u64 = 77;

    fn plans() -> Arc<PlanBook> {
        let spec = PlanSpec {
            seed: 1,
            world_size: NonZeroU32::MIN,
            batch_size: NonZeroU32::new(2).expect("2"),
            shuffle: Shuffle::Full,
            tail: Tail::Drop,
        };
        let table = Arc::new(ShardTable::new([3, 5]).expect("table"));
        Arc::new(PlanBook::new(table, spec, VERSION))
    }

    fn expect() -> Expect {
        Expect { job: JobId(1), rank: Rank(0), session: SessionId(1), max_payload: 1000, plans: plans(), held: HeldCount::new(4) }
    }

    /// Step 1 of epoch 0 as a worker with the same manifest and plan makes it.
    fn header() -> BatchHeader {
        let book = plans();
        let plan = EpochPlan::new(Arc::clone(&book.table), book.spec, Epoch(0));
        BatchHeader {
            job: JobId(1),
            epoch: Epoch(0),
            start: Position(0),
            rank: Rank(0),
            step: Step(1),
            shape: [2, 4, 4, 3],
            dtype: OutputDtype::U8,
            layout: OutputLayout::Nhwc,
            labels: vec![0, 1],
            keys: vec!["a".into(), "b".into()],
            replaced: vec![],
            corrupt: vec![],
            dataset_version: VERSION,
            plan_digest: plan.batch_digest(VERSION, Rank(0), Step(1)),
            payload_len: 96,
            checksum: 0,
        }
    }

    #[test]
    fn batches_past_the_limit_are_refused_until_one_is_dropped() {
        let count = HeldCount::new(2);
        let (first, _second) = (count.reserve().expect("first"), count.reserve().expect("second"));
        let refusal = count.reserve().expect_err("a third");
        assert!(refusal.contains("max_buffered_batches"), "{refusal}");
        drop(first);
        assert!(count.reserve().is_ok(), "a dropped batch frees its place");
    }

    #[test]
    fn a_consistent_header_passes() {
        assert_eq!(check_header(&header(), &expect()), Ok(()));
    }

    #[test]
    fn inconsistent_headers_are_refused() {
        type Mutation = Box<dyn Fn(&mut BatchHeader)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("other rank", Box::new(|h| h.rank = Rank(1))),
            ("other job", Box::new(|h| h.job = JobId(2))),
            ("length vs shape", Box::new(|h| h.payload_len = 95)),
            (
                "a shape whose product wraps to the length",
                Box::new(|h| {
                    h.shape = [2, 1 << 31, 1 << 31, 1 << 2];
                    h.payload_len = 0;
                }),
            ),
            (
                "over the job's size",
                Box::new(|h| {
                    h.shape = [2, 40, 40, 3];
                    h.payload_len = 9600;
                }),
            ),
            ("missing key", Box::new(|h| h.keys.pop().map(drop).unwrap_or_default())),
            ("replaced out of range", Box::new(|h| h.replaced = vec![2])),
            ("corrupt out of range", Box::new(|h| h.corrupt = vec![5])),
            // Issue 15, item 8: a batch made from another manifest or another plan.
            ("another dataset version", Box::new(|h| h.dataset_version = VERSION + 1)),
            ("another step's samples", Box::new(|h| h.step = Step(2))),
            ("another epoch's samples", Box::new(|h| h.epoch = Epoch(1))),
            ("another run's samples", Box::new(|h| h.start = Position(2))),
            ("a forged digest", Box::new(|h| h.plan_digest ^= 1)),
        ];
        for (name, mutate) in cases {
            let mut bad = header();
            mutate(&mut bad);
            assert!(check_header(&bad, &expect()).is_err(), "{name}");
        }
    }
}
