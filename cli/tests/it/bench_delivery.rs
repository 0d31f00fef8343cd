//! `stoker bench delivery` runs every variant end to end and reports numbers for each.

use std::process::Command;

fn stoker() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoker"))
}

#[test]
fn bench_delivery_measures_every_variant_and_refuses_an_empty_selection() {
    let output =
        stoker().args(["bench", "delivery", "--seconds", "0.3", "--batch-size", "4", "--size", "128", "--json"]).output().expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(report["batch_bytes"], 4 * 128 * 128 * 3);
    let variants = report["variants"].as_array().expect("variants");
    let names: Vec<&str> = variants.iter().filter_map(|variant| variant["name"].as_str()).collect();
    assert_eq!(names.len(), 11, "{names:?}");
    assert!(names[0].starts_with("tcp") && names[1].contains("rustls's stream") && names[2].contains("rustls unbuffered"), "{names:?}");
    assert!(names[3].starts_with("bulk"), "{names:?}");
    assert!(names[9].contains("mutual TLS") && names[10].contains("--max-udp-payload 65527"), "{names:?}");
    for variant in variants {
        for key in [
            "gigabytes_per_sec",
            "send_cpu_seconds_per_gb",
            "receive_cpu_seconds_per_gb",
            "receive_cpu_ms_per_batch",
            "machine_cpu_seconds_per_gb",
        ] {
            let value = variant[key].as_f64().unwrap_or(0.0);
            assert!(value > 0.0 && value.is_finite(), "{}: {key} = {value}", variant["name"]);
        }
        assert!(variant["batches"].as_u64().unwrap_or(0) > 0, "{variant}");
    }
    let none = stoker().args(["bench", "delivery", "--only", "no such variant"]).output().expect("run");
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no variant"), "{}", String::from_utf8_lossy(&none.stderr));
}

/// Issue 20: `--netns` measures between two hosts (network namespaces at MTU 9000 here), TCP
/// and QUIC alike, with the larger datagrams the MTU carries as a variant of its own; the
/// namespaces are gone afterwards.
#[test]
fn bench_delivery_measures_between_two_hosts_with_netns() {
    if let Some(reason) = stoker_testkit::netns::unavailable() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "the network-namespace tests cannot run under CI: {reason}");
        eprintln!("skipped: {reason}");
        return;
    }
    let child = stoker()
        .args(["bench", "delivery", "--netns", "--mtu", "9000", "--seconds", "0.3", "--batch-size", "4", "--size", "128", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    let pid = child.id();
    let output = child.wait_with_output().expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(report["path"], "between two hosts (network namespaces, MTU 9000)");
    let variants = report["variants"].as_array().expect("variants");
    let names: Vec<&str> = variants.iter().filter_map(|variant| variant["name"].as_str()).collect();
    assert!(names.last().is_some_and(|name| name.contains("--max-udp-payload 8952")), "{names:?}");
    for variant in variants {
        assert!(variant["gigabytes_per_sec"].as_f64().unwrap_or(0.0) > 0.0, "{variant}");
    }
    let namespaces = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    let mine = format!("stk-{pid}-");
    assert!(!String::from_utf8_lossy(&namespaces.stdout).contains(&mine), "the benchmark left its namespaces behind");
}
