//! A minimal HTTP/1.1 server for `GET /metrics`, `/healthz` and `/readyz`: one request per
//! connection, bounded in size, time and concurrency, so a scraper or a stray client cannot
//! hold the process.
//!
//! Admission (issue 31, item 5): the accept loop never waits. A connection is refused at once
//! (closed) when its address already has [`MAX_CONNECTIONS_PER_ADDRESS`] open, or when
//! [`MAX_OPEN_CONNECTIONS`] are open in all. Its request head is read without holding any
//! serving slot; then probes (`/healthz`, `/readyz`) are served from [`PROBE_SLOTS`] of their
//! own and scrapes (`/metrics`) from [`SCRAPE_SLOTS`], each answered `503` when its slots are
//! taken. So silent or slow connections, and scrapers, never delay the kubelet's probes.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::Metrics;
use crate::error::ObsError;

/// Largest request head read; a GET needs a few hundred bytes.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// A request whose head takes longer than this to arrive is dropped (an idle or slow client
/// holds a connection slot no longer).
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// A request that takes longer than this in all (its reply read included) is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// `/metrics` renders at once (a render takes a blocking thread).
pub(crate) const SCRAPE_SLOTS: usize = 32;
/// `/healthz` and `/readyz` answers at once: reserved for probes, never taken by scrapes.
pub(crate) const PROBE_SLOTS: usize = 8;
/// Connections open at once from one address (IPv6: one /64), head reading included.
pub(crate) const MAX_CONNECTIONS_PER_ADDRESS: usize = 8;
/// Connections open at once in all.
pub(crate) const MAX_OPEN_CONNECTIONS: usize = 512;

/// The open connections, by address: admission before anything is read.
#[derive(Debug, Default)]
struct OpenConnections {
    by_address: HashMap<IpAddr, usize>,
    total: usize,
}

/// One admitted connection; its place is given back when dropped.
struct Admitted {
    open: Arc<Mutex<OpenConnections>>,
    address: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(count) = open.by_address.get_mut(&self.address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.by_address.remove(&self.address);
            }
        }
    }
}

/// The address connections are counted under: the IP, or its /64 for IPv6.
fn counted_address(peer: SocketAddr) -> IpAddr {
    match peer.ip() {
        IpAddr::V6(ip) if ip.to_ipv4_mapped().is_none() => {
            let segments = ip.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(segments[0], segments[1], segments[2], segments[3], 0, 0, 0, 0))
        }
        IpAddr::V6(ip) => ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4),
        ip => ip,
    }
}

/// Admit a connection from `peer`, or `None` if its address or the server is full.
fn admit(open: &Arc<Mutex<OpenConnections>>, peer: SocketAddr) -> Option<Admitted> {
    let address = counted_address(peer);
    let mut counts = open.lock();
    let of_address = counts.by_address.get(&address).copied().unwrap_or(0);
    if of_address >= MAX_CONNECTIONS_PER_ADDRESS || counts.total >= MAX_OPEN_CONNECTIONS {
        return None;
    }
    counts.by_address.insert(address, of_address + 1);
    counts.total += 1;
    Some(Admitted { open: Arc::clone(open), address })
}

/// The serving slots of each kind of request.
struct Slots {
    scrapes: Semaphore,
    probes: Semaphore,
}

/// A running metrics endpoint; stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// The address it listens on (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serve `metrics` on `addr` (TCP). Must run inside a tokio runtime.
pub async fn serve(addr: SocketAddr, metrics: Metrics) -> Result<MetricsServer, ObsError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| ObsError::Bind { addr, source })?;
    let addr = listener.local_addr().map_err(|source| ObsError::Bind { addr, source })?;
    let open = Arc::new(Mutex::new(OpenConnections::default()));
    let slots = Arc::new(Slots { scrapes: Semaphore::new(SCRAPE_SLOTS), probes: Semaphore::new(PROBE_SLOTS) });
    let task = tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Over the limits the connection is closed at once: nothing is read or answered.
            let Some(admitted) = admit(&open, peer) else {
                tracing::debug!(%peer, "metrics connection refused: too many open from its address, or in all");
                continue;
            };
            let (metrics, slots) = (metrics.clone(), Arc::clone(&slots));
            tokio::spawn(async move {
                if let Err(error) = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, &metrics, &slots)).await {
                    tracing::debug!(%error, "metrics request timed out");
                }
                drop(admitted);
            });
        }
    });
    Ok(MetricsServer { addr, task })
}

