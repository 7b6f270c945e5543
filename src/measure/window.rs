//! Sliding windows of HDR histograms with fixed memory (one per series), their merged views, and
//! distribution-free 95 % confidence intervals of quantiles from order statistics.
//!
//! A window of length W is a ring of N slots of W/N each, rotated by the tokio clock. A sample
//! stays visible from when it is recorded until W after the start of its slot, so the merged view
//! covers between W − W/N and W of history. Values are stored as integers of a [`ValueScale`]'s
//! resolution (seconds: microseconds, 3 significant digits, at most one hour); values outside the
//! scale are clamped to it and counted, never a panic.

use super::stats::{confidence_ranks, point_rank};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

/// Default window: the SLO evaluation window of the design's examples.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30 * 60);

/// Default slots per window: 5-minute slots for 30 minutes. Each slot is one histogram (about
/// 94 KiB at the seconds scale), so the slot count is the memory/time-granularity trade-off.
pub const DEFAULT_SLOTS: usize = 6;

/// Why a window could not be built or merged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WindowError {
    #[error("a window must be longer than zero and hold at least one slot of at least 1 ns")]
    BadWindow,
    #[error(
        "value scale needs a positive resolution, a max of at least twice the resolution and \
         at most 5 significant digits (got resolution {resolution}, max {max}, digits {digits})"
    )]
    BadScale {
        resolution: f64,
        max: f64,
        digits: u8,
    },
    #[error("cannot merge windows of different value scales")]
    ScaleMismatch,
}

/// How f64 values map onto histogram integers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueScale {
    resolution: f64,
    max: f64,
    significant_digits: u8,
}

impl ValueScale {
    /// Durations in seconds: microsecond resolution, 3 significant digits, up to one hour.
    pub const SECONDS: Self = Self {
        resolution: 1e-6,
        max: 3600.0,
        significant_digits: 3,
    };

    /// Ratios in [0, 1] (cache hit ratio, error ratio): millionths, 3 significant digits.
    pub const RATIO: Self = Self {
        resolution: 1e-6,
        max: 1.0,
        significant_digits: 3,
    };

    /// A custom scale: values are multiples of `resolution`, up to `max`, with
    /// `significant_digits` (≤ 5) of relative precision.
    pub fn new(resolution: f64, max: f64, significant_digits: u8) -> Result<Self, WindowError> {
        let bad = || WindowError::BadScale {
            resolution,
            max,
            digits: significant_digits,
        };
        if !(resolution.is_finite() && resolution > 0.0 && max.is_finite()) {
            return Err(bad());
        }
        let scale = Self {
            resolution,
            max,
            significant_digits,
        };
        if scale.max_units() < 2 || significant_digits > 5 {
            return Err(bad());
        }
        Ok(scale)
    }

    /// The largest value kept; larger ones are recorded as this.
    pub fn max(&self) -> f64 {
        self.max
    }

    fn max_units(&self) -> u64 {
        (self.max / self.resolution).floor() as u64
    }

    /// The integer a value is stored as, and whether it had to be clamped (NaN, negative, or
    /// above the maximum).
    fn to_units(self, value: f64) -> (u64, bool) {
        if value.is_nan() || value < 0.0 {
            return (0, true);
        }
        let units = (value / self.resolution).round();
        let max = self.max_units();
        if units > max as f64 {
            (max, true)
        } else {
            (units as u64, false)
        }
    }

    fn to_value(self, units: u64) -> f64 {
        units as f64 * self.resolution
    }

    fn histogram(self) -> Histogram<u32> {
        Histogram::new_with_bounds(1, self.max_units(), self.significant_digits)
            .expect("bounds validated when the scale was made")
    }
}

/// Shape of a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowConfig {
    /// How far back the merged view reaches.
    pub window: Duration,
    /// Sub-windows the window is split into; memory is one histogram per slot.
    pub slots: usize,
    /// How values are stored.
    pub scale: ValueScale,
}

impl WindowConfig {
    /// [`DEFAULT_WINDOW`] in [`DEFAULT_SLOTS`] slots with the given scale.
    pub fn new(scale: ValueScale) -> Self {
        Self {
            window: DEFAULT_WINDOW,
            slots: DEFAULT_SLOTS,
            scale,
        }
    }

