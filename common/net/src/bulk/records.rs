//! The TLS 1.3 record layer of a bulk connection (RFC 8446 §5), once rustls has made the
//! handshake and handed over the traffic secrets (`rustls::kernel`, the interface kTLS uses).
//!
//! Why not rustls's own record layer: its reader copies every record twice more than needed
//! (the deframer shifts its buffer, then plaintext goes to a queue and again to the caller);
//! across hosts that made TLS over TCP cost 1.1 CPU-s per GB received, twice QUIC's. Here a
//! record is decrypted in place in a fixed buffer and copied once, hot, into the batch, its
//! checksum taken on the way (BENCHMARKS.md, "Delivery across hosts"). rustls's unbuffered API
//! (0.23) is no better here: it decrypts in the caller's buffer but then copies each record into
//! a `Vec` of its own, which the caller copies again (1.34× this layer's receive CPU per GB:
//! BENCHMARKS.md, "Own records against rustls's unbuffered API").
//!
//! What is implemented of TLS 1.3 after the handshake: application data, alerts (RFC 8446 §6:
//! an orderly close sends `close_notify`, and a reader tells it apart from a stream that just
//! ends, which may have been cut; a record that fails authentication or is malformed is
//! answered with a fatal alert by the caller, [`BulkError::alert`]; other alerts end the
//! connection with their description), `KeyUpdate` in both directions
//! (each side renews its sending key well before the cipher's confidentiality limit, and
//! answers a peer's request for an update), and `NewSessionTicket` (ignored: bulk connections
//! never resume). Anything else after the handshake is a protocol error.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;
use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use xxhash_rust::xxh3::Xxh3;

use super::BulkError;

/// Largest plaintext of one record.
pub(crate) const MAX_PLAINTEXT: usize = 1 << 14;
/// Largest encrypted record body a peer may send (RFC 8446 §5.2).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// A record's header: content type, legacy version, length.
const HEADER: usize = 5;
/// The AEAD tag of every cipher suite TLS 1.3 has.
const TAG: usize = 16;
/// Content types (RFC 8446 §5.1).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// Handshake message types that may follow the handshake.
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// Alert descriptions (RFC 8446 §6) this end sends.
pub mod alert {
    /// The orderly end of what a side sends.
    pub const CLOSE_NOTIFY: u8 = 0;
    /// A message not expected at this point.
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    /// A record failed authentication.
    pub const BAD_RECORD_MAC: u8 = 20;
    /// A record longer than TLS allows.
    pub const RECORD_OVERFLOW: u8 = 22;
    /// The peer's certificate is on this end's deny list.
    pub const CERTIFICATE_REVOKED: u8 = 44;
    /// The peer's certificate is valid, but its role may not do this.
    pub const ACCESS_DENIED: u8 = 49;
    /// A message that cannot be parsed.
    pub const DECODE_ERROR: u8 = 50;
}
/// Alert levels.
const WARNING: u8 = 1;
const FATAL: u8 = 2;
/// Bytes the reader holds: many records per read from the socket (small enough to stay in
/// the cache between the socket's copy, decryption and the copy out).
const READ_BUFFER: usize = 256 << 10;
/// Encrypted bytes the writer gathers before it hands them to the socket.
const WRITE_BATCH: usize = 256 << 10;
/// A sending key is renewed after this many records at most (2 GiB at 16 KiB a record), far
/// below every suite's confidentiality limit (AES-GCM: 2^24 records).
const RECORDS_PER_KEY: u64 = 1 << 17;

