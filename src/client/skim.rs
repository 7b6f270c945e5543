//! The fast path of chunk decoding: one walk over a streamed chunk of the common shape (`id`,
//! `object`, `model`, `choices` with their index and deltas, and fields nobody reads), borrowing
//! its strings. It
//! gives up, and the caller takes serde_json's full parse, on anything it would not decode
//! exactly as serde_json does: an escape in any string, a field read for something rarer
//! (`usage`, `nvext`, `error`, `message`), a repeated field, an unexpected type, JSON it does not
//! accept. So a chunk decodes to what serde_json gives it either way, only faster when it is
//! plain: at zero delay, serde_json's generic walk was about half of the client's CPU per token
//! (docs/PERFORMANCE.md). Faster still, a stream's [`Template`] decodes a chunk that repeats the
//! previous one around its token without walking it; the walk then was 30 % of the client's CPU.

use std::borrow::Cow;

use smallvec::SmallVec;

use super::chunk::{ChoiceJson, ChunkJson, DeltaJson};

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
    let (mut id, mut object, mut model, mut choices) = (false, false, false, false);
    p.object(|p, key| match key {
        "id" => p.once(&mut id)?.string_or_null().map(|v| chunk.id = v),
        "object" => p
            .once(&mut object)?
            .string_or_null()
            .map(|v| chunk.object = v),
        "model" => p
            .once(&mut model)?
            .string_or_null()
            .map(|v| chunk.model = v),
        "choices" => p.once(&mut choices)?.choices().map(|v| chunk.choices = v),
        "usage" | "nvext" | "error" | "message" => None,
        _ => p.skip(0),
    })?;
    p.ws();
    (p.i == p.s.len()).then_some(())
}

/// The string a token changes: a stream's plain chunks differ, token to token, only in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Content,
    ReasoningContent,
    Reasoning,
    Text,
}

/// The previous plain chunk of a stream, cut around its one string that changes from token to
/// token (`delta.content`, `delta.reasoning_content`, `delta.reasoning` or `text`): a server
/// writes every other byte of a stream's chunks the same way (its id, `created`, model, index,
/// `finish_reason: null`), so those decode as the learnt chunk's: its index is kept as a value,
/// its `id`, `object` and `model` as where they lie in the bytes. A chunk that is the same bytes before and after that string, with
/// nothing in the string that ends or escapes it, is the same JSON with another string, and
/// decodes to the same fields with the new text, without a walk: two comparisons and a scan of
/// the token. Anything else (the role chunk, the `finish_reason` chunk, a new `created`) takes
/// the walk, which teaches the template the new shape.
#[derive(Default)]
pub(super) struct Template {
    /// The bytes through the string's opening quote.
    head: Vec<u8>,
    /// The bytes from its closing quote to the end.
    tail: Vec<u8>,
    /// `None` until a chunk of the one-string shape has been walked.
    shape: Option<Shape>,
}

#[derive(Clone, Debug)]
struct Shape {
    field: Field,
    /// Whether the choice had a `delta` object (for `text`, whose delta may be absent).
    delta: bool,
    /// Where `id` and `object` are in the head, when they are strings.
    id: Option<std::ops::Range<usize>>,
    object: Option<std::ops::Range<usize>>,
    /// Where `model` is, when it is a string: in the head, or in the tail (Dynamo writes it after
    /// `choices`).
    model: Option<Place>,
    /// The choice's `index`.
    index: Option<u64>,
}

/// Where a string of the learnt chunk lies: in the head (a range from the start), or in the tail
/// (`back` bytes before the end, `len` long), which a chunk the template takes ends with.
#[derive(Clone, Debug)]
enum Place {
    Head(std::ops::Range<usize>),
    Tail { back: usize, len: usize },
}

