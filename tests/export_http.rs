//! The daemon's HTTP surface end to end on loopback: the `/metrics` exposition (content type,
//! families, types, labels), readiness, reload, status passthrough, method and path errors, and
//! the graceful shutdown.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use llm_canary::config::ServingMode;
use llm_canary::export::{
    AppState, HttpError, HttpLimits, HttpServer, Lifecycle, Metrics, OPENMETRICS_CONTENT_TYPE,
    PauseHook, Readiness, ReloadFuture, ReloadHook, ShutdownOutcome,
};
use llm_canary::model::Phase;
use llm_canary::model::{
    BudgetAction, BudgetReport, BudgetUsage, PauseState, Quantiles, ServerSnapshot, StepSummary,
};
use llm_canary::request::RequestLabels;
use llm_canary::request::{Outcome, Sample};
use llm_canary::slo::{SloReading, SloState};
use std::time::Duration;
use support::metrics::{FAMILIES, LATE_FAMILIES, sample, sum};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

struct Running {
    base: String,
    shutdown: CancellationToken,
    server: JoinHandle<ShutdownOutcome>,
    readiness: Readiness,
}

impl Running {
    /// Cancels the server, which must drain.
    async fn stop(self) {
        self.shutdown.cancel();
        assert_eq!(self.server.await.expect("join"), ShutdownOutcome::Drained);
    }
}

async fn start(state: AppState) -> Running {
    let readiness = state.readiness();
    let server = HttpServer::bind("127.0.0.1:0".parse().expect("addr"), state)
        .await
        .expect("bind");
    let base = format!("http://{}", server.local_addr().expect("local addr"));
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(server.serve(shutdown.clone()));
    Running {
        base,
        shutdown,
        server,
        readiness,
    }
}

fn client() -> reqwest::Client {
    support::http::http_client(None)
}

fn status_source() -> Arc<dyn llm_canary::export::StatusSource> {
    Arc::new(
        || serde_json::json!({"targets": [{"name": "agg", "up": true}], "slos": {"gain": "pass"}}),
    )
}

fn fill(metrics: &Metrics) {
    let agg = RequestLabels::new("agg", ServingMode::Aggregated, "concurrency_sweep")
        .with_concurrency(32);
    let disagg = RequestLabels::new(
        "disagg",
        ServingMode::Disaggregated,
        "sequence_distribution",
    )
    .with_distribution("zipf", 1024);
    metrics.record_request(
        &agg,
        Phase::Steady,
        &Sample {
            outcome: Outcome::Ok,
            ttft: Some(0.5),
            itl: Some(0.02),
            latency: 4.0,
            prompt_tokens: 1024,
            cached_tokens: 512,
            output_tokens: 256,
            ..Sample::default()
        },
    );
    metrics.record_request(
        &agg,
        Phase::Steady,
        &Sample {
            outcome: Outcome::Ok,
            ttft: Some(2.5),
            itl: Some(0.03),
            latency: 9.0,
            prompt_tokens: 1024,
            output_tokens: 256,
            ..Sample::default()
        },
    );
    metrics.record_request(
        &agg,
        Phase::Steady,
        &Sample {
            outcome: Outcome::Http429,
            latency: 0.01,
            ..Sample::default()
        },
    );
    metrics.record_request(
        &disagg,
        Phase::Steady,
        &Sample {
            outcome: Outcome::Ok,
            ttft: Some(0.2),
            itl: Some(0.01),
            latency: 2.0,
            prompt_tokens: 1500,
            output_tokens: 100,
            ..Sample::default()
        },
    );
    metrics.record_chunk_gaps(&agg, &[(0.04, 2)]);
    metrics.record_server_timing(&disagg, 0.04, Some(0.002), Some(0.038));
    metrics.record_osl_mismatch(&agg);
    metrics.record_token_count_mismatch(&disagg);
    metrics.observe_schedule_lag("agg", "concurrency_sweep", 0.0004);
    metrics.observe_connect("agg", 0.0003);
    metrics.record_connection_retry("agg");
    metrics.set_target_up("agg", true);
    metrics.set_target_up("disagg", false);
    // A request still in flight at scrape time.
    metrics.add_inflight("agg", 1);
    metrics.set_server(
        "agg",
        &ServerSnapshot {
            prefix_cache_hit_ratio: Some(0.4),
            kv_cache_usage_ratio: Some(0.7),
            preemptions_total: Some(3.0),
            cancellations_total: Some(2.0),
            kv_offload_blocks_total: Some(9.0),
            ttft_mean_seconds: Some(0.3),
        },
    );
    let q = Quantiles {
        ci: [
            (Some(0.4), Some(0.6)),
            (Some(1.4), Some(1.6)),
            (Some(2.4), Some(2.6)),
        ],
        ..Quantiles::new(0.5, 1.5, 2.5)
    };
    metrics.set_step(
        &agg,
        &StepSummary {
            ttft: Some(q),
            itl: Some(q),
            request_duration: Some(q),
            output_tokens_per_second: 1200.0,
            requests_per_second: 3.0,
            goodput: 2.5,
            error_ratio: 1.0 / 3.0,
            cache_hit_ratio: Some(0.25),
            cost_per_million_tokens_usd: Some(15.2),
            end_timestamp_seconds: 1.75e9,
            degraded: false,
            faulted: false,
            saturated: None,
        },
    );
    metrics.set_slo(
        "disagg-ttft-gain-c32",
        &SloReading {
            state: SloState::InsufficientData,
            value: Some(0.2),
            threshold: Some(0.4),
            value_lower: Some(0.1),
            value_upper: Some(0.3),
        },
    );
    metrics.set_slo_data_age("disagg-ttft-gain-c32", Some(12.0));
    metrics.record_config_reload(true);
    metrics.set_probe("agg", true);
    metrics.set_paused(&PauseState {
        schedule: true,
        ..PauseState::default()
    });
    metrics.record_budget(&BudgetReport {
        actions: vec![BudgetAction {
            target: "agg".into(),
            workload: "concurrency_sweep",
            action: "skipped",
            detail: "needs 64 streams; budget max_inflight 32".into(),
        }],
        usage: vec![BudgetUsage {
            scope: "agg".into(),
            max_inflight: Some(32),
            max_rps: None,
            max_output_tokens_per_hour: None,
            output_tokens_last_hour: 512,
            throttled_requests: 3,
            throttled_seconds: 0.5,
        }],
    });
}

