//! The shutdown tree of a run: one root token with a child per stage of the stop, and a tracker
//! of every task the run spawns, so that stopping is one ordered sequence and no task is left
//! behind. A stop first ends sending (`stop_sending`) and lets the requests in flight drain;
//! after the drain bound they are cut (`cut`); once the schedule has returned, every service
//! (HTTP surface, config watch, discovery, SLO evaluation, scrapes) stops with the root and the
//! tracked tasks are awaited. The process's signals come in here too ([`Shutdown::on_signals`]):
//! the one place that turns SIGTERM, SIGINT and SIGHUP into stages of the stop and reloads.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How a run answers SIGTERM and SIGINT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnSignal {
    /// The daemon: the first signal stops sending and cuts what is still in flight this long
    /// later; a second exits at once (status 130). SIGHUP is handed on, as a reload.
    Drain(Duration),
    /// The bench: the first signal stops sending and lets the running step drain; a second cuts
    /// the requests in flight. SIGHUP keeps its default (it ends the process).
    StopThenCut,
}

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

    /// Hands SIGTERM and SIGINT to this stop as `on` says. With [`OnSignal::Drain`], SIGHUP is
    /// caught as well and every one arrives on the returned channel (installed now: an uncaught
    /// SIGHUP would end the process), for whoever reloads.
    ///
    /// The handler is not a tracked task: it lives as long as the process, so that a second
    /// signal is heard at any point of the stop, including while [`Shutdown::finish`] waits.
    pub fn on_signals(&self, on: OnSignal) -> Option<tokio::sync::mpsc::UnboundedReceiver<()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return None;
        };
        let mut hup = match on {
            OnSignal::Drain(_) => match signal(SignalKind::hangup()) {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::error!(error = %e, "cannot install the SIGHUP handler");
                    None
                }
            },
            OnSignal::StopThenCut => None,
        };
        let (hups, hangups) = tokio::sync::mpsc::unbounded_channel();
        let stop = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                    Some(()) = async { hup.as_mut()?.recv().await } => {
                        let _ = hups.send(());
                        continue;
                    }
                }
                if !stop.on_stop_signal(on) {
                    return;
                }
            }
        });
        hup_receiver(on, hangups)
    }

    /// One SIGTERM or SIGINT; false when the handler has nothing left to do.
    fn on_stop_signal(&self, on: OnSignal) -> bool {
        match (on, self.stopping()) {
            (OnSignal::Drain(_), true) => {
                tracing::warn!("second signal: exiting now");
                std::process::exit(130);
            }
            (OnSignal::Drain(drain), false) => {
                tracing::info!(drain = ?drain, "signal received: draining in-flight requests");
                self.drain(drain);
                true
            }
            (OnSignal::StopThenCut, true) => {
                tracing::warn!("second signal: cutting the requests in flight");
                self.hard.cancel();
                false
            }
            (OnSignal::StopThenCut, false) => {
                tracing::warn!(
                    "signal received: draining the running step, then reporting the finished steps (again to cut now)"
                );
                self.soft.cancel();
                true
            }
        }
    }

    /// Ends the run: every service stops with the root, and every tracked task is awaited for
    /// at most `bound`. Returns whether they all ended in time.
    pub async fn finish(&self, bound: Duration) -> bool {
        self.root.cancel();
        self.tasks.close();
        tokio::time::timeout(bound, self.tasks.wait()).await.is_ok()
    }
}

/// The SIGHUP channel of a run that reloads.
fn hup_receiver(
    on: OnSignal,
    rx: tokio::sync::mpsc::UnboundedReceiver<()>,
) -> Option<tokio::sync::mpsc::UnboundedReceiver<()>> {
    matches!(on, OnSignal::Drain(_)).then_some(rx)
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
