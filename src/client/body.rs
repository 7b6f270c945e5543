//! The JSON request body of one streamed completion: chat (`messages`) or completions (`prompt`),
//! streaming with usage, the exact-output-length recipe of docs/DESIGN.md §4 limited to the fields the
//! target's dialect accepts, and Dynamo's `nvext` attribution request; then the fields a config
//! adds (`request.extra_body`), serialised once per endpoint ([`BodyExtra`]) and appended to
//! every body as they are.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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
    /// The fields a config adds, already serialised.
    pub extra: &'a BodyExtra,
}

/// Why extra body fields cannot be added to the canary's body (`check` refuses these first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtraError {
    #[error("`{field}` is the canary's own body field: {why}")]
    Owned { field: String, why: &'static str },
    #[error("`nvext.{field}` is the canary's own field: {why}")]
    OwnedNvext { field: String, why: &'static str },
    #[error("`nvext` must be an object: it is merged into the canary's")]
    NvextNotObject,
}

/// The extra body fields of one endpoint, serialised once: `,"k":v,…` to append before the
/// body's closing brace, so a request pays one copy for them, never a merge. When the canary
/// sends `nvext` and the fields hold one too, the merged `nvext` is in here and the canary's
/// own is left out of the struct it serialises.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyExtra {
    tail: std::borrow::Cow<'static, str>,
    carries_nvext: bool,
}

impl BodyExtra {
    /// No extra fields.
    pub const NONE: BodyExtra = BodyExtra {
        tail: std::borrow::Cow::Borrowed(""),
        carries_nvext: false,
    };

    /// `fields` as they join a body that asks for `nvext` attribution when `nvext` is true:
    /// the canary's own fields refused, a `nvext` object merged deeply into the canary's.
    pub fn new(nvext: bool, fields: &Map<String, Value>) -> Result<BodyExtra, ExtraError> {
        let mut tail = String::new();
        let mut carries_nvext = false;
        for (key, value) in fields {
            if let Some(why) = crate::config::owned_body_field(key) {
                return Err(ExtraError::Owned {
                    field: key.clone(),
                    why,
                });
            }
            let value = if key == "nvext" {
                let Value::Object(theirs) = value else {
                    return Err(ExtraError::NvextNotObject);
                };
                if let Some((field, why)) = theirs
                    .keys()
                    .find_map(|k| Some((k, crate::config::owned_nvext_field(k)?)))
                {
                    return Err(ExtraError::OwnedNvext {
                        field: field.clone(),
                        why,
                    });
                }
                if nvext {
                    carries_nvext = true;
                    let mut merged = canary_nvext();
                    merge(&mut merged, theirs);
                    std::borrow::Cow::Owned(Value::Object(merged))
                } else {
                    std::borrow::Cow::Borrowed(value)
                }
            } else {
                std::borrow::Cow::Borrowed(value)
            };
            tail.push(',');
            // A string key and a JSON value serialise without fail.
            tail.push_str(&serde_json::to_string(key).unwrap_or_default());
            tail.push(':');
            tail.push_str(&serde_json::to_string(&*value).unwrap_or_default());
        }
        Ok(BodyExtra {
            tail: std::borrow::Cow::Owned(tail),
            carries_nvext,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.tail.is_empty()
    }
}

/// `over` merged into `base`, deeply: an object merges with an object of the same key, any
/// other value replaces what `base` held (an array as a whole). A target's fields, then a
/// workload's, are merged this way; the workload's win key by key.
pub fn merge(base: &mut Map<String, Value>, over: &Map<String, Value>) {
    for (key, value) in over {
        match (base.get_mut(key), value) {
            (Some(Value::Object(mine)), Value::Object(theirs)) => merge(mine, theirs),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// No extra fields, for a body spec that borrows them for as long as it likes.
pub static NO_EXTRA: BodyExtra = BodyExtra::NONE;

/// The `nvext` the canary sends to Dynamo, as JSON.
fn canary_nvext() -> Map<String, Value> {
    match serde_json::to_value(NVEXT) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

const NVEXT: NvextRequest = NvextRequest {
    extra_fields: ["timing", "worker_id"],
};

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
        nvext: (spec.nvext && !spec.extra.carries_nvext).then_some(NVEXT),
        user: spec.user,
    };
    // Serialising plain structs of strings, integers and booleans into a Vec cannot fail: there
    // is no map with non-string keys and no fallible Serialize impl.
    let mut bytes = serde_json::to_vec(&body).expect("request body is plain JSON");
    if !spec.extra.is_empty() {
        // The body is an object with `model` in it, so the extra fields follow a member.
        bytes.pop();
        bytes.extend_from_slice(spec.extra.tail.as_bytes());
        bytes.push(b'}');
    }
    Bytes::from(bytes)
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
            extra: &NO_EXTRA,
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
                extra: &NO_EXTRA,
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
                    extra: &NO_EXTRA,
                },
                &Prompt::Text("x".into()),
                9,
            );
            assert_eq!(body.as_object().unwrap().len(), 5, "{field}");
            assert!(body.get(field).is_some(), "{field}");
        }
    }

