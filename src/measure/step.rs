//! Step accumulation: what one step measured for one target and label set over its steady
//! window, and the step result (docs/DESIGN.md §5) computed from it at the step's end.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::request::{CacheSource, Outcome, Reasoning, Sample, ServerSplit};

/// Share of failed steady-window requests above which a step counts as faulted: its latencies and
/// throughput describe the fault more than the service, so SLO verdicts leave them out (its
/// errors still count).
pub const FAULTED_ERROR_RATIO: f64 = 0.1;

/// Lower bar for closed-loop steps in which every worker saw at least one failure: their
/// back-off after each failure hides how long the target was failing (see the step runner).
pub const FAULTED_ERROR_RATIO_WITH_BACKOFF: f64 = 0.02;

/// Seconds are stored in microseconds with 3 significant digits, up to one hour (clamped above).
const MICROS_MAX: u64 = 3_600_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MICROS_MAX, 3).expect("static bounds are valid")
}

fn record_secs(h: &mut Histogram<u64>, secs: f64) {
    let micros = (secs * 1e6).round().clamp(1.0, MICROS_MAX as f64) as u64;
    h.saturating_record(micros);
}

/// Quantiles and mean of a distribution in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    /// 95 % confidence intervals of the three quantiles (lower, upper).
    pub p50_ci: (Option<f64>, Option<f64>),
    pub p90_ci: (Option<f64>, Option<f64>),
    pub p99_ci: (Option<f64>, Option<f64>),
    pub mean: f64,
    pub stddev: f64,
    pub min: f64,
    pub max: f64,
    pub count: u64,
}

/// The distribution-free 95 % confidence interval of the `q` quantile of `h`, in seconds: the
/// samples at the order-statistic ranks of [`crate::measure::stats::confidence_ranks`] (the
/// lowest value of the lower one's bucket, the highest of the upper one's); a side the samples
/// cannot bound is `None`.
fn interval(h: &Histogram<u64>, q: f64) -> (Option<f64>, Option<f64>) {
    let (lower, upper) = super::stats::confidence_ranks(h.len(), q);
    let at_rank = |rank: u64| {
        let mut seen = 0u64;
        h.iter_recorded().find_map(|b| {
            seen += b.count_at_value();
            (seen >= rank).then(|| b.value_iterated_to())
        })
    };
    (
        lower
            .and_then(at_rank)
            .map(|v| h.lowest_equivalent(v) as f64 / 1e6),
        upper
            .and_then(at_rank)
            .map(|v| h.highest_equivalent(v) as f64 / 1e6),
    )
}

impl Spread {
    fn of(h: &Histogram<u64>) -> Option<Spread> {
        if h.is_empty() {
            return None;
        }
        let s = |v: u64| v as f64 / 1e6;
        Some(Spread {
            p50: s(h.value_at_quantile(0.5)),
            p90: s(h.value_at_quantile(0.9)),
            p99: s(h.value_at_quantile(0.99)),
            p50_ci: interval(h, 0.5),
            p90_ci: interval(h, 0.9),
            p99_ci: interval(h, 0.99),
            mean: h.mean() / 1e6,
            stddev: h.stdev() / 1e6,
            min: s(h.min()),
            max: s(h.max()),
            count: h.len(),
        })
    }
}

/// The request and token counts of a step (or of several steps added up): the one model of them
/// that the step accumulator, the SLO engine's step records and its window totals share.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    /// Successful requests (`requests - errors`).
    pub ok: u64,
    pub errors: u64,
    /// Tokens of successful requests.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
}

impl Counts {
    /// One request's counts, as a step counts it: a cancelled one counts nowhere (the canary's
    /// own choice, not the server's answer), a failed one as an error, and its tokens as the
    /// sample counts them.
    pub fn of(s: &Sample) -> Counts {
        if !s.answered() {
            return Counts::default();
        }
        let ok = s.outcome.is_ok();
        Counts {
            requests: 1,
            ok: u64::from(ok),
            errors: u64::from(!ok),
            prompt_tokens: s.prompt_tokens,
            cached_tokens: s.cached_tokens,
            output_tokens: s.output_tokens,
        }
    }

    pub fn add(&mut self, other: &Counts) {
        // Saturating: no server-reported count can wrap a total around to a small number.
        self.requests = self.requests.saturating_add(other.requests);
        self.ok = self.ok.saturating_add(other.ok);
        self.errors = self.errors.saturating_add(other.errors);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }
}

