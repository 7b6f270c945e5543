//! The status page on `GET /`: the `/api/v1/status` document rendered for a person — targets and
//! their state, the step running and the cycle's progress, the SLOs with their reasons and since
//! when, the last failed requests with what their servers said, the pause and the budget, and
//! links to `/metrics` and the API. Rendered from the same document the API serves (one source),
//! every text from it escaped; inline CSS, no script, nothing fetched. It reloads itself.

use std::fmt::Write as _;

use serde_json::Value;

/// Seconds between the page's reloads (a `<meta http-equiv="refresh">`, no script).
pub const REFRESH_SECONDS: u32 = 10;

/// How many of the budget's recent actions the page lists.
const BUDGET_ACTIONS_SHOWN: usize = 5;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:20px;color:#222;max-width:1400px}\
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin:22px 0 6px}\
.meta,.note{color:#555;font-size:13px}nav a{margin-right:14px}\
table{border-collapse:collapse;font-size:13px}\
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}\
td.num{text-align:right;font-variant-numeric:tabular-nums}\
td{white-space:nowrap}td.said,td.wrap{white-space:normal;max-width:560px;overflow-wrap:anywhere}\
td.said{font-family:ui-monospace,monospace;font-size:12px}\
.state{font-weight:600}.good{color:#1a7f37}.bad{color:#cf222e}.unknown{color:#9a6700}\
.banner{padding:6px 10px;border-radius:4px;display:inline-block}\
.banner.good{background:#dafbe1}.banner.bad{background:#ffebe9}";

/// Text for an HTML text node or a double- or single-quoted attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page for the status document `status` (as `/api/v1/status` serves it), at `now_unix`.
pub fn render(status: &Value, now_unix: f64) -> String {
    let mut page = String::with_capacity(16 * 1024);
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>llm-canary status</title><style>{STYLE}</style></head><body>\n"
    );
    header(&mut page, status, now_unix);
    traffic(&mut page, status, now_unix);
    schedule(&mut page, status, now_unix);
    targets(&mut page, status, now_unix);
    slos(&mut page, status, now_unix);
    failures(&mut page, status, now_unix);
    page.push_str("</body></html>\n");
    page
}

/// The text of a string value, escaped; `-` when absent.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => escape(s),
        Value::Null => "-".to_owned(),
        other => escape(&other.to_string()),
    }
}

/// A number in four significant digits (a value, a threshold); `-` when absent.
fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(0.0) => "0".to_owned(),
        Some(x) if x.abs() >= 1e-3 && x.abs() < 1e6 => {
            let digits = (3 - x.abs().log10().floor() as i32).clamp(0, 6) as usize;
            let s = format!("{x:.digits$}");
            if s.contains('.') {
                s.trim_end_matches('0').trim_end_matches('.').to_owned()
            } else {
                s
            }
        }
        Some(x) => format!("{x:.3e}"),
        None => "-".to_owned(),
    }
}

/// A Unix time as UTC (`2026-12-06 03:13:21 UTC`).
fn utc(at: f64) -> String {
    jiff::Timestamp::from_microsecond((at * 1e6) as i64)
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|_| format!("{at:.0}"))
}

/// A Unix time as UTC with how long ago it was (`2026-12-06 03:13:21 UTC (5 min ago)`).
fn when(v: &Value, now_unix: f64) -> String {
    let Some(at) = v.as_f64() else {
        return "-".to_owned();
    };
    let stamp = utc(at);
    let ago = now_unix - at;
    if ago < 0.0 {
        return format!("{stamp} (in {})", span(-ago));
    }
    format!("{stamp} ({} ago)", span(ago))
}

/// A span of seconds in its largest unit (`45 s`, `12 min`, `3.5 h`, `2.0 d`).
fn span(seconds: f64) -> String {
    match seconds {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} d", s / 86_400.0),
    }
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

