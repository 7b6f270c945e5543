//! Open-loop arrivals in the bench: per step and target, the arrivals the schedule intended in
//! the steady window, those sent, how far the client-side queue grew, and whether the step was
//! saturated (docs/METRICS.md, "Saturation").

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
}
