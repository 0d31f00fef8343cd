//! A minimal HTTP/1.1 server for `GET /metrics`, `/healthz` and `/readyz`: one request per
//! connection, bounded in size, time and concurrency, so a scraper or a stray client cannot
//! hold the process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

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
/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 32;

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
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let task = tokio::spawn(async move {
        loop {
            let Ok(permit) = Arc::clone(&permits).acquire_owned().await else { return };
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                if let Err(error) = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, &metrics)).await {
                    tracing::debug!(%error, "metrics request timed out");
                }
                drop(permit);
            });
        }
    });
    Ok(MetricsServer { addr, task })
}

async fn answer(mut stream: TcpStream, metrics: &Metrics) {
    let Some(path) = tokio::time::timeout(HEAD_TIMEOUT, read_request(&mut stream)).await.ok().flatten() else {
        let _ = reply(&mut stream, "400 Bad Request", "text/plain", b"bad request\n").await;
        return;
    };
    let result = match path.as_str() {
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

/// The path of a `GET` (or `HEAD`) request, without its query; `None` for anything else.
async fn read_request(stream: &mut TcpStream) -> Option<String> {
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
    parse_request_line(&head)
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
    use super::parse_request_line;

    #[test]
    fn a_request_line_gives_its_path() {
        assert_eq!(parse_request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").as_deref(), Some("/metrics"));
        assert_eq!(parse_request_line(b"GET /readyz?verbose=1 HTTP/1.0\r\n\r\n").as_deref(), Some("/readyz"));
        assert_eq!(parse_request_line(b"POST /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(parse_request_line(b"GET /metrics\r\n\r\n"), None);
        assert_eq!(parse_request_line(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n"), None);
    }
}
