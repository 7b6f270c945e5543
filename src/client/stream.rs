//! Turns the SSE body of a streamed completion into a [`RequestRecord`]: content chunks with the
//! instant of the network read that carried them, the reply text, usage, `nvext`, and the outcome
//! of the stream (`[DONE]`, an error frame, unparseable data, a broken contract, or an early end).
//! The contract of a stream for one choice: every chunk names the model asked for (where the
//! dialect's server repeats it), one choice index throughout, and no content once that choice
//! has its `finish_reason`.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::chunk::{ChoiceJson, ChunkJson};
use super::record::{Outcome, RequestRecord, ServerTiming, TokenCounter, Usage, WorkerId};
use super::secret::Secrets;
use super::sse::{SseEvent, SseParser};

/// What the reader should do after a network read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Flow {
    /// The stream goes on: read more.
    Continue,
    /// The stream is decided: `[DONE]` (ok) or a failure, with its message.
    Finished(Outcome, Option<String>),
}

/// The members of `nvext` the canary reads, each still unparsed; the others are skipped.
#[derive(Deserialize, Default)]
struct NvextJson<'a> {
    #[serde(borrow, default)]
    timing: Option<&'a RawValue>,
    #[serde(borrow, default)]
    worker_id: Option<&'a RawValue>,
}

/// The decoder of one response body.
pub(crate) struct StreamDecoder<'c> {
    parser: SseParser,
    /// The stream's last plain chunk, which most of the next ones repeat around their token.
    template: super::skim::Template,
    counter: Option<&'c dyn TokenCounter>,
    message_limit: usize,
    /// The target's secrets, masked out of every text of the stream that is kept.
    secrets: &'c Secrets,
    /// A clean end of the body after `finish_reason` completes the stream (see
    /// [`crate::config::Dialect::ends_at_finish_reason`]).
    ends_at_finish_reason: bool,
    /// The model the request asked for, which a chunk that names one must name exactly; `None`
    /// where the dialect's server answers with a name of its own (see
    /// [`crate::config::Dialect::echoes_model`]).
    model: Option<&'c str>,
    /// The index of the stream's one choice, from the first chunk that gave one.
    choice: Option<u64>,
}

impl<'c> StreamDecoder<'c> {
    pub(crate) fn new(
        max_event_bytes: usize,
        counter: Option<&'c dyn TokenCounter>,
        message_limit: usize,
        secrets: &'c Secrets,
    ) -> Self {
        Self {
            parser: SseParser::new(max_event_bytes),
            template: Default::default(),
            counter,
            message_limit,
            secrets,
            ends_at_finish_reason: false,
            model: None,
            choice: None,
        }
    }

    /// Holds every chunk that names a model to `model` (exactly, as sent), or none to any.
    pub(crate) fn expecting_model(mut self, model: Option<&'c str>) -> Self {
        self.model = model;
        self
    }

    /// Accepts a clean end of the body after the `finish_reason` chunk as the end of the stream.
    pub(crate) fn ending_at_finish_reason(mut self, yes: bool) -> Self {
        self.ends_at_finish_reason = yes;
        self
    }

    /// One network read that arrived at `at` (stamped before this call). Every event in it shares
    /// that instant.
    pub(crate) fn on_read(&mut self, rec: &mut RequestRecord, bytes: Bytes, at: Instant) -> Flow {
        self.parser.feed(bytes);
        loop {
            match self.parser.next_event() {
                Ok(Some(event)) => {
                    if let Flow::Finished(outcome, message) = self.on_event(rec, &event, at) {
                        return Flow::Finished(outcome, message);
                    }
                }
                Ok(None) => return Flow::Continue,
                Err(err) => return Flow::Finished(Outcome::BadResponse, Some(err.to_string())),
            }
        }
    }

    /// The body ended cleanly at `at`. Without `[DONE]` the stream was cut off, unless the dialect
    /// ends its streams with the `finish_reason` chunk and that chunk came.
    pub(crate) fn on_eof(&mut self, rec: &mut RequestRecord, at: Instant) -> Flow {
        if let Some(event) = self.parser.finish() {
            if let Flow::Finished(outcome, message) = self.on_event(rec, &event, at) {
                return Flow::Finished(outcome, message);
            }
        }
        if self.ends_at_finish_reason && rec.finish_reason.is_some() {
            return Flow::Finished(Outcome::Ok, None);
        }
        Flow::Finished(
            Outcome::StreamTruncated,
            Some("stream ended without [DONE]".to_owned()),
        )
    }

