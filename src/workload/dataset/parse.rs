//! The two file formats a dataset is read from, ShareGPT-style JSON (an array of
//! `{"conversations": [{"from", "value"}, …]}`) and JSONL prompts (`{"prompt"}`,
//! `{"messages"}` or `{"conversations"}` per line, optionally with `output_tokens` or
//! `max_tokens`), parsed into [`Row`]s with every bad row named by its line or array index.

use serde::Deserialize;
use serde::de::{SeqAccess, Visitor};

use super::{DatasetFormat, Message, Place, Row, Speaker};
use crate::workload::MAX_OSL;

/// What is wrong with one row ([`super::DatasetError::Rows`] names the file and the place).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RowProblem {
    #[error("not JSON: {0}; a JSONL dataset has one object per line")]
    NotJson(String),
    #[error("not {what}: {message}")]
    NotRow { what: &'static str, message: String },
    #[error("not a JSON array of ShareGPT entries: {0}")]
    NotArray(String),
    #[error("has no output length: add `output_tokens` to the row, or set `workloads.dataset.osl`")]
    NoOutputLength,
    #[error(
        "`{field}` is `{value}`; a speaker is `human` (or `user`), `gpt` (or `assistant`) or \
         `system`"
    )]
    Speaker { field: String, value: String },
    #[error("has no `prompt`, `messages` or `conversations`; give one of them")]
    NoPrompt,
    #[error("has more than one of `prompt`, `messages` and `conversations`; give one")]
    SeveralPrompts,
    #[error("`{field}` is {value}; a request may ask for 1 to {max} output tokens", max = MAX_OSL)]
    Osl { field: &'static str, value: u64 },
}

/// One message as ShareGPT writes it.
#[derive(Deserialize)]
struct ShareGptMessage {
    from: String,
    value: String,
}

/// One ShareGPT entry: its conversation (other keys, such as `id`, are ignored).
#[derive(Deserialize)]
struct ShareGptEntry {
    conversations: Vec<ShareGptMessage>,
}

/// One message as the OpenAI API writes it.
#[derive(Deserialize)]
struct ApiMessage {
    role: String,
    content: String,
}

/// One JSONL row: a prompt, a message list or a ShareGPT conversation, and what it asks for.
#[derive(Deserialize)]
struct JsonlRow {
    prompt: Option<String>,
    messages: Option<Vec<ApiMessage>>,
    conversations: Option<Vec<ShareGptMessage>>,
    output_tokens: Option<u64>,
    max_tokens: Option<u64>,
}

/// The speaker a ShareGPT `from` or an API `role` names.
fn speaker(value: &str) -> Option<Speaker> {
    match value {
        "human" | "user" => Some(Speaker::User),
        "gpt" | "assistant" | "chatgpt" | "bard" | "bing" | "model" => Some(Speaker::Assistant),
        "system" => Some(Speaker::System),
        _ => None,
    }
}

fn conversation(messages: Vec<ShareGptMessage>, key: &str) -> Result<Vec<Message>, RowProblem> {
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| match speaker(&m.from) {
            Some(speaker) => Ok(Message {
                speaker,
                text: m.value,
            }),
            None => Err(RowProblem::Speaker {
                field: format!("{key}[{i}].from"),
                value: m.from,
            }),
        })
        .collect()
}

/// The format a dataset's text is in: a JSON array is ShareGPT's, anything else JSONL.
pub(super) fn detect(text: &str) -> DatasetFormat {
    if text.trim_start().starts_with('[') {
        DatasetFormat::Sharegpt
    } else {
        DatasetFormat::Jsonl
    }
}

/// The rows of a dataset's text and the bad ones, each with its place, in file order.
pub(super) fn parse(text: &str, format: DatasetFormat) -> (Vec<Row>, Vec<(Place, RowProblem)>) {
    match format {
        DatasetFormat::Sharegpt => sharegpt(text),
        DatasetFormat::Jsonl => jsonl(text),
    }
}

