//! Leader election over a `coordination.k8s.io/v1` Lease, so several replicas can run for
//! availability while exactly one sends traffic, or, with sharding, each sends to its share.
//!
//! `kube-lease-manager` runs the Lease protocol (create, acquire, renew, release). On top of it a
//! fence re-reads the Lease every half grace period and lets this replica send only while the
//! Lease names it and its last renewal is younger than the lease duration minus half the grace
//! (the manager renews a whole grace before expiry, so a working renewal never trips it): the
//! manager alone keeps reporting "leader" through an API outage, and another replica may take
//! the Lease over once it expires, so the fence is what stops traffic within one lease period.
//!
//! Sharding: every replica holds its own member Lease `<lease_name>-member-<identity>`; the live
//! member Leases are the replicas, and each target belongs to one of them by rendezvous hashing,
//! so a replica joining or leaving moves only its own share.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use kube_lease_manager::{LeaseCreateMode, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::KubeError;

pub use crate::schedule::source::{Leadership, owner};

/// The Lease and timing of one election.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    /// Whole seconds (the Lease API's unit), at least 2.
    pub duration: Duration,
    /// Renewal happens this long before expiry; the fence stops sending at the same point.
    pub grace: Duration,
    pub sharding: bool,
}

impl LeaseSettings {
    pub fn new(
        lease_name: &str,
        namespace: &str,
        identity: &str,
        duration: Duration,
        sharding: bool,
    ) -> Result<LeaseSettings, KubeError> {
        let (secs, grace) = super::lease_timing(duration)?;
        Ok(LeaseSettings {
            lease_name: lease_name.to_owned(),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            duration: Duration::from_secs(secs),
            grace: Duration::from_secs(grace),
            sharding,
        })
    }

    /// The Lease this replica holds: the shared one, or its own member Lease when sharding.
    pub fn held_lease(&self) -> String {
        if self.sharding {
            format!("{}-member-{}", self.lease_name, self.identity)
        } else {
            self.lease_name.clone()
        }
    }

    fn check_period(&self) -> Duration {
        self.grace / 2
    }

    /// How long before expiry the fence stops sending: half the grace, so the manager's renewal
    /// (a whole grace before expiry) has half a grace to land before the fence would trip, and
    /// half a grace remains for clock skew before another replica may take over.
    fn fence_margin(&self) -> Duration {
        self.grace / 2
    }
}

/// Until when a Lease lets `identity` send: its last renewal plus the duration less `margin`,
/// as a monotonic instant (`None`: not the holder, or already past).
fn valid_until(lease: &Lease, identity: &str, margin: Duration, now: Instant) -> Option<Instant> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    remaining(spec, margin).map(|r| now + r)
}

/// Time left before `spec`'s holder must stop: renewal + duration − margin − now (wall clock, as
/// the Lease records it).
fn remaining(
    spec: &k8s_openapi::api::coordination::v1::LeaseSpec,
    margin: Duration,
) -> Option<Duration> {
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    let until = renewed.checked_add(duration.saturating_sub(margin)).ok()?;
    let left = until.duration_since(Timestamp::now());
    (left.is_positive()).then(|| left.unsigned_abs().min(duration))
}

