//! The schedule: the cycle of workloads and their steps (plan), the step runner with warmup,
//! steady window and drain (runner), where finished requests go (recorder), and the board that
//! keeps each workload's phase and the latest step results for `/api/v1/status`.

pub mod plan;
pub mod recorder;
pub mod runner;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::measure::step::Spread;
use crate::model::StepResult;
pub use plan::{StepKind, StepPlan, plan_cycle};
pub use recorder::{InFlight, Recorder};
pub use runner::{Runner, Target};

/// How many finished step results the board keeps (about a day of the default cycle).
const RECENT_RESULTS: usize = 4096;

/// What a workload is doing now.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadPhase {
    pub state: &'static str,
    pub step: Option<String>,
    pub cycle: u64,
    pub started_unix: Option<f64>,
    pub steps_done: u64,
}

#[derive(Default)]
struct BoardState {
    phases: BTreeMap<&'static str, WorkloadPhase>,
    /// Latest result per (workload, step, target, labels).
    latest: BTreeMap<String, StepResult>,
    recent: VecDeque<StepResult>,
    cycles_completed: u64,
}

/// Shared view of the schedule's progress and results.
#[derive(Default)]
pub struct Board {
    state: Mutex<BoardState>,
}

impl Board {
    fn with<R>(&self, f: impl FnOnce(&mut BoardState) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn starting(&self, plan: &StepPlan, cycle: u64) {
        self.with(|s| {
            let p = s.phases.entry(plan.workload).or_insert(WorkloadPhase {
                state: "idle",
                step: None,
                cycle,
                started_unix: None,
                steps_done: 0,
            });
            p.state = "running";
            p.step = Some(plan.name());
            p.cycle = cycle;
            p.started_unix = Some(runner_unix_now());
        });
    }

    fn finished(&self, plan: &StepPlan, results: &[StepResult]) {
        self.with(|s| {
            if let Some(p) = s.phases.get_mut(plan.workload) {
                p.state = "done";
                p.steps_done += 1;
            }
            for r in results {
                let key = format!("{}|{}|{}|{:?}", r.workload, r.step, r.target, r.labels);
                s.latest.insert(key, r.clone());
                if s.recent.len() == RECENT_RESULTS {
                    s.recent.pop_front();
                }
                s.recent.push_back(r.clone());
            }
        });
    }

    /// Counts a completed cycle (also for schedules driven outside `run_forever`).
    pub fn cycle_done(&self) {
        self.with(|s| s.cycles_completed += 1);
    }

    /// Registers the workloads of the plan as idle, so status names them from the start.
    pub fn announce(&self, steps: &[StepPlan]) {
        self.with(|s| {
            for p in steps {
                s.phases.entry(p.workload).or_insert(WorkloadPhase {
                    state: "idle",
                    step: None,
                    cycle: 0,
                    started_unix: None,
                    steps_done: 0,
                });
            }
        });
    }

    /// Every finished step result still kept, oldest first.
    pub fn recent(&self) -> Vec<StepResult> {
        self.with(|s| s.recent.iter().cloned().collect())
    }

    /// The JSON of `/api/v1/status`'s schedule part.
    pub fn status_json(&self) -> serde_json::Value {
        self.with(|s| {
            json!({
                "cycles_completed": s.cycles_completed,
                "workloads": s.phases,
                "last_results": s.latest.values().collect::<Vec<_>>(),
            })
        })
    }
}

fn runner_unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Drives cycles of steps and publishes every step's results.
pub struct Scheduler {
    pub runner: Arc<Runner>,
    pub board: Arc<Board>,
    /// Scrapes the targets' own metrics at each step's start and end; `None` when no target has
    /// server metrics.
    pub server_metrics: Option<Arc<crate::scrape::ServerScraper>>,
}

impl Scheduler {
    /// Runs one step and publishes its results (the recorder's sinks, the board, one log line per
    /// target).
    pub async fn step(
        &self,
        plan: &StepPlan,
        cycle: u64,
        soft_stop: &CancellationToken,
        hard_stop: &CancellationToken,
    ) -> Vec<StepResult> {
        self.board.starting(plan, cycle);
        tracing::info!(cycle, step = %plan.name(), warmup = ?plan.warmup, steady = ?plan.steady, "step starting");
        let mark = match &self.server_metrics {
            Some(scraper) => Some(scraper.begin_step().await),
            None => None,
        };
        let mut results = self
            .runner
            .run_step(plan, cycle, soft_stop, hard_stop)
            .await;
        if let (Some(scraper), Some(mark)) = (&self.server_metrics, mark) {
            let server = scraper.end_step(mark).await;
            for r in &mut results {
                r.server = server.get(&r.target).copied();
            }
        }
        for r in &results {
            let m = &r.measurements;
            // One line per step and target: the total where a step has several label sets.
            let one_per_target =
                r.total || !results.iter().any(|o| o.total && o.target == r.target);
            if one_per_target {
                let ms = |s: Option<Spread>, f: fn(&Spread) -> f64| {
                    s.map(|s| format!("{:.1}", f(&s) * 1e3))
                        .unwrap_or_else(|| "-".into())
                };
                tracing::info!(
                    step = %r.step,
                    target = %r.target,
                    mode = %r.serving_mode,
                    requests = m.requests,
                    errors = m.errors,
                    ttft_p50_ms = %ms(m.ttft, |s| s.p50),
                    ttft_p99_ms = %ms(m.ttft, |s| s.p99),
                    itl_p50_ms = %ms(m.itl, |s| s.p50),
                    tokens_per_s = format!("{:.0}", m.output_tokens_per_second),
                    cache_hit_ratio = %m.cache_hit_ratio.map(|c| format!("{c:.3}")).unwrap_or_else(|| "-".into()),
                    degraded = m.degraded,
                    faulted = m.faulted,
                    "step done"
                );
            }
        }
        self.board.finished(plan, &results);
        self.runner.recorder.step_finished(&results);
        results
    }

    /// Runs cycles until `soft_stop`; `plan` is re-read at every cycle start so a reload applies
    /// at the next cycle boundary. `on_first_step` runs once the first step has started.
    pub async fn run_forever(
        &self,
        plan: impl Fn() -> Vec<StepPlan>,
        cycle_pause: impl Fn() -> std::time::Duration,
        soft_stop: &CancellationToken,
        hard_stop: &CancellationToken,
    ) {
        let mut cycle = 0u64;
        while !soft_stop.is_cancelled() {
            let steps = plan();
            self.board.announce(&steps);
            for step in &steps {
                if soft_stop.is_cancelled() {
                    return;
                }
                self.step(step, cycle, soft_stop, hard_stop).await;
            }
            self.board.cycle_done();
            self.runner.recorder.cycle_finished();
            cycle += 1;
            tokio::select! {
                _ = tokio::time::sleep(cycle_pause()) => {}
                _ = soft_stop.cancelled() => return,
            }
        }
    }
}