impl Template {
    /// Decodes the event data `b` into `chunk` (a default one) when it is the learnt chunk with
    /// only the token's string changed; `false` otherwise, with `chunk` untouched. Only the token
    /// is checked as UTF-8: the rest is the bytes of a chunk that was, cut at ASCII quotes.
    pub(super) fn decode<'a>(&self, b: &'a [u8], chunk: &mut ChunkJson<'a>) -> bool {
        let Some(shape) = &self.shape else {
            return false;
        };
        let (h, t) = (self.head.len(), self.tail.len());
        if b.len() < h + t || !b.starts_with(&self.head) || !b.ends_with(&self.tail) {
            return false;
        }
        let token = &b[h..b.len() - t];
        if token.iter().any(|c| matches!(c, b'"' | b'\\' | 0..=0x1f)) {
            return false;
        }
        let Ok(token) = std::str::from_utf8(token) else {
            return false;
        };
        // `id`, `object` and `model` are in the head or the tail, checked again (short) rather
        // than trusted unsafely.
        let at = |r: Option<std::ops::Range<usize>>| match r {
            None => Some(None),
            Some(r) => std::str::from_utf8(&b[r])
                .ok()
                .map(|s| Some(Cow::Borrowed(s))),
        };
        let model = shape.model.as_ref().map(|place| match place {
            Place::Head(r) => r.clone(),
            Place::Tail { back, len } => b.len() - back..b.len() - back + len,
        });
        let (Some(id), Some(object), Some(model)) =
            (at(shape.id.clone()), at(shape.object.clone()), at(model))
        else {
            return false;
        };
        let token = Some(Cow::Borrowed(token));
        chunk.id = id;
        chunk.object = object;
        chunk.model = model;
        let mut choice = ChoiceJson {
            index: shape.index,
            ..ChoiceJson::default()
        };
        let mut delta = DeltaJson::default();
        match shape.field {
            Field::Content => delta.content = token,
            Field::ReasoningContent => delta.reasoning_content = token,
            Field::Reasoning => delta.reasoning = token,
            Field::Text => choice.text = token,
        }
        choice.delta = shape.delta.then_some(delta);
        chunk.choices = Some(SmallVec::from_buf([choice]));
        true
    }

    /// Learns from a chunk the walk decoded from `text`: its shape when it has one choice, no
    /// `finish_reason`, exactly one of the token strings (borrowed from `text`) and its `id` and
    /// `object` before that string (its `model` anywhere); forgets the last shape otherwise.
    pub(super) fn learn(&mut self, text: &str, chunk: &ChunkJson<'_>) {
        self.shape = Self::shape_of(text, chunk).map(|(shape, token)| {
            self.head.clear();
            self.head.extend_from_slice(&text.as_bytes()[..token.start]);
            self.tail.clear();
            self.tail.extend_from_slice(&text.as_bytes()[token.end..]);
            shape
        });
    }

    fn shape_of(text: &str, chunk: &ChunkJson<'_>) -> Option<(Shape, std::ops::Range<usize>)> {
        let [choice] = chunk.choices.as_deref()? else {
            return None;
        };
        if choice.finish_reason.is_some() {
            return None;
        }
        let mut strings = [
            (Field::Text, &choice.text),
            (Field::Content, &None),
            (Field::ReasoningContent, &None),
            (Field::Reasoning, &None),
        ];
        if let Some(d) = &choice.delta {
            strings[1].1 = &d.content;
            strings[2].1 = &d.reasoning_content;
            strings[3].1 = &d.reasoning;
        }
        let mut present = strings.iter().filter(|(_, s)| s.is_some());
        let (field, token) = present.next()?;
        if present.next().is_some() {
            return None;
        }
        let Some(Cow::Borrowed(token)) = token else {
            return None;
        };
        let token = span(text, token)?;
        // An owned string is an unescaped copy (never from the walk): not in the bytes.
        let before = |s: &Option<Cow<'_, str>>| match s {
            None => Some(None),
            Some(Cow::Borrowed(s)) => span(text, s).filter(|r| r.end < token.start).map(Some),
            Some(Cow::Owned(_)) => None,
        };
        let model = match &chunk.model {
            None => None,
            Some(Cow::Borrowed(s)) => {
                let r = span(text, s)?;
                Some(if r.end < token.start {
                    Place::Head(r)
                } else {
                    Place::Tail {
                        back: text.len() - r.start,
                        len: r.len(),
                    }
                })
            }
            Some(Cow::Owned(_)) => return None,
        };
        let shape = Shape {
            field: *field,
            delta: choice.delta.is_some(),
            id: before(&chunk.id)?,
            object: before(&chunk.object)?,
            model,
            index: choice.index,
        };
        Some((shape, token))
    }
}

