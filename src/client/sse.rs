//! Incremental Server-Sent Events parser for streamed completions: bytes in (split anywhere, LF,
//! CRLF or lone CR line endings), events out, with a hard cap on the size of one line or event.
//!
//! It sits on the measurement hot path, so it avoids copying: a line that lies inside one network
//! read is handed out as a [`Bytes`] slice of that read (a reference count, no allocation). Only a
//! line split across reads is copied into a reusable carry buffer, and only an event with several
//! `data:` lines is joined into a fresh buffer.
//!
//! Deviation from the WHATWG algorithm, on purpose: an event is dispatched when it has data *or* an
//! event name, and it keeps its first comment line. Servers report mid-stream failures as
//! `event: error` followed by the message in a comment line and no `data:`; the browser algorithm
//! would drop that frame, and the canary must see it.

use bytes::{Buf, Bytes, BytesMut};

/// The default cap on one line and on one event's accumulated fields: 1 MiB. A completion chunk is
/// a few hundred bytes; anything near this is a broken or hostile server.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Why the parser gave up. After an error the parser stays failed: the stream is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("SSE line longer than {limit} bytes")]
    LineTooLong { limit: usize },
    #[error("SSE event larger than {limit} bytes")]
    EventTooLarge { limit: usize },
}

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field; `None` means the default type, `message`.
    pub event: Option<Bytes>,
    /// The `data:` lines joined with `\n`.
    pub data: Bytes,
    /// The first comment line of the event (text after `:`, one leading space removed).
    pub comment: Option<Bytes>,
}

impl SseEvent {
    /// The event type, `message` when the frame named none.
    pub fn name(&self) -> &[u8] {
        self.event.as_deref().unwrap_or(b"message")
    }

    /// An `event: error` frame.
    pub fn is_error(&self) -> bool {
        self.name() == b"error"
    }

    /// The OpenAI end-of-stream sentinel `data: [DONE]`.
    pub fn is_done(&self) -> bool {
        self.data.trim_ascii() == b"[DONE]"
    }
}

/// The data of the event being assembled. One `data:` line (the normal case) stays a zero-copy
/// slice; a second line switches to an owned, joined buffer.
#[derive(Debug, Default)]
enum DataBuf {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl DataBuf {
    fn push(&mut self, value: Bytes) {
        *self = match std::mem::take(self) {
            DataBuf::Empty => DataBuf::One(value),
            DataBuf::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + 1 + value.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(b"\n");
                joined.extend_from_slice(&value);
                DataBuf::Many(joined)
            }
            DataBuf::Many(mut joined) => {
                joined.extend_from_slice(b"\n");
                joined.extend_from_slice(&value);
                DataBuf::Many(joined)
            }
        }
    }

