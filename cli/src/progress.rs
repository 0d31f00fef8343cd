//! Progress bars on stderr. Hidden when stderr is not a terminal (scripts, CI), where the
//! final summary line is the record.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `total` units labelled `message`, counting `unit`s.
pub(crate) fn bar(total: u64, message: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} ({per_sec}, {eta} left) {prefix}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(message);
    bar
}
