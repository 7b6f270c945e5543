//! How the detection benchmark scores one SLO's state changes in one scenario, as the SRE
//! workbook scores alerting: precision (state changes nothing called for), recall (injected
//! regressions the SLO was meant to catch, caught), detection time and reset time.

#![allow(dead_code)]

use llm_canary::slo::SloState;

/// One state change of an SLO, `at` seconds after the scenario's first cycle began.
#[derive(Debug, Clone)]
pub struct Change {
    pub slo: String,
    pub old: SloState,
    pub new: SloState,
    pub at: f64,
}

/// What an SLO should do in a scenario: the ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The injected regression is this SLO's to catch: one change to `fail` once it is due,
    /// one back once it ended; any other change is false.
    Expected,
    /// The injection really changes what this SLO reads (a comparison across the modes whose
    /// one side regressed, an SLO over a mode that fails requests): its changes are neither
    /// required nor false, and are shown apart.
    Allowed,
    /// Nothing this SLO reads changed beyond the steady variability: every change is false.
    Unaffected,
}

/// When the regression of a scenario should be seen, in seconds from its first cycle.
#[derive(Debug, Clone, Copy)]
pub struct Truth {
    /// From when the regression is due to be caught (its start, or for a drift the moment it
    /// reached the 20 % the regression SLOs are written for); `None`: nothing is injected.
    pub due: Option<f64>,
    /// When it began: a drift is a regression from its start, so failing between its start
    /// and its due time is an early catch, not a false change (`None`: at `due`).
    pub begun: Option<f64>,
    /// When it ended; `None`: it lasted until the end of the run.
    pub end: Option<f64>,
    /// The end of the run.
    pub run_end: f64,
    /// The end of the learning cycles: changes until then are the engine learning how far
    /// the deployment's runs move, counted apart.
    pub learned: f64,
}

/// One SLO's score in one scenario; times in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    pub role: Role,
    /// When the SLO first left `insufficient_data`; `None`: never.
    pub first_verdict: Option<f64>,
    /// State changes after its first verdict and after the learning cycles.
    pub changes: usize,
    /// State changes after its first verdict, within the learning cycles.
    pub learning_changes: usize,
    /// Of those, the ones the ground truth does not call for (`Allowed` SLOs: none).
    pub false_changes: usize,
    /// Changes to `fail` after the first verdict: alerts.
    pub alerts: usize,
    /// `Expected` SLOs: whether it was failing at some time between the regression being due
    /// and its end.
    pub caught: Option<bool>,
    /// From the regression being due to the SLO failing.
    pub detection: Option<f64>,
    /// From the regression's end to the SLO passing again.
    pub reset: Option<f64>,
}

/// The state of an SLO at `t`, from its changes in order.
fn state_at(changes: &[&Change], t: f64) -> SloState {
    changes
        .iter()
        .take_while(|c| c.at <= t)
        .last()
        .map_or(SloState::InsufficientData, |c| c.new)
}

/// Scores the changes of one SLO (in time order) against `truth`.
pub fn score(changes: &[&Change], role: Role, truth: &Truth) -> Score {
    let first = changes
        .iter()
        .position(|c| c.new != SloState::InsufficientData);
    let after_first: &[&Change] = first.map_or(&[], |i| &changes[i + 1..]);
    let (learning, later): (Vec<&Change>, Vec<&Change>) =
        after_first.iter().partition(|c| c.at <= truth.learned);
    // A change to fail after the first verdict is an alert; so is a first verdict of fail that
    // came with the regression (the SLO had not settled before it; a drift's from its start).
    let begun = truth.begun.or(truth.due);
    let late_first_fail = first.is_some_and(|i| {
        changes[i].new == SloState::Fail && begun.is_some_and(|b| changes[i].at >= b)
    });
    let alerts =
        later.iter().filter(|c| c.new == SloState::Fail).count() + usize::from(late_first_fail);
    let mut score = Score {
        role,
        first_verdict: first.map(|i| changes[i].at),
        changes: later.len(),
        learning_changes: learning.len(),
        false_changes: if role == Role::Unaffected {
            later.len()
        } else {
            0
        },
        alerts,
        caught: None,
        detection: None,
        reset: None,
    };
    if role != Role::Expected {
        return score;
    }
    let Some(due) = truth.due else {
        score.false_changes = later.len();
        return score;
    };
    let until = truth.end.unwrap_or(truth.run_end);
    let begun = truth.begun.map_or(due, |b| b.min(due));
    let after_first = |c: &&Change| first.is_some_and(|i| c.at > changes[i].at);
    // Failing when it began (a flap before it), or the first change to fail after: the SLO's
    // first verdict itself, when the regression came before it had one. A catch before the
    // regression is due counts as at its due time.
    let to_fail = changes
        .iter()
        .find(|c| c.at >= begun && c.new == SloState::Fail);
    let detected_at = if state_at(changes, begun) == SloState::Fail {
        Some(due)
    } else {
        to_fail.map(|c| c.at.max(due))
    };
    let caught = detected_at.is_some_and(|t| t <= until);
    score.caught = Some(caught);
    score.detection = detected_at.map(|t| t - due);
    // The changes the truth calls for, among those after the first verdict.
    let mut expected = usize::from(
        state_at(changes, begun) != SloState::Fail
            && to_fail.is_some_and(|c| c.at <= until && after_first(c)),
    );
    if let (true, Some(end)) = (caught, truth.end) {
        if state_at(changes, end) == SloState::Fail {
            let back = later.iter().find(|c| c.at > end && c.new == SloState::Pass);
            score.reset = back.map(|c| c.at - end);
            expected += usize::from(back.is_some());
        } else {
            score.reset = Some(0.0);
        }
    }
    score.false_changes = later.len().saturating_sub(expected);
    score
}
