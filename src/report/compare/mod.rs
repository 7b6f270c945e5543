//! `llm-canary compare A/ B/`: two bench folders step by step (matched by target, workload and
//! step labels), each measure's value in A and in B, the change B/A with its 95 % interval from
//! the per-request samples ([`change`]) and the verdict it supports, as Markdown for a pull
//! request or as JSON; and the regressions past a ratio that `--fail-on-regression` gates on.

mod change;
mod read;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

pub use change::{Better, Change, MEASURES, Verdict, quantile_change};
pub use read::{CompareError, StepKey};

use super::table::{Cell, Column, Table};

/// Which run a side is, as the comparison names it.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub dir: String,
    pub version: String,
    pub config: String,
    pub steps: usize,
}

/// A step the other run does not have.
#[derive(Debug, Clone, Serialize)]
pub struct Unmatched {
    pub target: String,
    pub workload: String,
    pub labels: BTreeMap<String, String>,
}

/// One step of both runs, compared.
#[derive(Debug, Clone, Serialize)]
pub struct StepChange {
    /// `agg concurrency_sweep concurrency=4`.
    pub step: String,
    pub target: String,
    pub workload: String,
    pub labels: BTreeMap<String, String>,
    /// Steady-window requests behind the step in A and in B.
    pub requests: [usize; 2],
    pub changes: Vec<Change>,
}

/// Two runs compared.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub a: Side,
    pub b: Side,
    /// The level of every interval.
    pub confidence: f64,
    pub steps: Vec<StepChange>,
    pub only_in_a: Vec<Unmatched>,
    pub only_in_b: Vec<Unmatched>,
}

/// A change past `--fail-on-regression`.
pub struct Regression<'a> {
    pub step: &'a StepChange,
    pub change: &'a Change,
}

fn unmatched(key: &StepKey) -> Unmatched {
    Unmatched {
        target: key.target.clone(),
        workload: key.workload.clone(),
        labels: key.labels.clone(),
    }
}

/// Reads and compares the bench folders `a` and `b`. Unreadable folders, folders of another
/// release series and folders without a step in common are errors (exit 2).
pub fn compare_dirs(a: &Path, b: &Path) -> Result<Comparison, CompareError> {
    let (ra, rb) = (read::read_run(a)?, read::read_run(b)?);
    let side = |r: &read::Run| Side {
        dir: r.dir.display().to_string(),
        version: r.version.clone(),
        config: r.config.clone(),
        steps: r.steps.len(),
    };
    let mut steps = Vec::new();
    let mut only_in_a = Vec::new();
    for sa in &ra.steps {
        let Some(sb) = rb.steps.iter().find(|s| s.key == sa.key) else {
            only_in_a.push(unmatched(&sa.key));
            continue;
        };
        steps.push(StepChange {
            step: sa.key.to_string(),
            target: sa.key.target.clone(),
            workload: sa.key.workload.clone(),
            labels: sa.key.labels.clone(),
            requests: [sa.requests.len(), sb.requests.len()],
            changes: MEASURES
                .iter()
                .filter_map(|m| change::compare(m, sa, sb))
                .collect(),
        });
    }
    let only_in_b: Vec<Unmatched> = rb
        .steps
        .iter()
        .filter(|s| !ra.steps.iter().any(|o| o.key == s.key))
        .map(|s| unmatched(&s.key))
        .collect();
    if steps.is_empty() {
        let names = |r: &read::Run| {
            let mut v: Vec<String> = r.steps.iter().map(|s| s.key.to_string()).collect();
            v.dedup();
            match v.len() {
                0 => "no steps".to_owned(),
                1..=3 => v.join(", "),
                n => format!("{}, … ({n} steps)", v[..3].join(", ")),
            }
        };
        return Err(CompareError::NoCommonSteps {
            a: names(&ra),
            b: names(&rb),
        });
    }
    Ok(Comparison {
        a: side(&ra),
        b: side(&rb),
        confidence: 0.95,
        steps,
        only_in_a,
        only_in_b,
    })
}

/// How to read the intervals, under the summary.
const METHOD: &str = "\n_B/A is B's value over A's with its 95 % interval, from the steady-window requests: a seeded block bootstrap over ten slices of each run's window (requests in one batch or burst move together), for quantiles widened to the order-statistic interval (each run's at 97.5 %). A side the samples cannot bound is 0 or ∞. Better or worse only when the whole interval lies on one side of 1._\n";

