//! Evaluation of SLO expressions over the measurements: the store of per-series sliding HDR
//! windows and step totals, and interval arithmetic that carries every value's 95 % confidence
//! interval through functions, arithmetic and fits conservatively.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::state::{Held, HeldSeries, HeldStep};
pub use crate::measure::stats::{Interval, wilson};
use crate::measure::stats::{Z_95, poisson_rate, r2_interval, slope_interval};
use crate::measure::step::Counts;
use crate::measure::window::{SlidingWindow, ValueScale, WindowConfig, WindowSnapshot};
use crate::model::RequestLabels;

use super::ast::*;
use super::baseline::BaselineStore;
use super::{LabelDomain, fit_groups, pin_label};

/// Why a value could not be computed: too few samples, no data, or no baseline yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Insufficient {
    pub reason: String,
}

fn insufficient<T>(reason: impl Into<String>) -> Result<T, Insufficient> {
    Err(Insufficient {
        reason: reason.into(),
    })
}

/// One request's measurements, kept until its step ends (a degraded step's are dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestSample {
    pub ok: bool,
    pub ttft: Option<f64>,
    pub itl: Option<f64>,
    pub latency: Option<f64>,
    pub server_ttft: Option<f64>,
    pub prefill_time: Option<f64>,
    pub prefill_wait: Option<f64>,
    pub kv_transfer: Option<f64>,
}

impl RequestSample {
    /// The request's value of a distribution measure (successful requests only).
    pub fn get(&self, m: Measure) -> Option<f64> {
        if !self.ok {
            return None;
        }
        match m {
            Measure::Ttft => self.ttft,
            Measure::Itl => self.itl,
            Measure::Latency => self.latency,
            Measure::ServerTtft => self.server_ttft,
            Measure::PrefillTime => self.prefill_time,
            Measure::PrefillWait => self.prefill_wait,
            Measure::KvTransfer => self.kv_transfer,
            _ => None,
        }
    }

    /// AIPerf's goodput: a request is good when it succeeded and every objective holds.
    pub fn is_good(&self, objectives: &[Objective]) -> bool {
        self.ok
            && objectives
                .iter()
                .all(|o| self.get(o.measure).is_some_and(|v| v <= o.seconds))
    }
}

/// The key of a set of goodput objectives (also a burn-rate SLI): its canonical text.
pub fn objectives_key(objectives: &[Objective]) -> String {
    objectives
        .iter()
        .map(|o| format!("{}<={}", o.measure.name(), format_duration(o.seconds)))
        .collect::<Vec<_>>()
        .join(",")
}

/// What one step measured for one target and label set, as the scalar measures read it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub labels: RequestLabels,
    /// `cycle|step|target`: label sets of one step instance share its steady time.
    pub instance: String,
    pub at: Instant,
    pub counts: Counts,
    pub steady_seconds: f64,
    /// Cost of the step's output in USD, where the target has a price.
    pub cost_usd: Option<f64>,
    /// Good requests per objective set ([`objectives_key`]).
    pub good: BTreeMap<String, u64>,
}

/// The value of a label by name.
pub fn label_value<'a>(labels: &'a RequestLabels, name: &str) -> &'a str {
    labels.get(name)
}

/// Whether a series' labels satisfy every matcher.
pub fn labels_match(labels: &RequestLabels, matchers: &[Matcher]) -> bool {
    matchers
        .iter()
        .all(|m| super::matcher_accepts(m, label_value(labels, &m.label)))
}

/// A distribution an SLO reads: which measure, over which series, over which window.
#[derive(Debug, Clone, PartialEq)]
pub struct Want {
    pub measure: Measure,
    pub matchers: Vec<Matcher>,
    pub window: Duration,
}

type WindowKey = (RequestLabels, Measure, Duration);

/// Slots per window: as `measure::window`'s default, the slot count trades memory for how
/// smoothly samples leave the window.
const SLOTS: usize = 6;

