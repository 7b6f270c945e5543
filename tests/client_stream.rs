//! The streaming client against a real HTTP server on loopback: an in-test hyper server streams
//! tokens on a known schedule and records the instant it hands each token to the connection; the
//! client's TTFT/ITL must match those instants, usage and text must come through exactly, and every
//! error class must get its outcome and error latency.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use llm_canary::client::{
    ApiKey, ChatMessage, ClientConfig, Endpoint, Outcome, Prompt, RequestRecord, StreamClient,
    StreamRequest, WorkerId,
};
use llm_canary::config::{Api, Dialect};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

const FIRST_TOKEN: Duration = Duration::from_millis(50);
const TOKEN_GAP: Duration = Duration::from_millis(10);
const CACHED_TOKENS: u64 = 8;
const PROMPT_TOKENS: u64 = 32;

/// What the server saw and did, per `x-request-id`.
#[derive(Default)]
struct ServerLog {
    /// The instant each content token was handed to hyper for writing.
    token_sends: Mutex<HashMap<String, Vec<Instant>>>,
    requests: Mutex<HashMap<String, SeenRequest>>,
}

/// A request as it arrived.
struct SeenRequest {
    body: Value,
    authorization: Option<String>,
    path: String,
}

impl ServerLog {
    fn sends(&self, id: &str) -> Vec<Instant> {
        self.token_sends
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .unwrap_or_default()
    }
}

enum Out {
    /// A content token: its send instant is recorded.
    Token(Bytes),
    Other(Bytes),
}

/// A response body fed from a channel; stamps token frames at the moment hyper takes them to
/// write, the closest a server gets to "sent" without instrumenting the socket.
struct TimedBody {
    rx: mpsc::UnboundedReceiver<Out>,
    log: Arc<ServerLog>,
    id: String,
}

impl hyper::body::Body for TimedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Out::Token(bytes))) => {
                let now = Instant::now();
                let id = self.id.clone();
                self.log
                    .token_sends
                    .lock()
                    .unwrap()
                    .entry(id)
                    .or_default()
                    .push(now);
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Poll::Ready(Some(Out::Other(bytes))) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

async fn start_server() -> (SocketAddr, Arc<ServerLog>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(ServerLog::default());
    let server_log = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            stream.set_nodelay(true).unwrap();
            let log = server_log.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(req, log.clone()));
                // Connection errors (the client hanging up on a stall) end only that connection.
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, log)
}

fn sse(value: Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

fn chat_token(id: &str, text: &str, finish: bool) -> Value {
    let mut chunk = json!({
        "id": format!("chatcmpl-{id}"),
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}],
    });
    if finish {
        chunk["choices"][0]["finish_reason"] = json!("length");
        chunk["nvext"] = json!({
            "timing": {"ttft_ms": 50.0, "prefill_time_ms": 12.5, "kv_hit_rate": 0.25},
            "worker_id": {"prefill_worker_id": 1, "decode_worker_id": 2},
        });
    }
    chunk
}

fn completion_token(id: &str, text: &str, finish: bool) -> Value {
    json!({
        "id": format!("cmpl-{id}"),
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "finish_reason": if finish { json!("length") } else { Value::Null }}],
    })
}

fn usage_chunk(osl: u64) -> Value {
    json!({
        "id": "usage",
        "choices": [],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": osl,
            "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
        },
    })
}

/// An OpenAI-style error body.
fn error_body(code: u16, message: &str) -> Vec<Out> {
    let body = json!({"error": {"message": message, "code": code}}).to_string();
    vec![Out::Other(Bytes::from(body))]
}

