//! The three ways a step sends to a target (and the unmeasured prefix warmup before a
//! prefix-cache step): closed-loop workers (each sends when its previous
//! request ends, backing off after a failure), open-loop arrivals on a schedule of intended
//! send instants (counting, for the saturation verdict, what was intended, sent and answered),
//! and multi-turn conversations that resend their whole history every turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::plan::{StepKind, StepPlan};
use crate::client::{ChatMessage, Outcome, Prompt, Role, StreamRequest};
use crate::config::Api;
use crate::measure::arrivals::Arrivals;
use crate::workload::sampler::{
    ArrivalProcess, ArrivalSchedule, LengthDistribution, LengthSampler, derive_seed,
};

use super::context::{Runner, StepCtx, StepEndpoint, as_prompt};
use super::runner::{CALIBRATION_TIMEOUT, ERROR_BACKOFF_MAX, ERROR_BACKOFF_MIN, fewest_tokens};
use super::target::Target;
use crate::workload::prompt::PromptBuilder;
use tokio_util::sync::CancellationToken;

/// After a failed request a closed-loop worker waits (doubling up to [`ERROR_BACKOFF_MAX`], never
/// past the end of sending): a failing target answers at once (refused, 503), and N workers
/// spinning against it would starve the other targets' measurements of CPU. A success resets it.
pub(super) async fn back_off(ctx: &StepCtx, backoff: &mut Duration, ok: bool) {
    if ok {
        *backoff = Duration::ZERO;
        return;
    }
    *backoff = (*backoff * 2).clamp(ERROR_BACKOFF_MIN, ERROR_BACKOFF_MAX);
    let until = (Instant::now() + *backoff).min(ctx.send_end);
    tokio::select! {
        _ = tokio::time::sleep_until(until) => {}
        _ = ctx.soft_stop.cancelled() => {}
    }
}

/// Connections a step opens at a time before its clock starts: a server's accept queue (Linux's
/// default backlog is 4096, tokio's listeners ask for 1024) takes a ramp of this size without
/// dropping a SYN, whose retry would cost a second.
const PREWARM_RAMP: usize = 64;

/// A closed-loop step's workers send their first requests this many a millisecond, each
/// measured from its own start. N requests written in the same instant queue in the server's
/// read path, and a closed loop against a regular server keeps them in step, completion for
/// completion, for the whole step: at 1024 workers on 2 cores, all at once, their transit to
/// the server reached a p99 of 9 ms in the first second (docs/PERFORMANCE.md). 1024 workers
/// start over 128 ms.
pub(super) const FIRST_SENDS_PER_MS: u64 = 8;

impl Runner {
    /// Before a closed-loop step's clock starts, opens every target's connections for its
    /// workers, ramped, so its first requests measure the server and not a connection storm.
    /// The connect times are the server's own figure, recorded per target.
    pub(super) async fn prewarm(&self, plan: &StepPlan, targets: &[usize]) {
        if plan.rate.is_some() || matches!(plan.kind, StepKind::Trace { .. }) {
            // Open-loop arrivals ramp up by themselves.
            return;
        }
        let n = plan.concurrency() as usize;
        let warm = targets.iter().map(|&t| async move {
            let target = &self.targets[t];
            let done = self.client.prewarm(&target.endpoint, n, PREWARM_RAMP).await;
            (t, target, done)
        });
        for (t, target, done) in futures_util::future::join_all(warm).await {
            for &took in &done.connect_times {
                self.recorder.connected(t, &target.name, took);
            }
            // The times themselves are in the step's `connections` and the connect histogram.
            if let Some(error) = &done.error {
                // Debug: a target that is down says so in every request's outcome already.
                tracing::debug!(
                    target = %target.name,
                    step = %plan.name(),
                    opened = done.opened,
                    error = %error,
                    "not every connection could be opened before the step; its requests will try again"
                );
            }
        }
    }

