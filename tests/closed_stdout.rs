//! A reader that stops early (`llm-canary check | head -1`) ends the command quietly: it stops
//! writing and exits 0, with no panic and no backtrace on stderr (it panicked with exit 101).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_llm-canary");

/// Far more than a pipe holds (64 KiB on Linux), so the command is still writing when its
/// reader leaves.
const PLENTY: usize = 128 << 10;

/// A config whose `check` and `rules` outputs are long: many targets, an SLO each.
fn long_config(dir: &Path) -> PathBuf {
    let mut text = String::from("targets:\n");
    for i in 0..1000 {
        text.push_str(&format!(
            "  - {{ name: t{i}, serving_mode: aggregated, url: \"http://127.0.0.1:9\", model: m }}\n"
        ));
    }
    text.push_str("slos:\n");
    for i in 0..1000 {
        text.push_str(&format!(
            "  - {{ name: ttft-{i}, expr: 'p99(ttft{{target=\"t{i}\"}}) < 2s', window: 1h }}\n"
        ));
    }
    let path = dir.join("long.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `args`, reads one line of its stdout, closes the pipe and waits for the exit.
fn head_1(args: &[&str]) -> (String, Output) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Stderr is read beside, so a command with much to say there never waits for this test.
    let mut stderr = child.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut text).unwrap();
        text
    });
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // The reader (and with it the pipe's only read end) is gone here.
    let mut out = child.wait_with_output().unwrap();
    out.stderr = said.join().unwrap();
    (line, out)
}

fn assert_quiet(what: &str, out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{what}: {stderr}"
    );
    assert_eq!(out.status.code(), Some(0), "{what}: {stderr}");
}

#[test]
fn check_and_rules_stop_quietly_when_the_reader_leaves_after_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = long_config(dir.path());
    let config = config.to_str().unwrap();
    for args in [
        vec!["check", "--config", config],
        vec!["check", "--output", "yaml", "--config", config],
        vec!["rules", "--config", config],
    ] {
        let what = args.join(" ");
        // Read whole, the output is long enough to fill the pipe.
        let whole = Command::new(BIN).args(&args).output().unwrap();
        assert!(whole.status.success(), "{what}");
        assert!(
            whole.stdout.len() > PLENTY,
            "{what}: {} bytes do not fill a pipe",
            whole.stdout.len()
        );
        let (line, out) = head_1(&args);
        let first = String::from_utf8_lossy(&whole.stdout);
        assert_eq!(
            line,
            first.lines().next().unwrap().to_owned() + "\n",
            "{what}"
        );
        assert_quiet(&what, &out);
    }
}

#[test]
fn the_bench_stops_quietly_when_its_reader_left_before_the_tables() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bench.yaml");
    std::fs::write(
        &config,
        "targets:\n  - { name: sim, serving_mode: aggregated, simulated: { profile: fast } }\n\
         workloads:\n  concurrency_sweep: { levels: [1], isl: 32, osl: 4, step: 1s, warmup: 0s }\n\
         schedule: { drain_grace: 1s }\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["bench", "--config", config.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before the one-second step ends, so before the tables are written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_quiet("bench", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("step"), "the bench ran: {stderr}");
}