async fn handle(
    req: Request<Incoming>,
    log: Arc<ServerLog>,
) -> Result<Response<TimedBody>, Infallible> {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("missing")
        .to_owned();
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let arrived = Instant::now();
    log.requests.lock().unwrap().insert(
        id.clone(),
        SeenRequest {
            body: body.clone(),
            authorization: auth,
            path: path.clone(),
        },
    );
    let scenario = body["model"].as_str().unwrap_or("").to_owned();
    let osl = body["max_tokens"].as_u64().unwrap_or(1);

    let (tx, rx) = mpsc::unbounded_channel();
    let (code, content_type) = match scenario.as_str() {
        "stream" | "stall" | "event_error" | "data_error" | "truncated" | "malformed"
        | "oversize" => (200, "text/event-stream"),
        "not_sse" => (200, "application/json"),
        "http_400" => (400, "application/json"),
        "http_429" => (429, "application/json"),
        "http_500" => (500, "application/json"),
        "http_503" => (503, "application/json"),
        _ => (404, "text/plain"),
    };
    let fixed = match scenario.as_str() {
        "not_sse" => Some(vec![Out::Other(Bytes::from_static(b"{\"id\":\"x\"}"))]),
        "http_400" => Some(error_body(400, "unknown field: min_tokens")),
        "http_429" => Some(error_body(429, "too many requests")),
        "http_500" => Some(error_body(500, "internal error")),
        "http_503" => Some(error_body(503, "no workers available")),
        "stream" | "stall" | "event_error" | "data_error" | "truncated" | "malformed"
        | "oversize" => None,
        _ => Some(vec![Out::Other(Bytes::from_static(b"unknown scenario"))]),
    };
    if let Some(frames) = fixed {
        for frame in frames {
            tx.send(frame).ok();
        }
    } else {
        let id = id.clone();
        let chat = path.ends_with("/chat/completions");
        tokio::spawn(async move {
            let token = |i: u64, finish: bool| {
                let text = format!("t{i} ");
                if chat {
                    sse(chat_token(&id, &text, finish))
                } else {
                    sse(completion_token(&id, &text, finish))
                }
            };
            if chat {
                // Chat streams open with a role-only delta, which is not a token.
                let role = json!({
                    "id": format!("chatcmpl-{id}"),
                    "choices": [{"index": 0, "delta": {"role": "assistant"}}],
                });
                tx.send(Out::Other(sse(role))).ok();
            }
            // Failure scenarios send a few tokens first, so their error latency is measurable.
            let tokens = if scenario == "stream" { osl } else { 3 };
            for i in 0..tokens {
                tokio::time::sleep_until(arrived + FIRST_TOKEN + TOKEN_GAP * i as u32).await;
                let last = scenario == "stream" && i + 1 == tokens;
                if tx.send(Out::Token(token(i, last))).is_err() {
                    return;
                }
            }
            tokio::time::sleep(TOKEN_GAP).await;
            let ending: Vec<Bytes> = match scenario.as_str() {
                "stream" => vec![
                    sse(usage_chunk(osl)),
                    Bytes::from_static(b"data: [DONE]\n\n"),
                ],
                "event_error" => vec![Bytes::from_static(b"event: error\n: worker 7 died\n\n")],
                "data_error" => vec![sse(json!({"error": {"message": "engine overloaded"}}))],
                "malformed" => vec![Bytes::from_static(b"data: {\"choices\": [oops\n\n")],
                "oversize" => {
                    let mut line = b"data: ".to_vec();
                    line.resize(200 * 1024, b'x');
                    line.extend_from_slice(b"\n\n");
                    vec![Bytes::from(line)]
                }
                "stall" => {
                    // Keep the response open until the client gives up and hangs up.
                    tx.closed().await;
                    return;
                }
                // "truncated": end the body without [DONE].
                _ => vec![],
            };
            for bytes in ending {
                tx.send(Out::Other(bytes)).ok();
            }
        });
    }
    let body = TimedBody { rx, log, id };
    let response = Response::builder()
        .status(code)
        .header("content-type", content_type)
        .body(body)
        .unwrap();
    Ok(response)
}

fn request(id: &str, osl: u32) -> StreamRequest {
    StreamRequest {
        request_id: id.to_owned(),
        // The completions API gets the id as its prompt, which the test checks on the wire.
        prompt: Prompt::Chat(vec![ChatMessage::user(id)]),
        osl,
    }
}

