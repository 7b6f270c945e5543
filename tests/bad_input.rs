//! Bad input never panics and never grows without bound: the SSE parser, the response head
//! parser and chunked decoder, the SLO expression parser and the config loader under generated
//! input (proptest, bounded in cases; the open-ended fuzzing lives in `fuzz/`), servers that
//! stream forever or send one endless line, and server-controlled strings that would break a
//! metric label.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use llm_canary::client::{
    ApiKey, BodyDecoder, ClientConfig, Endpoint, Outcome, Prompt, SseParser, StreamClient,
    StreamRequest, parse_head,
};
use llm_canary::config::{Api, Config, Dialect};
use proptest::prelude::*;
use support::RawReply;

/// `data` as the reads it may arrive in: cut at `cuts` (those past its end ignored).
fn reads(data: &[u8], cuts: Vec<usize>) -> Vec<&[u8]> {
    let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c < data.len()).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut from = 0;
    let mut pieces = Vec::new();
    for to in cuts.into_iter().chain([data.len()]) {
        pieces.push(&data[from..to]);
        from = to;
    }
    pieces
}

/// Responses as a server might send them, well-formed or not: a status line, some framing and
/// connection fields, and a body of bytes that chunked framing is made of.
fn responses() -> impl Strategy<Value = Vec<u8>> {
    let status = proptest::sample::select(vec![
        "HTTP/1.1 200 OK",
        "HTTP/1.0 200 OK",
        "HTTP/1.1 204 No Content",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
        "HTTP/1.1 200",
        "HTTP/2 200 OK",
    ]);
    let fields = proptest::sample::subsequence(
        vec![
            "transfer-encoding: chunked",
            "Transfer-Encoding: gzip, chunked",
            "transfer-encoding: gzip",
            "content-length: 5",
            "content-length: 5, 7",
            "content-length: 99999999999999999999999",
            "connection: close",
            "Connection: Keep-Alive",
            "connection: upgrade, close",
        ],
        0..4,
    );
    let body = proptest::collection::vec(
        prop_oneof![
            any::<u8>(),
            Just(b'\r'),
            Just(b'\n'),
            Just(b'0'),
            Just(b'5'),
            Just(b'f'),
            Just(b';'),
        ],
        0..1024,
    );
    (status, fields, body).prop_map(|(status, fields, body)| {
        let mut bytes = status.as_bytes().to_vec();
        for field in fields {
            bytes.extend_from_slice(b"\r\n");
            bytes.extend_from_slice(field.as_bytes());
        }
        bytes.extend_from_slice(b"\r\n\r\n");
        bytes.extend_from_slice(&body);
        bytes
    })
}

/// `body` in chunked coding, chunk after chunk of the sizes `sizes` names in turn (the last
/// chunk what is left), sizes in upper or lower case hex, each with an extension or not, then
/// the last chunk and a trailer or not.
fn chunked(body: &[u8], sizes: &[usize], upper: bool, ext: bool, trailer: bool) -> Vec<u8> {
    let mut wire = Vec::new();
    let mut rest = body;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let n = size.min(rest.len());
        let hex = if upper {
            format!("{n:X}")
        } else {
            format!("{n:x}")
        };
        wire.extend_from_slice(hex.as_bytes());
        if ext {
            wire.extend_from_slice(b" ;name=\"value\"");
        }
        wire.extend_from_slice(b"\r\n");
        wire.extend_from_slice(&rest[..n]);
        wire.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    wire.extend_from_slice(b"0\r\n");
    if trailer {
        wire.extend_from_slice(b"x-trailer: 1\r\n");
    }
    wire.extend_from_slice(b"\r\n");
    wire
}

