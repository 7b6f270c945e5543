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
//!   gzip-compressed (recognised by the gzip magic bytes, not the file name). Each line is the
//!   record itself or, as Dynamo 1.6.1's frontend writes its files, an envelope
//!   `{"timestamp": …, "event": {record}}` (its `timestamp` counts from the frontend's start and
//!   is not used). Only `request_end`
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

mod parse;
mod prompt;

pub use parse::{LineProblem, MAX_LISTED_LINES};
pub use prompt::{BlockPrompt, BlockPrompts};

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use super::sampler::derive_seed;
use crate::files::FileError;
use parse::{Parsed, decompress, millis, parse_dynamo, parse_mooncake};

/// The largest trace read, compressed or decompressed: far above any trace worth replaying (a
/// million Mooncake rows are ~200 MB), and a bound keeps a wrong path from exhausting memory.
pub const MAX_TRACE_BYTES: u64 = 256 << 20;

/// The block size Mooncake traces are usually recorded with (their `hash_ids` cover 512 tokens).
pub const DEFAULT_TRACE_BLOCK_SIZE: u32 = 512;

/// The `schema` of a Dynamo request trace row.
pub const DYNAMO_SCHEMA: &str = "dynamo.request.trace.v1";

/// A quiet gap between two consecutive requests is compressed when it is longer than this and
/// [`QUIET_GAP_FACTOR`] times the trace's median gap (both in trace time, before `speed`).
pub const QUIET_GAP_MIN: Duration = Duration::from_secs(10);

/// See [`QUIET_GAP_MIN`].
pub const QUIET_GAP_FACTOR: u32 = 20;

/// How long one pass of a trace whose timestamps are all equal lasts (before `speed`).
const FLAT_TRACE_PERIOD: Duration = Duration::from_secs(1);

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
    /// The format of a trace whose first line is `first_line`: an object with a `schema` key, or
    /// an envelope whose `event` has one (as Dynamo's frontend writes its files), is a Dynamo
    /// request trace; anything else is taken for Mooncake, whose rows have no schema.
    pub fn detect(first_line: &str) -> TraceFormat {
        #[derive(Deserialize)]
        struct Probe {
            schema: Option<IgnoredAny>,
            event: Option<EventProbe>,
        }
        #[derive(Deserialize)]
        struct EventProbe {
            schema: Option<IgnoredAny>,
        }
        match serde_json::from_str::<Probe>(first_line.trim()) {
            Ok(probe)
                if probe.schema.is_some()
                    || probe.event.as_ref().is_some_and(|e| e.schema.is_some()) =>
            {
                TraceFormat::Dynamo
            }
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
        problem: LineProblem,
    },
    /// Several bad lines, each as [`TraceError::Line`] says it; `more` past those listed.
    #[error("{}", lines_text(.path, .lines, *.more))]
    Lines {
        path: PathBuf,
        lines: Vec<(usize, LineProblem)>,
        more: usize,
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

/// The text of [`TraceError::Lines`]: one `FILE:LINE: problem` line each, and the count left out.
fn lines_text(path: &Path, lines: &[(usize, LineProblem)], more: usize) -> String {
    let mut text: Vec<String> = lines
        .iter()
        .map(|(line, problem)| format!("{}:{line}: {problem}", path.display()))
        .collect();
    if more > 0 {
        text.push(format!("{}: and {more} more bad lines", path.display()));
    }
    text.join("\n")
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

/// A long silence of a trace, replayed shorter: a capture often starts with a few requests by
/// hand, then nothing for half a minute before the load it was made for; replayed as recorded,
/// a step would spend its window (or its warmup) waiting and measure nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuietGap {
    /// The requests (with a timestamp) before the gap.
    pub after_requests: usize,
    /// Where the gap starts, as recorded (an offset from the first timestamp).
    pub at: Duration,
    /// Its recorded length.
    pub recorded: Duration,
    /// The length it is replayed with: the trace's median gap.
    pub replayed: Duration,
}

impl fmt::Display for QuietGap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.1} s without a request after its first {} request(s) (at {:.1} s) is replayed as \
             {:.3} s, the trace's median gap: a quiet gap longer than {} s and {} times the median \
             gap is compressed so the step measures the load that follows it",
            self.recorded.as_secs_f64(),
            self.after_requests,
            self.at.as_secs_f64(),
            self.replayed.as_secs_f64(),
            QUIET_GAP_MIN.as_secs(),
            QUIET_GAP_FACTOR,
        )
    }
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
    /// The quiet gaps compressed when the trace was loaded, in time order.
    pub quiet_gaps: Vec<QuietGap>,
}

