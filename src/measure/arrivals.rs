//! Saturation: whether the server kept up with an open-loop step's arrivals, judged from what the
//! schedule intended in the steady window, what got an in-flight slot and was sent, and how the
//! wait from the intended send to the first token moved through the window (docs/METRICS.md,
//! "Saturation").
//!
//! Saturated is the server's state, distinct from degraded (the canary's own lag) and faulted
//! (errors): the arrivals queued, in the client for a free slot (`rate.max_inflight`) or in the
//! server, faster than they were served. Closed-loop steps set their own pace and cannot fall
//! behind a schedule.

use serde::Serialize;

/// A step is saturated when more than this share of its steady window's arrivals (and more than
/// one: the last arrival may meet the end of sending) never got a slot before sending ended ...
pub const MISSED_SHARE: f64 = 0.01;

/// ... or when more than this share of the arrivals it sent (and more than one) were still
/// waiting for their first token when the step cut them, while others were answered (a server
/// that answers nobody is down, not behind: that is a fault) ...
///
/// ... or when the mean wait for the first token (intended send → first token: the slot wait,
/// the server's queue and the prefill) of the arrivals of the window's last third exceeds that of
/// its first third by more than this share of the window and at least [`GROWTH_MIN_SECONDS`]: a
/// queue that grows so much within one window is one the server is not draining.
pub const GROWTH_SHARE: f64 = 0.05;
pub const GROWTH_MIN_SECONDS: f64 = 0.1;

/// Counts one target's arrivals over one step's steady window (offsets in seconds from its start).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Arrivals {
    window: f64,
    intended: u64,
    sent: u64,
    /// Sent arrivals that had a first token, and those cut without one (`timeout`).
    answered: u64,
    unanswered: u64,
    /// Sum of waits for the first token and count, of the arrivals intended in the first third.
    first: (f64, u64),
    /// The same for the last third.
    last: (f64, u64),
}

/// What the arrivals of one step at one target came to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ArrivalSummary {
    /// Arrivals the schedule intended in the steady window.
    pub intended: u64,
    /// Of them, those that got a slot before sending ended.
    pub sent: u64,
    /// Of those, the ones cut (`timeout`) before their first token.
    pub unanswered: u64,
    /// `sent / intended`: the achieved share of the intended arrival rate.
    pub arrival_ratio: f64,
    /// Mean wait for the first token of the window's last third minus that of its first third,
    /// in seconds; `None` when either third had no first token.
    pub queue_growth_seconds: Option<f64>,
}

impl Arrivals {
    pub fn new(window_seconds: f64) -> Self {
        Arrivals {
            window: window_seconds.max(0.0),
            ..Arrivals::default()
        }
    }

    fn in_window(&self, at: f64) -> bool {
        (0.0..self.window).contains(&at)
    }

    /// The schedule intended an arrival `at` seconds into the window (outside it: not counted).
    pub fn intended(&mut self, at: f64) {
        self.intended += u64::from(self.in_window(at));
    }

    /// The arrival intended `at` seconds into the window got a slot and was sent.
    pub fn sent(&mut self, at: f64) {
        self.sent += u64::from(self.in_window(at));
    }

    /// The arrival intended `at` seconds into the window timed out before its first token.
    pub fn unanswered(&mut self, at: f64) {
        self.unanswered += u64::from(self.in_window(at));
    }

    /// The arrival intended `at` seconds into the window had its first token `wait` seconds after.
    pub fn first_token(&mut self, at: f64, wait: f64) {
        if !self.in_window(at) {
            return;
        }
        self.answered += 1;
        let third = self.window / 3.0;
        let bucket = if at < third {
            &mut self.first
        } else if at >= 2.0 * third {
            &mut self.last
        } else {
            return;
        };
        bucket.0 += wait.max(0.0);
        bucket.1 += 1;
    }

    pub fn summary(&self) -> ArrivalSummary {
        let mean = |(sum, n): (f64, u64)| (n > 0).then(|| sum / n as f64);
        ArrivalSummary {
            intended: self.intended,
            sent: self.sent,
            unanswered: self.unanswered,
            arrival_ratio: if self.intended == 0 {
                1.0
            } else {
                self.sent as f64 / self.intended as f64
            },
            queue_growth_seconds: mean(self.last).zip(mean(self.first)).map(|(l, f)| l - f),
        }
    }

