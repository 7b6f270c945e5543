//! SLO expressions as PromQL: the recomputation of each comparison side over the exported
//! histograms, counters and step gauges (`Pq`), the bool compliance of a condition over the side
//! records, and what Prometheus cannot evaluate ([`DaemonOnly`]), which stays the daemon's alone.

use std::time::Duration;

use super::ast::*;
use super::{LabelDomain, fit_groups, pin_label};
use crate::request::{REQUEST_LABELS, STEP_LEVEL_LABELS};

/// Recording rule of each comparison side (labels `slo`, `side`): written by the rules
/// ([`super::rules`]), read by the compliance expression over both sides.
pub const RECORD_SIDE: &str = "llm_canary:slo_side";
/// The request series of failures: every outcome but `ok` and `cancelled` (a cancellation is
/// the canary's own choice, docs/METRICS.md).
pub const ERRORS: &str = "outcome!~\"ok|cancelled\"";
/// The request series the server answered or failed: every outcome but `cancelled`.
pub const ANSWERED: &str = "outcome!=\"cancelled\"";

/// What Prometheus cannot evaluate: a measurement it has no series for (server-side timings), a
/// label the export does not keep that measurement by, a pinned baseline (it lives in the
/// daemon's state), or a choice of steps by saturation (a step's flag, which the requests'
/// series do not carry). Such an SLO is the daemon's alone.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum DaemonOnly {
    Measure(Measure),
    Label(Measure, String),
    Pinned(String),
    Saturation(crate::config::SaturatedSteps),
}

/// The labels the series that `measure` is read from in PromQL are kept by at `resolution`
/// (docs/METRICS.md, "Series budget"); `None`: every request label. At the standard resolution
/// the latency histograms and request counters are kept by step (the request duration by
/// workload); the step gauges keep every label.
pub(super) fn exported_labels(
    measure: Measure,
    resolution: crate::config::Resolution,
) -> Option<&'static [&'static str]> {
    const STEP: &[&str] = &STEP_LEVEL_LABELS;
    const WORKLOAD: &[&str] = REQUEST_LABELS.split_at(3).0;
    match (resolution, measure) {
        (crate::config::Resolution::High, _) => None,
        (_, Measure::Latency) => Some(WORKLOAD),
        (
            _,
            Measure::Ttft
            | Measure::Itl
            | Measure::ErrorRatio
            | Measure::CacheHitRatio
            | Measure::Requests,
        ) => Some(STEP),
        _ => None,
    }
}

/// The first label an SLO's PromQL form would select by that the export does not keep.
pub(super) fn unexported(cond: &Cond, resolution: crate::config::Resolution) -> Option<DaemonOnly> {
    fn walk(v: &Value, resolution: crate::config::Resolution) -> Option<DaemonOnly> {
        let check = |measure: Measure, labels: &[&str]| {
            let kept = exported_labels(measure, resolution)?;
            labels
                .iter()
                .find(|l| !kept.contains(l))
                .map(|l| DaemonOnly::Label(measure, (*l).to_owned()))
        };
        fn names(sel: &Selector) -> Vec<&str> {
            sel.matchers.iter().map(|m| m.label.as_str()).collect()
        }
        match v {
            Value::Number(_) | Value::Duration(_) => None,
            Value::Neg(a) | Value::Baseline(a, _) => walk(a, resolution),
            Value::Binary(_, a, b) => walk(a, resolution).or_else(|| walk(b, resolution)),
            Value::Agg(_, sel) | Value::Scalar(sel) => check(sel.measure, &names(sel)),
            Value::Goodput(sel, objectives) => std::iter::once(sel.measure)
                .chain(objectives.iter().map(|o| o.measure))
                .find_map(|m| check(m, &names(sel))),
            Value::Fit(_, inner, label) => walk(inner, resolution).or_else(|| {
                let mut sels = Vec::new();
                inner.selectors(&mut sels);
                sels.iter()
                    .find_map(|s| check(s.measure, &[label.as_str()]))
            }),
        }
    }
    let mut cmps = Vec::new();
    cond.comparisons(&mut cmps);
    cmps.iter()
        .find_map(|(_, a, b)| walk(a, resolution).or_else(|| walk(b, resolution)))
}

