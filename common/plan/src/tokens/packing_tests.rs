use std::num::NonZeroU32;
use std::sync::Arc;

use super::*;
use crate::error::PlanError;
use crate::ids::{Epoch, Rank, Step};
use crate::layout::Tail;
use crate::prng::SplitMix64;

fn nz(value: u32) -> NonZeroU32 {
    NonZeroU32::new(value).expect("test sizes are not zero")
}

fn spec(world_size: u32, batch_size: u32, seq_len: u32, shuffle: TokenShuffle, tail: Tail) -> TokenPlanSpec {
    TokenPlanSpec { seed: 7, world_size: nz(world_size), batch_size: nz(batch_size), seq_len: nz(seq_len), shuffle, tail }
}

/// Documents of random lengths 0..=max (a few empty ones, many shorter and some longer than a row).
fn corpus(documents: usize, max: u64, seed: u64) -> Arc<dyn Documents> {
    let mut random = SplitMix64::new(seed);
    let lengths: Vec<u64> = (0..documents).map(|_| random.below(max + 1)).collect();
    Arc::new(DocumentOffsets::from_lengths(lengths).expect("lengths fit"))
}

const SHUFFLES: [TokenShuffle; 5] = [
    TokenShuffle::None,
    TokenShuffle::Rows,
    TokenShuffle::Documents { block: NonZeroU32::MIN },
    TokenShuffle::Documents { block: NonZeroU32::new(3).expect("3") },
    TokenShuffle::DEFAULT,
];

/// How many times each corpus token is read by the steps `steps` of `plan`, checking every
/// row's pieces on the way (in their documents, adding up to the row).
fn count_reads(plan: &TokenPlan, steps: std::ops::Range<u64>, reads: &mut [u32]) {
    let mut pieces = Vec::new();
    for step in steps {
        for rank in 0..plan.spec().world_size.get() {
            for row in plan.batch(Rank(rank), Step(step)) {
                pieces.clear();
                plan.pieces_into(&row, &mut pieces);
                assert_eq!(pieces.iter().map(|piece| piece.tokens).sum::<u64>(), u64::from(row.tokens), "{row:?}");
                for piece in &pieces {
                    assert!(piece.tokens > 0);
                    assert!(piece.offset + piece.tokens <= plan.corpus().document_len(piece.document), "{piece:?}");
                    assert_eq!(piece.corpus_offset, plan.corpus().tokens_before(piece.document) + piece.offset);
                    for token in piece.corpus_offset..piece.corpus_offset + piece.tokens {
                        reads[token as usize] += 1;
                    }
                }
            }
        }
    }
}

#[test]
fn every_token_is_read_once_per_epoch_with_a_partial_tail() {
    let mut cases = SplitMix64::new(1);
    for case in 0..40u64 {
        let corpus = corpus(1 + cases.below(60) as usize, cases.below(40), case);
        let total = corpus.tokens() as usize;
        for shuffle in SHUFFLES {
            let spec = spec(1 + cases.below(4) as u32, 1 + cases.below(5) as u32, 1 + cases.below(24) as u32, shuffle, Tail::Partial);
            let plan = TokenPlan::new(corpus.clone(), spec, Epoch(case % 3));
            let mut reads = vec![0u32; total];
            count_reads(&plan, 0..plan.steps(), &mut reads);
            assert!(reads.iter().all(|&count| count == 1), "case {case} {spec:?}: {reads:?}");
        }
    }
}

#[test]
fn drop_reads_whole_steps_of_whole_rows_once_and_pad_reads_everything() {
    let mut cases = SplitMix64::new(2);
    for case in 0..40u64 {
        let corpus = corpus(1 + cases.below(60) as usize, cases.below(40), 100 + case);
        let total = corpus.tokens();
        for shuffle in SHUFFLES {
            let (world, batch, seq_len) = (1 + cases.below(4) as u32, 1 + cases.below(5) as u32, 1 + cases.below(24) as u32);
            let drop = TokenPlan::new(corpus.clone(), spec(world, batch, seq_len, shuffle, Tail::Drop), Epoch(1));
            let mut reads = vec![0u32; total as usize];
            count_reads(&drop, 0..drop.steps(), &mut reads);
            let per_step = u64::from(world * batch * seq_len);
            assert_eq!(drop.steps(), (total / u64::from(seq_len)) / u64::from(world * batch));
            assert!(reads.iter().all(|&count| count <= 1));
            assert_eq!(reads.iter().map(|&count| u64::from(count)).sum::<u64>(), drop.steps() * per_step);

            let pad = TokenPlan::new(corpus.clone(), spec(world, batch, seq_len, shuffle, Tail::Pad), Epoch(1));
            let mut reads = vec![0u32; total as usize];
            count_reads(&pad, 0..pad.steps(), &mut reads);
            if total > 0 {
                assert!(reads.iter().all(|&count| count >= 1), "case {case}: pad leaves tokens out");
                assert_eq!(reads.iter().map(|&count| u64::from(count)).sum::<u64>(), pad.steps() * per_step);
            }
        }
    }
}

