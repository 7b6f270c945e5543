//! The progress display of `bench --search`, made of the bench's pieces (`progress`): on a
//! terminal, a bar of the whole search (its probes' scheduled time done, the probe running, the
//! time elapsed and about how long is left) over one bar per probe (target and concurrency,
//! elapsed / scheduled length, requests, errors), each left showing its result when it ends, and a
//! line per target with what was found; otherwise the same as plain log lines: one when a probe
//! starts, one when it ends, one per target found, one at the end.
//!
//! A bisection over `n` levels needs at most ⌊log2 n⌋ + 1 probes, so the display counts probes
//! against that bound (`probe 2/≤4`), and the time left is the probes that may be left (the
//! running target's and the following targets') times the measured length of a probe
//! ([`PlanClock`]: the scheduled length scaled by how much longer the finished probes took).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use indicatif::ProgressBar;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::progress::{Display, PlanClock, millis, step_time, ticker, whole};
use crate::model::{Finished, Sink};

/// The most probes a bisection over `levels` levels takes: ⌊log2 levels⌋ + 1 (none for none).
/// Each probe leaves at most half of the levels not yet decided, rounded down.
pub fn probes_at_most(levels: usize) -> usize {
    (usize::BITS - levels.leading_zeros()) as usize
}

/// Requests finished and errors so far, of whichever target is being probed: the sink the
/// search's runner records into, read by the live bars.
#[derive(Default)]
pub(crate) struct ProbeCounts {
    requests: AtomicU64,
    errors: AtomicU64,
}

