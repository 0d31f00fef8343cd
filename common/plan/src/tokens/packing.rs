//! Rows of `seq_len` tokens cut from an epoch's token stream, laid out in steps and ranks.
//!
//! The epoch's stream is the corpus's documents in the epoch's order, end to end
//! ([`super::stream`]); row `k` of the stream is its tokens `k*L..(k+1)*L`, so documents run
//! across row boundaries and every token of the stream lies in exactly one row. The epoch visits
//! the whole rows in a keyed permutation (or in order) and then, as the tail policy says, the
//! `T mod L` tokens left: dropped (`drop`), a last row that wraps to the stream's start (`pad`),
//! or a last, short row (`partial`: every token exactly once). The rows are then cut into steps
//! and ranks by the same [`Layout`] as images, so a checkpoint is a number of rows consumed,
//! written in tokens, and a resume at another world size or batch size reads exactly the rows
//! not yet consumed.

use std::num::NonZeroU32;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::documents::Documents;
use super::stream::{DocumentOrder, Piece};
use crate::checkpoint::{CHECKPOINT_VERSION, Checkpoint};
use crate::error::PlanError;
use crate::ids::{Epoch, Position, Rank, Step};
use crate::layout::{Layout, Tail};
use crate::permutation::Permutation;
use crate::prng::{SeedDomain, derive_seed, mix64};

/// How an epoch of tokens is shuffled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenShuffle {
    /// Stored order: documents as the files hold them, rows in stream order (nanoGPT's and
    /// llm.c's sequential read).
    None,
    /// Documents in stored order, rows permuted over the epoch.
    Rows,
    /// Documents permuted in blocks of `block` consecutive documents (the blocks permuted, the
    /// documents of each block permuted) and rows permuted over the epoch: which documents
    /// share a row changes every epoch, and every row comes from anywhere in the corpus.
    Documents {
        /// Consecutive documents per block.
        block: NonZeroU32,
    },
}

impl TokenShuffle {
    /// `documents` with its default block of 256 documents.
    pub const DEFAULT: Self = Self::Documents { block: NonZeroU32::new(256).expect("256 is not zero") };

    fn code(self) -> u64 {
        match self {
            Self::None => 0,
            Self::Rows => 1,
            Self::Documents { block } => 2 + u64::from(block.get()),
        }
    }
}

impl Default for TokenShuffle {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl std::str::FromStr for TokenShuffle {
    type Err = PlanError;

    /// `none`, `rows`, `documents` (blocks of 256 documents) or `documents:K`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(Self::None),
            "rows" => Ok(Self::Rows),
            "documents" => Ok(Self::DEFAULT),
            other => other
                .strip_prefix("documents:")
                .and_then(|block| block.parse().ok())
                .and_then(NonZeroU32::new)
                .map(|block| Self::Documents { block })
                .ok_or_else(|| PlanError::UnknownMode {
                    what: "token shuffle",
                    given: text.to_owned(),
                    expected: "none, rows, documents or documents:K (K documents a block)",
                }),
        }
    }
}

impl std::fmt::Display for TokenShuffle {
    /// The form [`std::str::FromStr`] reads.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => formatter.write_str("none"),
            Self::Rows => formatter.write_str("rows"),
            Self::Documents { block } => write!(formatter, "documents:{block}"),
        }
    }
}

/// Everything that decides a token epoch's plan besides the corpus and the epoch number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenPlanSpec {
    /// Base seed of the job.
    pub seed: u64,
    /// Number of data-parallel ranks W.
    pub world_size: NonZeroU32,
    /// Rows per rank per step.
    pub batch_size: NonZeroU32,
    /// Tokens per row L.
    pub seq_len: NonZeroU32,
    /// Shuffle mode.
    #[serde(default)]
    pub shuffle: TokenShuffle,
    /// What happens to the tokens that do not fill a last row, and to the rows that do not
    /// fill a last step (as for images).
    #[serde(default)]
    pub tail: Tail,
}

/// One planned row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlannedRow {
    /// Position in the epoch's row order.
    pub position: u64,
    /// The row of the stream it reads: tokens `stream_row * L ..`.
    pub stream_row: u64,
    /// Tokens in the row: L, or fewer for `partial`'s last row.
    pub tokens: u32,
}

