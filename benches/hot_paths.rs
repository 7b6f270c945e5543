//! Micro-benchmarks of the canary's hot paths (issue #10), with criterion:
//!
//! - `sse_parse`: the SSE parser over a streamed chat completion, one event per network read (a
//!   server flushing every token) and 16 KiB reads (a busy connection); throughput in bytes/s.
//! - `record_request`: one finished request into the metrics registry and step accumulators, the
//!   work the runner does per request.
//! - `metrics_encode`: the full `/metrics` exposition of two targets running the default plan
//!   (every request label set, every outcome, step, server and SLO series), after one request
//!   changed a series, as between two scrapes of a running daemon.
//! - `slo_tick`: one evaluation tick of the demo config's SLOs over filled windows.
//!
//! ```text
//! cargo bench --bench hot_paths              # all
//! cargo bench --bench hot_paths -- sse_parse # one group
//! ```
//! `cargo test --all-targets` only builds this and runs each benchmark once.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use llm_canary::client::{
    ChatMessage, Outcome, Prompt, RequestRecord, Role, SseParser, StreamRequest,
};
use llm_canary::config::{Config, ServingMode};
use llm_canary::export::metrics::Metrics;
use llm_canary::measure::step::StepAccumulator;
use llm_canary::model::{Phase, RecordContext, StepResult};
use llm_canary::request::RequestLabels;
use llm_canary::request::Sample;
use llm_canary::schedule::Recorder;
use llm_canary::slo::SloEngine;
use llm_canary::slo::baseline::BaselineStore;
use llm_canary::slo::eval::RequestSample;
use tokio::time::Instant;

#[path = "support/series.rs"]
mod series;

use series::{TARGETS, fill, step_labels};

/// A chat completion stream of `tokens` content chunks as vLLM/Dynamo send it.
fn chat_stream(tokens: usize) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(
        b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"Qwen/Qwen3-30B-A3B-FP8\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    );
    for i in 0..tokens {
        body.extend_from_slice(
            format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"Qwen/Qwen3-30B-A3B-FP8\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i}\"}},\"finish_reason\":null}}]}}\n\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(b"data: {\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":1024,\"completion_tokens\":512}}\n\ndata: [DONE]\n\n");
    body
}

/// Splits `body` at every event boundary (one event per read).
fn per_event_reads(body: &[u8]) -> Vec<Bytes> {
    let mut reads = Vec::new();
    let mut start = 0;
    for end in memchr::memmem::find_iter(body, b"\n\n") {
        reads.push(Bytes::copy_from_slice(&body[start..end + 2]));
        start = end + 2;
    }
    reads
}

fn sse_parse(c: &mut Criterion) {
    let body = chat_stream(512);
    let mut group = c.benchmark_group("sse_parse");
    group.throughput(Throughput::Bytes(body.len() as u64));
    let one_per_read = per_event_reads(&body);
    let big_reads: Vec<Bytes> = body.chunks(16 * 1024).map(Bytes::copy_from_slice).collect();
    for (name, reads) in [
        ("event_per_read", &one_per_read),
        ("16KiB_reads", &big_reads),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut parser = SseParser::default();
                let mut events = 0usize;
                for read in reads {
                    // A clone of `Bytes` is a reference count, as a network read hands it over.
                    parser.feed(read.clone());
                    while let Ok(Some(event)) = parser.next_event() {
                        events += event.data.len();
                    }
                }
                black_box(events)
            })
        });
    }
    group.finish();
}

/// A finished request of `tokens` chunks, 20 ms apart after a 100 ms TTFT.
fn record(tokens: u32) -> RequestRecord {
    let t0 = Instant::now();
    let mut rec = RequestRecord::new("bench-1", t0, t0);
    for i in 0..tokens {
        rec.push_content(
            t0 + Duration::from_millis(100) + Duration::from_millis(20) * i,
            1,
        );
    }
    let end = t0 + Duration::from_millis(100) + Duration::from_millis(20) * tokens;
    rec.usage = Some(llm_canary::client::Usage {
        prompt_tokens: 1024,
        completion_tokens: u64::from(tokens),
        cached_tokens: 0,
    });
    rec.settle(Outcome::Ok, end, None);
    rec
}

