//! The only place that knows the frame format (DESIGN §7): a frame is a 4-byte little-endian
//! length, then that many bytes of bincode (standard config). The length is checked against
//! the caller's limit before anything is allocated, decoding is bounded by the frame, and a
//! frame with bytes left over after its value is refused. Reading and writing frames on a QUIC
//! stream is `stoker_net::frame`.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest control frame (requests, responses, the trainer hello).
pub const CONTROL_FRAME_LIMIT: usize = 8 << 20;
/// Largest batch header frame (labels and keys of one batch).
pub const BATCH_HEADER_LIMIT: usize = 8 << 20;
/// Largest batch payload anyone accepts, whatever the job says (4 GiB).
pub const BATCH_PAYLOAD_LIMIT: u64 = 4 << 30;
/// Upper bound for any decode: containers claiming more than this fail before allocating.
const DECODE_LIMIT: usize = 8 << 20;

/// Bytes of the length prefix.
pub const PREFIX_BYTES: usize = 4;

/// A frame could not be made, read or understood.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A length prefix (or a value to send) exceeds the limit for its kind of frame.
    #[error("frame of {len} bytes exceeds the {limit}-byte limit")]
    TooLarge {
        /// The announced or encoded length.
        len: u64,
        /// The limit.
        limit: usize,
    },
    /// The value could not be encoded.
    #[error("cannot encode frame: {message}")]
    Encode {
        /// bincode's message.
        message: String,
    },
    /// The bytes are not a valid value of the expected type.
    #[error("malformed frame: {message}")]
    Malformed {
        /// What is wrong.
        message: String,
    },
}

fn config() -> bincode::config::Configuration<bincode::config::LittleEndian, bincode::config::Varint, bincode::config::Limit<DECODE_LIMIT>>
{
    bincode::config::standard().with_limit::<DECODE_LIMIT>()
}

/// `value` as one frame (prefix included), refused if its body exceeds `limit`.
pub fn encode<T>(value: &T, limit: usize) -> Result<Vec<u8>, WireError>
where
    T: Serialize,
{
    let mut frame = vec![0u8; PREFIX_BYTES];
    bincode::serde::encode_into_std_write(value, &mut frame, bincode::config::standard())
        .map_err(|error| WireError::Encode { message: error.to_string() })?;
    let body_len = frame.len() - PREFIX_BYTES;
    let prefix = u32::try_from(body_len).ok().filter(|&len| len as usize <= limit);
    let Some(prefix) = prefix else {
        return Err(WireError::TooLarge { len: body_len as u64, limit });
    };
    frame[..PREFIX_BYTES].copy_from_slice(&prefix.to_le_bytes());
    Ok(frame)
}

/// The body length a prefix announces, refused above `limit`.
pub fn body_len(prefix: [u8; PREFIX_BYTES], limit: usize) -> Result<usize, WireError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > limit {
        return Err(WireError::TooLarge { len: len as u64, limit });
    }
    Ok(len)
}

