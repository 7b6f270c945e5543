//! `llm-canary bench` end to end: the binary runs all four workloads against the two embedded
//! simulators at a small time scale; the tables hold numbers for both modes, every file lands in
//! `--out`, the JSON holds exactly the numbers the tables print, `requests.jsonl` follows its
//! contract, `report.html` renders in a real headless Chromium with its charts, Ctrl-C reports
//! what finished, and bad options exit 2 before any traffic.

mod skip;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

mod support;

use support::chromium::{
    self, chromium, console_lines, count_colour, file_url, headless, png_pixels,
};

const BIN: &str = env!("CARGO_BIN_EXE_llm-canary");

/// Short requests (OSL ≤ 32) so that even 2.4 s steps measure dozens of requests per mode.
fn config_text() -> String {
    format!(
        r#"
targets:
  - {{ name: agg, serving_mode: aggregated, simulated: {{ profile: default }}, cost_per_hour_usd: 65.54 }}
  - {{ name: disagg, serving_mode: disaggregated, simulated: {{ profile: default }}, cost_per_hour_usd: 107.50 }}
{}slos:
  - name: disagg-ttft-near-agg-c16
    expr: >
      p50(ttft{{serving_mode="disaggregated", workload="concurrency_sweep", concurrency="16"}})
        <= 2 * p50(ttft{{serving_mode="aggregated", workload="concurrency_sweep", concurrency="16"}})
    window: 30m
    min_samples: 20
"#,
        support::config::four_workloads("[1, 4, 16]", "[uniform, lognormal]")
    )
}

const MODES: [&str; 2] = ["aggregated", "disaggregated"];

struct Run {
    _dir: tempfile::TempDir,
    out: PathBuf,
    output: Output,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    fn summary(&self) -> Value {
        let text = std::fs::read_to_string(self.out.join("summary.json")).unwrap();
        serde_json::from_str(&text).expect("summary.json is JSON")
    }
}

/// Writes `text` to the file `name` in `dir`; returns its path.
fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `llm-canary bench --format json --out OUT` on the config `yaml` (not the shared one): the run
/// (its output folder in a temporary folder the run keeps) and its stderr.
fn bench_yaml(yaml: &str) -> (Run, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "bench.yaml", yaml);
    let out = dir.path().join("out");
    let output = support::bench::bench(&config, &out, &["--format", "json"]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let run = Run {
        _dir: dir,
        out,
        output,
    };
    (run, stderr)
}

fn bench(args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "bench.yaml", &config_text());
    let out = dir.path().join("out");
    let output = Command::new(BIN)
        .arg("bench")
        .arg("--config")
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Run {
        _dir: dir,
        out,
        output,
    }
}

/// The whole plan once, shared by the tests that read it: Markdown on stdout.
fn full_run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let run = bench(&["--format", "markdown"]);
        assert!(
            run.output.status.success(),
            "bench failed: {}\n{}",
            run.output.status,
            run.stderr()
        );
        run
    })
}

fn table<'a>(summary: &'a Value, id: &str) -> &'a Value {
    summary["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .unwrap_or_else(|| panic!("no table {id}"))
}

fn col(t: &Value, name: &str) -> usize {
    t["columns"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("table {} has no column {name}", t["id"]))
}

/// Equal strings, or equal numbers however the JSON wrote them (`1` and `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Rows of `t` whose column `key` holds `value` (a string or a number).
fn rows_where<'a>(t: &'a Value, key: &str, value: &Value) -> Vec<&'a Vec<Value>> {
    let k = col(t, key);
    t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap())
        .filter(|r| same(&r[k], value))
        .collect()
}

fn row_for<'a>(t: &'a Value, pairs: &[(&str, Value)]) -> &'a Vec<Value> {
    let found: Vec<&Vec<Value>> = t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap())
        .filter(|r| pairs.iter().all(|(k, v)| same(&r[col(t, k)], v)))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "table {} rows {pairs:?}: {found:?}",
        t["id"]
    );
    found[0]
}

fn num(row: &[Value], t: &Value, name: &str) -> f64 {
    row[col(t, name)]
        .as_f64()
        .unwrap_or_else(|| panic!("table {} column {name} is not a number in {row:?}", t["id"]))
}

/// A cell as every rendering prints it: the JSON number with the column's decimals.
fn render(cell: &Value, column: &Value) -> String {
    match cell {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => {
            let d = column["decimals"].as_u64().unwrap() as usize;
            format!("{:.*}", d, n.as_f64().unwrap())
        }
        other => panic!("unexpected cell {other}"),
    }
}

