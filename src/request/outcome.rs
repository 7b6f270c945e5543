//! How a request ended: the `outcome` label of docs/DESIGN.md §4 and §6, one enum that every
//! consumer matches on (never its text).

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use serde::{Deserialize, Serialize};

/// How a request ended: the `outcome` label (docs/DESIGN.md §4 and §6). `osl_mismatch` is not an outcome;
/// it is counted separately, see the client's `RequestRecord::osl_mismatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The stream ended with `[DONE]`.
    Ok,
    /// No connection: refused, unresolvable, or the connect timeout passed.
    Connect,
    /// No complete response within the per-request timeout.
    Timeout,
    /// A 4xx status other than 429.
    Http4xx,
    Http429,
    Http5xx,
    /// The server reported a failure inside the stream: an `event: error` frame or an
    /// `{"error": ...}` data chunk.
    StreamError,
    /// The response ended (EOF or a broken connection) without `[DONE]`.
    StreamTruncated,
    /// Unparseable: a chunk that is not JSON, a line over the size cap, a non-SSE content type on
    /// a success status, or another unexpected status.
    BadResponse,
    /// The canary abandoned the request on purpose (a workload's `cancel` scenario): neither a
    /// success nor an error.
    Cancelled,
}

impl Outcome {
    /// Every outcome, for registering metric series up front.
    pub const ALL: [Outcome; 10] = [
        Outcome::Ok,
        Outcome::Connect,
        Outcome::Timeout,
        Outcome::Http4xx,
        Outcome::Http429,
        Outcome::Http5xx,
        Outcome::StreamError,
        Outcome::StreamTruncated,
        Outcome::BadResponse,
        Outcome::Cancelled,
    ];

    /// The label value (contract).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Connect => "connect",
            Outcome::Timeout => "timeout",
            Outcome::Http4xx => "http_4xx",
            Outcome::Http429 => "http_429",
            Outcome::Http5xx => "http_5xx",
            Outcome::StreamError => "stream_error",
            Outcome::StreamTruncated => "stream_truncated",
            Outcome::BadResponse => "bad_response",
            Outcome::Cancelled => "cancelled",
        }
    }

    pub fn is_ok(self) -> bool {
        self == Outcome::Ok
    }

    /// A failure of the server or the path to it: anything but `ok` and `cancelled` (a
    /// cancellation is the canary's choice, not the server's fault).
    pub fn is_error(self) -> bool {
        !matches!(self, Outcome::Ok | Outcome::Cancelled)
    }

    /// Whether the request found the target serving (`llm_canary_target_up`, the status page's
    /// up or down). Any HTTP answer counts (a 429 or 503 still comes from a live server) and so
    /// does a stream that ended, even badly; no connection does not, and neither does a timeout:
    /// a target that accepts requests and then stalls (after its headers, or mid-stream) is not
    /// serving.
    pub fn reached_target(self) -> bool {
        !matches!(self, Outcome::Connect | Outcome::Timeout)
    }

    /// The outcome of a non-success HTTP status.
    pub fn from_status(status: u16) -> Outcome {
        match status {
            429 => Outcome::Http429,
            400..=499 => Outcome::Http4xx,
            500..=599 => Outcome::Http5xx,
            _ => Outcome::BadResponse,
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `outcome` label value, written without allocating.
impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

/// Ordered by label, so maps keyed by outcome (a step's `outcomes`, in `summary.json` and the
/// reports) list them alphabetically.
impl Ord for Outcome {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for Outcome {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