/// rustls's view of the connection after the handshake: it derives the next traffic secret
/// at a key update. Shared by a connection's reader and writer.
pub(crate) enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    fn next_secret(&mut self, sending: bool) -> Result<ConnectionTrafficSecrets, BulkError> {
        let next = match (self, sending) {
            (Self::Client(kernel), true) => kernel.update_tx_secret(),
            (Self::Client(kernel), false) => kernel.update_rx_secret(),
            (Self::Server(kernel), true) => kernel.update_tx_secret(),
            (Self::Server(kernel), false) => kernel.update_rx_secret(),
        };
        next.map(|(_, secret)| secret).map_err(|error| BulkError::Tls(error.to_string()))
    }

    fn confidentiality_limit(&self) -> u64 {
        let suite = match self {
            Self::Client(kernel) => kernel.negotiated_cipher_suite(),
            Self::Server(kernel) => kernel.negotiated_cipher_suite(),
        };
        suite.tls13().map_or(0, |suite| suite.common.confidentiality_limit)
    }
}

/// What a connection's reader and writer share.
pub(crate) struct Shared {
    kernel: Mutex<Kernel>,
    /// The peer asked for a key update: the writer renews its key before its next record.
    update_requested: AtomicBool,
}

impl Shared {
    pub(crate) fn new(kernel: Kernel) -> Arc<Self> {
        Arc::new(Self { kernel: Mutex::new(kernel), update_requested: AtomicBool::new(false) })
    }

    fn next_secret(&self, sending: bool) -> Result<ConnectionTrafficSecrets, BulkError> {
        self.kernel.lock().next_secret(sending)
    }
}

/// One direction's key, IV and record sequence number.
pub(crate) struct Direction {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl Direction {
    pub(crate) fn new(secrets: ConnectionTrafficSecrets, seq: u64) -> Result<Self, BulkError> {
        let (algorithm, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => return Err(BulkError::Tls("the peer chose a cipher suite bulk connections do not implement".to_owned())),
        };
        let key = UnboundKey::new(algorithm, key.as_ref()).map_err(|_| BulkError::Tls("a traffic key of the wrong length".to_owned()))?;
        let iv = iv.as_ref().try_into().map_err(|_| BulkError::Tls("a traffic IV of the wrong length".to_owned()))?;
        Ok(Self { key: LessSafeKey::new(key), iv, seq })
    }

    /// The next record's nonce: the IV with the sequence number XORed into its last 8 bytes.
    fn nonce(&mut self) -> Result<Nonce, BulkError> {
        let mut nonce = self.iv;
        for (byte, seq) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *byte ^= seq;
        }
        self.seq = self.seq.checked_add(1).ok_or_else(|| BulkError::Tls("record sequence numbers ran out".to_owned()))?;
        Ok(Nonce::assume_unique_for_key(nonce))
    }
}

/// Encrypts what is written into records and sends them.
pub(crate) struct RecordWriter<W> {
    io: W,
    tx: Direction,
    shared: Arc<Shared>,
    /// Records sealed and not yet sent.
    out: Vec<u8>,
    /// Records sealed under the current key.
    records: u64,
    /// Records per key, from the suite's confidentiality limit.
    per_key: u64,
    /// A write of sealed records was dropped before it finished (its future cancelled): part
    /// of them may be on the wire, so nothing more may be sent.
    broken: bool,
}

