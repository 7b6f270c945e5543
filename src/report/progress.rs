//! The progress displays of `bench` and `bench --search`, and what they share: where the
//! progress goes ([`Display`]: live bars on a terminal, plain log lines otherwise), the clock of
//! the time elapsed and about how long is left ([`PlanClock`]), the ticker that refreshes live
//! bars.
//!
//! The bench's display ([`Progress`]): on a terminal, one live bar per target for the running
//! step (workload and step, elapsed / scheduled duration, requests, errors) under a bar of the
//! whole plan (its scheduled time done, the time elapsed and about how long is left); otherwise
//! one plain log line when a step starts, with the plan's share done and the time left, and one
//! per target when it ends. The search's display is `search_progress`.

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

/// Whether a command's progress is drawn as live bars: both stdout (its result) and stderr (the
/// bars) are terminals. Otherwise it is plain log lines, which a log or a pipe keeps readable.
pub fn live_on_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

/// Where a progress display goes: live bars drawn on stderr, or plain log lines.
pub(crate) struct Display {
    live: Option<MultiProgress>,
}

impl Display {
    /// `live`: bars on stderr (see [`live_on_terminal`]); else log lines.
    pub(crate) fn new(live: bool) -> Display {
        Display {
            live: live.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
        }
    }

    pub(crate) fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// A bar of `length` in `template` below the ones shown so far; `None` when logging.
    pub(crate) fn bar(&self, length: u64, template: &str) -> Option<ProgressBar> {
        let bar = self.live.as_ref()?.add(ProgressBar::new(length));
        bar.set_style(style(template));
        Some(bar)
    }

    /// A line of text: below the bars shown so far when live (wrapped, not cut, where it is
    /// wider than the terminal), a log record otherwise.
    pub(crate) fn line(&self, text: String) {
        match self.bar(0, "{msg}") {
            Some(bar) => bar.finish_with_message(text),
            None => tracing::info!("{text}"),
        }
    }
}

/// Calls `refresh` every [`TICK`], for as long as the handle lives (it is aborted when dropped).
pub(crate) fn ticker(mut refresh: impl FnMut() + Send + 'static) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(async move {
        let mut every = tokio::time::interval(TICK);
        loop {
            every.tick().await;
            refresh();
        }
    }))
}

/// How far a plan of steps (a bench's, a search's probes) is and how long it has left. A step
/// takes longer than its scheduled length (its drain, the server-metric samples and calibration
/// around it), so the time left is the scheduled time left scaled by how much longer the
/// finished steps took than scheduled: with steps of one length, the steps left times the
/// measured length of one.
#[derive(Debug, Clone)]
pub(crate) struct PlanClock {
    /// Each step's scheduled length (warmup and steady window), in plan order.
    lengths: Vec<Duration>,
    /// When the first step started.
    first_start: Option<Instant>,
    /// The scheduled length of the steps that finished, and when the last of them did.
    done: Duration,
    last_finish: Option<Instant>,
    /// The running step: its position and start.
    running: Option<(usize, Instant)>,
}

impl PlanClock {
    pub(crate) fn new(lengths: Vec<Duration>) -> PlanClock {
        PlanClock {
            lengths,
            first_start: None,
            done: Duration::ZERO,
            last_finish: None,
            running: None,
        }
    }

    /// Replaces the schedule from `position` on with `rest` (a search learns its probes' lengths
    /// and how many more there can be as it goes). The steps before `position` are kept.
    pub(crate) fn replan(&mut self, position: usize, rest: impl IntoIterator<Item = Duration>) {
        self.lengths.truncate(position);
        self.lengths.extend(rest);
    }

    pub(crate) fn started(&mut self, position: usize, now: Instant) {
        self.first_start.get_or_insert(now);
        self.running = Some((position, now));
    }

    pub(crate) fn finished(&mut self, now: Instant) {
        if let Some((position, _)) = self.running.take() {
            self.done += self.lengths.get(position).copied().unwrap_or_default();
            self.last_finish = Some(now);
        }
    }

    /// The plan's whole scheduled length.
    pub(crate) fn total(&self) -> Duration {
        self.lengths.iter().sum()
    }

