//! The bearer token Prometheus presents when scraping (its `authorization.credentials_file`):
//! read from a file at start, compared in constant time, never printed.

use std::path::Path;

use crate::error::ObsError;

/// Fewest characters a token may have (`openssl rand -hex 32` makes 64).
const MIN_TOKEN_CHARS: usize = 16;
/// Largest token file read.
const MAX_TOKEN_BYTES: u64 = 4096;

/// A scrape token.
#[derive(Clone)]
pub struct ScrapeToken(String);

impl std::fmt::Debug for ScrapeToken {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ScrapeToken(..)")
    }
}

impl ScrapeToken {
    /// The token in the file at `path` (surrounding whitespace dropped), as Prometheus reads
    /// its `credentials_file`.
    pub fn from_file(path: &Path) -> Result<Self, ObsError> {
        let failed = |message: String| ObsError::TokenFile { path: path.to_owned(), message };
        let length = std::fs::metadata(path).map_err(|error| failed(error.to_string()))?.len();
        if length > MAX_TOKEN_BYTES {
            return Err(failed(format!("{length} bytes; a token has at most {MAX_TOKEN_BYTES}")));
        }
        let text = std::fs::read_to_string(path).map_err(|error| failed(error.to_string()))?;
        Self::new(text.trim()).map_err(failed)
    }

    /// `token` itself, if it is long enough and has no whitespace or control characters.
    pub fn new(token: &str) -> Result<Self, String> {
        if token.chars().count() < MIN_TOKEN_CHARS {
            return Err(format!("a token needs at least {MIN_TOKEN_CHARS} characters: make one with `openssl rand -hex 32`"));
        }
        if token.chars().any(|character| character.is_whitespace() || character.is_control()) {
            return Err("a token has no spaces or control characters".to_owned());
        }
        Ok(Self(token.to_owned()))
    }

    /// Whether `presented` is this token, compared in time independent of where they differ.
    pub(crate) fn matches(&self, presented: &str) -> bool {
        let (expected, given) = (self.0.as_bytes(), presented.as_bytes());
        let differing = expected.iter().zip(given).fold(0u8, |differing, (left, right)| differing | (left ^ right));
        expected.len() == given.len() && differing == 0
    }
}
