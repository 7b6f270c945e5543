//! `llm-canary rules`: every SLO as Prometheus rules, so Prometheus alerts on the same definitions
//! even when the daemon is down. Each side of a comparison becomes a recording rule
//! (`histogram_quantile` over the exported buckets, the same selectors and window), the verdict a
//! `llm_canary:slo_compliant` record and an alert; burn-rate SLOs become per-window error-ratio
//! records and the multi-window multi-burn-rate alert pair.

use std::fmt::Write as _;
use std::time::Duration;

use super::ast::*;
use super::{LabelDomain, SloDef, SloKind, fit_groups, pin_label};

/// The alert of a comparison SLO that does not hold.
pub const ALERT_FAILING: &str = "LlmCanarySloFailing";
/// The burn-rate alerts (severity `page` and `ticket`).
pub const ALERT_BURN: &str = "LlmCanarySloErrorBudgetBurn";
/// Recording rule of each comparison side (labels `slo`, `side`).
pub const RECORD_SIDE: &str = "llm_canary:slo_side";
/// Recording rule of a comparison SLO's verdict: 1 holds, 0 does not (label `slo`).
pub const RECORD_COMPLIANT: &str = "llm_canary:slo_compliant";
/// Prefix of the burn-rate error-ratio records; the window follows (`...:rate5m`).
pub const RECORD_ERROR_RATIO: &str = "llm_canary:slo_error_ratio:rate";

/// Where runbooks point when an SLO names none.
const DEFAULT_RUNBOOK: &str =
    "https://github.com/llm-canary/llm-canary/blob/main/docs/SLO.md#when-an-slo-fails";

/// The label set of the per-request series, for `on(...)` matching of step gauges.
const STEP_LABELS: &str =
    "target, serving_mode, workload, concurrency, turn, distribution, isl_bucket, prefix_ratio";

/// The multi-window multi-burn-rate table for a 30-day period (Google SRE workbook): long
/// window, short window, burn factor, severity.
const BURN_WINDOWS: [(u64, u64, f64, &str); 4] = [
    (3_600, 300, 14.4, "page"),
    (21_600, 1_800, 6.0, "page"),
    (86_400, 7_200, 3.0, "ticket"),
    (259_200, 21_600, 1.0, "ticket"),
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

/// A measurement Prometheus has no series for (server-side timings): such an SLO is evaluated
/// by the daemon only.
#[derive(Debug, Clone, PartialEq)]
struct DaemonOnly(Measure);

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
        m.histogram_family().ok_or(DaemonOnly(m))
    }

    /// A step gauge averaged over the window, leaving out steps flagged degraded.
    fn step_gauge(&self, metric: &str, sel: &Selector) -> String {
        let m = self.matchers(&sel.matchers, &[]);
        let offset = self
            .offset
            .map(|o| format!(" offset {}", prom_duration(o)))
            .unwrap_or_default();
        format!(
            "avg(avg_over_time({metric}{m}{}) unless on({STEP_LABELS}) (llm_canary_step_degraded{m}{offset} == 1))",
            self.range()
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
                    other => return Err(DaemonOnly(other)),
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
            Value::Baseline(inner, span) => {
                let past = Pq {
                    domain: self.domain,
                    range: Duration::from_secs_f64(*span),
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
            Value::Baseline(inner, span) => {
                let past = Pq {
                    domain: self.domain,
                    range: Duration::from_secs_f64(*span),
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

fn severity(def: &SloDef) -> String {
    format!("{:?}", def.severity).to_lowercase()
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

fn expr_group(def: &SloDef, cond: &Cond, domain: &LabelDomain) -> Result<Group, DaemonOnly> {
    let pq = Pq {
        domain,
        range: def.window,
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
    rules.push(Rule::Record {
        name: RECORD_COMPLIANT.into(),
        expr: compliance(&def.name, cond, cmps.len(), &mut 0),
        labels: vec![("slo".into(), def.name.clone())],
    });
    let text = cond.to_string();
    rules.push(Rule::Alert {
        name: ALERT_FAILING.into(),
        expr: format!("{RECORD_COMPLIANT}{{slo={}}} == 0", prom_string(&def.name)),
        for_: def.for_,
        labels: vec![
            ("severity".into(), severity(def)),
            ("slo".into(), def.name.clone()),
        ],
        annotations: vec![
            (
                "summary".into(),
                plain(&format!(
                    "SLO {} fails: {}",
                    def.name,
                    def.description.as_deref().unwrap_or(&text)
                )),
            ),
            (
                "description".into(),
                plain(&format!(
                    "`{text}` does not hold over the last {} (each side needs {} samples). \
                     Sides: {RECORD_SIDE}{{slo=\"{}\"}}; the daemon's verdict with confidence \
                     intervals: llm_canary_slo_state{{slo=\"{}\"}}.",
                    prom_duration(def.window),
                    def.min_samples,
                    def.name,
                    def.name
                )),
            ),
            (
                "runbook_url".into(),
                def.runbook_url
                    .clone()
                    .unwrap_or_else(|| DEFAULT_RUNBOOK.into()),
            ),
        ],
    });
    Ok(Group {
        name: format!("llm-canary-slo-{}", def.name),
        rules,
    })
}

fn burn_group(
    def: &SloDef,
    selector: &Selector,
    threshold: f64,
    objective: f64,
    period: Duration,
    domain: &LabelDomain,
) -> Group {
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
    for severity in ["page", "ticket"] {
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
            labels: vec![
                ("severity".into(), severity.into()),
                ("slo".into(), def.name.clone()),
            ],
            annotations: vec![
                (
                    "summary".into(),
                    plain(&format!(
                        "SLO {} burns its error budget too fast ({severity})",
                        def.name
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
                    def.runbook_url
                        .clone()
                        .unwrap_or_else(|| DEFAULT_RUNBOOK.into()),
                ),
            ],
        });
    }
    Group {
        name: format!("llm-canary-slo-{}", def.name),
        rules,
    }
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
pub fn generate(defs: &[SloDef], domain: &LabelDomain, source: &str, format: Format) -> String {
    let mut groups = Vec::new();
    let mut daemon_only = Vec::new();
    for d in defs {
        match &d.kind {
            SloKind::Expr(c) => match expr_group(d, c, domain) {
                Ok(g) => groups.push(g),
                Err(DaemonOnly(m)) => daemon_only.push((d.name.clone(), m)),
            },
            SloKind::BurnRate {
                selector,
                threshold,
                objective,
                period,
            } => groups.push(burn_group(
                d, selector, *threshold, *objective, *period, domain,
            )),
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Generated by `llm-canary rules` from the SLOs of {source} — do not edit."
    );
    let _ = writeln!(
        out,
        "# Regenerate with `llm-canary rules --config {source}`; the daemon evaluates the same SLOs"
    );
    let _ = writeln!(
        out,
        "# with confidence intervals (llm_canary_slo_state); these rules alert when it is down."
    );
    for (name, m) in &daemon_only {
        let _ = writeln!(
            out,
            "# SLO `{name}` reads `{}`, a server-side timing with no Prometheus series: the daemon",
            m.name()
        );
        let _ = writeln!(
            out,
            "#   evaluates it, and LlmCanarySloStateFail (rules/canary-health.yaml) alerts on its verdict."
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