/// Every cell of `row` as printed under `columns`.
fn rendered(row: &Value, columns: &[Value]) -> Vec<String> {
    row.as_array()
        .unwrap()
        .iter()
        .zip(columns)
        .map(|(c, col)| render(c, col))
        .collect()
}

#[test]
fn every_table_has_numbers_for_both_modes_and_every_file_is_written() {
    let run = full_run();
    let s = run.summary();
    assert_eq!(s["run"]["steps_finished"], 9);
    assert_eq!(s["run"]["interrupted"], false);

    let sweep = table(&s, "concurrency_sweep");
    for level in [1, 4, 16] {
        for mode in MODES {
            let r = row_for(
                sweep,
                &[("concurrency", level.into()), ("mode", mode.into())],
            );
            for c in [
                "TTFT p50",
                "TTFT p99",
                "ITL p50",
                "ITL p99",
                "latency p50",
                "throughput",
            ] {
                assert!(num(r, sweep, c) > 0.0, "sweep c={level} {mode} {c}");
            }
            assert!(num(r, sweep, "requests") >= 5.0, "{r:?}");
            // Goodput: never more than what was served, in requests and in tokens.
            let good = num(r, sweep, "good throughput");
            assert!(good <= num(r, sweep, "throughput") + 0.5, "{r:?}");
            assert!(num(r, sweep, "goodput") >= 0.0, "{r:?}");
        }
    }
    // The simulated deployments answer well within the default goodput limits at the lowest
    // level: every request there is good.
    let low = row_for(
        sweep,
        &[("concurrency", 1.into()), ("mode", "aggregated".into())],
    );
    assert!(
        (num(low, sweep, "good throughput") - num(low, sweep, "throughput")).abs() <= 1.0,
        "{low:?}"
    );

    let mt = table(&s, "multi_turn");
    for mode in MODES {
        for turn in ["1", "2", "3"] {
            let r = row_for(mt, &[("turn", turn.into()), ("mode", mode.into())]);
            assert!(num(r, mt, "TTFT p50") > 0.0);
            let hit = num(r, mt, "cache hit");
            // Later turns resend the history, which the server's prefix cache serves.
            if turn == "1" {
                assert_eq!(hit, 0.0, "{mode} turn 1");
            } else {
                assert!(hit > 20.0, "{mode} turn {turn}: {hit} %");
            }
        }
        let all = row_for(mt, &[("turn", "all".into()), ("mode", mode.into())]);
        assert!(num(all, mt, "conversation p50") > 0.0);
    }

    let sd = table(&s, "sequence_distribution");
    for dist in ["uniform", "lognormal"] {
        for mode in MODES {
            let r = row_for(
                sd,
                &[
                    ("distribution", dist.into()),
                    ("ISL bucket", "all".into()),
                    ("mode", mode.into()),
                ],
            );
            for c in [
                "TTFT p50",
                "TTFT p99",
                "TTFT stddev",
                "TTFT p99/p50",
                "throughput",
            ] {
                assert!(num(r, sd, c) >= 0.0, "{dist} {mode} {c}");
            }
            assert!(num(r, sd, "TTFT p99/p50") >= 1.0);
            assert_eq!(num(r, sd, "errors"), 0.0, "{dist} {mode}");
        }
    }
    assert!(
        rows_where(sd, "ISL bucket", &"128-255".into()).len() >= 2,
        "per-bucket rows"
    );

    let pc = table(&s, "prefix_cache");
    for mode in MODES {
        let at = |r: f64| row_for(pc, &[("prefix hit ratio", r.into()), ("mode", mode.into())]);
        let (zero, half, full) = (at(0.0), at(50.0), at(100.0));
        assert!(
            num(zero, pc, "TTFT p50") > num(full, pc, "TTFT p50"),
            "{mode}"
        );
        assert_eq!(num(zero, pc, "improvement vs 0 %"), 0.0);
        assert!(
            num(full, pc, "improvement vs 0 %") > 30.0,
            "{mode}: {full:?}"
        );
        assert!(num(half, pc, "observed hit") > 40.0 && num(full, pc, "observed hit") > 90.0);
        // The simulators' own /metrics were scraped during the steps.
        assert!(num(full, pc, "server KV usage peak") > 0.0, "{full:?}");
        assert!(num(full, pc, "server prefix hit") > 80.0, "{full:?}");
        // The default simulators have no KVBM tiers, so no `kvbm_offload_blocks_d2h` (vLLM has no
        // such counter either): the cell is empty, not a zero.
        assert!(
            full[col(pc, "server KV blocks offloaded")].is_null(),
            "{full:?}"
        );
    }
    let fits = s["prefix_fits"].as_array().unwrap();
    assert_eq!(fits.len(), 2);
    assert!(fits.iter().all(|f| f["slope_ms"].as_f64().unwrap() > 0.0));

    let cost = table(&s, "cost_efficiency");
    for (mode, per_hour) in [("aggregated", 65.54), ("disaggregated", 107.5)] {
        let r = row_for(cost, &[("mode", mode.into())]);
        assert_eq!(num(r, cost, "GPU cost"), per_hour);
        let tps = num(r, cost, "peak throughput");
        let usd = num(r, cost, "per 1M output tokens");
        // Good tokens are a subset: they cost at least as much each.
        assert!(num(r, cost, "per 1M good tokens") >= usd - 0.01, "{r:?}");
        // Both printed numbers are rounded (tok/s to 1, $ to a cent).
        assert!(
            (usd - per_hour / 3600.0 / tps * 1e6).abs() < 0.006 + usd / tps,
            "{r:?}"
        );
    }

    // The simulators send Dynamo's nvext.timing: every step taken apart, per mode, its parts
    // adding up to the client's mean TTFT (to the table's rounding).
    let tb = table(&s, "ttft_breakdown");
    for mode in MODES {
        let rows = rows_where(tb, "mode", &mode.into());
        assert_eq!(rows.len(), 9, "{mode}: one row per step: {rows:?}");
        for r in rows {
            let parts = num(r, tb, "client queue")
                + num(r, tb, "server TTFT")
                + num(r, tb, "handoff + network");
            assert!((parts - num(r, tb, "client TTFT")).abs() < 0.2, "{r:?}");
            assert!(num(r, tb, "server TTFT") > 0.0, "{r:?}");
        }
    }

    // Each sweep step opens what its workers lack before its clock starts: over the sweep, one
    // connection per worker of its largest level, each timed, but for the one the start-up
    // probe left idle (it may serve the first step).
    let conns = table(&s, "connections");
    for mode in MODES {
        let rows = rows_where(conns, "mode", &mode.into());
        let sweep_opened: f64 = rows
            .iter()
            .filter(|r| {
                r[col(conns, "step")]
                    .as_str()
                    .unwrap()
                    .starts_with("concurrency_sweep")
            })
            .map(|r| num(r, conns, "opened"))
            .sum();
        assert!(sweep_opened >= 15.0, "{mode}: {rows:?}");
        for r in rows {
            let (p50, p99, max) = (
                num(r, conns, "connect p50"),
                num(r, conns, "connect p99"),
                num(r, conns, "connect max"),
            );
            assert!(num(r, conns, "opened") >= 1.0, "{r:?}");
            assert!(p50 <= p99 && p99 <= max, "{r:?}");
        }
    }

    let q = table(&s, "questions");
    assert_eq!(q["rows"].as_array().unwrap().len(), 4);
    for r in q["rows"].as_array().unwrap() {
        let finding = r[col(q, "finding")].as_str().unwrap();
        assert!(!finding.starts_with("no "), "{finding}");
        let evidence = r[col(q, "evidence")].as_str().unwrap();
        assert!(
            evidence.contains("ms") || evidence.contains('$'),
            "{evidence}"
        );
    }
    // The config's SLO, evaluated by the SLO engine over this run, filed under question 1.
    let slo = table(&s, "slo");
    let verdict = row_for(slo, &[("slo", "disagg-ttft-near-agg-c16".into())]);
    assert_eq!(verdict[col(slo, "state")], "pass", "{verdict:?}");
    assert!(num(verdict, slo, "value") > 0.0);
    let q1 = row_for(q, &[("#", 1.into())]);
    assert!(
        q1[col(q, "SLO verdicts")]
            .as_str()
            .unwrap()
            .starts_with("disagg-ttft-near-agg-c16: pass"),
        "{q1:?}"
    );
    let rec = table(&s, "recommendations");
    assert_eq!(rec["rows"].as_array().unwrap().len(), 4);
    for r in rec["rows"].as_array().unwrap() {
        let measured = r[col(rec, "measured")].as_str().unwrap();
        assert!(MODES.contains(&measured), "{r:?}");
        let expected = r[col(rec, "document expects")].as_str().unwrap();
        let agrees = r[col(rec, "agrees")].as_str().unwrap();
        assert_eq!(agrees == "yes", measured == expected, "{r:?}");
    }

    // Every file: the summary, the records, one CSV per table, the page.
    for t in s["tables"].as_array().unwrap() {
        let csv =
            std::fs::read_to_string(run.out.join(format!("{}.csv", t["id"].as_str().unwrap())))
                .unwrap();
        assert_eq!(csv.lines().count(), t["rows"].as_array().unwrap().len() + 1);
    }
    for f in ["summary.json", "requests.jsonl", "report.html"] {
        assert!(std::fs::metadata(run.out.join(f)).unwrap().len() > 0, "{f}");
    }
}

