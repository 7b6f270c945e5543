//! The plan the detection benchmark runs: `examples/seed-plan.yaml` with its targets replaced by
//! simulated deployments, and every duration and output length divided by the scale, so that its
//! cycle, its steps and its SLOs keep their proportions and each run of a step gives about as
//! many samples as the seed plan's.

use std::path::Path;

use llm_canary::setup::Setup;
use llm_canary::sim::{Bimodal, Variability};
use serde_json::{Value, json};

use super::{JITTER, RUN_SEED_SECONDS, SEED_PLAN, SLOW_CHANCE, SLOW_FACTOR};

/// The scaled plan's shape.
pub struct Shape {
    /// Every duration of the seed plan is divided by it, and every output length.
    pub scale: f64,
    /// The seed plan's cycle (its steps with their drains), seconds.
    pub seed_cycle: f64,
    /// The scaled plan's, simulated seconds (the upper bound `check` computes).
    pub cycle: f64,
    /// Cycles in a day (24 h) of the seed plan.
    pub day_cycles: u64,
    /// The SLOs, in the plan's order.
    pub slos: Vec<String>,
    /// The steady deployments' run-to-run variability, in simulated time.
    pub variability: Variability,
}

impl Shape {
    pub fn of(scale: f64) -> Shape {
        let seed = Setup::parse(SEED_PLAN, "examples/seed-plan.yaml", Path::new("examples"))
            .expect("the seed plan is valid");
        let seed_cycle = seed.config.cycle_upper_bound().as_secs_f64();
        let mut shape = Shape {
            scale,
            seed_cycle,
            cycle: seed_cycle / scale,
            day_cycles: (86_400.0 / seed_cycle).ceil() as u64,
            slos: seed.slos.iter().map(|d| d.name.clone()).collect(),
            variability: Variability {
                period: std::time::Duration::from_secs_f64(RUN_SEED_SECONDS / scale),
                bimodal: Some(Bimodal {
                    probability: SLOW_CHANCE,
                    factor: SLOW_FACTOR,
                }),
                jitter: JITTER,
                ..Variability::default()
            },
        };
        let scaled = Setup::parse(&scaled(&shape), "detection.yaml", Path::new("."))
            .expect("the scaled plan is valid");
        shape.cycle = scaled.config.cycle_upper_bound().as_secs_f64();
        shape
    }

    /// Seed-plan seconds of `simulated` seconds.
    pub fn seed_seconds(&self, simulated: f64) -> f64 {
        simulated * self.scale
    }
}

/// Seconds of a duration as the seed plan writes them (`120s`, `30m`, `24h`, `30d`).
pub fn seconds(text: &str) -> f64 {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number
        .parse()
        .unwrap_or_else(|_| panic!("duration {text:?}"));
    n * match unit.trim() {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        "w" => 604_800.0,
        other => panic!("unit {other:?} in {text:?}"),
    }
}

/// `seconds` as a duration every parser of the config takes.
fn ms(seconds: f64) -> String {
    format!("{}ms", (seconds * 1e3).round() as u64)
}

/// The scaled plan, as JSON (which the YAML reader takes).
pub fn scaled(shape: &Shape) -> String {
    let s = shape.scale;
    let mut plan: Value = serde_saphyr::from_str(SEED_PLAN).expect("the seed plan is YAML");
    plan["targets"] = targets(&plan["targets"], &shape.variability);
    let time_scale = plan["time_scale"].as_f64().unwrap_or(1.0);
    plan["time_scale"] = json!(time_scale / s);
    scale_output_lengths(&mut plan["workloads"], s);
    let drain = plan["schedule"]["drain_grace"]
        .as_str()
        .map_or(30.0, seconds);
    plan["schedule"]["drain_grace"] = json!(ms(drain / s));
    // The probe stream's default interval is 20 s.
    plan["probe_stream"] = json!({ "interval": ms(20.0 / s) });
    for slo in plan["slos"].as_array_mut().expect("slos") {
        scale_slo(slo, s);
    }
    // The bench serves nothing: no listener, no exporter.
    plan.as_object_mut().expect("a mapping").remove("export");
    serde_json::to_string(&plan).expect("JSON")
}

