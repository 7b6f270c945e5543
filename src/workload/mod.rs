//! workload (in progress).

pub mod prompt;
pub mod sampler;
pub mod tokenizer;
pub mod trace;
