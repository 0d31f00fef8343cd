//! An admin's requests: datasets and jobs (`stoker dataset add`, `stoker job rm`).

use std::time::Instant;

use stoker_plan::ShardTable;
use stoker_plan::ids::JobId;
use stoker_proto::{ControlResponse, DatasetInfo, RemoteError};

use crate::core::Core;
use crate::errors::{invalid, not_found};
use crate::event::{Outcome, Then};
use crate::state::Command;
use crate::state_budget::check_new_dataset;

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
            let dataset = DatasetInfo { name, ..dataset };
            check_new_dataset(&self.state, &dataset, self.state.datasets.get(&dataset.name), &self.config)?;
            Ok(dataset)
        });
        match checked {
            Ok(dataset) => {
                tracing::info!(dataset = %dataset.name, manifest = %dataset.manifest, "adding dataset");
                let then = Then::Reply(ControlResponse::DatasetAdded { dataset: dataset.clone() });
                Outcome::Commit { command: Command::AddDataset { dataset, max_state_bytes: Some(self.config.max_state_bytes) }, then }
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

    /// Remove `job` (named `name`), by id: a request sent again after the job went (across a
    /// fail-over) is answered as done, and never removes a newer job of that name.
    pub(super) fn remove_job(&mut self, name: String, job: JobId, force: bool, now: Instant) -> Outcome {
        let Some(spec) = self.state.jobs.get(&job).cloned() else {
            // Job ids are never given twice: one below the next id existed and is gone.
            if job.0 < self.state.next_job && job.0 > 0 {
                return Outcome::reply(Ok(ControlResponse::JobRemoved { job }));
            }
            return Outcome::reply(Err(not_found(format!("{job} ({name:?}) does not exist: `stoker job ls` lists the jobs"))));
        };
        if spec.name != name {
            return Outcome::reply(Err(invalid(format!(
                "{job} is named {:?}, not {name:?}: `stoker job ls` lists the jobs with their ids",
                spec.name
            ))));
        }
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
