//! What a client of the HTTP surface may hold, and for how long: the connection pools (all
//! peers, one peer, the health reserve), the `/metrics` responses in flight, and the time limits
//! on reading a head or a body and on writing a response, the last derived from the response's
//! size.

use std::time::Duration;

/// How long and how many a client may hold (defaults in [`HttpLimits::default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HttpLimits {
    /// Connections served at once, the health reserve included; more are closed on accept.
    /// Prometheus replicas, probes and an operator's curl need a handful.
    pub max_connections: usize,
    /// Connections one peer (source IP address) may hold of the general pool, so a single client
    /// holding idle connections cannot take every slot (issue 40: 256 idle connections from one
    /// pod took `/-/healthy` down, and with it the liveness probe). Several clients behind one
    /// address (a proxy, an SNAT) share it.
    pub max_connections_per_peer: usize,
    /// Of `max_connections` (at most half of them), the slots kept back for `/-/healthy` and
    /// `/-/ready`: a connection the full general pool turns away, from a peer below its share,
    /// is still read, answered if it asks for a health path and refused with 503 otherwise, so
    /// the kubelet's probes answer while the data endpoints are saturated. One request each, a
    /// short head timeout and at most [`RESERVE_PER_PEER`] per peer (`export::admission` says
    /// why).
    pub health_connections: usize,
    /// A request head not complete within this closes the connection: idle keep-alive ones
    /// too (hyper restarts the limit whenever a connection waits for a new head), so an idle
    /// connection holds its slot for at most this long.
    pub header_read_timeout: Duration,
    /// A body not received within this is refused with 408, so a client trickling bytes cannot
    /// hold a connection.
    pub body_read_timeout: Duration,
    /// A response the client stops reading for this long is abandoned and its connection closed,
    /// so a stalled scraper holds neither a connection nor the encoded exposition.
    pub write_stall_timeout: Duration,
    /// The longest any response may take to be written, whatever its size (see
    /// [`HttpLimits::write_deadline`]): a client reading a byte now and then never trips the
    /// stall limit, but cannot hold a response for longer than this.
    pub response_timeout: Duration,
    /// Every response may take this long to be written, plus its size at
    /// `min_read_bytes_per_second`.
    pub response_time_floor: Duration,
    /// The slowest reader a response waits for beyond `response_time_floor`: a 14.6 MB
    /// exposition must be read within 5 s + 14 s at 1 MiB/s, so clients that never read a large
    /// exposition give its `/metrics` slot back long before the stall limit.
    pub min_read_bytes_per_second: u64,
    /// `/metrics` responses in flight at once (each holds its encoding until written); more are
    /// answered 503 with `Retry-After`. Prometheus replicas scrape one at a time each.
    pub max_metrics_responses: usize,
    /// `/metrics` responses one peer may have in flight: clients on one host that ask and never
    /// read cannot hold every slot, so the other scrapers are answered.
    pub max_metrics_responses_per_peer: usize,
    /// Refusals are counted one by one (`llm_canary_http_refused_total`) but logged at most once
    /// per this interval, as a summary: a flood of refused connections must not become a flood
    /// of log lines (issue 40: 214,664 lines in 25 s).
    pub refusal_log_interval: Duration,
}

/// Health-reserve connections one peer may hold: the kubelet's liveness and readiness probes
/// may arrive together from the node's address.
pub const RESERVE_PER_PEER: usize = 2;

/// The head timeout of a health-reserve connection (or `header_read_timeout` if shorter): a probe
/// sends its head as soon as it has connected, and an idle connection there keeps a probe out.
pub const RESERVE_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 256,
            max_connections_per_peer: 64,
            health_connections: 8,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            write_stall_timeout: Duration::from_secs(30),
            response_timeout: Duration::from_secs(60),
            response_time_floor: Duration::from_secs(5),
            min_read_bytes_per_second: 1024 * 1024,
            max_metrics_responses: 8,
            max_metrics_responses_per_peer: 2,
            refusal_log_interval: Duration::from_secs(10),
        }
    }
}

impl HttpLimits {
    /// How long a response of `bytes` may take to be written from its first write on:
    /// `response_time_floor` plus its size at `min_read_bytes_per_second` (about 1 ms per KiB by
    /// default), at most `response_timeout`. Bounded by the size rather than by one figure for
    /// all, so a small answer cannot be held for a minute and a large exposition is not cut
    /// while read at a reasonable speed.
    pub fn write_deadline(&self, bytes: u64) -> Duration {
        let rate = self.min_read_bytes_per_second.max(1);
        let transfer = Duration::from_secs_f64(bytes as f64 / rate as f64);
        self.response_time_floor
            .saturating_add(transfer)
            .min(self.response_timeout)
    }

    /// The head timeout of a health-reserve connection.
    pub fn reserve_header_read_timeout(&self) -> Duration {
        RESERVE_HEADER_READ_TIMEOUT.min(self.header_read_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_deadline_grows_with_the_size_up_to_the_response_timeout() {
        let limits = HttpLimits::default();
        assert_eq!(limits.write_deadline(0), Duration::from_secs(5));
        assert_eq!(
            limits.write_deadline(10 * 1024 * 1024),
            Duration::from_secs(15)
        );
        // The 14.6 MB exposition of issue 40: about 19 s.
        let large = limits.write_deadline(14_600_000).as_secs_f64();
        assert!((18.9..19.0).contains(&large), "{large}");
        assert_eq!(limits.write_deadline(u64::MAX), limits.response_timeout);
        let unbounded_rate = HttpLimits {
            min_read_bytes_per_second: 0,
            ..limits
        };
        assert_eq!(
            unbounded_rate.write_deadline(1 << 40),
            limits.response_timeout
        );
    }
}
