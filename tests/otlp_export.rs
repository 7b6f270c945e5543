//! The OTLP pipeline against an in-test OTLP/HTTP receiver (hyper on loopback decoding
//! `opentelemetry-proto`'s `ExportMetricsServiceRequest` and `ExportTraceServiceRequest`): the
//! GenAI histograms arrive with second-based explicit bounds, the canary's labels and the GenAI
//! attributes, and one span per request carries TTFT as an event. Flushing at shutdown delivers
//! everything without waiting for the export interval, and so does dropping the last handle, even
//! on a runtime that is blocked meanwhile.
//!
//! Built with the `otlp-grpc` feature, the same cases run over gRPC against an in-test tonic
//! receiver serving `opentelemetry-proto`'s generated `MetricsService` and `TraceService`
//! (`cargo test --features otlp-grpc --test otlp_export`).

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use llm_canary::client::{
    Outcome, Prompt, RequestRecord, ServerTiming, StreamRequest, Usage, WorkerId,
};
use llm_canary::config::{Api, At, Dur, Otlp, OtlpProtocol, ServingMode};
use llm_canary::export::buckets::latency_buckets;
use llm_canary::export::otlp::{OtlpExporter, OtlpTarget};
use llm_canary::model::{Finished, Phase, RecordContext};
use llm_canary::request::GoodputLimits;
use llm_canary::request::RequestLabels;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{HistogramDataPoint, metric};
use prost::Message;
use tokio::net::TcpListener;
use tokio::time::Instant;

#[derive(Default)]
struct Received {
    metrics: Vec<ExportMetricsServiceRequest>,
    traces: Vec<ExportTraceServiceRequest>,
    paths: Vec<String>,
}

/// An OTLP/HTTP receiver: decodes every POST by path and answers 200 with an empty response.
async fn receiver() -> (String, Arc<Mutex<Received>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Received::default()));
    let store = Arc::clone(&received);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let store = Arc::clone(&store);
                    async move {
                        let path = req.uri().path().to_owned();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let mut r = store.lock().unwrap();
                        r.paths.push(path.clone());
                        match path.as_str() {
                            "/v1/metrics" => r
                                .metrics
                                .push(ExportMetricsServiceRequest::decode(body).unwrap()),
                            "/v1/traces" => r
                                .traces
                                .push(ExportTraceServiceRequest::decode(body).unwrap()),
                            _ => {}
                        }
                        let resp = Response::builder()
                            .header("content-type", "application/x-protobuf")
                            .body(Full::new(Bytes::new()))
                            .unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, received)
}

/// A successful streamed request: TTFT 200 ms, then 4 chunks 20 ms apart, 100 prompt tokens.
fn record() -> RequestRecord {
    // In the past, as every finished request's instants are.
    let t0 = Instant::now() - Duration::from_secs(1);
    let mut rec = RequestRecord::new("req-1", t0, t0);
    let ms = Duration::from_millis;
    for i in 0..5 {
        rec.push_content(t0 + ms(200 + 20 * i), 1);
    }
    rec.usage = Some(Usage {
        prompt_tokens: 100,
        completion_tokens: 5,
        cached_tokens: 40,
    });
    // Dynamo's own timing: 30 ms waiting and 120 ms prefilling of the 200 ms TTFT.
    rec.server_timing = Some(ServerTiming {
        prefill_wait_time_ms: Some(30.0),
        prefill_time_ms: Some(120.0),
        ttft_ms: Some(150.0),
        kv_hit_rate: Some(0.4),
        ..ServerTiming::default()
    });
    rec.worker_id = Some(WorkerId::Split {
        prefill_worker_id: Some(7),
        decode_worker_id: Some(9),
        prefill_dp_rank: None,
        decode_dp_rank: None,
    });
    rec.settle(Outcome::Ok, t0 + ms(300), None);
    rec
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn string_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    match attr(attrs, key)? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// The histogram points of `name` in the last export that has it (temporality is cumulative, so
/// the flush and the shutdown each export the same totals).
fn histogram_points(received: &Received, name: &str) -> Vec<HistogramDataPoint> {
    let mut points = Vec::new();
    for req in received.metrics.iter().rev() {
        if !points.is_empty() {
            break;
        }
        for rm in &req.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in sm.metrics.iter().filter(|m| m.name == name) {
                    if let Some(metric::Data::Histogram(h)) = &m.data {
                        points.extend(h.data_points.iter().cloned());
                    }
                }
            }
        }
    }
    points
}