fn record_request(c: &mut Criterion) {
    let metrics = Arc::new(Metrics::new(&[2.0]));
    fill(&metrics);
    let recorder = Recorder::new(vec![metrics]);
    let labels = RequestLabels::new("sim-agg", ServingMode::Aggregated, "concurrency_sweep")
        .with_concurrency(32);
    let request = StreamRequest {
        request_id: "bench-1".into(),
        prompt: Prompt::Chat(vec![ChatMessage {
            role: Role::User,
            content: "hello".into(),
        }]),
        osl: 256,
    };
    let rec = record(256);
    let ctx = RecordContext {
        target_index: 0,
        isl: 0,
        labels: &labels,
        phase: Phase::Steady,
        osl: 256,
        shared_prefix_tokens: 0,
        request: &request,
        goodput: llm_canary::request::GoodputLimits {
            ttft: 2.0,
            itl: 0.1,
        },
    };
    c.bench_function("record_request/osl256", |b| {
        b.iter(|| recorder.record(&ctx, black_box(&rec)))
    });
}

fn metrics_encode(c: &mut Criterion) {
    let metrics = Metrics::new(&[2.0, 0.5, 0.05]);
    fill(&metrics);
    let text = metrics.encode().expect("encodes");
    let labels = RequestLabels::new("sim-agg", ServingMode::Aggregated, "concurrency_sweep")
        .with_concurrency(32);
    let mut group = c.benchmark_group("metrics_encode");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("full_series_set", |b| {
        b.iter(|| {
            // Between two scrapes the step in progress records requests.
            metrics.record_request(
                &labels,
                Phase::Steady,
                &Sample {
                    outcome: Outcome::Ok,
                    ttft: Some(0.1),
                    itl: Some(0.02),
                    latency: 5.0,
                    prompt_tokens: 1024,
                    output_tokens: 256,
                    ..Sample::default()
                },
            );
            black_box(metrics.encode().expect("encodes").len())
        })
    });
    group.finish();
}

fn demo_config() -> Config {
    let text = include_str!("../examples/demo.yaml");
    Config::parse(text, "examples/demo.yaml", std::path::Path::new("examples"))
        .expect("the demo config is valid")
}

fn slo_tick(c: &mut Criterion) {
    let cfg = demo_config();
    let defs = llm_canary::slo::compile_all(&cfg).expect("the demo SLOs compile");
    let engine = SloEngine::new(
        defs,
        llm_canary::slo::LabelDomain::of(&cfg),
        BaselineStore::in_memory(),
        None,
    );
    // One step of 200 requests per label set and target: a full cycle of the demo in the windows.
    for (target, mode) in TARGETS {
        for labels in step_labels(target, mode) {
            for i in 0..200u32 {
                let ttft = 0.1 + f64::from(i % 50) * 0.002;
                engine.observe(
                    &labels,
                    RequestSample {
                        ok: true,
                        ttft: Some(ttft),
                        itl: Some(0.02),
                        latency: Some(ttft + 5.0),
                        server_ttft: Some(ttft * 0.9),
                        ..RequestSample::default()
                    },
                );
            }
            let mut measurements = StepAccumulator::default().finish(
                Duration::from_secs(30),
                Some(60.0),
                Duration::from_millis(50),
            );
            measurements.requests = 200;
            measurements.ok_requests = 200;
            measurements.output_tokens = 200 * 256;
            engine.step_finished(&[StepResult {
                cycle: 0,
                step: format!("{} {}", labels.workload, labels.concurrency),
                total: false,
                started_unix: 0.0,
                ended_unix: 30.0,
                steady_seconds: 30.0,
                measurements,
                labels: labels.clone(),
                server: None,
                connections: None,
            }]);
        }
    }
    c.bench_function("slo_tick/demo_config", |b| {
        b.iter(|| black_box(engine.evaluate_now().len()))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = sse_parse, record_request, metrics_encode, slo_tick
}
criterion_main!(benches);
