//! The registration of every Prometheus family of [`Metrics`] under its contract name
//! (docs/DESIGN.md §6), in the order `/metrics` lists them: one list a reader can check against
//! the contract.

use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Unit;

use super::labels::VersionLabels;
use super::metrics::Metrics;

impl Metrics {
    /// Registers every family under its contract name (docs/DESIGN.md §6). Counters are registered without
    /// `_total`, which the encoder appends; `Unit::Seconds` appends `_seconds` and emits `# UNIT`.
    pub(super) fn register(mut self) -> Self {
        self.register_requests();
        self.register_step_quantiles();
        self.register_step_gauges();
        self.register_servers();
        self.register_slos();
        self.register_canary();
        self.register_budget();
        self
    }

    /// The per-request families: the server's own timing, outcomes and token counts.
    fn register_requests(&mut self) {
        let r = &mut self.registry;
        let s = || Unit::Seconds;
        // TTFT, ITL and request duration encode themselves (`LatencyFamily`), ahead of these.
        r.register_with_unit(
            "llm_canary_chunk_gap",
            "Per-token gap between content chunks; a chunk of k tokens counts gap/k, k times",
            s(),
            self.chunk_gap.clone(),
        );
        r.register_with_unit(
            "llm_canary_server_ttft",
            "The server's own TTFT of successful requests (Dynamo nvext.timing.ttft_ms; in disaggregated serving the prefill worker's first token)",
            s(),
            self.server_ttft.clone(),
        );
        r.register_with_unit(
            "llm_canary_server_queue",
            "Time successful requests waited for prefill at the server (Dynamo nvext.timing.prefill_wait_time_ms)",
            s(),
            self.server_queue.clone(),
        );
        r.register_with_unit(
            "llm_canary_server_prefill",
            "Prefill time of successful requests at the server (Dynamo nvext.timing.prefill_time_ms)",
            s(),
            self.server_prefill.clone(),
        );
        self.register_reasoning();
        let r = &mut self.registry;
        r.register(
            "llm_canary_requests",
            "Requests by outcome: ok or an error kind",
            self.requests.clone(),
        );
        r.register(
            "llm_canary_requests_skipped",
            "Requests built but not sent, by reason (context_length: prompt plus max_tokens above the target's context bound); never errors of the server",
            self.requests_skipped.clone(),
        );
        r.register(
            "llm_canary_prompt_tokens",
            "Prompt tokens reported in usage",
            self.prompt_tokens.clone(),
        );
        r.register(
            "llm_canary_cached_tokens",
            "Prompt tokens served from the prefix cache (usage.prompt_tokens_details.cached_tokens, or Dynamo's nvext.timing.kv_hit_rate x prompt tokens where usage reports none)",
            self.cached_tokens.clone(),
        );
        r.register(
            "llm_canary_output_tokens",
            "Completion tokens reported in usage",
            self.output_tokens.clone(),
        );
        r.register(
            "llm_canary_osl_mismatch",
            "Requests whose completion tokens missed the requested OSL by more than min(5 %, 50)",
            self.osl_mismatch.clone(),
        );
        r.register(
            "llm_canary_client_token_count_mismatch",
            "Requests whose client-side token count disagreed with usage.completion_tokens",
            self.token_count_mismatch.clone(),
        );
    }

    /// A reasoning model's successful requests (docs/METRICS.md, "Reasoning"): the times to the
    /// first token of each kind, the reasoning time between them, and the tokens of each kind.
    fn register_reasoning(&mut self) {
        let r = &mut self.registry;
        let f = &self.reasoning;
        r.register_with_unit(
            "llm_canary_time_to_first_reasoning_token",
            "Time from the intended send to the first reasoning token (delta.reasoning_content or delta.reasoning) of successful requests that reasoned",
            Unit::Seconds,
            f.first_reasoning_token.clone(),
        );
        r.register_with_unit(
            "llm_canary_time_to_first_answer_token",
            "Time from the intended send to the first answer token (delta.content) of successful requests that reasoned",
            Unit::Seconds,
            f.first_answer_token.clone(),
        );
        r.register_with_unit(
            "llm_canary_reasoning_time",
            "First answer token minus first reasoning token of successful requests that reasoned",
            Unit::Seconds,
            f.reasoning_time.clone(),
        );
        r.register(
            "llm_canary_reasoning_tokens",
            "Reasoning tokens per successful request that reasoned, as the client counted them",
            f.reasoning_tokens.clone(),
        );
        r.register(
            "llm_canary_answer_tokens",
            "Answer tokens per successful request that reasoned: output tokens less reasoning tokens",
            f.answer_tokens.clone(),
        );
    }