impl<W> RecordWriter<W>
where
    W: AsyncWrite + Unpin,
{
    pub(crate) fn new(io: W, tx: Direction, shared: Arc<Shared>) -> Self {
        let limit = shared.kernel.lock().confidentiality_limit();
        let per_key = RECORDS_PER_KEY.min(limit / 2).max(1);
        Self { io, tx, shared, out: Vec::with_capacity(WRITE_BATCH + MAX_CIPHERTEXT + HEADER), records: 0, per_key, broken: false }
    }

    /// Renew the sending key after every `records` records (tests: to see key updates).
    #[cfg(test)]
    pub(crate) fn renew_key_every(&mut self, records: u64) {
        self.per_key = records.max(1);
    }

    /// Encrypt `data` as application data; whatever has gathered goes to the socket each
    /// time it passes [`WRITE_BATCH`] (call [`Self::flush`] at the end of a message).
    pub(crate) async fn write(&mut self, mut data: &[u8]) -> Result<(), BulkError> {
        while !data.is_empty() {
            let take = data.len().min(MAX_PLAINTEXT);
            self.seal(APPLICATION_DATA, &data[..take])?;
            data = &data[take..];
            if self.out.len() >= WRITE_BATCH {
                self.send_out().await?;
            }
        }
        Ok(())
    }

    /// Send every record sealed so far.
    pub(crate) async fn flush(&mut self) -> Result<(), BulkError> {
        self.send_out().await?;
        self.io.flush().await.map_err(BulkError::Io)
    }

    /// Seal a `close_notify` alert, send it and shut the sending side down.
    pub(crate) async fn close(&mut self) -> Result<(), BulkError> {
        self.end(alert::CLOSE_NOTIFY).await
    }

    /// Send the alert `description` (`close_notify` as a warning, anything else fatal) after
    /// what is sealed already, and shut the sending side down: nothing may follow it.
    pub(crate) async fn end(&mut self, description: u8) -> Result<(), BulkError> {
        if self.broken {
            return Err(BulkError::Protocol("a write was cut off half-way: no alert can follow it".to_owned()));
        }
        let level = if description == alert::CLOSE_NOTIFY { WARNING } else { FATAL };
        self.seal(ALERT, &[level, description])?;
        self.flush().await?;
        self.io.shutdown().await.map_err(BulkError::Io)
    }

    async fn send_out(&mut self) -> Result<(), BulkError> {
        if !self.out.is_empty() {
            // Set while the bytes go: a write dropped half-way leaves the stream out of step.
            self.broken = true;
            self.io.write_all(&self.out).await.map_err(BulkError::Io)?;
            self.out.clear();
            self.broken = false;
        }
        Ok(())
    }

    /// Append one record of `content_type` holding `data` (at most [`MAX_PLAINTEXT`]) to
    /// `out`, renewing the key first when it is due or the peer asked.
    fn seal(&mut self, content_type: u8, data: &[u8]) -> Result<(), BulkError> {
        if content_type == APPLICATION_DATA && (self.records >= self.per_key || self.shared.update_requested.swap(false, Ordering::AcqRel))
        {
            // KeyUpdate(update_not_requested), under the old key; then the new one.
            self.seal(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0])?;
            self.tx = Direction::new(self.shared.next_secret(true)?, 0)?;
            self.records = 0;
        }
        let start = self.out.len();
        let len = data.len() + 1 + TAG;
        self.out.extend_from_slice(&[APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8]);
        self.out.extend_from_slice(data);
        self.out.push(content_type);
        let header: [u8; HEADER] = [APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
        let nonce = self.tx.nonce()?;
        let tag = self
            .tx
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut self.out[start + HEADER..])
            .map_err(|_| BulkError::Tls("encryption failed".to_owned()))?;
        self.out.extend_from_slice(tag.as_ref());
        self.records += 1;
        Ok(())
    }
}

/// Reads records from the socket and hands out their plaintext.
///
/// Two ways: small reads (frames) decrypt records in the reader's own buffer and copy out of
/// it; a large read (a payload) has the socket write the records straight into the caller's
/// buffer, where each is decrypted onto the end of the plaintext before it, in one pass
/// (`open_within`): no copy but the kernel's.
pub(crate) struct RecordReader<R> {
    io: R,
    rx: Direction,
    shared: Arc<Shared>,
    buf: Box<[u8]>,
    /// Bytes of `buf` read from the socket.
    filled: usize,
    /// Where the next record not yet decrypted starts.
    next: usize,
    /// The plaintext of the current record not yet handed out.
    plain: Range<usize>,
    /// Plaintext that arrived with the handshake (rustls decrypted it), handed out first.
    early: Vec<u8>,
}

/// A read at least this large goes straight into the caller's buffer.
const DIRECT_READ: usize = 256 << 10;

/// A record opened in place: where its application data is (empty for a control record) and
/// where the record ended.
struct Opened {
    content: Range<usize>,
    end: usize,
}

