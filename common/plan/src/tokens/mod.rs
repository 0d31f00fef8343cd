//! The plan of an epoch of token data (issue 33): a corpus's documents, shuffled in blocks,
//! laid end to end and cut into rows of `seq_len` tokens; the rows permuted and laid out in
//! steps and ranks as images are. Every token of the epoch lies in exactly one row, a
//! checkpoint counts tokens, and a resume at another world size or batch size reads exactly the
//! rows not yet read.
//!
//! * [`documents`]: the corpus as the planner sees it (document offsets; a format's reader
//!   implements [`Documents`] over its index).
//! * [`stream`]: the epoch's document order and the runs ([`Piece`]s) of documents in a range
//!   of it.
//! * [`packing`]: rows, the layout, checkpoints, and the document boundaries of a row
//!   (`cu_seqlens`, position ids).
//!
//! Memory: one integer per block of documents (`8 × documents / block` bytes); a row's lookup
//! walks one block.

pub mod documents;
pub mod packing;
pub mod stream;

pub use self::documents::{DocumentOffsets, Documents};
pub use self::packing::{PlannedRow, TokenPlan, TokenPlanSpec, TokenShuffle, cu_seqlens, position_ids};
pub use self::stream::Piece;

#[cfg(test)]
#[path = "packing_tests.rs"]
mod packing_tests;