    fn on_event(&mut self, rec: &mut RequestRecord, event: &SseEvent, at: Instant) -> Flow {
        if event.is_error() {
            let text = if event.data.is_empty() {
                event.comment.as_deref().unwrap_or(b"event: error")
            } else {
                &event.data
            };
            let message = self.kept(&String::from_utf8_lossy(text));
            return Flow::Finished(Outcome::StreamError, Some(message));
        }
        // Named events other than the default carry no completion data.
        if event.event.is_some() && event.name() != b"message" {
            return Flow::Continue;
        }
        if event.is_done() {
            rec.done = Some(at);
            return Flow::Finished(Outcome::Ok, None);
        }
        if event.data.trim_ascii().is_empty() {
            return Flow::Continue;
        }
        // Plain chunks take the fast paths, decoded in place: the last chunk's template, else one
        // walk (which renews the template); serde_json decodes the rest, and says what is wrong.
        let mut chunk = ChunkJson::default();
        let decoded = if self.template.decode(&event.data, &mut chunk) {
            Ok(())
        } else {
            match std::str::from_utf8(&event.data) {
                Ok(text) if super::skim::chunk(text, &mut chunk) => {
                    self.template.learn(text, &chunk);
                    Ok(())
                }
                Ok(text) => serde_json::from_str(text).map(|c| chunk = c),
                Err(_) => serde_json::from_slice(&event.data).map(|c| chunk = c),
            }
        };
        match decoded {
            Ok(()) => {}
            Err(err) => {
                // Masked whole, then cut: a cut through a secret would leave its beginning.
                let data = String::from_utf8_lossy(&event.data);
                let data = self.secrets.mask(&data);
                let preview = &data[..char_floor(&data, 80)];
                let message = format!("unparseable chunk ({err}): {preview}");
                return Flow::Finished(Outcome::BadResponse, Some(self.kept(&message)));
            }
        };
        if let Some(error) = &chunk.error {
            let message = self.kept(&error_message(error));
            return Flow::Finished(Outcome::StreamError, Some(message));
        }
        if chunk.object.as_deref() == Some("error") {
            let message = chunk.message.as_deref().unwrap_or("error object in stream");
            return Flow::Finished(Outcome::StreamError, Some(self.kept(message)));
        }
        if let Some(broken) = self.broken_contract(rec, &chunk) {
            return Flow::Finished(Outcome::BadResponse, Some(self.kept(&broken)));
        }
        self.apply(rec, &mut chunk, at);
        Flow::Continue
    }

    /// How `chunk` breaks the contract of a stream for one choice, if it does: another model
    /// than the one asked for, a second choice index, or content after the choice's
    /// `finish_reason` (earlier in the stream or earlier in this chunk). No allocation unless it
    /// does.
    fn broken_contract(&mut self, rec: &RequestRecord, chunk: &ChunkJson<'_>) -> Option<String> {
        if let (Some(asked), Some(named)) = (self.model, chunk.model.as_deref())
            && named != asked
        {
            return Some(format!(
                "the stream is from model \"{}\", not the requested \"{}\"",
                sanitize(named, MAX_MODEL_BYTES, self.secrets),
                sanitize(asked, MAX_MODEL_BYTES, self.secrets)
            ));
        }
        // An empty `finish_reason` is read as none: some servers write `""` for null.
        fn stated(reason: Option<&str>) -> Option<&str> {
            reason.filter(|r| !r.is_empty())
        }
        let mut finished = stated(rec.finish_reason.as_deref());
        for choice in chunk.choices.iter().flatten() {
            if let Some(index) = choice.index {
                match self.choice {
                    None => self.choice = Some(index),
                    Some(first) if first != index => {
                        return Some(format!(
                            "a choice with index {index} after index {first}: the request asked \
                             for one choice"
                        ));
                    }
                    Some(_) => {}
                }
            }
            let (content, reasoning) = texts(choice);
            if let Some(reason) = finished
                && !(content.is_empty() && reasoning.is_empty())
            {
                return Some(format!(
                    "content after finish_reason \"{}\": the server sent tokens past the end of \
                     the choice",
                    sanitize(reason, MAX_MODEL_BYTES, self.secrets)
                ));
            }
            finished = stated(choice.finish_reason.as_deref()).or(finished);
        }
        None
    }

