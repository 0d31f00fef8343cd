//! Every wire message decoded from arbitrary bytes (`stoker_proto::wire`): decoding must never
//! panic nor allocate past its limit, and whatever decodes must encode again to a frame that
//! decodes to the same bytes.
#![no_main]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;
use stoker_proto::{BatchHeader, ControlRequest, ControlResponse, RemoteError, TrainerHello};
use stoker_proto::wire::{self, BATCH_HEADER_LIMIT, CONTROL_FRAME_LIMIT, PREFIX_BYTES};
use stoker_fuzz::WireKind;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, stream)) = data.split_first() else { return };
    match WireKind::from_byte(selector) {
        WireKind::ControlRequest => frames::<ControlRequest>(stream, CONTROL_FRAME_LIMIT, None),
        WireKind::ControlResult => frames::<Result<ControlResponse, RemoteError>>(stream, CONTROL_FRAME_LIMIT, None),
        WireKind::TrainerHello => frames::<TrainerHello>(stream, CONTROL_FRAME_LIMIT, Some(PartialEq::eq)),
        WireKind::HelloResult => frames::<Result<(), RemoteError>>(stream, CONTROL_FRAME_LIMIT, Some(PartialEq::eq)),
        WireKind::BatchHeader => frames::<BatchHeader>(stream, BATCH_HEADER_LIMIT, Some(PartialEq::eq)),
    }
});

/// Read `stream` as `read_frame` reads a QUIC stream (prefix, limit check, body), frame after
/// frame; also decode everything after the first prefix as one body, whatever the prefix says.
/// `eq` compares values of types whose equality is total (no floats).
fn frames<T>(stream: &[u8], limit: usize, eq: Option<fn(&T, &T) -> bool>)
where
    T: Serialize + DeserializeOwned + Debug,
{
    if let Some(body) = stream.get(PREFIX_BYTES..) {
        round_trip(body, limit, eq);
    }
    let mut rest = stream;
    while let Some((prefix, after)) = rest.split_first_chunk::<PREFIX_BYTES>() {
        let Ok(len) = wire::body_len(*prefix, limit) else { return };
        assert!(len <= limit);
        let Some(body) = after.get(..len) else { return };
        round_trip(body, limit, eq);
        rest = &after[len..];
    }
}

fn round_trip<T>(body: &[u8], limit: usize, eq: Option<fn(&T, &T) -> bool>)
where
    T: Serialize + DeserializeOwned + Debug,
{
    let Ok(value) = wire::decode_body::<T>(body) else { return };
    // bincode's canonical form is never longer than what it decoded, and that fits the limit.
    let frame = wire::encode(&value, limit.max(body.len())).unwrap_or_else(|error| panic!("{value:?} does not encode: {error}"));
    assert!(frame.len() - PREFIX_BYTES <= body.len(), "{value:?} re-encodes longer than it was");
    let len = wire::body_len(frame[..PREFIX_BYTES].try_into().expect("prefix"), limit).expect("the prefix is within the limit");
    assert_eq!(len, frame.len() - PREFIX_BYTES);
    let again: T = wire::decode_body(&frame[PREFIX_BYTES..]).unwrap_or_else(|error| panic!("{value:?} does not decode again: {error}"));
    let frame_again = wire::encode(&again, limit).expect("encodes again");
    assert_eq!(frame, frame_again, "{value:?} and {again:?} encode differently");
    if let Some(eq) = eq {
        assert!(eq(&value, &again), "{value:?} decodes again as {again:?}");
    }
}
