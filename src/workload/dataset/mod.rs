//! Datasets of real prompts (docs/METRICS.md, "Datasets"): a ShareGPT-style JSON file or a JSONL
//! file of prompts ([`parse`]), read once, measured with the configured tokenizer, filtered and
//! sampled as configured into conversations whose turns carry their exact ISL and OSL.
//!
//! A conversation's turn *k* is sent as the conversation's messages up to its *k*-th user
//! message: the earlier user messages and the replies the dataset recorded, never the replies a
//! server gave. That keeps every turn's ISL the dataset's own (the same on every target and every
//! run, and measurable before anything is sent), where a server's own replies would make the
//! history, and so the ISL, depend on the server under test.

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

#[cfg(test)]
use super::MAX_TURNS;
use super::tokenizer::TokenModel;
use super::{MAX_ISL, MAX_OSL};

pub mod parse;

pub use parse::RowProblem;

/// The largest dataset file read (ShareGPT V3's unfiltered split is about 670 MB).
pub const MAX_DATASET_BYTES: u64 = 1 << 30;

/// The most bad rows one error lists; the rest are counted.
pub const MAX_LISTED_ROWS: usize = 20;

/// Datasets kept measured in the process (see [`Dataset::load_shared`]).
const KEPT_DATASETS: usize = 4;

/// Domain tag of the shuffle's seed.
const SHUFFLE_DOMAIN: u64 = 0x6461_7461; // "data"

/// The format a dataset file is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetFormat {
    /// A JSON array of `{"conversations": [{"from", "value"}, …]}` (vLLM's and AIPerf's).
    Sharegpt,
    /// One object per line: `prompt`, `messages` or `conversations`, with `output_tokens` or
    /// `max_tokens`.
    Jsonl,
}

impl DatasetFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DatasetFormat::Sharegpt => "sharegpt",
            DatasetFormat::Jsonl => "jsonl",
        }
    }
}

/// Who says a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaker {
    System,
    User,
    Assistant,
}

/// One message of a conversation, as the file has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub speaker: Speaker,
    pub text: String,
}

/// Where a row is in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A JSONL line, from 1.
    Line(usize),
    /// An element of a JSON array, from 0.
    Index(usize),
    /// A place in a JSON file that is not an array element (the array itself is broken).
    Position { line: usize, column: usize },
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Line(n) => write!(f, "line {n}"),
            Place::Index(i) => write!(f, "entry [{i}]"),
            Place::Position { line, column } => write!(f, "line {line} column {column}"),
        }
    }
}

/// A row as parsed, before it is measured.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) place: Place,
    pub(crate) messages: Vec<Message>,
    /// The row's `output_tokens` (or `max_tokens`).
    pub(crate) output_tokens: Option<u32>,
    /// A conversation replayed turn by turn (ShareGPT), not one request (a JSONL prompt).
    pub(crate) replayed: bool,
}

/// Why a dataset cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("dataset {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: crate::files::FileError,
    },
    #[error(
        "dataset {}: {} bad rows{}; first: {}: {}",
        .path.display(),
        .rows.len() + .more,
        if *.more > 0 { format!(" ({} listed)", .rows.len()) } else { String::new() },
        .rows[0].0,
        .rows[0].1
    )]
    Rows {
        path: PathBuf,
        /// The first [`MAX_LISTED_ROWS`] bad rows.
        rows: Vec<(Place, RowProblem)>,
        /// Bad rows beyond those.
        more: usize,
    },
    #[error("dataset {}: no conversation left to send ({report})", .path.display())]
    Empty { path: PathBuf, report: Report },
}

/// How rows are chosen and measured: the config's `workloads.dataset` keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selection {
    /// Every turn's OSL, in place of the dataset's.
    pub osl: Option<u32>,
    /// The first turn's ISL range; a later turn above its top ends the conversation there.
    pub isl: Option<(u32, u32)>,
    /// At most this many conversations, taken in (shuffled) order after the filters.
    pub max_rows: Option<u32>,
    /// Turns of one conversation sent, from its first.
    pub max_turns: u32,
    /// Rows taken in a seeded random order rather than the file's.
    pub shuffle: bool,
    pub seed: u64,
}

/// One request of a conversation: the messages before it and its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The request sends `messages[..upto]`.
    pub upto: usize,
    /// The tokenizer's count of those messages' texts (the server's chat template not counted).
    pub isl: u32,
    pub osl: u32,
}

/// A conversation (or a single prompt) as it is replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    pub place: Place,
    /// The messages its turns send, the last turn's last.
    pub messages: Vec<Message>,
    /// At least one.
    pub turns: Vec<Turn>,
}

/// What loading did with the file's rows: `check` prints it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Rows in the file.
    pub rows: usize,
    /// Conversations kept.
    pub kept: usize,
    /// Rows dropped: the first turn's ISL outside the `isl` range (or above the most a request
    /// may have).
    pub outside_isl: usize,
    /// Rows dropped: no user message with a reply (or an output length) to send.
    pub without_turn: usize,
    /// Later turns left out: above the `isl` range, past `max_turns`, or too long to send.
    pub turns_cut: usize,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} rows kept; dropped: {} outside the ISL range, {} without a turn to send; {} later turns cut",
            self.kept, self.rows, self.outside_isl, self.without_turn, self.turns_cut
        )
    }
}

