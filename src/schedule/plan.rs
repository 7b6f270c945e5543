//! The cycle plan: the config's workloads turned into an ordered list of steps, each with its
//! shape, its (time-scaled) durations and its step label.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::config::{Config, DistributionKind, Rate, RequestOptions, TraceReplay, WORKLOAD_NAMES};
use crate::request::{RequestLabels, ServingMode};

/// What one step sends.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepKind {
    /// `concurrency_sweep`: closed loop at a fixed ISL/OSL.
    Sweep {
        concurrency: u32,
        isl: u32,
        osl: u32,
    },
    /// `multi_turn`: conversations that resend the whole history every turn.
    MultiTurn {
        conversations: u32,
        turns: u32,
        isl: u32,
        osl: u32,
        #[serde(with = "secs")]
        think_time: Duration,
    },
    /// `sequence_distribution`: ISL and OSL drawn per request.
    Distribution {
        distribution: DistributionKind,
        concurrency: u32,
        isl: (u32, u32),
        osl: (u32, u32),
        zipf_exponent: f64,
        lognormal_isl_median: Option<f64>,
        lognormal_osl_median: Option<f64>,
        lognormal_sigma: f64,
    },
    /// `trace_replay`: one trace's rows replayed open loop at their timestamps / `speed`.
    Trace {
        /// The `trace` label.
        name: String,
        /// Absolute (resolved against the config's folder when the config was read).
        path: String,
        format: Option<crate::workload::trace::TraceFormat>,
        block_size: u32,
        speed: f64,
        sample: f64,
        max_rows: Option<u32>,
        max_inflight: u32,
    },
    /// `dataset`: closed loop over a dataset's conversations, turn by turn with their recorded
    /// history.
    Dataset {
        /// Absolute (resolved against the config's folder when the config was read).
        path: String,
        format: Option<crate::workload::dataset::DatasetFormat>,
        concurrency: u32,
        osl: Option<u32>,
        isl: Option<(u32, u32)>,
        max_rows: Option<u32>,
        max_turns: u32,
        shuffle: bool,
    },
    /// `prefix_cache`: a shared prefix of `ratio`·ISL (whole blocks) plus a unique suffix.
    Prefix {
        ratio: f64,
        concurrency: u32,
        isl: u32,
        osl: u32,
        pool_size: u32,
        block_size: u32,
    },
}

/// One step of the cycle.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPlan {
    /// The `workload` label.
    pub workload: &'static str,
    /// Index of the step within its workload (seeds derive from it).
    pub index: usize,
    pub kind: StepKind,
    /// Steady window length plus warmup: sending stops after `warmup + steady`.
    #[serde(with = "secs")]
    pub warmup: Duration,
    #[serde(with = "secs")]
    pub steady: Duration,
    /// Open-loop arrivals instead of closed-loop workers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<RatePlan>,
    /// Requests the client abandons on purpose; `None` when none are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel: Option<CancelPlan>,
    /// The workload's `request:` (body fields, headers, API), added to each target's at the
    /// step's start. Not part of the plan a report shows: header values are secrets.
    #[serde(skip)]
    pub request: Arc<RequestOptions>,
}

/// A step's cancellation scenario (the workload's `cancel`, with a share above 0).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CancelPlan {
    pub share: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_secs")]
    pub after: Option<Duration>,
}

impl CancelPlan {
    /// The workload's `cancel`, unless it abandons nothing. `after` is not time-scaled: it is a
    /// point in one request's life, like a timeout, not a length of the schedule.
    pub fn of(c: &crate::config::Cancel) -> Option<CancelPlan> {
        (*c.share > 0.0 && (c.after_tokens.is_some() || c.after.is_some())).then(|| CancelPlan {
            share: *c.share,
            after_tokens: c.after_tokens.as_ref().map(|n| **n),
            after: c.after.as_ref().map(|d| d.0),
        })
    }

