//! The trace-replay driver (docs/METRICS.md, "Trace replay"): one trace's rows sent open loop at
//! their timestamps divided by `speed`, the trace looped back to back while the step sends, each
//! session's later turns sent after the previous turn's reply, and every target sent the same
//! rows at the same instants with byte-identical prompts. Every pass of the loop (and every
//! cycle) writes its blocks afresh, so each pass shows the reuse the trace recorded, not hits on
//! the previous pass's prompts.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::context::{Runner, StepCtx, as_prompt};
use super::plan::{StepKind, StepPlan};
use super::target::Target;
use crate::client::StreamRequest;
use crate::workload::prompt::{PromptError, body_tokens};
use crate::workload::sampler::derive_seed;
use crate::workload::tokenizer::TokenModel;
use crate::workload::trace::{BlockPrompts, Trace, TraceError};

/// Why a trace step cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("cannot build the trace's prompts: {0}")]
    Prompt(#[from] PromptError),
}

/// Passes whose prompt blocks are kept: the targets' drivers run on one clock, so they are at
/// most a pass apart, and a session may still send a turn of an earlier pass.
const KEPT_PASSES: usize = 4;

/// A trace as one step replays it, shared by every target's driver.
pub(super) struct Replay {
    trace: Trace,
    /// The block texts of the latest passes, by pass.
    prompts: Mutex<VecDeque<(u64, Arc<BlockPrompts>)>>,
    tokens: Arc<TokenModel>,
    /// The salt of this step's blocks: the run's, the cycle's.
    salt: u64,
    /// Rows the clock sends in each pass (the first turns and the rows without a session).
    per_pass: usize,
    speed: f64,
    max_inflight: u32,
    /// Each row's next turn in its session.
    next: Vec<Option<usize>>,
    /// Rows that follow an earlier turn of their session: sent by that session, not the clock.
    follows: Vec<bool>,
    /// Each row's tokens an infinite prefix cache could serve (every pass writes its blocks
    /// afresh, so every pass can hit the same): the step's expected hit ratio.
    hits: Vec<u64>,
}

impl Replay {
    /// The trace of a `trace_replay` step, sampled and truncated as configured (the same sample
    /// every cycle: `seed` is the config's); `None` for other steps.
    pub(super) fn for_step(
        plan: &StepPlan,
        cycle: u64,
        seed: u64,
        tokens: &Arc<TokenModel>,
        run_salt: u64,
    ) -> Result<Option<Arc<Replay>>, ReplayError> {
        let (
            StepKind::Trace {
                speed,
                max_inflight,
                ..
            },
            Some(trace),
        ) = (&plan.kind, plan.trace(seed))
        else {
            return Ok(None);
        };
        let trace = trace?;
        for gap in &trace.quiet_gaps {
            tracing::warn!(step = %plan.name(), "trace: {gap}");
        }
        let next = trace.session_successors();
        let mut follows = vec![false; trace.rows.len()];
        for &n in next.iter().flatten() {
            follows[n] = true;
        }
        let per_pass = trace.rows.iter().filter(|r| r.at.is_some()).count().max(1);
        let hits = trace.expected_hits();
        let replay = Replay {
            salt: derive_seed(run_salt, &[PASS_DOMAIN, cycle]),
            trace,
            prompts: Mutex::new(VecDeque::new()),
            tokens: Arc::clone(tokens),
            per_pass,
            speed: *speed,
            max_inflight: *max_inflight,
            next,
            follows,
            hits,
        };
        // The first pass's blocks, which also checks the block size once.
        replay.prompts_of(0)?;
        Ok(Some(Arc::new(replay)))
    }

    /// The block texts of pass `pass`: the same for every target, new for every pass.
    fn prompts_of(&self, pass: u64) -> Result<Arc<BlockPrompts>, PromptError> {
        let mut kept = self.prompts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, p)) = kept.iter().find(|(n, _)| *n == pass) {
            return Ok(Arc::clone(p));
        }
        let p = Arc::new(BlockPrompts::new(
            Arc::clone(&self.tokens),
            self.trace.block_size as usize,
            derive_seed(self.salt, &[pass]),
        )?);
        if kept.len() >= KEPT_PASSES {
            kept.pop_front();
        }
        kept.push_back((pass, Arc::clone(&p)));
        Ok(p)
    }
}

/// Domain tag of the per-pass block salts.
const PASS_DOMAIN: u64 = 0x7061_7373; // "pass"

