//! The scenarios of the detection benchmark and their ground truth: what is injected into which
//! deployment and when, and which SLOs should change (the rest changing is false).

use std::time::Duration;

use llm_canary::setup::Setup;
use llm_canary::sim::{ErrorFault, FaultSpec, SimHandle, Variability};
use tokio::sync::watch;
use tokio::time::Instant;

use super::alerting::Role;
use super::plan::Shape;

/// Cycles every scenario runs steady first: the engine learns the deployments' runs (a
/// rolling baseline needs `MIN_BASELINE_RUNS` earlier runs, the newest left out, before a run
/// can fail against it, and judges a run against the past run closest to it, so each mode must
/// have run once). State changes in these cycles are shown apart, not scored: a mode the
/// canary has not yet seen cannot be told from a regression. Twenty runs show a mode that a
/// run lands in one time in four with 99.7 % probability.
pub const LEARNING_CYCLES: u64 = 20;

/// The deployments, in the seed plan's order of targets.
pub const AGG: usize = 0;
pub const DISAGG: usize = 1;

/// The regression SLOs (`p50 <= 1.1 * baseline(p50, 24h)` at concurrency 32), per mode.
const REGRESSION_AGG: &str = "ttft-regression-aggregated";
/// The drift SLOs (`p50 <= 1.1 * baseline(p50, 24h offset 1d)`, the day before), per mode.
const DRIFT_AGG: &str = "ttft-drift-aggregated";
/// The probe stream's 6 h objective: a slow burn's, whose verdict holds a fault for its window.
const AVAILABILITY: &str = "ttft-availability";
/// The steps' own traffic over 30 min: the one that pages a burst of errors.
const STEP_AVAILABILITY: &str = "step-availability";

/// The comparisons across the modes: when one mode regresses, what they compare really moves,
/// so their changes are neither required nor false.
const ACROSS_MODES: [&str; 3] = [
    "disagg-ttft-gain-c32-isl1024",
    "cost-per-mtok-disagg-le-agg-c64",
    "disagg-no-ttft-loss-short-isl",
];

/// Every SLO that reads the disaggregated deployment (a partial outage there thins and faults
/// its steps).
const READS_DISAGG: [&str; 9] = [
    "disagg-ttft-gain-c32-isl1024",
    "cost-per-mtok-disagg-le-agg-c64",
    "prefix-cache-ttft-linear-disaggregated",
    "kv-transfer-share-short-isl",
    "disagg-no-ttft-loss-short-isl",
    "ttft-p99-disaggregated",
    "itl-p99-disaggregated",
    "ttft-regression-disaggregated",
    "ttft-drift-disaggregated",
];

/// What a scenario does to the deployments.
pub enum Injection {
    Nothing,
    /// Every pass of one deployment `by` times longer (TTFT and ITL alike, as a slower
    /// release or a throttled GPU), on top of its steady variability.
    Slower {
        target: usize,
        by: f64,
    },
    /// One deployment's passes grow by `per_seed_hour` (compounding) every hour of the seed
    /// plan.
    Drift {
        target: usize,
        per_seed_hour: f64,
    },
    /// These faults on these deployments.
    Faults {
        targets: Vec<usize>,
        faults: FaultSpec,
    },
    /// One deployment's simulator stops (open connections finish, new ones are refused) and
    /// starts again on its port, its caches empty.
    Restart {
        target: usize,
    },
}

/// How long an injection lasts.
pub enum Lasts {
    /// This many cycles, from a cycle's start.
    Cycles(u64),
    /// This many seconds of the seed plan.
    SeedSeconds(f64),
    /// Until the run ends.
    ToTheEnd,
}

pub struct Scenario {
    pub name: &'static str,
    pub what: String,
    pub injection: Injection,
    /// Steady cycles before the injection: verdicts and baselines settle ([`LEARNING_CYCLES`]).
    pub before: u64,
    /// Seed-plan seconds into the first injected cycle at which the injection starts.
    pub offset: f64,
    pub lasts: Lasts,
    /// Cycles after the injection ended, for the verdicts to come back.
    pub after: u64,
    /// Seed-plan seconds the run covers at least after its `before` cycles (in whole cycles).
    pub min_seed_seconds: f64,
    /// Seed-plan seconds from the injection's start to when the ground truth calls it a
    /// regression to catch (0 but for a drift, which needs time to reach 20 %).
    pub due_after: f64,
    /// The SLOs that must change to `fail` while it lasts and back after it.
    pub expect: Vec<&'static str>,
    /// The SLOs the injection really changes the inputs of ([`Role::Allowed`]).
    pub allowed: Vec<&'static str>,
}