/// Splits a Markdown table row into its cells (`\|` is an escaped pipe inside a cell).
fn md_cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    cells.iter().map(|c| c.trim().to_owned()).collect()
}

/// The lines of `text` after the line `heading`, less the `gap` lines that follow it.
fn after_heading<'a>(
    text: &'a str,
    heading: &str,
    gap: usize,
) -> impl Iterator<Item = &'a str> + use<'a> {
    let start = text
        .lines()
        .position(|l| l == heading)
        .unwrap_or_else(|| panic!("no {heading} in\n{text}"));
    text.lines().skip(start + 1 + gap)
}

#[test]
fn the_json_holds_exactly_the_numbers_the_markdown_tables_print() {
    let run = full_run();
    let s = run.summary();
    let md = run.stdout();
    for t in s["tables"].as_array().unwrap() {
        let title = format!("### {}", t["title"].as_str().unwrap());
        let lines: Vec<&str> = after_heading(&md, &title, 1)
            .take_while(|l| l.starts_with('|'))
            .collect();
        let columns = t["columns"].as_array().unwrap();
        let headers: Vec<String> = columns
            .iter()
            .map(|c| match c["unit"].as_str().unwrap() {
                "" => c["name"].as_str().unwrap().to_owned(),
                u => format!("{} ({u})", c["name"].as_str().unwrap()),
            })
            .collect();
        assert_eq!(md_cells(lines[0]), headers);
        let rows = t["rows"].as_array().unwrap();
        assert_eq!(lines.len(), rows.len() + 2, "{title}");
        for (line, row) in lines[2..].iter().zip(rows) {
            let expected = rendered(row, columns);
            assert_eq!(md_cells(line), expected, "{title}");
        }
    }
}

