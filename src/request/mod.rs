//! What one request is known by and what it came to, below every layer that measures, exports or
//! judges it: its labels (and the serving mode they name), its [`Outcome`], and the [`Sample`] of
//! measurements every consumer reads (cache-hit source, the server's timing split, goodput).

mod labels;
mod outcome;
mod sample;

pub use labels::{
    PROBE_WORKLOAD, REQUEST_LABELS, RequestLabels, STEP_LABELS, STEP_LEVEL_LABELS, ServingMode,
    StepLabels,
};
pub use outcome::Outcome;
pub use sample::{CacheSource, GoodputLimits, Reasoning, Sample, ServerSplit};
