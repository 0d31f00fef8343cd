//! Running the real `stoker` binary from tests.

use std::path::Path;
use std::process::{Command, Output};

/// Run `stoker ARGS` to completion.
pub(crate) fn stoker(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stoker")).args(args).output().unwrap_or_else(|error| panic!("failed to run stoker: {error}"))
}

/// Stdout then stderr, for messages and assertions on what a user sees.
pub(crate) fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A temp path as a command-line argument.
pub(crate) fn path_str(path: &Path) -> &str {
    path.to_str().unwrap_or_else(|| panic!("non-UTF-8 temp path"))
}
