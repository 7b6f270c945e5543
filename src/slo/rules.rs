//! `llm-canary rules`: the alerts of every SLO, and the SLOs as Prometheus rules.
//!
//! One alert per breach pages: `LlmCanarySloFailing`, on the daemon's verdict
//! (`llm_canary_slo_state`, confidence intervals and `for` already applied), with the SLO's
//! severity and routing labels. Each side of a comparison is also recomputed in PromQL (a
//! recording rule of `histogram_quantile` over the exported buckets, the same selectors, over the
//! SLO's window or the cycle, whichever is longer, so every step it selects is always in range),
//! the verdict a `llm_canary:slo_compliant` record, and `LlmCanarySloFailingPromQL` (severity
//! `info`) fires only where that disagrees with the daemon, or the daemon's verdict is gone.
//! `LlmCanarySloNoData` fires on an SLO stuck without data for two cycles. Burn-rate SLOs become
//! per-window error-ratio records and the multi-window multi-burn-rate alert pair.

use std::fmt::Write as _;
use std::time::Duration;

use super::ast::*;
use super::{LabelDomain, SloDef, SloKind, fit_groups, pin_label};
use crate::config::Severity;
use crate::model::{REQUEST_LABELS, STEP_LEVEL_LABELS};

/// The paging alert of an SLO whose daemon verdict is `fail`.
pub const ALERT_FAILING: &str = "LlmCanarySloFailing";
/// The PromQL recomputation of a comparison SLO fails while the daemon's verdict does not.
pub const ALERT_FAILING_PROMQL: &str = "LlmCanarySloFailingPromQL";
/// An SLO in `insufficient_data` for longer than two cycles.
pub const ALERT_NO_DATA: &str = "LlmCanarySloNoData";
/// A workload of the cycle sent no request for two cycles.
pub const ALERT_WORKLOAD_SILENT: &str = "LlmCanaryWorkloadSilent";
/// The burn-rate alerts (severity `page` and `ticket`).
pub const ALERT_BURN: &str = "LlmCanarySloErrorBudgetBurn";
/// Recording rule of each comparison side (labels `slo`, `side`).
pub const RECORD_SIDE: &str = "llm_canary:slo_side";
/// Recording rule of a comparison SLO's verdict: 1 holds, 0 does not (label `slo`).
pub const RECORD_COMPLIANT: &str = "llm_canary:slo_compliant";
/// Prefix of the burn-rate error-ratio records; the window follows (`...:rate5m`).
pub const RECORD_ERROR_RATIO: &str = "llm_canary:slo_error_ratio:rate";

/// Where runbooks live when `alerting.runbook_base_url` says nothing: the project's docs.
const DEFAULT_RUNBOOK_BASE: &str = "docs/";

/// What the generated alerts carry besides each SLO's own settings, and how long a cycle takes.
#[derive(Debug, Clone, Default)]
pub struct RulesOptions {
    /// `alerting.labels`: on every alert.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `alerting.runbook_base_url`.
    pub runbook_base_url: Option<String>,
    /// The longest a cycle takes (`Config::cycle_upper_bound`): the shortest PromQL range of a
    /// recomputed SLO, and half the time before an SLO without data alerts.
    pub cycle: Duration,
    /// `export.resolution`: which labels the histograms and counters the rules read are kept by.
    pub resolution: crate::config::Resolution,
}

impl RulesOptions {
    fn runbook(&self, def: Option<&SloDef>, anchor: &str) -> String {
        if let Some(url) = def.and_then(|d| d.runbook_url.clone()) {
            return url;
        }
        let base = self
            .runbook_base_url
            .as_deref()
            .unwrap_or(DEFAULT_RUNBOOK_BASE);
        let sep = if base.ends_with('/') { "" } else { "/" };
        format!("{base}{sep}SLO.md#{anchor}")
    }