/// One series' distribution of one measure: its sliding window, and the samples of its latest
/// step, held for as long as the series exists.
#[derive(Debug)]
struct Series {
    window: SlidingWindow,
    latest: WindowSnapshot,
}

/// The measurements the SLOs read: per-series sliding windows of the distributions some SLO
/// wants (memory is spent only on those), and the recent step totals.
///
/// **Held steps.** A step of the cycle runs once per cycle, and a window shorter than the cycle
/// (or a pause) would leave it empty between runs, so verdicts would flap with the cycle's
/// position. So every lookup reads, per series, the steps that ended inside the window, or, when
/// none did, the series' latest step however old: data only ever leaves an SLO by being
/// replaced with newer data (or with its target). [`Store::newest`] says how old the data is.
#[derive(Debug)]
pub struct Store {
    wants: Vec<Want>,
    objective_sets: Vec<Vec<Objective>>,
    windows: HashMap<WindowKey, Series>,
    steps: VecDeque<StepRecord>,
    /// The latest step of every series, kept after it leaves `steps`.
    latest: HashMap<RequestLabels, StepRecord>,
    /// Step totals older than this are dropped.
    keep: Duration,
    /// `Some(w)`: one window per series that never rotates (a cycle's accumulation for
    /// baselines); every lookup uses it whatever window is asked for.
    fixed: Option<Duration>,
}

/// A window long enough that nothing in it expires within a cycle.
const CYCLE_SPAN: Duration = Duration::from_secs(400 * 86_400);

impl Store {
    /// A store of sliding windows for `wants`, counting good requests for `objective_sets`.
    pub fn sliding(wants: Vec<Want>, objective_sets: Vec<Vec<Objective>>) -> Store {
        let keep = wants
            .iter()
            .map(|w| w.window)
            .max()
            .unwrap_or(Duration::from_secs(3600));
        Store {
            wants,
            objective_sets,
            windows: HashMap::new(),
            steps: VecDeque::new(),
            latest: HashMap::new(),
            keep,
            fixed: None,
        }
    }

    /// A store that accumulates everything until it is cleared (one cycle).
    pub fn accumulating(wants: Vec<Want>, objective_sets: Vec<Vec<Objective>>) -> Store {
        let wants = wants
            .into_iter()
            .map(|w| Want {
                window: CYCLE_SPAN,
                ..w
            })
            .collect();
        Store {
            wants,
            objective_sets,
            windows: HashMap::new(),
            steps: VecDeque::new(),
            latest: HashMap::new(),
            keep: CYCLE_SPAN,
            fixed: Some(CYCLE_SPAN),
        }
    }

    /// Forgets every sample (a new cycle starts).
    pub fn clear(&mut self) {
        self.windows.clear();
        self.steps.clear();
        self.latest.clear();
    }

    /// Forgets every series of `target` (it left the target set): its data no longer holds.
    pub fn forget_target(&mut self, target: &str) {
        self.windows
            .retain(|(labels, _, _), _| labels.target != target);
        self.steps.retain(|r| r.labels.target != target);
        self.latest.retain(|labels, _| labels.target != target);
    }

    /// When the newest step of a series matching `matchers` ended, if any matches.
    pub fn newest(&self, matchers: &[Matcher]) -> Option<Instant> {
        self.latest
            .values()
            .filter(|r| labels_match(&r.labels, matchers))
            .map(|r| r.at)
            .max()
    }

    fn key_window(&self, w: Duration) -> Duration {
        self.fixed.unwrap_or(w)
    }