/// A valid config to mutate: every kind of value the loader checks.
const FULL: &str = include_str!("testdata/config/good/full.yaml");

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_sse_parser_takes_any_bytes_in_any_split(
        data in proptest::collection::vec(
            prop_oneof![
                any::<u8>(),
                Just(b'\n'), Just(b'\r'), Just(b':'), Just(b' '),
                Just(b'd'), Just(b'a'), Just(b't'),
            ],
            0..2048,
        ),
        cuts in proptest::collection::vec(0usize..2048, 0..16),
        limit in 1024usize..4096,
    ) {
        let mut parser = SseParser::new(limit);
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c < data.len()).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut from = 0;
        for to in cuts.into_iter().chain([data.len()]) {
            parser.feed(Bytes::copy_from_slice(&data[from..to]));
            from = to;
            while let Ok(Some(event)) = parser.next_event() {
                // An event never holds more than the cap.
                prop_assert!(event.data.len() <= limit);
            }
        }
        let _ = parser.finish();
    }

    #[test]
    fn the_response_reader_takes_any_bytes_in_any_split(
        data in prop_oneof![proptest::collection::vec(any::<u8>(), 0..2048), responses()],
        cuts in proptest::collection::vec(0usize..2048, 0..16),
    ) {
        // The head, then the body its framing says, as the transport reads them: never a panic,
        // never more body than arrived, never an empty piece.
        let mut buf = BytesMut::new();
        let mut head = None;
        let mut body = 0usize;
        for piece in reads(&data, cuts) {
            buf.extend_from_slice(piece);
            if head.is_none() {
                match parse_head(&mut buf) {
                    Ok(Some(parsed)) => head = Some(parsed),
                    Ok(None) => continue,
                    Err(_) => return Ok(()),
                }
            }
            let Some(head) = head.as_mut() else { continue };
            loop {
                match head.body.decode(&mut buf) {
                    Ok(Some(bytes)) => {
                        prop_assert!(!bytes.is_empty());
                        body += bytes.len();
                    }
                    Ok(None) => break,
                    Err(_) => return Ok(()),
                }
            }
        }
        prop_assert!(body <= data.len());
        if let Some(head) = head {
            // A connection is kept only when the body's end is known without its close.
            prop_assert!(!(head.persistent && head.body.ends_at_close()));
        }
    }

    #[test]
    fn a_chunked_body_decodes_to_its_bytes_in_any_split(
        body in proptest::collection::vec(any::<u8>(), 0..2048),
        sizes in proptest::collection::vec(1usize..300, 1..16),
        (upper, ext, trailer) in (any::<bool>(), any::<bool>(), any::<bool>()),
        cuts in proptest::collection::vec(0usize..4096, 0..24),
    ) {
        // The head, the chunked body and the start of the next response, read in any split:
        // the body comes out whole, and what follows it stays for the next response.
        let mut wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        wire.extend_from_slice(&chunked(&body, &sizes, upper, ext, trailer));
        wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let mut buf = BytesMut::new();
        let mut decoder: Option<BodyDecoder> = None;
        let mut got = Vec::new();
        for piece in reads(&wire, cuts) {
            buf.extend_from_slice(piece);
            if decoder.is_none() {
                match parse_head(&mut buf) {
                    Ok(Some(head)) => {
                        prop_assert!(head.persistent);
                        decoder = Some(head.body);
                    }
                    Ok(None) => continue,
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
            let Some(decoder) = decoder.as_mut() else { continue };
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Some(bytes)) => got.extend_from_slice(&bytes),
                    Ok(None) => break,
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
        }
        prop_assert!(decoder.is_some_and(|d| d.is_done()));
        prop_assert_eq!(got, body);
        prop_assert_eq!(&buf[..], b"HTTP/1.1 200 OK\r\n");
    }

    #[test]
    fn the_slo_parser_takes_any_text(
        text in "[a-z0-9_{}()\\[\\]=!~<>*/+., \"'-]{0,120}",
    ) {
        let _ = llm_canary::slo::parse_condition(&text);
        let _ = llm_canary::slo::parse_sli(&text);
    }

    #[test]
    fn the_slo_parser_takes_mutated_expressions(at in 0usize..200, insert in "\\PC{0,4}") {
        let base = r#"p50(ttft{serving_mode="disaggregated", concurrency=~"32|64"}) <= 0.8 * p50(ttft{serving_mode="aggregated"}) and r2(p50(ttft{workload="prefix_cache"}) by (prefix_ratio)) >= 0.9"#;
        let at = base.char_indices().map(|(i, _)| i).nth(at % base.chars().count()).unwrap_or(0);
        let text = format!("{}{insert}{}", &base[..at], &base[at..]);
        let _ = llm_canary::slo::parse_condition(&text);
    }

    #[test]
    fn the_config_loader_takes_any_mutation_of_a_valid_config(
        at in 0usize..100_000,
        cut in 0usize..64,
        insert in "[ :\\-\\[\\]{}\"'#&*!|>%@`0-9a-z\\n\\t]{0,12}",
    ) {
        let at = FULL.char_indices().map(|(i, _)| i).nth(at % FULL.chars().count()).unwrap_or(0);
        let end = FULL[at..].char_indices().map(|(i, _)| at + i).nth(cut).unwrap_or(FULL.len());
        let text = format!("{}{insert}{}", &FULL[..at], &FULL[end..]);
        let _ = llm_canary::setup::Setup::parse(&text, "mutated.yaml", Path::new("."));
    }
}

