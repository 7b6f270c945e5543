//! What the runner and its drivers share: the run's parts ([`Runner`]: targets, client, seeds,
//! budget), one step's context ([`StepCtx`]: its clocks, stop tokens and prompt builder), and a
//! request ready to send ([`Built`]). The step itself (`runner`) and the ways it sends
//! (`drivers`, `replay`) build on these.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::budget::Budget;
use super::plan::StepPlan;
use super::recorder::Recorder;
use super::target::Target;
use crate::client::{ChatMessage, Prompt, RequestRecord, Role, StreamClient};
use crate::config::{Api, Pairing};
use crate::measure::arrivals::Arrivals;
use crate::model::Phase;
use crate::request::{GoodputLimits, RequestLabels};
use crate::workload::prompt::{OverheadEstimate, OverheadLearner, PromptBuilder};
use crate::workload::tokenizer::TokenModel;

/// Everything a step needs, shared by all steps of a run.
pub struct Runner {
    pub targets: Vec<Arc<Target>>,
    pub client: StreamClient,
    pub tokens: Arc<TokenModel>,
    pub overhead: Arc<OverheadLearner>,
    pub recorder: Arc<Recorder>,
    pub seed: u64,
    /// Differs per run so caches warmed by earlier runs cannot inflate hit ratios.
    pub run_salt: u64,
    pub drain_grace: Duration,
    pub max_lag_p99: Duration,
    pub pairing: Pairing,
    /// Every send takes a grant of the traffic budget.
    pub budget: Arc<Budget>,
    /// The goodput definition of targets without their own.
    pub goodput: GoodputLimits,
}

/// The per-step context every driver task shares.
pub(super) struct StepCtx {
    pub(super) plan: StepPlan,
    pub(super) cycle: u64,
    pub(super) step_seed: u64,
    pub(super) builder: PromptBuilder,
    /// Each target's prompt-overhead estimate at the step's start, by target name.
    pub(super) estimates: HashMap<String, OverheadEstimate>,
    /// When the step's clock started (after its connections were opened).
    pub(super) start: Instant,
    pub(super) warmup_end: Instant,
    pub(super) send_end: Instant,
    pub(super) drain_end: Instant,
    /// Stop sending (shutdown): in-flight requests still get the drain.
    pub(super) soft_stop: CancellationToken,
    /// Cut in-flight requests now: they count as `timeout`.
    pub(super) hard_stop: CancellationToken,
    /// Open-loop steps: each target's arrivals over the steady window, by target index, left
    /// here by its arrival loop when it ends.
    pub(super) arrivals: Mutex<HashMap<usize, Arrivals>>,
}

impl StepCtx {
    /// The phase a finished request counts in: steady when it was intended after the warmup;
    /// also when it failed after the warmup ended, whenever it was sent. A target that hangs
    /// holds every worker's first request (sent in the warmup) until the drain cuts it: those
    /// failures happened in the steady window, and counting them there is what makes the step
    /// show the outage (error ratio 1, faulted) instead of no requests at all.
    pub(super) fn phase(&self, intended: Instant, rec: &RequestRecord) -> Phase {
        if intended >= self.warmup_end || (rec.outcome.is_error() && rec.end >= self.warmup_end) {
            Phase::Steady
        } else {
            Phase::Warmup
        }
    }

    pub(super) fn sending(&self) -> bool {
        Instant::now() < self.send_end && !self.soft_stop.is_cancelled()
    }

    pub(super) fn base_labels(&self, target: &Target) -> RequestLabels {
        self.plan.labels(&target.name, target.mode)
    }

    pub(super) fn request_id(&self, run_salt: u64, target: usize, worker: u64, k: u64) -> String {
        let w = match self.plan.workload {
            "concurrency_sweep" => "cs",
            "multi_turn" => "mt",
            "sequence_distribution" => "sd",
            "prefix_cache" => "pc",
            "dataset" => "ds",
            _ => "tr",
        };
        format!(
            "{:08x}-{}-{w}{}-{worker}-{k}-t{target}",
            run_salt as u32, self.cycle, self.plan.index
        )
    }
}

/// One request ready to send.
pub(super) struct Built {
    pub(super) prompt: Prompt,
    pub(super) osl: u32,
    /// Tokens the prompt was built with (before the server's template).
    pub(super) body_tokens: usize,
    pub(super) isl: u32,
    pub(super) shared_prefix_tokens: u64,
}

pub(super) fn as_prompt(api: Api, text: String) -> Prompt {
    match api {
        Api::Chat => Prompt::Chat(vec![ChatMessage::new(Role::User, text)]),
        Api::Completions => Prompt::Text(text),
    }
}
