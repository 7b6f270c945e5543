//! The workloads' part of the configuration schema (docs/DESIGN.md §3 and §5): the four
//! workloads with the benchmark plan's numbers as defaults, their open-loop rate, and the names
//! that become the `workload` label.

use serde::{Deserialize, Serialize};

use super::at::{At, Dur};
use super::request::RequestOptions;

/// The four workloads; a workload left out of a written `workloads:` map does not run.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Workloads {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_sweep: Option<ConcurrencySweep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_turn: Option<MultiTurn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_distribution: Option<SequenceDistribution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCache>,
    /// Not run unless written: it needs trace files.
    #[serde(default)]
    pub trace_replay: Option<TraceReplay>,
    /// Not run unless written: it needs a dataset file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetWorkload>,
}

impl Default for Workloads {
    /// All four with the benchmark plan's values.
    fn default() -> Self {
        Workloads {
            concurrency_sweep: Some(ConcurrencySweep::default()),
            multi_turn: Some(MultiTurn::default()),
            sequence_distribution: Some(SequenceDistribution::default()),
            prefix_cache: Some(PrefixCache::default()),
            trace_replay: None,
            dataset: None,
        }
    }
}

/// The workload names (the `workload` label): the benchmark plan's four in its order, then trace
/// replay and datasets.
pub const WORKLOAD_NAMES: [&str; 6] = [
    "concurrency_sweep",
    "multi_turn",
    "sequence_distribution",
    "prefix_cache",
    "trace_replay",
    "dataset",
];

/// Real prompts from a dataset file (docs/METRICS.md, "Datasets"): one closed-loop step of
/// `concurrency` workers, each replaying whole conversations turn by turn with the history the
/// dataset recorded.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetWorkload {
    /// A ShareGPT JSON or a JSONL file, relative to the config's directory.
    pub path: At<String>,
    /// `sharegpt` or `jsonl`; absent: a JSON array is ShareGPT, anything else JSONL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<crate::workload::dataset::DatasetFormat>,
    /// Every turn's OSL, in place of the dataset's (the recorded reply's tokens, a row's
    /// `output_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub osl: Option<At<u32>>,
    /// The first turn's ISL range: rows outside it are dropped, later turns above it cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isl: Option<Range>,
    /// At most this many conversations, taken after the filters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rows: Option<At<u32>>,
    /// Turns of a conversation sent, from its first.
    #[serde(default = "ten")]
    pub max_turns: At<u32>,
    /// Rows taken in an order drawn from `seed` (the same every run), else the file's.
    #[serde(default = "yes")]
    pub shuffle: At<bool>,
    #[serde(default = "n16")]
    pub concurrency: At<u32>,
    #[serde(default = "s120")]
    pub step: At<Dur>,
    #[serde(default = "s10")]
    pub warmup: At<Dur>,
    /// Body fields, headers, API and streaming of this workload's requests, over each target's.
    #[serde(default, skip_serializing_if = "RequestOptions::is_empty")]
    pub request: RequestOptions,
}

fn ten() -> At<u32> {
    At::dflt(10)
}
fn yes() -> At<bool> {
    At::dflt(true)
}

impl DatasetWorkload {
    /// How the dataset's rows are chosen and measured, with the config's `seed`.
    pub fn selection(&self, seed: u64) -> crate::workload::dataset::Selection {
        crate::workload::dataset::Selection {
            osl: self.osl.as_ref().map(|o| **o),
            isl: self.isl.as_ref().map(|r| (*r.min, *r.max)),
            max_rows: self.max_rows.as_ref().map(|m| **m),
            max_turns: *self.max_turns,
            shuffle: *self.shuffle,
            seed,
        }
    }
}

