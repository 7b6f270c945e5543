//! The bounds of config values, which keep absurd values from reaching the scheduler (1e9
//! workers, 10 MB prompts): read by the whole-config validation and the per-value checks alike.

/// Workers, conversations and streams of one step; a budget's `max_inflight` may be 64 times it.
pub const MAX_CONCURRENCY: u32 = 4096;
/// Levels of one concurrency sweep.
pub const MAX_LEVELS: usize = 64;
/// The longest cycle accepted: a week of steps per verdict is no canary.
pub const MAX_CYCLE: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);
/// Prompt and output tokens of one request: the workloads' own bounds, which trace files are
/// held to as well.
/// Turns of one conversation (a multi-turn workload's, a dataset's).
pub use crate::workload::{MAX_ISL, MAX_OSL, MAX_TURNS};
/// Requests per second of an open-loop rate or a budget.
pub const MAX_RPS: f64 = 100_000.0;
/// The factor of every workload duration (`time_scale`).
pub const MAX_TIME_SCALE: f64 = 100.0;
/// The shortest step a plan may have once `time_scale` has scaled it (its warmup and steady
/// window together): the scheduler samples a step's server metrics four times, at most every
/// 250 ms, and a shorter step measures next to nothing. It also keeps a tiny time scale from
/// making every step last 0 ns, a cycle of steps the daemon would run thousands of times a
/// second.
pub const MIN_SCALED_STEP: std::time::Duration = std::time::Duration::from_secs(1);
