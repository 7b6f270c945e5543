//! `llm-canary bench --search COND`: per target, the highest concurrency that still meets a
//! latency condition such as `p99(ttft) < 500ms and p99(itl) < 50ms`, found by bisection over a
//! fixed ladder of levels, each probe a closed-loop step with its warmup; reported with the
//! goodput and the cost per 1M good tokens at that load (docs/METRICS.md, "Max load under an
//! SLO").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::ReportError;
use super::search_progress::{ProbeCounts, ProbeStart, SearchProgress};
use super::table::{Cell, Column, Table};
use crate::measure::step::{Spread, StepMeasurements};
use crate::model::{Sink, StepResult};
use crate::request::GoodputLimits;
use crate::schedule::{Scheduler, StepKind, StepPlan, TargetSet, TargetSource};
use crate::setup::Setup;
use crate::shutdown::Shutdown;
use crate::slo::ast::{Agg, CmpOp, format_duration};
use crate::slo::{Cond, Measure, Value, parse_condition};
use crate::targets::Deployment;

/// The ladder a search moves on: the powers of two of a concurrency sweep. Finer steps would
/// claim a resolution the measurement does not have: near its limit a closed loop's p99 TTFT
/// can settle in either of two values from one run to the next (its requests batched in one
/// prefill pass or two), measured on the embedded simulator at 128 to 256 streams.
pub const LADDER: [u32; 13] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096];

pub use super::search_progress::probes_at_most;

/// The highest level a search tries unless told otherwise.
pub const DEFAULT_SEARCH_MAX: u32 = 256;

/// A 95 % confidence interval; a side the samples cannot bound is `None`.
type Interval = (Option<f64>, Option<f64>);

/// One bound of the condition: `pQQ(measure) < seconds` (or `<=`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Limit {
    #[serde(serialize_with = "measure_name")]
    pub measure: Measure,
    /// 50, 90 or 99: the quantiles a step keeps with their confidence intervals.
    pub quantile: u32,
    pub seconds: f64,
    /// `<=` rather than `<`.
    pub inclusive: bool,
}

fn measure_name<S: serde::Serializer>(m: &Measure, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(m.name())
}

impl Limit {
    fn text(&self) -> String {
        let op = if self.inclusive { "<=" } else { "<" };
        format!(
            "p{}({}) {op} {}",
            self.quantile,
            self.measure.name(),
            format_duration(self.seconds)
        )
    }

    fn holds(&self, v: f64) -> bool {
        if self.inclusive {
            v <= self.seconds
        } else {
            v < self.seconds
        }
    }

    /// The step's estimate of the quantile and its 95 % confidence interval.
    fn read(&self, m: &StepMeasurements) -> Option<(f64, Interval)> {
        let s: &Spread = match self.measure {
            Measure::Ttft => m.ttft.as_ref()?,
            Measure::Itl => m.itl.as_ref()?,
            _ => m.latency.as_ref()?,
        };
        Some(match self.quantile {
            50 => (s.p50, s.p50_ci),
            90 => (s.p90, s.p90_ci),
            _ => (s.p99, s.p99_ci),
        })
    }
}