#[test]
fn a_resume_at_any_step_and_another_world_reads_exactly_the_rest() {
    let mut cases = SplitMix64::new(3);
    for case in 0..25u64 {
        let corpus = corpus(20 + cases.below(40) as usize, 1 + cases.below(50), 200 + case);
        let total = corpus.tokens() as usize;
        for shuffle in SHUFFLES {
            let seq_len = 1 + cases.below(16) as u32;
            let first = TokenPlan::new(
                corpus.clone(),
                spec(1 + cases.below(4) as u32, 1 + cases.below(4) as u32, seq_len, shuffle, Tail::Partial),
                Epoch(2),
            );
            for stop in 0..first.steps().saturating_sub(1) {
                let checkpoint = first.checkpoint_after(Step(stop));
                assert_eq!(checkpoint.position.0 % u64::from(seq_len), 0);
                let later = spec(1 + cases.below(5) as u32, 1 + cases.below(6) as u32, seq_len, shuffle, Tail::Partial);
                let resumed = TokenPlan::resume(corpus.clone(), later, &checkpoint).expect("same order");
                let mut reads = vec![0u32; total];
                count_reads(&first, 0..stop + 1, &mut reads);
                count_reads(&resumed, 0..resumed.steps(), &mut reads);
                assert!(reads.iter().all(|&count| count == 1), "case {case} {shuffle} stop {stop}: {reads:?}");
            }
        }
    }
}

#[test]
fn a_checkpoint_after_the_last_step_starts_the_next_epoch() {
    let corpus = corpus(30, 20, 5);
    let plan = TokenPlan::new(corpus, spec(2, 2, 8, TokenShuffle::DEFAULT, Tail::Drop), Epoch(4));
    let last = plan.checkpoint_after(Step(plan.steps() - 1));
    assert_eq!((last.epoch, last.position.0), (Epoch(5), 0));
    assert_eq!(plan.checkpoint_at_start().position.0, 0);
    assert_eq!(plan.checkpoint_after(Step(0)).position.0, 2 * 2 * 8, "a checkpoint counts tokens");
}

#[test]
fn a_checkpoint_is_refused_for_another_corpus_seed_shuffle_or_seq_len() {
    let corpus = corpus(30, 20, 6);
    let base = spec(2, 2, 8, TokenShuffle::DEFAULT, Tail::Drop);
    let checkpoint = TokenPlan::new(corpus.clone(), base, Epoch(0)).checkpoint_after(Step(0));
    assert!(TokenPlan::resume(corpus.clone(), TokenPlanSpec { world_size: nz(3), batch_size: nz(1), ..base }, &checkpoint).is_ok());
    let other_seed = TokenPlanSpec { seed: 8, ..base };
    assert!(matches!(TokenPlan::resume(corpus.clone(), other_seed, &checkpoint), Err(PlanError::CheckpointMismatch { .. })));
    let other_shuffle = TokenPlanSpec { shuffle: TokenShuffle::Rows, ..base };
    assert!(matches!(TokenPlan::resume(corpus.clone(), other_shuffle, &checkpoint), Err(PlanError::CheckpointMismatch { .. })));
    let other_seq_len = TokenPlanSpec { seq_len: nz(6), ..base };
    let error = TokenPlan::resume(corpus.clone(), other_seq_len, &checkpoint).expect_err("32 tokens are not rows of 6");
    assert!(error.to_string().contains("seq_len"), "{error}");
    let doubled = TokenPlanSpec { seq_len: nz(16), ..base };
    assert!(matches!(TokenPlan::resume(corpus, doubled, &checkpoint), Err(PlanError::CheckpointMismatch { .. })));
    let other_corpus = self::corpus(30, 20, 7);
    assert!(matches!(TokenPlan::resume(other_corpus, base, &checkpoint), Err(PlanError::CheckpointMismatch { .. })));
}

#[test]
fn unshuffled_rows_read_the_files_in_order() {
    let corpus = corpus(50, 30, 8);
    let plan = TokenPlan::new(corpus.clone(), spec(2, 3, 10, TokenShuffle::None, Tail::Drop), Epoch(3));
    let mut pieces = Vec::new();
    let mut expected = 0u64;
    for step in 0..plan.steps() {
        for rank in 0..2 {
            for row in plan.batch(Rank(rank), Step(step)) {
                pieces.clear();
                plan.pieces_into(&row, &mut pieces);
                for piece in &pieces {
                    assert_eq!(piece.corpus_offset, expected);
                    expected += piece.tokens;
                }
            }
        }
    }
    assert_eq!(expected, plan.steps() * 60);
}

