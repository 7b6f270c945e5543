//! llm-canary: an always-on canary for LLM serving. The library holds every domain module; the
//! binary in `main.rs` only parses the command line and calls [`cli::main`].

pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod export;
pub mod fds;
pub mod files;
pub mod heap;
pub mod k8s;
pub mod measure;
pub mod model;
pub mod probe;
pub mod promtext;
pub mod report;
pub mod request;
pub mod schedule;
pub mod scrape;
pub mod setup;
pub mod shutdown;
pub mod sim;
pub mod slo;
pub mod targets;
pub mod workload;
