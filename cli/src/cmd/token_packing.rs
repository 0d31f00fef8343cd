//! `stoker inspect --seq-len L` of a token dataset: what packing its documents into rows of `L`
//! tokens gives, computed by the planner a job will use (`stoker_plan::tokens`) on the
//! dataset's real document lengths.

use std::num::NonZeroU32;
use std::sync::Arc;

use clap::Args;
use serde::Serialize;
use stoker_plan::Tail;
use stoker_plan::ids::{Epoch, Rank, Step};
use stoker_plan::tokens::{DocumentOffsets, Documents, TokenPlan, TokenPlanSpec, TokenShuffle};

/// Rows looked at for the per-row figures (evenly spread over the epoch when it has more).
const ROWS_LOOKED_AT: u64 = 100_000;

#[derive(Debug, Args)]
#[command(next_help_heading = "Token packing (with --seq-len)")]
pub(crate) struct PackingArgs {
    /// Of a token dataset: show what packing its documents into rows of this many tokens gives
    /// (rows and steps per epoch, tokens left out by the tail, documents per row), as a job
    /// would plan it. Documents run across row boundaries; no token is padded.
    #[arg(long, value_name = "TOKENS")]
    pub(crate) seq_len: Option<NonZeroU32>,
    /// With --seq-len: data-parallel ranks.
    #[arg(long, value_name = "RANKS", default_value_t = NonZeroU32::MIN)]
    pub(crate) world_size: NonZeroU32,
    /// With --seq-len: rows per rank per step.
    #[arg(long, value_name = "ROWS", default_value_t = NonZeroU32::MIN)]
    pub(crate) batch_size: NonZeroU32,
    /// With --seq-len: none (stored order), rows (rows permuted), documents (documents permuted
    /// in blocks of 256, then rows) or documents:K.
    #[arg(long, value_name = "MODE", default_value = "documents", value_parser = parse_token_shuffle)]
    pub(crate) token_shuffle: TokenShuffle,
    /// With --seq-len: drop (the tokens after the last whole step are not read), pad (the last
    /// step wraps to the epoch's start) or partial (every token exactly once: a short last row
    /// and step).
    #[arg(long, value_name = "TAIL", default_value = "drop", value_parser = parse_tail)]
    pub(crate) tail: Tail,
}

fn parse_token_shuffle(text: &str) -> Result<TokenShuffle, String> {
    text.parse().map_err(|error: stoker_plan::error::PlanError| error.to_string())
}

fn parse_tail(text: &str) -> Result<Tail, String> {
    text.parse().map_err(|error: stoker_plan::error::PlanError| error.to_string())
}

/// What packing gives, for one epoch (epoch 0; later epochs differ only in which documents
/// share rows).
#[derive(Debug, Serialize)]
pub(crate) struct PackingReport {
    seq_len: u32,
    world_size: u32,
    batch_size: u32,
    shuffle: String,
    tail: Tail,
    /// Rows an epoch reads.
    rows: u64,
    /// Steps of an epoch.
    steps: u64,
    /// Tokens an epoch reads (a padded tail's repeats included).
    tokens_read: u64,
    /// Tokens of the dataset an epoch does not read (the drop tail).
    tokens_left_out: u64,
    /// Rows the per-row figures looked at.
    rows_looked_at: u64,
    /// Mean documents (pieces of documents) in a row.
    documents_per_row_mean: f64,
    /// Most documents in a row.
    documents_per_row_max: u64,
    /// Share of rows whose first token is not the first of its document.
    rows_starting_inside_a_document: f64,
    /// Documents longer than a row (always cut across rows).
    documents_longer_than_a_row: u64,
}

impl PackingArgs {
    /// The packing report over documents of `lengths` (in stored order), when --seq-len was given.
    pub(crate) fn report(&self, lengths: &[u64]) -> anyhow::Result<Option<PackingReport>> {
        let Some(seq_len) = self.seq_len else { return Ok(None) };
        let corpus: Arc<dyn Documents> = Arc::new(DocumentOffsets::from_lengths(lengths.iter().copied())?);
        let spec = TokenPlanSpec {
            seed: 0,
            world_size: self.world_size,
            batch_size: self.batch_size,
            seq_len,
            shuffle: self.token_shuffle,
            tail: self.tail,
        };
        let plan = TokenPlan::new(corpus, spec, Epoch(0));
        let mut tokens_read = 0u64;
        for step in 0..plan.steps() {
            for rank in 0..self.world_size.get() {
                tokens_read += plan.batch(Rank(rank), Step(step)).map(|row| u64::from(row.tokens)).sum::<u64>();
            }
        }
        let rows = plan.layout().end() - plan.layout().start();
        let looked_at = rows.min(ROWS_LOOKED_AT);
        let (mut pieces, mut documents, mut most, mut inside) = (Vec::new(), 0u64, 0u64, 0u64);
        for index in 0..looked_at {
            // Evenly spread: index * rows / looked_at, in u128 so that it cannot overflow.
            let position = (u128::from(index) * u128::from(rows) / u128::from(looked_at)) as u64;
            pieces.clear();
            plan.pieces_into(&plan.row_at(position), &mut pieces);
            documents += pieces.len() as u64;
            most = most.max(pieces.len() as u64);
            inside += u64::from(pieces.first().is_some_and(|piece| piece.offset > 0));
        }
        let share = |count: u64| if looked_at == 0 { 0.0 } else { count as f64 / looked_at as f64 };
        Ok(Some(PackingReport {
            seq_len: seq_len.get(),
            world_size: self.world_size.get(),
            batch_size: self.batch_size.get(),
            shuffle: self.token_shuffle.to_string(),
            tail: self.tail,
            rows,
            steps: plan.steps(),
            tokens_read,
            tokens_left_out: plan.stream_tokens().saturating_sub(tokens_read),
            rows_looked_at: looked_at,
            documents_per_row_mean: share(documents),
            documents_per_row_max: most,
            rows_starting_inside_a_document: share(inside),
            documents_longer_than_a_row: lengths.iter().filter(|&&length| length > u64::from(seq_len.get())).count() as u64,
        }))
    }
}

impl PackingReport {
    /// The report as text lines.
    pub(crate) fn print(&self) {
        println!(
            "packing    rows of {} tokens, {} rank(s) × {} row(s) a step, shuffle {}, tail {}",
            self.seq_len,
            self.world_size,
            self.batch_size,
            self.shuffle,
            match self.tail {
                Tail::Drop => "drop",
                Tail::Pad => "pad",
                Tail::Partial => "partial",
            }
        );
        println!(
            "epoch      {} rows in {} steps: {} tokens read, {} of the dataset's left out",
            self.rows, self.steps, self.tokens_read, self.tokens_left_out
        );
        println!(
            "rows       {:.2} documents a row on average (at most {}); {:.1}% start inside a document ({} rows looked at)",
            self.documents_per_row_mean,
            self.documents_per_row_max,
            100.0 * self.rows_starting_inside_a_document,
            self.rows_looked_at
        );
        println!("long       {} documents are longer than a row (cut across rows)", self.documents_longer_than_a_row);
    }
}
