//! Request traces for the trace-replay workload: Mooncake and Dynamo traces loaded into one
//! normalised model, sampled, truncated and looped; the prefix-cache reuse a trace implies; and
//! prompts whose KV blocks repeat byte for byte wherever the trace's block hash ids repeat.
//!
//! # Formats
//!
//! * **Mooncake JSONL** ([`TraceFormat::Mooncake`]): one object per line with `timestamp` (ms),
//!   `input_length`, `output_length` and `hash_ids`, the ids of the prompt's KV blocks of
//!   `block_size` tokens (given by the caller: the trace does not record it), the last one possibly
//!   partial. A row may name fewer ids than its length needs (its remaining tokens are its own) but
//!   never more. Optional: `session_id` (string or integer) and `delay` (ms).
//! * **Dynamo request trace** ([`TraceFormat::Dynamo`], schema [`DYNAMO_SCHEMA`]), plain or
//!   gzip-compressed (recognised by the gzip magic bytes, not the file name). Only `request_end`
//!   events are requests; other events (`tool_end`, ...) are skipped. A request's timestamp is
//!   `request.request_received_ms`; its block size, length and block hashes come from
//!   `request.replay`, which the frontend writes only when it runs with `DYN_REQUEST_TRACE=1`.
//!   One trace has one block size.
//!
//! Rows are kept in timestamp order (stable, so equal timestamps keep their file order); offsets
//! count from the trace's first timestamp.
//!
//! # Sessions
//!
//! A Mooncake session's rows are **cumulative**: each row's `input_length` and `hash_ids` already
//! hold the whole conversation before it. Every row is therefore sent as one complete prompt built
//! from its own blocks, and the earlier turns are never appended to it again: that would count the
//! history twice (the blocks a turn shares with the previous one are what the server's prefix
//! cache hits). When the turns are sent:
//!
//! * the first turn at its `timestamp` (a `delay` on it is ignored: there is nothing before it);
//! * a later turn with a `delay`, that long after the previous turn's reply ended
//!   ([`TraceRow::at`] is `None`, [`TraceRow::delay`] the wait);
//! * a later turn with a `timestamp` and no `delay`, at its timestamp or when the previous reply
//!   ended, whichever is later (`at` is `Some`; the driver takes the maximum);
//! * a later turn with neither, as soon as the previous reply ended.
//!
//! A session's turns keep their file order (a turn without a timestamp sorts with its
//! predecessor). Dynamo rows are all replayed at their timestamps (open loop), session or not:
//! the trace recorded when each request arrived, think time and tool calls included; their
//! session is kept for reporting, and their turns are ordered by arrival.
//!
//! # Prompts
//!
//! [`BlockPrompts`] turns a row into prompt text: each block id becomes `block_size` tokens of
//! text that depend only on the run salt and the id, so equal ids give byte-identical blocks on
//! every row, every target and every restart of a run, and the server's prefix cache sees the
//! reuse the trace recorded ([`Trace::expected_hit_tokens`]).

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use super::prompt::{PromptError, compose};
use super::sampler::derive_seed;
use super::tokenizer::TokenModel;
use crate::files::FileError;

/// The largest trace read, compressed or decompressed: far above any trace worth replaying (a
/// million Mooncake rows are ~200 MB), and a bound keeps a wrong path from exhausting memory.
pub const MAX_TRACE_BYTES: u64 = 256 << 20;

/// The block size Mooncake traces are usually recorded with (their `hash_ids` cover 512 tokens).
pub const DEFAULT_TRACE_BLOCK_SIZE: u32 = 512;

/// The `schema` of a Dynamo request trace row.
pub const DYNAMO_SCHEMA: &str = "dynamo.request.trace.v1";

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Timestamps and delays above this many milliseconds (~3,000 years) are errors, not durations.
const MAX_MILLIS: f64 = 1e14;

/// How long one pass of a trace whose timestamps are all equal lasts (before `speed`).
const FLAT_TRACE_PERIOD: Duration = Duration::from_secs(1);

/// Block texts kept for reuse: enough for the hot blocks of a large trace; the byte bound keeps
/// the cache small when blocks are long (512 tokens are ~3 KB of text).
const MAX_CACHED_BLOCKS: usize = 65_536;
const MAX_CACHED_BLOCK_BYTES: usize = 64 << 20;

// Domain tags mixed into seeds so block texts, row tails and sampling never share a stream.
const TRACE_DOMAIN: u64 = 0x7472_6163; // "trac"
const TAIL_DOMAIN: u64 = 0x7461_696c; // "tail"
const SAMPLE_DOMAIN: u64 = 0x7361_6d70; // "samp"

/// The format a trace is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    /// Mooncake JSONL (`timestamp`, `input_length`, `output_length`, `hash_ids`).
    Mooncake,
    /// Dynamo's `dynamo.request.trace.v1` JSONL, plain or gzip-compressed.
    Dynamo,
}

impl TraceFormat {
    /// The format of a trace whose first line is `first_line`: an object with a `schema` key is a
    /// Dynamo request trace; anything else is taken for Mooncake, whose rows have no schema.
    pub fn detect(first_line: &str) -> TraceFormat {
        #[derive(Deserialize)]
        struct Probe {
            schema: Option<IgnoredAny>,
        }
        match serde_json::from_str::<Probe>(first_line.trim()) {
            Ok(probe) if probe.schema.is_some() => TraceFormat::Dynamo,
            Ok(_) => TraceFormat::Mooncake,
            // A line that is not an object is an error the loader reports with its line number.
            Err(_) if first_line.contains("\"schema\"") => TraceFormat::Dynamo,
            Err(_) => TraceFormat::Mooncake,
        }
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceFormat::Mooncake => "Mooncake",
            TraceFormat::Dynamo => "Dynamo request",
        })
    }
}

