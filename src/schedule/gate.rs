//! When the canary may send (docs/DESIGN.md §5): the operators' pauses (the config's
//! `schedule.paused`, `POST /-/pause`, the Deployment's `llm-canary.io/paused` annotation) and
//! the `schedule.active` windows. The scheduler starts a step only while the gate is open and the
//! window in force outlasts the step, and cuts a step in progress when the gate closes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::{Timestamp, ToSpan};
use tokio::sync::watch;

use crate::config::{DAY_MINUTES, WindowSet};

/// Longest the gate sleeps without looking at the wall clock again, so a clock step (NTP, a
/// suspended VM) moves a window boundary by at most this much.
const RECHECK: Duration = Duration::from_secs(60);

/// The wall clock the windows are read on. The system clock in the daemon; tests under paused
/// tokio time use [`TokioClock`].
pub trait WallClock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A wall clock that follows tokio's clock from `base`, so a test with paused time crosses
/// window boundaries as fast as tokio advances.
pub struct TokioClock {
    base: Timestamp,
    at: tokio::time::Instant,
}

impl TokioClock {
    pub fn starting_at(base: Timestamp) -> Self {
        Self {
            base,
            at: tokio::time::Instant::now(),
        }
    }
}

impl WallClock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.at);
        self.base
            .checked_add(
                jiff::SignedDuration::try_from(elapsed).unwrap_or(jiff::SignedDuration::MAX),
            )
            .unwrap_or(Timestamp::MAX)
    }
}

/// Where an operator's pause came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Switch {
    /// `schedule.paused: true` in the config.
    Config,
    /// `POST /-/pause`.
    Http,
    /// The Deployment's `llm-canary.io/paused` annotation.
    Annotation,
}

impl Switch {
    pub fn as_str(self) -> &'static str {
        match self {
            Switch::Config => "config",
            Switch::Http => "http",
            Switch::Annotation => "annotation",
        }
    }
}

/// The gate now: who paused it, and where the windows stand.
#[derive(Debug, Clone, PartialEq)]
pub struct GateState {
    pub operator: Vec<(Switch, String)>,
    /// Inside a window (always, without `schedule.active`).
    pub in_window: bool,
    /// The next window boundary; `None` without windows.
    pub next_change: Option<Timestamp>,
    pub now: Timestamp,
}

impl GateState {
    pub fn open(&self) -> bool {
        self.operator.is_empty() && self.in_window
    }

    /// How long the window in force still lasts (`None`: no end).
    pub fn open_for(&self) -> Option<Duration> {
        self.next_change
            .map(|t| Duration::try_from(t.duration_since(self.now)).unwrap_or(Duration::ZERO))
    }

    /// How long until the gate should be looked at again.
    fn recheck_in(&self) -> Duration {
        self.open_for().map_or(RECHECK, |d| d.min(RECHECK))
    }
}

/// The longest note kept, escaped (a note of 256 bytes of bidi controls escapes to 683).
const MAX_NOTE_BYTES: usize = 1024;

struct Inner {
    switches: BTreeMap<Switch, String>,
    windows: Option<WindowSet>,
    /// Whether the last look found the time inside a window (`None`: no look yet), so that
    /// entering and leaving quiet hours is logged once each, however many look.
    in_window: Option<bool>,
}

/// The gate, shared by the scheduler, the HTTP surface and the annotation watch.
pub struct Gate {
    inner: Mutex<Inner>,
    clock: Arc<dyn WallClock>,
    /// Bumped on every change of a switch or of the windows.
    changed: watch::Sender<u64>,
}

