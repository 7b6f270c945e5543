//! The data the measurement flow carries from the schedule to its consumers: a finished request
//! as one value ([`Finished`]), a finished step's result and summary, what the servers' own
//! metrics said, and the [`Sink`] trait every consumer implements. It sits below `scrape`, `schedule`, `slo`,
//! `export` and `report`, so data flows one way through the imports (docs/ARCHITECTURE.md).

mod sink;
mod step;

pub use sink::{
    BudgetAction, BudgetReport, BudgetUsage, Finished, PauseState, Phase, RecordContext, Sink,
    StepInfo, TargetChange, TargetInfo,
};
pub use step::{Quantiles, ServerSnapshot, ServerStep, StepConnections, StepResult, StepSummary};