/// CLOCK_MONOTONIC now, the clock `requests.jsonl` is stamped in.
fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
fn requests_jsonl_follows_the_per_record_contract() {
    let run = full_run();
    let s = run.summary();
    let text = std::fs::read_to_string(run.out.join("requests.jsonl")).unwrap();
    let now = monotonic_ns();
    let mut ids = HashSet::new();
    let mut steady_per_level: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut workloads = HashSet::new();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).expect("one JSON object per line");
        for key in [
            "x_request_id",
            "response_id",
            "target",
            "serving_mode",
            "workload",
            "concurrency",
            "turn",
            "distribution",
            "isl_bucket",
            "prefix_ratio",
            "intended_start_mono_ns",
            "start_mono_ns",
            "first_token_mono_ns",
            "end_mono_ns",
            "start_unix_ns",
            "ttft_ms",
            "itl_ms",
            "latency_ms",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "outcome",
            "server_ttft_ms",
            "server_prefill_wait_ms",
            "server_prefill_ms",
            "server_total_ms",
            "server_kv_hit_rate",
            "server_router_queue_depth",
            "server_kv_transfer_ms",
            "prefill_worker_id",
            "decode_worker_id",
            "connect_ms",
            "connection_retried",
            "requested_isl",
            "good",
        ] {
            assert!(r.get(key).is_some(), "{key} missing in {line}");
        }
        assert!(
            r.get("token_mono_ns").is_none(),
            "only with --record-tokens"
        );
        assert!(ids.insert(r["x_request_id"].as_str().unwrap().to_owned()));
        workloads.insert(r["workload"].as_str().unwrap().to_owned());
        // Good is a success within the goodput limits: never a failed request.
        assert!(r["good"] == false || r["outcome"] == "ok", "{line}");
        if r["outcome"] != "ok" {
            continue;
        }
        // The simulators answer the dynamo dialect's `nvext` like Dynamo: the server's own
        // timing and the workers that served the request, on every request.
        assert!(r["server_ttft_ms"].as_f64().is_some(), "{line}");
        // Every workload of the demo counts its prompts' tokens: the ISL it asked for.
        assert!(r["requested_isl"].as_u64().is_some_and(|n| n > 0), "{line}");
        assert!(r["decode_worker_id"].as_str().is_some(), "{line}");
        let n = |k: &str| r[k].as_u64().unwrap();
        let (intended, start, first, end) = (
            n("intended_start_mono_ns"),
            n("start_mono_ns"),
            n("first_token_mono_ns"),
            n("end_mono_ns"),
        );
        assert!(
            intended <= start && start <= first && first <= end,
            "{line}"
        );
        // Stamped in CLOCK_MONOTONIC during this run (all of it took well under ten minutes).
        assert!(
            end <= now && end + 600_000_000_000 > now,
            "{end} vs now {now}"
        );
        let ttft = r["ttft_ms"].as_f64().unwrap();
        assert!(
            (ttft - (first - intended) as f64 / 1e6).abs() < 0.01,
            "{line}"
        );
        // A connect this request opened itself is part of its TTFT.
        if let Some(connect) = r["connect_ms"].as_f64() {
            assert!(connect > 0.0 && connect <= ttft, "{line}");
        }
        assert!(r["response_id"].is_string());
        assert!(n("completion_tokens") > 0);
        if r["workload"] == "concurrency_sweep" && r["phase"] == "steady" {
            *steady_per_level
                .entry((
                    r["serving_mode"].as_str().unwrap().to_owned(),
                    r["concurrency"].as_str().unwrap().to_owned(),
                ))
                .or_default() += 1;
        }
    }
    assert_eq!(workloads.len(), 4, "{workloads:?}");
    // The records are the requests the tables count: steady, ok ones per sweep level and mode.
    let sweep = table(&s, "concurrency_sweep");
    for ((mode, level), count) in steady_per_level {
        let r = row_for(
            sweep,
            &[
                ("concurrency", level.parse::<u64>().unwrap().into()),
                ("mode", mode.into()),
            ],
        );
        let ok = num(r, sweep, "requests") - num(r, sweep, "errors");
        assert_eq!(count as f64, ok, "{r:?}");
    }
}