fn header(page: &mut String, status: &Value, now_unix: f64) {
    let _ = writeln!(
        page,
        "<header><h1>llm-canary</h1><p class=\"meta\">version {} · config {} · time scale {} · \
         {} cycles completed · as of {} (reloads every {REFRESH_SECONDS} s)</p>\
         <nav><a href=\"/metrics\">/metrics</a><a href=\"/api/v1/status\">/api/v1/status</a>\
         <a href=\"/api/v1/baselines\">/api/v1/baselines</a><a href=\"/-/healthy\">/-/healthy</a>\
         <a href=\"/-/ready\">/-/ready</a></nav></header>",
        text(&status["version"]),
        text(&status["config"]),
        number(&status["time_scale"]),
        text(&status["cycles_completed"]),
        utc(now_unix),
    );
}

fn traffic(page: &mut String, status: &Value, now_unix: f64) {
    let t = &status["traffic"];
    page.push_str("<section id=\"traffic\"><h2>Traffic</h2>");
    if t["paused"].as_bool().unwrap_or(false) {
        let reasons: Vec<String> = list(&t["reasons"]).iter().map(text).collect();
        let _ = write!(
            page,
            "<p class=\"banner bad\" data-paused=\"true\">Paused: {}</p>",
            reasons.join(", ")
        );
    } else {
        page.push_str("<p class=\"banner good\" data-paused=\"false\">Sending</p>");
    }
    for o in list(&t["operator"]) {
        let _ = write!(
            page,
            "<p class=\"note\">paused by {}: {}</p>",
            text(&o["source"]),
            text(&o["note"])
        );
    }
    if !t["next_window_change_unix"].is_null() {
        let _ = write!(
            page,
            "<p class=\"note\">the schedule's windows next change at {}</p>",
            when(&t["next_window_change_unix"], now_unix)
        );
    }
    let budget = &status["budget"];
    let scopes = list(&budget["scopes"]);
    if scopes.is_empty() {
        page.push_str("<p class=\"note\">No traffic budget is set.</p>");
    } else {
        page.push_str(
            "<table id=\"budget\"><tr><th>budget</th><th>max in flight</th><th>max req/s</th>\
             <th>output tokens, last hour</th><th>max per hour</th><th>throttled requests</th>\
             <th>throttled (s)</th></tr>",
        );
        for s in scopes {
            let _ = write!(
                page,
                "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td></tr>",
                text(&s["scope"]),
                text(&s["max_inflight"]),
                number(&s["max_rps"]),
                text(&s["output_tokens_last_hour"]),
                text(&s["max_output_tokens_per_hour"]),
                text(&s["throttled_requests"]),
                number(&s["throttled_seconds"]),
            );
        }
        page.push_str("</table>");
    }
    let actions = list(&budget["recent_actions"]);
    for a in actions.iter().rev().take(BUDGET_ACTIONS_SHOWN) {
        let _ = write!(
            page,
            "<p class=\"note\">{}: {} {} on {}: {}</p>",
            when(&a["at_unix"], now_unix),
            text(&a["action"]),
            text(&a["workload"]),
            text(&a["target"]),
            text(&a["detail"])
        );
    }
    page.push_str("</section>\n");
}

fn schedule(page: &mut String, status: &Value, now_unix: f64) {
    page.push_str("<section id=\"schedule\"><h2>Schedule</h2>");
    let c = &status["current_step"];
    if c.is_null() {
        page.push_str("<p id=\"current-step\">No step is running now.</p>");
    } else {
        let elapsed = c["started_unix"].as_f64().map(|s| now_unix - s);
        let _ = write!(
            page,
            "<p id=\"current-step\">Cycle {}, step {} of {}: <b>{}</b>, sending for {} of {}</p>",
            text(&c["cycle"]),
            text(&c["position"]),
            text(&c["steps"]),
            text(&c["name"]),
            elapsed.map_or_else(|| "-".to_owned(), |e| span(e.max(0.0))),
            c["planned_seconds"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), span),
        );
    }
    let workloads = status["workloads"].as_object();
    if let Some(w) = workloads.filter(|w| !w.is_empty()) {
        page.push_str(
            "<table id=\"workloads\"><tr><th>workload</th><th>state</th><th>step</th>\
             <th>cycle</th><th>steps done</th><th>started</th></tr>",
        );
        for (name, p) in w {
            let _ = write!(
                page,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td><td>{}</td></tr>",
                escape(name),
                text(&p["state"]),
                text(&p["step"]),
                text(&p["cycle"]),
                text(&p["steps_done"]),
                when(&p["started_unix"], now_unix),
            );
        }
        page.push_str("</table>");
    }
    page.push_str("</section>\n");
}

