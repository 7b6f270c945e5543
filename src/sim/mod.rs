//! The embedded serving simulator: an OpenAI-compatible server whose engine behaves like a GPU
//! serving deployment (aggregated or disaggregated), so the demo, the tests and a first run show
//! real agg-vs-disagg behaviour without a GPU. DESIGN.md §8 is its contract.
//!
//! Layers, bottom up: [`kv`] (block pool and prefix cache), [`profile`] (pass timing, GPUs, model
//! KV footprint), [`engine`] (one worker's pass loop), [`cluster`] (pools, router, handoff), and
//! the HTTP server (`server`, `metrics`, `faults`); [`estimate`] reads the same timing model to
//! say how long a request will take before any is sent; [`variability`] scales every pass by the
//! deployment's run-to-run speed. The engine only uses tokio time, so a
//! `#[tokio::test(start_paused = true)]` test drives a [`Cluster`] in virtual time.

pub mod cluster;
pub mod engine;
pub mod estimate;
mod faults;
pub mod kv;
mod metrics;
pub mod profile;
mod request;
mod server;
mod sse;
mod state;
pub mod text;
pub mod variability;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use crate::config::sim::{
    AfterTokens, Bimodal, DecodeGrid, ErrorEventFault, ErrorFault, FaultSpec, ModelShape, PROFILES,
    PoolSpec, RefuseMode, SimSpec, SlowFirstByte, StallFault, TierSpec, TimingTable, TruncateFault,
    Variability,
};
pub use cluster::{Cluster, GenerateRequest, RequestStream};
pub use engine::{Completion, FinishReason, ServerTiming, StreamEvent, WorkerRole, WorkerSnapshot};
pub use profile::Gpu;

use crate::config::ServingMode;

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("invalid simulator spec: {}", .0.join("; "))]
    InvalidSpec(Vec<String>),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tokenizer(#[from] text::TokenizerError),
    #[error("cannot read timing table {path}: {message}")]
    Table { path: String, message: String },
    #[error("cannot open the log file {path}: {message}")]
    RequestLog { path: String, message: String },
}

impl SimError {
    /// A bounded label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SimError::InvalidSpec(_) => "invalid_spec",
            SimError::Bind { .. } => "bind",
            SimError::Tokenizer(_) => "tokenizer",
            SimError::Table { .. } => "table",
            SimError::RequestLog { .. } => "request_log",
        }
    }
}

/// How many requests' token send instants the `fixed` profile keeps (oldest dropped first).
const SEND_LOG_CAPACITY: usize = 4096;

/// Token send instants per request id, kept for the `fixed` profile's accuracy tests.
#[derive(Debug, Default)]
pub(crate) struct SendLog {
    order: std::collections::VecDeque<String>,
    by_id: HashMap<String, Vec<Instant>>,
}

impl SendLog {
    pub(crate) fn insert(&mut self, id: String, instants: Vec<Instant>) {
        if self.by_id.insert(id.clone(), instants).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > SEND_LOG_CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }
}

/// `--send-log`: one JSON line per finished completion with its arrival and token send instants
/// as CLOCK_MONOTONIC nanoseconds (docs/PERFORMANCE.md joins them with the bench's
/// `requests.jsonl`). Buffered, and flushed by [`SimHandle::shutdown`], so the hot path writes no
/// syscall per request.
#[derive(Debug)]
pub(crate) struct SendFile {
    clock: crate::clock::MonoClock,
    out: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl SendFile {
    pub(crate) fn write(
        &self,
        id: &str,
        (arrived, received): (Option<Instant>, Instant),
        tokens: &[Instant],
        ok: bool,
    ) {
        use std::fmt::Write as _;
        let mut line = String::with_capacity(128 + tokens.len() * 20);
        let _ = write!(
            line,
            "{{\"x_request_id\":{},\"ok\":{ok},",
            serde_json::Value::from(id)
        );
        if let Some(arrived) = arrived {
            let _ = write!(line, "\"arrived_mono_ns\":{},", self.clock.mono_ns(arrived));
        }
        let _ = write!(
            line,
            "\"received_mono_ns\":{},\"token_mono_ns\":[",
            self.clock.mono_ns(received)
        );
        for (i, t) in tokens.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(line, "{sep}{}", self.clock.mono_ns(*t));
        }
        line.push_str("]}\n");
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = std::io::Write::write_all(&mut *out, line.as_bytes()) {
            tracing::warn!(error = %e, "simulator send log not written");
        }
    }

    fn flush(&self) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = std::io::Write::flush(&mut *out) {
            tracing::warn!(error = %e, "simulator send log not flushed");
        }
    }
}

