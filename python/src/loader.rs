//! `NativeLoader`: one trainer rank's [`Loader`], made safe for Python.
//!
//! * Waiting for a batch releases the GIL and wakes every 100 ms to let Python handle signals,
//!   so Ctrl-C interrupts a loop that waits for data, also one whose `KeyboardInterrupt` a
//!   finalizer swallowed (see `interrupt.rs`).
//! * Fork: the loader's background runtime has threads, and a forked child has none of them.
//!   The loader remembers the process that built it; used in another process (a PyTorch
//!   DataLoader worker forked after the loader was made), it leaves the parent's runtime alone
//!   (leaked: dropping it would wait for threads that do not exist in the child), attaches
//!   anew and continues from the position the parent had reached.

use std::time::Duration;

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use stoker_client::{Loader, LoaderConfig, LoaderState, Next};
use stoker_net::{CoordinatorAddrs, TlsSource};
use stoker_plan::ids::Epoch;
use stoker_plan::transform::TransformSpec;

use crate::batch;
use crate::errors::{self, ConfigError};
use crate::interrupt;

/// `timeout=None`: a hundred years (an `Instant` this far ahead cannot overflow).
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How long one wait for a batch lasts before Python may handle a signal.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// One rank's loader (the `stoker.Loader` class wraps it).
#[pyclass(module = "stoker._stoker")]
pub(crate) struct NativeLoader {
    config: LoaderConfig,
    /// `None` only while being rebuilt after a fork.
    inner: Option<Loader>,
    /// The process that built `inner`.
    pid: u32,
    world_size: u32,
    /// `close` was called: the loader is gone and stays gone.
    closed: bool,
    /// Where this rank's metrics are served (`metrics_port=`), in the process that built it.
    metrics_addr: Option<String>,
}

