//! Fields of a sample (issue 32): which members of a WebDataset sample a job reads and what each
//! becomes. A job spec without fields means today's sample: an image (the first of the image
//! extensions present) and a `.cls` label.
//!
//! ```json
//! {"image": {"from": "jpg;png;webp"}, "label": {"from": "cls"}, "caption": {"from": "txt"},
//!  "meta": {"from": "json"}, "raw": {"from": "bin", "kind": "bytes"},
//!  "arr": {"from": "npy", "missing": "replace"}}
//! ```
//!
//! `from` lists extensions (`;`-separated), the first present wins; `kind` defaults from the
//! first extension's last part (`jpg` → image, `cls` → label, `txt` → text, `json` → json,
//! `npy` → npy; anything else needs a `kind`); `missing` is `"fail"` (the default),
//! `"replace"` (the sample is replaced and flagged, as an undecodable image is) or
//! `{"default": VALUE}`. [`Fields::validate`] checks all of it when the job is created.

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most fields a job may name.
pub const MAX_FIELDS: usize = 32;
/// Longest field name, in bytes.
pub const MAX_FIELD_NAME: usize = 64;
/// Most extensions one field may list.
pub const MAX_EXTENSIONS: usize = 16;
/// Longest extension, in bytes (`seg.png`, `boxes.npy`, ...).
pub const MAX_EXTENSION: usize = 64;
/// Largest default value of a text, JSON or bytes field, in bytes.
pub const MAX_DEFAULT_BYTES: usize = 64 * 1024;

/// Image extensions the worker decodes (the pipeline's list).
pub const IMAGE_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "webp", "bmp"];

/// What a member becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldKind {
    /// Decoded and transformed: the batch's images.
    Image,
    /// A decimal integer (`.cls`): the batch's labels, `int64`.
    Label,
    /// UTF-8 text, passed through (values + offsets).
    Text,
    /// JSON, checked to be UTF-8 JSON and passed through as text (values + offsets).
    Json,
    /// Raw bytes, passed through (values + offsets).
    Bytes,
    /// A NumPy `.npy` array: a tensor when every sample has the same dtype and shape, else
    /// values + offsets with each sample's shape.
    Npy,
}

impl FieldKind {
    /// The kind an extension means when a field names none: its last dot-separated part.
    pub fn from_extension(extension: &str) -> Option<Self> {
        let last = extension.rsplit('.').next().unwrap_or(extension);
        match last {
            "jpg" | "jpeg" | "png" | "webp" | "bmp" => Some(Self::Image),
            "cls" => Some(Self::Label),
            "txt" => Some(Self::Text),
            "json" => Some(Self::Json),
            "npy" => Some(Self::Npy),
            _ => None,
        }
    }

    /// The kind's name in a spec.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Image => "image",
            Self::Label => "label",
            Self::Text => "text",
            Self::Json => "json",
            Self::Bytes => "bytes",
            Self::Npy => "npy",
        }
    }
}

/// What a sample without the field's member does.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Missing {
    /// The job fails, naming the shard and key (the default).
    #[default]
    Fail,
    /// The sample is replaced (black image, default values) and flagged in the batch header.
    Replace,
    /// This value is used: an integer for a label, a string for text or bytes, any JSON for
    /// JSON.
    Default(serde_json::Value),
}

/// One field as a job spec states it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// Extensions, `;`-separated, the first present wins.
    pub from: String,
    /// What the member becomes; from the first extension when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FieldKind>,
    /// What a sample without the member does.
    #[serde(default, skip_serializing_if = "is_fail")]
    pub missing: Missing,
}

fn is_fail(missing: &Missing) -> bool {
    *missing == Missing::Fail
}

/// The fields of a job, by name. Empty: today's image + `.cls` label. Boxed: every job spec
/// carries it, in Raft commands and requests the coordinator's core passes by value, and nearly
/// all are empty.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fields(pub Box<BTreeMap<String, FieldSpec>>);

/// A field spec that cannot be made: the message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    /// More fields than [`MAX_FIELDS`].
    #[error("{count} fields are more than the {MAX_FIELDS} a job may name")]
    TooManyFields {
        /// Fields named.
        count: usize,
    },
    /// A field name that is empty, too long or not `[a-z0-9_]`.
    #[error("field name {name:?}: use 1 to {MAX_FIELD_NAME} characters of a-z, 0-9 and _")]
    BadName {
        /// The name.
        name: String,
    },
    /// A `from` list that is empty, too long, or holds a bad or repeated extension.
    #[error("field {field:?}: bad extension list {from:?}: {problem}")]
    BadExtensions {
        /// The field.
        field: String,
        /// Its `from`.
        from: String,
        /// What is wrong.
        problem: String,
    },
    /// Two fields read the same member.
    #[error("fields {first:?} and {second:?} both read the member {extension:?}: give each member to one field")]
    SameMember {
        /// The field named first (in name order).
        first: String,
        /// The other.
        second: String,
        /// The extension both list.
        extension: String,
    },
    /// A field whose kind cannot be told from its extension.
    #[error("field {field:?}: no kind for extension {extension:?}: add \"kind\": one of image, label, text, json, bytes, npy")]
    NoKind {
        /// The field.
        field: String,
        /// Its first extension.
        extension: String,
    },
    /// A kind used in a way the worker does not build.
    #[error("field {field:?} ({kind}): {problem}")]
    Unsupported {
        /// The field.
        field: String,
        /// Its kind's name.
        kind: &'static str,
        /// What is wrong and what to do.
        problem: String,
    },
}

/// A validated field: its name, extensions and kind.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// The field's name.
    pub name: String,
    /// Extensions to look for, in order.
    pub extensions: Vec<String>,
    /// What the member becomes.
    pub kind: FieldKind,
    /// What a sample without the member does.
    pub missing: Missing,
}

