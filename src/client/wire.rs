//! HTTP/1.1 framing as the measurement transport reads a response (RFC 9112): the response head,
//! what it says of where the body ends (§6.3) and of whether the connection outlives it (§9.3),
//! and the decoder that takes the body's pieces out of the read buffer. No I/O here:
//! [`super::transport`] reads the socket and hands its bytes over, so the property tests and the
//! fuzz target drive the very code requests use, with any bytes split anywhere.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::record::Outcome;

/// The largest response head accepted.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
const MAX_HEADERS: usize = 96;
/// The longest chunk-size line (hex digits and extensions) or trailer line.
const MAX_CHUNK_LINE: usize = 1024;

/// Bytes that cannot be read as an HTTP/1.1 response, or not one way.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the response head is not HTTP/1.1: {0}")]
    Head(String),
    #[error("bad chunked framing: {0}")]
    Framing(&'static str),
    /// A chunk-size line that is not hex digits (with an optional `;extension`): the server does
    /// not speak HTTP/1.1's chunked coding, or speaks it so that a proxy could read it otherwise.
    #[error("bad chunked framing: the chunk size {0:?} is not hex digits")]
    ChunkSize(String),
    /// Content-Length values that disagree, or one that is not a number: the body's end cannot
    /// be known (RFC 9112 §6.3).
    #[error("invalid Content-Length: {0}")]
    ContentLength(String),
}

impl WireError {
    /// The outcome of a request whose response broke this way.
    pub fn outcome(&self) -> Outcome {
        match self {
            // The server answered, but not in HTTP, or ambiguously.
            WireError::Head(_) | WireError::ChunkSize(_) | WireError::ContentLength(_) => {
                Outcome::BadResponse
            }
            WireError::Framing(_) => Outcome::StreamTruncated,
        }
    }
}

/// A response head and what it means for the body and the connection.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    /// The minor version: 1 for HTTP/1.1, 0 for HTTP/1.0.
    pub minor_version: u8,
    pub headers: HeaderMap,
    /// The length Content-Length announces; `None` without one, and when Transfer-Encoding
    /// frames the body instead (it overrides any Content-Length).
    pub content_length: Option<u64>,
    /// Whether the connection can carry another request once the body is read: the server keeps
    /// it (§9.3) and the body's end is known without its close.
    pub persistent: bool,
    /// Where the body ends.
    pub body: BodyDecoder,
}

/// Takes one response head off the front of `buf`, interim 1xx answers (100 Continue) skipped;
/// `Ok(None)` while the head is incomplete. What follows the head stays in `buf`.
pub fn parse_head(buf: &mut BytesMut) -> Result<Option<ResponseHead>, WireError> {
    loop {
        let mut parsed = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut parsed);
        let len = match resp.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => {
                return Err(WireError::Head(format!(
                    "the head is over {} KiB",
                    MAX_HEAD_BYTES >> 10
                )));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(WireError::Head(e.to_string())),
        };
        let status = resp
            .code
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or_else(|| WireError::Head("no status code".into()))?;
        let minor_version = resp.version.unwrap_or(1);
        let mut headers = HeaderMap::with_capacity(resp.headers.len());
        for h in resp.headers.iter() {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|e| WireError::Head(e.to_string()))?;
            let value =
                HeaderValue::from_bytes(h.value).map_err(|e| WireError::Head(e.to_string()))?;
            headers.append(name, value);
        }
        buf.advance(len);
        if status.is_informational() {
            continue;
        }
        return interpret(status, minor_version, headers).map(Some);
    }
}

