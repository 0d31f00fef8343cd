//! Issue 20: real `stoker` processes on separate hosts (network namespaces joined by a
//! router, `stoker_testkit::netns`), with faults on the wire: delay and loss on every link, a
//! worker host cut off, a trainer host's link down, workers killed over and over, the
//! coordinator cut off, and the leader of three coordinators cut off (a minority). In each, two trainer ranks on two hosts see every step once and in
//! order and every key once per epoch.
//!
//! They need root (network namespaces). Without it they say why and skip, except under CI
//! (`CI=true`), where a skip would hide them: there they fail.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stoker_net::{QuicCoordinator, Role};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::{ClusterStatus, ControlRequest, ControlResponse};
use stoker_testkit::netns::{Impairment, Lab};

use crate::support::{assert_two_ranks_saw_every_key_once_in, local_ca, local_tls, path_str};

/// The coordinator's port on its host (every host has its own ports).
const COORDINATOR_PORT: u16 = 7000;
/// Each worker's batch port on its host.
const WORKER_PORT: u16 = 7100;

/// The coordinator hosts of a cluster of `count` coordinators: `coordinator`, or
/// `coordinator-1` to `coordinator-N` for a replicated one (N = their Raft node ids).
fn coordinator_hosts(count: usize) -> Vec<String> {
    if count == 1 { vec!["coordinator".to_owned()] } else { (1..=count).map(|id| format!("coordinator-{id}")).collect() }
}

/// A lab of coordinator, `worker-N` and `trainer-N` hosts, or `None` (said why) where this
/// machine cannot make one.
fn lab_or_skip(coordinators: usize, workers: usize, trainers: usize) -> Option<Lab> {
    if let Some(reason) = stoker_testkit::netns::unavailable() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "the network-namespace tests cannot run under CI: {reason}");
        eprintln!("skipped: {reason}");
        return None;
    }
    let mut names = coordinator_hosts(coordinators);
    names.extend((0..workers).map(|i| format!("worker-{i}")));
    names.extend((0..trainers).map(|i| format!("trainer-{i}")));
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Some(Lab::new(&names, 1500).expect("lab"))
}

/// A cluster on a lab: the coordinator (or each of a replicated cluster's) on its host, a
/// worker on each worker host.
struct NetCluster {
    lab: Lab,
    dir: PathBuf,
    /// The coordinators' addresses, comma-separated (as `--coordinator` takes them).
    coordinator: String,
    /// The coordinator hosts.
    coordinator_hosts: Vec<String>,
    /// Each worker host's running process.
    workers: Vec<Option<u32>>,
}

impl NetCluster {
    fn start(name: &str, workers: usize, trainers: usize) -> Option<Self> {
        Self::start_with(name, 1, workers, trainers)
    }

    /// With `coordinators` > 1, a Raft cluster of that many coordinators, one per host.
    fn start_with(name: &str, coordinators: usize, workers: usize, trainers: usize) -> Option<Self> {
        let lab = lab_or_skip(coordinators, workers, trainers)?;
        let dir = stoker_testkit::unique_temp_dir(name).expect("temp dir");
        let manifest = stoker_testkit::sample_dataset(&dir, 6, 20, 64 << 10).expect("dataset");
        let coordinator_hosts = coordinator_hosts(coordinators);
        let addrs: Vec<String> =
            coordinator_hosts.iter().map(|host| format!("{}:{COORDINATOR_PORT}", lab.addr(host).expect("address"))).collect();
        let peers: Vec<String> = addrs.iter().enumerate().map(|(index, addr)| format!("{}={addr}", index + 1)).collect();
        let mut cluster = Self { lab, dir, coordinator: addrs.join(","), coordinator_hosts, workers: vec![None; workers] };
        for (index, host) in cluster.coordinator_hosts.clone().iter().enumerate() {
            let data_dir = cluster.dir.join(host);
            let mut args = vec!["coordinator", "--listen", &addrs[index], "--data-dir", path_str(&data_dir), "--lease-ttl-ms", "1500"];
            let (id, peers) = ((index + 1).to_string(), peers.join(","));
            if coordinators > 1 {
                args.extend(["--node-id", &id, "--peers", &peers]);
            }
            cluster.start_node(host, &args);
        }
        if coordinators > 1 {
            stoker_testkit::netns::wait_for(Duration::from_secs(20), "a leader", || cluster.leader().is_some()).expect("a leader");
        }
        let added = cluster
            .stoker(&cluster.coordinator_hosts[0])
            .args(["dataset", "add", "train", path_str(&manifest), "--coordinator", &cluster.coordinator])
            .output()
            .expect("dataset add");
        assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
        for index in 0..workers {
            cluster.start_worker(index);
        }
        Some(cluster)
    }

