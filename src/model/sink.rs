//! Where what the schedule measures goes: one trait that every consumer implements (the
//! Prometheus registry, the OTLP pipeline, the SLO engine's windows, the bench's files and
//! progress, the status board), so the scheduler hands its data on without knowing who reads it.

use std::time::Duration;

use super::StepResult;
use crate::client::{RequestRecord, StreamRequest};
use crate::config::{Api, ServingMode};
use crate::request::{GoodputLimits, Reasoning, RequestLabels, Sample};

/// Which part of a step a request was intended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the steady window: counted in `llm_canary_requests_total`, measured nowhere else.
    Warmup,
    /// Inside the steady window: measured.
    Steady,
}

/// What the sender knows of a request besides its record: where it went, under which labels,
/// in which part of the step, what it asked for.
#[derive(Debug, Clone)]
pub struct RecordContext<'a> {
    pub target_index: usize,
    pub labels: &'a RequestLabels,
    pub phase: Phase,
    /// The prompt tokens the canary counted for the request (its tokenizer's count, before the
    /// server's chat template); 0 where it counted none.
    pub isl: u32,
    pub osl: u32,
    /// Prompt tokens a prefix cache can serve (prefix_cache: the shared prefix's whole blocks,
    /// never the last token); 0 elsewhere. The expected hit ratio's numerator.
    pub shared_prefix_tokens: u64,
    /// What was sent.
    pub request: &'a StreamRequest,
    /// What a good request of this target stays within (goodput).
    pub goodput: GoodputLimits,
}

/// A finished request as every consumer receives it, built once per request: its context, what
/// the client observed (`record`: every instant, the server's reply), and what it counts for
/// (`sample`, derived here and nowhere else).
#[derive(Debug, Clone)]
pub struct Finished<'a> {
    pub target_index: usize,
    pub labels: &'a RequestLabels,
    pub phase: Phase,
    /// The prompt tokens the canary counted (`RecordContext::isl`).
    pub isl: u32,
    /// The output tokens asked for.
    pub osl: u32,
    pub shared_prefix_tokens: u64,
    pub request: &'a StreamRequest,
    pub record: &'a RequestRecord,
    pub sample: Sample,
}

impl<'a> Finished<'a> {
    /// The finished request `rec`, sent in `ctx`.
    pub fn new(ctx: &RecordContext<'a>, rec: &'a RequestRecord) -> Self {
        let secs = |d: Duration| d.as_secs_f64();
        let ok = rec.outcome.is_ok();
        // Tokens count only from successful requests: a failed one's usage (a bad_response's
        // above all) is not believed, and a cancelled one was cut where the canary chose.
        let counted = |n: u64| if ok { n } else { 0 };
        let (ttft, itl) = (rec.ttft().map(secs), rec.itl().map(secs));
        Finished {
            target_index: ctx.target_index,
            labels: ctx.labels,
            phase: ctx.phase,
            isl: ctx.isl,
            osl: ctx.osl,
            shared_prefix_tokens: ctx.shared_prefix_tokens,
            request: ctx.request,
            record: rec,
            sample: Sample {
                outcome: rec.outcome,
                ttft,
                itl,
                latency: secs(rec.latency()),
                schedule_lag: secs(rec.schedule_lag()),
                client_queue: rec.slot_at.map(|_| secs(rec.client_queue())),
                prompt_tokens: counted(rec.prompt_tokens().unwrap_or(0)),
                cached_tokens: counted(rec.cached_tokens().unwrap_or(0)),
                output_tokens: counted(rec.output_tokens()),
                expected_cached_tokens: ctx.shared_prefix_tokens,
                cache_source: rec.cache_source().filter(|_| ok),
                server: rec.server_split(),
                good: ok && ctx.goodput.good(ttft, itl),
                osl_mismatch: rec.osl_mismatch(ctx.osl),
                token_count_mismatch: ok && rec.token_count_disagreement().is_some_and(|d| d != 0),
                reasoning: reasoning(rec, ok),
            },
        }
    }
}

