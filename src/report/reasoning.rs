//! Reasoning models in the bench: per step and target, how many of the steady window's
//! successful requests carried reasoning, their reasoning and answer tokens, and how long the
//! answer waited behind the reasoning (docs/METRICS.md, "Reasoning").

use super::analysis::Index;
use super::table::{Cell, Column, Table};

impl Index<'_> {
    /// The steps whose requests carried reasoning; `None` when none did, so a run of a model
    /// without reasoning has no empty table.
    pub(super) fn reasoning_table(&self) -> Option<Table> {
        let mut t = Table::new(
            "reasoning",
            "Reasoning",
            vec![
                Column::text("step"),
                Column::text("mode"),
                Column::count("requests"),
                Column::num("reasoning tokens", "tok/req", 1),
                Column::num("answer tokens", "tok/req", 1),
                Column::num("first reasoning p50", "ms", 1),
                Column::num("first answer p50", "ms", 1),
                Column::num("first answer p99", "ms", 1),
                Column::num("reasoning time p50", "ms", 1),
            ],
        );
        for r in self.step_totals() {
            let Some(m) = r.measurements.reasoning else {
                continue;
            };
            let Some(side) = self.targets.iter().find(|s| s.info.name == r.labels.target) else {
                continue;
            };
            let mean = |tokens: u64| tokens as f64 / m.requests as f64;
            let ms = |v: f64| v * 1e3;
            t.push(vec![
                Cell::text(&r.step),
                Cell::text(&side.label),
                Cell::Number(m.requests as f64),
                Cell::num(Some(mean(m.reasoning_tokens))),
                Cell::num(Some(mean(m.answer_tokens))),
                Cell::num(m.time_to_first_reasoning_token.map(|s| ms(s.p50))),
                Cell::num(m.time_to_first_answer_token.map(|s| ms(s.p50))),
                Cell::num(m.time_to_first_answer_token.map(|s| ms(s.p99))),
                Cell::num(m.reasoning_time.map(|s| ms(s.p50))),
            ]);
        }
        if t.rows.is_empty() {
            return None;
        }
        t.notes.push(
            "requests: successful steady requests whose stream carried reasoning (delta.reasoning_content or delta.reasoning); tokens per request, the reasoning ones as the client counted them and the answer the output less those; first reasoning / first answer: from the intended send to the first token of each kind (TTFT is the earlier of the two); reasoning time: first answer token - first reasoning token"
                .to_owned(),
        );
        Some(t)
    }
}
