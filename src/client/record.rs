//! The per-request record of docs/DESIGN.md §4: every instant the client observed for one request, what
//! the server reported (usage, `nvext`), the outcome, and every metric derived from them.
//!
//! All instants come from `tokio::time::Instant` and content-chunk instants are stamped when the
//! bytes arrive, before JSON parsing, so parsing cost never shows up as server latency.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

pub use crate::request::{CacheSource, Outcome, ServerSplit};

/// Counts the tokens of a piece of streamed text. Without one, every content chunk counts as one
/// token (what OpenAI-compatible servers send when streaming token by token).
pub trait TokenCounter: Send + Sync {
    fn count(&self, text: &str) -> usize;
}

/// Token usage as the server reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`; vLLM and Dynamo omit it when zero.
    pub cached_tokens: u64,
}

/// Dynamo's `nvext.timing`, as sent; every field optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerTiming {
    /// Unix time in milliseconds at which the frontend received the request.
    pub request_received_ms: Option<f64>,
    pub prefill_wait_time_ms: Option<f64>,
    pub prefill_time_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub total_time_ms: Option<f64>,
    /// The router's predicted KV-cache hit rate, 0..1.
    pub kv_hit_rate: Option<f64>,
    /// Requests queued at the KV router when this one was routed.
    pub router_queue_depth: Option<f64>,
    pub kv_transfer_estimated_latency_ms: Option<f64>,
}

/// The prompt tokens an engine reuses of a KV router's match. Dynamo's `kv_hit_rate` is matched
/// blocks over the prompt's blocks, the last one partial or not (a 1,024-token prompt of 16
/// blocks of 64, all matched, reads 1.0; 1,000 tokens, 15 whole blocks matched of 16, reads
/// 0.9375), but the engine computes at least the last prompt token and reuses whole blocks only:
/// matched blocks × block size, capped at prompt − 1 rounded down to whole blocks (960 in both
/// examples). Without the block size: the rate times the prompt, capped at prompt − 1.
pub fn reusable_from_hit_rate(rate: f64, prompt: u64, block_size: Option<u32>) -> u64 {
    let rate = if rate.is_finite() {
        rate.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let most = prompt.saturating_sub(1);
    match block_size.map(u64::from).filter(|&b| b > 0) {
        Some(block) => {
            let blocks = prompt.div_ceil(block);
            let matched = (rate * blocks as f64).round() as u64;
            (matched.saturating_mul(block)).min(most / block * block)
        }
        None => ((rate * prompt as f64).round() as u64).min(most),
    }
}

/// Dynamo's `nvext.worker_id`: one id, or the prefill and decode workers of a disaggregated
/// deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WorkerId {
    // Each variant takes its own JSON type (object, number, string), so the order changes no
    // outcome; Dynamo's object comes first because every variant tried before the match costs
    // an error message.
    Split {
        #[serde(default)]
        prefill_worker_id: Option<u64>,
        #[serde(default)]
        decode_worker_id: Option<u64>,
        #[serde(default)]
        prefill_dp_rank: Option<u32>,
        #[serde(default)]
        decode_dp_rank: Option<u32>,
    },
    Id(u64),
    Name(String),
}

impl WorkerId {
    /// The (prefill, decode) workers as text: a single id served both. Text, since Dynamo's
    /// 64-bit ids do not survive a JSON reader that parses numbers as doubles.
    pub fn prefill_and_decode(&self) -> (Option<String>, Option<String>) {
        match self {
            WorkerId::Id(id) => (Some(id.to_string()), Some(id.to_string())),
            WorkerId::Name(name) => (Some(name.clone()), Some(name.clone())),
            WorkerId::Split {
                prefill_worker_id,
                decode_worker_id,
                ..
            } => (
                prefill_worker_id.map(|id| id.to_string()),
                decode_worker_id.map(|id| id.to_string()),
            ),
        }
    }
}

/// One content chunk: when its bytes arrived, as microseconds after the actual send (8 bytes per
/// chunk instead of 24 with an `Instant`), and how many tokens it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChunkStamp {
    offset_us: u32,
    tokens: u32,
}

/// The most tokens a chat template adds around the prompt's text (see
/// [`RequestRecord::implausible`]).
pub const MAX_TEMPLATE_TOKENS: u64 = 4096;

/// The longest request a record can describe: chunk offsets are `u32` microseconds. The client
/// refuses per-request timeouts above this.
pub const MAX_RECORD_SPAN: Duration = Duration::from_secs(3600);

