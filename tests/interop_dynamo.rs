//! llm-canary against real NVIDIA Dynamo 1.6.1 on loopback: Dynamo's own OpenAI-compatible
//! frontend (its Rust HTTP server and KV router) in front of Dynamo's mocker workers, in an
//! aggregated stack (two workers) and a disaggregated one (a prefill and a decode worker), started
//! by `scripts/interop/dynamo-stack.sh` from the venv of `scripts/interop/install-dynamo.sh`
//! (docs/INTEROP.md). Everything goes through the path users run: `llm-canary check --probe` and
//! `llm-canary bench --out`, in another process, and the tests read what they wrote:
//!
//! - all four workloads, both modes paired, every request `ok`, ISL and OSL exact to the token
//!   (`usage`; the mocker generates exactly `max_tokens`), Dynamo's per-request timing and worker
//!   ids in `requests.jsonl`, and the server-metrics scrape reading
//!   Dynamo's real names from the frontend (`dynamo_frontend_*`: server TTFT) and the workers
//!   (KV usage, preemptions);
//! - errors classified: an unknown model is a rejected probe (exit 4) and `http_4xx` requests, a
//!   stack stopped mid-run `stream_truncated` and `connect`, never `ok`.
//!
//! Needs the Dynamo venv; without it the tests are skipped loudly outside CI and fail in CI
//! (`CI=true`), where `scripts/test` installs it first.

mod interop;
mod skip;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use interop::{home_cache, repo};
use llm_canary::config::ServingMode;
use support::http::{get_text, http_client};
use support::metrics::sample;

/// The Dynamo venv, or `None` (after a loud message) when it is missing outside CI.
fn dynamo_venv() -> Option<PathBuf> {
    let venv = std::env::var_os("LLM_CANARY_DYNAMO_VENV")
        .map_or_else(|| home_cache("dynamo-venv"), PathBuf::from);
    if venv.join(".llm-canary-ready").is_file() {
        return Some(venv);
    }
    let message = format!(
        "Dynamo interop tests need the Dynamo venv at {} (not installed). Install it with \
         `scripts/interop/install-dynamo.sh` (about a minute, 700 MB).",
        venv.display()
    );
    skip::missing_tool(&message);
    None
}

/// Only one test's stacks at a time: the mockers and the canary share two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A Dynamo stack started by `scripts/interop/dynamo-stack.sh`, stopped when dropped.
struct Stack {
    run: tempfile::TempDir,
    /// `NAME URL` of `RUN/urls`: `frontend`, `frontend-metrics`, then the workers' metrics.
    urls: Vec<(String, String)>,
}

impl Stack {
    /// Starts `mode` (`agg` or `disagg`) on the first base port in `ports` whose four ports are
    /// free (the script checks and refuses a busy one).
    fn start(mode: &str, ports: std::ops::Range<u16>) -> Stack {
        Stack::start_with(mode, ports, &[])
    }

    /// [`Stack::start`] with `env` set for every process of the stack.
    fn start_with(mode: &str, ports: std::ops::Range<u16>, env: &[(&str, &Path)]) -> Stack {
        let run = tempfile::tempdir().expect("run dir");
        let mut said = String::new();
        for port in ports.step_by(4) {
            let out = Command::new(repo().join("scripts/interop/dynamo-stack.sh"))
                .args(["start", mode])
                .arg(run.path())
                .arg(port.to_string())
                .env("DYNAMO_START_TIMEOUT", "180")
                .envs(env.iter().map(|(k, v)| (*k, *v)))
                .output()
                .expect("run scripts/interop/dynamo-stack.sh");
            if out.status.success() {
                let urls = std::fs::read_to_string(run.path().join("urls"))
                    .expect("RUN/urls")
                    .lines()
                    .filter_map(|l| l.split_once(' '))
                    .map(|(n, u)| (n.to_owned(), u.to_owned()))
                    .collect();
                eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim_end());
                return Stack { run, urls };
            }
            said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if !said.contains("port(s) in use") {
                break;
            }
        }
        panic!("the {mode} Dynamo stack did not start:\n{said}");
    }

    fn url(&self, name: &str) -> &str {
        self.urls
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, u)| u.as_str())
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.urls))
    }

    fn metrics_urls(&self) -> Vec<&str> {
        self.urls
            .iter()
            .filter(|(n, _)| n.ends_with("-metrics"))
            .map(|(_, u)| u.as_str())
            .collect()
    }

    fn stop(&self) {
        let out = Command::new(repo().join("scripts/interop/dynamo-stack.sh"))
            .arg("stop")
            .arg(self.run.path())
            .output()
            .expect("run scripts/interop/dynamo-stack.sh stop");
        assert!(out.status.success(), "{out:?}");
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/interop/dynamo-stack.sh"))
            .arg("stop")
            .arg(self.run.path())
            .stdout(Stdio::null())
            .status();
    }
}

