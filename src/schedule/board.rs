//! The status board: what `/api/v1/status` and the status page show of the schedule, kept as
//! the schedule's data comes in — each workload's phase, the step running and where the cycle
//! is, the latest step results, what each target's latest request came to, the last failed
//! requests with what their servers said, the pause and the traffic budget.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;
use serde_json::json;

use crate::clock::unix_now;
use crate::model::{
    BudgetAction, BudgetReport, BudgetUsage, Finished, PauseState, Phase, Sink, StepInfo,
    StepResult, TargetChange,
};
use crate::request::Outcome;

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

/// The step running now and where it stands in its cycle.
#[derive(Debug, Clone, Serialize)]
pub struct CurrentStep {
    pub cycle: u64,
    /// 1-based: step `position` of `steps`.
    pub position: usize,
    pub steps: usize,
    pub workload: &'static str,
    pub name: String,
    pub started_unix: f64,
    /// Warmup and steady window: how long the step sends (its drain comes on top).
    pub planned_seconds: f64,
}

/// What a target's requests came to since the start (or since it came back after leaving).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TargetActivity {
    pub requests: u64,
    /// Requests that failed (`Outcome::is_error`: a cancellation is none).
    pub errors: u64,
    pub last_request_unix: f64,
    pub last_outcome: &'static str,
    /// Whether the latest request found the target serving (`llm_canary_target_up`).
    pub up: bool,
}

/// One failed request as the status shows it: where it went, what it came to and what the server
/// said, in the record's text — masked of the target's secrets, without control characters,
/// bounded (`client::stream::sanitize`). Nothing here is escaped for a page: its reader does.
#[derive(Debug, Clone, Serialize)]
pub struct FailedRequest {
    /// When the board heard of it (it had just finished).
    pub at_unix: f64,
    pub target: String,
    pub serving_mode: String,
    pub workload: String,
    /// The step labels that apply (`concurrency=32`), space-separated; empty for the probe
    /// stream.
    pub step: String,
    /// `warmup` or `steady`.
    pub phase: &'static str,
    /// The `outcome` label value (`http_5xx`, `timeout`, …).
    pub outcome: &'static str,
    pub http_status: Option<u16>,
    /// The `x-request-id` sent, to find the request in the server's logs.
    pub request_id: String,
    /// From its send to the instant it failed.
    pub seconds: f64,
    pub error: Option<String>,
}

impl FailedRequest {
    fn of(req: &Finished<'_>, at_unix: f64) -> FailedRequest {
        let labels = req.labels;
        let rec = req.record;
        FailedRequest {
            at_unix,
            target: labels.target.clone(),
            serving_mode: labels.serving_mode.clone(),
            workload: labels.workload.clone(),
            step: labels
                .step_pairs()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            phase: match req.phase {
                Phase::Warmup => "warmup",
                Phase::Steady => "steady",
            },
            outcome: req.sample.outcome.as_str(),
            http_status: rec.http_status,
            request_id: rec.request_id.clone(),
            seconds: rec.latency().as_secs_f64(),
            error: rec.error.clone(),
        }
    }
}

/// How many of the budget's recent actions the board keeps.
const RECENT_BUDGET_ACTIONS: usize = 64;

/// How many failed requests the board keeps: a page's worth, the newest. A storm of failures
/// replaces them as fast as they come, in constant memory.
pub const RECENT_FAILURES: usize = 20;

