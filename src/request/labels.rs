//! The label set of every per-request and per-step series: its ten names, spelled once, and the
//! serving mode its `serving_mode` label names.

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use serde::{Deserialize, Serialize};

/// How a deployment serves: the `serving_mode` label (a target's `serving_mode` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServingMode {
    Aggregated,
    Disaggregated,
    Other,
}

impl ServingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ServingMode::Aggregated => "aggregated",
            ServingMode::Disaggregated => "disaggregated",
            ServingMode::Other => "other",
        }
    }
}

/// The labels of every per-request and per-step series (docs/DESIGN.md §5/§6; the names are
/// [`REQUEST_LABELS`]). Labels that do not apply to the workload are empty strings here and left
/// out of the exposition, which Prometheus reads the same way (an absent label is `""`) for
/// fewer bytes per line.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct RequestLabels {
    pub target: String,
    pub serving_mode: String,
    pub workload: String,
    pub concurrency: String,
    pub turn: String,
    pub distribution: String,
    pub isl_bucket: String,
    pub prefix_ratio: String,
    /// `trace_replay`: the trace's configured name (never anything from its rows).
    pub trace: String,
    /// An open-loop workload's rate ladder (`rate.rps: [..]`): the step's arrivals per second,
    /// as written. Empty for a single rate, so a workload without a ladder keeps its series.
    pub rate: String,
}

/// A step is identified by the same labels as its requests.
pub type StepLabels = RequestLabels;

impl EncodeLabelSet for RequestLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        for (name, value) in self.pairs() {
            if !value.is_empty() {
                (name, value).encode(encoder.encode_label())?;
            }
        }
        Ok(())
    }
}

impl RequestLabels {
    /// Labels of a request of `workload` against `target`; step labels start empty.
    pub fn new(target: &str, serving_mode: ServingMode, workload: &str) -> Self {
        Self {
            target: target.to_owned(),
            serving_mode: serving_mode.as_str().to_owned(),
            workload: workload.to_owned(),
            ..Self::default()
        }
    }

    /// `concurrency_sweep` step label.
    pub fn with_concurrency(mut self, concurrency: u32) -> Self {
        self.concurrency = concurrency.to_string();
        self
    }

    /// `multi_turn` step label (1-based turn).
    pub fn with_turn(mut self, turn: u32) -> Self {
        self.turn = turn.to_string();
        self
    }

    /// `sequence_distribution` step labels; `isl_bucket` is the log2 bucket's lower bound.
    pub fn with_distribution(mut self, distribution: &str, isl_bucket: u64) -> Self {
        self.distribution = distribution.to_owned();
        self.isl_bucket = isl_bucket.to_string();
        self
    }

    /// `trace_replay` step label: the trace's configured name.
    pub fn with_trace(mut self, trace: &str) -> Self {
        self.trace = trace.to_owned();
        self
    }

    /// A rate-ladder step's label: its arrivals per second, formatted as Rust's shortest
    /// round-trip form (`0.5`, `4`), as `prefix_ratio` is.
    pub fn with_rate(mut self, rps: f64) -> Self {
        self.rate = rps.to_string();
        self
    }

    /// `prefix_cache` step label, formatted as Rust's shortest round-trip form (`0`, `0.25`, `1`).
    pub fn with_prefix_ratio(mut self, prefix_ratio: f64) -> Self {
        self.prefix_ratio = prefix_ratio.to_string();
        self
    }
}

/// The `workload` label of the probe stream's requests (they belong to no step).
pub const PROBE_WORKLOAD: &str = "probe";

/// The ten request-label names, in the order of [`RequestLabels`]' fields (and so of its
/// derived encoding): the one place they are spelled.
pub const REQUEST_LABELS: [&str; 10] = [
    "target",
    "serving_mode",
    "workload",
    "concurrency",
    "turn",
    "distribution",
    "isl_bucket",
    "prefix_ratio",
    "trace",
    "rate",
];