/// Why a trace could not be loaded. Each message names the file, the line (1-based) where there
/// is one, what is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("trace {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: FileError,
    },
    #[error(
        "trace {}: it starts like gzip but does not decompress ({source}); give the file as \
         written, or decompress it first",
        .path.display()
    )]
    Gzip {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "trace {}: it decompresses to more than the {max} bytes accepted; split it into smaller \
         traces",
        .path.display()
    )]
    TooLarge { path: PathBuf, max: u64 },
    #[error("{}:{line}: {problem}", .path.display())]
    Line {
        path: PathBuf,
        line: usize,
        problem: String,
    },
    #[error("trace {}: no {format} requests in it; {hint}", .path.display())]
    Empty {
        path: PathBuf,
        format: TraceFormat,
        hint: &'static str,
    },
    #[error(
        "trace block size must be at least 1 token; set `block_size` to the trace's block size"
    )]
    ZeroBlockSize,
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRow {
    /// When to send it, as an offset from the trace's first timestamp; `None` for a session turn
    /// sent [`TraceRow::delay`] after the previous turn's reply ended.
    pub at: Option<Duration>,
    /// For a session turn with `at: None`: the wait after the previous turn's reply ended.
    pub delay: Duration,
    /// Prompt tokens, the whole conversation so far for a session turn.
    pub input_length: u32,
    /// Tokens to generate.
    pub output_length: u32,
    /// The ids of the prompt's KV blocks as the file gives them, in prompt order.
    pub blocks: Vec<u64>,
    /// The session, as a compact index in order of first appearance.
    pub session: Option<u32>,
}

/// A loaded trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The format it was read from.
    pub format: TraceFormat,
    /// Tokens per block id.
    pub block_size: u32,
    /// The requests in timestamp order (see the module documentation for sessions).
    pub rows: Vec<TraceRow>,
    /// The last timestamp minus the first.
    pub span: Duration,
    /// How many sessions the rows name.
    pub sessions: u32,
}

/// A row parsed from either format, before ordering and numbering.
struct Parsed {
    /// Where it sorts, in trace milliseconds (its own timestamp, or its predecessor's).
    key: f64,
    at: Option<f64>,
    delay: Duration,
    input_length: u32,
    output_length: u32,
    blocks: Vec<u64>,
    session: Option<String>,
}

#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: Option<f64>,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
    session_id: Option<serde_json::Value>,
    delay: Option<f64>,
}

#[derive(Deserialize)]
struct DynamoHeader {
    schema: Option<String>,
    event_type: Option<String>,
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
    output_tokens: u32,
    replay: Option<Replay>,
}

#[derive(Deserialize)]
struct Replay {
    trace_block_size: u32,
    input_length: u32,
    input_sequence_hashes: Vec<u64>,
}

impl Trace {
    /// Reads and parses the trace at `path` (at most [`MAX_TRACE_BYTES`], before and after
    /// decompression). `block_size` is the Mooncake block size; a Dynamo trace records its own.
    pub fn load(path: &Path, format: TraceFormat, block_size: u32) -> Result<Trace, TraceError> {
        let bytes = crate::files::read_bounded(path, MAX_TRACE_BYTES).map_err(|source| {
            TraceError::Read {
                path: path.to_owned(),
                source,
            }
        })?;
        Trace::parse(&bytes, format, block_size, path)
    }

    /// Parses a trace's bytes (gzip-compressed or not); `path` only names it in errors.
    pub fn parse(
        bytes: &[u8],
        format: TraceFormat,
        block_size: u32,
        path: &Path,
    ) -> Result<Trace, TraceError> {
        let bytes = decompress(bytes, path, MAX_TRACE_BYTES)?;
        let lines = bytes
            .split(|&byte| byte == b'\n')
            .enumerate()
            .map(|(index, line)| (index + 1, line.trim_ascii()))
            .filter(|(_, line)| !line.is_empty());
        let (block_size, parsed) = match format {
            TraceFormat::Mooncake => {
                if block_size == 0 {
                    return Err(TraceError::ZeroBlockSize);
                }
                (block_size, parse_mooncake(lines, block_size, path)?)
            }
            TraceFormat::Dynamo => parse_dynamo(lines, path)?,
        };
        if parsed.is_empty() {
            return Err(TraceError::Empty {
                path: path.to_owned(),
                format,
                hint: match format {
                    TraceFormat::Mooncake => "every line of a Mooncake trace is one request",
                    TraceFormat::Dynamo => {
                        "only `request_end` events are requests; record the trace with the \
                         frontend's request tracing on"
                    }
                },
            });
        }
        Ok(Trace::ordered(format, block_size, parsed))
    }

    /// Orders parsed rows by their sort key (stably), numbers their sessions and makes their
    /// timestamps offsets.
    fn ordered(format: TraceFormat, block_size: u32, mut parsed: Vec<Parsed>) -> Trace {
        parsed.sort_by(|a, b| a.key.total_cmp(&b.key));
        let first = parsed
            .iter()
            .filter_map(|row| row.at)
            .min_by(f64::total_cmp)
            .unwrap_or(0.0);
        let mut sessions: HashMap<String, u32> = HashMap::new();
        let rows = parsed
            .into_iter()
            .map(|row| {
                let session = row.session.map(|key| {
                    let next = u32::try_from(sessions.len()).unwrap_or(u32::MAX);
                    *sessions.entry(key).or_insert(next)
                });
                TraceRow {
                    at: row.at.map(|at| millis(at - first)),
                    delay: row.delay,
                    input_length: row.input_length,
                    output_length: row.output_length,
                    blocks: row.blocks,
                    session,
                }
            })
            .collect();
        Trace::from_rows(format, block_size, rows)
    }

    /// A trace of `rows` (already in order): offsets rebased to start at zero, sessions
    /// renumbered by first appearance, span and session count recomputed.
    fn from_rows(format: TraceFormat, block_size: u32, mut rows: Vec<TraceRow>) -> Trace {
        let base = rows
            .iter()
            .filter_map(|row| row.at)
            .min()
            .unwrap_or_default();
        let mut renumber: HashMap<u32, u32> = HashMap::new();
        for row in &mut rows {
            if let Some(at) = &mut row.at {
                *at = at.saturating_sub(base);
            }
            if let Some(session) = &mut row.session {
                let next = u32::try_from(renumber.len()).unwrap_or(u32::MAX);
                *session = *renumber.entry(*session).or_insert(next);
            }
        }
        let span = rows
            .iter()
            .filter_map(|row| row.at)
            .max()
            .unwrap_or_default();
        Trace {
            format,
            block_size,
            rows,
            span,
            sessions: u32::try_from(renumber.len()).unwrap_or(u32::MAX),
        }
    }

