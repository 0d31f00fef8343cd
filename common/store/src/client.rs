//! [`ObjectStores`]: one S3 client per bucket, and the operations Stoker needs of a store:
//! bounded whole-object reads (manifests), downloads into a file that survive transient
//! failures (resuming a cut body at its offset, refusing an object whose ETag changed), and
//! uploads (multipart above 16 MiB).
//!
//! The library's own retries are off: every retry is Stoker's, with exponential backoff and
//! full jitter, so that each one is counted ([`StoreCounters`]) and a cut body resumes where it
//! stopped instead of starting again.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, PutPayload, RetryConfig, WriteMultipart};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, warn};

use crate::config::{ObjectRoots, StoreConfig};
use crate::error::StoreError;
use crate::profile;
use crate::rate::Limiter;
use crate::redact::redact;
use crate::uri::ObjectUri;

/// The largest object read whole into memory (a manifest): 256 MiB, as a local manifest.
pub const MAX_OBJECT_READ_BYTES: u64 = 256 << 20;

/// Parts of a multipart upload, and the size above which an upload is multipart.
const PART_BYTES: usize = 16 << 20;

/// Counts of what the client did, for a role's metrics.
#[derive(Debug, Default)]
pub struct StoreCounters {
    /// Requests answered (successfully or with a definite error such as not found).
    pub requests_ok: AtomicU64,
    /// Requests that failed transiently (timeouts, 5xx, cut bodies) and were retried.
    pub retries: AtomicU64,
    /// Requests that failed for good (after the last attempt, or a definite error).
    pub requests_failed: AtomicU64,
    /// Body bytes received.
    pub bytes_fetched: AtomicU64,
}

/// Where the pieces of a body go.
enum Sink<'a> {
    /// Into memory, in order.
    Memory(&'a mut Vec<u8>),
    /// Into a file, in order.
    File(&'a mut tokio::io::BufWriter<tokio::fs::File>, &'a Path),
    /// Into a file at each piece's offset in the object (one range of a ranged download).
    At(&'a std::fs::File, &'a Path),
}

impl Sink<'_> {
    /// Write `piece`, the object's bytes from `offset`.
    async fn write(&mut self, piece: &[u8], offset: u64) -> Result<(), StoreError> {
        match self {
            Self::Memory(bytes) => {
                bytes.extend_from_slice(piece);
                Ok(())
            }
            Self::File(file, path) => file.write_all(piece).await.map_err(|source| StoreError::io("failed to write", path, source)),
            // A write into the page cache: too short to be worth a blocking thread.
            Self::At(file, path) => std::os::unix::fs::FileExt::write_all_at(*file, piece, offset)
                .map_err(|source| StoreError::io("failed to write", path, source)),
        }
    }
}

/// The bytes of an object one fetch reads, and what is known of the object before it starts.
#[derive(Clone, Debug, Default)]
struct Span {
    /// The first byte.
    start: u64,
    /// One past the last byte; `None`: to the object's end.
    end_opt: Option<u64>,
    /// The object's size and ETag, when a HEAD found them (each range of a download is read
    /// on the condition that the object is still the one the HEAD saw).
    known_opt: Option<(u64, Option<String>)>,
}

/// One client per bucket, built on first use, with the roots objects must be under.
pub struct ObjectStores {
    config: StoreConfig,
    roots: ObjectRoots,
    clients: Mutex<HashMap<String, Arc<AmazonS3>>>,
    counters: Arc<StoreCounters>,
    limiter: Limiter,
}

impl std::fmt::Debug for ObjectStores {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the clients: their configuration holds credentials.
        formatter.debug_struct("ObjectStores").field("config", &self.config).field("roots", &self.roots).finish_non_exhaustive()
    }
}

/// What a transient failure of one attempt was.
enum Attempt {
    /// Worth another try.
    Transient(String),
    /// Final.
    Fatal(StoreError),
}

impl ObjectStores {
    /// Clients as `config` says, for objects under `roots`.
    pub fn new(config: StoreConfig, roots: ObjectRoots) -> Self {
        let limiter = Limiter::new(config.max_requests_per_second, config.max_bytes_per_second);
        Self { config, roots, clients: Mutex::new(HashMap::new()), counters: Arc::default(), limiter }
    }

    /// What the clients did so far.
    pub fn counters(&self) -> Arc<StoreCounters> {
        Arc::clone(&self.counters)
    }

    /// The roots objects must be under.
    pub fn roots(&self) -> &ObjectRoots {
        &self.roots
    }