/// A change as the Markdown prints it: `1.302 [1.271, 1.334]`, 0 and ∞ for unbounded sides.
fn render_change(c: &Change) -> String {
    match c.change {
        Some(v) => format!(
            "{v:.3} [{}, {}]",
            c.lower.map_or("0".to_owned(), |l| format!("{l:.3}")),
            c.upper.map_or("∞".to_owned(), |u| format!("{u:.3}"))
        ),
        // A's value is 0 and B's is not: no ratio to print.
        None if c.a == Some(0.0) && c.b.is_some_and(|b| b > 0.0) => "∞ (from 0)".to_owned(),
        None => "-".to_owned(),
    }
}

impl Comparison {
    /// How many changes have each verdict: `[worse, better, no detectable change]`.
    pub fn counts(&self) -> [usize; 3] {
        let mut n = [0; 3];
        for c in self.steps.iter().flat_map(|s| &s.changes) {
            n[match c.verdict {
                Verdict::Worse => 0,
                Verdict::Better => 1,
                Verdict::NoDetectableChange => 2,
            }] += 1;
        }
        n
    }

    /// Every change for the worse past `ratio` (`Change::regressed`).
    pub fn regressions(&self, ratio: f64) -> Vec<Regression<'_>> {
        self.steps
            .iter()
            .flat_map(|s| s.changes.iter().map(move |c| (s, c)))
            .filter(|(_, c)| c.regressed(ratio))
            .map(|(step, change)| Regression { step, change })
            .collect()
    }

    /// One table per step: each measure's value in A and in B, B/A with its interval, verdict.
    pub fn tables(&self) -> Vec<Table> {
        self.steps
            .iter()
            .map(|s| {
                let mut t = Table::new(
                    &s.step,
                    &format!(
                        "{} ({} → {} requests)",
                        s.step, s.requests[0], s.requests[1]
                    ),
                    vec![
                        Column::text("measure"),
                        Column::text("A"),
                        Column::text("B"),
                        Column::text("B/A [95 % interval]"),
                        Column::text("verdict"),
                    ],
                );
                for c in &s.changes {
                    let d = MEASURES
                        .iter()
                        .find(|m| m.id == c.measure)
                        .map_or(1, |m| m.decimals);
                    let value = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.d$}"));
                    let verdict = match c.verdict {
                        Verdict::NoDetectableChange => c.verdict.as_str().to_owned(),
                        v => format!("**{}**", v.as_str()),
                    };
                    t.push(vec![
                        Cell::text(format!("{} ({})", c.name, c.unit)),
                        Cell::text(value(c.a)),
                        Cell::text(value(c.b)),
                        Cell::text(render_change(c)),
                        Cell::text(verdict),
                    ]);
                }
                t
            })
            .collect()
    }

    /// The comparison as Markdown, for a pull-request comment.
    pub fn to_markdown(&self) -> String {
        let [worse, better, same] = self.counts();
        let steps = |n: usize| format!("{n} step{}", if n == 1 { "" } else { "s" });
        let mut out = format!(
            "## llm-canary compare\n\nA: `{}` (llm-canary {}, {}, {})  \nB: `{}` (llm-canary {}, {}, {})\n\n**{worse} worse, {better} better, {same} no detectable change** over {} in common.\n",
            self.a.dir,
            self.a.version,
            self.a.config,
            steps(self.a.steps),
            self.b.dir,
            self.b.version,
            self.b.config,
            steps(self.b.steps),
            steps(self.steps.len()),
        );
        let worse_lines: Vec<String> = self
            .steps
            .iter()
            .flat_map(|s| s.changes.iter().map(move |c| (s, c)))
            .filter(|(_, c)| c.verdict == Verdict::Worse)
            .map(|(s, c)| format!("- {}: {} {}", s.step, c.name, render_change(c)))
            .collect();
        if !worse_lines.is_empty() {
            out.push_str("\nWorse:\n\n");
            out.push_str(&worse_lines.join("\n"));
            out.push('\n');
        }
        out.push_str(METHOD);
        for t in self.tables() {
            out.push('\n');
            out.push_str(&t.to_markdown());
        }
        for (name, list) in [("A", &self.only_in_a), ("B", &self.only_in_b)] {
            if list.is_empty() {
                continue;
            }
            let steps: Vec<String> = list
                .iter()
                .map(|u| {
                    StepKey {
                        target: u.target.clone(),
                        workload: u.workload.clone(),
                        labels: u.labels.clone(),
                    }
                    .to_string()
                })
                .collect();
            out.push_str(&format!("\nOnly in {name}: {}\n", steps.join(", ")));
        }
        out
    }
}