/// Parses a search condition: one or more `pQQ(ttft|itl|latency) < DURATION` joined by `and`,
/// in the SLO language (docs/SLO.md), without selectors (the search picks the step).
pub fn parse_search(text: &str) -> Result<Vec<Limit>, ReportError> {
    let usage = |why: String| {
        ReportError::Usage(format!(
            "--search {text:?}: {why}; expected e.g. 'p99(ttft) < 500ms and p99(itl) < 50ms'"
        ))
    };
    let cond = parse_condition(text).map_err(|e| usage(e.to_string()))?;
    let mut limits = Vec::new();
    let mut stack = vec![&cond];
    while let Some(c) = stack.pop() {
        match c {
            Cond::And(a, b) => {
                stack.push(b);
                stack.push(a);
            }
            Cond::Or(..) => return Err(usage("`or` is not a bound".into())),
            Cond::Cmp(op, Value::Agg(Agg::Quantile(q), sel), Value::Duration(secs)) => {
                // The quantiles a step keeps with their confidence intervals.
                let Some(quantile) = [50u32, 90, 99].into_iter().find(|&k| f64::from(k) == *q)
                else {
                    return Err(usage(format!("p{q} is not one of p50, p90, p99")));
                };
                if !matches!(sel.measure, Measure::Ttft | Measure::Itl | Measure::Latency) {
                    return Err(usage(format!(
                        "{} is not ttft, itl or latency",
                        sel.measure.name()
                    )));
                }
                if !sel.matchers.is_empty() {
                    return Err(usage("the search picks the step: write no {labels}".into()));
                }
                let inclusive = match op {
                    CmpOp::Lt => false,
                    CmpOp::Le => true,
                    _ => return Err(usage("a bound is `<` or `<=` a duration".into())),
                };
                limits.push(Limit {
                    measure: sel.measure,
                    quantile,
                    seconds: *secs,
                    inclusive,
                });
            }
            _ => {
                return Err(usage(
                    "each term is a quantile of ttft, itl or latency below a duration".into(),
                ));
            }
        }
    }
    Ok(limits)
}

/// How one probe came out.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub concurrency: u32,
    pub meets: bool,
    /// A bound was decided by its estimate: the step had too few samples to bound the quantile
    /// from above.
    pub estimated: bool,
    /// Why it failed: the first bound it crossed, or the fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crossed: Option<String>,
    /// Each bound's estimate, in the condition's order.
    pub values: Vec<Option<f64>>,
    pub requests: u64,
    pub errors: u64,
    /// The probe's warmup and measured window (see `probe_windows`).
    pub warmup_seconds: f64,
    pub steady_seconds: f64,
    pub goodput: f64,
    pub good_output_tokens_per_second: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_per_million_good_tokens_usd: Option<f64>,
}

/// One target's search.
#[derive(Debug, Clone, Serialize)]
pub struct TargetSearch {
    pub target: String,
    pub serving_mode: String,
    /// The highest level that met the condition; `None` when even the lowest did not.
    pub max_concurrency: Option<u32>,
    /// The lowest level that did not; `None` when every level up to the maximum did.
    pub first_failing: Option<u32>,
    /// The traffic budget's `max_inflight` for the target, where it cut the ladder short: no
    /// probe went above it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_max_inflight: Option<u32>,
    pub probes: Vec<Probe>,
}

impl TargetSearch {
    fn probe_at(&self, c: Option<u32>) -> Option<&Probe> {
        let c = c?;
        self.probes.iter().find(|p| p.concurrency == c)
    }
}

/// The whole search, as `search.json` holds it.
#[derive(Debug, Clone, Serialize)]
pub struct SearchResult {
    pub condition: String,
    pub limits: Vec<Limit>,
    /// The probes' ISL and OSL: the `concurrency_sweep`'s; with a dataset 0 (the rows' own)
    /// unless its `osl` sets the OSL.
    pub isl: u32,
    pub osl: u32,
    /// The dataset the probes send (its path), where the config names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    pub warmup_seconds: f64,
    pub steady_seconds: f64,
    pub max_level: u32,
    pub targets: Vec<TargetSearch>,
}

