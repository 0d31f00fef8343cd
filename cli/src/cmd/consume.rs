//! `stoker consume`: one trainer rank without a model.

use crate::flags::CoordinatorAddr;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use stoker_net::bulk::BatchTransport;

use anyhow::Context;
use stoker_client::LoaderConfig;
use stoker_obs::MetricsListen;
use stoker_plan::transform::TransformSpec;

use super::ranks::{Keys, consume};
use super::remote::resolve_coordinators;

#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
    /// Dataset name.
    #[arg(long)]
    pub(crate) dataset: String,
    /// This trainer's rank [default: $RANK, else 0].
    #[arg(long)]
    pub(crate) rank: Option<u32>,
    /// Number of ranks [default: $WORLD_SIZE, else 1].
    #[arg(long)]
    pub(crate) world_size: Option<u32>,
    /// Samples per batch per rank.
    #[arg(long, default_value_t = 256)]
    pub(crate) batch_size: u32,
    /// Epochs to consume, starting at --first-epoch.
    #[arg(long, default_value_t = 1)]
    pub(crate) epochs: u64,
    /// First epoch.
    #[arg(long, default_value_t = 0)]
    pub(crate) first_epoch: u64,
    /// RandomResizedCrop output side (ignored with --transforms).
    #[arg(long, default_value_t = 224)]
    pub(crate) size: u32,
    /// A TransformSpec as JSON instead of RandomResizedCrop(size) + RandomHorizontalFlip.
    #[arg(long, value_name = "JSON")]
    pub(crate) transforms: Option<String>,
    /// Seed of shuffling and augmentation.
    #[arg(long, default_value_t = loader_defaults().seed)]
    pub(crate) seed: u64,
    /// Shuffle: none, full, window:K (K shards per window), or block:S:N (blocks of S
    /// samples, N blocks per window: mixes class-sorted data without reading it all at once).
    #[arg(long, default_value_t = loader_defaults().shuffle.to_string())]
    pub(crate) shuffle: String,
    /// Tail policy: drop, pad or partial.
    #[arg(long, default_value = "drop")]
    pub(crate) tail: String,
    /// Steps workers may run ahead of the slowest rank.
    #[arg(long, default_value_t = loader_defaults().prefetch)]
    pub(crate) prefetch: u32,
    /// Job name [default: derived from the dataset and the spec].
    #[arg(long)]
    pub(crate) job: Option<String>,
    /// Consume at most this many batches per second (simulates a training step).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Write one line per sample as it is consumed: `epoch step key` (flushed after every
    /// batch, so the file shows the rank's progress while it runs).
    #[arg(long, value_name = "FILE")]
    pub(crate) keys_out: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// Serve this rank's own metrics (bytes received, first-batch latency, buffered batches)
    /// at http://ADDR/metrics while it runs; the coordinator exports its steps, batches and
    /// wait without this.
    #[arg(long, default_value = "off", value_name = "ADDR|off")]
    pub(crate) metrics_listen: MetricsListen,
    /// How batches arrive: `tcp` makes a bulk connection (TLS over TCP) to every worker that
    /// takes one and receives over QUIC from the rest; `quic` receives over QUIC only.
    #[arg(long, env = "STOKER_BATCH_TRANSPORT", default_value = "tcp", value_name = "tcp|quic")]
    pub(crate) batch_transport: BatchTransport,
}

/// What a trainer is told when nothing is said: the arguments' defaults.
fn loader_defaults() -> LoaderConfig {
    LoaderConfig::new(std::net::SocketAddr::from(([127, 0, 0, 1], 7400)), String::new(), 1)
}

/// The loader's config as `args` say.
fn loader_config(args: &ConsumeArgs) -> anyhow::Result<LoaderConfig> {
    let mut config = LoaderConfig::new(resolve_coordinators(&args.coordinator.coordinator)?, args.dataset.clone(), args.batch_size);
    config.rank = args.rank;
    config.world_size = args.world_size;
    config.seed = args.seed;
    config.shuffle = args.shuffle.parse()?;
    config.tail = args.tail.parse()?;
    config.prefetch = args.prefetch;
    config.job_name = args.job.clone();
    config.tls = args.coordinator.tls.source()?;
    config.batch_transport = args.batch_transport;
    config.transforms = match &args.transforms {
        Some(json) => serde_json::from_str::<TransformSpec>(json).context("--transforms is not a valid TransformSpec")?,
        None => TransformSpec::imagenet_train(args.size),
    };
    Ok(config)
}

pub(crate) fn run(args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    let config = loader_config(&args)?;
    let (rank, world_size) = config.rank_and_world_size()?;
    if !args.json {
        eprintln!("rank {} of {world_size}: consuming {} epoch(s) of {:?} ...", rank.0, args.epochs, args.dataset);
    }
    let metrics_listen = match args.metrics_listen {
        MetricsListen::On(addr) => Some(addr),
        MetricsListen::Off => None,
    };
    let mut keys_file = match &args.keys_out {
        Some(path) => {
            Some(std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?))
        }
        None => None,
    };
    let keys = match &mut keys_file {
        Some(file) => Keys::Write(file),
        None => Keys::Drop,
    };
    let report = consume(&config, args.first_epoch, args.epochs, args.rate, keys, metrics_listen)?;
    let rate = report.images as f64 / report.seconds.max(1e-9);
    if args.json {
        let value = serde_json::json!({
            "rank": rank.0,
            "world_size": world_size.get(),
            "images": report.images,
            "batches": report.batches,
            "seconds": report.seconds,
            "images_per_sec": rate,
            "wait_seconds": report.wait_seconds,
            "wait_fraction": report.wait_fraction(),
            "first_batch_seconds": report.first_batch_seconds,
            "duplicates_dropped": report.duplicates,
        });
        println!("{value}");
    } else {
        println!(
            "rank {}: {} images in {} batches, {:.1} s: {rate:.0} images/s; waited {:.2} s ({:.0}%); first batch after {:.2} s",
            rank.0,
            report.images,
            report.batches,
            report.seconds,
            report.wait_seconds,
            100.0 * report.wait_fraction(),
            report.first_batch_seconds
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{loader_config, loader_defaults};
    use crate::args::{Cli, Command};

    /// `stoker consume` with no flags attaches as a [`stoker_client::LoaderConfig`] does by
    /// default.
    #[test]
    fn the_clap_defaults_are_the_config_defaults() {
        let Command::Consume(args) = Cli::parse_from(["stoker", "consume", "--dataset", "d"]).command else { panic!("consume") };
        let parsed = loader_config(&args).expect("config");
        let defaults = loader_defaults();
        assert_eq!(parsed.seed, defaults.seed);
        assert_eq!(parsed.shuffle, defaults.shuffle);
        assert_eq!(parsed.tail, defaults.tail);
        assert_eq!(parsed.prefetch, defaults.prefetch);
        assert_eq!(parsed.transforms, defaults.transforms);
        assert_eq!(parsed.batch_transport, defaults.batch_transport);
        assert_eq!((parsed.rank, parsed.world_size, parsed.job_name), (None, None, None));
    }
}
