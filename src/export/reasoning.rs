//! The reasoning-model families of [`super::metrics::Metrics`] (docs/METRICS.md, "Reasoning"):
//! the time to the first reasoning token and to the first answer token, the reasoning time, and
//! the reasoning and answer tokens of each successful request whose stream carried reasoning.
//! Kept by `target`, `serving_mode` and `workload`, as the chunk gap is: the step results carry
//! them per step.

use std::sync::Arc;

use prometheus_client::metrics::family::Family;

use super::buckets::{Latency, Resolution, family_buckets, token_buckets};
use super::histogram::{AtomicHistogram, SharedBuckets};
use super::labels::ModeLabels;
use crate::request::Reasoning;

type ModeHistogram = Family<ModeLabels, AtomicHistogram, SharedBuckets>;

/// The five families; registered with the others in `export::registry`.
#[derive(Debug)]
pub(super) struct ReasoningFamilies {
    pub(super) first_reasoning_token: ModeHistogram,
    pub(super) first_answer_token: ModeHistogram,
    pub(super) reasoning_time: ModeHistogram,
    pub(super) reasoning_tokens: ModeHistogram,
    pub(super) answer_tokens: ModeHistogram,
}

impl ReasoningFamilies {
    /// The first reasoning token on the TTFT grid; the first answer token and the reasoning
    /// time, which last as long as the thinking, on the request duration's; tokens on
    /// [`token_buckets`]. Every SLO threshold is a bound of the latency grids, as of the others.
    pub(super) fn new(resolution: Resolution, thresholds: &[f64]) -> Self {
        let grid = |family| -> Arc<[f64]> { family_buckets(family, resolution, thresholds).into() };
        let (ttft, duration) = (grid(Latency::Ttft), grid(Latency::RequestDuration));
        let tokens: Arc<[f64]> = token_buckets().into();
        ReasoningFamilies {
            first_reasoning_token: Family::new_with_constructor(SharedBuckets(ttft)),
            first_answer_token: Family::new_with_constructor(SharedBuckets(duration.clone())),
            reasoning_time: Family::new_with_constructor(SharedBuckets(duration)),
            reasoning_tokens: Family::new_with_constructor(SharedBuckets(tokens.clone())),
            answer_tokens: Family::new_with_constructor(SharedBuckets(tokens)),
        }
    }

    /// Observes one successful request's reasoning measures; what it lacks (an answer that
    /// never came) is left out, never observed as 0.
    pub(super) fn observe(&self, labels: &ModeLabels, r: &Reasoning) {
        self.first_reasoning_token
            .get_or_create(labels)
            .observe(r.time_to_first_reasoning_token);
        for (family, value) in [
            (&self.first_answer_token, r.time_to_first_answer_token),
            (&self.reasoning_time, r.reasoning_time),
        ] {
            if let Some(v) = value {
                family.get_or_create(labels).observe(v);
            }
        }
        self.reasoning_tokens
            .get_or_create(labels)
            .observe(r.reasoning_tokens as f64);
        self.answer_tokens
            .get_or_create(labels)
            .observe(r.answer_tokens as f64);
    }

    /// Removes the series of `labels` (a target that left).
    pub(super) fn remove(&self, labels: &ModeLabels) {
        for family in [
            &self.first_reasoning_token,
            &self.first_answer_token,
            &self.reasoning_time,
            &self.reasoning_tokens,
            &self.answer_tokens,
        ] {
            family.remove(labels);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::client::{ChatMessage, Outcome, Prompt, RequestRecord, StreamRequest};
    use crate::export::Metrics;
    use crate::export::testing::{agg, sample};
    use crate::model::{Finished, Phase, RecordContext, Sink, TargetChange};
    use crate::request::GoodputLimits;

    /// A successful steady request of `agg`, its chunks at (ms, reasoning tokens, answer tokens).
    fn request(metrics: &Metrics, chunks: &[(u64, usize, usize)]) {
        let labels = agg("concurrency_sweep").with_concurrency(4);
        let request = StreamRequest {
            request_id: "r".into(),
            prompt: Prompt::Chat(vec![ChatMessage::user("hi")]),
            osl: 4,
        };
        let t0 = Instant::now();
        let mut rec = RequestRecord::new("r", t0, t0);
        for &(ms, reasoning, answer) in chunks {
            rec.push_chunk(t0 + Duration::from_millis(ms), reasoning, answer);
        }
        rec.settle(Outcome::Ok, t0 + Duration::from_millis(900), None);
        let ctx = RecordContext {
            target_index: 0,
            labels: &labels,
            phase: Phase::Steady,
            isl: 0,
            osl: 4,
            shared_prefix_tokens: 0,
            request: &request,
            goodput: GoodputLimits {
                ttft: 2.0,
                itl: 0.1,
            },
        };
        metrics.request(&Finished::new(&ctx, &rec));
    }

    #[test]
    fn a_reasoning_request_is_observed_by_mode_and_removed_with_its_target() {
        let metrics = Metrics::new(&[]);
        // No reasoning: no series.
        request(&metrics, &[(100, 0, 1), (110, 0, 1)]);
        let text = metrics.encode().unwrap();
        assert!(
            !text.contains("llm_canary_reasoning_tokens_count"),
            "{text}"
        );
        request(
            &metrics,
            &[(100, 1, 0), (150, 1, 0), (400, 0, 1), (410, 0, 1)],
        );
        let text = metrics.encode().unwrap();
        let mode = [("target", "agg"), ("workload", "concurrency_sweep")];
        let at = |name: &str| sample(&text, name, &mode);
        assert_eq!(at("llm_canary_reasoning_tokens_sum"), Some(2.0));
        assert_eq!(at("llm_canary_answer_tokens_sum"), Some(2.0));
        assert_eq!(
            at("llm_canary_time_to_first_reasoning_token_seconds_sum"),
            Some(0.1)
        );
        assert_eq!(
            at("llm_canary_time_to_first_answer_token_seconds_sum"),
            Some(0.4)
        );
        assert_eq!(at("llm_canary_reasoning_time_seconds_sum"), Some(0.3));
        // Kept by mode: no step label.
        assert!(
            !text.contains("llm_canary_reasoning_tokens_count{concurrency"),
            "{text}"
        );
        metrics.targets(&TargetChange {
            now: &[],
            added: &[],
            removed: &["agg".to_owned()],
        });
        let text = metrics.encode().unwrap();
        assert!(
            !text.contains("llm_canary_reasoning_tokens_count{"),
            "{text}"
        );
    }
}
