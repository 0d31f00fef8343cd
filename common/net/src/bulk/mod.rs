//! Bulk connections: batches from a worker to a trainer over TLS 1.3 on TCP, beside the QUIC
//! connection that stays the trainer's identity and control path (ARCHITECTURE.md, "Batch
//! delivery over TCP").
//!
//! Across hosts at a 1500-byte MTU QUIC spends most of its CPU per datagram (27,000 of them
//! for a 38.5 MB batch); TCP hands the kernel 64 KB segments (GSO/GRO) and TLS records are 16
//! KiB. rustls makes the handshake (mutual TLS with the cluster CA, the same verifiers as
//! QUIC); `records` then seals and opens records itself, without rustls's extra copies.
//!
//! On the connection: the trainer sends a [`TrainerHello`](stoker_proto::TrainerHello) and the
//! worker answers `Result<(), RemoteError>`; then the worker sends batches (a header frame,
//! the payload) and the trainer answers each with a [`BatchReply`], in order.

mod handshake;
mod records;

pub use self::records::alert;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use xxhash_rust::xxh3::Xxh3;

use self::records::{Direction, RecordReader, RecordWriter, Shared};
use super::payload::{Payload, PayloadPool};
use super::tls::{PeerIdentity, TlsConfigs, chain_identity};
use stoker_proto::wire::{self, BATCH_HEADER_LIMIT, PREFIX_BYTES, WireError};
use stoker_proto::{BatchHeader, BatchReply};

/// How batches travel from workers to trainers (`--batch-transport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchTransport {
    /// Over a bulk connection (TLS over TCP, same port number as QUIC) where both ends take
    /// one; over QUIC where not, or while it is being made again.
    #[default]
    Tcp,
    /// Over QUIC streams only.
    Quic,
}

impl std::str::FromStr for BatchTransport {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "tcp" => Ok(Self::Tcp),
            "quic" => Ok(Self::Quic),
            other => Err(format!("{other:?} is not a batch transport: tcp (the default) or quic")),
        }
    }
}

impl std::fmt::Display for BatchTransport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Self::Tcp => "tcp",
            Self::Quic => "quic",
        })
    }
}

/// Answers to a trainer's batches are small; this is their frame limit.
pub const REPLY_FRAME_LIMIT: usize = 64 << 10;

/// The trainer's hello and the worker's answer to it are small too: 256 handshakes at once hold
/// at most this much each.
pub const HELLO_FRAME_LIMIT: usize = 64 << 10;

/// TCP keepalive: a peer silent this long is probed, every [`KEEPALIVE_INTERVAL`], and after
/// [`KEEPALIVE_PROBES`] unanswered probes the connection fails (~25 s in all). A trainer waits
/// for batches without a timeout, and a NAT or firewall may drop an idle flow without a word:
/// without probes neither end would learn that its bulk connection is gone (QUIC, which sends
/// its own keep-alives, would go on), and the trainer would never dial a new one.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// See [`KEEPALIVE_IDLE`].
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// See [`KEEPALIVE_IDLE`].
pub const KEEPALIVE_PROBES: u32 = 3;

/// No delay for small frames (headers, answers), and keepalive probes on an idle connection.
fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL).with_retries(KEEPALIVE_PROBES);
    if let Err(error) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::warn!(%error, "cannot turn on TCP keepalive for a bulk connection: a silently dropped one is noticed only when a batch is due");
    }
}

