//! Running the real `stoker` binary from tests.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// Run `stoker ARGS` to completion.
pub(crate) fn stoker(args: &[&str]) -> Output {
    stoker_command().args(args).output().unwrap_or_else(|error| panic!("failed to run stoker: {error}"))
}

/// Stdout then stderr, for messages and assertions on what a user sees.
pub(crate) fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A temp path as a command-line argument.
pub(crate) fn path_str(path: &Path) -> &str {
    path.to_str().unwrap_or_else(|| panic!("non-UTF-8 temp path"))
}

/// A child process killed (SIGKILL) when dropped, so a failing test leaves nothing behind.
pub(crate) struct Node(pub(crate) Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `stoker` binary, to spawn.
pub(crate) fn stoker_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stoker"));
    // Many nodes run on this one host: each serves its metrics on a port of its own.
    command.env("STOKER_METRICS_LISTEN", "127.0.0.1:0");
    // Every node of the tests trusts the tests' local CA, not the user's.
    command.env("STOKER_LOCAL_CA", local_ca()).env_remove("STOKER_TLS_DIR");
    command
}

/// The local CA the tests' nodes share (made on first use, as a user's is).
pub(crate) fn local_ca() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("local-ca")
}

/// TLS configs of `role` from the tests' local CA, for calls made from the test itself.
pub(crate) fn local_tls(role: stoker_net::Role) -> stoker_net::TlsConfigs {
    let dir =
        stoker_net::ensure_local(&local_ca(), role, (role == stoker_net::Role::Coordinator).then_some(1)).expect("the tests' local CA");
    stoker_net::TlsConfigs::from_dir(&dir).expect("a local certificate")
}

/// Start a node and read its "listening on ADDR" line from stderr.
pub(crate) fn start_node(args: &[&str]) -> (Node, String) {
    let mut child = stoker_command().args(args).stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("spawn stoker");
    let stderr = child.stderr.take().expect("stderr");
    let (line_tx, line_rx) = std::sync::mpsc::channel();
    // STOKER_TEST_LOGS=DIR keeps every node's log there (one file per process) for debugging.
    let mut log_opt = std::env::var_os("STOKER_TEST_LOGS")
        .and_then(|dir| std::fs::File::create(Path::new(&dir).join(format!("{}-{}.log", args[0], child.id()))).ok());
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(log) = log_opt.as_mut() {
                let _ = std::io::Write::write_all(log, format!("{line}\n").as_bytes());
            }
            if line.contains("listening on") {
                let _ = line_tx.send(line);
            }
        }
    });
    let line = line_rx.recv_timeout(Duration::from_secs(20)).expect("the node says where it listens");
    let addr = line.split("listening on ").nth(1).and_then(|rest| rest.split_whitespace().next()).expect("an address").to_owned();
    (Node(child), addr)
}

/// The `--keys-out` file of `stoker consume`: (epoch, step, key) per line.
pub(crate) fn read_keys(path: &Path) -> Vec<(u64, u64, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // Whole lines only: the file is written while it is read.
    text.split_inclusive('\n')
        .filter_map(|line| line.strip_suffix('\n'))
        .filter_map(|line| {
            let mut parts = line.splitn(3, ' ');
            Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?.to_owned()))
        })
        .collect()
}

/// Wait (at most `timeout`) for each consumer to exit, and require success.
pub(crate) fn wait_for_consumers(consumers: Vec<(Node, std::path::PathBuf)>, timeout: Duration) {
    for (mut node, keys) in consumers {
        let deadline = std::time::Instant::now() + timeout;
        let exit = loop {
            if let Some(exit) = node.0.try_wait().expect("wait") {
                break exit;
            }
            assert!(std::time::Instant::now() < deadline, "a trainer did not finish");
            std::thread::park_timeout(Duration::from_millis(50));
        };
        assert!(exit.success(), "consume failed for {}", keys.display());
    }
}

/// The 2 ranks' `keys-RANK.txt` in `dir` over 2 epochs of the 120-sample test dataset (batch
/// 4): every step once and in order per rank, every key once per epoch.
pub(crate) fn assert_two_ranks_saw_every_key_once(dir: &Path) {
    assert_two_ranks_saw_every_key_once_in(dir, 2);
}

/// [`assert_two_ranks_saw_every_key_once`] for `epochs` epochs.
pub(crate) fn assert_two_ranks_saw_every_key_once_in(dir: &Path, epochs: u64) {
    let mut per_epoch: std::collections::BTreeMap<u64, Vec<String>> = std::collections::BTreeMap::new();
    for rank in 0..2 {
        let records = read_keys(&dir.join(format!("keys-{rank}.txt")));
        for epoch in 0..epochs {
            let mut steps: Vec<u64> = records.iter().filter(|r| r.0 == epoch).map(|r| r.1).collect();
            steps.dedup();
            assert_eq!(steps, (0..15).collect::<Vec<_>>(), "rank {rank} epoch {epoch}: 120 samples / (2 ranks x 4) = 15 steps");
        }
        for (epoch, _, key) in records {
            per_epoch.entry(epoch).or_default().push(key);
        }
    }
    assert_eq!(per_epoch.len() as u64, epochs, "epochs seen");
    for (epoch, mut keys) in per_epoch {
        keys.sort();
        let total = keys.len();
        keys.dedup();
        assert_eq!((total, keys.len()), (120, 120), "epoch {epoch}: every key exactly once");
    }
}

/// Two `stoker consume` ranks of a 2-rank job over "train" (batch 4, 2 epochs) at `rate`
/// batches a second, each writing its keys to `dir/keys-RANK.txt` for
/// [`assert_two_ranks_saw_every_key_once`].
pub(crate) fn spawn_two_consumers(coordinator: &str, dir: &Path, rate: &str) -> Vec<(Node, std::path::PathBuf)> {
    (0..2)
        .map(|rank| {
            let keys = dir.join(format!("keys-{rank}.txt"));
            let child = stoker_command()
                .args(["consume", "--coordinator", coordinator, "--dataset", "train", "--world-size", "2", "--batch-size", "4"])
                .args(["--rank", &rank.to_string(), "--epochs", "2", "--size", "32", "--tail", "partial", "--shuffle", "full"])
                .args(["--prefetch", "4", "--rate", rate, "--keys-out", path_str(&keys)])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("consume");
            (Node(child), keys)
        })
        .collect()
}
