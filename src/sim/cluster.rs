//! A simulated deployment: its worker pools (aggregated, or prefill + decode), the KV-aware router
//! that places requests, the prefill → decode KV handoff, and the per-request output length.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::SimError;
use super::engine::{
    Completion, EngineConfig, FinishReason, Seq, ServerTiming, StreamEvent, Worker, WorkerRole,
    WorkerSnapshot,
};
use super::kv::{TierConfig, block_hashes};
use super::profile::{Gpu, H200, H200_DECODE, H200_PREFILL, Timing};
use super::variability::Speed;
use crate::config::ServingMode;
use crate::config::sim::{PoolSpec, SimSpec, TierSpec, TimingTable, Variability};

/// A request as the engine sees it: token ids and length controls.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub min_tokens: u32,
    pub ignore_eos: bool,
}

impl GenerateRequest {
    /// A request for exactly `osl` tokens, as the canary sends them.
    pub fn exact(prompt: Vec<u32>, osl: u32) -> Self {
        GenerateRequest {
            prompt,
            max_tokens: osl,
            min_tokens: osl,
            ignore_eos: true,
        }
    }
}

/// The events of one submitted request.
#[derive(Debug)]
pub struct RequestStream {
    pub id: u64,
    /// First word of the output text (see [`super::text::output_word`]).
    pub word_offset: u32,
    source: Source,
}

/// Where a request's events come from.
#[derive(Debug)]
enum Source {
    /// A worker's engine loop (or the front door's immediate rejection).
    Engine(mpsc::UnboundedReceiver<StreamEvent>),
    /// The `fixed` profile's clock, run by whoever polls the stream: no task and no channel
    /// between the clock and the connection, so the send instants the accuracy benchmarks compare
    /// against carry one wake-up less of the simulator's own scheduling.
    Fixed(Box<FixedClock>),
}

impl RequestStream {
    pub async fn next(&mut self) -> Option<StreamEvent> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamEvent>> {
        match &mut self.source {
            Source::Engine(rx) => rx.poll_recv(cx),
            Source::Fixed(clock) => clock.poll_next(cx),
        }
    }

    /// How many events are already there (a hint, to size a frame).
    pub fn ready(&self) -> usize {
        match &self.source {
            Source::Engine(rx) => rx.len(),
            Source::Fixed(_) => 0,
        }
    }

    /// An event that is already there, without waiting.
    pub fn try_next(&mut self) -> Option<StreamEvent> {
        match &mut self.source {
            Source::Engine(rx) => rx.try_recv().ok(),
            Source::Fixed(_) => None,
        }
    }
}

/// One pool's resolved hardware.
#[derive(Debug, Clone, Copy)]
struct PoolHw {
    gpu: Gpu,
    tp: u32,
    cost_per_hour_usd: f64,
    kv_blocks: u64,
}

/// A running simulated deployment.
#[derive(Debug, Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    mode: ServingMode,
    block_size: usize,
    /// Aggregated workers, or the prefill pool in disaggregated mode.
    front: Vec<Arc<Worker>>,
    /// Decode pool (disaggregated only).
    decode: Vec<Arc<Worker>>,
    fixed: Option<(Duration, Duration)>,
    overlap_weight: f64,
    handoff_overhead: Duration,
    link_bytes_per_second: f64,
    kv_bytes_per_token: u64,
    eos_probability: f64,
    next_id: AtomicU64,
    rng: Mutex<StdRng>,
    cost_per_hour_usd: f64,
    /// The run-to-run variability every worker's passes follow.
    speed: Arc<Speed>,
    cancel: CancellationToken,
}

fn tier(spec: Option<TierSpec>, bytes_per_block: f64) -> Option<TierConfig> {
    spec.map(|t| TierConfig {
        capacity_blocks: (t.capacity_gb * 1e9 / bytes_per_block) as u64,
        bytes_per_second: t.bandwidth_gbps * 1e9,
    })
}

/// The timing model of `spec.profile`; `table` is the loaded timing table for `profile: table`.
fn timing(spec: &SimSpec, table: Option<TimingTable>) -> Result<Timing, SimError> {
    Ok(match spec.profile.as_str() {
        "fast" => Timing::Fast,
        "fixed" => Timing::Fixed {
            ttft: spec.fixed_ttft,
            itl: spec.fixed_itl,
        },
        "table" => Timing::Table(Arc::new(table.or_else(|| spec.table.clone()).ok_or_else(
            || SimError::InvalidSpec(vec!["profile: table needs a table".into()]),
        )?)),
        _ => Timing::Formula {
            prefill: H200_PREFILL,
            decode: H200_DECODE,
        },
    })
}

