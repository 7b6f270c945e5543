//! The simulator's engine in virtual time: the default profile's formula, the prefix cache,
//! eviction, preemption, tiers, the disaggregated handoff, and aggregated vs disaggregated serving
//! under load. Every test runs with tokio's clock paused, so timings are exact and fast.

use std::time::Duration;

use llm_canary::config::ServingMode;
use llm_canary::sim::{
    Cluster, Completion, GenerateRequest, PoolSpec, SimSpec, StreamEvent, TierSpec,
};
use tokio::time::Instant;

/// Everything a request produced, with instants relative to its submission.
#[derive(Debug)]
struct Run {
    tokens: Vec<Duration>,
    completion: Completion,
}

impl Run {
    fn ttft(&self) -> Duration {
        self.tokens[0]
    }

    fn gaps(&self) -> impl Iterator<Item = Duration> + '_ {
        self.tokens.windows(2).map(|w| w[1] - w[0])
    }
}

/// The default profile with an aggregated pool of `blocks` KV blocks.
fn aggregated_kv_blocks(blocks: u64) -> SimSpec {
    SimSpec {
        aggregated: PoolSpec {
            kv_blocks: Some(blocks),
            ..PoolSpec::default()
        },
        ..SimSpec::default()
    }
}

async fn run(cluster: &Cluster, req: GenerateRequest) -> Run {
    let start = Instant::now();
    let mut stream = cluster.submit(req);
    let mut tokens = Vec::new();
    loop {
        match stream.next().await.expect("stream ended without Done") {
            StreamEvent::Token { at } => tokens.push(at - start),
            StreamEvent::Done(c) => {
                return Run {
                    tokens,
                    completion: *c,
                };
            }
            StreamEvent::Rejected(m) => panic!("rejected: {m}"),
        }
    }
}

/// Sends a 1000-token prompt (`salt`), two others (`salt + 1`, `salt + 2`), then the first
/// again, each for 2 tokens; returns the last run.
async fn first_again_after_two_others(cluster: &Cluster, salt: u64) -> Run {
    let a = unique_prompt(salt, 1000);
    run(cluster, GenerateRequest::exact(a.clone(), 2)).await;
    run(
        cluster,
        GenerateRequest::exact(unique_prompt(salt + 1, 1000), 2),
    )
    .await;
    run(
        cluster,
        GenerateRequest::exact(unique_prompt(salt + 2, 1000), 2),
    )
    .await;
    run(cluster, GenerateRequest::exact(a, 2)).await
}