impl DaemonOnly {
    pub(super) fn reason(&self) -> String {
        match self {
            DaemonOnly::Measure(m) => format!(
                "reads `{}`, a server-side timing with no Prometheus series",
                m.name()
            ),
            DaemonOnly::Label(m, label) => format!(
                "selects `{}` by `{label}`, which the standard export keeps only in the step gauges (`export.resolution: high` keeps it)",
                m.name()
            ),
            DaemonOnly::Pinned(name) => {
                format!("compares with the pinned baseline `{name}`, which only the daemon keeps")
            }
            DaemonOnly::Saturation(steps) => format!(
                "reads steps by saturation (`saturated_steps: {}`), which only the daemon's step records carry",
                steps.as_str()
            ),
        }
    }
}

/// The span and offset of a rolling baseline; a pinned one has no PromQL form.
pub(super) fn span(past: &BaselineRef) -> Result<(f64, f64), DaemonOnly> {
    match past {
        BaselineRef::Span(s, off) => Ok((*s, *off)),
        BaselineRef::Pinned(name) => Err(DaemonOnly::Pinned(name.clone())),
    }
}

/// PromQL text of one SLO's values over one range.
pub(super) struct Pq<'a> {
    pub(super) domain: &'a LabelDomain,
    pub(super) range: Duration,
    pub(super) offset: Option<Duration>,
}

/// A duration as Prometheus writes it (whole seconds at least).
pub(super) fn prom_duration(d: Duration) -> String {
    let secs = d.as_secs_f64().round().max(1.0);
    format_duration(secs)
}

pub(super) fn prom_string(s: &str) -> String {
    crate::promtext::quoted(s)
}

/// A bucket bound as the exposition writes `le` (prometheus-client prints bounds with `dtoa`,
/// which agrees with Rust's `{:?}` for the 100 µs..1e5 s thresholds the parser accepts).
pub(super) fn le_label(bound: f64) -> String {
    format!("{bound:?}")
}

