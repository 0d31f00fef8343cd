use std::collections::HashSet;

use proptest::prelude::*;

use super::*;

fn nz(value: u32) -> NonZeroU32 {
    NonZeroU32::new(value).unwrap_or(NonZeroU32::MIN)
}

fn all_positions(layout: &Layout) -> Vec<(u64, Slot)> {
    let mut out = Vec::new();
    for step in 0..layout.steps() {
        for rank in 0..layout.world_size().get() {
            for index in 0..layout.batch_len(Rank(rank), Step(step)) {
                let position = layout.position(Rank(rank), Step(step), index);
                out.push((position.unwrap_or(u64::MAX), Slot { rank: Rank(rank), step: Step(step), index }));
            }
        }
    }
    out
}

fn tails() -> impl Strategy<Value = Tail> {
    prop_oneof![Just(Tail::Drop), Just(Tail::Pad), Just(Tail::Partial)]
}

proptest! {
    /// Every position maps to exactly one (rank, step, slot) and back.
    #[test]
    fn positions_and_slots_are_a_bijection(samples in 0u64..400, start_fraction in 0u64..4, world in 1u32..6, batch in 1u32..9, tail in tails()) {
        let start = samples * start_fraction / 4;
        let layout = Layout::new(samples, start, nz(world), nz(batch), tail);
        let positions = all_positions(&layout);
        let unique: HashSet<u64> = positions.iter().map(|(position, _)| *position).collect();
        prop_assert_eq!(unique.len(), positions.len());
        for (position, slot) in &positions {
            prop_assert_eq!(layout.slot(*position), Some(*slot));
        }
        // The used positions are exactly start..end.
        let expected: HashSet<u64> = (layout.start()..layout.end()).collect();
        prop_assert_eq!(unique, expected);
    }

    /// Every rank gets the same number of steps; full batches everywhere except Partial's last.
    #[test]
    fn every_rank_has_the_same_steps(samples in 0u64..400, world in 1u32..6, batch in 1u32..9, tail in tails()) {
        let layout = Layout::new(samples, 0, nz(world), nz(batch), tail);
        let per_step = u64::from(world) * u64::from(batch);
        let expected_steps = match tail {
            Tail::Drop => samples / per_step,
            Tail::Pad | Tail::Partial => samples.div_ceil(per_step),
        };
        prop_assert_eq!(layout.steps(), expected_steps);
        for step in 0..layout.steps() {
            let lens: Vec<u32> = (0..world).map(|rank| layout.batch_len(Rank(rank), Step(step))).collect();
            let is_last = step + 1 == layout.steps();
            if tail != Tail::Partial || !is_last {
                prop_assert!(lens.iter().all(|&len| len == batch));
            } else {
                let max = lens.iter().copied().max().unwrap_or(0);
                let min = lens.iter().copied().min().unwrap_or(0);
                prop_assert!(max - min <= 1, "uneven split {lens:?}");
                prop_assert!(max <= batch);
            }
        }
    }

    /// Drop never uses a position twice or past N; Partial uses every position < N once.
    #[test]
    fn order_indices_follow_the_tail_policy(samples in 1u64..400, world in 1u32..6, batch in 1u32..9, tail in tails()) {
        let layout = Layout::new(samples, 0, nz(world), nz(batch), tail);
        let indices: Vec<u64> = all_positions(&layout).iter().map(|(position, _)| layout.order_index(*position)).collect();
        prop_assert!(indices.iter().all(|&index| index < samples));
        let unique: HashSet<u64> = indices.iter().copied().collect();
        match tail {
            Tail::Drop => {
                prop_assert_eq!(unique.len(), indices.len());
                prop_assert!(samples - (indices.len() as u64) < u64::from(world) * u64::from(batch));
            }
            Tail::Partial => prop_assert_eq!(unique.len() as u64, samples),
            Tail::Pad => prop_assert_eq!(unique.len() as u64, samples.min(indices.len() as u64)),
        }
    }
}

#[test]
fn partial_last_step_gives_the_extra_samples_to_low_ranks() {
    // 10 samples, W=4, B=2: step 0 uses 8, step 1 splits 2 over 4 ranks: 1,1,0,0.
    let layout = Layout::new(10, 0, nz(4), nz(2), Tail::Partial);
    assert_eq!(layout.steps(), 2);
    let lens: Vec<u32> = (0..4).map(|rank| layout.batch_len(Rank(rank), Step(1))).collect();
    assert_eq!(lens, vec![1, 1, 0, 0]);
    assert_eq!(layout.position(Rank(1), Step(1), 0), Some(9));
    assert_eq!(layout.position(Rank(2), Step(1), 0), None);
}

#[test]
fn pad_wraps_to_the_start_of_the_epoch() {
    let layout = Layout::new(10, 0, nz(4), nz(2), Tail::Pad);
    assert_eq!(layout.steps(), 2);
    assert_eq!(layout.end(), 16);
    assert_eq!(layout.order_index(10), 0);
    assert_eq!(layout.order_index(15), 5);
}

#[test]
fn empty_epochs_have_no_steps() {
    for tail in [Tail::Drop, Tail::Pad, Tail::Partial] {
        let layout = Layout::new(0, 0, nz(2), nz(2), tail);
        assert_eq!(layout.steps(), 0);
        assert_eq!(layout.slot(0), None);
        assert_eq!(layout.batch_len(Rank(0), Step(0)), 0);
    }
}

#[test]
fn position_after_a_step_is_where_the_next_one_starts() {
    let layout = Layout::new(100, 0, nz(2), nz(8), Tail::Drop);
    assert_eq!(layout.position_after(Step(0)), 16);
    assert_eq!(layout.position_after(Step(5)), 96);
    let partial = Layout::new(100, 0, nz(2), nz(8), Tail::Partial);
    assert_eq!(partial.position_after(Step(6)), 100);
}
