//! The delay line: what `tc netem` would do, in user space (this machine's kernel has no
//! netem). A TUN device `tun0` in the router namespace receives every forwarded packet while a
//! host is impaired; one thread reads them, drops some (loss), paces each host's link (rate),
//! holds each for its delay (plus jitter, without reordering a flow) and writes it back, and
//! the router forwards it on. Delay and loss apply per host, in both directions: a packet
//! between two impaired hosts gets both hosts' delay and either's loss.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::LabError;

/// Longest a packet may wait for its link's rate before it is dropped (a full queue).
const QUEUE_LIMIT: Duration = Duration::from_millis(200);

/// `TUNSETIFF` (`_IOW('T', 202, int)`) and its flags, from `linux/if_tun.h`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// What is wrong with one host's link, in each direction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Impairment {
    /// Added to every packet to or from the host: between two hosts with 1.25 ms each, a
    /// packet waits 2.5 ms each way, a round trip 5 ms.
    pub delay: Duration,
    /// Each packet's delay varies by up to this, either way (a flow is never reordered).
    pub jitter: Duration,
    /// Packets lost, in percent.
    pub loss_percent: f64,
    /// The link's rate in bits per second (0: unlimited).
    pub rate_bits_per_sec: u64,
}

impl Impairment {
    /// Whether nothing is impaired.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }
}

/// The impairments of a lab's hosts, by host index, shared with its delay line.
#[derive(Clone, Debug, Default)]
pub(super) struct Impairments(pub(super) Arc<Mutex<BTreeMap<u8, Impairment>>>);

impl Impairments {
    pub(super) fn lock(&self) -> MutexGuard<'_, BTreeMap<u8, Impairment>> {
        self.0.lock()
    }
}

/// The running delay line.
#[derive(Debug)]
pub(super) struct DelayLine {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    dropped: Arc<AtomicU64>,
    forwarded: Arc<AtomicU64>,
}

impl DelayLine {
    /// Make `tun0` in namespace `router` and start forwarding through it.
    pub(super) fn start(router: &str, impairments: Arc<Mutex<BTreeMap<u8, Impairment>>>) -> Result<Self, LabError> {
        let (stop, dropped, forwarded) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let namespace = router.to_owned();
        let thread = {
            let (stop, dropped, forwarded) = (Arc::clone(&stop), Arc::clone(&dropped), Arc::clone(&forwarded));
            std::thread::Builder::new()
                .name("delay-line".to_owned())
                .spawn(move || match open_tun_in(&namespace) {
                    Ok(tun) => {
                        let _ = ready_tx.send(Ok(()));
                        forward(&tun, &impairments, &stop, &dropped, &forwarded);
                    }
                    Err(error) => {
                        let _ = ready_tx.send(Err(error));
                    }
                })
                .map_err(|error| format!("cannot start the delay line: {error}"))?
        };
        ready_rx.recv_timeout(Duration::from_secs(5)).map_err(|_| "the delay line did not start".to_owned())??;
        Ok(Self { stop, thread: Some(thread), dropped, forwarded })
    }

    /// Packets dropped, and forwarded.
    pub(super) fn counts(&self) -> (u64, u64) {
        (self.dropped.load(Ordering::Relaxed), self.forwarded.load(Ordering::Relaxed))
    }

    /// Stop forwarding; `tun0` goes with the thread's file descriptor.
    pub(super) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Enter `namespace` (this thread only) and open a TUN device `tun0` there, non-blocking.
fn open_tun_in(namespace: &str) -> Result<OwnedFd, LabError> {
    super::enter_namespace(namespace)?;
    // SAFETY: a plain open(2) of a NUL-terminated path.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(format!("cannot open /dev/net/tun: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just opened and is owned here alone.
    let tun = unsafe { OwnedFd::from_raw_fd(fd) };
    // struct ifreq: a 16-byte name, then the flags (a short) in the union.
    let mut request = [0u8; 40];
    request[..4].copy_from_slice(b"tun0");
    request[16..18].copy_from_slice(&(IFF_TUN | IFF_NO_PI).to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which `request` is laid out as.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, request.as_mut_ptr()) } != 0 {
        return Err(format!("cannot make tun0: {}", std::io::Error::last_os_error()));
    }
    Ok(tun)
}