/// Everything observed about one request. Built by the client; [`RequestRecord::new`],
/// [`RequestRecord::push_content`] and [`RequestRecord::settle`] also let tests and simulations
/// build records directly.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// The `x-request-id` sent.
    pub request_id: String,
    /// When the request should have been sent (the schedule); latencies are measured from here.
    pub intended: Instant,
    /// When the client actually started sending.
    pub sent: Instant,
    /// When an open-loop arrival got one of the step's in-flight slots (`rate.max_inflight`);
    /// `None` in closed-loop and multi-turn steps, which have no slots to wait for. The wait from
    /// `intended` to here is the server's (it had every slot busy), not the canary's.
    pub slot_at: Option<Instant>,
    /// How long opening the connection took (TCP, and the TLS handshake of an `https://`
    /// target), when this request found none idle and opened it. Inside TTFT.
    pub connect: Option<Duration>,
    /// Sent a second time, on a new connection: the first attempt, on a reused connection, was
    /// lost before any byte of an answer (the server had closed it as the request went out).
    /// Measured all the same from `intended`: the lost attempt and the new connect are inside
    /// its TTFT (`connect` holds the connect).
    pub retried: bool,
    /// When the response head arrived (the first byte of the response is no later than this).
    pub first_byte: Option<Instant>,
    /// When the first body bytes arrived.
    pub first_body_byte: Option<Instant>,
    /// When `[DONE]` arrived.
    pub done: Option<Instant>,
    /// When the last chunk carrying `usage` arrived.
    pub usage_at: Option<Instant>,
    /// When the outcome was decided: the end of the stream, or the error instant.
    pub end: Instant,
    pub outcome: Outcome,
    pub http_status: Option<u16>,
    /// The body's `id`.
    pub response_id: Option<String>,
    /// The assistant's reply text (content only, not reasoning): multi-turn sends it back.
    pub reply: String,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// `nvext.timing`, from the chunk that carried it (the one with `finish_reason`).
    pub server_timing: Option<ServerTiming>,
    pub worker_id: Option<WorkerId>,
    /// What went wrong, truncated; for logs and reports, never a metric label.
    pub error: Option<String>,
    /// The target engine's KV block size, where known ([`RequestRecord::cached_tokens`]).
    pub kv_block_size: Option<u32>,
    /// Whether the response was streamed: a non-streaming request's one JSON body is its only
    /// "chunk", so it has no inter-token latency, no second token and no client token count.
    pub streamed: bool,
    chunks: Vec<ChunkStamp>,
    /// What a reasoning model's stream held apart ([`RequestRecord::push_chunk`]).
    kinds: Kinds,
    settled: bool,
}

/// The reasoning (`delta.reasoning_content` or `delta.reasoning`) and answer (`delta.content`)
/// parts of a stream: when each began, as microseconds after the actual send like the chunk
/// stamps, and the reasoning tokens the client counted. The answer's tokens are the rest of the
/// output ([`RequestRecord::answer_tokens`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Kinds {
    first_reasoning_us: Option<u32>,
    first_answer_us: Option<u32>,
    reasoning_tokens: u64,
}

impl RequestRecord {
    /// A record of a request sent at `sent` for the schedule's `intended` instant. Until
    /// [`RequestRecord::settle`] is called it counts as cut off (`stream_truncated`).
    pub fn new(request_id: impl Into<String>, intended: Instant, sent: Instant) -> Self {
        Self {
            request_id: request_id.into(),
            intended,
            sent,
            slot_at: None,
            connect: None,
            retried: false,
            first_byte: None,
            first_body_byte: None,
            done: None,
            usage_at: None,
            end: sent,
            outcome: Outcome::StreamTruncated,
            http_status: None,
            response_id: None,
            reply: String::new(),
            finish_reason: None,
            usage: None,
            server_timing: None,
            worker_id: None,
            error: None,
            kv_block_size: None,
            streamed: true,
            chunks: Vec::new(),
            kinds: Kinds::default(),
            settled: false,
        }
    }

    /// Records an answer chunk (`delta.content`) that arrived at `at` carrying `tokens` tokens
    /// (at least 1: a chunk with content holds a token even when a tokenizer splits it
    /// differently).
    pub fn push_content(&mut self, at: Instant, tokens: usize) {
        self.push_chunk(at, 0, tokens.max(1));
    }

