//! Steps under paused tokio time against the simulator's `fixed` profile (first token after
//! 100 ms, then one every 10 ms): the warmup is excluded from the step, requests finishing in
//! the drain are kept, and requests still in flight when the drain ends count as `timeout` with
//! their latency — never dropped; the warmup's requests still streaming when the step stops
//! sending are given up, and those of a hung target are the drain's timeouts.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llm_canary::config::Config;
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{Finished, Phase, Sink};
use llm_canary::schedule::{Recorder, StepKind, StepPlan};
use llm_canary::targets::Deployment;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Phase, intended send, end, outcome and latency of one request.
type Seen = (Phase, Instant, Instant, &'static str, Duration);

#[derive(Default)]
struct Capture(Mutex<Vec<Seen>>);

impl Sink for Capture {
    fn request(&self, req: &Finished<'_>) {
        self.0.lock().unwrap().push((
            req.phase,
            req.record.intended,
            req.record.end,
            req.record.outcome.as_str(),
            req.record.latency(),
        ));
    }
}

const CONFIG: &str = r#"
targets:
  - { name: fixed, serving_mode: aggregated, model: sim, simulated: { profile: fixed, fixed_ttft: 100ms, fixed_itl: 10ms } }
"#;

fn plan(warmup: f64, steady: f64) -> StepPlan {
    sweep(2, warmup, steady)
}

fn sweep(concurrency: u32, warmup: f64, steady: f64) -> StepPlan {
    StepPlan {
        workload: "concurrency_sweep",
        index: 0,
        kind: StepKind::Sweep {
            concurrency,
            isl: 64,
            osl: 50,
        },
        warmup: Duration::from_secs_f64(warmup),
        steady: Duration::from_secs_f64(steady),
        rate: None,
        cancel: None,
        request: Default::default(),
    }
}

/// Runs one step with `drain` grace and returns what was recorded and the step's start.
async fn run(drain: Duration) -> (Vec<Seen>, Instant, u64) {
    run_plan(&plan(1.0, 2.9), drain).await
}

async fn run_plan(plan: &StepPlan, drain: Duration) -> (Vec<Seen>, Instant, u64) {
    let mut cfg = Config::parse(CONFIG, "paused.yaml", Path::new(".")).unwrap();
    cfg.schedule.drain_grace = llm_canary::config::At::dflt(llm_canary::config::Dur(drain));
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let capture = Arc::new(Capture::default());
    let recorder = Arc::new(Recorder::new(vec![
        Arc::new(Metrics::new(&[])),
        capture.clone(),
    ]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 1));
    let never = CancellationToken::new();
    let t0 = Instant::now();
    let results = runner.run_step(plan, 0, &never, &never).await;
    deployment.stop().await;
    let requests = results.iter().map(|r| r.measurements.requests).sum();
    let seen = capture.0.lock().unwrap().clone();
    (seen, t0, requests)
}

#[tokio::test(start_paused = true)]
async fn warmup_is_excluded_and_the_drain_keeps_late_requests() {
    let (seen, t0, step_requests) = run(Duration::from_millis(500)).await;
    let warmup_end = t0 + Duration::from_secs(1);
    let send_end = warmup_end + Duration::from_secs_f64(2.9);
    let warm: Vec<_> = seen.iter().filter(|s| s.0 == Phase::Warmup).collect();
    let steady: Vec<_> = seen.iter().filter(|s| s.0 == Phase::Steady).collect();
    assert!(!warm.is_empty() && warm.iter().all(|s| s.1 < warmup_end));
    assert!(steady.iter().all(|s| s.1 >= warmup_end && s.1 < send_end));
    // The step's results hold exactly the steady requests: warmup is excluded.
    assert_eq!(step_requests, steady.len() as u64);
    // Each request takes 590 ms of virtual time: the last of each worker ends after the window
    // but within the 500 ms grace, so everything completes.
    assert!(steady.iter().all(|s| s.3 == "ok"), "{steady:?}");
    assert!(
        steady.iter().any(|s| s.2 > send_end),
        "some requests finished in the drain"
    );
    for s in &steady {
        let ttft_free = s.4.as_secs_f64();
        assert!((ttft_free - 0.590).abs() < 0.005, "latency {ttft_free}");
    }
}

#[tokio::test(start_paused = true)]
async fn closed_loop_workers_start_eight_a_millisecond() {
    // 20 workers, one request each (590 ms, the window 0.5 s, no warmup, so the drain waits for
    // every one): the first 8 send at the step's start, the next 8 a millisecond later, the
    // last 4 another millisecond later, each measured from its own start. Offsets from the
    // first send, so the time the connections took to open before the clock started does not
    // count.
    let (seen, _, _) = run_plan(&sweep(20, 0.0, 0.5), Duration::from_secs(1)).await;
    let first = seen.iter().map(|s| s.1).min().expect("requests");
    let mut offsets: Vec<Duration> = seen.iter().map(|s| s.1 - first).collect();
    offsets.sort();
    let ms = Duration::from_millis;
    let expected: Vec<Duration> = (0..20u64).map(|w| ms(w / 8)).collect();
    assert_eq!(offsets, expected, "{seen:?}");
    for s in &seen {
        assert_eq!(s.3, "ok");
        assert!(
            (s.4.as_secs_f64() - 0.590).abs() < 0.005,
            "latency {:?}",
            s.4
        );
    }
}

#[tokio::test(start_paused = true)]
async fn requests_in_flight_when_the_drain_ends_count_as_timeout() {
    let (seen, t0, step_requests) = run(Duration::from_millis(100)).await;
    let drain_end = t0 + Duration::from_secs_f64(1.0 + 2.9 + 0.1);
    let steady: Vec<_> = seen.iter().filter(|s| s.0 == Phase::Steady).collect();
    assert_eq!(
        step_requests,
        steady.len() as u64,
        "late requests are counted, not dropped"
    );
    let late: Vec<_> = steady.iter().filter(|s| s.3 == "timeout").collect();
    assert_eq!(
        late.len(),
        2,
        "one request per worker was still in flight: {steady:?}"
    );
    for s in late {
        // Cut at the drain deadline; the error latency runs from the intended send to the cut.
        assert_eq!(s.2, drain_end);
        assert_eq!(s.4, drain_end - s.1);
    }
}

/// A step shorter than its requests (a compressed plan): the warmup's requests, still streaming
/// when the step stops sending, are given up then as `cancelled` in the warmup, where no result
/// counts them, instead of holding the step until they end.
#[tokio::test(start_paused = true)]
async fn warmup_requests_still_streaming_do_not_hold_the_step() {
    // 300 tokens: 100 ms + 299 × 10 ms = 3.09 s a request, against a 1.2 s step.
    let mut step = sweep(2, 1.0, 0.2);
    step.kind = StepKind::Sweep {
        concurrency: 2,
        isl: 64,
        osl: 300,
    };
    let (seen, t0, step_requests) = run_plan(&step, Duration::from_secs(10)).await;
    let took = Instant::now() - t0;
    let send_end = t0 + Duration::from_secs_f64(1.2);
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!((s.0, s.3), (Phase::Warmup, "cancelled"), "{seen:?}");
        // Given up at the first token after the step stopped sending (one every 10 ms).
        assert!(
            s.2 >= send_end && s.2 <= send_end + Duration::from_millis(11),
            "{seen:?}"
        );
    }
    assert_eq!(step_requests, 0);
    assert!(took < Duration::from_secs(2), "the step took {took:?}");
}

