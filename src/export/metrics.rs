//! The one place that names, registers and records every Prometheus metric of the daemon
//! (docs/DESIGN.md §6): the `Metrics` struct of handles built once at start-up, its typed label
//! sets, and the OpenMetrics text encoding served on `/metrics`. The bucket grids are in
//! [`super::buckets`], the per-request latency histograms and their encoder in
//! [`super::histogram`].
//!
//! The series budget (docs/METRICS.md, "Series budget"): at the standard resolution the latency
//! histograms and the request counters are kept per step (without `turn` and `isl_bucket`; the
//! request duration and the chunk gap per workload), over a dozen 1-2.5-5 buckets; the step
//! gauges carry p50 and p99 of every step and sub-step, and on the step their confidence
//! intervals. The seed plan on two targets is under 3,000 samples. `export.resolution: high`
//! keeps everything by request labels over ~124 buckets, p90 and intervals included: ~30,000.
//!
//! Encoding: the three per-request latency families, ~95 % of the text, have their own encoder
//! (`LatencyFamily`): byte for byte prometheus-client's output, written from pre-rendered label
//! text with `itoa`/`dtoa`, and each series' text is kept and re-rendered only when its count or
//! sum moved since the previous scrape. Every other family goes through prometheus-client.
//! docs/PERFORMANCE.md has the figures (a full-series-set scrape went from ~9 ms to ~1.4 ms).
//!
//! Recording never waits on a scrape: histograms are arrays of atomics ([`AtomicHistogram`]),
//! counters and gauges are atomics, and a [`Family`] lookup takes only a shared read lock, which a
//! scrape also only reads (the latency families' encoder copies its series list out first). The
//! exception is the first observation of a new label set (the first request of a step), which
//! takes the family's write lock once and may wait for a prometheus-client family's encoding.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::buckets::{
    Latency, Resolution, client_queue_buckets, connect_buckets, family_buckets,
    schedule_lag_buckets,
};
use super::histogram::{AtomicHistogram, LatencyFamily, SharedBuckets};
use super::labels::*;
use crate::model::{Phase, StepSummary};
use crate::request::{RequestLabels, Sample, StepLabels};

/// Errors of the metrics module.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The OpenMetrics text encoder failed (it only fails on a broken writer or an invalid metric).
    #[error("encoding the OpenMetrics exposition failed")]
    Encode(#[from] std::fmt::Error),
}

/// The quantiles of the `llm_canary_step_*` latency gauges, as `quantile` label values, and
/// their index in [`Quantiles::values`]; the standard resolution leaves p90 out.
const STEP_QUANTILES: [(&str, usize); 3] = [("0.5", 0), ("0.9", 1), ("0.99", 2)];
const STANDARD_STEP_QUANTILES: [(&str, usize); 2] = [("0.5", 0), ("0.99", 2)];

pub(super) type GaugeF64 = Gauge<f64, AtomicU64>;
pub(super) type CounterF64 = Counter<f64, AtomicU64>;

/// The label sets created per target, so a target that disappears can be removed from every
/// family (prometheus-client cannot enumerate a family's label sets). Written only when a series
/// is first created, never on the steady record path.
#[derive(Debug, Default)]
pub(super) struct TargetSeries {
    pub(super) requests: HashSet<RequestLabels>,
    pub(super) outcomes: HashSet<OutcomeLabels>,
    pub(super) modes: HashSet<ModeLabels>,
    pub(super) skips: HashSet<SkipLabels>,
    pub(super) lags: HashSet<TargetWorkloadLabels>,
    pub(super) budget_steps: HashSet<BudgetStepLabels>,
    pub(super) server_timing: HashSet<TargetModeLabels>,
    /// Last cumulative server counter values seen, to mirror their increase.
    pub(super) last_preemptions: Option<f64>,
    pub(super) last_cancellations: Option<f64>,
    pub(super) last_kv_offload_blocks: Option<f64>,
}

/// Every metric family of the daemon, registered once in [`Metrics::new`].
#[derive(Debug)]
pub struct Metrics {
    pub(super) registry: Registry,
    pub(super) resolution: Resolution,
    /// The TTFT family's bounds (each latency family has its own grid).
    pub(super) latency_bounds: Arc<[f64]>,
    pub(super) tracked: Mutex<HashMap<String, TargetSeries>>,
    /// How many chunks the last scrape had, to size the next one's list.
    pub(super) last_chunk_count: AtomicUsize,

    pub(super) ttft: LatencyFamily,
    pub(super) itl: LatencyFamily,
    pub(super) request_duration: LatencyFamily,
    /// Coarser labels than the per-request histograms: the per-token gap distribution is read per
    /// target and workload, and per step it would add another ~126 series per step label set.
    pub(super) chunk_gap: Family<ModeLabels, AtomicHistogram, SharedBuckets>,
    pub(super) reasoning: super::reasoning::ReasoningFamilies,
    /// The server's own timing of successful requests (Dynamo's `nvext.timing`): its TTFT, the
    /// wait for prefill and the prefill itself, on the TTFT grid, per target (and its serving
    /// mode): the series budget has no room for them per workload, and the steps carry their
    /// means per step (`ttft_breakdown`). Never a worker id: those are in `requests.jsonl` only.
    pub(super) server_ttft: Family<TargetModeLabels, AtomicHistogram, SharedBuckets>,
    pub(super) server_queue: Family<TargetModeLabels, AtomicHistogram, SharedBuckets>,
    pub(super) server_prefill: Family<TargetModeLabels, AtomicHistogram, SharedBuckets>,
    pub(super) requests: Family<OutcomeLabels, Counter>,
    /// Requests built but not sent (`reason`: `context_length`), never errors of the server.
    pub(super) requests_skipped: Family<SkipLabels, Counter>,
    pub(super) prompt_tokens: Family<RequestLabels, Counter>,
    pub(super) cached_tokens: Family<RequestLabels, Counter>,
    pub(super) output_tokens: Family<RequestLabels, Counter>,
    pub(super) osl_mismatch: Family<ModeLabels, Counter>,
    pub(super) token_count_mismatch: Family<ModeLabels, Counter>,