    /// Where the client abandons a chosen request.
    pub fn point(&self) -> crate::client::Cancel {
        match (self.after_tokens, self.after) {
            (Some(n), _) => crate::client::Cancel::AfterTokens(n),
            (None, Some(d)) => crate::client::Cancel::After(d),
            (None, None) => crate::client::Cancel::AfterTokens(1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RatePlan {
    pub poisson: bool,
    pub rps: f64,
    pub max_inflight: u32,
    /// The rate is a rung of a ladder (`rps: [..]`): the step is labelled `rate` with it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ladder: bool,
}

impl RatePlan {
    /// One step's rate per rate of the workload's `rate` (one, or each rung of a ladder); a
    /// closed-loop workload (no `rate`) has one step of no rate.
    fn each(rate: Option<&Rate>) -> Vec<Option<RatePlan>> {
        let Some(r) = rate else { return vec![None] };
        r.rps
            .rates()
            .iter()
            .map(|&rps| {
                Some(RatePlan {
                    poisson: r.arrival == crate::config::Arrival::Poisson,
                    rps,
                    max_inflight: *r.max_inflight,
                    ladder: r.rps.is_ladder(),
                })
            })
            .collect()
    }
}

/// The steps of one workload: each of its `shapes` (a level, a distribution, a prefix ratio)
/// once per rate of its ladder (the rates innermost, so a shape's rates run back to back), with
/// indices numbered through, so each step has seeds of its own. Without a ladder the indices are
/// the shapes' own, as before ladders.
fn with_rates<T>(
    shapes: impl IntoIterator<Item = T>,
    rate: Option<&Rate>,
    mut step: impl FnMut(usize, T, Option<RatePlan>) -> StepPlan,
) -> Vec<StepPlan>
where
    T: Copy,
{
    let rates = RatePlan::each(rate);
    let mut steps = Vec::new();
    for shape in shapes {
        for &r in &rates {
            steps.push(step(steps.len(), shape, r));
        }
    }
    steps
}

impl StepPlan {
    /// The labels of this step's requests to `target`: the workload and the step's own label.
    /// Multi-turn's `turn` and a distribution's `isl_bucket` vary per request, and the drivers
    /// add them.
    pub fn labels(&self, target: &str, mode: ServingMode) -> RequestLabels {
        let mut l = RequestLabels::new(target, mode, self.workload);
        match &self.kind {
            StepKind::Sweep { concurrency, .. } | StepKind::Dataset { concurrency, .. } => {
                l.concurrency = concurrency.to_string();
            }
            StepKind::MultiTurn { .. } => {}
            StepKind::Distribution { distribution, .. } => {
                l.distribution = distribution.as_str().to_owned();
            }
            StepKind::Prefix { ratio, .. } => l = l.with_prefix_ratio(*ratio),
            StepKind::Trace { name, .. } => l.trace = name.clone(),
        }
        if let Some(r) = self.rate.filter(|r| r.ladder) {
            l = l.with_rate(r.rps);
        }
        l
    }

    /// Whether this step's requests to `target` stream (docs/DESIGN.md §3, `request.stream`):
    /// the workload's setting, else the target's, else true.
    pub fn streams(&self, target: &super::Target) -> bool {
        self.request.stream.as_ref().map_or(target.stream, |s| **s)
    }

    /// A short human name: `concurrency_sweep concurrency=32`, and a ladder's rung after it
    /// (`concurrency_sweep concurrency=1 rate=4`).
    pub fn name(&self) -> String {
        let labels = self.labels("", ServingMode::Other);
        let mut name = self.workload.to_owned();
        for (k, v) in labels.step_pairs() {
            name.push_str(&format!(" {k}={v}"));
        }
        name
    }

    /// A `trace_replay` step's trace as the step replays it: loaded, sampled (whole sessions,
    /// drawn from `seed`, so the same every cycle) and truncated as configured; `None` for other
    /// steps.
    pub fn trace(
        &self,
        seed: u64,
    ) -> Option<Result<crate::workload::trace::Trace, crate::workload::trace::TraceError>> {
        let StepKind::Trace {
            path,
            format,
            block_size,
            sample,
            max_rows,
            ..
        } = &self.kind
        else {
            return None;
        };
        let loaded = crate::workload::trace::Trace::load_any(
            std::path::Path::new(path),
            *format,
            *block_size,
        );
        Some(loaded.map(|mut trace| {
            if *sample < 1.0 {
                trace = trace.sample(*sample, seed);
            }
            match max_rows {
                Some(m) => trace.truncate(*m as usize),
                None => trace,
            }
        }))
    }

    /// A `dataset` step's file, format and selection (with the config's `seed`); `None` for
    /// other steps.
    pub fn dataset_selection(
        &self,
        seed: u64,
    ) -> Option<(
        &str,
        Option<crate::workload::dataset::DatasetFormat>,
        crate::workload::dataset::Selection,
    )> {
        let StepKind::Dataset {
            path,
            format,
            osl,
            isl,
            max_rows,
            max_turns,
            shuffle,
            ..
        } = &self.kind
        else {
            return None;
        };
        let selection = crate::workload::dataset::Selection {
            osl: *osl,
            isl: *isl,
            max_rows: *max_rows,
            max_turns: *max_turns,
            shuffle: *shuffle,
            seed,
        };
        Some((path, *format, selection))
    }

    /// A `dataset` step's dataset as the step replays it: read once per process (shared with
    /// `check`'s reading), measured with `tokens`, filtered and sampled with `seed`; `None` for
    /// other steps.
    pub fn dataset(
        &self,
        seed: u64,
        tokens: &crate::workload::tokenizer::TokenModel,
    ) -> Option<
        Result<
            std::sync::Arc<crate::workload::dataset::Dataset>,
            crate::workload::dataset::DatasetError,
        >,
    > {
        let (path, format, selection) = self.dataset_selection(seed)?;
        Some(crate::workload::dataset::Dataset::load_shared(
            std::path::Path::new(path),
            format,
            tokens,
            &selection,
        ))
    }

    /// Closed-loop workers (or conversations) per target.
    pub fn concurrency(&self) -> u32 {
        match &self.kind {
            StepKind::Sweep { concurrency, .. }
            | StepKind::Dataset { concurrency, .. }
            | StepKind::Distribution { concurrency, .. }
            | StepKind::Prefix { concurrency, .. } => *concurrency,
            StepKind::MultiTurn { conversations, .. } => *conversations,
            StepKind::Trace { max_inflight, .. } => *max_inflight,
        }
    }
}

/// Every step of one cycle, in order, with durations multiplied by `time_scale`.
pub fn plan_cycle(cfg: &Config) -> Vec<StepPlan> {
    let scale = *cfg.time_scale;
    let scaled = |d: Duration| d.mul_f64(scale);
    let w = &cfg.workloads;
    let mut steps = Vec::new();
    for workload in cfg.cycle() {
        match workload {
            "concurrency_sweep" => {
                let Some(s) = &w.concurrency_sweep else {
                    continue;
                };
                steps.extend(with_rates(
                    s.levels.iter().copied(),
                    s.rate.as_ref(),
                    |index, c, rate| StepPlan {
                        workload,
                        index,
                        kind: StepKind::Sweep {
                            concurrency: c,
                            isl: *s.isl,
                            osl: *s.osl,
                        },
                        warmup: scaled(s.warmup.0),
                        steady: scaled(s.step.saturating_sub(s.warmup.0)),
                        rate,
                        cancel: CancelPlan::of(&s.cancel),
                        request: Default::default(),
                    },
                ));
            }
            "multi_turn" => {
                let Some(m) = &w.multi_turn else { continue };
                steps.push(StepPlan {
                    workload,
                    index: 0,
                    kind: StepKind::MultiTurn {
                        conversations: *m.conversations,
                        turns: *m.turns,
                        isl: *m.isl,
                        osl: *m.osl,
                        think_time: scaled(m.think_time.0),
                    },
                    warmup: Duration::ZERO,
                    steady: scaled(m.duration.0),
                    rate: None,
                    cancel: None,
                    request: Default::default(),
                });
            }
            "sequence_distribution" => {
                let Some(d) = &w.sequence_distribution else {
                    continue;
                };
                steps.extend(with_rates(
                    d.distributions.iter().copied(),
                    d.rate.as_ref(),
                    |index, dist, rate| StepPlan {
                        workload,
                        index,
                        kind: StepKind::Distribution {
                            distribution: dist,
                            concurrency: *d.concurrency,
                            isl: (*d.isl.min, *d.isl.max),
                            osl: (*d.osl.min, *d.osl.max),
                            zipf_exponent: *d.zipf_exponent,
                            lognormal_isl_median: d.lognormal_isl_median.as_ref().map(|m| **m),
                            lognormal_osl_median: d.lognormal_osl_median.as_ref().map(|m| **m),
                            lognormal_sigma: *d.lognormal_sigma,
                        },
                        warmup: scaled(d.warmup.0),
                        steady: scaled(d.step.saturating_sub(d.warmup.0)),
                        rate,
                        cancel: CancelPlan::of(&d.cancel),
                        request: Default::default(),
                    },
                ));
            }
            "prefix_cache" => {
                let Some(p) = &w.prefix_cache else { continue };
                steps.extend(with_rates(
                    p.hit_ratios.iter().copied(),
                    p.rate.as_ref(),
                    |index, ratio, rate| StepPlan {
                        workload,
                        index,
                        kind: StepKind::Prefix {
                            ratio,
                            concurrency: *p.concurrency,
                            isl: *p.isl,
                            osl: *p.osl,
                            pool_size: *p.pool_size,
                            block_size: *p.block_size,
                        },
                        warmup: scaled(p.warmup.0),
                        steady: scaled(p.step.saturating_sub(p.warmup.0)),
                        rate,
                        cancel: CancelPlan::of(&p.cancel),
                        request: Default::default(),
                    },
                ));
            }
            "trace_replay" => {
                let Some(r) = &w.trace_replay else { continue };
                steps.extend(trace_steps(r, &scaled));
            }
            "dataset" => {
                let Some(d) = &w.dataset else { continue };
                steps.push(dataset_step(d, cfg.seed, &scaled));
            }
            _ => {}
        }
    }
    with_requests(cfg, &mut steps);
    steps
}

/// Trace replay's steps, one per trace, with durations scaled by `scaled`.
fn trace_steps<'a>(
    r: &'a TraceReplay,
    scaled: &'a impl Fn(Duration) -> Duration,
) -> impl Iterator<Item = StepPlan> + 'a {
    r.traces.iter().enumerate().map(|(index, t)| StepPlan {
        workload: "trace_replay",
        index,
        kind: StepKind::Trace {
            name: t.name.value.clone(),
            path: t.path.value.clone(),
            format: t.format,
            block_size: *t.block_size,
            speed: *r.speed,
            sample: *r.sample,
            max_rows: r.max_rows.as_ref().map(|m| **m),
            max_inflight: *r.max_inflight,
        },
        warmup: scaled(r.warmup.0),
        steady: scaled(r.step.saturating_sub(r.warmup.0)),
        rate: None,
        cancel: None,
        request: Default::default(),
    })
}

/// Hands each step its workload's `request:`, one copy per workload shared by its steps.
fn with_requests(cfg: &Config, steps: &mut [StepPlan]) {
    let w = &cfg.workloads;
    let requests: Vec<(&str, Arc<RequestOptions>)> = WORKLOAD_NAMES
        .into_iter()
        .filter_map(|name| Some((name, Arc::new(w.request(name)?.clone()))))
        .collect();
    for step in steps {
        if let Some((_, r)) = requests.iter().find(|(name, _)| *name == step.workload) {
            step.request = Arc::clone(r);
        }
    }
}

/// A `dataset`'s one step (and, at other concurrencies, the probes of `bench --search`).
pub fn dataset_step(
    d: &crate::config::DatasetWorkload,
    seed: u64,
    scaled: &dyn Fn(Duration) -> Duration,
) -> StepPlan {
    let selection = d.selection(seed);
    StepPlan {
        workload: "dataset",
        index: 0,
        kind: StepKind::Dataset {
            path: d.path.value.clone(),
            format: d.format,
            concurrency: *d.concurrency,
            osl: selection.osl,
            isl: selection.isl,
            max_rows: selection.max_rows,
            max_turns: selection.max_turns,
            shuffle: selection.shuffle,
        },
        warmup: scaled(d.warmup.0),
        steady: scaled(d.step.saturating_sub(d.warmup.0)),
        rate: None,
        cancel: None,
        request: Arc::new(d.request.clone()),
    }
}

mod secs {
    use serde::Serializer;
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

mod opt_secs {
    use serde::Serializer;
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_f64(d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_plan_has_sixteen_steps_of_the_documents_length() {
        let cfg = Config::load(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/seed-plan.yaml"
        )))
        .unwrap();
        let steps = plan_cycle(&cfg);
        assert_eq!(steps.len(), 16);
        assert_eq!(steps[0].name(), "concurrency_sweep concurrency=1");
        assert_eq!(steps[6].name(), "concurrency_sweep concurrency=64");
        assert_eq!(steps[7].workload, "multi_turn");
        assert_eq!(steps[15].name(), "prefix_cache prefix_ratio=1");
        let total: Duration = steps.iter().map(|s| s.warmup + s.steady).sum();
        assert_eq!(total, Duration::from_secs(35 * 60));
        // Warmup is part of the step's 120 s, not added to it.
        assert_eq!(steps[0].warmup, Duration::from_secs(10));
        assert_eq!(steps[0].steady, Duration::from_secs(110));
    }

    #[test]
    fn a_rate_ladder_runs_each_shape_once_per_rate_labelled_by_its_rate() {
        let yaml = "targets:\n  - { name: agg, serving_mode: aggregated, simulated: { profile: fast } }\n\
                    workloads:\n  concurrency_sweep:\n    levels: [1, 8]\n    step: 10s\n    \
                    warmup: 2s\n    rate: { rps: [2, 0.5, 16], arrival: constant }\n  \
                    prefix_cache:\n    hit_ratios: [0, 1]\n    rate: { rps: 4 }\n";
        let cfg = Config::from_yaml(yaml, "ladder.yaml").unwrap();
        let steps = plan_cycle(&cfg);
        let names: Vec<String> = steps.iter().map(StepPlan::name).collect();
        assert_eq!(
            names,
            [
                "concurrency_sweep concurrency=1 rate=2",
                "concurrency_sweep concurrency=1 rate=0.5",
                "concurrency_sweep concurrency=1 rate=16",
                "concurrency_sweep concurrency=8 rate=2",
                "concurrency_sweep concurrency=8 rate=0.5",
                "concurrency_sweep concurrency=8 rate=16",
                // A single rate is no ladder: the steps keep the labels they always had.
                "prefix_cache prefix_ratio=0",
                "prefix_cache prefix_ratio=1",
            ]
        );
        // Each step has seeds of its own; the rung's rate is what the arrivals run at.
        let indices: Vec<usize> = steps.iter().map(|s| s.index).collect();
        assert_eq!(indices, [0, 1, 2, 3, 4, 5, 0, 1]);
        let rates: Vec<f64> = steps.iter().map(|s| s.rate.unwrap().rps).collect();
        assert_eq!(rates, [2.0, 0.5, 16.0, 2.0, 0.5, 16.0, 4.0, 4.0]);
        assert!(steps[..6].iter().all(|s| s.rate.unwrap().ladder));
        assert!(!steps[6].rate.unwrap().ladder);
        let l = steps[4].labels("agg", ServingMode::Aggregated);
        assert_eq!((l.get("concurrency"), l.get("rate")), ("8", "0.5"));
        assert_eq!(
            steps[6].labels("agg", ServingMode::Aggregated).get("rate"),
            ""
        );
        // `check`'s cycle length counts every rung.
        let sweep = cfg.cycle_plan()[0];
        assert_eq!((sweep.1, sweep.2), (6, Duration::from_secs(60)));
    }

    #[test]
    fn time_scale_compresses_every_duration() {
        let mut cfg = Config::demo();
        cfg.time_scale = crate::config::At::dflt(0.01);
        let steps = plan_cycle(&cfg);
        let total: Duration = steps.iter().map(|s| s.warmup + s.steady).sum();
        assert_eq!(total.as_secs_f64().round(), 21.0);
    }
}
