//! The shape of one streamed chunk's JSON, as both decoders fill it: the fast path of plain
//! chunks ([`super::skim`]) and serde_json's full parse ([`super::stream`]); a non-streaming
//! answer has the same shape with `message` for `delta` ([`super::unary`]). Strings are borrowed
//! from the event data when they have no escapes.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use smallvec::SmallVec;

/// One chunk of a streamed completion: the data of one SSE event.
#[derive(Deserialize, Default)]
pub(super) struct ChunkJson<'a> {
    #[serde(borrow, default)]
    pub(super) id: Option<Cow<'a, str>>,
    /// The model the server says answered, which the request's must match where the dialect's
    /// server repeats it ([`crate::config::Dialect::echoes_model`]).
    #[serde(borrow, default)]
    pub(super) model: Option<Cow<'a, str>>,
    /// One choice inline: the canary asks for one, and a heap allocation per token would cost
    /// more than the rest of the chunk's bookkeeping.
    #[serde(borrow, default)]
    pub(super) choices: Option<SmallVec<[ChoiceJson<'a>; 1]>>,
    #[serde(default)]
    pub(super) usage: Option<UsageJson>,
    // Kept unparsed and read member by member when present (the last chunk), so an unexpected
    // attribution field never turns a good stream into a bad response.
    #[serde(borrow, default)]
    pub(super) nvext: Option<&'a RawValue>,
    #[serde(default)]
    pub(super) error: Option<serde_json::Value>,
    /// vLLM reports a mid-stream failure as an error response object: `"object": "error"` with a
    /// `message`, instead of an `error` member.
    #[serde(borrow, default)]
    pub(super) object: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) message: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
pub(super) struct ChoiceJson<'a> {
    /// Which choice this is: the request asks for one, so one index per stream.
    #[serde(default)]
    pub(super) index: Option<u64>,
    #[serde(borrow, default)]
    pub(super) delta: Option<DeltaJson<'a>>,
    /// The completions API streams `text` instead of `delta`.
    #[serde(borrow, default)]
    pub(super) text: Option<Cow<'a, str>>,
    /// A non-streaming chat answer's `message`, of the delta's shape: `content`, and
    /// `reasoning_content` or `reasoning`.
    #[serde(borrow, default)]
    pub(super) message: Option<DeltaJson<'a>>,
    #[serde(borrow, default)]
    pub(super) finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
pub(super) struct DeltaJson<'a> {
    #[serde(borrow, default)]
    pub(super) content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) reasoning: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub(super) struct UsageJson {
    #[serde(default)]
    pub(super) prompt_tokens: Option<u64>,
    #[serde(default)]
    pub(super) completion_tokens: Option<u64>,
    #[serde(default)]
    pub(super) prompt_tokens_details: Option<PromptDetailsJson>,
}

#[derive(Deserialize)]
pub(super) struct PromptDetailsJson {
    #[serde(default)]
    pub(super) cached_tokens: Option<u64>,
}