#[tokio::test]
async fn scrape_serves_openmetrics_with_every_family() {
    let metrics = Arc::new(Metrics::new(&[2.0]));
    fill(&metrics);
    let running = start(AppState::new(metrics, status_source())).await;
    let response = client()
        .get(format!("{}/metrics", running.base))
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], OPENMETRICS_CONTENT_TYPE);
    // The exposition goes out in chunks (the kept latency series), still with an exact length.
    let length = response.content_length().expect("a content-length");
    let text = response.text().await.expect("body");
    assert_eq!(length, text.len() as u64);
    assert!(
        text.ends_with("# EOF\n"),
        "no EOF: {}",
        &text[text.len().saturating_sub(80)..]
    );

    // Every family: `fill` gives a series to all the late ones but the KVBM hit ratios and the
    // scrape errors.
    let unfilled = [
        "llm_canary_server_kvbm_host_cache_hit_ratio",
        "llm_canary_server_kvbm_disk_cache_hit_ratio",
        "llm_canary_server_scrape_errors",
    ];
    let families: Vec<(&str, &str)> = FAMILIES
        .iter()
        .chain(LATE_FAMILIES.iter().filter(|(n, _)| !unfilled.contains(n)))
        .copied()
        .collect();
    assert_eq!(families.len(), 58);
    for (name, kind) in &families {
        let line = format!("# TYPE {name} {kind}\n");
        assert!(text.contains(&line), "missing `{}`", line.trim_end());
    }
    let type_lines = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    assert_eq!(type_lines, families.len(), "unexpected extra families");

    // The request labels that apply; one that does not is absent, which `sample` (like PromQL)
    // reads as empty.
    let agg_ok = [
        ("target", "agg"),
        ("serving_mode", "aggregated"),
        ("workload", "concurrency_sweep"),
        ("concurrency", "32"),
        ("turn", ""),
        ("distribution", ""),
        ("isl_bucket", ""),
        ("prefix_ratio", ""),
        ("outcome", "ok"),
    ];
    assert_eq!(
        sample(&text, "llm_canary_requests_total", &agg_ok),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "llm_canary_requests_total",
            &[("target", "agg"), ("outcome", "http_429")]
        ),
        Some(1.0)
    );
    // At the standard resolution the counters keep the step, not the request's ISL bucket.
    let disagg = [
        ("target", "disagg"),
        ("serving_mode", "disaggregated"),
        ("distribution", "zipf"),
        ("concurrency", ""),
    ];
    assert_eq!(
        sample(&text, "llm_canary_prompt_tokens_total", &disagg),
        Some(1500.0)
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("llm_canary_prompt_tokens_total{") && l.contains("isl_bucket=")),
        "a per-request label on a standard counter"
    );
    // The SLO threshold 2.0 s is a bucket bound: one of the two agg TTFTs (0.5) is under it.
    assert_eq!(
        sample(
            &text,
            "llm_canary_time_to_first_token_seconds_bucket",
            &[("target", "agg"), ("le", "2.0")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "llm_canary_step_ttft_seconds",
            &[("target", "agg"), ("quantile", "0.99")]
        ),
        Some(2.5)
    );
    assert_eq!(
        sample(
            &text,
            "llm_canary_slo_state",
            &[
                ("slo", "disagg-ttft-gain-c32"),
                ("state", "insufficient_data")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "llm_canary_target_up", &[("target", "disagg")]),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "llm_canary_inflight_requests", &[("target", "agg")]),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "llm_canary_osl_mismatch_total",
            &[("target", "agg"), ("workload", "concurrency_sweep")]
        ),
        Some(1.0)
    );
    running.stop().await;
}