    /// A deterministic share of the trace, for replaying a fraction of its load: each session is
    /// kept or dropped whole (a turn without its history would be a different request), rows
    /// without a session one by one. The same (trace, share, seed) keeps the same rows. Kept
    /// rows keep their timestamps, so the sampled trace spans the same time at a lower rate.
    /// A share of 1 or more keeps everything; 0 or less (or NaN) keeps nothing.
    pub fn sample(&self, share: f64, seed: u64) -> Trace {
        if share >= 1.0 {
            return self.clone();
        }
        let keep = |kind: u64, id: u64| {
            let draw = derive_seed(seed, &[SAMPLE_DOMAIN, kind, id]);
            // The top 53 bits as a uniform fraction in [0, 1).
            ((draw >> 11) as f64 / (1u64 << 53) as f64) < share
        };
        let rows = self
            .rows
            .iter()
            .enumerate()
            .filter(|(index, row)| match row.session {
                Some(session) => keep(0, u64::from(session)),
                None => keep(1, *index as u64),
            })
            .map(|(_, row)| row.clone())
            .collect();
        Trace::from_rows(self.format, self.block_size, rows)
    }

    /// The trace's first `max_rows` rows or fewer, cut between whole sessions: rows are taken in
    /// order while each row without a session, and each session with all its turns, still fits;
    /// the cut is at the first that does not. Only when the very first session alone is longer
    /// than `max_rows` is it cut, after its first `max_rows` turns; a later turn is never kept
    /// without the turns before it.
    pub fn truncate(&self, max_rows: usize) -> Trace {
        if self.rows.len() <= max_rows {
            return self.clone();
        }
        let mut turns: HashMap<u32, usize> = HashMap::new();
        for session in self.rows.iter().filter_map(|row| row.session) {
            *turns.entry(session).or_default() += 1;
        }
        let mut admitted = HashSet::new();
        let mut reserved = 0usize;
        let mut cut = self.rows.len();
        for (index, row) in self.rows.iter().enumerate() {
            let needs = match row.session {
                Some(session) if admitted.contains(&session) => continue,
                Some(session) => turns.get(&session).copied().unwrap_or(1),
                None => 1,
            };
            if reserved + needs > max_rows {
                cut = index;
                break;
            }
            reserved += needs;
            if let Some(session) = row.session {
                admitted.insert(session);
            }
        }
        let mut rows: Vec<TraceRow> = self
            .rows
            .iter()
            .enumerate()
            .filter(|(index, row)| match row.session {
                Some(session) => admitted.contains(&session),
                None => *index < cut,
            })
            .map(|(_, row)| row.clone())
            .collect();
        if rows.is_empty() {
            rows = self.rows[..max_rows].to_vec();
        }
        Trace::from_rows(self.format, self.block_size, rows)
    }

    /// The prefix-cache reuse the trace implies, as (reusable tokens, prompt tokens) summed over
    /// its rows in order with an infinite cache: a row can reuse its longest run of leading
    /// blocks that was already a run of leading whole blocks of an earlier row (a server caches
    /// whole blocks only, so a row's final partial block is never reused), capped at its
    /// `input_length − 1` (the last prompt token is always computed) and rounded down to whole
    /// blocks. What a server's prefix cache can hit when the trace is replayed once.
    pub fn expected_hit_tokens(&self) -> (u64, u64) {
        let block_size = u64::from(self.block_size.max(1));
        // A trie of cached block sequences: (parent node, block id) -> node; node 0 is the root.
        let mut children: HashMap<(usize, u64), usize> = HashMap::new();
        let (mut reusable, mut prompt) = (0u64, 0u64);
        for row in &self.rows {
            let input = u64::from(row.input_length);
            let whole = usize::try_from(input / block_size).unwrap_or(usize::MAX);
            let (mut node, mut matched) = (0usize, 0u64);
            for (index, &id) in row.blocks.iter().enumerate() {
                let fresh = children.len() + 1;
                match children.entry((node, id)) {
                    Entry::Occupied(child) => {
                        node = *child.get();
                        matched += 1;
                    }
                    // After the first miss every later block is new too: cache the rest.
                    Entry::Vacant(slot) if index < whole => {
                        slot.insert(fresh);
                        node = fresh;
                    }
                    Entry::Vacant(_) => break,
                }
            }
            let cap = input.saturating_sub(1) / block_size * block_size;
            reusable += (matched * block_size).min(cap);
            prompt += input;
        }
        (reusable, prompt)
    }

    /// An endless iterator over (offset from the replay start, row index) for the rows with a
    /// timestamp, in time order, the trace repeated back to back: offsets are divided by `speed`
    /// (2 replays twice as fast), and pass `k` adds `k` periods, a period being the span plus the
    /// mean gap between consecutive timestamps (1 s when all are equal), divided by `speed`, so
    /// the seam between passes looks like any other gap. Rows with `at: None` are not yielded:
    /// the driver sends them after their session's previous turn ([`Trace::next_in_session`]).
    /// A `speed` that is not a positive number counts as 1. Empty for a trace without rows.
    pub fn replay_offsets(&self, speed: f64) -> ReplayOffsets {
        let speed = if speed.is_finite() && speed > 0.0 {
            speed
        } else {
            1.0
        };
        // `as` from f64 to u128 saturates, so an absurd speed cannot overflow.
        let scale = |nanos: u128| (nanos as f64 / speed) as u128;
        let mut starts: Vec<(u128, usize)> = self
            .rows
            .iter()
            .enumerate()
            .filter_map(|(index, row)| Some((scale(row.at?.as_nanos()), index)))
            .collect();
        starts.sort_by_key(|&(start, _)| start);
        let times = || self.rows.iter().filter_map(|row| row.at);
        let span = match (times().min(), times().max()) {
            (Some(first), Some(last)) => (last - first).as_nanos(),
            _ => 0,
        };
        let period = if starts.len() < 2 || span == 0 {
            FLAT_TRACE_PERIOD.as_nanos()
        } else {
            span + span / (starts.len() as u128 - 1)
        };
        ReplayOffsets {
            starts,
            period: scale(period).max(1),
            pass: 0,
            next: 0,
        }
    }

