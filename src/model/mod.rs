//! The data the measurement flow carries from the schedule to its consumers: the label set of
//! every series, a finished step's result and summary, what the servers' own metrics said, and
//! the [`Sink`] trait every consumer implements. It sits below `scrape`, `schedule`, `slo`,
//! `export` and `report`, so data flows one way through the imports (docs/ARCHITECTURE.md).

mod labels;
mod sink;
mod step;

pub use labels::{
    PROBE_WORKLOAD, REQUEST_LABELS, RequestLabels, STEP_LABELS, STEP_LEVEL_LABELS, StepLabels,
};
pub use sink::{
    BudgetAction, BudgetReport, BudgetUsage, PauseState, Phase, RecordContext, Sink, StepInfo,
    TargetChange, TargetInfo,
};
pub use step::{Quantiles, ServerSnapshot, ServerStep, StepConnections, StepResult, StepSummary};