#[tokio::test]
async fn health_readiness_status_and_errors() {
    let running = start(AppState::new(Arc::new(Metrics::new(&[])), status_source())).await;
    let client = client();
    let get = |path: &str| client.get(format!("{}{path}", running.base)).send();

    let healthy = get("/-/healthy").await.expect("healthy");
    assert_eq!(healthy.status(), 200);
    assert_eq!(healthy.text().await.expect("body"), "OK");

    assert_eq!(get("/-/ready").await.expect("ready").status(), 503);
    running.readiness.set_ready();
    assert_eq!(get("/-/ready").await.expect("ready").status(), 200);

    let status = get("/api/v1/status").await.expect("status");
    assert_eq!(status.status(), 200);
    assert_eq!(status.headers()["content-type"], "application/json");
    let json: serde_json::Value =
        serde_json::from_str(&status.text().await.expect("body")).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"targets": [{"name": "agg", "up": true}], "slos": {"gain": "pass"}})
    );

    assert_eq!(get("/nope").await.expect("404").status(), 404);
    assert_eq!(get("/metrics/extra").await.expect("404").status(), 404);
    let not_allowed = client
        .delete(format!("{}/metrics", running.base))
        .send()
        .await
        .expect("405");
    assert_eq!(not_allowed.status(), 405);
    assert_eq!(not_allowed.headers()["allow"], "GET");

    // The lifecycle endpoints are off unless the daemon enables them.
    for path in ["/-/reload", "/-/pause", "/-/resume"] {
        let forbidden = client
            .post(format!("{}{path}", running.base))
            .send()
            .await
            .expect("403");
        assert_eq!(forbidden.status(), 403, "{path}");
    }
    running.stop().await;
}

/// A pause switch that remembers its state.
#[derive(Default)]
struct Switch(std::sync::Mutex<Option<String>>);

impl PauseHook for Switch {
    fn pause(&self, note: String) -> serde_json::Value {
        *self.0.lock().unwrap() = Some(note.clone());
        serde_json::json!({"paused": true, "note": note})
    }
    fn resume(&self) -> serde_json::Value {
        *self.0.lock().unwrap() = None;
        serde_json::json!({"paused": false})
    }
}