impl Gate {
    pub fn new(clock: Arc<dyn WallClock>) -> Gate {
        Gate {
            inner: Mutex::new(Inner {
                switches: BTreeMap::new(),
                windows: None,
                in_window: None,
            }),
            clock,
            changed: watch::channel(0).0,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Pauses (`Some(note)`) or lifts the pause (`None`) of one switch; the gate is open only
    /// while no switch is set. Returns whether anything changed. The note, from an HTTP request
    /// or an annotation, is kept with its control characters, line separators and bidi
    /// overrides and isolates escaped (`\u{202e}`), so that neither its log line nor the
    /// status can be forged or reordered on a terminal.
    pub fn set(&self, switch: Switch, pause: Option<String>) -> bool {
        let pause = pause.map(|note| {
            crate::client::sanitize(&note, MAX_NOTE_BYTES, &crate::client::Secrets::none())
        });
        let changed = self.with(|i| match pause {
            Some(note) => i.switches.insert(switch, note.clone()) != Some(note),
            None => i.switches.remove(&switch).is_some(),
        });
        if changed {
            match self.with(|i| i.switches.get(&switch).cloned()) {
                Some(note) => tracing::warn!(by = switch.as_str(), %note, "traffic paused"),
                None => tracing::info!(by = switch.as_str(), "pause lifted"),
            }
            self.bump();
        }
        changed
    }

    /// Replaces the windows (a reload); `None` is always open.
    pub fn set_windows(&self, windows: Option<WindowSet>) {
        self.with(|i| i.windows = windows);
        self.bump();
    }

    /// The gate as of now. The first look that finds the time outside the windows after one
    /// inside (or at the start) logs that quiet hours began, and the first inside after one
    /// outside that they ended: once each, whoever looks.
    pub fn state(&self) -> GateState {
        self.with(|i| {
            // Read under the lock, so two looks across a boundary log in the clock's order.
            let now = self.clock.now();
            let (in_window, next_change) = match &i.windows {
                None => (true, None),
                Some(w) => window_state(w, now),
            };
            let before = i.in_window.replace(in_window);
            if before != Some(in_window) {
                log_quiet_hours(in_window, before.is_some(), next_change, i.windows.as_ref());
            }
            GateState {
                operator: i.switches.iter().map(|(s, n)| (*s, n.clone())).collect(),
                in_window,
                next_change,
                now,
            }
        })
    }

    /// Waits until something may have changed: a switch, the windows, or the next boundary
    /// (at most [`RECHECK`]) after `state`.
    pub async fn changed_after(&self, state: &GateState) {
        let mut rx = self.changed.subscribe();
        rx.mark_unchanged();
        tokio::select! {
            _ = tokio::time::sleep(state.recheck_in()) => {}
            _ = rx.changed() => {}
        }
    }

    /// Completes when the gate closes (a pause, or the window's end).
    pub async fn closed(&self) {
        loop {
            let state = self.state();
            if !state.open() {
                return;
            }
            self.changed_after(&state).await;
        }
    }
}

/// Says that quiet hours began (`in_window` false) or ended. A first look inside a window says
/// nothing: that is how every run without quiet hours starts.
fn log_quiet_hours(
    in_window: bool,
    looked_before: bool,
    next_change: Option<Timestamp>,
    windows: Option<&WindowSet>,
) {
    let until = match (next_change, windows) {
        (Some(t), Some(w)) => t
            .to_zoned(w.time_zone.clone())
            .strftime("%Y-%m-%d %H:%M %Z")
            .to_string(),
        _ => "further notice".to_owned(),
    };
    if !in_window {
        tracing::info!(
            "quiet hours begin: outside the schedule.active windows until {until}; no step starts"
        );
    } else if looked_before {
        tracing::info!("quiet hours end: traffic resumes, inside schedule.active until {until}");
    }
}

/// Whether `now` is inside a window, and the next boundary (an end when inside, a start when
/// outside). Windows that touch or overlap count as one.
fn window_state(set: &WindowSet, now: Timestamp) -> (bool, Option<Timestamp>) {
    let intervals = intervals(set, now);
    match intervals
        .iter()
        .find(|(start, end)| *start <= now && now < *end)
    {
        Some((_, end)) => (true, Some(*end)),
        None => (false, intervals.iter().map(|(s, _)| *s).find(|s| *s > now)),
    }
}

/// The windows as instants, from the day before `now` (a window that started yesterday may
/// still run) to a week after, sorted and merged.
fn intervals(set: &WindowSet, now: Timestamp) -> Vec<(Timestamp, Timestamp)> {
    let today = now.to_zoned(set.time_zone.clone()).date();
    let mut out: Vec<(Timestamp, Timestamp)> = Vec::new();
    for offset in -1i32..=8 {
        let Ok(day) = today.checked_add(offset.days()) else {
            continue;
        };
        for w in &set.windows {
            if !w.starts_on(day.weekday()) {
                continue;
            }
            let at = |minutes: u32| -> Option<Timestamp> {
                let date = day
                    .checked_add((i64::from(minutes / DAY_MINUTES)).days())
                    .ok()?;
                let m = minutes % DAY_MINUTES;
                let civil = date.at((m / 60) as i8, (m % 60) as i8, 0, 0);
                // A time in a DST gap resolves to the instant after the gap.
                Some(civil.to_zoned(set.time_zone.clone()).ok()?.timestamp())
            };
            let end_minutes = w.from + w.length_minutes();
            if let (Some(start), Some(end)) = (at(w.from), at(end_minutes)) {
                out.push((start, end));
            }
        }
    }
    out.sort();
    let mut merged: Vec<(Timestamp, Timestamp)> = Vec::new();
    for (start, end) in out {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DailyWindow;

    fn set(tz: &str, windows: Vec<DailyWindow>) -> WindowSet {
        WindowSet {
            time_zone: jiff::tz::TimeZone::get(tz).unwrap(),
            time_zone_name: tz.to_owned(),
            windows,
        }
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn nightly() -> DailyWindow {
        // Weekdays 22:00 to 06:00 the next morning.
        DailyWindow {
            days: [true, true, true, true, true, false, false],
            from: 22 * 60,
            to: 6 * 60,
        }
    }

    #[test]
    fn a_window_that_crosses_midnight_is_open_until_the_morning() {
        let w = set("UTC", vec![nightly()]);
        // 2026-12-02 is a Wednesday.
        assert_eq!(
            window_state(&w, ts("2026-12-02T21:59:00Z")),
            (false, Some(ts("2026-12-02T22:00:00Z")))
        );
        assert_eq!(
            window_state(&w, ts("2026-12-03T03:00:00Z")),
            (true, Some(ts("2026-12-03T06:00:00Z")))
        );
        // Friday night's window runs into Saturday; then nothing until Monday 22:00.
        assert_eq!(
            window_state(&w, ts("2026-12-05T05:00:00Z")),
            (true, Some(ts("2026-12-05T06:00:00Z")))
        );
        assert_eq!(
            window_state(&w, ts("2026-12-05T12:00:00Z")),
            (false, Some(ts("2026-12-07T22:00:00Z")))
        );
    }

    #[test]
    fn windows_follow_the_time_zone_and_its_daylight_saving() {
        let w = set(
            "Europe/Berlin",
            vec![DailyWindow {
                days: [true; 7],
                from: 2 * 60,
                to: 4 * 60,
            }],
        );
        // Winter: 02:00 Berlin is 01:00 UTC.
        assert_eq!(
            window_state(&w, ts("2026-12-02T00:30:00Z")),
            (false, Some(ts("2026-12-02T01:00:00Z")))
        );
        // 2027-03-28: clocks jump from 02:00 to 03:00, so the window starts at 03:00 CEST
        // (01:00 UTC) and ends at 04:00 CEST (02:00 UTC).
        assert_eq!(
            window_state(&w, ts("2027-03-28T01:30:00Z")),
            (true, Some(ts("2027-03-28T02:00:00Z")))
        );
    }

    #[test]
    fn touching_windows_merge_and_every_day_all_day_never_ends_early() {
        let all_day = DailyWindow {
            days: [true; 7],
            from: 0,
            to: DAY_MINUTES,
        };
        let w = set("UTC", vec![all_day]);
        let (open, end) = window_state(&w, ts("2026-12-02T12:00:00Z"));
        assert!(open);
        // Merged across the week it covers: the end is days away, not at midnight.
        assert!(end.unwrap() > ts("2026-12-08T00:00:00Z"), "{end:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn switches_close_the_gate_until_all_are_lifted() {
        let gate = Gate::new(Arc::new(TokioClock::starting_at(ts(
            "2026-12-02T12:00:00Z",
        ))));
        assert!(gate.state().open());
        assert!(gate.set(Switch::Http, Some("release".into())));
        assert!(gate.set(Switch::Annotation, Some("true".into())));
        assert!(!gate.set(Switch::Http, Some("release".into())), "no change");
        assert!(!gate.state().open());
        gate.set(Switch::Http, None);
        assert!(!gate.state().open(), "the annotation still holds it");
        gate.set(Switch::Annotation, None);
        assert!(gate.state().open());
    }

    /// What a subscriber writes, kept.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_note_can_neither_forge_a_log_line_nor_reorder_the_status() {
        let gate = Gate::new(Arc::new(TokioClock::starting_at(ts(
            "2026-12-02T12:00:00Z",
        ))));
        // A right-to-left override shows "release 1.4" for what reads "4.1 esaeler"; an
        // annotation may hold a newline and a C1 control as well.
        let note =
            "release \u{202e}4.1 esaeler\u{2066}x\u{2069}\n2026-12-02T12:00:01Z  INFO forged\u{85}";
        let log = Capture::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            assert!(gate.set(Switch::Annotation, Some(note.to_owned())));
        });
        let escaped = "release \\u{202e}4.1 esaeler\\u{2066}x\\u{2069}\\n2026-12-02T12:00:01Z  INFO forged\\u{85}";
        let state = gate.state();
        assert_eq!(
            state.operator,
            vec![(Switch::Annotation, escaped.to_owned())]
        );
        let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        assert!(logged.contains(escaped), "{logged}");
        let unsafe_char = |c: char| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        };
        assert!(!logged.chars().any(unsafe_char), "{logged:?}");
        assert_eq!(logged.lines().count(), 1, "{logged}");
        // Setting the same note again changes nothing.
        assert!(!gate.set(Switch::Annotation, Some(note.to_owned())));
    }

    #[tokio::test(start_paused = true)]
    async fn entering_and_leaving_quiet_hours_is_logged_once_each() {
        let log = Capture::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        // With a single subscriber, a line first logged from another test's thread (which has
        // none) is cached as unwanted for every thread; a second one keeps tracing asking all.
        let _second = tracing::Dispatch::new(tracing_subscriber::registry());
        tracing::callsite::rebuild_interest_cache();
        let gate = Gate::new(Arc::new(TokioClock::starting_at(ts(
            "2026-12-02T11:58:00Z",
        ))));
        gate.set_windows(Some(set(
            "Europe/Berlin",
            vec![DailyWindow {
                days: [true; 7],
                from: 13 * 60,
                to: 13 * 60 + 10,
            }],
        )));
        // The scheduler and the probe stream both look, every few seconds, for 30 minutes:
        // before the window (12:00 UTC is 13:00 in Berlin), inside it, and after it.
        for _ in 0..180 {
            gate.state();
            gate.state();
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = logged.lines().collect();
        assert_eq!(lines.len(), 3, "{logged}");
        assert!(
            lines[0].contains("INFO")
                && lines[0].contains("quiet hours begin")
                && lines[0].contains("until 2026-12-02 13:00 CET"),
            "{logged}"
        );
        assert!(
            lines[1].contains("INFO")
                && lines[1].contains("quiet hours end")
                && lines[1].contains("until 2026-12-02 13:10 CET"),
            "{logged}"
        );
        assert!(
            lines[2].contains("quiet hours begin")
                && lines[2].contains("until 2026-12-03 13:00 CET"),
            "{logged}"
        );
        // A gate without windows never logs quiet hours.
        let open = Gate::new(Arc::new(TokioClock::starting_at(ts(
            "2026-12-02T11:58:00Z",
        ))));
        open.state();
        assert_eq!(
            String::from_utf8(log.0.lock().unwrap().clone()).unwrap(),
            logged
        );
    }

    #[tokio::test(start_paused = true)]
    async fn closed_completes_at_the_window_end_under_paused_time() {
        let gate = Gate::new(Arc::new(TokioClock::starting_at(ts(
            "2026-12-02T21:00:00Z",
        ))));
        gate.set_windows(Some(set(
            "UTC",
            vec![DailyWindow {
                days: [true; 7],
                from: 20 * 60,
                to: 22 * 60,
            }],
        )));
        assert!(gate.state().open());
        let start = tokio::time::Instant::now();
        gate.closed().await;
        assert_eq!(start.elapsed(), Duration::from_secs(3600));
        let state = gate.state();
        assert!(!state.open());
        assert_eq!(state.next_change, Some(ts("2026-12-03T20:00:00Z")));
    }
}
