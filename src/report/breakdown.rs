//! The server's side of TTFT in the bench: where each step's mean TTFT went (the canary's own
//! queue, the server's wait for prefill and its prefill, and the rest after the server's first
//! token: network, and in disaggregated serving the prefill → decode handoff with its KV
//! transfer), from Dynamo's per-request `nvext.timing`; where each mode's observed cache hits
//! came from; and the connect time kept out of TTFT (docs/METRICS.md, "Cache hits", "TTFT taken
//! apart" and "Connections").

use std::collections::BTreeMap;

use super::analysis::{Index, Side};
use super::table::{Cell, Column, Table};
use crate::measure::step::TtftBreakdown;
use crate::model::StepResult;
use crate::request::CacheSource;

/// Milliseconds of a mean in seconds.
fn ms(v: f64) -> f64 {
    v * 1e3
}

impl<'a> Index<'a> {
    /// One result per (step, target): the step's per-target total where its requests carried
    /// several label sets, else its only result; in the order the steps ran.
    pub(super) fn step_totals(&self) -> Vec<&'a StepResult> {
        let mut out: Vec<&'a StepResult> = Vec::new();
        for r in &self.data.steps {
            match out.iter_mut().find(|o| {
                o.step == r.step && o.labels.target == r.labels.target && o.cycle == r.cycle
            }) {
                Some(o) if r.total => *o = r,
                Some(_) => {}
                None => out.push(r),
            }
        }
        out
    }

    /// The TTFT breakdown of every step whose requests carried the server's timing.
    pub(super) fn breakdown_table(&self) -> Table {
        let mut t = Table::new(
            "ttft_breakdown",
            "TTFT taken apart (server timing)",
            vec![
                Column::text("step"),
                Column::text("mode"),
                Column::count("requests"),
                Column::num("client TTFT", "ms", 1),
                Column::num("client queue", "ms", 2),
                Column::num("server queue", "ms", 2),
                Column::num("server prefill", "ms", 1),
                Column::num("server TTFT", "ms", 1),
                Column::num("handoff + network", "ms", 1),
                Column::num("KV transfer est.", "ms", 2),
            ],
        );
        for r in self.step_totals() {
            let Some(b) = r.measurements.ttft_breakdown else {
                continue;
            };
            let Some(side) = self.targets.iter().find(|s| s.info.name == r.labels.target) else {
                continue;
            };
            t.push(vec![
                Cell::text(&r.step),
                Cell::text(&side.label),
                Cell::Number(b.requests as f64),
                Cell::num(Some(ms(b.client_ttft))),
                Cell::num(Some(ms(b.client_queue))),
                Cell::num(b.server_queue.map(ms)),
                Cell::num(b.server_prefill.map(ms)),
                Cell::num(Some(ms(b.server_ttft))),
                Cell::num(Some(ms(b.handoff))),
                Cell::num(b.kv_transfer.map(ms)),
            ]);
        }
        if t.rows.is_empty() {
            t.notes.push(
                "no server sent per-request timing (Dynamo's nvext.timing, requested with dialect: dynamo)".into(),
            );
        } else {
            t.notes.push("means over the step's successful steady requests that carried Dynamo's nvext.timing: client TTFT = client queue + server TTFT + handoff + network, and server TTFT = server queue + server prefill".into());
            t.notes.push("server TTFT is the first token at the worker (in disaggregated serving the prefill worker); handoff + network is the rest until the first token reached the canary: the network, HTTP and the frontend's own work outside the worker's timer (tokenizing, routing) in every mode, and in disaggregated serving the prefill → decode handoff with its KV transfer, of which Dynamo's router estimates the transfer part".into());
        }
        t
    }

    /// The connections each step opened per target, and how long they took to open.
    pub(super) fn connections_table(&self) -> Table {
        let mut t = Table::new(
            "connections",
            "Connections opened",
            vec![
                Column::text("step"),
                Column::text("mode"),
                Column::count("opened"),
                Column::num("connect p50", "ms", 3),
                Column::num("connect p99", "ms", 3),
                Column::num("connect max", "ms", 3),
            ],
        );
        for r in self.step_totals() {
            let (Some(c), Some(side)) = (
                r.connections,
                self.targets.iter().find(|s| s.info.name == r.labels.target),
            ) else {
                continue;
            };
            t.push(vec![
                Cell::text(&r.step),
                Cell::text(&side.label),
                Cell::Number(c.opened as f64),
                Cell::num(Some(ms(c.connect_p50_seconds))),
                Cell::num(Some(ms(c.connect_p99_seconds))),
                Cell::num(Some(ms(c.connect_max_seconds))),
            ]);
        }
        t.notes.push("connects (TCP, and the TLS handshake of a TLS target), before each closed-loop step (one connection per worker, 64 at a time) and for requests that found none idle: the server's and the network's own figure, kept out of TTFT where the connection was opened before the step".into());
        t
    }

    /// The breakdown of `target`'s lowest sweep level, or else of its first step that has one.
    pub(super) fn low_load_breakdown(&self, target: &str) -> Option<(String, TtftBreakdown)> {
        let sweep = self
            .levels()
            .first()
            .and_then(|(_, l)| self.sweep(target, l))
            .and_then(|m| m.ttft_breakdown)
            .zip(
                self.levels()
                    .first()
                    .map(|(n, _)| format!("concurrency {n}")),
            );
        sweep.map(|(b, s)| (s, b)).or_else(|| {
            self.step_totals()
                .into_iter()
                .filter(|r| r.labels.target == target)
                .find_map(|r| Some((r.step.clone(), r.measurements.ttft_breakdown?)))
        })
    }

    /// Where `side`'s observed cache hits in `workload` came from.
    fn cache_source(&self, side: &Side<'_>, workload: &str) -> Option<String> {
        let mut sources: BTreeMap<CacheSource, u64> = BTreeMap::new();
        for r in self.step_totals() {
            if r.labels.target == side.info.name && r.labels.workload == workload {
                for (k, v) in &r.measurements.cache_sources {
                    *sources.entry(*k).or_default() += v;
                }
            }
        }
        let by_rate = sources.get(&CacheSource::KvHitRate).copied().unwrap_or(0);
        let total: u64 = sources.values().sum();
        match (by_rate, total) {
            (_, 0) => None,
            (0, _) => Some(format!("{}: usage.cached_tokens", side.label)),
            (k, n) => Some(format!(
                "{}: Dynamo's nvext.timing.kv_hit_rate × prompt tokens for {k} of {n} requests, where usage reported 0 cached tokens",
                side.label
            )),
        }
    }

    /// A note saying where each mode's observed hits in `workload` came from, for its table.
    pub(super) fn cache_source_notes(&self, workload: &str) -> Vec<String> {
        let sources: Vec<String> = self
            .targets
            .iter()
            .filter_map(|s| self.cache_source(s, workload))
            .collect();
        if sources.is_empty() {
            Vec::new()
        } else {
            vec![format!("observed hit from {}", sources.join("; "))]
        }
    }
}

