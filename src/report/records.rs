//! The bench's view of every finished request: one `requests.jsonl` line each (close to AIPerf's
//! per-record export, with instants as CLOCK_MONOTONIC nanoseconds so records line up with a
//! server's clock on the same host), live request and error counts per target for the progress
//! display, and the TTFT samples the box plots need.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;

use super::ReportError;
use crate::clock::MonoClock;
use crate::model::{Finished, Phase, Sink, StepInfo, StepResult};

/// One line of `requests.jsonl`. The field names are a contract (issue #7): tools that line the
/// records up with server logs read them.
#[derive(Debug, Serialize)]
struct Line<'a> {
    x_request_id: &'a str,
    /// The response body's `id`.
    response_id: Option<&'a str>,
    target: &'a str,
    serving_mode: &'a str,
    workload: &'a str,
    /// Step labels; `null` where they do not apply to the workload.
    concurrency: Option<&'a str>,
    turn: Option<&'a str>,
    distribution: Option<&'a str>,
    isl_bucket: Option<&'a str>,
    prefix_ratio: Option<&'a str>,
    trace: Option<&'a str>,
    rate: Option<&'a str>,
    /// `warmup` (not measured) or `steady`.
    phase: &'static str,
    intended_start_mono_ns: u64,
    start_mono_ns: u64,
    first_token_mono_ns: Option<u64>,
    end_mono_ns: u64,
    start_unix_ns: u64,
    ttft_ms: Option<f64>,
    itl_ms: Option<f64>,
    latency_ms: f64,
    /// Client-side queue time: intended → actual send. In an open-loop step it includes the
    /// wait for a free in-flight slot (`slot_wait_ms`); the rest is the canary's own lag.
    client_queue_ms: f64,
    /// Open-loop steps: intended send → a slot free (`null` in closed-loop and multi-turn steps).
    slot_wait_ms: Option<f64>,
    /// The connect (TCP, and TLS for `https://`) this request paid for inside its TTFT, when it
    /// found no idle connection (`null` on a reused connection).
    connect_ms: Option<f64>,
    /// Sent a second time, on a new connection (then `connect_ms` is that connect): the reused
    /// connection it first went out on was lost before any byte of an answer. Both attempts are
    /// inside its TTFT.
    connection_retried: bool,
    /// Whether the request streamed (`false`: a non-streaming request, whose TTFT is its
    /// latency and which has no ITL).
    stream: bool,
    /// The prompt tokens the canary counted for the request with its tokenizer, before the
    /// server's chat template (`null` where it counted none).
    requested_isl: Option<u32>,
    requested_osl: u32,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    /// `usage` or `kv_hit_rate` (docs/METRICS.md, "Cache hits").
    cached_tokens_source: Option<&'static str>,
    /// A reasoning model's stream (docs/METRICS.md, "Reasoning"); all `null` for a request
    /// whose stream carried no reasoning. Answer tokens are the output tokens less the
    /// reasoning tokens; the times run from the intended send.
    reasoning_tokens: Option<u64>,
    answer_tokens: Option<u64>,
    time_to_first_reasoning_token_ms: Option<f64>,
    time_to_first_answer_token_ms: Option<f64>,
    reasoning_ms: Option<f64>,
    outcome: &'static str,
    /// Succeeded within the target's goodput limits (docs/METRICS.md "Goodput").
    good: bool,
    http_status: Option<u16>,
    error: Option<&'a str>,
    /// Dynamo's `nvext.timing` (docs/METRICS.md, "The request record"); `null` from a server
    /// that does not send it.
    server_ttft_ms: Option<f64>,
    server_prefill_wait_ms: Option<f64>,
    server_prefill_ms: Option<f64>,
    server_total_ms: Option<f64>,
    server_kv_hit_rate: Option<f64>,
    server_router_queue_depth: Option<f64>,
    server_kv_transfer_ms: Option<f64>,
    /// Actual send → first token at the client, minus `server_ttft_ms`: the network, and in
    /// disaggregated serving the prefill → decode handoff.
    server_handoff_ms: Option<f64>,
    /// Dynamo's `nvext.worker_id`, as text (64-bit ids).
    prefill_worker_id: Option<String>,
    decode_worker_id: Option<String>,
    /// With `--record-tokens`: the arrival of every content chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    token_mono_ns: Option<Vec<u64>>,
}

