//! `stoker bench delivery`: batch delivery to one trainer over one connection, on loopback or
//! (`--netns`) between two hosts made of network namespaces: over bulk connections (TLS over
//! TCP) and QUIC through the same functions the worker and the client use, and over rustls's
//! own TLS stream to show why bulk connections do their own records. Sender and receiver each
//! run on a thread of their own (a single-threaded runtime where async), so each side's CPU
//! time is its thread's; plain TCP over the same path, one thread per side, is the baseline of
//! the same run. Machine CPU (all cores, from `/proc/stat`) is reported too: on one machine the
//! kernel's receive work for a packet often runs on the sending thread.
//!
//! * [`tcp`]: plain TCP, rustls's stream, bulk connections.
//! * [`unbuffered`]: rustls's unbuffered API as the record layer (what bulk connections could
//!   use instead of their own).
//! * [`quic`]: QUIC, from quinn's defaults to what Stoker ships.

mod quic;
mod tcp;
mod unbuffered;

use clap::Args;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use stoker_net::{CERT_VALIDITY, ClusterCa, LOOPBACK_UDP_PAYLOAD, Role, TlsConfigs, Tuning, Validity, mutual_tls};
use stoker_plan::ids::{Epoch, JobId, Position, Rank, Step};
use stoker_plan::transform::{OutputDtype, OutputLayout};
use stoker_proto::{ALPN, BatchHeader};

use stoker_testkit::netns::Lab;

#[derive(Debug, Args)]
pub(crate) struct BenchDeliveryArgs {
    /// Samples per batch (the batch is BATCH_SIZE x SIZE x SIZE x 3 bytes).
    #[arg(long, default_value_t = 256)]
    pub(crate) batch_size: u32,
    /// Image side.
    #[arg(long, default_value_t = 224)]
    pub(crate) size: u32,
    /// Seconds to measure each variant, after one second of warm-up.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) seconds: f64,
    /// Also measure Stoker's settings with this largest UDP payload [default: 65527 on
    /// loopback; with --netns, what --mtu carries (MTU - 48: 8952 at 9000) when above 1500].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1200..=65527))]
    pub(crate) max_udp_payload: Option<u16>,
    /// Measure between two hosts instead of on loopback: the sender and the receiver each in a
    /// network namespace of its own, joined by veth links through a router at --mtu (needs
    /// root; the namespaces are removed afterwards).
    #[arg(long)]
    pub(crate) netns: bool,
    /// The links' MTU with --netns (1500; 9000 for jumbo frames, with --max-udp-payload 8952).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1280..=65000))]
    pub(crate) mtu: u32,
    /// Run only the variants whose name contains this (e.g. `bulk`, `tcp`, `rustls`, `defaults`, `pool`).
    #[arg(long, value_name = "TEXT")]
    pub(crate) only: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Batches a worker has in flight to one trainer at once (its default `in_flight` is 4).
const IN_FLIGHT: usize = 4;
/// A batch not acknowledged within this long fails the benchmark's send (as a worker's would).
const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// One way of moving batches, and how it is measured.
#[derive(Clone, Debug)]
struct Variant {
    name: String,
    transport: Transport,
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Tcp,
    /// rustls's own TLS stream over TCP (`rustls::StreamOwned`), mutual TLS.
    RustlsTcp,
    /// rustls's unbuffered API over TCP, mutual TLS.
    RustlsUnbuffered,
    /// A bulk connection (`stoker_net::bulk`): what workers and trainers use.
    Bulk,
    Quic {
        tuning: Tuning,
        /// Copy each payload into a fresh buffer before sending (what `write_all` of a slice
        /// does inside quinn), instead of handing quinn the batch's own memory.
        copy_send: bool,
        pool_keep: usize,
        /// Both ends present certificates of a cluster CA and check each other's (as deployed),
        /// instead of `--insecure`'s unchecked self-signed certificate.
        mutual: bool,
    },
}

/// What one variant did in its measured interval.
#[derive(Debug, serde::Serialize)]
struct Measured {
    name: String,
    gigabytes_per_sec: f64,
    send_cpu_seconds_per_gb: f64,
    receive_cpu_seconds_per_gb: f64,
    /// The receiver's CPU per batch, in milliseconds: what a trainer spends on each.
    receive_cpu_ms_per_batch: f64,
    /// CPU of the whole machine (every core, kernel work included) per GB.
    machine_cpu_seconds_per_gb: f64,
    batches: u64,
}

/// Where the two sides run: both on loopback, or each on a host of a lab.
struct Place {
    /// The lab, kept for the run (its namespaces go when it is dropped).
    lab_opt: Option<Arc<Lab>>,
    /// The sender's address.
    sender_ip: Ipv4Addr,
}

impl Place {
    fn loopback() -> Self {
        Self { lab_opt: None, sender_ip: Ipv4Addr::LOCALHOST }
    }