/// A bulk connection failed.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    /// The socket failed.
    #[error("bulk connection: {0}")]
    Io(#[source] std::io::Error),
    /// The TLS handshake or the keys failed (a certificate refused, say).
    #[error("bulk connection TLS: {0}")]
    Tls(String),
    /// The peer broke the protocol (a record that fails authentication, an oversized record,
    /// an unexpected message).
    #[error("bulk connection: {0}")]
    Protocol(String),
    /// A frame could not be made or read.
    #[error("bulk connection: {0}")]
    Wire(#[from] WireError),
    /// A record this end could not take (it failed authentication, or is malformed): the
    /// connection ends, and [`BulkWriter::end`] answers it with `alert` (RFC 8446 §6).
    #[error("bulk connection: {reason}")]
    BadRecord {
        /// The alert description to answer with ([`alert`]).
        alert: u8,
        /// What was wrong.
        reason: String,
    },
    /// The peer ended the connection with an alert other than `close_notify`.
    #[error("bulk connection: the peer sent TLS alert {0}")]
    Alert(String),
    /// The peer closed the connection in order (`close_notify`).
    #[error("bulk connection closed by the peer")]
    Closed,
    /// The stream ended without `close_notify`: the peer died, or the connection was cut (by
    /// the network, or by someone truncating it).
    #[error("bulk connection ended without close_notify (the peer died, or the connection was cut)")]
    Truncated,
    /// Not within the time allowed.
    #[error("bulk connection: no progress within {0:?}")]
    TimedOut(Duration),
}

impl BulkError {
    /// The alert this end answers the error with when it ends the connection: the one a bad
    /// record names, `decode_error` for a frame that does not decode, `unexpected_message` for
    /// one that breaks the protocol, `close_notify` otherwise (an orderly end of what this end
    /// sends).
    pub fn alert(&self) -> u8 {
        match self {
            Self::BadRecord { alert, .. } => *alert,
            Self::Wire(_) => alert::DECODE_ERROR,
            Self::Protocol(_) => alert::UNEXPECTED_MESSAGE,
            _ => alert::CLOSE_NOTIFY,
        }
    }
}

/// A batch received over a bulk connection, or why not.
#[derive(Debug)]
pub enum Received {
    /// Whole and verified.
    Batch(BatchHeader, Payload),
    /// Its header failed the caller's check: its payload was read and dropped (the
    /// connection goes on).
    Refused(String),
}

/// An established bulk connection, split into its two directions.
pub struct BulkConnection {
    /// What the peer sends.
    pub reader: BulkReader,
    /// What we send.
    pub writer: BulkWriter,
    /// Who the peer proved to be.
    pub peer: PeerIdentity,
    /// Its address.
    pub addr: SocketAddr,
}

impl std::fmt::Debug for BulkConnection {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("BulkConnection").field("peer", &self.peer).field("addr", &self.addr).finish()
    }
}

/// Dial `addr` over TCP and make the TLS handshake as a client, within `timeout`.
pub async fn connect(addr: SocketAddr, tls: &TlsConfigs, timeout: Duration) -> Result<BulkConnection, BulkError> {
    let connecting = async {
        let stream = TcpStream::connect(addr).await.map_err(BulkError::Io)?;
        tune(&stream);
        establish(stream, tls, true).await
    };
    tokio::time::timeout(timeout, connecting).await.map_err(|_| BulkError::TimedOut(timeout))?
}

/// Make the TLS handshake as the server on an accepted `stream` (the caller bounds its time).
pub async fn accept(stream: TcpStream, tls: &TlsConfigs) -> Result<BulkConnection, BulkError> {
    tune(&stream);
    establish(stream, tls, false).await
}

async fn establish(mut stream: TcpStream, tls: &TlsConfigs, client: bool) -> Result<BulkConnection, BulkError> {
    let addr = stream.peer_addr().map_err(BulkError::Io)?;
    let established = if client {
        handshake::client(&mut stream, tls.bulk_client(), &tls.bulk_alpn()).await?
    } else {
        handshake::server(&mut stream, tls.bulk_server(), &tls.bulk_alpn()).await?
    };
    let peer = chain_identity(&established.peer_chain, tls.is_checked())
        .ok_or_else(|| BulkError::Tls("the peer's certificate names no Stoker role".to_owned()))?;
    let (tx_seq, tx_secret) = established.secrets.tx;
    let (rx_seq, rx_secret) = established.secrets.rx;
    let shared = Shared::new(established.kernel);
    let (read_half, write_half) = stream.into_split();
    let reader =
        RecordReader::new(read_half, Direction::new(rx_secret, rx_seq)?, shared.clone(), established.early, &established.leftover)?;
    let writer = RecordWriter::new(write_half, Direction::new(tx_secret, tx_seq)?, shared);
    Ok(BulkConnection { reader: BulkReader(reader), writer: BulkWriter(writer), peer, addr })
}

/// The receiving direction of a bulk connection.
pub struct BulkReader(RecordReader<OwnedReadHalf>);

impl BulkReader {
    /// Read one frame of at most `limit` bytes.
    pub async fn read_frame<T>(&mut self, limit: usize) -> Result<T, BulkError>
    where
        T: DeserializeOwned,
    {
        let mut prefix = [0u8; PREFIX_BYTES];
        self.0.read_exact(&mut prefix, None).await?;
        let mut body = vec![0u8; wire::body_len(prefix, limit)?];
        self.0.read_exact(&mut body, None).await?;
        Ok(wire::decode_body(&body)?)
    }

