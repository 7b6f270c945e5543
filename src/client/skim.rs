//! The fast path of chunk decoding: one walk over a streamed chunk of the common shape (`id`,
//! `object`, `choices` with their deltas, and fields nobody reads), borrowing its strings. It
//! gives up, and the caller takes serde_json's full parse, on anything it would not decode
//! exactly as serde_json does: an escape in any string, a field read for something rarer
//! (`usage`, `nvext`, `error`, `message`), a repeated field, an unexpected type, JSON it does not
//! accept. So a chunk decodes to what serde_json gives it either way, only faster when it is
//! plain: at zero delay, serde_json's generic walk was about half of the client's CPU per token
//! (docs/PERFORMANCE.md).

use std::borrow::Cow;

use smallvec::SmallVec;

use super::stream::{ChoiceJson, ChunkJson, DeltaJson};

/// Deeper nesting than this (in fields nobody reads) is left to serde_json, whose own limit is
/// 128.
const MAX_DEPTH: usize = 64;

/// Decodes `text` into `chunk` (a default one) as serde_json would, when it is plain; `false`
/// to ask serde_json, whose result then replaces whatever was filled in. In place: a chunk is a
/// few hundred bytes, and moving it per token showed in the profile.
pub(super) fn chunk<'a>(text: &'a str, chunk: &mut ChunkJson<'a>) -> bool {
    decode(text, chunk).is_some()
}

fn decode<'a>(text: &'a str, chunk: &mut ChunkJson<'a>) -> Option<()> {
    let mut p = Walk {
        text,
        s: text.as_bytes(),
        i: 0,
    };
    let (mut id, mut object, mut choices) = (false, false, false);
    p.object(|p, key| match key {
        "id" => p.once(&mut id)?.string_or_null().map(|v| chunk.id = v),
        "object" => p
            .once(&mut object)?
            .string_or_null()
            .map(|v| chunk.object = v),
        "choices" => p.once(&mut choices)?.choices().map(|v| chunk.choices = v),
        "usage" | "nvext" | "error" | "message" => None,
        _ => p.skip(0),
    })?;
    p.ws();
    (p.i == p.s.len()).then_some(())
}

/// A position in the chunk's bytes. Every method returns `None` where serde_json's answer is
/// wanted instead.
struct Walk<'a> {
    text: &'a str,
    s: &'a [u8],
    i: usize,
}

