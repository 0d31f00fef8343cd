//! The TLS 1.3 handshake of a bulk connection, made by rustls's unbuffered API so that every
//! byte read from the socket is accounted for: what rustls did not consume (and any plaintext
//! it decrypted along the way) goes on to the record layer, which rustls then hands over to
//! (`dangerous_into_kernel_connection`).

use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::CertificateDer;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{CommonState, ExtractedSecrets};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::BulkError;
use super::records::Kernel;

/// Handshake bytes one side may send (certificate chains are a few KB).
const HANDSHAKE_LIMIT: usize = 256 << 10;
/// Plaintext the peer may send before the handshake ends on our side (a bulk hello).
const EARLY_LIMIT: usize = 64 << 10;

/// A finished handshake.
pub(crate) struct Established {
    pub(crate) secrets: ExtractedSecrets,
    pub(crate) kernel: Kernel,
    /// The peer's certificate chain (empty when it showed none: `--insecure`).
    pub(crate) peer_chain: Vec<CertificateDer<'static>>,
    /// Plaintext rustls decrypted after the handshake.
    pub(crate) early: Vec<u8>,
    /// Bytes read that rustls did not consume (the start of the records after it).
    pub(crate) leftover: Vec<u8>,
}

/// One end of the handshake: rustls's client or server connection.
trait Side {
    type Data;
    fn common(&self) -> &CommonState;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
}

impl Side for UnbufferedClientConnection {
    type Data = rustls::client::ClientConnectionData;
    fn common(&self) -> &CommonState {
        self
    }
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
}

impl Side for UnbufferedServerConnection {
    type Data = rustls::server::ServerConnectionData;
    fn common(&self) -> &CommonState {
        self
    }
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
}

/// Make the handshake as the client (the trainer), offering `alpn`.
pub(crate) async fn client<T>(io: &mut T, config: std::sync::Arc<rustls::ClientConfig>, alpn: &[u8]) -> Result<Established, BulkError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let name = rustls::pki_types::ServerName::try_from("stoker").map_err(|error| BulkError::Tls(error.to_string()))?;
    let mut connection = UnbufferedClientConnection::new(config, name).map_err(tls)?;
    let (early, leftover) = drive(&mut connection, io, alpn).await?;
    let peer_chain = connection.peer_certificates().map(<[_]>::to_vec).unwrap_or_default();
    let (secrets, kernel) = connection.dangerous_into_kernel_connection().map_err(tls)?;
    Ok(Established { secrets, kernel: Kernel::Client(kernel), peer_chain, early, leftover })
}

/// Make the handshake as the server (the worker), requiring `alpn`.
pub(crate) async fn server<T>(io: &mut T, config: std::sync::Arc<rustls::ServerConfig>, alpn: &[u8]) -> Result<Established, BulkError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut connection = UnbufferedServerConnection::new(config).map_err(tls)?;
    let (early, leftover) = drive(&mut connection, io, alpn).await?;
    let peer_chain = connection.peer_certificates().map(<[_]>::to_vec).unwrap_or_default();
    let (secrets, kernel) = connection.dangerous_into_kernel_connection().map_err(tls)?;
    Ok(Established { secrets, kernel: Kernel::Server(kernel), peer_chain, early, leftover })
}

fn tls(error: rustls::Error) -> BulkError {
    BulkError::Tls(error.to_string())
}

/// What to do once rustls's state is handled.
enum Next {
    Again,
    Read,
    Done,
}

/// After a failed handshake, send the alert rustls queued for it (an unknown CA, no common
/// protocol), so that the peer learns why; best effort, for a moment at most. rustls hands the
/// alert out first; nothing else is asked of it (its deframer state is that of the error).
async fn send_alert<S, T>(connection: &mut S, io: &mut T, unsent: &[u8])
where
    S: Side,
    T: AsyncWrite + Unpin,
{
    // Records encoded before the error go first: the alert may be under their keys.
    let mut outgoing = unsent.to_vec();
    let start = outgoing.len();
    outgoing.resize(start + 4096, 0);
    let written = match connection.process(&mut []).state {
        Ok(ConnectionState::EncodeTlsData(mut state)) => loop {
            match state.encode(&mut outgoing[start..]) {
                Ok(written) => break written,
                Err(EncodeError::InsufficientSize(short)) if short.required_size <= HANDSHAKE_LIMIT => {
                    outgoing.resize(start + short.required_size, 0);
                }
                Err(_) => break 0,
            }
        },
        _ => 0,
    };
    if start + written > 0 {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), io.write_all(&outgoing[..start + written])).await;
    }
}

