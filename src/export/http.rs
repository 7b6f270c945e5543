//! The daemon's HTTP surface (docs/DESIGN.md §2): the status page `/`, `/metrics`, `/-/healthy`,
//! `/-/ready`, `/api/v1/status`, and the lifecycle endpoints that change the daemon's state (`/-/reload`,
//! `/-/pause`, `/-/resume`, baseline pins), off unless enabled and then optionally behind a
//! bearer token. A hyper 1 HTTP/1 server with a readiness latch, a bounded graceful drain, and
//! bounds on what a client can hold: connections (in all and per peer, with a reserve for the
//! health probes, [`super::admission`]), head and body sizes, and how long a head, a body or a
//! response may take ([`super::limits`], [`super::stall`]); what it refuses is counted and
//! logged in summary ([`super::refusals`]).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Body;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::admission::{Admission, Admitted};
use super::body::ChunksBody;
use super::limits::HttpLimits;
use super::metrics::Metrics;
use super::refusals::{Refusal, Refusals};
use super::stall::StallGuard;

/// The content type of `/metrics` (contract, docs/DESIGN.md §2).
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";
const JSON_CONTENT_TYPE: &str = "application/json";
const HTML_CONTENT_TYPE: &str = "text/html; charset=utf-8";

/// Largest request body read (only the lifecycle endpoints read one); anything larger is refused
/// with 413 rather than buffered.
pub const MAX_REQUEST_BODY_BYTES: usize = 4 * 1024;

/// hyper's connection buffer limit, which bounds a request head (a scraper's or a probe's are
/// under 1 KiB) and also how much of a response hyper queues per write: the `/metrics` body is a
/// list of shared chunks of ~25 KiB each, and a limit of 16 KiB wrote them one per syscall
/// (HTTP scrape p50 6 ms instead of 3 ms for the high-resolution set), so it is 256 KiB: a dozen
/// chunks per vectored write, and at most 64 MiB held by 256 connections sending heads.
const MAX_BUF_BYTES: usize = 256 * 1024;
/// How long a shutdown waits for in-flight requests (e.g. a scrape being written) by default.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The listening socket's queue of connections the kernel has completed and `accept` has not
/// taken yet (capped by `net.core.somaxconn`, 4096 on Linux since 5.4). tokio's `bind` uses 128,
/// as std does: 300 clients reconnecting as fast as they are refused (issue 40) kept that queue
/// full, the kernel dropped the handshakes it had no room for, and a probe's connection waited
/// for its SYN's retransmission, a second later. Refusing is fast; the queue only has to hold a
/// burst.
const LISTEN_BACKLOG: u32 = 1024;
/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Errors of the HTTP surface.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("cannot read the listening address: {0}")]
    LocalAddr(io::Error),
    /// A reload kept the running config; its own error says why (the 500 answer's text).
    #[error("{0}")]
    Reload(Box<dyn std::error::Error + Send + Sync>),
}

/// Produces the `/api/v1/status` document (targets, workload phases, SLO verdicts), which the
/// status page on `/` renders too. Called on every request to either, so it should read a
/// snapshot, not compute one.
pub trait StatusSource: Send + Sync {
    fn status_json(&self) -> serde_json::Value;
}

impl<F> StatusSource for F
where
    F: Fn() -> serde_json::Value + Send + Sync,
{
    fn status_json(&self) -> serde_json::Value {
        self()
    }
}

/// What a reload returns: a message for the 200 answer, or [`HttpError::Reload`] for the 500
/// answer.
pub type ReloadFuture = Pin<Box<dyn Future<Output = Result<String, HttpError>> + Send>>;

/// Reloads the config (docs/DESIGN.md §3: validate completely, keep the old config on failure). The same
/// hook should serve SIGHUP, so it must tolerate concurrent calls and record the outcome with
/// [`Metrics::record_config_reload`].
pub trait ReloadHook: Send + Sync {
    fn reload(&self) -> ReloadFuture;
}

