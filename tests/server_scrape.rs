//! The server-metrics scrape against the simulator's own `/metrics`: the step's prefix-cache hit
//! ratio equals what the simulator's counters say (read here from its raw text, independently of
//! the scraper's parser), the step carries the server's TTFT and KV usage, the
//! `llm_canary_server_*` series are published, the step's KV offloads are KVBM's GPU→host block
//! copies (`kvbm_offload_blocks_d2h`, absent without KV tiers), and the periodic loop keeps them
//! fresh.

mod support;

use std::sync::Arc;
use std::time::Duration;

use llm_canary::config::ServingMode;
use llm_canary::sim::{PoolSpec, SimSpec, TierSpec};
use serde_json::json;
use support::http::{http_client, scrape};
use support::metrics::{sample, sum};
use support::sim::{fast, scraped_sim, scraper, start_sim, words};
use tokio_util::sync::CancellationToken;

fn http() -> reqwest::Client {
    http_client(Some(Duration::from_secs(20)))
}

async fn raw_metrics(base: &str) -> String {
    scrape(&http(), base).await
}

/// A streamed chat request of `words` words; returns when the stream ends.
async fn chat(base: &str, prompt: &str) {
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "stream": true,
        "max_tokens": 4, "min_tokens": 4, "ignore_eos": true,
    });
    let resp = http()
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    resp.bytes().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_hit_ratio_matches_the_simulators_counters() {
    for mode in [ServingMode::Aggregated, ServingMode::Disaggregated] {
        let (sim, base, metrics, scraper) = scraped_sim(fast(), mode).await;

        // Traffic before the step must not count in it.
        chat(&base, &words(300, "before")).await;
        let raw_before = raw_metrics(&base).await;
        let mark = scraper.begin_step().await;
        // A shared prefix sent four times (three can hit) and two unique prompts.
        let shared = words(400, "shared");
        for i in 0..4 {
            chat(&base, &format!("{shared} tail{i}")).await;
        }
        chat(&base, &words(400, "unique-a")).await;
        chat(&base, &words(400, "unique-b")).await;
        let raw_after = raw_metrics(&base).await;
        let steps = scraper.end_step(mark).await;
        let step = steps["sim"];

        let delta = |f| sum(&raw_after, f, &[]) - sum(&raw_before, f, &[]);
        let queries = delta("vllm:prefix_cache_queries_total");
        let hits = delta("vllm:prefix_cache_hits_total");
        let expected = hits / queries;
        assert!(
            (0.2..0.9).contains(&expected),
            "{mode:?}: the traffic should hit partly: {hits}/{queries}"
        );
        let got = step.prefix_cache_hit_ratio.expect("hit ratio");
        assert!(
            (got - expected).abs() < 1e-12,
            "{mode:?}: scraper {got} vs simulator counters {expected}"
        );
        let ttft_sum = delta("dynamo_frontend_time_to_first_token_seconds_sum");
        let ttft_count = delta("dynamo_frontend_time_to_first_token_seconds_count");
        assert_eq!(ttft_count, 6.0);
        let ttft = step.ttft_mean_seconds.expect("server ttft");
        assert!((ttft - ttft_sum / ttft_count).abs() < 1e-9, "{ttft}");
        assert_eq!(step.scrapes, 2);
        let usage = step.kv_cache_usage_mean.expect("kv usage");
        assert!((0.0..=1.0).contains(&usage));
        assert!(step.kv_cache_usage_max.unwrap() >= usage);
        assert_eq!(step.preemptions, Some(0.0));
        // The simulator counts cancellations as Dynamo's workers do; nothing was abandoned here.
        assert_eq!(step.cancellations, Some(0.0));
        // No KVBM tiers: the simulator, like vLLM, exports no offload count, and that is fine.
        assert_eq!(step.kv_offload_blocks, None);
        assert_eq!(step.kv_offload_blocks_per_second, None);

        let text = metrics.encode().unwrap();
        for family in [
            "llm_canary_server_prefix_cache_hit_ratio{target=\"sim\"}",
            "llm_canary_server_kv_cache_usage_ratio{target=\"sim\"}",
            "llm_canary_server_ttft_mean_seconds{target=\"sim\"}",
            "llm_canary_server_preemptions_total{target=\"sim\"}",
            "llm_canary_server_cancellations_total{target=\"sim\"}",
        ] {
            assert!(text.contains(family), "{family} missing:\n{text}");
        }
        assert!(!text.contains("llm_canary_server_scrape_errors_total{"));
        assert!(
            !text.contains("llm_canary_server_kv_offload_blocks_total{"),
            "no offload source, no series:\n{text}"
        );
        sim.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_kv_offloads_are_kvbms_gpu_to_host_block_copies() {
    // 16 blocks of 64 tokens and a CPU tier: each 400-word prompt fills 7 blocks, so from the
    // third unique prompt on cached blocks are evicted. The simulator offloads a block to host
    // memory only then (real KVBM copies every computed block), so offloads need the eviction.
    let spec = SimSpec {
        aggregated: PoolSpec {
            kv_blocks: Some(16),
            ..PoolSpec::default()
        },
        cpu_tier: Some(TierSpec {
            capacity_gb: 1.0,
            bandwidth_gbps: 20.0,
        }),
        ..fast()
    };
    let (sim, base, metrics, scraper) = scraped_sim(spec, ServingMode::Aggregated).await;

    chat(&base, &words(400, "before")).await;
    let raw_before = raw_metrics(&base).await;
    let mark = scraper.begin_step().await;
    for salt in ["a", "b", "c", "d"] {
        chat(&base, &words(400, salt)).await;
    }
    let raw_after = raw_metrics(&base).await;
    let steps = scraper.end_step(mark).await;
    let step = steps["sim"];

    assert!(
        raw_after.contains("# TYPE kvbm_offload_blocks_d2h counter"),
        "{raw_after}"
    );
    let offloads = sum(&raw_after, "kvbm_offload_blocks_d2h", &[])
        - sum(&raw_before, "kvbm_offload_blocks_d2h", &[]);
    assert!(
        offloads > 0.0,
        "the small pool must evict, and offload:\n{raw_after}"
    );
    assert_eq!(step.kv_offload_blocks, Some(offloads));
    assert!(step.kv_offload_blocks_per_second.unwrap() > 0.0);

    let text = metrics.encode().unwrap();
    let series = "llm_canary_server_kv_offload_blocks_total";
    let published = sample(&text, series, &[("target", "sim")])
        .unwrap_or_else(|| panic!("{series}{{target=\"sim\"}} missing:\n{text}"));
    assert_eq!(published, sum(&raw_after, "kvbm_offload_blocks_d2h", &[]));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_scrape_publishes_and_counts_a_dead_endpoint() {
    let sim = start_sim(fast(), ServingMode::Aggregated).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/metrics", l.local_addr().unwrap())
    };
    let (metrics, scraper) = scraper(&[
        ("live", format!("{}/metrics", sim.base_url())),
        ("dead", dead),
    ]);
    let scraper = Arc::new(scraper);
    let stop = CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&scraper).run(Duration::from_millis(50), stop.clone()));
    support::eventually(
        "three failed scrapes and a live gauge",
        Duration::from_secs(20),
        || {
            let text = metrics.encode().unwrap();
            async move {
                let errors = sample(
                    &text,
                    "llm_canary_server_scrape_errors_total",
                    &[("target", "dead")],
                )?;
                (errors >= 3.0
                    && text.contains("llm_canary_server_kv_cache_usage_ratio{target=\"live\"}"))
                .then_some(())
            }
        },
    )
    .await;
    stop.cancel();
    task.await.unwrap();
    let text = metrics.encode().unwrap();
    assert!(!text.contains("llm_canary_server_kv_cache_usage_ratio{target=\"dead\"}"));
    sim.shutdown().await;
}

