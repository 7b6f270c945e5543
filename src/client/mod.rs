//! The OpenAI-compatible streaming measurement client: sends one streamed completion to a target
//! and returns its [`RequestRecord`] (docs/DESIGN.md §4). Server misbehaviour never surfaces as an `Err`:
//! every failure becomes an [`Outcome`] with its error latency.
//!
//! One connection pool of the client's own HTTP/1.1 transport ([`transport`], TCP or TLS,
//! `TCP_NODELAY`) serves every request. Each network read is stamped with the arrival of its
//! bytes, the kernel's receive time of the newest segment it took ([`arrival`]; where the kernel
//! gives none, the moment the read returns), before anything parses it; every SSE event in that
//! read shares the stamp.

pub(crate) mod arrival;
mod body;
mod chunk;
mod endpoint;
mod http;
mod record;
mod secret;
mod skim;
mod sse;
mod stream;
mod tls;
mod transport;
mod unary;
mod wire;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderValue};
use tokio::time::Instant;

pub use crate::config::DEFAULT_POOL_IDLE_TIMEOUT;
pub use body::{
    BodyExtra, BodySpec, ChatMessage, ExtraError, NO_EXTRA, Prompt, Role, encode as encode_body,
    merge as merge_body,
};
pub use endpoint::{ApiKey, Endpoint};
pub use record::{
    CacheSource, MAX_RECORD_SPAN, Outcome, RequestRecord, ServerSplit, ServerTiming, TokenCounter,
    Usage, WorkerId,
};
pub use secret::{MASK, Secrets};
pub use sse::{DEFAULT_MAX_EVENT_BYTES, SseError, SseEvent, SseParser};

pub use http::{
    MAX_REDIRECTS, USER_AGENT, blocking_http_client_builder, error_text, http_client_builder,
};
use http::{
    MAX_TAIL_BYTES, drain, read_error_body, rejected_fields_hint, response_limit, sleep_until_some,
};
pub(crate) use stream::sanitize;
use stream::{Flow, StreamDecoder};
pub use tls::{TargetTls, TlsFiles};
pub use transport::Prewarmed;
/// The response framing the transport reads with, public for the fuzz target and the property
/// tests of `tests/bad_input.rs` only.
#[doc(hidden)]
pub use wire::{BodyDecoder, MAX_HEAD_BYTES, ResponseHead, WireError, parse_head};

/// Body bytes allowed per requested output token before a stream counts as runaway: a chat chunk
/// of one token is about 200 bytes with usage and `nvext`, so this leaves a wide margin.
pub const RESPONSE_BYTES_PER_TOKEN: usize = 4096;

/// Errors in setting the client up. Requests themselves never fail with an error: see
/// [`StreamClient::send`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid target URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("the API key contains characters not allowed in an HTTP header")]
    InvalidApiKey,
    #[error("invalid client setting: {0}")]
    InvalidConfig(String),
    #[error("request.extra_body: {0}")]
    ExtraBody(#[from] body::ExtraError),
    /// The value is not named: it may be a credential.
    #[error("request.headers: `{name}` is not a header name, or its value cannot be sent")]
    InvalidHeader { name: String },
    #[error("request.headers: `{0}` is set by the canary itself")]
    OwnedHeader(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("TLS: cannot read {path}: {source}")]
    TlsFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS: {path} holds no usable PEM {what}: {message}")]
    TlsPem {
        path: String,
        what: &'static str,
        message: String,
    },
}