/// Sums of a step's [`ServerSplit`]s, for their means.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct SplitSums {
    requests: u64,
    client_ttft: f64,
    client_queue: f64,
    server_ttft: f64,
    handoff: f64,
    server_queue: (f64, u64),
    server_prefill: (f64, u64),
    kv_transfer: (f64, u64),
}

impl SplitSums {
    fn add(&mut self, s: &ServerSplit) {
        let opt = |acc: &mut (f64, u64), v: Option<f64>| {
            if let Some(v) = v {
                acc.0 += v;
                acc.1 += 1;
            }
        };
        self.requests += 1;
        self.client_ttft += s.client_ttft;
        self.client_queue += s.client_queue;
        self.server_ttft += s.server_ttft;
        self.handoff += s.handoff;
        opt(&mut self.server_queue, s.server_queue);
        opt(&mut self.server_prefill, s.server_prefill);
        opt(&mut self.kv_transfer, s.kv_transfer);
    }

    fn merge(&mut self, o: &SplitSums) {
        let pair = |a: &mut (f64, u64), b: (f64, u64)| {
            a.0 += b.0;
            a.1 += b.1;
        };
        self.requests += o.requests;
        self.client_ttft += o.client_ttft;
        self.client_queue += o.client_queue;
        self.server_ttft += o.server_ttft;
        self.handoff += o.handoff;
        pair(&mut self.server_queue, o.server_queue);
        pair(&mut self.server_prefill, o.server_prefill);
        pair(&mut self.kv_transfer, o.kv_transfer);
    }

    fn means(&self) -> Option<TtftBreakdown> {
        let n = self.requests as f64;
        let mean = |(sum, count): (f64, u64)| (count > 0).then(|| sum / count as f64);
        (self.requests > 0).then(|| TtftBreakdown {
            requests: self.requests,
            client_ttft: self.client_ttft / n,
            client_queue: self.client_queue / n,
            server_queue: mean(self.server_queue),
            server_prefill: mean(self.server_prefill),
            server_ttft: self.server_ttft / n,
            handoff: self.handoff / n,
            kv_transfer: mean(self.kv_transfer),
        })
    }
}

/// The mean TTFT of a step's successful requests that carried the server's timing, taken apart
/// (seconds; see [`ServerSplit`]): `client_ttft` = `client_queue` + `server_ttft` + `handoff`
/// exactly, as means of the same requests add up (quantiles would not).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TtftBreakdown {
    /// Successful steady requests with the server's timing.
    pub requests: u64,
    pub client_ttft: f64,
    pub client_queue: f64,
    pub server_queue: Option<f64>,
    pub server_prefill: Option<f64>,
    pub server_ttft: f64,
    pub handoff: f64,
    pub kv_transfer: Option<f64>,
}

/// A step's successful requests that carried reasoning: their distributions and token sums.
#[derive(Debug, Clone)]
struct ReasoningSums {
    requests: u64,
    reasoning_tokens: u64,
    answer_tokens: u64,
    first_reasoning: Histogram<u64>,
    first_answer: Histogram<u64>,
    reasoning_time: Histogram<u64>,
}

impl Default for ReasoningSums {
    fn default() -> Self {
        ReasoningSums {
            requests: 0,
            reasoning_tokens: 0,
            answer_tokens: 0,
            first_reasoning: histogram(),
            first_answer: histogram(),
            reasoning_time: histogram(),
        }
    }
}

impl ReasoningSums {
    fn add(&mut self, r: &Reasoning) {
        self.requests += 1;
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(r.reasoning_tokens);
        self.answer_tokens = self.answer_tokens.saturating_add(r.answer_tokens);
        record_secs(&mut self.first_reasoning, r.time_to_first_reasoning_token);
        if let Some(t) = r.time_to_first_answer_token {
            record_secs(&mut self.first_answer, t);
        }
        if let Some(t) = r.reasoning_time {
            record_secs(&mut self.reasoning_time, t);
        }
    }

    fn merge(&mut self, o: &ReasoningSums) {
        self.requests += o.requests;
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(o.reasoning_tokens);
        self.answer_tokens = self.answer_tokens.saturating_add(o.answer_tokens);
        for (mine, theirs) in [
            (&mut self.first_reasoning, &o.first_reasoning),
            (&mut self.first_answer, &o.first_answer),
            (&mut self.reasoning_time, &o.reasoning_time),
        ] {
            mine.add(theirs).expect("histograms share bounds");
        }
    }

