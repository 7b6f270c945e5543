//! What one finished request counts for, as every consumer reads it: its [`Sample`] (outcome,
//! latencies, the tokens it counts, the cache hit and where it came from, the server's timing
//! split, goodput), derived once from the client's record and handed to the step statistics,
//! the exporters, the SLO store and the bench's files alike.

use serde::Serialize;

use super::Outcome;

/// Where a request's observed cached prompt tokens came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheSource {
    /// `usage.prompt_tokens_details.cached_tokens`.
    Usage,
    /// Dynamo's `nvext.timing.kv_hit_rate` (the KV router's prefix overlap, in whole blocks)
    /// times the prompt tokens, where usage reports no cached tokens.
    KvHitRate,
}

impl CacheSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheSource::Usage => "usage",
            CacheSource::KvHitRate => "kv_hit_rate",
        }
    }
}

/// One request's TTFT taken apart with the server's own timing (seconds). The client's TTFT
/// (from the intended send) is `client_queue` + the time from the actual send to the first
/// token, and that is `server_ttft` + `handoff`; Dynamo's `server_ttft` is `server_queue` +
/// `server_prefill`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerSplit {
    /// The client's TTFT, from the intended send.
    pub client_ttft: f64,
    /// Intended send → actual send, in the canary.
    pub client_queue: f64,
    /// `timing.ttft_ms`: request received → first token at the worker (in disaggregated
    /// serving the prefill worker's first token).
    pub server_ttft: f64,
    /// `timing.prefill_wait_time_ms`: waiting for a prefill slot.
    pub server_queue: Option<f64>,
    /// `timing.prefill_time_ms`.
    pub server_prefill: Option<f64>,
    /// Actual send → first token at the client, minus `server_ttft`: the network, HTTP/SSE
    /// framing and the frontend's work outside the worker's timer in every mode, and in
    /// disaggregated serving the prefill → decode handoff with its KV transfer (at least 0).
    pub handoff: f64,
    /// `timing.kv_transfer_estimated_latency_ms`: the router's estimate of the KV transfer
    /// (disaggregated only).
    pub kv_transfer: Option<f64>,
}

/// What a good request stays within (seconds): goodput counts requests that succeeded with
/// TTFT ≤ `ttft` and ITL ≤ `itl` (a request with one output token has no ITL to judge).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GoodputLimits {
    pub ttft: f64,
    pub itl: f64,
}

impl GoodputLimits {
    /// Whether a successful request with this TTFT and ITL is good.
    pub fn good(&self, ttft: Option<f64>, itl: Option<f64>) -> bool {
        ttft.is_some_and(|t| t <= self.ttft) && itl.is_none_or(|i| i <= self.itl)
    }
}

/// One finished request's measurements (seconds and tokens), derived once from what the client
/// observed and what the step asked for. Tokens are those a request counts for: a successful
/// one's; a failed request's usage (a `bad_response`'s above all) is not believed and a
/// cancelled one's is the canary's choice, so both count 0 (built where the record is, so the
/// rule is written once).
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub outcome: Outcome,
    /// From the intended send to the first content chunk, whatever the outcome.
    pub ttft: Option<f64>,
    pub itl: Option<f64>,
    /// Last content chunk (or the error) minus the intended send.
    pub latency: f64,
    pub schedule_lag: f64,
    /// Intended send → actual send, for requests that waited for an open-loop slot.
    pub client_queue: Option<f64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    /// Shared-prefix tokens the request was built with (prefix_cache), for the expected hit ratio.
    pub expected_cached_tokens: u64,
    /// Where `cached_tokens` came from (successful requests only).
    pub cache_source: Option<CacheSource>,
    /// The TTFT with the server's own timing, where the server sent it (successful requests only).
    pub server: Option<ServerSplit>,
    /// Succeeded within the target's goodput limits.
    pub good: bool,
    /// A successful request whose output length missed the requested OSL.
    pub osl_mismatch: bool,
    /// A successful request whose content token count disagrees with its usage.
    pub token_count_mismatch: bool,
    /// A reasoning model's measures, for a request whose stream carried reasoning.
    pub reasoning: Option<Reasoning>,
}

/// What a request whose stream carried reasoning (`delta.reasoning_content` or
/// `delta.reasoning`) measured apart (seconds and tokens): times from the intended send, as TTFT,
/// which stays the first token of either kind. Tokens count as a [`Sample`]'s do: a successful
/// request's only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reasoning {
    pub reasoning_tokens: u64,
    /// Output tokens less the reasoning tokens.
    pub answer_tokens: u64,
    pub time_to_first_reasoning_token: f64,
    /// `None` when no answer came (the output ended while still reasoning, or the request failed
    /// first).
    pub time_to_first_answer_token: Option<f64>,
    /// First answer token − first reasoning token.
    pub reasoning_time: Option<f64>,
}

impl Sample {
    /// Whether it counts among the server's answers: anything but a cancellation (the canary's
    /// own choice, which stays out of request counts, error ratios and distributions).
    pub fn answered(&self) -> bool {
        self.outcome != Outcome::Cancelled
    }

    /// The request's latency as the server's: `None` for a cancelled request, which lasted as
    /// long as the canary chose.
    pub fn server_latency(&self) -> Option<f64> {
        self.answered().then_some(self.latency)
    }
}

impl Default for Sample {
    /// A successful request that measured nothing: what tests build samples from.
    fn default() -> Self {
        Sample {
            outcome: Outcome::Ok,
            ttft: None,
            itl: None,
            latency: 0.0,
            schedule_lag: 0.0,
            client_queue: None,
            prompt_tokens: 0,
            cached_tokens: 0,
            output_tokens: 0,
            expected_cached_tokens: 0,
            cache_source: None,
            server: None,
            good: false,
            osl_mismatch: false,
            token_count_mismatch: false,
            reasoning: None,
        }
    }
}