    /// Records a chunk that arrived at `at` carrying `reasoning` reasoning tokens and `answer`
    /// answer tokens; a chunk with neither is no token. Each part present counts at least 1.
    pub fn push_chunk(&mut self, at: Instant, reasoning: usize, answer: usize) {
        if reasoning == 0 && answer == 0 {
            return;
        }
        let offset = at.saturating_duration_since(self.sent);
        let offset_us = u32::try_from(offset.as_micros()).unwrap_or(u32::MAX);
        if reasoning > 0 {
            self.kinds.first_reasoning_us.get_or_insert(offset_us);
            self.kinds.reasoning_tokens =
                self.kinds.reasoning_tokens.saturating_add(reasoning as u64);
        }
        if answer > 0 {
            self.kinds.first_answer_us.get_or_insert(offset_us);
        }
        let tokens = u32::try_from(reasoning.saturating_add(answer)).unwrap_or(u32::MAX);
        self.chunks.push(ChunkStamp { offset_us, tokens });
    }

    /// Whether any reasoning came before or with the answer: only then do the reasoning measures
    /// exist.
    pub fn had_reasoning(&self) -> bool {
        self.kinds.first_reasoning_us.is_some()
    }

    /// Reasoning tokens as the client counted them (1 per chunk with reasoning, or the token
    /// counter's count): servers' usage does not report them apart.
    pub fn reasoning_tokens(&self) -> u64 {
        self.kinds.reasoning_tokens
    }

    /// Answer tokens: the output tokens ([`RequestRecord::output_tokens`]) less the reasoning
    /// tokens, since `usage.completion_tokens` counts both.
    pub fn answer_tokens(&self) -> u64 {
        self.output_tokens()
            .saturating_sub(self.kinds.reasoning_tokens)
    }

    fn offset_at(&self, offset_us: u32) -> Instant {
        self.sent + Duration::from_micros(u64::from(offset_us))
    }

    /// Time to the first reasoning token, from the intended send (as TTFT).
    pub fn time_to_first_reasoning_token(&self) -> Option<Duration> {
        let at = self.offset_at(self.kinds.first_reasoning_us?);
        Some(at.saturating_duration_since(self.intended))
    }

    /// Time to the first answer token (`delta.content`), from the intended send.
    pub fn time_to_first_answer_token(&self) -> Option<Duration> {
        let at = self.offset_at(self.kinds.first_answer_us?);
        Some(at.saturating_duration_since(self.intended))
    }

    /// The reasoning time: first answer token − first reasoning token, when both came.
    pub fn reasoning_time(&self) -> Option<Duration> {
        let (reasoning, answer) = (self.kinds.first_reasoning_us?, self.kinds.first_answer_us?);
        Some(Duration::from_micros(u64::from(
            answer.saturating_sub(reasoning),
        )))
    }

    /// Fixes the outcome and the instant it was decided. The first call wins: a later failure
    /// (say, the timeout firing while the connection drains) does not overwrite a decided outcome.
    pub fn settle(&mut self, outcome: Outcome, at: Instant, error: Option<String>) {
        if self.settled {
            return;
        }
        self.settled = true;
        self.outcome = outcome;
        self.end = at;
        if error.is_some() {
            self.error = error;
        }
    }

    pub fn is_settled(&self) -> bool {
        self.settled
    }

    fn chunk_at(&self, stamp: ChunkStamp) -> Instant {
        self.offset_at(stamp.offset_us)
    }

