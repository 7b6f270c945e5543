//! The simulator's HTTP server (hyper 1, HTTP/1.1, TCP_NODELAY): OpenAI chat and completions,
//! streaming as SSE with one chunk per token, `/v1/models`, `/health`, `/metrics`, and the
//! injected faults on the wire.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::cluster::{GenerateRequest, RequestStream};
use super::engine::StreamEvent;
use super::faults::FaultPlan;
use super::metrics::{self, RequestOutcome};
use super::request::{CompletionBody, log_request, prompt_tokens, unknown_field};
use super::sse::{ChunkFormat, PerEvent, SimBody, SseBody, SseState, nvext_json, usage_json};
use super::state::{Endpoint, RequestTracker, ServerState};
use super::text;
use crate::client::arrival::{FirstArrival, StampedTcp};
use crate::config::sim::RefuseMode;

/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 32 << 20;
/// `max_tokens` when the request names none.
const DEFAULT_MAX_TOKENS: u32 = 256;
/// How long shutdown waits for open responses.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// The accept queue the simulator's listener asks for (the kernel caps it at
/// `net.core.somaxconn`). A client opens connections in ramps whose handshakes complete in the
/// kernel, not in the accept loop, so several ramps can queue up: a short queue (the 128 that
/// std's and tokio's `bind` ask for) overflows at 1024 connections and drops SYNs, each a
/// second's retransmission for the client.
const ACCEPT_BACKLOG: u32 = 4096;

/// Binds `addr` for the simulator with an accept queue of [`ACCEPT_BACKLOG`].
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std's bind does on Unix: a restarted simulator takes its port back at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

/// The accept loop: serves connections until `cancel`, honouring the connection-refusing faults,
/// then drains open connections for at most [`DRAIN_LIMIT`].
pub async fn serve(
    listener: TcpListener,
    addr: SocketAddr,
    state: Arc<ServerState>,
    cancel: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let mut faults = state.faults.clone();
    let mut listener = Some(listener);
    // The open connections' stop: a server that goes away closes its keep-alive connections
    // too, or pooled clients would never notice.
    let mut connections = cancel.child_token();
    let mut was_black_hole = false;
    loop {
        let refuse = faults.borrow_and_update().refuse_connections;
        let black_hole = refuse == Some(RefuseMode::BlackHole);
        if black_hole && !was_black_hole {
            // Open keep-alive connections close too, so every later request meets the hole.
            connections.cancel();
            connections = cancel.child_token();
        }
        was_black_hole = black_hole;
        if refuse == Some(RefuseMode::StopAccepting) {
            // Closing the socket makes connects fail with "connection refused"; open
            // connections finish their response and close.
            listener = None;
            connections.cancel();
            connections = cancel.child_token();
            tokio::select! {
                changed = faults.changed() => if changed.is_err() { break },
                _ = cancel.cancelled() => break,
            }
            continue;
        }
        let Some(l) = listener.as_ref() else {
            match bind(addr) {
                Ok(l) => listener = Some(l),
                Err(e) => {
                    tracing::warn!(%addr, error = %e, "simulator cannot re-open its port, retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = cancel.cancelled() => break,
                    }
                }
            }
            continue;
        };
        tokio::select! {
            accepted = l.accept() => match accepted {
                Ok((stream, _)) => {
                    if refuse == Some(RefuseMode::CloseImmediately) {
                        drop(stream);
                        continue;
                    }
                    if refuse == Some(RefuseMode::BlackHole) {
                        // Held open, unread, until the simulator stops.
                        let hold = connections.clone();
                        tracker.spawn(async move {
                            let _held = stream;
                            hold.cancelled().await;
                        });
                        continue;
                    }
                    // Per-token chunks must leave at once, not wait for Nagle.
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "TCP_NODELAY failed");
                    }
                    let state = Arc::clone(&state);
                    if state.record_send_times {
                        let (io, arrivals) = StampedTcp::new(stream).sharing_first_arrival();
                        tracker.spawn(serve_connection(io, Some(arrivals), state, connections.clone()));
                    } else {
                        tracker.spawn(serve_connection(stream, None, state, connections.clone()));
                    }
                }
                Err(e) => {
                    // Typically EMFILE: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "simulator accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            changed = faults.changed() => if changed.is_err() { break },
            _ = cancel.cancelled() => break,
        }
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(DRAIN_LIMIT, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            open = tracker.len(),
            "simulator shutdown: connections still open after the drain limit"
        );
    }
}

