//! From step results to the benchmark plan's result tables (concurrency sweep, multi-turn,
//! sequence distribution, prefix cache, cost efficiency), the answers to its four questions with
//! the numbers behind them, and the recommendation table, each derived from the measurements;
//! the SLO verdicts close the report.

use serde::Serialize;

use super::table::{Cell, Column, Table};
use super::{BenchData, RunInfo, SloVerdict, TargetInfo};
use crate::measure::step::{Spread, StepMeasurements};
use crate::model::ServerStep;
use crate::model::StepResult;

/// Disaggregated serving is the more complex setup: it is recommended only when it beats
/// aggregated by at least this fraction (the document's "simple, least overhead" argument).
pub(super) const DISAGG_MARGIN: f64 = 0.10;

/// "High concurrency" in the benchmark plan's questions.
pub(super) const HIGH_CONCURRENCY: u32 = 32;

/// "Low concurrency" in the benchmark plan's recommendation table.
pub(super) const LOW_CONCURRENCY: u32 = 8;

/// R² from which the prefix-cache TTFT reduction counts as linear in the hit ratio.
pub(super) const LINEAR_R2: f64 = 0.9;

/// A least-squares line TTFT p50 = a + b·(1 − r) over a target's prefix-cache steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    pub target: String,
    pub serving_mode: String,
    /// TTFT at a 100 % hit ratio (ms).
    pub intercept_ms: f64,
    /// TTFT added by going from a 100 % to a 0 % hit ratio (ms).
    pub slope_ms: f64,
    pub r2: f64,
    pub points: usize,
}

impl Fit {
    /// Fits `(ratio, ttft_ms)` points; `None` with fewer than two distinct ratios.
    pub fn of(target: &TargetInfo, points: &[(f64, f64)]) -> Option<Fit> {
        let xs: Vec<f64> = points.iter().map(|(r, _)| 1.0 - r).collect();
        let ys: Vec<f64> = points.iter().map(|(_, y)| *y).collect();
        let line = crate::measure::stats::least_squares(&xs, &ys)?;
        Some(Fit {
            target: target.name.clone(),
            serving_mode: target.serving_mode.clone(),
            intercept_ms: line.intercept,
            slope_ms: line.slope,
            r2: line.r2,
            points: points.len(),
        })
    }

    /// The fitted TTFT at hit ratio `r` (ms).
    pub fn at(&self, r: f64) -> f64 {
        self.intercept_ms + self.slope_ms * (1.0 - r)
    }
}

/// The report: every table (the JSON `tables` are exactly what the other renderings print),
/// the prefix-cache fits, the SLO verdicts and the raw step results.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub run: RunInfo,
    pub tables: Vec<Table>,
    pub prefix_fits: Vec<Fit>,
    pub slo: Vec<SloVerdict>,
    pub steps: Vec<StepResult>,
}

impl Report {
    pub fn build(data: &BenchData) -> Report {
        let ix = Index::new(data);
        let prefix_fits: Vec<Fit> = ix
            .targets
            .iter()
            .filter_map(|t| Fit::of(t.info, &ix.prefix_points(t.info)))
            .collect();
        let mut tables = vec![
            ix.sweep_table(),
            ix.multi_turn_table(),
            ix.distribution_table(),
            ix.prefix_table(&prefix_fits),
            ix.breakdown_table(),
            ix.connections_table(),
            ix.cost_table(),
            ix.questions_table(&prefix_fits),
            ix.recommendations_table(),
        ];
        // Beside the tables of the steps they describe, before the cost and the answers.
        let extra = ix
            .trace_tables()
            .into_iter()
            .chain(ix.dataset_table())
            .chain(
                [
                    ix.rate_sweep_table(),
                    ix.reasoning_table(),
                    ix.arrivals_table(),
                    ix.cancellations_table(),
                ]
                .into_iter()
                .flatten(),
            );
        for (i, table) in extra.enumerate() {
            tables.insert(6 + i, table);
        }
        // Requests above a target's context are rare; their column shows only when there were.
        if !data
            .steps
            .iter()
            .any(|s| !s.measurements.skipped.is_empty())
        {
            for t in &mut tables {
                t.drop_column(SKIPPED);
            }
        }
        tables.push(slo_table(&data.slo));
        Report {
            run: data.run.clone(),
            tables,
            prefix_fits,
            slo: data.slo.clone(),
            steps: data.steps.clone(),
        }
    }

