//! One simulated worker's engine loop, pass by pass: a token budget per pass, a cap on running
//! sequences, chunked prefill, running sequences first, FCFS admission, LIFO preemption with
//! recompute when KV blocks run out, and pass times on absolute deadlines.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::kv::{KvCache, KvCounters, PrefixMatch, TierConfig, chain_hash};
use super::profile::{PassShape, Timing};
use super::text;
use super::variability::Speed;

/// What a worker does in its deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerRole {
    /// Prefill and decode (aggregated serving).
    Aggregated,
    /// Prefill only; finished prefills are handed to a decode worker.
    Prefill,
    /// Decode only; sequences arrive with their prompt KV transferred.
    Decode,
}

impl WorkerRole {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerRole::Aggregated => "aggregated",
            WorkerRole::Prefill => "prefill",
            WorkerRole::Decode => "decode",
        }
    }
}

/// Static settings of one worker.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub worker_id: u32,
    pub role: WorkerRole,
    pub block_size: usize,
    pub max_batched_tokens: u32,
    pub max_running: usize,
    pub timing: Timing,
    pub prefill_scale: f64,
    pub decode_scale: f64,
    pub num_blocks: u32,
    pub bytes_per_block: f64,
    pub cpu_tier: Option<TierConfig>,
    pub disk_tier: Option<TierConfig>,
    /// The deployment's run-to-run variability, shared by its workers.
    pub speed: Arc<Speed>,
}

/// Why a request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Reached `max_tokens`.
    Length,
    /// Hit the simulated end-of-sequence token.
    Stop,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
        }
    }
}

/// Server-side instants of one request, for `nvext.timing`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerTiming {
    pub received: Instant,
    pub first_scheduled: Instant,
    pub prefill_done: Instant,
    pub first_token: Instant,
    pub finished: Instant,
    /// Estimated KV transfer time between prefill and decode (zero in aggregated mode).
    pub kv_transfer: Duration,
}

/// The final record of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache at first admission (whole blocks).
    pub cached_tokens: u32,
    pub finish_reason: FinishReason,
    /// The worker that produced the tokens (the decode worker in disaggregated mode).
    pub worker_id: u32,
    pub prefill_worker_id: Option<u32>,
    pub preemptions: u32,
    pub timing: ServerTiming,
}

/// What a request's stream yields.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// One output token, generated at `at`.
    Token {
        at: Instant,
    },
    Done(Box<Completion>),
    /// The request cannot be served (e.g. it does not fit in KV memory).
    Rejected(String),
}

/// A request inside a worker.
#[derive(Debug)]
pub struct Seq {
    pub id: u64,
    pub prompt: Arc<[u32]>,
    /// Hashes of the full blocks of prompt + generated tokens, extended as blocks fill.
    pub hashes: Vec<u64>,
    pub output_len: u32,
    pub finish_reason: FinishReason,
    /// First word of the output, so the generated token ids are those of the streamed text.
    pub word_offset: u32,
    pub generated: u32,
    pub computed: u32,
    pub blocks: Vec<u32>,
    pub cached_tokens: Option<u32>,
    /// The prompt's KV arrived by transfer (decode side of disaggregated serving).
    pub kv_ready: bool,
    pub preemptions: u32,
    pub received: Instant,
    pub first_scheduled: Option<Instant>,
    pub prefill_done: Option<Instant>,
    pub first_token: Option<Instant>,
    pub kv_transfer: Duration,
    pub prefill_worker_id: Option<u32>,
    pub sink: mpsc::UnboundedSender<StreamEvent>,
    scheduled_new: u32,
}

impl Seq {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        prompt: Arc<[u32]>,
        prompt_hashes: Vec<u64>,
        output_len: u32,
        finish_reason: FinishReason,
        word_offset: u32,
        received: Instant,
        sink: mpsc::UnboundedSender<StreamEvent>,
    ) -> Self {
        Seq {
            id,
            prompt,
            hashes: prompt_hashes,
            output_len,
            finish_reason,
            word_offset,
            generated: 0,
            computed: 0,
            blocks: Vec::new(),
            cached_tokens: None,
            kv_ready: false,
            preemptions: 0,
            received,
            first_scheduled: None,
            prefill_done: None,
            first_token: None,
            kv_transfer: Duration::ZERO,
            prefill_worker_id: None,
            sink,
            scheduled_new: 0,
        }
    }

    fn total_len(&self) -> u32 {
        self.prompt.len() as u32 + self.generated
    }

    fn token_at(&self, pos: usize) -> u32 {
        match self.prompt.get(pos) {
            Some(t) => *t,
            None => text::output_token_id(self.word_offset, (pos - self.prompt.len()) as u32),
        }
    }

    /// Extends the hash chain over blocks that became full with generated tokens.
    fn extend_hashes(&mut self, block_size: usize) {
        let full = self.total_len() as usize / block_size;
        while self.hashes.len() < full {
            let k = self.hashes.len();
            let parent = if k == 0 { 0 } else { self.hashes[k - 1] };
            let tokens: Vec<u32> = (k * block_size..(k + 1) * block_size)
                .map(|p| self.token_at(p))
                .collect();
            self.hashes.push(chain_hash(parent, &tokens));
        }
    }
}

