//! [`StoreConfig`]: how the object-store client reaches the store, and [`ObjectRoots`]: which
//! buckets and prefixes datasets may come from (`--object-root`, the object-store counterpart
//! of `--dataset-root`, DESIGN §10).
//!
//! Credentials are never part of the configuration: the client reads them where AWS tools do
//! (the `AWS_*` environment variables, web-identity tokens, the instance or pod role), so they
//! never pass through flags, logs or `stoker status`.

use std::time::Duration;

use crate::error::StoreError;
use crate::uri::ObjectUri;

/// Ranged GETs of 8 MiB: large enough that a request's latency is small against its transfer,
/// small enough that a shard of a few hundred MiB is read over several connections at once (a
/// single S3 connection tops out well below a node's bandwidth).
pub const DEFAULT_RANGE_BYTES: u64 = 8 << 20;

/// How the object-store client reaches the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// An S3-compatible endpoint (`--s3-endpoint http://127.0.0.1:9000`, MinIO, Ceph RGW, R2);
    /// `None`: AWS (or `AWS_ENDPOINT_URL` where set). Plain `http://` is allowed only here.
    pub endpoint_opt: Option<String>,
    /// The region (`--s3-region`); `None`: `AWS_REGION`/`AWS_DEFAULT_REGION`, else us-east-1.
    pub region_opt: Option<String>,
    /// Attempts per request before a transient failure (timeout, 5xx, a cut body) is an error.
    pub attempts: u32,
    /// The first retry's delay; each next one doubles, up to 5 s, with full jitter.
    pub first_backoff: Duration,
    /// How long one request may take before it is a timeout (and retried).
    pub request_timeout: Duration,
    /// Requests a second this process sends at most (`--s3-max-requests-per-second`); `None`:
    /// no limit.
    pub max_requests_per_second: Option<u64>,
    /// Body bytes a second this process receives at most (`--s3-max-bandwidth`); `None`: no
    /// limit.
    pub max_bytes_per_second: Option<u64>,
    /// A download larger than this is read as ranged GETs of this size, several at once.
    pub range_bytes: u64,
    /// Ranged GETs of one download in flight at once.
    pub parallel_ranges: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            endpoint_opt: None,
            region_opt: None,
            attempts: 8,
            first_backoff: Duration::from_millis(100),
            request_timeout: Duration::from_secs(60),
            max_requests_per_second: None,
            max_bytes_per_second: None,
            range_bytes: DEFAULT_RANGE_BYTES,
            parallel_ranges: 4,
        }
    }
}

impl StoreConfig {
    /// Defaults, with `endpoint_opt` (checked: `http://` or `https://` and a host).
    pub fn with_endpoint(endpoint_opt: Option<String>) -> Result<Self, StoreError> {
        if let Some(endpoint) = &endpoint_opt {
            let host = endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("https://"));
            if host.is_none_or(str::is_empty) {
                return Err(StoreError::Config { reason: format!("--s3-endpoint {endpoint}: give http://HOST:PORT or https://HOST") });
            }
        }
        Ok(Self { endpoint_opt, ..Self::default() })
    }
}

/// The buckets and prefixes datasets may come from; none: any the credentials can read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectRoots {
    roots: Vec<ObjectUri>,
}

impl ObjectRoots {
    /// No confinement.
    pub fn anywhere() -> Self {
        Self::default()
    }

    /// Confined to `roots` (`s3://bucket` or `s3://bucket/prefix` each).
    pub fn new<I, S>(roots: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let roots = roots.into_iter().map(|root| ObjectUri::parse_prefix(root.as_ref())).collect::<Result<_, _>>()?;
        Ok(Self { roots })
    }

    /// Whether reading is confined.
    pub fn is_confined(&self) -> bool {
        !self.roots.is_empty()
    }

    /// `uri` if it is under a root (or nothing is confined).
    pub fn check(&self, uri: &ObjectUri) -> Result<(), StoreError> {
        if self.roots.is_empty() || self.roots.iter().any(|root| uri.is_under(root)) {
            return Ok(());
        }
        let roots: Vec<String> = self.roots.iter().map(ToString::to_string).collect();
        Err(StoreError::Confined { uri: uri.to_string(), roots: roots.join(", ") })
    }
}

#[cfg(test)]
mod tests {
    use super::{ObjectRoots, StoreConfig};
    use crate::uri::ObjectUri;

    #[test]
    fn objects_outside_the_roots_are_refused() {
        let roots = ObjectRoots::new(["s3://data/train", "s3://open"]).unwrap_or_else(|error| panic!("{error}"));
        let check = |text: &str| roots.check(&ObjectUri::parse(text).unwrap_or_else(|error| panic!("{error}")));
        assert!(check("s3://data/train/a.tar").is_ok());
        assert!(check("s3://open/any/thing.tar").is_ok());
        let error = check("s3://data/trainer/a.tar").expect_err("outside");
        assert!(error.to_string().contains("outside every --object-root"), "{error}");
        assert!(check("s3://other/a.tar").is_err());
        assert!(ObjectRoots::anywhere().check(&ObjectUri::parse("s3://x/y").unwrap_or_else(|e| panic!("{e}"))).is_ok());
    }

    #[test]
    fn endpoints_need_a_scheme_and_a_host() {
        assert!(StoreConfig::with_endpoint(Some("http://127.0.0.1:9000".into())).is_ok());
        assert!(StoreConfig::with_endpoint(None).is_ok());
        for bad in ["127.0.0.1:9000", "http://", "ftp://x"] {
            assert!(StoreConfig::with_endpoint(Some(bad.into())).is_err(), "{bad}");
        }
    }
}
