//! The two line formats a trace is read from, Mooncake JSONL and Dynamo request traces (their
//! serde shapes), and the parsing of their lines into [`Parsed`] rows, checked and with
//! line-numbered errors; gzip decompression included.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{DYNAMO_SCHEMA, TraceError};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Timestamps and delays above this many milliseconds (~3,000 years) are errors, not durations.
const MAX_MILLIS: f64 = 1e14;

/// The most bad lines one error lists; the rest are counted.
pub const MAX_LISTED_LINES: usize = 20;

/// What is wrong with one line of a trace ([`TraceError::Line`] names the file and the line),
/// and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum LineProblem {
    /// JSON, but not the row the format has (`what`).
    #[error("not {what}: {message} (column {column})")]
    NotRow {
        what: &'static str,
        message: String,
        column: usize,
    },
    #[error("not JSON: {message} (column {column}); a trace has one object per line")]
    NotJson { message: String, column: usize },
    #[error("`{field}` is {ms}; it must be milliseconds between 0 and {max}", max = MAX_MILLIS)]
    Millis { field: &'static str, ms: f64 },
    #[error("`{field}` is {value}; it must be a string or an integer")]
    Session {
        field: &'static str,
        value: serde_json::Value,
    },
    /// A row names more blocks than its length needs; `names` are the format's own fields
    /// (blocks, length, block size) and the fix.
    #[error(
        "`{}` has {blocks} blocks but {} {input_length} at {} {block_size} needs at most {most}; \
         {}",
        .names[0], .names[1], .names[2], .names[3]
    )]
    Blocks {
        names: &'static [&'static str; 4],
        blocks: usize,
        input_length: u32,
        block_size: u32,
        most: usize,
    },
    /// A length of 0: a prompt has at least one token and a request generates at least one,
    /// so the row cannot be replayed as recorded (sent as something else, it would measure
    /// another request than the trace's).
    #[error(
        "`{field}` is 0; a replayed request needs at least 1 {what} token: remove the row (a \
         failed or cancelled request) or give its real length"
    )]
    ZeroLength {
        field: &'static str,
        what: &'static str,
    },
    /// A length past what the canary sends (the config's ISL and OSL bounds): refused before
    /// any prompt is built, so no row can exhaust memory.
    #[error("`{field}` is {value}; the most a replayed request may have is {max}")]
    TooLong {
        field: &'static str,
        value: u64,
        max: u32,
    },
    #[error(
        "`timestamp` is missing; only a later turn of a session (same `session_id`) may omit it"
    )]
    MissingTimestamp,
    #[error(
        "`schema` is {}, not `{schema}`; give a Dynamo request trace, or set the trace format \
         to `mooncake`",
        .0.as_ref().map_or("missing".to_owned(), |s| format!("`{s}`")),
        schema = DYNAMO_SCHEMA
    )]
    Schema(Option<String>),
    #[error(
        "`request.replay` is missing; run the Dynamo frontend with `DYN_REQUEST_TRACE=1` so \
         request_end rows carry replay metadata (block size, input length and block hashes)"
    )]
    MissingReplay,
    #[error("`request.replay.trace_block_size` is 0; it must be the KV block size in tokens")]
    ZeroBlockSize,
    #[error(
        "`request.replay.trace_block_size` is {block_size} but line {first_line} has {first}; \
         one trace must have one block size (record each frontend configuration as its own \
         trace)"
    )]
    MixedBlockSize {
        block_size: u32,
        first_line: usize,
        first: u32,
    },
}

/// A row parsed from either format, before ordering and numbering.
pub(super) struct Parsed {
    /// Where it sorts, in trace milliseconds (its own timestamp, or its predecessor's).
    pub(super) key: f64,
    pub(super) at: Option<f64>,
    pub(super) delay: Duration,
    pub(super) input_length: u32,
    pub(super) output_length: u32,
    pub(super) blocks: Vec<u64>,
    pub(super) session: Option<String>,
}

#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: Option<f64>,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
    session_id: Option<serde_json::Value>,
    delay: Option<f64>,
}

#[derive(Deserialize)]
struct DynamoHeader {
    schema: Option<String>,
    event_type: Option<String>,
    /// The record of an envelope line (`{"timestamp": …, "event": {…}}`), as Dynamo 1.6.1's
    /// frontend writes every line of its file sinks; a bare line is the record itself.
    event: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Deserialize)]
