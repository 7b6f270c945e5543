//! Runs one step against every target: closed-loop workers, open-loop arrivals or multi-turn
//! conversations, with warmup, steady window and a bounded drain; then the step results.
//!
//! Pairing: every target runs the same step at the same time (or one after another with
//! `pairing: sequential`), and request `k` of worker `w` is built from the same seed for every
//! target, so all targets receive byte-identical prompt sequences. Each target keeps its own
//! closed loop, so a slow target never throttles a fast one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::context::{Built, Runner, StepCtx, StepEndpoint, as_prompt};
use super::plan::{StepKind, StepPlan};
use super::target::Target;
use crate::client::{Cancel, RequestRecord, StreamRequest};
use crate::clock::unix_now;
use crate::config::Pairing;
use crate::measure::arrivals::Arrivals;
use crate::measure::step::{FAULTED_ERROR_RATIO_WITH_BACKOFF, StepAccumulator};
use crate::model::{RecordContext, StepConnections, StepResult};
use crate::request::RequestLabels;
use crate::workload::dataset::Dataset;
use crate::workload::prompt::{
    OverheadEstimate, OverheadLearner, PromptBuilder, PromptConfig, PromptRequest, body_tokens,
};
use crate::workload::sampler::{LengthSampler, derive_seed, isl_bucket};

/// The longest one calibration probe (one output token) may take before the target counts as not
/// calibrated: long enough for a busy server's queue, short enough that a dead target barely
/// delays the first step.
pub const CALIBRATION_TIMEOUT: Duration = Duration::from_secs(10);

/// A closed-loop worker whose request failed waits this long before the next one, doubling per
/// consecutive failure up to [`ERROR_BACKOFF_MAX`]; a success resets it (see `back_off`).
pub const ERROR_BACKOFF_MIN: Duration = Duration::from_millis(50);
pub const ERROR_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The `reason` of a request skipped because its prompt plus `max_tokens` is above the target's
/// context bound.
pub const SKIP_CONTEXT_LENGTH: &str = "context_length";

/// The fewest tokens (prompt + output) a request of `plan` can hold, where its lengths are
/// fixed or bounded below by the config; `None` for a trace, whose rows say theirs.
pub(super) fn fewest_tokens(plan: &StepPlan) -> Option<u64> {
    match &plan.kind {
        StepKind::Sweep { isl, osl, .. }
        | StepKind::Prefix { isl, osl, .. }
        | StepKind::MultiTurn { isl, osl, .. } => Some(u64::from(*isl) + u64::from(*osl)),
        StepKind::Distribution { isl, osl, .. } => Some(u64::from(isl.0) + u64::from(osl.0)),
        StepKind::Trace { .. } | StepKind::Dataset { .. } => None,
    }
}

/// Domain tag of the cancellation draws, so they never share a random stream with prompts.
const CANCEL_DOMAIN: u64 = 0x6361_6e63; // "canc"

/// Awaits every driver task of a step. At the step's drain deadline whatever is still in flight
/// is cut (it counts as `timeout`); the cut is a branch of this wait, not a task of its own, so
/// nothing of the step outlives it.
async fn join_drivers(ctx: &StepCtx, tasks: &mut JoinSet<()>) {
    let mut cut = std::pin::pin!(async {
        tokio::select! {
            _ = tokio::time::sleep_until(ctx.drain_end) => ctx.hard_stop.cancel(),
            _ = ctx.hard_stop.cancelled() => {}
        }
    });
    let mut cut_done = false;
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(Err(e)) if e.is_panic() => {
                    tracing::error!(step = %ctx.plan.name(), "a request task panicked: {e}");
                }
                Some(_) => {}
                None => break,
            },
            () = &mut cut, if !cut_done => cut_done = true,
        }
    }
}

impl Runner {
    /// The same runner (client, prompt learner, recorder) on other targets.
    pub fn with_targets(&self, targets: Vec<Arc<Target>>) -> Runner {
        Runner {
            targets,
            client: self.client.clone(),
            tokens: Arc::clone(&self.tokens),
            overhead: Arc::clone(&self.overhead),
            recorder: Arc::clone(&self.recorder),
            seed: self.seed,
            run_salt: self.run_salt,
            drain_grace: self.drain_grace,
            max_lag_p99: self.max_lag_p99,
            pairing: self.pairing,
            budget: Arc::clone(&self.budget),
            goodput: self.goodput,
            endpoints: Arc::clone(&self.endpoints),
        }
    }

