//! Every config fixture under tests/testdata/config: good ones load, bad ones fail with exactly the
//! messages in their `.expected` file (one line per diagnostic, each naming FILE:LINE:COL).

use std::path::{Path, PathBuf};

use llm_canary::config::{Config, ConfigError};
use llm_canary::setup::Setup;

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata/config")
        .join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

#[test]
fn good_configs_load() {
    for path in fixtures("good") {
        if let Err(e) = Setup::load(&path) {
            panic!("{} should be valid:\n{e}", path.display());
        }
    }
}

#[test]
fn bad_configs_report_every_error_with_position() {
    for path in fixtures("bad") {
        // This one is only bad for a build without the feature.
        if cfg!(feature = "otlp-grpc") && path.ends_with("otlp-grpc-without-feature.yaml") {
            continue;
        }
        let expected = std::fs::read_to_string(path.with_extension("expected")).unwrap();
        let expected: Vec<&str> = expected.lines().filter(|l| !l.is_empty()).collect();
        let err = match Setup::load(&path) {
            Ok(_) => panic!("{} should be rejected", path.display()),
            Err(e) => e,
        };
        let ConfigError::Invalid { diagnostics, .. } = &err else {
            panic!("{}: not a validation error: {err}", path.display());
        };
        let rendered = err.to_string();
        let lines: Vec<&str> = rendered.lines().collect();
        assert_eq!(
            diagnostics.len(),
            expected.len(),
            "{}: want {} diagnostics, got:\n{rendered}",
            path.display(),
            expected.len()
        );
        let file = path.display().to_string();
        for want in &expected {
            let found = if want.starts_with(':') {
                lines
                    .iter()
                    .any(|l| l.starts_with(&format!("{file}{want}")))
            } else {
                lines.iter().any(|l| l.contains(want))
            };
            assert!(
                found,
                "{}: missing `{want}` in:\n{rendered}",
                path.display()
            );
        }
    }
}

#[test]
fn shipped_examples_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in ["examples/seed-plan.yaml", "examples/demo.yaml"] {
        let cfg = Config::load(&root.join(name)).unwrap_or_else(|e| panic!("{name}:\n{e}"));
        assert_eq!(cfg.targets.len(), 2, "{name}");
        assert_eq!(cfg.cycle().len(), 4, "{name} runs all four workloads");
    }
    let open_loop = Config::load(&root.join("examples/open-loop.yaml"))
        .unwrap_or_else(|e| panic!("examples/open-loop.yaml:\n{e}"));
    let sweep = open_loop.workloads.concurrency_sweep.as_ref().unwrap();
    assert!(
        sweep.rate.is_some(),
        "the open-loop example runs on arrivals"
    );
    let cancellation = Config::load(&root.join("examples/cancellation.yaml"))
        .unwrap_or_else(|e| panic!("examples/cancellation.yaml:\n{e}"));
    let steps = llm_canary::schedule::plan_cycle(&cancellation);
    assert!(
        !steps.is_empty() && steps.iter().all(|s| s.cancel.is_some()),
        "every step of the cancellation example abandons requests"
    );
    let traces = Config::load(&root.join("examples/trace-replay.yaml"))
        .unwrap_or_else(|e| panic!("examples/trace-replay.yaml:\n{e}"));
    assert_eq!(traces.cycle(), ["trace_replay"]);
    let dataset = Config::load(&root.join("examples/dataset.yaml"))
        .unwrap_or_else(|e| panic!("examples/dataset.yaml:\n{e}"));
    assert_eq!(dataset.cycle(), ["dataset"]);
    let demo = Config::demo();
    let modes: Vec<_> = demo.targets.iter().map(|t| t.serving_mode).collect();
    assert!(modes.contains(&llm_canary::config::ServingMode::Aggregated));
    assert!(modes.contains(&llm_canary::config::ServingMode::Disaggregated));
    assert!(demo.targets.iter().all(|t| t.simulated.is_some()));
}