    /// `None` for a step without reasoning: its results carry no reasoning columns.
    fn summary(&self) -> Option<ReasoningStep> {
        (self.requests > 0).then(|| ReasoningStep {
            requests: self.requests,
            reasoning_tokens: self.reasoning_tokens,
            answer_tokens: self.answer_tokens,
            time_to_first_reasoning_token: Spread::of(&self.first_reasoning),
            time_to_first_answer_token: Spread::of(&self.first_answer),
            reasoning_time: Spread::of(&self.reasoning_time),
        })
    }
}

/// What a step's successful requests that carried reasoning measured (docs/METRICS.md,
/// "Reasoning"): their reasoning and answer tokens, and the distributions of the time to the
/// first reasoning token, to the first answer token and of the reasoning time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ReasoningStep {
    /// Successful steady requests whose stream carried reasoning.
    pub requests: u64,
    pub reasoning_tokens: u64,
    pub answer_tokens: u64,
    pub time_to_first_reasoning_token: Option<Spread>,
    /// `None` when none of them reached an answer.
    pub time_to_first_answer_token: Option<Spread>,
    pub reasoning_time: Option<Spread>,
}

/// Accumulates one (target, label set) over a step's steady window.
#[derive(Debug, Clone)]
pub struct StepAccumulator {
    ttft: Histogram<u64>,
    itl: Histogram<u64>,
    latency: Histogram<u64>,
    lag: Histogram<u64>,
    conversation: Histogram<u64>,
    outcomes: BTreeMap<Outcome, u64>,
    counts: Counts,
    expected_cached_tokens: u64,
    osl_mismatches: u64,
    cache_sources: BTreeMap<CacheSource, u64>,
    server: SplitSums,
    reasoning: ReasoningSums,
    good_requests: u64,
    good_output_tokens: u64,
    cancelled: u64,
    skipped: BTreeMap<&'static str, u64>,
}

impl Default for StepAccumulator {
    fn default() -> Self {
        StepAccumulator {
            ttft: histogram(),
            itl: histogram(),
            latency: histogram(),
            lag: histogram(),
            conversation: histogram(),
            outcomes: BTreeMap::new(),
            counts: Counts::default(),
            expected_cached_tokens: 0,
            osl_mismatches: 0,
            cache_sources: BTreeMap::new(),
            server: SplitSums::default(),
            reasoning: ReasoningSums::default(),
            good_requests: 0,
            good_output_tokens: 0,
            cancelled: 0,
            skipped: BTreeMap::new(),
        }
    }
}

impl StepAccumulator {
    pub fn record(&mut self, s: &Sample) {
        *self.outcomes.entry(s.outcome).or_default() += 1;
        if !s.answered() {
            // The canary's own choice: not a request the server answered or failed, so it stays
            // out of the request count, the error ratio, goodput and every distribution.
            self.cancelled += 1;
            return;
        }
        self.counts.add(&Counts::of(s));
        record_secs(&mut self.lag, s.schedule_lag);
        if !s.outcome.is_ok() {
            return;
        }
        if let Some(t) = s.ttft {
            record_secs(&mut self.ttft, t);
        }
        if let Some(i) = s.itl {
            record_secs(&mut self.itl, i);
        }
        record_secs(&mut self.latency, s.latency);
        self.expected_cached_tokens += s.expected_cached_tokens;
        self.osl_mismatches += u64::from(s.osl_mismatch);
        if let Some(source) = s.cache_source {
            *self.cache_sources.entry(source).or_default() += 1;
        }
        if let Some(split) = &s.server {
            self.server.add(split);
        }
        if let Some(reasoning) = &s.reasoning {
            self.reasoning.add(reasoning);
        }
        if s.good {
            self.good_requests += 1;
            self.good_output_tokens = self.good_output_tokens.saturating_add(s.output_tokens);
        }
    }

    /// A whole multi-turn conversation finished in `secs`.
    pub fn record_conversation(&mut self, secs: f64) {
        record_secs(&mut self.conversation, secs);
    }

    /// Adds `other` into `self` (a step's per-label accumulators into its per-target total).
    pub fn merge(&mut self, other: &StepAccumulator) {
        for (mine, theirs) in [
            (&mut self.ttft, &other.ttft),
            (&mut self.itl, &other.itl),
            (&mut self.latency, &other.latency),
            (&mut self.lag, &other.lag),
            (&mut self.conversation, &other.conversation),
        ] {
            mine.add(theirs).expect("histograms share bounds");
        }
        for (k, v) in &other.outcomes {
            *self.outcomes.entry(*k).or_default() += v;
        }
        self.counts.add(&other.counts);
        self.expected_cached_tokens += other.expected_cached_tokens;
        self.osl_mismatches += other.osl_mismatches;
        for (k, v) in &other.cache_sources {
            *self.cache_sources.entry(*k).or_default() += v;
        }
        self.server.merge(&other.server);
        self.reasoning.merge(&other.reasoning);
        self.good_requests += other.good_requests;
        self.cancelled += other.cancelled;
        for (k, v) in &other.skipped {
            *self.skipped.entry(k).or_default() += v;
        }
        self.good_output_tokens = self
            .good_output_tokens
            .saturating_add(other.good_output_tokens);
    }