impl ProbeCounts {
    fn now(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

impl Sink for ProbeCounts {
    fn request(&self, req: &Finished<'_>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if req.sample.outcome.is_error() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One probe as it starts.
pub(crate) struct ProbeStart<'a> {
    pub target: &'a str,
    /// Its number in the target's search, from 1.
    pub number: usize,
    /// The most probes the target's search can take, this one included.
    pub at_most: usize,
    pub concurrency: u32,
    /// Its scheduled length (warmup and measured window).
    pub length: Duration,
}

/// The display of the running probe.
struct Running {
    /// `[probe 2/≤4] small`, which its log lines begin with.
    label: String,
    concurrency: u32,
    bar: Option<ProgressBar>,
    /// Refreshes the bars while the probe runs (aborted when dropped).
    _ticker: Option<AbortOnDropHandle<()>>,
}

pub(crate) struct SearchProgress {
    display: Display,
    search_bar: Option<ProgressBar>,
    clock: Arc<Mutex<PlanClock>>,
    counts: Arc<ProbeCounts>,
    /// The most probes each target's search takes, in search order, and the scheduled length of a
    /// probe before any window is lengthened.
    bounds: Vec<usize>,
    probe_length: Duration,
    /// The target being searched (its index in `bounds`) and when it started.
    target: (usize, Option<Instant>),
    /// Probes started so far, all targets together.
    started: usize,
    running: Option<Running>,
}

impl SearchProgress {
    /// `bounds`: the most probes of each target's search, in order; `probe_length`: a probe's
    /// configured warmup and measured window.
    pub(crate) fn new(
        live: bool,
        bounds: Vec<usize>,
        probe_length: Duration,
        counts: Arc<ProbeCounts>,
    ) -> SearchProgress {
        let total: usize = bounds.iter().sum();
        let clock = PlanClock::new(vec![probe_length; total]);
        let display = Display::new(live);
        let search_bar = display.bar(millis(clock.total()), "search [{bar:24}] {wide_msg}");
        SearchProgress {
            display,
            search_bar,
            clock: Arc::new(Mutex::new(clock)),
            counts,
            bounds,
            probe_length,
            target: (0, None),
            started: 0,
            running: None,
        }
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, PlanClock> {
        self.clock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The search of the target at `index` (of the `bounds` given) begins.
    pub(crate) fn target_started(&mut self, index: usize) {
        self.target = (index, Some(Instant::now()));
    }

    /// Shows a probe starting: the schedule is now the probes started, this one, the most its
    /// target may still take at this one's length, and the following targets' at the configured.
    pub(crate) fn probe_started(&mut self, p: &ProbeStart<'_>) {
        self.close(None);
        let now = Instant::now();
        let later: usize = self.bounds.iter().skip(self.target.0 + 1).sum();
        let position = self.started;
        self.started += 1;
        {
            let mut clock = self.clock();
            let own = p.at_most.saturating_sub(p.number) + 1;
            clock.replan(
                position,
                std::iter::repeat_n(p.length, own)
                    .chain(std::iter::repeat_n(self.probe_length, later)),
            );
            clock.started(position, now);
        }
        let label = format!("[probe {}/≤{}] {}", p.number, p.at_most, p.target);
        if !self.display.is_live() {
            self.display.line(format!(
                "{label}: concurrency {}; {}",
                p.concurrency,
                self.clock().times(now)
            ));
            self.running = Some(Running {
                label,
                concurrency: p.concurrency,
                bar: None,
                _ticker: None,
            });
            return;
        }
        let bar = self
            .display
            .bar(millis(p.length).max(1), "{prefix} [{bar:24}] {msg}");
        if let Some(b) = &bar {
            b.set_prefix(format!("{} c={}", p.target, p.concurrency));
        }
        let ticker = self.live_ticker(bar.clone(), p, now);
        self.running = Some(Running {
            label,
            concurrency: p.concurrency,
            bar,
            _ticker: Some(ticker),
        });
    }

    /// Refreshes the search's bar and the probe's while it runs.
    fn live_ticker(
        &self,
        bar: Option<ProgressBar>,
        p: &ProbeStart<'_>,
        started: Instant,
    ) -> AbortOnDropHandle<()> {
        let (search_bar, clock, counts) = (
            self.search_bar.clone(),
            Arc::clone(&self.clock),
            Arc::clone(&self.counts),
        );
        let (r0, e0) = counts.now();
        let (length, probe_of) = (p.length, format!("probe {}/≤{}", p.number, p.at_most));
        let target = p.target.to_owned();
        ticker(move || {
            let now = Instant::now();
            if let Some(b) = &search_bar {
                let clock = clock.lock().unwrap_or_else(PoisonError::into_inner).clone();
                b.set_length(millis(clock.total()).max(1));
                b.set_position(millis(clock.scheduled_done(now)));
                b.set_message(format!("{target}, {probe_of}, {}", clock.times(now)));
            }
            if let Some(b) = &bar {
                let elapsed = now.saturating_duration_since(started);
                let (r, e) = counts.now();
                b.set_position(millis(elapsed));
                b.set_message(format!(
                    "{probe_of}  {}  requests {}  errors {}",
                    step_time(elapsed, length),
                    r - r0,
                    e - e0
                ));
            }
        })
    }

    /// Shows the running probe's result (`p99(ttft) 412.3 ms < 500ms, met`; the log line puts
    /// its concurrency first, `c=16: …`, which the live bar has in front).
    pub(crate) fn probe_finished(&mut self, result: String) {
        self.close(Some(result));
    }

    /// Ends the running probe's display, with `result`, or as not finished.
    fn close(&mut self, result: Option<String>) {
        let Some(running) = self.running.take() else {
            return;
        };
        self.clock().finished(Instant::now());
        let result = result.unwrap_or_else(|| "not finished".into());
        match &running.bar {
            Some(bar) => bar.finish_with_message(result),
            None => self.display.line(format!(
                "{}: c={}: {result}",
                running.label, running.concurrency
            )),
        }
    }

    /// Shows what the target's search found (`small: found max concurrency 4 (…); 3 probes in
    /// 15s`), with its probes and how long they took.
    pub(crate) fn target_finished(&mut self, found: String, probes: usize) {
        self.close(None);
        let took = self.target.1.map_or(Duration::ZERO, |s| {
            Instant::now().saturating_duration_since(s)
        });
        let plural = if probes == 1 { "" } else { "s" };
        self.display.line(format!(
            "{found}; {probes} probe{plural} in {}",
            whole(took)
        ));
    }

    /// Closes the display.
    pub(crate) fn done(&mut self, targets: usize) {
        self.close(None);
        // The probes that may have been left did not run.
        let started = self.started;
        self.clock().replan(started, []);
        let elapsed = self.clock().elapsed(Instant::now());
        let plural = if targets == 1 { "" } else { "s" };
        let text = format!(
            "{} probes on {targets} target{plural} in {}",
            self.started,
            whole(elapsed)
        );
        match &self.search_bar {
            Some(b) => {
                let clock = self.clock().clone();
                b.set_length(millis(clock.total()).max(1));
                b.set_position(millis(clock.scheduled_done(Instant::now())));
                b.finish_with_message(text);
            }
            None => self.display.line(format!("search: {text}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bisection of `report::search` over `n` levels, each probe going the way that leaves
    /// more undecided: the worst case.
    fn worst_case(n: usize) -> usize {
        let (mut lo, mut hi): (Option<usize>, usize) = (None, n);
        let mut probes = 0;
        while lo.map_or(0, |l| l + 1) < hi {
            let a = lo.map_or(0, |l| l + 1);
            let mid = (a + hi - 1) / 2;
            probes += 1;
            // Met: `mid + 1..hi` left; not met: `a..mid`.
            let (if_met, if_not) = (hi - (mid + 1), mid - a);
            if if_met >= if_not {
                lo = Some(mid);
            } else {
                hi = mid;
            }
        }
        probes
    }

    #[test]
    fn the_bound_is_the_bisections_worst_case() {
        for n in 0..=64 {
            assert_eq!(probes_at_most(n), worst_case(n), "{n} levels");
        }
        // The ladder up to 64 (7 levels), to 256 (9), to 4096 (13).
        assert_eq!(
            (probes_at_most(7), probes_at_most(9), probes_at_most(13)),
            (3, 4, 4)
        );
    }
}
