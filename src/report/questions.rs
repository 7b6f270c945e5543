//! The bench report's conclusions: the four questions of the benchmark plan (docs/DESIGN.md
//! §11) answered with the numbers behind them and the SLO verdicts filed under each, and the
//! recommendation table, each derived from the measurements the tables show.

use super::analysis::{
    DISAGG_MARGIN, Fit, HIGH_CONCURRENCY, Index, LINEAR_R2, LOW_CONCURRENCY, Side, gain, ms,
};
use super::table::{Cell, Column, Table};
use crate::measure::step::StepMeasurements;

impl<'a> Index<'a> {
    pub(super) fn questions_table(&self, fits: &[Fit]) -> Table {
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
        // The server's side, where it sent its timing: what disaggregation saved at the worker
        // against what the handoff after the prefill worker's first token cost.
        let split = self
            .low_load_breakdown(&agg.info.name)
            .zip(self.low_load_breakdown(&dis.info.name));
        let mut overhead = None;
        if let Some(((step_a, a), (step_d, d))) = &split {
            evidence.push(super::breakdown::breakdown_text(step_a, "agg", a));
            evidence.push(super::breakdown::breakdown_text(step_d, "disagg", d));
            overhead = Some((
                (d.handoff - a.handoff) * 1e3,
                (a.server_ttft - d.server_ttft) * 1e3,
            ));
        }
        let mut finding = match (worse.len(), worse.iter().filter(|w| **w).count()) {
            (0, _) => "no data at low load or short prompts".to_owned(),
            (_, 0) => "no: disaggregated TTFT stays at or below aggregated even at the lowest load and shortest prompts".to_owned(),
            (n, k) if k == n => "yes: at the lowest load and shortest prompts the transfer overhead makes disaggregated TTFT higher".to_owned(),
            _ => "partly: disaggregated TTFT is higher in one of the low-load / short-prompt cases".to_owned(),
        };
        if let Some((handoff, saved)) = overhead {
            finding.push_str(&format!(
                "; by the server's own timing, disaggregated spends {handoff:+.1} ms after the worker's first token (the prefill → decode handoff) and {:.1} ms {} before it",
                saved.abs(),
                if saved >= 0.0 { "less" } else { "more" }
            ));
        }
        Answer {
            finding,
            evidence: evidence.join("; "),
        }
    }

    pub(super) fn recommendations_table(&self) -> Table {
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

#[cfg(test)]
mod tests {
    use super::*;

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
