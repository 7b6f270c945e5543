//! OTLP export of the per-request measurements (docs/DESIGN.md §6): the same requests the Prometheus
//! histograms see, pushed as OpenTelemetry metrics under the GenAI semantic-convention names
//! where one exists, and optionally one span per request with the first chunk as an event.
//!
//! | instrument | unit | what |
//! | --- | --- | --- |
//! | `gen_ai.client.operation.duration` | s | request latency (error latency for failures, with `error.type`) |
//! | `gen_ai.client.operation.time_to_first_chunk` | s | TTFT of successful requests |
//! | `gen_ai.client.operation.time_per_output_chunk` | s | each content chunk's gap to the previous one |
//! | `gen_ai.client.token.usage` | {token} | prompt (`gen_ai.token.type=input`) and completion (`output`) tokens |
//! | `llm_canary.inter_token_latency` | s | ITL of successful requests (no semantic-convention name) |
//! | `llm_canary.requests` | {request} | every request, warmup included, by `llm_canary.outcome` |
//! | `llm_canary.cached_tokens` | {token} | prompt tokens served from the prefix cache |
//! | `llm_canary.server.time_to_first_token` | s | the server's own TTFT (Dynamo `nvext.timing.ttft_ms`) |
//! | `llm_canary.server.queue_time` | s | the server's wait for prefill (`prefill_wait_time_ms`) |
//! | `llm_canary.server.prefill_time` | s | the server's prefill time (`prefill_time_ms`) |
//!
//! A span also carries the server's timing (`llm_canary.server.ttft_ms`, `.queue_ms`,
//! `.prefill_ms`, `.handoff_ms`, `.kv_transfer_ms`, `.kv_hit_rate`) and its workers
//! (`llm_canary.server.prefill_worker_id`, `.decode_worker_id`): a span is one request, so a
//! worker id there costs nothing, unlike a metric attribute.
//!
//! Every point carries the canary's labels as attributes (empty ones left out), plus
//! `gen_ai.operation.name`, `gen_ai.request.model`, `server.address` and `server.port`. The
//! latency histograms use the Prometheus latency grid in seconds as explicit bucket boundaries:
//! the SDK's default boundaries assume milliseconds.
//!
//! Transport: HTTP/protobuf with reqwest's *blocking* client, driven by the SDK's periodic reader
//! on its own thread (reqwest's async client needs a Tokio reactor that thread does not have);
//! gRPC (tonic) when built with the `otlp-grpc` feature, on a small Tokio runtime of the
//! exporters' own (see the `grpc` module). The endpoint is the collector's base URL (as
//! `OTEL_EXPORTER_OTLP_ENDPOINT`): `/v1/metrics` and `/v1/traces` are appended for HTTP; gRPC
//! takes it as is (plaintext `http://` only: the build has no TLS for tonic).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanExporter};
use tokio::time::Instant;

use super::buckets::latency_buckets;
use crate::client::RequestRecord;
use crate::config::{Api, Otlp, OtlpProtocol};
use crate::model::{Finished, Phase, Sink, TargetChange};
use crate::request::{RequestLabels, Sample};

/// Longest one export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Token-count boundaries the GenAI semantic conventions give for `gen_ai.client.token.usage`.
const TOKEN_BOUNDARIES: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// Errors of the OTLP pipeline.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("export.otlp.endpoint `{0}` is not a URL")]
    Endpoint(String),
    #[error("building the OTLP HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("building the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error(
        "export.otlp.protocol is grpc, but this binary was built without the `otlp-grpc` feature"
    )]
    GrpcNotBuilt,
    #[error("starting the OTLP gRPC runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("the OTLP setup task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What the exporter knows of a target, found by the target's name (the `target` label), so a
/// reload that adds, removes or reorders targets never tags a request with another's model.
#[derive(Debug, Clone)]
pub struct OtlpTarget {
    /// The `target` label.
    pub name: String,
    /// `chat` or `text_completion` (`gen_ai.operation.name`).
    pub operation: &'static str,
    pub model: String,
    pub url: url::Url,
}

impl OtlpTarget {
    pub fn new(name: &str, api: Api, model: &str, url: &url::Url) -> Self {
        OtlpTarget {
            name: name.to_owned(),
            operation: match api {
                Api::Chat => "chat",
                Api::Completions => "text_completion",
            },
            model: model.to_owned(),
            url: url.clone(),
        }
    }

