//! Several hosts on one machine (issue 20): each host a network namespace with its own
//! address and MTU, all joined through a router namespace, with faults switchable per host:
//! delay and jitter, loss, a rate limit, and the link down (a partition) and up again.
//!
//! ```text
//!   host 1 (10.77.1.2, eth0) ── veth ── h1 (10.77.1.1) ┐
//!   host 2 (10.77.2.2, eth0) ── veth ── h2 (10.77.2.1) ├ router namespace (forwards)
//!   ...                                                ┘   └ tun0: the delay line
//! ```
//!
//! Link down and MTU are the kernel's (`ip link`). Delay, jitter, loss and rate are this
//! module's [`delay_line`]: this machine's kernel has no `netem` qdisc, so while any host is
//! impaired the router sends every forwarded packet through a TUN device, where a thread holds,
//! drops or paces it and hands it back. Without impairments packets never leave the kernel,
//! so delivery is measured on the plain veth path.
//!
//! Every name a lab makes carries this process's id, so labs of parallel tests never meet, and
//! namespaces left by a process that died are removed by the next lab. Dropping a [`Lab`] kills
//! its processes and removes its namespaces, also when a test panics. Only addresses of the
//! lab's own namespaces are used.

mod delay_line;

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use std::time::Duration;

pub use self::delay_line::Impairment;
use self::delay_line::{DelayLine, Impairments};

/// Namespaces of every lab start with this (and the owning process's id).
const PREFIX: &str = "stk-";

/// The routing table the router sends impaired traffic through (to the delay line).
const DETOUR_TABLE: &str = "177";

/// A lab's error, as text (for tests and the `netns-cluster` tool).
pub type LabError = String;

/// Why labs cannot be made on this machine (`None`: they can): iproute2 missing, or not root.
pub fn unavailable() -> Option<String> {
    if Command::new("ip").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
        return Some("iproute2 (`ip`) is not installed: `make test` installs it (apt-get install iproute2)".to_owned());
    }
    // One name per call: tests of one process ask at the same time.
    static PROBES: AtomicU32 = AtomicU32::new(0);
    let probe = format!("{PREFIX}{}-probe{}", std::process::id(), PROBES.fetch_add(1, Ordering::Relaxed));
    match run("ip", ["netns", "add", probe.as_str()]) {
        Ok(()) => {
            let _ = run("ip", ["netns", "del", probe.as_str()]);
            None
        }
        Err(error) => Some(format!("cannot create network namespaces ({error}): run as root (CI and `make test` do)")),
    }
}

/// One host of a lab.
#[derive(Clone, Debug)]
struct Host {
    name: String,
    namespace: String,
    /// 1-based: the host's address is 10.77.{index}.2.
    index: u8,
}

/// A set of hosts joined by a router, and the processes started on them.
pub struct Lab {
    router: String,
    hosts: Vec<Host>,
    children: Mutex<Vec<Child>>,
    impairments: Impairments,
    delay_line: Mutex<Option<DelayLine>>,
    mtu: u32,
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<&str> = self.hosts.iter().map(|host| host.name.as_str()).collect();
        formatter.debug_struct("Lab").field("router", &self.router).field("hosts", &hosts).field("mtu", &self.mtu).finish()
    }
}

impl Lab {
    /// Hosts named `names` (at most 200), every link at `mtu` bytes (1500, or 9000 for jumbo
    /// frames).
    pub fn new(names: &[&str], mtu: u32) -> Result<Self, LabError> {
        static LABS: AtomicU32 = AtomicU32::new(0);
        if names.is_empty() || names.len() > 200 {
            return Err(format!("a lab has 1 to 200 hosts, not {}", names.len()));
        }
        remove_stale_namespaces();
        let id = format!("{PREFIX}{}-{}", std::process::id(), LABS.fetch_add(1, Ordering::Relaxed));
        let hosts: Vec<Host> = names
            .iter()
            .enumerate()
            .map(|(i, name)| Host { name: (*name).to_owned(), namespace: format!("{id}-{}", i + 1), index: (i + 1) as u8 })
            .collect();
        let lab = Self {
            router: format!("{id}-r"),
            hosts,
            children: Mutex::new(Vec::new()),
            impairments: Impairments::default(),
            delay_line: Mutex::new(None),
            mtu,
        };
        // From here on, Drop removes whatever was made.
        lab.build()?;
        Ok(lab)
    }

