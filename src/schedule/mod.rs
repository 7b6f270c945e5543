//! The schedule: the cycle of workloads and their steps (`plan`), the one step loop of every run
//! (`scheduler`) over the targets its sources name (`source`, each a `target`), the step runner
//! with warmup, steady window and drain (`runner`, on the parts it shares with its drivers in
//! `context`), where the schedule's data goes (`recorder`), and the board that keeps each
//! workload's phase and the latest step results for `/api/v1/status`.

pub mod budget;
mod context;
pub mod cost;
mod drivers;
pub mod gate;
pub mod plan;
pub mod probe_stream;
pub mod recorder;
mod replay;
pub mod runner;
pub mod scheduler;
pub mod source;
mod target;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;
use serde_json::json;

use crate::clock::unix_now;
use crate::model::{
    BudgetAction, BudgetReport, BudgetUsage, Finished, PauseState, Sink, StepInfo, StepResult,
};
pub use context::Runner;
pub use plan::{StepKind, StepPlan, plan_cycle};
pub use probe_stream::ProbeStream;
pub use recorder::{InFlight, Recorder};
pub use runner::CALIBRATION_TIMEOUT;
pub use scheduler::{RunSummary, Scheduler};
pub use source::{Leadership, TargetSet, TargetSource};
pub use target::Target;

/// What a workload is doing now.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadPhase {
    pub state: &'static str,
    pub step: Option<String>,
    pub cycle: u64,
    pub started_unix: Option<f64>,
    pub steps_done: u64,
}

impl WorkloadPhase {
    fn idle() -> WorkloadPhase {
        WorkloadPhase {
            state: "idle",
            step: None,
            cycle: 0,
            started_unix: None,
            steps_done: 0,
        }
    }
}

/// How many of the budget's recent actions the board keeps.
const RECENT_BUDGET_ACTIONS: usize = 64;

#[derive(Default)]
struct BoardState {
    phases: BTreeMap<&'static str, WorkloadPhase>,
    /// Latest result per (workload, step, target, labels).
    latest: BTreeMap<String, StepResult>,
    cycles_completed: u64,
    pause: PauseState,
    budget: Vec<BudgetUsage>,
    budget_actions: VecDeque<(f64, BudgetAction)>,
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

    /// The JSON of `/api/v1/status`'s schedule part.
    pub fn status_json(&self) -> serde_json::Value {
        self.with(|s| {
            let p = &s.pause;
            json!({
                "cycles_completed": s.cycles_completed,
                "workloads": s.phases,
                "last_results": s.latest.values().collect::<Vec<_>>(),
                "traffic": {
                    "paused": p.paused(),
                    "reasons": p.reasons().iter().filter(|(_, on)| *on).map(|(r, _)| *r).collect::<Vec<_>>(),
                    "operator": p.operator.iter().map(|(source, note)| json!({"source": source, "note": note})).collect::<Vec<_>>(),
                    "next_window_change_unix": p.next_change_unix,
                },
                "budget": {
                    "scopes": s.budget.iter().map(|u| json!({
                        "scope": u.scope,
                        "max_inflight": u.max_inflight,
                        "max_rps": u.max_rps,
                        "max_output_tokens_per_hour": u.max_output_tokens_per_hour,
                        "output_tokens_last_hour": u.output_tokens_last_hour,
                        "throttled_requests": u.throttled_requests,
                        "throttled_seconds": u.throttled_seconds,
                    })).collect::<Vec<_>>(),
                    "recent_actions": s.budget_actions.iter().map(|(at, a)| json!({
                        "at_unix": at,
                        "target": a.target,
                        "workload": a.workload,
                        "action": a.action,
                        "detail": a.detail,
                    })).collect::<Vec<_>>(),
                },
            })
        })
    }
}

/// The board reads the schedule's progress as every other consumer does.
impl Sink for Board {
    fn request(&self, _: &Finished<'_>) {}

    fn cycle_started(&self, steps: &[StepInfo]) {
        self.with(|s| {
            for p in steps {
                s.phases
                    .entry(p.workload)
                    .or_insert_with(WorkloadPhase::idle);
            }
        });
    }

    fn step_started(&self, step: &StepInfo) {
        self.with(|s| {
            let p = s
                .phases
                .entry(step.workload)
                .or_insert_with(WorkloadPhase::idle);
            p.state = "running";
            p.step = Some(step.name.clone());
            p.cycle = step.cycle;
            p.started_unix = Some(unix_now());
        });
    }

    fn step_finished(&self, step: &StepInfo, results: Option<&[StepResult]>) {
        self.with(|s| {
            if let Some(p) = s.phases.get_mut(step.workload) {
                p.state = "done";
                p.steps_done += 1;
            }
            for r in results.unwrap_or_default() {
                let key = format!(
                    "{}|{}|{}|{:?}",
                    r.labels.workload, r.step, r.labels.target, r.labels
                );
                s.latest.insert(key, r.clone());
            }
        });
    }

    fn cycle_finished(&self, _cycle: u64) {
        self.with(|s| s.cycles_completed += 1);
    }

    fn paused(&self, state: &PauseState) {
        self.with(|s| s.pause = state.clone());
    }

    fn budget(&self, report: &BudgetReport) {
        let now = unix_now();
        self.with(|s| {
            s.budget = report.usage.clone();
            for a in &report.actions {
                if s.budget_actions.len() == RECENT_BUDGET_ACTIONS {
                    s.budget_actions.pop_front();
                }
                s.budget_actions.push_back((now, a.clone()));
            }
        });
    }
}