impl Scenario {
    /// Cycles the scenario runs when a cycle lasts `cycle` seconds of the seed plan: its
    /// phases, and enough to cover `min_seed_seconds` and, for a drift, the cycles to catch it
    /// once it is due. Cycles end early when their drains do, so the count follows the first
    /// cycle's measured length rather than the plan's upper bound.
    pub fn cycles(&self, cycle: f64) -> u64 {
        let lasting = match self.lasts {
            Lasts::Cycles(n) => n,
            Lasts::SeedSeconds(_) => 1,
            Lasts::ToTheEnd => 0,
        };
        let planned = self.before + lasting + self.after;
        let by_time = self.before + (self.min_seed_seconds / cycle).ceil() as u64;
        let by_due = match self.lasts {
            Lasts::ToTheEnd => self.before + (self.due_after / cycle).ceil() as u64 + GOAL_AFTER,
            _ => 0,
        };
        planned.max(by_time).max(by_due)
    }

    pub fn role(&self, slo: &str) -> Role {
        if self.expect.contains(&slo) {
            Role::Expected
        } else if self.allowed.contains(&slo) {
            Role::Allowed
        } else {
            Role::Unaffected
        }
    }

    /// The ground truth names the plan's SLOs: a renamed one fails here, not silently.
    pub fn check(&self, shape: &Shape) {
        for name in self.expect.iter().chain(&self.allowed) {
            assert!(
                shape.slos.iter().any(|s| s == name),
                "scenario {}: no SLO {name} in the seed plan",
                self.name
            );
        }
    }
}

fn slower(by: f64) -> Scenario {
    Scenario {
        name: if by >= 1.25 {
            "ttft+25%-aggregated"
        } else {
            "ttft+20%-aggregated"
        },
        what: format!(
            "every pass of the aggregated deployment {:.0} % longer for 3 cycles (its TTFT and \
             ITL alike), after the steady learning cycles, then 3 cycles to reset",
            (by - 1.0) * 100.0
        ),
        injection: Injection::Slower { target: AGG, by },
        before: LEARNING_CYCLES,
        offset: 0.0,
        lasts: Lasts::Cycles(3),
        after: 3,
        min_seed_seconds: 0.0,
        due_after: 0.0,
        expect: vec![REGRESSION_AGG],
        // The day-before comparison reads the same step: its catch is a true one too.
        allowed: [&ACROSS_MODES[..], &[DRIFT_AGG]].concat(),
    }
}

/// The scenarios, longest first.
pub fn all() -> Vec<Scenario> {
    let hour = 3600.0;
    // A drift of 1 %/h reaches the 20 % the regression SLOs are written for after 18.3 h.
    let drift_due = 1.2f64.ln() / 1.01f64.ln() * hour;
    // The concurrency-32 step of the sweep begins after five steps and their drains.
    let c32 = 5.0 * 150.0;
    vec![
        Scenario {
            name: "steady",
            what: "both deployments steady (bimodal runs) for two days of the seed plan after \
                   learning, so that the day-before comparisons, which decide from the second \
                   day on, are scored over a day too"
                .into(),
            injection: Injection::Nothing,
            before: LEARNING_CYCLES,
            offset: 0.0,
            lasts: Lasts::Cycles(0),
            after: 0,
            min_seed_seconds: 2.0 * 86_400.0,
            due_after: 0.0,
            expect: vec![],
            allowed: vec![],
        },
        Scenario {
            name: "drift+1%/h-aggregated",
            what: format!(
                "the aggregated deployment's passes 1 % longer every hour (compounding) once \
                 the learning cycles are over; it reaches +20 % after {:.1} h, and runs {GOAL_AFTER} cycles more",
                drift_due / hour
            ),
            injection: Injection::Drift {
                target: AGG,
                per_seed_hour: 0.01,
            },
            before: LEARNING_CYCLES,
            offset: 0.0,
            lasts: Lasts::ToTheEnd,
            after: 0,
            min_seed_seconds: 0.0,
            due_after: drift_due,
            // A baseline of the runs closest to each run follows a slow drift by design; the
            // day-before comparison is the one that catches it.
            expect: vec![DRIFT_AGG],
            allowed: [&ACROSS_MODES[..], &[REGRESSION_AGG]].concat(),
        },
        slower(1.25),
        slower(1.20),
        Scenario {
            name: "error-burst-5%",
            what: "5 % of all requests to both deployments answered 503 for 10 minutes, from the \
                   start of the concurrency-32 step of the first cycle after learning"
                .into(),
            injection: Injection::Faults {
                targets: vec![AGG, DISAGG],
                faults: errors(0.05),
            },
            before: LEARNING_CYCLES,
            offset: c32,
            lasts: Lasts::SeedSeconds(600.0),
            after: 3,
            min_seed_seconds: 0.0,
            due_after: 0.0,
            expect: vec![STEP_AVAILABILITY],
            allowed: vec![AVAILABILITY],
        },
        Scenario {
            name: "partial-outage-disaggregated",
            what: "30 % of the disaggregated deployment's requests answered 503 for one cycle"
                .into(),
            injection: Injection::Faults {
                targets: vec![DISAGG],
                faults: errors(0.3),
            },
            before: LEARNING_CYCLES,
            offset: 0.0,
            lasts: Lasts::Cycles(1),
            after: 3,
            min_seed_seconds: 0.0,
            due_after: 0.0,
            expect: vec![STEP_AVAILABILITY],
            allowed: [&READS_DISAGG[..], &[AVAILABILITY]].concat(),
        },
        Scenario {
            name: "restart-disaggregated",
            what: "the disaggregated simulator stops and starts again 2 minutes later (a pod \
                   restart), 30 s into the concurrency-32 step of the first cycle after learning: an outage, no latency regression"
                .into(),
            injection: Injection::Restart { target: DISAGG },
            before: LEARNING_CYCLES,
            offset: c32 + 30.0,
            lasts: Lasts::SeedSeconds(120.0),
            after: 3,
            min_seed_seconds: 0.0,
            due_after: 0.0,
            expect: vec![],
            // Two minutes of refused connections are a real outage, not a latency regression:
            // the availability objectives and what reads the deployment's thinned steps may see
            // it.
            allowed: [&READS_DISAGG[..], &[STEP_AVAILABILITY, AVAILABILITY]].concat(),
        },
    ]
}

