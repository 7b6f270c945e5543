//! The daemon as a user runs it: a bad config exits 2 before binding anything, a reload with a
//! bad file keeps the old config running, SIGTERM drains and exits 0, and `--log-format json`
//! logs one JSON object per line.

mod support;

use std::process::Command;
use std::time::Duration;

use support::http::{get_text, http_client};
use support::metrics::{sample, sum};
use support::{eventually, start_daemon};

fn http() -> reqwest::Client {
    http_client(Some(Duration::from_secs(5)))
}

async fn scrape(client: &reqwest::Client, addr: std::net::SocketAddr) -> String {
    support::http::scrape(client, &format!("http://{addr}")).await
}

const GOOD: &str = r#"
targets:
  - { name: sim-agg, serving_mode: aggregated, simulated: { profile: fast } }
time_scale: 0.01
workloads:
  concurrency_sweep: { levels: [2], isl: 64, osl: 8, step: 120s, warmup: 10s }
export: { lifecycle: true }
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
    let reload_ok = |text: &str| sample(text, "llm_canary_config_last_reload_successful", &[]);
    let scrape = || scrape(&client, addr);
    assert_eq!(reload_ok(&scrape().await), Some(1.0));

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
    assert_eq!(reload_ok(&scrape().await), Some(0.0));
    eventually(
        "traffic after the bad reload",
        Duration::from_secs(30),
        || async {
            sample(
                &scrape().await,
                "llm_canary_requests_total",
                &[("outcome", "ok")],
            )
            .filter(|v| *v > 0.0)
        },
    )
    .await;
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
    assert_eq!(reload_ok(&scrape().await), Some(1.0));

    // SIGTERM: drain, exit 0, well inside the bounded drain.
    daemon.signal("TERM");
    let status = daemon
        .wait_exit("exit after SIGTERM", Duration::from_secs(15))
        .await;
    assert_eq!(status.code(), Some(0), "{}", daemon.log_text());
    let log = daemon.log_text();
    assert!(log.contains("shutdown complete"), "{log}");
}

/// `--log-format json`: every line the daemon writes to stderr, from the start to the end of
/// its shutdown, is one JSON object with its timestamp, level, fields and message; what used to take
/// several lines (the start-up probe's checks, a rejected reload's problems) is one line, or a
/// record per problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_from_start_to_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    std::fs::write(&path, GOOD).unwrap();
    let (mut daemon, addr) = support::start_daemon_flagged(
        &["--log-format", "json"],
        Some(&path),
        dir.path(),
        true,
        &[],
    );
    let client = http();
    // The start-up probe's findings are published once they are logged.
    let status = format!("http://{addr}/api/v1/status");
    eventually("the start-up probe", Duration::from_secs(30), || async {
        let s = support::http::get_json(&client, &status).await.ok()?;
        (!s["probes"].as_array()?.is_empty()).then_some(())
    })
    .await;
    // Two problems in the file: the reload is rejected, each problem logged on its own.
    let bad = GOOD
        .replace("levels: [2]", "levels: [0]")
        .replace("isl: 64", "isl: 0");
    std::fs::write(&path, bad).unwrap();
    let r = client
        .post(format!("http://{addr}/-/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    daemon.signal("TERM");
    let exit = daemon.wait_exit("exit", Duration::from_secs(15)).await;
    let log = daemon.log_text();
    assert_eq!(exit.code(), Some(0), "{log}");

    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON object ({e}): {l}"))
        })
        .collect();
    let mut messages = Vec::new();
    for r in &records {
        assert!(
            r["timestamp"].is_string() && r["level"].is_string() && r["target"].is_string(),
            "{r}"
        );
        let message = r["fields"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no message: {r}"));
        assert!(!message.contains('\n'), "a record of several lines: {r}");
        messages.push(message);
    }
    // A field named `target` (the canary's target) stays apart from the record's own `target`.
    assert!(
        records.iter().any(|r| r["fields"]["target"] == "sim-agg"
            && r["target"]
                .as_str()
                .is_some_and(|t| t.starts_with("llm_canary"))),
        "{log}"
    );
    let listening = format!("listening on {addr}");
    assert!(messages.contains(&listening.as_str()), "{log}");
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("probe sim-agg (http://127.0.0.1:")
                && m.contains(": ok; ok reachable: answers HTTP, ok model: ")),
        "{log}"
    );
    let rejected: Vec<&&str> = messages
        .iter()
        .filter(|m| m.starts_with("reload rejected, the old config keeps running: "))
        .collect();
    assert_eq!(rejected.len(), 2, "{log}");
    assert!(
        rejected
            .iter()
            .any(|m| m.contains("concurrency level 0 must be between 1 and 4096")),
        "{log}"
    );
    assert_eq!(messages.last(), Some(&"shutdown complete"), "{log}");
}