/// The seed plan's targets as simulated deployments of `examples/demo.yaml`'s hardware, each
/// with its own seed and the steady variability.
fn targets(seed: &Value, variability: &Variability) -> Value {
    let list = seed.as_array().expect("targets");
    let simulated = list
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut hardware = match t["serving_mode"].as_str() {
                Some("aggregated") => {
                    json!({ "workers": 4, "aggregated": { "gpu": "a100", "tp": 4 } })
                }
                _ => json!({
                    "prefill_workers": 4, "decode_workers": 4,
                    "prefill": { "gpu": "a100", "tp": 4 }, "decode": { "gpu": "l40s", "tp": 2 }
                }),
            };
            hardware["seed"] = json!(i as u64 + 1);
            hardware["variability"] = serde_json::to_value(variability).expect("JSON");
            let mut target = json!({ "simulated": hardware });
            for key in [
                "name",
                "serving_mode",
                "model",
                "api",
                "dialect",
                "cost_per_hour_usd",
            ] {
                if !t[key].is_null() {
                    target[key] = t[key].clone();
                }
            }
            target
        })
        .collect();
    Value::Array(simulated)
}

/// Every output length divided by `s` (at least one token): a step of `1/s` the time sends as
/// many requests.
fn scale_output_lengths(workloads: &mut Value, s: f64) {
    let div = |v: &mut Value| {
        if let Some(n) = v.as_f64() {
            *v = json!(((n / s).round() as u64).max(1));
        }
    };
    for w in ["concurrency_sweep", "multi_turn", "prefix_cache"] {
        div(&mut workloads[w]["osl"]);
    }
    div(&mut workloads["sequence_distribution"]["osl"]["min"]);
    div(&mut workloads["sequence_distribution"]["osl"]["max"]);
}

/// An SLO's window, `for`, burn-rate period and baseline spans divided by `s`.
fn scale_slo(slo: &mut Value, s: f64) {
    // The defaults of the keys the seed plan leaves out.
    for (key, default) in [("window", "30m"), ("for", "0s"), ("period", "30d")] {
        let is_burn = !slo["objective"].is_null();
        if key == "period" && !is_burn {
            continue;
        }
        let text = slo[key].as_str().unwrap_or(default).to_owned();
        slo[key] = json!(ms(seconds(&text) / s));
    }
    if let Some(expr) = slo["expr"].as_str() {
        let span = regex::Regex::new(
            r",\s*(\d+(?:\.\d+)?(?:ms|s|m|h|d|w))(?:\s+offset\s+(\d+(?:\.\d+)?(?:ms|s|m|h|d|w)))?\s*\)",
        )
        .unwrap();
        let found = span.find_iter(expr).count();
        assert_eq!(
            found,
            expr.matches("baseline(").count(),
            "every baseline span is found: {expr}"
        );
        let scaled = span.replace_all(expr, |c: &regex::Captures<'_>| match c.get(2) {
            Some(offset) => format!(
                ", {} offset {})",
                ms(seconds(&c[1]) / s),
                ms(seconds(offset.as_str()) / s)
            ),
            None => format!(", {})", ms(seconds(&c[1]) / s)),
        });
        slo["expr"] = json!(scaled);
    }
}

/// What was scaled, for the output's header.
pub fn describe(shape: &Shape) -> String {
    let s = shape.scale;
    format!(
        "detection benchmark: examples/seed-plan.yaml (its {n} SLOs, expressions unchanged but \
         for their baseline spans) scaled by 1/{s}: steps, warmups, drains, the probe interval \
         (20 s -> {probe:.2} s), SLO windows, `for`, baseline spans and burn-rate windows divided \
         by {s}, output lengths too (so a run of a step gives about the seed plan's number of \
         samples); ISLs and concurrencies unchanged.\n\
         cycle: seed plan {seed:.0} s at most (steps with their whole drains; {day} such cycles \
         make a day), scaled {cyc:.1} s simulated; drains end early, so each scenario counts \
         its cycles from the length of its first one.\n\
         deployments: simulated, examples/demo.yaml's hardware (aggregated 4 x A100x4; \
         disaggregated 4 x A100x4 prefill + 4 x L40Sx2 decode), each with bimodal run-to-run \
         variability: a run ({run:.0} s of the seed plan) is {slow} x slower with chance {p}, \
         +-{j:.0} % jitter per run.\n\
         goals (issue #39): 0 false state changes per day; every injected regression >= 20 % \
         caught within {g} cycles and reset within {g} cycles of its end; the 5 % error burst \
         pages once.",
        n = shape.slos.len(),
        probe = 20.0 / s,
        seed = shape.seed_cycle,
        cyc = shape.cycle,
        day = shape.day_cycles,
        run = super::RUN_SEED_SECONDS,
        slow = SLOW_FACTOR,
        p = SLOW_CHANCE,
        j = JITTER * 100.0,
        g = super::GOAL_CYCLES,
    )
}