impl Runner {
    /// Replays `replay` to target `t` until the step stops sending. A row's latency counts from
    /// its timestamp (or, for a later turn, from the end of the previous reply plus its delay),
    /// also while it waits for one of the `max_inflight` slots.
    pub(super) async fn replay(
        self: Arc<Self>,
        ctx: Arc<StepCtx>,
        t: usize,
        target: Arc<Target>,
        replay: Arc<Replay>,
    ) {
        let start = ctx.warmup_end - ctx.plan.warmup;
        let slots = Arc::new(Semaphore::new(replay.max_inflight as usize));
        let mut tasks = JoinSet::new();
        for (k, (offset, row)) in replay.trace.replay_offsets(replay.speed).enumerate() {
            let intended = start + offset;
            if intended >= ctx.send_end {
                break;
            }
            if replay.follows[row] {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(intended) => {}
                _ = ctx.soft_stop.cancelled() => break,
            }
            let Some(permit) = slot(&slots, &ctx).await else {
                break;
            };
            // The pass's origin: a later turn with its own timestamp is not sent before it.
            let origin =
                intended - at_speed(replay.trace.rows[row].at.unwrap_or_default(), &replay);
            let prompts = match replay.prompts_of((k / replay.per_pass) as u64) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "cannot build trace prompts");
                    break;
                }
            };
            let session = Session {
                prompts,
                runner: Arc::clone(&self),
                ctx: Arc::clone(&ctx),
                target: Arc::clone(&target),
                replay: Arc::clone(&replay),
                slots: Arc::clone(&slots),
                t,
                k: k as u64,
                origin,
            };
            tasks.spawn(session.run(row, intended, permit));
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// A row's duration at the replay's speed.
fn at_speed(d: std::time::Duration, replay: &Replay) -> std::time::Duration {
    d.div_f64(replay.speed)
}

/// One of the step's in-flight slots, or `None` when sending ended (or stopped) first.
async fn slot(slots: &Arc<Semaphore>, ctx: &StepCtx) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        permit = Arc::clone(slots).acquire_owned() => permit.ok(),
        _ = tokio::time::sleep_until(ctx.send_end) => None,
        _ = ctx.soft_stop.cancelled() => None,
    }
}

/// A row sent by the clock, and the later turns of its session.
struct Session {
    /// The block texts of the pass the session started in.
    prompts: Arc<BlockPrompts>,
    runner: Arc<Runner>,
    ctx: Arc<StepCtx>,
    target: Arc<Target>,
    replay: Arc<Replay>,
    slots: Arc<Semaphore>,
    t: usize,
    /// The clock's row count: with the turn, the request's id (alike on every target).
    k: u64,
    origin: Instant,
}

impl Session {
    async fn run(self, mut row: usize, mut intended: Instant, permit: OwnedSemaphorePermit) {
        let (ctx, replay) = (&self.ctx, &self.replay);
        let labels = ctx.base_labels(&self.target);
        let mut permit = Some(permit);
        let mut turn = 1u64;
        loop {
            let r = &replay.trace.rows[row];
            // A row above the bound is skipped, and ends its session: a later turn holds more.
            if self.runner.skip_too_long(
                self.t,
                &labels,
                u64::from(r.input_length),
                r.output_length.max(1),
            ) {
                return;
            }
            let estimate = ctx.estimate(self.t);
            let body = body_tokens(estimate, r.input_length as usize);
            let prompt = match self.prompts.prompt(r, body, row as u64) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "cannot build a trace prompt");
                    return;
                }
            };
            if permit.is_none() {
                permit = slot(&self.slots, ctx).await;
                if permit.is_none() {
                    return;
                }
            }
            let slot_at = Instant::now();
            let req = StreamRequest {
                request_id: ctx.request_id(self.runner.run_salt, self.t, self.k, turn),
                prompt: as_prompt(ctx.endpoint(self.t).endpoint.api(), prompt.text),
                osl: r.output_length.max(1),
            };
            let hits = replay.hits[row];
            let rec = self
                .runner
                .send_and_record(
                    ctx,
                    self.t,
                    req,
                    r.input_length,
                    intended,
                    Some(slot_at),
                    &labels,
                    hits,
                    None,
                )
                .await;
            // The slot is held while the request is in flight, not while the user thinks.
            permit = None;
            let Some(rec) = rec else {
                return;
            };
            self.runner
                .learn(&ctx.endpoint(self.t).overhead_key, &rec, body);
            // A failed turn ends its session, as it would for a user.
            let Some(next) = replay.next[row].filter(|_| rec.outcome.is_ok()) else {
                return;
            };
            let n = &replay.trace.rows[next];
            let after_reply = rec.end + at_speed(n.delay, replay);
            intended = match n.at {
                Some(at) => after_reply.max(self.origin + at_speed(at, replay)),
                None => after_reply,
            };
            if intended >= ctx.send_end {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(intended) => {}
                _ = ctx.soft_stop.cancelled() => return,
            }
            row = next;
            turn += 1;
        }
    }
}
