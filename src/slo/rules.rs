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
//! per-window error-ratio records and the multi-window multi-burn-rate alert pair. Every file
//! starts with the canary's own health alerts (`slo::health`) and ends with those that need the
//! cycle's length (a workload silent, an SLO's data stale), all with the routing labels.

use std::fmt::Write as _;
use std::time::Duration;

use super::ast::*;
use super::health::{HEALTH_ALERTS, HealthAlert};
use super::promql::{
    DaemonOnly, Pq, RECORD_SIDE, compliance, le_label, prom_duration, prom_string, side_names,
    unexported,
};
use super::{LabelDomain, SloDef, SloKind};
use crate::config::Severity;

/// The paging alert of an SLO whose daemon verdict is `fail`.
pub const ALERT_FAILING: &str = "LlmCanarySloFailing";
/// The PromQL recomputation of a comparison SLO fails while the daemon's verdict does not.
pub const ALERT_FAILING_PROMQL: &str = "LlmCanarySloFailingPromQL";
/// An SLO in `insufficient_data` for longer than two cycles.
pub const ALERT_NO_DATA: &str = "LlmCanarySloNoData";
/// A workload of the cycle sent no request for two cycles.
pub const ALERT_WORKLOAD_SILENT: &str = "LlmCanaryWorkloadSilent";
/// The newest data an SLO reads is older than two cycles.
pub const ALERT_DATA_STALE: &str = "LlmCanarySloDataStale";
/// The burn-rate alerts (severity `page` and `ticket`).
pub const ALERT_BURN: &str = "LlmCanarySloErrorBudgetBurn";
/// Recording rule of a comparison SLO's verdict: 1 holds, 0 does not (label `slo`).
pub const RECORD_COMPLIANT: &str = "llm_canary:slo_compliant";
/// Prefix of the burn-rate error-ratio records; the window follows (`...:rate5m`).
pub const RECORD_ERROR_RATIO: &str = "llm_canary:slo_error_ratio:rate";

/// Where runbooks live when `alerting.runbook_base_url` says nothing: the project's docs in its
/// repository (`repository` in Cargo.toml), absolute, as Alertmanager's receivers need a link
/// they can open.
pub const DEFAULT_RUNBOOK_BASE: &str = concat!(env!("CARGO_PKG_REPOSITORY"), "/blob/main/docs/");

/// The name of the group of health alerts.
const HEALTH_GROUP: &str = "llm-canary-health";

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

/// Annotation text with Prometheus template delimiters defused.
fn plain(text: &str) -> String {
    text.replace("{{", "{ {").replace("}}", "} }")
}

/// The severity label, then the routing labels (`alerting.labels`), of an alert that belongs to
/// no SLO.
fn canary_labels(opts: &RulesOptions, severity: Severity) -> Vec<(String, String)> {
    let mut labels = vec![("severity".to_owned(), severity.as_str().to_owned())];
    // `check` refuses `severity` there.
    labels.extend(opts.labels.clone());
    labels
}

/// The canary's own health alerts (`slo::health`), with the routing labels and the runbook.
fn health_group(opts: &RulesOptions) -> Group {
    let alert = |a: &HealthAlert| Rule::Alert {
        name: a.name.to_owned(),
        expr: a.expr.to_owned(),
        for_: a.for_,
        labels: canary_labels(opts, a.severity),
        annotations: vec![
            ("summary".into(), a.summary.to_owned()),
            ("description".into(), a.description.to_owned()),
            (
                "runbook_url".into(),
                opts.runbook(None, "canary-health-alerts"),
            ),
        ],
    };
    Group {
        name: HEALTH_GROUP.into(),
        rules: HEALTH_ALERTS.iter().map(alert).collect(),
    }
}