/// A host index from an IPv4 packet's address 10.77.{index}.2 (0: not a lab host).
fn host_of(address: &[u8]) -> u8 {
    match address {
        [10, 77, index, 2] => *index,
        _ => 0,
    }
}

/// One packet waiting for its time.
type Waiting = Reverse<(Instant, u64, Vec<u8>)>;

fn forward(tun: &OwnedFd, impairments: &Mutex<BTreeMap<u8, Impairment>>, stop: &AtomicBool, dropped: &AtomicU64, forwarded: &AtomicU64) {
    let mut queue: BinaryHeap<Waiting> = BinaryHeap::new();
    // Per host and direction (true: leaving the host), when its link is free again.
    let mut link_free: HashMap<(u8, bool), Instant> = HashMap::new();
    // Per (from, to), the last packet's time: jitter never reorders a flow.
    let mut last: HashMap<(u8, u8), Instant> = HashMap::new();
    let mut random = Random::seeded();
    let mut sequence = 0u64;
    let mut buffer = vec![0u8; 65_536];
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        let wait = queue.peek().map_or(Duration::from_millis(50), |Reverse((due, _, _))| due.saturating_duration_since(now));
        let mut poll = libc::pollfd { fd: tun.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let timeout = wait.min(Duration::from_millis(50)).as_micros().div_ceil(1000) as libc::c_int;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll, 1, timeout) };
        let table = impairments.lock().clone();
        for _ in 0..256 {
            // SAFETY: reading into a buffer of its own length.
            let read = unsafe { libc::read(tun.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
            let Ok(len) = usize::try_from(read) else { break };
            if len < 20 || buffer[0] >> 4 != 4 {
                continue;
            }
            let now = Instant::now();
            let (from, to) = (host_of(&buffer[12..16]), host_of(&buffer[16..20]));
            let (sending, receiving) = (table.get(&from).copied().unwrap_or_default(), table.get(&to).copied().unwrap_or_default());
            let kept = (1.0 - sending.loss_percent / 100.0) * (1.0 - receiving.loss_percent / 100.0);
            if random.unit() >= kept {
                dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let mut departs = now;
            let mut full = false;
            for (impairment, link) in [(sending, (from, true)), (receiving, (to, false))] {
                if impairment.rate_bits_per_sec == 0 {
                    continue;
                }
                let start = departs.max(link_free.get(&link).copied().unwrap_or(now));
                if start.saturating_duration_since(now) > QUEUE_LIMIT {
                    full = true;
                    break;
                }
                let bits = len as f64 * 8.0;
                departs = start + Duration::from_secs_f64(bits / impairment.rate_bits_per_sec as f64);
                link_free.insert(link, departs);
            }
            if full {
                dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let delay = random.jittered(sending.delay, sending.jitter) + random.jittered(receiving.delay, receiving.jitter);
            let due = (departs + delay).max(last.get(&(from, to)).copied().unwrap_or(now));
            last.insert((from, to), due);
            sequence += 1;
            queue.push(Reverse((due, sequence, buffer[..len].to_vec())));
        }
        let now = Instant::now();
        while queue.peek().is_some_and(|Reverse((due, _, _))| *due <= now) {
            let Some(Reverse((_, _, packet))) = queue.pop() else { break };
            // SAFETY: writing a packet from a buffer of its own length.
            unsafe { libc::write(tun.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
            forwarded.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// xorshift64*: loss and jitter need no more.
struct Random(u64);

impl Random {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |since| since.as_nanos() as u64);
        Self(nanos | 1)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `delay` moved by up to `jitter` either way, never below zero.
    fn jittered(&mut self, delay: Duration, jitter: Duration) -> Duration {
        if jitter.is_zero() {
            return delay;
        }
        let offset = (self.unit() * 2.0 - 1.0) * jitter.as_secs_f64();
        Duration::from_secs_f64((delay.as_secs_f64() + offset).max(0.0))
    }
}
