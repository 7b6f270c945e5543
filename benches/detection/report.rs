//! What the detection benchmark prints: per scenario the SLOs that changed or should have, each
//! figure next to its goal; then per SLO over every scenario; and the same as JSON lines.

use serde_json::json;

use super::alerting::{Role, Score};
use super::measure::emit_json;
use super::plan::Shape;
use super::scenarios::{Lasts, Scenario};
use super::{C32Run, GOAL_CYCLES, Run};

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// Seed-plan days a run covered.
/// The seed-plan days a run scored: from the end of its learning cycles to its end.
fn days(shape: &Shape, run: &Run, sc: &Scenario) -> f64 {
    shape.seed_seconds(run.run_end - run.learned(sc.before)) / 86_400.0
}

fn cycles(seconds: Option<f64>, cycle: f64) -> Option<f64> {
    seconds.map(|s| s / cycle)
}

fn cell(cycles: Option<f64>, applies: bool) -> String {
    match (applies, cycles) {
        (false, _) => "-".into(),
        (true, None) => "never (MISSED)".into(),
        (true, Some(c)) => format!("{c:.2} ({})", met(c <= GOAL_CYCLES)),
    }
}

fn role(r: Role) -> &'static str {
    match r {
        Role::Expected => "expected",
        Role::Allowed => "allowed",
        Role::Unaffected => "unaffected",
    }
}

/// The concurrency-32 step's TTFT p50 per run and target, the samples a run gives, and the
/// p50's mean before and while the injection lasted.
fn c32_lines(sc: &Scenario, run: &Run) -> Vec<String> {
    let mut targets: Vec<&str> = run.c32.iter().map(|r| r.target.as_str()).collect();
    targets.sort_unstable();
    targets.dedup();
    let during = match sc.lasts {
        Lasts::Cycles(n) => n,
        Lasts::SeedSeconds(_) => 1,
        Lasts::ToTheEnd => u64::MAX - sc.before,
    };
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    targets
        .into_iter()
        .map(|t| {
            let runs: Vec<&C32Run> = run.c32.iter().filter(|r| r.target == t).collect();
            let series: Vec<String> = runs
                .iter()
                .map(|r| format!("{:.0}", r.ttft_p50_ms))
                .collect();
            let p50s = |keep: &dyn Fn(u64) -> bool| {
                mean(
                    runs.iter()
                        .filter(|r| keep(r.cycle))
                        .map(|r| r.ttft_p50_ms)
                        .collect(),
                )
            };
            let before = p50s(&|c| c < sc.before);
            let injected = p50s(&|c| (sc.before..sc.before + during).contains(&c));
            let effect = match (before, injected, run.injected) {
                (Some(b), Some(i), Some(_)) => format!(
                    "; mean {b:.1} ms before the injection, {i:.1} ms while it lasted (x{:.3})",
                    i / b
                ),
                _ => String::new(),
            };
            let samples = runs.iter().map(|r| r.samples);
            format!(
                "  c=32 TTFT p50 by run, {t} (ms): {}{effect}; samples per run {}-{}",
                series.join(" "),
                samples.clone().min().unwrap_or(0),
                samples.max().unwrap_or(0)
            )
        })
        .collect()
}

/// Prints one scenario's block and writes its JSON lines.
pub fn scenario(
    sc: &Scenario,
    shape: &Shape,
    run: &Run,
    scored: &[(String, Score)],
    json: &Option<String>,
) {
    let cycle = run.cycle(shape.cycle);
    let d = days(shape, run, sc);
    println!("\n== {}: {}", sc.name, sc.what);
    println!(
        "  {} cycles of {cycle:.1} s simulated ({:.1} min of the seed plan), the first {} learning: \
         {:.2} days of the seed plan scored; wall {:.0} s, {:.0} CPU-s, {} requests ({} of the \
         probe stream)",
        run.cycles,
        shape.seed_seconds(cycle) / 60.0,
        sc.before,
        d,
        run.wall,
        run.cpu,
        run.requests,
        run.probes
    );
    if let Some(at) = run.injected {
        let end = run.ended.map_or("lasted to the end".into(), |e| {
            format!("ended at cycle {:.2}", e / cycle)
        });
        println!("  injected at cycle {:.2}, {end}", at / cycle);
    }
    for line in c32_lines(sc, run) {
        println!("{line}");
    }
    let alerts: usize = scored.iter().map(|(_, s)| s.alerts).sum();
    let goal = sc.expect.len();
    println!(
        "  alerts (changes to fail after the first verdicts, or with the regression): {alerts}, goal {goal} ({})",
        met(alerts == goal)
    );
    println!(
        "  | SLO | role | first verdict (cycle) | changes learning | changes | false (per day) \
         | goal 0 | caught | detection (cycles, goal <= {GOAL_CYCLES}) | reset (cycles, goal <= \
         {GOAL_CYCLES}) |"
    );
    println!("  | --- | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |");
    let mut quiet = 0;
    for (name, s) in scored {
        emit_json(json, score_json(sc, shape, run, name, s));
        let expected = s.role == Role::Expected;
        if s.role == Role::Unaffected
            && s.changes + s.learning_changes == 0
            && s.first_verdict.is_some()
        {
            quiet += 1;
            continue;
        }
        let caught = match s.caught {
            None => "-".into(),
            Some(c) => format!("{}/1 ({})", u8::from(c), met(c)),
        };
        println!(
            "  | {name} | {} | {} | {} | {} | {} ({:.2}) | {} | {caught} | {} | {} |",
            role(s.role),
            s.first_verdict
                .map_or("never".into(), |t| format!("{:.2}", t / cycle)),
            s.learning_changes,
            s.changes,
            s.false_changes,
            s.false_changes as f64 / d,
            met(s.false_changes == 0),
            cell(
                cycles(s.detection, cycle),
                expected && run.injected.is_some()
            ),
            cell(
                cycles(s.reset, cycle),
                expected && s.caught == Some(true) && run.ended.is_some()
            ),
        );
    }
    println!("  the other {quiet} SLOs: no change after their first verdict, learning included");
}

