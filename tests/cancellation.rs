//! Cancellation scenarios against the simulator, under paused time: a step whose workload
//! abandons a share of its requests after a few tokens counts them as `cancelled` (never as
//! errors, never in the latency distributions), the same requests are abandoned on every target,
//! and the simulator frees what they held and counts them as Dynamo does.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llm_canary::client::Outcome;
use llm_canary::config::Config;
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{Finished, Sink};
use llm_canary::schedule::plan::CancelPlan;
use llm_canary::schedule::{Recorder, StepKind, StepPlan};
use llm_canary::targets::Deployment;
use tokio_util::sync::CancellationToken;

/// Target, request id (without its target suffix), outcome and output tokens of each request.
#[derive(Default)]
struct Capture(Mutex<Vec<(String, String, &'static str, u64)>>);

impl Sink for Capture {
    fn request(&self, req: &Finished<'_>) {
        let id = req
            .record
            .request_id
            .rsplit_once("-t")
            .map_or("", |(id, _)| id);
        self.0.lock().unwrap().push((
            req.labels.target.clone(),
            id.to_owned(),
            req.record.outcome.as_str(),
            req.record.client_tokens(),
        ));
    }
}

const TWO: &str = r#"
targets:
  - { name: agg, serving_mode: aggregated, model: sim, simulated: { profile: default, max_running: 8 } }
  - { name: disagg, serving_mode: disaggregated, model: sim, simulated: { profile: default, max_running: 8 } }
"#;

fn plan(cancel: Option<CancelPlan>) -> StepPlan {
    StepPlan {
        workload: "concurrency_sweep",
        index: 0,
        kind: StepKind::Sweep {
            concurrency: 4,
            isl: 128,
            osl: 64,
        },
        warmup: Duration::from_secs(1),
        steady: Duration::from_secs(8),
        rate: None,
        cancel,
        request: Default::default(),
    }
}

#[tokio::test(start_paused = true)]
async fn abandoned_requests_are_cancelled_not_errors_and_the_server_frees_them() {
    let cfg = Config::parse(TWO, "cancel.yaml", Path::new(".")).unwrap();
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let capture = Arc::new(Capture::default());
    let recorder = Arc::new(Recorder::new(vec![
        Arc::new(Metrics::new(&[])),
        capture.clone(),
    ]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 1));
    let never = CancellationToken::new();
    let cancel = CancelPlan {
        share: 0.5,
        after_tokens: Some(4),
        after: None,
    };
    let results = runner
        .run_step(&plan(Some(cancel)), 0, &never, &never)
        .await;

    let seen = capture.0.lock().unwrap().clone();
    for target in ["agg", "disagg"] {
        // A sweep step has one label set per target, so one result each.
        let total = results.iter().find(|r| r.labels.target == target).unwrap();
        let m = &total.measurements;
        assert_eq!(m.errors, 0, "{target}: {:?}", m.outcomes);
        assert!(m.cancelled > 0, "{target}: {:?}", m.outcomes);
        assert_eq!(
            m.outcomes.get(&Outcome::Cancelled).copied(),
            Some(m.cancelled)
        );
        assert_eq!(m.outcomes.get(&Outcome::Ok).copied(), Some(m.ok_requests));
        assert_eq!(
            m.requests, m.ok_requests,
            "cancelled ones are not requests answered"
        );
        // About half: a share of 0.5 drawn per request.
        let share = m.cancelled as f64 / (m.cancelled + m.requests) as f64;
        assert!((0.25..=0.75).contains(&share), "{target}: {share}");
        assert_eq!(m.error_ratio, 0.0);
        // The answered requests' latencies are theirs alone: every one of them got its 64 tokens.
        assert!(m.ttft.is_some() && m.output_tokens == 64 * m.ok_requests);

        // Every abandoned request stopped at its point: at least 4 tokens, far fewer than 64.
        let mine: Vec<_> = seen.iter().filter(|s| s.0 == target).collect();
        let cancelled: Vec<_> = mine.iter().filter(|s| s.2 == "cancelled").collect();
        assert!(
            cancelled.iter().all(|s| (4..64).contains(&s.3)),
            "{cancelled:?}"
        );

        // The server noticed each one, warmup included, and holds nothing afterwards. The
        // simulator learns of a closed connection on its next write, so the count may trail the
        // client's by a pass: wait for it (paused time: the wait costs nothing real).
        let sim = &deployment.sims[deployment.sim_of[deployment
            .targets
            .iter()
            .position(|t| t.name == target)
            .unwrap()]
        .unwrap()];
        let mut counted = 0;
        for _ in 0..100 {
            let snaps = sim.cluster().snapshots();
            counted = snaps
                .iter()
                .map(|w| w.engine.cancelled_requests)
                .sum::<u64>();
            let busy: usize = snaps.iter().map(|w| w.running + w.waiting).sum();
            if counted == cancelled.len() as u64 && busy == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(counted, cancelled.len() as u64, "{target}");
        let snaps = sim.cluster().snapshots();
        assert!(
            snaps
                .iter()
                .all(|w| w.running == 0 && w.waiting == 0 && w.kv_active_blocks == 0),
            "{target}: {snaps:?}"
        );
        let text = sim.metrics_text();
        let exported: f64 = text
            .lines()
            .filter(|l| l.starts_with("dynamo_component_cancellation_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        assert_eq!(exported, counted as f64);
    }

    // Paired: the same requests were abandoned on both targets, whatever their speed. Each
    // target ran its own closed loop, so compare the requests both of them sent.
    let ids = |target: &str, outcome: &str| -> std::collections::BTreeSet<String> {
        seen.iter()
            .filter(|s| s.0 == target && s.2 == outcome)
            .map(|s| s.1.clone())
            .collect()
    };
    let both: std::collections::BTreeSet<String> = seen
        .iter()
        .filter(|s| s.0 == "agg")
        .map(|s| s.1.clone())
        .filter(|id| seen.iter().any(|s| s.0 == "disagg" && &s.1 == id))
        .collect();
    assert!(both.len() > 10, "{}", both.len());
    let agg: Vec<_> = ids("agg", "cancelled")
        .intersection(&both)
        .cloned()
        .collect();
    let disagg: Vec<_> = ids("disagg", "cancelled")
        .intersection(&both)
        .cloned()
        .collect();
    assert_eq!(agg, disagg);
    deployment.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_step_without_cancel_abandons_nothing() {
    let cfg = Config::parse(TWO, "cancel.yaml", Path::new(".")).unwrap();
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let recorder = Arc::new(Recorder::new(vec![Arc::new(Metrics::new(&[]))]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 1));
    let never = CancellationToken::new();
    let results = runner.run_step(&plan(None), 0, &never, &never).await;
    assert!(!results.is_empty());
    for r in &results {
        assert_eq!(r.measurements.cancelled, 0);
        assert!(r.measurements.requests > 0);
    }
    for sim in &deployment.sims {
        let counted: u64 = sim
            .cluster()
            .snapshots()
            .iter()
            .map(|w| w.engine.cancelled_requests)
            .sum();
        assert_eq!(counted, 0);
    }
    deployment.stop().await;
}
