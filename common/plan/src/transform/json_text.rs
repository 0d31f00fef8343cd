//! A [`TransformSpec`] carried as its JSON text: the form it has always had inside a
//! `JobSpec` on the wire, in the Raft log and in snapshots. Use with
//! `#[serde(with = "stoker_plan::transform::json_text")]`: the field is typed in memory, and
//! serialises as the string `serde_json::to_string(&spec)` (bincode: a length and the UTF-8
//! bytes), so encodings written before the field was typed read the same, and the same spec
//! encodes to the same bytes. The text is parsed here, once, where it enters a process.

use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

use super::TransformSpec;

/// Write `spec` as its JSON text.
pub fn serialize<S>(spec: &TransformSpec, serializer: S) -> Result<S::Ok, S::Error>
where
    S: Serializer,
{
    let text = serde_json::to_string(spec).map_err(S::Error::custom)?;
    serializer.serialize_str(&text)
}

/// Read a spec from its JSON text.
pub fn deserialize<'de, D>(deserializer: D) -> Result<TransformSpec, D::Error>
where
    D: Deserializer<'de>,
{
    let text = String::deserialize(deserializer)?;
    serde_json::from_str(&text).map_err(|error| D::Error::custom(format!("the transform spec is not valid: {error}")))
}
