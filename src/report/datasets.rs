//! The dataset workload in the bench: one table of its step, turn by turn and in all, each
//! target side by side (docs/METRICS.md, "Datasets").

use super::analysis::{Index, ms, pct};
use super::table::{Cell, Column, Table};

impl Index<'_> {
    /// The dataset step's table; `None` without a `dataset` step in the run.
    pub(super) fn dataset_table(&self) -> Option<Table> {
        let mut t = Table::new(
            "dataset",
            "Dataset",
            vec![
                Column::text("turn"),
                Column::text("mode"),
                Column::count("requests"),
                Column::count("errors"),
                Column::num("TTFT p50", "ms", 1),
                Column::num("TTFT p99", "ms", 1),
                Column::num("ITL p50", "ms", 2),
                Column::num("latency p50", "ms", 0),
                Column::num("throughput", "tok/s", 0),
                Column::num("cache hit", "%", 1),
            ],
        );
        // The step's own label (one step, one concurrency) on every row, the turn on all but the
        // step's total.
        let concurrency = self.values("dataset", "concurrency");
        let c = concurrency.first().map_or("", String::as_str);
        let turns = self.values("dataset", "turn");
        let rows = turns
            .iter()
            .map(|turn| {
                (
                    turn.as_str(),
                    vec![("concurrency", c), ("turn", turn.as_str())],
                )
            })
            .chain(std::iter::once(("all", vec![("concurrency", c)])));
        for (turn, labels) in rows {
            for side in &self.targets {
                let Some(m) = self.get("dataset", &side.info.name, &labels) else {
                    continue;
                };
                t.push(vec![
                    Cell::text(turn),
                    Cell::text(&side.label),
                    Cell::Number(m.requests as f64),
                    Cell::Number(m.errors as f64),
                    Cell::num(ms(m.ttft, |s| s.p50)),
                    Cell::num(ms(m.ttft, |s| s.p99)),
                    Cell::num(ms(m.itl, |s| s.p50)),
                    Cell::num(ms(m.latency, |s| s.p50)),
                    Cell::num(Some(m.output_tokens_per_second)),
                    Cell::num(pct(m.cache_hit_ratio)),
                ]);
            }
        }
        if t.rows.is_empty() {
            return None;
        }
        t.notes.push(
            "the dataset's conversations replayed turn by turn, every turn with the conversation's earlier messages and the replies the dataset recorded; ISL = the tokenizer's count of the texts sent, OSL = the recorded reply's (or `osl`); cache hit: cached over prompt tokens as the server reported them".into(),
        );
        Some(t)
    }
}