    fn take(&mut self) -> Bytes {
        match std::mem::take(self) {
            DataBuf::Empty => Bytes::new(),
            DataBuf::One(data) => data,
            DataBuf::Many(joined) => joined.freeze(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            DataBuf::Empty => true,
            DataBuf::One(data) => data.is_empty(),
            DataBuf::Many(_) => false,
        }
    }
}

/// The incremental parser. Feed each network read with [`SseParser::feed`], then drain events with
/// [`SseParser::next_event`] until it returns `Ok(None)`; at end of stream call
/// [`SseParser::finish`].
#[derive(Debug)]
pub struct SseParser {
    max_event_bytes: usize,
    /// The unconsumed rest of the current read.
    input: Bytes,
    /// The beginning of a line whose end has not arrived yet.
    carry: BytesMut,
    /// The previous line ended in CR: an LF that follows, even in the next read, is part of the
    /// same line ending (CRLF), not an empty line.
    after_cr: bool,
    /// No line has been produced yet: the first one may start with a byte-order mark.
    at_start: bool,
    event: Option<Bytes>,
    data: DataBuf,
    comment: Option<Bytes>,
    /// Bytes held by the event being assembled, checked against the cap.
    event_bytes: usize,
    /// At least one field or comment line of the pending event has been seen.
    pending: bool,
    failed: Option<SseError>,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser that fails when one line, or the fields of one event, exceed `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            max_event_bytes,
            input: Bytes::new(),
            carry: BytesMut::new(),
            after_cr: false,
            at_start: true,
            event: None,
            data: DataBuf::Empty,
            comment: None,
            event_bytes: 0,
            pending: false,
            failed: None,
        }
    }

    /// Hands the parser the next network read. Call [`SseParser::next_event`] until it returns
    /// `Ok(None)` before feeding again; bytes left unconsumed would otherwise be appended, which is
    /// correct but copies.
    pub fn feed(&mut self, chunk: Bytes) {
        if self.input.is_empty() {
            self.input = chunk;
        } else {
            // The caller fed twice without draining: keep both, in order.
            let mut joined = BytesMut::with_capacity(self.input.len() + chunk.len());
            joined.extend_from_slice(&self.input);
            joined.extend_from_slice(&chunk);
            self.input = joined.freeze();
        }
    }

    /// The next complete event in the bytes fed so far, `Ok(None)` when more bytes are needed.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        loop {
            let line = match self.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => return Ok(None),
                Err(err) => return Err(self.fail(err)),
            };
            if line.is_empty() {
                if let Some(event) = self.dispatch() {
                    return Ok(Some(event));
                }
                continue;
            }
            if let Err(err) = self.field(line) {
                return Err(self.fail(err));
            }
        }
    }

    /// End of stream. Returns the pending event when all its lines were complete and only the
    /// closing blank line is missing; an unterminated last line may be a cut-off fragment, so it is
    /// discarded (the caller then sees no `[DONE]` and calls the stream truncated).
    pub fn finish(&mut self) -> Option<SseEvent> {
        if self.failed.is_some() {
            return None;
        }
        let cut_off = !self.carry.is_empty() || !self.input.is_empty();
        self.carry.clear();
        self.input = Bytes::new();
        if cut_off {
            self.reset_event();
            return None;
        }
        self.dispatch()
    }

    fn fail(&mut self, err: SseError) -> SseError {
        self.failed = Some(err.clone());
        self.input = Bytes::new();
        self.carry = BytesMut::new();
        self.reset_event();
        err
    }

    /// The next line without its terminator, `None` when the current read holds no line end.
    fn next_line(&mut self) -> Result<Option<Bytes>, SseError> {
        if self.after_cr {
            match self.input.first() {
                None => return Ok(None),
                Some(b'\n') => {
                    let _ = self.input.split_to(1);
                    self.after_cr = false;
                }
                Some(_) => self.after_cr = false,
            }
        }
        let limit = self.max_event_bytes;
        let Some(end) = memchr::memchr2(b'\n', b'\r', &self.input) else {
            if self.carry.len() + self.input.len() > limit {
                return Err(SseError::LineTooLong { limit });
            }
            if !self.input.is_empty() {
                self.carry.extend_from_slice(&self.input);
                self.input = Bytes::new();
            }
            return Ok(None);
        };
        if self.carry.len() + end > limit {
            return Err(SseError::LineTooLong { limit });
        }
        self.after_cr = self.input[end] == b'\r';
        if end == 0 && self.carry.is_empty() && !self.at_start {
            // The blank line that ends every event: no slice of the read to count references to.
            self.input.advance(1);
            return Ok(Some(Bytes::new()));
        }
        let mut line = self.input.split_to(end + 1);
        line.truncate(end);
        let mut line = if self.carry.is_empty() {
            line
        } else {
            self.carry.extend_from_slice(&line);
            self.carry.split().freeze()
        };
        if self.at_start {
            self.at_start = false;
            if line.starts_with(BOM) {
                let _ = line.split_to(BOM.len());
            }
        }
        Ok(Some(line))
    }

    /// Applies one non-empty line to the pending event. A value is sliced out of the line only
    /// where it is kept: every token passes through here.
    fn field(&mut self, mut line: Bytes) -> Result<(), SseError> {
        self.pending = true;
        if line[0] == b':' {
            if self.comment.is_none() {
                line.advance(value_start(&line, 1));
                self.grow(line.len())?;
                self.comment = Some(line);
            }
            return Ok(());
        }
        let (name_end, value_at) = match memchr::memchr(b':', &line) {
            Some(colon) => (colon, value_start(&line, colon + 1)),
            None => (line.len(), line.len()),
        };
        match &line[..name_end] {
            b"data" => {
                line.advance(value_at);
                self.grow(line.len() + 1)?;
                self.data.push(line);
            }
            b"event" => {
                line.advance(value_at);
                self.grow(line.len())?;
                self.event = Some(line);
            }
            // `id` and `retry` steer browser reconnection, which a measurement client never does;
            // unknown fields are ignored by the standard.
            _ => {}
        }
        Ok(())
    }

    fn grow(&mut self, bytes: usize) -> Result<(), SseError> {
        self.event_bytes += bytes;
        if self.event_bytes > self.max_event_bytes {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        Ok(())
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        if !self.pending {
            return None;
        }
        let wanted = !self.data.is_empty() || self.event.is_some();
        let event = SseEvent {
            event: self.event.take(),
            data: self.data.take(),
            comment: self.comment.take(),
        };
        self.reset_event();
        // A frame of comments only is a keep-alive, not an event.
        wanted.then_some(event)
    }

    fn reset_event(&mut self) {
        self.event = None;
        self.data = DataBuf::Empty;
        self.comment = None;
        self.event_bytes = 0;
        self.pending = false;
    }
}

/// Where a field's value starts in `line`, its text beginning at `at`: one leading space is
/// not part of it.
fn value_start(line: &[u8], at: usize) -> usize {
    if line.get(at) == Some(&b' ') {
        at + 1
    } else {
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Parses `reads` in order; returns the events and the first error, if any.
    fn parse_reads(max: usize, reads: &[&[u8]]) -> (Vec<SseEvent>, Option<SseError>) {
        let mut parser = SseParser::new(max);
        let mut events = Vec::new();
        for read in reads {
            parser.feed(Bytes::copy_from_slice(read));
            loop {
                match parser.next_event() {
                    Ok(Some(event)) => events.push(event),
                    Ok(None) => break,
                    Err(err) => return (events, Some(err)),
                }
            }
        }
        events.extend(parser.finish());
        (events, None)
    }

    fn parse_all(input: &[u8]) -> Vec<SseEvent> {
        let (events, err) = parse_reads(DEFAULT_MAX_EVENT_BYTES, &[input]);
        assert_eq!(err, None);
        events
    }

    fn data(text: &str) -> SseEvent {
        SseEvent {
            data: Bytes::copy_from_slice(text.as_bytes()),
            ..SseEvent::default()
        }
    }

    #[test]
    fn openai_stream_with_done() {
        let events = parse_all(b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n");
        assert_eq!(events.len(), 3);
        assert_eq!(events[0], data("{\"a\":1}"));
        assert_eq!(events[1], data("{\"a\":2}"));
        assert!(events[2].is_done());
        assert!(!events[0].is_done());
    }

    #[test]
    fn all_line_endings_give_the_same_events() {
        let lf = parse_all(b"event: x\ndata: a\ndata: b\n\ndata: c\n\n");
        let crlf = parse_all(b"event: x\r\ndata: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n");
        let cr = parse_all(b"event: x\rdata: a\rdata: b\r\rdata: c\r\r");
        let mixed = parse_all(b"event: x\r\ndata: a\rdata: b\n\r\ndata: c\r\n\n");
        assert_eq!(lf.len(), 2);
        assert_eq!(lf[0].event.as_deref(), Some(&b"x"[..]));
        assert_eq!(&lf[0].data[..], b"a\nb");
        assert_eq!(&lf[1].data[..], b"c");
        assert_eq!(lf, crlf);
        assert_eq!(lf, cr);
        assert_eq!(lf, mixed);
    }

    #[test]
    fn crlf_split_between_reads_is_one_line_ending() {
        let (events, err) = parse_reads(1024, &[b"data: a\r", b"\n", b"\r", b"\ndata: b\r\n\r\n"]);
        assert_eq!(err, None);
        assert_eq!(events, vec![data("a"), data("b")]);
    }

    #[test]
    fn comments_are_not_events_but_ride_along_with_a_named_event() {
        let events = parse_all(b": keep-alive\n\nevent: error\n: upstream worker died\n\n");
        assert_eq!(events.len(), 1);
        assert!(events[0].is_error());
        assert!(events[0].data.is_empty());
        assert_eq!(
            events[0].comment.as_deref(),
            Some(&b"upstream worker died"[..])
        );
    }

    #[test]
    fn field_parsing_follows_the_standard() {
        // No space after the colon, only one leading space stripped, a bare field name, and
        // unknown fields ignored.
        let events = parse_all(
            b"data:x\n\ndata:  two\n\ndata\ndata\n\nid: 7\nretry: 10\nfoo: bar\ndata: y\n\n",
        );
        assert_eq!(events, vec![data("x"), data(" two"), data("\n"), data("y")]);
        assert_eq!(events[0].name(), b"message");
    }

    #[test]
    fn a_byte_order_mark_at_the_start_is_ignored() {
        let (events, err) = parse_reads(1024, &[b"\xEF\xBB", b"\xBFdata: a\n\n"]);
        assert_eq!(err, None);
        assert_eq!(events, vec![data("a")]);
    }

    #[test]
    fn single_line_events_are_slices_of_the_read() {
        let read = Bytes::from_static(b"data: hello\n\n");
        let mut parser = SseParser::default();
        parser.feed(read.clone());
        let event = parser.next_event().unwrap().unwrap();
        let start = read.as_ptr() as usize;
        let data_at = event.data.as_ptr() as usize;
        assert!(
            data_at >= start && data_at < start + read.len(),
            "data was copied"
        );
    }

    #[test]
    fn end_of_stream_keeps_complete_lines_and_drops_a_cut_off_one() {
        assert_eq!(parse_all(b"data: [DONE]\n"), vec![data("[DONE]")]);
        assert_eq!(parse_all(b"data: [DONE]\r"), vec![data("[DONE]")]);
        assert!(parse_all(b"data: {\"choi").is_empty());
        assert!(parse_all(b"data: a\n\ndata: {\"cho").len() == 1);
    }

    #[test]
    fn an_oversize_line_fails_without_buffering_it() {
        let mut parser = SseParser::new(64);
        parser.feed(Bytes::from_static(b"data: ok\n\n"));
        assert_eq!(parser.next_event().unwrap(), Some(data("ok")));
        // Unterminated: the carry must not grow past the cap even though no line end is seen.
        for _ in 0..6 {
            parser.feed(Bytes::from_static(b"0123456789"));
            assert_eq!(parser.next_event(), Ok(None));
        }
        assert_eq!(parser.carry.len(), 60);
        parser.feed(Bytes::from_static(b"0123456789"));
        assert_eq!(
            parser.next_event(),
            Err(SseError::LineTooLong { limit: 64 })
        );
        // The partial line is released, not kept.
        assert_eq!(parser.carry.capacity(), 0);
        // The failure is sticky.
        parser.feed(Bytes::from_static(b"\n\ndata: x\n\n"));
        assert!(parser.next_event().is_err());
        assert_eq!(parser.finish(), None);
    }

    #[test]
    fn an_oversize_line_inside_one_read_fails_too() {
        let mut long = b"data: ".to_vec();
        long.extend(std::iter::repeat_n(b'x', 100));
        long.extend_from_slice(b"\n\n");
        let (events, err) = parse_reads(64, &[&long]);
        assert!(events.is_empty());
        assert_eq!(err, Some(SseError::LineTooLong { limit: 64 }));
    }

    #[test]
    fn many_small_data_lines_hit_the_event_cap() {
        let input = b"data: 0123456789\n".repeat(10);
        let (events, err) = parse_reads(64, &[&input]);
        assert!(events.is_empty());
        assert_eq!(err, Some(SseError::EventTooLarge { limit: 64 }));
    }

    /// One generated event: optional name, comment, data lines, each line with its own ending.
    #[derive(Debug, Clone)]
    struct GenEvent {
        name: Option<String>,
        comment: Option<String>,
        data: Vec<String>,
        endings: Vec<&'static str>,
    }

    fn gen_event() -> impl Strategy<Value = GenEvent> {
        let text = "[ -~]{0,12}".prop_filter("no line breaks", |s: &String| {
            !s.contains('\n') && !s.contains('\r')
        });
        let name = proptest::option::of("[a-z]{1,8}");
        let comment = proptest::option::of(text.clone());
        let data = proptest::collection::vec(text, 0..4);
        let endings =
            proptest::collection::vec(prop_oneof![Just("\n"), Just("\r\n"), Just("\r")], 8);
        (name, comment, data, endings).prop_map(|(name, comment, data, endings)| GenEvent {
            name,
            comment,
            data,
            endings,
        })
    }

    impl GenEvent {
        fn write(&self, out: &mut Vec<u8>) {
            let mut endings = self.endings.iter().cycle();
            let mut line = |out: &mut Vec<u8>, text: String| {
                let mut ending = *endings.next().unwrap();
                // An empty line ended by LF right after a lone CR would read as one CRLF: that
                // stream means something else, so write the blank line as CRLF instead.
                if text.is_empty() && ending == "\n" && out.last() == Some(&b'\r') {
                    ending = "\r\n";
                }
                out.extend_from_slice(text.as_bytes());
                out.extend_from_slice(ending.as_bytes());
            };
            if let Some(comment) = &self.comment {
                line(out, format!(":{comment}"));
            }
            if let Some(name) = &self.name {
                line(out, format!("event: {name}"));
            }
            for data in &self.data {
                line(out, format!("data: {data}"));
            }
            line(out, String::new());
        }

        /// What the parser must produce for this frame, if anything.
        fn expected(&self) -> Option<SseEvent> {
            let joined = self.data.join("\n");
            if joined.is_empty() && self.name.is_none() {
                return None;
            }
            Some(SseEvent {
                event: self
                    .name
                    .as_ref()
                    .map(|n| Bytes::copy_from_slice(n.as_bytes())),
                data: Bytes::copy_from_slice(joined.as_bytes()),
                comment: self
                    .comment
                    .as_ref()
                    .map(|c| Bytes::copy_from_slice(c.strip_prefix(' ').unwrap_or(c).as_bytes())),
            })
        }
    }

    proptest! {
        #[test]
        fn split_points_do_not_change_events(
            events in proptest::collection::vec(gen_event(), 0..8),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let mut stream = Vec::new();
            for event in &events {
                event.write(&mut stream);
            }
            let expected: Vec<SseEvent> = events.iter().filter_map(GenEvent::expected).collect();

            let (whole, err) = parse_reads(4096, &[&stream]);
            prop_assert_eq!(err, None);
            prop_assert_eq!(&whole, &expected);

            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
            points.sort_unstable();
            let mut reads = Vec::new();
            let mut from = 0;
            for point in points {
                reads.push(&stream[from..point]);
                from = point;
            }
            reads.push(&stream[from..]);
            let (split, err) = parse_reads(4096, &reads);
            prop_assert_eq!(err, None);
            prop_assert_eq!(&split, &expected);

            let bytes: Vec<&[u8]> = stream.chunks(1).collect();
            let (one_by_one, err) = parse_reads(4096, &bytes);
            prop_assert_eq!(err, None);
            prop_assert_eq!(&one_by_one, &expected);
        }

        #[test]
        fn random_bytes_never_panic_and_respect_the_cap(
            reads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16),
            max in 1usize..48,
        ) {
            let reads: Vec<&[u8]> = reads.iter().map(Vec::as_slice).collect();
            let (events, _) = parse_reads(max, &reads);
            for event in events {
                prop_assert!(event.data.len() <= max);
            }
        }

        #[test]
        fn random_bytes_split_anywhere_give_the_same_result(
            stream in proptest::collection::vec(
                prop_oneof![Just(b'\n'), Just(b'\r'), Just(b':'), Just(b' '), Just(b'd'), any::<u8>()],
                0..200,
            ),
        ) {
            let whole = parse_reads(32, &[&stream]);
            let bytes: Vec<&[u8]> = stream.chunks(1).collect();
            let one_by_one = parse_reads(32, &bytes);
            prop_assert_eq!(whole, one_by_one);
        }
    }
}
