//! What a scan of token datasets finds: tokens, documents, the largest and smallest token, and
//! the distribution of document lengths.

use serde::Serialize;

/// Accumulates documents and tokens over one or more datasets.
#[derive(Debug, Default)]
pub struct TokenScan {
    tokens: u64,
    min_token: Option<i64>,
    max_token: Option<i64>,
    lengths: Vec<u64>,
}

/// The summary of a scan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenStats {
    /// Tokens.
    pub tokens: u64,
    /// Documents.
    pub documents: u64,
    /// The smallest token seen (negative ones are an error of the data).
    pub min_token: Option<i64>,
    /// The largest token seen.
    pub max_token: Option<i64>,
    /// A lower bound of the vocabulary size: the largest token + 1.
    pub vocab_at_least: Option<u64>,
    /// Document lengths in tokens, when there are documents.
    pub document_length: Option<LengthDistribution>,
}

/// Document lengths in tokens: nearest-rank percentiles.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LengthDistribution {
    /// Shortest.
    pub min: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Longest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl TokenScan {
    /// A scan that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Count one token.
    #[inline]
    pub fn token(&mut self, token: i64) {
        self.tokens += 1;
        self.min_token = Some(self.min_token.map_or(token, |min| min.min(token)));
        self.max_token = Some(self.max_token.map_or(token, |max| max.max(token)));
    }

    /// Count tokens whose smallest and largest are known (a run scanned elsewhere).
    pub fn tokens(&mut self, count: u64, min: i64, max: i64) {
        if count == 0 {
            return;
        }
        self.tokens += count;
        self.min_token = Some(self.min_token.map_or(min, |seen| seen.min(min)));
        self.max_token = Some(self.max_token.map_or(max, |seen| seen.max(max)));
    }

    /// Count a document of `length` tokens (its tokens are counted by [`TokenScan::token`]).
    pub fn document(&mut self, length: u64) {
        self.lengths.push(length);
    }

    /// The length of every document counted so far, in the order counted.
    pub fn document_lengths(&self) -> &[u64] {
        &self.lengths
    }

    /// Documents counted so far.
    pub fn documents_seen(&self) -> u64 {
        self.lengths.len() as u64
    }

    /// The largest token counted so far.
    pub fn max_token(&self) -> Option<i64> {
        self.max_token
    }

    /// Add what `other` counted.
    pub fn merge(&mut self, other: Self) {
        if let (Some(min), Some(max)) = (other.min_token, other.max_token) {
            self.tokens(other.tokens, min, max);
        }
        self.lengths.extend(other.lengths);
    }

    /// The summary.
    pub fn finish(mut self) -> TokenStats {
        self.lengths.sort_unstable();
        let lengths = &self.lengths;
        let rank = |fraction: f64| {
            // Nearest rank: the smallest length with at least `fraction` of documents at or below it.
            let index = ((fraction * lengths.len() as f64).ceil() as usize).clamp(1, lengths.len()) - 1;
            lengths[index]
        };
        let document_length = (!lengths.is_empty()).then(|| LengthDistribution {
            min: lengths[0],
            p50: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
            max: lengths[lengths.len() - 1],
            mean: lengths.iter().map(|&length| length as f64).sum::<f64>() / lengths.len() as f64,
        });
        TokenStats {
            tokens: self.tokens,
            documents: lengths.len() as u64,
            min_token: self.min_token,
            max_token: self.max_token,
            vocab_at_least: self.max_token.and_then(|max| u64::try_from(max).ok()).map(|max| max.saturating_add(1)),
            document_length,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_empty_scans_have_none() {
        let mut scan = TokenScan::new();
        for length in (1..=100).rev() {
            scan.document(length);
        }
        for token in [5, -1, 7] {
            scan.token(token);
        }
        let stats = scan.finish();
        let lengths = stats.document_length.unwrap_or_else(|| panic!("documents"));
        assert_eq!((lengths.min, lengths.p50, lengths.p90, lengths.p99, lengths.max), (1, 50, 90, 99, 100));
        assert_eq!((stats.min_token, stats.max_token, stats.vocab_at_least, stats.documents), (Some(-1), Some(7), Some(8), 100));
        let empty = TokenScan::new().finish();
        assert_eq!((empty.tokens, empty.documents, empty.document_length, empty.vocab_at_least), (0, 0, None, None));
    }
}