#[test]
fn absurd_sizes_are_rejected_with_a_clear_message() {
    // A 10 MB prompt (ISL), 1e9 concurrency, zero durations: each named with its bound.
    let text = r#"
targets:
  - { name: agg, serving_mode: aggregated, url: "http://127.0.0.1:8000" }
workloads:
  concurrency_sweep: { levels: [1000000000], isl: 10000000, osl: 10000000, step: 0s }
  prefix_cache: { concurrency: 1000000000, isl: 10000000 }
client: { max_event_bytes: 1000000000000, request_timeout: 0s }
"#;
    let err = Config::parse(text, "absurd.yaml", Path::new("."))
        .unwrap_err()
        .to_string();
    for want in [
        "concurrency level 1000000000 must be between 1 and 4096",
        "`concurrency_sweep.isl` is 10000000, must be between 1 and",
        "`concurrency_sweep.osl` is 10000000, must be between 1 and",
        "`client.max_event_bytes` is 1000000000000, must be between 1024 and 67108864",
    ] {
        assert!(err.contains(want), "missing `{want}` in:\n{err}");
    }
    assert!(err.contains("must be longer than 0"), "{err}");
}

fn request(osl: u32) -> StreamRequest {
    StreamRequest {
        request_id: "bad-input-1".into(),
        prompt: Prompt::Text("hello".into()),
        osl,
    }
}

async fn send(addr: std::net::SocketAddr, osl: u32) -> llm_canary::client::RequestRecord {
    let client = StreamClient::new(ClientConfig {
        request_timeout: Duration::from_secs(20),
        max_event_bytes: 64 << 10,
        ..ClientConfig::default()
    })
    .unwrap();
    let endpoint =
        Endpoint::new(&format!("http://{addr}"), Api::Chat, "m", Dialect::Openai).unwrap();
    client
        .send(&endpoint, &request(osl), tokio::time::Instant::now())
        .await
}

