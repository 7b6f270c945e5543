//! Measurement: per-series sliding windows of HDR histograms with quantiles and their confidence
//! intervals (`window`), a step's accumulators and results (`step`), whether an open-loop step's
//! server kept up with its arrivals (`arrivals`), and the statistics they rest on (`stats`).

pub mod arrivals;
pub mod stats;
pub mod step;
pub mod window;