/// The names a real run exposed, `_bucket`/`_sum`/`_count` folded into their family: Dynamo
/// 1.6.1's frontend and mocker workers (`tests/testdata/dynamo/metric-names.txt`), vLLM's CPU
/// build (`tests/testdata/vllm/metric-names.txt`), and KVBM's registered names
/// (`tests/testdata/dynamo/kvbm-metric-names.txt`, from its source: KVBM needs a GPU).
fn real_names() -> std::collections::BTreeSet<String> {
    [
        include_str!("testdata/dynamo/metric-names.txt"),
        include_str!("testdata/vllm/metric-names.txt"),
        include_str!("testdata/dynamo/kvbm-metric-names.txt"),
    ]
    .iter()
    .flat_map(|text| text.lines())
    .map(str::trim)
    .filter(|l| !l.is_empty() && !l.starts_with('#'))
    .map(|l| family(l).to_owned())
    .collect()
}

fn family(sample: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| sample.strip_suffix(s))
        .unwrap_or(sample)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_metric_the_simulator_exports_exists_on_a_real_server() {
    let real = real_names();
    // Every family the simulator can export: both modes, KV tiers on (KVBM's counters), a
    // pool small enough to evict, successes and a prefix hit.
    for mode in [ServingMode::Aggregated, ServingMode::Disaggregated] {
        let pool = PoolSpec {
            kv_blocks: Some(16),
            ..PoolSpec::default()
        };
        let tier = TierSpec {
            capacity_gb: 1.0,
            bandwidth_gbps: 20.0,
        };
        let spec = SimSpec {
            aggregated: pool.clone(),
            prefill: pool.clone(),
            decode: pool,
            cpu_tier: Some(tier),
            disk_tier: Some(tier),
            ..fast()
        };
        let sim = start_sim(spec, mode).await;
        let base = sim.base_url();
        for salt in ["a", "a", "b", "c", "d"] {
            chat(&base, &words(400, salt)).await;
        }
        let text = raw_metrics(&base).await;
        let exported: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| l.split(['{', ' ']).next())
            .map(family)
            .collect();
        assert!(
            exported.len() >= 10 && exported.contains("kvbm_offload_blocks_d2h"),
            "{mode:?}: too few families to judge: {exported:?}"
        );
        let invented: Vec<&&str> = exported.iter().filter(|n| !real.contains(**n)).collect();
        assert!(
            invented.is_empty(),
            "{mode:?}: the simulator exports names no real Dynamo, vLLM or KVBM has: {invented:?}"
        );
        sim.shutdown().await;
    }
}