const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_streams_forever_is_cut_off() {
    let chunk = format!(
        "data: {}\n\n",
        serde_json::json!({"choices": [{"index": 0, "delta": {"content": "again "}}]})
    );
    let (addr, _) = support::raw_server(move |_| RawReply::Endless {
        head: SSE_HEAD.to_vec(),
        chunk: chunk.clone().into_bytes(),
    })
    .await;
    let rec = send(addr, 8).await;
    assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
    let error = rec.error.unwrap_or_default();
    assert!(error.contains("response body over"), "{error}");
    // 8 tokens may bring 8 × 4 KiB + 1 MiB: the reply kept is bounded by that.
    assert!(
        rec.reply.len() <= (1 << 20) + 8 * 4096,
        "{}",
        rec.reply.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_line_is_cut_at_the_event_cap() {
    let (addr, _) = support::raw_server(|_| RawReply::Endless {
        head: [SSE_HEAD, b"data: "].concat(),
        chunk: vec![b'x'; 64 << 10],
    })
    .await;
    let rec = send(addr, 8).await;
    assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
    let error = rec.error.unwrap_or_default();
    assert!(error.contains("longer than 65536 bytes"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_strings_never_become_metric_labels() {
    // A model id and error texts made to break a label or the exposition if they got there.
    const EVIL: &str = r#"evil"} 1 # EOF {le="x\"#;
    let models = format!(
        "{{\"object\":\"list\",\"data\":[{{\"id\":{}}}]}}",
        serde_json::to_string(EVIL).unwrap()
    );
    let turn = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (addr, _) = support::raw_server(move |head| {
        if head.starts_with("GET /v1/models") {
            return RawReply::Bytes(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{models}",
                    models.len()
                )
                .into_bytes(),
            );
        }
        let body = format!(
            "{{\"error\":{{\"message\":{}}}}}",
            serde_json::to_string(&format!("boom{EVIL}\n# EOF\n")).unwrap()
        );
        match turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 3 {
            0 => RawReply::Bytes(support::sse_ok(EVIL, 4)),
            1 => RawReply::Bytes(
                format!(
                    "HTTP/1.1 500 {EVIL}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes(),
            ),
            _ => {
                let sse = format!("event: error\ndata: {body}\n\n");
                RawReply::Bytes(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{sse}",
                        sse.len()
                    )
                    .into_bytes(),
                )
            }
        }
    })
    .await;
    let cfg = Config::parse(
        &format!(
            r#"
targets:
  - {{ name: labelled, serving_mode: aggregated, url: "http://{addr}", dialect: openai }}
time_scale: 0.01
workloads:
  concurrency_sweep: {{ levels: [2], isl: 32, osl: 4, step: 100s, warmup: 10s }}
"#
        ),
        "labels.yaml",
        Path::new("."),
    )
    .unwrap();
    let deployment = llm_canary::targets::Deployment::start(&cfg, Path::new("."))
        .await
        .unwrap();
    // The model id is carried as it came (it is sent back in request bodies)...
    assert_eq!(deployment.targets[0].endpoint.model(), EVIL);
    let metrics = Arc::new(llm_canary::export::metrics::Metrics::new(&[]));
    let recorder = Arc::new(llm_canary::schedule::Recorder::new(vec![metrics.clone()]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 3));
    let never = tokio_util::sync::CancellationToken::new();
    let plan = llm_canary::schedule::plan_cycle(&cfg).remove(0);
    let results = runner.run_step(&plan, 0, &never, &never).await;
    let outcomes = &results[0].measurements.outcomes;
    for kind in [Outcome::Ok, Outcome::Http5xx, Outcome::StreamError] {
        assert!(outcomes.get(&kind).is_some_and(|n| *n > 0), "{outcomes:?}");
    }
    // ...but neither it nor any error text reaches the exposition, which stays well-formed.
    let text = metrics.encode().unwrap();
    assert!(!text.contains("evil") && !text.contains("boom"), "{text}");
    let sample = regex::Regex::new(
        r#"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? [-+0-9.eEInfa]+$"#,
    )
    .unwrap();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(sample.is_match(line), "malformed sample line: {line}");
    }
    assert!(text.ends_with("# EOF\n"));
    deployment.stop().await;
}

/// Issue 21, item 8: a server's error body can neither forge a log line nor drive a terminal:
/// its newlines and escape codes reach the record (and every log and file) escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_body_cannot_forge_a_log_line() {
    let body = "bad request\n2026-12-02T00:00:00Z  INFO llm_canary: all targets healthy\r\x1b[2J";
    let reply = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (addr, _) = support::raw_server(move |_| RawReply::Bytes(reply.clone().into_bytes())).await;
    let rec = send(addr, 8).await;
    assert_eq!(rec.outcome, Outcome::Http4xx);
    let error = rec.error.unwrap();
    assert!(!error.chars().any(char::is_control), "{error:?}");
    assert!(
        error.contains("bad request\\n2026-12-02T00:00:00Z  INFO") && error.contains("\\u{1b}[2J"),
        "{error}"
    );
}

/// A server that refuses with the request's `Authorization` header in its answer gets none of
/// the canary's secrets republished: the API key, the password of credentials in the URL and the
/// Basic authorization they make are masked (`***`) in the record's error text, the one text
/// every sink shows, which keeps the rest of what the server said. A key the error body's 2 KiB
/// limit cuts through leaves none of its beginning either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_echoes_the_authorization_gets_no_secret_republished() {
    const KEY: &str = "sk-echo-test-5ecret-4c1d-9b7e-0f3a-77aa1";
    let client = StreamClient::new(ClientConfig::default()).unwrap();
    let limit = ClientConfig::default().max_error_bytes;
    // Where the second copy of the key starts in a body without filler; the filler that leaves
    // 5 of its bytes inside what the client reads.
    let support::RawReply::Bytes(sample) =
        support::echo_authorization_401(&format!("authorization: Bearer {KEY}\r\n"), 0)
    else {
        unreachable!("a refusal is bytes")
    };
    let sample = String::from_utf8(sample).unwrap();
    let body = &sample[sample.find("\r\n\r\n").unwrap() + 4..];
    let second = body.rfind(KEY).unwrap();
    for pad in [0, limit - second - 5] {
        let (addr, heads) =
            support::raw_server(move |head| support::echo_authorization_401(head, pad)).await;
        let endpoint = Endpoint::new(&format!("http://{addr}"), Api::Chat, "m", Dialect::Openai)
            .unwrap()
            .with_api_key(&ApiKey::new(KEY))
            .unwrap();
        let rec = client
            .send(&endpoint, &request(2), tokio::time::Instant::now())
            .await;
        assert!(heads.lock().unwrap()[0].contains(KEY), "the key was sent");
        assert_eq!(rec.outcome, Outcome::Http4xx);
        let error = rec.error.unwrap();
        assert!(
            !error.contains("5ecret") && !error.contains("sk-"),
            "pad {pad}: {error}"
        );
        assert!(
            error.starts_with("HTTP 401 Unauthorized: ")
                && error.contains("invalid credentials")
                && error.contains(r#""received":"Bearer ***""#),
            "pad {pad}: {error}"
        );
    }
    // Credentials in the URL, sent as Basic authorization: neither the password (as written or
    // decoded) nor the header's base64 shows.
    let (addr, _) = support::raw_server(|head| support::echo_authorization_401(head, 0)).await;
    let url = format!("http://canary:pa55-w%40rd@{addr}");
    let endpoint = Endpoint::new(&url, Api::Chat, "m", Dialect::Openai).unwrap();
    let rec = client
        .send(&endpoint, &request(2), tokio::time::Instant::now())
        .await;
    let error = rec.error.unwrap();
    // base64("canary:pa55-w@rd")
    assert!(!error.contains("Y2FuYXJ5OnBhNTUtd0ByZA"), "{error}");
    assert!(error.contains(r#""received":"Basic ***""#), "{error}");
}

/// Issue 21, item 10: a 200 KB response id is kept cut and escaped, not verbatim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_response_id_is_kept_short() {
    let id = format!("{}\u{1b}[31m", "x".repeat(200_000));
    let chunk =
        serde_json::json!({"id": id, "choices": [{"index": 0, "delta": {"content": "hi"}}]});
    let usage = serde_json::json!({"id": id, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}});
    let body = format!("data: {chunk}\n\ndata: {usage}\n\ndata: [DONE]\n\n");
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let client = StreamClient::new(ClientConfig {
        request_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    })
    .unwrap();
    let (addr, _) = support::raw_server(move |_| RawReply::Bytes(reply.clone().into_bytes())).await;
    let endpoint =
        Endpoint::new(&format!("http://{addr}"), Api::Chat, "m", Dialect::Openai).unwrap();
    let rec = client
        .send(&endpoint, &request(1), tokio::time::Instant::now())
        .await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
    let kept = rec.response_id.unwrap();
    assert!(kept.len() <= 128 + '…'.len_utf8(), "{} bytes", kept.len());
    assert!(kept.starts_with("xxx") && kept.ends_with('…'), "{kept}");
}

/// Issue 21, item 10: a response head too large to parse, and a compressed body the request did
/// not accept, are the server's bad responses, not truncated streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_and_compressed_bodies_are_bad_responses() {
    let huge_header = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-junk: {}\r\n\r\n",
        "j".repeat(2 << 20)
    );
    let (addr, _) =
        support::raw_server(move |_| RawReply::Bytes(huge_header.clone().into_bytes())).await;
    let rec = send(addr, 8).await;
    assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);

    let body = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03compressed";
    let mut gzip = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    gzip.extend_from_slice(body);
    let (addr, heads) = support::raw_server(move |_| RawReply::Bytes(gzip.clone())).await;
    let rec = send(addr, 8).await;
    assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
    assert!(rec.error.unwrap().contains("\"gzip\"-encoded body"));
    let head = heads.lock().unwrap()[0].to_ascii_lowercase();
    assert!(head.contains("accept-encoding: identity"), "{head}");
}