    /// Whether the server fell behind the arrivals (see [`MISSED_SHARE`] and [`GROWTH_SHARE`]).
    pub fn saturated(&self) -> bool {
        let missed = self.intended.saturating_sub(self.sent);
        let short = missed > 1 && missed as f64 > MISSED_SHARE * self.intended as f64;
        let behind = self.answered > 0
            && self.unanswered > 1
            && self.unanswered as f64 > MISSED_SHARE * self.sent as f64;
        let limit = GROWTH_MIN_SECONDS.max(GROWTH_SHARE * self.window);
        let grew = self
            .summary()
            .queue_growth_seconds
            .is_some_and(|g| g > limit);
        short || behind || grew
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` arrivals evenly over a `window`, each sent after `wait(at)` unless `sent(at)` is false.
    fn run(window: f64, n: u32, sent: impl Fn(f64) -> bool, wait: impl Fn(f64) -> f64) -> Arrivals {
        let mut a = Arrivals::new(window);
        for i in 0..n {
            let at = window * f64::from(i) / f64::from(n);
            a.intended(at);
            if sent(at) {
                a.sent(at);
                a.first_token(at, wait(at));
            }
        }
        a
    }

    #[test]
    fn a_server_that_keeps_up_is_not_saturated() {
        // Short waits that come and go (a burst of arrivals) are not a growing queue.
        let a = run(60.0, 600, |_| true, |at| if at > 50.0 { 0.05 } else { 0.0 });
        let s = a.summary();
        assert_eq!((s.intended, s.sent, s.arrival_ratio), (600, 600, 1.0));
        assert!(!a.saturated());
        // One arrival meeting the end of sending is not a shortfall.
        assert!(!run(60.0, 600, |at| at < 59.85, |_| 0.0).saturated());
    }

    #[test]
    fn arrivals_left_unsent_mark_the_step() {
        // 10 % of the window's arrivals never got a slot.
        let a = run(60.0, 600, |at| at < 54.0, |_| 0.0);
        assert_eq!(a.summary().sent, 540);
        assert!((a.summary().arrival_ratio - 0.9).abs() < 1e-9);
        assert!(a.saturated());
    }

    #[test]
    fn arrivals_still_unanswered_when_cut_mark_the_step_unless_none_was_answered() {
        // The server answered the first half and then fell so far behind that the rest were cut
        // before their first token.
        let mut a = run(60.0, 600, |_| true, |_| 0.1);
        let mut behind = Arrivals::new(60.0);
        for i in 0..600 {
            let at = f64::from(i) / 10.0;
            behind.intended(at);
            behind.sent(at);
            if at < 30.0 {
                behind.first_token(at, 0.1);
            } else {
                behind.unanswered(at);
            }
        }
        assert_eq!(behind.summary().unanswered, 300);
        assert!(behind.saturated());
        // A server that answered nobody is down: faulted, not saturated.
        let mut down = Arrivals::new(60.0);
        for i in 0..600 {
            let at = f64::from(i) / 10.0;
            down.intended(at);
            down.sent(at);
            down.unanswered(at);
        }
        assert!(!down.saturated());
        // One arrival cut at the very end is not a backlog.
        a.unanswered(59.9);
        assert!(!a.saturated());
    }

    #[test]
    fn a_queue_that_grows_through_the_window_marks_the_step() {
        // Every arrival is sent, but each waits longer for its first token than the one before:
        // 0 → 6 s.
        let a = run(60.0, 600, |_| true, |at| at / 10.0);
        let growth = a.summary().queue_growth_seconds.unwrap();
        assert!((growth - 4.0).abs() < 0.05, "{growth}");
        assert!(a.saturated());
        // The same growth over a window 100 times longer is within the bar (5 % of 6,000 s).
        assert!(!run(6000.0, 600, |_| true, |at| at / 1000.0).saturated());
    }

    #[test]
    fn arrivals_outside_the_window_do_not_count() {
        let mut a = Arrivals::new(10.0);
        a.intended(-1.0);
        a.sent(-1.0);
        a.first_token(-1.0, 5.0);
        a.intended(10.0);
        let s = a.summary();
        assert_eq!((s.intended, s.sent, s.queue_growth_seconds), (0, 0, None));
        assert_eq!(s.arrival_ratio, 1.0);
        assert!(!a.saturated());
    }
}