/// The verdict of one probe's step on `limits`: whether it meets them, whether an estimate
/// decided, why it failed, and each bound's estimate. A step that faulted (errors above the
/// faulted ratio) or measured nothing fails whatever its survivors' latencies say.
fn judge(limits: &[Limit], m: &StepMeasurements) -> (bool, bool, Option<String>, Vec<Option<f64>>) {
    let mut estimated = false;
    // A fault is the reason whatever the survivors' latencies say.
    let mut crossed = m.faulted.then(|| {
        let kinds: Vec<&str> = m
            .outcomes
            .keys()
            .filter(|k| k.is_error())
            .map(|k| k.as_str())
            .collect();
        format!(
            "faulted: error ratio {:.3} ({})",
            m.error_ratio,
            kinds.join(", ")
        )
    });
    let mut values = Vec::new();
    for l in limits {
        let Some((v, (lower, upper))) = l.read(m) else {
            values.push(None);
            crossed.get_or_insert_with(|| format!("{}: no successful request", l.text()));
            continue;
        };
        values.push(Some(v));
        let ms = |x: f64| x * 1e3;
        // The bound must surely hold: the upper end of the 95 % interval below it. An interval
        // that straddles the bound does not meet it, so the answer is the highest level that
        // surely does (and two runs agree where a level sits at the edge). Only when the
        // samples are too few to bound the quantile from above does the estimate decide.
        let fails = match (lower, upper) {
            (_, Some(u)) if l.holds(u) => None,
            (Some(lo), _) if !l.holds(lo) => Some(format!("{} was {:.1} ms", l.text(), ms(v))),
            (_, Some(u)) => Some(format!(
                "{} was {:.1} ms, its 95 % interval reaching {:.1} ms",
                l.text(),
                ms(v),
                ms(u)
            )),
            (_, None) => {
                estimated = true;
                (!l.holds(v)).then(|| format!("{} was {:.1} ms (few samples)", l.text(), ms(v)))
            }
        };
        if let Some(why) = fails {
            crossed.get_or_insert(why);
        }
    }
    (crossed.is_none(), estimated, crossed, values)
}

/// What `bench --search` runs.
pub struct SearchOptions {
    pub setup: Setup,
    pub condition: String,
    /// The highest level to try (the ladder is cut there).
    pub max_level: u32,
    pub out: Option<PathBuf>,
    /// Draw the progress as live bars on stderr (`report::live_on_terminal`); else log lines.
    pub live_progress: bool,
}