    fn attributes(&self) -> Vec<KeyValue> {
        let mut v = vec![
            KeyValue::new("gen_ai.operation.name", self.operation),
            KeyValue::new("gen_ai.request.model", self.model.clone()),
        ];
        if let Some(host) = self.url.host_str() {
            v.push(KeyValue::new("server.address", host.to_owned()));
        }
        if let Some(port) = self.url.port_or_known_default() {
            v.push(KeyValue::new("server.port", i64::from(port)));
        }
        v
    }
}

struct Instruments {
    duration: Histogram<f64>,
    ttfc: Histogram<f64>,
    per_chunk: Histogram<f64>,
    itl: Histogram<f64>,
    tokens: Histogram<u64>,
    requests: Counter<u64>,
    cached: Counter<u64>,
    server_ttft: Histogram<f64>,
    server_queue: Histogram<f64>,
    server_prefill: Histogram<f64>,
}

/// The running OTLP pipeline. Recording is the SDK's in-memory aggregation; the network is only
/// touched by the periodic reader's and the span processor's own threads (and, for gRPC, the
/// exporters' runtime).
pub struct OtlpExporter {
    meters: SdkMeterProvider,
    tracing: Option<(SdkTracerProvider, SdkTracer)>,
    instruments: Instruments,
    /// Per target name: its attributes and its span name (replaced when the target set changes).
    targets: RwLock<HashMap<String, (Vec<KeyValue>, String)>>,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter")
            .field(
                "targets",
                &self
                    .targets
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .len(),
            )
            .field("spans", &self.tracing.is_some())
            .finish()
    }
}

/// The signal URL for HTTP: `base` with `path` appended unless `base` already names a path.
fn signal_url(base: &str, path: &str) -> Result<String, OtlpError> {
    let url = url::Url::parse(base).map_err(|_| OtlpError::Endpoint(base.to_owned()))?;
    if url.path().trim_matches('/').is_empty() {
        Ok(format!("{}{path}", base.trim_end_matches('/')))
    } else {
        Ok(base.to_owned())
    }
}

/// The canary's labels as attributes; a label that does not apply (empty) is left out.
pub fn label_attributes(labels: &RequestLabels) -> Vec<KeyValue> {
    labels
        .pairs()
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| KeyValue::new(k, v.to_owned()))
        .collect()
}

/// The HTTP/protobuf exporters, each with its own blocking client.
fn http_exporters(
    cfg: &Otlp,
) -> Result<
    (
        opentelemetry_otlp::MetricExporter,
        Option<opentelemetry_otlp::SpanExporter>,
    ),
    OtlpError,
> {
    let client = || {
        crate::client::blocking_http_client_builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(OtlpError::Client)
    };
    let metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_http_client(client()?)
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(signal_url(&cfg.endpoint, "/v1/metrics")?)
        .with_timeout(EXPORT_TIMEOUT)
        .build()?;
    let spans = if cfg.spans {
        Some(
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client()?)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(signal_url(&cfg.endpoint, "/v1/traces")?)
                .with_timeout(EXPORT_TIMEOUT)
                .build()?,
        )
    } else {
        None
    };
    Ok((metrics, spans))
}

/// The meter provider (the periodic reader on its own thread) and, with span export, the tracer
/// provider (a batch processor on its own thread), whatever the transport.
fn providers<M: PushMetricExporter, S: SpanExporter + 'static>(
    cfg: &Otlp,
    resource: Resource,
    metrics: M,
    spans: Option<S>,
) -> (SdkMeterProvider, Option<(SdkTracerProvider, SdkTracer)>) {
    let reader = PeriodicReader::builder(metrics)
        .with_interval(cfg.interval.0)
        .build();
    let meters = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource.clone())
        .build();
    let tracing = spans.map(|exporter| {
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("llm-canary");
        (provider, tracer)
    });
    (meters, tracing)
}

/// Every request, warmup included (its spans say which).
impl Sink for OtlpExporter {
    fn request(&self, req: &Finished<'_>) {
        self.record(req);
    }

