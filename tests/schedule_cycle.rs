//! A full cycle of all four workloads against the two embedded simulators (aggregated and
//! disaggregated) at a small time scale: labels, ISL/OSL from usage, multi-turn histories,
//! prefix-cache hit ratios, and identical prompt sequences for both targets.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use llm_canary::client::Prompt;
use llm_canary::config::Config;
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{Finished, Phase, Sink};
use llm_canary::schedule::{Recorder, plan_cycle};
use llm_canary::targets::Deployment;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
struct Seen {
    target: String,
    workload: String,
    labels: [String; 5],
    steady: bool,
    id: String,
    prompt: Prompt,
    osl: u32,
    outcome: &'static str,
    prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

#[derive(Default)]
struct Capture(Mutex<Vec<Seen>>);

impl Sink for Capture {
    fn request(&self, req: &Finished<'_>) {
        let l = req.labels;
        self.0.lock().unwrap().push(Seen {
            target: l.target.clone(),
            workload: l.workload.clone(),
            labels: [
                l.concurrency.clone(),
                l.turn.clone(),
                l.distribution.clone(),
                l.isl_bucket.clone(),
                l.prefix_ratio.clone(),
            ],
            steady: req.phase == Phase::Steady,
            id: req.record.request_id.clone(),
            prompt: req.request.prompt.clone(),
            osl: req.osl,
            outcome: req.record.outcome.as_str(),
            prompt_tokens: req.record.usage.map(|u| u.prompt_tokens),
            cached_tokens: req.record.usage.map(|u| u.cached_tokens),
            completion_tokens: req.record.usage.map(|u| u.completion_tokens),
        });
    }
}

fn config() -> String {
    format!(
        r#"
targets:
  - {{ name: agg, serving_mode: aggregated, simulated: {{ profile: default }} }}
  - {{ name: disagg, serving_mode: disaggregated, simulated: {{ profile: default }} }}
{}"#,
        support::config::four_workloads("[1, 4]", "[uniform, zipf]")
    )
}

/// The request id without its target suffix: the same for both targets' copies of a request.
fn slot(id: &str) -> &str {
    id.rsplit_once("-t").map(|(a, _)| a).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cycle_against_both_simulators() {
    let cfg = Config::parse(&config(), "cycle.yaml", Path::new(".")).unwrap();
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let capture = Arc::new(Capture::default());
    let metrics = Arc::new(Metrics::new(&[]));
    let recorder = Arc::new(Recorder::new(vec![metrics, capture.clone()]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 7));
    let never = CancellationToken::new();
    runner.calibrate(&never, &Default::default()).await;
    let mut results = Vec::new();
    for step in plan_cycle(&cfg) {
        results.extend(runner.run_step(&step, 0, &never, &never).await);
    }
    deployment.stop().await;
    let seen = capture.0.lock().unwrap().clone();

    // Every workload ran against both targets, with its step labels and nothing but them.
    for workload in [
        "concurrency_sweep",
        "multi_turn",
        "sequence_distribution",
        "prefix_cache",
    ] {
        for target in ["agg", "disagg"] {
            let n = seen
                .iter()
                .filter(|s| s.workload == workload && s.target == target && s.steady)
                .count();
            assert!(n >= 4, "{workload} on {target}: only {n} steady requests");
        }
    }
    for s in &seen {
        assert_eq!(s.outcome, "ok", "{s:?}");
        let [c, turn, dist, bucket, ratio] = &s.labels;
        let set: Vec<bool> = [c, turn, dist, bucket, ratio]
            .iter()
            .map(|v| !v.is_empty())
            .collect();
        let want = match s.workload.as_str() {
            "concurrency_sweep" => [true, false, false, false, false],
            "multi_turn" => [false, true, false, false, false],
            "sequence_distribution" => [false, false, true, true, false],
            _ => [false, false, false, false, true],
        };
        assert_eq!(set, want, "labels of {s:?}");
        // OSL exact from usage.
        assert_eq!(s.completion_tokens, Some(u64::from(s.osl)), "{s:?}");
    }

    // ISL exact from usage once the template overhead is learnt (steady window).
    for s in seen.iter().filter(|s| s.steady) {
        let isl = s.prompt_tokens.unwrap();
        match s.workload.as_str() {
            "concurrency_sweep" => assert_eq!(isl, 256, "{}", s.id),
            "prefix_cache" => assert_eq!(isl, 2048, "{}", s.id),
            "sequence_distribution" => {
                assert!((128..=1024).contains(&isl), "{} isl {isl}", s.id);
                let bucket: u64 = s.labels[3].parse().unwrap();
                assert!(
                    bucket <= isl && isl < 2 * bucket + 8,
                    "{} isl {isl} in bucket {bucket}",
                    s.id
                );
            }
            _ => {}
        }
    }

    // Multi-turn: turn k carries the k − 1 earlier exchanges (user + the assistant's reply).
    for s in seen.iter().filter(|s| s.workload == "multi_turn") {
        let turn: usize = s.labels[1].parse().unwrap();
        let Prompt::Chat(messages) = &s.prompt else {
            panic!("chat expected")
        };
        assert_eq!(messages.len(), 2 * turn - 1, "{}", s.id);
        for (i, m) in messages.iter().enumerate() {
            assert!(!m.content.is_empty(), "{} message {i} empty", s.id);
        }
    }

    // Prefix cache: observed hit ratio within ±5 points of the target after warmup, per target.
    for target in ["agg", "disagg"] {
        for ratio in ["0", "0.5", "1"] {
            let (cached, prompt) = seen
                .iter()
                .filter(|s| {
                    s.target == target
                        && s.workload == "prefix_cache"
                        && s.labels[4] == ratio
                        && s.steady
                })
                .fold((0, 0), |(c, p), s| {
                    (c + s.cached_tokens.unwrap(), p + s.prompt_tokens.unwrap())
                });
            let observed = cached as f64 / prompt as f64;
            let want: f64 = ratio.parse().unwrap();
            assert!(
                (observed - want).abs() <= 0.05,
                "{target} ratio {ratio}: observed {observed:.3}"
            );
        }
    }

    // Both targets received identical prompt sequences (user messages for multi-turn, whose
    // assistant turns are each target's own replies).
    let mut by_slot: BTreeMap<&str, Vec<&Seen>> = BTreeMap::new();
    for s in &seen {
        by_slot.entry(slot(&s.id)).or_default().push(s);
    }
    let user_text = |p: &Prompt| match p {
        Prompt::Chat(m) => m
            .iter()
            .step_by(2)
            .map(|m| m.content.clone())
            .collect::<Vec<_>>(),
        Prompt::Text(t) => vec![t.clone()],
    };
    let mut paired = 0;
    for (id, copies) in &by_slot {
        if copies.len() == 2 {
            assert_ne!(copies[0].target, copies[1].target);
            assert_eq!(
                user_text(&copies[0].prompt),
                user_text(&copies[1].prompt),
                "{id}"
            );
            assert_eq!(copies[0].osl, copies[1].osl, "{id}");
            paired += 1;
        }
    }
    assert!(
        paired * 10 >= by_slot.len() * 7,
        "only {paired} of {} request slots went to both targets",
        by_slot.len()
    );

    // Step results for both targets of every step.
    for step in plan_cycle(&cfg) {
        for target in ["agg", "disagg"] {
            assert!(
                results.iter().any(|r| r.step == step.name()
                    && r.labels.target == target
                    && r.measurements.requests > 0),
                "no result for {} on {target}",
                step.name()
            );
        }
    }
    let conv = results
        .iter()
        .find(|r| r.labels.workload == "multi_turn" && r.total)
        .unwrap();
    assert!(
        conv.measurements.conversation.is_some(),
        "whole-conversation time recorded"
    );
}