const AGG: &[(&str, &str)] = &[("target", "sim-agg")];
const EXTRA: &[(&str, &str)] = &[("target", "sim-extra")];

const TWO: &str = r#"
targets:
  - { name: sim-agg, serving_mode: aggregated, simulated: { profile: fast } }
  - { name: sim-extra, serving_mode: disaggregated, simulated: { profile: fast } }
time_scale: 0.01
workloads:
  concurrency_sweep: { levels: [2], isl: 64, osl: 8, step: 120s, warmup: 10s }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_by_sighup_and_file_change_adds_and_removes_targets_keeping_histograms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    std::fs::write(&path, GOOD).unwrap();
    let (daemon, addr) = start_daemon(Some(&path), dir.path());
    let client = http();
    let ttft = "llm_canary_time_to_first_token_seconds_count";
    eventually("traffic to sim-agg", Duration::from_secs(30), || async {
        (sum(&scrape(&client, addr).await, ttft, AGG) > 0.0).then_some(())
    })
    .await;

    // SIGHUP with a second target: it gets traffic from a following step.
    std::fs::write(&path, TWO).unwrap();
    daemon.signal("HUP");
    eventually(
        "traffic to the added target",
        Duration::from_secs(30),
        || async { (sum(&scrape(&client, addr).await, ttft, EXTRA) > 0.0).then_some(()) },
    )
    .await;
    let text = scrape(&client, addr).await;
    assert!(
        text.contains("llm_canary_config_last_reload_successful 1"),
        "{text}"
    );
    let agg_before = sum(&text, ttft, AGG);

    // A file change alone (no signal): the target is removed with every series of it.
    std::fs::write(&path, GOOD).unwrap();
    let text = eventually(
        "the removed target's series gone",
        Duration::from_secs(30),
        || async {
            let t = scrape(&client, addr).await;
            (!t.contains("sim-extra")).then_some(t)
        },
    )
    .await;
    // The remaining target's histograms survived both reloads.
    assert!(sum(&text, ttft, AGG) >= agg_before);
    // A bad file by file change: rejected, old config keeps running, gauge 0.
    std::fs::write(&path, "targets: [ {name: broken").unwrap();
    eventually("reload failure seen", Duration::from_secs(30), || async {
        scrape(&client, addr)
            .await
            .contains("llm_canary_config_last_reload_successful 0")
            .then_some(())
    })
    .await;
    let n = sum(&scrape(&client, addr).await, ttft, AGG);
    eventually(
        "traffic goes on after the bad file",
        Duration::from_secs(30),
        || async { (sum(&scrape(&client, addr).await, ttft, AGG) > n).then_some(()) },
    )
    .await;
    let log = daemon.log_text();
    assert!(log.contains("added [sim-extra]"), "{log}");
    assert!(log.contains("removed [sim-extra]"), "{log}");
    assert!(log.contains("config file changed: reloading"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_without_waiting_for_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    // Every stream stalls for a minute: the first SIGTERM's drain would wait its full bound.
    std::fs::write(
        &path,
        GOOD.replace(
            "simulated: { profile: fast }",
            "simulated: { profile: fast, faults: { stall: { after_tokens: 2, duration: 60s } } }",
        ),
    )
    .unwrap();
    let (daemon, addr) = start_daemon(Some(&path), dir.path());
    let client = http();
    eventually("requests in flight", Duration::from_secs(30), || async {
        let t = scrape(&client, addr).await;
        (sum(&t, "llm_canary_inflight_requests", AGG) > 0.0).then_some(())
    })
    .await;
    let t0 = tokio::time::Instant::now();
    daemon.signal("TERM");
    eventually("drain started", Duration::from_secs(10), || async {
        daemon
            .log_text()
            .contains("draining in-flight requests")
            .then_some(())
    })
    .await;
    daemon.signal("TERM");
    let mut daemon = daemon;
    let status = daemon
        .wait_exit("exit after the second signal", Duration::from_secs(5))
        .await;
    // Well inside the 10 s drain bound: the second signal cut it.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(status.code(), Some(130), "{}", daemon.log_text());
    assert!(daemon.log_text().contains("second signal: exiting now"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_reach_the_target_and_nothing_else_and_the_surface_is_as_configured() {
    const KEY: &str = "sk-canary-test-5ecret-9f2c";
    let (target, heads) = support::raw_server(|head| {
        let authorised = head
            .lines()
            .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {KEY}")));
        if authorised {
            support::RawReply::Bytes(support::sse_ok("m", 8))
        } else {
            support::RawReply::Bytes(
                b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_vec(),
            )
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    let port = support::free_port();
    std::fs::write(
        &path,
        format!(
            r#"
targets:
  - {{ name: secured, serving_mode: aggregated, url: "http://{target}", model: m, dialect: openai, api_key_env: CANARY_TEST_KEY }}
time_scale: 0.01
workloads:
  concurrency_sweep: {{ levels: [2], isl: 64, osl: 8, step: 120s, warmup: 10s }}
export: {{ listen: "127.0.0.1:{port}" }}
"#
        ),
    )
    .unwrap();
    // Debug logging everywhere (HTTP client included): the key must not show even there.
    let (daemon, addr) = support::start_daemon_with(
        Some(&path),
        dir.path(),
        false,
        &[("CANARY_TEST_KEY", KEY), ("RUST_LOG", "debug")],
    );
    // The HTTP surface binds where the config says.
    assert_eq!(addr, format!("127.0.0.1:{port}").parse().unwrap());
    let client = http();
    eventually("authorised requests", Duration::from_secs(30), || async {
        (sum(
            &scrape(&client, addr).await,
            "llm_canary_requests_total",
            &[("outcome", "ok")],
        ) >= 4.0)
            .then_some(())
    })
    .await;
    // Every request carried the key.
    let seen = heads.lock().unwrap().clone();
    assert!(
        seen.iter().all(|h| h.contains(KEY)),
        "a request without the key"
    );
    // `/-/reload` is off by default: 403 to POST, 405 to GET.
    let reload = format!("http://{addr}/-/reload");
    assert_eq!(client.post(&reload).send().await.unwrap().status(), 403);
    assert_eq!(client.get(&reload).send().await.unwrap().status(), 405);
    // Nothing the daemon shows holds the key.
    let metrics = scrape(&client, addr).await;
    let status = get_text(&client, &format!("http://{addr}/api/v1/status"))
        .await
        .unwrap();
    daemon.signal("TERM");
    let mut daemon = daemon;
    daemon.wait_exit("exit", Duration::from_secs(15)).await;
    let log = daemon.log_text();
    assert!(log.contains("DEBUG"), "debug logging was on");
    for (what, text) in [
        ("/metrics", &metrics),
        ("/api/v1/status", &status),
        ("log", &log),
    ] {
        assert!(!text.contains(KEY), "the API key shows in {what}");
        assert!(
            !text.contains("5ecret"),
            "part of the API key shows in {what}"
        );
    }
    assert!(status.contains("secured"), "{status}");
}

/// A target that refuses every request with the request's `Authorization` header in its answer
/// (an error page that echoes it) gets the canary's key republished nowhere: not in the daemon's
/// log (debug included) or `/api/v1/status` (the start-up probe's findings), nor in the bench's
/// `requests.jsonl`; each still shows what the server said, with `***` for the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_echoes_the_key_gets_it_republished_nowhere() {
    const KEY: &str = "sk-canary-echo-5ecret-31f0";
    let (target, heads) =
        support::raw_server(|head| support::echo_authorization_401(head, 0)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    std::fs::write(
        &path,
        format!(
            r#"
targets:
  - {{ name: echoing, serving_mode: aggregated, url: "http://{target}", model: m, dialect: openai, api_key_env: CANARY_TEST_KEY }}
time_scale: 0.01
workloads:
  concurrency_sweep: {{ levels: [1], isl: 32, osl: 4, step: 120s, warmup: 10s }}
"#
        ),
    )
    .unwrap();
    let (daemon, addr) = support::start_daemon_with(
        Some(&path),
        dir.path(),
        true,
        &[("CANARY_TEST_KEY", KEY), ("RUST_LOG", "debug")],
    );
    let client = http();
    let status_url = format!("http://{addr}/api/v1/status");
    // The probe's finding is published, and the steps' requests are refused too.
    let status = eventually("the probe's finding", Duration::from_secs(30), || async {
        let text = get_text(&client, &status_url).await.ok()?;
        text.contains("invalid credentials").then_some(text)
    })
    .await;
    eventually("refused requests", Duration::from_secs(30), || async {
        (sum(
            &scrape(&client, addr).await,
            "llm_canary_requests_total",
            &[("outcome", "http_4xx")],
        ) >= 2.0)
            .then_some(())
    })
    .await;
    daemon.signal("TERM");
    let mut daemon = daemon;
    daemon.wait_exit("exit", Duration::from_secs(15)).await;
    let log = daemon.log_text();

    // The bench of the same config, its requests written to `requests.jsonl`.
    let out = dir.path().join("out");
    let bench = Command::new(env!("CARGO_BIN_EXE_llm-canary"))
        .args(["bench", "--format", "json", "--config"])
        .arg(&path)
        .arg("--out")
        .arg(&out)
        .env("CANARY_TEST_KEY", KEY)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let requests = std::fs::read_to_string(out.join("requests.jsonl")).unwrap_or_else(|e| {
        panic!(
            "no requests.jsonl ({e}): {}",
            String::from_utf8_lossy(&bench.stderr)
        )
    });
    let bench_stderr = String::from_utf8_lossy(&bench.stderr).into_owned();

    assert!(
        heads.lock().unwrap().iter().all(|h| h.contains(KEY)),
        "a request without the key"
    );
    for (what, text) in [
        ("/api/v1/status", &status),
        ("the daemon's log", &log),
        ("requests.jsonl", &requests),
        ("the bench's stderr", &bench_stderr),
    ] {
        assert!(!text.contains("5ecret"), "the API key shows in {what}");
    }
    // What the server said is still there, the key masked.
    for (what, text) in [
        ("/api/v1/status", &status),
        ("the daemon's log", &log),
        ("requests.jsonl", &requests),
    ] {
        assert!(
            text.contains("invalid credentials") && text.contains("Bearer ***"),
            "{what} lost the server's answer: {text}"
        );
    }
    let line: serde_json::Value = serde_json::from_str(requests.lines().next().unwrap()).unwrap();
    assert_eq!(line["outcome"], "http_4xx", "{line}");
}

/// The daemon's resident memory in MiB.
fn rss_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("the daemon is alive")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmRSS")
        / 1024
}

/// Issue 21, item 5: a flood of the canary's own port, with clients that ask for `/metrics` and
/// read a byte now and then, and clients that connect and send nothing, neither grows the
/// daemon's memory without bound (connections, `/metrics` responses in flight, each response's
/// writing time and each connection's buffer are bounded), nor keeps it once they leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_readers_and_idle_connections_leaves_memory_bounded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let config =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/fast-demo.yaml");
    let (daemon, addr) = start_daemon(Some(&config), dir.path());
    let pid = daemon.child.id();
    let client = http_client(Some(Duration::from_secs(10)));
    let url = format!("http://{addr}/metrics");
    // A few steps in, so /metrics is a real exposition (tens of KiB).
    eventually("a sizeable /metrics", Duration::from_secs(120), || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let text = get_text(&client, &url).await.ok()?;
            (text.len() > 40_000).then_some(())
        }
    })
    .await;
    let baseline = rss_mib(pid);

    // 300 slow readers and 400 idle connections (under the 1,024 descriptors a test may have).
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..700 {
        flood.spawn(async move {
            let Ok(mut conn) = tokio::net::TcpStream::connect(addr).await else {
                return;
            };
            if i < 300 {
                let _ = conn
                    .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
                    .await;
                let mut byte = [0u8; 1];
                loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    match conn.read(&mut byte).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            }
            // Idle: hold the connection, send nothing.
            let _ = conn.read(&mut [0u8; 1]).await;
        });
    }
    let mut peak = baseline;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak = peak.max(rss_mib(pid));
    }
    flood.abort_all();
    while flood.join_next().await.is_some() {}

    // The daemon served on, and its memory stayed bounded: 300 unread expositions alone would be
    // far above this (the issue saw 178 → 593 MiB).
    assert!(
        get_text(&client, &format!("http://{addr}/-/healthy"))
            .await
            .is_ok(),
        "healthy after the flood"
    );
    assert!(
        peak <= baseline + 64,
        "peak {peak} MiB over a baseline of {baseline} MiB"
    );
    let settled = eventually(
        "memory back near the baseline",
        Duration::from_secs(30),
        || {
            let now = rss_mib(pid);
            async move { (now <= baseline + 32).then_some(now) }
        },
    )
    .await;
    eprintln!("flood: baseline {baseline} MiB, peak {peak} MiB, after {settled} MiB");
    drop(daemon);
}

/// A port that accepts connections and never answers (a hung server), held until dropped.
async fn black_hole() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    (addr, task)
}

/// Issue 21, item 6: `model: auto` asks `/v1/models` with the target's key, and a target whose
/// lookup never answers neither keeps the daemon from serving nor stops the other target: the
/// daemon runs with the healthy one, reports the broken one, and stops on the first SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_auto_uses_the_key_and_a_hung_target_stops_nobody() {
    const KEY: &str = "sk-canary-lookup-7e57";
    let (secured, heads) = support::raw_server(|head| {
        let authorised = head
            .lines()
            .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {KEY}")));
        if !authorised {
            return support::RawReply::Bytes(
                b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_vec(),
            );
        }
        if head.starts_with("GET /v1/models") {
            let body = r#"{"object":"list","data":[{"id":"served-model","object":"model"}]}"#;
            return support::RawReply::Bytes(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes(),
            );
        }
        support::RawReply::Bytes(support::sse_ok("served-model", 8))
    })
    .await;
    let (hung, _hole) = black_hole().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    std::fs::write(
        &path,
        format!(
            r#"
targets:
  - {{ name: secured, serving_mode: aggregated, url: "http://{secured}", model: auto, dialect: openai, api_key_env: CANARY_TEST_KEY }}
  - {{ name: hung, serving_mode: disaggregated, url: "http://{hung}", model: auto, dialect: openai }}
time_scale: 0.01
workloads:
  concurrency_sweep: {{ levels: [2], isl: 64, osl: 8, step: 120s, warmup: 10s }}
"#
        ),
    )
    .unwrap();
    let (daemon, addr) =
        support::start_daemon_with(Some(&path), dir.path(), true, &[("CANARY_TEST_KEY", KEY)]);
    let client = http();
    // The surface answers once the start is over: each target's lookup is one attempt of at
    // most 5 s, all at once, and the hung one is then left to the background retries.
    let metrics_url = format!("http://{addr}/metrics");
    eventually("the surface up", Duration::from_secs(20), || {
        let (client, url) = (client.clone(), metrics_url.clone());
        async move { get_text(&client, &url).await.ok() }
    })
    .await;
    // The healthy target is measured, with the model its lookup found.
    eventually(
        "the healthy target measured",
        Duration::from_secs(60),
        || async {
            let text = scrape(&client, addr).await;
            (sum(
                &text,
                "llm_canary_requests_total",
                &[("target", "secured"), ("outcome", "ok")],
            ) >= 4.0)
                .then_some(())
        },
    )
    .await;
    let seen = heads.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|h| h.starts_with("GET /v1/models") && h.contains(KEY)),
        "the model lookup carried the key: {seen:?}"
    );
    // The hung one is reported, down, and retried (not in the target list).
    let status: serde_json::Value = serde_json::from_str(
        &get_text(&client, &format!("http://{addr}/api/v1/status"))
            .await
            .unwrap(),
    )
    .unwrap();
    let failed = status["failed_targets"].as_array().expect("failed_targets");
    assert_eq!(failed.len(), 1, "{status}");
    assert_eq!(failed[0]["name"], "hung");
    assert!(
        status["targets"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["name"] != "hung"),
        "{status}"
    );
    assert_eq!(
        sample(
            &scrape(&client, addr).await,
            "llm_canary_target_up",
            &[("target", "hung")]
        ),
        Some(0.0)
    );
    daemon.signal("TERM");
    let mut daemon = daemon;
    let exit = daemon
        .wait_exit("exit on SIGTERM", Duration::from_secs(30))
        .await;
    assert!(exit.success(), "{exit:?}\n{}", daemon.log_text());
}

