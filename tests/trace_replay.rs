//! Trace replay against the simulator, under paused time: a Mooncake trace whose rows share
//! KV-block ids is replayed with every row's exact input and output length, the server's prefix
//! cache hits what the trace implies, every target gets the same rows, the steps carry the
//! `trace` label, and a Dynamo request trace replays too.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use llm_canary::config::Config;
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{Finished, Phase, Sink};
use llm_canary::schedule::{Recorder, plan_cycle};
use llm_canary::targets::Deployment;
use llm_canary::workload::trace::{Trace, TraceFormat};
use tokio_util::sync::CancellationToken;

/// Target, trace label, prompt tokens, completion tokens, outcome.
type Seen = (String, String, u64, u64, &'static str);

#[derive(Default)]
struct Capture(Mutex<Vec<Seen>>);

impl Sink for Capture {
    fn request(&self, req: &Finished<'_>) {
        assert_eq!(req.phase, Phase::Steady, "the steps have no warmup");
        self.0.lock().unwrap().push((
            req.labels.target.clone(),
            req.labels.trace.clone(),
            req.record.prompt_tokens().unwrap_or(0),
            req.record.output_tokens(),
            req.record.outcome.as_str(),
        ));
    }
}

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/testdata/traces/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Two simulators with the trace's 16-token blocks and a cache far larger than the trace; one
/// step per trace, as long as one pass of the Mooncake trace: its rows span 1.892 s and the next
/// pass starts one mean gap later, at 1.941 s.
fn config(speed: f64) -> Config {
    let yaml = format!(
        r#"
targets:
  - {{ name: agg, serving_mode: aggregated, model: sim, simulated: {{ profile: default, block_size: 16 }} }}
  - {{ name: disagg, serving_mode: disaggregated, model: sim, simulated: {{ profile: default, block_size: 16 }} }}
workloads:
  trace_replay:
    traces:
      - {{ name: shared, path: "{}", format: mooncake, block_size: 16 }}
      - {{ name: frontend, path: "{}" }}
    speed: {speed}
    step: 1930ms
    warmup: 0s
"#,
        fixture("mooncake-shared.jsonl"),
        fixture("dynamo-trace.jsonl")
    );
    Config::parse(&yaml, "trace.yaml", Path::new(".")).unwrap()
}

fn lengths(rows: impl Iterator<Item = (u64, u64)>) -> BTreeMap<(u64, u64), usize> {
    let mut m = BTreeMap::new();
    for r in rows {
        *m.entry(r).or_default() += 1;
    }
    m
}

#[tokio::test(start_paused = true)]
async fn a_mooncake_trace_replays_exactly_with_the_prefix_hits_it_implies() {
    let cfg = config(1.0);
    let steps = plan_cycle(&cfg);
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].name(), "trace_replay trace=shared");
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let capture = Arc::new(Capture::default());
    let recorder = Arc::new(Recorder::new(vec![
        Arc::new(Metrics::new(&[])),
        capture.clone(),
    ]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 7));
    let never = CancellationToken::new();
    // Learn the chat template first, as the scheduler does, so every prompt is exact.
    let calibrated = runner.calibrate(&never, &Default::default()).await;
    assert_eq!(calibrated.len(), 2);
    let results = runner.run_step(&steps[0], 0, &never, &never).await;

    let trace = Trace::load(
        Path::new(&fixture("mooncake-shared.jsonl")),
        TraceFormat::Mooncake,
        16,
    )
    .unwrap();
    let want = lengths(
        trace
            .rows
            .iter()
            .map(|r| (u64::from(r.input_length), u64::from(r.output_length))),
    );
    let seen = capture.0.lock().unwrap().clone();
    for target in ["agg", "disagg"] {
        let mine: Vec<_> = seen.iter().filter(|s| s.0 == target).collect();
        assert!(
            mine.iter().all(|s| s.1 == "shared" && s.4 == "ok"),
            "{mine:?}"
        );
        // One pass: every row once, each with its own input and output length, sessions included.
        assert_eq!(lengths(mine.iter().map(|s| (s.2, s.3))), want, "{target}");
        let r = results.iter().find(|r| r.labels.target == target).unwrap();
        assert_eq!(r.labels.step("trace"), Some("shared"));
        assert_eq!(r.labels.trace, "shared");
        // The server's prefix cache hits what the trace's shared block ids imply, give or take
        // the block rounding of the chat template's few tokens before the prompt.
        let (reusable, prompt) = trace.expected_hit_tokens();
        let implied = reusable as f64 / prompt as f64;
        let observed = r.measurements.cache_hit_ratio.unwrap();
        assert!(implied > 0.2, "the fixture shares blocks: {implied}");
        eprintln!("{target}: cache hit observed {observed:.3}, implied by the trace {implied:.3}");
        assert!(
            (observed - implied).abs() < 0.08,
            "{target}: observed {observed:.3}, the trace implies {implied:.3}"
        );
        // The step carries what the trace implies as its expected hit ratio (the bench's
        // "expected hit"): every row sent once, with the exact prompt length.
        let expected = r.measurements.expected_cache_hit_ratio.unwrap();
        assert!(
            (expected - implied).abs() < 1e-3,
            "{target}: expected {expected:.4}, the trace implies {implied:.4}"
        );
    }
    deployment.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_dynamo_request_trace_replays_and_loops() {
    // Four times as fast: about four passes of the trace in the step.
    let cfg = config(4.0);
    let steps = plan_cycle(&cfg);
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let capture = Arc::new(Capture::default());
    let recorder = Arc::new(Recorder::new(vec![
        Arc::new(Metrics::new(&[])),
        capture.clone(),
    ]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 7));
    let never = CancellationToken::new();
    let results = runner.run_step(&steps[1], 0, &never, &never).await;
    let trace = Trace::load(
        Path::new(&fixture("dynamo-trace.jsonl")),
        TraceFormat::Dynamo,
        16,
    )
    .unwrap();
    let seen = capture.0.lock().unwrap().clone();
    for target in ["agg", "disagg"] {
        let mine: Vec<_> = seen.iter().filter(|s| s.0 == target).collect();
        assert!(
            mine.iter().all(|s| s.1 == "frontend" && s.4 == "ok"),
            "{mine:?}"
        );
        // The step outlasts one pass of the trace, so it starts over: more requests than rows.
        let span = trace.span.as_secs_f64();
        if span < 1.5 {
            assert!(
                mine.len() > trace.rows.len(),
                "{} rows, {} sent",
                trace.rows.len(),
                mine.len()
            );
        } else {
            assert!(!mine.is_empty());
        }
        let r = results.iter().find(|r| r.labels.target == target).unwrap();
        assert_eq!(r.measurements.errors, 0);
        assert_eq!(r.labels.step("trace"), Some("frontend"));
        // Each pass writes its blocks afresh: the passes show the trace's own reuse, not hits on
        // the previous pass's prompts (which would approach 100 %).
        let (reusable, prompt) = trace.expected_hit_tokens();
        let implied = reusable as f64 / prompt as f64;
        let observed = r.measurements.cache_hit_ratio.unwrap();
        eprintln!(
            "{target}: cache hit observed {observed:.3} over the passes, implied {implied:.3}"
        );
        assert!((observed - implied).abs() < 0.08, "{observed} vs {implied}");
        // Every pass can hit what the trace implies (the last one cut where the step ended).
        let expected = r.measurements.expected_cache_hit_ratio.unwrap();
        assert!((expected - implied).abs() < 0.08, "{expected} vs {implied}");
    }
    // Paired: both targets were sent the same number of rows.
    let count = |t: &str| seen.iter().filter(|s| s.0 == t).count();
    assert_eq!(count("agg"), count("disagg"));
    deployment.stop().await;
}