/// Token ids no other prompt shares (so nothing hits the prefix cache by accident).
fn unique_prompt(salt: u64, len: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| {
            let mut x = salt
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(i.wrapping_mul(0xbf58_476d_1ce4_e5b9));
            x ^= x >> 31;
            x as u32
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn assert_near(what: &str, got: f64, want: f64, tolerance: f64) {
    assert!(
        (got - want).abs() <= tolerance,
        "{what}: got {got:.3} ms, want {want:.3} ± {tolerance} ms"
    );
}

#[tokio::test(start_paused = true)]
async fn default_profile_reproduces_its_formula() {
    let cluster = Cluster::start(&SimSpec::default(), ServingMode::Aggregated, None).unwrap();
    let r = run(&cluster, GenerateRequest::exact(unique_prompt(1, 4096), 4)).await;
    // P(4096) = 4.21e-7·4096² + 1.518e-2·4096 + 16.5 = 85.74 ms; the first token leaves with it.
    assert_near("prefill of 4096 tokens", ms(r.ttft()), 85.74, 0.1);
    // Near-empty KV: D(u) = 5.74 + 54.01·u with u ≈ 65 / 30 000 blocks.
    for gap in r.gaps() {
        assert!(
            (5.7..6.0).contains(&ms(gap)),
            "decode pass {:.3} ms",
            ms(gap)
        );
    }
    let t = r.completion.timing;
    assert_near(
        "server prefill time",
        ms(t.prefill_done - t.first_scheduled),
        85.74,
        0.1,
    );

    // 16 384 tokens in one pass when the budget allows it: P = 378.2 ms.
    let big_budget = SimSpec {
        max_batched_tokens: 16384,
        ..SimSpec::default()
    };
    let cluster = Cluster::start(&big_budget, ServingMode::Aggregated, None).unwrap();
    let r = run(&cluster, GenerateRequest::exact(unique_prompt(2, 16384), 2)).await;
    assert_near("prefill of 16384 tokens", ms(r.ttft()), 378.2, 0.2);

    // With the default 8192-token budget the same prompt is chunked into two passes of 8192.
    let cluster = Cluster::start(&SimSpec::default(), ServingMode::Aggregated, None).unwrap();
    let r = run(&cluster, GenerateRequest::exact(unique_prompt(3, 16384), 2)).await;
    assert_near(
        "chunked prefill of 16384 tokens",
        ms(r.ttft()),
        2.0 * 169.1,
        0.5,
    );
}

#[tokio::test(start_paused = true)]
async fn passes_run_on_absolute_deadlines() {
    // 1000 decode passes of ~5.74 ms must add up exactly, with no per-pass timer slack.
    let cluster = Cluster::start(&SimSpec::default(), ServingMode::Aggregated, None).unwrap();
    let r = run(&cluster, GenerateRequest::exact(unique_prompt(4, 64), 1001)).await;
    let total = *r.tokens.last().unwrap() - r.ttft();
    let mean = ms(total) / 1000.0;
    assert!((5.74..5.80).contains(&mean), "mean pass {mean:.4} ms");
}

#[tokio::test(start_paused = true)]
async fn repeated_prompt_hits_whole_blocks_of_the_prefix_cache() {
    let cluster = Cluster::start(&SimSpec::default(), ServingMode::Aggregated, None).unwrap();
    let prompt = unique_prompt(5, 1000);
    let first = run(&cluster, GenerateRequest::exact(prompt.clone(), 4)).await;
    let second = run(&cluster, GenerateRequest::exact(prompt.clone(), 4)).await;
    assert_eq!(first.completion.cached_tokens, 0);
    // 1000 tokens = 15 full blocks of 64 (960 tokens) + a partial one.
    assert_eq!(second.completion.cached_tokens, 960);
    // Only the 40 uncached tokens are prefilled: P(40) ≈ 17.1 ms instead of P(1000) ≈ 32.1 ms.
    assert_near("cached TTFT", ms(second.ttft()), 17.11, 0.1);
    // A prompt sharing the first 640 tokens hits exactly those 10 blocks.
    let mut partial = prompt[..640].to_vec();
    partial.extend(unique_prompt(6, 300));
    let third = run(&cluster, GenerateRequest::exact(partial, 4)).await;
    assert_eq!(third.completion.cached_tokens, 640);
    let snap = &cluster.snapshots()[0];
    assert_eq!(snap.kv.prefix_hit_tokens, 960 + 640);
    assert_eq!(snap.kv.prefix_queries_tokens, 1000 + 1000 + 940);
}

#[tokio::test(start_paused = true)]
async fn prefix_cache_evicts_under_pressure() {
    // 40 blocks of 64 tokens: room for two 1000-token prompts, not three.
    let spec = aggregated_kv_blocks(40);
    let cluster = Cluster::start(&spec, ServingMode::Aggregated, None).unwrap();
    let again = first_again_after_two_others(&cluster, 10).await;
    let snap = &cluster.snapshots()[0];
    assert!(snap.kv.evicted_blocks > 0, "{snap:?}");
    assert!(
        again.completion.cached_tokens < 960,
        "the first prompt's blocks were evicted, got {} cached",
        again.completion.cached_tokens
    );
}

#[tokio::test(start_paused = true)]
async fn preemption_when_kv_runs_out_and_every_request_still_completes() {
    // 20 blocks = 1280 tokens; four requests that each grow to 500 tokens need 32 blocks.
    let spec = aggregated_kv_blocks(20);
    let cluster = Cluster::start(&spec, ServingMode::Aggregated, None).unwrap();
    let runs = futures_util::future::join_all((0..4).map(|i| {
        run(
            &cluster,
            GenerateRequest::exact(unique_prompt(20 + i, 200), 300),
        )
    }))
    .await;
    for r in &runs {
        assert_eq!(r.completion.completion_tokens, 300);
        assert_eq!(
            r.tokens.len(),
            300,
            "no token is sent twice after a recompute"
        );
    }
    let preempted: u32 = runs.iter().map(|r| r.completion.preemptions).sum();
    assert!(preempted > 0);
    assert_eq!(
        cluster.snapshots()[0].engine.preemptions,
        u64::from(preempted)
    );
    assert_eq!(runs[0].completion.preemptions, 0, "LIFO spares the oldest");
}

#[tokio::test(start_paused = true)]
async fn cpu_tier_onboards_evicted_prefixes_at_its_bandwidth() {
    let spec = SimSpec {
        cpu_tier: Some(TierSpec {
            capacity_gb: 10.0,
            bandwidth_gbps: 10.0,
        }),
        ..aggregated_kv_blocks(40)
    };
    let cluster = Cluster::start(&spec, ServingMode::Aggregated, None).unwrap();
    let again = first_again_after_two_others(&cluster, 30).await;
    assert_eq!(
        again.completion.cached_tokens, 960,
        "GPU + CPU tier cover the prefix"
    );
    let snap = &cluster.snapshots()[0];
    assert!(snap.kv.offload_d2h_blocks > 0);
    assert!(snap.kv.onboard_h2d_blocks > 0);
    // Each onboarded block costs 64 × 48 KiB / 10 GB/s ≈ 0.31 ms on top of P(40).
    let onboard_ms = snap.kv.onboard_h2d_blocks as f64 * 64.0 * 49152.0 / 10e9 * 1e3;
    assert_near(
        "TTFT with onboard",
        ms(again.ttft()),
        17.11 + onboard_ms,
        0.1,
    );
}

#[tokio::test(start_paused = true)]
async fn disaggregated_handoff_costs_overhead_plus_transfer() {
    let cluster = Cluster::start(&SimSpec::default(), ServingMode::Disaggregated, None).unwrap();
    let r = run(&cluster, GenerateRequest::exact(unique_prompt(40, 4096), 3)).await;
    // 4096 tokens × 48 KiB = 201 MB over 64 GB/s = 3.15 ms, plus 5 ms.
    let transfer = 5.0 + 4096.0 * 49152.0 / 64e9 * 1e3;
    assert_near(
        "reported transfer",
        ms(r.completion.timing.kv_transfer),
        transfer,
        0.01,
    );
    // TTFT = prefill + transfer + the decode worker's first pass (5.74 ms + a little for u), plus
    // up to 1 ms of timer granularity where the decode worker wakes from idle.
    let first_pass = ms(r.ttft()) - 85.74 - transfer;
    assert!(
        (5.7..7.0).contains(&first_pass),
        "first decode pass {first_pass:.3} ms"
    );
    assert_eq!(r.completion.prefill_worker_id, Some(0));
    assert_eq!(r.completion.worker_id, 1);
}

#[tokio::test(start_paused = true)]
async fn fixed_profile_is_exact_per_request() {
    let spec = SimSpec {
        profile: "fixed".into(),
        ..SimSpec::default()
    };
    let cluster = Cluster::start(&spec, ServingMode::Aggregated, None).unwrap();
    let runs = futures_util::future::join_all(
        (0..8).map(|i| run(&cluster, GenerateRequest::exact(unique_prompt(i, 4000), 20))),
    )
    .await;
    for r in runs {
        for (i, at) in r.tokens.iter().enumerate() {
            assert_eq!(*at, Duration::from_millis(100 + 10 * i as u64));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn without_ignore_eos_the_output_stops_early_but_not_before_min_tokens() {
    let spec = SimSpec {
        eos_probability: 0.05,
        seed: 7,
        profile: "fast".into(),
        ..SimSpec::default()
    };
    let cluster = Cluster::start(&spec, ServingMode::Aggregated, None).unwrap();
    let mut lengths = Vec::new();
    for i in 0..40 {
        let r = run(
            &cluster,
            GenerateRequest {
                prompt: unique_prompt(50 + i, 32),
                max_tokens: 200,
                min_tokens: 10,
                ignore_eos: false,
            },
        )
        .await;
        lengths.push(r.completion.completion_tokens);
    }
    assert!(
        lengths.iter().all(|l| (10..=200).contains(l)),
        "{lengths:?}"
    );
    assert!(
        lengths.iter().any(|l| *l < 200),
        "some stop at EOS: {lengths:?}"
    );
}

/// Closed loop: `concurrency` clients each send `per_client` requests back to back.
async fn closed_loop(
    spec: &SimSpec,
    mode: ServingMode,
    concurrency: u64,
    per_client: u64,
    isl: usize,
    osl: u32,
) -> (Vec<f64>, Vec<f64>) {
    let cluster = Cluster::start(spec, mode, None).unwrap();
    let clients = (0..concurrency).map(|c| {
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..per_client {
                let prompt = unique_prompt(c * 1_000 + i + 1, isl);
                out.push(run(&cluster, GenerateRequest::exact(prompt, osl)).await);
            }
            out
        })
    });
    let mut ttft = Vec::new();
    let mut gaps = Vec::new();
    for client in futures_util::future::join_all(clients).await {
        // The first request of each client starts in lockstep with the others; skip it as warm-up.
        for r in client.unwrap().into_iter().skip(1) {
            ttft.push(ms(r.ttft()));
            gaps.extend(r.gaps().map(ms));
        }
    }
    ttft.sort_by(f64::total_cmp);
    gaps.sort_by(f64::total_cmp);
    (ttft, gaps)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The benchmark plan's hardware: A100 × 4 aggregated workers against A100 × 4 prefill with
/// L40S × 2 decode workers (see `SimSpec::source_document`).
fn document_spec(workers: u32, prefill: u32, decode: u32) -> SimSpec {
    SimSpec {
        workers,
        prefill_workers: prefill,
        decode_workers: decode,
        ..SimSpec::source_document()
    }
}

#[tokio::test(start_paused = true)]
async fn disaggregated_wins_ttft_and_itl_at_concurrency_32_with_long_prompts() {
    let spec = document_spec(1, 1, 1);
    let (agg_ttft, agg_gaps) = closed_loop(&spec, ServingMode::Aggregated, 32, 6, 4096, 256).await;
    let (dis_ttft, dis_gaps) =
        closed_loop(&spec, ServingMode::Disaggregated, 32, 6, 4096, 256).await;
    let (a50, d50) = (quantile(&agg_ttft, 0.5), quantile(&dis_ttft, 0.5));
    let (a99, d99) = (quantile(&agg_gaps, 0.99), quantile(&dis_gaps, 0.99));
    eprintln!(
        "c32 ISL 4096: TTFT p50 agg {a50:.1} ms, disagg {d50:.1} ms; ITL p99 agg {a99:.1} ms, disagg {d99:.1} ms"
    );
    assert!(d50 < a50, "TTFT p50: disagg {d50:.1} vs agg {a50:.1}");
    assert!(d99 < a99, "ITL p99: disagg {d99:.1} vs agg {a99:.1}");
}

#[tokio::test(start_paused = true)]
async fn short_prompts_gain_nothing_from_disaggregation() {
    let spec = document_spec(1, 1, 1);
    let (agg_ttft, _) = closed_loop(&spec, ServingMode::Aggregated, 32, 6, 128, 256).await;
    let (dis_ttft, _) = closed_loop(&spec, ServingMode::Disaggregated, 32, 6, 128, 256).await;
    let (a50, d50) = (quantile(&agg_ttft, 0.5), quantile(&dis_ttft, 0.5));
    eprintln!("c32 ISL 128: TTFT p50 agg {a50:.1} ms, disagg {d50:.1} ms");
    assert!(
        d50 >= a50,
        "handoff overhead must cancel the gain: disagg {d50:.1} vs agg {a50:.1}"
    );
}

#[tokio::test(start_paused = true)]
async fn table_profile_interpolates_prefill_and_decode() {
    let spec = SimSpec {
        profile: "table".into(),
        table: Some(llm_canary::sim::TimingTable {
            prefill: vec![[0.0, 10.0], [10000.0, 110.0]],
            decode: llm_canary::sim::DecodeGrid {
                kv_tokens: vec![0.0, 1e6],
                context: vec![0.0, 1e5],
                ms: vec![vec![3.0, 3.0], vec![3.0, 3.0]],
            },
        }),
        ..SimSpec::default()
    };
    let cluster = Cluster::start(&spec, ServingMode::Aggregated, None).unwrap();
    let r = run(&cluster, GenerateRequest::exact(unique_prompt(60, 4096), 5)).await;
    assert_near("table prefill", ms(r.ttft()), 10.0 + 40.96, 0.01);
    for gap in r.gaps() {
        assert_near("table decode", ms(gap), 3.0, 0.001);
    }
}

#[tokio::test(start_paused = true)]
async fn kv_router_prefers_prefix_overlap_and_balances_load() {
    let spec = SimSpec {
        workers: 2,
        ..SimSpec::default()
    };
    let cluster = Cluster::start(&spec, ServingMode::Aggregated, None).unwrap();
    let a = unique_prompt(70, 1000);
    let first = run(&cluster, GenerateRequest::exact(a.clone(), 2)).await;
    // Two new requests at once: the second sees the first's queued blocks and goes elsewhere.
    let (x, y) = tokio::join!(
        run(&cluster, GenerateRequest::exact(unique_prompt(71, 2000), 2)),
        run(&cluster, GenerateRequest::exact(unique_prompt(72, 2000), 2)),
    );
    assert_ne!(x.completion.worker_id, y.completion.worker_id);
    // The repeated prompt goes back to the worker that holds its prefix.
    let again = run(&cluster, GenerateRequest::exact(a, 2)).await;
    assert_eq!(again.completion.worker_id, first.completion.worker_id);
    assert_eq!(again.completion.cached_tokens, 960);
}
