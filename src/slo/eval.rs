//! Evaluation of SLO expressions over the measurements ([`super::store`]): interval arithmetic
//! that carries every value's 95 % confidence interval through functions, arithmetic and fits
//! conservatively.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::SaturatedSteps;
pub use crate::measure::stats::{Interval, wilson};
use crate::measure::stats::{Z_95, poisson_rate, r2_interval, samples_to_bound, slope_interval};

use super::ast::*;
use super::baseline::{BaselineStore, MIN_BASELINE_RUNS, Worse};
pub use super::store::{
    Folding, RequestSample, StepRecord, StepSamples, Store, Totals, Want, label_value,
    labels_match, objectives_key,
};
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

/// Everything an evaluation reads.
pub struct Ctx<'a> {
    pub store: &'a Store,
    pub cycle_baselines: &'a BaselineStore,
    pub domain: &'a LabelDomain,
    pub slo: &'a str,
    pub window: Duration,
    /// Which steps the SLO reads by saturation.
    pub steps: SaturatedSteps,
    pub min_samples: u64,
    pub now: Instant,
    pub now_unix: f64,
    /// When the newest step the SLO reads ended (unix seconds; `now_unix` without one): the run
    /// being judged, which a rolling baseline compares with the cycles that ended before it.
    pub run_end_unix: f64,
    /// Why a value or comparison decided less than its numbers suggest (an unbounded quantile,
    /// a run inside its baseline's run-to-run range), for the status's reason.
    pub notes: RefCell<Vec<String>>,
    /// Which way the value being computed regresses, from the comparison it is a side of (and
    /// the signs on the way down): a rolling baseline inside it is the closest past run no
    /// worse than this run (`BaselineStore::nearest`).
    worse: Cell<Option<Worse>>,
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
        let run_end_unix = def
            .selectors()
            .iter()
            .filter_map(|sel| store.newest_step(&sel.matchers, def.saturated_steps))
            .map(|r| r.at_unix)
            .max_by(f64::total_cmp)
            .unwrap_or(now_unix);
        Ctx {
            run_end_unix,
            store,
            cycle_baselines,
            domain,
            slo: &def.name,
            window: def.window,
            steps: def.saturated_steps,
            min_samples: def.min_samples,
            now,
            now_unix,
            notes: RefCell::new(Vec::new()),
            worse: Cell::new(None),
        }
    }

    /// `f` with `worse` as the direction a regression moves the value it computes.
    fn judging<T>(&self, worse: Option<Worse>, f: impl FnOnce() -> T) -> T {
        let outer = self.worse.replace(worse);
        let out = f();
        self.worse.set(outer);
        out
    }

    /// `f` over an operand whose sign is flipped (negated, subtracted, divided by).
    fn flipped<T>(&self, f: impl FnOnce() -> T) -> T {
        self.judging(self.worse.get().map(Worse::flipped), f)
    }

    fn note(&self, note: String) {
        let mut notes = self.notes.borrow_mut();
        if !notes.contains(&note) {
            notes.push(note);
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
    /// A side reads a rolling baseline: it is judged against the past run closest to it
    /// (`BaselineStore::nearest`), which already weighs how far runs move.
    pub rolling: bool,
}

impl Side {
    /// How far this run's estimates are on the passing side of the comparison, in the units
    /// of its values (negative: failing); `None` for `==`/`!=` and non-finite estimates.
    pub fn margin(&self) -> Option<f64> {
        let (l, r) = (self.lhs.estimate, self.rhs.estimate);
        let m = match self.op {
            CmpOp::Lt | CmpOp::Le => r - l,
            CmpOp::Gt | CmpOp::Ge => l - r,
            CmpOp::Eq | CmpOp::Ne => return None,
        };
        m.is_finite().then_some(m)
    }
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
            // `a <= b` fails when `a` rises or `b` falls: a baseline in `b` is held against the
            // past runs no higher than this one, a baseline in `a` against those no lower.
            let (worse_a, worse_b) = match op {
                CmpOp::Lt | CmpOp::Le => (Some(Worse::Lower), Some(Worse::Higher)),
                CmpOp::Gt | CmpOp::Ge => (Some(Worse::Higher), Some(Worse::Lower)),
                CmpOp::Eq | CmpOp::Ne => (None, None),
            };
            let lhs = ctx.judging(worse_a, || value(ctx, a))?;
            let rhs = ctx.judging(worse_b, || value(ctx, b))?;
            let mut verdict = compare(*op, lhs, rhs);
            if verdict == Truth::False && !ctx.judging(worse_a, || knows_its_runs(ctx, a))? {
                verdict = Truth::Unknown;
            }
            if verdict == Truth::False && !ctx.judging(worse_b, || knows_its_runs(ctx, b))? {
                verdict = Truth::Unknown;
            }
            sides.push(Side {
                op: *op,
                lhs,
                rhs,
                verdict,
                rolling: reads_rolling_baseline(a) || reads_rolling_baseline(b),
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

/// Whether every rolling baseline term inside `v` knows enough past runs for a run to fail
/// against it: with fewer than [`MIN_BASELINE_RUNS`] the deployment's modes may not have shown
/// yet, and a comparison with the term cannot fail (docs/SLO.md, "Run-to-run variation").
/// Pinned baselines and plain values always can.
fn knows_its_runs(ctx: &Ctx<'_>, v: &Value) -> Result<bool, Insufficient> {
    match v {
        Value::Baseline(inner, BaselineRef::Span(span, off)) => {
            let key = baseline_key(ctx.slo, inner);
            let now = value(ctx, inner)?.estimate;
            let runs = ctx
                .cycle_baselines
                .nearest(
                    &key,
                    ctx.now_unix - off,
                    *span,
                    ctx.run_end_unix,
                    now,
                    ctx.worse.get(),
                )
                .map_or(0, |(_, runs)| runs);
            if runs < MIN_BASELINE_RUNS {
                ctx.note(format!(
                    "{v}: {runs} past runs, {MIN_BASELINE_RUNS} needed before a run can fail against it (the deployment's modes may not have shown yet)"
                ));
                return Ok(false);
            }
            Ok(true)
        }
        Value::Baseline(_, BaselineRef::Pinned(_))
        | Value::Number(_)
        | Value::Duration(_)
        | Value::Agg(..)
        | Value::Scalar(_)
        | Value::Goodput(..) => Ok(true),
        Value::Fit(_, inner, _) => ctx.judging(None, || knows_its_runs(ctx, inner)),
        Value::Neg(inner) => ctx.flipped(|| knows_its_runs(ctx, inner)),
        Value::Binary(op, a, b) => Ok(knows_its_runs(ctx, a)?
            && match op {
                BinOp::Sub | BinOp::Div => ctx.flipped(|| knows_its_runs(ctx, b))?,
                BinOp::Add | BinOp::Mul => knows_its_runs(ctx, b)?,
            }),
    }
}

/// Whether `v` reads a rolling `baseline(…, SPAN)` anywhere.
fn reads_rolling_baseline(v: &Value) -> bool {
    match v {
        Value::Baseline(_, BaselineRef::Span(..)) => true,
        Value::Baseline(_, BaselineRef::Pinned(_))
        | Value::Number(_)
        | Value::Duration(_)
        | Value::Agg(..)
        | Value::Scalar(_)
        | Value::Goodput(..) => false,
        Value::Fit(_, inner, _) | Value::Neg(inner) => reads_rolling_baseline(inner),
        Value::Binary(_, a, b) => reads_rolling_baseline(a) || reads_rolling_baseline(b),
    }
}

/// The interval of a value.
pub fn value(ctx: &Ctx<'_>, v: &Value) -> Result<Interval, Insufficient> {
    match v {
        Value::Number(n) | Value::Duration(n) => Ok(Interval::point(*n)),
        Value::Neg(a) => Ok(-ctx.flipped(|| value(ctx, a))?),
        Value::Binary(op, a, b) => {
            let a = value(ctx, a)?;
            let b = match op {
                BinOp::Sub | BinOp::Div => ctx.flipped(|| value(ctx, b))?,
                BinOp::Add | BinOp::Mul => value(ctx, b)?,
            };
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
            let t = ctx
                .store
                .totals(&sel.matchers, ctx.window, ctx.steps, ctx.now);
            if t.counts.requests < ctx.min_samples || t.steady_seconds <= 0.0 {
                return insufficient(format!(
                    "{v}: {} requests, {} needed",
                    t.counts.requests, ctx.min_samples
                ));
            }
            let good = t
                .timed_good
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
                // A fit's points have no worse side of their own.
                ys.push(ctx.judging(None, || value(ctx, &pin_label(inner, label, text)))?);
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
                BaselineRef::Span(span, off) => {
                    let now = value(ctx, inner)?.estimate;
                    let worse = ctx.worse.get();
                    ctx.cycle_baselines
                        .nearest(&key, ctx.now_unix - off, *span, ctx.run_end_unix, now, worse)
                        .map(|(run, _)| run.interval())
                        .ok_or_else(|| Insufficient {
                        reason: format!(
                            "{v}: no passing cycle before this run in the baseline's span ({past})"
                        ),
                    })
                }
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

/// Quantiles from here up are tails: a run of a step rarely holds the samples that bound them,
/// so their series keep earlier runs to pool (`Store::distribution`).
const TAIL_QUANTILE: f64 = 0.9;

/// The samples `agg` pools runs up to: a tail quantile's bounded size, else 0 (no pooling).
pub fn pool_need(agg: Agg) -> u64 {
    match agg {
        Agg::Quantile(pct) if pct / 100.0 >= TAIL_QUANTILE => {
            samples_to_bound(pct / 100.0).unwrap_or(0)
        }
        _ => 0,
    }
}

fn aggregate(ctx: &Ctx<'_>, agg: Agg, sel: &Selector) -> Result<Interval, Insufficient> {
    let snap = ctx.store.distribution(
        sel.measure,
        &sel.matchers,
        ctx.window,
        ctx.steps,
        ctx.now,
        // A pooled read stops at what the SLO needs: the quantile's bound, and `min_samples`
        // where that is more (else a read of 370 samples pools no further and sits under a
        // `min_samples: 400` for good).
        match pool_need(agg) {
            0 => 0,
            need => need.max(ctx.min_samples),
        },
    );
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
            if q.lower.is_none() || q.upper.is_none() {
                let need =
                    samples_to_bound(pct / 100.0).map_or("more".to_owned(), |n| format!("≥ {n}"));
                ctx.note(format!(
                    "{}: {need} samples bound its interval on both sides, {n} read (its window and the held runs it pools)",
                    Value::Agg(agg, sel.clone()),
                ));
            }
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
    let t = ctx
        .store
        .totals(&sel.matchers, ctx.window, ctx.steps, ctx.now);
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
    let rel = Z_95 / (t.timed.ok.max(1) as f64).sqrt();
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
            Ok(scaled(t.timed.output_tokens as f64 / t.steady_seconds))
        }
        Measure::Throughput if t.steady_seconds > 0.0 => {
            Ok(poisson_rate(t.timed.ok, t.steady_seconds))
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
