//! An epoch's token stream: the corpus's documents in the epoch's order, laid end to end.
//!
//! Shuffled, the documents are cut into blocks of `block` consecutive documents of the stored
//! order; the epoch visits the blocks in a keyed permutation and the documents of each block in
//! another. The planner keeps one integer per block (the tokens before it in the epoch's order)
//! and finds a document inside a block by walking the block: memory `8 × documents / block`
//! bytes, a lookup `O(log blocks + block)`.

use super::documents::Documents;
use crate::ids::Epoch;
use crate::permutation::Permutation;
use crate::prng::{SeedDomain, derive_seed};

/// A run of one document's tokens inside a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Piece {
    /// The document (its index in the corpus's stored order).
    pub document: u64,
    /// Where the run starts inside the document, in tokens.
    pub offset: u64,
    /// Tokens in the run.
    pub tokens: u64,
    /// Where the run starts in the corpus's files laid end to end (what a reader maps).
    pub corpus_offset: u64,
}

/// Where the epoch's stream reads: blocks in order, or permuted blocks of permuted documents.
#[derive(Clone, Debug)]
pub(crate) struct DocumentOrder {
    documents: u64,
    tokens: u64,
    shuffle: Option<BlockShuffle>,
}

#[derive(Clone, Debug)]
struct BlockShuffle {
    block: u64,
    block_order: Permutation,
    /// `starts[j]`: tokens before the `j`-th block of the epoch's order; one more than blocks.
    starts: Vec<u64>,
    seed: u64,
    epoch: Epoch,
}

/// A position in the epoch's document order.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    /// Block in the epoch's order (always 0 unshuffled).
    block_rank: u64,
    /// Document in the block's order (the document itself unshuffled).
    index: u64,
}

impl DocumentOrder {
    /// The stream of `epoch`: stored order when `block` is `None`.
    pub(crate) fn new(corpus: &dyn Documents, block: Option<u64>, seed: u64, epoch: Epoch) -> Self {
        let documents = corpus.documents();
        let tokens = corpus.tokens();
        let shuffle = block.map(|block| {
            let block = block.max(1);
            let blocks = documents.div_ceil(block);
            let block_order = Permutation::new(blocks, derive_seed(SeedDomain::TokenBlockOrder, &[seed, epoch.0]));
            let mut starts = Vec::with_capacity(blocks as usize + 1);
            let mut total = 0u64;
            starts.push(0);
            for rank in 0..blocks {
                let first = block_order.apply(rank) * block;
                let end = (first + block).min(documents);
                total += corpus.tokens_before(end) - corpus.tokens_before(first);
                starts.push(total);
            }
            BlockShuffle { block, block_order, starts, seed, epoch }
        });
        Self { documents, tokens, shuffle }
    }

    /// Tokens in the stream.
    pub(crate) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Heap bytes held (one integer per block).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.shuffle.as_ref().map_or(0, |shuffle| shuffle.starts.capacity() * 8)
    }

    /// Append to `out` the pieces of the stream's tokens `start..start + len`, wrapping past the
    /// end to the stream's start (a padded tail's last row). Empty documents give no piece.
    pub(crate) fn pieces_into(&self, corpus: &dyn Documents, start: u64, len: u64, out: &mut Vec<Piece>) {
        if self.tokens == 0 {
            return;
        }
        let mut start = start % self.tokens;
        let mut left = len;
        while left > 0 {
            let run = left.min(self.tokens - start);
            self.pieces_within(corpus, start, run, out);
            left -= run;
            start = 0;
        }
    }

    /// `pieces_into` for a range inside the stream.
    fn pieces_within(&self, corpus: &dyn Documents, start: u64, len: u64, out: &mut Vec<Piece>) {
        let (mut cursor, mut offset) = self.locate(corpus, start);
        let mut left = len;
        while left > 0 {
            let document = self.document_at(cursor);
            let available = corpus.document_len(document) - offset;
            let take = available.min(left);
            if take > 0 {
                let corpus_offset = corpus.tokens_before(document) + offset;
                out.push(Piece { document, offset, tokens: take, corpus_offset });
            }
            left -= take;
            offset = 0;
            cursor = self.next(cursor);
        }
    }

    /// The document at `cursor`.
    fn document_at(&self, cursor: Cursor) -> u64 {
        match &self.shuffle {
            None => cursor.index,
            Some(shuffle) => {
                let (first, len) = shuffle.block_span(cursor.block_rank, self.documents);
                first + shuffle.inner(cursor.block_rank, len).apply(cursor.index)
            }
        }
    }

    /// The cursor after `cursor` (callers never step past the stream's last token).
    fn next(&self, cursor: Cursor) -> Cursor {
        match &self.shuffle {
            None => Cursor { block_rank: 0, index: cursor.index + 1 },
            Some(shuffle) => {
                let (_, len) = shuffle.block_span(cursor.block_rank, self.documents);
                if cursor.index + 1 < len {
                    Cursor { block_rank: cursor.block_rank, index: cursor.index + 1 }
                } else {
                    Cursor { block_rank: cursor.block_rank + 1, index: 0 }
                }
            }
        }
    }

    /// The cursor of the document holding stream token `token` (< tokens) and the token's
    /// offset inside it.
    fn locate(&self, corpus: &dyn Documents, token: u64) -> (Cursor, u64) {
        match &self.shuffle {
            None => {
                // The last document whose start is <= token and that holds it: the first
                // document ending after `token`.
                let (mut low, mut high) = (0u64, self.documents);
                while low < high {
                    let middle = low + (high - low) / 2;
                    if corpus.tokens_before(middle + 1) <= token {
                        low = middle + 1;
                    } else {
                        high = middle;
                    }
                }
                (Cursor { block_rank: 0, index: low }, token - corpus.tokens_before(low))
            }
            Some(shuffle) => {
                // The block of the epoch's order that holds `token`: the last start <= token
                // among blocks that are not empty.
                let block_rank = shuffle.starts.partition_point(|&start| start <= token) as u64 - 1;
                let mut within = token - shuffle.starts[block_rank as usize];
                let (first, len) = shuffle.block_span(block_rank, self.documents);
                let inner = shuffle.inner(block_rank, len);
                for index in 0..len {
                    let size = corpus.document_len(first + inner.apply(index));
                    if within < size {
                        return (Cursor { block_rank, index }, within);
                    }
                    within -= size;
                }
                unreachable!("block {block_rank} holds stream token {token} by its start offsets")
            }
        }
    }
}

impl BlockShuffle {
    /// The first document and the number of documents of the `rank`-th block of the epoch.
    fn block_span(&self, rank: u64, documents: u64) -> (u64, u64) {
        let first = self.block_order.apply(rank) * self.block;
        (first, self.block.min(documents - first))
    }

    /// The order of the documents inside the `rank`-th block of the epoch.
    fn inner(&self, rank: u64, len: u64) -> Permutation {
        let block = self.block_order.apply(rank);
        Permutation::new(len, derive_seed(SeedDomain::TokenBlockDocuments, &[self.seed, self.epoch.0, block]))
    }
}