/// Pauses and resumes the traffic (`POST /-/pause`, `POST /-/resume`); each answers the pause
/// state as JSON.
pub trait PauseHook: Send + Sync {
    fn pause(&self, note: String) -> serde_json::Value;
    fn resume(&self) -> serde_json::Value;
}

/// The endpoints that change the daemon's state, served only when enabled
/// (`export.lifecycle`).
pub struct Lifecycle {
    pub reload: Arc<dyn ReloadHook>,
    pub pause: Arc<dyn PauseHook>,
    /// Required as `Authorization: Bearer <token>` where set (`export.lifecycle_token_file`).
    pub token: Option<String>,
}

impl<F> ReloadHook for F
where
    F: Fn() -> ReloadFuture + Send + Sync,
{
    fn reload(&self) -> ReloadFuture {
        self()
    }
}

/// The pinned baselines behind `/api/v1/baselines`: list them, pin the current rolling baselines
/// under a name, remove a pin (implemented by the SLO engine).
pub trait BaselineHook: Send + Sync {
    fn list(&self) -> serde_json::Value;
    /// Pins every rolling baseline over `span` as `name`; how many terms were pinned.
    fn pin(&self, name: &str, span: std::time::Duration) -> usize;
    fn unpin(&self, name: &str) -> bool;
}

