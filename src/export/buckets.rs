//! The bucket bounds of the exported histograms. The standard export has a 1-2.5-5 grid per
//! latency family, placed where that latency lives (ITL in milliseconds, TTFT up to 30 s, request
//! duration up to 120 s), and a 1-5 grid for the schedule lag: the daemon's own HDR windows carry
//! the SLOs' precision and the step gauges its quantiles, so the buckets serve rates, trends and
//! the generated rules. The high-resolution export (`export.resolution: high`) has 10 % steps from
//! 1 ms to 120 s and a 1-2-5 lag grid. Either way every SLO latency threshold is an exact bound.

pub use crate::config::Resolution;

/// One of the per-request latency families, whose standard grids differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    Ttft,
    /// Inter-token latency and the per-token chunk gap.
    Itl,
    RequestDuration,
}

/// The standard grids: 1-2.5-5 steps over where each latency lives.
const TTFT_GRID: [f64; 11] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const ITL_GRID: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
const DURATION_GRID: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0];
/// The schedule lag's standard grid: 1-5 steps from 1 ms (a healthy canary) to 5 s, with the
/// 50 ms of the `LlmCanaryScheduleLagHigh` alert as a bound.
const LAG_GRID: [f64; 8] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

/// The bounds of `family` at `resolution`, with every threshold of `thresholds` exact.
pub fn family_buckets(family: Latency, resolution: Resolution, thresholds: &[f64]) -> Vec<f64> {
    match resolution {
        Resolution::High => latency_buckets(thresholds),
        Resolution::Standard => {
            let grid: &[f64] = match family {
                Latency::Ttft => &TTFT_GRID,
                Latency::Itl => &ITL_GRID,
                Latency::RequestDuration => &DURATION_GRID,
            };
            merge_bounds(grid.iter().copied(), thresholds)
        }
    }
}

/// Lower end of the latency grid: 1 ms, below any TTFT or ITL a network client can see.
const LATENCY_MIN_SECONDS: f64 = 0.001;
/// Upper end of the latency grid: 120 s, the longest request the default workloads allow.
const LATENCY_MAX_SECONDS: f64 = 120.0;
/// Ratio between neighbouring grid bounds: ~10 % keeps the error of `histogram_quantile` under
/// ~5 % while keeping the bucket count near 120.
const LATENCY_STEP_RATIO: f64 = 1.1;
/// Significant digits of a grid bound, so `le` labels read `0.00121`, not `0.0012100000000000001`.
const BOUND_SIGNIFICANT_DIGITS: i32 = 4;
/// Two bounds closer than this (relative) are the same bound.
const BOUND_DEDUP_RELATIVE: f64 = 1e-12;

/// Rounds `x` (> 0) to `digits` significant decimal digits. Dividing by an exact power of ten
/// yields the double nearest to the decimal, so the shortest printed form is the decimal.
fn round_significant(x: f64, digits: i32) -> f64 {
    let exponent = x.log10().floor() as i32;
    let shift = digits - 1 - exponent;
    if shift >= 0 {
        let scale = 10f64.powi(shift);
        (x * scale).round() / scale
    } else {
        let scale = 10f64.powi(-shift);
        (x / scale).round() * scale
    }
}

fn same_bound(a: f64, b: f64) -> bool {
    (a - b).abs() <= BOUND_DEDUP_RELATIVE * a.abs().max(b.abs())
}

/// The latency bucket bounds: a log grid at ~10 % steps from 1 ms to 120 s (rounded to four
/// significant digits) merged with `extra_thresholds`, so that every SLO threshold is an exact
/// bucket bound and `histogram_quantile`/`le` selectors hit it without interpolation.
///
/// The result is sorted and strictly increasing; a threshold within 1e-12 (relative) of a grid
/// bound replaces that bound, so the threshold itself is present bit for bit. Non-finite
/// thresholds are dropped (`+Inf` is implicit).
pub fn latency_buckets(extra_thresholds: &[f64]) -> Vec<f64> {
    let steps = ((LATENCY_MAX_SECONDS / LATENCY_MIN_SECONDS).ln() / LATENCY_STEP_RATIO.ln()).ceil();
    let ratio = (LATENCY_MAX_SECONDS / LATENCY_MIN_SECONDS).powf(1.0 / steps);
    let grid = (0..=steps as i32).map(|i| {
        round_significant(
            LATENCY_MIN_SECONDS * ratio.powi(i),
            BOUND_SIGNIFICANT_DIGITS,
        )
    });
    merge_bounds(grid, extra_thresholds)
}

/// The client-queue grid: decades from 1 ms (no queue) to 10 minutes (a whole step behind), at
/// every resolution: it tells a step that kept up from one that fell behind, and by how far.
const QUEUE_GRID: [f64; 7] = [0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0];

/// The connect-time grid, at every resolution: loopback and in-cluster connects (0.1–1 ms) apart
/// from a slow network (10–50 ms), and 2 s and 5 s above the connects that waited for one or two
/// SYN retransmissions (Linux retries after 1 s, then 3 s more).
const CONNECT_GRID: [f64; 8] = [0.00025, 0.001, 0.0025, 0.01, 0.05, 0.25, 2.0, 5.0];