impl<R> RecordReader<R> {
    /// The transport underneath (tests look at its socket options).
    #[cfg(test)]
    pub(crate) fn get_ref(&self) -> &R {
        &self.io
    }
}

impl<R> RecordReader<R>
where
    R: AsyncRead + Unpin,
{
    /// A reader that first hands out `early` plaintext, then decrypts `leftover` (bytes read
    /// from the socket during the handshake that rustls did not consume), then reads on.
    pub(crate) fn new(io: R, rx: Direction, shared: Arc<Shared>, early: Vec<u8>, leftover: &[u8]) -> Result<Self, BulkError> {
        let mut buf = vec![0u8; READ_BUFFER].into_boxed_slice();
        let room = buf.get_mut(..leftover.len()).ok_or_else(|| BulkError::Protocol("the handshake left too much unread".to_owned()))?;
        room.copy_from_slice(leftover);
        Ok(Self { io, rx, shared, buf, filled: leftover.len(), next: 0, plain: 0..0, early })
    }

    /// Fill `out` with the next plaintext, adding it to `hash` if one is given (while it is
    /// in the cache).
    pub(crate) async fn read_exact(&mut self, out: &mut [u8], mut hash: Option<&mut Xxh3>) -> Result<(), BulkError> {
        let mut pos = self.take_buffered(out, 0, hash.as_deref_mut())?;
        if out.len() - pos >= DIRECT_READ {
            pos = self.read_direct(out, pos, hash.as_deref_mut()).await?;
        }
        while pos < out.len() {
            self.next_record().await?;
            pos = self.take_buffered(out, pos, hash.as_deref_mut())?;
        }
        Ok(())
    }

    /// Copy into `out[pos..]` what is decrypted already and what the buffer holds in whole
    /// records; returns the new `pos`.
    fn take_buffered(&mut self, out: &mut [u8], mut pos: usize, mut hash: Option<&mut Xxh3>) -> Result<usize, BulkError> {
        while pos < out.len() {
            let chunk: &[u8] = if !self.early.is_empty() {
                let take = (out.len() - pos).min(self.early.len());
                out[pos..pos + take].copy_from_slice(&self.early[..take]);
                if let Some(hash) = hash.as_deref_mut() {
                    hash.update(&self.early[..take]);
                }
                self.early.drain(..take);
                pos += take;
                continue;
            } else if !self.plain.is_empty() {
                let take = (out.len() - pos).min(self.plain.len());
                let range = self.plain.start..self.plain.start + take;
                self.plain.start += take;
                &self.buf[range]
            } else {
                match open_record(&mut self.rx, &self.shared, &mut self.buf[..self.filled], self.next, self.next + HEADER)? {
                    Some(opened) => {
                        self.next = opened.end;
                        self.plain = opened.content;
                        continue;
                    }
                    None => return Ok(pos),
                }
            };
            if let Some(hash) = hash.as_deref_mut() {
                hash.update(chunk);
            }
            out[pos..pos + chunk.len()].copy_from_slice(chunk);
            pos += chunk.len();
        }
        Ok(pos)
    }

    /// Read records from the socket into `out` itself and open each onto the plaintext
    /// before it, until too little room is left for another; what was read past the last
    /// whole record goes back to the reader's buffer. Returns the new `pos`.
    async fn read_direct(&mut self, out: &mut [u8], mut pos: usize, mut hash: Option<&mut Xxh3>) -> Result<usize, BulkError> {
        // The buffer holds at most a partial record now: it moves to `out` first.
        let held = self.filled - self.next;
        out[pos..pos + held].copy_from_slice(&self.buf[self.next..self.filled]);
        (self.next, self.filled) = (0, 0);
        let (mut record, mut raw_end) = (pos, pos + held);
        loop {
            while let Some(opened) = open_record(&mut self.rx, &self.shared, &mut out[..raw_end], record, pos)? {
                if let Some(hash) = hash.as_deref_mut() {
                    hash.update(&out[opened.content.clone()]);
                }
                pos = opened.content.end;
                record = opened.end;
            }
            if raw_end == out.len() || pos == out.len() {
                break;
            }
            // At most a cache's worth at a time: decrypted while the socket's copy is in it.
            let room = out.len().min(raw_end + READ_BUFFER);
            let read = self.io.read(&mut out[raw_end..room]).await.map_err(BulkError::Io)?;
            if read == 0 {
                return Err(BulkError::Truncated);
            }
            raw_end += read;
        }
        let rest = raw_end - record;
        self.buf[..rest].copy_from_slice(&out[record..raw_end]);
        self.filled = rest;
        Ok(pos)
    }

    /// Read and drop `len` bytes of plaintext (a batch's payload this trainer refused).
    pub(crate) async fn skip(&mut self, mut len: u64) -> Result<(), BulkError> {
        while len > 0 {
            if !self.early.is_empty() {
                let take = usize::try_from(len).unwrap_or(usize::MAX).min(self.early.len());
                self.early.drain(..take);
                len -= take as u64;
            } else if self.plain.is_empty() {
                self.next_record().await?;
            } else {
                let take = usize::try_from(len).unwrap_or(usize::MAX).min(self.plain.len());
                self.plain.start += take;
                len -= take as u64;
            }
        }
        Ok(())
    }

    /// Decrypt the next record carrying application data, acting on the control records
    /// before it, reading from the socket as needed; `plain` is its plaintext.
    async fn next_record(&mut self) -> Result<(), BulkError> {
        loop {
            if let Some(opened) = open_record(&mut self.rx, &self.shared, &mut self.buf[..self.filled], self.next, self.next + HEADER)? {
                self.next = opened.end;
                self.plain = opened.content;
                if !self.plain.is_empty() {
                    return Ok(());
                }
                continue;
            }
            if self.next > 0 && self.buf.len() - self.filled < HEADER + MAX_CIPHERTEXT {
                self.buf.copy_within(self.next..self.filled, 0);
                self.filled -= self.next;
                self.next = 0;
            }
            let read = self.io.read(&mut self.buf[self.filled..]).await.map_err(BulkError::Io)?;
            if read == 0 {
                return Err(BulkError::Truncated);
            }
            self.filled += read;
        }
    }
}

