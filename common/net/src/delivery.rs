//! One batch over one unidirectional QUIC stream (DESIGN §7): a header frame, then the raw
//! payload. The worker sends with [`send_batch`]; the trainer reads with [`receive_batch`]
//! into a pooled buffer and verifies the checksum. `stoker bench delivery` measures exactly
//! these two functions.

use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, RecvStream};

use super::payload::{Payload, PayloadPool};
use stoker_proto::BatchHeader;
use stoker_proto::wire::{self, BATCH_HEADER_LIMIT};

use crate::frame::{self, FrameError};

/// A batch could not be delivered or was not acceptable.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// No stream could be opened (the connection is gone).
    #[error("cannot open a stream: {0}")]
    Open(#[source] quinn::ConnectionError),
    /// The header frame could not be written or read.
    #[error("batch header: {0}")]
    Header(#[source] FrameError),
    /// The payload could not be written.
    #[error("cannot send the payload: {0}")]
    Write(#[source] quinn::WriteError),
    /// The stream was already finished or reset.
    #[error("cannot finish the stream: {0}")]
    Finish(#[source] quinn::ClosedStream),
    /// The trainer stopped the stream instead of acknowledging it.
    #[error("the trainer refused the batch (code {0})")]
    Refused(quinn::VarInt),
    /// The trainer refused the batch on a bulk connection, saying why.
    #[error("the trainer refused the batch: {0}")]
    Declined(String),
    /// The bulk connection failed while the batch was on it.
    #[error("{0}")]
    Bulk(#[source] super::bulk::BulkError),
    /// The trainer did not acknowledge the whole batch in time (it stopped reading, or the
    /// path is too slow): the stream was reset.
    #[error("the trainer did not acknowledge the batch within {seconds:.0} s")]
    TimedOut {
        /// The timeout.
        seconds: f64,
    },
    /// The connection failed before the trainer acknowledged every byte.
    #[error("delivery not acknowledged: {0}")]
    NotAcknowledged(#[source] quinn::StoppedError),
    /// The header does not describe a batch this trainer accepts.
    #[error("{0}")]
    Unexpected(String),
    /// The stream ended or failed inside the payload.
    #[error("payload: {0}")]
    Payload(#[source] quinn::ReadExactError),
    /// The payload's xxh3 differs from the header's.
    #[error("checksum mismatch for {step} (header {expected:#x}, payload {actual:#x})")]
    Checksum {
        /// The batch's step, for the log.
        step: stoker_plan::ids::Step,
        /// From the header.
        expected: u64,
        /// Of the bytes received.
        actual: u64,
    },
}

/// Send `header` and `payload` on a new stream and wait until the peer acknowledged every
/// byte and the stream's end: delivered means in the trainer's QUIC stack. Gives up after
/// `timeout` (resetting the stream), so a trainer that stops reading cannot hold the sender.
///
/// The payload is handed to quinn as it is, not copied into its send buffer (a copy cost a
/// third of the sender's CPU, and fresh pages for every batch); quinn drops its reference as
/// the bytes are acknowledged, and whatever owns the memory (a worker's pooled batch) is
/// freed with the last reference.
pub async fn send_batch(connection: &Connection, header: &BatchHeader, payload: Bytes, timeout: Duration) -> Result<(), DeliveryError> {
    let timed_out = || DeliveryError::TimedOut { seconds: timeout.as_secs_f64() };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut send = tokio::time::timeout_at(deadline, connection.open_uni()).await.map_err(|_| timed_out())?.map_err(DeliveryError::Open)?;
    let frame = wire::encode(header, BATCH_HEADER_LIMIT).map_err(|error| DeliveryError::Header(error.into()))?;
    let sent = tokio::time::timeout_at(deadline, async {
        send.write_all_chunks(&mut [Bytes::from(frame), payload]).await.map_err(DeliveryError::Write)?;
        send.finish().map_err(DeliveryError::Finish)?;
        match send.stopped().await {
            Ok(None) => Ok(()),
            Ok(Some(code)) => Err(DeliveryError::Refused(code)),
            Err(error) => Err(DeliveryError::NotAcknowledged(error)),
        }
    })
    .await;
    match sent {
        Ok(result) => result,
        Err(_) => {
            let _ = send.reset(0u32.into());
            Err(timed_out())
        }
    }
}

/// Read one batch from `recv`: the header, checked by `check` before any payload memory is
/// taken, then the payload into a buffer from `pool`, verified against the header's checksum.
pub async fn receive_batch<C>(recv: &mut RecvStream, pool: &PayloadPool, check: C) -> Result<(BatchHeader, Payload), DeliveryError>
where
    C: FnOnce(&BatchHeader) -> Result<(), String>,
{
    let header: BatchHeader = frame::read_frame(recv, BATCH_HEADER_LIMIT).await.map_err(DeliveryError::Header)?;
    check(&header).map_err(DeliveryError::Unexpected)?;
    let len = usize::try_from(header.payload_len).map_err(|_| DeliveryError::Unexpected("payload larger than memory".to_owned()))?;
    let mut payload = pool.take(len);
    recv.read_exact(&mut payload).await.map_err(DeliveryError::Payload)?;
    let actual = xxhash_rust::xxh3::xxh3_64(&payload);
    if actual != header.checksum {
        return Err(DeliveryError::Checksum { step: header.step, expected: header.checksum, actual });
    }
    Ok((header, payload))
}
