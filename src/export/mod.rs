//! Export of what the canary measures: the Prometheus metric families and their OpenMetrics
//! encoding ([`metrics`]), the daemon's HTTP surface that serves them ([`http`]), the scrape of the
//! servers' own metrics ([`scrape`], parsed by [`promtext`]) and the OTLP push ([`otlp`]).

pub mod http;
pub mod metrics;
pub mod otlp;
pub mod promtext;
pub mod scrape;

pub use http::{
    AppState, HttpError, HttpServer, OPENMETRICS_CONTENT_TYPE, Readiness, ReloadFuture, ReloadHook,
    ShutdownOutcome, StatusSource,
};
pub use metrics::{
    Metrics, MetricsError, OUTCOME_OK, Quantiles, RequestLabels, ServerSnapshot, SloReading,
    SloState, StepLabels, StepSummary, latency_buckets,
};
pub use otlp::{OtlpError, OtlpExporter, OtlpTarget};
pub use scrape::{ScrapeError, ScrapeTarget, ServerScraper, ServerStep, ServerTotals};