/// Runs the search against every target of the setup, one target after another (a target's
/// probes never share the machine or the network with another's). Each probe is a closed-loop
/// step of the config's `concurrency_sweep` shape (ISL, OSL, step and warmup, time-scaled) at
/// one level of [`LADDER`]; a binary search over the ladder needs at most four probes up to 256.
/// The targets, runner and budget are assembled as for a bench, and every probe runs through the
/// scheduler: the ladder stops at the traffic budget's `max_inflight`, and a probe the budget
/// refuses is not sent. The progress shows on stderr (`search_progress`).
pub async fn run_search(opts: SearchOptions, stop: &Shutdown) -> Result<SearchResult, ReportError> {
    let limits = parse_search(&opts.condition)?;
    let ladder: Vec<u32> = LADDER
        .iter()
        .copied()
        .filter(|&c| c <= opts.max_level)
        .collect();
    if ladder.is_empty() {
        return Err(ReportError::Usage("--search-max must be at least 1".into()));
    }
    let cfg = &opts.setup.config;
    let shape = ProbeShape::of(cfg);
    if let Some(dir) = &opts.out {
        std::fs::create_dir_all(dir).map_err(ReportError::io(dir))?;
    }
    crate::targets::warn_on_descriptors(cfg, 0);
    let (deployment, failed) = Deployment::start_partial(cfg, opts.setup.base_dir(), 3).await?;
    for f in &failed {
        tracing::error!(target = %f.name, error = %f.error, "target not searched");
    }
    let counts = Arc::new(ProbeCounts::default());
    let base = deployment.assemble(cfg, vec![Arc::clone(&counts) as Arc<dyn Sink>]);
    // Good requests are those within the condition's own TTFT and ITL bounds (per request),
    // where it sets them; the config's goodput otherwise.
    let goodput = goodput_of(&limits, base.goodput);
    // Each target's ladder, held to its budget's `max_inflight`.
    let caps: Vec<Option<u32>> = deployment
        .targets
        .iter()
        .map(|t| base.budget.max_streams(&t.name))
        .collect();
    let ladders: Vec<Vec<u32>> = caps
        .iter()
        .map(|cap| {
            let held = ladder.iter().copied();
            held.filter(|&c| cap.is_none_or(|m| c <= m)).collect()
        })
        .collect();
    let mut progress = SearchProgress::new(
        opts.live_progress,
        ladders.iter().map(|l| probes_at_most(l.len())).collect(),
        shape.warmup + shape.steady,
        counts,
    );
    let mut targets = Vec::new();
    for (i, target) in deployment.targets.iter().enumerate() {
        let mut runner = base.with_targets(vec![Arc::clone(target)]);
        runner.goodput = goodput;
        let mut scheduler = Scheduler::new(
            Arc::new(runner),
            TargetSource::fixed(TargetSet {
                targets: vec![Arc::clone(target)],
                scrape: Vec::new(),
            }),
            None,
            cfg.export.server_metrics_interval.0,
        );
        let (cap, held) = (caps[i], &ladders[i]);
        if held.len() < ladder.len() {
            tracing::warn!(target = %target.name, max_inflight = cap, "the search's ladder stops at the traffic budget's max_inflight");
        }
        progress.target_started(i);
        let probe = Probing {
            ladder: held,
            limits: &limits,
            shape: &shape,
        };
        let (mut found, finished) =
            search_target(&mut scheduler, &target.name, &probe, &mut progress, stop).await;
        found.serving_mode = target.mode.as_str().to_owned();
        found.budget_max_inflight = cap.filter(|_| held.len() < ladder.len());
        progress.target_finished(found_text(&found, finished), found.probes.len());
        targets.push(found);
    }
    progress.done(targets.len());
    deployment.stop().await;
    let result = SearchResult {
        condition: opts.condition.clone(),
        limits,
        isl: shape.isl,
        osl: shape.osl,
        dataset: shape.dataset.clone(),
        warmup_seconds: shape.warmup.as_secs_f64(),
        steady_seconds: shape.steady.as_secs_f64(),
        max_level: *ladder.last().unwrap_or(&1),
        targets,
    };
    if let Some(dir) = &opts.out {
        write_files(dir, &result)?;
    }
    Ok(result)
}

/// What every probe is made of: the `concurrency_sweep`'s lengths and its time-scaled windows,
/// or, where the config names a `dataset`, the dataset's prompts and its windows.
struct ProbeShape {
    /// The probes' step at concurrency 1, as the plan assembles it.
    base: StepPlan,
    isl: u32,
    osl: u32,
    /// The dataset the probes send, where they send one.
    dataset: Option<String>,
    warmup: Duration,
    steady: Duration,
}

impl ProbeShape {
    fn of(cfg: &crate::config::Config) -> ProbeShape {
        let scale = *cfg.time_scale;
        let scaled = |d: Duration| d.mul_f64(scale);
        if let Some(d) = &cfg.workloads.dataset {
            let base = crate::schedule::plan::dataset_step(d, cfg.seed, &scaled);
            return ProbeShape {
                isl: 0,
                osl: d.osl.as_ref().map_or(0, |o| **o),
                dataset: Some(d.path.value.clone()),
                warmup: base.warmup,
                steady: base.steady,
                base,
            };
        }
        let sweep = cfg.workloads.concurrency_sweep.clone().unwrap_or_default();
        ProbeShape {
            isl: *sweep.isl,
            osl: *sweep.osl,
            dataset: None,
            warmup: scaled(sweep.warmup.0),
            steady: scaled(sweep.step.saturating_sub(sweep.warmup.0)),
            base: StepPlan {
                workload: "concurrency_sweep",
                index: 0,
                kind: StepKind::Sweep {
                    concurrency: 1,
                    isl: *sweep.isl,
                    osl: *sweep.osl,
                },
                warmup: Duration::ZERO,
                steady: Duration::ZERO,
                rate: None,
                cancel: None,
                // The sweep's request options, as its own steps send them.
                request: std::sync::Arc::new(sweep.request.clone()),
            },
        }
    }
}