fn jsonl(text: &str) -> (Vec<Row>, Vec<(Place, RowProblem)>) {
    let mut rows = Vec::new();
    let mut bad = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let place = Place::Line(index + 1);
        match jsonl_row(line) {
            Ok(row) => rows.push(Row {
                place,
                messages: row.0,
                output_tokens: row.1,
                replayed: row.2,
            }),
            Err(problem) => bad.push((place, problem)),
        }
    }
    (rows, bad)
}

/// A JSONL line's messages, its output length and whether its turns are replayed one by one
/// (a ShareGPT conversation) rather than sent as one request.
fn jsonl_row(line: &str) -> Result<(Vec<Message>, Option<u32>, bool), RowProblem> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| RowProblem::NotJson(e.to_string()))?;
    let row: JsonlRow = serde_json::from_value(value).map_err(|e| RowProblem::NotRow {
        what: "a dataset row (`prompt`, `messages` or `conversations`)",
        message: e.to_string(),
    })?;
    let osl = match (row.output_tokens, row.max_tokens) {
        (Some(n), _) => Some(("output_tokens", n)),
        (None, Some(n)) => Some(("max_tokens", n)),
        (None, None) => None,
    };
    let output_tokens = match osl {
        Some((field, value)) if value == 0 || value > u64::from(MAX_OSL) => {
            return Err(RowProblem::Osl { field, value });
        }
        Some((_, value)) => Some(value as u32),
        None => None,
    };
    let given = [
        row.prompt.is_some(),
        row.messages.is_some(),
        row.conversations.is_some(),
    ];
    match given.iter().filter(|g| **g).count() {
        0 => return Err(RowProblem::NoPrompt),
        1 => {}
        _ => return Err(RowProblem::SeveralPrompts),
    }
    if let Some(prompt) = row.prompt {
        let user = Message {
            speaker: Speaker::User,
            text: prompt,
        };
        return Ok((vec![user], output_tokens, false));
    }
    if let Some(messages) = row.messages {
        let messages = messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| match speaker(&m.role) {
                Some(speaker) => Ok(Message {
                    speaker,
                    text: m.content,
                }),
                None => Err(RowProblem::Speaker {
                    field: format!("messages[{i}].role"),
                    value: m.role,
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok((messages, output_tokens, false));
    }
    let messages = conversation(row.conversations.unwrap_or_default(), "conversations")?;
    Ok((messages, output_tokens, true))
}

fn sharegpt(text: &str) -> (Vec<Row>, Vec<(Place, RowProblem)>) {
    // Each element is read on its own, so one bad entry is named by its index and the others
    // are still read; the whole array is never held as untyped JSON.
    struct Entries<'a> {
        rows: &'a mut Vec<Row>,
        bad: &'a mut Vec<(Place, RowProblem)>,
    }
    impl<'de> Visitor<'de> for Entries<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON array of ShareGPT entries")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut index = 0;
            while let Some(value) = seq.next_element::<serde_json::Value>()? {
                let place = Place::Index(index);
                index += 1;
                let entry = serde_json::from_value::<ShareGptEntry>(value)
                    .map_err(|e| RowProblem::NotRow {
                        what: "a ShareGPT entry (`{\"conversations\": [{\"from\", \"value\"}, …]}`)",
                        message: e.to_string(),
                    })
                    .and_then(|e| conversation(e.conversations, "conversations"));
                match entry {
                    Ok(messages) => self.rows.push(Row {
                        place,
                        messages,
                        output_tokens: None,
                        replayed: true,
                    }),
                    Err(problem) => self.bad.push((place, problem)),
                }
            }
            Ok(())
        }
    }
    let mut rows = Vec::new();
    let mut bad = Vec::new();
    let mut de = serde_json::Deserializer::from_str(text);
    let read = serde::Deserializer::deserialize_seq(
        &mut de,
        Entries {
            rows: &mut rows,
            bad: &mut bad,
        },
    )
    .and_then(|()| de.end());
    if let Err(e) = read {
        bad.push((
            Place::Position {
                line: e.line(),
                column: e.column(),
            },
            RowProblem::NotArray(e.to_string()),
        ));
    }
    (rows, bad)
}
