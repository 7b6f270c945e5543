//! The clocks shared with other processes: `tokio::time::Instant`s as CLOCK_MONOTONIC
//! nanoseconds, so the bench's `requests.jsonl` and the simulator's `--send-log` line up on the
//! same host; and the wall clock as Unix time ([`unix_now`]), the one reading of it every
//! timestamp the canary writes or serves comes from.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Time since the Unix epoch by the wall clock; zero on a clock set before 1970, so a timestamp is
/// never negative.
pub fn since_unix_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// Unix time in seconds, as the canary's files and gauges write it: the wall clock, or, once
/// [`follow_tokio_time`] was called, the wall clock at that call plus tokio's time since.
pub fn unix_now() -> f64 {
    match TOKIO_TIME.get() {
        Some(clock) => clock.unix_ns(Instant::now()) as f64 / 1e9,
        None => since_unix_epoch().as_secs_f64(),
    }
}

/// Set by [`follow_tokio_time`].
static TOKIO_TIME: std::sync::OnceLock<MonoClock> = std::sync::OnceLock::new();

/// From now on, in this process, [`unix_now`] follows tokio's clock, paused and advanced or
/// not. For a simulation that runs days of schedule in paused time (the detection benchmark):
/// the cycles it stamps and the baselines that compare them (`baseline(…, 24h offset 1d)`)
/// then see the days it simulates, not the minutes it takes. Each runtime's paused clock
/// starts at the real time it was built, so the runtimes of one process stay close.
pub fn follow_tokio_time() {
    TOKIO_TIME.get_or_init(MonoClock::now);
}

/// Ties `tokio::time::Instant` to CLOCK_MONOTONIC and to Unix time. On Linux tokio's (and std's)
/// `Instant` reads CLOCK_MONOTONIC, so one reading of each next to the other gives the offset of
/// every later instant; the monotonic clock is read on both sides of `Instant::now()` and the
/// midpoint taken, so the anchor is good to a microsecond or so.
#[derive(Debug, Clone, Copy)]
pub struct MonoClock {
    anchor: Instant,
    mono_ns: u64,
    unix_ns: u64,
}

fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

impl MonoClock {
    pub fn now() -> MonoClock {
        let before = monotonic_ns();
        let anchor = Instant::now();
        let after = monotonic_ns();
        let unix_ns = u64::try_from(since_unix_epoch().as_nanos()).unwrap_or(u64::MAX);
        MonoClock {
            anchor,
            mono_ns: before + (after - before) / 2,
            unix_ns,
        }
    }

    fn offset(base: u64, anchor: Instant, at: Instant) -> u64 {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if at >= anchor {
            base.saturating_add(nanos(at - anchor))
        } else {
            base.saturating_sub(nanos(anchor - at))
        }
    }

    /// CLOCK_MONOTONIC nanoseconds of `at`.
    pub fn mono_ns(&self, at: Instant) -> u64 {
        Self::offset(self.mono_ns, self.anchor, at)
    }

    /// Unix-epoch nanoseconds of `at` (wall clock at the anchor plus monotonic time since).
    pub fn unix_ns(&self, at: Instant) -> u64 {
        Self::offset(self.unix_ns, self.anchor, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_anchor_maps_instants_onto_clock_monotonic() {
        let clock = MonoClock::now();
        let later = clock.anchor + Duration::from_millis(1500);
        assert_eq!(
            clock.mono_ns(later) - clock.mono_ns(clock.anchor),
            1_500_000_000
        );
        let earlier = clock.anchor - Duration::from_millis(2);
        assert_eq!(
            clock.mono_ns(clock.anchor) - clock.mono_ns(earlier),
            2_000_000
        );
        // The anchor is CLOCK_MONOTONIC read now (within the time this test takes).
        let read = monotonic_ns();
        let mapped = clock.mono_ns(Instant::now());
        assert!(mapped.abs_diff(read) < 50_000_000, "{mapped} vs {read}");
        let unix = clock.unix_ns(clock.anchor);
        assert!(unix > 1_600_000_000_000_000_000, "{unix}");
    }
}
