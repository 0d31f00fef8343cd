//! [`FaultProxy`]: an HTTP proxy on loopback, in front of a test's S3 server, that answers
//! `503 Slow Down` to a share of requests and cuts a share of response bodies midway, as a
//! flaky store or network does. Each client connection carries one request (the proxy closes
//! it after the answer), so faults are per request. Choices are drawn from a seeded hash of the
//! request's number: a run's faults are the same each time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::TestkitError;

/// What the proxy did so far.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Requests seen.
    pub requests: AtomicU64,
    /// Answered 503 without reaching the store.
    pub unavailable: AtomicU64,
    /// Response bodies cut midway.
    pub cut: AtomicU64,
}

/// A fault-injecting HTTP proxy; stops accepting when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    counts: Arc<FaultCounts>,
    stop: Arc<AtomicBool>,
}

/// A request's fate, from its number.
fn draw(seed: u64, number: u64) -> f64 {
    (xxhash_rust::xxh3::xxh3_64_with_seed(&number.to_le_bytes(), seed) >> 11) as f64 / (1_u64 << 53) as f64
}

impl FaultProxy {
    /// Listen on `127.0.0.<host>`, forwarding to `upstream`: `unavailable` of the requests
    /// (0.0 to 1.0) answered 503, `cut` of the bodies cut at half their length.
    pub fn start(host: u8, upstream: SocketAddr, unavailable: f64, cut: f64, seed: u64) -> Result<Self, TestkitError> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::new(127, 0, 0, host), 0)).map_err(|error| error.to_string())?;
        let addr = listener.local_addr().map_err(|error| error.to_string())?;
        let (counts, stop) = (Arc::new(FaultCounts::default()), Arc::new(AtomicBool::new(false)));
        let (thread_counts, thread_stop) = (Arc::clone(&counts), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("fault-proxy".to_owned())
            .spawn(move || {
                for client in listener.incoming() {
                    if thread_stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let number = thread_counts.requests.fetch_add(1, Ordering::Relaxed);
                    let fate = draw(seed, number);
                    let counts = Arc::clone(&thread_counts);
                    std::thread::spawn(move || {
                        let _ = serve(client, upstream, fate, unavailable, cut, &counts);
                    });
                }
            })
            .map_err(|error| error.to_string())?;
        Ok(Self { addr, counts, stop })
    }

    /// The endpoint, for `--s3-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it did so far.
    pub fn counts(&self) -> &FaultCounts {
        &self.counts
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// One request: read it, then fail it or forward it (with `Connection: close`) and pass the
/// answer back, whole or cut.
fn serve(client: TcpStream, upstream: SocketAddr, fate: f64, unavailable: f64, cut: f64, counts: &FaultCounts) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = Vec::new();
    let mut content_length = 0_usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            content_length = value.trim().parse().unwrap_or(0);
        }
        if line.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        if line == "\r\n" {
            head.extend_from_slice(b"Connection: close\r\n\r\n");
            break;
        }
        head.extend_from_slice(line.as_bytes());
    }
    let mut body = vec![0_u8; content_length];
    reader.read_exact(&mut body)?;
    let mut client = client;
    if fate < unavailable {
        counts.unavailable.fetch_add(1, Ordering::Relaxed);
        let answer = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
        write!(
            client,
            "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
            answer.len()
        )?;
        return client.shutdown(Shutdown::Both);
    }
    let mut store = TcpStream::connect(upstream)?;
    store.write_all(&head)?;
    store.write_all(&body)?;
    let mut answer = Vec::new();
    store.read_to_end(&mut answer)?;
    let body_start = answer.windows(4).position(|window| window == b"\r\n\r\n").map_or(answer.len(), |at| at + 4);
    let is_get = head.starts_with(b"GET ");
    if is_get && fate >= 1.0 - cut && answer.len() > body_start + 1 {
        counts.cut.fetch_add(1, Ordering::Relaxed);
        let keep = body_start + (answer.len() - body_start) / 2;
        client.write_all(&answer[..keep])?;
    } else {
        client.write_all(&answer)?;
    }
    client.shutdown(Shutdown::Both)
}
