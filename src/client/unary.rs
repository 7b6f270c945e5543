//! Turns the one JSON body of a non-streaming completion (`"stream": false`) into a
//! [`RequestRecord`]: the whole answer arrives at once, so its one "chunk" is stamped when the
//! body ended (TTFT is the request's latency, and there is no ITL), and its tokens are those of
//! `usage.completion_tokens`. A body that does not parse, has no choices, names another model or
//! reports an error is a failure of the kind a stream's would be, never `ok`.

use tokio::time::Instant;

use super::chunk::{ChoiceJson, ChunkJson};
use super::record::{Outcome, RequestRecord, TokenCounter};
use super::secret::Secrets;
use super::stream::{MAX_MODEL_BYTES, apply_meta, char_floor, error_message, sanitize};

/// How a non-streaming body is read: what a stream's decoder is told of its request.
pub(super) struct UnaryReader<'c> {
    pub(super) counter: Option<&'c dyn TokenCounter>,
    pub(super) message_limit: usize,
    pub(super) secrets: &'c Secrets,
    /// The model asked for, which the body must name where the dialect's server repeats it.
    pub(super) model: Option<&'c str>,
}

impl UnaryReader<'_> {
    /// Reads `body`, which ended at `at`, into `rec`: the outcome and its message, `ok` only for
    /// a body with a choice.
    pub(super) fn read(
        &self,
        rec: &mut RequestRecord,
        body: &[u8],
        at: Instant,
    ) -> (Outcome, Option<String>) {
        let mut answer: ChunkJson<'_> = match serde_json::from_slice(body) {
            Ok(answer) => answer,
            Err(err) => {
                // Masked whole, then cut: a cut through a secret would leave its beginning.
                let data = String::from_utf8_lossy(body);
                let data = self.secrets.mask(&data);
                let preview = &data[..char_floor(&data, 80)];
                let message = format!("unparseable response body ({err}): {preview}");
                return (Outcome::BadResponse, Some(self.kept(&message)));
            }
        };
        if let Some(error) = &answer.error {
            return (Outcome::StreamError, Some(self.kept(&error_message(error))));
        }
        if answer.object.as_deref() == Some("error") {
            let message = answer
                .message
                .as_deref()
                .unwrap_or("error object in the answer");
            return (Outcome::StreamError, Some(self.kept(message)));
        }
        if let (Some(asked), Some(named)) = (self.model, answer.model.as_deref())
            && named != asked
        {
            let message = format!(
                "the answer is from model \"{}\", not the requested \"{}\"",
                sanitize(named, MAX_MODEL_BYTES, self.secrets),
                sanitize(asked, MAX_MODEL_BYTES, self.secrets)
            );
            return (Outcome::BadResponse, Some(self.kept(&message)));
        }
        let Some(choice) = answer.choices.as_ref().and_then(|c| c.first()) else {
            let message = "a response without choices: the request asked for one";
            return (Outcome::BadResponse, Some(message.to_owned()));
        };
        let (content, reasoning) = texts(choice);
        // One "chunk" at the end of the body, all of it answer: a body arriving whole has no
        // instant of a first reasoning or answer token to tell apart.
        if !content.is_empty() || !reasoning.is_empty() {
            let tokens = match self.counter {
                Some(counter) => counter.count(content) + counter.count(reasoning),
                None => 1,
            };
            rec.push_content(at, tokens);
            rec.reply.push_str(content);
        }
        rec.finish_reason = choice.finish_reason.as_ref().map(|r| r.as_ref().to_owned());
        apply_meta(rec, &mut answer, at, true, self.secrets);
        (Outcome::Ok, None)
    }

    /// A server's message as the record keeps it.
    fn kept(&self, text: &str) -> String {
        sanitize(text, self.message_limit, self.secrets)
    }
}

/// An answer's content (`message.content`, or the completions API's `text`) and reasoning
/// (`message.reasoning_content` or `message.reasoning`), empty where absent.
fn texts<'s>(choice: &'s ChoiceJson<'_>) -> (&'s str, &'s str) {
    let (content, reasoning) = match &choice.message {
        Some(message) => (
            message.content.as_deref(),
            message
                .reasoning_content
                .as_deref()
                .or(message.reasoning.as_deref()),
        ),
        None => (choice.text.as_deref(), None),
    };
    (content.unwrap_or(""), reasoning.unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    static NO_SECRETS: Secrets = Secrets::none();

    fn read(body: &str) -> RequestRecord {
        let t0 = Instant::now();
        let mut rec = RequestRecord::new("r", t0, t0);
        rec.streamed = false;
        let reader = UnaryReader {
            counter: None,
            message_limit: 200,
            secrets: &NO_SECRETS,
            model: Some("m"),
        };
        let at = t0 + Duration::from_millis(300);
        let (outcome, message) = reader.read(&mut rec, body.as_bytes(), at);
        rec.settle(outcome, at, message);
        rec
    }

    #[test]
    fn a_whole_answer_is_one_chunk_with_the_usage_tokens() {
        let rec = read(
            r#"{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a b c","reasoning_content":"hm"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":12}}"#,
        );
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        assert_eq!(rec.ttft(), Some(Duration::from_millis(300)));
        assert_eq!(rec.latency(), Duration::from_millis(300));
        assert_eq!((rec.itl(), rec.ttst()), (None, None));
        assert_eq!(rec.output_tokens(), 12);
        assert_eq!(rec.token_count_disagreement(), None);
        assert_eq!(rec.reply, "a b c");
        assert_eq!(rec.finish_reason.as_deref(), Some("length"));
        assert_eq!(rec.response_id.as_deref(), Some("chatcmpl-1"));
        assert!(
            !rec.had_reasoning(),
            "a whole body has no reasoning instants"
        );
        let text = read(
            r#"{"model":"m","choices":[{"index":0,"text":" x y","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        );
        assert_eq!((text.outcome, text.reply.as_str()), (Outcome::Ok, " x y"));
    }

    #[test]
    fn a_broken_answer_is_a_failure_of_its_kind() {
        for (body, outcome, said) in [
            (
                r#"{"model":"m","choices":[{"index":0,"mess"#,
                Outcome::BadResponse,
                "unparseable",
            ),
            (
                r#"{"model":"m","usage":{"completion_tokens":3}}"#,
                Outcome::BadResponse,
                "without choices",
            ),
            (
                r#"{"model":"m","choices":[]}"#,
                Outcome::BadResponse,
                "without choices",
            ),
            (
                r#"{"model":"other","choices":[{"index":0,"text":"x"}]}"#,
                Outcome::BadResponse,
                "\"other\"",
            ),
            (
                r#"{"error":{"message":"engine died"}}"#,
                Outcome::StreamError,
                "engine died",
            ),
            (
                r#"{"object":"error","message":"overloaded"}"#,
                Outcome::StreamError,
                "overloaded",
            ),
            ("", Outcome::BadResponse, "unparseable"),
        ] {
            let rec = read(body);
            assert_eq!(rec.outcome, outcome, "{body}");
            let error = rec.error.unwrap_or_default();
            assert!(error.contains(said), "{body}: {error}");
        }
    }
}
