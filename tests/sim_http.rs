//! The simulator over HTTP on loopback, checked with a plain reqwest client: the OpenAI wire shape
//! (streaming and not), usage and `nvext`, `/v1/models`, `/health`, `/metrics`, every injected
//! fault as a client sees it, the `fixed` profile's recorded send instants, and one event per
//! write under `write_per_event`.

mod support;

use std::time::Duration;

use llm_canary::config::ServingMode;
use llm_canary::sim::{
    AfterTokens, ErrorEventFault, ErrorFault, FaultSpec, RefuseMode, SimHandle, SimSpec,
    SlowFirstByte, StallFault, TruncateFault,
};
use serde_json::{Value, json};
use support::http::{get_json, http_client, scrape};
use support::sim::{fast, start_sim, words};
use tokio::time::Instant;

fn client() -> reqwest::Client {
    http_client(Some(Duration::from_secs(20)))
}

/// `POST url` of `body` (JSON), with an `x-request-id` when given.
async fn post(
    c: &reqwest::Client,
    url: &str,
    body: &Value,
    request_id: Option<&str>,
) -> reqwest::Result<reqwest::Response> {
    let mut req = c.post(url).header("content-type", "application/json");
    if let Some(id) = request_id {
        req = req.header("x-request-id", id);
    }
    req.body(serde_json::to_vec(body).unwrap()).send().await
}

/// The JSON answer to `POST url` of `body`.
async fn post_json(c: &reqwest::Client, url: &str, body: &Value) -> Value {
    let bytes = post(c, url, body, None)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn chat_body(prompt: &str, osl: u32) -> Value {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": osl, "max_completion_tokens": osl, "min_tokens": osl, "ignore_eos": true,
        "nvext": {"extra_fields": ["timing", "worker_id"]},
    })
}

/// SSE events of a complete body, with the arrival instant of the frame that carried each.
struct Events {
    events: Vec<(String, Instant)>,
    error: Option<reqwest::Error>,
}

async fn read_events(mut resp: reqwest::Response) -> Events {
    let mut events = Vec::new();
    let mut pending = String::new();
    let error = loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => {
                let now = Instant::now();
                pending.push_str(std::str::from_utf8(&bytes).unwrap());
                while let Some(end) = pending.find("\n\n") {
                    events.push((pending[..end].to_string(), now));
                    pending.drain(..end + 2);
                }
            }
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    Events { events, error }
}

fn data_json(event: &str) -> Option<Value> {
    let data = event.strip_prefix("data: ")?;
    serde_json::from_str(data).ok()
}

fn content_events(events: &Events) -> Vec<(String, Instant)> {
    events
        .events
        .iter()
        .filter_map(|(e, at)| {
            let v = data_json(e)?;
            let c = v["choices"][0]["delta"]["content"].as_str()?;
            (!c.is_empty()).then(|| (c.to_string(), *at))
        })
        .collect()
}