/// Client-wide settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientConfig {
    /// Limit on establishing a connection: the TCP connect and any TLS handshake.
    pub connect_timeout: Duration,
    /// Limit on one whole request, from the actual send to the end of the stream; at most
    /// [`MAX_RECORD_SPAN`].
    pub request_timeout: Duration,
    /// Limit from the actual send to the first content chunk: a server that accepts a request
    /// and then sends nothing (or only its headers) fails here, as `timeout`.
    pub first_token_timeout: Duration,
    /// Limit on the silence between two reads once the first content chunk came: a stream that
    /// stalls mid-way fails here, as `timeout`, with when it stalled.
    pub stall_timeout: Duration,
    /// Cap on one SSE line or event; a larger one is a `bad_response`, so a broken server cannot
    /// exhaust memory.
    pub max_event_bytes: usize,
    /// Cap on one response body. A stream is also cut at `osl` × [`RESPONSE_BYTES_PER_TOKEN`] +
    /// 1 MiB when that is smaller, so a server that streams forever (or far past the requested
    /// length) ends as a `bad_response` instead of growing the record without bound.
    pub max_response_bytes: usize,
    /// Cap on the stored error message.
    pub max_error_bytes: usize,
    /// After the outcome is decided (`[DONE]`, an error status), how long to keep reading the rest
    /// of the body: long enough to hand a clean connection back to the pool or to capture an error
    /// message, short enough that a server which never closes cannot hold a worker.
    pub tail_grace: Duration,
    /// How long an idle pooled connection is kept.
    pub pool_idle_timeout: Duration,
    /// What marks every request as the canary's.
    pub marker: Marker,
}

/// What marks the canary's traffic (docs/DESIGN.md §4), so the serving side can leave it out of
/// its own metrics, logs and autoscaling: a header, and the OpenAI `user` field of the body.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub header: Option<(reqwest::header::HeaderName, HeaderValue)>,
    pub user: Option<String>,
}

impl Default for Marker {
    /// `X-Canary: llm-canary` and `user: llm-canary`, the config's defaults.
    fn default() -> Self {
        Self {
            header: Some((
                reqwest::header::HeaderName::from_static("x-canary"),
                HeaderValue::from_static("llm-canary"),
            )),
            user: Some("llm-canary".to_owned()),
        }
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
            first_token_timeout: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(30),
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_response_bytes: 64 << 20,
            max_error_bytes: 2048,
            tail_grace: Duration::from_millis(250),
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT,
            marker: Marker::default(),
        }
    }
}

impl ClientConfig {
    fn validate(&self) -> Result<(), ClientError> {
        let bad = |why: &str| Err(ClientError::InvalidConfig(why.to_owned()));
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout must be positive");
        }
        if self.request_timeout.is_zero() || self.request_timeout > MAX_RECORD_SPAN {
            return bad("request_timeout must be positive and at most 1h");
        }
        if self.first_token_timeout.is_zero() || self.stall_timeout.is_zero() {
            return bad("first_token_timeout and stall_timeout must be positive");
        }
        if self.max_event_bytes < 1024 {
            return bad("max_event_bytes must be at least 1024");
        }
        if self.max_response_bytes < self.max_event_bytes {
            return bad("max_response_bytes must be at least max_event_bytes");
        }
        Ok(())
    }
}

/// One request to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRequest {
    /// Sent as `x-request-id`; must be a valid header value (the workloads make ASCII ids).
    pub request_id: String,
    pub prompt: Prompt,
    /// The requested output length.
    pub osl: u32,
}

/// When the client abandons a request on purpose, as users do (a workload's `cancel` scenario):
/// the connection is closed there, which is how a server learns of it, and the request counts as
/// `cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// Once this many output tokens have arrived (at least 1).
    AfterTokens(u32),
    /// This long after sending, wherever the request is then (queued, in prefill, streaming).
    After(Duration),
    /// From this instant, as soon as the request streams (at its first token if that comes
    /// later): a request sent in a step's warmup, which no result counts, is not waited for once
    /// its step stops sending. One that never streams is left to the step's drain, which counts
    /// a hung target's requests as the failures they are.
    OnceStreamingAt(Instant),
}

/// What one exchange of [`StreamClient::send_cancelling`] works with, handed by reference to
/// each of its steps.
struct Exchange<'a> {
    endpoint: &'a Endpoint,
    request: &'a StreamRequest,
    /// The request's own deadline (its request timeout).
    deadline: Instant,
    /// Until the first content chunk: the first-token limit, never past `deadline`.
    first_token_deadline: Instant,
    /// The size of the request's body, which usage is checked against.
    body_bytes_sent: usize,
    /// When the client abandons the request on its own ([`Cancel::After`] is timed outside
    /// the exchange).
    cancel: Option<Cancel>,
    /// `false`: a non-streaming request, whose one JSON body is read whole.
    stream: bool,
}

