use stoker_plan::ids::{Epoch, Position};

use super::*;

/// A batch that is only its run and step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fake(RunId, u64);

impl Delivered for Fake {
    fn run(&self) -> RunId {
        self.0
    }

    fn step(&self) -> Step {
        Step(self.1)
    }
}

const EPOCH0: RunId = (Epoch(0), Position(0));
const EPOCH1: RunId = (Epoch(1), Position(0));

fn protocol() -> TrainerProtocol<Fake> {
    TrainerProtocol::new(Duration::from_secs(1))
}

#[test]
fn every_open_is_a_new_pass_and_names_the_batches_already_held() {
    let mut protocol = protocol();
    assert_eq!(protocol.offer(Fake(EPOCH1, 1)), Offered::Early, "no run open: kept for later");
    let first = protocol.open(EPOCH0, 3);
    assert_eq!((first.pass, first.consumed, first.holding.clone()), (Pass(1), 0, vec![]));
    assert_eq!(protocol.offer(Fake(EPOCH0, 0)), Offered::Kept);
    assert_eq!(protocol.offer(Fake(EPOCH0, 0)), Offered::Duplicate);
    assert_eq!(protocol.offer(Fake(EPOCH1, 0)), Offered::Early);
    assert_eq!(protocol.pop().map(|(step, _)| step), Some(Step(0)));
    let second = protocol.open(EPOCH1, 3);
    assert_eq!((second.pass, second.holding), (Pass(2), vec![Step(0), Step(1)]), "the early batches of epoch 1");
    assert_eq!(protocol.offer(Fake(EPOCH0, 2)), Offered::Dropped, "an earlier run's batch");
}

/// Regression (issue 15, loss path 1): `set_epoch` before the first batch dropped the reorder
/// buffer; opening the run again now holds those batches and says so.
#[test]
fn leaving_a_run_and_opening_it_again_keeps_the_batches_not_yet_yielded() {
    let mut protocol = protocol();
    protocol.open(EPOCH0, 4);
    for step in [0, 1, 3] {
        protocol.offer(Fake(EPOCH0, step));
    }
    protocol.close();
    let again = protocol.open(EPOCH0, 4);
    assert_eq!(again.holding, vec![Step(0), Step(1), Step(3)]);
    assert_eq!(protocol.pop().map(|(step, _)| step), Some(Step(0)));
}

#[test]
fn steps_are_reported_missing_only_after_waiting_for_them() {
    let start = Instant::now();
    let mut protocol = protocol();
    protocol.open(EPOCH0, 6);
    protocol.offer(Fake(EPOCH0, 2));
    protocol.waiting(start);
    let early = protocol.report(start + Duration::from_millis(999)).expect("open");
    assert_eq!((early.consumed, early.missing.clone()), (0, vec![]));
    assert_eq!(protocol.nack_due(), Some(start + Duration::from_secs(1)));
    let overdue = protocol.report(start + Duration::from_secs(1)).expect("open");
    assert_eq!(overdue.missing, vec![Step(0), Step(1)]);
    protocol.offer(Fake(EPOCH0, 0));
    assert!(protocol.pop().is_some());
    assert_eq!(protocol.nack_due(), None, "yielding ends the wait");
    assert_eq!(protocol.report(start + Duration::from_secs(5)).expect("open").missing, vec![], "not waiting");
}

#[test]
fn a_finished_pass_is_done_and_reports_every_step_consumed() {
    let mut protocol = protocol();
    protocol.open(EPOCH0, 2);
    protocol.offer(Fake(EPOCH0, 1));
    protocol.offer(Fake(EPOCH0, 0));
    assert!(protocol.pop().is_some() && protocol.pop().is_some());
    assert!(protocol.is_done());
    let report = protocol.report(Instant::now()).expect("open");
    assert_eq!((report.consumed, report.steps), (2, 2));
    assert_eq!(protocol.yielded(), Some(Step(1)));
}