/// Issue 21, item 7: a target whose `/metrics` never answers delays no other target's step: the
/// scrapes at a step's start and end wait for it at most `BOUNDARY_SCRAPE_WAIT`, a periodic
/// round stuck on it holds no lock, and the slow one counts scrape errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_metrics_endpoint_delays_no_other_target() {
    let sim = start_sim(fast(), ServingMode::Aggregated).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung = listener.local_addr().unwrap();
    let _hole = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            held.push(c);
        }
    });
    let (metrics, scraper) = scraper(&[
        ("live", format!("{}/metrics", sim.base_url())),
        ("hung", format!("http://{hung}/metrics")),
    ]);
    let scraper = Arc::new(scraper);
    // A periodic round, stuck on the hung endpoint for its whole 5 s timeout.
    let periodic = tokio::spawn({
        let s = Arc::clone(&scraper);
        async move { s.scrape_all().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let bound = llm_canary::scrape::BOUNDARY_SCRAPE_WAIT + Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let mark = scraper.begin_step().await;
    chat(&sim.base_url(), &words(50, "step")).await;
    let steps = scraper.end_step(mark).await;
    let took = started.elapsed();
    assert!(
        took < 2 * bound,
        "a step's two boundary scrapes took {took:?} beside a hung endpoint"
    );
    assert_eq!(steps["live"].scrapes, 2, "{steps:?}");
    // The hung endpoint's step has no server values, rather than stale ones.
    assert!(
        steps
            .get("hung")
            .is_none_or(|s| s.scrapes == 0 && s.ttft_mean_seconds.is_none()),
        "{steps:?}"
    );
    let text = metrics.encode().unwrap();
    assert!(
        sample(
            &text,
            "llm_canary_server_scrape_errors_total",
            &[("target", "hung")]
        )
        .is_some_and(|n| n >= 2.0),
        "{text}"
    );
    periodic.await.unwrap();
    sim.shutdown().await;
}