/// The step labels: the request labels after `target`, `serving_mode` and `workload`.
pub const STEP_LABELS: [&str; 7] = [
    REQUEST_LABELS[3],
    REQUEST_LABELS[4],
    REQUEST_LABELS[5],
    REQUEST_LABELS[6],
    REQUEST_LABELS[7],
    REQUEST_LABELS[8],
    REQUEST_LABELS[9],
];

/// The labels a whole step is known by: the request labels without the two that vary per request
/// within a step (`turn`, `isl_bucket`). The standard export keeps the per-request families by
/// these (docs/METRICS.md, "Series budget"), and a step's flags (`llm_canary_step_degraded`) are
/// matched to its sub-steps' gauges by them.
pub const STEP_LEVEL_LABELS: [&str; 8] = [
    REQUEST_LABELS[0],
    REQUEST_LABELS[1],
    REQUEST_LABELS[2],
    REQUEST_LABELS[3],
    REQUEST_LABELS[5],
    REQUEST_LABELS[7],
    REQUEST_LABELS[8],
    REQUEST_LABELS[9],
];

impl RequestLabels {
    /// Every label as (name, value), in [`REQUEST_LABELS`] order.
    pub fn pairs(&self) -> [(&'static str, &str); 10] {
        let values = [
            &self.target,
            &self.serving_mode,
            &self.workload,
            &self.concurrency,
            &self.turn,
            &self.distribution,
            &self.isl_bucket,
            &self.prefix_ratio,
            &self.trace,
            &self.rate,
        ];
        std::array::from_fn(|i| (REQUEST_LABELS[i], values[i].as_str()))
    }

    /// The step labels that apply (non-empty), as (name, value).
    pub fn step_pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let pairs = self.pairs();
        (3..pairs.len())
            .map(move |i| pairs[i])
            .filter(|(_, v)| !v.is_empty())
    }

    /// The labels from (name, value) pairs; unknown names are ignored, missing ones empty.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut l = RequestLabels::default();
        for (name, value) in pairs {
            let field = match name {
                "target" => &mut l.target,
                "serving_mode" => &mut l.serving_mode,
                "workload" => &mut l.workload,
                "concurrency" => &mut l.concurrency,
                "turn" => &mut l.turn,
                "distribution" => &mut l.distribution,
                "isl_bucket" => &mut l.isl_bucket,
                "prefix_ratio" => &mut l.prefix_ratio,
                "trace" => &mut l.trace,
                "rate" => &mut l.rate,
                _ => continue,
            };
            *field = value.to_owned();
        }
        l
    }

    /// Whether these are a step's sub-step labels: a multi-turn step's turn, or a distribution
    /// step's ISL bucket.
    pub fn is_substep(&self) -> bool {
        !self.turn.is_empty() || !self.isl_bucket.is_empty()
    }

    /// The labels of the step these belong to (without `turn` and `isl_bucket`); `None` when
    /// they are a step's already.
    pub fn step_level(&self) -> Option<RequestLabels> {
        self.is_substep().then(|| RequestLabels {
            turn: String::new(),
            isl_bucket: String::new(),
            ..self.clone()
        })
    }

    /// The value of the step label `name` where it applies (non-empty); `None` for a label that
    /// does not apply or is not a step label.
    pub fn step(&self, name: &str) -> Option<&str> {
        self.step_pairs().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The value of the label `name`; empty for a name that is not a request label.
    pub fn get(&self, name: &str) -> &str {
        self.pairs()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_follow_the_field_order_and_get_reads_by_name() {
        let l = RequestLabels::new("agg", ServingMode::Aggregated, "prefix_cache")
            .with_prefix_ratio(0.25);
        let names: Vec<&str> = l.pairs().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, REQUEST_LABELS);
        assert_eq!(l.get("target"), "agg");
        assert_eq!(l.get("prefix_ratio"), "0.25");
        assert_eq!(l.get("nope"), "");
        let steps: Vec<_> = l.step_pairs().collect();
        assert_eq!(steps, vec![("prefix_ratio", "0.25")]);
        assert_eq!(RequestLabels::from_pairs(l.pairs()), l);
    }
}