#[test]
fn the_html_report_is_self_contained_and_holds_every_chart() {
    let html = std::fs::read_to_string(full_run().out.join("report.html")).unwrap();
    for id in [
        "chart-pareto",
        "chart-ttft-concurrency",
        "chart-prefix",
        "chart-turns",
        "chart-distributions",
    ] {
        assert!(
            html.contains(&format!("<svg class=\"chart\" id=\"{id}\"")),
            "{id}"
        );
    }
    let without_ns = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    assert!(!without_ns.contains("http://") && !without_ns.contains("https://"));
    assert!(!html.contains("<script") && !html.contains("NaN"));
}

#[test]
fn the_report_renders_in_headless_chromium_with_its_charts_and_no_console_errors() {
    let Some(chromium) = chromium() else {
        return skip::missing_tool(chromium::MISSING);
    };
    let run = full_run();
    let page = run.out.join("report.html");
    let tmp = tempfile::tempdir().unwrap();

    // The detector works: a page that logs an error shows up in the log.
    let bad = write_file(
        tmp.path(),
        "bad.html",
        "<html><body><script>console.error('boom')</script></body></html>",
    );
    let (_, log) = headless(
        &chromium,
        &file_url(&bad),
        &tmp.path().join("p0"),
        &["--dump-dom"],
    );
    assert!(
        console_lines(&log).iter().any(|l| l.contains("boom")),
        "the console detector saw nothing:\n{log}"
    );

    let (dom, log) = headless(
        &chromium,
        &file_url(&page),
        &tmp.path().join("p1"),
        &["--dump-dom"],
    );
    assert!(
        console_lines(&log).is_empty(),
        "console messages: {:?}",
        console_lines(&log)
    );
    assert_eq!(
        dom.matches("<svg class=\"chart\"").count(),
        5,
        "charts in the rendered DOM"
    );
    assert!(dom.matches("<path class=\"series\"").count() >= 8);
    assert!(dom.matches("<circle class=\"point\"").count() >= 20);
    assert!(dom.matches("<g class=\"box\"").count() >= 4);

    let shot = tmp.path().join("shot.png");
    let (_, log) = headless(
        &chromium,
        &file_url(&page),
        &tmp.path().join("p2"),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,1200",
            "--hide-scrollbars",
        ],
    );
    assert!(console_lines(&log).is_empty(), "{log}");
    // Not blank: the two targets' chart colours are drawn in quantity.
    let (pixels, channels) = png_pixels(&shot);
    let count = |rgb: [u8; 3]| count_colour(&pixels, channels, rgb, 12);
    let (blue, vermilion) = (count([0x00, 0x72, 0xB2]), count([0xD5, 0x5E, 0x00]));
    assert!(
        blue > 500 && vermilion > 500,
        "chart pixels: blue {blue}, vermilion {vermilion}"
    );
    let distinct: HashSet<&[u8]> = pixels.chunks(channels).collect();
    assert!(
        distinct.len() > 50,
        "{} colours: a blank page",
        distinct.len()
    );
}