#[test]
fn shuffles_depend_on_seed_and_epoch_only() {
    let corpus = corpus(400, 30, 9);
    let documents_of = |spec: TokenPlanSpec, epoch: u64| {
        let plan = TokenPlan::new(corpus.clone(), spec, Epoch(epoch));
        let mut pieces = Vec::new();
        for position in 0..plan.layout().end() {
            plan.pieces_into(&plan.row_at(position), &mut pieces);
        }
        pieces.iter().map(|piece| piece.document).collect::<Vec<_>>()
    };
    let shuffled = spec(2, 2, 16, TokenShuffle::Documents { block: nz(8) }, Tail::Partial);
    assert_eq!(documents_of(shuffled, 0), documents_of(TokenPlanSpec { world_size: nz(4), ..shuffled }, 0), "W does not change the order");
    assert_ne!(documents_of(shuffled, 0), documents_of(shuffled, 1));
    assert_ne!(documents_of(shuffled, 0), documents_of(TokenPlanSpec { seed: 1, ..shuffled }, 0));
    // Document shuffling changes which documents follow one another in a row.
    let neighbours = |spec: TokenPlanSpec| {
        let plan = TokenPlan::new(corpus.clone(), spec, Epoch(0));
        let mut pieces = Vec::new();
        let mut pairs = std::collections::HashSet::new();
        for position in 0..plan.layout().end() {
            pieces.clear();
            plan.pieces_into(&plan.row_at(position), &mut pieces);
            pairs.extend(pieces.windows(2).map(|pair| (pair[0].document, pair[1].document)));
        }
        pairs
    };
    let by_rows = neighbours(TokenPlanSpec { shuffle: TokenShuffle::Rows, ..shuffled });
    assert!(by_rows.iter().all(|&(a, b)| b > a), "rows shuffled alone keep documents in stored order");
    let by_documents = neighbours(shuffled);
    assert!(
        by_documents.iter().filter(|&&(a, b)| b < a).count() * 3 > by_documents.len(),
        "documents shuffled: a third of the neighbours go backwards"
    );
}

#[test]
fn the_plan_holds_one_integer_per_block() {
    let lengths = std::iter::repeat_n(100u64, 1_000_000);
    let corpus: Arc<dyn Documents> = Arc::new(DocumentOffsets::from_lengths(lengths).expect("lengths"));
    let plan = TokenPlan::new(corpus, spec(8, 4, 2048, TokenShuffle::DEFAULT, Tail::Drop), Epoch(0));
    assert!(plan.heap_bytes() <= (1_000_000 / 256 + 2) * 8, "{}", plan.heap_bytes());
}

#[test]
fn boundaries_of_a_row() {
    let pieces = [
        Piece { document: 4, offset: 10, tokens: 3, corpus_offset: 50 },
        Piece { document: 9, offset: 0, tokens: 2, corpus_offset: 90 },
        Piece { document: 1, offset: 0, tokens: 1, corpus_offset: 5 },
    ];
    assert_eq!(cu_seqlens(&pieces).collect::<Vec<_>>(), vec![0, 3, 5, 6]);
    assert_eq!(position_ids(&pieces).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 0]);
    assert_eq!(cu_seqlens(&[]).collect::<Vec<_>>(), vec![0]);
}

#[test]
fn shuffle_modes_read_back_what_they_write() {
    for shuffle in SHUFFLES {
        assert_eq!(shuffle.to_string().parse::<TokenShuffle>().expect("round trip"), shuffle);
    }
    assert_eq!("documents".parse::<TokenShuffle>().expect("default"), TokenShuffle::DEFAULT);
    let error = "document:4".parse::<TokenShuffle>().expect_err("typo");
    assert!(error.to_string().contains("documents:K"), "{error}");
    assert!("documents:0".parse::<TokenShuffle>().is_err());
}

#[test]
fn an_empty_corpus_plans_no_steps() {
    let corpus: Arc<dyn Documents> = Arc::new(DocumentOffsets::from_lengths([0, 0]).expect("empty documents"));
    for tail in [Tail::Drop, Tail::Pad, Tail::Partial] {
        let plan = TokenPlan::new(corpus.clone(), spec(2, 2, 4, TokenShuffle::DEFAULT, tail), Epoch(0));
        assert_eq!(plan.steps(), 0);
    }
}
