//! The Grafana dashboards in `dashboards/`: their structure (unique panel ids, a 24-column grid
//! without overlaps, every panel titled with a unit and a one-line description, the datasource
//! only ever as the `${datasource}` variable), and every PromQL expression in them run through a
//! real Prometheus that scrapes the compressed demo daemon and its simulators' own `/metrics`:
//! each query must parse, and each query over series the daemon or the simulators export must
//! return data.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::{Prometheus, eventually, start_daemon};

/// The dashboards issue #9 asks for, by file stem.
const EXPECTED: [&str; 5] = [
    "agg-vs-disagg",
    "caches",
    "distributions",
    "overview",
    "serving-internals",
];

/// Grafana 11.0's schema version; the dashboards must be at least that new.
const MIN_SCHEMA_VERSION: u64 = 39;

/// Template variables every dashboard offers.
const REQUIRED_VARIABLES: [&str; 3] = ["target", "serving_mode", "workload"];

/// Metric families a query may name although nothing in the test exports them; a query over them
/// is only checked to parse. As soon as Prometheus holds any series of a family, its queries must
/// return data like every other.
/// - `DCGM_FI_DEV_*`: dcgm-exporter needs a GPU.
/// - `dynamo_component_router_*`: the KV router's histograms; the simulator does not expose them.
/// - `llm_canary_server_*`: the daemon mirrors a target's own metrics only where it scrapes them.
/// - `llm_canary_slo_*`: exported once the SLO engine evaluates the config's SLOs.
const PARSE_ONLY_PREFIXES: [&str; 4] = [
    "DCGM_FI_DEV_",
    "dynamo_component_router_",
    "llm_canary_server_",
    "llm_canary_slo_",
];

/// Prefixes of the metric names a dashboard query may use.
const METRIC_PREFIXES: [&str; 5] = ["llm_canary_", "dynamo_", "vllm:", "kvbm_", "DCGM_"];

struct Dashboard {
    file: String,
    json: Value,
}

fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards")
}

fn load_dashboards() -> Vec<Dashboard> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dashboards_dir()).expect("dashboards/ exists") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let json: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        out.push(Dashboard {
            file: path.file_name().unwrap().to_string_lossy().into_owned(),
            json,
        });
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    out
}

/// Every panel, including those nested in rows.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(p);
        for nested in p["panels"].as_array().into_iter().flatten() {
            out.push(nested);
        }
    }
    out
}

fn is_row(panel: &Value) -> bool {
    panel["type"] == "row"
}

fn variables(dashboard: &Value) -> Vec<&Value> {
    dashboard["templating"]["list"]
        .as_array()
        .map(|l| l.iter().collect())
        .unwrap_or_default()
}

/// The datasource reference every panel, query and query variable must carry.
fn datasource_variable() -> Value {
    serde_json::json!({"type": "prometheus", "uid": "${datasource}"})
}

/// One PromQL expression of a dashboard: a panel target or a query variable.
struct Query {
    origin: String,
    expr: String,
}

/// Every panel target's `expr`, plus every query variable turned into PromQL:
/// `label_values(SELECTOR, LABEL)` becomes `count by (LABEL) (SELECTOR)`.
fn queries(d: &Dashboard) -> Vec<Query> {
    let mut out = Vec::new();
    for p in panels(&d.json) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push(Query {
                    origin: format!("{} / {} / {}", d.file, p["title"], t["refId"]),
                    expr: expr.to_owned(),
                });
            }
        }
    }
    let label_values = regex::Regex::new(r"^label_values\((.*),\s*(\w+)\)$").unwrap();
    for v in variables(&d.json) {
        if v["type"] != "query" {
            continue;
        }
        let definition = v["query"]["query"].as_str().unwrap_or_default();
        let caps = label_values
            .captures(definition)
            .unwrap_or_else(|| panic!("{}: variable {} is not label_values(…)", d.file, v["name"]));
        out.push(Query {
            origin: format!("{} / variable {}", d.file, v["name"]),
            expr: format!("count by ({}) ({})", &caps[2], &caps[1]),
        });
    }
    out
}

/// Grafana's substitutions as the test applies them: the interval macros become fixed windows and
/// every template variable the regex `.*` (the "All" value of a multi-value variable).
fn substitute(expr: &str) -> String {
    let fixed = expr
        .replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$__range", "5m");
    let var = regex::Regex::new(r"\$\{(\w+)(:\w+)?\}|\$(\w+)").unwrap();
    var.replace_all(&fixed, ".*").into_owned()
}