/// Engine counters exported on `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct EngineCounters {
    pub preemptions: u64,
    pub prompt_tokens_computed: u64,
    pub generation_tokens: u64,
    pub finished_requests: u64,
    /// Requests whose client went away before their last token (Dynamo's
    /// `dynamo_component_cancellation_total`).
    pub cancelled_requests: u64,
    pub passes: u64,
}

/// A consistent snapshot of one worker for metrics and routing.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSnapshot {
    pub worker_id: u32,
    pub role: WorkerRole,
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub kv_blocks: usize,
    pub kv_active_blocks: usize,
    pub kv_cached_blocks: usize,
    pub cpu_blocks: usize,
    pub disk_blocks: usize,
    pub tiers_enabled: bool,
    pub kv: KvCounters,
    pub engine: EngineCounters,
}

/// The mutable state of a worker: queues and KV cache.
#[derive(Debug)]
pub struct Core {
    cfg: EngineConfig,
    kv: KvCache,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    counters: EngineCounters,
}

/// The outcome of a pass.
#[derive(Debug, Default)]
pub struct PassResult {
    /// Sequences whose prefill finished on a prefill worker, to hand to a decode worker.
    pub handoffs: Vec<Seq>,
}

impl Core {
    pub fn new(cfg: EngineConfig) -> Self {
        let kv = KvCache::new(
            cfg.num_blocks,
            cfg.block_size,
            cfg.bytes_per_block,
            cfg.cpu_tier,
            cfg.disk_tier,
        );
        Core {
            cfg,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: EngineCounters::default(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Queues a sequence (FCFS).
    pub fn enqueue(&mut self, seq: Seq) {
        self.waiting.push_back(seq);
    }

    /// Whole blocks of `hashes` resident on this worker's GPU.
    pub fn overlap_blocks(&self, hashes: &[u64]) -> usize {
        self.kv.overlap_blocks(hashes)
    }

    /// Blocks referenced by running sequences plus the prompt blocks of queued ones: the load the
    /// router balances.
    pub fn load_blocks(&self) -> usize {
        let bs = self.cfg.block_size;
        self.kv.active_blocks()
            + self
                .waiting
                .iter()
                .map(|s| (s.total_len() as usize).div_ceil(bs))
                .sum::<usize>()
    }

    pub fn snapshot(&self) -> WorkerSnapshot {
        WorkerSnapshot {
            worker_id: self.cfg.worker_id,
            role: self.cfg.role,
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_usage: self.kv.usage(),
            kv_blocks: self.kv.num_blocks(),
            kv_active_blocks: self.kv.active_blocks(),
            kv_cached_blocks: self.kv.cached_blocks(),
            cpu_blocks: self.kv.cpu_blocks(),
            disk_blocks: self.kv.disk_blocks(),
            tiers_enabled: self.kv.tiers_enabled(),
            kv: self.kv.counters(),
            engine: self.counters,
        }
    }

    fn blocks_for(&self, tokens: u32) -> usize {
        (tokens as usize).div_ceil(self.cfg.block_size)
    }

    /// Chooses the work of the next pass and returns its duration, or `None` when idle.
    pub fn schedule(&mut self, now: Instant) -> Option<Duration> {
        self.drop_abandoned();
        let mut budget = self.cfg.max_batched_tokens;
        let mut shape = PassShape::default();
        let mut onboard_seconds = 0.0;
        let mut preempted = false;
        let mut scheduled = 0usize;

        // Running sequences first, oldest first.
        let mut i = 0;
        while i < self.running.len() {
            let seq = &self.running[i];
            let remaining = seq.total_len() - seq.computed;
            let new = remaining.min(budget);
            if new == 0 {
                i += 1;
                continue;
            }
            let need = self
                .blocks_for(seq.computed + new)
                .saturating_sub(seq.blocks.len());
            let mut self_preempted = false;
            while self.kv.free_blocks() < need {
                // LIFO: the most recently admitted sequence gives its blocks back.
                let victim = self.running.len() - 1;
                self.preempt(victim);
                preempted = true;
                if victim == i {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                break;
            }
            let got = self
                .kv
                .allocate(need)
                .expect("free blocks were checked above");
            let seq = &mut self.running[i];
            seq.blocks.extend(got);
            seq.scheduled_new = new;
            budget -= new;
            Self::account(&mut shape, seq, new);
            scheduled += 1;
            i += 1;
        }

        // Then admit waiting sequences in arrival order, unless this pass had to preempt.
        while !preempted && budget > 0 && self.running.len() < self.cfg.max_running {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            let bs = self.cfg.block_size;
            let total = seq.total_len();
            let admitted = if seq.kv_ready {
                // The prompt's KV was transferred; only the last prompt token is recomputed to
                // sample the first output token.
                let need = total.div_ceil(bs as u32) as usize;
                match self.kv.allocate(need) {
                    Some(blocks) => {
                        seq.blocks = blocks;
                        seq.computed = total - 1;
                        seq.scheduled_new = 1;
                        seq.cached_tokens.get_or_insert(0);
                        for (b, h) in seq.blocks.iter().zip(&seq.hashes) {
                            self.kv.commit_hash(*b, *h);
                        }
                        true
                    }
                    None => false,
                }
            } else {
                seq.extend_hashes(bs);
                // At least one token must be computed to sample from, so a fully cached prompt
                // still recomputes its last block.
                let cacheable = ((total - 1) as usize / bs).min(seq.hashes.len());
                let m = self.kv.match_prefix(&seq.hashes[..cacheable]);
                let cached = (m.total() * bs) as u32;
                let new = (total - cached).min(budget);
                let fresh = (cached + new).div_ceil(bs as u32) as usize - m.total();
                if self.kv.pool_cost(&seq.hashes, m) + fresh > self.kv.free_blocks() {
                    false
                } else {
                    self.admit_with_prefix(m, cached, new, fresh, &mut onboard_seconds);
                    true
                }
            };
            if !admitted {
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            seq.first_scheduled.get_or_insert(now);
            let new = seq.scheduled_new;
            budget -= new;
            Self::account(&mut shape, &seq, new);
            scheduled += 1;
            self.running.push(seq);
        }

        if scheduled == 0 {
            return None;
        }
        shape.kv_usage = self.kv.usage();
        let ms = self
            .cfg
            .timing
            .pass_ms(shape, self.cfg.prefill_scale, self.cfg.decode_scale);
        let pass = Duration::from_secs_f64(ms / 1e3 + onboard_seconds);
        Some(self.cfg.speed.apply(pass, now))
    }

    /// Takes the prefix hit and fresh blocks for the sequence at the front of the queue and
    /// records the lookup; the caller checked that the pool has room.
    fn admit_with_prefix(
        &mut self,
        m: PrefixMatch,
        cached: u32,
        new: u32,
        fresh: usize,
        onboard_seconds: &mut f64,
    ) {
        let seq = self.waiting.front_mut().expect("front exists");
        let hit = self
            .kv
            .acquire_prefix(&seq.hashes, m)
            .expect("pool cost was checked");
        let more = self.kv.allocate(fresh).expect("pool cost was checked");
        *onboard_seconds += hit.onboard_seconds;
        let prompt_len = seq.prompt.len() as u64;
        self.kv
            .record_query(prompt_len, u64::from(cached).min(prompt_len));
        seq.blocks = hit.blocks;
        seq.blocks.extend(more);
        seq.computed = cached;
        seq.cached_tokens.get_or_insert(cached);
        seq.scheduled_new = new;
    }

    fn account(shape: &mut PassShape, seq: &Seq, new: u32) {
        let decoding =
            new == 1 && (seq.generated > 0 || seq.kv_ready) && seq.computed + 1 == seq.total_len();
        if decoding {
            shape.decode_seqs += 1;
            shape.kv_tokens += u64::from(seq.total_len());
        } else {
            shape.prefill_tokens += u64::from(new);
        }
    }

    /// Frees the sequences whose client went away (the stream's receiver is gone: the connection
    /// closed), queued or running, before each pass: a cancelled request holds neither a batch
    /// slot nor KV blocks, as a real engine aborts it. Its computed full blocks stay in the
    /// prefix cache, as freed blocks do.
    fn drop_abandoned(&mut self) {
        let queued = self.waiting.len();
        self.waiting.retain(|seq| !seq.sink.is_closed());
        let mut gone = (queued - self.waiting.len()) as u64;
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].sink.is_closed() {
                let seq = self.running.remove(i);
                self.kv.release(&seq.blocks);
                gone += 1;
            } else {
                i += 1;
            }
        }
        self.counters.cancelled_requests += gone;
    }

    /// Gives a running sequence's blocks back and queues it first for recompute.
    fn preempt(&mut self, index: usize) {
        let mut seq = self.running.remove(index);
        self.kv.release(&seq.blocks);
        seq.blocks.clear();
        seq.computed = 0;
        seq.kv_ready = false;
        seq.scheduled_new = 0;
        seq.preemptions += 1;
        self.counters.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Applies the pass chosen by [`Core::schedule`]: computes KV, samples tokens, finishes
    /// sequences and collects finished prefills for handoff.
    pub fn complete(&mut self, now: Instant) -> PassResult {
        let mut result = PassResult::default();
        let bs = self.cfg.block_size;
        let role = self.cfg.role;
        let worker_id = self.cfg.worker_id;
        self.counters.passes += 1;
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            let new = std::mem::take(&mut seq.scheduled_new);
            if new == 0 {
                i += 1;
                continue;
            }
            let was_prefill = seq.generated == 0 && !seq.kv_ready;
            if was_prefill {
                self.counters.prompt_tokens_computed += u64::from(new);
            }
            seq.computed += new;
            // Blocks that are now full and computed become reusable by hash.
            let full = (seq.computed as usize / bs).min(seq.hashes.len());
            for k in 0..full {
                self.kv.commit_hash(seq.blocks[k], seq.hashes[k]);
            }
            if seq.computed < seq.total_len() {
                i += 1;
                continue;
            }
            // The pass covered every token: sample one.
            seq.prefill_done.get_or_insert(now);
            if role == WorkerRole::Prefill && seq.generated == 0 {
                let mut seq = self.running.remove(i);
                self.kv.release(&seq.blocks);
                seq.blocks.clear();
                seq.computed = 0;
                seq.prefill_worker_id = Some(worker_id);
                result.handoffs.push(seq);
                continue;
            }
            seq.generated += 1;
            seq.first_token.get_or_insert(now);
            self.counters.generation_tokens += 1;
            // A closed receiver means the client went away; the sequence is finished below.
            let gone = seq.sink.send(StreamEvent::Token { at: now }).is_err();
            seq.extend_hashes(bs);
            if seq.generated >= seq.output_len || gone {
                let seq = self.running.remove(i);
                self.kv.release(&seq.blocks);
                if seq.generated >= seq.output_len {
                    self.counters.finished_requests += 1;
                } else {
                    self.counters.cancelled_requests += 1;
                }
                let completion = Completion {
                    prompt_tokens: seq.prompt.len() as u32,
                    completion_tokens: seq.generated,
                    cached_tokens: seq.cached_tokens.unwrap_or(0),
                    finish_reason: seq.finish_reason,
                    worker_id,
                    prefill_worker_id: seq.prefill_worker_id,
                    preemptions: seq.preemptions,
                    timing: ServerTiming {
                        received: seq.received,
                        first_scheduled: seq.first_scheduled.unwrap_or(now),
                        prefill_done: seq.prefill_done.unwrap_or(now),
                        first_token: seq.first_token.unwrap_or(now),
                        finished: now,
                        kv_transfer: seq.kv_transfer,
                    },
                };
                // Ignoring a closed receiver: nobody is left to tell.
                let _ = seq.sink.send(StreamEvent::Done(Box::new(completion)));
                continue;
            }
            i += 1;
        }
        result
    }
}

/// A worker shared between its engine loop and the router.
#[derive(Debug)]
pub struct Worker {
    core: Mutex<Core>,
    wake: Notify,
    pub id: u32,
    pub role: WorkerRole,
}

/// If the loop falls this far behind its deadline (a starved runtime), it restarts the clock
/// instead of bursting passes back to back.
const CATCH_UP_LIMIT: Duration = Duration::from_millis(50);

/// Zero-delay passes run between two yields to the runtime.
const ZERO_DELAY_PASSES_PER_YIELD: u32 = 4;

impl Worker {
    pub fn new(cfg: EngineConfig) -> Arc<Self> {
        Arc::new(Worker {
            id: cfg.worker_id,
            role: cfg.role,
            core: Mutex::new(Core::new(cfg)),
            wake: Notify::new(),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock would be a bug in this module; the state is still usable
        // for metrics, so recover the guard instead of cascading the panic.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn submit(&self, seq: Seq) {
        self.lock().enqueue(seq);
        self.wake.notify_one();
    }

    /// The engine loop: runs passes until cancelled, handing finished prefills to `handoff`.
    pub async fn run(
        self: Arc<Self>,
        handoff: Option<mpsc::UnboundedSender<Seq>>,
        cancel: CancellationToken,
    ) {
        let mut last_end: Option<Instant> = None;
        let mut free_passes = 0u32;
        loop {
            let now = Instant::now();
            let planned = self.lock().schedule(now);
            let Some(duration) = planned else {
                last_end = None;
                tokio::select! {
                    _ = self.wake.notified() => continue,
                    _ = cancel.cancelled() => return,
                }
            };
            // Absolute deadlines: back-to-back passes start where the previous one ended, so timer
            // slack does not accumulate into drift.
            let start = match last_end {
                Some(end) if now.saturating_duration_since(end) < CATCH_UP_LIMIT => end,
                _ => now,
            };
            let end = start + duration;
            if duration.is_zero() {
                // The zero-delay profile must still let the HTTP tasks run. Yielding after every
                // pass would hand each connection one token per wake-up; a few free passes per
                // yield let the connections write what is ready together, as they would whenever
                // the engine outruns the network.
                free_passes += 1;
                if free_passes >= ZERO_DELAY_PASSES_PER_YIELD {
                    free_passes = 0;
                    tokio::task::yield_now().await;
                }
            } else {
                tokio::select! {
                    _ = tokio::time::sleep_until(end) => {}
                    _ = cancel.cancelled() => return,
                }
            }
            last_end = Some(end);
            // Tokens carry the modelled end of the pass: the timer wakes up to its 1 ms granularity
            // later, which is the runtime's slack, not the simulated GPU's.
            let at = if duration.is_zero() {
                Instant::now()
            } else {
                end
            };
            let result = self.lock().complete(at);
            if let Some(tx) = &handoff {
                for seq in result.handoffs {
                    // The cluster outlives its workers; a closed channel means shutdown.
                    let _ = tx.send(seq);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::profile::{H200_DECODE, H200_PREFILL};

    fn config(num_blocks: u32) -> EngineConfig {
        EngineConfig {
            worker_id: 0,
            role: WorkerRole::Aggregated,
            block_size: 16,
            max_batched_tokens: 8192,
            max_running: 256,
            timing: Timing::Formula {
                prefill: H200_PREFILL,
                decode: H200_DECODE,
            },
            prefill_scale: 1.0,
            decode_scale: 1.0,
            num_blocks,
            bytes_per_block: 1.0,
            cpu_tier: None,
            disk_tier: None,
            speed: Speed::new(None, 0),
        }
    }

    fn seq(id: u64, prompt: Vec<u32>, out: u32) -> (Seq, mpsc::UnboundedReceiver<StreamEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let hashes = crate::sim::kv::block_hashes(&prompt, 16);
        let s = Seq::new(
            id,
            prompt.into(),
            hashes,
            out,
            FinishReason::Length,
            0,
            Instant::now(),
            tx,
        );
        (s, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn chunked_prefill_splits_a_long_prompt_over_passes() {
        let mut cfg = config(1000);
        cfg.max_batched_tokens = 100;
        let mut core = Core::new(cfg);
        let (s, mut rx) = seq(1, (0..250).collect(), 2);
        core.enqueue(s);
        let now = Instant::now();
        for _ in 0..2 {
            core.schedule(now).unwrap();
            core.complete(now);
            assert!(rx.try_recv().is_err(), "no token before the prompt is done");
        }
        core.schedule(now).unwrap();
        core.complete(now);
        assert!(matches!(rx.try_recv(), Ok(StreamEvent::Token { .. })));
        assert_eq!(core.snapshot().engine.prompt_tokens_computed, 250);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deployments_speed_scales_every_pass_and_its_absence_changes_nothing() {
        use crate::config::sim::Variability;
        let first_pass = |speed: Arc<Speed>| {
            let mut cfg = config(1000);
            cfg.speed = speed;
            let mut core = Core::new(cfg);
            let (s, _rx) = seq(1, (0..300).collect(), 4);
            core.enqueue(s);
            core.schedule(Instant::now()).unwrap()
        };
        let modelled = first_pass(Speed::new(None, 0));
        // P(300) of the H200 fit, unscaled: the default keeps the modelled time to the nanosecond.
        let p = H200_PREFILL.at(300.0);
        assert_eq!(modelled, Duration::from_secs_f64(p / 1e3));
        let slower = Variability {
            scale: 1.25,
            ..Variability::default()
        };
        let scaled = first_pass(Speed::new(Some(slower), 0));
        let ratio = scaled.as_secs_f64() / modelled.as_secs_f64();
        // To the nanosecond either pass is rounded to.
        assert!((ratio - 1.25).abs() < 1e-6, "{ratio}");
    }

    #[tokio::test(start_paused = true)]
    async fn lifo_preemption_frees_blocks_and_the_victim_recomputes() {
        // 6 blocks of 16 tokens: two sequences of 32-token prompts fit, growing past that does not.
        let mut core = Core::new(config(6));
        let (a, mut ra) = seq(1, (0..32).collect(), 40);
        let (b, mut rb) = seq(2, (100..132).collect(), 40);
        core.enqueue(a);
        core.enqueue(b);
        let now = Instant::now();
        let mut passes = 0;
        let (mut done_a, mut done_b) = (None, None);
        while (done_a.is_none() || done_b.is_none()) && passes < 1000 {
            if core.schedule(now).is_some() {
                core.complete(now);
            }
            passes += 1;
            while let Ok(ev) = ra.try_recv() {
                if let StreamEvent::Done(c) = ev {
                    done_a = Some(c);
                }
            }
            while let Ok(ev) = rb.try_recv() {
                if let StreamEvent::Done(c) = ev {
                    done_b = Some(c);
                }
            }
        }
        let (a, b) = (done_a.unwrap(), done_b.unwrap());
        assert_eq!((a.completion_tokens, b.completion_tokens), (40, 40));
        assert_eq!(a.preemptions, 0, "the oldest sequence keeps running");
        assert!(b.preemptions >= 1, "the newest one is preempted");
        assert!(core.snapshot().engine.preemptions >= 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_leaves_frees_its_slot_and_blocks_queued_in_prefill_or_decoding() {
        // Room for one 256-token prompt in a pass: `prefill` is mid-prompt, `decoding` has its
        // first token, `queued` waits behind them.
        let mut cfg = config(1000);
        cfg.max_batched_tokens = 300;
        let mut core = Core::new(cfg);
        let (decoding, rd) = seq(1, (0..40).collect(), 100);
        let (prefill, rp) = seq(2, (1000..1256).collect(), 100);
        let (queued, rq) = seq(3, (2000..2256).collect(), 100);
        let (stays, mut rs) = seq(4, (3000..3016).collect(), 100);
        for s in [decoding, prefill, queued, stays] {
            core.enqueue(s);
        }
        let now = Instant::now();
        for _ in 0..2 {
            core.schedule(now).unwrap();
            core.complete(now);
        }
        let busy = core.snapshot();
        assert_eq!(busy.running + busy.waiting, 4, "{busy:?}");
        assert!(busy.kv_active_blocks > 0);
        // Three clients go away (their streams' receivers are dropped with the connection).
        drop((rd, rp, rq));
        core.schedule(now).unwrap();
        core.complete(now);
        let after = core.snapshot();
        assert_eq!((after.running, after.waiting), (1, 0), "{after:?}");
        assert_eq!(after.engine.cancelled_requests, 3);
        assert_eq!(after.engine.finished_requests, 0);
        // Only the remaining sequence's blocks are held: its prompt and its tokens so far.
        assert!(after.kv_active_blocks <= 2, "{after:?}");
        // It goes on to its last token and is counted as finished, not cancelled.
        while core.schedule(now).is_some() {
            core.complete(now);
        }
        let mut done = false;
        while let Ok(ev) = rs.try_recv() {
            done |= matches!(ev, StreamEvent::Done(_));
        }
        assert!(done);
        let end = core.snapshot();
        assert_eq!(
            (end.engine.finished_requests, end.engine.cancelled_requests),
            (1, 3)
        );
        assert_eq!(end.kv_active_blocks, 0);
    }
}
