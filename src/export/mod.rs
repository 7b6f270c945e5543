//! Export of what the canary measures: the Prometheus metric families and their OpenMetrics
//! encoding ([`metrics`]), the daemon's HTTP surface that serves them ([`http`]) and the OTLP push
//! ([`otlp`]). Each is a [`crate::model::Sink`] of the schedule's data.

pub mod buckets;
pub mod histogram;
pub mod http;
mod labels;
pub mod metrics;
pub mod otlp;
mod record;
mod registry;
mod stall;

pub use buckets::latency_buckets;
pub use http::{
    AppState, HttpError, HttpLimits, HttpServer, Lifecycle, OPENMETRICS_CONTENT_TYPE, PauseHook,
    Readiness, ReloadFuture, ReloadHook, ShutdownOutcome, StatusSource,
};
pub use metrics::{Metrics, MetricsError};
pub use otlp::{OtlpError, OtlpExporter, OtlpTarget};

/// Helpers of the module's unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use crate::config::ServingMode;
    use crate::request::RequestLabels;

    pub fn agg(workload: &str) -> RequestLabels {
        RequestLabels::new("agg", ServingMode::Aggregated, workload)
    }

    /// The value of the sample `name{labels...}` in `text`, matching every given label pair (an
    /// absent label matches `""`, as in Prometheus).
    pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (label_part, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let has = |k: &str, v: &str| {
                let pairs = || label_part.split(',');
                match v {
                    "" => !pairs()
                        .any(|p| p.starts_with(&format!("{k}=\"")) && p != format!("{k}=\"\"")),
                    v => pairs().any(|p| p == format!("{k}=\"{v}\"")),
                }
            };
            let all = labels.iter().all(|(k, v)| has(k, v));
            all.then(|| value.parse().ok()).flatten()
        })
    }
}
