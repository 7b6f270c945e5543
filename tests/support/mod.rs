//! Shared helpers of the integration tests, one copy of each:
//!
//! - polling with a deadline ([`eventually`], [`eventually_ok`], [`within`]) — tests synchronise
//!   on conditions, never on fixed sleeps;
//! - [`bench`]: `llm-canary bench` on a config file, as a child process;
//! - [`daemon`]: the daemon as a child process (its `listening on` line gives the address), sent
//!   signals and awaited;
//! - [`http`]: a loopback HTTP client, `GET` as text or JSON, a `/metrics` scrape;
//! - [`metrics`]: a sample looked up by name and label pairs in a text exposition, sums of
//!   samples, and the families every daemon exposition has;
//! - [`prometheus`]: a real Prometheus (Debian's `prometheus`) on loopback;
//! - [`raw`]: a raw HTTP/1.1 server answering canned bytes, a keep-alive server that hangs up
//!   as servers and proxies do (a request-count limit, HTTP/1.0, an idle timeout), a canned SSE
//!   completion, and a refusal that echoes the request's `Authorization`;
//! - [`sim`]: the embedded simulator on loopback, alone or with a scraper of its `/metrics`;
//! - [`config`]: config text shared by tests that run the same workloads;
//! - [`chromium`]: headless Chromium on a page (found, or the test skipped loudly outside CI),
//!   its console messages and a screenshot's pixels;
//! - [`free_port`].
//!
//! Each test binary uses a subset, hence `dead_code` is allowed here.
#![allow(dead_code)]

pub mod bench;
pub mod chromium;
pub mod config;
pub mod daemon;
pub mod http;
pub mod metrics;
pub mod prometheus;
pub mod raw;
pub mod sim;

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

// The helpers most tests use, at `support::` (each binary uses some).
#[allow(unused_imports)]
pub use daemon::{Proc, start_daemon, start_daemon_flagged, start_daemon_with, start_sim_process};
#[allow(unused_imports)]
pub use prometheus::Prometheus;
#[allow(unused_imports)]
pub use raw::{
    Hangup, KeepAliveServer, RawReply, echo_authorization_401, keep_alive_server, raw_server,
    read_request, sse_ok, sse_reply,
};

/// How often the polling helpers probe.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// Probes every [`POLL_EVERY`] until `probe` is `Ok`; after `limit`, the last `Err`.
async fn poll<T, E, F, Fut>(limit: Duration, mut probe: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match probe().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(POLL_EVERY).await,
        }
    }
}

/// Polls `probe` every 100 ms until it returns `Some`, or panics with `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(limit, probe)
        .await
        .unwrap_or_else(|| panic!("timed out after {limit:?} waiting for {what}"))
}

/// Like [`eventually`], for a probe that says what it saw instead (`Err`): the panic after
/// `limit` shows the last of it.
pub async fn eventually_ok<T, E, F, Fut>(what: &str, limit: Duration, probe: F) -> T
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    poll(limit, probe)
        .await
        .unwrap_or_else(|e| panic!("timed out after {limit:?} waiting for {what}; last seen: {e}"))
}

/// Polls `probe` every 100 ms until it returns `Some`, for at most `limit`: `None` if it never
/// did (for a caller that asserts with its own message).
pub async fn within<T, F, Fut>(limit: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(limit, || {
        let next = probe();
        async move { next.await.ok_or(()) }
    })
    .await
    .ok()
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
