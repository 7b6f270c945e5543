//! What a finished step carries: its result per target and label set, the summary exported as
//! `llm_canary_step_*`, and what the servers' own metrics said about it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::measure::step::{Spread, StepMeasurements};
use crate::request::RequestLabels;

/// The result of one step for one target and label set (docs/DESIGN.md §5).
#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    pub cycle: u64,
    /// `concurrency_sweep concurrency=32`.
    pub step: String,
    /// The step's labels (its target, serving mode, workload and the step labels that apply),
    /// written out as `target`, `serving_mode`, `workload` and a `labels` map of the rest.
    #[serde(flatten, serialize_with = "labels_json")]
    pub labels: RequestLabels,
    /// True for the per-target total of a step whose requests carry several label sets
    /// (multi-turn turns, ISL buckets); false for one label set.
    pub total: bool,
    pub started_unix: f64,
    pub ended_unix: f64,
    pub steady_seconds: f64,
    #[serde(flatten)]
    pub measurements: StepMeasurements,
    /// What the server's own metrics said about the step, where they are scraped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerStep>,
    /// The connections the step opened to the target; `None` when it opened none it could time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<StepConnections>,
}

/// A step's labels as `summary.json` has them: the three that name the series at the top, the
/// step labels that apply in a map.
fn labels_json<S: serde::Serializer>(l: &RequestLabels, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let step: BTreeMap<&str, &str> = l.step_pairs().collect();
    let mut map = s.serialize_map(Some(4))?;
    map.serialize_entry("target", &l.target)?;
    map.serialize_entry("serving_mode", &l.serving_mode)?;
    map.serialize_entry("workload", &l.workload)?;
    map.serialize_entry("labels", &step)?;
    map.end()
}

impl StepResult {
    /// The summary exported as `llm_canary_step_*`.
    pub fn summary(&self) -> StepSummary {
        let m = &self.measurements;
        StepSummary {
            ttft: m.ttft.map(Quantiles::of),
            itl: m.itl.map(Quantiles::of),
            request_duration: m.latency.map(Quantiles::of),
            output_tokens_per_second: m.output_tokens_per_second,
            requests_per_second: m.requests_per_second,
            goodput: m.goodput,
            error_ratio: m.error_ratio,
            cache_hit_ratio: m.cache_hit_ratio,
            cost_per_million_tokens_usd: m.cost_per_million_tokens_usd,
            end_timestamp_seconds: self.ended_unix,
            degraded: m.degraded,
            faulted: m.faulted,
            saturated: m.arrivals.map(|_| m.saturated),
        }
    }
}

/// p50, p90 and p99 of one latency over a step, with their 95 % confidence intervals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    /// (lower, upper) of p50, p90 and p99; a side the samples cannot bound is `None`.
    pub ci: [(Option<f64>, Option<f64>); 3],
}

impl Quantiles {
    /// Quantiles without intervals.
    pub fn new(p50: f64, p90: f64, p99: f64) -> Quantiles {
        Quantiles {
            p50,
            p90,
            p99,
            ci: [(None, None); 3],
        }
    }

    /// The p50, p90 and p99 of a step's spread.
    pub fn of(s: Spread) -> Quantiles {
        Quantiles {
            p50: s.p50,
            p90: s.p90,
            p99: s.p99,
            ci: [s.p50_ci, s.p90_ci, s.p99_ci],
        }
    }

    pub fn values(self) -> [f64; 3] {
        [self.p50, self.p90, self.p99]
    }
}

/// A step's summary over its steady window (docs/DESIGN.md §5), exported as `llm_canary_step_*`. A `None`
/// removes the series, so a step without samples does not keep the previous cycle's value.
#[derive(Clone, Debug, PartialEq)]
pub struct StepSummary {
    pub ttft: Option<Quantiles>,
    pub itl: Option<Quantiles>,
    pub request_duration: Option<Quantiles>,
    pub output_tokens_per_second: f64,
    pub requests_per_second: f64,
    /// Good requests per second (within the target's goodput limits).
    pub goodput: f64,
    pub error_ratio: f64,
    pub cache_hit_ratio: Option<f64>,
    pub cost_per_million_tokens_usd: Option<f64>,
    /// Unix time of the end of the step's window.
    pub end_timestamp_seconds: f64,
    /// Schedule lag p99 exceeded its limit: the step measured the canary, not the server.
    pub degraded: bool,
    /// Too many requests failed for the step's latencies to describe the server
    /// (`measure::step::FAULTED_ERROR_RATIO`).
    pub faulted: bool,
    /// An open-loop step's server fell behind its arrivals (`measure::arrivals`); `None` for
    /// closed-loop and multi-turn steps, which set their own pace (the series is left out).
    pub saturated: Option<bool>,
}