/// The body's framing (§6.3) and the connection's persistence (§9.3) a head announces.
fn interpret(
    status: StatusCode,
    minor_version: u8,
    headers: HeaderMap,
) -> Result<ResponseHead, WireError> {
    let transfer_encoding = final_transfer_coding(&headers);
    // Transfer-Encoding overrides any Content-Length, a broken one included.
    let content_length = match (&transfer_encoding, content_length(&headers)) {
        (Some(_), _) => None,
        (None, result) => result?,
    };
    let body = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        BodyDecoder::with_length(0)
    } else {
        match (&transfer_encoding, content_length) {
            (Some(coding), _) if coding.eq_ignore_ascii_case("chunked") => BodyDecoder::chunked(),
            // A transfer coding other than chunked last: only the close ends the body.
            (Some(_), _) => BodyDecoder::until_close(),
            (None, Some(n)) => BodyDecoder::with_length(n),
            (None, None) => BodyDecoder::until_close(),
        }
    };
    // Both length fields, or Transfer-Encoding in HTTP/1.0, is framing a proxy may read
    // otherwise: such a connection is not trusted with another request (§6.1, §6.3).
    let ambiguous =
        transfer_encoding.is_some() && (minor_version == 0 || headers.contains_key(CONTENT_LENGTH));
    let persistent =
        connection_persists(minor_version, &headers) && !body.ends_at_close() && !ambiguous;
    Ok(ResponseHead {
        status,
        minor_version,
        headers,
        content_length,
        persistent,
        body,
    })
}

/// Whether a `Connection` field value lists `option`: a comma-separated list of tokens, in any
/// case (RFC 9110 §7.6.1).
pub fn lists_option(value: &[u8], option: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(option.as_bytes()))
}

/// RFC 9112 §9.3: a `close` option in any `Connection` field ends the connection with this
/// response; otherwise HTTP/1.1 persists, and HTTP/1.0 only with `keep-alive`.
fn connection_persists(minor_version: u8, headers: &HeaderMap) -> bool {
    let says = |option| {
        headers
            .get_all(CONNECTION)
            .iter()
            .any(|v| lists_option(v.as_bytes(), option))
    };
    if says("close") {
        false
    } else if minor_version >= 1 {
        true
    } else {
        says("keep-alive")
    }
}

/// The last transfer coding of the `Transfer-Encoding` fields (the one the body's end depends
/// on); `Some("")` for fields that list none, `None` without the field.
fn final_transfer_coding(headers: &HeaderMap) -> Option<String> {
    let mut last = None;
    for field in headers.get_all(TRANSFER_ENCODING) {
        last.get_or_insert_with(String::new);
        for coding in field.as_bytes().split(|&b| b == b',') {
            let coding = coding.trim_ascii();
            if !coding.is_empty() {
                last = Some(String::from_utf8_lossy(coding).into_owned());
            }
        }
    }
    last
}

/// The body length the `Content-Length` fields announce: every value (fields repeated, or one
/// field holding a list) must be the same run of digits, else the framing is invalid (RFC 9112
/// §6.3: conflicting lengths are an unrecoverable error; repeats of one value count once).
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, WireError> {
    let mut length = None;
    for field in headers.get_all(CONTENT_LENGTH) {
        let shown = || String::from_utf8_lossy(field.as_bytes()).into_owned();
        for value in field.as_bytes().split(|&b| b == b',') {
            let value = value.trim_ascii();
            let n = std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    WireError::ContentLength(format!("{:?} is not a length", shown()))
                })?;
            match length {
                Some(seen) if seen != n => {
                    return Err(WireError::ContentLength(format!(
                        "two lengths, {seen} and {n}"
                    )));
                }
                _ => length = Some(n),
            }
        }
    }
    Ok(length)
}

/// The size of a chunk-size line (`1a`, `1a;name=value`, hex digits optionally followed by
/// spaces or tabs before an extension, as RFC 9112 §7.1 has it); `None` for anything else: a
/// sign, a `0x`, leading space, no digit, or a size over `u64`.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = &line[digits..];
    let after_space = rest.trim_ascii_start();
    let tail_ok = after_space.is_empty() || after_space[0] == b';';
    let spaces_ok = rest[..rest.len() - after_space.len()]
        .iter()
        .all(|b| matches!(b, b' ' | b'\t'));
    if digits == 0 || !tail_ok || !spaces_ok {
        return None;
    }
    // Hex digits are ASCII.
    u64::from_str_radix(std::str::from_utf8(&line[..digits]).ok()?, 16).ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Chunked(ChunkState),
    /// Content-Length: bytes left.
    Length(u64),
    /// Until the server closes.
    Close,
    /// The body is complete.
    Done,
}