impl Exchange<'_> {
    /// Why the client abandons the request at `at`, with `rec`'s tokens so far; `None` to go on.
    fn gives_up(&self, rec: &RequestRecord, at: Instant) -> Option<String> {
        let n = rec.client_tokens();
        match self.cancel? {
            Cancel::AfterTokens(limit) if n >= u64::from(limit.max(1)) => {
                Some(format!("cancelled by the client after {n} tokens"))
            }
            Cancel::OnceStreamingAt(from) if at >= from && rec.first_token_at().is_some() => {
                Some(format!(
                    "sent in the warmup and not waited for once the step stopped sending, after {n} tokens"
                ))
            }
            _ => None,
        }
    }
}

/// Why a successful response is not an event stream the client can time: not
/// `text/event-stream`, or a compressed body (the request asked for identity); `None` when it is.
fn not_a_plain_event_stream(response: &transport::Response) -> Option<String> {
    let status = response.status();
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("text/event-stream")
    {
        return Some(format!(
            "HTTP {status} with content type {content_type:?}, not SSE"
        ));
    }
    let encoding = response
        .headers()
        .get(CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"));
    encoding.map(|encoding| {
        format!(
            "HTTP {status} with a {encoding:?}-encoded body, which the request did not accept \
             (Accept-Encoding: identity)"
        )
    })
}

/// The measurement client, cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct StreamClient {
    /// Every target's connections (see [`transport`]).
    pool: Arc<transport::Pool>,
    config: ClientConfig,
    counter: Option<Arc<dyn TokenCounter>>,
}

impl std::fmt::Debug for StreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamClient")
            .field("config", &self.config)
            .field("token_counter", &self.counter.is_some())
            .finish()
    }
}