    /// The per-step latency quantiles (`llm_canary_step_*`), with their confidence intervals.
    fn register_step_quantiles(&mut self) {
        let r = &mut self.registry;
        let s = || Unit::Seconds;
        r.register_with_unit(
            "llm_canary_step_ttft",
            "TTFT quantile over the step's steady window",
            s(),
            self.step_ttft.clone(),
        );
        r.register_with_unit(
            "llm_canary_step_itl",
            "ITL quantile over the step's steady window",
            s(),
            self.step_itl.clone(),
        );
        r.register_with_unit(
            "llm_canary_step_request_duration",
            "Request duration quantile over the step's steady window",
            s(),
            self.step_request_duration.clone(),
        );
        for (name, (lower, upper)) in [
            "llm_canary_step_ttft",
            "llm_canary_step_itl",
            "llm_canary_step_request_duration",
        ]
        .iter()
        .zip(&self.step_ci)
        {
            r.register_with_unit(
                format!("{name}_lower"),
                "Lower bound of the 95 % confidence interval of the step quantile",
                s(),
                lower.clone(),
            );
            r.register_with_unit(
                format!("{name}_upper"),
                "Upper bound of the 95 % confidence interval of the step quantile",
                s(),
                upper.clone(),
            );
        }
    }

    /// The per-step gauges of throughput, errors, cache, cost and the step's flags.
    fn register_step_gauges(&mut self) {
        let r = &mut self.registry;
        let s = || Unit::Seconds;
        r.register(
            "llm_canary_step_output_tokens_per_second",
            "Output tokens per second over the step's steady window",
            self.step_output_tokens_per_second.clone(),
        );
        r.register(
            "llm_canary_step_requests_per_second",
            "Completed requests per second over the step's steady window",
            self.step_requests_per_second.clone(),
        );
        r.register(
            "llm_canary_step_goodput_requests_per_second",
            "Good requests per second over the step's steady window: succeeded with TTFT and ITL within the target's goodput limits",
            self.step_goodput.clone(),
        );
        r.register(
            "llm_canary_step_error_ratio",
            "Failed requests / all requests over the step's steady window",
            self.step_error_ratio.clone(),
        );
        r.register(
            "llm_canary_step_cache_hit_ratio",
            "Cached prompt tokens / prompt tokens over the step's steady window",
            self.step_cache_hit_ratio.clone(),
        );
        r.register(
            "llm_canary_step_cost_per_million_tokens_usd",
            "Cost of one million output tokens at the step's throughput and the target's hourly cost",
            self.step_cost_per_million_tokens.clone(),
        );
        r.register_with_unit(
            "llm_canary_step_end_timestamp",
            "Unix time at which the step's window ended",
            s(),
            self.step_end_timestamp.clone(),
        );
        r.register(
            "llm_canary_step_degraded",
            "1 when the step's schedule lag p99 exceeded its limit; such steps are excluded from SLOs",
            self.step_degraded.clone(),
        );
        r.register(
            "llm_canary_step_faulted",
            "1 when more of the step's requests failed than its latencies can stand for; such steps are excluded from SLO latencies",
            self.step_faulted.clone(),
        );
        r.register(
            "llm_canary_step_saturated",
            "Open-loop steps: 1 when the server fell behind the arrivals (arrivals left unsent, or a queue growing through the window); closed-loop steps have no series",
            self.step_saturated.clone(),
        );
    }

    /// What the servers' own metrics said, and the scrapes of them.
    fn register_servers(&mut self) {
        let r = &mut self.registry;
        let s = || Unit::Seconds;
        r.register(
            "llm_canary_server_prefix_cache_hit_ratio",
            "Prefix cache hit ratio reported by the server's own metrics",
            self.server_prefix_cache_hit_ratio.clone(),
        );
        r.register(
            "llm_canary_server_kv_cache_usage_ratio",
            "KV cache usage reported by the server's own metrics",
            self.server_kv_cache_usage_ratio.clone(),
        );
        r.register(
            "llm_canary_server_preemptions",
            "Preemptions reported by the server's own metrics",
            self.server_preemptions.clone(),
        );
        r.register(
            "llm_canary_server_cancellations",
            "Requests the server's own metrics count as cancelled by their client (dynamo_component_cancellation_total)",
            self.server_cancellations.clone(),
        );
        // `Unit::Other("blocks")` appends `_blocks`: `llm_canary_server_kv_offload_blocks_total`.
        r.register_with_unit(
            "llm_canary_server_kv_offload",
            "KV blocks the server's KV block manager offloaded from GPU to host memory (increase of kvbm_offload_blocks_d2h)",
            Unit::Other("blocks".into()),
            self.server_kv_offload_blocks.clone(),
        );
        r.register_with_unit(
            "llm_canary_server_ttft_mean",
            "Mean TTFT reported by the server's own metrics",
            s(),
            self.server_ttft_mean.clone(),
        );
        r.register(
            "llm_canary_server_kvbm_host_cache_hit_ratio",
            "KV block manager CPU-tier hit rate reported by the server (kvbm_host_cache_hit_rate)",
            self.server_kvbm_host_cache_hit_ratio.clone(),
        );
        r.register(
            "llm_canary_server_kvbm_disk_cache_hit_ratio",
            "KV block manager disk-tier hit rate reported by the server (kvbm_disk_cache_hit_rate)",
            self.server_kvbm_disk_cache_hit_ratio.clone(),
        );
        r.register(
            "llm_canary_server_scrape_errors",
            "Failed scrapes of the server's own metrics endpoints",
            self.server_scrape_errors.clone(),
        );
    }