/// Decode a frame body (without its prefix).
pub fn decode_body<T>(body: &[u8]) -> Result<T, WireError>
where
    T: DeserializeOwned,
{
    let (value, used) =
        bincode::serde::decode_from_slice(body, config()).map_err(|error| WireError::Malformed { message: error.to_string() })?;
    if used != body.len() {
        return Err(WireError::Malformed { message: format!("{} bytes left over after the value", body.len() - used) });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ControlRequest, TrainerHello};
    use stoker_plan::ids::{Rank, WorkerId};

    /// A reason is cut to its limit at a character boundary, never inside a character.
    #[test]
    fn a_stuck_jobs_reason_is_cut_at_a_character_boundary() {
        let long = "é".repeat(crate::StuckJob::MAX_REASON_BYTES);
        let stuck = crate::StuckJob::new(stoker_plan::ids::JobId(1), &long);
        assert_eq!(stuck.reason.len(), crate::StuckJob::MAX_REASON_BYTES);
        let odd = format!("x{long}");
        let cut = crate::StuckJob::new(stoker_plan::ids::JobId(1), &odd);
        assert_eq!(cut.reason.len(), crate::StuckJob::MAX_REASON_BYTES - 1, "not inside the 2-byte character at the limit");
        assert_eq!(crate::StuckJob::new(stoker_plan::ids::JobId(1), "short").reason, "short");
    }

    #[test]
    fn a_request_round_trips() {
        let stuck_jobs = vec![crate::StuckJob::new(stoker_plan::ids::JobId(2), "its data is outside this worker's --dataset-root")];
        let request = ControlRequest::Heartbeat {
            worker: WorkerId(3),
            leases: vec![],
            images: 7,
            stuck_jobs,
            decoded: crate::Decoded { samples: 9, cpu_seconds: 0.5 },
        };
        let frame = encode(&request, CONTROL_FRAME_LIMIT).expect("encodes");
        let len = body_len(frame[..4].try_into().expect("prefix"), CONTROL_FRAME_LIMIT).expect("fits");
        assert_eq!(len, frame.len() - 4);
        assert_eq!(decode_body::<ControlRequest>(&frame[4..]).expect("decodes"), request);
    }

    #[test]
    fn a_grant_round_trips_with_its_next_shards() {
        use crate::{Chunk, ChunkGrant, ControlResponse, JobSpec};
        use stoker_plan::ids::{CertKey, Epoch, JobId, LeaseId, Position, SessionId, ShardId, Step};
        use stoker_plan::{PlanSpec, Shuffle, Tail};
        let plan = PlanSpec {
            seed: 1,
            world_size: std::num::NonZeroU32::MIN,
            batch_size: std::num::NonZeroU32::MIN,
            shuffle: Shuffle::None,
            tail: Tail::Drop,
        };
        let spec = JobSpec {
            name: "job".into(),
            dataset: "train".into(),
            plan,
            transforms: stoker_plan::transform::TransformSpec::imagenet_train(8),
            prefetch: 4,
        };
        let grant = ChunkGrant {
            lease: LeaseId(9),
            chunk: Chunk { job: JobId(1), epoch: Epoch(0), start: Position(0), first_step: Step(2), rank: Rank(0), steps: 2 },
            spec,
            manifest: "s3://bucket/train/manifest.json".into(),
            dataset_version: 7,
            session: SessionId(3),
            trainer: CertKey::UNCHECKED,
            next_shards: vec![ShardId(4), ShardId(0), ShardId(9)],
        };
        let response = ControlResponse::Chunks { grants: vec![grant] };
        let frame = encode(&response, CONTROL_FRAME_LIMIT).expect("encodes");
        assert_eq!(decode_body::<ControlResponse>(&frame[4..]).expect("decodes"), response);
    }

    #[test]
    fn an_oversized_prefix_is_refused_before_reading_the_body() {
        let error = body_len(u32::MAX.to_le_bytes(), CONTROL_FRAME_LIMIT).expect_err("too large");
        assert!(matches!(error, WireError::TooLarge { len, .. } if len == u64::from(u32::MAX)));
    }

    #[test]
    fn a_value_over_the_limit_is_not_encoded() {
        let request = ControlRequest::AddDataset { name: "x".repeat(100), manifest: String::new() };
        assert!(matches!(encode(&request, 50), Err(WireError::TooLarge { .. })));
    }

    #[test]
    fn garbage_and_trailing_bytes_are_errors_not_panics() {
        for body in [&b""[..], b"\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"] {
            assert!(decode_body::<ControlRequest>(body).is_err(), "{body:?}");
        }
        let mut frame = encode(
            &TrainerHello { job: stoker_plan::ids::JobId(1), rank: Rank(0), session: stoker_plan::ids::SessionId(1), bulk: false },
            64,
        )
        .expect("encodes");
        frame.push(0);
        assert!(matches!(decode_body::<TrainerHello>(&frame[4..]), Err(WireError::Malformed { .. })));
    }

    #[test]
    fn a_huge_claimed_container_fails_without_allocating_it() {
        // Variant 1 (ListDatasets is 1; AddDataset 0) then a string length of 2^62.
        let body = [0u8, 0xff, 0, 0, 0, 0, 0, 0, 0, 0x40];
        assert!(decode_body::<ControlRequest>(&body).is_err());
    }
}
