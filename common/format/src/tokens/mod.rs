//! Token datasets as the language-model tools write them, read in place (mapped, never
//! rewritten): Megatron-LM's indexed dataset (`.bin` + `.idx`), llm.c / modded-nanogpt shards,
//! and nanoGPT's headerless arrays of a declared type. Every reader checks what it reads (sizes,
//! offsets, counts, type codes) before it touches the tokens and fails with a [`TokenError`]
//! naming the file and the byte; `tokens.json` ([`TokenManifest`]) records what `stoker index`
//! found. Packing tokens into sequences and reading them in jobs build on this (not yet).

pub mod dataset;
pub mod dtype;
pub mod error;
pub mod llmc;
pub mod manifest;
mod mapped;
pub mod megatron;
pub mod reference_writer;
pub mod stats;

#[cfg(test)]
mod megatron_tests;
#[cfg(test)]
mod stream_tests;

pub use self::dataset::{TokenDataset, TokenFormat, TokenOptions, megatron_paths};
pub use self::dtype::{TokenDtype, TokenSlice};
pub use self::error::TokenError;
pub use self::manifest::{TOKEN_MANIFEST_FILE, TOKEN_MANIFEST_KIND, TokenManifest, TokenManifestFile};
pub use self::stats::{LengthDistribution, TokenScan, TokenStats};
