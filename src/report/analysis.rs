//! From step results to the source document's result tables (concurrency sweep, multi-turn,
//! sequence distribution, prefix cache, cost efficiency), the answers to its four questions with
//! the numbers behind them, and the recommendation table, each derived from the measurements.

use serde::Serialize;

use super::table::{Cell, Column, Table};
use super::{BenchData, RunInfo, SloVerdict, TargetInfo};
use crate::measure::step::{Spread, StepMeasurements};
use crate::model::ServerStep;
use crate::model::StepResult;

/// Disaggregated serving is the more complex setup: it is recommended only when it beats
/// aggregated by at least this fraction (the document's "simple, least overhead" argument).
const DISAGG_MARGIN: f64 = 0.10;

/// "High concurrency" in the source document's questions.
const HIGH_CONCURRENCY: u32 = 32;

/// "Low concurrency" in the source document's recommendation table.
const LOW_CONCURRENCY: u32 = 8;

/// R² from which the prefix-cache TTFT reduction counts as linear in the hit ratio.
const LINEAR_R2: f64 = 0.9;

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
        let n = points.len() as f64;
        let xs = points.iter().map(|(r, _)| 1.0 - r);
        let mean_x = xs.clone().sum::<f64>() / n;
        let mean_y = points.iter().map(|(_, y)| y).sum::<f64>() / n;
        let sxx: f64 = xs.clone().map(|x| (x - mean_x).powi(2)).sum();
        if points.len() < 2 || sxx <= 0.0 {
            return None;
        }
        let sxy: f64 = points
            .iter()
            .map(|(r, y)| (1.0 - r - mean_x) * (y - mean_y))
            .sum();
        let slope = sxy / sxx;
        let intercept = mean_y - slope * mean_x;
        let ss_tot: f64 = points.iter().map(|(_, y)| (y - mean_y).powi(2)).sum();
        let ss_res: f64 = points
            .iter()
            .map(|(r, y)| (y - intercept - slope * (1.0 - r)).powi(2))
            .sum();
        // Flat data lies exactly on a flat line.
        let r2 = if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else {
            1.0
        };
        Some(Fit {
            target: target.name.clone(),
            serving_mode: target.serving_mode.clone(),
            intercept_ms: intercept,
            slope_ms: slope,
            r2,
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
            ix.cost_table(),
            ix.questions_table(&prefix_fits),
            ix.recommendations_table(),
        ];
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

    /// Every table as Markdown, ready to paste into the source document.
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
        if r.interrupted {
            s.push_str(" (interrupted)");
        }
        s
    }
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

fn ms(s: Option<Spread>, f: fn(&Spread) -> f64) -> Option<f64> {
    s.map(|s| f(&s) * 1e3)
}

fn pct(v: Option<f64>) -> Option<f64> {
    v.map(|v| v * 100.0)
}

