//! Checks of what a request asks for: job specs, the coordinator's limits on new jobs, and the
//! lengths of lists in requests.

use stoker_plan::ids::Rank;
use stoker_plan::transform::Recipe;
use stoker_proto::{JobSpec, RemoteError};

use crate::config::CoreConfig;
use crate::errors::invalid;

/// The largest transform spec (JSON) a job may have. Raft sends at most 64 entries at once
/// (`raft_config`), so even escaped six-fold they fit a control frame.
const MAX_TRANSFORM_SPEC_BYTES: usize = 16 << 10;

/// Most entries a list in a request may hold (`holding`, `missing`, a heartbeat's leases):
/// far more than any flow window or worker holds, far less than a frame could carry.
const MAX_LIST_LEN: usize = 65_536;

pub(crate) fn check_list_len(what: &str, len: usize) -> Result<(), RemoteError> {
    if len > MAX_LIST_LEN {
        return Err(invalid(format!("{len} entries in `{what}`, over the limit of {MAX_LIST_LEN}")));
    }
    Ok(())
}

pub(crate) fn validate_spec(spec: &JobSpec, rank: Rank) -> Result<(), RemoteError> {
    if spec.name.is_empty() || spec.name.len() > 256 {
        return Err(invalid("a job name must have 1 to 256 characters"));
    }
    if spec.dataset.len() > 256 {
        return Err(invalid("a dataset name has at most 256 characters"));
    }
    // A spec travels in every Raft entry that creates its job, every grant and every status:
    // bounded so that they stay far below the frame limit (a real one is under 2 KB).
    let spec_bytes = serde_json::to_string(&spec.transforms).map_or(usize::MAX, |text| text.len());
    if spec_bytes > MAX_TRANSFORM_SPEC_BYTES {
        return Err(invalid(format!("the transform spec has {spec_bytes} bytes, over the {MAX_TRANSFORM_SPEC_BYTES} a job may have")));
    }
    if rank.0 >= spec.plan.world_size.get() {
        return Err(invalid(format!("{rank} is outside world size {} (ranks count from 0)", spec.plan.world_size)));
    }
    if spec.prefetch == 0 {
        return Err(invalid("prefetch must be at least 1 step"));
    }
    Recipe::new(&spec.transforms).map_err(|error| invalid(format!("the transform spec is not valid: {error}")))?;
    if !spec.transforms.fields.is_empty() {
        // The spec is checked above, so a user learns of a bad field first; serving fields is
        // the next step of issue 32 and is refused until workers make them.
        return Err(invalid(
            "the transform spec names fields: workers do not serve named fields yet (issue 32); remove \"fields\" to get images and labels",
        ));
    }
    Ok(())
}

/// Refuse a new job over the coordinator's limits on ranks, flow window and job count.
pub(crate) fn check_job_limits(spec: &JobSpec, config: &CoreConfig) -> Result<(), RemoteError> {
    let world_size = spec.plan.world_size.get();
    if world_size > config.max_world_size {
        return Err(invalid(format!(
            "world size {world_size} is over the coordinator's limit of {} ranks (raise it with --max-world-size)",
            config.max_world_size
        )));
    }
    if spec.prefetch > config.max_prefetch {
        return Err(invalid(format!(
            "prefetch {} is over the coordinator's limit of {} steps (raise it with --max-prefetch)",
            spec.prefetch, config.max_prefetch
        )));
    }
    // --max-jobs is one of the bounds a creation's entry carries (state_budget::job_over).
    Ok(())
}

/// Most samples a batch may have: its header (a label and a key per sample) must fit a frame.
pub const MAX_BATCH_SIZE: u32 = 16_384;

/// Refuse a new job whose batches are larger than `max_batch_bytes` (batch size × one output
/// sample's bytes) or hold more than [`MAX_BATCH_SIZE`] samples, before any worker allocates.
pub(crate) fn check_batch_size(spec: &JobSpec, max_batch_bytes: u64) -> Result<(), RemoteError> {
    let batch_size = spec.plan.batch_size.get();
    if batch_size > MAX_BATCH_SIZE {
        return Err(invalid(format!("batch size {batch_size} is over the most a batch may hold ({MAX_BATCH_SIZE} samples)")));
    }
    let recipe = Recipe::new(&spec.transforms).map_err(|error| invalid(format!("the transform spec is not valid: {error}")))?;
    let batch_bytes = u64::from(batch_size).saturating_mul(recipe.sample_bytes() as u64);
    if batch_bytes > max_batch_bytes {
        return Err(invalid(format!(
            "a batch of this job is {batch_bytes} bytes ({:.1} MiB: {batch_size} samples of {} bytes, {:?}), over the \
             coordinator's limit of {max_batch_bytes} bytes ({:.1} MiB): lower the batch size or the output size, or raise \
             the limit (stoker coordinator --max-batch-bytes)",
            batch_bytes as f64 / f64::from(1 << 20),
            recipe.sample_bytes(),
            recipe.batch_shape(1),
            max_batch_bytes as f64 / f64::from(1 << 20)
        )));
    }
    Ok(())
}

pub(crate) fn describe_difference(existing: &JobSpec, wanted: &JobSpec) -> String {
    let mut differences = Vec::new();
    if existing.dataset != wanted.dataset {
        differences.push(format!("dataset {:?} vs {:?}", existing.dataset, wanted.dataset));
    }
    if existing.plan != wanted.plan {
        differences.push(format!("plan {:?} vs {:?}", existing.plan, wanted.plan));
    }
    if existing.transforms != wanted.transforms {
        differences.push("transforms differ".to_owned());
    }
    if existing.prefetch != wanted.prefetch {
        differences.push(format!("prefetch {} vs {}", existing.prefetch, wanted.prefetch));
    }
    differences.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with_fields(fields_json: &str) -> JobSpec {
        let mut spec = crate::state::tests::spec("job");
        spec.transforms = stoker_plan::transform::TransformSpec::imagenet_train(224);
        spec.transforms.fields = serde_json::from_str(fields_json).expect("fields parse");
        spec
    }

    /// Fields are checked first (a bad one is named), then refused until workers serve them:
    /// a job never silently gets image + label batches for a spec that asked for more.
    #[test]
    fn a_job_naming_fields_is_refused_after_its_fields_are_checked() {
        assert_eq!(validate_spec(&spec_with_fields("{}"), Rank(0)).map_err(|error| error.message), Ok(()));
        let bad = validate_spec(&spec_with_fields(r#"{"image": {"from": "jpg;png"}, "mask": {"from": "png"}}"#), Rank(0))
            .expect_err("same member");
        assert!(bad.message.contains("both read the member \"png\""), "{}", bad.message);
        let good = validate_spec(&spec_with_fields(r#"{"image": {"from": "jpg"}, "caption": {"from": "txt"}}"#), Rank(0))
            .expect_err("not served yet");
        assert!(good.message.contains("do not serve named fields yet"), "{}", good.message);
    }
}