/// Credentials in a target's URL reach the server as Basic authorization, percent-decoded as
/// curl and browsers do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_a_plain_http_url_are_sent() {
    let sse = support::sse_ok("m", 2);
    let (addr, heads) = support::raw_server(move |_| RawReply::Bytes(sse.clone())).await;
    let client = StreamClient::new(ClientConfig::default()).unwrap();
    let url = format!("http://user:secret@{addr}");
    let endpoint = Endpoint::new(&url, Api::Chat, "m", Dialect::Openai).unwrap();
    let rec = client
        .send(&endpoint, &request(2), tokio::time::Instant::now())
        .await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
    let head = heads.lock().unwrap()[0].to_ascii_lowercase();
    // base64("user:secret")
    assert!(
        head.contains("authorization: basic dxnlcjpzzwnyzxq="),
        "{head}"
    );
    let url = format!("http://us%65r:p%40ss@{addr}");
    let endpoint = Endpoint::new(&url, Api::Chat, "m", Dialect::Openai).unwrap();
    let rec = client
        .send(&endpoint, &request(2), tokio::time::Instant::now())
        .await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
    let head = heads.lock().unwrap()[1].to_ascii_lowercase();
    // base64("user:p@ss")
    assert!(head.contains("authorization: basic dxnlcjpwqhnz"), "{head}");
}

