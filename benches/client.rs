//! Whole-system benchmark of the measurement client (issue #10): timing accuracy against the
//! simulator's own send instants, throughput and client CPU cost, peak memory, and memory over a
//! long run. Every figure is printed next to its goal; docs/PERFORMANCE.md quotes the results.
//!
//! ```text
//! cargo bench --bench client -- accuracy   [--streams 1,4,64,256,1024] [--secs 10] [--osl 32]
//! cargo bench --bench client -- throughput [--streams 64,512] [--secs 10] [--osl 256]
//! cargo bench --bench client -- rss        [--streams 1024] [--secs 10] [--osl 256] [--profile fast|fixed]
//! cargo bench --bench client -- soak       [--streams 512] [--secs 600] [--osl 256]
//! ```
//! Common options: `--client-threads N` (client runtime workers; default 1 for accuracy, where
//! the simulator shares the process, else 2), `--json FILE` (append one JSON line per result),
//! `--addr HOST:PORT` (use a simulator that is already running, e.g. the one
//! `scripts/bench/aiperf-side-by-side.sh` starts for both tools: accuracy errors are then taken
//! against the configured 100 ms / 10 ms, as for AIPerf, instead of the send instants).
//!
//! How cost is separated: for `accuracy` the simulator (profile `fixed`: TTFT 100 ms, ITL 10 ms)
//! runs in this process on its own thread with a current-thread runtime, because its per-token
//! send instants ([`SimHandle::token_send_times`]) are compared with the client's stamps on the
//! same monotonic clock. For `throughput`, `rss` and `soak` the simulator (profile `fast`, zero
//! delay) runs as a child process (this binary re-executed as `serve-sim`), so this process's own
//! CPU time and RSS are the client's alone; the child's CPU comes from `/proc/PID/stat`.
//!
//! The client is the crate's own path, end to end: [`StreamClient`] (reqwest/hyper, SSE parser,
//! chunk decoder, per-read stamps) and the [`Recorder`] (metrics registry and step accumulators),
//! the same calls the daemon's runner makes per request.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llm_canary::client::{
    ChatMessage, ClientConfig, Endpoint, Outcome, Prompt, RequestRecord, Role, StreamClient,
    StreamRequest,
};
use llm_canary::config::{Api, Dialect, ServingMode};
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{Phase, RecordContext};
use llm_canary::request::RequestLabels;
use llm_canary::schedule::Recorder;
use llm_canary::sim::{SimHandle, SimSpec};
use llm_canary::workload::sampler::{ArrivalProcess, ArrivalSchedule};
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// Command line

struct Args {
    mode: String,
    streams: Vec<u64>,
    secs: f64,
    osl: u32,
    client_threads: Option<usize>,
    json: Option<String>,
    addr: Option<SocketAddr>,
    /// Simulator profile of `throughput`, `rss` and `soak`.
    profile: String,
}

#[path = "support/args.rs"]
mod bench_args;
#[path = "support/measure.rs"]
mod measure;
use measure::{
    emit_json, machine_state, process_cpu_seconds, spread, status_mib, thread_cpu_seconds, verdict,
};

fn parse_args(argv: Vec<String>) -> Args {
    let mut argv = argv.into_iter();
    let mode = argv.next().unwrap_or_else(|| "accuracy".into());
    let mut args = Args {
        streams: Vec::new(),
        secs: 0.0,
        osl: 0,
        client_threads: None,
        json: None,
        addr: None,
        profile: "fast".into(),
        mode,
    };
    while let Some(flag) = argv.next() {
        let value = argv.next().unwrap_or_default();
        match flag.as_str() {
            "--streams" => {
                args.streams = value.split(',').filter_map(|s| s.parse().ok()).collect();
            }
            "--secs" => args.secs = value.parse().expect("--secs takes seconds"),
            "--osl" => args.osl = value.parse().expect("--osl takes a token count"),
            "--client-threads" => args.client_threads = value.parse().ok(),
            "--json" => args.json = Some(value),
            "--addr" => args.addr = Some(value.parse().expect("--addr takes HOST:PORT")),
            "--profile" => args.profile = value,
            other => panic!("unknown option {other}"),
        }
    }
    args
}

// ---------------------------------------------------------------------------------------------
// The client side