/// The exporter's config: `endpoint` over `protocol`, exporting every `interval_secs`, with spans
/// or without.
fn otlp(endpoint: &str, protocol: OtlpProtocol, interval_secs: u64, spans: bool) -> Otlp {
    Otlp {
        endpoint: At::dflt(endpoint.to_owned()),
        protocol: At::dflt(protocol),
        interval: At::dflt(Dur::secs(interval_secs)),
        spans,
    }
}

/// `rec` as a finished request of `labels` in `phase`, handed to `exporter` as the recorder
/// hands it on.
fn export(exporter: &OtlpExporter, labels: &RequestLabels, phase: Phase, rec: &RequestRecord) {
    let request = StreamRequest {
        request_id: rec.request_id.clone(),
        prompt: Prompt::Text(String::new()),
        osl: 4,
    };
    let ctx = RecordContext {
        target_index: 0,
        isl: 0,
        labels,
        phase,
        osl: 4,
        shared_prefix_tokens: 0,
        request: &request,
        goodput: GoodputLimits {
            ttft: f64::INFINITY,
            itl: f64::INFINITY,
        },
    };
    exporter.record(&Finished::new(&ctx, rec));
}

/// Starts the exporter (spans on) for `protocol` at `url`, records [`record`] once as a steady
/// and once as a warmup request, and shuts the exporter down.
async fn export_one_request(url: &str, protocol: OtlpProtocol) {
    // An interval longer than the test: only the shutdown flush can deliver the data.
    let cfg = otlp(url, protocol, 3600, true);
    let target = OtlpTarget::new(
        "sim-agg",
        Api::Chat,
        "qwen",
        &url::Url::parse("http://127.0.0.1:8000").unwrap(),
    );
    let exporter = Arc::new(OtlpExporter::start(&cfg, vec![target]).await.unwrap());
    let labels = RequestLabels::new("sim-agg", ServingMode::Aggregated, "concurrency_sweep")
        .with_concurrency(32);
    let rec = record();
    export(&exporter, &labels, Phase::Steady, &rec);
    // A warmup request only counts.
    export(&exporter, &labels, Phase::Warmup, &rec);
    Arc::clone(&exporter).shutdown().await;
    // The last handle is dropped here, on a runtime worker thread.
    drop(exporter);
}

