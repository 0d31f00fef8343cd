#![doc = include_str!("../README.md")]
//!
//! What every role shares to be watched (DESIGN §9): a metrics registry with the hooks that
//! refresh it at scrape time and the readiness check ([`Metrics`]), the HTTP server of
//! `/metrics`, `/healthz` and `/readyz` ([`serve`]), process metrics ([`process`]), and the
//! tracing set-up of every binary ([`init_tracing`]).

/// Errors of metrics and their HTTP endpoint.
pub mod error;

mod http;
pub mod process;
/// The bearer token scrapers must present (`--metrics-token-file`).
mod token;

use std::sync::Arc;

pub use self::http::{MetricsServer, serve};
pub use self::token::ScrapeToken;
pub use prometheus;
use prometheus::{Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::error::ObsError;
use parking_lot::Mutex;

type Hook = Box<dyn Fn() + Send + Sync>;
type Readiness = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// One process's metrics: a registry, the hooks that bring scrape-time figures up to date
/// (queue depths, Raft state, what trainers reported), and the check `/readyz` answers. Cheap
/// to clone; every clone is the same registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    /// Held while the hooks run and the registry is read, so that two scrapes never
    /// interleave a hook's reset with another's read.
    scrape: Mutex<Vec<Hook>>,
    readiness: Mutex<Option<Readiness>>,
    /// The token `/metrics` requires, if any (probes never need one).
    token: Mutex<Option<ScrapeToken>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// An empty registry: no hooks, always ready.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                registry: Registry::new(),
                scrape: Mutex::new(Vec::new()),
                readiness: Mutex::new(None),
                token: Mutex::new(None),
            }),
        }
    }

    /// A registry with the process metrics and `stoker_build_info{version, role}`: what each
    /// role's binary starts from.
    pub fn for_role(role: &str) -> Result<Self, ObsError> {
        let metrics = Self::new();
        process::register(&metrics)?;
        let info = metrics.gauge_vec("stoker_build_info", "Always 1: the version and role of this process.", &["version", "role"])?;
        info.with_label_values(&[env!("CARGO_PKG_VERSION"), role]).set(1);
        Ok(metrics)
    }

    /// The registry, to register metrics of one's own.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Run `hook` before every scrape (to set figures computed from state).
    pub fn on_scrape(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.inner.scrape.lock().push(Box::new(hook));
    }

    /// What `/readyz` checks: `Err(reason)` answers 503 with the reason. The last one set wins.
    pub fn set_readiness(&self, check: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        *self.inner.readiness.lock() = Some(Box::new(check));
    }

    /// From now on `/metrics` answers only a request with `Authorization: Bearer TOKEN`
    /// (`401` otherwise); `/healthz` and `/readyz` stay open for probes.
    pub fn require_token(&self, token: ScrapeToken) {
        *self.inner.token.lock() = Some(token);
    }

    /// Whether a scrape presenting `bearer_opt` may read the metrics.
    pub fn scrape_allowed(&self, bearer_opt: Option<&str>) -> bool {
        match &*self.inner.token.lock() {
            Some(token) => bearer_opt.is_some_and(|bearer| token.matches(bearer)),
            None => true,
        }
    }

    /// Whether the process is ready, and if not why.
    pub fn ready(&self) -> Result<(), String> {
        match &*self.inner.readiness.lock() {
            Some(check) => check(),
            None => Ok(()),
        }
    }

    /// Every metric in Prometheus' text format, after running the scrape hooks.
    pub fn render(&self) -> Result<Vec<u8>, ObsError> {
        let hooks = self.inner.scrape.lock();
        for hook in hooks.iter() {
            hook();
        }
        let families = self.inner.registry.gather();
        drop(hooks);
        let mut text = Vec::with_capacity(16 * 1024);
        prometheus::TextEncoder::new().encode(&families, &mut text)?;
        Ok(text)
    }

    /// Register and return a counter.
    pub fn counter(&self, name: &str, help: &str) -> Result<IntCounter, ObsError> {
        let counter = IntCounter::new(name, help)?;
        self.inner.registry.register(Box::new(counter.clone()))?;
        Ok(counter)
    }

    /// Register and return a counter with labels.
    pub fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, ObsError> {
        let counter = IntCounterVec::new(Opts::new(name, help), labels)?;
        self.inner.registry.register(Box::new(counter.clone()))?;
        Ok(counter)
    }

    /// Register and return a float counter with labels (seconds, mirrored totals).
    pub fn float_counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> Result<prometheus::CounterVec, ObsError> {
        let counter = prometheus::CounterVec::new(Opts::new(name, help), labels)?;
        self.inner.registry.register(Box::new(counter.clone()))?;
        Ok(counter)
    }

    /// Register and return a gauge.
    pub fn gauge(&self, name: &str, help: &str) -> Result<IntGauge, ObsError> {
        let gauge = IntGauge::new(name, help)?;
        self.inner.registry.register(Box::new(gauge.clone()))?;
        Ok(gauge)
    }

    /// Register and return a gauge with labels.
    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec, ObsError> {
        let gauge = IntGaugeVec::new(Opts::new(name, help), labels)?;
        self.inner.registry.register(Box::new(gauge.clone()))?;
        Ok(gauge)
    }

    /// Register and return a float gauge with labels.
    pub fn float_gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> Result<prometheus::GaugeVec, ObsError> {
        let gauge = prometheus::GaugeVec::new(Opts::new(name, help), labels)?;
        self.inner.registry.register(Box::new(gauge.clone()))?;
        Ok(gauge)
    }

    /// Register and return a histogram with `buckets` (upper bounds, in the metric's unit).
    pub fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> Result<Histogram, ObsError> {
        let histogram = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?;
        self.inner.registry.register(Box::new(histogram.clone()))?;
        Ok(histogram)
    }
}