/// Request traces replayed open loop (docs/METRICS.md, "Trace replay"): one step per trace, its
/// timestamps divided by `speed`, looped back to back for as long as the step sends.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TraceReplay {
    /// The traces, one step each, in this order.
    pub traces: Vec<TraceFile>,
    /// Replay speed: 2 sends the trace twice as fast (timestamps and session delays halved).
    #[serde(default = "one")]
    pub speed: At<f64>,
    /// Share of the trace replayed, whole sessions kept or dropped (seeded): 0.1 keeps a tenth.
    #[serde(default = "one")]
    pub sample: At<f64>,
    /// At most this many rows of the (sampled) trace, cut between whole sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rows: Option<At<u32>>,
    #[serde(default = "s120")]
    pub step: At<Dur>,
    #[serde(default = "s10")]
    pub warmup: At<Dur>,
    /// Cap on requests in flight per target; rows beyond it still count from their timestamps.
    #[serde(default = "max_inflight")]
    pub max_inflight: At<u32>,
    /// Body fields, headers, API and streaming of this workload's requests, over each target's.
    #[serde(default, skip_serializing_if = "RequestOptions::is_empty")]
    pub request: RequestOptions,
}

/// One trace file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TraceFile {
    /// The `trace` label of its step: a name of the config's, never taken from the file.
    pub name: At<String>,
    /// A JSONL file (Dynamo's may be gzip-compressed), relative to the config's directory.
    pub path: At<String>,
    /// `mooncake` or `dynamo`; absent: told by the first line (a `schema` key is Dynamo's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<crate::workload::trace::TraceFormat>,
    /// Tokens per `hash_ids` block of a Mooncake trace (Dynamo's traces carry their own).
    #[serde(default = "n512")]
    pub block_size: At<u32>,
}

fn one() -> At<f64> {
    At::dflt(1.0)
}

/// Open-loop arrivals instead of closed-loop workers.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    #[serde(default)]
    pub arrival: Arrival,
    /// Requests per second: one rate, or a ladder of them (one step per rate).
    pub rps: At<Rps>,
    /// Cap on requests in flight per target; arrivals beyond it still count from their intended time.
    #[serde(default = "max_inflight")]
    pub max_inflight: At<u32>,
}

/// An open-loop workload's arrival rate: `rps: 12`, or a ladder `rps: [2, 4, 8]` that runs each
/// of the workload's steps once per rate, in the order written, labelled `rate` (docs/DESIGN.md
/// §5), as AIPerf's and GuideLLM's request-rate sweeps do. A ladder of one rate is still a
/// ladder: its steps carry the label.
#[derive(Debug, Clone, PartialEq)]
pub enum Rps {
    One(f64),
    Ladder(Vec<f64>),
}

impl Rps {
    /// The rates, in the order the steps run them.
    pub fn rates(&self) -> &[f64] {
        match self {
            Rps::One(r) => std::slice::from_ref(r),
            Rps::Ladder(rs) => rs,
        }
    }

    pub fn is_ladder(&self) -> bool {
        matches!(self, Rps::Ladder(_))
    }
}

