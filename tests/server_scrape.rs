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
use llm_canary::export::Metrics;
use llm_canary::scrape::{ScrapeTarget, ServerScraper};
use llm_canary::sim::{PoolSpec, SimHandle, SimSpec, TierSpec, start};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn http() -> reqwest::Client {
    llm_canary::client::http_client_builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Σ of every sample of `family` in the raw exposition (one sample per worker).
fn raw_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

async fn raw_metrics(base: &str) -> String {
    http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
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

fn sentence(n: usize, salt: &str) -> String {
    (0..n)
        .map(|i| format!("{salt}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A simulator on loopback, its base URL, and a scraper of its `/metrics` as target `sim`
/// publishing into fresh metrics.
async fn scraped_sim(
    spec: SimSpec,
    mode: ServingMode,
) -> (SimHandle, String, Arc<Metrics>, ServerScraper) {
    let sim = start(spec, mode, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let base = sim.base_url();
    let metrics = Arc::new(Metrics::new(&[]));
    let scraper = ServerScraper::new(
        vec![ScrapeTarget {
            name: "sim".into(),
            urls: vec![format!("{base}/metrics")],
        }],
        metrics.clone(),
    )
    .unwrap();
    (sim, base, metrics, scraper)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_hit_ratio_matches_the_simulators_counters() {
    for mode in [ServingMode::Aggregated, ServingMode::Disaggregated] {
        let spec = SimSpec {
            profile: "fast".into(),
            ..SimSpec::default()
        };
        let (sim, base, metrics, scraper) = scraped_sim(spec, mode).await;

        // Traffic before the step must not count in it.
        chat(&base, &sentence(300, "before")).await;
        let raw_before = raw_metrics(&base).await;
        let mark = scraper.begin_step().await;
        // A shared prefix sent four times (three can hit) and two unique prompts.
        let shared = sentence(400, "shared");
        for i in 0..4 {
            chat(&base, &format!("{shared} tail{i}")).await;
        }
        chat(&base, &sentence(400, "unique-a")).await;
        chat(&base, &sentence(400, "unique-b")).await;
        let raw_after = raw_metrics(&base).await;
        let steps = scraper.end_step(mark).await;
        let step = steps["sim"];

        let delta = |f| raw_sum(&raw_after, f) - raw_sum(&raw_before, f);
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
        // No KVBM tiers: the simulator, like vLLM, exports no offload count, and that is fine.
        assert_eq!(step.kv_offload_blocks, None);
        assert_eq!(step.kv_offload_blocks_per_second, None);

        let text = metrics.encode().unwrap();
        for family in [
            "llm_canary_server_prefix_cache_hit_ratio{target=\"sim\"}",
            "llm_canary_server_kv_cache_usage_ratio{target=\"sim\"}",
            "llm_canary_server_ttft_mean_seconds{target=\"sim\"}",
            "llm_canary_server_preemptions_total{target=\"sim\"}",
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
        profile: "fast".into(),
        aggregated: PoolSpec {
            kv_blocks: Some(16),
            ..PoolSpec::default()
        },
        cpu_tier: Some(TierSpec {
            capacity_gb: 1.0,
            bandwidth_gbps: 20.0,
        }),
        ..SimSpec::default()
    };
    let (sim, base, metrics, scraper) = scraped_sim(spec, ServingMode::Aggregated).await;

    chat(&base, &sentence(400, "before")).await;
    let raw_before = raw_metrics(&base).await;
    let mark = scraper.begin_step().await;
    for salt in ["a", "b", "c", "d"] {
        chat(&base, &sentence(400, salt)).await;
    }
    let raw_after = raw_metrics(&base).await;
    let steps = scraper.end_step(mark).await;
    let step = steps["sim"];

    assert!(
        raw_after.contains("# TYPE kvbm_offload_blocks_d2h counter"),
        "{raw_after}"
    );
    let offloads = raw_sum(&raw_after, "kvbm_offload_blocks_d2h")
        - raw_sum(&raw_before, "kvbm_offload_blocks_d2h");
    assert!(
        offloads > 0.0,
        "the small pool must evict, and offload:\n{raw_after}"
    );
    assert_eq!(step.kv_offload_blocks, Some(offloads));
    assert!(step.kv_offload_blocks_per_second.unwrap() > 0.0);

    let text = metrics.encode().unwrap();
    let series = "llm_canary_server_kv_offload_blocks_total{target=\"sim\"} ";
    let published = text
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{series}missing:\n{text}"));
    assert_eq!(published, raw_sum(&raw_after, "kvbm_offload_blocks_d2h"));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_scrape_publishes_and_counts_a_dead_endpoint() {
    let sim = start(
        SimSpec {
            profile: "fast".into(),
            ..SimSpec::default()
        },
        ServingMode::Aggregated,
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/metrics", l.local_addr().unwrap())
    };
    let metrics = Arc::new(Metrics::new(&[]));
    let scraper = Arc::new(
        ServerScraper::new(
            vec![
                ScrapeTarget {
                    name: "live".into(),
                    urls: vec![format!("{}/metrics", sim.base_url())],
                },
                ScrapeTarget {
                    name: "dead".into(),
                    urls: vec![dead],
                },
            ],
            metrics.clone(),
        )
        .unwrap(),
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&scraper).run(Duration::from_millis(50), stop.clone()));
    support::eventually(
        "three failed scrapes and a live gauge",
        Duration::from_secs(20),
        || {
            let text = metrics.encode().unwrap();
            async move {
                let errors = text
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("llm_canary_server_scrape_errors_total{target=\"dead\"} ")
                    })
                    .and_then(|v| v.parse::<f64>().ok())?;
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
