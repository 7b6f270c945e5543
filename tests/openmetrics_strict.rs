//! The daemon's `/metrics` after real traffic (the compressed demo) parses with the strict
//! OpenMetrics parser of the official Python client (`prometheus_client.openmetrics.parser`),
//! and every family is named and typed as docs/DESIGN.md §6 says. The parser's strictness is checked on
//! the same text: without `# EOF`, with a clashing family and with a broken histogram it refuses.
//!
//! The Python venv comes from `scripts/test` (`~/.cache/llm-canary/py`, or `LLM_CANARY_PY`). Outside
//! CI a missing venv skips the test with a loud message; with `CI=true` it fails.

mod skip;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::metrics::{FAMILIES, LATE_FAMILIES};
use support::{eventually, start_daemon};

/// Parses stdin strictly and prints `name type samples` per family; exits 1 with the error.
const PARSE: &str = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
try:
    for f in text_string_to_metric_families(sys.stdin.read()):
        print(f.name, f.type, len(f.samples))
except Exception as e:
    print("REJECTED:", e)
    sys.exit(1)
"#;

fn python() -> Option<PathBuf> {
    let path = match std::env::var_os("LLM_CANARY_PY") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/llm-canary/py"),
    };
    let bin = path.join("bin/python");
    bin.exists().then_some(bin)
}

fn run_parser(python: &Path, text: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(python)
        .arg("-c")
        .arg(PARSE)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn series_of(text: &str, prefix: &str) -> usize {
    text.lines().filter(|l| l.starts_with(prefix)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposition_after_traffic_passes_the_strict_openmetrics_parser() {
    let Some(python) = python() else {
        skip::missing_tool(
            "no Python venv with prometheus-client: ./scripts/test installs it, or set LLM_CANARY_PY",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/fast-demo.yaml");
    let (daemon, addr) = start_daemon(Some(&config), dir.path());
    let http = support::http::http_client(Some(Duration::from_secs(5)));
    let url = format!("http://{addr}/metrics");
    // After the first step of both modes: requests, step gauges and the simulators' own metrics.
    let (content_type, text) = eventually("traffic in /metrics", Duration::from_secs(90), || {
        let http = http.clone();
        let url = url.clone();
        async move {
            let resp = http.get(&url).send().await.ok()?;
            let ct = resp
                .headers()
                .get("content-type")?
                .to_str()
                .ok()?
                .to_owned();
            let text = resp.text().await.ok()?;
            let ready = [
                "llm_canary_requests_total{target=\"sim-agg\"",
                "llm_canary_requests_total{target=\"sim-disagg\"",
                "llm_canary_step_end_timestamp_seconds{target=\"sim-disagg\"",
                "llm_canary_server_prefix_cache_hit_ratio{target=\"sim-agg\"}",
                "llm_canary_server_kv_cache_usage_ratio{target=\"sim-disagg\"}",
            ]
            .iter()
            .all(|p| series_of(&text, p) > 0);
            ready.then_some((ct, text))
        }
    })
    .await;
    assert!(
        content_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{content_type}"
    );

    let (ok, out) = run_parser(&python, &text);
    assert!(
        ok,
        "strict parser rejected /metrics: {out}\n{}",
        daemon.log_text()
    );
    let parsed: Vec<(String, String, usize)> = out
        .lines()
        .map(|l| {
            let mut f = l.split(' ');
            (
                f.next().unwrap().to_owned(),
                f.next().unwrap().to_owned(),
                f.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    let type_of = |name: &str| {
        parsed
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, t, s)| (t.as_str(), *s))
    };
    for (name, kind) in FAMILIES {
        let (t, _) = type_of(name).unwrap_or_else(|| panic!("family {name} missing: {out}"));
        assert_eq!(t, *kind, "{name}");
    }
    for (name, kind) in LATE_FAMILIES {
        if let Some((t, _)) = type_of(name) {
            assert_eq!(t, *kind, "{name}");
        }
    }
    // No family outside the contract.
    for (name, _, _) in &parsed {
        assert!(
            FAMILIES.iter().chain(LATE_FAMILIES).any(|(n, _)| n == name),
            "unexpected family {name}"
        );
    }
    // Traffic really is in what was checked.
    for name in [
        "llm_canary_time_to_first_token_seconds",
        "llm_canary_requests",
        "llm_canary_server_prefix_cache_hit_ratio",
        "llm_canary_step_ttft_seconds",
        "llm_canary_build",
    ] {
        assert!(type_of(name).unwrap().1 > 0, "{name} has no samples");
    }

    // The parser is strict: each of these breakages of the same text is refused.
    let without_eof = text.trim_end().trim_end_matches("# EOF").to_owned();
    let clash = text.replacen(
        "# EOF",
        "# TYPE llm_canary_requests counter\nllm_canary_requests_total 1\n# EOF",
        1,
    );
    let bucket = text
        .lines()
        .find(|l| {
            l.starts_with("llm_canary_time_to_first_token_seconds_bucket{")
                && l.contains("le=\"+Inf\"")
        })
        .unwrap()
        .to_owned();
    let broken_histogram = text.replacen(&bucket, "", 1);
    for (what, bad) in [
        ("missing # EOF", without_eof),
        ("clashing family", clash),
        ("histogram without +Inf", broken_histogram),
    ] {
        let (ok, out) = run_parser(&python, &bad);
        assert!(!ok, "the parser accepted {what}: {out}");
    }
}