    fn targets(&self, change: &TargetChange<'_>) {
        let known = change.now.iter().filter_map(|t| {
            let url = url::Url::parse(&t.url).ok()?;
            Some(OtlpTarget::new(&t.name, t.api, &t.model, &url))
        });
        *self.targets.write().unwrap_or_else(PoisonError::into_inner) = attributes_by_name(known);
    }
}

/// Per target name: its attributes and its span name.
fn attributes_by_name(
    targets: impl IntoIterator<Item = OtlpTarget>,
) -> HashMap<String, (Vec<KeyValue>, String)> {
    targets
        .into_iter()
        .map(|t| {
            let span_name = format!("{} {}", t.operation, t.model);
            (t.name.clone(), (t.attributes(), span_name))
        })
        .collect()
}

impl OtlpExporter {
    /// Starts the pipeline for `cfg` with what it knows of the `targets`.
    ///
    /// Runs the SDK setup on a blocking thread: reqwest's blocking client owns a runtime of its
    /// own that must not be created or dropped on an async worker thread. (The gRPC exporters'
    /// runtime is shut down in the background, so it may be dropped anywhere.)
    pub async fn start(cfg: &Otlp, targets: Vec<OtlpTarget>) -> Result<OtlpExporter, OtlpError> {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || Self::start_blocking(&cfg, targets)).await?
    }

    fn start_blocking(cfg: &Otlp, targets: Vec<OtlpTarget>) -> Result<OtlpExporter, OtlpError> {
        let resource = Resource::builder()
            .with_service_name("llm-canary")
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let (meters, tracing) = match *cfg.protocol {
            OtlpProtocol::HttpProtobuf => {
                let (metrics, spans) = http_exporters(cfg)?;
                providers(cfg, resource, metrics, spans)
            }
            OtlpProtocol::Grpc => {
                let (metrics, spans) = grpc::exporters(cfg)?;
                providers(cfg, resource, metrics, spans)
            }
        };
        let meter = meters.meter("llm-canary");
        let seconds = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(latency_buckets(&[]))
                .build()
        };
        let instruments = Instruments {
            duration: seconds(
                "gen_ai.client.operation.duration",
                "Request latency: last content chunk (or the error) minus the intended send time",
            ),
            ttfc: seconds(
                "gen_ai.client.operation.time_to_first_chunk",
                "Time from the intended send to the first non-empty content chunk",
            ),
            per_chunk: seconds(
                "gen_ai.client.operation.time_per_output_chunk",
                "Gap between a content chunk and the previous one",
            ),
            itl: seconds(
                "llm_canary.inter_token_latency",
                "Per-request mean gap between output tokens",
            ),
            tokens: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Prompt and completion tokens reported in usage")
                .with_boundaries(TOKEN_BOUNDARIES.to_vec())
                .build(),
            requests: meter
                .u64_counter("llm_canary.requests")
                .with_unit("{request}")
                .with_description("Requests by outcome, warmup included")
                .build(),
            cached: meter
                .u64_counter("llm_canary.cached_tokens")
                .with_unit("{token}")
                .with_description("Prompt tokens served from the prefix cache")
                .build(),
            server_ttft: seconds(
                "llm_canary.server.time_to_first_token",
                "The server's own TTFT (Dynamo nvext.timing.ttft_ms)",
            ),
            server_queue: seconds(
                "llm_canary.server.queue_time",
                "Time the request waited for prefill at the server (Dynamo nvext.timing.prefill_wait_time_ms)",
            ),
            server_prefill: seconds(
                "llm_canary.server.prefill_time",
                "Prefill time at the server (Dynamo nvext.timing.prefill_time_ms)",
            ),
        };
        Ok(OtlpExporter {
            meters,
            tracing,
            instruments,
            targets: RwLock::new(attributes_by_name(targets)),
        })
    }

    /// Records one finished request (of the target its labels name; a target the exporter does
    /// not know gets the label attributes only). Warmup requests only count in
    /// `llm_canary.requests`, as they only count in `llm_canary_requests_total`.
    pub fn record(&self, req: &Finished<'_>) {
        let (labels, s, rec) = (req.labels, &req.sample, req.record);
        let mut attrs = label_attributes(labels);
        let span_name = {
            let targets = self.targets.read().unwrap_or_else(PoisonError::into_inner);
            let target = targets.get(&labels.target);
            if let Some((t, _)) = target {
                attrs.extend(t.iter().cloned());
            }
            target.map(|(_, n)| n.clone())
        };
        let mut with_outcome = attrs.clone();
        with_outcome.push(KeyValue::new("llm_canary.outcome", s.outcome.as_str()));
        self.instruments.requests.add(1, &with_outcome);
        if req.phase == Phase::Warmup {
            return;
        }
        let mut duration_attrs = attrs.clone();
        if s.outcome.is_error() {
            duration_attrs.push(KeyValue::new("error.type", s.outcome.as_str()));
        }
        if let Some(latency) = s.server_latency() {
            self.instruments.duration.record(latency, &duration_attrs);
        }
        if s.outcome.is_ok() {
            self.record_success(&attrs, s, rec);
        }
        if let Some((_, tracer)) = &self.tracing {
            let name = span_name.unwrap_or_else(|| "chat".to_owned());
            self.span(tracer, name, attrs, rec);
        }
    }

    /// What only a successful request has: its TTFT, ITL and chunk gaps, the tokens it counts
    /// for (input tokens where the server reported usage) and the server's own timing.
    fn record_success(&self, attrs: &[KeyValue], s: &Sample, rec: &RequestRecord) {
        if let Some(t) = s.ttft {
            self.instruments.ttfc.record(t, attrs);
        }
        if let Some(i) = s.itl {
            self.instruments.itl.record(i, attrs);
        }
        for (gap_per_token, tokens) in rec.token_gaps() {
            let chunk_gap = gap_per_token.as_secs_f64() * f64::from(tokens);
            self.instruments.per_chunk.record(chunk_gap, attrs);
        }
        let mut token_attrs = attrs.to_vec();
        token_attrs.push(KeyValue::new("gen_ai.token.type", "input"));
        if rec.usage.is_some() {
            self.instruments
                .tokens
                .record(s.prompt_tokens, &token_attrs);
        }
        token_attrs.pop();
        token_attrs.push(KeyValue::new("gen_ai.token.type", "output"));
        self.instruments
            .tokens
            .record(s.output_tokens, &token_attrs);
        self.instruments.cached.add(s.cached_tokens, attrs);
        if let Some(split) = s.server {
            self.instruments
                .server_ttft
                .record(split.server_ttft, attrs);
            for (instrument, value) in [
                (&self.instruments.server_queue, split.server_queue),
                (&self.instruments.server_prefill, split.server_prefill),
            ] {
                if let Some(v) = value {
                    instrument.record(v, attrs);
                }
            }
        }
    }

    /// One client span per request, from the intended send to the request's end, with the first
    /// content chunk as an event.
    fn span(&self, tracer: &SdkTracer, name: String, attrs: Vec<KeyValue>, rec: &RequestRecord) {
        let now = Instant::now();
        let wall_now = SystemTime::now();
        let wall = |at: Instant| wall_now - now.saturating_duration_since(at);
        let name: Cow<'static, str> = name.into();
        let mut attributes = attrs;
        attributes.push(KeyValue::new(
            "llm_canary.request_id",
            rec.request_id.clone(),
        ));
        if let Some(p) = rec.prompt_tokens() {
            attributes.push(KeyValue::new("gen_ai.usage.input_tokens", p as i64));
        }
        attributes.push(KeyValue::new(
            "gen_ai.usage.output_tokens",
            rec.output_tokens() as i64,
        ));
        if let Some(t) = rec.ttft() {
            attributes.push(KeyValue::new(
                "gen_ai.response.time_to_first_chunk",
                t.as_secs_f64(),
            ));
        }
        if let Some(split) = rec.server_split() {
            let ms = |v: f64| v * 1e3;
            attributes.push(KeyValue::new(
                "llm_canary.server.ttft_ms",
                ms(split.server_ttft),
            ));
            attributes.push(KeyValue::new(
                "llm_canary.server.handoff_ms",
                ms(split.handoff),
            ));
            for (key, value) in [
                ("llm_canary.server.queue_ms", split.server_queue),
                ("llm_canary.server.prefill_ms", split.server_prefill),
                ("llm_canary.server.kv_transfer_ms", split.kv_transfer),
            ] {
                if let Some(v) = value {
                    attributes.push(KeyValue::new(key, ms(v)));
                }
            }
        }
        if let Some(rate) = rec.server_timing.as_ref().and_then(|t| t.kv_hit_rate) {
            attributes.push(KeyValue::new("llm_canary.server.kv_hit_rate", rate));
        }
        if let Some(worker) = &rec.worker_id {
            let (prefill, decode) = worker.prefill_and_decode();
            for (key, value) in [
                ("llm_canary.server.prefill_worker_id", prefill),
                ("llm_canary.server.decode_worker_id", decode),
            ] {
                if let Some(v) = value {
                    attributes.push(KeyValue::new(key, v));
                }
            }
        }
        let mut span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_start_time(wall(rec.intended))
            .with_attributes(attributes)
            .start(tracer);
        if let Some(first) = rec.first_token_at() {
            span.add_event_with_timestamp("first_chunk", wall(first), vec![]);
        }
        if rec.outcome.is_error() {
            span.set_attribute(KeyValue::new("error.type", rec.outcome.as_str()));
            span.set_status(Status::error(rec.outcome.as_str()));
        }
        span.end_with_timestamp(wall(rec.intended + rec.latency()));
    }

    /// Exports what is still buffered and stops the pipeline (at shutdown); records after this are
    /// dropped. Bounded by the export timeout: a collector that is down costs one failed export,
    /// logged, never a hang.
    pub async fn shutdown(self: std::sync::Arc<Self>) {
        let result = tokio::task::spawn_blocking(move || {
            let mut errors = Vec::new();
            if let Some((provider, _)) = &self.tracing {
                if let Err(e) = provider.force_flush() {
                    errors.push(format!("spans: {e}"));
                }
                if let Err(e) = provider.shutdown() {
                    errors.push(format!("span pipeline: {e}"));
                }
            }
            if let Err(e) = self.meters.force_flush() {
                errors.push(format!("metrics: {e}"));
            }
            if let Err(e) = self.meters.shutdown() {
                errors.push(format!("metric pipeline: {e}"));
            }
            errors
        })
        .await;
        match result {
            Ok(errors) if errors.is_empty() => tracing::info!("OTLP export flushed"),
            Ok(errors) => tracing::warn!(errors = ?errors, "OTLP flush at shutdown failed"),
            Err(e) => tracing::warn!(error = %e, "OTLP flush task failed"),
        }
    }
}

