//! Which connections and `/metrics` responses the HTTP surface takes on, per peer (source IP
//! address) and in all: the general pool with each peer's share of it, the health reserve kept
//! back for `/-/healthy` and `/-/ready`, and the `/metrics` response slots. A slot is held by a
//! value that gives it back when dropped.
//!
//! Why a reserve, and who gets it: the per-peer share stops one client from holding every
//! slot, but several (or many legitimate scrapers and slow readers) can still fill the pool,
//! and the kubelet's liveness probe failing there restarts a canary that is fine. So a few slots
//! are kept back, and a connection the full pool turns away is still read: a health request is
//! answered, anything else gets 503. A peer already holding its whole share gets none of the
//! reserve (it is the one filling the pool; a flood from one address must not take the
//! reserve too), and no peer more than [`RESERVE_PER_PEER`]; a reserve connection answers one
//! request and has a short head timeout, so idle connections hold it only briefly.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use super::limits::{HttpLimits, RESERVE_PER_PEER};
use super::refusals::Refusal;

/// What one peer holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Held {
    connections: usize,
    reserve: usize,
    metrics: usize,
}

impl Held {
    fn get(&mut self, kind: Kind) -> &mut usize {
        match kind {
            Kind::Connection => &mut self.connections,
            Kind::Reserve => &mut self.reserve,
            Kind::MetricsResponse => &mut self.metrics,
        }
    }
}

#[derive(Debug, Default)]
struct Ledger {
    total: Held,
    /// Only peers holding something: an entry goes with its last slot, so the map is as large as
    /// the number of peers connected now.
    peers: HashMap<IpAddr, Held>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Connection,
    Reserve,
    MetricsResponse,
}

/// The slots of the HTTP surface and who holds them.
#[derive(Debug)]
pub struct Admission {
    /// The general pool: `max_connections` less the reserve.
    general: usize,
    per_peer: usize,
    reserve: usize,
    metrics: usize,
    metrics_per_peer: usize,
    ledger: Mutex<Ledger>,
}

/// A connection taken on.
#[derive(Debug)]
pub enum Admitted {
    /// A slot of the general pool: every endpoint.
    Served(Slot),
    /// A health-reserve slot, for a peer below its share that the full general pool turned
    /// away: one request, answered only on the health paths.
    HealthOnly(Slot),
}

/// A slot held until dropped.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    peer: IpAddr,
    kind: Kind,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut ledger = self.admission.lock();
        *ledger.total.get(self.kind) -= 1;
        if let Some(held) = ledger.peers.get_mut(&self.peer) {
            *held.get(self.kind) -= 1;
            if *held == Held::default() {
                ledger.peers.remove(&self.peer);
            }
        }
    }
}