/// Span of a pin when the request names none: the seed plan's regression span.
const DEFAULT_PIN_SPAN: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The readiness latch of `/-/ready`: unset until the daemon says it is ready (config loaded and
/// the first scheduler tick ran), then set for good.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the daemon ready; there is no way back.
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Everything a request handler reads: the metrics, the readiness latch and the daemon's hooks.
pub struct AppState {
    metrics: Arc<Metrics>,
    readiness: Readiness,
    status: Arc<dyn StatusSource>,
    baselines: Option<Arc<dyn BaselineHook>>,
    /// `None`: every state-changing endpoint answers 403.
    lifecycle: Option<Lifecycle>,
    limits: HttpLimits,
    admission: Arc<Admission>,
    refusals: Arc<Refusals>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("readiness", &self.readiness)
            .field("lifecycle", &self.lifecycle.is_some())
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// State with the lifecycle endpoints disabled (403) and readiness unset.
    pub fn new(metrics: Arc<Metrics>, status: Arc<dyn StatusSource>) -> Self {
        let limits = HttpLimits::default();
        Self {
            readiness: Readiness::new(),
            status,
            baselines: None,
            lifecycle: None,
            limits,
            admission: Arc::new(Admission::new(&limits)),
            refusals: Arc::new(Refusals::new(metrics.clone(), limits.refusal_log_interval)),
            metrics,
        }
    }

    /// Other bounds on clients than the defaults (tests shorten them).
    pub fn with_limits(mut self, limits: HttpLimits) -> Self {
        self.admission = Arc::new(Admission::new(&limits));
        self.refusals = Arc::new(Refusals::new(
            self.metrics.clone(),
            limits.refusal_log_interval,
        ));
        self.limits = limits;
        self
    }

    /// Serves `GET /api/v1/baselines` from `hook` (pins and unpins also need the lifecycle).
    pub fn with_baselines(mut self, hook: Arc<dyn BaselineHook>) -> Self {
        self.baselines = Some(hook);
        self
    }

    /// Enables the state-changing endpoints.
    pub fn with_lifecycle(mut self, lifecycle: Lifecycle) -> Self {
        self.lifecycle = Some(lifecycle);
        self
    }

    /// A handle on the readiness latch, for the daemon to set.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// A listener on `addr` as tokio's `bind` makes one (`SO_REUSEADDR`), with a listen backlog of
/// [`LISTEN_BACKLOG`] instead of 128. Needs a runtime.
pub fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How a shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownOutcome {
    /// Every connection finished its in-flight request and closed.
    Drained,
    /// The drain timed out; the remaining connections were dropped.
    DrainTimedOut { open_connections: usize },
}

/// The HTTP server on a bound listener.
#[derive(Debug)]
pub struct HttpServer {
    listener: TcpListener,
    state: Arc<AppState>,
    drain_timeout: Duration,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port; read it back with [`HttpServer::local_addr`]).
    pub async fn bind(addr: SocketAddr, state: AppState) -> Result<Self, HttpError> {
        let listener = bind_listener(addr).map_err(|source| HttpError::Bind { addr, source })?;
        Ok(Self::from_listener(listener, state))
    }

    /// Serves on an already bound listener.
    pub fn from_listener(listener: TcpListener, state: AppState) -> Self {
        Self {
            listener,
            state: Arc::new(state),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }

    /// Overrides how long a shutdown waits for in-flight requests.
    pub fn with_drain_timeout(mut self, drain_timeout: Duration) -> Self {
        self.drain_timeout = drain_timeout;
        self
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Result<SocketAddr, HttpError> {
        self.listener.local_addr().map_err(HttpError::LocalAddr)
    }

    /// Serves until `shutdown` is cancelled, then stops accepting, lets every connection finish
    /// its in-flight request (idle keep-alive connections close at once) and waits at most the
    /// drain timeout for them.
    pub async fn serve(self, shutdown: CancellationToken) -> ShutdownOutcome {
        let connections = TaskTracker::new();
        // Refusals between two log lines are summarised at the next one; this tick writes that
        // line when the refusals stop coming.
        let mut summary = tokio::time::interval(self.state.limits.refusal_log_interval);
        summary.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                _ = summary.tick() => self.state.refusals.flush(),
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => self.admit(stream, peer, &connections, &shutdown),
                    Err(error) => {
                        tracing::warn!(%error, "accepting an HTTP connection failed");
                        tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    }
                },
            }
        }
        // Closing the listener first makes new connection attempts fail fast during the drain.
        drop(self.listener);
        connections.close();
        match tokio::time::timeout(self.drain_timeout, connections.wait()).await {
            Ok(()) => {
                tracing::debug!("HTTP server drained");
                ShutdownOutcome::Drained
            }
            Err(_) => {
                let open_connections = connections.len();
                tracing::warn!(open_connections, "HTTP drain timed out");
                ShutdownOutcome::DrainTimedOut { open_connections }
            }
        }
    }

    /// Serves a new connection if its peer may have one (a general slot, or a health-reserve
    /// slot that answers only the health paths); closes it otherwise, counted and logged in
    /// summary.
    fn admit(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        connections: &TaskTracker,
        shutdown: &CancellationToken,
    ) {
        // An IPv4 client of a dual-stack listener is the same peer as over IPv4.
        let peer = peer.ip().to_canonical();
        let (slot, health_only) = match self.state.admission.admit(peer) {
            Ok(Admitted::Served(slot)) => (slot, false),
            Ok(Admitted::HealthOnly(slot)) => (slot, true),
            Err(why) => {
                self.state.refusals.refuse(why, peer);
                drop(stream);
                return;
            }
        };
        let client = Client { peer, health_only };
        let state = self.state.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            serve_connection(stream, state, client, shutdown).await;
            drop(slot);
        });
    }
}

/// Who a connection serves.
#[derive(Debug, Clone, Copy)]
struct Client {
    peer: IpAddr,
    /// On a health-reserve slot (the general pool was full): only the health paths are
    /// answered; anything else is refused with 503, counted as `connection_limit`.
    health_only: bool,
}

/// The paths a health-reserve connection answers.
fn is_health_path(path: &str) -> bool {
    matches!(path, "/-/healthy" | "/-/ready")
}

