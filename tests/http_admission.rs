//! Issue 40, items 1 and 3: the canary's own HTTP port under a flood of idle connections from
//! one address, reopened as they close; with the general pool full, for the health probes; and
//! under clients that ask for a large exposition and never read it. The server runs in-process
//! on a runtime and thread of its own (as the daemon's does, apart from its clients' work) on
//! 127.0.0.1; it tells peers apart by source address, so a hostile peer connects from another
//! loopback address (127.0.0.2 and up) and the well-behaved client from 127.0.0.1.

mod support;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use llm_canary::config::{Resolution, ServingMode};
use llm_canary::export::{AppState, HttpLimits, HttpServer, Metrics};
use llm_canary::model::Phase;
use llm_canary::request::{Outcome, RequestLabels, Sample};
use support::eventually;
use support::metrics::{sample, sum};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The server on its own runtime and thread, stopped when dropped.
struct Server {
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(metrics: Arc<Metrics>, limits: HttpLimits) -> Server {
        let state =
            AppState::new(metrics.clone(), Arc::new(|| serde_json::json!({}))).with_limits(limits);
        state.readiness().set_ready();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let (bound, addr) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                // Bound as the daemon binds (tokio's listen backlog of 1,024, where std's 128
                // would drop a probe's handshake behind 300 connecting clients).
                let server = HttpServer::bind("127.0.0.1:0".parse().expect("addr"), state)
                    .await
                    .expect("bind")
                    .with_drain_timeout(Duration::from_secs(1));
                bound
                    .send(server.local_addr().expect("address"))
                    .expect("send");
                server.serve(stop).await;
            });
        });
        Server {
            addr: addr.recv().expect("the server's address"),
            metrics,
            shutdown,
            thread: Some(thread),
        }
    }

    /// `llm_canary_http_refused_total{reason}` now.
    fn refused(&self, reason: &str) -> f64 {
        let text = self.metrics.encode().expect("encode");
        sample(
            &text,
            "llm_canary_http_refused_total",
            &[("reason", reason)],
        )
        .unwrap_or_else(|| panic!("no refusal series for {reason}"))
    }

    /// `llm_canary_http_refused_total` over every reason now.
    fn refused_in_all(&self) -> f64 {
        let text = self.metrics.encode().expect("encode");
        sum(&text, "llm_canary_http_refused_total", &[])
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a GET on a fresh connection came to.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Vec<u8>,
    took: Duration,
}

/// `GET path` from 127.0.0.1 on a connection of its own, read to its end within `limit`.
async fn get(addr: SocketAddr, path: &str, limit: Duration) -> Result<Answer, String> {
    let started = Instant::now();
    let exchange = async {
        let mut conn = TcpStream::connect(addr).await?;
        let head = format!("GET {path} HTTP/1.1\r\nhost: canary\r\nconnection: close\r\n\r\n");
        conn.write_all(head.as_bytes()).await?;
        let mut got = Vec::new();
        conn.read_to_end(&mut got).await?;
        Ok::<_, std::io::Error>(got)
    };
    let got = tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| format!("GET {path}: no answer within {limit:?}"))?
        .map_err(|e| format!("GET {path}: {e}"))?;
    let took = started.elapsed();
    let status = got
        .get(9..12)
        .filter(|_| got.starts_with(b"HTTP/1.1 "))
        .and_then(|s| std::str::from_utf8(s).ok()?.parse().ok())
        .ok_or_else(|| format!("GET {path}: closed without an answer ({} bytes)", got.len()))?;
    let split = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("GET {path}: no end of head"))?;
    Ok(Answer {
        status,
        body: got[split + 4..].to_vec(),
        took,
    })
}

/// A connection to `addr` from the loopback address `source`.
async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0))?;
    socket.connect(addr).await
}

/// `n` connections from `source` that send nothing, each reopened as soon as the server closes
/// it, until `stop` or until `opens` (shared by all floods) is spent. The server closes a
/// refused connection at once, so the refused ones reconnect in a tight loop.
fn flood_idle(
    addr: SocketAddr,
    source: Ipv4Addr,
    n: usize,
    opens: &Arc<AtomicU64>,
    stop: &CancellationToken,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    for _ in 0..n {
        let (opens, stop) = (opens.clone(), stop.clone());
        tasks.spawn(async move {
            while !stop.is_cancelled() {
                if opens
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_err()
                {
                    // Spent: hold nothing more, wait for the end.
                    stop.cancelled().await;
                    return;
                }
                let Ok(mut conn) = connect_from(source, addr).await else {
                    tokio::task::yield_now().await;
                    continue;
                };
                let mut byte = [0u8; 1];
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = conn.read(&mut byte) => {}
                }
            }
        });
    }
}

/// Everything logged so far (by a subscriber of this test binary, at the daemon's default level
/// and format), so a test can count the lines it made the server write.
fn log() -> String {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(log.clone());
        tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
        log
    });
    String::from_utf8_lossy(&log.lock().unwrap()).into_owned()
}

