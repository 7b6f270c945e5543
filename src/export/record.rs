//! The Prometheus registry as a consumer of the schedule's data: every finished request, every
//! step's summary, requests in flight, the servers' own metrics and the SLO readings.

use std::time::Duration;

use super::metrics::Metrics;
use crate::client::{Outcome, RequestRecord};
use crate::model::{
    Phase, RecordContext, ServerSnapshot, Sink, StepInfo, StepResult, TargetChange,
};
use crate::scrape::ServerMetricsSink;
use crate::slo::{SloPublisher, SloReading};

/// `llm_canary_target_up`: whether a finished request reached the target. Any HTTP response
/// counts (a 429 or 503 still comes from a live server); no connection, or a timeout with no
/// response head, does not.
pub fn reached_target(rec: &RequestRecord) -> bool {
    match rec.outcome {
        Outcome::Connect => false,
        Outcome::Timeout => rec.first_byte.is_some(),
        _ => true,
    }
}

impl Sink for Metrics {
    fn request(&self, ctx: &RecordContext<'_>, rec: &RequestRecord) {
        let outcome = rec.outcome.as_str();
        let labels = ctx.labels;
        let secs = |d: Duration| d.as_secs_f64();
        self.set_target_up(&labels.target, reached_target(rec));
        if ctx.phase == Phase::Warmup {
            // Warmup requests still count, so an error in warmup is never silently lost.
            self.record_request(labels, outcome, None, None, None, 0, 0, 0);
            return;
        }
        let ok = rec.outcome.is_ok();
        let output = if ok { rec.output_tokens() } else { 0 };
        self.record_request(
            labels,
            outcome,
            rec.ttft().map(secs).filter(|_| ok),
            rec.itl().map(secs).filter(|_| ok),
            Some(secs(rec.latency())),
            rec.prompt_tokens().unwrap_or(0),
            rec.cached_tokens().unwrap_or(0),
            output,
        );
        if ok {
            let gaps: Vec<(f64, u32)> = rec
                .token_gaps()
                .map(|(g, k)| (secs(g) * f64::from(k), k))
                .collect();
            self.record_chunk_gaps(labels, &gaps);
        }
        self.observe_schedule_lag(&labels.target, &labels.workload, secs(rec.schedule_lag()));
        if rec.osl_mismatch(ctx.osl) {
            self.record_osl_mismatch(labels);
        }
        if ok && rec.token_count_disagreement().is_some_and(|d| d != 0) {
            self.record_token_count_mismatch(labels);
        }
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
            self.set_step(&r.request_labels, &r.summary());
        }
    }

    fn in_flight(&self, target: &str, delta: i64) {
        self.add_inflight(target, delta);
    }
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

    fn remove_slo(&self, slo: &str) {
        Metrics::remove_slo(self, slo);
    }
}
