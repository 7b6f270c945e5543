//! What the plan costs the targets per hour (`llm-canary check`), against their budget: streams
//! in flight (exact), requests and tokens (estimated at a stated serving speed, since a
//! closed-loop step sends as fast as the target answers), the share of the hour the canary keeps
//! a deployment busy and what that share costs at `cost_per_hour_usd`, and what the budget
//! skips, paces or cuts.

use std::fmt::Write;
use std::time::Duration;

use super::budget::{Limits, ProbeAllowance, streams};
use super::plan::{StepKind, StepPlan, plan_cycle};
use crate::config::{Config, Pairing};

/// The serving speed request counts are estimated at: a first token after 300 ms, then 20 ms
/// per token (50 tokens/s per stream), the order of the benchmark plan's deployments under load.
/// A faster deployment gets more requests from a closed loop, a slower one fewer.
pub const ASSUMED_TTFT: Duration = Duration::from_millis(300);
pub const ASSUMED_ITL: Duration = Duration::from_millis(20);

/// One target's hour.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetCost {
    pub target: String,
    pub cycles_per_hour: f64,
    pub mean_in_flight: f64,
    pub peak_in_flight: u32,
    pub requests_per_hour: f64,
    pub prompt_tokens_per_hour: f64,
    pub output_tokens_per_hour: f64,
    /// The share of the hour with canary traffic in flight.
    pub busy_fraction: f64,
    /// `cost_per_hour_usd` × `busy_fraction`: the deployment's time the canary occupies.
    pub cost_usd_per_hour: Option<f64>,
    /// Whether any budget limit applies to the target.
    pub limited: bool,
    /// What the budget does to the plan, one line each.
    pub budget: Vec<String>,
}

/// Mean output and prompt tokens of one request of `plan`.
fn mean_lengths(plan: &StepPlan) -> (f64, f64) {
    match &plan.kind {
        StepKind::Sweep { isl, osl, .. } | StepKind::Prefix { isl, osl, .. } => {
            (f64::from(*osl), f64::from(*isl))
        }
        StepKind::Distribution { isl, osl, .. } => (
            f64::from(osl.0 + osl.1) / 2.0,
            f64::from(isl.0 + isl.1) / 2.0,
        ),
        // Turn k resends the k - 1 earlier exchanges: on average (turns + 1) / 2 of them.
        StepKind::MultiTurn {
            turns, isl, osl, ..
        } => (
            f64::from(*osl),
            f64::from(*isl + *osl) * f64::from(*turns + 1) / 2.0,
        ),
        // Read from the trace by `trace_shape`.
        StepKind::Trace { .. } => (0.0, 0.0),
        // Read from the dataset by `dataset_lengths`.
        StepKind::Dataset { .. } => (0.0, 0.0),
    }
}

/// A dataset step's mean output and prompt lengths per request, from the reading `check` made
/// of it (the file is not read again here); `None` for other steps, or when there is none.
fn dataset_lengths(plan: &StepPlan, seed: u64) -> Option<(f64, f64)> {
    let (path, format, selection) = plan.dataset_selection(seed)?;
    let d = crate::workload::dataset::Dataset::kept_reading(
        std::path::Path::new(path),
        format,
        &selection,
    )?;
    let turns = d.conversations.iter().flat_map(|c| &c.turns);
    let n = d.turns().max(1) as f64;
    let (osl, isl) = turns.fold((0.0, 0.0), |(o, i), t| {
        (o + f64::from(t.osl), i + f64::from(t.isl))
    });
    Some((osl / n, isl / n))
}

/// A trace step's mean output and prompt lengths and its request rate, from the trace as the step
/// will replay it; `None` for other steps (or a trace that cannot be read, which `check` reports).
fn trace_shape(plan: &StepPlan, seed: u64) -> Option<(f64, f64, f64)> {
    let StepKind::Trace { speed, .. } = &plan.kind else {
        return None;
    };
    let trace = plan.trace(seed)?.ok()?;
    let n = trace.rows.len().max(1) as f64;
    let mean = |f: fn(&crate::workload::trace::TraceRow) -> u32| {
        trace.rows.iter().map(|r| f64::from(f(r))).sum::<f64>() / n
    };
    let seconds = trace.span.as_secs_f64().max(1.0) / speed;
    Some((
        mean(|r| r.output_length),
        mean(|r| r.input_length),
        n / seconds,
    ))
}

