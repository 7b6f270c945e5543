//! The simulator's response bodies: the SSE stream of one `data:` event per token as the engine
//! emits it (with the injected stalls, truncations and resets on the wire), and the whole-body
//! and truncated answers; the `usage` and `nvext` members both shapes of reply carry.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use serde_json::{Value, json};
use tokio::time::{Instant, Sleep};

use super::cluster::RequestStream;
use super::engine::{Completion, StreamEvent};
use super::faults::FaultPlan;
use super::state::{Endpoint, RequestTracker};
use super::text::{self};

/// Pause before an injected reset, so the bytes before it reach the client.
const ABORT_FLUSH: Duration = Duration::from_millis(20);
/// Above this many buffered bytes a frame is handed over even if more tokens are ready.
const FRAME_BYTES: usize = 64 * 1024;

/// Precomputed pieces of the per-token chunk, so a token costs two copies and a word.
pub(super) struct ChunkFormat {
    pub(super) endpoint: Endpoint,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) head: String,
    pub(super) token_prefix: String,
    pub(super) token_suffix: &'static str,
    /// The first this many tokens go out as `delta.reasoning_content` (chat only).
    pub(super) reasoning_tokens: u32,
    pub(super) reasoning_prefix: String,
}

impl ChunkFormat {
    /// The chunks of `endpoint`'s stream; a chat stream's first `reasoning_tokens` tokens are
    /// reasoning (the completions API has no reasoning field).
    pub(super) fn new(
        endpoint: Endpoint,
        id: &str,
        created: u64,
        model: &str,
        reasoning_tokens: u32,
    ) -> Self {
        let object = match endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let model_json = Value::String(model.to_string()).to_string();
        let head = format!(
            "{{\"id\":\"{id}\",\"object\":\"{object}\",\"created\":{created},\"model\":{model_json},"
        );
        let (token_prefix, token_suffix) = match endpoint {
            Endpoint::Chat => (
                format!("data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\""),
                "\"},\"finish_reason\":null}]}\n\n",
            ),
            Endpoint::Completions => (
                format!("data: {head}\"choices\":[{{\"index\":0,\"text\":\""),
                "\",\"logprobs\":null,\"finish_reason\":null}]}\n\n",
            ),
        };
        // vLLM's reasoning delta: the thinking in `reasoning_content`, no `content` member.
        let reasoning_prefix =
            format!("data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"reasoning_content\":\"");
        let reasoning_tokens = match endpoint {
            Endpoint::Chat => reasoning_tokens,
            Endpoint::Completions => 0,
        };
        ChunkFormat {
            endpoint,
            id: id.to_string(),
            created,
            model: model.to_string(),
            head,
            token_prefix,
            token_suffix,
            reasoning_tokens,
            reasoning_prefix,
        }
    }

    pub(super) fn role_chunk(&self, buf: &mut BytesMut) {
        let _ = write!(
            buf,
            "data: {}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"finish_reason\":null}}]}}\n\n",
            self.head
        );
    }

    /// The chunk of token `index` (0-based): reasoning while `index` < `reasoning_tokens`.
    pub(super) fn token(&self, buf: &mut BytesMut, word: &str, index: u32) {
        let prefix = if index < self.reasoning_tokens {
            &self.reasoning_prefix
        } else {
            &self.token_prefix
        };
        buf.extend_from_slice(prefix.as_bytes());
        buf.extend_from_slice(b" ");
        buf.extend_from_slice(word.as_bytes());
        buf.extend_from_slice(self.token_suffix.as_bytes());
    }

    pub(super) fn data(&self, buf: &mut BytesMut, value: &Value) {
        let _ = write!(buf, "data: {value}\n\n");
    }

    pub(super) fn finish_chunk(&self, c: &Completion, nvext: Option<Value>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                json!({"index": 0, "delta": {}, "finish_reason": c.finish_reason.as_str()})
            }
            Endpoint::Completions => {
                json!({"index": 0, "text": "", "logprobs": null, "finish_reason": c.finish_reason.as_str()})
            }
        };
        let mut v = self.envelope(vec![choice]);
        if let Some(nvext) = nvext {
            v["nvext"] = nvext;
        }
        v
    }

    pub(super) fn envelope(&self, choices: Vec<Value>) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": choices})
    }
}

pub(super) enum SseState {
    Streaming,
    /// The next poll resets the connection (abrupt truncation).
    Abort,
    Done,
}

/// The SSE body: one `data:` event per token, written as soon as the engine emits it. Tokens that
/// are already waiting when the connection polls share a frame, which changes nothing on the wire
/// (each still is its own event) but saves syscalls when the client is slower than the engine.
pub(crate) struct SseBody {
    pub(super) stream: RequestStream,
    pub(super) format: ChunkFormat,
    pub(super) tracker: RequestTracker,
    pub(super) plan: FaultPlan,
    pub(super) include_usage: bool,
    pub(super) want_timing: bool,
    pub(super) want_worker: bool,
    pub(super) stall: Option<Pin<Box<Sleep>>>,
    pub(super) state: SseState,
    /// `Some` under `write_per_event`: one event per write.
    pub(super) per_event: Option<PerEvent>,
}