    pub(super) step_ttft: Family<StepQuantileLabels, GaugeF64>,
    pub(super) step_itl: Family<StepQuantileLabels, GaugeF64>,
    pub(super) step_request_duration: Family<StepQuantileLabels, GaugeF64>,
    /// Lower and upper 95 % confidence bounds of the step quantiles above.
    pub(super) step_ci: [(
        Family<StepQuantileLabels, GaugeF64>,
        Family<StepQuantileLabels, GaugeF64>,
    ); 3],
    pub(super) step_output_tokens_per_second: Family<StepLabels, GaugeF64>,
    pub(super) step_requests_per_second: Family<StepLabels, GaugeF64>,
    /// Good requests per second, set for a whole step only (not per turn or ISL bucket).
    pub(super) step_goodput: Family<StepLabels, GaugeF64>,
    pub(super) step_error_ratio: Family<StepLabels, GaugeF64>,
    pub(super) step_cache_hit_ratio: Family<StepLabels, GaugeF64>,
    pub(super) step_cost_per_million_tokens: Family<StepLabels, GaugeF64>,
    pub(super) step_end_timestamp: Family<StepLabels, GaugeF64>,
    pub(super) step_degraded: Family<StepLabels, Gauge>,
    pub(super) step_faulted: Family<StepLabels, Gauge>,
    pub(super) step_saturated: Family<StepLabels, Gauge>,

    pub(super) server_prefix_cache_hit_ratio: Family<TargetLabels, GaugeF64>,
    pub(super) server_kv_cache_usage_ratio: Family<TargetLabels, GaugeF64>,
    pub(super) server_preemptions: Family<TargetLabels, CounterF64>,
    pub(super) server_cancellations: Family<TargetLabels, CounterF64>,
    pub(super) server_kv_offload_blocks: Family<TargetLabels, CounterF64>,
    pub(super) server_ttft_mean: Family<TargetLabels, GaugeF64>,
    pub(super) server_kvbm_host_cache_hit_ratio: Family<TargetLabels, GaugeF64>,
    pub(super) server_kvbm_disk_cache_hit_ratio: Family<TargetLabels, GaugeF64>,
    pub(super) server_scrape_errors: Family<TargetLabels, Counter>,

    pub(super) slo_state: SloStateSet,
    pub(super) slo_value: Family<SloLabels, GaugeF64>,
    pub(super) slo_threshold: Family<SloLabels, GaugeF64>,
    pub(super) slo_value_lower: Family<SloLabels, GaugeF64>,
    pub(super) slo_value_upper: Family<SloLabels, GaugeF64>,
    pub(super) slo_data_age: Family<SloLabels, GaugeF64>,

    pub(super) target_up: Family<TargetLabels, Gauge>,
    pub(super) schedule_lag: Family<TargetWorkloadLabels, AtomicHistogram, SharedBuckets>,
    pub(super) client_queue: Family<TargetWorkloadLabels, AtomicHistogram, SharedBuckets>,
    pub(super) connect: Family<TargetLabels, AtomicHistogram, SharedBuckets>,
    pub(super) connection_retries: Family<TargetLabels, Counter>,
    pub(super) inflight: Family<TargetLabels, Gauge>,
    pub(super) config_last_reload_successful: Gauge,
    pub(super) config_last_reload_success_timestamp: GaugeF64,
    /// Clients the HTTP surface refused or cut off, by reason (`export::refusals`).
    pub(super) http_refused: Family<ReasonLabels, Counter>,

    pub(super) paused: Family<ReasonLabels, Gauge>,
    pub(super) probe_success: Family<TargetLabels, Gauge>,
    pub(super) budget_steps: Family<BudgetStepLabels, Counter>,
    pub(super) budget_throttled: Family<ScopeLabels, Counter>,
    pub(super) budget_output_tokens: Family<ScopeLabels, Gauge>,
    pub(super) budget_limit: Family<ScopeLimitLabels, GaugeF64>,
    /// Throttled-request totals last seen per scope, to mirror their increase.
    pub(super) budget_throttled_seen: Mutex<HashMap<String, u64>>,
}

impl Metrics {
    /// Builds and registers every family at the standard resolution; see [`Metrics::with_resolution`].
    pub fn new(latency_thresholds: &[f64]) -> Self {
        Self::with_resolution(latency_thresholds, Resolution::Standard)
    }

    /// Builds and registers every family. `latency_thresholds` are the SLO thresholds in seconds
    /// (from the config); each becomes an exact bucket bound of every latency histogram. Buckets
    /// are fixed for the life of the process so histograms survive a config reload.
    pub fn with_resolution(latency_thresholds: &[f64], resolution: Resolution) -> Self {
        let bounds = |family| -> Arc<[f64]> {
            family_buckets(family, resolution, latency_thresholds).into()
        };
        let latency_bounds = bounds(Latency::Ttft);
        let itl_bounds = bounds(Latency::Itl);
        let lag = SharedBuckets(schedule_lag_buckets(resolution).into());
        let queue = SharedBuckets(client_queue_buckets().into());
        let metrics = Self {
            registry: Registry::default(),
            resolution,
            tracked: Mutex::new(HashMap::new()),
            last_chunk_count: AtomicUsize::new(0),
            ttft: LatencyFamily::new(
                "llm_canary_time_to_first_token",
                "Time from the intended send to the first non-empty content chunk",
                latency_bounds.clone(),
            ),
            itl: LatencyFamily::new(
                "llm_canary_inter_token_latency",
                "Per-request mean gap between output tokens: (last chunk - first chunk) / (tokens - 1)",
                itl_bounds.clone(),
            ),
            request_duration: LatencyFamily::new(
                "llm_canary_request_duration",
                "Time from the intended send to the last content chunk",
                bounds(Latency::RequestDuration),
            ),
            chunk_gap: Family::new_with_constructor(SharedBuckets(itl_bounds)),
            reasoning: super::reasoning::ReasoningFamilies::new(resolution, latency_thresholds),
            server_ttft: Family::new_with_constructor(SharedBuckets(latency_bounds.clone())),
            server_queue: Family::new_with_constructor(SharedBuckets(latency_bounds.clone())),
            server_prefill: Family::new_with_constructor(SharedBuckets(latency_bounds.clone())),
            requests: Family::default(),
            requests_skipped: Family::default(),
            prompt_tokens: Family::default(),
            cached_tokens: Family::default(),
            output_tokens: Family::default(),
            osl_mismatch: Family::default(),
            token_count_mismatch: Family::default(),
            step_ttft: Family::default(),
            step_itl: Family::default(),
            step_request_duration: Family::default(),
            step_ci: Default::default(),
            step_output_tokens_per_second: Family::default(),
            step_requests_per_second: Family::default(),
            step_goodput: Family::default(),
            step_error_ratio: Family::default(),
            step_cache_hit_ratio: Family::default(),
            step_cost_per_million_tokens: Family::default(),
            step_end_timestamp: Family::default(),
            step_degraded: Family::default(),
            step_faulted: Family::default(),
            step_saturated: Family::default(),
            latency_bounds,
            server_prefix_cache_hit_ratio: Family::default(),
            server_kv_cache_usage_ratio: Family::default(),
            server_preemptions: Family::default(),
            server_cancellations: Family::default(),
            server_kv_offload_blocks: Family::default(),
            server_ttft_mean: Family::default(),
            server_kvbm_host_cache_hit_ratio: Family::default(),
            server_kvbm_disk_cache_hit_ratio: Family::default(),
            server_scrape_errors: Family::default(),
            slo_state: SloStateSet::default(),
            slo_value: Family::default(),
            slo_threshold: Family::default(),
            slo_value_lower: Family::default(),
            slo_value_upper: Family::default(),
            slo_data_age: Family::default(),
            target_up: Family::default(),
            schedule_lag: Family::new_with_constructor(lag),
            client_queue: Family::new_with_constructor(queue),
            connect: Family::new_with_constructor(SharedBuckets(connect_buckets().into())),
            connection_retries: Family::default(),
            inflight: Family::default(),
            config_last_reload_successful: Gauge::default(),
            config_last_reload_success_timestamp: GaugeF64::default(),
            http_refused: Family::default(),
            paused: Family::default(),
            probe_success: Family::default(),
            budget_steps: Family::default(),
            budget_throttled: Family::default(),
            budget_output_tokens: Family::default(),
            budget_limit: Family::default(),
            budget_throttled_seen: Mutex::new(HashMap::new()),
        };
        metrics.register()
    }

