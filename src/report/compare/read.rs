//! One bench folder as `llm-canary compare` reads it: `summary.json` (which release wrote it,
//! every step result) and `requests.jsonl` (the steady requests behind each step), refused with
//! the reason and the fix when it is not a folder this release can compare.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::request::Outcome;

/// Why two folders cannot be compared; every one exits 2.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error(
        "{}: {source} (hint: pass a folder written by `llm-canary bench --out DIR`)",
        path.display()
    )]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {message} (hint: pass a folder written by `llm-canary bench --out DIR`, complete)", path.display())]
    Format {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "{}: written by llm-canary {found}; this is {ours}, which compares folders of {series} only (hint: run both benches with one release, or compare with the release that wrote them)",
        path.display()
    )]
    Version {
        path: PathBuf,
        found: String,
        ours: &'static str,
        series: String,
    },
    #[error(
        "no steps in common: A has {a}; B has {b} (hint: compare two runs of the same plan: the same targets, workloads and levels)"
    )]
    NoCommonSteps { a: String, b: String },
}

/// What names a step's result: its target, workload and step labels (`concurrency=4`, …).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct StepKey {
    pub target: String,
    pub workload: String,
    pub labels: BTreeMap<String, String>,
}

impl std::fmt::Display for StepKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.target, self.workload)?;
        for (k, v) in &self.labels {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

/// One steady-window request of a step, as `requests.jsonl` has it (latencies in seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Its intended send, CLOCK_MONOTONIC nanoseconds: where in the window it falls.
    pub intended_ns: u64,
    pub outcome: Outcome,
    pub ttft: Option<f64>,
    pub itl: Option<f64>,
    pub latency: f64,
    pub output_tokens: u64,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// Within the target's goodput limits; `None` in a file written before the field existed.
    pub good: Option<bool>,
}

/// One step result and the requests behind it.
#[derive(Debug, Clone)]
pub struct Step {
    pub key: StepKey,
    pub steady_seconds: f64,
    pub requests: Vec<Request>,
}

/// A bench folder.
#[derive(Debug, Clone)]
pub struct Run {
    pub dir: PathBuf,
    pub version: String,
    pub config: String,
    pub steps: Vec<Step>,
}

#[derive(Deserialize)]
struct SummaryFile {
    run: RunFile,
    steps: Vec<StepFile>,
}

#[derive(Deserialize)]
struct RunFile {
    version: String,
    config: String,
}

#[derive(Deserialize)]
struct StepFile {
    target: String,
    workload: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    steady_seconds: f64,
}

/// The fields of a `requests.jsonl` line that compare reads (the others are ignored).
#[derive(Deserialize)]
struct Line {
    target: String,
    workload: String,
    concurrency: Option<String>,
    turn: Option<String>,
    distribution: Option<String>,
    isl_bucket: Option<String>,
    prefix_ratio: Option<String>,
    trace: Option<String>,
    /// A rate ladder's rung (absent in folders written before ladders).
    rate: Option<String>,
    phase: String,
    intended_start_mono_ns: u64,
    ttft_ms: Option<f64>,
    itl_ms: Option<f64>,
    latency_ms: f64,
    completion_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    outcome: Outcome,
    good: Option<bool>,
}