/// What one target's probes are made of: the levels to search, the condition, the step.
struct Probing<'a> {
    ladder: &'a [u32],
    limits: &'a [Limit],
    shape: &'a ProbeShape,
}

/// The bisection over the ladder for `target`, the one target of `scheduler` (its mode left for
/// the caller), and whether it ended (not stopped, nor refused by the budget). Invariant:
/// `ladder[..=lo]` met (`lo` = `None`: none known), `ladder[hi..]` did not.
async fn search_target(
    scheduler: &mut Scheduler,
    target: &str,
    p: &Probing<'_>,
    progress: &mut SearchProgress,
    stop: &Shutdown,
) -> (TargetSearch, bool) {
    let (ladder, shape) = (p.ladder, p.shape);
    let mut probes: Vec<Probe> = Vec::new();
    let mut latency: Option<Spread> = None;
    let (mut lo, mut hi): (Option<usize>, usize) = (None, ladder.len());
    let undecided = |lo: Option<usize>, hi: usize| hi.saturating_sub(lo.map_or(0, |l| l + 1));
    while undecided(lo, hi) > 0 && !stop.stopping() {
        let mid = (lo.map_or(0, |l| l + 1) + hi - 1) / 2;
        let (warmup, steady) = probe_windows(shape.warmup, shape.steady, latency.as_ref());
        let plan = probe_plan(&shape.base, ladder[mid], probes.len(), warmup, steady);
        progress.probe_started(&ProbeStart {
            target,
            number: probes.len() + 1,
            at_most: probes.len() + probes_at_most(undecided(lo, hi)),
            concurrency: ladder[mid],
            length: warmup + steady,
        });
        // `None`: cut short by a stop, or refused by the budget (its hour's tokens spent).
        let Some(results) = scheduler.step(&plan, 0, stop).await else {
            let why = if stop.stopping() {
                "stopped"
            } else {
                "refused by the traffic budget"
            };
            progress.probe_finished(why.to_owned());
            break;
        };
        let Some(total) = step_total(&results) else {
            progress.probe_finished("no result".to_owned());
            break;
        };
        latency = total.measurements.latency.or(latency);
        let mut probe = probe_of(p.limits, ladder[mid], &total.measurements);
        probe.warmup_seconds = warmup.as_secs_f64();
        probe.steady_seconds = total.steady_seconds;
        progress.probe_finished(result_text(p.limits, &probe));
        if probe.meets {
            lo = Some(mid);
        } else {
            hi = mid;
        }
        probes.push(probe);
    }
    probes.sort_by_key(|p| p.concurrency);
    let found = TargetSearch {
        target: target.to_owned(),
        serving_mode: String::new(),
        max_concurrency: lo.map(|l| ladder[l]),
        first_failing: ladder.get(hi).copied(),
        budget_max_inflight: None,
        probes,
    };
    (found, undecided(lo, hi) == 0)
}

/// A finished probe as the progress shows it: `p99(ttft) 412.3 ms < 500ms, met`, or what
/// crossed (`p99(ttft) < 500ms was 612.0 ms, not met`).
fn result_text(limits: &[Limit], p: &Probe) -> String {
    if let Some(crossed) = p.crossed.as_deref().filter(|_| !p.meets) {
        return format!("{crossed}, not met");
    }
    let bounds: Vec<String> = limits
        .iter()
        .zip(&p.values)
        .map(|(l, v)| {
            let op = if l.inclusive { "<=" } else { "<" };
            let value = v.map_or("-".into(), |v| format!("{:.1} ms", v * 1e3));
            format!(
                "p{}({}) {value} {op} {}",
                l.quantile,
                l.measure.name(),
                format_duration(l.seconds)
            )
        })
        .collect();
    let few = if p.estimated { " (few samples)" } else { "" };
    format!("{}{few}, met", bounds.join(" and "))
}