/// Validated fields, in name order, with the image field and label field singled out.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ValidFields {
    /// Every field, in name order.
    pub fields: Vec<Field>,
}

impl ValidFields {
    /// The image field, if the job names one.
    pub fn image(&self) -> Option<&Field> {
        self.fields.iter().find(|field| field.kind == FieldKind::Image)
    }

    /// The label field, if the job names one.
    pub fn label(&self) -> Option<&Field> {
        self.fields.iter().find(|field| field.kind == FieldKind::Label)
    }

    /// The fields that are neither the image nor the label: each an extra section of a batch.
    pub fn extra(&self) -> impl Iterator<Item = &Field> {
        self.fields.iter().filter(|field| !matches!(field.kind, FieldKind::Image | FieldKind::Label))
    }
}

impl Fields {
    /// No fields: today's image + label.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks every field and the fields together.
    pub fn validate(&self) -> Result<ValidFields, FieldError> {
        if self.0.len() > MAX_FIELDS {
            return Err(FieldError::TooManyFields { count: self.0.len() });
        }
        let mut fields = Vec::with_capacity(self.0.len());
        let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, spec) in self.0.iter() {
            check_name(name)?;
            let extensions = parse_extensions(name, &spec.from)?;
            for extension in &extensions {
                if let Some(first) = owners.insert(extension, name) {
                    return Err(FieldError::SameMember {
                        first: first.to_string(),
                        second: name.clone(),
                        extension: extension.to_string(),
                    });
                }
            }
            let kind = match spec.kind {
                Some(kind) => kind,
                None => FieldKind::from_extension(extensions[0])
                    .ok_or_else(|| FieldError::NoKind { field: name.clone(), extension: extensions[0].to_string() })?,
            };
            check_kind(name, kind, &extensions, &spec.missing)?;
            fields.push(Field {
                name: name.clone(),
                extensions: extensions.iter().map(|extension| extension.to_string()).collect(),
                kind,
                missing: spec.missing.clone(),
            });
        }
        let valid = ValidFields { fields };
        for kind in [FieldKind::Image, FieldKind::Label] {
            let mut of_kind = valid.fields.iter().filter(|field| field.kind == kind);
            if let (Some(first), Some(second)) = (of_kind.next(), of_kind.next()) {
                return Err(FieldError::Unsupported {
                    field: second.name.clone(),
                    kind: kind.name(),
                    problem: format!("{:?} is already the job's {} field: a batch has one", first.name, kind.name()),
                });
            }
        }
        if !valid.fields.is_empty() && valid.image().is_none() {
            return Err(FieldError::Unsupported {
                field: valid.fields[0].name.clone(),
                kind: valid.fields[0].kind.name(),
                problem: "a job's fields must include an image field (batches without images are not built yet)".into(),
            });
        }
        Ok(valid)
    }
}

fn check_name(name: &str) -> Result<(), FieldError> {
    let good = !name.is_empty()
        && name.len() <= MAX_FIELD_NAME
        && name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_');
    if good { Ok(()) } else { Err(FieldError::BadName { name: name.to_string() }) }
}

fn parse_extensions<'a>(field: &str, from: &'a str) -> Result<Vec<&'a str>, FieldError> {
    let bad = |problem: String| FieldError::BadExtensions { field: field.to_string(), from: from.to_string(), problem };
    let extensions: Vec<&str> = from.split(';').map(str::trim).collect();
    if extensions.len() > MAX_EXTENSIONS {
        return Err(bad(format!("{} extensions are more than {MAX_EXTENSIONS}", extensions.len())));
    }
    for (index, extension) in extensions.iter().enumerate() {
        if extension.is_empty() {
            return Err(bad("an empty extension: write them like \"jpg;png\"".into()));
        }
        let good_chars = extension.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
        if extension.len() > MAX_EXTENSION
            || !good_chars
            || extension.starts_with('.')
            || extension.ends_with('.')
            || extension.contains("..")
        {
            return Err(bad(format!(
                "{extension:?}: an extension is the member name after the key's dot, up to {MAX_EXTENSION} characters of letters, digits, '.', '_' and '-', without a leading dot"
            )));
        }
        if extensions[..index].contains(extension) {
            return Err(bad(format!("{extension:?} is listed twice")));
        }
    }
    Ok(extensions)
}

fn check_kind(field: &str, kind: FieldKind, extensions: &[&str], missing: &Missing) -> Result<(), FieldError> {
    let unsupported = |problem: String| FieldError::Unsupported { field: field.to_string(), kind: kind.name(), problem };
    if kind == FieldKind::Image
        && let Some(other) = extensions.iter().find(|extension| !IMAGE_EXTENSIONS.contains(extension))
    {
        return Err(unsupported(format!("{other:?} is not an image extension the worker decodes ({})", IMAGE_EXTENSIONS.join(", "))));
    }
    let Missing::Default(value) = missing else { return Ok(()) };
    let fits = match kind {
        FieldKind::Image | FieldKind::Npy => {
            return Err(unsupported("a default value is not supported: use \"missing\": \"fail\" or \"replace\"".into()));
        }
        FieldKind::Label => value.as_i64().is_some(),
        FieldKind::Text | FieldKind::Bytes => value.as_str().is_some_and(|text| text.len() <= MAX_DEFAULT_BYTES),
        FieldKind::Json => serde_json::to_string(value).is_ok_and(|text| text.len() <= MAX_DEFAULT_BYTES),
    };
    if fits {
        Ok(())
    } else {
        Err(unsupported(format!(
            "default {value} does not fit: a label takes an integer, text and bytes a string, json any JSON, each at most {MAX_DEFAULT_BYTES} bytes"
        )))
    }
}
