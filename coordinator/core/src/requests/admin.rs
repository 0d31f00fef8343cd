//! An admin's requests: datasets and jobs (`stoker dataset add`, `stoker job rm`).

use std::time::Instant;

use stoker_plan::ShardTable;
use stoker_proto::{ControlResponse, DatasetInfo, RemoteError};

use crate::core::Core;
use crate::errors::{invalid, not_found};
use crate::event::{Outcome, Then};
use crate::state::Command;

impl Core {
    /// Check a dataset's name and the limit on datasets, then ask the driver to read its
    /// manifest (file IO: the driver does it off the async threads, within the dataset roots).
    pub(super) fn add_dataset(&mut self, name: String, manifest: String) -> Outcome {
        match self.check_dataset_limits(&name) {
            Ok(()) => Outcome::ReadManifest { name, manifest },
            Err(error) => Outcome::reply(Err(error)),
        }
    }

    /// The driver read the manifest of a dataset to add: commit it, if it is still welcome.
    pub(crate) fn manifest_read(&mut self, name: String, read: Result<DatasetInfo, RemoteError>) -> Outcome {
        let checked = read.and_then(|dataset| {
            self.check_dataset_limits(&name)?;
            ShardTable::new(dataset.shard_counts.iter().copied()).map_err(|error| invalid(error.to_string()))?;
            Ok(DatasetInfo { name, ..dataset })
        });
        match checked {
            Ok(dataset) => {
                tracing::info!(dataset = %dataset.name, manifest = %dataset.manifest, "adding dataset");
                let then = Then::Reply(ControlResponse::DatasetAdded { dataset: dataset.clone() });
                Outcome::Commit { command: Command::AddDataset { dataset }, then }
            }
            Err(error) => Outcome::reply(Err(error)),
        }
    }

    fn check_dataset_limits(&self, name: &str) -> Result<(), RemoteError> {
        if name.is_empty() || name.len() > 256 {
            return Err(invalid("a dataset name must have 1 to 256 characters"));
        }
        let count = self.state.datasets.len();
        if !self.state.datasets.contains_key(name) && count >= self.config.max_datasets {
            return Err(invalid(format!(
                "the coordinator keeps {count} datasets, its limit (--max-datasets {}): remove some, or raise it",
                self.config.max_datasets
            )));
        }
        Ok(())
    }

    pub(super) fn remove_job(&mut self, name: String, force: bool, now: Instant) -> Outcome {
        let Some((job, spec)) = self.state.job_named(&name).map(|(job, spec)| (job, spec.clone())) else {
            return Outcome::reply(Err(not_found(format!("no job named {name:?}: `stoker job ls` lists them"))));
        };
        let live = self.scheduler.live_trainers(job, spec.plan.world_size.get(), now);
        if !live.is_empty() && !force {
            let ranks: Vec<String> = live.iter().map(ToString::to_string).collect();
            return Outcome::reply(Err(invalid(format!(
                "job {name:?} has live trainers ({}): stop them first, or pass --force (they fail at their next request)",
                ranks.join(", ")
            ))));
        }
        tracing::info!(%job, %name, live = live.len(), "removing job");
        Outcome::Commit { command: Command::RemoveJob { job }, then: Then::Reply(ControlResponse::JobRemoved { job }) }
    }
}
