//! Target-level vocabulary shared by the config, the client and the simulator: serving mode, API
//! flavour, server dialect and the length-control fields a dialect accepts.

use serde::{Deserialize, Serialize};

pub use crate::request::ServingMode;

/// Which OpenAI endpoint the canary talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `POST /v1/chat/completions` with `messages`.
    #[default]
    Chat,
    /// `POST /v1/completions` with `prompt`.
    Completions,
}

/// Which server family a target is: decides which extension fields the request body may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    #[default]
    Dynamo,
    Vllm,
    Sglang,
    Openai,
    /// Hugging Face `transformers serve`: only `max_tokens` bounds the output, and its streams end
    /// after the `finish_reason` chunk without `data: [DONE]`.
    Transformers,
}

/// Which output-length fields go into the body. Some servers answer 422 to fields they do not know,
/// so each dialect has a preset and a target may override it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthControl {
    pub max_tokens: bool,
    pub max_completion_tokens: bool,
    pub min_tokens: bool,
    pub ignore_eos: bool,
}

impl Dialect {
    /// The length-control preset of the dialect (docs/DESIGN.md §4: exact output length).
    pub fn length_control(self) -> LengthControl {
        match self {
            Dialect::Dynamo | Dialect::Vllm | Dialect::Sglang => LengthControl {
                max_tokens: true,
                max_completion_tokens: true,
                min_tokens: true,
                ignore_eos: true,
            },
            // Hosted OpenAI-style APIs reject unknown fields; only the standard cap is safe.
            Dialect::Openai => LengthControl {
                max_tokens: false,
                max_completion_tokens: true,
                min_tokens: false,
                ignore_eos: false,
            },
            // It answers 422 to `min_tokens`/`ignore_eos` and ignores `max_completion_tokens`.
            Dialect::Transformers => LengthControl {
                max_tokens: true,
                max_completion_tokens: false,
                min_tokens: false,
                ignore_eos: false,
            },
        }
    }

    /// Whether the server understands Dynamo's `nvext` extension.
    pub fn supports_nvext(self) -> bool {
        matches!(self, Dialect::Dynamo)
    }

    /// Whether a body that ends cleanly after the `finish_reason` chunk is a complete stream. The
    /// OpenAI protocol ends every stream with `data: [DONE]`, and without it the canary cannot
    /// tell a finished stream from one cut off after its last token, so only a dialect whose
    /// server never sends `[DONE]` relaxes this (docs/DESIGN.md §4: EOF without `[DONE]` is
    /// `stream_truncated`). A body that breaks off (a reset, an unterminated chunked body) is
    /// truncated in every dialect.
    pub fn ends_at_finish_reason(self) -> bool {
        matches!(self, Dialect::Transformers)
    }

    /// Whether the server names, in every chunk, exactly the model string the request asked
    /// for, so a chunk naming another is a wrong answer (`bad_response`): Dynamo, SGLang and the
    /// embedded simulator repeat the request's `model`, and vLLM its served model name (the
    /// first of `--served-model-name`, which a target should name). OpenAI answers with a dated
    /// snapshot (`gpt-4o` → `gpt-4o-2024-08-06`) and `transformers serve` adds a revision
    /// (`@main`), so those dialects are not held to it.
    pub fn echoes_model(self) -> bool {
        matches!(self, Dialect::Dynamo | Dialect::Vllm | Dialect::Sglang)
    }
}

/// What a secret is replaced by wherever the canary shows text: credentials in URLs, header
/// values of `request.headers`, and (`client::Secrets`) what servers echo of them.
pub const MASK: &str = "***";

/// `url` as the canary shows it (logs, `check`, `/api/v1/status`, the bench files): a user name
/// or password in it is replaced by `***`, so credentials put in a target URL are never shown.
pub fn display_url(url: &url::Url) -> String {
    if url.username().is_empty() && url.password().is_none() {
        return url.to_string();
    }
    let mut shown = url.clone();
    let _ = shown.set_username(MASK);
    let _ = shown.set_password(None);
    shown.to_string()
}

/// [`display_url`] of a URL as written in a config; text that is not a URL is shown as is.
pub fn display_url_text(text: &str) -> String {
    url::Url::parse(text).map_or_else(|_| text.to_owned(), |u| display_url(&u))
}