impl Trace {
    /// Reads and parses the trace at `path` (at most [`MAX_TRACE_BYTES`], before and after
    /// decompression). `block_size` is the Mooncake block size; a Dynamo trace records its own.
    pub fn load(path: &Path, format: TraceFormat, block_size: u32) -> Result<Trace, TraceError> {
        Trace::load_any(path, Some(format), block_size)
    }

    /// Like [`Trace::load`]; without a `format`, the one its first line shows
    /// ([`TraceFormat::detect`], read after decompression), as a config that names none wants.
    pub fn load_any(
        path: &Path,
        format: Option<TraceFormat>,
        block_size: u32,
    ) -> Result<Trace, TraceError> {
        let bytes = crate::files::read_bounded(path, MAX_TRACE_BYTES).map_err(|source| {
            TraceError::Read {
                path: path.to_owned(),
                source,
            }
        })?;
        let format = match format {
            Some(f) => f,
            None => {
                let text = decompress(&bytes, path, MAX_TRACE_BYTES)?;
                let first = text
                    .split(|&b| b == b'\n')
                    .map(<[u8]>::trim_ascii)
                    .find(|l| !l.is_empty())
                    .unwrap_or_default();
                TraceFormat::detect(&String::from_utf8_lossy(first))
            }
        };
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
            .collect::<Vec<_>>();
        let mut rows = rows;
        let quiet_gaps = compress_quiet_gaps(&mut rows);
        Trace {
            quiet_gaps,
            ..Trace::from_rows(format, block_size, rows)
        }
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
            quiet_gaps: Vec::new(),
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
        self.with_rows(rows)
    }

    /// A trace of `rows` taken from this one, which keeps the gaps it compressed on loading.
    fn with_rows(&self, rows: Vec<TraceRow>) -> Trace {
        Trace {
            quiet_gaps: self.quiet_gaps.clone(),
            ..Trace::from_rows(self.format, self.block_size, rows)
        }
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
        self.with_rows(rows)
    }

    /// The prefix-cache reuse the trace implies, as (reusable tokens, prompt tokens) summed over
    /// its rows in order with an infinite cache: a row can reuse its longest run of leading
    /// blocks that was already a run of leading whole blocks of an earlier row (a server caches
    /// whole blocks only, so a row's final partial block is never reused), capped at its
    /// `input_length − 1` (the last prompt token is always computed) and rounded down to whole
    /// blocks. What a server's prefix cache can hit when the trace is replayed once.
    pub fn expected_hit_tokens(&self) -> (u64, u64) {
        let reusable = self.expected_hits().iter().sum();
        let prompt = self.rows.iter().map(|r| u64::from(r.input_length)).sum();
        (reusable, prompt)
    }