/// A target's state: not started, up or down by its latest request, or no request yet.
fn target_state(activity: &Value) -> (&'static str, &'static str) {
    match activity["up"].as_bool() {
        Some(true) => ("up", "good"),
        Some(false) => ("down", "bad"),
        None => ("no request yet", "unknown"),
    }
}

fn targets(page: &mut String, status: &Value, now_unix: f64) {
    page.push_str(
        "<section id=\"targets\"><h2>Targets</h2><table><tr><th>target</th><th>mode</th>\
         <th>URL</th><th>model</th><th>state</th><th>requests</th><th>errors</th>\
         <th>latest request</th><th>start-up probe</th></tr>",
    );
    let probes = list(&status["probes"]);
    for t in list(&status["targets"]) {
        let a = &t["activity"];
        let (state, class) = target_state(a);
        let probe = probes
            .iter()
            .find(|p| p["target"] == t["name"])
            .map_or_else(|| "-".to_owned(), |p| text(&p["verdict"]));
        let latest = if a.is_null() {
            "-".to_owned()
        } else {
            format!(
                "{}, {}",
                text(&a["last_outcome"]),
                when(&a["last_request_unix"], now_unix)
            )
        };
        let _ = write!(
            page,
            "<tr class=\"target\" data-target=\"{}\" data-state=\"{state}\"><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td class=\"state {class}\">{state}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{latest}</td><td>{probe}</td></tr>",
            text(&t["name"]),
            text(&t["name"]),
            text(&t["serving_mode"]),
            text(&t["url"]),
            text(&t["model"]),
            text(&a["requests"]),
            text(&a["errors"]),
        );
    }
    for f in list(&status["failed_targets"]) {
        let _ = write!(
            page,
            "<tr class=\"target\" data-target=\"{}\" data-state=\"not started\"><td>{}</td>\
             <td colspan=\"3\" class=\"said\">{}</td><td class=\"state bad\">not started</td>\
             <td colspan=\"4\" class=\"note\">retried every 30 s</td></tr>",
            text(&f["name"]),
            text(&f["name"]),
            text(&f["error"]),
        );
    }
    page.push_str("</table></section>\n");
}

/// The class an SLO state is shown in.
fn slo_class(state: &str) -> &'static str {
    match state {
        "pass" => "good",
        "fail" => "bad",
        _ => "unknown",
    }
}

fn slos(page: &mut String, status: &Value, now_unix: f64) {
    page.push_str("<section id=\"slos\"><h2>SLOs</h2>");
    let slos = list(&status["slos"]);
    if slos.is_empty() {
        page.push_str("<p class=\"note\">The config defines no SLOs.</p></section>\n");
        return;
    }
    page.push_str(
        "<table><tr><th>SLO</th><th>state</th><th>since</th><th>value [95 % interval]</th>\
         <th>threshold</th><th>reason</th><th>pending</th><th>expression</th></tr>",
    );
    for s in slos {
        let state = s["state"].as_str().unwrap_or("insufficient_data");
        let interval = list(&s["interval"]);
        let value = if interval.len() == 2 && !interval[0].is_null() {
            format!(
                "{} [{}, {}]",
                number(&s["value"]),
                number(&interval[0]),
                number(&interval[1])
            )
        } else {
            number(&s["value"])
        };
        let pending = &s["pending"];
        let pending = if pending.is_null() {
            "-".to_owned()
        } else {
            format!(
                "{} for {} of {}",
                text(&pending["state"]),
                pending["held_seconds"]
                    .as_f64()
                    .map_or_else(|| "-".to_owned(), span),
                pending["for_seconds"]
                    .as_f64()
                    .map_or_else(|| "-".to_owned(), span),
            )
        };
        let _ = write!(
            page,
            "<tr class=\"slo\" data-slo=\"{}\" data-state=\"{}\"><td>{}</td>\
             <td class=\"state {}\">{}</td><td>{}</td><td class=\"num\">{value}</td>\
             <td class=\"num\">{}</td><td class=\"wrap\">{}</td><td>{pending}</td><td><code>{}</code></td></tr>",
            text(&s["name"]),
            escape(state),
            text(&s["name"]),
            slo_class(state),
            escape(state),
            when(&s["since_unix"], now_unix),
            number(&s["threshold"]),
            text(&s["reason"]),
            text(&s["expr"]),
        );
    }
    page.push_str("</table></section>\n");
}

