//! Server-side overhead of the simulator: the `fast` profile (zero model delay) streams chat
//! completions over loopback to many concurrent keep-alive connections, and the server's own CPU
//! time is measured on the one thread that runs it.
//!
//! The server runs on a dedicated thread with a current-thread tokio runtime, so its CPU time is
//! that thread's (`/proc/thread-self/schedstat`, nanoseconds) and excludes the load generator,
//! which runs on other threads with a deliberately cheap raw-HTTP client.
//!
//! ```text
//! cargo bench --bench sim_throughput -- [streams] [requests_per_stream] [osl]
//! ```
//! Defaults: 128 streams × 8 requests × 1000 tokens = 1,024,000 tokens.

use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;

use llm_canary::config::ServingMode;
use llm_canary::sim::{SimSpec, start};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// CPU time of the calling thread in seconds (Linux `schedstat`: on-CPU nanoseconds).
fn thread_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |ns| ns / 1e9)
}

#[path = "support/args.rs"]
mod args;

fn arg(args: &[String], n: usize, default: u64) -> u64 {
    args.get(n).and_then(|a| a.parse().ok()).unwrap_or(default)
}

/// One keep-alive connection sending `requests` streaming requests back to back; returns the
/// token chunks it received.
async fn stream_client(addr: SocketAddr, requests: u64, osl: u64) -> std::io::Result<u64> {
    let mut conn = TcpStream::connect(addr).await?;
    conn.set_nodelay(true)?;
    let body = format!(
        "{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello world\"}}],\"stream\":true,\
         \"max_tokens\":{osl},\"min_tokens\":{osl},\"ignore_eos\":true}}"
    );
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let token_marker = memchr::memmem::Finder::new(b"\"content\":\" ");
    let mut tokens = 0;
    let mut buf = Vec::with_capacity(1 << 20);
    let mut chunk = vec![0u8; 256 * 1024];
    for _ in 0..requests {
        conn.write_all(request.as_bytes()).await?;
        buf.clear();
        // A response ends with `[DONE]` followed by the chunked-encoding terminator.
        loop {
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.ends_with(b"\r\n0\r\n\r\n")
                && memchr::memmem::find(&buf, b"data: [DONE]").is_some()
            {
                break;
            }
        }
        tokens += token_marker.find_iter(&buf).count() as u64;
    }
    Ok(tokens)
}

fn main() {
    let Some(args) = args::bench_args(
        "cargo bench --bench sim_throughput -- [streams] [requests_per_stream] [osl]",
    ) else {
        return;
    };
    let streams = arg(&args, 0, 128);
    let per_stream = arg(&args, 1, 8);
    let osl = arg(&args, 2, 1000);

    // The server thread: a current-thread runtime, so all simulator work is on this thread.
    let (addr_tx, addr_rx) = std_mpsc::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("server runtime");
        rt.block_on(async move {
            let spec = SimSpec {
                profile: "fast".into(),
                ..SimSpec::default()
            };
            let handle = start(
                spec,
                ServingMode::Aggregated,
                "127.0.0.1:0".parse().unwrap(),
            )
            .await
            .expect("simulator starts");
            let cpu_start = thread_cpu_seconds();
            addr_tx
                .send(handle.local_addr())
                .expect("main thread waits");
            let _ = stop_rx.await;
            let cpu = thread_cpu_seconds() - cpu_start;
            let generated: u64 = handle
                .cluster()
                .snapshots()
                .iter()
                .map(|w| w.engine.generation_tokens)
                .sum();
            handle.shutdown().await;
            (cpu, generated)
        })
    });
    let addr = addr_rx.recv().expect("server started");

    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    let (received, wall) = client_rt.block_on(async move {
        let started = Instant::now();
        let tasks: Vec<_> = (0..streams)
            .map(|_| tokio::spawn(stream_client(addr, per_stream, osl)))
            .collect();
        let mut received = 0;
        for t in tasks {
            received += t.await.expect("client task").expect("stream completes");
        }
        (received, started.elapsed().as_secs_f64())
    });
    let _ = stop_tx.send(());
    let (server_cpu, generated) = server.join().expect("server thread");

    let expected = streams * per_stream * osl;
    let per_million = server_cpu / received as f64 * 1e6;
    println!(
        "streams {streams}, requests {}, osl {osl}",
        streams * per_stream
    );
    println!("tokens received {received} (expected {expected}, engine generated {generated})");
    println!(
        "wall {wall:.3} s, {:.0} tokens/s over loopback",
        received as f64 / wall
    );
    println!(
        "server thread CPU {server_cpu:.3} s: {per_million:.3} CPU-s per 1M tokens = {:.0} tokens/s on one core",
        received as f64 / server_cpu
    );
    assert_eq!(received, expected, "every token arrives");
}
