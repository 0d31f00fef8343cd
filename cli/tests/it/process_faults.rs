//! Real processes, killed for real (STYLE G12 tier 4): a coordinator and two workers as
//! `stoker` processes, two `stoker consume` trainer processes; one worker is `kill -9`ed by
//! PID while it holds a lease, and every sample still arrives exactly once per epoch.

use std::time::{Duration, Instant};

use stoker_net::{QuicCoordinator, Role};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::{ControlRequest, ControlResponse};

use crate::support::{
    assert_two_ranks_saw_every_key_once, local_tls, spawn_two_consumers, start_node, stoker_command as stoker, wait_for_consumers,
};

/// Chunks `worker_addr` holds, asked of the coordinator over one connection kept open: a
/// chunk of this small dataset is held for milliseconds, so polling must be fast.
struct LeaseProbe {
    runtime: tokio::runtime::Runtime,
    coordinator: QuicCoordinator,
}

impl LeaseProbe {
    fn new(coordinator: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let addr = coordinator.parse().expect("coordinator address");
        let coordinator = {
            let _guard = runtime.enter();
            QuicCoordinator::new(addr, &local_tls(Role::Admin)).expect("coordinator client")
        };
        Self { runtime, coordinator }
    }

    fn chunks_held(&self, worker_addr: &str) -> u32 {
        let answer = self.runtime.block_on(self.coordinator.call(ControlRequest::Status));
        let Ok(ControlResponse::Status { status }) = answer else { return 0 };
        status.workers.iter().filter(|worker| worker.info.addr.to_string() == worker_addr).map(|worker| worker.chunks_in_flight).sum()
    }
}

/// `kill -9` of a worker process mid-epoch: its leases expire, other workers make its chunks,
/// and both trainer processes still see every step once and in order, every key once.
#[test]
fn a_worker_process_killed_with_sigkill_loses_no_sample() {
    let dir = stoker_testkit::unique_temp_dir("stoker-process-faults").expect("temp dir");
    let manifest = stoker_testkit::sample_dataset(&dir, 6, 20, 64 << 10).expect("dataset");
    let data_dir = dir.join("coordinator");
    let (_coordinator, coordinator) =
        start_node(&["coordinator", "--listen", "127.0.0.1:0", "--data-dir", data_dir.to_str().expect("utf-8"), "--lease-ttl-ms", "1500"]);
    let added =
        stoker().args(["dataset", "add", "train", manifest.to_str().expect("utf-8"), "--coordinator", &coordinator]).output().expect("add");
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    let (mut victim, victim_addr) = start_node(&["worker", "--coordinator", &coordinator, "--listen", "127.0.0.2:0", "--threads", "1"]);
    let (_survivor, _) = start_node(&["worker", "--coordinator", &coordinator, "--listen", "127.0.0.3:0", "--threads", "1"]);
    let consumers = spawn_two_consumers(&coordinator, &dir, "20");
    let probe = LeaseProbe::new(&coordinator);
    let deadline = Instant::now() + Duration::from_secs(30);
    while probe.chunks_held(&victim_addr) == 0 {
        assert!(Instant::now() < deadline, "the victim never held a lease");
        std::thread::park_timeout(Duration::from_millis(1));
    }
    victim.0.kill().expect("kill -9");
    let _ = victim.0.wait();
    wait_for_consumers(consumers, Duration::from_secs(90));
    assert_two_ranks_saw_every_key_once(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}