async fn answer(mut stream: TcpStream, metrics: &Metrics, slots: &Slots) {
    let Some(Request { path, bearer_opt }) = tokio::time::timeout(HEAD_TIMEOUT, read_request(&mut stream)).await.ok().flatten() else {
        let _ = reply(&mut stream, "400 Bad Request", "text/plain", b"bad request\n").await;
        return;
    };
    let slots_of_path = if path == "/metrics" { &slots.scrapes } else { &slots.probes };
    let Ok(_slot) = slots_of_path.try_acquire() else {
        let _ = reply(&mut stream, "503 Service Unavailable", "text/plain", b"busy: try again\n").await;
        return;
    };
    let result = match path.as_str() {
        "/metrics" if !metrics.scrape_allowed(bearer_opt.as_deref()) => {
            reply(
                &mut stream,
                "401 Unauthorized",
                "text/plain",
                b"this endpoint needs Authorization: Bearer TOKEN (--metrics-token-file)\n",
            )
            .await
        }
        "/metrics" => {
            let metrics = metrics.clone();
            match tokio::task::spawn_blocking(move || metrics.render()).await {
                Ok(Ok(text)) => reply(&mut stream, "200 OK", prometheus::TEXT_FORMAT, &text).await,
                Ok(Err(error)) => reply(&mut stream, "500 Internal Server Error", "text/plain", format!("{error}\n").as_bytes()).await,
                Err(error) => reply(&mut stream, "500 Internal Server Error", "text/plain", format!("{error}\n").as_bytes()).await,
            }
        }
        "/healthz" => reply(&mut stream, "200 OK", "text/plain", b"ok\n").await,
        "/readyz" => match metrics.ready() {
            Ok(()) => reply(&mut stream, "200 OK", "text/plain", b"ready\n").await,
            Err(reason) => reply(&mut stream, "503 Service Unavailable", "text/plain", format!("not ready: {reason}\n").as_bytes()).await,
        },
        _ => reply(&mut stream, "404 Not Found", "text/plain", b"not found: try /metrics, /healthz or /readyz\n").await,
    };
    if let Err(error) = result {
        tracing::debug!(%error, "metrics reply failed");
    }
}

/// What the server reads of a request.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    /// The path, without its query.
    path: String,
    /// The token of an `Authorization: Bearer` header, if any.
    bearer_opt: Option<String>,
}

/// The path and bearer token of a `GET` (or `HEAD`) request; `None` for anything else.
async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut head = Vec::with_capacity(512);
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await.ok()?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
        if head.len() > MAX_REQUEST_BYTES {
            return None;
        }
    }
    let path = parse_request_line(&head)?;
    Some(Request { path, bearer_opt: bearer_of(&head) })
}

/// The token of the head's `Authorization: Bearer` header, if any.
fn bearer_of(head: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        if !name.trim().eq_ignore_ascii_case("authorization") {
            return None;
        }
        let (scheme, token) = value.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_owned())
    })
}

fn parse_request_line(head: &[u8]) -> Option<String> {
    let line = head.split(|byte| *byte == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.split(' ');
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if !(method == "GET" || method == "HEAD") || !version.starts_with("HTTP/1.") {
        return None;
    }
    Some(target.split('?').next().unwrap_or(target).to_owned())
}

async fn reply(stream: &mut TcpStream, status: &str, content_type: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::{bearer_of, parse_request_line};

    #[test]
    fn a_bearer_token_is_read_from_its_header() {
        assert_eq!(bearer_of(b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer abc\r\n\r\n").as_deref(), Some("abc"));
        assert_eq!(bearer_of(b"GET /metrics HTTP/1.1\r\nauthorization:  bearer  abc \r\n\r\n").as_deref(), Some("abc"));
        assert_eq!(bearer_of(b"GET /metrics HTTP/1.1\r\nAuthorization: Basic abc\r\n\r\n"), None);
        assert_eq!(bearer_of(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), None);
    }

    #[test]
    fn a_request_line_gives_its_path() {
        assert_eq!(parse_request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").as_deref(), Some("/metrics"));
        assert_eq!(parse_request_line(b"GET /readyz?verbose=1 HTTP/1.0\r\n\r\n").as_deref(), Some("/readyz"));
        assert_eq!(parse_request_line(b"POST /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(parse_request_line(b"GET /metrics\r\n\r\n"), None);
        assert_eq!(parse_request_line(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n"), None);
    }
}