/// The point labels of every chart, as Chromium lays them out, cover no other label and no point:
/// the low concurrencies of the Pareto chart sit within a few pixels of each other. The report
/// holds no script; its copy here gets one that measures the drawn text.
#[test]
fn chart_labels_do_not_overlap_as_chromium_draws_them() {
    let Some(chromium) = chromium() else {
        return skip::missing_tool(chromium::MISSING);
    };
    let run = full_run();
    let html = std::fs::read_to_string(run.out.join("report.html")).unwrap();
    let measure = r#"<script>
const found = [], counts = [];
for (const svg of document.querySelectorAll('svg.chart')) {
  const labels = [...svg.querySelectorAll('text.point-label')]
    .map(t => [t.textContent, t.getBBox()]);
  const dots = [...svg.querySelectorAll('circle.point')].map(c => c.getBBox());
  const hit = (a, b) => a.x < b.x + b.width && b.x < a.x + a.width
    && a.y < b.y + b.height && b.y < a.y + a.height;
  counts.push(svg.id + '=' + labels.length);
  labels.forEach(([name, box], i) => {
    labels.slice(i + 1).forEach(([other, b]) => {
      if (hit(box, b)) found.push(svg.id + ': ' + name + ' over ' + other);
    });
    if (dots.some(d => hit(box, d))) found.push(svg.id + ': ' + name + ' over a point');
  });
}
const pre = document.createElement('pre');
pre.id = 'overlaps';
pre.textContent = counts.join(' ') + ' | ' + found.length + ' overlaps: ' + found.join('; ');
document.body.appendChild(pre);
</script></body>"#;
    let tmp = tempfile::tempdir().unwrap();
    let page = write_file(
        tmp.path(),
        "measured.html",
        &html.replace("</body>", measure),
    );
    let (dom, log) = headless(
        &chromium,
        &file_url(&page),
        &tmp.path().join("p"),
        &["--dump-dom"],
    );
    let result = dom
        .split("<pre id=\"overlaps\">")
        .nth(1)
        .and_then(|r| r.split("</pre>").next())
        .unwrap_or_else(|| panic!("the measuring script did not run:\n{log}"));
    // Three levels of two targets labelled on the Pareto chart (the sweep runs 1, 4 and 16).
    assert!(result.contains("chart-pareto=6 "), "{result}");
    assert!(result.ends_with("| 0 overlaps: "), "{result}");
}

