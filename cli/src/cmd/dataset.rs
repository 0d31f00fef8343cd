//! `stoker dataset add|ls`.

use crate::flags::CoordinatorAddr;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, DatasetInfo};

use super::remote::call;

#[derive(Debug, Args)]
pub(crate) struct DatasetAddArgs {
    /// Name trainers use.
    pub(crate) name: String,
    /// manifest.json, or the folder holding it; or `s3://bucket/prefix` (its manifest.json)
    /// or `s3://bucket/key.json`, read by the coordinator from the object store.
    pub(crate) path: PathBuf,
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
}

fn describe(dataset: &DatasetInfo) -> String {
    let samples: u64 = dataset.shard_counts.iter().sum();
    format!("{:<24} {:>10} samples {:>6} shards  {}", dataset.name, samples, dataset.shard_counts.len(), dataset.manifest)
}

pub(crate) fn add(args: DatasetAddArgs) -> anyhow::Result<ExitCode> {
    let given = args.path.to_string_lossy();
    let manifest = if stoker_store::ObjectUri::is_object_uri(&given) {
        given.into_owned()
    } else {
        std::path::absolute(&args.path)?.to_string_lossy().into_owned()
    };
    let request = ControlRequest::AddDataset { name: args.name, manifest };
    let dataset = expect_response!(call(&args.coordinator, request)?, DatasetAdded { dataset })?;
    println!("added {}", describe(&dataset));
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn list(args: CoordinatorAddr) -> anyhow::Result<ExitCode> {
    let datasets = expect_response!(call(&args, ControlRequest::ListDatasets)?, Datasets { datasets })?;
    if datasets.is_empty() {
        println!("no datasets: add one with `stoker dataset add NAME PATH`");
    }
    for dataset in &datasets {
        println!("{}", describe(dataset));
    }
    Ok(ExitCode::SUCCESS)
}
