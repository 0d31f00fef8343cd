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
    Command::new(env!("CARGO_BIN_EXE_stoker"))
}

/// Start a node and read its "listening on ADDR" line from stderr.
pub(crate) fn start_node(args: &[&str]) -> (Node, String) {
    let mut child = stoker_command().args(args).stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("spawn stoker");
    let stderr = child.stderr.take().expect("stderr");
    let (line_tx, line_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on") {
                let _ = line_tx.send(line);
            }
        }
    });
    let line = line_rx.recv_timeout(Duration::from_secs(20)).expect("the node says where it listens");
    let addr = line.split("listening on ").nth(1).and_then(|rest| rest.split_whitespace().next()).expect("an address").to_owned();
    (Node(child), addr)
}
