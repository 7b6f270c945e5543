//! The one step loop of every run (`llm-canary run` and `llm-canary bench` alike): cycles of
//! steps, each against the targets its [`TargetSource`] names at the step's start, with the
//! servers' own metrics scraped around it and every step's results handed to the sinks. A step
//! cut short (a stop, a lost Lease) measured less than planned and is not reported; a lost
//! Lease starts the cycle afresh in the next term.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::plan::StepPlan;
use super::runner::{Runner, Target};
use super::source::{TargetSet, TargetSource};
use crate::measure::step::Spread;
use crate::model::{StepInfo, StepResult, TargetChange, TargetInfo};
use crate::scrape::{ScrapeTarget, ServerMetricsSink, ServerScraper};
use crate::shutdown::Shutdown;

/// KV usage is sampled at least this many times per step (more often than
/// `export.server_metrics_interval` when steps are short), and never more often than every
/// [`MIN_SCRAPE_INTERVAL`].
pub const SCRAPES_PER_STEP: u32 = 4;
pub const MIN_SCRAPE_INTERVAL: Duration = Duration::from_millis(250);

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

/// What the loop is sending to now.
#[derive(Default)]
struct Active {
    targets: Vec<Arc<Target>>,
    scrape: Vec<ScrapeTarget>,
    scraper: Option<Arc<ServerScraper>>,
    scraper_stop: CancellationToken,
    calibrated: bool,
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
        }
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
            let steps = plan();
            let infos: Vec<StepInfo> = steps
                .iter()
                .enumerate()
                .map(|(i, s)| info(s, cycle, i, steps.len()))
                .collect();
            self.runner.recorder.cycle_started(&infos);
            for (step, info) in steps.iter().zip(&infos) {
                if !self.wait_for_targets(stop, &steps).await {
                    summary.interrupted = true;
                    break 'cycles;
                }
                match self.run_turn(step, info, stop).await {
                    Some(_) => summary.steps_finished += 1,
                    None if stop.stopping() => {
                        summary.interrupted = true;
                        break 'cycles;
                    }
                    // The Lease was lost: the next term starts its cycle afresh.
                    None => continue 'cycles,
                }
            }
            self.runner.recorder.cycle_finished(cycle);
            summary.cycles_finished += 1;
            cycle += 1;
            if cycles.is_some_and(|n| cycle >= n) {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(pause()) => {}
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
        self.refresh(std::slice::from_ref(plan));
        self.run_turn(plan, &info(plan, cycle, 0, 1), stop).await
    }

    /// Runs `plan` on the current targets and publishes it; `None` when it was cut short (a
    /// stop, a lost Lease) and so not reported.
    async fn run_turn(
        &mut self,
        plan: &StepPlan,
        info: &StepInfo,
        stop: &Shutdown,
    ) -> Option<Vec<StepResult>> {
        let runner = Arc::new(self.runner.with_targets(self.active.targets.clone()));
        if !self.active.calibrated {
            runner.calibrate(stop.cut()).await;
            self.active.calibrated = true;
        }
        let recorder = &self.runner.recorder;
        recorder.step_started(info);
        tracing::info!(cycle = info.cycle, step = %info.name, warmup = ?plan.warmup, steady = ?plan.steady, "step starting");
        let scraper = self.active.scraper.clone();
        let mark = match &scraper {
            Some(s) => Some(s.begin_step().await),
            None => None,
        };
        // This step's own stop: the run's, or the end of this replica's term.
        let soft = stop.stop_sending().child_token();
        let hard = stop.cut().child_token();
        let drain = runner.drain_grace;
        let term_ended = async {
            self.source.permit_lost().await;
            tracing::warn!("this replica may no longer send: stopping the step");
            soft.cancel();
            tokio::time::sleep(drain).await;
            hard.cancel();
            std::future::pending::<()>().await;
        };
        let mut results = tokio::select! {
            r = runner.run_step(plan, info.cycle, &soft, &hard) => r,
            _ = term_ended => unreachable!("the term's guard never ends"),
        };
        if let (Some(s), Some(mark)) = (&scraper, mark) {
            let server = s.end_step(mark).await;
            for r in &mut results {
                r.server = server.get(&r.target).copied();
            }
        }
        if soft.is_cancelled() {
            recorder.step_finished(info, None);
            return None;
        }
        log_results(&results);
        recorder.step_finished(info, Some(&results));
        Some(results)
    }

    /// Waits until there is a target to send to, refreshing the target set; false on a stop.
    async fn wait_for_targets(&mut self, stop: &Shutdown, steps: &[StepPlan]) -> bool {
        loop {
            self.refresh(steps);
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
    /// servers' metrics for the new set.
    fn refresh(&mut self, steps: &[StepPlan]) {
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
        self.runner.recorder.targets(&TargetChange {
            now: &now,
            added: &added,
            removed: &removed,
        });
        self.active.scraper_stop.cancel();
        self.active.scraper_stop = CancellationToken::new();
        self.active.scraper = match &self.server_metrics {
            Some(sink) if !scrape.is_empty() => {
                match ServerScraper::new(scrape.clone(), Arc::clone(sink)) {
                    Ok(s) => {
                        let s = Arc::new(s);
                        let every = scrape_interval(self.scrape_interval, steps);
                        tokio::spawn(Arc::clone(&s).run(every, self.active.scraper_stop.clone()));
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

/// One log line per step and target: the total where a step has several label sets.
fn log_results(results: &[StepResult]) {
    for r in results {
        let m = &r.measurements;
        let one_per_target = r.total || !results.iter().any(|o| o.total && o.target == r.target);
        if !one_per_target {
            continue;
        }
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
