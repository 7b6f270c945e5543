//! The statistics the canary's numbers rest on, in one place: the two-sided 95 % normal
//! quantile, values with confidence intervals and their arithmetic, intervals of a proportion
//! (Wilson) and of a rate (Poisson), the order-statistic ranks that bound a quantile, and the
//! least-squares line with bounds on its slope and R² when the points themselves are intervals,
//! and the seeded bootstrap of a ratio between two runs (`llm-canary compare`).

/// The two-sided 95 % normal quantile.
pub const Z_95: f64 = 1.959_963_984_540_054;

/// Two-sided 95 %: each tail may hold 2.5 % of the probability.
const TAIL_PROBABILITY: f64 = 0.025;

/// The two-sided 97.5 % normal quantile: two intervals at this level, of two independent runs,
/// hold together with at least 95 % (Bonferroni), so a change between runs judged from both is
/// judged at 95 %.
const Z_975: f64 = 2.241_402_727_604_947;

/// Below this many samples the quantile ranks come from the exact binomial distribution; above
/// it the normal approximation is accurate to well under a rank.
const EXACT_BINOMIAL_MAX_SAMPLES: u64 = 1000;

/// A value with its 95 % confidence interval; the bounds may be infinite (unbounded).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub estimate: f64,
    pub lower: f64,
    pub upper: f64,
}

impl Interval {
    /// An estimate and its bounds.
    pub fn new(lower: f64, estimate: f64, upper: f64) -> Self {
        Interval {
            estimate,
            lower,
            upper,
        }
    }

    pub fn point(v: f64) -> Self {
        Interval {
            estimate: v,
            lower: v,
            upper: v,
        }
    }

    fn finite_or_none(x: f64) -> Option<f64> {
        x.is_finite().then_some(x)
    }

    /// The lower bound, `None` when unbounded.
    pub fn lower_bound(&self) -> Option<f64> {
        Self::finite_or_none(self.lower)
    }

    /// The upper bound, `None` when unbounded.
    pub fn upper_bound(&self) -> Option<f64> {
        Self::finite_or_none(self.upper)
    }
}

impl std::ops::Neg for Interval {
    type Output = Interval;

    fn neg(self) -> Self {
        Interval {
            estimate: -self.estimate,
            lower: -self.upper,
            upper: -self.lower,
        }
    }
}

impl std::ops::Add for Interval {
    type Output = Interval;

    fn add(self, o: Self) -> Self {
        Interval {
            estimate: self.estimate + o.estimate,
            lower: self.lower + o.lower,
            upper: self.upper + o.upper,
        }
    }
}

/// Extended interval arithmetic.
impl std::ops::Mul for Interval {
    type Output = Interval;

