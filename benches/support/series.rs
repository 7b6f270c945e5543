//! The "full series set" the scrape benchmarks measure: the default plan's step label sets on
//! two targets with every outcome, step gauges, server and SLO series. Included by
//! `benches/hot_paths.rs` and `benches/scrape.rs` so both time the same exposition.

use llm_canary::config::ServingMode;
use llm_canary::export::metrics::Metrics;
use llm_canary::model::Phase;
use llm_canary::model::{Quantiles, ServerSnapshot, StepSummary};
use llm_canary::request::RequestLabels;
use llm_canary::request::{Outcome, Sample};
use llm_canary::slo::{SloReading, SloState};

pub const TARGETS: [(&str, ServingMode); 2] = [
    ("sim-agg", ServingMode::Aggregated),
    ("sim-disagg", ServingMode::Disaggregated),
];

/// The step label sets of the default plan (docs/DESIGN.md §3/§5) for one target.
pub fn step_labels(target: &str, mode: ServingMode) -> Vec<RequestLabels> {
    let mut steps = Vec::new();
    for level in [1, 2, 4, 8, 16, 32, 64] {
        steps.push(RequestLabels::new(target, mode, "concurrency_sweep").with_concurrency(level));
    }
    for turn in 1..=5 {
        steps.push(RequestLabels::new(target, mode, "multi_turn").with_turn(turn));
    }
    for distribution in ["uniform", "zipf", "lognormal"] {
        for isl_bucket in [128, 256, 512, 1024, 2048, 4096] {
            steps.push(
                RequestLabels::new(target, mode, "sequence_distribution")
                    .with_distribution(distribution, isl_bucket),
            );
        }
    }
    for ratio in [0.0, 0.25, 0.5, 0.75, 1.0] {
        steps.push(RequestLabels::new(target, mode, "prefix_cache").with_prefix_ratio(ratio));
    }
    steps
}

/// Fills `metrics` with the full series set of the default plan on two targets (every outcome,
/// step gauges, server and SLO series) and returns the request label sets created.
pub fn fill(metrics: &Metrics) -> usize {
    let mut label_sets = 0;
    for (target, mode) in TARGETS {
        for labels in step_labels(target, mode) {
            label_sets += 1;
            for (i, outcome) in Outcome::ALL.iter().enumerate() {
                let scale = 1.0 + i as f64;
                let sample = Sample {
                    outcome: *outcome,
                    ttft: Some(0.05 * scale),
                    itl: Some(0.01 * scale),
                    latency: 2.0 * scale,
                    prompt_tokens: 1024,
                    cached_tokens: 256,
                    output_tokens: 512,
                    ..Sample::default()
                };
                metrics.record_request(&labels, Phase::Steady, &sample);
            }
            metrics.record_chunk_gaps(&labels, &[(0.02, 1), (0.04, 2)]);
            metrics.record_osl_mismatch(&labels);
            metrics.record_token_count_mismatch(&labels);
            metrics.observe_schedule_lag(target, &labels.workload, 0.0002);
            let q = Quantiles::new(0.1, 0.2, 0.4);
            metrics.set_step(
                &labels,
                &StepSummary {
                    ttft: Some(q),
                    itl: Some(q),
                    request_duration: Some(q),
                    output_tokens_per_second: 1000.0,
                    requests_per_second: 2.0,
                    goodput: 1.8,
                    error_ratio: 0.01,
                    cache_hit_ratio: Some(0.3),
                    cost_per_million_tokens_usd: Some(18.0),
                    end_timestamp_seconds: 1.75e9,
                    degraded: false,
                    faulted: false,
                    saturated: None,
                },
            );
        }
        metrics.set_target_up(target, true);
        metrics.add_inflight(target, 1);
        metrics.set_server(
            target,
            &ServerSnapshot {
                prefix_cache_hit_ratio: Some(0.4),
                kv_cache_usage_ratio: Some(0.6),
                preemptions_total: Some(1.0),
                cancellations_total: Some(0.0),
                kv_offload_blocks_total: Some(2.0),
                ttft_mean_seconds: Some(0.2),
            },
        );
    }
    for slo in 0..8 {
        metrics.set_slo(
            &format!("slo-{slo}"),
            &SloReading {
                state: SloState::Pass,
                value: Some(0.5),
                threshold: Some(1.0),
                value_lower: Some(0.4),
                value_upper: Some(0.6),
            },
        );
    }
    metrics.record_config_reload(true);
    label_sets
}
