//! Scrape benchmark of the `/metrics` exposition. First the series budget, through the path users
//! run: the daemon (`llm-canary run`, another process) runs one cycle of the seed plan
//! (`examples/seed-plan.yaml`) on two embedded simulators, at the standard and at the high
//! resolution, and the samples and bytes of one scrape are counted (goal: ≤ 3,000 samples and
//! ≤ 512 KiB at the standard resolution). Then the timings: the metrics filled with every series
//! the plan can make on two targets (every outcome on every label set), `Metrics::encode_chunks()`
//! and HTTP scrapes are timed, and the record path while scrapes run.
//!
//! The latency histograms re-render only the series that changed since the previous scrape
//! (`LatencyFamily` in `src/export/metrics.rs`), so three cases are timed: the steady state of a
//! running daemon (the step in progress of each target records requests between scrapes), every
//! series changed (the worst case after warmup), and the first scrape (nothing rendered yet).
//! During the HTTP scrapes a task records 5,000 requests/s into the steps in progress, more than
//! the client sustains against the zero-delay simulator at OSL 256.
//!
//! Run with `cargo bench --bench scrape`. Goal: scrape p99 ≤ 5 ms, at either resolution.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use llm_canary::config::{Resolution, ServingMode};
use llm_canary::export::{AppState, HttpServer, Metrics};
use llm_canary::model::Phase;
use llm_canary::request::RequestLabels;
use llm_canary::request::{Outcome, Sample};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[path = "support/args.rs"]
mod args;
#[path = "support/series.rs"]
mod series;

use series::{fill, step_labels};

