//! The normalised, human-readable summary `llm-canary check` prints for a valid config.

use std::fmt::Write;
use std::time::Duration;

use super::at::Dur;
use super::schema::Config;
use super::workloads::{Arrival, Rate, Rps};

/// How many steps each shape of a workload runs: one per rate of its ladder, else one.
fn rungs(rate: &Option<Rate>) -> usize {
    rate.as_ref().map_or(1, |r| r.rps.rates().len().max(1))
}

/// A workload's open-loop arrivals in its summary line; empty for closed-loop workers.
fn open_loop(rate: &Option<Rate>) -> String {
    let Some(r) = rate else {
        return String::new();
    };
    let rps = match &*r.rps {
        Rps::One(x) => format!("{x} rps"),
        Rps::Ladder(xs) => {
            let xs: Vec<String> = xs.iter().map(f64::to_string).collect();
            format!("rate ladder [{}] rps, a step per rate", xs.join(", "))
        }
    };
    let arrival = match r.arrival {
        Arrival::Poisson => "poisson",
        Arrival::Constant => "constant",
    };
    format!(
        ", open loop: {arrival} {rps}, at most {} in flight",
        *r.max_inflight
    )
}

impl Config {
    /// Steps of each configured workload with their (time-scaled) durations, in cycle order.
    pub fn cycle_plan(&self) -> Vec<(&'static str, usize, Duration)> {
        let scale = *self.time_scale;
        let w = &self.workloads;
        self.cycle()
            .into_iter()
            .map(|name| {
                let (steps, each) = match name {
                    "concurrency_sweep" => w
                        .concurrency_sweep
                        .as_ref()
                        .map(|s| (s.levels.len() * rungs(&s.rate), s.step.0)),
                    "multi_turn" => w.multi_turn.as_ref().map(|m| (1, m.duration.0)),
                    "sequence_distribution" => w
                        .sequence_distribution
                        .as_ref()
                        .map(|d| (d.distributions.len() * rungs(&d.rate), d.step.0)),
                    "prefix_cache" => w
                        .prefix_cache
                        .as_ref()
                        .map(|p| (p.hit_ratios.len() * rungs(&p.rate), p.step.0)),
                    "trace_replay" => w.trace_replay.as_ref().map(|r| (r.traces.len(), r.step.0)),
                    "dataset" => w.dataset.as_ref().map(|d| (1, d.step.0)),
                    _ => None,
                }
                .unwrap_or((0, Duration::ZERO));
                (name, steps, each.mul_f64(scale) * steps as u32)
            })
            .collect()
    }

    /// How long one cycle takes at most: every step's scheduled time, a whole drain grace after
    /// each step, and the pause between cycles. (A cycle usually ends sooner: drains end when the
    /// last request does; calibration and prefix warm-ups add seconds.) Windows that must see
    /// every step once per cycle, and the "stuck" alerts, are sized from it.
    pub fn cycle_upper_bound(&self) -> Duration {
        let plan = self.cycle_plan();
        let steps: u32 = plan.iter().map(|p| p.1 as u32).sum();
        let sending: Duration = plan.iter().map(|p| p.2).sum();
        sending + self.schedule.drain_grace.0 * steps + self.schedule.cycle_pause.0
    }