    /// The turn of `row`'s session that follows it, if any. Scans forward from `row`; for every
    /// row at once use [`Trace::session_successors`].
    pub fn next_in_session(&self, row: usize) -> Option<usize> {
        let session = self.rows.get(row)?.session?;
        self.rows
            .iter()
            .enumerate()
            .skip(row + 1)
            .find(|(_, later)| later.session == Some(session))
            .map(|(index, _)| index)
    }

    /// [`Trace::next_in_session`] of every row, computed in one pass.
    pub fn session_successors(&self) -> Vec<Option<usize>> {
        let mut next = vec![None; self.rows.len()];
        let mut last: HashMap<u32, usize> = HashMap::new();
        for (index, row) in self.rows.iter().enumerate() {
            if let Some(session) = row.session {
                if let Some(previous) = last.insert(session, index) {
                    next[previous] = Some(index);
                }
            }
        }
        next
    }
}

/// The iterator of [`Trace::replay_offsets`]; owns its data, so it outlives the trace.
#[derive(Debug, Clone)]
pub struct ReplayOffsets {
    /// (scaled offset in ns, row index) of one pass, in time order.
    starts: Vec<(u128, usize)>,
    /// One pass, scaled, in ns; at least 1.
    period: u128,
    pass: u64,
    next: usize,
}

impl Iterator for ReplayOffsets {
    type Item = (Duration, usize);

    fn next(&mut self) -> Option<(Duration, usize)> {
        let &(start, row) = self.starts.get(self.next)?;
        let nanos = self
            .period
            .saturating_mul(u128::from(self.pass))
            .saturating_add(start);
        self.next += 1;
        if self.next == self.starts.len() {
            self.next = 0;
            self.pass += 1;
        }
        Some((duration_from_nanos(nanos), row))
    }
}

fn duration_from_nanos(nanos: u128) -> Duration {
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    // The remainder is below 10^9, so it fits.
    Duration::new(secs, (nanos % 1_000_000_000) as u32)
}

/// Milliseconds (validated finite, non-negative and bounded) as a duration.
fn millis(ms: f64) -> Duration {
    Duration::try_from_secs_f64(ms.max(0.0) / 1000.0).unwrap_or(Duration::MAX)
}

/// The bytes themselves, or their gzip decompression (at most `max` bytes) when they start with
/// the gzip magic bytes; several gzip members (appended files) decompress one after another.
fn decompress<'a>(bytes: &'a [u8], path: &Path, max: u64) -> Result<Cow<'a, [u8]>, TraceError> {
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

fn line_error(path: &Path, line: usize, problem: String) -> TraceError {
    TraceError::Line {
        path: path.to_owned(),
        line,
        problem,
    }
}

/// A JSON error of one line, without serde_json's "at line 1 column N" (the line is ours).
fn json_problem(error: serde_json::Error, what: &str) -> String {
    let full = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = full.strip_suffix(&position).unwrap_or(&full);
    let column = error.column();
    match error.classify() {
        serde_json::error::Category::Data => format!("not {what}: {message} (column {column})"),
        _ => format!("not JSON: {message} (column {column}); a trace has one object per line"),
    }
}

/// A milliseconds field checked to be a usable time.
fn checked_millis(field: &str, ms: f64) -> Result<f64, String> {
    if ms.is_finite() && (0.0..=MAX_MILLIS).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!(
            "`{field}` is {ms}; it must be milliseconds between 0 and {MAX_MILLIS}"
        ))
    }
}

/// A session id as a key: a string, or an integer (so `7` and `"7"` are one session).
fn session_key(field: &str, value: Option<serde_json::Value>) -> Result<Option<String>, String> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(text)) => Ok(Some(text)),
        Some(serde_json::Value::Number(n)) if n.is_u64() || n.is_i64() => Ok(Some(n.to_string())),
        Some(other) => Err(format!(
            "`{field}` is {other}; it must be a string or an integer"
        )),
    }
}

/// The check both formats share: a row names at most ⌈input_length / block_size⌉ blocks; the
/// names are the format's own fields (blocks, length, block size) and the fix.
fn check_blocks(
    blocks: usize,
    input_length: u32,
    block_size: u32,
    names: [&str; 4],
) -> Result<(), String> {
    let most = input_length.div_ceil(block_size) as usize;
    if blocks <= most {
        return Ok(());
    }
    let [blocks_field, length_field, size_field, fix] = names;
    Err(format!(
        "`{blocks_field}` has {blocks} blocks but {length_field} {input_length} at {size_field} \
         {block_size} needs at most {most}; {fix}"
    ))
}

fn parse_mooncake<'a>(
    lines: impl Iterator<Item = (usize, &'a [u8])>,
    block_size: u32,
    path: &Path,
) -> Result<Vec<Parsed>, TraceError> {
    // The sort key of each session's latest turn, so its next turn sorts after it.
    let mut latest: HashMap<String, f64> = HashMap::new();
    lines
        .map(|(line, bytes)| {
            mooncake_row(bytes, block_size, &mut latest).map_err(|e| line_error(path, line, e))
        })
        .collect()
}

fn mooncake_row(
    bytes: &[u8],
    block_size: u32,
    latest: &mut HashMap<String, f64>,
) -> Result<Parsed, String> {
    let row: MooncakeLine =
        serde_json::from_slice(bytes).map_err(|e| json_problem(e, "a Mooncake trace row"))?;
    let names = [
        "hash_ids",
        "input_length",
        "block_size",
        "set `block_size` to the trace's block size",
    ];
    check_blocks(row.hash_ids.len(), row.input_length, block_size, names)?;
    let timestamp = row.timestamp.map(|ms| checked_millis("timestamp", ms));
    let delay = row.delay.map(|ms| checked_millis("delay", ms));
    let (timestamp, delay) = (timestamp.transpose()?, delay.transpose()?);
    let session = session_key("session_id", row.session_id)?;
    let previous = session.as_ref().and_then(|key| latest.get(key).copied());
    let (key, at, delay) = match (previous, timestamp, delay) {
        // A first turn, or a row without a session: sent at its timestamp.
        (None, Some(timestamp), _) => (timestamp, Some(timestamp), Duration::ZERO),
        (None, None, _) => {
            return Err(
                "`timestamp` is missing; only a later turn of a session (same \
                        `session_id`) may omit it"
                    .to_owned(),
            );
        }
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
        input_length: row.input_length,
        output_length: row.output_length,
        blocks: row.hash_ids,
        session,
    })
}

