//! A token corpus as the packer sees it: documents in their stored order, each a run of the
//! tokens of the corpus's files laid end to end.

use crate::error::PlanError;

/// The documents of a token corpus, in stored order. Document `d` is the tokens
/// `tokens_before(d)..tokens_before(d + 1)` of the corpus's files laid end to end.
///
/// The reader of a format implements it over what it already has (a Megatron `.idx`'s
/// pointers, the offsets of the EOS tokens); [`DocumentOffsets`] is the in-memory form.
pub trait Documents: Send + Sync {
    /// Number of documents.
    fn documents(&self) -> u64;

    /// Tokens before document `doc`: 0 for the first, the corpus's total for `documents()`.
    /// Never decreasing. `doc` is at most `documents()`.
    fn tokens_before(&self, doc: u64) -> u64;

    /// A fingerprint of the document lengths: the plan's order depends on nothing else of the
    /// corpus, so a checkpoint is refused against a corpus whose fingerprint differs.
    fn fingerprint(&self) -> u64;

    /// Tokens in the corpus.
    fn tokens(&self) -> u64 {
        self.tokens_before(self.documents())
    }

    /// Tokens of document `doc`.
    fn document_len(&self, doc: u64) -> u64 {
        self.tokens_before(doc + 1) - self.tokens_before(doc)
    }
}

/// Documents given by their offsets in memory (8 bytes a document).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentOffsets {
    /// `offsets[d]` = tokens before document `d`; one more entry than documents.
    offsets: Vec<u64>,
    fingerprint: u64,
}

impl DocumentOffsets {
    /// Documents of the given lengths, in order. Empty documents are allowed (they hold no
    /// token, so no row ever shows them).
    pub fn from_lengths(lengths: impl IntoIterator<Item = u64>) -> Result<Self, PlanError> {
        let mut offsets = vec![0u64];
        let mut total = 0u64;
        for length in lengths {
            total = total.checked_add(length).ok_or(PlanError::TooManyTokens)?;
            offsets.push(total);
        }
        Ok(Self::from_checked(offsets))
    }

    /// Documents from their start offsets plus the end: `offsets[0]` must be 0 and the offsets
    /// must not decrease.
    pub fn from_offsets(offsets: Vec<u64>) -> Result<Self, PlanError> {
        if offsets.first() != Some(&0) {
            return Err(PlanError::BadDocumentOffsets { problem: "the first offset must be 0".to_owned() });
        }
        if let Some(at) = offsets.windows(2).position(|pair| pair[1] < pair[0]) {
            return Err(PlanError::BadDocumentOffsets {
                problem: format!("offset {} of document {} is below the {} before it", offsets[at + 1], at + 1, offsets[at]),
            });
        }
        Ok(Self::from_checked(offsets))
    }

    fn from_checked(offsets: Vec<u64>) -> Self {
        let bytes: Vec<u8> = offsets.iter().flat_map(|offset| offset.to_le_bytes()).collect();
        let fingerprint = xxhash_rust::xxh3::xxh3_64(&bytes);
        Self { offsets, fingerprint }
    }
}

impl Documents for DocumentOffsets {
    fn documents(&self) -> u64 {
        self.offsets.len() as u64 - 1
    }

    fn tokens_before(&self, doc: u64) -> u64 {
        self.offsets[doc as usize]
    }

    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_offsets_agree() {
        let from_lengths = DocumentOffsets::from_lengths([3, 0, 5]).expect("lengths");
        let from_offsets = DocumentOffsets::from_offsets(vec![0, 3, 3, 8]).expect("offsets");
        assert_eq!(from_lengths, from_offsets);
        assert_eq!(from_lengths.documents(), 3);
        assert_eq!(from_lengths.tokens(), 8);
        assert_eq!(from_lengths.document_len(1), 0);
        assert_eq!(from_lengths.document_len(2), 5);
    }

    #[test]
    fn bad_offsets_are_refused_with_the_document() {
        let error = DocumentOffsets::from_offsets(vec![0, 4, 2]).expect_err("decreasing");
        assert!(error.to_string().contains("document 2"), "{error}");
        assert!(DocumentOffsets::from_offsets(vec![1, 4]).is_err());
        assert!(DocumentOffsets::from_offsets(Vec::new()).is_err());
        assert!(matches!(DocumentOffsets::from_lengths([u64::MAX, 1]), Err(PlanError::TooManyTokens)));
    }

    #[test]
    fn the_fingerprint_follows_the_lengths() {
        let a = DocumentOffsets::from_lengths([3, 5]).expect("a");
        let b = DocumentOffsets::from_lengths([5, 3]).expect("b");
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), DocumentOffsets::from_lengths([3, 5]).expect("again").fingerprint());
    }
}
