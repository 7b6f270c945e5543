//! The SLO engine (docs/DESIGN.md §7): the expression language ([`ast`], [`parse`]), statistical
//! evaluation over sliding HDR windows ([`eval`]), verdicts with `for` hysteresis ([`verdict`]),
//! baselines from the target's own past ([`baseline`]), the running engine that publishes
//! `llm_canary_slo_*` ([`engine`]) and the Prometheus rules generator ([`rules`]), which leads
//! every file with the canary's own health alerts ([`health`]).

pub mod ast;
pub mod baseline;
pub mod engine;
pub mod eval;
pub mod health;
mod lex;
pub mod parse;
mod promql;
mod reading;
pub mod rules;
pub mod state;
pub mod store;
pub mod verdict;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::{At, Config, Diagnostic, SaturatedSteps, Severity, SloConfig};
use crate::workload::sampler::log2_bucket;

pub use ast::{Agg, Cond, Measure, Selector, Value};
pub use engine::{SloEngine, SloPublisher, StateChangeHook};
pub use parse::{ParseError, parse_condition, parse_sli};
pub use verdict::{SloReading, SloState};

/// Errors of the SLO module.
#[derive(Debug, thiserror::Error)]
pub enum SloError {
    /// An SLO's expression or SLI does not parse or does not fit the config; `offset` is the
    /// 0-based character offset inside the expression text.
    #[error("SLO `{slo}`: {key} column {}: {message}", .offset + 1)]
    Expression {
        slo: String,
        key: &'static str,
        offset: usize,
        message: String,
    },
    #[error("SLO `{slo}`: {message}")]
    Definition { slo: String, message: String },
    #[error("baseline state file {path}: {message}")]
    State { path: String, message: String },
    /// The saved engine state could not be read where it is kept (`place`: a path, or
    /// `configmap NAMESPACE/NAME`).
    #[error("{place}: {source}")]
    StateUnreadable {
        place: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{place}: larger than {max} bytes")]
    StateTooLarge { place: String, max: usize },
    /// The saved engine state is not a state document.
    #[error(transparent)]
    StateJson(serde_json::Error),
    #[error("unknown state version {0}")]
    StateVersion(u32),
}

/// What an SLO asserts.
#[derive(Debug, Clone, PartialEq)]
pub enum SloKind {
    /// A comparison expression evaluated with confidence intervals.
    Expr(Cond),
    /// A burn-rate SLO: `objective` % of the requests selected by `selector` have a value at most
    /// `threshold` seconds, over `period`.
    BurnRate {
        selector: Selector,
        threshold: f64,
        objective: f64,
        period: Duration,
    },
}

/// One SLO, compiled from the config.
#[derive(Debug, Clone, PartialEq)]
pub struct SloDef {
    pub name: String,
    pub description: Option<String>,
    pub kind: SloKind,
    pub window: Duration,
    pub min_samples: u64,
    pub for_: Duration,
    pub severity: Severity,
    /// Which steps the SLO reads by saturation (`expr` SLOs; burn-rate SLOs read every step).
    pub saturated_steps: SaturatedSteps,
    pub runbook_url: Option<String>,
    /// Labels on the SLO's alerts (the config's `alerting.labels` are added when generating).
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Burn-rate SLOs without a `period` use the common 30 days.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(30 * 86_400);

impl SloDef {
    /// The SLO as one line of canonical text (the expression, or the SLI and objective).
    pub fn text(&self) -> String {
        match &self.kind {
            SloKind::Expr(c) => c.to_string(),
            SloKind::BurnRate {
                selector,
                threshold,
                objective,
                period,
            } => format!(
                "{objective}% of {selector} <= {} over {}",
                ast::format_duration(*threshold),
                ast::format_duration(period.as_secs_f64())
            ),
        }
    }