fn endpoint(addr: SocketAddr, api: Api, scenario: &str) -> Endpoint {
    Endpoint::new(&format!("http://{addr}"), api, scenario, Dialect::Dynamo).unwrap()
}

/// The value at quantile `q` of `values` (nearest rank).
fn quantile(values: &mut [Duration], q: f64) -> Duration {
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_and_itl_match_the_server_schedule_for_64_concurrent_streams() {
    const STREAMS: usize = 64;
    // Four rounds of 64, so that the p99 of TTFT errors is a quantile (the 3rd-largest of 256)
    // rather than the maximum of 64, which a single scheduler hiccup on a shared CI core sets.
    const ROUNDS: usize = 4;
    const OSL: u32 = 32;
    let (addr, log) = start_server().await;
    let client = StreamClient::new(ClientConfig::default()).unwrap();
    let key = ApiKey::new("test-key");
    let chat = endpoint(addr, Api::Chat, "stream")
        .with_api_key(&key)
        .unwrap();
    let completions = endpoint(addr, Api::Completions, "stream");

    let mut records: Vec<(usize, RequestRecord)> = Vec::new();
    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        for n in 0..STREAMS {
            let client = client.clone();
            // Every eighth stream uses the completions API.
            let target = if n % 8 == 7 {
                completions.clone()
            } else {
                chat.clone()
            };
            let req = request(&format!("req-{round}-{n}"), OSL);
            tasks.push(tokio::spawn(async move {
                let intended = Instant::now();
                client.send(&target, &req, intended).await
            }));
        }
        for (n, task) in tasks.into_iter().enumerate() {
            records.push((n, task.await.unwrap()));
        }
    }

    let mut ttft_errors = Vec::new();
    let mut itl_errors = Vec::new();
    let mut chunk_delays = Vec::new();
    for (n, rec) in &records {
        let n = *n;
        let id = rec.request_id.clone();
        assert!(
            id.starts_with("req-") && id.ends_with(&format!("-{n}")),
            "{id}"
        );
        assert_eq!(rec.outcome, Outcome::Ok, "{id}: {:?}", rec.error);
        assert_eq!(rec.http_status, Some(200));
        let sends = log.sends(&id);
        assert_eq!(sends.len(), OSL as usize, "{id}");
        assert_eq!(rec.content_chunk_count(), OSL as usize, "{id}");

        // Exact output: usage, the client's own count, and the reassembled text.
        let usage = rec.usage.unwrap();
        assert_eq!(usage.completion_tokens, u64::from(OSL));
        assert_eq!(usage.prompt_tokens, PROMPT_TOKENS);
        assert_eq!(usage.cached_tokens, CACHED_TOKENS);
        assert_eq!(rec.output_tokens(), u64::from(OSL));
        assert_eq!(rec.token_count_disagreement(), Some(0));
        assert!(!rec.osl_mismatch(OSL));
        let expected: String = (0..OSL).map(|i| format!("t{i} ")).collect();
        assert_eq!(rec.reply, expected, "{id}");
        assert_eq!(rec.finish_reason.as_deref(), Some("length"));
        assert!(rec.done.is_some() && rec.usage_at.is_some());
        let is_chat = n % 8 != 7;
        let prefix = if is_chat { "chatcmpl-" } else { "cmpl-" };
        assert_eq!(
            rec.response_id.as_deref(),
            Some(format!("{prefix}{id}").as_str())
        );
        if is_chat {
            assert_eq!(
                rec.server_timing.as_ref().unwrap().prefill_time_ms,
                Some(12.5)
            );
            assert!(matches!(
                rec.worker_id,
                Some(WorkerId::Split {
                    decode_worker_id: Some(2),
                    ..
                })
            ));
        }

        // Every client stamp follows the server's send of the same token (µs rounding aside).
        for ((at, tokens), sent) in rec.content_chunks().zip(&sends) {
            assert_eq!(tokens, 1);
            assert!(
                at + Duration::from_micros(1) >= *sent,
                "{id}: stamp before send"
            );
            chunk_delays.push(at.saturating_duration_since(*sent));
        }
        let server_ttft = sends[0] - rec.intended;
        let server_itl = (sends[sends.len() - 1] - sends[0]) / (OSL - 1);
        ttft_errors.push(rec.ttft().unwrap().abs_diff(server_ttft));
        itl_errors.push(rec.itl().unwrap().abs_diff(server_itl));
        // The schedule really was 50 ms + 10 ms per token.
        assert!(server_ttft >= FIRST_TOKEN, "{id}: {server_ttft:?}");
        assert!(rec.latency() >= FIRST_TOKEN + TOKEN_GAP * (OSL - 1));
    }

    let ttft_p50 = quantile(&mut ttft_errors, 0.5);
    let ttft_p99 = quantile(&mut ttft_errors, 0.99);
    let itl_p50 = quantile(&mut itl_errors, 0.5);
    let itl_p99 = quantile(&mut itl_errors, 0.99);
    let chunk_p50 = quantile(&mut chunk_delays, 0.5);
    let chunk_p99 = quantile(&mut chunk_delays, 0.99);
    let chunk_max = *chunk_delays.last().unwrap();
    println!(
        "{ROUNDS} rounds of {STREAMS} streams x {OSL} tokens: |TTFT error| p50 {ttft_p50:?} p99 {ttft_p99:?}; \
         |ITL error| p50 {itl_p50:?} p99 {itl_p99:?}; \
         server-send -> client-stamp per chunk p50 {chunk_p50:?} p99 {chunk_p99:?} max {chunk_max:?}"
    );
    // Bounds a stamp taken anywhere but at the read that carried the bytes would break (a stamp
    // after the stream, or after a hop through another task, is off by several token gaps of
    // 10 ms), and that a healthy run on a busy 2-core machine, debug build, server in the same
    // process, still meets: scheduler hiccups move single requests by milliseconds, so the
    // median carries the tight bound and the p99 a loose one. How accurate the client is, is a
    // figure of the release benchmark (`cargo bench --bench client -- accuracy`, goal: TTFT
    // error p99 <= 2 ms), not of this test.
    assert!(
        ttft_p50 <= Duration::from_millis(5) && ttft_p99 <= Duration::from_millis(50),
        "TTFT error p50 {ttft_p50:?} p99 {ttft_p99:?}"
    );
    assert!(
        itl_p50 <= Duration::from_millis(5) && itl_p99 <= Duration::from_millis(50),
        "ITL error p50 {itl_p50:?} p99 {itl_p99:?}"
    );

    // The wire format the server received.
    let requests = log.requests.lock().unwrap();
    let chat_request = requests.get("req-0-0").unwrap();
    let body = &chat_request.body;
    assert_eq!(chat_request.path, "/v1/chat/completions");
    assert_eq!(
        chat_request.authorization.as_deref(),
        Some("Bearer test-key")
    );
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    for field in ["max_tokens", "max_completion_tokens", "min_tokens"] {
        assert_eq!(body[field], OSL, "{field}");
    }
    assert_eq!(body["ignore_eos"], true);
    assert_eq!(
        body["nvext"]["extra_fields"],
        json!(["timing", "worker_id"])
    );
    assert!(body.get("stop").is_none());
    let completion_request = requests.get("req-0-7").unwrap();
    assert_eq!(completion_request.path, "/v1/completions");
    assert_eq!(completion_request.authorization, None);
    assert_eq!(completion_request.body["prompt"], "req-0-7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_class_gets_its_outcome_and_error_latency() {
    let (addr, _log) = start_server().await;
    // A port that was just free: nothing listens there.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let timeout = Duration::from_millis(300);
    let client = StreamClient::new(ClientConfig {
        request_timeout: timeout,
        max_event_bytes: 64 * 1024,
        ..ClientConfig::default()
    })
    .unwrap();

    let tokens_sent = FIRST_TOKEN + TOKEN_GAP * 2;
    let case = |scenario, target, outcome, status, needle, min_latency| ErrorCase {
        scenario,
        target,
        outcome,
        status,
        needle,
        min_latency,
    };
    let zero = Duration::ZERO;
    let cases = vec![
        case("stream", closed, Outcome::Connect, None, "refused", zero),
        case("stall", addr, Outcome::Timeout, Some(200), "300ms", timeout),
        case(
            "http_400",
            addr,
            Outcome::Http4xx,
            Some(400),
            "unknown field: min_tokens",
            zero,
        ),
        case(
            "http_429",
            addr,
            Outcome::Http429,
            Some(429),
            "too many requests",
            zero,
        ),
        case(
            "http_500",
            addr,
            Outcome::Http5xx,
            Some(500),
            "internal error",
            zero,
        ),
        case(
            "http_503",
            addr,
            Outcome::Http5xx,
            Some(503),
            "no workers available",
            zero,
        ),
        case(
            "event_error",
            addr,
            Outcome::StreamError,
            Some(200),
            "worker 7 died",
            tokens_sent,
        ),
        case(
            "data_error",
            addr,
            Outcome::StreamError,
            Some(200),
            "engine overloaded",
            tokens_sent,
        ),
        case(
            "truncated",
            addr,
            Outcome::StreamTruncated,
            Some(200),
            "[DONE]",
            tokens_sent,
        ),
        case(
            "malformed",
            addr,
            Outcome::BadResponse,
            Some(200),
            "unparseable",
            tokens_sent,
        ),
        case(
            "oversize",
            addr,
            Outcome::BadResponse,
            Some(200),
            "longer than",
            tokens_sent,
        ),
        case(
            "not_sse",
            addr,
            Outcome::BadResponse,
            Some(200),
            "application/json",
            zero,
        ),
    ];
    let started = Instant::now();
    let mut tasks = Vec::new();
    for case in &cases {
        let client = client.clone();
        let target = endpoint(case.target, Api::Chat, case.scenario);
        let req = request(&format!("err-{}", case.scenario), 16);
        tasks.push(tokio::spawn(async move {
            client.send(&target, &req, Instant::now()).await
        }));
    }
    for (task, case) in tasks.into_iter().zip(cases) {
        let rec = task.await.unwrap();
        let scenario = case.scenario;
        let error = rec.error.clone().unwrap_or_default();
        println!(
            "{scenario:>12}: {:<16} error latency {:?} ({error})",
            rec.outcome.as_str(),
            rec.error_latency()
        );
        assert_eq!(rec.outcome, case.outcome, "{scenario}: {error}");
        assert_eq!(rec.http_status, case.status, "{scenario}");
        assert!(
            error.contains(case.needle),
            "{scenario}: {error:?} lacks {:?}",
            case.needle
        );
        let latency = rec.error_latency().unwrap();
        assert_eq!(latency, rec.latency());
        assert!(
            latency >= case.min_latency,
            "{scenario}: {latency:?} < {:?}",
            case.min_latency
        );
        assert!(latency < Duration::from_secs(2), "{scenario}: {latency:?}");
        assert!(!rec.osl_mismatch(16));
        if case.min_latency >= tokens_sent {
            // What arrived before the failure is kept.
            assert_eq!(rec.content_chunk_count(), 3, "{scenario}");
            assert_eq!(rec.reply, "t0 t1 t2 ", "{scenario}");
            assert!(rec.ttft().unwrap() >= FIRST_TOKEN, "{scenario}");
        }
    }
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// One error scenario and what the client must make of it.
struct ErrorCase {
    /// The model name, which the server reads as its scenario.
    scenario: &'static str,
    target: SocketAddr,
    outcome: Outcome,
    status: Option<u16>,
    /// Text the stored error message must contain.
    needle: &'static str,
    /// The least error latency possible given what the server sends first.
    min_latency: Duration,
}