/// Alerts that need the cycle's length: a workload of the cycle that has sent nothing for two
/// cycles (the schedule is stuck, or the workload was dropped from the cycle), and an SLO whose
/// newest data is older than two cycles (the steps it reads stopped running).
fn cycle_group(opts: &RulesOptions) -> Group {
    let two = Duration::from_secs((opts.cycle * 2).as_secs().div_ceil(60).max(1) * 60);
    let labels = canary_labels(opts, Severity::Warning);
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
        }, stale_alert(opts, two)],
    }
}

/// An SLO whose newest data is older than `two` cycles: the steps it selects no longer run, so
/// its verdict (held, docs/SLO.md "verdicts across the cycle") describes the past. Data age
/// stands still while the traffic is held, and the alert is silent then.
fn stale_alert(opts: &RulesOptions, two: Duration) -> Rule {
    Rule::Alert {
        name: ALERT_DATA_STALE.into(),
        expr: format!(
            "max by (slo) (llm_canary_slo_data_age_seconds) > {} unless on() (max(llm_canary_paused) == 1)",
            two.as_secs()
        ),
        for_: Duration::from_secs(300),
        labels: canary_labels(opts, Severity::Warning),
        annotations: vec![
            (
                "summary".into(),
                "SLO {{ $labels.slo }} reads data older than two cycles".into(),
            ),
            (
                "description".into(),
                format!(
                    "The newest step SLO {{{{ $labels.slo }}}} reads ended {{{{ $value | humanizeDuration }}}} ago, more than two cycles (up to {} each): the steps it selects no longer run (skipped by the budget, cut by pauses or window ends, or gone from the cycle), so its verdict describes the past. /api/v1/status shows the SLO's data age and the budget's actions.",
                    prom_duration(opts.cycle)
                ),
            ),
            (
                "runbook_url".into(),
                opts.runbook(None, "an-slo-without-data"),
            ),
        ],
    }
}

/// The PromQL range of a recomputed SLO: its window, or a whole cycle where that is longer, so
/// every step it selects is in range whatever the cycle's position (the daemon holds the latest
/// run of each step instead; docs/SLO.md, verdicts across the cycle).
fn promql_range(def: &SloDef, opts: &RulesOptions) -> Duration {
    let cycle = Duration::from_secs(opts.cycle.as_secs().div_ceil(60) * 60);
    def.window.max(cycle)
}

/// The longest offset of the SLO's rolling baselines (`baseline(e, 24h offset 1d)`).
fn baseline_offset(def: &SloDef) -> Duration {
    let SloKind::Expr(c) = &def.kind else {
        return Duration::ZERO;
    };
    super::reading::baseline_terms(c)
        .iter()
        .filter_map(|(_, past)| match past {
            BaselineRef::Span(_, off) => Some(Duration::from_secs_f64(*off)),
            BaselineRef::Pinned(_) => None,
        })
        .max()
        .unwrap_or(Duration::ZERO)
}