    /// The TTFT histogram's bucket bounds (fixed at start-up; each latency family has its own
    /// grid, all holding every SLO threshold).
    pub fn latency_bounds(&self) -> &[f64] {
        &self.latency_bounds
    }

    /// How finely the latencies are exported.
    pub fn resolution(&self) -> Resolution {
        self.resolution
    }

    /// Records one finished request under `labels`: its outcome always (a warmup error is never
    /// silently lost); in the steady window also its latencies (TTFT and ITL of a success, the
    /// request duration of anything but a cancellation) and the tokens it counts for. The token
    /// counters are touched even at 0 so their series exist from the first request and `rate()`
    /// has a starting point.
    pub fn record_request(&self, labels: &RequestLabels, phase: Phase, s: &Sample) {
        // The standard resolution keeps these by step: a turn or an ISL bucket is a slice of a
        // step the step gauges show, not worth a histogram of its own.
        let step_level = match self.resolution {
            Resolution::Standard => labels.step_level(),
            Resolution::High => None,
        };
        let labels = step_level.as_ref().unwrap_or(labels);
        let outcome_labels = OutcomeLabels {
            request: labels.clone(),
            outcome: s.outcome,
        };
        self.outcome_series(&outcome_labels).inc();
        let steady = phase == Phase::Steady;
        if steady {
            self.record_latencies(labels, s);
        }
        let tokens = |n: u64| if steady { n } else { 0 };
        self.request_series(&self.prompt_tokens, labels)
            .inc_by(tokens(s.prompt_tokens));
        self.request_series(&self.cached_tokens, labels)
            .inc_by(tokens(s.cached_tokens));
        self.request_series(&self.output_tokens, labels)
            .inc_by(tokens(s.output_tokens));
    }

    /// The TTFT and ITL of a successful request, and the duration of any the server answered.
    fn record_latencies(&self, labels: &RequestLabels, s: &Sample) {
        if s.outcome.is_ok() {
            for (family, value) in [(&self.ttft, s.ttft), (&self.itl, s.itl)] {
                if let Some(v) = value {
                    self.histogram_series(family, labels).observe(v);
                }
            }
        }
        let Some(latency) = s.server_latency() else {
            return;
        };
        // By workload at the standard resolution: no dashboard, rule or SLO threshold reads the
        // request duration by step (the step gauges have it).
        let by_workload;
        let duration_labels = match self.resolution {
            Resolution::Standard => {
                by_workload = RequestLabels {
                    target: labels.target.clone(),
                    serving_mode: labels.serving_mode.clone(),
                    workload: labels.workload.clone(),
                    ..RequestLabels::default()
                };
                &by_workload
            }
            Resolution::High => labels,
        };
        self.histogram_series(&self.request_duration, duration_labels)
            .observe(latency);
    }

    /// Records the content chunks of one request as per-token gaps: each `(gap_seconds, tokens)`
    /// counts `gap / tokens`, `tokens` times (docs/DESIGN.md §4). Exported by `target`, `serving_mode` and
    /// `workload` only (`llm_canary_chunk_gap_seconds`); the step labels of `labels` are not used.
    pub fn record_chunk_gaps(&self, labels: &RequestLabels, gaps: &[(f64, u32)]) {
        if gaps.is_empty() {
            return;
        }
        let histogram = self.mode_series(&self.chunk_gap, mode_labels(labels));
        for &(gap, tokens) in gaps {
            if tokens > 0 {
                histogram.observe_n(gap / f64::from(tokens), u64::from(tokens));
            }
        }
    }

    /// Records the server's own timing of one successful request, by `target` and
    /// `serving_mode` (`llm_canary_server_{ttft,queue,prefill}_seconds`).
    pub fn record_server_timing(
        &self,
        labels: &RequestLabels,
        ttft: f64,
        queue: Option<f64>,
        prefill: Option<f64>,
    ) {
        let key = TargetModeLabels {
            target: labels.target.clone(),
            serving_mode: labels.serving_mode.clone(),
        };
        if self.server_ttft.get(&key).is_none() {
            self.track(&key.target, |s| {
                s.server_timing.insert(key.clone());
            });
        }
        self.server_ttft.get_or_create(&key).observe(ttft);
        for (family, value) in [(&self.server_queue, queue), (&self.server_prefill, prefill)] {
            if let Some(v) = value {
                family.get_or_create(&key).observe(v);
            }
        }
    }

