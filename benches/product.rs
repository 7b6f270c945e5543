//! The product-path benchmark: what users run, measured against a server in another process.
//! `llm-canary sim` runs as its own process and writes every token's send instant to its
//! `--send-log`; `llm-canary bench` runs as another, writing `requests.jsonl`; the two are joined
//! per request on `x-request-id` (both in CLOCK_MONOTONIC nanoseconds). Every figure is printed
//! next to its goal; docs/PERFORMANCE.md quotes the results.
//!
//! ```text
//! cargo bench --bench product [-- --secs 12] [--only paced|zero-delay] [--json FILE]
//! ```
//!
//! Cases, each a fresh simulator and a fresh `bench` process (one concurrency step, closed loop,
//! no warmup, so a step's first second is measured too):
//! - **paced**, 256 and 1024 streams against the `fixed` profile (TTFT 100 ms, ITL 10 ms, ISL 64,
//!   OSL 32): TTFT error = the client's TTFT − the server's (first token handed to the connection
//!   − the request's arrival at the server's host, the kernel's receive stamp, which the send
//!   log carries beside the moment the simulator read it), per request; ITL error = |the client's mean ITL − the server's|. Steady
//!   state is what was intended from 2 s after the step's first request; the first second is
//!   reported on its own (the connection storm). Delivered = requests/s in steady state ÷ what
//!   N streams at the configured 410 ms per request can send.
//! - **paced, one write per event**, 1024 streams, the same but the simulator writes every SSE
//!   event on its own (`--write-per-event`: the role chunk, each token, the finish and usage
//!   chunks and `[DONE]` each one HTTP chunk and one write), as vLLM's and Dynamo's frontends do:
//!   more reads per token for the client.
//! - **zero-delay**, 512 and 1024 streams against the `fast` profile (OSL 256) on one runtime
//!   thread (`--threads 1`, the cheapest server, so the client under test has the most of the
//!   shared cores; the paced cases keep one thread per core, which answers a burst of requests
//!   sooner): streamed tokens/s (every token of every successful request over the step) and CPU
//!   per 1M tokens.
//!
//! Cost is the `bench` process's own, sampled from `/proc/PID` every 20 ms until it exits: CPU
//! seconds (user + system) over the whole run and the peak RSS (`VmHWM`). The simulator's CPU is
//! reported beside it: both share the machine's cores.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

#[path = "support/args.rs"]
mod bench_args;
#[path = "support/measure.rs"]
mod measure;
use measure::{emit_json, machine_state, process_cpu_seconds, quantile, status_mib, verdict};

const USAGE: &str =
    "cargo bench --bench product [-- --secs 12] [--only paced|zero-delay] [--json FILE]";
const BIN: &str = env!("CARGO_BIN_EXE_llm-canary");
/// The `fixed` profile's TTFT and ITL, and the paced case's output length.
const TTFT_MS: f64 = 100.0;
const ITL_MS: f64 = 10.0;
const PACED_OSL: u32 = 32;
/// Steady state begins this long after the step's first intended send.
const STEADY_AFTER_S: f64 = 2.0;

struct Args {
    secs: u64,
    only: Option<String>,
    json: Option<String>,
}

fn parse_args(argv: Vec<String>) -> Args {
    let mut args = Args {
        secs: 12,
        only: None,
        json: None,
    };
    let mut it = argv.into_iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| panic!("{a} needs a value; {USAGE}"))
        };
        match a.as_str() {
            "--secs" => args.secs = value().parse().expect("--secs N"),
            "--only" => args.only = Some(value()),
            "--json" => args.json = Some(value()),
            other => panic!("unknown argument {other}; {USAGE}"),
        }
    }
    args
}

/// A process that is sent SIGINT and reaped when dropped.
struct Proc(Child);

impl Proc {
    fn pid(&self) -> String {
        self.0.id().to_string()
    }

    fn interrupt(&mut self) {
        let _ = Command::new("kill").args(["-INT", &self.pid()]).status();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            self.interrupt();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `llm-canary sim` on a port of its own; returns once it accepts connections.
async fn start_sim(
    profile: &str,
    extra: &[&str],
    port: u16,
    send_log: Option<&Path>,
    dir: &Path,
) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.args(["sim", "--profile", profile])
        .args(extra)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("sim.log")).expect("sim log"));
    if let Some(path) = send_log {
        cmd.arg("--send-log").arg(path);
    }
    let child = Proc(cmd.spawn().expect("llm-canary sim starts"));
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return child;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("llm-canary sim did not listen on {port}");
}

/// What a `bench` process cost, sampled from `/proc` until it exited.
struct Cost {
    cpu_s: f64,
    peak_rss_mib: f64,
    sim_cpu_s: f64,
    wall_s: f64,
}