/// A target that hangs: the warmup's requests never stream, so they are left to the drain,
/// which counts them as the steady window's timeouts (the outage shows in the step).
#[tokio::test(start_paused = true)]
async fn warmup_requests_that_never_stream_are_the_drains_timeouts() {
    let mut cfg = Config::parse(
        r#"
targets:
  - { name: hung, serving_mode: aggregated, model: sim, simulated: { profile: fixed, fixed_ttft: 30s, fixed_itl: 10ms } }
"#,
        "hung.yaml",
        Path::new("."),
    )
    .unwrap();
    cfg.schedule.drain_grace =
        llm_canary::config::At::dflt(llm_canary::config::Dur(Duration::from_millis(500)));
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let capture = Arc::new(Capture::default());
    let recorder = Arc::new(Recorder::new(vec![capture.clone()]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 1));
    let never = CancellationToken::new();
    let t0 = Instant::now();
    let results = runner
        .run_step(&sweep(2, 1.0, 0.2), 0, &never, &never)
        .await;
    deployment.stop().await;
    let drain_end = t0 + Duration::from_secs_f64(1.2 + 0.5);
    let seen = capture.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!(
            (s.0, s.3, s.2),
            (Phase::Steady, "timeout", drain_end),
            "{seen:?}"
        );
    }
    let errors: u64 = results.iter().map(|r| r.measurements.errors).sum();
    assert_eq!(errors, 2);
}

/// A simulated H200 that runs at most 4 sequences at once: about 0.6 s per request of 64 → 100
/// tokens, so about 6.7 requests per second.
const SMALL: &str = r#"
targets:
  - { name: small, serving_mode: aggregated, model: sim, simulated: { profile: default, max_running: 4 } }
"#;