    /// Severity, SLO, the routing labels (the SLO's over the config's) and, where every selector
    /// of the SLO names one, its `target` and `serving_mode`.
    fn labels(&self, def: &SloDef, severity: &str) -> Vec<(String, String)> {
        let mut out = vec![
            ("severity".to_owned(), severity.to_owned()),
            ("slo".to_owned(), def.name.clone()),
        ];
        for label in ["target", "serving_mode"] {
            if let Some(v) = pinned_label(def, label) {
                out.push((label.to_owned(), v));
            }
        }
        let mut routing = self.labels.clone();
        routing.extend(def.labels.clone());
        for (k, v) in routing {
            out.retain(|(name, _)| *name != k);
            out.push((k, v));
        }
        out
    }
}

/// The value of `label` when every selector of the SLO matches exactly that one value.
fn pinned_label(def: &SloDef, label: &str) -> Option<String> {
    let mut value: Option<&str> = None;
    for sel in def.selectors() {
        let mut eq = sel
            .matchers
            .iter()
            .filter(|m| m.label == label && m.op == MatchOp::Eq);
        let m = eq.next()?;
        if eq.next().is_some() || value.is_some_and(|v| v != m.value) {
            return None;
        }
        value = Some(&m.value);
    }
    value.map(str::to_owned)
}

/// The multi-window multi-burn-rate table for a 30-day period (Google SRE workbook): long
/// window, short window, burn factor, severity.
const BURN_WINDOWS: [(u64, u64, f64, Severity); 4] = [
    (3_600, 300, 14.4, Severity::Critical),
    (21_600, 1_800, 6.0, Severity::Critical),
    (86_400, 7_200, 3.0, Severity::Warning),
    (259_200, 21_600, 1.0, Severity::Warning),
];
const BURN_REFERENCE_PERIOD: f64 = 30.0 * 86_400.0;

/// How the generated text is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A plain Prometheus rule file (`groups:`).
    Rules,
    /// A `monitoring.coreos.com/v1` PrometheusRule (kube-prometheus-stack).
    PrometheusRule,
}

/// What Prometheus cannot evaluate: a measurement it has no series for (server-side timings), a
/// label the export does not keep that measurement by, or a pinned baseline (it lives in the
/// daemon's state). Such an SLO is the daemon's alone.
#[derive(Debug, Clone, PartialEq)]
enum DaemonOnly {
    Measure(Measure),
    Label(Measure, String),
    Pinned(String),
}

/// The labels the series that `measure` is read from in PromQL are kept by at `resolution`
/// (docs/METRICS.md, "Series budget"); `None`: every request label. At the standard resolution
/// the latency histograms and request counters are kept by step (the request duration by
/// workload); the step gauges keep every label.
fn exported_labels(
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
fn unexported(cond: &Cond, resolution: crate::config::Resolution) -> Option<DaemonOnly> {
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
    fn reason(&self) -> String {
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
        }
    }
}

/// The span of a rolling baseline; a pinned one has no PromQL form.
fn span(past: &BaselineRef) -> Result<f64, DaemonOnly> {
    match past {
        BaselineRef::Span(s) => Ok(*s),
        BaselineRef::Pinned(name) => Err(DaemonOnly::Pinned(name.clone())),
    }
}

enum Rule {
    Record {
        name: String,
        expr: String,
        labels: Vec<(String, String)>,
    },
    Alert {
        name: String,
        expr: String,
        for_: Duration,
        labels: Vec<(String, String)>,
        annotations: Vec<(String, String)>,
    },
}

struct Group {
    name: String,
    rules: Vec<Rule>,
}

/// PromQL text of one SLO's values over one range.
struct Pq<'a> {
    domain: &'a LabelDomain,
    range: Duration,
    offset: Option<Duration>,
}

/// A duration as Prometheus writes it (whole seconds at least).
fn prom_duration(d: Duration) -> String {
    let secs = d.as_secs_f64().round().max(1.0);
    format_duration(secs)
}

fn prom_string(s: &str) -> String {
    crate::promtext::quoted(s)
}