/// OTLP over gRPC (tonic) with the SDK's thread-based periodic reader and batch span processor.
///
/// Those export from their own OS threads, which have no Tokio runtime, while tonic needs one: the
/// channel spawns its worker onto the runtime it is built in and its connections, timeouts and
/// retry back-off run on a reactor. Borrowing the caller's runtime ties every export to it: a
/// runtime busy or blocked in the exporter's drop (which flushes synchronously) stalls the final
/// export for the SDK's 5 s shutdown timeout and loses it. So the exporters own a one-worker
/// runtime: they are built inside it (the channel's worker lives there) and [`OnRuntime`] polls
/// every export in its context.
#[cfg(feature = "otlp-grpc")]
mod grpc {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Duration;

    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::metrics::Temporality;
    use opentelemetry_sdk::metrics::data::ResourceMetrics;
    use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
    use opentelemetry_sdk::trace::{SpanData, SpanExporter};
    use tokio_util::context::TokioContext;

    use super::{EXPORT_TIMEOUT, OtlpError};
    use crate::config::Otlp;

    /// The exporters' runtime, shared by the metric and the span exporter and shut down when the
    /// last of them is dropped. That may happen on an async worker thread (the daemon's last
    /// handle), where a blocking runtime shutdown panics: it is shut down in the background.
    #[derive(Debug)]
    struct ExportRuntime(Option<tokio::runtime::Runtime>);

