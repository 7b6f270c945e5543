//! Measurement: per-series sliding windows of HDR histograms with quantiles and their confidence
//! intervals (`window`), a step's accumulators and results (`step`), and the statistics both
//! rest on (`stats`).

pub mod stats;
pub mod step;
pub mod window;