#[pymethods]
impl NativeLoader {
    #[new]
    #[pyo3(signature = (coordinator, dataset, batch_size, transforms_json, *, seed, shuffle, tail, prefetch, rank=None, world_size=None, job_name=None, run_id=None, timeout=300.0, metrics_port=None, tls_dir=None, insecure=false, max_buffered_batches=None, batch_transport="tcp"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        coordinator: &str,
        dataset: &str,
        batch_size: u32,
        transforms_json: &str,
        seed: u64,
        shuffle: &str,
        tail: &str,
        prefetch: u32,
        rank: Option<u32>,
        world_size: Option<u32>,
        job_name: Option<String>,
        run_id: Option<String>,
        timeout: Option<f64>,
        metrics_port: Option<u16>,
        tls_dir: Option<std::path::PathBuf>,
        insecure: bool,
        max_buffered_batches: Option<u32>,
        batch_transport: &str,
    ) -> PyResult<Self> {
        let mut config = LoaderConfig::new(resolve(coordinator)?, dataset, batch_size);
        config.transforms = serde_json::from_str::<TransformSpec>(transforms_json).map_err(errors::config)?;
        config.seed = seed;
        config.shuffle = shuffle.parse().map_err(errors::config)?;
        config.tail = tail.parse().map_err(errors::config)?;
        config.prefetch = prefetch;
        config.rank = rank;
        config.world_size = world_size;
        config.job_name = job_name;
        config.run_id = run_id;
        config.tls = TlsSource::from_flags(tls_dir, insecure).map_err(errors::config)?;
        config.max_buffered_batches = max_buffered_batches;
        config.batch_transport = batch_transport.parse().map_err(ConfigError::new_err)?;
        config.batch_timeout = match timeout {
            None => FOREVER,
            Some(seconds) => {
                Duration::try_from_secs_f64(seconds).ok().filter(|timeout| !timeout.is_zero() && *timeout <= FOREVER).ok_or_else(|| {
                    ConfigError::new_err(format!("timeout={seconds}: give a positive number of seconds, or None to wait forever"))
                })?
            }
        };
        let (_, world_size) = config.rank_and_world_size().map_err(errors::to_py)?;
        let mut loader = attach_interruptibly(py, &config)?;
        let metrics_addr = match metrics_port {
            Some(port) => {
                let listen = std::net::SocketAddr::from(([0, 0, 0, 0], port));
                let served = py.detach(|| loader.serve_metrics(listen)).map_err(|error| {
                    ConfigError::new_err(format!(
                        "{error}: pass another metrics_port (one per process: e.g. 9102 + LOCAL_RANK under torchrun), or 0 for any free port"
                    ))
                })?;
                Some(served.to_string())
            }
            None => None,
        };
        Ok(Self { config, inner: Some(loader), pid: std::process::id(), world_size: world_size.get(), closed: false, metrics_addr })
    }

    /// `HOST:PORT` this rank's metrics are served on, if `metrics_port` was given.
    #[getter]
    fn metrics_address(&self) -> Option<String> {
        if self.closed { None } else { self.metrics_addr.clone() }
    }

    /// Iterate `epoch` next.
    fn set_epoch(&mut self, py: Python<'_>, epoch: u64) -> PyResult<()> {
        self.loader(py)?.set_epoch(Epoch(epoch));
        Ok(())
    }

    /// Steps of an epoch for this rank, from the epoch's start (also after a resume).
    fn __len__(&mut self, py: Python<'_>) -> PyResult<usize> {
        let steps = self.loader(py)?.len().map_err(errors::to_py)?;
        usize::try_from(steps).map_err(|_| ConfigError::new_err(format!("{steps} steps do not fit a Python length")))
    }

    /// Steps of the current epoch not yielded yet.
    #[getter]
    fn steps_remaining(&mut self, py: Python<'_>) -> PyResult<u64> {
        self.loader(py)?.remaining().map_err(errors::to_py)
    }

    /// The next batch as a tuple (see `batch.rs`), or `None` at the end of the epoch.
    /// `interrupts_seen`: the SIGINT count (`interrupts()`) when the calling loop last had
    /// control; a wait that sees it moved raises `KeyboardInterrupt`.
    #[pyo3(signature = (interrupts_seen=None))]
    fn next_batch<'py>(&mut self, py: Python<'py>, interrupts_seen: Option<u64>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let loader = self.loader(py)?;
        loop {
            match py.detach(|| loader.next_within(SIGNAL_CHECK_INTERVAL)) {
                Ok(Next::Batch(received)) => return batch::to_python(py, received).map(Some),
                Ok(Next::EndOfEpoch) => return Ok(None),
                Ok(Next::Waiting) => {
                    py.check_signals()?;
                    if interrupts_seen.is_some_and(interrupt::since) {
                        return Err(PyKeyboardInterrupt::new_err("Ctrl-C while waiting for a batch"));
                    }
                }
                Err(error) => return Err(errors::to_py(error)),
            }
        }
    }

    /// The position reached, as JSON (`stoker.Loader.state_dict` parses it).
    fn state_json(&mut self, py: Python<'_>) -> PyResult<String> {
        let state = self.loader(py)?.state().map_err(errors::to_py)?;
        serde_json::to_string(&state).map_err(errors::config)
    }

    /// The position before the yielded batch of `step` (of the current epoch), as JSON: the
    /// state while that batch is handed back unused.
    fn state_before_json(&mut self, py: Python<'_>, step: u64) -> PyResult<String> {
        let state = self.loader(py)?.state_before(step).map_err(errors::to_py)?;
        serde_json::to_string(&state).map_err(errors::config)
    }

    /// Go to a global step (over all epochs from epoch 0 step 0).
    fn seek_step(&mut self, py: Python<'_>, global_step: u64) -> PyResult<()> {
        self.loader(py)?.seek_step(global_step).map_err(errors::to_py)
    }

    /// Continue from a state taken by `state_json` (possibly by another world size).
    fn load_state_json(&mut self, py: Python<'_>, json: &str) -> PyResult<()> {
        let state: LoaderState =
            serde_json::from_str(json).map_err(|error| errors::ResumeError::new_err(format!("not a Stoker loader state: {error}")))?;
        self.loader(py)?.resume(&state).map_err(errors::to_py)
    }

    /// This loader's rank.
    #[getter]
    fn rank(&mut self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.loader(py)?.rank().0)
    }

    /// Ranks in the job.
    #[getter]
    fn world_size(&self) -> u32 {
        self.world_size
    }

    /// The job's name (shared by every rank with the same settings).
    #[getter]
    fn job_name(&mut self, py: Python<'_>) -> PyResult<String> {
        Ok(self.loader(py)?.spec().name.clone())
    }

    /// Seconds spent waiting for data so far.
    #[getter]
    fn wait_seconds(&mut self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.loader(py)?.wait_seconds())
    }

    /// Batches received and not yet yielded.
    #[getter]
    fn buffered_batches(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.loader(py)?.buffered_batches())
    }

    /// Receive buffers back in the pool: a batch's buffer returns when Python dropped the
    /// last array or tensor that views it (python/tests/test_zero_copy.py checks this).
    #[getter]
    fn free_receive_buffers(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.loader(py)?.free_receive_buffers())
    }

    /// Seconds spent waiting for data since the last `set_epoch`.
    #[getter]
    fn epoch_wait_seconds(&mut self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.loader(py)?.epoch_wait_seconds())
    }

    /// The epoch iterated.
    #[getter]
    fn epoch(&mut self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.loader(py)?.epoch().0)
    }

    /// Detach from the job and free the receive buffers; the loader cannot be used again.
    fn close(&mut self, py: Python<'_>) {
        self.closed = true;
        if let Some(loader) = self.inner.take() {
            if std::process::id() == self.pid {
                py.detach(|| drop(loader));
            } else {
                // A forked child: the parent's runtime threads do not exist here.
                std::mem::forget(loader);
            }
        }
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.closed
    }
}

