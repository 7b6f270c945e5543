//! Discovered deployments as a target source of the schedule: every DynamoGraphDeployment that
//! discovery reports is resolved (model `auto`, key files) into a target with its workers'
//! metrics endpoints, and the set is published for the scheduler, which re-reads it at every step
//! start. A deployment that cannot be resolved yet is retried every [`RETRY`] without holding
//! the others back. The deployments are also the objects the SLO Events about a target go on.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::discovery::DiscoveredTarget;
use super::events::SloEvents;
use crate::client::StreamClient;
use crate::schedule::{Target, TargetSet};
use crate::scrape::ScrapeTarget;

/// How often a discovered deployment that could not be resolved is tried again.
pub const RETRY: Duration = Duration::from_secs(15);

/// Resolves what discovery reports and publishes the targets until `stop`.
pub struct DiscoveredTargets {
    pub discovered: watch::Receiver<Vec<DiscoveredTarget>>,
    pub client: StreamClient,
    /// Relative key-file paths resolve against this.
    pub base_dir: PathBuf,
    pub events: Option<Arc<SloEvents>>,
}

impl DiscoveredTargets {
    /// Starts resolving until `stop`, a task of `tasks` (the run's tracker, so a stop awaits
    /// it); the returned set changes whenever a deployment comes, goes or changes.
    pub fn spawn(self, stop: CancellationToken, tasks: &TaskTracker) -> watch::Receiver<TargetSet> {
        let (tx, rx) = watch::channel(TargetSet::default());
        tasks.spawn(self.run(tx, stop));
        rx
    }

    async fn run(mut self, tx: watch::Sender<TargetSet>, stop: CancellationToken) {
        let mut resolved: BTreeMap<String, (DiscoveredTarget, Arc<Target>)> = BTreeMap::new();
        loop {
            let discovered = self.discovered.borrow_and_update().clone();
            let before: Vec<_> = resolved.values().map(|(_, t)| Arc::clone(t)).collect();
            resolved.retain(|name, (d, _)| discovered.iter().any(|n| n.name == *name && n == d));
            let mut pending = false;
            for d in &discovered {
                if resolved.contains_key(&d.name) {
                    continue;
                }
                let config = d.to_config();
                let resolving =
                    crate::targets::resolve_target(&config, &self.base_dir, &self.client);
                let outcome = tokio::select! {
                    r = resolving => r,
                    _ = stop.cancelled() => return,
                };
                match outcome {
                    Ok(t) => {
                        resolved.insert(d.name.clone(), (d.clone(), Arc::new(t)));
                    }
                    Err(e) => {
                        pending = true;
                        tracing::warn!(target = %d.name, error = %e, "discovered target not reachable yet; retrying");
                    }
                }
            }
            let now: Vec<_> = resolved.values().map(|(_, t)| Arc::clone(t)).collect();
            let changed = now.len() != before.len()
                || now.iter().zip(&before).any(|(a, b)| !Arc::ptr_eq(a, b));
            if changed {
                if let Some(events) = &self.events {
                    events.set_objects(
                        resolved
                            .iter()
                            .map(|(name, (d, _))| (name.clone(), d.reference()))
                            .collect(),
                    );
                }
                tx.send_replace(TargetSet {
                    targets: now,
                    scrape: resolved
                        .values()
                        .filter(|(d, _)| !d.server_metrics.is_empty())
                        .map(|(d, _)| ScrapeTarget {
                            name: d.name.clone(),
                            urls: d.server_metrics.clone(),
                        })
                        .collect(),
                });
            }
            let retry = async {
                if pending {
                    tokio::time::sleep(RETRY).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                r = self.discovered.changed() => if r.is_err() { return },
                _ = retry => {}
            }
        }
    }
}
