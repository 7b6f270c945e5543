//! The verdict state machine of one SLO: a clear pass or fail must hold for `for` before the
//! state changes, a borderline evaluation keeps the state, and too few samples give
//! `insufficient_data` at once; and the reading an evaluation publishes.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::measure::stats::{mean_sd, t_999};

/// The verdict of an SLO: the `state` label of `llm_canary_slo_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SloState {
    Pass,
    Fail,
    InsufficientData,
}

impl SloState {
    /// Every state, in exposition order.
    pub const ALL: [SloState; 3] = [SloState::Pass, SloState::Fail, SloState::InsufficientData];

    /// The `state` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SloState::Pass => "pass",
            SloState::Fail => "fail",
            SloState::InsufficientData => "insufficient_data",
        }
    }
}

/// One evaluation of an SLO. `None` values remove their series (e.g. no interval without samples).
#[derive(Clone, Debug, PartialEq)]
pub struct SloReading {
    pub state: SloState,
    pub value: Option<f64>,
    pub threshold: Option<f64>,
    pub value_lower: Option<f64>,
    pub value_upper: Option<f64>,
}

/// What one evaluation concluded, before hysteresis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raw {
    /// The interval is clearly on the passing side.
    Pass,
    /// The interval is clearly on the failing side.
    Fail,
    /// The interval straddles the threshold: no new evidence either way.
    Borderline,
    /// Fewer samples than `min_samples` (or no data, or no baseline yet).
    Insufficient,
}

/// The state of one SLO over time.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub state: SloState,
    /// When the current state began.
    pub since: Instant,
    pub since_unix: f64,
    /// A clear verdict different from the state, and since when it has held.
    pending: Option<(SloState, Instant)>,
    /// Comparison SLOs: a fail needs two runs in a row.
    pub gate: RunGate,
}

impl Verdict {
    /// A new SLO: no data yet.
    pub fn new(now: Instant, now_unix: f64) -> Self {
        Verdict {
            state: SloState::InsufficientData,
            since: now,
            since_unix: now_unix,
            pending: None,
            gate: RunGate::default(),
        }
    }

    /// A verdict saved before a restart: `state` since `since_unix` (the instant is mapped onto
    /// this process's clock).
    pub fn restored(state: SloState, since_unix: f64, now: Instant, now_unix: f64) -> Self {
        let age = Duration::from_secs_f64((now_unix - since_unix).max(0.0));
        Verdict {
            state,
            since: now.checked_sub(age).unwrap_or(now),
            since_unix,
            pending: None,
            gate: RunGate::default(),
        }
    }

    /// The state a clear verdict is waiting to become, and since when.
    pub fn pending(&self) -> Option<(SloState, Instant)> {
        self.pending
    }

    /// Applies one evaluation; returns the previous state when the state changed.
    ///
    /// A change to pass or fail needs the same clear verdict for `for_` (borderline evaluations
    /// in between neither confirm nor cancel it; the opposite clear verdict or missing data
    /// cancels it). A change to `insufficient_data` is immediate: there is nothing to wait for.
    pub fn update(
        &mut self,
        raw: Raw,
        for_: Duration,
        now: Instant,
        now_unix: f64,
    ) -> Option<SloState> {
        let target = match raw {
            Raw::Borderline => return None,
            Raw::Insufficient => {
                self.pending = None;
                return self.change(SloState::InsufficientData, now, now_unix);
            }
            Raw::Pass => SloState::Pass,
            Raw::Fail => SloState::Fail,
        };
        if self.state == target {
            self.pending = None;
            return None;
        }
        let started = match self.pending {
            Some((state, at)) if state == target => at,
            _ => {
                self.pending = Some((target, now));
                now
            }
        };
        if now.saturating_duration_since(started) >= for_ {
            self.pending = None;
            self.change(target, now, now_unix)
        } else {
            None
        }
    }

    fn change(&mut self, to: SloState, now: Instant, now_unix: f64) -> Option<SloState> {
        if self.state == to {
            return None;
        }
        let old = self.state;
        self.state = to;
        self.since = now;
        self.since_unix = now_unix;
        Some(old)
    }
}