/// Runs `llm-canary bench` on `config`, sampling its CPU and peak RSS (and the simulator's CPU).
async fn run_bench(config: &Path, out: &Path, sim: &Proc) -> Cost {
    let started = tokio::time::Instant::now();
    let sim_cpu0 = process_cpu_seconds(&sim.pid());
    let mut child = Command::new(BIN)
        .arg("bench")
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(out)
        .stdout(std::fs::File::create(out.with_extension("txt")).expect("bench output"))
        .stderr(Stdio::null())
        .spawn()
        .expect("llm-canary bench starts");
    let pid = child.id().to_string();
    let (mut cpu_s, mut peak_rss_mib) = (0.0, 0.0f64);
    loop {
        // Sampled before checking for the exit, so the last sample is at most 20 ms old.
        let cpu = process_cpu_seconds(&pid);
        let rss = status_mib(&pid, "VmHWM:");
        if cpu > 0.0 {
            cpu_s = cpu;
        }
        if rss.is_finite() {
            peak_rss_mib = peak_rss_mib.max(rss);
        }
        if let Some(status) = child.try_wait().expect("bench waits") {
            assert!(status.success(), "llm-canary bench failed: {status}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Cost {
        cpu_s,
        peak_rss_mib,
        sim_cpu_s: process_cpu_seconds(&sim.pid()) - sim_cpu0,
        wall_s: started.elapsed().as_secs_f64(),
    }
}

fn write_config(dir: &Path, port: u16, streams: u32, osl: u32, secs: u64) -> PathBuf {
    let path = dir.join(format!("c{streams}-osl{osl}.yaml"));
    let text = format!(
        "targets:\n  - {{ name: sim, serving_mode: aggregated, url: 'http://127.0.0.1:{port}', \
         model: Qwen/Qwen3-30B-A3B-FP8 }}\n\
         time_scale: 1.0\n\
         workloads:\n  concurrency_sweep: {{ levels: [{streams}], isl: 64, osl: {osl}, \
         step: {secs}s, warmup: 0s }}\n\
         schedule:\n  cycle: [concurrency_sweep]\n"
    );
    std::fs::write(&path, text).expect("config written");
    path
}

/// The fields of a `requests.jsonl` line this benchmark reads.
#[derive(Deserialize)]
struct Line {
    x_request_id: String,
    outcome: String,
    intended_start_mono_ns: u64,
    start_mono_ns: u64,
    end_mono_ns: u64,
    ttft_ms: Option<f64>,
    itl_ms: Option<f64>,
    completion_tokens: Option<u64>,
}

/// A line of the simulator's `--send-log`.
#[derive(Deserialize)]
struct Sent {
    x_request_id: String,
    /// When the request came to the simulator's host (the kernel's stamp); absent where the
    /// kernel gives none, and then `received_mono_ns`, when the simulator read it, stands in.
    arrived_mono_ns: Option<u64>,
    received_mono_ns: u64,
    token_mono_ns: Vec<u64>,
}

fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Vec<T> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::io::BufReader::new(file)
        .lines()
        .map(|l| serde_json::from_str(&l.expect("a line")).expect("a JSON line"))
        .collect()
}

/// The connections the run's step opened, from `summary.json`: opened, and the connect time's p50,
/// p99 and max in ms.
fn connections(out: &Path) -> Option<(u64, f64, f64, f64)> {
    let text = std::fs::read_to_string(out.join("summary.json")).ok()?;
    let summary: serde_json::Value = serde_json::from_str(&text).ok()?;
    let c = summary["steps"]
        .as_array()?
        .iter()
        .find_map(|s| s.get("connections"))?;
    let ms = |k: &str| c[k].as_f64().map_or(f64::NAN, |s| s * 1e3);
    Some((
        c["opened"].as_u64()?,
        ms("connect_p50_seconds"),
        ms("connect_p99_seconds"),
        ms("connect_max_seconds"),
    ))
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn p(v: &[f64], q: f64) -> f64 {
    quantile(v, q)
}

fn case_dir(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("case directory");
    dir
}

/// How the simulator writes a paced case's stream.
#[derive(Clone, Copy, PartialEq)]
enum Writes {
    /// The events already waiting share a write (the simulator's default).
    Shared,
    /// Every event its own write (`--write-per-event`), as vLLM's and Dynamo's frontends send:
    /// the role chunk, each token, the finish chunk, the usage chunk and `[DONE]`.
    PerEvent,
}

async fn paced(root: &Path, streams: u32, writes: Writes, secs: u64, json: &Option<String>) {
    let (name, extra): (&str, &[&str]) = match writes {
        Writes::Shared => ("paced", &[]),
        Writes::PerEvent => ("paced-per-event", &["--write-per-event"]),
    };
    let dir = case_dir(root, &format!("{name}-{streams}"));
    let port = free_port();
    let send_log = dir.join("send.jsonl");
    let mut sim = start_sim("fixed", extra, port, Some(&send_log), &dir).await;
    let config = write_config(&dir, port, streams, PACED_OSL, secs);
    let out = dir.join("out");
    let cost = run_bench(&config, &out, &sim).await;
    sim.interrupt();

    let sent: HashMap<String, Sent> = read_lines::<Sent>(&send_log)
        .into_iter()
        .map(|s| (s.x_request_id.clone(), s))
        .collect();
    let lines: Vec<Line> = read_lines(&out.join("requests.jsonl"));
    let t0 = lines
        .iter()
        .map(|l| l.intended_start_mono_ns)
        .min()
        .expect("requests");
    let (mut first, mut steady, mut itl, mut connect) = (vec![], vec![], vec![], vec![]);
    let mut read_late = vec![];
    let (mut ok, mut failed, mut unmatched, mut steady_n, mut tokens) = (0u64, 0u64, 0u64, 0u64, 0);
    let mut steady_end = t0;
    for l in &lines {
        if l.outcome != "ok" {
            failed += 1;
            continue;
        }
        ok += 1;
        tokens += l.completion_tokens.unwrap_or(0);
        let Some(s) = sent.get(&l.x_request_id) else {
            unmatched += 1;
            continue;
        };
        let (Some(ttft), Some(&first_sent)) = (l.ttft_ms, s.token_mono_ns.first()) else {
            unmatched += 1;
            continue;
        };
        let at = (l.intended_start_mono_ns - t0) as f64 / 1e9;
        // The server's TTFT runs from the request's arrival at its host: a simulator that reads
        // it late, busy on the client's cores, is a slow server, not a wrong client.
        let arrived = s.arrived_mono_ns.unwrap_or(s.received_mono_ns);
        let error = ttft - (first_sent - arrived) as f64 / 1e6;
        if at < 1.0 {
            first.push(error);
            // Send → the server's host has the request: connect (if any) and transit.
            connect.push((arrived as f64 - l.start_mono_ns as f64) / 1e6);
        } else if at >= STEADY_AFTER_S {
            steady.push(error);
            read_late.push(s.received_mono_ns.saturating_sub(arrived) as f64 / 1e6);
            steady_n += 1;
            steady_end = steady_end.max(l.intended_start_mono_ns);
            let n = s.token_mono_ns.len();
            if let (Some(client), true) = (l.itl_ms, n >= 2) {
                let server =
                    (s.token_mono_ns[n - 1] - s.token_mono_ns[0]) as f64 / 1e6 / (n - 1) as f64;
                itl.push((client - server).abs());
            }
        }
    }
    let (first, steady, itl, connect, read_late) = (
        sorted(first),
        sorted(steady),
        sorted(itl),
        sorted(connect),
        sorted(read_late),
    );
    let steady_s = (steady_end - t0) as f64 / 1e9 - STEADY_AFTER_S;
    let request_s = (TTFT_MS + ITL_MS * f64::from(PACED_OSL - 1)) / 1e3;
    let delivered = steady_n as f64 / steady_s / (f64::from(streams) / request_s);
    let cpu_per_m = cost.cpu_s / (tokens as f64 / 1e6);
    let ttft_goal = 2.0;
    let written = match writes {
        Writes::Shared => "",
        Writes::PerEvent => ", one write per event",
    };
    println!(
        "\n{name}, {streams} streams (TTFT {TTFT_MS} ms, ITL {ITL_MS} ms, OSL {PACED_OSL}, {secs} s, no warmup{written}), {}",
        machine_state()
    );
    println!(
        "  requests {ok} ok, {failed} failed, {unmatched} without a server record; delivered {:.1} % (goal 100 %: {})",
        delivered * 100.0,
        verdict(delivered, 0.995, false)
    );
    println!(
        "  TTFT error, steady (n={}):  p50 {:.2} / p99 {:.2} / max {:.2} ms  (goal p99 <= {ttft_goal} ms: {})",
        steady.len(),
        p(&steady, 0.5),
        p(&steady, 0.99),
        steady.last().copied().unwrap_or(f64::NAN),
        verdict(p(&steady, 0.99), ttft_goal, true)
    );
    println!(
        "  (the simulator read the steady requests p50 {:.2} / p99 {:.2} ms after they came: its own lateness, charged to neither side)",
        p(&read_late, 0.5),
        p(&read_late, 0.99),
    );
    println!(
        "  ITL error, steady:          p50 {:.3} / p99 {:.3} ms  (goal p99 <= 1 ms: {})",
        p(&itl, 0.5),
        p(&itl, 0.99),
        verdict(p(&itl, 0.99), 1.0, true)
    );
    println!(
        "  TTFT error, first second (n={}): p50 {:.2} / p99 {:.2} ms  (goal p99 <= 5 ms: {}); send -> server's host has it p50 {:.2} / p99 {:.2} ms",
        first.len(),
        p(&first, 0.5),
        p(&first, 0.99),
        verdict(p(&first, 0.99), 5.0, true),
        p(&connect, 0.5),
        p(&connect, 0.99),
    );
    if let Some((opened, p50, p99, max)) = connections(&out) {
        println!(
            "  connections opened before the step: {opened}, connect p50 {p50:.3} / p99 {p99:.3} / max {max:.3} ms (the server's figure, kept out of TTFT)"
        );
    }
    println!(
        "  client: {:.2} CPU-s over {:.1} s, {cpu_per_m:.2} CPU-s per 1M tokens, peak RSS {:.1} MiB (goal <= 64 MiB: {}); simulator {:.2} CPU-s",
        cost.cpu_s,
        cost.wall_s,
        cost.peak_rss_mib,
        verdict(cost.peak_rss_mib, 64.0, true),
        cost.sim_cpu_s
    );
    emit_json(
        json,
        serde_json::json!({
            "case": name, "streams": streams, "secs": secs, "ok": ok, "failed": failed,
            "delivered": delivered,
            "ttft_error_ms": {"p50": p(&steady, 0.5), "p99": p(&steady, 0.99), "max": steady.last()},
            "itl_error_ms": {"p50": p(&itl, 0.5), "p99": p(&itl, 0.99)},
            "first_second_ttft_error_ms": {"p50": p(&first, 0.5), "p99": p(&first, 0.99)},
            "client_cpu_s": cost.cpu_s, "cpu_s_per_m_tokens": cpu_per_m,
            "peak_rss_mib": cost.peak_rss_mib, "sim_cpu_s": cost.sim_cpu_s,
            "machine": machine_state(),
        }),
    );
}

async fn zero_delay(root: &Path, streams: u32, secs: u64, json: &Option<String>) {
    let osl = 256;
    let dir = case_dir(root, &format!("zero-delay-{streams}"));
    let port = free_port();
    let sim = start_sim("fast", &["--threads", "1"], port, None, &dir).await;
    let config = write_config(&dir, port, streams, osl, secs);
    let out = dir.join("out");
    let cost = run_bench(&config, &out, &sim).await;
    drop(sim);
    let lines: Vec<Line> = read_lines(&out.join("requests.jsonl"));
    let ok: Vec<&Line> = lines.iter().filter(|l| l.outcome == "ok").collect();
    let tokens: u64 = ok.iter().map(|l| l.completion_tokens.unwrap_or(0)).sum();
    let start = ok.iter().map(|l| l.start_mono_ns).min().unwrap_or(0);
    let end = ok.iter().map(|l| l.end_mono_ns).max().unwrap_or(0);
    let tokens_per_s = tokens as f64 / ((end - start) as f64 / 1e9);
    let cpu_per_m = cost.cpu_s / (tokens as f64 / 1e6);
    println!(
        "\nzero-delay, {streams} streams (OSL {osl}, {secs} s), {}",
        machine_state()
    );
    println!(
        "  requests {} ok, {} failed; {tokens_per_s:.0} streamed tokens/s; client {:.2} CPU-s per 1M tokens ({:.2} CPU-s over {:.1} s), simulator {:.2} CPU-s per 1M tokens",
        ok.len(),
        lines.len() - ok.len(),
        cpu_per_m,
        cost.cpu_s,
        cost.wall_s,
        cost.sim_cpu_s / (tokens as f64 / 1e6)
    );
    println!(
        "  client peak RSS {:.1} MiB (goal <= 64 MiB: {})",
        cost.peak_rss_mib,
        verdict(cost.peak_rss_mib, 64.0, true)
    );
    emit_json(
        json,
        serde_json::json!({
            "case": "zero-delay", "streams": streams, "secs": secs, "ok": ok.len(),
            "tokens_per_s": tokens_per_s, "cpu_s_per_m_tokens": cpu_per_m,
            "peak_rss_mib": cost.peak_rss_mib, "sim_cpu_s": cost.sim_cpu_s,
            "machine": machine_state(),
        }),
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(argv) = bench_args::bench_args(USAGE) else {
        return;
    };
    let args = parse_args(argv);
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("product-bench");
    println!(
        "llm-canary product-path benchmark: {BIN} (bench) against `llm-canary sim` in another process; files under {}",
        root.display()
    );
    let want = |case: &str| args.only.as_deref().is_none_or(|o| o == case);
    if want("paced") {
        for streams in [256, 1024] {
            paced(&root, streams, Writes::Shared, args.secs, &args.json).await;
        }
        paced(&root, 1024, Writes::PerEvent, args.secs, &args.json).await;
    }
    if want("zero-delay") {
        for streams in [512, 1024] {
            zero_delay(&root, streams, args.secs, &args.json).await;
        }
    }
}