    /// A short summary of everything the config will do.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        self.summary_targets(&mut out);
        if let Some(d) = &self.discovery {
            let _ = writeln!(
                out,
                "discovery: kubernetes namespaces={:?} dynamo_graph_deployments={}",
                d.kubernetes.namespaces, d.kubernetes.dynamo_graph_deployments
            );
        }
        let _ = writeln!(
            out,
            "tokenizer: {}",
            self.tokenizer
                .as_ref()
                .map(|t| t.value.as_str())
                .unwrap_or("built-in approximation (real lengths read back from usage)")
        );
        self.summary_cycle(&mut out);
        self.summary_slos(&mut out);
        let _ = writeln!(
            out,
            "export: listen {}{}",
            *self.export.listen,
            self.export
                .otlp
                .as_ref()
                .map(|o| format!(", otlp {} every {}", *o.endpoint, *o.interval))
                .unwrap_or_default()
        );
        out
    }

    /// One line per target: where it is, its model and API, what else it names.
    fn summary_targets(&self, out: &mut String) {
        let _ = writeln!(out, "targets ({}):", self.targets.len());
        for t in &self.targets {
            let endpoint = match (&t.url, &t.simulated) {
                (Some(u), _) => super::display_url_text(&u.value),
                (None, Some(_)) => "embedded simulator".to_owned(),
                (None, None) => String::new(),
            };
            let _ = write!(
                out,
                "  {:<14} {:<13} {}  model={} api={:?} dialect={:?}",
                *t.name,
                t.serving_mode.as_str(),
                endpoint,
                t.model,
                t.api,
                t.dialect
            );
            if !t.server_metrics.is_empty() {
                let _ = write!(out, " server_metrics={}", t.server_metrics.len());
            }
            if let Some(c) = &t.cost_per_hour_usd {
                let _ = write!(out, " cost=${:.2}/h", **c);
            }
            if !t.request.is_empty() {
                // Header values masked: they may be credentials.
                let _ = write!(out, "\n    request: {}", t.request.summary());
            }
            out.push('\n');
        }
    }

    /// The cycle's length and steps, then one line per workload with its steps and settings.
    fn summary_cycle(&self, out: &mut String) {
        let plan = self.cycle_plan();
        let total: Duration = plan.iter().map(|p| p.2).sum();
        let _ = writeln!(
            out,
            "cycle: {} workloads, {} steps, {} per cycle at time_scale {} (pairing {:?})",
            plan.len(),
            plan.iter().map(|p| p.1).sum::<usize>(),
            Dur(round_secs(total)),
            *self.time_scale,
            self.schedule.pairing
        );
        for (name, steps, dur) in &plan {
            let _ = writeln!(
                out,
                "  {name:<22} {steps} steps, {:>8}  {}",
                Dur(round_secs(*dur)).to_string(),
                self.workload_detail(name)
            );
            if let Some(r) = self.workloads.request(name).filter(|r| !r.is_empty()) {
                // Over each target's own `request`, key by key; header values masked.
                let _ = writeln!(out, "    request: {}", r.summary());
            }
        }
    }

    /// The settings of workload `name` in one line; empty when it is not configured.
    fn workload_detail(&self, name: &str) -> String {
        let w = &self.workloads;
        match name {
            "concurrency_sweep" => w.concurrency_sweep.as_ref().map(|s| {
                format!(
                    "levels {:?}, ISL {} / OSL {}, step {}, warmup {}{}",
                    *s.levels,
                    *s.isl,
                    *s.osl,
                    *s.step,
                    *s.warmup,
                    open_loop(&s.rate)
                )
            }),
            "multi_turn" => w.multi_turn.as_ref().map(|m| {
                format!(
                    "{} conversations x {} turns, ISL {} / OSL {}, duration {}, think time {}",
                    *m.conversations, *m.turns, *m.isl, *m.osl, *m.duration, *m.think_time
                )
            }),
            "sequence_distribution" => w.sequence_distribution.as_ref().map(|d| {
                format!(
                    "{:?}, ISL {}-{} / OSL {}-{}, concurrency {}, step {}{}",
                    d.distributions
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>(),
                    *d.isl.min,
                    *d.isl.max,
                    *d.osl.min,
                    *d.osl.max,
                    *d.concurrency,
                    *d.step,
                    open_loop(&d.rate)
                )
            }),
            "prefix_cache" => w.prefix_cache.as_ref().map(|p| {
                format!(
                    "hit ratios {:?}, ISL {} / OSL {}, concurrency {}, step {}, block {}{}",
                    *p.hit_ratios,
                    *p.isl,
                    *p.osl,
                    *p.concurrency,
                    *p.step,
                    *p.block_size,
                    open_loop(&p.rate)
                )
            }),
            "trace_replay" => w.trace_replay.as_ref().map(|r| {
                let names: Vec<&str> = r.traces.iter().map(|t| t.name.as_str()).collect();
                format!(
                    "traces {names:?}, speed {}, sample {}, step {}, at most {} in flight",
                    *r.speed, *r.sample, *r.step, *r.max_inflight
                )
            }),
            "dataset" => w.dataset.as_ref().map(|d| {
                format!(
                    "file {}, concurrency {}, step {}, at most {} rows of {} turns{}",
                    *d.path,
                    *d.concurrency,
                    *d.step,
                    d.max_rows
                        .as_ref()
                        .map_or("all".to_owned(), |m| m.to_string()),
                    *d.max_turns,
                    d.osl
                        .as_ref()
                        .map_or(String::new(), |o| format!(", OSL {}", **o))
                )
            }),
            _ => None,
        }
        .unwrap_or_default()
    }

    /// One line per SLO: its kind, window and thresholds.
    fn summary_slos(&self, out: &mut String) {
        let _ = writeln!(out, "slos ({}):", self.slos.len());
        for s in &self.slos {
            let kind = match (&s.expr, &s.objective, &s.period) {
                (Some(_), _, _) => format!(
                    "expr, window {}, min_samples {}, for {}",
                    *s.window, *s.min_samples, *s.for_
                ),
                (None, Some(o), p) => format!(
                    "burn-rate {}% over {}",
                    **o,
                    p.as_ref()
                        .map(|p| p.to_string())
                        .unwrap_or_else(|| "30d".into())
                ),
                _ => String::new(),
            };
            let _ = writeln!(out, "  {:<28} {kind}", *s.name);
        }
    }
}

fn round_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_f64().round() as u64)
}
