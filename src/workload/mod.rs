//! workload (in progress).
