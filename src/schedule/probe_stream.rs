//! The probe stream (docs/DESIGN.md §5): next to the steps' load, one short request per target
//! every `probe_stream.interval`, outside any step's concurrency, reported under
//! `workload="probe"`. Load and batching do not contaminate it, so it is the clean TTFT and
//! availability signal, and what the default availability SLO watches. It runs between steps
//! too, and while a spent hour of the traffic budget pauses them (its own allowance is kept
//! apart from the steps' share, `budget::ProbeAllowance`); while an operator pauses the canary
//! it stops, and in quiet hours it runs only with `probe_stream.in_quiet_hours`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::gate::Gate;
use super::recorder::Recorder;
use super::target::Target;
use crate::client::{Prompt, StreamClient, StreamRequest};
use crate::config::{Api, ProbeStreamConfig};
use crate::model::{Phase, RecordContext};
use crate::request::GoodputLimits;
use crate::request::{PROBE_WORKLOAD, RequestLabels};
use crate::workload::prompt::{PromptBuilder, PromptConfig};
use crate::workload::tokenizer::TokenModel;

/// The probe stream of a run: what it sends and where its records go.
pub struct ProbeStream {
    pub client: StreamClient,
    /// The traffic budget: probes are paced with the steps' requests and counted on an
    /// allowance of their own, which the stream keeps from the steps when it starts.
    pub budget: Arc<super::budget::Budget>,
    pub recorder: Arc<Recorder>,
    pub tokens: Arc<TokenModel>,
    pub gate: Arc<Gate>,
    pub config: ProbeStreamConfig,
    pub goodput: GoodputLimits,
    pub run_salt: u64,
}

impl ProbeStream {
    /// Sends to the targets `targets` holds (the scheduler's current set) until `stop`. A target
    /// whose probe is still in flight is skipped until it ends, so a hung target never gets a
    /// pile of them; every probe is bounded by the client's own timeouts and by `stop`.
    pub async fn run(
        self,
        mut targets: watch::Receiver<Vec<Arc<Target>>>,
        stop: CancellationToken,
    ) {
        self.budget
            .keep_for_probes(super::budget::ProbeAllowance::of(&self.config));
        let builder = match PromptBuilder::new(
            Arc::clone(&self.tokens),
            PromptConfig::with_salt(self.run_salt),
        ) {
            Ok(b) => Arc::new(b),
            Err(e) => {
                tracing::warn!(error = %e, "no probe stream: cannot build its prompts");
                return;
            }
        };
        let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut sends = JoinSet::new();
        let mut ticker = tokio::time::interval(self.config.interval.0);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let this = Arc::new(self);
        for n in 0u64.. {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.cancelled() => break,
            }
            while sends.try_join_next().is_some() {}
            let gate = this.gate.state();
            if !gate.operator.is_empty() || (!gate.in_window && !this.config.in_quiet_hours) {
                continue;
            }
            let current = targets.borrow_and_update().clone();
            for target in current {
                let fresh = in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(target.name.clone());
                if !fresh {
                    continue;
                }
                let (this, builder, in_flight, stop) = (
                    Arc::clone(&this),
                    Arc::clone(&builder),
                    Arc::clone(&in_flight),
                    stop.clone(),
                );
                sends.spawn(async move {
                    this.probe(&target, &builder, n, &stop).await;
                    in_flight
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&target.name);
                });
            }
        }
        sends.shutdown().await;
    }

    /// One probe of `target`, recorded under `workload="probe"`.
    async fn probe(
        &self,
        target: &Target,
        builder: &PromptBuilder,
        n: u64,
        stop: &CancellationToken,
    ) {
        let Ok(p) = builder.user_message(*self.config.isl as usize, 0x9e0be, n) else {
            return;
        };
        let request = StreamRequest {
            request_id: format!("{:08x}-probe-{n}-{}", self.run_salt as u32, target.name),
            prompt: match target.endpoint.api() {
                Api::Chat => Prompt::Chat(vec![crate::client::ChatMessage::user(&p.text)]),
                Api::Completions => Prompt::Text(p.text),
            },
            osl: *self.config.osl,
        };
        let labels = RequestLabels::new(&target.name, target.mode, PROBE_WORKLOAD);
        if !target.fits(u64::from(*self.config.isl), u64::from(request.osl)) {
            self.recorder
                .skipped_outside_steps(&labels, super::runner::SKIP_CONTEXT_LENGTH);
            return;
        }
        // Paced to `max_rps` with every other send, and booked on the probe stream's own
        // allowance: a spent hour pauses the steps, never the probes.
        let grant = tokio::select! {
            grant = self.budget.acquire_probe(&target.name, request.osl) => grant,
            _ = stop.cancelled() => return,
        };
        tokio::select! {
            _ = tokio::time::sleep_until(grant.at) => {}
            _ = stop.cancelled() => return,
        }
        let intended = Instant::now();
        let _in_flight = self.recorder.in_flight(&target.name);
        let rec = self
            .client
            .send_until(&target.endpoint, &request, intended, stop.cancelled())
            .await;
        grant.settle(rec.billable_tokens());
        if stop.is_cancelled() {
            // Cut by the shutdown: not the target's failure.
            return;
        }
        self.recorder.record_outside_steps(
            &RecordContext {
                target_index: 0,
                labels: &labels,
                phase: Phase::Steady,
                isl: *self.config.isl,
                osl: request.osl,
                shared_prefix_tokens: 0,
                request: &request,
                goodput: target.goodput.unwrap_or(self.goodput),
            },
            &rec,
        );
    }
}

/// How often the probe goes when nothing else is said: a few times a minute.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(20);
