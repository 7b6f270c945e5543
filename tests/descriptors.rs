//! The open-file limit as a user meets it: a process started under a low soft limit raises it to
//! the hard one, and `check` and the daemon say when a plan needs more descriptors than the
//! process may open (docs/RELIABILITY.md, "A hostile or broken target", row 26).

mod skip;
mod support;

use std::process::Command;
use std::time::Duration;

use llm_canary::config::Config;
use llm_canary::export::HttpLimits;
use llm_canary::schedule::cost::descriptors;
use support::daemon::start_under_ulimit;

const BIN: &str = env!("CARGO_BIN_EXE_llm-canary");

/// `llm-canary ARGS` under the shell's `ulimit LIMITS` (e.g. `-Sn 200`), stderr piped.
fn under_ulimit(limits: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit {limits} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .env("RUST_LOG", "info");
    cmd
}

/// The soft and hard "Max open files" of process `pid`, from /proc.
fn open_file_limits(pid: u32) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("{text}"));
    let mut words = line["Max open files".len()..].split_whitespace();
    (
        words.next().unwrap().to_owned(),
        words.next().unwrap().to_owned(),
    )
}

fn hard_limit() -> u64 {
    let (_, hard) = open_file_limits(std::process::id());
    hard.parse().unwrap_or(u64::MAX)
}

#[test]
fn a_process_started_under_a_low_soft_limit_raises_it_to_the_hard_one() {
    if hard_limit() <= 256 {
        skip::host_cannot("the hard open-file limit here is at most 256");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (sim, _) = start_under_ulimit(
        "-Sn 256",
        &["sim", "--listen", "127.0.0.1:0"],
        &dir.path().join("sim.log"),
    );
    let (soft, hard) = open_file_limits(sim.child.id());
    assert_ne!(soft, "256", "the soft limit stayed where the shell put it");
    assert_eq!(soft, hard, "soft {soft}, hard {hard}");
}

#[test]
fn check_says_when_the_plan_needs_more_descriptors_than_the_hard_limit() {
    let seed = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/seed-plan.yaml");
    let cfg = Config::load(std::path::Path::new(seed)).unwrap();
    let port = HttpLimits::default().max_connections as u64;
    let need = descriptors(&cfg, port).total();
    if hard_limit() <= need {
        skip::host_cannot(&format!("the hard open-file limit here is at most {need}"));
        return;
    }

    // Room for the plan: the need is stated, no warning.
    let fits = under_ulimit(&format!("-n {}", need + 100), &["check", "--config", seed])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&fits.stdout),
        String::from_utf8_lossy(&fits.stderr),
    );
    assert!(fits.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("file descriptors at the peak: ≈{need}")),
        "{stdout}"
    );
    assert!(!stderr.contains("file descriptors"), "{stderr}");

    // A hard limit below the plan's peak: still valid (exit 0), with a warning that names the
    // need, the limit and what to do.
    let short = under_ulimit(&format!("-n {}", need - 1), &["check", "--config", seed])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&short.stderr);
    assert!(short.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("needs ≈{need} file descriptors"))
            && stderr.contains(&format!("may open {}", need - 1))
            && stderr.contains("ulimit -n"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_daemon_warns_at_start_when_its_plan_does_not_fit_and_runs_on() {
    let port = HttpLimits::default().max_connections as u64;
    let need = descriptors(&Config::demo(), port).total();
    // Below the demo's peak, with room for the daemon to start and serve.
    let limit = need - 1;
    if hard_limit() <= limit {
        skip::host_cannot(&format!("the hard open-file limit here is at most {limit}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, addr) = start_under_ulimit(
        &format!("-n {limit}"),
        &["run", "--listen", "127.0.0.1:0"],
        &dir.path().join("daemon.log"),
    );
    let warned =
        format!("needs ≈{need} file descriptors at its peak but the process may open {limit}");
    support::eventually("the descriptor warning", Duration::from_secs(30), || {
        let found = daemon.log_text().contains(&warned);
        async move { found.then_some(()) }
    })
    .await;
    let client = support::http::http_client(Some(Duration::from_secs(5)));
    let healthy = client
        .get(format!("http://{addr}/-/healthy"))
        .send()
        .await
        .unwrap();
    assert!(healthy.status().is_success(), "{}", daemon.log_text());
}