    fn apply(&self, rec: &mut RequestRecord, chunk: &mut ChunkJson<'_>, at: Instant) {
        let mut finished_here = false;
        for choice in chunk.choices.iter().flatten() {
            let (content, reasoning) = texts(choice);
            // A role-only or otherwise empty delta is not a token; reasoning and answer are
            // counted apart (a part present holds a token even where a tokenizer says 0).
            let count = |text: &str| match (text.is_empty(), self.counter) {
                (true, _) => 0,
                (false, Some(counter)) => counter.count(text).max(1),
                (false, None) => 1,
            };
            if !content.is_empty() || !reasoning.is_empty() {
                rec.push_chunk(at, count(reasoning), count(content));
                rec.reply.push_str(content);
            }
            if let Some(reason) = &choice.finish_reason {
                rec.finish_reason = Some(reason.as_ref().to_owned());
                finished_here = true;
            }
        }
        apply_meta(rec, chunk, at, finished_here, self.secrets);
    }
}

/// What a chunk (or a non-streaming body) says besides its tokens: the response id (the first
/// one kept), usage, and `nvext`'s timing and worker; `finished_here`: it carried the
/// `finish_reason`, whose timing wins.
pub(super) fn apply_meta(
    rec: &mut RequestRecord,
    chunk: &mut ChunkJson<'_>,
    at: Instant,
    finished_here: bool,
    secrets: &Secrets,
) {
    if rec.response_id.is_none() {
        // An id is an identifier, not a payload: a server's 900 KB id is kept cut, escaped.
        rec.response_id = chunk
            .id
            .as_ref()
            .map(|id| sanitize(id.as_ref(), MAX_RESPONSE_ID_BYTES, secrets));
    }
    if let Some(usage) = chunk.usage.take() {
        rec.usage = Some(Usage {
            prompt_tokens: usage.prompt_tokens.unwrap_or(0),
            completion_tokens: usage.completion_tokens.unwrap_or(0),
            cached_tokens: usage
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
        });
        rec.usage_at = Some(at);
    }
    let nvext = chunk
        .nvext
        .and_then(|raw| serde_json::from_str::<NvextJson>(raw.get()).ok());
    if let Some(nvext) = nvext {
        // Dynamo puts timing on the finish_reason chunk; a server that puts it elsewhere is
        // still heard, but the finish_reason chunk's copy is never overwritten.
        if finished_here || rec.server_timing.is_none() {
            if let Some(timing) = nvext
                .timing
                .and_then(|t| serde_json::from_str::<ServerTiming>(t.get()).ok())
            {
                rec.server_timing = Some(timing);
            }
        }
        if let Some(mut worker) = nvext
            .worker_id
            .and_then(|w| serde_json::from_str::<WorkerId>(w.get()).ok())
        {
            // A name is an identifier too, kept as a response id is.
            if let WorkerId::Name(name) = &mut worker {
                *name = sanitize(name, MAX_RESPONSE_ID_BYTES, secrets);
            }
            rec.worker_id = Some(worker);
        }
    }
}