/// The grid of per-request token counts (a reasoning model's reasoning and answer tokens), at
/// every resolution: powers of two from a short answer to the longest thinking budgets.
const TOKEN_GRID: [f64; 12] = [
    16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
];

/// The per-request token-count bucket bounds ([`TOKEN_GRID`]).
pub fn token_buckets() -> Vec<f64> {
    TOKEN_GRID.to_vec()
}

/// The connect-time bucket bounds ([`CONNECT_GRID`]).
pub fn connect_buckets() -> Vec<f64> {
    CONNECT_GRID.to_vec()
}

/// The client-queue bucket bounds ([`QUEUE_GRID`]).
pub fn client_queue_buckets() -> Vec<f64> {
    QUEUE_GRID.to_vec()
}

/// The schedule-lag bucket bounds: at high resolution 1-2-5 steps from 10 µs to 10 s, else
/// [`LAG_GRID`]. Lag is the canary's own health, so a coarse grid over a wide range is enough.
pub fn schedule_lag_buckets(resolution: Resolution) -> Vec<f64> {
    if resolution == Resolution::Standard {
        return LAG_GRID.to_vec();
    }
    let grid = (-5..=1).flat_map(|exponent| {
        [1.0, 2.0, 5.0]
            .into_iter()
            .map(move |mantissa| round_significant(mantissa * 10f64.powi(exponent), 1))
    });
    merge_bounds(grid.filter(|b| *b <= 10.0), &[])
}

fn merge_bounds(grid: impl Iterator<Item = f64>, extra: &[f64]) -> Vec<f64> {
    let mut bounds: Vec<f64> = Vec::new();
    for &threshold in extra.iter().filter(|t| t.is_finite()) {
        if !bounds.iter().any(|b| same_bound(*b, threshold)) {
            bounds.push(threshold);
        }
    }
    for bound in grid {
        if !bounds.iter().any(|b| same_bound(*b, bound)) {
            bounds.push(bound);
        }
    }
    bounds.sort_by(f64::total_cmp);
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_grid_steps_are_about_ten_percent_and_readable() {
        let grid = latency_buckets(&[]);
        assert_eq!(grid.first(), Some(&0.001));
        assert_eq!(grid.last(), Some(&120.0));
        assert_eq!(grid.len(), 124);
        for pair in grid.windows(2) {
            let ratio = pair[1] / pair[0];
            assert!((1.095..=1.105).contains(&ratio), "{pair:?} ratio {ratio}");
        }
        for bound in &grid {
            // Four significant digits: the shortest form has at most 4 digits after stripping.
            let digits: String = format!("{bound:e}")
                .split('e')
                .next()
                .unwrap_or_default()
                .chars()
                .filter(char::is_ascii_digit)
                .collect();
            assert!(digits.len() <= 4, "{bound} prints as {bound:e}");
        }
    }

    #[test]
    fn latency_buckets_contain_every_threshold_exactly() {
        let thresholds = [2.0, 0.25, 0.0333, 1e-4, 300.0, 0.1 + 0.2, 0.001];
        let bounds = latency_buckets(&thresholds);
        for t in thresholds {
            assert!(
                bounds.iter().any(|b| b.to_bits() == t.to_bits()),
                "{t} missing"
            );
        }
        assert!(
            bounds.windows(2).all(|p| p[0] < p[1]),
            "not strictly increasing"
        );
        // 0.001 is on the grid already; the other six are new.
        assert_eq!(bounds.len(), 124 + 6);
        assert!(latency_buckets(&[f64::INFINITY, f64::NAN]).len() == 124);
    }

    #[test]
    fn standard_grids_are_short_and_keep_every_threshold() {
        let ttft = family_buckets(Latency::Ttft, Resolution::Standard, &[2.0, 0.1]);
        assert_eq!(ttft.len(), 12, "{ttft:?}");
        assert!(ttft.contains(&2.0) && ttft.contains(&0.1));
        let itl = family_buckets(Latency::Itl, Resolution::Standard, &[0.1]);
        assert_eq!(itl.len(), 10);
        assert!(family_buckets(Latency::RequestDuration, Resolution::High, &[]).len() == 124);
        assert!(schedule_lag_buckets(Resolution::Standard).contains(&0.05));
        for grid in [TTFT_GRID.as_slice(), &ITL_GRID, &DURATION_GRID, &LAG_GRID] {
            assert!(grid.windows(2).all(|p| p[0] < p[1]));
        }
    }

    #[test]
    fn lag_buckets_are_one_two_five() {
        let lag = schedule_lag_buckets(Resolution::High);
        assert_eq!(lag.first(), Some(&0.00001));
        assert_eq!(lag.last(), Some(&10.0));
        assert!(lag.contains(&0.005) && lag.contains(&0.02));
        assert!(lag.windows(2).all(|p| p[0] < p[1]));
    }
}