/// The worker pools of the deployment, each with its role, its number of workers and its
/// resolved hardware: one aggregated pool, or prefill and decode pools. A pool whose GPUs cannot
/// hold the model's weights is an error.
fn pools(spec: &SimSpec, disaggregated: bool) -> Result<Vec<(WorkerRole, u32, PoolHw)>, SimError> {
    let profile_gpu = Gpu::by_name(&spec.profile).unwrap_or(H200);
    let shape = spec.model_shape();
    let resolve = |pool: &PoolSpec| -> PoolHw {
        let gpu = pool
            .gpu
            .as_deref()
            .and_then(Gpu::by_name)
            .unwrap_or(profile_gpu);
        let derived = shape.kv_blocks(&gpu, pool.tp, spec.block_size);
        PoolHw {
            gpu,
            tp: pool.tp,
            cost_per_hour_usd: pool
                .cost_per_hour_usd
                .unwrap_or(gpu.cost_per_hour_usd * f64::from(pool.tp)),
            kv_blocks: pool
                .kv_blocks
                .unwrap_or(derived)
                .min(u64::from(u32::MAX - 1)),
        }
    };
    let pools: Vec<(WorkerRole, u32, PoolHw)> = if disaggregated {
        vec![
            (
                WorkerRole::Prefill,
                spec.prefill_workers,
                resolve(&spec.prefill),
            ),
            (
                WorkerRole::Decode,
                spec.decode_workers,
                resolve(&spec.decode),
            ),
        ]
    } else {
        vec![(
            WorkerRole::Aggregated,
            spec.workers,
            resolve(&spec.aggregated),
        )]
    };
    if let Some((role, _, hw)) = pools.iter().find(|(_, _, hw)| hw.kv_blocks == 0) {
        return Err(SimError::InvalidSpec(vec![format!(
            "{} pool: {} × {} cannot hold the model's weights ({} GB); set kv_blocks or use more GPUs",
            role.as_str(),
            hw.tp,
            hw.gpu.name,
            shape.weights_gb
        )]));
    }
    Ok(pools)
}

/// The started workers of every pool, and what they cost together.
struct Workers {
    /// Aggregated workers, or the prefill pool.
    front: Vec<Arc<Worker>>,
    decode: Vec<Arc<Worker>>,
    cost_per_hour_usd: f64,
}

/// Starts one engine loop per worker of `pools`, each stopped by a child of `cancel`; prefill
/// workers hand finished prefills to `handoff_tx`. Workers are numbered across the pools.
fn start_workers(
    spec: &SimSpec,
    pools: Vec<(WorkerRole, u32, PoolHw)>,
    (timing, speed): (&Timing, &Arc<Speed>),
    handoff_tx: &mpsc::UnboundedSender<Seq>,
    cancel: &CancellationToken,
) -> Workers {
    let bytes_per_block =
        (spec.model_shape().kv_bytes_per_token() * u64::from(spec.block_size)) as f64;
    // The real-time daemon needs a clock-accurate loop; the scales make A100/L40S estimates.
    let scaled = matches!(timing, Timing::Formula { .. } | Timing::Table(_));
    let mut workers = Workers {
        front: Vec::new(),
        decode: Vec::new(),
        cost_per_hour_usd: 0.0,
    };
    let mut next_worker = 0u32;
    for (role, count, hw) in pools {
        for _ in 0..count {
            let cfg = EngineConfig {
                worker_id: next_worker,
                role,
                block_size: spec.block_size as usize,
                max_batched_tokens: spec.max_batched_tokens,
                max_running: spec.max_running as usize,
                timing: timing.clone(),
                prefill_scale: if scaled {
                    hw.gpu.prefill_scale(hw.tp)
                } else {
                    1.0
                },
                decode_scale: if scaled {
                    hw.gpu.decode_scale(hw.tp)
                } else {
                    1.0
                },
                num_blocks: hw.kv_blocks as u32,
                bytes_per_block,
                cpu_tier: tier(spec.cpu_tier, bytes_per_block),
                disk_tier: tier(spec.disk_tier, bytes_per_block),
                speed: Arc::clone(speed),
            };
            next_worker += 1;
            workers.cost_per_hour_usd += hw.cost_per_hour_usd;
            let worker = Worker::new(cfg);
            let tx = (role == WorkerRole::Prefill).then(|| handoff_tx.clone());
            tokio::spawn(Arc::clone(&worker).run(tx, cancel.child_token()));
            if role == WorkerRole::Decode {
                workers.decode.push(worker);
            } else {
                workers.front.push(worker);
            }
        }
    }
    workers
}