    /// Adds a finished, non-degraded step of one series: its requests' samples into the wanted
    /// windows, and its totals (with good-request counts) into the step list.
    /// With `distributions` false (a faulted step) the samples only count towards goodput and
    /// burn-rate SLIs, not towards the latency windows.
    pub fn commit(
        &mut self,
        mut record: StepRecord,
        samples: &[RequestSample],
        now: Instant,
        distributions: bool,
    ) {
        let mut targets: HashSet<(Measure, Duration)> = HashSet::new();
        for w in self.wants.iter().filter(|_| distributions) {
            if labels_match(&record.labels, &w.matchers) {
                targets.insert((w.measure, w.window));
            }
        }
        for (measure, window) in targets {
            let key = (record.labels.clone(), measure, window);
            let slots = if self.fixed.is_some() { 1 } else { SLOTS };
            let series = match self.windows.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let config = WindowConfig {
                        window,
                        slots,
                        scale: ValueScale::SECONDS,
                    };
                    match SlidingWindow::new(config, now) {
                        Ok(w) => e.insert(Series {
                            window: w,
                            latest: WindowSnapshot::empty(ValueScale::SECONDS),
                        }),
                        // Only a zero window fails, which validation rejects.
                        Err(_) => continue,
                    }
                }
            };
            series.latest = WindowSnapshot::empty(ValueScale::SECONDS);
            for s in samples {
                if let Some(v) = s.get(measure) {
                    series.window.record(v, now);
                    series.latest.record(v);
                }
            }
        }
        for set in &self.objective_sets {
            let good = samples.iter().filter(|s| s.is_good(set)).count() as u64;
            record.good.insert(objectives_key(set), good);
        }
        record.at = now;
        self.latest.insert(record.labels.clone(), record.clone());
        self.steps.push_back(record);
        while let Some(front) = self.steps.front() {
            if now.saturating_duration_since(front.at) > self.keep {
                self.steps.pop_front();
            } else {
                break;
            }
        }
    }

    /// The merged samples of `measure` over every series matching `matchers`, in `window`.
    pub fn distribution(
        &self,
        measure: Measure,
        matchers: &[Matcher],
        window: Duration,
        now: Instant,
    ) -> WindowSnapshot {
        let window = self.key_window(window);
        let mut merged = WindowSnapshot::empty(ValueScale::SECONDS);
        for ((labels, m, w), series) in &self.windows {
            if *m == measure && *w == window && labels_match(labels, matchers) {
                // A step's samples are recorded at its end, so they leave the window together:
                // an empty window means the latest step has left it, and it is held.
                let inside = series.window.snapshot(now);
                let read = if inside.is_empty() {
                    &series.latest
                } else {
                    &inside
                };
                // Same scale by construction.
                let _ = merged.merge(read);
            }
        }
        merged
    }

    /// Totals of the steps of matching series that ended within `window`, and of the latest step
    /// of each matching series that has none there (held).
    pub fn totals(&self, matchers: &[Matcher], window: Duration, now: Instant) -> Totals {
        let mut t = Totals::default();
        let mut instances: HashMap<&str, f64> = HashMap::new();
        let mut seen: HashSet<&RequestLabels> = HashSet::new();
        let inside = self
            .steps
            .iter()
            .filter(|r| self.fixed.is_some() || now.saturating_duration_since(r.at) <= window);
        let inside: Vec<&StepRecord> = inside
            .filter(|r| labels_match(&r.labels, matchers))
            .collect();
        seen.extend(inside.iter().map(|r| &r.labels));
        let held = self
            .latest
            .values()
            .filter(|r| !seen.contains(&r.labels) && labels_match(&r.labels, matchers));
        for r in inside.into_iter().chain(held) {
            t.counts.add(&r.counts);
            if let Some(c) = r.cost_usd {
                t.cost_usd += c;
                t.priced_tokens += r.counts.output_tokens;
            }
            for (k, g) in &r.good {
                *t.good.entry(k.clone()).or_default() += g;
            }
            let secs = instances.entry(r.instance.as_str()).or_default();
            *secs = secs.max(r.steady_seconds);
        }
        t.steady_seconds = instances.values().sum();
        t
    }

    /// The latest step of every series, to save (`slo::state`); instants as Unix times.
    pub fn held(&self, now: Instant, now_unix: f64) -> Held {
        let unix = |at: Instant| now_unix - now.saturating_duration_since(at).as_secs_f64();
        let map = |l: &RequestLabels| -> BTreeMap<String, String> {
            l.pairs()
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let mut series: Vec<HeldSeries> = self
            .windows
            .iter()
            .filter(|(_, s)| !s.latest.is_empty())
            .filter_map(|((labels, measure, window), s)| {
                let at = self.latest.get(labels)?.at;
                Some(HeldSeries {
                    labels: map(labels),
                    measure: measure.name().to_owned(),
                    window_seconds: window.as_secs_f64(),
                    at_unix: unix(at),
                    values: s.latest.to_units(),
                })
            })
            .collect();
        series.sort_by(|a, b| (&a.labels, &a.measure).cmp(&(&b.labels, &b.measure)));
        let mut steps: Vec<HeldStep> = self
            .latest
            .values()
            .map(|r| HeldStep {
                labels: map(&r.labels),
                instance: r.instance.clone(),
                at_unix: unix(r.at),
                requests: r.counts.requests,
                ok: r.counts.ok,
                errors: r.counts.errors,
                prompt_tokens: r.counts.prompt_tokens,
                cached_tokens: r.counts.cached_tokens,
                output_tokens: r.counts.output_tokens,
                steady_seconds: r.steady_seconds,
                cost_usd: r.cost_usd,
                good: r.good.clone(),
            })
            .collect();
        steps.sort_by(|a, b| a.labels.cmp(&b.labels));
        Held { series, steps }
    }

    /// Restores saved latest steps as held data: each one the SLOs still want, with its age kept.
    pub fn restore_held(&mut self, held: &Held, now: Instant, now_unix: f64) {
        let instant = |at_unix: f64| {
            let age = Duration::from_secs_f64((now_unix - at_unix).max(0.0));
            now.checked_sub(age).unwrap_or(now)
        };
        let labels = |m: &BTreeMap<String, String>| {
            RequestLabels::from_pairs(m.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        };
        for h in &held.steps {
            let record = StepRecord {
                labels: labels(&h.labels),
                instance: h.instance.clone(),
                at: instant(h.at_unix),
                counts: Counts {
                    requests: h.requests,
                    ok: h.ok,
                    errors: h.errors,
                    prompt_tokens: h.prompt_tokens,
                    cached_tokens: h.cached_tokens,
                    output_tokens: h.output_tokens,
                },
                steady_seconds: h.steady_seconds,
                cost_usd: h.cost_usd,
                good: h.good.clone(),
            };
            self.latest.insert(record.labels.clone(), record);
        }
        for h in &held.series {
            let Some(measure) = Measure::by_name(&h.measure) else {
                continue;
            };
            let window = self.key_window(Duration::from_secs_f64(h.window_seconds));
            let l = labels(&h.labels);
            let wanted = self.wants.iter().any(|w| {
                w.measure == measure && w.window == window && labels_match(&l, &w.matchers)
            });
            if !wanted {
                continue;
            }
            let slots = if self.fixed.is_some() { 1 } else { SLOTS };
            let config = WindowConfig {
                window,
                slots,
                scale: ValueScale::SECONDS,
            };
            let Ok(sliding) = SlidingWindow::new(config, now) else {
                continue;
            };
            self.windows.insert(
                (l, measure, window),
                Series {
                    window: sliding,
                    latest: WindowSnapshot::from_units(ValueScale::SECONDS, &h.values),
                },
            );
        }
    }

    /// Number of windows held (memory is about 94 KiB per slot of each).
    pub fn window_count(&self) -> usize {
        self.windows.len()
    }
}

/// Sums over matching steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub counts: Counts,
    pub cost_usd: f64,
    pub priced_tokens: u64,
    pub steady_seconds: f64,
    pub good: BTreeMap<String, u64>,
}

