//! Export of what the canary measures: the Prometheus metric families and their OpenMetrics
//! encoding ([`metrics`]), the daemon's HTTP surface that serves them ([`http`]) with its status
//! page ([`status_page`]) and the OTLP push ([`otlp`]). Each is a [`crate::model::Sink`] of the schedule's data.

mod admission;
mod body;
pub mod buckets;
pub mod histogram;
pub mod http;
mod labels;
mod limits;
pub mod metrics;
pub mod otlp;
mod reasoning;
mod record;
mod refusals;
mod registry;
mod stall;
pub mod status_page;

pub use buckets::latency_buckets;
pub use http::{
    AppState, HttpError, HttpServer, Lifecycle, OPENMETRICS_CONTENT_TYPE, PauseHook, Readiness,
    ReloadFuture, ReloadHook, ShutdownOutcome, StatusSource,
};
pub use limits::HttpLimits;
pub use metrics::{Metrics, MetricsError};
pub use otlp::{OtlpError, OtlpExporter, OtlpTarget};
pub use refusals::Refusal;

/// Helpers of the module's unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use crate::config::ServingMode;
    use crate::request::RequestLabels;

    pub fn agg(workload: &str) -> RequestLabels {
        RequestLabels::new("agg", ServingMode::Aggregated, workload)
    }

    /// The value of the sample `name{labels...}` in a `/metrics` text, matching every given
    /// label pair (an absent label matches `""`, as in Prometheus).
    pub use crate::promtext::sample;
}
