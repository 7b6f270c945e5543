//! Where the schedule's data goes: every [`Sink`] (Prometheus, OTLP, the SLO engine, the bench's
//! files, the status board, in the order given) and the current step's accumulators
//! (steady-window requests only, and the connections opened since the last step).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::client::RequestRecord;
use crate::measure::step::StepAccumulator;
use crate::model::{
    BudgetReport, Finished, PauseState, Phase, RecordContext, Sink, StepInfo, StepResult,
    TargetChange,
};
use crate::request::RequestLabels;

type Key = (usize, RequestLabels);

/// Hands every finished request to the sinks and keeps the step's accumulators.
pub struct Recorder {
    sinks: Vec<Arc<dyn Sink>>,
    step: Mutex<HashMap<Key, StepAccumulator>>,
    /// Connect times per target index since the last step ended.
    connections: Mutex<HashMap<usize, Vec<Duration>>>,
}

/// A request in flight to one target: every sink hears of its start and, on drop, of its end.
pub struct InFlight<'a> {
    recorder: &'a Recorder,
    target: &'a str,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        for s in &self.recorder.sinks {
            s.in_flight(self.target, -1);
        }
    }
}

impl Recorder {
    /// A recorder that hands every request, step and cycle to `sinks`, in this order.
    pub fn new(sinks: Vec<Arc<dyn Sink>>) -> Self {
        Recorder {
            sinks,
            step: Mutex::new(HashMap::new()),
            connections: Mutex::new(HashMap::new()),
        }
    }

    /// A request to `target` starts; it ends when the guard is dropped.
    pub fn in_flight<'a>(&'a self, target: &'a str) -> InFlight<'a> {
        for s in &self.sinks {
            s.in_flight(target, 1);
        }
        InFlight {
            recorder: self,
            target,
        }
    }

    /// The target set changed (see [`Sink::targets`]).
    pub fn targets(&self, change: &TargetChange<'_>) {
        for s in &self.sinks {
            s.targets(change);
        }
    }

    /// A cycle of these steps begins.
    pub fn cycle_started(&self, steps: &[StepInfo]) {
        for s in &self.sinks {
            s.cycle_started(steps);
        }
    }

    /// A step begins.
    pub fn step_started(&self, step: &StepInfo) {
        for s in &self.sinks {
            s.step_started(step);
        }
    }

    /// A step ended with these results (`None`: cut short, not reported).
    pub fn step_finished(&self, step: &StepInfo, results: Option<&[StepResult]>) {
        for s in &self.sinks {
            s.step_finished(step, results);
        }
    }

    /// A cycle of the schedule completed.
    pub fn cycle_finished(&self, cycle: u64) {
        for s in &self.sinks {
            s.cycle_finished(cycle);
        }
    }

    /// Traffic stopped or resumed.
    pub fn paused(&self, state: &PauseState) {
        for s in &self.sinks {
            s.paused(state);
        }
    }

    /// What the budget did, and how much of it is in use.
    pub fn budget(&self, report: &BudgetReport) {
        for s in &self.sinks {
            s.budget(report);
        }
    }

    /// A connection to target `index` (named `target`) was opened in `took`, for the step
    /// under way or the next one.
    pub fn connected(&self, index: usize, target: &str, took: Duration) {
        for s in &self.sinks {
            s.connected(target, took);
        }
        let mut connections = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        connections.entry(index).or_default().push(took);
    }

    /// Records a request sent outside every step (the probe stream): every sink sees it, no
    /// step result counts it.
    pub fn record_outside_steps(&self, ctx: &RecordContext<'_>, rec: &RequestRecord) {
        let finished = Finished::new(ctx, rec);
        for s in &self.sinks {
            s.request_outside_steps(&finished);
            if let Some(took) = rec.connect {
                s.connected(&ctx.labels.target, took);
            }
        }
    }

    /// Records one finished request: built once into a [`Finished`], handed to every sink and,
    /// in the steady window, to the step's accumulator.
    pub fn record(&self, ctx: &RecordContext<'_>, rec: &RequestRecord) {
        let finished = Finished::new(ctx, rec);
        for s in &self.sinks {
            s.request(&finished);
        }
        if let Some(took) = rec.connect {
            self.connected(ctx.target_index, &ctx.labels.target, took);
        }
        if ctx.phase == Phase::Warmup {
            return;
        }
        let mut step = self.step.lock().unwrap_or_else(PoisonError::into_inner);
        step.entry((ctx.target_index, ctx.labels.clone()))
            .or_default()
            .record(&finished.sample);
    }

    /// Records a request of target `target_index` that was built but not sent, for `reason`:
    /// every sink hears of it, and the step's result counts it, warmup included (a skip
    /// measures nothing, and a step whose requests cannot fit skips them from its start).
    pub fn skipped(&self, target_index: usize, labels: &RequestLabels, reason: &'static str) {
        for s in &self.sinks {
            s.skipped(labels, reason);
        }
        let mut step = self.step.lock().unwrap_or_else(PoisonError::into_inner);
        step.entry((target_index, labels.clone()))
            .or_default()
            .skip(reason);
    }

    /// Records a request sent outside every step (the probe stream) that was built but not
    /// sent, for `reason`: every sink hears of it, no step result counts it.
    pub fn skipped_outside_steps(&self, labels: &RequestLabels, reason: &'static str) {
        for s in &self.sinks {
            s.skipped(labels, reason);
        }
    }

    /// Records a finished multi-turn conversation's whole time.
    pub fn record_conversation(&self, target_index: usize, labels: &RequestLabels, secs: f64) {
        let mut step = self.step.lock().unwrap_or_else(PoisonError::into_inner);
        step.entry((target_index, labels.clone()))
            .or_default()
            .record_conversation(secs);
    }

    /// Takes the accumulators of the step that just ended, leaving the recorder empty.
    pub fn take_step(&self) -> HashMap<Key, StepAccumulator> {
        std::mem::take(&mut *self.step.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Takes the connect times per target index gathered since the last call.
    pub fn take_connections(&self) -> HashMap<usize, Vec<Duration>> {
        std::mem::take(
            &mut *self
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::*;

    #[derive(Default)]
    struct Count(AtomicI64);

    impl Sink for Count {
        fn request(&self, _: &Finished<'_>) {}
        fn in_flight(&self, _: &str, delta: i64) {
            self.0.fetch_add(delta, Ordering::SeqCst);
        }
    }

    #[test]
    fn in_flight_guard_ends_the_request_on_drop() {
        let count = Arc::new(Count::default());
        let recorder = Recorder::new(vec![count.clone()]);
        let first = recorder.in_flight("agg");
        let second = recorder.in_flight("agg");
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        drop(first);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        drop(second);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }
}