/// The metric names an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let ident = regex::Regex::new(r"[A-Za-z_:][A-Za-z0-9_:]*").unwrap();
    ident
        .find_iter(expr)
        .map(|m| m.as_str())
        .filter(|name| METRIC_PREFIXES.iter().any(|p| name.starts_with(p)))
        .map(str::to_owned)
        .collect()
}

fn rects_overlap(a: &Value, b: &Value) -> bool {
    let r = |g: &Value| {
        let n = |k: &str| g[k].as_i64().unwrap();
        (n("x"), n("y"), n("x") + n("w"), n("y") + n("h"))
    };
    let (ax0, ay0, ax1, ay1) = r(a);
    let (bx0, by0, bx1, by1) = r(b);
    ax0 < bx1 && bx0 < ax1 && ay0 < by1 && by0 < ay1
}

/// Every `datasource` field anywhere in the JSON, with its path.
fn datasource_fields<'a>(v: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let p = format!("{path}.{k}");
                if k == "datasource" {
                    out.push((p.clone(), child));
                }
                datasource_fields(child, p, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                datasource_fields(child, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_five_dashboards_exist_with_unique_uids() {
    let dashboards = load_dashboards();
    let stems: Vec<&str> = dashboards
        .iter()
        .map(|d| d.file.trim_end_matches(".json"))
        .collect();
    assert_eq!(stems, EXPECTED);
    let uids: HashSet<&str> = dashboards
        .iter()
        .map(|d| d.json["uid"].as_str().expect("a uid"))
        .collect();
    assert_eq!(uids.len(), dashboards.len(), "dashboard uids are unique");
    for d in &dashboards {
        assert!(
            d.json["schemaVersion"].as_u64().unwrap_or(0) >= MIN_SCHEMA_VERSION,
            "{}: schemaVersion below {MIN_SCHEMA_VERSION}",
            d.file
        );
        assert!(!d.json["title"].as_str().unwrap_or("").is_empty());
        assert!(
            d.json["id"].is_null(),
            "{}: a provisioned dashboard has no fixed id",
            d.file
        );
        assert!(
            d.json.get("__inputs").is_none(),
            "{}: no import-time inputs",
            d.file
        );
    }
}

#[test]
fn panels_have_unique_ids_and_sit_on_the_grid_without_overlapping() {
    for d in load_dashboards() {
        let all = panels(&d.json);
        assert!(!all.is_empty(), "{}: no panels", d.file);
        let mut ids = HashSet::new();
        for p in &all {
            let id = p["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{}: panel {} has no id", d.file, p["title"]));
            assert!(ids.insert(id), "{}: panel id {id} repeats", d.file);
            let g = &p["gridPos"];
            let n = |k: &str| {
                g[k].as_i64()
                    .unwrap_or_else(|| panic!("{}: {} has no gridPos.{k}", d.file, p["title"]))
            };
            assert!(
                n("x") >= 0 && n("y") >= 0 && n("w") >= 1 && n("h") >= 1,
                "{}: {} gridPos {g}",
                d.file,
                p["title"]
            );
            assert!(
                n("x") + n("w") <= 24,
                "{}: {} runs past column 24: {g}",
                d.file,
                p["title"]
            );
        }
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert!(
                    !rects_overlap(&a["gridPos"], &b["gridPos"]),
                    "{}: {} and {} overlap",
                    d.file,
                    a["title"],
                    b["title"]
                );
            }
        }
    }
}