struct ClientSide {
    client: StreamClient,
    endpoint: Endpoint,
    recorder: Recorder,
    metrics: Arc<Metrics>,
}

impl ClientSide {
    fn new(addr: SocketAddr) -> Self {
        let client = StreamClient::new(ClientConfig::default()).expect("client builds");
        let endpoint = Endpoint::new(&format!("http://{addr}"), Api::Chat, "sim", Dialect::Dynamo)
            .expect("endpoint");
        let metrics = Arc::new(Metrics::new(&[0.1, 2.0]));
        let recorder = Recorder::new(vec![metrics.clone()]);
        Self {
            client,
            endpoint,
            recorder,
            metrics,
        }
    }

    fn request(id: String, osl: u32) -> StreamRequest {
        StreamRequest {
            request_id: id,
            prompt: Prompt::Chat(vec![ChatMessage {
                role: Role::User,
                content: "Summarise the benchmark plan in one sentence please".into(),
            }]),
            osl,
        }
    }

    /// Sends one request and records it like the daemon's runner does.
    async fn send(
        &self,
        req: &StreamRequest,
        intended: Instant,
        labels: &RequestLabels,
    ) -> RequestRecord {
        let rec = self.client.send(&self.endpoint, req, intended).await;
        let ctx = RecordContext {
            target_index: 0,
            isl: 0,
            labels,
            phase: Phase::Steady,
            osl: req.osl,
            shared_prefix_tokens: 0,
            request: req,
            goodput: llm_canary::request::GoodputLimits {
                ttft: 2.0,
                itl: 0.1,
            },
        };
        self.recorder.record(&ctx, &rec);
        rec
    }
}

fn client_runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("client runtime")
}

// ---------------------------------------------------------------------------------------------
// Accuracy: open-loop arrivals at N streams' worth against the `fixed` profile

#[derive(Default)]
struct AccuracySamples {
    /// Client stamp of the first content chunk − the simulator's send instant of token 1.
    ttft_stamp_ms: Vec<f64>,
    /// Client TTFT (from the intended send) − the configured 100 ms: everything the client adds,
    /// including its own send lag and the request's transit.
    ttft_total_ms: Vec<f64>,
    /// Client ITL − the simulator's ITL from its send instants, per request.
    itl_ms: Vec<f64>,
    /// Client stamp − send instant, every token.
    token_stamp_ms: Vec<f64>,
    /// Actual − intended send.
    lag_ms: Vec<f64>,
    ok: u64,
    failed: u64,
    unmatched: u64,
}

fn start_sim_thread(
    spec: SimSpec,
) -> (
    Arc<SimHandle>,
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<f64>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("simulator runtime");
        rt.block_on(async move {
            let handle = llm_canary::sim::start(
                spec,
                ServingMode::Aggregated,
                "127.0.0.1:0".parse().expect("addr"),
            )
            .await
            .expect("simulator starts");
            let handle = Arc::new(handle);
            let cpu0 = thread_cpu_seconds();
            tx.send(handle.clone()).expect("main waits");
            let _ = stop_rx.await;
            let cpu = thread_cpu_seconds() - cpu0;
            if let Ok(handle) = Arc::try_unwrap(handle) {
                handle.shutdown().await;
            }
            cpu
        })
    });
    (rx.recv().expect("simulator started"), stop_tx, thread)
}