    fn object(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(map) => map,
            _ => unreachable!("an object"),
        }
    }

    #[test]
    fn merge_is_deep_for_objects_and_replaces_everything_else() {
        let mut base = object(json!({
            "temperature": 0.7,
            "stop_words": ["a", "b"],
            "chat_template_kwargs": {"enable_thinking": true, "style": "short"},
            "nvext": {"extra_fields": ["timing"], "top_k": 5},
        }));
        merge(
            &mut base,
            &object(json!({
                "temperature": 0,
                "stop_words": ["c"],
                "chat_template_kwargs": {"enable_thinking": false},
                "nvext": {"top_k": null, "backend_instance_id": 3},
                "seed": 42,
            })),
        );
        assert_eq!(
            Value::Object(base),
            json!({
                "temperature": 0,
                "stop_words": ["c"],
                "chat_template_kwargs": {"enable_thinking": false, "style": "short"},
                "nvext": {"extra_fields": ["timing"], "top_k": null, "backend_instance_id": 3},
                "seed": 42,
            })
        );
        // An object over a scalar, or a scalar over an object, replaces it.
        let mut base = object(json!({"a": 1, "b": {"x": 1}}));
        merge(&mut base, &object(json!({"a": {"y": 2}, "b": 2})));
        assert_eq!(Value::Object(base), json!({"a": {"y": 2}, "b": 2}));
    }

    #[test]
    fn extra_fields_join_the_body_and_nvext_merges_with_the_canarys() {
        let fields = object(json!({
            "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": false},
            "nvext": {"backend_instance_id": 7},
        }));
        let extra = BodyExtra::new(true, &fields).unwrap();
        let dynamo = BodySpec {
            extra: &extra,
            ..spec(Api::Chat, Dialect::Dynamo)
        };
        let bytes = encode(&dynamo, &Prompt::Text("hi".into()), 4);
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["temperature"], 0);
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        assert_eq!(
            body["nvext"],
            json!({"extra_fields": ["timing", "worker_id"], "backend_instance_id": 7})
        );
        assert_eq!(body["max_tokens"], 4);
        // Every key once: the canary's `nvext` gave way to the merged one.
        let text = std::str::from_utf8(&bytes).unwrap();
        assert_eq!(text.matches("\"nvext\"").count(), 1, "{text}");
        // A dialect without `nvext` gets the user's as written.
        let plain = BodyExtra::new(false, &fields).unwrap();
        let vllm = BodySpec {
            extra: &plain,
            ..spec(Api::Chat, Dialect::Vllm)
        };
        let body: Value =
            serde_json::from_slice(&encode(&vllm, &Prompt::Text("hi".into()), 4)).unwrap();
        assert_eq!(body["nvext"], json!({"backend_instance_id": 7}));
    }

    #[test]
    fn the_canarys_own_fields_are_refused() {
        for field in ["model", "stream", "max_tokens", "user", "n"] {
            let fields = object(json!({ field: 1 }));
            assert!(
                matches!(
                    BodyExtra::new(false, &fields),
                    Err(ExtraError::Owned { .. })
                ),
                "{field}"
            );
        }
        let fields = object(json!({"nvext": {"extra_fields": ["x"]}}));
        assert!(matches!(
            BodyExtra::new(true, &fields),
            Err(ExtraError::OwnedNvext { .. })
        ));
        let fields = object(json!({"nvext": 1}));
        assert_eq!(
            BodyExtra::new(true, &fields),
            Err(ExtraError::NvextNotObject)
        );
        assert!(BodyExtra::new(true, &Map::new()).unwrap().is_empty());
    }
}
