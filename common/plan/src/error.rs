//! Errors of planning and transform specs: inputs that cannot be planned or run.

/// The planner was given inputs it cannot plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The sample counts of the manifest add up to more than `u64::MAX`.
    #[error("the manifest's sample counts overflow a 64-bit total")]
    TooManySamples,
    /// More shards than a shard id can name.
    #[error("{shards} shards are more than the {} a dataset may have", u32::MAX)]
    TooManyShards {
        /// Shards in the manifest.
        shards: usize,
    },
    /// A checkpoint was taken over another dataset, seed or shuffle mode.
    #[error("checkpoint was taken over another dataset, seed or shuffle (order fingerprint {checkpoint:#x}, this plan {plan:#x})")]
    CheckpointMismatch {
        /// Fingerprint in the checkpoint.
        checkpoint: u64,
        /// Fingerprint of the plan resumed.
        plan: u64,
    },
    /// A shuffle or tail mode given as text is not one of the known ones.
    #[error("{what} {given:?}: use {expected}")]
    UnknownMode {
        /// `shuffle` or `tail`.
        what: &'static str,
        /// The text given.
        given: String,
        /// The accepted forms.
        expected: &'static str,
    },
    /// The token counts of a corpus add up to more than `u64::MAX`.
    #[error("the corpus's token counts overflow a 64-bit total")]
    TooManyTokens,
    /// Document offsets that are not a corpus's (not starting at 0, or decreasing).
    #[error("bad document offsets: {problem}")]
    BadDocumentOffsets {
        /// What is wrong.
        problem: String,
    },
    /// A token checkpoint whose position is not a whole number of rows of this plan.
    #[error(
        "checkpoint position {tokens} tokens is not a whole number of rows of {seq_len} tokens: resume with the seq_len the checkpoint was taken with"
    )]
    TokensNotWholeRows {
        /// Position in the checkpoint, in tokens.
        tokens: u64,
        /// This plan's row length.
        seq_len: u32,
    },
    /// A checkpoint of a format this build cannot read.
    #[error("checkpoint format version {found} is not supported (this build reads {supported})")]
    UnsupportedCheckpointVersion {
        /// Version in the checkpoint.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
}

/// A transform list that cannot be turned into a pipeline.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TransformError {
    /// The spec's fields are not valid.
    #[error("fields: {0}")]
    Fields(#[from] crate::fields::FieldError),
    /// A parameter is outside its valid range.
    #[error("{transform}: {problem}")]
    BadParameter {
        /// The transform (`RandomResizedCrop`, ...).
        transform: &'static str,
        /// What is wrong and what is allowed.
        problem: String,
    },
    /// The transforms are in an order (or combination) the pipeline does not run.
    #[error("unsupported transform list {found}: {hint}")]
    UnsupportedOrder {
        /// The list as given, e.g. `[CenterCrop, RandomResizedCrop]`.
        found: String,
        /// What to write instead.
        hint: &'static str,
    },
}