impl StreamDecoder<'_> {
    /// A server's message as the record keeps it.
    fn kept(&self, text: &str) -> String {
        sanitize(text, self.message_limit, self.secrets)
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub(super) fn char_floor(text: &str, max: usize) -> usize {
    let mut at = max.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// A choice's content (`delta.content`, or the completions API's `text`) and reasoning
/// (`delta.reasoning_content` or `delta.reasoning`), empty where absent.
fn texts<'s>(choice: &'s ChoiceJson<'_>) -> (&'s str, &'s str) {
    let (content, reasoning) = match &choice.delta {
        Some(delta) => (
            delta.content.as_deref(),
            delta
                .reasoning_content
                .as_deref()
                .or(delta.reasoning.as_deref()),
        ),
        None => (choice.text.as_deref(), None),
    };
    (content.unwrap_or(""), reasoning.unwrap_or(""))
}

/// The most of a model name (or a `finish_reason`) a message quotes.
pub(super) const MAX_MODEL_BYTES: usize = 256;

/// The human part of an `{"error": ...}` value: its `message`, or the value itself.
pub(super) fn error_message(error: &serde_json::Value) -> String {
    match error {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Object(fields) => match fields.get("message") {
            Some(serde_json::Value::String(text)) => text.clone(),
            _ => error.to_string(),
        },
        other => other.to_string(),
    }
}

/// The longest response id kept (OpenAI's and Dynamo's are under 60 bytes).
pub(crate) const MAX_RESPONSE_ID_BYTES: usize = 128;

/// Server text made safe for logs, `requests.jsonl` and terminals, the one way every text a
/// server sent becomes a record's: the target's `secrets` are masked first (a server that
/// echoes the request's key cannot get it republished), then every control character
/// (newline, carriage return, NUL, the ESC of terminal escape sequences, …), line and paragraph
/// separator and bidirectional override is written as its escape (`\n`, `\u{1b}`), then the
/// text is cut to at most `limit` bytes on a character boundary, the cut marked. A server can
/// neither forge a log line nor drive the operator's terminal.
pub(crate) fn sanitize(text: &str, limit: usize, secrets: &Secrets) -> String {
    let text = secrets.mask(text);
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    let mut out = String::with_capacity(text.len().min(limit) + 3);
    let mut piece = String::new();
    for c in text.chars() {
        piece.clear();
        if unsafe_char(c) {
            piece.extend(c.escape_default());
        } else {
            piece.push(c);
        }
        if out.len() + piece.len() > limit {
            out.push('…');
            return out;
        }
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    struct Words;
    impl TokenCounter for Words {
        fn count(&self, text: &str) -> usize {
            text.split_whitespace().count()
        }
    }

    fn decode(reads: &[(u32, &str)], counter: Option<&dyn TokenCounter>) -> RequestRecord {
        decode_with(reads, counter, false)
    }

    static NO_SECRETS: Secrets = Secrets::none();

    fn decode_with(
        reads: &[(u32, &str)],
        counter: Option<&dyn TokenCounter>,
        ends_at_finish_reason: bool,
    ) -> RequestRecord {
        decode_full(reads, counter, ends_at_finish_reason, None, &NO_SECRETS)
    }

    fn decode_masking(
        reads: &[(u32, &str)],
        counter: Option<&dyn TokenCounter>,
        ends_at_finish_reason: bool,
        secrets: &Secrets,
    ) -> RequestRecord {
        decode_full(reads, counter, ends_at_finish_reason, None, secrets)
    }

    fn decode_for(
        reads: &[(u32, &str)],
        counter: Option<&dyn TokenCounter>,
        ends_at_finish_reason: bool,
        model: Option<&str>,
    ) -> RequestRecord {
        decode_full(reads, counter, ends_at_finish_reason, model, &NO_SECRETS)
    }

    fn decode_full(
        reads: &[(u32, &str)],
        counter: Option<&dyn TokenCounter>,
        ends_at_finish_reason: bool,
        model: Option<&str>,
        secrets: &Secrets,
    ) -> RequestRecord {
        let t0 = Instant::now();
        let mut rec = RequestRecord::new("r", t0, t0);
        let mut decoder = StreamDecoder::new(1 << 20, counter, 200, secrets)
            .ending_at_finish_reason(ends_at_finish_reason)
            .expecting_model(model);
        let mut last = t0;
        for &(ms, text) in reads {
            last = t0 + ms * MS;
            let flow = decoder.on_read(&mut rec, Bytes::copy_from_slice(text.as_bytes()), last);
            if let Flow::Finished(outcome, message) = flow {
                rec.settle(outcome, last, message);
                return rec;
            }
        }
        if let Flow::Finished(outcome, message) = decoder.on_eof(&mut rec, last) {
            rec.settle(outcome, last, message);
        }
        rec
    }

    const ROLE: &str =
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";

    fn content(text: &str) -> String {
        format!(
            "data: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}}}}]}}\n\n",
            serde_json::to_string(text).unwrap()
        )
    }

    #[test]
    fn a_full_chat_stream() {
        let finish = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],\"nvext\":{\"timing\":{\"ttft_ms\":12.5,\"kv_hit_rate\":0.5,\"request_received_ms\":1700000000000},\"worker_id\":{\"prefill_worker_id\":3,\"decode_worker_id\":4}}}\n\n";
        let usage = "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n";
        let a = content("Hello");
        let b = content(", wor");
        let c = content("ld\n\"q\"");
        let rec = decode(
            &[
                (5, ROLE),
                (40, &a),
                (50, &format!("{b}{c}")),
                (60, &format!("{finish}{usage}data: [DONE]\n\n")),
            ],
            None,
        );
        assert_eq!(rec.outcome, Outcome::Ok);
        assert_eq!(rec.response_id.as_deref(), Some("c1"));
        assert_eq!(rec.reply, "Hello, world\n\"q\"");
        // The role-only chunk at 5 ms is not the first token.
        assert_eq!(rec.ttft(), Some(40 * MS));
        // Two events in one read share the read's instant.
        let stamps: Vec<_> = rec
            .content_chunks()
            .map(|(at, k)| (at - rec.sent, k))
            .collect();
        assert_eq!(stamps, vec![(40 * MS, 1), (50 * MS, 1), (50 * MS, 1)]);
        assert_eq!(rec.finish_reason.as_deref(), Some("length"));
        assert_eq!(
            rec.usage,
            Some(Usage {
                prompt_tokens: 20,
                completion_tokens: 3,
                cached_tokens: 16
            })
        );
        assert_eq!(rec.usage_at, Some(rec.sent + 60 * MS));
        assert_eq!(rec.done, Some(rec.sent + 60 * MS));
        let timing = rec.server_timing.clone().unwrap();
        assert_eq!(timing.ttft_ms, Some(12.5));
        assert_eq!(timing.kv_hit_rate, Some(0.5));
        assert_eq!(timing.prefill_time_ms, None);
        assert!(matches!(
            rec.worker_id,
            Some(WorkerId::Split {
                prefill_worker_id: Some(3),
                decode_worker_id: Some(4),
                ..
            })
        ));
        assert_eq!(rec.latency(), 50 * MS);
        assert_eq!(rec.itl(), Some(5 * MS));
    }

    /// `nvext` is attribution, not the answer: any shape of it, or of its members, leaves a good
    /// stream good, and each member is read on its own.
    #[test]
    fn an_unexpected_nvext_is_ignored_member_by_member() {
        let finish = |nvext: &str| {
            format!(
                "data: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{}},\
                 \"finish_reason\":\"stop\"}}],\"nvext\":{nvext}}}\n\ndata: [DONE]\n\n"
            )
        };
        let a = content("a");
        for (nvext, timing, worker) in [
            (r#""soon""#, None, None),
            ("null", None, None),
            (r#"{"timing":"soon","worker_id":true}"#, None, None),
            (
                r#"{"timing":{"ttft_ms":"x"},"worker_id":7}"#,
                None,
                Some(WorkerId::Id(7)),
            ),
            (
                r#"{"extra":{"a":[1]},"timing":{"ttft_ms":3},"worker_id":"w-1"}"#,
                Some(3.0),
                Some(WorkerId::Name("w-1".into())),
            ),
        ] {
            let rec = decode(&[(10, &a), (20, &finish(nvext))], None);
            assert_eq!(rec.outcome, Outcome::Ok, "{nvext}: {:?}", rec.error);
            assert_eq!(rec.server_timing.and_then(|t| t.ttft_ms), timing, "{nvext}");
            assert_eq!(rec.worker_id, worker, "{nvext}");
        }
    }

    #[test]
    fn reasoning_counts_for_ttft_but_not_for_the_reply() {
        let r1 = "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"think\"}}]}\n\n";
        let r2 = "data: {\"choices\":[{\"delta\":{\"reasoning\":\"more\"}}]}\n\n";
        let rec = decode(
            &[
                (30, r1),
                (35, r2),
                (40, &content("answer")),
                (41, "data: [DONE]\n\n"),
            ],
            None,
        );
        assert_eq!(rec.ttft(), Some(30 * MS));
        assert_eq!(rec.client_tokens(), 3);
        assert_eq!(rec.reply, "answer");
        // Reasoning then content, each spelling counted as reasoning.
        assert!(rec.had_reasoning());
        assert_eq!((rec.reasoning_tokens(), rec.answer_tokens()), (2, 1));
        assert_eq!(rec.time_to_first_reasoning_token(), Some(30 * MS));
        assert_eq!(rec.time_to_first_answer_token(), Some(40 * MS));
        assert_eq!(rec.reasoning_time(), Some(10 * MS));
    }

    #[test]
    fn reasoning_and_answer_are_counted_apart() {
        let reasoning = |field: &str, text: &str| {
            format!("data: {{\"choices\":[{{\"delta\":{{\"{field}\":\"{text}\"}}}}]}}\n\n")
        };
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":5}}\n\n";
        let done = "data: [DONE]\n\n";
        // Content only: no reasoning measures, every token an answer token.
        let (a, b) = (content("a"), content("b"));
        let plain = decode(&[(20, &a), (30, &b), (31, done)], None);
        assert!(!plain.had_reasoning());
        assert_eq!((plain.reasoning_tokens(), plain.answer_tokens()), (0, 2));
        assert_eq!(plain.time_to_first_answer_token(), Some(20 * MS));
        assert_eq!(plain.time_to_first_reasoning_token(), None);
        assert_eq!(plain.reasoning_time(), None);
        // Reasoning only (`reasoning`, newer vLLM's spelling): no answer, no reasoning time.
        let (r1, r2) = (reasoning("reasoning", "x y"), reasoning("reasoning", "z"));
        let only = decode(&[(10, &r1), (15, &r2), (16, done)], Some(&Words));
        assert!(only.had_reasoning());
        assert_eq!((only.reasoning_tokens(), only.answer_tokens()), (3, 0));
        assert_eq!(only.time_to_first_reasoning_token(), Some(10 * MS));
        assert_eq!(only.time_to_first_answer_token(), None);
        assert_eq!(only.reasoning_time(), None);
        assert_eq!(only.ttft(), Some(10 * MS));
        // Usage counts both: the answer is what is left of it after the reasoning.
        let r = reasoning("reasoning_content", "hm");
        let (c1, c2) = (content("a"), content("b"));
        let both = decode(
            &[
                (10, &r),
                (11, &r),
                (12, &r),
                (50, &c1),
                (60, &c2),
                (61, usage),
                (62, done),
            ],
            None,
        );
        assert_eq!((both.reasoning_tokens(), both.answer_tokens()), (3, 2));
        assert_eq!(both.output_tokens(), 5);
        assert_eq!(both.reasoning_time(), Some(40 * MS));
        assert_eq!(both.ttft(), both.time_to_first_reasoning_token());
    }

    #[test]
    fn completions_text_and_missing_cached_tokens() {
        let t1 = "data: {\"id\":\"cmpl-9\",\"choices\":[{\"text\":\"a \"}]}\n\n";
        let t2 = "data: {\"id\":\"cmpl-9\",\"choices\":[{\"text\":\"b c\",\"finish_reason\":\"length\"}]}\n\n";
        let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"prompt_tokens_details\":null}}\n\n";
        let rec = decode(
            &[(10, t1), (20, t2), (21, usage), (22, "data: [DONE]\n\n")],
            Some(&Words),
        );
        assert_eq!(rec.outcome, Outcome::Ok);
        assert_eq!(rec.reply, "a b c");
        assert_eq!(rec.client_tokens(), 3);
        assert_eq!(rec.token_count_disagreement(), Some(0));
        assert_eq!(rec.cached_tokens(), Some(0));
        assert_eq!(rec.token_gaps().collect::<Vec<_>>(), vec![(5 * MS, 2)]);
    }

    type Case<'a> = (Vec<(u32, &'a str)>, Outcome, &'a str);

    #[test]
    fn failures_are_classified() {
        let a = content("x");
        // (reads at millisecond offsets, expected outcome, text in the error)
        let cases: Vec<Case<'_>> = vec![
            (
                vec![(10, &a), (20, "event: error\n: worker died\n\n")],
                Outcome::StreamError,
                "worker died",
            ),
            (
                vec![(10, &a), (20, "event: error\ndata: overloaded\n\n")],
                Outcome::StreamError,
                "overloaded",
            ),
            (
                vec![(
                    10,
                    "data: {\"error\":{\"message\":\"bad things\",\"code\":500}}\n\n",
                )],
                Outcome::StreamError,
                "bad things",
            ),
            (
                vec![(
                    10,
                    "data: {\"object\":\"error\",\"message\":\"vllm says no\",\"code\":400}\n\n",
                )],
                Outcome::StreamError,
                "vllm says no",
            ),
            (
                vec![(10, &a), (20, "data: {oops\n\n")],
                Outcome::BadResponse,
                "unparseable",
            ),
            (
                vec![(10, &a), (20, "data: [1,2]\n\n")],
                Outcome::BadResponse,
                "unparseable",
            ),
            (
                vec![(10, &a), (20, "data: {\"choices\": [{\"delta\": {\"con")],
                Outcome::StreamTruncated,
                "[DONE]",
            ),
            (vec![(10, &a)], Outcome::StreamTruncated, "[DONE]"),
        ];
        for (reads, outcome, needle) in cases {
            let rec = decode(&reads, None);
            assert_eq!(rec.outcome, outcome, "{reads:?}");
            let error = rec.error.clone().unwrap_or_default();
            assert!(error.contains(needle), "{error:?} lacks {needle:?}");
            let last_ms = reads.last().unwrap().0;
            assert_eq!(rec.error_latency(), Some(last_ms * MS));
        }
    }

    #[test]
    fn a_dialect_without_done_ends_at_the_finish_reason_chunk_and_nowhere_else() {
        let finish = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n";
        let (a, b) = (content("a"), content("b"));
        let complete = [(1, ROLE), (10, a.as_str()), (20, b.as_str()), (21, finish)];
        // transformers serve: EOF right after the finish_reason chunk is the end of the stream.
        let rec = decode_with(&complete, None, true);
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        assert_eq!(rec.reply, "ab");
        assert_eq!(rec.finish_reason.as_deref(), Some("length"));
        assert_eq!(rec.usage.unwrap().completion_tokens, 2);
        assert_eq!(rec.done, None);
        // The same bytes in a dialect that ends with `[DONE]`: cut off.
        assert_eq!(
            decode_with(&complete, None, false).outcome,
            Outcome::StreamTruncated
        );
        // No finish_reason yet: cut off in every dialect, half an event included.
        let cut = [(1, ROLE), (10, a.as_str())];
        assert_eq!(
            decode_with(&cut, None, true).outcome,
            Outcome::StreamTruncated
        );
        let half = [(1, ROLE), (10, a.as_str()), (20, &finish[..30])];
        assert_eq!(
            decode_with(&half, None, true).outcome,
            Outcome::StreamTruncated
        );
    }

    /// A chat chunk of `model` (none when empty) for choice `index` (none when `None`), with
    /// `delta` and `finish_reason` as written.
    fn chunk(model: &str, index: Option<u64>, delta: &str, finish: &str) -> String {
        let model = match model {
            "" => String::new(),
            m => format!(",\"model\":{}", serde_json::to_string(m).unwrap()),
        };
        let index = index.map_or(String::new(), |i| format!("\"index\":{i},"));
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\"{model},\"choices\":\
             [{{{index}\"delta\":{{{delta}}},\"finish_reason\":{finish}}}]}}\n\n"
        )
    }

    const DONE: &str = "data: [DONE]\n\n";

    #[test]
    fn content_after_the_finish_reason_breaks_the_stream() {
        let a = chunk("m", Some(0), r#""content":"a""#, "null");
        let stop = chunk("m", Some(0), r#""content":"b""#, r#""stop""#);
        let late = chunk("m", Some(0), r#""content":"c""#, "null");
        let late_reasoning = chunk("m", Some(0), r#""reasoning_content":"hm""#, "null");
        for after in [&late, &late_reasoning] {
            let rec = decode(&[(10, &a), (20, &stop), (30, after), (31, DONE)], None);
            assert_eq!(rec.outcome, Outcome::BadResponse, "{after}");
            let error = rec.error.clone().unwrap();
            assert!(
                error.contains("content after finish_reason \"stop\""),
                "{error}"
            );
            assert_eq!(rec.error_latency(), Some(30 * MS));
        }
        // In one chunk: a choice that finished, then content for it.
        let both = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"},\
                    {\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
        let rec = decode(&[(10, &a), (20, both), (21, DONE)], None);
        assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
        // The finishing chunk may carry the last token; empty deltas and usage may follow.
        let empty = chunk("m", Some(0), r#""content":"""#, "null");
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n";
        let rec = decode(
            &[(10, &a), (20, &stop), (21, &empty), (22, usage), (23, DONE)],
            None,
        );
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        assert_eq!(rec.reply, "ab");
    }

    #[test]
    fn a_second_choice_index_breaks_a_stream_of_one() {
        let zero = chunk("m", Some(0), r#""content":"a""#, "null");
        let one = chunk("m", Some(1), r#""content":"b""#, "null");
        let rec = decode(&[(10, &zero), (20, &zero), (30, &one), (31, DONE)], None);
        assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
        let error = rec.error.unwrap();
        assert!(
            error.contains("a choice with index 1 after index 0"),
            "{error}"
        );
        // One index throughout, or none given: one choice.
        let unnamed = chunk("m", None, r#""content":"b""#, "null");
        let rec = decode(&[(10, &one), (20, &unnamed), (30, &one), (31, DONE)], None);
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        assert_eq!(rec.reply, "bbb");
    }

    #[test]
    fn a_chunk_naming_another_model_breaks_the_stream_where_the_model_is_held() {
        let m = |model: &str, text: &str| {
            chunk(model, Some(0), &format!(r#""content":"{text}""#), "null")
        };
        // The first chunks teach the fast path the stream's shape, the model's bytes with it.
        let (a, b, c) = (m("qwen3", "a"), m("qwen3", "b"), m("qwen3", "c"));
        let other = m("llama\n3", "d");
        let reads = [
            (10, a.as_str()),
            (11, &b),
            (12, &c),
            (13, &other),
            (14, DONE),
        ];
        let rec = decode_for(&reads, None, false, Some("qwen3"));
        assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
        let error = rec.error.clone().unwrap();
        assert!(
            error.contains(r#"the stream is from model "llama\n3", not the requested "qwen3""#),
            "{error}"
        );
        assert_eq!(rec.error_latency(), Some(13 * MS));
        // Not held to a model (the openai and transformers dialects): the same stream is ok.
        let rec = decode_for(&reads, None, false, None);
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        // The model asked for, or none named: ok.
        let unnamed = chunk("", Some(0), r#""content":"e""#, "null");
        let reads = [(10, a.as_str()), (11, &b), (12, &unnamed), (13, DONE)];
        let rec = decode_for(&reads, None, false, Some("qwen3"));
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        // Compared exactly, as sent: an alias or a case change is another model.
        for asked in ["Qwen3", "qwen3 ", "org/qwen3"] {
            let rec = decode_for(&[(10, &a), (11, DONE)], None, false, Some(asked));
            assert_eq!(rec.outcome, Outcome::BadResponse, "{asked:?}");
        }
        // Dynamo writes `model` after `choices`: learnt there, and a change there is seen.
        let tail = |model: &str, text: &str| {
            format!(
                "data: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\
                 \"{text}\"}},\"finish_reason\":null}}],\"created\":1,\"model\":\"{model}\"}}\n\n"
            )
        };
        let (a, b, c, d) = (
            tail("m", "a"),
            tail("m", "b"),
            tail("m", "c"),
            tail("n", "d"),
        );
        let reads = [(10, a.as_str()), (11, &b), (12, &c), (13, DONE)];
        let rec = decode_for(&reads, None, false, Some("m"));
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        assert_eq!(rec.reply, "abc");
        let reads = [(10, a.as_str()), (11, &b), (12, &d), (13, DONE)];
        let rec = decode_for(&reads, None, false, Some("m"));
        assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
    }

    #[test]
    fn unknown_named_events_and_keep_alives_are_ignored() {
        let rec = decode(
            &[
                (1, ": ping\n\n"),
                (2, "event: metrics\ndata: {\"x\":1}\n\n"),
                (3, &content("y")),
                (4, "data: [DONE]\n\n"),
            ],
            None,
        );
        assert_eq!(rec.outcome, Outcome::Ok);
        assert_eq!(rec.reply, "y");
    }

    #[test]
    fn sanitize_respects_char_boundaries() {
        assert_eq!(sanitize("héllo", 2, &NO_SECRETS), "h…");
        assert_eq!(sanitize("hello", 5, &NO_SECRETS), "hello");
    }

    #[test]
    fn sanitize_escapes_what_could_forge_a_log_line_or_drive_a_terminal() {
        let forged = "boom\n2026-12-02T00:00:00Z  INFO llm_canary: all good\r\x1b[2J\u{202e}x\0";
        let safe = sanitize(forged, 1000, &NO_SECRETS);
        assert_eq!(
            safe,
            "boom\\n2026-12-02T00:00:00Z  INFO llm_canary: all good\\r\\u{1b}[2J\\u{202e}x\\u{0}"
        );
        assert!(!safe.chars().any(char::is_control));
        // The cut never splits an escape.
        assert_eq!(sanitize("ab\ncd", 3, &NO_SECRETS), "ab…");
    }

    #[test]
    fn the_targets_secrets_are_masked_out_of_every_text_the_stream_keeps() {
        const KEY: &str = "sk-stream-5ecret";
        let secrets = Secrets::none().with(KEY);
        let frame = |body: &str| {
            let rec = decode_masking(&[(10, body)], None, false, &secrets);
            (rec.outcome, rec.error.unwrap_or_default())
        };
        // An error frame, an error object, an OpenAI error and an unparseable chunk whose
        // preview (80 bytes) would cut through the key: each keeps the rest of what was said.
        for (body, outcome, kept) in [
            (
                format!("event: error\ndata: bad key Bearer {KEY}\n\n"),
                Outcome::StreamError,
                "bad key Bearer ***",
            ),
            (
                format!("data: {{\"object\":\"error\",\"message\":\"who is {KEY}?\"}}\n\n"),
                Outcome::StreamError,
                "who is ***?",
            ),
            (
                format!("data: {{\"error\":{{\"message\":\"denied: {KEY}\"}}}}\n\n"),
                Outcome::StreamError,
                "denied: ***",
            ),
            (
                format!("data: {}{KEY}\n\n", "x".repeat(70)),
                Outcome::BadResponse,
                "xxx***",
            ),
        ] {
            let (got, error) = frame(&body);
            assert_eq!(got, outcome, "{error}");
            assert!(error.contains(kept), "{error:?} lacks {kept:?}");
            assert!(
                !error.contains("5ecret") && !error.contains("sk-str"),
                "{error}"
            );
        }
        // Ids are server text too.
        let chunk = format!(
            "data: {{\"id\":\"{KEY}\",\"choices\":[{{\"delta\":{{\"content\":\"y\"}}}}],\"nvext\":{{\"worker_id\":\"w-{KEY}\"}}}}\n\ndata: [DONE]\n\n"
        );
        let rec = decode_masking(&[(10, &chunk)], None, false, &secrets);
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        assert_eq!(rec.response_id.as_deref(), Some("***"));
        assert_eq!(rec.worker_id, Some(WorkerId::Name("w-***".into())));
    }
}