    /// The SLO verdicts and the values they compared.
    fn register_slos(&mut self) {
        let r = &mut self.registry;
        r.register(
            "llm_canary_slo_state",
            "SLO verdict as a state set: exactly one of pass, fail, insufficient_data is 1",
            self.slo_state.clone(),
        );
        r.register(
            "llm_canary_slo_value",
            "Measured value of the SLO's left-hand side",
            self.slo_value.clone(),
        );
        r.register(
            "llm_canary_slo_threshold",
            "Threshold the SLO's value is compared with",
            self.slo_threshold.clone(),
        );
        r.register(
            "llm_canary_slo_value_lower",
            "Lower bound of the 95 % confidence interval of the SLO's value",
            self.slo_value_lower.clone(),
        );
        r.register(
            "llm_canary_slo_value_upper",
            "Upper bound of the 95 % confidence interval of the SLO's value",
            self.slo_value_upper.clone(),
        );
        r.register_with_unit(
            "llm_canary_slo_data_age",
            "Age of the newest step the SLO's stalest selector read (steps are held between runs)",
            Unit::Seconds,
            self.slo_data_age.clone(),
        );
    }

    /// The canary itself: targets, its own sending delays and connections, build and config,
    /// pause and probe.
    fn register_canary(&mut self) {
        let r = &mut self.registry;
        let s = || Unit::Seconds;
        r.register(
            "llm_canary_target_up",
            "1 when the last request or probe of the target reached it",
            self.target_up.clone(),
        );
        r.register_with_unit(
            "llm_canary_schedule_lag",
            "The canary's own delay in sending: actual send minus the later of the intended send and, in open-loop steps, the instant an in-flight slot was free",
            s(),
            self.schedule_lag.clone(),
        );
        r.register_with_unit(
            "llm_canary_client_queue",
            "Open-loop requests: actual minus intended send time, the wait for a free in-flight slot included; it grows when the server falls behind the arrivals",
            s(),
            self.client_queue.clone(),
        );
        r.register_with_unit(
            "llm_canary_connect",
            "Connect time (TCP, and the TLS handshake of an https:// target) of the connections the canary opened to the target: before each closed-loop step (one per worker) and for requests that found none idle; the server's and the network's own figure, apart from TTFT",
            s(),
            self.connect.clone(),
        );
        r.register(
            "llm_canary_connection_retries",
            "Requests sent a second time, on a new connection, because the reused connection they went out on was lost before any byte of an answer (the server had closed it: a keep-alive limit or an idle timeout); not an error of the target, and the request is measured from its intended send all the same",
            self.connection_retries.clone(),
        );
        r.register(
            "llm_canary_inflight_requests",
            "Requests sent and not yet finished",
            self.inflight.clone(),
        );
        // An OpenMetrics info family: the sample is `llm_canary_build_info{version} 1`.
        r.register(
            "llm_canary_build",
            "Build information",
            Info::new(VersionLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            }),
        );
        r.register(
            "llm_canary_config_last_reload_successful",
            "1 when the last config reload succeeded",
            self.config_last_reload_successful.clone(),
        );
        r.register_with_unit(
            "llm_canary_config_last_reload_success_timestamp",
            "Unix time of the last successful config load",
            s(),
            self.config_last_reload_success_timestamp.clone(),
        );
        r.register(
            "llm_canary_http_refused",
            "Clients the canary's own HTTP surface refused or cut off, by reason: a connection limit (all peers, one peer), the /metrics response slots (all, one peer's share), a response not read within its write deadline or stalled",
            self.http_refused.clone(),
        );
        r.register(
            "llm_canary_paused",
            "1 for each reason traffic is paused now (operator, schedule, budget); all 0 while sending",
            self.paused.clone(),
        );
        r.register(
            "llm_canary_probe_success",
            "1 when the start-up probe of the target passed (reachable, model, dialect, streaming)",
            self.probe_success.clone(),
        );
    }

    /// The traffic budget's actions, use and limits.
    fn register_budget(&mut self) {
        let r = &mut self.registry;
        r.register(
            "llm_canary_budget_steps",
            "Steps the traffic budget skipped, scaled, serialized or cut",
            self.budget_steps.clone(),
        );
        r.register(
            "llm_canary_budget_throttled_requests",
            "Requests that waited for the budget's max_rps pace",
            self.budget_throttled.clone(),
        );
        r.register(
            "llm_canary_budget_output_tokens_last_hour",
            "Output tokens received in the last hour, per budget scope",
            self.budget_output_tokens.clone(),
        );
        r.register(
            "llm_canary_budget_limit",
            "A configured budget limit (max_inflight, max_rps, max_output_tokens_per_hour)",
            self.budget_limit.clone(),
        );
    }
}