/// Issue 21, item 10: a stream that announces a huge Content-Length and sends less is not
/// waited for after `[DONE]`: a closed loop against it keeps its request rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_content_length_does_not_slow_the_next_request() {
    let honest = support::sse_ok("m", 2);
    let text = String::from_utf8(honest.clone()).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let lying_head = head
        .lines()
        .map(|l| {
            if l.to_ascii_lowercase().starts_with("content-length") {
                "content-length: 1000000000".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n");
    let lying = format!("{lying_head}\r\n\r\n{body}");
    // The server keeps the connection open after the body, as a server that lies would.
    let (addr, _) = support::raw_server(move |_| RawReply::Hold(lying.clone().into_bytes())).await;
    // A tail grace far longer than any request: a client that waited for the announced bytes
    // would take all of it.
    let client = StreamClient::new(ClientConfig {
        request_timeout: Duration::from_secs(60),
        tail_grace: Duration::from_secs(30),
        ..ClientConfig::default()
    })
    .unwrap();
    let endpoint =
        Endpoint::new(&format!("http://{addr}"), Api::Chat, "m", Dialect::Openai).unwrap();
    let started = tokio::time::Instant::now();
    let rec = client
        .send(&endpoint, &request(2), tokio::time::Instant::now())
        .await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited {:?} for bytes the server only announced",
        started.elapsed()
    );
}

/// Issue 21, item 4: numbers no honest server could send are a `bad_response` with the reason,
/// never an `ok` feeding throughput, cost, counters or the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implausible_usage_is_a_bad_response() {
    let chunk = serde_json::json!({"choices": [{"index": 0, "delta": {"content": "hi "}}]});
    let stream = |usage: Option<serde_json::Value>, content: bool| {
        let mut body = String::new();
        if content {
            for _ in 0..4 {
                body.push_str(&format!("data: {chunk}\n\n"));
            }
        }
        if let Some(u) = usage {
            body.push_str(&format!(
                "data: {}\n\n",
                serde_json::json!({"choices": [], "usage": u})
            ));
        }
        body.push_str("data: [DONE]\n\n");
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let cases = [
        ("a [DONE] alone", stream(None, false), "without any content"),
        (
            "10^15 completion tokens",
            stream(
                Some(
                    serde_json::json!({"prompt_tokens": 3, "completion_tokens": 1_000_000_000_000_000u64}),
                ),
                true,
            ),
            "usage.completion_tokens 1000000000000000",
        ),
        (
            "2^64 - 1 prompt tokens",
            stream(
                Some(serde_json::json!({"prompt_tokens": u64::MAX, "completion_tokens": 4})),
                true,
            ),
            "usage.prompt_tokens 18446744073709551615",
        ),
        (
            "more cached than prompt tokens",
            stream(
                Some(
                    serde_json::json!({"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 50_000}}),
                ),
                true,
            ),
            "cached_tokens 50000 above",
        ),
        (
            "no completion tokens for content",
            stream(
                Some(serde_json::json!({"prompt_tokens": 3, "completion_tokens": 0})),
                true,
            ),
            "usage.completion_tokens 0 for 4 tokens",
        ),
    ];
    for (what, reply, why) in cases {
        let (addr, _) = support::raw_server(move |_| RawReply::Bytes(reply.clone())).await;
        let rec = send(addr, 4).await;
        assert_eq!(rec.outcome, Outcome::BadResponse, "{what}: {:?}", rec.error);
        let error = rec.error.clone().unwrap_or_default();
        assert!(error.contains(why), "{what}: {error}");
        // What the budget is charged: only what the client counted itself.
        assert!(rec.billable_tokens() <= 4, "{what}");
    }
    // An honest reply stays ok.
    let honest = stream(
        Some(serde_json::json!({"prompt_tokens": 3, "completion_tokens": 4})),
        true,
    );
    let (addr, _) = support::raw_server(move |_| RawReply::Bytes(honest.clone())).await;
    let rec = send(addr, 4).await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
}

/// A complete SSE reply of `chunks` (each a chat chunk), then usage for `tokens` and `[DONE]`.
fn chat_reply(chunks: &[serde_json::Value], tokens: u64) -> Vec<u8> {
    let mut body = String::new();
    for chunk in chunks {
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    let usage = serde_json::json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}});
    body.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// One request for `model` in `dialect` to a server that answers `reply`.
async fn send_for(
    reply: Vec<u8>,
    model: &str,
    dialect: Dialect,
) -> llm_canary::client::RequestRecord {
    let (addr, _) = support::raw_server(move |_| RawReply::Bytes(reply.clone())).await;
    let client = StreamClient::new(ClientConfig {
        request_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    })
    .unwrap();
    let endpoint = Endpoint::new(&format!("http://{addr}"), Api::Chat, model, dialect).unwrap();
    client
        .send(&endpoint, &request(3), tokio::time::Instant::now())
        .await
}

/// A stream answers one choice of the model asked for and ends that choice once: content after
/// its `finish_reason`, a second choice index, or another model than the one asked for (in a
/// dialect whose server repeats it) is the server's bad response, said as such; an honest
/// stream, and OpenAI's dated snapshot of the model asked for, stay `ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_its_contract_is_a_bad_response() {
    let chunk = |model: &str, index: u64, content: &str, finish: Option<&str>| {
        serde_json::json!({"id": "c1", "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": index, "delta": {"content": content}, "finish_reason": finish}]})
    };
    let m = "qwen3-tiny";
    let honest = [
        chunk(m, 0, "a ", None),
        chunk(m, 0, "b ", None),
        chunk(m, 0, "c", Some("length")),
    ];
    let cases = [
        (
            "content after finish_reason",
            vec![
                chunk(m, 0, "a ", None),
                chunk(m, 0, "b", Some("stop")),
                chunk(m, 0, " c", None),
            ],
            m,
            "content after finish_reason \"stop\"",
        ),
        (
            "a second choice",
            vec![
                chunk(m, 0, "a ", None),
                chunk(m, 1, "b ", None),
                chunk(m, 0, "c", Some("length")),
            ],
            m,
            "a choice with index 1 after index 0",
        ),
        (
            "another model",
            vec![
                chunk("llama-70b", 0, "a ", None),
                chunk("llama-70b", 0, "b ", None),
                chunk("llama-70b", 0, "c", Some("length")),
            ],
            m,
            "the stream is from model \"llama-70b\", not the requested \"qwen3-tiny\"",
        ),
        (
            "an alias of the model",
            honest.to_vec(),
            "Qwen/Qwen3-tiny",
            "not the requested \"Qwen/Qwen3-tiny\"",
        ),
    ];
    for dialect in [Dialect::Vllm, Dialect::Dynamo] {
        for (what, chunks, asked, why) in &cases {
            let rec = send_for(chat_reply(chunks, 3), asked, dialect).await;
            assert_eq!(
                rec.outcome,
                Outcome::BadResponse,
                "{dialect:?} {what}: {:?}",
                rec.error
            );
            let error = rec.error.clone().unwrap_or_default();
            assert!(error.contains(why), "{dialect:?} {what}: {error}");
        }
        let rec = send_for(chat_reply(&honest, 3), m, dialect).await;
        assert_eq!(rec.outcome, Outcome::Ok, "{dialect:?}: {:?}", rec.error);
        assert_eq!(rec.reply, "a b c");
    }
    // OpenAI names the dated snapshot of the model asked for: that dialect is not held to the
    // name, but to one choice ended once all the same.
    let snapshot = [
        chunk("gpt-4o-2024-08-06", 0, "a ", None),
        chunk("gpt-4o-2024-08-06", 0, "b ", None),
        chunk("gpt-4o-2024-08-06", 0, "c", Some("stop")),
    ];
    let rec = send_for(chat_reply(&snapshot, 3), "gpt-4o", Dialect::Openai).await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
    let late = [
        chunk("gpt-4o-2024-08-06", 0, "a ", Some("stop")),
        chunk("gpt-4o-2024-08-06", 0, "b ", None),
    ];
    let rec = send_for(chat_reply(&late, 2), "gpt-4o", Dialect::Openai).await;
    assert_eq!(rec.outcome, Outcome::BadResponse, "{:?}", rec.error);
}