struct DynamoLine {
    agent_context: Option<AgentContext>,
    request: DynamoRequest,
}

#[derive(Deserialize)]
struct AgentContext {
    session_id: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct DynamoRequest {
    request_received_ms: f64,
    output_tokens: u64,
    replay: Option<Replay>,
}

#[derive(Deserialize)]
struct Replay {
    trace_block_size: u32,
    input_length: u64,
    input_sequence_hashes: Vec<u64>,
}

/// Milliseconds (validated finite, non-negative and bounded) as a duration.
pub(super) fn millis(ms: f64) -> Duration {
    Duration::try_from_secs_f64(ms.max(0.0) / 1000.0).unwrap_or(Duration::MAX)
}

/// The bytes themselves, or their gzip decompression (at most `max` bytes) when they start with
/// the gzip magic bytes; several gzip members (appended files) decompress one after another.
pub(super) fn decompress<'a>(
    bytes: &'a [u8],
    path: &Path,
    max: u64,
) -> Result<Cow<'a, [u8]>, TraceError> {
    if !bytes.starts_with(&GZIP_MAGIC) {
        return Ok(Cow::Borrowed(bytes));
    }
    let mut out = Vec::new();
    // One byte more than allowed tells a trace of exactly `max` from a larger one.
    flate2::read::MultiGzDecoder::new(bytes)
        .take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|source| TraceError::Gzip {
            path: path.to_owned(),
            source,
        })?;
    if out.len() as u64 > max {
        return Err(TraceError::TooLarge {
            path: path.to_owned(),
            max,
        });
    }
    Ok(Cow::Owned(out))
}

fn line_error(path: &Path, line: usize, problem: LineProblem) -> TraceError {
    TraceError::Line {
        path: path.to_owned(),
        line,
        problem,
    }
}

/// A JSON error of one line, without serde_json's "at line 1 column N" (the line is ours).
fn json_problem(error: serde_json::Error, what: &'static str) -> LineProblem {
    let full = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = full.strip_suffix(&position).unwrap_or(&full).to_owned();
    let column = error.column();
    match error.classify() {
        serde_json::error::Category::Data => LineProblem::NotRow {
            what,
            message,
            column,
        },
        _ => LineProblem::NotJson { message, column },
    }
}

/// A milliseconds field checked to be a usable time.
fn checked_millis(field: &'static str, ms: f64) -> Result<f64, LineProblem> {
    if ms.is_finite() && (0.0..=MAX_MILLIS).contains(&ms) {
        Ok(ms)
    } else {
        Err(LineProblem::Millis { field, ms })
    }
}

/// A session id as a key: a string, or an integer (so `7` and `"7"` are one session).
fn session_key(
    field: &'static str,
    value: Option<serde_json::Value>,
) -> Result<Option<String>, LineProblem> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(text)) => Ok(Some(text)),
        Some(serde_json::Value::Number(n)) if n.is_u64() || n.is_i64() => Ok(Some(n.to_string())),
        Some(value) => Err(LineProblem::Session { field, value }),
    }
}