fn request_seconds(plan: &StepPlan, osl: f64) -> f64 {
    let think = match &plan.kind {
        StepKind::MultiTurn { think_time, .. } => think_time.as_secs_f64(),
        _ => 0.0,
    };
    ASSUMED_TTFT.as_secs_f64() + osl * ASSUMED_ITL.as_secs_f64() + think
}

/// The hour of every configured target (discovered ones share the global budget only).
pub fn plan_cost(cfg: &Config) -> Vec<TargetCost> {
    let plan = plan_cycle(cfg);
    let global = Limits::from(&cfg.budget);
    let n = cfg.targets.len().max(1);
    // Sequential pairing runs each step once per target, one after another.
    let turns = if cfg.schedule.pairing == Pairing::Sequential {
        n as u32
    } else {
        1
    };
    // The drains are left out: a drain lasts until the step's last request ends, seconds.
    let sending: Duration = plan.iter().map(|p| (p.warmup + p.steady) * turns).sum();
    let cycle = sending + cfg.schedule.cycle_pause.0;
    let cycles = if cycle.is_zero() {
        0.0
    } else {
        3600.0 / cycle.as_secs_f64()
    };
    cfg.targets
        .iter()
        .map(|t| {
            let own = Limits::from(&t.budget);
            let mut budget = Vec::new();
            let (mut stream_seconds, mut busy, mut peak) = (0.0, 0.0, 0u32);
            let (mut requests, mut prompt, mut output) = (0.0, 0.0, 0.0);
            for p in &plan {
                let need = streams(p);
                let cap = [own.max_inflight, global.max_inflight].into_iter().flatten().min();
                if let Some(cap) = cap.filter(|c| need > *c) {
                    budget.push(format!("skips {} ({need} streams > max_inflight {cap})", p.name()));
                    continue;
                }
                let secs = (p.warmup + p.steady).as_secs_f64();
                let trace = trace_shape(p, cfg.seed);
                let (osl, isl) = trace.map_or_else(
                    || dataset_lengths(p, cfg.seed).unwrap_or_else(|| mean_lengths(p)),
                    |(o, i, _)| (o, i),
                );
                let mut rps = match (p.rate, trace) {
                    (_, Some((_, _, rps))) => rps,
                    (Some(r), None) => r.rps,
                    (None, None) => f64::from(need) / request_seconds(p, osl),
                };
                let rps_cap = [own.max_rps, global.max_rps.map(|g| g / n as f64)]
                    .into_iter()
                    .flatten()
                    .reduce(f64::min);
                if let Some(cap) = rps_cap.filter(|c| rps > *c) {
                    budget.push(format!("paces {} from ≈{rps:.1} to {cap} requests/s", p.name()));
                    rps = cap;
                }
                // Arrivals (open loop, a trace) keep about rate × request time in flight, at
                // most their cap; a closed loop keeps every stream busy.
                let streams = if p.rate.is_some() || trace.is_some() {
                    (rps * request_seconds(p, osl)).min(f64::from(need))
                } else {
                    f64::from(need)
                };
                stream_seconds += streams * secs;
                busy += secs;
                peak = peak.max(streams.ceil() as u32);
                requests += rps * secs;
                prompt += rps * secs * isl;
                output += rps * secs * osl;
            }
            let per_hour = |x: f64| x * cycles;
            let output_tokens_per_hour = per_hour(output);
            // The probe stream's allowance comes off the top of each scope; the steps share the
            // rest (`budget::ProbeAllowance`).
            let probes = ProbeAllowance::of(&cfg.probe_stream).tokens_per_hour;
            let token_cap = [
                own.max_output_tokens_per_hour.map(|c| c.saturating_sub(probes)),
                global
                    .max_output_tokens_per_hour
                    .map(|c| c.saturating_sub(probes.saturating_mul(n as u64))),
            ]
            .into_iter()
            .flatten()
            .min();
            if let Some(cap) = token_cap.filter(|c| output_tokens_per_hour > *c as f64) {
                budget.push(format!(
                    "spends the steps' {cap} of max_output_tokens_per_hour ({probes} more kept for the probe stream) after ≈{:.0} min of each hour, then waits",
                    60.0 * cap as f64 / output_tokens_per_hour
                ));
            }
            let busy_fraction = (per_hour(busy) / 3600.0).min(1.0);
            TargetCost {
                target: t.name.value.clone(),
                cycles_per_hour: cycles,
                mean_in_flight: if cycle.is_zero() {
                    0.0
                } else {
                    stream_seconds / cycle.as_secs_f64()
                },
                peak_in_flight: peak,
                requests_per_hour: per_hour(requests),
                prompt_tokens_per_hour: per_hour(prompt),
                output_tokens_per_hour,
                busy_fraction,
                cost_usd_per_hour: t.cost_per_hour_usd.as_ref().map(|c| **c * busy_fraction),
                limited: !own.is_empty() || !global.is_empty(),
                budget,
            }
        })
        .collect()
}