    impl ExportRuntime {
        fn handle(&self) -> &tokio::runtime::Handle {
            self.0
                .as_ref()
                .expect("the runtime lives until drop")
                .handle()
        }
    }

    impl Drop for ExportRuntime {
        fn drop(&mut self) {
            if let Some(runtime) = self.0.take() {
                runtime.shutdown_background();
            }
        }
    }

    /// A tonic exporter whose futures are polled in the context of the exporters' runtime (from
    /// the SDK's threads, which block on them), and which keeps that runtime alive.
    #[derive(Debug)]
    pub(super) struct OnRuntime<E> {
        inner: E,
        runtime: Arc<ExportRuntime>,
    }

    impl<E> OnRuntime<E> {
        fn in_context<F: Future>(&self, future: F) -> TokioContext<F> {
            TokioContext::new(future, self.runtime.handle().clone())
        }
    }

    impl<E: PushMetricExporter> PushMetricExporter for OnRuntime<E> {
        fn export(&self, metrics: &ResourceMetrics) -> impl Future<Output = OTelSdkResult> + Send {
            self.in_context(self.inner.export(metrics))
        }

        fn force_flush(&self) -> OTelSdkResult {
            self.inner.force_flush()
        }

        fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
            self.inner.shutdown_with_timeout(timeout)
        }

