//! `stoker certs` and coordinator certificates bound to their Raft node id (issue 31, item 4):
//! `--node-id` is required for a coordinator certificate and refused for the others, and a
//! coordinator refuses to start with a certificate of another node id.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::support::stoker_command;

fn stoker(args: &[&str]) -> Output {
    stoker_command().args(args).output().expect("run stoker")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn issue(ca: &Path, out: &Path, extra: &[&str]) -> Output {
    let (ca, out) = (ca.to_str().expect("path"), out.to_str().expect("path"));
    let mut args = vec!["certs", "issue", "--dir", ca, "--name", "c", "--out", out];
    args.extend_from_slice(extra);
    stoker(&args)
}

#[test]
fn a_coordinator_certificate_names_its_node_id_and_only_that_node_starts_with_it() {
    let root = tempfile::tempdir().expect("temp dir");
    let ca = root.path().join("ca");
    let made = stoker(&["certs", "init", "--dir", ca.to_str().expect("path")]);
    assert!(made.status.success(), "{}", stderr(&made));

    let missing = issue(&ca, &root.path().join("none"), &["--role", "coordinator"]);
    assert!(!missing.status.success(), "a coordinator certificate without --node-id was issued");
    assert!(stderr(&missing).contains("--role coordinator needs --node-id N"), "{}", stderr(&missing));
    let extra = issue(&ca, &root.path().join("w"), &["--role", "worker", "--node-id", "2"]);
    assert!(!extra.status.success(), "a worker certificate with --node-id was issued");
    assert!(stderr(&extra).contains("--node-id is for coordinator certificates only"), "{}", stderr(&extra));

    let node2 = root.path().join("c2");
    let issued = issue(&ca, &node2, &["--role", "coordinator", "--node-id", "2"]);
    assert!(issued.status.success(), "{}", stderr(&issued));
    let shown = stoker(&["certs", "show", node2.join("node.pem").to_str().expect("path")]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("node id   2"), "{}", String::from_utf8_lossy(&shown.stdout));

    // Node 1 with node 2's certificate: refused at start, telling how to reissue.
    let data = root.path().join("data");
    let mut child = stoker_command()
        .args(["coordinator", "--node-id", "1", "--listen", "127.0.0.1:0", "--data-dir", data.to_str().expect("path")])
        .args(["--tls-dir", node2.to_str().expect("path")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a coordinator started with the certificate of another node id");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().expect("output");
    assert!(!status.success());
    let message = stderr(&output);
    assert!(message.contains("is node 2's") && message.contains("--node-id 1"), "{message}");
    assert!(message.contains("stoker certs issue --role coordinator"), "{message}");
}