fn failures(page: &mut String, status: &Value, now_unix: f64) {
    page.push_str("<section id=\"failures\"><h2>Recent failed requests</h2>");
    let failures = list(&status["recent_failures"]);
    if failures.is_empty() {
        page.push_str("<p class=\"note\">No request has failed since the start.</p></section>\n");
        return;
    }
    let _ = write!(
        page,
        "<p class=\"note\">The latest {}, newest first; what the server said is cut to its first \
         bytes, with the canary's secrets masked.</p><table><tr><th>when</th><th>target</th>\
         <th>workload</th><th>step</th><th>phase</th><th>error</th><th>HTTP</th>\
         <th>after</th><th>request id</th><th>what was said</th></tr>",
        failures.len()
    );
    for f in failures {
        let _ = write!(
            page,
            "<tr class=\"failure\" data-target=\"{}\" data-outcome=\"{}\"><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td class=\"state bad\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td><code>{}</code></td>\
             <td class=\"said\">{}</td></tr>",
            text(&f["target"]),
            text(&f["outcome"]),
            when(&f["at_unix"], now_unix),
            text(&f["target"]),
            text(&f["workload"]),
            text(&f["step"]),
            text(&f["phase"]),
            text(&f["outcome"]),
            text(&f["http_status"]),
            f["seconds"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.3} s")),
            text(&f["request_id"]),
            text(&f["error"]),
        );
    }
    page.push_str("</table></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: f64 = 1_796_000_000.0;

    fn status() -> Value {
        json!({
            "version": "0.1.0",
            "config": "/etc/canary/<plan>.yaml",
            "time_scale": 0.15,
            "cycles_completed": 3,
            "current_step": {"cycle": 3, "position": 5, "steps": 16, "workload": "concurrency_sweep",
                "name": "concurrency_sweep concurrency=32", "started_unix": NOW - 40.0, "planned_seconds": 90.0},
            "workloads": {"concurrency_sweep": {"state": "running", "step": "concurrency_sweep concurrency=32",
                "cycle": 3, "started_unix": NOW - 40.0, "steps_done": 52}},
            "targets": [
                {"name": "sim-agg", "serving_mode": "aggregated", "url": "http://127.0.0.1:1/", "model": "m",
                 "activity": {"requests": 900, "errors": 12, "last_request_unix": NOW - 1.0, "last_outcome": "http_5xx", "up": true}},
                {"name": "sim-disagg", "serving_mode": "disaggregated", "url": "http://127.0.0.1:2/", "model": "m",
                 "activity": null}
            ],
            "failed_targets": [{"name": "gone", "error": "no answer from <host>"}],
            "probes": [{"target": "sim-agg", "url": "http://127.0.0.1:1/", "verdict": "ok", "checks": []}],
            "slos": [
                {"name": "ttft-p99", "state": "fail", "since_unix": NOW - 300.0, "value": 2.5,
                 "interval": [2.25, 2.75], "threshold": 2.0, "reason": "p99 above 2 s for 5 min",
                 "pending": null, "expr": "p99(ttft) < 2s"},
                {"name": "availability", "state": "insufficient_data", "since_unix": null, "value": null,
                 "interval": [null, null], "threshold": 0.99, "reason": "40 samples, 50 needed",
                 "pending": {"state": "pass", "held_seconds": 30.0, "for_seconds": 300.0}, "expr": "availability > 0.99"}
            ],
            "recent_failures": [
                {"at_unix": NOW - 2.0, "target": "sim-agg", "serving_mode": "aggregated", "workload": "concurrency_sweep",
                 "step": "concurrency=32", "phase": "steady", "outcome": "http_5xx", "http_status": 503,
                 "request_id": "llm-canary-1-2", "seconds": 0.012,
                 "error": "HTTP 503: <script>alert('x')</script> & \"quoted\" Bearer ***"}
            ],
            "traffic": {"paused": true, "reasons": ["operator"], "operator": [{"source": "http", "note": "rollout <1.4>"}],
                "next_window_change_unix": null},
            "budget": {"scopes": [{"scope": "all", "max_inflight": 64, "max_rps": null, "max_output_tokens_per_hour": 1000000,
                "output_tokens_last_hour": 5000, "throttled_requests": 0, "throttled_seconds": 0.0}],
                "recent_actions": [{"at_unix": NOW - 60.0, "target": "sim-agg", "workload": "concurrency_sweep",
                "action": "skipped", "detail": "needs 128 streams, max_inflight 64"}]},
        })
    }

    #[test]
    fn every_part_of_the_status_is_on_the_page() {
        let page = render(&status(), NOW);
        for shown in [
            "<tr class=\"target\" data-target=\"sim-agg\" data-state=\"up\">",
            "<tr class=\"target\" data-target=\"sim-disagg\" data-state=\"no request yet\">",
            "<tr class=\"target\" data-target=\"gone\" data-state=\"not started\">",
            "Cycle 3, step 5 of 16: <b>concurrency_sweep concurrency=32</b>, sending for 40 s of 90 s",
            "<tr class=\"slo\" data-slo=\"ttft-p99\" data-state=\"fail\">",
            "2.5 [2.25, 2.75]",
            "p99 above 2 s for 5 min",
            "(5 min ago)",
            "pass for 30 s of 5 min",
            "<tr class=\"failure\" data-target=\"sim-agg\" data-outcome=\"http_5xx\">",
            "llm-canary-1-2",
            "0.012 s",
            "data-paused=\"true\">Paused: operator",
            "needs 128 streams, max_inflight 64",
            "<a href=\"/metrics\">",
            "<a href=\"/api/v1/status\">",
            "http-equiv=\"refresh\" content=\"10\"",
        ] {
            assert!(page.contains(shown), "{shown} is missing from\n{page}");
        }
    }

    #[test]
    fn every_text_from_the_document_is_escaped() {
        let page = render(&status(), NOW);
        assert!(
            page.contains(
                "HTTP 503: &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;quoted&quot; Bearer ***"
            ),
            "{page}"
        );
        assert!(
            page.contains("rollout &lt;1.4&gt;") && page.contains("/etc/canary/&lt;plan&gt;.yaml")
        );
        assert!(page.contains("no answer from &lt;host&gt;"));
        // The page's own markup is the only markup: no script, nothing fetched.
        assert!(
            !page.contains("<script") && !page.contains("src="),
            "{page}"
        );
        for external in ["http://", "https://"] {
            let links = page.matches(external).count();
            let from_urls = page.matches(&format!("<td>{external}127.0.0.1:")).count();
            assert_eq!(links, from_urls, "only the targets' URLs, as text");
        }
    }

    #[test]
    fn a_name_cannot_break_out_of_an_attribute() {
        let mut s = status();
        s["targets"][0]["name"] = json!("x\" onmouseover=\"alert(1)");
        let page = render(&s, NOW);
        assert!(
            page.contains("data-target=\"x&quot; onmouseover=&quot;alert(1)\""),
            "{page}"
        );
        assert!(!page.contains("onmouseover=\"alert"), "{page}");
    }

    #[test]
    fn an_empty_document_still_renders_a_page() {
        let page = render(&json!({}), NOW);
        assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
        assert!(page.contains("No step is running now."));
        assert!(page.contains("No request has failed since the start."));
        assert!(page.contains("The config defines no SLOs."));
    }

    #[test]
    fn numbers_and_spans_read_as_people_write_them() {
        assert_eq!(number(&json!(0.15)), "0.15");
        assert_eq!(number(&json!(2.0)), "2");
        assert_eq!(number(&json!(0.0482731)), "0.04827");
        assert_eq!(number(&json!(1234.5678)), "1235");
        assert_eq!(number(&json!(null)), "-");
        assert_eq!(number(&json!(0.0)), "0");
        assert_eq!(number(&json!(2.5e-5)), "2.500e-5");
        assert_eq!(span(45.2), "45 s");
        assert_eq!(span(600.0), "10 min");
        assert_eq!(span(3.0 * 3600.0), "3.0 h");
        assert_eq!(
            when(&json!(NOW + 30.0), NOW).split_once(" (").unwrap().1,
            "in 30 s)"
        );
    }
}