/// Runs before a change: a comparison SLO changes to `fail` only when two consecutive runs of
/// its data fail clearly, so one run that a batch phase, a cache state or a noisy neighbour made
/// slow never pages, while a regression pages at its second run. A run is one pass over the
/// series the SLO reads: it goes on while new steps end of series it has not read yet (the
/// prefix-ratio steps a fit reads, the levels of a sweep) and the next begins with a step of a
/// series it has read already, so an SLO over one step's series judges each of its steps and an
/// SLO over a workload judges the workload's pass, not each of its steps. A clear pass needs one
/// run. Kept in memory: after a restart the next fail needs two runs again (a restored `fail`
/// holds meanwhile).
///
/// A change also needs its runs clearly on the other side of the threshold *against how far the
/// runs of the current state move*, once [`MIN_MARGIN_RUNS`] such runs are known (a run belongs
/// to the state the SLO was in when it ended). A fail: the two runs' mean margin (how far each
/// comparison lies on its passing side) has its upper 99.9 % bound,
/// `m̄₂ + t₀.₉₉₉(n−1) · s · √(1/2 + 1/n)`, below 0, `s` the standard deviation of the `n` runs
/// judged while passing. A reset: the run's margin has its lower bound, `m − t₀.₉₉₉(n−1) · s ·
/// √(1 + 1/n)`, above 0 for every comparison that failed in a run judged while failing, `s` from
/// those runs. A deployment whose runs straddle a threshold (a slow mode that fails, a fast one
/// that passes) then keeps its verdict, either one, while one whose runs all fail, or that moved
/// by more than its runs move, pages at the second run, and a regression whose runs move little
/// resets at the first good run. A regression's runs never widen the spread a later one is
/// weighed against. Comparisons with a rolling baseline weigh their runs themselves and are
/// left to it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunGate {
    /// The newest step of the run being judged, when it ended.
    newest: Option<Instant>,
    /// The series (hashed labels) whose steps the run being judged holds.
    series: Vec<u64>,
    /// That run's latest evaluation was a clear fail.
    failing: bool,
    /// The run before it ended on a clear fail.
    previous_failing: bool,
    /// Each comparison's margin in the run being judged (its latest evaluation), and the
    /// state the SLO was in then.
    current: Run,
    /// The run before it.
    previous: Run,
    /// The runs before that, oldest first, at most [`MARGIN_RUNS_KEPT`].
    earlier: VecDeque<Run>,
    /// A change the margins did not carry beyond what the current state's runs move.
    held: Option<Held>,
}

/// One run as the gate keeps it: each comparison's margin and the state it was judged in.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    margins: Vec<Option<f64>>,
    state: SloState,
}

impl Default for Run {
    fn default() -> Self {
        Run {
            margins: Vec::new(),
            state: SloState::InsufficientData,
        }
    }
}

/// A change the gate held back: the runs' margins are on the other side of the threshold, but
/// by less than the runs of the current state move.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Held {
    /// A fail (two runs failing) or a reset (one run passing).
    pub to: SloState,
    /// The comparison (0-based).
    pub comparison: usize,
    /// Its margin: the two runs' mean for a fail, the run's for a reset.
    pub margin: f64,
    /// The margin's bound towards the current state, by the spread of its runs...
    pub bound: f64,
    /// ...which is not beyond this level: 0, or the mean margin of the current state's runs
    /// where that lies on the other side of 0 (a change needs the runs clearly across the
    /// threshold, or clearly outside the runs of the current state).
    pub level: f64,
    /// How many runs of the current state gave the spread.
    pub runs: usize,
}

/// One comparison of a run, as the gate weighs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weighed {
    /// How far the run lies on the comparison's passing side (negative: failing); `None`
    /// where it has no such measure.
    pub margin: Option<f64>,
    /// The comparison is clearly false in this run.
    pub violated: bool,
    /// It weighs its runs itself (a rolling baseline).
    pub rolling: bool,
}

/// Earlier runs a fail weighs its margins against, at least; with fewer, two failing runs in
/// a row suffice.
pub const MIN_MARGIN_RUNS: usize = 3;
/// Earlier runs kept: about a day of a seed-plan-sized cycle is more than the spread needs.
pub const MARGIN_RUNS_KEPT: usize = 24;