/// The reasoning measures of `rec`, when its stream carried reasoning; its tokens only when it
/// succeeded (`ok`), as every token count.
fn reasoning(rec: &RequestRecord, ok: bool) -> Option<Reasoning> {
    let secs = |d: Duration| d.as_secs_f64();
    rec.had_reasoning().then(|| Reasoning {
        reasoning_tokens: if ok { rec.reasoning_tokens() } else { 0 },
        answer_tokens: if ok { rec.answer_tokens() } else { 0 },
        time_to_first_reasoning_token: rec.time_to_first_reasoning_token().map_or(0.0, secs),
        time_to_first_answer_token: rec.time_to_first_answer_token().map(secs),
        reasoning_time: rec.reasoning_time().map(secs),
    })
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

/// Why no traffic is sent now (docs/DESIGN.md §5), as `llm_canary_paused{reason}` shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PauseState {
    /// Operators' pauses in force: where each came from (`config`, `http`, `annotation`) and
    /// its note.
    pub operator: Vec<(String, String)>,
    /// Outside the `schedule.active` windows, or too close to a window's end for the next step.
    pub schedule: bool,
    /// The output-token budget of the last hour is spent on every target.
    pub budget: bool,
    /// When the schedule windows next open or close, in Unix seconds.
    pub next_change_unix: Option<f64>,
}

impl PauseState {
    /// The `reason` label values.
    pub const REASONS: [&'static str; 3] = ["operator", "schedule", "budget"];

    pub fn paused(&self) -> bool {
        !self.operator.is_empty() || self.schedule || self.budget
    }

    /// Each reason with whether it holds, in [`PauseState::REASONS`] order.
    pub fn reasons(&self) -> [(&'static str, bool); 3] {
        [
            ("operator", !self.operator.is_empty()),
            ("schedule", self.schedule),
            ("budget", self.budget),
        ]
    }
}

/// What the traffic budget did to a step on one target.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetAction {
    pub target: String,
    pub workload: &'static str,
    /// `skipped` (it would exceed `max_inflight`, or the hour's tokens are spent), `scaled` (its
    /// open-loop rate lowered to `max_rps`), `serialized` (targets run one after another to fit
    /// the global `max_inflight`) or `cut` (sending stopped when the hour's tokens ran out).
    pub action: &'static str,
    /// What limit and by how much, for the log and `/api/v1/status`.
    pub detail: String,
}

/// The budget's state after a step: what it did and how much of each limit is in use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetReport {
    pub actions: Vec<BudgetAction>,
    pub usage: Vec<BudgetUsage>,
}

/// One scope of the budget (a target, or `all` for the global one).
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetUsage {
    pub scope: String,
    pub max_inflight: Option<u32>,
    pub max_rps: Option<f64>,
    pub max_output_tokens_per_hour: Option<u64>,
    /// Output tokens received in the last hour.
    pub output_tokens_last_hour: u64,
    /// Requests that waited for `max_rps` since the start, and the total wait.
    pub throttled_requests: u64,
    pub throttled_seconds: f64,
}

/// A consumer of what the schedule measures. Every method but `request` has an empty default, so
/// a sink implements only what it reads. The scheduler calls them in this order: `targets` when
/// the target set changes, `cycle_started`, then per step `step_started`, `request` (and
/// `in_flight`) for its requests, `step_finished`; `cycle_finished` when a cycle completes.
pub trait Sink: Send + Sync {
    /// A request finished, in warmup or in the steady window (`req.phase`).
    fn request(&self, req: &Finished<'_>);

    /// A request sent outside every step finished (the probe stream): measured like a steady
    /// one, but no step result will ever hold it. A sink that reads requests alike wherever they
    /// come from leaves this to `request`.
    fn request_outside_steps(&self, req: &Finished<'_>) {
        self.request(req);
    }

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

    /// A connection to `target` was opened (TCP, and TLS for `https://`) in `took`: before a step, or by a request that
    /// found none idle (then also in its record's `connect`).
    fn connected(&self, _target: &str, _took: Duration) {}

    /// A request to `target` was sent (`delta` 1) or finished (`delta` -1).
    fn in_flight(&self, _target: &str, _delta: i64) {}

    /// Traffic stopped or resumed (at start, and at every change): no request is sent while
    /// `state.paused()`.
    fn paused(&self, _state: &PauseState) {}

    /// The traffic budget after a step (and before it, when it skipped or changed the step).
    fn budget(&self, _report: &BudgetReport) {}

    /// A request of a step with these labels was built but not sent, for `reason`
    /// (`context_length`: its prompt plus `max_tokens` is above the target's context bound).
    fn skipped(&self, _labels: &RequestLabels, _reason: &'static str) {}
}