    /// Sends each shared prefix of the pool once per target (not measured), so the step measures
    /// cache hits rather than the first fill.
    /// `shared`: each target's index and its shared prefix length. Each prompt is bounded by
    /// [`CALIBRATION_TIMEOUT`], so a target that stopped answering delays the step by that at most.
    pub(super) async fn warm_prefixes(
        &self,
        builder: &PromptBuilder,
        shared: &[(usize, usize)],
        endpoints: &HashMap<usize, Arc<StepEndpoint>>,
        cycle: u64,
        plan: &StepPlan,
        hard_stop: &CancellationToken,
    ) {
        let mut tasks = JoinSet::new();
        for &(t, shared) in shared {
            let prompts = match builder.warmup_prompts(shared) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot build the prefix warmup prompts");
                    return;
                }
            };
            let target = Arc::clone(&self.targets[t]);
            let endpoint = endpoints[&t].endpoint.clone();
            let client = self.client.clone();
            let hard = hard_stop.clone();
            let id_base = format!("{:08x}-{cycle}-warm{}", self.run_salt as u32, plan.index);
            tasks.spawn(async move {
                for (i, p) in prompts.into_iter().enumerate() {
                    let req = StreamRequest {
                        request_id: format!("{id_base}-{i}-t{t}"),
                        prompt: as_prompt(endpoint.api(), p.text),
                        osl: 1,
                    };
                    let cut = async {
                        tokio::select! {
                            _ = hard.cancelled() => {}
                            _ = tokio::time::sleep(CALIBRATION_TIMEOUT) => {}
                        }
                    };
                    let rec = client.send_until(&endpoint, &req, Instant::now(), cut).await;
                    if !rec.outcome.is_ok() {
                        tracing::warn!(target = %target.name, outcome = rec.outcome.as_str(), "prefix warmup request failed");
                        break;
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }

    /// A distribution step's ISL and OSL samplers for `worker` (`None` for other steps).
    fn samplers(&self, ctx: &StepCtx, worker: u64) -> Option<(LengthSampler, LengthSampler)> {
        let StepKind::Distribution {
            distribution,
            isl,
            osl,
            zipf_exponent,
            lognormal_isl_median,
            lognormal_osl_median,
            lognormal_sigma,
            ..
        } = &ctx.plan.kind
        else {
            return None;
        };
        let shape = |median: Option<f64>| match distribution {
            crate::config::DistributionKind::Uniform => LengthDistribution::Uniform,
            crate::config::DistributionKind::Zipf => LengthDistribution::Zipf {
                exponent: *zipf_exponent,
            },
            crate::config::DistributionKind::Lognormal => LengthDistribution::LogNormal {
                median,
                sigma: *lognormal_sigma,
            },
        };
        let seed = derive_seed(ctx.step_seed, &[worker]);
        let i = LengthSampler::new(
            shape(*lognormal_isl_median),
            isl.0 as usize,
            isl.1 as usize,
            derive_seed(seed, &[1]),
        )
        .ok()?;
        let o = LengthSampler::new(
            shape(*lognormal_osl_median),
            osl.0 as usize,
            osl.1 as usize,
            derive_seed(seed, &[2]),
        )
        .ok()?;
        Some((i, o))
    }

    pub(super) async fn closed_worker(
        self: Arc<Self>,
        ctx: Arc<StepCtx>,
        t: usize,
        target: Arc<Target>,
        worker: u64,
    ) {
        let base = ctx.base_labels(&target);
        let mut samplers = self.samplers(&ctx, worker);
        let mut k = 0u64;
        let mut backoff = Duration::ZERO;
        let ramp = Duration::from_millis(worker / FIRST_SENDS_PER_MS);
        if !ramp.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep_until((ctx.start + ramp).min(ctx.send_end)) => {}
                _ = ctx.soft_stop.cancelled() => {}
            }
        }
        while ctx.sending() {
            let Some(built) = self.build(&ctx, t, worker, k, samplers.as_mut()) else {
                return;
            };
            let labels = self.labels_for(&ctx, &base, &built);
            if self.skip_too_long(t, &labels, u64::from(built.isl), built.osl) {
                // No later request can fit either when the step's shortest one does not: the
                // worker ends rather than count the same skip as fast as it can build them.
                if !target.fits(fewest_tokens(&ctx.plan).unwrap_or(0), 0) {
                    return;
                }
                k += 1;
                tokio::task::yield_now().await;
                continue;
            }
            let req = StreamRequest {
                request_id: ctx.request_id(self.run_salt, t, worker, k),
                prompt: built.prompt,
                osl: built.osl,
            };
            let cancel = self.cancel_for(&ctx, worker, k);
            // Closed loop: the worker sends as soon as its previous request ends, so the intended
            // instant is now.
            let Some(rec) = self
                .send_and_record(
                    &ctx,
                    t,
                    req,
                    built.isl,
                    Instant::now(),
                    None,
                    &labels,
                    built.shared_prefix_tokens,
                    cancel,
                )
                .await
            else {
                return;
            };
            self.learn(&ctx.endpoint(t).overhead_key, &rec, built.body_tokens);
            k += 1;
            back_off(&ctx, &mut backoff, !rec.outcome.is_error()).await;
        }
    }

    pub(super) async fn open_loop(
        self: Arc<Self>,
        ctx: Arc<StepCtx>,
        t: usize,
        target: Arc<Target>,
        rate: super::plan::RatePlan,
    ) {
        let process = if rate.poisson {
            ArrivalProcess::Poisson { rate: rate.rps }
        } else {
            ArrivalProcess::Constant { rate: rate.rps }
        };
        let start = ctx.warmup_end - ctx.plan.warmup;
        let Ok(schedule) =
            ArrivalSchedule::new(process, start, derive_seed(ctx.step_seed, &[0xa11]))
        else {
            return;
        };
        let slots = Arc::new(Semaphore::new(rate.max_inflight as usize));
        let base = ctx.base_labels(&target);
        let mut samplers = self.samplers(&ctx, 0);
        let mut tasks = JoinSet::new();
        let window = ctx.send_end.saturating_duration_since(ctx.warmup_end);
        let arrivals = Arc::new(Mutex::new(Arrivals::new(window.as_secs_f64())));
        let mut schedule = schedule.enumerate();
        while let Some((k, intended)) = schedule.next() {
            if intended >= ctx.send_end {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(intended) => {}
                _ = ctx.soft_stop.cancelled() => break,
            }
            // Built even when no slot is free, so the sequence stays identical across targets.
            let Some(built) = self.build(&ctx, t, 0, k as u64, samplers.as_mut()) else {
                break;
            };
            let labels = self.labels_for(&ctx, &base, &built);
            // A skipped arrival is never sent: it is not one of the arrivals the server is
            // judged on either.
            if self.skip_too_long(t, &labels, u64::from(built.isl), built.osl) {
                continue;
            }
            let at = window_offset(&ctx, intended);
            count(&arrivals, |a| a.intended(at));
            // Waiting for a slot does not move the intended instant: the wait is latency, and the
            // client-side queue time that shows a server falling behind (saturation).
            let permit = tokio::select! {
                permit = Arc::clone(&slots).acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = tokio::time::sleep_until(ctx.send_end) => {
                    // Sending ended with every slot still busy: this arrival and the window's
                    // remaining ones were never sent, and count as such.
                    for (_, later) in schedule.by_ref() {
                        if later >= ctx.send_end {
                            break;
                        }
                        let at = window_offset(&ctx, later);
                        count(&arrivals, |a| a.intended(at));
                    }
                    break;
                }
                _ = ctx.soft_stop.cancelled() => break,
            };
            let slot_at = Instant::now();
            count(&arrivals, |a| a.sent(at));
            let req = StreamRequest {
                request_id: ctx.request_id(self.run_salt, t, 0, k as u64),
                prompt: built.prompt,
                osl: built.osl,
            };
            let cancel = self.cancel_for(&ctx, 0, k as u64);
            let this = Arc::clone(&self);
            let ctx = Arc::clone(&ctx);
            let name = ctx.endpoint(t).overhead_key.clone();
            let arrivals = Arc::clone(&arrivals);
            tasks.spawn(async move {
                if let Some(rec) = this
                    .send_and_record(
                        &ctx,
                        t,
                        req,
                        built.isl,
                        intended,
                        Some(slot_at),
                        &labels,
                        built.shared_prefix_tokens,
                        cancel,
                    )
                    .await
                {
                    match rec.ttft() {
                        Some(ttft) => count(&arrivals, |a| a.first_token(at, ttft.as_secs_f64())),
                        None if rec.outcome == Outcome::Timeout => {
                            count(&arrivals, |a| a.unanswered(at));
                        }
                        None => {}
                    }
                    this.learn(&name, &rec, built.body_tokens);
                }
                drop(permit);
            });
        }
        while tasks.join_next().await.is_some() {}
        let arrivals = arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        ctx.arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(t, arrivals);
    }

    pub(super) async fn conversation_worker(
        self: Arc<Self>,
        ctx: Arc<StepCtx>,
        t: usize,
        target: Arc<Target>,
        slot: u64,
    ) {
        let StepKind::MultiTurn {
            conversations,
            turns,
            isl,
            osl,
            think_time,
        } = ctx.plan.kind.clone()
        else {
            return;
        };
        let base = ctx.base_labels(&target);
        let mut round = 0u64;
        let mut backoff = Duration::ZERO;
        while ctx.sending() {
            let conversation = slot + round * u64::from(conversations);
            round += 1;
            let stream = derive_seed(ctx.step_seed, &[conversation]);
            let mut history: Vec<ChatMessage> = Vec::new();
            let mut started: Option<Instant> = None;
            let mut last_token: Option<Instant> = None;
            let mut complete = true;
            for turn in 1..=turns {
                if !ctx.sending() {
                    complete = false;
                    break;
                }
                // The turn's prompt: its user messages of `isl` and the replies of `osl` so far.
                let prompt_tokens =
                    u64::from(turn) * u64::from(isl) + u64::from(turn - 1) * u64::from(osl);
                let labels = base.clone().with_turn(turn);
                if self.skip_too_long(t, &labels, prompt_tokens, osl) {
                    // The conversation ends at its first turn above the bound; when that is its
                    // first, every conversation would, and the worker ends.
                    if turn == 1 {
                        return;
                    }
                    complete = false;
                    break;
                }
                let user = match ctx
                    .builder
                    .user_message(isl as usize, stream, u64::from(turn))
                {
                    Ok(p) => p.text,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot build a user message");
                        return;
                    }
                };
                history.push(ChatMessage::new(Role::User, user));
                let prompt = match ctx.endpoint(t).endpoint.api() {
                    Api::Chat => Prompt::Chat(history.clone()),
                    Api::Completions => Prompt::Text(flatten(&history)),
                };
                let req = StreamRequest {
                    request_id: ctx.request_id(self.run_salt, t, conversation, u64::from(turn)),
                    prompt,
                    osl,
                };
                let intended = Instant::now();
                started.get_or_insert(intended);
                let Some(rec) = self
                    .send_and_record(
                        &ctx,
                        t,
                        req,
                        u32::try_from(prompt_tokens).unwrap_or(u32::MAX),
                        intended,
                        None,
                        &labels,
                        0,
                        None,
                    )
                    .await
                else {
                    complete = false;
                    break;
                };
                back_off(&ctx, &mut backoff, rec.outcome.is_ok()).await;
                if !rec.outcome.is_ok() {
                    complete = false;
                    break;
                }
                last_token = rec.last_token_at().or(Some(rec.end));
                // The next turn carries the assistant's actual reply.
                history.push(ChatMessage::new(Role::Assistant, rec.reply));
                if !think_time.is_zero() && turn < turns {
                    tokio::select! {
                        _ = tokio::time::sleep(think_time) => {}
                        _ = ctx.soft_stop.cancelled() => { complete = false; break; }
                    }
                }
            }
            if complete
                && let (Some(s), Some(e)) = (started, last_token)
                && s >= ctx.warmup_end
            {
                self.recorder.record_conversation(
                    t,
                    &base,
                    e.saturating_duration_since(s).as_secs_f64(),
                );
            }
        }
    }
}

/// Seconds from the start of the step's steady window to `at` (negative in the warmup).
fn window_offset(ctx: &StepCtx, at: Instant) -> f64 {
    if at >= ctx.warmup_end {
        at.duration_since(ctx.warmup_end).as_secs_f64()
    } else {
        -ctx.warmup_end.duration_since(at).as_secs_f64()
    }
}

/// Counts into a step's arrivals, shared by the arrival loop and its requests.
fn count(arrivals: &Mutex<Arrivals>, f: impl FnOnce(&mut Arrivals)) {
    f(&mut arrivals.lock().unwrap_or_else(PoisonError::into_inner));
}

/// A conversation as one completions prompt: its messages' texts, a line each.
pub(super) fn flatten(history: &[ChatMessage]) -> String {
    let mut s = String::new();
    for m in history {
        s.push_str(&m.content);
        s.push('\n');
    }
    s
}