/// Open the record at `buf[record..]` if all of it is in `buf`, its plaintext written from
/// `buf[to..]` (`to` at most the record's body start: in place, or onto the plaintext before
/// it). Control records are acted on: a key update renews `rx` (and asks the writer to renew
/// its key if the peer wants); an alert is the error it stands for. A record this end cannot
/// take is a [`BulkError::BadRecord`] naming the alert to answer it with.
fn open_record(rx: &mut Direction, shared: &Shared, buf: &mut [u8], record: usize, to: usize) -> Result<Option<Opened>, BulkError> {
    let Some(header) = buf.get(record..record + HEADER) else { return Ok(None) };
    if header[0] != APPLICATION_DATA || header[1] != 3 || header[2] != 3 {
        return Err(bad(alert::UNEXPECTED_MESSAGE, format!("not an encrypted TLS 1.3 record (header {:02x?})", &header[..3])));
    }
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len > MAX_CIPHERTEXT {
        return Err(bad(alert::RECORD_OVERFLOW, format!("a record of {len} bytes (TLS allows {} to {MAX_CIPHERTEXT})", TAG + 1)));
    }
    if len < TAG + 1 {
        return Err(bad(alert::DECODE_ERROR, format!("a record of {len} bytes (TLS allows {} to {MAX_CIPHERTEXT})", TAG + 1)));
    }
    let end = record + HEADER + len;
    if end > buf.len() {
        return Ok(None);
    }
    let header: [u8; HEADER] = [APPLICATION_DATA, 3, 3, header[3], header[4]];
    let nonce = rx.nonce()?;
    let inner = rx
        .key
        .open_within(nonce, Aad::from(header), &mut buf[to..end], record + HEADER - to..)
        .map_err(|_| bad(alert::BAD_RECORD_MAC, "a record failed authentication (tampered with, or not from this peer)"))?;
    // The inner plaintext: content, its type, then zero padding.
    let Some(typed) = inner.iter().rposition(|&byte| byte != 0) else {
        return Err(bad(alert::UNEXPECTED_MESSAGE, "a record without a content type"));
    };
    if typed > MAX_PLAINTEXT {
        return Err(bad(alert::RECORD_OVERFLOW, format!("a record of {typed} bytes of plaintext (TLS allows {MAX_PLAINTEXT})")));
    }
    let content = to..to + typed;
    match inner[typed] {
        APPLICATION_DATA => Ok(Some(Opened { content, end })),
        HANDSHAKE => {
            handshake_messages(rx, shared, &inner[..typed])?;
            Ok(Some(Opened { content: to..to, end }))
        }
        ALERT => Err(alert_received(&inner[..typed])),
        other => Err(bad(alert::UNEXPECTED_MESSAGE, format!("a record of content type {other} after the handshake"))),
    }
}