#[tokio::test]
async fn reload_reports_success_and_failure() {
    let fail_next = Arc::new(AtomicBool::new(false));
    let hook_fail = fail_next.clone();
    let metrics = Arc::new(Metrics::new(&[]));
    let hook_metrics = metrics.clone();
    let hook: Arc<dyn ReloadHook> = Arc::new(move || -> ReloadFuture {
        let fail = hook_fail.load(Ordering::SeqCst);
        let metrics = hook_metrics.clone();
        Box::pin(async move {
            metrics.record_config_reload(!fail);
            if fail {
                Err(HttpError::Reload(
                    "canary.yaml:3:7: unknown field `targetz`".into(),
                ))
            } else {
                Ok("config reloaded: 2 targets, 4 SLOs".to_owned())
            }
        })
    });
    let token = "a-token-from-a-secret-0123";
    let switch = Arc::new(Switch::default());
    let running = start(
        AppState::new(metrics.clone(), status_source()).with_lifecycle(Lifecycle {
            reload: hook,
            pause: switch.clone(),
            token: Some(token.to_owned()),
        }),
    )
    .await;
    let url = format!("{}/-/reload", running.base);
    // Without the token: 401, and nothing reloads.
    let anonymous = client().post(&url).send().await.expect("401");
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    let client = reqwest::Client::builder()
        .no_proxy()
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}").parse().unwrap(),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .unwrap();
    // Pause and resume flip the switch.
    let paused = client
        .post(format!("{}/-/pause", running.base))
        .body(r#"{"note": "release 1.4"}"#)
        .send()
        .await
        .expect("pause");
    assert_eq!(paused.status(), 200);
    assert_eq!(switch.0.lock().unwrap().as_deref(), Some("release 1.4"));
    let resumed = client
        .post(format!("{}/-/resume", running.base))
        .send()
        .await
        .expect("resume");
    assert_eq!(resumed.status(), 200);
    assert_eq!(*switch.0.lock().unwrap(), None);

    let ok = client.post(&url).send().await.expect("reload");
    assert_eq!(ok.status(), 200);
    assert_eq!(
        ok.text().await.expect("body"),
        "config reloaded: 2 targets, 4 SLOs"
    );

    fail_next.store(true, Ordering::SeqCst);
    let failed = client.post(&url).send().await.expect("reload");
    assert_eq!(failed.status(), 500);
    assert_eq!(
        failed.text().await.expect("body"),
        "canary.yaml:3:7: unknown field `targetz`"
    );
    let text = metrics.encode().expect("encode");
    assert_eq!(
        sample(&text, "llm_canary_config_last_reload_successful", &[]),
        Some(0.0)
    );

    let wrong_method = client.get(&url).send().await.expect("405");
    assert_eq!(wrong_method.status(), 405);
    assert_eq!(wrong_method.headers()["allow"], "POST");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_during_scrapes_loses_nothing() {
    const RECORDERS: usize = 4;
    const PER_RECORDER: usize = 2_000;
    let metrics = Arc::new(Metrics::new(&[]));
    let running = start(AppState::new(metrics.clone(), status_source())).await;
    let recorders: Vec<_> = (0..RECORDERS)
        .map(|i| {
            let metrics = metrics.clone();
            std::thread::spawn(move || {
                for n in 0..PER_RECORDER {
                    // New label sets keep being created while scrapes run, exercising the
                    // family write path too.
                    let labels = RequestLabels::new("agg", ServingMode::Aggregated, "multi_turn")
                        .with_turn((n % 50) as u32 + 1);
                    metrics.record_request(
                        &labels,
                        Phase::Steady,
                        &Sample {
                            outcome: Outcome::Ok,
                            ttft: Some(0.001 * i as f64),
                            prompt_tokens: 1,
                            output_tokens: 1,
                            ..Sample::default()
                        },
                    );
                }
            })
        })
        .collect();
    let client = client();
    let mut scrapes = 0;
    while recorders.iter().any(|r| !r.is_finished()) || scrapes < 3 {
        let response = client
            .get(format!("{}/metrics", running.base))
            .send()
            .await
            .expect("scrape");
        assert!(response.text().await.expect("body").ends_with("# EOF\n"));
        scrapes += 1;
    }
    for recorder in recorders {
        recorder.join().expect("recorder");
    }
    let text = metrics.encode().expect("encode");
    let total = sum(&text, "llm_canary_time_to_first_token_seconds_count", &[]);
    assert_eq!(total, (RECORDERS * PER_RECORDER) as f64);
    running.stop().await;
}

/// Connects and sends `head` (and nothing more).
async fn raw(base: &str, head: &[u8]) -> tokio::net::TcpStream {
    let mut conn = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .expect("connect");
    conn.write_all(head).await.expect("write");
    conn
}

/// Reads until the server closes the connection (or `limit`), returning what came.
async fn read_to_close(conn: &mut tokio::net::TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_and_slow_clients_cannot_hold_the_surface() {
    let metrics = Arc::new(Metrics::new(&[]));
    fill(&metrics);
    let limits = HttpLimits {
        max_connections: 8,
        max_connections_per_peer: 4,
        health_connections: 4,
        header_read_timeout: Duration::from_secs(1),
        body_read_timeout: Duration::from_secs(1),
        write_stall_timeout: Duration::from_secs(1),
        response_timeout: Duration::from_secs(2),
        max_metrics_responses: 4,
        ..HttpLimits::default()
    };
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let reload: Arc<dyn ReloadHook> = Arc::new(move || -> ReloadFuture {
        counted.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok("reloaded".to_owned()) })
    });
    let state = AppState::new(metrics, status_source())
        .with_limits(limits)
        .with_lifecycle(Lifecycle {
            reload,
            pause: Arc::new(Switch::default()),
            token: None,
        });
    let running = start(state).await;
    let bound = Duration::from_secs(10);

    // Connections that send nothing fill the general pool (8 less 4 kept for health probes),
    // which is also this peer's share: one more is closed at once; the idle ones are closed
    // once their head is overdue, after which scrapes get through again.
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(raw(&running.base, b"").await);
    }
    let mut extra = raw(&running.base, b"").await;
    assert_eq!(read_to_close(&mut extra, bound).await, Some(Vec::new()));
    for conn in &mut idle {
        assert!(
            read_to_close(conn, bound).await.is_some(),
            "an idle connection was kept"
        );
    }
    let scrape = client()
        .get(format!("{}/metrics", running.base))
        .send()
        .await
        .expect("scrape after the idle ones left");
    assert_eq!(scrape.status(), 200);

    // A body trickled too slowly is refused with 408, and the reload never runs.
    let mut slow = raw(
        &running.base,
        b"POST /-/reload HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789",
    )
    .await;
    let answer = read_to_close(&mut slow, bound).await.expect("an answer");
    assert!(
        answer.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // A head over the size limit is refused without reaching a handler.
    let big = format!(
        "GET /metrics HTTP/1.1\r\nhost: x\r\nx-padding: {}\r\n\r\n",
        "p".repeat(512 * 1024)
    );
    let mut oversized = raw(&running.base, big.as_bytes()).await;
    let answer = read_to_close(&mut oversized, bound)
        .await
        .expect("an answer");
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // A scraper that asks and never reads holds no lock: other scrapes keep being answered.
    let _stalled = raw(&running.base, b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let client = client();
    for _ in 0..20 {
        let r = tokio::time::timeout(
            bound,
            client.get(format!("{}/metrics", running.base)).send(),
        )
        .await
        .expect("a scrape beside a stalled one")
        .expect("scrape");
        assert_eq!(r.status(), 200);
        assert!(r.text().await.expect("body").ends_with("# EOF\n"));
    }
    running.stop().await;
}

#[tokio::test]
async fn shutdown_stops_accepting() {
    let running = start(AppState::new(Arc::new(Metrics::new(&[])), status_source())).await;
    let client = client();
    // A kept-alive connection must not hold the drain open.
    assert_eq!(
        client
            .get(format!("{}/-/healthy", running.base))
            .send()
            .await
            .expect("healthy")
            .status(),
        200
    );
    let addr = running.base.trim_start_matches("http://").to_owned();
    running.stop().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[test]
fn support_looks_samples_up_by_name_and_label_pairs() {
    let text = "# TYPE x counter\n\
                x_total{a=\"1\",b=\"q\\\"uote\"} 3\n\
                x_total{a=\"2\", b=\"\"} 4.5\n\
                x_total_more{a=\"1\"} 100\n\
                y 7\n\
                # EOF\n";
    assert_eq!(sample(text, "x_total", &[("a", "1")]), Some(3.0));
    assert_eq!(sample(text, "x_total", &[("b", "q\"uote")]), Some(3.0));
    assert_eq!(sample(text, "x_total", &[("a", "2"), ("b", "")]), Some(4.5));
    assert_eq!(sample(text, "x_total", &[("a", "3")]), None);
    assert_eq!(sample(text, "x", &[]), None, "a name is matched whole");
    assert_eq!(sample(text, "y", &[]), Some(7.0));
    assert_eq!(sum(text, "x_total", &[]), 7.5);
    assert_eq!(sum(text, "x_total", &[("a", "9")]), 0.0);
}