fn small_metrics() -> Arc<Metrics> {
    let metrics = Arc::new(Metrics::new(&[]));
    let labels = RequestLabels::new("agg", ServingMode::Aggregated, "concurrency_sweep");
    metrics.record_request(&labels, Phase::Steady, &ok_sample());
    metrics
}

fn ok_sample() -> Sample {
    Sample {
        outcome: Outcome::Ok,
        ttft: Some(0.5),
        itl: Some(0.02),
        latency: 4.0,
        prompt_tokens: 1024,
        output_tokens: 256,
        ..Sample::default()
    }
}

/// An exposition of about 15 MB, as 150 targets at the high resolution made in issue 40 (14.6 MB):
/// the latency histograms of many label sets.
fn large_metrics() -> (Arc<Metrics>, usize) {
    let metrics = Arc::new(Metrics::with_resolution(&[], Resolution::High));
    for target in 0..130 {
        for concurrency in [1, 8] {
            let labels = RequestLabels::new(
                &format!("target-{target:03}"),
                ServingMode::Aggregated,
                "concurrency_sweep",
            )
            .with_concurrency(concurrency);
            metrics.record_request(&labels, Phase::Steady, &ok_sample());
        }
    }
    let bytes = metrics.encode().expect("encode").len();
    (metrics, bytes)
}

/// Item 1: one address holding 300 idle connections, each reopened as the server closes it, takes
/// its share of the pool and no more: `/-/healthy` and a `/metrics` scrape from another address
/// answer within 1 s throughout, and the thousands of refused connections make a line or two of
/// log, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_flood_from_one_address_leaves_the_surface_answering_and_the_log_quiet() {
    let logged_before = log().len();
    let server = Server::start(small_metrics(), HttpLimits::default());
    let (stop, opens) = (CancellationToken::new(), Arc::new(AtomicU64::new(40_000)));
    let mut flood = tokio::task::JoinSet::new();
    flood_idle(
        server.addr,
        Ipv4Addr::new(127, 0, 0, 2),
        300,
        &opens,
        &stop,
        &mut flood,
    );
    // In full swing: what the server holds is held, and the rest keep being refused.
    eventually("2,000 refused connections", Duration::from_secs(60), || {
        let refused = server.refused_in_all();
        async move { (refused >= 2_000.0).then_some(()) }
    })
    .await;

    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        for path in ["/-/healthy", "/metrics"] {
            let answer = get(server.addr, path, Duration::from_secs(1))
                .await
                .unwrap_or_else(|e| panic!("under the flood: {e}"));
            assert_eq!(answer.status, 200, "{path}");
            if path == "/metrics" {
                assert!(answer.body.ends_with(b"# EOF\n"), "a whole exposition");
            }
            slowest = slowest.max(answer.took);
        }
    }
    let still_flooding = opens.load(Ordering::Relaxed) > 0;
    stop.cancel();
    while flood.join_next().await.is_some() {}

    let refused = server.refused("peer_connection_limit");
    let logged = log()[logged_before..].to_owned();
    let lines = logged.lines().count();
    eprintln!(
        "idle flood: slowest answer {slowest:?}, {refused} connections refused, {lines} log lines, \
         flood still reconnecting at the end: {still_flooding}"
    );
    assert!(refused >= 2_000.0);
    assert_eq!(
        server.refused("connection_limit"),
        0.0,
        "the pool was never full"
    );
    assert!(lines < 100, "{lines} log lines for {refused} refusals");
    assert!(
        logged.contains("WARN") && logged.contains("peer_connection_limit"),
        "the refusals were never logged: {logged}"
    );
}

/// Item 1, the reserve: four addresses fill the general pool, each holding its share and
/// reconnecting; a fifth gets `/-/healthy` and `/-/ready` answered from the slots kept back for
/// them, and `/metrics` refused with 503 and `Retry-After`, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_still_answers_the_health_probes() {
    let limits = HttpLimits {
        max_connections: 12,
        max_connections_per_peer: 2,
        health_connections: 4,
        ..HttpLimits::default()
    };
    let server = Server::start(small_metrics(), limits);
    let (stop, opens) = (CancellationToken::new(), Arc::new(AtomicU64::new(20_000)));
    let mut flood = tokio::task::JoinSet::new();
    for host in 2..6 {
        flood_idle(
            server.addr,
            Ipv4Addr::new(127, 0, 0, host),
            3,
            &opens,
            &stop,
            &mut flood,
        );
    }
    // Every flooding address holds its 2 (the 8 of the general pool) and is refused the rest.
    eventually("400 refused connections", Duration::from_secs(60), || {
        let refused = server.refused_in_all();
        async move { (refused >= 400.0).then_some(()) }
    })
    .await;
    for _ in 0..3 {
        for path in ["/-/healthy", "/-/ready"] {
            let answer = get(server.addr, path, Duration::from_secs(1))
                .await
                .unwrap_or_else(|e| panic!("with the pool full: {e}"));
            assert_eq!(answer.status, 200, "{path}");
        }
    }
    let answer = get(server.addr, "/metrics", Duration::from_secs(1))
        .await
        .expect("an answer");
    assert_eq!(answer.status, 503);
    assert!(
        String::from_utf8_lossy(&answer.body).contains("connection limit"),
        "{:?}",
        String::from_utf8_lossy(&answer.body)
    );
    // The status page is a data endpoint like the others: not on the health reserve.
    let answer = get(server.addr, "/", Duration::from_secs(1))
        .await
        .expect("an answer");
    assert_eq!(answer.status, 503);
    assert!(server.refused("connection_limit") >= 2.0);
    assert!(server.refused("peer_connection_limit") >= 400.0);
    stop.cancel();
    while flood.join_next().await.is_some() {}
}