/// `(a − b) / a` in percent: how much lower `b` is than `a`.
fn gain(a: f64, b: f64) -> Option<f64> {
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
    fn pair(&self) -> Option<(&Side<'a>, &Side<'a>)> {
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
                r.workload == workload
                    && r.target == target
                    && r.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| r.labels.get(k).is_some_and(|x| x == v))
            })
            .map(|r| &r.measurements)
    }

    /// The distinct values of a step label in `workload`, numerically sorted where numbers.
    pub fn values(&self, workload: &str, key: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in self.data.steps.iter().filter(|r| r.workload == workload) {
            if let Some(v) = r.labels.get(key)
                && !out.contains(v)
            {
                out.push(v.clone());
            }
        }
        if key != "distribution" {
            sort_numeric(&mut out);
        }
        out
    }

    /// What the server's own metrics said during step `step` (its name) for `target`.
    fn server(&self, step: &str, target: &str) -> Option<&'a ServerStep> {
        self.data
            .steps
            .iter()
            .find(|r| r.step == step && r.target == target && r.server.is_some())
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
                        r.workload == "sequence_distribution"
                            && r.target == target
                            && r.labels.get("distribution").is_some_and(|d| d == dist)
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

    fn sweep_table(&self) -> Table {
        let mut t = Table::new(
            "concurrency_sweep",
            "Concurrency sweep",
            vec![
                Column::count("concurrency"),
                Column::text("mode"),
                Column::count("requests"),
                Column::count("errors"),
                Column::num("TTFT p50", "ms", 1),
                Column::num("TTFT p99", "ms", 1),
                Column::num("ITL p50", "ms", 2),
                Column::num("ITL p99", "ms", 2),
                Column::num("latency p50", "ms", 0),
                Column::num("throughput", "tok/s", 0),
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
                    Cell::Number(m.errors as f64),
                    Cell::num(ms(m.ttft, |s| s.p50)),
                    Cell::num(ms(m.ttft, |s| s.p99)),
                    Cell::num(ms(m.itl, |s| s.p50)),
                    Cell::num(ms(m.itl, |s| s.p99)),
                    Cell::num(ms(m.latency, |s| s.p50)),
                    Cell::num(Some(m.output_tokens_per_second)),
                ]);
            }
        }
        t
    }

    fn multi_turn_table(&self) -> Table {
        let mut t = Table::new(
            "multi_turn",
            "Multi-turn conversations",
            vec![
                Column::text("turn"),
                Column::text("mode"),
                Column::count("requests"),
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
        t
    }

    fn distribution_table(&self) -> Table {
        let mut t = Table::new(
            "sequence_distribution",
            "Sequence distribution",
            vec![
                Column::text("distribution"),
                Column::text("ISL bucket"),
                Column::text("mode"),
                Column::count("requests"),
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

    fn prefix_table(&self, fits: &[Fit]) -> Table {
        let mut t = Table::new(
            "prefix_cache",
            "Prefix cache",
            vec![
                Column::num("prefix hit ratio", "%", 0),
                Column::text("mode"),
                Column::count("requests"),
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
        t.notes.push("server columns come from the servers' own /metrics (vLLM names), scraped through the step where available; KV usage is the mean over workers".into());
        t.notes.push("KV blocks offloaded is the increase of Dynamo KVBM's kvbm_offload_blocks_d2h, the blocks copied from GPU to host memory: real KVBM copies every computed block, so it is not an eviction count (the simulator copies only on eviction); empty without KVBM, as vLLM has no such counter".into());
        t
    }

    fn cost_table(&self) -> Table {
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
            ]);
        }
        t.notes.push("throughput is the concurrency-sweep step with the most output tokens per second; $ per 1M = $/h ÷ 3600 ÷ tok/s × 10⁶; GPU cost from `cost_per_hour_usd`".into());
        t
    }

    fn questions_table(&self, fits: &[Fit]) -> Table {
        let mut t = Table::new(
            "questions",
            "The four questions",
            vec![
                Column::count("#"),
                Column::text("question"),
                Column::text("finding"),
                Column::text("evidence"),
                Column::text("SLO verdicts"),
            ],
        );
        let questions: [(&str, Answer); 4] = [
            (
                "How much does disaggregated serving improve TTFT, especially at concurrency 32+?",
                self.q1_ttft_gain(),
            ),
            (
                "Does KV cache offloading (cheaper decode GPUs) give a real cost saving?",
                self.q2_cost(),
            ),
            (
                "Is the TTFT improvement linear in the prefix-cache hit ratio; what does reuse give in multi-turn?",
                self.q3_prefix(fits),
            ),
            (
                "Does the KV transfer overhead cancel the disaggregation gain on short sequences?",
                self.q4_transfer(),
            ),
        ];
        for (i, (q, a)) in questions.into_iter().enumerate() {
            t.push(vec![
                Cell::Number(i as f64 + 1.0),
                Cell::text(q),
                Cell::text(a.finding),
                Cell::text(a.evidence),
                Cell::text(self.slo_for(i + 1)),
            ]);
        }
        t
    }

    /// The SLO verdicts filed under question `q` by the workload (or cost) their rule reads.
    fn slo_for(&self, q: usize) -> String {
        let mine: Vec<String> = self
            .data
            .slo
            .iter()
            .filter(|v| question_of(&v.expr, &v.name) == Some(q))
            .map(|v| match v.value {
                Some(x) => format!("{}: {} (value {x:.3})", v.name, v.state),
                None => format!("{}: {}", v.name, v.state),
            })
            .collect();
        if mine.is_empty() {
            "no SLO on this question".into()
        } else {
            mine.join("; ")
        }
    }

    fn q1_ttft_gain(&self) -> Answer {
        let Some((agg, dis)) = self.pair() else {
            return Answer::needs_pair();
        };
        // (level, agg p50, disagg p50, (agg p99, disagg p99)), in ms.
        type Level = (u32, f64, f64, Option<(f64, f64)>);
        let rows: Vec<Level> = self
            .levels()
            .into_iter()
            .filter_map(|(n, l)| {
                let a = self.sweep(&agg.info.name, &l)?;
                let d = self.sweep(&dis.info.name, &l)?;
                let p99 = ms(a.ttft, |s| s.p99).zip(ms(d.ttft, |s| s.p99));
                Some((n, ms(a.ttft, |s| s.p50)?, ms(d.ttft, |s| s.p50)?, p99))
            })
            .collect();
        if rows.is_empty() {
            return Answer::missing("concurrency_sweep");
        }
        let high: Vec<_> = rows.iter().filter(|r| r.0 >= HIGH_CONCURRENCY).collect();
        let (scope, chosen) = if high.is_empty() {
            (
                format!(
                    "at the highest level measured (no level ≥ {HIGH_CONCURRENCY} in this plan)"
                ),
                vec![rows.last().expect("not empty")],
            )
        } else {
            (format!("at concurrency ≥ {HIGH_CONCURRENCY}"), high)
        };
        let gains: Vec<f64> = chosen.iter().filter_map(|r| gain(r.1, r.2)).collect();
        let mean = gains.iter().sum::<f64>() / gains.len().max(1) as f64;
        let finding = if mean >= 0.0 {
            format!("disaggregated TTFT p50 is {mean:.0} % lower than aggregated {scope}")
        } else {
            format!(
                "disaggregated TTFT p50 is {:.0} % higher than aggregated {scope}",
                -mean
            )
        };
        let evidence: Vec<String> = rows
            .iter()
            .map(|(n, a, d, p99)| {
                let mut s = format!(
                    "c={n}: {a:.0} vs {d:.0} ms (disagg {:+.0} %)",
                    -gain(*a, *d).unwrap_or(0.0)
                );
                if *n >= HIGH_CONCURRENCY
                    && let Some((a99, d99)) = p99
                {
                    s.push_str(&format!(", p99 {a99:.0} vs {d99:.0} ms"));
                }
                s
            })
            .collect();
        Answer {
            finding,
            evidence: format!("TTFT p50 agg vs disagg: {}", evidence.join("; ")),
        }
    }

    fn q2_cost(&self) -> Answer {
        let Some((agg, dis)) = self.pair() else {
            return Answer::needs_pair();
        };
        let line = |s: &Side<'_>| {
            let (n, m) = self.peak(&s.info.name)?;
            let cost = m.cost_per_million_tokens_usd?;
            Some((
                cost,
                format!(
                    "{} ${:.2}/h at {:.0} tok/s (c={n}) = ${cost:.2}/1M",
                    s.info.serving_mode,
                    s.info.cost_per_hour_usd.unwrap_or(0.0),
                    m.output_tokens_per_second
                ),
            ))
        };
        let (Some((a, ea)), Some((d, ed))) = (line(agg), line(dis)) else {
            let priced =
                agg.info.cost_per_hour_usd.is_some() && dis.info.cost_per_hour_usd.is_some();
            return Answer {
                finding: "no cost figures".into(),
                evidence: if priced {
                    "concurrency_sweep measured no output tokens in one of the modes".into()
                } else {
                    "set `cost_per_hour_usd` on both targets".into()
                },
            };
        };
        let saving = gain(a, d).unwrap_or(0.0);
        let finding = if saving >= 0.0 {
            format!(
                "yes: disaggregated costs {saving:.0} % less per 1M output tokens at peak throughput"
            )
        } else {
            format!(
                "no: disaggregated costs {:.0} % more per 1M output tokens at peak throughput",
                -saving
            )
        };
        let mut evidence = format!("{ea}; {ed}");
        let top = self.levels().last().map(|(_, l)| l.clone());
        if let Some(level) = top {
            let step = format!("concurrency_sweep concurrency={level}");
            for s in [agg, dis] {
                if let Some(sv) = self.server(&step, &s.info.name)
                    && let Some(u) = sv.kv_cache_usage_max
                {
                    evidence.push_str(&format!(
                        "; {} KV usage peak {:.1} % at c={level}",
                        s.info.serving_mode,
                        u * 100.0,
                    ));
                    // Only a server with KVBM counts them (`kvbm_offload_blocks_d2h`); vLLM alone
                    // has no such counter.
                    if let Some(b) = sv.kv_offload_blocks {
                        evidence.push_str(&format!(", {b} KV blocks offloaded to host"));
                    }
                }
            }
        }
        Answer { finding, evidence }
    }

    fn q3_prefix(&self, fits: &[Fit]) -> Answer {
        let mut evidence = Vec::new();
        let mut linear = Vec::new();
        for f in fits {
            linear.push(f.r2 >= LINEAR_R2 && f.slope_ms > 0.0);
            let at0 = f.at(0.0);
            evidence.push(format!(
                "{}: R² {:.2}, fitted TTFT {:.0} ms at 0 % → {:.0} ms at 100 % ({:.0} % lower)",
                f.serving_mode,
                f.r2,
                at0,
                f.at(1.0),
                gain(at0, f.at(1.0)).unwrap_or(0.0)
            ));
        }
        for side in &self.targets {
            let turns = self.values("multi_turn", "turn");
            let (Some(first), Some(last)) = (turns.first(), turns.last()) else {
                break;
            };
            let get = |turn: &str| self.get("multi_turn", &side.info.name, &[("turn", turn)]);
            if let (Some(a), Some(b)) = (get(first), get(last))
                && let (Some(ta), Some(tb)) = (ms(a.ttft, |s| s.p50), ms(b.ttft, |s| s.p50))
            {
                evidence.push(format!(
                    "multi-turn {}: turn {first} {ta:.0} ms → turn {last} {tb:.0} ms at {:.0} % cache hits",
                    side.info.serving_mode,
                    b.cache_hit_ratio.unwrap_or(0.0) * 100.0
                ));
            }
        }
        let finding = if fits.is_empty() {
            "no prefix_cache data".to_owned()
        } else if linear.iter().all(|l| *l) {
            format!("yes: TTFT falls linearly with the hit ratio (R² ≥ {LINEAR_R2} in every mode)")
        } else if linear.iter().any(|l| *l) {
            format!("only in some modes (R² ≥ {LINEAR_R2} with a falling line)")
        } else {
            format!("no: the fit a + b·(1 − r) has R² below {LINEAR_R2} or does not fall")
        };
        Answer {
            finding,
            evidence: evidence.join("; "),
        }
    }

    fn q4_transfer(&self) -> Answer {
        let Some((agg, dis)) = self.pair() else {
            return Answer::needs_pair();
        };
        let mut evidence = Vec::new();
        let mut worse = Vec::new();
        if let Some((n, l)) = self.levels().first() {
            if let (Some(a), Some(d)) = (
                self.sweep(&agg.info.name, l)
                    .and_then(|m| ms(m.ttft, |s| s.p50)),
                self.sweep(&dis.info.name, l)
                    .and_then(|m| ms(m.ttft, |s| s.p50)),
            ) {
                worse.push(d > a);
                evidence.push(format!(
                    "concurrency {n}: TTFT p50 agg {a:.1} ms, disagg {d:.1} ms ({:+.1} ms)",
                    d - a
                ));
            }
        }
        // The shortest prompts the sequence distribution sent to both targets.
        let dists = self.values("sequence_distribution", "distribution");
        let shortest = self
            .values("sequence_distribution", "isl_bucket")
            .into_iter()
            .find_map(|b| {
                dists.iter().find_map(|dist| {
                    let labels = [("distribution", dist.as_str()), ("isl_bucket", b.as_str())];
                    let a = self.get("sequence_distribution", &agg.info.name, &labels)?;
                    let d = self.get("sequence_distribution", &dis.info.name, &labels)?;
                    Some((
                        b.clone(),
                        dist.clone(),
                        ms(a.ttft, |s| s.p50)?,
                        ms(d.ttft, |s| s.p50)?,
                    ))
                })
            });
        if let Some((b, dist, a, d)) = shortest {
            worse.push(d > a);
            evidence.push(format!(
                "shortest ISL bucket {b}+ ({dist}): TTFT p50 agg {a:.1} ms, disagg {d:.1} ms ({:+.1} ms)",
                d - a
            ));
        }
        let finding = match (worse.len(), worse.iter().filter(|w| **w).count()) {
            (0, _) => "no data at low load or short prompts".to_owned(),
            (_, 0) => "no: disaggregated TTFT stays at or below aggregated even at the lowest load and shortest prompts".to_owned(),
            (n, k) if k == n => "yes: at the lowest load and shortest prompts the transfer overhead makes disaggregated TTFT higher".to_owned(),
            _ => "partly: disaggregated TTFT is higher in one of the low-load / short-prompt cases".to_owned(),
        };
        Answer {
            finding,
            evidence: evidence.join("; "),
        }
    }

    fn recommendations_table(&self) -> Table {
        let mut t = Table::new(
            "recommendations",
            "Recommendations",
            vec![
                Column::text("scenario"),
                Column::text("document expects"),
                Column::text("measured"),
                Column::text("agrees"),
                Column::text("evidence"),
            ],
        );
        let rows: [(&str, &str, Option<Choice>); 4] = [
            (
                "one model, low concurrency (< 8)",
                "aggregated",
                self.recommend_low_concurrency(),
            ),
            (
                "multi-turn, high cache hit rate",
                "disaggregated",
                self.recommend_multi_turn(),
            ),
            (
                "high concurrency (32+), strict SLA",
                "disaggregated",
                self.recommend_high_concurrency(),
            ),
            ("cost first", "disaggregated", self.recommend_cost()),
        ];
        for (scenario, expected, measured) in rows {
            let (mode, why) = measured.unwrap_or_else(|| ("-".into(), "no data".into()));
            let agrees = match mode.as_str() {
                "-" => "-",
                m if m == expected => "yes",
                _ => "no",
            };
            t.push(vec![
                Cell::text(scenario),
                Cell::text(expected),
                Cell::text(mode),
                Cell::text(agrees),
                Cell::text(why),
            ]);
        }
        t.notes.push(format!(
            "disaggregated is chosen on latency only when it is at least {:.0} % better (it is the more complex setup); cost first compares $ per 1M output tokens",
            DISAGG_MARGIN * 100.0
        ));
        t
    }

    /// Mean of a per-level metric over the sweep levels `keep` selects, for both sides.
    fn sweep_means(
        &self,
        keep: impl Fn(u32) -> bool,
        metric: fn(&StepMeasurements) -> Option<f64>,
    ) -> Option<(f64, f64, String)> {
        let (agg, dis) = self.pair()?;
        let mut pairs = Vec::new();
        let mut levels = Vec::new();
        for (n, l) in self.levels() {
            if !keep(n) {
                continue;
            }
            if let (Some(a), Some(d)) = (
                self.sweep(&agg.info.name, &l).and_then(metric),
                self.sweep(&dis.info.name, &l).and_then(metric),
            ) {
                pairs.push((a, d));
                levels.push(l);
            }
        }
        if pairs.is_empty() {
            return None;
        }
        let n = pairs.len() as f64;
        Some((
            pairs.iter().map(|p| p.0).sum::<f64>() / n,
            pairs.iter().map(|p| p.1).sum::<f64>() / n,
            levels.join(", "),
        ))
    }

    fn recommend_low_concurrency(&self) -> Option<(String, String)> {
        let (a, d, levels) =
            self.sweep_means(|n| n < LOW_CONCURRENCY, |m| ms(m.ttft, |s| s.p50))?;
        Some((
            by_latency(a, d),
            format!("mean TTFT p50 at c={levels}: agg {a:.1} ms, disagg {d:.1} ms"),
        ))
    }

    fn recommend_high_concurrency(&self) -> Option<(String, String)> {
        let high = self.levels().iter().any(|(n, _)| *n >= HIGH_CONCURRENCY);
        let top = self.levels().last().map(|(n, _)| *n)?;
        let (a, d, levels) = self.sweep_means(
            |n| {
                if high {
                    n >= HIGH_CONCURRENCY
                } else {
                    n == top
                }
            },
            |m| ms(m.ttft, |s| s.p99),
        )?;
        Some((
            by_latency(a, d),
            format!("mean TTFT p99 at c={levels}: agg {a:.0} ms, disagg {d:.0} ms"),
        ))
    }

    fn recommend_multi_turn(&self) -> Option<(String, String)> {
        let (agg, dis) = self.pair()?;
        // Turns after the first are the ones a cache can serve from the history.
        let later: Vec<String> = self
            .values("multi_turn", "turn")
            .into_iter()
            .filter(|t| t != "1")
            .collect();
        let mean = |side: &Side<'_>| {
            let v: Vec<(f64, Option<f64>)> = later
                .iter()
                .filter_map(|t| {
                    let m = self.get("multi_turn", &side.info.name, &[("turn", t)])?;
                    Some((ms(m.ttft, |s| s.p50)?, m.cache_hit_ratio))
                })
                .collect();
            (!v.is_empty()).then(|| {
                let n = v.len() as f64;
                (
                    v.iter().map(|x| x.0).sum::<f64>() / n,
                    v.iter().filter_map(|x| x.1).sum::<f64>() / n,
                )
            })
        };
        let ((a, ha), (d, hd)) = (mean(agg)?, mean(dis)?);
        Some((
            by_latency(a, d),
            format!(
                "mean TTFT p50 of turns ≥ 2: agg {a:.1} ms ({:.0} % hits), disagg {d:.1} ms ({:.0} % hits)",
                ha * 100.0,
                hd * 100.0
            ),
        ))
    }

    fn recommend_cost(&self) -> Option<(String, String)> {
        let (agg, dis) = self.pair()?;
        let a = self.peak(&agg.info.name)?.1.cost_per_million_tokens_usd?;
        let d = self.peak(&dis.info.name)?.1.cost_per_million_tokens_usd?;
        let mode = if d < a { "disaggregated" } else { "aggregated" };
        Some((
            mode.into(),
            format!("$ per 1M output tokens at peak throughput: agg ${a:.2}, disagg ${d:.2}"),
        ))
    }
}

/// A recommended mode and the numbers behind it.
type Choice = (String, String);

/// The mode a latency comparison recommends (lower is better; see [`DISAGG_MARGIN`]).
fn by_latency(agg: f64, disagg: f64) -> String {
    if disagg <= agg * (1.0 - DISAGG_MARGIN) {
        "disaggregated".into()
    } else {
        "aggregated".into()
    }
}

/// Which of the four questions an SLO speaks to, from what its rule reads.
fn question_of(expr: &str, name: &str) -> Option<usize> {
    let text = format!("{name} {expr}");
    if text.contains("cost") {
        Some(2)
    } else if text.contains("prefix_cache") || text.contains("multi_turn") {
        Some(3)
    } else if text.contains("sequence_distribution") || text.contains("transfer") {
        Some(4)
    } else if text.contains("concurrency_sweep") {
        Some(1)
    } else {
        None
    }
}

struct Answer {
    finding: String,
    evidence: String,
}

impl Answer {
    fn needs_pair() -> Answer {
        Answer {
            finding: "needs an aggregated and a disaggregated target".into(),
            evidence: "-".into(),
        }
    }

    fn missing(workload: &str) -> Answer {
        Answer {
            finding: format!("no {workload} data in this run"),
            evidence: "-".into(),
        }
    }
}

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

    #[test]
    fn disaggregated_must_win_by_the_margin() {
        assert_eq!(by_latency(100.0, 95.0), "aggregated");
        assert_eq!(by_latency(100.0, 89.0), "disaggregated");
        assert_eq!(by_latency(100.0, 120.0), "aggregated");
    }

    #[test]
    fn slos_are_filed_under_the_question_their_rule_reads() {
        let sweep = r#"p50(ttft{serving_mode="disaggregated", workload="concurrency_sweep", concurrency="32"}) <= 0.8 * p50(ttft{serving_mode="aggregated"})"#;
        assert_eq!(question_of(sweep, "disagg-ttft-gain-c32"), Some(1));
        assert_eq!(question_of("x", "kv-offload-cost"), Some(2));
        assert_eq!(
            question_of(
                r#"r2(p50(ttft{workload="prefix_cache"}) by (prefix_ratio)) >= 0.9"#,
                "p"
            ),
            Some(3)
        );
        assert_eq!(question_of("error_ratio < 0.01", "errors"), None);
    }
}