/// Runs the election until `stop` (then releases the Lease). The receiver says, at every moment,
/// how this replica may send; it starts as [`Leadership::Standby`].
pub async fn elect(
    client: Client,
    settings: LeaseSettings,
    stop: CancellationToken,
    tasks: &TaskTracker,
) -> Result<watch::Receiver<Leadership>, KubeError> {
    let held = settings.held_lease();
    let manager = LeaseManagerBuilder::new(client.clone(), &held)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(settings.duration.as_secs())
        .with_grace(settings.grace.as_secs())
        .with_create_mode(LeaseCreateMode::AutoCreate)
        .build()
        .await
        .map_err(|e| KubeError::Lease {
            lease: held.clone(),
            message: e.to_string(),
        })?;
    let (mut manager_rx, manager_task) = manager.watch().await;
    let (tx, rx) = watch::channel(Leadership::Standby);
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    tasks.spawn(async move {
        let mut deadline: Option<Instant> = None;
        let mut members: Vec<String> = Vec::new();
        let mut manager_alive = true;
        loop {
            let wake = deadline.unwrap_or_else(|| Instant::now() + settings.check_period());
            let check = Instant::now() + settings.check_period();
            tokio::select! {
                _ = stop.cancelled() => break,
                r = manager_rx.changed(), if manager_alive => {
                    if r.is_err() {
                        tracing::error!(lease = %held, "the Lease manager stopped; this replica stops sending once its Lease runs out");
                        manager_alive = false;
                    }
                }
                _ = tokio::time::sleep_until(check.min(wake)) => {}
            }
            match observe(&api, &settings).await {
                Ok((until, live)) => {
                    deadline = until;
                    members = live;
                }
                // Keep the last confirmed deadline: the fence runs out by itself.
                Err(e) => tracing::warn!(lease = %held, error = %e, "cannot read the Lease"),
            }
            let now = Instant::now();
            let state = match deadline {
                Some(d) if now < d => {
                    if settings.sharding {
                        Leadership::Shard {
                            me: settings.identity.clone(),
                            members: members.clone(),
                        }
                    } else {
                        Leadership::Leading
                    }
                }
                _ => Leadership::Standby,
            };
            tx.send_if_modified(|current| {
                if *current == state {
                    return false;
                }
                tracing::info!(lease = %held, identity = %settings.identity, ?state, "leadership changed");
                *current = state;
                true
            });
        }
        tx.send_replace(Leadership::Standby);
        // Closing the manager's channel makes it release the Lease, so a standby takes over at
        // once instead of after expiry.
        drop(manager_rx);
        let _ = tokio::time::timeout(settings.duration, manager_task).await;
    });
    Ok(rx)
}

/// Reads the Lease(s): until when this replica may send, and the live members when sharding.
async fn observe(
    api: &Api<Lease>,
    settings: &LeaseSettings,
) -> Result<(Option<Instant>, Vec<String>), kube::Error> {
    let now = Instant::now();
    if !settings.sharding {
        let lease = api.get(&settings.lease_name).await?;
        return Ok((
            valid_until(&lease, &settings.identity, settings.fence_margin(), now),
            Vec::new(),
        ));
    }
    let prefix = format!("{}-member-", settings.lease_name);
    let list = api.list(&ListParams::default()).await?;
    let mut until = None;
    let mut members = Vec::new();
    for lease in &list.items {
        let Some(member) = lease.name_any().strip_prefix(&prefix).map(str::to_owned) else {
            continue;
        };
        let Some(spec) = &lease.spec else { continue };
        // Another replica's share stays its own until its Lease could have expired.
        if spec.holder_identity.as_deref() == Some(member.as_str())
            && remaining(spec, Duration::ZERO).is_some()
        {
            if member == settings.identity {
                until = valid_until(lease, &settings.identity, settings.fence_margin(), now);
            }
            members.push(member);
        }
    }
    members.sort();
    Ok((until, members))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_moves_only_the_leaving_members_share() {
        let three: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let two: Vec<String> = ["a", "c"].map(String::from).to_vec();
        let targets: Vec<String> = (0..200).map(|i| format!("t{i}")).collect();
        let mut per_member = std::collections::BTreeMap::new();
        for t in &targets {
            let o3 = owner(t, &three).unwrap();
            *per_member.entry(o3).or_insert(0) += 1;
            if o3 != "b" {
                assert_eq!(
                    owner(t, &two),
                    Some(o3),
                    "{t} moved although its owner stayed"
                );
            }
        }
        // Every member gets a real share.
        assert!(per_member.values().all(|&n| n > 40), "{per_member:?}");
    }

    #[test]
    fn sends_to_by_role() {
        assert!(!Leadership::Standby.sends_to("x"));
        assert!(Leadership::Leading.sends_to("x"));
        let members: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let a = Leadership::Shard {
            me: "a".into(),
            members: members.clone(),
        };
        let b = Leadership::Shard {
            me: "b".into(),
            members,
        };
        for t in ["x", "y", "z", "w"] {
            assert!(a.sends_to(t) != b.sends_to(t), "{t} has exactly one owner");
        }
    }
}