/// What a target's search found, as the progress says it.
fn found_text(t: &TargetSearch, finished: bool) -> String {
    let name = &t.target;
    if !finished {
        let so_far = t
            .max_concurrency
            .map(|c| format!(" ({c} met so far)"))
            .unwrap_or_default();
        return format!("{name}: the search stopped before it found the max concurrency{so_far}");
    }
    match (t.max_concurrency, t.first_failing, t.budget_max_inflight) {
        (Some(c), Some(f), _) => {
            format!("{name}: found max concurrency {c} ({f} does not meet the condition)")
        }
        (Some(c), None, Some(_)) => format!(
            "{name}: found max concurrency {c} (every level up to the budget's max_inflight meets the condition)"
        ),
        (Some(c), None, None) => format!(
            "{name}: found max concurrency {c} (every level up to --search-max meets the condition)"
        ),
        (None, Some(f), _) => {
            format!("{name}: found no level that meets the condition ({f} does not)")
        }
        (None, None, _) => format!("{name}: found no level to probe"),
    }
}

/// `search.json` and one CSV per table into `dir`.
fn write_files(dir: &std::path::Path, result: &SearchResult) -> Result<(), ReportError> {
    let path = dir.join("search.json");
    std::fs::write(&path, serde_json::to_vec_pretty(result)?).map_err(ReportError::io(&path))?;
    for t in result.tables() {
        let path = dir.join(format!("{}.csv", t.id));
        std::fs::write(&path, t.to_csv()).map_err(ReportError::io(&path))?;
    }
    Ok(())
}

/// A probe's warmup and steady window: at least the configured ones, and long enough for the
/// closed loop to lose the lockstep of its start. Every worker sends at once, so the first
/// rounds of requests arrive together and queue together, and a window of a few request
/// lengths reads those rounds' queue (one run's p99 twice the next one's) rather than the
/// load's. So the warmup lasts at least twice the previous probe's p99 latency and the steady
/// window eight times its median, each at most four times the configured step.
fn probe_windows(
    warmup: Duration,
    steady: Duration,
    latency: Option<&Spread>,
) -> (Duration, Duration) {
    let Some(l) = latency else {
        return (warmup, steady);
    };
    let cap = (warmup + steady) * 4;
    let at_least = |configured: Duration, seconds: f64| {
        configured.max(Duration::from_secs_f64(seconds.max(0.0)).min(cap))
    };
    (at_least(warmup, 2.0 * l.p99), at_least(steady, 8.0 * l.p50))
}

fn goodput_of(limits: &[Limit], fallback: GoodputLimits) -> GoodputLimits {
    let bound = |m: Measure| {
        limits
            .iter()
            .filter(|l| l.measure == m)
            .map(|l| l.seconds)
            .reduce(f64::min)
    };
    GoodputLimits {
        ttft: bound(Measure::Ttft).unwrap_or(fallback.ttft),
        itl: bound(Measure::Itl).unwrap_or(fallback.itl),
    }
}

fn probe_plan(
    base: &StepPlan,
    level: u32,
    index: usize,
    warmup: Duration,
    steady: Duration,
) -> StepPlan {
    let mut plan = StepPlan {
        index,
        warmup,
        steady,
        ..base.clone()
    };
    if let StepKind::Sweep { concurrency, .. } | StepKind::Dataset { concurrency, .. } =
        &mut plan.kind
    {
        *concurrency = level;
    }
    plan
}

/// The one result of a probe's step (a sweep step has one label set per target).
fn step_total(results: &[StepResult]) -> Option<&StepResult> {
    results.iter().find(|r| r.total).or(results.first())
}

fn probe_of(limits: &[Limit], concurrency: u32, m: &StepMeasurements) -> Probe {
    let (meets, estimated, crossed, values) = judge(limits, m);
    Probe {
        concurrency,
        meets,
        estimated,
        crossed,
        values,
        requests: m.requests,
        errors: m.errors,
        warmup_seconds: 0.0,
        steady_seconds: 0.0,
        goodput: m.goodput,
        good_output_tokens_per_second: m.good_output_tokens_per_second,
        cost_per_million_good_tokens_usd: m.cost_per_million_good_tokens_usd,
    }
}

