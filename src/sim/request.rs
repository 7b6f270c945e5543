//! What the simulator reads of a request: the completion body's fields (the ones it honours,
//! and under `reject_unknown_fields` the ones OpenAI's API refuses), the prompt's token count,
//! and the request log of what the canary sent.

use serde::Deserialize;
use serde_json::{Value, json};

use super::state::{Endpoint, ServerState};
use super::text;
use crate::clock::unix_now;

/// The request fields the simulator reads; others are accepted and ignored, as real servers do.
#[derive(Debug, Deserialize)]
pub(super) struct CompletionBody {
    /// Named back in every chunk, as Dynamo, vLLM and SGLang do; the simulator serves any name.
    #[serde(default)]
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) messages: Option<Vec<Message>>,
    #[serde(default)]
    pub(super) prompt: Option<Value>,
    #[serde(default)]
    pub(super) stream: bool,
    #[serde(default)]
    pub(super) stream_options: Option<StreamOptions>,
    pub(super) max_tokens: Option<u32>,
    pub(super) max_completion_tokens: Option<u32>,
    pub(super) min_tokens: Option<u32>,
    #[serde(default)]
    pub(super) ignore_eos: bool,
    #[serde(default)]
    pub(super) nvext: Option<NvExt>,
}

/// The request fields the OpenAI API defines for chat and completions; with
/// `reject_unknown_fields` any other is refused the way OpenAI's API refuses it.
pub(super) const OPENAI_FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "metadata",
    "store",
    "service_tier",
    "reasoning_effort",
    "suffix",
    "echo",
    "best_of",
];

/// The first field of `bytes` (a JSON object) that the OpenAI API does not define.
pub(super) fn unknown_field(bytes: &[u8]) -> Option<String> {
    let map: serde_json::Map<String, Value> = serde_json::from_slice(bytes).ok()?;
    map.keys()
        .find(|k| !OPENAI_FIELDS.contains(&k.as_str()))
        .cloned()
}

/// One line of the request log: what the serving side sees of a request besides its prompt:
/// its headers (`Authorization` redacted), its `user` field, and its body without the prompt
/// (`messages`, `prompt`), so the fields a config adds can be seen as they arrived.
pub(super) fn log_request(
    state: &ServerState,
    endpoint: Endpoint,
    headers: &hyper::HeaderMap,
    bytes: &[u8],
) {
    let Some(log) = &state.request_log else {
        return;
    };
    let headers: serde_json::Map<String, Value> = headers
        .iter()
        .map(|(name, value)| {
            let value = if name == hyper::header::AUTHORIZATION {
                "<redacted>".to_owned()
            } else {
                String::from_utf8_lossy(value.as_bytes()).into_owned()
            };
            (name.as_str().to_owned(), Value::String(value))
        })
        .collect();
    let mut body: serde_json::Map<String, Value> =
        serde_json::from_slice(bytes).unwrap_or_default();
    body.remove("messages");
    body.remove("prompt");
    let line = json!({
        "received_unix": unix_now(),
        "endpoint": endpoint.as_str(),
        "headers": headers,
        "user": body.get("user"),
        "body": body,
    });
    let mut log = log
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Err(e) = std::io::Write::write_all(&mut *log, format!("{line}\n").as_bytes()) {
        tracing::warn!(error = %e, "simulator request log not written");
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct Message {
    pub(super) role: String,
    #[serde(default)]
    pub(super) content: Value,
}

#[derive(Debug, Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub(super) include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub(super) struct NvExt {
    #[serde(default)]
    pub(super) extra_fields: Vec<String>,
    #[serde(default)]
    pub(super) ignore_eos: Option<bool>,
}

pub(super) fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        // Multi-part content: concatenate the text parts.
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

pub(super) fn prompt_tokens(
    state: &ServerState,
    body: &CompletionBody,
    endpoint: Endpoint,
) -> Result<Vec<u32>, String> {
    match endpoint {
        Endpoint::Chat => {
            let messages = body.messages.as_ref().ok_or("`messages` is required")?;
            if messages.is_empty() {
                return Err("`messages` must not be empty".into());
            }
            let flat = text::chat_template(
                messages
                    .iter()
                    .map(|m| (m.role.as_str(), content_text(&m.content))),
            );
            Ok(state.tokenizer.encode(&flat))
        }
        Endpoint::Completions => match body.prompt.as_ref().ok_or("`prompt` is required")? {
            Value::String(s) => Ok(state.tokenizer.encode(s)),
            Value::Array(items) if items.iter().all(Value::is_u64) => Ok(items
                .iter()
                .filter_map(Value::as_u64)
                .map(|t| t as u32)
                .collect()),
            Value::Array(items) if items.len() == 1 && items[0].is_string() => Ok(state
                .tokenizer
                .encode(items[0].as_str().unwrap_or_default())),
            _ => {
                Err("`prompt` must be a string, a one-string array or an array of token ids".into())
            }
        },
    }
}