/// Runs one open-loop step of `rps` constant arrivals (at most `max_inflight` in flight) against
/// [`SMALL`] and returns the step's total.
async fn open_loop_step(rps: f64, max_inflight: u32) -> llm_canary::model::StepResult {
    let cfg = Config::parse(SMALL, "saturation.yaml", Path::new(".")).unwrap();
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let recorder = Arc::new(Recorder::new(vec![Arc::new(Metrics::new(&[]))]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 1));
    let never = CancellationToken::new();
    let plan = StepPlan {
        workload: "concurrency_sweep",
        index: 0,
        kind: StepKind::Sweep {
            concurrency: 4,
            isl: 64,
            osl: 100,
        },
        warmup: Duration::from_secs(2),
        steady: Duration::from_secs(12),
        rate: Some(llm_canary::schedule::plan::RatePlan {
            poisson: false,
            rps,
            max_inflight,
            ladder: false,
        }),
        cancel: None,
        request: Default::default(),
    };
    let mut results = runner.run_step(&plan, 0, &never, &never).await;
    deployment.stop().await;
    assert_eq!(results.len(), 1, "one label set, one result");
    results.remove(0)
}

#[tokio::test(start_paused = true)]
async fn a_step_past_the_servers_capacity_is_saturated_and_one_within_it_is_not() {
    // Within capacity: 2 requests per second, each done in ~0.6 s.
    let within = open_loop_step(2.0, 1024).await;
    let m = &within.measurements;
    let a = m.arrivals.expect("an open-loop step counts its arrivals");
    // 2 per second over the 12 s window (the schedule's float instants may put the boundary
    // arrival on either side).
    assert!((23..=25).contains(&a.intended), "{a:?}");
    assert_eq!((a.sent, a.unanswered), (a.intended, 0), "{a:?}");
    assert!(!m.saturated, "{a:?}");
    assert_eq!(within.summary().saturated, Some(false));

    // 20 per second, three times what the server runs: its queue grows through the window, so
    // the wait for the first token does, and the latest arrivals are cut before their first.
    let past = open_loop_step(20.0, 1024).await;
    let m = &past.measurements;
    let a = m.arrivals.unwrap();
    assert!((239..=241).contains(&a.intended), "{a:?}");
    assert_eq!(a.sent, a.intended, "the client sent every arrival: {a:?}");
    assert!(m.saturated, "{a:?}");
    assert!(
        a.queue_growth_seconds.is_some_and(|g| g > 1.0) || a.unanswered > 2,
        "{a:?}"
    );
    assert_eq!(past.summary().saturated, Some(true));

    // The same load capped at 4 in flight queues in the client instead: arrivals left unsent.
    let capped = open_loop_step(20.0, 4).await;
    let m = &capped.measurements;
    let a = m.arrivals.unwrap();
    assert!(a.sent < a.intended / 2, "{a:?}");
    assert!(
        m.saturated && !m.degraded,
        "slot waits are queue time, not the canary's lag"
    );
}

/// When each cycle started.
#[derive(Default)]
struct CycleStarts(Mutex<Vec<Instant>>);

impl Sink for CycleStarts {
    fn request(&self, _req: &Finished<'_>) {}

    fn cycle_started(&self, _steps: &[llm_canary::model::StepInfo]) {
        self.0.lock().unwrap().push(Instant::now());
    }
}

/// A cycle that takes no time (steps a time scale of 1e-300 made 0 ns long, or every step
/// skipped by the budget) is not followed at once by the next: the loop waits out
/// `MIN_CYCLE` from the cycle's start, so it never spins through empty cycles (it ran thousands a
/// second, flooding the log).
#[tokio::test(start_paused = true)]
async fn cycles_that_take_no_time_are_paused_to_the_shortest_cycle() {
    use llm_canary::schedule::scheduler::MIN_CYCLE;
    use llm_canary::schedule::{Scheduler, TargetSet, TargetSource};
    let mut cfg = Config::parse(CONFIG, "paused.yaml", Path::new(".")).unwrap();
    cfg.schedule.drain_grace =
        llm_canary::config::At::dflt(llm_canary::config::Dur(Duration::ZERO));
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let starts = Arc::new(CycleStarts::default());
    let recorder = Arc::new(Recorder::new(vec![
        Arc::new(Metrics::new(&[])),
        starts.clone(),
    ]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 1));
    let source = TargetSource::fixed(TargetSet {
        targets: deployment.targets.clone(),
        scrape: Vec::new(),
    });
    let mut scheduler = Scheduler::new(runner, source, None, Duration::from_secs(15));
    let empty = plan(0.0, 0.0);
    let stop = llm_canary::shutdown::Shutdown::new();
    let summary = scheduler
        .run(|| vec![empty.clone()], Duration::default, Some(5), &stop)
        .await;
    deployment.stop().await;
    assert_eq!(summary.cycles_finished, 5, "{summary:?}");
    let starts = starts.0.lock().unwrap().clone();
    assert_eq!(starts.len(), 5);
    let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|g| *g >= MIN_CYCLE), "{gaps:?}");
}