impl Cluster {
    /// Builds the pools of `spec` for `mode` and starts one engine loop per worker on the current
    /// tokio runtime. `table` is the loaded timing table for `profile: table`.
    pub fn start(
        spec: &SimSpec,
        mode: ServingMode,
        table: Option<TimingTable>,
    ) -> Result<Cluster, SimError> {
        let errors = spec.validate();
        if !errors.is_empty() {
            return Err(SimError::InvalidSpec(errors));
        }
        let timing = timing(spec, table)?;
        let kv_bytes_per_token = spec.model_shape().kv_bytes_per_token();
        let disaggregated = mode == ServingMode::Disaggregated;
        let pools = pools(spec, disaggregated)?;
        let cancel = CancellationToken::new();
        let (handoff_tx, handoff_rx) = mpsc::unbounded_channel();
        let speed = Speed::new(spec.variability.clone(), spec.seed);
        let workers = start_workers(spec, pools, (&timing, &speed), &handoff_tx, &cancel);
        let inner = Arc::new(Inner {
            mode,
            block_size: spec.block_size as usize,
            front: workers.front,
            decode: workers.decode,
            fixed: match timing {
                Timing::Fixed { ttft, itl } => Some((ttft, itl)),
                _ => None,
            },
            overlap_weight: spec.overlap_weight,
            handoff_overhead: spec.handoff_overhead,
            link_bytes_per_second: spec.link_gbps * 1e9,
            kv_bytes_per_token,
            eos_probability: spec.eos_probability,
            next_id: AtomicU64::new(1),
            rng: Mutex::new(StdRng::seed_from_u64(spec.seed)),
            cost_per_hour_usd: workers.cost_per_hour_usd,
            speed,
            cancel,
        });
        if disaggregated {
            tokio::spawn(handoffs(Arc::downgrade(&inner), handoff_rx));
        }
        Ok(Cluster { inner })
    }

    pub fn mode(&self) -> ServingMode {
        self.inner.mode
    }

    pub fn block_size(&self) -> usize {
        self.inner.block_size
    }

    /// Price of every worker together, USD per hour.
    pub fn cost_per_hour_usd(&self) -> f64 {
        self.inner.cost_per_hour_usd
    }

    /// Snapshots of every worker (prefill/aggregated first, then decode).
    pub fn snapshots(&self) -> Vec<WorkerSnapshot> {
        self.inner
            .front
            .iter()
            .chain(&self.inner.decode)
            .map(|w| w.lock().snapshot())
            .collect()
    }

    /// Replaces the run-to-run variability from the next pass on (`None`: passes as modelled);
    /// a drift starts over from here.
    pub fn set_variability(&self, variability: Option<Variability>) {
        self.inner.speed.set(variability);
    }

    /// The factor the deployment's passes take now (1: as modelled).
    pub fn speed_factor(&self) -> f64 {
        self.inner.speed.factor(Instant::now())
    }

    /// Stops every engine loop.
    pub fn shutdown(&self) {
        self.inner.cancel.cancel();
    }

