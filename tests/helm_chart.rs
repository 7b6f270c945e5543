//! The Helm chart, rendered and linted by the real Helm library (PyPI `helm-python-sdk`, offline)
//! for the default values and every `ci/*-values.yaml`, validated against the Kubernetes schemas
//! and the prometheus-operator CRDs, with its SLO rules equal to `llm-canary rules` for the
//! chart's default config: `tests/helm/test_chart.py` does the checking, this runs it.

mod skip;

use std::path::PathBuf;
use std::process::Command;

/// The Python of the venv `scripts/test` installs helm-python-sdk and kubernetes-validate into.
fn python() -> Option<PathBuf> {
    let venv = std::env::var_os("LLM_CANARY_HELM_PY")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/llm-canary/helm"))
        })?;
    let py = venv.join("bin/python");
    py.is_file().then_some(py)
}

#[test]
fn chart_renders_lints_and_validates() {
    let Some(py) = python() else {
        skip::missing_tool(
            "no venv with helm-python-sdk: ./scripts/test installs it, or set LLM_CANARY_HELM_PY",
        );
        return;
    };
    let out = Command::new(py)
        .arg("tests/helm/test_chart.py")
        .arg("--bin")
        .arg(env!("CARGO_BIN_EXE_llm-canary"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run tests/helm/test_chart.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "chart test failed:\n{stdout}\n{}",
        stderr
            .lines()
            .filter(|l| !l.contains("symbolic link"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(stdout.contains("chart OK"), "{stdout}");
}
