//! rustls's unbuffered API as the record layer (issue 31, item 8: is Stoker's own record layer
//! worth its ~500 lines?). The handshake and then every record go through
//! `Unbuffered{Client,Server}Connection::process_tls_records` over a blocking socket, wrapped
//! in `Read`/`Write` so that the sender and receiver are the same as the other blocking
//! variants'. The buffer handling is what a careful user of the API would write: one socket
//! read fills many records, and the unread tail is moved to the front only when the buffer
//! needs room (not after every record).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::mpsc;

use bytes::Bytes;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, UnbufferedStatus};
use stoker_proto::BatchHeader;

use super::tcp::start_blocking_tls;
use super::{Place, Progress, Sides, TidReport};

/// Bytes read from the socket at once, as the own record layer reads.
const READ_BUFFER: usize = 256 << 10;
/// Plaintext encrypted per call on the sending side.
const WRITE_CHUNK: usize = 256 << 10;

pub(super) fn start_unbuffered(
    header: &BatchHeader,
    payload: &Bytes,
    progress: &Arc<Progress>,
    tids: mpsc::Sender<TidReport>,
    place: &Arc<Place>,
) -> anyhow::Result<Sides> {
    let server = |config, socket| Unbuffered::handshake(UnbufferedServerConnection::new(config)?, socket);
    let client = |config, socket, name| Unbuffered::handshake(UnbufferedClientConnection::new(config, name)?, socket);
    start_blocking_tls(header, payload, progress, tids, place, server, client)
}

/// rustls's client or server connection, as far as the record loop needs it.
trait Side {
    type Data;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn is_handshaking(&self) -> bool;
}

impl Side for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn is_handshaking(&self) -> bool {
        rustls::CommonState::is_handshaking(self)
    }
}

impl Side for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn is_handshaking(&self) -> bool {
        rustls::CommonState::is_handshaking(self)
    }
}

/// A TLS connection over a blocking socket through rustls's unbuffered API.
struct Unbuffered<S> {
    connection: S,
    socket: TcpStream,
    /// Bytes read from the socket: `incoming[start..filled]` not yet processed.
    incoming: Vec<u8>,
    start: usize,
    filled: usize,
    /// Plaintext of a record handed out in part.
    pending: Vec<u8>,
    pending_at: usize,
    outgoing: Vec<u8>,
}

/// What one turn of the state machine asks for next.
enum Turn {
    /// Go round again.
    Again,
    /// Read more from the socket.
    Read,
    /// The connection may write (and has nothing to read).
    Writable,
    /// `n` bytes of plaintext were handed out.
    Plain(usize),
}

fn other(error: impl std::fmt::Display) -> io::Error {
    io::Error::other(error.to_string())
}

impl<S: Side> Unbuffered<S> {
    fn handshake(connection: S, socket: TcpStream) -> anyhow::Result<Self> {
        let mut stream = Self {
            connection,
            socket,
            incoming: vec![0; READ_BUFFER],
            start: 0,
            filled: 0,
            pending: Vec::new(),
            pending_at: 0,
            outgoing: vec![0; WRITE_CHUNK + (WRITE_CHUNK >> 4)],
        };
        for _ in 0..10_000 {
            match stream.turn(&mut [])? {
                Turn::Writable if !stream.connection.is_handshaking() => return Ok(stream),
                Turn::Writable | Turn::Read => stream.read_more()?,
                Turn::Again | Turn::Plain(_) => {}
            }
        }
        anyhow::bail!("the handshake did not end")
    }

    /// Read from the socket into the free end of `incoming`, moving the unprocessed tail to
    /// the front first when the end has no room for a whole record.
    fn read_more(&mut self) -> io::Result<()> {
        if self.incoming.len() - self.filled < 32 << 10 {
            self.incoming.copy_within(self.start..self.filled, 0);
            self.filled -= self.start;
            self.start = 0;
        }
        let read = self.socket.read(&mut self.incoming[self.filled..])?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.filled += read;
        Ok(())
    }

    /// One call of `process_tls_records`, acted on; plaintext goes to `out` (the rest of a
    /// record to `pending`).
    fn turn(&mut self, out: &mut [u8]) -> io::Result<Turn> {
        let UnbufferedStatus { mut discard, state } = self.connection.process(&mut self.incoming[self.start..self.filled]);
        let turn = match state.map_err(other)? {
            ConnectionState::ReadTraffic(mut traffic) => {
                let mut given = 0;
                while let Some(record) = traffic.next_record() {
                    let record = record.map_err(other)?;
                    discard += record.discard;
                    let take = record.payload.len().min(out.len() - given);
                    out[given..given + take].copy_from_slice(&record.payload[..take]);
                    given += take;
                    if take < record.payload.len() {
                        self.pending.clear();
                        self.pending.extend_from_slice(&record.payload[take..]);
                        self.pending_at = 0;
                        break;
                    }
                }
                Turn::Plain(given)
            }
            ConnectionState::EncodeTlsData(mut encode) => {
                let written = loop {
                    match encode.encode(&mut self.outgoing) {
                        Ok(written) => break written,
                        Err(EncodeError::InsufficientSize(short)) => self.outgoing.resize(short.required_size, 0),
                        Err(error) => return Err(other(error)),
                    }
                };
                self.socket.write_all(&self.outgoing[..written])?;
                Turn::Again
            }
            ConnectionState::TransmitTlsData(transmit) => {
                transmit.done();
                Turn::Again
            }
            ConnectionState::BlockedHandshake => Turn::Read,
            ConnectionState::WriteTraffic(_) => Turn::Writable,
            ConnectionState::PeerClosed | ConnectionState::Closed => return Err(io::ErrorKind::UnexpectedEof.into()),
            _ => return Err(other("an unexpected TLS state (early data?)")),
        };
        self.start += discard;
        Ok(turn)
    }
}

impl<S: Side> Read for Unbuffered<S> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pending_at < self.pending.len() {
            let take = out.len().min(self.pending.len() - self.pending_at);
            out[..take].copy_from_slice(&self.pending[self.pending_at..self.pending_at + take]);
            self.pending_at += take;
            return Ok(take);
        }
        loop {
            match self.turn(out)? {
                Turn::Plain(0) | Turn::Again => {}
                Turn::Plain(given) => return Ok(given),
                Turn::Read | Turn::Writable => self.read_more()?,
            }
        }
    }
}

impl<S: Side> Write for Unbuffered<S> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let take = data.len().min(WRITE_CHUNK);
        loop {
            let UnbufferedStatus { state, .. } = self.connection.process(&mut []);
            match state.map_err(other)? {
                ConnectionState::WriteTraffic(mut traffic) => {
                    let written = loop {
                        match traffic.encrypt(&data[..take], &mut self.outgoing) {
                            Ok(written) => break written,
                            Err(EncryptError::InsufficientSize(short)) => self.outgoing.resize(short.required_size, 0),
                            Err(error) => return Err(other(error)),
                        }
                    };
                    self.socket.write_all(&self.outgoing[..written])?;
                    return Ok(take);
                }
                ConnectionState::EncodeTlsData(mut encode) => {
                    let written = encode.encode(&mut self.outgoing).map_err(other)?;
                    self.socket.write_all(&self.outgoing[..written])?;
                }
                ConnectionState::TransmitTlsData(transmit) => transmit.done(),
                _ => return Err(other("the connection cannot write")),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.socket.flush()
    }
}