/// Where a body ends, and how far it got: takes the body's bytes out of a read buffer as they
/// arrive, framing removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyDecoder {
    framing: Framing,
}

impl BodyDecoder {
    /// A body in chunked transfer coding.
    pub fn chunked() -> Self {
        BodyDecoder {
            framing: Framing::Chunked(ChunkState::Size),
        }
    }

    /// A body of `n` bytes (Content-Length).
    pub fn with_length(n: u64) -> Self {
        BodyDecoder {
            framing: Framing::Length(n),
        }
    }

    /// A body that ends when the server closes the connection.
    pub fn until_close() -> Self {
        BodyDecoder {
            framing: Framing::Close,
        }
    }

    /// Whether the body is complete.
    pub fn is_done(&self) -> bool {
        self.framing == Framing::Done
    }

    /// Whether only the connection's close ends the body.
    pub fn ends_at_close(&self) -> bool {
        self.framing == Framing::Close
    }

    /// The connection closed: whether that completes the body (one delimited by the close, or
    /// one already complete) rather than cutting it short.
    pub fn closed(&mut self) -> bool {
        match self.framing {
            Framing::Close | Framing::Done => {
                self.framing = Framing::Done;
                true
            }
            Framing::Chunked(_) | Framing::Length(_) => false,
        }
    }

    /// Takes the next complete piece of body out of `buf`, advancing the framing; `None` when
    /// `buf` holds none (more must be read, or the body is complete). Bytes after the body's end
    /// stay in `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
        loop {
            match self.framing {
                Framing::Done => return Ok(None),
                Framing::Close => {
                    return Ok((!buf.is_empty()).then(|| buf.split().freeze()));
                }
                Framing::Length(0) => {
                    self.framing = Framing::Done;
                    return Ok(None);
                }
                Framing::Length(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = take(left, buf.len());
                    self.framing = Framing::Length(left - n as u64);
                    return Ok(Some(buf.split_to(n).freeze()));
                }
                Framing::Chunked(ChunkState::Data(left)) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = take(left, buf.len());
                    let rest = left - n as u64;
                    self.framing = Framing::Chunked(if rest == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(rest)
                    });
                    return Ok(Some(buf.split_to(n).freeze()));
                }
                Framing::Chunked(state) => {
                    let Some(end) = memchr::memmem::find(buf, b"\r\n") else {
                        if buf.len() > MAX_CHUNK_LINE {
                            return Err(WireError::Framing("a chunk line over 1 KiB"));
                        }
                        return Ok(None);
                    };
                    let line = buf.split_to(end + 2);
                    self.framing = next_state(state, &line[..end])?;
                }
            }
        }
    }
}

/// How many of `available` buffered bytes belong to a body with `left` to go.
fn take(left: u64, available: usize) -> usize {
    usize::try_from(left).map_or(available, |left| left.min(available))
}