    /// Every content chunk: arrival instant and tokens carried.
    pub fn content_chunks(&self) -> impl ExactSizeIterator<Item = (Instant, u32)> + '_ {
        self.chunks.iter().map(|s| (self.chunk_at(*s), s.tokens))
    }

    pub fn content_chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The first content chunk (content or reasoning content) arrived.
    pub fn first_token_at(&self) -> Option<Instant> {
        self.chunks.first().map(|s| self.chunk_at(*s))
    }

    pub fn last_token_at(&self) -> Option<Instant> {
        self.chunks.last().map(|s| self.chunk_at(*s))
    }

    /// Time to first token: first content chunk − intended send.
    pub fn ttft(&self) -> Option<Duration> {
        self.first_token_at()
            .map(|at| at.saturating_duration_since(self.intended))
    }

    /// Time to second token − intended send: the arrival of the chunk holding the second token
    /// (the first chunk itself when it carried two or more).
    pub fn ttst(&self) -> Option<Duration> {
        if !self.streamed {
            return None;
        }
        let mut seen = 0u64;
        for stamp in &self.chunks {
            seen += u64::from(stamp.tokens);
            if seen >= 2 {
                return Some(
                    self.chunk_at(*stamp)
                        .saturating_duration_since(self.intended),
                );
            }
        }
        None
    }

    /// Tokens counted by the client (1 per content chunk, or the token counter's count).
    pub fn client_tokens(&self) -> u64 {
        self.chunks.iter().map(|s| u64::from(s.tokens)).sum()
    }

    /// Output tokens: `usage.completion_tokens`, or the client count when the server sent no
    /// usage.
    pub fn output_tokens(&self) -> u64 {
        self.usage
            .map(|u| u.completion_tokens)
            .unwrap_or_else(|| self.client_tokens())
    }

    pub fn prompt_tokens(&self) -> Option<u64> {
        self.usage.map(|u| u.prompt_tokens)
    }

    /// Prompt tokens served from the prefix cache, as observed ([`RequestRecord::cache_source`]
    /// says from where): `usage.prompt_tokens_details.cached_tokens`, or, when usage reports none
    /// but Dynamo's `nvext.timing.kv_hit_rate` is above zero, what the engine reuses of the
    /// router's match ([`reusable_from_hit_rate`]). Disaggregated Dynamo reports 0 cached tokens
    /// in usage while its KV router reports the prefix hit (docs/METRICS.md, "Cache hits").
    /// `None` without usage.
    pub fn cached_tokens(&self) -> Option<u64> {
        let usage = self.usage?;
        Some(match self.cache_source() {
            Some(CacheSource::KvHitRate) => reusable_from_hit_rate(
                self.router_kv_hit_rate().unwrap_or(0.0),
                usage.prompt_tokens,
                self.kv_block_size,
            ),
            _ => usage.cached_tokens,
        })
    }

    /// Where [`RequestRecord::cached_tokens`] came from; `None` without usage.
    pub fn cache_source(&self) -> Option<CacheSource> {
        let usage = self.usage?;
        Some(
            if usage.cached_tokens == 0 && self.router_kv_hit_rate().is_some_and(|r| r > 0.0) {
                CacheSource::KvHitRate
            } else {
                CacheSource::Usage
            },
        )
    }

    /// `nvext.timing.kv_hit_rate` when it is a share (0..=1); anything else is not a hit rate.
    fn router_kv_hit_rate(&self) -> Option<f64> {
        self.server_timing
            .as_ref()?
            .kv_hit_rate
            .filter(|r| (0.0..=1.0).contains(r))
    }

    /// The server-side decomposition of this request's TTFT, from Dynamo's `nvext.timing`: `None`
    /// when the request failed, had no first token, or the server sent no `ttft_ms`.
    pub fn server_split(&self) -> Option<ServerSplit> {
        if !self.outcome.is_ok() {
            return None;
        }
        let timing = self.server_timing.as_ref()?;
        let secs = |ms: Option<f64>| ms.filter(|v| v.is_finite() && *v >= 0.0).map(|v| v / 1e3);
        let server_ttft = secs(timing.ttft_ms)?;
        let from_send = self
            .first_token_at()?
            .saturating_duration_since(self.sent)
            .as_secs_f64();
        Some(ServerSplit {
            client_ttft: self.ttft()?.as_secs_f64(),
            client_queue: self.client_queue().as_secs_f64(),
            server_ttft,
            server_queue: secs(timing.prefill_wait_time_ms),
            server_prefill: secs(timing.prefill_time_ms),
            handoff: (from_send - server_ttft).max(0.0),
            kv_transfer: secs(timing.kv_transfer_estimated_latency_ms),
        })
    }

    /// Why a stream that ended with `[DONE]` cannot be believed, judged against what was sent
    /// (`osl` tokens asked for, a `body_bytes` request body) and what arrived; `None` when it
    /// can. A server's numbers feed throughput, cost, the token counters and the budget, so a
    /// reply whose usage no honest server could send is a `bad_response`, never an `ok` with
    /// absurd numbers:
    /// - no content at all (`data: [DONE]` alone, or only empty deltas) for a non-zero `osl`;
    /// - `completion_tokens` above what `max_tokens` allows (2 × `osl` + 16: a server may count a
    ///   stop token or a reasoning preamble, not more), or zero although content arrived;
    /// - far more content than `completion_tokens` says (over twice as many tokens counted);
    /// - `prompt_tokens` above the request body's bytes plus a template (no tokenizer makes more
    ///   tokens than bytes);
    /// - cached tokens above the prompt tokens.
    pub fn implausible(&self, osl: u32, body_bytes: usize) -> Option<String> {
        let content = self.client_tokens();
        if content == 0 && osl > 0 {
            let what = if self.streamed {
                "the stream ended with [DONE]"
            } else {
                "the answer came"
            };
            return Some(format!("{what} without any content"));
        }
        let usage = self.usage?;
        let most = 2 * u64::from(osl) + 16;
        if usage.completion_tokens > most {
            return Some(format!(
                "usage.completion_tokens {} for {osl} requested tokens (at most {most} believable)",
                usage.completion_tokens
            ));
        }
        if usage.completion_tokens == 0 || content > 2 * usage.completion_tokens + 16 {
            return Some(format!(
                "usage.completion_tokens {} for {content} tokens of content received",
                usage.completion_tokens
            ));
        }
        let prompt_most = body_bytes as u64 + MAX_TEMPLATE_TOKENS;
        if usage.prompt_tokens > prompt_most {
            return Some(format!(
                "usage.prompt_tokens {} for a request body of {body_bytes} bytes",
                usage.prompt_tokens
            ));
        }
        if usage.cached_tokens > usage.prompt_tokens {
            return Some(format!(
                "usage.prompt_tokens_details.cached_tokens {} above usage.prompt_tokens {}",
                usage.cached_tokens, usage.prompt_tokens
            ));
        }
        None
    }

    /// The output tokens a request spent of the traffic budget: the usage of a believed reply,
    /// else only what the client counted itself.
    pub fn billable_tokens(&self) -> u64 {
        if self.outcome.is_ok() {
            self.output_tokens()
        } else {
            self.client_tokens()
        }
    }

    /// Inter-token latency: (last content chunk − first content chunk) / (output tokens − 1), for
    /// at least two output tokens of a streamed response.
    pub fn itl(&self) -> Option<Duration> {
        let tokens = self.output_tokens();
        // A non-streaming response arrives whole: there is no gap between its tokens to measure.
        if tokens < 2 || !self.streamed {
            return None;
        }
        let span = self
            .last_token_at()?
            .saturating_duration_since(self.first_token_at()?);
        let divisor = u32::try_from(tokens - 1).unwrap_or(u32::MAX);
        Some(span / divisor)
    }

    /// The per-chunk gap distribution: for each content chunk after the first, (gap to the
    /// previous chunk / k, k) where k is the chunk's token count, so a histogram records the value
    /// k times (`record_n`). The first chunk has no gap: it belongs to TTFT.
    pub fn token_gaps(&self) -> impl Iterator<Item = (Duration, u32)> + '_ {
        self.chunks.windows(2).map(|pair| {
            let gap = Duration::from_micros(u64::from(
                pair[1].offset_us.saturating_sub(pair[0].offset_us),
            ));
            (gap / pair[1].tokens, pair[1].tokens)
        })
    }

    /// Request latency. For a successful request: last content chunk − intended (not `[DONE]`, not
    /// usage; a success without content falls back to the end of the stream). For a failure: the
    /// error latency, error instant − intended.
    pub fn latency(&self) -> Duration {
        let until = match (self.outcome, self.last_token_at()) {
            (Outcome::Ok, Some(last)) => last,
            _ => self.end,
        };
        until.saturating_duration_since(self.intended)
    }

    /// The error latency (error instant − intended), only for failed requests.
    pub fn error_latency(&self) -> Option<Duration> {
        (!self.outcome.is_ok()).then(|| self.end.saturating_duration_since(self.intended))
    }

    /// Client-side queue time: actual send − intended send (zero if sent early). In an
    /// open-loop step this includes the wait for a free in-flight slot, which grows when the
    /// server falls behind the arrivals (a saturated step).
    pub fn client_queue(&self) -> Duration {
        self.sent.saturating_duration_since(self.intended)
    }

    /// Scheduling lag, the canary's own delay: actual send − the later of the intended send and
    /// the instant a slot was free. A lag the server's busy slots explain is queue time, not lag.
    pub fn schedule_lag(&self) -> Duration {
        let ready = self.slot_at.map_or(self.intended, |s| s.max(self.intended));
        self.sent.saturating_duration_since(ready)
    }

    /// Client-side token count minus `usage.completion_tokens`, when the server sent usage.
    pub fn token_count_disagreement(&self) -> Option<i64> {
        // A non-streaming body is one "chunk": the client counted no tokens to compare.
        if !self.streamed {
            return None;
        }
        let usage = self.usage?;
        let client = i64::try_from(self.client_tokens()).unwrap_or(i64::MAX);
        let server = i64::try_from(usage.completion_tokens).unwrap_or(i64::MAX);
        Some(client.saturating_sub(server))
    }

    /// `cached / prompt` tokens, when usage reported a non-zero prompt.
    pub fn cache_hit_ratio(&self) -> Option<f64> {
        let usage = self.usage?;
        let cached = self.cached_tokens()?;
        (usage.prompt_tokens > 0).then(|| cached as f64 / usage.prompt_tokens as f64)
    }

    /// A successful request whose output length differs from the requested OSL by more than
    /// min(5 %, 50 tokens). Failed requests are not judged: their output was cut short by the
    /// failure, which their outcome already counts.
    pub fn osl_mismatch(&self, requested_osl: u32) -> bool {
        if !self.outcome.is_ok() {
            return false;
        }
        let tolerance = (f64::from(requested_osl) * 0.05).min(50.0);
        let difference = self.output_tokens().abs_diff(u64::from(requested_osl));
        difference as f64 > tolerance
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A record whose intended send is `t0`, sent 2 ms late, with content chunks at the given
    /// millisecond offsets from `t0` carrying the given token counts.
    fn record(t0: Instant, chunks: &[(u32, usize)]) -> RequestRecord {
        let mut rec = RequestRecord::new("r-1", t0, t0 + 2 * MS);
        for &(ms, tokens) in chunks {
            rec.push_content(t0 + ms * MS, tokens);
        }
        rec
    }

    #[test]
    fn outcome_labels_are_the_contract() {
        let labels: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            labels,
            [
                "ok",
                "connect",
                "timeout",
                "http_4xx",
                "http_429",
                "http_5xx",
                "stream_error",
                "stream_truncated",
                "bad_response",
                "cancelled"
            ]
        );
        assert!(!Outcome::Cancelled.is_ok() && !Outcome::Cancelled.is_error());
        assert!(Outcome::Timeout.is_error() && !Outcome::Ok.is_error());
        assert_eq!(Outcome::from_status(429), Outcome::Http429);
        assert_eq!(Outcome::from_status(422), Outcome::Http4xx);
        assert_eq!(Outcome::from_status(503), Outcome::Http5xx);
        assert_eq!(Outcome::from_status(304), Outcome::BadResponse);
        assert_eq!(
            serde_json::to_string(&Outcome::StreamTruncated).unwrap(),
            "\"stream_truncated\""
        );
    }

    #[test]
    fn a_slot_wait_is_queue_time_not_the_canarys_lag() {
        let t0 = Instant::now();
        // Intended at t0, a slot free at +30 ms, sent at +31 ms.
        let mut rec = RequestRecord::new("r", t0, t0 + 31 * MS);
        rec.slot_at = Some(t0 + 30 * MS);
        assert_eq!(rec.client_queue(), 31 * MS);
        assert_eq!(rec.schedule_lag(), MS);
        // A slot that was free before the intended instant leaves the whole delay to the canary.
        rec.slot_at = Some(t0);
        assert_eq!(rec.schedule_lag(), 31 * MS);
    }

    #[test]
    fn metrics_follow_design_section_4() {
        let t0 = Instant::now();
        let mut rec = record(t0, &[(50, 1), (60, 1), (70, 1), (100, 1)]);
        rec.done = Some(t0 + 120 * MS);
        rec.settle(Outcome::Ok, t0 + 130 * MS, None);
        assert_eq!(rec.ttft(), Some(50 * MS));
        assert_eq!(rec.ttst(), Some(60 * MS));
        assert_eq!(rec.schedule_lag(), 2 * MS);
        assert_eq!(rec.client_queue(), 2 * MS);
        // Latency ends at the last content chunk, not [DONE] or the end of the stream.
        assert_eq!(rec.latency(), 100 * MS);
        assert_eq!(rec.error_latency(), None);
        // No usage: the client count (4) is the output; (100 - 50) / 3.
        assert_eq!(rec.output_tokens(), 4);
        assert_eq!(rec.itl(), Some(50 * MS / 3));
        // Usage wins over the client count.
        rec.usage = Some(Usage {
            prompt_tokens: 10,
            completion_tokens: 6,
            cached_tokens: 4,
        });
        assert_eq!(rec.itl(), Some(10 * MS));
        assert_eq!(rec.token_count_disagreement(), Some(-2));
        assert_eq!(rec.cache_hit_ratio(), Some(0.4));
        let gaps: Vec<_> = rec.token_gaps().collect();
        assert_eq!(gaps, vec![(10 * MS, 1), (10 * MS, 1), (30 * MS, 1)]);
    }

    #[test]
    fn multi_token_chunks_spread_their_gap() {
        let t0 = Instant::now();
        let rec = record(t0, &[(40, 3), (70, 3), (71, 1)]);
        assert_eq!(rec.ttft(), Some(40 * MS));
        // The first chunk already holds the second token.
        assert_eq!(rec.ttst(), Some(40 * MS));
        assert_eq!(rec.client_tokens(), 7);
        let gaps: Vec<_> = rec.token_gaps().collect();
        assert_eq!(gaps, vec![(10 * MS, 3), (MS, 1)]);
        assert_eq!(rec.itl(), Some(31 * MS / 6));
    }

    #[test]
    fn single_token_and_empty_outputs_have_no_itl() {
        let t0 = Instant::now();
        assert_eq!(record(t0, &[(5, 1)]).itl(), None);
        assert_eq!(record(t0, &[(5, 1)]).ttst(), None);
        let empty = record(t0, &[]);
        assert_eq!(empty.ttft(), None);
        assert_eq!(empty.itl(), None);
        assert_eq!(empty.token_gaps().count(), 0);
    }

    #[test]
    fn failures_report_error_latency_and_keep_the_first_outcome() {
        let t0 = Instant::now();
        let mut rec = record(t0, &[(50, 1)]);
        rec.settle(Outcome::StreamError, t0 + 80 * MS, Some("boom".into()));
        rec.settle(Outcome::Timeout, t0 + 900 * MS, Some("late".into()));
        assert_eq!(rec.outcome, Outcome::StreamError);
        assert_eq!(rec.error.as_deref(), Some("boom"));
        assert_eq!(rec.latency(), 80 * MS);
        assert_eq!(rec.error_latency(), Some(80 * MS));
        assert!(!rec.osl_mismatch(100), "failures are not judged on length");
    }

    #[test]
    fn osl_mismatch_tolerates_min_of_5_percent_and_50_tokens() {
        let t0 = Instant::now();
        let with_output = |completion: u64| {
            let mut rec = record(t0, &[(1, 1)]);
            rec.usage = Some(Usage {
                completion_tokens: completion,
                ..Usage::default()
            });
            rec.settle(Outcome::Ok, t0 + MS, None);
            rec
        };
        // 5 % of 100 is 5 tokens.
        assert!(!with_output(100).osl_mismatch(100));
        assert!(!with_output(95).osl_mismatch(100));
        assert!(!with_output(105).osl_mismatch(100));
        assert!(with_output(94).osl_mismatch(100));
        assert!(with_output(106).osl_mismatch(100));
        // 5 % of 2000 is 100, capped at 50.
        assert!(!with_output(1950).osl_mismatch(2000));
        assert!(with_output(1949).osl_mismatch(2000));
        // Small OSL: any difference counts.
        assert!(with_output(9).osl_mismatch(10));
    }

    #[test]
    fn cached_tokens_come_from_the_router_only_where_usage_reports_none() {
        let t0 = Instant::now();
        let mut rec = record(t0, &[(50, 1), (60, 1)]);
        rec.settle(Outcome::Ok, t0 + 70 * MS, None);
        assert_eq!((rec.cached_tokens(), rec.cache_source()), (None, None));
        rec.usage = Some(Usage {
            prompt_tokens: 843,
            completion_tokens: 2,
            cached_tokens: 0,
        });
        // Disaggregated Dynamo: usage says 0, the router says 93 %.
        rec.server_timing = Some(ServerTiming {
            kv_hit_rate: Some(0.93),
            ..ServerTiming::default()
        });
        assert_eq!(rec.cache_source(), Some(CacheSource::KvHitRate));
        assert_eq!(rec.cached_tokens(), Some(784));
        assert!((rec.cache_hit_ratio().unwrap() - 784.0 / 843.0).abs() < 1e-12);
        // With the engine's block size (64): 843 tokens are 14 blocks, 13 of them matched.
        rec.kv_block_size = Some(64);
        assert_eq!(rec.cached_tokens(), Some(13 * 64));
        rec.kv_block_size = None;
        // Aggregated Dynamo: usage reports the hit, and usage wins.
        rec.usage.as_mut().unwrap().cached_tokens = 832;
        assert_eq!(rec.cache_source(), Some(CacheSource::Usage));
        assert_eq!(rec.cached_tokens(), Some(832));
        // A rate that is not a share is no hit rate.
        rec.usage.as_mut().unwrap().cached_tokens = 0;
        rec.server_timing.as_mut().unwrap().kv_hit_rate = Some(7.0);
        assert_eq!(rec.cache_source(), Some(CacheSource::Usage));
        assert_eq!(rec.cached_tokens(), Some(0));
    }

    #[test]
    fn a_router_hit_rate_becomes_the_whole_blocks_the_engine_reuses() {
        let block = Some(64);
        // 1,024 tokens, 16 blocks of 64, all matched: the last token is computed, so the
        // last block is too: 960 (93.75 %), what aggregated Dynamo's usage reports.
        assert_eq!(reusable_from_hit_rate(1.0, 1024, block), 960);
        // 1,000 tokens: 15 whole blocks and a partial one; 15 matched of 16 reads 0.9375.
        assert_eq!(reusable_from_hit_rate(15.0 / 16.0, 1000, block), 960);
        // Dynamo 1.6.1's mocker, disaggregated: 2,410 tokens, 37 of 38 blocks.
        assert_eq!(reusable_from_hit_rate(37.0 / 38.0, 2410, block), 37 * 64);
        // Half the blocks of a 2,048-token prompt.
        assert_eq!(reusable_from_hit_rate(0.5, 2048, block), 1024);
        // A prompt of one block or less reuses nothing.
        assert_eq!(reusable_from_hit_rate(1.0, 64, block), 0);
        assert_eq!(reusable_from_hit_rate(1.0, 0, block), 0);
        // Without the block size: never the whole prompt.
        assert_eq!(reusable_from_hit_rate(1.0, 1024, None), 1023);
        assert_eq!(reusable_from_hit_rate(0.5, 1000, None), 500);
        assert_eq!(reusable_from_hit_rate(f64::NAN, 1000, block), 0);
    }

    #[test]
    fn server_timing_takes_the_ttft_apart() {
        let t0 = Instant::now();
        // Intended at t0, sent 2 ms late, first token 90 ms after the intended send.
        let mut rec = record(t0, &[(90, 1), (96, 1)]);
        rec.server_timing = Some(ServerTiming {
            prefill_wait_time_ms: Some(1.0),
            prefill_time_ms: Some(35.0),
            ttft_ms: Some(36.0),
            kv_transfer_estimated_latency_ms: Some(0.0),
            ..ServerTiming::default()
        });
        rec.settle(Outcome::Ok, t0 + 100 * MS, None);
        let split = rec.server_split().unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(split.client_ttft, 0.090), "{split:?}");
        assert!(close(split.client_queue, 0.002), "{split:?}");
        assert!(close(split.server_ttft, 0.036), "{split:?}");
        // 88 ms from the actual send to the first token, 36 of them at the worker.
        assert!(close(split.handoff, 0.052), "{split:?}");
        assert!(close(
            split.client_queue + split.server_ttft + split.handoff,
            split.client_ttft
        ));
        assert_eq!(split.server_queue, Some(0.001));
        assert_eq!(split.kv_transfer, Some(0.0));
        // A failed request, or one without the server's TTFT, has no split.
        rec.server_timing.as_mut().unwrap().ttft_ms = None;
        assert_eq!(rec.server_split(), None);
        let mut failed = record(t0, &[(90, 1)]);
        failed.server_timing = Some(ServerTiming {
            ttft_ms: Some(36.0),
            ..ServerTiming::default()
        });
        failed.settle(Outcome::StreamTruncated, t0 + 100 * MS, None);
        assert_eq!(failed.server_split(), None);
    }

    #[test]
    fn worker_id_accepts_every_shape() {
        let one: WorkerId = serde_json::from_str("7").unwrap();
        assert_eq!(one, WorkerId::Id(7));
        let split: WorkerId =
            serde_json::from_str(r#"{"prefill_worker_id": 1, "decode_worker_id": 2}"#).unwrap();
        assert_eq!(
            split,
            WorkerId::Split {
                prefill_worker_id: Some(1),
                decode_worker_id: Some(2),
                prefill_dp_rank: None,
                decode_dp_rank: None,
            }
        );
    }
}