    pub fn table(&self, id: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.id == id)
    }

    /// Every table as aligned text, with a header naming the run.
    pub fn to_text(&self) -> String {
        let mut out = self.headline();
        out.push('\n');
        for t in &self.tables {
            out.push('\n');
            out.push_str(&t.to_text());
        }
        out
    }

    /// Every table as Markdown, ready to paste into the benchmark plan (docs/DESIGN.md §11).
    pub fn to_markdown(&self) -> String {
        let mut out = format!("## Bench results\n\n{}\n", self.headline());
        for t in &self.tables {
            out.push('\n');
            out.push_str(&t.to_markdown());
        }
        out
    }

    /// One line saying what ran: version, targets, time scale, steps, interruption.
    pub fn headline(&self) -> String {
        let r = &self.run;
        let targets: Vec<String> = r
            .targets
            .iter()
            .map(|t| format!("{} ({})", t.name, t.serving_mode))
            .collect();
        let mut s = format!(
            "llm-canary {} bench: {} against {}; time scale {}; {} of {} steps",
            r.version,
            r.config,
            targets.join(", "),
            r.time_scale,
            r.steps_finished,
            r.steps_planned
        );
        if !r.failed_targets.is_empty() {
            let names: Vec<&str> = r.failed_targets.iter().map(|f| f.name.as_str()).collect();
            s.push_str(&format!("; not measured: {}", names.join(", ")));
        }
        if r.interrupted {
            s.push_str(" (interrupted)");
        }
        s
    }
}

/// The SLO verdicts of the run: the report's last table, after the answers.
fn slo_table(verdicts: &[SloVerdict]) -> Table {
    let mut t = Table::new(
        "slo",
        "SLO verdicts",
        vec![
            Column::text("slo"),
            Column::text("state"),
            Column::num("value", "", 3),
            Column::num("threshold", "", 3),
            Column::text("reason"),
        ],
    );
    for v in verdicts {
        t.push(vec![
            Cell::text(&v.name),
            Cell::text(&v.state),
            Cell::num(v.value),
            Cell::num(v.threshold),
            Cell::text(v.reason.clone().unwrap_or_default()),
        ]);
    }
    if verdicts.is_empty() {
        t.notes.push("no SLOs in the config".into());
    }
    t
}

/// A target with the name its rows carry.
pub(crate) struct Side<'a> {
    pub info: &'a TargetInfo,
    /// The serving mode, or `mode/target` when several targets share a mode.
    pub label: String,
}

/// Lookups over a bench's step results.
pub(crate) struct Index<'a> {
    pub data: &'a BenchData,
    pub targets: Vec<Side<'a>>,
}

pub(super) fn ms(s: Option<Spread>, f: fn(&Spread) -> f64) -> Option<f64> {
    s.map(|s| f(&s) * 1e3)
}

/// The column of requests built but not sent (above the target's context length), shown only
/// when some step skipped one.
pub(super) const SKIPPED: &str = "skipped";

/// A step's requests not sent, every reason together.
pub(super) fn skipped(m: &StepMeasurements) -> Cell {
    Cell::Number(m.skipped.values().sum::<u64>() as f64)
}

pub(super) fn pct(v: Option<f64>) -> Option<f64> {
    v.map(|v| v * 100.0)
}

/// `(a − b) / a` in percent: how much lower `b` is than `a`.
pub(super) fn gain(a: f64, b: f64) -> Option<f64> {
    (a > 0.0).then(|| (a - b) / a * 100.0)
}

fn sort_numeric(values: &mut [String]) {
    values.sort_by(|a, b| {
        let (x, y) = (a.parse::<f64>(), b.parse::<f64>());
        match (x, y) {
            (Ok(x), Ok(y)) => x.total_cmp(&y),
            _ => a.cmp(b),
        }
    });
}

