//! Receiving batches from one worker: the trainer dials the worker, says which (job, rank) it
//! is, then accepts one unidirectional stream per batch and verifies each before handing it on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quinn::{Connection, Endpoint};
use stoker_common::ids::{JobId, Rank, SessionId};
use stoker_common::net::{NetError, PayloadPool, call, connect, receive_batch};
use stoker_common::proto::{BatchHeader, TrainerHello, WorkerInfo};
use stoker_common::wire::{BATCH_PAYLOAD_LIMIT, CONTROL_FRAME_LIMIT};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::batch::ReceivedBatch;

/// What a batch for this trainer must look like.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    pub(crate) job: JobId,
    pub(crate) rank: Rank,
    /// This loader's session (workers serve the newest of a rank).
    pub(crate) session: SessionId,
    /// Largest payload: a full batch of the job's sample size.
    pub(crate) max_payload: u64,
}

/// Counters of the receive side.
#[derive(Debug, Default)]
pub(crate) struct ReceiveStats {
    pub(crate) received: AtomicU64,
    pub(crate) rejected: AtomicU64,
}

/// Dial `worker` and introduce ourselves.
pub(crate) async fn connect_worker(endpoint: &Endpoint, worker: WorkerInfo, expect: Expect) -> Result<Connection, NetError> {
    let connection = connect(endpoint, worker.addr, Duration::from_secs(5)).await?;
    let hello = TrainerHello { job: expect.job, rank: expect.rank, session: expect.session };
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
        let (batches_tx, stats, pool) = (batches_tx.clone(), Arc::clone(&stats), pool.clone());
        tokio::spawn(async move {
            match receive_batch(&mut recv, &pool, |header| check_header(header, expect)).await {
                Ok((header, payload)) => {
                    stats.received.fetch_add(1, Ordering::AcqRel);
                    let _ = batches_tx.send(ReceivedBatch { header, payload });
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

/// A header is for this trainer, and its sizes agree with each other and with the job.
fn check_header(header: &BatchHeader, expect: Expect) -> Result<(), String> {
    if header.job != expect.job || header.rank != expect.rank {
        return Err(format!("batch for {} {} reached {} {}", header.job, header.rank, expect.job, expect.rank));
    }
    let elements: u64 = header.shape.iter().map(|&dimension| u64::from(dimension)).product();
    let expected_len = elements.saturating_mul(header.dtype.size() as u64);
    if header.payload_len != expected_len || header.payload_len > expect.max_payload || header.payload_len > BATCH_PAYLOAD_LIMIT {
        return Err(format!(
            "payload of {} bytes does not fit shape {:?} (or exceeds the job's {} bytes)",
            header.payload_len, header.shape, expect.max_payload
        ));
    }
    let samples = header.shape[0] as usize;
    if header.labels.len() != samples || header.keys.len() != samples || header.replaced.iter().any(|&index| index as usize >= samples) {
        return Err(format!("labels/keys/replaced do not match the {samples} samples of the shape"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use stoker_common::ids::{Epoch, Step};
    use stoker_common::transform::{OutputDtype, OutputLayout};

    use super::*;

    fn header() -> BatchHeader {
        BatchHeader {
            job: JobId(1),
            epoch: Epoch(0),
            start: 0,
            rank: Rank(0),
            step: Step(0),
            shape: [2, 4, 4, 3],
            dtype: OutputDtype::U8,
            layout: OutputLayout::Nhwc,
            labels: vec![0, 1],
            keys: vec!["a".into(), "b".into()],
            replaced: vec![],
            payload_len: 96,
            checksum: 0,
        }
    }

    const EXPECT: Expect = Expect { job: JobId(1), rank: Rank(0), session: SessionId(1), max_payload: 1000 };

    #[test]
    fn a_consistent_header_passes() {
        assert_eq!(check_header(&header(), EXPECT), Ok(()));
    }

    #[test]
    fn inconsistent_headers_are_refused() {
        type Mutation = Box<dyn Fn(&mut BatchHeader)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("other rank", Box::new(|h| h.rank = Rank(1))),
            ("other job", Box::new(|h| h.job = JobId(2))),
            ("length vs shape", Box::new(|h| h.payload_len = 95)),
            (
                "over the job's size",
                Box::new(|h| {
                    h.shape = [2, 40, 40, 3];
                    h.payload_len = 9600;
                }),
            ),
            ("missing key", Box::new(|h| h.keys.pop().map(drop).unwrap_or_default())),
            ("replaced out of range", Box::new(|h| h.replaced = vec![2])),
        ];
        for (name, mutate) in cases {
            let mut bad = header();
            mutate(&mut bad);
            assert!(check_header(&bad, EXPECT).is_err(), "{name}");
        }
    }
}