/// What a receiver must have got from [`export_one_request`], whatever the transport.
fn assert_one_request_exported(r: &Received) {
    let seconds_bounds = latency_buckets(&[]);
    for (name, count, sum) in [
        ("gen_ai.client.operation.duration", 1, 0.28),
        ("gen_ai.client.operation.time_to_first_chunk", 1, 0.2),
        ("gen_ai.client.operation.time_per_output_chunk", 4, 0.08),
        ("llm_canary.inter_token_latency", 1, 0.02),
        ("llm_canary.server.time_to_first_token", 1, 0.15),
        ("llm_canary.server.queue_time", 1, 0.03),
        ("llm_canary.server.prefill_time", 1, 0.12),
    ] {
        let points = histogram_points(r, name);
        assert_eq!(points.len(), 1, "{name}: {points:?}");
        let p = &points[0];
        assert_eq!(
            p.explicit_bounds, seconds_bounds,
            "{name}: bounds in seconds"
        );
        assert_eq!(p.explicit_bounds.first(), Some(&0.001));
        assert_eq!(p.explicit_bounds.last(), Some(&120.0));
        assert_eq!(p.count, count, "{name}");
        assert!(
            (p.sum.unwrap() - sum).abs() < 1e-9,
            "{name}: sum {:?}",
            p.sum
        );
        for (key, value) in [
            ("target", "sim-agg"),
            ("serving_mode", "aggregated"),
            ("workload", "concurrency_sweep"),
            ("concurrency", "32"),
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", "qwen"),
            ("server.address", "127.0.0.1"),
        ] {
            assert_eq!(
                string_attr(&p.attributes, key).as_deref(),
                Some(value),
                "{name}: {key}"
            );
        }
        assert_eq!(
            string_attr(&p.attributes, "turn"),
            None,
            "empty labels are left out"
        );
        // The TTFT lands in the bucket whose bound is the first >= 0.2 s.
        if name == "gen_ai.client.operation.time_to_first_chunk" {
            let i = seconds_bounds.partition_point(|b| *b < 0.2);
            assert_eq!(p.bucket_counts[i], 1);
        }
    }
    let tokens = histogram_points(r, "gen_ai.client.token.usage");
    let by_type = |t: &str| {
        tokens
            .iter()
            .find(|p| string_attr(&p.attributes, "gen_ai.token.type").as_deref() == Some(t))
            .map(|p| p.sum.unwrap())
    };
    assert_eq!(by_type("input"), Some(100.0));
    assert_eq!(by_type("output"), Some(5.0));

    // One span, for the steady request, with TTFT as an event 200 ms after its start.
    let spans: Vec<_> = r
        .traces
        .iter()
        .flat_map(|t| &t.resource_spans)
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
        .collect();
    assert_eq!(spans.len(), 1, "{spans:?}");
    let span = spans[0];
    assert_eq!(span.name, "chat qwen");
    let event = span
        .events
        .iter()
        .find(|e| e.name == "first_chunk")
        .expect("first_chunk event");
    let ttft_ns = event.time_unix_nano - span.start_time_unix_nano;
    assert!(
        (ttft_ns as i64 - 200_000_000).abs() < 1_000_000,
        "{ttft_ns}"
    );
    let latency_ns = span.end_time_unix_nano - span.start_time_unix_nano;
    assert!(
        (latency_ns as i64 - 280_000_000).abs() < 1_000_000,
        "{latency_ns}"
    );
    assert_eq!(
        string_attr(&span.attributes, "llm_canary.request_id").as_deref(),
        Some("req-1")
    );
    // The server's timing and its workers on the span (never on a metric point).
    let double = |key: &str| match attr(&span.attributes, key) {
        Some(any_value::Value::DoubleValue(v)) => Some(*v),
        _ => None,
    };
    assert_eq!(double("llm_canary.server.ttft_ms"), Some(150.0));
    assert_eq!(double("llm_canary.server.queue_ms"), Some(30.0));
    let handoff = double("llm_canary.server.handoff_ms").unwrap();
    assert!((handoff - 50.0).abs() < 1e-6, "{handoff}");
    assert_eq!(
        string_attr(&span.attributes, "llm_canary.server.prefill_worker_id").as_deref(),
        Some("7")
    );
    for name in [
        "gen_ai.client.operation.time_to_first_chunk",
        "llm_canary.server.time_to_first_token",
    ] {
        for p in histogram_points(r, name) {
            assert!(
                attr(&p.attributes, "llm_canary.server.prefill_worker_id").is_none(),
                "{name}: a worker id on a metric point"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_receiver_gets_second_based_genai_histograms_and_spans() {
    let (url, received) = receiver().await;
    export_one_request(&url, OtlpProtocol::HttpProtobuf).await;
    let r = received.lock().unwrap();
    assert!(r.paths.iter().any(|p| p == "/v1/metrics"), "{:?}", r.paths);
    assert_one_request_exported(&r);
}

/// `receiver` on a runtime of its own thread (left running until the test process exits), for a
/// test that blocks its own runtime.
fn serve_elsewhere<F, Fut>(receiver: F) -> (String, Arc<Mutex<Received>>)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = (String, Arc<Mutex<Received>>)>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            tx.send(receiver().await).unwrap();
            std::future::pending::<()>().await
        });
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap()
}

/// Drops the last handle without `shutdown` on the test's current-thread runtime: the SDK's drop
/// exports synchronously, so the runtime's only thread is blocked meanwhile, and the export must
/// not need it (the receiver runs elsewhere). With an interval longer than the test, that final
/// export is the only one.
async fn dropped_exporter_flushes(url: &str, protocol: OtlpProtocol, received: &Mutex<Received>) {
    let cfg = otlp(url, protocol, 3600, false);
    let exporter = OtlpExporter::start(&cfg, vec![]).await.unwrap();
    let labels = RequestLabels::new("sim-agg", ServingMode::Aggregated, "concurrency_sweep");
    export(&exporter, &labels, Phase::Steady, &record());
    drop(exporter);
    let r = received.lock().unwrap();
    let points = histogram_points(&r, "gen_ai.client.operation.duration");
    assert_eq!(points.len(), 1, "{points:?}");
    assert_eq!(points[0].count, 1);
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_the_exporter_on_a_blocked_runtime_still_flushes_over_http() {
    let (url, received) = serve_elsewhere(receiver);
    dropped_exporter_flushes(&url, OtlpProtocol::HttpProtobuf, &received).await;
}

/// Why an exporter over gRPC to `endpoint` does not start.
async fn grpc_start_error(endpoint: &str) -> String {
    let cfg = otlp(endpoint, OtlpProtocol::Grpc, 15, false);
    OtlpExporter::start(&cfg, vec![])
        .await
        .unwrap_err()
        .to_string()
}

#[tokio::test]
async fn grpc_without_the_feature_is_a_clear_error() {
    if cfg!(feature = "otlp-grpc") {
        return;
    }
    let err = grpc_start_error("http://127.0.0.1:4317").await;
    assert!(err.contains("otlp-grpc"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pushes_both_modes_and_flushes_at_shutdown() {
    let (url, received) = receiver().await;
    daemon_pushes_and_flushes(&format!("endpoint: \"{url}\""), &received).await;
}

/// Runs the daemon on the fast demo with `export.otlp: { <otlp>, interval: 1s }`: both modes'
/// TTFT arrive while it runs, and SIGTERM flushes once more before it exits.
async fn daemon_pushes_and_flushes(otlp: &str, received: &Mutex<Received>) {
    let dir = tempfile::tempdir().unwrap();
    let demo = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/fast-demo.yaml"),
    )
    .unwrap();
    let config = dir.path().join("otlp.yaml");
    let with_otlp = demo.replace(
        "export: { listen: \"127.0.0.1:0\" }",
        &format!("export: {{ listen: \"127.0.0.1:0\", otlp: {{ {otlp}, interval: 1s }} }}"),
    );
    assert_ne!(with_otlp, demo, "fast-demo.yaml changed shape");
    std::fs::write(&config, with_otlp).unwrap();
    let (daemon, _addr) = support::start_daemon(Some(&config), dir.path());
    let modes = |r: &Received| {
        let mut m: Vec<String> = histogram_points(r, "gen_ai.client.operation.time_to_first_chunk")
            .iter()
            .filter_map(|p| string_attr(&p.attributes, "serving_mode"))
            .collect();
        m.sort();
        m.dedup();
        m
    };
    support::eventually(
        "TTFT of both modes over OTLP",
        Duration::from_secs(60),
        || {
            let ok = modes(&received.lock().unwrap()) == ["aggregated", "disaggregated"];
            async move { ok.then_some(()) }
        },
    )
    .await;
    // SIGTERM: the daemon drains and flushes once more before it exits.
    let before = received.lock().unwrap().metrics.len();
    daemon.signal("TERM");
    let status = tokio::task::spawn_blocking(move || {
        let mut daemon = daemon;
        let status = daemon.child.wait().unwrap();
        (status, daemon.log_text())
    })
    .await
    .unwrap();
    assert!(status.0.success(), "{}", status.1);
    assert!(status.1.contains("OTLP export flushed"), "{}", status.1);
    assert!(received.lock().unwrap().metrics.len() > before);
}

/// The same cases over gRPC: a tonic server on loopback with `opentelemetry-proto`'s generated
/// services, keeping every request in the same [`Received`] as the HTTP receiver.
#[cfg(feature = "otlp-grpc")]
mod grpc {
    use std::sync::{Arc, Mutex};

    use llm_canary::config::OtlpProtocol;
    use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
        MetricsService, MetricsServiceServer,
    };
    use opentelemetry_proto::tonic::collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use tokio::net::TcpListener;
    use tonic::server::NamedService;
    use tonic::{Request, Response, Status};
    use tower::ServiceExt as _;

    use super::{
        Received, daemon_pushes_and_flushes, dropped_exporter_flushes, export_one_request,
        serve_elsewhere,
    };

    #[derive(Clone)]
    struct Collector(Arc<Mutex<Received>>);

    #[tonic::async_trait]
    impl MetricsService for Collector {
        async fn export(
            &self,
            request: Request<ExportMetricsServiceRequest>,
        ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
            self.0.lock().unwrap().metrics.push(request.into_inner());
            Ok(Response::new(ExportMetricsServiceResponse::default()))
        }
    }

    #[tonic::async_trait]
    impl TraceService for Collector {
        async fn export(
            &self,
            request: Request<ExportTraceServiceRequest>,
        ) -> Result<Response<ExportTraceServiceResponse>, Status> {
            self.0.lock().unwrap().traces.push(request.into_inner());
            Ok(Response::new(ExportTraceServiceResponse::default()))
        }
    }

    /// An OTLP/gRPC receiver: both services behind one port (routed by the gRPC path, which is
    /// kept in `paths`), as a collector's `otlp` receiver serves them.
    async fn receiver() -> (String, Arc<Mutex<Received>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Received::default()));
        let collector = Collector(Arc::clone(&received));
        let metrics = MetricsServiceServer::new(collector.clone());
        let traces = TraceServiceServer::new(collector);
        let metrics_prefix = format!("/{}/", MetricsServiceServer::<Collector>::NAME);
        let store = Arc::clone(&received);
        let route = tower::service_fn(move |req: http::Request<tonic::body::Body>| {
            let path = req.uri().path().to_owned();
            let to_metrics = path.starts_with(&metrics_prefix);
            store.lock().unwrap().paths.push(path);
            let (metrics, traces) = (metrics.clone(), traces.clone());
            async move {
                if to_metrics {
                    metrics.oneshot(req).await
                } else {
                    traces.oneshot(req).await
                }
            }
        });
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .serve_with_incoming(route, incoming)
                .await
                .unwrap();
        });
        (url, received)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn otlp_grpc_receiver_gets_second_based_genai_histograms_and_spans() {
        let (url, received) = receiver().await;
        export_one_request(&url, OtlpProtocol::Grpc).await;
        let r = received.lock().unwrap();
        for path in [
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        ] {
            assert!(r.paths.iter().any(|p| p == path), "{path}: {:?}", r.paths);
        }
        super::assert_one_request_exported(&r);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn dropping_the_exporter_on_a_blocked_runtime_still_flushes_over_grpc() {
        let (url, received) = serve_elsewhere(receiver);
        dropped_exporter_flushes(&url, OtlpProtocol::Grpc, &received).await;
    }

    #[tokio::test]
    async fn grpc_over_tls_is_a_clear_error() {
        let err = super::grpc_start_error("https://127.0.0.1:4317").await;
        assert!(err.contains("HTTPS"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn daemon_pushes_both_modes_over_grpc_and_flushes_at_shutdown() {
        let (url, received) = receiver().await;
        daemon_pushes_and_flushes(&format!("endpoint: \"{url}\", protocol: grpc"), &received).await;
    }
}