/// Everything an evaluation reads.
pub struct Ctx<'a> {
    pub store: &'a Store,
    pub cycle_baselines: &'a BaselineStore,
    pub domain: &'a LabelDomain,
    pub slo: &'a str,
    pub window: Duration,
    pub min_samples: u64,
    pub now: Instant,
    pub now_unix: f64,
}

impl<'a> Ctx<'a> {
    /// The context of evaluating `def` over `store` at `now`.
    pub fn of(
        def: &'a super::SloDef,
        store: &'a Store,
        cycle_baselines: &'a BaselineStore,
        domain: &'a LabelDomain,
        now: Instant,
        now_unix: f64,
    ) -> Ctx<'a> {
        Ctx {
            store,
            cycle_baselines,
            domain,
            slo: &def.name,
            window: def.window,
            min_samples: def.min_samples,
            now,
            now_unix,
        }
    }
}

/// One comparison's two sides and its own verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Side {
    pub op: CmpOp,
    pub lhs: Interval,
    pub rhs: Interval,
    pub verdict: Truth,
}

/// A three-valued verdict: clearly true, clearly false, or the intervals overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truth {
    True,
    False,
    Unknown,
}

/// Compares two intervals: `True`/`False` only when the intervals are clearly apart.
pub fn compare(op: CmpOp, a: Interval, b: Interval) -> Truth {
    let t = |yes: bool, no: bool| {
        if yes {
            Truth::True
        } else if no {
            Truth::False
        } else {
            Truth::Unknown
        }
    };
    match op {
        CmpOp::Lt => t(a.upper < b.lower, a.lower >= b.upper),
        CmpOp::Le => t(a.upper <= b.lower, a.lower > b.upper),
        CmpOp::Gt => t(a.lower > b.upper, a.upper <= b.lower),
        CmpOp::Ge => t(a.lower >= b.upper, a.upper < b.lower),
        CmpOp::Eq | CmpOp::Ne => {
            let points_equal = a.lower == a.upper && b.lower == b.upper && a.lower == b.lower;
            let apart = a.upper < b.lower || b.upper < a.lower;
            let eq = t(points_equal, apart);
            match (op, eq) {
                (CmpOp::Ne, Truth::True) => Truth::False,
                (CmpOp::Ne, Truth::False) => Truth::True,
                _ => eq,
            }
        }
    }
}

