//! `stoker dataset add|ls`.

use std::process::ExitCode;

use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, DatasetInfo};

use super::remote::call;
use crate::args::{CoordinatorAddr, DatasetAddArgs};

fn describe(dataset: &DatasetInfo) -> String {
    let samples: u64 = dataset.shard_counts.iter().sum();
    format!("{:<24} {:>10} samples {:>6} shards  {}", dataset.name, samples, dataset.shard_counts.len(), dataset.manifest)
}

pub(crate) fn add(args: DatasetAddArgs) -> anyhow::Result<ExitCode> {
    let path = std::path::absolute(&args.path)?;
    let request = ControlRequest::AddDataset { name: args.name, manifest: path.to_string_lossy().into_owned() };
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