    /// Requests recorded, cancelled ones included (a step's label set exists when it sent any).
    pub fn requests(&self) -> u64 {
        self.counts.requests + self.cancelled
    }

    /// Counts a request that was built but not sent, for `reason` (`context_length`).
    pub fn skip(&mut self, reason: &'static str) {
        *self.skipped.entry(reason).or_default() += 1;
    }

    /// Requests not sent, all reasons together.
    pub fn skipped(&self) -> u64 {
        self.skipped.values().sum()
    }

    /// The step result over a steady window of `window`.
    pub fn finish(
        &self,
        window: Duration,
        cost_per_hour_usd: Option<f64>,
        max_lag_p99: Duration,
    ) -> StepMeasurements {
        let secs = window.as_secs_f64().max(1e-9);
        let c = &self.counts;
        let ok = c.ok;
        let output_tps = c.output_tokens as f64 / secs;
        let good_tps = self.good_output_tokens as f64 / secs;
        let lag = Spread::of(&self.lag);
        let degraded = lag.is_some_and(|l| l.p99 > max_lag_p99.as_secs_f64());
        let error_ratio = if c.requests == 0 {
            0.0
        } else {
            c.errors as f64 / c.requests as f64
        };
        StepMeasurements {
            requests: c.requests,
            ok_requests: ok,
            errors: c.errors,
            cancelled: self.cancelled,
            skipped: self.skipped.clone(),
            outcomes: self.outcomes.clone(),
            ttft: Spread::of(&self.ttft),
            itl: Spread::of(&self.itl),
            latency: Spread::of(&self.latency),
            schedule_lag: lag,
            conversation: Spread::of(&self.conversation),
            output_tokens_per_second: output_tps,
            requests_per_second: ok as f64 / secs,
            error_ratio,
            prompt_tokens: c.prompt_tokens,
            cached_tokens: c.cached_tokens,
            output_tokens: c.output_tokens,
            cache_hit_ratio: (c.prompt_tokens > 0)
                .then(|| c.cached_tokens as f64 / c.prompt_tokens as f64),
            expected_cache_hit_ratio: (c.prompt_tokens > 0 && self.expected_cached_tokens > 0)
                .then(|| self.expected_cached_tokens as f64 / c.prompt_tokens as f64),
            cost_per_million_tokens_usd: cost_per_hour_usd
                .filter(|_| output_tps > 0.0)
                .map(|c| c / 3600.0 / output_tps * 1e6),
            good_requests: self.good_requests,
            goodput: self.good_requests as f64 / secs,
            good_output_tokens_per_second: good_tps,
            cost_per_million_good_tokens_usd: cost_per_hour_usd
                .filter(|_| good_tps > 0.0)
                .map(|c| c / 3600.0 / good_tps * 1e6),
            osl_mismatches: self.osl_mismatches,
            cache_sources: self.cache_sources.clone(),
            ttft_breakdown: self.server.means(),
            reasoning: self.reasoning.summary(),
            arrivals: None,
            degraded,
            faulted: error_ratio > FAULTED_ERROR_RATIO,
            saturated: false,
        }
    }
}

