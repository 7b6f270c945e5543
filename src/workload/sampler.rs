//! Seeded randomness of the workloads: ISL/OSL length samplers for `sequence_distribution`, the
//! `isl_bucket` label, per-step seed derivation, and open-loop arrival schedules (the intended send
//! instants that latency is measured from).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal, Zipf};
use tokio::time::Instant;

/// Default Zipf exponent: a little above 1, the classic "few very common, long tail" shape.
pub const DEFAULT_ZIPF_EXPONENT: f64 = 1.1;

/// Default log-normal shape: σ = 0.6 puts ~95 % of draws within a factor 3.2 of the median.
pub const DEFAULT_LOGNORMAL_SIGMA: f64 = 0.6;

/// Why a sampler or schedule could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    #[error("length range [{min}, {max}] is empty or starts at 0")]
    BadRange { min: usize, max: usize },
    #[error("zipf exponent must be finite and positive, got {0}")]
    BadZipfExponent(f64),
    #[error("lognormal median must be finite and positive, got {0}")]
    BadMedian(f64),
    #[error("lognormal sigma must be finite and non-negative, got {0}")]
    BadSigma(f64),
    #[error("arrival rate must be finite and positive (requests/s), got {0}")]
    BadRate(f64),
}

/// Mixes a base seed with further parts into a new seed (SplitMix64 finaliser over each part), so
/// the randomness of every workload, step and request is reproducible from the run's seed alone
/// and independent of the order in which things are created.
pub fn derive_seed(base: u64, parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(mix64(base ^ 0x6a09_e667_f3bc_c908), |acc, part| {
            mix64(acc ^ mix64(part.wrapping_add(0x9e37_79b9_7f4a_7c15)))
        })
}

/// The seed of one closed-loop step of a workload: the same (workload seed, step index) gives the
/// same request stream on every run and for every paired target.
pub fn step_seed(workload_seed: u64, step_index: u64) -> u64 {
    derive_seed(workload_seed, &[step_index])
}

fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `isl_bucket` label value: the lower bound of the power-of-two bucket holding `tokens`
/// (1000 ↦ "512", 1024 ↦ "1024"; 0 ↦ "0").
pub fn isl_bucket(tokens: usize) -> String {
    log2_bucket(tokens).to_string()
}

/// The largest power of two not above `tokens` (0 for 0).
pub fn log2_bucket(tokens: usize) -> usize {
    match tokens {
        0 => 0,
        n => 1 << n.ilog2(),
    }
}

/// The shape lengths are drawn from, as named in the config's `distributions`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LengthDistribution {
    /// Every length in [min, max] equally likely.
    Uniform,
    /// Zipf over the range: rank k (1-based) maps to length `min + k − 1`, with probability
    /// ∝ k^−exponent, so the shortest length is the most common and long lengths form the tail.
    Zipf { exponent: f64 },
    /// Log-normal with the given median (`None`: the geometric mean of min and max, the centre of
    /// the range on a log scale) and σ of the underlying normal; draws outside [min, max] are
    /// clamped to the nearest bound, which leaves the median unchanged.
    LogNormal { median: Option<f64>, sigma: f64 },
}

impl LengthDistribution {
    /// The distribution's label value (`distribution` label).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::Zipf { .. } => "zipf",
            Self::LogNormal { .. } => "lognormal",
        }
    }

    /// Zipf with [`DEFAULT_ZIPF_EXPONENT`].
    pub fn zipf() -> Self {
        Self::Zipf {
            exponent: DEFAULT_ZIPF_EXPONENT,
        }
    }

    /// Log-normal centred on the range with [`DEFAULT_LOGNORMAL_SIGMA`].
    pub fn lognormal() -> Self {
        Self::LogNormal {
            median: None,
            sigma: DEFAULT_LOGNORMAL_SIGMA,
        }
    }
}

/// A seeded sampler of lengths in [min, max].
#[derive(Debug, Clone)]
pub struct LengthSampler {
    min: usize,
    max: usize,
    shape: Shape,
    rng: StdRng,
}

#[derive(Debug, Clone)]
enum Shape {
    Uniform,
    Zipf(Zipf<f64>),
    LogNormal(LogNormal<f64>),
}