    fn build(&self) -> Result<(), LabError> {
        let router = self.router.as_str();
        run("ip", ["netns", "add", router])?;
        in_ns(router, "ip", ["link", "set", "lo", "up"])?;
        set_sysctl(router, "net/ipv4/ip_forward", "1")?;
        // Packets come back from the delay line on another interface than they left by.
        set_sysctl(router, "net/ipv4/conf/all/rp_filter", "0")?;
        set_sysctl(router, "net/ipv4/conf/default/rp_filter", "0")?;
        let mtu = self.mtu.to_string();
        for host in &self.hosts {
            let (ns, veth) = (host.namespace.as_str(), format!("h{}", host.index));
            run("ip", ["netns", "add", ns])?;
            run("ip", ["link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", veth.as_str(), "netns", router])?;
            let (host_addr, router_addr) = (format!("10.77.{}.2/24", host.index), format!("10.77.{}.1/24", host.index));
            in_ns(ns, "ip", ["link", "set", "lo", "up"])?;
            in_ns(ns, "ip", ["link", "set", "eth0", "mtu", mtu.as_str(), "up"])?;
            in_ns(ns, "ip", ["addr", "add", host_addr.as_str(), "dev", "eth0"])?;
            in_ns(ns, "ip", ["route", "add", "default", "via", &format!("10.77.{}.1", host.index)])?;
            in_ns(router, "ip", ["link", "set", veth.as_str(), "mtu", mtu.as_str(), "up"])?;
            in_ns(router, "ip", ["addr", "add", router_addr.as_str(), "dev", veth.as_str()])?;
            set_sysctl(router, &format!("net/ipv4/conf/{veth}/rp_filter"), "0")?;
        }
        Ok(())
    }

    /// The address of host `name`.
    pub fn addr(&self, name: &str) -> Result<Ipv4Addr, LabError> {
        Ok(Ipv4Addr::new(10, 77, self.host(name)?.index, 2))
    }

    /// The network namespace of host `name` (for `ip netns exec`).
    pub fn namespace(&self, name: &str) -> Result<&str, LabError> {
        Ok(self.host(name)?.namespace.as_str())
    }

    /// The hosts' names, in order.
    pub fn host_names(&self) -> Vec<&str> {
        self.hosts.iter().map(|host| host.name.as_str()).collect()
    }

    fn host(&self, name: &str) -> Result<&Host, LabError> {
        self.hosts.iter().find(|host| host.name == name).ok_or_else(|| format!("no host {name:?} in this lab"))
    }

    /// A command that runs `program` on host `name` (`ip netns exec`: the same process, so its
    /// pid is the program's and `kill -9` reaches it).
    pub fn command(&self, name: &str, program: impl AsRef<OsStr>) -> Result<Command, LabError> {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", self.namespace(name)?]).arg(program);
        Ok(command)
    }

    /// Start `command` (from [`Lab::command`]); the lab kills it when dropped. Returns its pid.
    pub fn spawn(&self, mut command: Command) -> Result<u32, LabError> {
        let child = command.spawn().map_err(|error| format!("cannot start {command:?}: {error}"))?;
        let pid = child.id();
        self.children.lock().push(child);
        Ok(pid)
    }

    /// Kill `child` (started with [`Lab::spawn_owned`]) when the lab is dropped; returns its pid.
    pub fn adopt(&self, child: Child) -> u32 {
        let pid = child.id();
        self.children.lock().push(child);
        pid
    }