    /// Each row's reusable tokens of [`Trace::expected_hit_tokens`], in row order.
    pub fn expected_hits(&self) -> Vec<u64> {
        let block_size = u64::from(self.block_size.max(1));
        // A trie of cached block sequences: (parent node, block id) -> node; node 0 is the root.
        let mut children: HashMap<(usize, u64), usize> = HashMap::new();
        let mut hits = Vec::with_capacity(self.rows.len());
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
            hits.push((matched * block_size).min(cap));
        }
        hits
    }

    /// An endless iterator over (offset from the replay start, row index) for the rows with a
    /// timestamp, in time order, the trace repeated back to back: offsets are divided by `speed`
    /// (2 replays twice as fast), and pass `k` adds `k` periods, a period being the span plus the
    /// mean gap between consecutive timestamps (1 s when all are equal), divided by `speed`, so
    /// the seam between passes looks like any other gap. Rows with `at: None` are not yielded:
    /// the driver sends them after their session's previous turn ([`Trace::session_successors`]).
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

    /// For every row, the turn that waits for its reply: the next row of its session in a
    /// Mooncake trace. A Dynamo trace has none: its rows recorded when each request arrived, so
    /// each goes at its timestamp, session or not.
    pub fn session_successors(&self) -> Vec<Option<usize>> {
        let mut next = vec![None; self.rows.len()];
        if self.format == TraceFormat::Dynamo {
            return next;
        }
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

/// Compresses every quiet gap between consecutive timestamps (in time order) that is longer
/// than [`QUIET_GAP_MIN`] and [`QUIET_GAP_FACTOR`] times the median gap to the median gap,
/// shifting every later timestamp back by what was cut; the gaps so compressed, as recorded.
fn compress_quiet_gaps(rows: &mut [TraceRow]) -> Vec<QuietGap> {
    let mut times: Vec<Duration> = rows.iter().filter_map(|row| row.at).collect();
    times.sort_unstable();
    let mut gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_unstable();
    let Some(&median) = gaps.get(gaps.len() / 2) else {
        return Vec::new();
    };
    let limit = QUIET_GAP_MIN.max(median * QUIET_GAP_FACTOR);
    // (recorded start of the gap's end, total cut up to and including it)
    let mut cuts: Vec<(Duration, Duration)> = Vec::new();
    let mut found = Vec::new();
    let mut cut = Duration::ZERO;
    for (index, pair) in times.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        if gap > limit {
            cut += gap - median;
            cuts.push((pair[1], cut));
            found.push(QuietGap {
                after_requests: index + 1,
                at: pair[0],
                recorded: gap,
                replayed: median,
            });
        }
    }
    if cuts.is_empty() {
        return found;
    }
    for at in rows.iter_mut().filter_map(|row| row.at.as_mut()) {
        // The cut of the last gap that ends at or before this timestamp.
        let after = cuts.partition_point(|(end, _)| *end <= *at);
        if let Some(&(_, shift)) = after.checked_sub(1).and_then(|i| cuts.get(i)) {
            *at -= shift;
        }
    }
    found
}

fn duration_from_nanos(nanos: u128) -> Duration {
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    // The remainder is below 10^9, so it fits.
    Duration::new(secs, (nanos % 1_000_000_000) as u32)
}

#[cfg(test)]
mod tests {
    //! The trace's own tests, and the fixtures its submodules' tests share.

    use super::*;

    const PATH: &str = "traces/chat.jsonl";

    pub(super) fn mooncake(text: &str, block_size: u32) -> Result<Trace, TraceError> {
        Trace::parse(
            text.as_bytes(),
            TraceFormat::Mooncake,
            block_size,
            Path::new(PATH),
        )
    }

    /// Six rows (block size 16) with shared leading ids and two sessions, out of time order in
    /// the file. Replay order: lines 1, 4, 6, 2, 3, 5.
    pub(super) const SMALL: &str = r#"{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]}
{"timestamp": 100, "input_length": 32, "output_length": 6, "hash_ids": [1, 2], "session_id": "a"}
{"input_length": 70, "output_length": 7, "hash_ids": [1, 2, 4, 5, 6], "session_id": "a", "delay": 250}

{"timestamp": 50.5, "input_length": 20, "output_length": 3, "hash_ids": [7, 8], "session_id": 9}
{"timestamp": 400, "input_length": 48, "output_length": 4, "hash_ids": [1, 2, 3], "session_id": "9"}
{"timestamp": 50.5, "input_length": 16, "output_length": 2, "hash_ids": [1]}
"#;

    fn small() -> Trace {
        mooncake(SMALL, 16).expect("parses")
    }

    pub(super) fn ms(ms: u64) -> Duration {
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
        assert_eq!(
            trace.session_successors(),
            [None, Some(5), None, Some(4), None, None]
        );
    }

    pub(super) fn dynamo_row(
        id: u32,
        received: u64,
        session: Option<&str>,
        size: u32,
        len: u32,
    ) -> String {
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
        assert!(dynamo.sessions > 0, "the fixture has sessions");
        assert!(
            dynamo.session_successors().iter().all(Option::is_none),
            "Dynamo rows never wait for a reply"
        );
        assert_eq!(dynamo.sessions, 2);
        assert!(dynamo.expected_hit_tokens().0 > 0);
    }