    /// `stoker` on `host`, with the tests' local CA.
    fn stoker(&self, host: &str) -> Command {
        let mut command = self.lab.command(host, env!("CARGO_BIN_EXE_stoker")).expect("host");
        command.env("STOKER_METRICS_LISTEN", "127.0.0.1:0").env("STOKER_LOCAL_CA", local_ca()).env_remove("STOKER_TLS_DIR");
        command
    }

    /// Start a node on `host` and wait for its "listening on" line; returns its pid.
    fn start_node(&self, host: &str, args: &[&str]) -> u32 {
        let mut command = self.stoker(host);
        command.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = self.lab.spawn_owned(command).expect("spawn");
        let stderr = child.stderr.take().expect("stderr");
        let (line_tx, line_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on") {
                    let _ = line_tx.send(());
                }
            }
        });
        let pid = self.lab.adopt(child);
        line_rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("{host}: {args:?} did not start listening"));
        pid
    }

    fn start_worker(&mut self, index: usize) {
        let host = format!("worker-{index}");
        let listen = format!("{}:{WORKER_PORT}", self.lab.addr(&host).expect("address"));
        let pid = self.start_node(&host, &["worker", "--coordinator", &self.coordinator.clone(), "--listen", &listen, "--threads", "1"]);
        self.workers[index] = Some(pid);
    }

    fn kill_worker(&mut self, index: usize) {
        if let Some(pid) = self.workers[index].take() {
            self.lab.kill(pid).expect("kill -9");
        }
    }

    /// Rank 0 on `trainer-0` and rank 1 on `trainer-1` consume `epochs` epochs of 15 batches
    /// of 4 at `rate` batches a second, writing their keys as they go (for
    /// [`Self::keys_seen`] and [`assert_two_ranks_saw_every_key_once_in`]).
    fn consumers(&self, rate: &str, epochs: u32) -> Vec<Child> {
        (0..2)
            .map(|rank| {
                let keys = self.dir.join(format!("keys-{rank}.txt"));
                let mut command = self.stoker(&format!("trainer-{rank}"));
                command
                    .args(["consume", "--coordinator", &self.coordinator, "--dataset", "train", "--world-size", "2", "--batch-size", "4"])
                    .args(["--rank", &rank.to_string(), "--epochs", &epochs.to_string(), "--size", "32", "--tail", "partial"])
                    .args(["--shuffle", "full"])
                    .args(["--prefetch", "4", "--rate", rate, "--keys-out", path_str(&keys)])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                self.lab.spawn_owned(command).expect("consume")
            })
            .collect()
    }

    /// Wait (at most `timeout`) for the consumers of `epochs` epochs to finish, each with
    /// success (the same process throughout: a consumer never restarts), then check what they
    /// saw.
    fn finish(&self, consumers: Vec<Child>, epochs: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for mut consumer in consumers {
            let status = loop {
                if let Some(status) = consumer.try_wait().expect("wait") {
                    break status;
                }
                if Instant::now() >= deadline {
                    let _ = consumer.kill();
                    panic!("a trainer did not finish within {timeout:?}");
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(&mut consumer.stderr.take().expect("stderr"), &mut stderr);
            assert!(status.success(), "a trainer failed: {stderr}");
        }
        assert_two_ranks_saw_every_key_once_in(&self.dir, epochs);
    }

    /// A client of the coordinator on the coordinator's host, as an operator's would be.
    fn probe(&self) -> Probe {
        let coordinator = self.coordinator.parse().expect("address");
        self.lab
            .on_host("coordinator", move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                let client = {
                    let _guard = runtime.enter();
                    QuicCoordinator::new(coordinator, &local_tls(Role::Admin)).expect("client")
                };
                Probe { runtime, client }
            })
            .expect("probe")
    }

    /// The Raft role coordinator host `host` reports of itself (asked from `trainer-0`, whose
    /// link the tests that use this leave up), or `None` when it does not answer within 3 s.
    fn role_of(&self, host: &str) -> Option<String> {
        let addr = format!("{}:{COORDINATOR_PORT}", self.lab.addr(host).ok()?).parse().ok()?;
        self.lab
            .on_host("trainer-0", move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
                let _guard = runtime.enter();
                let client = QuicCoordinator::new(addr, &local_tls(Role::Admin)).ok()?;
                let answer = runtime.block_on(tokio::time::timeout(Duration::from_secs(3), client.call(ControlRequest::NodeStatus)));
                client.close();
                match answer {
                    Ok(Ok(ControlResponse::NodeStatus { node })) => Some(node.role),
                    _ => None,
                }
            })
            .ok()
            .flatten()
    }

    /// The coordinator host that says it leads, if one does.
    fn leader(&self) -> Option<String> {
        self.coordinator_hosts.iter().find(|host| self.role_of(host).as_deref() == Some("leader")).cloned()
    }

    /// Keys seen so far by rank `rank` (lines of its keys file).
    fn keys_seen(&self, rank: u32) -> usize {
        std::fs::read_to_string(self.dir.join(format!("keys-{rank}.txt"))).map_or(0, |text| text.lines().count())
    }

    fn wait_until_both_ranks_saw(&self, keys: usize) {
        stoker_testkit::netns::wait_for(Duration::from_secs(60), "the ranks' first batches", || {
            self.keys_seen(0) >= keys && self.keys_seen(1) >= keys
        })
        .expect("progress");
    }

    /// Keys each rank has seen so far.
    fn progress(&self) -> [usize; 2] {
        [self.keys_seen(0), self.keys_seen(1)]
    }
}

