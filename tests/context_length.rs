//! Requests above a target's context length are skipped before they are sent: the embedded
//! simulator reports `max_model_len` on `/v1/models` (and answers 400 above it, as vLLM does);
//! a step whose requests do not fit counts them in `llm_canary_requests_skipped_total` and in
//! its result, and the server sees no error.

mod support;

use std::path::Path;
use std::sync::Arc;

use llm_canary::config::Config;
use llm_canary::export::metrics::Metrics;
use llm_canary::schedule::{Recorder, plan_cycle};
use llm_canary::targets::Deployment;
use tokio_util::sync::CancellationToken;

const CONFIG: &str = r#"
targets:
  - { name: agg, serving_mode: aggregated, simulated: { profile: default, max_model_len: 600 } }
time_scale: 0.02
workloads:
  concurrency_sweep: { levels: [2], isl: 1024, osl: 24, step: 120s, warmup: 20s }
  multi_turn: { turns: 3, conversations: 2, isl: 200, osl: 12, duration: 300s }
  sequence_distribution:
    distributions: [uniform]
    isl: { min: 128, max: 1024 }
    osl: { min: 8, max: 32 }
    concurrency: 4
    step: 120s
    warmup: 20s
schedule: { drain_grace: 5s }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_above_the_reported_context_are_skipped_not_sent() {
    let cfg = Config::parse(CONFIG, "context.yaml", Path::new(".")).unwrap();
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    assert_eq!(
        deployment.targets[0].max_context_tokens,
        Some(600),
        "read from the simulator's /v1/models"
    );
    let metrics = Arc::new(Metrics::new(&[]));
    let recorder = Arc::new(Recorder::new(vec![metrics.clone()]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 7));
    let never = CancellationToken::new();
    runner.calibrate(&never, &Default::default()).await;
    let mut results = Vec::new();
    for step in plan_cycle(&cfg) {
        results.extend(runner.run_step(&step, 0, &never, &never).await);
    }
    deployment.stop().await;

    let skipped = |workload: &str| -> u64 {
        results
            .iter()
            .filter(|r| r.labels.workload == workload && (r.total || !has_total(&results, r)))
            .map(|r| {
                r.measurements
                    .skipped
                    .get("context_length")
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    };
    for r in &results {
        assert_eq!(r.measurements.errors, 0, "{}: {:?}", r.step, r.measurements);
    }
    // ISL 1024 + OSL 24 never fits: nothing sent, every worker's first request skipped.
    let sweep: Vec<_> = results
        .iter()
        .filter(|r| r.labels.workload == "concurrency_sweep")
        .collect();
    assert!(!sweep.is_empty(), "the sweep's step has a result");
    assert!(sweep.iter().all(|r| r.measurements.requests == 0));
    assert!(skipped("concurrency_sweep") >= 1);
    // ISL 128..=1024 + OSL 8..=32 against 600: some fit, some are skipped.
    let sent: u64 = results
        .iter()
        .filter(|r| r.labels.workload == "sequence_distribution" && !r.total)
        .map(|r| r.measurements.ok_requests)
        .sum();
    assert!(sent > 0, "requests that fit are sent");
    assert!(skipped("sequence_distribution") > 0);
    // Turn 3 holds 3 × 200 + 2 × 12 prompt tokens + 12: above 600, so conversations end there.
    assert!(skipped("multi_turn") > 0);

    let text = metrics.encode().unwrap();
    let counted = support::metrics::sum(
        &text,
        "llm_canary_requests_skipped_total",
        &[("target", "agg"), ("reason", "context_length")],
    );
    let in_results =
        skipped("concurrency_sweep") + skipped("sequence_distribution") + skipped("multi_turn");
    // Warmup included in both.
    assert!(counted > 0.0);
    assert_eq!(
        counted, in_results as f64,
        "the counter and the step results agree"
    );
    assert_eq!(
        support::metrics::sum(
            &text,
            "llm_canary_requests_total",
            &[("outcome", "http_4xx")]
        ),
        0.0
    );
}

/// Whether `r`'s target has a total result for `r`'s step (then `r` is one of its parts).
fn has_total(results: &[llm_canary::model::StepResult], r: &llm_canary::model::StepResult) -> bool {
    results
        .iter()
        .any(|o| o.total && o.step == r.step && o.labels.target == r.labels.target)
}

/// The bench's tables (JSON on stdout, the CSV, the HTML report) show a `skipped` column, beside
/// `requests`, when a step skipped requests above the context length.
#[test]
fn the_bench_tables_show_what_was_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("context.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let out = dir.path().join("out");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_llm-canary"))
        .arg("bench")
        .arg("--config")
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .args(["--workload", "sequence_distribution", "--format", "json"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let table = report["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "sequence_distribution")
        .unwrap();
    let names: Vec<&str> = table["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    let at = names
        .iter()
        .position(|n| *n == "skipped")
        .expect("a skipped column");
    assert_eq!(names[at - 1], "requests");
    let skipped: f64 = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[at].as_f64().unwrap())
        .sum();
    assert!(skipped > 0.0, "{table}");
    let csv = std::fs::read_to_string(out.join("sequence_distribution.csv")).unwrap();
    assert!(
        csv.lines().next().unwrap().contains(",requests,skipped,"),
        "{csv}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains(">skipped<"), "the HTML table has the column");
}
