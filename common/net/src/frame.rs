//! Frames (`stoker_proto::wire`) read from and written to QUIC streams: the codec's limits
//! apply before anything is allocated.

use serde::Serialize;
use serde::de::DeserializeOwned;
use stoker_proto::wire::{self, PREFIX_BYTES, WireError};

/// A frame could not be read from or written to a stream.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The frame is too large, cannot be encoded, or is not a valid value.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The stream ended or failed inside a frame.
    #[error("stream failed inside a frame: {source}")]
    Read {
        /// quinn's error.
        #[from]
        source: quinn::ReadExactError,
    },
    /// Writing to the stream failed.
    #[error("cannot write frame: {source}")]
    Write {
        /// quinn's error.
        #[from]
        source: quinn::WriteError,
    },
}

/// Read one frame of at most `limit` bytes from a QUIC stream.
pub async fn read_frame<T>(recv: &mut quinn::RecvStream, limit: usize) -> Result<T, FrameError>
where
    T: DeserializeOwned,
{
    let mut prefix = [0u8; PREFIX_BYTES];
    recv.read_exact(&mut prefix).await?;
    let len = wire::body_len(prefix, limit)?;
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await?;
    Ok(wire::decode_body(&body)?)
}

/// Write `value` as one frame of at most `limit` bytes.
pub async fn write_frame<T>(send: &mut quinn::SendStream, value: &T, limit: usize) -> Result<(), FrameError>
where
    T: Serialize,
{
    let frame = wire::encode(value, limit)?;
    send.write_all(&frame).await?;
    Ok(())
}