/// `a = b + c` as text, in ms, for the fourth question's evidence.
pub(super) fn breakdown_text(step: &str, mode: &str, b: &TtftBreakdown) -> String {
    let mut parts = vec![format!("server {:.1}", ms(b.server_ttft))];
    if let (Some(q), Some(p)) = (b.server_queue, b.server_prefill) {
        parts[0] = format!(
            "server {:.1} (queue {:.1} + prefill {:.1})",
            ms(b.server_ttft),
            ms(q),
            ms(p)
        );
    }
    parts.push(format!("handoff + network {:.1}", ms(b.handoff)));
    if b.client_queue >= 0.0005 {
        parts.insert(0, format!("client queue {:.1}", ms(b.client_queue)));
    }
    format!(
        "{mode} at {step}: mean TTFT {:.1} ms = {}",
        ms(b.client_ttft),
        parts.join(" + ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakdown_text_adds_up() {
        let b = TtftBreakdown {
            requests: 10,
            client_ttft: 0.090,
            client_queue: 0.0,
            server_queue: Some(0.001),
            server_prefill: Some(0.035),
            server_ttft: 0.036,
            handoff: 0.054,
            kv_transfer: Some(0.0),
        };
        assert_eq!(
            breakdown_text("concurrency 1", "disaggregated", &b),
            "disaggregated at concurrency 1: mean TTFT 90.0 ms = server 36.0 (queue 1.0 + prefill 35.0) + handoff + network 54.0"
        );
    }
}
