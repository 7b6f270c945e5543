//! What the SLO engine reads for its definitions (the windows and objectives their expressions
//! need, the baseline terms) and one SLO's reading from those windows: its raw verdict, the
//! value and threshold published as `llm_canary_slo_*`, and its comparisons as JSON.

use serde_json::{Value as Json, json};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::SaturatedSteps;

use super::ast::{BaselineRef, Cond, Objective, Value};
use super::eval::{self, Ctx, Interval, Side, Store, Truth, Want};
use super::verdict::{Held, Raw, RunGate, SloReading, SloState};
use super::{SloDef, SloKind};

/// The reason of an SLO whose evaluations have all been borderline so far.
const BORDERLINE: &str = "borderline: the sides' confidence intervals overlap (see `comparisons`), \
     so neither pass nor fail is clear yet; the state changes at the first clear verdict that \
     holds for `for`";

/// Why an SLO whose data suffices has no verdict yet: what held the evaluation back (an
/// unbounded quantile, a run inside its baseline's run-to-run range, a first failing run
/// waiting for the next), else overlapping intervals.
pub(super) fn undecided_reason(ctx: &Ctx<'_>, gate: &RunGate) -> String {
    let mut why: Vec<String> = ctx.notes.borrow().clone();
    if gate.waiting() {
        why.push(
            "this run fails clearly; a fail needs the next run to fail too (one slow run does not page)"
                .to_owned(),
        );
    }
    if let Some(h) = gate.held() {
        why.push(held_reason(&h));
    }
    if why.is_empty() {
        BORDERLINE.to_owned()
    } else {
        format!("no clear verdict yet: {}", why.join("; "))
    }
}

/// Why the gate held a change back: the runs are on the other side of the threshold by less
/// than the runs of the current state move.
pub(super) fn held_reason(h: &Held) -> String {
    let (n, bound, level) = (h.runs, h.bound, h.level);
    match h.to {
        SloState::Fail => format!(
            "the last two runs fail comparison {} by {:.6} on average, within what runs move here (its upper bound from the {n} earlier runs judged while not failing, {bound:.6}, is not below {level:.6})",
            h.comparison + 1,
            -h.margin,
        ),
        _ => format!(
            "this run passes comparison {} by {:.6}, within what runs move here (its lower bound from the {n} earlier runs judged while failing, {bound:.6}, is not above {level:.6})",
            h.comparison + 1,
            h.margin,
        ),
    }
}

/// When the data `d` reads was measured: the newest step of its stalest selector (how old its
/// data is), and the newest step of any, with its series (which run it judges, [`RunGate`]).
pub(super) fn data_times(store: &Store, d: &SloDef) -> (Option<Instant>, Option<(Instant, u64)>) {
    let mut stalest: Option<Option<Instant>> = None;
    let mut newest: Option<(Instant, u64)> = None;
    for sel in d.selectors() {
        let step = store.newest_step(&sel.matchers, d.saturated_steps);
        let at = step.map(|r| r.at);
        stalest = Some(match stalest {
            None => at,
            Some(s) => s.zip(at).map(|(a, b)| a.min(b)),
        });
        if let Some(r) = step
            && newest.is_none_or(|(n, _)| r.at > n)
        {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::hash::Hash::hash(&r.labels, &mut h);
            newest = Some((r.at, std::hash::Hasher::finish(&h)));
        }
    }
    (stalest.flatten(), newest)
}

/// What the stores of the SLO engine keep for a set of definitions.
pub(super) struct Reads {
    /// The distributions of the sliding store.
    pub(super) wants: Vec<Want>,
    /// The distributions of the cycle's store (inside `baseline(…)`).
    pub(super) cycle_wants: Vec<Want>,
    /// The goodput objective sets and burn-rate SLIs whose good requests are counted.
    pub(super) objective_sets: Vec<Vec<Objective>>,
    /// How long the sliding store keeps step totals: the longest window of any SLO. A burn-rate
    /// SLO reads step totals only, so no distribution names its window, and it must count here
    /// or its window is cut to the longest comparison window.
    pub(super) keep: Duration,
}

pub(super) fn wants_of(defs: &[SloDef]) -> Reads {
    let mut w = Wanted::default();
    for d in defs {
        match &d.kind {
            SloKind::Expr(c) => {
                let mut cmps = Vec::new();
                c.comparisons(&mut cmps);
                for (_, a, b) in cmps {
                    for v in [a, b] {
                        w.visit(v, d.window, d.saturated_steps, false);
                    }
                }
            }
            SloKind::BurnRate {
                selector,
                threshold,
                ..
            } => w.objective_sets.push(vec![Objective {
                measure: selector.measure,
                seconds: *threshold,
            }]),
        }
    }
    Reads {
        wants: w.wants,
        cycle_wants: w.cycle_wants,
        objective_sets: w.objective_sets,
        keep: defs.iter().map(|d| d.window).max().unwrap_or(DEFAULT_KEEP),
    }
}

/// How long step totals are kept when no SLO says (there is none to read them).
const DEFAULT_KEEP: Duration = Duration::from_secs(3600);

/// What the SLOs' expressions read: the distributions of the sliding store, those of the
/// cycle's store (inside `baseline(…)`), and the goodput objective sets.
#[derive(Default)]
struct Wanted {
    wants: Vec<Want>,
    cycle_wants: Vec<Want>,
    objective_sets: Vec<Vec<Objective>>,
}