#[test]
fn seed_plan_carries_the_source_documents_numbers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cfg = Config::load(&root.join("examples/seed-plan.yaml")).unwrap();
    let w = &cfg.workloads;
    let sweep = w.concurrency_sweep.as_ref().unwrap();
    assert_eq!(*sweep.levels, vec![1, 2, 4, 8, 16, 32, 64]);
    assert_eq!((*sweep.isl, *sweep.osl), (1024, 512));
    assert_eq!(sweep.step.as_secs(), 120);
    let mt = w.multi_turn.as_ref().unwrap();
    assert_eq!(
        (*mt.turns, *mt.conversations, *mt.isl, *mt.osl),
        (5, 8, 512, 256)
    );
    assert_eq!(mt.duration.as_secs(), 300);
    let sd = w.sequence_distribution.as_ref().unwrap();
    assert_eq!(
        (*sd.isl.min, *sd.isl.max, *sd.osl.min, *sd.osl.max),
        (128, 4096, 64, 2048)
    );
    assert_eq!(*sd.concurrency, 16);
    let pc = w.prefix_cache.as_ref().unwrap();
    assert_eq!(*pc.hit_ratios, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    assert_eq!((*pc.isl, *pc.osl, *pc.concurrency), (2048, 512, 16));
    // The whole plan at time scale 1: 7 + 1 + 3 + 5 steps, 35 minutes.
    let plan = cfg.cycle_plan();
    assert_eq!(plan.iter().map(|p| p.1).sum::<usize>(), 16);
    assert_eq!(plan.iter().map(|p| p.2.as_secs()).sum::<u64>(), 35 * 60);
}

#[test]
fn defaults_are_the_source_documents() {
    let cfg = Config::parse(
        "targets:\n  - { name: a, serving_mode: aggregated, url: \"http://127.0.0.1:1\" }\n",
        "inline.yaml",
        Path::new("."),
    )
    .unwrap();
    // Every workload but trace replay, which needs trace files.
    assert_eq!(
        cfg.cycle(),
        llm_canary::config::WORKLOAD_NAMES[..4].to_vec()
    );
    assert_eq!(*cfg.time_scale, 1.0);
    assert_eq!(*cfg.export.listen, "127.0.0.1:9464");
    let plan = cfg.cycle_plan();
    assert_eq!(plan.iter().map(|p| p.2.as_secs()).sum::<u64>(), 35 * 60);
}

/// What a file in examples/ is, and so where it is checked.
#[derive(Debug, PartialEq)]
enum Example {
    /// A canary config: `llm-canary check` here.
    Config,
    /// A Kubernetes manifest (the deploy guide's DynamoGraphDeployments): read by
    /// `k8s::discovery`'s tests.
    Manifest,
    /// The Helm chart's values: tests/helm/test_chart.py renders them and runs `check` on the
    /// config they make.
    ChartValues,
    /// The deploy guide.
    Guide,
}

fn example_kind(path: &Path) -> Example {
    let name = path.file_name().unwrap().to_string_lossy();
    if name.ends_with(".md") {
        return Example::Guide;
    }
    assert!(name.ends_with(".yaml"), "{}: what is it?", path.display());
    let text = std::fs::read_to_string(path).unwrap();
    if text.lines().any(|l| l.starts_with("apiVersion:")) && text.contains("\nkind: ") {
        Example::Manifest
    } else if text.lines().any(|l| l.starts_with("config:")) {
        Example::ChartValues
    } else {
        Example::Config
    }
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Every file in examples/, none skipped: each config passes `llm-canary check` (exit 0, as a
/// user runs it, from any folder), and every other file is one of the kinds checked elsewhere.
#[test]
fn every_example_passes_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    files_under(&root.join("examples"), &mut files);
    files.sort();
    let mut configs = 0;
    for path in &files {
        let kind = example_kind(path);
        if kind != Example::Config {
            continue;
        }
        configs += 1;
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llm-canary"))
            .args(["check", "--config"])
            .arg(path)
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} fails `check`:\n{}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The seed plan, the demo, open loop, cancellation, trace replay, the GPU run at least.
    assert!(configs >= 6, "{configs} configs in {files:?}");
    assert_eq!(
        example_kind(&root.join("examples/k8s/canary-values.yaml")),
        Example::ChartValues
    );
    assert_eq!(
        example_kind(&root.join("examples/k8s/dynamo-agg.yaml")),
        Example::Manifest
    );
}