async fn serve_connection(
    stream: TcpStream,
    state: Arc<AppState>,
    client: Client,
    shutdown: CancellationToken,
) {
    let limits = state.limits;
    let response_bytes = Arc::new(AtomicU64::new(0));
    let stream = StallGuard::new(
        stream,
        limits,
        response_bytes.clone(),
        state.refusals.clone(),
        client.peer,
    );
    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
        let (state, response_bytes) = (state.clone(), response_bytes.clone());
        async move {
            let response = if client.health_only && !is_health_path(request.uri().path()) {
                state.refusals.refuse(Refusal::ConnectionLimit, client.peer);
                busy(Refusal::ConnectionLimit)
            } else {
                route(&state, client.peer, request).await
            };
            // The write deadline of this response follows its size (`StallGuard`).
            let bytes = response.body().size_hint().exact().unwrap_or(0);
            response_bytes.store(bytes, Ordering::Release);
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).max_buf_size(MAX_BUF_BYTES);
    if client.health_only {
        // A reserve slot is for one probe: its head soon, then the connection goes back.
        builder
            .header_read_timeout(limits.reserve_header_read_timeout())
            .keep_alive(false);
    } else {
        builder.header_read_timeout(limits.header_read_timeout);
    }
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        // Clients hanging up mid-request are routine for probes; not worth more than debug (a
        // response cut at a write limit is counted and logged by `Refusals`).
        tracing::debug!(%error, "HTTP connection ended with an error");
    }
}

/// A 503 with `Retry-After: 1` for a request refused at a limit.
fn busy(why: Refusal) -> Response<ChunksBody> {
    let mut busy = text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}; retry"));
    busy.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    busy
}

