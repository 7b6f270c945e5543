//! The one step loop of every run (`llm-canary run` and `llm-canary bench` alike): cycles of
//! steps, each against the targets its [`TargetSource`] names at the step's start, admitted by
//! the traffic budget and started only while the [`Gate`] is open, with the servers' own metrics
//! scraped around it and every step's results handed to the sinks. A step cut short (a stop, a
//! pause, a window's end, a lost Lease) measured less than planned and is not reported; a cut by
//! the gate runs the step again once it reopens, a lost Lease starts the cycle afresh in the
//! next term.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::context::Runner;
use super::gate::{Gate, GateState, SystemClock};
use super::plan::StepPlan;
use super::source::{TargetSet, TargetSource};
use super::target::Target;
use crate::measure::step::Spread;
use crate::model::{BudgetAction, PauseState, StepInfo, StepResult, TargetChange, TargetInfo};
use crate::scrape::{ScrapeTarget, ServerMetricsSink, ServerScraper};
use crate::shutdown::Shutdown;

/// KV usage is sampled at least this many times per step (more often than
/// `export.server_metrics_interval` when steps are short), and never more often than every
/// [`MIN_SCRAPE_INTERVAL`].
pub const SCRAPES_PER_STEP: u32 = 4;
pub const MIN_SCRAPE_INTERVAL: Duration = Duration::from_millis(250);

/// The shortest a cycle lasts, its pause included: a cycle that took no time (every step skipped
/// by the budget, or steps a time scale made 0 ns long) waits out the rest before the next, so
/// the loop never spins. No valid plan's cycle is shorter, since each step lasts at least
/// [`crate::config::MIN_SCALED_STEP`].
pub const MIN_CYCLE: Duration = crate::config::MIN_SCALED_STEP;

// The shortest step holds its [`SCRAPES_PER_STEP`] scrapes at the fastest they run.
const _: () = assert!(
    SCRAPES_PER_STEP as u128 * MIN_SCRAPE_INTERVAL.as_nanos()
        <= crate::config::MIN_SCALED_STEP.as_nanos()
);

/// How a run of the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunSummary {
    /// Steps that ran to their end and were reported.
    pub steps_finished: usize,
    /// Cycles that ran to their end.
    pub cycles_finished: u64,
    /// A stop cut the run short.
    pub interrupted: bool,
}

/// How a turn of the loop ended.
enum Turn {
    /// The step ran and was reported.
    Done(Vec<StepResult>),
    /// The budget skipped it on every target for good (its `max_inflight`).
    Skipped,
    /// Every target's hour of output tokens is spent: try again after this.
    Spent(Duration),
    /// Cut short, not reported.
    Cut(Cut),
}

enum Cut {
    Stop,
    /// The gate closed (a pause, a window's end): the step runs again once it reopens.
    Gate,
    /// This replica lost its Lease.
    Lease,
}

/// What the loop is sending to now.
#[derive(Default)]
struct Active {
    targets: Vec<Arc<Target>>,
    scrape: Vec<ScrapeTarget>,
    scraper: Option<Arc<ServerScraper>>,
    scraper_stop: CancellationToken,
    /// Targets whose calibration ran (answered or not): a target is calibrated once, when it
    /// first takes part in a step, so targets a reload or discovery adds are calibrated too.
    calibrated: std::collections::HashSet<String>,
}

/// The loop and what it needs between steps.
pub struct Scheduler {
    /// The shared request state (client, prompt learner, recorder and its sinks); each step runs
    /// on a copy that holds the step's targets.
    runner: Arc<Runner>,
    source: TargetSource,
    /// Where scraped server metrics go; `None`: servers' metrics are not scraped.
    server_metrics: Option<Arc<dyn ServerMetricsSink>>,
    /// `export.server_metrics_interval`.
    scrape_interval: Duration,
    active: Active,
    gate: Arc<Gate>,
    /// The pause state last told to the sinks.
    pause: Option<PauseState>,
    /// Where the current targets are published (the probe stream follows them).
    published: Option<tokio::sync::watch::Sender<Vec<Arc<Target>>>>,
}

impl Scheduler {
    pub fn new(
        runner: Arc<Runner>,
        source: TargetSource,
        server_metrics: Option<Arc<dyn ServerMetricsSink>>,
        scrape_interval: Duration,
    ) -> Scheduler {
        Scheduler {
            runner,
            source,
            server_metrics,
            scrape_interval,
            active: Active::default(),
            gate: Arc::new(Gate::new(Arc::new(SystemClock))),
            pause: None,
            published: None,
        }
    }