/// A record this end refuses, to be answered with `alert`.
fn bad(alert: u8, reason: impl Into<String>) -> BulkError {
    BulkError::BadRecord { alert, reason: reason.into() }
}

/// Act on post-handshake messages: a key update renews the receiving key (and, if asked, the
/// sending one); session tickets are dropped.
fn handshake_messages(rx: &mut Direction, shared: &Shared, mut messages: &[u8]) -> Result<(), BulkError> {
    while !messages.is_empty() {
        let [kind, a, b, c, rest @ ..] = messages else {
            return Err(bad(alert::DECODE_ERROR, "a truncated handshake message"));
        };
        let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
        let body = rest.get(..len).ok_or_else(|| bad(alert::DECODE_ERROR, "a truncated handshake message"))?;
        match (*kind, body) {
            (KEY_UPDATE, [request]) if *request <= 1 => {
                // Nothing else may share a record with a key update (RFC 8446 §5.1).
                if rest.len() != len {
                    return Err(bad(alert::UNEXPECTED_MESSAGE, "data after a key update in its record"));
                }
                *rx = Direction::new(shared.next_secret(false)?, 0)?;
                if *request == 1 {
                    shared.update_requested.store(true, Ordering::Release);
                }
            }
            (NEW_SESSION_TICKET, _) => {}
            (kind, _) => return Err(bad(alert::UNEXPECTED_MESSAGE, format!("handshake message {kind} after the handshake"))),
        }
        messages = &rest[len..];
    }
    Ok(())
}

/// The error an alert record stands for: `close_notify` is the peer closing in order.
fn alert_received(body: &[u8]) -> BulkError {
    match body {
        [_, alert::CLOSE_NOTIFY] => BulkError::Closed,
        [_, description] => BulkError::Alert(alert_name(*description)),
        _ => bad(alert::DECODE_ERROR, "a malformed alert"),
    }
}

/// An alert's name (RFC 8446 §6), with what it most likely means here.
fn alert_name(description: u8) -> String {
    let name = match description {
        10 => "unexpected_message",
        20 => "bad_record_mac (a record was tampered with on the way)",
        22 => "record_overflow",
        40 => "handshake_failure",
        42 => "bad_certificate (this end's certificate was refused)",
        44 => "certificate_revoked (this end's certificate is on the peer's deny list)",
        45 => "certificate_expired (this end's certificate has expired)",
        46 => "certificate_unknown",
        48 => "unknown_ca (this end's certificate is not of the peer's cluster CA)",
        49 => "access_denied (this end's certificate has a role that may not do this)",
        50 => "decode_error",
        51 => "decrypt_error",
        80 => "internal_error",
        116 => "certificate_required (this end presented no certificate)",
        120 => "no_application_protocol (another protocol version)",
        other => return format!("{other}"),
    };
    format!("{description} {name}")
}