impl Pq<'_> {
    pub(super) fn range(&self) -> String {
        match self.offset {
            Some(o) => format!(
                "[{}] offset {}",
                prom_duration(self.range),
                prom_duration(o)
            ),
            None => format!("[{}]", prom_duration(self.range)),
        }
    }

    pub(super) fn matchers(&self, matchers: &[Matcher], extra: &[String]) -> String {
        let mut parts: Vec<String> = Vec::new();
        for m in matchers {
            if m.op.is_numeric() {
                // PromQL cannot compare label values as numbers: list the configured values.
                let values = self
                    .domain
                    .matching(&m.label, |v| super::matcher_accepts(m, v));
                let alternatives: Vec<String> = values.iter().map(|v| regex::escape(v)).collect();
                parts.push(format!(
                    "{}=~{}",
                    m.label,
                    prom_string(&alternatives.join("|"))
                ));
            } else {
                parts.push(format!(
                    "{}{}{}",
                    m.label,
                    m.op.as_str(),
                    prom_string(&m.value)
                ));
            }
        }
        parts.extend(extra.iter().cloned());
        if parts.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", parts.join(", "))
        }
    }

    pub(super) fn series(&self, metric: &str, matchers: &[Matcher], extra: &[String]) -> String {
        format!("{metric}{}{}", self.matchers(matchers, extra), self.range())
    }

    pub(super) fn family(m: Measure) -> Result<&'static str, DaemonOnly> {
        m.histogram_family().ok_or(DaemonOnly::Measure(m))
    }

    /// A step gauge averaged over the window, leaving out steps flagged degraded.
    pub(super) fn step_gauge(&self, metric: &str, sel: &Selector) -> String {
        let m = self.matchers(&sel.matchers, &[]);
        let offset = self
            .offset
            .map(|o| format!(" offset {}", prom_duration(o)))
            .unwrap_or_default();
        format!(
            "avg(avg_over_time({metric}{m}{}) unless on({}) (llm_canary_step_degraded{m}{offset} == 1))",
            self.range(),
            // A sub-step's gauges (a turn, an ISL bucket) follow their step's flag.
            STEP_LEVEL_LABELS.join(", ")
        )
    }

    pub(super) fn value(&self, v: &Value) -> Result<String, DaemonOnly> {
        Ok(match v {
            Value::Number(n) | Value::Duration(n) => format!("{n}"),
            Value::Neg(a) => format!("-({})", self.value(a)?),
            Value::Binary(op, a, b) => {
                format!("({}) {} ({})", self.value(a)?, op.as_str(), self.value(b)?)
            }
            Value::Agg(agg, sel) => self.aggregation(agg, sel)?,
            Value::Scalar(sel) => self.scalar(sel)?,
            Value::Goodput(sel, objectives) => self.goodput(sel, objectives)?,
            Value::Fit(fit, inner, label) => self.fit(fit, inner, label)?,
            Value::Baseline(inner, past) => {
                let (span, off) = span(past)?;
                let past = Pq {
                    domain: self.domain,
                    range: Duration::from_secs_f64(span),
                    offset: Some(self.range + Duration::from_secs_f64(off)),
                };
                past.value(inner)?
            }
        })
    }

    /// A quantile, mean, count or rate of a latency histogram.
    fn aggregation(&self, agg: &Agg, sel: &Selector) -> Result<String, DaemonOnly> {
        let f = Self::family(sel.measure)?;
        let m = &sel.matchers;
        Ok(match agg {
            Agg::Quantile(pct) => format!(
                "histogram_quantile({}, sum by (le) (rate({})))",
                pct / 100.0,
                self.series(&format!("{f}_bucket"), m, &[])
            ),
            Agg::Mean => format!(
                "sum(rate({})) / sum(rate({}))",
                self.series(&format!("{f}_sum"), m, &[]),
                self.series(&format!("{f}_count"), m, &[])
            ),
            Agg::Count => format!(
                "sum(increase({}))",
                self.series(&format!("{f}_count"), m, &[])
            ),
            Agg::Rate => {
                format!("sum(rate({}))", self.series(&format!("{f}_count"), m, &[]))
            }
        })
    }

    /// A measure of one value per window: a ratio of counters or a step gauge.
    fn scalar(&self, sel: &Selector) -> Result<String, DaemonOnly> {
        let m = &sel.matchers;
        Ok(match sel.measure {
            Measure::ErrorRatio => format!(
                "(sum(rate({})) or vector(0)) / sum(rate({}))",
                self.series("llm_canary_requests_total", m, &[ERRORS.to_owned()]),
                self.series("llm_canary_requests_total", m, &[ANSWERED.to_owned()])
            ),
            Measure::CacheHitRatio => format!(
                "sum(rate({})) / sum(rate({}))",
                self.series("llm_canary_cached_tokens_total", m, &[]),
                self.series("llm_canary_prompt_tokens_total", m, &[])
            ),
            Measure::OutputTps => self.step_gauge("llm_canary_step_output_tokens_per_second", sel),
            Measure::Throughput => self.step_gauge("llm_canary_step_requests_per_second", sel),
            Measure::CostPerMtok => {
                self.step_gauge("llm_canary_step_cost_per_million_tokens_usd", sel)
            }
            other => return Err(DaemonOnly::Measure(other)),
        })
    }

    /// Goodput as throughput times a lower bound of the fraction of good requests.
    fn goodput(&self, sel: &Selector, objectives: &[Objective]) -> Result<String, DaemonOnly> {
        // Prometheus cannot join one request's TTFT with its ITL, so the fraction of
        // good requests is bounded from below (Fréchet): 1 − Σ (fraction missing
        // objective i); goodput = throughput × that fraction.
        let mut bad = Vec::new();
        for o in objectives {
            let f = Self::family(o.measure)?;
            let m = &sel.matchers;
            bad.push(format!(
                "(1 - sum(rate({})) / sum(rate({})))",
                self.series(
                    &format!("{f}_bucket"),
                    m,
                    &[format!("le=\"{}\"", le_label(o.seconds))]
                ),
                self.series(&format!("{f}_count"), m, &[])
            ));
        }
        Ok(format!(
            "{} * clamp_min(1 - {}, 0)",
            self.step_gauge("llm_canary_step_requests_per_second", sel),
            bad.join(" - ")
        ))
    }

    /// A least-squares slope or R² over the label's configured values, spelt out term by term.
    fn fit(&self, fit: &Fit, inner: &Value, label: &str) -> Result<String, DaemonOnly> {
        let groups = fit_groups(inner, label, self.domain);
        let xs: Vec<f64> = groups.iter().map(|g| g.1).collect();
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let sxx: f64 = xs.iter().map(|x| (x - mean).powi(2)).sum();
        let ys = groups
            .iter()
            .map(|(text, _)| {
                self.value(&pin_label(inner, label, text))
                    .map(|y| format!("({y})"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // slope = Σ cᵢ·yᵢ with cᵢ = (xᵢ − x̄)/Sxx; R² = slope²·Sxx / Syy.
        let slope = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| format!("{} * {y}", (x - mean) / sxx))
            .collect::<Vec<_>>()
            .join(" + ");
        Ok(match fit {
            Fit::Slope => format!("({slope})"),
            Fit::R2 => {
                let sum_sq = ys
                    .iter()
                    .map(|y| format!("{y} ^ 2"))
                    .collect::<Vec<_>>()
                    .join(" + ");
                let sum = ys.join(" + ");
                format!("(({slope}) ^ 2 * {sxx}) / ({sum_sq} - ({sum}) ^ 2 / {n})")
            }
        })
    }

    /// `sum(increase(count)) >= n` for every sampled term, so a side with too few samples has no
    /// value (the daemon's `insufficient_data`) instead of a NaN that would compare false.
    pub(super) fn guards(
        &self,
        v: &Value,
        min_samples: u64,
        out: &mut Vec<String>,
    ) -> Result<(), DaemonOnly> {
        match v {
            Value::Number(_) | Value::Duration(_) => {}
            Value::Neg(a) => self.guards(a, min_samples, out)?,
            Value::Binary(_, a, b) => {
                self.guards(a, min_samples, out)?;
                self.guards(b, min_samples, out)?;
            }
            Value::Agg(Agg::Count | Agg::Rate, _) => {}
            Value::Agg(_, sel) => {
                let f = Self::family(sel.measure)?;
                out.push(format!(
                    "sum(increase({})) >= {min_samples}",
                    self.series(&format!("{f}_count"), &sel.matchers, &[])
                ));
            }
            Value::Scalar(sel) | Value::Goodput(sel, _) => {
                let extra: Vec<String> = if sel.measure == Measure::ErrorRatio {
                    vec![ANSWERED.to_owned()]
                } else {
                    vec!["outcome=\"ok\"".to_owned()]
                };
                out.push(format!(
                    "sum(increase({})) >= {min_samples}",
                    self.series("llm_canary_requests_total", &sel.matchers, &extra)
                ));
            }
            Value::Fit(_, inner, label) => {
                for (text, _) in fit_groups(inner, label, self.domain) {
                    self.guards(&pin_label(inner, label, &text), min_samples, out)?;
                }
            }
            Value::Baseline(inner, past) => {
                let (span, off) = span(past)?;
                let past = Pq {
                    domain: self.domain,
                    range: Duration::from_secs_f64(span),
                    offset: Some(self.range + Duration::from_secs_f64(off)),
                };
                past.guards(inner, min_samples, out)?;
            }
        }
        Ok(())
    }

    /// A side as a recordable expression: constants as `vector(x)`, data guarded.
    pub(super) fn side(&self, v: &Value, min_samples: u64) -> Result<String, DaemonOnly> {
        if !v.reads_data() {
            return Ok(format!("vector({})", self.value(v)?));
        }
        let mut guards = Vec::new();
        self.guards(v, min_samples, &mut guards)?;
        guards.dedup();
        let mut expr = self.value(v)?;
        for g in guards {
            expr = format!("({expr}) and on() ({g})");
        }
        Ok(expr)
    }
}

pub(super) fn side_ref(slo: &str, side: &str) -> String {
    format!(
        "{RECORD_SIDE}{{slo={}, side={}}}",
        prom_string(slo),
        prom_string(side)
    )
}

pub(super) fn side_names(count: usize, i: usize) -> (String, String) {
    if count == 1 {
        ("lhs".into(), "rhs".into())
    } else {
        (format!("lhs{}", i + 1), format!("rhs{}", i + 1))
    }
}

/// The bool PromQL of a condition over the side records: 1 holds, 0 does not.
pub(super) fn compliance(slo: &str, c: &Cond, count: usize, next: &mut usize) -> String {
    match c {
        Cond::Cmp(op, ..) => {
            let (l, r) = side_names(count, *next);
            *next += 1;
            format!(
                "({} {} bool on(slo) {})",
                side_ref(slo, &l),
                op.as_str(),
                side_ref(slo, &r)
            )
        }
        Cond::And(a, b) => format!(
            "({} * on(slo) {})",
            compliance(slo, a, count, next),
            compliance(slo, b, count, next)
        ),
        Cond::Or(a, b) => format!(
            "clamp_max({} + on(slo) {}, 1)",
            compliance(slo, a, count, next),
            compliance(slo, b, count, next)
        ),
    }
}