/// Where `s`, borrowed from `text`, lies in it.
fn span(text: &str, s: &str) -> Option<std::ops::Range<usize>> {
    let start = (s.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    (start + s.len() <= text.len()).then(|| start..start + s.len())
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

    /// A choice's `index`: `null`, or digits without a leading zero that fit a `u64`, as
    /// serde_json reads them; a sign, a fraction, an exponent or an overflow is left to it.
    fn index(&mut self) -> Option<Option<u64>> {
        if self.peek()? == b'n' {
            return self.literal(b"null").map(|_| None);
        }
        let start = self.i;
        let n = self.digits();
        let leading_zero = n > 1 && self.s[start] == b'0';
        if n == 0 || leading_zero || matches!(self.s.get(self.i), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        self.text.get(start..self.i)?.parse().ok().map(Some)
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
            let (mut index, mut delta, mut text, mut finish) = (false, false, false, false);
            p.object(|p, key| match key {
                "index" => p.once(&mut index)?.index().map(|v| choice.index = v),
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
    type View = ([Option<String>; 3], Option<Vec<[Option<String>; 6]>>, bool);

    fn view(c: &ChunkJson<'_>) -> View {
        let s = |v: &Option<Cow<'_, str>>| v.as_ref().map(|s| s.to_string());
        let choices = c.choices.as_ref().map(|cs| {
            cs.iter()
                .map(|ch| {
                    let d = ch.delta.as_ref();
                    [
                        ch.index.map(|i| i.to_string()),
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
        ([s(&c.id), s(&c.object), s(&c.model)], choices, rare)
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

    #[test]
    fn the_index_and_the_model_decode_as_serde_json_does() {
        let taken = [
            r#"{"model":"Qwen/Qwen3-30B-A3B-FP8","choices":[{"index":0,"delta":{"content":"a"}}]}"#,
            r#"{"model":null,"choices":[{"index":null,"text":"a"}]}"#,
            r#"{"choices":[{"index": 17 ,"text":"a"}],"model":"m"}"#,
            r#"{"choices":[{"index":18446744073709551615}]}"#,
        ];
        for text in taken {
            assert!(agrees(text).unwrap(), "not taken: {text}");
        }
        let left = [
            r#"{"choices":[{"index":-1}]}"#,
            r#"{"choices":[{"index":-0}]}"#,
            r#"{"choices":[{"index":01}]}"#,
            r#"{"choices":[{"index":1.0}]}"#,
            r#"{"choices":[{"index":1e2}]}"#,
            r#"{"choices":[{"index":"0"}]}"#,
            r#"{"choices":[{"index":18446744073709551616}]}"#,
            r#"{"choices":[{"index":0,"index":0}]}"#,
            r#"{"model":5}"#,
            r#"{"model":"a\/b"}"#,
            r#"{"model":"a","model":"a"}"#,
        ];
        for text in left {
            assert!(!agrees(text).unwrap(), "taken: {text}");
        }
        let mut chunk = ChunkJson::default();
        assert!(super::chunk(taken[2], &mut chunk));
        assert_eq!(chunk.model.as_deref(), Some("m"));
        assert_eq!(chunk.choices.as_ref().unwrap()[0].index, Some(17));
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

    /// A chunk with one token string (in any of the fields that carry one), the rest drawn
    /// as in [`chunk_like`].
    fn one_token_chunk() -> impl Strategy<Value = String> {
        let field = prop::sample::select(&["content", "reasoning_content", "reasoning"][..]);
        let s = || prop_oneof![json_string(), Just("null".to_owned())];
        (s(), s(), field, "[a-z ]{0,6}", json_value(), any::<bool>()).prop_map(
            |(id, object, field, token, any, text)| {
                let choice = match text {
                    true => format!(r#""text":"{token}","logprobs":{any}"#),
                    false => format!(r#""delta":{{"{field}":"{token}","x":{any}}}"#),
                };
                format!(
                    r#"{{"id":{id},"object":{object},"created":1,"choices":[{{"index":0,{choice},"finish_reason":null}}],"model":"m"}}"#
                )
            },
        )
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

    /// Decodes `text` as the stream decoder does (the template, else the walk, which teaches the
    /// template, else serde_json) and checks the answer against serde_json's; whether the
    /// template answered.
    fn through(template: &mut Template, text: &str) -> Result<bool, TestCaseError> {
        let full: Result<ChunkJson<'_>, _> = serde_json::from_str(text);
        let mut fast = ChunkJson::default();
        let hit = template.decode(text.as_bytes(), &mut fast);
        if hit {
            prop_assert!(
                full.is_ok(),
                "the template took what serde_json refuses: {text}"
            );
        } else if chunk(text, &mut fast) {
            template.learn(text, &fast);
        } else {
            return Ok(false);
        }
        prop_assert_eq!(view(&fast), view(&full.unwrap()), "{}", text);
        Ok(hit)
    }

    #[test]
    fn a_stream_repeats_its_chunk_around_the_token_and_the_template_decodes_it() {
        let chat = |delta: &str, finish: &str| {
            format!(
                r#"{{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1796337192,"model":"m","choices":[{{"index":0,"delta":{{{delta}}},"logprobs":null,"finish_reason":{finish}}}]}}"#
            )
        };
        let text = |t: &str| {
            format!(
                r#"{{"id":"cmpl-1","object":"text_completion","choices":[{{"index":0,"text":"{t}","finish_reason":null}}]}}"#
            )
        };
        // (chunk, whether the template answers it)
        let stream = [
            (chat(r#""role":"assistant","content":"""#, "null"), false),
            (chat(r#""content":" The""#, "null"), false),
            (chat(r#""content":" sky""#, "null"), true),
            (chat(r#""content":" is blue, 日本""#, "null"), true),
            (chat(r#""content":"""#, "null"), true),
            // An escape in the token: serde_json's; the shape stays learnt.
            (chat(r#""content":"a\"b""#, "null"), false),
            (chat(r#""content":" again""#, "null"), true),
            (chat(r#""reasoning_content":"hm""#, "null"), false),
            (chat(r#""reasoning_content":" so""#, "null"), true),
            (chat(r#""content":null,"reasoning":"x""#, "null"), false),
            (chat(r#""content":null,"reasoning":"y""#, "null"), true),
            // Two strings that change: never learnt.
            (chat(r#""content":"a","reasoning":"b""#, "null"), false),
            (chat(r#""content":"c","reasoning":"b""#, "null"), false),
            (chat(r#""content":" end""#, "null"), false),
            (chat(r#""content":" end""#, r#""length""#), false),
            (chat("", r#""stop""#), false),
            (text("one"), false),
            (text(" two"), true),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":6,"completion_tokens":3}}"#.into(),
                false,
            ),
            (text(" three"), true),
        ];
        let mut template = Template::default();
        for (text, hit) in &stream {
            assert_eq!(through(&mut template, text).unwrap(), *hit, "{text}");
        }
        // Head and tail as learnt, but a quote in between: another field, not the token.
        let mut template = Template::default();
        assert!(!through(&mut template, &chat(r#""content":"a""#, "null")).unwrap());
        assert!(!through(&mut template, &chat(r#""content":"b","x":"c""#, "null")).unwrap());
        // The id after the token: not learnt, as its bytes are not in the head.
        let late = |t: &str| format!(r#"{{"choices":[{{"delta":{{"content":"{t}"}}}}],"id":"c"}}"#);
        let mut template = Template::default();
        assert!(!through(&mut template, &late("a")).unwrap());
        assert!(!through(&mut template, &late("b")).unwrap());
    }

    #[test]
    fn a_token_that_is_not_utf8_is_left_to_the_full_path() {
        let first = r#"{"id":"c","choices":[{"delta":{"content":"a"}}]}"#;
        let mut template = Template::default();
        let mut chunk = ChunkJson::default();
        assert!(super::chunk(first, &mut chunk));
        template.learn(first, &chunk);
        let mut next = first.as_bytes().to_vec();
        let at = first.find(r#""a""#).unwrap() + 1;
        next[at] = 0xff;
        assert!(!template.decode(&next, &mut ChunkJson::default()));
        next[at] = b'b';
        let mut chunk = ChunkJson::default();
        assert!(template.decode(&next, &mut chunk));
        let delta = chunk.choices.as_ref().unwrap()[0].delta.as_ref().unwrap();
        assert_eq!(delta.content.as_deref(), Some("b"));
        assert_eq!(chunk.id.as_deref(), Some("c"));
    }

    proptest! {
        /// A learnt chunk, then the same with another token, and that with a byte changed
        /// anywhere: the template answers the plain token, and wherever it answers, serde_json
        /// answers the same.
        #[test]
        fn the_template_never_disagrees_with_serde_json(
            first in one_token_chunk(),
            token in json_string(),
            at in any::<prop::sample::Index>(),
            byte in prop::sample::select(&b"{}[],:\"\\ 0a-"[..]),
        ) {
            let mut template = Template::default();
            through(&mut template, &first)?;
            // Learnt, unless an escape sent the first chunk to serde_json (or it is not JSON).
            let valid = serde_json::from_str::<ChunkJson<'_>>(&first).is_ok();
            let learnt = valid && !first.contains('\\');
            prop_assert_eq!(template.shape.is_some(), learnt, "{}", first);
            if template.shape.is_none() {
                return Ok(());
            }
            let (h, t) = (template.head.len(), template.tail.len());
            let next = format!("{}{token}{}", &first[..h - 1], &first[first.len() - t + 1..]);
            prop_assert_eq!(through(&mut template, &next)?, !token.contains('\\'), "{}", next);
            let mut changed = next.into_bytes();
            let i = at.index(changed.len());
            changed[i] = byte;
            if let Ok(changed) = std::str::from_utf8(&changed) {
                through(&mut template, changed)?;
            }
        }
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
