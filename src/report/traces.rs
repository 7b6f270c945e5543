//! Trace replay in the bench: one table per replayed trace, each target's step side by side
//! (docs/METRICS.md, "Trace replay").

use super::analysis::{Index, SKIPPED, ms, skipped};
use super::table::{Cell, Column, Table};

impl Index<'_> {
    /// A table per trace the run replayed, in the plan's order; none without `trace_replay`.
    pub(super) fn trace_tables(&self) -> Vec<Table> {
        let steps: Vec<_> = self
            .step_totals()
            .into_iter()
            .filter(|r| r.labels.workload == "trace_replay")
            .collect();
        let mut names: Vec<&str> = Vec::new();
        for r in &steps {
            if let Some(n) = r.labels.step("trace")
                && !names.contains(&n)
            {
                names.push(n);
            }
        }
        names
            .into_iter()
            .map(|name| {
                let mut t = Table::new(
                    &format!("trace_{name}"),
                    &format!("Trace replay: {name}"),
                    vec![
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
                        Column::num("cache hit", "%", 1),
                        Column::num("expected hit", "%", 1),
                        Column::num("server prefix hit", "%", 1),
                    ],
                );
                for r in steps
                    .iter()
                    .filter(|r| r.labels.step("trace") == Some(name))
                {
                    let Some(side) = self.targets.iter().find(|s| s.info.name == r.labels.target) else {
                        continue;
                    };
                    let m = &r.measurements;
                    t.push(vec![
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
                        Cell::num(m.cache_hit_ratio.map(|h| h * 100.0)),
                        Cell::num(m.expected_cache_hit_ratio.map(|h| h * 100.0)),
                        Cell::num(
                            r.server
                                .and_then(|s| s.prefix_cache_hit_ratio)
                                .map(|h| h * 100.0),
                        ),
                    ]);
                }
                t.notes.push(format!(
                    "the rows of trace `{name}` sent at their timestamps (divided by `speed`, looped while the step sends), with prompts whose KV blocks repeat wherever the trace's block ids repeat; cache hit: cached over prompt tokens as the server reported them; expected hit: what a prefix cache without evictions could serve of the rows sent, from the trace's repeated leading blocks (the last prompt token never counts); server prefix hit: the server's own metrics over the step"
                ));
                t
            })
            .collect()
    }
}
