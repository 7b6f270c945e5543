//! A real Prometheus (Debian's `prometheus`) scrapes the daemon running the compressed demo;
//! through Prometheus's HTTP API the test finds the TTFT histograms of both serving modes for
//! every workload's step labels, the step gauges, `llm_canary_target_up` and the build info.

mod support;

use std::path::Path;
use std::time::Duration;

use support::{Prometheus, start_daemon};

fn label_values(series: &[serde_json::Value], label: &str) -> Vec<String> {
    let mut v: Vec<String> = series
        .iter()
        .filter_map(|s| s["metric"][label].as_str().map(str::to_owned))
        .collect();
    v.sort();
    v.dedup();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_every_workload_of_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/fast-demo.yaml");
    let (_daemon, addr) = start_daemon(Some(&config), dir.path());
    let prom = Prometheus::start(dir.path(), &[("canary", addr)], &[]);

    prom.wait_for(r#"up{job="canary"} == 1"#, Duration::from_secs(60))
        .await;
    let build = prom
        .wait_for("llm_canary_build_info", Duration::from_secs(30))
        .await;
    assert_eq!(build[0]["metric"]["version"], env!("CARGO_PKG_VERSION"));
    let up = prom
        .wait_for("llm_canary_target_up == 1", Duration::from_secs(30))
        .await;
    assert_eq!(label_values(&up, "target"), ["sim-agg", "sim-disagg"]);

    // The last step of the cycle ends after about 45 s of schedule; every step gauge then exists.
    prom.wait_for(
            r#"count(llm_canary_step_end_timestamp_seconds{workload="prefix_cache", prefix_ratio="1"}) == 2"#,
            Duration::from_secs(150),
        )
        .await;

    // The histograms keep the step labels (docs/METRICS.md, "Series budget"): a multi-turn step
    // is one series, its turns are in the step gauges (below).
    let step_label = [
        ("concurrency_sweep", "concurrency", vec!["1", "32", "8"]),
        (
            "sequence_distribution",
            "distribution",
            vec!["lognormal", "uniform", "zipf"],
        ),
        ("prefix_cache", "prefix_ratio", vec!["0", "0.5", "1"]),
    ];
    for (workload, label, values) in &step_label {
        for mode in ["aggregated", "disaggregated"] {
            let expr = format!(
                r#"sum by ({label}) (llm_canary_time_to_first_token_seconds_count{{workload="{workload}", serving_mode="{mode}"}}) > 0"#
            );
            let series = prom.query(&expr).await.unwrap();
            assert_eq!(&label_values(&series, label), values, "{expr}");
            let q = format!(
                r#"histogram_quantile(0.99, sum by (le) (rate(llm_canary_time_to_first_token_seconds_bucket{{workload="{workload}", serving_mode="{mode}"}}[5m])))"#
            );
            assert!(!prom.query(&q).await.unwrap().is_empty(), "{q}");
        }
    }
    for gauge in [
        "llm_canary_step_ttft_seconds",
        "llm_canary_step_itl_seconds",
        "llm_canary_step_request_duration_seconds",
        "llm_canary_step_output_tokens_per_second",
        "llm_canary_step_requests_per_second",
        "llm_canary_step_error_ratio",
        "llm_canary_step_cache_hit_ratio",
        "llm_canary_step_cost_per_million_tokens_usd",
    ] {
        let modes = label_values(&prom.query(gauge).await.unwrap(), "serving_mode");
        assert_eq!(modes, ["aggregated", "disaggregated"], "{gauge}");
    }
    let quantiles = label_values(
        &prom.query("llm_canary_step_ttft_seconds").await.unwrap(),
        "quantile",
    );
    assert_eq!(quantiles, ["0.5", "0.99"]);
    for mode in ["aggregated", "disaggregated"] {
        let turns = format!(
            r#"llm_canary_step_ttft_seconds{{workload="multi_turn", serving_mode="{mode}", turn!="", quantile="0.5"}}"#
        );
        let series = prom.query(&turns).await.unwrap();
        assert_eq!(label_values(&series, "turn"), ["1", "2", "3"], "{turns}");
        let whole = format!(
            r#"llm_canary_time_to_first_token_seconds_count{{workload="multi_turn", serving_mode="{mode}"}}"#
        );
        let series = prom.query(&whole).await.unwrap();
        assert_eq!(series.len(), 1, "one multi-turn series per mode: {whole}");
    }
    // Before the 32-worker sweep step's clock started, each target had a connection per worker:
    // those the start-up probe left idle (one per check it sent) and, timed, the rest.
    let opened = prom
        .query("sum by (target) (llm_canary_connect_seconds_count) >= 28")
        .await
        .unwrap();
    assert_eq!(label_values(&opened, "target"), ["sim-agg", "sim-disagg"]);
    let ok = prom
        .query(r#"sum by (serving_mode) (llm_canary_requests_total{outcome="ok"}) > 0"#)
        .await
        .unwrap();
    assert_eq!(
        label_values(&ok, "serving_mode"),
        ["aggregated", "disaggregated"]
    );
}
