use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// One blocking HTTP exchange with the server: the status line and the body.
fn get(addr: std::net::SocketAddr, request: &[u8]) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("timeout");
    stream.write_all(request).expect("writes");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("reads");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

#[test]
fn the_endpoint_serves_metrics_health_and_readiness() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let metrics = Metrics::for_role("test").expect("registry");
    let served = metrics.counter("stoker_test_things_total", "Things.").expect("counter");
    served.inc_by(3);
    let refreshed = metrics.gauge("stoker_test_refreshed", "Set at scrape time.").expect("gauge");
    metrics.on_scrape(move || refreshed.set(7));
    let ready = Arc::new(AtomicBool::new(false));
    let check = Arc::clone(&ready);
    metrics.set_readiness(move || if check.load(Ordering::Acquire) { Ok(()) } else { Err("not registered yet".into()) });
    let server = runtime.block_on(serve("127.0.0.1:0".parse().expect("addr"), metrics)).expect("serves");
    let addr = server.local_addr();
    let request = |path: &str| {
        let text = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        runtime.block_on(async move { tokio::task::spawn_blocking(move || get(addr, text.as_bytes())).await.expect("joins") })
    };

    let (status, body) = request("/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("stoker_test_things_total 3"), "{body}");
    assert!(body.contains("stoker_test_refreshed 7"), "{body}");
    assert!(body.contains("stoker_build_info{role=\"test\""), "{body}");
    if cfg!(target_os = "linux") {
        assert!(body.contains("process_resident_memory_bytes"), "{body}");
        assert!(body.contains("process_cpu_seconds_total"), "{body}");
    }
    assert_eq!(request("/healthz").0, "HTTP/1.1 200 OK");
    let (status, body) = request("/readyz");
    assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
    assert!(body.contains("not registered yet"), "{body}");
    ready.store(true, Ordering::Release);
    assert_eq!(request("/readyz").0, "HTTP/1.1 200 OK");
    assert_eq!(request("/nothing").0, "HTTP/1.1 404 Not Found");

    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    let (status, _) =
        runtime.block_on(async move { tokio::task::spawn_blocking(move || get(addr, huge.as_bytes())).await.expect("joins") });
    assert_eq!(status, "HTTP/1.1 400 Bad Request");
}

#[test]
fn a_busy_port_is_an_error_that_names_the_address() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let addr = taken.local_addr().expect("addr");
    let error = runtime.block_on(serve(addr, Metrics::new())).expect_err("the port is taken");
    assert!(error.to_string().contains(&addr.to_string()), "{error}");
}

#[test]
fn a_mirrored_counter_follows_its_total_and_resets() {
    let counter = prometheus::Counter::new("stoker_test_seconds_total", "x").expect("counter");
    mirror_counter(&counter, 2.5);
    mirror_counter(&counter, 4.0);
    assert_eq!(counter.get(), 4.0);
    mirror_counter(&counter, 1.0);
    assert_eq!(counter.get(), 1.0);
}

#[test]
fn metrics_listen_parses_addresses_and_off() {
    assert_eq!("off".parse::<MetricsListen>(), Ok(MetricsListen::Off));
    assert_eq!("127.0.0.1:7401".parse::<MetricsListen>(), Ok(MetricsListen::On("127.0.0.1:7401".parse().expect("addr"))));
    let error = "localhost".parse::<MetricsListen>().expect_err("no port");
    assert!(error.contains("off"), "{error}");
}

/// Issue 31, item 5: silent connections (more than the old 32 slots shared by everyone) do not
/// keep the kubelet's probes from an answer: a probe is answered within a second while 40 are
/// open, and connections over the per-address bound are closed at once.
#[test]
fn probes_are_answered_while_silent_connections_hold_the_port() {
    use std::time::{Duration, Instant};

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let metrics = Metrics::for_role("test").expect("registry");
    let server = runtime.block_on(serve("127.0.0.1:0".parse().expect("addr"), metrics)).expect("serves");
    let addr = server.local_addr();
    // Silent peers on other loopback addresses: each as many as its address may hold, and one
    // more, which is closed at once.
    let mut silent = Vec::new();
    let mut refused = Vec::new();
    for peer in 2..7u8 {
        for index in 0..=http::MAX_CONNECTIONS_PER_ADDRESS {
            let stream = runtime.block_on(async {
                let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                socket.bind(std::net::SocketAddr::from(([127, 0, 0, peer], 0))).expect("bind a loopback address");
                socket.connect(addr).await.expect("connects").into_std().expect("a std stream")
            });
            stream.set_nonblocking(false).expect("blocking");
            if index < http::MAX_CONNECTIONS_PER_ADDRESS { silent.push(stream) } else { refused.push(stream) }
        }
    }
    assert!(silent.len() > 32, "more silent connections than the slots once shared by all");
    let probed = Instant::now();
    let (status, body) = runtime.block_on(async move {
        tokio::task::spawn_blocking(move || get(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")).await.expect("joins")
    });
    let waited = probed.elapsed();
    assert_eq!((status.as_str(), body.as_str()), ("HTTP/1.1 200 OK", "ok\n"));
    assert!(waited < Duration::from_secs(1), "the probe was answered after {waited:?}");
    for mut stream in refused {
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut byte = [0u8; 1];
        let closed = matches!(stream.read(&mut byte), Ok(0) | Err(_));
        assert!(closed, "a connection over its address's bound is closed, unanswered");
    }
    drop(silent);
}

/// Issue 31, item 5: with a scrape token, `/metrics` answers only a scraper that presents it
/// (Prometheus's `authorization.credentials_file`); probes need none.
#[test]
fn a_scrape_token_guards_the_metrics_but_not_the_probes() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let dir = std::env::temp_dir().join(format!("stoker-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("token");
    std::fs::write(&file, "short\n").expect("write");
    assert!(ScrapeToken::from_file(&file).is_err_and(|error| error.to_string().contains("openssl rand")));
    std::fs::write(&file, "0123456789abcdef0123456789abcdef\n").expect("write");
    let metrics = Metrics::for_role("test").expect("registry");
    metrics.require_token(ScrapeToken::from_file(&file).expect("a token"));
    let server = runtime.block_on(serve("127.0.0.1:0".parse().expect("addr"), metrics)).expect("serves");
    let addr = server.local_addr();
    let request = |head: String| {
        runtime.block_on(async move { tokio::task::spawn_blocking(move || get(addr, head.as_bytes())).await.expect("joins") })
    };
    assert_eq!(request("GET /metrics HTTP/1.1\r\n\r\n".to_owned()).0, "HTTP/1.1 401 Unauthorized");
    assert_eq!(
        request("GET /metrics HTTP/1.1\r\nAuthorization: Bearer wrong-token-wrong-token\r\n\r\n".to_owned()).0,
        "HTTP/1.1 401 Unauthorized"
    );
    let (status, body) = request("GET /metrics HTTP/1.1\r\nAuthorization: Bearer 0123456789abcdef0123456789abcdef\r\n\r\n".to_owned());
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("stoker_build_info"), "{body}");
    assert_eq!(request("GET /healthz HTTP/1.1\r\n\r\n".to_owned()).0, "HTTP/1.1 200 OK");
    let _ = std::fs::remove_dir_all(&dir);
}
