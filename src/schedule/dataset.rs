//! The dataset driver (docs/METRICS.md, "Datasets"): closed-loop workers, each replaying whole
//! conversations of the step's dataset, turn by turn, every turn sending the conversation's
//! messages up to it with the replies the dataset recorded. Worker `w` takes conversations `w`,
//! `w + concurrency`, … (round the dataset again when it ends), so every target of a step is
//! sent the same conversations in the same order.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::context::{Runner, StepCtx};
use super::drivers::{FIRST_SENDS_PER_MS, back_off, flatten};
use super::plan::StepKind;
use super::target::Target;
use crate::client::{ChatMessage, Prompt, Role, StreamRequest};
use crate::config::Api;
use crate::workload::dataset::{Dataset, Message, Speaker};

/// A turn's request: the messages before it and its own, as the target's API takes them.
fn prompt_of(api: Api, messages: &[Message]) -> Prompt {
    let chat: Vec<ChatMessage> = messages
        .iter()
        .map(|m| {
            let role = match m.speaker {
                Speaker::System => Role::System,
                Speaker::User => Role::User,
                Speaker::Assistant => Role::Assistant,
            };
            ChatMessage::new(role, m.text.clone())
        })
        .collect();
    match api {
        Api::Chat => Prompt::Chat(chat),
        Api::Completions => Prompt::Text(flatten(&chat)),
    }
}

impl Runner {
    /// Worker `worker` of a dataset step on target `t`, until the step stops sending. A failed
    /// turn ends its conversation (as it would for a user), and so does a turn above the
    /// target's context bound (a later turn holds more); the worker goes on with its next
    /// conversation, and ends when not even the dataset's shortest first turn fits.
    pub(super) async fn dataset_worker(
        self: Arc<Self>,
        ctx: Arc<StepCtx>,
        t: usize,
        target: Arc<Target>,
        dataset: Arc<Dataset>,
        worker: u64,
    ) {
        let StepKind::Dataset { concurrency, .. } = &ctx.plan.kind else {
            return;
        };
        let stride = u64::from(*concurrency);
        let n = dataset.conversations.len() as u64;
        if n == 0 || !target.fits(dataset.fewest_tokens(), 0) {
            return;
        }
        let base = ctx.base_labels(&target);
        let mut backoff = Duration::ZERO;
        let ramp = Duration::from_millis(worker / FIRST_SENDS_PER_MS);
        if !ramp.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep_until((ctx.start + ramp).min(ctx.send_end)) => {}
                _ = ctx.soft_stop.cancelled() => {}
            }
        }
        let mut round = 0u64;
        while ctx.sending() {
            // The conversation's number in the step: with the turn, the request's id.
            let k = worker + round * stride;
            round += 1;
            let conversation = &dataset.conversations[(k % n) as usize];
            for (i, turn) in conversation.turns.iter().enumerate() {
                if !ctx.sending() {
                    break;
                }
                let number = i as u32 + 1;
                let labels = base.clone().with_turn(number);
                if self.skip_too_long(t, &labels, u64::from(turn.isl), turn.osl) {
                    tokio::task::yield_now().await;
                    break;
                }
                let req = StreamRequest {
                    request_id: ctx.request_id(self.run_salt, t, k, u64::from(number)),
                    prompt: prompt_of(target.endpoint.api(), &conversation.messages[..turn.upto]),
                    osl: turn.osl,
                };
                let Some(rec) = self
                    .send_and_record(
                        &ctx,
                        t,
                        req,
                        turn.isl,
                        Instant::now(),
                        None,
                        &labels,
                        0,
                        None,
                    )
                    .await
                else {
                    return;
                };
                // Not learnt from (`Runner::learn`): the chat template's cost grows with the
                // number of messages, which the overhead of one user message does not model.
                back_off(&ctx, &mut backoff, !rec.outcome.is_error()).await;
                if !rec.outcome.is_ok() {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_sends_its_history_as_recorded_in_either_api() {
        let m = |speaker, text: &str| Message {
            speaker,
            text: text.to_owned(),
        };
        let history = [
            m(Speaker::System, "Be brief."),
            m(Speaker::User, "Hello"),
            m(Speaker::Assistant, "Hi"),
            m(Speaker::User, "Bye"),
        ];
        let Prompt::Chat(chat) = prompt_of(Api::Chat, &history) else {
            panic!("chat");
        };
        let roles: Vec<Role> = chat.iter().map(|c| c.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::User]
        );
        assert_eq!(chat[2].content, "Hi");
        assert_eq!(
            prompt_of(Api::Completions, &history),
            Prompt::Text("Be brief.\nHello\nHi\nBye\n".into())
        );
    }
}