/// What one scrape of a target's own `/metrics` yielded; `None` leaves a series untouched.
/// Counter totals are the server's cumulative values; the canary mirrors their increase.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerSnapshot {
    pub prefix_cache_hit_ratio: Option<f64>,
    pub kv_cache_usage_ratio: Option<f64>,
    pub preemptions_total: Option<f64>,
    /// Requests the server saw cancelled by their client (`scrape::ServerTotals::cancellations`).
    pub cancellations_total: Option<f64>,
    /// KVBM's `kvbm_offload_blocks_d2h`: KV blocks offloaded from GPU to host memory (see
    /// `scrape::ServerTotals::kv_offload_blocks`).
    pub kv_offload_blocks_total: Option<f64>,
    pub ttft_mean_seconds: Option<f64>,
}

/// What the server said about one step (docs/DESIGN.md §5 "where scraped"): counter deltas between a
/// scrape at the step's start and one at its end (warmup and drain included, as the server cannot
/// tell them apart), and KV usage over every scrape taken in between.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerStep {
    /// Δ`vllm:prefix_cache_hits_total` / Δ`vllm:prefix_cache_queries_total`.
    pub prefix_cache_hit_ratio: Option<f64>,
    /// Mean and peak of the KV cache usage (0..1) over the step's scrapes.
    pub kv_cache_usage_mean: Option<f64>,
    pub kv_cache_usage_max: Option<f64>,
    /// Δ`vllm:num_preemptions_total` during the step, and per second.
    pub preemptions: Option<f64>,
    pub preemptions_per_second: Option<f64>,
    /// Requests the server counted as cancelled by their client during the step (Dynamo's
    /// `dynamo_component_cancellation_total`): beside the canary's own `cancelled` count, it
    /// shows whether the server noticed.
    pub cancellations: Option<f64>,
    /// Δ`kvbm_offload_blocks_d2h` during the step, and per second: KV blocks offloaded from GPU
    /// to host memory (`scrape::ServerTotals::kv_offload_blocks`; not evictions); `None` for a server
    /// without KVBM.
    pub kv_offload_blocks: Option<f64>,
    pub kv_offload_blocks_per_second: Option<f64>,
    /// Δ`dynamo_frontend_time_to_first_token_seconds_sum` / Δ`_count`: the server's own TTFT.
    pub ttft_mean_seconds: Option<f64>,
    /// KVBM tier hit rates at the step's end (KVBM computes them over its own sliding window).
    pub kvbm_host_cache_hit_ratio: Option<f64>,
    pub kvbm_disk_cache_hit_ratio: Option<f64>,
    /// Successful scrapes of the target during the step, both ends included.
    pub scrapes: u32,
}

/// The connections a step opened to one target (TCP connect and any TLS handshake): before its clock started (a closed-loop
/// step opens one per worker) and for requests that found none idle. The connect time is the
/// server's and the network's own figure, kept apart from TTFT (docs/METRICS.md "Connections").
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepConnections {
    pub opened: u64,
    pub connect_p50_seconds: f64,
    pub connect_p99_seconds: f64,
    pub connect_max_seconds: f64,
}

impl StepConnections {
    /// The summary of these connect times; `None` for none.
    pub fn of(mut times: Vec<std::time::Duration>) -> Option<Self> {
        if times.is_empty() {
            return None;
        }
        times.sort_unstable();
        let n = times.len() as u64;
        let rank =
            |q: f64| times[(crate::measure::stats::point_rank(n, q) - 1) as usize].as_secs_f64();
        Some(Self {
            opened: times.len() as u64,
            connect_p50_seconds: rank(0.5),
            connect_p99_seconds: rank(0.99),
            connect_max_seconds: rank(1.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn connections_summarise_by_nearest_rank() {
        assert_eq!(StepConnections::of(Vec::new()), None);
        let ms = |n| Duration::from_millis(n);
        let times: Vec<Duration> = (1..=100).rev().map(ms).collect();
        let c = StepConnections::of(times).unwrap();
        assert_eq!(c.opened, 100);
        assert_eq!(c.connect_p50_seconds, 0.05);
        assert_eq!(c.connect_p99_seconds, 0.099);
        assert_eq!(c.connect_max_seconds, 0.1);
        let one = StepConnections::of(vec![ms(3)]).unwrap();
        assert_eq!(
            (one.opened, one.connect_p50_seconds, one.connect_max_seconds),
            (1, 0.003, 0.003)
        );
    }

    #[test]
    fn a_result_writes_its_labels_as_summary_json_has_them() {
        let labels = RequestLabels::new(
            "agg",
            crate::request::ServingMode::Aggregated,
            "prefix_cache",
        )
        .with_prefix_ratio(0.25);
        let result = StepResult {
            cycle: 1,
            step: "prefix_cache prefix_ratio=0.25".into(),
            labels,
            total: false,
            started_unix: 0.0,
            ended_unix: 1.0,
            steady_seconds: 1.0,
            measurements: crate::measure::step::StepAccumulator::default().finish(
                std::time::Duration::from_secs(1),
                None,
                std::time::Duration::from_millis(50),
            ),
            server: None,
            connections: None,
        };
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(json["target"], "agg");
        assert_eq!(json["serving_mode"], "aggregated");
        assert_eq!(json["workload"], "prefix_cache");
        assert_eq!(json["labels"], serde_json::json!({"prefix_ratio": "0.25"}));
        assert_eq!(json["step"], "prefix_cache prefix_ratio=0.25");
    }
}