    /// Counts a request of a step with `labels` that was built but not sent, for `reason`.
    pub fn record_skipped(&self, labels: &RequestLabels, reason: &str) {
        let key = SkipLabels {
            target: labels.target.clone(),
            serving_mode: labels.serving_mode.clone(),
            workload: labels.workload.clone(),
            reason: reason.to_owned(),
        };
        if self.requests_skipped.get(&key).is_none() {
            self.track(&key.target, |s| {
                s.skips.insert(key.clone());
            });
        }
        self.requests_skipped.get_or_create(&key).inc();
    }

    /// Counts a request whose completion tokens missed the requested OSL.
    pub fn record_osl_mismatch(&self, labels: &RequestLabels) {
        self.mode_series(&self.osl_mismatch, mode_labels(labels))
            .inc();
    }

    /// Counts a request whose client-side token count disagreed with `usage.completion_tokens`.
    pub fn record_token_count_mismatch(&self, labels: &RequestLabels) {
        self.mode_series(&self.token_count_mismatch, mode_labels(labels))
            .inc();
    }

    /// Observes the scheduling lag (the canary's own delay in sending, seconds) of one request.
    pub fn observe_schedule_lag(&self, target: &str, workload: &str, lag_seconds: f64) {
        self.observe_per_workload(&self.schedule_lag, target, workload, lag_seconds);
    }

    /// Observes the client-side queue time (intended → actual send, seconds) of one open-loop
    /// request: closed-loop and multi-turn requests have no arrival schedule to queue behind.
    pub fn observe_client_queue(&self, target: &str, workload: &str, queue_seconds: f64) {
        self.observe_per_workload(&self.client_queue, target, workload, queue_seconds);
    }

    fn observe_per_workload(
        &self,
        family: &Family<TargetWorkloadLabels, AtomicHistogram, SharedBuckets>,
        target: &str,
        workload: &str,
        seconds: f64,
    ) {
        let labels = TargetWorkloadLabels {
            target: target.to_owned(),
            workload: workload.to_owned(),
        };
        if let Some(h) = family.get(&labels) {
            h.observe(seconds);
            return;
        }
        let histogram = family.get_or_create_owned(&labels);
        self.track(target, |s| {
            s.lags.insert(labels);
        });
        histogram.observe(seconds);
    }

    /// Observes the time one new connection to `target` took to open.
    pub fn observe_connect(&self, target: &str, seconds: f64) {
        let labels = TargetLabels {
            target: target.to_owned(),
        };
        self.connect.get_or_create(&labels).observe(seconds);
    }

    /// Counts a request to `target` sent a second time, on a new connection, after the reused
    /// one it went out on was lost before any byte of an answer.
    pub fn record_connection_retry(&self, target: &str) {
        let labels = TargetLabels {
            target: target.to_owned(),
        };
        self.connection_retries.get_or_create(&labels).inc();
    }

    /// Moves `llm_canary_requests_in_flight{target}` by `delta` (1 at a send, -1 at its end).
    pub fn add_inflight(&self, target: &str, delta: i64) {
        self.inflight
            .get_or_create(&TargetLabels {
                target: target.to_owned(),
            })
            .inc_by(delta);
    }

    /// Sets `llm_canary_target_up`.
    pub fn set_target_up(&self, target: &str, up: bool) {
        self.target_up
            .get_or_create_owned(&TargetLabels {
                target: target.to_owned(),
            })
            .set(i64::from(up));
    }