fn accuracy(args: &Args) {
    let osl = if args.osl == 0 { 32 } else { args.osl };
    let secs = if args.secs == 0.0 { 10.0 } else { args.secs };
    let levels = if args.streams.is_empty() {
        vec![1, 4, 64, 256, 1024]
    } else {
        args.streams.clone()
    };
    let threads = args.client_threads.unwrap_or(1);
    let (ttft, itl) = (0.100, 0.010);
    let request_secs = ttft + itl * f64::from(osl - 1);
    println!(
        "# accuracy: simulator `fixed` (TTFT 100 ms, ITL 10 ms), OSL {osl}, open-loop constant \
         arrivals at N / {request_secs:.2} s requests/s, {secs} s measured after 1 s warmup, \
         client runtime {threads} worker(s); {}",
        machine_state()
    );
    println!(
        "{:>5} {:>8} {:>8} | {:>22} | {:>22} | {:>22} | {:>16} | {:>9} {:>5}",
        "N",
        "req/s",
        "deliv.",
        "TTFT err p50/p99/max",
        "ITL err p50/p99/max",
        "token stamp p50/p99/max",
        "TTFT-100ms p50/p99",
        "lag p99",
        "fail"
    );
    for &n in &levels {
        let in_process = match args.addr {
            Some(_) => None,
            None => Some(start_sim_thread(SimSpec {
                profile: "fixed".into(),
                ..SimSpec::default()
            })),
        };
        let sim = in_process.as_ref().map(|(sim, _, _)| sim.clone());
        let addr = args
            .addr
            .or_else(|| sim.as_ref().map(|s| s.local_addr()))
            .expect("a simulator");
        let rt = client_runtime(threads);
        let rate = n as f64 / request_secs;
        let cpu0 = process_cpu_seconds("self");
        let (samples, sent_in_window, intended_in_window) =
            rt.block_on(accuracy_level(addr, sim.clone(), n, rate, osl, secs));
        let cpu = process_cpu_seconds("self") - cpu0;
        drop(rt);
        drop(sim);
        let sim_cpu = match in_process {
            Some((_, stop, thread)) => {
                let _ = stop.send(());
                thread.join().expect("simulator thread")
            }
            None => 0.0,
        };
        let mut s = samples;
        if args.addr.is_some() {
            s.ttft_stamp_ms = s.ttft_total_ms.clone();
        }
        let tt = spread(&mut s.ttft_stamp_ms);
        let it = spread(&mut s.itl_ms);
        let tk = spread(&mut s.token_stamp_ms);
        let tot = spread(&mut s.ttft_total_ms);
        let lag = spread(&mut s.lag_ms);
        let delivered = sent_in_window as f64 / intended_in_window.max(1) as f64;
        println!(
            "{n:>5} {rate:>8.1} {:>7.1}% | {:>6.2} {:>7.2} {:>7.2} | {:>6.2} {:>7.2} {:>7.2} | {:>6.2} {:>7.2} {:>7.2} | {:>7.2} {:>8.2} | {:>7.2}ms {:>5}",
            delivered * 100.0,
            tt.0,
            tt.1,
            tt.2,
            it.0,
            it.1,
            it.2,
            tk.0,
            tk.1,
            tk.2,
            tot.0,
            tot.1,
            lag.1,
            s.failed + s.unmatched,
        );
        let ttft_goal = if n <= 4 { 2.0 } else { 5.0 };
        let mut goals = vec![
            format!(
                "TTFT err p99 {:.2} ms <= {ttft_goal} ms: {}",
                tt.1,
                verdict(tt.1, ttft_goal, true)
            ),
            format!(
                "ITL err p99 {:.3} ms <= 2 ms: {}",
                it.1,
                verdict(it.1.abs(), 2.0, true)
            ),
        ];
        if n >= 256 {
            goals.push(format!(
                "delivered {:.1} % >= 100 %: {}",
                delivered * 100.0,
                verdict(delivered, 0.995, false)
            ));
        }
        println!(
            "      n={} requests ({} ok), client CPU {:.2} s (process − simulator thread {:.2} s); {}",
            s.ok + s.failed,
            s.ok,
            cpu - sim_cpu,
            sim_cpu,
            goals.join("; ")
        );
        emit_json(
            &args.json,
            serde_json::json!({
                "bench": "accuracy", "streams": n, "osl": osl, "rate_rps": rate,
                "delivered_ratio": delivered,
                "ttft_err_ms": {"p50": tt.0, "p99": tt.1, "max": tt.2},
                "itl_err_ms": {"p50": it.0, "p99": it.1, "max": it.2},
                "token_stamp_err_ms": {"p50": tk.0, "p99": tk.1, "max": tk.2},
                "ttft_minus_configured_ms": {"p50": tot.0, "p99": tot.1, "max": tot.2},
                "send_lag_ms": {"p50": lag.0, "p99": lag.1, "max": lag.2},
                "requests": s.ok + s.failed, "failed": s.failed, "unmatched": s.unmatched,
                "client_cpu_s": cpu - sim_cpu, "sim_cpu_s": sim_cpu,
                "machine": machine_state(),
            }),
        );
    }
}

