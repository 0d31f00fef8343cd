//! [`QuicCoordinator`] against fake coordinator nodes over real QUIC on loopback: each node
//! answers by a rule of its own (the leader, a follower naming it, a node in an election).

use std::net::UdpSocket;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::{Tuning, serve_calls, server_endpoint};

/// How a fake node answers its `n`th request (counted from 0).
type Rule = Arc<dyn Fn(usize) -> Result<ControlResponse, RemoteError> + Send + Sync>;

/// A fake coordinator node on `127.0.0.1`, serving until the test's runtime ends.
struct FakeNode {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl FakeNode {
    fn start(tls: &TlsConfigs, rule: Rule) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
        let endpoint = server_endpoint(socket, tls, Tuning::default()).expect("a server endpoint");
        let addr = endpoint.local_addr().expect("an address");
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&requests);
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let Ok(connection) = incoming.await else { continue };
                let (rule, counter) = (Arc::clone(&rule), Arc::clone(&counter));
                tokio::spawn(serve_calls(connection, crate::ServeLimits::new(CONTROL_FRAME_LIMIT), move |_request: ControlRequest| {
                    let answer = rule(counter.fetch_add(1, Ordering::SeqCst));
                    async move { answer }
                }));
            }
        });
        Self { addr, requests }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn leader() -> Rule {
    Arc::new(|_| Ok(ControlResponse::Datasets { datasets: Vec::new() }))
}

fn follower(hint: Option<SocketAddr>) -> Rule {
    Arc::new(move |_| Err(RemoteError::new(ErrorCode::NotLeader { leader_hint: hint }, "not the leader")))
}

fn unavailable() -> Rule {
    Arc::new(|_| Err(RemoteError::new(ErrorCode::Unavailable, "shutting down")))
}

fn client(tls: &TlsConfigs, nodes: &[&FakeNode]) -> QuicCoordinator {
    let addrs = CoordinatorAddrs::from_addrs(nodes.iter().map(|node| node.addr)).expect("some addresses");
    QuicCoordinator::with_addrs(addrs, tls).expect("a client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_follows_the_hint_to_the_leader_and_starts_there_next_time() {
    let tls = TlsConfigs::insecure().expect("tls");
    let leader = FakeNode::start(&tls, leader());
    let named = FakeNode::start(&tls, follower(Some(leader.addr)));
    let electing = FakeNode::start(&tls, follower(None));
    let coordinator = client(&tls, &[&named, &electing, &leader]);
    coordinator.call(ControlRequest::ListDatasets).await.expect("the leader answers");
    assert_eq!((named.requests(), electing.requests(), leader.requests()), (1, 0, 1));
    assert_eq!(coordinator.addr(), leader.addr);
    coordinator.call(ControlRequest::ListDatasets).await.expect("the leader answers");
    assert_eq!((named.requests(), electing.requests(), leader.requests()), (1, 0, 2), "straight to the leader");
    coordinator.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_leader_is_learned_from_a_hint() {
    let tls = TlsConfigs::insecure().expect("tls");
    let leader = FakeNode::start(&tls, leader());
    let named = FakeNode::start(&tls, follower(Some(leader.addr)));
    let coordinator = client(&tls, &[&named]);
    coordinator.call(ControlRequest::ListDatasets).await.expect("the leader answers");
    assert_eq!(coordinator.addrs(), vec![named.addr, leader.addr]);
    assert_eq!(coordinator.addr(), leader.addr);
    coordinator.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_waited_out_with_a_backoff() {
    let tls = TlsConfigs::insecure().expect("tls");
    let answer = leader();
    let node = FakeNode::start(&tls, Arc::new(move |n| if n < 2 { follower(None)(n) } else { answer(n) }));
    let coordinator = client(&tls, &[&node]);
    let started = Instant::now();
    coordinator.call(ControlRequest::ListDatasets).await.expect("answered once elected");
    assert_eq!(node.requests(), 3);
    assert!(started.elapsed() >= Duration::from_millis(150), "paused 50 + 100 ms: {:?}", started.elapsed());
    coordinator.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_node_is_skipped_when_there_are_others() {
    let tls = TlsConfigs::insecure().expect("tls");
    let down = FakeNode::start(&tls, unavailable());
    let leader = FakeNode::start(&tls, leader());
    let coordinator = client(&tls, &[&down, &leader]);
    coordinator.call(ControlRequest::ListDatasets).await.expect("the other node answers");
    assert_eq!((down.requests(), leader.requests()), (1, 1));
    coordinator.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_unavailable_node_is_reported_at_once() {
    let tls = TlsConfigs::insecure().expect("tls");
    let down = FakeNode::start(&tls, unavailable());
    let coordinator = client(&tls, &[&down]);
    let error = coordinator.call(ControlRequest::ListDatasets).await.expect_err("unavailable");
    assert_eq!(error.code, ErrorCode::Unavailable);
    assert_eq!(error.message, "shutting down", "the node's own error, untouched");
    assert_eq!(down.requests(), 1);
    coordinator.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_gives_up_after_the_failover_timeout_with_the_last_error() {
    let tls = TlsConfigs::insecure().expect("tls");
    let first = FakeNode::start(&tls, follower(None));
    let second = FakeNode::start(&tls, follower(None));
    let mut coordinator = client(&tls, &[&first, &second]);
    coordinator.set_failover_timeout(Duration::from_millis(400));
    let started = Instant::now();
    let error = coordinator.call(ControlRequest::ListDatasets).await.expect_err("no leader");
    let elapsed = started.elapsed();
    assert_eq!(error.code, ErrorCode::NotLeader { leader_hint: None });
    assert!(error.message.contains("no coordinator leader answered"), "{}", error.message);
    assert!(elapsed >= Duration::from_millis(400) && elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert!(first.requests() >= 2 && second.requests() >= 2, "both tried: {} and {}", first.requests(), second.requests());
    coordinator.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_down_is_skipped_after_a_short_connect_timeout() {
    let tls = TlsConfigs::insecure().expect("tls");
    let dead = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket").local_addr().expect("an address");
    let leader = FakeNode::start(&tls, leader());
    let addrs = CoordinatorAddrs::from_addrs([dead, leader.addr]).expect("some addresses");
    let coordinator = QuicCoordinator::with_addrs(addrs, &tls).expect("a client");
    let started = Instant::now();
    coordinator.call(ControlRequest::ListDatasets).await.expect("the live node answers");
    assert!(started.elapsed() < FAILOVER_CALL_TIMEOUT + Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(coordinator.addr(), leader.addr);
    coordinator.close();
}