/// Answers one request. Generic over the body so unit tests can drive it without a socket.
async fn route<B>(state: &AppState, peer: IpAddr, request: Request<B>) -> Response<ChunksBody>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let method = request.method().clone();
    let limit = state.limits.body_read_timeout;
    match request.uri().path() {
        "/metrics" => get_only(&method, || metrics(state, peer)).await,
        "/-/healthy" => get_only(&method, || async { text(StatusCode::OK, "OK") }).await,
        "/-/ready" => {
            get_only(&method, || async {
                if state.readiness.is_ready() {
                    text(StatusCode::OK, "OK")
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            })
            .await
        }
        "/" => get_only(&method, || async { status_page(state) }).await,
        "/api/v1/status" => get_only(&method, || async { status(state) }).await,
        "/-/reload" => match authorize(state, &request, Method::POST, "POST") {
            Ok(lifecycle) => match read_body(limit, request.into_body()).await {
                Ok(_) => reload(lifecycle).await,
                Err(refused) => *refused,
            },
            Err(refused) => *refused,
        },
        "/-/pause" => match authorize(state, &request, Method::POST, "POST") {
            Ok(lifecycle) => match read_body(limit, request.into_body()).await {
                Ok(body) => pause(lifecycle, &body),
                Err(refused) => *refused,
            },
            Err(refused) => *refused,
        },
        "/-/resume" => match authorize(state, &request, Method::POST, "POST") {
            Ok(lifecycle) => match read_body(limit, request.into_body()).await {
                Ok(_) => json(StatusCode::OK, &lifecycle.pause.resume()),
                Err(refused) => *refused,
            },
            Err(refused) => *refused,
        },
        "/api/v1/baselines" => match (&method, &state.baselines) {
            (_, None) => text(StatusCode::NOT_FOUND, "no SLO engine"),
            (&Method::GET, Some(b)) => json(StatusCode::OK, &b.list()),
            (_, Some(b)) => match authorize(state, &request, Method::POST, "GET, POST") {
                Ok(_) => match read_body(limit, request.into_body()).await {
                    Ok(body) => pin(b.as_ref(), &body),
                    Err(refused) => *refused,
                },
                Err(refused) => *refused,
            },
        },
        path if path.starts_with("/api/v1/baselines/") => {
            let name = path["/api/v1/baselines/".len()..].to_owned();
            match (
                &state.baselines,
                authorize(state, &request, Method::DELETE, "DELETE"),
            ) {
                (None, _) => text(StatusCode::NOT_FOUND, "no SLO engine"),
                (Some(_), Err(refused)) => *refused,
                (Some(b), Ok(_)) if b.unpin(&name) => {
                    text(StatusCode::OK, format!("unpinned {name}"))
                }
                (Some(_), Ok(_)) => text(StatusCode::NOT_FOUND, "no such pinned baseline"),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

async fn get_only<F, Fut>(method: &Method, handler: F) -> Response<ChunksBody>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Response<ChunksBody>>,
{
    if method == Method::GET {
        handler().await
    } else {
        method_not_allowed("GET")
    }
}

async fn metrics(state: &AppState, peer: IpAddr) -> Response<ChunksBody> {
    // Bounded, in all and per peer: each response in flight holds its encoding until the client
    // has read it or its write deadline cut it.
    let slot = match state.admission.metrics_response(peer) {
        Ok(slot) => slot,
        Err(why) => {
            state.refusals.refuse(why, peer);
            return busy(why);
        }
    };
    let metrics = state.metrics.clone();
    // Encoding a full series set takes milliseconds of CPU; keep it off the async workers that
    // drive the traffic.
    match tokio::task::spawn_blocking(move || metrics.encode_chunks()).await {
        Ok(Ok(chunks)) => {
            let mut response = Response::new(ChunksBody::new(chunks).holding(slot));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(OPENMETRICS_CONTENT_TYPE),
            );
            response
        }
        Ok(Err(error)) => {
            tracing::error!(%error, "encoding /metrics failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
        }
        Err(error) => {
            tracing::error!(%error, "the /metrics encoder task failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "encoder task failed")
        }
    }
}

fn status(state: &AppState) -> Response<ChunksBody> {
    match serde_json::to_vec(&state.status.status_json()) {
        Ok(body) => with_type(StatusCode::OK, JSON_CONTENT_TYPE, body),
        Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

/// `GET /`: the status document of `/api/v1/status`, rendered for a person.
fn status_page(state: &AppState) -> Response<ChunksBody> {
    let page = super::status_page::render(&state.status.status_json(), crate::clock::unix_now());
    with_type(StatusCode::OK, HTML_CONTENT_TYPE, page)
}

/// The answer to a request refused before its handler ran (boxed: it is the rare path).
type Refused = Box<Response<ChunksBody>>;

/// The lifecycle endpoints, for a request that may use them: 405 for another method than
/// `want`, 403 when they are disabled, 401 without the configured token.
fn authorize<'a, B>(
    state: &'a AppState,
    request: &Request<B>,
    want: Method,
    allow: &'static str,
) -> Result<&'a Lifecycle, Refused> {
    if request.method() != want {
        return Err(Box::new(method_not_allowed(allow)));
    }
    let Some(lifecycle) = &state.lifecycle else {
        return Err(Box::new(text(
            StatusCode::FORBIDDEN,
            "lifecycle endpoints are disabled; enable them with `export.lifecycle: true`",
        )));
    };
    if let Some(token) = &lifecycle.token {
        let given = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| bearer_token(v.as_bytes()))
            .unwrap_or(b"");
        if !same_secret(given, token.as_bytes()) {
            let mut refused = text(StatusCode::UNAUTHORIZED, "a bearer token is required");
            refused.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
            return Err(Box::new(refused));
        }
    }
    Ok(lifecycle)
}

/// The token of an `Authorization: Bearer <token>` value: the scheme in any case (RFC 9110
/// §11.1), then one or more spaces; `None` for another scheme.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| rest.trim_ascii_start())
}

/// Compares two secrets in time independent of where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A request body, bounded in size ([`MAX_REQUEST_BODY_BYTES`], else 413) and in time
/// (`body_read_timeout`, else 408).
async fn read_body<B>(limit: Duration, body: B) -> Result<Bytes, Refused>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match tokio::time::timeout(limit, Limited::new(body, MAX_REQUEST_BODY_BYTES).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(_)) => Err(Box::new(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
        ))),
        Err(_) => Err(Box::new(text(
            StatusCode::REQUEST_TIMEOUT,
            "request body not received in time",
        ))),
    }
}