/// Clients that ask for `/metrics` from `sources` (one each) and never read; returns once every
/// one has an answer coming (its head is in the socket).
async fn non_readers(addr: SocketAddr, sources: &[Ipv4Addr]) -> Vec<TcpStream> {
    let mut conns = Vec::new();
    for &source in sources {
        let mut conn = connect_from(source, addr).await.expect("connect");
        conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: canary\r\n\r\n")
            .await
            .expect("ask");
        conns.push(conn);
    }
    for conn in &conns {
        let mut head = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(60), conn.peek(&mut head))
            .await
            .expect("an answer begins")
            .expect("peek");
    }
    conns
}

/// A scrape from 127.0.0.1 that reads the whole exposition.
async fn scrape(addr: SocketAddr) -> Result<Answer, String> {
    get(addr, "/metrics", Duration::from_secs(30)).await
}

/// Item 3: clients that never read a 15 MB exposition cannot hold every `/metrics` slot. Eight
/// from one address get two slots between them, and a scrape from another is answered beside
/// them; eight from eight addresses take every slot, but only until the write deadline of the
/// exposition's size (1 s + its size at 4 MiB/s here, with the stall limit far beyond), after
/// which scrapes are answered again; every refusal and cut is counted by its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_a_large_exposition_leave_scrapes_answered() {
    let (metrics, bytes) = large_metrics();
    assert!(bytes > 14_000_000, "an exposition of {bytes} bytes");
    let limits = HttpLimits {
        write_stall_timeout: Duration::from_secs(300),
        response_timeout: Duration::from_secs(300),
        response_time_floor: Duration::from_secs(1),
        min_read_bytes_per_second: 4 * 1024 * 1024,
        ..HttpLimits::default()
    };
    let deadline = limits.write_deadline(bytes as u64);
    let server = Server::start(metrics, limits);

    // One address: two slots, the other six refused, and a scrape from elsewhere answered.
    let one = [Ipv4Addr::new(127, 0, 0, 2); 8];
    let held = non_readers(server.addr, &one).await;
    for _ in 0..3 {
        let answer = scrape(server.addr).await.expect("a scrape beside them");
        assert_eq!(answer.status, 200);
        assert!(answer.body.len() >= bytes, "the whole exposition");
        assert!(answer.body.ends_with(b"# EOF\n"));
    }
    assert_eq!(server.refused("peer_metrics_responses"), 6.0);
    // Their two are cut at the deadline.
    let started = Instant::now();
    eventually("the two cut at their deadline", deadline * 4, || {
        let cut = server.refused("write_deadline");
        async move { (cut == 2.0).then_some(()) }
    })
    .await;
    drop(held);

    // Eight addresses: every slot taken, until the deadline gives them back.
    let eight: Vec<Ipv4Addr> = (3..11).map(|h| Ipv4Addr::new(127, 0, 0, h)).collect();
    let held = non_readers(server.addr, &eight).await;
    let started_eight = Instant::now();
    let busy = scrape(server.addr).await.expect("an answer");
    assert_eq!(busy.status, 503, "eight non-readers hold every slot");
    assert_eq!(server.refused("metrics_responses"), 1.0);
    let answered = eventually(
        "a scrape answered after the deadline",
        deadline + Duration::from_secs(20),
        || async {
            let answer = scrape(server.addr).await.ok()?;
            (answer.status == 200).then_some(answer)
        },
    )
    .await;
    assert!(answered.body.len() >= bytes && answered.body.ends_with(b"# EOF\n"));
    let waited = started_eight.elapsed();
    eventually("all eight cut", Duration::from_secs(10), || {
        let cut = server.refused("write_deadline");
        async move { (cut == 10.0).then_some(()) }
    })
    .await;
    assert_eq!(server.refused("write_stall"), 0.0);
    eprintln!(
        "never-reading clients of {bytes} bytes: deadline {deadline:?}, the first two cut within \
         {:?}, a scrape answered {waited:?} after eight took every slot",
        started.elapsed()
    );
    drop(held);
}
