//! Pointing the canary at production safely, under paused tokio time against simulators of
//! fixed timing: quiet hours and an operator's pause send nothing and leave verdicts as they
//! were; a budget below the plan's demand holds in-flight streams, requests per second and output
//! tokens per hour, and says what it cut; a spent hour pauses the steps while the probe stream
//! goes on within its own allowance; every request carries the traffic marker (as the
//! simulator's request log shows it) and names the canary in its `User-Agent`.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{BudgetReport, Finished, Sink};
use llm_canary::schedule::gate::{Gate, Switch, TokioClock};
use llm_canary::schedule::{ProbeStream, Recorder, Scheduler, TargetSet, TargetSource, plan_cycle};
use llm_canary::setup::Setup;
use llm_canary::shutdown::Shutdown;
use llm_canary::slo::baseline::BaselineStore;
use llm_canary::slo::{SloEngine, SloReading, SloState, StateChangeHook};
use llm_canary::targets::Deployment;
use tokio::time::Instant;

mod support;

/// One request as the test reads it.
#[derive(Debug, Clone)]
struct Send {
    target: String,
    /// A probe of the probe stream, not a step's request.
    probe: bool,
    sent: Instant,
    end: Instant,
    tokens: u64,
}

/// When each request was sent and ended, and its output tokens.
#[derive(Default)]
struct Sends(Mutex<Vec<Send>>);

impl Sink for Sends {
    fn request(&self, req: &Finished<'_>) {
        self.0.lock().unwrap().push(Send {
            target: req.labels.target.clone(),
            probe: req.labels.workload == "probe",
            sent: req.record.sent,
            end: req.record.end,
            tokens: req.record.output_tokens(),
        });
    }
}

impl Sends {
    fn all(&self) -> Vec<Send> {
        let mut v = self.0.lock().unwrap().clone();
        v.sort_by_key(|s| s.sent);
        v
    }
}

/// The most requests in flight at once.
fn peak_in_flight(sends: &[Send]) -> usize {
    let mut edges: Vec<(Instant, i32)> = sends
        .iter()
        .flat_map(|s| [(s.sent, 1), (s.end, -1)])
        .collect();
    // An end and a start at the same instant: the end first.
    edges.sort();
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        peak = peak.max(now);
    }
    peak as usize
}