/// Serves one connection; `arrivals`, when the send instants are recorded, says when each
/// request's bytes came.
async fn serve_connection<I>(
    io: I,
    arrivals: Option<Arc<FirstArrival>>,
    state: Arc<ServerState>,
    cancel: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let state = Arc::clone(&state);
        let arrivals = arrivals.clone();
        async move { Ok::<_, Infallible>(handle(state, req, arrivals).await) }
    });
    let conn = http1::Builder::new().serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        // Client resets and injected aborts end here; neither is the server's failure.
        tracing::debug!(error = %e, "simulator connection ended with an error");
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<SimBody> {
    let mut resp = Response::new(SimBody::full(value.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error_response(status: StatusCode, message: &str) -> Response<SimBody> {
    let kind = match status.as_u16() {
        429 => "rate_limit_exceeded",
        400..=499 => "invalid_request_error",
        _ => "internal_server_error",
    };
    json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "code": status.as_u16()}}),
    )
}

async fn handle(
    state: Arc<ServerState>,
    req: Request<Incoming>,
    arrivals: Option<Arc<FirstArrival>>,
) -> Response<SimBody> {
    // Taken for every request, so a completion after a GET on the same connection never takes
    // the GET's arrival.
    let arrived = arrivals.as_ref().and_then(|a| a.take());
    let came = Came { arrived, arrivals };
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => {
            completion(state, req, Endpoint::Chat, came).await
        }
        (&Method::POST, "/v1/completions") => {
            completion(state, req, Endpoint::Completions, came).await
        }
        (&Method::GET, "/v1/models") => {
            let mut model = json!({
                "id": state.model, "object": "model", "created": state.created, "owned_by": "llm-canary-sim"
            });
            if let Some(len) = state.max_model_len {
                model["max_model_len"] = json!(len);
            }
            json_response(StatusCode::OK, &json!({"object": "list", "data": [model]}))
        }
        (&Method::GET, "/health") => {
            let instances: Vec<Value> = state
                .cluster
                .snapshots()
                .iter()
                .map(|w| {
                    json!({
                        "component": if w.role == super::WorkerRole::Prefill { "prefill" } else { "backend" },
                        "endpoint": "generate",
                        "namespace": "dynamo",
                        "instance_id": w.worker_id,
                    })
                })
                .collect();
            json_response(
                StatusCode::OK,
                &json!({"status": "healthy", "serving_mode": state.mode.as_str(), "endpoints": ["/v1/chat/completions", "/v1/completions", "/v1/models"], "instances": instances}),
            )
        }
        (&Method::GET, "/metrics") => {
            let mut resp = Response::new(SimBody::full(metrics::render(
                &state.model,
                &state.frontend,
                &state.cluster,
            )));
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        (_, path) => error_response(StatusCode::NOT_FOUND, &format!("no route for {path}")),
    }
}

/// When a request's first bytes came to this host (the kernel's stamp), and where its body's
/// reads leave theirs, to be forgotten once the body is read.
struct Came {
    arrived: Option<Instant>,
    arrivals: Option<Arc<FirstArrival>>,
}

async fn completion(
    state: Arc<ServerState>,
    req: Request<Incoming>,
    endpoint: Endpoint,
    came: Came,
) -> Response<SimBody> {
    let received = Instant::now();
    let headers = state.request_log.as_ref().map(|_| req.headers().clone());
    let header_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let faults = Arc::clone(&state.faults.borrow());
    let plan = if faults.is_empty() {
        FaultPlan::default()
    } else {
        FaultPlan::sample(&faults, || state.cluster.random_unit())
    };
    let (bytes, body) = match read_body(req.into_body(), &plan).await {
        Ok(read) => read,
        Err(e) => return reject(&state, endpoint, "unknown", &e.to_string()),
    };
    if let Some(arrivals) = &came.arrivals {
        arrivals.take();
    }
    if let Some(headers) = &headers {
        log_request(&state, endpoint, headers, &bytes);
    }
    let request_type = if body.stream { "stream" } else { "unary" };
    if let Some(refused) = refusal(&state, endpoint, &bytes, request_type, &plan) {
        return refused;
    }
    let prompt = match prompt_tokens(&state, &body, endpoint) {
        Ok(p) => p,
        Err(message) => return reject(&state, endpoint, request_type, &message),
    };
    let request = generate_request(&body, prompt);
    if let Some(len) = state.max_model_len {
        let asked = request.prompt.len() as u64 + u64::from(request.max_tokens);
        if asked > u64::from(len) {
            let message = format!(
                "This model's maximum context length is {len} tokens. However, you requested {asked} tokens ({} in the messages, {} in the completion).",
                request.prompt.len(),
                request.max_tokens
            );
            return reject(&state, endpoint, request_type, &message);
        }
    }
    let mut stream = state.cluster.submit(request);
    if let Some(StreamEvent::Rejected(message)) = stream.try_next() {
        return reject(&state, endpoint, request_type, &message);
    }
    state.frontend.request_started();
    let id = match endpoint {
        Endpoint::Chat => format!("chatcmpl-{}", stream.id),
        Endpoint::Completions => format!("cmpl-{}", stream.id),
    };
    let log_key = header_id.clone().unwrap_or_else(|| id.clone());
    let model = body.model.as_deref().unwrap_or(&state.model);
    let format = ChunkFormat::new(endpoint, &id, state.created, model, state.reasoning_tokens);
    let outcome = RequestOutcome {
        endpoint: endpoint.as_str(),
        request_type,
        success: false,
    };
    let mut tracker = request_tracker(&state, outcome, (came.arrived, received), log_key);
    let (want_timing, want_worker) = nvext_wants(&body);
    let mut resp = if body.stream {
        let sse = SseBody {
            stream,
            format,
            tracker,
            plan,
            include_usage: body.stream_options.is_some_and(|o| o.include_usage),
            want_timing,
            want_worker,
            stall: None,
            state: SseState::Streaming,
            per_event: state.write_per_event.then(PerEvent::default),
        };
        sse_response(sse)
    } else {
        unary(
            &mut stream,
            &mut tracker,
            &plan,
            &format,
            want_timing,
            want_worker,
        )
        .await
    };
    if let Some(id) = header_id.and_then(|v| HeaderValue::from_str(&v).ok()) {
        resp.headers_mut().insert("x-request-id", id);
    }
    resp
}