impl RunGate {
    /// `raw` of the run whose newest step ended at `run`, its comparisons weighed as `sides`,
    /// with the SLO in `state`: held back to borderline when it is the first of the runs failing
    /// in a row, or when its margins stay inside what the runs of `state` move.
    pub fn apply(
        &mut self,
        raw: Raw,
        newest: Option<(Instant, u64)>,
        sides: &[Weighed],
        state: SloState,
    ) -> Raw {
        if let Some((at, series)) = newest
            && self.newest != Some(at)
        {
            let first = self.newest.is_none();
            self.newest = Some(at);
            if !first && !self.series.contains(&series) {
                // A step of a series this run has not read yet: the same run goes on.
                self.series.push(series);
            } else {
                self.start_run(first, series);
            }
        }
        let margins: Vec<Option<f64>> = sides.iter().map(|s| s.margin).collect();
        if !margins.is_empty() {
            // The newest margins known: the previous run's, else the last earlier one's.
            let known = Some(&self.previous.margins)
                .filter(|p| !p.is_empty())
                .or(self.earlier.back().map(|r| &r.margins))
                .map_or(0, Vec::len);
            if known != 0 && known != margins.len() {
                // A reload changed the expression: its earlier margins measure something else.
                self.previous = Run::default();
                self.earlier.clear();
            }
            self.current.margins = margins;
        }
        self.current.state = state;
        self.failing = raw == Raw::Fail;
        self.held = None;
        match raw {
            Raw::Fail if state != SloState::Fail => {
                if !self.previous_failing {
                    return Raw::Borderline;
                }
                self.held = self.fail_inside_the_spread(sides);
                if self.held.is_none() {
                    // The run that began the fail is the fail's, not a passing run's: a
                    // regression never widens the spread a later one is weighed against.
                    self.previous.state = SloState::Fail;
                }
            }
            Raw::Pass if state == SloState::Fail => {
                self.held = self.pass_inside_the_spread(sides);
            }
            _ => {}
        }
        if self.held.is_some() {
            Raw::Borderline
        } else {
            raw
        }
    }

    /// Begins the run of the step of `series` that just ended: the run judged until now becomes
    /// the previous one, and its previous one an earlier run.
    fn start_run(&mut self, first: bool, series: u64) {
        self.series.clear();
        self.series.push(series);
        if first {
            return;
        }
        self.previous_failing = self.failing;
        let previous = std::mem::replace(&mut self.previous, std::mem::take(&mut self.current));
        if !previous.margins.is_empty() {
            self.earlier.push_back(previous);
        }
        if self.earlier.len() > MARGIN_RUNS_KEPT {
            self.earlier.pop_front();
        }
    }

    /// Comparison `i`'s margins in the runs before the current one judged while failing
    /// (`failing`) or not; the run before it too when `with_previous`.
    fn margins_of(&self, i: usize, failing: bool, with_previous: bool) -> Vec<f64> {
        let previous = with_previous.then_some(&self.previous);
        self.earlier
            .iter()
            .chain(previous)
            .filter(|r| (r.state == SloState::Fail) == failing)
            .filter_map(|r| *r.margins.get(i)?)
            .collect()
    }

    /// The first violated comparison whose last two runs' mean margin is neither clearly
    /// negative nor clearly below the runs judged while not failing, against their spread.
    fn fail_inside_the_spread(&self, sides: &[Weighed]) -> Option<Held> {
        sides.iter().enumerate().find_map(|(i, side)| {
            if !side.violated || side.rolling {
                return None;
            }
            let (now, before) = (
                self.current.margins.get(i)?.as_ref()?,
                self.previous.margins.get(i)?.as_ref()?,
            );
            let runs = self.margins_of(i, false, false);
            let (mean, half) = spread(&runs, 0.5)?;
            let two = (now + before) / 2.0;
            let level = mean.max(0.0);
            (two + half >= level).then_some(Held {
                to: SloState::Fail,
                comparison: i,
                margin: two,
                bound: two + half,
                level,
                runs: runs.len(),
            })
        })
    }

