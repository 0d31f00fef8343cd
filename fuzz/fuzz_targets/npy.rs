//! `.npy` members (`parse_npy`) and every field kind reading them (`read_field`): never a
//! panic, and an array that parses has exactly the data its dtype and shape say, within the
//! member (a header that lies about its size is refused, not allocated for).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_format::field_value::read_field;
use stoker_format::npy::parse_npy;
use stoker_plan::fields::Fields;

fuzz_target!(|data: &[u8]| {
    if let Ok(array) = parse_npy(data) {
        let elements = array.shape.iter().try_fold(1u64, |total, &dim| total.checked_mul(dim)).expect("a parsed shape fits 64 bits");
        assert_eq!(elements * array.dtype.size() as u64, array.data.len() as u64);
        assert!(array.data.len() <= data.len());
    }
    let spec = r#"{"image": {"from": "jpg"}, "a": {"from": "npy"}, "b": {"from": "cls"}, "c": {"from": "txt"},
        "d": {"from": "json"}, "e": {"from": "bin", "kind": "bytes"}}"#;
    let fields = serde_json::from_str::<Fields>(spec).expect("parses").validate().expect("valid");
    for field in &fields.fields {
        let _ = read_field(field, Some(data));
    }
});