impl<'a> Walk<'a> {
    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        (self.peek()? == b).then(|| self.i += 1)
    }

    /// A field seen for the first time (serde_json refuses a repeated one).
    fn once(&mut self, seen: &mut bool) -> Option<&mut Self> {
        (!std::mem::replace(seen, true)).then_some(self)
    }

    /// A string without escapes, borrowed: its quotes are ASCII, so the text between them is
    /// whole characters.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        // One pass: the strings of a chunk are short, too short for memchr's setup to pay.
        let len = self.s[start..]
            .iter()
            .position(|b| matches!(b, b'"' | b'\\' | 0..=0x1f))?;
        let end = start + len;
        // Escapes are serde_json's to undo; raw control characters are invalid JSON.
        if self.s[end] != b'"' {
            return None;
        }
        self.i = end + 1;
        self.text.get(start..end)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.ws();
        let end = self.i + word.len();
        (self.s.get(self.i..end)? == word).then(|| self.i = end)
    }

    fn string_or_null(&mut self) -> Option<Option<Cow<'a, str>>> {
        match self.peek()? {
            b'n' => self.literal(b"null").map(|_| None),
            _ => self.string().map(|s| Some(Cow::Borrowed(s))),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
        self.i - start
    }

    /// JSON's number grammar, strictly: `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        self.ws();
        if self.s.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        let leading_zero = self.s.get(self.i) == Some(&b'0');
        match self.digits() {
            0 => return None,
            n if leading_zero && n > 1 => return None,
            _ => {}
        }
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            (self.digits() > 0).then_some(())?;
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            (self.digits() > 0).then_some(())?;
        }
        Some(())
    }

    /// An object, each field's value read by `field` (which consumes it).
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            field(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array, each element read by `element`.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.i += 1;
            return Some(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Any value nobody reads, checked as JSON.
    fn skip(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => self.object(|p, _| p.skip(depth + 1)),
            b'[' => self.array(|p| p.skip(depth + 1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number(),
        }
    }

    fn choices(&mut self) -> Option<Option<SmallVec<[ChoiceJson<'a>; 1]>>> {
        if self.peek()? == b'n' {
            return self.literal(b"null").map(|_| None);
        }
        let mut out = SmallVec::new();
        self.array(|p| {
            let mut choice = ChoiceJson::default();
            let (mut delta, mut text, mut finish) = (false, false, false);
            p.object(|p, key| match key {
                "delta" => p.once(&mut delta)?.delta().map(|v| choice.delta = v),
                "text" => p.once(&mut text)?.string_or_null().map(|v| choice.text = v),
                "finish_reason" => p
                    .once(&mut finish)?
                    .string_or_null()
                    .map(|v| choice.finish_reason = v),
                _ => p.skip(1),
            })?;
            out.push(choice);
            Some(())
        })?;
        Some(Some(out))
    }

    fn delta(&mut self) -> Option<Option<DeltaJson<'a>>> {
        if self.peek()? == b'n' {
            return self.literal(b"null").map(|_| None);
        }
        let mut delta = DeltaJson::default();
        let (mut content, mut reasoning_content, mut reasoning) = (false, false, false);
        self.object(|p, key| match key {
            "content" => p
                .once(&mut content)?
                .string_or_null()
                .map(|v| delta.content = v),
            "reasoning_content" => p
                .once(&mut reasoning_content)?
                .string_or_null()
                .map(|v| delta.reasoning_content = v),
            "reasoning" => p
                .once(&mut reasoning)?
                .string_or_null()
                .map(|v| delta.reasoning = v),
            _ => p.skip(2),
        })?;
        Some(Some(delta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the decoder reads of a chunk, comparable.
    type View = (
        Option<String>,
        Option<String>,
        Option<Vec<[Option<String>; 5]>>,
        bool,
    );

    fn view(c: &ChunkJson<'_>) -> View {
        let s = |v: &Option<Cow<'_, str>>| v.as_ref().map(|s| s.to_string());
        let choices = c.choices.as_ref().map(|cs| {
            cs.iter()
                .map(|ch| {
                    let d = ch.delta.as_ref();
                    [
                        d.and_then(|d| s(&d.content)),
                        d.and_then(|d| s(&d.reasoning_content)),
                        d.and_then(|d| s(&d.reasoning)),
                        s(&ch.text),
                        s(&ch.finish_reason),
                    ]
                })
                .collect()
        });
        let rare =
            c.usage.is_some() || c.nvext.is_some() || c.error.is_some() || c.message.is_some();
        (s(&c.id), s(&c.object), choices, rare)
    }

    /// Where the fast path answers, serde_json gives the same.
    fn agrees(text: &str) -> Result<bool, TestCaseError> {
        let mut fast = ChunkJson::default();
        if !chunk(text, &mut fast) {
            return Ok(false);
        }
        let full: Result<ChunkJson<'_>, _> = serde_json::from_str(text);
        prop_assert!(
            full.is_ok(),
            "the fast path took what serde_json refuses: {text}"
        );
        prop_assert_eq!(view(&fast), view(&full.unwrap()), "{}", text);
        Ok(true)
    }

    #[test]
    fn plain_chunks_take_the_fast_path_and_decode_as_serde_json_does() {
        let plain = [
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796337192,"model":"Qwen/Qwen3-30B-A3B-FP8","choices":[{"index":0,"delta":{"content":" that"},"finish_reason":null}]}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"length","index":0}],"created":17,"id":"c","model":"m","object":"chat.completion.chunk"}"#,
            r#" { "id" : "x" , "choices" : [ { "text" : "hi" , "logprobs" : { "a" : [ 1.5e-3 , -0 , true , false , null ] } } ] } "#,
            r#"{"choices":[{"delta":{"reasoning_content":"think","content":null}},{"delta":null,"text":null}]}"#,
            r#"{"choices":null,"id":null,"x":{"y":[[],{}]}}"#,
            "{}",
        ];
        for text in plain {
            assert!(agrees(text).unwrap(), "not taken: {text}");
        }
    }

    #[test]
    fn what_it_does_not_decode_exactly_is_left_to_serde_json() {
        let left = [
            // Escapes, rarer fields, repeats, wrong types, invalid JSON.
            r#"{"choices":[{"delta":{"content":"a\"b"}}]}"#,
            r#"{"id":"\u00e9"}"#,
            r#"{"choices":[{"delta":{"content":"a\nb"}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":6,"completion_tokens":3}}"#,
            r#"{"choices":[{"delta":{"content":"a"}}],"nvext":{"timing":{}}}"#,
            r#"{"object":"error","message":"boom"}"#,
            r#"{"id":"a","id":"b"}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"delta":{"content":5}}]}"#,
            r#"{"choices":{}}"#,
            r#"{"created":01}"#,
            r#"{"created":1.}"#,
            r#"{"created":-}"#,
            r#"{"x":tru}"#,
            r#"{"a":1,}"#,
            r#"{"a":1} x"#,
            "{\"a\":\"\u{1}\"}",
            r#"{"a":1"#,
        ];
        for text in left {
            assert!(!agrees(text).unwrap(), "taken: {text}");
        }
        let deep = format!(r#"{{"x":{}1{}}}"#, "[".repeat(80), "]".repeat(80));
        assert!(!agrees(&deep).unwrap());
    }

    fn json_string() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z ]{0,6}".prop_map(|s| format!("\"{s}\"")),
            Just(r#""a\"b""#.to_owned()),
            Just(r#""\u00e9""#.to_owned()),
            Just("\"é日\"".to_owned()),
        ]
    }

    fn json_value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            json_string(),
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("-1.5e3".to_owned()),
            Just("0".to_owned()),
            Just("01".to_owned()),
            Just("7".to_owned()),
        ];
        leaf.prop_recursive(3, 16, 3, |inner| {
            let key = prop_oneof![
                Just("id"),
                Just("object"),
                Just("choices"),
                Just("delta"),
                Just("content"),
                Just("reasoning"),
                Just("reasoning_content"),
                Just("text"),
                Just("finish_reason"),
                Just("usage"),
                Just("index"),
                Just("model"),
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((key, inner), 0..4).prop_map(|fields| {
                    let f: Vec<String> = fields
                        .iter()
                        .map(|(k, v)| format!("\"{k}\": {v}"))
                        .collect();
                    format!("{{{}}}", f.join(", "))
                }),
            ]
        })
    }

    /// A chunk of the streamed shape, its strings drawn from [`json_string`] and one field of
    /// any JSON.
    fn chunk_like() -> impl Strategy<Value = String> {
        let s = || prop_oneof![json_string(), Just("null".to_owned())];
        (s(), s(), s(), s(), s(), json_value()).prop_map(|(id, object, content, reason, finish, any)| {
            format!(
                r#"{{"id":{id},"object":{object},"created":1,"model":{any},"choices":[{{"index":0,"delta":{{"role":"assistant","content":{content},"reasoning_content":{reason}}},"finish_reason":{finish}}}]}}"#
            )
        })
    }

    proptest! {
        /// Random chunk-like JSON, and the same cut or with a byte changed: wherever the fast
        /// path answers, serde_json answers the same.
        #[test]
        fn the_fast_path_never_disagrees_with_serde_json(
            v in prop_oneof![json_value(), chunk_like()],
            cut in any::<prop::sample::Index>(),
            byte in prop::sample::select(&b"{}[],:\"\\ 0a-"[..]),
        ) {
            agrees(&v)?;
            let at = cut.index(v.len() + 1);
            let mut bytes = v.clone().into_bytes();
            bytes.truncate(at);
            if let Ok(cut) = std::str::from_utf8(&bytes) {
                agrees(cut)?;
            }
            let mut changed = v.into_bytes();
            if at < changed.len() {
                changed[at] = byte;
                if let Ok(changed) = std::str::from_utf8(&changed) {
                    agrees(changed)?;
                }
            }
        }
    }
}