        fn shutdown(&self) -> OTelSdkResult {
            self.inner.shutdown()
        }

        fn temporality(&self) -> Temporality {
            self.inner.temporality()
        }
    }

    impl<E: SpanExporter> SpanExporter for OnRuntime<E> {
        fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
            self.in_context(self.inner.export(batch))
        }

        fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
            self.inner.shutdown_with_timeout(timeout)
        }

        fn shutdown(&self) -> OTelSdkResult {
            self.inner.shutdown()
        }

        fn force_flush(&self) -> OTelSdkResult {
            self.inner.force_flush()
        }

        fn set_resource(&mut self, resource: &Resource) {
            self.inner.set_resource(resource);
        }
    }

    /// The gRPC exporters of `cfg`, built on (and owning) a runtime of their own.
    pub(super) fn exporters(
        cfg: &Otlp,
    ) -> Result<
        (
            OnRuntime<opentelemetry_otlp::MetricExporter>,
            Option<OnRuntime<opentelemetry_otlp::SpanExporter>>,
        ),
        OtlpError,
    > {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-grpc")
            .enable_all()
            .build()
            .map_err(OtlpError::Runtime)?;
        let runtime = Arc::new(ExportRuntime(Some(runtime)));
        // Built inside the runtime: tonic's channel spawns its worker onto the current one.
        let (metrics, spans) = {
            let _inside = runtime.handle().enter();
            let metrics = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .with_endpoint(cfg.endpoint.value.clone())
                .with_timeout(EXPORT_TIMEOUT)
                .build()?;
            let spans = if cfg.spans {
                Some(
                    opentelemetry_otlp::SpanExporter::builder()
                        .with_tonic()
                        .with_endpoint(cfg.endpoint.value.clone())
                        .with_timeout(EXPORT_TIMEOUT)
                        .build()?,
                )
            } else {
                None
            };
            (metrics, spans)
        };
        Ok((
            OnRuntime {
                inner: metrics,
                runtime: Arc::clone(&runtime),
            },
            spans.map(|inner| OnRuntime { inner, runtime }),
        ))
    }
}

/// Without the `otlp-grpc` feature, `protocol: grpc` is refused by config validation, and here
/// again when an exporter is started from a config built in code.
#[cfg(not(feature = "otlp-grpc"))]
mod grpc {
    use super::OtlpError;
    use crate::config::Otlp;

    pub(super) fn exporters(
        _cfg: &Otlp,
    ) -> Result<
        (
            opentelemetry_otlp::MetricExporter,
            Option<opentelemetry_otlp::SpanExporter>,
        ),
        OtlpError,
    > {
        Err(OtlpError::GrpcNotBuilt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_paths_are_appended_to_a_base_url_only() {
        assert_eq!(
            signal_url("http://collector:4318", "/v1/metrics").unwrap(),
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(
            signal_url("http://collector:4318/", "/v1/traces").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            signal_url("http://prom:9090/api/v1/otlp/v1/metrics", "/v1/metrics").unwrap(),
            "http://prom:9090/api/v1/otlp/v1/metrics"
        );
        assert!(signal_url("not a url", "/v1/metrics").is_err());
    }

    #[test]
    fn empty_labels_are_not_attributes() {
        let labels =
            RequestLabels::new("agg", crate::config::ServingMode::Aggregated, "multi_turn")
                .with_turn(2);
        let keys: Vec<String> = label_attributes(&labels)
            .iter()
            .map(|kv| kv.key.to_string())
            .collect();
        assert_eq!(keys, ["target", "serving_mode", "workload", "turn"]);
    }
}