    fn hosts(mtu: u32) -> anyhow::Result<Self> {
        if let Some(reason) = stoker_testkit::netns::unavailable() {
            bail!("--netns: {reason}");
        }
        let lab = Lab::new(&[SENDER_HOST, RECEIVER_HOST], mtu).map_err(anyhow::Error::msg)?;
        let sender_ip = lab.addr(SENDER_HOST).map_err(anyhow::Error::msg)?;
        Ok(Self { lab_opt: Some(Arc::new(lab)), sender_ip })
    }

    /// Move the calling thread (a side's own) onto `host`, if the sides run on hosts.
    fn enter(&self, host: &str) -> anyhow::Result<()> {
        match &self.lab_opt {
            Some(lab) => lab.enter(host).map_err(anyhow::Error::msg),
            None => Ok(()),
        }
    }

    /// The start of a sender's thread: reports the thread (for its CPU time) and enters the
    /// sender's host.
    fn enter_sender(&self, tids: &mpsc::Sender<TidReport>) -> anyhow::Result<()> {
        let _ = tids.send((SENDER, current_tid()));
        self.enter(SENDER_HOST)
    }

    /// The start of a receiver's thread: reports the thread, enters the receiver's host and
    /// waits for the address the sender listens on.
    fn enter_receiver(&self, tids: &mpsc::Sender<TidReport>, sender_addr: &mpsc::Receiver<SocketAddr>) -> anyhow::Result<SocketAddr> {
        let _ = tids.send((RECEIVER, current_tid()));
        self.enter(RECEIVER_HOST)?;
        sender_addr.recv_timeout(Duration::from_secs(10)).context("the sender did not listen")
    }