impl StreamClient {
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        config.validate()?;
        let pool = transport::Pool::new(config.connect_timeout, config.pool_idle_timeout);
        Ok(Self {
            pool: Arc::new(pool),
            config,
            counter: None,
        })
    }

    /// Counts tokens per content chunk with `counter` instead of one per chunk.
    pub fn with_token_counter(mut self, counter: Arc<dyn TokenCounter>) -> Self {
        self.counter = Some(counter);
        self
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Sends `request` to `endpoint` and follows its stream to the end. `intended` is when the
    /// schedule wanted it sent; latencies are measured from there. Never fails: connection
    /// errors, statuses, stream errors and timeouts become the record's outcome.
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        request: &StreamRequest,
        intended: Instant,
    ) -> RequestRecord {
        self.send_until(endpoint, request, intended, std::future::pending())
            .await
    }

    /// Opens connections to `endpoint` until `n` are idle, `ramp` at a time (TLS handshakes
    /// included), so a step's first requests neither pay for connects nor flood the server's
    /// accept queue.
    pub async fn prewarm(&self, endpoint: &Endpoint, n: usize, ramp: usize) -> Prewarmed {
        self.pool.prewarm(&endpoint.origin, n, ramp).await
    }

    /// Like [`StreamClient::send`], but when `cutoff` completes first (a step's drain deadline,
    /// a shutdown) the request is abandoned and counts as `timeout`, with everything received
    /// until then kept: a request still in flight is never silently dropped.
    pub async fn send_until(
        &self,
        endpoint: &Endpoint,
        request: &StreamRequest,
        intended: Instant,
        cutoff: impl std::future::Future<Output = ()>,
    ) -> RequestRecord {
        self.send_cancelling(endpoint, request, intended, cutoff, None, true)
            .await
    }

    /// Like [`StreamClient::send_until`], and abandoned as `cancel` says. A request that ends
    /// before its cancellation point keeps its own outcome. `stream: false` sends a
    /// non-streaming request and reads its one JSON answer (a workload's `request.stream`).
    pub async fn send_cancelling(
        &self,
        endpoint: &Endpoint,
        request: &StreamRequest,
        intended: Instant,
        cutoff: impl std::future::Future<Output = ()>,
        cancel: Option<Cancel>,
        stream: bool,
    ) -> RequestRecord {
        let user = self.config.marker.user.as_deref();
        let spec = endpoint.body_spec(user);
        let body = body::encode_as(&spec, &request.prompt, request.osl, stream);
        let sent = Instant::now();
        let mut rec = RequestRecord::new(request.request_id.clone(), intended, sent);
        rec.kv_block_size = endpoint.kv_block_size();
        rec.streamed = stream;
        let deadline = sent + self.config.request_timeout;
        let cancel_at = match cancel {
            Some(Cancel::After(d)) => Some(sent + d),
            _ => None,
        };
        let exchange = self.exchange(endpoint, request, body, deadline, cancel, &mut rec);
        let ended = tokio::select! {
            finished = tokio::time::timeout_at(deadline, exchange) => finished.err().map(|_| (Outcome::Timeout, format!(
                "no complete response within {:?}",
                self.config.request_timeout
            ))),
            () = cutoff => Some((Outcome::Timeout, "still in flight when the step's drain ended".to_owned())),
            () = sleep_until_some(cancel_at) => Some((Outcome::Cancelled, format!(
                "cancelled by the client {:?} after sending",
                cancel_at.map(|at| at - sent).unwrap_or_default()
            ))),
        };
        if let Some((outcome, message)) = ended {
            // Ignored by `settle` when the outcome was already decided and only the tail was
            // being read. Dropping the exchange closes the connection: the server sees the
            // client leave.
            rec.settle(outcome, Instant::now(), Some(message));
        }
        if rec.outcome.is_error() {
            tracing::debug!(
                request_id = %rec.request_id,
                outcome = rec.outcome.as_str(),
                error = rec.error.as_deref().unwrap_or(""),
                "request failed"
            );
        }
        rec
    }

    async fn exchange(
        &self,
        endpoint: &Endpoint,
        request: &StreamRequest,
        body: bytes::Bytes,
        deadline: Instant,
        cancel: Option<Cancel>,
        rec: &mut RequestRecord,
    ) {
        // A non-streaming answer's first token is its whole answer: the request's own deadline
        // bounds it, not the first-token limit.
        let first_token_limit = if rec.streamed {
            self.config.first_token_timeout
        } else {
            self.config.request_timeout
        };
        let ex = Exchange {
            endpoint,
            request,
            deadline,
            first_token_deadline: deadline.min(rec.sent + first_token_limit),
            body_bytes_sent: body.len(),
            cancel,
            stream: rec.streamed,
        };
        // The record learns of a retry as it begins: a timeout during it still counts it.
        let post = http::post(self, endpoint, &request.request_id, body, &mut rec.retried);
        let sent = tokio::time::timeout_at(ex.first_token_deadline, post).await;
        let Ok(sent) = sent else {
            self.time_out(rec, ex.first_token_deadline, deadline);
            return;
        };
        let mut response = match sent {
            Ok(response) => response,
            Err(err) => {
                let at = Instant::now();
                let message = sanitize(&err.text(), self.config.max_error_bytes, &endpoint.secrets);
                rec.settle(err.send_outcome(), at, Some(message));
                return;
            }
        };
        let at = arrival(&response, rec.sent);
        rec.first_byte = Some(at);
        rec.connect = response.connect_time();
        let status = response.status();
        rec.http_status = Some(status.as_u16());
        if !status.is_success() {
            self.refused(&ex, &mut response, at, rec).await;
            return;
        }
        if !ex.stream {
            self.read_unary(&ex, &mut response, rec).await;
            return;
        }
        if let Some(message) = not_a_plain_event_stream(&response) {
            rec.settle(
                Outcome::BadResponse,
                at,
                Some(sanitize(
                    &message,
                    self.config.max_error_bytes,
                    &endpoint.secrets,
                )),
            );
            return;
        }
        self.follow_stream(&ex, &mut response, rec).await;
    }

    /// Gives a request up as `timeout` at `gave_up`, saying why; the request's own `deadline`
    /// is named when that was the limit.
    fn time_out(&self, rec: &mut RequestRecord, gave_up: Instant, deadline: Instant) {
        let mut why = self.silence(rec, gave_up);
        if gave_up == deadline {
            why = format!(
                "no complete response within {:?}: {why}",
                self.config.request_timeout
            );
        }
        rec.settle(Outcome::Timeout, Instant::now(), Some(why));
    }

    /// An error status, answered at `at`: the outcome is decided at the status line, and the
    /// body (read for the tail grace at most) only adds a message, with the fix first when the
    /// server rejected the body's extension fields.
    async fn refused(
        &self,
        ex: &Exchange<'_>,
        response: &mut transport::Response,
        at: Instant,
        rec: &mut RequestRecord,
    ) {
        let status = response.status();
        rec.settle(
            Outcome::from_status(status.as_u16()),
            at,
            Some(format!("HTTP {status}")),
        );
        let tail_deadline = ex.deadline.min(at + self.config.tail_grace);
        let endpoint = ex.endpoint;
        let limit = self.config.max_error_bytes;
        let text = read_error_body(response, tail_deadline, limit, &endpoint.secrets).await;
        let message = match rejected_fields_hint(
            status.as_u16(),
            &text,
            endpoint,
            self.config.marker.user.is_some(),
        ) {
            // The fix first, so truncation never cuts it off.
            Some(hint) => {
                if !endpoint.rejection_logged.swap(true, Ordering::Relaxed) {
                    let said = sanitize(text.trim(), limit, &endpoint.secrets);
                    let url = crate::config::display_url(&endpoint.url);
                    tracing::error!(url = %url, status = status.as_u16(), server_said = %said, "{hint}");
                }
                format!("HTTP {status}: {hint}; the server said: {}", text.trim())
            }
            None => format!("HTTP {status}: {}", text.trim()),
        };
        rec.error = Some(sanitize(&message, limit, &endpoint.secrets));
    }

    /// Reads a successful response's event stream to its end, stamping each read as it arrives,
    /// and settles the record: finished, failed, cut off as too long, cancelled, or timed out
    /// by the first-token or stall limit.
    async fn follow_stream(
        &self,
        ex: &Exchange<'_>,
        response: &mut transport::Response,
        rec: &mut RequestRecord,
    ) {
        let mut decoder = StreamDecoder::new(
            self.config.max_event_bytes,
            self.counter.as_deref(),
            self.config.max_error_bytes,
            &ex.endpoint.secrets,
        )
        .ending_at_finish_reason(ex.endpoint.ends_at_finish_reason)
        .expecting_model(
            ex.endpoint
                .echoes_model
                .then_some(ex.endpoint.model.as_str()),
        );
        let body_limit = response_limit(&self.config, ex.request.osl);
        let mut body_bytes = 0usize;
        let mut last_read = rec.sent;
        // One timer for the whole body, moved only when it fires: a timeout per read would
        // insert and remove a timer-wheel entry per token, a lock and a wake-up the stamps of
        // every other stream wait behind. When it fires, the limit that applies now decides:
        // until the first content chunk the first-token limit, then the stall limit since the
        // last read; either way never past the request's own deadline.
        let mut timer = std::pin::pin!(tokio::time::sleep_until(ex.first_token_deadline));
        loop {
            let read = tokio::select! {
                biased;
                read = response.chunk() => Some(read),
                () = &mut timer => None,
            };
            let Some(read) = read else {
                let read_deadline = match rec.first_token_at() {
                    None => ex.first_token_deadline,
                    Some(_) => ex.deadline.min(last_read + self.config.stall_timeout),
                };
                if Instant::now() < read_deadline {
                    timer.as_mut().reset(read_deadline);
                    continue;
                }
                self.time_out(rec, read_deadline, ex.deadline);
                return;
            };
            // Stamped before anything looks at the bytes: when they arrived.
            let at = match &read {
                Ok(_) => arrival(response, rec.sent),
                Err(_) => Instant::now(),
            };
            last_read = at;
            let flow = match read {
                Ok(Some(bytes)) => {
                    rec.first_body_byte.get_or_insert(at);
                    body_bytes = body_bytes.saturating_add(bytes.len());
                    if body_bytes > body_limit {
                        Flow::Finished(
                            Outcome::BadResponse,
                            Some(format!(
                                "response body over {body_limit} bytes for {} requested tokens: cut off",
                                ex.request.osl
                            )),
                        )
                    } else {
                        match decoder.on_read(rec, bytes, at) {
                            Flow::Continue => match ex.gives_up(rec, at) {
                                Some(why) => {
                                    // Returning drops the response unread: its connection
                                    // closes.
                                    rec.settle(Outcome::Cancelled, at, Some(why));
                                    return;
                                }
                                None => Flow::Continue,
                            },
                            flow => flow,
                        }
                    }
                }
                Ok(None) => decoder.on_eof(rec, at),
                Err(err) => Flow::Finished(
                    err.outcome(),
                    Some(sanitize(
                        &err.to_string(),
                        self.config.max_error_bytes,
                        &ex.endpoint.secrets,
                    )),
                ),
            };
            if let Flow::Finished(outcome, message) = flow {
                self.finish_stream(ex, response, rec, (outcome, message), at, body_bytes)
                    .await;
                return;
            }
        }
    }

    /// Settles a stream that finished at `at` after `body_bytes` of body (an `ok` with
    /// implausible usage becomes a `bad_response`), and reads the rest of a successful body so
    /// its connection can return to the pool.
    async fn finish_stream(
        &self,
        ex: &Exchange<'_>,
        response: &mut transport::Response,
        rec: &mut RequestRecord,
        (outcome, message): (Outcome, Option<String>),
        at: Instant,
        body_bytes: usize,
    ) {
        let (outcome, message) = match rec.implausible(ex.request.osl, ex.body_bytes_sent) {
            Some(why) if outcome.is_ok() => (Outcome::BadResponse, Some(why)),
            _ => (outcome, message),
        };
        rec.settle(outcome, at, message);
        // Reading the end of the chunked body lets the connection return to the pool;
        // a body announced far longer than what came is not waited for (a lying
        // Content-Length would hold every request for the tail grace).
        let announced_rest = response
            .content_length()
            .map_or(0, |n| n.saturating_sub(body_bytes as u64));
        if outcome.is_ok() && announced_rest <= MAX_TAIL_BYTES {
            let tail_deadline = ex.deadline.min(at + self.config.tail_grace);
            drain(response, tail_deadline).await;
        }
        // A failed stream is dropped unread: its connection is closed, not reused.
    }

    /// Reads a successful non-streaming answer whole (at most the stream's body limit) until the
    /// request's deadline, and settles the record from it as [`Self::finish_stream`] does a
    /// stream's: the answer's instant is when its last byte came.
    async fn read_unary(
        &self,
        ex: &Exchange<'_>,
        response: &mut transport::Response,
        rec: &mut RequestRecord,
    ) {
        let limit = response_limit(&self.config, ex.request.osl);
        let mut body = bytes::BytesMut::new();
        let failed = loop {
            match response.chunk().await {
                Ok(Some(bytes)) => {
                    rec.first_body_byte
                        .get_or_insert_with(|| arrival(response, rec.sent));
                    if body.len().saturating_add(bytes.len()) > limit {
                        let osl = ex.request.osl;
                        let why = format!(
                            "response body over {limit} bytes for {osl} requested tokens: cut off"
                        );
                        break Some((Outcome::BadResponse, why));
                    }
                    body.extend_from_slice(&bytes);
                }
                Ok(None) => break None,
                Err(err) => break Some((err.outcome(), err.to_string())),
            }
        };
        // Stamped when the last byte came, before anything parses it.
        let at = match failed {
            None => arrival(response, rec.sent),
            Some(_) => Instant::now(),
        };
        let secrets = &ex.endpoint.secrets;
        let limit = self.config.max_error_bytes;
        let (outcome, message) = match failed {
            Some((outcome, why)) => (outcome, Some(sanitize(&why, limit, secrets))),
            None => unary::UnaryReader {
                counter: self.counter.as_deref(),
                message_limit: limit,
                secrets,
                model: ex
                    .endpoint
                    .echoes_model
                    .then_some(ex.endpoint.model.as_str()),
            }
            .read(rec, &body, at),
        };
        self.finish_stream(ex, response, rec, (outcome, message), at, body.len())
            .await;
    }

    /// Why a request that went silent was given up, and since when it was silent.
    fn silence(&self, rec: &RequestRecord, gave_up: Instant) -> String {
        let after = |at: Instant| at.saturating_duration_since(rec.sent);
        match rec.content_chunks().last() {
            None => match rec.first_byte {
                None => format!("no response within {:?} of sending", after(gave_up)),
                Some(head) => format!(
                    "headers after {:?}, then no token until {:?} after sending",
                    after(head),
                    after(gave_up)
                ),
            },
            Some((last, _)) => format!(
                "stalled: {} tokens, the last {:?} after sending, then nothing for {:?}",
                rec.client_tokens(),
                after(last),
                gave_up.saturating_duration_since(last)
            ),
        }
    }
}

