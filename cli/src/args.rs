//! The command tree: `stoker` and its subcommands. Each subcommand's arguments (help text
//! written once, in their doc comments; defaults taken from the libraries' configs) are beside
//! its code in [`crate::cmd`]; those several share are in [`crate::flags`].

use clap::{Parser, Subcommand};

use crate::cmd::augment::AugmentArgs;
#[cfg(feature = "demo")]
use crate::cmd::bench_cluster::BenchClusterArgs;
use crate::cmd::bench_control::BenchControlArgs;
#[cfg(feature = "demo")]
use crate::cmd::bench_delivery::BenchDeliveryArgs;
use crate::cmd::bench_pipeline::BenchPipelineArgs;
use crate::cmd::certs::{CertsInitArgs, CertsIssueArgs, CertsRevokeArgs, CertsShowArgs};
use crate::cmd::cluster::{AddNodeArgs, RemoveNodeArgs};
use crate::cmd::consume::ConsumeArgs;
use crate::cmd::dataset::DatasetAddArgs;
#[cfg(feature = "demo")]
use crate::cmd::demo::DemoArgs;
use crate::cmd::index::IndexArgs;
use crate::cmd::inspect::InspectArgs;
use crate::cmd::job::JobRmArgs;
use crate::cmd::pack::PackArgs;
use crate::cmd::serve::{CoordinatorArgs, WorkerArgs};
use crate::cmd::status::StatusArgs;
use crate::cmd::transform::TransformArgs;
use crate::flags::CoordinatorAddr;