/// Evaluates a condition: its verdict and every comparison's sides, left to right.
pub fn condition(ctx: &Ctx<'_>, c: &Cond) -> Result<(Truth, Vec<Side>), Insufficient> {
    let mut sides = Vec::new();
    let truth = cond_inner(ctx, c, &mut sides)?;
    Ok((truth, sides))
}

fn cond_inner(ctx: &Ctx<'_>, c: &Cond, sides: &mut Vec<Side>) -> Result<Truth, Insufficient> {
    match c {
        Cond::Cmp(op, a, b) => {
            let lhs = value(ctx, a)?;
            let rhs = value(ctx, b)?;
            let verdict = compare(*op, lhs, rhs);
            sides.push(Side {
                op: *op,
                lhs,
                rhs,
                verdict,
            });
            Ok(verdict)
        }
        Cond::And(a, b) => {
            let (x, y) = (cond_inner(ctx, a, sides)?, cond_inner(ctx, b, sides)?);
            Ok(match (x, y) {
                (Truth::False, _) | (_, Truth::False) => Truth::False,
                (Truth::True, Truth::True) => Truth::True,
                _ => Truth::Unknown,
            })
        }
        Cond::Or(a, b) => {
            let (x, y) = (cond_inner(ctx, a, sides)?, cond_inner(ctx, b, sides)?);
            Ok(match (x, y) {
                (Truth::True, _) | (_, Truth::True) => Truth::True,
                (Truth::False, Truth::False) => Truth::False,
                _ => Truth::Unknown,
            })
        }
    }
}

