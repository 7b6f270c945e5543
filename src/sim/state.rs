//! What the simulator's handlers share: the server's state (model, engine cluster, faults,
//! frontend metrics, logs), the API a request came to, and one request's bookkeeping from its
//! arrival to its last token (`RequestTracker`), which both answer shapes (SSE and whole body)
//! keep.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use super::cluster::Cluster;
use super::engine::Completion;
use super::metrics::{FrontendMetrics, RequestOutcome};
use super::text::PromptTokenizer;
use super::{SendFile, SendLog};
use crate::config::ServingMode;
use crate::config::sim::{FaultSpec, SimSpec};

/// Everything the handlers share.
#[derive(Debug)]
pub struct ServerState {
    pub model: String,
    /// The context length reported and enforced (`SimSpec::max_model_len`).
    pub max_model_len: Option<u32>,
    pub mode: ServingMode,
    pub tokenizer: PromptTokenizer,
    pub cluster: Cluster,
    pub faults: watch::Receiver<Arc<FaultSpec>>,
    pub send_log: Mutex<SendLog>,
    pub frontend: FrontendMetrics,
    /// Record each token's send instant (the `fixed` profile).
    pub record_send_times: bool,
    pub created: u64,
    /// Refuse the fields the OpenAI API does not define.
    pub reject_unknown_fields: bool,
    /// Every SSE event its own write (`SimSpec::write_per_event`).
    pub write_per_event: bool,
    /// Output tokens of a chat completion sent as reasoning (`SimSpec::reasoning_tokens`).
    pub reasoning_tokens: u32,
    /// One JSON line per completion request.
    pub request_log: Option<Mutex<std::io::LineWriter<std::fs::File>>>,
    /// `--send-log`: every finished completion's send instants.
    pub(crate) send_file: Option<SendFile>,
}

impl ServerState {
    pub fn new(
        spec: &SimSpec,
        mode: ServingMode,
        tokenizer: PromptTokenizer,
        cluster: Cluster,
        faults: watch::Receiver<Arc<FaultSpec>>,
        request_log: Option<std::fs::File>,
        send_file: Option<SendFile>,
    ) -> Self {
        ServerState {
            model: spec.model.clone(),
            max_model_len: spec.max_model_len,
            mode,
            tokenizer,
            cluster,
            faults,
            send_log: Mutex::new(SendLog::default()),
            frontend: FrontendMetrics::default(),
            record_send_times: spec.profile == "fixed" || send_file.is_some(),
            created: crate::clock::since_unix_epoch().as_secs(),
            reject_unknown_fields: spec.reject_unknown_fields,
            write_per_event: spec.write_per_event,
            reasoning_tokens: spec.reasoning_tokens,
            request_log: request_log.map(|f| Mutex::new(std::io::LineWriter::new(f))),
            send_file,
        }
    }
}

/// The API a completion request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat_completions",
            Endpoint::Completions => "completions",
        }
    }
}

/// Request-level bookkeeping shared by both answer shapes; records metrics once, even when the
/// client disconnects mid-stream (on drop).
pub(super) struct RequestTracker {
    pub(super) state: Arc<ServerState>,
    pub(super) outcome: RequestOutcome,
    /// When the request's first bytes reached the host (the kernel's stamp), where known: the
    /// send log's start of the request. `received`, when the server read it, starts its clock.
    pub(super) arrived: Option<Instant>,
    pub(super) received: Instant,
    pub(super) first_token: Option<Instant>,
    pub(super) last_token: Option<Instant>,
    pub(super) tokens: u32,
    pub(super) queued: bool,
    pub(super) finished: bool,
    pub(super) send_times: Option<Vec<Instant>>,
    pub(super) log_key: String,
}

impl RequestTracker {
    pub(super) fn token(&mut self, now: Instant) {
        self.tokens += 1;
        if self.first_token.is_none() {
            self.first_token = Some(now);
            self.queued = false;
            self.state
                .frontend
                .dequeued(Some(now.saturating_duration_since(self.received)));
        }
        self.last_token = Some(now);
        if let Some(t) = &mut self.send_times {
            t.push(now);
        }
    }

    pub(super) fn finish(&mut self, success: bool, completion: Option<&Completion>) {
        if self.finished {
            return;
        }
        self.finished = true;
        if self.queued {
            self.queued = false;
            self.state.frontend.dequeued(None);
        }
        self.outcome.success = success;
        let end = self.last_token.unwrap_or_else(Instant::now);
        let itl = match (self.first_token, self.last_token) {
            (Some(a), Some(b)) if self.tokens >= 2 => Some((b - a) / (self.tokens - 1)),
            _ => None,
        };
        self.state.frontend.request_finished(
            self.outcome,
            end.saturating_duration_since(self.received),
            completion.map(|c| (c.prompt_tokens, c.completion_tokens, c.cached_tokens, itl)),
        );
        if let Some(times) = self.send_times.take() {
            if let Some(f) = &self.state.send_file {
                f.write(
                    &self.log_key,
                    (self.arrived, self.received),
                    &times,
                    success,
                );
            }
            self.state
                .send_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(std::mem::take(&mut self.log_key), times);
        }
    }
}

impl Drop for RequestTracker {
    fn drop(&mut self) {
        // A client that hung up mid-stream: count it as an error, keep the gauges balanced.
        self.finish(false, None);
    }
}