    fn slot_length(&self) -> Option<Duration> {
        let slots = u32::try_from(self.slots).ok().filter(|slots| *slots > 0)?;
        Some(self.window / slots).filter(|length| !length.is_zero())
    }
}

/// One series' sliding window: a fixed ring of histograms, so memory does not grow with samples
/// or with time.
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    scale: ValueScale,
    slot_length: Duration,
    origin: Instant,
    slots: Box<[Slot]>,
    clamped: u64,
    late: u64,
}

#[derive(Debug, Clone)]
struct Slot {
    // The slot's period since the window's origin; `None` until first used.
    epoch: Option<u64>,
    histogram: Histogram<u32>,
}

impl SlidingWindow {
    /// A window whose slot boundaries are aligned to `origin` (normally `Instant::now()`).
    pub fn new(config: WindowConfig, origin: Instant) -> Result<Self, WindowError> {
        let slot_length = config.slot_length().ok_or(WindowError::BadWindow)?;
        let slots = (0..config.slots)
            .map(|_| Slot {
                epoch: None,
                histogram: config.scale.histogram(),
            })
            .collect();
        Ok(Self {
            scale: config.scale,
            slot_length,
            origin,
            slots,
            clamped: 0,
            late: 0,
        })
    }

    /// Records one value observed at `now`.
    pub fn record(&mut self, value: f64, now: Instant) {
        self.record_n(value, 1, now);
    }

    /// Records `count` equal values observed at `now` (e.g. a chunk of k tokens contributes its
    /// gap / k, k times, to the per-chunk gap histogram).
    pub fn record_n(&mut self, value: f64, count: u32, now: Instant) {
        let (units, clamped) = self.scale.to_units(value);
        if clamped {
            self.clamped += u64::from(count);
        }
        match self.slot_at(now) {
            Some(histogram) => histogram.saturating_record_n(units, count),
            None => self.late += u64::from(count),
        }
    }

    /// Adds every value of `values`, all observed at `now` (a finished step's samples of one
    /// series, folded as its requests ended).
    pub fn add(&mut self, values: &WindowSnapshot, now: Instant) -> Result<(), WindowError> {
        if values.scale != self.scale {
            return Err(WindowError::ScaleMismatch);
        }
        self.clamped += values.clamped;
        let count = values.count();
        if count == 0 {
            return Ok(());
        }
        match self.slot_at(now) {
            Some(histogram) => histogram
                .add(&values.histogram)
                .map_err(|_| WindowError::ScaleMismatch),
            None => {
                self.late += count;
                Ok(())
            }
        }
    }

    /// The histogram of the slot that values observed at `now` go into, rotated into use; `None`
    /// when that slot already serves a later period: such a value is older than the window (its
    /// recording raced a rotation), and keeping it would misplace it in time.
    fn slot_at(&mut self, now: Instant) -> Option<&mut Histogram<u32>> {
        let epoch = self.epoch(now);
        let ring = self.slots.len() as u64;
        let slot = &mut self.slots[(epoch % ring) as usize];
        match slot.epoch {
            Some(current) if current == epoch => {}
            Some(current) if current > epoch => return None,
            _ => {
                slot.histogram.reset();
                slot.epoch = Some(epoch);
            }
        }
        Some(&mut slot.histogram)
    }

    /// The merged view of the samples inside the window at `now`.
    pub fn snapshot(&self, now: Instant) -> WindowSnapshot {
        let epoch = self.epoch(now);
        let ring = self.slots.len() as u64;
        let mut merged = self.scale.histogram();
        for slot in self.slots.iter() {
            let visible = slot
                .epoch
                .is_some_and(|recorded| recorded <= epoch && epoch - recorded < ring);
            if visible {
                merged
                    .add(&slot.histogram)
                    .expect("slots share the merged histogram's bounds");
            }
        }
        WindowSnapshot {
            histogram: merged,
            scale: self.scale,
            clamped: 0,
        }
    }

    /// Values that were outside the scale (NaN, negative, above the maximum) and were clamped.
    pub fn clamped(&self) -> u64 {
        self.clamped
    }

    /// Values dropped because they were stamped before the window's oldest slot.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// The number of histograms held: the slot count, fixed at creation.
    pub fn histogram_count(&self) -> usize {
        self.slots.len()
    }