#[test]
fn every_panel_has_a_title_a_unit_a_one_line_description_and_a_query() {
    for d in load_dashboards() {
        for p in panels(&d.json) {
            let title = p["title"].as_str().unwrap_or("");
            assert!(
                !title.is_empty(),
                "{}: panel {} has no title",
                d.file,
                p["id"]
            );
            if is_row(p) {
                continue;
            }
            let description = p["description"].as_str().unwrap_or("");
            assert!(
                !description.trim().is_empty(),
                "{}: {title} has no description",
                d.file
            );
            assert!(
                !description.contains('\n'),
                "{}: {title}'s description is not one line",
                d.file
            );
            let unit = p["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or("");
            assert!(!unit.is_empty(), "{}: {title} has no unit", d.file);
            if p["type"] == "text" {
                assert!(
                    !p["options"]["content"].as_str().unwrap_or("").is_empty(),
                    "{}: {title} is an empty text panel",
                    d.file
                );
                continue;
            }
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            assert!(!targets.is_empty(), "{}: {title} has no query", d.file);
            for t in targets {
                assert!(
                    !t["expr"].as_str().unwrap_or("").trim().is_empty(),
                    "{}: {title} target {} has no expr",
                    d.file,
                    t["refId"]
                );
            }
        }
    }
}

#[test]
fn the_datasource_is_the_datasource_variable_everywhere() {
    let expected = datasource_variable();
    for d in load_dashboards() {
        let vars = variables(&d.json);
        let ds: Vec<_> = vars.iter().filter(|v| v["type"] == "datasource").collect();
        assert_eq!(ds.len(), 1, "{}: one datasource variable", d.file);
        assert_eq!(ds[0]["name"], "datasource", "{}", d.file);
        assert_eq!(ds[0]["query"], "prometheus", "{}", d.file);

        let mut fields = Vec::new();
        datasource_fields(&d.json, String::new(), &mut fields);
        for (path, value) in &fields {
            assert_eq!(
                *value, &expected,
                "{}: {path} is not the ${{datasource}} variable",
                d.file
            );
        }
        // Every panel (rows and text aside), every query and every query variable names it.
        for p in panels(&d.json) {
            if is_row(p) || p["type"] == "text" {
                continue;
            }
            assert_eq!(p["datasource"], expected, "{}: {}", d.file, p["title"]);
            for t in p["targets"].as_array().into_iter().flatten() {
                assert_eq!(t["datasource"], expected, "{}: {}", d.file, p["title"]);
            }
        }
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(v["datasource"], expected, "{}: {}", d.file, v["name"]);
        }
    }
}

#[test]
fn target_serving_mode_and_workload_are_multi_value_regex_variables() {
    let use_of_var = regex::Regex::new(r#"(.{0,3})\$\{?(\w+)"#).unwrap();
    for d in load_dashboards() {
        let vars = variables(&d.json);
        let names: Vec<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
        for required in REQUIRED_VARIABLES {
            assert!(
                names.contains(&required),
                "{}: no {required} variable",
                d.file
            );
        }
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(v["multi"], true, "{}: {} is multi-value", d.file, v["name"]);
            assert_eq!(v["includeAll"], true, "{}: {} has All", d.file, v["name"]);
            assert_eq!(v["allValue"], ".*", "{}: {}'s All is .*", d.file, v["name"]);
        }
        // A multi-value variable expands to `a|b`: it only works after a regex matcher.
        let mut used = HashSet::new();
        for q in queries(&d) {
            for caps in use_of_var.captures_iter(&q.expr) {
                let name = &caps[2];
                if name.starts_with("__") {
                    continue;
                }
                assert!(
                    names.contains(&name),
                    "{}: {} uses undeclared ${name}",
                    d.file,
                    q.origin
                );
                assert_eq!(
                    &caps[1], "=~\"",
                    "{}: {} uses ${name} outside a =~ matcher",
                    d.file, q.origin
                );
                used.insert(name.to_owned());
            }
        }
        // `workload` may be unused where every panel is about one workload (it still travels
        // with the dashboard links); every other variable must filter something.
        for name in names
            .iter()
            .filter(|n| **n != "datasource" && **n != "workload")
        {
            assert!(used.contains(*name), "{}: ${name} is never used", d.file);
        }
    }
}

#[test]
fn substitution_and_metric_name_extraction() {
    assert_eq!(
        substitute(r#"rate(x{a=~"$target", b=~"${serving_mode}"}[$__rate_interval])"#),
        r#"rate(x{a=~".*", b=~".*"}[1m])"#
    );
    assert_eq!(substitute("y[$__range:15s]"), "y[5m:15s]");
    let names = metric_names(
        r#"sum(rate(vllm:prefix_cache_hits_total{instance=~".*"}[1m])) / sum(llm_canary_step_ttft_seconds) by (target)"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "llm_canary_step_ttft_seconds",
            "vllm:prefix_cache_hits_total"
        ]
    );
}

/// Host and port of a target's base URL as `/api/v1/status` lists it (its simulator's
/// `/metrics` lives on the same address).
fn socket_of(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).expect("a URL with a scheme");
    let authority = rest.split('/').next().unwrap();
    authority
        .parse()
        .unwrap_or_else(|e| panic!("{authority}: {e}"))
}

