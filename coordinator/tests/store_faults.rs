//! Issue 17, bad input: a corrupt store is an error naming the file; a `--peers` that disagrees
//! with the stored membership is refused saying what the store has; a coordinator alone may
//! come back on another port.

use std::collections::BTreeMap;
use std::net::UdpSocket;

use stoker_coordinator::{CoordinatorConfig, start};
use stoker_net::TlsConfigs;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

#[test]
fn a_corrupt_store_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("raft.redb"), vec![0x5a; 4096]).expect("garbage");
    let tls = TlsConfigs::insecure().expect("tls");
    let error = runtime().block_on(async {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("socket");
        start(CoordinatorConfig::new(dir.path().to_path_buf()), socket, &tls, &stoker_obs::Metrics::new()).await.expect_err("refused")
    });
    let message = error.to_string();
    assert!(message.contains("raft.redb") && message.contains("cannot open the Raft store"), "{message}");
}

#[test]
fn peers_that_disagree_with_the_stored_membership_are_refused_and_a_lone_node_may_move() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = TlsConfigs::insecure().expect("tls");
    let runtime = runtime();
    for round in 0..2 {
        // Alone, twice, on a new port each time: the same cluster of one.
        runtime.block_on(async {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("socket");
            let mut handle = start(CoordinatorConfig::new(dir.path().to_path_buf()), socket, &tls, &stoker_obs::Metrics::new())
                .await
                .unwrap_or_else(|error| panic!("round {round}: {error}"));
            assert!(handle.is_leader());
            let recorded = handle.raft().metrics().borrow().membership_config.membership().get_node(&1).map(|node| node.addr.clone());
            assert_eq!(recorded, Some(handle.local_addr().to_string()), "round {round}: the node's new address is recorded");
            handle.shutdown();
            handle.join().await;
        });
    }
    let error = runtime.block_on(async {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("socket");
        let addr = socket.local_addr().expect("address").to_string();
        let mut config = CoordinatorConfig::new(dir.path().to_path_buf());
        config.peers = BTreeMap::from([(1, addr), (2, "127.0.0.1:9".to_owned()), (3, "127.0.0.1:10".to_owned())]);
        start(config, socket, &tls, &stoker_obs::Metrics::new()).await.expect_err("refused")
    });
    let message = error.to_string();
    assert!(message.contains("says the cluster is 1=") && message.contains("--peers 1="), "{message}");
}

/// The data directory of an earlier version (`commands.jsonl`) is imported once, on the first
/// start, and its files are renamed; later starts read the Raft store only.
#[test]
fn an_old_single_node_store_is_imported_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let line = r#"{"version":1,"command":"add_dataset","dataset":{"name":"old","manifest":"/m.json","shard_counts":[3],"version":5}}"#;
    std::fs::write(dir.path().join("commands.jsonl"), format!("{line}\n")).expect("old log");
    let tls = TlsConfigs::insecure().expect("tls");
    let runtime = runtime();
    for round in 0..2 {
        let state = runtime.block_on(async {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("socket");
            let mut handle =
                start(CoordinatorConfig::new(dir.path().to_path_buf()), socket, &tls, &stoker_obs::Metrics::new()).await.expect("starts");
            let state = handle.core().state();
            handle.shutdown();
            handle.join().await;
            state
        });
        assert_eq!(state.datasets.keys().collect::<Vec<_>>(), ["old"], "round {round}");
        assert!(state.imported_legacy);
        assert!(!dir.path().join("commands.jsonl").exists() && dir.path().join("commands.jsonl.imported").exists());
    }
}