/// The plan of one epoch of rows from a start position (0, or a checkpoint's) to its end.
#[derive(Clone)]
pub struct TokenPlan {
    corpus: Arc<dyn Documents>,
    spec: TokenPlanSpec,
    epoch: Epoch,
    order: DocumentOrder,
    /// Whole rows of the stream.
    whole_rows: u64,
    /// Tokens after the whole rows.
    rest: u64,
    rows: Option<Permutation>,
    layout: Layout,
}

impl std::fmt::Debug for TokenPlan {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TokenPlan")
            .field("spec", &self.spec)
            .field("epoch", &self.epoch)
            .field("whole_rows", &self.whole_rows)
            .field("rest", &self.rest)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl TokenPlan {
    /// The plan of `epoch` from its beginning.
    pub fn new(corpus: Arc<dyn Documents>, spec: TokenPlanSpec, epoch: Epoch) -> Self {
        Self::starting_at_row(corpus, spec, epoch, 0)
    }

    /// The plan of the rest of a checkpoint's epoch, cut for `spec`'s world size, batch size
    /// and tail (which may differ from those in force when the checkpoint was taken; the seed,
    /// shuffle and `seq_len` may not).
    pub fn resume(corpus: Arc<dyn Documents>, spec: TokenPlanSpec, checkpoint: &Checkpoint) -> Result<Self, PlanError> {
        if checkpoint.version != CHECKPOINT_VERSION {
            return Err(PlanError::UnsupportedCheckpointVersion { found: checkpoint.version, supported: CHECKPOINT_VERSION });
        }
        let seq_len = spec.seq_len.get();
        if !checkpoint.position.0.is_multiple_of(u64::from(seq_len)) {
            return Err(PlanError::TokensNotWholeRows { tokens: checkpoint.position.0, seq_len });
        }
        let expected = token_fingerprint(corpus.as_ref(), &spec);
        if checkpoint.order_fingerprint != expected {
            return Err(PlanError::CheckpointMismatch { checkpoint: checkpoint.order_fingerprint, plan: expected });
        }
        Ok(Self::starting_at_row(corpus, spec, checkpoint.epoch, checkpoint.position.0 / u64::from(seq_len)))
    }

    fn starting_at_row(corpus: Arc<dyn Documents>, spec: TokenPlanSpec, epoch: Epoch, start_row: u64) -> Self {
        let block = match spec.shuffle {
            TokenShuffle::None | TokenShuffle::Rows => None,
            TokenShuffle::Documents { block } => Some(u64::from(block.get())),
        };
        let order = DocumentOrder::new(corpus.as_ref(), block, spec.seed, epoch);
        let seq_len = u64::from(spec.seq_len.get());
        let (whole_rows, rest) = (order.tokens() / seq_len, order.tokens() % seq_len);
        let rows_in_epoch = match spec.tail {
            Tail::Drop => whole_rows,
            Tail::Pad | Tail::Partial => whole_rows + u64::from(rest > 0),
        };
        let rows = match spec.shuffle {
            TokenShuffle::None => None,
            TokenShuffle::Rows | TokenShuffle::Documents { .. } => {
                Some(Permutation::new(whole_rows, derive_seed(SeedDomain::TokenRows, &[spec.seed, epoch.0])))
            }
        };
        let layout = Layout::new(rows_in_epoch, start_row, spec.world_size, spec.batch_size, spec.tail);
        Self { corpus, spec, epoch, order, whole_rows, rest, rows, layout }
    }

    /// The epoch planned.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The corpus planned over.
    pub fn corpus(&self) -> &dyn Documents {
        self.corpus.as_ref()
    }

    /// The spec planned with.
    pub fn spec(&self) -> &TokenPlanSpec {
        &self.spec
    }

    /// Steps of this plan (from its start), equal for every rank.
    pub fn steps(&self) -> u64 {
        self.layout.steps()
    }

    /// The row arithmetic of this plan (positions are rows).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Tokens in the epoch's stream (the corpus).
    pub fn stream_tokens(&self) -> u64 {
        self.order.tokens()
    }

    /// The row at `position` (one the layout uses).
    pub fn row_at(&self, position: u64) -> PlannedRow {
        let index = self.layout.order_index(position);
        let seq_len = self.spec.seq_len.get();
        if index >= self.whole_rows {
            // The row after the whole ones: `partial`'s short row, or `pad`'s row that wraps.
            let tokens = if self.spec.tail == Tail::Partial { self.rest as u32 } else { seq_len };
            return PlannedRow { position, stream_row: self.whole_rows, tokens };
        }
        let stream_row = self.rows.as_ref().map_or(index, |rows| rows.apply(index));
        PlannedRow { position, stream_row, tokens: seq_len }
    }

    /// The rows of `rank`'s batch at `step`, in order (empty when out of range).
    pub fn batch(&self, rank: Rank, step: Step) -> impl ExactSizeIterator<Item = PlannedRow> + '_ {
        let len = self.layout.batch_len(rank, step);
        let first = self.layout.position(rank, step, 0).unwrap_or(0);
        (0..len).map(move |index| self.row_at(first + u64::from(index)))
    }