/// The mocker's model folder (tokenizer, chat template, config), built by the stack script.
fn model_dir() -> PathBuf {
    std::env::var_os("DYNAMO_MODEL_DIR")
        .map_or_else(|| home_cache("dynamo-models/tiny-qwen3"), PathBuf::from)
}

fn target_yaml(name: &str, mode: &str, stack: &Stack, model: &str) -> String {
    let metrics = stack.metrics_urls().join(", ");
    format!(
        "  - name: {name}\n    serving_mode: {mode}\n    url: {}\n    model: {model}\n    \
         dialect: dynamo\n    server_metrics: [{metrics}]\n",
        stack.url("frontend")
    )
}

/// Short versions of the four workloads: a cycle of about a minute and a half.
const FOUR_WORKLOADS: &str = "
workloads:
  concurrency_sweep: { levels: [1, 4], isl: 1024, osl: 64, step: 12s, warmup: 2s }
  multi_turn: { turns: 3, conversations: 3, isl: 128, osl: 32, duration: 15s }
  sequence_distribution:
    distributions: [uniform, lognormal]
    isl: { min: 128, max: 2048 }
    osl: { min: 16, max: 64 }
    concurrency: 4
    step: 10s
    warmup: 2s
  prefix_cache: { hit_ratios: [0.0, 1.0], isl: 2048, osl: 16, concurrency: 4, step: 10s, warmup: 2s, pool_size: 2 }
schedule: { drain_grace: 20s, max_lag_p99: 5s }
";

fn write_config(dir: &Path, targets: &str, workloads: &str) -> PathBuf {
    let text = format!(
        "targets:\n{targets}tokenizer: {}\n{workloads}export: {{ listen: 127.0.0.1:0 }}\n",
        model_dir().display()
    );
    let path = dir.join("dynamo.yaml");
    std::fs::write(&path, text).expect("write the config");
    path
}

/// `llm-canary ARGS --config CONFIG`, its SLO state file beside the config.
fn canary_command(args: &[&str], config: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_llm-canary"));
    command
        .args(args)
        .arg("--config")
        .arg(config)
        .env("LLM_CANARY_STATE_FILE", config.with_extension("state.json"));
    command
}

fn canary(args: &[&str], config: &Path) -> Output {
    canary_command(args, config)
        .output()
        .expect("run llm-canary")
}

fn bench_args(out: &Path) -> [&str; 5] {
    [
        "bench",
        "--format",
        "json",
        "--out",
        out.to_str().expect("a UTF-8 path"),
    ]
}

/// `llm-canary bench --out OUT` to its end; a failed bench fails the test with its log. Returns
/// the log.
fn bench(config: &Path, out: &Path) -> String {
    let bench = canary(&bench_args(out), config);
    let log = String::from_utf8_lossy(&bench.stderr).into_owned();
    assert!(bench.status.success(), "bench failed:\n{log}");
    log
}

fn requests(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("requests.jsonl"))
        .expect("requests.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn text(v: &serde_json::Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_owned()
}

