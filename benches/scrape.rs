//! Scrape benchmark of the `/metrics` exposition: fills the metrics with the full series set of
//! two targets running all four workloads of the default plan, then times `Metrics::encode_chunks()`
//! and HTTP scrapes, and the record path while scrapes run.
//!
//! The latency histograms re-render only the series that changed since the previous scrape
//! (`LatencyFamily` in `src/export/metrics.rs`), so three cases are timed: the steady state of a
//! running daemon (the step in progress of each target records requests between scrapes), every
//! series changed (the worst case after warmup), and the first scrape (nothing rendered yet).
//! During the HTTP scrapes a task records 5,000 requests/s into the steps in progress, more than
//! the client sustains against the zero-delay simulator at OSL 256.
//!
//! Run with `cargo bench --bench scrape`. Goal: scrape p99 ≤ 5 ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use llm_canary::config::ServingMode;
use llm_canary::export::{AppState, HttpServer, Metrics};
use llm_canary::model::RequestLabels;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[path = "support/args.rs"]
mod args;
#[path = "support/series.rs"]
mod series;

use series::{fill, step_labels};

const ITERATIONS: usize = 1000;
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if args::bench_args("cargo bench --bench scrape").is_none() {
        return Ok(());
    }
    let metrics = Arc::new(Metrics::new(&[0.1, 0.5, 2.0]));
    let label_sets = fill(&metrics);
    let cold = Instant::now();
    let chunks = metrics.encode_chunks()?;
    let cold = cold.elapsed();
    let exposition = metrics.encode()?;
    anyhow::ensure!(chunks.iter().map(|c| c.len()).sum::<usize>() == exposition.len());
    let samples = exposition.lines().filter(|l| !l.starts_with('#')).count();
    println!(
        "{label_sets} request label sets, {} latency buckets, {samples} samples, {:.2} MiB per scrape",
        metrics.latency_bounds().len(),
        exposition.len() as f64 / (1024.0 * 1024.0)
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
                metrics.record_request(l, "ok", Some(0.2), Some(0.02), Some(3.0), 1024, 0, 512);
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
                    metrics.record_request(l, "ok", Some(0.2), Some(0.02), Some(3.0), 1024, 0, 512);
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
    print("HTTP scrape (GET + body)", &summarise(scrape));
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