/// The Dynamo rows and the trace's block size.
fn parse_dynamo<'a>(
    lines: impl Iterator<Item = (usize, &'a [u8])>,
    path: &Path,
) -> Result<(u32, Vec<Parsed>), TraceError> {
    // The block size and the line that set it.
    let mut size: Option<(u32, usize)> = None;
    let mut rows = Vec::new();
    for (line, bytes) in lines {
        if let Some(row) =
            dynamo_row(bytes, line, &mut size).map_err(|e| line_error(path, line, e))?
        {
            rows.push(row);
        }
    }
    Ok((size.map_or(1, |(size, _)| size), rows))
}

/// The request of one Dynamo line; `None` for another event.
fn dynamo_row(
    bytes: &[u8],
    line: usize,
    size: &mut Option<(u32, usize)>,
) -> Result<Option<Parsed>, String> {
    let header: DynamoHeader =
        serde_json::from_slice(bytes).map_err(|e| json_problem(e, "a Dynamo request trace row"))?;
    if header.schema.as_deref() != Some(DYNAMO_SCHEMA) {
        let schema = header
            .schema
            .map_or("missing".to_owned(), |s| format!("`{s}`"));
        return Err(format!(
            "`schema` is {schema}, not `{DYNAMO_SCHEMA}`; give a Dynamo request trace, or set \
             the trace format to `mooncake`"
        ));
    }
    if header.event_type.as_deref() != Some("request_end") {
        return Ok(None);
    }
    let row: DynamoLine =
        serde_json::from_slice(bytes).map_err(|e| json_problem(e, "a Dynamo `request_end` row"))?;
    let Some(replay) = row.request.replay else {
        return Err("`request.replay` is missing; run the Dynamo frontend with \
                    `DYN_REQUEST_TRACE=1` so request_end rows carry replay metadata (block \
                    size, input length and block hashes)"
            .to_owned());
    };
    let block_size = replay.trace_block_size;
    if block_size == 0 {
        return Err(
            "`request.replay.trace_block_size` is 0; it must be the KV block size in tokens".into(),
        );
    }
    match *size {
        None => *size = Some((block_size, line)),
        Some((first, first_line)) if first != block_size => {
            return Err(format!(
                "`request.replay.trace_block_size` is {block_size} but line {first_line} has \
                 {first}; one trace must have one block size (record each frontend \
                 configuration as its own trace)"
            ));
        }
        Some(_) => {}
    }
    let names = [
        "request.replay.input_sequence_hashes",
        "`request.replay.input_length`",
        "`trace_block_size`",
        "the row is inconsistent; record the trace again",
    ];
    let hashes = replay.input_sequence_hashes;
    check_blocks(hashes.len(), replay.input_length, block_size, names)?;
    let received = checked_millis(
        "request.request_received_ms",
        row.request.request_received_ms,
    )?;
    let session = row.agent_context.and_then(|context| context.session_id);
    Ok(Some(Parsed {
        key: received,
        at: Some(received),
        delay: Duration::ZERO,
        input_length: replay.input_length,
        output_length: row.request.output_tokens,
        blocks: hashes,
        session: session_key("agent_context.session_id", session)?,
    }))
}

/// One prompt built from a trace row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPrompt {
    /// The prompt text: the row's whole blocks, then text unique to the row.
    pub text: String,
    /// The tokens the text encodes to, as counted by the [`TokenModel`] (exact with a real
    /// tokenizer, an estimate with the approximation).
    pub tokens: usize,
    /// How many of those tokens are the row's block texts (a multiple of the block size).
    pub shared_blocks_tokens: usize,
}

/// Builds prompts from trace rows for one run: each block id maps to `block_size` tokens of text
/// that depend only on (run salt, id), so rows naming the same leading ids start with
/// byte-identical text. Share it through an `Arc` (it is `Send + Sync`) so every target and
/// worker gets the same texts.
#[derive(Debug)]
pub struct BlockPrompts {
    model: Arc<TokenModel>,
    block_size: usize,
    run_salt: u64,
    cache: Mutex<BlockCache>,
}

/// Block texts by id, with their total size; cleared whole when a bound is passed, which costs
/// only a rebuild of the texts still in use.
#[derive(Debug, Default)]
struct BlockCache {
    texts: HashMap<u64, Arc<str>>,
    bytes: usize,
}

impl BlockPrompts {
    /// Prompts counted with `model`, `block_size` tokens per block id, salted with `run_salt`
    /// (a new salt per run keeps an earlier run's cache from matching).
    pub fn new(
        model: Arc<TokenModel>,
        block_size: usize,
        run_salt: u64,
    ) -> Result<Self, PromptError> {
        if block_size == 0 {
            return Err(PromptError::ZeroBlockSize);
        }
        Ok(Self {
            model,
            block_size,
            run_salt,
            cache: Mutex::new(BlockCache::default()),
        })
    }

    /// Tokens per block id.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The text of block `id`: exactly `block_size` tokens of single-token words, the same for
    /// the same (run salt, id) on every call and every builder.
    pub fn block_text(&self, id: u64) -> Result<Arc<str>, PromptError> {
        if let Some(text) = self.lock().texts.get(&id) {
            return Ok(Arc::clone(text));
        }
        // Composed outside the lock: other workers' blocks need not wait for this one.
        let seed = derive_seed(self.run_salt, &[TRACE_DOMAIN, id]);
        let text: Arc<str> = compose(&self.model, "", 0, self.block_size, seed)?.into();
        let mut cache = self.lock();
        if cache.texts.len() >= MAX_CACHED_BLOCKS
            || cache.bytes + text.len() > MAX_CACHED_BLOCK_BYTES
        {
            cache.texts.clear();
            cache.bytes = 0;
        }
        if cache.texts.insert(id, Arc::clone(&text)).is_none() {
            cache.bytes += text.len();
        }
        Ok(text)
    }