#[test]
fn the_four_workloads_against_dynamo_agg_and_disagg_are_exact_to_the_token() {
    let Some(_venv) = dynamo_venv() else { return };
    let _turn = ONE_AT_A_TIME.blocking_lock();
    let agg = Stack::start("agg", 20000..20400);
    let disagg = Stack::start("disagg", 20400..20800);
    let dir = tempfile::tempdir().unwrap();
    let targets = format!(
        "{}{}",
        target_yaml("dyn-agg", "aggregated", &agg, "auto"),
        target_yaml("dyn-disagg", "disaggregated", &disagg, "auto")
    );
    let config = write_config(dir.path(), &targets, FOUR_WORKLOADS);

    // The preflight: every check passes on both stacks, and every metrics endpoint, the
    // frontend's and each worker's, has Dynamo's names.
    let probe = canary(&["check", "--probe"], &config);
    let said = String::from_utf8_lossy(&probe.stdout);
    assert!(
        probe.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    for stack in [&agg, &disagg] {
        for url in stack.metrics_urls() {
            assert!(
                said.lines()
                    .any(|l| l.contains(url) && l.contains("dynamo_")),
                "{url} in\n{said}"
            );
        }
    }
    assert!(said.matches("nvext.timing present").count() == 2, "{said}");

    let out = dir.path().join("out");
    let log = bench(&config, &out);
    // The model's context length, as the frontend reports it (`/v1/models`' `context_window`,
    // else its `dynamo_frontend_model_context_length` gauge), bounds each target's requests.
    for name in ["dyn-agg", "dyn-disagg"] {
        assert!(
            log.lines().any(
                |l| l.contains("requests above the context length are skipped")
                    && l.contains(&format!("target={name} "))
                    && l.contains("reported=Some(")
            ),
            "no context length learned from {name}:\n{log}"
        );
    }

    // Every request ok; every workload ran on both targets; lengths exact to the token.
    let all = requests(&out);
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut ran: BTreeSet<(String, String)> = BTreeSet::new();
    for r in &all {
        *outcomes.entry(text(r, "outcome")).or_default() += 1;
        ran.insert((text(r, "target"), text(r, "workload")));
        if text(r, "outcome") != "ok" {
            continue;
        }
        // Dynamo's own timing and worker ids, per request: in disagg a prefill and a decode
        // worker, in agg one worker for both.
        let (prefill, decode) = (text(r, "prefill_worker_id"), text(r, "decode_worker_id"));
        assert!(!prefill.is_empty() && !decode.is_empty(), "worker ids: {r}");
        assert_eq!(text(r, "target") == "dyn-agg", prefill == decode, "{r}");
        for key in [
            "server_ttft_ms",
            "server_prefill_ms",
            "server_total_ms",
            "server_kv_hit_rate",
        ] {
            assert!(r[key].as_f64().is_some(), "{key}: {r}");
        }
        assert_eq!(
            r["server_kv_transfer_ms"].is_number(),
            text(r, "target") == "dyn-disagg",
            "the KV transfer estimate only in disagg: {r}"
        );
        assert_eq!(
            r["completion_tokens"], r["requested_osl"],
            "OSL not exact: {r}"
        );
        let want_isl = match text(r, "workload").as_str() {
            "concurrency_sweep" => Some(1024),
            "prefix_cache" => Some(2048),
            _ => None,
        };
        if let Some(isl) = want_isl {
            assert_eq!(r["prompt_tokens"], isl, "ISL not exact: {r}");
        }
    }
    eprintln!("{} requests: {outcomes:?}", all.len());
    assert_eq!(outcomes.keys().collect::<Vec<_>>(), ["ok"], "{outcomes:?}");
    for target in ["dyn-agg", "dyn-disagg"] {
        for workload in [
            "concurrency_sweep",
            "multi_turn",
            "sequence_distribution",
            "prefix_cache",
        ] {
            assert!(
                ran.contains(&(target.to_owned(), workload.to_owned())),
                "{target} ran no {workload}"
            );
        }
    }
    // Paired: the same prompts went to both targets (`-t0`/`-t1` of one request id).
    let stems = |target: &str| -> BTreeSet<String> {
        all.iter()
            .filter(|r| text(r, "target") == target && text(r, "workload") == "concurrency_sweep")
            .filter_map(|r| {
                text(r, "x_request_id")
                    .rsplit_once("-t")
                    .map(|(s, _)| s.to_owned())
            })
            .collect()
    };
    let (a, d) = (stems("dyn-agg"), stems("dyn-disagg"));
    assert!(
        a.intersection(&d).count() >= 10,
        "no paired prompts: {} agg, {} disagg",
        a.len(),
        d.len()
    );

    // Observed prefix hits at ratio 1.0: aggregated from usage; disaggregated (whose usage says
    // 0) from the router's kv_hit_rate, each request naming its source.
    let mut sources: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in all.iter().filter(|r| {
        text(r, "outcome") == "ok"
            && text(r, "workload") == "prefix_cache"
            && text(r, "phase") == "steady"
            && text(r, "prefix_ratio") == "1"
    }) {
        *sources
            .entry((text(r, "target"), text(r, "cached_tokens_source")))
            .or_default() += 1;
    }
    // What the engine reuses, never the whole prompt: at 2,048 tokens (32 blocks of 64, the
    // frontend's block size) fully shared, 31 blocks, the last one holding the token the engine
    // always computes; within one block of it per request.
    for r in all.iter().filter(|r| {
        text(r, "target") == "dyn-disagg"
            && text(r, "outcome") == "ok"
            && text(r, "workload") == "prefix_cache"
            && text(r, "phase") == "steady"
            && text(r, "prefix_ratio") == "1"
            && text(r, "cached_tokens_source") == "kv_hit_rate"
    }) {
        let cached = r["cached_tokens"].as_u64().expect("cached_tokens");
        assert!(
            (1984 - 64..=1984).contains(&cached),
            "disaggregated hit from kv_hit_rate, {cached} of 2048: {r}"
        );
    }
    let count = |t: &str, s: &str| sources.get(&(t.into(), s.into())).copied().unwrap_or(0);
    assert_eq!(count("dyn-agg", "kv_hit_rate"), 0, "{sources:?}");
    assert!(
        count("dyn-disagg", "kv_hit_rate") >= 9 * count("dyn-disagg", "usage").max(1),
        "{sources:?}"
    );

    // The server's own view, per step: server TTFT from the frontend's dynamo_frontend_*
    // histogram, KV usage from the workers' engine metrics.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    for target in ["dyn-agg", "dyn-disagg"] {
        let steps: Vec<&serde_json::Value> = summary["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["target"] == target && s["workload"] == "concurrency_sweep")
            .collect();
        assert!(!steps.is_empty(), "{target}: no sweep step in summary.json");
        for s in steps {
            let server = &s["server"];
            let ttft = server["ttft_mean_seconds"].as_f64();
            assert!(
                ttft.is_some_and(|t| t > 0.0),
                "{target}: server TTFT {server}"
            );
            assert!(
                server["kv_cache_usage_max"]
                    .as_f64()
                    .is_some_and(|u| u > 0.0),
                "{target}: worker KV usage {server}"
            );
            // The TTFT taken apart: the parts add up to the client's mean TTFT, and in disagg
            // the handoff after the prefill worker's first token is the larger part.
            let b = &s["ttft_breakdown"];
            let f = |k: &str| b[k].as_f64().unwrap_or_else(|| panic!("{k} in {b}"));
            let sum = f("client_queue") + f("server_ttft") + f("handoff");
            assert!((sum - f("client_ttft")).abs() < 1e-6, "{target}: {b}");
            assert!(
                f("server_ttft") > 0.0 && f("handoff") >= 0.0,
                "{target}: {b}"
            );
        }
        let prefix_full = summary["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| {
                s["target"] == target
                    && s["workload"] == "prefix_cache"
                    && s["labels"]["prefix_ratio"] == "1"
            })
            .unwrap_or_else(|| panic!("{target}: no prefix_ratio=1 step"));
        let hit = prefix_full["cache_hit_ratio"].as_f64().unwrap_or(0.0);
        assert!(hit > 0.8, "{target}: observed hit at ratio 1.0 is {hit}");
        let server_hit = prefix_full["server"]["prefix_cache_hit_ratio"].as_f64();
        assert!(
            server_hit.is_some_and(|h| h > 0.5),
            "{target}: the router's prefix hit at ratio 1.0: {server_hit:?}"
        );
    }
    let tables: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let breakdown = tables["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "ttft_breakdown")
        .expect("the TTFT breakdown table");
    assert!(
        breakdown["rows"].as_array().is_some_and(|r| r.len() >= 8),
        "{breakdown}"
    );

    // Every Dynamo name the embedded simulator exports, Dynamo exports too (here, live).
    let live: Vec<&str> = [&agg, &disagg]
        .iter()
        .flat_map(|s| s.metrics_urls())
        .collect();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(simulator_names_are_dynamos(&live));
}

/// A request trace captured from the real frontend replays through the trace workload: the
/// aggregated stack runs with `DYN_REQUEST_TRACE=1` (Dynamo 1.6.1's default sink, gzipped JSONL
/// of envelope lines, at `DYN_REQUEST_TRACE_OUTPUT_PATH.000000.jsonl.gz`) while the canary sends
/// it a short prefix-cache step; stopped, so the sink writes its end, the file is replayed on a
/// fresh stack, and every replayed request has one of the captured rows' exact lengths, every
/// row is sent, and the hit the replay observes is the reuse the capture recorded.
#[test]
fn a_trace_captured_from_the_real_frontend_replays_exactly() {
    let Some(_venv) = dynamo_venv() else { return };
    let _turn = ONE_AT_A_TIME.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("captured");
    let recording = Stack::start_with(
        "agg",
        20800..21200,
        &[
            ("DYN_REQUEST_TRACE", Path::new("1")),
            ("DYN_REQUEST_TRACE_OUTPUT_PATH", &base),
        ],
    );
    let load = "workloads:\n  prefix_cache: { hit_ratios: [0.5], isl: 512, osl: 8, concurrency: 2, step: 3s, warmup: 1s, pool_size: 2 }\n";
    let config = write_config(
        dir.path(),
        &target_yaml("dyn-agg", "aggregated", &recording, "auto"),
        load,
    );
    bench(&config, &dir.path().join("load"));
    recording.stop();
    let captured = dir.path().join("captured.000000.jsonl.gz");
    let bytes = std::fs::read(&captured).expect("the frontend wrote its request trace");
    assert!(bytes.starts_with(&[0x1f, 0x8b]), "gzipped");

    // What the frontend recorded: the lengths, and the tokens its engine reused.
    let trace = llm_canary::workload::trace::Trace::load_any(&captured, None, 512)
        .expect("the captured trace loads");
    assert_eq!(trace.block_size, 64, "the mocker's block size");
    let mut lines = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::MultiGzDecoder::new(&bytes[..]),
        &mut lines,
    )
    .unwrap();
    let (mut recorded_cached, mut recorded_input) = (0u64, 0u64);
    for line in lines.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["event"]["schema"].is_string(), "an envelope line: {line}");
        let request = &v["event"]["request"];
        recorded_cached += request["cached_tokens"].as_u64().unwrap_or(0);
        recorded_input += request["input_tokens"].as_u64().unwrap();
    }
    let (reusable, prompt) = trace.expected_hit_tokens();
    assert_eq!(prompt, recorded_input);
    let recorded = recorded_cached as f64 / recorded_input as f64;
    let implied = reusable as f64 / prompt as f64;
    eprintln!(
        "captured {} rows: recorded hit {recorded:.3}, implied by the block hashes {implied:.3}",
        trace.rows.len()
    );
    assert!(recorded > 0.2, "the capture recorded reuse: {recorded}");
    assert!((implied - recorded).abs() < 0.05, "{implied} vs {recorded}");

    // Replayed on a fresh stack, as often as a step of one pass and a half allows.
    let replaying = Stack::start("agg", 21200..21600);
    let step = (trace.span.as_secs_f64() * 1.5).ceil().max(4.0);
    let replay = format!(
        "workloads:\n  trace_replay:\n    traces: [{{ name: captured, path: \"{}\" }}]\n    step: {step}s\n    warmup: 0s\n",
        captured.display()
    );
    let config = write_config(
        dir.path(),
        &target_yaml("dyn-agg", "aggregated", &replaying, "auto"),
        &replay,
    );
    let out = dir.path().join("replay");
    bench(&config, &out);
    let rows: BTreeSet<(u64, u64)> = trace
        .rows
        .iter()
        .map(|r| (u64::from(r.input_length), u64::from(r.output_length)))
        .collect();
    let mut sent: BTreeSet<(u64, u64)> = BTreeSet::new();
    for r in requests(&out) {
        assert_eq!(text(&r, "outcome"), "ok", "{r}");
        let lengths = (
            r["prompt_tokens"].as_u64().unwrap(),
            r["completion_tokens"].as_u64().unwrap(),
        );
        assert!(
            rows.contains(&lengths),
            "{lengths:?} is no captured row's: {r}"
        );
        sent.insert(lengths);
    }
    assert_eq!(sent, rows, "every captured row was replayed");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let step = summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["workload"] == "trace_replay")
        .expect("the replay step");
    let observed = step["cache_hit_ratio"].as_f64().unwrap();
    let expected = step["expected_cache_hit_ratio"].as_f64().unwrap();
    eprintln!("replayed: observed hit {observed:.3}, expected {expected:.3}");
    assert!((expected - implied).abs() < 0.05, "{expected} vs {implied}");
    assert!(
        (observed - recorded).abs() < 0.08,
        "{observed} vs {recorded}"
    );
}