    fn client(&self, uri: &ObjectUri) -> Result<Arc<AmazonS3>, StoreError> {
        self.roots.check(uri)?;
        let mut clients = self.clients.lock();
        if let Some(client) = clients.get(uri.bucket()) {
            return Ok(Arc::clone(client));
        }
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(uri.bucket())
            .with_retry(RetryConfig { backoff: BackoffConfig::default(), max_retries: 0, retry_timeout: self.config.request_timeout })
            .with_client_options(
                ClientOptions::new().with_timeout(self.config.request_timeout).with_connect_timeout(Duration::from_secs(10)),
            );
        if let Some(endpoint) = &self.config.endpoint_opt {
            builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
        }
        // The AWS shared files where the environment has no key (a developer's machine).
        if let Some(profile) = profile::from_environment() {
            builder = builder.with_access_key_id(&profile.access_key_id).with_secret_access_key(&profile.secret_access_key);
            if let Some(token) = &profile.session_token_opt {
                builder = builder.with_token(token);
            }
            let region_from_environment = ["AWS_REGION", "AWS_DEFAULT_REGION"].iter().any(|name| std::env::var_os(name).is_some());
            if let Some(region) = profile.region_opt.as_ref().filter(|_| !region_from_environment) {
                builder = builder.with_region(region);
            }
        }
        if let Some(region) = &self.config.region_opt {
            builder = builder.with_region(region);
        }
        let client = Arc::new(builder.build().map_err(|error| StoreError::Config { reason: redact(&error.to_string()) })?);
        clients.insert(uri.bucket().to_owned(), Arc::clone(&client));
        Ok(client)
    }