    /// Learns the servers' prompt overhead (the chat template) before their first step, from two
    /// short probes of different lengths per target, so that even the first step's prompts are
    /// exact. Targets in `skip` (already calibrated) are left out; the others go at once, each
    /// probe bounded by [`CALIBRATION_TIMEOUT`], so a target that never answers delays the first
    /// step by that at most, never by its request timeout, and the others are not held back. A
    /// target that fails keeps learning from its steps' responses. Returns the names calibrated.
    pub async fn calibrate(
        &self,
        hard_stop: &CancellationToken,
        skip: &std::collections::HashSet<String>,
    ) -> Vec<String> {
        let builder = match PromptBuilder::new(
            Arc::clone(&self.tokens),
            PromptConfig::with_salt(self.run_salt),
        ) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot build calibration prompts");
                return Vec::new();
            }
        };
        let mut probes = JoinSet::new();
        for (t, target) in self.targets.iter().enumerate() {
            if skip.contains(&target.name) {
                continue;
            }
            let mut prompts = Vec::new();
            for (i, tokens) in [64usize, 512].into_iter().enumerate() {
                if let Ok(p) = builder.user_message(tokens, 0xca1, i as u64) {
                    prompts.push((i, tokens, p.text));
                }
            }
            let (target, client, overhead) = (
                Arc::clone(target),
                self.client.clone(),
                Arc::clone(&self.overhead),
            );
            let (hard, salt) = (hard_stop.clone(), self.run_salt);
            probes.spawn(async move {
                for (i, tokens, text) in prompts {
                    let req = StreamRequest {
                        request_id: format!("{:08x}-calibrate-{i}-t{t}", salt as u32),
                        prompt: as_prompt(target.endpoint.api(), text),
                        osl: 1,
                    };
                    let cut = async {
                        tokio::select! {
                            _ = hard.cancelled() => {}
                            _ = tokio::time::sleep(CALIBRATION_TIMEOUT) => {}
                        }
                    };
                    let rec = client
                        .send_until(&target.endpoint, &req, Instant::now(), cut)
                        .await;
                    if !rec.outcome.is_ok() {
                        tracing::warn!(target = %target.name, outcome = rec.outcome.as_str(), "calibration request failed; the target's prompts are corrected from its responses instead");
                        break;
                    }
                    learn_from(&overhead, &target.name, &rec, tokens);
                }
                if let Some(e) = overhead.estimate(&target.name) {
                    tracing::info!(target = %target.name, offset = e.offset, slope = e.slope, "prompt overhead learnt");
                }
                target.name.clone()
            });
        }
        let mut done = Vec::new();
        while let Some(joined) = probes.join_next().await {
            if let Ok(name) = joined {
                done.push(name);
            }
        }
        done
    }

    /// Runs `plan` against every target and returns the step results. `soft_stop` ends sending
    /// early (the drain still runs); `hard_stop` also cuts requests in flight. It asks the
    /// traffic budget nothing: `run`, `bench` and `bench --search` run their steps through a
    /// `Scheduler`, which admits each one first (`Runner::run_admitted`); this is the runner
    /// alone, for tests that drive one step.
    pub async fn run_step(
        self: &Arc<Self>,
        plan: &StepPlan,
        cycle: u64,
        soft_stop: &CancellationToken,
        hard_stop: &CancellationToken,
    ) -> Vec<StepResult> {
        let all: Vec<usize> = (0..self.targets.len()).collect();
        self.run_step_with(plan, cycle, &all, self.pairing, soft_stop, hard_stop)
            .await
    }

    /// Runs `plan` on the targets of `admission` (the budget's decision), paired as it says.
    pub async fn run_admitted(
        self: &Arc<Self>,
        plan: &StepPlan,
        cycle: u64,
        admission: &super::budget::Admission,
        soft_stop: &CancellationToken,
        hard_stop: &CancellationToken,
    ) -> Vec<StepResult> {
        let plan = StepPlan {
            rate: admission.rate,
            ..plan.clone()
        };
        self.run_step_with(
            &plan,
            cycle,
            &admission.targets,
            admission.pairing,
            soft_stop,
            hard_stop,
        )
        .await
    }

    async fn run_step_with(
        self: &Arc<Self>,
        plan: &StepPlan,
        cycle: u64,
        targets: &[usize],
        pairing: Pairing,
        soft_stop: &CancellationToken,
        hard_stop: &CancellationToken,
    ) -> Vec<StepResult> {
        match pairing {
            Pairing::Simultaneous => {
                self.run_step_on(plan, cycle, targets, soft_stop, hard_stop)
                    .await
            }
            Pairing::Sequential => {
                let mut results = Vec::new();
                for &t in targets {
                    if soft_stop.is_cancelled() {
                        break;
                    }
                    results.extend(
                        self.run_step_on(plan, cycle, &[t], soft_stop, hard_stop)
                            .await,
                    );
                }
                results
            }
        }
    }

    /// The prompt-overhead estimates of these endpoints now, by their overhead keys.
    fn estimates(
        &self,
        endpoints: &HashMap<usize, Arc<StepEndpoint>>,
    ) -> HashMap<String, OverheadEstimate> {
        endpoints
            .values()
            .filter_map(|e| {
                let key = &e.overhead_key;
                Some((key.clone(), self.overhead.estimate(key)?))
            })
            .collect()
    }

    /// Each of `targets`' endpoints for `plan`'s workload (built once per target and workload,
    /// [`EndpointCache`]). A target whose endpoint cannot be built (the config's check refuses
    /// what would fail here) is left out of the step, said once.
    fn step_endpoints(
        &self,
        plan: &StepPlan,
        targets: &[usize],
    ) -> HashMap<usize, Arc<StepEndpoint>> {
        targets
            .iter()
            .filter_map(|&t| {
                let target = &self.targets[t];
                match self.endpoints.get(target, plan.workload, &plan.request) {
                    Ok(e) => Some((t, e)),
                    Err(e) => {
                        tracing::error!(target = %target.name, step = %plan.name(), error = %e, "the workload's request options do not apply to the target; it sits the step out");
                        None
                    }
                }
            })
            .collect()
    }

    /// The prompt builder of `plan`'s KV blocks and prefix pool; `None` (logged) when it cannot
    /// be built, and the step is skipped.
    fn step_builder(&self, plan: &StepPlan) -> Option<PromptBuilder> {
        let (block_size, pool) = match &plan.kind {
            StepKind::Prefix {
                block_size,
                pool_size,
                ..
            } => (*block_size as usize, *pool_size as usize),
            _ => (crate::workload::prompt::DEFAULT_BLOCK_SIZE, 1),
        };
        match PromptBuilder::new(
            Arc::clone(&self.tokens),
            PromptConfig {
                block_size,
                prefix_pool_size: pool,
                run_salt: self.run_salt,
            },
        ) {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::error!(step = %plan.name(), error = %e, "cannot build prompts; step skipped");
                None
            }
        }
    }

    /// A prefix step's shared prefixes, sent once to each target before the step, so the steady
    /// window measures hits, not first fills.
    async fn warm_step_prefixes(
        &self,
        plan: &StepPlan,
        cycle: u64,
        targets: &[usize],
        builder: &PromptBuilder,
        endpoints: &HashMap<usize, Arc<StepEndpoint>>,
        hard_stop: &CancellationToken,
    ) {
        let StepKind::Prefix { ratio, isl, .. } = &plan.kind else {
            return;
        };
        let estimates = self.estimates(endpoints);
        let shared: Vec<(usize, usize)> = targets
            .iter()
            .map(|&t| {
                let estimate = estimates.get(&endpoints[&t].overhead_key).copied();
                let body = body_tokens(estimate, *isl as usize);
                let shared = builder.shared_prefix_tokens(*isl as usize, *ratio);
                (t, builder.prefix_len(body, shared))
            })
            .filter(|(_, shared)| *shared > 0)
            .collect();
        if !shared.is_empty() {
            self.warm_prefixes(builder, &shared, endpoints, cycle, plan, hard_stop)
                .await;
        }
    }

    /// Spawns target `t`'s drivers of the step onto `tasks`: its trace replay, its dataset's
    /// workers, its conversations, its open-loop arrivals or its closed-loop workers.
    fn spawn_drivers(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        ctx: &Arc<StepCtx>,
        t: usize,
        (replay, dataset): (Option<&Arc<super::replay::Replay>>, Option<&Arc<Dataset>>),
    ) {
        let plan = &ctx.plan;
        let target = Arc::clone(&self.targets[t]);
        match (&plan.kind, plan.rate) {
            (StepKind::Dataset { concurrency, .. }, _) => {
                for w in 0..u64::from(*concurrency) {
                    if let Some(d) = dataset {
                        tasks.spawn(Arc::clone(self).dataset_worker(
                            Arc::clone(ctx),
                            t,
                            Arc::clone(&target),
                            Arc::clone(d),
                            w,
                        ));
                    }
                }
            }
            (StepKind::Trace { .. }, _) => {
                if let Some(r) = replay {
                    tasks.spawn(Arc::clone(self).replay(Arc::clone(ctx), t, target, Arc::clone(r)));
                }
            }
            (StepKind::MultiTurn { conversations, .. }, _) => {
                for c in 0..u64::from(*conversations) {
                    tasks.spawn(Arc::clone(self).conversation_worker(
                        Arc::clone(ctx),
                        t,
                        Arc::clone(&target),
                        c,
                    ));
                }
            }
            (_, Some(rate)) => {
                tasks.spawn(Arc::clone(self).open_loop(
                    Arc::clone(ctx),
                    t,
                    Arc::clone(&target),
                    rate,
                ));
            }
            (_, None) => {
                for w in 0..u64::from(plan.concurrency()) {
                    tasks.spawn(Arc::clone(self).closed_worker(
                        Arc::clone(ctx),
                        t,
                        Arc::clone(&target),
                        w,
                    ));
                }
            }
        }
    }

    async fn run_step_on(
        self: &Arc<Self>,
        plan: &StepPlan,
        cycle: u64,
        targets: &[usize],
        soft_stop: &CancellationToken,
        hard_stop: &CancellationToken,
    ) -> Vec<StepResult> {
        let step_seed = derive_seed(
            self.seed,
            &[workload_code(plan.workload), plan.index as u64, cycle],
        );
        let endpoints = self.step_endpoints(plan, targets);
        let targets: Vec<usize> = targets
            .iter()
            .copied()
            .filter(|t| endpoints.contains_key(t))
            .collect();
        let targets = &targets[..];
        let Some(builder) = self.step_builder(plan) else {
            return Vec::new();
        };
        self.warm_step_prefixes(plan, cycle, targets, &builder, &endpoints, hard_stop)
            .await;
        // After the prefix warmup, which teaches the estimates too.
        let estimates = self.estimates(&endpoints);
        // A trace is read once per step, before its clock starts, and replayed alike to every
        // target.
        let replay = match super::replay::Replay::for_step(
            plan,
            cycle,
            self.seed,
            &self.tokens,
            self.run_salt,
        ) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(step = %plan.name(), error = %e, "cannot read the trace; step skipped");
                return Vec::new();
            }
        };
        // A dataset was read and measured once (by `check`'s validation, at start-up); a
        // changed file is read again here.
        let dataset = match plan.dataset(self.seed, &self.tokens).transpose() {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(step = %plan.name(), error = %e, "cannot read the dataset; step skipped");
                return Vec::new();
            }
        };
        self.prewarm(plan, targets).await;
        let t0 = Instant::now();
        let send_end = t0 + plan.warmup + plan.steady;
        let ctx = Arc::new(StepCtx {
            plan: plan.clone(),
            cycle,
            step_seed,
            builder,
            estimates,
            endpoints,
            start: t0,
            warmup_end: t0 + plan.warmup,
            send_end,
            drain_end: send_end + self.drain_grace,
            soft_stop: soft_stop.child_token(),
            hard_stop: hard_stop.child_token(),
            arrivals: Mutex::new(HashMap::new()),
        });
        let started_unix = unix_now();
        let mut tasks = JoinSet::new();
        for &t in targets {
            self.spawn_drivers(&mut tasks, &ctx, t, (replay.as_ref(), dataset.as_ref()));
        }
        join_drivers(&ctx, &mut tasks).await;
        let ended_unix = unix_now();
        // The steady window is what was scheduled, or less when shutdown cut it short.
        let steady_end = Instant::now().min(send_end);
        let steady = steady_end.saturating_duration_since(ctx.warmup_end);
        let arrivals =
            std::mem::take(&mut *ctx.arrivals.lock().unwrap_or_else(PoisonError::into_inner));
        self.results(
            plan,
            cycle,
            targets,
            steady,
            &arrivals,
            (started_unix, ended_unix),
        )
    }

    fn results(
        &self,
        plan: &StepPlan,
        cycle: u64,
        targets: &[usize],
        steady: Duration,
        arrivals: &HashMap<usize, Arrivals>,
        (started_unix, ended_unix): (f64, f64),
    ) -> Vec<StepResult> {
        let accs = self.recorder.take_step();
        let mut connections = self.recorder.take_connections();
        let mut out = Vec::new();
        for &t in targets {
            let target = &self.targets[t];
            let opened = connections.remove(&t).and_then(StepConnections::of);
            let mut mine: Vec<(&RequestLabels, &StepAccumulator)> = accs
                .iter()
                .filter(|((ti, _), _)| *ti == t)
                .map(|((_, l), a)| (l, a))
                .collect();
            mine.sort_by(|a, b| (&a.0.turn, &a.0.isl_bucket).cmp(&(&b.0.turn, &b.0.isl_bucket)));
            let make = |labels: RequestLabels, acc: &StepAccumulator, total: bool| StepResult {
                cycle,
                step: plan.name(),
                labels,
                total,
                started_unix,
                ended_unix,
                steady_seconds: steady.as_secs_f64(),
                measurements: {
                    let mut m = acc.finish(steady, target.cost_per_hour_usd, self.max_lag_p99);
                    // Closed-loop workers back off after a failure, so a target that is down for
                    // part of the window sends few requests and the error ratio understates the
                    // damage: at least one failure per worker also marks the step.
                    let workers = u64::from(plan.concurrency());
                    m.faulted |= plan.rate.is_none()
                        && m.errors >= workers
                        && m.error_ratio > FAULTED_ERROR_RATIO_WITH_BACKOFF;
                    // Saturation is the target's, over all of its arrivals: every label set of
                    // the step carries it.
                    if let Some(a) = arrivals.get(&t) {
                        m.arrivals = Some(a.summary());
                        m.saturated = a.saturated();
                    }
                    m
                },
                server: None,
                connections: opened,
            };
            let several = mine.len() > 1;
            let mut total = StepAccumulator::default();
            for (labels, acc) in &mine {
                total.merge(acc);
                if acc.requests() > 0 || acc.skipped() > 0 {
                    out.push(make((*labels).clone(), acc, false));
                }
            }
            // Once per step and target, not per request.
            if total.skipped() > 0 {
                tracing::warn!(
                    target = %target.name,
                    step = %plan.name(),
                    skipped = total.skipped(),
                    bound = ?target.max_context_tokens,
                    "requests above the target's context length were skipped, not sent"
                );
            }
            if several || mine.is_empty() {
                out.push(make(plan.labels(&target.name, target.mode), &total, true));
            }
        }
        out
    }

    pub(super) fn build(
        &self,
        ctx: &StepCtx,
        t: usize,
        worker: u64,
        k: u64,
        sampler: Option<&mut (LengthSampler, LengthSampler)>,
    ) -> Option<Built> {
        let index = (worker << 32) | (k & 0xffff_ffff);
        let (isl, osl, shared) = match &ctx.plan.kind {
            StepKind::Sweep { isl, osl, .. } => (*isl, *osl, 0),
            StepKind::Prefix {
                ratio, isl, osl, ..
            } => (
                *isl,
                *osl,
                ctx.builder.shared_prefix_tokens(*isl as usize, *ratio),
            ),
            StepKind::Distribution { .. } => {
                let (isl_s, osl_s) = sampler?;
                (isl_s.sample() as u32, osl_s.sample() as u32, 0)
            }
            StepKind::MultiTurn { .. } | StepKind::Trace { .. } | StepKind::Dataset { .. } => {
                return None;
            }
        };
        let body = body_tokens(ctx.estimate(t), isl as usize);
        match ctx.builder.build(&PromptRequest {
            tokens: body,
            shared_prefix_tokens: shared,
            stream: ctx.step_seed,
            index,
        }) {
            Ok(p) => Some(Built {
                shared_prefix_tokens: if p.prefix_tokens > 0 {
                    reusable_tokens(shared, isl as usize, ctx.builder.config().block_size)
                } else {
                    0
                },
                prompt: as_prompt(ctx.endpoint(t).endpoint.api(), p.text),
                osl,
                body_tokens: body,
                isl,
            }),
            Err(e) => {
                tracing::error!(error = %e, "cannot build a prompt");
                None
            }
        }
    }

    /// Sends `req` once the traffic budget grants it, and records it; `None` when the budget's
    /// hour is spent or the step stopped while the send waited for the budget's pace. `slot_at`:
    /// when an open-loop arrival got its in-flight slot; `isl`: the prompt tokens counted for it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn send_and_record(
        &self,
        ctx: &StepCtx,
        t: usize,
        req: StreamRequest,
        isl: u32,
        intended: Instant,
        slot_at: Option<Instant>,
        labels: &RequestLabels,
        shared_prefix_tokens: u64,
        cancel: Option<Cancel>,
    ) -> Option<RequestRecord> {
        let target = &self.targets[t];
        let grant = tokio::select! {
            grant = self.budget.acquire(&target.name, req.osl) => grant?,
            _ = ctx.soft_stop.cancelled() => return None,
        };
        if grant.at >= ctx.send_end {
            return None;
        }
        // A send the budget held back is intended when the budget lets it go: the wait is the
        // canary's own pacing, not the server's latency.
        let intended = if grant.waited {
            intended.max(grant.at)
        } else {
            intended
        };
        // A warmup request counts in no result: once the step stops sending it is not waited
        // for (as soon as it streams), so a step ends with its steady requests. A compressed
        // plan's steps are shorter than the simulated requests, and each drained its warmup's.
        let cancel = if intended < ctx.warmup_end {
            cancel.or(Some(Cancel::OnceStreamingAt(ctx.send_end)))
        } else {
            cancel
        };
        let _inflight = self.recorder.in_flight(&target.name);
        let mut rec = self
            .client
            .send_cancelling(
                &ctx.endpoint(t).endpoint,
                &req,
                intended,
                ctx.hard_stop.cancelled(),
                cancel,
                ctx.plan.streams(target),
            )
            .await;
        rec.slot_at = slot_at;
        grant.settle(rec.billable_tokens());
        self.recorder.record(
            &RecordContext {
                target_index: t,
                labels,
                phase: ctx.phase(intended, &rec),
                isl,
                osl: req.osl,
                shared_prefix_tokens,
                request: &req,
                goodput: target.goodput.unwrap_or(self.goodput),
            },
            &rec,
        );
        Some(rec)
    }

    /// Whether a request of `prompt_tokens` asking for `osl` tokens is above target `t`'s
    /// context bound: then it is counted as skipped (reason `context_length`), never sent, and
    /// this returns true.
    pub(super) fn skip_too_long(
        &self,
        t: usize,
        labels: &RequestLabels,
        prompt_tokens: u64,
        osl: u32,
    ) -> bool {
        if self.targets[t].fits(prompt_tokens, u64::from(osl)) {
            return false;
        }
        self.recorder.skipped(t, labels, SKIP_CONTEXT_LENGTH);
        true
    }

    /// Whether request `k` of `worker` is one the client abandons, and where: drawn from the step
    /// seed, so every target of the step abandons the same requests.
    pub(super) fn cancel_for(&self, ctx: &StepCtx, worker: u64, k: u64) -> Option<Cancel> {
        let plan = ctx.plan.cancel?;
        let draw = derive_seed(ctx.step_seed, &[CANCEL_DOMAIN, worker, k]);
        // The top 53 bits as a uniform number in [0, 1).
        let u = (draw >> 11) as f64 / (1u64 << 53) as f64;
        (u < plan.share).then(|| plan.point())
    }

    pub(super) fn labels_for(
        &self,
        ctx: &StepCtx,
        base: &RequestLabels,
        built: &Built,
    ) -> RequestLabels {
        if matches!(ctx.plan.kind, StepKind::Distribution { .. }) {
            let mut l = base.clone();
            l.isl_bucket = isl_bucket(built.isl as usize);
            l
        } else {
            base.clone()
        }
    }

    /// Teaches `target`'s overhead estimate from a successful response's reported prompt length.
    pub(super) fn learn(&self, target: &str, rec: &RequestRecord, body_tokens: usize) {
        learn_from(&self.overhead, target, rec, body_tokens);
    }
}

fn learn_from(overhead: &OverheadLearner, target: &str, rec: &RequestRecord, body_tokens: usize) {
    if rec.outcome.is_ok()
        && let Some(p) = rec.prompt_tokens()
        && !overhead.observe(target, body_tokens, p)
    {
        tracing::debug!(
            target,
            requested = body_tokens,
            reported = p,
            "implausible usage.prompt_tokens not learnt from"
        );
    }
}

/// The prompt tokens a prefix cache can serve for a request with `shared` shared tokens of
/// `isl`: whole blocks only, and never the last prompt token, which an engine must compute to
/// produce the first output token (vLLM and the simulator both recompute it). This is the
/// expected hit ratio's numerator: at ISL 1024 and block 64 a "100 %" prefix yields 960.
pub(super) fn reusable_tokens(shared: usize, isl: usize, block: usize) -> u64 {
    let usable = shared.min(isl.saturating_sub(1));
    (usable / block * block) as u64
}

fn workload_code(w: &str) -> u64 {
    crate::config::WORKLOAD_NAMES
        .iter()
        .position(|n| *n == w)
        .unwrap_or(9) as u64
}