#[test]
fn table_format_with_chosen_workloads_and_token_times() {
    let run = bench(&[
        "--workload",
        "prefix_cache",
        "--workload",
        "multi_turn",
        "--time-scale",
        "0.01",
        "--record-tokens",
    ]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let s = run.summary();
    assert_eq!(
        s["run"]["workloads"],
        serde_json::json!(["multi_turn", "prefix_cache"])
    );
    assert_eq!(s["run"]["time_scale"], 0.01);
    let text = run.stdout();
    // Each table's rows print exactly the JSON's numbers, aligned two spaces apart (or, for a
    // table too wide for a terminal, one `column  value` line each).
    for t in s["tables"].as_array().unwrap() {
        let columns = t["columns"].as_array().unwrap();
        let title = t["title"].as_str().unwrap();
        let body: Vec<&str> = after_heading(&text, title, 0)
            .take_while(|l| !l.is_empty())
            .collect();
        let blocks = body.first().is_some_and(|l| l.starts_with("[1]"));
        for (i, row) in t["rows"].as_array().unwrap().iter().enumerate() {
            let expected = rendered(row, columns);
            let printed: Vec<String> = if blocks {
                let at = body
                    .iter()
                    .position(|l| *l == format!("[{}]", i + 1))
                    .unwrap();
                body[at + 1..=at + columns.len()]
                    .iter()
                    .map(|l| {
                        let l = l.trim_start();
                        l.split_once("  ")
                            .map(|(_, v)| v.trim_start())
                            .unwrap_or("")
                            .to_owned()
                    })
                    .collect()
            } else {
                body[2 + i]
                    .split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect()
            };
            assert_eq!(printed, expected, "{title} row {i}");
        }
    }
    assert!(
        table(&s, "concurrency_sweep")["rows"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(
        !table(&s, "prefix_cache")["rows"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // --record-tokens: every content chunk's arrival, in order, first = first token.
    let text = std::fs::read_to_string(run.out.join("requests.jsonl")).unwrap();
    let mut checked = 0;
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        if r["outcome"] != "ok" {
            continue;
        }
        let tokens: Vec<u64> = r["token_mono_ns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert!(!tokens.is_empty() && tokens.windows(2).all(|w| w[0] <= w[1]));
        // Chunk stamps are kept to the microsecond.
        assert!(tokens[0].abs_diff(r["first_token_mono_ns"].as_u64().unwrap()) < 1_000);
        checked += 1;
    }
    assert!(checked > 10);
}

#[test]
fn ctrl_c_stops_cleanly_and_reports_the_finished_steps() {
    let dir = tempfile::tempdir().unwrap();
    // Three 3-second sweep steps; the signal comes as the second starts.
    let config = write_file(
        dir.path(),
        "bench.yaml",
        &config_text().replace("time_scale: 0.02", "time_scale: 0.025"),
    );
    let mut child = Command::new(BIN)
        .args(["bench", "--workload", "concurrency_sweep", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut sent = false;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(90)) {
        if line.contains("[2/3] concurrency_sweep concurrency=4") {
            let kill = Command::new("kill").args(["-INT", &pid]).status().unwrap();
            assert!(kill.success());
            sent = true;
            break;
        }
    }
    if !sent {
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    }
    assert!(sent, "the second step never started");
    let out = child.wait_with_output().unwrap();
    let log = reader.join().unwrap();
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains("interrupted; the report covers the 1 of 3 steps that finished"),
        "{log}"
    );
    // Each step's line says how far the whole plan is and about how long it has left: the
    // second starts a third of the way in (three steps of one length).
    let second = log
        .lines()
        .find(|l| l.contains("[2/3] concurrency_sweep concurrency=4"))
        .unwrap();
    assert!(second.contains("; 33 % of the plan, "), "{second}");
    assert!(
        second.contains(" elapsed, about ") && second.ends_with(" left"),
        "{second}"
    );
    assert!(log.contains("plan: 1 of 3 steps in "), "{log}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 of 3 steps (interrupted)"), "{stdout}");
    let sweep: Vec<&str> = stdout
        .lines()
        .skip_while(|l| *l != "Concurrency sweep")
        .skip(3)
        .take_while(|l| !l.is_empty() && !l.starts_with("note:"))
        .collect();
    assert_eq!(sweep.len(), 2, "{stdout}");
    assert!(
        sweep.iter().all(|l| l.trim_start().starts_with("1 ")),
        "{sweep:?}"
    );
}

#[test]
fn bad_options_exit_2_before_any_traffic() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("bench")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--time-scale", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--time-scale"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let only_sweep = write_file(
        dir.path(),
        "sweep.yaml",
        "targets: [{ name: a, serving_mode: aggregated, simulated: {} }]\nworkloads: { concurrency_sweep: {} }\n",
    );
    let (code, err) = run(&[
        "--config",
        only_sweep.to_str().unwrap(),
        "--workload",
        "multi_turn",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("does not run"), "{err}");
    let broken = write_file(dir.path(), "broken.yaml", "targets: [{ nam: a }]\n");
    let (code, err) = run(&["--config", broken.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("broken.yaml:1:"), "{err}");
}

/// `--time-scale` goes through the config's own validation: one that makes a step shorter than
/// 1 s (the demo's 120 s steps at 1e-9 last 120 ns) is a usage error naming the least that
/// fits, before any traffic.
#[test]
fn a_time_scale_that_makes_steps_degenerate_is_a_usage_error() {
    for tiny in ["1e-9", "1e-300"] {
        let out = Command::new(BIN)
            .args(["bench", "--time-scale", tiny])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--time-scale") && err.contains("a step needs at least 1s"),
            "{err}"
        );
        assert!(err.contains("set `time_scale` to at least"), "{err}");
        assert!(!err.contains("step starting"), "traffic was sent: {err}");
    }
}

/// A sequence-distribution step's failed requests show in its table (`errors`), per ISL bucket
/// and in the distribution's total, as the sweep's do: its latencies leave them out.
#[test]
fn the_distribution_table_counts_each_buckets_errors() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "errors.yaml",
        "targets:\n  - { name: flaky, serving_mode: aggregated, simulated: { profile: fast, \
         faults: { error: { status: 503, rate: 0.3 } } } }\n\
         workloads:\n  sequence_distribution: { distributions: [uniform], isl: { min: 64, max: 512 }, \
         osl: { min: 4, max: 8 }, concurrency: 4, step: 3s, warmup: 1s }\n",
    );
    let output = Command::new(BIN)
        .args(["bench", "--format", "json", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let sd = table(&report, "sequence_distribution");
    let all = row_for(
        sd,
        &[("ISL bucket", "all".into()), ("mode", "aggregated".into())],
    );
    let (requests, errors) = (num(all, sd, "requests"), num(all, sd, "errors"));
    // 30 % of the requests fail: well above none, well below all.
    assert!(errors >= 1.0 && errors < requests, "{all:?}");
    let per_bucket: f64 = sd["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap())
        .filter(|r| r[col(sd, "ISL bucket")] != "all")
        .map(|r| num(r, sd, "errors"))
        .sum();
    assert_eq!(
        per_bucket, errors,
        "the buckets' errors add up to the total"
    );
}

/// Issue 21, item 6: a target whose `/v1/models` never answers is reported, and the others are
/// measured: the bench writes its files, names the target it could not measure, and exits 1.
#[test]
fn a_target_that_cannot_start_is_reported_and_the_others_measured() {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung = hole.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((conn, _)) = hole.accept() {
            held.push(conn);
        }
    });
    let (run, stderr) = bench_yaml(&format!(
        "targets:\n  - {{ name: sim, serving_mode: aggregated, simulated: {{ profile: fast }} }}\n  \
         - {{ name: hung, serving_mode: disaggregated, url: \"http://{hung}\", model: auto }}\n\
         workloads:\n  concurrency_sweep: {{ levels: [2], isl: 64, osl: 8, step: 2s, warmup: 1s }}\n"
    ));
    assert_eq!(run.output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("target hung could not be measured"),
        "{stderr}"
    );
    let summary = run.summary();
    assert_eq!(
        summary["run"]["failed_targets"][0]["name"], "hung",
        "{summary}"
    );
    let steps = summary["steps"].as_array().unwrap();
    assert!(
        steps
            .iter()
            .any(|s| s["target"] == "sim" && s["ok_requests"].as_u64() > Some(0)),
        "{summary}"
    );
}

/// A rate ladder: each rung is a step of its own, labelled `rate`, and the request-rate sweep
/// table lists them in ascending order beside what the server answered.
#[test]
fn a_rate_ladder_runs_a_step_per_rate_and_tables_them() {
    let (run, stderr) = bench_yaml(
        "targets:\n  - { name: agg, serving_mode: aggregated, simulated: { profile: fast } }\n\
         workloads:\n  concurrency_sweep:\n    levels: [1]\n    isl: 32\n    osl: 4\n    \
         step: 4s\n    warmup: 1s\n    rate: { rps: [20, 5], arrival: constant }\n",
    );
    assert!(run.output.status.success(), "{stderr}");
    let s = run.summary();
    let steps: Vec<(&str, &str)> = s["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["step"].as_str().unwrap(),
                r["labels"]["rate"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            ("concurrency_sweep concurrency=1 rate=20", "20"),
            ("concurrency_sweep concurrency=1 rate=5", "5")
        ],
        "the rungs run in the order written"
    );
    let t = table(&s, "rate_sweep");
    let rows = t["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{t}");
    let rate: Vec<f64> = rows
        .iter()
        .map(|r| r[col(t, "rate")].as_f64().unwrap())
        .collect();
    assert_eq!(rate, [5.0, 20.0], "ascending rates");
    assert!(
        rows.iter()
            .all(|r| r[col(t, "step")] == "concurrency_sweep concurrency=1")
    );
    // Constant arrivals over the same 3 s window: four times the rate sends four times the
    // requests (every one of them sent, however slow the machine; a bound no healthy run misses).
    let requests: Vec<f64> = rows
        .iter()
        .map(|r| r[col(t, "requests")].as_f64().unwrap())
        .collect();
    assert!(
        requests[0] >= 5.0 && requests[1] >= 2.0 * requests[0],
        "{requests:?}"
    );
    // Each request's record names its rung.
    let jsonl = std::fs::read_to_string(run.out.join("requests.jsonl")).unwrap();
    let rates: std::collections::BTreeSet<String> = jsonl
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["rate"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(rates.into_iter().collect::<Vec<_>>(), ["20", "5"]);
}