impl<'a> Index<'a> {
    pub fn new(data: &'a BenchData) -> Index<'a> {
        let targets = data
            .run
            .targets
            .iter()
            .map(|t| {
                let shared = data
                    .run
                    .targets
                    .iter()
                    .filter(|o| o.serving_mode == t.serving_mode)
                    .count()
                    > 1;
                Side {
                    info: t,
                    label: if shared {
                        format!("{}/{}", t.serving_mode, t.name)
                    } else {
                        t.serving_mode.clone()
                    },
                }
            })
            .collect();
        Index { data, targets }
    }

    /// The first aggregated and the first disaggregated target, the pair the questions compare.
    pub(super) fn pair(&self) -> Option<(&Side<'a>, &Side<'a>)> {
        let find = |m: &str| self.targets.iter().find(|t| t.info.serving_mode == m);
        Some((find("aggregated")?, find("disaggregated")?))
    }

    /// The result of `workload` for `target` with exactly these step labels.
    pub fn get(
        &self,
        workload: &str,
        target: &str,
        labels: &[(&str, &str)],
    ) -> Option<&'a StepMeasurements> {
        self.data
            .steps
            .iter()
            .find(|r| {
                r.labels.workload == workload
                    && r.labels.target == target
                    && r.labels.step_pairs().count() == labels.len()
                    && labels.iter().all(|(k, v)| r.labels.step(k) == Some(*v))
            })
            .map(|r| &r.measurements)
    }

    /// The distinct values of a step label in `workload`, numerically sorted where numbers.
    pub fn values(&self, workload: &str, key: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in self
            .data
            .steps
            .iter()
            .filter(|r| r.labels.workload == workload)
        {
            if let Some(v) = r.labels.step(key)
                && !out.iter().any(|o| o == v)
            {
                out.push(v.to_owned());
            }
        }
        if key != "distribution" {
            sort_numeric(&mut out);
        }
        out
    }

