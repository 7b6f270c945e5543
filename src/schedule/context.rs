//! What the runner and its drivers share: the run's parts ([`Runner`]: targets, client, seeds,
//! budget), one step's context ([`StepCtx`]: its clocks, stop tokens, prompt builder and each
//! target's endpoint for the step's workload, [`StepEndpoint`]), and a request ready to send
//! ([`Built`]). The step itself (`runner`) and the ways it sends
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
use crate::client::{
    ChatMessage, ClientError, Endpoint, Prompt, RequestRecord, Role, StreamClient,
};
use crate::config::{Api, Pairing, RequestOptions};
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
    /// Each target's endpoint per workload, built once (shared by the runners of one run).
    pub endpoints: Arc<EndpointCache>,
}

/// The per-step context every driver task shares.
pub(super) struct StepCtx {
    pub(super) plan: StepPlan,
    pub(super) cycle: u64,
    pub(super) step_seed: u64,
    pub(super) builder: PromptBuilder,
    /// Each target's prompt-overhead estimate at the step's start, by
    /// [`StepEndpoint::overhead_key`].
    pub(super) estimates: HashMap<String, OverheadEstimate>,
    /// What each target's requests go to in this step, by target index.
    pub(super) endpoints: HashMap<usize, Arc<StepEndpoint>>,
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

    /// Target `t`'s endpoint for this step (every target of the step has one).
    pub(super) fn endpoint(&self, t: usize) -> &StepEndpoint {
        &self.endpoints[&t]
    }

    /// Target `t`'s prompt-overhead estimate at the step's start.
    pub(super) fn estimate(&self, t: usize) -> Option<OverheadEstimate> {
        self.estimates.get(&self.endpoint(t).overhead_key).copied()
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

/// Where one target's requests of a step go: its endpoint with the workload's `request:` added
/// (its body fields serialised once here, for every request of the step), and the key its
/// prompt overhead is learnt under.
pub(super) struct StepEndpoint {
    pub(super) endpoint: Endpoint,
    /// The target's name; with the API appended when the workload sends on another API than
    /// the target's, since a chat template adds tokens a completions prompt does not have.
    pub(super) overhead_key: String,
}

impl StepEndpoint {
    /// `target`'s endpoint with `request` added over its own options.
    pub(super) fn of(target: &Target, request: &RequestOptions) -> Result<Self, ClientError> {
        let endpoint = if request.is_empty() {
            target.endpoint.clone()
        } else {
            target.endpoint.clone().with_request(request)?
        };
        let overhead_key = if endpoint.api() == target.endpoint.api() {
            target.name.clone()
        } else {
            format!("{} ({:?} API)", target.name, endpoint.api())
        };
        Ok(StepEndpoint {
            endpoint,
            overhead_key,
        })
    }
}

/// Each target's [`StepEndpoint`] per workload, built at the first step that needs it and kept
/// while neither the target (a reload or discovery replaces it) nor the workload's options
/// change: the merged body fields are serialised once per target and workload, never per
/// request or per step.
#[derive(Default)]
pub struct EndpointCache(Mutex<HashMap<(String, &'static str), CachedEndpoint>>);

struct CachedEndpoint {
    /// Weak: a target gone from the run is not kept alive by its entry.
    target: std::sync::Weak<Target>,
    request: Arc<RequestOptions>,
    endpoint: Arc<StepEndpoint>,
}

impl EndpointCache {
    /// `target`'s endpoint for `workload`, whose options are `request`.
    pub(super) fn get(
        &self,
        target: &Arc<Target>,
        workload: &'static str,
        request: &Arc<RequestOptions>,
    ) -> Result<Arc<StepEndpoint>, ClientError> {
        let mut cached = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (target.name.clone(), workload);
        if let Some(c) = cached.get(&key)
            && c.target.upgrade().is_some_and(|t| Arc::ptr_eq(&t, target))
            && (Arc::ptr_eq(&c.request, request) || *c.request == **request)
        {
            return Ok(Arc::clone(&c.endpoint));
        }
        let endpoint = Arc::new(StepEndpoint::of(target, request)?);
        cached.retain(|_, c| c.target.strong_count() > 0);
        cached.insert(
            key,
            CachedEndpoint {
                target: Arc::downgrade(target),
                request: Arc::clone(request),
                endpoint: Arc::clone(&endpoint),
            },
        );
        Ok(endpoint)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Dialect, ServingMode};

    fn target() -> Arc<Target> {
        Arc::new(Target {
            name: "a".into(),
            mode: ServingMode::Aggregated,
            endpoint: Endpoint::new("http://127.0.0.1:1", Api::Chat, "m", Dialect::Vllm).unwrap(),
            cost_per_hour_usd: None,
            goodput: None,
            max_context_tokens: None,
            stream: true,
        })
    }

    fn options(yaml: &str) -> Arc<RequestOptions> {
        Arc::new(serde_saphyr::from_str(yaml).unwrap())
    }

    #[test]
    fn an_endpoint_is_built_once_per_target_and_workload() {
        let cache = EndpointCache::default();
        let (t, sweep) = (
            target(),
            options("{api: completions, extra_body: {top_p: 0.9}}"),
        );
        let first = cache.get(&t, "concurrency_sweep", &sweep).unwrap();
        assert_eq!(first.endpoint.api(), Api::Completions);
        assert_eq!(first.overhead_key, "a (Completions API)");
        // The next cycle's plan: equal options in another allocation.
        let again = options("{api: completions, extra_body: {top_p: 0.9}}");
        assert!(Arc::ptr_eq(
            &first,
            &cache.get(&t, "concurrency_sweep", &again).unwrap()
        ));
        // Another workload, changed options, a replaced target: built anew.
        let plain = cache.get(&t, "multi_turn", &Arc::default()).unwrap();
        assert_eq!(plain.overhead_key, "a");
        let changed = options("{extra_body: {top_p: 0.5}}");
        let rebuilt = cache.get(&t, "concurrency_sweep", &changed).unwrap();
        assert!(!Arc::ptr_eq(&first, &rebuilt));
        let replaced = target();
        assert!(!Arc::ptr_eq(
            &rebuilt,
            &cache.get(&replaced, "concurrency_sweep", &changed).unwrap()
        ));
    }
}