impl Serialize for Rps {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Rps::One(r) => s.serialize_f64(*r),
            Rps::Ladder(rs) => rs.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Rps {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Rps;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "`rate.rps` as requests per second or a list of them (`rps: 4`, `rps: [1, 2, 4]`)",
                )
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Rps, E> {
                Ok(Rps::One(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Rps, E> {
                Ok(Rps::One(v as f64))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Rps, E> {
                Ok(Rps::One(v as f64))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Rps, A::Error> {
                let mut rates = Vec::new();
                while let Some(r) = seq.next_element::<f64>()? {
                    // Bounded like `levels`: `check` names a longer ladder; reading stops here so
                    // a runaway list costs no memory.
                    if rates.len() > crate::config::limits::MAX_LEVELS {
                        let most = crate::config::limits::MAX_LEVELS;
                        return Err(serde::de::Error::invalid_length(
                            rates.len() + 1,
                            &format!("a ladder of at most {most} rates").as_str(),
                        ));
                    }
                    rates.push(r);
                }
                Ok(Rps::Ladder(rates))
            }
        }
        d.deserialize_any(Visit)
    }
}

fn max_inflight() -> At<u32> {
    At::dflt(1024)
}

/// Requests the client abandons on purpose, as users do (closing the tab, a stop button, an agent
/// that got its answer): a `share` of the step's requests, each abandoned after `after_tokens`
/// output tokens or `after` since it was sent. The server must free them; the canary counts them
/// as `cancelled`, never as errors, and the requests that follow show the server's recovery.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Cancel {
    /// Share of the step's requests that are abandoned: 0 (none, the default) to 1. The same
    /// requests are chosen for every target of a step.
    #[serde(default = "no_share")]
    pub share: At<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_tokens: Option<At<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<At<Dur>>,
}

fn no_share() -> At<f64> {
    At::dflt(0.0)
}

impl Default for Cancel {
    fn default() -> Self {
        Cancel {
            share: no_share(),
            after_tokens: None,
            after: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    Constant,
    #[default]
    Poisson,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencySweep {
    #[serde(default = "sweep_levels")]
    pub levels: At<Vec<u32>>,
    #[serde(default = "n1024")]
    pub isl: At<u32>,
    #[serde(default = "n512")]
    pub osl: At<u32>,
    #[serde(default = "s120")]
    pub step: At<Dur>,
    #[serde(default = "s10")]
    pub warmup: At<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    #[serde(default)]
    pub cancel: Cancel,
    /// Body fields, headers, API and streaming of this workload's requests, over each target's.
    #[serde(default, skip_serializing_if = "RequestOptions::is_empty")]
    pub request: RequestOptions,
}

fn sweep_levels() -> At<Vec<u32>> {
    At::dflt(vec![1, 2, 4, 8, 16, 32, 64])
}
fn n1024() -> At<u32> {
    At::dflt(1024)
}
fn n512() -> At<u32> {
    At::dflt(512)
}
fn n256() -> At<u32> {
    At::dflt(256)
}
fn n2048() -> At<u32> {
    At::dflt(2048)
}
fn n16() -> At<u32> {
    At::dflt(16)
}
fn s120() -> At<Dur> {
    At::dflt(Dur::secs(120))
}
fn s10() -> At<Dur> {
    At::dflt(Dur::secs(10))
}
pub(super) fn s0() -> At<Dur> {
    At::dflt(Dur::secs(0))
}

impl Default for ConcurrencySweep {
    fn default() -> Self {
        ConcurrencySweep {
            levels: sweep_levels(),
            isl: n1024(),
            osl: n512(),
            step: s120(),
            warmup: s10(),
            rate: None,
            cancel: Cancel::default(),
            request: RequestOptions::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MultiTurn {
    #[serde(default = "turns")]
    pub turns: At<u32>,
    #[serde(default = "conversations")]
    pub conversations: At<u32>,
    /// Tokens of each new user message.
    #[serde(default = "n512")]
    pub isl: At<u32>,
    #[serde(default = "n256")]
    pub osl: At<u32>,
    #[serde(default = "s300")]
    pub duration: At<Dur>,
    /// Pause between a reply and the next turn (a user reading).
    #[serde(default = "s0")]
    pub think_time: At<Dur>,
    /// Body fields, headers, API and streaming of this workload's requests, over each target's.
    #[serde(default, skip_serializing_if = "RequestOptions::is_empty")]
    pub request: RequestOptions,
}

fn turns() -> At<u32> {
    At::dflt(5)
}
fn conversations() -> At<u32> {
    At::dflt(8)
}
fn s300() -> At<Dur> {
    At::dflt(Dur::secs(300))
}

impl Default for MultiTurn {
    fn default() -> Self {
        MultiTurn {
            turns: turns(),
            conversations: conversations(),
            isl: n512(),
            osl: n256(),
            duration: s300(),
            think_time: s0(),
            request: RequestOptions::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DistributionKind {
    Uniform,
    Zipf,
    Lognormal,
}

impl DistributionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DistributionKind::Uniform => "uniform",
            DistributionKind::Zipf => "zipf",
            DistributionKind::Lognormal => "lognormal",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    pub min: At<u32>,
    pub max: At<u32>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SequenceDistribution {
    #[serde(default = "distributions")]
    pub distributions: At<Vec<DistributionKind>>,
    #[serde(default = "isl_range")]
    pub isl: Range,
    #[serde(default = "osl_range")]
    pub osl: Range,
    #[serde(default = "n16")]
    pub concurrency: At<u32>,
    #[serde(default = "s120")]
    pub step: At<Dur>,
    #[serde(default = "s10")]
    pub warmup: At<Dur>,
    /// Zipf exponent over the length range (> 0; larger = more short sequences).
    #[serde(default = "zipf_exponent")]
    pub zipf_exponent: At<f64>,
    /// Lognormal: median lengths (default: geometric mean of min and max) and sigma.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lognormal_isl_median: Option<At<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lognormal_osl_median: Option<At<f64>>,
    #[serde(default = "lognormal_sigma")]
    pub lognormal_sigma: At<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    #[serde(default)]
    pub cancel: Cancel,
    /// Body fields, headers, API and streaming of this workload's requests, over each target's.
    #[serde(default, skip_serializing_if = "RequestOptions::is_empty")]
    pub request: RequestOptions,
}

fn distributions() -> At<Vec<DistributionKind>> {
    At::dflt(vec![
        DistributionKind::Uniform,
        DistributionKind::Zipf,
        DistributionKind::Lognormal,
    ])
}
fn isl_range() -> Range {
    Range {
        min: At::dflt(128),
        max: At::dflt(4096),
    }
}
fn osl_range() -> Range {
    Range {
        min: At::dflt(64),
        max: At::dflt(2048),
    }
}
fn zipf_exponent() -> At<f64> {
    At::dflt(1.1)
}
fn lognormal_sigma() -> At<f64> {
    At::dflt(0.6)
}

impl Default for SequenceDistribution {
    fn default() -> Self {
        SequenceDistribution {
            distributions: distributions(),
            isl: isl_range(),
            osl: osl_range(),
            concurrency: n16(),
            step: s120(),
            warmup: s10(),
            zipf_exponent: zipf_exponent(),
            lognormal_isl_median: None,
            lognormal_osl_median: None,
            lognormal_sigma: lognormal_sigma(),
            rate: None,
            cancel: Cancel::default(),
            request: RequestOptions::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixCache {
    #[serde(default = "hit_ratios")]
    pub hit_ratios: At<Vec<f64>>,
    #[serde(default = "n2048")]
    pub isl: At<u32>,
    #[serde(default = "n512")]
    pub osl: At<u32>,
    #[serde(default = "n16")]
    pub concurrency: At<u32>,
    #[serde(default = "s120")]
    pub step: At<Dur>,
    #[serde(default = "s10")]
    pub warmup: At<Dur>,
    /// Shared prefixes in the pool each step draws from.
    #[serde(default = "pool_size")]
    pub pool_size: At<u32>,
    /// KV block size the prefixes are aligned to (the server's block size; 16 for vLLM/Dynamo GPU).
    #[serde(default = "n16")]
    pub block_size: At<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    #[serde(default)]
    pub cancel: Cancel,
    /// Body fields, headers, API and streaming of this workload's requests, over each target's.
    #[serde(default, skip_serializing_if = "RequestOptions::is_empty")]
    pub request: RequestOptions,
}

fn hit_ratios() -> At<Vec<f64>> {
    At::dflt(vec![0.0, 0.25, 0.5, 0.75, 1.0])
}
fn pool_size() -> At<u32> {
    At::dflt(4)
}

impl Default for PrefixCache {
    fn default() -> Self {
        PrefixCache {
            hit_ratios: hit_ratios(),
            isl: n2048(),
            osl: n512(),
            concurrency: n16(),
            step: s120(),
            warmup: s10(),
            pool_size: pool_size(),
            block_size: n16(),
            rate: None,
            cancel: Cancel::default(),
            request: RequestOptions::default(),
        }
    }
}

impl Workloads {
    /// The `request:` settings of workload `name`, where configured.
    pub fn request(&self, name: &str) -> Option<&RequestOptions> {
        match name {
            "concurrency_sweep" => self.concurrency_sweep.as_ref().map(|w| &w.request),
            "multi_turn" => self.multi_turn.as_ref().map(|w| &w.request),
            "sequence_distribution" => self.sequence_distribution.as_ref().map(|w| &w.request),
            "prefix_cache" => self.prefix_cache.as_ref().map(|w| &w.request),
            "trace_replay" => self.trace_replay.as_ref().map(|w| &w.request),
            "dataset" => self.dataset.as_ref().map(|w| &w.request),
            _ => None,
        }
    }

    pub fn is_configured(&self, name: &str) -> bool {
        match name {
            "concurrency_sweep" => self.concurrency_sweep.is_some(),
            "multi_turn" => self.multi_turn.is_some(),
            "sequence_distribution" => self.sequence_distribution.is_some(),
            "prefix_cache" => self.prefix_cache.is_some(),
            "trace_replay" => self.trace_replay.is_some(),
            "dataset" => self.dataset.is_some(),
            _ => false,
        }
    }
}