/// One event per write, as vLLM's and Dynamo's frontends send them. hyper writes every frame a
/// body hands it in one poll together, so after each frame the body answers `Pending` once (having
/// woken itself): hyper flushes, then polls again.
#[derive(Default)]
pub(super) struct PerEvent {
    /// The events of the last frame after its first, each to go on its own.
    queued: VecDeque<Bytes>,
    /// A frame went out since hyper last flushed.
    must_yield: bool,
}

impl PerEvent {
    /// The next of the queued events, or a yield that makes hyper flush the one before; `None`
    /// when the body may read the engine.
    fn poll_queued(&mut self, cx: &mut Context<'_>) -> Option<Poll<Bytes>> {
        if self.must_yield {
            self.must_yield = false;
            cx.waker().wake_by_ref();
            return Some(Poll::Pending);
        }
        let next = self.queued.pop_front()?;
        self.must_yield = true;
        Some(Poll::Ready(next))
    }

    /// The first event of `frame`; the rest are queued.
    fn split(&mut self, mut frame: Bytes) -> Bytes {
        let mut events = Vec::new();
        while let Some(end) = memchr::memmem::find(&frame, b"\n\n") {
            events.push(frame.split_to(end + 2));
        }
        if !frame.is_empty() {
            events.push(frame);
        }
        let mut events = events.into_iter();
        let first = events.next().unwrap_or_default();
        self.queued.extend(events);
        self.must_yield = true;
        first
    }
}

/// The error that makes hyper drop the connection mid-body.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("simulated connection reset")]
    InjectedReset,
    #[error("the engine stopped")]
    EngineGone,
}