    /// Start `command` and hand it back (its output is the caller's to read); whatever of it
    /// still runs when the lab is dropped is killed with the lab's namespaces.
    pub fn spawn_owned(&self, mut command: Command) -> Result<Child, LabError> {
        command.spawn().map_err(|error| format!("cannot start {command:?}: {error}"))
    }

    /// Move the calling thread into host `name`'s network namespace for the rest of its life
    /// (only that thread: for a thread started to be that host, as a benchmark's sides are).
    pub fn enter(&self, name: &str) -> Result<(), LabError> {
        enter_namespace(self.namespace(name)?)
    }

    /// Run `body` on a thread inside host `name`'s network namespace: what it opens (a
    /// socket, a QUIC endpoint, a client of the coordinator) belongs to that host and stays
    /// usable from any thread afterwards.
    pub fn on_host<T, F>(&self, name: &str, body: F) -> Result<T, LabError>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        let namespace = self.namespace(name)?.to_owned();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    enter_namespace(&namespace)?;
                    Ok(body())
                })
                .join()
                .map_err(|_| format!("the thread on host {name} panicked"))?
        })
    }

    /// `kill -9` process `pid` (started by [`Lab::spawn`]) and reap it.
    pub fn kill(&self, pid: u32) -> Result<(), LabError> {
        let mut children = self.children.lock();
        let position = children.iter().position(|child| child.id() == pid).ok_or_else(|| format!("no process {pid} in this lab"))?;
        let mut child = children.remove(position);
        let killed = child.kill().map_err(|error| format!("kill -9 {pid}: {error}"));
        let _ = child.wait();
        killed
    }

    /// Take host `name`'s link down (`up == false`: the cable pulled; its packets and those to
    /// it are lost) or up again.
    pub fn set_link(&self, name: &str, up: bool) -> Result<(), LabError> {
        let veth = format!("h{}", self.host(name)?.index);
        in_ns(&self.router, "ip", ["link", "set", veth.as_str(), if up { "up" } else { "down" }])?;
        if up {
            // Coming up, the router's interface gets its connected route back by itself.
            let route = format!("10.77.{}.0/24", self.host(name)?.index);
            let _ = in_ns(&self.router, "ip", ["route", "replace", route.as_str(), "dev", veth.as_str()]);
        }
        Ok(())
    }

    /// Impair host `name`'s link (both directions); [`Impairment::default`] heals it.
    pub fn impair(&self, name: &str, impairment: Impairment) -> Result<(), LabError> {
        let index = self.host(name)?.index;
        let any = {
            let mut impaired = self.impairments.lock();
            if impairment.is_none() {
                impaired.remove(&index);
            } else {
                impaired.insert(index, impairment);
            }
            !impaired.is_empty()
        };
        self.route_through_delay_line(any)
    }

    /// Impair every host's link alike.
    pub fn impair_all(&self, impairment: Impairment) -> Result<(), LabError> {
        let names: Vec<String> = self.hosts.iter().map(|host| host.name.clone()).collect();
        for name in names {
            self.impair(&name, impairment)?;
        }
        Ok(())
    }

    /// Send forwarded packets through the delay line (`on`), or straight (`off`).
    fn route_through_delay_line(&self, on: bool) -> Result<(), LabError> {
        let mut line = self.delay_line.lock();
        match (on, line.is_some()) {
            (true, false) => {
                let started = DelayLine::start(&self.router, Arc::clone(&self.impairments.0))?;
                in_ns(&self.router, "ip", ["link", "set", "tun0", "mtu", "65000", "up"])?;
                in_ns(&self.router, "ip", ["route", "replace", "default", "dev", "tun0", "table", DETOUR_TABLE])?;
                for host in &self.hosts {
                    let veth = format!("h{}", host.index);
                    in_ns(&self.router, "ip", ["rule", "add", "iif", veth.as_str(), "lookup", DETOUR_TABLE, "priority", "100"])?;
                }
                *line = Some(started);
            }
            (false, true) => {
                for host in &self.hosts {
                    let veth = format!("h{}", host.index);
                    let _ = in_ns(&self.router, "ip", ["rule", "del", "iif", veth.as_str(), "lookup", DETOUR_TABLE, "priority", "100"]);
                }
                if let Some(stopped) = line.take() {
                    stopped.stop();
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Packets the delay line dropped for loss or a full queue, and forwarded.
    pub fn delay_line_counts(&self) -> (u64, u64) {
        self.delay_line.lock().as_ref().map_or((0, 0), DelayLine::counts)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Processes first: a process in a removed namespace would live on, unreachable.
        for mut child in self.children.lock().drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(line) = self.delay_line.lock().take() {
            line.stop();
        }
        kill_processes_in(self.hosts.iter().map(|host| host.namespace.as_str()).chain([self.router.as_str()]));
        for namespace in self.hosts.iter().map(|host| host.namespace.as_str()).chain([self.router.as_str()]) {
            let _ = run("ip", ["netns", "del", namespace]);
        }
    }
}

/// Move the calling thread (only it) into network namespace `namespace`: sockets it opens
/// from then on are that host's.
fn enter_namespace(namespace: &str) -> Result<(), LabError> {
    let path = format!("/run/netns/{namespace}");
    let netns = std::fs::File::open(&path).map_err(|error| format!("cannot open {path}: {error}"))?;
    // SAFETY: setns on a valid namespace fd; it changes only this thread's network namespace.
    if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&netns), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("cannot enter {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Kill whatever still runs in `namespaces` (processes a test started itself and lost track of).
fn kill_processes_in<'a>(namespaces: impl Iterator<Item = &'a str>) {
    for namespace in namespaces {
        if let Ok(output) = Command::new("ip").args(["netns", "pids", namespace]).output() {
            for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
    }
}

/// Remove namespaces of labs whose process is gone (a test killed before its Drop ran).
fn remove_stale_namespaces() {
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else { return };
    let listed = String::from_utf8_lossy(&output.stdout);
    let stale: Vec<&str> = listed
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| {
            let owner = name.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()).and_then(|pid| pid.parse::<u32>().ok());
            owner.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect();
    kill_processes_in(stale.iter().copied());
    for name in stale {
        let _ = run("ip", ["netns", "del", name]);
    }
}

fn run<I, S>(program: &str, args: I) -> Result<(), LabError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<S> = args.into_iter().collect();
    let output = Command::new(program).args(&args).output().map_err(|error| format!("cannot run {program}: {error}"))?;
    if output.status.success() {
        return Ok(());
    }
    let shown: Vec<String> = args.iter().map(|arg| arg.as_ref().to_string_lossy().into_owned()).collect();
    Err(format!("`{program} {}` failed: {}", shown.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
}

fn in_ns<I, S>(namespace: &str, program: &str, args: I) -> Result<(), LabError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut all: Vec<std::ffi::OsString> = ["netns", "exec", namespace, program].iter().map(Into::into).collect();
    all.extend(args.into_iter().map(|arg| arg.as_ref().to_owned()));
    run("ip", all)
}

/// Set `/proc/sys/{key}` to `value` in `namespace` (no `sysctl` binary needed: procps may be
/// missing where iproute2 is not).
fn set_sysctl(namespace: &str, key: &str, value: &str) -> Result<(), LabError> {
    in_ns(namespace, "sh", ["-c", &format!("echo {value} > /proc/sys/{key}")])
}

/// How long to wait for something in a lab, polling every 100 ms (bounded, as every test loop).
pub fn wait_for(within: Duration, what: &str, mut done: impl FnMut() -> bool) -> Result<(), LabError> {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        if std::time::Instant::now() >= deadline {
            return Err(format!("{what}: not within {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