/// The alerts every SLO has: the paging one on the daemon's verdict, and the one on an SLO stuck
/// without data for two cycles.
fn verdict_alerts(def: &SloDef, opts: &RulesOptions, text: &str) -> Vec<Rule> {
    let slo = prom_string(&def.name);
    let what = def.description.as_deref().unwrap_or(text);
    // A baseline that ends an offset ago has nothing to compare with for that long after a
    // start: the alert waits for it too.
    let offset = baseline_offset(def);
    let stuck = Duration::from_secs((opts.cycle * 2 + offset).as_secs().div_ceil(60).max(1) * 60);
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
                         is on the failing side{}. Value, interval and threshold: \
                         llm_canary_slo_value{{slo=\"{}\"}} and /api/v1/status.",
                        held_for(def.for_),
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
                        "SLO {} has had no verdict for two cycles{} ({})",
                        def.name,
                        if offset.is_zero() {
                            ""
                        } else {
                            " after its baseline's offset"
                        },
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

/// How long a failing verdict held before it was one, as the description says it.
fn held_for(for_: Duration) -> String {
    if for_.is_zero() {
        " (`for` is 0: the first evaluation that showed it decided)".to_owned()
    } else {
        format!(", and has been for {} (`for`)", prom_duration(for_))
    }
}

fn expr_group(
    def: &SloDef,
    cond: &Cond,
    domain: &LabelDomain,
    opts: &RulesOptions,
) -> Result<Vec<Rule>, DaemonOnly> {
    // Saturation is a property of a step, not a label of the request histograms and counters.
    if def.saturated_steps != crate::config::SaturatedSteps::Include {
        return Err(DaemonOnly::Saturation(def.saturated_steps));
    }
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
                &[super::promql::ERRORS.to_owned()]
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

/// The rule file for `defs`: the canary's health alerts, each SLO's group, and the alerts that
/// need the cycle's length. `source` names the config in the header (its file name, so the
/// output does not depend on the working directory).
pub fn generate(
    defs: &[SloDef],
    domain: &LabelDomain,
    opts: &RulesOptions,
    source: &str,
    format: Format,
) -> String {
    let mut groups = vec![health_group(opts)];
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
    let mut header = vec![
        format!("Generated by `llm-canary rules` from the SLOs of {source} — do not edit."),
        format!(
            "Regenerate with `llm-canary rules --config {source}`. {ALERT_FAILING} pages on the daemon's"
        ),
        "verdict (confidence intervals, `for`); the PromQL recomputation of each SLO reads at least".to_owned(),
        format!(
            "a whole cycle (up to {}) and only informs. docs/SLO.md explains both. The canary's own",
            prom_duration(opts.cycle)
        ),
        format!("health alerts come first ({HEALTH_GROUP}, as rules/canary-health.yaml has them)."),
    ];
    for (name, why) in &daemon_only {
        header.push(format!(
            "SLO `{name}` {}: only the daemon's verdict alerts.",
            why.reason()
        ));
    }
    render(&header, &groups, "llm-canary-slos", format)
}

/// The canary's health alerts alone, with `opts`' routing labels and runbook base:
/// `rules/canary-health.yaml` for a config without labels, for a Prometheus that loads no
/// generated rule file (every generated file holds the same group).
pub fn generate_health(opts: &RulesOptions, format: Format) -> String {
    let header = [
        "The canary's own health alerts, generated by `llm-canary rules --health` — do not edit.".to_owned(),
        "A canary that is down, idle or overloaded measures nothing trustworthy, so these come first.".to_owned(),
        "Every file `llm-canary rules` writes holds this group too, with the config's `alerting`".to_owned(),
        "labels: load this one only where no generated file is loaded. The alerts that need the".to_owned(),
        "config (each SLO's verdict, an SLO without data or with stale data, a workload silent for".to_owned(),
        "two cycles) are in the generated files (rules/slo-seed-plan.yaml); tests in rules/tests/.".to_owned(),
    ];
    render(&header, &[health_group(opts)], "llm-canary-health", format)
}

/// The file: `header` as comments, then the groups, plain or in a PrometheusRule named `name`.
fn render(header: &[String], groups: &[Group], name: &str, format: Format) -> String {
    let mut out = String::new();
    for line in header {
        let _ = writeln!(out, "# {line}");
    }
    match format {
        Format::Rules => render_groups(groups, 0, &mut out),
        Format::PrometheusRule => {
            let _ = writeln!(out, "apiVersion: monitoring.coreos.com/v1");
            let _ = writeln!(out, "kind: PrometheusRule");
            let _ = writeln!(out, "metadata:");
            let _ = writeln!(out, "  name: {name}");
            let _ = writeln!(out, "  labels:");
            let _ = writeln!(out, "    app.kubernetes.io/name: llm-canary");
            let _ = writeln!(out, "    app.kubernetes.io/component: slo-rules");
            let _ = writeln!(out, "spec:");
            render_groups(groups, 2, &mut out);
        }
    }
    out
}
