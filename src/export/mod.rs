//! Export of what the canary measures: the Prometheus metric families and their OpenMetrics
//! encoding ([`metrics`]), the daemon's HTTP surface that serves them ([`http`]) and the OTLP push
//! ([`otlp`]). Each is a [`crate::model::Sink`] of the schedule's data.

pub mod http;
pub mod metrics;
pub mod otlp;
mod record;

pub use http::{
    AppState, HttpError, HttpServer, OPENMETRICS_CONTENT_TYPE, Readiness, ReloadFuture, ReloadHook,
    ShutdownOutcome, StatusSource,
};
pub use metrics::{Metrics, MetricsError, OUTCOME_OK, latency_buckets};
pub use otlp::{OtlpError, OtlpExporter, OtlpTarget};