/// The newest `capacity` items pushed, the oldest dropped first.
#[derive(Debug)]
struct Recent<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> Recent<T> {
    fn new(capacity: usize) -> Self {
        Recent {
            items: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    fn push(&mut self, item: T) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    /// Newest first.
    fn newest_first(&self) -> impl Iterator<Item = &T> {
        self.items.iter().rev()
    }
}

struct BoardState {
    phases: BTreeMap<&'static str, WorkloadPhase>,
    current: Option<CurrentStep>,
    /// Latest result per (workload, step, target, labels).
    latest: BTreeMap<String, StepResult>,
    cycles_completed: u64,
    targets: BTreeMap<String, TargetActivity>,
    failures: Recent<FailedRequest>,
    pause: PauseState,
    budget: Vec<BudgetUsage>,
    budget_actions: Recent<(f64, BudgetAction)>,
}

impl Default for BoardState {
    fn default() -> Self {
        BoardState {
            phases: BTreeMap::new(),
            current: None,
            latest: BTreeMap::new(),
            cycles_completed: 0,
            targets: BTreeMap::new(),
            failures: Recent::new(RECENT_FAILURES),
            pause: PauseState::default(),
            budget: Vec::new(),
            budget_actions: Recent::new(RECENT_BUDGET_ACTIONS),
        }
    }
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

    /// What each target's requests came to, by target name.
    pub fn target_activity(&self) -> BTreeMap<String, TargetActivity> {
        self.with(|s| s.targets.clone())
    }

    /// The JSON of `/api/v1/status`'s schedule part.
    pub fn status_json(&self) -> serde_json::Value {
        self.with(|s| {
            let p = &s.pause;
            json!({
                "cycles_completed": s.cycles_completed,
                "current_step": s.current,
                "workloads": s.phases,
                "last_results": s.latest.values().collect::<Vec<_>>(),
                "recent_failures": s.failures.newest_first().collect::<Vec<_>>(),
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
                    "recent_actions": s.budget_actions.items.iter().map(|(at, a)| json!({
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
    /// Every request of a step and of the probe stream: a lock and a few counters, and for a
    /// failure the copy of its labels and text.
    fn request(&self, req: &Finished<'_>) {
        let outcome: Outcome = req.sample.outcome;
        let now = unix_now();
        let failed = outcome.is_error().then(|| FailedRequest::of(req, now));
        self.with(|s| {
            let target = &req.labels.target;
            // The name is copied once per target, not per request.
            if !s.targets.contains_key(target) {
                s.targets.insert(target.clone(), TargetActivity::default());
            }
            if let Some(seen) = s.targets.get_mut(target) {
                seen.requests += 1;
                seen.errors += u64::from(outcome.is_error());
                seen.last_request_unix = now;
                seen.last_outcome = outcome.as_str();
                seen.up = outcome.reached_target();
            }
            if let Some(failed) = failed {
                s.failures.push(failed);
            }
        });
    }

    /// A target that left takes its activity along; its failures stay listed until newer ones
    /// replace them (they happened).
    fn targets(&self, change: &TargetChange<'_>) {
        self.with(|s| {
            for gone in change.removed {
                s.targets.remove(gone);
            }
        });
    }

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
        let now = unix_now();
        self.with(|s| {
            let p = s
                .phases
                .entry(step.workload)
                .or_insert_with(WorkloadPhase::idle);
            p.state = "running";
            p.step = Some(step.name.clone());
            p.cycle = step.cycle;
            p.started_unix = Some(now);
            s.current = Some(CurrentStep {
                cycle: step.cycle,
                position: step.position + 1,
                steps: step.steps,
                workload: step.workload,
                name: step.name.clone(),
                started_unix: now,
                planned_seconds: (step.warmup + step.steady).as_secs_f64(),
            });
        });
    }

    fn step_finished(&self, step: &StepInfo, results: Option<&[StepResult]>) {
        self.with(|s| {
            s.current = None;
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
                s.budget_actions.push((now, a.clone()));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{ChatMessage, Prompt, RequestRecord, StreamRequest};
    use crate::config::ServingMode;
    use crate::model::RecordContext;
    use crate::request::{GoodputLimits, RequestLabels};
    use std::time::Duration;
    use tokio::time::Instant;

    /// A finished request to `target` that came to `outcome`, its id `id`.
    fn finish(board: &Board, target: &str, outcome: Outcome, id: &str, error: Option<&str>) {
        let mut labels = RequestLabels::new(target, ServingMode::Aggregated, "concurrency_sweep");
        labels.concurrency = "8".into();
        let request = StreamRequest {
            request_id: id.into(),
            prompt: Prompt::Chat(vec![ChatMessage::user("hi")]),
            osl: 4,
        };
        let t0 = Instant::now();
        let mut rec = RequestRecord::new(id, t0, t0);
        if outcome == Outcome::Http5xx {
            rec.http_status = Some(503);
        }
        rec.settle(
            outcome,
            t0 + Duration::from_millis(40),
            error.map(str::to_owned),
        );
        let ctx = RecordContext {
            target_index: 0,
            isl: 0,
            labels: &labels,
            phase: Phase::Steady,
            osl: 4,
            shared_prefix_tokens: 0,
            request: &request,
            goodput: GoodputLimits {
                ttft: 2.0,
                itl: 0.1,
            },
        };
        board.request(&Finished::new(&ctx, &rec));
    }

    #[test]
    fn the_board_keeps_the_newest_failures_and_only_failures() {
        let board = Board::default();
        for i in 0..RECENT_FAILURES + 5 {
            finish(
                &board,
                "a",
                Outcome::Http5xx,
                &format!("f{i}"),
                Some("HTTP 503: busy"),
            );
            finish(&board, "a", Outcome::Ok, &format!("ok{i}"), None);
            finish(&board, "b", Outcome::Cancelled, &format!("c{i}"), None);
        }
        finish(
            &board,
            "b",
            Outcome::Connect,
            "gone",
            Some("connection refused"),
        );
        let status = board.status_json();
        let failures = status["recent_failures"].as_array().unwrap();
        assert_eq!(failures.len(), RECENT_FAILURES);
        // Newest first; the oldest five were dropped; no success or cancellation among them.
        assert_eq!(failures[0]["request_id"], "gone");
        assert_eq!(failures[0]["outcome"], "connect");
        assert_eq!(failures[0]["error"], "connection refused");
        assert_eq!(
            failures[1]["request_id"],
            format!("f{}", RECENT_FAILURES + 4)
        );
        assert_eq!(failures[19]["request_id"], "f6");
        let f = &failures[1];
        assert_eq!(
            (&f["target"], &f["outcome"], &f["http_status"], &f["step"]),
            (
                &json!("a"),
                &json!("http_5xx"),
                &json!(503),
                &json!("concurrency=8")
            )
        );
        assert_eq!(
            (&f["phase"], &f["error"]),
            (&json!("steady"), &json!("HTTP 503: busy"))
        );
        assert!((f["seconds"].as_f64().unwrap() - 0.04).abs() < 1e-9, "{f}");
    }

    #[test]
    fn each_target_shows_what_its_latest_request_came_to() {
        let board = Board::default();
        finish(&board, "a", Outcome::Ok, "1", None);
        finish(&board, "a", Outcome::Http5xx, "2", Some("HTTP 503"));
        finish(&board, "b", Outcome::Ok, "3", None);
        finish(&board, "b", Outcome::Timeout, "4", Some("stalled"));
        let seen = board.target_activity();
        let a = &seen["a"];
        // A 503 still came from a live server; a timeout did not.
        assert_eq!(
            (a.requests, a.errors, a.up, a.last_outcome),
            (2, 1, true, "http_5xx")
        );
        let b = &seen["b"];
        assert_eq!(
            (b.requests, b.errors, b.up, b.last_outcome),
            (2, 1, false, "timeout")
        );
        board.targets(&TargetChange {
            now: &[],
            added: &[],
            removed: &["b".to_owned()],
        });
        assert!(!board.target_activity().contains_key("b"));
        // What failed on it is still listed.
        assert_eq!(board.status_json()["recent_failures"][0]["target"], "b");
    }

    #[test]
    fn the_current_step_is_shown_while_it_runs() {
        let board = Board::default();
        let step = StepInfo {
            cycle: 2,
            position: 4,
            steps: 16,
            workload: "concurrency_sweep",
            name: "concurrency_sweep concurrency=32".into(),
            warmup: Duration::from_secs(10),
            steady: Duration::from_secs(110),
        };
        board.step_started(&step);
        let current = &board.status_json()["current_step"];
        assert_eq!(
            (&current["cycle"], &current["position"], &current["steps"]),
            (&json!(2), &json!(5), &json!(16))
        );
        assert_eq!(current["name"], "concurrency_sweep concurrency=32");
        assert_eq!(current["planned_seconds"], 120.0);
        board.step_finished(&step, None);
        assert!(board.status_json()["current_step"].is_null());
        assert_eq!(
            board.status_json()["workloads"]["concurrency_sweep"]["steps_done"],
            1
        );
    }
}