async fn accuracy_level(
    addr: SocketAddr,
    sim: Option<Arc<SimHandle>>,
    n: u64,
    rate: f64,
    osl: u32,
    secs: f64,
) -> (AccuracySamples, u64, u64) {
    let side = Arc::new(ClientSide::new(addr));
    let labels = Arc::new(
        RequestLabels::new("sim-fixed", ServingMode::Aggregated, "concurrency_sweep")
            .with_concurrency(n as u32),
    );
    let samples = Arc::new(Mutex::new(AccuracySamples::default()));
    let start = Instant::now() + Duration::from_millis(50);
    let warm_end = start + Duration::from_secs(1);
    let send_end = warm_end + Duration::from_secs_f64(secs);
    let sent_in_window = Arc::new(AtomicU64::new(0));
    let mut intended_in_window = 0u64;
    let schedule =
        ArrivalSchedule::new(ArrivalProcess::Constant { rate }, start, 7).expect("valid rate");
    let mut tasks = tokio::task::JoinSet::new();
    for (k, intended) in schedule.enumerate() {
        if intended >= send_end {
            break;
        }
        tokio::time::sleep_until(intended).await;
        let in_window = intended >= warm_end;
        intended_in_window += u64::from(in_window);
        let (side, labels, samples, sim) =
            (side.clone(), labels.clone(), samples.clone(), sim.clone());
        let sent_in_window = sent_in_window.clone();
        tasks.spawn(async move {
            let id = format!("acc-{n}-{k}");
            let req = ClientSide::request(id.clone(), osl);
            // Sending starts now; it counts as delivered when it happened inside the window.
            if in_window && Instant::now() < send_end {
                sent_in_window.fetch_add(1, Ordering::Relaxed);
            }
            let rec = side.send(&req, intended, &labels).await;
            if !in_window {
                return;
            }
            // The simulator files a request's send instants when its stream ends, which can be
            // just after the client saw `[DONE]`.
            let mut sends = None;
            for _ in 0..50 {
                let Some(sim) = &sim else { break };
                sends = sim.token_send_times(&id);
                if sends.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let mut s = samples.lock().expect("samples");
            s.lag_ms.push(ms(rec.sent - rec.intended));
            if rec.outcome != Outcome::Ok {
                s.failed += 1;
                return;
            }
            s.ok += 1;
            if let Some(client_ttft) = rec.ttft() {
                s.ttft_total_ms
                    .push(client_ttft.as_secs_f64() * 1e3 - 100.0);
            }
            if sim.is_none() {
                // An external simulator: against the configured timing, as AIPerf is judged.
                if let Some(client_itl) = rec.itl() {
                    s.itl_ms.push((client_itl.as_secs_f64() * 1e3 - 10.0).abs());
                }
                return;
            }
            let chunks: Vec<(Instant, u32)> = rec.content_chunks().collect();
            let Some(sends) = sends.filter(|t| t.len() == chunks.len() && t.len() >= 2) else {
                s.unmatched += 1;
                return;
            };
            s.ttft_stamp_ms.push(ms(chunks[0].0 - sends[0]));
            for ((at, _), sent) in chunks.iter().zip(&sends) {
                s.token_stamp_ms.push(signed_ms(*at, *sent));
            }
            let server_itl =
                (sends[sends.len() - 1] - sends[0]).as_secs_f64() / (sends.len() - 1) as f64;
            if let Some(client_itl) = rec.itl() {
                s.itl_ms
                    .push((client_itl.as_secs_f64() - server_itl).abs() * 1e3);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let samples = Arc::try_unwrap(samples)
        .ok()
        .expect("every task ended")
        .into_inner()
        .expect("samples");
    (
        samples,
        sent_in_window.load(Ordering::Relaxed),
        intended_in_window,
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn signed_ms(a: Instant, b: Instant) -> f64 {
    if a >= b { ms(a - b) } else { -ms(b - a) }
}

// ---------------------------------------------------------------------------------------------
// Throughput, RSS and soak: closed loop against the `fast` profile in a child process

struct SimProcess {
    child: Option<Child>,
    addr: SocketAddr,
}

impl SimProcess {
    fn start(profile: &str) -> Self {
        let exe = std::env::current_exe().expect("own path");
        let mut child = Command::new(exe)
            .args(["serve-sim", profile])
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .expect("simulator process starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("simulator prints its address");
        let addr = line.trim().parse().expect("an address");
        Self {
            child: Some(child),
            addr,
        }
    }

    /// A simulator this benchmark did not start; its CPU is not measured here.
    fn external(addr: SocketAddr) -> Self {
        Self { child: None, addr }
    }

    fn cpu_seconds(&self) -> f64 {
        self.child
            .as_ref()
            .map_or(f64::NAN, |c| process_cpu_seconds(&c.id().to_string()))
    }
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            // Closing its stdin tells the simulator to exit.
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

/// The child: one simulator on a current-thread runtime (one core at most), until stdin closes.
fn serve_sim(profile: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("simulator runtime");
    rt.block_on(async {
        let spec = SimSpec {
            profile: profile.into(),
            // The zero-delay engine should never be the queue: let every stream run at once.
            max_running: 4096,
            ..SimSpec::default()
        };
        let handle = llm_canary::sim::start(
            spec,
            ServingMode::Aggregated,
            "127.0.0.1:0".parse().expect("addr"),
        )
        .await
        .expect("simulator starts");
        println!("{}", handle.local_addr());
        std::io::stdout().flush().expect("stdout");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            let _ = tx.send(());
        });
        let _ = rx.await;
        handle.shutdown().await;
    });
}

struct LoopTotals {
    tokens: AtomicU64,
    requests: AtomicU64,
    failed: AtomicU64,
    /// Counting only between warmup and the end of the window.
    counting: AtomicBool,
    stop: AtomicBool,
}

/// N closed-loop workers sending back to back until `stop`.
fn spawn_closed_loop(
    rt: &tokio::runtime::Runtime,
    side: Arc<ClientSide>,
    n: u64,
    osl: u32,
    totals: Arc<LoopTotals>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let labels = Arc::new(
        RequestLabels::new("sim-fast", ServingMode::Aggregated, "concurrency_sweep")
            .with_concurrency(n as u32),
    );
    (0..n)
        .map(|w| {
            let (side, labels, totals) = (side.clone(), labels.clone(), totals.clone());
            rt.spawn(async move {
                let mut k = 0u64;
                while !totals.stop.load(Ordering::Relaxed) {
                    let req = ClientSide::request(format!("tp-{w}-{k}"), osl);
                    k += 1;
                    let rec = side.send(&req, Instant::now(), &labels).await;
                    if totals.counting.load(Ordering::Relaxed) {
                        if rec.outcome.is_ok() {
                            totals
                                .tokens
                                .fetch_add(rec.output_tokens(), Ordering::Relaxed);
                            totals.requests.fetch_add(1, Ordering::Relaxed);
                        } else {
                            totals.failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect()
}

struct ThroughputResult {
    tokens_per_s: f64,
    requests_per_s: f64,
    client_cpu_per_m: f64,
    sim_cpu_per_m: f64,
    failed: u64,
    peak_rss_mib: f64,
}

fn closed_loop_run(
    n: u64,
    osl: u32,
    secs: f64,
    threads: usize,
    addr: Option<SocketAddr>,
    profile: &str,
) -> ThroughputResult {
    let sim = addr.map_or_else(|| SimProcess::start(profile), SimProcess::external);
    let rt = client_runtime(threads);
    let side = Arc::new(ClientSide::new(sim.addr));
    let totals = Arc::new(LoopTotals {
        tokens: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        counting: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let workers = spawn_closed_loop(&rt, side.clone(), n, osl, totals.clone());
    // Warmup: connections open, allocator and registry settle.
    rt.block_on(async { tokio::time::sleep(Duration::from_secs(2)).await });
    let (cpu0, sim_cpu0, t0) = (
        process_cpu_seconds("self"),
        sim.cpu_seconds(),
        Instant::now(),
    );
    totals.counting.store(true, Ordering::Relaxed);
    rt.block_on(async { tokio::time::sleep(Duration::from_secs_f64(secs)).await });
    totals.counting.store(false, Ordering::Relaxed);
    let (cpu1, sim_cpu1, wall) = (
        process_cpu_seconds("self"),
        sim.cpu_seconds(),
        t0.elapsed().as_secs_f64(),
    );
    totals.stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for w in workers {
            let _ = w.await;
        }
    });
    let peak_rss_mib = status_mib("self", "VmHWM:");
    let tokens = totals.tokens.load(Ordering::Relaxed) as f64;
    drop(side);
    drop(rt);
    drop(sim);
    ThroughputResult {
        tokens_per_s: tokens / wall,
        requests_per_s: totals.requests.load(Ordering::Relaxed) as f64 / wall,
        client_cpu_per_m: (cpu1 - cpu0) / tokens * 1e6,
        sim_cpu_per_m: (sim_cpu1 - sim_cpu0) / tokens * 1e6,
        failed: totals.failed.load(Ordering::Relaxed),
        peak_rss_mib,
    }
}

fn throughput(args: &Args) {
    let osl = if args.osl == 0 { 256 } else { args.osl };
    let secs = if args.secs == 0.0 { 10.0 } else { args.secs };
    let threads = args.client_threads.unwrap_or(2);
    let levels = if args.streams.is_empty() {
        vec![64, 512]
    } else {
        args.streams.clone()
    };
    println!(
        "# throughput: simulator `fast` in a child process (one core at most), OSL {osl}, closed \
         loop, {secs} s measured after 2 s warmup, client runtime {threads} worker(s); {}",
        machine_state()
    );
    for n in levels {
        // Each level in a fresh process would isolate peak RSS; `rss` does that for one level.
        let r = closed_loop_run(n, osl, secs, threads, args.addr, &args.profile);
        println!(
            "N={n:>4}: {:>9.0} tokens/s, {:>7.1} requests/s, client {:.2} CPU-s per 1M tokens \
             ({}), simulator {:.2} CPU-s per 1M tokens, failed {}; tokens/s >= 300k: {}",
            r.tokens_per_s,
            r.requests_per_s,
            r.client_cpu_per_m,
            verdict(r.client_cpu_per_m, 3.0, true),
            r.sim_cpu_per_m,
            r.failed,
            verdict(r.tokens_per_s, 300_000.0, false),
        );
        emit_json(
            &args.json,
            serde_json::json!({
                "bench": "throughput", "streams": n, "osl": osl,
                "tokens_per_s": r.tokens_per_s, "requests_per_s": r.requests_per_s,
                "client_cpu_s_per_m_tokens": r.client_cpu_per_m,
                "sim_cpu_s_per_m_tokens": r.sim_cpu_per_m, "failed": r.failed,
                "client_threads": threads, "machine": machine_state(),
            }),
        );
    }
}

fn rss(args: &Args) {
    let osl = if args.osl == 0 { 256 } else { args.osl };
    let secs = if args.secs == 0.0 { 10.0 } else { args.secs };
    let threads = args.client_threads.unwrap_or(2);
    let n = args.streams.first().copied().unwrap_or(1024);
    println!(
        "# rss: {n} concurrent streams, closed loop against `{}` (child process), OSL {osl}, \
         {secs} s; {}",
        args.profile,
        machine_state()
    );
    let r = closed_loop_run(n, osl, secs, threads, args.addr, &args.profile);
    println!(
        "peak RSS (VmHWM) {:.1} MiB at {n} streams ({}); {:.0} tokens/s, client {:.2} CPU-s per 1M \
         tokens, failed {}",
        r.peak_rss_mib,
        verdict(r.peak_rss_mib, 64.0, true),
        r.tokens_per_s,
        r.client_cpu_per_m,
        r.failed
    );
    emit_json(
        &args.json,
        serde_json::json!({
            "bench": "rss", "streams": n, "profile": args.profile, "peak_rss_mib": r.peak_rss_mib,
            "tokens_per_s": r.tokens_per_s, "machine": machine_state(),
        }),
    );
}

/// Full tilt for `secs`, RSS sampled every second, a scrape-sized encode of `/metrics` every
/// 15 s (what Prometheus would cause); growth after the first minute is reported.
fn soak(args: &Args) {
    let osl = if args.osl == 0 { 256 } else { args.osl };
    let secs = if args.secs == 0.0 { 600.0 } else { args.secs };
    let threads = args.client_threads.unwrap_or(2);
    let n = args.streams.first().copied().unwrap_or(512);
    println!(
        "# soak: {n} streams closed loop against `fast` (child process), OSL {osl}, {secs} s, RSS \
         every second; {}",
        machine_state()
    );
    let sim = SimProcess::start(&args.profile);
    let rt = client_runtime(threads);
    let side = Arc::new(ClientSide::new(sim.addr));
    let totals = Arc::new(LoopTotals {
        tokens: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        counting: AtomicBool::new(true),
        stop: AtomicBool::new(false),
    });
    let workers = spawn_closed_loop(&rt, side.clone(), n, osl, totals.clone());
    let t0 = Instant::now();
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut next = 1.0;
    while next <= secs {
        let wait = next - t0.elapsed().as_secs_f64();
        if wait > 0.0 {
            rt.block_on(async { tokio::time::sleep(Duration::from_secs_f64(wait)).await });
        }
        let rss = status_mib("self", "VmRSS:");
        samples.push((next, rss));
        if (next as u64) % 15 == 0 {
            let text = side.metrics.encode().expect("encodes");
            std::hint::black_box(text.len());
        }
        if (next as u64) % 30 == 0 {
            println!(
                "t={next:>5.0} s RSS {rss:>6.1} MiB, {} requests, {:.0} tokens/s so far",
                totals.requests.load(Ordering::Relaxed),
                totals.tokens.load(Ordering::Relaxed) as f64 / next
            );
        }
        next += 1.0;
    }
    totals.stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for w in workers {
            let _ = w.await;
        }
    });
    drop(sim);
    // Warmup: the first minute (or the first tenth of a short run).
    let warm = (secs / 10.0).min(60.0);
    let steady: Vec<(f64, f64)> = samples.iter().copied().filter(|(t, _)| *t > warm).collect();
    let (slope, first, last) = growth(&steady);
    let mut rss: Vec<f64> = steady.iter().map(|s| s.1).collect();
    let (p50, _, max) = spread(&mut rss);
    let min = rss.first().copied().unwrap_or(f64::NAN);
    println!(
        "after {warm:.0} s warmup: RSS min {min:.1} / median {p50:.1} / max {max:.1} MiB; median of \
         the first vs last minute {first:.1} -> {last:.1} MiB; fitted slope {:.3} MiB per minute; \
         {} requests ({} failed)",
        slope * 60.0,
        totals.requests.load(Ordering::Relaxed),
        totals.failed.load(Ordering::Relaxed)
    );
    emit_json(
        &args.json,
        serde_json::json!({
            "bench": "soak", "streams": n, "secs": secs, "rss_min_mib": min, "rss_median_mib": p50,
            "rss_max_mib": max, "first_minute_mib": first, "last_minute_mib": last,
            "slope_mib_per_min": slope * 60.0, "samples": samples, "machine": machine_state(),
        }),
    );
}

/// Least-squares slope (MiB per second) and the medians of the first and last 60 samples.
fn growth(samples: &[(f64, f64)]) -> (f64, f64, f64) {
    let n = samples.len() as f64;
    if n < 2.0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mt = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let mr = samples.iter().map(|s| s.1).sum::<f64>() / n;
    let cov: f64 = samples.iter().map(|s| (s.0 - mt) * (s.1 - mr)).sum();
    let var: f64 = samples.iter().map(|s| (s.0 - mt).powi(2)).sum();
    let median = |part: &[(f64, f64)]| {
        let mut v: Vec<f64> = part.iter().map(|s| s.1).collect();
        spread(&mut v).0
    };
    let k = samples.len().min(60);
    (
        cov / var,
        median(&samples[..k]),
        median(&samples[samples.len() - k..]),
    )
}

fn main() {
    // The child process of `SimProcess::start`: `serve-sim PROFILE`.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("serve-sim") {
        serve_sim(argv.get(2).map_or("fast", String::as_str));
        return;
    }
    let Some(argv) = bench_args::bench_args(
        "cargo bench --bench client -- accuracy|throughput|rss|soak [--streams N,..] [--secs S]",
    ) else {
        return;
    };
    let args = parse_args(argv);
    match args.mode.as_str() {
        "accuracy" => accuracy(&args),
        "throughput" => throughput(&args),
        "rss" => rss(&args),
        "soak" => soak(&args),
        other => {
            eprintln!("unknown mode {other}: accuracy | throughput | rss | soak");
            std::process::exit(2);
        }
    }
}