/// HTTP/1.1 framing that cannot be read one way only is the server's bad response, not a
/// truncated stream: a chunk size that is not bare hex digits (`+1a`, ` 1a`, `0x1a`), and
/// Content-Length values that disagree (RFC 9112 §6.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_is_a_bad_response() {
    let reply = chat_reply(
        &[serde_json::json!({"choices": [{"index": 0, "delta": {"content": "a"}}]})],
        1,
    );
    let text = String::from_utf8(reply.clone()).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let head: Vec<&str> = head
        .lines()
        .filter(|l| !l.starts_with("content-length"))
        .collect();
    let head = head.join("\r\n");
    let chunked = |size: &str| {
        format!("{head}\r\ntransfer-encoding: chunked\r\n\r\n{size}\r\n{body}\r\n0\r\n\r\n")
            .into_bytes()
    };
    let hex = format!("{:x}", body.len());
    let rec = send_for(chunked(&hex), "m", Dialect::Openai).await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
    let rec = send_for(chunked(&format!("{hex};name=value")), "m", Dialect::Openai).await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
    for size in [format!("+{hex}"), format!(" {hex}"), format!("0x{hex}")] {
        let rec = send_for(chunked(&size), "m", Dialect::Openai).await;
        assert_eq!(
            rec.outcome,
            Outcome::BadResponse,
            "{size:?}: {:?}",
            rec.error
        );
        let error = rec.error.unwrap_or_default();
        assert!(error.contains("not hex digits"), "{size:?}: {error}");
    }
    let lengths = |values: &[String]| {
        let fields: String = values
            .iter()
            .map(|v| format!("content-length: {v}\r\n"))
            .collect();
        format!("{head}\r\n{fields}\r\n{body}").into_bytes()
    };
    let n = body.len();
    for values in [
        vec![n.to_string(), (n - 10).to_string()],
        vec![format!("{}, {n}", n - 10)],
    ] {
        let rec = send_for(lengths(&values), "m", Dialect::Openai).await;
        assert_eq!(
            rec.outcome,
            Outcome::BadResponse,
            "{values:?}: {:?}",
            rec.error
        );
        let error = rec.error.unwrap_or_default();
        assert!(error.contains("Content-Length"), "{values:?}: {error}");
    }
    // The same length twice is one length.
    let rec = send_for(
        lengths(&[n.to_string(), n.to_string()]),
        "m",
        Dialect::Openai,
    )
    .await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
}
