//! What a job asks of the workers (issue 35, item 4): how fast its ranks consume samples and
//! what share of their time they wait for data, and from those and what one worker core makes,
//! the worker cores that would serve the job without stalls.
//!
//! The figures are sums that decay with time constant [`DEMAND_TAU`], divided by the decayed
//! rank time they cover: exponentially weighted rates per rank-second (times the ranks
//! reporting), exact from the first report on (no warm-up bias), O(log ranks) per report. A gap of more than `DEMAND_TAU` in a rank's reports (a
//! pause) is counted as neither consuming nor waiting, but it does age the sums. A job consuming `C` samples a second while its ranks wait a share
//! `s` of their time would consume `C / (1 - s)` if data never kept it waiting; at `r` images a
//! second per busy worker core that takes `C / ((1 - s) r)` cores.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use stoker_plan::ids::Rank;

/// How long the figures remember: a change of load shows in them within about this long.
pub const DEMAND_TAU: Duration = Duration::from_secs(30);

/// No figures from less than this much time: a rate over a second or two of reports is noise.
pub const DEMAND_MIN_SPAN: Duration = Duration::from_secs(5);

/// More samples a second than one rank consumes (a report claiming more is cut to this).
const MAX_SAMPLES_PER_RANK_SECOND: f64 = 1e6;

/// Wait shares above this are taken as this: a job that waits nearly all the time is starved,
/// and `1 / (1 - s)` would promise it unbounded cores.
const MAX_STALL: f64 = 0.95;

/// One job's decayed sums.
#[derive(Clone, Debug)]
pub(crate) struct Demand {
    /// Samples its ranks consumed.
    samples: f64,
    /// Seconds its ranks waited for data.
    waited: f64,
    /// Seconds its ranks spent between reports (consuming or waiting).
    rank_seconds: f64,
    /// The wall-clock seconds the sums cover, decayed as they are (only to tell when they
    /// cover enough).
    span: f64,
    /// When the sums were last decayed.
    at: Instant,
    /// Each rank's last report.
    reported_at: BTreeMap<Rank, Instant>,
}

/// What [`Demand`] shows of a job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DemandFigures {
    /// Samples consumed per second, over all its ranks.
    pub samples_per_sec: f64,
    /// Share of its ranks' time spent waiting for data (0 to 1).
    pub stall: f64,
}

impl DemandFigures {
    /// Worker cores that would serve the job without stalls, at `images_per_core_sec` images a
    /// second per busy worker core; `None` while that is not measured.
    pub fn worker_cores(&self, images_per_core_sec: Option<f64>) -> Option<f64> {
        let rate = images_per_core_sec.filter(|rate| *rate > 0.0)?;
        Some(self.samples_per_sec / (1.0 - self.stall.min(MAX_STALL)) / rate)
    }
}

impl Demand {
    /// No reports yet.
    pub(crate) fn new(now: Instant) -> Self {
        Self { samples: 0.0, waited: 0.0, rank_seconds: 0.0, span: 0.0, at: now, reported_at: BTreeMap::new() }
    }

    /// Decay the sums to `now` (an earlier `now`, from a request handled out of order, decays
    /// nothing).
    fn advance(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        if elapsed <= 0.0 {
            return;
        }
        let tau = DEMAND_TAU.as_secs_f64();
        let keep = (-elapsed / tau).exp();
        self.samples *= keep;
        self.waited *= keep;
        self.rank_seconds *= keep;
        self.span = self.span * keep + tau * (1.0 - keep);
        self.at = now;
    }

    /// Rank `rank` reported at `now`, having consumed `samples` more samples and waited
    /// `waited` more seconds since its previous report. Its first report counts no time, nor
    /// does one at the instant of the one before, one handled out of order (an earlier `now`:
    /// its interval would be counted twice), or one after more than [`DEMAND_TAU`] without a
    /// report (a pause for evaluation or a checkpoint: its gap is neither consuming nor
    /// waiting, and counted as either it would skew the figures for the next half minute).
    pub(crate) fn record(&mut self, rank: Rank, samples: u64, waited: f64, now: Instant) {
        self.advance(now);
        let before_opt = self.reported_at.get(&rank).copied();
        if before_opt.is_some_and(|before| now < before) {
            return;
        }
        self.reported_at.insert(rank, now);
        let Some(since) = before_opt.map(|before| now.saturating_duration_since(before).as_secs_f64()) else { return };
        if since <= 0.0 || since > DEMAND_TAU.as_secs_f64() {
            return;
        }
        // What the report covers happened over `since`, not at `now`: weigh it by the mean
        // decay over that time, as `span` weighs time, so a steady load reads exactly. A rank
        // claims at most MAX_SAMPLES_PER_RANK_SECOND (its trainer's figures come from the
        // network: one absurd report must not swamp the job's figures for minutes).
        let tau = DEMAND_TAU.as_secs_f64();
        let weight = tau * (1.0 - (-since / tau).exp()) / since;
        self.samples += (samples as f64).min(MAX_SAMPLES_PER_RANK_SECOND * since) * weight;
        self.waited += waited.clamp(0.0, since) * weight;
        self.rank_seconds += since * weight;
    }

