//! Target-level vocabulary shared by the config, the client and the simulator: serving mode, API
//! flavour, server dialect and the length-control fields a dialect accepts.

use serde::{Deserialize, Serialize};

/// How a deployment serves: the `serving_mode` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServingMode {
    Aggregated,
    Disaggregated,
    Other,
}

impl ServingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ServingMode::Aggregated => "aggregated",
            ServingMode::Disaggregated => "disaggregated",
            ServingMode::Other => "other",
        }
    }
}

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
    /// The length-control preset of the dialect (DESIGN §4: exact output length).
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
        }
    }

    /// Whether the server understands Dynamo's `nvext` extension.
    pub fn supports_nvext(self) -> bool {
        matches!(self, Dialect::Dynamo)
    }
}
