//! A trainer rank without a model: attach, consume epochs, account for every key. Used by
//! `consume`, `demo` and `bench cluster`.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context;
use stoker_client::{Loader, LoaderConfig};
use stoker_plan::ids::Epoch;

/// What one rank measured.
#[derive(Debug, Default)]
pub(crate) struct RankReport {
    pub(crate) rank: u32,
    pub(crate) images: u64,
    pub(crate) batches: u64,
    /// Seconds from the first `next` to the last batch.
    pub(crate) seconds: f64,
    /// Seconds from the first request for a batch to the last batch.
    pub(crate) total_seconds: f64,
    /// Seconds spent waiting for data (first batch included).
    pub(crate) wait_seconds: f64,
    /// Seconds from attach to the first batch.
    pub(crate) first_batch_seconds: f64,
    /// (epoch, step, keys) of every batch, when asked for.
    pub(crate) keys: Vec<(u64, u64, Vec<String>)>,
    pub(crate) duplicates: u64,
}

impl RankReport {
    pub(crate) fn wait_fraction(&self) -> f64 {
        if self.total_seconds > 0.0 { self.wait_seconds / self.total_seconds } else { 0.0 }
    }
}

/// Where a rank's keys go: kept in its report, or written as they come (`epoch step key`
/// lines, flushed after every batch, so that others can watch its progress).
pub(crate) enum Keys<'a> {
    Drop,
    /// Only the in-process runs (`demo`, `bench cluster`) keep keys.
    #[cfg_attr(not(feature = "demo"), allow(dead_code))]
    Keep,
    Write(&'a mut dyn Write),
}

/// Consume `epochs` epochs from `first_epoch`, at most `rate` batches/s, serving the rank's
/// metrics on `metrics_listen` if given.
pub(crate) fn consume(
    config: &LoaderConfig,
    first_epoch: u64,
    epochs: u64,
    rate: Option<f64>,
    mut keys: Keys<'_>,
    metrics_listen: Option<std::net::SocketAddr>,
) -> anyhow::Result<RankReport> {
    let attached_at = Instant::now();
    let mut loader = Loader::attach(config)?;
    if let Some(listen) = metrics_listen {
        let addr = loader.serve_metrics(listen)?;
        eprintln!("rank {}: metrics on http://{addr}/metrics", loader.rank().0);
    }
    let mut report = RankReport { rank: loader.rank().0, ..RankReport::default() };
    let pace = rate.filter(|rate| *rate > 0.0).map(|rate| Duration::from_secs_f64(1.0 / rate));
    let mut started_opt: Option<Instant> = None;
    let consuming_since = Instant::now();
    for epoch in first_epoch..first_epoch + epochs {
        loader.set_epoch(Epoch(epoch));
        while let Some(batch) = loader.next_batch() {
            let batch = batch.with_context(|| format!("rank {} epoch {epoch}", report.rank))?;
            let started = *started_opt.get_or_insert_with(|| {
                report.first_batch_seconds = attached_at.elapsed().as_secs_f64();
                Instant::now()
            });
            report.images += batch.len() as u64;
            report.batches += 1;
            match &mut keys {
                Keys::Drop => {}
                Keys::Keep => report.keys.push((epoch, batch.step().0, batch.keys().to_vec())),
                Keys::Write(out) => {
                    for key in batch.keys() {
                        writeln!(out, "{epoch} {} {key}", batch.step().0)?;
                    }
                    out.flush()?;
                }
            }
            if let Some(pace) = pace {
                let due = started + pace * report.batches as u32;
                std::thread::park_timeout(due.saturating_duration_since(Instant::now()));
            }
        }
        report.duplicates += loader.duplicates();
    }
    report.seconds = started_opt.map_or(0.0, |started| started.elapsed().as_secs_f64());
    report.total_seconds = consuming_since.elapsed().as_secs_f64();
    report.wait_seconds = loader.wait_seconds();
    Ok(report)
}

/// Every rank of `world_size` consumes `epochs` epochs on its own thread, from `base`'s
/// settings; returns their reports in rank order.
#[cfg(feature = "demo")]
pub(crate) fn consume_ranks(base: &LoaderConfig, world_size: u32, epochs: u64, keep_keys: bool) -> anyhow::Result<Vec<RankReport>> {
    let handles: Vec<_> = (0..world_size)
        .map(|rank| {
            let mut config = base.clone();
            config.rank = Some(rank);
            config.world_size = Some(world_size);
            std::thread::spawn(move || consume(&config, 0, epochs, None, if keep_keys { Keys::Keep } else { Keys::Drop }, None))
        })
        .collect();
    let mut reports = Vec::new();
    for handle in handles {
        reports.push(handle.join().map_err(|_| anyhow::anyhow!("a trainer rank panicked"))??);
    }
    Ok(reports)
}

/// Peak resident memory of this process, in MiB (Linux), if known.
#[cfg(feature = "demo")]
pub(crate) fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