    /// A fresh request id.
    pub fn next_request_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Places a request and returns its event stream.
    pub fn submit(&self, req: GenerateRequest) -> RequestStream {
        let inner = &self.inner;
        let id = self.next_request_id();
        let received = Instant::now();
        let word_offset = (id as u32).wrapping_mul(7);
        let (output_len, finish_reason) = self.output_length(&req);
        let prompt_len = req.prompt.len() as u32;
        if let Some((ttft, itl)) = inner.fixed.filter(|_| prompt_len > 0) {
            let clock = FixedClock::new(received, ttft, itl, prompt_len, output_len, finish_reason);
            return RequestStream {
                id,
                word_offset,
                source: Source::Fixed(Box::new(clock)),
            };
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = RequestStream {
            id,
            word_offset,
            source: Source::Engine(rx),
        };
        if prompt_len == 0 {
            let _ = tx.send(StreamEvent::Rejected("the prompt is empty".into()));
            return stream;
        }
        let bs = inner.block_size;
        let capacity = |pool: &[Arc<Worker>]| {
            pool.iter()
                .map(|w| w.lock().config().num_blocks as usize * bs)
                .min()
                .unwrap_or(0)
        };
        let needed = (prompt_len + output_len) as usize;
        let fits = if inner.decode.is_empty() {
            needed <= capacity(&inner.front)
        } else {
            prompt_len as usize <= capacity(&inner.front) && needed <= capacity(&inner.decode)
        };
        if !fits {
            let _ = tx.send(StreamEvent::Rejected(format!(
                "prompt ({prompt_len} tokens) plus max_tokens ({output_len}) exceeds the KV capacity of a worker"
            )));
            return stream;
        }
        let hashes = block_hashes(&req.prompt, bs);
        let worker = route(
            &inner.front,
            &hashes,
            prompt_len as usize,
            bs,
            inner.overlap_weight,
        );
        let seq = Seq::new(
            id,
            req.prompt.into(),
            hashes,
            output_len,
            finish_reason,
            word_offset,
            received,
            tx,
        );
        worker.submit(seq);
        stream
    }

    /// Output length: exact with `ignore_eos`, else `min_tokens` plus a geometric number of tokens
    /// before the simulated EOS, capped by `max_tokens`.
    fn output_length(&self, req: &GenerateRequest) -> (u32, FinishReason) {
        let max = req.max_tokens.max(1);
        let p = self.inner.eos_probability;
        if req.ignore_eos || p <= 0.0 {
            return (max, FinishReason::Length);
        }
        let u: f64 = self
            .inner
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .random_range(f64::MIN_POSITIVE..1.0);
        let extra = (u.ln() / (1.0 - p).ln()).floor();
        let len = f64::from(req.min_tokens.max(1)) + extra;
        if len >= f64::from(max) {
            (max, FinishReason::Length)
        } else {
            (len as u32, FinishReason::Stop)
        }
    }

    /// Draws a uniform number in [0, 1) from the seeded generator (for fault sampling).
    pub fn random_unit(&self) -> f64 {
        self.inner
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .random::<f64>()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// KV-aware placement: the worker with the lowest `weight × prefill blocks + load blocks`, where
/// prefill blocks are the prompt blocks not already cached there. Ties go to the lower id.
fn route<'a>(
    pool: &'a [Arc<Worker>],
    hashes: &[u64],
    prompt_len: usize,
    block_size: usize,
    weight: f64,
) -> &'a Arc<Worker> {
    if pool.len() == 1 {
        return &pool[0];
    }
    let prompt_blocks = prompt_len.div_ceil(block_size);
    pool.iter()
        .map(|w| {
            let core = w.lock();
            let prefill = prompt_blocks - core.overlap_blocks(hashes);
            let cost = weight * prefill as f64 + core.load_blocks() as f64;
            (cost, w)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, w)| w)
        .expect("pools are never empty")
}

/// Receives finished prefills, waits out the KV transfer, and places them on a decode worker.
async fn handoffs(inner: std::sync::Weak<Inner>, mut rx: mpsc::UnboundedReceiver<Seq>) {
    while let Some(mut seq) = rx.recv().await {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let bytes = seq.prompt.len() as f64 * strong.kv_bytes_per_token as f64;
        let transfer =
            strong.handoff_overhead + Duration::from_secs_f64(bytes / strong.link_bytes_per_second);
        seq.kv_transfer = transfer;
        seq.kv_ready = true;
        let weak = inner.clone();
        drop(strong);
        tokio::spawn(async move {
            // From the modelled end of the prefill, so the loop's wake-up slack is not counted twice.
            let ready = seq.prefill_done.map_or_else(Instant::now, |t| t + transfer);
            tokio::time::sleep_until(ready).await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            // Decode placement balances load; the prefix already travelled with the request.
            let worker = route(&inner.decode, &[], 0, inner.block_size, 0.0);
            worker.submit(seq);
        });
    }
}

/// The `fixed` profile: a per-request clock independent of batching and KV. Token `i` is due at
/// `received + ttft + i × itl`; the completion follows the last token.
#[derive(Debug)]
struct FixedClock {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    first: Instant,
    itl: Duration,
    next: u32,
    output_len: u32,
    done: Option<Box<Completion>>,
}

impl FixedClock {
    fn new(
        received: Instant,
        ttft: Duration,
        itl: Duration,
        prompt_tokens: u32,
        output_len: u32,
        finish_reason: FinishReason,
    ) -> Self {
        let first = received + ttft;
        let finished = first + itl * output_len.saturating_sub(1);
        let completion = Completion {
            prompt_tokens,
            completion_tokens: output_len,
            cached_tokens: 0,
            finish_reason,
            worker_id: 0,
            prefill_worker_id: None,
            preemptions: 0,
            timing: ServerTiming {
                received,
                first_scheduled: received,
                prefill_done: first,
                first_token: first,
                finished,
                kv_transfer: Duration::ZERO,
            },
        };
        FixedClock {
            sleep: Box::pin(tokio::time::sleep_until(first)),
            first,
            itl,
            next: 0,
            output_len,
            done: Some(Box::new(completion)),
        }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamEvent>> {
        if self.next < self.output_len {
            std::task::ready!(self.sleep.as_mut().poll(cx));
            let at = self.first + self.itl * self.next;
            self.next += 1;
            if self.next < self.output_len {
                let due = self.first + self.itl * self.next;
                self.sleep.as_mut().reset(due);
            }
            return Poll::Ready(Some(StreamEvent::Token { at }));
        }
        Poll::Ready(self.done.take().map(StreamEvent::Done))
    }
}
