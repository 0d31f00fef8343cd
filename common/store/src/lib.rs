#![doc = include_str!("../README.md")]

/// Settings of the object-store client and the buckets/prefixes datasets may come from.
pub mod config;
/// Errors of object-store access; they name the URI and never a credential.
pub mod error;
/// `s3://bucket/key` URIs.
pub mod uri;

mod client;
mod profile;
mod rate;
mod redact;

pub use self::client::{MAX_OBJECT_READ_BYTES, ObjectStores, StoreCounters};
pub use self::config::{ObjectRoots, StoreConfig};
pub use self::error::StoreError;
pub use self::uri::ObjectUri;
