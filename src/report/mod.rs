//! The bench report (`llm-canary bench`): one pass of the plan ([`bench`]), the benchmark plan's
//! result tables, the answers to its four questions and the recommendation table built from the
//! step results and the SLO verdicts ([`analysis`]), their renderings as text, Markdown, CSV and
//! JSON ([`table`]), the per-request export `requests.jsonl` ([`records`]) and the self-contained
//! HTML report; and `llm-canary compare`, two runs' folders side by side ([`compare`]).

pub mod analysis;
mod arrivals;
pub mod bench;
mod breakdown;
mod cancellations;
pub mod compare;
mod datasets;
mod html;
mod progress;
mod questions;
mod reasoning;
pub mod records;
pub mod search;
mod search_progress;
mod svg;
pub mod table;
mod traces;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::model::StepResult;
pub use analysis::{Fit, Report};
pub use bench::{BenchOptions, BenchOutcome, run_bench};
pub use progress::live_on_terminal;
pub use table::{Cell, Column, Table};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The options cannot be run (a workload not in the config, a bad time scale): exit 2.
    #[error("{0}")]
    Usage(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Deployment(#[from] crate::targets::TargetError),
    #[error("cannot serialise the report: {0}")]
    Json(#[from] serde_json::Error),
}

impl ReportError {
    pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
        move |source| ReportError::Io {
            path: path.to_owned(),
            source,
        }
    }

    /// The process exit code (docs/DESIGN.md §2): 2 bad usage or config, 1 runtime failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            ReportError::Usage(_) => 2,
            _ => 1,
        }
    }
}

/// One target of the run as the report names it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetInfo {
    pub name: String,
    pub serving_mode: String,
    pub cost_per_hour_usd: Option<f64>,
}

/// What was run, and whether it ran to the end.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub version: &'static str,
    /// The config file, or `<embedded demo>`.
    pub config: String,
    pub time_scale: f64,
    pub workloads: Vec<String>,
    pub targets: Vec<TargetInfo>,
    pub started_unix: f64,
    pub ended_unix: f64,
    /// Steps planned and steps that finished (an interrupted step is not reported).
    pub steps_planned: usize,
    pub steps_finished: usize,
    /// Stopped by a signal before the plan ended.
    pub interrupted: bool,
    /// The run's goodput definition (targets may have their own).
    pub goodput: crate::request::GoodputLimits,
    /// Configured targets that could not be started (their model lookup, key or TLS failed),
    /// and why: the others were measured without them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_targets: Vec<FailedTarget>,
}

/// A configured target the bench could not measure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedTarget {
    pub name: String,
    pub error: String,
}

/// One SLO's verdict at the end of the bench, from the SLO engine (`crate::slo`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloVerdict {
    pub name: String,
    /// The rule as canonical text (the report files it under the question whose workload it
    /// reads).
    pub expr: String,
    /// `pass`, `fail` or `insufficient_data`.
    pub state: String,
    pub value: Option<f64>,
    pub threshold: Option<f64>,
    /// Why the state is `insufficient_data`.
    pub reason: Option<String>,
}

/// Everything a bench measured: the input of the report.
#[derive(Debug, Clone, Serialize)]
pub struct BenchData {
    pub run: RunInfo,
    /// Every finished step's results (per target and label set; `total` marks per-target totals;
    /// `server` holds what the server's own metrics said, where they were scraped).
    pub steps: Vec<StepResult>,
    /// TTFT in seconds of every successful steady-window request per (target, distribution):
    /// the box plots need quartiles, which step summaries do not keep.
    #[serde(skip)]
    pub ttft_by_distribution: BTreeMap<(String, String), Vec<f64>>,
    /// The verdict of every SLO in the config (empty: none configured).
    pub slo: Vec<SloVerdict>,
}