impl Line {
    fn labels(&self) -> [(&'static str, Option<&str>); 7] {
        [
            ("concurrency", self.concurrency.as_deref()),
            ("turn", self.turn.as_deref()),
            ("distribution", self.distribution.as_deref()),
            ("isl_bucket", self.isl_bucket.as_deref()),
            ("prefix_ratio", self.prefix_ratio.as_deref()),
            ("trace", self.trace.as_deref()),
            ("rate", self.rate.as_deref()),
        ]
    }

    /// Whether the request counts for `key`: its target and workload, and every step label the
    /// key has (a per-target total has fewer labels than its requests).
    fn belongs_to(&self, key: &StepKey) -> bool {
        let mine = self.labels();
        self.target == key.target
            && self.workload == key.workload
            && key.labels.iter().all(|(k, v)| {
                mine.iter()
                    .any(|(name, value)| name == k && *value == Some(v.as_str()))
            })
    }

    fn request(&self) -> Request {
        let secs = |ms: f64| ms / 1e3;
        Request {
            intended_ns: self.intended_start_mono_ns,
            outcome: self.outcome,
            ttft: self.ttft_ms.map(secs),
            itl: self.itl_ms.map(secs),
            latency: secs(self.latency_ms),
            output_tokens: self.completion_tokens.unwrap_or(0),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            good: self.good,
        }
    }
}

/// The releases whose folders this one reads: the same major version, or for 0.x the same minor
/// (semver's compatible range), as `0.1` or `1`.
fn series(version: &str) -> String {
    let mut parts = version.split('.');
    match (parts.next(), parts.next()) {
        (Some("0"), Some(minor)) => format!("0.{minor}"),
        (Some(major), _) => major.to_owned(),
        _ => version.to_owned(),
    }
}

/// Reads the bench folder `dir`.
pub fn read_run(dir: &Path) -> Result<Run, CompareError> {
    let summary_path = dir.join("summary.json");
    let text = std::fs::read_to_string(&summary_path).map_err(|source| CompareError::Io {
        path: summary_path.clone(),
        source,
    })?;
    let summary: SummaryFile = serde_json::from_str(&text).map_err(|e| CompareError::Format {
        path: summary_path.clone(),
        line: e.line(),
        message: format!("not a bench summary: {e}"),
    })?;
    let ours = env!("CARGO_PKG_VERSION");
    if series(&summary.run.version) != series(ours) {
        return Err(CompareError::Version {
            path: summary_path,
            found: summary.run.version,
            ours,
            series: series(ours),
        });
    }
    let mut steps: Vec<Step> = summary
        .steps
        .into_iter()
        .map(|s| Step {
            key: StepKey {
                target: s.target,
                workload: s.workload,
                labels: s.labels,
            },
            steady_seconds: s.steady_seconds,
            requests: Vec::new(),
        })
        .collect();
    read_requests(&dir.join("requests.jsonl"), &mut steps)?;
    Ok(Run {
        dir: dir.to_owned(),
        version: summary.run.version,
        config: summary.run.config,
        steps,
    })
}

/// Hands every steady request of `path` to the steps it counts for.
fn read_requests(path: &Path, steps: &mut [Step]) -> Result<(), CompareError> {
    let io = |source| CompareError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(&line).map_err(|e| CompareError::Format {
            path: path.to_owned(),
            line: i + 1,
            message: format!("not a request record: {e}"),
        })?;
        if parsed.phase != "steady" {
            continue;
        }
        for step in steps.iter_mut().filter(|s| parsed.belongs_to(&s.key)) {
            step.requests.push(parsed.request());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_read_the_folders_of_their_semver_series() {
        assert_eq!(series("0.1.0"), "0.1");
        assert_eq!(series("0.1.7"), series("0.1.0"));
        assert_ne!(series("0.2.0"), series("0.1.0"));
        assert_eq!(series("1.4.2"), series("1.0.0"));
    }

    #[test]
    fn a_total_takes_the_requests_of_every_label_set_under_it() {
        let line: Line = serde_json::from_str(
            r#"{"target": "agg", "workload": "multi_turn", "turn": "2", "phase": "steady",
                "intended_start_mono_ns": 5, "latency_ms": 10.0, "outcome": "ok"}"#,
        )
        .unwrap();
        let key = |labels: &[(&str, &str)]| StepKey {
            target: "agg".into(),
            workload: "multi_turn".into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        assert!(line.belongs_to(&key(&[])));
        assert!(line.belongs_to(&key(&[("turn", "2")])));
        assert!(!line.belongs_to(&key(&[("turn", "1")])));
        assert_eq!(line.request().latency, 0.01);
        assert_eq!(
            key(&[("turn", "2")]).to_string(),
            "agg multi_turn turn=2".to_owned()
        );
    }
}
