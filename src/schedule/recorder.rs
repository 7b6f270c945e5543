//! Where finished requests go: the Prometheus metrics (every request), the current step's
//! accumulators (steady-window requests only) and, for the bench, a per-request sink.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::client::{RequestRecord, StreamRequest};
use crate::export::metrics::{Metrics, RequestLabels};
use crate::export::otlp::OtlpExporter;
use crate::measure::step::{Sample, StepAccumulator};

/// `llm_canary_target_up`: whether a finished request reached the target. Any HTTP response
/// counts (a 429 or 503 still comes from a live server); no connection, or a timeout with no
/// response head, does not.
pub fn reached_target(rec: &RequestRecord) -> bool {
    use crate::client::Outcome;
    match rec.outcome {
        Outcome::Connect => false,
        Outcome::Timeout => rec.first_byte.is_some(),
        _ => true,
    }
}

/// Which part of a step a request was intended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the steady window: counted in `llm_canary_requests_total`, measured nowhere else.
    Warmup,
    /// Inside the steady window: measured.
    Steady,
}

/// What the recorder needs to know about a request besides its record.
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

/// Receives every finished request (the bench writes `requests.jsonl` from it).
pub trait RecordSink: Send + Sync {
    fn record(&self, ctx: &RecordContext<'_>, rec: &RequestRecord);
}

type Key = (usize, RequestLabels);

/// Records requests into the metrics and the current step.
pub struct Recorder {
    metrics: Arc<Metrics>,
    step: Mutex<HashMap<Key, StepAccumulator>>,
    sink: Option<Arc<dyn RecordSink>>,
    otlp: Option<Arc<OtlpExporter>>,
    observer: Option<Arc<dyn MeasurementObserver>>,
}

/// Receives what the SLO engine evaluates: every steady-window request, every finished step (so
/// a degraded step's requests can be left out) and the end of every cycle (baselines).
pub trait MeasurementObserver: Send + Sync {
    fn request(&self, labels: &RequestLabels, rec: &RequestRecord);
    fn step_finished(&self, results: &[super::StepResult]);
    fn cycle_finished(&self);
}

impl Recorder {
    pub fn new(metrics: Arc<Metrics>, sink: Option<Arc<dyn RecordSink>>) -> Self {
        Recorder {
            metrics,
            step: Mutex::new(HashMap::new()),
            sink,
            otlp: None,
            observer: None,
        }
    }

    /// Also feeds steady-window requests, step ends and cycle ends to `observer` (the SLO engine).
    pub fn with_observer(mut self, observer: Arc<dyn MeasurementObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// A step ended with these results (called by the scheduler after publishing them).
    pub fn step_finished(&self, results: &[super::StepResult]) {
        if let Some(o) = &self.observer {
            o.step_finished(results);
        }
    }

    /// A cycle of the schedule completed.
    pub fn cycle_finished(&self) {
        if let Some(o) = &self.observer {
            o.cycle_finished();
        }
    }

    /// Also pushes every request to the OTLP pipeline.
    pub fn with_otlp(mut self, otlp: Arc<OtlpExporter>) -> Self {
        self.otlp = Some(otlp);
        self
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Records one finished request.
    pub fn record(&self, ctx: &RecordContext<'_>, rec: &RequestRecord) {
        let outcome = rec.outcome.as_str();
        let labels = ctx.labels;
        let secs = |d: Duration| d.as_secs_f64();
        if let Some(sink) = &self.sink {
            sink.record(ctx, rec);
        }
        if let Some(otlp) = &self.otlp {
            otlp.record(labels, ctx.phase == Phase::Steady, rec);
        }
        self.metrics
            .set_target_up(&labels.target, reached_target(rec));
        if ctx.phase == Phase::Warmup {
            // Warmup requests still count, so an error in warmup is never silently lost.
            self.metrics
                .record_request(labels, outcome, None, None, None, 0, 0, 0);
            return;
        }
        if let Some(o) = &self.observer {
            o.request(labels, rec);
        }
        let ok = rec.outcome.is_ok();
        let ttft = rec.ttft().map(secs);
        let itl = rec.itl().map(secs);
        let latency = secs(rec.latency());
        let prompt = rec.prompt_tokens().unwrap_or(0);
        let cached = rec.cached_tokens().unwrap_or(0);
        let output = if ok { rec.output_tokens() } else { 0 };
        self.metrics.record_request(
            labels,
            outcome,
            ttft.filter(|_| ok),
            itl.filter(|_| ok),
            Some(latency),
            prompt,
            cached,
            output,
        );
        if ok {
            let gaps: Vec<(f64, u32)> = rec
                .token_gaps()
                .map(|(g, k)| (secs(g) * f64::from(k), k))
                .collect();
            self.metrics.record_chunk_gaps(labels, &gaps);
        }
        self.metrics.observe_schedule_lag(
            &labels.target,
            &labels.workload,
            secs(rec.schedule_lag()),
        );
        let osl_mismatch = rec.osl_mismatch(ctx.osl);
        if osl_mismatch {
            self.metrics.record_osl_mismatch(labels);
        }
        if ok && rec.token_count_disagreement().is_some_and(|d| d != 0) {
            self.metrics.record_token_count_mismatch(labels);
        }
        let sample = Sample {
            outcome,
            ttft,
            itl,
            latency,
            schedule_lag: secs(rec.schedule_lag()),
            prompt_tokens: prompt,
            cached_tokens: cached,
            output_tokens: output,
            expected_cached_tokens: ctx.shared_prefix_tokens,
            osl_mismatch,
        };
        let mut step = self.step.lock().unwrap_or_else(PoisonError::into_inner);
        step.entry((ctx.target_index, labels.clone()))
            .or_default()
            .record(&sample);
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
}