async fn status(addr: SocketAddr) -> Value {
    let client = support::http::http_client(Some(Duration::from_secs(5)));
    support::http::get_json(&client, &format!("http://{addr}/api/v1/status"))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_parses_and_returns_data_from_the_demo() {
    let dir = tempfile::tempdir().unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/dashboards-demo.yaml");
    let (daemon, addr) = start_daemon(Some(&config), dir.path());

    // The simulators' own /metrics: what Prometheus scrapes from a real Dynamo or vLLM.
    let status = status(addr).await;
    let mut jobs: Vec<(String, SocketAddr)> = vec![("llm-canary".to_owned(), addr)];
    for t in status["targets"].as_array().expect("status lists targets") {
        let name = t["name"].as_str().unwrap();
        jobs.push((
            format!("dynamo-{name}"),
            socket_of(t["url"].as_str().unwrap()),
        ));
    }
    assert_eq!(jobs.len(), 3, "two simulated targets: {status}");
    let scrape: Vec<(&str, SocketAddr)> = jobs.iter().map(|(j, a)| (j.as_str(), *a)).collect();
    let prom = Prometheus::start(dir.path(), &scrape, &[]);

    // Every workload has completed a step for both targets.
    eventually(
        "a completed step of every workload for both targets",
        Duration::from_secs(150),
        || async {
            let r = prom
                .query("count by (target, workload) (llm_canary_step_end_timestamp_seconds)")
                .await
                .ok()?;
            (r.len() == 8).then_some(r)
        },
    )
    .await;
    prom.wait_for(r#"up{job=~"dynamo-.*"} == 1"#, Duration::from_secs(30))
        .await;

    let all: Vec<Query> = load_dashboards().iter().flat_map(queries).collect();
    assert!(all.len() > 50, "only {} queries", all.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut parse_only: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut with_data = 0;
    for q in &all {
        let expr = substitute(&q.expr);
        let mut outcome = prom.query(&expr).await;
        while matches!(&outcome, Ok(r) if r.is_empty()) && tokio::time::Instant::now() < deadline {
            // Rates need two scrapes of a series; poll rather than fail on the first empty answer.
            let missing = missing_metrics(&prom, &expr).await;
            if !missing.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            outcome = prom.query(&expr).await;
        }
        match outcome {
            Err(e) => failures.push(format!("{}: `{expr}` is rejected: {e}", q.origin)),
            Ok(r) if !r.is_empty() => with_data += 1,
            Ok(_) => {
                let missing = missing_metrics(&prom, &expr).await;
                let allowed = missing
                    .iter()
                    .all(|m| PARSE_ONLY_PREFIXES.iter().any(|p| m.starts_with(p)));
                if missing.is_empty() {
                    failures.push(format!("{}: `{expr}` returns no data", q.origin));
                } else if !allowed {
                    failures.push(format!(
                        "{}: `{expr}` reads {missing:?}, which nothing exports",
                        q.origin
                    ));
                } else {
                    for m in missing {
                        parse_only.entry(m).or_default().push(q.origin.clone());
                    }
                }
            }
        }
    }
    eprintln!(
        "{} queries: {with_data} returned data, {} parse only",
        all.len(),
        all.len() - with_data - failures.len()
    );
    for (metric, origins) in &parse_only {
        eprintln!("parse only ({metric} not exported): {}", origins.join("; "));
    }
    assert!(
        failures.is_empty(),
        "{} of {} dashboard queries failed:\n{}\n--- daemon log tail:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n"),
        tail(&daemon.log_text(), 20)
    );

    // The pause panels read 0 for every reason while the canary sends; an operator's pause turns
    // the overview's own query to 1 for `operator`.
    let dashboards = load_dashboards();
    let overview = dashboards
        .iter()
        .find(|d| d.file == "overview.json")
        .expect("overview.json");
    let paused = panels(&overview.json)
        .into_iter()
        .find(|p| p["title"] == "Traffic paused")
        .expect("a \"Traffic paused\" panel");
    let paused_expr = substitute(paused["targets"][0]["expr"].as_str().unwrap());
    let client = support::http::http_client(Some(Duration::from_secs(5)));
    let resp = client
        .post(format!("http://{addr}/-/pause"))
        .send()
        .await
        .expect("POST /-/pause");
    assert_eq!(resp.status(), 200, "POST /-/pause");
    eventually(
        "the Traffic paused panel shows operator = 1",
        Duration::from_secs(30),
        || async {
            let r = prom.query(&paused_expr).await.ok()?;
            r.iter()
                .any(|s| s["metric"]["reason"] == "operator" && s["value"][1] == "1")
                .then_some(r)
        },
    )
    .await;
}

/// The metric names of `expr` of which Prometheus holds no series at all.
async fn missing_metrics(prom: &Prometheus, expr: &str) -> Vec<String> {
    let mut missing = Vec::new();
    for name in metric_names(expr) {
        let probe = format!("count({{__name__=\"{name}\"}})");
        if prom
            .query(&probe)
            .await
            .map(|r| r.is_empty())
            .unwrap_or(true)
        {
            missing.push(name);
        }
    }
    missing
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