impl SearchResult {
    /// The answer per target, and every probe.
    pub fn tables(&self) -> Vec<Table> {
        let mut answer = Table::new(
            "search",
            &format!("Max load under `{}`", self.condition),
            vec![
                Column::text("target"),
                Column::text("mode"),
                Column::text("max concurrency"),
                Column::text("first failing"),
                Column::text("crossed there"),
                Column::num("goodput", "req/s", 2),
                Column::num("good throughput", "tok/s", 0),
                Column::num("per 1M good tokens", "$", 3),
            ],
        );
        for t in &self.targets {
            let best = t.probe_at(t.max_concurrency);
            let failing = t.probe_at(t.first_failing);
            answer.push(vec![
                Cell::text(&t.target),
                Cell::text(&t.serving_mode),
                Cell::text(t.max_concurrency.map_or("none".into(), |c| c.to_string())),
                Cell::text(match (t.first_failing, t.budget_max_inflight) {
                    (Some(c), _) => c.to_string(),
                    (None, Some(cap)) => format!("none up to {cap} (the budget's max_inflight)"),
                    (None, None) => format!("none up to {}", self.max_level),
                }),
                Cell::text(failing.and_then(|p| p.crossed.clone()).unwrap_or_default()),
                Cell::num(best.map(|p| p.goodput)),
                Cell::num(best.map(|p| p.good_output_tokens_per_second)),
                Cell::num(best.and_then(|p| p.cost_per_million_good_tokens_usd)),
            ]);
        }
        let prompts = match &self.dataset {
            Some(path) => format!("of the dataset {path} (its rows' own lengths)"),
            None => format!("at ISL {} / OSL {}", self.isl, self.osl),
        };
        answer.notes.push(format!(
            "each probe: a closed loop {prompts}, on one target at a time, with at least {:.1} s of warmup and {:.1} s measured, longer where the previous probe's requests were long (a warmup of twice their p99 latency, a window of eight times their median, at most four steps); a level meets the condition when the upper end of each bound's 95 % confidence interval lies below it (an interval straddling the bound does not; few samples: too few to bound the quantile, the estimate decided) and the step did not fault; levels from the ladder 1, 2, 4, 8, 16, …; good: within the condition's TTFT and ITL bounds per request",
            self.warmup_seconds, self.steady_seconds
        ));
        let mut columns = vec![
            Column::text("target"),
            Column::count("concurrency"),
            Column::text("verdict"),
        ];
        let names: Vec<String> = self.limits.iter().map(|l| l.text()).collect();
        for n in &names {
            columns.push(Column::num(n, "ms", 1));
        }
        columns.push(Column::count("requests"));
        columns.push(Column::count("errors"));
        columns.push(Column::num("warmup", "s", 1));
        columns.push(Column::num("measured", "s", 1));
        let mut probes = Table::new("search_probes", "Search probes", columns);
        for t in &self.targets {
            for p in &t.probes {
                let verdict = match (p.meets, p.estimated) {
                    (true, false) => "meets",
                    (true, true) => "meets (few samples)",
                    (false, false) => "fails",
                    (false, true) => "fails (few samples)",
                };
                let mut row = vec![
                    Cell::text(&t.target),
                    Cell::Number(f64::from(p.concurrency)),
                    Cell::text(verdict),
                ];
                row.extend(p.values.iter().map(|v| Cell::num(v.map(|s| s * 1e3))));
                row.push(Cell::Number(p.requests as f64));
                row.push(Cell::Number(p.errors as f64));
                row.push(Cell::Number(p.warmup_seconds));
                row.push(Cell::Number(p.steady_seconds));
                probes.push(row);
            }
        }
        vec![answer, probes]
    }
}