/// Issue 21, item 6: a SIGTERM while the targets' lookups hang ends the daemon at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_during_the_model_lookup_is_heard() {
    let (hung, _hole) = black_hole().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    std::fs::write(
        &path,
        format!(
            "targets:\n  - {{ name: hung, serving_mode: aggregated, url: \"http://{hung}\", model: auto }}\n"
        ),
    )
    .unwrap();
    let (daemon, _addr) = start_daemon(Some(&path), dir.path());
    daemon.signal("TERM");
    let mut daemon = daemon;
    // Well under the lookup's own 5 s timeout and the drain's bound.
    let exit = daemon
        .wait_exit("exit on the first SIGTERM", Duration::from_secs(4))
        .await;
    assert!(exit.success(), "{exit:?}\n{}", daemon.log_text());
}

/// Issue 19, item 3: the probe stream runs next to the steps, at its own rate, outside their
/// concurrency, reported under `workload="probe"` for every target, and an SLO over it has its
/// verdict while the step still runs (no step result ever holds a probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_stream_runs_at_its_rate_beside_the_steps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("canary.yaml");
    std::fs::write(
        &path,
        r#"
targets:
  - { name: agg, serving_mode: aggregated, simulated: { profile: fast } }
  - { name: disagg, serving_mode: disaggregated, simulated: { profile: fast } }
probe_stream: { interval: 1s }
workloads:
  # One long step at a high concurrency: the probe must not wait for it, nor count in it.
  concurrency_sweep: { levels: [16], isl: 64, osl: 8, step: 300s, warmup: 1s }
slos:
  - { name: probe-availability, objective: 50.0, sli: 'ttft{workload="probe"} < 5s', window: 10m, min_samples: 3 }
"#,
    )
    .unwrap();
    let (daemon, addr) = start_daemon(Some(&path), dir.path());
    let client = http();
    let probes = |text: &str, target: &str| {
        sum(
            text,
            "llm_canary_requests_total",
            &[("target", target), ("workload", "probe"), ("outcome", "ok")],
        )
    };
    let first = eventually(
        "probes of both targets",
        Duration::from_secs(60),
        || async {
            let text = scrape(&client, addr).await;
            (probes(&text, "agg") >= 2.0 && probes(&text, "disagg") >= 2.0).then_some(text)
        },
    )
    .await;
    let started = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let text = scrape(&client, addr).await;
    let elapsed = started.elapsed().as_secs_f64();
    for target in ["agg", "disagg"] {
        let sent = probes(&text, target) - probes(&first, target);
        // One a second: at least half of that on a busy machine, never a burst.
        assert!(
            sent >= elapsed / 2.0 && sent <= elapsed + 2.0,
            "{target}: {sent} probes in {elapsed:.1} s"
        );
        // The step's load ran beside it, under its own workload.
        assert!(
            sum(
                &text,
                "llm_canary_requests_total",
                &[("target", target), ("workload", "concurrency_sweep")]
            ) > sent,
            "{target}: the step's requests"
        );
    }
    // Its TTFT is its own series: the clean signal, apart from the loaded step's.
    assert!(
        text.lines().any(
            |l| l.starts_with("llm_canary_time_to_first_token_seconds_count{")
                && l.contains("workload=\"probe\"")
        ),
        "no probe TTFT histogram"
    );
    let slo = eventually(
        "the probe SLO's verdict within the step",
        Duration::from_secs(30),
        || async {
            let url = format!("http://{addr}/api/v1/status");
            let status: serde_json::Value =
                serde_json::from_str(&get_text(&client, &url).await.ok()?).ok()?;
            let slo = status["slos"][0].clone();
            (slo["state"] != "insufficient_data").then_some(slo)
        },
    )
    .await;
    assert_eq!(slo["state"], "pass", "{slo}");
    drop(daemon);
}

#[test]
fn a_malformed_worker_thread_count_is_bad_usage_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("good.yaml");
    std::fs::write(&cfg, GOOD).unwrap();
    let port = support::free_port();
    for bad in ["", "0", "two"] {
        let out = Command::new(env!("CARGO_BIN_EXE_llm-canary"))
            .env("TOKIO_WORKER_THREADS", bad)
            .args(["run", "--listen", &format!("127.0.0.1:{port}"), "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(
            err.contains(&format!(
                "TOKIO_WORKER_THREADS={bad:?} is not a positive whole number"
            )),
            "{bad:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{bad:?}: {err}");
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
    }
}