    /// The prompt of `row` with `body_tokens` tokens of text (its `input_length` less the chat
    /// template's tokens): the texts of the row's leading block ids, as many whole blocks as
    /// fit, then text unique to the row seeded by (run salt, `row_index`) up to the length; so a
    /// shorter body drops the last blocks and a longer one than the ids cover ends in unique
    /// text. The total re-encodes to exactly `body_tokens` by the model's count (the unique
    /// tail absorbs any merge at the seams). Pass a different `row_index` per send when repeated
    /// sends of one row must not share their tails.
    pub fn prompt(
        &self,
        row: &TraceRow,
        body_tokens: usize,
        row_index: u64,
    ) -> Result<BlockPrompt, PromptError> {
        let whole = row.blocks.len().min(body_tokens / self.block_size);
        let mut head = String::new();
        for &id in &row.blocks[..whole] {
            head.push_str(&self.block_text(id)?);
        }
        let shared_blocks_tokens = whole * self.block_size;
        let seed = derive_seed(self.run_salt, &[TAIL_DOMAIN, row_index]);
        let text = compose(&self.model, &head, shared_blocks_tokens, body_tokens, seed)?;
        Ok(BlockPrompt {
            text,
            tokens: body_tokens,
            shared_blocks_tokens,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BlockCache> {
        self.cache
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tokenizer::tests::trained_tokenizer;
    use std::io::Write;
    use std::sync::OnceLock;

    const PATH: &str = "traces/chat.jsonl";

    fn mooncake(text: &str, block_size: u32) -> Result<Trace, TraceError> {
        Trace::parse(
            text.as_bytes(),
            TraceFormat::Mooncake,
            block_size,
            Path::new(PATH),
        )
    }

    /// Six rows (block size 16) with shared leading ids and two sessions, out of time order in
    /// the file. Replay order: lines 1, 4, 6, 2, 3, 5.
    const SMALL: &str = r#"{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]}
{"timestamp": 100, "input_length": 32, "output_length": 6, "hash_ids": [1, 2], "session_id": "a"}
{"input_length": 70, "output_length": 7, "hash_ids": [1, 2, 4, 5, 6], "session_id": "a", "delay": 250}

{"timestamp": 50.5, "input_length": 20, "output_length": 3, "hash_ids": [7, 8], "session_id": 9}
{"timestamp": 400, "input_length": 48, "output_length": 4, "hash_ids": [1, 2, 3], "session_id": "9"}
{"timestamp": 50.5, "input_length": 16, "output_length": 2, "hash_ids": [1]}
"#;

    fn small() -> Trace {
        mooncake(SMALL, 16).expect("parses")
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn mooncake_rows_are_ordered_by_time_with_sessions_following_their_turns() {
        let trace = small();
        assert_eq!(trace.format, TraceFormat::Mooncake);
        assert_eq!(trace.block_size, 16);
        let outputs: Vec<u32> = trace.rows.iter().map(|row| row.output_length).collect();
        assert_eq!(outputs, [5, 3, 2, 6, 7, 4], "lines 1, 4, 6, 2, 3, 5");
        let at: Vec<Option<Duration>> = trace.rows.iter().map(|row| row.at).collect();
        let half = Duration::from_micros(50_500);
        assert_eq!(
            at,
            [
                Some(ms(0)),
                Some(half),
                Some(half),
                Some(ms(100)),
                None,
                Some(ms(400))
            ]
        );
        // The follow-up with a delay waits on its predecessor; the one with a timestamp only
        // keeps it (the driver takes the later of it and the previous reply's end).
        assert_eq!(trace.rows[4].delay, ms(250));
        assert_eq!(trace.rows[5].delay, Duration::ZERO);
        // Sessions numbered by first appearance in replay order; 9 and "9" are one session.
        let sessions: Vec<Option<u32>> = trace.rows.iter().map(|row| row.session).collect();
        assert_eq!(sessions, [None, Some(0), None, Some(1), Some(1), Some(0)]);
        assert_eq!(trace.sessions, 2);
        assert_eq!(trace.span, ms(400));
        // Cumulative turns keep their own ids: the history is not appended again.
        assert_eq!(trace.rows[4].blocks, [1, 2, 4, 5, 6]);
        assert_eq!(trace.rows[4].input_length, 70);
        assert_eq!(trace.next_in_session(1), Some(5));
        assert_eq!(trace.next_in_session(3), Some(4));
        assert_eq!(trace.next_in_session(4), None);
        assert_eq!(trace.next_in_session(0), None);
        assert_eq!(trace.next_in_session(99), None);
        assert_eq!(
            trace.session_successors(),
            [None, Some(5), None, Some(4), None, None]
        );
    }

    fn dynamo_row(id: u32, received: u64, session: Option<&str>, size: u32, len: u32) -> String {
        let hashes: Vec<u64> = (0..len.div_ceil(size))
            .map(|block| u64::MAX - u64::from(block) - u64::from(id % 2) * 1000)
            .collect();
        let mut row = serde_json::json!({
            "schema": DYNAMO_SCHEMA,
            "event_type": "request_end",
            "event_time_unix_ms": received + 700,
            "request": {
                "request_id": format!("req-{id}"),
                "request_received_ms": received,
                "input_tokens": len,
                "output_tokens": 10 + id,
                "replay": {
                    "trace_block_size": size,
                    "input_length": len,
                    "input_sequence_hashes": hashes,
                },
            },
        });
        if let Some(session) = session {
            row["agent_context"] = serde_json::json!({ "session_id": session });
        }
        row.to_string()
    }

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

    #[test]
    fn detect_tells_dynamo_from_mooncake_by_the_schema_key() {
        let dynamo = dynamo_row(0, 1, None, 16, 16);
        assert_eq!(TraceFormat::detect(&dynamo), TraceFormat::Dynamo);
        let first = SMALL.lines().next().expect("a line");
        assert_eq!(TraceFormat::detect(first), TraceFormat::Mooncake);
        assert_eq!(
            TraceFormat::detect("{\"schema\": \"x\", "),
            TraceFormat::Dynamo
        );
        assert_eq!(TraceFormat::detect(""), TraceFormat::Mooncake);
        let format: TraceFormat = serde_json::from_str("\"dynamo\"").expect("snake_case");
        assert_eq!(format, TraceFormat::Dynamo);
        assert_eq!(
            serde_json::to_string(&TraceFormat::Mooncake).expect("serialises"),
            "\"mooncake\""
        );
    }

    /// `sessions` sessions of three turns (the later ones after a delay) and `singles` rows
    /// without a session, interleaved over time.
    fn many(sessions: u32, singles: u32) -> Trace {
        let mut text = String::new();
        for session in 0..sessions {
            let start = session * 10;
            text.push_str(&format!(
                "{{\"timestamp\": {start}, \"input_length\": 16, \"output_length\": 1, \
                 \"session_id\": \"s{session}\"}}\n"
            ));
            for _ in 0..2 {
                text.push_str(&format!(
                    "{{\"input_length\": 32, \"output_length\": 1, \"session_id\": \
                     \"s{session}\", \"delay\": 5}}\n"
                ));
            }
        }
        for single in 0..singles {
            text.push_str(&format!(
                "{{\"timestamp\": {}, \"input_length\": 16, \"output_length\": 2}}\n",
                single * 10 + 5
            ));
        }
        mooncake(&text, 16).expect("parses")
    }

    #[test]
    fn sample_keeps_whole_sessions_and_is_deterministic() {
        let trace = many(200, 200);
        let sampled = trace.sample(0.5, 42);
        assert_eq!(sampled, trace.sample(0.5, 42), "deterministic");
        assert_ne!(sampled, trace.sample(0.5, 43), "the seed matters");
        let mut turns: HashMap<u32, Vec<&TraceRow>> = HashMap::new();
        for row in &sampled.rows {
            if let Some(session) = row.session {
                turns.entry(session).or_default().push(row);
            }
        }
        assert_eq!(turns.len() as u32, sampled.sessions);
        for rows in turns.values() {
            assert_eq!(rows.len(), 3, "a session is kept whole");
            assert!(rows[0].at.is_some() && rows[1].at.is_none() && rows[2].at.is_none());
        }
        assert!(
            (70..=130).contains(&sampled.sessions),
            "{}",
            sampled.sessions
        );
        let singles = sampled
            .rows
            .iter()
            .filter(|row| row.session.is_none())
            .count();
        assert!((70..=130).contains(&singles), "{singles}");
        // Sessions are renumbered 0.. in order and offsets start at zero again.
        assert_eq!(sampled.rows.iter().find_map(|row| row.session), Some(0));
        assert_eq!(sampled.rows[0].at, Some(Duration::ZERO));
        assert_eq!(trace.sample(1.0, 1), trace);
        assert!(trace.sample(0.0, 1).rows.is_empty());
        assert!(trace.sample(f64::NAN, 1).rows.is_empty());
    }

    #[test]
    fn truncate_cuts_between_whole_sessions() {
        // Order: none, s0, none, s1, s1, s0 (two turns each).
        let trace = small();
        let outputs = |trace: &Trace| {
            trace
                .rows
                .iter()
                .map(|row| row.output_length)
                .collect::<Vec<_>>()
        };
        // Row 1 and session 0 (both turns) fit in 3; the next single row does not.
        let three = trace.truncate(3);
        assert_eq!(outputs(&three), [5, 3, 4]);
        assert_eq!(three.sessions, 1);
        assert_eq!(three.span, ms(400));
        // Session 1 does not fit in what is left of 4, so the cut is before it.
        assert_eq!(outputs(&trace.truncate(4)), [5, 3, 2, 4]);
        assert_eq!(outputs(&trace.truncate(1)), [5]);
        assert_eq!(trace.truncate(1).span, Duration::ZERO);
        assert_eq!(trace.truncate(6), trace);
        assert!(trace.truncate(0).rows.is_empty());
        // A first session longer than the cap is cut after its first turns, never before them.
        let one_session = many(1, 0);
        let cut = one_session.truncate(2);
        assert_eq!(cut.rows.len(), 2);
        assert_eq!(cut.rows[0].at, Some(Duration::ZERO));
        assert_eq!(cut.rows[1].at, None);
    }

    #[test]
    fn replay_offsets_loop_with_the_period_and_speed() {
        // Timestamps 0, 50.5, 50.5, 100 and 400 ms: span 400, mean gap 100, period 500 ms.
        let trace = small();
        let half = Duration::from_micros(50_500);
        let pass = |k: u32| {
            let base = ms(500) * k;
            vec![
                (base, 0),
                (base + half, 1),
                (base + half, 2),
                (base + ms(100), 3),
                (base + ms(400), 5),
            ]
        };
        let first: Vec<(Duration, usize)> = trace.replay_offsets(1.0).take(15).collect();
        assert_eq!(first, [pass(0), pass(1), pass(2)].concat());
        // Twice as fast: every offset and the period halve.
        let doubled: Vec<(Duration, usize)> = trace.replay_offsets(2.0).take(10).collect();
        let halved: Vec<(Duration, usize)> = [pass(0), pass(1)]
            .concat()
            .into_iter()
            .map(|(at, row)| (at / 2, row))
            .collect();
        assert_eq!(doubled, halved);
        assert_eq!(
            trace.replay_offsets(-1.0).take(5).collect::<Vec<_>>(),
            pass(0),
            "a nonsensical speed counts as 1"
        );
        // A single timestamp repeats every second (over the speed).
        let single = mooncake(
            "{\"timestamp\": 7, \"input_length\": 1, \"output_length\": 1}",
            16,
        )
        .expect("parses");
        let offsets: Vec<(Duration, usize)> = single.replay_offsets(4.0).take(3).collect();
        assert_eq!(offsets, [(ms(0), 0), (ms(250), 0), (ms(500), 0)]);
        let empty = trace.truncate(0);
        assert_eq!(empty.replay_offsets(1.0).next(), None);
    }

    #[test]
    fn expected_hit_tokens_follow_whole_leading_blocks() {
        // In replay order, block size 16:
        //   [1,2,3] len 40: nothing cached; caches 1,2 (3 is a partial block)        -> 0
        //   [7,8]   len 20: caches 7                                                   -> 0
        //   [1]     len 16: 1 block hit, capped at 15 tokens, i.e. 0 whole blocks      -> 0
        //   [1,2]   len 32: 2 blocks hit, capped at 31 -> 16                           -> 16
        //   [1,2,4,5,6] len 70: 1,2 hit; caches 4,5                                    -> 32
        //   [1,2,3] len 48: 1,2 hit; 3 was only partial before, now cached             -> 32
        let (reusable, prompt) = small().expected_hit_tokens();
        assert_eq!(reusable, 80);
        assert_eq!(prompt, 40 + 20 + 16 + 32 + 70 + 48);
        // The same id after a different prefix is a different block, and a block that was only
        // partial (8 of 16 tokens) was not cached: the fifth row reuses one block, not two.
        let rows: [(u32, &[u64]); 5] = [
            (64, &[1, 2, 3, 4]),
            (64, &[9, 2, 3, 4]),
            (65, &[1, 2, 3, 4, 5]),
            (24, &[7, 8]),
            (48, &[7, 8, 10]),
        ];
        let text: String = rows
            .iter()
            .map(|(len, ids)| {
                format!(
                    "{{\"timestamp\": 0, \"input_length\": {len}, \"output_length\": 1, \
                     \"hash_ids\": {ids:?}}}\n"
                )
            })
            .collect();
        let shifted = mooncake(&text, 16).expect("parses");
        assert_eq!(shifted.expected_hit_tokens(), (64 + 16, 193 + 24 + 48));
    }

    fn real_model() -> Arc<TokenModel> {
        static MODEL: OnceLock<Arc<TokenModel>> = OnceLock::new();
        MODEL
            .get_or_init(|| Arc::new(TokenModel::from_tokenizer(trained_tokenizer(), "test")))
            .clone()
    }

    fn row(blocks: &[u64]) -> TraceRow {
        TraceRow {
            at: Some(Duration::ZERO),
            delay: Duration::ZERO,
            input_length: 1000,
            output_length: 1,
            blocks: blocks.to_vec(),
            session: None,
        }
    }

    #[test]
    fn shared_block_ids_give_byte_identical_prompt_blocks() {
        for model in [real_model(), Arc::new(TokenModel::approximate())] {
            let prompts = BlockPrompts::new(model.clone(), 16, 7).expect("valid");
            let a = prompts.prompt(&row(&[1, 2, 3]), 60, 0).expect("builds");
            let b = prompts.prompt(&row(&[1, 2, 9]), 60, 1).expect("builds");
            for prompt in [&a, &b] {
                assert_eq!(model.count(&prompt.text), 60, "{model:?}");
                assert_eq!(prompt.tokens, 60);
                assert_eq!(prompt.shared_blocks_tokens, 48);
            }
            let two = format!(
                "{}{}",
                prompts.block_text(1).unwrap(),
                prompts.block_text(2).unwrap()
            );
            assert_eq!(model.count(&two), 32);
            assert!(a.text.starts_with(&two) && b.text.starts_with(&two));
            let (third_a, third_b) = (&a.text[two.len()..], &b.text[two.len()..]);
            assert!(third_a.starts_with(&*prompts.block_text(3).unwrap()));
            assert!(third_b.starts_with(&*prompts.block_text(9).unwrap()));
            assert_ne!(
                prompts.block_text(3).unwrap(),
                prompts.block_text(9).unwrap()
            );
            // A block is a pure function of (salt, id): a fresh builder agrees, another run not.
            let again = BlockPrompts::new(model.clone(), 16, 7).expect("valid");
            assert_eq!(again.prompt(&row(&[1, 2, 3]), 60, 0).expect("builds"), a);
            let other = BlockPrompts::new(model.clone(), 16, 8).expect("valid");
            assert_ne!(other.block_text(1).unwrap(), prompts.block_text(1).unwrap());
            // Equal ids on equal rows differ only in their unique tails.
            let tail = prompts.prompt(&row(&[1, 2, 3]), 60, 5).expect("builds");
            assert_eq!(tail.text[..two.len()], a.text[..two.len()]);
            assert_ne!(tail.text, a.text);
        }
    }

    #[test]
    fn prompts_trim_blocks_that_do_not_fit_and_extend_past_the_ids_exactly() {
        let model = real_model();
        let prompts = BlockPrompts::new(model.clone(), 16, 3).expect("valid");
        let blocks = [4, 5, 6];
        for (body, shared) in [
            (0, 0),
            (1, 0),
            (15, 0),
            (16, 16),
            (40, 32),
            (48, 48),
            (300, 48),
        ] {
            let prompt = prompts.prompt(&row(&blocks), body, 9).expect("builds");
            assert_eq!(model.count(&prompt.text), body, "body {body}");
            assert_eq!(prompt.shared_blocks_tokens, shared, "body {body}");
            let head: String = blocks[..shared / 16]
                .iter()
                .map(|&id| prompts.block_text(id).unwrap().to_string())
                .collect();
            assert!(prompt.text.starts_with(&head));
        }
        // Long blocks, as Mooncake's 512, compose exactly too.
        let wide = BlockPrompts::new(model.clone(), 512, 3).expect("valid");
        let prompt = wide.prompt(&row(&[1, 2]), 1000, 0).expect("builds");
        assert_eq!(model.count(&prompt.text), 1000);
        assert_eq!(prompt.shared_blocks_tokens, 512);
        assert!(matches!(
            BlockPrompts::new(model, 0, 0),
            Err(PromptError::ZeroBlockSize)
        ));
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<BlockPrompts>();
        assert_send_sync::<ReplayOffsets>();
    }

    #[test]
    fn the_fixture_traces_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/traces");
        let mooncake = Trace::load(
            &dir.join("mooncake-shared.jsonl"),
            TraceFormat::Mooncake,
            16,
        )
        .expect("Mooncake fixture loads");
        assert_eq!(mooncake.rows.len(), 40);
        assert_eq!(mooncake.sessions, 2);
        assert_eq!(
            mooncake.rows.iter().filter(|row| row.at.is_none()).count(),
            4,
            "two sessions of three turns"
        );
        assert!(mooncake.span <= Duration::from_secs(2));
        let (reusable, prompt) = mooncake.expected_hit_tokens();
        assert!(reusable > prompt / 10, "{reusable} of {prompt}");

        let path = dir.join("dynamo-trace.jsonl");
        let first = std::fs::read_to_string(&path).expect("reads");
        let first = first.lines().next().expect("a line");
        assert_eq!(TraceFormat::detect(first), TraceFormat::Dynamo);
        let dynamo = Trace::load(&path, TraceFormat::Dynamo, 512).expect("Dynamo fixture loads");
        assert_eq!((dynamo.rows.len(), dynamo.block_size), (20, 16));
        assert!(dynamo.rows.iter().all(|row| row.at.is_some()));
        assert_eq!(dynamo.sessions, 2);
        assert!(dynamo.expected_hit_tokens().0 > 0);
    }
}
