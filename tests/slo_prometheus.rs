//! End to end: the daemon on the benchmark plan's hardware (simulated) evaluates the
//! disaggregated-TTFT-gain SLO, and a real Prometheus (Debian's) loaded with the rules that
//! `llm-canary rules` generates from the same config evaluates it too. Without a fault both say
//! pass; with a 500 ms KV handoff on the disaggregated deployment both say fail and the alert
//! fires. The two evaluations must agree, on the verdict and on the measured value.

mod skip;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::http::{get_json, http_client};
use support::{Prometheus, eventually, eventually_ok, start_daemon};

const SLO: &str = "disagg-ttft-gain-c32";

/// The test config with the disaggregated handoff overhead set to `handoff`.
fn config(dir: &Path, handoff: &str) -> PathBuf {
    let template = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/slo-e2e.yaml"),
    )
    .unwrap();
    let path = dir.join("slo-e2e.yaml");
    std::fs::write(&path, template.replace("HANDOFF", handoff)).unwrap();
    path
}

fn generated_rules(config: &Path, dir: &Path) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_llm-canary"))
        .args(["rules", "--config"])
        .arg(config)
        .output()
        .expect("run llm-canary rules");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("slo-rules.yaml");
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

async fn daemon_slo(addr: std::net::SocketAddr) -> Option<serde_json::Value> {
    let status = get_json(&http_client(None), &format!("http://{addr}/api/v1/status"))
        .await
        .ok()?;
    status["slos"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == SLO)
        .cloned()
}

fn scalar(result: &[serde_json::Value]) -> Option<f64> {
    result.first()?["value"][1].as_str()?.parse().ok()
}

/// Runs one daemon with Prometheus until both have a verdict; returns (daemon state, daemon
/// value, Prometheus compliance, Prometheus lhs, alert firing).
async fn run_case(handoff: &str, expect_state: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), handoff);
    let rules = generated_rules(&config, dir.path());
    let (daemon, addr) = start_daemon(Some(&config), dir.path());
    let prom = Prometheus::start(dir.path(), &[("canary", addr)], &[rules]);
    // Two steps and the 45 s pause between them (the fail case's verdict), on a busy machine.
    let limit = Duration::from_secs(180);

    // A timeout shows what the daemon said last, and its log.
    let verdict = format!("the daemon's verdict {expect_state}");
    let slo = eventually_ok(&verdict, limit, || async {
        let seen = daemon_slo(addr).await;
        match seen.as_ref().filter(|s| s["state"] == expect_state) {
            Some(slo) => Ok(slo.clone()),
            None => Err(format!("{seen:?}\ndaemon log:\n{}", daemon.log_text())),
        }
    })
    .await;
    let value = slo["value"].as_f64().unwrap();
    let (lower, upper) = (
        slo["interval"][0].as_f64().unwrap(),
        slo["interval"][1].as_f64().unwrap(),
    );
    assert!(lower <= value && value <= upper, "{slo}");

    let want_compliant = if expect_state == "pass" { 1.0 } else { 0.0 };
    let compliant_query = format!(r#"llm_canary:slo_compliant{{slo="{SLO}"}}"#);
    eventually("Prometheus's verdict", limit, || async {
        let r = prom.query(&compliant_query).await.ok()?;
        scalar(&r).filter(|v| *v == want_compliant)
    })
    .await;

    // Prometheus scraped the daemon's own verdict too: the two agree.
    let state_query =
        format!(r#"llm_canary_slo_state{{slo="{SLO}", state="{expect_state}"}} == 1"#);
    prom.wait_for(&state_query, limit).await;

    // Both measured the same thing: the daemon's HDR p50 and Prometheus's histogram_quantile
    // over the exported buckets (10 % apart) agree within their resolution. Both read at one
    // evaluation instant (the daemon's value as Prometheus scraped it), and the config's cycle
    // pause keeps every other step out of both windows while the test reads them, so the windows
    // hold the same requests: values read apart in time, or over a window with part of another step,
    // would compare different requests.
    let ratio = prom
        .wait_for(
            &format!(
                r#"llm_canary:slo_side{{slo="{SLO}", side="lhs"}} / on(slo) llm_canary_slo_value{{slo="{SLO}"}}"#
            ),
            limit,
        )
        .await;
    let ratio = scalar(&ratio).unwrap();
    assert!(
        (ratio - 1.0).abs() < 0.3,
        "Prometheus's lhs is {ratio} times the daemon's value (daemon read earlier: {value})"
    );

    let alert_query =
        format!(r#"ALERTS{{alertname="LlmCanarySloFailing", slo="{SLO}", alertstate="firing"}}"#);
    if expect_state == "fail" {
        prom.wait_for(&alert_query, limit).await;
    } else {
        // Compliance has been 1 for a while; the alert (for: 5s) must not be pending or firing.
        let any = format!(r#"ALERTS{{alertname="LlmCanarySloFailing", slo="{SLO}"}}"#);
        assert_eq!(
            prom.query(&any).await.unwrap(),
            Vec::<serde_json::Value>::new()
        );
    }
    let log = daemon.log_text();
    assert!(
        log.contains(&format!("SLO {SLO}: insufficient_data -> {expect_state}")),
        "the state change is logged:\n{log}"
    );
    drop(prom);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_and_prometheus_agree_on_the_disaggregation_gain() {
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        skip::missing_tool("prometheus is not installed: ./scripts/test installs Debian's");
        return;
    }
    // The document's hardware at concurrency 32, ISL 4096: disaggregation wins.
    run_case("5ms", "pass").await;
    // A slow KV handoff (500 ms per request) cancels the gain.
    run_case("500ms", "fail").await;
}