impl SseBody {
    pub(super) fn poll_frame_inner(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(queued) = self.per_event.as_mut().and_then(|p| p.poll_queued(cx)) {
            return queued.map(|event| Some(Ok(Frame::data(event))));
        }
        // A stall before the first token: the headers went, then nothing.
        if self.tracker.tokens == 0
            && let Some((0, duration)) = self.plan.stall
        {
            self.plan.stall = None;
            self.stall = Some(Box::pin(tokio::time::sleep(duration)));
        }
        if let Some(sleep) = self.stall.as_mut() {
            ready!(sleep.as_mut().poll(cx));
            self.stall = None;
        }
        match self.state {
            SseState::Done => return Poll::Ready(None),
            SseState::Abort => {
                self.state = SseState::Done;
                return Poll::Ready(Some(Err(BodyError::InjectedReset)));
            }
            SseState::Streaming => {}
        }
        let mut buf = BytesMut::new();
        // The tokens of one frame go out in one write: one instant stamps them all.
        let mut now = None;
        loop {
            let event = match self.stream.poll_next(cx) {
                Poll::Ready(e) => e,
                Poll::Pending if buf.is_empty() => return Poll::Pending,
                Poll::Pending => break,
            };
            match event {
                Some(StreamEvent::Token { .. }) => {
                    if buf.is_empty() {
                        // The frame holds this token and those already waiting: one allocation,
                        // not a doubling per few tokens (a zero-delay frame carries ~15).
                        let format = &self.format;
                        let per_token = format.token_prefix.len() + format.token_suffix.len() + 16;
                        let n = (1 + self.stream.ready()).min(FRAME_BYTES / per_token);
                        buf.reserve(n * per_token);
                    }
                    let now = *now.get_or_insert_with(Instant::now);
                    if self.tracker.tokens == 0 && self.format.endpoint == Endpoint::Chat {
                        self.format.role_chunk(&mut buf);
                    }
                    let word = text::output_word(self.stream.word_offset, self.tracker.tokens);
                    self.format.token(&mut buf, word, self.tracker.tokens);
                    self.tracker.token(now);
                    let one_token = self.per_event.is_some();
                    if self.apply_faults(&mut buf) || buf.len() >= FRAME_BYTES || one_token {
                        break;
                    }
                }
                Some(StreamEvent::Done(c)) => {
                    let nvext = nvext_json(&c, self.want_timing, self.want_worker);
                    self.format
                        .data(&mut buf, &self.format.finish_chunk(&c, nvext));
                    if self.include_usage {
                        let mut usage = self.format.envelope(Vec::new());
                        usage["usage"] = usage_json(&c);
                        self.format.data(&mut buf, &usage);
                    }
                    buf.extend_from_slice(b"data: [DONE]\n\n");
                    self.tracker.finish(true, Some(&c));
                    self.state = SseState::Done;
                    break;
                }
                Some(StreamEvent::Rejected(message)) => {
                    self.error_event(&mut buf, &message);
                    break;
                }
                None => {
                    if buf.is_empty() {
                        self.state = SseState::Done;
                        return Poll::Ready(Some(Err(BodyError::EngineGone)));
                    }
                    self.state = SseState::Abort;
                    break;
                }
            }
        }
        let frame = match self.per_event.as_mut() {
            Some(per_event) => per_event.split(buf.freeze()),
            None => buf.freeze(),
        };
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    /// Applies the faults due after the token just written; true when the frame must go now.
    pub(super) fn apply_faults(&mut self, buf: &mut BytesMut) -> bool {
        let n = self.tracker.tokens;
        if self.plan.malformed_after == Some(n) {
            let _ = write!(
                buf,
                "data: {}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"\n\n",
                self.format.head
            );
        }
        if let Some((after, message)) = &self.plan.error_event
            && *after == n
        {
            let message = message.clone();
            self.error_event(buf, &message);
            return true;
        }
        if let Some((after, abrupt)) = self.plan.truncate
            && after == n
        {
            self.tracker.finish(false, None);
            if abrupt {
                // Hyper drops buffered bytes when a body fails, so let it flush the last tokens
                // (it does when the body is pending) before the reset.
                self.stall = Some(Box::pin(tokio::time::sleep(ABORT_FLUSH)));
                self.state = SseState::Abort;
            } else {
                self.state = SseState::Done;
            }
            return true;
        }
        if let Some((after, duration)) = self.plan.stall
            && after == n
        {
            self.stall = Some(Box::pin(tokio::time::sleep(duration)));
            return true;
        }
        false
    }

    pub(super) fn error_event(&mut self, buf: &mut BytesMut, message: &str) {
        let payload =
            json!({"error": {"message": message, "type": "internal_server_error", "code": 500}});
        let comment = message.replace(['\r', '\n'], " ");
        let _ = write!(buf, "event: error\n: {comment}\ndata: {payload}\n\n");
        self.tracker.finish(false, None);
        self.state = SseState::Done;
    }
}

/// Every response body the simulator sends.
pub(crate) enum SimBody {
    Full(Option<Bytes>),
    /// Part of a body announced with a larger Content-Length, then a reset.
    Truncated(Option<Bytes>, u64),
    Sse(Box<SseBody>),
}

impl SimBody {
    pub(super) fn full(text: impl Into<Bytes>) -> Self {
        SimBody::Full(Some(text.into()))
    }
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            SimBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Truncated(bytes, _) => Poll::Ready(Some(match bytes.take() {
                Some(b) => Ok(Frame::data(b)),
                None => Err(BodyError::InjectedReset),
            })),
            SimBody::Sse(sse) => sse.poll_frame_inner(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, SimBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Truncated(_, announced) => SizeHint::with_exact(*announced),
            SimBody::Sse(_) => SizeHint::default(),
        }
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The `usage` member of a reply.
pub(super) fn usage_json(c: &Completion) -> Value {
    let mut usage = json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    });
    // vLLM and Dynamo omit the details when nothing was cached; clients must treat absence as 0.
    if c.cached_tokens > 0 {
        usage["prompt_tokens_details"] = json!({"cached_tokens": c.cached_tokens});
    }
    usage
}

/// The `nvext` member of a reply: the timing and the workers, as far as the request asked.
pub(super) fn nvext_json(c: &Completion, want_timing: bool, want_worker: bool) -> Option<Value> {
    if !want_timing && !want_worker {
        return None;
    }
    let mut nvext = json!({});
    if want_timing {
        let t = &c.timing;
        let age = Instant::now().saturating_duration_since(t.received);
        nvext["timing"] = json!({
            "request_received_ms": (crate::clock::unix_now() * 1e3 - age.as_secs_f64() * 1e3).round(),
            "prefill_wait_time_ms": ms(t.first_scheduled.saturating_duration_since(t.received)),
            "prefill_time_ms": ms(t.prefill_done.saturating_duration_since(t.first_scheduled)),
            // As Dynamo counts it: the first token at the worker that prefilled, i.e. wait +
            // prefill. In disaggregated serving the client's first token comes later, after
            // the handoff to the decode worker.
            "ttft_ms": ms(t.prefill_done.saturating_duration_since(t.received)),
            "total_time_ms": ms(t.finished.saturating_duration_since(t.received)),
            "kv_hit_rate": if c.prompt_tokens == 0 { 0.0 } else { f64::from(c.cached_tokens) / f64::from(c.prompt_tokens) },
            "kv_transfer_estimated_latency_ms": ms(t.kv_transfer),
        });
    }
    if want_worker {
        nvext["worker_id"] = json!({
            "prefill_worker_id": c.prefill_worker_id.unwrap_or(c.worker_id),
            "decode_worker_id": c.worker_id,
        });
    }
    Some(nvext)
}