    /// What one failed attempt means.
    fn classify(&self, uri: &ObjectUri, error: object_store::Error) -> Attempt {
        let uri_text = uri.to_string();
        match error {
            object_store::Error::NotFound { .. } => Attempt::Fatal(StoreError::NotFound { uri: uri_text }),
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                Attempt::Fatal(StoreError::Denied { uri: uri_text })
            }
            object_store::Error::Precondition { .. } => Attempt::Fatal(StoreError::Changed { uri: uri_text }),
            other => {
                let text = other.to_string();
                // A 4xx other than the ones above is a mistake, not an outage.
                let client_error = ["status code: 400", "status code: 405", "status code: 411", "status code: 416"]
                    .iter()
                    .any(|status| text.contains(status));
                if client_error {
                    Attempt::Fatal(StoreError::Refused { uri: uri_text, detail: redact(&text) })
                } else {
                    Attempt::Transient(redact(&text))
                }
            }
        }
    }

    /// Before attempt `attempt` (from 1): exponential backoff with full jitter.
    async fn back_off(&self, uri: &ObjectUri, attempt: u32, detail: &str) {
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
        let ceiling = self.config.first_backoff.saturating_mul(1 << attempt.min(10)).min(Duration::from_secs(5));
        let jitter = jitter_fraction(uri, attempt);
        let delay = ceiling.mul_f64(jitter);
        debug!(%uri, attempt, ?delay, detail, "object-store request failed; retrying");
        tokio::time::sleep(delay).await;
    }

    fn gave_up(&self, uri: &ObjectUri, attempts: u32, detail: String) -> StoreError {
        self.counters.requests_failed.fetch_add(1, Ordering::Relaxed);
        warn!(%uri, attempts, %detail, "object-store request failed for good");
        StoreError::Unavailable { uri: uri.to_string(), attempts, detail }
    }

    fn fatal(&self, error: StoreError) -> StoreError {
        self.counters.requests_failed.fetch_add(1, Ordering::Relaxed);
        error
    }

    /// Run `operation` until it succeeds, fails for good, or the attempts are spent.
    async fn with_retries<T, F, Fut>(&self, uri: &ObjectUri, mut operation: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let mut last = String::new();
        for attempt in 0..self.config.attempts.max(1) {
            if attempt > 0 {
                self.back_off(uri, attempt, &last).await;
            }
            self.limiter.request().await;
            match operation().await {
                Ok(value) => {
                    self.counters.requests_ok.fetch_add(1, Ordering::Relaxed);
                    return Ok(value);
                }
                Err(error) => match self.classify(uri, error) {
                    Attempt::Fatal(error) => return Err(self.fatal(error)),
                    Attempt::Transient(detail) => last = detail,
                },
            }
        }
        Err(self.gave_up(uri, self.config.attempts, last))
    }

    /// The size and ETag of `uri`.
    pub async fn head(&self, uri: &ObjectUri) -> Result<(u64, Option<String>), StoreError> {
        let client = self.client(uri)?;
        let location = ObjectPath::from(uri.key());
        let meta = self.with_retries(uri, || client.head(&location)).await?;
        Ok((meta.size, meta.e_tag))
    }

    /// The whole of `uri`, refused if it has more than `limit` bytes.
    pub async fn read(&self, uri: &ObjectUri, limit: u64) -> Result<Bytes, StoreError> {
        let mut bytes = Vec::new();
        self.fetch(uri, Span::default(), None, limit, &mut Sink::Memory(&mut bytes)).await?;
        Ok(Bytes::from(bytes))
    }

    /// `uri` into the file at `destination` (created or truncated), checking that it has
    /// `expected_size` bytes when that is given. An object known to be larger than the range
    /// size is read as ranged GETs, several at once (each resuming on its own, all on the
    /// condition that the object's ETag is the one a HEAD saw first). The file is synced
    /// before this returns.
    pub async fn download(&self, uri: &ObjectUri, destination: &Path, expected_size: Option<u64>) -> Result<u64, StoreError> {
        if let Some(size) = expected_size.filter(|size| *size > self.config.range_bytes && self.config.parallel_ranges > 1) {
            let (found, tag) = self.head(uri).await?;
            if found != size {
                return Err(self.fatal(StoreError::SizeMismatch { uri: uri.to_string(), expected: size, found }));
            }
            // Without an ETag nothing would keep ranges of two versions of the object apart:
            // then one GET reads it whole (found by review).
            if let Some(tag) = tag {
                return self.download_ranges(uri, destination, size, tag).await;
            }
        }
        let file = tokio::fs::File::create(destination).await.map_err(|source| StoreError::io("failed to create", destination, source))?;
        let mut writer = tokio::io::BufWriter::with_capacity(1 << 20, file);
        let size = self.fetch(uri, Span::default(), expected_size, u64::MAX, &mut Sink::File(&mut writer, destination)).await?;
        writer.flush().await.map_err(|source| StoreError::io("failed to write", destination, source))?;
        writer.get_ref().sync_all().await.map_err(|source| StoreError::io("failed to sync", destination, source))?;
        Ok(size)
    }

    /// [`Self::download`] of an object of `size` bytes as ranged GETs.
    async fn download_ranges(&self, uri: &ObjectUri, destination: &Path, size: u64, tag: String) -> Result<u64, StoreError> {
        let file = std::fs::File::create(destination).map_err(|source| StoreError::io("failed to create", destination, source))?;
        file.set_len(size).map_err(|source| StoreError::io("failed to size", destination, source))?;
        let step = self.config.range_bytes.max(1);
        let spans = (0..size.div_ceil(step)).map(|index| Span {
            start: index * step,
            end_opt: Some(((index + 1) * step).min(size)),
            known_opt: Some((size, Some(tag.clone()))),
        });
        let (file_ref, tag_ref) = (&file, &tag);
        let mut reads = futures_util::stream::iter(spans)
            .map(|span| async move { self.fetch(uri, span, None, u64::MAX, &mut Sink::At(file_ref, destination)).await })
            .buffer_unordered(self.config.parallel_ranges);
        while let Some(read) = reads.next().await {
            read?;
        }
        drop(reads);
        debug!(%uri, size, ranges = size.div_ceil(step), etag = ?tag_ref, "downloaded in ranges");
        file.sync_all().map_err(|source| StoreError::io("failed to sync", destination, source))?;
        Ok(size)
    }

    /// Read `span` of `uri`, passing each piece of the body to `sink`, retrying transient
    /// failures; a body cut midway resumes at the offset reached, on the condition that the
    /// object's ETag is still the one first seen (or the one `span` knows). Returns the
    /// object's size.
    async fn fetch(
        &self,
        uri: &ObjectUri,
        span: Span,
        expected_size: Option<u64>,
        limit: u64,
        sink: &mut Sink<'_>,
    ) -> Result<u64, StoreError> {
        let client = self.client(uri)?;
        let location = ObjectPath::from(uri.key());
        let mut offset = span.start;
        let mut size_and_tag: Option<(u64, Option<String>)> = span.known_opt;
        let mut last = String::new();
        let attempts = self.config.attempts.max(1);
        let mut attempt = 0;
        loop {
            if attempt >= attempts {
                return Err(self.gave_up(uri, attempts, last));
            }
            if attempt > 0 {
                self.back_off(uri, attempt, &last).await;
            }
            attempt += 1;
            let attempt_start = offset;
            if let Some((size, _)) = &size_and_tag
                && offset == span.end_opt.unwrap_or(*size)
            {
                return Ok(*size);
            }
            let range = match span.end_opt {
                Some(end) => Some(GetRange::Bounded(offset..end)),
                None => (offset > 0).then_some(GetRange::Offset(offset)),
            };
            let options = GetOptions { if_match: size_and_tag.as_ref().and_then(|(_, tag)| tag.clone()), range, ..GetOptions::default() };
            self.limiter.request().await;
            let result = match client.get_opts(&location, options).await {
                Ok(result) => result,
                Err(error) => match self.classify(uri, error) {
                    Attempt::Fatal(error) => return Err(self.fatal(error)),
                    Attempt::Transient(detail) => {
                        last = detail;
                        continue;
                    }
                },
            };
            self.counters.requests_ok.fetch_add(1, Ordering::Relaxed);
            let (size, tag) = (result.meta.size, result.meta.e_tag.clone());
            match &size_and_tag {
                None => {
                    if let Some(expected) = expected_size
                        && expected != size
                    {
                        return Err(self.fatal(StoreError::SizeMismatch { uri: uri.to_string(), expected, found: size }));
                    }
                    if size > limit {
                        return Err(self.fatal(StoreError::TooLarge { uri: uri.to_string(), size, limit }));
                    }
                    size_and_tag = Some((size, tag));
                }
                Some((first_size, first_tag)) => {
                    if *first_size != size || (first_tag.is_some() && tag.is_some() && *first_tag != tag) {
                        return Err(self.fatal(StoreError::Changed { uri: uri.to_string() }));
                    }
                }
            }
            if result.range.start != offset {
                return Err(self.fatal(StoreError::Unavailable {
                    uri: uri.to_string(),
                    attempts: attempt,
                    detail: format!("the store answered bytes from {} for a read from {offset}", result.range.start),
                }));
            }
            let end = span.end_opt.unwrap_or(size).min(size);
            let mut body = result.into_stream();
            let mut cut = None;
            while let Some(piece) = body.next().await {
                match piece {
                    Ok(bytes) => {
                        if offset.saturating_add(bytes.len() as u64) > end {
                            return Err(self.fatal(StoreError::Changed { uri: uri.to_string() }));
                        }
                        sink.write(&bytes, offset).await?;
                        offset += bytes.len() as u64;
                        self.counters.bytes_fetched.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                        self.limiter.received(bytes.len()).await;
                    }
                    Err(error) => {
                        cut = Some(redact(&error.to_string()));
                        break;
                    }
                }
            }
            match cut {
                None if offset == end => return Ok(size),
                None => last = format!("the body ended at byte {offset} of {end}"),
                Some(detail) => last = format!("the body was cut at byte {offset} of {end}: {detail}"),
            }
            // A cut body counts as a failed attempt, but progress gives the next one a fresh
            // allowance: a large object over a flaky link gets there a piece at a time.
            // Only progress in this attempt counts: a body cut at its first byte again and
            // again after earlier progress must run out of attempts (found by review).
            if offset > attempt_start {
                attempt = attempt.min(attempts - 1);
            }
        }
    }

    /// Upload the file at `source` to `uri` (multipart above 16 MiB).
    pub async fn upload(&self, source: &Path, uri: &ObjectUri) -> Result<u64, StoreError> {
        let client = self.client(uri)?;
        let location = ObjectPath::from(uri.key());
        let mut file = tokio::fs::File::open(source).await.map_err(|error| StoreError::io("failed to open", source, error))?;
        let size = file.metadata().await.map_err(|error| StoreError::io("failed to read", source, error))?.len();
        if size <= PART_BYTES as u64 {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes).await.map_err(|error| StoreError::io("failed to read", source, error))?;
            return self.put(uri, Bytes::from(bytes)).await.map(|()| size);
        }
        let upload = client.put_multipart(&location).await.map_err(|error| self.upload_error(uri, error))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut buffer = vec![0_u8; 1 << 20];
        loop {
            let read = file.read(&mut buffer).await.map_err(|error| StoreError::io("failed to read", source, error))?;
            if read == 0 {
                break;
            }
            writer.wait_for_capacity(4).await.map_err(|error| self.upload_error(uri, error))?;
            writer.write(&buffer[..read]);
        }
        writer.finish().await.map_err(|error| self.upload_error(uri, error))?;
        self.counters.requests_ok.fetch_add(1, Ordering::Relaxed);
        Ok(size)
    }

    /// Write `bytes` as the object `uri`, retrying transient failures.
    pub async fn put(&self, uri: &ObjectUri, bytes: Bytes) -> Result<(), StoreError> {
        let client = self.client(uri)?;
        let location = ObjectPath::from(uri.key());
        self.with_retries(uri, || client.put(&location, PutPayload::from(bytes.clone()))).await.map(|_| ())
    }

    fn upload_error(&self, uri: &ObjectUri, error: object_store::Error) -> StoreError {
        match self.classify(uri, error) {
            Attempt::Fatal(error) => self.fatal(error),
            Attempt::Transient(detail) => self.gave_up(uri, 1, detail),
        }
    }
}

/// A number in [0, 1) that differs per object and attempt and per process: full jitter without
/// a random-number crate.
fn jitter_fraction(uri: &ObjectUri, attempt: u32) -> f64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.subsec_nanos());
    let seed = format!("{uri}|{attempt}|{nanos}|{}", std::process::id());
    (xxhash_rust::xxh3::xxh3_64(seed.as_bytes()) >> 11) as f64 / (1_u64 << 53) as f64
}
