//! The request options a config adds (`request:` of a target and of a workload) reach the server
//! as docs/DESIGN.md says: body fields merged deeply into the canary's body (the workload's over
//! the target's, `nvext` added to the canary's own), headers added (the workload's replacing the
//! target's of the same name), a workload's `api` sending to `/v1/completions` beside a chat
//! target; the canary's own fields stay its own. Header values are secrets: one a server echoes
//! in an error body is masked in the failed request's record.

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};

use llm_canary::client::Outcome;
use llm_canary::config::Config;
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{Finished, Sink};
use llm_canary::schedule::{Recorder, plan_cycle};
use llm_canary::targets::Deployment;
use serde_json::{Value, json};
use support::RawReply;
use tokio_util::sync::CancellationToken;

/// Workload, outcome and error text of every finished request.
#[derive(Default)]
struct Capture(Mutex<Vec<(String, Outcome, Option<String>)>>);

impl Sink for Capture {
    fn request(&self, req: &Finished<'_>) {
        self.0.lock().unwrap().push((
            req.labels.workload.clone(),
            req.record.outcome,
            req.record.error.clone(),
        ));
    }
}

/// Runs every step of `config`'s cycle once; returns what the sinks were handed.
async fn run_cycle(config: &str) -> Vec<(String, Outcome, Option<String>)> {
    let cfg = Config::parse(config, "request-options.yaml", Path::new(".")).unwrap();
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let capture = Arc::new(Capture::default());
    let recorder = Arc::new(Recorder::new(vec![
        Arc::new(Metrics::new(&[])),
        capture.clone(),
    ]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 3));
    let never = CancellationToken::new();
    for step in plan_cycle(&cfg) {
        runner.run_step(&step, 0, &never, &never).await;
    }
    deployment.stop().await;
    std::mem::take(&mut *capture.0.lock().unwrap())
}

#[tokio::test(start_paused = true)]
async fn target_and_workload_options_reach_the_server_merged() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let config = format!(
        r#"
targets:
  - name: agg
    serving_mode: aggregated
    simulated: {{ profile: fixed, fixed_ttft: 100ms, fixed_itl: 10ms, request_log: "{}" }}
    request:
      extra_body:
        temperature: 0.5
        seed: 7
        chat_template_kwargs: {{ enable_thinking: false, style: long }}
        nvext: {{ backend_instance_id: 1 }}
      headers:
        X-Tenant: team-a
        X-Route: target-route
workloads:
  concurrency_sweep:
    levels: [1]
    isl: 32
    osl: 4
    step: 2s
    warmup: 0s
    request:
      api: completions
      extra_body:
        temperature: 0
        chat_template_kwargs: {{ enable_thinking: true }}
      headers:
        x-route: workload-route
  multi_turn: {{ turns: 1, conversations: 1, isl: 32, osl: 4, duration: 2s }}
"#,
        log.display()
    );
    let seen = run_cycle(&config).await;
    assert!(
        seen.iter().all(|(_, outcome, _)| *outcome == Outcome::Ok),
        "{seen:?}"
    );
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |endpoint: &str| -> Vec<&Value> {
        lines.iter().filter(|l| l["endpoint"] == endpoint).collect()
    };
    let (completions, chat) = (of("completions"), of("chat_completions"));
    assert!(
        !completions.is_empty() && !chat.is_empty(),
        "{} completions, {} chat requests",
        completions.len(),
        chat.len()
    );
    // The sweep: the workload's fields over the target's, deeply; the canary's own kept.
    for line in completions {
        let body = &line["body"];
        assert_eq!(body["temperature"], 0, "{line}");
        assert_eq!(body["seed"], 7, "{line}");
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": true, "style": "long"}),
            "{line}"
        );
        assert_eq!(
            body["nvext"],
            json!({"extra_fields": ["timing", "worker_id"], "backend_instance_id": 1}),
            "{line}"
        );
        assert_eq!(body["max_tokens"], 4, "{line}");
        assert_eq!(body["stream"], true, "{line}");
        assert_eq!(body["user"], "llm-canary", "{line}");
        let headers = &line["headers"];
        assert_eq!(headers["x-tenant"], "team-a", "{line}");
        assert_eq!(headers["x-route"], "workload-route", "{line}");
        assert_eq!(headers["x-canary"], "llm-canary", "{line}");
    }
    // Multi-turn has no `request:`: the target's options alone, on the target's chat API.
    for line in chat {
        let body = &line["body"];
        assert_eq!(body["temperature"], 0.5, "{line}");
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": false, "style": "long"}),
            "{line}"
        );
        assert_eq!(line["headers"]["x-route"], "target-route", "{line}");
        assert_eq!(line["headers"]["x-tenant"], "team-a", "{line}");
    }
}

