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

/// What the proxy does to requests.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Share of requests (0.0 to 1.0) answered `503 Slow Down` without reaching the store.
    pub unavailable: f64,
    /// Share of GET bodies cut at half their length.
    pub cut: f64,
    /// Bytes per second each response is passed on at (`None`: as fast as it comes): a slow
    /// link, so that a test can catch a download midway.
    pub bytes_per_second_opt: Option<u64>,
    /// Time each request waits before it is forwarded (`None`: none): a round trip's latency.
    pub latency_opt: Option<std::time::Duration>,
    /// Seed of the draws.
    pub seed: u64,
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
    /// Listen on `127.0.0.<host>`, forwarding to `upstream` with `faults`.
    pub fn start(host: u8, upstream: SocketAddr, faults: Faults) -> Result<Self, TestkitError> {
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
                    let fate = draw(faults.seed, number);
                    let counts = Arc::clone(&thread_counts);
                    std::thread::spawn(move || {
                        let _ = serve(client, upstream, fate, faults, &counts);
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
fn serve(client: TcpStream, upstream: SocketAddr, fate: f64, faults: Faults, counts: &FaultCounts) -> std::io::Result<()> {
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
    if fate < faults.unavailable {
        counts.unavailable.fetch_add(1, Ordering::Relaxed);
        let answer = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
        write!(
            client,
            "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
            answer.len()
        )?;
        return client.shutdown(Shutdown::Both);
    }
    if let Some(latency) = faults.latency_opt {
        std::thread::park_timeout(latency);
    }
    let mut store = TcpStream::connect(upstream)?;
    store.write_all(&head)?;
    store.write_all(&body)?;
    let mut answer = Vec::new();
    store.read_to_end(&mut answer)?;
    let body_start = answer.windows(4).position(|window| window == b"\r\n\r\n").map_or(answer.len(), |at| at + 4);
    let is_get = head.starts_with(b"GET ");
    let keep = if is_get && fate >= 1.0 - faults.cut && answer.len() > body_start + 1 {
        counts.cut.fetch_add(1, Ordering::Relaxed);
        body_start + (answer.len() - body_start) / 2
    } else {
        answer.len()
    };
    match faults.bytes_per_second_opt {
        None => client.write_all(&answer[..keep])?,
        Some(rate) => {
            // Pieces of a tenth of a second.
            let piece = usize::try_from(rate / 10).unwrap_or(usize::MAX).max(1);
            for part in answer[..keep].chunks(piece) {
                client.write_all(part)?;
                std::thread::park_timeout(std::time::Duration::from_millis(100));
            }
        }
    }
    client.shutdown(Shutdown::Both)
}
