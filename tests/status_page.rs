//! The status page on `GET /` of a running daemon: in headless Chromium it shows the targets,
//! the SLO states and a failed request from a fault injected into one simulated target; over
//! plain HTTP it is HTML whose every text from servers is escaped, with the target's key masked,
//! and the start-up log names its URL.

mod skip;
mod support;

use std::time::Duration;

use serde_json::Value;
use support::chromium::{self, chromium, console_lines, count_colour, headless, png_pixels};
use support::http::{get_json, http_client};
use support::{eventually_ok, start_daemon};

/// Two simulated deployments, one failing 30 % of its requests with a 503, and an SLO on each.
const FAULTED: &str = r#"
targets:
  - { name: sim-agg, serving_mode: aggregated, simulated: { profile: fast } }
  - { name: sim-disagg, serving_mode: disaggregated, simulated: { profile: fast, faults: { error: { status: 503, rate: 0.3 } } } }
time_scale: 0.01
workloads:
  concurrency_sweep: { levels: [2], isl: 64, osl: 8, step: 120s, warmup: 10s }
slos:
  - name: agg-ttft
    expr: p99(ttft{serving_mode="aggregated"}) < 2s
    window: 10m
    min_samples: 10
  - name: disagg-errors
    expr: error_ratio{serving_mode="disaggregated"} < 0.01
    window: 10m
    min_samples: 10
"#;

/// Starts the daemon on `config`; returns it, its address and its temp dir.
fn daemon(config: &str) -> (support::Proc, std::net::SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    std::fs::write(&path, config).unwrap();
    let (proc, addr) = start_daemon(Some(&path), dir.path());
    (proc, addr, dir)
}

/// Waits until `/api/v1/status` satisfies `ready` (it says what it lacks); returns it.
async fn status_when(
    addr: std::net::SocketAddr,
    what: &str,
    ready: impl Fn(&Value) -> Result<(), String>,
) -> Value {
    let client = http_client(Some(Duration::from_secs(5)));
    let url = format!("http://{addr}/api/v1/status");
    eventually_ok(what, Duration::from_secs(60), || async {
        let status = get_json(&client, &url).await?;
        ready(&status).map(|()| status)
    })
    .await
}

/// Every SLO has been evaluated, and a request of `target` failed with `outcome`.
fn evaluated_and_failed(status: &Value, target: &str, outcome: &str) -> Result<(), String> {
    let slos = status["slos"].as_array().ok_or("no slos")?;
    if slos.is_empty() || slos.iter().any(|s| s["evaluated_unix"].is_null()) {
        return Err(format!("SLOs not evaluated yet: {}", status["slos"]));
    }
    let failures = status["recent_failures"]
        .as_array()
        .ok_or("no recent_failures")?;
    failures
        .iter()
        .any(|f| f["target"] == target && f["outcome"] == outcome)
        .then_some(())
        .ok_or_else(|| format!("no {outcome} of {target} yet: {failures:?}"))
}

