//! What one field of a sample is, read from its member by the field's kind (issue 32): the pure
//! step between a sample's members (slices of the mmap) and a batch's field sections. A
//! missing member resolves by the field's `missing` rule; a member that is there but not of its
//! kind (text that is not UTF-8, JSON that does not parse, a bad `.npy`) is an error that names
//! the field, for the caller to report with the shard and key.

use std::borrow::Cow;

use stoker_plan::fields::{Field, FieldKind, Missing};

use crate::npy::{NpyArray, NpyError, parse_npy};

/// A field's value for one sample. Borrowed from the member where it can be.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue<'a> {
    /// An integer label.
    Label(i64),
    /// UTF-8 text, or JSON text (checked to parse).
    Text(Cow<'a, str>),
    /// Raw bytes.
    Bytes(Cow<'a, [u8]>),
    /// An array.
    Array(NpyArray<'a>),
    /// The member is missing and the field says `"replace"`: the sample is replaced and
    /// flagged, as an undecodable image is.
    Replace,
}

/// A member that is not what its field's kind says, or a missing one under `"fail"`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FieldValueError {
    /// No member with any of the field's extensions, and `"missing": "fail"`.
    #[error("field {field:?}: no member {looked_for} (the field says \"missing\": \"fail\"; use \"replace\" or {{\"default\": ...}})")]
    Missing {
        /// The field.
        field: String,
        /// The extensions looked for, `;`-separated.
        looked_for: String,
    },
    /// A label that is not a decimal integer.
    #[error("field {field:?}: label {text:?} is not a decimal integer")]
    BadLabel {
        /// The field.
        field: String,
        /// The member's first bytes, lossily as text.
        text: String,
    },
    /// Text that is not UTF-8.
    #[error("field {field:?}: the member is not UTF-8 text (valid up to byte {valid_up_to})")]
    NotUtf8 {
        /// The field.
        field: String,
        /// Bytes that were valid.
        valid_up_to: usize,
    },
    /// JSON that does not parse.
    #[error("field {field:?}: the member is not JSON: {problem}")]
    BadJson {
        /// The field.
        field: String,
        /// serde_json's message (line and column).
        problem: String,
    },
    /// An `.npy` member that cannot be read.
    #[error("field {field:?}: {source}")]
    BadNpy {
        /// The field.
        field: String,
        /// Why.
        source: NpyError,
    },
    /// A field the worker makes elsewhere (the image is decoded by the pipeline).
    #[error("field {field:?}: an image field is decoded by the pipeline, not read as a value")]
    Image {
        /// The field.
        field: String,
    },
}

/// The member a field reads: the first of its extensions the sample has.
pub fn field_member<'a>(field: &Field, member: impl Fn(&str) -> Option<&'a [u8]>) -> Option<&'a [u8]> {
    field.extensions.iter().find_map(|extension| member(extension))
}

/// The field's value for a sample whose member is `member_opt` (`None`: missing).
pub fn read_field<'a>(field: &'a Field, member_opt: Option<&'a [u8]>) -> Result<FieldValue<'a>, FieldValueError> {
    let name = || field.name.clone();
    let Some(member) = member_opt else {
        return match &field.missing {
            Missing::Fail => Err(FieldValueError::Missing { field: name(), looked_for: field.extensions.join(";") }),
            Missing::Replace => Ok(FieldValue::Replace),
            Missing::Default(value) => default_value(field, value),
        };
    };
    match field.kind {
        FieldKind::Image => Err(FieldValueError::Image { field: name() }),
        FieldKind::Label => {
            let text = std::str::from_utf8(member).ok().map(str::trim);
            match text.and_then(|text| text.parse().ok()) {
                Some(label) => Ok(FieldValue::Label(label)),
                None => Err(FieldValueError::BadLabel {
                    field: name(),
                    text: String::from_utf8_lossy(&member[..member.len().min(32)]).into_owned(),
                }),
            }
        }
        FieldKind::Text => match std::str::from_utf8(member) {
            Ok(text) => Ok(FieldValue::Text(Cow::Borrowed(text))),
            Err(error) => Err(FieldValueError::NotUtf8 { field: name(), valid_up_to: error.valid_up_to() }),
        },
        FieldKind::Json => {
            let text = std::str::from_utf8(member)
                .map_err(|error| FieldValueError::NotUtf8 { field: name(), valid_up_to: error.valid_up_to() })?;
            // Checked without building the value; serde_json bounds nesting at 128 levels.
            serde_json::from_str::<serde::de::IgnoredAny>(text)
                .map_err(|error| FieldValueError::BadJson { field: name(), problem: error.to_string() })?;
            Ok(FieldValue::Text(Cow::Borrowed(text)))
        }
        FieldKind::Bytes => Ok(FieldValue::Bytes(Cow::Borrowed(member))),
        FieldKind::Npy => parse_npy(member).map(FieldValue::Array).map_err(|source| FieldValueError::BadNpy { field: name(), source }),
    }
}

/// A `{"default": VALUE}` as the field's value. [`stoker_plan::fields::Fields::validate`] has
/// checked that it fits the kind; one that does not (a spec not validated) is the missing
/// member's error.
fn default_value<'a>(field: &'a Field, value: &'a serde_json::Value) -> Result<FieldValue<'a>, FieldValueError> {
    let fitted = match field.kind {
        FieldKind::Label => value.as_i64().map(FieldValue::Label),
        FieldKind::Text => value.as_str().map(|text| FieldValue::Text(Cow::Borrowed(text))),
        FieldKind::Bytes => value.as_str().map(|text| FieldValue::Bytes(Cow::Borrowed(text.as_bytes()))),
        FieldKind::Json => serde_json::to_string(value).ok().map(|text| FieldValue::Text(Cow::Owned(text))),
        FieldKind::Image | FieldKind::Npy => None,
    };
    fitted.ok_or_else(|| FieldValueError::Missing { field: field.name.clone(), looked_for: field.extensions.join(";") })
}

#[cfg(test)]
#[path = "field_value_tests.rs"]
mod tests;
