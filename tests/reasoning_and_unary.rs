//! A reasoning model's stream and a non-streaming request, against the embedded simulator: the
//! reasoning and answer tokens counted apart with the time to the first token of each kind
//! (docs/METRICS.md, "Reasoning"), and `request.stream: false` read as one JSON answer whose
//! TTFT is its latency, without ITL, its tokens from usage, and a broken answer a failure of
//! its kind. The bench carries both to `requests.jsonl` and the step results.

mod support;

use llm_canary::client::{
    ClientConfig, Endpoint, Outcome, Prompt, RequestRecord, StreamClient, StreamRequest,
};
use llm_canary::config::{Api, Dialect, ServingMode};
use llm_canary::sim::SimSpec;
use serde_json::Value;
use tokio::time::Instant;

fn spec(yaml: &str) -> SimSpec {
    serde_saphyr::from_str(yaml).unwrap()
}

/// One request of `osl` tokens to a simulator of `spec`, streamed or not.
async fn one(spec: SimSpec, osl: u32, stream: bool) -> RequestRecord {
    let sim = support::sim::start_sim(spec, ServingMode::Aggregated).await;
    let client = StreamClient::new(ClientConfig::default()).unwrap();
    // Dynamo's dialect asks for the exact length (`ignore_eos`), so the counts are exact.
    let endpoint = Endpoint::new(&sim.base_url(), Api::Chat, "m", Dialect::Dynamo).unwrap();
    let req = StreamRequest {
        request_id: "r-1".into(),
        prompt: Prompt::Text(support::sim::words(32, "p")),
        osl,
    };
    let never = std::future::pending();
    let rec = client
        .send_cancelling(&endpoint, &req, Instant::now(), never, None, stream)
        .await;
    sim.shutdown().await;
    rec
}

#[tokio::test]
async fn a_reasoning_stream_is_measured_apart() {
    let rec = one(
        // Tokens 20 ms apart: the first answer token comes 120 ms after the first reasoning one,
        // in a read of its own even on a busy machine.
        spec("{ profile: fixed, fixed_ttft: 20ms, fixed_itl: 20ms, reasoning_tokens: 6 }"),
        16,
        true,
    )
    .await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
    assert!(rec.had_reasoning());
    assert_eq!((rec.reasoning_tokens(), rec.answer_tokens()), (6, 10));
    assert_eq!(rec.output_tokens(), 16);
    let first_reasoning = rec.time_to_first_reasoning_token().unwrap();
    let first_answer = rec.time_to_first_answer_token().unwrap();
    assert!(
        first_answer > first_reasoning,
        "{first_answer:?} vs {first_reasoning:?}"
    );
    assert_eq!(rec.reasoning_time(), Some(first_answer - first_reasoning));
    // TTFT stays the first token of either kind.
    assert_eq!(rec.ttft(), Some(first_reasoning));
    // The reply sent back in a conversation is the answer alone.
    assert_eq!(rec.reply.split_whitespace().count(), 10, "{}", rec.reply);

    // Without reasoning (the default) nothing is measured apart.
    let plain = one(spec("{ profile: fast }"), 16, true).await;
    assert_eq!(plain.outcome, Outcome::Ok, "{:?}", plain.error);
    assert!(!plain.had_reasoning());
    assert_eq!((plain.reasoning_tokens(), plain.answer_tokens()), (0, 16));
    assert_eq!(plain.time_to_first_reasoning_token(), None);
}

#[tokio::test]
async fn a_non_streaming_request_is_its_own_first_token() {
    let rec = one(
        spec("{ profile: fixed, fixed_ttft: 20ms, fixed_itl: 2ms }"),
        12,
        false,
    )
    .await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
    assert!(!rec.streamed);
    assert_eq!(rec.ttft(), Some(rec.latency()));
    assert_eq!(rec.itl(), None);
    assert_eq!(rec.token_gaps().count(), 0);
    assert_eq!(rec.output_tokens(), 12, "from usage.completion_tokens");
    assert_eq!(rec.usage.map(|u| u.completion_tokens), Some(12));
    assert_eq!(rec.reply.split_whitespace().count(), 12);
    assert!(rec.response_id.is_some());
}

#[tokio::test]
async fn a_broken_non_streaming_answer_is_a_failure_of_its_kind() {
    for (faults, outcome) in [
        // Half the JSON body, with a Content-Length that says so.
        (
            "{ malformed_chunk: { after_tokens: 4 } }",
            Outcome::BadResponse,
        ),
        // Half the body of the length announced, then the connection drops.
        (
            "{ truncate: { after_tokens: 4 } }",
            Outcome::StreamTruncated,
        ),
        ("{ error_event: { after_tokens: 4 } }", Outcome::Http5xx),
    ] {
        let rec = one(
            spec(&format!("{{ profile: fast, faults: {faults} }}")),
            8,
            false,
        )
        .await;
        assert_eq!(rec.outcome, outcome, "{faults}: {:?}", rec.error);
        assert!(rec.error.is_some(), "{faults}");
    }
}

