//! The preflight (`llm-canary check --probe`, and the daemon at start, docs/DESIGN.md §2): one
//! short streamed request per target and one scrape of each of its server-metrics endpoints,
//! reported check by check, so a wrong URL, model, dialect or metrics endpoint shows before the
//! first cycle rather than as a cycle of errors.

use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::client::{ChatMessage, Prompt, RequestRecord, StreamClient, StreamRequest};
use crate::config::{Api, Config, TargetConfig};
use crate::targets::resolve_at;

/// Output tokens the probe asks for: enough to see streaming, little enough to cost nothing.
const PROBE_OSL: u32 = 4;
/// Longest the probe's request may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How a target came out of the probe; `check --probe` exits with the worst target's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every check passed (warnings allowed): exit 0.
    Ok,
    /// The target answers, but not as the config expects (model, dialect, streaming): exit 4.
    Rejected,
    /// No HTTP answer at all (refused, timed out, DNS): exit 3.
    Unreachable,
}

impl Verdict {
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Ok => 0,
            Verdict::Unreachable => 3,
            Verdict::Rejected => 4,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Rejected => "rejected",
            Verdict::Unreachable => "unreachable",
        }
    }
}

/// One check: passed, failed (the target is `Rejected` or `Unreachable`) or a warning (the
/// canary works around it, with less data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Warn,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub outcome: Outcome,
    pub detail: String,
}

/// What the probe found on one target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    pub target: String,
    pub url: String,
    pub verdict: Verdict,
    pub checks: Vec<Check>,
}

impl ProbeReport {
    fn new(target: &str, url: &str) -> ProbeReport {
        ProbeReport {
            target: target.to_owned(),
            url: url.to_owned(),
            verdict: Verdict::Ok,
            checks: Vec::new(),
        }
    }

    fn check(&mut self, name: &'static str, outcome: Outcome, detail: impl Into<String>) {
        self.checks.push(Check {
            name,
            outcome,
            detail: detail.into(),
        });
    }

    fn fail(&mut self, name: &'static str, verdict: Verdict, detail: impl Into<String>) {
        self.check(name, Outcome::Fail, detail);
        self.verdict = self.verdict.max(verdict);
    }
}

/// Probes the target `t` served at `url` (an embedded simulator's address for a simulated one).
pub async fn probe(
    t: &TargetConfig,
    url: &str,
    base_dir: &Path,
    client: &StreamClient,
) -> ProbeReport {
    let mut report = ProbeReport::new(&t.name, &crate::config::display_url_text(url));
    // One model lookup, not the daemon's half-minute of retries: a stopped target shows at once.
    let target = match resolve_at(t, url, base_dir, client, 1).await {
        Ok(target) => target,
        Err(e) => {
            let text = e.to_string();
            let unreachable = ["error sending request", "connect", "dns", "timed out"]
                .iter()
                .any(|p| text.to_ascii_lowercase().contains(p));
            if unreachable {
                report.fail("reachable", Verdict::Unreachable, text);
            } else {
                report.check("reachable", Outcome::Pass, "answers HTTP");
                report.fail("model", Verdict::Rejected, text);
            }
            return report;
        }
    };
    let endpoint = &target.endpoint;
    let prompt = match endpoint.api() {
        Api::Chat => Prompt::Chat(vec![ChatMessage::user("Reply with one word: ready.")]),
        Api::Completions => Prompt::Text("The canary says".to_owned()),
    };
    let request = StreamRequest {
        request_id: format!("llm-canary-probe-{}", t.name.value),
        prompt,
        osl: PROBE_OSL,
    };
    let now = Instant::now();
    let rec = client
        .send_until(endpoint, &request, now, tokio::time::sleep(PROBE_TIMEOUT))
        .await;
    report_request(&mut report, &rec, endpoint.model(), endpoint.nvext());
    if report.verdict == Verdict::Unreachable {
        return report;
    }
    scrape_checks(&mut report, t).await;
    report
}

fn report_request(report: &mut ProbeReport, rec: &RequestRecord, model: &str, nvext: bool) {
    let error = rec.error.clone().unwrap_or_default();
    if rec.first_byte.is_none() {
        report.fail("reachable", Verdict::Unreachable, error);
        return;
    }
    report.check("reachable", Outcome::Pass, "answers HTTP");
    report.check("model", Outcome::Pass, model);
    match rec.http_status {
        Some(s) if (200..300).contains(&s) => {
            report.check("dialect", Outcome::Pass, "request accepted")
        }
        _ => {
            // The client's message names the setting to change for a rejected field.
            report.fail("dialect", Verdict::Rejected, error);
            return;
        }
    }
    if !rec.outcome.is_ok() || rec.output_tokens() == 0 {
        report.fail(
            "streaming",
            Verdict::Rejected,
            format!("outcome {}: {error}", rec.outcome.as_str()),
        );
        return;
    }
    report.check(
        "streaming",
        Outcome::Pass,
        format!("{} content chunks", rec.content_chunks().len()),
    );
    match &rec.usage {
        Some(u) => report.check(
            "usage",
            Outcome::Pass,
            format!("{} prompt + {} completion tokens", u.prompt_tokens, u.completion_tokens),
        ),
        None => report.check(
            "usage",
            Outcome::Warn,
            "no usage in the stream (stream_options.include_usage ignored): tokens are counted from chunks, prompt lengths and cache hits are unknown",
        ),
    }
    if nvext {
        match &rec.server_timing {
            Some(_) => report.check("nvext_timing", Outcome::Pass, "nvext.timing present"),
            None => report.check(
                "nvext_timing",
                Outcome::Warn,
                "the dynamo dialect asks for nvext.timing and got none: no server-side prefill and KV-transfer times (older Dynamo, or not Dynamo: set `dialect`)",
            ),
        }
    }
}

