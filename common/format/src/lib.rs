#![doc = include_str!("../README.md")]
//!
//! WebDataset tar shards (DESIGN §3): reading, indexing, grouping into samples, manifests,
//! brace patterns, and packing an ImageFolder into shards; token datasets (`tokens`).

/// Errors of reading and writing shards, indexes and manifests.
pub mod error;

pub mod brace;
/// A sample's field read from its member by the field's kind (issue 32).
pub mod field_value;
pub mod index;
pub mod manifest;
/// NumPy `.npy` arrays read in place, with a bounded header parser.
pub mod npy;
pub mod pack;
/// Opening dataset files: regular files only, without blocking on a FIFO.
pub mod regular_file;
pub mod roots;
pub mod sample_key;
pub mod shard_file;
pub mod tar_reader;
pub mod tar_writer;
pub mod tokens;

pub use self::index::{ShardIndex, build_index};
pub use self::manifest::{MANIFEST_FILE, Manifest, ManifestShard, ShardLocation, resolve_uri};
pub use self::roots::DatasetRoots;
pub use self::shard_file::{IndexPolicy, IndexStatus, Sample, Shard, index_path};