impl LengthSampler {
    /// A sampler of `distribution` over [min, max] (min ≥ 1) seeded with `seed`.
    pub fn new(
        distribution: LengthDistribution,
        min: usize,
        max: usize,
        seed: u64,
    ) -> Result<Self, SamplerError> {
        if min == 0 || min > max {
            return Err(SamplerError::BadRange { min, max });
        }
        let shape = match distribution {
            LengthDistribution::Uniform => Shape::Uniform,
            LengthDistribution::Zipf { exponent } => {
                if !(exponent.is_finite() && exponent > 0.0) {
                    return Err(SamplerError::BadZipfExponent(exponent));
                }
                let ranks = (max - min + 1) as f64;
                let zipf = Zipf::new(ranks, exponent)
                    .map_err(|_| SamplerError::BadZipfExponent(exponent))?;
                Shape::Zipf(zipf)
            }
            LengthDistribution::LogNormal { median, sigma } => {
                let median = median.unwrap_or_else(|| ((min as f64) * (max as f64)).sqrt());
                if !(median.is_finite() && median > 0.0) {
                    return Err(SamplerError::BadMedian(median));
                }
                if !(sigma.is_finite() && sigma >= 0.0) {
                    return Err(SamplerError::BadSigma(sigma));
                }
                let lognormal = LogNormal::new(median.ln(), sigma)
                    .map_err(|_| SamplerError::BadSigma(sigma))?;
                Shape::LogNormal(lognormal)
            }
        };
        Ok(Self {
            min,
            max,
            shape,
            rng: StdRng::seed_from_u64(seed),
        })
    }

    /// The next length, always within [min, max].
    pub fn sample(&mut self) -> usize {
        let drawn = match &self.shape {
            Shape::Uniform => return self.rng.random_range(self.min..=self.max),
            Shape::Zipf(zipf) => self.min as f64 + zipf.sample(&mut self.rng) - 1.0,
            Shape::LogNormal(lognormal) => lognormal.sample(&mut self.rng).round(),
        };
        // `as` saturates for floats (NaN ↦ 0), and the clamp then enforces the range.
        (drawn as usize).clamp(self.min, self.max)
    }

    /// The range lengths are clamped to.
    pub fn range(&self) -> (usize, usize) {
        (self.min, self.max)
    }
}

impl Iterator for LengthSampler {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        Some(self.sample())
    }
}

/// How open-loop requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArrivalProcess {
    /// Exactly `rate` requests per second, evenly spaced, the first at the start.
    Constant { rate: f64 },
    /// A Poisson process of `rate` requests per second: exponential gaps, the first one after the
    /// start too (the process is memoryless, so the start is not an arrival).
    Poisson { rate: f64 },
}

impl ArrivalProcess {
    /// The configured rate in requests per second.
    pub fn rate(&self) -> f64 {
        match self {
            Self::Constant { rate } | Self::Poisson { rate } => *rate,
        }
    }
}

/// An endless sequence of intended send instants on a timeline that starts at a given instant.
/// The instants are absolute: a runner that falls behind sends late but still measures latency from
/// the intended instant, so neither a slow client nor a slow server can hide latency.
#[derive(Debug, Clone)]
pub struct ArrivalSchedule {
    start: Instant,
    process: ArrivalProcess,
    gaps: Option<Exp<f64>>,
    rng: StdRng,
    index: u64,
    // Seconds since `start` of the last Poisson arrival; each instant is computed from `start`, so
    // rounding to whole nanoseconds never accumulates.
    offset_s: f64,
}

impl ArrivalSchedule {
    /// A schedule for `process` starting at `start`; `seed` drives the Poisson gaps.
    pub fn new(process: ArrivalProcess, start: Instant, seed: u64) -> Result<Self, SamplerError> {
        let rate = process.rate();
        if !(rate.is_finite() && rate > 0.0) {
            return Err(SamplerError::BadRate(rate));
        }
        let gaps = match process {
            ArrivalProcess::Constant { .. } => None,
            ArrivalProcess::Poisson { rate } => {
                Some(Exp::new(rate).map_err(|_| SamplerError::BadRate(rate))?)
            }
        };
        Ok(Self {
            start,
            process,
            gaps,
            rng: StdRng::seed_from_u64(seed),
            index: 0,
            offset_s: 0.0,
        })
    }

    /// Where the timeline starts.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// The process this schedule follows.
    pub fn process(&self) -> ArrivalProcess {
        self.process
    }
}

impl Iterator for ArrivalSchedule {
    type Item = Instant;