/// The file descriptors a plan holds at its peak, by what holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptors {
    /// Connections to the configured targets: each target's peak streams, its probe stream and
    /// its server-metrics scrape. Summed over the targets whatever the pairing: a target's
    /// connections stay in its pool, idle, while another target runs.
    pub targets: u64,
    /// The server side of those connections, for the targets simulated in this process.
    pub simulators: u64,
    /// Connections the canary's own HTTP port admits.
    pub port: u64,
    /// The rest of the process ([`crate::fds::RESERVED`]).
    pub reserved: u64,
}

impl Descriptors {
    pub fn total(&self) -> u64 {
        self.targets + self.simulators + self.port + self.reserved
    }
}

/// What the configured targets of `cfg` need at the plan's peak, with `port` connections to
/// the canary's own port (discovered targets are not known before they are found).
pub fn descriptors(cfg: &Config, port: u64) -> Descriptors {
    // Besides the streams: the probe stream's connection and the scrape's.
    const PER_TARGET: u64 = 2;
    let (mut targets, mut simulators) = (0, 0);
    for (t, cost) in cfg.targets.iter().zip(plan_cost(cfg)) {
        let held = u64::from(cost.peak_in_flight) + PER_TARGET;
        targets += held;
        if t.simulated.is_some() {
            simulators += held;
        }
    }
    Descriptors {
        targets,
        simulators,
        port,
        reserved: crate::fds::RESERVED,
    }
}

/// The `check` line of the plan's descriptors against the limit the process may raise itself to.
pub fn render_descriptors(need: &Descriptors, hard_limit: u64) -> String {
    let limit = if hard_limit == u64::MAX {
        "no limit".to_owned()
    } else {
        format!("the hard limit {hard_limit}")
    };
    format!(
        "file descriptors at the peak: ≈{} ({} to targets, {} of in-process simulators, {} for \
         the HTTP port, {} for the rest); `run` and `bench` raise the open-file limit to {limit}\n",
        need.total(),
        need.targets,
        need.simulators,
        need.port,
        need.reserved
    )
}