/// The simulator's `dynamo_*` families, in both modes, all among those the live stacks at
/// `urls` export.
async fn simulator_names_are_dynamos(urls: &[&str]) {
    let client = http_client(Some(Duration::from_secs(10)));
    let mut live = BTreeSet::new();
    for url in urls {
        let text = get_text(&client, url).await.expect("scrape a stack");
        live.extend(families(&text));
    }
    for mode in [ServingMode::Aggregated, ServingMode::Disaggregated] {
        let sim = llm_canary::sim::start(
            llm_canary::sim::SimSpec::default(),
            mode,
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .unwrap();
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}"#;
        let resp = client
            .post(format!("{}/v1/chat/completions", sim.base_url()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        resp.bytes().await.unwrap();
        let text = get_text(&client, &format!("{}/metrics", sim.base_url()))
            .await
            .unwrap();
        let invented: Vec<String> = families(&text)
            .into_iter()
            .filter(|n| n.starts_with("dynamo_") && !live.contains(n))
            .collect();
        assert!(
            invented.is_empty(),
            "{mode:?}: the simulator's Dynamo names that Dynamo 1.6.1 lacks: {invented:?}"
        );
        sim.shutdown().await;
    }
}

/// The metric families of an exposition (`_bucket`, `_sum`, `_count` folded).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_against_dynamo_are_classified() {
    let Some(_venv) = dynamo_venv() else { return };
    let _turn = ONE_AT_A_TIME.lock().await;
    let stack = Stack::start("agg", 20800..21200);
    let dir = tempfile::tempdir().unwrap();

    // An unknown model: the probe rejects the target (exit 4) naming the model, and a bench's
    // requests are http_4xx (404) with Dynamo's message.
    let wrong = write_config(
        dir.path(),
        &target_yaml("dyn-wrong", "aggregated", &stack, "no-such-model"),
        "workloads:\n  concurrency_sweep: { levels: [1], isl: 64, osl: 4, step: 3s, warmup: 0s }\n",
    );
    let probe = canary(&["check", "--probe"], &wrong);
    let said = String::from_utf8_lossy(&probe.stdout);
    assert_eq!(probe.status.code(), Some(4), "{said}");
    assert!(said.contains("no-such-model"), "{said}");
    let out = dir.path().join("wrong");
    bench(&wrong, &out);
    let seen = requests(&out);
    assert!(!seen.is_empty());
    for r in &seen {
        assert_eq!(text(r, "outcome"), "http_4xx", "{r}");
        // Dynamo's answer does not repeat the name; the server's message is kept.
        assert!(text(r, "error").contains("Model not found"), "{r}");
        assert_eq!(r["http_status"], 404, "{r}");
    }

    // The stack stopped mid-run: requests in flight end stream_truncated, later sends connect;
    // nothing after the stop is ok, and the bench still writes what it saw.
    let long = write_config(
        dir.path(),
        &target_yaml("dyn-stopped", "aggregated", &stack, "auto"),
        "workloads:\n  concurrency_sweep: { levels: [2], isl: 128, osl: 4000, step: 20s, warmup: 0s }\n\
         schedule: { drain_grace: 5s, max_lag_p99: 5s }\n",
    );
    let out = dir.path().join("stopped");
    let bench = canary_command(&bench_args(&out), &long)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the bench");
    let client = http_client(Some(Duration::from_secs(5)));
    let metrics = stack.url("frontend-metrics").to_owned();
    let busy = support::within(Duration::from_secs(120), || {
        let (client, metrics) = (client.clone(), metrics.clone());
        async move {
            let text = get_text(&client, &metrics).await.ok()?;
            // Streams well under way: a few hundred of their 4,000 tokens out (the probe's and
            // the model lookup's are a handful) and requests in flight.
            let tokens = sample(&text, "dynamo_frontend_output_tokens_total", &[])?;
            let inflight = sample(&text, "dynamo_frontend_inflight_requests", &[])?;
            (tokens >= 300.0 && inflight >= 1.0).then_some(())
        }
    })
    .await;
    assert!(busy.is_some(), "no stream got under way at the frontend");
    stack.stop();
    let finished = tokio::task::spawn_blocking(move || bench.wait_with_output())
        .await
        .unwrap()
        .expect("the bench ends");
    let said = String::from_utf8_lossy(&finished.stderr);
    assert!(finished.status.success(), "{said}");
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests(&out) {
        *outcomes.entry(text(&r, "outcome")).or_default() += 1;
    }
    eprintln!("stack stopped mid-run: outcomes {outcomes:?}");
    let tail: Vec<&str> = said.lines().rev().take(30).collect();
    let why = || {
        format!(
            "{outcomes:?}; the bench said (last first):\n{}",
            tail.join("\n")
        )
    };
    assert!(outcomes.contains_key("stream_truncated"), "{}", why());
    assert!(outcomes.contains_key("connect"), "{}", why());
    assert!(
        outcomes
            .keys()
            .all(|k| ["stream_truncated", "connect"].contains(&k.as_str())),
        "{}",
        why()
    );
}
