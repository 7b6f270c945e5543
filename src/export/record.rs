//! The Prometheus registry as a consumer of the schedule's data: every finished request, every
//! step's summary, requests in flight, the servers' own metrics and the SLO readings.

use std::time::Duration;

use prometheus_client::metrics::family::Family;

use super::labels::{SloLabels, TargetLabels, mode_labels};
use super::metrics::{CounterF64, Metrics};
use crate::model::{
    BudgetReport, Finished, PauseState, Phase, ServerSnapshot, Sink, StepInfo, StepResult,
    TargetChange,
};
use crate::request::{Reasoning, RequestLabels};
use crate::scrape::ServerMetricsSink;
use crate::slo::{SloPublisher, SloReading, SloState};

impl Metrics {
    /// Observes a successful steady request's reasoning measures, by `target`, `serving_mode`
    /// and `workload` (docs/METRICS.md, "Reasoning").
    fn record_reasoning(&self, labels: &RequestLabels, r: &Reasoning) {
        let key = mode_labels(labels);
        if self.reasoning.first_reasoning_token.get(&key).is_none() {
            self.track(&key.target, |s| {
                s.modes.insert(key.clone());
            });
        }
        self.reasoning.observe(&key, r);
    }
}

impl Sink for Metrics {
    fn request(&self, req: &Finished<'_>) {
        let (labels, s) = (req.labels, &req.sample);
        self.set_target_up(&labels.target, s.outcome.reached_target());
        self.record_request(labels, req.phase, s);
        // Warmup requests too: a retry tells of the target's connections, not of a step.
        if req.record.retried {
            self.record_connection_retry(&labels.target);
        }
        if req.phase == Phase::Warmup {
            return;
        }
        if s.outcome.is_ok() {
            let gaps: Vec<(f64, u32)> = req
                .record
                .token_gaps()
                .map(|(g, k)| (g.as_secs_f64() * f64::from(k), k))
                .collect();
            self.record_chunk_gaps(labels, &gaps);
        }
        if let Some(split) = s.server {
            self.record_server_timing(
                labels,
                split.server_ttft,
                split.server_queue,
                split.server_prefill,
            );
        }
        self.observe_schedule_lag(&labels.target, &labels.workload, s.schedule_lag);
        if let Some(queue) = s.client_queue {
            self.observe_client_queue(&labels.target, &labels.workload, queue);
        }
        if s.osl_mismatch {
            self.record_osl_mismatch(labels);
        }
        if s.token_count_mismatch {
            self.record_token_count_mismatch(labels);
        }
        if let Some(reasoning) = s.reasoning.filter(|_| s.outcome.is_ok()) {
            self.record_reasoning(labels, &reasoning);
        }
    }

    fn skipped(&self, labels: &crate::request::RequestLabels, reason: &'static str) {
        self.record_skipped(labels, reason);
    }

    fn targets(&self, change: &TargetChange<'_>) {
        for gone in change.removed {
            self.remove_target(gone);
        }
        // A new target is up until its first request says otherwise; the others keep what their
        // last request said.
        for new in change.added {
            self.set_target_up(new, true);
        }
    }

    fn step_finished(&self, _step: &StepInfo, results: Option<&[StepResult]>) {
        for r in results.unwrap_or_default() {
            self.set_step(&r.labels, &r.summary());
        }
    }

    fn connected(&self, target: &str, took: Duration) {
        self.observe_connect(target, took.as_secs_f64());
    }

    fn in_flight(&self, target: &str, delta: i64) {
        self.add_inflight(target, delta);
    }

    fn paused(&self, state: &PauseState) {
        self.set_paused(state);
    }

    fn budget(&self, report: &BudgetReport) {
        self.record_budget(report);
    }
}