    /// Publishes the current targets to `tx` whenever they change (the probe stream's list).
    pub fn with_target_watch(
        mut self,
        tx: tokio::sync::watch::Sender<Vec<Arc<Target>>>,
    ) -> Scheduler {
        self.published = Some(tx);
        self
    }

    /// Sends only while `gate` is open (without one the loop always may).
    pub fn with_gate(mut self, gate: Arc<Gate>) -> Scheduler {
        self.gate = gate;
        self
    }

    /// Runs cycles of `plan()` (re-read at every cycle start, so a reload applies at the next
    /// cycle) until `cycles` have completed or a stop, pausing `pause()` between cycles.
    pub async fn run(
        &mut self,
        plan: impl Fn() -> Vec<StepPlan>,
        pause: impl Fn() -> Duration,
        cycles: Option<u64>,
        stop: &Shutdown,
    ) -> RunSummary {
        let mut summary = RunSummary::default();
        let mut cycle = 0u64;
        'cycles: while !stop.stopping() && cycles.is_none_or(|n| cycle < n) {
            let started = tokio::time::Instant::now();
            let steps = plan();
            let infos: Vec<StepInfo> = steps
                .iter()
                .enumerate()
                .map(|(i, s)| info(s, cycle, i, steps.len()))
                .collect();
            self.runner.recorder.cycle_started(&infos);
            for (step, info) in steps.iter().zip(&infos) {
                loop {
                    if !self.wait_for_targets(stop, &steps).await
                        || !self.wait_open(step, stop).await
                    {
                        summary.interrupted = true;
                        break 'cycles;
                    }
                    match self.run_turn(step, info, stop).await {
                        Turn::Done(_) => {
                            summary.steps_finished += 1;
                            break;
                        }
                        Turn::Skipped => break,
                        Turn::Spent(wait) => {
                            if !self.wait_spent(wait, stop).await {
                                summary.interrupted = true;
                                break 'cycles;
                            }
                        }
                        Turn::Cut(Cut::Gate) => {}
                        Turn::Cut(Cut::Stop) => {
                            summary.interrupted = true;
                            break 'cycles;
                        }
                        // The Lease was lost: the next term starts its cycle afresh.
                        Turn::Cut(Cut::Lease) => continue 'cycles,
                    }
                }
            }
            self.runner.recorder.cycle_finished(cycle);
            summary.cycles_finished += 1;
            cycle += 1;
            if cycles.is_some_and(|n| cycle >= n) {
                break;
            }
            let floor = MIN_CYCLE.saturating_sub(started.elapsed());
            tokio::select! {
                _ = tokio::time::sleep(pause().max(floor)) => {}
                _ = stop.stop_sending().cancelled() => {
                    summary.interrupted = true;
                    break;
                }
            }
        }
        self.active.scraper_stop.cancel();
        summary
    }

    /// Runs one step on the targets of the moment and publishes it, outside a cycle (tests drive
    /// steps one by one); `None` when it was cut short and so not reported.
    pub async fn step(
        &mut self,
        plan: &StepPlan,
        cycle: u64,
        stop: &Shutdown,
    ) -> Option<Vec<StepResult>> {
        self.refresh(std::slice::from_ref(plan), stop);
        match self.run_turn(plan, &info(plan, cycle, 0, 1), stop).await {
            Turn::Done(results) => Some(results),
            _ => None,
        }
    }

    /// Runs `plan` on the current targets as the budget admits it, and publishes it.
    async fn run_turn(&mut self, plan: &StepPlan, info: &StepInfo, stop: &Shutdown) -> Turn {
        let budget = Arc::clone(&self.runner.budget);
        let admission = budget.admit(plan, &self.active.targets, self.runner.pairing);
        if !admission.actions.is_empty() {
            log_actions(&info.name, &admission.actions);
            self.runner
                .recorder
                .budget(&budget.report(admission.actions.clone()));
        }
        if admission.targets.is_empty() {
            return match admission.wait {
                Some(wait) => Turn::Spent(wait),
                None => Turn::Skipped,
            };
        }
        let runner = Arc::new(self.runner.with_targets(self.active.targets.clone()));
        let done = runner.calibrate(stop.cut(), &self.active.calibrated).await;
        self.active.calibrated.extend(done);
        let recorder = &self.runner.recorder;
        recorder.step_started(info);
        tracing::info!(cycle = info.cycle, step = %info.name, warmup = ?plan.warmup, steady = ?plan.steady, "step starting");
        let scraper = self.active.scraper.clone();
        let mark = match &scraper {
            Some(s) => Some(s.begin_step().await),
            None => None,
        };
        // This step's own stop: the run's, the end of this replica's term, or the gate closing.
        let soft = stop.stop_sending().child_token();
        let hard = stop.cut().child_token();
        let drain = runner.drain_grace;
        let wind_down = |why: &'static str| {
            let (soft, hard) = (soft.clone(), hard.clone());
            async move {
                tracing::warn!("{why}: stopping the step");
                soft.cancel();
                tokio::time::sleep(drain).await;
                hard.cancel();
                std::future::pending::<()>().await;
            }
        };
        let gate = Arc::clone(&self.gate);
        let mut gate_closed = false;
        let mut results = tokio::select! {
            r = runner.run_admitted(plan, info.cycle, &admission, &soft, &hard) => r,
            _ = async {
                self.source.permit_lost().await;
                wind_down("this replica may no longer send").await
            } => unreachable!("the term's guard never ends"),
            _ = async {
                gate.closed().await;
                gate_closed = true;
                wind_down("traffic paused").await
            } => unreachable!("the gate's guard never ends"),
        };
        if let (Some(s), Some(mark)) = (&scraper, mark) {
            let server = s.end_step(mark).await;
            for r in &mut results {
                r.server = server.get(&r.labels.target).copied();
            }
        }
        let cuts: Vec<BudgetAction> = budget
            .take_cuts()
            .into_iter()
            .map(|target| BudgetAction {
                target,
                workload: plan.workload,
                action: "cut",
                detail: "sending stopped: the last hour's output tokens are spent".to_owned(),
            })
            .collect();
        log_actions(&info.name, &cuts);
        recorder.budget(&budget.report(cuts));
        let turn = if soft.is_cancelled() {
            recorder.step_finished(info, None);
            Turn::Cut(if stop.stopping() {
                Cut::Stop
            } else if gate_closed {
                Cut::Gate
            } else {
                Cut::Lease
            })
        } else {
            log_results(&results);
            recorder.step_finished(info, Some(&results));
            Turn::Done(results)
        };
        // The step's requests and records are freed: their pages go back to the system before
        // the next step, so resident memory follows what is in use.
        drop(runner);
        crate::heap::release_freed(stop.tracker());
        turn
    }

    /// Tells the sinks when the pause state changed.
    fn report_pause(&mut self, state: PauseState) {
        if self.pause.as_ref() != Some(&state) {
            self.runner.recorder.paused(&state);
            self.pause = Some(state);
        }
    }

    fn pause_state(gate: &GateState, fits: bool, budget: bool) -> PauseState {
        PauseState {
            operator: gate
                .operator
                .iter()
                .map(|(s, note)| (s.as_str().to_owned(), note.clone()))
                .collect(),
            schedule: !gate.in_window || !fits,
            budget,
            next_change_unix: gate.next_change.map(|t| t.as_millisecond() as f64 / 1e3),
        }
    }

    /// Waits until the gate is open and the window in force outlasts `step` (its warmup, steady
    /// window and drain), telling the sinks why while it waits; false on a stop.
    async fn wait_open(&mut self, step: &StepPlan, stop: &Shutdown) -> bool {
        let need = step.warmup + step.steady + self.runner.drain_grace;
        loop {
            let state = self.gate.state();
            let fits = state.open_for().is_none_or(|left| left >= need);
            self.report_pause(Self::pause_state(&state, fits, false));
            if state.open() && fits {
                return true;
            }
            let gate = Arc::clone(&self.gate);
            tokio::select! {
                _ = stop.stop_sending().cancelled() => return false,
                _ = gate.changed_after(&state) => {}
            }
        }
    }

    /// Every target's hour is spent: waits `wait` (or a change of the gate) as paused by the
    /// budget; false on a stop.
    async fn wait_spent(&mut self, wait: Duration, stop: &Shutdown) -> bool {
        let state = self.gate.state();
        self.report_pause(Self::pause_state(&state, true, true));
        tracing::warn!(wait = ?wait, "every target's output-token budget of the last hour is spent: waiting");
        tokio::select! {
            _ = stop.stop_sending().cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }

    /// Waits until there is a target to send to, refreshing the target set; false on a stop.
    async fn wait_for_targets(&mut self, stop: &Shutdown, steps: &[StepPlan]) -> bool {
        loop {
            self.refresh(steps, stop);
            if stop.stopping() {
                return false;
            }
            if !self.active.targets.is_empty() {
                return true;
            }
            tokio::select! {
                _ = stop.stop_sending().cancelled() => return false,
                _ = self.source.changed() => {}
            }
        }
    }

    /// Re-reads the target set; on a change tells the sinks and restarts the scrape of the
    /// servers' metrics for the new set, a task of `stop`'s tracker that ends with the set, or
    /// with the run.
    fn refresh(&mut self, steps: &[StepPlan], stop: &Shutdown) {
        let TargetSet { targets, scrape } = self.source.current();
        let same = targets.len() == self.active.targets.len()
            && targets
                .iter()
                .zip(&self.active.targets)
                .all(|(a, b)| Arc::ptr_eq(a, b));
        if same && scrape == self.active.scrape {
            return;
        }
        let removed: Vec<String> = self
            .active
            .targets
            .iter()
            .filter(|t| !targets.iter().any(|n| n.name == t.name))
            .map(|t| t.name.clone())
            .collect();
        let added: Vec<String> = targets
            .iter()
            .filter(|t| !self.active.targets.iter().any(|o| o.name == t.name))
            .map(|t| t.name.clone())
            .collect();
        for name in &removed {
            tracing::info!(target = %name, "target removed; its series are dropped");
        }
        let now: Vec<TargetInfo> = targets.iter().map(|t| t.info()).collect();
        let names: Vec<String> = now.iter().map(|t| t.name.clone()).collect();
        self.runner.budget.retain(&names);
        self.runner.recorder.targets(&TargetChange {
            now: &now,
            added: &added,
            removed: &removed,
        });
        self.active.scraper_stop.cancel();
        self.active.scraper_stop = stop.service();
        self.active.scraper = match &self.server_metrics {
            Some(sink) if !scrape.is_empty() => {
                let idle = self.runner.client.config().pool_idle_timeout;
                match ServerScraper::new(scrape.clone(), Arc::clone(sink), idle) {
                    Ok(s) => {
                        let s = Arc::new(s);
                        let every = scrape_interval(self.scrape_interval, steps);
                        stop.spawn(Arc::clone(&s).run(every, self.active.scraper_stop.clone()));
                        Some(s)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "server metrics not scraped");
                        None
                    }
                }
            }
            _ => None,
        };
        if let Some(tx) = &self.published {
            tx.send_replace(targets.clone());
        }
        self.active.targets = targets;
        self.active.scrape = scrape;
    }

    /// The targets of the last step (or the next one), for `/api/v1/status`.
    pub fn targets(&self) -> &[Arc<Target>] {
        &self.active.targets
    }
}