    /// What the server's own metrics said during step `step` (its name) for `target`.
    pub(super) fn server(&self, step: &str, target: &str) -> Option<&'a ServerStep> {
        self.data
            .steps
            .iter()
            .find(|r| r.step == step && r.labels.target == target && r.server.is_some())
            .and_then(|r| r.server.as_ref())
    }

    pub fn sweep(&self, target: &str, level: &str) -> Option<&'a StepMeasurements> {
        self.get("concurrency_sweep", target, &[("concurrency", level)])
    }

    /// The sweep levels as numbers.
    pub fn levels(&self) -> Vec<(u32, String)> {
        self.values("concurrency_sweep", "concurrency")
            .into_iter()
            .filter_map(|l| Some((l.parse().ok()?, l)))
            .collect()
    }

    /// A distribution's whole step for `target`: its total, or its only ISL bucket.
    pub fn distribution_total(&self, target: &str, dist: &str) -> Option<&'a StepMeasurements> {
        self.get("sequence_distribution", target, &[("distribution", dist)])
            .or_else(|| {
                let buckets: Vec<&StepResult> = self
                    .data
                    .steps
                    .iter()
                    .filter(|r| {
                        r.labels.workload == "sequence_distribution"
                            && r.labels.target == target
                            && r.labels.step("distribution") == Some(dist)
                    })
                    .collect();
                match buckets.as_slice() {
                    [only] => Some(&only.measurements),
                    _ => None,
                }
            })
    }

    /// `(hit ratio, TTFT p50 ms)` of `target`'s prefix-cache steps.
    pub fn prefix_points(&self, target: &TargetInfo) -> Vec<(f64, f64)> {
        self.values("prefix_cache", "prefix_ratio")
            .iter()
            .filter_map(|r| {
                let m = self.get("prefix_cache", &target.name, &[("prefix_ratio", r)])?;
                Some((r.parse().ok()?, ms(m.ttft, |s| s.p50)?))
            })
            .collect()
    }

    /// The sweep step with the highest output throughput: `(level, measurements)`.
    pub fn peak(&self, target: &str) -> Option<(u32, &'a StepMeasurements)> {
        self.levels()
            .into_iter()
            .filter_map(|(n, l)| Some((n, self.sweep(target, &l)?)))
            .filter(|(_, m)| m.output_tokens > 0)
            .max_by(|a, b| {
                a.1.output_tokens_per_second
                    .total_cmp(&b.1.output_tokens_per_second)
            })
    }

    pub(super) fn sweep_table(&self) -> Table {
        let mut t = Table::new(
            "concurrency_sweep",
            "Concurrency sweep",
            vec![
                Column::count("concurrency"),
                Column::text("mode"),
                Column::count("requests"),
                Column::count(SKIPPED),
                Column::count("errors"),
                Column::num("TTFT p50", "ms", 1),
                Column::num("TTFT p99", "ms", 1),
                Column::num("ITL p50", "ms", 2),
                Column::num("ITL p99", "ms", 2),
                Column::num("latency p50", "ms", 0),
                Column::num("throughput", "tok/s", 0),
                Column::num("goodput", "req/s", 2),
                Column::num("good throughput", "tok/s", 0),
            ],
        );
        for (n, level) in self.levels() {
            for side in &self.targets {
                let Some(m) = self.sweep(&side.info.name, &level) else {
                    continue;
                };
                t.push(vec![
                    Cell::Number(f64::from(n)),
                    Cell::text(&side.label),
                    Cell::Number(m.requests as f64),
                    skipped(m),
                    Cell::Number(m.errors as f64),
                    Cell::num(ms(m.ttft, |s| s.p50)),
                    Cell::num(ms(m.ttft, |s| s.p99)),
                    Cell::num(ms(m.itl, |s| s.p50)),
                    Cell::num(ms(m.itl, |s| s.p99)),
                    Cell::num(ms(m.latency, |s| s.p50)),
                    Cell::num(Some(m.output_tokens_per_second)),
                    Cell::num(Some(m.goodput)),
                    Cell::num(Some(m.good_output_tokens_per_second)),
                ]);
            }
        }
        t.notes.push(self.goodput_note());
        t
    }

    /// What "good" meant in this run, for the tables with goodput.
    fn goodput_note(&self) -> String {
        let g = &self.data.run.goodput;
        format!(
            "goodput: requests that succeeded with TTFT ≤ {} ms and ITL ≤ {} ms (`goodput:` in the config; a target may set its own), per second of the steady window; good throughput: their output tokens per second",
            g.ttft * 1e3,
            g.itl * 1e3
        )
    }

    pub(super) fn multi_turn_table(&self) -> Table {
        let mut t = Table::new(
            "multi_turn",
            "Multi-turn conversations",
            vec![
                Column::text("turn"),
                Column::text("mode"),
                Column::count("requests"),
                Column::count(SKIPPED),
                Column::num("TTFT p50", "ms", 1),
                Column::num("TTFT p99", "ms", 1),
                Column::num("cache hit", "%", 1),
                Column::num("conversation p50", "s", 2),
                Column::num("conversation p99", "s", 2),
            ],
        );
        for turn in self.values("multi_turn", "turn") {
            for side in &self.targets {
                let Some(m) = self.get("multi_turn", &side.info.name, &[("turn", &turn)]) else {
                    continue;
                };
                t.push(vec![
                    Cell::text(&turn),
                    Cell::text(&side.label),
                    Cell::Number(m.requests as f64),
                    skipped(m),
                    Cell::num(ms(m.ttft, |s| s.p50)),
                    Cell::num(ms(m.ttft, |s| s.p99)),
                    Cell::num(pct(m.cache_hit_ratio)),
                    Cell::Missing,
                    Cell::Missing,
                ]);
            }
        }
        for side in &self.targets {
            let Some(m) = self.get("multi_turn", &side.info.name, &[]) else {
                continue;
            };
            let secs = |f: fn(&Spread) -> f64| m.conversation.map(|c| f(&c));
            t.push(vec![
                Cell::text("all"),
                Cell::text(&side.label),
                Cell::Number(m.requests as f64),
                skipped(m),
                Cell::num(ms(m.ttft, |s| s.p50)),
                Cell::num(ms(m.ttft, |s| s.p99)),
                Cell::num(pct(m.cache_hit_ratio)),
                Cell::num(secs(|s| s.p50)),
                Cell::num(secs(|s| s.p99)),
            ]);
        }
        t.notes.push(
            "every turn resends the whole history; conversation = first send to last token of the last turn, complete conversations started in the steady window".into(),
        );
        t.notes.extend(self.cache_source_notes("multi_turn"));
        t
    }

    pub(super) fn distribution_table(&self) -> Table {
        let mut t = Table::new(
            "sequence_distribution",
            "Sequence distribution",
            vec![
                Column::text("distribution"),
                Column::text("ISL bucket"),
                Column::text("mode"),
                Column::count("requests"),
                Column::count(SKIPPED),
                // A bucket's timeouts and failures, which its latencies leave out.
                Column::count("errors"),
                Column::num("TTFT p50", "ms", 1),
                Column::num("TTFT p99", "ms", 1),
                Column::num("TTFT stddev", "ms", 1),
                Column::num("TTFT p99/p50", "x", 2),
                Column::num("throughput", "tok/s", 0),
            ],
        );
        let row = |dist: &str, bucket: String, side: &Side<'_>, m: &StepMeasurements| {
            vec![
                Cell::text(dist),
                Cell::text(bucket),
                Cell::text(&side.label),
                Cell::Number(m.requests as f64),
                skipped(m),
                Cell::Number(m.errors as f64),
                Cell::num(ms(m.ttft, |s| s.p50)),
                Cell::num(ms(m.ttft, |s| s.p99)),
                Cell::num(ms(m.ttft, |s| s.stddev)),
                Cell::num(m.ttft.and_then(|s| (s.p50 > 0.0).then(|| s.p99 / s.p50))),
                Cell::num(Some(m.output_tokens_per_second)),
            ]
        };
        let buckets = self.values("sequence_distribution", "isl_bucket");
        for dist in self.values("sequence_distribution", "distribution") {
            for b in &buckets {
                for side in &self.targets {
                    let labels = [("distribution", dist.as_str()), ("isl_bucket", b.as_str())];
                    if let Some(m) = self.get("sequence_distribution", &side.info.name, &labels) {
                        let lo: u64 = b.parse().unwrap_or(0);
                        let range = format!("{lo}-{}", (lo * 2).saturating_sub(1));
                        t.push(row(&dist, range, side, m));
                    }
                }
            }
            for side in &self.targets {
                if let Some(m) = self.distribution_total(&side.info.name, &dist) {
                    t.push(row(&dist, "all".into(), side, m));
                }
            }
        }
        t.notes.push(
            "ISL buckets are log2 ranges of the requested input length; a bucket's throughput is its share of the step's output tokens per second".into(),
        );
        t
    }

    pub(super) fn prefix_table(&self, fits: &[Fit]) -> Table {
        let mut t = Table::new(
            "prefix_cache",
            "Prefix cache",
            vec![
                Column::num("prefix hit ratio", "%", 0),
                Column::text("mode"),
                Column::count("requests"),
                Column::count(SKIPPED),
                Column::num("TTFT p50", "ms", 1),
                Column::num("TTFT p99", "ms", 1),
                Column::num("improvement vs 0 %", "%", 1),
                Column::num("observed hit", "%", 1),
                Column::num("expected hit", "%", 1),
                Column::num("server KV usage peak", "%", 1),
                Column::count("server KV blocks offloaded"),
                Column::num("server prefix hit", "%", 1),
            ],
        );
        let ratios = self.values("prefix_cache", "prefix_ratio");
        for r in &ratios {
            for side in &self.targets {
                let name = &side.info.name;
                let Some(m) = self.get("prefix_cache", name, &[("prefix_ratio", r)]) else {
                    continue;
                };
                let base = ratios
                    .iter()
                    .find(|x| x.parse::<f64>().is_ok_and(|v| v == 0.0))
                    .and_then(|z| self.get("prefix_cache", name, &[("prefix_ratio", z)]))
                    .and_then(|b| ms(b.ttft, |s| s.p50));
                let p50 = ms(m.ttft, |s| s.p50);
                let server = self.server(&format!("prefix_cache prefix_ratio={r}"), name);
                t.push(vec![
                    Cell::num(r.parse::<f64>().ok().map(|v| v * 100.0)),
                    Cell::text(&side.label),
                    Cell::Number(m.requests as f64),
                    skipped(m),
                    Cell::num(p50),
                    Cell::num(ms(m.ttft, |s| s.p99)),
                    Cell::num(base.zip(p50).and_then(|(b, v)| gain(b, v))),
                    Cell::num(pct(m.cache_hit_ratio)),
                    Cell::num(pct(m.expected_cache_hit_ratio)),
                    Cell::num(pct(server.and_then(|s| s.kv_cache_usage_max))),
                    Cell::num(server.and_then(|s| s.kv_offload_blocks)),
                    Cell::num(pct(server.and_then(|s| s.prefix_cache_hit_ratio))),
                ]);
            }
        }
        for f in fits {
            t.notes.push(format!(
                "fit {}: TTFT p50 = {:.1} ms + {:.1} ms × (1 − hit ratio), R² = {:.3} over {} ratios",
                f.serving_mode, f.intercept_ms, f.slope_ms, f.r2, f.points
            ));
        }
        t.notes.extend(self.cache_source_notes("prefix_cache"));
        t.notes.push("server columns come from the servers' own /metrics, scraped through the step where available: prefix hit from vLLM's prefix_cache_hits/queries or Dynamo's KV router (cached prefix tokens selected / input tokens routed); KV usage is the mean over workers".into());
        t.notes.push("KV blocks offloaded is the increase of Dynamo KVBM's kvbm_offload_blocks_d2h, the blocks copied from GPU to host memory: real KVBM copies every computed block, so it is not an eviction count (the simulator copies only on eviction); empty without KVBM, as vLLM has no such counter".into());
        t
    }

    pub(super) fn cost_table(&self) -> Table {
        let mut t = Table::new(
            "cost_efficiency",
            "Cost efficiency",
            vec![
                Column::text("mode"),
                Column::text("target"),
                Column::num("GPU cost", "$/h", 2),
                Column::num("peak throughput", "tok/s", 0),
                Column::count("at concurrency"),
                Column::num("per 1M output tokens", "$", 2),
                Column::num("per 1M good tokens", "$", 2),
            ],
        );
        for side in &self.targets {
            let peak = self.peak(&side.info.name);
            t.push(vec![
                Cell::text(&side.label),
                Cell::text(&side.info.name),
                Cell::num(side.info.cost_per_hour_usd),
                Cell::num(peak.map(|(_, m)| m.output_tokens_per_second)),
                Cell::num(peak.map(|(n, _)| f64::from(n))),
                Cell::num(peak.and_then(|(_, m)| m.cost_per_million_tokens_usd)),
                Cell::num(peak.and_then(|(_, m)| m.cost_per_million_good_tokens_usd)),
            ]);
        }
        t.notes.push("throughput is the concurrency-sweep step with the most output tokens per second; $ per 1M = $/h ÷ 3600 ÷ tok/s × 10⁶; GPU cost from `cost_per_hour_usd`; per 1M good tokens counts only the output of good requests (see the concurrency sweep's goodput)".into());
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(mode: &str) -> TargetInfo {
        TargetInfo {
            name: mode.into(),
            serving_mode: mode.into(),
            cost_per_hour_usd: None,
        }
    }

    #[test]
    fn a_linear_prefix_curve_fits_exactly() {
        // TTFT = 40 + 200·(1 − r).
        let pts: Vec<(f64, f64)> = [0.0, 0.25, 0.5, 0.75, 1.0]
            .iter()
            .map(|&r| (r, 40.0 + 200.0 * (1.0 - r)))
            .collect();
        let f = Fit::of(&target("aggregated"), &pts).unwrap();
        assert!((f.intercept_ms - 40.0).abs() < 1e-9);
        assert!((f.slope_ms - 200.0).abs() < 1e-9);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        assert_eq!(f.points, 5);
        assert!((f.at(0.5) - 140.0).abs() < 1e-9);
    }

    #[test]
    fn a_curved_prefix_response_has_a_low_r2() {
        // A cache that only helps at 100 %: a step, not a line.
        let pts = [
            (0.0, 200.0),
            (0.25, 200.0),
            (0.5, 200.0),
            (0.75, 200.0),
            (1.0, 20.0),
        ];
        let f = Fit::of(&target("aggregated"), &pts).unwrap();
        assert!(f.r2 < 0.6, "{f:?}");
        assert!(Fit::of(&target("x"), &[(0.5, 1.0)]).is_none());
        assert!(Fit::of(&target("x"), &[(0.5, 1.0), (0.5, 2.0)]).is_none());
    }
}
