//! `tokens.json`: what `stoker index` writes beside token files (which it never rewrites): their
//! format, token type, EOS, and each file with its size, tokens and documents, so that a
//! reader can tell a file changed since and plan without scanning it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::dataset::TokenFormat;
use super::dtype::TokenDtype;
use super::error::TokenError;
use crate::error::ShardError;
use crate::manifest::{manifest_kind, read_manifest_text};

/// Conventional file name of a token dataset's manifest beside its files.
pub const TOKEN_MANIFEST_FILE: &str = "tokens.json";
/// The `kind` of a token dataset's manifest (image manifests have none).
pub const TOKEN_MANIFEST_KIND: &str = "tokens";
/// Version written by this build; readers refuse newer ones.
pub const TOKEN_MANIFEST_VERSION: u32 = 1;

/// A token dataset: files of one format and token type, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenManifest {
    /// Always [`TOKEN_MANIFEST_KIND`]: what tells this manifest from an image dataset's.
    pub kind: String,
    /// Format version.
    pub version: u32,
    /// The layout of every file.
    pub format: TokenFormat,
    /// The token type of every file.
    pub dtype: TokenDtype,
    /// The token that ends each document (llm.c and raw files), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos: Option<i64>,
    /// The files, in order.
    pub files: Vec<TokenManifestFile>,
}

/// One file (a Megatron dataset: its `.bin` and `.idx`) of a token manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenManifestFile {
    /// The token file: a path relative to the manifest's folder, an absolute path, or `file://`.
    pub uri: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// A Megatron dataset's `.idx`, as `uri`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_uri: Option<String>,
    /// The `.idx`'s size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_bytes: Option<u64>,
    /// Tokens in the file.
    pub tokens: u64,
    /// Documents in the file.
    pub documents: u64,
    /// The largest token in the file, when it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_token: Option<i64>,
}

impl TokenManifest {
    /// A manifest of `files` of this format and type, at this build's version.
    pub fn new(format: TokenFormat, dtype: TokenDtype, eos: Option<i64>, files: Vec<TokenManifestFile>) -> Self {
        Self { kind: TOKEN_MANIFEST_KIND.to_owned(), version: TOKEN_MANIFEST_VERSION, format, dtype, eos, files }
    }

    /// Whether the manifest text declares a token dataset.
    pub fn is_token_manifest(text: &str) -> bool {
        manifest_kind(text).as_deref() == Some(TOKEN_MANIFEST_KIND)
    }

    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        let text = read_manifest_text(path)?;
        Self::parse(&text, path)
    }

    /// Parse and check the text of a token manifest; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, TokenError> {
        let bad = |reason: String| TokenError::from(ShardError::BadManifest { path: path.to_path_buf(), reason });
        let manifest: Self = serde_json::from_str(text).map_err(|error| bad(format!("not a valid token manifest: {error}")))?;
        if manifest.kind != TOKEN_MANIFEST_KIND {
            return Err(bad(format!("kind {:?}, not {TOKEN_MANIFEST_KIND:?}", manifest.kind)));
        }
        if manifest.version > TOKEN_MANIFEST_VERSION {
            return Err(bad(format!(
                "version {} is newer than this build reads ({TOKEN_MANIFEST_VERSION}): upgrade stoker",
                manifest.version
            )));
        }
        let megatron = manifest.format == TokenFormat::Megatron;
        for file in &manifest.files {
            if megatron != file.index_uri.is_some() {
                return Err(bad(format!("{}: a .idx is listed exactly for Megatron-LM datasets", file.uri)));
            }
        }
        if megatron && manifest.eos.is_some() {
            return Err(bad("an eos is given of a Megatron-LM dataset, whose documents are its sequences".to_owned()));
        }
        Ok(manifest)
    }

    /// Write to `path` atomically (temporary file + rename), pretty-printed.
    pub fn save(&self, path: &Path) -> Result<(), TokenError> {
        let bad = |reason: String| TokenError::from(ShardError::BadManifest { path: path.to_path_buf(), reason });
        let mut text = serde_json::to_string_pretty(self).map_err(|error| bad(error.to_string()))?;
        text.push('\n');
        let temporary = path.with_extension("json.tmp");
        std::fs::write(&temporary, text).map_err(|source| TokenError::io("failed to write manifest", &temporary, source))?;
        std::fs::rename(&temporary, path).map_err(|source| TokenError::io("failed to write manifest", path, source))
    }

    /// Tokens of all files, saturating.
    pub fn tokens(&self) -> u64 {
        self.files.iter().fold(0, |total, file| total.saturating_add(file.tokens))
    }

    /// Documents of all files, saturating.
    pub fn documents(&self) -> u64 {
        self.files.iter().fold(0, |total, file| total.saturating_add(file.documents))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Manifest;

    fn file(uri: &str) -> TokenManifestFile {
        TokenManifestFile { uri: uri.into(), bytes: 1024, index_uri: None, index_bytes: None, tokens: 10, documents: 2, max_token: Some(9) }
    }

    #[test]
    fn token_manifests_round_trip_and_image_manifests_refuse_them_by_name() {
        let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
        let path = dir.path().join(TOKEN_MANIFEST_FILE);
        let manifest = TokenManifest::new(TokenFormat::Llmc, TokenDtype::Uint16, Some(50256), vec![file("a.bin"), file("b.bin")]);
        manifest.save(&path).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(TokenManifest::load(&path).ok(), Some(manifest.clone()));
        assert_eq!((manifest.tokens(), manifest.documents()), (20, 4));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{error}"));
        assert!(TokenManifest::is_token_manifest(&text));
        let refused = Manifest::parse(&text, &path).expect_err("an image manifest is not a token manifest");
        assert!(refused.to_string().contains("token dataset"), "{refused}");
        assert!(!TokenManifest::is_token_manifest(r#"{"version":1,"shards":[]}"#));
    }

    #[test]
    fn inconsistent_or_newer_token_manifests_are_refused() {
        let path = Path::new("tokens.json");
        let megatron_without_idx = TokenManifest::new(TokenFormat::Megatron, TokenDtype::Uint16, None, vec![file("a.bin")]);
        let eos_of_megatron = TokenManifest::new(
            TokenFormat::Megatron,
            TokenDtype::Int32,
            Some(0),
            vec![TokenManifestFile { index_uri: Some("a.idx".into()), index_bytes: Some(50), ..file("a.bin") }],
        );
        let newer =
            TokenManifest { version: TOKEN_MANIFEST_VERSION + 1, ..TokenManifest::new(TokenFormat::Raw, TokenDtype::Uint16, None, vec![]) };
        for manifest in [megatron_without_idx, eos_of_megatron, newer] {
            let text = serde_json::to_string(&manifest).unwrap_or_else(|error| panic!("{error}"));
            assert!(TokenManifest::parse(&text, path).is_err(), "{text}");
        }
        assert!(TokenManifest::parse(r#"{"kind":"tokens","version":1,"format":"raw","dtype":"uint16","files":[],"x":1}"#, path).is_err());
        assert!(TokenManifest::parse(r#"{"kind":"images","version":1,"format":"raw","dtype":"uint16","files":[]}"#, path).is_err());
    }
}
