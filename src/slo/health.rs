//! The canary's own health alerts: a canary that is gone, idle, overloaded or misconfigured
//! measures nothing trustworthy, so these come before every SLO's. `llm-canary rules` puts them
//! at the head of every rule file it writes, with the config's routing labels and runbook base
//! (`slo::rules`); `rules/canary-health.yaml` is the same group for a config without labels.

use std::time::Duration;

use crate::config::Severity;

/// A canary that Prometheus no longer scrapes: every SLO alert is silent while it is gone.
pub const ALERT_ABSENT: &str = "LlmCanaryAbsent";
/// A canary that runs but sends nothing.
pub const ALERT_NO_REQUESTS: &str = "LlmCanaryNoRequests";

/// One health alert, before the routing labels and the runbook are added.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthAlert {
    pub name: &'static str,
    pub expr: &'static str,
    pub for_: Duration,
    pub severity: Severity,
    pub summary: &'static str,
    pub description: &'static str,
}

const fn minutes(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

/// The health alerts that need nothing of the config, in the order the rule file lists them.
pub const HEALTH_ALERTS: [HealthAlert; 8] = [
    HealthAlert {
        name: "LlmCanaryTargetDown",
        expr: "llm_canary_target_up == 0",
        for_: minutes(2),
        severity: Severity::Warning,
        summary: "llm-canary cannot reach target {{ $labels.target }}",
        description: "The last request or probe of {{ $labels.target }} did not reach it for 2 minutes; every SLO of that target is stale.",
    },
    HealthAlert {
        name: "LlmCanaryScheduleLagHigh",
        expr: "histogram_quantile(0.99, sum by (target, workload, le) (rate(llm_canary_schedule_lag_seconds_bucket[5m]))) > 0.05",
        for_: minutes(10),
        severity: Severity::Warning,
        summary: "llm-canary sends late to {{ $labels.target }} ({{ $labels.workload }}): measurements untrustworthy",
        description: "Schedule lag p99 is {{ $value | humanizeDuration }} (limit 50ms): the canary itself is overloaded, so its latencies measure the canary, not the server. Such steps are excluded from the daemon's SLO verdicts.",
    },
    HealthAlert {
        name: "LlmCanaryErrorRatioHigh",
        expr: "sum by (target, workload) (rate(llm_canary_requests_total{outcome!~\"ok|cancelled\"}[5m])) / sum by (target, workload) (rate(llm_canary_requests_total{outcome!=\"cancelled\"}[5m])) > 0.05",
        for_: minutes(10),
        severity: Severity::Warning,
        summary: "More than 5 % of llm-canary's {{ $labels.workload }} requests to {{ $labels.target }} fail",
        description: "Error ratio {{ $value | humanizePercentage }} over 5 minutes; llm_canary_requests_total by outcome says which kind.",
    },
    HealthAlert {
        name: "LlmCanaryOslMismatch",
        expr: "sum by (target, workload) (rate(llm_canary_osl_mismatch_total[15m])) / sum by (target, workload) (rate(llm_canary_requests_total{outcome=\"ok\"}[15m])) > 0.01",
        for_: minutes(15),
        severity: Severity::Warning,
        summary: "{{ $labels.target }} does not honour the requested output length ({{ $labels.workload }})",
        description: "{{ $value | humanizePercentage }} of successful requests missed the requested OSL by more than min(5 %, 50 tokens): the server ignores ignore_eos/min_tokens, so throughput and latency are not comparable with the plan.",
    },
    HealthAlert {
        name: "LlmCanaryConfigReloadFailed",
        expr: "llm_canary_config_last_reload_successful == 0",
        for_: minutes(5),
        severity: Severity::Warning,
        summary: "llm-canary rejected its new config",
        description: "The last reload failed validation; the previous config keeps running. `llm-canary check --config FILE` prints every error.",
    },
    HealthAlert {
        name: ALERT_ABSENT,
        expr: "absent(llm_canary_build_info)",
        for_: minutes(5),
        severity: Severity::Critical,
        summary: "llm-canary is not scraped: no canary, no SLO verdicts",
        description: "Prometheus has no llm_canary_build_info series: the canary is down, not scheduled, or not scraped (ServiceMonitor, NetworkPolicy). Every SLO alert is silent while it is gone.",
    },
    HealthAlert {
        name: ALERT_NO_REQUESTS,
        expr: "(sum(increase(llm_canary_requests_total[15m])) or vector(0)) == 0 and on() (count(llm_canary_build_info) > 0) unless on() (max(llm_canary_paused) == 1)",
        for_: minutes(15),
        severity: Severity::Warning,
        summary: "llm-canary runs but has sent no request for 30 minutes",
        description: "The canary is up but measures nothing: no target (discovery found none, or this replica is a standby with no leader sending), or its schedule is stuck. /api/v1/status says which.",
    },
    HealthAlert {
        name: "LlmCanaryTargetAllFailed",
        expr: "max by (target, serving_mode, workload) (llm_canary_step_error_ratio) >= 1",
        for_: Duration::ZERO,
        severity: Severity::Warning,
        summary: "Every request of the last {{ $labels.workload }} step to {{ $labels.target }} failed",
        description: "A whole step of {{ $labels.target }} ({{ $labels.serving_mode }}) failed: the deployment is down or rejects the canary's requests; llm_canary_requests_total by outcome says how.",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_health_alert_has_its_own_name_and_the_absent_one_pages() {
        let mut names: Vec<&str> = HEALTH_ALERTS.iter().map(|a| a.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), HEALTH_ALERTS.len());
        let absent = HEALTH_ALERTS.iter().find(|a| a.name == ALERT_ABSENT);
        assert_eq!(absent.map(|a| a.severity), Some(Severity::Critical));
    }
}