/// Found by review: every copy of a later run's step was kept (lease re-grants, duplicated
/// deliveries), so early batches were not bounded by the flow window.
#[test]
fn copies_of_an_early_batch_are_dropped() {
    let mut protocol = protocol();
    protocol.open(EPOCH0, 3);
    assert_eq!(protocol.offer(Fake(EPOCH1, 0)), Offered::Early);
    assert_eq!(protocol.offer(Fake(EPOCH1, 0)), Offered::Duplicate);
    assert_eq!(protocol.buffered(), 1);
    protocol.close();
    assert_eq!(protocol.offer(Fake(EPOCH1, 0)), Offered::Duplicate, "also with no run open");
}

/// Found by review: the reporter sends the latest report again every second, `missing`
/// included, whether or not the training loop still waits; a trainer that stopped iterating
/// while overdue had the same steps made again every few seconds, for as long as it lived.
#[test]
fn missing_steps_go_out_once_per_period_and_only_while_the_trainer_waits() {
    let start = Instant::now();
    let second = Duration::from_secs(1);
    let mut damper = MissingDamper::new(second);
    let missing = vec![Step(4)];
    assert_eq!(damper.filter(missing.clone(), Some(start), start), missing, "waiting now: sent");
    assert_eq!(damper.filter(missing.clone(), Some(start), start), missing, "that report failed: sent again");
    damper.delivered(start);
    assert!(damper.filter(missing.clone(), Some(start), start + second / 2).is_empty(), "again within the period: not sent");
    assert_eq!(damper.filter(missing.clone(), Some(start + second), start + second), missing, "still waiting a period later: sent");
    damper.delivered(start + second);
    assert!(damper.filter(missing.clone(), Some(start + second), start + second * 3).is_empty(), "the loop stopped waiting: not sent");
    assert!(damper.filter(missing.clone(), None, start + second * 5).is_empty(), "not waiting at all");
    assert!(damper.filter(Vec::new(), Some(start + second * 6), start + second * 6).is_empty());
}

/// Issue 19: a worker sending batches far ahead (a bug, or a hostile one) cannot make the
/// trainer hold more than its limit; what is dropped is made again, and every step is still
/// yielded exactly once, in order.
#[test]
fn batches_past_the_limit_are_dropped_farthest_first_and_never_the_next_step() {
    let mut protocol = protocol().with_max_buffered(3);
    protocol.open(EPOCH0, 8);
    for step in 0..3 {
        assert_eq!(protocol.offer(Fake(EPOCH1, step)), Offered::Early);
    }
    assert_eq!(protocol.offer(Fake(EPOCH0, 5)), Offered::Kept);
    assert_eq!((protocol.buffered(), protocol.early(), protocol.evicted()), (3, 2, 1), "a later run's batch goes first");
    for step in [7, 6, 4] {
        protocol.offer(Fake(EPOCH0, step));
    }
    assert_eq!((protocol.buffered(), protocol.early()), (3, 0));
    assert_eq!(protocol.offer(Fake(EPOCH0, 0)), Offered::Kept, "the next step is always taken");
    assert_eq!(protocol.buffered(), 3);
    assert_eq!(protocol.pop().map(|(step, _)| step), Some(Step(0)));
    // The dropped steps are missing, so they are made again; each is yielded once.
    let held: Vec<Step> = protocol.current_opt.as_ref().map(|current| current.reorder.waiting_steps().collect()).unwrap_or_default();
    assert_eq!(held, [Step(4), Step(5)], "the nearest batches were kept");
    let mut yielded = vec![Step(0)];
    for step in 1..8 {
        protocol.offer(Fake(EPOCH0, step));
        while let Some((step, _)) = protocol.pop() {
            yielded.push(step);
        }
    }
    assert_eq!(yielded, (0..8).map(Step).collect::<Vec<_>>(), "every step once, in order");
    let evicted_before = protocol.evicted();
    assert!(evicted_before >= 5, "{evicted_before}");
}