struct Jsonl {
    path: PathBuf,
    /// Written here and renamed to `path` by `finish`, so a killed bench never leaves a
    /// half-written `requests.jsonl`.
    partial: PathBuf,
    out: BufWriter<File>,
    /// The first write error; later lines are not attempted.
    failed: Option<std::io::Error>,
}

/// Live counts of one target.
#[derive(Debug, Default)]
pub struct Counts {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
}

/// The bench's [`Sink`]: `requests.jsonl` and the live progress.
pub struct BenchSink {
    clock: MonoClock,
    record_tokens: bool,
    jsonl: Option<Mutex<Jsonl>>,
    counts: Vec<Counts>,
    ttft_by_distribution: Mutex<BTreeMap<(String, String), Vec<f64>>>,
    /// Every reported step's results, in order.
    results: Mutex<Vec<StepResult>>,
}

impl BenchSink {
    /// A sink for `targets` targets, writing `requests.jsonl` to `path` when given.
    pub fn new(
        targets: usize,
        path: Option<&Path>,
        record_tokens: bool,
    ) -> Result<BenchSink, ReportError> {
        let jsonl = match path {
            Some(p) => {
                let mut partial = p.as_os_str().to_owned();
                partial.push(".partial");
                let partial = PathBuf::from(partial);
                Some(Mutex::new(Jsonl {
                    path: p.to_owned(),
                    out: BufWriter::new(File::create(&partial).map_err(ReportError::io(&partial))?),
                    partial,
                    failed: None,
                }))
            }
            None => None,
        };
        Ok(BenchSink {
            clock: MonoClock::now(),
            record_tokens,
            jsonl,
            counts: (0..targets).map(|_| Counts::default()).collect(),
            ttft_by_distribution: Mutex::new(BTreeMap::new()),
            results: Mutex::new(Vec::new()),
        })
    }

    /// Requests finished and errors so far for target `index`.
    pub fn counts(&self, index: usize) -> (u64, u64) {
        self.counts.get(index).map_or((0, 0), |c| {
            (
                c.requests.load(Ordering::Relaxed),
                c.errors.load(Ordering::Relaxed),
            )
        })
    }

    /// Flushes `requests.jsonl` and moves it into place; reports the first write error.
    pub fn finish(&self) -> Result<(), ReportError> {
        let Some(j) = &self.jsonl else { return Ok(()) };
        let mut j = j.lock().unwrap_or_else(PoisonError::into_inner);
        let flushed = j.out.flush();
        match (j.failed.take(), flushed) {
            (Some(e), _) | (None, Err(e)) => Err(ReportError::Io {
                path: j.path.clone(),
                source: e,
            }),
            (None, Ok(())) => {
                std::fs::rename(&j.partial, &j.path).map_err(|source| ReportError::Io {
                    path: j.path.clone(),
                    source,
                })
            }
        }
    }

