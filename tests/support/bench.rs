//! `llm-canary bench` as a child process: one pass of a config file's plan, its files in a
//! folder of the caller's, stdin closed.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `llm-canary bench [extra…] --config CONFIG --out OUT`, run to its end.
pub fn bench(config: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llm-canary"))
        .arg("bench")
        .args(extra)
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}
