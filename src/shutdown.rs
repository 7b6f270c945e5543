//! The shutdown tree of a run: one root token with a child per stage of the stop, and a tracker
//! of every task the run spawns, so that stopping is one ordered sequence and no task is left
//! behind. A stop first ends sending (`stop_sending`) and lets the requests in flight drain;
//! after the drain bound they are cut (`cut`); once the schedule has returned, every service
//! (HTTP surface, config watch, discovery, SLO evaluation, scrapes) stops with the root and the
//! tracked tasks are awaited.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A run's stop tokens and its tasks. Clones share them.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    root: CancellationToken,
    soft: CancellationToken,
    hard: CancellationToken,
    tasks: TaskTracker,
}

impl Shutdown {
    pub fn new() -> Shutdown {
        let root = CancellationToken::new();
        Shutdown {
            soft: root.child_token(),
            hard: root.child_token(),
            root,
            tasks: TaskTracker::new(),
        }
    }

    /// Cancelled when sending must stop; requests in flight still get their drain.
    pub fn stop_sending(&self) -> &CancellationToken {
        &self.soft
    }

    /// Cancelled when requests in flight must be cut now (they count as `timeout`).
    pub fn cut(&self) -> &CancellationToken {
        &self.hard
    }

    /// A token for a service that runs until the whole run ends.
    pub fn service(&self) -> CancellationToken {
        self.root.child_token()
    }

    /// Whether a stop has begun.
    pub fn stopping(&self) -> bool {
        self.soft.is_cancelled()
    }

    /// Spawns `task` onto the runtime, tracked: [`Shutdown::finish`] waits for it.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(task)
    }

    /// The tracker of the run's tasks, for code that spawns its own.
    pub fn tracker(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Begins a stop: sending ends now, and what is still in flight `drain` later is cut.
    pub fn drain(&self, drain: Duration) {
        self.soft.cancel();
        let (hard, root) = (self.hard.clone(), self.root.clone());
        self.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(drain) => hard.cancel(),
                _ = root.cancelled() => {}
            }
        });
    }

    /// Ends the run: every service stops with the root, and every tracked task is awaited for
    /// at most `bound`. Returns whether they all ended in time.
    pub async fn finish(&self, bound: Duration) -> bool {
        self.root.cancel();
        self.tasks.close();
        tokio::time::timeout(bound, self.tasks.wait()).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stop_drains_then_cuts_then_stops_the_services_and_waits() {
        let s = Shutdown::new();
        let service = s.service();
        let ended = s.spawn({
            let service = service.clone();
            async move { service.cancelled().await }
        });
        s.drain(Duration::from_secs(10));
        assert!(s.stop_sending().is_cancelled());
        assert!(!s.cut().is_cancelled(), "in-flight requests get the drain");
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(s.cut().is_cancelled());
        assert!(!service.is_cancelled(), "services run until the end");
        assert!(s.finish(Duration::from_secs(1)).await);
        assert!(service.is_cancelled() && ended.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn finish_is_bounded_by_a_task_that_never_ends() {
        let s = Shutdown::new();
        s.spawn(std::future::pending::<()>());
        assert!(!s.finish(Duration::from_secs(2)).await);
    }
}
