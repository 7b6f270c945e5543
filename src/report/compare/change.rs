//! The change of one measure of one step between two runs: its value in each, the ratio B/A
//! with a 95 % interval derived from the per-request samples, and the verdict the interval
//! supports. The requests of a step are not independent (a closed loop's requests share
//! batches, errors come in bursts), so every interval comes from a seeded block bootstrap over
//! slices of the steady window; a quantile's is widened further to the distribution-free
//! order-statistic interval of `measure::stats` (each run's at 97.5 %, so both hold together at
//! 95 %), which is what few samples can bound at all.

use serde::Serialize;

use super::read::{Request, Step};
use crate::measure::stats::{self, Interval};

/// Bootstrap resamples per interval: enough for the 2.5 % and 97.5 % points to settle, few
/// enough for a whole bench's steps to compare in seconds.
pub const RESAMPLES: usize = 2000;

/// A step's steady window is cut into this many slices by the requests' intended sends, the
/// blocks the bootstrap resamples: their spread is what another window of the same length
/// could give, batches and bursts included. Fewer than `stats::BOOTSTRAP_MIN_ITEMS` slices with
/// requests (a window shorter than one round of a closed loop's requests) bound nothing.
pub const SLICES: usize = 10;

/// Which way a measure gets better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
}

/// What the interval of the change says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "better")]
    Better,
    #[serde(rename = "worse")]
    Worse,
    #[serde(rename = "no detectable change")]
    NoDetectableChange,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::NoDetectableChange => "no detectable change",
        }
    }

    /// The verdict of a change whose 95 % interval is `[lower, upper]`: a side of 1 only when the
    /// whole interval lies there.
    pub fn of(better: Better, lower: f64, upper: f64) -> Verdict {
        let (up, down) = (lower > 1.0, upper < 1.0);
        match (better, up, down) {
            (Better::Lower, true, _) | (Better::Higher, _, true) => Verdict::Worse,
            (Better::Lower, _, true) | (Better::Higher, true, _) => Verdict::Better,
            _ => Verdict::NoDetectableChange,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Latency {
    Ttft,
    Itl,
    Request,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A quantile of a latency over successful requests, in ms.
    Quantile(Latency, f64),
    /// Output tokens per second of the steady window.
    OutputRate,
    /// Good requests per second of the steady window.
    Goodput,
    /// Failed / answered requests, in %.
    ErrorRatio,
    /// Cached / prompt tokens of successful requests, in %.
    CacheHit,
}

/// One measure a step is compared on.
#[derive(Debug, Clone, Copy)]
pub struct Measure {
    /// Stable identifier, as the JSON has it: `ttft_p50`.
    pub id: &'static str,
    pub name: &'static str,
    pub unit: &'static str,
    pub decimals: usize,
    pub better: Better,
    kind: Kind,
}

const fn quantile(id: &'static str, name: &'static str, l: Latency, q: f64) -> Measure {
    Measure {
        id,
        name,
        unit: "ms",
        decimals: if matches!(l, Latency::Itl) { 2 } else { 1 },
        better: Better::Lower,
        kind: Kind::Quantile(l, q),
    }
}

/// Every measure, in the order the comparison lists them.
pub const MEASURES: [Measure; 13] = [
    quantile("ttft_p50", "TTFT p50", Latency::Ttft, 0.5),
    quantile("ttft_p90", "TTFT p90", Latency::Ttft, 0.9),
    quantile("ttft_p99", "TTFT p99", Latency::Ttft, 0.99),
    quantile("itl_p50", "ITL p50", Latency::Itl, 0.5),
    quantile("itl_p90", "ITL p90", Latency::Itl, 0.9),
    quantile("itl_p99", "ITL p99", Latency::Itl, 0.99),
    quantile("latency_p50", "latency p50", Latency::Request, 0.5),
    quantile("latency_p90", "latency p90", Latency::Request, 0.9),
    quantile("latency_p99", "latency p99", Latency::Request, 0.99),
    Measure {
        id: "output_tokens_per_second",
        name: "throughput",
        unit: "tok/s",
        decimals: 0,
        better: Better::Higher,
        kind: Kind::OutputRate,
    },
    Measure {
        id: "goodput",
        name: "goodput",
        unit: "req/s",
        decimals: 2,
        better: Better::Higher,
        kind: Kind::Goodput,
    },
    Measure {
        id: "error_ratio",
        name: "error ratio",
        unit: "%",
        decimals: 2,
        better: Better::Lower,
        kind: Kind::ErrorRatio,
    },
    Measure {
        id: "cache_hit_ratio",
        name: "cache hit",
        unit: "%",
        decimals: 1,
        better: Better::Higher,
        kind: Kind::CacheHit,
    },
];

/// One measure of one step, compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub measure: &'static str,
    pub name: &'static str,
    pub unit: &'static str,
    /// `worse` or `better`: what a higher value is.
    pub higher_is: &'static str,
    /// The value in each run, in `unit`; `null` where the run has no sample of it.
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// B/A, and its 95 % interval; a side the samples cannot bound is `null` (0 below, ∞ above).
    /// `change` is `null` too where A's value is 0 and B's is not (then `lower` is too).
    pub change: Option<f64>,
    pub lower: Option<f64>,
    pub upper: Option<f64>,
    pub verdict: Verdict,
    /// The requests behind each side's value.
    pub samples: [usize; 2],
    /// How the interval was derived: `order statistics and block bootstrap` (quantiles: the
    /// wider of both) or `block bootstrap` (rates and ratios).
    pub method: &'static str,
}

impl Change {
    /// Whether this is a change for the worse past `ratio` (≥ 1): B/A above it for a measure
    /// where lower is better, below 1/`ratio` where higher is.
    pub fn regressed(&self, ratio: f64) -> bool {
        // No finite change with a verdict: from none (A's 0) to some, past any ratio.
        self.verdict == Verdict::Worse
            && self.change.is_none_or(|c| match self.higher_is {
                "worse" => c > ratio,
                _ => c < 1.0 / ratio,
            })
    }
}

/// A seed per step and measure (FNV-1a of both), so that every interval is reproducible and no
/// two share their resamples.
fn seed(step: &str, measure: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in step.bytes().chain([0]).chain(measure.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Compares `measure` between the same step of two runs; `None` when neither run has it (a
/// cache hit ratio of a server that reports no cached tokens, goodput of older files).
pub fn compare(measure: &Measure, a: &Step, b: &Step) -> Option<Change> {
    let seed = seed(&a.key.to_string(), measure.id);
    let (values, interval, samples, method) = match measure.kind {
        Kind::Quantile(l, q) => {
            let (xa, xb) = (latencies(a, l), latencies(b, l));
            if xa.is_empty() && xb.is_empty() {
                return None;
            }
            let (pa, pb) = (point(&xa, q), point(&xb, q));
            // The wider of both: order statistics bound what few samples can say (a p99 of 100
            // requests), the block bootstrap what correlated ones can (a closed loop's batches).
            let iv = quantile_change(&xa, &xb, q).map(|os| {
                let (ba, bb) = (blocks(a, l), blocks(b, l));
                let quantile = |blocks: &[&Vec<f64>]| stats::pooled_quantile(blocks, q);
                let bs = stats::bootstrap_change(&ba, &bb, quantile, RESAMPLES, seed);
                Interval::new(os.lower.min(bs.lower), os.estimate, os.upper.max(bs.upper))
            });
            let ms = |v: Option<f64>| v.map(|v| v * 1e3);
            (
                (ms(pa), ms(pb)),
                iv,
                [xa.len(), xb.len()],
                "order statistics and block bootstrap",
            )
        }
        _ => {
            let (ia, ib) = (items(measure.kind, a)?, items(measure.kind, b)?);
            if ia.iter().chain(&ib).all(|(_, y)| *y == 0.0) {
                return None;
            }
            let scale = if measure.unit == "%" { 100.0 } else { 1.0 };
            let value = |items: &[(f64, f64)]| {
                stats::ratio_of_sums(&items.iter().collect::<Vec<_>>()).map(|v| v * scale)
            };
            let iv = stats::bootstrap_change(&ia, &ib, stats::ratio_of_sums, RESAMPLES, seed);
            (
                (value(&ia), value(&ib)),
                Some(iv),
                [count(a, measure.kind), count(b, measure.kind)],
                "block bootstrap",
            )
        }
    };
    let bounded = values.0.is_some() && values.1.is_some();
    let verdict = match (bounded, interval) {
        (true, Some(iv)) => Verdict::of(measure.better, iv.lower, iv.upper),
        _ => Verdict::NoDetectableChange,
    };
    let finite = |v: f64| v.is_finite().then_some(v);
    let iv = interval.filter(|_| bounded);
    Some(Change {
        measure: measure.id,
        name: measure.name,
        unit: measure.unit,
        higher_is: match measure.better {
            Better::Lower => "worse",
            Better::Higher => "better",
        },
        a: values.0,
        b: values.1,
        change: iv.and_then(|iv| finite(iv.estimate)),
        lower: iv.and_then(|iv| (iv.lower > 0.0).then_some(iv.lower).and_then(finite)),
        upper: iv.and_then(|iv| finite(iv.upper)),
        verdict,
        samples,
        method,
    })
}

/// A latency of every successful request of the step (seconds), sorted.
fn latencies(step: &Step, l: Latency) -> Vec<f64> {
    let mut v: Vec<f64> = step.requests.iter().filter_map(|r| latency(r, l)).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// A successful request's latency `l` (seconds).
fn latency(r: &Request, l: Latency) -> Option<f64> {
    if !r.outcome.is_ok() {
        return None;
    }
    match l {
        Latency::Ttft => r.ttft,
        Latency::Itl => r.itl,
        Latency::Request => Some(r.latency),
    }
    .filter(|v| v.is_finite())
}

/// The sample quantile (nearest rank) of sorted values.
fn point(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len() as u64;
    (n > 0).then(|| sorted[(stats::point_rank(n, q) - 1) as usize])
}

/// The ratio of two runs' `q` quantiles with its 95 % interval from order statistics: each
/// run's interval at 97.5 % (both hold together with at least 95 %), B's lower bound over A's
/// upper and B's upper over A's lower; a side either run cannot bound is unbounded. These
/// intervals take the requests as independent; [`compare`] widens them by the block bootstrap.
pub fn quantile_change(a: &[f64], b: &[f64], q: f64) -> Option<Interval> {
    let bounds = |s: &[f64]| {
        let (lo, hi) = stats::paired_confidence_ranks(s.len() as u64, q);
        let at = |r: Option<u64>| r.map(|r| s[(r - 1) as usize]);
        (at(lo), at(hi))
    };
    let (pa, pb) = (point(a, q)?, point(b, q)?);
    let ((alo, ahi), (blo, bhi)) = (bounds(a), bounds(b));
    let lower = match (blo, ahi) {
        (Some(b), Some(a)) if a > 0.0 => b / a,
        _ => 0.0,
    };
    let upper = match (bhi, alo) {
        (Some(b), Some(a)) if a > 0.0 => b / a,
        _ => f64::INFINITY,
    };
    Some(Interval::new(lower, stats::change_ratio(pa, pb), upper))
}

/// Which of the step's [`SLICES`] slices a request falls in, by its intended send from the
/// first one's; and a slice's seconds. `None` for a step without requests or window.
fn slicing(step: &Step) -> Option<(impl Fn(&Request) -> usize, f64)> {
    let secs = step.steady_seconds;
    let start = step.requests.iter().map(|r| r.intended_ns).min()?;
    if !(secs.is_finite() && secs > 0.0) {
        return None;
    }
    let width = secs / SLICES as f64;
    let index = move |r: &Request| {
        let at = r.intended_ns.saturating_sub(start) as f64 / 1e9;
        ((at / width) as usize).min(SLICES - 1)
    };
    Some((index, width))
}

/// The latency `l` of the successful requests per slice of the window, the slices that hold
/// any: the blocks the quantiles' bootstrap resamples.
fn blocks(step: &Step, l: Latency) -> Vec<Vec<f64>> {
    let Some((index, _)) = slicing(step) else {
        return Vec::new();
    };
    let mut out = vec![Vec::new(); SLICES];
    for r in &step.requests {
        if let Some(v) = latency(r, l) {
            out[index(r)].push(v);
        }
    }
    out.retain(|b| !b.is_empty());
    out
}

/// The `(Σx, Σy)` of each slice of the window, the items a rate or ratio is Σx / Σy of: output
/// tokens or good requests over the slice's seconds, errors over answered requests, cached over
/// prompt tokens. `None` when the run cannot say (no `good` field, no cached tokens reported).
fn items(kind: Kind, step: &Step) -> Option<Vec<(f64, f64)>> {
    let ok = step.requests.iter().filter(|r| r.outcome.is_ok());
    let lacking = match kind {
        Kind::Goodput => ok.clone().any(|r| r.good.is_none()),
        Kind::CacheHit => !ok.clone().any(|r| r.cached_tokens.is_some()),
        Kind::Quantile(..) => true,
        Kind::OutputRate | Kind::ErrorRatio => false,
    };
    if lacking {
        return None;
    }
    let Some((index, width)) = slicing(step) else {
        return Some(Vec::new());
    };
    let per_second = matches!(kind, Kind::OutputRate | Kind::Goodput);
    let mut out = vec![(0.0, if per_second { width } else { 0.0 }); SLICES];
    for r in &step.requests {
        if let Some((x, y)) = item(kind, r) {
            let slot = &mut out[index(r)];
            slot.0 += x;
            slot.1 += y;
        }
    }
    Some(out)
}

/// What one request adds to its slice's `(Σx, Σy)` (y 0 for rates: the slice's seconds are
/// its y); `None` for a request the measure does not count.
fn item(kind: Kind, r: &Request) -> Option<(f64, f64)> {
    let flag = |b: bool| f64::from(u8::from(b));
    let ok = r.outcome.is_ok();
    match kind {
        Kind::OutputRate => ok.then_some((r.output_tokens as f64, 0.0)),
        Kind::Goodput => ok.then_some((flag(r.good == Some(true)), 0.0)),
        Kind::ErrorRatio => {
            (ok || r.outcome.is_error()).then_some((flag(r.outcome.is_error()), 1.0))
        }
        Kind::CacheHit => ok.then_some((
            r.cached_tokens.unwrap_or(0) as f64,
            r.prompt_tokens.unwrap_or(0) as f64,
        )),
        Kind::Quantile(..) => None,
    }
}

/// The requests behind a rate or ratio of the step.
fn count(step: &Step, kind: Kind) -> usize {
    let counted = |r: &&Request| match kind {
        Kind::ErrorRatio => r.outcome.is_ok() || r.outcome.is_error(),
        _ => r.outcome.is_ok(),
    };
    step.requests.iter().filter(counted).count()
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_distr::{Distribution, LogNormal};

    use super::*;
    use crate::report::compare::read::StepKey;

    /// A step of `n` successful requests over a 10 s window: TTFT lognormal around `ttft` (s),
    /// 24 output tokens each, evenly spread intended sends.
    fn step(n: usize, ttft: f64, seed: u64) -> Step {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let spread = LogNormal::new(ttft.ln(), 0.3).unwrap();
        let requests = (0..n)
            .map(|i| {
                let t = spread.sample(&mut rng);
                let itl = 0.01 * (1.0 + 0.1 * rng.random::<f64>());
                Request {
                    intended_ns: (i as u64) * 10_000_000_000 / n as u64,
                    outcome: Outcome::Ok,
                    ttft: Some(t),
                    itl: Some(itl),
                    latency: t + 23.0 * itl,
                    output_tokens: 24,
                    prompt_tokens: Some(256),
                    cached_tokens: Some(64),
                    good: Some(t < ttft * 1.5),
                }
            })
            .collect();
        Step {
            key: StepKey {
                target: "agg".into(),
                workload: "concurrency_sweep".into(),
                labels: [("concurrency".to_owned(), "4".to_owned())].into(),
            },
            steady_seconds: 10.0,
            requests,
        }
    }

    use crate::request::Outcome;

    fn by_id<'a>(changes: &'a [Change], id: &str) -> &'a Change {
        changes.iter().find(|c| c.measure == id).unwrap()
    }

    fn all(a: &Step, b: &Step) -> Vec<Change> {
        MEASURES.iter().filter_map(|m| compare(m, a, b)).collect()
    }

    #[test]
    fn two_samples_of_one_distribution_read_no_detectable_change() {
        let changes = all(&step(600, 0.05, 1), &step(600, 0.05, 2));
        assert_eq!(changes.len(), MEASURES.len());
        for c in &changes {
            assert_eq!(c.verdict, Verdict::NoDetectableChange, "{c:?}");
            let (lo, hi) = (c.lower.unwrap_or(0.0), c.upper.unwrap_or(f64::INFINITY));
            assert!(lo <= 1.0 && 1.0 <= hi, "{c:?}");
        }
        // 600 samples bound a p99 on both sides at 97.5 % (437 do); the median's is narrow.
        let p50 = by_id(&changes, "ttft_p50");
        assert!(
            p50.lower.unwrap() > 0.85 && p50.upper.unwrap() < 1.15,
            "{p50:?}"
        );
        assert!(by_id(&changes, "ttft_p99").upper.is_some());
    }

    #[test]
    fn a_twenty_percent_slower_ttft_reads_worse_and_the_way_back_better() {
        let (a, b) = (step(600, 0.05, 1), step(600, 0.06, 2));
        let worse = all(&a, &b);
        let p50 = by_id(&worse, "ttft_p50");
        assert_eq!(p50.verdict, Verdict::Worse, "{p50:?}");
        assert_eq!(p50.higher_is, "worse");
        let (lo, hi) = (p50.lower.unwrap(), p50.upper.unwrap());
        assert!(
            lo > 1.0 && lo < 1.2 && hi > 1.2,
            "the interval holds the true 1.2: {p50:?}"
        );
        assert!(p50.regressed(1.1) && !p50.regressed(1.5));
        let better = all(&b, &a);
        let p50 = by_id(&better, "ttft_p50");
        assert_eq!(p50.verdict, Verdict::Better, "{p50:?}");
        assert!(!p50.regressed(1.0));
        // Fewer than 437 samples cannot bound a p99 from above: no verdict, however large.
        let few = all(&step(200, 0.05, 1), &step(200, 0.1, 2));
        let p99 = by_id(&few, "ttft_p99");
        assert_eq!(p99.verdict, Verdict::NoDetectableChange, "{p99:?}");
        assert_eq!(p99.upper, None);
    }

    #[test]
    fn higher_throughput_is_better_and_lower_is_worse() {
        // B sends a third more requests in the same window: a third more tokens per second.
        let (a, b) = (step(300, 0.05, 1), step(400, 0.05, 2));
        let up = all(&a, &b);
        let tps = by_id(&up, "output_tokens_per_second");
        assert_eq!((tps.a, tps.b), (Some(720.0), Some(960.0)));
        assert_eq!(tps.higher_is, "better");
        assert_eq!(tps.verdict, Verdict::Better, "{tps:?}");
        let down = all(&b, &a);
        let tps = by_id(&down, "output_tokens_per_second");
        assert_eq!(tps.verdict, Verdict::Worse, "{tps:?}");
        assert!(tps.regressed(1.2) && !tps.regressed(1.5), "{tps:?}");
    }

    #[test]
    fn errors_where_there_were_none_are_worse_and_none_on_either_side_is_no_change() {
        let a = step(400, 0.05, 1);
        let mut b = step(400, 0.05, 2);
        for r in b.requests.iter_mut().step_by(10) {
            r.outcome = Outcome::Http5xx;
        }
        let same = all(&a, &a);
        let e = by_id(&same, "error_ratio");
        assert_eq!(
            (e.a, e.change, e.verdict),
            (Some(0.0), Some(1.0), Verdict::NoDetectableChange)
        );
        let changes = all(&a, &b);
        let e = by_id(&changes, "error_ratio");
        assert_eq!(e.b, Some(10.0));
        assert_eq!(e.verdict, Verdict::Worse, "{e:?}");
        // From none to some: B/A is unbounded, and a regression at any ratio.
        assert_eq!(e.change, None);
        assert!(e.regressed(1.1) && e.regressed(100.0));
    }

    #[test]
    fn requests_that_move_in_batches_widen_the_interval_past_order_statistics() {
        // Each slice of the window one batch: its TTFT shared up to 1 %, the batches apart by
        // 20 %. 400 requests, but ten independent draws: what order statistics alone would
        // call a change, the block bootstrap does not.
        let batched = |seed: u64| {
            let mut s = step(400, 0.05, seed);
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let batch = LogNormal::new(0.0, 0.2).unwrap();
            let factors: Vec<f64> = (0..SLICES).map(|_| batch.sample(&mut rng)).collect();
            for (i, r) in s.requests.iter_mut().enumerate() {
                let t = 0.05 * factors[i * SLICES / 400] * (1.0 + 0.01 * rng.random::<f64>());
                r.ttft = Some(t);
            }
            s
        };
        let (a, b) = (batched(3), batched(4));
        let p50 = by_id(&all(&a, &b), "ttft_p50").clone();
        let sorted = |s: &Step| latencies(s, Latency::Ttft);
        let os = quantile_change(&sorted(&a), &sorted(&b), 0.5).unwrap();
        assert!(
            p50.lower.unwrap_or(0.0) < os.lower && p50.upper.unwrap_or(f64::INFINITY) > os.upper,
            "{p50:?} against {os:?}"
        );
        assert_eq!(p50.verdict, Verdict::NoDetectableChange, "{p50:?}");
    }

    #[test]
    fn verdicts_follow_the_direction_of_the_measure() {
        assert_eq!(Verdict::of(Better::Lower, 1.05, 1.3), Verdict::Worse);
        assert_eq!(Verdict::of(Better::Higher, 1.05, 1.3), Verdict::Better);
        assert_eq!(Verdict::of(Better::Lower, 0.7, 0.95), Verdict::Better);
        assert_eq!(Verdict::of(Better::Higher, 0.7, 0.95), Verdict::Worse);
        assert_eq!(
            Verdict::of(Better::Lower, 0.9, 1.1),
            Verdict::NoDetectableChange
        );
        assert_eq!(
            Verdict::of(Better::Higher, 0.0, f64::INFINITY),
            Verdict::NoDetectableChange
        );
        assert_eq!(
            serde_json::to_value(Verdict::NoDetectableChange).unwrap(),
            "no detectable change"
        );
    }

    #[test]
    fn the_bootstrap_is_reproducible_and_unbounded_on_a_handful_of_items() {
        let a: Vec<(f64, f64)> = (0..50).map(|i| (f64::from(i % 7), 1.0)).collect();
        let b: Vec<(f64, f64)> = (0..50).map(|i| (f64::from(i % 5), 1.0)).collect();
        let ratio = stats::ratio_of_sums;
        let one = stats::bootstrap_change(&a, &b, ratio, RESAMPLES, 7);
        assert_eq!(one, stats::bootstrap_change(&a, &b, ratio, RESAMPLES, 7));
        assert!(
            one.lower < one.estimate && one.estimate < one.upper,
            "{one:?}"
        );
        let few = stats::bootstrap_change(&a[..3], &b, ratio, RESAMPLES, 7);
        assert_eq!((few.lower, few.upper), (0.0, f64::INFINITY));
    }
}