    /// Read one batch: its header (waiting as long as it takes), checked by `check` before any
    /// payload memory is taken, then its payload into a buffer from `pool` within `timeout`,
    /// verified against the header's checksum as it arrives. A header `check` refuses has its
    /// payload read and dropped if it is at most `skip_limit` bytes; a larger one ends the
    /// connection (a peer cannot make this end read without bound).
    pub async fn receive_batch<C>(
        &mut self,
        pool: &PayloadPool,
        check: C,
        skip_limit: u64,
        timeout: Duration,
    ) -> Result<Received, BulkError>
    where
        C: FnOnce(&BatchHeader) -> Result<(), String>,
    {
        let header: BatchHeader = self.read_frame(BATCH_HEADER_LIMIT).await?;
        if let Err(reason) = check(&header) {
            if header.payload_len > skip_limit {
                return Err(BulkError::Protocol(format!("refused a batch header ({reason}) announcing {} bytes", header.payload_len)));
            }
            within(timeout, self.0.skip(header.payload_len)).await?;
            return Ok(Received::Refused(reason));
        }
        let len = usize::try_from(header.payload_len).map_err(|_| BulkError::Protocol("a payload larger than memory".to_owned()))?;
        let mut payload = pool.take(len);
        let mut hash = Xxh3::new();
        within(timeout, self.0.read_exact(&mut payload, Some(&mut hash))).await?;
        let actual = hash.digest();
        if actual != header.checksum {
            // The record layer authenticated every byte: the worker sent what it hashed wrong.
            return Ok(Received::Refused(format!(
                "checksum mismatch for {} (header {:#x}, payload {actual:#x})",
                header.step, header.checksum
            )));
        }
        Ok(Received::Batch(header, payload))
    }
}

/// `read`, unless it takes longer than `timeout`.
async fn within<F>(timeout: Duration, read: F) -> Result<(), BulkError>
where
    F: Future<Output = Result<(), BulkError>>,
{
    tokio::time::timeout(timeout, read).await.map_err(|_| BulkError::TimedOut(timeout))?
}

/// The sending direction of a bulk connection.
pub struct BulkWriter(RecordWriter<OwnedWriteHalf>);

impl BulkWriter {
    /// Send `value` as one frame of at most `limit` bytes, at once.
    pub async fn write_frame<T>(&mut self, value: &T, limit: usize) -> Result<(), BulkError>
    where
        T: Serialize,
    {
        let frame = wire::encode(value, limit)?;
        self.0.write(&frame).await?;
        self.0.flush().await
    }

    /// Send one batch: its header frame, then its payload (exactly `header.payload_len`
    /// bytes, or nothing is sent: a stream out of step would fail every batch after it).
    pub async fn send_batch(&mut self, header: &BatchHeader, payload: &[u8]) -> Result<(), BulkError> {
        if payload.len() as u64 != header.payload_len {
            return Err(BulkError::Protocol(format!("a payload of {} bytes under a header of {}", payload.len(), header.payload_len)));
        }
        let frame = wire::encode(header, BATCH_HEADER_LIMIT)?;
        self.0.write(&frame).await?;
        self.0.write(payload).await?;
        self.0.flush().await
    }

    /// Answer a batch.
    pub async fn reply(&mut self, reply: &BatchReply) -> Result<(), BulkError> {
        self.write_frame(reply, REPLY_FRAME_LIMIT).await
    }

    /// Close cleanly (`close_notify`, then the sending side of the socket).
    pub async fn close(&mut self) -> Result<(), BulkError> {
        self.0.close().await
    }

    /// End what this end sends with the alert `description` ([`alert`]; `close_notify` for an
    /// orderly close, [`BulkError::alert`] for what the reader refused), within `timeout`. Best
    /// effort: a peer that does not read, or a socket already broken, gets nothing, and the
    /// connection is dropped all the same. Only between messages: an alert after half a batch
    /// would be read as the rest of it.
    pub async fn end(&mut self, description: u8, timeout: Duration) {
        match tokio::time::timeout(timeout, self.0.end(description)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, description, "could not send the closing alert"),
            Err(_) => tracing::debug!(description, "the closing alert did not go out in time"),
        }
    }
}
