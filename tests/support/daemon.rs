//! The daemon (`llm-canary run`), or a simulator (`llm-canary sim`), as a child process: started
//! on a loopback address it logs, signalled, and awaited; killed when dropped.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A child process killed when dropped, with its stderr kept in a log file.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` (`"TERM"`, `"HUP"`, …) with `kill`, which must succeed.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args([&format!("-{signal}"), &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// Waits until the process exits, or panics with `what` after `limit`.
    pub async fn wait_exit(&mut self, what: &str, limit: Duration) -> ExitStatus {
        super::eventually(what, limit, || {
            let s = self.child.try_wait().unwrap();
            async move { s }
        })
        .await
    }
}

/// `llm-canary run [--config FILE] --listen 127.0.0.1:0`; returns the process and its address.
pub fn start_daemon(config: Option<&Path>, dir: &Path) -> (Proc, SocketAddr) {
    start_daemon_with(config, dir, true, &[])
}

/// Like [`start_daemon`]; `listen: false` leaves the address to the config's `export.listen`, and
/// `env` is added to the daemon's environment (`RUST_LOG` among them overrides `info`).
pub fn start_daemon_with(
    config: Option<&Path>,
    dir: &Path,
    listen: bool,
    env: &[(&str, &str)],
) -> (Proc, SocketAddr) {
    start_daemon_flagged(&[], config, dir, listen, env)
}

/// Like [`start_daemon_with`], with the global `flags` (e.g. `--log-format json`) before `run`.
pub fn start_daemon_flagged(
    flags: &[&str],
    config: Option<&Path>,
    dir: &Path,
    listen: bool,
    env: &[(&str, &str)],
) -> (Proc, SocketAddr) {
    let mut args: Vec<&OsStr> = flags.iter().map(OsStr::new).collect();
    args.push(OsStr::new("run"));
    if listen {
        args.extend([OsStr::new("--listen"), OsStr::new("127.0.0.1:0")]);
    }
    if let Some(c) = config {
        args.extend([OsStr::new("--config"), c.as_os_str()]);
    }
    start_logged(&args, &dir.join("daemon.log"), env)
}

/// `llm-canary sim ARGS --listen 127.0.0.1:0` in its own process, its log in `log`; returns the
/// process and its address.
pub fn start_sim_process(args: &[&str], log: &Path) -> (Proc, SocketAddr) {
    let mut all: Vec<&OsStr> = vec![OsStr::new("sim")];
    all.extend(args.iter().map(OsStr::new));
    all.extend([OsStr::new("--listen"), OsStr::new("127.0.0.1:0")]);
    start_logged(&all, log, &[])
}

/// `llm-canary ARGS` started by the shell after `ulimit LIMITS` (e.g. `-Sn 256`), its log in
/// `log`; returns the process (the shell `exec`s it: the same pid) and its address.
pub fn start_under_ulimit(limits: &str, args: &[&str], log: &Path) -> (Proc, SocketAddr) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit {limits} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_llm-canary"))
        .args(args)
        .env("RUST_LOG", "info");
    spawn_logged(cmd, log)
}

/// `llm-canary ARGS` with its stderr copied to `log`, once it logs `listening on ADDR`.
fn start_logged(args: &[&OsStr], log: &Path, env: &[(&str, &str)]) -> (Proc, SocketAddr) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_llm-canary"));
    cmd.args(args).env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    spawn_logged(cmd, log)
}

/// Starts `cmd` with its stderr copied to `log`; returns once it logs `listening on ADDR`.
fn spawn_logged(mut cmd: Command, log: &Path) -> (Proc, SocketAddr) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start llm-canary");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let log_path = log.to_owned();
    std::thread::spawn(move || {
        use std::io::Write;
        let mut out = std::fs::File::create(&log_path).unwrap();
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(out, "{line}");
            // The address is the message's last word; fields may follow it, and in a JSON
            // record the message's closing quote.
            let addr = line
                .split("listening on ")
                .nth(1)
                .and_then(|a| a.split(|c: char| c.is_whitespace() || c == '"').next());
            if !sent && let Some(addr) = addr {
                if let Ok(a) = addr.parse::<SocketAddr>() {
                    let _ = tx.send(a);
                    sent = true;
                }
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{cmd:?} logs `listening on ADDR`"));
    (
        Proc {
            child,
            log: log.to_owned(),
        },
        addr,
    )
}