    /// A Mooncake trace of one row at each of `times` (ms).
    fn at_times(times: &[u64]) -> Trace {
        let text: String = times
            .iter()
            .map(|t| {
                format!("{{\"timestamp\": {t}, \"input_length\": 16, \"output_length\": 1}}\n")
            })
            .collect();
        mooncake(&text, 16).expect("parses")
    }

    #[test]
    fn a_long_leading_quiet_gap_is_compressed_to_the_median_gap_and_reported() {
        // As a real capture: three requests by hand, 33 s of nothing, then the load.
        let mut times = vec![0, 100, 200];
        times.extend((0..20).map(|i| 33_200 + i * 200));
        let trace = at_times(&times);
        assert_eq!(
            trace.quiet_gaps,
            [QuietGap {
                after_requests: 3,
                at: ms(200),
                recorded: ms(33_000),
                replayed: ms(200),
            }]
        );
        let at: Vec<Duration> = trace.rows.iter().filter_map(|row| row.at).collect();
        assert_eq!(&at[..5], [ms(0), ms(100), ms(200), ms(400), ms(600)]);
        assert_eq!(trace.span, ms(400 + 19 * 200));
        let said = trace.quiet_gaps[0].to_string();
        assert!(
            said.starts_with("33.0 s without a request after its first 3 request(s) (at 0.2 s) is replayed as 0.200 s"),
            "{said}"
        );
        // Sampling and truncating keep the report of what loading did.
        assert_eq!(trace.truncate(5).quiet_gaps, trace.quiet_gaps);

        // A trace that is sparse all along keeps its gaps: they are its load.
        let sparse = at_times(&[0, 30_000, 60_000, 90_000]);
        assert!(sparse.quiet_gaps.is_empty());
        assert_eq!(sparse.span, ms(90_000));
        // Gaps under 10 s are never compressed, however irregular.
        let short = at_times(&[0, 10, 20, 30, 9_000, 9_010]);
        assert!(short.quiet_gaps.is_empty());
        assert_eq!(short.span, ms(9_010));
    }

    /// The capture of Dynamo 1.6.1's real frontend (tests/testdata/traces/README.md): every line
    /// an envelope, read plain and gzipped, with the lengths and the reuse the frontend recorded
    /// (its own `cached_tokens`: 0, 320, 0, 320, 256, 0).
    #[test]
    fn a_real_dynamo_envelope_trace_loads_plain_and_gzipped() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/traces");
        let plain_path = dir.join("dynamo-1.6.1-envelope.jsonl");
        let text = std::fs::read_to_string(&plain_path).expect("reads");
        let first = text.lines().next().expect("a line");
        assert!(first.starts_with("{\"timestamp\":"), "an envelope: {first}");
        assert_eq!(TraceFormat::detect(first), TraceFormat::Dynamo);
        let plain = Trace::load_any(&plain_path, None, DEFAULT_TRACE_BLOCK_SIZE).expect("loads");
        let gzipped = Trace::load_any(
            &dir.join("dynamo-1.6.1-envelope.jsonl.gz"),
            None,
            DEFAULT_TRACE_BLOCK_SIZE,
        )
        .expect("loads gzipped");
        assert_eq!(plain, gzipped);
        assert_eq!((plain.format, plain.block_size), (TraceFormat::Dynamo, 64));
        let lengths: Vec<(u32, u32)> = plain
            .rows
            .iter()
            .map(|row| (row.input_length, row.output_length))
            .collect();
        assert_eq!(
            lengths,
            [(378, 4), (379, 5), (293, 6), (378, 7), (295, 8), (13, 9)]
        );
        assert_eq!(plain.expected_hits(), [0, 320, 0, 320, 256, 0]);
        // request_received_ms, not the envelope's timestamp (ms since the frontend started).
        assert_eq!(plain.span, ms(1_796_529_595_440 - 1_796_529_594_423));
    }
}
