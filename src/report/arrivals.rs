//! Open-loop arrivals in the bench: per step and target, the arrivals the schedule intended in
//! the steady window, those sent, how far the client-side queue grew, and whether the step was
//! saturated (docs/METRICS.md, "Saturation"); and a rate ladder's steps side by side, rate by
//! rate, as a request-rate sweep reads.

use super::analysis::Index;
use super::table::{Cell, Column, Table};

impl Index<'_> {
    /// The arrivals of every open-loop step; `None` when the run had none (no `rate:`).
    pub(super) fn arrivals_table(&self) -> Option<Table> {
        let mut t = Table::new(
            "open_loop_arrivals",
            "Open-loop arrivals",
            vec![
                Column::text("step"),
                Column::text("mode"),
                Column::count("intended"),
                Column::count("sent"),
                Column::num("achieved", "%", 1),
                Column::num("queue growth", "ms", 1),
                Column::num("TTFT p99", "ms", 1),
                Column::text("saturated"),
            ],
        );
        for r in self.step_totals() {
            let m = &r.measurements;
            let Some(a) = m.arrivals else {
                continue;
            };
            let Some(side) = self.targets.iter().find(|s| s.info.name == r.labels.target) else {
                continue;
            };
            t.push(vec![
                Cell::text(&r.step),
                Cell::text(&side.label),
                Cell::Number(a.intended as f64),
                Cell::Number(a.sent as f64),
                Cell::num(Some(a.arrival_ratio * 100.0)),
                Cell::num(a.queue_growth_seconds.map(|g| g * 1e3)),
                Cell::num(m.ttft.map(|s| s.p99 * 1e3)),
                Cell::text(if m.saturated { "yes" } else { "no" }),
            ]);
        }
        if t.rows.is_empty() {
            return None;
        }
        t.notes.push(format!(
            "intended: arrivals the schedule placed in the steady window; sent: those that got one of the step's in-flight slots (`rate.max_inflight`) before sending ended; queue growth: the mean wait from the intended send to the first token (slot, server queue, prefill) in the window's last third minus its first; saturated: more than {:.0} % of the arrivals left unsent or still without a first token when cut (while others were answered), or a queue growth above {:.0} % of the window (at least {:.0} ms): the server fell behind the offered load, and the step's latencies describe a growing queue",
            crate::measure::arrivals::MISSED_SHARE * 100.0,
            crate::measure::arrivals::GROWTH_SHARE * 100.0,
            crate::measure::arrivals::GROWTH_MIN_SECONDS * 1e3,
        ));
        Some(t)
    }

    /// The steps of every rate ladder (`rate.rps: [..]`), by shape, rate and target: what the
    /// server did at each offered rate. `None` when the run had no ladder.
    pub(super) fn rate_sweep_table(&self) -> Option<Table> {
        let mut t = Table::new(
            "rate_sweep",
            "Request-rate sweep",
            vec![
                Column::text("step"),
                Column::num("rate", "req/s", 2),
                Column::text("mode"),
                Column::count("requests"),
                Column::count("errors"),
                Column::num("answered", "req/s", 2),
                Column::num("TTFT p50", "ms", 1),
                Column::num("TTFT p99", "ms", 1),
                Column::num("ITL p50", "ms", 2),
                Column::num("ITL p99", "ms", 2),
                Column::num("latency p50", "ms", 0),
                Column::num("throughput", "tok/s", 0),
                Column::num("goodput", "req/s", 2),
                Column::text("saturated"),
            ],
        );
        let mut rows: Vec<(String, f64, usize, &crate::model::StepResult)> = Vec::new();
        for r in self.step_totals() {
            let Ok(rate) = r.labels.rate.parse::<f64>() else {
                continue;
            };
            let Some(side) = self
                .targets
                .iter()
                .position(|s| s.info.name == r.labels.target)
            else {
                continue;
            };
            // The step without its rung: the rows of one shape read as one sweep.
            let shape = r.step.replace(&format!(" rate={}", r.labels.rate), "");
            rows.push((shape, rate, side, r));
        }
        // Shapes in the order they ran, then rates ascending, then targets as configured.
        let order: Vec<String> = rows.iter().fold(Vec::new(), |mut seen, (shape, ..)| {
            if !seen.contains(shape) {
                seen.push(shape.clone());
            }
            seen
        });
        let at = |shape: &String| order.iter().position(|o| o == shape);
        rows.sort_by(|a, b| {
            at(&a.0)
                .cmp(&at(&b.0))
                .then(a.1.total_cmp(&b.1))
                .then(a.2.cmp(&b.2))
        });
        for (shape, rate, side, r) in rows {
            let m = &r.measurements;
            t.push(vec![
                Cell::text(shape),
                Cell::num(Some(rate)),
                Cell::text(&self.targets[side].label),
                Cell::Number(m.requests as f64),
                Cell::Number(m.errors as f64),
                Cell::num(Some(m.requests_per_second)),
                Cell::num(super::analysis::ms(m.ttft, |s| s.p50)),
                Cell::num(super::analysis::ms(m.ttft, |s| s.p99)),
                Cell::num(super::analysis::ms(m.itl, |s| s.p50)),
                Cell::num(super::analysis::ms(m.itl, |s| s.p99)),
                Cell::num(super::analysis::ms(m.latency, |s| s.p50)),
                Cell::num(Some(m.output_tokens_per_second)),
                Cell::num(Some(m.goodput)),
                Cell::text(if m.saturated { "yes" } else { "no" }),
            ]);
        }
        if t.rows.is_empty() {
            return None;
        }
        t.notes.push(
            "rate: the arrivals per second the ladder offered (`rate.rps: [..]`, before any budget scaling); answered: the step's requests/s, the successful requests among those sent in the steady window per second of the window (answers that came in the drain count). Past the server's capacity it still follows the offered rate while the queue grows: TTFT climbs from rung to rung and the step reads saturated (the open-loop arrivals table)".into(),
        );
        Some(t)
    }
}