/// A dataset as a step replays it.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub path: PathBuf,
    pub format: DatasetFormat,
    pub conversations: Vec<Conversation>,
    pub report: Report,
}

impl Dataset {
    /// Reads `path` (at most [`MAX_DATASET_BYTES`]) in `format` (absent: a JSON array is
    /// ShareGPT, anything else JSONL), and measures and selects its rows.
    pub fn load(
        path: &Path,
        format: Option<DatasetFormat>,
        tokens: &TokenModel,
        selection: &Selection,
    ) -> Result<Dataset, DatasetError> {
        let text = crate::files::read_text(path, MAX_DATASET_BYTES).map_err(|source| {
            DatasetError::Read {
                path: path.to_owned(),
                source,
            }
        })?;
        let format = format.unwrap_or_else(|| parse::detect(&text));
        let (rows, bad) = parse::parse(&text, format);
        drop(text);
        if !bad.is_empty() {
            return Err(rows_error(path, bad));
        }
        Dataset::select(path, format, rows, tokens, selection)
    }

    /// [`Dataset::load`], read once per process for as long as the file, the tokenizer and the
    /// selection stay the same: `check`'s validation, its warnings and the steps of a run share
    /// one reading (a file that changed, by length or modification time, is read again).
    pub fn load_shared(
        path: &Path,
        format: Option<DatasetFormat>,
        tokens: &TokenModel,
        selection: &Selection,
    ) -> Result<Arc<Dataset>, DatasetError> {
        let key = Key::of(path, format, Some(tokens.source()), selection);
        if let Some(d) = kept().iter().find(|(k, _)| *k == key) {
            return Ok(Arc::clone(&d.1));
        }
        let dataset = Arc::new(Dataset::load(path, format, tokens, selection)?);
        let mut kept = kept();
        if kept.len() >= KEPT_DATASETS {
            kept.pop_front();
        }
        kept.push_back((key, Arc::clone(&dataset)));
        Ok(dataset)
    }

    /// The reading [`Dataset::load_shared`] keeps of this file and selection, with whatever
    /// tokenizer it was measured: what the plan's cost estimate reads, never reading the file
    /// itself; `None` when no reading is kept.
    pub fn kept_reading(
        path: &Path,
        format: Option<DatasetFormat>,
        selection: &Selection,
    ) -> Option<Arc<Dataset>> {
        let key = Key::of(path, format, None, selection);
        kept()
            .iter()
            .rev()
            .find(|(k, _)| {
                Key {
                    tokenizer: None,
                    ..k.clone()
                } == key
            })
            .map(|(_, d)| Arc::clone(d))
    }

    /// The rows measured with `tokens`, filtered, ordered and cut as `selection` says. Rows are
    /// measured in the order they are taken and only until `max_rows` are kept, so a large file
    /// with a small sample costs the tokenizer little.
    fn select(
        path: &Path,
        format: DatasetFormat,
        mut rows: Vec<Row>,
        tokens: &TokenModel,
        selection: &Selection,
    ) -> Result<Dataset, DatasetError> {
        let mut report = Report {
            rows: rows.len(),
            ..Report::default()
        };
        let mut order: Vec<usize> = (0..rows.len()).collect();
        if selection.shuffle {
            let seed = super::sampler::derive_seed(selection.seed, &[SHUFFLE_DOMAIN]);
            order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        }
        let most = selection.max_rows.map_or(usize::MAX, |m| m as usize);
        let mut conversations = Vec::new();
        let mut bad = Vec::new();
        for i in order {
            if conversations.len() >= most {
                break;
            }
            let row = std::mem::replace(
                &mut rows[i],
                Row {
                    place: Place::Line(0),
                    messages: Vec::new(),
                    output_tokens: None,
                    replayed: false,
                },
            );
            match measure(row, tokens, selection, &mut report) {
                Ok(Some(c)) => conversations.push(c),
                Ok(None) => {}
                Err(problem) => bad.push(problem),
            }
        }
        if !bad.is_empty() {
            bad.sort_by_key(|(place, _)| place_order(*place));
            return Err(rows_error(path, bad));
        }
        report.kept = conversations.len();
        if conversations.is_empty() {
            return Err(DatasetError::Empty {
                path: path.to_owned(),
                report,
            });
        }
        Ok(Dataset {
            path: path.to_owned(),
            format,
            conversations,
            report,
        })
    }

    /// The fewest tokens (prompt and output) a request of the dataset holds: a target whose
    /// context is below it can send none.
    pub fn fewest_tokens(&self) -> u64 {
        self.conversations
            .iter()
            .filter_map(|c| c.turns.first())
            .map(|t| u64::from(t.isl) + u64::from(t.osl))
            .min()
            .unwrap_or(0)
    }