/// The interval of a value.
pub fn value(ctx: &Ctx<'_>, v: &Value) -> Result<Interval, Insufficient> {
    match v {
        Value::Number(n) | Value::Duration(n) => Ok(Interval::point(*n)),
        Value::Neg(a) => Ok(-value(ctx, a)?),
        Value::Binary(op, a, b) => {
            let (a, b) = (value(ctx, a)?, value(ctx, b)?);
            Ok(match op {
                BinOp::Add => a + b,
                BinOp::Sub => a + -b,
                BinOp::Mul => a * b,
                BinOp::Div => a / b,
            })
        }
        Value::Agg(agg, sel) => aggregate(ctx, *agg, sel),
        Value::Scalar(sel) => scalar(ctx, sel),
        Value::Goodput(sel, objectives) => {
            let t = ctx.store.totals(&sel.matchers, ctx.window, ctx.now);
            if t.counts.requests < ctx.min_samples || t.steady_seconds <= 0.0 {
                return insufficient(format!(
                    "{v}: {} requests, {} needed",
                    t.counts.requests, ctx.min_samples
                ));
            }
            let good = t
                .good
                .get(&objectives_key(objectives))
                .copied()
                .unwrap_or(0);
            Ok(poisson_rate(good, t.steady_seconds))
        }
        Value::Fit(fit, inner, label) => {
            let groups = fit_groups(inner, label, ctx.domain);
            let mut xs = Vec::with_capacity(groups.len());
            let mut ys = Vec::with_capacity(groups.len());
            for (text, x) in &groups {
                xs.push(*x);
                ys.push(value(ctx, &pin_label(inner, label, text))?);
            }
            if xs.len() < 3 {
                return insufficient(format!("{v}: fewer than 3 groups"));
            }
            Ok(match fit {
                Fit::Slope => slope_interval(&xs, &ys),
                Fit::R2 => r2_interval(&xs, &ys),
            })
        }
        Value::Baseline(inner, past) => {
            let key = baseline_key(ctx.slo, inner);
            match past {
                BaselineRef::Span(span) => ctx
                    .cycle_baselines
                    .lookup(&key, ctx.now_unix, *span)
                    .ok_or_else(|| Insufficient {
                        reason: format!(
                            "{v}: no completed passing cycle in the last {}",
                            format_duration(*span)
                        ),
                    }),
                BaselineRef::Pinned(name) => ctx
                    .cycle_baselines
                    .pinned(name, &key)
                    .ok_or_else(|| Insufficient {
                        reason: format!(
                            "{v}: no baseline pinned as `{name}` holds this term (pin one with POST /api/v1/baselines)"
                        ),
                    }),
            }
        }
    }
}

/// The key a baseline term's per-cycle values are kept under.
pub fn baseline_key(slo: &str, inner: &Value) -> String {
    format!("{slo}|{inner}")
}

fn aggregate(ctx: &Ctx<'_>, agg: Agg, sel: &Selector) -> Result<Interval, Insufficient> {
    let snap = ctx
        .store
        .distribution(sel.measure, &sel.matchers, ctx.window, ctx.now);
    let n = snap.count();
    let window_secs = ctx.window.as_secs_f64();
    match agg {
        Agg::Count => return Ok(Interval::point(n as f64)),
        Agg::Rate => return Ok(poisson_rate(n, window_secs)),
        _ => {}
    }
    if n < ctx.min_samples || n == 0 {
        return insufficient(format!(
            "{}: {n} samples, {} needed",
            Value::Agg(agg, sel.clone()),
            ctx.min_samples
        ));
    }
    match agg {
        Agg::Quantile(pct) => {
            let q = snap
                .quantile_interval(pct / 100.0)
                .ok_or_else(|| Insufficient {
                    reason: format!("{sel}: no samples"),
                })?;
            Ok(Interval {
                estimate: q.estimate,
                lower: q.lower.unwrap_or(0.0),
                upper: q.upper.unwrap_or(f64::INFINITY),
            })
        }
        Agg::Mean => {
            let (mean, lo, hi) = (
                snap.mean().unwrap_or(0.0),
                snap.min().unwrap_or(0.0),
                snap.max().unwrap_or(0.0),
            );
            // Hoeffding over the observed range: distribution-free, conservative for long tails.
            let half = (hi - lo) * ((2.0f64 / 0.05).ln() / (2.0 * n as f64)).sqrt();
            Ok(Interval {
                estimate: mean,
                lower: (mean - half).max(lo),
                upper: (mean + half).min(hi),
            })
        }
        Agg::Count | Agg::Rate => unreachable!("handled above"),
    }
}