/// The table rows of a page that start with `marker` (an opening tag), each up to its `</tr>`.
fn rows<'a>(dom: &'a str, marker: &str) -> Vec<&'a str> {
    dom.match_indices(marker)
        .map(|(at, _)| {
            let end = dom[at..].find("</tr>").map_or(dom.len(), |e| at + e);
            &dom[at..end]
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_chromium_finds_the_targets_the_slo_states_and_the_injected_fault() {
    let Some(chromium) = chromium() else {
        return skip::missing_tool(chromium::MISSING);
    };
    let (mut daemon, addr, dir) = daemon(FAULTED);
    let status = status_when(addr, "SLO verdicts and a 503", |s| {
        evaluated_and_failed(s, "sim-disagg", "http_5xx")
    })
    .await;
    let url = format!("http://{addr}/");
    let (dom, log) = tokio::task::spawn_blocking({
        let (chromium, profile, url) = (chromium.clone(), dir.path().join("p1"), url.clone());
        move || headless(&chromium, &url, &profile, &["--dump-dom"])
    })
    .await
    .unwrap();
    assert!(console_lines(&log).is_empty(), "{:?}", console_lines(&log));

    // The targets, each up (a 503 still comes from a live server).
    for target in ["sim-agg", "sim-disagg"] {
        let row = rows(
            &dom,
            &format!("<tr class=\"target\" data-target=\"{target}\""),
        );
        assert_eq!(row.len(), 1, "{target}: {dom}");
        assert!(row[0].contains("data-state=\"up\""), "{}", row[0]);
    }
    // Each SLO with the state the API gives it.
    for slo in status["slos"].as_array().unwrap() {
        let name = slo["name"].as_str().unwrap();
        let row = rows(&dom, &format!("<tr class=\"slo\" data-slo=\"{name}\""));
        assert_eq!(row.len(), 1, "{name}: {dom}");
        let state = row[0]
            .split("data-state=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap();
        assert!(
            ["pass", "fail", "insufficient_data"].contains(&state),
            "{}",
            row[0]
        );
    }
    assert!(dom.contains("data-slo=\"agg-ttft\"") && dom.contains("data-slo=\"disagg-errors\""));
    // The injected fault: a 503 of the faulted target with what the simulator said.
    let failed = rows(
        &dom,
        "<tr class=\"failure\" data-target=\"sim-disagg\" data-outcome=\"http_5xx\"",
    );
    assert!(!failed.is_empty(), "{dom}");
    assert!(
        failed[0].contains("<td class=\"num\">503</td>")
            && failed[0].contains("simulated error 503"),
        "{}",
        failed[0]
    );
    assert!(
        rows(&dom, "<tr class=\"failure\" data-target=\"sim-agg\"").is_empty(),
        "the healthy target failed nothing"
    );

    // Rendered, not blank: the sending banner's green and the errors' red are drawn.
    let shot = dir.path().join("status.png");
    let (_, log) = tokio::task::spawn_blocking({
        let (profile, shot) = (dir.path().join("p2"), shot.clone());
        move || {
            headless(
                &chromium,
                &url,
                &profile,
                &[
                    &format!("--screenshot={}", shot.display()),
                    "--window-size=1400,1600",
                    "--hide-scrollbars",
                ],
            )
        }
    })
    .await
    .unwrap();
    assert!(console_lines(&log).is_empty(), "{log}");
    let (pixels, channels) = png_pixels(&shot);
    let banner = count_colour(&pixels, channels, [0xda, 0xfb, 0xe1], 6);
    let red = count_colour(&pixels, channels, [0xcf, 0x22, 0x2e], 40);
    assert!(banner > 500 && red > 50, "banner {banner}, red {red}");

    daemon.signal("TERM");
    let exit = daemon.wait_exit("exit", Duration::from_secs(15)).await;
    assert_eq!(exit.code(), Some(0), "{}", daemon.log_text());
}

/// A target that answers 503 with markup and the request's `Authorization` in its body.
fn hostile_503(head: &str) -> support::RawReply {
    let sent = support::raw::authorization_of(head);
    let body = format!(
        "<html><script>alert('owned')</script><b>overloaded</b> & \"busy\" for {sent}</html>"
    );
    support::RawReply::Bytes(
        format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_html_with_what_servers_said_escaped_and_the_key_masked() {
    const KEY: &str = "sk-status-page-5ecret-77";
    let (target, _heads) = support::raw_server(hostile_503).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, KEY).unwrap();
    std::fs::write(
        &path,
        format!(
            r#"
targets:
  - {{ name: hostile, serving_mode: aggregated, url: "http://{target}", model: m, dialect: openai, api_key_file: "{}" }}
  - {{ name: sim-agg, serving_mode: aggregated, simulated: {{ profile: fast }} }}
time_scale: 0.01
workloads:
  concurrency_sweep: {{ levels: [1], isl: 32, osl: 4, step: 120s, warmup: 10s }}
slos:
  - name: hostile-errors
    expr: error_ratio{{target="hostile"}} < 0.01
    window: 10m
    min_samples: 5
"#,
            key_file.display()
        ),
    )
    .unwrap();
    let (mut daemon, addr) = start_daemon(Some(&path), dir.path());
    status_when(addr, "SLO verdicts and a 503", |s| {
        evaluated_and_failed(s, "hostile", "http_5xx")
    })
    .await;
    let response = http_client(Some(Duration::from_secs(5)))
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/html; charset=utf-8"
    );
    let page = response.text().await.unwrap();
    daemon.signal("TERM");
    daemon.wait_exit("exit", Duration::from_secs(15)).await;
    let log = daemon.log_text();

    assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
    for shown in [
        "data-target=\"hostile\"",
        "data-target=\"sim-agg\"",
        "<tr class=\"slo\" data-slo=\"hostile-errors\"",
        "<tr class=\"failure\" data-target=\"hostile\" data-outcome=\"http_5xx\"",
        // What the server said, escaped, its echo of the key masked.
        "HTTP 503 Service Unavailable: &lt;html&gt;&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;\
         &lt;b&gt;overloaded&lt;/b&gt; &amp; &quot;busy&quot; for Bearer ***&lt;/html&gt;",
        "<a href=\"/metrics\">",
        "<a href=\"/api/v1/status\">",
    ] {
        assert!(page.contains(shown), "{shown} is not on the page:\n{page}");
    }
    assert!(
        !page.contains("<script") && !page.contains("<b>overloaded"),
        "{page}"
    );
    assert!(!page.contains("5ecret"), "the key shows on the page");
    // The start-up log says where to look.
    assert!(
        log.contains(&format!(
            "open http://{addr}/ for the status page; http://{addr}/metrics, http://{addr}/api/v1/status"
        )),
        "{log}"
    );
}