impl Wanted {
    /// Gathers what `v` reads over `window` from the steps `steps` selects.
    fn visit(&mut self, v: &Value, window: Duration, steps: SaturatedSteps, in_baseline: bool) {
        match v {
            Value::Agg(agg, sel) => {
                let want = Want {
                    measure: sel.measure,
                    matchers: sel.matchers.clone(),
                    window,
                    steps,
                    pool: eval::pool_need(*agg),
                };
                let list = if in_baseline {
                    &mut self.cycle_wants
                } else {
                    &mut self.wants
                };
                if !list.contains(&want) {
                    list.push(want);
                }
            }
            Value::Goodput(_, objectives) => {
                if !self.objective_sets.contains(objectives) {
                    self.objective_sets.push(objectives.clone());
                }
            }
            Value::Baseline(inner, _) => self.visit(inner, window, steps, true),
            Value::Fit(_, inner, _) | Value::Neg(inner) => {
                self.visit(inner, window, steps, in_baseline)
            }
            Value::Binary(_, a, b) => {
                self.visit(a, window, steps, in_baseline);
                self.visit(b, window, steps, in_baseline);
            }
            Value::Number(_) | Value::Duration(_) | Value::Scalar(_) => {}
        }
    }
}

pub(super) fn baseline_terms(c: &Cond) -> Vec<(Value, BaselineRef)> {
    fn walk(v: &Value, out: &mut Vec<(Value, BaselineRef)>) {
        match v {
            Value::Baseline(inner, past) => out.push(((**inner).clone(), past.clone())),
            Value::Fit(_, inner, _) | Value::Neg(inner) => walk(inner, out),
            Value::Binary(_, a, b) => {
                walk(a, out);
                walk(b, out);
            }
            _ => {}
        }
    }
    let mut cmps = Vec::new();
    c.comparisons(&mut cmps);
    let mut out = Vec::new();
    for (_, a, b) in cmps {
        walk(a, &mut out);
        walk(b, &mut out);
    }
    out
}

pub(super) fn interval_json(i: &Interval) -> Json {
    let num = |v: f64| v.is_finite().then_some(v);
    json!({"estimate": num(i.estimate), "lower": num(i.lower), "upper": num(i.upper)})
}

pub(super) fn side_json(s: &Side) -> Json {
    json!({
        "op": s.op.as_str(),
        "lhs": interval_json(&s.lhs),
        "rhs": interval_json(&s.rhs),
        "verdict": match s.verdict { Truth::True => "holds", Truth::False => "violated", Truth::Unknown => "undecided" },
    })
}

pub(super) fn empty_reading(state: SloState) -> SloReading {
    SloReading {
        state,
        value: None,
        threshold: None,
        value_lower: None,
        value_upper: None,
    }
}

/// One SLO's raw verdict, its reading (state filled in by the caller), its comparisons and why
/// it has no verdict.
pub(super) fn evaluate_one(
    ctx: &Ctx<'_>,
    d: &SloDef,
) -> (Raw, SloReading, Vec<Side>, Option<String>) {
    let state = SloState::InsufficientData;
    match &d.kind {
        SloKind::Expr(c) => match eval::condition(ctx, c) {
            Ok((truth, sides)) => {
                let raw = match truth {
                    Truth::True => Raw::Pass,
                    Truth::False => Raw::Fail,
                    Truth::Unknown => Raw::Borderline,
                };
                let first = &sides[0];
                let reading = SloReading {
                    state,
                    value: Some(first.lhs.estimate).filter(|v| v.is_finite()),
                    threshold: Some(first.rhs.estimate).filter(|v| v.is_finite()),
                    value_lower: first.lhs.lower_bound(),
                    value_upper: first.lhs.upper_bound(),
                };
                (raw, reading, sides, None)
            }
            Err(e) => (
                Raw::Insufficient,
                empty_reading(state),
                Vec::new(),
                Some(e.reason),
            ),
        },
        SloKind::BurnRate {
            selector,
            threshold,
            objective,
            ..
        } => {
            let t = ctx
                .store
                .totals(&selector.matchers, ctx.window, ctx.steps, ctx.now);
            if t.counts.requests < ctx.min_samples || t.counts.requests == 0 {
                return (
                    Raw::Insufficient,
                    empty_reading(state),
                    Vec::new(),
                    Some(format!(
                        "{} requests in the window, {} needed",
                        t.counts.requests, ctx.min_samples
                    )),
                );
            }
            let key = eval::objectives_key(&[Objective {
                measure: selector.measure,
                seconds: *threshold,
            }]);
            let good = t.good.get(&key).copied().unwrap_or(0);
            let bad_ratio = eval::wilson(
                t.counts.requests - good.min(t.counts.requests),
                t.counts.requests,
            );
            // (100 − objective) / 100 is exact for objectives written with few decimals.
            let budget = (100.0 - objective) / 100.0;
            let side = Side {
                op: super::ast::CmpOp::Le,
                lhs: bad_ratio,
                rhs: Interval::point(budget),
                verdict: eval::compare(super::ast::CmpOp::Le, bad_ratio, Interval::point(budget)),
                rolling: false,
            };
            let raw = match side.verdict {
                Truth::True => Raw::Pass,
                Truth::False => Raw::Fail,
                Truth::Unknown => Raw::Borderline,
            };
            let reading = SloReading {
                state,
                value: Some(bad_ratio.estimate),
                threshold: Some(budget),
                value_lower: Some(bad_ratio.lower),
                value_upper: Some(bad_ratio.upper),
            };
            (raw, reading, vec![side], None)
        }
    }
}
