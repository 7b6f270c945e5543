//! Run-to-run variability of a simulated deployment's speed (`simulated.variability`, DESIGN.md
//! §8): the factor every pass's modelled time is multiplied by. The factor of a period is a pure
//! function of the seed and the period's number, so a run is reproducible whatever order the
//! workers ask in, and it reads tokio's clock only, so paused-time tests and benchmarks see the
//! same runs as the daemon.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::sim::{MAX_SPEED_FACTOR, Variability};

/// The deployment's speed, shared by its workers: the variability in force and since when.
#[derive(Debug)]
pub struct Speed {
    seed: u64,
    /// Where periods are counted from: the simulator's start.
    origin: Instant,
    active: Mutex<Option<Active>>,
}

#[derive(Debug, Clone)]
struct Active {
    spec: Variability,
    /// When this variability took effect (its drift counts from here).
    since: Instant,
}

impl Speed {
    /// The speed of a deployment starting now; `None`: every pass as modelled.
    pub fn new(spec: Option<Variability>, seed: u64) -> Arc<Speed> {
        let origin = Instant::now();
        Arc::new(Speed {
            seed,
            origin,
            active: Mutex::new(spec.map(|spec| Active {
                spec,
                since: origin,
            })),
        })
    }

    /// Replaces the variability from now on (a regression injected into a running deployment);
    /// periods keep their numbering, a drift starts over from 1.
    pub fn set(&self, spec: Option<Variability>) {
        let since = Instant::now();
        *self.active.lock().unwrap_or_else(PoisonError::into_inner) =
            spec.map(|spec| Active { spec, since });
    }

    /// The factor of a pass starting at `at`: 1 without variability.
    pub fn factor(&self, at: Instant) -> f64 {
        let active = self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match active {
            None => 1.0,
            Some(a) => factor_of(
                &a.spec,
                self.seed,
                at.saturating_duration_since(self.origin),
                at.saturating_duration_since(a.since),
            ),
        }
    }

    /// `pass` scaled by the factor at `at`; exactly `pass` without variability.
    pub fn apply(&self, pass: Duration, at: Instant) -> Duration {
        if pass.is_zero() {
            return pass;
        }
        let f = self.factor(at);
        if f == 1.0 {
            pass
        } else {
            Duration::from_secs_f64(pass.as_secs_f64() * f)
        }
    }
}

/// The factor of `spec` at `since_start` into the deployment's life and `since_set` after the
/// spec took effect: its scale, times the slow mode if the period drew it, times the period's
/// jitter, times the drift so far; clamped to [1 / [`MAX_SPEED_FACTOR`], `MAX_SPEED_FACTOR`].
pub fn factor_of(spec: &Variability, seed: u64, since_start: Duration, since_set: Duration) -> f64 {
    let period = (since_start.as_nanos() / spec.period.as_nanos().max(1)) as u64;
    let mut f = spec.scale;
    if let Some(b) = &spec.bimodal
        && unit(seed, period, 0) < b.probability
    {
        f *= b.factor;
    }
    if spec.jitter > 0.0 {
        f *= 1.0 + spec.jitter * (2.0 * unit(seed, period, 1) - 1.0);
    }
    if spec.drift_per_hour != 0.0 {
        f *= (1.0 + spec.drift_per_hour).powf(since_set.as_secs_f64() / 3600.0);
    }
    f.clamp(1.0 / MAX_SPEED_FACTOR, MAX_SPEED_FACTOR)
}

/// A uniform number in [0, 1) for (seed, period, draw): SplitMix64 over the three, so any period
/// is drawn without drawing the ones before it.
fn unit(seed: u64, period: u64, draw: u64) -> f64 {
    let mut z = seed
        .wrapping_add(period.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(draw.wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::sim::Bimodal;

    fn bimodal(probability: f64, factor: f64) -> Variability {
        Variability {
            period: Duration::from_secs(60),
            bimodal: Some(Bimodal {
                probability,
                factor,
            }),
            ..Variability::default()
        }
    }

    /// The factors of the first `n` one-minute periods.
    fn runs(spec: &Variability, seed: u64, n: u64) -> Vec<f64> {
        (0..n)
            .map(|k| {
                let at = Duration::from_secs(60 * k + 30);
                factor_of(spec, seed, at, at)
            })
            .collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_runs_and_another_seed_other_ones() {
        let spec = Variability {
            jitter: 0.05,
            ..bimodal(0.4, 1.4)
        };
        assert_eq!(runs(&spec, 7, 200), runs(&spec, 7, 200));
        assert_ne!(runs(&spec, 7, 200), runs(&spec, 8, 200));
    }

    #[test]
    fn a_bimodal_factor_holds_for_a_whole_period_and_about_its_share_of_them() {
        let spec = bimodal(0.4, 1.4);
        let all = runs(&spec, 3, 2000);
        assert!(all.iter().all(|f| *f == 1.0 || *f == 1.4), "{all:?}");
        let slow = all.iter().filter(|f| **f == 1.4).count();
        assert!((700..=900).contains(&slow), "{slow} slow runs of 2000");
        // Within a period the factor does not change.
        for k in 0..50u64 {
            let at = |s: u64| {
                let d = Duration::from_secs(60 * k + s);
                factor_of(&spec, 3, d, d)
            };
            assert_eq!(at(0), at(59), "period {k}");
        }
    }

    #[test]
    fn drift_compounds_per_hour_from_when_it_was_set() {
        let spec = Variability {
            drift_per_hour: 0.01,
            ..Variability::default()
        };
        let hours = |h: u64| Duration::from_secs(3600 * h);
        assert_eq!(factor_of(&spec, 0, hours(50), Duration::ZERO), 1.0);
        let f = factor_of(&spec, 0, hours(50), hours(24));
        assert!((f - 1.01f64.powi(24)).abs() < 1e-12, "{f}");
    }

    #[tokio::test(start_paused = true)]
    async fn without_variability_a_pass_is_exactly_as_modelled() {
        let none = Speed::new(None, 1);
        let pass = Duration::from_micros(12_345);
        assert_eq!(none.apply(pass, Instant::now()), pass);
        let slower = Speed::new(
            Some(Variability {
                scale: 1.25,
                ..Variability::default()
            }),
            1,
        );
        let scaled = slower.apply(Duration::from_millis(40), Instant::now());
        assert!((scaled.as_secs_f64() - 0.050).abs() < 1e-9, "{scaled:?}");
        // Set at run time, and taken away again.
        slower.set(None);
        assert_eq!(slower.apply(pass, Instant::now()), pass);
    }
}