    fn next(&mut self) -> Option<Instant> {
        let offset_s = match (&self.process, &self.gaps) {
            (ArrivalProcess::Poisson { .. }, Some(gaps)) => {
                self.offset_s += gaps.sample(&mut self.rng);
                self.offset_s
            }
            (process, _) => self.index as f64 / process.rate(),
        };
        self.index += 1;
        // `Duration::try_from_secs_f64` fails only past ~584 years; such a timeline has ended.
        let offset = Duration::try_from_secs_f64(offset_s).ok()?;
        self.start.checked_add(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISL_MIN: usize = 128;
    const ISL_MAX: usize = 4096;

    fn draws(distribution: LengthDistribution, seed: u64, n: usize) -> Vec<usize> {
        LengthSampler::new(distribution, ISL_MIN, ISL_MAX, seed)
            .expect("valid sampler")
            .take(n)
            .collect()
    }

    fn median(values: &[usize]) -> usize {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        sorted[sorted.len() / 2]
    }

    #[test]
    fn samplers_stay_within_bounds() {
        for distribution in [
            LengthDistribution::Uniform,
            LengthDistribution::zipf(),
            LengthDistribution::lognormal(),
        ] {
            let values = draws(distribution, 7, 20_000);
            assert!(values.iter().all(|v| (ISL_MIN..=ISL_MAX).contains(v)));
        }
        // A wide log-normal puts much of its mass outside the range; clamping moves it onto the
        // bounds instead of letting it escape.
        let wide = LengthDistribution::LogNormal {
            median: None,
            sigma: 3.0,
        };
        let values = draws(wide, 7, 20_000);
        assert!(values.iter().all(|v| (ISL_MIN..=ISL_MAX).contains(v)));
        let at_min = values.iter().filter(|&&v| v == ISL_MIN).count();
        let at_max = values.iter().filter(|&&v| v == ISL_MAX).count();
        // P(|Z| > ln(32)/2/3 = 0.58) ≈ 0.28 on each side.
        assert!((4_500..6_500).contains(&at_min), "{at_min}");
        assert!((4_500..6_500).contains(&at_max), "{at_max}");
    }

    #[test]
    fn same_seed_gives_same_sequence_and_other_seeds_differ() {
        for distribution in [
            LengthDistribution::Uniform,
            LengthDistribution::zipf(),
            LengthDistribution::lognormal(),
        ] {
            assert_eq!(draws(distribution, 42, 500), draws(distribution, 42, 500));
            assert_ne!(draws(distribution, 42, 500), draws(distribution, 43, 500));
        }
    }

    #[test]
    fn zipf_is_skewed_toward_short_lengths() {
        let values = draws(LengthDistribution::zipf(), 3, 20_000);
        let at_min = values.iter().filter(|&&v| v == ISL_MIN).count() as f64;
        let top_half = values
            .iter()
            .filter(|&&v| v > (ISL_MIN + ISL_MAX) / 2)
            .count() as f64;
        // P(rank 1) = 1 / H(3969, 1.1) ≈ 0.16; uniform would give 1/3969.
        assert!((0.13..0.19).contains(&(at_min / 20_000.0)), "{at_min}");
        assert!(top_half < at_min, "{top_half} >= {at_min}");
        assert!(median(&values) < ISL_MIN + 200);
        // A steeper exponent concentrates even more mass on the shortest length.
        let steep = draws(LengthDistribution::Zipf { exponent: 2.0 }, 3, 20_000);
        let steep_at_min = steep.iter().filter(|&&v| v == ISL_MIN).count() as f64;
        assert!(steep_at_min > 2.0 * at_min);
    }

    #[test]
    fn lognormal_median_is_near_the_configured_one() {
        let default = median(&draws(LengthDistribution::lognormal(), 5, 20_000)) as f64;
        let geometric_mean = ((ISL_MIN * ISL_MAX) as f64).sqrt(); // 724
        assert!((default / geometric_mean - 1.0).abs() < 0.03, "{default}");
        let configured = LengthDistribution::LogNormal {
            median: Some(1500.0),
            sigma: 0.4,
        };
        let observed = median(&draws(configured, 5, 20_000)) as f64;
        assert!((observed / 1500.0 - 1.0).abs() < 0.03, "{observed}");
    }

    #[test]
    fn uniform_is_flat() {
        let values = draws(LengthDistribution::Uniform, 11, 40_000);
        let below_mid = values.iter().filter(|&&v| v <= 2112).count() as f64 / 40_000.0;
        assert!((below_mid - 0.5).abs() < 0.02, "{below_mid}");
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        let zipf = LengthDistribution::Zipf { exponent: 0.0 };
        assert_eq!(
            LengthSampler::new(zipf, 1, 10, 0).unwrap_err(),
            SamplerError::BadZipfExponent(0.0)
        );
        assert!(LengthSampler::new(LengthDistribution::Uniform, 10, 9, 0).is_err());
        assert!(LengthSampler::new(LengthDistribution::Uniform, 0, 9, 0).is_err());
        let bad_sigma = LengthDistribution::LogNormal {
            median: None,
            sigma: f64::NAN,
        };
        assert!(LengthSampler::new(bad_sigma, 1, 10, 0).is_err());
        let single = LengthSampler::new(LengthDistribution::zipf(), 5, 5, 0).expect("valid");
        assert!(single.take(100).all(|v| v == 5));
    }

    #[test]
    fn isl_bucket_is_the_log2_lower_bound() {
        assert_eq!(isl_bucket(1000), "512");
        assert_eq!(isl_bucket(1024), "1024");
        assert_eq!(isl_bucket(1023), "512");
        assert_eq!(isl_bucket(4096), "4096");
        assert_eq!(isl_bucket(128), "128");
        assert_eq!(isl_bucket(1), "1");
        assert_eq!(isl_bucket(0), "0");
    }

    #[test]
    fn seeds_are_reproducible_and_distinct_per_step() {
        assert_eq!(step_seed(9, 3), step_seed(9, 3));
        let seeds: std::collections::HashSet<u64> =
            (0..1000).map(|step| step_seed(9, step)).collect();
        assert_eq!(seeds.len(), 1000);
        assert_ne!(step_seed(9, 0), step_seed(10, 0));
        // Order of parts matters, so (step 1, request 2) and (step 2, request 1) differ.
        assert_ne!(derive_seed(1, &[1, 2]), derive_seed(1, &[2, 1]));
    }

    #[tokio::test(start_paused = true)]
    async fn constant_rate_is_exact() {
        let start = Instant::now();
        let schedule = ArrivalSchedule::new(ArrivalProcess::Constant { rate: 4.0 }, start, 0)
            .expect("valid rate");
        let instants: Vec<Instant> = schedule.take(10_001).collect();
        assert_eq!(instants[0], start);
        assert_eq!(instants[1] - start, Duration::from_millis(250));
        assert_eq!(instants[10_000] - start, Duration::from_secs(2500));
        assert!(
            instants
                .windows(2)
                .all(|pair| pair[1] - pair[0] == Duration::from_millis(250))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn poisson_delivers_the_configured_rate() {
        let rate = 50.0;
        let start = Instant::now();
        let span = Duration::from_secs(200); // 10 000 expected arrivals
        let schedule =
            ArrivalSchedule::new(ArrivalProcess::Poisson { rate }, start, 17).expect("valid rate");
        let mut previous = start;
        let mut gaps_s = Vec::new();
        let mut arrivals = 0usize;
        for instant in schedule.take_while(|instant| *instant < start + span) {
            assert!(instant >= previous, "instants are monotonic");
            gaps_s.push((instant - previous).as_secs_f64());
            previous = instant;
            arrivals += 1;
        }
        let expected = rate * span.as_secs_f64();
        assert!(
            ((arrivals as f64) / expected - 1.0).abs() < 0.02,
            "{arrivals} arrivals, expected {expected}"
        );
        // Exponential gaps: the coefficient of variation is 1 (a constant rate would give 0).
        let mean = gaps_s.iter().sum::<f64>() / gaps_s.len() as f64;
        let variance = gaps_s.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps_s.len() as f64;
        assert!((variance.sqrt() / mean - 1.0).abs() < 0.05);
        // The same seed replays the same arrivals.
        let again = ArrivalSchedule::new(ArrivalProcess::Poisson { rate }, start, 17)
            .expect("valid rate")
            .take_while(|instant| *instant < start + span)
            .count();
        assert_eq!(again, arrivals);
    }

    #[tokio::test(start_paused = true)]
    async fn a_runner_sleeping_until_each_instant_fires_on_schedule() {
        let start = Instant::now();
        let schedule = ArrivalSchedule::new(ArrivalProcess::Constant { rate: 10.0 }, start, 0)
            .expect("valid rate");
        for (k, intended) in schedule.take(5).enumerate() {
            tokio::time::sleep_until(intended).await;
            assert_eq!(
                Instant::now() - start,
                Duration::from_millis(100 * k as u64)
            );
        }
    }

    #[test]
    fn invalid_rates_are_rejected() {
        let start = Instant::now();
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(ArrivalSchedule::new(ArrivalProcess::Poisson { rate }, start, 0).is_err());
            assert!(ArrivalSchedule::new(ArrivalProcess::Constant { rate }, start, 0).is_err());
        }
    }
}