/// Set a counter to `total`, a running total kept elsewhere (a trainer's reported wait): a
/// total below the counter's value is a reset (the trainer restarted), which Prometheus'
/// `rate` handles.
pub fn mirror_counter(counter: &prometheus::Counter, total: f64) {
    let delta = total - counter.get();
    if delta >= 0.0 {
        counter.inc_by(delta);
    } else {
        counter.reset();
        counter.inc_by(total.max(0.0));
    }
}

/// Histogram buckets from 10 µs to ~10 s, for per-sample and per-batch times.
pub fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(1e-5, 2.5, 16).unwrap_or_else(|_| prometheus::DEFAULT_BUCKETS.to_vec())
}

/// Where a role serves its metrics: an address, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsListen {
    /// Serve on this address.
    On(std::net::SocketAddr),
    /// No metrics endpoint.
    Off,
}

impl std::str::FromStr for MetricsListen {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.eq_ignore_ascii_case("off") {
            return Ok(Self::Off);
        }
        text.parse().map(Self::On).map_err(|_| format!("`{text}` is not HOST:PORT (an IP address and a port, e.g. 0.0.0.0:7401) or `off`"))
    }
}

impl std::fmt::Display for MetricsListen {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::On(addr) => write!(formatter, "{addr}"),
            Self::Off => formatter.write_str("off"),
        }
    }
}

/// Logs to stderr, filtered by `filter` (a `tracing` filter such as `info` or
/// `stoker_worker=debug`; an invalid one falls back to `default`), once per process. Tests
/// pass `for_tests` so that the harness captures the output.
pub fn init_tracing(filter: Option<&str>, default: &str, for_tests: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = filter.and_then(|filter| EnvFilter::try_new(filter).ok()).unwrap_or_else(|| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second call (another test, a second import) keeps the first subscriber.
    let _ = if for_tests { builder.with_test_writer().try_init() } else { builder.try_init() };
}

#[cfg(test)]
mod tests;