/// Stoker: a distributed data loader for deep-learning training.
///
/// Pack images into shards (`pack`, `index`, `inspect`), run a cluster (`coordinator`,
/// `worker`, `dataset add`), watch it (`status`), check it from a trainer node (`consume`),
/// measure it (`bench`), or try everything on one machine (`demo`). Coordinators replicate
/// with Raft (`coordinator --peers`, `cluster add-node`); coordinators and workers serve
/// Prometheus metrics (`--metrics-listen`; deploy/ has dashboards and alerts). Every connection
/// is mutual TLS: one machine needs no set-up (a local CA), a cluster a CA and a certificate per
/// node (`certs`, `--tls-dir`). Datasets may live in S3 (`pack --output s3://...`, workers'
/// `--cache-dir`).
#[derive(Debug, Parser)]
#[command(name = "stoker", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Pack an ImageFolder (one folder of images per class) into WebDataset tar shards, with an
    /// index beside each shard and a manifest.json. Output is deterministic.
    Pack(PackArgs),
    /// Index existing WebDataset shards (writes SHARD.tar.idx beside each) and optionally write
    /// a manifest for them; or token datasets as they are (Megatron-LM .bin + .idx, llm.c
    /// shards, nanoGPT's headerless arrays): checked in place, listed in tokens.json.
    Index(IndexArgs),
    /// Show what a shard or a dataset manifest holds: samples, members by extension, sizes; of a
    /// token dataset: documents, tokens, dtype, vocabulary seen, document lengths.
    Inspect(InspectArgs),
    /// Run a coordinator: datasets, jobs, checkpoints, and the work plan of every job.
    Coordinator(CoordinatorArgs),
    /// Run a worker: decode and augment batches and send them to trainers.
    Worker(WorkerArgs),
    /// Register or list datasets at the coordinator.
    #[command(subcommand)]
    Dataset(DatasetCommand),
    /// List or remove jobs at the coordinator.
    #[command(subcommand)]
    Job(JobCommand),
    /// Change the coordinators of a replicated cluster (Raft membership, through the leader).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Show every coordinator (role, term, log), workers, jobs and each rank's progress and
    /// data stall.
    Status(StatusArgs),
    /// Attach as one trainer rank without a model and consume as fast as possible (or at
    /// --rate): checks a deployment from a trainer node, and drives tests.
    Consume(ConsumeArgs),
    /// Apply a transform spec to one JPEG as a worker does, once per augmentation seed, and
    /// print what was drawn (crop box, flip, DCT scale) as JSON lines: preview an augmentation,
    /// or compare it with another library (python/tests/test_torchvision_parity.py does).
    Transform(TransformArgs),
    /// Apply per-pixel augmentations with explicit parameters (JSON, as `transform` prints
    /// them under "pixel_ops") to a raw RGB image read from stdin; the result goes to stdout.
    /// For comparisons with torchvision (python/tests/test_augment_parity.py).
    Augment(AugmentArgs),
    /// Generate a sample dataset and run a coordinator, 2 workers and 2 trainer ranks on
    /// loopback for 2 epochs; verify every sample arrives exactly once per epoch.
    #[cfg(feature = "demo")]
    Demo(DemoArgs),
    /// Make the cluster CA and the certificates of nodes and clients (mutual TLS), revoke
    /// them, and show what a certificate is.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Measure throughput on real data.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum CertsCommand {
    /// Make a cluster CA in --dir (ca.pem, and ca.key readable by its owner only). Keep ca.key
    /// off the nodes: it signs certificates.
    Init(CertsInitArgs),
    /// Issue a certificate for a node or client, signed by the CA in --dir, into --out: the
    /// TLS directory (ca.pem, node.pem, node.key) that --tls-dir takes.
    Issue(CertsIssueArgs),
    /// Deny a certificate: append its SHA-256 to a deny list. Copy the list to every node's
    /// TLS directory as `revoked`; nodes read it again when it changes and refuse the
    /// certificate at its next handshake.
    Revoke(CertsRevokeArgs),
    /// Show a certificate (a PEM file or a TLS directory): role, name, SHA-256, validity.
    Show(CertsShowArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Run the worker pipeline (decode + RandomResizedCrop + flip by default) over a dataset
    /// for a while, then, in the same run, plain full JPEG decode of the same images with the
    /// same threads (the floor), and report both and their ratio.
    Pipeline(BenchPipelineArgs),
    /// Run a whole cluster in this process (coordinator, N workers, R trainer ranks over QUIC
    /// on loopback) over a dataset and report images/s, per-rank wait, first-batch latency and
    /// peak memory.
    #[cfg(feature = "demo")]
    Cluster(BenchClusterArgs),
    /// Move batches to one trainer over one connection, on loopback or between two hosts
    /// (--netns), through the same send and receive code as workers and trainers, and report
    /// GB/s, CPU-seconds per GB on each side and for the machine, and the trainer's CPU per
    /// batch: plain TCP (the baseline), rustls's TLS stream, bulk connections (the default),
    /// and QUIC from quinn's defaults to Stoker's settings.
    #[cfg(feature = "demo")]
    Delivery(BenchDeliveryArgs),
    /// Drive the coordinator's core (request handling, scheduler, state machine) in this
    /// process with simulated trainer ranks and workers through one epoch, every grant checked
    /// for exactly-once, and report its cost per request kind (p50/p99/max), grants per
    /// core-second, the replicated log's rate and memory per rank and per worker. No network,
    /// no Raft: the core's own cost.
    ControlPlane(BenchControlArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum DatasetCommand {
    /// Register a dataset: a manifest.json or the folder `stoker pack` wrote. Workers open the
    /// same path, so it must be on storage they share.
    Add(DatasetAddArgs),
    /// List registered datasets.
    Ls(CoordinatorAddr),
}

#[derive(Debug, Subcommand)]
pub(crate) enum JobCommand {
    /// List jobs: ranks, live trainers, where each stands, how long it has been idle.
    Ls(CoordinatorAddr),
    /// Remove a job and its checkpoint: nothing of it is made any more. A trainer that
    /// attaches with its name afterwards makes a new job (and resumes from its own saved
    /// state_dict, if it loads one).
    Rm(JobRmArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Add a coordinator: start it first with `stoker coordinator --node-id ID --join
    /// --listen ... --data-dir EMPTY_DIR`, then run this; it catches up as a learner, then
    /// votes. Update every node's --peers to the new list before their next restart.
    AddNode(AddNodeArgs),
    /// Remove a coordinator (a dead one before replacing it, or one being retired). Update
    /// every node's --peers before their next restart.
    RemoveNode(RemoveNodeArgs),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