/// `12.3k`, `4.56M`: counts the way a capacity plan reads them.
fn short(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.2}G", x / 1e9),
        x if x >= 1e6 => format!("{:.2}M", x / 1e6),
        x if x >= 1e4 => format!("{:.1}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

/// The `check` section: one block per target.
pub fn render(cfg: &Config) -> String {
    let costs = plan_cost(cfg);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "traffic per target and hour (requests and tokens estimated at TTFT {:?} and ITL {:?} per stream; a faster deployment gets more):",
        ASSUMED_TTFT, ASSUMED_ITL
    );
    for c in &costs {
        let _ = write!(
            out,
            "  {:<14} {:.2} cycles, in flight mean {:.1} peak {}, ≈{} requests, ≈{} prompt + ≈{} output tokens, busy {:.0} % of the hour",
            c.target,
            c.cycles_per_hour,
            c.mean_in_flight,
            c.peak_in_flight,
            short(c.requests_per_hour),
            short(c.prompt_tokens_per_hour),
            short(c.output_tokens_per_hour),
            c.busy_fraction * 100.0
        );
        if let Some(usd) = c.cost_usd_per_hour {
            let _ = write!(out, " (${usd:.2}/h of the deployment)");
        }
        out.push('\n');
        if !c.limited {
            let _ = writeln!(
                out,
                "  {:<14} budget: none (`budget:` caps streams, requests/s and output tokens/hour)",
                ""
            );
        } else if c.budget.is_empty() {
            let _ = writeln!(out, "  {:<14} budget: the plan fits in it", "");
        }
        for line in &c.budget {
            let _ = writeln!(out, "  {:<14} budget: {line}", "");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> Config {
        Config::load(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/seed-plan.yaml"
        )))
        .unwrap()
    }

    #[test]
    fn the_seed_plan_keeps_about_sixteen_streams_in_flight() {
        let costs = plan_cost(&seed());
        assert_eq!(costs.len(), 2);
        let c = &costs[0];
        // 15 steps of 2 min and one of 5: a 35-minute cycle.
        assert!((c.cycles_per_hour - 60.0 / 35.0).abs() < 1e-9, "{c:?}");
        assert_eq!(c.peak_in_flight, 64);
        // (1+2+4+8+16+32+64) x 120 s + 8 x 300 s + 8 x 16 x 120 s over 2,100 s: 15.7.
        let expected = (127.0 * 120.0 + 8.0 * 300.0 + 8.0 * 16.0 * 120.0) / 2100.0;
        assert!(
            (c.mean_in_flight - expected).abs() < 1e-9,
            "{}",
            c.mean_in_flight
        );
        assert!((c.mean_in_flight - 15.7).abs() < 0.05);
        assert!(
            c.requests_per_hour > 1000.0 && c.output_tokens_per_hour > 1e5,
            "{c:?}"
        );
        assert!(c.budget.is_empty());
    }

    #[test]
    fn descriptors_count_every_targets_peak_and_the_simulators_side() {
        // The seed plan: two remote targets, each at a peak of 64 streams.
        let cfg = seed();
        let d = descriptors(&cfg, 256);
        assert_eq!(d.targets, 2 * (64 + 2), "{d:?}");
        assert_eq!(d.simulators, 0, "{d:?}");
        assert_eq!(d.total(), 2 * 66 + 256 + crate::fds::RESERVED);
        // The budget's cap lowers the peak, and with it the need.
        let mut capped = seed();
        capped.budget.max_inflight = Some(crate::config::At::dflt(32));
        assert_eq!(descriptors(&capped, 0).targets, 2 * (32 + 2));
        // A simulator in this process holds the other end of each of its connections.
        let demo = Config::demo();
        let d = descriptors(&demo, 0);
        assert!(d.simulators > 0 && d.simulators == d.targets, "{d:?}");
        let line = render_descriptors(&d, 4096);
        assert!(line.contains(&format!("≈{}", d.total())), "{line}");
        assert!(line.contains("hard limit 4096"), "{line}");
    }

    #[test]
    fn the_budget_shows_what_it_skips_paces_and_cuts() {
        let mut cfg = seed();
        cfg.budget.max_inflight = Some(crate::config::At::dflt(32));
        cfg.targets[0].budget.max_rps = Some(crate::config::At::dflt(1.0));
        cfg.targets[0].budget.max_output_tokens_per_hour = Some(crate::config::At::dflt(100_000));
        let costs = plan_cost(&cfg);
        let lines = costs[0].budget.join("\n");
        assert!(
            lines.contains("skips concurrency_sweep concurrency=64"),
            "{lines}"
        );
        assert!(lines.contains("to 1 requests/s"), "{lines}");
        // 180 of the hour's tokens are the probe stream's.
        assert!(
            lines.contains("the steps' 99820 of max_output_tokens_per_hour (180 more kept"),
            "{lines}"
        );
        assert_eq!(costs[0].peak_in_flight, 32);
        assert!(
            costs[1].budget.iter().all(|l| !l.contains("paces")),
            "{:?}",
            costs[1].budget
        );
        let text = render(&cfg);
        assert!(text.contains("budget: skips"), "{text}");
    }
}