/// The servers' own metrics and the SLO readings, as the scrape and the SLO engine publish them.
impl Metrics {
    /// Publishes what one scrape of the target's own metrics yielded. Server counters are mirrored
    /// by their increase; a total below the previous one means the server restarted, and its new
    /// total is all increase.
    pub fn set_server(&self, target: &str, snapshot: &ServerSnapshot) {
        let labels = TargetLabels {
            target: target.to_owned(),
        };
        let gauges = [
            (
                &self.server_prefix_cache_hit_ratio,
                snapshot.prefix_cache_hit_ratio,
            ),
            (
                &self.server_kv_cache_usage_ratio,
                snapshot.kv_cache_usage_ratio,
            ),
            (&self.server_ttft_mean, snapshot.ttft_mean_seconds),
        ];
        for (family, value) in gauges {
            if let Some(v) = value.filter(|v| v.is_finite()) {
                family.get_or_create_owned(&labels).set(v);
            }
        }
        // A counter the server does not export gets no series rather than a zero: vLLM without
        // KVBM has no offload count, and "0 blocks offloaded" would claim one.
        let counter = |family: &Family<TargetLabels, CounterF64>, total: Option<f64>| {
            total
                .filter(|t| t.is_finite() && *t >= 0.0)
                .map(|t| (family.get_or_create_owned(&labels), t))
        };
        let preemptions = counter(&self.server_preemptions, snapshot.preemptions_total);
        let cancellations = counter(&self.server_cancellations, snapshot.cancellations_total);
        let kv_offload_blocks = counter(
            &self.server_kv_offload_blocks,
            snapshot.kv_offload_blocks_total,
        );
        if preemptions.is_none() && cancellations.is_none() && kv_offload_blocks.is_none() {
            return;
        }
        self.track(target, |s| {
            if let Some((c, total)) = &preemptions {
                mirror_counter(c, &mut s.last_preemptions, *total);
            }
            if let Some((c, total)) = &cancellations {
                mirror_counter(c, &mut s.last_cancellations, *total);
            }
            if let Some((c, total)) = &kv_offload_blocks {
                mirror_counter(c, &mut s.last_kv_offload_blocks, *total);
            }
        });
    }

    /// Publishes the KV block manager's tier hit rates (Dynamo KVBM); `None` leaves a series as is.
    pub fn set_server_kvbm(&self, target: &str, host: Option<f64>, disk: Option<f64>) {
        let labels = TargetLabels {
            target: target.to_owned(),
        };
        for (family, value) in [
            (&self.server_kvbm_host_cache_hit_ratio, host),
            (&self.server_kvbm_disk_cache_hit_ratio, disk),
        ] {
            if let Some(v) = value.filter(|v| v.is_finite()) {
                family.get_or_create_owned(&labels).set(v);
            }
        }
    }

    /// Counts one failed scrape of a server metrics endpoint of `target`.
    pub fn record_server_scrape_error(&self, target: &str) {
        self.server_scrape_errors
            .get_or_create_owned(&TargetLabels {
                target: target.to_owned(),
            })
            .inc();
    }

    /// Publishes one SLO evaluation. The state is stored as one value, so every scrape sees exactly
    /// one `state` at 1.
    pub fn set_slo(&self, slo: &str, reading: &SloReading) {
        self.slo_state.set(slo, reading.state);
        let labels = SloLabels {
            slo: slo.to_owned(),
        };
        let gauges = [
            (&self.slo_value, reading.value),
            (&self.slo_threshold, reading.threshold),
            (&self.slo_value_lower, reading.value_lower),
            (&self.slo_value_upper, reading.value_upper),
        ];
        for (family, value) in gauges {
            match value {
                Some(v) => {
                    family.get_or_create_owned(&labels).set(v);
                }
                None => {
                    family.remove(&labels);
                }
            }
        }
    }

    /// The state last set for `slo`.
    pub fn slo_state(&self, slo: &str) -> Option<SloState> {
        self.slo_state.get(slo)
    }

    /// Publishes how old an SLO's data is; `None` (no data) removes the series.
    pub fn set_slo_data_age(&self, slo: &str, seconds: Option<f64>) {
        let labels = SloLabels {
            slo: slo.to_owned(),
        };
        match seconds {
            Some(s) => {
                self.slo_data_age.get_or_create_owned(&labels).set(s);
            }
            None => {
                self.slo_data_age.remove(&labels);
            }
        }
    }

    /// Removes every series of an SLO that a reload deleted.
    pub fn remove_slo(&self, slo: &str) {
        self.slo_state.remove(slo);
        let labels = SloLabels {
            slo: slo.to_owned(),
        };
        for family in [
            &self.slo_value,
            &self.slo_threshold,
            &self.slo_value_lower,
            &self.slo_value_upper,
            &self.slo_data_age,
        ] {
            family.remove(&labels);
        }
    }
}