    /// The quantiles its expression reads, in percent (`p99` → 99), each once.
    pub fn quantiles(&self) -> Vec<f64> {
        fn walk(v: &Value, out: &mut Vec<f64>) {
            match v {
                Value::Agg(Agg::Quantile(pct), _) if !out.contains(pct) => out.push(*pct),
                Value::Fit(_, v, _) | Value::Baseline(v, _) | Value::Neg(v) => walk(v, out),
                Value::Binary(_, a, b) => {
                    walk(a, out);
                    walk(b, out);
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        if let SloKind::Expr(c) = &self.kind {
            let mut cmps = Vec::new();
            c.comparisons(&mut cmps);
            for (_, a, b) in cmps {
                walk(a, &mut out);
                walk(b, &mut out);
            }
        }
        out
    }

    /// Every selector the SLO reads (a burn-rate SLO's one, or each side's of every comparison).
    pub fn selectors(&self) -> Vec<&Selector> {
        let mut out = Vec::new();
        match &self.kind {
            SloKind::Expr(c) => {
                let mut cmps = Vec::new();
                c.comparisons(&mut cmps);
                for (_, a, b) in cmps {
                    a.selectors(&mut out);
                    b.selectors(&mut out);
                }
            }
            SloKind::BurnRate { selector, .. } => out.push(selector),
        }
        out
    }

    /// Latency thresholds (seconds) that should be exact histogram bucket bounds: SLI thresholds,
    /// goodput objectives, and durations compared with latencies.
    pub fn latency_thresholds(&self, out: &mut Vec<f64>) {
        match &self.kind {
            SloKind::BurnRate { threshold, .. } => out.push(*threshold),
            SloKind::Expr(c) => {
                let mut cmps = Vec::new();
                c.comparisons(&mut cmps);
                for (_, a, b) in cmps {
                    durations(a, out);
                    durations(b, out);
                }
            }
        }
    }
}

fn durations(v: &Value, out: &mut Vec<f64>) {
    match v {
        Value::Duration(d) => out.push(*d),
        Value::Goodput(_, objectives) => out.extend(objectives.iter().map(|o| o.seconds)),
        Value::Fit(_, inner, _) | Value::Baseline(inner, _) | Value::Neg(inner) => {
            durations(inner, out)
        }
        Value::Binary(_, a, b) => {
            durations(a, out);
            durations(b, out);
        }
        Value::Number(_) | Value::Scalar(_) | Value::Agg(..) => {}
    }
}

/// The configured values of every numeric step label, as their label text: the values a fit
/// ranges over and a numeric matcher is expanded to in PromQL.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelDomain {
    pub values: BTreeMap<&'static str, Vec<String>>,
}

impl LabelDomain {
    pub fn of(cfg: &Config) -> LabelDomain {
        let mut values: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        let w = &cfg.workloads;
        if let Some(s) = &w.concurrency_sweep {
            values.insert("concurrency", s.levels.iter().map(u32::to_string).collect());
        }
        // Multi-turn conversations and a dataset's both number their turns from 1.
        let turns = [
            w.multi_turn.as_ref().map(|m| *m.turns),
            w.dataset.as_ref().map(|d| *d.max_turns),
        ];
        if let Some(most) = turns.into_iter().flatten().max() {
            values.insert("turn", (1..=most).map(|t| t.to_string()).collect());
        }
        if let Some(d) = &w.sequence_distribution {
            let mut buckets = Vec::new();
            let mut b = log2_bucket(*d.isl.min as usize).max(1);
            while b <= *d.isl.max as usize {
                buckets.push(b.to_string());
                b *= 2;
            }
            values.insert("isl_bucket", buckets);
        }
        if let Some(p) = &w.prefix_cache {
            // The same text as `RequestLabels::with_prefix_ratio` writes.
            values.insert(
                "prefix_ratio",
                p.hit_ratios.iter().map(|r| r.to_string()).collect(),
            );
        }
        // Other workloads also run at a concurrency: keep those values matchable.
        for (label, extra) in [
            (
                "concurrency",
                w.sequence_distribution
                    .as_ref()
                    .map(|d| d.concurrency.to_string()),
            ),
            (
                "concurrency",
                w.prefix_cache.as_ref().map(|p| p.concurrency.to_string()),
            ),
            (
                "concurrency",
                w.dataset.as_ref().map(|d| d.concurrency.to_string()),
            ),
        ] {
            if let Some(v) = extra {
                let list = values.entry(label).or_default();
                if !list.contains(&v) {
                    list.push(v);
                }
            }
        }
        LabelDomain { values }
    }

    /// Configured values of `label` that satisfy `pred`.
    pub fn matching(&self, label: &str, pred: impl Fn(&str) -> bool) -> Vec<String> {
        self.values
            .get(label)
            .map(|vs| vs.iter().filter(|v| pred(v)).cloned().collect())
            .unwrap_or_default()
    }
}

/// Whether a label value satisfies a matcher (numeric matchers compare numbers; an empty or
/// non-numeric value never matches them).
pub fn matcher_accepts(m: &ast::Matcher, value: &str) -> bool {
    use ast::MatchOp::*;
    match m.op {
        Eq => value == m.value,
        Ne => value != m.value,
        Re | NotRe => {
            let hit = parse::anchored_regex(&m.value).is_ok_and(|r| r.is_match(value));
            hit == (m.op == Re)
        }
        Lt | Le | Gt | Ge => {
            let (Ok(v), Ok(bound)) = (value.trim().parse::<f64>(), m.value.trim().parse::<f64>())
            else {
                return false;
            };
            match m.op {
                Lt => v < bound,
                Le => v <= bound,
                Gt => v > bound,
                _ => v >= bound,
            }
        }
    }
}

/// Compiles one SLO of the config. `domain` checks fits and numeric matchers against the
/// configured step values.
pub fn compile(slo: &SloConfig, domain: &LabelDomain) -> Result<SloDef, SloError> {
    let name = slo.name.value.clone();
    let expression = |key: &'static str, e: ParseError| SloError::Expression {
        slo: name.clone(),
        key,
        offset: e.offset,
        message: e.message,
    };
    let kind = match (&slo.expr, &slo.sli, &slo.objective) {
        (Some(expr), None, None) => {
            let cond = parse_condition(expr).map_err(|e| expression("expr", e))?;
            check_domain(&cond, domain).map_err(|e| expression("expr", e))?;
            SloKind::Expr(cond)
        }
        (None, Some(sli), Some(objective)) => {
            let (selector, threshold) = parse_sli(sli).map_err(|e| expression("sli", e))?;
            SloKind::BurnRate {
                selector,
                threshold,
                objective: **objective,
                period: slo
                    .period
                    .as_ref()
                    .map(|p| p.value.0)
                    .unwrap_or(DEFAULT_PERIOD),
            }
        }
        _ => {
            return Err(SloError::Definition {
                slo: name,
                message: "needs either `expr` or both `sli` and `objective`".into(),
            });
        }
    };
    Ok(SloDef {
        name,
        description: slo.description.clone(),
        kind,
        window: slo.window.value.0,
        min_samples: *slo.min_samples,
        for_: slo.for_.value.0,
        severity: slo.severity,
        saturated_steps: *slo.saturated_steps,
        runbook_url: slo.runbook_url.clone(),
        labels: slo
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.value.clone()))
            .collect(),
        annotations: slo.annotations.clone(),
    })
}

/// Compiles every SLO of `cfg`.
pub fn compile_all(cfg: &Config) -> Result<Vec<SloDef>, SloError> {
    let domain = LabelDomain::of(cfg);
    cfg.slos.iter().map(|s| compile(s, &domain)).collect()
}

/// The problems of `cfg`'s SLO expressions and SLIs, each at its line and column in the file.
/// The rest of an SLO's definition (its shape, name, window) is the config's own validation;
/// an SLO whose shape is wrong is left to that.
pub fn diagnostics(cfg: &Config, domain: &LabelDomain) -> Vec<Diagnostic> {
    let nonempty = |v: &Option<At<String>>| v.as_ref().is_some_and(|t| !t.trim().is_empty());
    let mut out = Vec::new();
    for s in &cfg.slos {
        let shaped = (s.expr.is_some() && s.sli.is_none() && s.objective.is_none())
            || (s.expr.is_none() && s.sli.is_some() && s.objective.is_some());
        if !shaped || !(nonempty(&s.expr) || nonempty(&s.sli)) {
            continue;
        }
        if let Err(SloError::Expression {
            key,
            offset,
            message,
            ..
        }) = compile(s, domain)
        {
            let at = if key == "expr" { &s.expr } else { &s.sli };
            let at = at.as_ref().expect("the key that failed is present");
            out.push(
                Diagnostic::new(
                    at.position_of_char(offset),
                    format!("`{key}` column {}: {message}", offset + 1),
                )
                .hint("the SLO language is described in docs/SLO.md"),
            );
        }
    }
    out
}

/// Numeric matchers must select at least one configured value, and fits need three groups. A
/// problem is the whole expression's (offset 0).
fn check_domain(cond: &Cond, domain: &LabelDomain) -> Result<(), ParseError> {
    let mut cmps = Vec::new();
    cond.comparisons(&mut cmps);
    for (_, a, b) in cmps {
        for v in [a, b] {
            check_value(v, domain)?;
        }
    }
    Ok(())
}

fn check_value(v: &Value, domain: &LabelDomain) -> Result<(), ParseError> {
    let whole = |message: String| ParseError { offset: 0, message };
    let mut sels = Vec::new();
    v.selectors(&mut sels);
    for s in sels {
        for m in s.matchers.iter().filter(|m| m.op.is_numeric()) {
            if domain
                .matching(&m.label, |x| matcher_accepts(m, x))
                .is_empty()
            {
                return Err(whole(format!(
                    "no configured `{}` value satisfies `{}{}\"{}\"` (configured: {})",
                    m.label,
                    m.label,
                    m.op.as_str(),
                    m.value,
                    domain
                        .values
                        .get(m.label.as_str())
                        .map(|v| v.join(", "))
                        .unwrap_or_else(|| "none".into())
                )));
            }
        }
    }
    walk_fits(v, &mut |inner, label| {
        let groups = fit_groups(inner, label, domain);
        if groups.len() < 3 {
            Err(whole(format!(
                "a fit by `{label}` needs at least 3 configured values of `{label}` that its selectors accept; found {}",
                groups.len()
            )))
        } else {
            Ok(())
        }
    })
}

fn walk_fits(
    v: &Value,
    f: &mut dyn FnMut(&Value, &str) -> Result<(), ParseError>,
) -> Result<(), ParseError> {
    match v {
        Value::Fit(_, inner, label) => f(inner, label),
        Value::Baseline(inner, _) | Value::Neg(inner) => walk_fits(inner, f),
        Value::Binary(_, a, b) => {
            walk_fits(a, f)?;
            walk_fits(b, f)
        }
        _ => Ok(()),
    }
}

/// The groups of a fit: configured values of `label` that every matcher on `label` in the inner
/// selectors accepts, with their numeric value, in ascending order.
pub fn fit_groups(inner: &Value, label: &str, domain: &LabelDomain) -> Vec<(String, f64)> {
    let mut sels = Vec::new();
    inner.selectors(&mut sels);
    let mut groups: Vec<(String, f64)> = domain
        .matching(label, |x| {
            sels.iter()
                .flat_map(|s| s.matchers.iter())
                .filter(|m| m.label == label)
                .all(|m| matcher_accepts(m, x))
        })
        .into_iter()
        .filter_map(|v| v.parse::<f64>().ok().map(|x| (v, x)))
        .collect();
    groups.sort_by(|a, b| a.1.total_cmp(&b.1));
    groups.dedup_by(|a, b| a.0 == b.0);
    groups
}

/// Adds `label="value"` to every selector inside `v` (one group of a fit).
pub fn pin_label(v: &Value, label: &str, value: &str) -> Value {
    let pin = |s: &Selector| {
        let mut s = s.clone();
        s.matchers.push(ast::Matcher {
            label: label.to_owned(),
            op: ast::MatchOp::Eq,
            value: value.to_owned(),
        });
        s
    };
    match v {
        Value::Number(_) | Value::Duration(_) => v.clone(),
        Value::Scalar(s) => Value::Scalar(pin(s)),
        Value::Agg(a, s) => Value::Agg(*a, pin(s)),
        Value::Goodput(s, o) => Value::Goodput(pin(s), o.clone()),
        Value::Fit(f, inner, l) => {
            Value::Fit(*f, Box::new(pin_label(inner, label, value)), l.clone())
        }
        Value::Baseline(inner, r) => {
            Value::Baseline(Box::new(pin_label(inner, label, value)), r.clone())
        }
        Value::Neg(inner) => Value::Neg(Box::new(pin_label(inner, label, value))),
        Value::Binary(op, a, b) => Value::Binary(
            *op,
            Box::new(pin_label(a, label, value)),
            Box::new(pin_label(b, label, value)),
        ),
    }
}
