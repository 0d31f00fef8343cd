use super::*;

fn fields(json: &str) -> Result<ValidFields, FieldError> {
    let fields: Fields = serde_json::from_str(json).unwrap_or_else(|error| panic!("{json}: {error}"));
    fields.validate()
}

#[test]
fn the_issue_example_validates_with_kinds_from_extensions() {
    let valid = fields(
        r#"{"image": {"from": "jpg;png;webp"}, "label": {"from": "cls"}, "caption": {"from": "txt"},
            "meta": {"from": "json"}, "raw": {"from": "bin", "kind": "bytes"}, "arr": {"from": "npy", "missing": "replace"}}"#,
    )
    .expect("valid");
    let kinds: Vec<(&str, FieldKind)> = valid.fields.iter().map(|field| (field.name.as_str(), field.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("arr", FieldKind::Npy),
            ("caption", FieldKind::Text),
            ("image", FieldKind::Image),
            ("label", FieldKind::Label),
            ("meta", FieldKind::Json),
            ("raw", FieldKind::Bytes)
        ]
    );
    assert_eq!(valid.image().map(|field| field.extensions.clone()), Some(vec!["jpg".into(), "png".into(), "webp".into()]));
    assert_eq!(valid.extra().count(), 4);
    assert_eq!(valid.fields[0].missing, Missing::Replace);
}

#[test]
fn no_fields_is_valid_and_empty() {
    assert_eq!(Fields::default().validate(), Ok(ValidFields::default()));
}

#[test]
fn missing_forms_parse() {
    let valid = fields(
        r#"{"image": {"from": "jpg"}, "label": {"from": "cls", "missing": {"default": -1}},
            "caption": {"from": "txt", "missing": {"default": ""}}, "meta": {"from": "json", "missing": {"default": {"a": 1}}}}"#,
    )
    .expect("valid");
    assert_eq!(valid.label().map(|field| field.missing.clone()), Some(Missing::Default(serde_json::json!(-1))));
}

#[test]
fn unknown_kind_is_refused_by_name() {
    let error = serde_json::from_str::<Fields>(r#"{"x": {"from": "bin", "kind": "tensor"}}"#).expect_err("unknown kind");
    assert!(error.to_string().contains("unknown variant `tensor`"), "{error}");
}

#[test]
fn unknown_keys_are_refused() {
    assert!(serde_json::from_str::<Fields>(r#"{"x": {"from": "bin", "knd": "bytes"}}"#).is_err());
}

#[test]
fn bad_extension_lists_are_refused() {
    for from in ["", "jpg;", ";jpg", ".jpg", "jpg;jpg", "a b", "seg..png", "x/y", &"a".repeat(65)] {
        let json = format!(r#"{{"image": {{"from": "jpg"}}, "x": {{"from": {from:?}, "kind": "bytes"}}}}"#);
        match fields(&json) {
            Err(FieldError::BadExtensions { field, .. }) => assert_eq!(field, "x"),
            other => panic!("{from:?}: {other:?}"),
        }
    }
}

#[test]
fn two_fields_from_the_same_member_are_refused() {
    let error = fields(r#"{"image": {"from": "jpg;png"}, "mask": {"from": "png"}}"#).expect_err("same member");
    assert_eq!(error, FieldError::SameMember { first: "image".into(), second: "mask".into(), extension: "png".into() });
    assert!(error.to_string().contains("give each member to one field"));
}

#[test]
fn an_extension_without_a_kind_asks_for_one() {
    let error = fields(r#"{"image": {"from": "jpg"}, "raw": {"from": "bin"}}"#).expect_err("no kind");
    assert!(error.to_string().contains("add \"kind\""), "{error}");
}

#[test]
fn bad_names_are_refused() {
    for name in ["", "Caption", "a-b", "ü"] {
        let json = format!(r#"{{"image": {{"from": "jpg"}}, {name:?}: {{"from": "txt"}}}}"#);
        assert!(matches!(fields(&json), Err(FieldError::BadName { .. })), "{name:?}");
    }
}

#[test]
fn defaults_must_fit_the_kind() {
    for (field, default) in [("cls", r#""x""#), ("txt", "3"), ("npy", "0"), ("jpg", "0")] {
        let kind_json = if field == "jpg" { r#""image": {"from": "png"},"# } else { r#""image": {"from": "jpg"},"# };
        let json = format!(r#"{{{kind_json} "f": {{"from": "{field}", "missing": {{"default": {default}}}}}}}"#);
        assert!(matches!(fields(&json), Err(FieldError::Unsupported { .. })), "{json}");
    }
}

#[test]
fn one_image_and_one_label_at_most_and_an_image_required() {
    assert!(fields(r#"{"a": {"from": "jpg"}, "b": {"from": "png"}}"#).is_err());
    assert!(fields(r#"{"image": {"from": "jpg"}, "a": {"from": "cls"}, "b": {"from": "x.cls"}}"#).is_err());
    let error = fields(r#"{"caption": {"from": "txt"}}"#).expect_err("no image");
    assert!(error.to_string().contains("image field"), "{error}");
    assert!(fields(r#"{"image": {"from": "txt", "kind": "image"}}"#).is_err());
}

#[test]
fn too_many_fields_are_refused() {
    let many: BTreeMap<String, FieldSpec> = (0..=MAX_FIELDS)
        .map(|index| (format!("f{index}"), FieldSpec { from: format!("e{index}"), kind: Some(FieldKind::Bytes), missing: Missing::Fail }))
        .collect();
    assert_eq!(Fields(Box::new(many)).validate(), Err(FieldError::TooManyFields { count: MAX_FIELDS + 1 }));
}

#[test]
fn a_spec_round_trips_through_json() {
    let json = r#"{"image":{"from":"jpg"},"meta":{"from":"json","missing":{"default":{"a":1}}},"raw":{"from":"bin","kind":"bytes","missing":"replace"}}"#;
    let parsed: Fields = serde_json::from_str(json).expect("parses");
    assert_eq!(serde_json::to_string(&parsed).expect("serialises"), json);
}

#[test]
fn a_transform_spec_without_fields_keeps_its_json_text() {
    use crate::transform::TransformSpec;
    let spec = TransformSpec::imagenet_train(224);
    let text = serde_json::to_string(&spec).expect("serialises");
    assert!(!text.contains("fields"), "{text}");
    let with_fields: TransformSpec =
        serde_json::from_str(r#"{"transforms": [], "fields": {"image": {"from": "jpg"}, "caption": {"from": "txt"}}}"#).expect("parses");
    assert_eq!(with_fields.fields.validate().map(|valid| valid.fields.len()), Ok(2));
    let again: TransformSpec = serde_json::from_str(&serde_json::to_string(&with_fields).expect("serialises")).expect("parses");
    assert_eq!(again, with_fields);
}

#[test]
fn recipe_new_reports_a_bad_field() {
    use crate::transform::{Recipe, TransformSpec};
    let spec: TransformSpec = serde_json::from_str(
        r#"{"transforms": [{"type": "CenterCrop", "size": 8}], "fields": {"image": {"from": "jpg"}, "x": {"from": "bin"}}}"#,
    )
    .expect("parses");
    let error = Recipe::new(&spec).expect_err("no kind for bin");
    assert!(error.to_string().starts_with("fields: field \"x\""), "{error}");
}