fn score_json(sc: &Scenario, shape: &Shape, run: &Run, slo: &str, s: &Score) -> serde_json::Value {
    let cycle = run.cycle(shape.cycle);
    json!({
        "bench": "detection",
        "scenario": sc.name,
        "slo": slo,
        "role": role(s.role),
        "scale": shape.scale,
        "cycles": run.cycles,
        "cycle_seconds_simulated": cycle,
        "days": days(shape, run, sc),
        "learning_cycles": sc.before,
        "learning_changes": s.learning_changes,
        "first_verdict_cycle": cycles(s.first_verdict, cycle),
        "changes": s.changes,
        "false_changes": s.false_changes,
        "false_changes_per_day": s.false_changes as f64 / days(shape, run, sc),
        "alerts": s.alerts,
        "caught": s.caught,
        "detection_cycles": cycles(s.detection, cycle),
        "reset_cycles": cycles(s.reset, cycle),
        "wall_seconds": run.wall,
        "cpu_seconds": run.cpu,
        "machine": super::measure::machine_state(),
    })
}

/// One SLO over every scenario.
#[derive(Default, Clone)]
struct SloTotal {
    false_changes: usize,
    learning_changes: usize,
    expected: usize,
    caught: usize,
    /// The slowest detection and reset, cycles; `f64::INFINITY`: one never came.
    detection: Option<f64>,
    reset: Option<f64>,
}

pub struct Totals {
    slos: Vec<(String, SloTotal)>,
    days: f64,
}

impl Totals {
    pub fn new(shape: &Shape) -> Totals {
        Totals {
            slos: shape
                .slos
                .iter()
                .map(|n| (n.clone(), SloTotal::default()))
                .collect(),
            days: 0.0,
        }
    }

    pub fn add(&mut self, sc: &Scenario, shape: &Shape, run: &Run, scored: &[(String, Score)]) {
        let cycle = run.cycle(shape.cycle);
        self.days += days(shape, run, sc);
        let worst = |a: Option<f64>, b: f64| Some(a.map_or(b, |a| a.max(b)));
        for ((_, total), (_, s)) in self.slos.iter_mut().zip(scored) {
            total.false_changes += s.false_changes;
            total.learning_changes += s.learning_changes;
            if s.role != Role::Expected || run.injected.is_none() {
                continue;
            }
            total.expected += 1;
            total.caught += usize::from(s.caught == Some(true));
            let d = cycles(s.detection, cycle).unwrap_or(f64::INFINITY);
            total.detection = worst(total.detection, d);
            if s.caught == Some(true) && run.ended.is_some() {
                let r = cycles(s.reset, cycle).unwrap_or(f64::INFINITY);
                total.reset = worst(total.reset, r);
            }
        }
    }

    pub fn print(&self, json: &Option<String>) {
        println!(
            "\n== per SLO, over every scenario ({:.2} days of the seed plan scored, after each \
             scenario's learning cycles)",
            self.days
        );
        println!(
            "| SLO | changes while learning | false changes | per day (goal 0) | regressions caught \
             | slowest detection (cycles, goal <= {GOAL_CYCLES}) | slowest reset (cycles, goal <= \
             {GOAL_CYCLES}) |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        let show = |c: Option<f64>| match c {
            None => "-".to_owned(),
            Some(c) if c.is_infinite() => "never (MISSED)".to_owned(),
            Some(c) => format!("{c:.2} ({})", met(c <= GOAL_CYCLES)),
        };
        for (name, t) in &self.slos {
            let per_day = t.false_changes as f64 / self.days;
            let caught = if t.expected == 0 {
                "-".to_owned()
            } else {
                format!(
                    "{}/{} ({})",
                    t.caught,
                    t.expected,
                    met(t.caught == t.expected)
                )
            };
            println!(
                "| {name} | {} | {} | {per_day:.2} ({}) | {caught} | {} | {} |",
                t.learning_changes,
                t.false_changes,
                met(t.false_changes == 0),
                show(t.detection),
                show(t.reset),
            );
            emit_json(
                json,
                json!({
                    "bench": "detection",
                    "scenario": "all",
                    "slo": name,
                    "days": self.days,
                    "false_changes": t.false_changes,
                    "false_changes_per_day": per_day,
                    "learning_changes": t.learning_changes,
                    "expected": t.expected,
                    "caught": t.caught,
                    "slowest_detection_cycles": t.detection.filter(|c| c.is_finite()),
                    "slowest_reset_cycles": t.reset.filter(|c| c.is_finite()),
                }),
            );
        }
    }
}