impl NativeLoader {
    /// The loader of this process: rebuilt once after a fork.
    fn loader(&mut self, py: Python<'_>) -> PyResult<&mut Loader> {
        if self.closed {
            return Err(errors::StokerError::new_err("the loader is closed: make a new stoker.Loader"));
        }
        let pid = std::process::id();
        if pid != self.pid || self.inner.is_none() {
            let inherited = self.inner.take();
            let state_opt = inherited.as_ref().and_then(|loader| loader.state().ok());
            // The parent's runtime threads do not exist here; dropping it would wait for them.
            std::mem::forget(inherited);
            let config = self.config.clone();
            let mut loader = py.detach(|| Loader::attach(&config)).map_err(errors::to_py)?;
            if let Some(state) = state_opt {
                loader.resume(&state).map_err(errors::to_py)?;
            }
            self.pid = pid;
            self.inner = Some(loader);
        }
        self.inner.as_mut().ok_or_else(|| errors::StokerError::new_err("the loader could not be rebuilt"))
    }
}

/// [`Loader::attach`] on a thread of its own, waited for in slices so that Python handles
/// signals between them: Ctrl-C stops a `Loader()` still connecting (to a coordinator that does
/// not answer) at once rather than after the connect timeout. An attach left behind that still
/// succeeds detaches when its loader drops on that thread.
fn attach_interruptibly(py: Python<'_>, config: &LoaderConfig) -> PyResult<Loader> {
    let (attached_tx, attached_rx) = std::sync::mpsc::sync_channel(1);
    let config = config.clone();
    std::thread::Builder::new()
        .name("stoker-attach".to_owned())
        .spawn(move || {
            let _ = attached_tx.send(Loader::attach(&config));
        })
        .map_err(|error| errors::StokerError::new_err(format!("cannot start a thread to attach: {error}")))?;
    let mut attached_rx = attached_rx;
    loop {
        // The receiver moves into the wait and back (it may be sent, not shared).
        let (received, rx) = py.detach(move || (attached_rx.recv_timeout(SIGNAL_CHECK_INTERVAL), attached_rx));
        attached_rx = rx;
        match received {
            Ok(attached) => return attached.map_err(errors::to_py),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(errors::StokerError::new_err("the attach thread stopped without an answer"));
            }
        }
    }
}

/// `HOST:PORT`, or `HOST:PORT,HOST:PORT,...` for the nodes of a replicated coordinator.
fn resolve(coordinator: &str) -> PyResult<CoordinatorAddrs> {
    CoordinatorAddrs::parse(coordinator).map_err(|error| {
        ConfigError::new_err(format!("{error}; e.g. \"127.0.0.1:7400\", or \"h1:7400,h2:7400,h3:7400\" for a replicated coordinator"))
    })
}
