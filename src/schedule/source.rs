//! Where each step's targets come from: the published target sets (the configured targets, which
//! a reload replaces, and the discovered ones) and, in a cluster, the permit of leader election
//! or sharding that says which of them this replica sends to. The scheduler re-reads them at
//! every step start; a run with fixed targets (the bench, the tests) is one set that never
//! changes.

use std::sync::Arc;

use futures_util::future::{FutureExt, select_all};
use tokio::sync::watch;

use super::target::Target;
use crate::scrape::ScrapeTarget;

/// Targets and the endpoints of their servers' own metrics, as one source publishes them.
#[derive(Debug, Clone, Default)]
pub struct TargetSet {
    pub targets: Vec<Arc<Target>>,
    pub scrape: Vec<ScrapeTarget>,
}

/// How this replica takes part in sending traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// Another replica leads (or the Lease is not confirmed): send nothing.
    Standby,
    /// This replica holds the Lease: send to every target.
    Leading,
    /// Sharding: send to the targets whose owner among `members` (sorted) is `me`.
    Shard { me: String, members: Vec<String> },
}

impl Leadership {
    /// Whether this replica sends traffic to `target`.
    pub fn sends_to(&self, target: &str) -> bool {
        match self {
            Leadership::Standby => false,
            Leadership::Leading => true,
            Leadership::Shard { me, members } => owner(target, members) == Some(me.as_str()),
        }
    }

    pub fn is_active(&self) -> bool {
        !matches!(self, Leadership::Standby)
    }
}

/// The member a target belongs to: the highest rendezvous hash of (member, target).
pub fn owner<'a>(target: &str, members: &'a [String]) -> Option<&'a str> {
    members
        .iter()
        .max_by_key(|m| fnv1a(m.as_bytes(), target.as_bytes()))
        .map(String::as_str)
}

/// FNV-1a over both strings, then the splitmix64 finaliser: stable across processes and
/// versions (unlike `DefaultHasher`), and names differing in one byte still spread evenly (plain
/// FNV-1a ranks them the same way for every target).
fn fnv1a(a: &[u8], b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in a.iter().chain(&[0xff]).chain(b) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Every source of targets and the permit to send to them.
pub struct TargetSource {
    sets: Vec<watch::Receiver<TargetSet>>,
    /// `None`: no election, this replica sends to every target.
    leadership: Option<watch::Receiver<Leadership>>,
}

impl TargetSource {
    /// Targets that never change.
    pub fn fixed(set: TargetSet) -> TargetSource {
        let (_publisher, set) = watch::channel(set);
        TargetSource::new(vec![set], None)
    }

    /// The union of `sets` (in order; a name seen twice keeps its first), filtered by
    /// `leadership` when there is an election.
    pub fn new(
        sets: Vec<watch::Receiver<TargetSet>>,
        leadership: Option<watch::Receiver<Leadership>>,
    ) -> TargetSource {
        TargetSource { sets, leadership }
    }

    /// How this replica may send now.
    pub fn leadership(&self) -> Leadership {
        self.leadership
            .as_ref()
            .map(|l| l.borrow().clone())
            .unwrap_or(Leadership::Leading)
    }

    /// The targets this replica sends to now, with their scrape endpoints. Everything read is
    /// marked seen, so [`TargetSource::changed`] wakes on the next change only.
    pub fn current(&mut self) -> TargetSet {
        let leadership = match &mut self.leadership {
            Some(l) => l.borrow_and_update().clone(),
            None => Leadership::Leading,
        };
        let mut out = TargetSet::default();
        for set in &mut self.sets {
            let set = set.borrow_and_update();
            for t in &set.targets {
                if leadership.sends_to(&t.name) && !out.targets.iter().any(|o| o.name == t.name) {
                    out.targets.push(Arc::clone(t));
                }
            }
            for s in &set.scrape {
                let mine = out.targets.iter().any(|t| t.name == s.name);
                if mine && !out.scrape.iter().any(|o| o.name == s.name) {
                    out.scrape.push(s.clone());
                }
            }
        }
        out
    }

    /// Resolves when a target set or the permit changes after the last [`TargetSource::current`];
    /// never when nothing can change.
    pub async fn changed(&self) {
        let mut waits: Vec<_> = self
            .sets
            .iter()
            .map(|s| changed(s.clone()).boxed())
            .collect();
        if let Some(l) = &self.leadership {
            waits.push(changed(l.clone()).boxed());
        }
        if waits.is_empty() {
            return std::future::pending().await;
        }
        select_all(waits).await;
    }

    /// Resolves once this replica may no longer send (its Lease is lost); never without an
    /// election.
    pub async fn permit_lost(&self) {
        match self.leadership.clone() {
            Some(mut l) => {
                if l.wait_for(|s| !s.is_active()).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

/// Resolves when the watched value changes; never once its publisher is gone.
async fn changed<T>(mut rx: watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}