impl Admission {
    pub fn new(limits: &HttpLimits) -> Self {
        // At most half the slots: the reserve serves probes, not the surface.
        let reserve = limits.health_connections.min(limits.max_connections / 2);
        Self {
            general: limits.max_connections - reserve,
            per_peer: limits.max_connections_per_peer,
            reserve,
            metrics: limits.max_metrics_responses,
            metrics_per_peer: limits.max_metrics_responses_per_peer,
            ledger: Mutex::new(Ledger::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes on a new connection from `peer`: a general slot within the peer's share; else, for
    /// a peer below its share, a health-reserve slot; else the reason it is refused.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admitted, Refusal> {
        let mut ledger = self.lock();
        let held = ledger.peers.get(&peer).copied().unwrap_or_default();
        if held.connections >= self.per_peer {
            return Err(Refusal::PeerConnectionLimit);
        }
        if ledger.total.connections < self.general {
            Self::take(&mut ledger, peer, Kind::Connection);
            return Ok(Admitted::Served(self.slot(peer, Kind::Connection)));
        }
        if ledger.total.reserve >= self.reserve || held.reserve >= RESERVE_PER_PEER {
            return Err(Refusal::ConnectionLimit);
        }
        Self::take(&mut ledger, peer, Kind::Reserve);
        Ok(Admitted::HealthOnly(self.slot(peer, Kind::Reserve)))
    }

    /// A `/metrics` response slot for `peer`, held by the response's body until it is written or
    /// dropped.
    pub fn metrics_response(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Refusal> {
        let mut ledger = self.lock();
        if ledger.total.metrics >= self.metrics {
            return Err(Refusal::MetricsResponses);
        }
        let held = ledger.peers.get(&peer).map_or(0, |h| h.metrics);
        if held >= self.metrics_per_peer {
            return Err(Refusal::PeerMetricsResponses);
        }
        Self::take(&mut ledger, peer, Kind::MetricsResponse);
        Ok(self.slot(peer, Kind::MetricsResponse))
    }

    fn take(ledger: &mut Ledger, peer: IpAddr, kind: Kind) {
        *ledger.total.get(kind) += 1;
        *ledger.peers.entry(peer).or_default().get(kind) += 1;
    }

    fn slot(self: &Arc<Self>, peer: IpAddr, kind: Kind) -> Slot {
        Slot {
            admission: Arc::clone(self),
            peer,
            kind,
        }
    }

    /// How many peers hold a slot now.
    #[cfg(test)]
    fn peers(&self) -> usize {
        self.lock().peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    fn admission(connections: usize, per_peer: usize, reserve: usize) -> Arc<Admission> {
        Arc::new(Admission::new(&HttpLimits {
            max_connections: connections,
            max_connections_per_peer: per_peer,
            health_connections: reserve,
            max_metrics_responses: 4,
            max_metrics_responses_per_peer: 2,
            ..HttpLimits::default()
        }))
    }

    fn served(admitted: Result<Admitted, Refusal>) -> Slot {
        match admitted {
            Ok(Admitted::Served(slot)) => slot,
            other => panic!("not served: {other:?}"),
        }
    }

    fn health_only(admitted: Result<Admitted, Refusal>) -> Slot {
        match admitted {
            Ok(Admitted::HealthOnly(slot)) => slot,
            other => panic!("not health-only: {other:?}"),
        }
    }

    #[test]
    fn one_peer_gets_its_share_and_no_more() {
        let admission = admission(12, 4, 4);
        let mut held: Vec<Slot> = (0..4).map(|_| served(admission.admit(peer(1)))).collect();
        // Its share is taken: neither the pool nor the reserve has more for it.
        assert_eq!(
            admission.admit(peer(1)).err(),
            Some(Refusal::PeerConnectionLimit)
        );
        // Another peer is served from the general pool.
        let other = served(admission.admit(peer(2)));
        // A slot given back is the peer's again.
        held.pop();
        held.push(served(admission.admit(peer(1))));
        drop((held, other));
        assert_eq!(admission.peers(), 0, "every entry goes with its last slot");
    }

    #[test]
    fn a_full_general_pool_leaves_the_reserve_to_peers_below_their_share() {
        let admission = admission(10, 3, 4);
        // Peers 1 and 2 fill the general pool (10 - 4 = 6 slots), 3 each: their share.
        let _held: Vec<Slot> = (0..6u8)
            .map(|i| served(admission.admit(peer(1 + i % 2))))
            .collect();
        for p in [1, 2] {
            assert_eq!(
                admission.admit(peer(p)).err(),
                Some(Refusal::PeerConnectionLimit)
            );
        }
        // The reserve goes to the others, two per peer, four in all.
        let mut reserve: Vec<Slot> = Vec::new();
        for p in 3..5 {
            for _ in 0..RESERVE_PER_PEER {
                reserve.push(health_only(admission.admit(peer(p))));
            }
            if p == 3 {
                assert_eq!(
                    admission.admit(peer(p)).err(),
                    Some(Refusal::ConnectionLimit),
                    "a third reserve slot for one peer"
                );
            }
        }
        assert_eq!(
            admission.admit(peer(5)).err(),
            Some(Refusal::ConnectionLimit)
        );
        reserve.pop();
        let _probe = health_only(admission.admit(peer(5)));
    }

    #[test]
    fn metrics_responses_are_bounded_in_all_and_per_peer() {
        let admission = admission(12, 4, 4);
        let a: Vec<Slot> = (0..2)
            .map(|_| admission.metrics_response(peer(1)).expect("slot"))
            .collect();
        assert_eq!(
            admission.metrics_response(peer(1)).err(),
            Some(Refusal::PeerMetricsResponses)
        );
        let b: Vec<Slot> = (0..2)
            .map(|_| admission.metrics_response(peer(2)).expect("slot"))
            .collect();
        assert_eq!(
            admission.metrics_response(peer(3)).err(),
            Some(Refusal::MetricsResponses)
        );
        drop(a);
        assert!(admission.metrics_response(peer(3)).is_ok());
        drop(b);
        assert_eq!(admission.peers(), 0);
    }
}