    /// Its scheduled time done at `now`: the finished steps and the running one so far.
    pub(crate) fn scheduled_done(&self, now: Instant) -> Duration {
        let running = self.running.map_or(Duration::ZERO, |(position, since)| {
            let length = self.lengths.get(position).copied().unwrap_or_default();
            now.saturating_duration_since(since).min(length)
        });
        (self.done + running).min(self.total())
    }

    /// Wall time since the first step started.
    pub(crate) fn elapsed(&self, now: Instant) -> Duration {
        self.first_start
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    /// About how long the plan has left at `now`.
    pub(crate) fn left(&self, now: Instant) -> Duration {
        let scheduled_left = self.total().saturating_sub(self.scheduled_done(now));
        // Wall time per scheduled second so far, from the steps that finished (never below 1:
        // a step does not end before its schedule).
        let slower = match (self.first_start, self.last_finish) {
            (Some(first), Some(last)) if !self.done.is_zero() => {
                (last.saturating_duration_since(first).as_secs_f64() / self.done.as_secs_f64())
                    .max(1.0)
            }
            _ => 1.0,
        };
        scheduled_left.mul_f64(slower)
    }

    /// `12 % of the plan, 1m 5s elapsed, about 4m 20s left` (whole seconds).
    pub(crate) fn describe(&self, now: Instant) -> String {
        let total = self.total().as_secs_f64();
        let share = if total > 0.0 {
            100.0 * self.scheduled_done(now).as_secs_f64() / total
        } else {
            100.0
        };
        format!("{share:.0} % of the plan, {}", self.times(now))
    }

    /// `1m 5s elapsed, about 4m 20s left` (whole seconds).
    pub(crate) fn times(&self, now: Instant) -> String {
        format!(
            "{} elapsed, about {} left",
            whole(self.elapsed(now)),
            whole(self.left(now))
        )
    }
}

/// A duration in whole seconds, as the config writes it (`1m 5s`).
pub(crate) fn whole(d: Duration) -> String {
    crate::config::duration::format(Duration::from_secs(d.as_secs_f64().round() as u64))
}

pub(crate) struct Progress {
    display: Display,
    plan_bar: Option<ProgressBar>,
    clock: Arc<Mutex<PlanClock>>,
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

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// `3.1s/5.0s` into a step of `length`, ` draining` past it.
pub(crate) fn step_time(elapsed: Duration, length: Duration) -> String {
    let phase = if elapsed > length { " draining" } else { "" };
    format!("{}/{}{phase}", secs(elapsed.min(length)), secs(length))
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
    /// `lengths`: each step's scheduled length, in plan order.
    pub fn new(
        live: bool,
        lengths: Vec<Duration>,
        targets: Vec<String>,
        sink: Arc<BenchSink>,
    ) -> Progress {
        let clock = PlanClock::new(lengths);
        let display = Display::new(live);
        let plan_bar = display.bar(millis(clock.total()), "plan [{bar:24}] {wide_msg}");
        Progress {
            display,
            plan_bar,
            clock: Arc::new(Mutex::new(clock)),
            targets,
            sink,
            running: Mutex::new(None),
        }
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, PlanClock> {
        self.clock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shows a step starting.
    fn start(&self, plan: &StepInfo) -> StepProgress {
        let length = plan.warmup + plan.steady;
        let now = Instant::now();
        self.clock().started(plan.position, now);
        if !self.display.is_live() {
            self.display.line(format!(
                "[{}/{}] {}: {} warmup + {} steady on {} targets; {}",
                plan.position + 1,
                plan.steps,
                plan.name,
                secs(plan.warmup),
                secs(plan.steady),
                self.targets.len(),
                self.clock().describe(now)
            ));
            return StepProgress {
                bars: Vec::new(),
                ticker: None,
            };
        }
        let step_of = format!("step {}/{}", plan.position + 1, plan.steps);
        let bars: Vec<ProgressBar> = self
            .targets
            .iter()
            .filter_map(|t| {
                let bar = self
                    .display
                    .bar(millis(length).max(1), "{prefix} [{bar:24}] {msg}")?;
                bar.set_prefix(format!("{} [{t}]", plan.name));
                Some(bar)
            })
            .collect();
        let start_counts: Vec<(u64, u64)> = (0..self.targets.len())
            .map(|i| self.sink.counts(i))
            .collect();
        let sink = Arc::clone(&self.sink);
        let tick_bars = bars.clone();
        let plan_bar = self.plan_bar.clone();
        let clock = Arc::clone(&self.clock);
        let started = now;
        let ticker = ticker(move || {
            let elapsed = started.elapsed();
            if let Some(bar) = &plan_bar {
                let clock = clock.lock().unwrap_or_else(PoisonError::into_inner).clone();
                let now = Instant::now();
                bar.set_position(millis(clock.scheduled_done(now)));
                // The bar shows the share done; the line is kept short for it.
                bar.set_message(format!("{step_of}, {}", clock.times(now)));
            }
            for (i, bar) in tick_bars.iter().enumerate() {
                let (r, e) = sink.counts(i);
                let (r0, e0) = start_counts[i];
                bar.set_position(millis(elapsed));
                bar.set_message(format!(
                    "{}  requests {}  errors {}",
                    step_time(elapsed, length),
                    r - r0,
                    e - e0
                ));
            }
        });
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
        self.clock().finished(Instant::now());
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
                None => self.display.line(format!("  {t}: {text}")),
            }
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Option<StepProgress>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the display.
    pub fn done(&self, finished: usize) {
        let elapsed = self.clock().elapsed(Instant::now());
        let text = format!(
            "{finished} of {} steps in {}",
            self.clock().lengths.len(),
            crate::config::duration::format(Duration::from_secs(elapsed.as_secs()))
        );
        match &self.plan_bar {
            Some(b) => {
                b.set_position(millis(self.clock().scheduled_done(Instant::now())));
                b.finish_with_message(text);
            }
            None => self.display.line(format!("plan: {text}")),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_left_is_the_scheduled_rest_scaled_by_how_much_longer_steps_took() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut c = PlanClock::new(vec![Duration::from_secs(60); 4]);
        assert_eq!(c.left(t0), Duration::from_secs(240));
        c.started(0, at(0));
        // Halfway through the first step: no step finished, the schedule is the estimate.
        assert_eq!(c.left(at(30)), Duration::from_secs(210));
        assert_eq!(c.scheduled_done(at(30)), Duration::from_secs(30));
        // Past its length while it drains: the step counts as its length, no more.
        assert_eq!(c.scheduled_done(at(70)), Duration::from_secs(60));
        c.finished(at(75));
        c.started(1, at(75));
        // 75 s of wall time for 60 s of schedule: the other 180 s take about 225 s.
        assert_eq!(c.left(at(75)), Duration::from_secs(225));
        assert_eq!(
            c.describe(at(75)),
            "25 % of the plan, 1m 15s elapsed, about 3m 45s left"
        );
        c.finished(at(135));
        c.started(2, at(135));
        c.finished(at(195));
        c.started(3, at(195));
        c.finished(at(255));
        assert_eq!(c.left(at(255)), Duration::ZERO);
        assert_eq!(c.scheduled_done(at(255)), c.total());
    }

    #[test]
    fn a_plan_learnt_as_it_goes_keeps_what_finished() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // A search: up to three probes of 10 s.
        let mut c = PlanClock::new(vec![Duration::from_secs(10); 3]);
        c.started(0, at(0));
        c.finished(at(12));
        // The next probe is longer, and at most one more follows it.
        c.replan(1, [Duration::from_secs(20); 2]);
        c.started(1, at(12));
        assert_eq!(c.total(), Duration::from_secs(50));
        // 12 s per 10 s scheduled: 40 s scheduled left take 48 s.
        assert_eq!(c.left(at(12)), Duration::from_secs(48));
        c.finished(at(36));
        // The bisection ended: nothing more is planned.
        c.replan(2, []);
        assert_eq!(c.left(at(36)), Duration::ZERO);
        assert_eq!(c.scheduled_done(at(36)), c.total());
    }
}