    /// The figures at `now`, if the reports span long enough to tell and one came within
    /// [`DEMAND_TAU`] (a job nobody trains asks nothing, whatever its last stall was).
    pub(crate) fn figures(&self, now: Instant) -> Option<DemandFigures> {
        // The ranks reporting now; none: nobody trains the job.
        let reporting = self.reported_at.values().filter(|at| now.saturating_duration_since(**at) <= DEMAND_TAU).count();
        if reporting == 0 || self.rank_seconds <= 0.0 {
            return None;
        }
        // Decay changes the sums alike, so their ratios stand as they are; only the span is
        // brought to `now`, to tell whether the reports cover enough.
        let tau = DEMAND_TAU.as_secs_f64();
        let keep = (-now.saturating_duration_since(self.at).as_secs_f64() / tau).exp();
        let span = self.span * keep + tau * (1.0 - keep);
        let min_span = tau * (1.0 - (-DEMAND_MIN_SPAN.as_secs_f64() / tau).exp());
        if span < min_span {
            return None;
        }
        // Per rank-second reported (pauses left out), times the ranks reporting now: what the
        // job consumes while it trains.
        let samples_per_sec = self.samples / self.rank_seconds * reporting as f64;
        Some(DemandFigures { samples_per_sec, stall: (self.waited / self.rank_seconds).clamp(0.0, 1.0) })
    }

    /// Forget `rank` (its trainer detached or the job's ranks changed).
    pub(crate) fn forget(&mut self, rank: Rank) {
        self.reported_at.remove(&rank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks reporting every second for `seconds` after `from` (each having reported at
    /// `from`), each consuming `per_rank` samples a second and waiting `stall` of each second.
    fn steady(demand: &mut Demand, from: Instant, seconds: u64, per_rank: u64, stall: f64) -> Instant {
        let mut now = from;
        for second in 1..=seconds {
            now = from + Duration::from_secs(second);
            for rank in 0..2 {
                demand.record(Rank(rank), per_rank, stall, now);
            }
        }
        now
    }

    /// A new job's two ranks report for the first time.
    fn started(start: Instant) -> Demand {
        let mut demand = Demand::new(start);
        for rank in 0..2 {
            demand.record(Rank(rank), 0, 0.0, start);
        }
        demand
    }

    #[test]
    fn a_steady_job_shows_its_rate_its_stall_and_the_cores_it_wants() {
        let start = Instant::now();
        let mut demand = started(start);
        let now = steady(&mut demand, start, 60, 50, 0.5);
        let figures = demand.figures(now).expect("a minute of reports");
        assert!((figures.samples_per_sec - 100.0).abs() < 1e-6, "{figures:?}");
        assert!((figures.stall - 0.5).abs() < 1e-9, "{figures:?}");
        // 100 samples a second with half the time waiting: 200 a second unstalled, 4 cores at 50.
        let cores = figures.worker_cores(Some(50.0)).expect("measured");
        assert!((cores - 4.0).abs() < 1e-6, "{cores}");
        assert_eq!(figures.worker_cores(None), None);
        assert_eq!(figures.worker_cores(Some(0.0)), None);
    }

    #[test]
    fn too_short_a_span_shows_nothing_and_the_figures_follow_a_change_of_load() {
        let start = Instant::now();
        let mut demand = started(start);
        assert_eq!(demand.figures(start), None);
        let now = steady(&mut demand, start, 2, 50, 0.0);
        assert_eq!(demand.figures(now), None, "two seconds are too few");
        let now = steady(&mut demand, now, 120, 50, 0.0);
        let before = demand.figures(now).expect("two minutes");
        assert!(before.stall < 1e-9 && (before.samples_per_sec - 100.0).abs() < 1e-6, "{before:?}");
        // The ranks slow to half, waiting half of each second: after four time constants the
        // figures are within 2% of the new load.
        let now = steady(&mut demand, now, 120, 25, 0.5);
        let after = demand.figures(now).expect("two more minutes");
        assert!((after.samples_per_sec - 50.0).abs() < 1.0, "{after:?}");
        assert!((after.stall - 0.5).abs() < 0.01, "{after:?}");
    }

    #[test]
    fn a_pause_longer_than_the_time_constant_counts_as_neither_consuming_nor_waiting() {
        let start = Instant::now();
        let mut demand = started(start);
        let now = steady(&mut demand, start, 60, 50, 0.0);
        // A two-minute evaluation: no reports. Then the ranks go on as before.
        let back = now + Duration::from_secs(120);
        for rank in 0..2 {
            demand.record(Rank(rank), 0, 0.0, back);
        }
        let now = steady(&mut demand, back, 10, 50, 0.0);
        let figures = demand.figures(now).expect("reports again");
        // Only the ten seconds since the pause count at full weight: the rate reads as before,
        // not diluted by the pause as two minutes of consuming nothing.
        assert!(figures.stall < 1e-9, "{figures:?}");
        assert!(figures.samples_per_sec > 60.0, "{figures:?}");
    }

    #[test]
    fn a_starved_job_wants_bounded_cores_and_a_late_report_changes_nothing_of_the_past() {
        let start = Instant::now();
        let mut demand = started(start);
        let now = steady(&mut demand, start, 30, 1, 5.0);
        let figures = demand.figures(now).expect("reports");
        assert_eq!(figures.stall, 1.0, "a wait is never more than the time between reports");
        let cores = figures.worker_cores(Some(1.0)).expect("measured");
        assert!(cores.is_finite() && (cores - 2.0 / (1.0 - MAX_STALL)).abs() < 1e-6, "{cores}");
        // A report handled out of order (an earlier now) changes nothing.
        let figures = demand.figures(now);
        demand.record(Rank(0), 1_000, 0.0, now - Duration::from_secs(1));
        assert_eq!(demand.figures(now), figures);
        // An absurd claim is cut to what a rank could consume.
        demand.record(Rank(1), u64::MAX, 0.0, now + Duration::from_secs(1));
        assert!(demand.figures(now + Duration::from_secs(1)).is_some_and(|f| f.samples_per_sec < 1e6), "{:?}", demand.figures(now));
        // Nobody reports any more: the job asks nothing.
        assert_eq!(demand.figures(now + DEMAND_TAU + Duration::from_secs(2)), None);
    }
}