async fn scrape_checks(report: &mut ProbeReport, t: &TargetConfig) {
    if t.server_metrics.is_empty() {
        return;
    }
    let http = match crate::scrape::scrape_client(crate::client::DEFAULT_POOL_IDLE_TIMEOUT) {
        Ok(h) => h,
        Err(e) => return report.check("server_metrics", Outcome::Warn, e.to_string()),
    };
    for url in &t.server_metrics {
        match crate::scrape::fetch(&http, url).await {
            Ok(text) => {
                let families: Vec<&str> = ["vllm:", "dynamo_", "kvbm_", "sglang:"]
                    .into_iter()
                    .filter(|p| text.lines().any(|l| l.starts_with(p)))
                    .collect();
                if families.is_empty() {
                    report.check(
                        "server_metrics",
                        Outcome::Warn,
                        format!("{}: no vllm:, dynamo_, kvbm_ or sglang: series", **url),
                    );
                } else {
                    report.check(
                        "server_metrics",
                        Outcome::Pass,
                        format!("{}: {} series", **url, families.join(", ")),
                    );
                }
            }
            Err(e) => report.check("server_metrics", Outcome::Warn, e.to_string()),
        }
    }
}

/// Probes every configured target of `cfg`, starting the embedded simulators of the simulated
/// ones for the while (discovered targets are probed by the daemon as they come).
pub async fn probe_config(
    cfg: &Config,
    base_dir: &Path,
) -> Result<Vec<ProbeReport>, crate::targets::TargetError> {
    let client = crate::targets::stream_client(cfg)?;
    let mut reports = Vec::new();
    for t in &cfg.targets {
        let (url, sim) = crate::targets::serve(t).await?;
        reports.push(probe(t, &url, base_dir, &client).await);
        if let Some(sim) = sim {
            sim.shutdown().await;
        }
    }
    Ok(reports)
}

/// The reports as `check --probe` prints them.
pub fn render(reports: &[ProbeReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let _ = writeln!(
            out,
            "probe {} ({}): {}",
            r.target,
            r.url,
            r.verdict.as_str()
        );
        for c in &r.checks {
            let mark = match c.outcome {
                Outcome::Pass => "ok  ",
                Outcome::Warn => "warn",
                Outcome::Fail => "FAIL",
            };
            let _ = writeln!(out, "  {mark} {:<14} {}", c.name, c.detail);
        }
    }
    out
}

/// One report on one line, as the daemon logs it at start: the verdict, then each check with its
/// mark and detail (`probe a (http://…): ok; ok reachable: answers HTTP, ok model: m, …`).
pub fn render_line(r: &ProbeReport) -> String {
    let checks: Vec<String> = r
        .checks
        .iter()
        .map(|c| {
            let mark = match c.outcome {
                Outcome::Pass => "ok",
                Outcome::Warn => "warn",
                Outcome::Fail => "FAIL",
            };
            // A detail that is an error of several lines (a config's problems) stays on this one.
            let detail: Vec<&str> = c.detail.lines().map(str::trim).collect();
            format!("{mark} {}: {}", c.name, detail.join(" "))
        })
        .collect();
    format!(
        "probe {} ({}): {}; {}",
        r.target,
        r.url,
        r.verdict.as_str(),
        checks.join(", ")
    )
}

/// The exit code of a set of reports: the worst verdict's.
pub fn exit_code(reports: &[ProbeReport]) -> u8 {
    reports
        .iter()
        .map(|r| r.verdict)
        .max()
        .unwrap_or(Verdict::Ok)
        .exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_logs_on_one_line_with_every_check() {
        let mut report = ProbeReport::new("sim-agg", "http://127.0.0.1:8000");
        report.check("reachable", Outcome::Pass, "answers HTTP");
        report.check("usage", Outcome::Warn, "no usage in the stream");
        report.fail(
            "streaming",
            Verdict::Rejected,
            "outcome bad_response:\nline two",
        );
        assert_eq!(
            render_line(&report),
            "probe sim-agg (http://127.0.0.1:8000): rejected; ok reachable: answers HTTP, \
             warn usage: no usage in the stream, FAIL streaming: outcome bad_response: line two"
        );
        // `check --probe` keeps its table, a line per check.
        let table = render(std::slice::from_ref(&report));
        assert!(
            table.starts_with("probe sim-agg (http://127.0.0.1:8000): rejected\n  ok   reachable"),
            "{table}"
        );
    }
}
