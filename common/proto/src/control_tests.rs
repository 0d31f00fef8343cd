//! `JobSpec`'s wire encoding: its typed transforms travel as the JSON text they always did.

use std::num::NonZeroU32;

use serde::{Deserialize, Serialize};
use stoker_plan::transform::TransformSpec;
use stoker_plan::{PlanSpec, Shuffle, Tail};

use super::JobSpec;
use crate::wire;

/// `JobSpec` as it was before its transforms were typed: their JSON text.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct JobSpecBefore {
    name: String,
    dataset: String,
    plan: PlanSpec,
    transforms: String,
    prefetch: u32,
}

fn plan() -> PlanSpec {
    PlanSpec {
        seed: 42,
        world_size: NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN),
        batch_size: NonZeroU32::new(32).unwrap_or(NonZeroU32::MIN),
        shuffle: Shuffle::Full,
        tail: Tail::Pad,
    }
}

#[test]
fn a_job_spec_encodes_as_it_did_when_its_transforms_were_text() {
    let transforms = TransformSpec::imagenet_train(224);
    let spec = JobSpec { name: "resnet".into(), dataset: "imagenet".into(), plan: plan(), transforms: transforms.clone(), prefetch: 4 };
    let before = JobSpecBefore {
        name: "resnet".into(),
        dataset: "imagenet".into(),
        plan: plan(),
        transforms: serde_json::to_string(&transforms).expect("json"),
        prefetch: 4,
    };
    let limit = wire::CONTROL_FRAME_LIMIT;
    assert_eq!(wire::encode(&spec, limit).expect("encodes"), wire::encode(&before, limit).expect("encodes"));
    assert_eq!(serde_json::to_string(&spec).expect("json"), serde_json::to_string(&before).expect("json"));
}

#[test]
fn a_job_spec_encoded_before_decodes_and_a_bad_transform_text_is_refused() {
    // As a trainer wrote it: whitespace, defaults left out.
    let text = r#"{"transforms": [{"type": "RandomResizedCrop", "size": 224}, {"type": "RandomHorizontalFlip"}]}"#;
    let before = JobSpecBefore { name: "a".into(), dataset: "d".into(), plan: plan(), transforms: text.into(), prefetch: 8 };
    let frame = wire::encode(&before, wire::CONTROL_FRAME_LIMIT).expect("encodes");
    let spec: JobSpec = wire::decode_body(&frame[wire::PREFIX_BYTES..]).expect("decodes");
    assert_eq!(spec.transforms, TransformSpec::imagenet_train(224));
    assert_eq!((spec.name.as_str(), spec.dataset.as_str(), spec.plan, spec.prefetch), ("a", "d", plan(), 8));
    let bad = JobSpecBefore { transforms: r#"{"transforms": [{"type": "Blur"}]}"#.into(), ..before };
    let frame = wire::encode(&bad, wire::CONTROL_FRAME_LIMIT).expect("encodes");
    assert!(wire::decode_body::<JobSpec>(&frame[wire::PREFIX_BYTES..]).is_err());
}

/// A frame body written before the field was typed (its transforms as a trainer sent them:
/// defaults left out), pinned byte for byte.
const WRITTEN_BEFORE: &str = concat!(
    "067265736e657408696d6167656e65742a02200201587b227472616e73666f726d73223a5b7b2274797065223a",
    "2252616e646f6d526573697a656443726f70222c2273697a65223a3232347d2c7b2274797065223a2252616e",
    "646f6d486f72697a6f6e74616c466c6970227d5d7d04"
);

#[test]
fn a_job_spec_encoded_before_its_transforms_were_typed_decodes() {
    let bytes: Vec<u8> =
        (0..WRITTEN_BEFORE.len()).step_by(2).map(|at| u8::from_str_radix(&WRITTEN_BEFORE[at..at + 2], 16).expect("hex")).collect();
    let spec: JobSpec = wire::decode_body(&bytes).expect("decodes");
    let expected = JobSpec {
        name: "resnet".into(),
        dataset: "imagenet".into(),
        plan: plan(),
        transforms: TransformSpec::imagenet_train(224),
        prefetch: 4,
    };
    assert_eq!(spec, expected);
}