/// `POST /-/reload`; the body carries nothing (it was read, bounded, only so an oversized one is
/// refused).
async fn reload(lifecycle: &Lifecycle) -> Response<ChunksBody> {
    match lifecycle.reload.reload().await {
        Ok(message) => {
            tracing::info!(%message, "config reloaded via HTTP");
            text(StatusCode::OK, message)
        }
        Err(error) => {
            tracing::warn!(%error, "config reload via HTTP failed; keeping the running config");
            text(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
        }
    }
}

/// `POST /-/pause`, with an optional `{"note": "release 1.4 rollout"}`.
fn pause(lifecycle: &Lifecycle, bytes: &[u8]) -> Response<ChunksBody> {
    let note = if bytes.iter().all(u8::is_ascii_whitespace) {
        "paused via POST /-/pause".to_owned()
    } else {
        match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(v) => match v["note"].as_str() {
                // Logged and shown with what could reorder or hide text escaped (`Gate::set`).
                Some(n) if n.len() <= 256 && !n.chars().any(char::is_control) => n.to_owned(),
                _ => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        "`note`: a string of at most 256 bytes without control characters",
                    );
                }
            },
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("not JSON: {e}")),
        }
    };
    json(StatusCode::OK, &lifecycle.pause.pause(note))
}

/// `POST /api/v1/baselines` with `{"name": "release-1.2", "span": "24h"}` (span optional).
fn pin(hook: &dyn BaselineHook, bytes: &[u8]) -> Response<ChunksBody> {
    let request: serde_json::Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("not JSON: {e}")),
    };
    let Some(name) = request["name"]
        .as_str()
        .filter(|n| crate::slo::parse::valid_pin_name(n))
    else {
        return text(
            StatusCode::BAD_REQUEST,
            "`name`: 1 to 63 letters, digits, `.`, `_` or `-`",
        );
    };
    let span = match request["span"].as_str() {
        None => DEFAULT_PIN_SPAN,
        // The config's duration grammar, so `24h` means the same in both.
        Some(t) => match crate::config::duration::parse(t) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => return text(StatusCode::BAD_REQUEST, "`span`: longer than 0, e.g. `24h`"),
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("`span`: {}", e.with_forms()),
                );
            }
        },
    };
    let terms = hook.pin(name, span);
    json(
        StatusCode::OK,
        &serde_json::json!({"name": name, "span_seconds": span.as_secs_f64(), "terms": terms}),
    )
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<ChunksBody> {
    with_type(status, "application/json", value.to_string())
}