    /// The TTFT samples (seconds) of successful steady requests per (target, distribution).
    /// The results of every reported step, in order.
    pub fn take_results(&self) -> Vec<StepResult> {
        std::mem::take(&mut *self.results.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn take_ttft_by_distribution(&self) -> BTreeMap<(String, String), Vec<f64>> {
        std::mem::take(
            &mut *self
                .ttft_by_distribution
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// The request's line: the record as the client observed it (a failed request's usage
    /// too, as the server sent it), with its labels and phase.
    fn line<'a>(&self, req: &'a Finished<'_>) -> Line<'a> {
        let (l, rec) = (req.labels, req.record);
        let label = |v: &'a String| (!v.is_empty()).then_some(v.as_str());
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let timing = rec.server_timing.clone().unwrap_or_default();
        let reasoning = rec.had_reasoning();
        let (prefill_worker_id, decode_worker_id) = rec
            .worker_id
            .as_ref()
            .map_or((None, None), |w| w.prefill_and_decode());
        Line {
            x_request_id: &rec.request_id,
            response_id: rec.response_id.as_deref(),
            target: &l.target,
            serving_mode: &l.serving_mode,
            workload: &l.workload,
            concurrency: label(&l.concurrency),
            turn: label(&l.turn),
            distribution: label(&l.distribution),
            isl_bucket: label(&l.isl_bucket),
            prefix_ratio: label(&l.prefix_ratio),
            trace: label(&l.trace),
            rate: label(&l.rate),
            phase: match req.phase {
                Phase::Warmup => "warmup",
                Phase::Steady => "steady",
            },
            intended_start_mono_ns: self.clock.mono_ns(rec.intended),
            start_mono_ns: self.clock.mono_ns(rec.sent),
            first_token_mono_ns: rec.first_token_at().map(|t| self.clock.mono_ns(t)),
            end_mono_ns: self.clock.mono_ns(rec.end),
            start_unix_ns: self.clock.unix_ns(rec.sent),
            ttft_ms: rec.ttft().map(ms),
            itl_ms: rec.itl().map(ms),
            latency_ms: ms(rec.latency()),
            client_queue_ms: ms(rec.client_queue()),
            slot_wait_ms: rec
                .slot_at
                .map(|s| ms(s.saturating_duration_since(rec.intended))),
            connect_ms: rec.connect.map(ms),
            connection_retried: rec.retried,
            stream: rec.streamed,
            requested_isl: (req.isl > 0).then_some(req.isl),
            requested_osl: req.osl,
            prompt_tokens: rec.prompt_tokens(),
            completion_tokens: rec.usage.map(|u| u.completion_tokens),
            cached_tokens: rec.cached_tokens(),
            cached_tokens_source: rec.cache_source().map(|c| c.as_str()),
            reasoning_tokens: reasoning.then(|| rec.reasoning_tokens()),
            answer_tokens: reasoning.then(|| rec.answer_tokens()),
            time_to_first_reasoning_token_ms: rec.time_to_first_reasoning_token().map(ms),
            time_to_first_answer_token_ms: rec
                .time_to_first_answer_token()
                .filter(|_| reasoning)
                .map(ms),
            reasoning_ms: rec.reasoning_time().map(ms),
            outcome: req.sample.outcome.as_str(),
            good: req.sample.good,
            http_status: rec.http_status,
            error: rec.error.as_deref(),
            server_ttft_ms: timing.ttft_ms,
            server_prefill_wait_ms: timing.prefill_wait_time_ms,
            server_prefill_ms: timing.prefill_time_ms,
            server_total_ms: timing.total_time_ms,
            server_kv_hit_rate: timing.kv_hit_rate,
            server_router_queue_depth: timing.router_queue_depth,
            server_kv_transfer_ms: timing.kv_transfer_estimated_latency_ms,
            server_handoff_ms: rec.server_split().map(|s| s.handoff * 1e3),
            prefill_worker_id,
            decode_worker_id,
            token_mono_ns: self.record_tokens.then(|| {
                rec.content_chunks()
                    .map(|(at, _)| self.clock.mono_ns(at))
                    .collect()
            }),
        }
    }
}

impl Sink for BenchSink {
    fn step_finished(&self, _step: &StepInfo, results: Option<&[StepResult]>) {
        if let Some(r) = results {
            self.results
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(r);
        }
    }

    fn request(&self, req: &Finished<'_>) {
        let s = &req.sample;
        if let Some(c) = self.counts.get(req.target_index) {
            c.requests.fetch_add(1, Ordering::Relaxed);
            if s.outcome.is_error() {
                c.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        let labels = req.labels;
        if s.outcome.is_ok()
            && req.phase == Phase::Steady
            && !labels.distribution.is_empty()
            && let Some(ttft) = s.ttft
        {
            self.ttft_by_distribution
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry((labels.target.clone(), labels.distribution.clone()))
                .or_default()
                .push(ttft);
        }
        if let Some(j) = &self.jsonl {
            let line = self.line(req);
            let mut j = j.lock().unwrap_or_else(PoisonError::into_inner);
            if j.failed.is_none() {
                let written = serde_json::to_writer(&mut j.out, &line)
                    .map_err(std::io::Error::other)
                    .and_then(|()| j.out.write_all(b"\n"));
                if let Err(e) = written {
                    j.failed = Some(e);
                }
            }
        }
    }
}
