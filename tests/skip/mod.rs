//! How an integration test skips. A test that needs a tool this machine lacks (Prometheus, the
//! Helm venv, Chromium, an engine's venv) or a machine it cannot run on returns early, and says
//! so where it is seen: a banner on stderr, and a line in the file `LLM_CANARY_SKIPPED` names,
//! which `scripts/test` sets and sums up at its end (`N tests skipped: name (reason), …`). In CI
//! (`CI` set, as `.ci/run` does), where `scripts/test` installs every tool first, a missing tool
//! fails the test instead.
#![allow(dead_code)]

use std::io::Write;

/// The file `scripts/test` reads the skips from: one `KIND<TAB>TEST<TAB>REASON` line each.
pub const SKIPPED_FILE_VAR: &str = "LLM_CANARY_SKIPPED";

/// Whether this runs in CI: `CI` set to anything but empty, `false` or `0`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "false" | "0"))
}

/// Skips the running test for a tool that `scripts/test` installs: recorded outside CI, a
/// failure in CI. `reason` names the tool and how to get it.
pub fn missing_tool(reason: &str) {
    record("tool", reason);
    assert!(!in_ci(), "CI must run this test, but: {reason}");
}

/// Skips the running test because this machine cannot run it (a limit of the host, not a tool
/// CI installs): recorded, in CI too, never a failure.
pub fn host_cannot(reason: &str) {
    record("host", reason);
}

/// The running test as `BINARY::TEST` (libtest names each test's thread after the test).
fn test_name() -> String {
    let binary = env!("CARGO_CRATE_NAME");
    match std::thread::current().name() {
        Some(name) if name != "main" => format!("{binary}::{name}"),
        _ => binary.to_owned(),
    }
}

fn record(kind: &str, reason: &str) {
    let name = test_name();
    let bar = "!".repeat(78);
    eprintln!("\n{bar}\nSKIPPED {name}: {reason}\n{bar}\n");
    let Some(path) = std::env::var_os(SKIPPED_FILE_VAR) else {
        return;
    };
    // One line in one write to a file opened for appending: tests that skip at the same time
    // do not interleave their lines.
    let line = format!("{kind}\t{name}\t{}\n", reason.replace(['\t', '\n'], " "));
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot record the skip in {}: {e}", path.to_string_lossy());
    }
}