/// The fault must have struck while training ran: every consumer is still running.
fn assert_still_running(consumers: &mut [Child], when: &str) {
    for consumer in consumers {
        assert!(consumer.try_wait().expect("wait").is_none(), "training had ended {when}: the fault struck nothing");
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The coordinator's status, asked from its host.
struct Probe {
    runtime: tokio::runtime::Runtime,
    client: QuicCoordinator,
}

impl Probe {
    fn status(&self) -> Option<ClusterStatus> {
        match self.runtime.block_on(self.client.call(ControlRequest::Status)) {
            Ok(ControlResponse::Status { status }) => Some(status),
            _ => None,
        }
    }

    /// Chunks the worker at `addr` holds leases on now.
    fn chunks_held(&self, addr: &str) -> u32 {
        self.status().map_or(0, |status| {
            status
                .workers
                .iter()
                .filter(|worker| worker.info.addr.to_string() == addr && worker.alive)
                .map(|worker| worker.chunks_in_flight)
                .sum()
        })
    }
}

#[test]
fn two_epochs_cross_links_with_a_5_ms_round_trip_and_1_percent_loss() {
    let Some(cluster) = NetCluster::start("stoker-netns-lossy", 2, 2) else { return };
    // 1.25 ms on each host's link: 2.5 ms each way between two hosts, a 5 ms round trip.
    let lossy = Impairment { delay: Duration::from_micros(1250), loss_percent: 1.0, ..Impairment::default() };
    cluster.lab.impair_all(lossy).expect("impair");
    let consumers = cluster.consumers("1000", 2);
    cluster.finish(consumers, 2, Duration::from_secs(120));
    let (dropped, forwarded) = cluster.lab.delay_line_counts();
    eprintln!("delay line: {forwarded} packets forwarded, {dropped} dropped");
    assert!(dropped > 0 && forwarded > 100 * dropped / 4, "the links lost {dropped} of {forwarded} packets: not ~1% per link");
}

#[test]
fn a_worker_host_cut_off_for_10_s_is_replaced_and_gets_work_again_after_healing() {
    let Some(cluster) = NetCluster::start("stoker-netns-cutoff", 2, 2) else { return };
    let probe = cluster.probe();
    let victim = format!("{}:{WORKER_PORT}", cluster.lab.addr("worker-0").expect("address"));
    // 3 epochs of 15 steps at 2 batches a second: ~22 s, longer than the cut-off.
    let mut consumers = cluster.consumers("2", 3);
    cluster.wait_until_both_ranks_saw(4);
    let at_cut = cluster.progress();
    cluster.lab.set_link("worker-0", false).expect("cut off");
    std::thread::sleep(Duration::from_secs(10));
    let at_heal = cluster.progress();
    assert_still_running(&mut consumers, "before the link came back");
    // The cut-off worker's leases expired (TTL 1.5 s) and the other worker made its steps:
    // both ranks went on while it was away (10 s at 2 batches a second is 80 keys).
    for rank in 0..2 {
        assert!(at_heal[rank] >= at_cut[rank] + 24, "rank {rank} stalled while worker-0 was cut off: {at_cut:?} -> {at_heal:?}");
    }
    cluster.lab.set_link("worker-0", true).expect("heal");
    cluster.finish(consumers, 3, Duration::from_secs(120));
    // Healed, the worker registers again and is granted chunks when there is work.
    let healed = Instant::now();
    let alive = |status: &ClusterStatus| status.workers.iter().any(|worker| worker.info.addr.to_string() == victim && worker.alive);
    stoker_testkit::netns::wait_for(Duration::from_secs(30), "the healed worker alive again", || {
        probe.status().is_some_and(|status| alive(&status))
    })
    .expect("rejoined");
    eprintln!("the healed worker was alive again {:.1} s after the link came up", healed.elapsed().as_secs_f64());
    let more = cluster.consumers("5", 2);
    let mut held = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while held == 0 && Instant::now() < deadline {
        held = probe.chunks_held(&victim);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(held > 0, "the worker cut off and healed never got work again");
    for mut consumer in more {
        let _ = consumer.kill();
        let _ = consumer.wait();
    }
}

#[test]
fn a_trainer_host_whose_link_goes_down_for_3_s_resumes_without_loss_or_repeat() {
    let Some(cluster) = NetCluster::start("stoker-netns-trainer-link", 2, 2) else { return };
    // 3 epochs at 5 batches a second: 9 s.
    let mut consumers = cluster.consumers("5", 3);
    cluster.wait_until_both_ranks_saw(8);
    cluster.lab.set_link("trainer-0", false).expect("down");
    std::thread::sleep(Duration::from_secs(3));
    assert_still_running(&mut consumers, "before the trainer's link came back");
    let at_up = cluster.progress();
    cluster.lab.set_link("trainer-0", true).expect("up");
    stoker_testkit::netns::wait_for(Duration::from_secs(60), "rank 0 receives again", || cluster.keys_seen(0) > at_up[0]).expect("resumed");
    // `finish` requires each consumer to be the same process throughout and to succeed.
    cluster.finish(consumers, 3, Duration::from_secs(120));
}

#[test]
fn workers_killed_every_5_s_through_three_epochs_while_new_ones_start_lose_and_repeat_nothing() {
    let Some(mut cluster) = NetCluster::start("stoker-netns-churn", 2, 2) else { return };
    // 3 epochs of 15 steps at 2 batches a second: ~22 s, four kills 5 s apart.
    let mut consumers = cluster.consumers("2", 3);
    cluster.wait_until_both_ranks_saw(4);
    for round in 0..4 {
        let index = round % 2;
        assert_still_running(&mut consumers, &format!("before kill {round}"));
        cluster.kill_worker(index);
        cluster.start_worker(index);
        std::thread::sleep(Duration::from_secs(5));
    }
    cluster.finish(consumers, 3, Duration::from_secs(120));
}

#[test]
fn a_coordinator_cut_off_for_5_s_pauses_training_which_resumes_by_itself() {
    let Some(cluster) = NetCluster::start("stoker-netns-coordinator-cut", 2, 2) else { return };
    // 3 epochs at 4 batches a second: ~11 s.
    let mut consumers = cluster.consumers("4", 3);
    cluster.wait_until_both_ranks_saw(8);
    let at_cut = cluster.progress();
    cluster.lab.set_link("coordinator", false).expect("cut off");
    std::thread::sleep(Duration::from_secs(5));
    let at_heal = cluster.progress();
    assert_still_running(&mut consumers, "before the coordinator came back");
    // Paused: without the coordinator nothing new is granted; a rank consumes at most what its
    // window had granted (prefetch 4 steps, one chunk more in flight) of the 20 batches 5 s
    // at 4 a second would be.
    for rank in 0..2 {
        assert!(at_heal[rank] <= at_cut[rank] + 4 * 8, "rank {rank} did not pause without the coordinator: {at_cut:?} -> {at_heal:?}");
    }
    cluster.lab.set_link("coordinator", true).expect("heal");
    cluster.finish(consumers, 3, Duration::from_secs(120));
}

#[test]
fn the_leader_of_three_coordinators_cut_off_is_a_minority_and_training_goes_on() {
    let Some(cluster) = NetCluster::start_with("stoker-netns-raft-minority", 3, 2, 2) else { return };
    // 4 epochs at 3 batches a second: ~20 s.
    let mut consumers = cluster.consumers("3", 4);
    cluster.wait_until_both_ranks_saw(8);
    // Asked again until one answers that it leads (an answer can be slow on a busy machine).
    let mut leader_opt = None;
    stoker_testkit::netns::wait_for(Duration::from_secs(20), "a leader", || {
        leader_opt = cluster.leader();
        leader_opt.is_some()
    })
    .expect("a leader");
    let old_leader = leader_opt.expect("a leader");
    let at_cut = cluster.progress();
    let cut = Instant::now();
    cluster.lab.set_link(&old_leader, false).expect("cut off");
    // The other two are a majority: one of them leads, and workers and trainers move to it.
    let others: Vec<&String> = cluster.coordinator_hosts.iter().filter(|host| **host != old_leader).collect();
    stoker_testkit::netns::wait_for(Duration::from_secs(10), "a leader among the majority", || {
        others.iter().any(|host| cluster.role_of(host).as_deref() == Some("leader"))
    })
    .expect("a new leader");
    let elected = cut.elapsed();
    // Training goes on while the old leader is still cut off: past what the ranks' windows held
    // at the cut (prefetch 4 steps and a chunk in flight: 32 keys), which without a coordinator
    // is where they pause (the single-coordinator test).
    stoker_testkit::netns::wait_for(Duration::from_secs(20), "both ranks past their windows without the old leader", || {
        let now = cluster.progress();
        (0..2).all(|rank| now[rank] > at_cut[rank] + 4 * 8 + 8)
    })
    .expect("training went on");
    eprintln!(
        "a new leader {:.1} s after the cut; training past the windows {:.1} s after it",
        elected.as_secs_f64(),
        cut.elapsed().as_secs_f64()
    );
    assert_still_running(&mut consumers, "before the old leader came back");
    cluster.lab.set_link(&old_leader, true).expect("heal");
    // Healed, the old leader learns the new term and follows.
    stoker_testkit::netns::wait_for(Duration::from_secs(30), "the old leader follows", || {
        cluster.role_of(&old_leader).as_deref() == Some("follower")
    })
    .expect("the old leader follows");
    cluster.finish(consumers, 4, Duration::from_secs(120));
}