    /// Turns of all conversations kept.
    pub fn turns(&self) -> usize {
        self.conversations.iter().map(|c| c.turns.len()).sum()
    }
}

/// What [`Dataset::load_shared`] keeps a reading by.
#[derive(Clone, PartialEq)]
struct Key {
    path: PathBuf,
    len: Option<u64>,
    modified: Option<std::time::SystemTime>,
    format: Option<DatasetFormat>,
    /// The tokenizer's source (`TokenModel::source`).
    tokenizer: Option<String>,
    selection: Selection,
}

impl Key {
    fn of(
        path: &Path,
        format: Option<DatasetFormat>,
        tokenizer: Option<&str>,
        selection: &Selection,
    ) -> Key {
        let meta = std::fs::metadata(path).ok();
        Key {
            path: path.to_owned(),
            len: meta.as_ref().map(std::fs::Metadata::len),
            modified: meta.and_then(|m| m.modified().ok()),
            format,
            tokenizer: tokenizer.map(str::to_owned),
            selection: selection.clone(),
        }
    }
}

/// The readings kept, oldest first: a process reads a dataset once for `check`'s validation,
/// its warnings, the plan's cost and every step of a run, and again only when the file changed.
fn kept() -> std::sync::MutexGuard<'static, VecDeque<(Key, Arc<Dataset>)>> {
    static KEPT: Mutex<VecDeque<(Key, Arc<Dataset>)>> = Mutex::new(VecDeque::new());
    KEPT.lock().unwrap_or_else(PoisonError::into_inner)
}

fn place_order(place: Place) -> (usize, usize) {
    match place {
        Place::Line(n) | Place::Index(n) => (n, 0),
        Place::Position { line, column } => (line, column),
    }
}

fn rows_error(path: &Path, mut bad: Vec<(Place, RowProblem)>) -> DatasetError {
    let more = bad.len().saturating_sub(MAX_LISTED_ROWS);
    bad.truncate(MAX_LISTED_ROWS);
    DatasetError::Rows {
        path: path.to_owned(),
        rows: bad,
        more,
    }
}

/// One row measured: its turns with their lengths, cut where the selection says; `None` when
/// it is dropped (counted in `report`).
fn measure(
    row: Row,
    tokens: &TokenModel,
    selection: &Selection,
    report: &mut Report,
) -> Result<Option<Conversation>, (Place, RowProblem)> {
    let counts: Vec<u64> = row
        .messages
        .iter()
        .map(|m| tokens.count(&m.text) as u64)
        .collect();
    // Each candidate turn: the index of its user message and its output length.
    let mut candidates: Vec<(usize, Option<u64>)> = Vec::new();
    if row.replayed {
        for (i, m) in row.messages.iter().enumerate() {
            if m.speaker != Speaker::User {
                continue;
            }
            let reply = row
                .messages
                .get(i + 1)
                .filter(|r| r.speaker == Speaker::Assistant)
                .map(|_| counts[i + 1]);
            match (selection.osl, reply) {
                (Some(osl), _) => candidates.push((i, Some(u64::from(osl)))),
                (None, Some(n)) => candidates.push((i, Some(n.max(1)))),
                // A user message nobody answered has no output length: not a turn of its own.
                (None, None) => {}
            }
        }
    } else if !row.messages.is_empty() {
        let osl = selection.osl.or(row.output_tokens);
        let Some(osl) = osl else {
            return Err((row.place, RowProblem::NoOutputLength));
        };
        candidates.push((row.messages.len() - 1, Some(u64::from(osl))));
    }
    let (lo, hi) = selection.isl.unwrap_or((1, MAX_ISL));
    let hi = u64::from(hi.min(MAX_ISL));
    let mut turns = Vec::new();
    let mut sent_before = 0u64;
    let mut counted_upto = 0usize;
    for (k, (i, osl)) in candidates.iter().enumerate() {
        let upto = i + 1;
        sent_before += counts[counted_upto..upto].iter().sum::<u64>();
        counted_upto = upto;
        let osl = osl.unwrap_or(1);
        let isl = sent_before;
        if turns.is_empty() {
            if isl == 0 {
                // Only empty messages so far: nothing to measure a prompt by.
                continue;
            }
            if isl < u64::from(lo) || isl > hi || osl > u64::from(MAX_OSL) {
                report.outside_isl += 1;
                return Ok(None);
            }
        } else if turns.len() >= selection.max_turns as usize
            || isl > hi
            || osl > u64::from(MAX_OSL)
        {
            report.turns_cut += candidates.len() - k;
            break;
        }
        turns.push(Turn {
            upto,
            isl: isl as u32,
            osl: osl as u32,
        });
    }
    let Some(last) = turns.last() else {
        report.without_turn += 1;
        return Ok(None);
    };
    let mut messages = row.messages;
    messages.truncate(last.upto);
    Ok(Some(Conversation {
        place: row.place,
        messages,
        turns,
    }))
}

#[cfg(test)]
mod tests;