/// The lengths both formats check: neither 0, and within the config's ISL and OSL bounds.
fn check_lengths(
    input: (&'static str, u64),
    output: (&'static str, u64),
) -> Result<(), LineProblem> {
    use crate::workload::{MAX_ISL, MAX_OSL};
    for ((field, value), what, max) in [(input, "prompt", MAX_ISL), (output, "output", MAX_OSL)] {
        if value == 0 {
            return Err(LineProblem::ZeroLength { field, what });
        }
        if value > u64::from(max) {
            return Err(LineProblem::TooLong { field, value, max });
        }
    }
    Ok(())
}

/// Every line's row, or the bad lines: all of them, the first [`MAX_LISTED_LINES`] listed.
fn all_or_bad<T>(
    rows: impl Iterator<Item = (usize, Result<T, LineProblem>)>,
    path: &Path,
) -> Result<Vec<T>, TraceError> {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    let mut more = 0usize;
    for (line, row) in rows {
        match row {
            Ok(row) => good.push(row),
            Err(problem) if bad.len() < MAX_LISTED_LINES => bad.push((line, problem)),
            Err(_) => more += 1,
        }
    }
    if bad.len() == 1 {
        let (line, problem) = bad.remove(0);
        return Err(line_error(path, line, problem));
    }
    if !bad.is_empty() {
        return Err(TraceError::Lines {
            path: path.to_owned(),
            lines: bad,
            more,
        });
    }
    Ok(good)
}

/// The check both formats share: a row names at most ⌈input_length / block_size⌉ blocks; the
/// names are the format's own fields (blocks, length, block size) and the fix.
fn check_blocks(
    blocks: usize,
    input_length: u32,
    block_size: u32,
    names: &'static [&'static str; 4],
) -> Result<(), LineProblem> {
    let most = input_length.div_ceil(block_size) as usize;
    if blocks <= most {
        return Ok(());
    }
    Err(LineProblem::Blocks {
        names,
        blocks,
        input_length,
        block_size,
        most,
    })
}

pub(super) fn parse_mooncake<'a>(
    lines: impl Iterator<Item = (usize, &'a [u8])>,
    block_size: u32,
    path: &Path,
) -> Result<Vec<Parsed>, TraceError> {
    // The sort key of each session's latest turn, so its next turn sorts after it.
    let mut latest: HashMap<String, f64> = HashMap::new();
    let rows = lines.map(|(line, bytes)| (line, mooncake_row(bytes, block_size, &mut latest)));
    all_or_bad(rows, path)
}

fn mooncake_row(
    bytes: &[u8],
    block_size: u32,
    latest: &mut HashMap<String, f64>,
) -> Result<Parsed, LineProblem> {
    let row: MooncakeLine =
        serde_json::from_slice(bytes).map_err(|e| json_problem(e, "a Mooncake trace row"))?;
    const NAMES: [&str; 4] = [
        "hash_ids",
        "input_length",
        "block_size",
        "set `block_size` to the trace's block size",
    ];
    check_lengths(
        ("input_length", row.input_length),
        ("output_length", row.output_length),
    )?;
    let (input_length, output_length) = (row.input_length as u32, row.output_length as u32);
    check_blocks(row.hash_ids.len(), input_length, block_size, &NAMES)?;
    let timestamp = row.timestamp.map(|ms| checked_millis("timestamp", ms));
    let delay = row.delay.map(|ms| checked_millis("delay", ms));
    let (timestamp, delay) = (timestamp.transpose()?, delay.transpose()?);
    let session = session_key("session_id", row.session_id)?;
    let previous = session.as_ref().and_then(|key| latest.get(key).copied());
    let (key, at, delay) = match (previous, timestamp, delay) {
        // A first turn, or a row without a session: sent at its timestamp.
        (None, Some(timestamp), _) => (timestamp, Some(timestamp), Duration::ZERO),
        (None, None, _) => return Err(LineProblem::MissingTimestamp),
        (Some(previous), _, Some(delay)) => (previous, None, millis(delay)),
        (Some(previous), Some(timestamp), None) => {
            (previous.max(timestamp), Some(timestamp), Duration::ZERO)
        }
        (Some(previous), None, None) => (previous, None, Duration::ZERO),
    };
    if let Some(session) = &session {
        latest.insert(session.clone(), key);
    }
    Ok(Parsed {
        key,
        at,
        delay,
        input_length,
        output_length,
        blocks: row.hash_ids,
        session,
    })
}

/// The Dynamo rows and the trace's block size.
pub(super) fn parse_dynamo<'a>(
    lines: impl Iterator<Item = (usize, &'a [u8])>,
    path: &Path,
) -> Result<(u32, Vec<Parsed>), TraceError> {
    // The block size and the line that set it.
    let mut size: Option<(u32, usize)> = None;
    let rows = lines
        .map(|(line, bytes)| (line, dynamo_row(bytes, line, &mut size)))
        .collect::<Vec<_>>();
    let rows = all_or_bad(rows.into_iter(), path)?;
    Ok((
        size.map_or(1, |(size, _)| size),
        rows.into_iter().flatten().collect(),
    ))
}

/// The request of one Dynamo line; `None` for another event.
fn dynamo_row(
    bytes: &[u8],
    line: usize,
    size: &mut Option<(u32, usize)>,
) -> Result<Option<Parsed>, LineProblem> {
    let mut header: DynamoHeader =
        serde_json::from_slice(bytes).map_err(|e| json_problem(e, "a Dynamo request trace row"))?;
    // The frontend's files wrap each record in an envelope whose `timestamp` counts from the
    // frontend's start; the record inside has the schema and the absolute times we replay by.
    let envelope = match header.schema {
        None => header.event.take(),
        Some(_) => None,
    };
    let bytes = match &envelope {
        Some(event) => {
            header = serde_json::from_str(event.get())
                .map_err(|e| json_problem(e, "a Dynamo request trace `event`"))?;
            event.get().as_bytes()
        }
        None => bytes,
    };
    if header.schema.as_deref() != Some(DYNAMO_SCHEMA) {
        return Err(LineProblem::Schema(header.schema));
    }
    if header.event_type.as_deref() != Some("request_end") {
        return Ok(None);
    }
    let row: DynamoLine =
        serde_json::from_slice(bytes).map_err(|e| json_problem(e, "a Dynamo `request_end` row"))?;
    let Some(replay) = row.request.replay else {
        return Err(LineProblem::MissingReplay);
    };
    let block_size = replay.trace_block_size;
    if block_size == 0 {
        return Err(LineProblem::ZeroBlockSize);
    }
    match *size {
        None => *size = Some((block_size, line)),
        Some((first, first_line)) if first != block_size => {
            return Err(LineProblem::MixedBlockSize {
                block_size,
                first_line,
                first,
            });
        }
        Some(_) => {}
    }
    const NAMES: [&str; 4] = [
        "request.replay.input_sequence_hashes",
        "`request.replay.input_length`",
        "`trace_block_size`",
        "the row is inconsistent; record the trace again",
    ];
    let hashes = replay.input_sequence_hashes;
    check_lengths(
        ("request.replay.input_length", replay.input_length),
        ("request.output_tokens", row.request.output_tokens),
    )?;
    let (input_length, output_length) =
        (replay.input_length as u32, row.request.output_tokens as u32);
    check_blocks(hashes.len(), input_length, block_size, &NAMES)?;
    let received = checked_millis(
        "request.request_received_ms",
        row.request.request_received_ms,
    )?;
    let session = row.agent_context.and_then(|context| context.session_id);
    Ok(Some(Parsed {
        key: received,
        at: Some(received),
        delay: Duration::ZERO,
        input_length,
        output_length,
        blocks: hashes,
        session: session_key("agent_context.session_id", session)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{SMALL, dynamo_row, mooncake, ms};
    use super::super::{Trace, TraceFormat};
    use super::*;
    use std::io::Write;

    fn dynamo_text() -> String {
        let tool = serde_json::json!({
            "schema": DYNAMO_SCHEMA,
            "event_type": "tool_end",
            "event_time_unix_ms": 1_760_000_000_900u64,
            "agent_context": { "session_id": "s1" },
            "tool": { "name": "search" },
        });
        // Written when requests end, so not in arrival order.
        [
            dynamo_row(0, 1_760_000_000_300, Some("s1"), 16, 100),
            tool.to_string(),
            dynamo_row(1, 1_760_000_000_000, None, 16, 64),
            dynamo_row(2, 1_760_000_000_500, Some("s1"), 16, 130),
        ]
        .join("\n")
    }

    #[test]
    fn dynamo_traces_parse_plain_and_gzipped_alike() {
        let text = dynamo_text();
        let plain = Trace::parse(text.as_bytes(), TraceFormat::Dynamo, 512, Path::new("t.gz"))
            .expect("parses");
        assert_eq!(plain.block_size, 16, "the trace's own block size");
        assert_eq!(plain.rows.len(), 3, "tool_end is not a request");
        let outputs: Vec<u32> = plain.rows.iter().map(|row| row.output_length).collect();
        assert_eq!(outputs, [11, 10, 12], "arrival order");
        // Session rows are open loop: every row has its time; the session is kept.
        let at: Vec<Option<Duration>> = plain.rows.iter().map(|row| row.at).collect();
        assert_eq!(at, [Some(ms(0)), Some(ms(300)), Some(ms(500))]);
        let sessions: Vec<Option<u32>> = plain.rows.iter().map(|row| row.session).collect();
        assert_eq!(sessions, [None, Some(0), Some(0)]);
        assert_eq!(plain.sessions, 1);
        assert_eq!(plain.rows[1].input_length, 100);
        assert_eq!(plain.rows[1].blocks.len(), 7);
        assert_eq!(
            plain.rows[1].blocks[0],
            u64::MAX,
            "large u64 hashes survive"
        );
        assert_eq!(plain.span, ms(500));

        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(text.as_bytes()).expect("compresses");
        let gz = encoder.finish().expect("compresses");
        let gzipped =
            Trace::parse(&gz, TraceFormat::Dynamo, 512, Path::new("t.jsonl")).expect("parses");
        assert_eq!(gzipped, plain, "gzip is told by its bytes, not its name");

        // Through a file, with a misleading name.
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("trace.jsonl");
        std::fs::write(&file, &gz).expect("write");
        assert_eq!(
            Trace::load(&file, TraceFormat::Dynamo, 512).expect("loads"),
            plain
        );
        let error = Trace::load(&dir.path().join("missing"), TraceFormat::Dynamo, 512)
            .expect_err("missing file");
        assert!(matches!(error, TraceError::Read { .. }), "{error}");

        // A decompressed size past the cap is refused, as is broken gzip.
        let error = decompress(&gz, Path::new("t.gz"), 100).expect_err("too large");
        assert!(
            matches!(error, TraceError::TooLarge { max: 100, .. }),
            "{error}"
        );
        let error = Trace::parse(&gz[..20], TraceFormat::Dynamo, 0, Path::new("t.gz"))
            .expect_err("truncated gzip");
        assert!(matches!(error, TraceError::Gzip { .. }), "{error}");
    }

    #[test]
    fn dynamo_rows_need_one_block_size_and_replay_metadata() {
        let mixed = [
            dynamo_row(0, 1000, None, 16, 64),
            dynamo_row(1, 1100, None, 16, 64),
            dynamo_row(2, 1200, None, 32, 64),
        ]
        .join("\n");
        let error = Trace::parse(
            mixed.as_bytes(),
            TraceFormat::Dynamo,
            0,
            Path::new("d.jsonl"),
        )
        .expect_err("mixed block sizes");
        let message = error.to_string();
        assert!(
            message.starts_with(
                "d.jsonl:3: `request.replay.trace_block_size` is 32 but line 1 has 16"
            ),
            "{message}"
        );

        let mut bare: serde_json::Value =
            serde_json::from_str(&dynamo_row(0, 1000, None, 16, 64)).expect("json");
        bare["request"]
            .as_object_mut()
            .expect("object")
            .remove("replay");
        let text = format!("{}\n{bare}", dynamo_row(1, 900, None, 16, 64));
        let message = Trace::parse(
            text.as_bytes(),
            TraceFormat::Dynamo,
            0,
            Path::new("d.jsonl"),
        )
        .expect_err("no replay")
        .to_string();
        assert!(message.starts_with("d.jsonl:2: "), "{message}");
        assert!(message.contains("DYN_REQUEST_TRACE=1"), "{message}");

        let message = Trace::parse(
            SMALL.as_bytes(),
            TraceFormat::Dynamo,
            0,
            Path::new("d.jsonl"),
        )
        .expect_err("a Mooncake trace is not a Dynamo trace")
        .to_string();
        assert!(
            message.starts_with("d.jsonl:1: `schema` is missing"),
            "{message}"
        );

        let tool_only = dynamo_text()
            .lines()
            .filter(|line| line.contains("tool_end"))
            .collect::<String>();
        let error = Trace::parse(
            tool_only.as_bytes(),
            TraceFormat::Dynamo,
            0,
            Path::new("d.jsonl"),
        )
        .expect_err("no requests");
        assert!(matches!(error, TraceError::Empty { .. }), "{error}");
        assert!(error.to_string().contains("request_end"), "{error}");
    }

    #[test]
    fn lengths_are_bounded_and_never_zero_and_every_bad_line_is_listed() {
        let row = |input: u64, output: u64| {
            format!("{{\"timestamp\": 0, \"input_length\": {input}, \"output_length\": {output}}}")
        };
        let cases = [
            (
                row(2_000_000_000, 8),
                "traces/chat.jsonl:1: `input_length` is 2000000000; the most a replayed request may have is 262144",
            ),
            (
                row(16, 200_000),
                "traces/chat.jsonl:1: `output_length` is 200000; the most a replayed request may have is 131072",
            ),
            (
                row(0, 8),
                "traces/chat.jsonl:1: `input_length` is 0; a replayed request needs at least 1 prompt token",
            ),
            (
                row(16, 0),
                "traces/chat.jsonl:1: `output_length` is 0; a replayed request needs at least 1 output token",
            ),
        ];
        for (text, expected) in cases {
            let message = mooncake(&text, 16).expect_err(expected).to_string();
            assert!(message.starts_with(expected), "{message}");
        }
        // A Dynamo row is bounded alike.
        let mut huge: serde_json::Value =
            serde_json::from_str(&dynamo_row(0, 1000, None, 16, 64)).expect("json");
        huge["request"]["replay"]["input_length"] = serde_json::json!(5_000_000_000u64);
        let message = Trace::parse(
            huge.to_string().as_bytes(),
            TraceFormat::Dynamo,
            0,
            Path::new("d.jsonl"),
        )
        .expect_err("too long")
        .to_string();
        assert!(
            message.starts_with("d.jsonl:1: `request.replay.input_length` is 5000000000"),
            "{message}"
        );

        // Every bad line, up to 20, then a count; good lines between them change nothing.
        let mut text = String::new();
        for i in 0..25 {
            text.push_str(&row(16, 1));
            text.push('\n');
            text.push_str(&row(if i % 2 == 0 { 0 } else { 300_000 }, 1));
            text.push('\n');
        }
        let error = mooncake(&text, 16).expect_err("25 bad lines");
        let TraceError::Lines { lines, more, .. } = &error else {
            panic!("{error}")
        };
        assert_eq!((lines.len(), *more), (MAX_LISTED_LINES, 5));
        let said = error.to_string();
        let said: Vec<&str> = said.lines().collect();
        assert_eq!(said.len(), 21, "{said:?}");
        assert!(
            said[0].starts_with("traces/chat.jsonl:2: `input_length` is 0"),
            "{said:?}"
        );
        assert!(
            said[1].starts_with("traces/chat.jsonl:4: `input_length` is 300000"),
            "{said:?}"
        );
        assert_eq!(said[20], "traces/chat.jsonl: and 5 more bad lines");
    }

    #[test]
    fn bad_mooncake_lines_are_reported_with_their_line_numbers() {
        let too_many = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1}\n\n\
                        {\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 1, \
                        \"hash_ids\": [1, 2, 3, 4, 5]}";
        assert_eq!(
            mooncake(too_many, 512).expect_err("too many").to_string(),
            "traces/chat.jsonl:3: `hash_ids` has 5 blocks but input_length 1000 at block_size \
             512 needs at most 2; set `block_size` to the trace's block size"
        );
        // Fewer ids than blocks is fine: the rest of the prompt is the row's own.
        let fewer = mooncake(&too_many.replace("1, 2, 3, 4, 5", "1"), 512).expect("fewer");
        assert_eq!(fewer.rows[1].blocks, [1]);

        let cases = [
            (
                "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n{oops",
                "traces/chat.jsonl:2: not JSON",
            ),
            (
                "{\"timestamp\": 0, \"output_length\": 1}",
                "traces/chat.jsonl:1: not a Mooncake trace row: missing field `input_length`",
            ),
            (
                "{\"input_length\": 1, \"output_length\": 1}",
                "traces/chat.jsonl:1: `timestamp` is missing",
            ),
            (
                "{\"timestamp\": -5, \"input_length\": 1, \"output_length\": 1}",
                "traces/chat.jsonl:1: `timestamp` is -5",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \
                 \"session_id\": 1.5}",
                "traces/chat.jsonl:1: `session_id` is 1.5",
            ),
            (
                "\n \n",
                "trace traces/chat.jsonl: no Mooncake requests in it",
            ),
        ];
        for (text, expected) in cases {
            let message = mooncake(text, 16).expect_err(expected).to_string();
            assert!(message.starts_with(expected), "{message}");
        }
        assert!(matches!(mooncake(SMALL, 0), Err(TraceError::ZeroBlockSize)));
    }
}