    /// Append to `out` the documents' runs that make up `row`, in the row's order; their
    /// tokens add up to `row.tokens`.
    pub fn pieces_into(&self, row: &PlannedRow, out: &mut Vec<Piece>) {
        let start = row.stream_row * u64::from(self.spec.seq_len.get());
        self.order.pieces_into(self.corpus.as_ref(), start, u64::from(row.tokens), out);
    }

    /// The checkpoint that records every step up to and including `step` as consumed, its
    /// position in tokens. After the epoch's last step it is the next epoch's start.
    pub fn checkpoint_after(&self, step: Step) -> Checkpoint {
        let (epoch, rows) =
            if step.0 + 1 >= self.steps() { (Epoch(self.epoch.0 + 1), 0) } else { (self.epoch, self.layout.position_after(step)) };
        self.checkpoint(epoch, rows)
    }

    /// The checkpoint of this plan's start: nothing of it consumed yet.
    pub fn checkpoint_at_start(&self) -> Checkpoint {
        self.checkpoint(self.epoch, self.layout.start())
    }

    fn checkpoint(&self, epoch: Epoch, rows: u64) -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            epoch,
            // Mid-epoch every row before a step boundary is whole (a short row is always the last).
            position: Position(rows * u64::from(self.spec.seq_len.get())),
            order_fingerprint: token_fingerprint(self.corpus.as_ref(), &self.spec),
        }
    }

    /// A fingerprint of what `rank`'s batch at `step` must hold (as [`crate::EpochPlan::batch_digest`]).
    pub fn batch_digest(&self, dataset_version: u64, rank: Rank, step: Step) -> u64 {
        let mut digest = mix64(dataset_version ^ mix64(self.epoch.0 ^ mix64(self.layout.start() ^ mix64(u64::from(rank.0)))));
        digest = mix64(digest ^ step.0);
        for row in self.batch(rank, step) {
            digest = mix64(digest ^ mix64(row.stream_row ^ mix64(u64::from(row.tokens))));
        }
        digest
    }

    /// Heap bytes this plan holds besides the corpus (one integer per block of documents).
    pub fn heap_bytes(&self) -> usize {
        self.order.heap_bytes()
    }
}

/// Identifies the row order: the corpus's document lengths, seed, shuffle and `seq_len`; not
/// W, B or tail.
fn token_fingerprint(corpus: &dyn Documents, spec: &TokenPlanSpec) -> u64 {
    const TOKENS: u64 = 0x746f_6b65_6e73; // "tokens": never equal to an image plan's
    mix64(corpus.fingerprint() ^ mix64(spec.seed ^ mix64(spec.shuffle.code() ^ mix64(u64::from(spec.seq_len.get()) ^ TOKENS))))
}

/// Cumulative sequence lengths of a row's documents (flash-attention's `cu_seqlens` for one
/// row): `[0, n1, n1 + n2, ..., row tokens]`.
pub fn cu_seqlens(pieces: &[Piece]) -> impl Iterator<Item = u64> + '_ {
    std::iter::once(0).chain(pieces.iter().scan(0u64, |total, piece| {
        *total += piece.tokens;
        Some(*total)
    }))
}

/// Position ids of a row's tokens: counting from 0 at each document's first token in the row
/// (a document continued from the previous row starts again at 0, as packed rows are attended
/// to one at a time).
pub fn position_ids(pieces: &[Piece]) -> impl Iterator<Item = u64> + '_ {
    pieces.iter().flat_map(|piece| 0..piece.tokens)
}