/// The bookkeeping of a request that came to the host at `arrived` (when the send instants are
/// recorded) and was read at `received`, queued until its first token.
fn request_tracker(
    state: &Arc<ServerState>,
    outcome: RequestOutcome,
    (arrived, received): (Option<Instant>, Instant),
    log_key: String,
) -> RequestTracker {
    RequestTracker {
        state: Arc::clone(state),
        outcome,
        arrived,
        received,
        first_token: None,
        last_token: None,
        tokens: 0,
        queued: true,
        finished: false,
        send_times: state.record_send_times.then(Vec::new),
        log_key,
    }
}

/// Why a completion's body is refused before the request reaches the engine.
#[derive(Debug, thiserror::Error)]
enum BodyRefused {
    #[error("cannot read body: {0}")]
    Unreadable(Box<dyn std::error::Error + Send + Sync>),
    #[error("invalid JSON body: {0}")]
    Json(serde_json::Error),
}

/// Reads a completion's body (at most [`MAX_BODY_BYTES`]) and parses it; an injected slow first
/// byte is waited out in between.
async fn read_body(
    body: Incoming,
    plan: &FaultPlan,
) -> Result<(Bytes, CompletionBody), BodyRefused> {
    let bytes = http_body_util::Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(BodyRefused::Unreadable)?
        .to_bytes();
    if let Some(delay) = plan.slow_first_byte {
        tokio::time::sleep(delay).await;
    }
    let body = serde_json::from_slice(&bytes).map_err(BodyRefused::Json)?;
    Ok((bytes, body))
}

/// A request refused before it reached the engine: counted, and answered 400 with `message`.
fn reject(
    state: &ServerState,
    endpoint: Endpoint,
    request_type: &'static str,
    message: &str,
) -> Response<SimBody> {
    state
        .frontend
        .request_rejected(endpoint.as_str(), request_type);
    error_response(StatusCode::BAD_REQUEST, message)
}

/// The answer to a request the simulator refuses as it is: a field OpenAI's API does not define
/// (under `reject_unknown_fields`), or an injected error status.
fn refusal(
    state: &ServerState,
    endpoint: Endpoint,
    bytes: &[u8],
    request_type: &'static str,
    plan: &FaultPlan,
) -> Option<Response<SimBody>> {
    if state.reject_unknown_fields
        && let Some(field) = unknown_field(bytes)
    {
        // OpenAI's own wording, which clients (and this one) recognise.
        return Some(reject(
            state,
            endpoint,
            "unknown",
            &format!("Unrecognized request argument supplied: {field}"),
        ));
    }
    let status = plan.error_status?;
    state
        .frontend
        .request_rejected(endpoint.as_str(), request_type);
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = error_response(status, &format!("simulated error {}", status.as_u16()));
    if status == StatusCode::TOO_MANY_REQUESTS {
        resp.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
    }
    Some(resp)
}