impl Metrics {
    /// `llm_canary_paused{reason}`: each reason 1 or 0.
    pub fn set_paused(&self, state: &PauseState) {
        for (reason, on) in state.reasons() {
            let labels = super::labels::ReasonLabels {
                reason: reason.to_owned(),
            };
            self.paused.get_or_create(&labels).set(i64::from(on));
        }
    }

    /// `llm_canary_probe_success{target}`: how the start-up probe of `target` came out.
    pub fn set_probe(&self, target: &str, ok: bool) {
        self.probe_success
            .get_or_create(&TargetLabels {
                target: target.to_owned(),
            })
            .set(i64::from(ok));
    }

    /// The budget's actions and use.
    pub fn record_budget(&self, report: &BudgetReport) {
        use super::labels::{BudgetStepLabels, ScopeLabels, ScopeLimitLabels};
        for a in &report.actions {
            let labels = BudgetStepLabels {
                target: a.target.clone(),
                workload: a.workload.to_owned(),
                action: a.action.to_owned(),
            };
            self.budget_steps.get_or_create(&labels).inc();
            self.tracked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(a.target.clone())
                .or_default()
                .budget_steps
                .insert(labels);
        }
        let mut seen = self
            .budget_throttled_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for u in &report.usage {
            let scope = ScopeLabels {
                scope: u.scope.clone(),
            };
            self.budget_output_tokens
                .get_or_create(&scope)
                .set(i64::try_from(u.output_tokens_last_hour).unwrap_or(i64::MAX));
            let last = seen.entry(u.scope.clone()).or_default();
            if u.throttled_requests > *last {
                self.budget_throttled
                    .get_or_create(&scope)
                    .inc_by(u.throttled_requests - *last);
            }
            *last = u.throttled_requests;
            for (limit, value) in [
                ("max_inflight", u.max_inflight.map(f64::from)),
                ("max_rps", u.max_rps),
                (
                    "max_output_tokens_per_hour",
                    u.max_output_tokens_per_hour.map(|t| t as f64),
                ),
            ] {
                let labels = ScopeLimitLabels {
                    scope: u.scope.clone(),
                    limit: limit.to_owned(),
                };
                match value {
                    Some(v) => {
                        self.budget_limit.get_or_create(&labels).set(v);
                    }
                    None => {
                        self.budget_limit.remove(&labels);
                    }
                }
            }
        }
    }
}

/// Adds to `counter` the increase of a server's cumulative `total` since `last`.
fn mirror_counter(counter: &CounterF64, last: &mut Option<f64>, total: f64) {
    let increase = match *last {
        Some(previous) if total >= previous => total - previous,
        _ => total,
    };
    counter.inc_by(increase);
    *last = Some(total);
}

impl ServerMetricsSink for Metrics {
    fn set_server(&self, target: &str, snapshot: &ServerSnapshot) {
        Metrics::set_server(self, target, snapshot);
    }

    fn set_server_kvbm(&self, target: &str, host: Option<f64>, disk: Option<f64>) {
        Metrics::set_server_kvbm(self, target, host, disk);
    }

    fn record_server_scrape_error(&self, target: &str) {
        Metrics::record_server_scrape_error(self, target);
    }
}

impl SloPublisher for Metrics {
    fn set_slo(&self, slo: &str, reading: &SloReading) {
        Metrics::set_slo(self, slo, reading);
    }

    fn set_slo_data_age(&self, slo: &str, seconds: Option<f64>) {
        Metrics::set_slo_data_age(self, slo, seconds);
    }

    fn remove_slo(&self, slo: &str) {
        Metrics::remove_slo(self, slo);
    }
}

/// `/api/v1/baselines` reads and pins the SLO engine's baselines.
impl crate::export::http::BaselineHook for crate::slo::SloEngine {
    fn list(&self) -> serde_json::Value {
        self.baselines_json()
    }

    fn pin(&self, name: &str, span: Duration) -> usize {
        crate::slo::SloEngine::pin(self, name, span)
    }

    fn unpin(&self, name: &str) -> bool {
        crate::slo::SloEngine::unpin(self, name)
    }
}
