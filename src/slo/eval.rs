//! Evaluation of SLO expressions over the measurements: the store of per-series sliding HDR
//! windows and step totals, and interval arithmetic that carries every value's 95 % confidence
//! interval through functions, arithmetic and fits conservatively.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::measure::window::{SlidingWindow, ValueScale, WindowConfig, WindowSnapshot};
use crate::model::RequestLabels;

use super::ast::*;
use super::baseline::BaselineStore;
use super::{LabelDomain, fit_groups, pin_label};

/// Two-sided 95 % normal quantile.
const Z: f64 = 1.959_963_984_540_054;

/// A value with its 95 % confidence interval; the bounds may be infinite (unbounded).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub estimate: f64,
    pub lower: f64,
    pub upper: f64,
}

impl Interval {
    pub fn point(v: f64) -> Self {
        Interval {
            estimate: v,
            lower: v,
            upper: v,
        }
    }

    fn neg(self) -> Self {
        Interval {
            estimate: -self.estimate,
            lower: -self.upper,
            upper: -self.lower,
        }
    }

    fn add(self, o: Self) -> Self {
        Interval {
            estimate: self.estimate + o.estimate,
            lower: self.lower + o.lower,
            upper: self.upper + o.upper,
        }
    }

    fn mul(self, o: Self) -> Self {
        // 0 × ∞ is 0 here: an endpoint at exactly 0 bounds the product at 0 (extended interval
        // arithmetic), which keeps e.g. [0, 1] × [5, ∞] = [0, ∞] instead of NaN.
        let p = |a: f64, b: f64| if a == 0.0 || b == 0.0 { 0.0 } else { a * b };
        let c = [
            p(self.lower, o.lower),
            p(self.lower, o.upper),
            p(self.upper, o.lower),
            p(self.upper, o.upper),
        ];
        Interval {
            estimate: self.estimate * o.estimate,
            lower: c.iter().copied().fold(f64::INFINITY, f64::min),
            upper: c.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }

    fn div(self, o: Self) -> Self {
        let estimate = self.estimate / o.estimate;
        if o.lower <= 0.0 && o.upper >= 0.0 {
            // A divisor that may be zero bounds nothing.
            return Interval {
                estimate,
                lower: f64::NEG_INFINITY,
                upper: f64::INFINITY,
            };
        }
        let inv = Interval {
            estimate: 1.0 / o.estimate,
            lower: 1.0 / o.upper,
            upper: 1.0 / o.lower,
        };
        Interval {
            estimate,
            ..self.mul(inv)
        }
    }

    fn finite_or_none(x: f64) -> Option<f64> {
        x.is_finite().then_some(x)
    }

    /// The lower bound, `None` when unbounded.
    pub fn lower_bound(&self) -> Option<f64> {
        Self::finite_or_none(self.lower)
    }

    /// The upper bound, `None` when unbounded.
    pub fn upper_bound(&self) -> Option<f64> {
        Self::finite_or_none(self.upper)
    }
}

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
    pub requests: u64,
    pub ok: u64,
    pub errors: u64,
    pub output_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
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

/// The measurements the SLOs read: per-series sliding windows of the distributions some SLO
/// wants (memory is spent only on those), and the recent step totals.
#[derive(Debug)]
pub struct Store {
    wants: Vec<Want>,
    objective_sets: Vec<Vec<Objective>>,
    windows: HashMap<WindowKey, SlidingWindow>,
    steps: VecDeque<StepRecord>,
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
            keep: CYCLE_SPAN,
            fixed: Some(CYCLE_SPAN),
        }
    }

    /// Forgets every sample (a new cycle starts).
    pub fn clear(&mut self) {
        self.windows.clear();
        self.steps.clear();
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
            let sliding = match self.windows.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let config = WindowConfig {
                        window,
                        slots,
                        scale: ValueScale::SECONDS,
                    };
                    match SlidingWindow::new(config, now) {
                        Ok(w) => e.insert(w),
                        // Only a zero window fails, which validation rejects.
                        Err(_) => continue,
                    }
                }
            };
            for s in samples {
                if let Some(v) = s.get(measure) {
                    sliding.record(v, now);
                }
            }
        }
        for set in &self.objective_sets {
            let good = samples.iter().filter(|s| s.is_good(set)).count() as u64;
            record.good.insert(objectives_key(set), good);
        }
        record.at = now;
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
        for ((labels, m, w), sliding) in &self.windows {
            if *m == measure && *w == window && labels_match(labels, matchers) {
                // Same scale by construction.
                let _ = merged.merge(&sliding.snapshot(now));
            }
        }
        merged
    }

    /// Totals of the steps of matching series that ended within `window`.
    pub fn totals(&self, matchers: &[Matcher], window: Duration, now: Instant) -> Totals {
        let mut t = Totals::default();
        let mut instances: HashMap<&str, f64> = HashMap::new();
        for r in &self.steps {
            let inside = self.fixed.is_some() || now.saturating_duration_since(r.at) <= window;
            if !inside || !labels_match(&r.labels, matchers) {
                continue;
            }
            t.requests += r.requests;
            t.ok += r.ok;
            t.errors += r.errors;
            t.output_tokens += r.output_tokens;
            t.prompt_tokens += r.prompt_tokens;
            t.cached_tokens += r.cached_tokens;
            if let Some(c) = r.cost_usd {
                t.cost_usd += c;
                t.priced_tokens += r.output_tokens;
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

    /// Number of windows held (memory is about 94 KiB per slot of each).
    pub fn window_count(&self) -> usize {
        self.windows.len()
    }
}

/// Sums over matching steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub requests: u64,
    pub ok: u64,
    pub errors: u64,
    pub output_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub cost_usd: f64,
    pub priced_tokens: u64,
    pub steady_seconds: f64,
    pub good: BTreeMap<String, u64>,
}

/// Wilson score interval of a proportion.
pub fn wilson(successes: u64, n: u64) -> Interval {
    let nf = n as f64;
    let p = successes as f64 / nf;
    let z2 = Z * Z;
    let denom = 1.0 + z2 / nf;
    let center = (p + z2 / (2.0 * nf)) / denom;
    let half = Z * (p * (1.0 - p) / nf + z2 / (4.0 * nf * nf)).sqrt() / denom;
    Interval {
        estimate: p,
        lower: (center - half).max(0.0),
        upper: (center + half).min(1.0),
    }
}

/// A rate `count / seconds` with the normal approximation of a Poisson count's interval.
fn poisson_rate(count: u64, seconds: f64) -> Interval {
    let c = count as f64;
    let half = Z * c.sqrt();
    Interval {
        estimate: c / seconds,
        lower: (c - half).max(0.0) / seconds,
        upper: (c + half + Z * Z / 2.0) / seconds,
    }
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
        Value::Neg(a) => Ok(value(ctx, a)?.neg()),
        Value::Binary(op, a, b) => {
            let (a, b) = (value(ctx, a)?, value(ctx, b)?);
            Ok(match op {
                BinOp::Add => a.add(b),
                BinOp::Sub => a.add(b.neg()),
                BinOp::Mul => a.mul(b),
                BinOp::Div => a.div(b),
            })
        }
        Value::Agg(agg, sel) => aggregate(ctx, *agg, sel),
        Value::Scalar(sel) => scalar(ctx, sel),
        Value::Goodput(sel, objectives) => {
            let t = ctx.store.totals(&sel.matchers, ctx.window, ctx.now);
            if t.requests < ctx.min_samples || t.steady_seconds <= 0.0 {
                return insufficient(format!(
                    "{v}: {} requests, {} needed",
                    t.requests, ctx.min_samples
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
        Value::Baseline(inner, span) => {
            let key = baseline_key(ctx.slo, inner);
            ctx.cycle_baselines
                .lookup(&key, ctx.now_unix, *span)
                .ok_or_else(|| Insufficient {
                    reason: format!(
                        "{v}: no completed cycle in the last {}",
                        format_duration(*span)
                    ),
                })
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
        Measure::ErrorRatio => (t.requests, "requests"),
        _ => (t.ok, "successful requests"),
    };
    if n < ctx.min_samples || n == 0 {
        return insufficient(format!(
            "{sel}: {n} {what} in the window, {} needed",
            ctx.min_samples
        ));
    }
    // Relative spread of a count of n independent completions.
    let rel = Z / (t.ok.max(1) as f64).sqrt();
    let scaled = |v: f64| Interval {
        estimate: v,
        lower: (v * (1.0 - rel)).max(0.0),
        upper: v * (1.0 + rel),
    };
    match sel.measure {
        Measure::ErrorRatio => Ok(wilson(t.errors, t.requests)),
        Measure::CacheHitRatio => {
            if t.prompt_tokens == 0 {
                return insufficient(format!("{sel}: no prompt tokens"));
            }
            let p = t.cached_tokens as f64 / t.prompt_tokens as f64;
            // Requests, not tokens, are the independent units: a Wilson interval at n = ok.
            let w = wilson((p * t.ok as f64).round() as u64, t.ok);
            Ok(Interval {
                estimate: p,
                lower: w.lower.min(p),
                upper: w.upper.max(p),
            })
        }
        Measure::OutputTps if t.steady_seconds > 0.0 => {
            Ok(scaled(t.output_tokens as f64 / t.steady_seconds))
        }
        Measure::Throughput if t.steady_seconds > 0.0 => Ok(poisson_rate(t.ok, t.steady_seconds)),
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

/// Slope of the least-squares line: linear in the ys, so its bounds are exact.
pub fn slope_interval(xs: &[f64], ys: &[Interval]) -> Interval {
    let coef = slope_coefficients(xs);
    let mut out = Interval::point(0.0);
    for (c, y) in coef.iter().zip(ys) {
        out = out.add(Interval::point(*c).mul(*y));
    }
    out
}

fn slope_coefficients(xs: &[f64]) -> Vec<f64> {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let sxx: f64 = xs.iter().map(|x| (x - mean).powi(2)).sum();
    xs.iter().map(|x| (x - mean) / sxx).collect()
}

fn r2_of(xs: &[f64], ys: &[f64]) -> f64 {
    let (sse, sst) = (sse(xs, ys), sst(ys));
    if sst == 0.0 { 1.0 } else { 1.0 - sse / sst }
}

fn sst(ys: &[f64]) -> f64 {
    let mean = ys.iter().sum::<f64>() / ys.len() as f64;
    ys.iter().map(|y| (y - mean).powi(2)).sum()
}

/// Residual sum of squares of the least-squares line through (xs, ys).
fn sse(xs: &[f64], ys: &[f64]) -> f64 {
    let fitted = fit_line(xs, ys);
    ys.iter().zip(&fitted).map(|(y, f)| (y - f).powi(2)).sum()
}

fn fit_line(xs: &[f64], ys: &[f64]) -> Vec<f64> {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let b: f64 = slope_coefficients(xs)
        .iter()
        .zip(ys)
        .map(|(c, y)| c * y)
        .sum();
    xs.iter().map(|x| my + b * (x - mx)).collect()
}

/// Above this many groups the corners of the box are not enumerated; a greedy search over
/// corners gives the maxima instead.
const MAX_ENUMERATED_GROUPS: usize = 12;

/// The largest value of a convex function over the box: it lies at a corner.
fn max_over_corners(lo: &[f64], hi: &[f64], f: &dyn Fn(&[f64]) -> f64) -> f64 {
    let n = lo.len();
    if n <= MAX_ENUMERATED_GROUPS {
        let mut y = lo.to_vec();
        let mut best = f64::NEG_INFINITY;
        for mask in 0u32..(1 << n) {
            for i in 0..n {
                y[i] = if mask & (1 << i) != 0 { hi[i] } else { lo[i] };
            }
            best = best.max(f(&y));
        }
        return best;
    }
    let mut y = lo.to_vec();
    let mut best = f(&y);
    loop {
        let mut improved = false;
        for i in 0..n {
            let keep = y[i];
            y[i] = if keep == lo[i] { hi[i] } else { lo[i] };
            let v = f(&y);
            if v > best {
                best = v;
                improved = true;
            } else {
                y[i] = keep;
            }
        }
        if !improved {
            return best;
        }
    }
}

/// The smallest spread Σ(y − ȳ)² over the box: every y is its interval's point nearest a
/// common level c, with c the mean of those points (found by bisection; the mean of the clamped
/// points minus c decreases in c).
fn min_sst(lo: &[f64], hi: &[f64]) -> f64 {
    let clamp_all = |c: f64| {
        lo.iter()
            .zip(hi)
            .map(|(l, h)| c.clamp(*l, *h))
            .collect::<Vec<_>>()
    };
    let (mut a, mut b) = (
        lo.iter().copied().fold(f64::INFINITY, f64::min),
        hi.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    for _ in 0..200 {
        let c = (a + b) / 2.0;
        let ys = clamp_all(c);
        let mean = ys.iter().sum::<f64>() / ys.len() as f64;
        if mean > c {
            a = c;
        } else {
            b = c;
        }
    }
    sst(&clamp_all((a + b) / 2.0))
}

/// The smallest residual Σ(y − fit)² over the box: the distance between the box and the
/// plane of lines, by alternating projections (both convex, so they converge to it).
fn min_sse(xs: &[f64], lo: &[f64], hi: &[f64]) -> f64 {
    let mut y: Vec<f64> = lo.iter().zip(hi).map(|(l, h)| (l + h) / 2.0).collect();
    for _ in 0..2000 {
        let line = fit_line(xs, &y);
        let next: Vec<f64> = line
            .iter()
            .zip(lo.iter().zip(hi))
            .map(|(f, (l, h))| f.clamp(*l, *h))
            .collect();
        let moved: f64 = next.iter().zip(&y).map(|(a, b)| (a - b).abs()).sum();
        y = next;
        if moved < 1e-15 {
            break;
        }
    }
    sse(xs, &y)
}

/// R² of the least-squares line with bounds over every ys inside their intervals:
/// 1 − max SSE / min SST ≤ R² ≤ 1 − min SSE / max SST (SSE and SST are convex in the ys, so
/// their maxima lie at corners of the box and their minima are found by convex search).
pub fn r2_interval(xs: &[f64], ys: &[Interval]) -> Interval {
    let est: Vec<f64> = ys.iter().map(|y| y.estimate).collect();
    let estimate = r2_of(xs, &est);
    if ys
        .iter()
        .any(|y| !y.lower.is_finite() || !y.upper.is_finite())
    {
        return Interval {
            estimate,
            lower: 0.0,
            upper: 1.0,
        };
    }
    let lo: Vec<f64> = ys.iter().map(|y| y.lower).collect();
    let hi: Vec<f64> = ys.iter().map(|y| y.upper).collect();
    let max_sse = max_over_corners(&lo, &hi, &|y| sse(xs, y));
    let max_sst = max_over_corners(&lo, &hi, &|y| sst(y));
    let (min_sse, min_sst) = (min_sse(xs, &lo, &hi), min_sst(&lo, &hi));
    let lower = if min_sst > 0.0 {
        (1.0 - max_sse / min_sst).max(0.0)
    } else {
        0.0
    };
    let upper = if max_sst > 0.0 {
        (1.0 - min_sse / max_sst).min(1.0)
    } else {
        1.0
    };
    Interval {
        estimate,
        lower: lower.min(estimate),
        upper: upper.max(estimate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(lo: f64, est: f64, hi: f64) -> Interval {
        Interval {
            estimate: est,
            lower: lo,
            upper: hi,
        }
    }

    #[test]
    fn arithmetic_keeps_the_extremes() {
        let a = iv(1.0, 2.0, 3.0);
        let b = iv(-1.0, 1.0, 2.0);
        assert_eq!(a.add(b), iv(0.0, 3.0, 5.0));
        assert_eq!(a.add(b.neg()), iv(-1.0, 1.0, 4.0));
        assert_eq!(a.mul(b), iv(-3.0, 2.0, 6.0));
        let d = a.div(iv(2.0, 4.0, 4.0));
        assert_eq!((d.lower, d.estimate, d.upper), (0.25, 0.5, 1.5));
        let unbounded = a.div(b);
        assert!(unbounded.lower.is_infinite() && unbounded.upper.is_infinite());
        let open = iv(0.0, 0.5, 1.0).mul(iv(5.0, 6.0, f64::INFINITY));
        assert_eq!((open.lower, open.upper), (0.0, f64::INFINITY));
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

    #[test]
    fn wilson_interval_matches_the_textbook() {
        // 10 successes of 100: Wilson 95 % is about [0.0552, 0.1744].
        let w = wilson(10, 100);
        assert!((w.lower - 0.0552).abs() < 5e-4, "{w:?}");
        assert!((w.upper - 0.1744).abs() < 5e-4, "{w:?}");
    }

    #[test]
    fn fits_of_exact_lines_and_their_bounds() {
        let xs = [0.0, 0.25, 0.5, 0.75, 1.0];
        // y = 1 − 0.8 x exactly, as points: slope −0.8, R² 1.
        let points: Vec<Interval> = xs.iter().map(|x| Interval::point(1.0 - 0.8 * x)).collect();
        let s = slope_interval(&xs, &points);
        assert!((s.estimate + 0.8).abs() < 1e-12 && (s.lower - s.upper).abs() < 1e-12);
        let r = r2_interval(&xs, &points);
        assert!(
            (r.estimate - 1.0).abs() < 1e-12 && r.lower > 0.999_999,
            "{r:?}"
        );
        // ±0.05 around the line: R² stays high, its lower bound is below 1, slope brackets −0.8.
        let noisy: Vec<Interval> = xs
            .iter()
            .map(|x| iv(0.95 - 0.8 * x, 1.0 - 0.8 * x, 1.05 - 0.8 * x))
            .collect();
        let r = r2_interval(&xs, &noisy);
        assert!(r.lower > 0.8 && r.lower < 1.0 && r.upper == 1.0, "{r:?}");
        let s = slope_interval(&xs, &noisy);
        assert!(s.lower < -0.8 && s.upper > -0.8 && s.upper < -0.6, "{s:?}");
        // A flat, noisy relation: the upper bound of R² is well below 1, so `r2 >= 0.9` fails.
        let flat: Vec<Interval> = [1.0, 0.0, 1.0, 0.0, 1.0]
            .iter()
            .map(|y| iv(y - 0.05, *y, y + 0.05))
            .collect();
        let r = r2_interval(&xs, &flat);
        assert!(r.upper < 0.5, "{r:?}");
        assert!(r.lower <= r.estimate && r.estimate <= r.upper);
    }
}