/// The most sends in any window of `span`.
fn most_in(sends: &[&Send], span: Duration) -> usize {
    let times: Vec<Instant> = sends.iter().map(|s| s.sent).collect();
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= span {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

/// Every budget report, in order.
#[derive(Default)]
struct Reports(Mutex<Vec<BudgetReport>>);

impl Sink for Reports {
    fn request(&self, _: &Finished<'_>) {}
    fn budget(&self, report: &BudgetReport) {
        self.0.lock().unwrap().push(report.clone());
    }
}

#[derive(Default)]
struct Changes(Mutex<Vec<(String, SloState, SloState)>>);

impl StateChangeHook for Changes {
    fn on_state_change(&self, slo: &str, old: SloState, new: SloState, _: &SloReading) {
        self.0.lock().unwrap().push((slo.to_owned(), old, new));
    }
}

/// A deployment and a scheduler over it, with every sink a test reads.
struct Rig {
    setup: Setup,
    deployment: Deployment,
    metrics: Arc<Metrics>,
    slo: Arc<SloEngine>,
    sends: Arc<Sends>,
    reports: Arc<Reports>,
    changes: Arc<Changes>,
}

impl Rig {
    async fn new(config: &str) -> Rig {
        let setup = Setup::parse(config, "traffic.yaml", Path::new(".")).unwrap();
        let deployment = Deployment::start(&setup.config, Path::new("."))
            .await
            .unwrap();
        let metrics = Arc::new(Metrics::new(&setup.latency_thresholds()));
        let slo = Arc::new(SloEngine::new(
            setup.slos.clone(),
            setup.domain.clone(),
            BaselineStore::in_memory(),
            Some(metrics.clone()),
        ));
        let changes = Arc::new(Changes::default());
        slo.add_hook(changes.clone());
        Rig {
            setup,
            deployment,
            metrics,
            slo,
            sends: Arc::new(Sends::default()),
            reports: Arc::new(Reports::default()),
            changes,
        }
    }

    fn scheduler(&self, gate: Arc<Gate>) -> Scheduler {
        self.scheduler_and_probes(gate).0
    }

    /// The scheduler, and the probe stream beside it on the same budget and sinks, as the
    /// daemon runs them.
    fn scheduler_and_probes(&self, gate: Arc<Gate>) -> (Scheduler, ProbeStream) {
        let recorder = Arc::new(Recorder::new(vec![
            self.metrics.clone(),
            self.slo.clone(),
            self.sends.clone(),
            self.reports.clone(),
        ]));
        let runner = Arc::new(self.deployment.runner(&self.setup.config, recorder, 1));
        let probes = ProbeStream {
            client: runner.client.clone(),
            budget: Arc::clone(&runner.budget),
            recorder: Arc::clone(&runner.recorder),
            tokens: Arc::clone(&runner.tokens),
            gate: Arc::clone(&gate),
            config: self.setup.config.probe_stream.clone(),
            goodput: runner.goodput,
            run_salt: 1,
        };
        let source = TargetSource::fixed(TargetSet {
            targets: self.deployment.targets.clone(),
            scrape: Vec::new(),
        });
        let scheduler =
            Scheduler::new(runner, source, None, Duration::from_secs(15)).with_gate(gate);
        (scheduler, probes)
    }

    fn paused(&self, reason: &str) -> Option<f64> {
        support::metrics::sample(
            &self.metrics.encode().unwrap(),
            "llm_canary_paused",
            &[("reason", reason)],
        )
    }
}

/// One target whose TTFT is 100 ms and ITL 10 ms whatever the load: a request of 8 tokens takes
/// 170 ms, so concurrency 2 sends about 12 requests a second.
const QUIET_HOURS: &str = r#"
targets:
  - { name: agg, serving_mode: aggregated, model: sim, simulated: { profile: fixed, fixed_ttft: 100ms, fixed_itl: 10ms } }
workloads:
  concurrency_sweep: { levels: [2], isl: 64, osl: 8, step: 60s, warmup: 5s }
schedule:
  drain_grace: 5s
  active:
    time_zone: UTC
    windows: [{ from: "12:00", to: "12:10" }]
slos:
  # One 60 s step holds about 700 samples: the verdict needs two steps inside its 3 m window,
  # so without the pause stopping the SLO clock it would drop to insufficient_data.
  - { name: ttft, expr: 'p50(ttft) < 1s', window: 3m, min_samples: 1000 }
"#;

fn at(hms: &str) -> Timestamp {
    format!("2026-12-02T{hms}Z").parse().unwrap()
}

#[tokio::test(start_paused = true)]
async fn quiet_hours_and_a_pause_send_nothing_and_hold_the_verdicts() {
    let rig = Rig::new(QUIET_HOURS).await;
    let clock = TokioClock::starting_at(at("11:59:00"));
    let t0 = Instant::now();
    let instant =
        |hms: &str| t0 + Duration::try_from(at(hms).duration_since(at("11:59:00"))).unwrap();
    let gate = Arc::new(Gate::new(Arc::new(clock)));
    gate.set_windows(
        rig.setup
            .config
            .schedule
            .active
            .as_ref()
            .map(|a| a.compile().unwrap()),
    );
    let mut scheduler = rig.scheduler(Arc::clone(&gate));
    let stop = Shutdown::new();
    let plan = plan_cycle(&rig.setup.config);
    let run = scheduler.run(|| plan.clone(), Duration::default, None, &stop);

    let script = async {
        // Before the window: nothing sent, and the gauge says why.
        tokio::time::sleep_until(instant("11:59:30")).await;
        assert!(rig.sends.all().is_empty());
        assert_eq!(rig.paused("schedule"), Some(1.0));
        assert_eq!(rig.paused("operator"), Some(0.0));

        // Inside it: two steps, and a verdict.
        tokio::time::sleep_until(instant("12:03:00")).await;
        assert_eq!(rig.paused("schedule"), Some(0.0));
        let first = rig.sends.all()[0].sent;
        assert!(
            first >= instant("12:00:00"),
            "sent before the window opened"
        );
        rig.slo.evaluate_now();
        assert_eq!(
            rig.slo.state("ttft"),
            Some(SloState::Pass),
            "{}",
            rig.slo.status_json()
        );

        // An operator's pause: sending stops at once, in-flight requests end within the drain.
        gate.set(Switch::Http, Some("release 1.4".into()));
        let paused_at = Instant::now();
        tokio::time::sleep_until(instant("12:05:00")).await;
        assert_eq!(rig.paused("operator"), Some(1.0));
        let sends = rig.sends.all();
        assert!(
            sends.iter().all(|s| s.sent <= paused_at),
            "a request sent while paused"
        );
        assert!(
            sends
                .iter()
                .all(|s| s.end <= paused_at + Duration::from_secs(5))
        );
        rig.slo.evaluate_now();
        assert_eq!(
            rig.slo.state("ttft"),
            Some(SloState::Pass),
            "the pause moved the verdict"
        );

        // Resumed: traffic again, until the window closes at 12:10; nothing after it.
        gate.set(Switch::Http, None);
        tokio::time::sleep_until(instant("12:30:00")).await;
        assert_eq!(rig.paused("schedule"), Some(1.0));
        assert_eq!(rig.paused("operator"), Some(0.0));
        let sends = rig.sends.all();
        assert!(
            sends.iter().any(|s| s.sent > instant("12:05:00")),
            "no traffic after the resume"
        );
        for s in &sends {
            assert!(
                s.sent < instant("12:10:00") && s.end <= instant("12:10:00"),
                "a request outside the window: {s:?}"
            );
        }
        rig.slo.evaluate_now();
        assert_eq!(
            rig.slo.state("ttft"),
            Some(SloState::Pass),
            "quiet hours moved the verdict"
        );
        stop.drain(Duration::from_secs(1));
    };
    let (summary, ()) = tokio::join!(run, script);
    assert!(summary.steps_finished >= 4, "{summary:?}");
    let changes = rig.changes.0.lock().unwrap().clone();
    assert_eq!(
        changes,
        vec![(
            "ttft".to_owned(),
            SloState::InsufficientData,
            SloState::Pass
        )],
        "the verdict changed after its first pass"
    );
    rig.deployment.stop().await;
}

/// Two targets whose plan wants 2, 4 and 8 streams each, against a budget of 6 streams in all,
/// and for `a` 5 requests/s and 6,000 output tokens an hour (a request is 8 tokens).
const OVER_BUDGET: &str = r#"
targets:
  - name: a
    serving_mode: aggregated
    model: sim
    simulated: { profile: fixed, fixed_ttft: 100ms, fixed_itl: 10ms }
    budget: { max_rps: 5, max_output_tokens_per_hour: 6000 }
  - { name: b, serving_mode: disaggregated, model: sim, simulated: { profile: fixed, fixed_ttft: 100ms, fixed_itl: 10ms } }
budget: { max_inflight: 6 }
workloads:
  concurrency_sweep: { levels: [2, 4, 8], isl: 64, osl: 8, step: 60s, warmup: 5s }
schedule: { drain_grace: 2s }
"#;

#[tokio::test(start_paused = true)]
async fn a_budget_below_the_plan_holds_streams_rate_and_tokens_and_says_what_it_cut() {
    let rig = Rig::new(OVER_BUDGET).await;
    let mut scheduler = rig.scheduler(Arc::new(Gate::new(Arc::new(TokioClock::starting_at(at(
        "12:00:00",
    ))))));
    let stop = Shutdown::new();
    let plan = plan_cycle(&rig.setup.config);
    let summary = scheduler
        .run(|| plan.clone(), Duration::default, Some(2), &stop)
        .await;
    assert_eq!(summary.cycles_finished, 2, "{summary:?}");
    let sends = rig.sends.all();
    let of = |t: &str| sends.iter().filter(|s| s.target == t).collect::<Vec<_>>();

    // Streams: never more than 6 at once over both targets (the plan wanted up to 16).
    assert!(
        peak_in_flight(&sends) <= 6,
        "{} in flight",
        peak_in_flight(&sends)
    );
    // Rate: `a` at most 5 sends in any second (closed-loop at 2 streams it would send ~12);
    // `b` has no rate limit and goes faster.
    assert!(most_in(&of("a"), Duration::from_secs(1)) <= 5);
    assert!(most_in(&of("b"), Duration::from_secs(1)) > 5);
    // Tokens: the whole run is under an hour, so everything `a` received counts.
    let a_tokens: u64 = of("a").iter().map(|s| s.tokens).sum();
    assert!(a_tokens <= 6000, "{a_tokens} tokens");
    assert!(a_tokens > 5000, "the budget was not used: {a_tokens}");

    // Every shortfall was reported.
    let actions: Vec<(String, String, String)> = rig
        .reports
        .0
        .lock()
        .unwrap()
        .iter()
        .flat_map(|r| r.actions.iter())
        .map(|a| (a.target.clone(), a.action.to_owned(), a.detail.clone()))
        .collect();
    let has = |target: &str, action: &str, detail: &str| {
        actions
            .iter()
            .any(|(t, a, d)| t == target && a == action && d.contains(detail))
    };
    for t in ["a", "b"] {
        assert!(has(t, "skipped", "needs 8 streams"), "{actions:?}");
    }
    assert!(
        has("b", "serialized", "exceed the global budget max_inflight 6"),
        "{actions:?}"
    );
    assert!(has("a", "cut", "output tokens"), "{actions:?}");
    assert!(
        has("a", "skipped", "output tokens of the last hour spent"),
        "{actions:?}"
    );
    let text = rig.metrics.encode().unwrap();
    let metric = |name: &str, labels: &[(&str, &str)]| {
        support::metrics::sample(&text, name, labels).unwrap_or(0.0)
    };
    assert!(
        metric(
            "llm_canary_budget_steps_total",
            &[("target", "a"), ("action", "cut")]
        ) >= 1.0
    );
    assert!(
        metric(
            "llm_canary_budget_throttled_requests_total",
            &[("scope", "a")]
        ) > 0.0
    );
    assert_eq!(
        metric(
            "llm_canary_budget_output_tokens_last_hour",
            &[("scope", "a")]
        ),
        a_tokens as f64
    );
    assert_eq!(
        metric(
            "llm_canary_budget_limit",
            &[("scope", "all"), ("limit", "max_inflight")]
        ),
        6.0
    );
    rig.deployment.stop().await;
}

/// One target whose hour holds fewer tokens than a step wants.
const SPENT: &str = r#"
targets:
  - { name: a, serving_mode: aggregated, model: sim, simulated: { profile: fixed, fixed_ttft: 100ms, fixed_itl: 10ms } }
budget: { max_output_tokens_per_hour: 800 }
workloads:
  concurrency_sweep: { levels: [2], isl: 64, osl: 8, step: 60s, warmup: 5s }
schedule: { drain_grace: 2s }
"#;

#[tokio::test(start_paused = true)]
async fn a_spent_hour_pauses_the_schedule_until_its_tokens_age_out() {
    let rig = Rig::new(SPENT).await;
    let mut scheduler = rig.scheduler(Arc::new(Gate::new(Arc::new(TokioClock::starting_at(at(
        "12:00:00",
    ))))));
    let stop = Shutdown::new();
    let plan = plan_cycle(&rig.setup.config);
    let t0 = Instant::now();
    let run = scheduler.run(|| plan.clone(), Duration::default, Some(2), &stop);
    let script = async {
        tokio::time::sleep(Duration::from_secs(30 * 60)).await;
        assert_eq!(rig.paused("budget"), Some(1.0));
        let sends = rig.sends.all();
        let tokens: u64 = sends.iter().map(|s| s.tokens).sum();
        assert_eq!(tokens, 800, "the first step spends the hour exactly");
        assert!(sends.iter().all(|s| s.sent < t0 + Duration::from_secs(65)));
    };
    let (summary, ()) = tokio::join!(run, script);
    assert_eq!(summary.cycles_finished, 2);
    // The second cycle ran once the first hour's tokens aged out.
    let sends = rig.sends.all();
    let late = sends
        .iter()
        .filter(|s| s.sent >= t0 + Duration::from_secs(3600))
        .count();
    assert!(late > 0, "nothing sent after the hour");
    assert_eq!(rig.paused("budget"), Some(0.0));
    rig.deployment.stop().await;
}

/// [`SPENT`] with the probe stream (a probe every 20 s of one output token: 180 tokens of each
/// hour are its own) and an availability SLO over it.
const SPENT_WITH_PROBES: &str = r#"
targets:
  - { name: a, serving_mode: aggregated, model: sim, simulated: { profile: fixed, fixed_ttft: 100ms, fixed_itl: 10ms } }
budget: { max_output_tokens_per_hour: 800 }
workloads:
  concurrency_sweep: { levels: [2], isl: 64, osl: 8, step: 60s, warmup: 5s }
schedule: { drain_grace: 2s }
slos:
  - { name: availability, objective: 90.0, sli: 'ttft{workload="probe"} < 2s', window: 1h, min_samples: 60 }
"#;

#[tokio::test(start_paused = true)]
async fn a_spent_hour_pauses_the_steps_but_not_the_probe_stream() {
    let rig = Rig::new(SPENT_WITH_PROBES).await;
    let gate = Arc::new(Gate::new(Arc::new(TokioClock::starting_at(at("12:00:00")))));
    let (mut scheduler, probes) = rig.scheduler_and_probes(gate);
    let stop = Shutdown::new();
    let (_targets, probed) = tokio::sync::watch::channel(rig.deployment.targets.clone());
    let probing = tokio::spawn(probes.run(probed, stop.stop_sending().clone()));
    let evaluations = tokio::spawn(llm_canary::slo::engine::run_evaluations(
        Arc::clone(&rig.slo),
        stop.service(),
    ));
    let plan = plan_cycle(&rig.setup.config);
    let t0 = Instant::now();
    let run = scheduler.run(|| plan.clone(), Duration::default, None, &stop);
    let script = async {
        tokio::time::sleep(Duration::from_secs(30 * 60)).await;
        // The steps spent their share of the hour in the first step, and wait.
        assert_eq!(rig.paused("budget"), Some(1.0));
        let sends = rig.sends.all();
        let (probes, steps): (Vec<&Send>, Vec<&Send>) = sends.iter().partition(|s| s.probe);
        let step_tokens: u64 = steps.iter().map(|s| s.tokens).sum();
        assert!(
            (600..=620).contains(&step_tokens),
            "the steps' share is 800 - 180: {step_tokens}"
        );
        assert!(steps.iter().all(|s| s.sent < t0 + Duration::from_secs(65)));
        // The probes went on all along, the pause included, and were counted.
        let paused_probes = probes
            .iter()
            .filter(|p| p.sent > t0 + Duration::from_secs(70))
            .count();
        assert!(paused_probes >= 80, "{paused_probes} probes while paused");
        assert!(probes.iter().all(|p| p.tokens == 1));
        let counted = support::metrics::sum(
            &rig.metrics.encode().unwrap(),
            "llm_canary_requests_total",
            &[("workload", "probe"), ("outcome", "ok")],
        );
        assert_eq!(counted, probes.len() as f64);
        assert_eq!(
            rig.slo.state("availability"),
            Some(SloState::Pass),
            "{}",
            rig.slo.status_json()
        );
        stop.drain(Duration::from_secs(1));
    };
    let (summary, ()) = tokio::join!(run, script);
    assert!(summary.interrupted, "{summary:?}");
    assert!(stop.finish(Duration::from_secs(5)).await);
    probing.await.unwrap();
    evaluations.await.unwrap();
    rig.deployment.stop().await;
}

/// Runs one short step against a simulator that logs every request, with `client` as the
/// config's `client:` section; returns the log's lines and how many requests the step recorded.
async fn logged_requests(client: &str) -> (Vec<serde_json::Value>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let config = format!(
        r#"
targets:
  - {{ name: a, serving_mode: aggregated, simulated: {{ profile: fixed, fixed_ttft: 100ms, fixed_itl: 10ms, request_log: "{}" }} }}
client: {client}
workloads:
  multi_turn: {{ turns: 2, conversations: 2, isl: 32, osl: 4, duration: 10s }}
"#,
        log.display()
    );
    let rig = Rig::new(&config).await;
    let mut scheduler = rig.scheduler(Arc::new(Gate::new(Arc::new(TokioClock::starting_at(at(
        "12:00:00",
    ))))));
    let plan = plan_cycle(&rig.setup.config);
    scheduler
        .run(
            || plan.clone(),
            Duration::default,
            Some(1),
            &Shutdown::new(),
        )
        .await;
    rig.deployment.stop().await;
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    (lines, rig.sends.all().len())
}

#[tokio::test(start_paused = true)]
async fn every_request_carries_the_traffic_marker() {
    let (lines, recorded) = logged_requests("{}").await;
    // Every request the step recorded, plus the calibration probes, reached the log.
    assert!(
        recorded > 4 && lines.len() >= recorded,
        "{} lines, {recorded} recorded",
        lines.len()
    );
    for line in &lines {
        assert_eq!(line["headers"]["x-canary"], "llm-canary", "{line}");
        assert_eq!(line["user"], "llm-canary", "{line}");
        assert_eq!(
            line["headers"]["user-agent"],
            llm_canary::client::USER_AGENT,
            "{line}"
        );
    }
    // Configured otherwise: another header, and no `user` at all.
    let (lines, _) =
        logged_requests(r#"{ marker_header: "X-Traffic-Source: synthetic", user: "" }"#).await;
    assert!(!lines.is_empty());
    for line in &lines {
        assert_eq!(line["headers"]["x-traffic-source"], "synthetic", "{line}");
        assert!(line["headers"].get("x-canary").is_none(), "{line}");
        assert!(line["user"].is_null(), "{line}");
    }
}

/// `llm-canary check --probe` on a config of `targets`: its exit code and output.
fn probe(targets: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe.yaml");
    std::fs::write(
        &path,
        format!(
            "targets:\n{targets}\nworkloads:\n  concurrency_sweep: {{ levels: [1], isl: 64, osl: 8, step: 20s, warmup: 2s }}\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llm-canary"))
        .args(["check", "--probe", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn check_probe_tells_a_working_a_rejecting_and_a_stopped_target_apart() {
    let (code, out) =
        probe("  - { name: sim, serving_mode: aggregated, simulated: { profile: fast } }");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("probe sim (http://127.0.0.1:"), "{out}");
    for check in [
        "reachable",
        "model",
        "dialect",
        "streaming",
        "usage",
        "nvext_timing",
    ] {
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(&format!("ok   {check}"))),
            "{check}: {out}"
        );
    }

    let (code, out) = probe(
        "  - { name: strict, serving_mode: aggregated, simulated: { profile: fast, reject_unknown_fields: true } }",
    );
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("probe strict") && out.contains(": rejected"),
        "{out}"
    );
    let dialect = out
        .lines()
        .find(|l| l.contains("FAIL dialect"))
        .expect(&out);
    assert!(
        dialect.contains("length_control") && dialect.contains("`dialect`"),
        "{dialect}"
    );

    let port = support::free_port();
    let (code, out) = probe(&format!(
        "  - {{ name: gone, serving_mode: aggregated, url: \"http://127.0.0.1:{port}\" }}"
    ));
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("probe gone") && out.contains(": unreachable"),
        "{out}"
    );
    assert!(out.contains("FAIL reachable"), "{out}");
}

/// Every request the canary sends to a target names it, `User-Agent: llm-canary/<version>`: the
/// measured completion (the canary's own transport), the model lookup and the scrape of the
/// server's metrics (reqwest), as a server that records every request head sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_to_a_target_names_the_canary_as_its_user_agent() {
    let (addr, heads) = support::raw_server(|head| {
        let reply = |content_type: &str, body: &str| {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        };
        support::RawReply::Bytes(if head.starts_with("GET /v1/models") {
            reply("application/json", r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#)
        } else if head.starts_with("GET /metrics") {
            reply("text/plain", "vllm:num_requests_running 0\n")
        } else {
            support::sse_ok("m", 4)
        })
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.yaml");
    std::fs::write(
        &path,
        format!(
            r#"targets:
  - {{ name: recorded, serving_mode: aggregated, url: "http://{addr}", model: auto, dialect: openai, server_metrics: ["http://{addr}/metrics"] }}
workloads:
  concurrency_sweep: {{ levels: [1], isl: 64, osl: 8, step: 20s, warmup: 2s }}
"#
        ),
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_llm-canary"))
            .args(["check", "--probe", "--config"])
            .arg(&path)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let heads = heads.lock().unwrap().clone();
    for request in [
        "GET /v1/models",
        "POST /v1/chat/completions",
        "GET /metrics",
    ] {
        assert!(
            heads.iter().any(|h| h.starts_with(request)),
            "no {request} among {heads:#?}"
        );
    }
    let agent = format!("user-agent: llm-canary/{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        agent.split_once(": ").unwrap().1,
        llm_canary::client::USER_AGENT
    );
    for head in &heads {
        let named = head
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("user-agent:"))
            .map(str::to_ascii_lowercase)
            .collect::<Vec<_>>();
        assert_eq!(named, std::slice::from_ref(&agent), "{head}");
    }
}