    /// The first comparison that failed in a run judged while failing and whose margin in this
    /// run is neither clearly positive nor clearly above those runs, against their spread.
    fn pass_inside_the_spread(&self, sides: &[Weighed]) -> Option<Held> {
        sides.iter().enumerate().find_map(|(i, side)| {
            if side.rolling {
                return None;
            }
            let now = *self.current.margins.get(i)?.as_ref()?;
            let runs = self.margins_of(i, true, true);
            if !runs.iter().any(|m| *m < 0.0) {
                // Not what failed: it holds no reset back.
                return None;
            }
            let (mean, half) = spread(&runs, 1.0)?;
            let level = mean.min(0.0);
            (now - half <= level).then_some(Held {
                to: SloState::Pass,
                comparison: i,
                margin: now,
                bound: now - half,
                level,
                runs: runs.len(),
            })
        })
    }

    /// The current run fails and waits for the next one to confirm it.
    pub fn waiting(&self) -> bool {
        self.failing && !self.previous_failing
    }

    /// A change the margins did not carry beyond what runs move, in the latest evaluation.
    pub fn held(&self) -> Option<Held> {
        self.held
    }
}

/// The level of `runs` and how far a mean of `k` new runs may lie from a level by chance (the
/// 99.9 % prediction half-width, `t₀.₉₉₉(n−1) · s · √(1/k + 1/n)`, `share` = 1/k), once
/// [`MIN_MARGIN_RUNS`] runs are known.
fn spread(runs: &[f64], share: f64) -> Option<(f64, f64)> {
    if runs.len() < MIN_MARGIN_RUNS {
        return None;
    }
    let n = runs.len() as f64;
    let (mean, sd) = mean_sd(runs)?;
    Some((mean, t_999(runs.len() - 1) * sd * (share + 1.0 / n).sqrt()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    const P: SloState = SloState::Pass;

    #[tokio::test(start_paused = true)]
    async fn a_fail_needs_two_runs_in_a_row_and_a_pass_one() {
        let mut gate = RunGate::default();
        let run = |s: u64| Some((Instant::now() + Duration::from_secs(s), 0));
        // One slow run: held back, however many times it is evaluated.
        assert_eq!(gate.apply(Raw::Fail, run(1), &[], P), Raw::Borderline);
        assert!(gate.waiting());
        assert_eq!(gate.apply(Raw::Fail, run(1), &[], P), Raw::Borderline);
        // A good run between two slow ones starts over.
        assert_eq!(gate.apply(Raw::Pass, run(2), &[], P), Raw::Pass);
        assert_eq!(gate.apply(Raw::Fail, run(3), &[], P), Raw::Borderline);
        // The second slow run in a row fails, and so does every evaluation of it.
        assert_eq!(gate.apply(Raw::Fail, run(4), &[], P), Raw::Fail);
        assert_eq!(gate.apply(Raw::Fail, run(4), &[], P), Raw::Fail);
        assert!(!gate.waiting());
        // Missing data and a pass pass through at once.
        assert_eq!(
            gate.apply(Raw::Insufficient, run(5), &[], P),
            Raw::Insufficient
        );
        assert_eq!(gate.apply(Raw::Pass, run(6), &[], P), Raw::Pass);
    }

    /// An SLO over several series (a fit over the prefix-ratio steps): their steps in one
    /// pass are one run, and the pass after it the second.
    #[tokio::test(start_paused = true)]
    async fn a_run_is_one_pass_over_the_series() {
        let mut gate = RunGate::default();
        let at = |s: u64, series: u64| Some((Instant::now() + Duration::from_secs(s), series));
        for (s, series) in [(1, 10), (2, 11), (3, 12)] {
            assert_eq!(
                gate.apply(Raw::Fail, at(s, series), &[], P),
                Raw::Borderline
            );
        }
        // The first series again: the second pass, whose first step already confirms the fail.
        assert_eq!(gate.apply(Raw::Fail, at(4, 10), &[], P), Raw::Fail);
    }

    /// Runs whose margins straddle 0 (a fast mode at +40, a slow one at −15): two slow runs in
    /// a row hold the verdict; a move well past what runs move, or a deployment whose every
    /// run fails, still fails at its second run.
    #[tokio::test(start_paused = true)]
    async fn a_fail_needs_its_runs_beyond_what_runs_move() {
        let weighed = |m: f64| {
            [Weighed {
                margin: Some(m),
                violated: m < 0.0,
                rolling: false,
            }]
        };
        let raw = |m: f64| if m < 0.0 { Raw::Fail } else { Raw::Pass };
        let mut gate = RunGate::default();
        let mut s = 0;
        let mut run = |gate: &mut RunGate, m: f64| {
            s += 1;
            gate.apply(
                raw(m),
                Some((Instant::now() + Duration::from_secs(s), 0)),
                &weighed(m),
                P,
            )
        };
        for m in [40.0, -15.0, 42.0, 38.0, -14.0, 41.0] {
            run(&mut gate, m);
        }
        assert_eq!(run(&mut gate, -16.0), Raw::Borderline);
        assert_eq!(
            run(&mut gate, -15.0),
            Raw::Borderline,
            "two slow runs in a row"
        );
        let h = gate.held().unwrap();
        assert!(
            h.to == SloState::Fail
                && h.comparison == 0
                && h.margin == -15.5
                && h.bound >= h.level
                && h.runs == 6,
            "{h:?}"
        );
        // Far past the spread: pages at the second run.
        assert_eq!(run(&mut gate, 40.0), Raw::Pass);
        assert_eq!(run(&mut gate, -200.0), Raw::Borderline);
        assert_eq!(run(&mut gate, -210.0), Raw::Fail);
        // Runs that all fail by a little, moving little: their second run fails.
        let mut steady = RunGate::default();
        for m in [-2.0, -2.1, -1.9, -2.0, -2.1, -1.9, -2.0] {
            s += 1;
            steady.apply(
                raw(m),
                Some((Instant::now() + Duration::from_secs(s), 0)),
                &weighed(m),
                P,
            );
        }
        s += 1;
        let at = Some((Instant::now() + Duration::from_secs(s), 0));
        assert_eq!(steady.apply(Raw::Fail, at, &weighed(-2.05), P), Raw::Fail);
        // A rolling baseline's comparison weighs its own runs: the gate alone holds it.
        let rolling = [Weighed {
            rolling: true,
            ..weighed(-15.0)[0]
        }];
        assert_eq!(gate.apply(Raw::Fail, at, &rolling, P), Raw::Fail);
    }

    /// Drives a gate and a verdict (`for` 0) through runs of one comparison per margin list
    /// entry (a run per entry, each evaluated once); returns the state after each run.
    fn judge(v: &mut Verdict, runs: &[&[f64]]) -> Vec<SloState> {
        runs.iter()
            .map(|margins| {
                let now = Instant::now() + Duration::from_secs(v.gate.earlier.len() as u64 + 100);
                let sides: Vec<Weighed> = margins
                    .iter()
                    .map(|&m| Weighed {
                        margin: Some(m),
                        violated: m < 0.0,
                        rolling: false,
                    })
                    .collect();
                let raw = if margins.iter().any(|m| *m < 0.0) {
                    Raw::Fail
                } else {
                    Raw::Pass
                };
                // Every run's step ends later than the last: a new run each time.
                let at = v.gate.newest.map_or(now, |t| t + Duration::from_secs(1));
                // Evaluated twice, as the daemon evaluates a run many times: the second time
                // in the state the first left.
                for _ in 0..2 {
                    let raw = v.gate.apply(raw, Some((at, 0)), &sides, v.state);
                    v.update(raw, Duration::ZERO, now, 0.0);
                }
                v.state
            })
            .collect()
    }

    /// A deployment whose runs mostly fail, by widely varying margins (a fit over steps that a
    /// mode switch mid-pass breaks up), keeps its `fail` through a rare good run; a regression
    /// whose runs move little resets at its first good run.
    #[tokio::test(start_paused = true)]
    async fn a_reset_needs_its_run_beyond_what_failing_runs_move() {
        use SloState::{Fail, Pass};
        let mut v = Verdict::new(Instant::now(), 0.0);
        let mostly_failing: Vec<[f64; 1]> = [
            -0.47, -0.78, -0.13, -0.15, 0.03, -0.35, -0.9, -0.73, -0.63, -0.36, -0.62, -0.46,
            -0.18, -0.13, -0.12,
        ]
        .map(|m| [m])
        .to_vec();
        let runs: Vec<&[f64]> = mostly_failing.iter().map(|r| &r[..]).collect();
        let states = judge(&mut v, &runs);
        assert_eq!(states[1], Fail, "two failing runs page: {states:?}");
        // Two failing runs page; the rare good run (0.03) passes by less than the failing runs
        // move, so the fail holds through it.
        assert!(states[1..].iter().all(|s| *s == Fail), "{states:?}");
        // A run that passes by less than the failing runs move holds the fail.
        assert_eq!(judge(&mut v, &[&[0.03]]), [Fail]);
        let h = v.gate.held().expect("held");
        assert!(
            h.to == Pass && h.margin == 0.03 && h.bound <= h.level,
            "{h:?}"
        );
        // One far beyond them resets.
        assert_eq!(judge(&mut v, &[&[0.95]]), [Pass]);

        // A regression whose runs fail by about the same margin: its first good run resets,
        // however long it lasted.
        let mut v = Verdict::new(Instant::now(), 0.0);
        let states = judge(
            &mut v,
            &[
                &[1.0],
                &[1.05],
                &[0.95],
                &[1.0],
                &[-0.5],
                &[-0.52],
                &[-0.48],
                &[-0.5],
                &[-0.51],
            ],
        );
        assert_eq!(states[5..], [Fail; 4]);
        assert_eq!(judge(&mut v, &[&[0.9]]), [Pass]);
    }

    /// A regression's runs are weighed as failing runs: a second regression like the first,
    /// soon after it, pages at its second run as the first did; and a comparison that never
    /// failed (the slope beside an R²) holds no reset back.
    #[tokio::test(start_paused = true)]
    async fn a_regression_never_widens_the_spread_a_later_one_is_weighed_against() {
        use SloState::{Fail, Pass};
        let mut v = Verdict::new(Instant::now(), 0.0);
        let normal: &[&[f64]] = &[&[1.0, 30.0], &[1.05, 10.0], &[0.95, 50.0], &[1.0, 25.0]];
        judge(&mut v, normal);
        let regression: &[&[f64]] = &[&[-0.5, 20.0], &[-0.5, 40.0], &[-0.6, 35.0]];
        assert_eq!(judge(&mut v, regression), [Pass, Fail, Fail]);
        // The slope's margins moved widely while failing; only the first comparison failed.
        assert_eq!(judge(&mut v, &[&[1.0, 12.0]]), [Pass]);
        judge(&mut v, normal);
        assert_eq!(judge(&mut v, regression), [Pass, Fail, Fail]);
    }

    #[tokio::test(start_paused = true)]
    async fn for_delays_a_change_and_borderline_holds() {
        let mut v = Verdict::new(Instant::now(), 0.0);
        let for_ = Duration::from_secs(60);
        // Clear pass, but only after it held for 60 s.
        assert_eq!(v.update(Raw::Pass, for_, Instant::now(), 0.0), None);
        advance(Duration::from_secs(30)).await;
        assert_eq!(v.update(Raw::Borderline, for_, Instant::now(), 0.0), None);
        advance(Duration::from_secs(30)).await;
        assert_eq!(
            v.update(Raw::Pass, for_, Instant::now(), 60.0),
            Some(SloState::InsufficientData)
        );
        assert_eq!((v.state, v.since_unix), (SloState::Pass, 60.0));
        // A fail that is interrupted by a pass starts over.
        v.update(Raw::Fail, for_, Instant::now(), 0.0);
        advance(Duration::from_secs(50)).await;
        v.update(Raw::Pass, for_, Instant::now(), 0.0);
        advance(Duration::from_secs(20)).await;
        assert_eq!(v.update(Raw::Fail, for_, Instant::now(), 0.0), None);
        assert_eq!(v.state, SloState::Pass);
        advance(Duration::from_secs(60)).await;
        assert_eq!(
            v.update(Raw::Fail, for_, Instant::now(), 0.0),
            Some(SloState::Pass)
        );
        // Missing data is reported at once.
        assert_eq!(
            v.update(Raw::Insufficient, for_, Instant::now(), 0.0),
            Some(SloState::Fail)
        );
        assert_eq!(v.state, SloState::InsufficientData);
    }
}
