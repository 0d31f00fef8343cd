use stoker_plan::fields::{Fields, ValidFields};

use super::*;

fn valid(json: &str) -> ValidFields {
    serde_json::from_str::<Fields>(json).expect("parses").validate().expect("valid")
}

fn field<'a>(fields: &'a ValidFields, name: &str) -> &'a Field {
    fields.fields.iter().find(|field| field.name == name).expect("named")
}

const SPEC: &str = r#"{"image": {"from": "jpg"}, "label": {"from": "cls"}, "caption": {"from": "txt;caption"},
    "meta": {"from": "json"}, "raw": {"from": "bin", "kind": "bytes"}, "arr": {"from": "npy"}}"#;

#[test]
fn each_kind_reads_its_member_in_place() {
    let fields = valid(SPEC);
    assert_eq!(read_field(field(&fields, "label"), Some(b" 42\n")), Ok(FieldValue::Label(42)));
    assert_eq!(read_field(field(&fields, "caption"), Some("a cat 🐈".as_bytes())), Ok(FieldValue::Text("a cat 🐈".into())));
    assert_eq!(read_field(field(&fields, "meta"), Some(br#"{"w": [1, 2]}"#)), Ok(FieldValue::Text(r#"{"w": [1, 2]}"#.into())));
    let raw = [0u8, 255, 7];
    match read_field(field(&fields, "raw"), Some(&raw)) {
        Ok(FieldValue::Bytes(Cow::Borrowed(bytes))) => assert_eq!(bytes.as_ptr(), raw.as_ptr()),
        other => panic!("{other:?}"),
    }
    let npy = include!("npy_golden.in");
    match read_field(field(&fields, "arr"), Some(&npy)) {
        Ok(FieldValue::Array(array)) => assert_eq!(array.shape, [3, 4]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_first_extension_present_is_read() {
    let fields = valid(SPEC);
    let members = [("caption", b"second".as_slice())];
    let member = |extension: &str| members.iter().find(|(name, _)| *name == extension).map(|(_, bytes)| *bytes);
    assert_eq!(field_member(field(&fields, "caption"), member), Some(b"second".as_slice()));
    assert_eq!(field_member(field(&fields, "meta"), member), None);
}

#[test]
fn a_missing_member_does_what_the_field_says() {
    let fields = valid(
        r#"{"image": {"from": "jpg"}, "a": {"from": "txt"}, "b": {"from": "npy", "missing": "replace"},
            "c": {"from": "cls", "missing": {"default": -1}}, "d": {"from": "json", "missing": {"default": {"k": [1]}}},
            "e": {"from": "bin", "kind": "bytes", "missing": {"default": "x"}}}"#,
    );
    let error = read_field(field(&fields, "a"), None).expect_err("fail");
    assert!(error.to_string().contains("no member txt"), "{error}");
    assert_eq!(read_field(field(&fields, "b"), None), Ok(FieldValue::Replace));
    assert_eq!(read_field(field(&fields, "c"), None), Ok(FieldValue::Label(-1)));
    assert_eq!(read_field(field(&fields, "d"), None), Ok(FieldValue::Text(r#"{"k":[1]}"#.into())));
    assert_eq!(read_field(field(&fields, "e"), None), Ok(FieldValue::Bytes(b"x".as_slice().into())));
}

#[test]
fn members_not_of_their_kind_are_errors_naming_the_field() {
    let fields = valid(SPEC);
    for (name, bytes) in [
        ("label", b"cat".as_slice()),
        ("label", b"99999999999999999999999"),
        ("caption", b"\xff\xfe"),
        ("meta", b"{\"a\": "),
        ("meta", b"\xc3"),
        ("arr", b"\x93NUMPY\x01\x00\xff\xff"),
    ] {
        let error = read_field(field(&fields, name), Some(bytes)).expect_err(name);
        assert!(error.to_string().contains(&format!("field {name:?}")), "{error}");
    }
    let deep = "[".repeat(10_000);
    assert!(read_field(field(&fields, "meta"), Some(deep.as_bytes())).is_err(), "nesting is bounded, not a stack overflow");
}