fn scalar(ctx: &Ctx<'_>, sel: &Selector) -> Result<Interval, Insufficient> {
    let t = ctx.store.totals(&sel.matchers, ctx.window, ctx.now);
    let (n, what) = match sel.measure {
        Measure::ErrorRatio => (t.counts.requests, "requests"),
        _ => (t.counts.ok, "successful requests"),
    };
    if n < ctx.min_samples || n == 0 {
        return insufficient(format!(
            "{sel}: {n} {what} in the window, {} needed",
            ctx.min_samples
        ));
    }
    // Relative spread of a count of n independent completions.
    let rel = Z_95 / (t.counts.ok.max(1) as f64).sqrt();
    let scaled = |v: f64| Interval {
        estimate: v,
        lower: (v * (1.0 - rel)).max(0.0),
        upper: v * (1.0 + rel),
    };
    match sel.measure {
        Measure::ErrorRatio => Ok(wilson(t.counts.errors, t.counts.requests)),
        Measure::CacheHitRatio => {
            if t.counts.prompt_tokens == 0 {
                return insufficient(format!("{sel}: no prompt tokens"));
            }
            let p = t.counts.cached_tokens as f64 / t.counts.prompt_tokens as f64;
            // Requests, not tokens, are the independent units: a Wilson interval at n = ok.
            let w = wilson((p * t.counts.ok as f64).round() as u64, t.counts.ok);
            Ok(Interval {
                estimate: p,
                lower: w.lower.min(p),
                upper: w.upper.max(p),
            })
        }
        Measure::OutputTps if t.steady_seconds > 0.0 => {
            Ok(scaled(t.counts.output_tokens as f64 / t.steady_seconds))
        }
        Measure::Throughput if t.steady_seconds > 0.0 => {
            Ok(poisson_rate(t.counts.ok, t.steady_seconds))
        }
        Measure::CostPerMtok => {
            if t.priced_tokens == 0 {
                return insufficient(format!("{sel}: no priced output tokens"));
            }
            let v = t.cost_usd / t.priced_tokens as f64 * 1e6;
            // Cost per token is the inverse of throughput: invert its relative interval.
            Ok(Interval {
                estimate: v,
                lower: v / (1.0 + rel),
                upper: if rel < 1.0 {
                    v / (1.0 - rel)
                } else {
                    f64::INFINITY
                },
            })
        }
        _ => insufficient(format!("{sel}: no steady time in the window")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(lo: f64, est: f64, hi: f64) -> Interval {
        Interval::new(lo, est, hi)
    }

    #[test]
    fn comparisons_decide_only_when_intervals_are_apart() {
        let low = iv(1.0, 1.5, 2.0);
        let high = iv(3.0, 3.5, 4.0);
        let overlapping = iv(1.8, 2.5, 3.2);
        assert_eq!(compare(CmpOp::Le, low, high), Truth::True);
        assert_eq!(compare(CmpOp::Le, high, low), Truth::False);
        assert_eq!(compare(CmpOp::Le, low, overlapping), Truth::Unknown);
        assert_eq!(compare(CmpOp::Gt, high, low), Truth::True);
        assert_eq!(compare(CmpOp::Ne, low, high), Truth::True);
        assert_eq!(
            compare(CmpOp::Eq, Interval::point(1.0), Interval::point(1.0)),
            Truth::True
        );
    }
}
