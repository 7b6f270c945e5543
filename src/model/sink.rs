//! Where finished requests and steps go: one trait that every consumer implements (the
//! Prometheus registry, the OTLP pipeline, the SLO engine's windows, the bench's files), so the
//! scheduler hands its data on without knowing who reads it.

use crate::client::{RequestRecord, StreamRequest};

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

/// A consumer of what the schedule measures. Every method but `request` has an empty default, so
/// a sink implements only what it reads.
pub trait Sink: Send + Sync {
    /// A request finished, in warmup or in the steady window (`ctx.phase`).
    fn request(&self, ctx: &RecordContext<'_>, rec: &RequestRecord);

    /// A step ended with these results (empty when it was cut short and is not reported).
    fn step_finished(&self, _results: &[StepResult]) {}

    /// A cycle of the schedule completed.
    fn cycle_finished(&self) {}

    /// A request to `target` was sent (`delta` 1) or finished (`delta` -1).
    fn in_flight(&self, _target: &str, _delta: i64) {}
}
