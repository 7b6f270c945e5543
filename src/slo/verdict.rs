//! The verdict state machine of one SLO: a clear pass or fail must hold for `for` before the
//! state changes, a borderline evaluation keeps the state, and too few samples give
//! `insufficient_data` at once; and the reading an evaluation publishes.

use std::time::Duration;

use tokio::time::Instant;

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

/// Two runs before a fail: a comparison SLO changes to `fail` only when two consecutive runs
/// of its data fail clearly, so one run that a batch phase, a cache state or a noisy neighbour
/// made slow never pages, while a regression pages at its second run. A run is the data as of
/// the newest step the SLO reads: a new step ending starts the next. A clear pass needs one run
/// (a reset is not held back). Kept in memory: after a restart the next fail needs two runs
/// again (a restored `fail` holds meanwhile).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunGate {
    /// The newest step of the run being judged.
    run: Option<Instant>,
    /// That run's latest evaluation was a clear fail.
    failing: bool,
    /// The run before it ended on a clear fail.
    previous_failing: bool,
}

impl RunGate {
    /// `raw` of the run whose newest step ended at `run`, held back to borderline when it is the
    /// first of the runs failing in a row.
    pub fn apply(&mut self, raw: Raw, run: Option<Instant>) -> Raw {
        if run != self.run {
            if self.run.is_some() {
                self.previous_failing = self.failing;
            }
            self.run = run;
        }
        self.failing = raw == Raw::Fail;
        if raw == Raw::Fail && !self.previous_failing {
            Raw::Borderline
        } else {
            raw
        }
    }

    /// The current run fails and waits for the next one to confirm it.
    pub fn waiting(&self) -> bool {
        self.failing && !self.previous_failing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    #[tokio::test(start_paused = true)]
    async fn a_fail_needs_two_runs_in_a_row_and_a_pass_one() {
        let mut gate = RunGate::default();
        let run = |s: u64| Some(Instant::now() + Duration::from_secs(s));
        // One slow run: held back, however many times it is evaluated.
        assert_eq!(gate.apply(Raw::Fail, run(1)), Raw::Borderline);
        assert!(gate.waiting());
        assert_eq!(gate.apply(Raw::Fail, run(1)), Raw::Borderline);
        // A good run between two slow ones starts over.
        assert_eq!(gate.apply(Raw::Pass, run(2)), Raw::Pass);
        assert_eq!(gate.apply(Raw::Fail, run(3)), Raw::Borderline);
        // The second slow run in a row fails, and so does every evaluation of it.
        assert_eq!(gate.apply(Raw::Fail, run(4)), Raw::Fail);
        assert_eq!(gate.apply(Raw::Fail, run(4)), Raw::Fail);
        assert!(!gate.waiting());
        // Missing data and a pass pass through at once.
        assert_eq!(gate.apply(Raw::Insufficient, run(5)), Raw::Insufficient);
        assert_eq!(gate.apply(Raw::Pass, run(6)), Raw::Pass);
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
