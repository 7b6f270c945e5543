//! Samples of a Prometheus or OpenMetrics text exposition (the daemon's, the simulator's or a
//! serving engine's `/metrics`), looked up by name and label pairs with the crate's own parser
//! (`llm_canary::promtext`), a line of that name that does not parse failing the test; and the
//! families the daemon's exposition has.

pub use llm_canary::promtext::Sample;
use llm_canary::promtext::{lines_named, parse_line};

/// Every sample of `name` in `text` (exactly that name: `x_total` is not `x`), in order; a line
/// of that name that does not parse as a sample panics (a broken exposition).
pub fn samples_of<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = Sample<'a>> {
    lines_named(text, name)
        .map(|l| parse_line(l).unwrap_or_else(|| panic!("malformed sample line: {l}")))
}

/// The value of the first sample of `name` that has every `k="v"` of `labels`.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples_of(text, name)
        .find(|s| s.has(labels))
        .map(|s| s.value)
}

/// The sum of the samples of `name` that have every `k="v"` of `labels` (0 without any).
pub fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples_of(text, name)
        .filter(|s| s.has(labels))
        .map(|s| s.value)
        .sum()
}

/// The families every daemon exposition has after traffic, with their OpenMetrics type
/// (docs/DESIGN.md §6 and the export extensions documented in docs/METRICS.md).
pub const FAMILIES: &[(&str, &str)] = &[
    ("llm_canary_time_to_first_token_seconds", "histogram"),
    ("llm_canary_inter_token_latency_seconds", "histogram"),
    ("llm_canary_request_duration_seconds", "histogram"),
    ("llm_canary_chunk_gap_seconds", "histogram"),
    ("llm_canary_schedule_lag_seconds", "histogram"),
    ("llm_canary_requests", "counter"),
    ("llm_canary_prompt_tokens", "counter"),
    ("llm_canary_cached_tokens", "counter"),
    ("llm_canary_output_tokens", "counter"),
    ("llm_canary_step_ttft_seconds", "gauge"),
    ("llm_canary_step_itl_seconds", "gauge"),
    ("llm_canary_step_request_duration_seconds", "gauge"),
    ("llm_canary_step_output_tokens_per_second", "gauge"),
    ("llm_canary_step_requests_per_second", "gauge"),
    ("llm_canary_step_goodput_requests_per_second", "gauge"),
    ("llm_canary_step_error_ratio", "gauge"),
    ("llm_canary_step_cache_hit_ratio", "gauge"),
    ("llm_canary_step_cost_per_million_tokens_usd", "gauge"),
    ("llm_canary_step_end_timestamp_seconds", "gauge"),
    ("llm_canary_step_degraded", "gauge"),
    ("llm_canary_step_faulted", "gauge"),
    ("llm_canary_server_prefix_cache_hit_ratio", "gauge"),
    ("llm_canary_server_kv_cache_usage_ratio", "gauge"),
    ("llm_canary_server_preemptions", "counter"),
    ("llm_canary_server_cancellations", "counter"),
    ("llm_canary_server_ttft_mean_seconds", "gauge"),
    ("llm_canary_target_up", "gauge"),
    ("llm_canary_inflight_requests", "gauge"),
    ("llm_canary_build", "info"),
    ("llm_canary_config_last_reload_successful", "gauge"),
    (
        "llm_canary_config_last_reload_success_timestamp_seconds",
        "gauge",
    ),
    ("llm_canary_paused", "gauge"),
    ("llm_canary_http_refused", "counter"),
];

/// Families the encoder writes only once they have a series: counted events that traffic may not
/// produce (mismatches, scrape errors, budget actions), the KVBM-fed series (simulators without
/// KVBM tiers have none, and the simulator no KVBM hit rates), the SLO families (with the first
/// evaluated SLO) and the budget's use (after the first step). Typed as here when present.
pub const LATE_FAMILIES: &[(&str, &str)] = &[
    // Connect times, once a connection to an `http://` target was opened (TLS ones are not
    // timed).
    ("llm_canary_connect_seconds", "histogram"),
    // Requests sent again after a reused connection was lost before any answer.
    ("llm_canary_connection_retries", "counter"),
    // The server's own timing, from servers that send Dynamo's `nvext.timing`.
    ("llm_canary_server_ttft_seconds", "histogram"),
    ("llm_canary_server_queue_seconds", "histogram"),
    ("llm_canary_server_prefill_seconds", "histogram"),
    ("llm_canary_osl_mismatch", "counter"),
    ("llm_canary_client_token_count_mismatch", "counter"),
    ("llm_canary_server_kv_offload_blocks", "counter"),
    ("llm_canary_server_kvbm_host_cache_hit_ratio", "gauge"),
    ("llm_canary_server_kvbm_disk_cache_hit_ratio", "gauge"),
    ("llm_canary_server_scrape_errors", "counter"),
    ("llm_canary_slo_state", "gauge"),
    ("llm_canary_slo_value", "gauge"),
    ("llm_canary_slo_threshold", "gauge"),
    ("llm_canary_slo_value_lower", "gauge"),
    ("llm_canary_slo_value_upper", "gauge"),
    ("llm_canary_slo_data_age_seconds", "gauge"),
    ("llm_canary_budget_steps", "counter"),
    ("llm_canary_budget_throttled_requests", "counter"),
    ("llm_canary_budget_output_tokens_last_hour", "gauge"),
    ("llm_canary_budget_limit", "gauge"),
    ("llm_canary_probe_success", "gauge"),
    // A side of a step quantile's interval exists once a step had enough samples to bound it.
    ("llm_canary_step_ttft_lower_seconds", "gauge"),
    ("llm_canary_step_ttft_upper_seconds", "gauge"),
    ("llm_canary_step_itl_lower_seconds", "gauge"),
    ("llm_canary_step_itl_upper_seconds", "gauge"),
    ("llm_canary_step_request_duration_lower_seconds", "gauge"),
    ("llm_canary_step_request_duration_upper_seconds", "gauge"),
];
