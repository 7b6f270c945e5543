//! Where what the schedule measures goes: one trait that every consumer implements (the
//! Prometheus registry, the OTLP pipeline, the SLO engine's windows, the bench's files and
//! progress, the status board), so the scheduler hands its data on without knowing who reads it.

use std::time::Duration;

use crate::client::{RequestRecord, StreamRequest};
use crate::config::{Api, ServingMode};

use super::{RequestLabels, StepResult};

/// Which part of a step a request was intended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the steady window: counted in `llm_canary_requests_total`, measured nowhere else.
    Warmup,
    /// Inside the steady window: measured.
    Steady,
}

/// What a sink needs to know about a request besides its record.
#[derive(Debug, Clone)]
pub struct RecordContext<'a> {
    pub target_index: usize,
    pub labels: &'a RequestLabels,
    pub phase: Phase,
    pub osl: u32,
    /// Prompt tokens a prefix cache can serve (prefix_cache: the shared prefix's whole blocks,
    /// never the last token); 0 elsewhere. The expected hit ratio's numerator.
    pub shared_prefix_tokens: u64,
    /// What was sent.
    pub request: &'a StreamRequest,
}

/// A target as the consumers know it: what its series and attributes are named after.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetInfo {
    /// The `target` label.
    pub name: String,
    pub serving_mode: ServingMode,
    pub url: String,
    pub model: String,
    pub api: Api,
}

/// A change of the target set: what traffic goes to from the next step on.
#[derive(Debug, Clone, Copy)]
pub struct TargetChange<'a> {
    pub now: &'a [TargetInfo],
    /// Names in `now` that were not there before.
    pub added: &'a [String],
    /// Names that left: their series should go.
    pub removed: &'a [String],
}

/// A step of the cycle as the consumers see it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepInfo {
    pub cycle: u64,
    /// 0-based position in the cycle, and the cycle's number of steps.
    pub position: usize,
    pub steps: usize,
    /// The `workload` label.
    pub workload: &'static str,
    /// `concurrency_sweep concurrency=32`.
    pub name: String,
    pub warmup: Duration,
    pub steady: Duration,
}

/// A consumer of what the schedule measures. Every method but `request` has an empty default, so
/// a sink implements only what it reads. The scheduler calls them in this order: `targets` when
/// the target set changes, `cycle_started`, then per step `step_started`, `request` (and
/// `in_flight`) for its requests, `step_finished`; `cycle_finished` when a cycle completes.
pub trait Sink: Send + Sync {
    /// A request finished, in warmup or in the steady window (`ctx.phase`).
    fn request(&self, ctx: &RecordContext<'_>, rec: &RequestRecord);

    /// The targets traffic goes to from the next step on changed (at the start, or through a
    /// reload, discovery or leader election).
    fn targets(&self, _change: &TargetChange<'_>) {}

    /// A cycle of these steps begins.
    fn cycle_started(&self, _steps: &[StepInfo]) {}

    /// A step begins (its prefix warm-up, if any, already done).
    fn step_started(&self, _step: &StepInfo) {}

    /// A step ended with these results; `None` when it was cut short (shutdown, a lost Lease):
    /// it measured a shorter window than planned and is not reported.
    fn step_finished(&self, _step: &StepInfo, _results: Option<&[StepResult]>) {}

    /// A cycle of the schedule completed.
    fn cycle_finished(&self, _cycle: u64) {}

    /// A request to `target` was sent (`delta` 1) or finished (`delta` -1).
    fn in_flight(&self, _target: &str, _delta: i64) {}
}