    /// The quantiles exported for step gauges.
    fn step_quantiles(&self) -> &'static [(&'static str, usize)] {
        match self.resolution {
            Resolution::Standard => &STANDARD_STEP_QUANTILES,
            Resolution::High => &STEP_QUANTILES,
        }
    }

    /// Publishes a step's summary (docs/DESIGN.md §5) as the `llm_canary_step_*` gauges. A
    /// sub-step (a turn, an ISL bucket) gets the quantiles and rates; at the standard resolution
    /// only the step itself also gets the confidence intervals, end time and flags.
    pub fn set_step(&self, labels: &StepLabels, summary: &StepSummary) {
        let whole = self.resolution == Resolution::High || !labels.is_substep();
        let latency_gauges = [
            (&self.step_ttft, &self.step_ci[0], summary.ttft),
            (&self.step_itl, &self.step_ci[1], summary.itl),
            (
                &self.step_request_duration,
                &self.step_ci[2],
                summary.request_duration,
            ),
        ];
        for (family, (lower, upper), quantiles) in latency_gauges {
            for &(quantile, i) in self.step_quantiles() {
                let quantile_labels = StepQuantileLabels {
                    step: labels.clone(),
                    quantile: quantile.to_owned(),
                };
                let value = quantiles.map(|q| q.values()[i]);
                let (lo, hi) = match (whole, quantiles) {
                    (true, Some(q)) => q.ci[i],
                    _ => (None, None),
                };
                for (family, value) in [(family, value), (lower, lo), (upper, hi)] {
                    match value {
                        Some(v) => {
                            family.get_or_create_owned(&quantile_labels).set(v);
                        }
                        None => {
                            family.remove(&quantile_labels);
                        }
                    }
                }
            }
        }
        self.track(&labels.target, |s| {
            if !s.requests.contains(labels) {
                s.requests.insert(labels.clone());
            }
        });
        let plain = [
            (
                &self.step_output_tokens_per_second,
                Some(summary.output_tokens_per_second),
            ),
            (
                &self.step_requests_per_second,
                Some(summary.requests_per_second),
            ),
            (&self.step_goodput, Some(summary.goodput).filter(|_| whole)),
            (&self.step_error_ratio, Some(summary.error_ratio)),
            (&self.step_cache_hit_ratio, summary.cache_hit_ratio),
            (
                &self.step_cost_per_million_tokens,
                summary.cost_per_million_tokens_usd,
            ),
            (
                &self.step_end_timestamp,
                Some(summary.end_timestamp_seconds).filter(|_| whole),
            ),
        ];
        for (family, value) in plain {
            match value {
                Some(v) => {
                    self.request_series(family, labels).set(v);
                }
                None => {
                    family.remove(labels);
                }
            }
        }
        if whole {
            self.request_series(&self.step_degraded, labels)
                .set(i64::from(summary.degraded));
            self.request_series(&self.step_faulted, labels)
                .set(i64::from(summary.faulted));
            match summary.saturated {
                Some(s) => {
                    self.request_series(&self.step_saturated, labels)
                        .set(i64::from(s));
                }
                None => {
                    self.step_saturated.remove(labels);
                }
            }
        }
    }

    /// Records the outcome of a config load or reload (blackbox_exporter convention): success sets
    /// `..._successful` to 1 and the success timestamp to now; failure sets it to 0 and keeps the
    /// timestamp of the last good config.
    pub fn record_config_reload(&self, success: bool) {
        self.config_last_reload_successful.set(i64::from(success));
        if success {
            self.config_last_reload_success_timestamp
                .set(crate::clock::unix_now());
        }
    }

    /// Counts `n` clients the HTTP surface refused or cut off for `reason`; `n = 0` creates the
    /// series, so `rate()` has its starting point before the first refusal.
    pub fn record_http_refused(&self, reason: &str, n: u64) {
        let labels = ReasonLabels {
            reason: reason.to_owned(),
        };
        self.http_refused.get_or_create(&labels).inc_by(n);
    }

    /// Removes every series of `target` from every family: a target that left the config or the
    /// discovery must not keep exporting its last values.
    pub fn remove_target(&self, target: &str) {
        let series = {
            let mut tracked = self.tracked.lock().unwrap_or_else(PoisonError::into_inner);
            tracked.remove(target).unwrap_or_default()
        };
        for labels in &series.requests {
            for family in [&self.ttft, &self.itl, &self.request_duration] {
                family.remove(labels);
            }
            for family in [
                &self.prompt_tokens,
                &self.cached_tokens,
                &self.output_tokens,
            ] {
                family.remove(labels);
            }
            for family in [
                &self.step_output_tokens_per_second,
                &self.step_requests_per_second,
                &self.step_goodput,
                &self.step_error_ratio,
                &self.step_cache_hit_ratio,
                &self.step_cost_per_million_tokens,
                &self.step_end_timestamp,
            ] {
                family.remove(labels);
            }
            self.step_degraded.remove(labels);
            self.step_faulted.remove(labels);
            self.step_saturated.remove(labels);
            for (quantile, _) in STEP_QUANTILES {
                let quantile_labels = StepQuantileLabels {
                    step: labels.clone(),
                    quantile: quantile.to_owned(),
                };
                for family in [&self.step_ttft, &self.step_itl, &self.step_request_duration] {
                    family.remove(&quantile_labels);
                }
                for (lower, upper) in &self.step_ci {
                    lower.remove(&quantile_labels);
                    upper.remove(&quantile_labels);
                }
            }
        }
        for labels in &series.outcomes {
            self.requests.remove(labels);
        }
        for labels in &series.skips {
            self.requests_skipped.remove(labels);
        }
        for labels in &series.modes {
            self.osl_mismatch.remove(labels);
            self.token_count_mismatch.remove(labels);
            self.chunk_gap.remove(labels);
            self.reasoning.remove(labels);
        }
        for labels in &series.server_timing {
            self.server_ttft.remove(labels);
            self.server_queue.remove(labels);
            self.server_prefill.remove(labels);
        }
        for labels in &series.lags {
            self.schedule_lag.remove(labels);
            self.client_queue.remove(labels);
        }
        let labels = TargetLabels {
            target: target.to_owned(),
        };
        for family in [
            &self.server_prefix_cache_hit_ratio,
            &self.server_kv_cache_usage_ratio,
            &self.server_ttft_mean,
            &self.server_kvbm_host_cache_hit_ratio,
            &self.server_kvbm_disk_cache_hit_ratio,
        ] {
            family.remove(&labels);
        }
        self.server_scrape_errors.remove(&labels);
        self.server_preemptions.remove(&labels);
        self.server_cancellations.remove(&labels);
        self.server_kv_offload_blocks.remove(&labels);
        self.target_up.remove(&labels);
        self.connect.remove(&labels);
        self.connection_retries.remove(&labels);
        self.inflight.remove(&labels);
        self.probe_success.remove(&labels);
        let scope = ScopeLabels {
            scope: target.to_owned(),
        };
        self.budget_output_tokens.remove(&scope);
        self.budget_throttled.remove(&scope);
        for limit in ["max_inflight", "max_rps", "max_output_tokens_per_hour"] {
            self.budget_limit.remove(&ScopeLimitLabels {
                scope: target.to_owned(),
                limit: limit.to_owned(),
            });
        }
        for labels in &series.budget_steps {
            self.budget_steps.remove(labels);
        }
    }

    /// The OpenMetrics text exposition of every family, ending with `# EOF`, as the chunks that
    /// `/metrics` writes one after the other. The latency series (~95 % of the bytes) are their
    /// kept renderings, shared rather than copied, so a scrape copies only the rest.
    pub fn encode_chunks(&self) -> Result<Vec<Bytes>, MetricsError> {
        let mut chunks = Vec::with_capacity(self.last_chunk_count.load(Ordering::Relaxed) + 1);
        for family in [&self.ttft, &self.itl, &self.request_duration] {
            family.encode(&mut chunks);
        }
        let mut rest = String::new();
        prometheus_client::encoding::text::encode(&mut rest, &self.registry)?;
        chunks.push(Bytes::from(rest));
        self.last_chunk_count.store(chunks.len(), Ordering::Relaxed);
        Ok(chunks)
    }

    /// The exposition of [`Metrics::encode_chunks`] as one string.
    pub fn encode(&self) -> Result<String, MetricsError> {
        let chunks = self.encode_chunks()?;
        let mut bytes = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
        for chunk in &chunks {
            bytes.extend_from_slice(chunk);
        }
        // Every chunk is UTF-8 text, and so is their concatenation.
        Ok(String::from_utf8(bytes).expect("the exposition is UTF-8"))
    }

    /// The series of a request-labelled family, created (and tracked for `remove_target`) on first
    /// use. Tracking happens after creation, so the tracked sets always cover what exists.
    fn request_series<M, C>(
        &self,
        family: &Family<RequestLabels, M, C>,
        labels: &RequestLabels,
    ) -> M
    where
        M: Clone,
        C: MetricConstructor<M>,
    {
        if let Some(metric) = family.get(labels) {
            return (*metric).clone();
        }
        let metric = family.get_or_create_owned(labels);
        self.track(&labels.target, |s| {
            if !s.requests.contains(labels) {
                s.requests.insert(labels.clone());
            }
        });
        metric
    }

    fn histogram_series(&self, family: &LatencyFamily, labels: &RequestLabels) -> AtomicHistogram {
        if let Some(histogram) = family.get(labels) {
            return histogram;
        }
        let histogram = family.get_or_create(labels);
        self.track(&labels.target, |s| {
            if !s.requests.contains(labels) {
                s.requests.insert(labels.clone());
            }
        });
        histogram
    }

    fn outcome_series(&self, labels: &OutcomeLabels) -> Counter {
        if let Some(counter) = self.requests.get(labels) {
            return (*counter).clone();
        }
        let counter = self.requests.get_or_create_owned(labels);
        self.track(&labels.request.target, |s| {
            s.outcomes.insert(labels.clone());
        });
        counter
    }

    fn mode_series<M, C>(&self, family: &Family<ModeLabels, M, C>, labels: ModeLabels) -> M
    where
        M: Clone,
        C: MetricConstructor<M>,
    {
        if let Some(metric) = family.get(&labels) {
            return (*metric).clone();
        }
        let metric = family.get_or_create_owned(&labels);
        let target = labels.target.clone();
        self.track(&target, |s| {
            s.modes.insert(labels);
        });
        metric
    }

    pub(super) fn track(&self, target: &str, update: impl FnOnce(&mut TargetSeries)) {
        let mut tracked = self.tracked.lock().unwrap_or_else(PoisonError::into_inner);
        match tracked.get_mut(target) {
            Some(series) => update(series),
            None => update(tracked.entry(target.to_owned()).or_default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::config::ServingMode;
    use crate::export::testing::{agg, sample};
    use crate::model::{Quantiles, ServerSnapshot};
    use crate::request::Outcome;
    use crate::slo::{SloReading, SloState};

    #[test]
    fn threshold_is_an_exposed_bucket_bound() {
        let metrics = Metrics::new(&[2.0, 0.0333]);
        metrics.record_request(
            &agg("concurrency_sweep").with_concurrency(32),
            Phase::Steady,
            &Sample {
                outcome: Outcome::Ok,
                ttft: Some(0.0333),
                prompt_tokens: 1,
                output_tokens: 1,
                ..Sample::default()
            },
        );
        let text = metrics.encode().expect("encode");
        let labels = [("concurrency", "32"), ("le", "0.0333")];
        assert_eq!(
            sample(
                &text,
                "llm_canary_time_to_first_token_seconds_bucket",
                &labels
            ),
            Some(1.0)
        );
        assert!(text.contains("le=\"2.0\""));
    }

    #[test]
    fn record_request_fills_every_request_family() {
        let metrics = Metrics::new(&[]);
        let labels = agg("prefix_cache").with_prefix_ratio(0.25);
        metrics.record_request(
            &labels,
            Phase::Steady,
            &Sample {
                outcome: Outcome::Ok,
                ttft: Some(0.2),
                itl: Some(0.01),
                latency: 3.0,
                prompt_tokens: 100,
                cached_tokens: 40,
                output_tokens: 50,
                ..Sample::default()
            },
        );
        metrics.record_request(
            &labels,
            Phase::Steady,
            &Sample {
                outcome: Outcome::Timeout,
                latency: 30.0,
                ..Sample::default()
            },
        );
        metrics.record_chunk_gaps(&labels, &[(0.02, 2), (0.01, 1)]);
        let text = metrics.encode().expect("encode");
        let base = [("target", "agg"), ("prefix_ratio", "0.25"), ("turn", "")];
        let with = |extra: (&'static str, &'static str)| {
            let mut v = base.to_vec();
            v.push(extra);
            v
        };
        assert_eq!(
            sample(&text, "llm_canary_requests_total", &with(("outcome", "ok"))),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "llm_canary_requests_total",
                &with(("outcome", "timeout"))
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "llm_canary_prompt_tokens_total", &base),
            Some(100.0)
        );
        assert_eq!(
            sample(&text, "llm_canary_cached_tokens_total", &base),
            Some(40.0)
        );
        assert_eq!(
            sample(&text, "llm_canary_output_tokens_total", &base),
            Some(50.0)
        );
        assert_eq!(
            sample(&text, "llm_canary_time_to_first_token_seconds_count", &base),
            Some(1.0)
        );
        // The request duration is kept by workload at the standard resolution.
        let workload = [
            ("target", "agg"),
            ("workload", "prefix_cache"),
            ("prefix_ratio", ""),
        ];
        assert_eq!(
            sample(
                &text,
                "llm_canary_request_duration_seconds_count",
                &workload
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "llm_canary_request_duration_seconds_sum", &workload),
            Some(33.0)
        );
        // Two tokens of 10 ms plus one of 10 ms: three per-token gaps, labelled without the step.
        let mode = [("target", "agg"), ("workload", "prefix_cache")];
        assert_eq!(
            sample(&text, "llm_canary_chunk_gap_seconds_count", &mode),
            Some(3.0)
        );
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("llm_canary_chunk_gap") && l.contains("prefix_ratio"))
        );
        assert!(text.trim_end().ends_with("# EOF"));
    }

    #[test]
    fn slo_state_has_exactly_one_state_set() {
        let metrics = Metrics::new(&[]);
        let reading = |state| SloReading {
            state,
            value: Some(0.7),
            threshold: Some(0.8),
            value_lower: Some(0.6),
            value_upper: None,
        };
        metrics.set_slo("gain", &reading(SloState::Fail));
        metrics.set_slo("gain", &reading(SloState::Pass));
        let text = metrics.encode().expect("encode");
        let state = |s| {
            sample(
                &text,
                "llm_canary_slo_state",
                &[("slo", "gain"), ("state", s)],
            )
        };
        assert_eq!(state("pass"), Some(1.0));
        assert_eq!(state("fail"), Some(0.0));
        assert_eq!(state("insufficient_data"), Some(0.0));
        assert_eq!(
            sample(&text, "llm_canary_slo_threshold", &[("slo", "gain")]),
            Some(0.8)
        );
        assert_eq!(
            sample(&text, "llm_canary_slo_value_upper", &[("slo", "gain")]),
            None
        );
        assert_eq!(metrics.slo_state("gain"), Some(SloState::Pass));
        metrics.remove_slo("gain");
        let text = metrics.encode().expect("encode");
        assert!(!text.contains("slo=\"gain\""));
    }

    #[test]
    fn step_summary_sets_and_clears_gauges() {
        let metrics = Metrics::new(&[]);
        let step = agg("concurrency_sweep").with_concurrency(8);
        let mut summary = StepSummary {
            ttft: Some(Quantiles::new(0.1, 0.2, 0.4)),
            itl: None,
            request_duration: Some(Quantiles::new(1.0, 2.0, 3.0)),
            output_tokens_per_second: 900.0,
            requests_per_second: 4.0,
            goodput: 0.0,
            error_ratio: 0.0,
            cache_hit_ratio: Some(0.5),
            cost_per_million_tokens_usd: Some(20.2),
            end_timestamp_seconds: 1.7e9,
            degraded: true,
            faulted: false,
            saturated: None,
        };
        metrics.set_step(&step, &summary);
        let text = metrics.encode().expect("encode");
        let c8 = [("concurrency", "8")];
        assert_eq!(
            sample(
                &text,
                "llm_canary_step_ttft_seconds",
                &[("concurrency", "8"), ("quantile", "0.99")]
            ),
            Some(0.4)
        );
        assert_eq!(sample(&text, "llm_canary_step_itl_seconds", &c8), None);
        assert_eq!(sample(&text, "llm_canary_step_degraded", &c8), Some(1.0));
        assert_eq!(sample(&text, "llm_canary_step_faulted", &c8), Some(0.0));
        // A closed-loop step has no arrival schedule to fall behind: no saturation series.
        assert_eq!(sample(&text, "llm_canary_step_saturated", &c8), None);
        assert_eq!(
            sample(&text, "llm_canary_step_cost_per_million_tokens_usd", &c8),
            Some(20.2)
        );
        summary.ttft = None;
        summary.cost_per_million_tokens_usd = None;
        summary.degraded = false;
        summary.faulted = true;
        summary.saturated = Some(true);
        metrics.set_step(&step, &summary);
        let text = metrics.encode().expect("encode");
        assert_eq!(sample(&text, "llm_canary_step_ttft_seconds", &c8), None);
        assert_eq!(
            sample(&text, "llm_canary_step_cost_per_million_tokens_usd", &c8),
            None
        );
        assert_eq!(sample(&text, "llm_canary_step_degraded", &c8), Some(0.0));
        assert_eq!(sample(&text, "llm_canary_step_faulted", &c8), Some(1.0));
        assert_eq!(sample(&text, "llm_canary_step_saturated", &c8), Some(1.0));
    }

    #[test]
    fn the_resolution_decides_labels_buckets_quantiles_and_intervals() {
        let step = agg("multi_turn");
        let turn = step.clone().with_turn(2);
        let q = Quantiles {
            ci: [(Some(0.09), Some(0.11)), (None, None), (Some(0.3), None)],
            ..Quantiles::new(0.1, 0.2, 0.4)
        };
        let summary = StepSummary {
            ttft: Some(q),
            itl: None,
            request_duration: None,
            output_tokens_per_second: 1.0,
            requests_per_second: 1.0,
            goodput: 0.0,
            error_ratio: 0.0,
            cache_hit_ratio: None,
            cost_per_million_tokens_usd: None,
            end_timestamp_seconds: 1.7e9,
            degraded: false,
            faulted: false,
            saturated: None,
        };
        let series = |text: &str, prefix: &str| {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        for resolution in [Resolution::Standard, Resolution::High] {
            let high = resolution == Resolution::High;
            let metrics = Metrics::with_resolution(&[2.0], resolution);
            metrics.record_request(
                &turn,
                Phase::Steady,
                &Sample {
                    outcome: Outcome::Ok,
                    ttft: Some(0.2),
                    itl: Some(0.01),
                    latency: 3.0,
                    prompt_tokens: 10,
                    output_tokens: 5,
                    ..Sample::default()
                },
            );
            metrics.set_step(&step, &summary);
            metrics.set_step(&turn, &summary);
            let text = metrics.encode().expect("encode");
            let requests = series(&text, "llm_canary_requests_total{");
            assert_eq!(requests.len(), 1, "{requests:?}");
            assert_eq!(requests[0].contains("turn=\"2\""), high, "{resolution:?}");
            // TTFT: 11 grid bounds (2.0 is not on it) + the threshold + `+Inf` at standard.
            let buckets = series(&text, "llm_canary_time_to_first_token_seconds_bucket{");
            assert_eq!(buckets.len() == 13, !high, "{}", buckets.len());
            assert!(buckets.iter().any(|l| l.contains("le=\"2.0\"")));
            // The p90 gauge only at high; the intervals of a sub-step (a turn) only at high.
            let p90 = [("turn", ""), ("quantile", "0.9")];
            assert_eq!(
                sample(&text, "llm_canary_step_ttft_seconds", &p90).is_some(),
                high
            );
            let p50 = [("turn", ""), ("quantile", "0.5")];
            assert_eq!(
                sample(&text, "llm_canary_step_ttft_lower_seconds", &p50),
                Some(0.09)
            );
            assert_eq!(
                sample(&text, "llm_canary_step_ttft_upper_seconds", &p50),
                Some(0.11)
            );
            // A side the samples cannot bound is absent.
            let p99 = [("turn", ""), ("quantile", "0.99")];
            assert_eq!(
                sample(&text, "llm_canary_step_ttft_upper_seconds", &p99),
                None
            );
            let turn_p50 = [("turn", "2"), ("quantile", "0.5")];
            assert_eq!(
                sample(&text, "llm_canary_step_ttft_seconds", &turn_p50),
                Some(0.1)
            );
            assert_eq!(
                sample(&text, "llm_canary_step_ttft_lower_seconds", &turn_p50).is_some(),
                high
            );
        }
    }

    #[test]
    fn server_counters_mirror_increase_across_server_restart() {
        let metrics = Metrics::new(&[]);
        let snap = |p: f64| ServerSnapshot {
            preemptions_total: Some(p),
            kv_cache_usage_ratio: Some(0.3),
            ..ServerSnapshot::default()
        };
        metrics.set_server("agg", &snap(10.0));
        metrics.set_server("agg", &snap(15.0));
        metrics.set_server("agg", &snap(2.0)); // the server restarted
        let text = metrics.encode().expect("encode");
        let t = [("target", "agg")];
        assert_eq!(
            sample(&text, "llm_canary_server_preemptions_total", &t),
            Some(17.0)
        );
        assert_eq!(
            sample(&text, "llm_canary_server_kv_cache_usage_ratio", &t),
            Some(0.3)
        );
        // The snapshots carried no offload count (vLLM without KVBM has none): no series, not a
        // zero.
        assert_eq!(
            sample(&text, "llm_canary_server_kv_offload_blocks_total", &t),
            None
        );
        metrics.set_server(
            "agg",
            &ServerSnapshot {
                kv_offload_blocks_total: Some(4.0),
                ..ServerSnapshot::default()
            },
        );
        let text = metrics.encode().expect("encode");
        assert_eq!(
            sample(&text, "llm_canary_server_kv_offload_blocks_total", &t),
            Some(4.0)
        );
        assert!(
            text.contains("# UNIT llm_canary_server_kv_offload_blocks blocks\n"),
            "{text}"
        );
        assert_eq!(
            sample(&text, "llm_canary_server_preemptions_total", &t),
            Some(17.0),
            "a snapshot without preemptions leaves them as they were"
        );
    }

    #[test]
    fn remove_target_removes_only_that_target() {
        for resolution in [Resolution::Standard, Resolution::High] {
            remove_target_at(resolution);
        }
    }

    fn remove_target_at(resolution: Resolution) {
        let metrics = Metrics::with_resolution(&[], resolution);
        let disagg =
            RequestLabels::new("disagg", ServingMode::Disaggregated, "multi_turn").with_turn(2);
        for labels in [agg("multi_turn").with_turn(2), disagg.clone()] {
            metrics.record_request(
                &labels,
                Phase::Steady,
                &Sample {
                    outcome: Outcome::Ok,
                    ttft: Some(0.1),
                    itl: Some(0.01),
                    latency: 1.0,
                    prompt_tokens: 10,
                    output_tokens: 10,
                    ..Sample::default()
                },
            );
            metrics.record_request(
                &labels,
                Phase::Steady,
                &Sample {
                    outcome: Outcome::Http5xx,
                    latency: 0.1,
                    ..Sample::default()
                },
            );
            metrics.record_osl_mismatch(&labels);
            metrics.record_token_count_mismatch(&labels);
            metrics.record_chunk_gaps(&labels, &[(0.01, 1)]);
            metrics.observe_schedule_lag(&labels.target, &labels.workload, 0.001);
            metrics.set_target_up(&labels.target, true);
            metrics.set_server(
                &labels.target,
                &ServerSnapshot {
                    kv_offload_blocks_total: Some(3.0),
                    ..ServerSnapshot::default()
                },
            );
            metrics.set_step(
                &labels,
                &StepSummary {
                    ttft: Some(Quantiles::new(0.1, 0.1, 0.1)),
                    itl: Some(Quantiles::new(0.1, 0.1, 0.1)),
                    request_duration: Some(Quantiles::new(0.1, 0.1, 0.1)),
                    output_tokens_per_second: 1.0,
                    requests_per_second: 1.0,
                    goodput: 0.0,
                    error_ratio: 0.5,
                    cache_hit_ratio: Some(0.0),
                    cost_per_million_tokens_usd: Some(1.0),
                    end_timestamp_seconds: 1.0,
                    degraded: false,
                    faulted: false,
                    saturated: Some(false),
                },
            );
            metrics.add_inflight(&labels.target, 1);
            metrics.add_inflight(&labels.target, -1);
            metrics.record_connection_retry(&labels.target);
        }
        let before = metrics.encode().expect("encode");
        let agg_lines = before
            .lines()
            .filter(|l| l.contains("target=\"agg\""))
            .count();
        let disagg_lines = before
            .lines()
            .filter(|l| l.contains("target=\"disagg\""))
            .count();
        assert_eq!(agg_lines, disagg_lines);
        let buckets = metrics.latency_bounds().len();
        assert!(agg_lines > 2 * buckets, "only {agg_lines} agg lines");

        metrics.remove_target("agg");
        let after = metrics.encode().expect("encode");
        assert_eq!(
            after
                .lines()
                .filter(|l| l.contains("target=\"agg\""))
                .count(),
            0
        );
        assert_eq!(
            after
                .lines()
                .filter(|l| l.contains("target=\"disagg\""))
                .count(),
            disagg_lines
        );
        // A target that comes back starts from zero.
        metrics.record_request(
            &agg("multi_turn").with_turn(2),
            Phase::Steady,
            &Sample {
                outcome: Outcome::Ok,
                prompt_tokens: 1,
                output_tokens: 1,
                ..Sample::default()
            },
        );
        let again = metrics.encode().expect("encode");
        assert_eq!(
            sample(
                &again,
                "llm_canary_requests_total",
                &[("target", "agg"), ("outcome", "http_5xx")]
            ),
            None
        );
    }

    #[test]
    fn connection_retries_count_per_target() {
        let metrics = Metrics::new(&[]);
        let retries = |m: &Metrics, target| {
            sample(
                &m.encode().expect("encode"),
                "llm_canary_connection_retries_total",
                &[("target", target)],
            )
        };
        assert_eq!(retries(&metrics, "agg"), None, "no series before a retry");
        metrics.record_connection_retry("agg");
        metrics.record_connection_retry("agg");
        metrics.record_connection_retry("disagg");
        assert_eq!(retries(&metrics, "agg"), Some(2.0));
        assert_eq!(retries(&metrics, "disagg"), Some(1.0));
    }

    #[test]
    fn inflight_moves_by_delta() {
        let metrics = Metrics::new(&[]);
        metrics.add_inflight("agg", 1);
        metrics.add_inflight("agg", 1);
        let gauge = || {
            sample(
                &metrics.encode().expect("encode"),
                "llm_canary_inflight_requests",
                &[("target", "agg")],
            )
        };
        assert_eq!(gauge(), Some(2.0));
        metrics.add_inflight("agg", -1);
        assert_eq!(gauge(), Some(1.0));
        metrics.add_inflight("agg", -1);
        assert_eq!(gauge(), Some(0.0));
    }

    #[test]
    fn reload_failure_keeps_last_success_timestamp() {
        let metrics = Metrics::new(&[]);
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        metrics.record_config_reload(true);
        metrics.record_config_reload(false);
        let text = metrics.encode().expect("encode");
        assert_eq!(
            sample(&text, "llm_canary_config_last_reload_successful", &[]),
            Some(0.0)
        );
        let ts = sample(
            &text,
            "llm_canary_config_last_reload_success_timestamp_seconds",
            &[],
        )
        .expect("ts");
        assert!(ts >= before.floor(), "{ts} < {before}");
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            sample(&text, "llm_canary_build_info", &[("version", version)]),
            Some(1.0)
        );
    }
}