/// A bucket bound as the exposition writes `le` (prometheus-client prints bounds with `dtoa`,
/// which agrees with Rust's `{:?}` for the 100 µs..1e5 s thresholds the parser accepts).
pub fn le_label(bound: f64) -> String {
    format!("{bound:?}")
}

impl Pq<'_> {
    fn range(&self) -> String {
        match self.offset {
            Some(o) => format!(
                "[{}] offset {}",
                prom_duration(self.range),
                prom_duration(o)
            ),
            None => format!("[{}]", prom_duration(self.range)),
        }
    }

    fn matchers(&self, matchers: &[Matcher], extra: &[String]) -> String {
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

    fn series(&self, metric: &str, matchers: &[Matcher], extra: &[String]) -> String {
        format!("{metric}{}{}", self.matchers(matchers, extra), self.range())
    }

    fn family(m: Measure) -> Result<&'static str, DaemonOnly> {
        m.histogram_family().ok_or(DaemonOnly::Measure(m))
    }

    /// A step gauge averaged over the window, leaving out steps flagged degraded.
    fn step_gauge(&self, metric: &str, sel: &Selector) -> String {
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

    fn value(&self, v: &Value) -> Result<String, DaemonOnly> {
        Ok(match v {
            Value::Number(n) | Value::Duration(n) => format!("{n}"),
            Value::Neg(a) => format!("-({})", self.value(a)?),
            Value::Binary(op, a, b) => {
                format!("({}) {} ({})", self.value(a)?, op.as_str(), self.value(b)?)
            }
            Value::Agg(agg, sel) => {
                let f = Self::family(sel.measure)?;
                let m = &sel.matchers;
                match agg {
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
                }
            }
            Value::Scalar(sel) => {
                let m = &sel.matchers;
                match sel.measure {
                    Measure::ErrorRatio => format!(
                        "(sum(rate({})) or vector(0)) / sum(rate({}))",
                        self.series(
                            "llm_canary_requests_total",
                            m,
                            &["outcome!=\"ok\"".to_owned()]
                        ),
                        self.series("llm_canary_requests_total", m, &[])
                    ),
                    Measure::CacheHitRatio => format!(
                        "sum(rate({})) / sum(rate({}))",
                        self.series("llm_canary_cached_tokens_total", m, &[]),
                        self.series("llm_canary_prompt_tokens_total", m, &[])
                    ),
                    Measure::OutputTps => {
                        self.step_gauge("llm_canary_step_output_tokens_per_second", sel)
                    }
                    Measure::Throughput => {
                        self.step_gauge("llm_canary_step_requests_per_second", sel)
                    }
                    Measure::CostPerMtok => {
                        self.step_gauge("llm_canary_step_cost_per_million_tokens_usd", sel)
                    }
                    other => return Err(DaemonOnly::Measure(other)),
                }
            }
            Value::Goodput(sel, objectives) => {
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
                format!(
                    "{} * clamp_min(1 - {}, 0)",
                    self.step_gauge("llm_canary_step_requests_per_second", sel),
                    bad.join(" - ")
                )
            }
            Value::Fit(fit, inner, label) => {
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
                match fit {
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
                }
            }
            Value::Baseline(inner, past) => {
                let past = Pq {
                    domain: self.domain,
                    range: Duration::from_secs_f64(span(past)?),
                    offset: Some(self.range),
                };
                past.value(inner)?
            }
        })
    }

    /// `sum(increase(count)) >= n` for every sampled term, so a side with too few samples has no
    /// value (the daemon's `insufficient_data`) instead of a NaN that would compare false.
    fn guards(&self, v: &Value, min_samples: u64, out: &mut Vec<String>) -> Result<(), DaemonOnly> {
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
                    Vec::new()
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
                let past = Pq {
                    domain: self.domain,
                    range: Duration::from_secs_f64(span(past)?),
                    offset: Some(self.range),
                };
                past.guards(inner, min_samples, out)?;
            }
        }
        Ok(())
    }

    /// A side as a recordable expression: constants as `vector(x)`, data guarded.
    fn side(&self, v: &Value, min_samples: u64) -> Result<String, DaemonOnly> {
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

fn side_ref(slo: &str, side: &str) -> String {
    format!(
        "{RECORD_SIDE}{{slo={}, side={}}}",
        prom_string(slo),
        prom_string(side)
    )
}

fn side_names(count: usize, i: usize) -> (String, String) {
    if count == 1 {
        ("lhs".into(), "rhs".into())
    } else {
        (format!("lhs{}", i + 1), format!("rhs{}", i + 1))
    }
}

/// The bool PromQL of a condition over the side records: 1 holds, 0 does not.
fn compliance(slo: &str, c: &Cond, count: usize, next: &mut usize) -> String {
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

/// Annotation text with Prometheus template delimiters defused.
fn plain(text: &str) -> String {
    text.replace("{{", "{ {").replace("}}", "} }")
}

/// Alerts that need the cycle's length: a workload of the cycle that has sent nothing for two
/// cycles (the schedule is stuck, or the workload was dropped from the cycle).
fn cycle_group(opts: &RulesOptions) -> Group {
    let two = Duration::from_secs((opts.cycle * 2).as_secs().div_ceil(60).max(1) * 60);
    let mut labels = vec![("severity".to_owned(), Severity::Warning.as_str().to_owned())];
    labels.extend(opts.labels.clone());
    Group {
        name: "llm-canary-cycle".into(),
        rules: vec![Rule::Alert {
            name: ALERT_WORKLOAD_SILENT.into(),
            expr: format!(
                "sum by (target, serving_mode, workload) (increase(llm_canary_requests_total[{}])) == 0 unless on() (max(llm_canary_paused) == 1)",
                prom_duration(two)
            ),
            for_: Duration::from_secs(300),
            labels,
            annotations: vec![
                (
                    "summary".into(),
                    "llm-canary sent no {{ $labels.workload }} requests to {{ $labels.target }} for two cycles".into(),
                ),
                (
                    "description".into(),
                    format!(
                        "A workload of the cycle (up to {} long) has not run for {}: the schedule is stuck, the workload left the cycle, or the canary lost its targets.",
                        prom_duration(opts.cycle),
                        prom_duration(two)
                    ),
                ),
                ("runbook_url".into(), opts.runbook(None, "canary-health-alerts")),
            ],
        }],
    }
}

/// The PromQL range of a recomputed SLO: its window, or a whole cycle where that is longer, so
/// every step it selects is in range whatever the cycle's position (the daemon holds the latest
/// run of each step instead; docs/SLO.md, verdicts across the cycle).
fn promql_range(def: &SloDef, opts: &RulesOptions) -> Duration {
    let cycle = Duration::from_secs(opts.cycle.as_secs().div_ceil(60) * 60);
    def.window.max(cycle)
}

/// The alerts every SLO has: the paging one on the daemon's verdict, and the one on an SLO stuck
/// without data for two cycles.
fn verdict_alerts(def: &SloDef, opts: &RulesOptions, text: &str) -> Vec<Rule> {
    let slo = prom_string(&def.name);
    let what = def.description.as_deref().unwrap_or(text);
    let stuck = Duration::from_secs((opts.cycle * 2).as_secs().div_ceil(60).max(1) * 60);
    let with_own = |mut annotations: Vec<(String, String)>| {
        for (k, v) in &def.annotations {
            annotations.retain(|(name, _)| name != k);
            annotations.push((k.clone(), v.clone()));
        }
        annotations
    };
    vec![
        Rule::Alert {
            name: ALERT_FAILING.into(),
            expr: format!("llm_canary_slo_state{{slo={slo}, state=\"fail\"}} == 1"),
            for_: Duration::ZERO,
            labels: opts.labels(def, def.severity.as_str()),
            annotations: with_own(vec![
                (
                    "summary".into(),
                    plain(&format!("SLO {} fails: {what}", def.name)),
                ),
                (
                    "description".into(),
                    plain(&format!(
                        "The daemon's verdict on `{text}` is fail: its 95 % confidence interval \
                         is on the failing side, and has been for {} (`for`). Value, interval \
                         and threshold: llm_canary_slo_value{{slo=\"{}\"}} and /api/v1/status.",
                        prom_duration(def.for_),
                        def.name
                    )),
                ),
                (
                    "runbook_url".into(),
                    opts.runbook(Some(def), "when-an-slo-fails"),
                ),
            ]),
        },
        Rule::Alert {
            name: ALERT_NO_DATA.into(),
            // Held traffic holds the verdict too: no data during a pause is not news.
            expr: format!(
                "llm_canary_slo_state{{slo={slo}, state=\"insufficient_data\"}} == 1 unless on() (max(llm_canary_paused) == 1)"
            ),
            for_: stuck,
            labels: opts.labels(def, Severity::Warning.as_str()),
            annotations: with_own(vec![
                (
                    "summary".into(),
                    plain(&format!(
                        "SLO {} has had no verdict for two cycles ({})",
                        def.name,
                        prom_duration(stuck)
                    )),
                ),
                (
                    "description".into(),
                    plain(&format!(
                        "`{text}` stays insufficient_data: too few samples, a selector that \
                         matches nothing, no baseline, or a server that never sends the timing it \
                         reads. /api/v1/status names the reason; \
                         llm_canary_slo_data_age_seconds{{slo=\"{}\"}} how old its data is.",
                        def.name
                    )),
                ),
                (
                    "runbook_url".into(),
                    opts.runbook(Some(def), "an-slo-without-data"),
                ),
            ]),
        },
    ]
}

fn expr_group(
    def: &SloDef,
    cond: &Cond,
    domain: &LabelDomain,
    opts: &RulesOptions,
) -> Result<Vec<Rule>, DaemonOnly> {
    let range = promql_range(def, opts);
    let pq = Pq {
        domain,
        range,
        offset: None,
    };
    let mut cmps = Vec::new();
    cond.comparisons(&mut cmps);
    let mut rules = Vec::new();
    for (i, (_, a, b)) in cmps.iter().enumerate() {
        let (l, r) = side_names(cmps.len(), i);
        for (side, v) in [(l, a), (r, b)] {
            rules.push(Rule::Record {
                name: RECORD_SIDE.into(),
                expr: pq.side(v, def.min_samples)?,
                labels: vec![("slo".into(), def.name.clone()), ("side".into(), side)],
            });
        }
    }
    // Expressible in PromQL, but over labels the export may not keep.
    if let Some(why) = unexported(cond, opts.resolution) {
        return Err(why);
    }
    rules.push(Rule::Record {
        name: RECORD_COMPLIANT.into(),
        expr: compliance(&def.name, cond, cmps.len(), &mut 0),
        labels: vec![("slo".into(), def.name.clone())],
    });
    let text = cond.to_string();
    let slo = prom_string(&def.name);
    rules.push(Rule::Alert {
        name: ALERT_FAILING_PROMQL.into(),
        expr: format!(
            "{RECORD_COMPLIANT}{{slo={slo}}} == 0 unless on(slo) (llm_canary_slo_state{{slo={slo}, state=\"fail\"}} == 1)"
        ),
        for_: def.for_,
        labels: opts.labels(def, Severity::Info.as_str()),
        annotations: vec![
            (
                "summary".into(),
                plain(&format!(
                    "SLO {} fails in PromQL but not in the daemon's verdict",
                    def.name
                )),
            ),
            (
                "description".into(),
                plain(&format!(
                    "`{text}` does not hold over the last {} of the exported histograms (each \
                     side needs {} samples; sides: {RECORD_SIDE}{{slo=\"{}\"}}), while the \
                     daemon's verdict, with confidence intervals, is not fail or is missing. \
                     Informational: {ALERT_FAILING} is the alert that pages.",
                    prom_duration(range),
                    def.min_samples,
                    def.name
                )),
            ),
            (
                "runbook_url".into(),
                opts.runbook(Some(def), "which-alert-pages"),
            ),
        ],
    });
    Ok(rules)
}

fn burn_group(
    def: &SloDef,
    selector: &Selector,
    threshold: f64,
    objective: f64,
    period: Duration,
    domain: &LabelDomain,
    opts: &RulesOptions,
) -> Vec<Rule> {
    let scale = period.as_secs_f64() / BURN_REFERENCE_PERIOD;
    let scaled = |secs: u64| Duration::from_secs_f64((secs as f64 * scale).max(60.0));
    let family = selector
        .measure
        .histogram_family()
        .expect("the SLI parser accepts histogram measures only");
    let mut windows: Vec<Duration> = BURN_WINDOWS
        .iter()
        .flat_map(|(l, s, ..)| [scaled(*l), scaled(*s)])
        .collect();
    windows.sort();
    windows.dedup();
    let record = |w: Duration| format!("{RECORD_ERROR_RATIO}{}", prom_duration(w));
    let mut rules = Vec::new();
    for w in &windows {
        let pq = Pq {
            domain,
            range: *w,
            offset: None,
        };
        let m = &selector.matchers;
        let count = format!(
            "sum(rate({}))",
            pq.series(&format!("{family}_count"), m, &[])
        );
        let good = format!(
            "sum(rate({}))",
            pq.series(
                &format!("{family}_bucket"),
                m,
                &[format!("le=\"{}\"", le_label(threshold))]
            )
        );
        let errors = format!(
            "(sum(rate({})) or vector(0))",
            pq.series(
                "llm_canary_requests_total",
                m,
                &["outcome!=\"ok\"".to_owned()]
            )
        );
        rules.push(Rule::Record {
            name: record(*w),
            // Failed requests have no latency but are bad events all the same.
            expr: format!("({count} - {good} + {errors}) / ({count} + {errors})"),
            labels: vec![("slo".into(), def.name.clone())],
        });
    }
    // (100 − objective) / 100 is exact for objectives written with few decimals.
    let budget = (100.0 - objective) / 100.0;
    let sel = format!("{{slo={}}}", prom_string(&def.name));
    for severity in [Severity::Critical, Severity::Warning] {
        let clauses: Vec<String> = BURN_WINDOWS
            .iter()
            .filter(|(.., s)| *s == severity)
            .map(|(l, s, factor, _)| {
                format!(
                    "({}{sel} > ({factor} * {budget}) and {}{sel} > ({factor} * {budget}))",
                    record(scaled(*l)),
                    record(scaled(*s))
                )
            })
            .collect();
        rules.push(Rule::Alert {
            name: ALERT_BURN.into(),
            expr: clauses.join(" or "),
            for_: def.for_,
            labels: opts.labels(def, severity.as_str()),
            annotations: vec![
                (
                    "summary".into(),
                    plain(&format!(
                        "SLO {} burns its error budget too fast ({})",
                        def.name,
                        severity.as_str()
                    )),
                ),
                (
                    "description".into(),
                    plain(&format!(
                        "{}: {objective}% of requests must have {} <= {} over {}; the error \
                         ratio over the alert's windows exceeds the burn-rate limit.",
                        def.description.as_deref().unwrap_or(&def.name),
                        selector,
                        format_duration(threshold),
                        prom_duration(period)
                    )),
                ),
                (
                    "runbook_url".into(),
                    opts.runbook(Some(def), "burn-rate-alerts"),
                ),
            ],
        });
    }
    rules
}

fn yaml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn render_groups(groups: &[Group], indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    let _ = writeln!(out, "{pad}groups:");
    for g in groups {
        let _ = writeln!(out, "{pad}  - name: {}", yaml_str(&g.name));
        let _ = writeln!(out, "{pad}    rules:");
        for r in &g.rules {
            match r {
                Rule::Record { name, expr, labels } => {
                    let _ = writeln!(out, "{pad}      - record: {name}");
                    let _ = writeln!(out, "{pad}        expr: |-\n{pad}          {expr}");
                    let _ = writeln!(out, "{pad}        labels:");
                    for (k, v) in labels {
                        let _ = writeln!(out, "{pad}          {k}: {}", yaml_str(v));
                    }
                }
                Rule::Alert {
                    name,
                    expr,
                    for_,
                    labels,
                    annotations,
                } => {
                    let _ = writeln!(out, "{pad}      - alert: {name}");
                    let _ = writeln!(out, "{pad}        expr: |-\n{pad}          {expr}");
                    if !for_.is_zero() {
                        let _ = writeln!(out, "{pad}        for: {}", prom_duration(*for_));
                    }
                    let _ = writeln!(out, "{pad}        labels:");
                    for (k, v) in labels {
                        let _ = writeln!(out, "{pad}          {k}: {}", yaml_str(v));
                    }
                    let _ = writeln!(out, "{pad}        annotations:");
                    for (k, v) in annotations {
                        let _ = writeln!(out, "{pad}          {k}: {}", yaml_str(v));
                    }
                }
            }
        }
    }
}

/// The rule file for `defs`. `source` names the config in the header (its file name, so the
/// output does not depend on the working directory).
pub fn generate(
    defs: &[SloDef],
    domain: &LabelDomain,
    opts: &RulesOptions,
    source: &str,
    format: Format,
) -> String {
    let mut groups = Vec::new();
    let mut daemon_only = Vec::new();
    for d in defs {
        let mut rules = Vec::new();
        let text = d.text();
        match &d.kind {
            SloKind::Expr(c) => match expr_group(d, c, domain, opts) {
                Ok(r) => rules = r,
                Err(why) => daemon_only.push((d.name.clone(), why)),
            },
            SloKind::BurnRate {
                selector,
                threshold,
                objective,
                period,
            } => {
                rules = burn_group(d, selector, *threshold, *objective, *period, domain, opts);
            }
        }
        rules.extend(verdict_alerts(d, opts, &text));
        groups.push(Group {
            name: format!("llm-canary-slo-{}", d.name),
            rules,
        });
    }
    if !opts.cycle.is_zero() {
        groups.push(cycle_group(opts));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Generated by `llm-canary rules` from the SLOs of {source} — do not edit."
    );
    let _ = writeln!(
        out,
        "# Regenerate with `llm-canary rules --config {source}`. {ALERT_FAILING} pages on the daemon's"
    );
    let _ = writeln!(
        out,
        "# verdict (confidence intervals, `for`); the PromQL recomputation of each SLO reads at least"
    );
    let _ = writeln!(
        out,
        "# a whole cycle (up to {}) and only informs. docs/SLO.md explains both.",
        prom_duration(opts.cycle)
    );
    for (name, why) in &daemon_only {
        let _ = writeln!(
            out,
            "# SLO `{name}` {}: only the daemon's verdict alerts.",
            why.reason()
        );
    }
    match format {
        Format::Rules => render_groups(&groups, 0, &mut out),
        Format::PrometheusRule => {
            let _ = writeln!(out, "apiVersion: monitoring.coreos.com/v1");
            let _ = writeln!(out, "kind: PrometheusRule");
            let _ = writeln!(out, "metadata:");
            let _ = writeln!(out, "  name: llm-canary-slos");
            let _ = writeln!(out, "  labels:");
            let _ = writeln!(out, "    app.kubernetes.io/name: llm-canary");
            let _ = writeln!(out, "    app.kubernetes.io/component: slo-rules");
            let _ = writeln!(out, "spec:");
            render_groups(&groups, 2, &mut out);
        }
    }
    if groups.is_empty() {
        // `groups: []` keeps the file valid when every SLO is daemon-only (or there are none).
        out = out.replace("groups:\n", "groups: []\n");
    }
    out
}