const ITERATIONS: usize = 1000;
/// The scrape goal (docs/PERFORMANCE.md), for the full series set of either resolution.
const GOAL_P99_MS: f64 = 5.0;
struct Summary {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn summarise(mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Summary {
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
    }
}

fn print(what: &str, s: &Summary) {
    println!(
        "{what:<28} p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms",
        s.p50.as_secs_f64() * 1e3,
        s.p99.as_secs_f64() * 1e3,
        s.max.as_secs_f64() * 1e3
    );
}

/// A minimal keep-alive `GET /metrics` client over one connection.
struct Scraper {
    conn: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl Scraper {
    async fn connect(addr: std::net::SocketAddr) -> anyhow::Result<Self> {
        let conn = tokio::net::TcpStream::connect(addr).await?;
        conn.set_nodelay(true)?;
        Ok(Self {
            conn,
            buf: Vec::with_capacity(16 << 20),
        })
    }

    /// The body of one scrape (the daemon answers with a `content-length`).
    async fn get_metrics(&mut self) -> anyhow::Result<&[u8]> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.conn
            .write_all(b"GET /metrics HTTP/1.1\r\nhost: bench\r\naccept: application/openmetrics-text\r\n\r\n")
            .await?;
        self.buf.clear();
        let mut head_end = None;
        let mut total = usize::MAX;
        while self.buf.len() < total {
            if self.buf.capacity() - self.buf.len() < 64 * 1024 {
                self.buf.reserve(1 << 20);
            }
            let n = self.conn.read_buf(&mut self.buf).await?;
            anyhow::ensure!(n > 0, "connection closed mid-response");
            if head_end.is_none() {
                if let Some(at) = memchr::memmem::find(&self.buf, b"\r\n\r\n") {
                    let head = std::str::from_utf8(&self.buf[..at])?.to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .ok_or_else(|| anyhow::anyhow!("no content-length"))?
                        .trim()
                        .parse()?;
                    head_end = Some(at + 4);
                    total = at + 4 + length;
                }
            }
        }
        Ok(&self.buf[head_end.unwrap_or(0)..])
    }
}

/// The series budget of the standard resolution (docs/METRICS.md).
const MAX_SAMPLES: usize = 3000;
const MAX_BYTES: usize = 512 * 1024;

/// One scrape of the daemon after one cycle of the seed plan on two embedded simulators at
/// `resolution`: (samples, bytes).
async fn seed_plan_scrape(resolution: Resolution) -> anyhow::Result<(usize, usize)> {
    let seed = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/seed-plan.yaml");
    let mut cfg = llm_canary::config::Config::load(std::path::Path::new(seed))?;
    let demo = llm_canary::config::Config::demo();
    // The seed plan's steps, SLOs and names on the demo's simulated deployments (zero-delay:
    // only the series matter here), compressed to a cycle of about half a minute.
    for (t, d) in cfg.targets.iter_mut().zip(&demo.targets) {
        let mut sim = d
            .simulated
            .clone()
            .expect("the demo's targets are simulated");
        sim.value.profile = "fast".into();
        t.url = None;
        t.model = "auto".into();
        t.server_metrics.clear();
        t.simulated = Some(sim);
    }
    cfg.time_scale = llm_canary::config::At::dflt(0.01);
    cfg.discovery = None;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("seed-sim.yaml");
    cfg.export.resolution = resolution;
    std::fs::write(&path, serde_saphyr::to_string(&cfg)?)?;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_llm-canary"))
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .env("LLM_CANARY_STATE_FILE", dir.path().join("state.json"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stderr = child.stderr.take().expect("piped");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
    let mut said = String::new();
    let addr = loop {
        let line = lines
            .next_line()
            .await?
            .ok_or_else(|| anyhow::anyhow!("the daemon exited before listening:\n{said}"))?;
        if let Some(at) = line.find("listening on ") {
            break line[at + "listening on ".len()..].trim().to_owned();
        }
        said.push_str(&line);
        said.push('\n');
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let http = llm_canary::client::http_client_builder().build()?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        anyhow::ensure!(Instant::now() < deadline, "no cycle in 10 minutes");
        let status: serde_json::Value = match http
            .get(format!("http://{addr}/api/v1/status"))
            .send()
            .await
        {
            Ok(r) => serde_json::from_str(&r.text().await?)?,
            Err(_) => serde_json::Value::Null,
        };
        if status["cycles_completed"].as_u64().unwrap_or(0) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let body = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    child.kill().await?;
    let samples = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    Ok((samples, body.len()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if args::bench_args("cargo bench --bench scrape").is_none() {
        return Ok(());
    }
    for resolution in [Resolution::Standard, Resolution::High] {
        let (samples, bytes) = seed_plan_scrape(resolution).await?;
        let goal = if resolution == Resolution::Standard {
            format!(
                "  (goal ≤ {MAX_SAMPLES} samples, ≤ {} KiB)",
                MAX_BYTES / 1024
            )
        } else {
            String::new()
        };
        println!(
            "seed plan, 2 targets, one cycle, resolution {:<8}: {samples:>6} samples, {:>7.1} KiB per scrape{goal}",
            format!("{resolution:?}"),
            bytes as f64 / 1024.0
        );
        if resolution == Resolution::Standard {
            anyhow::ensure!(
                samples <= MAX_SAMPLES && bytes <= MAX_BYTES,
                "over the series budget"
            );
        }
    }
    for resolution in [Resolution::Standard, Resolution::High] {
        time_scrapes(resolution).await?;
    }
    Ok(())
}

/// The full series set at `resolution`: the encode and HTTP scrape timings, and the record path
/// while scrapes run.
async fn time_scrapes(resolution: Resolution) -> anyhow::Result<()> {
    println!("\n-- timings at resolution {resolution:?}");
    let metrics = Arc::new(Metrics::with_resolution(&[0.1, 0.5, 2.0], resolution));
    let label_sets = fill(&metrics);
    let cold = Instant::now();
    let chunks = metrics.encode_chunks()?;
    let cold = cold.elapsed();
    let exposition = metrics.encode()?;
    anyhow::ensure!(chunks.iter().map(|c| c.len()).sum::<usize>() == exposition.len());
    let samples = exposition.lines().filter(|l| !l.starts_with('#')).count();
    println!(
        "every outcome on each of {label_sets} request label sets, {} TTFT buckets: {samples} samples, {:.1} KiB per scrape",
        metrics.latency_bounds().len(),
        exposition.len() as f64 / 1024.0
    );

    println!(
        "{:<28} {:>8.3} ms  (first scrape: every series rendered)",
        "encode_chunks() cold",
        cold.as_secs_f64() * 1e3
    );
    let in_progress = [
        RequestLabels::new("sim-agg", ServingMode::Aggregated, "concurrency_sweep")
            .with_concurrency(32),
        RequestLabels::new(
            "sim-disagg",
            ServingMode::Disaggregated,
            "concurrency_sweep",
        )
        .with_concurrency(32),
    ];
    let everything: Vec<RequestLabels> = step_labels("sim-agg", ServingMode::Aggregated)
        .into_iter()
        .chain(step_labels("sim-disagg", ServingMode::Disaggregated))
        .collect();
    for (what, changing) in [
        ("encode_chunks() steady", &in_progress[..]),
        ("encode_chunks() all changed", &everything[..]),
    ] {
        let mut encode = Vec::with_capacity(ITERATIONS);
        for _ in 0..ITERATIONS {
            for l in changing {
                metrics.record_request(
                    l,
                    Phase::Steady,
                    &Sample {
                        outcome: Outcome::Ok,
                        ttft: Some(0.2),
                        itl: Some(0.02),
                        latency: 3.0,
                        prompt_tokens: 1024,
                        output_tokens: 512,
                        ..Sample::default()
                    },
                );
            }
            let start = Instant::now();
            let text = metrics.encode_chunks()?;
            encode.push(start.elapsed());
            std::hint::black_box(text);
        }
        print(what, &summarise(encode));
    }

    let state = AppState::new(metrics.clone(), Arc::new(|| serde_json::json!({})));
    let server = HttpServer::bind("127.0.0.1:0".parse()?, state).await?;
    let addr = server.local_addr()?;
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(server.serve(shutdown.clone()));
    // The scraper is a plain keep-alive HTTP/1.1 client reading into one reused buffer, like
    // Prometheus' own: a client that re-aggregates 6 MiB through growing buffers (reqwest's
    // `bytes()` doubled the HTTP figure here) would measure itself, not the daemon.
    let mut scraper = Scraper::connect(addr).await?;

    // A recorder task runs through the scrapes (5 requests every millisecond into the steps in
    // progress), timing each record_request.
    let stop = Arc::new(AtomicBool::new(false));
    let recorder = {
        let metrics = metrics.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut took = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..5 {
                    let l = &in_progress[i % in_progress.len()];
                    let start = Instant::now();
                    metrics.record_request(
                        l,
                        Phase::Steady,
                        &Sample {
                            outcome: Outcome::Ok,
                            ttft: Some(0.2),
                            itl: Some(0.02),
                            latency: 3.0,
                            prompt_tokens: 1024,
                            output_tokens: 512,
                            ..Sample::default()
                        },
                    );
                    took.push(start.elapsed());
                    i += 1;
                }
            }
            took
        })
    };

    let mut scrape = Vec::with_capacity(ITERATIONS);
    for _ in 0..ITERATIONS {
        let start = Instant::now();
        let body = scraper.get_metrics().await?;
        scrape.push(start.elapsed());
        anyhow::ensure!(body.ends_with(b"# EOF\n"), "truncated exposition");
    }
    stop.store(true, Ordering::Relaxed);
    let record = recorder.await?;
    let scrape = summarise(scrape);
    print("HTTP scrape (GET + body)", &scrape);
    println!(
        "{:<28} p99 {:>8.3} ms  (goal ≤ {GOAL_P99_MS} ms: {})",
        "HTTP scrape p99 vs goal",
        scrape.p99.as_secs_f64() * 1e3,
        if scrape.p99.as_secs_f64() * 1e3 <= GOAL_P99_MS {
            "met"
        } else {
            "missed"
        }
    );
    let records = record.len();
    let record = summarise(record);
    println!(
        "{:<28} p50 {:>8.3} µs  p99 {:>8.3} µs  max {:>8.3} µs  ({records} calls during scrapes)",
        "record_request()",
        record.p50.as_secs_f64() * 1e6,
        record.p99.as_secs_f64() * 1e6,
        record.max.as_secs_f64() * 1e6
    );
    shutdown.cancel();
    serving.await?;
    Ok(())
}