/// Run the handshake to its end; returns the plaintext and the bytes read past it.
async fn drive<S, T>(connection: &mut S, io: &mut T, alpn: &[u8]) -> Result<(Vec<u8>, Vec<u8>), BulkError>
where
    S: Side,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut incoming = vec![0u8; 16 << 10];
    let mut used = 0;
    let mut outgoing = vec![0u8; 16 << 10];
    let mut outgoing_used = 0;
    let mut early = Vec::new();
    loop {
        let UnbufferedStatus { mut discard, state } = connection.process(&mut incoming[..used]);
        let state = match state {
            Ok(state) => state,
            Err(error) => {
                send_alert(connection, io, &outgoing[..outgoing_used]).await;
                return Err(tls(error));
            }
        };
        let next = match state {
            ConnectionState::EncodeTlsData(mut state) => loop {
                match state.encode(&mut outgoing[outgoing_used..]) {
                    Ok(written) => {
                        outgoing_used += written;
                        break Next::Again;
                    }
                    Err(EncodeError::InsufficientSize(short)) if outgoing_used + short.required_size <= HANDSHAKE_LIMIT => {
                        outgoing.resize(outgoing_used + short.required_size, 0);
                    }
                    Err(error) => return Err(BulkError::Tls(format!("cannot encode the handshake: {error}"))),
                }
            },
            ConnectionState::TransmitTlsData(state) => {
                io.write_all(&outgoing[..outgoing_used]).await.map_err(BulkError::Io)?;
                io.flush().await.map_err(BulkError::Io)?;
                outgoing_used = 0;
                state.done();
                Next::Again
            }
            ConnectionState::BlockedHandshake => Next::Read,
            ConnectionState::ReadTraffic(mut state) => {
                while let Some(record) = state.next_record() {
                    let record = record.map_err(tls)?;
                    discard += record.discard;
                    if early.len() + record.payload.len() > EARLY_LIMIT {
                        return Err(BulkError::Protocol("the peer sent too much before the handshake ended".to_owned()));
                    }
                    early.extend_from_slice(record.payload);
                }
                Next::Again
            }
            ConnectionState::WriteTraffic(_) => Next::Done,
            ConnectionState::PeerClosed | ConnectionState::Closed => return Err(BulkError::Closed),
            _ => return Err(BulkError::Protocol("an unexpected state in the handshake (early data?)".to_owned())),
        };
        incoming.copy_within(discard..used, 0);
        used -= discard;
        // A server may write (0.5-RTT) before the client's certificate is checked: the
        // handshake is over only when rustls says so.
        let next = match next {
            Next::Done if connection.common().is_handshaking() => Next::Read,
            next => next,
        };
        match next {
            Next::Again => {}
            Next::Done => break,
            Next::Read => {
                if used == incoming.len() {
                    if incoming.len() >= HANDSHAKE_LIMIT {
                        return Err(BulkError::Protocol("the peer's handshake is too large".to_owned()));
                    }
                    incoming.resize(incoming.len() * 2, 0);
                }
                let read = io.read(&mut incoming[used..]).await.map_err(BulkError::Io)?;
                if read == 0 {
                    return Err(BulkError::Truncated);
                }
                used += read;
            }
        }
    }
    if connection.common().alpn_protocol() != Some(alpn) {
        return Err(BulkError::Protocol(format!(
            "the peer does not speak {} (it offered {:?}): is it a Stoker node of the same version?",
            String::from_utf8_lossy(alpn),
            connection.common().alpn_protocol().map(String::from_utf8_lossy)
        )));
    }
    incoming.truncate(used);
    Ok((early, incoming))
}