const GATEWAY_KEY: &str = "gw-key-7f3a9c1e-secret";
const TENANT_KEY: &str = "tenant/key\"42-secret";

/// The value of header `name` in a request head ("" without one).
fn header_of(head: &str, name: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
        .unwrap_or_default()
}

/// A gateway that refuses every request, repeating the keys it was sent in its error body.
fn echo_keys_403(head: &str) -> RawReply {
    let body = json!({
        "error": {"message": "gateway key not accepted", "type": "forbidden"},
        "gateway_key": header_of(head, "x-gateway-key"),
        "tenant": header_of(head, "x-tenant-key"),
    })
    .to_string();
    RawReply::Bytes(
        format!(
            "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_value_echoed_in_an_error_body_is_masked_in_the_record() {
    let (addr, heads) = support::raw_server(echo_keys_403).await;
    let config = format!(
        r#"
targets:
  - name: gw
    serving_mode: aggregated
    url: "http://{addr}"
    model: m
    dialect: openai
    request:
      headers: {{ X-Tenant-Key: {tenant} }}
workloads:
  concurrency_sweep:
    levels: [1]
    isl: 16
    osl: 2
    step: 1s
    warmup: 0s
    request:
      headers: {{ X-Gateway-Key: {GATEWAY_KEY} }}
schedule: {{ drain_grace: 5s }}
"#,
        tenant = serde_json::to_string(TENANT_KEY).unwrap(),
    );
    let seen = run_cycle(&config).await;
    let heads = heads.lock().unwrap().clone();
    assert!(
        heads
            .iter()
            .any(|h| h.contains(GATEWAY_KEY) && h.contains(TENANT_KEY)),
        "the keys were sent: {heads:?}"
    );
    assert!(!seen.is_empty());
    for (_, outcome, error) in &seen {
        assert_eq!(*outcome, Outcome::Http4xx);
        let error = error.as_deref().unwrap_or_default();
        assert!(
            error.contains("gateway key not accepted")
                && error.contains(r#""gateway_key":"***""#)
                && error.contains(r#""tenant":"***""#),
            "{error}"
        );
        assert!(
            !error.contains("secret") && !error.contains("7f3a9c1e"),
            "{error}"
        );
    }
}

/// `bench --search` probes with the sweep's request options, as the sweep's own steps do.
#[tokio::test(start_paused = true)]
async fn the_search_probes_with_the_sweeps_options() {
    use llm_canary::report::search::{SearchOptions, run_search};
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let config = format!(
        r#"
targets:
  - name: agg
    serving_mode: aggregated
    model: sim
    simulated: {{ profile: fixed, fixed_ttft: 100ms, fixed_itl: 10ms, request_log: "{}" }}
    request: {{ headers: {{ X-Tenant: team-a }} }}
workloads:
  concurrency_sweep:
    levels: [1]
    isl: 32
    osl: 4
    step: 2s
    warmup: 1s
    request:
      api: completions
      extra_body: {{ top_p: 0.9 }}
"#,
        log.display()
    );
    let setup = llm_canary::setup::Setup::parse(&config, "search.yaml", Path::new(".")).unwrap();
    run_search(
        SearchOptions {
            setup,
            condition: "p99(ttft) < 10s".into(),
            max_level: 2,
            out: None,
            live_progress: false,
        },
        &llm_canary::shutdown::Shutdown::new(),
    )
    .await
    .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let probes: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        // Calibration asks the target's own API; the probes are the sweep's.
        .filter(|l| l["endpoint"] == "completions")
        .collect();
    assert!(!probes.is_empty(), "no probe on /v1/completions:\n{text}");
    for line in probes {
        assert_eq!(line["body"]["top_p"], 0.9, "{line}");
        assert_eq!(line["headers"]["x-tenant"], "team-a", "{line}");
    }
}