/// How often the servers' metrics are sampled: the configured interval, but at least
/// [`SCRAPES_PER_STEP`] times in the shortest step and never more often than
/// [`MIN_SCRAPE_INTERVAL`].
fn scrape_interval(configured: Duration, steps: &[StepPlan]) -> Duration {
    let shortest = steps
        .iter()
        .map(|p| p.warmup + p.steady)
        .min()
        .unwrap_or(configured);
    configured
        .min(shortest / SCRAPES_PER_STEP)
        .max(MIN_SCRAPE_INTERVAL)
}

/// A step as the sinks see it.
pub fn info(plan: &StepPlan, cycle: u64, position: usize, steps: usize) -> StepInfo {
    StepInfo {
        cycle,
        position,
        steps,
        workload: plan.workload,
        name: plan.name(),
        warmup: plan.warmup,
        steady: plan.steady,
    }
}

/// One warning per thing the budget changed: never silent.
fn log_actions(step: &str, actions: &[BudgetAction]) {
    for a in actions {
        tracing::warn!(step, target = %a.target, action = a.action, "traffic budget: {}", a.detail);
    }
}

/// One log line per step and target: the total where a step has several label sets.
fn log_results(results: &[StepResult]) {
    for r in results {
        let m = &r.measurements;
        let one_per_target = r.total
            || !results
                .iter()
                .any(|o| o.total && o.labels.target == r.labels.target);
        if !one_per_target {
            continue;
        }
        let ms = |s: Option<Spread>, f: fn(&Spread) -> f64| {
            s.map(|s| format!("{:.1}", f(&s) * 1e3))
                .unwrap_or_else(|| "-".into())
        };
        tracing::info!(
            step = %r.step,
            target = %r.labels.target,
            mode = %r.labels.serving_mode,
            requests = m.requests,
            errors = m.errors,
            ttft_p50_ms = %ms(m.ttft, |s| s.p50),
            ttft_p99_ms = %ms(m.ttft, |s| s.p99),
            itl_p50_ms = %ms(m.itl, |s| s.p50),
            tokens_per_s = format!("{:.0}", m.output_tokens_per_second),
            cache_hit_ratio = %m.cache_hit_ratio.map(|c| format!("{c:.3}")).unwrap_or_else(|| "-".into()),
            degraded = m.degraded,
            faulted = m.faulted,
            saturated = m.saturated,
            "step done"
        );
    }
}