/// When the bytes `response` read last arrived: the kernel's stamp where it gives one
/// ([`arrival`]), never before the request was `sent` (a wall-clock step must not put an answer
/// before its question), else now.
fn arrival(response: &transport::Response, sent: Instant) -> Instant {
    response
        .arrived()
        .map_or_else(Instant::now, |at| at.max(sent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Api, Dialect};

    #[test]
    fn endpoint_urls_accept_a_base_with_or_without_v1() {
        let chat = Endpoint::new("http://h:8000", Api::Chat, "m", Dialect::Dynamo).unwrap();
        assert_eq!(chat.url().as_str(), "http://h:8000/v1/chat/completions");
        let v1 = Endpoint::new("http://h:8000/v1/", Api::Completions, "m", Dialect::Vllm).unwrap();
        assert_eq!(v1.url().as_str(), "http://h:8000/v1/completions");
        let prefixed = Endpoint::new("https://h/serve", Api::Chat, "m", Dialect::Openai).unwrap();
        assert_eq!(
            prefixed.url().as_str(),
            "https://h/serve/v1/chat/completions"
        );
        assert!(Endpoint::new("ftp://h", Api::Chat, "m", Dialect::Dynamo).is_err());
        assert!(Endpoint::new("not a url", Api::Chat, "m", Dialect::Dynamo).is_err());
    }

    #[test]
    fn dialect_presets_and_overrides() {
        let dynamo = Endpoint::new("http://h", Api::Chat, "m", Dialect::Dynamo).unwrap();
        assert!(dynamo.nvext());
        assert!(dynamo.length_control().ignore_eos);
        let vllm = Endpoint::new("http://h", Api::Chat, "m", Dialect::Vllm)
            .unwrap()
            .with_nvext(true);
        assert!(vllm.nvext());
    }

    #[test]
    fn a_rejection_of_the_length_fields_names_the_setting() {
        let vllm = Endpoint::new("http://h", Api::Chat, "m", Dialect::Vllm).unwrap();
        // `transformers serve`'s answer to the vLLM preset.
        let body = r#"{"detail":"Unexpected fields in the request: {'ignore_eos', 'min_tokens'}"}"#;
        let hint = rejected_fields_hint(422, body, &vllm, false).unwrap();
        assert!(hint.contains("ignore_eos, min_tokens") || hint.contains("min_tokens, ignore_eos"));
        assert!(hint.contains("`length_control`"), "{hint}");
        assert!(
            hint.contains("max_tokens: true, max_completion_tokens: true, min_tokens: false, ignore_eos: false"),
            "{hint}"
        );
        assert!(hint.contains("llm_canary_osl_mismatch_total"), "{hint}");
        // OpenAI's wording, with the status it uses.
        let openai =
            r#"{"error":{"message":"Unrecognized request argument supplied: min_tokens"}}"#;
        let hint = rejected_fields_hint(400, openai, &vllm, false).unwrap();
        assert!(
            hint.contains("min_tokens") && !hint.contains("ignore_eos, "),
            "{hint}"
        );
        // `nvext` sent to a server that is not Dynamo.
        let dynamo = Endpoint::new("http://h", Api::Chat, "m", Dialect::Dynamo).unwrap();
        let body = r#"{"detail":"Extra inputs are not permitted","loc":["body","nvext"]}"#;
        let hint = rejected_fields_hint(422, body, &dynamo, false).unwrap();
        assert!(
            hint.contains("`dialect`") && hint.contains("nvext"),
            "{hint}"
        );
        // The `user` marker, named only when it was sent.
        let body = r#"{"detail":"Unexpected fields in the request: {'user'}"}"#;
        let hint = rejected_fields_hint(422, body, &vllm, true).unwrap();
        assert!(hint.contains("`client.user: \"\"`"), "{hint}");
        assert_eq!(rejected_fields_hint(422, body, &vllm, false), None);
        // A field the config's `request.extra_body` adds.
        let options: crate::config::RequestOptions =
            serde_saphyr::from_str("{extra_body: {top_k: 5, temperature: 0}}").unwrap();
        let added = vllm.clone().with_request(&options).unwrap();
        let body = r#"{"detail":"Unexpected fields in the request: {'top_k'}"}"#;
        let hint = rejected_fields_hint(422, body, &added, false).unwrap();
        assert!(
            hint.contains("`top_k`")
                && hint.contains("`request.extra_body`")
                && !hint.contains("temperature"),
            "{hint}"
        );
    }

    #[test]
    fn other_client_errors_get_no_hint() {
        let vllm = Endpoint::new("http://h", Api::Chat, "m", Dialect::Vllm).unwrap();
        // A validation error about a value, not an unknown field.
        let body = r#"{"detail":"max_tokens must be at least 1"}"#;
        assert_eq!(rejected_fields_hint(422, body, &vllm, false), None);
        // An unknown field the client did not send (a field name inside another name is not it).
        let body = r#"{"detail":"Unexpected fields in the request: {'top_k', 'my_min_tokens_x'}"}"#;
        assert_eq!(rejected_fields_hint(422, body, &vllm, false), None);
        // A field this endpoint does not send.
        let openai = Endpoint::new("http://h", Api::Chat, "m", Dialect::Openai).unwrap();
        let body = r#"{"detail":"Unexpected fields in the request: {'ignore_eos'}"}"#;
        assert_eq!(rejected_fields_hint(422, body, &openai, false), None);
        // Other statuses.
        let body = r#"{"detail":"Unexpected fields in the request: {'ignore_eos'}"}"#;
        assert_eq!(rejected_fields_hint(404, body, &vllm, false), None);
    }

    #[test]
    fn api_keys_never_show_in_debug_output() {
        let key = ApiKey::new("sk-very-secret");
        let endpoint = Endpoint::new("http://h", Api::Chat, "m", Dialect::Openai)
            .unwrap()
            .with_api_key(&key)
            .unwrap();
        let shown = format!("{key:?} {endpoint:?}");
        assert!(!shown.contains("very-secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
        assert!(matches!(
            Endpoint::new("http://h", Api::Chat, "m", Dialect::Openai)
                .unwrap()
                .with_api_key(&ApiKey::new("bad\nkey")),
            Err(ClientError::InvalidApiKey)
        ));
    }

    #[test]
    fn client_config_is_validated() {
        assert!(StreamClient::new(ClientConfig::default()).is_ok());
        for config in [
            ClientConfig {
                request_timeout: Duration::from_secs(7200),
                ..ClientConfig::default()
            },
            ClientConfig {
                connect_timeout: Duration::ZERO,
                ..ClientConfig::default()
            },
            ClientConfig {
                max_event_bytes: 10,
                ..ClientConfig::default()
            },
        ] {
            assert!(matches!(
                StreamClient::new(config),
                Err(ClientError::InvalidConfig(_))
            ));
        }
    }
}