#[tokio::test]
async fn streaming_chat_has_the_openai_shape_usage_and_nvext() {
    let sim = start_sim(fast(), ServingMode::Disaggregated).await;
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let prompt = words(300, "w");
    let resp = post(&client(), &url, &chat_body(&prompt, 12), Some("req-1"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["x-request-id"], "req-1");
    let ev = read_events(resp).await;
    assert!(ev.error.is_none());
    let all: Vec<&str> = ev.events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(*all.last().unwrap(), "data: [DONE]");
    let first = data_json(all[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert!(first["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(content_events(&ev).len(), 12, "one chunk per token");
    let finish = data_json(all[all.len() - 3]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let timing = &finish["nvext"]["timing"];
    for key in [
        "request_received_ms",
        "prefill_wait_time_ms",
        "prefill_time_ms",
        "ttft_ms",
        "total_time_ms",
        "kv_hit_rate",
        "kv_transfer_estimated_latency_ms",
    ] {
        assert!(timing[key].is_number(), "nvext.timing.{key} in {finish}");
    }
    assert!(timing["kv_transfer_estimated_latency_ms"].as_f64().unwrap() >= 5.0);
    // As in Dynamo, `ttft_ms` is the prefill worker's first token (wait + prefill), before the
    // handoff to the decode worker: the client's first token comes later.
    let ms = |k: &str| timing[k].as_f64().unwrap();
    assert!(
        (ms("prefill_wait_time_ms") + ms("prefill_time_ms") - ms("ttft_ms")).abs() < 0.01,
        "{timing}"
    );
    assert_eq!(finish["nvext"]["worker_id"]["prefill_worker_id"], 0);
    assert_eq!(finish["nvext"]["worker_id"]["decode_worker_id"], 1);
    let usage_chunk = data_json(all[all.len() - 2]).unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    let usage = &usage_chunk["usage"];
    assert_eq!(usage["completion_tokens"], 12);
    // 300 words + the template's 5 marker tokens for one user message.
    assert_eq!(usage["prompt_tokens"], 305);
    assert!(
        usage.get("prompt_tokens_details").is_none(),
        "cached_tokens is omitted when zero: {usage}"
    );

    // The same prompt again hits the prefix cache: 305 tokens → 4 whole blocks of 64.
    let again = post(&client(), &url, &chat_body(&prompt, 4), None)
        .await
        .unwrap();
    let ev = read_events(again).await;
    let usage = data_json(&ev.events[ev.events.len() - 2].0).unwrap();
    assert_eq!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"],
        256
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn non_streaming_completions_and_the_read_endpoints() {
    let sim = start_sim(fast(), ServingMode::Aggregated).await;
    let base = sim.base_url();
    let c = client();
    let completions = format!("{base}/v1/completions");
    let v = post_json(
        &c,
        &completions,
        &json!({"model": "m", "prompt": words(100, "p"), "max_tokens": 7, "ignore_eos": true}),
    )
    .await;
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["prompt_tokens"], 100);
    assert_eq!(v["usage"]["completion_tokens"], 7);
    assert_eq!(
        v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        7
    );
    // Token ids are accepted as the prompt too.
    let v = post_json(
        &c,
        &completions,
        &json!({"prompt": [1, 2, 3, 4], "max_tokens": 2, "ignore_eos": true}),
    )
    .await;
    assert_eq!(v["usage"]["prompt_tokens"], 4);

    let models = get_json(&c, &format!("{base}/v1/models")).await.unwrap();
    assert_eq!(models["data"][0]["id"], "Qwen/Qwen3-30B-A3B-FP8");
    let health = get_json(&c, &format!("{base}/health")).await.unwrap();
    assert_eq!(health["status"], "healthy");
    assert_eq!(health["instances"].as_array().unwrap().len(), 1);
    let bad = c
        .post(format!("{base}/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    let metrics = scrape(&c, &base).await;
    for name in [
        "dynamo_frontend_time_to_first_token_seconds_bucket",
        "dynamo_frontend_inter_token_latency_seconds_bucket",
        "dynamo_frontend_request_duration_seconds_count",
        "dynamo_frontend_requests_total",
        "dynamo_frontend_inflight_requests",
        "dynamo_frontend_queued_requests",
        "dynamo_frontend_input_sequence_tokens_sum",
        "dynamo_frontend_output_sequence_tokens_sum",
        "dynamo_frontend_cached_tokens_count",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "dynamo_component_cancellation_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    assert!(metrics.contains(
        "dynamo_frontend_requests_total{model=\"Qwen/Qwen3-30B-A3B-FP8\",endpoint=\"completions\",request_type=\"unary\",status=\"success\"} 2"
    ));
    assert!(
        metrics.contains("dynamo_frontend_inflight_requests{model=\"Qwen/Qwen3-30B-A3B-FP8\"} 0")
    );
    assert!(!metrics.contains("kvbm_"), "KVBM counters only with tiers");
    assert!(
        !metrics.contains("evictions"),
        "vLLM has no eviction counter, and neither has the simulator"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn kvbm_counters_appear_with_offload_tiers() {
    let spec = SimSpec {
        cpu_tier: Some(llm_canary::sim::TierSpec {
            capacity_gb: 1.0,
            bandwidth_gbps: 20.0,
        }),
        ..fast()
    };
    let sim = start_sim(spec, ServingMode::Aggregated).await;
    let text = scrape(&client(), &sim.base_url()).await;
    // Dynamo's KVBM names: counters of the Rust `prometheus` crate, which adds no `_total`.
    for name in [
        "kvbm_offload_blocks_d2h",
        "kvbm_offload_blocks_h2d",
        "kvbm_offload_blocks_d2d",
        "kvbm_onboard_blocks_h2d",
        "kvbm_onboard_blocks_d2d",
        "kvbm_matched_tokens",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} counter\n")),
            "{name} missing:\n{text}"
        );
        assert!(
            text.contains(&format!("\n{name}{{")),
            "{name} has no sample"
        );
    }
    let kvbm: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("kvbm_") || l.starts_with("# TYPE kvbm_"))
        .collect();
    assert!(
        kvbm.iter().all(|l| !l.contains("_total")),
        "no `_total` on KVBM names: {kvbm:?}"
    );
    assert!(
        !text.contains("cache_blocks"),
        "Dynamo has no tier occupancy gauge"
    );
    sim.shutdown().await;
}

async fn stream_with(
    faults: FaultSpec,
    osl: u32,
) -> (SimHandle, reqwest::Result<reqwest::Response>, Instant) {
    let sim = start_sim(SimSpec { faults, ..fast() }, ServingMode::Aggregated).await;
    let sent = Instant::now();
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let resp = post(&client(), &url, &chat_body("a b c", osl), None).await;
    (sim, resp, sent)
}

/// The events of a stream of `osl` tokens with `faults`, read to its end.
async fn events_with(faults: FaultSpec, osl: u32) -> Events {
    let (_sim, resp, _) = stream_with(faults, osl).await;
    read_events(resp.unwrap()).await
}

/// The events of a stream of 10 tokens truncated after 4, with a reset (`abrupt`) or not.
async fn truncated_after_4_of_10(abrupt: bool) -> Events {
    events_with(
        FaultSpec {
            truncate: Some(TruncateFault {
                rate: 1.0,
                after_tokens: 4,
                abrupt,
            }),
            ..FaultSpec::default()
        },
        10,
    )
    .await
}

#[tokio::test]
async fn fault_error_status_with_an_openai_error_body() {
    for status in [429u16, 500, 503] {
        let (_sim, resp, _) = stream_with(
            FaultSpec {
                error: Some(ErrorFault { rate: 1.0, status }),
                ..FaultSpec::default()
            },
            5,
        )
        .await;
        let resp = resp.unwrap();
        assert_eq!(resp.status().as_u16(), status);
        if status == 429 {
            assert_eq!(resp.headers()["retry-after"], "1");
        }
        let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        assert_eq!(v["error"]["code"], status);
    }
}

#[tokio::test]
async fn fault_error_rate_hits_about_its_share() {
    let sim = start_sim(
        SimSpec {
            faults: FaultSpec {
                error: Some(ErrorFault {
                    rate: 0.3,
                    status: 503,
                }),
                ..FaultSpec::default()
            },
            ..fast()
        },
        ServingMode::Aggregated,
    )
    .await;
    let c = client();
    let url = format!("{}/v1/completions", sim.base_url());
    let mut errors = 0;
    for _ in 0..100 {
        let body = json!({"prompt": "x y", "max_tokens": 1});
        let r = post(&c, &url, &body, None).await.unwrap();
        if r.status() == 503 {
            errors += 1;
        }
    }
    assert!(
        (15..=45).contains(&errors),
        "{errors} of 100 failed at rate 0.3"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn fault_stall_pauses_after_n_tokens() {
    let ev = events_with(
        FaultSpec {
            stall: Some(StallFault {
                rate: 1.0,
                after_tokens: 3,
                duration: Duration::from_millis(400),
            }),
            ..FaultSpec::default()
        },
        6,
    )
    .await;
    let content = content_events(&ev);
    assert_eq!(content.len(), 6);
    let gap = content[3].1 - content[2].1;
    assert!(gap >= Duration::from_millis(390), "stall gap {gap:?}");
    assert_eq!(ev.events.last().unwrap().0, "data: [DONE]");
}

#[tokio::test]
async fn fault_truncated_stream_ends_without_done() {
    let ev = truncated_after_4_of_10(false).await;
    assert!(ev.error.is_none(), "a clean end of the body");
    assert_eq!(content_events(&ev).len(), 4);
    assert!(ev.events.iter().all(|(e, _)| e != "data: [DONE]"));
}

#[tokio::test]
async fn fault_abrupt_truncation_resets_mid_body() {
    let ev = truncated_after_4_of_10(true).await;
    assert!(ev.error.is_some(), "the body ends in an error");
    assert_eq!(content_events(&ev).len(), 4);
}

#[tokio::test]
async fn fault_malformed_chunk_is_not_json() {
    let ev = events_with(
        FaultSpec {
            malformed_chunk: Some(AfterTokens {
                rate: 1.0,
                after_tokens: 2,
            }),
            ..FaultSpec::default()
        },
        5,
    )
    .await;
    let bad: Vec<_> = ev
        .events
        .iter()
        .filter(|(e, _)| e.starts_with("data: {") && data_json(e).is_none())
        .collect();
    assert_eq!(bad.len(), 1, "exactly one unparseable chunk");
}

#[tokio::test]
async fn fault_error_event_frame() {
    let ev = events_with(
        FaultSpec {
            error_event: Some(ErrorEventFault {
                rate: 1.0,
                after_tokens: 3,
                message: "boom".into(),
            }),
            ..FaultSpec::default()
        },
        10,
    )
    .await;
    let (last, _) = ev.events.last().unwrap();
    let mut lines = last.lines();
    assert_eq!(lines.next(), Some("event: error"));
    assert_eq!(lines.next(), Some(": boom"));
    let payload: Value =
        serde_json::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(payload["error"]["message"], "boom");
    assert_eq!(content_events(&ev).len(), 3);
}

/// `llm-canary sim --faults` in its own process serves the faults given on its command line, in
/// the config's schema (a truncation at rate 1, so the outcome is not luck).
#[tokio::test]
async fn the_sim_command_injects_the_faults_given_on_its_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, addr) = support::start_sim_process(
        &[
            "--profile",
            "fast",
            "--faults",
            "{truncate: {after_tokens: 3}}",
        ],
        &dir.path().join("sim.log"),
    );
    let url = format!("http://{addr}/v1/chat/completions");
    let events = read_events(
        post(&client(), &url, &chat_body("a b c", 10), None)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(content_events(&events).len(), 3, "{:?}", events.events);
    assert!(
        !events.events.iter().any(|(e, _)| e.contains("[DONE]")),
        "{:?}",
        events.events
    );
}

/// A bad `--faults` is bad usage: exit 2 before listening, the problem placed in the flag's text.
#[test]
fn a_bad_faults_flag_names_its_place_and_the_fix() {
    for (faults, expect) in [
        (
            "{stal: {after_tokens: 2, duration: 1s}}",
            "--faults:1:2: unknown key `stal` (hint: did you mean `stall`?)",
        ),
        (
            "{error: {status: 200}}",
            "--faults: error.status must be an HTTP error status (400-599), got 200",
        ),
        ("{error: {rate: 2}", "--faults:1:1:"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llm-canary"))
            .args(["sim", "--listen", "127.0.0.1:0", "--faults", faults])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{faults}: {stderr}");
        assert!(stderr.contains(expect), "{faults}: {stderr}");
    }
}

#[tokio::test]
async fn fault_slow_first_byte_delays_the_headers() {
    let (_sim, resp, sent) = stream_with(
        FaultSpec {
            slow_first_byte: Some(SlowFirstByte {
                rate: 1.0,
                delay: Duration::from_millis(300),
            }),
            ..FaultSpec::default()
        },
        2,
    )
    .await;
    let headers_at = Instant::now();
    assert_eq!(resp.unwrap().status(), 200);
    assert!(headers_at - sent >= Duration::from_millis(300));
}

/// Whether `done` holds of `GET url` within `tries` tries, each with a fresh client (a pooled
/// keep-alive connection would bypass the listener), `pause`d between (or yielding).
async fn get_until(
    url: &str,
    tries: usize,
    pause: Option<Duration>,
    done: impl Fn(&reqwest::Result<reqwest::Response>) -> bool,
) -> bool {
    for _ in 0..tries {
        if done(&client().get(url).send().await) {
            return true;
        }
        match pause {
            Some(pause) => tokio::time::sleep(pause).await,
            None => tokio::task::yield_now().await,
        }
    }
    false
}

#[tokio::test]
async fn fault_refused_connections_both_ways_and_recovery() {
    let sim = start_sim(fast(), ServingMode::Aggregated).await;
    let url = format!("{}/v1/models", sim.base_url());
    // A fresh client per call: a pooled keep-alive connection would bypass the listener.
    assert!(
        client()
            .get(&url)
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );

    sim.set_faults(FaultSpec {
        refuse_connections: Some(RefuseMode::StopAccepting),
        ..FaultSpec::default()
    });
    // The accept loop may not have seen the change at once.
    let refused = get_until(&url, 50, None, |r| {
        r.as_ref().is_err_and(|e| e.is_connect())
    })
    .await;
    assert!(refused, "connects are refused");

    sim.set_faults(FaultSpec {
        refuse_connections: Some(RefuseMode::CloseImmediately),
        ..FaultSpec::default()
    });
    let pause = Some(Duration::from_millis(20));
    let closed = get_until(&url, 100, pause, |r| {
        r.as_ref().is_err_and(|e| !e.is_connect())
    })
    .await;
    assert!(closed, "connections close before a response");

    sim.set_faults(FaultSpec::default());
    let back = get_until(&url, 100, pause, |r| {
        r.as_ref().is_ok_and(|r| r.status().is_success())
    })
    .await;
    assert!(back, "service resumes when the fault is cleared");
    sim.shutdown().await;
}

#[tokio::test]
async fn fixed_profile_records_each_tokens_send_instant() {
    let sim = start_sim(
        SimSpec {
            profile: "fixed".into(),
            ..SimSpec::default()
        },
        ServingMode::Aggregated,
    )
    .await;
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let sent = Instant::now();
    let resp = post(&client(), &url, &chat_body("a b c", 10), Some("fixed-1"))
        .await
        .unwrap();
    let ev = read_events(resp).await;
    let arrivals: Vec<Instant> = content_events(&ev).into_iter().map(|(_, at)| at).collect();
    let sends = sim
        .token_send_times("fixed-1")
        .expect("send times recorded");
    assert_eq!(sends.len(), 10);
    // Server-side: token i leaves at 100 ms + 10 ms·i after the request on an absolute schedule;
    // a loaded machine may run a send late (a busy 2-core machine was seen 84 ms late: that is
    // the test's CPU, not the simulator), never early. How late on a quiet machine is a
    // benchmark's figure (`cargo bench --bench client`), not this test's.
    for (i, at) in sends.iter().enumerate() {
        let due = Duration::from_millis(100 + 10 * i as u64);
        let late = (*at - sent).checked_sub(due).expect("never early");
        assert!(late < Duration::from_secs(1), "token {i} late by {late:?}");
    }
    // Every token arrives after it was sent, and soon after on loopback.
    for (s, a) in sends.iter().zip(&arrivals) {
        assert!(a >= s && *a - *s < Duration::from_secs(1));
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn send_log_lines_up_with_the_clients_clock_monotonic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("send.jsonl");
    let sim = start_sim(
        SimSpec {
            profile: "fast".into(),
            send_log: Some(path.clone()),
            ..SimSpec::default()
        },
        ServingMode::Aggregated,
    )
    .await;
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let clock = llm_canary::clock::MonoClock::now();
    let before = clock.mono_ns(Instant::now());
    for id in ["log-1", "log-2"] {
        let resp = post(&client(), &url, &chat_body("a b c", 7), Some(id))
            .await
            .unwrap();
        assert_eq!(content_events(&read_events(resp).await).len(), 7);
    }
    let after = clock.mono_ns(Instant::now());
    // Buffered: the lines are there once the simulator has shut down.
    sim.shutdown().await;
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["x_request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["log-1", "log-2"]);
    for line in &lines {
        assert_eq!(line["ok"], true, "{line}");
        let received = line["received_mono_ns"].as_u64().unwrap();
        let tokens: Vec<u64> = line["token_mono_ns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(tokens.len(), 7, "{line}");
        // When the request came to the host (the kernel's stamp), which the simulator reads
        // then or later.
        let arrived = line["arrived_mono_ns"].as_u64().unwrap();
        // The same clock as the client's: inside the client's own readings, in order.
        assert!(
            before <= arrived && arrived <= received && received <= tokens[0],
            "{line}"
        );
        assert!(tokens.is_sorted() && tokens[6] <= after, "{line}");
    }
}

#[tokio::test]
async fn shutdown_is_graceful_for_open_streams() {
    let spec = SimSpec {
        profile: "fixed".into(),
        fixed_ttft: Duration::from_millis(10),
        fixed_itl: Duration::from_millis(20),
        ..SimSpec::default()
    };
    let sim = start_sim(spec, ServingMode::Aggregated).await;
    let addr = sim.local_addr();
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let resp = post(&client(), &url, &chat_body("a b", 20), None)
        .await
        .unwrap();
    // Shut down while the ~400 ms stream is open: it still completes.
    let shutdown = tokio::spawn(sim.shutdown());
    let ev = read_events(resp).await;
    assert!(ev.error.is_none());
    assert_eq!(content_events(&ev).len(), 20);
    assert_eq!(ev.events.last().unwrap().0, "data: [DONE]");
    shutdown.await.unwrap();
    let after = client()
        .get(format!("http://{addr}/v1/models"))
        .send()
        .await;
    assert!(after.is_err(), "nothing listens after shutdown");
}

/// Events per HTTP chunk of one streamed chat completion of `osl` tokens.
async fn events_per_chunk(spec: SimSpec, osl: u32) -> Vec<usize> {
    let sim = start_sim(spec, ServingMode::Aggregated).await;
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let mut resp = post(&client(), &url, &chat_body("a b c", osl), None)
        .await
        .unwrap();
    let mut per_chunk = Vec::new();
    while let Some(bytes) = resp.chunk().await.unwrap() {
        per_chunk.push(memchr::memmem::find_iter(&bytes, b"\n\n").count());
    }
    sim.shutdown().await;
    per_chunk
}

#[tokio::test]
async fn write_per_event_hands_every_event_to_the_connection_on_its_own() {
    // The role chunk, 16 tokens, the finish chunk, the usage chunk and `[DONE]`.
    let events = 1 + 16 + 3;
    // By default the role chunk shares its write with the first token (and a zero-delay engine's
    // waiting tokens share theirs).
    let shared = events_per_chunk(fast(), 16).await;
    assert_eq!(shared.iter().sum::<usize>(), events, "{shared:?}");
    assert!(shared.iter().any(|&n| n > 1), "{shared:?}");
    // One event per write, as vLLM's and Dynamo's frontends send them.
    let spec = SimSpec {
        write_per_event: true,
        ..fast()
    };
    let own = events_per_chunk(spec, 16).await;
    assert_eq!(own.iter().sum::<usize>(), events, "{own:?}");
    assert!(own.iter().all(|&n| n <= 1), "{own:?}");
}