    /// Bytes held by the histograms' counters; constant for the window's lifetime.
    pub fn memory_bytes(&self) -> usize {
        self.slots
            .iter()
            .map(|slot| slot.histogram.distinct_values() * std::mem::size_of::<u32>())
            .sum()
    }

    fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(elapsed / self.slot_length.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A merged histogram: the samples of one window, or of several series merged together (a
/// selector matching many label sets).
#[derive(Debug, Clone)]
pub struct WindowSnapshot {
    histogram: Histogram<u32>,
    scale: ValueScale,
    /// Values clamped as they were recorded into this snapshot (or into one merged into it); a
    /// window's snapshot leaves them to the window's own count.
    clamped: u64,
}

/// A quantile's point estimate with its 95 % confidence interval. A side is `None` when the
/// samples cannot bound it at 95 % (e.g. the upper side of p99 from fewer than 368 samples); treat
/// it as unbounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantileInterval {
    /// The quantile asked for, in (0, 1).
    pub quantile: f64,
    /// The sample quantile (rank ⌈q·n⌉).
    pub estimate: f64,
    /// Lower bound: the value at `lower_rank`, rounded down to its histogram bucket.
    pub lower: Option<f64>,
    /// Upper bound: the value at `upper_rank`, rounded up to its histogram bucket.
    pub upper: Option<f64>,
    /// The 1-based order-statistic ranks the bounds come from.
    pub lower_rank: Option<u64>,
    pub upper_rank: Option<u64>,
    /// The number of samples.
    pub samples: u64,
}

impl WindowSnapshot {
    /// An empty snapshot to merge series into.
    pub fn empty(scale: ValueScale) -> Self {
        Self {
            histogram: scale.histogram(),
            scale,
            clamped: 0,
        }
    }

    /// The recorded values as (value in scale units, count) pairs, ascending: a compact form to
    /// save and restore (see [`WindowSnapshot::from_units`]).
    pub fn to_units(&self) -> Vec<(u64, u64)> {
        self.histogram
            .iter_recorded()
            .map(|b| (b.value_iterated_to(), u64::from(b.count_at_value())))
            .collect()
    }

    /// A snapshot of `scale` holding the (units, count) pairs of [`WindowSnapshot::to_units`].
    pub fn from_units(scale: ValueScale, pairs: &[(u64, u64)]) -> Self {
        let mut snapshot = Self::empty(scale);
        let max = scale.max_units();
        for &(units, count) in pairs {
            snapshot
                .histogram
                .saturating_record_n(units.min(max), count.min(u64::from(u32::MAX)) as u32);
        }
        snapshot
    }

    /// Bytes held by the histogram's counters: fixed by the scale, whatever was recorded.
    pub fn memory_bytes(&self) -> usize {
        self.histogram.distinct_values() * std::mem::size_of::<u32>()
    }

    /// Adds one value (clamped to the scale, as a window does).
    pub fn record(&mut self, value: f64) {
        let (units, clamped) = self.scale.to_units(value);
        self.clamped += u64::from(clamped);
        self.histogram.saturating_record(units);
    }

    /// Values recorded (or merged in) that were outside the scale and were clamped.
    pub fn clamped(&self) -> u64 {
        self.clamped
    }

    /// Adds another snapshot's samples (same scale required).
    pub fn merge(&mut self, other: &WindowSnapshot) -> Result<(), WindowError> {
        if self.scale != other.scale {
            return Err(WindowError::ScaleMismatch);
        }
        self.clamped += other.clamped;
        self.histogram
            .add(&other.histogram)
            .map_err(|_| WindowError::ScaleMismatch)
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// Mean of the samples (bucket midpoints), `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (!self.is_empty()).then(|| self.histogram.mean() * self.scale.resolution)
    }

    /// Smallest sample (rounded down to its bucket), `None` when empty.
    pub fn min(&self) -> Option<f64> {
        (!self.is_empty()).then(|| self.scale.to_value(self.histogram.min()))
    }

    /// Largest sample (rounded up to its bucket), `None` when empty.
    pub fn max(&self) -> Option<f64> {
        (!self.is_empty()).then(|| self.scale.to_value(self.histogram.max()))
    }

    /// The `q` quantile (0 ≤ q ≤ 1): the sample at rank ⌈q·n⌉ (at least 1), rounded up to its
    /// bucket as HDR histograms report it. `None` when empty or `q` is outside [0, 1].
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.is_empty() || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = point_rank(self.count(), q);
        self.bucket_at_rank(rank).map(|units| {
            self.scale
                .to_value(self.histogram.highest_equivalent(units))
        })
    }

    /// The `q` quantile with its distribution-free 95 % confidence interval. `None` when empty or
    /// `q` is not strictly between 0 and 1.
    pub fn quantile_interval(&self, q: f64) -> Option<QuantileInterval> {
        let estimate = self.quantile(q)?;
        if q <= 0.0 || q >= 1.0 {
            return None;
        }
        let samples = self.count();
        let (lower_rank, upper_rank) = confidence_ranks(samples, q);
        let lower = lower_rank
            .and_then(|rank| self.bucket_at_rank(rank))
            .map(|units| self.scale.to_value(self.histogram.lowest_equivalent(units)));
        let upper = upper_rank
            .and_then(|rank| self.bucket_at_rank(rank))
            .map(|units| {
                self.scale
                    .to_value(self.histogram.highest_equivalent(units))
            });
        Some(QuantileInterval {
            quantile: q,
            estimate,
            lower,
            upper,
            lower_rank,
            upper_rank,
            samples,
        })
    }

    /// A value (in histogram units) of the bucket holding the sample of 1-based `rank`.
    fn bucket_at_rank(&self, rank: u64) -> Option<u64> {
        let mut seen = 0u64;
        for bucket in self.histogram.iter_recorded() {
            seen += bucket.count_at_value() as u64;
            if seen >= rank {
                return Some(bucket.value_iterated_to());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rand_distr::{Distribution, Exp};
    use tokio::time::advance;

    fn minute_window(now: Instant) -> SlidingWindow {
        let config = WindowConfig {
            window: Duration::from_secs(60),
            slots: 6,
            scale: ValueScale::SECONDS,
        };
        SlidingWindow::new(config, now).expect("valid window")
    }

    #[tokio::test(start_paused = true)]
    async fn samples_leave_the_window_w_after_their_slot_starts() {
        let start = Instant::now();
        let mut window = minute_window(start);
        advance(Duration::from_secs(5)).await;
        window.record(0.1, Instant::now()); // slot [0 s, 10 s)
        advance(Duration::from_secs(10)).await;
        window.record(0.2, Instant::now()); // slot [10 s, 20 s)
        assert_eq!(window.snapshot(Instant::now()).count(), 2);

        // Visible up to the last instant before 60 s ...
        advance(Duration::from_secs(45) - Duration::from_nanos(1)).await;
        assert_eq!(window.snapshot(Instant::now()).count(), 2);
        // ... and gone at exactly 60 s = slot start + window; the later sample stays until 70 s.
        advance(Duration::from_nanos(1)).await;
        let snapshot = window.snapshot(Instant::now());
        assert_eq!(snapshot.count(), 1);
        assert!(snapshot.max().is_some_and(|max| (max - 0.2).abs() < 0.001));
        advance(Duration::from_secs(10)).await;
        assert!(window.snapshot(Instant::now()).is_empty());

        // Recording into a reused slot forgets what it held a full window earlier.
        window.record(0.3, Instant::now());
        let snapshot = window.snapshot(Instant::now());
        assert_eq!(snapshot.count(), 1);
        assert!(snapshot.min().is_some_and(|min| (min - 0.3).abs() < 0.001));
    }

    #[tokio::test(start_paused = true)]
    async fn late_samples_older_than_the_window_are_dropped() {
        let start = Instant::now();
        let mut window = minute_window(start);
        advance(Duration::from_secs(65)).await;
        window.record(1.0, Instant::now()); // slot 6 reuses ring position 0
        window.record(1.0, start + Duration::from_secs(1)); // stamped in slot 0: too old
        assert_eq!(window.late(), 1);
        assert_eq!(window.snapshot(Instant::now()).count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn adding_a_snapshot_equals_recording_its_values_and_rotates_alike() {
        let start = Instant::now();
        let (mut added, mut recorded) = (minute_window(start), minute_window(start));
        let mut step = WindowSnapshot::empty(ValueScale::SECONDS);
        for i in 0..1000 {
            // Two of them outside the scale: clamped, and counted as the window counts them.
            let v = match i {
                0 => -1.0,
                1 => f64::NAN,
                _ => 0.05 + f64::from(i) * 1e-3,
            };
            step.record(v);
            recorded.record(v, start);
        }
        assert_eq!(step.clamped(), 2);
        added.add(&step, start).unwrap();
        let (a, r) = (added.snapshot(start), recorded.snapshot(start));
        assert_eq!(a.to_units(), r.to_units());
        assert_eq!(a.count(), 1000);
        assert_eq!((added.clamped(), recorded.clamped()), (2, 2));

        // A later step lands in its own slot, and the first leaves the window on time.
        advance(Duration::from_secs(30)).await;
        added.add(&step, Instant::now()).unwrap();
        assert_eq!(added.snapshot(Instant::now()).count(), 2000);
        advance(Duration::from_secs(30)).await;
        assert_eq!(added.snapshot(Instant::now()).count(), 1000);
        // Stamped before the oldest slot (whose ring position now serves 60 s): counted as
        // late, not misplaced.
        added.record(1.0, Instant::now());
        added.add(&step, start + Duration::from_secs(1)).unwrap();
        assert_eq!(added.late(), 1000);
        // Another scale is refused.
        let ratios = WindowSnapshot::empty(ValueScale::RATIO);
        assert!(added.add(&ratios, Instant::now()).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn quantiles_match_a_known_distribution_within_hdr_precision() {
        let mut window = minute_window(Instant::now());
        // 1 ms, 2 ms, ..., 10 000 ms: quantile q is q·10 s.
        for ms in 1..=10_000u32 {
            window.record(f64::from(ms) / 1000.0, Instant::now());
        }
        let snapshot = window.snapshot(Instant::now());
        assert_eq!(snapshot.count(), 10_000);
        for (q, expected) in [
            (0.5, 5.0),
            (0.9, 9.0),
            (0.99, 9.9),
            (0.999, 9.99),
            (0.01, 0.1),
        ] {
            let got = snapshot.quantile(q).expect("non-empty");
            assert!(
                (got / expected - 1.0).abs() < 1e-3,
                "q{q}: {got} vs {expected}"
            );
        }
        let mean = snapshot.mean().expect("non-empty");
        assert!((mean / 5.0005 - 1.0).abs() < 1e-3, "{mean}");
        assert!((snapshot.min().unwrap() - 0.001).abs() < 1e-9);
        assert!((snapshot.max().unwrap() / 10.0 - 1.0).abs() < 1e-3);
        assert_eq!(snapshot.quantile(1.5), None);
        assert_eq!(
            WindowSnapshot::empty(ValueScale::SECONDS).quantile(0.5),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn out_of_range_values_are_clamped_not_panicking() {
        let mut window = minute_window(Instant::now());
        for value in [-1.0, f64::NAN, 1e9, f64::INFINITY, 0.5] {
            window.record(value, Instant::now());
        }
        let snapshot = window.snapshot(Instant::now());
        assert_eq!(window.clamped(), 4);
        assert_eq!(snapshot.count(), 5);
        assert_eq!(snapshot.min(), Some(0.0));
        assert!(
            snapshot
                .max()
                .is_some_and(|max| (max / 3600.0 - 1.0).abs() < 1e-3)
        );

        let ratio = WindowConfig {
            window: Duration::from_secs(60),
            slots: 2,
            scale: ValueScale::RATIO,
        };
        let mut ratios = SlidingWindow::new(ratio, Instant::now()).expect("valid");
        ratios.record_n(0.25, 3, Instant::now());
        ratios.record(1.5, Instant::now());
        let snapshot = ratios.snapshot(Instant::now());
        assert_eq!((snapshot.count(), ratios.clamped()), (4, 1));
        assert!((snapshot.quantile(0.5).unwrap() - 0.25).abs() < 0.001);
        assert!((snapshot.max().unwrap() - 1.0).abs() < 0.001);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_stays_fixed_as_samples_and_time_accumulate() {
        let mut window = minute_window(Instant::now());
        let before = (window.histogram_count(), window.memory_bytes());
        let mut rng = StdRng::seed_from_u64(4);
        for _ in 0..200 {
            for _ in 0..500 {
                window.record(rng.random_range(0.0..100.0), Instant::now());
            }
            advance(Duration::from_secs(3)).await;
        }
        assert_eq!((window.histogram_count(), window.memory_bytes()), before);
        assert_eq!(before.0, 6);
        // About 94 KiB per slot at the seconds scale, as documented at DEFAULT_SLOTS.
        assert!(
            (90 * 1024 * 6..100 * 1024 * 6).contains(&before.1),
            "{}",
            before.1
        );
        // At 600 s the view is slots [550 s, 610 s): the batches of 552 s, 555 s, ..., 597 s.
        assert_eq!(window.snapshot(Instant::now()).count(), 16 * 500);
    }

    #[test]
    fn snapshots_of_several_series_merge() {
        let origin = Instant::now();
        let (mut a, mut b) = (minute_window(origin), minute_window(origin));
        a.record(1.0, origin);
        b.record(3.0, origin);
        b.record(5.0, origin);
        let mut merged = WindowSnapshot::empty(ValueScale::SECONDS);
        merged.merge(&a.snapshot(origin)).expect("same scale");
        merged.merge(&b.snapshot(origin)).expect("same scale");
        assert_eq!(merged.count(), 3);
        assert!((merged.quantile(0.5).unwrap() - 3.0).abs() < 0.01);
        assert_eq!(
            merged
                .merge(&WindowSnapshot::empty(ValueScale::RATIO))
                .unwrap_err(),
            WindowError::ScaleMismatch
        );
    }

    #[test]
    fn invalid_windows_and_scales_are_rejected() {
        let origin = Instant::now();
        for (window, slots) in [(Duration::ZERO, 1), (Duration::from_secs(1), 0)] {
            let config = WindowConfig {
                window,
                slots,
                scale: ValueScale::SECONDS,
            };
            assert_eq!(
                SlidingWindow::new(config, origin).unwrap_err(),
                WindowError::BadWindow
            );
        }
        assert!(ValueScale::new(0.0, 1.0, 3).is_err());
        assert!(ValueScale::new(1.0, 1.0, 3).is_err());
        assert!(ValueScale::new(1e-3, 10.0, 6).is_err());
        assert!(ValueScale::new(1e-3, 10.0, 2).is_ok());
    }

    /// Fraction of seeded trials whose interval contains the true quantile of Exp(1).
    fn coverage(samples: usize, q: f64, trials: u64) -> f64 {
        let truth = -(1.0 - q).ln();
        let exp = Exp::new(1.0).expect("valid rate");
        let origin = Instant::now();
        let mut covered = 0;
        for trial in 0..trials {
            let mut rng = StdRng::seed_from_u64(1000 + trial);
            let mut window = minute_window(origin);
            for _ in 0..samples {
                window.record(exp.sample(&mut rng), origin);
            }
            let interval = window
                .snapshot(origin)
                .quantile_interval(q)
                .expect("non-empty");
            let (lower, upper) = (
                interval.lower.expect("bounded"),
                interval.upper.expect("bounded"),
            );
            assert!(lower <= interval.estimate && interval.estimate <= upper);
            if lower <= truth && truth <= upper {
                covered += 1;
            }
        }
        f64::from(covered) / trials as f64
    }

    #[test]
    fn intervals_cover_the_true_quantile_about_95_percent_of_the_time() {
        for (samples, q) in [(400, 0.9), (200, 0.5), (3_000, 0.5), (5_000, 0.99)] {
            let covered = coverage(samples, q, 200);
            assert!(
                (0.90..=0.99).contains(&covered),
                "n {samples}, q {q}: coverage {covered}"
            );
        }
    }

    #[test]
    fn one_sided_intervals_when_samples_are_few() {
        let origin = Instant::now();
        let mut window = minute_window(origin);
        for ms in 1..=200u32 {
            window.record(f64::from(ms) / 1000.0, origin);
        }
        let interval = window
            .snapshot(origin)
            .quantile_interval(0.99)
            .expect("non-empty");
        assert!(interval.lower.is_some());
        assert_eq!(
            interval.upper, None,
            "200 samples cannot bound p99 from above"
        );
        assert_eq!(interval.samples, 200);
    }
}