/// What the engine is asked to generate for `body`: its length limits and whether EOS counts.
fn generate_request(body: &CompletionBody, prompt: Vec<u32>) -> GenerateRequest {
    let max_tokens = body
        .max_completion_tokens
        .or(body.max_tokens)
        .unwrap_or(DEFAULT_MAX_TOKENS)
        .max(1);
    let ignore_eos = body.ignore_eos
        || body
            .nvext
            .as_ref()
            .and_then(|n| n.ignore_eos)
            .unwrap_or(false);
    GenerateRequest {
        prompt,
        max_tokens,
        min_tokens: body.min_tokens.unwrap_or(0).min(max_tokens),
        ignore_eos,
    }
}

/// Whether `body` asks for `nvext.timing` and for `nvext.worker_id`.
fn nvext_wants(body: &CompletionBody) -> (bool, bool) {
    let extra = body
        .nvext
        .as_ref()
        .map(|n| n.extra_fields.as_slice())
        .unwrap_or(&[]);
    let want_timing = extra.iter().any(|f| f == "timing");
    let want_worker = extra.iter().any(|f| f == "worker_id");
    (want_timing, want_worker)
}

/// A streaming answer: `sse` as the body of an event stream.
fn sse_response(sse: SseBody) -> Response<SimBody> {
    let mut resp = Response::new(SimBody::Sse(Box::new(sse)));
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    resp
}

/// A non-streaming answer: waits for every token, then one JSON body.
async fn unary(
    stream: &mut RequestStream,
    tracker: &mut RequestTracker,
    plan: &FaultPlan,
    format: &ChunkFormat,
    want_timing: bool,
    want_worker: bool,
) -> Response<SimBody> {
    let (mut content, mut reasoning) = (String::new(), String::new());
    let completion = loop {
        match stream.next().await {
            Some(StreamEvent::Token { .. }) => {
                let part = if tracker.tokens < format.reasoning_tokens {
                    &mut reasoning
                } else {
                    &mut content
                };
                part.push(' ');
                part.push_str(text::output_word(stream.word_offset, tracker.tokens));
                tracker.token(Instant::now());
                if plan.stall.is_some_and(|(after, _)| after == tracker.tokens)
                    && let Some((_, d)) = plan.stall
                {
                    tokio::time::sleep(d).await;
                }
            }
            Some(StreamEvent::Done(c)) => break c,
            Some(StreamEvent::Rejected(m)) => return error_response(StatusCode::BAD_REQUEST, &m),
            None => {
                return error_response(StatusCode::SERVICE_UNAVAILABLE, "simulator shutting down");
            }
        }
    };
    if plan.error_event.is_some() {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "simulated engine failure",
        );
    }
    let (object, choice) = match format.endpoint {
        Endpoint::Chat => (
            "chat.completion",
            json!({"index": 0, "message": message(content, reasoning), "finish_reason": completion.finish_reason.as_str()}),
        ),
        Endpoint::Completions => (
            "text_completion",
            json!({"index": 0, "text": content, "logprobs": null, "finish_reason": completion.finish_reason.as_str()}),
        ),
    };
    let mut value = json!({
        "id": format.id, "object": object, "created": format.created, "model": format.model,
        "choices": [choice], "usage": usage_json(&completion),
    });
    if let Some(nvext) = nvext_json(&completion, want_timing, want_worker) {
        value["nvext"] = nvext;
    }
    tracker.finish(true, Some(&completion));
    let text = value.to_string();
    let mut resp = json_response(StatusCode::OK, &Value::Null);
    *resp.body_mut() = if plan.malformed_after.is_some() {
        SimBody::full(text[..text.len() / 2].to_string())
    } else if plan.truncate.is_some() {
        // Half the body, then the connection drops: a Content-Length the client never receives.
        SimBody::Truncated(
            Some(Bytes::from(text[..text.len() / 2].to_string())),
            text.len() as u64,
        )
    } else {
        SimBody::full(text)
    };
    resp
}

/// A unary chat answer's message: vLLM's shape, with `reasoning_content` where it reasoned.
fn message(content: String, reasoning: String) -> Value {
    let mut message = json!({"role": "assistant", "content": content});
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handshakes complete in the kernel before the accept loop runs: 300 connections to a
    /// listener nobody accepts on all complete at once, where a queue of 128 would drop the
    /// SYNs past it (each then retried after a second).
    #[tokio::test]
    async fn the_accept_queue_takes_a_ramp_of_connections_nobody_accepted_yet() {
        // The kernel caps the queue at net.core.somaxconn (4096 since Linux 5.4).
        let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(4096);
        let n = cap.min(300);
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let connects = (0..n).map(|_| async move {
            tokio::time::timeout(
                Duration::from_millis(900),
                tokio::net::TcpStream::connect(addr),
            )
            .await
        });
        let done = futures_util::future::join_all(connects).await;
        let open = done.iter().filter(|c| matches!(c, Ok(Ok(_)))).count();
        assert_eq!(open, n);
        drop(listener);
    }
}
