//! The `stoker` binary: parses arguments and hands each subcommand to the libraries.
#![allow(clippy::print_stdout)] // The binary's output is its interface.

mod args;
mod cmd;
mod flags;
mod progress;

use clap::Parser;

use crate::args::{BenchCommand, CertsCommand, Cli, ClusterCommand, Command, DatasetCommand, JobCommand};

fn main() -> std::process::ExitCode {
    init_tracing();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pack(args) => cmd::pack::run(args),
        Command::Index(args) => cmd::index::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Coordinator(args) => cmd::serve::coordinator(args),
        Command::Worker(args) => cmd::serve::worker(args),
        Command::Dataset(DatasetCommand::Add(args)) => cmd::dataset::add(args),
        Command::Dataset(DatasetCommand::Ls(args)) => cmd::dataset::list(args),
        Command::Job(JobCommand::Ls(args)) => cmd::job::list(args),
        Command::Job(JobCommand::Rm(args)) => cmd::job::remove(args),
        Command::Cluster(ClusterCommand::AddNode(args)) => cmd::cluster::add_node(args),
        Command::Cluster(ClusterCommand::RemoveNode(args)) => cmd::cluster::remove_node(args),
        Command::Status(args) => cmd::status::run(args),
        Command::Consume(args) => cmd::consume::run(args),
        #[cfg(feature = "demo")]
        Command::Demo(args) => cmd::demo::run(args),
        Command::Certs(CertsCommand::Init(args)) => cmd::certs::init(args),
        Command::Certs(CertsCommand::Issue(args)) => cmd::certs::issue(args),
        Command::Certs(CertsCommand::Revoke(args)) => cmd::certs::revoke(args),
        Command::Certs(CertsCommand::Show(args)) => cmd::certs::show(args),
        Command::Transform(args) => cmd::transform::run(args),
        Command::Augment(args) => cmd::augment::run(args),
        Command::Bench(BenchCommand::Pipeline(args)) => cmd::bench_pipeline::run(args),
        #[cfg(feature = "demo")]
        Command::Bench(BenchCommand::Cluster(args)) => cmd::bench_cluster::run(args),
        #[cfg(feature = "demo")]
        Command::Bench(BenchCommand::Delivery(args)) => cmd::bench_delivery::run(args),
        Command::Bench(BenchCommand::ControlPlane(args)) => cmd::bench_control::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings).
fn init_tracing() {
    stoker_obs::init_tracing(std::env::var("RUST_LOG").ok().as_deref(), "warn", false);
}