/// A running simulated deployment with its HTTP server.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    mode: ServingMode,
    profile: String,
    cluster: Cluster,
    state: Arc<state::ServerState>,
    faults: watch::Sender<Arc<FaultSpec>>,
    cancel: CancellationToken,
    server: JoinHandle<()>,
}

impl SimHandle {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the base URL a client uses.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn mode(&self) -> ServingMode {
        self.mode
    }

    pub fn profile(&self) -> &str {
        &self.profile
    }

    /// The engine behind the server.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Price of the simulated hardware, USD per hour.
    pub fn cost_per_hour_usd(&self) -> f64 {
        self.cluster.cost_per_hour_usd()
    }

    /// Replaces the injected faults; takes effect for new requests and connections.
    pub fn set_faults(&self, faults: FaultSpec) {
        self.faults.send_replace(Arc::new(faults));
    }

    /// Replaces the run-to-run variability of the deployment's speed from its next pass on
    /// (`None`: every pass as modelled), e.g. a slowdown injected into a running deployment.
    pub fn set_variability(&self, variability: Option<Variability>) {
        self.cluster.set_variability(variability);
    }

    /// The instants at which each token's chunk of request `request_id` (its `x-request-id`, or
    /// the response `id`) was handed to the connection. Recorded with the `fixed` profile only.
    pub fn token_send_times(&self, request_id: &str) -> Option<Vec<Instant>> {
        self.state
            .send_log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .get(request_id)
            .cloned()
    }

    /// The `/metrics` text as the server would answer it now.
    pub fn metrics_text(&self) -> String {
        metrics::render(&self.state.model, &self.state.frontend, &self.cluster)
    }

    /// Stops accepting, lets open connections finish their current responses, then stops the
    /// engine.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        // A panicked accept loop has nothing left to drain.
        let _ = self.server.await;
        self.cluster.shutdown();
        if let Some(f) = &self.state.send_file {
            f.flush();
        }
    }
}

/// Loads the spec's tokenizer and timing table, starts the engine and serves HTTP on `listen`.
pub async fn start(
    spec: SimSpec,
    mode: ServingMode,
    listen: SocketAddr,
) -> Result<SimHandle, SimError> {
    let errors = spec.validate();
    if !errors.is_empty() {
        return Err(SimError::InvalidSpec(errors));
    }
    let tokenizer = match &spec.tokenizer {
        Some(path) => text::PromptTokenizer::from_path(path)?,
        None => text::PromptTokenizer::Words,
    };
    let table = match &spec.table_file {
        Some(path) => Some(load_table(path)?),
        None => None,
    };
    let listener = server::bind(listen).map_err(|source| SimError::Bind {
        addr: listen,
        source,
    })?;
    let addr = listener.local_addr().map_err(|source| SimError::Bind {
        addr: listen,
        source,
    })?;
    let open = |path: &std::path::Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| SimError::RequestLog {
                path: path.display().to_string(),
                message: e.to_string(),
            })
    };
    let request_log = spec.request_log.as_deref().map(open).transpose()?;
    let send_file = spec
        .send_log
        .as_deref()
        .map(open)
        .transpose()?
        .map(|f| SendFile {
            clock: crate::clock::MonoClock::now(),
            out: Mutex::new(std::io::BufWriter::with_capacity(1 << 16, f)),
        });
    let cluster = Cluster::start(&spec, mode, table)?;
    let (faults_tx, faults_rx) = watch::channel(Arc::new(spec.faults.clone()));
    let state = Arc::new(state::ServerState::new(
        &spec,
        mode,
        tokenizer,
        cluster.clone(),
        faults_rx,
        request_log,
        send_file,
    ));
    let cancel = CancellationToken::new();
    let server = tokio::spawn(server::serve(
        listener,
        addr,
        Arc::clone(&state),
        cancel.clone(),
    ));
    tracing::info!(%addr, mode = mode.as_str(), profile = %spec.profile, "simulator listening");
    Ok(SimHandle {
        addr,
        mode,
        profile: spec.profile.clone(),
        cluster,
        state,
        faults: faults_tx,
        cancel,
        server,
    })
}

fn load_table(path: &std::path::Path) -> Result<TimingTable, SimError> {
    let err = |message: String| SimError::Table {
        path: path.display().to_string(),
        message,
    };
    let text = crate::files::read_text(path, crate::files::MAX_CONFIG_BYTES)
        .map_err(|e| err(e.to_string()))?;
    let table: TimingTable = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| err(e.to_string()))?
    } else {
        serde_saphyr::from_str(&text).map_err(|e| err(e.to_string()))?
    };
    let problems = table.validate();
    if !problems.is_empty() {
        return Err(err(problems.join("; ")));
    }
    Ok(table)
}