/// What a step measured for one target and label set (docs/DESIGN.md §5 "step results").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepMeasurements {
    /// Requests that ran to an outcome of the server's: successes and errors, never the
    /// cancelled ones.
    pub requests: u64,
    pub ok_requests: u64,
    pub errors: u64,
    /// Requests the canary abandoned on purpose (a workload's `cancel`); counted apart.
    pub cancelled: u64,
    /// Requests built but never sent, by reason: `context_length`, a prompt plus `max_tokens`
    /// above the target's context bound (warmup included). Neither requests nor errors of the
    /// server.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub skipped: BTreeMap<&'static str, u64>,
    /// Requests per outcome (`ok`, an error kind, or `cancelled`).
    pub outcomes: BTreeMap<Outcome, u64>,
    pub ttft: Option<Spread>,
    pub itl: Option<Spread>,
    pub latency: Option<Spread>,
    pub schedule_lag: Option<Spread>,
    /// Whole-conversation time (multi_turn).
    pub conversation: Option<Spread>,
    pub output_tokens_per_second: f64,
    pub requests_per_second: f64,
    pub error_ratio: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    /// Cached / prompt tokens over the window's successful requests.
    pub cache_hit_ratio: Option<f64>,
    /// Shared-prefix tokens sent / prompt tokens: the hit ratio a perfect cache would give.
    pub expected_cache_hit_ratio: Option<f64>,
    pub cost_per_million_tokens_usd: Option<f64>,
    /// Successful requests within the target's goodput limits
    /// ([`crate::request::GoodputLimits`]).
    pub good_requests: u64,
    /// Good requests per second of the steady window.
    pub goodput: f64,
    /// Output tokens of good requests per second.
    pub good_output_tokens_per_second: f64,
    /// The cost per 1M output tokens of good requests only.
    pub cost_per_million_good_tokens_usd: Option<f64>,
    pub osl_mismatches: u64,
    /// Successful requests by where their cached tokens came from (`usage`, `kv_hit_rate`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cache_sources: BTreeMap<CacheSource, u64>,
    /// The mean TTFT taken apart with the server's own timing, where the server sent it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_breakdown: Option<TtftBreakdown>,
    /// Steps whose requests carried reasoning: the reasoning and answer measures apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<ReasoningStep>,
    /// Open-loop steps: the steady window's arrivals, intended and sent, and the queue's growth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arrivals: Option<super::arrivals::ArrivalSummary>,
    /// Schedule lag p99 above the limit: the canary, not the server, was measured.
    pub degraded: bool,
    /// More than [`FAULTED_ERROR_RATIO`] of the requests failed: the step measured a fault.
    pub faulted: bool,
    /// An open-loop step whose server fell behind its arrivals ([`super::arrivals`]): the
    /// latencies describe a queue that was growing, at a load the server cannot carry.
    pub saturated: bool,
}

