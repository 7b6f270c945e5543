//! Export of what the canary measures: the Prometheus metric families and their OpenMetrics
//! encoding ([`metrics`]), and the daemon's HTTP surface that serves them ([`http`]).

pub mod http;
pub mod metrics;

pub use http::{
    AppState, HttpError, HttpServer, OPENMETRICS_CONTENT_TYPE, Readiness, ReloadFuture, ReloadHook,
    ShutdownOutcome, StatusSource,
};
pub use metrics::{
    Metrics, MetricsError, OUTCOME_OK, Quantiles, RequestLabels, ServerSnapshot, SloReading,
    SloState, StepLabels, StepSummary, latency_buckets,
};
