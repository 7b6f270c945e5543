//! The daemon as a user runs it: a bad config exits 2 before binding anything, a reload with a
//! bad file keeps the old config running, and SIGTERM drains and exits 0.

mod support;

use std::process::Command;
use std::time::Duration;

use support::{eventually, start_daemon};

fn http() -> reqwest::Client {
    llm_canary::client::http_client_builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

const GOOD: &str = r#"
targets:
  - { name: sim-agg, serving_mode: aggregated, simulated: { profile: fast } }
time_scale: 0.01
workloads:
  concurrency_sweep: { levels: [2], isl: 64, osl: 8, step: 120s, warmup: 10s }
"#;

#[test]
fn a_bad_config_exits_2_naming_file_line_column_and_binds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, GOOD.replace("concurrency_sweep", "concurency_sweep")).unwrap();
    let port = support::free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_llm-canary"))
        .args(["run", "--listen", &format!("127.0.0.1:{port}"), "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:6:3: unknown key `concurency_sweep`",
            bad.display()
        )),
        "{err}"
    );
    assert!(!err.contains("listening on"), "{err}");
    // Nothing was bound: the port is still free.
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_the_old_config_on_a_bad_file_and_sigterm_drains() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    std::fs::write(&path, GOOD).unwrap();
    let (mut daemon, addr) = start_daemon(Some(&path), dir.path());
    let base = format!("http://{addr}");
    let client = http();
    eventually("readiness", Duration::from_secs(30), || async {
        let r = client.get(format!("{base}/-/ready")).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    let metric = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let scrape = || async {
        client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    assert_eq!(
        metric(&scrape().await, "llm_canary_config_last_reload_successful"),
        Some(1.0)
    );

    // A bad file: rejected with its diagnostics, the daemon keeps serving, the gauge says 0.
    std::fs::write(&path, GOOD.replace("levels: [2]", "levels: [0]")).unwrap();
    let r = client
        .post(format!("{base}/-/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("concurrency level 0 must be between 1 and 4096"),
        "{body}"
    );
    let text = scrape().await;
    assert_eq!(
        metric(&text, "llm_canary_config_last_reload_successful"),
        Some(0.0)
    );
    let ok_before = eventually(
        "traffic after the bad reload",
        Duration::from_secs(30),
        || async {
            let t = scrape().await;
            t.lines()
                .find(|l| {
                    l.starts_with("llm_canary_requests_total{") && l.contains("outcome=\"ok\"")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .filter(|v| *v > 0.0)
        },
    )
    .await;
    assert!(ok_before > 0.0);
    // GET is not a reload.
    assert_eq!(
        client
            .get(format!("{base}/-/reload"))
            .send()
            .await
            .unwrap()
            .status(),
        405
    );

    // A good file again: accepted.
    std::fs::write(&path, GOOD).unwrap();
    let r = client
        .post(format!("{base}/-/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(
        metric(&scrape().await, "llm_canary_config_last_reload_successful"),
        Some(1.0)
    );

    // SIGTERM: drain, exit 0, well inside the bounded drain.
    let pid = daemon.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = eventually("exit after SIGTERM", Duration::from_secs(15), || {
        let s = daemon.child.try_wait().unwrap();
        async move { s }
    })
    .await;
    assert_eq!(status.code(), Some(0), "{}", daemon.log_text());
    let log = daemon.log_text();
    assert!(log.contains("shutdown complete"), "{log}");
}
