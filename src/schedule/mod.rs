//! The schedule: the cycle of workloads and their steps (`plan`), the one step loop of every run
//! (`scheduler`) over the targets its sources name (`source`, each a `target`), the step runner
//! with warmup, steady window and drain (`runner`, on the parts it shares with its drivers in
//! `context`; trace replay in `replay`, datasets in `dataset`), where the schedule's data goes (`recorder`), and the board that keeps what
//! `/api/v1/status` and the status page show of it (`board`).

mod board;
pub mod budget;
mod context;
pub mod cost;
mod dataset;
mod drivers;
pub mod gate;
pub mod plan;
pub mod probe_stream;
pub mod recorder;
mod replay;
pub mod runner;
pub mod scheduler;
pub mod source;
mod target;

pub use board::{
    Board, CurrentStep, FailedRequest, RECENT_FAILURES, TargetActivity, WorkloadPhase,
};
pub use context::{EndpointCache, Runner};
pub use plan::{StepKind, StepPlan, plan_cycle};
pub use probe_stream::ProbeStream;
pub use recorder::{InFlight, Recorder};
pub use runner::CALIBRATION_TIMEOUT;
pub use scheduler::{RunSummary, Scheduler};
pub use source::{Leadership, TargetSet, TargetSource};
pub use target::Target;