/// Cycles a run goes on after a drift became due: the detection goal.
const GOAL_AFTER: u64 = super::GOAL_CYCLES as u64 + 1;

fn errors(rate: f64) -> FaultSpec {
    FaultSpec {
        error: Some(ErrorFault { rate, status: 503 }),
        ..FaultSpec::default()
    }
}

/// Applies the scenario's injection at its time and takes it away at its end; returns when it
/// began and ended (`None`: nothing injected, or it lasted to the end).
pub async fn inject(
    sc: &Scenario,
    shape: &Shape,
    setup: &Setup,
    sims: &mut Vec<SimHandle>,
    mut cycles: watch::Receiver<Vec<Instant>>,
) -> (Option<Instant>, Option<Instant>) {
    if matches!(sc.injection, Injection::Nothing) {
        return (None, None);
    }
    let seed = |s: f64| Duration::from_secs_f64(s / shape.scale);
    let reached = |n: u64| move |c: &Vec<Instant>| c.len() as u64 > n;
    // Cycle `before` (0-based) has started.
    let _ = cycles.wait_for(reached(sc.before)).await;
    tokio::time::sleep(seed(sc.offset)).await;
    let start = Instant::now();
    let down = apply(sc, shape, sims).await;
    match sc.lasts {
        Lasts::Cycles(n) => {
            let _ = cycles.wait_for(reached(sc.before + n)).await;
        }
        Lasts::SeedSeconds(s) => tokio::time::sleep(seed(s)).await,
        Lasts::ToTheEnd => return (Some(start), None),
    }
    take_away(sc, shape, setup, sims, down).await;
    (Some(start), Some(Instant::now()))
}

/// The steady variability with `scale` on top.
fn with_scale(shape: &Shape, scale: f64, drift_per_hour: f64) -> Option<Variability> {
    Some(Variability {
        scale,
        drift_per_hour,
        ..shape.variability.clone()
    })
}

/// Starts the injection; a restart returns the stopped simulator's address.
async fn apply(
    sc: &Scenario,
    shape: &Shape,
    sims: &mut Vec<SimHandle>,
) -> Option<std::net::SocketAddr> {
    match &sc.injection {
        Injection::Nothing => {}
        Injection::Slower { target, by } => {
            sims[*target].set_variability(with_scale(shape, *by, 0.0))
        }
        Injection::Drift {
            target,
            per_seed_hour,
        } => {
            // In simulated hours: `scale` seed-plan hours pass in each.
            let per_hour = (1.0 + per_seed_hour).powf(shape.scale) - 1.0;
            sims[*target].set_variability(with_scale(shape, 1.0, per_hour));
        }
        Injection::Faults { targets, faults } => {
            for t in targets {
                sims[*t].set_faults(faults.clone());
            }
        }
        Injection::Restart { target } => {
            let sim = sims.remove(*target);
            let addr = sim.local_addr();
            sim.shutdown().await;
            return Some(addr);
        }
    }
    None
}

/// Ends the injection: the deployments as they were (a restarted one fresh, on its old port).
async fn take_away(
    sc: &Scenario,
    shape: &Shape,
    setup: &Setup,
    sims: &mut Vec<SimHandle>,
    down: Option<std::net::SocketAddr>,
) {
    match &sc.injection {
        Injection::Nothing | Injection::Drift { .. } => {}
        Injection::Slower { target, .. } => {
            sims[*target].set_variability(with_scale(shape, 1.0, 0.0))
        }
        Injection::Faults { targets, .. } => {
            for t in targets {
                sims[*t].set_faults(FaultSpec::default());
            }
        }
        Injection::Restart { target } => {
            let t = &setup.config.targets[*target];
            let spec = t
                .simulated
                .as_ref()
                .expect("a simulated target")
                .value
                .clone();
            let addr = down.expect("the stopped simulator's address");
            let sim = llm_canary::sim::start(spec, t.serving_mode, addr)
                .await
                .expect("the simulator starts again on its port");
            sims.insert(*target, sim);
        }
    }
}