#[test]
fn the_bench_carries_both_to_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bench.yaml");
    std::fs::write(
        &config,
        r#"
targets:
  - name: thinking
    serving_mode: aggregated
    simulated: { profile: fixed, fixed_ttft: 5ms, fixed_itl: 10ms, reasoning_tokens: 4 }
  - { name: unary, serving_mode: aggregated, simulated: { profile: fast }, request: { stream: false } }
time_scale: 0.02
workloads:
  concurrency_sweep: { levels: [2], isl: 64, osl: 12, step: 60s, warmup: 10s }
schedule: { drain_grace: 5s }
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let output = support::bench::bench(&config, &out, &["--format", "json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let lines = std::fs::read_to_string(out.join("requests.jsonl")).unwrap();
    let (mut thinking, mut unary) = (0, 0);
    for line in lines.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        if r["outcome"] != "ok" {
            continue;
        }
        if r["target"] == "thinking" {
            thinking += 1;
            assert_eq!(r["stream"], true, "{line}");
            assert_eq!(r["reasoning_tokens"], 4, "{line}");
            assert_eq!(r["answer_tokens"], 8, "{line}");
            let first = r["time_to_first_reasoning_token_ms"].as_f64().unwrap();
            let answer = r["time_to_first_answer_token_ms"].as_f64().unwrap();
            // Later, or in the same read when a busy machine read both at once.
            assert!(answer >= first, "{line}");
            assert_eq!(r["ttft_ms"].as_f64(), Some(first), "{line}");
        } else {
            unary += 1;
            assert_eq!(r["stream"], false, "{line}");
            assert!(r["itl_ms"].is_null(), "{line}");
            assert_eq!(r["ttft_ms"], r["latency_ms"], "{line}");
            assert_eq!(r["completion_tokens"], 12, "{line}");
            assert!(r["reasoning_tokens"].is_null(), "{line}");
        }
    }
    assert!(
        thinking > 0 && unary > 0,
        "{thinking} and {unary} ok requests"
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    for step in summary["steps"].as_array().unwrap() {
        let reasoning = &step["reasoning"];
        if step["target"] == "thinking" {
            assert_eq!(
                reasoning["reasoning_tokens"],
                4 * reasoning["requests"].as_u64().unwrap()
            );
            let p50 = |measure: &str| reasoning[measure]["p50"].as_f64().unwrap();
            assert!(
                p50("time_to_first_answer_token") > p50("time_to_first_reasoning_token"),
                "{step}"
            );
            assert!(p50("reasoning_time") > 0.0, "{step}");
        } else {
            assert!(reasoning.is_null(), "no reasoning columns: {step}");
            assert!(step["itl"].is_null(), "no ITL without a stream: {step}");
        }
    }
    let tables = summary["tables"].as_array().unwrap();
    let table = tables
        .iter()
        .find(|t| t["id"] == "reasoning")
        .expect("a reasoning table");
    let rows = table["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "the reasoning target's step only: {table}");
    assert_eq!(rows[0][3], 4.0, "{table}");
}

/// A server that answers a non-streaming request with `reply`.
async fn unary_from(reply: support::RawReply) -> RequestRecord {
    let reply = std::sync::Mutex::new(Some(reply));
    let (addr, _) = support::raw_server(move |_| reply.lock().unwrap().take().unwrap()).await;
    let client = StreamClient::new(ClientConfig::default()).unwrap();
    let endpoint = Endpoint::new(&format!("http://{addr}"), Api::Chat, "m", Dialect::Vllm).unwrap();
    let req = StreamRequest {
        request_id: "r-1".into(),
        prompt: Prompt::Text("hi".into()),
        osl: 4,
    };
    let never = std::future::pending();
    client
        .send_cancelling(&endpoint, &req, Instant::now(), never, None, false)
        .await
}

#[tokio::test]
async fn a_non_streaming_body_is_bounded_and_must_be_an_answer() {
    // Endless: cut at the bound a stream has (OSL 4: 1 MiB and 16 KiB), never read to the end.
    let rec = unary_from(support::RawReply::Endless {
        head: b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n[".to_vec(),
        chunk: vec![b' '; 64 << 10],
    })
    .await;
    assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
    assert!(
        rec.error.as_deref().unwrap().contains("over"),
        "{:?}",
        rec.error
    );
    // A server that streams anyway: not the JSON answer asked for.
    let rec = unary_from(support::RawReply::Bytes(support::sse_ok("m", 3))).await;
    assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
    assert!(
        rec.error.as_deref().unwrap().contains("unparseable"),
        "{:?}",
        rec.error
    );
}