    fn describe(&self, mtu: u32) -> String {
        if self.lab_opt.is_some() { format!("between two hosts (network namespaces, MTU {mtu})") } else { "on loopback".to_owned() }
    }
}

/// The lab hosts of `--netns`.
const SENDER_HOST: &str = "worker";
const RECEIVER_HOST: &str = "trainer";

pub(crate) fn run(args: BenchDeliveryArgs) -> anyhow::Result<ExitCode> {
    if args.seconds <= 0.0 || args.batch_size == 0 || args.size == 0 {
        bail!("--seconds, --batch-size and --size must be positive");
    }
    let header = bench_header(args.batch_size, args.size);
    let payload = Bytes::from(payload(header.payload_len as usize));
    let header = BatchHeader { checksum: xxhash_rust::xxh3::xxh3_64(&payload), ..header };
    let variants = variants(&args);
    if variants.is_empty() {
        bail!("no variant's name contains {:?}", args.only.unwrap_or_default());
    }
    let place = Arc::new(if args.netns { Place::hosts(args.mtu)? } else { Place::loopback() });
    let mut results = Vec::new();
    for variant in variants {
        if !args.json {
            eprintln!("{} ...", variant.name);
        }
        let measured = measure(&variant, &header, &payload, &args, &place).with_context(|| format!("variant {:?}", variant.name))?;
        results.push(measured);
    }
    if args.json {
        let tcp = results.first().map(|tcp| tcp.receive_cpu_seconds_per_gb);
        let value = serde_json::json!({
            "batch_bytes": header.payload_len,
            "path": place.describe(args.mtu),
            "seconds_per_variant": args.seconds,
            "variants": results,
            "tcp_receive_cpu_seconds_per_gb": tcp,
        });
        #[allow(clippy::print_stdout)]
        {
            println!("{value}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    print_table(&results, header.payload_len, &place.describe(args.mtu));
    Ok(ExitCode::SUCCESS)
}

/// Plain TCP, then QUIC from quinn's defaults to what Stoker ships, one change at a time.
fn variants(args: &BenchDeliveryArgs) -> Vec<Variant> {
    let quinn_defaults = Tuning { batch_windows: false, socket_buffer: 0, ..Tuning::default() };
    let windows = Tuning { socket_buffer: 0, ..Tuning::default() };
    let shipped = Tuning::default();
    let quic = |name: &str, tuning, copy_send, pool_keep| Variant {
        name: name.to_owned(),
        transport: Transport::Quic { tuning, copy_send, pool_keep, mutual: false },
    };
    let mutual = |name: &str, tuning| Variant {
        name: name.to_owned(),
        transport: Transport::Quic { tuning, copy_send: false, pool_keep: IN_FLIGHT, mutual: true },
    };
    let mut list = vec![
        Variant { name: "tcp (baseline)".into(), transport: Transport::Tcp },
        Variant { name: "tls over tcp, rustls's stream".into(), transport: Transport::RustlsTcp },
        Variant { name: "tls over tcp, rustls unbuffered".into(), transport: Transport::RustlsUnbuffered },
        Variant { name: "bulk: tls over tcp, own records (default)".into(), transport: Transport::Bulk },
        quic("quic, quinn defaults", quinn_defaults, true, 0),
        quic("  + batch windows", windows, true, 0),
        quic("  + zero-copy send", windows, false, 0),
        quic("  + payload pool", windows, false, IN_FLIGHT),
        quic("  + 8 MiB socket buffers (--insecure)", shipped, false, IN_FLIGHT),
        mutual("  + mutual TLS (--batch-transport quic)", shipped),
    ];
    let path_carries = if args.netns { u16::try_from(args.mtu.saturating_sub(48)).unwrap_or(u16::MAX) } else { LOOPBACK_UDP_PAYLOAD };
    let larger = args.max_udp_payload.unwrap_or(path_carries);
    if larger != shipped.max_udp_payload {
        let large = Tuning { max_udp_payload: larger, ..shipped };
        list.push(mutual(&format!("  + --max-udp-payload {larger}"), large));
    }
    if let Some(only) = &args.only {
        list.retain(|variant| variant.name.contains(only.as_str()));
    }
    list
}

fn bench_header(batch_size: u32, size: u32) -> BatchHeader {
    let samples = batch_size as usize;
    BatchHeader {
        job: JobId(1),
        epoch: Epoch(0),
        start: Position(0),
        rank: Rank(0),
        step: Step(0),
        shape: [batch_size, size, size, 3],
        dtype: OutputDtype::U8,
        layout: OutputLayout::Nhwc,
        labels: (0..samples as i64).collect(),
        keys: (0..samples).map(|index| format!("train/{index:08}")).collect(),
        replaced: Vec::new(),
        corrupt: Vec::new(),
        dataset_version: 0,
        plan_digest: 0,
        payload_len: u64::from(batch_size) * u64::from(size) * u64::from(size) * 3,
        checksum: 0,
    }
}

/// Bytes that do not compress or repeat (QUIC does not compress, but no shortcuts anywhere).
fn payload(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Shared between a variant's two threads and the measuring thread.
#[derive(Default)]
struct Progress {
    bytes: AtomicU64,
    batches: AtomicU64,
    /// Batches that failed to arrive intact.
    failed: AtomicU64,
    stop: AtomicBool,
}

impl Progress {
    fn arrived(&self, bytes: usize) {
        self.bytes.fetch_add(bytes as u64, Ordering::AcqRel);
        self.batches.fetch_add(1, Ordering::AcqRel);
    }

    /// An I/O error is the end of the run once we are stopping, a failure before.
    fn finish(&self, result: anyhow::Result<()>) -> anyhow::Result<()> {
        if self.stop.load(Ordering::Acquire) { Ok(()) } else { result }
    }
}

/// Which side a thread is, when it reports its thread id.
type TidReport = (usize, anyhow::Result<u32>);
const SENDER: usize = 0;
const RECEIVER: usize = 1;

/// Run `variant` until one second of warm-up and `args.seconds` of measurement have passed.
fn measure(
    variant: &Variant,
    header: &BatchHeader,
    payload: &Bytes,
    args: &BenchDeliveryArgs,
    place: &Arc<Place>,
) -> anyhow::Result<Measured> {
    let progress = Arc::new(Progress::default());
    let (tid_tx, tid_rx) = mpsc::channel::<TidReport>();
    let (sender, receiver) = match variant.transport {
        Transport::Tcp => tcp::start_plain(header, payload, &progress, tid_tx, place)?,
        Transport::RustlsTcp => tcp::start_rustls(header, payload, &progress, tid_tx, place)?,
        Transport::RustlsUnbuffered => unbuffered::start_unbuffered(header, payload, &progress, tid_tx, place)?,
        Transport::Bulk => tcp::start_bulk(header, payload, &progress, tid_tx, place)?,
        Transport::Quic { tuning, copy_send, pool_keep, mutual } => {
            let (sender_tls, receiver_tls) = if mutual { mutual_pair()? } else { (TlsConfigs::insecure()?, TlsConfigs::insecure()?) };
            let quic = quic::Quic { tuning, copy_send, pool_keep, sender_tls, receiver_tls };
            quic::start(quic, header, payload, &progress, tid_tx, place)?
        }
    };
    let mut tids = [0u32; 2];
    for _ in 0..2 {
        let (side, tid) = tid_rx.recv_timeout(Duration::from_secs(10)).context("a side did not start")?;
        tids[side] = tid?;
    }
    let outcome = measure_running(&progress, &tids, args.seconds);
    progress.stop.store(true, Ordering::Release);
    for (side, handle) in [("sender", sender), ("receiver", receiver)] {
        match handle.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => bail!("{side}: {error:#}"),
            Err(_) => bail!("{side} panicked"),
        }
    }
    let Interval { gigabytes, seconds, send_cpu, receive_cpu, machine_cpu, batches } = outcome?;
    Ok(Measured {
        name: variant.name.clone(),
        gigabytes_per_sec: gigabytes / seconds,
        send_cpu_seconds_per_gb: send_cpu / gigabytes,
        receive_cpu_seconds_per_gb: receive_cpu / gigabytes,
        receive_cpu_ms_per_batch: if batches == 0 { f64::NAN } else { receive_cpu * 1e3 / batches as f64 },
        machine_cpu_seconds_per_gb: machine_cpu / gigabytes,
        batches,
    })
}

/// What the measured interval saw.
struct Interval {
    gigabytes: f64,
    seconds: f64,
    /// CPU-seconds of the sender's and the receiver's threads, and of the whole machine.
    send_cpu: f64,
    receive_cpu: f64,
    machine_cpu: f64,
    batches: u64,
}

/// Measure `seconds` after a second of warm-up; `tids` are the sender's and the receiver's
/// thread ids.
fn measure_running(progress: &Progress, tids: &[u32; 2], seconds: f64) -> anyhow::Result<Interval> {
    let warm_up = Instant::now() + Duration::from_secs(1);
    while Instant::now() < warm_up {
        std::thread::sleep(Duration::from_millis(20));
    }
    if progress.batches.load(Ordering::Acquire) == 0 {
        bail!("no batch arrived within the first second");
    }
    let start = (Instant::now(), progress.bytes.load(Ordering::Acquire), progress.batches.load(Ordering::Acquire));
    let cpu_start = [thread_cpu_seconds(tids[0])?, thread_cpu_seconds(tids[1])?, machine_cpu_seconds()?];
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let cpu_end = [thread_cpu_seconds(tids[0])?, thread_cpu_seconds(tids[1])?, machine_cpu_seconds()?];
    let (bytes, batches) = (progress.bytes.load(Ordering::Acquire), progress.batches.load(Ordering::Acquire));
    let failed = progress.failed.load(Ordering::Acquire);
    if failed > 0 {
        bail!("{failed} batch(es) did not arrive intact");
    }
    let elapsed = start.0.elapsed().as_secs_f64();
    let gigabytes = (bytes - start.1) as f64 / 1e9;
    if gigabytes <= 0.0 {
        bail!("nothing was delivered in {elapsed:.1} s");
    }
    Ok(Interval {
        gigabytes,
        seconds: elapsed,
        send_cpu: cpu_end[0] - cpu_start[0],
        receive_cpu: cpu_end[1] - cpu_start[1],
        machine_cpu: cpu_end[2] - cpu_start[2],
        batches: batches - start.2,
    })
}

/// CPU-seconds the whole machine has been busy (every core; user, system, interrupts), from
/// `/proc/stat` (in USER_HZ ticks: 100 a second on Linux).
fn machine_cpu_seconds() -> anyhow::Result<f64> {
    let text = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let line = text.lines().find(|line| line.starts_with("cpu ")).context("no cpu line in /proc/stat")?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|field| field.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let busy: u64 = ticks.iter().take(8).enumerate().filter(|(index, _)| *index != 3 && *index != 4).map(|(_, ticks)| ticks).sum();
    Ok(busy as f64 / 100.0)
}

/// The calling thread's id, for [`thread_cpu_seconds`].
fn current_tid() -> anyhow::Result<u32> {
    let link = std::fs::read_link("/proc/thread-self").context("/proc/thread-self (Linux only)")?;
    let tid = link.file_name().and_then(|name| name.to_str()).and_then(|name| name.parse().ok());
    tid.with_context(|| format!("unexpected /proc/thread-self -> {}", link.display()))
}

/// CPU time a thread of this process has used so far (scheduler statistics, nanoseconds).
fn thread_cpu_seconds(tid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/self/task/{tid}/schedstat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let nanos: u64 = text.split_whitespace().next().and_then(|field| field.parse().ok()).with_context(|| format!("unexpected {path}"))?;
    Ok(nanos as f64 / 1e9)
}

type Sides = (JoinHandle<anyhow::Result<()>>, JoinHandle<anyhow::Result<()>>);

fn spawn_side<F>(name: &str, side: F) -> anyhow::Result<JoinHandle<anyhow::Result<()>>>
where
    F: FnOnce() -> anyhow::Result<()> + Send + 'static,
{
    std::thread::Builder::new().name(name.to_owned()).spawn(side).context("cannot start a thread")
}

fn single_thread_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start a runtime")
}

/// A worker's and a trainer's TLS configs from a fresh cluster CA, as a deployed cluster has.
fn mutual_pair() -> anyhow::Result<(TlsConfigs, TlsConfigs)> {
    let ca = ClusterCa::generate("bench CA", Validity::from_now(CERT_VALIDITY))?;
    let configs = |role: Role| -> anyhow::Result<TlsConfigs> {
        let issued =
            ca.issue(role, &format!("bench-{role}"), (role == Role::Coordinator).then_some(1), &[], Validity::from_now(CERT_VALIDITY))?;
        Ok(mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, None, ALPN)?)
    };
    Ok((configs(Role::Worker)?, configs(Role::Trainer)?))
}

fn print_table(results: &[Measured], batch_bytes: u64, path: &str) {
    let tcp_opt = results.first();
    eprintln!();
    eprintln!("batches of {:.1} MB, one connection {path}; CPU is each side's thread", batch_bytes as f64 / 1e6);
    eprintln!(
        "{:<48} {:>7} {:>10} {:>10} {:>9} {:>13} {:>12}",
        "variant", "GB/s", "send s/GB", "recv s/GB", "recv/tcp", "recv ms/batch", "machine s/GB"
    );
    for result in results {
        let ratio = tcp_opt.map(|tcp| result.receive_cpu_seconds_per_gb / tcp.receive_cpu_seconds_per_gb).unwrap_or(f64::NAN);
        eprintln!(
            "{:<48} {:>7.2} {:>10.3} {:>10.3} {:>8.2}x {:>13.2} {:>12.3}",
            result.name,
            result.gigabytes_per_sec,
            result.send_cpu_seconds_per_gb,
            result.receive_cpu_seconds_per_gb,
            ratio,
            result.receive_cpu_ms_per_batch,
            result.machine_cpu_seconds_per_gb
        );
    }
}
