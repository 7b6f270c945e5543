//! The bench's progress display: on a terminal, one live bar per target for the running step
//! (workload and step, elapsed / scheduled duration, requests, errors) under a bar of the whole
//! plan; otherwise one plain log line when a step starts and one per target when it ends.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::records::BenchSink;
use crate::measure::step::StepMeasurements;
use crate::model::{Finished, Sink, StepInfo, StepResult};

/// How often the live bars are refreshed.
const TICK: Duration = Duration::from_millis(200);

pub(crate) struct Progress {
    live: Option<MultiProgress>,
    plan_bar: Option<ProgressBar>,
    targets: Vec<String>,
    sink: Arc<BenchSink>,
    /// The display of the step running now.
    running: Mutex<Option<StepProgress>>,
}

/// The display of one running step.
pub(crate) struct StepProgress {
    bars: Vec<ProgressBar>,
    /// Refreshes the bars; it lives as long as the display (aborted when it is dropped).
    ticker: Option<AbortOnDropHandle<()>>,
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn summary(m: &StepMeasurements) -> String {
    let ttft = m
        .ttft
        .map(|s| format!("{:.1} ms", s.p50 * 1e3))
        .unwrap_or_else(|| "-".into());
    format!(
        "{} requests, {} errors, TTFT p50 {ttft}, {:.0} tok/s",
        m.requests, m.errors, m.output_tokens_per_second
    )
}

impl Progress {
    /// `live`: draw bars on stderr (both stdout and stderr are terminals); else plain log lines.
    pub fn new(live: bool, steps: usize, targets: Vec<String>, sink: Arc<BenchSink>) -> Progress {
        let (live, plan_bar) = if live {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
            let bar = multi.add(ProgressBar::new(steps as u64));
            bar.set_style(style("plan [{pos}/{len}] {wide_msg}"));
            (Some(multi), Some(bar))
        } else {
            (None, None)
        };
        Progress {
            live,
            plan_bar,
            targets,
            sink,
            running: Mutex::new(None),
        }
    }

    /// Shows a step starting.
    fn start(&self, plan: &StepInfo) -> StepProgress {
        let length = plan.warmup + plan.steady;
        let Some(multi) = &self.live else {
            tracing::info!(
                "[{}/{}] {}: {} warmup + {} steady on {} targets",
                plan.position + 1,
                plan.steps,
                plan.name,
                secs(plan.warmup),
                secs(plan.steady),
                self.targets.len()
            );
            return StepProgress {
                bars: Vec::new(),
                ticker: None,
            };
        };
        if let Some(b) = &self.plan_bar {
            b.set_position(plan.position as u64);
            b.set_message(plan.name.clone());
        }
        let millis = u64::try_from(length.as_millis()).unwrap_or(u64::MAX).max(1);
        let bars: Vec<ProgressBar> = self
            .targets
            .iter()
            .map(|t| {
                let bar = multi.add(ProgressBar::new(millis));
                bar.set_style(style("{prefix} [{bar:24}] {msg}"));
                bar.set_prefix(format!("{} [{t}]", plan.name));
                bar
            })
            .collect();
        let start_counts: Vec<(u64, u64)> = (0..self.targets.len())
            .map(|i| self.sink.counts(i))
            .collect();
        let sink = Arc::clone(&self.sink);
        let tick_bars = bars.clone();
        let started = Instant::now();
        let ticker = AbortOnDropHandle::new(tokio::spawn(async move {
            let mut every = tokio::time::interval(TICK);
            loop {
                every.tick().await;
                let elapsed = started.elapsed();
                for (i, bar) in tick_bars.iter().enumerate() {
                    let (r, e) = sink.counts(i);
                    let (r0, e0) = start_counts[i];
                    let phase = if elapsed > length { " draining" } else { "" };
                    bar.set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
                    bar.set_message(format!(
                        "{}/{}{phase}  requests {}  errors {}",
                        secs(elapsed.min(length)),
                        secs(length),
                        r - r0,
                        e - e0
                    ));
                }
            }
        }));
        StepProgress {
            bars,
            ticker: Some(ticker),
        }
    }

    /// Shows the step's results (per target: its total, or its only label set).
    fn finish(&self, step: StepProgress, results: &[StepResult], cut: bool) {
        if let Some(t) = step.ticker {
            t.abort();
        }
        let per_target = |target: &str| {
            results
                .iter()
                .find(|r| r.labels.target == target && r.total)
                .or_else(|| results.iter().find(|r| r.labels.target == target))
        };
        for (i, t) in self.targets.iter().enumerate() {
            let text = if cut {
                "interrupted; not reported".to_owned()
            } else {
                per_target(t)
                    .map(|r| summary(&r.measurements))
                    .unwrap_or_else(|| "no requests finished".into())
            };
            match step.bars.get(i) {
                Some(bar) => bar.finish_with_message(text),
                None => tracing::info!("  {t}: {text}"),
            }
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Option<StepProgress>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the display.
    pub fn done(&self, finished: usize) {
        if let Some(b) = &self.plan_bar {
            b.set_position(finished as u64);
            b.finish_with_message("done");
        }
    }
}

/// The display follows the schedule as every other consumer does.
impl Sink for Progress {
    fn request(&self, _: &Finished<'_>) {}

    fn step_started(&self, step: &StepInfo) {
        let shown = self.start(step);
        if let Some(previous) = self.running().replace(shown) {
            self.finish(previous, &[], true);
        }
    }

    fn step_finished(&self, _step: &StepInfo, results: Option<&[StepResult]>) {
        if let Some(shown) = self.running().take() {
            self.finish(shown, results.unwrap_or_default(), results.is_none());
        }
    }
}
