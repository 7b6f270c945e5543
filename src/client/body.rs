//! The JSON request body of one streamed completion: chat (`messages`) or completions (`prompt`),
//! streaming with usage, the exact-output-length recipe of docs/DESIGN.md §4 limited to the fields the
//! target's dialect accepts, and Dynamo's `nvext` attribution request.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::config::{Api, LengthControl};

/// Who said a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One chat message; multi-turn requests carry the assistant's actual earlier replies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}

/// The prompt of a request, in either shape; the body adapts it to the target's API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Chat(Vec<ChatMessage>),
    Text(String),
}

/// Everything that makes one body: the target's side ([`BodySpec`]) and the request's side.
#[derive(Debug, Clone, Copy)]
pub struct BodySpec<'a> {
    pub api: Api,
    pub model: &'a str,
    pub length_control: LengthControl,
    pub nvext: bool,
    /// The OpenAI `user` field: the canary's traffic marker (docs/DESIGN.md §4).
    pub user: Option<&'a str>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct NvextRequest {
    extra_fields: [&'static str; 2],
}

#[derive(Serialize)]
struct MessageRef<'a> {
    role: Role,
    content: &'a str,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Messages<'a> {
    Given(&'a [ChatMessage]),
    // A text prompt sent to a chat target becomes one user message.
    Wrapped([MessageRef<'a>; 1]),
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<Messages<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<std::borrow::Cow<'a, str>>,
    stream: bool,
    /// Only beside `"stream": true`: servers refuse stream options on a non-streaming request.
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignore_eos: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nvext: Option<NvextRequest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
}

/// Serialises the body once, into the bytes that go on the wire.
///
/// Length fields follow `spec.length_control` with one adaptation: `max_completion_tokens` exists
/// only in the chat API, so on the completions API that flag asks for the equivalent `max_tokens`
/// instead of sending a field the server may reject. `stop` is never sent: it would end outputs
/// early and break the exact-length recipe.
pub fn encode(spec: &BodySpec<'_>, prompt: &Prompt, osl: u32) -> Bytes {
    encode_as(spec, prompt, osl, true)
}

/// [`encode`], streaming or not (`"stream": false`, without `stream_options`).
pub fn encode_as(spec: &BodySpec<'_>, prompt: &Prompt, osl: u32, stream: bool) -> Bytes {
    let lc = spec.length_control;
    let (messages, text, max_tokens, max_completion_tokens) = match spec.api {
        Api::Chat => {
            let messages = match prompt {
                Prompt::Chat(messages) => Messages::Given(messages),
                Prompt::Text(text) => Messages::Wrapped([MessageRef {
                    role: Role::User,
                    content: text,
                }]),
            };
            (
                Some(messages),
                None,
                lc.max_tokens,
                lc.max_completion_tokens,
            )
        }
        Api::Completions => {
            let text = match prompt {
                Prompt::Text(text) => std::borrow::Cow::Borrowed(text.as_str()),
                // The completions API has no roles: the conversation is sent as its plain text.
                Prompt::Chat(messages) => std::borrow::Cow::Owned(
                    messages
                        .iter()
                        .map(|m| m.content.as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
            };
            (
                None,
                Some(text),
                lc.max_tokens || lc.max_completion_tokens,
                false,
            )
        }
    };
    let body = Body {
        model: spec.model,
        messages,
        prompt: text,
        stream,
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
        max_tokens: max_tokens.then_some(osl),
        max_completion_tokens: max_completion_tokens.then_some(osl),
        min_tokens: lc.min_tokens.then_some(osl),
        ignore_eos: lc.ignore_eos.then_some(true),
        nvext: spec.nvext.then_some(NvextRequest {
            extra_fields: ["timing", "worker_id"],
        }),
        user: spec.user,
    };
    // Serialising plain structs of strings, integers and booleans into a Vec cannot fail: there
    // is no map with non-string keys and no fallible Serialize impl.
    Bytes::from(serde_json::to_vec(&body).expect("request body is plain JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dialect;
    use serde_json::{Value, json};

    fn encode_json(spec: &BodySpec<'_>, prompt: &Prompt, osl: u32) -> Value {
        serde_json::from_slice(&encode(spec, prompt, osl)).unwrap()
    }

    fn spec(api: Api, dialect: Dialect) -> BodySpec<'static> {
        BodySpec {
            api,
            model: "qwen",
            length_control: dialect.length_control(),
            nvext: dialect.supports_nvext(),
            user: Some("llm-canary"),
        }
    }

    #[test]
    fn a_non_streaming_body_says_so_without_stream_options() {
        let prompt = Prompt::Text("hi".into());
        let spec = spec(Api::Chat, Dialect::Vllm);
        let body: Value = serde_json::from_slice(&encode_as(&spec, &prompt, 8, false)).unwrap();
        assert_eq!(body["stream"], json!(false));
        assert!(body.get("stream_options").is_none(), "{body}");
        assert_eq!(body["max_tokens"], json!(8));
        let streamed = encode_json(&spec, &prompt, 8);
        assert_eq!(streamed["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn dynamo_chat_body_has_the_exact_length_recipe_at_the_root() {
        let prompt = Prompt::Chat(vec![
            ChatMessage::user("hi"),
            ChatMessage::assistant("hello"),
            ChatMessage::user("again"),
        ]);
        let body = encode_json(&spec(Api::Chat, Dialect::Dynamo), &prompt, 512);
        assert_eq!(
            body,
            json!({
                "model": "qwen",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "again"},
                ],
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": 512,
                "max_completion_tokens": 512,
                "min_tokens": 512,
                "ignore_eos": true,
                "nvext": {"extra_fields": ["timing", "worker_id"]},
                "user": "llm-canary",
            })
        );
        assert!(body.get("stop").is_none());
    }

    #[test]
    fn openai_dialect_sends_only_the_standard_cap() {
        let prompt = Prompt::Text("hi".into());
        let body = encode_json(&spec(Api::Chat, Dialect::Openai), &prompt, 64);
        assert_eq!(
            body,
            json!({
                "model": "qwen",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_completion_tokens": 64,
                "user": "llm-canary",
            })
        );
    }

    #[test]
    fn completions_body_uses_prompt_and_max_tokens() {
        let body = encode_json(
            &spec(Api::Completions, Dialect::Vllm),
            &Prompt::Text("once upon".into()),
            7,
        );
        assert_eq!(
            body,
            json!({
                "model": "qwen",
                "prompt": "once upon",
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": 7,
                "min_tokens": 7,
                "ignore_eos": true,
                "user": "llm-canary",
            })
        );
        let openai = encode_json(
            &spec(Api::Completions, Dialect::Openai),
            &Prompt::Chat(vec![ChatMessage::user("a"), ChatMessage::user("b")]),
            3,
        );
        assert_eq!(openai["prompt"], "a\nb");
        assert_eq!(openai["max_tokens"], 3);
        assert!(openai.get("max_completion_tokens").is_none());
    }

    #[test]
    fn every_length_field_is_individually_switchable() {
        let none = LengthControl {
            max_tokens: false,
            max_completion_tokens: false,
            min_tokens: false,
            ignore_eos: false,
        };
        let body = encode_json(
            &BodySpec {
                api: Api::Chat,
                model: "m",
                length_control: none,
                nvext: false,
                user: None,
            },
            &Prompt::Text("x".into()),
            9,
        );
        let keys: Vec<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys.len(), 4, "{keys:?}");
        for (field, lc) in [
            (
                "max_tokens",
                LengthControl {
                    max_tokens: true,
                    ..none
                },
            ),
            (
                "max_completion_tokens",
                LengthControl {
                    max_completion_tokens: true,
                    ..none
                },
            ),
            (
                "min_tokens",
                LengthControl {
                    min_tokens: true,
                    ..none
                },
            ),
            (
                "ignore_eos",
                LengthControl {
                    ignore_eos: true,
                    ..none
                },
            ),
        ] {
            let body = encode_json(
                &BodySpec {
                    api: Api::Chat,
                    model: "m",
                    length_control: lc,
                    nvext: false,
                    user: None,
                },
                &Prompt::Text("x".into()),
                9,
            );
            assert_eq!(body.as_object().unwrap().len(), 5, "{field}");
            assert!(body.get(field).is_some(), "{field}");
        }
    }
}