/// The framing after one complete line (CRLF removed) read in `state`.
fn next_state(state: ChunkState, line: &[u8]) -> Result<Framing, WireError> {
    Ok(match state {
        ChunkState::Size => {
            let size = chunk_size(line).ok_or_else(|| {
                let shown = &line[..line.len().min(32)];
                WireError::ChunkSize(String::from_utf8_lossy(shown).into_owned())
            })?;
            Framing::Chunked(if size == 0 {
                ChunkState::Trailer
            } else {
                ChunkState::Data(size)
            })
        }
        ChunkState::DataEnd if line.is_empty() => Framing::Chunked(ChunkState::Size),
        ChunkState::DataEnd => return Err(WireError::Framing("no CRLF after a chunk's data")),
        ChunkState::Trailer if line.is_empty() => Framing::Done,
        ChunkState::Trailer => Framing::Chunked(ChunkState::Trailer),
        ChunkState::Data(_) => unreachable!("data is not read by lines"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> ResponseHead {
        let mut buf = BytesMut::from(text.as_bytes());
        parse_head(&mut buf).unwrap().expect("a complete head")
    }

    #[test]
    fn persistence_follows_rfc_9112_section_9_3() {
        for (text, persistent) in [
            ("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", true),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nConnection: Keep-Alive, CLOSE\r\n\r\n",
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: upgrade\r\nconnection: close\r\n\r\n",
                false,
            ),
            // A token that only contains the word is another token.
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: x-close-later\r\n\r\n",
                true,
            ),
            ("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", false),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n",
                true,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 0\r\nConnection: Keep-Alive\r\n\r\n",
                true,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive, close\r\n\r\n",
                false,
            ),
            // Framed by the close: never reusable.
            ("HTTP/1.1 200 OK\r\n\r\n", false),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", false),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n",
                true,
            ),
            // Framing a proxy may read otherwise.
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n",
                false,
            ),
            // No body, whatever the fields say.
            ("HTTP/1.1 204 No Content\r\n\r\n", true),
        ] {
            assert_eq!(head(text).persistent, persistent, "{text:?}");
        }
    }

    #[test]
    fn interim_answers_are_skipped_and_a_partial_head_waits() {
        let mut buf =
            BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-le"[..]);
        assert!(parse_head(&mut buf).unwrap().is_none());
        buf.extend_from_slice(b"ngth: 2\r\n\r\nhi");
        let head = parse_head(&mut buf).unwrap().unwrap();
        assert_eq!(
            (head.status, head.content_length),
            (StatusCode::OK, Some(2))
        );
        assert_eq!(&buf[..], b"hi");
        let mut huge = BytesMut::from(&b"HTTP/1.1 200 OK\r\nx: "[..]);
        huge.resize(MAX_HEAD_BYTES, b'a');
        assert!(matches!(parse_head(&mut huge), Err(WireError::Head(_))));
    }

    #[test]
    fn the_body_ends_where_its_framing_says_and_what_follows_stays() {
        let mut buf = BytesMut::from(&b"3\r\nabc\r\n0\r\nx: 1\r\n\r\nNEXT"[..]);
        let mut body = BodyDecoder::chunked();
        assert_eq!(body.decode(&mut buf).unwrap().unwrap(), &b"abc"[..]);
        assert_eq!(body.decode(&mut buf).unwrap(), None);
        assert!(body.is_done());
        assert_eq!(&buf[..], b"NEXT");
        let mut body = BodyDecoder::with_length(2);
        let mut buf = BytesMut::from(&b"hiNEXT"[..]);
        assert_eq!(body.decode(&mut buf).unwrap().unwrap(), &b"hi"[..]);
        assert_eq!(body.decode(&mut buf).unwrap(), None);
        assert!(body.is_done());
        assert_eq!(&buf[..], b"NEXT");
        let mut cut = BodyDecoder::with_length(5);
        assert!(!cut.closed());
        let mut until_close = BodyDecoder::until_close();
        assert!(until_close.closed() && until_close.is_done());
    }

    #[test]
    fn a_chunk_size_is_hex_digits_with_an_optional_extension_and_nothing_else() {
        for (line, size) in [
            (&b"1a"[..], 26),
            (b"1A", 26),
            (b"0", 0),
            (b"000f", 15),
            (b"5;ext=1", 5),
            (b"5 ;ext", 5),
            (b"5\t", 5),
            (b"ffffffffffffffff", u64::MAX),
        ] {
            assert_eq!(chunk_size(line), Some(size), "{:?}", line.escape_ascii());
        }
        for line in [
            &b"+1a"[..],
            b"-1",
            b"0x1a",
            b" 1a",
            b"1a x",
            b"1g",
            b"",
            b";ext",
            b"1a\r",
            b"\xef\xbc\x91",
            b"10000000000000000",
        ] {
            assert_eq!(chunk_size(line), None, "{:?}", line.escape_ascii());
        }
    }
}
