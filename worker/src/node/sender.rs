//! Pushing one batch to its trainer: one unidirectional stream, a header frame, the payload.
//! Delivered means the trainer's QUIC stack acknowledged every byte and the stream's end.

use quinn::Connection;
use stoker_common::proto::BatchHeader;
use stoker_common::wire::{self, BATCH_HEADER_LIMIT};

/// Send `header` and `payload` on a new stream and wait until the peer acknowledged them.
pub(crate) async fn push(connection: &Connection, header: &BatchHeader, payload: &[u8]) -> Result<(), String> {
    let mut send = connection.open_uni().await.map_err(|error| format!("cannot open a stream: {error}"))?;
    wire::write_frame(&mut send, header, BATCH_HEADER_LIMIT).await.map_err(|error| error.to_string())?;
    send.write_all(payload).await.map_err(|error| format!("cannot send the payload: {error}"))?;
    send.finish().map_err(|error| format!("cannot finish the stream: {error}"))?;
    match send.stopped().await {
        Ok(None) => Ok(()),
        Ok(Some(code)) => Err(format!("the trainer refused the batch (code {code})")),
        Err(error) => Err(format!("delivery not acknowledged: {error}")),
    }
}