    fn mul(self, o: Self) -> Self {
        // 0 × ∞ is 0 here: an endpoint at exactly 0 bounds the product at 0 (extended interval
        // arithmetic), which keeps e.g. [0, 1] × [5, ∞] = [0, ∞] instead of NaN.
        let p = |a: f64, b: f64| if a == 0.0 || b == 0.0 { 0.0 } else { a * b };
        let c = [
            p(self.lower, o.lower),
            p(self.lower, o.upper),
            p(self.upper, o.lower),
            p(self.upper, o.upper),
        ];
        Interval {
            estimate: self.estimate * o.estimate,
            lower: c.iter().copied().fold(f64::INFINITY, f64::min),
            upper: c.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

impl std::ops::Div for Interval {
    type Output = Interval;

    fn div(self, o: Self) -> Self {
        let estimate = self.estimate / o.estimate;
        if o.lower <= 0.0 && o.upper >= 0.0 {
            // A divisor that may be zero bounds nothing.
            return Interval {
                estimate,
                lower: f64::NEG_INFINITY,
                upper: f64::INFINITY,
            };
        }
        let inv = Interval {
            estimate: 1.0 / o.estimate,
            lower: 1.0 / o.upper,
            upper: 1.0 / o.lower,
        };
        Interval {
            estimate,
            ..self * inv
        }
    }
}

/// Wilson score interval of a proportion.
pub fn wilson(successes: u64, n: u64) -> Interval {
    let nf = n as f64;
    let p = successes as f64 / nf;
    let z2 = Z_95 * Z_95;
    let denom = 1.0 + z2 / nf;
    let center = (p + z2 / (2.0 * nf)) / denom;
    let half = Z_95 * (p * (1.0 - p) / nf + z2 / (4.0 * nf * nf)).sqrt() / denom;
    Interval {
        estimate: p,
        lower: (center - half).max(0.0),
        upper: (center + half).min(1.0),
    }
}

/// A rate `count / seconds` with the normal approximation of a Poisson count's interval.
pub fn poisson_rate(count: u64, seconds: f64) -> Interval {
    let c = count as f64;
    let half = Z_95 * c.sqrt();
    Interval {
        estimate: c / seconds,
        lower: (c - half).max(0.0) / seconds,
        upper: (c + half + Z_95 * Z_95 / 2.0) / seconds,
    }
}

/// The rank of the sample quantile: ⌈q·n⌉, at least 1.
pub fn point_rank(samples: u64, q: f64) -> u64 {
    ((q * samples as f64).ceil() as u64).clamp(1, samples)
}

/// The 1-based ranks (j, k) with P(X₍ⱼ₎ ≤ ξ_q ≤ X₍ₖ₎) ≥ 95 % for a continuous distribution, from
/// the number of samples below the true quantile being Binomial(n, q): exact up to
/// [`EXACT_BINOMIAL_MAX_SAMPLES`], else the normal approximation n·q ± 1.96·√(n·q·(1−q)). A rank
/// that would fall outside [1, n] is `None`: that side cannot be bounded with these samples.
pub fn confidence_ranks(samples: u64, q: f64) -> (Option<u64>, Option<u64>) {
    ranks_at(samples, q, TAIL_PROBABILITY, Z_95)
}

/// The ranks of [`confidence_ranks`] at 97.5 % instead of 95 %: the intervals of one quantile in
/// two independent runs then both hold with at least 95 %, so the ratio of their bounds bounds
/// the ratio of the two quantiles at 95 % (`llm-canary compare`).
pub fn paired_confidence_ranks(samples: u64, q: f64) -> (Option<u64>, Option<u64>) {
    ranks_at(samples, q, TAIL_PROBABILITY / 2.0, Z_975)
}

/// Order-statistic ranks leaving at most `tail` of the probability on each side (`z` the normal
/// quantile of the same level, for large samples).
fn ranks_at(samples: u64, q: f64, tail: f64, z: f64) -> (Option<u64>, Option<u64>) {
    if samples == 0 || !(q > 0.0 && q < 1.0) {
        return (None, None);
    }
    if samples <= EXACT_BINOMIAL_MAX_SAMPLES {
        return exact_binomial_ranks(samples, q, tail);
    }
    let n = samples as f64;
    let spread = z * (n * q * (1.0 - q)).sqrt();
    let lower = (n * q - spread).floor();
    let upper = (n * q + spread).ceil();
    let in_range = |rank: f64| (rank >= 1.0 && rank <= n).then_some(rank as u64);
    (in_range(lower), in_range(upper))
}

/// Exact ranks: j − 1 is the largest count with P(B ≤ j − 1) ≤ `tail` (2.5 % for 95 %) and k − 1
/// the smallest with P(B ≤ k − 1) ≥ 1 − `tail`, B ~ Binomial(n, q). The probabilities are summed
/// from log-space terms so that (1 − q)ⁿ underflowing for large n costs nothing but negligible mass.
fn exact_binomial_ranks(samples: u64, q: f64, tail: f64) -> (Option<u64>, Option<u64>) {
    let n = samples as f64;
    let log_odds = (q / (1.0 - q)).ln();
    let mut log_pmf = n * (1.0 - q).ln();
    let mut cdf = 0.0;
    let mut lower = None;
    for below in 0..samples {
        cdf += log_pmf.exp();
        if cdf <= tail {
            lower = Some(below + 1);
        }
        if cdf >= 1.0 - tail {
            return (lower, Some(below + 1));
        }
        let i = below as f64;
        log_pmf += ((n - i) / (i + 1.0)).ln() + log_odds;
    }
    (lower, None)
}

/// The fewest samples whose 95 % interval for the quantile `q` is bounded on both sides
/// ([`confidence_ranks`] gives both ranks): 368 for p99, 6 for the median. `None` past 10⁷.
pub fn samples_to_bound(q: f64) -> Option<u64> {
    if !(q > 0.0 && q < 1.0) {
        return None;
    }
    let bounded = |n: u64| matches!(confidence_ranks(n, q), (Some(_), Some(_)));
    // Bounded from some n on: double to a bounded count, then bisect down to the first.
    let mut hi = 1u64;
    while !bounded(hi) {
        hi *= 2;
        if hi > 10_000_000 {
            return None;
        }
    }
    let mut lo = hi / 2;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if bounded(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// Fewer items than this on either side leave a bootstrap interval unbounded: resampling a
/// handful of blocks says nothing about what another run would give.
pub const BOOTSTRAP_MIN_ITEMS: usize = 5;

/// Σx / Σy over `(x, y)` items (a rate when y is seconds, a ratio of counts when y is requests
/// or prompt tokens); `None` when Σy is 0.
pub fn ratio_of_sums(items: &[&(f64, f64)]) -> Option<f64> {
    let (x, y) = items
        .iter()
        .fold((0.0, 0.0), |(x, y), (a, b)| (x + a, y + b));
    (y > 0.0).then(|| x / y)
}

/// The `q` quantile (nearest rank, [`point_rank`]) of the values of every block together;
/// `None` without values.
pub fn pooled_quantile(blocks: &[&Vec<f64>], q: f64) -> Option<f64> {
    let mut all: Vec<f64> = blocks.iter().flat_map(|b| b.iter().copied()).collect();
    if all.is_empty() {
        return None;
    }
    let rank = point_rank(all.len() as u64, q) as usize;
    let (_, v, _) = all.select_nth_unstable_by(rank - 1, f64::total_cmp);
    Some(*v)
}

/// B's value over A's; 0 over 0 is 1 (no change), more than 0 over 0 unbounded.
pub fn change_ratio(a: f64, b: f64) -> f64 {
    match (a > 0.0, b > 0.0) {
        (true, _) => b / a,
        (false, false) => 1.0,
        (false, true) => f64::INFINITY,
    }
}

/// The change B/A of `statistic` between two runs, with its 95 % percentile bootstrap interval:
/// `resamples` times, each run's items are drawn again with replacement (the runs independently),
/// from a generator seeded with `seed`, so the same data give the same interval. The items are
/// blocks of consecutive requests (slices of a step's window), so requests that resemble their
/// neighbours (a closed loop's batches, a burst of errors) move together and widen the interval
/// as they should. Unbounded (0, ∞) with fewer than [`BOOTSTRAP_MIN_ITEMS`] items on a side, a
/// statistic either run lacks, or more than 2.5 % of resamples where it is undefined.
pub fn bootstrap_change<T>(
    a: &[T],
    b: &[T],
    statistic: impl Fn(&[&T]) -> Option<f64>,
    resamples: usize,
    seed: u64,
) -> Interval {
    use rand::{Rng, SeedableRng};
    let whole = |items: &[T]| statistic(&items.iter().collect::<Vec<_>>());
    let estimate = match (whole(a), whole(b)) {
        (Some(x), Some(y)) => change_ratio(x, y),
        _ => f64::NAN,
    };
    let unbounded = Interval::new(0.0, estimate, f64::INFINITY);
    if a.len() < BOOTSTRAP_MIN_ITEMS || b.len() < BOOTSTRAP_MIN_ITEMS || estimate.is_nan() {
        return unbounded;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut draw = |items: &[T]| {
        let n = items.len();
        let picks: Vec<&T> = (0..n).map(|_| &items[rng.random_range(0..n)]).collect();
        statistic(&picks)
    };
    let mut changes = Vec::with_capacity(resamples);
    let mut undefined = 0usize;
    for _ in 0..resamples {
        match (draw(a), draw(b)) {
            (Some(x), Some(y)) => changes.push(change_ratio(x, y)),
            _ => undefined += 1,
        }
    }
    if changes.is_empty() || undefined as f64 > TAIL_PROBABILITY * resamples as f64 {
        return unbounded;
    }
    changes.sort_by(f64::total_cmp);
    let n = changes.len();
    let at = |p: f64| changes[((p * n as f64).floor() as usize).min(n - 1)];
    Interval::new(at(TAIL_PROBABILITY), estimate, at(1.0 - TAIL_PROBABILITY))
}

/// The mean of `values` and their sample standard deviation (0 with fewer than two); `None`
/// without values. What the SLO engine's run spreads read (`slo::baseline`, `slo::verdict`).
pub fn mean_sd(values: &[f64]) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = if values.len() < 2 {
        0.0
    } else {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    };
    Some((mean, sd))
}

/// Student's t quantile at 99.9 % (one-sided) for `df` degrees of freedom, from the standard
/// table, interpolated in 1/df between its rows; the normal 3.090 for infinite `df`.
pub fn t_999(df: usize) -> f64 {
    const ROWS: [(f64, f64); 37] = [
        (1.0, 318.309),
        (2.0, 22.327),
        (3.0, 10.215),
        (4.0, 7.173),
        (5.0, 5.893),
        (6.0, 5.208),
        (7.0, 4.785),
        (8.0, 4.501),
        (9.0, 4.297),
        (10.0, 4.144),
        (11.0, 4.025),
        (12.0, 3.930),
        (13.0, 3.852),
        (14.0, 3.787),
        (15.0, 3.733),
        (16.0, 3.686),
        (17.0, 3.646),
        (18.0, 3.610),
        (19.0, 3.579),
        (20.0, 3.552),
        (21.0, 3.527),
        (22.0, 3.505),
        (23.0, 3.485),
        (24.0, 3.467),
        (25.0, 3.450),
        (26.0, 3.435),
        (27.0, 3.421),
        (28.0, 3.408),
        (29.0, 3.396),
        (30.0, 3.385),
        (40.0, 3.307),
        (50.0, 3.261),
        (60.0, 3.232),
        (80.0, 3.195),
        (100.0, 3.174),
        (120.0, 3.160),
        (f64::INFINITY, 3.090),
    ];
    let df = (df.max(1)) as f64;
    for pair in ROWS.windows(2) {
        let ((d0, t0), (d1, t1)) = (pair[0], pair[1]);
        if df <= d1 {
            // Linear in 1/df, as tables are meant to be read.
            let f = (1.0 / d0 - 1.0 / df) / (1.0 / d0 - 1.0 / d1);
            return t0 + f * (t1 - t0);
        }
    }
    3.090
}

/// A least-squares line `y = intercept + slope·x` and its coefficient of determination.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    pub intercept: f64,
    pub slope: f64,
    /// 1 for points that all lie on the line (flat data included).
    pub r2: f64,
}

/// The least-squares line through `(x, y)` points; `None` with fewer than two distinct xs.
pub fn least_squares(xs: &[f64], ys: &[f64]) -> Option<Line> {
    let n = xs.len() as f64;
    let mean_x = xs.iter().sum::<f64>() / n;
    let distinct = xs.iter().any(|x| (x - mean_x).abs() > 0.0);
    if xs.len() < 2 || xs.len() != ys.len() || !distinct {
        return None;
    }
    let slope: f64 = slope_coefficients(xs)
        .iter()
        .zip(ys)
        .map(|(c, y)| c * y)
        .sum();
    let mean_y = ys.iter().sum::<f64>() / n;
    Some(Line {
        intercept: mean_y - slope * mean_x,
        slope,
        r2: r2_of(xs, ys),
    })
}

/// Slope of the least-squares line: linear in the ys, so its bounds are exact.
pub fn slope_interval(xs: &[f64], ys: &[Interval]) -> Interval {
    let coef = slope_coefficients(xs);
    let mut out = Interval::point(0.0);
    for (c, y) in coef.iter().zip(ys) {
        out = out + Interval::point(*c) * *y;
    }
    out
}

fn slope_coefficients(xs: &[f64]) -> Vec<f64> {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let sxx: f64 = xs.iter().map(|x| (x - mean).powi(2)).sum();
    xs.iter().map(|x| (x - mean) / sxx).collect()
}

fn r2_of(xs: &[f64], ys: &[f64]) -> f64 {
    let (sse, sst) = (sse(xs, ys), sst(ys));
    if sst == 0.0 { 1.0 } else { 1.0 - sse / sst }
}

fn sst(ys: &[f64]) -> f64 {
    let mean = ys.iter().sum::<f64>() / ys.len() as f64;
    ys.iter().map(|y| (y - mean).powi(2)).sum()
}

/// Residual sum of squares of the least-squares line through (xs, ys).
fn sse(xs: &[f64], ys: &[f64]) -> f64 {
    let fitted = fit_line(xs, ys);
    ys.iter().zip(&fitted).map(|(y, f)| (y - f).powi(2)).sum()
}

fn fit_line(xs: &[f64], ys: &[f64]) -> Vec<f64> {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let b: f64 = slope_coefficients(xs)
        .iter()
        .zip(ys)
        .map(|(c, y)| c * y)
        .sum();
    xs.iter().map(|x| my + b * (x - mx)).collect()
}

/// Above this many groups the corners of the box are not enumerated; a greedy search over
/// corners gives the maxima instead.
const MAX_ENUMERATED_GROUPS: usize = 12;

/// The largest value of a convex function over the box: it lies at a corner.
fn max_over_corners(lo: &[f64], hi: &[f64], f: &dyn Fn(&[f64]) -> f64) -> f64 {
    let n = lo.len();
    if n <= MAX_ENUMERATED_GROUPS {
        let mut y = lo.to_vec();
        let mut best = f64::NEG_INFINITY;
        for mask in 0u32..(1 << n) {
            for i in 0..n {
                y[i] = if mask & (1 << i) != 0 { hi[i] } else { lo[i] };
            }
            best = best.max(f(&y));
        }
        return best;
    }
    let mut y = lo.to_vec();
    let mut best = f(&y);
    loop {
        let mut improved = false;
        for i in 0..n {
            let keep = y[i];
            y[i] = if keep == lo[i] { hi[i] } else { lo[i] };
            let v = f(&y);
            if v > best {
                best = v;
                improved = true;
            } else {
                y[i] = keep;
            }
        }
        if !improved {
            return best;
        }
    }
}

/// The smallest spread Σ(y − ȳ)² over the box: every y is its interval's point nearest a
/// common level c, with c the mean of those points (found by bisection; the mean of the clamped
/// points minus c decreases in c).
fn min_sst(lo: &[f64], hi: &[f64]) -> f64 {
    let clamp_all = |c: f64| {
        lo.iter()
            .zip(hi)
            .map(|(l, h)| c.clamp(*l, *h))
            .collect::<Vec<_>>()
    };
    let (mut a, mut b) = (
        lo.iter().copied().fold(f64::INFINITY, f64::min),
        hi.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    for _ in 0..200 {
        let c = (a + b) / 2.0;
        let ys = clamp_all(c);
        let mean = ys.iter().sum::<f64>() / ys.len() as f64;
        if mean > c {
            a = c;
        } else {
            b = c;
        }
    }
    sst(&clamp_all((a + b) / 2.0))
}

/// The smallest residual Σ(y − fit)² over the box: the distance between the box and the
/// plane of lines, by alternating projections (both convex, so they converge to it).
fn min_sse(xs: &[f64], lo: &[f64], hi: &[f64]) -> f64 {
    let mut y: Vec<f64> = lo.iter().zip(hi).map(|(l, h)| (l + h) / 2.0).collect();
    for _ in 0..2000 {
        let line = fit_line(xs, &y);
        let next: Vec<f64> = line
            .iter()
            .zip(lo.iter().zip(hi))
            .map(|(f, (l, h))| f.clamp(*l, *h))
            .collect();
        let moved: f64 = next.iter().zip(&y).map(|(a, b)| (a - b).abs()).sum();
        y = next;
        if moved < 1e-15 {
            break;
        }
    }
    sse(xs, &y)
}

/// R² of the least-squares line with bounds over every ys inside their intervals:
/// 1 − max SSE / min SST ≤ R² ≤ 1 − min SSE / max SST (SSE and SST are convex in the ys, so
/// their maxima lie at corners of the box and their minima are found by convex search).
pub fn r2_interval(xs: &[f64], ys: &[Interval]) -> Interval {
    let est: Vec<f64> = ys.iter().map(|y| y.estimate).collect();
    let estimate = r2_of(xs, &est);
    if ys
        .iter()
        .any(|y| !y.lower.is_finite() || !y.upper.is_finite())
    {
        return Interval {
            estimate,
            lower: 0.0,
            upper: 1.0,
        };
    }
    let lo: Vec<f64> = ys.iter().map(|y| y.lower).collect();
    let hi: Vec<f64> = ys.iter().map(|y| y.upper).collect();
    let max_sse = max_over_corners(&lo, &hi, &|y| sse(xs, y));
    let max_sst = max_over_corners(&lo, &hi, &|y| sst(y));
    let (min_sse, min_sst) = (min_sse(xs, &lo, &hi), min_sst(&lo, &hi));
    let lower = if min_sst > 0.0 {
        (1.0 - max_sse / min_sst).max(0.0)
    } else {
        0.0
    };
    let upper = if max_sst > 0.0 {
        (1.0 - min_sse / max_sst).min(1.0)
    } else {
        1.0
    };
    Interval {
        estimate,
        lower: lower.min(estimate),
        upper: upper.max(estimate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use Interval as I;

    fn iv(lo: f64, est: f64, hi: f64) -> Interval {
        I::new(lo, est, hi)
    }

    #[test]
    fn arithmetic_keeps_the_extremes() {
        let a = iv(1.0, 2.0, 3.0);
        let b = iv(-1.0, 1.0, 2.0);
        assert_eq!(a + b, iv(0.0, 3.0, 5.0));
        assert_eq!(a + -b, iv(-1.0, 1.0, 4.0));
        assert_eq!(a * b, iv(-3.0, 2.0, 6.0));
        let d = a / iv(2.0, 4.0, 4.0);
        assert_eq!((d.lower, d.estimate, d.upper), (0.25, 0.5, 1.5));
        let unbounded = a / b;
        assert!(unbounded.lower.is_infinite() && unbounded.upper.is_infinite());
        let open = iv(0.0, 0.5, 1.0) * iv(5.0, 6.0, f64::INFINITY);
        assert_eq!((open.lower, open.upper), (0.0, f64::INFINITY));
    }

    #[test]
    fn wilson_interval_matches_the_textbook() {
        // 10 successes of 100: Wilson 95 % is about [0.0552, 0.1744].
        let w = wilson(10, 100);
        assert!((w.lower - 0.0552).abs() < 5e-4, "{w:?}");
        assert!((w.upper - 0.1744).abs() < 5e-4, "{w:?}");
    }

    #[test]
    fn fits_of_exact_lines_and_their_bounds() {
        let xs = [0.0, 0.25, 0.5, 0.75, 1.0];
        // y = 1 − 0.8 x exactly, as points: slope −0.8, R² 1.
        let points: Vec<Interval> = xs.iter().map(|x| Interval::point(1.0 - 0.8 * x)).collect();
        let s = slope_interval(&xs, &points);
        assert!((s.estimate + 0.8).abs() < 1e-12 && (s.lower - s.upper).abs() < 1e-12);
        let r = r2_interval(&xs, &points);
        assert!(
            (r.estimate - 1.0).abs() < 1e-12 && r.lower > 0.999_999,
            "{r:?}"
        );
        // ±0.05 around the line: R² stays high, its lower bound is below 1, slope brackets −0.8.
        let noisy: Vec<Interval> = xs
            .iter()
            .map(|x| iv(0.95 - 0.8 * x, 1.0 - 0.8 * x, 1.05 - 0.8 * x))
            .collect();
        let r = r2_interval(&xs, &noisy);
        assert!(r.lower > 0.8 && r.lower < 1.0 && r.upper == 1.0, "{r:?}");
        let s = slope_interval(&xs, &noisy);
        assert!(s.lower < -0.8 && s.upper > -0.8 && s.upper < -0.6, "{s:?}");
        // A flat, noisy relation: the upper bound of R² is well below 1, so `r2 >= 0.9` fails.
        let flat: Vec<Interval> = [1.0, 0.0, 1.0, 0.0, 1.0]
            .iter()
            .map(|y| iv(y - 0.05, *y, y + 0.05))
            .collect();
        let r = r2_interval(&xs, &flat);
        assert!(r.upper < 0.5, "{r:?}");
        assert!(r.lower <= r.estimate && r.estimate <= r.upper);
    }
    #[test]
    fn confidence_ranks_follow_the_binomial() {
        // n = 100, median: the classic table gives ranks 40 and 61.
        assert_eq!(confidence_ranks(100, 0.5), (Some(40), Some(61)));
        // Too few samples to bound the median from below at 95 %: (1/2)^5 > 2.5 %.
        assert_eq!(confidence_ranks(5, 0.5).0, None);
        assert!(confidence_ranks(6, 0.5).0.is_some());
        // p99's upper side needs 0.99^n ≤ 2.5 %, i.e. n ≥ 368.
        assert_eq!(confidence_ranks(367, 0.99).1, None);
        assert_eq!(confidence_ranks(368, 0.99).1, Some(368));
        // At 97.5 % (two runs together at 95 %): 0.99^n ≤ 1.25 %, i.e. n ≥ 437.
        assert_eq!(paired_confidence_ranks(436, 0.99).1, None);
        assert_eq!(paired_confidence_ranks(437, 0.99).1, Some(437));
        let (wide, narrow) = (
            paired_confidence_ranks(500, 0.5),
            confidence_ranks(500, 0.5),
        );
        assert!(
            wide.0 < narrow.0 && wide.1 > narrow.1,
            "{wide:?} {narrow:?}"
        );
        // Large n: the normal approximation, symmetric around n·q.
        assert_eq!(confidence_ranks(10_000, 0.5), (Some(4902), Some(5098)));
        assert_eq!(confidence_ranks(0, 0.5), (None, None));
        assert_eq!(confidence_ranks(10, 1.0), (None, None));
    }

    #[test]
    fn samples_to_bound_a_quantile_match_its_ranks() {
        assert_eq!(samples_to_bound(0.99), Some(368));
        assert_eq!(samples_to_bound(0.5), Some(6));
        assert_eq!(samples_to_bound(1.0), None);
        let n = samples_to_bound(0.999).unwrap();
        assert!(
            confidence_ranks(n, 0.999).1.is_some() && confidence_ranks(n - 1, 0.999).1.is_none()
        );
    }

    #[test]
    fn mean_sd_is_the_sample_mean_and_deviation() {
        assert_eq!(mean_sd(&[]), None);
        assert_eq!(mean_sd(&[4.0]), Some((4.0, 0.0)));
        let (m, sd) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!(m, 5.0);
        assert!((sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12, "{sd}");
    }

    #[test]
    fn t_999_reads_the_table_and_falls_to_the_normal_quantile() {
        assert_eq!(t_999(1), 318.309);
        assert_eq!(t_999(10), 4.144);
        assert!((t_999(35) - (3.385 + 3.307) / 2.0).abs() < 0.01);
        assert!((t_999(1_000_000) - 3.090).abs() < 0.001);
        for df in 1..200 {
            assert!(t_999(df + 1) < t_999(df), "not decreasing at {df}");
        }
    }

    #[test]
    fn least_squares_of_a_line_and_of_too_few_points() {
        let l = least_squares(&[0.0, 0.5, 1.0], &[3.0, 2.0, 1.0]).unwrap();
        assert!((l.slope + 2.0).abs() < 1e-12 && (l.intercept - 3.0).abs() < 1e-12);
        assert!((l.r2 - 1.0).abs() < 1e-12);
        assert!(least_squares(&[1.0, 1.0], &[1.0, 2.0]).is_none());
        assert!(least_squares(&[1.0], &[1.0]).is_none());
        let flat = least_squares(&[0.0, 1.0, 2.0], &[5.0, 5.0, 5.0]).unwrap();
        assert_eq!((flat.slope, flat.r2), (0.0, 1.0));
    }
}
