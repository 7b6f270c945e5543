//! `report.html`: one self-contained page (inline CSS and SVG, no script, nothing fetched) with
//! the charts — Pareto TTFT vs throughput, TTFT p50/p99 by concurrency, TTFT vs prefix hit ratio
//! with the fitted line, TTFT per turn, TTFT box plots per distribution — and every table.

use std::fmt::Write as _;

use super::BenchData;
use super::analysis::{Index, Report, Side};
use super::svg::{BoxChart, BoxGroup, BoxStat, LineChart, PALETTE, Series, esc};
use super::table::Table;
use crate::measure::step::StepMeasurements;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px}.run{color:#555}\
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{border:1px solid #ddd}\
.chart-title{font-size:14px;font-weight:600}.tick{font-size:11px;fill:#444}\
.axis-label{font-size:12px;fill:#222}.legend{font-size:12px}.point-label{font-size:10px;fill:#555}\
.no-data{font-size:16px;fill:#999}.box line{stroke-width:1.5}\
table{border-collapse:collapse;margin:8px 0;font-size:13px}\
th,td{border:1px solid #ddd;padding:3px 8px;vertical-align:top}th{background:#f4f4f4}\
td.num{text-align:right;font-variant-numeric:tabular-nums}.note{color:#555;font-size:12px}";

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

fn ms(
    s: Option<crate::measure::step::Spread>,
    f: fn(&crate::measure::step::Spread) -> f64,
) -> Option<f64> {
    s.map(|s| f(&s) * 1e3)
}

/// The charts, in the order the page shows them.
fn charts(data: &BenchData, report: &Report) -> Vec<String> {
    let ix = Index::new(data);
    let levels = ix.levels();
    let mut pareto = Vec::new();
    let mut by_level = Vec::new();
    let mut prefix = Vec::new();
    let mut turns = Vec::new();
    for (i, side) in ix.targets.iter().enumerate() {
        let sweep: Vec<(u32, &StepMeasurements)> = levels
            .iter()
            .filter_map(|(n, l)| Some((*n, ix.sweep(&side.info.name, l)?)))
            .collect();
        pareto.push(pareto_series(side, color(i), &sweep));
        by_level.extend(level_series(side, color(i), &sweep));
        prefix.extend(prefix_series(&ix, side, color(i), report));
        turns.push(turn_series(&ix, side, color(i)));
    }
    let groups = distribution_groups(&ix, data);
    vec![
        LineChart {
            id: "chart-pareto",
            title: "Pareto: TTFT p50 vs throughput (concurrency sweep)".into(),
            x_label: "output tokens/s".into(),
            y_label: "TTFT p50 (ms)".into(),
            x_log2: false,
            series: pareto,
        }
        .render(),
        LineChart {
            id: "chart-ttft-concurrency",
            title: "TTFT p50 / p99 by concurrency".into(),
            x_label: "concurrency".into(),
            y_label: "TTFT (ms)".into(),
            x_log2: true,
            series: by_level,
        }
        .render(),
        LineChart {
            id: "chart-prefix",
            title: "TTFT p50 vs prefix hit ratio, with the fitted line".into(),
            x_label: "prefix hit ratio (%)".into(),
            y_label: "TTFT p50 (ms)".into(),
            x_log2: false,
            series: prefix,
        }
        .render(),
        LineChart {
            id: "chart-turns",
            title: "Multi-turn: TTFT p50 per turn".into(),
            x_label: "turn".into(),
            y_label: "TTFT p50 (ms)".into(),
            x_log2: false,
            series: turns,
        }
        .render(),
        BoxChart {
            id: "chart-distributions",
            title: "Sequence distribution: TTFT spread".into(),
            y_label: "TTFT (ms)".into(),
            groups,
        }
        .render(),
    ]
}

/// A target's TTFT p50 against its throughput, one point per concurrency of the sweep.
fn pareto_series(side: &Side, color: &'static str, sweep: &[(u32, &StepMeasurements)]) -> Series {
    let mut p = Series::new(
        side.label.clone(),
        color,
        sweep
            .iter()
            .filter_map(|(_, m)| Some((m.output_tokens_per_second, ms(m.ttft, |s| s.p50)?)))
            .collect(),
    );
    p.point_labels = sweep
        .iter()
        .filter(|(_, m)| m.ttft.is_some())
        .map(|(n, _)| format!("c={n}"))
        .collect();
    p
}

/// A target's TTFT p50 (solid) and p99 (dashed) by concurrency.
fn level_series(
    side: &Side,
    color: &'static str,
    sweep: &[(u32, &StepMeasurements)],
) -> [Series; 2] {
    [("p50", false), ("p99", true)].map(|(q, dashed)| {
        let mut s = Series::new(
            format!("{} {q}", side.label),
            color,
            sweep
                .iter()
                .filter_map(|(n, m)| {
                    let v = if dashed {
                        ms(m.ttft, |s| s.p99)
                    } else {
                        ms(m.ttft, |s| s.p50)
                    };
                    Some((f64::from(*n), v?))
                })
                .collect(),
        );
        s.dashed = dashed;
        s
    })
}

/// A target's TTFT p50 by prefix hit ratio as measured, and its fitted line when there is one.
fn prefix_series(ix: &Index, side: &Side, color: &'static str, report: &Report) -> Vec<Series> {
    let mut measured = Series::new(
        format!("{} measured", side.label),
        color,
        ix.prefix_points(side.info)
            .into_iter()
            .map(|(r, y)| (r * 100.0, y))
            .collect(),
    );
    measured.line = false;
    let mut out = vec![measured];
    if let Some(f) = report
        .prefix_fits
        .iter()
        .find(|f| f.target == side.info.name)
    {
        let mut line = Series::new(
            format!("{} fit (R² {:.2})", side.label, f.r2),
            color,
            vec![(0.0, f.at(0.0)), (100.0, f.at(1.0))],
        );
        line.dashed = true;
        line.markers = false;
        out.push(line);
    }
    out
}

/// A target's TTFT p50 per turn of the multi-turn conversations.
fn turn_series(ix: &Index, side: &Side, color: &'static str) -> Series {
    Series::new(
        side.label.clone(),
        color,
        ix.values("multi_turn", "turn")
            .iter()
            .filter_map(|t| {
                let m = ix.get("multi_turn", &side.info.name, &[("turn", t)])?;
                Some((t.parse().ok()?, ms(m.ttft, |s| s.p50)?))
            })
            .collect(),
    )
}

/// One group of TTFT boxes per sequence distribution, a box per target.
fn distribution_groups(ix: &Index, data: &BenchData) -> Vec<BoxGroup> {
    ix.values("sequence_distribution", "distribution")
        .into_iter()
        .map(|dist| BoxGroup {
            boxes: ix
                .targets
                .iter()
                .enumerate()
                .filter_map(|(i, side)| {
                    let samples = data
                        .ttft_by_distribution
                        .get(&(side.info.name.clone(), dist.clone()))?;
                    let ms: Vec<f64> = samples.iter().map(|s| s * 1e3).collect();
                    Some((side.label.clone(), color(i), BoxStat::of(&ms)?))
                })
                .collect(),
            label: dist,
        })
        .collect()
}

fn table_html(out: &mut String, t: &Table) {
    let _ = write!(
        out,
        "<h2 id=\"{}\">{}</h2><table><thead><tr>",
        t.id,
        esc(&t.title)
    );
    for c in &t.columns {
        let _ = write!(out, "<th>{}</th>", esc(&c.header()));
    }
    out.push_str("</tr></thead><tbody>");
    for r in &t.rows {
        out.push_str("<tr>");
        for (cell, col) in r.iter().zip(&t.columns) {
            let class = if cell.as_f64().is_some() {
                " class=\"num\""
            } else {
                ""
            };
            let _ = write!(out, "<td{class}>{}</td>", esc(&cell.render(col)));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    for n in &t.notes {
        let _ = write!(out, "<p class=\"note\">{}</p>", esc(n));
    }
}

/// The whole page.
pub fn render(data: &BenchData, report: &Report) -> String {
    let mut out = String::from(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <link rel=\"icon\" href=\"data:,\"><title>llm-canary bench report</title><style>",
    );
    out.push_str(STYLE);
    out.push_str("</style></head><body><h1>llm-canary bench report</h1>");
    let _ = write!(out, "<p class=\"run\">{}</p>", esc(&report.headline()));
    out.push_str("<div class=\"charts\">");
    for c in charts(data, report) {
        out.push_str(&c);
    }
    out.push_str("</div>");
    for t in &report.tables {
        table_html(&mut out, t);
    }
    out.push_str("</body></html>\n");
    out
}