fn method_not_allowed(allow: &'static str) -> Response<ChunksBody> {
    let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    response
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ChunksBody> {
    with_type(status, TEXT_CONTENT_TYPE, body)
}

fn with_type(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<ChunksBody> {
    let mut response = Response::new(ChunksBody::new(vec![body.into()]));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn state() -> AppState {
        let status = Arc::new(|| serde_json::json!({"targets": []}));
        AppState::new(Arc::new(Metrics::new(&[])), status)
    }

    fn request(method: Method, path: &str, body: Vec<u8>) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = method;
        *request.uri_mut() = path.parse().expect("uri");
        request
    }

    async fn body_text(response: Response<ChunksBody>) -> String {
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    struct NoPause;

    impl PauseHook for NoPause {
        fn pause(&self, note: String) -> serde_json::Value {
            serde_json::json!({"paused": true, "note": note})
        }
        fn resume(&self) -> serde_json::Value {
            serde_json::json!({"paused": false})
        }
    }

    fn lifecycle(reload: Arc<dyn ReloadHook>, token: Option<&str>) -> Lifecycle {
        Lifecycle {
            reload,
            pause: Arc::new(NoPause),
            token: token.map(str::to_owned),
        }
    }

    fn reloads(calls: &Arc<std::sync::atomic::AtomicUsize>) -> Arc<dyn ReloadHook> {
        let counted = calls.clone();
        Arc::new(move || -> ReloadFuture {
            counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok("reloaded".to_owned()) })
        })
    }

    #[tokio::test]
    async fn lifecycle_endpoints_are_forbidden_unless_enabled() {
        for path in ["/-/reload", "/-/pause", "/-/resume"] {
            let response = route(&state(), LOCAL, request(Method::POST, path, vec![])).await;
            assert_eq!(response.status(), StatusCode::FORBIDDEN, "{path}");
            let response = route(&state(), LOCAL, request(Method::GET, path, vec![])).await;
            assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{path}");
        }
    }

    #[tokio::test]
    async fn a_configured_token_is_required() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let token = "s3cret-token-of-the-canary";
        let state = state().with_lifecycle(lifecycle(reloads(&calls), Some(token)));
        let mut asked = request(Method::POST, "/-/pause", br#"{"note": "rollout"}"#.to_vec());
        assert_eq!(
            route(&state, LOCAL, asked).await.status(),
            StatusCode::UNAUTHORIZED
        );
        asked = request(Method::POST, "/-/reload", vec![]);
        asked.headers_mut().insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret-token-of-the-canarY"),
        );
        assert_eq!(
            route(&state, LOCAL, asked).await.status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        asked = request(Method::POST, "/-/pause", br#"{"note": "rollout"}"#.to_vec());
        asked.headers_mut().insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        let response = route(&state, LOCAL, asked).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(body_text(response).await.contains("rollout"));
    }

    /// The scheme of `Authorization` is case-insensitive (RFC 9110 §11.1): `bearer` and
    /// `BEARER` are Bearer; the token itself is compared exactly.
    #[tokio::test]
    async fn the_bearer_scheme_is_read_in_any_case_and_the_token_exactly() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let token = "s3cret-token-of-the-canary";
        let state = state().with_lifecycle(lifecycle(reloads(&calls), Some(token)));
        let asked = |authorization: String| {
            let mut asked = request(Method::POST, "/-/reload", vec![]);
            asked.headers_mut().insert(
                http::header::AUTHORIZATION,
                HeaderValue::from_str(&authorization).unwrap(),
            );
            asked
        };
        for scheme in ["bearer", "BEARER", "bEaReR", "Bearer "] {
            let response = route(&state, LOCAL, asked(format!("{scheme} {token}"))).await;
            assert_eq!(response.status(), StatusCode::OK, "{scheme:?}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        for refused in [
            format!("Basic {token}"),
            format!("bearer{token}"),
            format!("bearer {}", token.to_uppercase()),
            format!("bearer {token}x"),
            "bearer".to_owned(),
        ] {
            let response = route(&state, LOCAL, asked(refused.clone())).await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{refused:?}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn oversized_reload_body_is_refused_before_the_hook_runs() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let state = state().with_lifecycle(lifecycle(reloads(&calls), None));
        let big = vec![b'x'; MAX_REQUEST_BODY_BYTES + 1];
        let response = route(&state, LOCAL, request(Method::POST, "/-/reload", big)).await;
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        let small = vec![b'x'; MAX_REQUEST_BODY_BYTES];
        let response = route(&state, LOCAL, request(Method::POST, "/-/reload", small)).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body_text(response).await, "reloaded");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_status_page_renders_the_status_document_as_html() {
        let status = Arc::new(
            || serde_json::json!({"targets": [{"name": "<b>agg</b>", "serving_mode": "aggregated"}]}),
        );
        let state = AppState::new(Arc::new(Metrics::new(&[])), status);
        let response = route(&state, LOCAL, request(Method::GET, "/", vec![])).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], HTML_CONTENT_TYPE);
        let page = body_text(response).await;
        assert!(
            page.contains("data-target=\"&lt;b&gt;agg&lt;/b&gt;\""),
            "{page}"
        );
        // Only `/` is the page.
        let response = route(&state, LOCAL, request(Method::GET, "/index.html", vec![])).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn get_endpoints_refuse_other_methods() {
        let state = state();
        for path in ["/", "/metrics", "/-/healthy", "/-/ready", "/api/v1/status"] {
            let response = route(&state, LOCAL, request(Method::POST, path, vec![])).await;
            assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{path}");
            assert_eq!(response.headers()[ALLOW], "GET", "{path}");
        }
    }
}
