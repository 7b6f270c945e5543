//! Cancellation scenarios in the bench: per step and target, the requests the client abandoned,
//! whether the server counted them, and how the requests beside them fared (docs/METRICS.md,
//! "Cancelled requests").

use super::analysis::Index;
use super::table::{Cell, Column, Table};

impl Index<'_> {
    /// The steps that abandoned requests; `None` when no workload has a `cancel:` share.
    pub(super) fn cancellations_table(&self) -> Option<Table> {
        let mut t = Table::new(
            "cancellations",
            "Cancelled requests",
            vec![
                Column::text("step"),
                Column::text("mode"),
                Column::count("cancelled"),
                Column::count("server counted"),
                Column::count("answered"),
                Column::count("errors"),
                Column::num("TTFT p50", "ms", 1),
                Column::num("TTFT p99", "ms", 1),
            ],
        );
        for r in self.step_totals() {
            let m = &r.measurements;
            if m.cancelled == 0 {
                continue;
            }
            let Some(side) = self.targets.iter().find(|s| s.info.name == r.labels.target) else {
                continue;
            };
            t.push(vec![
                Cell::text(&r.step),
                Cell::text(&side.label),
                Cell::Number(m.cancelled as f64),
                Cell::num(r.server.and_then(|s| s.cancellations)),
                Cell::Number(m.requests as f64),
                Cell::Number(m.errors as f64),
                Cell::num(m.ttft.map(|s| s.p50 * 1e3)),
                Cell::num(m.ttft.map(|s| s.p99 * 1e3)),
            ]);
        }
        if t.rows.is_empty() {
            return None;
        }
        t.notes.push(
            "cancelled: requests of the steady window the canary abandoned on purpose (`cancel:` of the workload), never errors; server counted: the cancellations the server's own metrics gained over the whole step, warmup and drain included (dynamo_component_cancellation_total; blank where the server exports none); answered: the other requests, whose TTFT shows whether the server recovered the abandoned requests' slots and KV blocks"
                .to_owned(),
        );
        Some(t)
    }
}