impl StepMeasurements {
    /// Its request and token counts.
    pub fn counts(&self) -> Counts {
        Counts {
            requests: self.requests,
            ok: self.ok_requests,
            errors: self.errors,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            output_tokens: self.output_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::GoodputLimits;

    fn ok(ttft: f64, latency: f64, out: u64) -> Sample {
        Sample {
            outcome: Outcome::Ok,
            ttft: Some(ttft),
            itl: Some(0.01),
            latency,
            schedule_lag: 0.0001,
            prompt_tokens: 1000,
            cached_tokens: 250,
            output_tokens: out,
            expected_cached_tokens: 256,
            ..Default::default()
        }
    }

    #[test]
    fn summary_of_a_known_step() {
        let mut acc = StepAccumulator::default();
        for i in 1..=100 {
            acc.record(&ok(i as f64 / 1000.0, 1.0, 100));
        }
        acc.record(&Sample {
            outcome: Outcome::Http5xx,
            latency: 0.5,
            ..Default::default()
        });
        let m = acc.finish(
            Duration::from_secs(10),
            Some(36.0),
            Duration::from_millis(50),
        );
        assert_eq!((m.requests, m.ok_requests, m.errors), (101, 100, 1));
        assert_eq!(m.outcomes[&Outcome::Http5xx], 1);
        let ttft = m.ttft.unwrap();
        assert!((ttft.p50 - 0.050).abs() < 0.0005, "{ttft:?}");
        assert!((ttft.p99 - 0.099).abs() < 0.0005, "{ttft:?}");
        assert_eq!(m.output_tokens_per_second, 1000.0);
        assert_eq!(m.requests_per_second, 10.0);
        assert!((m.error_ratio - 1.0 / 101.0).abs() < 1e-12);
        assert_eq!(m.cache_hit_ratio, Some(0.25));
        assert_eq!(m.expected_cache_hit_ratio, Some(0.256));
        // $36/h = 1 cent/s at 1000 tokens/s → $10 per million tokens.
        assert!((m.cost_per_million_tokens_usd.unwrap() - 10.0).abs() < 1e-9);
        assert!(!m.degraded && !m.faulted);
    }

    #[test]
    fn reasoning_is_summarised_only_for_steps_that_reasoned() {
        let reasoned = |first: f64, answer: Option<f64>| Sample {
            reasoning: Some(Reasoning {
                reasoning_tokens: 40,
                answer_tokens: 60,
                time_to_first_reasoning_token: first,
                time_to_first_answer_token: answer,
                reasoning_time: answer.map(|a| a - first),
            }),
            ..ok(first, 2.0, 100)
        };
        let window = Duration::from_secs(10);
        let lag = Duration::from_millis(50);
        let mut plain = StepAccumulator::default();
        plain.record(&ok(0.1, 1.0, 100));
        assert_eq!(plain.finish(window, None, lag).reasoning, None);
        let mut acc = StepAccumulator::default();
        acc.record(&reasoned(0.1, Some(0.5)));
        acc.record(&reasoned(0.2, None));
        // A failed request's reasoning is not summarised, as its TTFT is not.
        acc.record(&Sample {
            outcome: Outcome::StreamTruncated,
            ..reasoned(0.3, None)
        });
        let mut total = StepAccumulator::default();
        total.merge(&acc);
        total.merge(&plain);
        let r = total.finish(window, None, lag).reasoning.unwrap();
        assert_eq!(
            (r.requests, r.reasoning_tokens, r.answer_tokens),
            (2, 80, 120)
        );
        assert_eq!(r.time_to_first_reasoning_token.unwrap().count, 2);
        let answer = r.time_to_first_answer_token.unwrap();
        assert_eq!(answer.count, 1);
        assert!((answer.p50 - 0.5).abs() < 0.001, "{answer:?}");
        assert!((r.reasoning_time.unwrap().p50 - 0.4).abs() < 0.001, "{r:?}");
    }

    #[test]
    fn goodput_counts_requests_within_every_limit() {
        let limits = GoodputLimits {
            ttft: 0.5,
            itl: 0.05,
        };
        assert!(limits.good(Some(0.5), Some(0.05)));
        assert!(limits.good(Some(0.1), None), "one token: no ITL to judge");
        assert!(!limits.good(Some(0.6), Some(0.01)));
        assert!(!limits.good(Some(0.1), Some(0.06)));
        assert!(!limits.good(None, None), "no first token");
        let mut acc = StepAccumulator::default();
        for (ttft, good) in [(0.1, true), (0.2, true), (0.9, false), (0.3, true)] {
            let mut s = ok(ttft, 1.0, 100);
            s.good = good && limits.good(s.ttft, s.itl);
            acc.record(&s);
        }
        let m = acc.finish(
            Duration::from_secs(10),
            Some(36.0),
            Duration::from_millis(50),
        );
        assert_eq!(m.good_requests, 3);
        assert!((m.goodput - 0.3).abs() < 1e-12);
        assert!((m.good_output_tokens_per_second - 30.0).abs() < 1e-12);
        // $36/h over 30 good tokens/s: $333.33 per 1M good tokens (against $250 for all 40).
        assert!((m.cost_per_million_good_tokens_usd.unwrap() - 1e6 / 3000.0).abs() < 1e-6);
        assert!((m.cost_per_million_tokens_usd.unwrap() - 250.0).abs() < 1e-9);
    }

    #[test]
    fn lag_above_the_limit_marks_the_step_degraded() {
        let mut acc = StepAccumulator::default();
        for _ in 0..100 {
            let mut s = ok(0.1, 1.0, 10);
            s.schedule_lag = 0.2;
            acc.record(&s);
        }
        let m = acc.finish(Duration::from_secs(1), None, Duration::from_millis(50));
        assert!(m.degraded);
        assert_eq!(m.cost_per_million_tokens_usd, None);
    }

    #[test]
    fn a_step_with_many_errors_is_faulted() {
        let mut acc = StepAccumulator::default();
        for i in 0..10 {
            acc.record(&ok(0.1, 1.0, 10));
            if i < 2 {
                acc.record(&Sample {
                    outcome: Outcome::Http5xx,
                    latency: 0.01,
                    ..Default::default()
                });
            }
        }
        let m = acc.finish(Duration::from_secs(1), None, Duration::from_millis(50));
        assert!(m.faulted, "2 of 12 failed: {}", m.error_ratio);
        assert!(!m.degraded);
    }

    #[test]
    fn an_empty_step_has_no_quantiles_and_no_ratio() {
        let m = StepAccumulator::default().finish(
            Duration::from_secs(1),
            Some(1.0),
            Duration::from_millis(50),
        );
        assert_eq!(m.requests, 0);
        assert!(
            m.ttft.is_none()
                && m.cache_hit_ratio.is_none()
                && m.cost_per_million_tokens_usd.is_none()
        );
        assert_eq!(m.error_ratio, 0.0);
    }
}
