//! Clients the HTTP surface turned away or cut off: each one counted in
//! `llm_canary_http_refused_total{reason}`, and all of them logged as at most one summary line
//! per interval, so a flood of refused connections is a number on a dashboard and a line every
//! few seconds, never a log flood (issue 40: one WARN per refused connection made 214,664 lines
//! in 25 s).

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::metrics::Metrics;

/// Why a client was refused or cut off: the `reason` label of `llm_canary_http_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Every slot of the general pool is held.
    #[error("the HTTP connection limit is reached")]
    ConnectionLimit,
    /// The peer holds its share of the general pool.
    #[error("this address holds its share of the HTTP connections")]
    PeerConnectionLimit,
    /// Every `/metrics` response slot is held.
    #[error("too many /metrics responses in flight")]
    MetricsResponses,
    /// The peer holds its share of the `/metrics` response slots.
    #[error("this address has its share of the /metrics responses in flight")]
    PeerMetricsResponses,
    /// A response was not written within its size's deadline.
    #[error("the client took too long to read the response")]
    WriteDeadline,
    /// The client stopped reading a response for the stall limit.
    #[error("the client stopped reading the response")]
    WriteStall,
}

impl Refusal {
    pub const ALL: [Refusal; 6] = [
        Refusal::ConnectionLimit,
        Refusal::PeerConnectionLimit,
        Refusal::MetricsResponses,
        Refusal::PeerMetricsResponses,
        Refusal::WriteDeadline,
        Refusal::WriteStall,
    ];

    /// The `reason` label value.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::ConnectionLimit => "connection_limit",
            Refusal::PeerConnectionLimit => "peer_connection_limit",
            Refusal::MetricsResponses => "metrics_responses",
            Refusal::PeerMetricsResponses => "peer_metrics_responses",
            Refusal::WriteDeadline => "write_deadline",
            Refusal::WriteStall => "write_stall",
        }
    }
}

/// The refusals since the last log line.
#[derive(Debug, Default)]
struct Pending {
    last_line: Option<Instant>,
    /// When the first refusal not yet logged happened.
    first: Option<Instant>,
    counts: [u64; Refusal::ALL.len()],
    last_peer: Option<IpAddr>,
}

/// Counts and logs refusals (shared by the accept loop, the handlers and every connection's
/// write guard).
#[derive(Debug)]
pub struct Refusals {
    metrics: Arc<Metrics>,
    interval: Duration,
    pending: Mutex<Pending>,
}

impl Refusals {
    /// Creates every reason's series at 0, so an alert on their `rate()` has its starting point.
    pub fn new(metrics: Arc<Metrics>, interval: Duration) -> Self {
        for why in Refusal::ALL {
            metrics.record_http_refused(why.reason(), 0);
        }
        Self {
            metrics,
            interval,
            pending: Mutex::new(Pending::default()),
        }
    }

    /// Counts one refusal of `peer`. The first one after a quiet interval is logged at once; the
    /// rest wait for the next line ([`Refusals::flush`] or a later refusal once the interval
    /// has passed).
    pub fn refuse(&self, why: Refusal, peer: IpAddr) {
        self.metrics.record_http_refused(why.reason(), 1);
        let now = Instant::now();
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let index = Refusal::ALL.iter().position(|r| *r == why).unwrap_or(0);
        pending.counts[index] += 1;
        pending.first.get_or_insert(now);
        pending.last_peer = Some(peer);
        self.log_if_due(pending, now);
    }

    /// Logs what was refused since the last line, if anything was and the interval has passed
    /// (the accept loop calls it every interval, so the tail of a flood is reported too).
    pub fn flush(&self) {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        self.log_if_due(pending, Instant::now());
    }

    fn log_if_due(&self, mut pending: std::sync::MutexGuard<'_, Pending>, now: Instant) {
        let due = pending
            .last_line
            .is_none_or(|last| now.duration_since(last) >= self.interval);
        let Some(first) = pending.first.filter(|_| due) else {
            return;
        };
        let counts = std::mem::take(&mut pending.counts);
        let last_peer = pending.last_peer.take();
        pending.first = None;
        pending.last_line = Some(now);
        drop(pending);
        let refused: u64 = counts.iter().sum();
        let reasons = Refusal::ALL
            .iter()
            .zip(counts)
            .filter(|(_, n)| *n > 0)
            .map(|(why, n)| format!("{} {n}", why.reason()))
            .collect::<Vec<_>>()
            .join(", ");
        let last_peer = last_peer.map_or_else(String::new, |p| p.to_string());
        tracing::warn!(
            refused,
            reasons = %reasons,
            over = ?now.duration_since(first),
            %last_peer,
            "HTTP clients refused or cut off at the canary's limits (llm_canary_http_refused_total counts each; at most one such line per {:?})",
            self.interval,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::testing::sample;

    fn refused(metrics: &Metrics, reason: &str) -> Option<f64> {
        let text = metrics.encode().expect("encode");
        sample(
            &text,
            "llm_canary_http_refused_total",
            &[("reason", reason)],
        )
    }

    #[tokio::test(start_paused = true)]
    async fn every_refusal_is_counted_and_a_line_is_due_once_per_interval() {
        let metrics = Arc::new(Metrics::new(&[]));
        let refusals = Refusals::new(metrics.clone(), Duration::from_secs(10));
        for why in Refusal::ALL {
            assert_eq!(refused(&metrics, why.reason()), Some(0.0), "{why:?}");
        }
        let peer: IpAddr = "10.0.0.7".parse().unwrap();
        refusals.refuse(Refusal::PeerConnectionLimit, peer);
        // Logged at once: nothing is pending, and the next line is not due for 10 s.
        let last = refusals.pending.lock().unwrap().last_line;
        assert!(last.is_some());
        for _ in 0..1000 {
            refusals.refuse(Refusal::PeerConnectionLimit, peer);
        }
        refusals.refuse(Refusal::WriteDeadline, peer);
        refusals.flush();
        {
            let pending = refusals.pending.lock().unwrap();
            assert_eq!(pending.last_line, last, "a second line within the interval");
            assert_eq!(pending.counts.iter().sum::<u64>(), 1001);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        refusals.flush();
        {
            let pending = refusals.pending.lock().unwrap();
            assert_ne!(pending.last_line, last);
            assert_eq!(pending.counts.iter().sum::<u64>(), 0);
            assert_eq!(pending.first, None);
        }
        assert_eq!(refused(&metrics, "peer_connection_limit"), Some(1001.0));
        assert_eq!(refused(&metrics, "write_deadline"), Some(1.0));
        assert_eq!(refused(&metrics, "connection_limit"), Some(0.0));
    }
}
